/* The kernels of one device: a table the dispatcher (kernels/ops.c) calls after it has checked
 * the arguments and resolved the geometry. Every tensor given to a kernel is set, on the
 * table's device, and of the shape stated; inputs may be strided (including stride 0 from
 * broadcasting); outputs are written through their strides. Kernels only report failures of
 * the device itself (a failing CUDA call, out of memory). */
#ifndef RL_BACKEND_H
#define RL_BACKEND_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rl_kernels {
    rl_status (*fill)(rl_tensor *t, double value);
    /* dst and src of the same shape; dtypes may differ (conversion as by a C cast, floats
     * to int32 truncate toward zero). */
    rl_status (*copy)(rl_tensor *dst, const rl_tensor *src);
    /* out and a of the same shape and dtype */
    rl_status (*unary)(rl_tensor *out, const rl_tensor *a, rl_unary_op op, double p0, double p1);
    /* out, a and b of the same shape and dtype (a, b already expanded) */
    rl_status (*binary)(rl_tensor *out, const rl_tensor *a, const rl_tensor *b, rl_binary_op op);
    rl_status (*binary_scalar)(rl_tensor *out, const rl_tensor *a, double s, rl_binary_op op,
                               bool scalar_first);
    /* a (set) and mask of the same shape; mask of any dtype */
    rl_status (*masked_fill)(rl_tensor *a, const rl_tensor *mask, double value);
    /* out: a's shape with shape[dim] == 1; indices: NULL or int32 of out's shape */
    rl_status (*reduce)(rl_tensor *out, rl_tensor *indices, const rl_tensor *a, int dim,
                        rl_reduce_op op);
    /* Row-major strided batched gemm: for each i < batch,
     * C_i = alpha * op(A_i) op(B_i) + beta * C_i, X_i = X + i * stride_x (elements). */
    rl_status (*gemm)(rl_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int64_t lda, int64_t stride_a, const void *b,
                      int64_t ldb, int64_t stride_b, double beta, void *c, int64_t ldc,
                      int64_t stride_c, int64_t batch);
    /* out: a's shape with shape[dim] = numel(index); index 1-D int32, already bounds-checked */
    rl_status (*index_select)(rl_tensor *out, const rl_tensor *a, int dim, const rl_tensor *index);
    rl_status (*arange)(rl_tensor *t, double start, double step);
    /* element i (row-major) uses word i of the draw that starts at Philox block `offset` */
    rl_status (*uniform)(rl_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi);
    /* element i uses words 2i and 2i+1 */
    rl_status (*normal)(rl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
    rl_status (*synchronize)(int index);
} rl_kernels;

const rl_kernels *rl_kernels_cpu(void);

#ifdef __cplusplus
}
#endif

#endif
