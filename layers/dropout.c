/* dropout: inverted dropout of concat(in_1, ..., in_n) with drop probability p (option
 * `dropout`, 0 <= p < 1).
 *   training (io->train):  m = [u >= p] / (1 - p), u ~ U[0, 1) from io->rng, one per element;
 *                          out = x * m;  grad_in = grad_out * m
 *   otherwise:             out = x;      grad_in = grad_out
 * Scaling the kept units in training makes evaluation the identity, with no rescaling.
 * Buffers: out (T, B, n_out); mask m (T, B, n_out), drawn in forward and kept for backward.
 * A draw takes T*B*n_out numbers from the network's generator, so masks are reproducible from
 * the seed. */
#include "layer.h"
#include "layers.h"

#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    double p;
    bool masked;    /* the last forward applied the mask */
    rl_tensor mask; /* (T, B, n_out): 0 or 1/(1-p) */
} dropout_layer;

static rl_status dropout_forward(rl_layer *l, rl_layer_io *io) {
    dropout_layer *D = (dropout_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    rl_dtype dt = io->in[0]->dtype;
    rl_device dev = rl_tensor_device(io->in[0]);
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, shape));
    D->masked = io->train && D->p > 0;
    if (D->masked) {
        if (!io->rng)
            return rl_error(RL_EARG, RL_LAYER_WHERE ": training needs a random generator", l->name,
                            "dropout");
        RL_TRY(rl_buffer_ensure(&D->mask, dt, dev, 3, shape));
        RL_TRY(rl_op_uniform(&D->mask, io->rng, 0.0, 1.0));
        RL_TRY(rl_op_binary_scalar(&D->mask, &D->mask, D->p, RL_BIN_GE, false));
        RL_TRY(rl_op_binary_scalar(&D->mask, &D->mask, 1.0 / (1.0 - D->p), RL_BIN_MUL, false));
    }
    int64_t off = 0;
    for (int i = 0; i < io->n_in; i++) {
        rl_tensor y = {0}, m = {0};
        rl_status st = rl_tensor_narrow(&y, &l->out, 2, off, l->in_dims[i]);
        if (st == RL_OK && D->masked) st = rl_tensor_narrow(&m, &D->mask, 2, off, l->in_dims[i]);
        if (st == RL_OK)
            st =
                D->masked ? rl_op_binary(&y, io->in[i], &m, RL_BIN_MUL) : rl_op_copy(&y, io->in[i]);
        rl_tensor_release(&m);
        rl_tensor_release(&y);
        RL_TRY(st);
        off += l->in_dims[i];
    }
    return RL_OK;
}

static rl_status dropout_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                  rl_tensor *const *grad_in) {
    dropout_layer *D = (dropout_layer *)l;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "dropout");
    int64_t off = 0;
    for (int i = 0; i < io->n_in; i++) {
        if (grad_in[i]) {
            rl_tensor g = {0}, m = {0};
            rl_status st = rl_tensor_narrow(&g, grad_out, 2, off, l->in_dims[i]);
            if (st == RL_OK && D->masked)
                st = rl_tensor_narrow(&m, &D->mask, 2, off, l->in_dims[i]);
            if (st == RL_OK)
                st = D->masked ? rl_op_binary(grad_in[i], &g, &m, RL_BIN_MUL)
                               : rl_op_copy(grad_in[i], &g);
            rl_tensor_release(&m);
            rl_tensor_release(&g);
            RL_TRY(st);
        }
        off += l->in_dims[i];
    }
    return RL_OK;
}

static void dropout_destroy(rl_layer *l) { rl_tensor_release(&((dropout_layer *)l)->mask); }

static const rl_layer_ops dropout_ops = {.class_name = "dropout",
                                         .forward = dropout_forward,
                                         .backward = dropout_backward,
                                         .destroy = dropout_destroy};

rl_status rl_dropout_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "dropout");
    double p = 0;
    int found = 0;
    RL_TRY(opts->number(opts->ctx, "dropout", &p, &found));
    if (!found)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": missing option dropout", name, "dropout");
    if (!(p >= 0.0 && p < 1.0))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": option dropout = %g must be in [0, 1)", name,
                        "dropout", p);
    RL_TRY(rl_layer_alloc(out, sizeof(dropout_layer), &dropout_ops, name, n_in, in_dims));
    ((dropout_layer *)*out)->p = p;
    for (int i = 0; i < n_in; i++)
        (*out)->n_out += in_dims[i];
    return RL_OK;
}
