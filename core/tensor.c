/* Storage, views and their geometry (see tensor.h). No math here: kernels/ops.h does that. */
#include "tensor.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* Host buffers are aligned for AVX-512 loads. */
#define RL_CPU_ALIGN 64

size_t rl_dtype_size(rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return 4;
    case RL_FLOAT64: return 8;
    case RL_INT32: return 4;
    default: return 0;
    }
}

const char *rl_dtype_name(rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return "float32";
    case RL_FLOAT64: return "float64";
    case RL_INT32: return "int32";
    default: return "?";
    }
}

rl_status rl_dtype_parse(const char *name, rl_dtype *out) {
    static const struct {
        const char *name;
        rl_dtype dt;
    } names[] = {{"float32", RL_FLOAT32}, {"float", RL_FLOAT32}, {"float64", RL_FLOAT64},
                 {"double", RL_FLOAT64},  {"int32", RL_INT32},   {"int", RL_INT32}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dt;
            return RL_OK;
        }
    }
    return rl_error(RL_EARG, "unknown dtype '%s' (expected float32, float64 or int32)", name);
}

bool rl_device_eq(rl_device a, rl_device b) {
    return a.type == b.type && (a.type == RL_CPU || a.index == b.index);
}

rl_status rl_device_parse(const char *name, rl_device *out) {
    if (strcmp(name, "cpu") == 0) {
        *out = RL_DEVICE_CPU;
        return RL_OK;
    }
    if (strcmp(name, "cuda") == 0) {
        *out = (rl_device){RL_CUDA, 0};
        return RL_OK;
    }
    if (strncmp(name, "cuda:", 5) == 0 && name[5] >= '0' && name[5] <= '9') {
        char *end;
        long idx = strtol(name + 5, &end, 10);
        if (*end == '\0' && idx < 1024) {
            *out = (rl_device){RL_CUDA, (int)idx};
            return RL_OK;
        }
    }
    return rl_error(RL_EARG, "unknown device '%s' (expected cpu, cuda or cuda:N)", name);
}

void rl_device_name(rl_device d, char *buf, size_t n) {
    if (d.type == RL_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", d.index);
}

/* Atomic: storages are made and freed on data loader and server threads too. */
static _Atomic int64_t storage_live_bytes;

int64_t rl_storage_live_bytes(void) { return atomic_load(&storage_live_bytes); }

static _Atomic uint64_t storage_versions;

void rl_storage_touch(rl_storage *s) {
    __atomic_store_n(&s->version, atomic_fetch_add(&storage_versions, 1) + 1, __ATOMIC_RELEASE);
}

uint64_t rl_storage_version(const rl_storage *s) {
    return __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
}

rl_status rl_storage_new(rl_storage **out, size_t nbytes, rl_device dev) {
    *out = NULL;
    RL_TRY(rl_device_check(dev));
    rl_storage *s = calloc(1, sizeof *s);
    if (!s) return rl_error(RL_ENOMEM, "out of host memory for a storage header");
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = dev;
    rl_storage_touch(s);
    if (dev.type == RL_CPU) {
        /* aligned_alloc needs a size that is a multiple of the alignment, and never 0 */
        size_t padded = (nbytes + RL_CPU_ALIGN - 1) / RL_CPU_ALIGN * RL_CPU_ALIGN;
        s->data = aligned_alloc(RL_CPU_ALIGN, padded ? padded : RL_CPU_ALIGN);
        if (!s->data) {
            free(s);
            return rl_error(RL_ENOMEM, "out of host memory allocating %zu bytes", nbytes);
        }
    } else {
        rl_status st = rl_device_cuda_backend()->alloc(dev.index, nbytes, &s->data);
        if (st != RL_OK) {
            free(s);
            return st;
        }
    }
    atomic_fetch_add(&storage_live_bytes, (int64_t)nbytes);
    *out = s;
    return RL_OK;
}

/* Atomic: the C API's sessions share their model's parameter storage from threads of their own
 * (lua/capi.c), each retaining and releasing it. */
void rl_storage_retain(rl_storage *s) {
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void rl_storage_release(rl_storage *s) {
    if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    atomic_fetch_sub(&storage_live_bytes, (int64_t)s->nbytes);
    if (s->device.type == RL_CPU)
        free(s->data);
    else if (s->data)
        rl_device_cuda_backend()->free(s->device.index, s->data, s->nbytes);
    free(s);
}

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (used < n) snprintf(buf + used, n - used, ")");
    return buf;
}

void rl_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = acc;
        acc *= shape[d] > 0 ? shape[d] : 1;
    }
}

rl_status rl_shape_numel(const char *what, int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > RL_MAX_DIMS)
        return rl_error(RL_ESHAPE, "%s: %d dims requested, at most %d are supported", what, ndim,
                        RL_MAX_DIMS);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return rl_error(RL_ESHAPE, "%s: negative size %" PRId64 " in dim %d", what, shape[d],
                            d + 1);
    }
    for (int d = 0; d < ndim; d++) {
        if (!rl_mul_ok(n, shape[d], &n) || n > RL_MAX_NUMEL) {
            char s[160];
            return rl_error(RL_ESHAPE, "%s: shape %s has more than %" PRId64 " elements", what,
                            shape_text(ndim, shape, s, sizeof s), RL_MAX_NUMEL);
        }
    }
    *numel = n;
    return RL_OK;
}

rl_status rl_tensor_empty(rl_tensor *out, rl_dtype dt, rl_device dev, int ndim,
                          const int64_t *shape) {
    memset(out, 0, sizeof *out);
    if ((unsigned)dt >= RL_NUM_DTYPES)
        return rl_error(RL_EDTYPE, "empty: invalid dtype %d", (int)dt);
    int64_t n = 0;
    RL_TRY(rl_shape_numel("empty", ndim, shape, &n));
    rl_storage *s;
    RL_TRY(rl_storage_new(&s, (size_t)n * rl_dtype_size(dt), dev));
    out->storage = s;
    out->dtype = dt;
    out->ndim = ndim;
    if (ndim > 0) memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
    rl_contiguous_strides(ndim, out->shape, out->stride);
    return RL_OK;
}

rl_status rl_tensor_empty_like(rl_tensor *out, const rl_tensor *like) {
    return rl_tensor_empty(out, like->dtype, rl_tensor_device(like), like->ndim, like->shape);
}

rl_status rl_buffer_ensure(rl_tensor *buf, rl_dtype dt, rl_device dev, int ndim,
                           const int64_t *shape) {
    int64_t n = 0;
    RL_TRY(rl_shape_numel("buffer", ndim, shape, &n));
    size_t need = (size_t)n * rl_dtype_size(dt);
    rl_storage *s = buf->storage;
    if (s && s->nbytes >= need && rl_device_eq(s->device, dev)) {
        buf->dtype = dt;
        buf->ndim = ndim;
        buf->offset = 0;
        if (ndim > 0) memcpy(buf->shape, shape, (size_t)ndim * sizeof *shape);
        rl_contiguous_strides(ndim, buf->shape, buf->stride);
        return RL_OK;
    }
    rl_tensor_release(buf);
    return rl_tensor_empty(buf, dt, dev, ndim, shape);
}

void rl_tensor_release(rl_tensor *t) {
    rl_storage_release(t->storage);
    memset(t, 0, sizeof *t);
}

void rl_tensor_share(rl_tensor *out, const rl_tensor *src) {
    *out = *src;
    rl_storage_retain(out->storage);
}

int64_t rl_tensor_numel(const rl_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

bool rl_tensor_is_contiguous(const rl_tensor *t) {
    if (rl_tensor_numel(t) == 0) return true;
    int64_t acc = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != acc) return false;
        acc *= t->shape[d];
    }
    return true;
}

bool rl_tensor_same_shape(const rl_tensor *a, const rl_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

rl_device rl_tensor_device(const rl_tensor *t) {
    return t->storage ? t->storage->device : RL_DEVICE_CPU;
}

void *rl_tensor_data(const rl_tensor *t) {
    if (!t->storage) return NULL;
    return (char *)t->storage->data + t->offset * (int64_t)rl_dtype_size(t->dtype);
}

const char *rl_shape_str(const rl_tensor *t, char *buf, size_t n) {
    return shape_text(t->ndim, t->shape, buf, n);
}

const char *rl_tensor_describe(const rl_tensor *t, char *buf, size_t n) {
    char shape[128], dev[32];
    rl_shape_str(t, shape, sizeof shape);
    rl_device_name(rl_tensor_device(t), dev, sizeof dev);
    snprintf(buf, n, "%s %s on %s", rl_dtype_name(t->dtype), shape, dev);
    return buf;
}

/* A view error message names the function, the tensor's shape and the offending argument. */
static rl_status dim_error(const char *fn, const rl_tensor *t, int dim) {
    char s[128];
    return rl_error(RL_EINDEX, "%s: dim %d out of range for a %d-dim tensor %s", fn, dim + 1,
                    t->ndim, rl_shape_str(t, s, sizeof s));
}

rl_status rl_tensor_narrow(rl_tensor *out, const rl_tensor *src, int dim, int64_t start,
                           int64_t len) {
    memset(out, 0, sizeof *out);
    if (dim < 0 || dim >= src->ndim) return dim_error("narrow", src, dim);
    if (start < 0 || len < 0 || start > src->shape[dim] || len > src->shape[dim] - start) {
        char s[128];
        /* printed 1-based; start + len might overflow */
        return rl_error(RL_EINDEX,
                        "narrow: %" PRId64 " elements from position %" PRId64 " are out of range "
                        "for dim %d of size %" PRId64 " in %s",
                        len, start < INT64_MAX ? start + 1 : start, dim + 1, src->shape[dim],
                        rl_shape_str(src, s, sizeof s));
    }
    rl_tensor_share(out, src);
    out->offset += start * src->stride[dim];
    out->shape[dim] = len;
    return RL_OK;
}

rl_status rl_tensor_select(rl_tensor *out, const rl_tensor *src, int dim, int64_t index) {
    memset(out, 0, sizeof *out);
    if (dim < 0 || dim >= src->ndim) return dim_error("select", src, dim);
    if (index < 0 || index >= src->shape[dim]) {
        char s[128];
        return rl_error(RL_EINDEX,
                        "select: index %" PRId64 " out of range for dim %d of size %" PRId64
                        " in %s",
                        index + 1, dim + 1, src->shape[dim], rl_shape_str(src, s, sizeof s));
    }
    rl_tensor_share(out, src);
    out->offset += index * src->stride[dim];
    for (int d = dim; d < src->ndim - 1; d++) {
        out->shape[d] = src->shape[d + 1];
        out->stride[d] = src->stride[d + 1];
    }
    out->ndim--;
    return RL_OK;
}

rl_status rl_tensor_view(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape) {
    memset(out, 0, sizeof *out);
    char s[128];
    if (ndim < 0 || ndim > RL_MAX_DIMS)
        return rl_error(RL_ESHAPE, "view: %d dims requested, at most %d are supported", ndim,
                        RL_MAX_DIMS);
    int64_t numel = rl_tensor_numel(src), known = 1, resolved[RL_MAX_DIMS];
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        resolved[d] = shape[d];
        if (shape[d] == -1) {
            if (infer >= 0) return rl_error(RL_ESHAPE, "view: only one dim may be -1");
            infer = d;
        } else if (shape[d] < 0) {
            return rl_error(RL_ESHAPE, "view: negative size %" PRId64 " in dim %d", shape[d],
                            d + 1);
        } else if (!rl_mul_ok(known, shape[d], &known) || known > RL_MAX_NUMEL) {
            return rl_error(RL_ESHAPE, "view: the new shape has more than %" PRId64 " elements",
                            RL_MAX_NUMEL);
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return rl_error(RL_ESHAPE,
                            "view: cannot infer the -1 dim of %" PRId64 " elements from %s", numel,
                            rl_shape_str(src, s, sizeof s));
        resolved[infer] = numel / known;
        known *= resolved[infer];
    }
    if (known != numel)
        return rl_error(RL_ESHAPE, "view: %s has %" PRId64 " elements, the new shape has %" PRId64,
                        rl_shape_str(src, s, sizeof s), numel, known);
    if (!rl_tensor_is_contiguous(src))
        return rl_error(RL_ESHAPE,
                        "view: tensor %s is not contiguous (use reshape or "
                        "contiguous first)",
                        rl_shape_str(src, s, sizeof s));
    rl_tensor_share(out, src);
    out->ndim = ndim;
    memcpy(out->shape, resolved, (size_t)ndim * sizeof *resolved);
    rl_contiguous_strides(ndim, resolved, out->stride);
    return RL_OK;
}

rl_status rl_tensor_transpose(rl_tensor *out, const rl_tensor *src, int d0, int d1) {
    memset(out, 0, sizeof *out);
    if (d0 < 0 || d0 >= src->ndim) return dim_error("transpose", src, d0);
    if (d1 < 0 || d1 >= src->ndim) return dim_error("transpose", src, d1);
    rl_tensor_share(out, src);
    out->shape[d0] = src->shape[d1];
    out->shape[d1] = src->shape[d0];
    out->stride[d0] = src->stride[d1];
    out->stride[d1] = src->stride[d0];
    return RL_OK;
}

rl_status rl_tensor_permute(rl_tensor *out, const rl_tensor *src, const int *perm) {
    memset(out, 0, sizeof *out);
    bool seen[RL_MAX_DIMS] = {false};
    for (int d = 0; d < src->ndim; d++) {
        if (perm[d] < 0 || perm[d] >= src->ndim || seen[perm[d]]) {
            char s[128];
            return rl_error(RL_EARG, "permute: the dims must be a permutation of 1..%d for %s",
                            src->ndim, rl_shape_str(src, s, sizeof s));
        }
        seen[perm[d]] = true;
    }
    rl_tensor_share(out, src);
    for (int d = 0; d < src->ndim; d++) {
        out->shape[d] = src->shape[perm[d]];
        out->stride[d] = src->stride[perm[d]];
    }
    return RL_OK;
}

rl_status rl_tensor_squeeze(rl_tensor *out, const rl_tensor *src, int dim) {
    memset(out, 0, sizeof *out);
    if (dim >= src->ndim) return dim_error("squeeze", src, dim);
    rl_tensor_share(out, src);
    int k = 0;
    for (int d = 0; d < src->ndim; d++) {
        bool drop = src->shape[d] == 1 && (dim < 0 || d == dim);
        if (!drop) {
            out->shape[k] = src->shape[d];
            out->stride[k] = src->stride[d];
            k++;
        }
    }
    out->ndim = k;
    return RL_OK;
}

rl_status rl_tensor_unsqueeze(rl_tensor *out, const rl_tensor *src, int dim) {
    memset(out, 0, sizeof *out);
    if (dim < 0 || dim > src->ndim) return dim_error("unsqueeze", src, dim);
    if (src->ndim == RL_MAX_DIMS)
        return rl_error(RL_ESHAPE, "unsqueeze: a tensor may have at most %d dims", RL_MAX_DIMS);
    rl_tensor_share(out, src);
    for (int d = src->ndim; d > dim; d--) {
        out->shape[d] = src->shape[d - 1];
        out->stride[d] = src->stride[d - 1];
    }
    out->shape[dim] = 1;
    out->stride[dim] = dim < src->ndim ? src->stride[dim] * src->shape[dim] : 1;
    out->ndim++;
    return RL_OK;
}

rl_status rl_tensor_expand(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape) {
    memset(out, 0, sizeof *out);
    char s[128];
    if (ndim < src->ndim || ndim > RL_MAX_DIMS)
        return rl_error(RL_ESHAPE, "expand: cannot expand %s to %d dims",
                        rl_shape_str(src, s, sizeof s), ndim);
    int64_t numel;
    RL_TRY(rl_shape_numel("expand", ndim, shape, &numel));
    rl_tensor e = *src;
    int lead = ndim - src->ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - lead;
        int64_t have = sd >= 0 ? src->shape[sd] : 1;
        int64_t st = sd >= 0 ? src->stride[sd] : 0;
        if (have == shape[d]) {
            e.shape[d] = have;
            e.stride[d] = st;
        } else if (have == 1) {
            e.shape[d] = shape[d];
            e.stride[d] = 0;
        } else {
            return rl_error(RL_ESHAPE,
                            "expand: dim %d of %s has size %" PRId64
                            ", which cannot broadcast to %" PRId64,
                            sd + 1, rl_shape_str(src, s, sizeof s), have, shape[d]);
        }
    }
    e.ndim = ndim;
    rl_tensor_share(out, &e);
    return RL_OK;
}

rl_status rl_broadcast_shape(const char *op, const rl_tensor *a, const rl_tensor *b, int *ndim,
                             int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < n; d++) {
        int da = d - (n - a->ndim), db = d - (n - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char s1[128], s2[128];
            return rl_error(
                RL_ESHAPE,
                "%s: shapes %s and %s do not broadcast (dim %d: %" PRId64 " vs %" PRId64 ")", op,
                rl_shape_str(a, s1, sizeof s1), rl_shape_str(b, s2, sizeof s2), d + 1, sa, sb);
        }
        shape[d] = sa == 1 ? sb : sa;
    }
    *ndim = n;
    return RL_OK;
}

static int64_t element_offset(const rl_tensor *t, const int64_t *index) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++)
        off += index[d] * t->stride[d];
    return off;
}

double rl_tensor_get(const rl_tensor *t, const int64_t *index) {
    int64_t off = element_offset(t, index);
    switch (t->dtype) {
    case RL_FLOAT32: return ((const float *)rl_tensor_data(t))[off];
    case RL_FLOAT64: return ((const double *)rl_tensor_data(t))[off];
    case RL_INT32: return ((const int32_t *)rl_tensor_data(t))[off];
    default: return 0.0;
    }
}

void rl_tensor_set(rl_tensor *t, const int64_t *index, double v) {
    int64_t off = element_offset(t, index);
    switch (t->dtype) {
    case RL_FLOAT32: ((float *)rl_tensor_data(t))[off] = (float)v; break;
    case RL_FLOAT64: ((double *)rl_tensor_data(t))[off] = v; break;
    case RL_INT32: /* saturating, NaN -> 0: a plain cast of those is undefined */
        ((int32_t *)rl_tensor_data(t))[off] = v != v               ? 0
                                              : v >= 2147483647.0  ? INT32_MAX
                                              : v <= -2147483648.0 ? INT32_MIN
                                                                   : (int32_t)v;
        break;
    default: break;
    }
}
