/* softmax: out = p = softmax(z) over the features, z = concat(in_1, ..., in_n) W + b (the affine
 * map, weight layout and init of linear.c: W (sum F_i, n_out) glorot, b (n_out) zeros unless
 * with_bias = false).
 *   forward:  z -= max_f z (stable);  p = exp(z) / sum_f exp(z)
 *   loss "ce" with io->target (T, B) int32: logp = z - log sum_f exp(z);
 *             io->loss = -sum_{t < len[b]} logp[t, b, target]  (summed, not averaged),
 *             io->n_errors = valid frames with argmax p != target, io->n_frames = sum len
 *   backward: dz = p * (grad_out - sum_f grad_out * p)     (the softmax Jacobian; when grad_out)
 *             dz += p - onehot(target) on valid frames, 0 on padded ones
 *                                                      (a "ce" layer whose forward had a target)
 *             then dW, db, grad_in as in linear.
 * label_smoothing = eps (option, [0, 1), default 0; "ce" only): in training forwards
 *           (io->train) the target is (1 - eps) onehot + eps / n_out, PyTorch's
 *           CrossEntropyLoss(label_smoothing = eps): io->loss = sum over valid frames of
 *           (1 - eps) (-logp[target]) + eps mean_c (-logp[c]), dz = p - (1 - eps) onehot
 *           - eps / n_out; forwards with train = false (scoring) compute the plain loss.
 * With grad_out == NULL a "ce" layer starts from its own loss; given grad_out (the output also
 * feeds other layers) both terms are summed, the gradient of loss + <grad_out, out>.
 * loss = "mse" (or no loss) makes a plain softmax output: the network applies rl_loss_mse to
 * out and hands its gradient in as grad_out.
 * loss "ctc" with io->target (S, B) int32 labels and io->target_lengths (B): Connectionist
 * Temporal Classification over the n_out = n_labels + 1 classes, the blank at class
 * blank_index (option; default n_out - 1, after the labels). Label k of the target is class k
 * for k < blank_index and class k + 1 otherwise (with the default, label k is class k); a
 * label outside 0..n_labels-1 is an error naming the layer and the sequence. kernels/ctc.h
 * computes, fused with the log-softmax of z, the loss per
 * sequence and its gradient cg = p - posteriors (0 on padded frames) in forward;
 *             io->loss = sum of the finite sequence losses; a sequence no alignment fits
 *             (infinite loss) is left out of loss and gradient and counted in io->n_skipped;
 *             io->n_errors = sum over sequences of the edit distance between the best path
 *             (argmax per frame, repeats merged, blanks removed) and the target, io->n_labels
 *             = sum of the target lengths, io->n_frames = sum len
 *   backward: dz = cg (+ the softmax Jacobian term when grad_out), then as in linear.
 * On the CPU (ce or no loss) the row passes are fused (kernels/softmax_ce.h): the affine map
 * writes the logits
 * into out, one sweep per row turns them into p in place and adds up the loss and the errors,
 * and backward writes p - onehot in one more; the (T, B) targets are kept, -1 on padded frames.
 * Elsewhere (CUDA) they are generic ops over (T, B, n_out) with the state of loss.h.
 * Buffers: out = p (T, B, n_out); dz (T, B, n_out) and db (n_out) in backward (a bf16 network
 * on the CPU: dz16 instead of dz, dz rounded to bf16 where it is made, for both products);
 * CPU: tgt (T, B) int32, lens (B) int32; the generic path: z (T, B, n_out) logits, then logp;
 * rs (T, B, 1) row max/sum; the CE state (loss.h: onehot, ...).
 * Backward keeps out and the targets (CPU) or the CE onehot from forward and reads the inputs
 * again.
 * CTC (on every device, the generic path below): cg (T, B, n_out), closs (B), the CTC work,
 * argmax (T, B, 1) and host scratch (dec, row); backward keeps cg. */
#include <string.h>

#include "layer.h"
#include "layers.h"
#include "loss.h"
#include "matrix.h"

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/ctc.h"
#include "../kernels/ops.h"
#include "../kernels/softmax_ce.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    rl_layer base;
    int iW, ib;
    bool ce_ready;   /* the last forward computed the CE loss (there was a target) */
    rl_tensor z;     /* (T, B, n_out) */
    rl_tensor rs;    /* (T, B, 1) */
    rl_tensor dz;    /* (T, B, n_out) */
    rl_tensor db;    /* (n_out) */
    rl_tensor tgt;   /* (T, B) int32, CPU: the target on valid frames, -1 on padded ones */
    rl_tensor lens;  /* (B) int32, CPU: a contiguous copy of the lengths */
    rl_tensor rowst; /* (T * B, 2) float64, CPU float32: each row's loss and error */
    rl_tensor dbs;   /* CPU float32: the bias gradient's block sums (kernels/softmax_ce.h) */
    rl_tensor dz16;  /* CPU, a bf16 network: dz rounded (rl_ce_grad_cpu_bf16), int32 pairs */
    rl_ce_work ce;
    double smoothing; /* the label_smoothing option */
    double eps;       /* the label smoothing of the last forward's CE (0 unless training) */
    bool ctc;         /* loss = "ctc" */
    bool ctc_ready;   /* the last forward computed the CTC loss and cg */
    int64_t blank;    /* the blank's class index (ctc) */
    rl_ctc_work ctc_w;
    rl_tensor cg;       /* (T, B, n_out) d CTC loss / d z */
    rl_tensor closs;    /* (B) per-sequence CTC loss */
    rl_tensor maxv, am; /* (T, B, 1) row max and argmax (the best path) */
    rl_tensor lab;      /* (B, S) int32 CPU: the target as output classes */
    int32_t *dec;       /* (T) a collapsed best path */
    int64_t *row;       /* (S + 1) edit-distance row */
    size_t dec_cap, row_cap;
} softmax_layer;

/* The target's label k is output class k below the blank and k + 1 from it on. */
static int32_t label_class(int32_t k, int64_t blank) { return k < blank ? k : k + 1; }

/* CTC loss of a forward with a target: loss, gradient cg, skipped sequences, label errors. */
static rl_status ctc_forward(softmax_layer *S, rl_layer_io *io, int64_t T, int64_t B) {
    rl_layer *l = &S->base;
    char who[RL_LAYER_NAME_MAX + 32], s1[128];
    snprintf(who, sizeof who, RL_LAYER_WHERE, l->name, "softmax");
    const rl_tensor *y = io->target, *yl = io->target_lengths;
    if (!yl)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": loss 'ctc' needs the target's own lengths "
                                       "(batch.lengths_<key>, as rl.batches gives them)",
                        l->name, "softmax");
    if (y->ndim != 2 || y->dtype != RL_INT32 || y->shape[1] != B)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": the ctc target must be (S, %" PRId64 ") int32, got %s",
                        l->name, "softmax", B, rl_tensor_describe(y, s1, sizeof s1));
    const int64_t Smax = y->shape[0], n_labels = l->n_out - 1;
    if (yl->ndim != 1 || yl->dtype != RL_INT32 || yl->shape[0] != B ||
        rl_tensor_device(yl).type != RL_CPU)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": the target lengths must be a (%" PRId64
                                       ") int32 CPU tensor, got %s",
                        l->name, "softmax", B, rl_tensor_describe(yl, s1, sizeof s1));
    /* the labels on the host as classes, (B, S), checked against the target's labels */
    rl_tensor yh = {0};
    if (rl_tensor_device(y).type == RL_CPU)
        rl_tensor_share(&yh, y);
    else
        RL_TRY(rl_op_to(&yh, y, RL_INT32, RL_DEVICE_CPU));
    int64_t lshape[2] = {B, Smax};
    rl_status st = rl_buffer_ensure(&S->lab, RL_INT32, RL_DEVICE_CPU, 2, lshape);
    const int32_t *yd = rl_tensor_data(&yh);
    int32_t *lab = st == RL_OK ? rl_tensor_data(&S->lab) : NULL;
    for (int64_t b = 0; st == RL_OK && b < B; b++) {
        int64_t Sb = (int64_t)rl_tensor_get(yl, &b);
        if (Sb < 0 || Sb > Smax) {
            st = rl_error(RL_EINDEX,
                          RL_LAYER_WHERE ": sequence %" PRId64 ": target length %" PRId64
                                         " is outside 0..%" PRId64 " (S)",
                          l->name, "softmax", b + 1, Sb, Smax);
            break;
        }
        for (int64_t k = 0; k < Smax; k++) {
            int32_t v = k < Sb ? yd[k * yh.stride[0] + b * yh.stride[1]] : 0;
            if (v < 0 || v >= n_labels) {
                st = rl_error(RL_EINDEX,
                              RL_LAYER_WHERE ": sequence %" PRId64 ": label %d at position %" PRId64
                                             " is outside 0..%" PRId64 " (the target's labels)",
                              l->name, "softmax", b + 1, (int)v, k + 1, n_labels - 1);
                break;
            }
            lab[b * Smax + k] = label_class(v, S->blank);
        }
    }
    rl_tensor_release(&yh);
    RL_TRY(st);
    int64_t bshape[1] = {B};
    RL_TRY(rl_buffer_ensure(&S->cg, S->z.dtype, rl_tensor_device(&S->z), 3, S->z.shape));
    RL_TRY(rl_buffer_ensure(&S->closs, S->z.dtype, rl_tensor_device(&S->z), 1, bshape));
    RL_TRY(rl_ctc_loss(&S->ctc_w, who, &S->z, &S->lab, io->lengths, yl, S->blank, false, &S->closs,
                       &S->cg));
    /* the best path: argmax per frame, read on the host with the losses */
    int64_t rshape[3] = {T, B, 1};
    rl_device dev = rl_tensor_device(&S->z);
    RL_TRY(rl_buffer_ensure(&S->maxv, S->z.dtype, dev, 3, rshape));
    RL_TRY(rl_buffer_ensure(&S->am, RL_INT32, dev, 3, rshape));
    RL_TRY(rl_op_reduce_dim(&S->maxv, &S->am, &S->z, 2, true, RL_RED_MAX));
    rl_tensor am = {0}, closs = {0};
    if (dev.type == RL_CPU) {
        rl_tensor_share(&am, &S->am);
        rl_tensor_share(&closs, &S->closs);
    } else {
        st = rl_op_to(&am, &S->am, RL_INT32, RL_DEVICE_CPU);
        if (st == RL_OK) st = rl_op_to(&closs, &S->closs, RL_FLOAT64, RL_DEVICE_CPU);
    }
    if (st == RL_OK && S->dec_cap < (size_t)T) {
        int32_t *p = realloc(S->dec, (size_t)T * sizeof *p);
        if (p) {
            S->dec = p;
            S->dec_cap = (size_t)T;
        } else {
            st = rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory (ctc decode)", l->name,
                          "softmax");
        }
    }
    if (st == RL_OK && S->row_cap < (size_t)Smax + 1) {
        int64_t *p = realloc(S->row, ((size_t)Smax + 1) * sizeof *p);
        if (p) {
            S->row = p;
            S->row_cap = (size_t)Smax + 1;
        } else {
            st = rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory (edit distance)", l->name,
                          "softmax");
        }
    }
    double loss = 0, skipped = 0, errors = 0, nlab = 0;
    if (st == RL_OK) {
        const int32_t *path = rl_tensor_data(&am); /* (T, B, 1) contiguous */
        for (int64_t b = 0; b < B; b++) {
            double v = rl_tensor_get(&closs, &b);
            if (v == INFINITY)
                skipped += 1;
            else
                loss += v;
            int64_t Tb = (int64_t)rl_tensor_get(io->lengths, &b);
            int64_t Sb = (int64_t)rl_tensor_get(yl, &b);
            int64_t n = rl_ctc_collapse(path + b, Tb, B, (int32_t)S->blank, S->dec);
            errors += (double)rl_edit_distance(S->dec, n, lab + b * Smax, Sb, S->row);
            nlab += (double)Sb;
        }
    }
    rl_tensor_release(&am);
    rl_tensor_release(&closs);
    RL_TRY(st);
    io->loss = loss;
    io->n_skipped = skipped;
    io->n_errors = errors;
    io->n_labels = nlab;
    io->n_frames = rl_count_frames(io->lengths);
    S->ctc_ready = true;
    return RL_OK;
}

/* The CPU forward (kernels/softmax_ce.h): logits into out, then softmax (and CE) in place;
 * float32 adds the bias in the softmax sweep rather than copying it into every row first. */
static rl_status forward_cpu(softmax_layer *S, rl_layer_io *io) {
    rl_layer *l = &S->base;
    rl_tensor *p = &l->out;
    int64_t T = p->shape[0], B = p->shape[1], C = p->shape[2];
    const rl_param *bias = S->ib >= 0 ? &l->params[S->ib] : NULL;
    bool f32 = p->dtype == RL_FLOAT32;
    rl_mat bm = {NULL, 0}; /* float32: the bias, bound, contiguous, on the CPU */
    if (f32 && bias) RL_TRY(rl_param_mat(l, &bias->value, "b", RL_FLOAT32, RL_DEVICE_CPU, &bm));
    RL_TRY(rl_affine_forward(l, io, &l->params[S->iW], f32 ? NULL : bias, p));
    bool ce = l->is_loss && io->target;
    const int32_t *tgt = NULL;
    S->eps = io->train ? S->smoothing : 0.0;
    if (ce) {
        RL_TRY(rl_ce_check_args(l->name, l->ops->class_name, p, io->target, io->lengths));
        int64_t tb[2] = {T, B};
        RL_TRY(rl_buffer_ensure(&S->tgt, RL_INT32, RL_DEVICE_CPU, 2, tb));
        RL_TRY(rl_buffer_ensure(&S->lens, RL_INT32, RL_DEVICE_CPU, 1, &B));
        RL_TRY(rl_op_copy(&S->tgt, io->target));
        RL_TRY(rl_op_copy(&S->lens, io->lengths));
        int32_t *t32 = rl_tensor_data(&S->tgt);
        int64_t bad = rl_ce_targets_cpu(T, B, C, t32, rl_tensor_data(&S->lens), t32);
        if (bad >= 0)
            return rl_ce_bad_target(l->name, l->ops->class_name, bad / B, bad % B, t32[bad], C);
        tgt = t32;
    }
    double loss = 0, n_errors = 0;
    if (p->dtype == RL_FLOAT32) {
        int64_t rs[2] = {T * B, 2};
        if (ce) RL_TRY(rl_buffer_ensure(&S->rowst, RL_FLOAT64, RL_DEVICE_CPU, 2, rs));
        rl_softmax_ce_cpu_f32(T * B, C, rl_tensor_data(p), bm.p, rl_tensor_data(p), tgt, S->eps,
                              ce ? rl_tensor_data(&S->rowst) : NULL, &loss, &n_errors);
    } else
        rl_softmax_ce_cpu_f64(T * B, C, rl_tensor_data(p), rl_tensor_data(p), tgt, S->eps, &loss,
                              &n_errors);
    if (!ce) return RL_OK;
    io->loss = loss;
    io->n_errors = n_errors;
    io->n_frames = rl_count_frames(io->lengths);
    S->ce_ready = true;
    return RL_OK;
}

static rl_status softmax_forward(rl_layer *l, rl_layer_io *io) {
    softmax_layer *S = (softmax_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out}, rshape[3] = {T, B, 1};
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_layer_compute_type(l, io, &dt, &dev));
    S->ce_ready = false;
    S->ctc_ready = false;
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, shape));
    if (dev.type == RL_CPU && !S->ctc) return forward_cpu(S, io);
    RL_TRY(rl_buffer_ensure(&S->z, dt, dev, 3, shape));
    RL_TRY(rl_buffer_ensure(&S->rs, dt, dev, 3, rshape));
    RL_TRY(
        rl_affine_forward(l, io, &l->params[S->iW], S->ib >= 0 ? &l->params[S->ib] : NULL, &S->z));
    RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &S->z, 2, true, RL_RED_MAX));
    RL_TRY(rl_op_binary(&S->z, &S->z, &S->rs, RL_BIN_SUB));
    RL_TRY(rl_op_unary(&l->out, &S->z, RL_UN_EXP, 0, 0));
    RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &l->out, 2, true, RL_RED_SUM));
    RL_TRY(rl_op_binary(&l->out, &l->out, &S->rs, RL_BIN_DIV));
    if (!l->is_loss || !io->target) return RL_OK;
    if (S->ctc) return ctc_forward(S, io, T, B);
    RL_TRY(rl_op_unary(&S->rs, &S->rs, RL_UN_LOG, 0, 0));
    RL_TRY(rl_op_binary(&S->z, &S->z, &S->rs, RL_BIN_SUB));
    S->eps = io->train ? S->smoothing : 0.0;
    RL_TRY(rl_loss_ce(&S->ce, l->name, l->ops->class_name, &S->z, io->target, io->lengths, S->eps,
                      &io->loss, &io->n_errors, &io->n_frames));
    S->ce_ready = true;
    return RL_OK;
}

static rl_status softmax_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                  rl_tensor *const *grad_in) {
    softmax_layer *S = (softmax_layer *)l;
    if (!grad_out && !l->is_loss)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": without a loss, backward needs grad_out",
                        l->name, "softmax");
    if (!grad_out && !S->ce_ready && !S->ctc_ready)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": backward from the %s loss needs a forward with a target",
                        l->name, "softmax", S->ctc ? "ctc" : "ce");
    const rl_tensor *p = &l->out;
    rl_tensor *dz = &S->dz;
    bool ce_cpu = S->ce_ready && rl_tensor_device(p).type == RL_CPU;
    /* In a bf16 network both products round dz to bf16: it is written rounded, once, and never
     * in float32 (ptb_small's dz: 16 MB of float32, which the products rounded twice and read
     * thrice: its bf16 steps took 11-13% less time, 2 threads on a Zen 4) */
    bool bf16 = ce_cpu && !grad_out && p->dtype == RL_FLOAT32 &&
                rl_affine_bf16_ok(l, io, &l->params[S->iW], grad_in);
    if (grad_out) {
        int64_t rshape[3] = {p->shape[0], p->shape[1], 1};
        RL_TRY(rl_buffer_ensure(&S->dz, p->dtype, rl_tensor_device(p), 3, p->shape));
        RL_TRY(rl_buffer_ensure(&S->rs, p->dtype, rl_tensor_device(p), 3, rshape));
        RL_TRY(rl_op_binary(&S->dz, grad_out, p, RL_BIN_MUL));
        RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &S->dz, 2, true, RL_RED_SUM));
        RL_TRY(rl_op_binary(&S->dz, grad_out, &S->rs, RL_BIN_SUB));
        RL_TRY(rl_op_binary(&S->dz, &S->dz, p, RL_BIN_MUL));
        if (S->ctc_ready) RL_TRY(rl_op_binary(&S->dz, &S->dz, &S->cg, RL_BIN_ADD));
    } else if (S->ctc_ready) {
        dz = &S->cg;
    } else if (!bf16) {
        RL_TRY(rl_buffer_ensure(&S->dz, p->dtype, rl_tensor_device(p), 3, p->shape));
    }
    rl_param *bias = S->ib >= 0 ? &l->params[S->ib] : NULL;
    if (ce_cpu) {
        /* the bias gradient comes out of the same sweep as dz (kernels/softmax_ce.h) */
        int64_t rows = p->shape[0] * p->shape[1], C = p->shape[2];
        const int32_t *tgt = rl_tensor_data(&S->tgt);
        if (bias) RL_TRY(rl_buffer_ensure(&S->db, p->dtype, RL_DEVICE_CPU, 1, &C));
        void *db = bias ? rl_tensor_data(&S->db) : NULL;
        if (bf16) {
            int64_t n = rl_ce_grad_scratch_size(rows, C);
            int64_t words = (rl_bf16_lhs_size(rows, C) + 1) / 2;
            if (bias && n > 0) RL_TRY(rl_buffer_ensure(&S->dbs, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
            RL_TRY(rl_buffer_ensure(&S->dz16, RL_INT32, RL_DEVICE_CPU, 1, &words));
            uint16_t *dz16 = rl_tensor_data(&S->dz16);
            rl_ce_grad_cpu_bf16(rows, C, rl_tensor_data(p), tgt, S->eps, dz16, db,
                                bias && n > 0 ? rl_tensor_data(&S->dbs) : NULL);
            if (bias) RL_TRY(rl_op_binary(&bias->grad, &bias->grad, &S->db, RL_BIN_ADD));
            return rl_affine_backward_bf16(l, io, &l->params[S->iW], dz16, rows, grad_in);
        }
        if (p->dtype == RL_FLOAT32) {
            int64_t n = rl_ce_grad_scratch_size(rows, C);
            if (bias && n > 0) RL_TRY(rl_buffer_ensure(&S->dbs, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
            rl_ce_grad_cpu_f32(rows, C, rl_tensor_data(p), tgt, S->eps, rl_tensor_data(&S->dz),
                               grad_out != NULL, db,
                               bias && n > 0 ? rl_tensor_data(&S->dbs) : NULL);
        } else {
            rl_ce_grad_cpu_f64(rows, C, rl_tensor_data(p), tgt, S->eps, rl_tensor_data(&S->dz),
                               grad_out != NULL, db);
        }
        if (bias) RL_TRY(rl_op_binary(&bias->grad, &bias->grad, &S->db, RL_BIN_ADD));
        return rl_affine_backward(l, io, &l->params[S->iW], NULL, dz, &S->db, grad_in);
    }
    if (S->ce_ready) RL_TRY(rl_loss_ce_grad(&S->ce, p, io->lengths, &S->dz, grad_out != NULL));
    return rl_affine_backward(l, io, &l->params[S->iW], bias, dz, &S->db, grad_in);
}

static void softmax_destroy(rl_layer *l) {
    softmax_layer *S = (softmax_layer *)l;
    rl_tensor_release(&S->z);
    rl_tensor_release(&S->rs);
    rl_tensor_release(&S->dz);
    rl_tensor_release(&S->db);
    rl_tensor_release(&S->tgt);
    rl_tensor_release(&S->lens);
    rl_tensor_release(&S->rowst);
    rl_tensor_release(&S->dbs);
    rl_tensor_release(&S->dz16);
    rl_ce_work_release(&S->ce);
    rl_ctc_work_release(&S->ctc_w);
    rl_tensor_release(&S->cg);
    rl_tensor_release(&S->closs);
    rl_tensor_release(&S->maxv);
    rl_tensor_release(&S->am);
    rl_tensor_release(&S->lab);
    free(S->dec);
    free(S->row);
}

static const rl_layer_ops softmax_ops = {.class_name = "softmax",
                                         .forward = softmax_forward,
                                         .backward = softmax_backward,
                                         .destroy = softmax_destroy};

rl_status rl_softmax_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "softmax");
    int64_t n_out;
    bool with_bias;
    const char *loss;
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &n_out));
    RL_TRY(rl_opt_bool(opts, name, "with_bias", true, &with_bias));
    RL_TRY(rl_opt_string(opts, name, "loss", NULL, &loss));
    if (loss && strcmp(loss, "ce") != 0 && strcmp(loss, "mse") != 0 && strcmp(loss, "ctc") != 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": unknown loss '%s' (ce, ctc or mse)", name,
                        "softmax", loss);
    bool ctc = loss && strcmp(loss, "ctc") == 0;
    double smoothing;
    RL_TRY(rl_opt_number(opts, name, "label_smoothing", 0.0, &smoothing));
    if (!(smoothing >= 0 && smoothing < 1))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": label_smoothing = %g is outside [0, 1)", name,
                        "softmax", smoothing);
    if (smoothing > 0 && !(loss && strcmp(loss, "ce") == 0))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": label_smoothing applies to loss = \"ce\" only",
                        name, "softmax");
    int64_t blank = n_out - 1;
    if (ctc) {
        if (n_out < 2)
            return rl_error(RL_EARG,
                            RL_LAYER_WHERE ": loss 'ctc' needs n_out >= 2 (labels + blank)", name,
                            "softmax");
        RL_TRY(rl_opt_int(opts, name, "blank_index", n_out - 1, 0, false, &blank));
        if (blank >= n_out)
            return rl_error(RL_EARG,
                            RL_LAYER_WHERE ": blank_index = %" PRId64 " is outside 0..%" PRId64
                                           " (n_out - 1)",
                            name, "softmax", blank, n_out - 1);
    }
    RL_TRY(rl_layer_alloc(out, sizeof(softmax_layer), &softmax_ops, name, n_in, in_dims));
    softmax_layer *S = (softmax_layer *)*out;
    (*out)->n_out = n_out;
    (*out)->is_loss = loss && (strcmp(loss, "ce") == 0 || ctc);
    S->ctc = ctc;
    S->blank = blank;
    S->smoothing = smoothing;
    rl_status st = rl_affine_params(*out, with_bias, &S->iW, &S->ib);
    if (st != RL_OK) {
        rl_layer_free(*out);
        *out = NULL;
    }
    return st;
}
