/* linear: out = f(z), z = concat(in_1, ..., in_n) W + b, f an activation (activation.c).
 *
 * Params (RETURNN's layout, input-major): W (sum F_i, n_out), glorot; b (n_out), zeros,
 * present unless with_bias = false. Rows off_i .. off_i + F_i - 1 of W multiply input i, so
 * z = sum_i in_i W_i + b with W_i a row-narrow of W: one GEMM per input accumulating into z
 * (beta = 1), and no concatenated copy of the inputs.
 *   forward:  z (T*B, n_out) = b (broadcast) + sum_i x_i (T*B, F_i) W_i (F_i, n_out)
 *   backward: dz = grad_out * f'(z);  dW_i += x_i^T dz;  db += sum_rows dz;  dx_i = dz W_i^T
 * Buffers: out (T, B, n_out); z (T, B, n_out) only for activations whose derivative needs the
 * input (softplus, square), otherwise f is applied to out in place; dz (T, B, n_out) in
 * backward unless f is the identity; db (n_out). Backward keeps z and out from forward and
 * reads the inputs again.
 *
 * The affine part (rl_affine_forward/backward) is shared with softmax. */
#include <inttypes.h>

#include "layer.h"
#include "layers.h"

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/ops.h"

/* t (T, B, F) as (T*B, F): a view when the strides allow (always for the network's buffers),
 * else, for a read-only operand, a contiguous copy. */
static rl_status rows_of(rl_tensor *out, const rl_tensor *t, bool writable, const char *layer) {
    int64_t shape[2] = {t->shape[0] * t->shape[1], t->shape[2]};
    RL_TRY(rl_op_reshape(out, t, 2, shape));
    if (writable && out->storage != t->storage) {
        rl_tensor_release(out);
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE
                        ": a gradient buffer whose (T, B) dims cannot be merged into "
                        "one is not supported",
                        layer, "linear");
    }
    return RL_OK;
}

static rl_status check_param(const rl_layer *l, const rl_param *p, const rl_tensor *like) {
    char s[128];
    if (!p->value.storage || !p->grad.storage)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": parameter %s is not bound to a buffer", l->name,
                        "linear", p->name);
    if (p->value.dtype != like->dtype ||
        !rl_device_eq(rl_tensor_device(&p->value), rl_tensor_device(like)))
        return rl_error(RL_EDTYPE, RL_LAYER_WHERE ": parameter %s is %s, the input %s", l->name,
                        "linear", p->name, rl_dtype_name(p->value.dtype),
                        rl_tensor_describe(like, s, sizeof s));
    return RL_OK;
}

rl_status rl_affine_forward(const rl_layer *l, const rl_layer_io *io, const rl_param *W,
                            const rl_param *b, rl_tensor *z) {
    RL_TRY(check_param(l, W, z));
    if (b) RL_TRY(check_param(l, b, z));
    rl_tensor z2 = {0};
    RL_TRY(rows_of(&z2, z, true, l->name));
    /* a sparse input adds rows of W_i: z must hold the bias or zeros first */
    rl_status st = b ? rl_op_copy(&z2, &b->value)
                     : (rl_layer_input_sparse(l, io->in[0]) ? rl_op_fill(&z2, 0.0) : RL_OK);
    for (int i = 0; i < io->n_in && st == RL_OK; i++)
        if (rl_layer_input_sparse(l, io->in[i]) && rl_tensor_device(&W->value).type != RL_CPU)
            st = rl_error(RL_EDEVICE,
                          RL_LAYER_WHERE ": class-index inputs work on the CPU only (for now)",
                          l->name, "linear");
    int64_t off = 0;
    for (int i = 0; i < io->n_in && st == RL_OK; i++) {
        rl_tensor x2 = {0}, Wi = {0};
        bool sparse = rl_layer_input_sparse(l, io->in[i]);
        st = rl_tensor_narrow(&Wi, &W->value, 0, off, l->in_dims[i]);
        if (st == RL_OK && sparse) rl_sparse_rows_add(&z2, io->in[i], io->lengths, &Wi, false);
        if (st == RL_OK && !sparse) st = rows_of(&x2, io->in[i], false, l->name);
        if (st == RL_OK && !sparse)
            st = rl_op_gemm(&z2, &x2, &Wi, false, false, 1.0, b || i > 0 ? 1.0 : 0.0);
        rl_tensor_release(&Wi);
        rl_tensor_release(&x2);
        off += l->in_dims[i];
    }
    rl_tensor_release(&z2);
    return st;
}

rl_status rl_affine_backward(const rl_layer *l, const rl_layer_io *io, rl_param *W, rl_param *b,
                             const rl_tensor *dz, rl_tensor *db, rl_tensor *const *grad_in) {
    rl_tensor dz2 = {0};
    RL_TRY(rows_of(&dz2, dz, false, l->name));
    rl_status st = RL_OK;
    if (b) {
        st = rl_buffer_ensure(db, dz->dtype, rl_tensor_device(dz), 1, &l->n_out);
        if (st == RL_OK) st = rl_op_reduce_dim(db, NULL, &dz2, 0, false, RL_RED_SUM);
        if (st == RL_OK) st = rl_op_binary(&b->grad, &b->grad, db, RL_BIN_ADD);
    }
    int64_t off = 0;
    for (int i = 0; i < io->n_in && st == RL_OK; i++) {
        rl_tensor x2 = {0}, Wi = {0}, dWi = {0}, dx2 = {0};
        st = rl_tensor_narrow(&dWi, &W->grad, 0, off, l->in_dims[i]);
        if (st == RL_OK && rl_layer_input_sparse(l, io->in[i])) {
            /* class indices: dW_i rows += dz rows; the input has no gradient */
            rl_sparse_rows_add(&dz2, io->in[i], io->lengths, &dWi, true);
            rl_tensor_release(&dWi);
            off += l->in_dims[i];
            continue;
        }
        if (st == RL_OK) st = rows_of(&x2, io->in[i], false, l->name);
        if (st == RL_OK) st = rl_tensor_narrow(&Wi, &W->value, 0, off, l->in_dims[i]);
        if (st == RL_OK) st = rl_op_gemm(&dWi, &x2, &dz2, true, false, 1.0, 1.0);
        if (st == RL_OK && grad_in[i]) st = rows_of(&dx2, grad_in[i], true, l->name);
        if (st == RL_OK && grad_in[i]) st = rl_op_gemm(&dx2, &dz2, &Wi, false, true, 1.0, 0.0);
        rl_tensor_release(&dx2);
        rl_tensor_release(&dWi);
        rl_tensor_release(&Wi);
        rl_tensor_release(&x2);
        off += l->in_dims[i];
    }
    rl_tensor_release(&dz2);
    return st;
}

/* (T, B, F) as rows of F with unit stride, T*B rows ld apart */
static bool plain_rows(const rl_tensor *t, int64_t *ld) {
    *ld = t->stride[1];
    return t->ndim == 3 && t->stride[2] == 1 && t->stride[0] == t->shape[1] * t->stride[1];
}

bool rl_affine_bf16_ok(const rl_layer *l, const rl_layer_io *io, const rl_param *W,
                       rl_tensor *const *grad_in) {
    int64_t ld;
    rl_bf16_ctx *ctx = rl_bf16_active();
    if (!ctx || rl_bf16_ctx_is_int8(ctx) || !W->value.storage || !W->grad.storage ||
        W->value.dtype != RL_FLOAT32 || rl_tensor_device(&W->value).type != RL_CPU ||
        W->value.stride[1] != 1 || W->grad.stride[1] != 1)
        return false;
    /* anything else (a gradient buffer of another shape, say) takes rl_affine_backward, whose
     * products report it */
    for (int i = 0; i < io->n_in; i++) {
        const rl_tensor *x = io->in[i], *g = grad_in[i];
        if (rl_layer_input_sparse(l, x) || !plain_rows(x, &ld) || x->dtype != RL_FLOAT32 ||
            rl_tensor_device(x).type != RL_CPU || x->shape[2] != l->in_dims[i] ||
            x->shape[0] != io->in[0]->shape[0] || x->shape[1] != io->in[0]->shape[1])
            return false;
        if (g && (!plain_rows(g, &ld) || g->dtype != RL_FLOAT32 ||
                  rl_tensor_device(g).type != RL_CPU || g->shape[0] != x->shape[0] ||
                  g->shape[1] != x->shape[1] || g->shape[2] != x->shape[2]))
            return false;
    }
    return true;
}

rl_status rl_affine_backward_bf16(const rl_layer *l, const rl_layer_io *io, rl_param *W,
                                  const uint16_t *dz, int64_t rows, rl_tensor *const *grad_in) {
    int64_t n = l->n_out, ld16 = rl_bf16_lhs_stride(n), off = 0;
    int64_t ldw = W->value.stride[0], ldg = W->grad.stride[0];
    for (int i = 0; i < io->n_in; i++) {
        int64_t F = l->in_dims[i], ldx, ldd;
        plain_rows(io->in[i], &ldx);
        const float *x = rl_tensor_data(io->in[i]),
                    *Wi = (const float *)rl_tensor_data(&W->value) + off * ldw;
        float *dWi = (float *)rl_tensor_data(&W->grad) + off * ldg;
        RL_TRY(rl_gemm_bf16_rhs(true, F, n, rows, 1.0f, x, ldx, dz, ld16, 1.0f, dWi, ldg));
        if (grad_in[i]) {
            plain_rows(grad_in[i], &ldd);
            RL_TRY(rl_gemm_bf16_ctx_lhs(rl_bf16_active(), rows, F, n, 1.0f, dz, true, Wi, ldw, 0.0f,
                                        rl_tensor_data(grad_in[i]), ldd));
        }
        off += F;
    }
    return RL_OK;
}

rl_status rl_affine_params(rl_layer *l, bool with_bias, int *iW, int *ib) {
    int64_t fan_in = 0;
    for (int i = 0; i < l->n_in; i++)
        fan_in += l->in_dims[i];
    int64_t wshape[2] = {fan_in, l->n_out};
    RL_TRY(rl_layer_add_param(l, "W", 2, wshape, RL_INIT_GLOROT, 1.0, fan_in, l->n_out, iW));
    *ib = -1;
    if (with_bias) RL_TRY(rl_layer_add_param(l, "b", 1, &l->n_out, RL_INIT_ZEROS, 0.0, 0, 0, ib));
    return RL_OK;
}

typedef struct {
    rl_layer base;
    rl_activation act;
    int iW, ib;
    rl_tensor z;  /* (T, B, n_out) pre-activation, when f' needs it */
    rl_tensor dz; /* (T, B, n_out) */
    rl_tensor db; /* (n_out) */
} linear_layer;

static rl_status linear_forward(rl_layer *l, rl_layer_io *io) {
    linear_layer *L = (linear_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_layer_compute_type(l, io, &dt, &dev));
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, shape));
    rl_tensor *z = &l->out;
    if (rl_activation_needs_input(L->act)) {
        RL_TRY(rl_buffer_ensure(&L->z, dt, dev, 3, shape));
        z = &L->z;
    }
    RL_TRY(rl_affine_forward(l, io, &l->params[L->iW], L->ib >= 0 ? &l->params[L->ib] : NULL, z));
    return rl_activation_forward(L->act, &l->out, z);
}

static rl_status linear_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                 rl_tensor *const *grad_in) {
    linear_layer *L = (linear_layer *)l;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "linear");
    const rl_tensor *dz = grad_out;
    if (L->act != RL_ACT_IDENTITY) {
        RL_TRY(
            rl_buffer_ensure(&L->dz, grad_out->dtype, rl_tensor_device(grad_out), 3, l->out.shape));
        RL_TRY(rl_activation_backward(L->act, &L->dz, grad_out, &L->z, &l->out));
        dz = &L->dz;
    }
    return rl_affine_backward(l, io, &l->params[L->iW], L->ib >= 0 ? &l->params[L->ib] : NULL, dz,
                              &L->db, grad_in);
}

static void linear_destroy(rl_layer *l) {
    linear_layer *L = (linear_layer *)l;
    rl_tensor_release(&L->z);
    rl_tensor_release(&L->dz);
    rl_tensor_release(&L->db);
}

static const rl_layer_ops linear_ops = {.class_name = "linear",
                                        .forward = linear_forward,
                                        .backward = linear_backward,
                                        .destroy = linear_destroy};

rl_status rl_linear_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "linear");
    int64_t n_out;
    const char *s;
    bool with_bias;
    rl_activation act = RL_ACT_IDENTITY;
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &n_out));
    RL_TRY(rl_opt_string(opts, name, "activation", "identity", &s));
    RL_TRY(rl_activation_parse(s, name, &act));
    RL_TRY(rl_opt_bool(opts, name, "with_bias", true, &with_bias));
    RL_TRY(rl_layer_alloc(out, sizeof(linear_layer), &linear_ops, name, n_in, in_dims));
    linear_layer *L = (linear_layer *)*out;
    L->act = act;
    (*out)->n_out = n_out;
    rl_status st = rl_affine_params(*out, with_bias, &L->iW, &L->ib);
    if (st != RL_OK) {
        rl_layer_free(*out);
        *out = NULL;
    }
    return st;
}
