/* The GRU on CUDA devices (kernels/cuda/gru.cu). A plain C header: no CUDA include; streams are
 * `void *` holding a cudaStream_t (NULL: the legacy default stream). Only present in a CUDA
 * build (RL_WITH_CUDA). The layer's streams, lengths on the device, state copies and GEMMs are
 * the CUDA context's (kernels/cuda/context.h: rl_cuda_stream_create, _set_lengths, _zero,
 * _copy_rows, _gemm), with its stream rules.
 *
 * Layout and equations are those of layers/gru.c and kernels/gru.h (gate blocks r, z, hn, n per
 * row of the gates buffer, row-major, time-major (T, B, .) sequences; a row b of step t is valid
 * when t < len[b], padded rows carry the state and output 0). Every pointer named a buffer is
 * device memory of one device (the launchers make it current); len is the int32 lengths (B) on
 * the device. All calls are asynchronous on their stream; errors come back as RL_EDEVICE (a
 * failing CUDA or cuBLAS call, naming the function and the sizes), RL_EARG or RL_EDTYPE.
 * Deterministic: no atomics, every sum in a fixed order.
 */
#ifndef RL_KERNELS_CUDA_GRU_H
#define RL_KERNELS_CUDA_GRU_H

#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- one step (device counterparts of kernels/gru.h, for callers with their own time loop) ----
 * Same arguments and meaning as rl_gru_cpu_fwd_f32 and rl_gru_cpu_bwd_f32 (and f64), plus the
 * stream first, except that the bias gradients are not summed per step: call
 * rl_gru_cuda_bias_grads over the steps' dG rows. */
rl_status rl_gru_cuda_fwd_f32(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                              float *g, const float *b, const float *bh, const float *hp, float *h,
                              float *out);
rl_status rl_gru_cuda_fwd_f64(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                              double *g, const double *b, const double *bh, const double *hp,
                              double *h, double *out);
rl_status rl_gru_cuda_bwd_f32(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                              float *g, const float *hp, const float *dout, int64_t dout_ld,
                              float *dh);
rl_status rl_gru_cuda_bwd_f64(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                              double *g, const double *hp, const double *dout, int64_t dout_ld,
                              double *dh);

/* Row chunks of the bias sums: partial, a device scratch of RL_GRU_CUDA_CHUNKS * 4H elements of
 * dt, holds each chunk's column sums of dG (stage 1) before they are added in chunk order
 * (stage 2), so the sums run on a full grid and stay deterministic. */
#define RL_GRU_CUDA_CHUNKS 64

/* Bias gradients of N rows of dG (N, 4H) = [dar | daz | dhn | dan]:
 *   db (3H) += column sums of [dar | daz | dan],  dbh (3H) += those of [dar | daz | dhn].
 * partial: the scratch above (on the device of dg). */
rl_status rl_gru_cuda_bias_grads(void *stream, rl_dtype dt, int64_t N, int64_t H, const void *dg,
                                 void *partial, void *db, void *dbh);

/* x (T, B, F), contiguous: the rows of padded frames (t >= len[b]) set to 0. */
rl_status rl_gru_cuda_zero_padding(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t F,
                                   const int32_t *len, void *x);

/* ---- the whole recurrence of one direction (the driver's step loops, layers/recurrent.c) ----
 *   gates (T, B, 4H)  forward: the input projections [x W_rz | . | x W_n] on entry (block 2 is
 *                     zeroed here), activations on return; backward: activations on entry,
 *                     dG on return (0 on padded rows)
 *   hs (T+1, B, H)    states, rows as in layers/recurrent.h; forward reads the initial row (written
 *                     by the caller) and writes the others; backward reads them
 *   out (T, B, H)     the output
 *   U (H, 3H), b, bh (3H)
 *   dout              dLoss/dout, a (T*B, dout_ld) matrix (NULL: zero)
 *   dh (B, H)         zeros on entry, the initial state's gradient on return
 *   dU (H, 3H), db, dbh (3H): += this batch's gradients
 *   partial           the bias sums' scratch (RL_GRU_CUDA_CHUNKS * 4H elements)
 * Forward per step: gates_t[:, 0:3H] += h_prev U (cuBLAS), then the fused pointwise kernel.
 * Backward per step: the pointwise kernel, then dh += dG_t[:, 0:3H] U^T; after the loop
 * dU += Hprev^T dG[:, 0:3H] as one GEMM over all frames and the bias gradients. Left to the
 * caller: the input projections before forward, dW and dX after backward. */
/* layer_norm = true (NULL: none): the layer's per-frame buffers over all frames, (T, B, .) each
 * with the widths of rl_gru_ln_f32 (kernels/gru.h): xh, hh, dzh 3H, dg 4H, rs 6; the gains gx, gh
 * (3H) and backward's gradients of them (+=). The per-step product then writes the recurrent part
 * hh_t = h_prev U (normalised apart), and kernels/gru_ln_row.h's normalisation runs per row (one
 * thread each) before the fused kernel; in backward after it, the per-step product and dU read
 * the recurrent part's gradients dzh, and db, dbh, dgx, dgh are column sums over all frames (one
 * thread per column, rows in order: deterministic) instead of the chunked bias sums. */
typedef struct {
    void *xh, *hh, *rs, *dg, *dzh;
    const void *gx, *gh;
    void *dgx, *dgh;
} rl_gru_cuda_ln;

/* o (kernels/cuda/context.h; NULL: none): the driver's rec_dropout inside the loops and zoneout
 * (zh) in the fused step kernels with kernels/gru.h's formulas. */
rl_status rl_gru_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                              int direction, const int32_t *len, void *gates, const void *U,
                              const void *b, const void *bh, void *hs, void *out,
                              const rl_gru_cuda_ln *ln, const rl_cuda_rec_opts *o);
rl_status rl_gru_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                               int direction, const int32_t *len, void *gates, const void *U,
                               const void *hs, const void *dout, int64_t dout_ld, void *dh,
                               void *dU, void *db, void *dbh, void *partial,
                               const rl_gru_cuda_ln *ln, const rl_cuda_rec_opts *o);

#ifdef __cplusplus
}
#endif

#endif
