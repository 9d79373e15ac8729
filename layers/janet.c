/* janet: a forget-gate-only LSTM, "JANET" (J. van der Westhuizen and J. Lasenby, "The
 * unreasonable effectiveness of the forget gate", arXiv:1804.04849, 2018), over time-major
 * sequences, forward or backward in time. One gate instead of the LSTM's four, and the state is
 * the cell: a cell of the recurrent driver written as one file (docs/architecture.md, "Adding
 * your own cell").
 *
 * Parameters (gate order f, c along every 2H axis):
 *   W  (sum_k F_k, 2H)  input weights, the inputs' rows stacked in `from` order   (glorot)
 *   U  (H, 2H)          recurrent weights                                        (orthogonal)
 *   b  (2H)             bias b_f, b_c                                            (zeros)
 *
 * Equations, step t in processing order (t = 0..T-1 for direction 1, T-1..0 for -1), the
 * paper's eqs. 8-11 with h = c:
 *   s   = x_t W_f + h_prev U_f + b_f
 *   c~  = tanh(x_t W_c + h_prev U_c + b_c)
 *   h_t = sigmoid(s) * h_prev + (1 - sigmoid(s - beta)) * c~
 * beta (option, default 1 as in the paper) shifts the input gate against the forget gate. out_t
 * = h_t on valid frames (t < len[b]), 0 on padded ones, which carry the state. The state is "h";
 * zoneout (hidden), rec_dropout and weight_dropout are the driver's, as for every cell.
 *
 * Gradients, with dh the gradient of h_t (from out_t and the step after), f = sigmoid(s),
 * i = 1 - sigmoid(s - beta):
 *   ds = dh (h_prev f (1 - f) - c~ (1 - i) i)     da = dh i (1 - c~^2)     dh_prev = dh f
 * plus ds, da through U (the driver's product).
 *
 * Buffers: the gates buffer (T, B, 3H) holds, per row, [s | a] on entry of a step (input
 * projection plus recurrent product, no bias), then the activations [f | c~ | i] for backward,
 * which overwrites them with [ds | da | 0]. The formulas are kernels/janet_cell.h's, one
 * definition for the CPU's fused passes (kernels/janet.h, float32 at every CPU level, and
 * float64) and the CUDA kernels (kernels/cuda/janet_cuda.h, whose launchers run one direction's
 * whole recurrence, zoneout and rec_dropout inside, as for every cell).
 */
#include <stdbool.h>

#include "layer.h"
#include "layers.h"
#include "recurrent.h"

#include "../kernels/janet.h"

enum { P_W, P_U, P_B };
enum { OPT_BETA };

static void janet_fwd(const rl_cell_step *s) {
    double beta = s->opt[OPT_BETA];
    if (s->dt == RL_FLOAT32)
        rl_janet_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, s->p[P_B], (float)beta, s->prev[0],
                             s->cur[0], s->out, s->zo[0]);
    else
        rl_janet_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, s->p[P_B], beta, s->prev[0], s->cur[0],
                             s->out, s->zo[0]);
}

static void janet_bwd(const rl_cell_step *s) {
    if (s->dt == RL_FLOAT32)
        rl_janet_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                             s->dstate[0], s->zo[0]);
    else
        rl_janet_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, s->prev[0], s->dout, s->dout_ld,
                             s->dstate[0], s->zo[0]);
}

/* db += the column sums of [ds | da] over all frames. */
static void janet_sums(const rl_cell_sums *s) {
    if (s->dt == RL_FLOAT32)
        rl_janet_cpu_bias_grads_f32(s->rows, s->H, s->g, s->dp[P_B]);
    else
        rl_janet_cpu_bias_grads_f64(s->rows, s->H, s->g, s->dp[P_B]);
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/janet_cuda.h"

static rl_status janet_cuda_fwd(const rl_cell_pass *p) {
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_janet_cuda_forward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                 p->U, p->p[P_B], p->opt[OPT_BETA], p->seq[0], p->out, &o);
}

/* Also makes dU and db (their partial sums in p->red). */
static rl_status janet_cuda_bwd(const rl_cell_pass *p) {
    int64_t rshape[2] = {RL_JANET_CUDA_CHUNKS, 3 * p->H};
    RL_TRY(rl_buffer_ensure_synced(p->red, p->dt, p->dev, 2, rshape));
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_janet_cuda_backward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len,
                                  p->gates, p->U, p->seq[0], p->dout, p->dout_ld, p->dstate[0],
                                  p->dU, p->dp[P_B], rl_tensor_data(p->red), &o);
}
#endif

/* beta; b after W and U. */
static rl_status janet_create(rl_layer *l, const rl_options *o, bool cudnn) {
    (void)cudnn;
    RL_TRY(
        rl_opt_number(o, l->name, "beta", 1.0, &((rl_recurrent_layer *)l)->rec.cell_opt[OPT_BETA]));
    int64_t bs[1] = {2 * l->n_out};
    return rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
}

/* The cell, its fields in groups (clang-format would put one a line). */
/* clang-format off */
static const rl_cell janet_cell = {
    .ops = {RL_CELL_OPS, .class_name = "janet"},
    /* gates [f | c~ | i]: W's and U's 2H columns into [s | a]; i kept for backward */
    .gate_blocks = 3, .rec_gates = 2, .n_in_blocks = 1, .in_blocks = {{0, 0, 2}},
    .n_states = 1, .state_names = {"h"},
    .cudnn = -1,
    .create = janet_create, .fwd = janet_fwd, .bwd = janet_bwd, .sums = janet_sums,
    .cuda_fwd = RL_CUDA_FN(janet_cuda_fwd), .cuda_bwd = RL_CUDA_FN(janet_cuda_bwd)};
/* clang-format on */

rl_status rl_janet_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                          const int64_t *in_dims) {
    return rl_recurrent_create(out, &janet_cell, name, opts, n_in, in_dims);
}
