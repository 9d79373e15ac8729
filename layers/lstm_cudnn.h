/* The cuDNN path of the lstm layer (impl = "cudnn"; layers/lstm.c): the glue between the layer's
 * buffers and the cuDNN object of kernels/cuda/cudnn_lstm.cu. CUDA builds only call it; the
 * layer keeps its weights W, U, b in its own layout, packed into cuDNN's weight space before every
 * forward, so checkpoints do not depend on the impl.
 *
 * Buffers it owns: xcat, dxcat (T, B, F): the inputs (their gradients) side by side, when they are
 * not one contiguous input already. The cuDNN object runs on the layer's stream (r->stream): it
 * must be dropped (rl_lstm_cudnn_drop) before that stream is destroyed, which
 * rl_recurrent's on_stream_drop does for the layer. */
#ifndef RL_LAYERS_LSTM_CUDNN_H
#define RL_LAYERS_LSTM_CUDNN_H

#include "recurrent.h"

typedef struct {
    struct rl_cudnn_lstm *rnn; /* made on first use, for this dtype and device */
    rl_dtype dt;
    int dev;
    rl_tensor xcat, dxcat;
} rl_lstm_cudnn;

/* Forward of layer l (hidden size l->n_out, direction) over io on the layer's stream: the given
 * initial state h0, c0 (unset: zero) into row 0 of hs, cs (sized (2, B, H) here), the final state
 * into row 1, the output into l->out. r: the layer's recurrent state after
 * rl_recurrent_forward_begin (stream, len_dev, T, B). */
rl_status rl_lstm_cudnn_forward(rl_lstm_cudnn *c, const rl_recurrent *r, rl_layer *l, int direction,
                                const rl_layer_io *io, rl_dtype dt, rl_device dev, rl_mat W,
                                rl_mat U, rl_mat bias, const rl_tensor *h0, const rl_tensor *c0,
                                rl_tensor *hs, rl_tensor *cs);
/* Backward after a training forward: dout (T*B, H; {NULL, 0}: zero) -> grad_in (= where
 * given), the initial state's gradients dh, dc (sized (B, H) here), dW, dU, db (+=). */
rl_status rl_lstm_cudnn_backward(rl_lstm_cudnn *c, rl_recurrent *r, rl_layer *l,
                                 const rl_layer_io *io, rl_tensor *const *grad_in, rl_dtype dt,
                                 rl_device dev, rl_mat dout, rl_mat dW, rl_mat dU, rl_mat db,
                                 rl_tensor *dh, rl_tensor *dc);
/* Frees the cuDNN object (after waiting for its stream); the next forward makes a new one. */
void rl_lstm_cudnn_drop(rl_lstm_cudnn *c);
/* rl_lstm_cudnn_drop, then releases the buffers. */
void rl_lstm_cudnn_free(rl_lstm_cudnn *c);

#endif
