/* rl_attention_forward / rl_attention_backward: the argument checks and the device dispatch of
 * one attention step (kernels/attention.h). Every tensor is checked for its dtype, device,
 * shape and contiguity before a kernel runs; the kernels then trust them. */
#include "attention.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#ifdef RL_WITH_CUDA
#include "cuda/attention_cuda.h"
#endif

typedef struct {
    const char *who;
    rl_dtype dt;
    rl_device dev;
} ctx_t;

/* t must be a contiguous tensor of c's dtype (int32 for lengths) and device with the given
 * shape */
static rl_status expect(const ctx_t *c, const char *name, const rl_tensor *t, rl_dtype dt, int ndim,
                        int64_t d0, int64_t d1, int64_t d2) {
    const int64_t want[3] = {d0, d1, d2};
    bool ok = t && t->storage && t->ndim == ndim && t->dtype == dt &&
              rl_device_eq(rl_tensor_device(t), c->dev) && rl_tensor_is_contiguous(t);
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == want[d];
    if (ok) return RL_OK;
    char s[128], w[96];
    if (ndim == 1)
        snprintf(w, sizeof w, "(%" PRId64 ")", d0);
    else if (ndim == 2)
        snprintf(w, sizeof w, "(%" PRId64 ", %" PRId64 ")", d0, d1);
    else
        snprintf(w, sizeof w, "(%" PRId64 ", %" PRId64 ", %" PRId64 ")", d0, d1, d2);
    return rl_error(RL_ESHAPE,
                    "%s: %s must be a contiguous %s %s tensor on the encoder's device, "
                    "got %s",
                    c->who, name, w, rl_dtype_name(dt),
                    t && t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing");
}

/* The shared checks of both directions; sets Te, B, E, A (A = 0 for dot). */
static rl_status check_common(ctx_t *c, rl_att_kind kind, const rl_tensor *e, const rl_tensor *len,
                              const rl_tensor *q, const rl_tensor *pre, const rl_tensor *v,
                              const rl_tensor *alpha, int64_t *Te, int64_t *B, int64_t *E,
                              int64_t *A) {
    char s[128];
    if (kind != RL_ATT_DOT && kind != RL_ATT_ADDITIVE)
        return rl_error(RL_EARG, "%s: unknown attention kind %d", c->who, (int)kind);
    if (!e || !e->storage || e->ndim != 3 || (e->dtype != RL_FLOAT32 && e->dtype != RL_FLOAT64) ||
        !rl_tensor_is_contiguous(e))
        return rl_error(RL_ESHAPE,
                        "%s: the encoder must be a contiguous (Te, B, E) float32 or float64 "
                        "tensor, got %s",
                        c->who, e && e->storage ? rl_tensor_describe(e, s, sizeof s) : "nothing");
    c->dt = e->dtype;
    c->dev = rl_tensor_device(e);
    *Te = e->shape[0];
    *B = e->shape[1];
    *E = e->shape[2];
    RL_TRY(expect(c, "the lengths", len, RL_INT32, 1, *B, 0, 0));
    if (c->dev.type == RL_CPU) {
        const int32_t *l = rl_tensor_data(len);
        for (int64_t b = 0; b < *B; b++)
            if (l[b] < 0 || l[b] > *Te)
                return rl_error(RL_EINDEX,
                                "%s: sequence %" PRId64 ": encoder length %d is outside 0..%" PRId64
                                " (Te)",
                                c->who, b + 1, (int)l[b], *Te);
    }
    *A = 0;
    if (kind == RL_ATT_ADDITIVE) {
        if (!v || !v->storage || v->ndim < 1)
            return rl_error(RL_ESHAPE, "%s: additive attention needs v (A)", c->who);
        *A = rl_tensor_numel(v);
        /* v is any contiguous shape of A elements (the parameter is (A, 1)) */
        if (v->dtype != c->dt || !rl_device_eq(rl_tensor_device(v), c->dev) ||
            !rl_tensor_is_contiguous(v) || *A < 1)
            return rl_error(RL_ESHAPE,
                            "%s: v must be a contiguous %s tensor of A > 0 elements on the "
                            "encoder's device, got %s",
                            c->who, rl_dtype_name(c->dt), rl_tensor_describe(v, s, sizeof s));
        RL_TRY(expect(c, "pre (e W_e)", pre, c->dt, 3, *Te, *B, *A));
        RL_TRY(expect(c, "the projected query (q W_q)", q, c->dt, 2, *B, *A, 0));
    } else {
        RL_TRY(expect(c, "the query", q, c->dt, 2, *B, *E, 0));
    }
    return expect(c, "alpha", alpha, c->dt, 2, *B, *Te, 0);
}

rl_status rl_attention_forward(const char *who, rl_att_kind kind, const rl_tensor *e,
                               const rl_tensor *len, const rl_tensor *q, const rl_tensor *pre,
                               const rl_tensor *v, rl_tensor *alpha, rl_tensor *ctx) {
    ctx_t c = {who, RL_FLOAT32, RL_DEVICE_CPU};
    int64_t Te, B, E, A;
    RL_TRY(check_common(&c, kind, e, len, q, pre, v, alpha, &Te, &B, &E, &A));
    RL_TRY(expect(&c, "the context", ctx, c.dt, 2, B, E, 0));
    const void *P = kind == RL_ATT_ADDITIVE ? rl_tensor_data(pre) : NULL;
    const void *V = kind == RL_ATT_ADDITIVE ? rl_tensor_data(v) : NULL;
    if (c.dev.type == RL_CUDA) {
#ifdef RL_WITH_CUDA
        return rl_attention_cuda_fwd(c.dt, kind, Te, B, E, A, rl_tensor_data(e),
                                     rl_tensor_data(len), rl_tensor_data(q), P, V,
                                     rl_tensor_data(alpha), rl_tensor_data(ctx));
#else
        return rl_error(RL_EDEVICE, "%s: CUDA tensors in a build without CUDA", who);
#endif
    }
    if (c.dt == RL_FLOAT32)
        rl_attention_cpu_fwd_f32(kind, Te, B, E, A, rl_tensor_data(e), rl_tensor_data(len),
                                 rl_tensor_data(q), P, V, rl_tensor_data(alpha),
                                 rl_tensor_data(ctx));
    else
        rl_attention_cpu_fwd_f64(kind, Te, B, E, A, rl_tensor_data(e), rl_tensor_data(len),
                                 rl_tensor_data(q), P, V, rl_tensor_data(alpha),
                                 rl_tensor_data(ctx));
    return RL_OK;
}

rl_status rl_attention_backward(const char *who, rl_att_kind kind, const rl_tensor *e,
                                const rl_tensor *len, const rl_tensor *q, const rl_tensor *pre,
                                const rl_tensor *v, const rl_tensor *alpha, const rl_tensor *dctx,
                                rl_tensor *ds, rl_tensor *de, rl_tensor *dq, rl_tensor *dpre,
                                rl_tensor *dv) {
    ctx_t c = {who, RL_FLOAT32, RL_DEVICE_CPU};
    int64_t Te, B, E, A;
    RL_TRY(check_common(&c, kind, e, len, q, pre, v, alpha, &Te, &B, &E, &A));
    RL_TRY(expect(&c, "the context's gradient", dctx, c.dt, 2, B, E, 0));
    RL_TRY(expect(&c, "ds", ds, c.dt, 2, B, Te, 0));
    RL_TRY(expect(&c, "the encoder's gradient", de, c.dt, 3, Te, B, E));
    RL_TRY(expect(&c, "the query's gradient", dq, c.dt, 2, B, kind == RL_ATT_ADDITIVE ? A : E, 0));
    if (kind == RL_ATT_ADDITIVE) {
        RL_TRY(expect(&c, "dpre", dpre, c.dt, 3, Te, B, A));
        RL_TRY(expect(&c, "dv (B, A)", dv, c.dt, 2, B, A, 0));
    }
    const bool add = kind == RL_ATT_ADDITIVE;
    const void *P = add ? rl_tensor_data(pre) : NULL, *V = add ? rl_tensor_data(v) : NULL;
    void *DP = add ? rl_tensor_data(dpre) : NULL, *DV = add ? rl_tensor_data(dv) : NULL;
    if (c.dev.type == RL_CUDA) {
#ifdef RL_WITH_CUDA
        return rl_attention_cuda_bwd(
            c.dt, kind, Te, B, E, A, rl_tensor_data(e), rl_tensor_data(len), rl_tensor_data(q), P,
            V, rl_tensor_data(alpha), rl_tensor_data(dctx), rl_tensor_data(ds), rl_tensor_data(de),
            rl_tensor_data(dq), DP, DV);
#else
        return rl_error(RL_EDEVICE, "%s: CUDA tensors in a build without CUDA", who);
#endif
    }
    if (c.dt == RL_FLOAT32)
        rl_attention_cpu_bwd_f32(kind, Te, B, E, A, rl_tensor_data(e), rl_tensor_data(len),
                                 rl_tensor_data(q), P, V, rl_tensor_data(alpha),
                                 rl_tensor_data(dctx), rl_tensor_data(ds), rl_tensor_data(de),
                                 rl_tensor_data(dq), DP, DV);
    else
        rl_attention_cpu_bwd_f64(kind, Te, B, E, A, rl_tensor_data(e), rl_tensor_data(len),
                                 rl_tensor_data(q), P, V, rl_tensor_data(alpha),
                                 rl_tensor_data(dctx), rl_tensor_data(ds), rl_tensor_data(de),
                                 rl_tensor_data(dq), DP, DV);
    return RL_OK;
}
