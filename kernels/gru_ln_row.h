/* The layer-normalised GRU's normalisation (layer_norm = true, kernels/gru.h) over one row of a
 * step: the row normalisations of kernels/pointwise.h (rl_ln_*) in one definition for the CPU
 * loops (kernels/cpu/gru.c, one row after the other) and the CUDA kernels (kernels/cuda/gru.cu,
 * one thread per row), before the fused forward of the cell and after its backward.
 *
 * Row b of a step with the buffers of rl_gru_ln_f32 (kernels/gru.h: xh, hh, dzh (B, 3H), dg (B,
 * 4H), rs (B, 6)) and g (B, 4H); valid: t < len[b]. Forward: g's row holds the input part in its
 * blocks r, z, n on entry and the normalised sums [ar | az | hn | an] (no biases) on return, hh's
 * the recurrent part on entry and its normalised blocks on return; a padded row zeros xh and hh,
 * which backward's sums over all rows read. Backward: g's row holds [dar | daz | dhn | dan] on
 * entry and the input part's gradients [dxr | dxz | 0 | dxn] on return, dzh's the recurrent
 * part's, dg a copy of the entry row; zeros in dg and dzh on a padded row (whose g is 0). */
#ifndef RL_GRU_LN_ROW_H
#define RL_GRU_LN_ROW_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/hd.h"
#include "gru.h"
#include "pointwise.h"

/* The row functions in one precision, REAL float (S f32) or double (S f64): one body for
 * both, the same formulas in the same order. */
#define RL_GRU_LN_ROW(REAL, S)                                                                     \
    RL_HD_INLINE void rl_gru_ln_row_fwd_##S(int64_t H, int64_t b, bool valid, REAL *g,             \
                                            const rl_gru_ln_##S *ln) {                             \
        REAL *gr = g + b * 4 * H, *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H;              \
        REAL *rs = ln->rs + b * 6;                                                                 \
        if (!valid) {                                                                              \
            for (int64_t e = 0; e < 3 * H; e++)                                                    \
                xh[e] = hh[e] = (REAL)0;                                                           \
            return;                                                                                \
        }                                                                                          \
        for (int k = 0; k < 3; k++) { /* the input part's blocks r, z, n are g's 0, 1, 3 */        \
            rs[k] = rl_ln_fwd_##S(H, gr + (k < 2 ? k : 3) * H, xh + k * H);                        \
            rs[3 + k] = rl_ln_fwd_##S(H, hh + k * H, hh + k * H);                                  \
        }                                                                                          \
        for (int64_t e = 0; e < 2 * H; e++)                                                        \
            gr[e] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e];                                         \
        for (int64_t j = 0; j < H; j++) {                                                          \
            gr[2 * H + j] = ln->gh[2 * H + j] * hh[2 * H + j];                                     \
            gr[3 * H + j] = ln->gx[2 * H + j] * xh[2 * H + j];                                     \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    RL_HD_INLINE void rl_gru_ln_row_bwd_##S(int64_t H, int64_t b, bool valid, REAL *g,             \
                                            const rl_gru_ln_##S *ln) {                             \
        REAL *gr = g + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 3 * H;            \
        if (!valid) {                                                                              \
            for (int64_t e = 0; e < 4 * H; e++)                                                    \
                dg[e] = (REAL)0;                                                                   \
            for (int64_t e = 0; e < 3 * H; e++)                                                    \
                dzh[e] = (REAL)0;                                                                  \
            return;                                                                                \
        }                                                                                          \
        const REAL *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H, *rs = ln->rs + b * 6;       \
        for (int64_t e = 0; e < 4 * H; e++)                                                        \
            dg[e] = gr[e];                                                                         \
        for (int k = 0; k < 3; k++) {                                                              \
            int64_t gx = (k < 2 ? k : 3) * H; /* dar, daz, dan: g's blocks 0, 1, 3 */              \
            rl_ln_bwd_##S(H, xh + k * H, rs[k], dg + gx, ln->gx + k * H, gr + gx);                 \
            rl_ln_bwd_##S(H, hh + k * H, rs[3 + k], dg + k * H, ln->gh + k * H, dzh + k * H);      \
        }                                                                                          \
        for (int64_t j = 0; j < H; j++)                                                            \
            gr[2 * H + j] = (REAL)0;                                                               \
    }

RL_GRU_LN_ROW(float, f32)
RL_GRU_LN_ROW(double, f64)

#endif
