/* rl_ctc_loss: the argument checks and the device dispatch of the CTC loss (kernels/ctc.h). The
 * checks read the lengths and labels on the host, so that every bad input is reported with its
 * sequence before a kernel runs; the kernels then trust them. */
#include "ctc.h"

#include <inttypes.h>
#include <string.h>

#include "../core/blas.h"
#include "ops.h"
#ifdef RL_WITH_CUDA
#include "cuda/ctc_cuda.h"
#endif

static rl_status check_lengths(const char *who, const char *what, const rl_tensor *len, int64_t B,
                               int64_t hi, const char *hi_name) {
    char s[128];
    if (!len || !len->storage || len->ndim != 1 || len->dtype != RL_INT32 ||
        rl_tensor_device(len).type != RL_CPU || len->shape[0] != B)
        return rl_error(RL_ESHAPE, "%s: %s must be a (%" PRId64 ") int32 CPU tensor, got %s", who,
                        what, B,
                        len && len->storage ? rl_tensor_describe(len, s, sizeof s) : "nothing");
    for (int64_t b = 0; b < B; b++) {
        double v = rl_tensor_get(len, &b);
        if (v < 0 || v > (double)hi)
            return rl_error(RL_EINDEX,
                            "%s: sequence %" PRId64 ": %s = %g is outside 0..%" PRId64 " (%s)", who,
                            b + 1, what, v, hi, hi_name);
    }
    return RL_OK;
}

/* A set `out` must be (ndim, shape) of dt on dev; an unset one is allocated. */
static rl_status ensure_out(const char *who, const char *what, rl_tensor *out, rl_dtype dt,
                            rl_device dev, int ndim, const int64_t *shape) {
    if (!out->storage) return rl_tensor_empty(out, dt, dev, ndim, shape);
    bool ok = out->ndim == ndim && out->dtype == dt && rl_device_eq(rl_tensor_device(out), dev) &&
              rl_tensor_is_contiguous(out);
    for (int d = 0; ok && d < ndim; d++)
        ok = out->shape[d] == shape[d];
    char s[128];
    if (!ok)
        return rl_error(RL_ESHAPE, "%s: %s buffer %s does not fit (contiguous, %s, %d dims)", who,
                        what, rl_tensor_describe(out, s, sizeof s), rl_dtype_name(dt), ndim);
    return RL_OK;
}

rl_status rl_ctc_loss(rl_ctc_work *w, const char *who, const rl_tensor *logits,
                      const rl_tensor *labels, const rl_tensor *input_len,
                      const rl_tensor *label_len, int64_t blank, bool zero_infinity,
                      rl_tensor *loss, rl_tensor *grad) {
    char s[128];
    if (!logits || !logits->storage || logits->ndim != 3 ||
        (logits->dtype != RL_FLOAT32 && logits->dtype != RL_FLOAT64) ||
        !rl_tensor_is_contiguous(logits))
        return rl_error(
            RL_ESHAPE,
            "%s: logits must be a contiguous (T, B, V) float32 or float64 tensor, "
            "got %s",
            who, logits && logits->storage ? rl_tensor_describe(logits, s, sizeof s) : "nothing");
    const int64_t T = logits->shape[0], B = logits->shape[1], V = logits->shape[2];
    if (V < 1) return rl_error(RL_ESHAPE, "%s: logits have no classes (V = 0)", who);
    if (blank < 0 || blank >= V)
        return rl_error(RL_EARG, "%s: blank = %" PRId64 " is outside 0..%" PRId64 " (V - 1)", who,
                        blank, V - 1);
    if (!labels || !labels->storage || labels->ndim != 2 || labels->dtype != RL_INT32 ||
        labels->shape[0] != B)
        return rl_error(
            RL_ESHAPE, "%s: targets must be a (%" PRId64 ", S) int32 tensor, got %s", who, B,
            labels && labels->storage ? rl_tensor_describe(labels, s, sizeof s) : "nothing");
    const int64_t S = labels->shape[1];
    RL_TRY(check_lengths(who, "input_lengths", input_len, B, T, "T"));
    RL_TRY(check_lengths(who, "target_lengths", label_len, B, S, "S"));
    const rl_device dev = rl_tensor_device(logits);
    const rl_tensor *lab = labels;
    if (rl_tensor_device(labels).type != RL_CPU) {
        RL_TRY(rl_buffer_ensure(&w->labels_host, RL_INT32, RL_DEVICE_CPU, 2, labels->shape));
        RL_TRY(rl_op_copy(&w->labels_host, labels));
        lab = &w->labels_host;
    }
    const int32_t *il = rl_tensor_data(input_len), *ll = rl_tensor_data(label_len);
    const int32_t *lp = rl_tensor_data(lab);
    const int64_t il_st = input_len->stride[0], ll_st = label_len->stride[0];
    for (int64_t b = 0; b < B; b++) {
        int64_t Tb = il[b * il_st], Sb = ll[b * ll_st];
        if (Sb > Tb)
            return rl_error(RL_EARG,
                            "%s: sequence %" PRId64 ": its target of %" PRId64
                            " labels is longer than its input of %" PRId64 " frames",
                            who, b + 1, Sb, Tb);
        for (int64_t k = 0; k < Sb; k++) {
            int32_t l = lp[b * lab->stride[0] + k * lab->stride[1]];
            if (l < 0 || l >= V)
                return rl_error(RL_EINDEX,
                                "%s: sequence %" PRId64 ": label %d at position %" PRId64
                                " is outside 0..%" PRId64 " (V - 1)",
                                who, b + 1, (int)l, k + 1, V - 1);
            if (l == blank)
                return rl_error(RL_EARG,
                                "%s: sequence %" PRId64 ": label at position %" PRId64
                                " is the blank (%" PRId64 "), which may not occur in a target",
                                who, b + 1, k + 1, blank);
        }
    }
    int64_t lshape[1] = {B};
    RL_TRY(ensure_out(who, "loss", loss, logits->dtype, dev, 1, lshape));
    if (grad) RL_TRY(ensure_out(who, "gradient", grad, logits->dtype, dev, 3, logits->shape));
    /* the kernels read contiguous lengths */
    int32_t small[2][64];
    int32_t *inb = small[0], *lnb = small[1];
    rl_tensor lens = {0};
    if (B > 64) {
        int64_t shape[1] = {2 * B};
        RL_TRY(rl_tensor_empty(&lens, RL_INT32, RL_DEVICE_CPU, 1, shape));
        inb = rl_tensor_data(&lens);
        lnb = inb + B;
    }
    for (int64_t b = 0; b < B; b++) {
        inb[b] = il[b * il_st];
        lnb[b] = ll[b * ll_st];
    }
    rl_status st = RL_OK;
    if (dev.type == RL_CUDA) {
#ifdef RL_WITH_CUDA
        st = rl_ctc_cuda(w, logits, lab, inb, lnb, blank, zero_infinity, loss, grad);
#else
        st = rl_error(RL_EDEVICE, "%s: CUDA tensors in a build without CUDA", who);
#endif
        rl_tensor_release(&lens);
        return st;
    }
    int threads = rl_blas_get_threads();
    size_t elem = rl_dtype_size(logits->dtype);
    size_t bytes = rl_ctc_cpu_work_bytes(elem, T, B, V, S, threads) + 64;
    int64_t wshape[1] = {(int64_t)(bytes / sizeof(double)) + 1};
    st = rl_buffer_ensure(&w->scratch, RL_FLOAT64, RL_DEVICE_CPU, 1, wshape);
    if (st == RL_OK) {
        char *work = rl_tensor_data(&w->scratch);
        work += (64 - (uintptr_t)work % 64) % 64;
        const int32_t *lab_data = rl_tensor_data(lab);
        rl_ctc_cpu(logits->dtype != RL_FLOAT32, T, B, V, rl_tensor_data(logits), lab_data,
                   lab->stride[0], lab->stride[1], inb, lnb, (int32_t)blank, zero_infinity,
                   rl_tensor_data(loss), grad ? rl_tensor_data(grad) : NULL, work, threads);
    }
    rl_tensor_release(&lens);
    return st;
}

void rl_ctc_work_release(rl_ctc_work *w) {
    rl_tensor_release(&w->scratch);
    rl_tensor_release(&w->labels_host);
    rl_tensor_release(&w->dev_int);
}
