/* gru: a gated recurrent unit layer over time-major sequences, forward or backward in time; the
 * cuDNN / PyTorch formulation (Cho et al. 2014 with the reset gate applied after the recurrent
 * product, "linear_before_reset").
 *
 * Parameters (checkpoint layout; gate order r, z, n along every 3H axis, as in PyTorch and
 * cuDNN):
 *   W    (sum_k F_k, 3H)  input weights, the inputs' rows stacked in `from` order  (glorot)
 *   U    (H, 3H)          recurrent weights                                       (orthogonal)
 *   b    (3H)             input bias b_ir, b_iz, b_in                             (zeros)
 *   b_h  (3H)             recurrent bias b_hr, b_hz, b_hn                         (zeros)
 * Copying weights from PyTorch's nn.GRU (layer 0; _reverse for the backward direction of a
 * bidirectional one): W = weight_ih_l0^T, U = weight_hh_l0^T, b = bias_ih_l0,
 * b_h = bias_hh_l0; to PyTorch the same transposes back. Both copies are exact: the two biases
 * are kept apart as in PyTorch, since b_hn sits inside the reset gate's product.
 *
 * Equations, step t in processing order (t = 0..T-1 for direction 1, T-1..0 for -1):
 *   r = sigmoid(x W_r + b_r + h_prev U_r + b_hr)   z = sigmoid(x W_z + b_z + h_prev U_z + b_hz)
 *   n = tanh(x W_n + b_n + r * (h_prev U_n + b_hn))   h_t = (1 - z) * n + z * h_prev
 *   (kernels/gru_cell.h), out_t = h_t on valid frames (t < len[b]), 0 on padded ones, which
 *   carry the state (h_t = h_prev): a backward GRU starts each sequence at its own last frame.
 * The initial state is zero or the one given with rl_gru_set_initial_state; backward starts from
 * a zero state gradient or the one given with rl_gru_set_final_state_grad. The state is the
 * layer's through the layer.h state ops (rl_recurrent_state_ops): "h".
 * Options (docs/layers.md), each off by default and then not touching the loops:
 *   zoneout (hidden): h_t = m h_prev + (1 - m) h~_t, m = Bernoulli(z) per unit and step in
 *   training, z in evaluation, inside the fused passes (kernels/gru.h);
 *   rec_dropout (training): the product h_prev U reads h_prev * m_d, m_d (B, H) one per
 *   sequence; the interpolation z h_prev keeps the undropped state.
 *
 * The layer is a cell of the recurrent driver (layers/recurrent.h), which owns the time loop, the
 * products, the buffers, the threads, the shared options, the devices and the cuDNN path
 * (impl = "cudnn": CUDNN_GRU, the same equations, the parameter mapping in
 * kernels/cudnn_layout.h; where cuDNN cannot serve, on CPU tensors or for sizes beyond its int
 * descriptors, the layer runs its own passes, so a model trained with cudnn runs on the CPU as it
 * is). This file holds what is the GRU's own: the gates buffer's blocks [r | z | hn | n]
 * (kernels/gru.h): the input weights' columns go in two blocks, [W_r | W_z] to r, z and W_n to
 * n, and one recurrent product h_prev U writes [r | z | hn] (hn receives it alone); backward
 * leaves [dar | daz | dhn | dan] there. Then the state "h", the biases b and b_h, and the fused
 * passes of kernels/gru.h (CPU) and kernels/cuda/gru_cuda.h (CUDA). The bias sums run in the
 * pointwise passes, or after the steps over all rows when the driver splits the batch's rows
 * over threads (rl_cell_step.dp).
 */
#include <stdbool.h>

#include "layer.h"
#include "layers.h"
#include "recurrent.h"

#include "../kernels/cudnn_layout.h"
#include "../kernels/gru.h"

enum { P_W, P_U, P_B, P_BH };

static void gru_fwd(const rl_cell_step *s) {
    if (s->dt == RL_FLOAT32)
        rl_gru_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, s->p[P_B], s->p[P_BH], s->prev[0],
                           s->cur[0], s->out, s->zo[0]);
    else
        rl_gru_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, s->p[P_B], s->p[P_BH], s->prev[0],
                           s->cur[0], s->out, s->zo[0]);
}

static void gru_bwd(const rl_cell_step *s) {
    void *db = s->dp ? s->dp[P_B] : NULL, *dbh = s->dp ? s->dp[P_BH] : NULL;
    if (s->dt == RL_FLOAT32)
        rl_gru_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                           s->dstate[0], db, dbh, s->zo[0]);
    else
        rl_gru_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                           s->dstate[0], db, dbh, s->zo[0]);
}

/* The bias sums the steps left (rows split over threads: float32 only). */
static void gru_sums(const rl_cell_sums *s) {
    if (!s->in_steps) rl_gru_cpu_bias_grads_f32(s->rows, s->H, s->g, s->dp[P_B], s->dp[P_BH]);
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/gru_cuda.h"

static rl_status gru_cuda_fwd(const rl_cell_pass *p) {
    return rl_gru_cuda_forward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                               p->U, p->p[P_B], p->p[P_BH], p->seq[0], p->out);
}

/* Also makes dU, db and db_h (their partial sums in p->red). */
static rl_status gru_cuda_bwd(const rl_cell_pass *p) {
    int64_t rshape[2] = {RL_GRU_CUDA_CHUNKS, 4 * p->H};
    RL_TRY(rl_buffer_ensure_synced(p->red, p->dt, p->dev, 2, rshape));
    return rl_gru_cuda_backward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                p->U, p->seq[0], p->dout, p->dout_ld, p->dstate[0], p->dU,
                                p->dp[P_B], p->dp[P_BH], rl_tensor_data(p->red));
}
#endif

/* b and b_h after W and U. */
static rl_status gru_create(rl_layer *l, const rl_options *o, bool cudnn) {
    (void)o, (void)cudnn;
    int64_t bs[1] = {3 * l->n_out};
    RL_TRY(rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    return rl_layer_add_param(l, "b_h", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
}

/* The cell, its fields in groups (clang-format would put one a line). */
/* clang-format off */
static const rl_cell gru_cell = {
    .ops = {RL_CELL_OPS, .class_name = "gru"},
    /* gates [r | z | hn | n]: W's [r z] columns to blocks 0-1, its n columns to block 3;
     * h_prev U (3H columns) into r, z, hn */
    .gate_blocks = 4, .rec_gates = 3, .n_in_blocks = 2, .in_blocks = {{0, 0, 2}, {2, 3, 1}},
    .n_states = 1, .state_names = {"h"},
    .cudnn = RL_CUDNN_GRU, .cudnn_fallback = true, .rec_dropout_first = true,
    .create = gru_create, .fwd = gru_fwd, .bwd = gru_bwd, .sums = gru_sums,
    .cuda_fwd = RL_CUDA_FN(gru_cuda_fwd), .cuda_bwd = RL_CUDA_FN(gru_cuda_bwd)};
/* clang-format on */

rl_status rl_gru_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                        const int64_t *in_dims) {
    return rl_recurrent_create(out, &gru_cell, name, opts, n_in, in_dims);
}
