/* The optimizer kernels on CUDA devices (API: kernels/cuda/optim_cuda.h; contract and formulas:
 * kernels/optim.h, kernels/optim_rules.h).
 *
 * Update: one thread per element of the flat buffers (grid-stride, 64-bit indices) converts
 * w, g and the states to double, calls rl_optim_rule (the same function the CPU loop calls) and
 * stores in the buffers' dtype. With gradient noise, element i takes the Philox block
 * noise_offset + i / 2 and rl_optim_noise picks its two words, as in kernels/cpu/optim.c: the
 * odd and even element of a pair each compute that block (10 rounds of integer multiplies, cheap
 * next to the memory traffic), so threads stay one per element and accesses stay coalesced.
 *
 * Squared norm (for ||g||_2): stage 1 runs a grid whose size depends only on the length; each
 * thread adds its grid-stride elements in double, each block adds its threads' sums with a fixed
 * shared-memory tree and writes one partial; stage 2, one block, adds the partials the same way
 * and leaves the total beside them. No atomics, so a length always gives the same bits; the
 * total is copied to the host (8 bytes, which waits for the queued work). The scratch
 * (partials + total) is a float64 tensor on the device from the caching allocator.
 *
 * Max-norm: blocks of 32 columns x 8 rows; thread (x, y) walks column x down the rows in steps
 * of 8 (coalesced for the row-major (n_in, n_out) weights), the 8 partial sums of a column are
 * added in a fixed order, and the column is rescaled when its norm exceeds the bound.
 *
 * Results agree with the CPU up to rounding: nvcc contracts a * b + c into fused multiply-adds
 * (the CPU build does not), the reductions add in another order, and the device's log and cos
 * (Box-Muller) may differ from glibc's in the last bit.
 *
 * Streams: the legacy default stream of the tensors' device, as kernels/cuda/ops.cu. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

extern "C" {
#include "../optim_rules.h"
#include "optim_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kThreads = RL_CUDA_THREADS; /* power of two: block_sum's tree halves it */
constexpr int kPartials = 1024;           /* most stage-1 blocks of the squared norm */
constexpr int kCols = 32, kRows = 8;      /* max-norm tile */

/* ---- errors, devices, launch geometry ---- */

rl_status use_device_of(const char *fn, const rl_tensor *t) {
    return rl_cuda_use_device(fn, t->storage->device.index);
}

rl_status launched(const char *fn, int64_t n) {
    return rl_cuda_launched("%s (cuda, %lld elements): kernel launch", fn, (long long)n);
}

/* The sum of v over a block of kThreads threads, in a fixed order; every thread gets it. sh
 * holds kThreads doubles and is free again on return. */
__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

/* ---- update ---- */

template <typename T, bool kNoise>
__global__ void k_update(T *__restrict__ w, const T *__restrict__ g, T *__restrict__ s1,
                         T *__restrict__ s2, rl_optim_coef c, int64_t n) {
    const int ns = rl_optim_states_of(c.kind);
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        double nz = 0.0;
        if (kNoise) {
            rl_philox_block b = rl_philox(c.noise_seed, 0, c.noise_offset + (uint64_t)i / 2);
            nz = rl_optim_noise(b, (uint64_t)i);
        }
        double a = ns >= 1 ? (double)s1[i] : 0.0, z = ns >= 2 ? (double)s2[i] : 0.0;
        w[i] = (T)rl_optim_rule(&c, (double)w[i], (double)g[i], nz, &a, &z);
        if (ns >= 1) s1[i] = (T)a;
        if (ns >= 2) s2[i] = (T)z;
    }
}

template <typename T>
rl_status update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1, rl_tensor *s2,
                 const rl_optim_coef *coef, int64_t n) {
    T *w = (T *)rl_tensor_data(params);
    const T *g = (const T *)rl_tensor_data(grads);
    T *p1 = s1 ? (T *)rl_tensor_data(s1) : NULL;
    T *p2 = s2 ? (T *)rl_tensor_data(s2) : NULL;
    unsigned grid = rl_cuda_blocks_for(n, kThreads, RL_CUDA_MAX_BLOCKS);
    if (coef->noise_std != 0)
        k_update<T, true><<<grid, kThreads>>>(w, g, p1, p2, *coef, n);
    else
        k_update<T, false><<<grid, kThreads>>>(w, g, p1, p2, *coef, n);
    return launched("optim_update", n);
}

/* ---- squared norm ---- */

template <typename T>
__global__ void k_sqnorm_partial(const T *__restrict__ t, int64_t n, double *__restrict__ partial) {
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        double x = (double)t[i];
        acc += x * x;
    }
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sqnorm_final(const double *__restrict__ partial, int np,
                               double *__restrict__ total) {
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += kThreads)
        acc += partial[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) *total = s;
}

/* ---- max-norm ---- */

template <typename T>
__global__ void k_max_norm(T *w, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                           double max_norm) {
    __shared__ double part[kRows][kCols];
    __shared__ double scale[kCols];
    __shared__ bool apply[kCols];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t j0 = (int64_t)blockIdx.x * kCols; j0 < cols; j0 += (int64_t)gridDim.x * kCols) {
        int64_t j = j0 + tx;
        bool in = j < cols;
        double acc = 0.0;
        if (in) {
            for (int64_t i = ty; i < rows; i += kRows) {
                double x = (double)w[i * rs + j * cs];
                acc += x * x;
            }
        }
        part[ty][tx] = acc;
        __syncthreads();
        if (ty == 0) {
            double sum = 0.0;
            for (int r = 0; r < kRows; r++)
                sum += part[r][tx];
            double norm = sqrt(sum);
            /* written as on the CPU: a NaN norm leaves the column alone */
            apply[tx] = norm > max_norm;
            scale[tx] = apply[tx] ? max_norm / norm : 1.0;
        }
        __syncthreads();
        if (in && apply[tx]) {
            double s = scale[tx];
            for (int64_t i = ty; i < rows; i += kRows) {
                int64_t k = i * rs + j * cs;
                w[k] = (T)((double)w[k] * s);
            }
        }
        /* part, scale and apply are rewritten for the next tile */
        __syncthreads();
    }
}

} // namespace

extern "C" rl_status rl_optim_cuda_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1,
                                          rl_tensor *s2, const rl_optim_coef *coef) {
    int64_t n = rl_tensor_numel(params);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("optim_update", params));
    if (params->dtype == RL_FLOAT32) return update<float>(params, grads, s1, s2, coef, n);
    return update<double>(params, grads, s1, s2, coef, n);
}

extern "C" rl_status rl_optim_cuda_sqnorm(double *sq, const rl_tensor *t) {
    const char *fn = "optim_grad_norm";
    int64_t n = rl_tensor_numel(t);
    *sq = 0.0;
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of(fn, t));
    int np = (int)rl_cuda_blocks_for(n, kThreads, kPartials);
    rl_tensor scratch = {0};
    int64_t len = (int64_t)np + 1; /* the partials, then the total */
    RL_TRY(rl_tensor_empty(&scratch, RL_FLOAT64, rl_tensor_device(t), 1, &len));
    double *partial = (double *)rl_tensor_data(&scratch);
    if (t->dtype == RL_FLOAT32)
        k_sqnorm_partial<float><<<np, kThreads>>>((const float *)rl_tensor_data(t), n, partial);
    else
        k_sqnorm_partial<double><<<np, kThreads>>>((const double *)rl_tensor_data(t), n, partial);
    k_sqnorm_final<<<1, kThreads>>>(partial, np, partial + np);
    rl_status st = launched(fn, n);
    if (st == RL_OK) {
        cudaError_t e = cudaMemcpy(sq, partial + np, sizeof(double), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            st = rl_cuda_fail(e, "%s (cuda, %lld elements): cudaMemcpy of the norm to the host", fn,
                              (long long)n);
    }
    rl_tensor_release(&scratch);
    return st;
}

extern "C" rl_status rl_optim_cuda_max_norm(rl_tensor *w, double max_norm) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    if (rows == 0 || cols == 0) return RL_OK;
    if ((rows > 1 && w->stride[0] == 0) || (cols > 1 && w->stride[1] == 0)) {
        char d[160];
        return rl_error(RL_ESHAPE,
                        "optim_max_norm (cuda): the weight's elements overlap (stride 0): %s",
                        rl_tensor_describe(w, d, sizeof d));
    }
    RL_TRY(use_device_of("optim_max_norm", w));
    unsigned grid = rl_cuda_blocks_for(cols, kCols, RL_CUDA_MAX_BLOCKS);
    dim3 block(kCols, kRows);
    if (w->dtype == RL_FLOAT32)
        k_max_norm<float><<<grid, block>>>((float *)rl_tensor_data(w), rows, cols, w->stride[0],
                                           w->stride[1], max_norm);
    else
        k_max_norm<double><<<grid, block>>>((double *)rl_tensor_data(w), rows, cols, w->stride[0],
                                            w->stride[1], max_norm);
    return launched("optim_max_norm", rows * cols);
}
