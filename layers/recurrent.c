/* The recurrent layers' shared plumbing (API: layers/recurrent.h). */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "recurrent.h"

#include "../core/blas.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_small.h"
#include "../kernels/cpu/parallel.h"
#include "../kernels/ops.h"
#include "../kernels/pointwise.h"
#include "rnn_cudnn.h"

/* ---------------------------------------------------------------- the device's part
 *
 * Everything of the driver that names CUDA: the layer's stream, its events, the lengths on the
 * device and the few device copies. A build without CUDA has no CUDA tensors: there these do
 * nothing (use_device refuses a CUDA device). */
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/context.h"
#include "../kernels/cuda/gru_cuda.h"

static rl_status stream_drop(rl_recurrent *r) {
    if (!r->stream) return RL_OK;
    /* what is bound to the stream goes first, then the stream, whose queued work may still use
     * the buffers about to be released or regrown */
    if (r->on_stream_drop) r->on_stream_drop(r);
    rl_status st = rl_cuda_stream_sync(r->stream);
    rl_cuda_stream_destroy(r->stream);
    r->stream = NULL;
    return st;
}

static rl_status stream_for(rl_recurrent *r, rl_device dev, bool *ok) {
    *ok = dev.type == RL_CUDA;
    if (r->stream && (dev.type != RL_CUDA || r->stream_dev != dev.index)) RL_TRY(stream_drop(r));
    if (*ok && !r->stream) {
        RL_TRY(rl_cuda_stream_create(dev.index, &r->stream));
        r->stream_dev = dev.index;
    }
    return RL_OK;
}

static rl_status stream_wait(rl_recurrent *r, const rl_tensor *const *ts, int n) {
    return r->stream ? rl_cuda_stream_wait_for(r->stream, ts, n) : RL_OK;
}

static rl_status stream_wrote(rl_recurrent *r, const rl_tensor *const *ts, int n) {
    return r->stream ? rl_cuda_stream_wrote(r->stream, ts, n) : RL_OK;
}

static rl_status lengths_to_device(rl_recurrent *r, rl_device dev, const rl_tensor *len) {
    if (dev.type != RL_CUDA) return RL_OK;
    RL_TRY(rl_buffer_ensure_synced(&r->len_dev, RL_INT32, dev, 1, &r->B));
    return rl_cuda_set_lengths(r->stream, rl_tensor_data(&r->len_dev), rl_tensor_data(len), r->B);
}

/* dst <- src (zeros when NULL) on the stream when the layouts allow a plain copy; *done. */
static rl_status stream_write_state(const rl_recurrent *r, rl_tensor *dst, const rl_tensor *src,
                                    bool *done) {
    *done = false;
    if (rl_tensor_device(dst).type != RL_CUDA) return RL_OK;
    size_t bytes = (size_t)rl_tensor_numel(dst) * rl_dtype_size(dst->dtype);
    *done = !src || (src->dtype == dst->dtype && rl_tensor_is_contiguous(src));
    if (!src) return rl_cuda_zero(r->stream, rl_tensor_data(dst), bytes);
    if (!*done) return RL_OK;
    return rl_cuda_copy_rows(r->stream, rl_tensor_data(dst), bytes, rl_tensor_data(src), bytes,
                             bytes, 1);
}

static rl_status stream_zero_padding(const rl_recurrent *r, rl_dtype dt, int64_t F, void *x) {
    return rl_gru_cuda_zero_padding(r->stream, dt, r->T, r->B, F, rl_tensor_data(&r->len_dev), x);
}

void rl_recurrent_cuda_opts(const rl_cell_pass *p, rl_cuda_rec_opts *o) {
    *o = (rl_cuda_rec_opts){p->md, p->hd, p->dtmp, p->zo[0], p->zo[1], p->aux[0]};
}

/* dst += src * mask over n elements on the stream (weight_dropout's dU). */
static rl_status stream_mask_add(const rl_recurrent *r, rl_dtype dt, int64_t n, const void *src,
                                 const void *mask, void *dst) {
    return rl_cuda_mask(r->stream, dt, n, src, mask, dst, true);
}
#else
static rl_status stream_drop(rl_recurrent *r) {
    (void)r;
    return RL_OK;
}
static rl_status stream_for(rl_recurrent *r, rl_device dev, bool *ok) {
    (void)r, (void)dev;
    *ok = false;
    return RL_OK;
}
static rl_status stream_wait(rl_recurrent *r, const rl_tensor *const *ts, int n) {
    (void)r, (void)ts, (void)n;
    return RL_OK;
}
static rl_status stream_wrote(rl_recurrent *r, const rl_tensor *const *ts, int n) {
    (void)r, (void)ts, (void)n;
    return RL_OK;
}
static rl_status lengths_to_device(rl_recurrent *r, rl_device dev, const rl_tensor *len) {
    (void)r, (void)dev, (void)len;
    return RL_OK;
}
static rl_status stream_write_state(const rl_recurrent *r, rl_tensor *dst, const rl_tensor *src,
                                    bool *done) {
    (void)r, (void)dst, (void)src;
    *done = false;
    return RL_OK;
}
static rl_status stream_zero_padding(const rl_recurrent *r, rl_dtype dt, int64_t F, void *x) {
    (void)r, (void)dt, (void)F, (void)x;
    return RL_OK;
}
static rl_status stream_mask_add(const rl_recurrent *r, rl_dtype dt, int64_t n, const void *src,
                                 const void *mask, void *dst) {
    (void)r, (void)dt, (void)n, (void)src, (void)mask, (void)dst;
    return RL_OK;
}
#endif

/* Whether the layer can run on dev; on CUDA, makes sure it has its stream there. */
static rl_status use_device(rl_recurrent *r, const rl_layer *l, rl_device dev) {
    bool cuda;
    RL_TRY(stream_for(r, dev, &cuda));
    if (cuda || dev.type == RL_CPU) return RL_OK;
    char d[32];
    rl_device_name(dev, d, sizeof d);
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": tensors on %s are not supported by this build",
                    l->name, r->cls, d);
}

/* Given state i (r->init[i] or r->final_grad[i], named `what` and the state's name): (B, its
 * dim) on the layer's device. */
static rl_status check_state(const rl_recurrent *r, const rl_layer *l, const rl_tensor *t,
                             const char *what, int i, int64_t B, rl_device dev) {
    char buf[96], d[32];
    int64_t H = r->state_dims[i];
    if (t->ndim != 2 || t->shape[0] != B || t->shape[1] != H)
        return rl_error(
            RL_ESHAPE,
            RL_LAYER_WHERE ": %s %s is %s, expected (%" PRId64 ", %" PRId64 ") for this batch",
            l->name, r->cls, what, r->state_names[i], rl_shape_str(t, buf, sizeof buf), B, H);
    if (!rl_device_eq(rl_tensor_device(t), dev)) {
        rl_device_name(dev, d, sizeof d);
        return rl_error(
            RL_EDEVICE, RL_LAYER_WHERE ": %s %s is %s, expected it on %s (the inputs' device)",
            l->name, r->cls, what, r->state_names[i], rl_tensor_describe(t, buf, sizeof buf), d);
    }
    return RL_OK;
}

static bool given(const rl_tensor *t) { return t && t->storage; }

/* Checks the given states of one kind (r->init or r->final_grad) against the batch. */
static rl_status check_states(const rl_recurrent *r, const rl_layer *l, const rl_tensor *ts,
                              const char *what, int64_t B, rl_device dev) {
    for (int i = 0; i < r->n_states; i++)
        if (given(&ts[i])) RL_TRY(check_state(r, l, &ts[i], what, i, B, dev));
    return RL_OK;
}

/* The stream waits for the writers of the n tensors and of the given states ts (CUDA only). */
static rl_status wait_for(rl_recurrent *r, const rl_tensor *const *ts, int n,
                          const rl_tensor *states) {
    const rl_tensor *rd[2 * RL_LAYER_MAX_INPUTS + RL_LAYER_MAX_STATES];
    int m = 0;
    for (int k = 0; k < n && m < (int)(sizeof rd / sizeof rd[0]); k++)
        rd[m++] = ts[k];
    for (int k = 0; k < r->n_states && m < (int)(sizeof rd / sizeof rd[0]); k++)
        rd[m++] = &states[k];
    return stream_wait(r, rd, m);
}

rl_status rl_recurrent_forward_begin(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                     rl_dtype *dt, rl_device *dev) {
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    if (!rl_tensor_is_contiguous(io->lengths))
        return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": lengths must be contiguous", l->name, r->cls);
    *dt = io->in[0]->dtype;
    *dev = rl_tensor_device(io->in[0]);
    /* The layer's own parameters before its states: a layer whose weights live on another
     * device than the inputs is the mistake to name, whatever initial state it was given. */
    for (int k = 0; k < l->n_params; k++) {
        rl_mat m;
        RL_TRY(rl_param_mat(l, &l->params[k].value, l->params[k].name, *dt, *dev, &m));
    }
    RL_TRY(use_device(r, l, *dev));
    RL_TRY(check_states(r, l, r->init, "initial", B, *dev));
    RL_TRY(wait_for(r, (const rl_tensor *const *)io->in, io->n_in, r->init));
    r->T = T;
    r->B = B;
    r->have_forward = r->trained = r->have_state = false;
    /* with every input zero nothing would write the input projection: then none is skipped */
    uint32_t all = (uint32_t)((1ull << io->n_in) - 1);
    r->zero_fwd = (r->zero_inputs & all) == all ? 0 : r->zero_inputs & all;
    int64_t oshape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure_synced(&l->out, *dt, *dev, 3, oshape));
    return lengths_to_device(r, *dev, io->lengths);
}

rl_status rl_recurrent_forward_end(rl_recurrent *r, rl_layer *l, int64_t last_row, bool trained,
                                   const rl_tensor *const *written, int n) {
    r->last_row = last_row;
    r->have_forward = r->have_state = true;
    r->trained = trained;
    const rl_tensor *wr[8] = {&l->out};
    int m = 1;
    for (int k = 0; k < n && m < 8; k++)
        wr[m++] = written[k];
    return stream_wrote(r, wr, m);
}

/* Backward must see the batch forward saw (it reads the inputs and, on the CPU, the lengths). */
static rl_status check_backward_io(const rl_recurrent *r, const rl_layer *l, const rl_layer_io *io,
                                   rl_dtype dt, rl_device dev) {
    char s[96];
    if (io->n_in != l->n_in)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward got %d inputs, expected %d", l->name,
                        r->cls, io->n_in, l->n_in);
    for (int k = 0; k < io->n_in; k++) {
        const rl_tensor *x = io->in[k];
        if (!x || !x->storage || x->ndim != 3 || x->shape[0] != r->T || x->shape[1] != r->B ||
            x->shape[2] != l->in_dims[k] || x->dtype != dt ||
            !rl_device_eq(rl_tensor_device(x), dev))
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": backward's input %d is %s, not the forward's "
                                           "(%" PRId64 ", %" PRId64 ", %" PRId64 ") %s",
                            l->name, r->cls, k + 1,
                            x && x->storage ? rl_tensor_describe(x, s, sizeof s) : "nothing", r->T,
                            r->B, l->in_dims[k], rl_dtype_name(dt));
    }
    const rl_tensor *len = io->lengths;
    if (!len || !len->storage || len->ndim != 1 || len->dtype != RL_INT32 ||
        rl_tensor_device(len).type != RL_CPU || len->shape[0] != r->B ||
        !rl_tensor_is_contiguous(len))
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": backward needs the forward's lengths, a CPU int32 "
                                       "tensor of shape (%" PRId64 ")",
                        l->name, r->cls, r->B);
    return RL_OK;
}

rl_status rl_recurrent_backward_begin(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                      const rl_tensor *grad_out, rl_tensor *const *grad_in,
                                      rl_dtype *dt, rl_device *dev, rl_mat *dout) {
    int64_t T = r->T, B = r->B, H = l->n_out;
    char s1[96], s2[96];
    if (!r->have_forward)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward without a forward", l->name, r->cls);
    if (!r->trained)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": backward after a forward with train = false "
                                       "(impl = \"cudnn\" keeps nothing for backward then)",
                        l->name, r->cls);
    *dt = l->out.dtype;
    *dev = rl_tensor_device(&l->out);
    RL_TRY(check_backward_io(r, l, io, *dt, *dev));
    /* grad_out's writer, the given states', and earlier writers of grad_in (overwritten) */
    const rl_tensor *rd[RL_LAYER_MAX_INPUTS + 1];
    int nrd = 0;
    rd[nrd++] = grad_out;
    for (int k = 0; k < io->n_in && grad_in; k++)
        rd[nrd++] = grad_in[k];
    RL_TRY(wait_for(r, rd, nrd, r->final_grad));
    *dout = (rl_mat){NULL, 0};
    if (grad_out) {
        if (grad_out->ndim != 3 || grad_out->shape[0] != T || grad_out->shape[1] != B ||
            grad_out->shape[2] != H || grad_out->dtype != *dt ||
            !rl_device_eq(rl_tensor_device(grad_out), *dev))
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": grad_out is %s, expected (%" PRId64 ", %" PRId64
                                           ", %" PRId64 ") %s on the output's device",
                            l->name, r->cls, rl_tensor_describe(grad_out, s1, sizeof s1), T, B, H,
                            rl_dtype_name(*dt));
        if (!rl_mat_fold_tb(grad_out, dout)) {
            RL_TRY(rl_buffer_ensure_synced(&r->gout, *dt, *dev, 3, grad_out->shape));
            RL_TRY(rl_op_copy(&r->gout, grad_out));
            *dout = (rl_mat){rl_tensor_data(&r->gout), H};
        }
    }
    for (int k = 0; k < io->n_in && grad_in; k++) {
        rl_tensor *gi = grad_in[k];
        if (gi && (!gi->storage || !rl_tensor_same_shape(gi, io->in[k]) || gi->dtype != *dt ||
                   !rl_device_eq(rl_tensor_device(gi), *dev)))
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": grad_in[%d] is %s, expected %s", l->name,
                            r->cls, k + 1,
                            gi->storage ? rl_tensor_describe(gi, s1, sizeof s1) : "nothing",
                            rl_tensor_describe(io->in[k], s2, sizeof s2));
    }
    RL_TRY(check_states(r, l, r->final_grad, "gradient of final", B, *dev));
    r->have_forward = false;
    return RL_OK;
}

rl_status rl_recurrent_backward_end(rl_recurrent *r, const rl_layer_io *io,
                                    rl_tensor *const *grad_in, const rl_tensor *const *written,
                                    int n) {
    const rl_tensor *wr[RL_LAYER_MAX_INPUTS + 4];
    int m = 0;
    for (int k = 0; k < io->n_in && grad_in; k++)
        wr[m++] = grad_in[k];
    for (int k = 0; k < n && k < 4; k++)
        wr[m++] = written[k];
    return stream_wrote(r, wr, m);
}

rl_status rl_recurrent_write_state(const rl_recurrent *r, rl_tensor *dst, const rl_tensor *src) {
    if (src && !src->storage) src = NULL;
    bool done;
    RL_TRY(stream_write_state(r, dst, src, &done));
    if (done) return RL_OK;
    return src ? rl_op_copy(dst, src) : rl_op_fill(dst, 0.0);
}

rl_status rl_recurrent_final_state(const rl_recurrent *r, const rl_layer *l, const char *fn,
                                   const rl_tensor *states, rl_tensor *out) {
    if (!r->have_state)
        return rl_error(RL_EARG, "%s: layer '%s' has no forward to read", fn, l->name);
    /* the carried states make the last processed row every sequence's own final state */
    return rl_tensor_select(out, states, 0, r->last_row);
}

rl_status rl_recurrent_start_state_grads(rl_recurrent *r, rl_dtype dt, rl_device dev) {
    for (int i = 0; i < r->n_states; i++) {
        int64_t shape[2] = {r->B, r->state_dims[i]};
        RL_TRY(rl_buffer_ensure_synced(r->grad0[i], dt, dev, 2, shape));
        RL_TRY(rl_recurrent_write_state(r, r->grad0[i], &r->final_grad[i]));
    }
    return RL_OK;
}

/* ---------------------------------------------------------------- state ops */

static rl_recurrent *rec_of(const rl_layer *l) { return &((rl_recurrent_layer *)l)->rec; }

static int state_info(const rl_layer *l, const char *const **names, const int64_t **dims) {
    const rl_recurrent *r = rec_of(l);
    *names = r->state_names;
    *dims = r->state_dims;
    return r->n_states;
}

/* Shares the given tensors into dst[] after checking each is a float (B, dim) tensor. */
static rl_status set_given(rl_layer *l, rl_tensor *dst, const rl_tensor *const *g,
                           const char *what) {
    rl_recurrent *r = rec_of(l);
    char s[96];
    for (int i = 0; i < r->n_states; i++) {
        const rl_tensor *t = g[i];
        /* the batch size and the device are checked at each forward or backward */
        if (t && (!t->storage || t->ndim != 2 || t->shape[1] != r->state_dims[i] ||
                  t->dtype == RL_INT32))
            return rl_error(
                RL_ESHAPE, RL_LAYER_WHERE ": %s %s must be a float (B, %" PRId64 ") tensor, got %s",
                l->name, r->cls, what, r->state_names[i], r->state_dims[i],
                t && t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing");
    }
    for (int i = 0; i < r->n_states; i++) {
        rl_tensor_release(&dst[i]);
        if (g[i]) rl_tensor_share(&dst[i], g[i]);
    }
    return RL_OK;
}

static rl_status state_set_initial(rl_layer *l, const rl_tensor *const *s) {
    return set_given(l, rec_of(l)->init, s, "initial");
}

static rl_status state_set_final_grad(rl_layer *l, const rl_tensor *const *g) {
    return set_given(l, rec_of(l)->final_grad, g, "gradient of final");
}

static rl_status state_final(rl_layer *l, rl_tensor *const *out) {
    rl_recurrent *r = rec_of(l);
    for (int i = 0; i < r->n_states; i++) {
        if (!out[i]) continue;
        rl_status st = rl_recurrent_final_state(r, l, "final_state", r->seq[i], out[i]);
        if (st != RL_OK) {
            for (int k = 0; k < i; k++)
                if (out[k]) rl_tensor_release(out[k]);
            return st;
        }
    }
    return RL_OK;
}

static rl_status state_initial_grad(rl_layer *l, rl_tensor *const *out) {
    rl_recurrent *r = rec_of(l);
    if (!r->grad0[0]->storage)
        return rl_error(RL_EARG, "initial_state_grad: " RL_LAYER_WHERE " has run no backward",
                        l->name, r->cls);
    for (int i = 0; i < r->n_states; i++)
        if (out[i]) rl_tensor_share(out[i], r->grad0[i]);
    return RL_OK;
}

const rl_state_ops rl_recurrent_state_ops = {.info = state_info,
                                             .set_initial = state_set_initial,
                                             .set_final_grad = state_set_final_grad,
                                             .final = state_final,
                                             .initial_grad = state_initial_grad};

/* ---------------------------------------------------------------- packed operands */

/* refs: the layer objects sharing them (atomic: frozen packs are shared by the networks of
 * threads that free them apart). pass: 0 (pack at every call, all kinds into slot RL_PACK_U) or
 * the rec layer's current pass; a slot is fresh when it was packed in that pass. frozen: the
 * parameters never change, so each kind is packed once, into its own slot, while one layer
 * holds the packs; once shared, frozen packs are only read (a stale slot is an error, not a
 * repack into a buffer other threads read). count: operands packed so far. */
typedef struct rl_packs {
    atomic_int refs;
    bool frozen;
    uint64_t pass, count;
    rl_tensor buf[RL_PACK_KINDS];
    uint64_t packed_in[RL_PACK_KINDS];
} rl_packs;

static void packs_release(rl_packs *P) {
    if (!P || atomic_fetch_sub(&P->refs, 1) > 1) return;
    for (int k = 0; k < RL_PACK_KINDS; k++)
        rl_tensor_release(&P->buf[k]);
    free(P);
}

static rl_status packs_of(rl_recurrent *r, const rl_layer *l, rl_packs **P) {
    if (!r->packs) {
        r->packs = calloc(1, sizeof *r->packs);
        if (!r->packs)
            return rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory", l->name, r->cls);
        atomic_init(&r->packs->refs, 1);
    }
    *P = r->packs;
    return RL_OK;
}

rl_status rl_recurrent_pack_slot(rl_recurrent *r, const rl_layer *l, int kind, int64_t n,
                                 float **dst, bool *stale) {
    rl_packs *P = NULL;
    RL_TRY(packs_of(r, l, &P));
    if (P->frozen) {
        rl_tensor *b = &P->buf[kind];
        *stale = !P->packed_in[kind] || rl_tensor_numel(b) != n;
        if (*stale && atomic_load(&P->refs) > 1)
            return rl_error(RL_EARG,
                            RL_LAYER_WHERE ": its frozen packed weights are shared and hold no "
                                           "operand %d of %" PRId64
                                           " floats (the network that made them did "
                                           "not run this product before they were shared)",
                            l->name, r->cls, kind, n);
        if (*stale) {
            P->packed_in[kind] = 0;
            RL_TRY(rl_buffer_ensure(b, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
            P->packed_in[kind] = 1;
            P->count++;
        }
        *dst = rl_tensor_data(b);
        return RL_OK;
    }
    int k = P->pass ? kind : RL_PACK_U;
    *stale = !P->pass || P->packed_in[k] != P->pass;
    if (*stale) {
        P->packed_in[k] = 0; /* until it is filled */
        RL_TRY(rl_buffer_ensure(&P->buf[k], RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
        P->packed_in[k] = P->pass;
        P->count++;
    }
    *dst = rl_tensor_data(&P->buf[k]);
    return RL_OK;
}

bool rl_recurrent_packed_inputs(const rl_recurrent *r, rl_dtype dt, rl_device dev) {
    return r->packs && (r->packs->pass || (r->adopted && r->adopted_w)) && dt == RL_FLOAT32 &&
           dev.type == RL_CPU && rl_gemm_packed_fast();
}

rl_status rl_recurrent_pack_inputs(rl_recurrent *r, const rl_layer *l, bool backward,
                                   const float *W, int64_t ld, const rl_pack_block *blocks,
                                   int n_blocks, float **out) {
    int64_t n = 0;
    for (int k = 0; k < l->n_in; k++)
        for (int i = 0; i < n_blocks; i++)
            n += backward ? rl_gemm_packed_size(blocks[i].n, l->in_dims[k])
                          : rl_gemm_packed_size(l->in_dims[k], blocks[i].n);
    bool stale;
    RL_TRY(rl_recurrent_pack_slot(r, l, backward ? RL_PACK_WT : RL_PACK_W, n, out, &stale));
    if (!stale) return RL_OK;
    float *d = *out;
    const float *Wk = W;
    for (int k = 0; k < l->n_in; k++) {
        int64_t F = l->in_dims[k];
        for (int i = 0; i < n_blocks; i++) {
            int64_t c = blocks[i].col, w = blocks[i].n;
            if (backward) {
                rl_gemm_pack_f32(d, Wk + c, ld, true, w, F);
                d += rl_gemm_packed_size(w, F);
            } else {
                rl_gemm_pack_f32(d, Wk + c, ld, false, F, w);
                d += rl_gemm_packed_size(F, w);
            }
        }
        Wk += F * ld;
    }
    return RL_OK;
}

/* The rl_recurrent of l, a layer built on it (its struct starts with rl_recurrent_layer). */
static rl_status recurrent_of(rl_layer *l, const char *fn, rl_recurrent **r) {
    if (!l || l->ops->state != &rl_recurrent_state_ops)
        return rl_error(RL_EARG, "%s: " RL_LAYER_WHERE " is not a recurrent layer", fn,
                        l ? l->name : "(null)", l ? l->ops->class_name : "none");
    *r = &((rl_recurrent_layer *)l)->rec;
    return RL_OK;
}

rl_status rl_recurrent_share_packs(rl_layer *l, rl_layer *owner) {
    const char *fn = "rl_recurrent_share_packs";
    rl_recurrent *r = NULL, *o = NULL;
    rl_packs *P = NULL;
    RL_TRY(recurrent_of(l, fn, &r));
    RL_TRY(recurrent_of(owner, fn, &o));
    if (l->ops != owner->ops || l->n_out != owner->n_out || l->n_in != owner->n_in ||
        memcmp(l->in_dims, owner->in_dims, (size_t)l->n_in * sizeof *l->in_dims) != 0)
        return rl_error(RL_EARG,
                        "%s: layer '%s' and layer '%s' differ in their class, inputs or n_out "
                        "(step objects of one unit layer share their packed weights)",
                        fn, l->name, owner->name);
    RL_TRY(packs_of(o, owner, &P));
    if (r->packs == P) return RL_OK;
    packs_release(r->packs);
    r->packs = P;
    atomic_fetch_add(&P->refs, 1);
    return RL_OK;
}

rl_status rl_recurrent_freeze_packs(rl_layer *l) {
    rl_recurrent *r = NULL;
    rl_packs *P = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_freeze_packs", &r));
    RL_TRY(packs_of(r, l, &P));
    if (P->pass || atomic_load(&P->refs) > 1)
        return rl_error(RL_EARG,
                        "rl_recurrent_freeze_packs: " RL_LAYER_WHERE " shares its packs or has a "
                        "pack pass (a rec unit's step object)",
                        l->name, r->cls);
    if (!P->frozen) {
        for (int k = 0; k < RL_PACK_KINDS; k++)
            P->packed_in[k] = 0;
        P->frozen = true;
    }
    return RL_OK;
}

void *rl_recurrent_frozen_packs(rl_layer *l) {
    if (!l || l->ops->state != &rl_recurrent_state_ops) return NULL;
    rl_packs *P = ((rl_recurrent_layer *)l)->rec.packs;
    return P && P->frozen && P->count > 0 ? P : NULL;
}

void rl_recurrent_packs_hold(void *packs) {
    if (packs) atomic_fetch_add(&((rl_packs *)packs)->refs, 1);
}

void rl_recurrent_packs_drop(void *packs) { packs_release(packs); }

rl_status rl_recurrent_adopt_packs(rl_layer *l, void *packs) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_adopt_packs", &r));
    rl_packs *P = packs;
    if (!P || !P->frozen)
        return rl_error(RL_EARG,
                        "rl_recurrent_adopt_packs: " RL_LAYER_WHERE ": no frozen packs given",
                        l->name, r->cls);
    if (r->packs == P) return RL_OK;
    atomic_fetch_add(&P->refs, 1);
    packs_release(r->packs);
    r->packs = P;
    r->adopted = true;
    return RL_OK;
}

rl_status rl_recurrent_adopted_inputs(rl_layer *l, bool on) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_adopted_inputs", &r));
    if (on && !r->adopted)
        return rl_error(RL_EARG,
                        "rl_recurrent_adopted_inputs: " RL_LAYER_WHERE " reads no adopted packs",
                        l->name, r->cls);
    r->adopted_w = on;
    return RL_OK;
}

rl_status rl_recurrent_set_pack_pass(rl_layer *l, uint64_t pass) {
    rl_recurrent *r = NULL;
    rl_packs *P = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_set_pack_pass", &r));
    RL_TRY(packs_of(r, l, &P));
    P->pass = pass;
    return RL_OK;
}

rl_status rl_recurrent_set_zero_inputs(rl_layer *l, uint32_t mask) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_set_zero_inputs", &r));
    if (mask >> l->n_in)
        return rl_error(RL_EARG,
                        "rl_recurrent_set_zero_inputs: layer '%s' has %d inputs, the mask 0x%x "
                        "names others",
                        l->name, l->n_in, (unsigned)mask);
    r->zero_inputs = mask;
    return RL_OK;
}

rl_status rl_recurrent_set_gates(rl_layer *l, const rl_tensor *gates) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_set_gates", &r));
    rl_tensor_release(&r->ext_gates);
    if (gates && gates->storage) rl_tensor_share(&r->ext_gates, gates);
    return RL_OK;
}

rl_status rl_recurrent_gates(rl_recurrent *r, const rl_layer *l, rl_tensor *gates, rl_dtype dt,
                             rl_device dev, const int64_t *shape) {
    r->defer_fwd = false;
    if (!r->ext_gates.storage) {
        if (r->gates_shared) { /* the caller's storage is not the layer's to resize */
            rl_tensor_release(gates);
            r->gates_shared = false;
        }
        return rl_buffer_ensure_synced(gates, dt, dev, 3, shape);
    }
    const rl_tensor *g = &r->ext_gates;
    char s[96];
    if (dev.type != RL_CPU || g->dtype != dt || !rl_device_eq(rl_tensor_device(g), dev) ||
        g->ndim != 3 || g->shape[0] != shape[0] || g->shape[1] != shape[1] ||
        g->shape[2] != shape[2] || !rl_tensor_is_contiguous(g))
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE
                        ": the gates buffer given with rl_recurrent_set_gates is "
                        "%s, expected a contiguous (%" PRId64 ", %" PRId64 ", %" PRId64
                        ") %s tensor on the cpu (the inputs' dtype; the weight gradients over "
                        "all steps run on the CPU only)",
                        l->name, r->cls, rl_tensor_describe(g, s, sizeof s), shape[0], shape[1],
                        shape[2], rl_dtype_name(dt));
    rl_tensor_release(gates);
    rl_tensor_share(gates, g);
    r->gates_shared = r->defer_fwd = true;
    return RL_OK;
}

/* t as rows of `cols` elements: a contiguous 2-D or 3-D float tensor on the CPU; *n its rows. */
static rl_status rows_of(const rl_layer *l, const char *fn, const char *what, const rl_tensor *t,
                         int64_t cols, int64_t *n) {
    char s[96];
    if (!t || !t->storage || (t->ndim != 2 && t->ndim != 3) || t->shape[t->ndim - 1] != cols ||
        (t->dtype != RL_FLOAT32 && t->dtype != RL_FLOAT64) || !rl_tensor_is_contiguous(t) ||
        rl_tensor_device(t).type != RL_CPU)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": %s: %s is %s, expected a contiguous float CPU tensor "
                                       "of rows of %" PRId64,
                        l->name, l->ops->class_name, fn, what,
                        t && t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing", cols);
    *n = rl_tensor_numel(t) / cols;
    return RL_OK;
}

rl_status rl_recurrent_weight_grads(rl_layer *l, int k, const rl_tensor *x, const rl_tensor *dz) {
    const char *fn = "rl_recurrent_weight_grads";
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, fn, &r));
    if (k < -1 || k >= l->n_in)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": %s: the layer has %d inputs, k = %d names none (-1: U)",
                        l->name, l->ops->class_name, fn, l->n_in, k);
    int64_t F = k < 0 ? l->n_out : l->in_dims[k], nx, nz;
    RL_TRY(rows_of(l, fn, k < 0 ? "x (the previous states)" : "x", x, F, &nx));
    RL_TRY(rows_of(l, fn, "dz", dz, r->gates_cols, &nz));
    if (nx != nz || x->dtype != dz->dtype)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": %s: x has %" PRId64 " rows of %s, dz %" PRId64
                                       " rows of %s; expected the same rows and dtype",
                        l->name, l->ops->class_name, fn, nx, rl_dtype_name(x->dtype), nz,
                        rl_dtype_name(dz->dtype));
    if (nx == 0) return RL_OK;
    return r->weight_grad(l, RL_DEVICE_CPU, x->dtype, k, nx, (rl_mat){rl_tensor_data(x), F},
                          (rl_mat){rl_tensor_data(dz), r->gates_cols});
}

rl_status rl_recurrent_pack_count(rl_layer *l, uint64_t *count) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_pack_count", &r));
    *count = r->packs ? r->packs->count : 0;
    return RL_OK;
}

rl_status rl_recurrent_gates_cols(rl_layer *l, int64_t *cols) {
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, "rl_recurrent_gates_cols", &r));
    *cols = r->gates_cols;
    return RL_OK;
}

/* ---------------------------------------------------------------- options */

rl_status rl_recurrent_prob_option(const rl_options *o, const char *name, const char *cls,
                                   const char *key, double *p) {
    RL_TRY(rl_opt_number(o, name, key, 0.0, p));
    if (!(*p >= 0.0 && *p < 1.0))
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option %s = %g, expected a probability in [0, 1)", name,
                        cls, key, *p);
    return RL_OK;
}

rl_status rl_recurrent_zoneout_option(const rl_options *o, const char *name, const char *cls,
                                      bool has_cell, bool cudnn, double *zc, double *zh) {
    /* without a cell state the field is not read, so zoneout = {cell = ..} is an unknown field
     * (layers.lua names it) and zoneout = z means the hidden state's */
    *zc = 0.0;
    if (has_cell) RL_TRY(rl_recurrent_prob_option(o, name, cls, "zoneout.cell", zc));
    RL_TRY(rl_recurrent_prob_option(o, name, cls, "zoneout.hidden", zh));
    if (cudnn && (*zc > 0 || *zh > 0))
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option zoneout and impl = \"cudnn\" do not go together "
                                       "(cuDNN's cells have no zoneout; use impl = \"own\")",
                        name, cls);
    return RL_OK;
}

rl_status rl_recurrent_zoneout_mask(const rl_recurrent *r, const rl_layer *l, const rl_layer_io *io,
                                    double z, rl_tensor *mask, rl_dtype dt, rl_device dev) {
    int64_t shape[3] = {r->T, r->B, r->state_dims[0]};
    RL_TRY(rl_buffer_ensure_synced(mask, dt, dev, 3, shape));
    if (!io->train) return rl_op_fill(mask, z);
    if (!io->rng)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": zoneout in training needs a random generator",
                        l->name, r->cls);
    RL_TRY(rl_op_uniform(mask, io->rng, 0.0, 1.0));
    return rl_op_binary_scalar(mask, mask, z, RL_BIN_LT, false);
}

rl_status rl_recurrent_rec_dropout_option(const rl_options *o, const char *name, const char *cls,
                                          bool cudnn, double *p) {
    RL_TRY(rl_recurrent_prob_option(o, name, cls, "rec_dropout", p));
    if (cudnn && *p > 0)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE
                        ": option rec_dropout and impl = \"cudnn\" do not go "
                        "together (cuDNN's cells have no recurrent dropout; use impl = \"own\")",
                        name, cls);
    return RL_OK;
}

rl_status rl_recurrent_rec_dropout_mask(const rl_recurrent *r, const rl_layer *l,
                                        const rl_layer_io *io, double p, rl_tensor *mask,
                                        rl_dtype dt, rl_device dev) {
    if (r->ext_gates.storage)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE
                        ": option rec_dropout is not supported inside a rec unit "
                        "(its step objects would draw a new mask at every step, not one per "
                        "sequence)",
                        l->name, r->cls);
    if (!io->rng)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": rec_dropout in training needs a random generator",
                        l->name, r->cls);
    int64_t shape[2] = {r->B, r->state_dims[0]};
    RL_TRY(rl_buffer_ensure_synced(mask, dt, dev, 2, shape));
    RL_TRY(rl_op_uniform(mask, io->rng, 0.0, 1.0));
    RL_TRY(rl_op_binary_scalar(mask, mask, p, RL_BIN_GE, false));
    return rl_op_binary_scalar(mask, mask, 1.0 / (1.0 - p), RL_BIN_MUL, false);
}

/* d = a * k (or d += a * k) over m elements in one precision, REAL float (S f32) or double
 * (S f64), with kernels/pointwise.h's DROP (the CUDA kernel's rule too, rl_cuda_mask). */
#define RL_MASK_ROWS(REAL, S, DROP)                                                                \
    static void mask_rows_##S(int64_t m, const REAL *restrict a, const REAL *restrict k,           \
                              REAL *restrict d, bool accumulate) {                                 \
        if (accumulate)                                                                            \
            for (int64_t i = 0; i < m; i++)                                                        \
                d[i] += DROP(a[i], k[i]);                                                          \
        else                                                                                       \
            for (int64_t i = 0; i < m; i++)                                                        \
                d[i] = DROP(a[i], k[i]);                                                           \
    }
RL_MASK_ROWS(float, f32, rl_dropf)
RL_MASK_ROWS(double, f64, rl_drop)

void rl_recurrent_mask_rows(rl_dtype dt, int64_t n, int64_t H, const void *src, const void *mask,
                            void *dst, bool accumulate) {
    if (dt == RL_FLOAT32)
        mask_rows_f32(n * H, src, mask, dst, accumulate);
    else
        mask_rows_f64(n * H, src, mask, dst, accumulate);
}

void rl_recurrent_free(rl_recurrent *r) {
    /* a failure here has no one to report to (the message stays in rl_errmsg) */
    (void)stream_drop(r);
    rl_tensor_release(&r->len_dev);
    rl_tensor_release(&r->gout);
    rl_tensor_release(&r->ext_gates);
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++) {
        rl_tensor_release(&r->init[i]);
        rl_tensor_release(&r->final_grad[i]);
    }
    packs_release(r->packs);
    r->packs = NULL;
}

/* ---------------------------------------------------------------- the driver */

enum { P_W, P_U }; /* every cell's first two parameters */

static void *at(const rl_tensor *t, int64_t elems) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(t->dtype);
}

static rl_mat cols(rl_mat m, int64_t c, rl_dtype dt) { return rl_mat_sub(m, 0, c, dt); }

/* W's width in units of H. */
static int w_blocks(const rl_cell *c) {
    int n = 0;
    for (int i = 0; i < c->n_in_blocks; i++)
        n += c->in_blocks[i].n;
    return n;
}

const rl_cell *rl_recurrent_cell(const rl_layer *l) {
    if (!l || l->ops->state != &rl_recurrent_state_ops) return NULL;
    return rec_of(l)->cell;
}

/* dU += x^T dz[:, 0 : rec_gates H] over n rows (x the previous states, P wide), through the
 * weight_dropout mask when the last forward dropped U. */
static rl_status u_grad(rl_layer *l, rl_device dev, rl_dtype dt, int64_t n, rl_mat x, rl_mat dz) {
    rl_recurrent *r = rec_of(l);
    int64_t P = l->n_out, R = r->cell->rec_gates * r->H;
    rl_mat g;
    RL_TRY(rl_param_mat(l, &l->params[P_U].grad, "U (gradient)", dt, dev, &g));
    if (!r->wdropped) return rl_mat_gemm(dev, r->stream, dt, true, false, P, R, n, x, dz, 1.0, g);
    RL_TRY(rl_mat_gemm(dev, r->stream, dt, true, false, P, R, n, x, dz, 0.0,
                       (rl_mat){rl_tensor_data(&r->dud), R}));
    rl_recurrent_mask_rows(dt, P, R, rl_tensor_data(&r->dud), rl_tensor_data(&r->wdm), g.p, true);
    return RL_OK;
}

/* The weight-gradient products (rl_recurrent.weight_grad) over n rows: k < n_in: for each input
 * block, dW_k[:, src] += x^T dz[:, dst]; k = -1: u_grad, unless the recurrent part is apart
 * (rec_apart: the layer makes dU itself, from that part's gradients). */
static rl_status weight_grad(rl_layer *l, rl_device dev, rl_dtype dt, int k, int64_t n, rl_mat x,
                             rl_mat dz) {
    rl_recurrent *r = rec_of(l);
    const rl_cell *c = r->cell;
    int64_t H = r->H, row = 0;
    rl_mat g;
    if (k < 0) return r->rec_apart ? RL_OK : u_grad(l, dev, dt, n, x, dz);
    RL_TRY(rl_param_mat(l, &l->params[P_W].grad, "W (gradient)", dt, dev, &g));
    for (int i = 0; i < k; i++)
        row += l->in_dims[i];
    rl_mat dWk = rl_mat_sub(g, row, 0, dt);
    for (int i = 0; i < c->n_in_blocks; i++) {
        const rl_cell_block *b = &c->in_blocks[i];
        RL_TRY(rl_mat_gemm(dev, r->stream, dt, true, false, l->in_dims[k], b->n * H, n, x,
                           cols(dz, b->dst * H, dt), 1.0, cols(dWk, b->src * H, dt)));
    }
    return RL_OK;
}

/* The input weights' blocks of columns for the packed kernel (rl_recurrent_pack_inputs). */
static rl_status pack_inputs(rl_recurrent *r, const rl_layer *l, bool backward, const float *W,
                             float **out) {
    const rl_cell *c = r->cell;
    int64_t H = r->H;
    rl_pack_block blocks[2];
    for (int i = 0; i < c->n_in_blocks; i++)
        blocks[i] = (rl_pack_block){c->in_blocks[i].src * H, c->in_blocks[i].n * H};
    return rl_recurrent_pack_inputs(r, l, backward, W, w_blocks(c) * H, blocks, c->n_in_blocks,
                                    out);
}

/* Input k of the batch as a (T*B, F) matrix: the input itself when it folds and the batch has
 * no padding, else the copy xs[k] with the padded frames zeroed: dW = X^T dZ over all frames
 * would otherwise turn a NaN or Inf in the padding into NaN gradients (0 * NaN), although dZ is
 * 0 there. */
static rl_status input_mat(rl_recurrent *r, const rl_layer *l, const rl_layer_io *io, int k,
                           bool ragged, rl_mat *X) {
    const rl_tensor *x = io->in[k];
    rl_device dev = rl_tensor_device(x);
    int64_t T = r->T, B = r->B, F = l->in_dims[k];
    r->use_xs[k] = ragged || !rl_mat_fold_tb(x, X);
    if (!r->use_xs[k]) return RL_OK;
    RL_TRY(rl_buffer_ensure_synced(&r->xs[k], x->dtype, dev, 3, x->shape));
    RL_TRY(rl_op_copy(&r->xs[k], x));
    *X = (rl_mat){rl_tensor_data(&r->xs[k]), F};
    if (!ragged) return RL_OK;
    if (dev.type != RL_CPU) return stream_zero_padding(r, x->dtype, F, X->p);
    const int32_t *len = rl_tensor_data(io->lengths);
    size_t row = (size_t)F * rl_dtype_size(x->dtype);
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            if (t >= len[b]) memset((char *)X->p + (size_t)(t * B + b) * row, 0, row);
    return RL_OK;
}

/* The CPU recurrence. Batch rows never read each other's state, so where the packed U
 * (rec_gates H x H floats, or bf16 with a bf16 context active, whose products go through
 * rl_mat_gemm and keep U packed) stays within a core's L2 (1 MiB here) the batch is cut into row
 * parts, one per BLAS thread with at least a register tile (8) of rows each, and each part runs
 * every step of the pass (its rows' recurrent product and pointwise pass) on a thread of
 * kernels/cpu/parallel.h: one handoff per pass instead of one per step. There the cell's bias
 * sums run after the steps over all rows in memory order (rl_cell.sums), whatever the number of
 * parts, so the results do not depend on the thread count. Otherwise one part: each step's
 * product is split by columns (rl_gemm_packed_f32) and a cell may sum in its steps. Beyond L2 a
 * step's product is bound by streaming U, which the column split reads once rather than once
 * per part. */
typedef struct {
    rl_layer *l;
    rl_recurrent *r;
    rl_dtype dt;
    const int32_t *len;
    rl_mat U, dout; /* dout: backward */
    const void *const *p;
    void *const *dp;
    bool packed, backward, apart;
    const float *upack; /* packed U (forward) or U^T (backward) when packed */
    rl_mat R;           /* n_proj's R */
    const float *rpack; /* packed R (forward) or R^T (backward) when packed with n_proj */
} steps_job;

static bool rows_apart(const rl_recurrent *r, rl_dtype dt, bool packed) {
    /* a bf16 (or int8) product sums a row in the same order whatever rows are beside it, as the
     * packed float32 one does (kernels/cpu/gemm_bf16.c); its pack of U holds 2 bytes a weight */
    int64_t bytes = packed ? 4 : dt == RL_FLOAT32 && rl_bf16_active() ? 2 : 0;
    return bytes > 0 && bytes * r->cell->rec_gates * r->H * r->state_dims[0] <= (1 << 20);
}

static int row_parts(const steps_job *j) {
    if (!j->apart) return 1;
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    while (parts > 1 && j->r->B / parts < 8)
        parts--;
    return parts;
}

/* The rows of the state buffers (T+1, B, .) that hold the states before and after frame t. */
static int64_t prev_row(const rl_recurrent *r, int64_t t) { return r->direction > 0 ? t : t + 1; }
static int64_t cur_row(const rl_recurrent *r, int64_t t) { return r->direction > 0 ? t + 1 : t; }

/* One part's step description (rows r0 .. r1-1) with the fields every frame shares. */
static rl_cell_step step_of(const steps_job *j, int64_t r0, int64_t r1) {
    const rl_recurrent *r = j->r;
    int64_t H = r->H;
    rl_cell_step s = {.l = j->l,
                      .opt = r->cell_opt,
                      .dt = j->dt,
                      .n = r1 - r0,
                      .H = H,
                      .len = j->len + r0,
                      .dout_ld = j->dout.ld,
                      .zoned = r->zoned,
                      .p = j->p,
                      .dp = j->backward && !j->apart ? j->dp : NULL};
    for (int i = 0; i < r->n_states && j->backward; i++)
        s.dstate[i] = at(&r->dstates[i], r0 * r->state_dims[i]);
    return s;
}

/* Points s at processing step k's frame t (returned), rows r0..: the gates, the states before
 * (prev) and after (cur) frame t, zoneout's weights and the cell's buffers. */
static int64_t step_rows(const steps_job *j, rl_cell_step *s, int64_t k, int64_t r0) {
    const rl_recurrent *r = j->r;
    int64_t T = r->T, H = r->H, B = r->B, BH = B * H;
    int64_t t = r->direction > 0 ? k : T - 1 - k, prev = prev_row(r, t), cur = cur_row(r, t);
    s->t = t;
    s->g = at(&r->gates, (t * B + r0) * r->cell->gate_blocks * H);
    for (int i = 0; i < r->n_states; i++) {
        int64_t D = r->state_dims[i];
        s->prev[i] = at(&r->seqs[i], (prev * B + r0) * D);
        s->cur[i] = at(&r->seqs[i], (cur * B + r0) * D);
        s->zo[i] = r->zoned && r->zo[i] > 0 ? at(&r->zmask[i], (t * B + r0) * D) : NULL;
    }
    if (r->p_proj) { /* the cell's state 0 is m */
        s->prev[0] = at(&r->ms, prev * BH + r0 * H);
        s->cur[0] = at(&r->ms, cur * BH + r0 * H);
    }
    for (int a = 0; a < r->cell->n_aux; a++)
        s->aux[a] = r->zoned ? at(&r->aux[a], t * BH + r0 * H) : NULL;
    for (int f = 0; f < r->n_frame; f++)
        s->fb[f] = at(&r->frame[f], (t * B + r0) * r->frame_cols[f]);
    return t;
}

/* n_proj, after the cell's pass of frame t, rows r0 .. r0+n-1: h = m R into state 0's row cur; a
 * padded row carries h_prev (its m is m_prev, but the initial state has no m) and outputs 0, a
 * valid one outputs h. */
static void project_rows(const steps_job *j, int64_t t, int64_t r0, int64_t n) {
    const rl_recurrent *r = j->r;
    rl_dtype dt = j->dt;
    int64_t B = r->B, H = r->H, P = r->state_dims[0], prev = prev_row(r, t), cur = cur_row(r, t);
    size_t row = (size_t)P * rl_dtype_size(dt);
    rl_mat M = {at(&r->ms, (cur * B + r0) * H), H}, Hc = {at(&r->seqs[0], (cur * B + r0) * P), P};
    if (j->packed)
        rl_gemm_packed_f32(n, P, H, M.p, H, j->rpack, false, Hc.p, P);
    else
        rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, false, n, P, H, M, j->R, 0.0, Hc);
    for (int64_t b = r0; b < r0 + n; b++) {
        void *h = at(&r->seqs[0], (cur * B + b) * P), *out = at(&j->l->out, (t * B + b) * P);
        if (t >= j->len[b]) {
            memcpy(h, at(&r->seqs[0], (prev * B + b) * P), row);
            memset(out, 0, row);
        } else {
            memcpy(out, h, row);
        }
    }
}

/* n_proj, before the cell's backward pass of frame t, rows r0 .. r0+n-1: the frame's dLoss/dh
 * (the running dh plus dout on a valid row, 0 on a padded one, whose dh passes through) into drs,
 * dh = 0 on valid rows (the step's product adds to it after the pass), and dLoss/dm = drs_t R^T
 * into dm, which the pass reads as its state 0's gradient. */
static void unproject_rows(const steps_job *j, int64_t t, int64_t r0, int64_t n, const void *dot) {
    const rl_recurrent *r = j->r;
    rl_dtype dt = j->dt;
    int64_t B = r->B, H = r->H, P = r->state_dims[0];
    size_t es = rl_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        void *d = at(&r->drs, (t * B + r0 + i) * P), *dh = at(&r->dstates[0], (r0 + i) * P);
        const void *o = dot ? (const char *)dot + (size_t)(i * j->dout.ld) * es : NULL;
        if (t >= j->len[r0 + i]) {
            memset(d, 0, (size_t)P * es);
        } else if (dt == RL_FLOAT32) {
            float *df = d, *hf = dh;
            const float *of = o;
            for (int64_t k = 0; k < P; k++) {
                df[k] = hf[k] + (of ? of[k] : 0.0f);
                hf[k] = 0.0f;
            }
        } else {
            double *df = d, *hf = dh;
            const double *of = o;
            for (int64_t k = 0; k < P; k++) {
                df[k] = hf[k] + (of ? of[k] : 0.0);
                hf[k] = 0.0;
            }
        }
    }
    rl_mat D = {at(&r->drs, (t * B + r0) * P), P}, M = {at(&r->dm, r0 * H), H};
    if (j->packed)
        rl_gemm_packed_f32(n, H, P, D.p, P, j->rpack, false, M.p, H);
    else
        rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, true, n, H, P, D, j->R, 0.0, M);
}

static void fwd_rows(const steps_job *j, int64_t r0, int64_t r1) {
    rl_recurrent *r = j->r;
    const rl_cell *c = r->cell;
    rl_dtype dt = j->dt;
    int64_t T = r->T, B = r->B, H = r->H, P = r->state_dims[0], BP = B * P, n = r1 - r0;
    int64_t G = c->gate_blocks * H, R = c->rec_gates * H;
    rl_cell_step s = step_of(j, r0, r1);
    for (int64_t k = 0; k < T; k++) {
        int64_t t = step_rows(j, &s, k, r0);
        rl_mat Hp = {at(&r->seqs[0], prev_row(r, t) * BP + r0 * P), P}, Gt = {s.g, G}, Hm = Hp;
        if (r->rdropped) { /* the product reads the dropped state */
            Hm.p = at(&r->hd, t * BP + r0 * P);
            rl_recurrent_mask_rows(dt, n, P, Hp.p, at(&r->md, r0 * P), Hm.p, false);
        }
        if (r->rec_apart) Gt = (rl_mat){s.fb[0], R}; /* the cell normalises it apart */
        if (j->packed)
            rl_gemm_packed_f32(n, R, P, Hm.p, P, j->upack, !r->rec_apart, Gt.p, Gt.ld);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, false, n, R, P, Hm, j->U,
                        r->rec_apart ? 0.0 : 1.0, Gt);
        s.out = r->p_proj ? at(&r->mscr, r0 * H) : at(&j->l->out, t * BP + r0 * P);
        c->fwd(&s);
        if (r->p_proj) project_rows(j, t, r0, n);
    }
}

/* Backward steps of rows r0 .. r1-1: the cell's pass (dZ over the gates, the state gradients'
 * direct parts), then per step dh += dZ_t[:, 0 : rec_gates H] U^T. */
static void bwd_rows(const steps_job *j, int64_t r0, int64_t r1) {
    rl_recurrent *r = j->r;
    const rl_cell *c = r->cell;
    rl_dtype dt = j->dt;
    int64_t T = r->T, B = r->B, H = r->H, P = r->state_dims[0], n = r1 - r0;
    int64_t G = c->gate_blocks * H, R = c->rec_gates * H;
    size_t es = rl_dtype_size(dt);
    rl_cell_step s = step_of(j, r0, r1);
    rl_mat dH = {s.dstate[0], P};
    if (r->p_proj) s.dstate[0] = at(&r->dm, r0 * H); /* the cell's pass sees dLoss/dm */
    for (int64_t k = T - 1; k >= 0; k--) {
        int64_t t = step_rows(j, &s, k, r0);
        s.dout = j->dout.p ? (char *)j->dout.p + (size_t)((t * B + r0) * j->dout.ld) * es : NULL;
        if (r->p_proj) {
            unproject_rows(j, t, r0, n, s.dout);
            s.dout = NULL;
        }
        c->bwd(&s);
        /* padded rows of dZ_t are 0, so their dh passes through unchanged; with rec_dropout
         * the product's gradient goes through the mask; with rec_apart it reads the recurrent
         * part's gradients */
        rl_mat Gt = r->rec_apart ? (rl_mat){s.fb[1], R} : (rl_mat){s.g, G};
        rl_mat D = r->rdropped ? (rl_mat){at(&r->dtmp, r0 * P), P} : dH;
        if (j->packed)
            rl_gemm_packed_f32(n, P, R, Gt.p, Gt.ld, j->upack, !r->rdropped, D.p, P);
        else
            rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, false, true, n, P, R, Gt, j->U,
                        r->rdropped ? 0.0 : 1.0, D);
        if (r->rdropped) rl_recurrent_mask_rows(dt, n, P, D.p, at(&r->md, r0 * P), dH.p, true);
    }
}

static void steps_part(void *ctx, int part, int parts) {
    const steps_job *j = ctx;
    int64_t B = j->r->B, r0 = B * part / parts, r1 = B * (part + 1) / parts;
    if (j->backward)
        bwd_rows(j, r0, r1);
    else
        fwd_rows(j, r0, r1);
}

/* Packs U (forward) or U^T (backward) for the packed kernel where it applies, then runs the
 * steps. */
static rl_status run_steps(steps_job *j) {
    rl_recurrent *r = j->r;
    int64_t H = r->H, P = r->state_dims[0], R = r->cell->rec_gates * H;
    j->packed = j->dt == RL_FLOAT32 && rl_gemm_packed_fast();
    j->apart = rows_apart(r, j->dt, j->packed);
    if (j->packed) {
        int64_t n = j->backward ? rl_gemm_packed_size(R, P) : rl_gemm_packed_size(P, R);
        bool stale;
        float *d;
        RL_TRY(
            rl_recurrent_pack_slot(r, j->l, j->backward ? RL_PACK_UT : RL_PACK_U, n, &d, &stale));
        if (stale && j->backward)
            rl_gemm_pack_f32(d, j->U.p, R, true, R, P);
        else if (stale)
            rl_gemm_pack_f32(d, j->U.p, R, false, P, R);
        j->upack = d;
    }
    /* R is the layer's own buffer, packed at every pass: the packs' slots hold one operand at a
     * time outside a rec unit */
    if (j->packed && r->p_proj) {
        int64_t n = j->backward ? rl_gemm_packed_size(P, H) : rl_gemm_packed_size(H, P);
        RL_TRY(rl_buffer_ensure(&r->rpack, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
        float *d = rl_tensor_data(&r->rpack);
        if (j->backward)
            rl_gemm_pack_f32(d, j->R.p, P, true, P, H);
        else
            rl_gemm_pack_f32(d, j->R.p, P, false, H, P);
        j->rpack = d;
    }
    int parts = row_parts(j);
    if (parts > 1)
        rl_cpu_parallel(parts, steps_part, j);
    else
        steps_part(j, 0, 1);
    return RL_OK;
}

/* The gate columns below rec_gates H that no input block writes receive the recurrent product
 * alone: zero them before the steps. */
static void zero_rec_only_cols(const rl_recurrent *r, int64_t H, rl_dtype dt) {
    const rl_cell *c = r->cell;
    size_t es = rl_dtype_size(dt);
    int64_t G = c->gate_blocks * H;
    char *g0 = rl_tensor_data(&r->gates);
    for (int q = 0; q < c->rec_gates; q++) {
        bool written = false;
        for (int i = 0; i < c->n_in_blocks; i++)
            written = written ||
                      (q >= c->in_blocks[i].dst && q < c->in_blocks[i].dst + c->in_blocks[i].n);
        if (written) continue;
        for (int64_t row = 0; row < r->T * r->B; row++)
            memset(g0 + (size_t)(row * G + q * H) * es, 0, (size_t)H * es);
    }
}

/* A cell without CUDA launchers on CUDA tensors. */
static rl_status no_cuda_cell(const rl_layer *l, rl_device dev) {
    char d[32];
    rl_device_name(dev, d, sizeof d);
    return rl_error(RL_EDEVICE,
                    RL_LAYER_WHERE ": the inputs are on %s, and this cell has no CUDA kernels "
                                   "(run it on the CPU)",
                    l->name, l->ops->class_name, d);
}

/* The weight_dropout mask of a training forward: wdm (H, rec_gates H) = Bernoulli(1 - p) / (1 - p)
 * from io->rng, one per batch, and ud = U * wdm, which the steps multiply with. */
static rl_status weight_dropout_mask(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                     rl_dtype dt, rl_device dev) {
    if (r->ext_gates.storage)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option weight_dropout is not supported inside a rec unit "
                                       "(its step objects would draw a new mask at every step, "
                                       "not one per batch)",
                        l->name, r->cls);
    if (!io->rng)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": weight_dropout in training needs a random "
                                       "generator",
                        l->name, r->cls);
    const int64_t *shape = l->params[P_U].value.shape;
    RL_TRY(rl_buffer_ensure_synced(&r->wdm, dt, dev, 2, shape));
    RL_TRY(rl_buffer_ensure_synced(&r->ud, dt, dev, 2, shape));
    RL_TRY(rl_op_uniform(&r->wdm, io->rng, 0.0, 1.0));
    RL_TRY(rl_op_binary_scalar(&r->wdm, &r->wdm, r->wd, RL_BIN_GE, false));
    RL_TRY(rl_op_binary_scalar(&r->wdm, &r->wdm, 1.0 / (1.0 - r->wd), RL_BIN_MUL, false));
    return rl_op_binary(&r->ud, &l->params[P_U].value, &r->wdm, RL_BIN_MUL);
}

/* The params' values (or gradients) as matrices on the device; p[k] their data. */
static rl_status param_mats(rl_layer *l, bool grad, rl_dtype dt, rl_device dev, rl_mat *m,
                            const void **p) {
    for (int k = 0; k < l->n_params; k++) {
        char what[48];
        snprintf(what, sizeof what, grad ? "%s (gradient)" : "%s", l->params[k].name);
        RL_TRY(
            rl_param_mat(l, grad ? &l->params[k].grad : &l->params[k].value, what, dt, dev, &m[k]));
        p[k] = m[k].p;
    }
    for (int k = l->n_params; k < 4; k++)
        m[k] = (rl_mat){NULL, 0};
    return RL_OK;
}

/* The fields of a CUDA launcher's pass that forward and backward share. */
static rl_cell_pass cuda_pass(const rl_layer *l, rl_recurrent *r, rl_dtype dt, rl_device dev,
                              const void *U, const void *const *p) {
    rl_cell_pass ps = {.l = l,
                       .opt = r->cell_opt,
                       .stream = r->stream,
                       .dev = dev,
                       .dt = dt,
                       .T = r->T,
                       .B = r->B,
                       .H = r->H,
                       .direction = r->direction,
                       .len = rl_tensor_data(&r->len_dev),
                       .gates = rl_tensor_data(&r->gates),
                       .U = U,
                       .p = p};
    for (int i = 0; i < r->n_states; i++)
        ps.seq[i] = rl_tensor_data(&r->seqs[i]);
    for (int k = 0; k < r->n_frame; k++)
        ps.fb[k] = rl_tensor_data(&r->frame[k]);
    ps.P = l->n_out;
    if (r->rdropped) {
        ps.md = rl_tensor_data(&r->md);
        ps.hd = rl_tensor_data(&r->hd);
    }
    for (int i = 0; i < r->n_states && r->zoned; i++)
        ps.zo[i] = r->zo[i] > 0 ? rl_tensor_data(&r->zmask[i]) : NULL;
    for (int a = 0; a < r->cell->n_aux && r->zoned; a++)
        ps.aux[a] = rl_tensor_data(&r->aux[a]);
    if (r->p_proj) {
        ps.R = p[r->p_proj];
        ps.ms = rl_tensor_data(&r->ms);
        ps.mscr = rl_tensor_data(&r->mscr);
    }
    return ps;
}

rl_status rl_recurrent_forward(rl_layer *l, rl_layer_io *io) {
    rl_recurrent *r = rec_of(l);
    const rl_cell *c = r->cell;
    int64_t H = r->H, P = l->n_out;
    rl_dtype dt;
    rl_device dev;
    RL_TRY(rl_recurrent_forward_begin(r, l, io, &dt, &dev));
    bool zo = false;
    for (int i = 0; i < r->n_states; i++)
        zo = zo || r->zo[i] > 0;
    r->ran_cudnn =
        r->cudnn && dev.type == RL_CUDA && (!c->cudnn_fallback || rl_rnn_cudnn_serves(r, l));
    if (r->cudnn && !c->cudnn_fallback && dev.type != RL_CUDA)
        return rl_error(RL_EDEVICE,
                        RL_LAYER_WHERE ": impl = \"cudnn\" needs CUDA tensors, the inputs "
                                       "are on cpu (use impl = \"own\" on the CPU)",
                        l->name, r->cls);
    int64_t T = r->T, B = r->B, G = c->gate_blocks * H;
    rl_mat pm[RL_LAYER_MAX_PARAMS];
    const void *p[RL_LAYER_MAX_PARAMS];
    RL_TRY(param_mats(l, false, dt, dev, pm, p));
    rl_mat W = pm[P_W], U = pm[P_U];
    /* the state buffers hold the final state another layer may take as its initial state */
    const rl_tensor *written[RL_LAYER_MAX_STATES];
    for (int i = 0; i < r->n_states; i++)
        written[i] = &r->seqs[i];
    if (r->ran_cudnn) {
        bool two = r->n_states > 1;
        RL_TRY(rl_rnn_cudnn_forward(r->dnn, r, l, (rl_cudnn_cell)c->cudnn, r->direction, io, dt,
                                    dev, pm, &r->init[0], two ? &r->init[1] : NULL, &r->seqs[0],
                                    two ? &r->seqs[1] : NULL));
        return rl_recurrent_forward_end(r, l, 1, io->train, written, r->n_states);
    }
    if (dev.type != RL_CPU && !c->cuda_fwd) return no_cuda_cell(l, dev);

    int64_t gshape[3] = {T, B, G};
    RL_TRY(rl_recurrent_gates(r, l, &r->gates, dt, dev, gshape));
    for (int i = 0; i < r->n_states; i++) {
        int64_t sshape[3] = {T + 1, B, r->state_dims[i]};
        RL_TRY(rl_buffer_ensure_synced(&r->seqs[i], dt, dev, 3, sshape));
    }
    for (int k = 0; k < r->n_frame; k++) {
        int64_t fshape[3] = {T, B, r->frame_cols[k]};
        RL_TRY(rl_buffer_ensure_synced(&r->frame[k], dt, dev, 3, fshape));
    }
    /* the initial state rows (with n_proj m's too: a padded first frame carries it, and dR
     * reads it, so it must be finite) */
    for (int i = r->p_proj ? -1 : 0; i < r->n_states; i++) {
        rl_tensor row = {0};
        if (i < 0) {
            int64_t mshape[3] = {T + 1, B, H}, scr[2] = {B, H};
            RL_TRY(rl_buffer_ensure_synced(&r->ms, dt, dev, 3, mshape));
            RL_TRY(rl_buffer_ensure_synced(&r->mscr, dt, dev, 2, scr));
        }
        RL_TRY(rl_tensor_select(&row, i < 0 ? &r->ms : &r->seqs[i], 0, r->direction > 0 ? 0 : T));
        rl_status st = rl_recurrent_write_state(r, &row, i < 0 ? NULL : &r->init[i]);
        rl_tensor_release(&row);
        RL_TRY(st);
    }

    /* input projection of all frames: per input one GEMM per block of W's columns, accumulated
     * over the inputs */
    const int32_t *len = rl_tensor_data(io->lengths);
    bool ragged = false;
    for (int64_t i = 0; i < B; i++)
        ragged = ragged || len[i] < T;
    rl_mat Z = {rl_tensor_data(&r->gates), G};
    float *wpack = NULL;
    if (rl_recurrent_packed_inputs(r, dt, dev)) {
        RL_TRY(pack_inputs(r, l, false, W.p, &wpack));
    } else if (r->packs && r->packs->frozen && dt == RL_FLOAT32 && dev.type == RL_CPU &&
               rl_gemm_packed_fast()) {
        /* the owner of frozen packs packs W for the networks that adopt them (their few-row
         * input products: OpenBLAS would repack W at each) and keeps OpenBLAS's product itself,
         * whose numbers are rl.forward's */
        float *unused;
        RL_TRY(pack_inputs(r, l, false, W.p, &unused));
    }
    int64_t row = 0;
    bool first = true; /* no input's product in Z yet */
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        bool zero = rl_recurrent_zero_input(r, k); /* its products would add zeros */
        rl_mat X = {NULL, 0};
        if (!zero) RL_TRY(input_mat(r, l, io, k, ragged, &X));
        rl_mat Wk = rl_mat_sub(W, row, 0, dt);
        for (int i = 0; i < c->n_in_blocks; i++) {
            const rl_cell_block *b = &c->in_blocks[i];
            if (zero) {
                if (wpack) wpack += rl_gemm_packed_size(F, b->n * H);
            } else if (wpack) {
                rl_gemm_packed_f32(T * B, b->n * H, F, X.p, X.ld, wpack, !first,
                                   (float *)Z.p + b->dst * H, G);
                wpack += rl_gemm_packed_size(F, b->n * H);
            } else {
                RL_TRY(rl_mat_gemm(dev, r->stream, dt, false, false, T * B, b->n * H, F, X,
                                   cols(Wk, b->src * H, dt), first ? 0.0 : 1.0,
                                   cols(Z, b->dst * H, dt)));
            }
        }
        first = first && zero;
        row += F;
    }

    /* the masks, in the order their draws have always had (zoneout's from the last state to the
     * first, rec_dropout's before or after them as the cell says, then weight_dropout's) */
    r->zoned = zo;
    r->rdropped = io->train && r->rd > 0;
    for (int pass = 0; pass < 2; pass++) {
        if (r->rdropped && pass == (c->rec_dropout_first ? 0 : 1)) {
            int64_t dshape[3] = {T, B, P};
            RL_TRY(rl_recurrent_rec_dropout_mask(r, l, io, r->rd, &r->md, dt, dev));
            RL_TRY(rl_buffer_ensure_synced(&r->hd, dt, dev, 3, dshape));
        }
        if (zo && pass == (c->rec_dropout_first ? 1 : 0)) {
            int64_t zshape[3] = {T, B, H};
            for (int a = 0; a < c->n_aux; a++)
                RL_TRY(rl_buffer_ensure_synced(&r->aux[a], dt, dev, 3, zshape));
            for (int i = r->n_states - 1; i >= 0; i--)
                if (r->zo[i] > 0)
                    RL_TRY(rl_recurrent_zoneout_mask(r, l, io, r->zo[i], &r->zmask[i], dt, dev));
        }
    }
    r->wdropped = io->train && r->wd > 0;
    if (r->wdropped) {
        RL_TRY(weight_dropout_mask(r, l, io, dt, dev));
        U.p = rl_tensor_data(&r->ud);
    }
    if (dev.type == RL_CPU) {
        zero_rec_only_cols(r, H, dt);
        steps_job j = {.l = l,
                       .r = r,
                       .dt = dt,
                       .len = len,
                       .U = U,
                       .p = p,
                       .R = r->p_proj ? pm[r->p_proj] : (rl_mat){NULL, 0}};
        RL_TRY(run_steps(&j));
    } else {
        rl_cell_pass ps = cuda_pass(l, r, dt, dev, U.p, p);
        ps.out = rl_tensor_data(&l->out);
        RL_TRY(c->cuda_fwd(&ps));
    }
    return rl_recurrent_forward_end(r, l, r->direction > 0 ? T : 0, true, written, r->n_states);
}

/* The backward recurrence on the CPU, then over all frames the cell's sums and dU = Hprev^T dZ
 * (unless the caller makes the weight gradients, rl_recurrent_set_gates). */
static rl_status backward_steps_cpu(rl_layer *l, rl_recurrent *r, rl_dtype dt, const int32_t *len,
                                    rl_mat dout, rl_mat U, rl_mat R, const void *const *p,
                                    void *const *dp) {
    const rl_cell *c = r->cell;
    int64_t T = r->T, B = r->B, H = r->H, P = l->n_out;
    steps_job j = {.l = l,
                   .r = r,
                   .dt = dt,
                   .len = len,
                   .U = U,
                   .dout = dout,
                   .p = p,
                   .dp = dp,
                   .backward = true,
                   .R = r->p_proj ? R : (rl_mat){NULL, 0}};
    RL_TRY(run_steps(&j));
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1) */
    int64_t prev = r->direction > 0 ? 0 : B, cur = r->direction > 0 ? B : 0;
    rl_cell_sums s = {.l = l,
                      .opt = r->cell_opt,
                      .dt = dt,
                      .rows = T * B,
                      .H = H,
                      .g = rl_tensor_data(&r->gates),
                      .zoned = r->zoned,
                      .in_steps = !j.apart,
                      .p = p,
                      .dp = dp};
    for (int i = 0; i < r->n_states; i++) {
        s.prev[i] = at(&r->seqs[i], prev * r->state_dims[i]);
        s.cur[i] = at(&r->seqs[i], cur * r->state_dims[i]);
    }
    if (r->p_proj) {
        s.prev[0] = at(&r->ms, prev * H);
        s.cur[0] = at(&r->ms, cur * H);
    }
    for (int a = 0; a < c->n_aux && r->zoned; a++)
        s.aux[a] = rl_tensor_data(&r->aux[a]);
    for (int k = 0; k < r->n_frame; k++)
        s.fb[k] = rl_tensor_data(&r->frame[k]);
    c->sums(&s);
    if (r->p_proj) { /* each frame's m (rows cur) against its dLoss/dh (0 on padded rows) */
        rl_mat M = {at(&r->ms, cur * H), H}, D = {rl_tensor_data(&r->drs), P}, dR;
        RL_TRY(rl_param_mat(l, &l->params[r->p_proj].grad, "R (gradient)", dt, RL_DEVICE_CPU, &dR));
        RL_TRY(rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, true, false, H, P, T * B, M, D, 1.0, dR));
    }
    rl_mat Hprev = {at(&r->seqs[0], prev * P), P};
    if (r->rdropped) Hprev.p = rl_tensor_data(&r->hd); /* dU pairs dZ with what U multiplied */
    if (r->rec_apart) { /* dU from the recurrent part's gradients, also under a caller's gates */
        rl_mat dZH = {rl_tensor_data(&r->frame[1]), c->rec_gates * H};
        return u_grad(l, RL_DEVICE_CPU, dt, T * B, Hprev, dZH);
    }
    if (r->defer_fwd) return RL_OK;
    rl_mat dZ = {rl_tensor_data(&r->gates), c->gate_blocks * H};
    return weight_grad(l, RL_DEVICE_CPU, dt, -1, T * B, Hprev, dZ);
}

rl_status rl_recurrent_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                rl_tensor *const *grad_in) {
    rl_recurrent *r = rec_of(l);
    const rl_cell *c = r->cell;
    int64_t H = r->H, P = l->n_out;
    rl_dtype dt;
    rl_device dev;
    rl_mat dout;
    bool given_grad = false;
    for (int i = 0; i < r->n_states; i++)
        given_grad = given_grad || r->final_grad[i].storage;
    if (r->ran_cudnn && given_grad)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": impl = \"cudnn\" takes no final state gradients",
                        l->name, r->cls);
    RL_TRY(rl_recurrent_backward_begin(r, l, io, grad_out, grad_in, &dt, &dev, &dout));
    int64_t T = r->T, B = r->B, G = c->gate_blocks * H;
    rl_mat pm[RL_LAYER_MAX_PARAMS], gm[RL_LAYER_MAX_PARAMS];
    const void *p[RL_LAYER_MAX_PARAMS], *dpc[RL_LAYER_MAX_PARAMS];
    void *dp[RL_LAYER_MAX_PARAMS];
    RL_TRY(param_mats(l, false, dt, dev, pm, p));
    RL_TRY(param_mats(l, true, dt, dev, gm, dpc));
    for (int k = 0; k < l->n_params; k++)
        dp[k] = gm[k].p;
    rl_mat W = pm[P_W], U = pm[P_U];
    /* the initial state's gradients, read by whoever gave that state */
    const rl_tensor *written[RL_LAYER_MAX_STATES];
    for (int i = 0; i < r->n_states; i++)
        written[i] = &r->dstates[i];
    if (r->ran_cudnn) {
        RL_TRY(rl_rnn_cudnn_backward(r->dnn, r, l, io, grad_in, dt, dev, dout, gm, &r->dstates[0],
                                     r->n_states > 1 ? &r->dstates[1] : NULL));
        return rl_recurrent_backward_end(r, io, grad_in, written, r->n_states);
    }
    RL_TRY(rl_recurrent_start_state_grads(r, dt, dev));
    if (r->rdropped) {
        int64_t dshape[2] = {B, P};
        RL_TRY(rl_buffer_ensure_synced(&r->dtmp, dt, dev, 2, dshape));
    }
    if (r->p_proj) {
        int64_t dshape[3] = {T, B, P}, mshape[2] = {B, H};
        RL_TRY(rl_buffer_ensure_synced(&r->drs, dt, dev, 3, dshape));
        RL_TRY(rl_buffer_ensure_synced(&r->dm, dt, dev, 2, mshape));
    }
    if (r->wdropped) {
        RL_TRY(rl_buffer_ensure_synced(&r->dud, dt, dev, 2, l->params[P_U].value.shape));
        U.p = rl_tensor_data(&r->ud);
    }
    if (dev.type == RL_CPU) {
        RL_TRY(backward_steps_cpu(l, r, dt, rl_tensor_data(io->lengths), dout, U, pm[r->p_proj], p,
                                  dp));
    } else {
        rl_cell_pass ps = cuda_pass(l, r, dt, dev, U.p, p);
        ps.dout = dout.p;
        ps.dout_ld = dout.ld;
        ps.dp = dp;
        ps.dU = gm[P_U].p;
        ps.red = &r->red;
        if (r->rdropped) ps.dtmp = rl_tensor_data(&r->dtmp);
        if (r->wdropped) { /* the launcher's dU (+=) into dud, then dU += dud * mask */
            RL_TRY(rl_recurrent_write_state(r, &r->dud, NULL));
            ps.dU = rl_tensor_data(&r->dud);
        }
        for (int i = 0; i < r->n_states; i++)
            ps.dstate[i] = rl_tensor_data(&r->dstates[i]);
        if (r->p_proj) {
            ps.drs = rl_tensor_data(&r->drs);
            ps.dm = rl_tensor_data(&r->dm);
            ps.dR = dp[r->p_proj];
        }
        RL_TRY(c->cuda_bwd(&ps));
        if (r->wdropped)
            RL_TRY(stream_mask_add(r, dt, rl_tensor_numel(&r->dud), rl_tensor_data(&r->dud),
                                   rl_tensor_data(&r->wdm), gm[P_U].p));
    }

    /* weight gradients (unless the caller makes them over all steps) and input gradients:
     * GEMMs over all frames, one per block of W's columns */
    rl_mat dZ = {rl_tensor_data(&r->gates), G};
    float *wtpack = NULL;
    if (grad_in && rl_recurrent_packed_inputs(r, dt, dev))
        RL_TRY(pack_inputs(r, l, true, W.p, &wtpack));
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        rl_mat Wk = rl_mat_sub(W, row, 0, dt);
        /* a zero input's X^T dZ = 0; deferred: the caller's (rl_recurrent_set_gates) */
        if (!rl_recurrent_zero_input(r, k) && !r->defer_fwd) {
            rl_mat X = {NULL, 0};
            if (r->use_xs[k])
                X = (rl_mat){rl_tensor_data(&r->xs[k]), F};
            else
                (void)rl_mat_fold_tb(io->in[k], &X); /* it folded in forward */
            RL_TRY(weight_grad(l, dev, dt, k, T * B, X, dZ));
        }
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi) {
            rl_mat Gi;
            bool direct = rl_mat_fold_tb(gi, &Gi);
            if (!direct) {
                RL_TRY(rl_buffer_ensure_synced(&r->dxs[k], dt, dev, 3, gi->shape));
                Gi = (rl_mat){rl_tensor_data(&r->dxs[k]), F};
            }
            const float *wt = wtpack;
            for (int i = 0; i < c->n_in_blocks; i++) {
                const rl_cell_block *b = &c->in_blocks[i];
                if (wtpack) {
                    rl_gemm_packed_f32(T * B, F, b->n * H, (const float *)dZ.p + b->dst * H, G, wt,
                                       i > 0, Gi.p, Gi.ld);
                    wt += rl_gemm_packed_size(b->n * H, F);
                } else {
                    RL_TRY(rl_mat_gemm(dev, r->stream, dt, false, true, T * B, F, b->n * H,
                                       cols(dZ, b->dst * H, dt), cols(Wk, b->src * H, dt),
                                       i > 0 ? 1.0 : 0.0, Gi));
                }
            }
            if (!direct) RL_TRY(rl_op_copy(gi, &r->dxs[k]));
        }
        for (int i = 0; i < c->n_in_blocks && wtpack; i++)
            wtpack += rl_gemm_packed_size(c->in_blocks[i].n * H, F);
        row += F;
    }
    return rl_recurrent_backward_end(r, io, grad_in, written, r->n_states);
}

/* The cuDNN object runs on the layer's stream: it goes before the stream does. */
static void drop_stream_users(rl_recurrent *r) {
    if (r->dnn) rl_rnn_cudnn_drop(r->dnn);
}

void rl_recurrent_destroy(rl_layer *l) {
    rl_recurrent *r = rec_of(l);
    rl_recurrent_free(r); /* drops the cuDNN object, waits for and destroys the stream */
    if (r->dnn) rl_rnn_cudnn_free(r->dnn);
    free(r->dnn);
    rl_tensor *ts[] = {&r->gates, &r->red, &r->md,   &r->hd,  &r->dtmp, &r->wdm,  &r->ud,
                       &r->dud,   &r->ms,  &r->mscr, &r->drs, &r->dm,   &r->rpack};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++) {
        rl_tensor_release(&r->seqs[i]);
        rl_tensor_release(&r->dstates[i]);
        rl_tensor_release(&r->zmask[i]);
    }
    for (int a = 0; a < RL_CELL_MAX_AUX; a++)
        rl_tensor_release(&r->aux[a]);
    for (int k = 0; k < RL_CELL_MAX_FRAME; k++)
        rl_tensor_release(&r->frame[k]);
    for (int k = 0; k < RL_LAYER_MAX_INPUTS; k++) {
        rl_tensor_release(&r->xs[k]);
        rl_tensor_release(&r->dxs[k]);
    }
}

/* n_proj = P (1 <= P < n_out) in *P, or n_out without the option. */
static rl_status proj_option(const rl_options *o, const char *name, const char *cls, int64_t H,
                             bool cudnn, bool zoneout, int64_t *P) {
    int found = 0;
    double d = 0;
    RL_TRY(o->number(o->ctx, "n_proj", &d, &found));
    *P = H;
    if (!found) return RL_OK;
    if (d != floor(d) || d < 1 || d >= (double)H)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option n_proj = %g, expected an integer in 1..%" PRId64
                                       " (below n_out = %" PRId64 ")",
                        name, cls, d, H - 1, H);
    if (cudnn)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option n_proj and impl = \"cudnn\" do not go together "
                                       "(use impl = \"own\")",
                        name, cls);
    if (zoneout)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": options n_proj and zoneout do not go together (zoneout "
                                       "of a projected state is not implemented)",
                        name, cls);
    *P = (int64_t)d;
    return RL_OK;
}

rl_status rl_recurrent_add_proj(rl_layer *l) {
    rl_recurrent *r = rec_of(l);
    int64_t H = r->H, P = l->n_out, rs[2] = {H, P};
    if (P == H) return RL_OK;
    r->p_proj = l->n_params;
    return rl_layer_add_param(l, "R", 2, rs, RL_INIT_GLOROT, 1.0, H, P, NULL);
}

void rl_recurrent_rec_apart(rl_recurrent *r, int n, const int64_t *cols) {
    r->rec_apart = true;
    r->n_frame = n;
    for (int k = 0; k < n; k++)
        r->frame_cols[k] = cols[k];
}

/* Sanity bound on the parameter count: keeps every size computation far from overflow; a real
 * allocation of anything near it fails with a clear out-of-memory error first. */
#define RL_RECURRENT_MAX_PARAMS ((double)(1LL << 44))

rl_status rl_recurrent_create(rl_layer **out, const rl_cell *c, const char *name,
                              const rl_options *opts, int n_in, const int64_t *in_dims) {
    const char *cls = c->ops.class_name;
    int64_t H, dir;
    *out = NULL;
    if (n_in < 1) return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, cls);
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &H));
    RL_TRY(rl_opt_int(opts, name, "direction", 1, -1, false, &dir));
    if (dir != 1 && dir != -1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": direction = %" PRId64 ", expected 1 or -1", name,
                        cls, dir);
    bool cudnn = false;
    if (c->cudnn >= 0) RL_TRY(rl_rnn_cudnn_option(opts, name, cls, &cudnn));
    bool has_cell = c->n_states > 1 && strcmp(c->state_names[1], "c") == 0;
    double zc, zh, rd, wd;
    RL_TRY(rl_recurrent_zoneout_option(opts, name, cls, has_cell, cudnn, &zc, &zh));
    RL_TRY(rl_recurrent_rec_dropout_option(opts, name, cls, cudnn, &rd));
    RL_TRY(rl_recurrent_prob_option(opts, name, cls, "weight_dropout", &wd));
    if (cudnn && wd > 0)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option weight_dropout and impl = \"cudnn\" do not go "
                                       "together (use impl = \"own\")",
                        name, cls);
    int64_t P = H;
    if (c->proj) RL_TRY(proj_option(opts, name, cls, H, cudnn, zc > 0 || zh > 0, &P));
    double F = 0;
    for (int k = 0; k < n_in; k++) {
        if (in_dims[k] < 1)
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": input %d has %" PRId64 " features", name,
                            cls, k + 1, in_dims[k]);
        F += (double)in_dims[k];
    }
    int wb = w_blocks(c);
    double n_params = (F + (double)H + 2.0) * wb * (double)H;
    if (n_params > RL_RECURRENT_MAX_PARAMS)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": n_out = %" PRId64 " with %.0f input features needs "
                                       "%.3g parameters, more than the %.3g this layer supports",
                        name, cls, H, F, n_params, RL_RECURRENT_MAX_PARAMS);
    rl_layer *l;
    RL_TRY(rl_layer_alloc(&l, sizeof(rl_recurrent_layer), &c->ops, name, n_in, in_dims));
    rl_recurrent *r = rec_of(l);
    l->n_out = P;
    r->H = H;
    r->cell = c;
    r->cls = cls;
    r->direction = (int)dir;
    r->cudnn = cudnn;
    r->zo[0] = zh;
    if (has_cell) r->zo[1] = zc;
    r->rd = rd;
    r->wd = wd;
    r->on_stream_drop = drop_stream_users;
    r->weight_grad = weight_grad;
    r->n_states = c->n_states;
    for (int i = 0; i < c->n_states; i++) {
        r->state_names[i] = c->state_names[i];
        r->state_dims[i] = i == 0 ? P : H;
        r->seq[i] = &r->seqs[i];
        r->grad0[i] = &r->dstates[i];
    }
    r->gates_cols = c->gate_blocks * H;
    int64_t Fi = (int64_t)F, ws[2] = {Fi, wb * H}, us[2] = {P, c->rec_gates * H};
    rl_status st = RL_OK;
    if (cudnn && !(r->dnn = calloc(1, sizeof *r->dnn)))
        st = rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory", name, cls);
    if (st == RL_OK) st = rl_layer_add_param(l, "W", 2, ws, RL_INIT_GLOROT, 1.0, Fi, wb * H, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U", 2, us, RL_INIT_ORTHOGONAL, 1.0, P, c->rec_gates * H, NULL);
    if (st == RL_OK) st = c->create(l, opts, cudnn);
    if (st != RL_OK) {
        rl_layer_free(l);
        return st;
    }
    *out = l;
    return RL_OK;
}

/* The typed forms of the layer.h state calls (layers.h), for C callers that know the class. */
static rl_status typed(const rl_layer *l, const char *cls, const char *fn, const char *what) {
    if (!rl_recurrent_cell(l) || strcmp(l->ops->class_name, cls) != 0)
        return rl_error(RL_EARG, "%s: layer '%s' is not %s", fn, l ? l->name : "(null)", what);
    return RL_OK;
}

rl_status rl_lstm_set_initial_state(rl_layer *l, const rl_tensor *h0, const rl_tensor *c0) {
    RL_TRY(typed(l, "lstm", "rl_lstm_set_initial_state", "an lstm"));
    const rl_tensor *s[2] = {h0, c0};
    return rl_layer_set_initial_state(l, 2, s);
}

rl_status rl_lstm_set_final_state_grad(rl_layer *l, const rl_tensor *dh, const rl_tensor *dc) {
    RL_TRY(typed(l, "lstm", "rl_lstm_set_final_state_grad", "an lstm"));
    const rl_tensor *g[2] = {dh, dc};
    return rl_layer_set_final_state_grad(l, 2, g);
}

rl_status rl_lstm_final_state(rl_layer *l, rl_tensor *h, rl_tensor *c) {
    RL_TRY(typed(l, "lstm", "rl_lstm_final_state", "an lstm"));
    rl_tensor *out[2] = {h, c};
    return rl_layer_final_state(l, 2, out);
}

rl_status rl_lstm_initial_state_grad(rl_layer *l, rl_tensor *dh0, rl_tensor *dc0) {
    RL_TRY(typed(l, "lstm", "rl_lstm_initial_state_grad", "an lstm"));
    rl_tensor *out[2] = {dh0, dc0};
    return rl_layer_initial_state_grad(l, 2, out);
}

rl_status rl_gru_set_initial_state(rl_layer *l, const rl_tensor *h0) {
    RL_TRY(typed(l, "gru", "rl_gru_set_initial_state", "a gru"));
    return rl_layer_set_initial_state(l, 1, &h0);
}

rl_status rl_gru_set_final_state_grad(rl_layer *l, const rl_tensor *dh) {
    RL_TRY(typed(l, "gru", "rl_gru_set_final_state_grad", "a gru"));
    return rl_layer_set_final_state_grad(l, 1, &dh);
}

rl_status rl_gru_final_state(rl_layer *l, rl_tensor *h) {
    RL_TRY(typed(l, "gru", "rl_gru_final_state", "a gru"));
    return rl_layer_final_state(l, 1, &h);
}

rl_status rl_gru_initial_state_grad(rl_layer *l, rl_tensor *dh0) {
    RL_TRY(typed(l, "gru", "rl_gru_initial_state_grad", "a gru"));
    return rl_layer_initial_state_grad(l, 1, &dh0);
}
