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

#include "layer.h"
#include "layers.h"

#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
} embedding_layer;

static rl_status check_io(const rl_layer *l, const rl_layer_io *io, int64_t *T, int64_t *B) {
    char s[128];
    if (io->n_in != 1 || !rl_layer_input_sparse(l, io->in[0]))
        return rl_error(RL_EDTYPE,
                        "layer '%s' (embedding): the input must be (T, B) int32 class indices "
                        "(a sparse input), got %s",
                        l->name,
                        io->n_in == 1 && io->in[0] && io->in[0]->storage
                            ? rl_tensor_describe(io->in[0], s, sizeof s)
                            : "another number of inputs");
    RL_TRY(rl_layer_check_inputs(l, io, T, B));
    const rl_param *W = &l->params[0];
    if (!W->value.storage || rl_tensor_device(&W->value).type != RL_CPU)
        return rl_error(RL_EDEVICE, "layer '%s' (embedding): W must be bound, on the CPU (for now)",
                        l->name);
    return RL_OK;
}

static rl_status embedding_forward(rl_layer *l, rl_layer_io *io) {
    int64_t T, B;
    RL_TRY(check_io(l, io, &T, &B));
    rl_param *W = &l->params[0];
    int64_t shape[3] = {T, B, l->n_out}, rows[2] = {T * B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, W->value.dtype, rl_tensor_device(&W->value), 3, shape));
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
        rl_tensor_device(grad_out).type != RL_CPU)
        return rl_error(RL_ESHAPE,
                        "layer '%s' (embedding): grad_out must be a CPU (%" PRId64 ", %" PRId64
                        ", %" PRId64 ") %s tensor, got %s",
                        l->name, T, B, D, rl_dtype_name(W->grad.dtype),
                        grad_out ? rl_tensor_describe(grad_out, s, sizeof s) : "nothing");
    rl_tensor g = {0};
    int64_t rows[2] = {T * B, D};
    RL_TRY(rl_op_reshape(&g, grad_out, 2, rows));
    rl_sparse_rows_add(&g, io->in[0], io->lengths, &W->grad, true);
    rl_tensor_release(&g);
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
