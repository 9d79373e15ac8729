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
 * the sequence and the value, found before anything is written. Buffers: out (T, B, n_out);
 * backward reads the input again.
 *
 * Devices: the class indices stay on the CPU (the layer contract); W's device decides where the
 * layer computes. On CUDA (kernels/cuda/embedding.cu) forward is one gather kernel over a frame ->
 * class map (-1 on padded frames) built on the host; backward groups the valid frames by class on
 * the host (rl_embedding_groups: each class's frames in frame order) and one kernel adds each
 * class's rows into dW in that order, with no atomics: deterministic, and the same additions in
 * the same order as the CPU loop. The two int32 arrays go to the device in one copy per call
 * (idx_host -> idx_dev, kept across batches). */
#include <inttypes.h>
#include <stdlib.h>

#include "layer.h"
#include "layers.h"

#include "../kernels/cuda/embedding_cuda.h"
#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    /* CUDA: the int32 index arrays of the last call on the host and the device, and the
     * grouping's scratch (rl_embedding_groups) */
    rl_tensor idx_host, idx_dev, pairs;
} embedding_layer;

/* (v, frame) pairs ordered by class, then frame. */
static int cmp_pair(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

int64_t rl_embedding_groups(const rl_tensor *x, const rl_tensor *len, int32_t *pairs,
                            int32_t *out) {
    int64_t T = x->shape[0], B = x->shape[1];
    const int32_t *xp = rl_tensor_data(x), *lp = rl_tensor_data(len);
    int64_t nv = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            if (t < lp[b * len->stride[0]]) {
                pairs[2 * nv] = xp[t * x->stride[0] + b * x->stride[1]];
                pairs[2 * nv + 1] = (int32_t)(t * B + b);
                nv++;
            }
    qsort(pairs, (size_t)nv, 2 * sizeof(int32_t), cmp_pair);
    int64_t n_used = 0;
    for (int64_t i = 0; i < nv; i++)
        if (i == 0 || pairs[2 * i] != pairs[2 * i - 2]) n_used++;
    int32_t *start = out, *cls = out + n_used + 1, *rows = cls + n_used;
    int64_t u = 0;
    for (int64_t i = 0; i < nv; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * i - 2]) {
            start[u] = (int32_t)i;
            cls[u++] = pairs[2 * i];
        }
        rows[i] = pairs[2 * i + 1];
    }
    start[n_used] = (int32_t)nv;
    return n_used;
}

static rl_status check_io(const rl_layer *l, const rl_layer_io *io, int64_t *T, int64_t *B) {
    char s[128];
    if (io->n_in != 1 || !rl_layer_input_sparse(l, io->in[0]))
        return rl_error(RL_EDTYPE,
                        RL_LAYER_WHERE ": the input must be (T, B) int32 class indices "
                                       "(a sparse input), got %s",
                        l->name, "embedding",
                        io->n_in == 1 && io->in[0] && io->in[0]->storage
                            ? rl_tensor_describe(io->in[0], s, sizeof s)
                            : "another number of inputs");
    RL_TRY(rl_layer_check_inputs(l, io, T, B));
    const rl_param *W = &l->params[0];
    if (!W->value.storage || !W->grad.storage)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": W is not bound to a parameter buffer", l->name,
                        "embedding");
    return RL_OK;
}

#ifdef RL_WITH_CUDA
/* idx_host (n int32, filled by the caller) -> idx_dev on W's device. */
static rl_status upload(embedding_layer *E, int64_t n, rl_device dev) {
    rl_tensor h = {0};
    RL_TRY(rl_tensor_narrow(&h, &E->idx_host, 0, 0, n));
    rl_tensor d = {0};
    rl_status st = rl_buffer_ensure(&E->idx_dev, RL_INT32, dev, 1, &E->idx_host.shape[0]);
    if (st == RL_OK) st = rl_tensor_narrow(&d, &E->idx_dev, 0, 0, n);
    if (st == RL_OK) st = rl_op_copy(&d, &h);
    rl_tensor_release(&h);
    rl_tensor_release(&d);
    return st;
}
#endif

static rl_status embedding_forward(rl_layer *l, rl_layer_io *io) {
    int64_t T, B;
    RL_TRY(check_io(l, io, &T, &B));
    rl_param *W = &l->params[0];
    rl_device dev = rl_tensor_device(&W->value);
    int64_t shape[3] = {T, B, l->n_out}, rows[2] = {T * B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, W->value.dtype, dev, 3, shape));
#ifdef RL_WITH_CUDA
    if (dev.type == RL_CUDA) {
        /* the frame -> class map, -1 on padded frames */
        embedding_layer *E = (embedding_layer *)l;
        int64_t n = T * B;
        RL_TRY(rl_buffer_ensure(&E->idx_host, RL_INT32, RL_DEVICE_CPU, 1, &n));
        int32_t *m = rl_tensor_data(&E->idx_host);
        const rl_tensor *x = io->in[0];
        const int32_t *xp = rl_tensor_data(x), *lp = rl_tensor_data(io->lengths);
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                m[t * B + b] = t < lp[b * io->lengths->stride[0]]
                                   ? xp[t * x->stride[0] + b * x->stride[1]]
                                   : -1;
        RL_TRY(upload(E, n, dev));
        return rl_embedding_cuda_gather(W->value.dtype, n, l->n_out, rl_tensor_data(&E->idx_dev),
                                        rl_tensor_data(&W->value), W->value.stride[0],
                                        rl_tensor_data(&l->out), l->n_out);
    }
#endif
    RL_TRY(rl_op_fill(&l->out, 0.0));
    rl_tensor z = {0};
    RL_TRY(rl_op_reshape(&z, &l->out, 2, rows));
    rl_sparse_rows_add(&z, io->in[0], io->lengths, &W->value, false);
    rl_tensor_release(&z);
    return RL_OK;
}

static rl_status embedding_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                    rl_tensor *const *grad_in) {
    (void)grad_in; /* class indices have no gradient */
    char s[128];
    int64_t T, B, D = l->n_out;
    RL_TRY(check_io(l, io, &T, &B));
    rl_param *W = &l->params[0];
    if (!grad_out || grad_out->ndim != 3 || grad_out->shape[0] != T || grad_out->shape[1] != B ||
        grad_out->shape[2] != D || grad_out->dtype != W->grad.dtype ||
        !rl_device_eq(rl_tensor_device(grad_out), rl_tensor_device(&W->grad)))
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": grad_out must be a (%" PRId64 ", %" PRId64 ", %" PRId64
                                       ") %s tensor on W's device, got %s",
                        l->name, "embedding", T, B, D, rl_dtype_name(W->grad.dtype),
                        grad_out ? rl_tensor_describe(grad_out, s, sizeof s) : "nothing");
    rl_tensor g = {0};
    int64_t rows[2] = {T * B, D};
    RL_TRY(rl_op_reshape(&g, grad_out, 2, rows));
#ifdef RL_WITH_CUDA
    if (rl_tensor_device(&W->grad).type == RL_CUDA) {
        /* the valid frames grouped by class, added class by class in frame order */
        embedding_layer *E = (embedding_layer *)l;
        if (T * B > INT32_MAX) {
            rl_tensor_release(&g);
            return rl_error(RL_EARG,
                            RL_LAYER_WHERE ": %" PRId64 " frames (T*B) are more than the "
                                           "CUDA backward's int32 frame indices hold",
                            l->name, "embedding", T * B);
        }
        int64_t np = 2 * T * B, n = 3 * T * B + 1;
        rl_status st = rl_buffer_ensure(&E->pairs, RL_INT32, RL_DEVICE_CPU, 1, &np);
        if (st == RL_OK) st = rl_buffer_ensure(&E->idx_host, RL_INT32, RL_DEVICE_CPU, 1, &n);
        int64_t n_used = 0;
        if (st == RL_OK) {
            n_used = rl_embedding_groups(io->in[0], io->lengths, rl_tensor_data(&E->pairs),
                                         rl_tensor_data(&E->idx_host));
            st = upload(E, n, rl_tensor_device(&W->grad));
        }
        const int32_t *dp = st == RL_OK ? rl_tensor_data(&E->idx_dev) : NULL;
        if (st == RL_OK)
            st = rl_embedding_cuda_scatter_add(W->grad.dtype, n_used, D, dp, dp + n_used + 1,
                                               dp + 2 * n_used + 1, rl_tensor_data(&g), g.stride[0],
                                               rl_tensor_data(&W->grad), W->grad.stride[0]);
        rl_tensor_release(&g);
        return st;
    }
#endif
    rl_sparse_rows_add(&g, io->in[0], io->lengths, &W->grad, true);
    rl_tensor_release(&g);
    return RL_OK;
}

static void embedding_destroy(rl_layer *l) {
    embedding_layer *E = (embedding_layer *)l;
    rl_tensor_release(&E->idx_host);
    rl_tensor_release(&E->idx_dev);
    rl_tensor_release(&E->pairs);
}

static const rl_layer_ops embedding_ops = {.class_name = "embedding",
                                           .forward = embedding_forward,
                                           .backward = embedding_backward,
                                           .destroy = embedding_destroy};

rl_status rl_embedding_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                              const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": takes exactly one sparse input, %d given", name,
                        "embedding", n_in);
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
