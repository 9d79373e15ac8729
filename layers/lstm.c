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
 * The initial state is zero or the one given with rl_lstm_set_initial_state.
 *
 * Cost: the input projection of all frames is one GEMM per input; each step is one
 * recurrent GEMM (B, H) x (H, 4H) into the step's rows of z and one fused pointwise pass
 * (kernels/cpu/lstm.c). Backward runs one pointwise pass (dz_t, in place of the gates) and one
 * GEMM dz_t U^T per step, then dW_k = X_k^T dZ, dU = Hprev^T dZ and dX_k = dZ W_k^T as single
 * GEMMs over all frames. In float32 on an AVX-512 CPU the per-step products use
 * kernels/cpu/gemm_small.c with U (forward) or U^T (backward) packed once per pass, split
 * over the BLAS thread count: a BLAS call would repack U on every step and runs those
 * few-row products at a fraction of its speed; float64 and other CPUs use BLAS throughout.
 *
 * Buffers (sized per batch shape with rl_buffer_ensure; all kept from forward for backward):
 *   gates (T, B, 4H)     pre-activations, then activations; backward overwrites them with dZ
 *   hs, cs (T+1, B, H)   states in time order plus the initial state: for direction 1 row 0
 *                        is the initial state and row t+1 the state after frame t; for -1 row
 *                        t is the state after frame t and row T the initial one. So the
 *                        previous states of all frames are rows 0..T-1 (1) or 1..T (-1).
 *   dh, dc (B, H)        backward's running state gradients; at the end the gradients of the
 *                        initial state
 *   upack                U or U^T in gemm_small.h's packed layout (float32 only)
 *   xs[k], dxs[k]        contiguous copies, only for inputs (or input gradients) whose (T, B)
 *                        dims cannot be folded into one
 * The work runs on CPU tensors; the device-specific parts are gemm() and the two pointwise
 * calls, where a CUDA path will branch.
 */
#include <inttypes.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../core/blas.h"
#include "../kernels/cpu/gemm_small.h"
#include "../kernels/lstm.h"
#include "../kernels/ops.h"

enum { P_W, P_U, P_B, P_PI, P_PF, P_PO };

typedef struct {
    rl_layer base;
    int direction;
    bool peepholes;
    double forget_bias;
    rl_tensor h0, c0; /* the given initial state (shared views), or unset */
    rl_tensor gates, hs, cs, dh, dc;
    rl_tensor upack; /* U (forward) or U^T (backward) packed for the per-step product */
    rl_tensor gout;  /* a contiguous copy of grad_out when it cannot be folded */
    rl_tensor xs[RL_LAYER_MAX_INPUTS], dxs[RL_LAYER_MAX_INPUTS];
    int64_t T, B; /* of the last forward */
    bool have_forward;
} lstm_layer;

static const rl_layer_ops lstm_ops;

/* A row-major matrix operand: pointer and leading dimension. */
typedef struct {
    void *p;
    int64_t ld;
} mat;

/* c = alpha op(a) op(b) + beta c on raw host pointers. */
static void gemm(rl_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, mat a, mat b,
                 double beta, mat c) {
    if (m == 0 || n == 0) return;
    if (dt == RL_FLOAT32)
        rl_blas_sgemm(ta, tb, m, n, k, 1.0f, a.p, a.ld, b.p, b.ld, (float)beta, c.p, c.ld);
    else
        rl_blas_dgemm(ta, tb, m, n, k, 1.0, a.p, a.ld, b.p, b.ld, beta, c.p, c.ld);
}

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

/* x (T, B, F) as a (T*B, F) matrix without a copy when its strides allow. */
static bool fold_tb(const rl_tensor *x, mat *m) {
    if (x->shape[2] > 1 && x->stride[2] != 1) return false;
    if (x->shape[0] > 1 && x->stride[0] != x->shape[1] * x->stride[1]) return false;
    int64_t ld = x->shape[1] > 1 ? x->stride[1] : (x->shape[0] > 1 ? x->stride[0] : x->shape[2]);
    if (ld < x->shape[2]) return false;
    m->p = rl_tensor_data(x);
    m->ld = ld > 0 ? ld : 1;
    return true;
}

/* A parameter's value or gradient as a contiguous host matrix (the network's flat buffers
 * give contiguous views). */
static rl_status param_mat(const lstm_layer *L, const rl_tensor *t, const char *pname, rl_dtype dt,
                           mat *m) {
    char s[96];
    if (!t->storage || !rl_tensor_is_contiguous(t) || t->dtype != dt ||
        rl_tensor_device(t).type != RL_CPU)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): parameter %s must be a contiguous %s CPU tensor, "
                        "got %s",
                        L->base.name, pname, rl_dtype_name(dt),
                        t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing");
    m->p = rl_tensor_data(t);
    m->ld = t->ndim == 2 ? t->shape[1] : 1;
    return RL_OK;
}

static rl_status check_state(const lstm_layer *L, const rl_tensor *s, const char *what, int64_t B) {
    char buf[96];
    int64_t H = L->base.n_out;
    if (s->ndim != 2 || s->shape[0] != B || s->shape[1] != H)
        return rl_error(RL_ESHAPE,
                        "layer '%s' (lstm): initial %s is %s, expected (%" PRId64 ", %" PRId64
                        ") for this batch",
                        L->base.name, what, rl_shape_str(s, buf, sizeof buf), B, H);
    return RL_OK;
}

static rl_status lstm_forward(rl_layer *l, rl_layer_io *io) {
    lstm_layer *L = (lstm_layer *)l;
    int64_t T, B, H = l->n_out;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    rl_dtype dt = io->in[0]->dtype;
    rl_device dev = rl_tensor_device(io->in[0]);
    if (dev.type != RL_CPU)
        return rl_error(RL_EDEVICE, "layer '%s' (lstm): only CPU tensors are supported so far",
                        l->name);
    mat W, U, bias;
    const void *peep[3];
    RL_TRY(param_mat(L, &l->params[P_W].value, "W", dt, &W));
    RL_TRY(param_mat(L, &l->params[P_U].value, "U", dt, &U));
    RL_TRY(param_mat(L, &l->params[P_B].value, "b", dt, &bias));
    for (int k = 0; k < 3 && L->peepholes; k++) {
        mat pm;
        RL_TRY(param_mat(L, &l->params[P_PI + k].value, l->params[P_PI + k].name, dt, &pm));
        peep[k] = pm.p;
    }
    if (L->h0.storage) RL_TRY(check_state(L, &L->h0, "h", B));
    if (L->c0.storage) RL_TRY(check_state(L, &L->c0, "c", B));

    int64_t gshape[3] = {T, B, 4 * H}, sshape[3] = {T + 1, B, H}, oshape[3] = {T, B, H};
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, oshape));
    RL_TRY(rl_buffer_ensure(&L->gates, dt, dev, 3, gshape));
    RL_TRY(rl_buffer_ensure(&L->hs, dt, dev, 3, sshape));
    RL_TRY(rl_buffer_ensure(&L->cs, dt, dev, 3, sshape));
    L->T = T;
    L->B = B;
    L->have_forward = false;

    /* the initial state row */
    int64_t init_row = L->direction > 0 ? 0 : T;
    rl_tensor hrow = {0}, crow = {0};
    RL_TRY(rl_tensor_select(&hrow, &L->hs, 0, init_row));
    rl_status st = rl_tensor_select(&crow, &L->cs, 0, init_row);
    if (st == RL_OK) st = L->h0.storage ? rl_op_copy(&hrow, &L->h0) : rl_op_fill(&hrow, 0.0);
    if (st == RL_OK) st = L->c0.storage ? rl_op_copy(&crow, &L->c0) : rl_op_fill(&crow, 0.0);
    rl_tensor_release(&hrow);
    rl_tensor_release(&crow);
    RL_TRY(st);

    /* input projection of all frames: one GEMM per input, accumulated */
    mat Z = {rl_tensor_data(&L->gates), 4 * H};
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        mat X;
        if (!fold_tb(io->in[k], &X)) {
            RL_TRY(rl_buffer_ensure(&L->xs[k], dt, dev, 3, io->in[k]->shape));
            RL_TRY(rl_op_copy(&L->xs[k], io->in[k]));
            X = (mat){rl_tensor_data(&L->xs[k]), l->in_dims[k]};
        }
        mat Wk = {(char *)W.p + (size_t)(row * 4 * H) * rl_dtype_size(dt), 4 * H};
        gemm(dt, false, false, T * B, 4 * H, l->in_dims[k], X, Wk, k ? 1.0 : 0.0, Z);
        row += l->in_dims[k];
    }
    if (io->n_in == 0) RL_TRY(rl_op_fill(&L->gates, 0.0));

    const int32_t *len = rl_tensor_data(io->lengths);
    int64_t BH = B * H;
    bool packed = dt == RL_FLOAT32 && rl_gemm_packed_fast();
    if (packed) {
        int64_t n = rl_gemm_packed_size(H, 4 * H);
        RL_TRY(rl_buffer_ensure(&L->upack, RL_FLOAT32, dev, 1, &n));
        rl_gemm_pack_f32(rl_tensor_data(&L->upack), U.p, 4 * H, false, H, 4 * H);
    }
    for (int64_t s = 0; s < T; s++) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1, cur = L->direction > 0 ? t + 1 : t;
        mat Hp = {at(&L->hs, prev * BH), H}, Zt = {at(&L->gates, t * B * 4 * H), 4 * H};
        if (packed)
            rl_gemm_packed_f32(B, 4 * H, H, Hp.p, H, rl_tensor_data(&L->upack), true, Zt.p, 4 * H);
        else
            gemm(dt, false, false, B, 4 * H, H, Hp, U, 1.0, Zt);
        if (dt == RL_FLOAT32)
            rl_lstm_cpu_fwd_f32(B, H, t, len, Zt.p, bias.p,
                                L->peepholes ? (const float *const *)peep : NULL,
                                at(&L->cs, prev * BH), Hp.p, at(&L->cs, cur * BH),
                                at(&L->hs, cur * BH), at(&l->out, t * BH));
        else
            rl_lstm_cpu_fwd_f64(B, H, t, len, Zt.p, bias.p,
                                L->peepholes ? (const double *const *)peep : NULL,
                                at(&L->cs, prev * BH), Hp.p, at(&L->cs, cur * BH),
                                at(&L->hs, cur * BH), at(&l->out, t * BH));
    }
    L->have_forward = true;
    return RL_OK;
}

static rl_status lstm_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                               rl_tensor *const *grad_in) {
    lstm_layer *L = (lstm_layer *)l;
    int64_t T = L->T, B = L->B, H = l->n_out, BH = B * H;
    char s1[96];
    if (!L->have_forward)
        return rl_error(RL_EARG, "layer '%s' (lstm): backward without a forward", l->name);
    rl_dtype dt = L->gates.dtype;
    rl_device dev = rl_tensor_device(&L->gates);
    mat dout = {NULL, 0};
    if (grad_out) {
        if (grad_out->ndim != 3 || grad_out->shape[0] != T || grad_out->shape[1] != B ||
            grad_out->shape[2] != H || grad_out->dtype != dt ||
            rl_tensor_device(grad_out).type != RL_CPU)
            return rl_error(RL_ESHAPE,
                            "layer '%s' (lstm): grad_out is %s, expected (%" PRId64 ", %" PRId64
                            ", %" PRId64 ") %s",
                            l->name, rl_tensor_describe(grad_out, s1, sizeof s1), T, B, H,
                            rl_dtype_name(dt));
        if (!fold_tb(grad_out, &dout)) {
            RL_TRY(rl_buffer_ensure(&L->gout, dt, dev, 3, grad_out->shape));
            RL_TRY(rl_op_copy(&L->gout, grad_out));
            dout = (mat){rl_tensor_data(&L->gout), H};
        }
    }
    mat W, U, dW, dU, db;
    void *peep[3], *dpeep[3];
    RL_TRY(param_mat(L, &l->params[P_W].value, "W", dt, &W));
    RL_TRY(param_mat(L, &l->params[P_U].value, "U", dt, &U));
    RL_TRY(param_mat(L, &l->params[P_W].grad, "W (gradient)", dt, &dW));
    RL_TRY(param_mat(L, &l->params[P_U].grad, "U (gradient)", dt, &dU));
    RL_TRY(param_mat(L, &l->params[P_B].grad, "b (gradient)", dt, &db));
    for (int k = 0; k < 3 && L->peepholes; k++) {
        mat pm, gm;
        RL_TRY(param_mat(L, &l->params[P_PI + k].value, l->params[P_PI + k].name, dt, &pm));
        RL_TRY(param_mat(L, &l->params[P_PI + k].grad, l->params[P_PI + k].name, dt, &gm));
        peep[k] = pm.p;
        dpeep[k] = gm.p;
    }
    int64_t sshape[2] = {B, H};
    RL_TRY(rl_buffer_ensure(&L->dh, dt, dev, 2, sshape));
    RL_TRY(rl_buffer_ensure(&L->dc, dt, dev, 2, sshape));
    RL_TRY(rl_op_fill(&L->dh, 0.0));
    RL_TRY(rl_op_fill(&L->dc, 0.0));
    L->have_forward = false; /* the gates become dZ */

    const int32_t *len = rl_tensor_data(io->lengths);
    mat dH = {rl_tensor_data(&L->dh), H};
    bool packed = dt == RL_FLOAT32 && rl_gemm_packed_fast();
    if (packed) {
        int64_t n = rl_gemm_packed_size(4 * H, H);
        RL_TRY(rl_buffer_ensure(&L->upack, RL_FLOAT32, dev, 1, &n));
        rl_gemm_pack_f32(rl_tensor_data(&L->upack), U.p, 4 * H, true, 4 * H, H);
    }
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1, cur = L->direction > 0 ? t + 1 : t;
        mat Zt = {at(&L->gates, t * B * 4 * H), 4 * H};
        const void *dot =
            dout.p ? (char *)dout.p + (size_t)(t * B * dout.ld) * rl_dtype_size(dt) : NULL;
        if (dt == RL_FLOAT32)
            rl_lstm_cpu_bwd_f32(
                B, H, t, len, Zt.p, L->peepholes ? (const float *const *)peep : NULL,
                at(&L->cs, prev * BH), at(&L->cs, cur * BH), dot, dout.ld, dH.p,
                rl_tensor_data(&L->dc), db.p, L->peepholes ? (float *const *)dpeep : NULL);
        else
            rl_lstm_cpu_bwd_f64(
                B, H, t, len, Zt.p, L->peepholes ? (const double *const *)peep : NULL,
                at(&L->cs, prev * BH), at(&L->cs, cur * BH), dot, dout.ld, dH.p,
                rl_tensor_data(&L->dc), db.p, L->peepholes ? (double *const *)dpeep : NULL);
        /* padded rows of dZ_t are 0, so their dh passes through unchanged */
        if (packed)
            rl_gemm_packed_f32(B, H, 4 * H, Zt.p, 4 * H, rl_tensor_data(&L->upack), true, dH.p, H);
        else
            gemm(dt, false, true, B, H, 4 * H, Zt, U, 1.0, dH);
    }

    /* weight gradients and input gradients: single GEMMs over all frames */
    mat dZ = {rl_tensor_data(&L->gates), 4 * H};
    mat Hprev = {at(&L->hs, L->direction > 0 ? 0 : BH), H};
    gemm(dt, true, false, H, 4 * H, T * B, Hprev, dZ, 1.0, dU);
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        size_t off = (size_t)(row * 4 * H) * rl_dtype_size(dt);
        mat X;
        if (!fold_tb(io->in[k], &X)) X = (mat){rl_tensor_data(&L->xs[k]), F};
        gemm(dt, true, false, F, 4 * H, T * B, X, dZ, 1.0, (mat){(char *)dW.p + off, 4 * H});
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi) {
            if (!rl_tensor_same_shape(gi, io->in[k]) || gi->dtype != dt)
                return rl_error(RL_ESHAPE, "layer '%s' (lstm): grad_in[%d] is %s, expected %s",
                                l->name, k + 1, rl_tensor_describe(gi, s1, sizeof s1),
                                rl_tensor_describe(io->in[k], s1 + 48, 48));
            mat G;
            bool direct = fold_tb(gi, &G);
            if (!direct) {
                RL_TRY(rl_buffer_ensure(&L->dxs[k], dt, dev, 3, gi->shape));
                G = (mat){rl_tensor_data(&L->dxs[k]), F};
            }
            gemm(dt, false, true, T * B, F, 4 * H, dZ, (mat){(char *)W.p + off, 4 * H}, 0.0, G);
            if (!direct) RL_TRY(rl_op_copy(gi, &L->dxs[k]));
        }
        row += F;
    }
    return RL_OK;
}

static void lstm_destroy(rl_layer *l) {
    lstm_layer *L = (lstm_layer *)l;
    rl_tensor *ts[] = {&L->h0, &L->c0, &L->gates, &L->hs,   &L->cs,
                       &L->dh, &L->dc, &L->gout,  &L->upack};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    for (int k = 0; k < RL_LAYER_MAX_INPUTS; k++) {
        rl_tensor_release(&L->xs[k]);
        rl_tensor_release(&L->dxs[k]);
    }
}

/* b's f block starts at forget_bias (the other param inits are their kinds'). */
static rl_status lstm_init_params(rl_layer *l, rl_rng *g) {
    (void)g;
    lstm_layer *L = (lstm_layer *)l;
    if (L->forget_bias == 0.0) return RL_OK;
    rl_tensor f = {0};
    RL_TRY(
        rl_tensor_narrow(&f, &l->params[rl_layer_find_param(l, "b")].value, 0, l->n_out, l->n_out));
    rl_status st = rl_op_fill(&f, L->forget_bias);
    rl_tensor_release(&f);
    return st;
}

static const rl_layer_ops lstm_ops = {.class_name = "lstm",
                                      .forward = lstm_forward,
                                      .backward = lstm_backward,
                                      .destroy = lstm_destroy,
                                      .init_params = lstm_init_params};

rl_status rl_lstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims) {
    int64_t H, dir;
    bool peep;
    double fb;
    *out = NULL;
    if (n_in < 1) return rl_error(RL_EARG, "layer '%s' (lstm): needs at least one input", name);
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &H));
    RL_TRY(rl_opt_int(opts, name, "direction", 1, -1, false, &dir));
    if (dir != 1 && dir != -1)
        return rl_error(RL_EARG, "layer '%s' (lstm): direction = %" PRId64 ", expected 1 or -1",
                        name, dir);
    RL_TRY(rl_opt_bool(opts, name, "peepholes", false, &peep));
    RL_TRY(rl_opt_number(opts, name, "forget_bias", 0.0, &fb));
    int64_t F = 0;
    for (int k = 0; k < n_in; k++) {
        if (in_dims[k] < 1)
            return rl_error(RL_ESHAPE, "layer '%s' (lstm): input %d has %" PRId64 " features", name,
                            k + 1, in_dims[k]);
        F += in_dims[k];
    }
    rl_layer *l;
    RL_TRY(rl_layer_alloc(&l, sizeof(lstm_layer), &lstm_ops, name, n_in, in_dims));
    lstm_layer *L = (lstm_layer *)l;
    l->n_out = H;
    L->direction = (int)dir;
    L->peepholes = peep;
    L->forget_bias = fb;
    int64_t ws[2] = {F, 4 * H}, us[2] = {H, 4 * H}, bs[1] = {4 * H}, ps[1] = {H};
    rl_status st = rl_layer_add_param(l, "W", 2, ws, RL_INIT_GLOROT, 1.0, F, 4 * H, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U", 2, us, RL_INIT_ORTHOGONAL, 1.0, H, 4 * H, NULL);
    if (st == RL_OK) st = rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    const char *pn[3] = {"p_i", "p_f", "p_o"};
    for (int k = 0; k < 3 && peep && st == RL_OK; k++)
        st = rl_layer_add_param(l, pn[k], 1, ps, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    if (st != RL_OK) {
        rl_layer_free(l);
        return st;
    }
    *out = l;
    return RL_OK;
}

static rl_status as_lstm(rl_layer *l, lstm_layer **L, const char *fn) {
    if (!l || l->ops != &lstm_ops)
        return rl_error(RL_EARG, "%s: layer '%s' is not an lstm", fn, l ? l->name : "(null)");
    *L = (lstm_layer *)l;
    return RL_OK;
}

rl_status rl_lstm_set_initial_state(rl_layer *l, const rl_tensor *h0, const rl_tensor *c0) {
    lstm_layer *L = NULL;
    char s[96];
    RL_TRY(as_lstm(l, &L, "rl_lstm_set_initial_state"));
    const rl_tensor *given[2] = {h0, c0};
    for (int k = 0; k < 2; k++) {
        const rl_tensor *g = given[k];
        if (g && (!g->storage || g->ndim != 2 || g->shape[1] != l->n_out || g->dtype == RL_INT32 ||
                  rl_tensor_device(g).type != RL_CPU))
            return rl_error(RL_ESHAPE,
                            "layer '%s' (lstm): initial %s must be a float (B, %" PRId64
                            ") CPU tensor, got %s",
                            l->name, k ? "c" : "h", l->n_out,
                            g && g->storage ? rl_tensor_describe(g, s, sizeof s) : "nothing");
    }
    rl_tensor_release(&L->h0);
    rl_tensor_release(&L->c0);
    if (h0) rl_tensor_share(&L->h0, h0);
    if (c0) rl_tensor_share(&L->c0, c0);
    return RL_OK;
}

rl_status rl_lstm_final_state(rl_layer *l, rl_tensor *h, rl_tensor *c) {
    lstm_layer *L = NULL;
    RL_TRY(as_lstm(l, &L, "rl_lstm_final_state"));
    if (!L->have_forward)
        return rl_error(RL_EARG, "rl_lstm_final_state: layer '%s' has no forward to read", l->name);
    /* the carried states make the last processed row every sequence's own final state */
    int64_t last = L->direction > 0 ? L->T : 0;
    if (h) RL_TRY(rl_tensor_select(h, &L->hs, 0, last));
    if (c) {
        rl_status st = rl_tensor_select(c, &L->cs, 0, last);
        if (st != RL_OK && h) rl_tensor_release(h);
        RL_TRY(st);
    }
    return RL_OK;
}

rl_status rl_lstm_initial_state_grad(rl_layer *l, rl_tensor *dh0, rl_tensor *dc0) {
    lstm_layer *L = NULL;
    RL_TRY(as_lstm(l, &L, "rl_lstm_initial_state_grad"));
    if (!L->dh.storage)
        return rl_error(RL_EARG, "rl_lstm_initial_state_grad: layer '%s' has run no backward",
                        l->name);
    if (dh0) rl_tensor_share(dh0, &L->dh);
    if (dc0) rl_tensor_share(dc0, &L->dc);
    return RL_OK;
}
