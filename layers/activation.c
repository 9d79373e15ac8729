/* activation: out = f(concat(in_1, ..., in_n)) elementwise, n_out = sum F_i; and the
 * activation functions shared with linear (rl_activation_*, declared in layers.h).
 *
 *   f            f(x)              f'(x), as computed in backward
 *   identity     x                 1
 *   tanh         tanh x            1 - y^2
 *   sigmoid      1 / (1 + e^-x)    y (1 - y)
 *   relu         max(x, 0)         [y > 0]
 *   elu          x > 0 ? x : e^x-1 min(y + 1, 1)
 *   softplus     log(1 + e^x)      sigmoid(x)
 *   exp          e^x               y
 *   square       x^2               2 x
 *
 * Buffers: out (T, B, n_out). Backward keeps nothing of its own: it reads the inputs (the same
 * as in forward, per the layer contract) and out. Each input is handled on its own slice of
 * out, so no concatenated copy of the inputs is made. */
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../kernels/ops.h"

static const char *const act_names[RL_NUM_ACTIVATIONS] = {
    "identity", "tanh", "sigmoid", "relu", "elu", "softplus", "exp", "square"};

const char *rl_activation_name(rl_activation a) {
    return (unsigned)a < RL_NUM_ACTIVATIONS ? act_names[a] : "?";
}

rl_status rl_activation_parse(const char *s, const char *layer, rl_activation *out) {
    for (int i = 0; i < RL_NUM_ACTIVATIONS; i++)
        if (strcmp(s, act_names[i]) == 0) {
            *out = (rl_activation)i;
            return RL_OK;
        }
    return rl_error(RL_EARG,
                    RL_LAYER_WHERE
                    ": unknown activation '%s' (known: identity, tanh, sigmoid, relu, "
                    "elu, softplus, exp, square)",
                    layer, "activation", s);
}

rl_status rl_activation_forward(rl_activation a, rl_tensor *y, const rl_tensor *x) {
    switch (a) {
    case RL_ACT_IDENTITY: return y == x ? RL_OK : rl_op_copy(y, x);
    case RL_ACT_TANH: return rl_op_unary(y, x, RL_UN_TANH, 0, 0);
    case RL_ACT_SIGMOID: return rl_op_unary(y, x, RL_UN_SIGMOID, 0, 0);
    case RL_ACT_RELU: return rl_op_unary(y, x, RL_UN_RELU, 0, 0);
    case RL_ACT_ELU: return rl_op_unary(y, x, RL_UN_ELU, 1.0, 0);
    case RL_ACT_SOFTPLUS: return rl_op_unary(y, x, RL_UN_SOFTPLUS, 0, 0);
    case RL_ACT_EXP: return rl_op_unary(y, x, RL_UN_EXP, 0, 0);
    case RL_ACT_SQUARE: return rl_op_unary(y, x, RL_UN_SQUARE, 0, 0);
    case RL_NUM_ACTIVATIONS: break;
    }
    return rl_error(RL_EARG, "activation: invalid function %d", (int)a);
}

bool rl_activation_needs_input(rl_activation a) {
    return a == RL_ACT_SOFTPLUS || a == RL_ACT_SQUARE;
}

rl_status rl_activation_backward(rl_activation a, rl_tensor *dx, const rl_tensor *dy,
                                 const rl_tensor *x, const rl_tensor *y) {
    /* dx first receives f'(x), then is multiplied by dy in place */
    switch (a) {
    case RL_ACT_IDENTITY: return rl_op_copy(dx, dy);
    case RL_ACT_TANH:
        RL_TRY(rl_op_binary(dx, y, y, RL_BIN_MUL));
        RL_TRY(rl_op_binary_scalar(dx, dx, 1.0, RL_BIN_SUB, true));
        break;
    case RL_ACT_SIGMOID:
        RL_TRY(rl_op_binary_scalar(dx, y, 1.0, RL_BIN_SUB, true));
        RL_TRY(rl_op_binary(dx, dx, y, RL_BIN_MUL));
        break;
    case RL_ACT_RELU: RL_TRY(rl_op_binary_scalar(dx, y, 0.0, RL_BIN_GT, false)); break;
    case RL_ACT_ELU:
        RL_TRY(rl_op_binary_scalar(dx, y, 1.0, RL_BIN_ADD, false));
        RL_TRY(rl_op_binary_scalar(dx, dx, 1.0, RL_BIN_MIN, false));
        break;
    case RL_ACT_SOFTPLUS: RL_TRY(rl_op_unary(dx, x, RL_UN_SIGMOID, 0, 0)); break;
    case RL_ACT_EXP: return rl_op_binary(dx, dy, y, RL_BIN_MUL);
    case RL_ACT_SQUARE: RL_TRY(rl_op_binary_scalar(dx, x, 2.0, RL_BIN_MUL, false)); break;
    case RL_NUM_ACTIVATIONS:
        return rl_error(RL_EARG, "activation backward: invalid function %d", (int)a);
    }
    return rl_op_binary(dx, dx, dy, RL_BIN_MUL);
}

typedef struct {
    rl_layer base;
    rl_activation act;
} activation_layer;

/* slice i of t along the features: [off, off + len) */
static rl_status feature_slice(rl_tensor *out, const rl_tensor *t, int64_t off, int64_t len) {
    return rl_tensor_narrow(out, t, 2, off, len);
}

static rl_status activation_forward(rl_layer *l, rl_layer_io *io) {
    activation_layer *a = (activation_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, io->in[0]->dtype, rl_tensor_device(io->in[0]), 3, shape));
    int64_t off = 0;
    for (int i = 0; i < io->n_in; i++) {
        rl_tensor y = {0};
        RL_TRY(feature_slice(&y, &l->out, off, l->in_dims[i]));
        rl_status st = rl_activation_forward(a->act, &y, io->in[i]);
        rl_tensor_release(&y);
        RL_TRY(st);
        off += l->in_dims[i];
    }
    return RL_OK;
}

static rl_status activation_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                     rl_tensor *const *grad_in) {
    activation_layer *a = (activation_layer *)l;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "activation");
    int64_t off = 0;
    for (int i = 0; i < io->n_in; i++) {
        if (grad_in[i]) {
            rl_tensor y = {0}, dy = {0};
            rl_status st = feature_slice(&y, &l->out, off, l->in_dims[i]);
            if (st == RL_OK) st = feature_slice(&dy, grad_out, off, l->in_dims[i]);
            if (st == RL_OK) st = rl_activation_backward(a->act, grad_in[i], &dy, io->in[i], &y);
            rl_tensor_release(&dy);
            rl_tensor_release(&y);
            RL_TRY(st);
        }
        off += l->in_dims[i];
    }
    return RL_OK;
}

static const rl_layer_ops activation_ops = {
    .class_name = "activation", .forward = activation_forward, .backward = activation_backward};

rl_status rl_activation_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                               const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "activation");
    const char *s;
    rl_activation act = RL_ACT_IDENTITY;
    RL_TRY(rl_opt_string(opts, name, "activation", NULL, &s));
    if (!s)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": missing option activation", name, "activation");
    RL_TRY(rl_activation_parse(s, name, &act));
    RL_TRY(rl_layer_alloc(out, sizeof(activation_layer), &activation_ops, name, n_in, in_dims));
    ((activation_layer *)*out)->act = act;
    for (int i = 0; i < n_in; i++)
        (*out)->n_out += in_dims[i];
    return RL_OK;
}
