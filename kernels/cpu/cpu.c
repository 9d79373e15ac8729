/* The CPU kernels: the rl_kernels table of kernels/backend.h for host memory.
 *
 * Every elementwise kernel runs through for_rows(): the operands' dims are folded together
 * where every operand is contiguous across them, and the innermost folded dim becomes a "row"
 * handed to a row function with one element stride per operand. Contiguous tensors thus become
 * one long row, and the row functions have fast paths for unit strides (and for a stride-0
 * operand, i.e. a broadcast scalar) in which the switch on the op sits outside the loop, so
 * each case is a simple loop over a constant-op formula that the compiler vectorises.
 * The formulas themselves come from kernels/pointwise.h and core/philox.h, shared with CUDA.
 *
 * Reductions accumulate in double (float32 sums of a million ones are exact); max/min keep
 * the first occurrence and let NaN win. gemm goes to BLAS (core/blas.h), one call per batch.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../core/blas.h"
#include "../../core/philox.h"
#include "../backend.h"
#include "../pointwise.h"
#include "gemm_bf16.h"
#include "parallel.h"

#define MAX_OPS 3

/* One row: n elements; p[k] points at operand k's first element, s[k] is its stride in
 * elements. ctx is the kernel's parameters (and, for the RNG, its running element count). */
typedef void (*row_fn)(void *ctx, int64_t n, char *const *p, const int64_t *s);

/* Runs fn over every row of the operands ts[0..nops-1], which all have ts[0]'s shape, in
 * row-major order of that shape. */
static void for_rows(int nops, const rl_tensor *const *ts, row_fn fn, void *ctx) {
    const rl_tensor *t0 = ts[0];
    int64_t shape[RL_MAX_DIMS], stride[MAX_OPS][RL_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 0) return;
        if (t0->shape[d] == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++)
            merge = stride[k][nd - 1] == ts[k]->stride[d] * t0->shape[d];
        if (merge) {
            shape[nd - 1] *= t0->shape[d];
            for (int k = 0; k < nops; k++)
                stride[k][nd - 1] = ts[k]->stride[d];
            continue;
        }
        shape[nd] = t0->shape[d];
        for (int k = 0; k < nops; k++)
            stride[k][nd] = ts[k]->stride[d];
        nd++;
    }
    if (nd == 0) { /* one element */
        shape[0] = 1;
        for (int k = 0; k < nops; k++)
            stride[k][0] = 1;
        nd = 1;
    }
    char *base[MAX_OPS], *p[MAX_OPS];
    int64_t es[MAX_OPS], s[MAX_OPS];
    int inner = nd - 1;
    for (int k = 0; k < nops; k++) {
        base[k] = (char *)rl_tensor_data(ts[k]);
        es[k] = (int64_t)rl_dtype_size(ts[k]->dtype);
        s[k] = stride[k][inner];
    }
    int64_t rows = 1, idx[RL_MAX_DIMS] = {0};
    for (int d = 0; d < inner; d++)
        rows *= shape[d];
    for (int64_t r = 0; r < rows; r++) {
        for (int k = 0; k < nops; k++) {
            int64_t off = 0;
            for (int d = 0; d < inner; d++)
                off += idx[d] * stride[k][d];
            p[k] = base[k] + off * es[k];
        }
        fn(ctx, shape[inner], p, s);
        for (int d = inner - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* float -> int32 as CUDA's conversion does it: toward zero, saturating, NaN -> 0 (a plain C
 * cast would be undefined outside the int32 range). */
static inline int32_t to_i32(double x) {
    if (x != x) return 0;
    if (x >= 2147483647.0) return INT32_MAX;
    if (x <= -2147483648.0) return INT32_MIN;
    return (int32_t)x;
}

static double load(const char *p, rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return *(const float *)p;
    case RL_FLOAT64: return *(const double *)p;
    default: return *(const int32_t *)p;
    }
}

static void store(char *p, rl_dtype dt, double v) {
    switch (dt) {
    case RL_FLOAT32: *(float *)p = (float)v; break;
    case RL_FLOAT64: *(double *)p = v; break;
    default: *(int32_t *)p = to_i32(v); break;
    }
}

/* The op lists for the switches of the fast paths (one case per op). */
// clang-format off
#define FOR_EACH_UNARY(X)                                                                          \
    X(RL_UN_NEG) X(RL_UN_ABS) X(RL_UN_SIGN) X(RL_UN_EXP) X(RL_UN_LOG) X(RL_UN_LOG1P)               \
    X(RL_UN_EXPM1) X(RL_UN_SQRT) X(RL_UN_RSQRT) X(RL_UN_SQUARE) X(RL_UN_RECIPROCAL) X(RL_UN_SIN)   \
    X(RL_UN_COS) X(RL_UN_TANH) X(RL_UN_SIGMOID) X(RL_UN_RELU) X(RL_UN_ELU) X(RL_UN_SOFTPLUS)       \
    X(RL_UN_FLOOR) X(RL_UN_CEIL) X(RL_UN_ROUND) X(RL_UN_CLAMP)

#define FOR_EACH_BINARY(X)                                                                         \
    X(RL_BIN_ADD) X(RL_BIN_SUB) X(RL_BIN_MUL) X(RL_BIN_DIV) X(RL_BIN_POW) X(RL_BIN_MAX)            \
    X(RL_BIN_MIN) X(RL_BIN_EQ) X(RL_BIN_NE) X(RL_BIN_LT) X(RL_BIN_LE) X(RL_BIN_GT) X(RL_BIN_GE)
// clang-format on

/* ---- fill ---- */

typedef struct {
    rl_dtype dt;
    double value;
} fill_ctx;

static void fill_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const fill_ctx *c = ctx;
    int64_t st = s[0];
    switch (c->dt) {
    case RL_FLOAT32: {
        float *o = (float *)p[0], v = (float)c->value;
        int64_t i = 0;
        if (st == 1) /* fixed-size blocks vectorise at -O2, see VB below */
            for (; i + 16 <= n; i += 16)
                for (int j = 0; j < 16; j++)
                    o[i + j] = v;
        for (; i < n; i++)
            o[i * st] = v;
        break;
    }
    case RL_FLOAT64: {
        double *o = (double *)p[0], v = c->value;
        for (int64_t i = 0; i < n; i++)
            o[i * st] = v;
        break;
    }
    default: {
        int32_t *o = (int32_t *)p[0], v = to_i32(c->value);
        for (int64_t i = 0; i < n; i++)
            o[i * st] = v;
        break;
    }
    }
}

typedef struct {
    fill_ctx c;
    char *base;
    int64_t n, es;
} fill_job;

/* Part `part` of `parts` fills elements lo .. hi-1 (multiples of 16) of a contiguous tensor. */
static void fill_part(void *ctx, int part, int parts) {
    fill_job *j = ctx;
    int64_t units = (j->n + 15) / 16;
    int64_t lo = units * part / parts * 16, hi = units * (part + 1) / parts * 16;
    if (hi > j->n) hi = j->n;
    if (lo >= hi) return;
    char *p[1] = {j->base + lo * j->es};
    int64_t s[1] = {1};
    fill_rows(&j->c, hi - lo, p, s);
}

/* Elements of a contiguous fill worth a handoff: zeroing a model's gradients (G2P: ~0.5 M
 * floats) each step would otherwise be serial work on the calling thread. */
#define FILL_PAR_MIN (1 << 16)

static rl_status cpu_fill(rl_tensor *t, double value) {
    fill_ctx c = {t->dtype, value};
    int64_t n = rl_tensor_numel(t);
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > 1 && n >= FILL_PAR_MIN && rl_tensor_is_contiguous(t)) {
        fill_job j = {c, rl_tensor_data(t), n, (int64_t)rl_dtype_size(t->dtype)};
        rl_cpu_parallel(parts, fill_part, &j);
        return RL_OK;
    }
    const rl_tensor *ts[1] = {t};
    for_rows(1, ts, fill_rows, &c);
    return RL_OK;
}

/* ---- copy with dtype conversion ---- */

typedef struct {
    rl_dtype dst, src;
} copy_ctx;

#define COPY_LOOP(TD, TS, CONV)                                                                    \
    do {                                                                                           \
        TD *o_ = (TD *)p[0];                                                                       \
        const TS *a_ = (const TS *)p[1];                                                           \
        if (s[0] == 1 && s[1] == 1)                                                                \
            for (int64_t i = 0; i < n; i++)                                                        \
                o_[i] = CONV(a_[i]);                                                               \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                o_[i * s[0]] = CONV(a_[i * s[1]]);                                                 \
    } while (0)

#define AS_FLOAT(x) ((float)(x))
#define AS_DOUBLE(x) ((double)(x))
#define AS_SAME(x) (x)

static void copy_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const copy_ctx *c = ctx;
    if (c->dst == c->src && s[0] == 1 && s[1] == 1) {
        memmove(p[0], p[1], (size_t)n * rl_dtype_size(c->dst));
        return;
    }
    switch (c->dst * RL_NUM_DTYPES + c->src) {
    case RL_FLOAT32 *RL_NUM_DTYPES + RL_FLOAT32: COPY_LOOP(float, float, AS_SAME); break;
    case RL_FLOAT32 *RL_NUM_DTYPES + RL_FLOAT64: COPY_LOOP(float, double, AS_FLOAT); break;
    case RL_FLOAT32 *RL_NUM_DTYPES + RL_INT32: COPY_LOOP(float, int32_t, AS_FLOAT); break;
    case RL_FLOAT64 *RL_NUM_DTYPES + RL_FLOAT32: COPY_LOOP(double, float, AS_DOUBLE); break;
    case RL_FLOAT64 *RL_NUM_DTYPES + RL_FLOAT64: COPY_LOOP(double, double, AS_SAME); break;
    case RL_FLOAT64 *RL_NUM_DTYPES + RL_INT32: COPY_LOOP(double, int32_t, AS_DOUBLE); break;
    case RL_INT32 *RL_NUM_DTYPES + RL_FLOAT32: COPY_LOOP(int32_t, float, to_i32); break;
    case RL_INT32 *RL_NUM_DTYPES + RL_FLOAT64: COPY_LOOP(int32_t, double, to_i32); break;
    default: COPY_LOOP(int32_t, int32_t, AS_SAME); break;
    }
}

static rl_status cpu_copy(rl_tensor *dst, const rl_tensor *src) {
    copy_ctx c = {dst->dtype, src->dtype};
    const rl_tensor *ts[2] = {dst, src};
    for_rows(2, ts, copy_rows, &c);
    return RL_OK;
}

/* ---- unary ---- */

/* Contiguous loops are written in blocks of VB elements staged through local arrays: at -O2
 * GCC (cost model "very-cheap") vectorises a loop only when it needs neither a scalar epilogue
 * nor a run-time alias check, and a fixed-size block over locals needs neither, even when out
 * is the input itself (in place). `op` and the unit/zero strides are constants after inlining. */
#define VB 16

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE void unary_block_f32(rl_unary_op op, int64_t n, float *o, const float *a, float p0,
                                   float p1) {
    int64_t i = 0;
    for (; i + VB <= n; i += VB) {
        float x[VB];
        for (int j = 0; j < VB; j++)
            x[j] = a[i + j];
        for (int j = 0; j < VB; j++)
            x[j] = rl_unary_f32(op, x[j], p0, p1);
        for (int j = 0; j < VB; j++)
            o[i + j] = x[j];
    }
    for (; i < n; i++)
        o[i] = rl_unary_f32(op, a[i], p0, p1);
}

ALWAYS_INLINE void unary_block_f64(rl_unary_op op, int64_t n, double *o, const double *a, double p0,
                                   double p1) {
    int64_t i = 0;
    for (; i + VB <= n; i += VB) {
        double x[VB];
        for (int j = 0; j < VB; j++)
            x[j] = a[i + j];
        for (int j = 0; j < VB; j++)
            x[j] = rl_unary_f64(op, x[j], p0, p1);
        for (int j = 0; j < VB; j++)
            o[i + j] = x[j];
    }
    for (; i < n; i++)
        o[i] = rl_unary_f64(op, a[i], p0, p1);
}

static void unary_f32(rl_unary_op op, int64_t n, float *o, int64_t so, const float *a, int64_t sa,
                      float p0, float p1) {
    if (so == 1 && sa == 1) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: unary_block_f32(OP, n, o, a, p0, p1); break;
            FOR_EACH_UNARY(X)
#undef X
        default: break;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        o[i * so] = rl_unary_f32(op, a[i * sa], p0, p1);
}

static void unary_f64(rl_unary_op op, int64_t n, double *o, int64_t so, const double *a, int64_t sa,
                      double p0, double p1) {
    if (so == 1 && sa == 1) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: unary_block_f64(OP, n, o, a, p0, p1); break;
            FOR_EACH_UNARY(X)
#undef X
        default: break;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        o[i * so] = rl_unary_f64(op, a[i * sa], p0, p1);
}

typedef struct {
    rl_unary_op op;
    rl_dtype dt;
    double p0, p1;
} unary_row_ctx;

static void unary_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const unary_row_ctx *c = ctx;
    switch (c->dt) {
    case RL_FLOAT32:
        unary_f32(c->op, n, (float *)p[0], s[0], (const float *)p[1], s[1], (float)c->p0,
                  (float)c->p1);
        break;
    case RL_FLOAT64:
        unary_f64(c->op, n, (double *)p[0], s[0], (const double *)p[1], s[1], c->p0, c->p1);
        break;
    default: {
        int32_t *o = (int32_t *)p[0], p0 = to_i32(c->p0), p1 = to_i32(c->p1);
        const int32_t *a = (const int32_t *)p[1];
        for (int64_t i = 0; i < n; i++)
            o[i * s[0]] = rl_unary_i32(c->op, a[i * s[1]], p0, p1);
        break;
    }
    }
}

static rl_status cpu_unary(rl_tensor *out, const rl_tensor *a, rl_unary_op op, double p0,
                           double p1) {
    unary_row_ctx c = {op, a->dtype, p0, p1};
    const rl_tensor *ts[2] = {out, a};
    for_rows(2, ts, unary_rows, &c);
    return RL_OK;
}

/* ---- binary (a scalar operand is a stride-0 operand) ---- */

/* sa and sb are 1 (a row) or 0 (a scalar) */
ALWAYS_INLINE void binary_block_f32(rl_binary_op op, int64_t n, float *o, const float *a,
                                    int64_t sa, const float *b, int64_t sb) {
    int64_t i = 0;
    for (; i + VB <= n; i += VB) {
        float x[VB], y[VB];
        for (int j = 0; j < VB; j++)
            x[j] = a[(i + j) * sa];
        for (int j = 0; j < VB; j++)
            y[j] = b[(i + j) * sb];
        for (int j = 0; j < VB; j++)
            x[j] = rl_binary_f32(op, x[j], y[j]);
        for (int j = 0; j < VB; j++)
            o[i + j] = x[j];
    }
    for (; i < n; i++)
        o[i] = rl_binary_f32(op, a[i * sa], b[i * sb]);
}

ALWAYS_INLINE void binary_block_f64(rl_binary_op op, int64_t n, double *o, const double *a,
                                    int64_t sa, const double *b, int64_t sb) {
    int64_t i = 0;
    for (; i + VB <= n; i += VB) {
        double x[VB], y[VB];
        for (int j = 0; j < VB; j++)
            x[j] = a[(i + j) * sa];
        for (int j = 0; j < VB; j++)
            y[j] = b[(i + j) * sb];
        for (int j = 0; j < VB; j++)
            x[j] = rl_binary_f64(op, x[j], y[j]);
        for (int j = 0; j < VB; j++)
            o[i + j] = x[j];
    }
    for (; i < n; i++)
        o[i] = rl_binary_f64(op, a[i * sa], b[i * sb]);
}

static void binary_f32(rl_binary_op op, int64_t n, float *o, int64_t so, const float *a, int64_t sa,
                       const float *b, int64_t sb) {
    if (so == 1 && sa == 1 && sb == 1) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: binary_block_f32(OP, n, o, a, 1, b, 1); break;
            FOR_EACH_BINARY(X)
#undef X
        default: break;
        }
    } else if (so == 1 && sa == 1 && sb == 0) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: binary_block_f32(OP, n, o, a, 1, b, 0); break;
            FOR_EACH_BINARY(X)
#undef X
        default: break;
        }
    } else if (so == 1 && sa == 0 && sb == 1) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: binary_block_f32(OP, n, o, a, 0, b, 1); break;
            FOR_EACH_BINARY(X)
#undef X
        default: break;
        }
    } else {
        for (int64_t i = 0; i < n; i++)
            o[i * so] = rl_binary_f32(op, a[i * sa], b[i * sb]);
    }
}

static void binary_f64(rl_binary_op op, int64_t n, double *o, int64_t so, const double *a,
                       int64_t sa, const double *b, int64_t sb) {
    if (so == 1 && sa == 1 && sb == 1) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: binary_block_f64(OP, n, o, a, 1, b, 1); break;
            FOR_EACH_BINARY(X)
#undef X
        default: break;
        }
    } else if (so == 1 && sa == 1 && sb == 0) {
        switch (op) {
#define X(OP)                                                                                      \
    case OP: binary_block_f64(OP, n, o, a, 1, b, 0); break;
            FOR_EACH_BINARY(X)
#undef X
        default: break;
        }
    } else {
        for (int64_t i = 0; i < n; i++)
            o[i * so] = rl_binary_f64(op, a[i * sa], b[i * sb]);
    }
}

static void binary_i32(rl_binary_op op, int64_t n, int32_t *o, int64_t so, const int32_t *a,
                       int64_t sa, const int32_t *b, int64_t sb) {
    for (int64_t i = 0; i < n; i++)
        o[i * so] = rl_binary_i32(op, a[i * sa], b[i * sb]);
}

typedef struct {
    rl_binary_op op;
    rl_dtype dt;
} binary_ctx;

static void binary_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const binary_ctx *c = ctx;
    switch (c->dt) {
    case RL_FLOAT32:
        binary_f32(c->op, n, (float *)p[0], s[0], (const float *)p[1], s[1], (const float *)p[2],
                   s[2]);
        break;
    case RL_FLOAT64:
        binary_f64(c->op, n, (double *)p[0], s[0], (const double *)p[1], s[1], (const double *)p[2],
                   s[2]);
        break;
    default:
        binary_i32(c->op, n, (int32_t *)p[0], s[0], (const int32_t *)p[1], s[1],
                   (const int32_t *)p[2], s[2]);
        break;
    }
}

static rl_status cpu_binary(rl_tensor *out, const rl_tensor *a, const rl_tensor *b,
                            rl_binary_op op) {
    binary_ctx c = {op, a->dtype};
    const rl_tensor *ts[3] = {out, a, b};
    for_rows(3, ts, binary_rows, &c);
    return RL_OK;
}

typedef struct {
    rl_binary_op op;
    rl_dtype dt;
    bool scalar_first;
    union {
        float f32;
        double f64;
        int32_t i32;
    } s;
} scalar_ctx;

static void scalar_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const scalar_ctx *c = ctx;
    switch (c->dt) {
    case RL_FLOAT32:
        if (c->scalar_first)
            binary_f32(c->op, n, (float *)p[0], s[0], &c->s.f32, 0, (const float *)p[1], s[1]);
        else
            binary_f32(c->op, n, (float *)p[0], s[0], (const float *)p[1], s[1], &c->s.f32, 0);
        break;
    case RL_FLOAT64:
        if (c->scalar_first)
            binary_f64(c->op, n, (double *)p[0], s[0], &c->s.f64, 0, (const double *)p[1], s[1]);
        else
            binary_f64(c->op, n, (double *)p[0], s[0], (const double *)p[1], s[1], &c->s.f64, 0);
        break;
    default:
        if (c->scalar_first)
            binary_i32(c->op, n, (int32_t *)p[0], s[0], &c->s.i32, 0, (const int32_t *)p[1], s[1]);
        else
            binary_i32(c->op, n, (int32_t *)p[0], s[0], (const int32_t *)p[1], s[1], &c->s.i32, 0);
        break;
    }
}

static rl_status cpu_binary_scalar(rl_tensor *out, const rl_tensor *a, double s, rl_binary_op op,
                                   bool scalar_first) {
    scalar_ctx c = {.op = op, .dt = a->dtype, .scalar_first = scalar_first};
    if (a->dtype == RL_FLOAT32)
        c.s.f32 = (float)s;
    else if (a->dtype == RL_FLOAT64)
        c.s.f64 = s;
    else
        c.s.i32 = to_i32(s);
    const rl_tensor *ts[2] = {out, a};
    for_rows(2, ts, scalar_rows, &c);
    return RL_OK;
}

/* ---- masked_fill ---- */

typedef struct {
    rl_dtype dt, mask_dt;
    double value;
} mask_ctx;

static void mask_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const mask_ctx *c = ctx;
    int64_t es = (int64_t)rl_dtype_size(c->dt), ms = (int64_t)rl_dtype_size(c->mask_dt);
    if (s[1] == 0) {
        /* one mask value for the whole row (a mask broadcast along the last axis, as conv2d's
         * padded positions over the channels): read once, and a float32 row stored without a
         * dtype switch per element (the per-element path took 7% of an htr_lines step) */
        if (load(p[1], c->mask_dt) == 0.0) return;
        if (c->dt == RL_FLOAT32) {
            float v = (float)c->value, *a = (float *)p[0];
            for (int64_t i = 0; i < n; i++)
                a[i * s[0]] = v;
        } else {
            for (int64_t i = 0; i < n; i++)
                store(p[0] + i * s[0] * es, c->dt, c->value);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        if (load(p[1] + i * s[1] * ms, c->mask_dt) != 0.0)
            store(p[0] + i * s[0] * es, c->dt, c->value);
}

static rl_status cpu_masked_fill(rl_tensor *a, const rl_tensor *mask, double value) {
    mask_ctx c = {a->dtype, mask->dtype, value};
    const rl_tensor *ts[2] = {a, mask};
    for_rows(2, ts, mask_rows, &c);
    return RL_OK;
}

/* ---- reductions ---- */

/* For float inputs every op works on doubles; `dt` is a constant after inlining. */
static inline __attribute__((always_inline)) double elem(const char *p, rl_dtype dt, int64_t i) {
    return dt == RL_FLOAT32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* NaN wins, and among equal values the first: the test reads "v replaces best". */
static inline bool beats_max(double v, double best) { return v > best || (v != v && best == best); }
static inline bool beats_min(double v, double best) { return v < best || (v != v && best == best); }

/* One reduction of len elements at stride rs. Sums over a unit stride use eight lanes (a fixed
 * order, so the result depends on nothing but the data). */
static inline __attribute__((always_inline)) double
red_line(rl_reduce_op op, rl_dtype dt, const char *a, int64_t len, int64_t rs, int64_t *arg) {
    double acc = 0.0;
    *arg = 0;
    switch (op) {
    case RL_RED_SUM:
    case RL_RED_MEAN:
    case RL_RED_NORM: {
        bool sq = op == RL_RED_NORM;
        int64_t i = 0;
        if (rs == 1) { /* eight lanes, added up in a fixed order at the end */
            double t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (sq)
                for (; i + 8 <= len; i += 8)
                    for (int j = 0; j < 8; j++)
                        t[j] += elem(a, dt, i + j) * elem(a, dt, i + j);
            else
                for (; i + 8 <= len; i += 8)
                    for (int j = 0; j < 8; j++)
                        t[j] += elem(a, dt, i + j);
            acc = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
        }
        for (; i < len; i++) {
            double v = elem(a, dt, i * rs);
            acc += sq ? v * v : v;
        }
        if (op == RL_RED_MEAN)
            acc /= (double)len;
        else if (sq)
            acc = sqrt(acc);
        return acc;
    }
    case RL_RED_PROD:
        acc = 1.0;
        for (int64_t i = 0; i < len; i++)
            acc *= elem(a, dt, i * rs);
        return acc;
    case RL_RED_MAX:
    case RL_RED_MIN: {
        bool mx = op == RL_RED_MAX;
        acc = elem(a, dt, 0);
        for (int64_t i = 1; i < len; i++) {
            double v = elem(a, dt, i * rs);
            if (mx ? beats_max(v, acc) : beats_min(v, acc)) {
                acc = v;
                *arg = i;
            }
        }
        return acc;
    }
    default: return acc;
    }
}

static double red_line_f32(rl_reduce_op op, const char *a, int64_t len, int64_t rs, int64_t *arg) {
    return red_line(op, RL_FLOAT32, a, len, rs, arg);
}

static double red_line_f64(rl_reduce_op op, const char *a, int64_t len, int64_t rs, int64_t *arg) {
    return red_line(op, RL_FLOAT64, a, len, rs, arg);
}

#define RED_CHUNK 1024

/* Reduces n neighbouring columns at once (the reduced dim is not the unit-stride one): walks
 * the rows of a in memory order and keeps RED_CHUNK accumulators. */
static inline __attribute__((always_inline)) void red_columns(rl_reduce_op op, rl_dtype dt,
                                                              int64_t n, const char *a, int64_t len,
                                                              int64_t rs, double *acc,
                                                              int64_t *arg) {
    size_t es = rl_dtype_size(dt);
    bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
    for (int64_t j = 0; j < n; j++) {
        acc[j] = ext ? elem(a, dt, j) : (op == RL_RED_PROD ? 1.0 : 0.0);
        arg[j] = 0;
    }
    for (int64_t r = ext ? 1 : 0; r < len; r++) {
        const char *row = a + (size_t)(r * rs) * es;
        switch (op) {
        case RL_RED_SUM:
        case RL_RED_MEAN:
            for (int64_t j = 0; j < n; j++)
                acc[j] += elem(row, dt, j);
            break;
        case RL_RED_NORM:
            for (int64_t j = 0; j < n; j++) {
                double v = elem(row, dt, j);
                acc[j] += v * v;
            }
            break;
        case RL_RED_PROD:
            for (int64_t j = 0; j < n; j++)
                acc[j] *= elem(row, dt, j);
            break;
        case RL_RED_MAX:
            for (int64_t j = 0; j < n; j++) {
                double v = elem(row, dt, j);
                if (beats_max(v, acc[j])) {
                    acc[j] = v;
                    arg[j] = r;
                }
            }
            break;
        default:
            for (int64_t j = 0; j < n; j++) {
                double v = elem(row, dt, j);
                if (beats_min(v, acc[j])) {
                    acc[j] = v;
                    arg[j] = r;
                }
            }
            break;
        }
    }
    for (int64_t j = 0; j < n; j++) {
        if (op == RL_RED_MEAN)
            acc[j] /= (double)len;
        else if (op == RL_RED_NORM)
            acc[j] = sqrt(acc[j]);
    }
}

static void red_columns_f32(rl_reduce_op op, int64_t n, const char *a, int64_t len, int64_t rs,
                            double *acc, int64_t *arg) {
    red_columns(op, RL_FLOAT32, n, a, len, rs, acc, arg);
}

static void red_columns_f64(rl_reduce_op op, int64_t n, const char *a, int64_t len, int64_t rs,
                            double *acc, int64_t *arg) {
    red_columns(op, RL_FLOAT64, n, a, len, rs, acc, arg);
}

static int32_t red_line_i32(rl_reduce_op op, const int32_t *a, int64_t len, int64_t rs,
                            int64_t *arg) {
    *arg = 0;
    switch (op) {
    case RL_RED_SUM: {
        uint32_t acc = 0;
        for (int64_t i = 0; i < len; i++)
            acc += (uint32_t)a[i * rs];
        return (int32_t)acc;
    }
    case RL_RED_PROD: {
        uint32_t acc = 1;
        for (int64_t i = 0; i < len; i++)
            acc *= (uint32_t)a[i * rs];
        return (int32_t)acc;
    }
    case RL_RED_MAX:
    case RL_RED_MIN: {
        int32_t best = a[0];
        for (int64_t i = 1; i < len; i++) {
            int32_t v = a[i * rs];
            if (op == RL_RED_MAX ? v > best : v < best) {
                best = v;
                *arg = i;
            }
        }
        return best;
    }
    default: return 0; /* mean and norm of int32 are refused by the dispatcher */
    }
}

typedef struct {
    rl_reduce_op op;
    rl_dtype dt;
    int64_t len, rs; /* length and stride of the reduced dim */
    bool want_idx;
} red_ctx;

/* p[0] out, p[1] a at the start of each reduction, p[2] indices (when wanted). */
static void red_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const red_ctx *c = ctx;
    size_t es = rl_dtype_size(c->dt);
    int32_t *idx = c->want_idx ? (int32_t *)p[2] : NULL;
    int64_t arg;
    if (c->dt == RL_INT32) {
        for (int64_t j = 0; j < n; j++) {
            ((int32_t *)p[0])[j * s[0]] =
                red_line_i32(c->op, (const int32_t *)p[1] + j * s[1], c->len, c->rs, &arg);
            if (idx) idx[j * s[2]] = (int32_t)arg;
        }
        return;
    }
    bool f32 = c->dt == RL_FLOAT32;
    if (s[1] == 1 && c->rs != 1 && n > 1 && c->len > 0) {
        double acc[RED_CHUNK];
        int64_t args[RED_CHUNK];
        for (int64_t j0 = 0; j0 < n; j0 += RED_CHUNK) {
            int64_t m = n - j0 < RED_CHUNK ? n - j0 : RED_CHUNK;
            const char *a = p[1] + (size_t)j0 * es;
            if (f32)
                red_columns_f32(c->op, m, a, c->len, c->rs, acc, args);
            else
                red_columns_f64(c->op, m, a, c->len, c->rs, acc, args);
            for (int64_t j = 0; j < m; j++) {
                store(p[0] + (size_t)((j0 + j) * s[0]) * es, c->dt, acc[j]);
                if (idx) idx[(j0 + j) * s[2]] = (int32_t)args[j];
            }
        }
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const char *a = p[1] + (size_t)(j * s[1]) * es;
        double v = f32 ? red_line_f32(c->op, a, c->len, c->rs, &arg)
                       : red_line_f64(c->op, a, c->len, c->rs, &arg);
        store(p[0] + (size_t)(j * s[0]) * es, c->dt, v);
        if (idx) idx[j * s[2]] = (int32_t)arg;
    }
}

static rl_status cpu_reduce(rl_tensor *out, rl_tensor *indices, const rl_tensor *a, int dim,
                            rl_reduce_op op) {
    rl_tensor start = *a; /* a borrowed view: the first element of every reduction */
    start.shape[dim] = 1;
    red_ctx c = {op, a->dtype, a->shape[dim], a->stride[dim], indices != NULL};
    const rl_tensor *ts[3] = {out, &start, indices};
    for_rows(indices ? 3 : 2, ts, red_rows, &c);
    return RL_OK;
}

/* ---- gemm ---- */

static rl_status cpu_gemm(rl_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          double alpha, const void *a, int64_t lda, int64_t stride_a, const void *b,
                          int64_t ldb, int64_t stride_b, double beta, void *c, int64_t ldc,
                          int64_t stride_c, int64_t batch) {
    rl_bf16_ctx *bf16 = dt == RL_FLOAT32 ? rl_bf16_active() : NULL;
    for (int64_t i = 0; i < batch; i++) {
        if (bf16)
            RL_TRY(rl_gemm_bf16_ctx(
                bf16, trans_a, trans_b, m, n, k, (float)alpha, (const float *)a + i * stride_a, lda,
                (const float *)b + i * stride_b, ldb, (float)beta, (float *)c + i * stride_c, ldc));
        else if (dt == RL_FLOAT32)
            rl_blas_sgemm(trans_a, trans_b, m, n, k, (float)alpha, (const float *)a + i * stride_a,
                          lda, (const float *)b + i * stride_b, ldb, (float)beta,
                          (float *)c + i * stride_c, ldc);
        else if (dt == RL_FLOAT64)
            rl_blas_dgemm(trans_a, trans_b, m, n, k, alpha, (const double *)a + i * stride_a, lda,
                          (const double *)b + i * stride_b, ldb, beta, (double *)c + i * stride_c,
                          ldc);
        else
            return rl_error(RL_EDTYPE, "gemm: %s is not a float dtype", rl_dtype_name(dt));
    }
    return RL_OK;
}

/* ---- index_select ---- */

static rl_status cpu_index_select(rl_tensor *out, const rl_tensor *a, int dim,
                                  const rl_tensor *index) {
    const int32_t *ix = (const int32_t *)rl_tensor_data(index);
    int64_t n = index->ndim ? index->shape[0] : 1, is = index->ndim ? index->stride[0] : 0;
    for (int64_t j = 0; j < n; j++) {
        rl_tensor src = *a, dst = *out; /* borrowed slices */
        src.offset += (int64_t)ix[j * is] * a->stride[dim];
        src.shape[dim] = 1;
        dst.offset += j * out->stride[dim];
        dst.shape[dim] = 1;
        cpu_copy(&dst, &src);
    }
    return RL_OK;
}

/* ---- sequences and random numbers ---- */

static rl_status cpu_arange(rl_tensor *t, double start, double step) {
    size_t es = rl_dtype_size(t->dtype);
    char *p = (char *)rl_tensor_data(t);
    int64_t n = rl_tensor_numel(t), st = t->ndim ? t->stride[0] : 0;
    for (int64_t i = 0; i < n; i++)
        store(p + (size_t)(i * st) * es, t->dtype, start + (double)i * step);
    return RL_OK;
}

/* The running element count carries the row-major position across rows. */
typedef struct {
    uint64_t seed, offset;
    double a, b; /* lo, hi-lo for uniform; mean, std for normal */
    rl_dtype dt;
    uint64_t i, block_no;
    rl_philox_block block;
} rand_ctx;

static uint32_t rand_word(rand_ctx *c, uint64_t w) {
    if (w / 4 != c->block_no) {
        c->block_no = w / 4;
        c->block = rl_philox(c->seed, 0, c->offset + c->block_no);
    }
    return c->block.v[w % 4];
}

static void uniform_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    rand_ctx *c = ctx;
    size_t es = rl_dtype_size(c->dt);
    for (int64_t j = 0; j < n; j++, c->i++) {
        double u = rl_u32_to_unit(rand_word(c, c->i));
        store(p[0] + (size_t)(j * s[0]) * es, c->dt, c->a + c->b * u);
    }
}

static void normal_rows(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    rand_ctx *c = ctx;
    size_t es = rl_dtype_size(c->dt);
    for (int64_t j = 0; j < n; j++, c->i++) {
        double u1 = rl_u32_to_unit_open(rand_word(c, 2 * c->i));
        double u2 = rl_u32_to_unit(rand_word(c, 2 * c->i + 1));
        store(p[0] + (size_t)(j * s[0]) * es, c->dt, c->a + c->b * rl_box_muller(u1, u2));
    }
}

static rl_status cpu_uniform(rl_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi) {
    rand_ctx c = {seed, offset, lo, hi - lo, t->dtype, 0, UINT64_MAX, {{0, 0, 0, 0}}};
    const rl_tensor *ts[1] = {t};
    for_rows(1, ts, uniform_rows, &c);
    return RL_OK;
}

static rl_status cpu_normal(rl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
    rand_ctx c = {seed, offset, mean, std, t->dtype, 0, UINT64_MAX, {{0, 0, 0, 0}}};
    const rl_tensor *ts[1] = {t};
    for_rows(1, ts, normal_rows, &c);
    return RL_OK;
}

static rl_status cpu_synchronize(int index) { return RL_OK; }

static const rl_kernels cpu_kernels = {
    .fill = cpu_fill,
    .copy = cpu_copy,
    .unary = cpu_unary,
    .binary = cpu_binary,
    .binary_scalar = cpu_binary_scalar,
    .masked_fill = cpu_masked_fill,
    .reduce = cpu_reduce,
    .gemm = cpu_gemm,
    .index_select = cpu_index_select,
    .arange = cpu_arange,
    .uniform = cpu_uniform,
    .normal = cpu_normal,
    .synchronize = cpu_synchronize,
};

const rl_kernels *rl_kernels_cpu(void) { return &cpu_kernels; }
