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

#include "../attention.h"
#include "../attention_step.h"
#include "cpu_level.h"

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
                            const float *v, float *alpha, float *ctx) {
    for (int64_t b = 0; b < B; b++) {
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
                            float *de, float *dq, float *dpre, float *dv) {
    for (int64_t b = 0; b < B; b++) {
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
                                        float *alpha, float *ctx) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx);
}

RL_TARGET_AVX2 static void fwd_avx2(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, float *alpha, float *ctx) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx);
}

RL_TARGET_AVX512 static void bwd_avx512(rl_att_kind kind, int64_t Te, int64_t B, int64_t E,
                                        int64_t A, const float *e, const int32_t *len,
                                        const float *q, const float *pre, const float *v,
                                        const float *alpha, const float *dctx, float *ds, float *de,
                                        float *dq, float *dpre, float *dv) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
}

RL_TARGET_AVX2 static void bwd_avx2(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, const float *alpha,
                                    const float *dctx, float *ds, float *de, float *dq, float *dpre,
                                    float *dv) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
}
#endif

RL_TARGET_BASE static void fwd_base(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, float *alpha, float *ctx) {
    fwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx);
}

RL_TARGET_BASE static void bwd_base(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                                    const float *e, const int32_t *len, const float *q,
                                    const float *pre, const float *v, const float *alpha,
                                    const float *dctx, float *ds, float *de, float *dq, float *dpre,
                                    float *dv) {
    bwd_body_f32(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
}

void rl_attention_cpu_fwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, float *alpha, float *ctx) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: fwd_avx512(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx); return;
    case RL_CPU_AVX2: fwd_avx2(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx); return;
#endif
    default: fwd_base(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx); return;
    }
}

void rl_attention_cpu_bwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, const float *alpha, const float *dctx, float *ds,
                              float *de, float *dq, float *dpre, float *dv) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512:
        bwd_avx512(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
        return;
    case RL_CPU_AVX2:
        bwd_avx2(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
        return;
#endif
    default: bwd_base(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
    }
}

void rl_attention_cpu_fwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, double *alpha, double *ctx) {
    for (int64_t b = 0; b < B; b++) {
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

void rl_attention_cpu_bwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, const double *alpha,
                              const double *dctx, double *ds, double *de, double *dq, double *dpre,
                              double *dv) {
    for (int64_t b = 0; b < B; b++) {
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
