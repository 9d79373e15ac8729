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
 *   sequence; the interpolation z h_prev keeps the undropped state;
 *   layer_norm (kernels/gru.h, the lstm's formulation, Ba et al. 2016 per gate block): the input
 *   part x W and the recurrent part h_prev U normalised per block of H apart, with gains g_x, g_h
 *   (3H, ones, parameters after b_h), before the biases:
 *   ar = LN(x W_r) g_xr + b_r + LN(h U_r) g_hr + b_hr (az alike),
 *   n = tanh(LN(x W_n) g_xn + b_n + r (LN(h U_n) g_hn + b_hn)); the recurrent product goes to its
 *   own buffer (the driver's rec_apart), a normalisation pass runs before the fused forward and
 *   after the fused backward (kernels/gru_ln_row.h, on CUDA one thread per row inside the
 *   launchers); not with impl = "cudnn".
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

enum { P_W, P_U, P_B, P_BH, P_GX, P_GH };
enum { OPT_LAYER_NORM };
/* layer_norm's frame buffers (rl_recurrent.frame): the recurrent part and its gradients first
 * (rec_apart), then the kernels/gru.h rl_gru_ln_f32 ones */
enum { F_HH, F_DZH, F_XH, F_RS, F_DG, N_FRAME };

/* The layer_norm kernels' view of a step's (or all frames') buffers; p: the params, or NULL. */
#define LN_VIEW(T, fb, p)                                                                          \
    (T) {                                                                                          \
        (fb)[F_XH], (fb)[F_HH], (fb)[F_RS], (fb)[F_DG], (fb)[F_DZH], (p) ? (p)[P_GX] : NULL,       \
            (p) ? (p)[P_GH] : NULL                                                                 \
    }

/* layer_norm: the normalisation pass of a step before the cell's forward or after its backward. */
static void gru_ln(const rl_cell_step *s, bool backward) {
    if (s->dt == RL_FLOAT32) {
        rl_gru_ln_f32 ln = LN_VIEW(rl_gru_ln_f32, s->fb, s->p);
        if (backward)
            rl_gru_ln_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, &ln);
        else
            rl_gru_ln_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, &ln);
    } else {
        rl_gru_ln_f64 ln = LN_VIEW(rl_gru_ln_f64, s->fb, s->p);
        if (backward)
            rl_gru_ln_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, &ln);
        else
            rl_gru_ln_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, &ln);
    }
}

static void gru_fwd(const rl_cell_step *s) {
    if (s->opt[OPT_LAYER_NORM] != 0) gru_ln(s, false);
    if (s->dt == RL_FLOAT32)
        rl_gru_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, s->p[P_B], s->p[P_BH], s->prev[0],
                           s->cur[0], s->out, s->zo[0]);
    else
        rl_gru_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, s->p[P_B], s->p[P_BH], s->prev[0],
                           s->cur[0], s->out, s->zo[0]);
}

/* With layer_norm the bias sums are gru_sums' (over the gradients before the normalisation's). */
static void gru_bwd(const rl_cell_step *s) {
    bool ln = s->opt[OPT_LAYER_NORM] != 0;
    void *db = s->dp && !ln ? s->dp[P_B] : NULL, *dbh = s->dp && !ln ? s->dp[P_BH] : NULL;
    if (s->dt == RL_FLOAT32)
        rl_gru_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                           s->dstate[0], db, dbh, s->zo[0]);
    else
        rl_gru_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                           s->dstate[0], db, dbh, s->zo[0]);
    if (ln) gru_ln(s, true);
}

/* The bias sums the steps left (rows split over threads: float32 only); with layer_norm the
 * biases' and the gains' over all frames. */
static void gru_sums(const rl_cell_sums *s) {
    if (s->opt[OPT_LAYER_NORM] != 0) {
        if (s->dt == RL_FLOAT32) {
            rl_gru_ln_f32 ln = LN_VIEW(rl_gru_ln_f32, s->fb, (const float *const *)NULL);
            rl_gru_ln_cpu_param_grads_f32(s->rows, s->H, &ln, s->dp[P_B], s->dp[P_BH], s->dp[P_GX],
                                          s->dp[P_GH]);
        } else {
            rl_gru_ln_f64 ln = LN_VIEW(rl_gru_ln_f64, s->fb, (const double *const *)NULL);
            rl_gru_ln_cpu_param_grads_f64(s->rows, s->H, &ln, s->dp[P_B], s->dp[P_BH], s->dp[P_GX],
                                          s->dp[P_GH]);
        }
    } else if (!s->in_steps) {
        rl_gru_cpu_bias_grads_f32(s->rows, s->H, s->g, s->dp[P_B], s->dp[P_BH]);
    }
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/gru_cuda.h"

/* layer_norm's buffers, gains and (backward) their gradients in the kernels' terms, or NULL. */
static const rl_gru_cuda_ln *cuda_ln(const rl_cell_pass *p, rl_gru_cuda_ln *ln) {
    if (p->opt[OPT_LAYER_NORM] == 0) return NULL;
    void *const *d = p->dp;
    *ln = (rl_gru_cuda_ln){p->fb[F_XH], p->fb[F_HH],        p->fb[F_RS],
                           p->fb[F_DG], p->fb[F_DZH],       p->p[P_GX],
                           p->p[P_GH],  d ? d[P_GX] : NULL, d ? d[P_GH] : NULL};
    return ln;
}

static rl_status gru_cuda_fwd(const rl_cell_pass *p) {
    rl_gru_cuda_ln ln;
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_gru_cuda_forward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                               p->U, p->p[P_B], p->p[P_BH], p->seq[0], p->out, cuda_ln(p, &ln), &o);
}

/* Also makes dU, db and db_h (their partial sums in p->red), with layer_norm the gains'
 * gradients. */
static rl_status gru_cuda_bwd(const rl_cell_pass *p) {
    int64_t rshape[2] = {RL_GRU_CUDA_CHUNKS, 4 * p->H};
    RL_TRY(rl_buffer_ensure_synced(p->red, p->dt, p->dev, 2, rshape));
    rl_gru_cuda_ln ln;
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_gru_cuda_backward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                p->U, p->seq[0], p->dout, p->dout_ld, p->dstate[0], p->dU,
                                p->dp[P_B], p->dp[P_BH], rl_tensor_data(p->red), cuda_ln(p, &ln),
                                &o);
}
#endif

/* layer_norm; b and b_h after W and U, then layer_norm's gains g_x, g_h (3H, ones). */
static rl_status gru_create(rl_layer *l, const rl_options *o, bool cudnn) {
    rl_recurrent *r = &((rl_recurrent_layer *)l)->rec;
    bool ln;
    RL_TRY(rl_opt_bool(o, l->name, "layer_norm", false, &ln));
    if (ln && cudnn)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option layer_norm and impl = \"cudnn\" do not go "
                                       "together (cuDNN's GRU has no layer normalisation; use "
                                       "impl = \"own\")",
                        l->name, r->cls);
    int64_t H = r->H, bs[1] = {3 * H};
    RL_TRY(rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    RL_TRY(rl_layer_add_param(l, "b_h", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    if (!ln) return RL_OK;
    RL_TRY(rl_layer_add_param(l, "g_x", 1, bs, RL_INIT_CONSTANT, 1.0, 0, 0, NULL));
    RL_TRY(rl_layer_add_param(l, "g_h", 1, bs, RL_INIT_CONSTANT, 1.0, 0, 0, NULL));
    const int64_t cols[N_FRAME] = {3 * H, 3 * H, 3 * H, 6, 4 * H};
    r->cell_opt[OPT_LAYER_NORM] = 1;
    rl_recurrent_rec_apart(r, N_FRAME, cols);
    return RL_OK;
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
