/* lstm: a long short-term memory layer over time-major sequences, forward or backward in time.
 *
 * Parameters (checkpoint layout; gate order i, f, g, o along every 4H axis, as in PyTorch and
 * cuDNN):
 *   W  (sum_k F_k, 4H)  input weights, the inputs' rows stacked in `from` order   (glorot)
 *   U  (P, 4H)          recurrent weights                                        (orthogonal)
 *   b  (4H)             bias                                                     (zeros)
 *   p_i, p_f, p_o (H)   peephole weights, only with peepholes = true             (zeros)
 *   R  (H, P)           the recurrent projection, only with n_proj = P           (glorot)
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
 *   the fused passes (kernels/lstm.h, rl_lstm_zo_f32);
 *   rec_dropout (training): z_t's product reads h_prev * m_d, m_d (B, P) one per sequence;
 *   n_proj: above; CPU only (forward on CUDA tensors fails naming it), not with zoneout or
 *   impl = "cudnn" (errors at creation);
 *   layer_norm (Ba et al. 2016, per gate block; the formulas in kernels/lstm_cell.h):
 *   a_t = LN(x W; g_x) + LN(h_prev U; g_h) + b, the gates of a_t, c_t = f c_prev + i g,
 *   h_t = o tanh(LN(c_t; g_c) + b_c); the recurrent product goes to lnh instead of the gates,
 *   dU pairs Hprev with the recurrent part's gradients lndzh (the layer makes it also when a
 *   rec unit makes the other weight gradients); CPU only, not with peepholes, zoneout or cudnn.
 *
 * Cost: the input projection of all frames is one GEMM per input; each step is one
 * recurrent GEMM (B, H) x (H, 4H) into the step's rows of z and one fused pointwise pass
 * (kernels/cpu/lstm.c). Backward runs one pointwise pass (dz_t, in place of the gates) and one
 * GEMM dz_t U^T per step, then dW_k = X_k^T dZ, dU = Hprev^T dZ and dX_k = dZ W_k^T as single
 * GEMMs over all frames, and db, the peephole gradients as one pass over dZ. In float32 on an
 * AVX2+FMA or AVX-512 CPU the per-step products use kernels/cpu/gemm_small.c with U (forward)
 * or U^T (backward) packed once per pass: a BLAS call would repack U on every step and runs
 * those few-row products at a fraction of its speed; float64 and other CPUs use BLAS
 * throughout. With more than one BLAS thread the work is split over them: by batch rows for
 * the whole pass where U is small enough (each thread runs its rows' steps, products and
 * pointwise passes alike, with no handoff per step), else by columns of each step's product
 * (run_steps).
 *
 * Buffers (sized per batch shape with rl_buffer_ensure; all kept from forward for backward):
 *   gates (T, B, 4H)     pre-activations, then activations; backward overwrites them with dZ
 *   hs (T+1, B, P), cs (T+1, B, H)
 *                        states in time order plus the initial state: for direction 1 row 0
 *                        is the initial state and row t+1 the state after frame t; for -1 row
 *                        t is the state after frame t and row T the initial one. So the
 *                        previous states of all frames are rows 0..T-1 (1) or 1..T (-1).
 *   dh, dc (B, H)        backward's running state gradients; at the end the gradients of the
 *                        initial state
 *   red                  CUDA only: the bias and peephole sums' partial sums (lstm_cuda.h)
 *   xs[k], dxs[k]        contiguous copies, only for inputs (or input gradients) whose (T, B)
 *                        dims cannot be folded into one
 *   mc, mh, ct (T, B, H) zoneout: the masks of the cell and h (each only with its z > 0) and
 *                        the cells before zoneout c~ (o, tanh and p_o's gradient read c~)
 *   md (B, P), hd (T, B, P), dtmp (B, P)  rec_dropout: the mask, the dropped previous states
 *                        of every frame (the products' operand, then dU's), backward's
 *                        recurrent product before the mask
 *   ms (T+1, B, H)       n_proj: the cells' m in hs's row order (the initial row zeros: a padded
 *                        frame carries it), read by dR = M^T dH
 *   mscr (B, H)          n_proj: the pointwise pass's output rows, unused (the output is h)
 *   drs (T, B, P), dm (B, H)  n_proj: dLoss/dh_t of every frame (0 on padded rows), dLoss/dm
 *                        of the step backward is at; rpack: R or R^T packed (float32 CPU)
 *   lnx, lnh (T, B, 4H), lnc (T, B, H), lnrs (T, B, 9)  layer_norm: the normalised input and
 *                        recurrent parts, cells, their 1/std (kernels/lstm.h, rl_lstm_ln_f32)
 *   lng, lndzh (T, B, 4H), lndu (T, B, H)  layer_norm, backward: the gates' pre-activation
 *                        gradients, the recurrent part's, the normalised cell's
 * Kept in rl_recurrent (layers/recurrent.h): the lengths on the device (CUDA), a contiguous
 * copy of grad_out when it cannot be folded and the packed operands ("Packed operands" below);
 * in rl_rnn_cudnn (layers/rnn_cudnn.h) the cuDNN path's concatenated inputs.
 *
 * Devices: one layer for the CPU and CUDA; the device of the inputs decides, and the params,
 * the given initial state and grad_out/grad_in must be on it (checked at every entry, so device
 * memory never reaches a host loop; lengths are CPU tensors by the layer contract). The device
 * branches are few: gemm() (BLAS or rl_cuda_gemm), the recurrence (the CPU step loops
 * below, unchanged, or rl_lstm_cuda_forward/backward of kernels/cuda/lstm.cu, which also do dU,
 * db and the peephole gradients there), buffer growth and the small state writes.
 *
 * impl = "own" (default) or "cudnn". cudnn runs the cuDNN 9 RNN API through layers/rnn_cudnn.c
 * (kernels/cuda/cudnn_rnn.cu) and needs CUDA tensors (on CPU tensors forward fails naming the
 * layer: no silent fallback) and no peepholes (an error at creation). The weights stay W, U, b
 * in the flat buffers in the layout above: they are packed into cuDNN's weight space before every
 * forward and the weight gradients are added back, so a checkpoint is the same whichever impl
 * trained it and loads into either, or into the CPU layer. The final state and the initial
 * state's gradients work as with own (hs, cs are then (2, B, H): initial and final state).
 *
 * Packed operands (float32, AVX2/AVX-512 CPU): the per-step products read U (forward) or U^T
 * (backward) packed for kernels/cpu/gemm_small.c, packed at every forward and backward of a layer
 * on its own, once per pass for the step objects of a rec unit, which share them; with a pass set
 * the input projection (T B = B rows: one step) and the input gradients use the packed kernel
 * too, with W_k and W_k^T packed once per pass. The mechanism is layers/recurrent.h's ("Packed
 * operands"), shared with the gru.
 *
 * Streams (CUDA), the checks at the entry of forward and backward and the final-state
 * bookkeeping are layers/recurrent.c's, shared with the gru: each layer object owns a blocking
 * stream and queues all its work of a forward or backward there (the lengths, the initial state
 * row, the GEMMs, the recurrence, the cuDNN calls), so the two directions of a bidirectional pair
 * run at the same time on the GPU; events order it against the layers it reads from and that
 * read from it (kernels/cuda/context.h, "Streams and ordering"). A few rare cases (an input or
 * grad_out whose (T, B) dims cannot be folded, a given initial state of another dtype or layout)
 * use rl_op_copy on the legacy stream: still ordered, only less overlap. Moving the layer to
 * another device drops the cuDNN object before the stream it runs on is destroyed.
 */
#include <inttypes.h>
#include <math.h>

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
#include "../kernels/lstm.h"
#include "../kernels/ops.h"
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/lstm_cuda.h"
#endif

enum { P_W, P_U, P_B, P_PI, P_PF, P_PO };

typedef struct {
    rl_layer base;
    rl_recurrent rec; /* stream, lengths on the device, batch sizes, final-state row, flags */
    int direction;
    int64_t H; /* the cell's width (option n_out); the output and h are base.n_out wide: H, or
                  n_proj's P */
    bool proj; /* n_proj: h = m R */
    int p_r;   /* R's index in params (with proj) */
    bool ln;   /* layer_norm */
    int p_ln;  /* with ln: the index of g_x in params (g_h, g_c, b_c follow) */
    bool peepholes;
    bool cudnn; /* impl = "cudnn" */
    double forget_bias;
    rl_tensor gates, hs, cs, dh, dc;
    rl_tensor red; /* CUDA: (RL_LSTM_CUDA_CHUNKS, 7H) partial sums of the bias and peepholes */
    rl_tensor xs[RL_LAYER_MAX_INPUTS], dxs[RL_LAYER_MAX_INPUTS];
    rl_rnn_cudnn dnn;       /* impl = "cudnn" */
    double zc, zh;          /* zoneout probabilities of the cell and the hidden state (0: none) */
    bool zoned;             /* the last forward applied zoneout (its backward does too) */
    rl_tensor mc, mh, ct;   /* zoneout: the masks (T, B, H) and the cells before zoneout c~ */
    double rd;              /* rec_dropout probability (0: none) */
    bool rdropped;          /* the last forward dropped the recurrent input (its backward too) */
    rl_tensor md, hd, dtmp; /* rec_dropout: the mask (B, P), the dropped previous states of
                               every frame (T, B, P), backward's recurrent product (B, P) */
    rl_tensor ms, mscr;     /* n_proj: the cell outputs m (T+1, B, H) in hs's row order; the
                               pointwise pass's unused output rows (B, H) */
    rl_tensor drs, dm;      /* n_proj: dLoss/dh of every frame (T, B, P), 0 on padded rows;
                               backward's dLoss/dm of a step (B, H) */
    rl_tensor rpack;        /* n_proj: R (forward) or R^T (backward) packed (float32 CPU) */
    rl_tensor lnx, lnh, lnc, lnrs; /* layer_norm: the normalised input and recurrent parts
                                      (T, B, 4H), cells (T, B, H), the 1/std (T, B, 9) */
    rl_tensor lng, lndzh, lndu;    /* layer_norm, backward: the gates' pre-activation gradients,
                                      the recurrent part's (T, B, 4H), the normalised cell's
                                      (T, B, H) */
} lstm_layer;

static const rl_layer_ops lstm_ops;

_Static_assert(offsetof(lstm_layer, rec) == offsetof(rl_recurrent_layer, rec),
               "lstm_layer starts with rl_recurrent_layer (layers/recurrent.h)");

/* The input weights form one block of columns (all 4H gates of a product). */
static rl_status pack_inputs(lstm_layer *L, bool backward, const float *W, float **out) {
    rl_pack_block all = {0, 4 * L->H};
    return rl_recurrent_pack_inputs(&L->rec, &L->base, backward, W, 4 * L->H, &all, 1, out);
}

/* c = op(a) op(b) + beta c on the layer's device: BLAS, or cuBLAS on the layer's stream. */
static rl_status gemm(const lstm_layer *L, rl_device dev, rl_dtype dt, bool ta, bool tb, int64_t m,
                      int64_t n, int64_t k, rl_mat a, rl_mat b, double beta, rl_mat c) {
    return rl_mat_gemm(dev, L->rec.stream, dt, ta, tb, m, n, k, a, b, beta, c);
}

/* The weight-gradient products (rl_recurrent.weight_grad): over n rows, k < n_in: dW_k += x^T dz,
 * k = -1: dU += x^T dz. */
static rl_status lstm_weight_grad(rl_layer *l, rl_device dev, rl_dtype dt, int k, int64_t n,
                                  rl_mat x, rl_mat dz) {
    lstm_layer *L = (lstm_layer *)l;
    int64_t H = L->H, row = 0;
    rl_mat g;
    if (k < 0 && L->ln) return RL_OK; /* the layer makes dU itself, from the recurrent part's dz */
    if (k < 0) {
        RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, dev, &g));
        return gemm(L, dev, dt, true, false, l->n_out, 4 * H, n, x, dz, 1.0, g);
    }
    RL_TRY(rl_param_mat(l, &l->params[P_W].grad, "W (gradient)", dt, dev, &g));
    for (int i = 0; i < k; i++)
        row += l->in_dims[i];
    return gemm(L, dev, dt, true, false, l->in_dims[k], 4 * H, n, x, dz, 1.0,
                rl_mat_sub(g, row, 0, dt));
}

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

/* The cuDNN object runs on the layer's stream: it goes before the stream does. */
static void drop_stream_users(rl_recurrent *r) {
    lstm_layer *L = (lstm_layer *)((char *)r - offsetof(lstm_layer, rec));
    rl_rnn_cudnn_drop(&L->dnn);
}

/* The CPU recurrence. Batch rows never read each other's state, so with the packed kernel
 * and BLAS threads > 1 the batch is cut into row parts (row_parts), each running every step
 * of the pass (its rows' recurrent product and pointwise pass) on a thread of
 * kernels/cpu/parallel.h: one handoff per pass instead of one per step, and the pointwise
 * passes run in parallel too. Otherwise each step's product is split by columns
 * (rl_gemm_packed_f32) and the pointwise pass runs on the calling thread. The results do not
 * depend on the split. */
typedef struct {
    lstm_layer *L;
    rl_dtype dt;
    const int32_t *len;
    rl_mat U, bias, dout; /* bias: forward; dout: backward */
    rl_mat R;             /* n_proj */
    const void *ln[4];    /* layer_norm: g_x, g_h, g_c, b_c */
    const void *const *peep;
    bool packed, backward;
    float *upack; /* packed U (forward) or U^T (backward) when packed */
    float *rpack; /* n_proj: packed R (forward) or R^T (backward) when packed */
} steps_job;

/* Row parts only where each part gets at least a register tile of rows (8) and the packed U
 * (4H x P floats) stays within a core's L2 (1 MiB here); beyond that a step's product is
 * bound by streaming U, which the column split reads once rather than once per part. */
static int row_parts(const lstm_layer *L, bool packed) {
    int64_t H = L->H, P = L->base.n_out;
    int parts = packed ? rl_blas_get_threads() : 1;
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    while (parts > 1 && L->rec.B / parts < 8)
        parts--;
    return 16 * H * P <= (1 << 20) ? parts : 1;
}

/* The zoneout buffers of frame t, rows r0.. (NULL when the last forward had none). */
static bool zo_rows(const lstm_layer *L, int64_t t, int64_t r0, void **mc, void **mh, void **ct) {
    if (!L->zoned) return false;
    int64_t e = (t * L->rec.B + r0) * L->H;
    *mc = L->zc > 0 ? at(&L->mc, e) : NULL;
    *mh = L->zh > 0 ? at(&L->mh, e) : NULL;
    *ct = at(&L->ct, e);
    return true;
}

/* n_proj, after the pointwise pass of frame t, rows r0 .. r0+n-1: h = m R into hs's row cur; a
 * padded row carries h_prev (its m is m_prev, but the initial state has no m) and outputs 0, a
 * valid one outputs h. */
static void project_rows(const steps_job *j, int64_t t, int64_t prev, int64_t cur, int64_t r0,
                         int64_t n) {
    lstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t B = L->rec.B, H = L->H, P = L->base.n_out;
    size_t row = (size_t)P * rl_dtype_size(dt);
    rl_mat M = {at(&L->ms, (cur * B + r0) * H), H}, Hc = {at(&L->hs, (cur * B + r0) * P), P};
    if (j->packed)
        rl_gemm_packed_f32(n, P, H, M.p, H, j->rpack, false, Hc.p, P);
    else
        rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, false, n, P, H, M, j->R, 0.0, Hc);
    for (int64_t b = r0; b < r0 + n; b++) {
        void *h = at(&L->hs, (cur * B + b) * P), *out = at(&L->base.out, (t * B + b) * P);
        if (t >= j->len[b]) {
            memcpy(h, at(&L->hs, (prev * B + b) * P), row);
            memset(out, 0, row);
        } else {
            memcpy(out, h, row);
        }
    }
}

/* layer_norm: the buffers of frame t, rows r0.. (kernels/lstm.h, rl_lstm_ln_f32). */
static void ln_rows(const steps_job *j, int64_t t, int64_t r0, void **p) {
    lstm_layer *L = j->L;
    int64_t e = t * L->rec.B + r0, H = L->H;
    p[0] = at(&L->lnx, e * 4 * H);
    p[1] = at(&L->lnh, e * 4 * H);
    p[2] = at(&L->lnc, e * H);
    p[3] = at(&L->lnrs, e * 9);
    p[4] = j->backward ? at(&L->lng, e * 4 * H) : NULL;
    p[5] = j->backward ? at(&L->lndzh, e * 4 * H) : NULL;
    p[6] = j->backward ? at(&L->lndu, e * H) : NULL;
}

/* layer_norm: the pointwise pass of frame t over rows r0..r1-1 (z: the input part). */
static void ln_step(const steps_job *j, int64_t t, int64_t r0, int64_t n, void *z, const void *cp,
                    const void *hp, void *c, void *h, void *out) {
    int64_t H = j->L->H;
    void *p[7];
    ln_rows(j, t, r0, p);
    if (j->dt == RL_FLOAT32) {
        rl_lstm_ln_f32 ln = {p[0], p[1],     p[2],     p[3],     NULL,    NULL,
                             NULL, j->ln[0], j->ln[1], j->ln[2], j->ln[3]};
        rl_lstm_ln_cpu_fwd_f32(n, H, t, j->len + r0, z, j->bias.p, cp, hp, c, h, out, &ln);
    } else {
        rl_lstm_ln_f64 ln = {p[0], p[1],     p[2],     p[3],     NULL,    NULL,
                             NULL, j->ln[0], j->ln[1], j->ln[2], j->ln[3]};
        rl_lstm_ln_cpu_fwd_f64(n, H, t, j->len + r0, z, j->bias.p, cp, hp, c, h, out, &ln);
    }
}

/* layer_norm: the backward pass of frame t over rows r0..r1-1. */
static void ln_step_back(const steps_job *j, int64_t t, int64_t r0, int64_t n, void *z,
                         const void *cp, const void *c, const void *dot, void *dh, void *dc) {
    int64_t H = j->L->H;
    void *p[7];
    ln_rows(j, t, r0, p);
    if (j->dt == RL_FLOAT32) {
        rl_lstm_ln_f32 ln = {p[0], p[1],     p[2],     p[3],     p[4],    p[5],
                             p[6], j->ln[0], j->ln[1], j->ln[2], j->ln[3]};
        rl_lstm_ln_cpu_bwd_f32(n, H, t, j->len + r0, z, cp, c, dot, j->dout.ld, dh, dc, &ln);
    } else {
        rl_lstm_ln_f64 ln = {p[0], p[1],     p[2],     p[3],     p[4],    p[5],
                             p[6], j->ln[0], j->ln[1], j->ln[2], j->ln[3]};
        rl_lstm_ln_cpu_bwd_f64(n, H, t, j->len + r0, z, cp, c, dot, j->dout.ld, dh, dc, &ln);
    }
}

/* Forward steps of rows r0 .. r1-1. */
static void fwd_rows(const steps_job *j, int64_t r0, int64_t r1) {
    lstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t T = L->rec.T, B = L->rec.B, H = L->H, P = L->base.n_out, BH = B * H, BP = B * P,
            n = r1 - r0;
    for (int64_t s = 0; s < T; s++) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1, cur = L->direction > 0 ? t + 1 : t;
        rl_mat Hp = {at(&L->hs, prev * BP + r0 * P), P},
               Zt = {at(&L->gates, (t * B + r0) * 4 * H), 4 * H}, Hm = Hp;
        if (L->rdropped) { /* the product reads the dropped state */
            Hm.p = at(&L->hd, t * BP + r0 * P);
            rl_recurrent_mask_rows(dt, n, P, Hp.p, at(&L->md, r0 * P), Hm.p, false);
        }
        /* layer_norm normalises the recurrent part on its own: it goes to lnh */
        rl_mat Zp = L->ln ? (rl_mat){at(&L->lnh, (t * B + r0) * 4 * H), 4 * H} : Zt;
        if (j->packed)
            rl_gemm_packed_f32(n, 4 * H, P, Hm.p, P, j->upack, !L->ln, Zp.p, 4 * H);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, false, n, 4 * H, P, Hm, j->U,
                        L->ln ? 0.0 : 1.0, Zp);
        void *cp = at(&L->cs, prev * BH + r0 * H), *c = at(&L->cs, cur * BH + r0 * H),
             *h = at(&L->hs, cur * BP + r0 * P), *out = at(&L->base.out, t * BP + r0 * P);
        void *hp = Hp.p;
        if (L->proj) { /* the pass writes m; project_rows makes h and the output of it */
            hp = at(&L->ms, prev * BH + r0 * H);
            h = at(&L->ms, cur * BH + r0 * H);
            out = at(&L->mscr, r0 * H);
        }
        void *mc = NULL, *mh = NULL, *ct = NULL;
        bool zo = zo_rows(L, t, r0, &mc, &mh, &ct);
        if (L->ln) {
            ln_step(j, t, r0, n, Zt.p, cp, hp, c, h, out);
        } else if (dt == RL_FLOAT32) {
            rl_lstm_zo_f32 z = {mc, mh, ct};
            rl_lstm_cpu_fwd_f32(n, H, t, j->len + r0, Zt.p, j->bias.p,
                                (const float *const *)j->peep, cp, hp, c, h, out, zo ? &z : NULL);
        } else {
            rl_lstm_zo_f64 z = {mc, mh, ct};
            rl_lstm_cpu_fwd_f64(n, H, t, j->len + r0, Zt.p, j->bias.p,
                                (const double *const *)j->peep, cp, hp, c, h, out, zo ? &z : NULL);
        }
        if (L->proj) project_rows(j, t, prev, cur, r0, n);
    }
}

/* n_proj, before the pointwise pass of frame t in backward, rows r0 .. r0+n-1: the frame's
 * dLoss/dh (the running dh plus dout on a valid row, 0 on a padded one, whose dh passes through)
 * into drs, dh = 0 on valid rows (the step's dz U^T is added to it after the pass), and
 * dLoss/dm = drs_t R^T into dm, which the pass reads as its dh. */
static void unproject_rows(const steps_job *j, int64_t t, int64_t r0, int64_t n, const void *dot) {
    lstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t B = L->rec.B, H = L->H, P = L->base.n_out;
    size_t es = rl_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        void *d = at(&L->drs, (t * B + r0 + i) * P), *dh = at(&L->dh, (r0 + i) * P);
        const void *o = dot ? (const char *)dot + (size_t)(i * j->dout.ld) * es : NULL;
        if (t >= j->len[r0 + i]) {
            memset(d, 0, (size_t)P * es);
        } else if (dt == RL_FLOAT32) {
            float *df = d, *hf = dh;
            const float *of = o;
            for (int64_t k = 0; k < P; k++) {
                df[k] = hf[k] + (of ? of[k] : 0.0f);
                hf[k] = 0.0f;
            }
        } else {
            double *df = d, *hf = dh;
            const double *of = o;
            for (int64_t k = 0; k < P; k++) {
                df[k] = hf[k] + (of ? of[k] : 0.0);
                hf[k] = 0.0;
            }
        }
    }
    rl_mat D = {at(&L->drs, (t * B + r0) * P), P}, M = {at(&L->dm, r0 * H), H};
    if (j->packed)
        rl_gemm_packed_f32(n, H, P, D.p, P, j->rpack, false, M.p, H);
    else
        rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, true, n, H, P, D, j->R, 0.0, M);
}

/* Backward steps of rows r0 .. r1-1: dZ over the gates, dh, dc. */
static void bwd_rows(const steps_job *j, int64_t r0, int64_t r1) {
    lstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t T = L->rec.T, B = L->rec.B, H = L->H, P = L->base.n_out, BH = B * H, n = r1 - r0;
    size_t es = rl_dtype_size(dt);
    rl_mat dH = {at(&L->dh, r0 * P), P};
    void *dc = at(&L->dc, r0 * H);
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = L->direction > 0 ? s : T - 1 - s;
        int64_t prev = L->direction > 0 ? t : t + 1, cur = L->direction > 0 ? t + 1 : t;
        rl_mat Zt = {at(&L->gates, (t * B + r0) * 4 * H), 4 * H};
        const void *dot =
            j->dout.p ? (char *)j->dout.p + (size_t)((t * B + r0) * j->dout.ld) * es : NULL;
        void *cp = at(&L->cs, prev * BH + r0 * H), *c = at(&L->cs, cur * BH + r0 * H);
        void *dh = dH.p;
        if (L->proj) { /* the pass sees dLoss/dm */
            unproject_rows(j, t, r0, n, dot);
            dot = NULL;
            dh = at(&L->dm, r0 * H);
        }
        void *mc = NULL, *mh = NULL, *ct = NULL;
        bool zo = zo_rows(L, t, r0, &mc, &mh, &ct);
        if (L->ln) {
            ln_step_back(j, t, r0, n, Zt.p, cp, c, dot, dh, dc);
        } else if (dt == RL_FLOAT32) {
            rl_lstm_zo_f32 z = {mc, mh, ct};
            rl_lstm_cpu_bwd_f32(n, H, t, j->len + r0, Zt.p, (const float *const *)j->peep, cp, c,
                                dot, j->dout.ld, dh, dc, zo ? &z : NULL);
        } else {
            rl_lstm_zo_f64 z = {mc, mh, ct};
            rl_lstm_cpu_bwd_f64(n, H, t, j->len + r0, Zt.p, (const double *const *)j->peep, cp, c,
                                dot, j->dout.ld, dh, dc, zo ? &z : NULL);
        }
        /* padded rows of dZ_t are 0, so their dh passes through unchanged; with rec_dropout
         * the product's gradient goes through the mask */
        rl_mat D = L->rdropped ? (rl_mat){at(&L->dtmp, r0 * P), P} : dH;
        if (L->ln) Zt.p = at(&L->lndzh, (t * B + r0) * 4 * H); /* the recurrent part's dz */
        if (j->packed)
            rl_gemm_packed_f32(n, P, 4 * H, Zt.p, 4 * H, j->upack, !L->rdropped, D.p, P);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, true, n, P, 4 * H, Zt, j->U,
                        L->rdropped ? 0.0 : 1.0, D);
        if (L->rdropped) rl_recurrent_mask_rows(dt, n, P, D.p, at(&L->md, r0 * P), dH.p, true);
    }
}

static void steps_part(void *ctx, int part, int parts) {
    const steps_job *j = ctx;
    int64_t B = j->L->rec.B, r0 = B * part / parts, r1 = B * (part + 1) / parts;
    if (j->backward)
        bwd_rows(j, r0, r1);
    else
        fwd_rows(j, r0, r1);
}

/* Packs U (forward) or U^T (backward) for the packed kernel, and so R or R^T with n_proj, then
 * runs the steps. R is the layer's own buffer, packed at every pass: the packs' slots hold one
 * operand at a time outside a rec unit. */
static rl_status run_steps(steps_job *j) {
    lstm_layer *L = j->L;
    int64_t H = L->H, P = L->base.n_out;
    j->packed = j->dt == RL_FLOAT32 && rl_gemm_packed_fast();
    if (j->packed) {
        int64_t n = j->backward ? rl_gemm_packed_size(4 * H, P) : rl_gemm_packed_size(P, 4 * H);
        bool stale;
        RL_TRY(rl_recurrent_pack_slot(&L->rec, &L->base, j->backward ? RL_PACK_UT : RL_PACK_U, n,
                                      &j->upack, &stale));
        if (stale && j->backward)
            rl_gemm_pack_f32(j->upack, j->U.p, 4 * H, true, 4 * H, P);
        else if (stale)
            rl_gemm_pack_f32(j->upack, j->U.p, 4 * H, false, P, 4 * H);
    }
    if (j->packed && L->proj) {
        int64_t n = j->backward ? rl_gemm_packed_size(P, H) : rl_gemm_packed_size(H, P);
        RL_TRY(rl_buffer_ensure(&L->rpack, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
        j->rpack = rl_tensor_data(&L->rpack);
        if (j->backward)
            rl_gemm_pack_f32(j->rpack, j->R.p, P, true, P, H);
        else
            rl_gemm_pack_f32(j->rpack, j->R.p, P, false, H, P);
    }
    int parts = row_parts(L, j->packed);
    if (parts > 1)
        rl_cpu_parallel(parts, steps_part, j);
    else
        steps_part(j, 0, 1);
    return RL_OK;
}

/* The forward recurrence on the CPU. peep: NULL without peepholes; R: n_proj's; lnp: layer_norm's
 * g_x, g_h, g_c, b_c. */
static rl_status forward_steps_cpu(lstm_layer *L, rl_dtype dt, const int32_t *len, rl_mat U,
                                   rl_mat R, rl_mat bias, const void *const *peep,
                                   const void *const *lnp) {
    steps_job j = {.L = L, .dt = dt, .len = len, .U = U, .R = R, .bias = bias, .peep = peep};
    for (int k = 0; k < 4; k++)
        j.ln[k] = lnp[k];
    return run_steps(&j);
}

/* The backward recurrence on the CPU, then over all frames db, dpeep, n_proj's dR = M^T dH and
 * dU = Hprev^T dZ (unless the caller makes the weight gradients of W and U,
 * rl_recurrent_set_gates). */
static rl_status backward_steps_cpu(lstm_layer *L, rl_dtype dt, const int32_t *len, rl_mat dout,
                                    rl_mat U, rl_mat R, rl_mat dR, rl_mat db,
                                    const void *const *peep, void *const *dpeep,
                                    const void *const *lnp, void *const *dlnp) {
    int64_t T = L->rec.T, B = L->rec.B, H = L->H, P = L->base.n_out, BH = B * H;
    steps_job j = {
        .L = L, .dt = dt, .len = len, .U = U, .R = R, .dout = dout, .peep = peep, .backward = true};
    for (int k = 0; k < 4; k++)
        j.ln[k] = lnp[k];
    RL_TRY(run_steps(&j));
    void *cp = at(&L->cs, L->direction > 0 ? 0 : BH), *c = at(&L->cs, L->direction > 0 ? BH : 0);
    if (L->zoned) c = rl_tensor_data(&L->ct); /* p_o multiplies c~ */
    if (L->ln) { /* b and the gains from the gates' and the normalised cell's gradients */
        void *p[7];
        ln_rows(&j, 0, 0, p);
        if (dt == RL_FLOAT32) {
            rl_lstm_ln_f32 ln = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], NULL, NULL, NULL, NULL};
            rl_lstm_ln_cpu_param_grads_f32(T * B, H, &ln, db.p, dlnp[0], dlnp[1], dlnp[2], dlnp[3]);
        } else {
            rl_lstm_ln_f64 ln = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], NULL, NULL, NULL, NULL};
            rl_lstm_ln_cpu_param_grads_f64(T * B, H, &ln, db.p, dlnp[0], dlnp[1], dlnp[2], dlnp[3]);
        }
    } else if (dt == RL_FLOAT32) {
        rl_lstm_cpu_param_grads_f32(T * B, H, rl_tensor_data(&L->gates), cp, c, db.p,
                                    (float *const *)dpeep);
    } else {
        rl_lstm_cpu_param_grads_f64(T * B, H, rl_tensor_data(&L->gates), cp, c, db.p,
                                    (double *const *)dpeep);
    }
    if (L->proj) { /* each frame's m (rows cur) against its dLoss/dh (0 on padded rows) */
        rl_mat M = {at(&L->ms, L->direction > 0 ? BH : 0), H}, D = {rl_tensor_data(&L->drs), P};
        RL_TRY(gemm(L, RL_DEVICE_CPU, dt, true, false, H, P, T * B, M, D, 1.0, dR));
    }
    rl_mat Hprev = {at(&L->hs, L->direction > 0 ? 0 : B * P), P};
    if (L->rdropped) Hprev.p = rl_tensor_data(&L->hd); /* dU pairs dZ with what U multiplied */
    if (L->ln) { /* dU from the recurrent part's gradients, also in a rec unit (lstm_weight_grad) */
        rl_mat dZH = {rl_tensor_data(&L->lndzh), 4 * H}, dU;
        RL_TRY(rl_param_mat(&L->base, &L->base.params[P_U].grad, "U (gradient)", dt, RL_DEVICE_CPU,
                            &dU));
        return gemm(L, RL_DEVICE_CPU, dt, true, false, P, 4 * H, T * B, Hprev, dZH, 1.0, dU);
    }
    if (L->rec.defer_fwd) return RL_OK;
    rl_mat dZ = {rl_tensor_data(&L->gates), 4 * H};
    return lstm_weight_grad(&L->base, RL_DEVICE_CPU, dt, -1, T * B, Hprev, dZ);
}

static rl_status lstm_forward(rl_layer *l, rl_layer_io *io) {
    lstm_layer *L = (lstm_layer *)l;
    rl_recurrent *r = &L->rec;
    int64_t H = L->H, P = l->n_out;
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_recurrent_forward_begin(r, l, io, &dt, &dev));
    if (L->zc > 0 || L->zh > 0) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "zoneout"));
    if (L->rd > 0) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "rec_dropout"));
    if (L->proj) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "n_proj"));
    if (L->ln) RL_TRY(rl_recurrent_cpu_only(r, l, dev, "layer_norm"));
    if (L->cudnn && dev.type != RL_CUDA)
        return rl_error(RL_EDEVICE,
                        "layer '%s' (lstm): impl = \"cudnn\" needs CUDA tensors, the inputs "
                        "are on cpu (use impl = \"own\" on the CPU)",
                        l->name);
    int64_t T = r->T, B = r->B;
    rl_mat W, U, bias, R = {NULL, 0};
    const void *peep[3] = {NULL, NULL, NULL};
    RL_TRY(rl_param_mat(l, &l->params[P_W].value, "W", dt, dev, &W));
    RL_TRY(rl_param_mat(l, &l->params[P_U].value, "U", dt, dev, &U));
    RL_TRY(rl_param_mat(l, &l->params[P_B].value, "b", dt, dev, &bias));
    if (L->proj) RL_TRY(rl_param_mat(l, &l->params[L->p_r].value, "R", dt, dev, &R));
    const void *lnp[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4 && L->ln; k++) {
        rl_mat pm;
        RL_TRY(rl_param_mat(l, &l->params[L->p_ln + k].value, l->params[L->p_ln + k].name, dt, dev,
                            &pm));
        lnp[k] = pm.p;
    }
    for (int k = 0; k < 3 && L->peepholes; k++) {
        rl_mat pm;
        RL_TRY(rl_param_mat(l, &l->params[P_PI + k].value, l->params[P_PI + k].name, dt, dev, &pm));
        peep[k] = pm.p;
    }
    /* hs, cs hold the final state another layer may take as its initial state */
    const rl_tensor *written[2] = {&L->hs, &L->cs};
#ifdef RL_WITH_CUDA
    if (L->cudnn) {
        rl_mat p[4] = {W, U, bias, {NULL, 0}};
        RL_TRY(rl_rnn_cudnn_forward(&L->dnn, r, l, RL_CUDNN_LSTM, L->direction, io, dt, dev, p,
                                    &r->init[0], &r->init[1], &L->hs, &L->cs));
        return rl_recurrent_forward_end(r, l, 1, io->train, written, 2);
    }
#endif
    int64_t gshape[3] = {T, B, 4 * H}, sshape[3] = {T + 1, B, H}, hshape[3] = {T + 1, B, P};
    RL_TRY(rl_recurrent_gates(r, l, &L->gates, dt, dev, gshape));
    RL_TRY(rl_buffer_ensure_synced(&L->hs, dt, dev, 3, hshape));
    RL_TRY(rl_buffer_ensure_synced(&L->cs, dt, dev, 3, sshape));
    if (L->proj) {
        int64_t mshape[2] = {B, H};
        RL_TRY(rl_buffer_ensure_synced(&L->ms, dt, dev, 3, sshape));
        RL_TRY(rl_buffer_ensure_synced(&L->mscr, dt, dev, 2, mshape));
    }
    if (L->ln) {
        int64_t cshape[3] = {T, B, H}, rshape[3] = {T, B, 9};
        RL_TRY(rl_buffer_ensure_synced(&L->lnx, dt, dev, 3, gshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lnh, dt, dev, 3, gshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lnc, dt, dev, 3, cshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lnrs, dt, dev, 3, rshape));
    }

    /* the initial state row */
    int64_t init_row = L->direction > 0 ? 0 : T;
    rl_tensor hrow = {0}, crow = {0};
    RL_TRY(rl_tensor_select(&hrow, &L->hs, 0, init_row));
    rl_status st = rl_tensor_select(&crow, &L->cs, 0, init_row);
    if (st == RL_OK) st = rl_recurrent_write_state(r, &hrow, &r->init[0]);
    if (st == RL_OK) st = rl_recurrent_write_state(r, &crow, &r->init[1]);
    rl_tensor_release(&hrow);
    rl_tensor_release(&crow);
    RL_TRY(st);
    if (L->proj) { /* a padded first frame carries this m: finite, as dR reads it */
        rl_tensor mrow = {0};
        RL_TRY(rl_tensor_select(&mrow, &L->ms, 0, init_row));
        st = rl_recurrent_write_state(r, &mrow, NULL);
        rl_tensor_release(&mrow);
        RL_TRY(st);
    }

    /* input projection of all frames: one GEMM per input, accumulated */
    rl_mat Z = {rl_tensor_data(&L->gates), 4 * H};
    float *wpack = NULL;
    if (rl_recurrent_packed_inputs(r, dt, dev)) RL_TRY(pack_inputs(L, false, W.p, &wpack));
    int64_t row = 0;
    bool first = true; /* no input's product in Z yet */
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        if (rl_recurrent_zero_input(r, k)) { /* its product would add zeros */
            if (wpack) wpack += rl_gemm_packed_size(F, 4 * H);
            row += F;
            continue;
        }
        rl_mat X;
        if (!rl_mat_fold_tb(io->in[k], &X)) {
            RL_TRY(rl_buffer_ensure_synced(&L->xs[k], dt, dev, 3, io->in[k]->shape));
            RL_TRY(rl_op_copy(&L->xs[k], io->in[k]));
            X = (rl_mat){rl_tensor_data(&L->xs[k]), F};
        }
        rl_mat Wk = {(char *)W.p + (size_t)(row * 4 * H) * rl_dtype_size(dt), 4 * H};
        if (wpack) {
            rl_gemm_packed_f32(T * B, 4 * H, F, X.p, X.ld, wpack, !first, Z.p, 4 * H);
            wpack += rl_gemm_packed_size(F, 4 * H);
        } else {
            RL_TRY(gemm(L, dev, dt, false, false, T * B, 4 * H, F, X, Wk, first ? 0.0 : 1.0, Z));
        }
        first = false;
        row += F;
    }

    L->zoned = L->zc > 0 || L->zh > 0;
    if (L->zoned) {
        int64_t zshape[3] = {T, B, H};
        RL_TRY(rl_buffer_ensure_synced(&L->ct, dt, dev, 3, zshape));
        if (L->zc > 0) RL_TRY(rl_recurrent_zoneout_mask(r, l, io, L->zc, &L->mc, dt, dev));
        if (L->zh > 0) RL_TRY(rl_recurrent_zoneout_mask(r, l, io, L->zh, &L->mh, dt, dev));
    }
    L->rdropped = io->train && L->rd > 0;
    if (L->rdropped) {
        int64_t dshape[3] = {T, B, P};
        RL_TRY(rl_recurrent_rec_dropout_mask(r, l, io, L->rd, &L->md, dt, dev));
        RL_TRY(rl_buffer_ensure_synced(&L->hd, dt, dev, 3, dshape));
    }
    const void *const *pp = L->peepholes ? peep : NULL;
    if (dev.type == RL_CPU)
        RL_TRY(forward_steps_cpu(L, dt, rl_tensor_data(io->lengths), U, R, bias, pp, lnp));
#ifdef RL_WITH_CUDA
    else
        RL_TRY(rl_lstm_cuda_forward(r->stream, dt, T, B, H, L->direction,
                                    rl_tensor_data(&r->len_dev), rl_tensor_data(&L->gates), U.p,
                                    bias.p, pp, rl_tensor_data(&L->hs), rl_tensor_data(&L->cs),
                                    rl_tensor_data(&l->out)));
#endif
    return rl_recurrent_forward_end(r, l, L->direction > 0 ? T : 0, true, written, 2);
}

static rl_status lstm_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                               rl_tensor *const *grad_in) {
    lstm_layer *L = (lstm_layer *)l;
    rl_recurrent *r = &L->rec;
    int64_t H = L->H, P = l->n_out;
    rl_dtype dt;
    rl_device dev;
    rl_mat dout;
    if (L->cudnn && (r->final_grad[0].storage || r->final_grad[1].storage))
        return rl_error(
            RL_EARG, "layer '%s' (lstm): impl = \"cudnn\" takes no final state gradients", l->name);
    RL_TRY(rl_recurrent_backward_begin(r, l, io, grad_out, grad_in, &dt, &dev, &dout));
    int64_t T = r->T, B = r->B;
    rl_mat W, U, dW, dU, db, R = {NULL, 0}, dR = {NULL, 0};
    const void *peep[3] = {NULL, NULL, NULL};
    void *dpeep[3] = {NULL, NULL, NULL};
    RL_TRY(rl_param_mat(l, &l->params[P_W].value, "W", dt, dev, &W));
    RL_TRY(rl_param_mat(l, &l->params[P_U].value, "U", dt, dev, &U));
    RL_TRY(rl_param_mat(l, &l->params[P_W].grad, "W (gradient)", dt, dev, &dW));
    RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, dev, &dU));
    RL_TRY(rl_param_mat(l, &l->params[P_B].grad, "b (gradient)", dt, dev, &db));
    if (L->proj) {
        RL_TRY(rl_param_mat(l, &l->params[L->p_r].value, "R", dt, dev, &R));
        RL_TRY(rl_param_mat(l, &l->params[L->p_r].grad, "R (gradient)", dt, dev, &dR));
    }
    const void *lnp[4] = {NULL, NULL, NULL, NULL};
    void *dlnp[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4 && L->ln; k++) {
        const rl_param *q = &l->params[L->p_ln + k];
        rl_mat pm, gm;
        RL_TRY(rl_param_mat(l, &q->value, q->name, dt, dev, &pm));
        RL_TRY(rl_param_mat(l, &q->grad, q->name, dt, dev, &gm));
        lnp[k] = pm.p;
        dlnp[k] = gm.p;
    }
    for (int k = 0; k < 3 && L->peepholes; k++) {
        rl_mat pm, gm;
        RL_TRY(rl_param_mat(l, &l->params[P_PI + k].value, l->params[P_PI + k].name, dt, dev, &pm));
        RL_TRY(rl_param_mat(l, &l->params[P_PI + k].grad, l->params[P_PI + k].name, dt, dev, &gm));
        peep[k] = pm.p;
        dpeep[k] = gm.p;
    }
    /* the initial state's gradients, read by whoever gave that state */
    const rl_tensor *written[2] = {&L->dh, &L->dc};
#ifdef RL_WITH_CUDA
    if (L->cudnn) {
        rl_mat g[4] = {dW, dU, db, {NULL, 0}};
        RL_TRY(rl_rnn_cudnn_backward(&L->dnn, r, l, io, grad_in, dt, dev, dout, g, &L->dh, &L->dc));
        return rl_recurrent_backward_end(r, io, grad_in, written, 2);
    }
#endif
    RL_TRY(rl_recurrent_start_state_grads(r, dt, dev));
    if (L->rdropped) {
        int64_t dshape[2] = {B, P};
        RL_TRY(rl_buffer_ensure_synced(&L->dtmp, dt, dev, 2, dshape));
    }
    if (L->proj) {
        int64_t dshape[3] = {T, B, P}, mshape[2] = {B, H};
        RL_TRY(rl_buffer_ensure_synced(&L->drs, dt, dev, 3, dshape));
        RL_TRY(rl_buffer_ensure_synced(&L->dm, dt, dev, 2, mshape));
    }
    if (L->ln) {
        int64_t gshape[3] = {T, B, 4 * H}, cshape[3] = {T, B, H};
        RL_TRY(rl_buffer_ensure_synced(&L->lng, dt, dev, 3, gshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lndzh, dt, dev, 3, gshape));
        RL_TRY(rl_buffer_ensure_synced(&L->lndu, dt, dev, 3, cshape));
    }

    const void *const *pp = L->peepholes ? peep : NULL;
    void *const *dpp = L->peepholes ? dpeep : NULL;
    if (dev.type == RL_CPU)
        RL_TRY(backward_steps_cpu(L, dt, rl_tensor_data(io->lengths), dout, U, R, dR, db, pp, dpp,
                                  lnp, dlnp));
#ifdef RL_WITH_CUDA
    else {
        int64_t rshape[2] = {RL_LSTM_CUDA_CHUNKS, 7 * H};
        RL_TRY(rl_buffer_ensure_synced(&L->red, dt, dev, 2, rshape));
        RL_TRY(rl_lstm_cuda_backward(r->stream, dt, T, B, H, L->direction,
                                     rl_tensor_data(&r->len_dev), rl_tensor_data(&L->gates), U.p,
                                     pp, rl_tensor_data(&L->hs), rl_tensor_data(&L->cs), dout.p,
                                     dout.ld, rl_tensor_data(&L->dh), rl_tensor_data(&L->dc), dU.p,
                                     db.p, dpp, rl_tensor_data(&L->red)));
    }
#endif

    /* weight gradients (unless the caller makes them over all steps) and input gradients:
     * single GEMMs over all frames */
    rl_mat dZ = {rl_tensor_data(&L->gates), 4 * H};
    float *wtpack = NULL;
    if (grad_in && rl_recurrent_packed_inputs(r, dt, dev))
        RL_TRY(pack_inputs(L, true, W.p, &wtpack));
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        size_t off = (size_t)(row * 4 * H) * rl_dtype_size(dt);
        rl_mat X;
        if (!rl_mat_fold_tb(io->in[k], &X)) X = (rl_mat){rl_tensor_data(&L->xs[k]), F};
        if (!rl_recurrent_zero_input(r, k) && !r->defer_fwd) /* zero input: X^T dZ = 0 */
            RL_TRY(lstm_weight_grad(l, dev, dt, k, T * B, X, dZ));
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi) {
            rl_mat G;
            bool direct = rl_mat_fold_tb(gi, &G);
            if (!direct) {
                RL_TRY(rl_buffer_ensure_synced(&L->dxs[k], dt, dev, 3, gi->shape));
                G = (rl_mat){rl_tensor_data(&L->dxs[k]), F};
            }
            if (wtpack)
                rl_gemm_packed_f32(T * B, F, 4 * H, dZ.p, 4 * H, wtpack, false, G.p, G.ld);
            else
                RL_TRY(gemm(L, dev, dt, false, true, T * B, F, 4 * H, dZ,
                            (rl_mat){(char *)W.p + off, 4 * H}, 0.0, G));
            if (!direct) RL_TRY(rl_op_copy(gi, &L->dxs[k]));
        }
        if (wtpack) wtpack += rl_gemm_packed_size(4 * H, F);
        row += F;
    }
    return rl_recurrent_backward_end(r, io, grad_in, written, 2);
}

static void lstm_destroy(rl_layer *l) {
    lstm_layer *L = (lstm_layer *)l;
    rl_recurrent_free(&L->rec); /* drops the cuDNN object, waits for and destroys the stream */
    rl_rnn_cudnn_free(&L->dnn);
    rl_tensor *ts[] = {&L->gates, &L->hs,   &L->cs,   &L->dh,  &L->dc,    &L->red,
                       &L->mc,    &L->mh,   &L->ct,   &L->md,  &L->hd,    &L->dtmp,
                       &L->ms,    &L->mscr, &L->drs,  &L->dm,  &L->rpack, &L->lnx,
                       &L->lnh,   &L->lnc,  &L->lnrs, &L->lng, &L->lndzh, &L->lndu};
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
    RL_TRY(rl_tensor_narrow(&f, &l->params[rl_layer_find_param(l, "b")].value, 0, L->H, L->H));
    rl_status st = rl_op_fill(&f, L->forget_bias);
    rl_tensor_release(&f);
    return st;
}

static const rl_layer_ops lstm_ops = {.class_name = "lstm",
                                      .forward = lstm_forward,
                                      .backward = lstm_backward,
                                      .destroy = lstm_destroy,
                                      .init_params = lstm_init_params,
                                      .state = &rl_recurrent_state_ops};

/* n_proj = P (1 <= P < n_out) in *P, or n_out without the option. */
static rl_status proj_option(const rl_options *o, const char *name, int64_t H, bool cudnn,
                             bool zoneout, int64_t *P) {
    int found = 0;
    double d = 0;
    RL_TRY(o->number(o->ctx, "n_proj", &d, &found));
    *P = H;
    if (!found) return RL_OK;
    if (d != floor(d) || d < 1 || d >= (double)H)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): option n_proj = %g, expected an integer in 1..%" PRId64
                        " (below n_out = %" PRId64 ")",
                        name, d, H - 1, H);
    if (cudnn)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): option n_proj and impl = \"cudnn\" do not go together "
                        "(use impl = \"own\")",
                        name);
    if (zoneout)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): options n_proj and zoneout do not go together (zoneout "
                        "of a projected state is not implemented)",
                        name);
    *P = (int64_t)d;
    return RL_OK;
}

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
    bool cudnn;
    double zc, zh;
    RL_TRY(rl_rnn_cudnn_option(opts, name, "lstm", &cudnn));
    RL_TRY(rl_recurrent_zoneout_option(opts, name, "lstm", true, cudnn, &zc, &zh));
    double rd;
    RL_TRY(rl_recurrent_rec_dropout_option(opts, name, "lstm", cudnn, &rd));
    if (cudnn && peep)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): peepholes = true and impl = \"cudnn\" do not go "
                        "together (cuDNN's LSTM has no peepholes; use impl = \"own\")",
                        name);
    int64_t P;
    RL_TRY(proj_option(opts, name, H, cudnn, zc > 0 || zh > 0, &P));
    bool ln;
    RL_TRY(rl_opt_bool(opts, name, "layer_norm", false, &ln));
    const char *without = cudnn              ? "impl = \"cudnn\""
                          : peep             ? "peepholes"
                          : zc > 0 || zh > 0 ? "zoneout"
                                             : NULL;
    if (ln && without)
        return rl_error(RL_EARG,
                        "layer '%s' (lstm): option layer_norm and %s do not go together (%s)", name,
                        without,
                        cudnn ? "cuDNN's LSTM has no layer normalisation; use impl = \"own\""
                              : "not implemented");
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
    l->n_out = P;
    L->H = H;
    L->proj = P != H;
    L->ln = ln;
    L->direction = (int)dir;
    L->peepholes = peep;
    L->cudnn = cudnn;
    L->forget_bias = fb;
    L->zc = zc;
    L->zh = zh;
    L->rd = rd;
    L->rec.cls = "lstm";
    L->rec.on_stream_drop = drop_stream_users;
    L->rec.weight_grad = lstm_weight_grad;
    L->rec.n_states = 2;
    L->rec.state_names[0] = "h";
    L->rec.state_names[1] = "c";
    L->rec.state_dims[0] = P;
    L->rec.state_dims[1] = H;
    L->rec.seq[0] = &L->hs;
    L->rec.seq[1] = &L->cs;
    L->rec.grad0[0] = &L->dh;
    L->rec.grad0[1] = &L->dc;
    L->rec.gates_cols = 4 * H;
    int64_t ws[2] = {F, 4 * H}, us[2] = {P, 4 * H}, bs[1] = {4 * H}, ps[1] = {H}, rs[2] = {H, P};
    rl_status st = rl_layer_add_param(l, "W", 2, ws, RL_INIT_GLOROT, 1.0, F, 4 * H, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U", 2, us, RL_INIT_ORTHOGONAL, 1.0, P, 4 * H, NULL);
    if (st == RL_OK) st = rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    const char *pn[3] = {"p_i", "p_f", "p_o"};
    for (int k = 0; k < 3 && peep && st == RL_OK; k++)
        st = rl_layer_add_param(l, pn[k], 1, ps, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    L->p_r = l->n_params;
    if (st == RL_OK && L->proj)
        st = rl_layer_add_param(l, "R", 2, rs, RL_INIT_GLOROT, 1.0, H, P, NULL);
    L->p_ln = l->n_params;
    const char *gn[4] = {"g_x", "g_h", "g_c", "b_c"};
    for (int k = 0; k < 4 && ln && st == RL_OK; k++) {
        int64_t gs[1] = {k < 2 ? 4 * H : H};
        st = rl_layer_add_param(l, gn[k], 1, gs, k < 3 ? RL_INIT_CONSTANT : RL_INIT_ZEROS,
                                k < 3 ? 1.0 : 0.0, 0, 0, NULL);
    }
    if (st != RL_OK) {
        rl_layer_free(l);
        return st;
    }
    *out = l;
    return RL_OK;
}

static rl_status check_lstm(const rl_layer *l, const char *fn) {
    if (!l || l->ops != &lstm_ops)
        return rl_error(RL_EARG, "%s: layer '%s' is not an lstm", fn, l ? l->name : "(null)");
    return RL_OK;
}

/* The typed forms of the layer.h state calls, for C callers that know the class. */
rl_status rl_lstm_set_initial_state(rl_layer *l, const rl_tensor *h0, const rl_tensor *c0) {
    RL_TRY(check_lstm(l, "rl_lstm_set_initial_state"));
    const rl_tensor *s[2] = {h0, c0};
    return rl_layer_set_initial_state(l, 2, s);
}

rl_status rl_lstm_set_final_state_grad(rl_layer *l, const rl_tensor *dh, const rl_tensor *dc) {
    RL_TRY(check_lstm(l, "rl_lstm_set_final_state_grad"));
    const rl_tensor *g[2] = {dh, dc};
    return rl_layer_set_final_state_grad(l, 2, g);
}

rl_status rl_lstm_final_state(rl_layer *l, rl_tensor *h, rl_tensor *c) {
    RL_TRY(check_lstm(l, "rl_lstm_final_state"));
    rl_tensor *out[2] = {h, c};
    return rl_layer_final_state(l, 2, out);
}

rl_status rl_lstm_initial_state_grad(rl_layer *l, rl_tensor *dh0, rl_tensor *dc0) {
    RL_TRY(check_lstm(l, "rl_lstm_initial_state_grad"));
    rl_tensor *out[2] = {dh0, dc0};
    return rl_layer_initial_state_grad(l, 2, out);
}
