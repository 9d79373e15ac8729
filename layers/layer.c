/* Helpers shared by every layer: allocation, parameter declaration and initialisation,
 * option reading, batch checks (see layer.h). */
#include "layer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/device.h"
#include "../kernels/ops.h"

rl_status rl_opt_number(const rl_options *o, const char *layer, const char *key, double def,
                        double *v) {
    int found = 0;
    *v = def;
    RL_TRY(o->number(o->ctx, key, v, &found));
    if (found && !isfinite(*v))
        return rl_error(RL_EARG, RL_LAYER_WHERE ": option %s must be a finite number", layer,
                        o->class_name, key);
    return RL_OK;
}

rl_status rl_opt_int(const rl_options *o, const char *layer, const char *key, int64_t def,
                     int64_t min, bool required, int64_t *v) {
    int found = 0;
    double d = (double)def;
    RL_TRY(o->number(o->ctx, key, &d, &found));
    if (!found && required)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": missing option %s", layer, o->class_name, key);
    if (d != floor(d) || d < (double)min || d > 1e15)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": option %s = %g must be an integer in %" PRId64 "..1e15",
                        layer, o->class_name, key, d, min);
    *v = (int64_t)d;
    return RL_OK;
}

rl_status rl_opt_pair(const rl_options *o, const char *layer, const char *key, int64_t def,
                      int64_t min, bool required, int64_t v[2]) {
    char k1[64], k2[64];
    snprintf(k1, sizeof k1, "%s[1]", key);
    snprintf(k2, sizeof k2, "%s[2]", key);
    RL_TRY(rl_opt_int(o, layer, k1, def, min, required, &v[0]));
    return rl_opt_int(o, layer, k2, v[0], min, false, &v[1]);
}

rl_status rl_opt_string(const rl_options *o, const char *layer, const char *key, const char *def,
                        const char **v) {
    int found = 0;
    *v = def;
    (void)layer;
    return o->string(o->ctx, key, v, &found);
}

rl_status rl_opt_bool(const rl_options *o, const char *layer, const char *key, bool def, bool *v) {
    int found = 0;
    *v = def;
    (void)layer;
    return o->boolean(o->ctx, key, v, &found);
}

rl_status rl_layer_alloc(rl_layer **out, size_t size, const rl_layer_ops *ops, const char *name,
                         int n_in, const int64_t *in_dims) {
    *out = NULL;
    if (n_in < 0 || n_in > RL_LAYER_MAX_INPUTS)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": %d inputs, at most %d are supported", name,
                        ops->class_name, n_in, RL_LAYER_MAX_INPUTS);
    if (strlen(name) >= RL_LAYER_NAME_MAX)
        return rl_error(RL_EARG, "layer name '%s' is longer than %d characters", name,
                        RL_LAYER_NAME_MAX - 1);
    rl_layer *l = calloc(1, size);
    if (!l) return rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory", name, ops->class_name);
    l->ops = ops;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->n_in = n_in;
    for (int i = 0; i < n_in; i++)
        l->in_dims[i] = in_dims[i];
    *out = l;
    return RL_OK;
}

rl_status rl_layer_add_param(rl_layer *l, const char *pname, int ndim, const int64_t *shape,
                             rl_init_kind init, double init_a, int64_t fan_in, int64_t fan_out,
                             int *index) {
    if (l->n_params == RL_LAYER_MAX_PARAMS)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": more than %d parameters", l->name,
                        l->ops->class_name, RL_LAYER_MAX_PARAMS);
    char what[160];
    snprintf(what, sizeof what, RL_LAYER_WHERE ": parameter %s", l->name, l->ops->class_name,
             pname);
    int64_t numel, total;
    RL_TRY(rl_shape_numel(what, ndim, shape, &numel));
    if (!rl_add_ok(rl_layer_num_params(l), numel, &total) || total > RL_MAX_NUMEL)
        return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": more than %" PRId64 " parameters", l->name,
                        l->ops->class_name, RL_MAX_NUMEL);
    rl_param *p = &l->params[l->n_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", pname);
    p->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        p->shape[d] = shape[d];
    p->init = init;
    p->init_a = init_a;
    p->fan_in = fan_in;
    p->fan_out = fan_out;
    if (index) *index = l->n_params;
    l->n_params++;
    return RL_OK;
}

int64_t rl_layer_num_params(const rl_layer *l) {
    int64_t n = 0;
    for (int i = 0; i < l->n_params; i++) {
        int64_t k = 1;
        for (int d = 0; d < l->params[i].ndim; d++)
            k *= l->params[i].shape[d];
        n += k;
    }
    return n;
}

bool rl_layer_input_sparse(const rl_layer *l, const rl_tensor *x) {
    return x && x->storage && x->ndim == 2 && x->dtype == RL_INT32 &&
           (rl_layer_class_flags(l->ops->class_name) & RL_LAYER_SPARSE_IN);
}

/* Every index of sparse input i on a valid frame within 0..in_dims[i]-1 (lengths checked). */
static rl_status check_indices(const rl_layer *l, int i, const rl_tensor *x, const rl_tensor *len) {
    if (rl_tensor_device(x).type != RL_CPU)
        return rl_error(RL_EDEVICE,
                        RL_LAYER_WHERE
                        ": sparse input %d (class indices) must be on the CPU for now",
                        l->name, l->ops->class_name, i + 1);
    const int32_t *xp = rl_tensor_data(x);
    const int32_t *lp = rl_tensor_data(len);
    int64_t V = l->in_dims[i];
    for (int64_t b = 0; b < x->shape[1]; b++)
        for (int64_t t = 0; t < lp[b * len->stride[0]]; t++) {
            int64_t v = xp[t * x->stride[0] + b * x->stride[1]];
            if (v < 0 || v >= V)
                return rl_error(RL_EARG,
                                RL_LAYER_WHERE ": class index %" PRId64 " at frame %" PRId64
                                               " of sequence %" PRId64 " is outside 0..%" PRId64,
                                l->name, l->ops->class_name, v, t + 1, b + 1, V - 1);
        }
    return RL_OK;
}

rl_status rl_layer_check_inputs(const rl_layer *l, const rl_layer_io *io, int64_t *T, int64_t *B) {
    char s[128];
    if (io->n_in != l->n_in)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": %d inputs given, %d expected", l->name,
                        l->ops->class_name, io->n_in, l->n_in);
    const rl_tensor *dense0 = NULL; /* the first dense input: dtype and device of the others */
    for (int i = 0; i < io->n_in; i++) {
        const rl_tensor *x = io->in[i];
        bool sparse = rl_layer_input_sparse(l, x);
        if (!x || !x->storage || (x->ndim != 3 && !sparse))
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": input %d must be a (T, B, %" PRId64
                                           ") tensor%s, got %s",
                            l->name, l->ops->class_name, i + 1, l->in_dims[i],
                            (rl_layer_class_flags(l->ops->class_name) & RL_LAYER_SPARSE_IN)
                                ? " or (T, B) int32 class indices"
                                : "",
                            x && x->storage ? rl_shape_str(x, s, sizeof s) : "nothing");
        if (!sparse && x->shape[2] != l->in_dims[i])
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": input %d has %" PRId64 " features, expected %" PRId64
                                           " (shape %s)",
                            l->name, l->ops->class_name, i + 1, x->shape[2], l->in_dims[i],
                            rl_shape_str(x, s, sizeof s));
        if (i > 0 && (x->shape[0] != io->in[0]->shape[0] || x->shape[1] != io->in[0]->shape[1]))
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": input %d is %s, input 1 is %s", l->name,
                            l->ops->class_name, i + 1, rl_tensor_describe(x, s, sizeof s),
                            rl_tensor_describe(io->in[0], s + 64, 64));
        if (sparse) continue;
        if (dense0 && (x->dtype != dense0->dtype ||
                       !rl_device_eq(rl_tensor_device(x), rl_tensor_device(dense0))))
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": input %d is %s, input 1 is %s", l->name,
                            l->ops->class_name, i + 1, rl_tensor_describe(x, s, sizeof s),
                            rl_tensor_describe(dense0, s + 64, 64));
        if (x->dtype == RL_INT32)
            return rl_error(RL_EDTYPE,
                            RL_LAYER_WHERE ": input %d is int32, expected float32 or "
                                           "float64",
                            l->name, l->ops->class_name, i + 1);
        if (!dense0) dense0 = x;
    }
    *T = io->n_in ? io->in[0]->shape[0] : 0;
    *B = io->n_in ? io->in[0]->shape[1] : 0;
    const rl_tensor *len = io->lengths;
    if (!len || !len->storage || len->ndim != 1 || len->dtype != RL_INT32 ||
        rl_tensor_device(len).type != RL_CPU || len->shape[0] != *B)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": lengths must be a CPU int32 tensor of shape "
                                       "(%" PRId64 ")",
                        l->name, l->ops->class_name, *B);
    for (int64_t b = 0; b < *B; b++) {
        int64_t v = (int64_t)rl_tensor_get(len, &b);
        if (v < 1 || v > *T)
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": lengths[%" PRId64 "] = %" PRId64
                                           " is outside 1..%" PRId64 " (T)",
                            l->name, l->ops->class_name, b + 1, v, *T);
    }
    for (int i = 0; i < io->n_in; i++)
        if (rl_layer_input_sparse(l, io->in[i])) RL_TRY(check_indices(l, i, io->in[i], len));
    return RL_OK;
}

rl_status rl_layer_compute_type(const rl_layer *l, const rl_layer_io *io, rl_dtype *dt,
                                rl_device *dev) {
    for (int i = 0; i < io->n_in; i++)
        if (!rl_layer_input_sparse(l, io->in[i])) {
            *dt = io->in[i]->dtype;
            *dev = rl_tensor_device(io->in[i]);
            return RL_OK;
        }
    if (l->n_params < 1 || !l->params[0].value.storage)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": parameters are not bound to a buffer", l->name,
                        l->ops->class_name);
    *dt = l->params[0].value.dtype;
    *dev = rl_tensor_device(&l->params[0].value);
    return RL_OK;
}

void rl_sparse_rows_add(rl_tensor *z, const rl_tensor *x, const rl_tensor *len, rl_tensor *W,
                        bool scatter) {
    int64_t T = x->shape[0], B = x->shape[1], D = W->shape[1];
    const int32_t *xp = rl_tensor_data(x);
    const int32_t *lp = rl_tensor_data(len);
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            if (t >= lp[b * len->stride[0]]) continue;
            int64_t v = xp[t * x->stride[0] + b * x->stride[1]];
            int64_t zr = (t * B + b) * z->stride[0], wr = v * W->stride[0];
            if (W->dtype == RL_FLOAT64) {
                double *zp = (double *)rl_tensor_data(z) + zr;
                double *wp = (double *)rl_tensor_data(W) + wr;
                for (int64_t j = 0; j < D; j++)
                    if (scatter)
                        wp[j * W->stride[1]] += zp[j * z->stride[1]];
                    else
                        zp[j * z->stride[1]] += wp[j * W->stride[1]];
            } else {
                float *zp = (float *)rl_tensor_data(z) + zr;
                float *wp = (float *)rl_tensor_data(W) + wr;
                for (int64_t j = 0; j < D; j++)
                    if (scatter)
                        wp[j * W->stride[1]] += zp[j * z->stride[1]];
                    else
                        zp[j * z->stride[1]] += wp[j * W->stride[1]];
            }
        }
}

rl_status rl_layer_check_inputs_2d(const rl_layer *l, const rl_layer_io *io, int64_t *H, int64_t *W,
                                   int64_t *B) {
    char s[128], s0[128];
    if (io->n_in != l->n_in || io->n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": %d inputs given, %d expected", l->name,
                        l->ops->class_name, io->n_in, l->n_in);
    const rl_tensor *x0 = io->in[0];
    for (int i = 0; i < io->n_in; i++) {
        const rl_tensor *x = io->in[i];
        if (!x || !x->storage || x->ndim != 4)
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": input %d must be an (H, W, B, %" PRId64
                                           ") image tensor, got %s",
                            l->name, l->ops->class_name, i + 1, l->in_dims[i],
                            x && x->storage ? rl_shape_str(x, s, sizeof s) : "nothing");
        if (x->shape[3] != l->in_dims[i])
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": input %d has %" PRId64 " features, expected %" PRId64
                                           " (shape %s)",
                            l->name, l->ops->class_name, i + 1, x->shape[3], l->in_dims[i],
                            rl_shape_str(x, s, sizeof s));
        if (x->dtype == RL_INT32)
            return rl_error(RL_EDTYPE,
                            RL_LAYER_WHERE ": input %d is int32, expected float32 or "
                                           "float64",
                            l->name, l->ops->class_name, i + 1);
        if (i > 0 && (x->shape[0] != x0->shape[0] || x->shape[1] != x0->shape[1] ||
                      x->shape[2] != x0->shape[2] || x->dtype != x0->dtype ||
                      !rl_device_eq(rl_tensor_device(x), rl_tensor_device(x0))))
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": input %d is %s, input 1 is %s", l->name,
                            l->ops->class_name, i + 1, rl_tensor_describe(x, s, sizeof s),
                            rl_tensor_describe(x0, s0, sizeof s0));
    }
    *H = x0->shape[0];
    *W = x0->shape[1];
    *B = x0->shape[2];
    const rl_tensor *sz = io->sizes;
    if (!sz || !sz->storage || sz->ndim != 2 || sz->shape[0] != *B || sz->shape[1] != 2 ||
        sz->dtype != RL_INT32 || rl_tensor_device(sz).type != RL_CPU)
        return rl_error(RL_ESHAPE,
                        RL_LAYER_WHERE ": sizes must be a CPU int32 tensor of shape (%" PRId64
                                       ", 2) (height, width per image)",
                        l->name, l->ops->class_name, *B);
    for (int64_t b = 0; b < *B; b++) {
        int64_t ih[2] = {b, 0}, iw[2] = {b, 1};
        int64_t h = (int64_t)rl_tensor_get(sz, ih), w = (int64_t)rl_tensor_get(sz, iw);
        if (h < 1 || h > *H || w < 1 || w > *W)
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": image %" PRId64 " has size %" PRId64 " x %" PRId64
                                           ", outside 1..%" PRId64 " x 1..%" PRId64,
                            l->name, l->ops->class_name, b + 1, h, w, *H, *W);
    }
    return RL_OK;
}

/* Orthonormalises the rows of each (r, w) block of the row-major (r, c) matrix m in place
 * (modified Gram-Schmidt over the block's rows); c must be a multiple of w, and r <= w.
 * Row i takes off its projection on each finished row j < i in turn, then is normalised. The
 * rows of a group of GS_GROUP take off the rows finished before the group side by side (their
 * sums are independent chains, which a core overlaps: an LSTM 650's four blocks took 5 s one
 * row at a time), then finish one after the other; each row's operations run in the same order
 * as one row at a time, so the bits are the same. */
#define GS_GROUP 8

static void normalise(double *ri, int64_t w) {
    double norm = 0;
    for (int64_t k = 0; k < w; k++)
        norm += ri[k] * ri[k];
    norm = sqrt(norm);
    for (int64_t k = 0; k < w; k++)
        ri[k] = norm > 0 ? ri[k] / norm : 0;
}

static void take_off(double *ri, const double *rj, int64_t w) {
    double dot = 0;
    for (int64_t k = 0; k < w; k++)
        dot += ri[k] * rj[k];
    for (int64_t k = 0; k < w; k++)
        ri[k] -= dot * rj[k];
}

static void orthogonalise(double *m, int64_t r, int64_t c, int64_t w) {
    for (int64_t blk = 0; blk + w <= c; blk += w) {
        for (int64_t i0 = 0; i0 < r; i0 += GS_GROUP) {
            int g = r - i0 < GS_GROUP ? (int)(r - i0) : GS_GROUP;
            double *rows[GS_GROUP];
            for (int q = 0; q < g; q++)
                rows[q] = m + (i0 + q) * c + blk;
            for (int64_t j = 0; j < i0; j++) {
                const double *rj = m + j * c + blk;
                if (g < GS_GROUP) {
                    for (int q = 0; q < g; q++)
                        take_off(rows[q], rj, w);
                    continue;
                }
                /* the group's sums in registers, not in memory, so that they overlap */
                double d0 = 0, d1 = 0, d2 = 0, d3 = 0, d4 = 0, d5 = 0, d6 = 0, d7 = 0;
                for (int64_t k = 0; k < w; k++) {
                    double x = rj[k];
                    d0 += rows[0][k] * x;
                    d1 += rows[1][k] * x;
                    d2 += rows[2][k] * x;
                    d3 += rows[3][k] * x;
                    d4 += rows[4][k] * x;
                    d5 += rows[5][k] * x;
                    d6 += rows[6][k] * x;
                    d7 += rows[7][k] * x;
                }
                for (int64_t k = 0; k < w; k++) {
                    double x = rj[k];
                    rows[0][k] -= d0 * x;
                    rows[1][k] -= d1 * x;
                    rows[2][k] -= d2 * x;
                    rows[3][k] -= d3 * x;
                    rows[4][k] -= d4 * x;
                    rows[5][k] -= d5 * x;
                    rows[6][k] -= d6 * x;
                    rows[7][k] -= d7 * x;
                }
            }
            for (int q = 0; q < g; q++) {
                for (int p = 0; p < q; p++)
                    take_off(rows[q], rows[p], w);
                normalise(rows[q], w);
            }
        }
    }
}

rl_status rl_param_init(rl_param *p, rl_rng *g) {
    rl_tensor *v = &p->value;
    switch (p->init) {
    case RL_INIT_ZEROS: return rl_op_fill(v, 0.0);
    case RL_INIT_CONSTANT: return rl_op_fill(v, p->init_a);
    case RL_INIT_UNIFORM: return rl_op_uniform(v, g, -p->init_a, p->init_a);
    case RL_INIT_NORMAL: return rl_op_normal(v, g, 0.0, p->init_a);
    case RL_INIT_GLOROT: {
        double fan = (double)(p->fan_in + p->fan_out);
        double s = p->init_a * sqrt(6.0 / (fan > 0 ? fan : 1.0));
        return rl_op_uniform(v, g, -s, s);
    }
    case RL_INIT_ORTHOGONAL: {
        /* square blocks where the columns are a multiple of the rows (an lstm's U, (H, 4H));
         * else whole rows, orthonormal (an lstm's U with n_proj, (P, 4H)) */
        if (v->ndim != 2 || v->shape[0] > v->shape[1])
            return rl_error(RL_ESHAPE, "orthogonal init of %s needs a (r, c) matrix, r <= c",
                            p->name);
        int64_t w = v->shape[1] % v->shape[0] == 0 ? v->shape[0] : v->shape[1];
        rl_tensor tmp = {0};
        RL_TRY(rl_tensor_empty(&tmp, RL_FLOAT64, RL_DEVICE_CPU, 2, v->shape));
        rl_status st = rl_op_normal(&tmp, g, 0.0, 1.0);
        if (st == RL_OK) {
            orthogonalise(rl_tensor_data(&tmp), v->shape[0], v->shape[1], w);
            if (p->init_a != 1.0 && p->init_a != 0.0)
                st = rl_op_binary_scalar(&tmp, &tmp, p->init_a, RL_BIN_MUL, false);
        }
        if (st == RL_OK) st = rl_op_copy(v, &tmp);
        rl_tensor_release(&tmp);
        return st;
    }
    }
    return rl_error(RL_EARG, "parameter %s: unknown init kind %d", p->name, (int)p->init);
}

rl_status rl_layer_check_device(const rl_layer *l, rl_device dev) {
    if (rl_device_check(dev) == RL_OK) return RL_OK;
    char why[256], dn[32];
    snprintf(why, sizeof why, "%s", rl_errmsg());
    rl_device_name(dev, dn, sizeof dn);
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": its input is on %s: %s", l->name,
                    l->ops->class_name, dn, why);
}

rl_status rl_layer_grow_index(const rl_layer *l, int64_t **p, size_t *cap, size_t n) {
    if (n <= *cap) return RL_OK;
    int64_t *m = realloc(*p, n * sizeof *m);
    if (!m)
        return rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory for %zu index entries", l->name,
                        l->ops->class_name, n);
    *p = m;
    *cap = n;
    return RL_OK;
}

rl_status rl_layer_concat_inputs(const rl_layer *l, const rl_layer_io *io, rl_tensor *out) {
    int64_t off = 0;
    for (int i = 0; i < io->n_in; i++) {
        rl_tensor part = {0};
        RL_TRY(rl_tensor_narrow(&part, out, 2, off, l->in_dims[i]));
        rl_status st = rl_op_copy(&part, io->in[i]);
        rl_tensor_release(&part);
        RL_TRY(st);
        off += l->in_dims[i];
    }
    return RL_OK;
}

rl_status rl_layer_split_grad(const rl_layer *l, const rl_tensor *grad_out,
                              rl_tensor *const *grad_in) {
    int64_t off = 0;
    for (int i = 0; i < l->n_in; i++) {
        if (grad_in[i]) {
            rl_tensor part = {0};
            RL_TRY(rl_tensor_narrow(&part, grad_out, 2, off, l->in_dims[i]));
            rl_status st = rl_op_copy(grad_in[i], &part);
            rl_tensor_release(&part);
            RL_TRY(st);
        }
        off += l->in_dims[i];
    }
    return RL_OK;
}

rl_status rl_layer_init_params(rl_layer *l, rl_rng *g) {
    for (int i = 0; i < l->n_params; i++) {
        if (!l->params[i].value.storage)
            return rl_error(RL_EARG, RL_LAYER_WHERE ": parameter %s is not bound", l->name,
                            l->ops->class_name, l->params[i].name);
        RL_TRY(rl_param_init(&l->params[i], g));
    }
    return l->ops->init_params ? l->ops->init_params(l, g) : RL_OK;
}

int rl_layer_find_param(const rl_layer *l, const char *pname) {
    for (int i = 0; i < l->n_params; i++)
        if (strcmp(l->params[i].name, pname) == 0) return i;
    return -1;
}

void rl_layer_free(rl_layer *l) {
    if (!l) return;
    if (l->ops && l->ops->destroy) l->ops->destroy(l);
    for (int i = 0; i < l->n_params; i++) {
        rl_tensor_release(&l->params[i].value);
        rl_tensor_release(&l->params[i].grad);
    }
    rl_tensor_release(&l->out);
    free(l);
}

/* ---------------------------------------------------------------- recurrent state */

int rl_layer_state_info(const rl_layer *l, const char *const **names, const int64_t **dims) {
    const char *const *nm = NULL;
    const int64_t *d = NULL;
    int n = l && l->ops->state ? l->ops->state->info(l, &nm, &d) : 0;
    if (names) *names = nm;
    if (dims) *dims = d;
    return n;
}

/* The layer's number of states when it has state and n fits it; else an error naming fn. */
static rl_status state_call(const rl_layer *l, const char *fn, int n) {
    const char *const *names;
    if (!l) return rl_error(RL_EARG, "%s: no layer", fn);
    int have = rl_layer_state_info(l, &names, NULL);
    if (have == 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": %s: the layer has no recurrent state", l->name,
                        l->ops->class_name, fn);
    if (n < 0 || n > have) {
        char list[128] = "";
        size_t used = 0;
        for (int i = 0; i < have && used < sizeof list; i++)
            used +=
                (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
        return rl_error(RL_EARG, RL_LAYER_WHERE ": %s: the layer has %d state%s (%s), got %d",
                        l->name, l->ops->class_name, fn, have, have == 1 ? "" : "s", list, n);
    }
    return RL_OK;
}

rl_status rl_layer_set_initial_state(rl_layer *l, int n, const rl_tensor *const *s) {
    const rl_tensor *a[RL_LAYER_MAX_STATES];
    RL_TRY(state_call(l, "set_initial_state", n));
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++) /* the states beyond n: NULL */
        a[i] = i < n ? s[i] : NULL;
    return l->ops->state->set_initial(l, a);
}

rl_status rl_layer_set_final_state_grad(rl_layer *l, int n, const rl_tensor *const *g) {
    const rl_tensor *a[RL_LAYER_MAX_STATES];
    RL_TRY(state_call(l, "set_final_state_grad", n));
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++)
        a[i] = i < n ? g[i] : NULL;
    return l->ops->state->set_final_grad(l, a);
}

rl_status rl_layer_final_state(rl_layer *l, int n, rl_tensor *const *out) {
    rl_tensor *a[RL_LAYER_MAX_STATES];
    RL_TRY(state_call(l, "final_state", n));
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++)
        a[i] = i < n ? out[i] : NULL;
    return l->ops->state->final(l, a);
}

rl_status rl_layer_initial_state_grad(rl_layer *l, int n, rl_tensor *const *out) {
    rl_tensor *a[RL_LAYER_MAX_STATES];
    RL_TRY(state_call(l, "initial_state_grad", n));
    for (int i = 0; i < RL_LAYER_MAX_STATES; i++)
        a[i] = i < n ? out[i] : NULL;
    return l->ops->state->initial_grad(l, a);
}
