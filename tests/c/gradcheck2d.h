/* Finite-difference gradient checks of 2-D C layers in float64 (images (H, W, B, F) with
 * per-image sizes), for the C unit tests; include after gradcheck.h (it reuses its options,
 * parameter binding and gc_rel_). Everything here is static inline.
 *
 *   gc2d_sizes        sizes (B, 2) int32 from an array {h_1, w_1, h_2, w_2, ...}
 *   gc2d_random_input x (H, W, B, F) U(-1, 1), padding included
 *   gc2d_check        compares backward with central differences of
 *                       L = sum over the VALID output positions of out * R
 *                     R a fixed random projection, zero on padding (so grad_out = R). The
 *                     output is either 2-D (Ho, Wo, B, n_out), valid where y < ho_b and
 *                     x < wo_b, or 1-D (T, B, n_out), valid where t < len_b. cfg->geometry
 *                     gives the output's sizes (B, 2) or lengths (B) after a forward; NULL
 *                     means the output is 2-D with the input's sizes.
 * Every input element (padding included) and parameter element is perturbed by +-eps. As in
 * gradcheck.h, grad_in is prefilled with NaN and param.grad with 0.25 (subtracted after), so a
 * layer that leaves elements unwritten or overwrites parameter gradients fails. The report's
 * max_pad_* fields cover the input padding (y >= h_b or x >= w_b): both must be 0. */
#ifndef RL_GRADCHECK2D_H
#define RL_GRADCHECK2D_H

#include "gradcheck.h"

static inline rl_status gc2d_sizes(rl_tensor *sizes, int64_t B, const int *hw) {
    int64_t shape[2] = {B, 2};
    RL_TRY(rl_tensor_empty(sizes, RL_INT32, RL_DEVICE_CPU, 2, shape));
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < 2; k++) {
            int64_t idx[2] = {b, k};
            rl_tensor_set(sizes, idx, hw[2 * b + k]);
        }
    return RL_OK;
}

static inline rl_status gc2d_random_input(rl_tensor *x, rl_dtype dt, int64_t H, int64_t W,
                                          int64_t B, int64_t F, rl_rng *g) {
    int64_t shape[4] = {H, W, B, F};
    RL_TRY(rl_tensor_empty(x, dt, RL_DEVICE_CPU, 4, shape));
    return rl_op_uniform(x, g, -1.0, 1.0);
}

typedef struct {
    double eps, floor;
    bool train;
    uint64_t seed;
    const rl_tensor *(*geometry)(const rl_layer *l); /* output sizes/lengths, or NULL */
} gc2d_config;

typedef struct {
    rl_layer *l;
    rl_layer_io io;
    rl_rng rng0;
    const rl_tensor *R;
    const gc2d_config *cfg;
} gc2d_ctx_;

static inline const rl_tensor *gc2d_geometry_(const gc2d_ctx_ *c) {
    return c->cfg->geometry ? c->cfg->geometry(c->l) : c->io.sizes;
}

/* Whether output element e (flat, row-major) is valid under geometry g. */
static inline bool gc2d_out_valid_(const rl_tensor *out, const rl_tensor *g, int64_t e) {
    int64_t F = out->shape[out->ndim - 1], B = out->shape[out->ndim - 2];
    int64_t b = (e / F) % B, pos = e / (F * B);
    if (out->ndim == 3) return pos < (int64_t)rl_tensor_get(g, &b);
    int64_t Wo = out->shape[1], y = pos / Wo, x = pos % Wo;
    int64_t ih[2] = {b, 0}, iw[2] = {b, 1};
    return y < (int64_t)rl_tensor_get(g, ih) && x < (int64_t)rl_tensor_get(g, iw);
}

static inline rl_status gc2d_loss_(gc2d_ctx_ *c, double *L) {
    rl_rng g = c->rng0;
    c->io.rng = &g;
    RL_TRY(c->l->ops->forward(c->l, &c->io));
    const rl_tensor *out = &c->l->out;
    const double *o = (const double *)rl_tensor_data(out),
                 *r = (const double *)rl_tensor_data(c->R);
    double s = 0;
    for (int64_t e = 0; e < rl_tensor_numel(out); e++)
        s += o[e] * r[e];
    *L = s;
    return RL_OK;
}

static inline rl_status gc2d_sweep_(gc2d_ctx_ *c, rl_tensor *x, const double *ag, double eps,
                                    double floor, bool is_input, const char *what, double *max_rel,
                                    gc_report *rep) {
    double *v = (double *)rl_tensor_data(x);
    int64_t n = rl_tensor_numel(x);
    for (int64_t e = 0; e < n; e++) {
        double keep = v[e], lp, lm;
        v[e] = keep + eps;
        rl_status st = gc2d_loss_(c, &lp);
        v[e] = keep - eps;
        if (st == RL_OK) st = gc2d_loss_(c, &lm);
        v[e] = keep;
        RL_TRY(st);
        double num = (lp - lm) / (2 * eps);
        if (is_input && !gc2d_out_valid_(x, c->io.sizes, e)) {
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

/* Runs the check on l (params bound as float64 CPU) with n_in contiguous float64 CPU inputs
 * (H, W, B, in_dims[i]) and sizes (B, 2); fills rep. */
static inline rl_status gc2d_check(rl_layer *l, int n_in, rl_tensor *const *in,
                                   const rl_tensor *sizes, const gc2d_config *cfg, gc_report *rep) {
    memset(rep, 0, sizeof *rep);
    double eps = cfg->eps > 0 ? cfg->eps : 1e-6, floor = cfg->floor > 0 ? cfg->floor : 1e-2;
    for (int i = 0; i < n_in; i++)
        if (in[i]->dtype != RL_FLOAT64 || !rl_tensor_is_contiguous(in[i]) || in[i]->ndim != 4)
            return rl_error(RL_EARG, "gradcheck2d: input %d must be float64, contiguous, 4-D",
                            i + 1);
    gc2d_ctx_ c;
    memset(&c, 0, sizeof c);
    c.l = l;
    c.cfg = cfg;
    c.io.n_in = n_in;
    for (int i = 0; i < n_in; i++)
        c.io.in[i] = in[i];
    c.io.sizes = sizes;
    c.io.train = cfg->train;
    rl_rng_seed(&c.rng0, cfg->seed * 2 + 1);

    rl_tensor R = {0}, pg = {0}, gin[RL_LAYER_MAX_INPUTS] = {{0}};
    rl_tensor *gp[RL_LAYER_MAX_INPUTS] = {0};
    rl_rng g0 = c.rng0;
    c.io.rng = &g0;
    rl_status st = l->ops->forward(l, &c.io);
    if (st == RL_OK) {
        rl_rng g;
        rl_rng_seed(&g, cfg->seed * 2);
        st = rl_tensor_empty_like(&R, &l->out);
        if (st == RL_OK) st = rl_op_normal(&R, &g, 0.0, 1.0);
        const rl_tensor *geo = gc2d_geometry_(&c);
        double *r = st == RL_OK ? (double *)rl_tensor_data(&R) : NULL;
        for (int64_t e = 0; st == RL_OK && e < rl_tensor_numel(&R); e++)
            if (!gc2d_out_valid_(&R, geo, e)) r[e] = 0.0;
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
    if (st == RL_OK) st = gc2d_loss_(&c, &L0);
    if (st == RL_OK) st = l->ops->backward(l, &c.io, &R, gp);
    rep->loss = L0;

    int64_t np = rl_layer_num_params(l);
    double *pgrads = NULL;
    if (st == RL_OK && np > 0) st = rl_tensor_empty(&pg, RL_FLOAT64, RL_DEVICE_CPU, 1, &np);
    if (st == RL_OK && np > 0) {
        pgrads = (double *)rl_tensor_data(&pg);
        int64_t off = 0;
        for (int i = 0; i < l->n_params; i++) {
            const double *gv = (const double *)rl_tensor_data(&l->params[i].grad);
            int64_t k = rl_tensor_numel(&l->params[i].grad);
            for (int64_t e = 0; e < k; e++)
                pgrads[off + e] = gv[e] - 0.25;
            off += k;
        }
    }
    char what[64];
    for (int i = 0; i < n_in && st == RL_OK; i++) {
        snprintf(what, sizeof what, "input %d", i + 1);
        st = gc2d_sweep_(&c, (rl_tensor *)in[i], (const double *)rl_tensor_data(&gin[i]), eps,
                         floor, true, what, &rep->max_rel_in[i], rep);
    }
    int64_t off = 0;
    for (int i = 0; i < l->n_params && st == RL_OK; i++) {
        snprintf(what, sizeof what, "param %s", l->params[i].name);
        st = gc2d_sweep_(&c, &l->params[i].value, pgrads + off, eps, floor, false, what,
                         &rep->max_rel_param[i], rep);
        off += rl_tensor_numel(&l->params[i].value);
    }
    rl_tensor_release(&pg);
    for (int i = 0; i < n_in; i++)
        rl_tensor_release(&gin[i]);
    rl_tensor_release(&R);
    return st;
}

#endif
