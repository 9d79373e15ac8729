/* The layer-normalised LSTM cell (layer_norm = true, kernels/lstm.h) over one row of a step: the
 * formulas of kernels/lstm_cell.h and the row normalisations of kernels/pointwise.h (rl_ln_*), in
 * one definition for the CPU loops (kernels/cpu/lstm.c, one row after the other) and the CUDA
 * kernels (kernels/cuda/lstm.cu, one thread per row).
 *
 * Row b of a step with the buffers of rl_lstm_ln_f32 (kernels/lstm.h: xh, hh, dg, dzh (B, 4H),
 * cn, du (B, H), rs (B, 9)), z (B, 4H), the states (B, H) and dout (NULL, or row b's dLoss/dout);
 * valid: t < len[b]. Forward: z's row holds the input part x W on entry and the activations on
 * return, hh's the recurrent part h_prev U on entry and its normalised blocks on return; a padded
 * row carries the states, outputs 0 and zeros xh, hh and cn, which backward's sums over all rows
 * read. Backward: z's row holds the activations on entry and the input part's gradients on return,
 * dzh's the recurrent part's; dg (the gates' pre-activation gradients) and du (the normalised
 * cell's); zeros on a padded row, whose dh and dc pass through; dh = 0 on a valid one (h_prev
 * reaches the loss only through the recurrent product), dc the direct part. */
#ifndef RL_LSTM_LN_ROW_H
#define RL_LSTM_LN_ROW_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/hd.h"
#include "lstm.h"
#include "lstm_cell.h"

/* The row functions in one precision, REAL float (S f32) or double (S f64): one body for
 * both, the same formulas in the same order. */
#define RL_LSTM_LN_ROW(REAL, S)                                                                    \
    RL_HD_INLINE void rl_lstm_ln_row_fwd_##S(                                                      \
        int64_t H, int64_t b, bool valid, REAL *z, const REAL *bias, const REAL *cp,               \
        const REAL *hp, REAL *c, REAL *h, REAL *out, const rl_lstm_ln_##S *ln) {                   \
        REAL *zr = z + b * 4 * H, *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H;              \
        REAL *cn = ln->cn + b * H, *rs = ln->rs + b * 9;                                           \
        REAL *cr = c + b * H, *hr = h + b * H, *outr = out + b * H;                                \
        const REAL *cpr = cp + b * H;                                                              \
        if (!valid) { /* zeros where backward's sums over all rows read */                         \
            for (int64_t j = 0; j < H; j++) {                                                      \
                cr[j] = cpr[j];                                                                    \
                hr[j] = hp[b * H + j];                                                             \
                outr[j] = cn[j] = (REAL)0;                                                         \
            }                                                                                      \
            for (int64_t j = 0; j < 4 * H; j++)                                                    \
                xh[j] = hh[j] = (REAL)0;                                                           \
            return;                                                                                \
        }                                                                                          \
        for (int k = 0; k < 4; k++) {                                                              \
            rs[k] = rl_ln_fwd_##S(H, zr + k * H, xh + k * H);                                      \
            rs[4 + k] = rl_ln_fwd_##S(H, hh + k * H, hh + k * H);                                  \
        }                                                                                          \
        for (int64_t j = 0; j < H; j++) {                                                          \
            REAL a[4], unused;                                                                     \
            for (int k = 0; k < 4; k++) {                                                          \
                int64_t e = k * H + j;                                                             \
                a[k] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e] + bias[e];                            \
            }                                                                                      \
            rl_lstm_cell_fwd_##S(a[0], a[1], a[2], a[3], cpr[j], (REAL)0, (REAL)0, (REAL)0,        \
                                 &zr[j], &zr[H + j], &zr[2 * H + j], &zr[3 * H + j], &cr[j],       \
                                 &unused);                                                         \
        }                                                                                          \
        rs[8] = rl_ln_fwd_##S(H, cr, cn);                                                          \
        for (int64_t j = 0; j < H; j++) {                                                          \
            hr[j] = rl_lstm_ln_h_##S(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j]);                \
            outr[j] = hr[j];                                                                       \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    RL_HD_INLINE void rl_lstm_ln_row_bwd_##S(int64_t H, int64_t b, bool valid, REAL *z,            \
                                             const REAL *cp, const REAL *c, const REAL *dout,      \
                                             REAL *dh, REAL *dc, const rl_lstm_ln_##S *ln) {       \
        REAL *zr = z + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 4 * H;            \
        REAL *du = ln->du + b * H;                                                                 \
        if (!valid) {                                                                              \
            for (int64_t j = 0; j < 4 * H; j++)                                                    \
                zr[j] = dg[j] = dzh[j] = (REAL)0;                                                  \
            for (int64_t j = 0; j < H; j++)                                                        \
                du[j] = (REAL)0;                                                                   \
            return;                                                                                \
        }                                                                                          \
        const REAL *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H, *cn = ln->cn + b * H;       \
        const REAL *rs = ln->rs + b * 9, *cpr = cp + b * H, *cr = c + b * H;                       \
        REAL *dhr = dh + b * H, *dcr = dc + b * H;                                                 \
        /* h's part: dzo and du; dg's first block holds the cell's gradient from h meanwhile */    \
        for (int64_t j = 0; j < H; j++) {                                                          \
            REAL dhj = dhr[j] + (dout ? dout[j] : (REAL)0);                                        \
            rl_lstm_ln_h_bwd_##S(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j], dhj,                \
                                 &dg[3 * H + j], &du[j]);                                          \
            dhr[j] = (REAL)0;                                                                      \
        }                                                                                          \
        rl_ln_bwd_##S(H, cn, rs[8], du, ln->gc, dg);                                               \
        for (int64_t j = 0; j < H; j++) {                                                          \
            REAL dzo;                                                                              \
            rl_lstm_cell_bwd_##S(zr[j], zr[H + j], zr[2 * H + j], zr[3 * H + j], cpr[j], cr[j],    \
                                 (REAL)0, (REAL)0, (REAL)0, (REAL)0, dcr[j] + dg[j], &dg[j],       \
                                 &dg[H + j], &dg[2 * H + j], &dzo, &dcr[j]);                       \
        }                                                                                          \
        for (int k = 0; k < 4; k++) {                                                              \
            rl_ln_bwd_##S(H, xh + k * H, rs[k], dg + k * H, ln->gx + k * H, zr + k * H);           \
            rl_ln_bwd_##S(H, hh + k * H, rs[4 + k], dg + k * H, ln->gh + k * H, dzh + k * H);      \
        }                                                                                          \
    }

RL_LSTM_LN_ROW(float, f32)
RL_LSTM_LN_ROW(double, f64)

#endif
