/* combine: joins several inputs frame by frame (option kind, required).
 *   add:    out = in_1 + ... + in_n            (all F_i equal)   grad_in_i = grad_out
 *   concat: out = concat(in_1, ..., in_n)      (n_out = sum F_i) grad_in_i = its slice of grad_out
 *   mul:    out = in_1 * in_2 elementwise      (two inputs, F_1 = F_2)
 *           grad_in_1 = grad_out * in_2,  grad_in_2 = grad_out * in_1
 * Buffers: out (T, B, n_out). Backward keeps nothing (mul reads the inputs again). */
#include <inttypes.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../kernels/ops.h"

typedef enum { COMBINE_ADD, COMBINE_CONCAT, COMBINE_MUL } combine_kind;

typedef struct {
    rl_layer base;
    combine_kind kind;
} combine_layer;

static rl_status combine_forward(rl_layer *l, rl_layer_io *io) {
    combine_layer *C = (combine_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, io->in[0]->dtype, rl_tensor_device(io->in[0]), 3, shape));
    switch (C->kind) {
    case COMBINE_ADD:
        RL_TRY(rl_op_copy(&l->out, io->in[0]));
        for (int i = 1; i < io->n_in; i++)
            RL_TRY(rl_op_binary(&l->out, &l->out, io->in[i], RL_BIN_ADD));
        return RL_OK;
    case COMBINE_MUL: return rl_op_binary(&l->out, io->in[0], io->in[1], RL_BIN_MUL);
    case COMBINE_CONCAT: break;
    }
    return rl_layer_concat_inputs(l, io, &l->out);
}

static rl_status combine_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                  rl_tensor *const *grad_in) {
    combine_layer *C = (combine_layer *)l;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "combine");
    if (C->kind == COMBINE_CONCAT) return rl_layer_split_grad(l, grad_out, grad_in);
    for (int i = 0; i < io->n_in; i++) {
        if (!grad_in[i]) continue;
        if (C->kind == COMBINE_ADD)
            RL_TRY(rl_op_copy(grad_in[i], grad_out));
        else
            RL_TRY(rl_op_binary(grad_in[i], grad_out, io->in[1 - i], RL_BIN_MUL));
    }
    return RL_OK;
}

static const rl_layer_ops combine_ops = {
    .class_name = "combine", .forward = combine_forward, .backward = combine_backward};

rl_status rl_combine_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims) {
    *out = NULL;
    const char *s;
    RL_TRY(rl_opt_string(opts, name, "kind", NULL, &s));
    if (!s)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": missing option kind (add, concat or mul)", name,
                        "combine");
    combine_kind kind;
    if (strcmp(s, "add") == 0)
        kind = COMBINE_ADD;
    else if (strcmp(s, "concat") == 0)
        kind = COMBINE_CONCAT;
    else if (strcmp(s, "mul") == 0)
        kind = COMBINE_MUL;
    else
        return rl_error(RL_EARG, RL_LAYER_WHERE ": unknown combine kind '%s' (add, concat or mul)",
                        name, "combine", s);
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "combine");
    if (kind == COMBINE_MUL && n_in != 2)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": combine kind mul takes two inputs, got %d", name,
                        "combine", n_in);
    int64_t n_out = 0;
    for (int i = 0; i < n_in; i++) {
        if (kind != COMBINE_CONCAT && in_dims[i] != in_dims[0])
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE
                            ": combine kind %s needs inputs of one dim, input %d has "
                            "%" PRId64 ", input 1 has %" PRId64,
                            name, "combine", s, i + 1, in_dims[i], in_dims[0]);
        n_out = kind == COMBINE_CONCAT ? n_out + in_dims[i] : in_dims[0];
    }
    RL_TRY(rl_layer_alloc(out, sizeof(combine_layer), &combine_ops, name, n_in, in_dims));
    ((combine_layer *)*out)->kind = kind;
    (*out)->n_out = n_out;
    return RL_OK;
}
