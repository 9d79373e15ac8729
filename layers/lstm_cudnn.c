/* The lstm layer's cuDNN path (API: layers/lstm_cudnn.h). */
#include "lstm_cudnn.h"

#include "../kernels/ops.h"
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/context.h"
#include "../kernels/cuda/lstm_cuda.h"

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

static int64_t in_features(const rl_layer *l) {
    int64_t F = 0;
    for (int k = 0; k < l->n_in; k++)
        F += l->in_dims[k];
    return F;
}

/* The cuDNN object for (dt, dev) on the layer's stream, made on first use or after a move. */
static rl_status ensure_rnn(rl_lstm_cudnn *c, const rl_recurrent *r, const rl_layer *l,
                            int direction, rl_dtype dt, rl_device dev) {
    if (c->rnn && c->dt == dt && c->dev == dev.index) return RL_OK;
    rl_lstm_cudnn_drop(c);
    rl_cudnn_lstm *rnn = NULL;
    RL_TRY(rl_cudnn_lstm_create(&rnn, dev.index, dt, in_features(l), l->n_out, direction));
    rl_status st = rl_cudnn_lstm_set_stream(rnn, r->stream);
    if (st != RL_OK) {
        rl_cudnn_lstm_free(rnn);
        return st;
    }
    c->rnn = rnn;
    c->dt = dt;
    c->dev = dev.index;
    return RL_OK;
}

/* The inputs side by side in xcat unless they are one contiguous input; *x: what cuDNN reads. */
static rl_status gather_inputs(rl_lstm_cudnn *c, const rl_recurrent *r, const rl_layer *l,
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

rl_status rl_lstm_cudnn_forward(rl_lstm_cudnn *c, const rl_recurrent *r, rl_layer *l, int direction,
                                const rl_layer_io *io, rl_dtype dt, rl_device dev, rl_mat W,
                                rl_mat U, rl_mat bias, const rl_tensor *h0, const rl_tensor *c0,
                                rl_tensor *hs, rl_tensor *cs) {
    int64_t T = r->T, B = r->B, H = l->n_out;
    bool have_h0 = h0 && h0->storage, have_c0 = c0 && c0->storage;
    RL_TRY(ensure_rnn(c, r, l, direction, dt, dev));
    const void *x;
    RL_TRY(gather_inputs(c, r, l, io, dt, dev, &x));
    int64_t ss[3] = {2, B, H};
    RL_TRY(rl_buffer_ensure_synced(hs, dt, dev, 3, ss));
    RL_TRY(rl_buffer_ensure_synced(cs, dt, dev, 3, ss));
    rl_tensor hrow = {0}, crow = {0};
    RL_TRY(rl_tensor_select(&hrow, hs, 0, 0));
    rl_status st = rl_tensor_select(&crow, cs, 0, 0);
    if (st == RL_OK && have_h0) st = rl_recurrent_write_state(r, &hrow, h0);
    if (st == RL_OK && have_c0) st = rl_recurrent_write_state(r, &crow, c0);
    rl_tensor_release(&hrow);
    rl_tensor_release(&crow);
    RL_TRY(st);
    RL_TRY(rl_cudnn_lstm_pack_weights(c->rnn, W.p, U.p, bias.p));
    return rl_cudnn_lstm_forward(c->rnn, io->train, T, B, rl_tensor_data(io->lengths),
                                 rl_tensor_data(&r->len_dev), x, rl_tensor_data(&l->out),
                                 have_h0 ? rl_tensor_data(hs) : NULL,
                                 have_c0 ? rl_tensor_data(cs) : NULL, at(hs, B * H), at(cs, B * H));
}

rl_status rl_lstm_cudnn_backward(rl_lstm_cudnn *c, rl_recurrent *r, rl_layer *l,
                                 const rl_layer_io *io, rl_tensor *const *grad_in, rl_dtype dt,
                                 rl_device dev, rl_mat dout, rl_mat dW, rl_mat dU, rl_mat db,
                                 rl_tensor *dh, rl_tensor *dc) {
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
    RL_TRY(rl_buffer_ensure_synced(dc, dt, dev, 2, bh));
    RL_TRY(rl_cudnn_lstm_backward(c->rnn, dy, dx, rl_tensor_data(dh), rl_tensor_data(dc)));
    RL_TRY(rl_cudnn_lstm_unpack_grads(c->rnn, dW.p, dU.p, db.p));
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

void rl_lstm_cudnn_drop(rl_lstm_cudnn *c) {
    /* rl_cudnn_lstm_free waits for the object's stream, which must still exist */
    rl_cudnn_lstm_free(c->rnn);
    c->rnn = NULL;
}
#else
void rl_lstm_cudnn_drop(rl_lstm_cudnn *c) { (void)c; }
#endif

void rl_lstm_cudnn_free(rl_lstm_cudnn *c) {
    rl_lstm_cudnn_drop(c);
    rl_tensor_release(&c->xcat);
    rl_tensor_release(&c->dxcat);
}
