/* The per-element formulas of the optimizers (kernels/optim.h), one definition each, compiled
 * for the host (kernels/cpu/optim.c) and for CUDA kernels alike. They follow PyTorch's
 * documentation of torch.optim (dampening 0, no lr decay, no amsgrad), so results can be
 * compared with it. Per element, with w the parameter, g the gradient from backward, lr the
 * learning rate and t the step count (1 at the first applied step):
 *
 *   gradient, in this order:
 *     g <- g * s                  s = min(1, C / (||g||_2 + 1e-6)), gradient_clip_global_norm C
 *                                 (torch.nn.utils.clip_grad_norm_); s = 1 when off
 *     g <- g + sigma * n          gradient_noise sigma, n ~ N(0, 1) from Philox (below)
 *     g <- clamp(g, -c, c)        gradient_clip c (torch.nn.utils.clip_grad_value_)
 *     g <- g + l2 * w             l2: the gradient of (l2 / 2) ||w||^2, PyTorch's weight_decay
 *                                 of SGD/Adam
 *   sgd:       w <- w - lr g
 *   momentum:  b <- mu b + g;                 w <- w - lr b
 *   nesterov:  b <- mu b + g;                 w <- w - lr (g + mu b)
 *   adagrad:   S <- S + g^2;                  w <- w - lr g / (sqrt(S) + eps)
 *   adadelta:  v <- rho v + (1 - rho) g^2;    d <- sqrt(u + eps) / sqrt(v + eps) g
 *              u <- rho u + (1 - rho) d^2;    w <- w - lr d
 *   adam:      m <- b1 m + (1 - b1) g;        v <- b2 v + (1 - b2) g^2
 *              w <- w - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   adamw:     w <- w - lr lambda w (decoupled weight decay, Loshchilov & Hutter 2019), then
 *              the adam rule with the same g (lambda = weight_decay)
 * All state buffers start at zero (so b_1 = g as in PyTorch). Arithmetic is in double; the
 * results are rounded to the buffers' dtype when stored (PyTorch computes float32 in float32,
 * so float32 results may differ from it in the last bits).
 *
 * Noise: element i (0-based position in the flat buffer) of a step whose draw starts at Philox
 * block `offset` uses words 2i and 2i+1, exactly as rl_op_normal (kernels/ops.c) does:
 *   n = rl_box_muller(rl_u32_to_unit_open(w(2i)), rl_u32_to_unit(w(2i + 1))).
 */
#ifndef RL_OPTIM_RULES_H
#define RL_OPTIM_RULES_H

#include <math.h>

#include "../core/hd.h"
#include "../core/philox.h"
#include "optim.h"
#include "pointwise.h"

/* The number of state buffers of a method (rl_optim_num_states is this). */
RL_HD_INLINE int rl_optim_states_of(rl_optim_kind kind) {
    return kind == RL_OPT_SGD                                                         ? 0
           : (kind == RL_OPT_ADADELTA || kind == RL_OPT_ADAM || kind == RL_OPT_ADAMW) ? 2
                                                                                      : 1;
}

/* The standard normal number of element i, from the block offset + i / 2 (the caller passes
 * that block, so a CPU loop computes it once per two elements). */
RL_HD_INLINE double rl_optim_noise(rl_philox_block b, uint64_t i) {
    int k = (int)(i % 2) * 2;
    return rl_box_muller(rl_u32_to_unit_open(b.v[k]), (double)rl_u32_to_unit(b.v[k + 1]));
}

/* The gradient the method sees (see the top of this file); n is a standard normal number. */
RL_HD_INLINE double rl_optim_grad(const rl_optim_coef *c, double w, double g, double n) {
    g = g * c->scale + c->noise_std * n;
    g = g < -c->clip ? -c->clip : (g > c->clip ? c->clip : g);
    return g + c->l2 * w;
}

RL_HD_INLINE double rl_optim_sgd(const rl_optim_coef *c, double w, double g) {
    return w - c->lr * g;
}

RL_HD_INLINE double rl_optim_momentum(const rl_optim_coef *c, double w, double g, double *b) {
    *b = c->momentum * *b + g;
    return w - c->lr * *b;
}

RL_HD_INLINE double rl_optim_nesterov(const rl_optim_coef *c, double w, double g, double *b) {
    *b = c->momentum * *b + g;
    return w - c->lr * (g + c->momentum * *b);
}

RL_HD_INLINE double rl_optim_adagrad(const rl_optim_coef *c, double w, double g, double *sum) {
    *sum += g * g;
    return w - c->lr * g / (sqrt(*sum) + c->epsilon);
}

RL_HD_INLINE double rl_optim_adadelta(const rl_optim_coef *c, double w, double g, double *v,
                                      double *u) {
    *v = c->rho * *v + (1.0 - c->rho) * g * g;
    double d = sqrt(*u + c->epsilon) / sqrt(*v + c->epsilon) * g;
    *u = c->rho * *u + (1.0 - c->rho) * d * d;
    return w - c->lr * d;
}

RL_HD_INLINE double rl_optim_adam(const rl_optim_coef *c, double w, double g, double *m,
                                  double *v) {
    *m = c->beta1 * *m + (1.0 - c->beta1) * g;
    *v = c->beta2 * *v + (1.0 - c->beta2) * g * g;
    return w - (c->lr / c->bias1) * *m / (sqrt(*v) / c->sqrt_bias2 + c->epsilon);
}

RL_HD_INLINE double rl_optim_adamw(const rl_optim_coef *c, double w, double g, double *m,
                                   double *v) {
    return rl_optim_adam(c, w - c->lr * c->weight_decay * w, g, m, v);
}

/* One element: the new parameter value; s1, s2 are the element's state (unused ones ignored).
 * g is the raw gradient, n the element's standard normal number (ignored without noise). */
RL_HD_INLINE double rl_optim_rule(const rl_optim_coef *c, double w, double g, double n, double *s1,
                                  double *s2) {
    g = rl_optim_grad(c, w, g, n);
    switch (c->kind) {
    case RL_OPT_MOMENTUM: return rl_optim_momentum(c, w, g, s1);
    case RL_OPT_NESTEROV: return rl_optim_nesterov(c, w, g, s1);
    case RL_OPT_ADAGRAD: return rl_optim_adagrad(c, w, g, s1);
    case RL_OPT_ADADELTA: return rl_optim_adadelta(c, w, g, s1, s2);
    case RL_OPT_ADAM: return rl_optim_adam(c, w, g, s1, s2);
    case RL_OPT_ADAMW: return rl_optim_adamw(c, w, g, s1, s2);
    default: return rl_optim_sgd(c, w, g);
    }
}

#endif
