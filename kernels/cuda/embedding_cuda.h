/* The embedding layer on CUDA devices (kernels/cuda/embedding.cu; layer: layers/embedding.c). A
 * plain C header: no CUDA include. Only present in a CUDA build (RL_WITH_CUDA).
 *
 * Both calls run on the legacy default stream of the device that holds their buffers (made
 * current here), like the tensor ops; buffers are device memory, row-major, dt float32 or
 * float64. The index arrays are int32 device memory the layer builds on the host from the CPU
 * class indices (already checked against 0..V-1). Errors: RL_EDEVICE (a failing launch, naming
 * the function and the sizes), RL_EDTYPE. */
#ifndef RL_KERNELS_CUDA_EMBEDDING_H
#define RL_KERNELS_CUDA_EMBEDDING_H

#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward gather: out row r (N rows, D columns, row stride ldo) = W row idx[r] (row stride ldw)
 * when idx[r] >= 0, else 0 (a padded frame). */
rl_status rl_embedding_cuda_gather(rl_dtype dt, int64_t N, int64_t D, const int32_t *idx,
                                   const void *W, int64_t ldw, void *out, int64_t ldo);

/* Backward scatter-add without atomics: for each of the n_used classes u, dW row cls[u] (row
 * stride ldw) += the rows rows[start[u]] .. rows[start[u+1] - 1] of g (row stride ldg), added in
 * that order. The layer lists each class's frames in frame order, the order of the CPU's loop,
 * so the sums are deterministic and equal to the CPU's term by term. */
rl_status rl_embedding_cuda_scatter_add(rl_dtype dt, int64_t n_used, int64_t D,
                                        const int32_t *start, const int32_t *cls,
                                        const int32_t *rows, const void *g, int64_t ldg, void *dW,
                                        int64_t ldw);

#ifdef __cplusplus
}
#endif

#endif
