/* window: stacks context frames. With x = concat(in_1, ..., in_n) (T, B, F), F = sum F_i,
 * L frames of left and R of right context, W = L + 1 + R:
 *   out[t, b, k*F : (k+1)*F] = x[t - L + k, b, :]   for k = 0 .. W-1 (oldest frame first)
 * where a source frame outside 0 .. lengths[b]-1 of ITS OWN sequence gives zeros (padding of
 * a shorter sequence never leaks into its context), and out is 0 on padded frames
 * t >= lengths[b]. n_out = W * F.
 * Options: window (odd, L = R = (window-1)/2), or left and/or right (default 0 each).
 * backward is the transpose: grad_x[s] = sum_k grad_out[s + L - k, slot k] over valid output
 * frames, 0 on padded input frames.
 * Buffers: out (T, B, n_out); g (T, B, n_out) in backward: grad_out with its padded frames
 * zeroed. Backward keeps nothing from forward. */
#include <inttypes.h>

#include "layer.h"
#include "layers.h"
#include "loss.h"

#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    int64_t left, right, F;
    rl_tensor g; /* (T, B, n_out) */
} window_layer;

/* v (unset) <- t[t0 : t0 + n, :, f0 : f0 + nf] */
static rl_status block(rl_tensor *v, const rl_tensor *t, int64_t t0, int64_t n, int64_t f0,
                       int64_t nf) {
    rl_tensor rows = {0};
    RL_TRY(rl_tensor_narrow(&rows, t, 0, t0, n));
    rl_status st = rl_tensor_narrow(v, &rows, 2, f0, nf);
    rl_tensor_release(&rows);
    return st;
}

/* For slot k, the output frames t0 .. t0+n-1 whose source t - L + k lies in 0 .. T-1. */
static int64_t slot_range(const window_layer *w, int64_t T, int64_t k, int64_t *t0) {
    int64_t d = k - w->left; /* source = t + d */
    *t0 = d < 0 ? -d : 0;
    int64_t t1 = d > 0 ? T - d : T;
    return t1 > *t0 ? t1 - *t0 : 0;
}

static rl_status window_forward(rl_layer *l, rl_layer_io *io) {
    window_layer *w = (window_layer *)l;
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    int64_t shape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure(&l->out, io->in[0]->dtype, rl_tensor_device(io->in[0]), 3, shape));
    RL_TRY(rl_op_fill(&l->out, 0.0));
    int64_t W = w->left + 1 + w->right;
    for (int64_t k = 0; k < W; k++) {
        int64_t t0, n = slot_range(w, T, k, &t0), off = k * w->F;
        if (n == 0) continue;
        for (int i = 0; i < io->n_in; i++) {
            rl_tensor dst = {0}, src = {0};
            rl_status st = block(&dst, &l->out, t0, n, off, l->in_dims[i]);
            if (st == RL_OK) st = block(&src, io->in[i], t0 + k - w->left, n, 0, l->in_dims[i]);
            if (st == RL_OK) st = rl_op_copy(&dst, &src);
            rl_tensor_release(&src);
            rl_tensor_release(&dst);
            RL_TRY(st);
            off += l->in_dims[i];
        }
    }
    /* Right context that reaches past a sequence's end: slot k (d = k - L > 0) of the valid
     * frames len-d .. len-1 read padding. */
    for (int64_t b = 0; b < B; b++) {
        int64_t len = (int64_t)rl_tensor_get(io->lengths, &b);
        for (int64_t k = w->left + 1; k < W; k++) {
            int64_t d = k - w->left, t0 = len - d > 0 ? len - d : 0;
            rl_tensor blk = {0}, seq = {0};
            rl_status st = block(&blk, &l->out, t0, len - t0, k * w->F, w->F);
            if (st == RL_OK) st = rl_tensor_narrow(&seq, &blk, 1, b, 1);
            if (st == RL_OK) st = rl_op_fill(&seq, 0.0);
            rl_tensor_release(&seq);
            rl_tensor_release(&blk);
            RL_TRY(st);
        }
    }
    return rl_fill_padding(&l->out, io->lengths, 0.0);
}

static rl_status window_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                 rl_tensor *const *grad_in) {
    window_layer *w = (window_layer *)l;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "window");
    int64_t T = grad_out->shape[0], W = w->left + 1 + w->right;
    RL_TRY(
        rl_buffer_ensure(&w->g, grad_out->dtype, rl_tensor_device(grad_out), 3, grad_out->shape));
    RL_TRY(rl_op_copy(&w->g, grad_out));
    RL_TRY(rl_fill_padding(&w->g, io->lengths, 0.0));
    for (int i = 0; i < io->n_in; i++)
        if (grad_in[i]) RL_TRY(rl_op_fill(grad_in[i], 0.0));
    for (int64_t k = 0; k < W; k++) {
        int64_t t0, n = slot_range(w, T, k, &t0), off = k * w->F;
        if (n == 0) continue;
        for (int i = 0; i < io->n_in; i++) {
            if (grad_in[i]) {
                rl_tensor dst = {0}, src = {0};
                rl_status st = block(&dst, grad_in[i], t0 + k - w->left, n, 0, l->in_dims[i]);
                if (st == RL_OK) st = block(&src, &w->g, t0, n, off, l->in_dims[i]);
                if (st == RL_OK) st = rl_op_binary(&dst, &dst, &src, RL_BIN_ADD);
                rl_tensor_release(&src);
                rl_tensor_release(&dst);
                RL_TRY(st);
            }
            off += l->in_dims[i];
        }
    }
    for (int i = 0; i < io->n_in; i++)
        if (grad_in[i]) RL_TRY(rl_fill_padding(grad_in[i], io->lengths, 0.0));
    return RL_OK;
}

static void window_destroy(rl_layer *l) { rl_tensor_release(&((window_layer *)l)->g); }

static const rl_layer_ops window_ops = {.class_name = "window",
                                        .forward = window_forward,
                                        .backward = window_backward,
                                        .destroy = window_destroy};

/* An optional integer option >= min with no default: *found tells whether it was given. */
static rl_status opt_count(const rl_options *o, const char *layer, const char *key, int64_t min,
                           int64_t *v, bool *found) {
    double d = 0;
    int f = 0;
    RL_TRY(o->number(o->ctx, key, &d, &f));
    *found = f != 0;
    return f ? rl_opt_int(o, layer, key, min, min, true, v) : RL_OK;
}

rl_status rl_window_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "window");
    int64_t size = 0, left = 0, right = 0;
    bool has_size, has_left, has_right;
    RL_TRY(opt_count(opts, name, "window", 1, &size, &has_size));
    RL_TRY(opt_count(opts, name, "left", 0, &left, &has_left));
    RL_TRY(opt_count(opts, name, "right", 0, &right, &has_right));
    if (has_size && (has_left || has_right))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": give either window or left/right, not both",
                        name, "window");
    if (!has_size && !has_left && !has_right)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": missing option window (or left/right)", name,
                        "window");
    if (has_size) {
        if (size % 2 == 0)
            return rl_error(RL_EARG, RL_LAYER_WHERE ": option window = %" PRId64 " must be odd",
                            name, "window", size);
        left = right = (size - 1) / 2;
    }
    RL_TRY(rl_layer_alloc(out, sizeof(window_layer), &window_ops, name, n_in, in_dims));
    window_layer *w = (window_layer *)*out;
    w->left = left;
    w->right = right;
    for (int i = 0; i < n_in; i++)
        w->F += in_dims[i];
    (*out)->n_out = (left + 1 + right) * w->F;
    return RL_OK;
}
