/* Finite-difference gradient checks of C layers in float64, for the C unit tests (include after
 * check.h or on its own; everything here is static inline).
 *
 *   gc_opts       a small option table standing in for a Lua layer description (layer_opts.h)
 *   gc_bind_params gives every parameter of a layer value/grad views into two flat buffers
 *                 owned by the caller, and initialises the values with rl_param_init
 *                 (gc_view_params: the views alone, into buffers on any device)
 *   gc_check      compares backward with central differences of a scalar loss:
 *                   loss layers (l->is_loss):  L = io.loss (cfg->target must be set)
 *                   other layers:              L = sum over VALID frames t < len[b] of
 *                                                  sum_f out[t,b,f] * R[t,b,f]
 *                 with R a fixed random projection (so grad_out = R, zero on padded frames).
 *                 Every input element (padded frames included) and every parameter element is
 *                 perturbed by +-eps; the layer must be float64 on the CPU with contiguous
 *                 inputs. The forward generator is reset before every forward, so dropout
 *                 draws the same mask each time.
 * Backward is also checked for the contract: grad_in is prefilled with NaN (an element the
 * layer does not write shows up as a NaN error) and param.grad with 0.25, which is subtracted
 * afterwards (a layer that overwrites instead of accumulating shows up as an error).
 * Relative error: |analytic - numeric| / max(|analytic|, |numeric|, floor). */
#ifndef RL_GRADCHECK_H
#define RL_GRADCHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../../core/rng.h"
#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "layer_opts.h"

/* ---- tensors ---- */

/* lengths (unset) <- CPU int32 (B) holding v[0..B-1] */
static inline rl_status gc_lengths(rl_tensor *lengths, int64_t B, const int *v) {
    RL_TRY(rl_tensor_empty(lengths, RL_INT32, RL_DEVICE_CPU, 1, &B));
    for (int64_t b = 0; b < B; b++)
        rl_tensor_set(lengths, &b, v[b]);
    return RL_OK;
}

/* x (unset) <- CPU (T, B, F) of dtype dt, U(-1, 1) from g, padded frames included */
static inline rl_status gc_random_input(rl_tensor *x, rl_dtype dt, int64_t T, int64_t B, int64_t F,
                                        rl_rng *g) {
    int64_t shape[3] = {T, B, F};
    RL_TRY(rl_tensor_empty(x, dt, RL_DEVICE_CPU, 3, shape));
    return rl_op_uniform(x, g, -1.0, 1.0);
}

/* Makes every parameter of l (value and grad released first) a view into flat_val / flat_grad,
 * in parameter order: two set 1-D tensors of rl_layer_num_params(l) elements on any device. */
static inline rl_status gc_view_params(rl_layer *l, const rl_tensor *flat_val,
                                       const rl_tensor *flat_grad) {
    int64_t off = 0;
    for (int i = 0; i < l->n_params; i++) {
        rl_param *p = &l->params[i];
        int64_t k = 1;
        for (int d = 0; d < p->ndim; d++)
            k *= p->shape[d];
        rl_tensor_release(&p->value);
        rl_tensor_release(&p->grad);
        rl_tensor a = {0}, b = {0};
        RL_TRY(rl_tensor_narrow(&a, flat_val, 0, off, k));
        RL_TRY(rl_tensor_narrow(&b, flat_grad, 0, off, k));
        rl_status st = rl_tensor_view(&p->value, &a, p->ndim, p->shape);
        if (st == RL_OK) st = rl_tensor_view(&p->grad, &b, p->ndim, p->shape);
        rl_tensor_release(&a);
        rl_tensor_release(&b);
        RL_TRY(st);
        off += k;
    }
    return RL_OK;
}

/* Binds every parameter of l to views into flat_val / flat_grad (unset on entry; the caller
 * releases them), CPU tensors of dtype dt; values from rl_layer_init_params with g, gradients 0. */
static inline rl_status gc_bind_params(rl_layer *l, rl_dtype dt, rl_rng *g, rl_tensor *flat_val,
                                       rl_tensor *flat_grad) {
    int64_t n = rl_layer_num_params(l);
    RL_TRY(rl_tensor_empty(flat_val, dt, RL_DEVICE_CPU, 1, &n));
    RL_TRY(rl_tensor_empty(flat_grad, dt, RL_DEVICE_CPU, 1, &n));
    RL_TRY(rl_op_fill(flat_grad, 0.0));
    RL_TRY(gc_view_params(l, flat_val, flat_grad));
    return rl_layer_init_params(l, g);
}

/* gc_bind_params, then the parameters that start at zero (biases) drawn from U(-0.5, 0.5) with
 * g, so that a test sees them. */
static inline rl_status gc_bind_params_nonzero(rl_layer *l, rl_dtype dt, rl_rng *g,
                                               rl_tensor *flat_val, rl_tensor *flat_grad) {
    RL_TRY(gc_bind_params(l, dt, g, flat_val, flat_grad));
    for (int i = 0; i < l->n_params; i++)
        if (l->params[i].init == RL_INIT_ZEROS)
            RL_TRY(rl_op_uniform(&l->params[i].value, g, -0.5, 0.5));
    return RL_OK;
}

/* ---- the check ---- */

typedef struct {
    double eps;              /* central-difference step; 1e-6 when 0 */
    double floor;            /* denominator floor of the relative error; 1e-2 when 0 */
    const rl_tensor *target; /* for loss layers */
    bool train;              /* io.train */
    uint64_t seed;           /* R and the forward generator */
} gc_config;

typedef struct {
    double max_rel; /* over all inputs and parameters (INFINITY for a NaN) */
    double max_rel_in[RL_LAYER_MAX_INPUTS];
    double max_rel_param[RL_LAYER_MAX_PARAMS];
    double max_pad_analytic; /* max |backward's grad_in| on padded frames: must be 0 */
    double max_pad_numeric;  /* max |numeric grad_in| on padded frames: must be 0 */
    int64_t n_checked;
    double loss; /* the unperturbed loss */
    char worst[96];
} gc_report;

typedef struct {
    rl_layer *l;
    rl_layer_io io;
    rl_rng rng0;
    const rl_tensor *R;
} gc_ctx_;

static inline rl_status gc_loss_(gc_ctx_ *c, double *L) {
    rl_rng g = c->rng0;
    c->io.rng = &g;
    c->io.loss = c->io.n_errors = c->io.n_frames = 0;
    RL_TRY(c->l->ops->forward(c->l, &c->io));
    if (c->l->is_loss) {
        *L = c->io.loss;
        return RL_OK;
    }
    const rl_tensor *out = &c->l->out;
    int64_t T = out->shape[0], B = out->shape[1], F = out->shape[2];
    double s = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = (int64_t)rl_tensor_get(c->io.lengths, &b);
        for (int64_t t = 0; t < len && t < T; t++)
            for (int64_t f = 0; f < F; f++) {
                int64_t idx[3] = {t, b, f};
                s += rl_tensor_get(out, idx) * rl_tensor_get(c->R, idx);
            }
    }
    *L = s;
    return RL_OK;
}

static inline double gc_rel_(double a, double n, double floor) {
    double den = fmax(fmax(fabs(a), fabs(n)), floor);
    double r = fabs(a - n) / den;
    return r == r ? r : INFINITY;
}

/* Perturbs each element of the float64 contiguous tensor x; compares with analytic ag. */
static inline rl_status gc_sweep_(gc_ctx_ *c, rl_tensor *x, const double *ag, double eps,
                                  double floor, bool is_input, const char *what, double *max_rel,
                                  gc_report *rep) {
    double *v = (double *)rl_tensor_data(x);
    int64_t n = rl_tensor_numel(x);
    for (int64_t e = 0; e < n; e++) {
        double keep = v[e], lp, lm;
        v[e] = keep + eps;
        rl_status st = gc_loss_(c, &lp);
        v[e] = keep - eps;
        if (st == RL_OK) st = gc_loss_(c, &lm);
        v[e] = keep;
        RL_TRY(st);
        double num = (lp - lm) / (2 * eps);
        bool padded = false;
        if (is_input) {
            int64_t B = x->shape[1], F = x->shape[2];
            int64_t t = e / (B * F), b = (e / F) % B;
            padded = t >= (int64_t)rl_tensor_get(c->io.lengths, &b);
        }
        if (padded) {
            rep->max_pad_analytic =
                fmax(rep->max_pad_analytic, ag[e] == ag[e] ? fabs(ag[e]) : INFINITY);
            rep->max_pad_numeric = fmax(rep->max_pad_numeric, fabs(num));
        }
        double r = gc_rel_(ag[e], num, floor);
        if (r > *max_rel) *max_rel = r;
        if (r > rep->max_rel || rep->n_checked == 0) {
            rep->max_rel = fmax(rep->max_rel, r);
            snprintf(rep->worst, sizeof rep->worst, "%s[%lld]: backward %.9g, numeric %.9g", what,
                     (long long)e, ag[e], num);
        }
        rep->n_checked++;
    }
    return RL_OK;
}

/* Runs the check on layer l (its parameters bound as float64 CPU, e.g. by gc_bind_params)
 * with n_in float64 CPU contiguous inputs (T, B, in_dims[i]) and lengths; fills rep. */
static inline rl_status gc_check(rl_layer *l, int n_in, rl_tensor *const *in,
                                 const rl_tensor *lengths, const gc_config *cfg, gc_report *rep) {
    memset(rep, 0, sizeof *rep);
    double eps = cfg->eps > 0 ? cfg->eps : 1e-6, floor = cfg->floor > 0 ? cfg->floor : 1e-2;
    for (int i = 0; i < n_in; i++)
        if (in[i]->dtype != RL_FLOAT64 || !rl_tensor_is_contiguous(in[i]) ||
            rl_tensor_device(in[i]).type != RL_CPU)
            return rl_error(RL_EARG, "gradcheck: input %d must be float64, contiguous, CPU", i + 1);
    for (int i = 0; i < l->n_params; i++)
        if (l->params[i].value.dtype != RL_FLOAT64 || !l->params[i].value.storage)
            return rl_error(RL_EARG, "gradcheck: parameter %s must be bound as float64",
                            l->params[i].name);
    if (l->is_loss && !cfg->target)
        return rl_error(RL_EARG, "gradcheck: loss layer '%s' needs a target", l->name);

    gc_ctx_ c;
    memset(&c, 0, sizeof c);
    c.l = l;
    c.io.n_in = n_in;
    for (int i = 0; i < n_in; i++)
        c.io.in[i] = in[i];
    c.io.lengths = lengths;
    c.io.target = cfg->target;
    c.io.train = cfg->train;
    rl_rng_seed(&c.rng0, cfg->seed * 2 + 1);

    rl_tensor R = {0}, gin[RL_LAYER_MAX_INPUTS] = {{0}}, pg = {0};
    rl_tensor *gp[RL_LAYER_MAX_INPUTS] = {0};
    double *pgrads = NULL;
    rl_status st = RL_OK;
    int64_t T = in[0]->shape[0], B = in[0]->shape[1];

    /* R: the projection, zero on padded frames */
    if (!l->is_loss) {
        int64_t shape[3] = {T, B, l->n_out};
        rl_rng g;
        rl_rng_seed(&g, cfg->seed * 2);
        st = rl_tensor_empty(&R, RL_FLOAT64, RL_DEVICE_CPU, 3, shape);
        if (st == RL_OK) st = rl_op_normal(&R, &g, 0.0, 1.0);
        for (int64_t b = 0; b < B && st == RL_OK; b++)
            for (int64_t t = (int64_t)rl_tensor_get(lengths, &b); t < T; t++)
                for (int64_t f = 0; f < l->n_out; f++) {
                    int64_t idx[3] = {t, b, f};
                    rl_tensor_set(&R, idx, 0.0);
                }
        c.R = &R;
    }
    for (int i = 0; i < n_in && st == RL_OK; i++) {
        st = rl_tensor_empty_like(&gin[i], in[i]);
        if (st == RL_OK) st = rl_op_fill(&gin[i], NAN);
        gp[i] = &gin[i];
    }
    for (int i = 0; i < l->n_params && st == RL_OK; i++)
        st = rl_op_fill(&l->params[i].grad, 0.25);

    double L0 = 0;
    if (st == RL_OK) st = gc_loss_(&c, &L0);
    if (st == RL_OK) st = l->ops->backward(l, &c.io, l->is_loss ? NULL : &R, gp);
    rep->loss = L0;

    /* analytic parameter gradients, offset removed, in one host array */
    int64_t np = rl_layer_num_params(l);
    if (st == RL_OK) st = rl_tensor_empty(&pg, RL_FLOAT64, RL_DEVICE_CPU, 1, &np);
    if (st == RL_OK) {
        pgrads = (double *)rl_tensor_data(&pg);
        int64_t off = 0;
        for (int i = 0; i < l->n_params && st == RL_OK; i++) {
            rl_tensor dst = {0};
            int64_t k = rl_tensor_numel(&l->params[i].grad);
            st = rl_tensor_narrow(&dst, &pg, 0, off, k);
            rl_tensor flat = {0};
            if (st == RL_OK) st = rl_op_reshape(&flat, &l->params[i].grad, 1, &k);
            if (st == RL_OK) st = rl_op_copy(&dst, &flat);
            rl_tensor_release(&flat);
            rl_tensor_release(&dst);
            for (int64_t e = 0; e < k; e++)
                pgrads[off + e] -= 0.25;
            off += k;
        }
    }

    char what[64];
    for (int i = 0; i < n_in && st == RL_OK; i++) {
        snprintf(what, sizeof what, "input %d", i + 1);
        st = gc_sweep_(&c, (rl_tensor *)in[i], (const double *)rl_tensor_data(&gin[i]), eps, floor,
                       true, what, &rep->max_rel_in[i], rep);
    }
    int64_t off = 0;
    for (int i = 0; i < l->n_params && st == RL_OK; i++) {
        snprintf(what, sizeof what, "param %s", l->params[i].name);
        if (!rl_tensor_is_contiguous(&l->params[i].value)) {
            st = rl_error(RL_EARG, "gradcheck: parameter %s is not contiguous", l->params[i].name);
            break;
        }
        st = gc_sweep_(&c, &l->params[i].value, pgrads + off, eps, floor, false, what,
                       &rep->max_rel_param[i], rep);
        off += rl_tensor_numel(&l->params[i].value);
    }

    rl_tensor_release(&pg);
    for (int i = 0; i < n_in; i++)
        rl_tensor_release(&gin[i]);
    rl_tensor_release(&R);
    return st;
}

/* One line for a test log. */
static inline void gc_print(const char *name, const gc_report *r) {
    fprintf(
        stderr,
        "gradcheck %-28s max rel %.2e over %lld values (pad: backward %.1e, numeric %.1e)%s%s\n",
        name, r->max_rel, (long long)r->n_checked, r->max_pad_analytic, r->max_pad_numeric,
        r->max_rel > 1e-6 ? "; worst " : "", r->max_rel > 1e-6 ? r->worst : "");
}

#endif
