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
 * which overwrites them with [ds | da | 0]. The pointwise passes below run on the CPU at the
 * build's level (float32 and float64) from the shared formulas of kernels/pointwise.h; the cell
 * has no CUDA launchers, so on CUDA tensors forward stops with an error naming the layer.
 */
#include <stdbool.h>

#include "layer.h"
#include "layers.h"
#include "recurrent.h"

#include "../kernels/pointwise.h"

enum { P_W, P_U, P_B };
enum { OPT_BETA };

/* Element i of a float32 or float64 row. */
static inline double get(const void *p, int64_t i, bool f32) {
    return f32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline void put(void *p, int64_t i, double v, bool f32) {
    if (f32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

static void janet_fwd(const rl_cell_step *s) {
    bool f32 = s->dt == RL_FLOAT32;
    int64_t H = s->H;
    double beta = s->opt[OPT_BETA];
    for (int64_t b = 0; b < s->n; b++) {
        int64_t r = b * H, gr = b * 3 * H;
        bool valid = s->t < s->len[b];
        for (int64_t j = 0; j < H; j++) {
            double hp = get(s->prev[0], r + j, f32);
            if (!valid) {
                put(s->cur[0], r + j, hp, f32);
                put(s->out, r + j, 0.0, f32);
                continue;
            }
            double sf = get(s->g, gr + j, f32) + get(s->p[P_B], j, f32);
            double a = get(s->g, gr + H + j, f32) + get(s->p[P_B], H + j, f32);
            double f = rl_sigmoid(sf), i = 1.0 - rl_sigmoid(sf - beta), c = tanh(a);
            double h = f * hp + i * c;
            if (s->zo[0]) h = rl_zoneout(get(s->zo[0], r + j, f32), hp, h);
            put(s->g, gr + j, f, f32);
            put(s->g, gr + H + j, c, f32);
            put(s->g, gr + 2 * H + j, i, f32);
            put(s->cur[0], r + j, h, f32);
            put(s->out, r + j, h, f32);
        }
    }
}

static void janet_bwd(const rl_cell_step *s) {
    bool f32 = s->dt == RL_FLOAT32;
    int64_t H = s->H;
    for (int64_t b = 0; b < s->n; b++) {
        int64_t r = b * H, gr = b * 3 * H;
        bool valid = s->t < s->len[b];
        for (int64_t j = 0; j < H; j++) {
            if (!valid) { /* dZ = 0; the state's gradient passes through */
                for (int q = 0; q < 3; q++)
                    put(s->g, gr + q * H + j, 0.0, f32);
                continue;
            }
            double dh = get(s->dstate[0], r + j, f32);
            if (s->dout) dh += get(s->dout, b * s->dout_ld + j, f32);
            double direct = 0.0;
            if (s->zo[0]) { /* h = m h_prev + (1 - m) h~ */
                double m = get(s->zo[0], r + j, f32);
                direct = m * dh;
                dh *= 1.0 - m;
            }
            double hp = get(s->prev[0], r + j, f32), f = get(s->g, gr + j, f32);
            double c = get(s->g, gr + H + j, f32), i = get(s->g, gr + 2 * H + j, f32);
            put(s->g, gr + j, dh * (hp * rl_dsigmoid(f) - c * rl_dsigmoid(i)), f32);
            put(s->g, gr + H + j, dh * i * rl_dtanh(c), f32);
            put(s->g, gr + 2 * H + j, 0.0, f32);
            put(s->dstate[0], r + j, direct + dh * f, f32);
        }
    }
}

/* db += the column sums of [ds | da] over all frames. */
static void janet_sums(const rl_cell_sums *s) {
    bool f32 = s->dt == RL_FLOAT32;
    int64_t H = s->H;
    for (int64_t j = 0; j < 2 * H; j++) {
        double sum = 0.0;
        for (int64_t row = 0; row < s->rows; row++)
            sum += get(s->g, row * 3 * H + j, f32);
        put(s->dp[P_B], j, get(s->dp[P_B], j, f32) + sum, f32);
    }
}

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
    .create = janet_create, .fwd = janet_fwd, .bwd = janet_bwd, .sums = janet_sums};
/* clang-format on */

rl_status rl_janet_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                          const int64_t *in_dims) {
    return rl_recurrent_create(out, &janet_cell, name, opts, n_in, in_dims);
}
