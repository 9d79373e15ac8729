/* The LSTM on CUDA devices: rnnlua's own kernels (kernels/cuda/lstm.cu) and the cuDNN 9 path
 * (kernels/cuda/cudnn_rnn.cu). A plain C header: no CUDA include; streams are `void *` holding a
 * cudaStream_t (NULL: the legacy default stream). Only present in a CUDA build (RL_WITH_CUDA).
 *
 * Every pointer named a buffer is device memory of the tensors' device (the launchers make that
 * device current); scalars, `len_host` and the arrays of three peephole pointers are host memory.
 * All calls are asynchronous on their stream; errors come back as RL_EDEVICE (a failing CUDA,
 * cuBLAS or cuDNN call, naming the function and the sizes), RL_ENOMEM, RL_EARG or RL_EDTYPE.
 *
 * Layout and equations are those of layers/lstm.c and kernels/lstm.h (gate order i, f, g, o;
 * row-major; time-major (T, B, .) sequences; a row b of step t is valid when t < len[b], padded
 * rows carry the state and output 0).
 *
 * Streams: each layer passes its side stream (kernels/cuda/context.h: rl_cuda_stream_create, the
 * events that order layers on different streams, the lengths and copy helpers, rl_cuda_gemm for
 * the input projection and the weight and input gradients).
 */
#ifndef RL_KERNELS_CUDA_LSTM_H
#define RL_KERNELS_CUDA_LSTM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- own kernels: one step (device counterparts of kernels/lstm.h) ----
 *
 * Same arguments and meaning as rl_lstm_cpu_fwd_f32/bwd_f32, plus the stream first; len is the
 * int32 lengths (B) on the device; peep and dpeep are host arrays of three device pointers (or
 * NULL). Backward adds the bias and peephole gradients deterministically: each thread block owns
 * 32 columns and sums over the batch rows in a fixed order (no atomics); db and dpeep may be NULL
 * to leave that to rl_lstm_cuda_param_grads over all frames (what rl_lstm_cuda_backward does):
 * then the step runs one thread per (b, j) on the forward's grid, not ceil(H/32) blocks. */
rl_status rl_lstm_cuda_fwd_f32(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                               float *z, const float *bias, const float *const *peep,
                               const float *cp, const float *hp, float *c, float *h, float *out);
rl_status rl_lstm_cuda_fwd_f64(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                               double *z, const double *bias, const double *const *peep,
                               const double *cp, const double *hp, double *c, double *h,
                               double *out);
rl_status rl_lstm_cuda_bwd_f32(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                               float *z, const float *const *peep, const float *cp, const float *c,
                               const float *dout, int64_t dout_ld, float *dh, float *dc, float *db,
                               float *const *dpeep);
rl_status rl_lstm_cuda_bwd_f64(void *stream, int64_t B, int64_t H, int64_t t, const int32_t *len,
                               double *z, const double *const *peep, const double *cp,
                               const double *c, const double *dout, int64_t dout_ld, double *dh,
                               double *dc, double *db, double *const *dpeep);

/* Row chunks of the bias and peephole sums over all frames: their partial sums need a device
 * scratch of RL_LSTM_CUDA_CHUNKS * 7H elements of dt (two stages, deterministic, a full grid). */
#define RL_LSTM_CUDA_CHUNKS 64

/* Bias and peephole gradients of N frames at once (deterministic column sums):
 *   db (4H) += sum_n dz[n, :]
 *   dpeep[0] (H) += sum_n dz_i[n] * cprev[n],  dpeep[1] += dz_f * cprev,  dpeep[2] += dz_o * cur
 * dz (N, 4H), cprev and cur (N, H); dpeep and cprev/cur may be NULL (no peepholes); partial: the
 * scratch above. dt: float32 or float64. */
rl_status rl_lstm_cuda_param_grads(void *stream, rl_dtype dt, int64_t N, int64_t H, const void *dz,
                                   const void *cprev, const void *cur, void *partial, void *db,
                                   void *const *dpeep);

/* ---- own kernels: the whole recurrence of one direction ----
 *
 * The step loops of the driver (layers/recurrent.c) with its buffers (all contiguous, dt float32 or
 * float64): gates (T, B, 4H)  forward: x W on entry (no bias), activations on return; backward:
 * activations on entry, dZ on return (0 on padded rows) hs, cs (T+1, B, H) states; direction 1: row
 * 0 initial, row t+1 after frame t; direction -1: row t after frame t, row T initial. Forward reads
 * the initial row (the caller writes it: zeros or the given state) and writes the others; backward
 * only reads them. out (T, B, H)     the output (h on valid rows, 0 on padded ones) U (H, 4H), bias
 * (4H), peep: host array of 3 device pointers (H each) or NULL dout              dLoss/dout, a
 * (T*B, dout_ld) matrix (NULL: zero) dh, dc (B, H)     the state gradients after the last frame on
 * entry (zeros normally), the initial state's gradients on return dU (H, 4H), db (4H), dpeep (3 x H
 * or NULL): += this batch's gradients partial           the scratch of rl_lstm_cuda_param_grads
 * (RL_LSTM_CUDA_CHUNKS * 7H) Forward per step: z_t += h_prev U (cuBLAS), then the fused pointwise
 * kernel. Backward per step: the pointwise kernel, then dh += dz_t U^T; after the loop dU +=
 * Hprev^T dZ as one GEMM over all frames and db, dpeep with rl_lstm_cuda_param_grads. Left to the
 * caller (they depend on the inputs): gates = x W before forward; dW += X^T dZ and dX = dZ W^T
 * after backward, with rl_cuda_gemm on the same stream. */
/* n_proj = P (LSTMP, layers/lstm.c; NULL: none): the cell's own state is m (H wide), the carried
 * and output state h = m R is P wide, so hs (T+1, B, P), out (T, B, P), U (P, 4H), dh (B, P) and
 * dU (P, 4H) are P wide, and
 *   R (H, P)          the projection
 *   ms (T+1, B, H)    m in hs's row order; forward reads the initial row (the caller writes
 *                     zeros) and writes the others, backward reads them
 *   mscr (B, H)       forward's scratch (the cell kernel's output rows, unused)
 *   drs (T, B, P)     backward: each frame's dLoss/dh (0 on padded rows)
 *   dm (B, H)         backward: a step's dLoss/dm = drs_t R^T, the cell kernel's state gradient
 *   dR (H, P)         backward: += M^T drs over all frames
 * Forward per step after the cell kernel: h_t = m_t R (cuBLAS), then padded rows carry h_prev and
 * output 0, valid ones output h_t. Backward per step before it: drs_t = dh + dout on valid rows (0
 * on padded ones, whose dh passes through), dh = 0 there, dm = drs_t R^T; the per-step product
 * then adds dz_t U^T to dh. */
typedef struct {
    int64_t P;
    const void *R;
    void *ms, *mscr, *drs, *dm, *dR;
} rl_lstm_cuda_proj;

/* layer_norm = true (NULL: none; no peepholes): the layer's per-frame buffers over all frames,
 * (T, B, .) each with the widths of rl_lstm_ln_f32 (kernels/lstm.h): xh, hh, dg, dzh 4H, cn, du
 * H, rs 9; the gains gx, gh (4H), gc (H) and the cell's bias bc (H); backward's gradients of them
 * (+=). The per-step product then writes the recurrent part hh_t = h_prev U (it is normalised
 * apart) and the step is kernels/lstm_ln_row.h's, one thread per row; backward's per-step product
 * and dU read the recurrent part's gradients dzh, and db, dgx, dgh, dgc, dbc are column sums over
 * all frames (one thread per column, rows in order: deterministic). */
/* o (kernels/cuda/context.h; NULL: none): the driver's rec_dropout and zoneout inside the loops;
 * zoneout (not with n_proj or layer_norm) in the fused step kernels with kernels/lstm.h's
 * formulas (zc, zh the weights, ct = c~, which p_o's gradient then pairs with). */
typedef struct {
    void *xh, *hh, *cn, *rs, *dg, *dzh, *du;
    const void *gx, *gh, *gc, *bc;
    void *dgx, *dgh, *dgc, *dbc;
} rl_lstm_cuda_ln;

rl_status rl_lstm_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                               int direction, const int32_t *len, void *gates, const void *U,
                               const void *bias, const void *const *peep, void *hs, void *cs,
                               void *out, const rl_lstm_cuda_proj *proj, const rl_lstm_cuda_ln *ln,
                               const rl_cuda_rec_opts *o);
rl_status rl_lstm_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                int direction, const int32_t *len, void *gates, const void *U,
                                const void *const *peep, const void *hs, const void *cs,
                                const void *dout, int64_t dout_ld, void *dh, void *dc, void *dU,
                                void *db, void *const *dpeep, void *partial,
                                const rl_lstm_cuda_proj *proj, const rl_lstm_cuda_ln *ln,
                                const rl_cuda_rec_opts *o);

/* The cuDNN 9 path (impl = "cudnn") is kernels/cuda/cudnn_rnn.h, shared with the gru. */

#ifdef __cplusplus
}
#endif

#endif
