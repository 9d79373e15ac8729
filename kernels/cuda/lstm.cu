/* rnnlua's own LSTM kernels on CUDA (API and buffer layout: kernels/cuda/lstm_cuda.h).
 *
 * Design: the cell math is kernels/lstm_cell.h, the same functions the CPU loops call, so the
 * two devices differ only by the last bits of the device's exp. Per step one cuBLAS GEMM
 * (h_prev U into the step's gates) and one fused pointwise kernel:
 *   forward: one thread per (b, j) reads the four pre-activations, adds the bias, writes the
 *            activations over them, the cell, the state and the output; padded rows copy the
 *            previous state and write 0 to the output.
 *   backward: one thread per (b, j) on the forward's grid writes dz over the gates and the
 *            state gradients. Only the per-step C API with db adds the bias and peephole
 *            gradients in the step: blocks of 32 columns x 8 batch rows, each thread walks its
 *            column down the batch in steps of 8 keeping partial sums, and the block adds its 8
 *            partial sums in a fixed order into db and dpeep (deterministic, no atomics).
 * The whole-recurrence functions defer those sums to one reduction over all frames
 * (rl_lstm_cuda_param_grads, same scheme) and dU to one GEMM, so the steps stay short.
 *
 * cuBLAS: one handle per (device, stream), created on first use, since a handle's workspace must
 * not be shared by two streams running at once; rl_lstm_cuda_stream_destroy destroys the handles
 * of its stream (and with them their workspaces), so building and freeing networks leaks nothing.
 * The legacy default stream's handle, one per device, lives as long as the process.
 *
 * Producer/consumer events: every stream from rl_lstm_cuda_stream_create owns one event;
 * rl_lstm_cuda_stream_wrote records it after a layer call and notes (kernels/stream_deps.h) which
 * byte ranges that call wrote; rl_lstm_cuda_stream_wait_for makes a reader's stream wait for the
 * events of the other streams that last wrote what it reads. The math mode is
 * cuBLAS's default (no TF32), as in kernels/cuda/ops.cu, so float32 stays float32.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <map>
#include <mutex>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "../lstm_cell.h"
#include "../stream_deps.h"
#include "lstm_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kThreads = 256;
constexpr int kCols = 32; /* columns per block of the reduction kernels */
constexpr int kRows = 8;  /* batch rows per block of the reduction kernels */

/* ---- devices, errors (kernels/cuda/launch.h) ---- */

using rl_launch::cuda_fail;
using rl_launch::enter;
using rl_launch::launched;

unsigned blocks_for(int64_t work) {
    int64_t b = (work + kThreads - 1) / kThreads;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

/* ---- the cell for either type ---- */

__device__ __forceinline__ void cell_fwd(float zi, float zf, float zg, float zo, float cp, float pi,
                                         float pf, float po, float *i, float *f, float *g, float *o,
                                         float *c, float *h) {
    rl_lstm_cell_fwd_f32(zi, zf, zg, zo, cp, pi, pf, po, i, f, g, o, c, h);
}
__device__ __forceinline__ void cell_fwd(double zi, double zf, double zg, double zo, double cp,
                                         double pi, double pf, double po, double *i, double *f,
                                         double *g, double *o, double *c, double *h) {
    rl_lstm_cell_fwd_f64(zi, zf, zg, zo, cp, pi, pf, po, i, f, g, o, c, h);
}
__device__ __forceinline__ void cell_bwd(float i, float f, float g, float o, float cp, float c,
                                         float pi, float pf, float po, float dh, float dc,
                                         float *dzi, float *dzf, float *dzg, float *dzo,
                                         float *dcp) {
    rl_lstm_cell_bwd_f32(i, f, g, o, cp, c, pi, pf, po, dh, dc, dzi, dzf, dzg, dzo, dcp);
}
__device__ __forceinline__ void cell_bwd(double i, double f, double g, double o, double cp,
                                         double c, double pi, double pf, double po, double dh,
                                         double dc, double *dzi, double *dzf, double *dzg,
                                         double *dzo, double *dcp) {
    rl_lstm_cell_bwd_f64(i, f, g, o, cp, c, pi, pf, po, dh, dc, dzi, dzf, dzg, dzo, dcp);
}

/* The three peephole vectors by value (kernel arguments), null without peepholes. */
template <typename T> struct Peep { const T *p[3]; };
template <typename T> struct DPeep { T *p[3]; };

/* ---- kernels ---- */

template <typename T, bool PEEP>
__global__ void k_fwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                      T *__restrict__ z, const T *__restrict__ bias, Peep<T> peep,
                      const T *__restrict__ cp, const T *__restrict__ hp, T *__restrict__ c,
                      T *__restrict__ h, T *__restrict__ out) {
    int64_t n = B * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e - b * H;
        if (t >= (int64_t)len[b]) {
            c[e] = cp[e];
            h[e] = hp[e];
            out[e] = T(0);
            continue;
        }
        T *zr = z + b * 4 * H + j;
        T i, f, g, o, cc, hh;
        cell_fwd(zr[0] + bias[j], zr[H] + bias[H + j], zr[2 * H] + bias[2 * H + j],
                 zr[3 * H] + bias[3 * H + j], cp[e], PEEP ? peep.p[0][j] : T(0),
                 PEEP ? peep.p[1][j] : T(0), PEEP ? peep.p[2][j] : T(0), &i, &f, &g, &o, &cc, &hh);
        zr[0] = i;
        zr[H] = f;
        zr[2 * H] = g;
        zr[3 * H] = o;
        c[e] = cc;
        h[e] = hh;
        out[e] = hh;
    }
}

/* Adds the block's kRows partial sums of each of the K gradient rows of column j, in row
 * order. part: the thread's K partial sums; dst[k]: the K destinations (k < 4: db + k * H,
 * then the peepholes). */
template <typename T, int K>
__device__ __forceinline__ void block_add(const T *part, T *const *dst, int64_t j, int64_t H) {
    __shared__ T sh[K][kRows][kCols];
    for (int k = 0; k < K; k++)
        sh[k][threadIdx.y][threadIdx.x] = part[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < H) {
        for (int k = 0; k < K; k++) {
            T s = T(0);
            for (int r = 0; r < kRows; r++)
                s += sh[k][r][threadIdx.x];
            dst[k][j] += s;
        }
    }
}

/* One (b, j) of a backward step: dz over the four gates (0 on a padded row) and the state
 * gradients; dz[0..3] also come back for the bias and peephole sums. The body of both backward
 * kernels. */
template <typename T>
__device__ __forceinline__ bool
bwd_elem(int64_t b, int64_t j, int64_t H, int64_t t, const int32_t *__restrict__ len,
         T *__restrict__ z, T pi, T pf, T po, const T *__restrict__ cp, const T *__restrict__ c,
         const T *__restrict__ dout, int64_t dout_ld, T *__restrict__ dh, T *__restrict__ dc,
         T dz[4]) {
    T *zr = z + b * 4 * H + j;
    if (t >= (int64_t)len[b]) {
        zr[0] = zr[H] = zr[2 * H] = zr[3 * H] = T(0);
        return false;
    }
    int64_t e = b * H + j;
    T dcp;
    T dhe = dh[e] + (dout ? dout[b * dout_ld + j] : T(0));
    cell_bwd(zr[0], zr[H], zr[2 * H], zr[3 * H], cp[e], c[e], pi, pf, po, dhe, dc[e], &dz[0],
             &dz[1], &dz[2], &dz[3], &dcp);
    zr[0] = dz[0];
    zr[H] = dz[1];
    zr[2 * H] = dz[2];
    zr[3 * H] = dz[3];
    dc[e] = dcp;
    dh[e] = T(0);
    return true;
}

/* Block (kCols, kRows); grid.x covers the H columns. NG: how many gradient rows to add for this
 * step: 4 (the bias) or 7 (the bias and, with PEEP, the peepholes). Only for steps that add
 * them (the per-step C API with db): ceil(H/32) blocks is few, the price of summing without
 * atomics. */
template <typename T, bool PEEP, int NG>
__global__ void k_bwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                      T *__restrict__ z, Peep<T> peep, const T *__restrict__ cp,
                      const T *__restrict__ c, const T *__restrict__ dout, int64_t dout_ld,
                      T *__restrict__ dh, T *__restrict__ dc, T *__restrict__ db, DPeep<T> dpeep) {
    int64_t j = (int64_t)blockIdx.x * kCols + threadIdx.x;
    T part[7] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
    if (j < H) {
        T pi = PEEP ? peep.p[0][j] : T(0), pf = PEEP ? peep.p[1][j] : T(0),
          po = PEEP ? peep.p[2][j] : T(0);
        for (int64_t b = threadIdx.y; b < B; b += kRows) {
            T dz[4];
            if (!bwd_elem(b, j, H, t, len, z, pi, pf, po, cp, c, dout, dout_ld, dh, dc, dz))
                continue;
            for (int k = 0; k < 4; k++)
                part[k] += dz[k];
            if constexpr (NG > 4) {
                int64_t e = b * H + j;
                part[4] += dz[0] * cp[e];
                part[5] += dz[1] * cp[e];
                part[6] += dz[3] * c[e];
            }
        }
    }
    T *dst[7] = {db, db + H, db + 2 * H, db + 3 * H, dpeep.p[0], dpeep.p[1], dpeep.p[2]};
    block_add<T, NG>(part, dst, j, H);
}

/* The backward step with no column sums (what the whole recurrence runs; db and dpeep come
 * after the loop from rl_lstm_cuda_param_grads): one thread per (b, j) over a grid like the
 * forward's, so H = 512, B = 64 fills 128 blocks of 256 threads, not 16 of 256. */
template <typename T, bool PEEP>
__global__ void k_bwd_pw(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                         T *__restrict__ z, Peep<T> peep, const T *__restrict__ cp,
                         const T *__restrict__ c, const T *__restrict__ dout, int64_t dout_ld,
                         T *__restrict__ dh, T *__restrict__ dc) {
    int64_t n = B * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e - b * H;
        T dz[4];
        (void)bwd_elem(b, j, H, t, len, z, PEEP ? peep.p[0][j] : T(0), PEEP ? peep.p[1][j] : T(0),
                       PEEP ? peep.p[2][j] : T(0), cp, c, dout, dout_ld, dh, dc, dz);
    }
}

/* db and dpeep over N frames; same block shape and order of summation as k_bwd. */
template <typename T, bool PEEP>
__global__ void k_param_grads(int64_t N, int64_t H, const T *__restrict__ dz,
                              const T *__restrict__ cprev, const T *__restrict__ cur,
                              T *__restrict__ db, DPeep<T> dpeep) {
    int64_t j = (int64_t)blockIdx.x * kCols + threadIdx.x;
    T part[7] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
    if (j < H) {
        for (int64_t n = threadIdx.y; n < N; n += kRows) {
            const T *zr = dz + n * 4 * H + j;
            part[0] += zr[0];
            part[1] += zr[H];
            part[2] += zr[2 * H];
            part[3] += zr[3 * H];
            if (PEEP) {
                part[4] += zr[0] * cprev[n * H + j];
                part[5] += zr[H] * cprev[n * H + j];
                part[6] += zr[3 * H] * cur[n * H + j];
            }
        }
    }
    T *dst[7] = {db, db + H, db + 2 * H, db + 3 * H, dpeep.p[0], dpeep.p[1], dpeep.p[2]};
    block_add<T, PEEP ? 7 : 4>(part, dst, j, H);
}

/* Up to kLenChunk lengths by value (a kernel argument: 2 KiB, below the 4 KiB limit). */
constexpr int kLenChunk = 512;
struct LenChunk {
    int32_t v[kLenChunk];
};

__global__ void k_set_lengths(int32_t *__restrict__ dst, LenChunk c, int n) {
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) dst[i] = c.v[i];
}

/* ---- launchers ---- */

template <typename T>
rl_status fwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *z, const T *bias, const T *const *peep, const T *cp,
                   const T *hp, T *c, T *h, T *out) {
    if (B <= 0 || H <= 0) return RL_OK;
    Peep<T> pp = {{peep ? peep[0] : nullptr, peep ? peep[1] : nullptr, peep ? peep[2] : nullptr}};
    unsigned g = blocks_for(B * H);
    if (peep)
        k_fwd<T, true><<<g, kThreads, 0, s>>>(B, H, t, len, z, bias, pp, cp, hp, c, h, out);
    else
        k_fwd<T, false><<<g, kThreads, 0, s>>>(B, H, t, len, z, bias, pp, cp, hp, c, h, out);
    return launched(fn, "k_fwd", B, H, t);
}

template <typename T>
rl_status bwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *z, const T *const *peep, const T *cp, const T *c,
                   const T *dout, int64_t dout_ld, T *dh, T *dc, T *db, T *const *dpeep) {
    if (B <= 0 || H <= 0) return RL_OK;
    if (dpeep && !db)
        return rl_error(RL_EARG, "%s: peephole gradients need the bias gradient too (H=%lld)", fn,
                        (long long)H);
    Peep<T> pp = {{peep ? peep[0] : nullptr, peep ? peep[1] : nullptr, peep ? peep[2] : nullptr}};
    DPeep<T> dp = {
        {dpeep ? dpeep[0] : nullptr, dpeep ? dpeep[1] : nullptr, dpeep ? dpeep[2] : nullptr}};
    if (!db) { /* no column sums: the forward's geometry */
        unsigned g = blocks_for(B * H);
        if (peep)
            k_bwd_pw<T, true>
                <<<g, kThreads, 0, s>>>(B, H, t, len, z, pp, cp, c, dout, dout_ld, dh, dc);
        else
            k_bwd_pw<T, false>
                <<<g, kThreads, 0, s>>>(B, H, t, len, z, pp, cp, c, dout, dout_ld, dh, dc);
        return launched(fn, "k_bwd_pw", B, H, t);
    }
    dim3 block(kCols, kRows), grid((unsigned)((H + kCols - 1) / kCols));
#define RL_K_BWD(PEEP, NG)                                                                         \
    k_bwd<T, PEEP, NG>                                                                             \
        <<<grid, block, 0, s>>>(B, H, t, len, z, pp, cp, c, dout, dout_ld, dh, dc, db, dp)
    /* peephole gradients exist only with peepholes */
    if (peep && dpeep)
        RL_K_BWD(true, 7);
    else if (peep)
        RL_K_BWD(true, 4);
    else
        RL_K_BWD(false, 4);
#undef RL_K_BWD
    return launched(fn, "k_bwd", B, H, t);
}

template <typename T>
rl_status param_grads(cudaStream_t s, int64_t N, int64_t H, const T *dz, const T *cprev,
                      const T *cur, T *db, T *const *dpeep) {
    if (N <= 0 || H <= 0) return RL_OK;
    DPeep<T> dp = {
        {dpeep ? dpeep[0] : nullptr, dpeep ? dpeep[1] : nullptr, dpeep ? dpeep[2] : nullptr}};
    dim3 block(kCols, kRows), grid((unsigned)((H + kCols - 1) / kCols));
    if (dpeep)
        k_param_grads<T, true><<<grid, block, 0, s>>>(N, H, dz, cprev, cur, db, dp);
    else
        k_param_grads<T, false><<<grid, block, 0, s>>>(N, H, dz, cprev, cur, db, dp);
    return launched("rl_lstm_cuda_param_grads", "k_param_grads", N, H, -1);
}

/* ---- cuBLAS handles, one per (device, stream) ---- */

std::mutex g_handles_mu;
std::map<std::pair<int, void *>, cublasHandle_t> *g_handles;

rl_status blas_fail(const char *call, cublasStatus_t st, long long m, long long n, long long k) {
    return rl_error(RL_EDEVICE, "rl_lstm_cuda_gemm: %s: %s (m=%lld n=%lld k=%lld)", call,
                    cublasGetStatusString(st), m, n, k);
}

rl_status handle_for(cudaStream_t s, cublasHandle_t *out, long long m, long long n, long long k) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return cuda_fail("rl_lstm_cuda_gemm", "cudaGetDevice", e, m, n);
    std::lock_guard<std::mutex> lock(g_handles_mu);
    try {
        if (!g_handles) g_handles = new std::map<std::pair<int, void *>, cublasHandle_t>;
        auto key = std::make_pair(dev, (void *)s);
        auto it = g_handles->find(key);
        if (it == g_handles->end()) {
            cublasHandle_t h = nullptr;
            cublasStatus_t st = cublasCreate(&h);
            if (st != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasCreate", st, m, n, k);
            st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
            if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(h, s);
            if (st != CUBLAS_STATUS_SUCCESS) {
                cublasDestroy(h);
                return blas_fail("cublasSetStream", st, m, n, k);
            }
            it = g_handles->emplace(key, h).first;
        }
        *out = it->second;
    } catch (...) {
        return rl_error(RL_ENOMEM, "rl_lstm_cuda_gemm: out of host memory for the cuBLAS handles");
    }
    return RL_OK;
}

/* cuBLAS wants ld >= max(1, rows) of its column-major view even where it is never used. */
int64_t fix_ld(int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 1 && ld < cols) ld = cols;
    return ld > 1 ? ld : 1;
}

/* Row-major C = alpha op(A) op(B) + beta C as column-major C^T = op(B)^T op(A)^T. The device
 * must be current. */
rl_status gemm(cudaStream_t s, rl_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
               void *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    cublasHandle_t h;
    RL_TRY(handle_for(s, &h, m, n, k));
    /* a handle may have been bound to an earlier stream at this address */
    cublasStatus_t st = cublasSetStream(h, s);
    if (st != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasSetStream", st, m, n, k);
    lda = ta ? fix_ld(k, m, lda) : fix_ld(m, k, lda);
    ldb = tb ? fix_ld(n, k, ldb) : fix_ld(k, n, ldb);
    ldc = fix_ld(m, n, ldc);
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (dt == RL_FLOAT32) {
        float al = (float)alpha, be = (float)beta;
        st = cublasSgemm_64(h, ob, oa, n, m, k, &al, (const float *)b, ldb, (const float *)a, lda,
                            &be, (float *)c, ldc);
        if (st != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasSgemm", st, m, n, k);
    } else if (dt == RL_FLOAT64) {
        st = cublasDgemm_64(h, ob, oa, n, m, k, &alpha, (const double *)b, ldb, (const double *)a,
                            lda, &beta, (double *)c, ldc);
        if (st != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasDgemm", st, m, n, k);
    } else {
        return rl_error(RL_EDTYPE, "rl_lstm_cuda_gemm: dtype %s not supported", rl_dtype_name(dt));
    }
    return RL_OK;
}

/* ---- whole recurrences ---- */

template <typename T>
rl_status forward_loop(cudaStream_t s, rl_dtype dt, int64_t T_, int64_t B, int64_t H, int dir,
                       const int32_t *len, T *gates, const T *U, const T *bias,
                       const T *const *peep, T *hs, T *cs, T *out) {
    const char *fn = "rl_lstm_cuda_forward";
    int64_t BH = B * H;
    for (int64_t st = 0; st < T_; st++) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *zt = gates + t * B * 4 * H;
        RL_TRY(gemm(s, dt, false, false, B, 4 * H, H, 1.0, hs + prev * BH, H, U, 4 * H, 1.0, zt,
                    4 * H));
        RL_TRY(fwd_step<T>(fn, s, B, H, t, len, zt, bias, peep, cs + prev * BH, hs + prev * BH,
                           cs + cur * BH, hs + cur * BH, out + t * BH));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(cudaStream_t s, rl_dtype dt, int64_t T_, int64_t B, int64_t H, int dir,
                        const int32_t *len, T *gates, const T *U, const T *const *peep, const T *hs,
                        const T *cs, const T *dout, int64_t dout_ld, T *dh, T *dc, T *dU, T *db,
                        T *const *dpeep) {
    const char *fn = "rl_lstm_cuda_backward";
    int64_t BH = B * H;
    for (int64_t st = T_ - 1; st >= 0; st--) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *zt = gates + t * B * 4 * H;
        RL_TRY(bwd_step<T>(fn, s, B, H, t, len, zt, peep, cs + prev * BH, cs + cur * BH,
                           dout ? dout + t * B * dout_ld : nullptr, dout_ld, dh, dc, nullptr,
                           nullptr));
        /* padded rows of dz_t are 0, so their dh passes through unchanged */
        RL_TRY(gemm(s, dt, false, true, B, H, 4 * H, 1.0, zt, 4 * H, U, 4 * H, 1.0, dh, H));
    }
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1) */
    const T *hprev = hs + (dir > 0 ? 0 : BH), *cprev = cs + (dir > 0 ? 0 : BH);
    const T *ccur = cs + (dir > 0 ? BH : 0);
    RL_TRY(gemm(s, dt, true, false, H, 4 * H, T_ * B, 1.0, hprev, H, gates, 4 * H, 1.0, dU, 4 * H));
    return param_grads<T>(s, T_ * B, H, gates, cprev, ccur, db, dpeep);
}

rl_status check_dtype(const char *fn, rl_dtype dt) {
    if (dt == RL_FLOAT32 || dt == RL_FLOAT64) return RL_OK;
    return rl_error(RL_EDTYPE, "%s: dtype %s not supported (float32, float64)", fn,
                    rl_dtype_name(dt));
}

rl_status check_loop(const char *fn, rl_dtype dt, int64_t T, int64_t B, int64_t H, int dir,
                     const int32_t *len) {
    RL_TRY(check_dtype(fn, dt));
    if (T < 0 || B < 0 || H < 1 || (dir != 1 && dir != -1) || !len)
        return rl_error(RL_EARG, "%s: bad sizes T=%lld B=%lld H=%lld direction=%d%s", fn,
                        (long long)T, (long long)B, (long long)H, dir, len ? "" : " or no lengths");
    return RL_OK;
}

/* Destroys the cuBLAS handles bound to stream s (on any device), before s is destroyed. */
void destroy_handles_of(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_handles_mu);
    if (!g_handles) return;
    int cur = -1;
    bool have_cur = cudaGetDevice(&cur) == cudaSuccess;
    for (auto it = g_handles->begin(); it != g_handles->end();) {
        if (it->first.second != (void *)s) {
            ++it;
            continue;
        }
        cudaSetDevice(it->first.first); /* cublasDestroy frees on the handle's device */
        cublasDestroy(it->second);
        it = g_handles->erase(it);
    }
    if (have_cur) cudaSetDevice(cur);
    cudaGetLastError();
}

/* ---- producer/consumer events between streams ---- */

std::mutex g_deps_mu;
rl_stream_deps g_deps;                  /* who last wrote which bytes */
std::map<void *, cudaEvent_t> g_events; /* each stream's event */

/* The bytes a CUDA tensor's view spans; false for NULL, unset, empty or non-CUDA tensors. */
bool cuda_range(const rl_tensor *t, const void **p, size_t *bytes) {
    if (!t || !t->storage || rl_tensor_device(t).type != RL_CUDA) return false;
    int64_t span = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return false;
        span += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
    }
    *p = rl_tensor_data(t);
    *bytes = (size_t)span * rl_dtype_size(t->dtype);
    return *p != NULL;
}

} // namespace

/* ---- the C API ---- */

extern "C" rl_status rl_lstm_cuda_stream_create(int device, void **stream) {
    *stream = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "rl_lstm_cuda_stream_create: cudaSetDevice(%d): %s", device,
                        cudaGetErrorString(e));
    }
    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, cudaStreamDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "rl_lstm_cuda_stream_create: cudaStreamCreate on cuda:%d: %s",
                        device, cudaGetErrorString(e));
    }
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaStreamDestroy(s);
        return rl_error(RL_EDEVICE, "rl_lstm_cuda_stream_create: cudaEventCreate on cuda:%d: %s",
                        device, cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> lock(g_deps_mu);
    try {
        g_events[(void *)s] = ev;
    } catch (...) {
        cudaEventDestroy(ev);
        cudaStreamDestroy(s);
        return rl_error(RL_ENOMEM, "rl_lstm_cuda_stream_create: out of host memory");
    }
    *stream = (void *)s;
    return RL_OK;
}

extern "C" void rl_lstm_cuda_stream_destroy(void *stream) {
    if (!stream) return;
    {
        std::lock_guard<std::mutex> lock(g_deps_mu);
        rl_stream_deps_forget(&g_deps, stream);
        auto it = g_events.find(stream);
        if (it != g_events.end()) {
            cudaEventDestroy(it->second);
            g_events.erase(it);
        }
    }
    destroy_handles_of(as_stream(stream));
    cudaStreamDestroy(as_stream(stream));
    cudaGetLastError();
}

extern "C" rl_status rl_lstm_cuda_stream_wait_for(void *stream, const rl_tensor *const *ts, int n) {
    const char *fn = "rl_lstm_cuda_stream_wait_for";
    if (!stream) return RL_OK; /* the legacy stream waits for every blocking stream anyway */
    constexpr size_t kMax = 64;
    void *w[kMax];
    for (int i = 0; i < n; i++) {
        const void *p;
        size_t bytes;
        if (!cuda_range(ts[i], &p, &bytes)) continue;
        std::lock_guard<std::mutex> lock(g_deps_mu);
        size_t nw = rl_stream_deps_writers(&g_deps, stream, p, bytes, w, kMax);
        if (nw > kMax) {
            /* more writers than room (never with real networks): wait for the whole device */
            RL_TRY(enter(fn, p, -1, -1));
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) return cuda_fail(fn, "cudaDeviceSynchronize", e, -1, -1);
            continue;
        }
        for (size_t k = 0; k < nw; k++) {
            auto it = g_events.find(w[k]);
            if (it == g_events.end()) continue; /* not ours: cannot happen, forget drops it */
            cudaError_t e = cudaStreamWaitEvent(as_stream(stream), it->second, 0);
            if (e != cudaSuccess) return cuda_fail(fn, "cudaStreamWaitEvent", e, -1, -1);
        }
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_stream_wrote(void *stream, const rl_tensor *const *ts, int n) {
    const char *fn = "rl_lstm_cuda_stream_wrote";
    if (!stream) return RL_OK;
    std::lock_guard<std::mutex> lock(g_deps_mu);
    auto it = g_events.find(stream);
    if (it == g_events.end())
        return rl_error(RL_EARG, "%s: not a stream from rl_lstm_cuda_stream_create", fn);
    bool recorded = false;
    for (int i = 0; i < n; i++) {
        const void *p;
        size_t bytes;
        if (!cuda_range(ts[i], &p, &bytes)) continue;
        if (!recorded) {
            /* the event lives on the stream's device, which the caller's tensors are on */
            RL_TRY(enter(fn, p, -1, -1));
            cudaError_t e = cudaEventRecord(it->second, as_stream(stream));
            if (e != cudaSuccess) return cuda_fail(fn, "cudaEventRecord", e, -1, -1);
            recorded = true;
        }
        RL_TRY(rl_stream_deps_wrote(&g_deps, stream, p, bytes));
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_stream_sync(void *stream) {
    cudaError_t e = cudaStreamSynchronize(as_stream(stream));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "rl_lstm_cuda_stream_sync: cudaStreamSynchronize: %s",
                        cudaGetErrorString(e));
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_set_lengths(void *stream, int32_t *len_dev,
                                              const int32_t *len_host, int64_t B) {
    const char *fn = "rl_lstm_cuda_set_lengths";
    if (B <= 0) return RL_OK;
    if (!len_dev || !len_host)
        return rl_error(RL_EARG, "%s: no lengths buffer (B=%lld)", fn, (long long)B);
    RL_TRY(enter(fn, len_dev, B, 0));
    for (int64_t at = 0; at < B; at += kLenChunk) {
        int n = (int)(B - at < kLenChunk ? B - at : kLenChunk);
        LenChunk c;
        for (int i = 0; i < n; i++)
            c.v[i] = len_host[at + i];
        k_set_lengths<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0,
                        as_stream(stream)>>>(len_dev + at, c, n);
        RL_TRY(launched(fn, "k_set_lengths", B, 0, -1));
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_zero(void *stream, void *p, size_t bytes) {
    const char *fn = "rl_lstm_cuda_zero";
    if (bytes == 0) return RL_OK;
    RL_TRY(enter(fn, p, 0, 0));
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, as_stream(stream));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "%s: cudaMemsetAsync: %s (%zu bytes)", fn,
                        cudaGetErrorString(e), bytes);
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_copy_rows(void *stream, void *dst, size_t dst_pitch,
                                            const void *src, size_t src_pitch, size_t row_bytes,
                                            int64_t rows) {
    const char *fn = "rl_lstm_cuda_copy_rows";
    if (rows <= 0 || row_bytes == 0) return RL_OK;
    if (dst_pitch < row_bytes || src_pitch < row_bytes)
        return rl_error(RL_EARG, "%s: pitches %zu, %zu below the row size %zu", fn, dst_pitch,
                        src_pitch, row_bytes);
    RL_TRY(enter(fn, dst, rows, 0));
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, (size_t)rows,
                                      cudaMemcpyDeviceToDevice, as_stream(stream));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "%s: cudaMemcpy2DAsync: %s (%lld rows of %zu bytes)", fn,
                        cudaGetErrorString(e), (long long)rows, row_bytes);
    }
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_fwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, float *z, const float *bias,
                                          const float *const *peep, const float *cp,
                                          const float *hp, float *c, float *h, float *out) {
    const char *fn = "rl_lstm_cuda_fwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(enter(fn, z, B, H));
    return fwd_step<float>(fn, as_stream(stream), B, H, t, len, z, bias, peep, cp, hp, c, h, out);
}

extern "C" rl_status rl_lstm_cuda_fwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, double *z, const double *bias,
                                          const double *const *peep, const double *cp,
                                          const double *hp, double *c, double *h, double *out) {
    const char *fn = "rl_lstm_cuda_fwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(enter(fn, z, B, H));
    return fwd_step<double>(fn, as_stream(stream), B, H, t, len, z, bias, peep, cp, hp, c, h, out);
}

extern "C" rl_status rl_lstm_cuda_bwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, float *z, const float *const *peep,
                                          const float *cp, const float *c, const float *dout,
                                          int64_t dout_ld, float *dh, float *dc, float *db,
                                          float *const *dpeep) {
    const char *fn = "rl_lstm_cuda_bwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(enter(fn, z, B, H));
    return bwd_step<float>(fn, as_stream(stream), B, H, t, len, z, peep, cp, c, dout, dout_ld, dh,
                           dc, db, dpeep);
}

extern "C" rl_status rl_lstm_cuda_bwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, double *z, const double *const *peep,
                                          const double *cp, const double *c, const double *dout,
                                          int64_t dout_ld, double *dh, double *dc, double *db,
                                          double *const *dpeep) {
    const char *fn = "rl_lstm_cuda_bwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(enter(fn, z, B, H));
    return bwd_step<double>(fn, as_stream(stream), B, H, t, len, z, peep, cp, c, dout, dout_ld, dh,
                            dc, db, dpeep);
}

extern "C" rl_status rl_lstm_cuda_param_grads(void *stream, rl_dtype dt, int64_t N, int64_t H,
                                              const void *dz, const void *cprev, const void *cur,
                                              void *db, void *const *dpeep) {
    const char *fn = "rl_lstm_cuda_param_grads";
    RL_TRY(check_dtype(fn, dt));
    if (N <= 0 || H <= 0) return RL_OK;
    if (dpeep && (!cprev || !cur))
        return rl_error(RL_EARG, "%s: peephole gradients need the cell states (N=%lld H=%lld)", fn,
                        (long long)N, (long long)H);
    RL_TRY(enter(fn, db, N, H));
    if (dt == RL_FLOAT32)
        return param_grads<float>(as_stream(stream), N, H, (const float *)dz, (const float *)cprev,
                                  (const float *)cur, (float *)db, (float *const *)dpeep);
    return param_grads<double>(as_stream(stream), N, H, (const double *)dz, (const double *)cprev,
                               (const double *)cur, (double *)db, (double *const *)dpeep);
}

extern "C" rl_status rl_lstm_cuda_gemm(void *stream, rl_dtype dt, bool trans_a, bool trans_b,
                                       int64_t m, int64_t n, int64_t k, double alpha, const void *a,
                                       int64_t lda, const void *b, int64_t ldb, double beta,
                                       void *c, int64_t ldc) {
    RL_TRY(check_dtype("rl_lstm_cuda_gemm", dt));
    if (m <= 0 || n <= 0) return RL_OK;
    RL_TRY(enter("rl_lstm_cuda_gemm", c, m, n));
    return gemm(as_stream(stream), dt, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

extern "C" rl_status rl_lstm_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                          int64_t H, int direction, const int32_t *len, void *gates,
                                          const void *U, const void *bias, const void *const *peep,
                                          void *hs, void *cs, void *out) {
    const char *fn = "rl_lstm_cuda_forward";
    RL_TRY(check_loop(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(enter(fn, gates, B, H));
    cudaStream_t s = as_stream(stream);
    if (dt == RL_FLOAT32)
        return forward_loop<float>(s, dt, T, B, H, direction, len, (float *)gates, (const float *)U,
                                   (const float *)bias, (const float *const *)peep, (float *)hs,
                                   (float *)cs, (float *)out);
    return forward_loop<double>(s, dt, T, B, H, direction, len, (double *)gates, (const double *)U,
                                (const double *)bias, (const double *const *)peep, (double *)hs,
                                (double *)cs, (double *)out);
}

extern "C" rl_status rl_lstm_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                           int64_t H, int direction, const int32_t *len,
                                           void *gates, const void *U, const void *const *peep,
                                           const void *hs, const void *cs, const void *dout,
                                           int64_t dout_ld, void *dh, void *dc, void *dU, void *db,
                                           void *const *dpeep) {
    const char *fn = "rl_lstm_cuda_backward";
    RL_TRY(check_loop(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    if (!dU || !db || (peep && !dpeep))
        return rl_error(RL_EARG, "%s: dU, db%s must be given (T=%lld B=%lld H=%lld)", fn,
                        peep ? " and the peephole gradients" : "", (long long)T, (long long)B,
                        (long long)H);
    RL_TRY(enter(fn, gates, B, H));
    cudaStream_t s = as_stream(stream);
    if (dt == RL_FLOAT32)
        return backward_loop<float>(s, dt, T, B, H, direction, len, (float *)gates,
                                    (const float *)U, (const float *const *)peep, (const float *)hs,
                                    (const float *)cs, (const float *)dout, dout_ld, (float *)dh,
                                    (float *)dc, (float *)dU, (float *)db,
                                    peep ? (float *const *)dpeep : nullptr);
    return backward_loop<double>(s, dt, T, B, H, direction, len, (double *)gates, (const double *)U,
                                 (const double *const *)peep, (const double *)hs,
                                 (const double *)cs, (const double *)dout, dout_ld, (double *)dh,
                                 (double *)dc, (double *)dU, (double *)db,
                                 peep ? (double *const *)dpeep : nullptr);
}
