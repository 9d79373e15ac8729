/* softmax: out = p = softmax(z) over the features, z = concat(in_1, ..., in_n) W + b (the affine
 * map, weight layout and init of linear.c: W (sum F_i, n_out) glorot, b (n_out) zeros unless
 * with_bias = false).
 *   forward:  z -= max_f z (stable);  p = exp(z) / sum_f exp(z)
 *   loss "ce" with io->target (T, B) int32: logp = z - log sum_f exp(z);
 *             io->loss = -sum_{t < len[b]} logp[t, b, target]  (summed, not averaged),
 *             io->n_errors = valid frames with argmax p != target, io->n_frames = sum len
 *   backward: dz = p * (grad_out - sum_f grad_out * p)     (the softmax Jacobian; when grad_out)
 *             dz += p - onehot(target) on valid frames, 0 on padded ones
 *                                                      (a "ce" layer whose forward had a target)
 *             then dW, db, grad_in as in linear.
 * With grad_out == NULL a "ce" layer starts from its own loss; given grad_out (the output also
 * feeds other layers) both terms are summed, the gradient of loss + <grad_out, out>.
 * loss = "mse" (or no loss) makes a plain softmax output: the network applies rl_loss_mse to
 * out and hands its gradient in as grad_out.
 * Buffers: out = p (T, B, n_out); z (T, B, n_out) logits, then logp; rs (T, B, 1) row
 * max/sum; dz (T, B, n_out) and db (n_out) in backward; the CE state (loss.h: onehot, ...).
 * Backward keeps out and the CE onehot from forward and reads the inputs again. */
#include <string.h>

#include "layer.h"
#include "layers.h"
#include "loss.h"

#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    int iW, ib;
    bool ce_ready; /* the last forward computed the CE loss (there was a target) */
    rl_tensor z;   /* (T, B, n_out) */
    rl_tensor rs;  /* (T, B, 1) */
    rl_tensor dz;  /* (T, B, n_out) */
    rl_tensor db;  /* (n_out) */
    rl_ce_work ce;
} softmax_layer;

static rl_status softmax_forward(rl_layer *l, rl_layer_io *io) {
    softmax_layer *S = (softmax_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out}, rshape[3] = {T, B, 1};
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_layer_compute_type(l, io, &dt, &dev));
    S->ce_ready = false;
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, shape));
    RL_TRY(rl_buffer_ensure(&S->z, dt, dev, 3, shape));
    RL_TRY(rl_buffer_ensure(&S->rs, dt, dev, 3, rshape));
    RL_TRY(
        rl_affine_forward(l, io, &l->params[S->iW], S->ib >= 0 ? &l->params[S->ib] : NULL, &S->z));
    RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &S->z, 2, true, RL_RED_MAX));
    RL_TRY(rl_op_binary(&S->z, &S->z, &S->rs, RL_BIN_SUB));
    RL_TRY(rl_op_unary(&l->out, &S->z, RL_UN_EXP, 0, 0));
    RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &l->out, 2, true, RL_RED_SUM));
    RL_TRY(rl_op_binary(&l->out, &l->out, &S->rs, RL_BIN_DIV));
    if (!l->is_loss || !io->target) return RL_OK;
    RL_TRY(rl_op_unary(&S->rs, &S->rs, RL_UN_LOG, 0, 0));
    RL_TRY(rl_op_binary(&S->z, &S->z, &S->rs, RL_BIN_SUB));
    RL_TRY(rl_loss_ce(&S->ce, l->name, &S->z, io->target, io->lengths, &io->loss, &io->n_errors,
                      &io->n_frames));
    S->ce_ready = true;
    return RL_OK;
}

static rl_status softmax_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                  rl_tensor *const *grad_in) {
    softmax_layer *S = (softmax_layer *)l;
    if (!grad_out && !l->is_loss)
        return rl_error(RL_EARG, "layer '%s' (softmax without a loss): backward needs grad_out",
                        l->name);
    if (!grad_out && !S->ce_ready)
        return rl_error(RL_EARG,
                        "layer '%s': backward from the ce loss needs a forward with a target",
                        l->name);
    const rl_tensor *p = &l->out;
    RL_TRY(rl_buffer_ensure(&S->dz, p->dtype, rl_tensor_device(p), 3, p->shape));
    if (grad_out) {
        RL_TRY(rl_op_binary(&S->dz, grad_out, p, RL_BIN_MUL));
        RL_TRY(rl_op_reduce_dim(&S->rs, NULL, &S->dz, 2, true, RL_RED_SUM));
        RL_TRY(rl_op_binary(&S->dz, grad_out, &S->rs, RL_BIN_SUB));
        RL_TRY(rl_op_binary(&S->dz, &S->dz, p, RL_BIN_MUL));
    }
    if (S->ce_ready) RL_TRY(rl_loss_ce_grad(&S->ce, p, io->lengths, &S->dz, grad_out != NULL));
    return rl_affine_backward(l, io, &l->params[S->iW], S->ib >= 0 ? &l->params[S->ib] : NULL,
                              &S->dz, &S->db, grad_in);
}

static void softmax_destroy(rl_layer *l) {
    softmax_layer *S = (softmax_layer *)l;
    rl_tensor_release(&S->z);
    rl_tensor_release(&S->rs);
    rl_tensor_release(&S->dz);
    rl_tensor_release(&S->db);
    rl_ce_work_release(&S->ce);
}

static const rl_layer_ops softmax_ops = {.class_name = "softmax",
                                         .forward = softmax_forward,
                                         .backward = softmax_backward,
                                         .destroy = softmax_destroy};

rl_status rl_softmax_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                            const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1) return rl_error(RL_EARG, "layer '%s' (softmax): needs at least one input", name);
    int64_t n_out;
    bool with_bias;
    const char *loss;
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &n_out));
    RL_TRY(rl_opt_bool(opts, name, "with_bias", true, &with_bias));
    RL_TRY(rl_opt_string(opts, name, "loss", NULL, &loss));
    if (loss && strcmp(loss, "ce") != 0 && strcmp(loss, "mse") != 0)
        return rl_error(RL_EARG, "layer '%s': unknown loss '%s' (ce or mse)", name, loss);
    RL_TRY(rl_layer_alloc(out, sizeof(softmax_layer), &softmax_ops, name, n_in, in_dims));
    softmax_layer *S = (softmax_layer *)*out;
    (*out)->n_out = n_out;
    (*out)->is_loss = loss && strcmp(loss, "ce") == 0;
    rl_status st = rl_affine_params(*out, with_bias, &S->iW, &S->ib);
    if (st != RL_OK) {
        rl_layer_free(*out);
        *out = NULL;
    }
    return st;
}
