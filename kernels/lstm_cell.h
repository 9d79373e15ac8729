/* The LSTM cell, one element of one step: forward and backward formulas shared by the CPU
 * loops (kernels/cpu/lstm.c) and the CUDA kernels, float32 and float64.
 *
 * Pre-activations z (input projection + recurrent projection + bias), previous cell cp,
 * peephole weights pi, pf, po (0 without peepholes):
 *   i = sigmoid(zi + pi * cp)    f = sigmoid(zf + pf * cp)    g = tanh(zg)
 *   c = f * cp + i * g           o = sigmoid(zo + po * c)     h = o * tanh(c)
 * Backward, given dh (dLoss/dh_t, from the output and from the next step's recurrent
 * projection) and dc (dLoss/dc_t from the next step), writes the pre-activation gradients
 * dz and the gradient of the previous cell:
 *   dzo = dh * tanh(c) * o (1 - o)
 *   dc' = dc + dh * o * (1 - tanh(c)^2) + dzo * po
 *   dzi = dc' * g * i (1 - i)    dzf = dc' * cp * f (1 - f)    dzg = dc' * i * (1 - g^2)
 *   dcp = dc' * f + dzi * pi + dzf * pf
 * tanh(c) is recomputed in backward rather than stored.
 *
 * The activations are kernels/pointwise.h's (float32: branch-free, so the CPU loops
 * vectorise, and the same numbers on every device; float64: libm, so the gradient checks see
 * exact derivatives).
 */
#ifndef RL_LSTM_CELL_H
#define RL_LSTM_CELL_H

#include <math.h>

#include "../core/hd.h"
#include "pointwise.h"

RL_HD_INLINE void rl_lstm_cell_fwd_f32(float zi, float zf, float zg, float zo, float cp, float pi,
                                       float pf, float po, float *i, float *f, float *g, float *o,
                                       float *c, float *h) {
    float ii = rl_sigmoidf(zi + pi * cp);
    float ff = rl_sigmoidf(zf + pf * cp);
    float gg = rl_tanhf(zg);
    float cc = ff * cp + ii * gg;
    float oo = rl_sigmoidf(zo + po * cc);
    *i = ii;
    *f = ff;
    *g = gg;
    *o = oo;
    *c = cc;
    *h = oo * rl_tanhf(cc);
}

RL_HD_INLINE void rl_lstm_cell_fwd_f64(double zi, double zf, double zg, double zo, double cp,
                                       double pi, double pf, double po, double *i, double *f,
                                       double *g, double *o, double *c, double *h) {
    double ii = rl_sigmoid(zi + pi * cp);
    double ff = rl_sigmoid(zf + pf * cp);
    double gg = tanh(zg);
    double cc = ff * cp + ii * gg;
    double oo = rl_sigmoid(zo + po * cc);
    *i = ii;
    *f = ff;
    *g = gg;
    *o = oo;
    *c = cc;
    *h = oo * tanh(cc);
}

RL_HD_INLINE void rl_lstm_cell_bwd_f32(float i, float f, float g, float o, float cp, float c,
                                       float pi, float pf, float po, float dh, float dc, float *dzi,
                                       float *dzf, float *dzg, float *dzo, float *dcp) {
    float tc = rl_tanhf(c);
    float zo = dh * tc * o * (1.0f - o);
    float dct = dc + dh * o * (1.0f - tc * tc) + zo * po;
    float zi = dct * g * i * (1.0f - i);
    float zf = dct * cp * f * (1.0f - f);
    *dzi = zi;
    *dzf = zf;
    *dzg = dct * i * (1.0f - g * g);
    *dzo = zo;
    *dcp = dct * f + zi * pi + zf * pf;
}

RL_HD_INLINE void rl_lstm_cell_bwd_f64(double i, double f, double g, double o, double cp, double c,
                                       double pi, double pf, double po, double dh, double dc,
                                       double *dzi, double *dzf, double *dzg, double *dzo,
                                       double *dcp) {
    double tc = tanh(c);
    double zo = dh * tc * o * (1.0 - o);
    double dct = dc + dh * o * (1.0 - tc * tc) + zo * po;
    double zi = dct * g * i * (1.0 - i);
    double zf = dct * cp * f * (1.0 - f);
    *dzi = zi;
    *dzf = zf;
    *dzg = dct * i * (1.0 - g * g);
    *dzo = zo;
    *dcp = dct * f + zi * pi + zf * pf;
}

/* The layer-normalised cell's output h = o tanh(u), u = g_c chat + b_c the normalised cell,
 * and its backward: dzo (o's pre-activation) and du from dh. The gates and the cell
 * c = f cp + i g are the plain cell's (rl_lstm_cell_fwd without peepholes; its backward with
 * dh = 0 and dc the cell's whole gradient gives dzi, dzf, dzg, dcp). */
RL_HD_INLINE float rl_lstm_ln_h_f32(float o, float u) { return o * rl_tanhf(u); }
RL_HD_INLINE double rl_lstm_ln_h_f64(double o, double u) { return o * tanh(u); }

RL_HD_INLINE void rl_lstm_ln_h_bwd_f32(float o, float u, float dh, float *dzo, float *du) {
    float tu = rl_tanhf(u);
    *dzo = dh * tu * o * (1.0f - o);
    *du = dh * o * (1.0f - tu * tu);
}

RL_HD_INLINE void rl_lstm_ln_h_bwd_f64(double o, double u, double dh, double *dzo, double *du) {
    double tu = tanh(u);
    *dzo = dh * tu * o * (1.0 - o);
    *du = dh * o * (1.0 - tu * tu);
}

#endif
