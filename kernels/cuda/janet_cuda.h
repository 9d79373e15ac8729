/* The janet cell on CUDA devices (kernels/cuda/janet.cu): the whole recurrence of one direction,
 * the recurrent driver's CUDA launchers for layers/janet.c. A plain C header: no CUDA include;
 * streams are `void *` holding a cudaStream_t. Only present in a CUDA build (RL_WITH_CUDA).
 *
 * Layout and equations are those of layers/janet.c and kernels/janet.h (gates (T, B, 3H) in
 * blocks [s | a | i] per row, time-major sequences; a row b of step t is valid when t < len[b],
 * padded rows carry the state and output 0). Every pointer is device memory of one device (the
 * launchers make it current); len is the int32 lengths (B) on the device. Asynchronous on the
 * stream; errors come back as RL_EDEVICE (a failing CUDA or cuBLAS call, naming the function and
 * the sizes), RL_EARG or RL_EDTYPE. Deterministic: no atomics, every sum in a fixed order. */
#ifndef RL_KERNELS_CUDA_JANET_H
#define RL_KERNELS_CUDA_JANET_H

#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row chunks of the bias sums (the scratch `partial` holds RL_JANET_CUDA_CHUNKS * 3H elements). */
#define RL_JANET_CUDA_CHUNKS 64

/*   gates (T, B, 3H)  forward: the input projections [x W_f | x W_c | .] on entry, the
 *                     activations [f | c~ | i] on return; backward: activations on entry,
 *                     [ds | da | 0] on return (0 on padded rows)
 *   hs (T+1, B, H)    states, rows as in layers/recurrent.h; forward reads the initial row and
 *                     writes the others; backward reads them
 *   out (T, B, H), U (H, 2H), b (2H), beta the input gate's shift
 *   dout              dLoss/dout, a (T*B, dout_ld) matrix (NULL: zero)
 *   dh (B, H)         the final state's gradient on entry, the initial state's on return
 *   dU (H, 2H), db (2H): += this batch's gradients; partial: the bias sums' scratch
 * Forward per step: gates_t[:, 0:2H] += h_prev U (cuBLAS), then the fused pointwise kernel.
 * Backward per step: the pointwise kernel, then dh += dG_t[:, 0:2H] U^T; after the loop dU +=
 * Hprev^T dG[:, 0:2H] over all frames and db. Left to the caller: the input projections before
 * forward, dW and dX after backward.
 * o (kernels/cuda/context.h; NULL: none): the driver's rec_dropout inside the loops and zoneout
 * (zh) in the fused step kernels with kernels/janet.h's formulas. */
rl_status rl_janet_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                int direction, const int32_t *len, void *gates, const void *U,
                                const void *b, double beta, void *hs, void *out,
                                const rl_cuda_rec_opts *o);
rl_status rl_janet_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                 int direction, const int32_t *len, void *gates, const void *U,
                                 const void *hs, const void *dout, int64_t dout_ld, void *dh,
                                 void *dU, void *db, void *partial, const rl_cuda_rec_opts *o);

#ifdef __cplusplus
}
#endif

#endif
