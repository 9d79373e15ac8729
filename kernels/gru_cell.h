/* The GRU cell, one element of one step: forward and backward formulas shared by the CPU loops
 * (kernels/cpu/gru.c) and the CUDA kernels (kernels/cuda/gru.cu), float32 and float64.
 *
 * The cuDNN / PyTorch formulation (gates r, z, n), with the pre-activations already summed by
 * the caller:
 *   ar = W_ir x + b_ir + W_hr h_prev + b_hr      az = likewise for z
 *   an = W_in x + b_in                           hn = W_hn h_prev + b_hn
 *   r = sigmoid(ar)   z = sigmoid(az)   n = tanh(an + r * hn)   h = (1 - z) n + z h_prev
 * hn is kept apart from an because r multiplies it (and its bias b_hn) only.
 * Backward, given dh (dLoss/dh_t, from the output and from the next step's recurrent product),
 * writes the gradients of the four pre-activations and the direct part of dLoss/dh_prev (the
 * caller adds [dar, daz, dhn] U^T for the part through the recurrent product):
 *   dan = dh (1 - z) (1 - n^2)   dhn = dan r   dar = dan hn r (1 - r)
 *   daz = dh (h_prev - n) z (1 - z)   dhp = dh z
 *
 * The activations are kernels/pointwise.h's (float32: branch-free, so the CPU loops vectorise,
 * and the same numbers on every device; float64: libm, so the gradient checks see exact
 * derivatives).
 */
#ifndef RL_GRU_CELL_H
#define RL_GRU_CELL_H

#include <math.h>

#include "../core/hd.h"
#include "pointwise.h"

RL_HD_INLINE void rl_gru_cell_fwd_f32(float ar, float az, float an, float hn, float hp, float *r,
                                      float *z, float *n, float *h) {
    float rr = rl_sigmoidf(ar);
    float zz = rl_sigmoidf(az);
    float nn = rl_tanhf(an + rr * hn);
    *r = rr;
    *z = zz;
    *n = nn;
    *h = nn + zz * (hp - nn);
}

RL_HD_INLINE void rl_gru_cell_fwd_f64(double ar, double az, double an, double hn, double hp,
                                      double *r, double *z, double *n, double *h) {
    double rr = rl_sigmoid(ar);
    double zz = rl_sigmoid(az);
    double nn = tanh(an + rr * hn);
    *r = rr;
    *z = zz;
    *n = nn;
    *h = nn + zz * (hp - nn);
}

RL_HD_INLINE void rl_gru_cell_bwd_f32(float r, float z, float n, float hn, float hp, float dh,
                                      float *dar, float *daz, float *dan, float *dhn, float *dhp) {
    float a = dh * (1.0f - z) * (1.0f - n * n);
    *dan = a;
    *dhn = a * r;
    *dar = a * hn * r * (1.0f - r);
    *daz = dh * (hp - n) * z * (1.0f - z);
    *dhp = dh * z;
}

RL_HD_INLINE void rl_gru_cell_bwd_f64(double r, double z, double n, double hn, double hp, double dh,
                                      double *dar, double *daz, double *dan, double *dhn,
                                      double *dhp) {
    double a = dh * (1.0 - z) * (1.0 - n * n);
    *dan = a;
    *dhn = a * r;
    *dar = a * hn * r * (1.0 - r);
    *daz = dh * (hp - n) * z * (1.0 - z);
    *dhp = dh * z;
}

#endif
