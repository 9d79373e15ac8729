/* The formulas of one attention step (kernels/attention.h), shared by the CPU loops
 * (kernels/cpu/attention.c) and the CUDA kernels (kernels/cuda/attention.cu), float32 and
 * float64.
 *
 * For one sequence b with L = len[b] valid encoder frames out of Te:
 *   additive: s_j = sum_a v_a z_ja,  z_ja = tanh(pre_ja + hq_a)       (pre = e W_e, hq = q W_q)
 *   dot:      s_j = e_j . q
 *   alpha = softmax(s_0..s_{L-1}), alpha_j = 0 for j >= L (all 0 when L = 0)
 * Backward, given dalpha_j = e_j . dctx:
 *   ds_j = alpha_j (dalpha_j - sum_k alpha_k dalpha_k)
 *   additive: dpre_ja = dhq_ja = ds_j v_a (1 - z_ja^2), dv_a += ds_j z_ja
 * The row functions (softmax, ds) walk one row of Te scores serially: the CPU calls them once
 * per sequence, a CUDA block from one thread (Te is small next to the E- and A-long loops).
 * float32 uses kernels/pointwise.h's branch-free tanh and exp (vectorisable, the same numbers
 * on both devices up to the last bits); float64 uses libm for exact gradient checks. */
#ifndef RL_ATTENTION_STEP_H
#define RL_ATTENTION_STEP_H

#include <math.h>
#include <stdint.h>

#include "../core/hd.h"
#include "pointwise.h"

RL_HD_INLINE float rl_att_z_f32(float pre, float hq) { return rl_tanhf(pre + hq); }
RL_HD_INLINE double rl_att_z_f64(double pre, double hq) { return tanh(pre + hq); }

/* d score / d (pre + hq) for a score gradient ds through v and the tanh's output z */
RL_HD_INLINE float rl_att_dpre_f32(float ds, float v, float z) { return ds * v * (1.0f - z * z); }
RL_HD_INLINE double rl_att_dpre_f64(double ds, double v, double z) {
    return ds * v * (1.0 - z * z);
}

/* s (Te): the scores of frames 0..L-1 in, the weights out (0 from L on). */
RL_HD_INLINE void rl_att_softmax_f32(float *s, int64_t L, int64_t Te) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < L; j++)
        m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < L; j++) {
        s[j] = rl_expf(s[j] - m);
        sum += s[j];
    }
    for (int64_t j = 0; j < L; j++)
        s[j] /= sum;
    for (int64_t j = L; j < Te; j++)
        s[j] = 0.0f;
}

RL_HD_INLINE void rl_att_softmax_f64(double *s, int64_t L, int64_t Te) {
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < L; j++)
        m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < L; j++) {
        s[j] = exp(s[j] - m);
        sum += s[j];
    }
    for (int64_t j = 0; j < L; j++)
        s[j] /= sum;
    for (int64_t j = L; j < Te; j++)
        s[j] = 0.0;
}

/* d (Te): dalpha_0..dalpha_{L-1} in, the score gradients ds out (0 from L on). */
RL_HD_INLINE void rl_att_dscores_f32(const float *alpha, float *d, int64_t L, int64_t Te) {
    float dot = 0.0f;
    for (int64_t j = 0; j < L; j++)
        dot += alpha[j] * d[j];
    for (int64_t j = 0; j < L; j++)
        d[j] = alpha[j] * (d[j] - dot);
    for (int64_t j = L; j < Te; j++)
        d[j] = 0.0f;
}

RL_HD_INLINE void rl_att_dscores_f64(const double *alpha, double *d, int64_t L, int64_t Te) {
    double dot = 0.0;
    for (int64_t j = 0; j < L; j++)
        dot += alpha[j] * d[j];
    for (int64_t j = 0; j < L; j++)
        d[j] = alpha[j] * (d[j] - dot);
    for (int64_t j = L; j < Te; j++)
        d[j] = 0.0;
}

#endif
