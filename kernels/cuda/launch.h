/* The CUDA context's face to the .cu files (kernels/cuda/context.cu): error helpers, devices,
 * launch geometry and cuBLAS handles, one definition of each. A C++ header for .cu files only (it
 * includes the CUDA runtime and cuBLAS); the C side sees kernels/cuda/context.h, which this
 * includes. Every function returns an rl_status and sets a message naming the caller, the call or
 * kernel, and the sizes the caller put in its format. */
#ifndef RL_KERNELS_CUDA_LAUNCH_H
#define RL_KERNELS_CUDA_LAUNCH_H

#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../pointwise.h"
#include "context.h"
}

/* kernels/pointwise.h's zoneout formulas for either type (the recurrent cells' step kernels). */
__device__ __forceinline__ float rl_cuda_zoneout(float m, float prev, float nw) {
    return rl_zoneoutf(m, prev, nw);
}
__device__ __forceinline__ double rl_cuda_zoneout(double m, double prev, double nw) {
    return rl_zoneout(m, prev, nw);
}
__device__ __forceinline__ float rl_cuda_zoneout_new(float m, float ds) {
    return rl_zoneout_newf(m, ds);
}
__device__ __forceinline__ double rl_cuda_zoneout_new(double m, double ds) {
    return rl_zoneout_new(m, ds);
}
__device__ __forceinline__ float rl_cuda_zoneout_prev(float m, float ds) {
    return rl_zoneout_prevf(m, ds);
}
__device__ __forceinline__ double rl_cuda_zoneout_prev(double m, double ds) {
    return rl_zoneout_prev(m, ds);
}

/* Threads per block of the elementwise kernels, and the most blocks a grid-stride launch uses
 * (enough to fill any current GPU many times over; the loop covers the rest). */
#define RL_CUDA_THREADS 256
#define RL_CUDA_MAX_BLOCKS 65536

/* Blocks for `work` items at `per_block` items a block, at least 1, at most max_blocks: the
 * kernels loop over the rest (RL_CUDA_GRID_LOOP). */
inline unsigned rl_cuda_blocks_for(int64_t work, int64_t per_block = RL_CUDA_THREADS,
                                   int64_t max_blocks = RL_CUDA_MAX_BLOCKS) {
    int64_t b = (work + per_block - 1) / per_block;
    return (unsigned)(b < max_blocks ? (b > 0 ? b : 1) : max_blocks);
}

/* Grid-stride loop over i in [0, n) with 64-bit indices. */
#define RL_CUDA_GRID_LOOP(i, n)                                                                    \
    for (int64_t i = rl_cuda_thread_start(); i < (n); i += rl_cuda_thread_step())

__device__ __forceinline__ int64_t rl_cuda_thread_start() {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t rl_cuda_thread_step() { return (int64_t)gridDim.x * blockDim.x; }

inline cudaStream_t rl_cuda_stream(void *s) { return (cudaStream_t)s; }

/* Column sums of an (N, cols) row-major matrix in two stages, deterministic (no atomics, every
 * sum in a fixed order) and on a full grid however few the columns: stage 1,
 * rl_cuda_k_colsum_partial, on grid (ceil(cols / RL_CUDA_COLSUM_COLS), chunks) of blocks
 * (RL_CUDA_COLSUM_COLS, RL_CUDA_COLSUM_ROWS) writes partial[c][col], the sum of the rows of chunk
 * c; stage 2, the caller's kernel, adds the chunks' partials of a column in chunk order. */
#define RL_CUDA_COLSUM_COLS 32
#define RL_CUDA_COLSUM_ROWS 8

/* The row chunks of a column sum over N >= 1 rows: at most max_chunks, none empty, chunk_rows
 * rows each (the last may have fewer). */
inline int64_t rl_cuda_colsum_chunks(int64_t N, int64_t max_chunks, int64_t *chunk_rows) {
    int64_t c = N < max_chunks ? N : max_chunks;
    *chunk_rows = (N + c - 1) / c;
    return (N + *chunk_rows - 1) / *chunk_rows;
}

/* Stage 1 (see above): each thread row of the block takes every RL_CUDA_COLSUM_ROWS-th row of
 * the chunk, then thread row 0 adds the block's partial sums of its column in row order. */
template <typename T>
static __global__ void rl_cuda_k_colsum_partial(int64_t N, int64_t cols, int64_t chunk_rows,
                                                const T *__restrict__ z, T *__restrict__ partial) {
    __shared__ T part[RL_CUDA_COLSUM_ROWS][RL_CUDA_COLSUM_COLS];
    int64_t col = (int64_t)blockIdx.x * RL_CUDA_COLSUM_COLS + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
    T acc = T(0);
    if (col < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += RL_CUDA_COLSUM_ROWS)
            acc += z[r * cols + col];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        T s = T(0);
        for (int i = 0; i < RL_CUDA_COLSUM_ROWS; i++)
            s += part[i][threadIdx.x];
        partial[(int64_t)blockIdx.y * cols + col] = s;
    }
}

/* A failed CUDA runtime call: "<context>: <CUDA's message>", context formatted from fmt (the
 * caller, the call, the sizes); clears the sticky error state. */
rl_status rl_cuda_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether the last kernel launch went through; on failure as rl_cuda_fail with fmt naming the
 * launcher, the kernel and the sizes. */
rl_status rl_cuda_launched(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Makes the device that holds p current (launchers take bare pointers); an error naming fn when p
 * is not device memory. */
rl_status rl_cuda_enter(const char *fn, const void *p);
/* Makes cuda:device current. */
rl_status rl_cuda_use_device(const char *fn, int device);
/* float32 and float64 pass; any other dtype is RL_EDTYPE naming fn. */
rl_status rl_cuda_check_dtype(const char *fn, rl_dtype dt);
/* The arguments of a whole recurrence (lstm, gru): dt float32 or float64, T, B >= 0, H >= 1,
 * direction 1 or -1, lengths given; else RL_EDTYPE or RL_EARG naming fn and the sizes. */
rl_status rl_cuda_check_recurrence(const char *fn, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                   int dir, const int32_t *len);

/* The cuBLAS handle of (current device, stream), bound to the stream, created on first use. */
rl_status rl_cuda_blas_handle(const char *fn, cudaStream_t s, cublasHandle_t *out);
/* For each of `batch` problems i: row-major C_i = alpha op(A_i) op(B_i) + beta C_i with X_i = X +
 * i * stride_x (strides ignored when batch is 1), on stream s of the current device; computed as
 * the column-major C^T = op(B)^T op(A)^T. dt float32 or float64. */
rl_status rl_cuda_gemm_batched(const char *fn, cudaStream_t s, rl_dtype dt, bool trans_a,
                               bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                               const void *a, int64_t lda, int64_t stride_a, const void *b,
                               int64_t ldb, int64_t stride_b, double beta, void *c, int64_t ldc,
                               int64_t stride_c, int64_t batch);

#endif
