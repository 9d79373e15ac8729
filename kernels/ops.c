/* The op dispatcher (kernels/ops.h): checks arguments, applies the output rule, resolves
 * broadcasting and views, and calls the kernels table of the tensors' device.
 *
 * Geometry handed to kernels is sometimes a borrowed view: an rl_tensor struct copied from a
 * set tensor with its shape, strides or offset changed. It shares the storage pointer without
 * a reference of its own, so it is never released; it lives only for the kernel call.
 *
 * Random numbers (the contract the CUDA kernels follow bit for bit): a draw on t of n
 * elements reserves words with rl_rng_reserve (uniform: n words, normal: 2n words) and passes
 * the seed and the first block `offset` to the kernel. With w(j) = rl_philox_word(seed, 0,
 * offset, j) and i the row-major position of an element in t:
 *   uniform: value = lo + (hi - lo) * (double)rl_u32_to_unit(w(i))
 *   normal:  value = mean + std * rl_box_muller(rl_u32_to_unit_open(w(2i)),
 *                                               (double)rl_u32_to_unit(w(2i + 1)))
 * both computed in double and then converted to t's dtype.
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/device.h"
#include "backend.h"

#ifdef RL_WITH_CUDA
#include "cuda/cuda.h"
#ifdef RL_WITH_NCCL
#include "cuda/nccl_comm.h"
#endif

static const rl_kernels *cuda_kernels(void) { return rl_kernels_cuda(); }

void rl_ops_init(void) {
    rl_cuda_register();
#ifdef RL_WITH_NCCL
    rl_nccl_register(); /* device buffers of rl.dist go through NCCL */
#endif
}
#else
static const rl_kernels *cuda_kernels(void) { return NULL; }

void rl_ops_init(void) {}
#endif

static const char *const unary_names[RL_NUM_UNARY] = {
    "neg",   "abs",      "sign",       "exp",  "log",   "log1p", "expm1",   "sqrt",
    "rsqrt", "square",   "reciprocal", "sin",  "cos",   "tanh",  "sigmoid", "relu",
    "elu",   "softplus", "floor",      "ceil", "round", "clamp"};
static const char *const binary_names[RL_NUM_BINARY] = {
    "add", "sub", "mul", "div", "pow", "max", "min", "eq", "ne", "lt", "le", "gt", "ge"};
static const char *const reduce_names[RL_NUM_REDUCE] = {"sum", "mean", "prod",
                                                        "max", "min",  "norm"};

const char *rl_unary_name(rl_unary_op op) {
    return (unsigned)op < RL_NUM_UNARY ? unary_names[op] : "unknown unary op";
}

const char *rl_binary_name(rl_binary_op op) {
    return (unsigned)op < RL_NUM_BINARY ? binary_names[op] : "unknown binary op";
}

const char *rl_reduce_name(rl_reduce_op op) {
    return (unsigned)op < RL_NUM_REDUCE ? reduce_names[op] : "unknown reduction";
}

bool rl_unary_needs_float(rl_unary_op op) {
    return !(op == RL_UN_NEG || op == RL_UN_ABS || op == RL_UN_SIGN || op == RL_UN_SQUARE ||
             op == RL_UN_CLAMP);
}

/* ---- argument checks ---- */

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    rl_tensor t = {0};
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    return rl_shape_str(&t, buf, n);
}

static rl_status need_set(const char *op, const rl_tensor *t, const char *what) {
    if (!t || !t->storage) return rl_error(RL_EARG, "%s: %s is not a tensor (unset)", op, what);
    return RL_OK;
}

static rl_status kernels_of(const char *op, const rl_tensor *t, const rl_kernels **k) {
    rl_device d = rl_tensor_device(t);
    *k = d.type == RL_CPU ? rl_kernels_cpu() : cuda_kernels();
    if (!*k) {
        char dev[32];
        rl_device_name(d, dev, sizeof dev);
        return rl_error(RL_EDEVICE, "%s: no kernels for %s in this build", op, dev);
    }
    return RL_OK;
}

static rl_status same_device(const char *op, const rl_tensor *a, const rl_tensor *b) {
    if (!rl_device_eq(rl_tensor_device(a), rl_tensor_device(b))) {
        char da[160], db[160];
        return rl_error(RL_EDEVICE, "%s: tensors on different devices: %s and %s", op,
                        rl_tensor_describe(a, da, sizeof da), rl_tensor_describe(b, db, sizeof db));
    }
    return RL_OK;
}

static rl_status same_dtype(const char *op, const rl_tensor *a, const rl_tensor *b) {
    if (a->dtype != b->dtype) {
        char da[160], db[160];
        return rl_error(RL_EDTYPE, "%s: dtypes differ: %s and %s", op,
                        rl_tensor_describe(a, da, sizeof da), rl_tensor_describe(b, db, sizeof db));
    }
    return RL_OK;
}

static rl_status need_float(const char *op, const rl_tensor *t) {
    if (t->dtype != RL_FLOAT32 && t->dtype != RL_FLOAT64) {
        char d[160];
        return rl_error(RL_EDTYPE, "%s: needs float32 or float64, got %s", op,
                        rl_tensor_describe(t, d, sizeof d));
    }
    return RL_OK;
}

/* A value that is to be stored in an int32 tensor must be finite and in range. */
static rl_status int32_value(const char *op, rl_dtype dt, double v, const char *what) {
    if (dt == RL_INT32 && !(v >= -2147483648.0 && v <= 2147483647.0))
        return rl_error(RL_EARG, "%s: %s %g does not fit in int32", op, what, v);
    return RL_OK;
}

/* ---- aliasing: an output that shares memory with an input ----
 * Kernels read and write element by element, so an output may share memory with an input only
 * when both are the very same view (out = a in add_). Any other overlap (a:copy_(a:t()),
 * matmul(a, a, a)) goes through a temporary copy of the input; an output that repeats elements
 * (an expanded view, stride 0) cannot be written at all. */

/* The byte range [lo, hi) a non-empty view can touch. */
static void extent(const rl_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->shape[d] - 1) * t->stride[d];
        if (span < 0)
            a += span;
        else
            b += span;
    }
    int64_t size = (int64_t)rl_dtype_size(t->dtype);
    *lo = a * size;
    *hi = (b + 1) * size;
}

static bool overlaps(const rl_tensor *a, const rl_tensor *b) {
    if (!a->storage || a->storage != b->storage) return false;
    if (rl_tensor_numel(a) == 0 || rl_tensor_numel(b) == 0) return false;
    int64_t alo, ahi, blo, bhi;
    extent(a, &alo, &ahi);
    extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

static bool same_view(const rl_tensor *a, const rl_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->dtype != b->dtype ||
        !rl_tensor_same_shape(a, b))
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->stride[d] != b->stride[d]) return false;
    return true;
}

/* An output that holds some element twice (a dim of size > 1 with stride 0, from expand). */
static rl_status writable(const char *op, const rl_tensor *out) {
    for (int d = 0; d < out->ndim; d++) {
        if (out->shape[d] > 1 && out->stride[d] == 0) {
            char s[128];
            return rl_error(RL_EARG,
                            "%s: the output %s is an expanded view (dim %d repeats one element): "
                            "writing into it would be ambiguous; write into a contiguous tensor",
                            op, rl_shape_str(out, s, sizeof s), d + 1);
        }
    }
    return RL_OK;
}

/* *use = in, or a fresh copy of it in *tmp when it overlaps `out` other than as the same view.
 * The caller releases *tmp (unset when no copy was made). */
static rl_status unalias(const rl_tensor *out, const rl_tensor *in, rl_tensor *tmp,
                         const rl_tensor **use) {
    *use = in;
    if (!overlaps(out, in) || same_view(out, in)) return RL_OK;
    RL_TRY(rl_op_to(tmp, in, in->dtype, rl_tensor_device(in)));
    *use = tmp;
    return RL_OK;
}

/* The output rule of ops.h. *fresh tells whether `out` was allocated here (and must be
 * released again if the op fails later). */
static rl_status prepare_out(const char *op, rl_tensor *out, rl_dtype dt, rl_device dev, int ndim,
                             const int64_t *shape, bool *fresh) {
    *fresh = false;
    if (!out) return rl_error(RL_EARG, "%s: no output tensor given", op);
    if (!out->storage) {
        RL_TRY(rl_tensor_empty(out, dt, dev, ndim, shape));
        *fresh = true;
        return RL_OK;
    }
    bool ok = out->dtype == dt && rl_device_eq(rl_tensor_device(out), dev) && out->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = out->shape[d] == shape[d];
    if (!ok) {
        char have[160], want[128], dev_name[32];
        rl_device_name(dev, dev_name, sizeof dev_name);
        return rl_error(RL_ESHAPE, "%s: out is %s, the result is %s %s on %s", op,
                        rl_tensor_describe(out, have, sizeof have), rl_dtype_name(dt),
                        shape_str(ndim, shape, want, sizeof want), dev_name);
    }
    return writable(op, out);
}

static rl_status finish(rl_status st, rl_tensor *out, bool fresh) {
    if (st != RL_OK && fresh) rl_tensor_release(out);
    return st;
}

/* A borrowed view of t broadcast to shape (t's shape must broadcast to it). */
static rl_tensor broadcast_view(const rl_tensor *t, int ndim, const int64_t *shape) {
    rl_tensor v = *t;
    int lead = ndim - t->ndim;
    v.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        int sd = d - lead;
        v.shape[d] = shape[d];
        v.stride[d] = (sd >= 0 && t->shape[sd] == shape[d]) ? t->stride[sd] : 0;
    }
    return v;
}

static bool broadcasts_to(const rl_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim > ndim) return false;
    for (int d = 0; d < t->ndim; d++) {
        int64_t s = t->shape[t->ndim - 1 - d], want = shape[ndim - 1 - d];
        if (s != want && s != 1) return false;
    }
    return true;
}

/* ---- filling and moving ---- */

rl_status rl_op_fill(rl_tensor *t, double value) {
    const rl_kernels *k;
    RL_TRY(need_set("fill", t, "the tensor"));
    RL_TRY(int32_value("fill", t->dtype, value, "value"));
    RL_TRY(kernels_of("fill", t, &k));
    if (rl_tensor_numel(t) == 0) return RL_OK;
    return k->fill(t, value);
}

rl_status rl_op_copy(rl_tensor *dst, const rl_tensor *src) {
    RL_TRY(need_set("copy", dst, "the destination"));
    RL_TRY(need_set("copy", src, "the source"));
    if (!broadcasts_to(src, dst->ndim, dst->shape)) {
        char a[128], b[128];
        return rl_error(RL_ESHAPE, "copy: cannot broadcast %s to %s",
                        rl_shape_str(src, a, sizeof a), rl_shape_str(dst, b, sizeof b));
    }
    const rl_kernels *k;
    RL_TRY(kernels_of("copy", dst, &k));
    if (rl_tensor_numel(dst) == 0) return RL_OK;
    RL_TRY(writable("copy", dst));
    rl_device dd = rl_tensor_device(dst), sd = rl_tensor_device(src);
    if (rl_device_eq(dd, sd)) {
        rl_tensor s = broadcast_view(src, dst->ndim, dst->shape), tmp = {0};
        const rl_tensor *from;
        RL_TRY(unalias(dst, &s, &tmp, &from));
        rl_status st = k->copy(dst, from);
        rl_tensor_release(&tmp);
        return st;
    }
    /* Across devices: make the source contiguous where it is, move the bytes, then
     * broadcast and convert on the destination's device. */
    rl_tensor sc = {0}, staged = {0};
    rl_status st = rl_op_contiguous(&sc, src);
    size_t nbytes = (size_t)rl_tensor_numel(src) * rl_dtype_size(src->dtype);
    if (st == RL_OK && dst->dtype == src->dtype && rl_tensor_is_contiguous(dst) &&
        rl_tensor_same_shape(dst, src)) {
        st = rl_device_memcpy(rl_tensor_data(dst), dd, rl_tensor_data(&sc), sd, nbytes);
    } else if (st == RL_OK) {
        st = rl_tensor_empty(&staged, src->dtype, dd, src->ndim, src->shape);
        if (st == RL_OK)
            st = rl_device_memcpy(rl_tensor_data(&staged), dd, rl_tensor_data(&sc), sd, nbytes);
        if (st == RL_OK) {
            rl_tensor s = broadcast_view(&staged, dst->ndim, dst->shape);
            st = k->copy(dst, &s);
        }
    }
    rl_tensor_release(&staged);
    rl_tensor_release(&sc);
    return st;
}

rl_status rl_op_contiguous(rl_tensor *out, const rl_tensor *src) {
    RL_TRY(need_set("contiguous", src, "the source"));
    if (rl_tensor_is_contiguous(src)) {
        rl_tensor_share(out, src);
        return RL_OK;
    }
    return rl_op_to(out, src, src->dtype, rl_tensor_device(src));
}

rl_status rl_op_to(rl_tensor *out, const rl_tensor *src, rl_dtype dt, rl_device dev) {
    RL_TRY(need_set("to", src, "the source"));
    RL_TRY(rl_tensor_empty(out, dt, dev, src->ndim, src->shape));
    rl_status st = rl_op_copy(out, src);
    return finish(st, out, true);
}

/* Strides that let `src` be seen with the new shape without moving data (the rule of
 * PyTorch's computeStride): each run of dims that is contiguous in src may be regrouped. */
static bool view_strides(const rl_tensor *src, int ndim, const int64_t *shape, int64_t *stride) {
    if (rl_tensor_numel(src) <= 1 || rl_tensor_is_contiguous(src)) {
        rl_contiguous_strides(ndim, shape, stride);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk = src->stride[src->ndim - 1], tnumel = 1, vnumel = 1;
    for (int d = src->ndim - 1; d >= 0; d--) {
        tnumel *= src->shape[d];
        if (d == 0 || (src->shape[d - 1] != 1 && src->stride[d - 1] != tnumel * chunk)) {
            while (view_d >= 0 && (vnumel < tnumel || shape[view_d] == 1)) {
                stride[view_d] = vnumel * chunk;
                vnumel *= shape[view_d];
                view_d--;
            }
            if (vnumel != tnumel) return false;
            if (d > 0) {
                chunk = src->stride[d - 1];
                tnumel = 1;
                vnumel = 1;
            }
        }
    }
    return view_d == -1;
}

rl_status rl_op_reshape(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape) {
    RL_TRY(need_set("reshape", src, "the source"));
    if (ndim < 0 || ndim > RL_MAX_DIMS)
        return rl_error(RL_ESHAPE, "reshape: %d dims requested, at most %d", ndim, RL_MAX_DIMS);
    int64_t want[RL_MAX_DIMS], known = 1, numel = rl_tensor_numel(src);
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        want[d] = shape[d];
        if (shape[d] == -1 && infer < 0)
            infer = d;
        else if (shape[d] < 0)
            return rl_error(RL_ESHAPE, "reshape: bad size %lld in dim %d", (long long)shape[d],
                            d + 1);
        else if (!rl_mul_ok(known, shape[d], &known) || known > RL_MAX_NUMEL)
            return rl_error(RL_ESHAPE, "reshape: the new shape has more than %lld elements",
                            (long long)RL_MAX_NUMEL);
    }
    if (infer >= 0 && known > 0 && numel % known == 0) want[infer] = numel / known;
    if ((infer >= 0 && (known == 0 || numel % known != 0)) || (infer < 0 && known != numel)) {
        char a[128], b[128];
        return rl_error(RL_ESHAPE, "reshape: cannot view %s (%lld elements) as %s",
                        rl_shape_str(src, a, sizeof a), (long long)numel,
                        shape_str(ndim, shape, b, sizeof b));
    }
    int64_t stride[RL_MAX_DIMS];
    if (view_strides(src, ndim, want, stride)) {
        rl_tensor_share(out, src);
        out->ndim = ndim;
        memcpy(out->shape, want, (size_t)ndim * sizeof *want);
        memcpy(out->stride, stride, (size_t)ndim * sizeof *stride);
        return RL_OK;
    }
    rl_tensor c = {0};
    RL_TRY(rl_op_contiguous(&c, src));
    rl_tensor_share(out, &c);
    out->ndim = ndim;
    memcpy(out->shape, want, (size_t)ndim * sizeof *want);
    rl_contiguous_strides(ndim, want, out->stride);
    rl_tensor_release(&c);
    return RL_OK;
}

/* ---- elementwise ---- */

rl_status rl_op_unary(rl_tensor *out, const rl_tensor *a, rl_unary_op op, double p0, double p1) {
    const char *name = rl_unary_name(op);
    if ((unsigned)op >= RL_NUM_UNARY) return rl_error(RL_EARG, "unary: invalid op %d", (int)op);
    RL_TRY(need_set(name, a, "the input"));
    if (rl_unary_needs_float(op)) RL_TRY(need_float(name, a));
    if (op == RL_UN_CLAMP) {
        RL_TRY(int32_value(name, a->dtype, p0, "lower bound"));
        RL_TRY(int32_value(name, a->dtype, p1, "upper bound"));
    }
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of(name, a, &k));
    RL_TRY(prepare_out(name, out, a->dtype, rl_tensor_device(a), a->ndim, a->shape, &fresh));
    if (rl_tensor_numel(a) == 0) return RL_OK;
    rl_tensor tmp = {0};
    const rl_tensor *in;
    rl_status st = unalias(out, a, &tmp, &in);
    if (st == RL_OK) st = k->unary(out, in, op, p0, p1);
    rl_tensor_release(&tmp);
    return finish(st, out, fresh);
}

/* A zero inside an int32 divisor tensor: the kernels cannot report it (they give 0, a silently
 * wrong number), so the dispatcher looks for one first, as it does for a zero scalar. One more
 * pass over the divisor, on its device, for int32 division only. */
static rl_status check_int32_divisor(const rl_tensor *b) {
    if (rl_tensor_numel(b) == 0) return RL_OK;
    rl_tensor zero = {0};
    double any = 0;
    int64_t at = 0;
    rl_status st = rl_op_binary_scalar(&zero, b, 0.0, RL_BIN_EQ, false);
    if (st == RL_OK) st = rl_op_reduce_all(&any, &at, &zero, RL_RED_MAX);
    rl_tensor_release(&zero);
    if (st == RL_OK && any != 0)
        return rl_error(RL_EARG,
                        "div: int32 division by zero (element %lld of the divisor, 1-based in "
                        "row-major order)",
                        (long long)at + 1);
    return st;
}

rl_status rl_op_binary(rl_tensor *out, const rl_tensor *a, const rl_tensor *b, rl_binary_op op) {
    const char *name = rl_binary_name(op);
    if ((unsigned)op >= RL_NUM_BINARY) return rl_error(RL_EARG, "binary: invalid op %d", (int)op);
    RL_TRY(need_set(name, a, "the first input"));
    RL_TRY(need_set(name, b, "the second input"));
    RL_TRY(same_device(name, a, b));
    RL_TRY(same_dtype(name, a, b));
    int nd;
    int64_t shape[RL_MAX_DIMS];
    RL_TRY(rl_broadcast_shape(name, a, b, &nd, shape));
    if (a->dtype == RL_INT32 && op == RL_BIN_DIV) RL_TRY(check_int32_divisor(b));
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of(name, a, &k));
    RL_TRY(prepare_out(name, out, a->dtype, rl_tensor_device(a), nd, shape, &fresh));
    rl_tensor av = broadcast_view(a, nd, shape), bv = broadcast_view(b, nd, shape);
    if (rl_tensor_numel(out) == 0) return RL_OK;
    rl_tensor ta = {0}, tb = {0};
    const rl_tensor *ua, *ub;
    rl_status st = unalias(out, &av, &ta, &ua);
    if (st == RL_OK) st = unalias(out, &bv, &tb, &ub);
    if (st == RL_OK) st = k->binary(out, ua, ub, op);
    rl_tensor_release(&tb);
    rl_tensor_release(&ta);
    return finish(st, out, fresh);
}

rl_status rl_op_binary_scalar(rl_tensor *out, const rl_tensor *a, double s, rl_binary_op op,
                              bool scalar_first) {
    const char *name = rl_binary_name(op);
    if ((unsigned)op >= RL_NUM_BINARY) return rl_error(RL_EARG, "binary: invalid op %d", (int)op);
    RL_TRY(need_set(name, a, "the input"));
    RL_TRY(int32_value(name, a->dtype, s, "scalar"));
    if (a->dtype == RL_INT32 && op == RL_BIN_DIV && !scalar_first && (int32_t)s == 0)
        return rl_error(RL_EARG, "div: int32 division by zero");
    if (a->dtype == RL_INT32 && op == RL_BIN_DIV && scalar_first) RL_TRY(check_int32_divisor(a));
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of(name, a, &k));
    RL_TRY(prepare_out(name, out, a->dtype, rl_tensor_device(a), a->ndim, a->shape, &fresh));
    if (rl_tensor_numel(a) == 0) return RL_OK;
    return finish(k->binary_scalar(out, a, s, op, scalar_first), out, fresh);
}

rl_status rl_op_masked_fill(rl_tensor *a, const rl_tensor *mask, double value) {
    RL_TRY(need_set("masked_fill", a, "the tensor"));
    RL_TRY(need_set("masked_fill", mask, "the mask"));
    RL_TRY(same_device("masked_fill", a, mask));
    RL_TRY(int32_value("masked_fill", a->dtype, value, "value"));
    if (!broadcasts_to(mask, a->ndim, a->shape)) {
        char sa[128], sm[128];
        return rl_error(RL_ESHAPE, "masked_fill: mask %s does not broadcast to %s",
                        rl_shape_str(mask, sm, sizeof sm), rl_shape_str(a, sa, sizeof sa));
    }
    const rl_kernels *k;
    RL_TRY(kernels_of("masked_fill", a, &k));
    if (rl_tensor_numel(a) == 0) return RL_OK;
    rl_tensor mv = broadcast_view(mask, a->ndim, a->shape);
    return k->masked_fill(a, &mv, value);
}

/* ---- reductions ---- */

static rl_status check_reduce(const char *name, rl_reduce_op op, const rl_tensor *a) {
    if ((unsigned)op >= RL_NUM_REDUCE) return rl_error(RL_EARG, "reduce: invalid op %d", (int)op);
    RL_TRY(need_set(name, a, "the input"));
    if (op == RL_RED_MEAN || op == RL_RED_NORM) RL_TRY(need_float(name, a));
    return RL_OK;
}

static rl_status empty_reduction(const char *name, rl_reduce_op op, const rl_tensor *a) {
    if (op == RL_RED_MEAN || op == RL_RED_MAX || op == RL_RED_MIN) {
        char s[128];
        return rl_error(RL_ESHAPE, "%s: reduction over no elements of %s", name,
                        rl_shape_str(a, s, sizeof s));
    }
    return RL_OK;
}

rl_status rl_op_reduce_all(double *result, int64_t *index, const rl_tensor *a, rl_reduce_op op) {
    const char *name = rl_reduce_name(op);
    RL_TRY(check_reduce(name, op, a));
    int64_t n = rl_tensor_numel(a);
    if (index) *index = 0;
    if (n == 0) {
        RL_TRY(empty_reduction(name, op, a));
        *result = op == RL_RED_PROD ? 1.0 : 0.0;
        return RL_OK;
    }
    const rl_kernels *k;
    RL_TRY(kernels_of(name, a, &k));
    bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
    rl_device dev = rl_tensor_device(a);
    int64_t one = 1;
    rl_tensor c = {0}, out = {0}, idx = {0}, host = {0}, hidx = {0};
    rl_status st = rl_op_contiguous(&c, a);
    rl_tensor flat = c; /* borrowed */
    flat.ndim = 1;
    flat.shape[0] = n;
    flat.stride[0] = 1;
    if (st == RL_OK) st = rl_tensor_empty(&out, a->dtype, dev, 1, &one);
    if (st == RL_OK && ext) st = rl_tensor_empty(&idx, RL_INT32, dev, 1, &one);
    if (st == RL_OK) st = k->reduce(&out, ext ? &idx : NULL, &flat, 0, op);
    if (st == RL_OK) st = rl_op_to(&host, &out, RL_FLOAT64, RL_DEVICE_CPU);
    if (st == RL_OK && ext) st = rl_op_to(&hidx, &idx, RL_INT32, RL_DEVICE_CPU);
    if (st == RL_OK) {
        int64_t zero = 0;
        *result = rl_tensor_get(&host, &zero);
        if (index && ext) *index = (int64_t)rl_tensor_get(&hidx, &zero);
    }
    rl_tensor_release(&hidx);
    rl_tensor_release(&host);
    rl_tensor_release(&idx);
    rl_tensor_release(&out);
    rl_tensor_release(&c);
    return st;
}

/* A borrowed view of t (the result without keepdim) with a size-1 dim put back at `dim`. */
static rl_tensor keepdim_view(const rl_tensor *t, int dim) {
    rl_tensor v = *t;
    v.ndim = t->ndim + 1;
    for (int d = t->ndim; d > dim; d--) {
        v.shape[d] = t->shape[d - 1];
        v.stride[d] = t->stride[d - 1];
    }
    v.shape[dim] = 1;
    v.stride[dim] = 0;
    return v;
}

rl_status rl_op_reduce_dim(rl_tensor *out, rl_tensor *indices, const rl_tensor *a, int dim,
                           bool keepdim, rl_reduce_op op) {
    const char *name = rl_reduce_name(op);
    RL_TRY(check_reduce(name, op, a));
    if (dim < 0 || dim >= a->ndim) {
        char s[128];
        return rl_error(RL_EINDEX, "%s: dim %d out of range for %s", name, dim,
                        rl_shape_str(a, s, sizeof s));
    }
    if (a->shape[dim] == 0) RL_TRY(empty_reduction(name, op, a));
    bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
    if (!ext) indices = NULL; /* only max and min have positions to report */
    int rnd = 0;
    int64_t rshape[RL_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++)
        if (d != dim)
            rshape[rnd++] = a->shape[d];
        else if (keepdim)
            rshape[rnd++] = 1;
    const rl_kernels *k;
    bool fresh, fresh_idx = false;
    rl_device dev = rl_tensor_device(a);
    RL_TRY(kernels_of(name, a, &k));
    RL_TRY(prepare_out(name, out, a->dtype, dev, rnd, rshape, &fresh));
    rl_status st = RL_OK;
    if (indices) st = prepare_out(name, indices, RL_INT32, dev, rnd, rshape, &fresh_idx);
    if (st == RL_OK && rl_tensor_numel(out) > 0) {
        rl_tensor ov = keepdim ? *out : keepdim_view(out, dim), iv = {0};
        if (indices) iv = keepdim ? *indices : keepdim_view(indices, dim);
        st = k->reduce(&ov, indices ? &iv : NULL, a, dim, op);
    }
    if (st != RL_OK && fresh_idx) rl_tensor_release(indices);
    return finish(st, out, fresh);
}

/* ---- matrix products ---- */

/* How BLAS can read a (rows, cols) matrix with strides (s0, s1) in place: row-major with
 * leading dim ld (*trans false), or as the transpose of a row-major (cols, rows) matrix
 * (*trans true). False when it needs a copy (e.g. both strides non-unit, or broadcast). */
static bool blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool *trans,
                        int64_t *ld) {
    int64_t c1 = cols > 1 ? cols : 1, r1 = rows > 1 ? rows : 1;
    if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= c1)) {
        *trans = false;
        *ld = rows == 1 ? c1 : s0;
        return true;
    }
    if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= r1)) {
        *trans = true;
        *ld = cols == 1 ? r1 : s1;
        return true;
    }
    return false;
}

/* A borrowed 3-D view (batch, rows, cols) of t with the given strides. */
static rl_tensor mat3(const rl_tensor *t, int64_t b, int64_t r, int64_t c, int64_t sb, int64_t sr,
                      int64_t sc) {
    rl_tensor v = *t;
    v.ndim = 3;
    v.shape[0] = b;
    v.shape[1] = r;
    v.shape[2] = c;
    v.stride[0] = b > 1 ? sb : 0;
    v.stride[1] = sr;
    v.stride[2] = sc;
    return v;
}

/* One BLAS-readable operand: the matrix in memory, whether op() transposes it, its leading
 * dim and batch stride. `copy` owns a contiguous copy when the view could not be used. */
typedef struct {
    const void *data;
    bool trans;
    int64_t ld, bstride;
    rl_tensor copy;
} gemm_arg;

static rl_status gemm_operand(gemm_arg *g, const rl_tensor *v, bool trans) {
    bool t;
    int64_t ld;
    memset(g, 0, sizeof *g);
    if (!blas_layout(v->shape[1], v->shape[2], v->stride[1], v->stride[2], &t, &ld)) {
        RL_TRY(rl_op_to(&g->copy, v, v->dtype, rl_tensor_device(v)));
        v = &g->copy;
        t = false;
        ld = v->shape[2] > 1 ? v->shape[2] : 1;
    }
    g->data = rl_tensor_data(v);
    g->trans = trans != t;
    g->ld = ld;
    g->bstride = v->shape[0] > 1 ? v->stride[0] : 0;
    return RL_OK;
}

/* c (batch, m, n) = alpha * op(a) op(b) + beta * c over 3-D views; a and b may have batch 1
 * (broadcast). c must be set. */
static rl_status gemm3(const rl_kernels *k, rl_tensor *c, const rl_tensor *a, const rl_tensor *b,
                       bool ta, bool tb, double alpha, double beta) {
    int64_t batch = c->shape[0], m = c->shape[1], n = c->shape[2];
    int64_t kk = ta ? a->shape[1] : a->shape[2];
    if (batch == 0 || m == 0 || n == 0) return RL_OK;
    if (kk == 0)
        return beta == 0.0 ? k->fill(c, 0.0) : k->binary_scalar(c, c, beta, RL_BIN_MUL, false);
    bool ct;
    int64_t ldc;
    if (!blas_layout(m, n, c->stride[1], c->stride[2], &ct, &ldc) ||
        (batch > 1 && c->stride[0] == 0) || overlaps(c, a) || overlaps(c, b)) {
        /* c itself is not BLAS-writable, or BLAS would overwrite an operand while reading it:
         * compute into a contiguous copy and copy back */
        rl_tensor tmp = {0};
        RL_TRY(rl_op_to(&tmp, c, c->dtype, rl_tensor_device(c)));
        rl_status st = gemm3(k, &tmp, a, b, ta, tb, alpha, beta);
        if (st == RL_OK) st = k->copy(c, &tmp);
        rl_tensor_release(&tmp);
        return st;
    }
    gemm_arg ga, gb;
    RL_TRY(gemm_operand(&ga, a, ta));
    rl_status st = gemm_operand(&gb, b, tb);
    if (st == RL_OK && !ct)
        st = k->gemm(c->dtype, ga.trans, gb.trans, m, n, kk, alpha, ga.data, ga.ld, ga.bstride,
                     gb.data, gb.ld, gb.bstride, beta, rl_tensor_data(c), ldc, c->stride[0], batch);
    else if (st == RL_OK) /* c is stored transposed: c^T = op(b)^T op(a)^T */
        st = k->gemm(c->dtype, !gb.trans, !ga.trans, n, m, kk, alpha, gb.data, gb.ld, gb.bstride,
                     ga.data, ga.ld, ga.bstride, beta, rl_tensor_data(c), ldc, c->stride[0], batch);
    rl_tensor_release(&gb.copy);
    rl_tensor_release(&ga.copy);
    return st;
}

static rl_status check_matmul_args(const char *name, const rl_tensor *a, const rl_tensor *b) {
    RL_TRY(need_set(name, a, "the first input"));
    RL_TRY(need_set(name, b, "the second input"));
    RL_TRY(same_device(name, a, b));
    RL_TRY(same_dtype(name, a, b));
    return need_float(name, a);
}

rl_status rl_op_gemm(rl_tensor *c, const rl_tensor *a, const rl_tensor *b, bool trans_a,
                     bool trans_b, double alpha, double beta) {
    RL_TRY(check_matmul_args("gemm", a, b));
    char sa[128], sb[128];
    if (a->ndim != 2 || b->ndim != 2)
        return rl_error(RL_ESHAPE, "gemm: %s @ %s: both operands must be 2-D",
                        rl_shape_str(a, sa, sizeof sa), rl_shape_str(b, sb, sizeof sb));
    int64_t m = trans_a ? a->shape[1] : a->shape[0], ka = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0], n = trans_b ? b->shape[0] : b->shape[1];
    if (ka != kb)
        return rl_error(RL_ESHAPE, "gemm: %s%s @ %s%s: inner dims differ",
                        rl_shape_str(a, sa, sizeof sa), trans_a ? "^T" : "",
                        rl_shape_str(b, sb, sizeof sb), trans_b ? "^T" : "");
    const rl_kernels *k;
    bool fresh;
    int64_t shape[2] = {m, n};
    RL_TRY(kernels_of("gemm", a, &k));
    RL_TRY(prepare_out("gemm", c, a->dtype, rl_tensor_device(a), 2, shape, &fresh));
    if (fresh) beta = 0.0;
    rl_tensor a3 = mat3(a, 1, a->shape[0], a->shape[1], 0, a->stride[0], a->stride[1]);
    rl_tensor b3 = mat3(b, 1, b->shape[0], b->shape[1], 0, b->stride[0], b->stride[1]);
    rl_tensor c3 = mat3(c, 1, m, n, 0, c->stride[0], c->stride[1]);
    return finish(gemm3(k, &c3, &a3, &b3, trans_a, trans_b, alpha, beta), c, fresh);
}

/* Formats the shapes only when there is an error: matmul sits in per-step loops. */
static rl_status matmul_error(const rl_tensor *a, const rl_tensor *b, const char *what) {
    char sa[128], sb[128];
    return rl_error(RL_ESHAPE, "matmul: %s @ %s: %s", rl_shape_str(a, sa, sizeof sa),
                    rl_shape_str(b, sb, sizeof sb), what);
}

rl_status rl_op_matmul(rl_tensor *out, const rl_tensor *a, const rl_tensor *b) {
    RL_TRY(check_matmul_args("matmul", a, b));
    int an = a->ndim, bn = b->ndim;
    if (an < 1 || an > 3 || bn < 1 || bn > 3 || (an == 1 && bn == 3) || (an == 3 && bn == 1))
        return matmul_error(a, b,
                            "unsupported ranks (1-D, 2-D or 3-D, a 1-D operand only "
                            "with a 1-D or 2-D one)");
    /* a as (batch, m, k), b as (batch, k, n), borrowed */
    rl_tensor a3, b3;
    if (an == 1)
        a3 = mat3(a, 1, 1, a->shape[0], 0, 0, a->stride[0]);
    else if (an == 2)
        a3 = mat3(a, 1, a->shape[0], a->shape[1], 0, a->stride[0], a->stride[1]);
    else
        a3 = *a;
    if (bn == 1)
        b3 = mat3(b, 1, b->shape[0], 1, 0, b->stride[0], 0);
    else if (bn == 2)
        b3 = mat3(b, 1, b->shape[0], b->shape[1], 0, b->stride[0], b->stride[1]);
    else
        b3 = *b;
    if (a3.shape[2] != b3.shape[1]) return matmul_error(a, b, "inner dims differ");
    int64_t ba = a3.shape[0], bb = b3.shape[0];
    if (ba != bb && ba != 1 && bb != 1) return matmul_error(a, b, "batch sizes differ");
    int64_t batch = ba > bb ? ba : bb, m = a3.shape[1], n = b3.shape[2];
    int ond = 0;
    int64_t oshape[3];
    if (an == 3 || bn == 3) oshape[ond++] = batch;
    if (an >= 2) oshape[ond++] = m;
    if (bn >= 2) oshape[ond++] = n;
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of("matmul", a, &k));
    RL_TRY(prepare_out("matmul", out, a->dtype, rl_tensor_device(a), ond, oshape, &fresh));
    /* out as (batch, m, n): insert the dims 1-D operands dropped */
    int64_t os[3] = {0, 0, 0};
    int d = 0;
    if (an == 3 || bn == 3) os[0] = out->stride[d++];
    if (an >= 2) os[1] = out->stride[d++];
    if (bn >= 2) os[2] = out->stride[d++];
    rl_tensor o3 = mat3(out, batch, m, n, os[0], os[1], os[2]);
    return finish(gemm3(k, &o3, &a3, &b3, false, false, 1.0, 0.0), out, fresh);
}

/* ---- joining and gathering ---- */

rl_status rl_op_cat(rl_tensor *out, const rl_tensor *const *ts, int n, int dim) {
    if (n < 1 || !ts) return rl_error(RL_EARG, "cat: no tensors given");
    RL_TRY(need_set("cat", ts[0], "tensor 1"));
    const rl_tensor *t0 = ts[0];
    if (dim < 0 || dim >= t0->ndim) {
        char s[128];
        return rl_error(RL_EINDEX, "cat: dim %d out of range for %s", dim,
                        rl_shape_str(t0, s, sizeof s));
    }
    int64_t shape[RL_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[dim] = 0;
    for (int i = 0; i < n; i++) {
        char what[32], s0[128], si[128];
        snprintf(what, sizeof what, "tensor %d", i + 1);
        RL_TRY(need_set("cat", ts[i], what));
        RL_TRY(same_device("cat", t0, ts[i]));
        RL_TRY(same_dtype("cat", t0, ts[i]));
        bool ok = ts[i]->ndim == t0->ndim;
        for (int d = 0; ok && d < t0->ndim; d++)
            ok = d == dim || ts[i]->shape[d] == t0->shape[d];
        if (!ok)
            return rl_error(RL_ESHAPE, "cat: %s and %s differ outside dim %d",
                            rl_shape_str(t0, s0, sizeof s0), rl_shape_str(ts[i], si, sizeof si),
                            dim);
        shape[dim] += ts[i]->shape[dim];
    }
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of("cat", t0, &k));
    RL_TRY(prepare_out("cat", out, t0->dtype, rl_tensor_device(t0), t0->ndim, shape, &fresh));
    rl_status st = RL_OK;
    int64_t at = 0;
    for (int i = 0; i < n && st == RL_OK; i++) {
        rl_tensor part = {0};
        st = rl_tensor_narrow(&part, out, dim, at, ts[i]->shape[dim]);
        if (st == RL_OK && rl_tensor_numel(&part) > 0) st = k->copy(&part, ts[i]);
        rl_tensor_release(&part);
        at += ts[i]->shape[dim];
    }
    return finish(st, out, fresh);
}

rl_status rl_op_index_select(rl_tensor *out, const rl_tensor *a, int dim, const rl_tensor *index) {
    RL_TRY(need_set("index_select", a, "the input"));
    RL_TRY(need_set("index_select", index, "the index"));
    RL_TRY(same_device("index_select", a, index));
    char sa[128], si[128];
    if (index->dtype != RL_INT32 || index->ndim != 1)
        return rl_error(RL_EDTYPE, "index_select: the index must be 1-D int32, got %s",
                        rl_tensor_describe(index, si, sizeof si));
    if (dim < 0 || dim >= a->ndim)
        return rl_error(RL_EINDEX, "index_select: dim %d out of range for %s", dim,
                        rl_shape_str(a, sa, sizeof sa));
    rl_tensor host = {0};
    RL_TRY(rl_op_contiguous(&host, index));
    if (rl_tensor_device(index).type != RL_CPU) {
        rl_tensor h = {0};
        rl_status st = rl_op_to(&h, &host, RL_INT32, RL_DEVICE_CPU);
        rl_tensor_release(&host);
        RL_TRY(st);
        host = h;
    }
    const int32_t *ix = rl_tensor_data(&host);
    int64_t n = index->shape[0];
    for (int64_t j = 0; j < n; j++) {
        if (ix[j] < 0 || ix[j] >= a->shape[dim]) {
            int32_t bad = ix[j];
            rl_tensor_release(&host);
            return rl_error(RL_EINDEX, "index_select: index %d out of range for dim %d of %s",
                            (int)bad, dim, rl_shape_str(a, sa, sizeof sa));
        }
    }
    rl_tensor_release(&host);
    int64_t shape[RL_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[dim] = n;
    const rl_kernels *k;
    bool fresh;
    RL_TRY(kernels_of("index_select", a, &k));
    RL_TRY(prepare_out("index_select", out, a->dtype, rl_tensor_device(a), a->ndim, shape, &fresh));
    if (rl_tensor_numel(out) == 0) return RL_OK;
    return finish(k->index_select(out, a, dim, index), out, fresh);
}

/* ---- sequences and random numbers ---- */

rl_status rl_op_arange(rl_tensor *t, double start, double step) {
    RL_TRY(need_set("arange", t, "the tensor"));
    if (t->ndim != 1) {
        char s[128];
        return rl_error(RL_ESHAPE, "arange: needs a 1-D tensor, got %s",
                        rl_shape_str(t, s, sizeof s));
    }
    RL_TRY(int32_value("arange", t->dtype, start, "start"));
    RL_TRY(int32_value("arange", t->dtype, start + step * (double)(t->shape[0] - 1), "end"));
    const rl_kernels *k;
    RL_TRY(kernels_of("arange", t, &k));
    if (t->shape[0] == 0) return RL_OK;
    return k->arange(t, start, step);
}

rl_status rl_op_uniform(rl_tensor *t, rl_rng *g, double lo, double hi) {
    RL_TRY(need_set("uniform", t, "the tensor"));
    RL_TRY(need_float("uniform", t));
    const rl_kernels *k;
    RL_TRY(kernels_of("uniform", t, &k));
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    if (!g) g = rl_rng_default();
    uint64_t offset = rl_rng_reserve(g, (uint64_t)n);
    return k->uniform(t, g->seed, offset, lo, hi);
}

rl_status rl_op_normal(rl_tensor *t, rl_rng *g, double mean, double std) {
    RL_TRY(need_set("normal", t, "the tensor"));
    RL_TRY(need_float("normal", t));
    const rl_kernels *k;
    RL_TRY(kernels_of("normal", t, &k));
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    if (!g) g = rl_rng_default();
    uint64_t offset = rl_rng_reserve(g, 2 * (uint64_t)n);
    return k->normal(t, g->seed, offset, mean, std);
}

rl_status rl_op_synchronize(rl_device dev) {
    if (dev.type == RL_CPU) return RL_OK;
    RL_TRY(rl_device_check(dev));
    const rl_kernels *k = cuda_kernels();
    if (!k) return rl_error(RL_EDEVICE, "synchronize: no CUDA kernels in this build");
    return k->synchronize(dev.index);
}
