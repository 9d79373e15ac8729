/* The cuDNN path of the lstm and gru layers (API: layers/rnn_cudnn.h). */
#include "rnn_cudnn.h"

#include <stdint.h>
#include <string.h>

#include "../kernels/ops.h"

static int64_t in_features(const rl_layer *l) {
    int64_t F = 0;
    for (int k = 0; k < l->n_in; k++)
        F += l->in_dims[k];
    return F;
}

rl_status rl_rnn_cudnn_option(const rl_options *opts, const char *name, const char *cls,
                              bool *cudnn) {
    const char *impl = NULL;
    RL_TRY(rl_opt_string(opts, name, "impl", "own", &impl));
    *cudnn = impl && strcmp(impl, "cudnn") == 0;
    if (!impl || (!*cudnn && strcmp(impl, "own") != 0))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": impl = \"%s\", expected \"own\" or \"cudnn\"",
                        name, cls, impl ? impl : "(null)");
    return RL_OK;
}

bool rl_rnn_cudnn_serves(const rl_recurrent *r, const rl_layer *l) {
    return r->T <= INT32_MAX && r->B <= INT32_MAX && in_features(l) <= INT32_MAX &&
           l->n_out <= INT32_MAX;
}

#ifdef RL_WITH_CUDA
#include "../kernels/cuda/context.h"
#include "../kernels/cuda/cudnn_rnn.h"

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

/* The cuDNN object for (dt, dev) on the layer's stream, made on first use or after a move. */
static rl_status ensure_rnn(rl_rnn_cudnn *c, const rl_recurrent *r, const rl_layer *l,
                            rl_cudnn_cell cell, int direction, rl_dtype dt, rl_device dev) {
    if (c->rnn && c->dt == dt && c->dev == dev.index) return RL_OK;
    rl_rnn_cudnn_drop(c);
    rl_cudnn_rnn *rnn = NULL;
    RL_TRY(rl_cudnn_rnn_create(&rnn, cell, dev.index, dt, in_features(l), l->n_out, direction));
    rl_status st = rl_cudnn_rnn_set_stream(rnn, r->stream);
    if (st != RL_OK) {
        rl_cudnn_rnn_free(rnn);
        return st;
    }
    c->rnn = rnn;
    c->dt = dt;
    c->dev = dev.index;
    return RL_OK;
}

/* The inputs side by side in xcat unless they are one contiguous input; *x: what cuDNN reads. */
static rl_status gather_inputs(rl_rnn_cudnn *c, const rl_recurrent *r, const rl_layer *l,
                               const rl_layer_io *io, rl_dtype dt, rl_device dev, const void **x) {
    int64_t T = r->T, B = r->B, F = in_features(l);
    size_t es = rl_dtype_size(dt);
    rl_mat X;
    if (io->n_in == 1 && rl_mat_fold_tb(io->in[0], &X) && X.ld == F) {
        *x = X.p;
        return RL_OK;
    }
    int64_t xs[3] = {T, B, F};
    RL_TRY(rl_buffer_ensure_synced(&c->xcat, dt, dev, 3, xs));
    int64_t off = 0;
    for (int k = 0; k < io->n_in; off += l->in_dims[k++]) {
        int64_t Fk = l->in_dims[k];
        if (rl_mat_fold_tb(io->in[k], &X)) {
            RL_TRY(rl_cuda_copy_rows(r->stream, at(&c->xcat, off), (size_t)F * es, X.p,
                                     (size_t)X.ld * es, (size_t)Fk * es, T * B));
        } else {
            rl_tensor v = {0};
            RL_TRY(rl_tensor_narrow(&v, &c->xcat, 2, off, Fk));
            rl_status st = rl_op_copy(&v, io->in[k]);
            rl_tensor_release(&v);
            RL_TRY(st);
        }
    }
    *x = rl_tensor_data(&c->xcat);
    return RL_OK;
}

rl_status rl_rnn_cudnn_forward(rl_rnn_cudnn *c, const rl_recurrent *r, rl_layer *l,
                               rl_cudnn_cell cell, int direction, const rl_layer_io *io,
                               rl_dtype dt, rl_device dev, const rl_mat p[4], const rl_tensor *h0,
                               const rl_tensor *c0, rl_tensor *hs, rl_tensor *cs) {
    int64_t T = r->T, B = r->B, H = l->n_out;
    bool have_h0 = h0 && h0->storage, have_c0 = c0 && c0->storage;
    RL_TRY(ensure_rnn(c, r, l, cell, direction, dt, dev));
    const void *x;
    RL_TRY(gather_inputs(c, r, l, io, dt, dev, &x));
    int64_t ss[3] = {2, B, H};
    RL_TRY(rl_buffer_ensure_synced(hs, dt, dev, 3, ss));
    if (cs) RL_TRY(rl_buffer_ensure_synced(cs, dt, dev, 3, ss));
    rl_tensor row = {0};
    if (have_h0) {
        RL_TRY(rl_tensor_select(&row, hs, 0, 0));
        rl_status st = rl_recurrent_write_state(r, &row, h0);
        rl_tensor_release(&row);
        RL_TRY(st);
    }
    if (cs && have_c0) {
        RL_TRY(rl_tensor_select(&row, cs, 0, 0));
        rl_status st = rl_recurrent_write_state(r, &row, c0);
        rl_tensor_release(&row);
        RL_TRY(st);
    }
    RL_TRY(rl_cudnn_rnn_pack_weights(c->rnn, p[0].p, p[1].p, p[2].p, p[3].p));
    return rl_cudnn_rnn_forward(
        c->rnn, io->train, T, B, rl_tensor_data(io->lengths), rl_tensor_data(&r->len_dev), x,
        rl_tensor_data(&l->out), have_h0 ? rl_tensor_data(hs) : NULL,
        cs && have_c0 ? rl_tensor_data(cs) : NULL, at(hs, B * H), cs ? at(cs, B * H) : NULL);
}

rl_status rl_rnn_cudnn_backward(rl_rnn_cudnn *c, rl_recurrent *r, rl_layer *l,
                                const rl_layer_io *io, rl_tensor *const *grad_in, rl_dtype dt,
                                rl_device dev, rl_mat dout, const rl_mat g[4], rl_tensor *dh,
                                rl_tensor *dc) {
    int64_t T = r->T, B = r->B, H = l->n_out, F = in_features(l);
    size_t es = rl_dtype_size(dt);
    /* dy: contiguous (T, B, H) */
    const void *dy = dout.p;
    if (!dout.p || dout.ld != H) {
        int64_t os[3] = {T, B, H};
        RL_TRY(rl_buffer_ensure_synced(&r->gout, dt, dev, 3, os));
        if (dout.p)
            RL_TRY(rl_cuda_copy_rows(r->stream, rl_tensor_data(&r->gout), (size_t)H * es, dout.p,
                                     (size_t)dout.ld * es, (size_t)H * es, T * B));
        else
            RL_TRY(rl_cuda_zero(r->stream, rl_tensor_data(&r->gout), (size_t)(T * B * H) * es));
        dy = rl_tensor_data(&r->gout);
    }
    /* dx: into grad_in directly when it is one contiguous input, else through dxcat */
    bool any = false;
    for (int k = 0; k < io->n_in && grad_in; k++)
        any = any || grad_in[k];
    rl_mat G;
    void *dx = NULL;
    bool split = false;
    if (any && io->n_in == 1 && rl_mat_fold_tb(grad_in[0], &G) && G.ld == F) {
        dx = G.p;
    } else if (any) {
        int64_t xs[3] = {T, B, F};
        RL_TRY(rl_buffer_ensure_synced(&c->dxcat, dt, dev, 3, xs));
        dx = rl_tensor_data(&c->dxcat);
        split = true;
    }
    int64_t bh[2] = {B, H};
    RL_TRY(rl_buffer_ensure_synced(dh, dt, dev, 2, bh));
    if (dc) RL_TRY(rl_buffer_ensure_synced(dc, dt, dev, 2, bh));
    RL_TRY(
        rl_cudnn_rnn_backward(c->rnn, dy, dx, rl_tensor_data(dh), dc ? rl_tensor_data(dc) : NULL));
    RL_TRY(rl_cudnn_rnn_unpack_grads(c->rnn, g[0].p, g[1].p, g[2].p, g[3].p));
    int64_t off = 0;
    for (int k = 0; k < io->n_in && split; off += l->in_dims[k++]) {
        int64_t Fk = l->in_dims[k];
        rl_tensor *gi = grad_in[k];
        if (!gi) continue;
        if (rl_mat_fold_tb(gi, &G)) {
            RL_TRY(rl_cuda_copy_rows(r->stream, G.p, (size_t)G.ld * es, at(&c->dxcat, off),
                                     (size_t)F * es, (size_t)Fk * es, T * B));
        } else {
            rl_tensor v = {0};
            RL_TRY(rl_tensor_narrow(&v, &c->dxcat, 2, off, Fk));
            rl_status st = rl_op_copy(gi, &v);
            rl_tensor_release(&v);
            RL_TRY(st);
        }
    }
    return RL_OK;
}

void rl_rnn_cudnn_drop(rl_rnn_cudnn *c) {
    /* rl_cudnn_rnn_free waits for the object's stream, which must still exist */
    rl_cudnn_rnn_free(c->rnn);
    c->rnn = NULL;
}
#else
/* A build without CUDA has no CUDA tensors, so the driver never takes the cuDNN path there; these
 * answer a call that would. */
static rl_status no_cuda(const rl_layer *l) {
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": impl = \"cudnn\" needs a build with CUDA",
                    l->name, l->ops->class_name);
}

rl_status rl_rnn_cudnn_forward(rl_rnn_cudnn *c, const rl_recurrent *r, rl_layer *l,
                               rl_cudnn_cell cell, int direction, const rl_layer_io *io,
                               rl_dtype dt, rl_device dev, const rl_mat p[4], const rl_tensor *h0,
                               const rl_tensor *c0, rl_tensor *hs, rl_tensor *cs) {
    (void)c, (void)r, (void)cell, (void)direction, (void)io, (void)dt, (void)dev, (void)p;
    (void)h0, (void)c0, (void)hs, (void)cs;
    return no_cuda(l);
}

rl_status rl_rnn_cudnn_backward(rl_rnn_cudnn *c, rl_recurrent *r, rl_layer *l,
                                const rl_layer_io *io, rl_tensor *const *grad_in, rl_dtype dt,
                                rl_device dev, rl_mat dout, const rl_mat g[4], rl_tensor *dh,
                                rl_tensor *dc) {
    (void)c, (void)r, (void)io, (void)grad_in, (void)dt, (void)dev, (void)dout, (void)g;
    (void)dh, (void)dc;
    return no_cuda(l);
}

void rl_rnn_cudnn_drop(rl_rnn_cudnn *c) { (void)c; }
#endif

void rl_rnn_cudnn_free(rl_rnn_cudnn *c) {
    rl_rnn_cudnn_drop(c);
    rl_tensor_release(&c->xcat);
    rl_tensor_release(&c->dxcat);
}
