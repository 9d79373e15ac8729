/* Losses (mse, frame-wise cross entropy) and the padding helpers of the layers (see loss.h).
 * Losses are summed over valid frames, not averaged.
 *   mse:  loss = sum_{t<len[b], f} (out - target)^2,  d loss/d out = 2 (out - target)
 *   ce:   loss = -sum_{t<len[b]} logp[t, b, target[t, b]],  d loss/d logits = p - onehot
 *         (with label smoothing eps: onehot -> (1 - eps) onehot + eps / C)
 * The onehot is built on the device from the target (classes == target), so no (T, B, C)
 * tensor crosses between host and device; the (T, B) padding mask is built on the host from
 * the lengths and copied once per batch. */
#include "loss.h"

#include <inttypes.h>
#include <stdio.h>

#include "../kernels/ops.h"
#include "layer.h"

static rl_status check_lengths(const char *who, const rl_tensor *lengths, int64_t T, int64_t B) {
    if (!lengths || !lengths->storage || lengths->ndim != 1 || lengths->dtype != RL_INT32 ||
        rl_tensor_device(lengths).type != RL_CPU || lengths->shape[0] != B)
        return rl_error(RL_ESHAPE, "%s: lengths must be a CPU int32 tensor of shape (%" PRId64 ")",
                        who, B);
    for (int64_t b = 0; b < B; b++) {
        double v = rl_tensor_get(lengths, &b);
        if (v < 0 || v > (double)T)
            return rl_error(RL_ESHAPE,
                            "%s: lengths[%" PRId64 "] = %g is outside 0..%" PRId64 " (T)", who,
                            b + 1, v, T);
    }
    return RL_OK;
}

rl_status rl_fill_padding(rl_tensor *x, const rl_tensor *lengths, double value) {
    if (!x || !x->storage || x->ndim < 2)
        return rl_error(RL_ESHAPE, "fill_padding: needs a (T, B, ...) tensor");
    int64_t T = x->shape[0], B = x->shape[1];
    RL_TRY(check_lengths("fill_padding", lengths, T, B));
    for (int64_t b = 0; b < B; b++) {
        int64_t len = (int64_t)rl_tensor_get(lengths, &b);
        if (len == T) continue;
        rl_tensor seq = {0}, pad = {0};
        RL_TRY(rl_tensor_narrow(&seq, x, 1, b, 1));
        rl_status st = rl_tensor_narrow(&pad, &seq, 0, len, T - len);
        if (st == RL_OK) st = rl_op_fill(&pad, value);
        rl_tensor_release(&pad);
        rl_tensor_release(&seq);
        RL_TRY(st);
    }
    return RL_OK;
}

double rl_count_frames(const rl_tensor *lengths) {
    double n = 0;
    for (int64_t b = 0; b < lengths->shape[0]; b++)
        n += rl_tensor_get(lengths, &b);
    return n;
}

rl_status rl_loss_mse(const rl_tensor *out, const rl_tensor *target, const rl_tensor *lengths,
                      double *loss, double *n_frames, rl_tensor *grad) {
    char so[128], st_[128];
    if (!out || !out->storage || !target || !target->storage || out->ndim != 3 ||
        !rl_tensor_same_shape(out, target) || out->dtype != target->dtype ||
        !rl_device_eq(rl_tensor_device(out), rl_tensor_device(target)))
        return rl_error(RL_ESHAPE, "mse: output %s and target %s must be (T, B, F) alike",
                        out && out->storage ? rl_tensor_describe(out, so, sizeof so) : "nothing",
                        target && target->storage ? rl_tensor_describe(target, st_, sizeof st_)
                                                  : "nothing");
    if (out->dtype == RL_INT32)
        return rl_error(RL_EDTYPE, "mse: output is int32, expected float32 or float64");
    RL_TRY(check_lengths("mse", lengths, out->shape[0], out->shape[1]));
    if (grad && (!grad->storage || !rl_tensor_same_shape(grad, out) || grad->dtype != out->dtype ||
                 !rl_device_eq(rl_tensor_device(grad), rl_tensor_device(out))))
        return rl_error(RL_ESHAPE, "mse: gradient buffer %s does not match the output %s",
                        grad->storage ? rl_tensor_describe(grad, st_, sizeof st_) : "unset",
                        rl_tensor_describe(out, so, sizeof so));
    rl_tensor tmp = {0};
    rl_tensor *d = grad ? grad : &tmp;
    rl_status st = rl_op_binary(d, out, target, RL_BIN_SUB);
    if (st == RL_OK) st = rl_fill_padding(d, lengths, 0.0);
    double norm = 0;
    if (st == RL_OK) st = rl_op_reduce_all(&norm, NULL, d, RL_RED_NORM);
    if (st == RL_OK && grad) st = rl_op_binary_scalar(grad, grad, 2.0, RL_BIN_MUL, false);
    rl_tensor_release(&tmp);
    RL_TRY(st);
    *loss = norm * norm;
    *n_frames = rl_count_frames(lengths);
    return RL_OK;
}

/* w->pad_host (T, B, 1) in dt on the CPU: 1 on the padded frames t >= lengths[b], 0 elsewhere;
 * *pad: that mask on dev (pad_host itself on the CPU, else one copy into w->pad). */
static rl_status build_pad(rl_ce_work *w, const rl_tensor **pad, const rl_tensor *lengths,
                           int64_t T, int64_t B, rl_dtype dt, rl_device dev) {
    int64_t tb1[3] = {T, B, 1};
    RL_TRY(rl_buffer_ensure(&w->pad_host, dt, RL_DEVICE_CPU, 3, tb1));
    for (int64_t b = 0; b < B; b++) {
        int64_t len = (int64_t)rl_tensor_get(lengths, &b);
        for (int64_t t = 0; t < T; t++) {
            int64_t idx[3] = {t, b, 0};
            rl_tensor_set(&w->pad_host, idx, t >= len ? 1.0 : 0.0);
        }
    }
    if (dev.type == RL_CPU) {
        *pad = &w->pad_host;
        return RL_OK;
    }
    RL_TRY(rl_buffer_ensure(&w->pad, dt, dev, 3, tb1));
    RL_TRY(rl_op_copy(&w->pad, &w->pad_host));
    *pad = &w->pad;
    return RL_OK;
}

rl_status rl_ce_bad_target(const char *layer, const char *cls, int64_t t, int64_t b, double value,
                           int64_t C) {
    return rl_error(RL_EINDEX,
                    RL_LAYER_WHERE ": target %g at frame %" PRId64 " of sequence %" PRId64
                                   " (1-based) is outside 0..%" PRId64 " (n_out = %" PRId64 ")",
                    layer, cls, value, t + 1, b + 1, C - 1, C);
}

/* The error for the first valid frame whose target is outside 0..C-1 (the range check found
 * one); reads the target on the host. */
static rl_status bad_target(rl_ce_work *w, const char *layer, const char *cls,
                            const rl_tensor *target, const rl_tensor *lengths, int64_t C) {
    const rl_tensor *th = target;
    if (rl_tensor_device(target).type != RL_CPU) {
        RL_TRY(rl_buffer_ensure(&w->target_host, RL_INT32, RL_DEVICE_CPU, 2, target->shape));
        RL_TRY(rl_op_copy(&w->target_host, target));
        th = &w->target_host;
    }
    for (int64_t b = 0; b < lengths->shape[0]; b++) {
        int64_t len = (int64_t)rl_tensor_get(lengths, &b);
        for (int64_t t = 0; t < len; t++) {
            int64_t idx[2] = {t, b};
            double c = rl_tensor_get(th, idx);
            if (c < 0 || c >= (double)C) return rl_ce_bad_target(layer, cls, t, b, c, C);
        }
    }
    return rl_error(RL_EINDEX, RL_LAYER_WHERE ": a target is outside 0..%" PRId64, layer, cls,
                    C - 1);
}

rl_status rl_ce_check_args(const char *layer, const char *cls, const rl_tensor *logp,
                           const rl_tensor *target, const rl_tensor *lengths) {
    char s[128], s2[128], where[2 * RL_LAYER_NAME_MAX + 32];
    snprintf(where, sizeof where, RL_LAYER_WHERE, layer, cls);
    int64_t T = logp->shape[0], B = logp->shape[1];
    if (!target || !target->storage || target->dtype != RL_INT32 || target->ndim != 2 ||
        target->shape[0] != T || target->shape[1] != B)
        return rl_error(
            RL_ESHAPE, "%s: ce target must be int32 (T, B) = (%" PRId64 ", %" PRId64 "), got %s",
            where, T, B,
            target && target->storage ? rl_tensor_describe(target, s, sizeof s) : "nothing");
    if (rl_tensor_device(target).type != RL_CPU &&
        !rl_device_eq(rl_tensor_device(target), rl_tensor_device(logp)))
        return rl_error(RL_EDEVICE,
                        "%s: ce target %s is neither on the CPU nor on the device of the "
                        "output %s",
                        where, rl_tensor_describe(target, s, sizeof s),
                        rl_tensor_describe(logp, s2, sizeof s2));
    return check_lengths(where, lengths, T, B);
}

/* Everything runs on the logits' device: the onehot is classes == target (padded frames get
 * target -1, an all-zero row); a valid frame's row sums to 1 exactly when its target is in
 * range, so min(row sum + pad) == 1 checks every target with one scalar read back. */
rl_status rl_loss_ce(rl_ce_work *w, const char *layer, const char *cls, const rl_tensor *logp,
                     const rl_tensor *target, const rl_tensor *lengths, double eps, double *loss,
                     double *n_errors, double *n_frames) {
    int64_t T = logp->shape[0], B = logp->shape[1], C = logp->shape[2];
    rl_dtype dt = logp->dtype;
    rl_device dev = rl_tensor_device(logp);
    RL_TRY(rl_ce_check_args(layer, cls, logp, target, lengths));
    if (!rl_device_eq(rl_tensor_device(target), dev)) {
        int64_t tb[2] = {T, B};
        RL_TRY(rl_buffer_ensure(&w->target_dev, RL_INT32, dev, 2, tb));
        RL_TRY(rl_op_copy(&w->target_dev, target));
        target = &w->target_dev;
    }

    const rl_tensor *pad;
    RL_TRY(build_pad(w, &pad, lengths, T, B, dt, dev));
    int64_t tb1[3] = {T, B, 1}, tbc[3] = {T, B, C};
    rl_tensor tview = {0}, pad2 = {0};
    RL_TRY(rl_buffer_ensure(&w->target_f, dt, dev, 3, tb1));
    RL_TRY(rl_buffer_ensure(&w->rows, dt, dev, 3, tb1));
    RL_TRY(rl_buffer_ensure(&w->classes, dt, dev, 1, &C));
    RL_TRY(rl_buffer_ensure(&w->onehot, dt, dev, 3, tbc));
    RL_TRY(rl_buffer_ensure(&w->tmp, dt, dev, 3, tbc));
    RL_TRY(rl_buffer_ensure(&w->maxv, dt, dev, 2, tbc));
    RL_TRY(rl_buffer_ensure(&w->argmax, RL_INT32, dev, 2, tbc));
    RL_TRY(rl_buffer_ensure(&w->wrong, RL_INT32, dev, 2, tbc));
    RL_TRY(rl_tensor_unsqueeze(&tview, target, 2));
    rl_status st = rl_op_copy(&w->target_f, &tview);
    rl_tensor_release(&tview);
    RL_TRY(st);
    RL_TRY(rl_op_masked_fill(&w->target_f, pad, -1.0));
    RL_TRY(rl_op_arange(&w->classes, 0.0, 1.0));
    RL_TRY(rl_op_binary(&w->onehot, &w->classes, &w->target_f, RL_BIN_EQ));

    double in_range = 1;
    RL_TRY(rl_op_reduce_dim(&w->rows, NULL, &w->onehot, 2, true, RL_RED_SUM));
    RL_TRY(rl_op_binary(&w->rows, &w->rows, pad, RL_BIN_ADD));
    if (T * B > 0) RL_TRY(rl_op_reduce_all(&in_range, NULL, &w->rows, RL_RED_MIN));
    if (in_range != 1) return bad_target(w, layer, cls, target, lengths, C);

    /* the target's log-probabilities by selection: tmp = logp where onehot, 0 elsewhere. A
     * product onehot * logp would turn a -inf (an underflowed class) or a NaN in a padded frame
     * into NaN. masked_fill fills where its mask is non-zero, so onehot is flipped to
     * 1 - onehot for the fill and back afterwards (exact for 0 and 1; no second (T, B, C)). */
    RL_TRY(rl_op_copy(&w->tmp, logp));
    RL_TRY(rl_op_binary_scalar(&w->onehot, &w->onehot, 1.0, RL_BIN_SUB, true));
    rl_status fst = rl_op_masked_fill(&w->tmp, &w->onehot, 0.0);
    RL_TRY(rl_op_binary_scalar(&w->onehot, &w->onehot, 1.0, RL_BIN_SUB, true));
    RL_TRY(fst);
    double sum = 0;
    RL_TRY(rl_op_reduce_all(&sum, NULL, &w->tmp, RL_RED_SUM));
    w->eps = eps;
    if (eps > 0) {
        /* smoothing: the valid frames' sum over all classes of logp (padded frames filled with
         * 0 first, so that their values never reach the sum) */
        double all = 0;
        RL_TRY(rl_op_copy(&w->tmp, logp));
        RL_TRY(rl_op_masked_fill(&w->tmp, pad, 0.0));
        RL_TRY(rl_op_reduce_all(&all, NULL, &w->tmp, RL_RED_SUM));
        sum = (1 - eps) * sum + eps / (double)C * all;
    }

    double errors = 0;
    RL_TRY(rl_op_reduce_dim(&w->maxv, &w->argmax, logp, 2, false, RL_RED_MAX));
    RL_TRY(rl_op_binary(&w->wrong, &w->argmax, target, RL_BIN_NE));
    int64_t tb[2] = {T, B};
    RL_TRY(rl_tensor_view(&pad2, pad, 2, tb));
    st = rl_op_masked_fill(&w->wrong, &pad2, 0.0);
    rl_tensor_release(&pad2);
    RL_TRY(st);
    RL_TRY(rl_op_reduce_all(&errors, NULL, &w->wrong, RL_RED_SUM));
    *loss = -sum;
    *n_errors = errors;
    *n_frames = rl_count_frames(lengths);
    return RL_OK;
}

rl_status rl_loss_ce_grad(rl_ce_work *w, const rl_tensor *p, const rl_tensor *lengths,
                          rl_tensor *grad, bool accumulate) {
    (void)lengths;
    if (!w->onehot.storage || !rl_tensor_same_shape(&w->onehot, p) ||
        !rl_device_eq(rl_tensor_device(&w->onehot), rl_tensor_device(p)))
        return rl_error(RL_EARG, "ce gradient: no matching rl_loss_ce before it");
    const rl_tensor *pad = rl_tensor_device(p).type == RL_CPU ? &w->pad_host : &w->pad;
    rl_tensor *d = accumulate ? &w->tmp : grad;
    if (w->eps > 0) {
        /* d = p - ((1 - eps) onehot + eps / C) */
        RL_TRY(rl_op_binary_scalar(d, &w->onehot, 1 - w->eps, RL_BIN_MUL, false));
        RL_TRY(rl_op_binary_scalar(d, d, w->eps / (double)p->shape[2], RL_BIN_ADD, false));
        RL_TRY(rl_op_binary(d, p, d, RL_BIN_SUB));
    } else {
        RL_TRY(rl_op_binary(d, p, &w->onehot, RL_BIN_SUB));
    }
    RL_TRY(rl_op_masked_fill(d, pad, 0.0));
    if (accumulate) RL_TRY(rl_op_binary(grad, grad, d, RL_BIN_ADD));
    return RL_OK;
}

void rl_ce_work_release(rl_ce_work *w) {
    rl_tensor_release(&w->pad_host);
    rl_tensor_release(&w->pad);
    rl_tensor_release(&w->target_f);
    rl_tensor_release(&w->classes);
    rl_tensor_release(&w->onehot);
    rl_tensor_release(&w->tmp);
    rl_tensor_release(&w->rows);
    rl_tensor_release(&w->maxv);
    rl_tensor_release(&w->argmax);
    rl_tensor_release(&w->wrong);
    rl_tensor_release(&w->target_host);
    rl_tensor_release(&w->target_dev);
}
