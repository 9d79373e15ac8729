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

RL_HD_INLINE void rl_gru_ln_row_fwd_f32(int64_t H, int64_t b, bool valid, float *g,
                                        const rl_gru_ln_f32 *ln) {
    float *gr = g + b * 4 * H, *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H;
    float *rs = ln->rs + b * 6;
    if (!valid) {
        for (int64_t e = 0; e < 3 * H; e++)
            xh[e] = hh[e] = 0.0f;
        return;
    }
    for (int k = 0; k < 3; k++) { /* the input part's blocks r, z, n are g's 0, 1, 3 */
        rs[k] = rl_ln_fwd_f32(H, gr + (k < 2 ? k : 3) * H, xh + k * H);
        rs[3 + k] = rl_ln_fwd_f32(H, hh + k * H, hh + k * H);
    }
    for (int64_t e = 0; e < 2 * H; e++)
        gr[e] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e];
    for (int64_t j = 0; j < H; j++) {
        gr[2 * H + j] = ln->gh[2 * H + j] * hh[2 * H + j];
        gr[3 * H + j] = ln->gx[2 * H + j] * xh[2 * H + j];
    }
}

RL_HD_INLINE void rl_gru_ln_row_bwd_f32(int64_t H, int64_t b, bool valid, float *g,
                                        const rl_gru_ln_f32 *ln) {
    float *gr = g + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 3 * H;
    if (!valid) {
        for (int64_t e = 0; e < 4 * H; e++)
            dg[e] = 0.0f;
        for (int64_t e = 0; e < 3 * H; e++)
            dzh[e] = 0.0f;
        return;
    }
    const float *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H, *rs = ln->rs + b * 6;
    for (int64_t e = 0; e < 4 * H; e++)
        dg[e] = gr[e];
    for (int k = 0; k < 3; k++) {
        int64_t gx = (k < 2 ? k : 3) * H; /* dar, daz, dan: g's blocks 0, 1, 3 */
        rl_ln_bwd_f32(H, xh + k * H, rs[k], dg + gx, ln->gx + k * H, gr + gx);
        rl_ln_bwd_f32(H, hh + k * H, rs[3 + k], dg + k * H, ln->gh + k * H, dzh + k * H);
    }
    for (int64_t j = 0; j < H; j++)
        gr[2 * H + j] = 0.0f;
}

RL_HD_INLINE void rl_gru_ln_row_fwd_f64(int64_t H, int64_t b, bool valid, double *g,
                                        const rl_gru_ln_f64 *ln) {
    double *gr = g + b * 4 * H, *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H;
    double *rs = ln->rs + b * 6;
    if (!valid) {
        for (int64_t e = 0; e < 3 * H; e++)
            xh[e] = hh[e] = 0.0;
        return;
    }
    for (int k = 0; k < 3; k++) { /* the input part's blocks r, z, n are g's 0, 1, 3 */
        rs[k] = rl_ln_fwd_f64(H, gr + (k < 2 ? k : 3) * H, xh + k * H);
        rs[3 + k] = rl_ln_fwd_f64(H, hh + k * H, hh + k * H);
    }
    for (int64_t e = 0; e < 2 * H; e++)
        gr[e] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e];
    for (int64_t j = 0; j < H; j++) {
        gr[2 * H + j] = ln->gh[2 * H + j] * hh[2 * H + j];
        gr[3 * H + j] = ln->gx[2 * H + j] * xh[2 * H + j];
    }
}

RL_HD_INLINE void rl_gru_ln_row_bwd_f64(int64_t H, int64_t b, bool valid, double *g,
                                        const rl_gru_ln_f64 *ln) {
    double *gr = g + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 3 * H;
    if (!valid) {
        for (int64_t e = 0; e < 4 * H; e++)
            dg[e] = 0.0;
        for (int64_t e = 0; e < 3 * H; e++)
            dzh[e] = 0.0;
        return;
    }
    const double *xh = ln->xh + b * 3 * H, *hh = ln->hh + b * 3 * H, *rs = ln->rs + b * 6;
    for (int64_t e = 0; e < 4 * H; e++)
        dg[e] = gr[e];
    for (int k = 0; k < 3; k++) {
        int64_t gx = (k < 2 ? k : 3) * H; /* dar, daz, dan: g's blocks 0, 1, 3 */
        rl_ln_bwd_f64(H, xh + k * H, rs[k], dg + gx, ln->gx + k * H, gr + gx);
        rl_ln_bwd_f64(H, hh + k * H, rs[3 + k], dg + k * H, ln->gh + k * H, dzh + k * H);
    }
    for (int64_t j = 0; j < H; j++)
        gr[2 * H + j] = 0.0;
}

#endif
