/* The fused pointwise passes of one janet step over a batch (B, H), CPU, float32 and float64.
 * The formulas are those of kernels/janet_cell.h; the recurrent driver (layers/recurrent.c)
 * calls these between its GEMMs for the janet cell (layers/janet.c).
 *
 * Layout of one step (row-major, contiguous, host memory):
 *   g     (B, 3H)  [s | a | .] on entry of forward (input projection plus recurrent product, no
 *                  bias), the activations [f | c~ | i] on return; backward overwrites them with
 *                  [ds | da | 0]
 *   b     (2H)     the biases b_f, b_c
 *   hp, h (B, H)   the previous state and this step's
 *   out   (B, H)   this step's output: h on valid rows, 0 on padded ones
 * A row b is valid when t < len[b]. A padded row carries the state (h = hp), and in backward
 * passes the state gradient through unchanged, its g zeroed.
 * mh (B, H): zoneout's weights of the previous state (kernels/pointwise.h, rl_zoneoutf), or NULL:
 * h = mh hp + (1 - mh) h~; backward gives the cell (1 - mh) of dLoss/dh_t and adds mh dLoss/dh_t
 * to the direct part of dh. */
#ifndef RL_KERNELS_JANET_H
#define RL_KERNELS_JANET_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void rl_janet_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                          const float *b, float beta, const float *hp, float *h, float *out,
                          const float *mh);
void rl_janet_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                          const double *b, double beta, const double *hp, double *h, double *out,
                          const double *mh);

/* dout: dLoss/dout of this step, rows dout_ld elements apart (NULL: zero). dh (B, H): on entry
 * dLoss/dh_t from the next step, on return its direct part dLoss/dh_prev (the caller then adds
 * g[:, 0:2H] U^T) on valid rows, unchanged on padded ones. */
void rl_janet_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                          const float *hp, const float *dout, int64_t dout_ld, float *dh,
                          const float *mh);
void rl_janet_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                          const double *hp, const double *dout, int64_t dout_ld, double *dh,
                          const double *mh);

/* db (2H) += the column sums of [ds | da] over `rows` rows of g (3H each). */
void rl_janet_cpu_bias_grads_f32(int64_t rows, int64_t H, const float *g, float *db);
void rl_janet_cpu_bias_grads_f64(int64_t rows, int64_t H, const double *g, double *db);

#ifdef __cplusplus
}
#endif

#endif
