/* Tensor operations: the one entry point for math on tensors of any device.
 *
 * Each rl_op_* checks its arguments (dtypes, devices, shapes; errors name the op and the
 * shapes), resolves broadcasting and output allocation, and hands the work to the kernels of
 * the tensors' device (kernels/backend.h: kernels/cpu/ or kernels/cuda/).
 *
 * Output rule, the same for every op with an `out` argument:
 *   - `out` unset (storage == NULL): a new contiguous tensor is allocated for the result;
 *   - `out` set: its shape, dtype and device must equal the result's; the result is written
 *     into it (this is how the Lua in-place methods and the layers avoid allocation).
 *     `out` may be the very same view as an elementwise op's input (in place); any other
 *     overlap between `out` and an input is not supported.
 * All tensors of one op must be on the same device; rl_op_to moves between devices.
 * Dims and indices are 0-based; a negative dim is not accepted here (the Lua layer maps them).
 */
#ifndef RL_OPS_H
#define RL_OPS_H

#include <stdbool.h>

#include "../core/rng.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_UN_NEG = 0,
    RL_UN_ABS,
    RL_UN_SIGN,
    RL_UN_EXP,
    RL_UN_LOG,
    RL_UN_LOG1P,
    RL_UN_EXPM1,
    RL_UN_SQRT,
    RL_UN_RSQRT,
    RL_UN_SQUARE,
    RL_UN_RECIPROCAL,
    RL_UN_SIN,
    RL_UN_COS,
    RL_UN_TANH,
    RL_UN_SIGMOID,
    RL_UN_RELU,
    RL_UN_ELU, /* p0 = alpha */
    RL_UN_SOFTPLUS,
    RL_UN_FLOOR,
    RL_UN_CEIL,
    RL_UN_ROUND,
    RL_UN_CLAMP, /* p0 = lo, p1 = hi */
    RL_NUM_UNARY
} rl_unary_op;

typedef enum {
    RL_BIN_ADD = 0,
    RL_BIN_SUB,
    RL_BIN_MUL,
    RL_BIN_DIV,
    RL_BIN_POW,
    RL_BIN_MAX,
    RL_BIN_MIN,
    /* comparisons give 1 or 0 in the inputs' dtype */
    RL_BIN_EQ,
    RL_BIN_NE,
    RL_BIN_LT,
    RL_BIN_LE,
    RL_BIN_GT,
    RL_BIN_GE,
    RL_NUM_BINARY
} rl_binary_op;

typedef enum {
    RL_RED_SUM = 0,
    RL_RED_MEAN,
    RL_RED_PROD,
    RL_RED_MAX,  /* with indices: argmax (first occurrence) */
    RL_RED_MIN,  /* with indices: argmin (first occurrence) */
    RL_RED_NORM, /* Euclidean norm */
    RL_NUM_REDUCE
} rl_reduce_op;

const char *rl_unary_name(rl_unary_op op);
const char *rl_binary_name(rl_binary_op op);
const char *rl_reduce_name(rl_reduce_op op);
/* true when the unary op needs a float dtype (all but neg, abs, sign, square, clamp) */
bool rl_unary_needs_float(rl_unary_op op);

/* Filling and moving */
rl_status rl_op_fill(rl_tensor *t, double value);
/* dst (set) <- src; src broadcasts to dst's shape; dtypes and devices may differ. */
rl_status rl_op_copy(rl_tensor *dst, const rl_tensor *src);
/* out (unset) becomes src itself (shared) when src is contiguous, else a contiguous copy. */
rl_status rl_op_contiguous(rl_tensor *out, const rl_tensor *src);
/* out (unset) <- a new contiguous tensor of dtype dt on dev holding src's values. */
rl_status rl_op_to(rl_tensor *out, const rl_tensor *src, rl_dtype dt, rl_device dev);
/* A view of src with the given shape when its strides allow, else a contiguous copy. */
rl_status rl_op_reshape(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape);

/* Elementwise */
rl_status rl_op_unary(rl_tensor *out, const rl_tensor *a, rl_unary_op op, double p0, double p1);
rl_status rl_op_binary(rl_tensor *out, const rl_tensor *a, const rl_tensor *b, rl_binary_op op);
/* a op s, or s op a when scalar_first */
rl_status rl_op_binary_scalar(rl_tensor *out, const rl_tensor *a, double s, rl_binary_op op,
                              bool scalar_first);
/* a (set) <- value where mask != 0; mask broadcasts to a's shape, any dtype */
rl_status rl_op_masked_fill(rl_tensor *a, const rl_tensor *mask, double value);

/* Reductions. reduce_all returns the result on the host; `index` (may be NULL) receives the
 * flat 0-based row-major position of the max/min. reduce_dim reduces one dim; `indices` (may
 * be NULL; unset or set, int32) receives arg positions for max/min. Sum/max/min/prod of int32
 * stay int32; mean and norm need a float dtype. An empty reduction: sum 0, prod 1, mean and
 * max/min an error. */
rl_status rl_op_reduce_all(double *result, int64_t *index, const rl_tensor *a, rl_reduce_op op);
rl_status rl_op_reduce_dim(rl_tensor *out, rl_tensor *indices, const rl_tensor *a, int dim,
                           bool keepdim, rl_reduce_op op);

/* Matrix products (float32/float64). gemm: 2-D, c = alpha * op(a) op(b) + beta * c; c unset
 * is allocated (and beta ignored). Views with one unit stride (e.g. transposes) go to BLAS
 * without a copy. matmul: (n)@(n) -> 0-d, (m,k)@(k) -> (m), (m,k)@(k,n) -> (m,n),
 * (b,m,k)@(b,k,n) -> (b,m,n), and a 2-D operand is broadcast over the other's batch. */
rl_status rl_op_gemm(rl_tensor *c, const rl_tensor *a, const rl_tensor *b, bool trans_a,
                     bool trans_b, double alpha, double beta);
rl_status rl_op_matmul(rl_tensor *out, const rl_tensor *a, const rl_tensor *b);

/* Joining and gathering */
rl_status rl_op_cat(rl_tensor *out, const rl_tensor *const *ts, int n, int dim);
/* index: 1-D int32 of 0-based positions along dim, each checked */
rl_status rl_op_index_select(rl_tensor *out, const rl_tensor *a, int dim, const rl_tensor *index);

/* Sequences and random numbers (t set). arange: t[i] = start + i * step over a 1-D t.
 * uniform: [lo, hi); normal: Box-Muller. Both draw from g (see core/rng.h), so the values are
 * the same on every device. */
rl_status rl_op_arange(rl_tensor *t, double start, double step);
rl_status rl_op_uniform(rl_tensor *t, rl_rng *g, double lo, double hi);
rl_status rl_op_normal(rl_tensor *t, rl_rng *g, double mean, double std);

/* Device availability: registers the CUDA backend in a CUDA build (idempotent). */
void rl_ops_init(void);
/* Waits for all queued work on dev (a no-op on the CPU). */
rl_status rl_op_synchronize(rl_device dev);

#ifdef __cplusplus
}
#endif

#endif
