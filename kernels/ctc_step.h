/* The CTC recurrences, one extended-label position of one step: formulas shared by the CPU loops
 * (kernels/cpu/ctc.c) and the CUDA kernel (kernels/cuda/ctc.cu), float32 and float64.
 *
 * A target l_0 .. l_{S-1} (labels other than the blank) is extended to U = 2S + 1 positions,
 * ext(u) = blank for even u and l_{(u-1)/2} for odd u. With lp(t, k) the log-softmax of frame t:
 *   alpha(t, u) = log sum of the probabilities of the prefixes of the paths that are at u at t
 *                 (emissions of frames 0..t included):
 *     alpha(0, 0) = lp(0, blank), alpha(0, 1) = lp(0, l_0), else impossible;
 *     alpha(t, u) = lse(alpha(t-1, u), alpha(t-1, u-1), alpha(t-1, u-2) if skip(u)) + lp(t, ext(u))
 *   beta(t, u)  = log sum of the probabilities of the completions from u at t (emissions of
 *                 frames t+1..T-1 only):
 *     beta(T-1, U-1) = beta(T-1, U-2) = 0, else impossible;
 *     beta(t, u) = lse(nb(u), nb(u+1), nb(u+2) if skip(u+2)),  nb(v) = beta(t+1, v) + lp(t+1,
 * ext(v)) skip(u): u odd, u >= 3 and l_{(u-1)/2} != l_{(u-3)/2} (a label may follow the previous
 *            label directly only when they differ).
 *   log P = lse(alpha(T-1, U-1), alpha(T-1, U-2));  loss = -log P
 *   gamma(t, k) = sum over u with ext(u) = k of exp(alpha(t, u) + beta(t, u) - log P)
 *   d loss / d logit(t, k) = softmax(t, k) - gamma(t, k)   (sum_k gamma(t, k) = 1)
 *
 * "Impossible" is RL_CTC_NEG, a large finite negative number rather than -inf, so that the
 * log-sum-exp needs no branch (max - max of two impossible entries is 0, not NaN) and the
 * loops vectorise; sums of it with ordinary log-probabilities stay far below RL_CTC_IMPOSSIBLE,
 * the threshold under which log P means "no path fits" (an infinite loss). A -inf logit makes its
 * log-probability -inf, which enters the recurrences as RL_CTC_NEG (rl_ctc_floor_*): -inf - -inf
 * would be NaN, where a class impossible on a frame only makes the alignments through it
 * impossible. A NaN in a valid frame propagates to the loss. */
#ifndef RL_CTC_STEP_H
#define RL_CTC_STEP_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../core/hd.h"
#include "pointwise.h"

#define RL_CTC_NEG (-1e30f)
#define RL_CTC_IMPOSSIBLE (-1e29f)

/* A log-probability as the recurrences take it: -inf (and anything below) as RL_CTC_NEG; NaN
 * stays NaN (the comparison is false). */
RL_HD_INLINE float rl_ctc_floor_f32(float lp) { return lp < RL_CTC_NEG ? RL_CTC_NEG : lp; }
RL_HD_INLINE double rl_ctc_floor_f64(double lp) {
    return lp < (double)RL_CTC_NEG ? (double)RL_CTC_NEG : lp;
}

/* log(e^a + e^b + e^c), stable; a NaN argument gives NaN. float32: the largest term is
 * e^0 = 1, so two exponentials suffice (lo, mid: the two others, by selects); the (x - x)
 * terms are 0 for finite x and NaN for a NaN, which the selects alone could drop. */
RL_HD_INLINE float rl_ctc_lse3f(float a, float b, float c) {
    float lo = a < b ? a : b, hi = a < b ? b : a;
    float m = hi > c ? hi : c, mid = hi > c ? c : hi;
    float nan_guard = (a - a) + (b - b) + (c - c);
    return m + rl_logf(1.0f + rl_expf(lo - m) + rl_expf(mid - m) + nan_guard);
}
RL_HD_INLINE double rl_ctc_lse3(double a, double b, double c) {
    double m = a > b ? a : b;
    m = m > c ? m : c;
    return m + log(exp(a - m) + exp(b - m) + exp(c - m));
}

/* The label of extended position u; lab[s * stride] is l_s. */
RL_HD_INLINE int32_t rl_ctc_ext(const int32_t *lab, int64_t stride, int64_t u, int32_t blank) {
    return (u & 1) ? lab[(u >> 1) * stride] : blank;
}

/* skip(u) as an additive mask: 0 when allowed, RL_CTC_NEG when not (also for u >= U). */
RL_HD_INLINE float rl_ctc_skip_mask(const int32_t *lab, int64_t stride, int64_t u, int64_t U) {
    bool ok = (u & 1) && u >= 3 && u < U && lab[(u >> 1) * stride] != lab[((u >> 1) - 1) * stride];
    return ok ? 0.0f : RL_CTC_NEG;
}

/* alpha(t, u) from alpha(t-1, u), alpha(t-1, u-1), alpha(t-1, u-2), skip mask of u, lp(t, ext(u))
 */
RL_HD_INLINE float rl_ctc_alpha_f32(float a0, float a1, float a2, float skip, float em) {
    return rl_ctc_lse3f(a0, a1, a2 + skip) + em;
}
RL_HD_INLINE double rl_ctc_alpha_f64(double a0, double a1, double a2, double skip, double em) {
    return rl_ctc_lse3(a0, a1, a2 + skip) + em;
}

/* beta(t, u) from nb(u), nb(u+1), nb(u+2) and the skip mask of u+2 */
RL_HD_INLINE float rl_ctc_beta_f32(float n0, float n1, float n2, float skip2) {
    return rl_ctc_lse3f(n0, n1, n2 + skip2);
}
RL_HD_INLINE double rl_ctc_beta_f64(double n0, double n1, double n2, double skip2) {
    return rl_ctc_lse3(n0, n1, n2 + skip2);
}

/* The posterior of being at u at t: exp(alpha + beta - log P). A kernel that keeps its rows
 * relative to offsets (alpha = a + ca(t), beta = b + cb(t), for float32 precision on long
 * inputs) passes a, b and logp - ca(t) - cb(t). */
RL_HD_INLINE float rl_ctc_post_f32(float a, float b, float logp) { return rl_expf(a + b - logp); }
RL_HD_INLINE double rl_ctc_post_f64(double a, double b, double logp) { return exp(a + b - logp); }

/* log P from the last frame's alpha at U-1 and U-2 (U-2 may be the sentinel) */
RL_HD_INLINE float rl_ctc_logp_f32(float a, float b) {
    float m = a > b ? a : b;
    return m + rl_logf(rl_expf(a - m) + rl_expf(b - m));
}
RL_HD_INLINE double rl_ctc_logp_f64(double a, double b) {
    double m = a > b ? a : b;
    return m + log(exp(a - m) + exp(b - m));
}

#endif
