/* The cuDNN 9 path of the lstm and gru layers (kernels/cuda/cudnn_rnn.cu; the layers' glue is
 * layers/rnn_cudnn.c). A plain C header: no CUDA include; streams are `void *` holding a
 * cudaStream_t (NULL: the legacy default stream). Only present in a CUDA build (RL_WITH_CUDA).
 *
 * One object per unidirectional single-layer LSTM (no peepholes: cuDNN has none) or GRU with
 * input size F (the layer's inputs concatenated along the features, in `from` order, as W's rows
 * are) and hidden size H, float32 or float64. It owns the cuDNN handle and descriptors, the weight
 * space and its gradient, the work and reserve spaces (grown to the largest batch seen, then
 * reused), and for direction -1 the time-reversed copies of x, y and dy: cuDNN runs forward in
 * time only, so each sequence is reversed within its own length (a gather kernel) before and
 * after; in a ragged batch x and dy go to cuDNN as copies with the padded frames zeroed. x and y
 * given to forward must stay unchanged until backward. cuDNN runs with FMA math (no TF32) and
 * padded I/O (fill 0); the weight mapping and the bias modes are kernels/cudnn_layout.h's.
 *
 * Per batch: rl_cudnn_rnn_pack_weights (after every optimizer step), rl_cudnn_rnn_forward, then
 * rl_cudnn_rnn_backward and rl_cudnn_rnn_unpack_grads. Every pointer named a buffer is device
 * memory of the object's device. Errors: RL_EDEVICE (a failing CUDA or cuDNN call, naming it and
 * the sizes), RL_EARG, RL_EDTYPE, RL_ENOMEM. */
#ifndef RL_KERNELS_CUDA_CUDNN_RNN_H
#define RL_KERNELS_CUDA_CUDNN_RNN_H

#include <stdbool.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../cudnn_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rl_cudnn_rnn rl_cudnn_rnn;

rl_status rl_cudnn_rnn_create(rl_cudnn_rnn **out, rl_cudnn_cell cell, int device, rl_dtype dt,
                              int64_t F, int64_t H, int direction);
void rl_cudnn_rnn_free(rl_cudnn_rnn *r);
/* All later calls of the object run on this stream (NULL: the legacy default stream). */
rl_status rl_cudnn_rnn_set_stream(rl_cudnn_rnn *r, void *stream);
/* Where cuDNN keeps each parameter, as it reported at creation; *n: the weight space's size in
 * elements. */
const rl_cudnn_layout *rl_cudnn_rnn_layout(const rl_cudnn_rnn *r, int64_t *n);

/* W (F, G H), U (H, G H), b (G H) and, for the GRU only, b_h (G H; NULL for the LSTM) in rnnlua's
 * layout -> the object's cuDNN weight space. */
rl_status rl_cudnn_rnn_pack_weights(rl_cudnn_rnn *r, const void *W, const void *U, const void *b,
                                    const void *bh);
/* The object's weight space -> W, U, b (, b_h) (overwritten): for checkpoints and tests. */
rl_status rl_cudnn_rnn_unpack_weights(rl_cudnn_rnn *r, void *W, void *U, void *b, void *bh);
/* The weight gradients of the last backward -> dW, dU, db (, db_h) (+=, the layer contract). */
rl_status rl_cudnn_rnn_unpack_grads(rl_cudnn_rnn *r, void *dW, void *dU, void *db, void *dbh);

/* x (T, B, F) -> y (T, B, H), 0 on padded frames. len_host and len_dev: the same int32 lengths
 * (B), 1 <= len <= T (the layer contract), on the host and on the device. h0 (, c0) (B, H): the
 * initial state (NULL: zero); hT (, cT) (B, H): each sequence's final state, or NULL. c0 and cT
 * are the LSTM's cell state (NULL for the GRU). train: keep what backward needs. */
rl_status rl_cudnn_rnn_forward(rl_cudnn_rnn *r, bool train, int64_t T, int64_t B,
                               const int32_t *len_host, const int32_t *len_dev, const void *x,
                               void *y, const void *h0, const void *c0, void *hT, void *cT);
/* After a training forward: dy (T, B, H) -> dx (T, B, F) (=, or NULL when not needed), the
 * initial state's gradients dh0 (, dc0: LSTM) (B, H; = or NULL), and the weight gradients into
 * the object's gradient space (read them with rl_cudnn_rnn_unpack_grads). */
rl_status rl_cudnn_rnn_backward(rl_cudnn_rnn *r, const void *dy, void *dx, void *dh0, void *dc0);

#ifdef __cplusplus
}
#endif

#endif
