/* The create functions of the built-in C layer classes (registered in registry.c). */
#ifndef RL_LAYERS_H
#define RL_LAYERS_H

#include "layer.h"

#include "../kernels/im2col.h"

#ifdef __cplusplus
extern "C" {
#endif

/* copy: the inputs concatenated along the feature dim, unchanged. */
rl_status rl_copy_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims);

/* linear (n_out, activation, with_bias), activation (activation), dropout (dropout),
 * combine (kind = add | concat | mul), window (window, or left/right), softmax (n_out,
 * with_bias, loss = "ce"): see the top of each layers/X.c for equations and buffers. */
rl_status rl_linear_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims);
rl_status rl_activation_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                               const int64_t *in_dims);
rl_status rl_dropout_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims);
rl_status rl_combine_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims);
rl_status rl_window_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims);
rl_status rl_softmax_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims);

/* lstm (layers/lstm.c): n_out, direction = 1 | -1, peepholes, forget_bias. */
rl_status rl_lstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims);
/* The initial state of an lstm layer for the following batches: h0, c0 (B, n_out) float
 * tensors on the inputs' device, checked at forward (shared, not copied; dtype converted at
 * each forward) or NULL for zeros. */
rl_status rl_lstm_set_initial_state(rl_layer *l, const rl_tensor *h0, const rl_tensor *c0);
/* h, c (unset, or NULL to skip) become views (B, n_out) of each sequence's state after its own
 * last frame in the processing direction; valid until the next forward. */
rl_status rl_lstm_final_state(rl_layer *l, rl_tensor *h, rl_tensor *c);
/* dh0, dc0 (unset, or NULL) become views (B, n_out) of dLoss/dh0 and dLoss/dc0 after a
 * backward; valid until the next backward. */
rl_status rl_lstm_initial_state_grad(rl_layer *l, rl_tensor *dh0, rl_tensor *dc0);
/* The gradients dLoss/dh_T, dLoss/dc_T (B, n_out) of the final state that the following
 * backward passes start from (shared, read at each backward), or NULL for zeros; per-step use
 * in a rec unit (layer.h). Not with impl = "cudnn". */
rl_status rl_lstm_set_final_state_grad(rl_layer *l, const rl_tensor *dh, const rl_tensor *dc);

/* embedding (layers/embedding.c): n_out; one sparse input (T, B) int32 of in_dims[0] classes,
 * W (in_dims[0], n_out). */
rl_status rl_embedding_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                              const int64_t *in_dims);
/* The valid frames of x (T, B) int32 class indices (CPU; len (B) CPU int32) grouped by class, for
 * the CUDA backward's deterministic scatter-add: out = start (n_used + 1), cls (n_used), rows
 * (the valid frames t * B + b), class u's frames being rows[start[u] .. start[u+1]-1] in frame
 * order, classes ascending. pairs: scratch of 2 T B int32; out: room for 3 T B + 1. Returns
 * n_used. Plain C, so it is tested without a device (tests/c/test_embedding.c). */
int64_t rl_embedding_groups(const rl_tensor *x, const rl_tensor *len, int32_t *pairs, int32_t *out);

/* gru (layers/gru.c): n_out, direction = 1 | -1; PyTorch's GRU formulation and weight layout.
 * The initial state (B, n_out), the final state, its gradient and the initial state's gradient
 * work as the lstm's above (without a cell); together they make one forward/backward with T = 1
 * a single step with explicit state in and out. These typed calls (and the lstm's) are the
 * layer.h state calls (rl_layer_set_initial_state, ...) for callers that know the class. */
rl_status rl_gru_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                        const int64_t *in_dims);
/* janet (layers/janet.c): the forget-gate-only LSTM; n_out, direction, beta. */
rl_status rl_janet_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                          const int64_t *in_dims);
rl_status rl_gru_set_initial_state(rl_layer *l, const rl_tensor *h0);
rl_status rl_gru_set_final_state_grad(rl_layer *l, const rl_tensor *dh);
rl_status rl_gru_final_state(rl_layer *l, rl_tensor *h);
rl_status rl_gru_initial_state_grad(rl_layer *l, rl_tensor *dh0);

/* Recurrent cells (lstm, gru, janet, ...) in per-step use (layers/recurrent.h, "Packed
 * operands"): l, a step object of the same unit layer as owner (same class, inputs and n_out,
 * bound to the same parameters), shares owner's packed weights from now on (an error naming both
 * layers when they differ, or the one that is no recurrent cell). */
rl_status rl_recurrent_share_packs(rl_layer *l, rl_layer *owner);
/* The pass the packed weights of l (and of the layers sharing them) belong to: they are packed
 * once per pass, so the caller gives a new number whenever the parameters may have changed
 * since the last forward or backward; 0 (the default) packs them at every forward and
 * backward. */
rl_status rl_recurrent_set_pack_pass(rl_layer *l, uint64_t pass);
/* Frozen parameters (an inference model whose weights never change): l packs each operand once,
 * at the first product that needs it, and keeps it. rl_recurrent_frozen_packs gives those packs
 * (NULL when l packed none yet or is no recurrent cell) for another network's layer of the same
 * description and parameters to read: rl_recurrent_adopt_packs makes l read them (holding a
 * reference); rl_recurrent_packs_hold / _drop take and release a reference for a caller that
 * carries them between the two. Shared frozen packs are read-only: an operand the owner never
 * packed is an error when a sharer needs it. An error when l is a rec unit's step object. */
rl_status rl_recurrent_freeze_packs(rl_layer *l);
void *rl_recurrent_frozen_packs(rl_layer *l);
void rl_recurrent_packs_hold(void *packs);
void rl_recurrent_packs_drop(void *packs);
rl_status rl_recurrent_adopt_packs(rl_layer *l, void *packs);
/* on: the input products of l, which adopted frozen packs, read the packed W of the owner (which
 * packs it without using it, keeping OpenBLAS's numbers) from the next forward on, instead of
 * OpenBLAS, which repacks W at each call (the cost of a one-frame step); the numbers then
 * differ from the owner's by float32 rounding. off (the default): OpenBLAS's product. An error
 * for on when l adopted no packs. */
rl_status rl_recurrent_adopted_inputs(rl_layer *l, bool on);
/* Inputs the caller promises to be all zeros in the following forwards (bit k: input k; 0 for
 * none), such as a rec unit's prev: sources at the first step: their input projections and
 * weight-gradient products are skipped (they add zeros), the input gradients are computed as
 * usual. An error when the mask names inputs the layer does not have. */
rl_status rl_recurrent_set_zero_inputs(rl_layer *l, uint32_t mask);
/* Weight gradients over all steps (a rec unit): gates, a contiguous (T, B, G) tensor on the CPU
 * of the layer's dtype, G = rl_recurrent_gates_cols (the rows of one step in the caller's
 * (S, B, G) buffer),
 * becomes the layer's gates buffer from the next forward on: forward leaves the gate
 * activations there, backward the gate gradients dZ (the gru's [dar | daz | dhn | dan] blocks),
 * and backward skips the weight-gradient products (dW_k = X_k^T dZ, dU = Hprev^T dZ): the caller
 * makes them with rl_recurrent_weight_grads, once over all steps instead of once per step. The
 * bias gradients and the input and state gradients stay the layer's. NULL: the layer's own
 * buffer and products again. A wrong shape, dtype or device is an error at the next forward
 * naming the layer. */
rl_status rl_recurrent_set_gates(rl_layer *l, const rl_tensor *gates);
/* Adds x^T dz to the gradient of input k's weights W_k (0-based, k < n_in) or, k = -1, of U:
 * x (N, F) with F input k's dim (n_out for U: the previous states), dz (N, G) gate
 * gradients as backward leaves them in the gates buffer (rl_recurrent_set_gates), for the same
 * N rows (frames of any steps); each a contiguous 2-D or 3-D tensor read as N rows. */
rl_status rl_recurrent_weight_grads(rl_layer *l, int k, const rl_tensor *x, const rl_tensor *dz);
/* How many operands the packs of l (shared or not) have packed since they were made: the rec
 * layer's tests check that per-step use packs once per pass, not once per step. */
rl_status rl_recurrent_pack_count(rl_layer *l, uint64_t *count);
/* The width of a recurrent layer's gates buffer (the columns of rl_recurrent_set_gates' tensor
 * and of rl_recurrent_weight_grads' dz). */
rl_status rl_recurrent_gates_cols(rl_layer *l, int64_t *cols);

/* mdlstm (layers/mdlstm.c): 2-D multi-directional LSTM over (H, W, B, F) images; n_out (per
 * direction), directions ("tl,tr,bl,br"), combine = concat | sum, cell = standard | stable,
 * forget_bias. */
rl_status rl_mdlstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims);
/* mdlstm's cell lists (layers/mdlstm.c), exported for tests/c/test_mdlstm.c, which checks
 * the lists a CUDA device receives: the number of cells of all nd directions of a batch with
 * sizes sz (B, 2), and every diagonal's lists: diagonal s at cells[first[s] .. first[s+1]-1]
 * (first: H + W entries), each direction a block of (first[s+1] - first[s]) / nd cells. */
int64_t rl_mdlstm_count_cells(int nd, int64_t B, const int32_t *sz);
void rl_mdlstm_list_all(const int *dirs, int nd, int64_t H, int64_t W, int64_t B, const int32_t *sz,
                        int64_t *cells, int64_t cap, int64_t *first);

/* The 2-D layers (see the top of each layers/X.c): conv2d (n_out, filter_size, padding,
 * strides, activation, with_bias) and pool2d (mode = max | avg, pool_size, strides, padding)
 * map images to images with new per-image sizes; collapse (mode = sum | max | last) maps
 * images to sequences over the width, global_pool (mode = mean | max) to one frame each. */
/* conv2d and pool2d: the geometry g of a (fh, fw) window sliding by (sy, sx) over the
 * (H, W, B, F) input io->in[0], padded ("same": ceil(n / s) outputs) or not ("valid"); the
 * per-image output sizes into out_sizes ((B, 2) int32, CPU) and a contiguous CPU copy of the
 * input sizes into sizes (unset; the caller releases it). An image smaller than a "valid"
 * window is an error naming the layer and the image. */
rl_status rl_sliding_geometry(const rl_layer *l, const char *window, const rl_layer_io *io,
                              int64_t fh, int64_t fw, int64_t sy, int64_t sx, bool same,
                              rl_conv_geom *g, rl_tensor *out_sizes, rl_tensor *sizes);
rl_status rl_conv2d_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims);
rl_status rl_pool2d_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims);
rl_status rl_collapse_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                             const int64_t *in_dims);
rl_status rl_global_pool_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                                const int64_t *in_dims);
/* The geometry of the last forward's output, owned by the layer (valid until its next forward),
 * or NULL when l is not of that class: conv2d and pool2d the (B, 2) int32 sizes of their output
 * images, collapse the (B) int32 lengths of its sequences (the widths), global_pool (B) ones. */
const rl_tensor *rl_conv2d_out_sizes(const rl_layer *l);
const rl_tensor *rl_pool2d_out_sizes(const rl_layer *l);
const rl_tensor *rl_collapse_out_lengths(const rl_layer *l);
const rl_tensor *rl_global_pool_out_lengths(const rl_layer *l);

/* Activation functions, shared by linear and activation (layers/activation.c). */
typedef enum {
    RL_ACT_IDENTITY = 0,
    RL_ACT_TANH,
    RL_ACT_SIGMOID,
    RL_ACT_RELU,
    RL_ACT_ELU, /* alpha = 1 */
    RL_ACT_SOFTPLUS,
    RL_ACT_EXP,
    RL_ACT_SQUARE,
    RL_NUM_ACTIVATIONS
} rl_activation;

const char *rl_activation_name(rl_activation a);
/* "tanh" -> RL_ACT_TANH; an unknown name is an error naming the layer and the known names. */
rl_status rl_activation_parse(const char *s, const char *layer, rl_activation *out);
/* y (set) = f(x); y may be x itself. */
rl_status rl_activation_forward(rl_activation a, rl_tensor *y, const rl_tensor *x);
/* Whether backward reads x (else only y = f(x) is needed and f may be applied in place). */
bool rl_activation_needs_input(rl_activation a);
/* dx (set) = dy * f'(x), from x and y = f(x); dx must not overlap dy, x or y. */
rl_status rl_activation_backward(rl_activation a, rl_tensor *dx, const rl_tensor *dy,
                                 const rl_tensor *x, const rl_tensor *y);

/* The affine map of linear and softmax (layers/linear.c): z (T, B, n_out) = sum_i in_i W_i + b
 * with W (sum F_i, n_out), W_i its rows for input i, b NULL without bias. */
rl_status rl_affine_params(rl_layer *l, bool with_bias, int *iW, int *ib);
rl_status rl_affine_forward(const rl_layer *l, const rl_layer_io *io, const rl_param *W,
                            const rl_param *b, rl_tensor *z);
/* dW += x^T dz, db += sum_rows dz (db_scratch: an (n_out) buffer), grad_in[i] = dz W_i^T. */
rl_status rl_affine_backward(const rl_layer *l, const rl_layer_io *io, rl_param *W, rl_param *b,
                             const rl_tensor *dz, rl_tensor *db_scratch, rl_tensor *const *grad_in);
/* Whether rl_affine_backward_bf16 can run: a bf16 network's products (kernels/cpu/gemm_bf16.h:
 * a bf16 context active on this thread), W float32 on the CPU, every input dense (no class
 * indices) with rows of unit stride, as the gradient buffers. */
bool rl_affine_bf16_ok(const rl_layer *l, const rl_layer_io *io, const rl_param *W,
                       rl_tensor *const *grad_in);
/* rl_affine_backward without a bias, dz (rows = T*B x n_out) given rounded to bf16 in the layout
 * of rl_bf16_lhs_size: the products rl_affine_backward would run, with their bits, dz rounded
 * once instead of in each. */
rl_status rl_affine_backward_bf16(const rl_layer *l, const rl_layer_io *io, rl_param *W,
                                  const uint16_t *dz, int64_t rows, rl_tensor *const *grad_in);

#ifdef __cplusplus
}
#endif

#endif
