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
 *   layer_norm (kernels/gru.h): the input part x W and the recurrent part h_prev U normalised per
 *   gate block apart, each with its gain g_x, g_h (3H), before the biases; the recurrent product
 *   goes to lnh instead of the gates, and dU pairs Hprev with the recurrent part's gradients
 *   lndzh (the layer makes it also when a rec unit makes the other weight gradients); CPU only,
 *   not with impl = "cudnn".
 *
 * Cost: the input projection of all frames is two GEMMs per input (the r, z columns and the n
 * columns of W go to their blocks of the gates buffer); each step is one recurrent GEMM
 * (B, H) x (H, 3H) into the step's [r | z | hn] blocks and one fused pointwise pass
 * (kernels/cpu/gru.c). Backward runs one pointwise pass and one GEMM dG_t U^T per step, then
 * dW, dU and dX as GEMMs over all frames. In float32 on x86-64 with AVX2 or AVX-512 the per-step
 * products use kernels/cpu/gemm_small.c with U (forward) or U^T (backward) packed once per pass,
 * as the lstm does (rl_gemm_packed_fast); float64 and other CPUs use BLAS throughout. With more
 * than one BLAS thread and a U small enough, the batch's rows run in parts, one thread each, for
 * the whole pass (see "The CPU recurrence" below).
 *
 * Packed operands: layers/recurrent.h's mechanism, the lstm's: a layer on its own packs U or U^T
 * at every forward and backward; the step objects of a rec unit share their packs and pack once
 * per pass, and then the input projection and the input gradients (B rows: one step) run
 * through the packed kernel too, with each input's W_k packed once per pass as two blocks of
 * columns, [W_r | W_z] into the gates' r, z blocks and W_n into the n block (their transposes in
 * backward).
 *
 * Buffers (sized per batch shape; all kept from forward for backward):
 *   gates (T, B, 4H)  blocks [r | z | hn | n] per row (kernels/gru.h): input projections and the
 *                     recurrent products on entry of each step, activations after it; backward
 *                     overwrites them with [dar | daz | dhn | dan]
 *   hs (T+1, B, H)    states in time order plus the initial state: for direction 1 row 0 is the
 *                     initial state and row t+1 the state after frame t; for -1 row t is the
 *                     state after frame t and row T the initial one. So the previous states of
 *                     all frames are rows 0..T-1 (1) or 1..T (-1).
 *   dh (B, H)         backward's running state gradient; at the end the initial state's
 *   red               CUDA only: the bias sums' partial column sums (kernels/cuda/gru_cuda.h)
 *   xs[k], dxs[k]     contiguous copies of inputs (input gradients) whose (T, B) dims cannot be
 *                     folded into one; in a ragged batch also of every input, with the padded
 *                     frames zeroed: dW = X^T dG over all frames would otherwise turn a NaN or
 *                     Inf in the padding into NaN gradients (0 * NaN), although dG is 0 there
 *   mh (T, B, H)      zoneout: the masks
 *   md (B, H), hd (T, B, H), dtmp (B, H)  rec_dropout: the mask, the dropped previous states of
 *                     every frame (the products' operand, then dU's), backward's recurrent
 *                     product before the mask
 *   lnx, lnh (T, B, 3H), lnrs (T, B, 6), lng (T, B, 4H), lndzh (T, B, 3H)  layer_norm: the
 *                     normalised parts, their 1/std; backward: the gates' gradients before the
 *                     normalisation's, the recurrent part's gradients
 * The lengths on the device, a copy of an unfoldable grad_out and the packed operands are
 * rl_recurrent's (layers/recurrent.h).
 *
 * One step with explicit state (a rec unit's per-step use): forward with T = 1 after
 * rl_gru_set_initial_state(h_prev) gives the new state as the output (and rl_gru_final_state);
 * backward then gives dLoss/dh_prev with rl_gru_initial_state_grad. The kernels of one step are
 * callable on their own too (kernels/gru.h says how a step is composed).
 *
 * Devices: one layer for the CPU and CUDA, as the lstm: the inputs' device decides; params, the
 * given initial state and grad_out/grad_in must be on it (checked at every entry). The stream,
 * its events and the entry checks are layers/recurrent.c's, shared with the lstm. The recurrence
 * runs in rl_gru_cuda_forward/backward (kernels/cuda/gru.cu), which also do dU, db and db_h there.
 *
 * impl = "own" (default) or "cudnn": on CUDA tensors cudnn runs cuDNN's GRU (CUDNN_GRU, the same
 * equations; layers/rnn_cudnn.c, kernels/cuda/cudnn_rnn.cu, the parameter mapping in
 * kernels/cudnn_layout.h) with W, U, b, b_h packed into cuDNN's weight space before every forward
 * and the weight gradients added back, so checkpoints do not depend on the impl (hs is then
 * (2, B, H): initial and final state). Where cuDNN cannot serve, the layer runs its own kernels:
 * on CPU tensors (so a model trained with cudnn runs on the CPU as it is) and for sizes beyond
 * cuDNN's int descriptors (rl_rnn_cudnn_serves). Backward follows the path its forward took.
 */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "layer.h"
#include "layers.h"
#include "matrix.h"
#include "recurrent.h"
#include "rnn_cudnn.h"

#include "../core/blas.h"
#include "../kernels/cpu/gemm_small.h"
#include "../kernels/cpu/parallel.h"
#include "../kernels/gru.h"
#include "../kernels/ops.h"
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/gru_cuda.h"
#endif

enum { P_W, P_U, P_B, P_BH };

/* Sanity bound on the parameter count: keeps every size computation far from overflow; a
 * real allocation of anything near it fails with a clear out-of-memory error first. */
#define GRU_MAX_PARAMS ((double)(1LL << 44))

typedef struct {
    rl_layer base;
    rl_recurrent rec; /* stream, lengths on the device, batch sizes, final-state row, flags */
    int direction;
    rl_tensor gates, hs, dh;
    rl_tensor red; /* CUDA: (RL_GRU_CUDA_CHUNKS, 4H) partial column sums of the bias gradients */
    rl_tensor xs[RL_LAYER_MAX_INPUTS], dxs[RL_LAYER_MAX_INPUTS];
    bool use_xs[RL_LAYER_MAX_INPUTS]; /* the last forward read input k from xs[k] */
    bool cudnn;                       /* impl = "cudnn" */
    bool ran_cudnn;                   /* the last forward ran cuDNN (so does its backward) */
    rl_rnn_cudnn dnn;
    double zh;              /* zoneout probability of the state (0: none) */
    bool zoned;             /* the last forward applied zoneout (its backward does too) */
    rl_tensor mh;           /* zoneout: the masks (T, B, H) */
    double rd;              /* rec_dropout probability (0: none) */
    bool rdropped;          /* the last forward dropped the recurrent input (its backward too) */
    rl_tensor md, hd, dtmp; /* rec_dropout: the mask (B, H), the dropped previous states of
                               every frame (T, B, H), backward's recurrent product (B, H) */
    bool ln;                /* layer_norm */
    int p_ln;               /* with ln: the index of g_x in params (g_h follows) */
    rl_tensor lnx, lnh, lnrs, lng, lndzh; /* layer_norm (kernels/gru.h, rl_gru_ln_f32): the
                               normalised input and recurrent parts (T, B, 3H), their 1/std
                               (T, B, 6); backward: the gates' gradients (T, B, 4H), the
                               recurrent part's (T, B, 3H) */
} gru_layer;

static const rl_layer_ops gru_ops;

_Static_assert(offsetof(gru_layer, rec) == offsetof(rl_recurrent_layer, rec),
               "gru_layer starts with rl_recurrent_layer (layers/recurrent.h)");

/* The input weights' two blocks of columns: [W_r | W_z] and W_n (see "Packed operands"). */
static rl_status pack_inputs(gru_layer *L, bool backward, const float *W, float **out) {
    int64_t H = L->base.n_out;
    rl_pack_block blocks[2] = {{0, 2 * H}, {2 * H, H}};
    return rl_recurrent_pack_inputs(&L->rec, &L->base, backward, W, 3 * H, blocks, 2, out);
}

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

static rl_mat cols(rl_mat m, int64_t c, rl_dtype dt) { return rl_mat_sub(m, 0, c, dt); }

/* The weight-gradient products (rl_recurrent.weight_grad) over n rows of dG [dar | daz | dhn |
 * dan]: k < n_in: dW_k += x^T [dar | daz | dan], k = -1: dU += x^T [dar | daz | dhn]. */
static rl_status gru_weight_grad(rl_layer *l, rl_device dev, rl_dtype dt, int k, int64_t n,
                                 rl_mat x, rl_mat dg) {
    void *stream = ((gru_layer *)l)->rec.stream;
    int64_t H = l->n_out, row = 0;
    rl_mat g;
    if (k < 0 && ((gru_layer *)l)->ln) return RL_OK; /* the layer makes dU, from lndzh */
    if (k < 0) {
        RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, dev, &g));
        return rl_mat_gemm(dev, stream, dt, true, false, H, 3 * H, n, x, dg, 1.0, g);
    }
    RL_TRY(rl_param_mat(l, &l->params[P_W].grad, "W (gradient)", dt, dev, &g));
    for (int i = 0; i < k; i++)
        row += l->in_dims[i];
    int64_t F = l->in_dims[k];
    rl_mat dWk = rl_mat_sub(g, row, 0, dt);
    RL_TRY(rl_mat_gemm(dev, stream, dt, true, false, F, 2 * H, n, x, dg, 1.0, dWk));
    return rl_mat_gemm(dev, stream, dt, true, false, F, H, n, x, cols(dg, 3 * H, dt), 1.0,
                       cols(dWk, 2 * H, dt));
}

/* The cuDNN object runs on the layer's stream: it goes before the stream does. */
static void drop_stream_users(rl_recurrent *r) {
    gru_layer *L = (gru_layer *)((char *)r - offsetof(gru_layer, rec));
    rl_rnn_cudnn_drop(&L->dnn);
}

/* Input k of the batch as a (T*B, F) matrix: the input itself when it folds and the batch has
 * no padding, else the copy xs[k] with the padded frames zeroed (see Buffers above). */
static rl_status input_mat(gru_layer *L, const rl_layer_io *io, int k, bool ragged, rl_mat *X) {
    const rl_tensor *x = io->in[k];
    rl_device dev = rl_tensor_device(x);
    int64_t T = L->rec.T, B = L->rec.B, F = L->base.in_dims[k];
    L->use_xs[k] = ragged || !rl_mat_fold_tb(x, X);
    if (!L->use_xs[k]) return RL_OK;
    RL_TRY(rl_buffer_ensure_synced(&L->xs[k], x->dtype, dev, 3, x->shape));
    RL_TRY(rl_op_copy(&L->xs[k], x));
    *X = (rl_mat){rl_tensor_data(&L->xs[k]), F};
    if (!ragged) return RL_OK;
#ifdef RL_WITH_CUDA
    if (dev.type == RL_CUDA)
        return rl_gru_cuda_zero_padding(L->rec.stream, x->dtype, T, B, F,
                                        rl_tensor_data(&L->rec.len_dev), X->p);
#endif
    const int32_t *len = rl_tensor_data(io->lengths);
    size_t row = (size_t)F * rl_dtype_size(x->dtype);
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            if (t >= len[b]) memset((char *)X->p + (size_t)(t * B + b) * row, 0, row);
    return RL_OK;
}

/* The CPU recurrence. Batch rows never read each other's state, so where the packed U (3H x H
 * floats) stays within a core's L2 (1 MiB here) the batch is cut into row parts, one per BLAS
 * thread with at least a register tile (8) of rows each, and each part runs every step of the
 * pass on a thread of kernels/cpu/parallel.h: one handoff per pass instead of one per step's
 * product, and the pointwise passes run in parallel too (as the lstm's do). There the bias
 * gradients are summed after the steps over all rows in memory order
 * (rl_gru_cpu_bias_grads_f32), whatever the number of parts, so the results do not depend on
 * the thread count. Otherwise one part: each step's product is split by columns
 * (rl_gemm_packed_f32) and the bias sums stay in the pointwise pass. */
typedef struct {
    gru_layer *L;
    rl_dtype dt;
    const int32_t *len;
    rl_mat U, b, bh, dout, db, dbh; /* b, bh: forward; dout, db, dbh: backward */
    const void *ln[2];              /* layer_norm: g_x, g_h */
    bool packed;
    const float *upack;
} gru_steps;

/* Whether the packed U fits a core's L2: then the steps run in row parts (see above). */
static bool rows_apart(const gru_layer *L, bool packed) {
    int64_t H = L->base.n_out;
    return packed && 12 * H * H <= (1 << 20);
}

static int row_parts(const gru_layer *L, bool packed) {
    if (!rows_apart(L, packed)) return 1;
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    while (parts > 1 && L->rec.B / parts < 8)
        parts--;
    return parts;
}

/* layer_norm: the step's rows r0.. of the buffers (kernels/gru.h); ln_pass runs its forward or
 * backward normalisation pass over n rows of g. */
static void ln_pass(const gru_steps *j, bool backward, int64_t t, int64_t r0, int64_t n, void *g) {
    gru_layer *L = j->L;
    int64_t e = t * L->rec.B + r0, H = L->base.n_out;
    void *xh = at(&L->lnx, e * 3 * H), *hh = at(&L->lnh, e * 3 * H), *rs = at(&L->lnrs, e * 6);
    void *dg = backward ? at(&L->lng, e * 4 * H) : NULL;
    void *dzh = backward ? at(&L->lndzh, e * 3 * H) : NULL;
    if (j->dt == RL_FLOAT32) {
        rl_gru_ln_f32 ln = {xh, hh, rs, dg, dzh, j->ln[0], j->ln[1]};
        if (backward)
            rl_gru_ln_cpu_bwd_f32(n, H, t, j->len + r0, g, &ln);
        else
            rl_gru_ln_cpu_fwd_f32(n, H, t, j->len + r0, g, &ln);
    } else {
        rl_gru_ln_f64 ln = {xh, hh, rs, dg, dzh, j->ln[0], j->ln[1]};
        if (backward)
            rl_gru_ln_cpu_bwd_f64(n, H, t, j->len + r0, g, &ln);
        else
            rl_gru_ln_cpu_fwd_f64(n, H, t, j->len + r0, g, &ln);
    }
}

/* Forward steps of rows r0 .. r1-1: per step the recurrent product into [r | z | hn] (with
 * layer_norm into lnh, normalised apart) and the fused pointwise pass of kernels/cpu/gru.c. */
static void fwd_rows(const gru_steps *j, int64_t r0, int64_t r1) {
    gru_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t T = L->rec.T, B = L->rec.B, H = L->base.n_out, BH = B * H, n = r1 - r0;
    for (int64_t s = 0; s < T; s++) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1, cur = L->direction > 0 ? t + 1 : t;
        rl_mat Hp = {at(&L->hs, prev * BH + r0 * H), H},
               Gt = {at(&L->gates, (t * B + r0) * 4 * H), 4 * H}, Hm = Hp;
        if (L->rdropped) { /* the product reads the dropped state */
            Hm.p = at(&L->hd, t * BH + r0 * H);
            rl_recurrent_mask_rows(dt, n, H, Hp.p, at(&L->md, r0 * H), Hm.p, false);
        }
        rl_mat Zp = L->ln ? (rl_mat){at(&L->lnh, (t * B + r0) * 3 * H), 3 * H} : Gt;
        if (j->packed)
            rl_gemm_packed_f32(n, 3 * H, H, Hm.p, H, j->upack, !L->ln, Zp.p, Zp.ld);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, false, n, 3 * H, H, Hm, j->U,
                        L->ln ? 0.0 : 1.0, Zp);
        if (L->ln) ln_pass(j, false, t, r0, n, Gt.p);
        void *h = at(&L->hs, cur * BH + r0 * H), *out = at(&L->base.out, t * BH + r0 * H);
        void *mh = L->zoned ? at(&L->mh, t * BH + r0 * H) : NULL;
        if (dt == RL_FLOAT32)
            rl_gru_cpu_fwd_f32(n, H, t, j->len + r0, Gt.p, j->b.p, j->bh.p, Hp.p, h, out, mh);
        else
            rl_gru_cpu_fwd_f64(n, H, t, j->len + r0, Gt.p, j->b.p, j->bh.p, Hp.p, h, out, mh);
    }
}

/* Backward steps of rows r0 .. r1-1: dG over the gates and dh (and the bias sums when j->db.p
 * is set), then per step dh += dG_t U^T. */
static void bwd_rows(const gru_steps *j, int64_t r0, int64_t r1) {
    gru_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t T = L->rec.T, B = L->rec.B, H = L->base.n_out, BH = B * H, n = r1 - r0;
    size_t es = rl_dtype_size(dt);
    rl_mat dH = {at(&L->dh, r0 * H), H};
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1;
        rl_mat Gt = {at(&L->gates, (t * B + r0) * 4 * H), 4 * H};
        const void *dot =
            j->dout.p ? (char *)j->dout.p + (size_t)((t * B + r0) * j->dout.ld) * es : NULL;
        void *hp = at(&L->hs, prev * BH + r0 * H);
        void *mh = L->zoned ? at(&L->mh, t * BH + r0 * H) : NULL;
        if (dt == RL_FLOAT32)
            rl_gru_cpu_bwd_f32(n, H, t, j->len + r0, Gt.p, hp, dot, j->dout.ld, dH.p, j->db.p,
                               j->dbh.p, mh);
        else
            rl_gru_cpu_bwd_f64(n, H, t, j->len + r0, Gt.p, hp, dot, j->dout.ld, dH.p, j->db.p,
                               j->dbh.p, mh);
        /* padded rows of dG_t are 0, so their dh passes through unchanged; with rec_dropout
         * the product's gradient goes through the mask; with layer_norm it reads the recurrent
         * part's gradients */
        rl_mat D = L->rdropped ? (rl_mat){at(&L->dtmp, r0 * H), H} : dH;
        if (L->ln) {
            ln_pass(j, true, t, r0, n, Gt.p);
            Gt = (rl_mat){at(&L->lndzh, (t * B + r0) * 3 * H), 3 * H};
        }
        if (j->packed)
            rl_gemm_packed_f32(n, H, 3 * H, Gt.p, Gt.ld, j->upack, !L->rdropped, D.p, H);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, true, n, H, 3 * H, Gt, j->U,
                        L->rdropped ? 0.0 : 1.0, D);
        if (L->rdropped) rl_recurrent_mask_rows(dt, n, H, D.p, at(&L->md, r0 * H), dH.p, true);
    }
}

static void fwd_part(void *ctx, int part, int parts) {
    const gru_steps *j = ctx;
    int64_t B = j->L->rec.B;
    fwd_rows(j, B * part / parts, B * (part + 1) / parts);
}

static void bwd_part(void *ctx, int part, int parts) {
    const gru_steps *j = ctx;
    int64_t B = j->L->rec.B;
    bwd_rows(j, B * part / parts, B * (part + 1) / parts);
}

/* Packs U (forward) or U^T (backward) for the packed kernel when it applies (and is stale). */
static rl_status pack_u(gru_layer *L, gru_steps *j, bool backward) {
    int64_t H = L->base.n_out;
    j->packed = j->dt == RL_FLOAT32 && rl_gemm_packed_fast();
    if (!j->packed) return RL_OK;
    int64_t n = backward ? rl_gemm_packed_size(3 * H, H) : rl_gemm_packed_size(H, 3 * H);
    float *d;
    bool stale;
    RL_TRY(rl_recurrent_pack_slot(&L->rec, &L->base, backward ? RL_PACK_UT : RL_PACK_U, n, &d,
                                  &stale));
    if (stale && backward)
        rl_gemm_pack_f32(d, j->U.p, 3 * H, true, 3 * H, H);
    else if (stale)
        rl_gemm_pack_f32(d, j->U.p, 3 * H, false, H, 3 * H);
    j->upack = d;
    return RL_OK;
}

/* The forward recurrence on the CPU; lnp: layer_norm's g_x, g_h. */
static rl_status forward_steps_cpu(gru_layer *L, rl_dtype dt, const int32_t *len, rl_mat U,
                                   rl_mat b, rl_mat bh, const void *const *lnp) {
    rl_layer *l = &L->base;
    int64_t T = L->rec.T, B = L->rec.B, H = l->n_out;
    size_t es = rl_dtype_size(dt);
    /* the hn block receives the product alone (the input projection has no n part there) */
    char *g0 = rl_tensor_data(&L->gates);
    for (int64_t row = 0; row < T * B; row++)
        memset(g0 + (size_t)(row * 4 * H + 2 * H) * es, 0, (size_t)H * es);
    gru_steps j = {.L = L, .dt = dt, .len = len, .U = U, .b = b, .bh = bh, .ln = {lnp[0], lnp[1]}};
    RL_TRY(pack_u(L, &j, false));
    int parts = row_parts(L, j.packed);
    if (parts > 1)
        rl_cpu_parallel(parts, fwd_part, &j);
    else
        fwd_part(&j, 0, 1);
    return RL_OK;
}

/* The backward recurrence on the CPU (dG, dh, db, db_h; with layer_norm the gains too), then
 * dU = Hprev^T dG (unless the caller makes the weight gradients, rl_recurrent_set_gates; with
 * layer_norm always here, from the recurrent part's gradients). */
static rl_status backward_steps_cpu(gru_layer *L, rl_dtype dt, const int32_t *len, rl_mat dout,
                                    rl_mat U, rl_mat db, rl_mat dbh, const void *const *lnp,
                                    void *const *dlnp) {
    rl_layer *l = &L->base;
    int64_t T = L->rec.T, B = L->rec.B, H = l->n_out, BH = B * H;
    gru_steps j = {.L = L,
                   .dt = dt,
                   .len = len,
                   .U = U,
                   .dout = dout,
                   .db = db,
                   .dbh = dbh,
                   .ln = {lnp[0], lnp[1]}};
    RL_TRY(pack_u(L, &j, true));
    bool apart = rows_apart(L, j.packed);
    if (apart || L->ln) j.db = j.dbh = (rl_mat){NULL, 0};
    int parts = row_parts(L, j.packed);
    if (parts > 1)
        rl_cpu_parallel(parts, bwd_part, &j);
    else
        bwd_part(&j, 0, 1);
    rl_mat dG = {rl_tensor_data(&L->gates), 4 * H};
    rl_mat Hprev = {at(&L->hs, L->direction > 0 ? 0 : BH), H};
    if (L->rdropped) Hprev.p = rl_tensor_data(&L->hd); /* dU pairs dG with what U multiplied */
    if (L->ln) {
        void *xh = rl_tensor_data(&L->lnx), *hh = rl_tensor_data(&L->lnh);
        void *dg = rl_tensor_data(&L->lng);
        if (dt == RL_FLOAT32) {
            rl_gru_ln_f32 ln = {xh, hh, NULL, dg, NULL, NULL, NULL};
            rl_gru_ln_cpu_param_grads_f32(T * B, H, &ln, db.p, dbh.p, dlnp[0], dlnp[1]);
        } else {
            rl_gru_ln_f64 ln = {xh, hh, NULL, dg, NULL, NULL, NULL};
            rl_gru_ln_cpu_param_grads_f64(T * B, H, &ln, db.p, dbh.p, dlnp[0], dlnp[1]);
        }
        rl_mat dU, dZH = {rl_tensor_data(&L->lndzh), 3 * H};
        RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, RL_DEVICE_CPU, &dU));
        return rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, true, false, H, 3 * H, T * B, Hprev, dZH, 1.0,
                           dU);
    }
    if (apart) rl_gru_cpu_bias_grads_f32(T * B, H, dG.p, db.p, dbh.p);
    if (L->rec.defer_fwd) return RL_OK;
    return gru_weight_grad(l, RL_DEVICE_CPU, dt, -1, T * B, Hprev, dG);
}

static rl_status gru_forward(rl_layer *l, rl_layer_io *io) {
    gru_layer *L = (gru_layer *)l;
    rl_recurrent *r = &L->rec;
    int64_t H = l->n_out;
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_recurrent_forward_begin(r, l, io, &dt, &dev));
    if (L->zh > 0) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "zoneout"));
    if (L->rd > 0) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "rec_dropout"));
    if (L->ln) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "layer_norm"));
    int64_t T = r->T, B = r->B;
    rl_mat W, U, b, bh;
    const void *lnp[2] = {NULL, NULL};
    for (int k = 0; k < 2 && L->ln; k++) {
        rl_mat pm;
        RL_TRY(rl_param_mat(l, &l->params[L->p_ln + k].value, l->params[L->p_ln + k].name, dt, dev,
                            &pm));
        lnp[k] = pm.p;
    }
    RL_TRY(rl_param_mat(l, &l->params[P_W].value, "W", dt, dev, &W));
    RL_TRY(rl_param_mat(l, &l->params[P_U].value, "U", dt, dev, &U));
    RL_TRY(rl_param_mat(l, &l->params[P_B].value, "b", dt, dev, &b));
    RL_TRY(rl_param_mat(l, &l->params[P_BH].value, "b_h", dt, dev, &bh));
    L->ran_cudnn = L->cudnn && dev.type == RL_CUDA && rl_rnn_cudnn_serves(r, l);
#ifdef RL_WITH_CUDA
    if (L->ran_cudnn) {
        rl_mat p[4] = {W, U, b, bh};
        const rl_tensor *written[1] = {&L->hs};
        RL_TRY(rl_rnn_cudnn_forward(&L->dnn, r, l, RL_CUDNN_GRU, L->direction, io, dt, dev, p,
                                    &r->init[0], NULL, &L->hs, NULL));
        return rl_recurrent_forward_end(r, l, 1, io->train, written, 1);
    }
#endif

    int64_t gshape[3] = {T, B, 4 * H}, sshape[3] = {T + 1, B, H};
    RL_TRY(rl_recurrent_gates(r, l, &L->gates, dt, dev, gshape));
    RL_TRY(rl_buffer_ensure_synced(&L->hs, dt, dev, 3, sshape));
    if (L->ln) {
        int64_t pshape[3] = {T, B, 3 * H}, rshape[3] = {T, B, 6};
        RL_TRY(rl_buffer_ensure_synced(&L->lnx, dt, dev, 3, pshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lnh, dt, dev, 3, pshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lnrs, dt, dev, 3, rshape));
    }

    /* the initial state row */
    rl_tensor hrow = {0};
    RL_TRY(rl_tensor_select(&hrow, &L->hs, 0, L->direction > 0 ? 0 : T));
    rl_status st = rl_recurrent_write_state(r, &hrow, &r->init[0]);
    rl_tensor_release(&hrow);
    RL_TRY(st);

    /* input projection of all frames: per input one GEMM for the r, z columns and one for the n
     * columns (block 3 of the gates), accumulated over the inputs */
    const int32_t *len = rl_tensor_data(io->lengths);
    bool ragged = false;
    for (int64_t i = 0; i < B; i++)
        ragged = ragged || len[i] < T;
    rl_mat G = {rl_tensor_data(&L->gates), 4 * H};
    float *wpack = NULL;
    if (rl_recurrent_packed_inputs(r, dt, dev)) RL_TRY(pack_inputs(L, false, W.p, &wpack));
    int64_t row = 0;
    bool first = true; /* no input's product in G yet */
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        if (rl_recurrent_zero_input(r, k)) { /* its products would add zeros */
            if (wpack) wpack += rl_gemm_packed_size(F, 2 * H) + rl_gemm_packed_size(F, H);
            row += F;
            continue;
        }
        rl_mat X;
        RL_TRY(input_mat(L, io, k, ragged, &X));
        rl_mat Wk = rl_mat_sub(W, row, 0, dt);
        double beta = first ? 0.0 : 1.0;
        if (wpack) {
            rl_gemm_packed_f32(T * B, 2 * H, F, X.p, X.ld, wpack, !first, G.p, 4 * H);
            wpack += rl_gemm_packed_size(F, 2 * H);
            rl_gemm_packed_f32(T * B, H, F, X.p, X.ld, wpack, !first, (float *)G.p + 3 * H, 4 * H);
            wpack += rl_gemm_packed_size(F, H);
        } else {
            RL_TRY(rl_mat_gemm(dev, r->stream, dt, false, false, T * B, 2 * H, F, X, Wk, beta, G));
            RL_TRY(rl_mat_gemm(dev, r->stream, dt, false, false, T * B, H, F, X,
                               cols(Wk, 2 * H, dt), beta, cols(G, 3 * H, dt)));
        }
        first = false;
        row += F;
    }

    L->rdropped = io->train && L->rd > 0;
    if (L->rdropped) {
        int64_t dshape[3] = {T, B, H};
        RL_TRY(rl_recurrent_rec_dropout_mask(r, l, io, L->rd, &L->md, dt, dev));
        RL_TRY(rl_buffer_ensure_synced(&L->hd, dt, dev, 3, dshape));
    }
    L->zoned = L->zh > 0;
    if (L->zoned) RL_TRY(rl_recurrent_zoneout_mask(r, l, io, L->zh, &L->mh, dt, dev));
    if (dev.type == RL_CPU) RL_TRY(forward_steps_cpu(L, dt, len, U, b, bh, lnp));
#ifdef RL_WITH_CUDA
    else
        RL_TRY(rl_gru_cuda_forward(r->stream, dt, T, B, H, L->direction,
                                   rl_tensor_data(&r->len_dev), rl_tensor_data(&L->gates), U.p, b.p,
                                   bh.p, rl_tensor_data(&L->hs), rl_tensor_data(&l->out)));
#endif
    /* hs holds the final state another layer may take as its initial state */
    const rl_tensor *written[1] = {&L->hs};
    return rl_recurrent_forward_end(r, l, L->direction > 0 ? T : 0, true, written, 1);
}

static rl_status gru_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                              rl_tensor *const *grad_in) {
    gru_layer *L = (gru_layer *)l;
    rl_recurrent *r = &L->rec;
    int64_t H = l->n_out;
    rl_dtype dt;
    rl_device dev;
    rl_mat dout;
    if (L->ran_cudnn && r->final_grad[0].storage)
        return rl_error(RL_EARG, "layer '%s' (gru): impl = \"cudnn\" takes no final state gradient",
                        l->name);
    RL_TRY(rl_recurrent_backward_begin(r, l, io, grad_out, grad_in, &dt, &dev, &dout));
    int64_t T = r->T, B = r->B;
    rl_mat W, U, dW, dU, db, dbh;
    RL_TRY(rl_param_mat(l, &l->params[P_W].value, "W", dt, dev, &W));
    RL_TRY(rl_param_mat(l, &l->params[P_U].value, "U", dt, dev, &U));
    RL_TRY(rl_param_mat(l, &l->params[P_W].grad, "W (gradient)", dt, dev, &dW));
    RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, dev, &dU));
    RL_TRY(rl_param_mat(l, &l->params[P_B].grad, "b (gradient)", dt, dev, &db));
    RL_TRY(rl_param_mat(l, &l->params[P_BH].grad, "b_h (gradient)", dt, dev, &dbh));
    const void *lnp[2] = {NULL, NULL};
    void *dlnp[2] = {NULL, NULL};
    for (int k = 0; k < 2 && L->ln; k++) {
        const rl_param *q = &l->params[L->p_ln + k];
        rl_mat pm, gm;
        RL_TRY(rl_param_mat(l, &q->value, q->name, dt, dev, &pm));
        RL_TRY(rl_param_mat(l, &q->grad, q->name, dt, dev, &gm));
        lnp[k] = pm.p;
        dlnp[k] = gm.p;
    }
#ifdef RL_WITH_CUDA
    if (L->ran_cudnn) {
        rl_mat g[4] = {dW, dU, db, dbh};
        const rl_tensor *written[1] = {&L->dh};
        RL_TRY(rl_rnn_cudnn_backward(&L->dnn, r, l, io, grad_in, dt, dev, dout, g, &L->dh, NULL));
        return rl_recurrent_backward_end(r, io, grad_in, written, 1);
    }
#endif
    RL_TRY(rl_recurrent_start_state_grads(r, dt, dev));
    if (L->rdropped) {
        int64_t dshape[2] = {B, H};
        RL_TRY(rl_buffer_ensure_synced(&L->dtmp, dt, dev, 2, dshape));
    }
    if (L->ln) {
        int64_t gshape[3] = {T, B, 4 * H}, pshape[3] = {T, B, 3 * H};
        RL_TRY(rl_buffer_ensure_synced(&L->lng, dt, dev, 3, gshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lndzh, dt, dev, 3, pshape));
    }

    if (dev.type == RL_CPU)
        RL_TRY(backward_steps_cpu(L, dt, rl_tensor_data(io->lengths), dout, U, db, dbh, lnp, dlnp));
#ifdef RL_WITH_CUDA
    else {
        int64_t rshape[2] = {RL_GRU_CUDA_CHUNKS, 4 * H};
        RL_TRY(rl_buffer_ensure_synced(&L->red, dt, dev, 2, rshape));
        RL_TRY(rl_gru_cuda_backward(r->stream, dt, T, B, H, L->direction,
                                    rl_tensor_data(&r->len_dev), rl_tensor_data(&L->gates), U.p,
                                    rl_tensor_data(&L->hs), dout.p, dout.ld, rl_tensor_data(&L->dh),
                                    dU.p, db.p, dbh.p, rl_tensor_data(&L->red)));
    }
#endif

    /* weight and input gradients: GEMMs over all frames, the r, z columns and the n columns of
     * the input side apart (dG's n block is block 3, dan) */
    rl_mat dG = {rl_tensor_data(&L->gates), 4 * H}, dGn = cols(dG, 3 * H, dt);
    float *wtpack = NULL;
    if (grad_in && rl_recurrent_packed_inputs(r, dt, dev))
        RL_TRY(pack_inputs(L, true, W.p, &wtpack));
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        rl_mat X = {NULL, 0}, Wk = rl_mat_sub(W, row, 0, dt);
        /* a zero input's X^T dG = 0; deferred: the caller's (rl_recurrent_set_gates) */
        if (!rl_recurrent_zero_input(r, k) && !r->defer_fwd) {
            if (L->use_xs[k])
                X = (rl_mat){rl_tensor_data(&L->xs[k]), F};
            else
                (void)rl_mat_fold_tb(io->in[k], &X); /* it folded in forward */
            RL_TRY(gru_weight_grad(l, dev, dt, k, T * B, X, dG));
        }
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi) {
            rl_mat Gi;
            bool direct = rl_mat_fold_tb(gi, &Gi);
            if (!direct) {
                RL_TRY(rl_buffer_ensure_synced(&L->dxs[k], dt, dev, 3, gi->shape));
                Gi = (rl_mat){rl_tensor_data(&L->dxs[k]), F};
            }
            if (wtpack) {
                const float *rz = wtpack, *n = wtpack + rl_gemm_packed_size(2 * H, F);
                rl_gemm_packed_f32(T * B, F, 2 * H, dG.p, 4 * H, rz, false, Gi.p, Gi.ld);
                rl_gemm_packed_f32(T * B, F, H, dGn.p, 4 * H, n, true, Gi.p, Gi.ld);
            } else {
                RL_TRY(
                    rl_mat_gemm(dev, r->stream, dt, false, true, T * B, F, 2 * H, dG, Wk, 0.0, Gi));
                RL_TRY(rl_mat_gemm(dev, r->stream, dt, false, true, T * B, F, H, dGn,
                                   cols(Wk, 2 * H, dt), 1.0, Gi));
            }
            if (!direct) RL_TRY(rl_op_copy(gi, &L->dxs[k]));
        }
        if (wtpack) wtpack += rl_gemm_packed_size(2 * H, F) + rl_gemm_packed_size(H, F);
        row += F;
    }
    /* the initial state's gradient, read by whoever gave that state */
    const rl_tensor *written[1] = {&L->dh};
    return rl_recurrent_backward_end(r, io, grad_in, written, 1);
}

static void gru_destroy(rl_layer *l) {
    gru_layer *L = (gru_layer *)l;
    rl_recurrent_free(&L->rec); /* drops the cuDNN object, waits for and destroys the stream */
    rl_rnn_cudnn_free(&L->dnn);
    rl_tensor *ts[] = {&L->gates, &L->hs,  &L->dh,  &L->red,  &L->mh,  &L->md,   &L->hd,
                       &L->dtmp,  &L->lnx, &L->lnh, &L->lnrs, &L->lng, &L->lndzh};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    for (int k = 0; k < RL_LAYER_MAX_INPUTS; k++) {
        rl_tensor_release(&L->xs[k]);
        rl_tensor_release(&L->dxs[k]);
    }
}

static const rl_layer_ops gru_ops = {.class_name = "gru",
                                     .forward = gru_forward,
                                     .backward = gru_backward,
                                     .destroy = gru_destroy,
                                     .state = &rl_recurrent_state_ops};

rl_status rl_gru_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                        const int64_t *in_dims) {
    int64_t H, dir;
    *out = NULL;
    if (n_in < 1) return rl_error(RL_EARG, "layer '%s' (gru): needs at least one input", name);
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &H));
    RL_TRY(rl_opt_int(opts, name, "direction", 1, -1, false, &dir));
    bool cudnn;
    double zc, zh;
    RL_TRY(rl_rnn_cudnn_option(opts, name, "gru", &cudnn));
    RL_TRY(rl_recurrent_zoneout_option(opts, name, "gru", false, cudnn, &zc, &zh));
    double rd;
    RL_TRY(rl_recurrent_rec_dropout_option(opts, name, "gru", cudnn, &rd));
    bool ln;
    RL_TRY(rl_opt_bool(opts, name, "layer_norm", false, &ln));
    if (ln && cudnn)
        return rl_error(RL_EARG,
                        "layer '%s' (gru): option layer_norm and impl = \"cudnn\" do not go "
                        "together (cuDNN's GRU has no layer normalisation; use impl = \"own\")",
                        name);
    if (dir != 1 && dir != -1)
        return rl_error(RL_EARG, "layer '%s' (gru): direction = %" PRId64 ", expected 1 or -1",
                        name, dir);
    double F = 0;
    for (int k = 0; k < n_in; k++) {
        if (in_dims[k] < 1)
            return rl_error(RL_ESHAPE, "layer '%s' (gru): input %d has %" PRId64 " features", name,
                            k + 1, in_dims[k]);
        F += (double)in_dims[k];
    }
    double n_params = (F + (double)H + 2.0) * 3.0 * (double)H;
    if (n_params > GRU_MAX_PARAMS)
        return rl_error(RL_EARG,
                        "layer '%s' (gru): n_out = %" PRId64 " with %.0f input features needs "
                        "%.3g parameters, more than the %.3g this layer supports",
                        name, H, F, n_params, GRU_MAX_PARAMS);
    rl_layer *l;
    RL_TRY(rl_layer_alloc(&l, sizeof(gru_layer), &gru_ops, name, n_in, in_dims));
    gru_layer *L = (gru_layer *)l;
    l->n_out = H;
    L->direction = (int)dir;
    L->rec.cls = "gru";
    L->cudnn = cudnn;
    L->zh = zh;
    L->rd = rd;
    L->ln = ln;
    L->rec.on_stream_drop = drop_stream_users;
    L->rec.weight_grad = gru_weight_grad;
    L->rec.n_states = 1;
    L->rec.state_names[0] = "h";
    L->rec.state_dims[0] = H;
    L->rec.seq[0] = &L->hs;
    L->rec.grad0[0] = &L->dh;
    L->rec.gates_cols = 4 * H;
    int64_t Fi = (int64_t)F;
    int64_t ws[2] = {Fi, 3 * H}, us[2] = {H, 3 * H}, bs[1] = {3 * H};
    rl_status st = rl_layer_add_param(l, "W", 2, ws, RL_INIT_GLOROT, 1.0, Fi, 3 * H, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U", 2, us, RL_INIT_ORTHOGONAL, 1.0, H, 3 * H, NULL);
    if (st == RL_OK) st = rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    if (st == RL_OK) st = rl_layer_add_param(l, "b_h", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    L->p_ln = l->n_params;
    if (st == RL_OK && ln)
        st = rl_layer_add_param(l, "g_x", 1, bs, RL_INIT_CONSTANT, 1.0, 0, 0, NULL);
    if (st == RL_OK && ln)
        st = rl_layer_add_param(l, "g_h", 1, bs, RL_INIT_CONSTANT, 1.0, 0, 0, NULL);
    if (st != RL_OK) {
        rl_layer_free(l);
        return st;
    }
    *out = l;
    return RL_OK;
}

static rl_status check_gru(const rl_layer *l, const char *fn) {
    if (!l || l->ops != &gru_ops)
        return rl_error(RL_EARG, "%s: layer '%s' is not a gru", fn, l ? l->name : "(null)");
    return RL_OK;
}

/* The typed forms of the layer.h state calls, for C callers that know the class. */
rl_status rl_gru_set_initial_state(rl_layer *l, const rl_tensor *h0) {
    RL_TRY(check_gru(l, "rl_gru_set_initial_state"));
    return rl_layer_set_initial_state(l, 1, &h0);
}

rl_status rl_gru_set_final_state_grad(rl_layer *l, const rl_tensor *dh) {
    RL_TRY(check_gru(l, "rl_gru_set_final_state_grad"));
    return rl_layer_set_final_state_grad(l, 1, &dh);
}

rl_status rl_gru_final_state(rl_layer *l, rl_tensor *h) {
    RL_TRY(check_gru(l, "rl_gru_final_state"));
    return rl_layer_final_state(l, 1, &h);
}

rl_status rl_gru_initial_state_grad(rl_layer *l, rl_tensor *dh0) {
    RL_TRY(check_gru(l, "rl_gru_initial_state_grad"));
    return rl_layer_initial_state_grad(l, 1, &dh0);
}
