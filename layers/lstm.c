/* lstm: a long short-term memory layer over time-major sequences, forward or backward in time.
 *
 * Parameters (checkpoint layout; gate order i, f, g, o along every 4H axis, as in PyTorch and
 * cuDNN):
 *   W  (sum_k F_k, 4H)  input weights, the inputs' rows stacked in `from` order   (glorot)
 *   U  (H, 4H)          recurrent weights                                        (orthogonal)
 *   b  (4H)             bias                                                     (zeros)
 *   p_i, p_f, p_o (H)   peephole weights, only with peepholes = true             (zeros)
 * PyTorch's weight_ih_l0 is W^T, weight_hh_l0 is U^T, bias_ih_l0 + bias_hh_l0 is b. The
 * option forget_bias is the initial value of b's f block (the rest of b starts at 0).
 *
 * Equations, step t in processing order (t = 0..T-1 for direction 1, T-1..0 for -1):
 *   z_t = sum_k x_k,t W_k + h_prev U + b       (B, 4H)
 *   i, f, g, o, c_t, h_t = the cell of kernels/lstm_cell.h
 *   out_t = h_t on valid frames (t < len[b]), 0 on padded ones, which carry the state
 *   (c_t = c_prev, h_t = h_prev): a backward LSTM starts each sequence at its own last frame.
 * The initial state is zero or the one given with rl_lstm_set_initial_state; backward starts
 * from zero state gradients or the ones given with rl_lstm_set_final_state_grad (dLoss/dh_T and
 * dLoss/dc_T from beyond the last frame: a rec unit runs the layer one step at a time and hands
 * each step's state gradients to the step before). The state is the layer's through the layer.h
 * state ops (rl_recurrent_state_ops): "h", "c".
 * Options (docs/layers.md), each off by default and then not touching the loops above:
 *   zoneout: c_t = m_c c_prev + (1 - m_c) c~_t, h_t = m_h h_prev + (1 - m_h) o tanh(c~_t), c~_t the
 *   cell's new cell, m = Bernoulli(z) per unit and step in training, z in evaluation, inside
 *   the fused passes (kernels/lstm.h, rl_lstm_zo_f32);
 *   rec_dropout (training): z_t's product reads h_prev * m_d, m_d (B, H) one per sequence.
 *
 * The layer is a cell of the recurrent driver (layers/recurrent.h): the time loop, the products,
 * the buffers, the threads, the options shared by every cell, the devices and the cuDNN path
 * (impl = "cudnn": cuDNN 9's LSTM, no peepholes; the weights stay W, U, b in the layout above,
 * packed into cuDNN's weight space before every forward, so a checkpoint is the same whichever
 * impl trained it) are the driver's. This file holds what is the LSTM's own: the gate blocks
 * (one input block [i f g o] and one recurrent product into all four), the states "h", "c",
 * the parameters b and the peepholes, the fused pointwise passes of kernels/lstm.h (CPU, every
 * level) and kernels/cuda/lstm_cuda.h (CUDA), and the bias and peephole sums over all frames.
 * With zoneout the cell keeps one per-frame buffer, c~ (T, B, H): o's gate, tanh and p_o's
 * gradient read the cell before zoneout.
 */
#include <stdbool.h>

#include "layer.h"
#include "layers.h"
#include "recurrent.h"

#include "../kernels/cudnn_layout.h"
#include "../kernels/lstm.h"
#include "../kernels/ops.h"

enum { P_W, P_U, P_B, P_PI }; /* P_PI, P_PI + 1, P_PI + 2: p_i, p_f, p_o */
enum { OPT_FORGET_BIAS };

/* The peepholes' values (or gradients) p_i, p_f, p_o, or NULL without peepholes. */
static const void *const *peepholes(const rl_layer *l, const void *const *p) {
    return l->n_params > P_PI ? p + P_PI : NULL;
}

static void lstm_fwd(const rl_cell_step *s) {
    const void *const *peep = peepholes(s->l, s->p);
    if (s->dt == RL_FLOAT32) {
        rl_lstm_zo_f32 z = {s->zo[1], s->zo[0], s->aux[0]};
        rl_lstm_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, s->p[P_B], (const float *const *)peep,
                            s->prev[1], s->prev[0], s->cur[1], s->cur[0], s->out,
                            s->zoned ? &z : NULL);
    } else {
        rl_lstm_zo_f64 z = {s->zo[1], s->zo[0], s->aux[0]};
        rl_lstm_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, s->p[P_B], (const double *const *)peep,
                            s->prev[1], s->prev[0], s->cur[1], s->cur[0], s->out,
                            s->zoned ? &z : NULL);
    }
}

static void lstm_bwd(const rl_cell_step *s) {
    const void *const *peep = peepholes(s->l, s->p);
    if (s->dt == RL_FLOAT32) {
        rl_lstm_zo_f32 z = {s->zo[1], s->zo[0], s->aux[0]};
        rl_lstm_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, (const float *const *)peep, s->prev[1],
                            s->cur[1], s->dout, s->dout_ld, s->dstate[0], s->dstate[1],
                            s->zoned ? &z : NULL);
    } else {
        rl_lstm_zo_f64 z = {s->zo[1], s->zo[0], s->aux[0]};
        rl_lstm_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, (const double *const *)peep, s->prev[1],
                            s->cur[1], s->dout, s->dout_ld, s->dstate[0], s->dstate[1],
                            s->zoned ? &z : NULL);
    }
}

/* db and the peephole gradients over all frames (p_o multiplies c~ under zoneout). */
static void lstm_sums(const rl_cell_sums *s) {
    const void *c = s->zoned ? s->aux[0] : s->cur[1];
    void *const *dpeep = s->l->n_params > P_PI ? s->dp + P_PI : NULL;
    if (s->dt == RL_FLOAT32)
        rl_lstm_cpu_param_grads_f32(s->rows, s->H, s->g, s->prev[1], c, s->dp[P_B],
                                    (float *const *)dpeep);
    else
        rl_lstm_cpu_param_grads_f64(s->rows, s->H, s->g, s->prev[1], c, s->dp[P_B],
                                    (double *const *)dpeep);
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/lstm_cuda.h"

static rl_status lstm_cuda_fwd(const rl_cell_pass *p) {
    return rl_lstm_cuda_forward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                p->U, p->p[P_B], peepholes(p->l, p->p), p->seq[0], p->seq[1],
                                p->out);
}

/* Also makes dU, db and the peephole gradients (their partial sums in p->red). */
static rl_status lstm_cuda_bwd(const rl_cell_pass *p) {
    int64_t rshape[2] = {RL_LSTM_CUDA_CHUNKS, 7 * p->H};
    RL_TRY(rl_buffer_ensure_synced(p->red, p->dt, p->dev, 2, rshape));
    void *const *dpeep = p->l->n_params > P_PI ? p->dp + P_PI : NULL;
    return rl_lstm_cuda_backward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                 p->U, peepholes(p->l, p->p), p->seq[0], p->seq[1], p->dout,
                                 p->dout_ld, p->dstate[0], p->dstate[1], p->dU, p->dp[P_B], dpeep,
                                 rl_tensor_data(p->red));
}
#endif

/* peepholes, forget_bias; b and the peepholes after W and U. */
static rl_status lstm_create(rl_layer *l, const rl_options *o, bool cudnn) {
    rl_recurrent *r = &((rl_recurrent_layer *)l)->rec;
    bool peep;
    RL_TRY(rl_opt_bool(o, l->name, "peepholes", false, &peep));
    RL_TRY(rl_opt_number(o, l->name, "forget_bias", 0.0, &r->cell_opt[OPT_FORGET_BIAS]));
    if (cudnn && peep)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): peepholes = true and impl = \"cudnn\" do not go "
                        "together (cuDNN's LSTM has no peepholes; use impl = \"own\")",
                        l->name);
    int64_t H = l->n_out, bs[1] = {4 * H}, ps[1] = {H};
    RL_TRY(rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    const char *pn[3] = {"p_i", "p_f", "p_o"};
    for (int k = 0; k < 3 && peep; k++)
        RL_TRY(rl_layer_add_param(l, pn[k], 1, ps, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    return RL_OK;
}

/* b's f block starts at forget_bias (the other param inits are their kinds'). */
static rl_status lstm_init_params(rl_layer *l, rl_rng *g) {
    (void)g;
    double fb = ((rl_recurrent_layer *)l)->rec.cell_opt[OPT_FORGET_BIAS];
    if (fb == 0.0) return RL_OK;
    rl_tensor f = {0};
    RL_TRY(rl_tensor_narrow(&f, &l->params[P_B].value, 0, l->n_out, l->n_out));
    rl_status st = rl_op_fill(&f, fb);
    rl_tensor_release(&f);
    return st;
}

/* The cell, its fields in groups (clang-format would put one a line). */
/* clang-format off */
static const rl_cell lstm_cell = {
    .ops = {RL_CELL_OPS, .class_name = "lstm", .init_params = lstm_init_params},
    /* gates [i | f | g | o]: all of W's and U's columns in that order */
    .gate_blocks = 4, .rec_gates = 4, .n_in_blocks = 1, .in_blocks = {{0, 0, 4}},
    .n_states = 2, .state_names = {"h", "c"}, .n_aux = 1, /* c~ under zoneout */
    .cudnn = RL_CUDNN_LSTM,
    .create = lstm_create, .fwd = lstm_fwd, .bwd = lstm_bwd, .sums = lstm_sums,
    .cuda_fwd = RL_CUDA_FN(lstm_cuda_fwd), .cuda_bwd = RL_CUDA_FN(lstm_cuda_bwd)};
/* clang-format on */

rl_status rl_lstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims) {
    return rl_recurrent_create(out, &lstm_cell, name, opts, n_in, in_dims);
}
