/* The CTC recurrences of one sequence on the CPU, written once for float32 and float64: a file
 * included by exactly one translation unit per element type (kernels/cpu/ctc_f32.c,
 * kernels/cpu/ctc_f64.c), each of which first declares, without any macro,
 *   typedef float|double ctc_real;
 *   static inline ctc_real ctc_exp(ctc_real), ctc_log(ctc_real)   the log-softmax's functions
 *   static inline ctc_real ctc_alpha(a0, a1, a2, skip, em), ctc_beta(n0, n1, n2, skip2),
 *                          ctc_post(a, b, off), ctc_logp(a, b),
 *                          ctc_floor(lp)                          kernels/ctc_step.h's formulas
 * float32 binds them to kernels/pointwise.h's vectorisable rl_expf / rl_logf, float64 to libm
 * (gradient checks). This file defines the static ctc_seq(job, b, scratch) (see
 * kernels/cpu/ctc_cpu.h) and its helpers.
 *
 * Per sequence, in the thread's scratch:
 *   ca    (T_b) double    the offsets of alpha's rows (below)
 *   lp    (T_b, V)        log-softmax of the valid frames
 *   alpha (T_b, U + 2)    two leading sentinel columns (RL_CTC_NEG) stand for u - 1, u - 2 < 0,
 *                         so every position runs the same branch-free formula (vectorised over u)
 *   lb, nb (U + 2)        the current row of beta and beta + emission of the next frame, with two
 *                         trailing sentinels for u + 1, u + 2 >= U; beta runs backward in one row
 *                         and the gradient of frame t is written as soon as beta(t) is known
 *   em (U + 2), skip (U + 2), gam (V), ext (U + 2) int32
 * Each row of alpha and of beta is kept relative to its maximum, the offsets summed in float64
 * (ca, cb): float32 then holds values of order 1-100 instead of the thousands a long sequence's
 * log-probabilities reach, and the posteriors keep float32 precision (float64 runs the same
 * steps; its rounding is far below what its gradient checks resolve). */
#include <math.h>
#include <string.h>

#include "../ctc_step.h"
#include "ctc_cpu.h"

#if defined(__GNUC__) && !defined(__clang__)
#define RL_CTC_VEC __attribute__((optimize("O3", "no-trapping-math")))
#else
#define RL_CTC_VEC
#endif

/* The maximum of x[0..n-1] (n >= 1); NaN entries are skipped (they propagate through the
 * recurrence anyway). Sixteen running maxima, element-wise selects that GCC vectorises (a
 * plain max reduction is not vectorised without -ffinite-math-only, and fmaxf is a libm call). */
RL_CTC_VEC static ctc_real ctc_row_max(const ctc_real *x, int64_t n) {
    ctc_real mm[16];
    for (int j = 0; j < 16; j++)
        mm[j] = x[0];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            mm[j] = x[i + j] > mm[j] ? x[i + j] : mm[j];
    ctc_real m = x[0];
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int j = 0; j < 16; j++)
        m = mm[j] > m ? mm[j] : m;
    return m;
}

/* out[i] = src[idx[i]]: the emissions lp(t, ext(u)) of one frame (AVX2/AVX-512 gathers). */
RL_CTC_VEC static void ctc_gather(ctc_real *restrict out, const ctc_real *restrict src,
                                  const int32_t *restrict idx, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = src[idx[i]];
}

RL_CTC_VEC static void ctc_seq(const rl_ctc_cpu_job *j, int64_t b, void *scratch) {
    const int64_t T = j->in_len[b], S = j->lab_len[b], U = 2 * S + 1, W = j->W, V = j->V;
    const int64_t BV = j->B * V;
    const int32_t *lab = j->labels + b * j->sb;
    const int32_t blank = j->blank;
    ctc_real *loss = (ctc_real *)j->loss;
    double *restrict ca = scratch;
    ctc_real *restrict lp = (ctc_real *)(ca + T);
    ctc_real *restrict alpha = lp + T * V;
    ctc_real *restrict lb = alpha + T * W;
    ctc_real *restrict nb = lb + W;
    ctc_real *restrict em = nb + W;
    ctc_real *restrict skip = em + W;
    ctc_real *restrict gam = skip + W;
    int32_t *restrict ext = (int32_t *)(gam + V);
    if (T == 0) { /* then S == 0 too (checked): the empty path, probability 1 */
        loss[b] = 0;
        rl_ctc_cpu_zero_rows(j, b, 0);
        return;
    }
    const ctc_real *x0 = (const ctc_real *)j->logits + b * V;
    for (int64_t t = 0; t < T; t++) {
        const ctc_real *x = x0 + t * BV;
        ctc_real *l = lp + t * V;
        ctc_real m = ctc_row_max(x, V);
        ctc_real s = 0;
        for (int64_t v = 0; v < V; v++)
            s += ctc_exp(x[v] - m);
        ctc_real ls = m + ctc_log(s);
        for (int64_t v = 0; v < V; v++)
            l[v] = ctc_floor(x[v] - ls);
    }
    for (int64_t u = 0; u < U; u++)
        ext[u] = rl_ctc_ext(lab, j->ss, u, blank);
    for (int64_t u = 0; u < W; u++)
        skip[u] = rl_ctc_skip_mask(lab, j->ss, u, U);

    ctc_real *a = alpha + 2;
    a[-2] = a[-1] = RL_CTC_NEG;
    for (int64_t u = 0; u < U; u++)
        a[u] = RL_CTC_NEG;
    a[0] = lp[blank];
    if (U > 1) a[1] = lp[ext[1]];
    ca[0] = a[0] > a[1] || U == 1 ? a[0] : a[1];
    /* Every alignment passes through some u at every frame: a row that is impossible everywhere
     * (a -inf logit where each needs it) makes the sequence impossible; taking out its maximum
     * as the offset would hide that. */
    if (ca[0] <= RL_CTC_IMPOSSIBLE) goto impossible;
    for (int64_t u = 0; u < U; u++)
        a[u] -= (ctc_real)ca[0];
    for (int64_t t = 1; t < T; t++) {
        const ctc_real *restrict prev = alpha + (t - 1) * W + 2;
        ctc_real *restrict cur = alpha + t * W + 2;
        const ctc_real *l = lp + t * V;
        cur[-2] = cur[-1] = RL_CTC_NEG;
        ctc_gather(em, l, ext, U);
        for (int64_t u = 0; u < U; u++)
            cur[u] = ctc_alpha(prev[u], prev[u - 1], prev[u - 2], skip[u], em[u]);
        ctc_real m = ctc_row_max(cur, U);
        if (m <= RL_CTC_IMPOSSIBLE) goto impossible;
        for (int64_t u = 0; u < U; u++)
            cur[u] -= m;
        ca[t] = ca[t - 1] + m;
    }
    const ctc_real *last = alpha + (T - 1) * W + 2;
    ctc_real logp_rel = ctc_logp(last[U - 1], last[U - 2]);
    if (logp_rel <= RL_CTC_IMPOSSIBLE) goto impossible;
    double logp = ca[T - 1] + logp_rel;
    loss[b] = (ctc_real)-logp;
    if (!j->grad) return;

    for (int64_t u = 0; u < W; u++)
        lb[u] = RL_CTC_NEG;
    lb[U - 1] = 0;
    if (U > 1) lb[U - 2] = 0;
    nb[U] = nb[U + 1] = RL_CTC_NEG;
    double cb = 0.0;
    ctc_real *g0 = (ctc_real *)j->grad + b * V;
    for (int64_t t = T - 1; t >= 0; t--) {
        const ctc_real *at = alpha + t * W + 2;
        const ctc_real *l = lp + t * V;
        const ctc_real off = (ctc_real)(logp - ca[t] - cb);
        for (int64_t u = 0; u < U; u++)
            em[u] = ctc_post(at[u], lb[u], off);
        for (int64_t v = 0; v < V; v++)
            gam[v] = 0;
        ctc_real gb = 0;
        for (int64_t u = 0; u < U; u += 2)
            gb += em[u];
        for (int64_t u = 1; u < U; u += 2)
            gam[ext[u]] += em[u];
        gam[blank] += gb;
        ctc_real *g = g0 + t * BV;
        for (int64_t v = 0; v < V; v++)
            g[v] = ctc_exp(l[v]) - gam[v];
        if (t == 0) break;
        ctc_gather(nb, l, ext, U);
        for (int64_t u = 0; u < U; u++)
            nb[u] += lb[u];
        for (int64_t u = 0; u < U; u++)
            lb[u] = ctc_beta(nb[u], nb[u + 1], nb[u + 2], skip[u + 2]);
        ctc_real m = ctc_row_max(lb, U);
        for (int64_t u = 0; u < U; u++)
            lb[u] -= m;
        cb += m;
    }
    rl_ctc_cpu_zero_rows(j, b, T);
    return;
impossible:
    loss[b] = j->zero_inf ? 0 : INFINITY;
    rl_ctc_cpu_zero_rows(j, b, 0);
}
