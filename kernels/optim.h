/* Optimizers over the flat parameter and gradient buffers of a network.
 *
 * An rl_optimizer holds one configuration, the state buffers of its method (allocated once, of
 * the parameters' dtype, device and length, zero-initialised) and its step counters. One
 * rl_optimizer_step is:
 *   1. one reduction pass: the global gradient norm ||g||_2 (accumulated in double);
 *   2. outlier protection: a norm that is NaN/Inf, or (after `outlier_warmup` accepted steps)
 *      above outlier_factor x the running average of the previously accepted norms, skips the
 *      step: params and state are left untouched, `skipped` counts it, `skip_reason` says why;
 *   3. one fused update pass over every element: global-norm scale, gradient noise,
 *      elementwise clipping, l2, then the method's rule (the formulas, and their order, are
 *      written once in kernels/optim_rules.h).
 * The max-norm constraint is applied afterwards per 2-D weight with rl_optim_max_norm (the
 * Lua face does this for every 2-D param of net:param_list()).
 *
 * Buffers must be contiguous float32 or float64 tensors on one device with equal numbers of
 * elements (their shapes may differ, e.g. a flat buffer and its 1-D view). Errors name the
 * function and the tensors. Kernels: kernels/cpu/optim.c, and kernels/cuda/optim.cu in a CUDA
 * build.
 */
#ifndef RL_OPTIM_H
#define RL_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/rng.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_OPT_SGD = 0,
    RL_OPT_MOMENTUM,
    RL_OPT_NESTEROV,
    RL_OPT_ADAGRAD,
    RL_OPT_ADADELTA,
    RL_OPT_ADAM,
    RL_OPT_ADAMW,
    RL_NUM_OPT
} rl_optim_kind;

/* "sgd", "momentum", "nesterov", "adagrad", "adadelta", "adam", "adamw" */
const char *rl_optim_name(rl_optim_kind kind);
rl_status rl_optim_parse(const char *name, rl_optim_kind *kind);
/* How many state buffers the method keeps (0, 1 or 2), and their names (PyTorch's):
 * momentum/nesterov: momentum_buffer; adagrad: sum; adadelta: square_avg, acc_delta;
 * adam/adamw: exp_avg, exp_avg_sq. */
int rl_optim_num_states(rl_optim_kind kind);
const char *rl_optim_state_name(rl_optim_kind kind, int i);

/* A value of 0 switches the regulariser off. Defaults (rl_optim_config_default) are
 * PyTorch's. */
typedef struct {
    rl_optim_kind kind;
    double momentum;                  /* momentum, nesterov: 0.9 */
    double beta1, beta2;              /* adam(w): 0.9, 0.999 */
    double epsilon;                   /* adagrad 1e-10, adadelta 1e-6, adam(w) 1e-8 */
    double rho;                       /* adadelta: 0.9 */
    double weight_decay;              /* adamw only (decoupled): 1e-2 */
    double l2;                        /* l2 * w added to the gradient */
    double gradient_clip;             /* g clamped to [-c, c] */
    double gradient_clip_global_norm; /* g scaled by min(1, c / (||g|| + 1e-6)) */
    double gradient_noise;            /* std of Gaussian noise added to g */
    double outlier_factor;            /* 10; 0: only NaN/Inf norms are skipped */
    int64_t outlier_warmup;           /* 5 accepted steps before the ratio test */
} rl_optim_config;

void rl_optim_config_default(rl_optim_config *cfg, rl_optim_kind kind);

/* The per-step coefficients of the fused pass, resolved by rl_optimizer_step (or by a caller
 * of rl_optim_update); shared with the device kernels through kernels/optim_rules.h. */
typedef struct {
    rl_optim_kind kind;
    double lr, momentum, beta1, beta2, epsilon, rho, weight_decay;
    double bias1, sqrt_bias2; /* adam(w) at step t: 1 - beta1^t, sqrt(1 - beta2^t) */
    double scale;             /* global-norm clipping factor, 1 when off */
    double clip;              /* elementwise bound; INFINITY when off */
    double l2;
    double noise_std; /* 0: no noise; else noise from (noise_seed, noise_offset) */
    uint64_t noise_seed, noise_offset;
} rl_optim_coef;

typedef struct {
    rl_optim_config cfg;
    rl_tensor state[2];    /* rl_optim_num_states(cfg.kind) of them are set */
    int64_t num_steps;     /* applied steps: t of Adam's bias correction */
    int64_t skipped;       /* steps skipped by outlier protection */
    int64_t norm_count;    /* accepted norms in avg_norm */
    double avg_norm;       /* mean of the accepted norms, an EMA with weight 1/100 after 100 */
    double last_grad_norm; /* of the last step, applied or not */
    char skip_reason[160]; /* why the last step was skipped ("" when it was applied) */
} rl_optimizer;

/* Checks cfg and allocates zeroed state like `params`. `o` may be all zero before; on failure
 * it owns nothing. */
rl_status rl_optimizer_init(rl_optimizer *o, const rl_optim_config *cfg, const rl_tensor *params);
void rl_optimizer_free(rl_optimizer *o);

/* One step with learning rate lr (>= 0). `rng` is needed only with gradient_noise > 0: the
 * step reserves 2 * numel words of it (as rl_op_normal does), only when it is applied.
 * *applied tells whether it was; a skip is not an error (RL_OK, reason in o->skip_reason). */
rl_status rl_optimizer_step(rl_optimizer *o, rl_tensor *params, const rl_tensor *grads, double lr,
                            rl_rng *rng, bool *applied);

/* The building blocks, usable on their own. */
/* ||g||_2 over all elements (NaN/Inf propagate). */
rl_status rl_optim_grad_norm(double *norm, const rl_tensor *grads);
/* The fused update pass: params and the states (NULL where the method keeps fewer) change in
 * place. */
rl_status rl_optim_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1, rl_tensor *s2,
                          const rl_optim_coef *coef);
/* Max-norm constraint on a 2-D weight (n_in, n_out) (any strides): each column, i.e. the
 * weights into one output unit (Keras MaxNorm(axis=0) on RETURNN's input-major layout), whose
 * Euclidean norm exceeds max_norm is multiplied by max_norm / norm. */
rl_status rl_optim_max_norm(rl_tensor *w, double max_norm);

/* CPU kernels (kernels/cpu/optim.c), called by the dispatcher after its checks. */
void rl_optim_cpu_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1, rl_tensor *s2,
                         const rl_optim_coef *coef);
double rl_optim_cpu_sqnorm(const rl_tensor *t);
void rl_optim_cpu_max_norm(rl_tensor *w, double max_norm);

#ifdef __cplusplus
}
#endif

#endif
