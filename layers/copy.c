/* copy: out = concat(in_1, ..., in_n) along the feature dim.
 *   forward:  out[:, :, o_i : o_i + F_i] = in_i          (T, B, sum F_i)
 *   backward: grad_in_i = grad_out[:, :, o_i : o_i + F_i]
 * Keeps nothing for backward. */
#include "layer.h"
#include "layers.h"

#include "../kernels/ops.h"

static rl_status copy_forward(rl_layer *l, rl_layer_io *io) {
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, io->in[0]->dtype, rl_tensor_device(io->in[0]), 3, shape));
    return rl_layer_concat_inputs(l, io, &l->out);
}

static rl_status copy_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                               rl_tensor *const *grad_in) {
    (void)io;
    return rl_layer_split_grad(l, grad_out, grad_in);
}

static const rl_layer_ops copy_ops = {
    .class_name = "copy", .forward = copy_forward, .backward = copy_backward};

rl_status rl_copy_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                         const int64_t *in_dims) {
    (void)opts;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "copy");
    RL_TRY(rl_layer_alloc(out, sizeof(rl_layer), &copy_ops, name, n_in, in_dims));
    for (int i = 0; i < n_in; i++)
        (*out)->n_out += in_dims[i];
    return RL_OK;
}
