/* The optimizer dispatcher (kernels/optim.h): configuration checks, state allocation, the
 * outlier protection and running gradient-norm average, the per-step coefficients, and the
 * calls into the kernels of the buffers' device (CPU: kernels/cpu/optim.c; CUDA, in a CUDA
 * build: kernels/cuda/optim.cu, where the state lives on the params' device and the gradient
 * norm comes back to the host once per step for the outlier test and the global-norm scale). */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"
#include "optim_rules.h"

#ifdef RL_WITH_CUDA
#include "cuda/optim_cuda.h"

static bool on_cuda(const rl_tensor *t) { return rl_tensor_device(t).type == RL_CUDA; }
#endif

static const char *const kind_names[RL_NUM_OPT] = {"sgd",      "momentum", "nesterov", "adagrad",
                                                   "adadelta", "adam",     "adamw"};

/* After this many accepted norms the running average becomes an exponential moving average
 * with weight 1 / AVG_WINDOW, so it follows slow drifts of the gradient scale. */
#define AVG_WINDOW 100

const char *rl_optim_name(rl_optim_kind kind) {
    return (unsigned)kind < RL_NUM_OPT ? kind_names[kind] : "unknown optimizer";
}

rl_status rl_optim_parse(const char *name, rl_optim_kind *kind) {
    for (int k = 0; k < RL_NUM_OPT; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *kind = (rl_optim_kind)k;
            return RL_OK;
        }
    }
    return rl_error(RL_EARG,
                    "optimizer: unknown class '%s' (sgd, momentum, nesterov, adagrad, adadelta, "
                    "adam, adamw)",
                    name);
}

int rl_optim_num_states(rl_optim_kind kind) { return rl_optim_states_of(kind); }

const char *rl_optim_state_name(rl_optim_kind kind, int i) {
    if (i < 0 || i >= rl_optim_num_states(kind)) return NULL;
    switch (kind) {
    case RL_OPT_MOMENTUM:
    case RL_OPT_NESTEROV: return "momentum_buffer";
    case RL_OPT_ADAGRAD: return "sum";
    case RL_OPT_ADADELTA: return i == 0 ? "square_avg" : "acc_delta";
    default: return i == 0 ? "exp_avg" : "exp_avg_sq";
    }
}

void rl_optim_config_default(rl_optim_config *cfg, rl_optim_kind kind) {
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->momentum = 0.9;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->epsilon = kind == RL_OPT_ADAGRAD ? 1e-10 : kind == RL_OPT_ADADELTA ? 1e-6 : 1e-8;
    cfg->rho = 0.9;
    cfg->weight_decay = kind == RL_OPT_ADAMW ? 1e-2 : 0.0;
    cfg->outlier_factor = 10.0;
    cfg->outlier_warmup = 5;
}

/* x in [lo, hi) (hi_open) or [lo, hi]; NaN fails. */
static rl_status in_range(const char *key, double x, double lo, double hi, bool hi_open) {
    if (x >= lo && (hi_open ? x < hi : x <= hi)) return RL_OK;
    return rl_error(RL_EARG, "optimizer: %s = %g is out of range [%g, %g%s", key, x, lo, hi,
                    hi_open ? ")" : "]");
}

static rl_status check_config(const rl_optim_config *c) {
    if ((unsigned)c->kind >= RL_NUM_OPT)
        return rl_error(RL_EARG, "optimizer: unknown kind %d", (int)c->kind);
    RL_TRY(in_range("momentum", c->momentum, 0, 1, true));
    RL_TRY(in_range("beta1", c->beta1, 0, 1, true));
    RL_TRY(in_range("beta2", c->beta2, 0, 1, true));
    RL_TRY(in_range("rho", c->rho, 0, 1, true));
    RL_TRY(in_range("epsilon", c->epsilon, 0, INFINITY, true));
    RL_TRY(in_range("weight_decay", c->weight_decay, 0, INFINITY, true));
    RL_TRY(in_range("l2", c->l2, 0, INFINITY, true));
    RL_TRY(in_range("gradient_clip", c->gradient_clip, 0, INFINITY, true));
    RL_TRY(in_range("gradient_clip_global_norm", c->gradient_clip_global_norm, 0, INFINITY, true));
    RL_TRY(in_range("gradient_noise", c->gradient_noise, 0, INFINITY, true));
    RL_TRY(in_range("outlier_factor", c->outlier_factor, 0, INFINITY, false));
    if (c->outlier_factor != 0 && c->outlier_factor <= 1)
        return rl_error(RL_EARG, "optimizer: outlier_factor = %g must be > 1 (or 0: off)",
                        c->outlier_factor);
    if (c->outlier_warmup < 0)
        return rl_error(RL_EARG, "optimizer: outlier_warmup = %lld must be >= 0",
                        (long long)c->outlier_warmup);
    if (c->weight_decay != 0 && c->kind != RL_OPT_ADAMW)
        return rl_error(RL_EARG,
                        "optimizer: weight_decay is the decoupled decay of class 'adamw'; for "
                        "class '%s' use l2 (added to the gradient)",
                        rl_optim_name(c->kind));
    return RL_OK;
}

static rl_status check_buffer(const char *fn, const rl_tensor *t, const rl_tensor *params,
                              const char *what) {
    char d[160], p[160];
    if (!t || !t->storage) return rl_error(RL_EARG, "%s: %s is not a tensor (unset)", fn, what);
    if (t->dtype != RL_FLOAT32 && t->dtype != RL_FLOAT64)
        return rl_error(RL_EDTYPE, "%s: %s must be float32 or float64, got %s", fn, what,
                        rl_tensor_describe(t, d, sizeof d));
    if (!rl_tensor_is_contiguous(t))
        return rl_error(RL_ESHAPE, "%s: %s must be contiguous, got %s", fn, what,
                        rl_tensor_describe(t, d, sizeof d));
    if (t != params && (t->dtype != params->dtype ||
                        !rl_device_eq(rl_tensor_device(t), rl_tensor_device(params)) ||
                        rl_tensor_numel(t) != rl_tensor_numel(params)))
        return rl_error(RL_ESHAPE, "%s: %s is %s, the params are %s", fn, what,
                        rl_tensor_describe(t, d, sizeof d),
                        rl_tensor_describe(params, p, sizeof p));
    return RL_OK;
}

/* RL_OK when this build has optimizer kernels for t's device. */
static rl_status need_kernels(const char *fn, const rl_tensor *t) {
    rl_device dev = rl_tensor_device(t);
    if (dev.type == RL_CPU) return RL_OK;
#ifdef RL_WITH_CUDA
    if (dev.type == RL_CUDA) return RL_OK;
#endif
    char name[32];
    rl_device_name(dev, name, sizeof name);
    return rl_error(RL_EDEVICE, "%s: no optimizer kernels for %s in this build", fn, name);
}

rl_status rl_optim_grad_norm(double *norm, const rl_tensor *grads) {
    RL_TRY(check_buffer("optim_grad_norm", grads, grads, "grads"));
    RL_TRY(need_kernels("optim_grad_norm", grads));
#ifdef RL_WITH_CUDA
    if (on_cuda(grads)) {
        double sq;
        RL_TRY(rl_optim_cuda_sqnorm(&sq, grads));
        *norm = sqrt(sq);
        return RL_OK;
    }
#endif
    *norm = sqrt(rl_optim_cpu_sqnorm(grads));
    return RL_OK;
}

rl_status rl_optim_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1, rl_tensor *s2,
                          const rl_optim_coef *coef) {
    const char *fn = "optim_update";
    RL_TRY(check_buffer(fn, params, params, "params"));
    RL_TRY(check_buffer(fn, grads, params, "grads"));
    int ns = rl_optim_num_states(coef->kind);
    if (ns >= 1) RL_TRY(check_buffer(fn, s1, params, rl_optim_state_name(coef->kind, 0)));
    if (ns >= 2) RL_TRY(check_buffer(fn, s2, params, rl_optim_state_name(coef->kind, 1)));
    RL_TRY(need_kernels(fn, params));
#ifdef RL_WITH_CUDA
    if (on_cuda(params))
        return rl_optim_cuda_update(params, grads, ns >= 1 ? s1 : NULL, ns >= 2 ? s2 : NULL, coef);
#endif
    rl_optim_cpu_update(params, grads, ns >= 1 ? s1 : NULL, ns >= 2 ? s2 : NULL, coef);
    return RL_OK;
}

rl_status rl_optim_max_norm(rl_tensor *w, double max_norm) {
    char d[160];
    if (!w || !w->storage) return rl_error(RL_EARG, "optim_max_norm: the weight is unset");
    if (w->ndim != 2 || (w->dtype != RL_FLOAT32 && w->dtype != RL_FLOAT64))
        return rl_error(RL_ESHAPE, "optim_max_norm: needs a 2-D float weight, got %s",
                        rl_tensor_describe(w, d, sizeof d));
    if (!(max_norm > 0))
        return rl_error(RL_EARG, "optim_max_norm: max_norm = %g must be > 0", max_norm);
    RL_TRY(need_kernels("optim_max_norm", w));
#ifdef RL_WITH_CUDA
    if (on_cuda(w)) return rl_optim_cuda_max_norm(w, max_norm);
#endif
    rl_optim_cpu_max_norm(w, max_norm);
    return RL_OK;
}

rl_status rl_optimizer_init(rl_optimizer *o, const rl_optim_config *cfg, const rl_tensor *params) {
    memset(o, 0, sizeof *o);
    RL_TRY(check_config(cfg));
    RL_TRY(check_buffer("optimizer", params, params, "params"));
    RL_TRY(need_kernels("optimizer", params));
    o->cfg = *cfg;
    for (int i = 0; i < rl_optim_num_states(cfg->kind); i++) {
        rl_status st = rl_tensor_empty_like(&o->state[i], params);
        if (st == RL_OK) st = rl_op_fill(&o->state[i], 0.0);
        if (st != RL_OK) {
            rl_optimizer_free(o);
            return st;
        }
    }
    return RL_OK;
}

void rl_optimizer_free(rl_optimizer *o) {
    rl_tensor_release(&o->state[0]);
    rl_tensor_release(&o->state[1]);
}

/* Decides whether a step with gradient norm `norm` is an outlier; writes the reason. */
static bool is_outlier(rl_optimizer *o, double norm) {
    if (!isfinite(norm)) {
        snprintf(o->skip_reason, sizeof o->skip_reason, "gradient norm %g is not finite", norm);
        return true;
    }
    double f = o->cfg.outlier_factor;
    if (f > 0 && o->norm_count >= o->cfg.outlier_warmup && o->avg_norm > 0 &&
        norm > f * o->avg_norm) {
        snprintf(o->skip_reason, sizeof o->skip_reason, "gradient norm %.3g > %g x average %.3g",
                 norm, f, o->avg_norm);
        return true;
    }
    return false;
}

rl_status rl_optimizer_step(rl_optimizer *o, rl_tensor *params, const rl_tensor *grads, double lr,
                            rl_rng *rng, bool *applied) {
    const rl_optim_config *c = &o->cfg;
    *applied = false;
    if (!(lr >= 0 && isfinite(lr)))
        return rl_error(RL_EARG, "optimizer step: learning rate %g must be finite and >= 0", lr);
    if (c->gradient_noise > 0 && !rng)
        return rl_error(RL_EARG, "optimizer step: gradient_noise needs a generator");
    RL_TRY(check_buffer("optimizer step", params, params, "params"));
    RL_TRY(check_buffer("optimizer step", grads, params, "grads"));
    int ns = rl_optim_num_states(c->kind);
    for (int i = 0; i < ns; i++)
        RL_TRY(
            check_buffer("optimizer step", &o->state[i], params, rl_optim_state_name(c->kind, i)));

    double norm;
    RL_TRY(rl_optim_grad_norm(&norm, grads));
    o->last_grad_norm = norm;
    o->skip_reason[0] = '\0';
    if (is_outlier(o, norm)) {
        o->skipped++;
        return RL_OK;
    }

    int64_t t = o->num_steps + 1;
    rl_optim_coef k = {
        .kind = c->kind,
        .lr = lr,
        .momentum = c->momentum,
        .beta1 = c->beta1,
        .beta2 = c->beta2,
        .epsilon = c->epsilon,
        .rho = c->rho,
        .weight_decay = c->weight_decay,
        .bias1 = 1.0 - pow(c->beta1, (double)t),
        .sqrt_bias2 = sqrt(1.0 - pow(c->beta2, (double)t)),
        .scale = 1.0,
        .clip = c->gradient_clip > 0 ? c->gradient_clip : INFINITY,
        .l2 = c->l2,
        .noise_std = c->gradient_noise,
    };
    if (c->gradient_clip_global_norm > 0) {
        double s = c->gradient_clip_global_norm / (norm + 1e-6);
        if (s < 1) k.scale = s;
    }
    if (k.noise_std > 0) {
        k.noise_seed = rng->seed;
        k.noise_offset = rl_rng_reserve(rng, 2 * (uint64_t)rl_tensor_numel(params));
    }
    RL_TRY(rl_optim_update(params, grads, &o->state[0], &o->state[1], &k));
    o->num_steps = t;
    o->norm_count++;
    int64_t w = o->norm_count < AVG_WINDOW ? o->norm_count : AVG_WINDOW;
    o->avg_norm += (norm - o->avg_norm) / (double)w;
    *applied = true;
    return RL_OK;
}
