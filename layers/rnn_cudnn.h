/* The cuDNN path of the lstm and gru layers (impl = "cudnn"; layers/recurrent.c's driver runs it
 * for the cells with a cuDNN mode): the glue between a layer's buffers and the cuDNN object of
 * kernels/cuda/cudnn_rnn.cu. A build without CUDA never takes it (its forward and backward there
 * return an error); the layer keeps its weights W, U, b (, b_h) in its own layout, packed into
 * cuDNN's weight space before every forward, so checkpoints do not depend on the impl.
 *
 * Buffers it owns: xcat, dxcat (T, B, F): the inputs (their gradients) side by side, when they are
 * not one contiguous input already. The cuDNN object runs on the layer's stream (r->stream): it
 * must be dropped (rl_rnn_cudnn_drop) before that stream is destroyed, which rl_recurrent's
 * on_stream_drop does for the layer. */
#ifndef RL_LAYERS_RNN_CUDNN_H
#define RL_LAYERS_RNN_CUDNN_H

#include "../kernels/cudnn_layout.h"
#include "recurrent.h"

typedef struct rl_rnn_cudnn {
    struct rl_cudnn_rnn *rnn; /* made on first use, for this cell, dtype and device */
    rl_dtype dt;
    int dev;
    rl_tensor xcat, dxcat;
} rl_rnn_cudnn;

/* Forward of layer l (hidden size l->n_out, direction) over io on the layer's stream. p: the
 * layer's W, U, b and (GRU) b_h, {NULL, 0} for the LSTM. The given initial state h0 (, c0: LSTM;
 * unset: zero) goes into row 0 of hs (, cs), sized (2, B, H) here, the final state into row 1, the
 * output into l->out. cs and c0 are NULL for the GRU. r: the layer's recurrent state after
 * rl_recurrent_forward_begin (stream, len_dev, T, B). */
rl_status rl_rnn_cudnn_forward(rl_rnn_cudnn *c, const rl_recurrent *r, rl_layer *l,
                               rl_cudnn_cell cell, int direction, const rl_layer_io *io,
                               rl_dtype dt, rl_device dev, const rl_mat p[4], const rl_tensor *h0,
                               const rl_tensor *c0, rl_tensor *hs, rl_tensor *cs);
/* Backward after a training forward: dout (T*B, H; {NULL, 0}: zero) -> grad_in (= where given),
 * the initial state's gradients dh (, dc: LSTM, else NULL), sized (B, H) here, and the weight
 * gradients g: dW, dU, db (, db_h) (+=). */
rl_status rl_rnn_cudnn_backward(rl_rnn_cudnn *c, rl_recurrent *r, rl_layer *l,
                                const rl_layer_io *io, rl_tensor *const *grad_in, rl_dtype dt,
                                rl_device dev, rl_mat dout, const rl_mat g[4], rl_tensor *dh,
                                rl_tensor *dc);
/* The option impl = "own" (default) or "cudnn" of layer `name` of class cls: *cudnn. An error
 * naming the layer for any other value. */
rl_status rl_rnn_cudnn_option(const rl_options *opts, const char *name, const char *cls,
                              bool *cudnn);
/* Whether cuDNN can run this batch of layer l (on CUDA tensors): its sizes fit cuDNN's int
 * descriptors. Where it cannot, a gru with impl = "cudnn" runs its own kernels. */
bool rl_rnn_cudnn_serves(const rl_recurrent *r, const rl_layer *l);
/* Frees the cuDNN object (after waiting for its stream); the next forward makes a new one. */
void rl_rnn_cudnn_drop(rl_rnn_cudnn *c);
/* rl_rnn_cudnn_drop, then releases the buffers. */
void rl_rnn_cudnn_free(rl_rnn_cudnn *c);

#endif
