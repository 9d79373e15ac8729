/* The janet cell (layers/janet.c), one element of one step: forward and backward formulas shared
 * by the CPU loops (kernels/cpu/janet.c) and the CUDA kernels (kernels/cuda/janet.cu), float32
 * and float64.
 *
 * With the pre-activations summed by the caller (s = x W_f + h_prev U_f + b_f, a = x W_c +
 * h_prev U_c + b_c) and beta the input gate's shift:
 *   f = sigmoid(s)   i = 1 - sigmoid(s - beta)   c~ = tanh(a)   h = f h_prev + i c~
 * Backward, given dh (dLoss/dh_t from the output and the next step's recurrent product), the
 * gradients of the two pre-activations and the direct part of dLoss/dh_prev (the caller adds
 * [ds, da] U^T for the part through the recurrent product):
 *   ds = dh (h_prev f (1 - f) - c~ i (1 - i))   da = dh i (1 - c~^2)   dhp = dh f
 * (d i / d s = -i (1 - i)). The activations are kernels/pointwise.h's (float32: branch-free, so the
 * CPU loops vectorise, and the same numbers on every device; float64: libm, for the gradient
 * checks). */
#ifndef RL_JANET_CELL_H
#define RL_JANET_CELL_H

#include <math.h>

#include "../core/hd.h"
#include "pointwise.h"

RL_HD_INLINE void rl_janet_cell_fwd_f32(float s, float a, float hp, float beta, float *f, float *c,
                                        float *i, float *h) {
    float ff = rl_sigmoidf(s), ii = 1.0f - rl_sigmoidf(s - beta), cc = rl_tanhf(a);
    *f = ff;
    *c = cc;
    *i = ii;
    *h = ff * hp + ii * cc;
}

RL_HD_INLINE void rl_janet_cell_fwd_f64(double s, double a, double hp, double beta, double *f,
                                        double *c, double *i, double *h) {
    double ff = rl_sigmoid(s), ii = 1.0 - rl_sigmoid(s - beta), cc = tanh(a);
    *f = ff;
    *c = cc;
    *i = ii;
    *h = ff * hp + ii * cc;
}

RL_HD_INLINE void rl_janet_cell_bwd_f32(float f, float c, float i, float hp, float dh, float *ds,
                                        float *da, float *dhp) {
    *ds = dh * (hp * rl_dsigmoidf(f) - c * rl_dsigmoidf(i));
    *da = dh * i * rl_dtanhf(c);
    *dhp = dh * f;
}

RL_HD_INLINE void rl_janet_cell_bwd_f64(double f, double c, double i, double hp, double dh,
                                        double *ds, double *da, double *dhp) {
    *ds = dh * (hp * rl_dsigmoid(f) - c * rl_dsigmoid(i));
    *da = dh * i * rl_dtanh(c);
    *dhp = dh * f;
}

#endif
