/* lstm: a long short-term memory layer over time-major sequences, forward or backward in time.
 *
 * Parameters (checkpoint layout; gate order i, f, g, o along every 4H axis, as in PyTorch and
 * cuDNN):
 *   W  (sum_k F_k, 4H)  input weights, the inputs' rows stacked in `from` order   (glorot)
 *   U  (P, 4H)          recurrent weights                                        (orthogonal)
 *   b  (4H)             bias                                                     (zeros)
 *   p_i, p_f, p_o (H)   peephole weights, only with peepholes = true             (zeros)
 *   R  (H, P)           the recurrent projection, only with n_proj = P           (glorot)
 *   g_x, g_h (4H), g_c (H), b_c (H)  layer_norm's gains (ones) and cell bias (zeros)
 * H is the option n_out (the cell's units); P = n_proj, or H without it: the width of h, of the
 * output (base.n_out) and of the recurrent product's operand. PyTorch's weight_ih_l0 is W^T,
 * weight_hh_l0 is U^T, bias_ih_l0 + bias_hh_l0 is b, weight_hr_l0 (proj_size) is R^T. The
 * option forget_bias is the initial value of b's f block (the rest of b starts at 0).
 *
 * Equations, step t in processing order (t = 0..T-1 for direction 1, T-1..0 for -1):
 *   z_t = sum_k x_k,t W_k + h_prev U + b       (B, 4H)
 *   i, f, g, o, c_t, h_t = the cell of kernels/lstm_cell.h
 *   with n_proj (LSTMP, Sak et al. 2014): the cell's h is m_t (B, H), and h_t = m_t R (B, P)
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
 *   the fused passes (kernels/lstm.h, rl_lstm_zo_f32; on CUDA the step kernels of
 *   kernels/cuda/lstm.cu);
 *   rec_dropout (training): z_t's product reads h_prev * m_d, m_d (B, P) one per sequence;
 *   n_proj: above, the driver's projected state 0 (layers/recurrent.h; on CUDA inside the
 *   launchers of kernels/cuda/lstm_cuda.h); not with zoneout or impl = "cudnn" (errors at
 *   creation);
 *   layer_norm (Ba et al. 2016, per gate block; the formulas in kernels/lstm_cell.h):
 *   a_t = LN(x W; g_x) + LN(h_prev U; g_h) + b, the gates of a_t, c_t = f c_prev + i g,
 *   h_t = o tanh(LN(c_t; g_c) + b_c), LN without shift, eps 1e-5, biased variance (PyTorch's
 *   LayerNorm); the carried state is the unnormalised cell. The recurrent product goes to its
 *   own buffer (the driver's rec_apart), the fused passes of kernels/lstm.h (rl_lstm_ln_f32)
 *   keep their per-frame buffers in the driver's frame buffers (F_* below); on CUDA the row
 *   formulas of kernels/lstm_ln_row.h inside the launchers (one thread per row); not with
 *   peepholes, zoneout or impl = "cudnn".
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
enum { OPT_FORGET_BIAS, OPT_PEEPHOLES, OPT_LAYER_NORM };
/* layer_norm's frame buffers (rl_recurrent.frame): the recurrent part and its gradients first
 * (rec_apart), then the kernels/lstm.h rl_lstm_ln_f32 ones */
enum { F_HH, F_DZH, F_XH, F_CN, F_RS, F_DG, F_DU, N_FRAME };

/* The peepholes' values (or gradients) p_i, p_f, p_o, or NULL without peepholes. */
static const void *const *peepholes(const double *opt, const void *const *p) {
    return opt[OPT_PEEPHOLES] != 0 ? p + P_PI : NULL;
}

/* layer_norm's gains g_x, g_h, g_c and the cell's bias b_c: the last four parameters. */
static const void *const *ln_params(const rl_layer *l, const void *const *p) {
    return p + l->n_params - 4;
}

/* The layer_norm kernels' view of a step's (or all frames') buffers; g: the gains, or NULL. */
#define LN_VIEW(T, fb, g)                                                                          \
    (T) {                                                                                          \
        (fb)[F_XH], (fb)[F_HH], (fb)[F_CN], (fb)[F_RS], (fb)[F_DG], (fb)[F_DZH], (fb)[F_DU],       \
            (g) ? (g)[0] : NULL, (g) ? (g)[1] : NULL, (g) ? (g)[2] : NULL, (g) ? (g)[3] : NULL     \
    }

/* layer_norm's pass of a step (kernels/lstm.h), forward or backward. */
static void lstm_ln(const rl_cell_step *s, bool backward) {
    const void *const *g = ln_params(s->l, s->p);
    const void *cp = s->prev[1], *c = s->cur[1];
    if (s->dt == RL_FLOAT32) {
        rl_lstm_ln_f32 ln = LN_VIEW(rl_lstm_ln_f32, s->fb, g);
        if (backward)
            rl_lstm_ln_cpu_bwd_f32(s->n, s->H, s->t, s->len, s->g, cp, c, s->dout, s->dout_ld,
                                   s->dstate[0], s->dstate[1], &ln);
        else
            rl_lstm_ln_cpu_fwd_f32(s->n, s->H, s->t, s->len, s->g, s->p[P_B], cp, s->prev[0],
                                   s->cur[1], s->cur[0], s->out, &ln);
        return;
    }
    rl_lstm_ln_f64 ln = LN_VIEW(rl_lstm_ln_f64, s->fb, g);
    if (backward)
        rl_lstm_ln_cpu_bwd_f64(s->n, s->H, s->t, s->len, s->g, cp, c, s->dout, s->dout_ld,
                               s->dstate[0], s->dstate[1], &ln);
    else
        rl_lstm_ln_cpu_fwd_f64(s->n, s->H, s->t, s->len, s->g, s->p[P_B], cp, s->prev[0], s->cur[1],
                               s->cur[0], s->out, &ln);
}

static void lstm_fwd(const rl_cell_step *s) {
    const void *const *peep = peepholes(s->opt, s->p);
    if (s->opt[OPT_LAYER_NORM] != 0) {
        lstm_ln(s, false);
        return;
    }
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
    const void *const *peep = peepholes(s->opt, s->p);
    if (s->opt[OPT_LAYER_NORM] != 0) {
        lstm_ln(s, true);
        return;
    }
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

/* db and the peephole gradients over all frames (p_o multiplies c~ under zoneout); with
 * layer_norm db, the gains and b_c from the gates' and the normalised cell's gradients. */
static void lstm_sums(const rl_cell_sums *s) {
    if (s->opt[OPT_LAYER_NORM] != 0) {
        void *const *dg = s->dp + s->l->n_params - 4;
        if (s->dt == RL_FLOAT32) {
            rl_lstm_ln_f32 ln = LN_VIEW(rl_lstm_ln_f32, s->fb, (const float *const *)NULL);
            rl_lstm_ln_cpu_param_grads_f32(s->rows, s->H, &ln, s->dp[P_B], dg[0], dg[1], dg[2],
                                           dg[3]);
        } else {
            rl_lstm_ln_f64 ln = LN_VIEW(rl_lstm_ln_f64, s->fb, (const double *const *)NULL);
            rl_lstm_ln_cpu_param_grads_f64(s->rows, s->H, &ln, s->dp[P_B], dg[0], dg[1], dg[2],
                                           dg[3]);
        }
        return;
    }
    const void *c = s->zoned ? s->aux[0] : s->cur[1];
    void *const *dpeep = s->opt[OPT_PEEPHOLES] != 0 ? s->dp + P_PI : NULL;
    if (s->dt == RL_FLOAT32)
        rl_lstm_cpu_param_grads_f32(s->rows, s->H, s->g, s->prev[1], c, s->dp[P_B],
                                    (float *const *)dpeep);
    else
        rl_lstm_cpu_param_grads_f64(s->rows, s->H, s->g, s->prev[1], c, s->dp[P_B],
                                    (double *const *)dpeep);
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/lstm_cuda.h"

/* n_proj's buffers in the kernels' terms, or NULL without it. */
static const rl_lstm_cuda_proj *cuda_proj(const rl_cell_pass *p, rl_lstm_cuda_proj *pj) {
    if (!p->R) return NULL;
    *pj = (rl_lstm_cuda_proj){p->P, p->R, p->ms, p->mscr, p->drs, p->dm, p->dR};
    return pj;
}

/* layer_norm's buffers, gains and (backward) their gradients in the kernels' terms, or NULL. */
static const rl_lstm_cuda_ln *cuda_ln(const rl_cell_pass *p, rl_lstm_cuda_ln *ln) {
    if (p->opt[OPT_LAYER_NORM] == 0) return NULL;
    const void *const *g = ln_params(p->l, p->p);
    void *const *d = p->dp ? p->dp + p->l->n_params - 4 : (void *const[4]){NULL, NULL, NULL, NULL};
    *ln = (rl_lstm_cuda_ln){p->fb[F_XH],  p->fb[F_HH], p->fb[F_CN], p->fb[F_RS], p->fb[F_DG],
                            p->fb[F_DZH], p->fb[F_DU], g[0],        g[1],        g[2],
                            g[3],         d[0],        d[1],        d[2],        d[3]};
    return ln;
}

static rl_status lstm_cuda_fwd(const rl_cell_pass *p) {
    rl_lstm_cuda_proj pj;
    rl_lstm_cuda_ln ln;
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_lstm_cuda_forward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                p->U, p->p[P_B], peepholes(p->opt, p->p), p->seq[0], p->seq[1],
                                p->out, cuda_proj(p, &pj), cuda_ln(p, &ln), &o);
}

/* Also makes dU, db, the peephole gradients (their partial sums in p->red), with n_proj dR and
 * with layer_norm the gains' and b_c's gradients. */
static rl_status lstm_cuda_bwd(const rl_cell_pass *p) {
    int64_t rshape[2] = {RL_LSTM_CUDA_CHUNKS, 7 * p->H};
    RL_TRY(rl_buffer_ensure_synced(p->red, p->dt, p->dev, 2, rshape));
    void *const *dpeep = p->opt[OPT_PEEPHOLES] != 0 ? p->dp + P_PI : NULL;
    rl_lstm_cuda_proj pj;
    rl_lstm_cuda_ln ln;
    rl_cuda_rec_opts o;
    rl_recurrent_cuda_opts(p, &o);
    return rl_lstm_cuda_backward(p->stream, p->dt, p->T, p->B, p->H, p->direction, p->len, p->gates,
                                 p->U, peepholes(p->opt, p->p), p->seq[0], p->seq[1], p->dout,
                                 p->dout_ld, p->dstate[0], p->dstate[1], p->dU, p->dp[P_B], dpeep,
                                 rl_tensor_data(p->red), cuda_proj(p, &pj), cuda_ln(p, &ln), &o);
}
#endif

/* peepholes, forget_bias, layer_norm; after W and U: b, the peepholes, n_proj's R (the
 * driver's), layer_norm's g_x, g_h (4H, ones), g_c (H, ones), b_c (H, zeros). */
static rl_status lstm_create(rl_layer *l, const rl_options *o, bool cudnn) {
    rl_recurrent *r = &((rl_recurrent_layer *)l)->rec;
    bool peep, ln;
    RL_TRY(rl_opt_bool(o, l->name, "peepholes", false, &peep));
    RL_TRY(rl_opt_number(o, l->name, "forget_bias", 0.0, &r->cell_opt[OPT_FORGET_BIAS]));
    if (cudnn && peep)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE
                        ": peepholes = true and impl = \"cudnn\" do not go "
                        "together (cuDNN's LSTM has no peepholes; use impl = \"own\")",
                        l->name, "lstm");
    RL_TRY(rl_opt_bool(o, l->name, "layer_norm", false, &ln));
    const char *without = cudnn                     ? "impl = \"cudnn\""
                          : peep                    ? "peepholes"
                          : r->zo[0] + r->zo[1] > 0 ? "zoneout"
                                                    : NULL;
    if (ln && without)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option layer_norm and %s do not go together (%s)",
                        l->name, r->cls, without,
                        cudnn ? "cuDNN's LSTM has no layer normalisation; use impl = \"own\""
                              : "not implemented");
    r->cell_opt[OPT_PEEPHOLES] = peep;
    r->cell_opt[OPT_LAYER_NORM] = ln;
    int64_t H = r->H, bs[1] = {4 * H}, ps[1] = {H};
    RL_TRY(rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    const char *pn[3] = {"p_i", "p_f", "p_o"};
    for (int k = 0; k < 3 && peep; k++)
        RL_TRY(rl_layer_add_param(l, pn[k], 1, ps, RL_INIT_ZEROS, 0.0, 0, 0, NULL));
    RL_TRY(rl_recurrent_add_proj(l));
    if (!ln) return RL_OK;
    const char *gn[4] = {"g_x", "g_h", "g_c", "b_c"};
    for (int k = 0; k < 4; k++) {
        int64_t gs[1] = {k < 2 ? 4 * H : H};
        RL_TRY(rl_layer_add_param(l, gn[k], 1, gs, k < 3 ? RL_INIT_CONSTANT : RL_INIT_ZEROS,
                                  k < 3 ? 1.0 : 0.0, 0, 0, NULL));
    }
    const int64_t cols[N_FRAME] = {4 * H, 4 * H, 4 * H, H, 9, 4 * H, H};
    rl_recurrent_rec_apart(r, N_FRAME, cols);
    return RL_OK;
}

/* b's f block starts at forget_bias (the other param inits are their kinds'). */
static rl_status lstm_init_params(rl_layer *l, rl_rng *g) {
    (void)g;
    double fb = ((rl_recurrent_layer *)l)->rec.cell_opt[OPT_FORGET_BIAS];
    if (fb == 0.0) return RL_OK;
    rl_tensor f = {0};
    int64_t H = ((rl_recurrent_layer *)l)->rec.H;
    RL_TRY(rl_tensor_narrow(&f, &l->params[P_B].value, 0, H, H));
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
    .cudnn = RL_CUDNN_LSTM, .proj = true,
    .create = lstm_create, .fwd = lstm_fwd, .bwd = lstm_bwd, .sums = lstm_sums,
    .cuda_fwd = RL_CUDA_FN(lstm_cuda_fwd), .cuda_bwd = RL_CUDA_FN(lstm_cuda_bwd)};
/* clang-format on */

rl_status rl_lstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims) {
    return rl_recurrent_create(out, &lstm_cell, name, opts, n_in, in_dims);
}
