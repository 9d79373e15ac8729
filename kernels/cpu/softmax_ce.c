/* The fused softmax / cross-entropy row passes of kernels/softmax_ce.h on the CPU.
 *
 * Per row three sweeps, the row (C floats, 40 KiB at C = 10000) staying in L1/L2 between
 * them: the maximum (16 lanes, so it vectorises without reassociating), exp(z - max) with
 * its sum, and the scaling by 1 / sum. float32 computes exp with its own polynomial (below) so
 * that the sweep vectorises; libm's expf is a call per element. The float32 sweeps are compiled
 * per CPU level (kernels/cpu/cpu_level.h). float64 (gradient checks) uses libm.
 */
#include <math.h>
#include <string.h>

#include "../softmax_ce.h"
#include "cpu_level.h"

#define RL_INLINE static inline __attribute__((always_inline))
#define LANES 16

int64_t rl_ce_targets_cpu(int64_t T, int64_t B, int64_t C, const int32_t *target,
                          const int32_t *len, int32_t *tgt) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            int64_t r = t * B + b;
            if (t >= len[b]) {
                tgt[r] = -1;
                continue;
            }
            if (target[r] < 0 || target[r] >= C) return r;
            tgt[r] = target[r];
        }
    return -1;
}

/* e^x for x <= 0 (and NaN): x = n ln2 + f with |f| <= ln2 / 2, e^f by Cephes' expf polynomial
 * (about 1 ulp), 2^n built in the exponent bits. Branch-free, so loops over it vectorise. Below
 * -87.3 (where e^x is subnormal) it returns 0; NaN stays NaN. */
RL_INLINE float exp_f32(float x) {
    float xc = x > -87.3f ? x : -87.3f; /* NaN -> -87.3: no NaN reaches the int conversion */
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float f = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * f + 1.3981999507e-3f;
    y = y * f + 8.3334519073e-3f;
    y = y * f + 4.1665795894e-2f;
    y = y * f + 1.6666665459e-1f;
    y = y * f + 5.0000001201e-1f;
    y = y * f * f + f + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) * (1 << 23)};
    float e = y * s.f;
    e = x < -87.3f ? 0.0f : e;
    return x != x ? x : e;
}

/* The first NaN of a row that has one (the argmax of rl_op_reduce_dim: a NaN wins). */
static int64_t first_nan_f32(const float *z, int64_t C) {
    for (int64_t c = 0; c < C; c++)
        if (z[c] != z[c]) return c;
    return 0;
}

RL_INLINE void softmax_ce_body_f32(int64_t rows, int64_t C, const float *z, float *p,
                                   const int32_t *tgt, double *loss, double *n_errors) {
    double ls = 0, ne = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *zr = z + r * C;
        float *pr = p + r * C;
        float m[LANES];
        int nan[LANES];
        for (int j = 0; j < LANES; j++) {
            m[j] = -INFINITY;
            nan[j] = 0;
        }
        int64_t c = 0;
        for (; c + LANES <= C; c += LANES)
            for (int j = 0; j < LANES; j++) {
                m[j] = zr[c + j] > m[j] ? zr[c + j] : m[j];
                nan[j] |= zr[c + j] != zr[c + j];
            }
        float mx = -INFINITY;
        bool has_nan = false;
        for (int j = 0; j < LANES; j++) {
            mx = m[j] > mx ? m[j] : mx;
            has_nan |= nan[j] != 0;
        }
        for (; c < C; c++) {
            mx = zr[c] > mx ? zr[c] : mx;
            has_nan |= zr[c] != zr[c];
        }
        /* the target's logit and whether it is the argmax, before an in-place sweep
         * overwrites z: the first maximum, or the first NaN */
        int32_t k = tgt ? tgt[r] : -1;
        float zk = k >= 0 ? zr[k] : 0.0f;
        bool first_max = k >= 0 && zk == mx;
        if (k >= 0 && has_nan)
            first_max = first_nan_f32(zr, C) == k;
        else if (first_max)
            for (int64_t i = 0; i < k && first_max; i++)
                first_max = zr[i] != mx;
        float s[LANES] = {0};
        c = 0;
        for (; c + LANES <= C; c += LANES)
            for (int j = 0; j < LANES; j++) {
                float e = exp_f32(zr[c + j] - mx);
                pr[c + j] = e;
                s[j] += e;
            }
        float sum = 0;
        for (int j = 0; j < LANES; j++)
            sum += s[j];
        for (; c < C; c++) {
            float e = exp_f32(zr[c] - mx);
            pr[c] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        for (c = 0; c < C; c++)
            pr[c] *= inv;
        if (k < 0) continue;
        ls += (double)mx + log((double)sum) - (double)zk;
        ne += first_max ? 0.0 : 1.0;
    }
    if (tgt) {
        *loss = ls;
        *n_errors = ne;
    }
}

RL_INLINE void ce_grad_body_f32(int64_t rows, int64_t C, const float *p, const int32_t *tgt,
                                float *dz, bool accumulate) {
    for (int64_t r = 0; r < rows; r++) {
        const float *pr = p + r * C;
        float *dr = dz + r * C;
        if (tgt[r] < 0) {
            if (!accumulate) memset(dr, 0, (size_t)C * sizeof *dr);
            continue;
        }
        if (accumulate) {
            RL_IVDEP
            for (int64_t c = 0; c < C; c++)
                dr[c] += pr[c];
        } else {
            memcpy(dr, pr, (size_t)C * sizeof *dr);
        }
        dr[tgt[r]] -= 1.0f;
    }
}

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void softmax_ce_avx512(int64_t rows, int64_t C, const float *z, float *p,
                                               const int32_t *tgt, double *loss, double *n_err) {
    softmax_ce_body_f32(rows, C, z, p, tgt, loss, n_err);
}
RL_TARGET_AVX2 static void softmax_ce_avx2(int64_t rows, int64_t C, const float *z, float *p,
                                           const int32_t *tgt, double *loss, double *n_err) {
    softmax_ce_body_f32(rows, C, z, p, tgt, loss, n_err);
}
RL_TARGET_AVX512 static void ce_grad_avx512(int64_t rows, int64_t C, const float *p,
                                            const int32_t *tgt, float *dz, bool accumulate) {
    ce_grad_body_f32(rows, C, p, tgt, dz, accumulate);
}
RL_TARGET_AVX2 static void ce_grad_avx2(int64_t rows, int64_t C, const float *p, const int32_t *tgt,
                                        float *dz, bool accumulate) {
    ce_grad_body_f32(rows, C, p, tgt, dz, accumulate);
}
#endif
RL_TARGET_BASE static void softmax_ce_base(int64_t rows, int64_t C, const float *z, float *p,
                                           const int32_t *tgt, double *loss, double *n_err) {
    softmax_ce_body_f32(rows, C, z, p, tgt, loss, n_err);
}
RL_TARGET_BASE static void ce_grad_base(int64_t rows, int64_t C, const float *p, const int32_t *tgt,
                                        float *dz, bool accumulate) {
    ce_grad_body_f32(rows, C, p, tgt, dz, accumulate);
}

void rl_softmax_ce_cpu_f32(int64_t rows, int64_t C, const float *z, float *p, const int32_t *tgt,
                           double *loss, double *n_errors) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: softmax_ce_avx512(rows, C, z, p, tgt, loss, n_errors); return;
    case RL_CPU_AVX2: softmax_ce_avx2(rows, C, z, p, tgt, loss, n_errors); return;
#endif
    default: softmax_ce_base(rows, C, z, p, tgt, loss, n_errors); return;
    }
}

void rl_ce_grad_cpu_f32(int64_t rows, int64_t C, const float *p, const int32_t *tgt, float *dz,
                        bool accumulate) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: ce_grad_avx512(rows, C, p, tgt, dz, accumulate); return;
    case RL_CPU_AVX2: ce_grad_avx2(rows, C, p, tgt, dz, accumulate); return;
#endif
    default: ce_grad_base(rows, C, p, tgt, dz, accumulate); return;
    }
}

void rl_softmax_ce_cpu_f64(int64_t rows, int64_t C, const double *z, double *p, const int32_t *tgt,
                           double *loss, double *n_errors) {
    double ls = 0, ne = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *zr = z + r * C;
        double *pr = p + r * C;
        /* argmax as rl_op_reduce_dim: the first maximum, a NaN wins */
        double mx = zr[0];
        int64_t am = 0;
        for (int64_t c = 1; c < C; c++)
            if (zr[c] > mx || (zr[c] != zr[c] && mx == mx)) {
                mx = zr[c];
                am = c;
            }
        int32_t k = tgt ? tgt[r] : -1;
        double zk = k >= 0 ? zr[k] : 0.0, sum = 0;
        for (int64_t c = 0; c < C; c++)
            sum += (pr[c] = exp(zr[c] - mx));
        for (int64_t c = 0; c < C; c++)
            pr[c] /= sum;
        if (k < 0) continue;
        ls += mx + log(sum) - zk;
        ne += am == k ? 0.0 : 1.0;
    }
    if (tgt) {
        *loss = ls;
        *n_errors = ne;
    }
}

void rl_ce_grad_cpu_f64(int64_t rows, int64_t C, const double *p, const int32_t *tgt, double *dz,
                        bool accumulate) {
    for (int64_t r = 0; r < rows; r++) {
        const double *pr = p + r * C;
        double *dr = dz + r * C;
        for (int64_t c = 0; c < C; c++)
            dr[c] = (accumulate ? dr[c] : 0.0) + (tgt[r] >= 0 ? pr[c] : 0.0);
        if (tgt[r] >= 0) dr[tgt[r]] -= 1.0;
    }
}
