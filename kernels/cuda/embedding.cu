/* The embedding layer's CUDA kernels (API: kernels/cuda/embedding_cuda.h).
 *
 * Launch geometry: both kernels are grid-stride loops over (row, column)
 * with the column fastest, RL_CUDA_THREADS threads a block and rl_cuda_blocks_for(work) blocks
 * (at most RL_CUDA_MAX_BLOCKS; 64-bit indices throughout), so a warp reads and writes
 * consecutive elements of one row (coalesced) and any D works, also D < 32 (a warp then spans
 * several rows).
 *   gather: work N * D; each thread copies one element (or writes 0 on a padded frame).
 *   scatter-add: work n_used * D; each thread owns one (class, column) and walks that class's
 *            frame list in its given order, keeping the running sum in a register and adding it
 *            to dW once: no two threads write one element, so no atomics, and the order of the
 *            additions is fixed (deterministic, the CPU's order). A class that occurs on many
 *            frames makes its threads walk longer than the others (load imbalance, not a
 *            correctness issue; the walk is over the batch's frames, T * B at most).
 */
#include <stdint.h>

extern "C" {
#include "embedding_cuda.h"
}
#include "launch.h"

namespace {

template <typename T>
__global__ void k_gather(int64_t N, int64_t D, const int32_t *__restrict__ idx,
                         const T *__restrict__ W, int64_t ldw, T *__restrict__ out, int64_t ldo) {
    RL_CUDA_GRID_LOOP(e, N * D) {
        int64_t r = e / D, j = e - r * D;
        int32_t v = idx[r];
        out[r * ldo + j] = v >= 0 ? W[(int64_t)v * ldw + j] : T(0);
    }
}

template <typename T>
__global__ void k_scatter_add(int64_t n_used, int64_t D, const int32_t *__restrict__ start,
                              const int32_t *__restrict__ cls, const int32_t *__restrict__ rows,
                              const T *__restrict__ g, int64_t ldg, T *__restrict__ dW,
                              int64_t ldw) {
    RL_CUDA_GRID_LOOP(e, n_used * D) {
        int64_t u = e / D, j = e - u * D;
        T *w = dW + (int64_t)cls[u] * ldw + j;
        /* the CPU adds each frame's row into dW in turn: the same additions in the same order */
        T acc = *w;
        for (int32_t k = start[u]; k < start[u + 1]; k++)
            acc += g[(int64_t)rows[k] * ldg + j];
        *w = acc;
    }
}

} // namespace

extern "C" rl_status rl_embedding_cuda_gather(rl_dtype dt, int64_t N, int64_t D, const int32_t *idx,
                                              const void *W, int64_t ldw, void *out, int64_t ldo) {
    const char *fn = "rl_embedding_cuda_gather";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (N <= 0 || D <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, out));
    unsigned grid = rl_cuda_blocks_for(N * D);
    if (dt == RL_FLOAT32)
        k_gather<float>
            <<<grid, RL_CUDA_THREADS>>>(N, D, idx, (const float *)W, ldw, (float *)out, ldo);
    else
        k_gather<double>
            <<<grid, RL_CUDA_THREADS>>>(N, D, idx, (const double *)W, ldw, (double *)out, ldo);
    return rl_cuda_launched("%s: launching k_gather (N=%lld D=%lld)", fn, (long long)N,
                            (long long)D);
}

extern "C" rl_status rl_embedding_cuda_scatter_add(rl_dtype dt, int64_t n_used, int64_t D,
                                                   const int32_t *start, const int32_t *cls,
                                                   const int32_t *rows, const void *g, int64_t ldg,
                                                   void *dW, int64_t ldw) {
    const char *fn = "rl_embedding_cuda_scatter_add";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (n_used <= 0 || D <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, dW));
    unsigned grid = rl_cuda_blocks_for(n_used * D);
    if (dt == RL_FLOAT32)
        k_scatter_add<float><<<grid, RL_CUDA_THREADS>>>(n_used, D, start, cls, rows,
                                                        (const float *)g, ldg, (float *)dW, ldw);
    else
        k_scatter_add<double><<<grid, RL_CUDA_THREADS>>>(n_used, D, start, cls, rows,
                                                         (const double *)g, ldg, (double *)dW, ldw);
    return rl_cuda_launched("%s: launching k_scatter_add (classes=%lld D=%lld)", fn,
                            (long long)n_used, (long long)D);
}
