/* Row-major matrix operands on raw memory, for the layers that call GEMMs directly inside
 * their time or diagonal loops (lstm, mdlstm), where going through rl_op_gemm's checks per
 * step would cost more than the product itself. The memory may be on the CPU or a CUDA device;
 * rl_mat_gemm runs where it lives. */
#ifndef RL_MATRIX_H
#define RL_MATRIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *p;    /* element [0][0] */
    int64_t ld; /* elements from one row to the next */
} rl_mat;

/* m offset by `rows` rows and `cols` columns (elements of dtype dt). */
static inline rl_mat rl_mat_sub(rl_mat m, int64_t rows, int64_t cols, rl_dtype dt) {
    rl_mat r = {(char *)m.p + (size_t)(rows * m.ld + cols) * rl_dtype_size(dt), m.ld};
    return r;
}

/* A contiguous tensor's storage as a matrix with rows ld elements apart. */
static inline rl_mat rl_mat_of(const rl_tensor *t, int64_t ld) {
    rl_mat r = {rl_tensor_data(t), ld};
    return r;
}

/* c = op(a) op(b) + beta c (m x n, inner k) on dev: BLAS on the CPU; cuBLAS on a CUDA device,
 * queued on `stream` (a cudaStream_t, NULL for the legacy default stream). */
rl_status rl_mat_gemm(rl_device dev, void *stream, rl_dtype dt, bool ta, bool tb, int64_t m,
                      int64_t n, int64_t k, rl_mat a, rl_mat b, double beta, rl_mat c);

/* x (T, B, F) as a (T*B, F) matrix without a copy when its strides allow (true), for the
 * recurrent layers' input projections and input gradients over all frames at once. */
bool rl_mat_fold_tb(const rl_tensor *x, rl_mat *m);

/* rl_buffer_ensure for layers that queue work on their own CUDA stream: when it must allocate,
 * the devices involved are synchronised first, since the old block may still be used by the
 * layer's stream and a cached block handed out now may have been released by another layer's
 * stream still using it (kernels/cuda/context.h). On the CPU it is rl_buffer_ensure. */
rl_status rl_buffer_ensure_synced(rl_tensor *buf, rl_dtype dt, rl_device dev, int ndim,
                                  const int64_t *shape);

/* A parameter's value or gradient t as a contiguous matrix on dev with dtype dt (the network's
 * flat buffers give contiguous views); otherwise an error naming the layer, its class, the
 * parameter (what) and both devices. */
rl_status rl_param_mat(const rl_layer *l, const rl_tensor *t, const char *what, rl_dtype dt,
                       rl_device dev, rl_mat *m);

#ifdef __cplusplus
}
#endif

#endif
