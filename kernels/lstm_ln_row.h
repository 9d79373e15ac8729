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

RL_HD_INLINE void rl_lstm_ln_row_fwd_f32(int64_t H, int64_t b, bool valid, float *z,
                                         const float *bias, const float *cp, const float *hp,
                                         float *c, float *h, float *out, const rl_lstm_ln_f32 *ln) {
    float *zr = z + b * 4 * H, *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H;
    float *cn = ln->cn + b * H, *rs = ln->rs + b * 9;
    float *cr = c + b * H, *hr = h + b * H, *outr = out + b * H;
    const float *cpr = cp + b * H;
    if (!valid) { /* zeros where backward's sums over all rows read */
        for (int64_t j = 0; j < H; j++) {
            cr[j] = cpr[j];
            hr[j] = hp[b * H + j];
            outr[j] = cn[j] = 0.0f;
        }
        for (int64_t j = 0; j < 4 * H; j++)
            xh[j] = hh[j] = 0.0f;
        return;
    }
    for (int k = 0; k < 4; k++) {
        rs[k] = rl_ln_fwd_f32(H, zr + k * H, xh + k * H);
        rs[4 + k] = rl_ln_fwd_f32(H, hh + k * H, hh + k * H);
    }
    for (int64_t j = 0; j < H; j++) {
        float a[4], unused;
        for (int k = 0; k < 4; k++) {
            int64_t e = k * H + j;
            a[k] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e] + bias[e];
        }
        rl_lstm_cell_fwd_f32(a[0], a[1], a[2], a[3], cpr[j], 0.0f, 0.0f, 0.0f, &zr[j], &zr[H + j],
                             &zr[2 * H + j], &zr[3 * H + j], &cr[j], &unused);
    }
    rs[8] = rl_ln_fwd_f32(H, cr, cn);
    for (int64_t j = 0; j < H; j++) {
        hr[j] = rl_lstm_ln_h_f32(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j]);
        outr[j] = hr[j];
    }
}

RL_HD_INLINE void rl_lstm_ln_row_bwd_f32(int64_t H, int64_t b, bool valid, float *z,
                                         const float *cp, const float *c, const float *dout,
                                         float *dh, float *dc, const rl_lstm_ln_f32 *ln) {
    float *zr = z + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 4 * H;
    float *du = ln->du + b * H;
    if (!valid) {
        for (int64_t j = 0; j < 4 * H; j++)
            zr[j] = dg[j] = dzh[j] = 0.0f;
        for (int64_t j = 0; j < H; j++)
            du[j] = 0.0f;
        return;
    }
    const float *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H, *cn = ln->cn + b * H;
    const float *rs = ln->rs + b * 9, *cpr = cp + b * H, *cr = c + b * H;
    float *dhr = dh + b * H, *dcr = dc + b * H;
    /* h's part: dzo and du; dg's first block holds the cell's gradient from h meanwhile */
    for (int64_t j = 0; j < H; j++) {
        float dhj = dhr[j] + (dout ? dout[j] : 0.0f);
        rl_lstm_ln_h_bwd_f32(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j], dhj, &dg[3 * H + j],
                             &du[j]);
        dhr[j] = 0.0f;
    }
    rl_ln_bwd_f32(H, cn, rs[8], du, ln->gc, dg);
    for (int64_t j = 0; j < H; j++) {
        float dzo;
        rl_lstm_cell_bwd_f32(zr[j], zr[H + j], zr[2 * H + j], zr[3 * H + j], cpr[j], cr[j], 0.0f,
                             0.0f, 0.0f, 0.0f, dcr[j] + dg[j], &dg[j], &dg[H + j], &dg[2 * H + j],
                             &dzo, &dcr[j]);
    }
    for (int k = 0; k < 4; k++) {
        rl_ln_bwd_f32(H, xh + k * H, rs[k], dg + k * H, ln->gx + k * H, zr + k * H);
        rl_ln_bwd_f32(H, hh + k * H, rs[4 + k], dg + k * H, ln->gh + k * H, dzh + k * H);
    }
}

RL_HD_INLINE void rl_lstm_ln_row_fwd_f64(int64_t H, int64_t b, bool valid, double *z,
                                         const double *bias, const double *cp, const double *hp,
                                         double *c, double *h, double *out,
                                         const rl_lstm_ln_f64 *ln) {
    double *zr = z + b * 4 * H, *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H;
    double *cn = ln->cn + b * H, *rs = ln->rs + b * 9;
    double *cr = c + b * H, *hr = h + b * H, *outr = out + b * H;
    const double *cpr = cp + b * H;
    if (!valid) { /* zeros where backward's sums over all rows read */
        for (int64_t j = 0; j < H; j++) {
            cr[j] = cpr[j];
            hr[j] = hp[b * H + j];
            outr[j] = cn[j] = 0.0;
        }
        for (int64_t j = 0; j < 4 * H; j++)
            xh[j] = hh[j] = 0.0;
        return;
    }
    for (int k = 0; k < 4; k++) {
        rs[k] = rl_ln_fwd_f64(H, zr + k * H, xh + k * H);
        rs[4 + k] = rl_ln_fwd_f64(H, hh + k * H, hh + k * H);
    }
    for (int64_t j = 0; j < H; j++) {
        double a[4], unused;
        for (int k = 0; k < 4; k++) {
            int64_t e = k * H + j;
            a[k] = ln->gx[e] * xh[e] + ln->gh[e] * hh[e] + bias[e];
        }
        rl_lstm_cell_fwd_f64(a[0], a[1], a[2], a[3], cpr[j], 0.0, 0.0, 0.0, &zr[j], &zr[H + j],
                             &zr[2 * H + j], &zr[3 * H + j], &cr[j], &unused);
    }
    rs[8] = rl_ln_fwd_f64(H, cr, cn);
    for (int64_t j = 0; j < H; j++) {
        hr[j] = rl_lstm_ln_h_f64(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j]);
        outr[j] = hr[j];
    }
}

RL_HD_INLINE void rl_lstm_ln_row_bwd_f64(int64_t H, int64_t b, bool valid, double *z,
                                         const double *cp, const double *c, const double *dout,
                                         double *dh, double *dc, const rl_lstm_ln_f64 *ln) {
    double *zr = z + b * 4 * H, *dg = ln->dg + b * 4 * H, *dzh = ln->dzh + b * 4 * H;
    double *du = ln->du + b * H;
    if (!valid) {
        for (int64_t j = 0; j < 4 * H; j++)
            zr[j] = dg[j] = dzh[j] = 0.0;
        for (int64_t j = 0; j < H; j++)
            du[j] = 0.0;
        return;
    }
    const double *xh = ln->xh + b * 4 * H, *hh = ln->hh + b * 4 * H, *cn = ln->cn + b * H;
    const double *rs = ln->rs + b * 9, *cpr = cp + b * H, *cr = c + b * H;
    double *dhr = dh + b * H, *dcr = dc + b * H;
    /* h's part: dzo and du; dg's first block holds the cell's gradient from h meanwhile */
    for (int64_t j = 0; j < H; j++) {
        double dhj = dhr[j] + (dout ? dout[j] : 0.0);
        rl_lstm_ln_h_bwd_f64(zr[3 * H + j], ln->gc[j] * cn[j] + ln->bc[j], dhj, &dg[3 * H + j],
                             &du[j]);
        dhr[j] = 0.0;
    }
    rl_ln_bwd_f64(H, cn, rs[8], du, ln->gc, dg);
    for (int64_t j = 0; j < H; j++) {
        double dzo;
        rl_lstm_cell_bwd_f64(zr[j], zr[H + j], zr[2 * H + j], zr[3 * H + j], cpr[j], cr[j], 0.0,
                             0.0, 0.0, 0.0, dcr[j] + dg[j], &dg[j], &dg[H + j], &dg[2 * H + j],
                             &dzo, &dcr[j]);
    }
    for (int k = 0; k < 4; k++) {
        rl_ln_bwd_f64(H, xh + k * H, rs[k], dg + k * H, ln->gx + k * H, zr + k * H);
        rl_ln_bwd_f64(H, hh + k * H, rs[4 + k], dg + k * H, ln->gh + k * H, dzh + k * H);
    }
}

#endif
