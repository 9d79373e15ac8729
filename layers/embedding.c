/* embedding: class indices to vectors, out[t, b] = W[x[t, b]] (RETURNN's linear layer on a
 * sparse input without bias).
 *
 * Input: one sparse input, int32 class indices (T, B) on the CPU (0-based; in_dims[0] = V, the
 * number of classes: a sparse extern_data key's dim, or a label of a rec unit).
 * Params: W (V, n_out), glorot.
 *   forward:  out[t, b, :] = W[x[t, b], :] on valid frames (t < len[b]), 0 on padded ones
 *   backward: dW[x[t, b], :] += grad_out[t, b, :] on valid frames; the input has no gradient
 * Padded frames are never read, so whatever a batch holds there (padding value -1, say) is
 * harmless; an index outside 0..V-1 on a valid frame is an error naming the layer, the frame,
 * the sequence and the value, found before anything is written. Buffers: out (T, B, n_out),
 * nothing else; backward reads the input again. CPU only for now: CUDA inputs are an error
 * naming the layer. */
#include <inttypes.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

typedef struct {
    rl_layer base;
} embedding_layer;

/* Checks x (T, B) int32 on the CPU and lengths, and every valid index against V. */
static rl_status check_indices(const rl_layer *l, const rl_layer_io *io, int64_t *T, int64_t *B) {
    char s[128];
    if (io->n_in != 1)
        return rl_error(RL_EARG, "layer '%s' (embedding): takes one input, %d given", l->name,
                        io->n_in);
    const rl_tensor *x = io->in[0];
    if (!x || !x->storage || x->ndim != 2 || x->dtype != RL_INT32)
        return rl_error(RL_EDTYPE,
                        "layer '%s' (embedding): the input must be (T, B) int32 class indices "
                        "(a sparse input), got %s",
                        l->name, x && x->storage ? rl_tensor_describe(x, s, sizeof s) : "nothing");
    RL_TRY(rl_layer_check_device(l, rl_tensor_device(x)));
    if (rl_tensor_device(x).type != RL_CPU)
        return rl_error(RL_EDEVICE,
                        "layer '%s' (embedding): runs on the CPU only, the input is on %s", l->name,
                        rl_tensor_describe(x, s, sizeof s));
    *T = x->shape[0];
    *B = x->shape[1];
    const rl_tensor *len = io->lengths;
    if (!len || !len->storage || len->ndim != 1 || len->dtype != RL_INT32 ||
        rl_tensor_device(len).type != RL_CPU || len->shape[0] != *B)
        return rl_error(RL_ESHAPE,
                        "layer '%s' (embedding): lengths must be a CPU int32 tensor of shape "
                        "(%" PRId64 ")",
                        l->name, *B);
    const int32_t *xp = rl_tensor_data(x);
    const int32_t *lp = rl_tensor_data(len);
    int64_t V = l->in_dims[0];
    for (int64_t b = 0; b < *B; b++) {
        int64_t n = lp[b * len->stride[0]];
        if (n < 1 || n > *T)
            return rl_error(RL_ESHAPE,
                            "layer '%s' (embedding): lengths[%" PRId64 "] = %" PRId64
                            " is outside 1..%" PRId64 " (T)",
                            l->name, b + 1, n, *T);
        for (int64_t t = 0; t < n; t++) {
            int64_t v = xp[t * x->stride[0] + b * x->stride[1]];
            if (v < 0 || v >= V)
                return rl_error(RL_EARG,
                                "layer '%s' (embedding): class index %" PRId64 " at frame %" PRId64
                                " of sequence %" PRId64 " is outside 0..%" PRId64,
                                l->name, v, t + 1, b + 1, V - 1);
        }
    }
    return RL_OK;
}

static rl_status embedding_forward(rl_layer *l, rl_layer_io *io) {
    int64_t T, B, D = l->n_out;
    RL_TRY(check_indices(l, io, &T, &B));
    const rl_param *W = &l->params[0];
    if (!W->value.storage)
        return rl_error(RL_EARG, "layer '%s' (embedding): W is not bound to a buffer", l->name);
    if (rl_tensor_device(&W->value).type != RL_CPU)
        return rl_error(RL_EDEVICE, "layer '%s' (embedding): runs on the CPU only", l->name);
    rl_dtype dt = W->value.dtype;
    int64_t shape[3] = {T, B, D};
    RL_TRY(rl_buffer_ensure(&l->out, dt, rl_tensor_device(&W->value), 3, shape));
    const rl_tensor *x = io->in[0];
    const int32_t *xp = rl_tensor_data(x);
    const int32_t *lp = rl_tensor_data(io->lengths);
    const char *wp = rl_tensor_data(&W->value);
    char *op = rl_tensor_data(&l->out);
    size_t row = (size_t)D * rl_dtype_size(dt);
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            char *dst = op + (size_t)(t * B + b) * row;
            if (t < lp[b * io->lengths->stride[0]])
                memcpy(dst, wp + (size_t)xp[t * x->stride[0] + b * x->stride[1]] * row, row);
            else
                memset(dst, 0, row);
        }
    return RL_OK;
}

static rl_status embedding_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                    rl_tensor *const *grad_in) {
    (void)grad_in; /* class indices have no gradient */
    char s[128];
    int64_t T, B, D = l->n_out;
    RL_TRY(check_indices(l, io, &T, &B));
    rl_param *W = &l->params[0];
    if (!grad_out || grad_out->ndim != 3 || grad_out->shape[0] != T || grad_out->shape[1] != B ||
        grad_out->shape[2] != D || grad_out->dtype != W->grad.dtype ||
        rl_tensor_device(grad_out).type != RL_CPU)
        return rl_error(RL_ESHAPE,
                        "layer '%s' (embedding): grad_out must be a CPU (%" PRId64 ", %" PRId64
                        ", %" PRId64 ") %s tensor, got %s",
                        l->name, T, B, D, rl_dtype_name(W->grad.dtype),
                        grad_out ? rl_tensor_describe(grad_out, s, sizeof s) : "nothing");
    const rl_tensor *x = io->in[0];
    const int32_t *xp = rl_tensor_data(x);
    const int32_t *lp = rl_tensor_data(io->lengths);
    const int64_t *gs = grad_out->stride;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            if (t >= lp[b * io->lengths->stride[0]]) continue;
            int64_t v = xp[t * x->stride[0] + b * x->stride[1]];
            int64_t g0 = t * gs[0] + b * gs[1];
            if (W->grad.dtype == RL_FLOAT64) {
                double *dw = (double *)rl_tensor_data(&W->grad) + v * D;
                const double *g = (const double *)rl_tensor_data(grad_out) + g0;
                for (int64_t j = 0; j < D; j++)
                    dw[j] += g[j * gs[2]];
            } else {
                float *dw = (float *)rl_tensor_data(&W->grad) + v * D;
                const float *g = (const float *)rl_tensor_data(grad_out) + g0;
                for (int64_t j = 0; j < D; j++)
                    dw[j] += g[j * gs[2]];
            }
        }
    return RL_OK;
}

static const rl_layer_ops embedding_ops = {
    .class_name = "embedding", .forward = embedding_forward, .backward = embedding_backward};

rl_status rl_embedding_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                              const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG, "layer '%s' (embedding): takes exactly one sparse input, %d given",
                        name, n_in);
    int64_t n_out;
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &n_out));
    RL_TRY(rl_layer_alloc(out, sizeof(embedding_layer), &embedding_ops, name, n_in, in_dims));
    (*out)->n_out = n_out;
    int64_t shape[2] = {in_dims[0], n_out};
    int iW;
    rl_status st =
        rl_layer_add_param(*out, "W", 2, shape, RL_INIT_GLOROT, 1.0, in_dims[0], n_out, &iW);
    if (st != RL_OK) {
        rl_layer_free(*out);
        *out = NULL;
    }
    return st;
}
