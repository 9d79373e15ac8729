/* One attention step on the CPU (layout: kernels/attention.h, formulas:
 * kernels/attention_step.h). Sequences one after the other; per sequence the scores of its
 * valid frames, the softmax, then the context (forward), or the score gradients, then one pass
 * over the valid frames that updates de, dq, dpre and dv (backward).
 *
 * The float32 loops are compiled per CPU level (AVX-512, AVX2+FMA, baseline; picked at run
 * time, kernels/cpu/cpu_level.h). Their sums over E and A use 16 partial sums added in a fixed
 * order at the end, so that they vectorise without reassociation flags and give the same result
 * on every call. float64 serves the gradient checks: plain loops, libm.
 */
#include <stdbool.h>
#include <string.h>

#include "../../core/blas.h"
#include "../attention.h"
#include "../attention_step.h"
#include "cpu_level.h"
#include "parallel.h"

#define RL_INLINE static inline __attribute__((always_inline))

enum { LANES = 16 };

RL_INLINE float dot_f32(const float *restrict x, const float *restrict y, int64_t n) {
    float l[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++)
            l[k] += x[i + k] * y[i + k];
    float s = 0.0f;
    for (; i < n; i++)
        s += x[i] * y[i];
    for (int k = 0; k < LANES; k++)
        s += l[k];
    return s;
}

/* sum_a v_a tanh(p_a + h_a) */
RL_INLINE float additive_score_f32(const float *restrict p, const float *restrict h,
                                   const float *restrict v, int64_t n) {
    float l[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++)
            l[k] += v[i + k] * rl_att_z_f32(p[i + k], h[i + k]);
    float s = 0.0f;
    for (; i < n; i++)
        s += v[i] * rl_att_z_f32(p[i], h[i]);
    for (int k = 0; k < LANES; k++)
        s += l[k];
    return s;
}

static int64_t valid(const int32_t *len, int64_t b, int64_t Te) {
    int64_t L = len[b];
    return L < 0 ? 0 : (L > Te ? Te : L);
}

RL_INLINE void fwd_body_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                            const float *e, const int32_t *len, const float *q, const float *pre,
                            const float *v, float *alpha, float *ctx, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
        int64_t L = valid(len, b, Te);
        float *al = alpha + b * Te;
        for (int64_t j = 0; j < L; j++)
            al[j] = kind == RL_ATT_ADDITIVE
                        ? additive_score_f32(pre + (j * B + b) * A, q + b * A, v, A)
                        : dot_f32(e + (j * B + b) * E, q + b * E, E);
        rl_att_softmax_f32(al, L, Te);
        float *restrict c = ctx + b * E;
        memset(c, 0, (size_t)E * sizeof *c);
        for (int64_t j = 0; j < L; j++) {
            const float *restrict er = e + (j * B + b) * E;
            float a = al[j];
            for (int64_t k = 0; k < E; k++)
                c[k] += a * er[k];
        }
    }
}

RL_INLINE void bwd_body_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                            const float *e, const int32_t *len, const float *q, const float *pre,
                            const float *v, const float *alpha, const float *dctx, float *ds,
                            float *de, float *dq, float *dpre, float *dv, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
        int64_t L = valid(len, b, Te);
        const float *al = alpha + b * Te;
        const float *restrict dc = dctx + b * E;
        float *d = ds + b * Te;
        for (int64_t j = 0; j < L; j++)
            d[j] = dot_f32(e + (j * B + b) * E, dc, E);
        rl_att_dscores_f32(al, d, L, Te);
        int64_t Q = kind == RL_ATT_ADDITIVE ? A : E;
        const float *restrict qb = q + b * Q;
        float *restrict dqb = dq + b * Q;
        memset(dqb, 0, (size_t)Q * sizeof *dqb);
        for (int64_t j = 0; j < L; j++) {
            const float *restrict er = e + (j * B + b) * E;
            float *restrict der = de + (j * B + b) * E;
            float a = al[j], s = d[j];
            if (kind == RL_ATT_DOT) {
                for (int64_t k = 0; k < E; k++) {
                    der[k] += a * dc[k] + s * qb[k];
                    dqb[k] += s * er[k];
                }
                continue;
            }
            for (int64_t k = 0; k < E; k++)
                der[k] += a * dc[k];
            const float *restrict p = pre + (j * B + b) * A;
            float *restrict dp = dpre + (j * B + b) * A;
            float *restrict dvb = dv + b * A;
            RL_IVDEP
            for (int64_t k = 0; k < A; k++) {
                float z = rl_att_z_f32(p[k], qb[k]);
                float g = rl_att_dpre_f32(s, v[k], z);
                dvb[k] += s * z;
                dp[k] += g;
                dqb[k] += g;
            }
        }
    }
}

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void fwd_avx512(rl_att_kind kind, int64_t Te, int64_t B, int64_t E,
                                        int64_t A, const float *e, const int32_t *len,
                                        const float *q, const float *pre, const float *v,
                                        float *alpha, float *ctx, int64_t b0, int64_t b1) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx, b0, b1);
}

RL_TARGET_AVX2 static void fwd_avx2(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, float *alpha, float *ctx,
                                    int64_t b0, int64_t b1) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx, b0, b1);
}

RL_TARGET_AVX512 static void bwd_avx512(rl_att_kind kind, int64_t Te, int64_t B, int64_t E,
                                        int64_t A, const float *e, const int32_t *len,
                                        const float *q, const float *pre, const float *v,
                                        const float *alpha, const float *dctx, float *ds, float *de,
                                        float *dq, float *dpre, float *dv, int64_t b0, int64_t b1) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv, b0, b1);
}

RL_TARGET_AVX2 static void bwd_avx2(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, const float *alpha,
                                    const float *dctx, float *ds, float *de, float *dq, float *dpre,
                                    float *dv, int64_t b0, int64_t b1) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv, b0, b1);
}
#endif

RL_TARGET_BASE static void fwd_base(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, float *alpha, float *ctx,
                                    int64_t b0, int64_t b1) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx, b0, b1);
}

RL_TARGET_BASE static void bwd_base(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, const float *alpha,
                                    const float *dctx, float *ds, float *de, float *dq, float *dpre,
                                    float *dv, int64_t b0, int64_t b1) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv, b0, b1);
}

static void fwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A, const double *e,
                    const int32_t *len, const double *q, const double *pre, const double *v,
                    double *alpha, double *ctx, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
        int64_t L = valid(len, b, Te);
        double *al = alpha + b * Te;
        for (int64_t j = 0; j < L; j++) {
            double s = 0.0;
            if (kind == RL_ATT_ADDITIVE) {
                const double *p = pre + (j * B + b) * A;
                for (int64_t k = 0; k < A; k++)
                    s += v[k] * rl_att_z_f64(p[k], q[b * A + k]);
            } else {
                const double *er = e + (j * B + b) * E;
                for (int64_t k = 0; k < E; k++)
                    s += er[k] * q[b * E + k];
            }
            al[j] = s;
        }
        rl_att_softmax_f64(al, L, Te);
        double *c = ctx + b * E;
        for (int64_t k = 0; k < E; k++)
            c[k] = 0.0;
        for (int64_t j = 0; j < L; j++)
            for (int64_t k = 0; k < E; k++)
                c[k] += al[j] * e[(j * B + b) * E + k];
    }
}

static void bwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A, const double *e,
                    const int32_t *len, const double *q, const double *pre, const double *v,
                    const double *alpha, const double *dctx, double *ds, double *de, double *dq,
                    double *dpre, double *dv, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
        int64_t L = valid(len, b, Te);
        const double *al = alpha + b * Te, *dc = dctx + b * E;
        double *d = ds + b * Te;
        for (int64_t j = 0; j < L; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < E; k++)
                s += e[(j * B + b) * E + k] * dc[k];
            d[j] = s;
        }
        rl_att_dscores_f64(al, d, L, Te);
        int64_t Q = kind == RL_ATT_ADDITIVE ? A : E;
        const double *qb = q + b * Q;
        double *dqb = dq + b * Q;
        for (int64_t k = 0; k < Q; k++)
            dqb[k] = 0.0;
        for (int64_t j = 0; j < L; j++) {
            const double *er = e + (j * B + b) * E;
            double *der = de + (j * B + b) * E;
            for (int64_t k = 0; k < E; k++)
                der[k] += al[j] * dc[k] + (kind == RL_ATT_DOT ? d[j] * qb[k] : 0.0);
            if (kind == RL_ATT_DOT) {
                for (int64_t k = 0; k < E; k++)
                    dqb[k] += d[j] * er[k];
                continue;
            }
            const double *p = pre + (j * B + b) * A;
            double *dp = dpre + (j * B + b) * A;
            for (int64_t k = 0; k < A; k++) {
                double z = rl_att_z_f64(p[k], qb[k]);
                double g = rl_att_dpre_f64(d[j], v[k], z);
                dv[b * A + k] += d[j] * z;
                dp[k] += g;
                dqb[k] += g;
            }
        }
    }
}

/* The arguments of one call, shared by its parts; the pointers are void so that one job
 * serves both dtypes. */
typedef struct {
    bool bwd, f64;
    rl_att_kind kind;
    int64_t Te, B, E, A;
    const void *e, *q, *pre, *v, *dctx;
    const int32_t *len;
    void *alpha, *ctx, *ds, *de, *dq, *dpre, *dv;
} job_t;

/* Part `part` of `parts` takes sequences b0 .. b1-1: every output of a sequence (its weights,
 * context, ds, dq, its frames of de and dpre, its row of dv) is written by that sequence alone,
 * so the parts share nothing and the result is the same for any split. */
static void part_fn(void *ctx, int part, int parts) {
    const job_t *j = ctx;
    int64_t b0 = j->B * part / parts, b1 = j->B * (part + 1) / parts;
    if (j->f64) {
        if (j->bwd)
            bwd_f64(j->kind, j->Te, j->B, j->E, j->A, j->e, j->len, j->q, j->pre, j->v, j->alpha,
                    j->dctx, j->ds, j->de, j->dq, j->dpre, j->dv, b0, b1);
        else
            fwd_f64(j->kind, j->Te, j->B, j->E, j->A, j->e, j->len, j->q, j->pre, j->v, j->alpha,
                    j->ctx, b0, b1);
        return;
    }
    void (*fwd)(rl_att_kind, int64_t, int64_t, int64_t, int64_t, const float *, const int32_t *,
                const float *, const float *, const float *, float *, float *, int64_t, int64_t) =
        fwd_base;
    void (*bwd)(rl_att_kind, int64_t, int64_t, int64_t, int64_t, const float *, const int32_t *,
                const float *, const float *, const float *, const float *, const float *, float *,
                float *, float *, float *, float *, int64_t, int64_t) = bwd_base;
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: fwd = fwd_avx512, bwd = bwd_avx512; break;
    case RL_CPU_AVX2: fwd = fwd_avx2, bwd = bwd_avx2; break;
#endif
    default: break;
    }
    if (j->bwd)
        bwd(j->kind, j->Te, j->B, j->E, j->A, j->e, j->len, j->q, j->pre, j->v, j->alpha, j->dctx,
            j->ds, j->de, j->dq, j->dpre, j->dv, b0, b1);
    else
        fwd(j->kind, j->Te, j->B, j->E, j->A, j->e, j->len, j->q, j->pre, j->v, j->alpha, j->ctx,
            b0, b1);
}

/* One part per BLAS thread (at most one per sequence) where a call has PAR_MIN frame elements
 * or more: a decoder step's call sits between products that use every thread, and serial it
 * took ~6% of a G2P training step (B = 64, Te = 8, E = 256, A = 128: 196608 elements). */
#define PAR_MIN (1 << 13)

static void run(job_t *j) {
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > j->B) parts = (int)j->B;
    if (parts < 2 || j->B * j->Te * (j->E + (j->kind == RL_ATT_ADDITIVE ? j->A : 0)) < PAR_MIN) {
        if (j->B > 0) part_fn(j, 0, 1);
        return;
    }
    rl_cpu_parallel(parts, part_fn, j);
}

void rl_attention_cpu_fwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, float *alpha, float *ctx) {
    job_t j = {.kind = kind,
               .Te = Te,
               .B = B,
               .E = E,
               .A = A,
               .e = e,
               .len = len,
               .q = q,
               .pre = pre,
               .v = v,
               .alpha = alpha,
               .ctx = ctx};
    run(&j);
}

void rl_attention_cpu_bwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, const float *alpha, const float *dctx, float *ds,
                              float *de, float *dq, float *dpre, float *dv) {
    job_t j = {.bwd = true,
               .kind = kind,
               .Te = Te,
               .B = B,
               .E = E,
               .A = A,
               .e = e,
               .len = len,
               .q = q,
               .pre = pre,
               .v = v,
               .alpha = (void *)alpha,
               .dctx = dctx,
               .ds = ds,
               .de = de,
               .dq = dq,
               .dpre = dpre,
               .dv = dv};
    run(&j);
}

void rl_attention_cpu_fwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, double *alpha, double *ctx) {
    job_t j = {.f64 = true,
               .kind = kind,
               .Te = Te,
               .B = B,
               .E = E,
               .A = A,
               .e = e,
               .len = len,
               .q = q,
               .pre = pre,
               .v = v,
               .alpha = alpha,
               .ctx = ctx};
    run(&j);
}

void rl_attention_cpu_bwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, const double *alpha,
                              const double *dctx, double *ds, double *de, double *dq, double *dpre,
                              double *dv) {
    job_t j = {.bwd = true,
               .f64 = true,
               .kind = kind,
               .Te = Te,
               .B = B,
               .E = E,
               .A = A,
               .e = e,
               .len = len,
               .q = q,
               .pre = pre,
               .v = v,
               .alpha = (void *)alpha,
               .dctx = dctx,
               .ds = ds,
               .de = de,
               .dq = dq,
               .dpre = dpre,
               .dv = dv};
    run(&j);
}
