/* The recurrent layers' shared plumbing (API: layers/recurrent.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "recurrent.h"

#include "../kernels/cpu/gemm_small.h"
#include "../kernels/ops.h"
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/context.h"
#endif

/* Whether the layer can run on dev; on CUDA, makes sure it has its stream there. */
static rl_status use_device(rl_recurrent *r, const rl_layer *l, rl_device dev) {
#ifdef RL_WITH_CUDA
    if (r->stream && (dev.type != RL_CUDA || r->stream_dev != dev.index)) {
        /* what is bound to the stream goes first, then the stream, whose queued work may still
         * use the buffers about to be released or regrown */
        if (r->on_stream_drop) r->on_stream_drop(r);
        RL_TRY(rl_cuda_stream_sync(r->stream));
        rl_cuda_stream_destroy(r->stream);
        r->stream = NULL;
    }
    if (dev.type == RL_CUDA) {
        if (!r->stream) {
            RL_TRY(rl_cuda_stream_create(dev.index, &r->stream));
            r->stream_dev = dev.index;
        }
        return RL_OK;
    }
#endif
    if (dev.type == RL_CPU) return RL_OK;
    char d[32];
    rl_device_name(dev, d, sizeof d);
    return rl_error(RL_EDEVICE, "layer '%s' (%s): tensors on %s are not supported by this build",
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
            "layer '%s' (%s): %s %s is %s, expected (%" PRId64 ", %" PRId64 ") for this batch",
            l->name, r->cls, what, r->state_names[i], rl_shape_str(t, buf, sizeof buf), B, H);
    if (!rl_device_eq(rl_tensor_device(t), dev)) {
        rl_device_name(dev, d, sizeof d);
        return rl_error(
            RL_EDEVICE, "layer '%s' (%s): %s %s is %s, expected it on %s (the inputs' device)",
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

#ifdef RL_WITH_CUDA
/* The stream waits for the writers of the n tensors and of the given states ts (CUDA only). */
static rl_status wait_for(rl_recurrent *r, rl_device dev, const rl_tensor *const *ts, int n,
                          const rl_tensor *states) {
    if (dev.type != RL_CUDA) return RL_OK;
    const rl_tensor *rd[2 * RL_LAYER_MAX_INPUTS + RL_LAYER_MAX_STATES];
    int m = 0;
    for (int k = 0; k < n && m < (int)(sizeof rd / sizeof rd[0]); k++)
        rd[m++] = ts[k];
    for (int k = 0; k < r->n_states && m < (int)(sizeof rd / sizeof rd[0]); k++)
        rd[m++] = &states[k];
    return rl_cuda_stream_wait_for(r->stream, rd, m);
}
#endif

rl_status rl_recurrent_forward_begin(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                     rl_dtype *dt, rl_device *dev) {
    int64_t T, B;
    RL_TRY(rl_layer_check_inputs(l, io, &T, &B));
    if (!rl_tensor_is_contiguous(io->lengths))
        return rl_error(RL_ESHAPE, "layer '%s' (%s): lengths must be contiguous", l->name, r->cls);
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
#ifdef RL_WITH_CUDA
    RL_TRY(wait_for(r, *dev, (const rl_tensor *const *)io->in, io->n_in, r->init));
#endif
    r->T = T;
    r->B = B;
    r->have_forward = r->trained = r->have_state = false;
    /* with every input zero nothing would write the input projection: then none is skipped */
    uint32_t all = (uint32_t)((1ull << io->n_in) - 1);
    r->zero_fwd = (r->zero_inputs & all) == all ? 0 : r->zero_inputs & all;
    int64_t oshape[3] = {T, B, l->n_out};
    RL_TRY(rl_buffer_ensure_synced(&l->out, *dt, *dev, 3, oshape));
#ifdef RL_WITH_CUDA
    if (dev->type == RL_CUDA) {
        RL_TRY(rl_buffer_ensure_synced(&r->len_dev, RL_INT32, *dev, 1, &B));
        RL_TRY(rl_cuda_set_lengths(r->stream, rl_tensor_data(&r->len_dev),
                                   rl_tensor_data(io->lengths), B));
    }
#endif
    return RL_OK;
}

rl_status rl_recurrent_forward_end(rl_recurrent *r, rl_layer *l, int64_t last_row, bool trained,
                                   const rl_tensor *const *written, int n) {
    r->last_row = last_row;
    r->have_forward = r->have_state = true;
    r->trained = trained;
#ifdef RL_WITH_CUDA
    const rl_tensor *wr[8] = {&l->out};
    int m = 1;
    for (int k = 0; k < n && m < 8; k++)
        wr[m++] = written[k];
    return rl_cuda_stream_wrote(r->stream, wr, m);
#else
    (void)l, (void)written, (void)n;
    return RL_OK;
#endif
}

/* Backward must see the batch forward saw (it reads the inputs and, on the CPU, the lengths). */
static rl_status check_backward_io(const rl_recurrent *r, const rl_layer *l, const rl_layer_io *io,
                                   rl_dtype dt, rl_device dev) {
    char s[96];
    if (io->n_in != l->n_in)
        return rl_error(RL_EARG, "layer '%s' (%s): backward got %d inputs, expected %d", l->name,
                        r->cls, io->n_in, l->n_in);
    for (int k = 0; k < io->n_in; k++) {
        const rl_tensor *x = io->in[k];
        if (!x || !x->storage || x->ndim != 3 || x->shape[0] != r->T || x->shape[1] != r->B ||
            x->shape[2] != l->in_dims[k] || x->dtype != dt ||
            !rl_device_eq(rl_tensor_device(x), dev))
            return rl_error(RL_ESHAPE,
                            "layer '%s' (%s): backward's input %d is %s, not the forward's "
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
                        "layer '%s' (%s): backward needs the forward's lengths, a CPU int32 "
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
        return rl_error(RL_EARG, "layer '%s' (%s): backward without a forward", l->name, r->cls);
    if (!r->trained)
        return rl_error(RL_EARG,
                        "layer '%s' (%s): backward after a forward with train = false "
                        "(impl = \"cudnn\" keeps nothing for backward then)",
                        l->name, r->cls);
    *dt = l->out.dtype;
    *dev = rl_tensor_device(&l->out);
    RL_TRY(check_backward_io(r, l, io, *dt, *dev));
#ifdef RL_WITH_CUDA
    if (dev->type == RL_CUDA) {
        /* grad_out's writer, the given states', and earlier writers of grad_in (overwritten) */
        const rl_tensor *rd[RL_LAYER_MAX_INPUTS + 1];
        int n = 0;
        rd[n++] = grad_out;
        for (int k = 0; k < io->n_in && grad_in; k++)
            rd[n++] = grad_in[k];
        RL_TRY(wait_for(r, *dev, rd, n, r->final_grad));
    }
#endif
    *dout = (rl_mat){NULL, 0};
    if (grad_out) {
        if (grad_out->ndim != 3 || grad_out->shape[0] != T || grad_out->shape[1] != B ||
            grad_out->shape[2] != H || grad_out->dtype != *dt ||
            !rl_device_eq(rl_tensor_device(grad_out), *dev))
            return rl_error(RL_ESHAPE,
                            "layer '%s' (%s): grad_out is %s, expected (%" PRId64 ", %" PRId64
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
            return rl_error(RL_ESHAPE, "layer '%s' (%s): grad_in[%d] is %s, expected %s", l->name,
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
#ifdef RL_WITH_CUDA
    const rl_tensor *wr[RL_LAYER_MAX_INPUTS + 4];
    int m = 0;
    for (int k = 0; k < io->n_in && grad_in; k++)
        wr[m++] = grad_in[k];
    for (int k = 0; k < n && k < 4; k++)
        wr[m++] = written[k];
    return rl_cuda_stream_wrote(r->stream, wr, m);
#else
    (void)r, (void)io, (void)grad_in, (void)written, (void)n;
    return RL_OK;
#endif
}

rl_status rl_recurrent_write_state(const rl_recurrent *r, rl_tensor *dst, const rl_tensor *src) {
    if (src && !src->storage) src = NULL;
#ifdef RL_WITH_CUDA
    if (rl_tensor_device(dst).type == RL_CUDA) {
        size_t bytes = (size_t)rl_tensor_numel(dst) * rl_dtype_size(dst->dtype);
        if (!src) return rl_cuda_zero(r->stream, rl_tensor_data(dst), bytes);
        if (src->dtype == dst->dtype && rl_tensor_is_contiguous(src))
            return rl_cuda_copy_rows(r->stream, rl_tensor_data(dst), bytes, rl_tensor_data(src),
                                     bytes, bytes, 1);
    }
#else
    (void)r;
#endif
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
                RL_ESHAPE, "layer '%s' (%s): %s %s must be a float (B, %" PRId64 ") tensor, got %s",
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
        return rl_error(RL_EARG, "initial_state_grad: layer '%s' (%s) has run no backward", l->name,
                        r->cls);
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

/* refs: the layer objects sharing them. pass: 0 (pack at every call, all kinds into slot
 * RL_PACK_U) or the rec layer's current pass; a slot is fresh when it was packed in that pass.
 * count: operands packed so far. */
typedef struct rl_packs {
    int refs;
    uint64_t pass, count;
    rl_tensor buf[RL_PACK_KINDS];
    uint64_t packed_in[RL_PACK_KINDS];
} rl_packs;

static void packs_release(rl_packs *P) {
    if (!P || --P->refs > 0) return;
    for (int k = 0; k < RL_PACK_KINDS; k++)
        rl_tensor_release(&P->buf[k]);
    free(P);
}

static rl_status packs_of(rl_recurrent *r, const rl_layer *l, rl_packs **P) {
    if (!r->packs) {
        r->packs = calloc(1, sizeof *r->packs);
        if (!r->packs)
            return rl_error(RL_ENOMEM, "layer '%s' (%s): out of memory", l->name, r->cls);
        r->packs->refs = 1;
    }
    *P = r->packs;
    return RL_OK;
}

rl_status rl_recurrent_pack_slot(rl_recurrent *r, const rl_layer *l, int kind, int64_t n,
                                 float **dst, bool *stale) {
    rl_packs *P = NULL;
    RL_TRY(packs_of(r, l, &P));
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
    return r->packs && r->packs->pass && dt == RL_FLOAT32 && dev.type == RL_CPU &&
           rl_gemm_packed_fast();
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
        return rl_error(RL_EARG, "%s: layer '%s' (%s) is not a recurrent layer", fn,
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
    P->refs++;
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
                        "layer '%s' (%s): the gates buffer given with rl_recurrent_set_gates is "
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
                        "%s: layer '%s': %s is %s, expected a contiguous float CPU tensor of rows "
                        "of %" PRId64,
                        fn, l->name, what,
                        t && t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing", cols);
    *n = rl_tensor_numel(t) / cols;
    return RL_OK;
}

rl_status rl_recurrent_weight_grads(rl_layer *l, int k, const rl_tensor *x, const rl_tensor *dz) {
    const char *fn = "rl_recurrent_weight_grads";
    rl_recurrent *r = NULL;
    RL_TRY(recurrent_of(l, fn, &r));
    if (k < -1 || k >= l->n_in)
        return rl_error(RL_EARG, "%s: layer '%s' has %d inputs, k = %d names none (-1: U)", fn,
                        l->name, l->n_in, k);
    int64_t F = k < 0 ? l->n_out : l->in_dims[k], nx, nz;
    RL_TRY(rows_of(l, fn, k < 0 ? "x (the previous states)" : "x", x, F, &nx));
    RL_TRY(rows_of(l, fn, "dz", dz, r->gates_cols, &nz));
    if (nx != nz || x->dtype != dz->dtype)
        return rl_error(RL_ESHAPE,
                        "%s: layer '%s': x has %" PRId64 " rows of %s, dz %" PRId64
                        " rows of %s; expected the same rows and dtype",
                        fn, l->name, nx, rl_dtype_name(x->dtype), nz, rl_dtype_name(dz->dtype));
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
                        "layer '%s' (%s): option %s = %g, expected a probability in [0, 1)", name,
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
                        "layer '%s' (%s): option zoneout and impl = \"cudnn\" do not go together "
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
        return rl_error(RL_EARG, "layer '%s' (%s): zoneout in training needs a random generator",
                        l->name, r->cls);
    RL_TRY(rl_op_uniform(mask, io->rng, 0.0, 1.0));
    return rl_op_binary_scalar(mask, mask, z, RL_BIN_LT, false);
}

rl_status rl_recurrent_rec_dropout_option(const rl_options *o, const char *name, const char *cls,
                                          bool cudnn, double *p) {
    RL_TRY(rl_recurrent_prob_option(o, name, cls, "rec_dropout", p));
    if (cudnn && *p > 0)
        return rl_error(RL_EARG,
                        "layer '%s' (%s): option rec_dropout and impl = \"cudnn\" do not go "
                        "together (cuDNN's cells have no recurrent dropout; use impl = \"own\")",
                        name, cls);
    return RL_OK;
}

rl_status rl_recurrent_rec_dropout_mask(const rl_recurrent *r, const rl_layer *l,
                                        const rl_layer_io *io, double p, rl_tensor *mask,
                                        rl_dtype dt, rl_device dev) {
    if (r->ext_gates.storage)
        return rl_error(RL_EARG,
                        "layer '%s' (%s): option rec_dropout is not supported inside a rec unit "
                        "(its step objects would draw a new mask at every step, not one per "
                        "sequence)",
                        l->name, r->cls);
    if (!io->rng)
        return rl_error(RL_EARG,
                        "layer '%s' (%s): rec_dropout in training needs a random generator",
                        l->name, r->cls);
    int64_t shape[2] = {r->B, r->state_dims[0]};
    RL_TRY(rl_buffer_ensure_synced(mask, dt, dev, 2, shape));
    RL_TRY(rl_op_uniform(mask, io->rng, 0.0, 1.0));
    RL_TRY(rl_op_binary_scalar(mask, mask, p, RL_BIN_GE, false));
    return rl_op_binary_scalar(mask, mask, 1.0 / (1.0 - p), RL_BIN_MUL, false);
}

void rl_recurrent_mask_rows(rl_dtype dt, int64_t n, int64_t H, const void *src, const void *mask,
                            void *dst, bool accumulate) {
    int64_t m = n * H;
    if (dt == RL_FLOAT32) {
        const float *restrict a = src, *restrict k = mask;
        float *restrict d = dst;
        if (accumulate)
            for (int64_t i = 0; i < m; i++)
                d[i] += a[i] * k[i];
        else
            for (int64_t i = 0; i < m; i++)
                d[i] = a[i] * k[i];
    } else {
        const double *restrict a = src, *restrict k = mask;
        double *restrict d = dst;
        if (accumulate)
            for (int64_t i = 0; i < m; i++)
                d[i] += a[i] * k[i];
        else
            for (int64_t i = 0; i < m; i++)
                d[i] = a[i] * k[i];
    }
}

rl_status rl_recurrent_cpu_only(const rl_recurrent *r, const rl_layer *l, rl_device dev,
                                const char *what) {
    if (dev.type == RL_CPU) return RL_OK;
    char d[32];
    rl_device_name(dev, d, sizeof d);
    return rl_error(RL_EDEVICE,
                    "layer '%s' (%s): option %s runs in the CPU's fused passes only; the inputs "
                    "are on %s (the CUDA kernels do not take it)",
                    l->name, r->cls, what, d);
}

void rl_recurrent_free(rl_recurrent *r) {
#ifdef RL_WITH_CUDA
    if (r->stream) {
        if (r->on_stream_drop) r->on_stream_drop(r);
        /* a failure here has no one to report to (the message stays in rl_errmsg) */
        (void)rl_cuda_stream_sync(r->stream);
        rl_cuda_stream_destroy(r->stream);
        r->stream = NULL;
    }
#endif
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
