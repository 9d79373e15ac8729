/* The two-dimensional LSTM cell (MDLSTM), one element of one cell: forward and backward
 * formulas shared by the CPU loops (kernels/cpu/mdlstm.c) and the CUDA kernels, float32 and
 * float64.
 *
 * A cell has two predecessors in its direction's scan order, "up" (y-1, x) and "left"
 * (y, x-1), with cells cu, cl (0 when the predecessor lies outside the image). Five gate
 * pre-activations z1..z5 (input projection + both recurrent projections + bias) in the order
 * i, a, b, g, o:
 *   standard (Graves et al. 2007, one forget gate per dimension):
 *     i = sigmoid(z1)  fu = sigmoid(z2)  fl = sigmoid(z3)  g = tanh(z4)  o = sigmoid(z5)
 *     c = fu * cu + fl * cl + i * g
 *   stable (Leifert et al. 2016, "Cells in multidimensional recurrent neural networks", JMLR
 *   17; the stable cell with a lambda gate that forms a convex combination of the two
 *   predecessor cells, so that |c| stays bounded like in the 1-D LSTM):
 *     i = sigmoid(z1)  f = sigmoid(z2)  lam = sigmoid(z3)  g = tanh(z4)  o = sigmoid(z5)
 *     c = f * (lam * cu + (1 - lam) * cl) + i * g
 *   both: h = o * tanh(c)
 * Backward, given dh (dLoss/dh of this cell: output and both successors' recurrent
 * projections) and dc (dLoss/dc from both successors), writes the pre-activation gradients
 * and what this cell passes to each predecessor's cell gradient:
 *   dc' = dc + dh * o * (1 - tanh(c)^2)       dz5 = dh * tanh(c) * o (1 - o)
 *   dz1 = dc' * g * i (1 - i)                 dz4 = dc' * i * (1 - g^2)
 *   standard: dz2 = dc' * cu * fu (1 - fu)    dz3 = dc' * cl * fl (1 - fl)
 *             dcu = dc' * fu                  dcl = dc' * fl
 *   stable:   m = lam * cu + (1 - lam) * cl
 *             dz2 = dc' * m * f (1 - f)       dz3 = dc' * f * (cu - cl) * lam (1 - lam)
 *             dcu = dc' * f * lam             dcl = dc' * f * (1 - lam)
 * tanh(c) is recomputed in backward rather than stored. Activations: kernels/pointwise.h's
 * (float32 branch-free, float64 libm), as in kernels/lstm_cell.h.
 */
#ifndef RL_MDLSTM_CELL_H
#define RL_MDLSTM_CELL_H

#include <math.h>
#include <stdbool.h>

#include "../core/hd.h"
#include "pointwise.h"

/* z[0..4]: pre-activations in; gate activations out (i, a, b, g, o). */
RL_HD_INLINE void rl_mdlstm_cell_fwd_f32(bool stable, float *z1, float *z2, float *z3, float *z4,
                                         float *z5, float cu, float cl, float *c, float *h) {
    float i = rl_sigmoidf(*z1), a = rl_sigmoidf(*z2), b = rl_sigmoidf(*z3);
    float g = rl_tanhf(*z4), o = rl_sigmoidf(*z5);
    float cc = stable ? a * (b * cu + (1.0f - b) * cl) + i * g : a * cu + b * cl + i * g;
    *z1 = i;
    *z2 = a;
    *z3 = b;
    *z4 = g;
    *z5 = o;
    *c = cc;
    *h = o * rl_tanhf(cc);
}

RL_HD_INLINE void rl_mdlstm_cell_fwd_f64(bool stable, double *z1, double *z2, double *z3,
                                         double *z4, double *z5, double cu, double cl, double *c,
                                         double *h) {
    double i = rl_sigmoid(*z1), a = rl_sigmoid(*z2), b = rl_sigmoid(*z3);
    double g = tanh(*z4), o = rl_sigmoid(*z5);
    double cc = stable ? a * (b * cu + (1.0 - b) * cl) + i * g : a * cu + b * cl + i * g;
    *z1 = i;
    *z2 = a;
    *z3 = b;
    *z4 = g;
    *z5 = o;
    *c = cc;
    *h = o * tanh(cc);
}

/* z[0..4]: gate activations in; pre-activation gradients out. */
RL_HD_INLINE void rl_mdlstm_cell_bwd_f32(bool stable, float *z1, float *z2, float *z3, float *z4,
                                         float *z5, float cu, float cl, float c, float dh, float dc,
                                         float *dcu, float *dcl) {
    float i = *z1, a = *z2, b = *z3, g = *z4, o = *z5;
    float tc = rl_tanhf(c);
    float dct = dc + dh * o * (1.0f - tc * tc);
    *z1 = dct * g * i * (1.0f - i);
    *z4 = dct * i * (1.0f - g * g);
    *z5 = dh * tc * o * (1.0f - o);
    if (stable) {
        float m = b * cu + (1.0f - b) * cl;
        *z2 = dct * m * a * (1.0f - a);
        *z3 = dct * a * (cu - cl) * b * (1.0f - b);
        *dcu = dct * a * b;
        *dcl = dct * a * (1.0f - b);
    } else {
        *z2 = dct * cu * a * (1.0f - a);
        *z3 = dct * cl * b * (1.0f - b);
        *dcu = dct * a;
        *dcl = dct * b;
    }
}

RL_HD_INLINE void rl_mdlstm_cell_bwd_f64(bool stable, double *z1, double *z2, double *z3,
                                         double *z4, double *z5, double cu, double cl, double c,
                                         double dh, double dc, double *dcu, double *dcl) {
    double i = *z1, a = *z2, b = *z3, g = *z4, o = *z5;
    double tc = tanh(c);
    double dct = dc + dh * o * (1.0 - tc * tc);
    *z1 = dct * g * i * (1.0 - i);
    *z4 = dct * i * (1.0 - g * g);
    *z5 = dh * tc * o * (1.0 - o);
    if (stable) {
        double m = b * cu + (1.0 - b) * cl;
        *z2 = dct * m * a * (1.0 - a);
        *z3 = dct * a * (cu - cl) * b * (1.0 - b);
        *dcu = dct * a * b;
        *dcl = dct * a * (1.0 - b);
    } else {
        *z2 = dct * cu * a * (1.0 - a);
        *z3 = dct * cl * b * (1.0 - b);
        *dcu = dct * a;
        *dcl = dct * b;
    }
}

#endif
