/* The MDLSTM's CUDA kernels and their launchers (API and layout: kernels/cuda/mdlstm_cuda.h).
 *
 * The cell math is kernels/mdlstm_cell.h, the functions the CPU loops call. All directions of a
 * diagonal go together: one gather launch, one strided-batched cuBLAS GEMM over the directions
 * (every direction has the same number of cells on a diagonal), one pointwise launch. Threads
 * run over (cell, column) with the column fastest, so a warp reads consecutive elements of a
 * row. Within one pass the written rows (the diagonal's own cells) never coincide with the read
 * ones (predecessors or successors, on the neighbouring diagonals), so no atomics are needed.
 * The column sums of dz (the bias gradient) are a two-pass reduction over fixed row chunks and
 * block rows, added in a fixed order: results do not depend on scheduling.
 *
 * cuBLAS: the stream's handle of the CUDA context (kernels/cuda/context.h); default math mode, so
 * float32 stays float32 (no TF32).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../mdlstm_cell.h"
#include "mdlstm_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kCols = 32; /* columns per block of the column sums */
constexpr int kRows = 8;  /* rows per block of the column sums */

/* ---- the cell for either type ---- */

__device__ __forceinline__ void cell_fwd(bool stable, float *z1, float *z2, float *z3, float *z4,
                                         float *z5, float cu, float cl, float *c, float *h) {
    rl_mdlstm_cell_fwd_f32(stable, z1, z2, z3, z4, z5, cu, cl, c, h);
}
__device__ __forceinline__ void cell_fwd(bool stable, double *z1, double *z2, double *z3,
                                         double *z4, double *z5, double cu, double cl, double *c,
                                         double *h) {
    rl_mdlstm_cell_fwd_f64(stable, z1, z2, z3, z4, z5, cu, cl, c, h);
}
__device__ __forceinline__ void cell_bwd(bool stable, float *z1, float *z2, float *z3, float *z4,
                                         float *z5, float cu, float cl, float c, float dh, float dc,
                                         float *dcu, float *dcl) {
    rl_mdlstm_cell_bwd_f32(stable, z1, z2, z3, z4, z5, cu, cl, c, dh, dc, dcu, dcl);
}
__device__ __forceinline__ void cell_bwd(bool stable, double *z1, double *z2, double *z3,
                                         double *z4, double *z5, double cu, double cl, double c,
                                         double dh, double dc, double *dcu, double *dcl) {
    rl_mdlstm_cell_bwd_f64(stable, z1, z2, z3, z4, z5, cu, cl, c, dh, dc, dcu, dcl);
}

/* ---- kernels ---- */

template <typename T>
__global__ void k_stack_u(int nd, int64_t D, const T *Uu, const T *Ul, T *ucat, bool backward) {
    int64_t G = 5 * D, ldu = nd * G, per = 2 * D * G;
    RL_CUDA_GRID_LOOP(t, nd * per) {
        int64_t k = t / per, rem = t % per;
        const T *src;
        if (backward) { /* (D, 10D): row m = [U_up_k row m | U_left_k row m] */
            int64_t m = rem / (2 * G), col = rem % (2 * G);
            src = col < G ? Uu + m * ldu + k * G + col : Ul + m * ldu + k * G + (col - G);
        } else { /* (2D, 5D): rows 0..D-1 U_up_k, rows D..2D-1 U_left_k */
            int64_t m = rem / G, col = rem % G;
            src = m < D ? Uu + m * ldu + k * G + col : Ul + (m - D) * ldu + k * G + col;
        }
        ucat[t] = *src;
    }
}

/* dst (ntot, 2 cols): row c = [src row i1[c] | src row i2[c]], each restricted to the columns of
 * cell c's direction k = c / n (cols wide, at k * cols), 0 for an index < 0. */
template <typename T>
__global__ void k_gather(int64_t ntot, int64_t n, int64_t cols, const int64_t *i1,
                         const int64_t *i2, const T *src, int64_t lds, T *dst) {
    int64_t w = 2 * cols;
    RL_CUDA_GRID_LOOP(t, ntot * w) {
        int64_t c = t / w, q = t % w, k = c / n;
        bool second = q >= cols;
        int64_t j = second ? q - cols : q, r = second ? i2[c] : i1[c];
        dst[t] = r >= 0 ? src[r * lds + k * cols + j] : T(0);
    }
}

template <typename T, bool STABLE>
__global__ void k_fwd(int64_t ntot, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                      const int64_t *left, T *z, int64_t ldz, const T *r, const T *bias, T *c, T *h,
                      int64_t ldh) {
    RL_CUDA_GRID_LOOP(t, ntot * D) {
        int64_t cell = t / D, j = t % D, k = cell / n;
        int64_t p = pos[cell], u = up[cell], l = left[cell], kd = k * D + j;
        T *zr = z + p * ldz + k * 5 * D;
        const T *rk = r + cell * 5 * D, *bk = bias + k * 5 * D;
        T a1 = zr[j] + rk[j] + bk[j], a2 = zr[D + j] + rk[D + j] + bk[D + j],
          a3 = zr[2 * D + j] + rk[2 * D + j] + bk[2 * D + j],
          a4 = zr[3 * D + j] + rk[3 * D + j] + bk[3 * D + j],
          a5 = zr[4 * D + j] + rk[4 * D + j] + bk[4 * D + j];
        T cu = u >= 0 ? c[u * ldh + kd] : T(0), cl = l >= 0 ? c[l * ldh + kd] : T(0);
        cell_fwd(STABLE, &a1, &a2, &a3, &a4, &a5, cu, cl, &c[p * ldh + kd], &h[p * ldh + kd]);
        zr[j] = a1;
        zr[D + j] = a2;
        zr[2 * D + j] = a3;
        zr[3 * D + j] = a4;
        zr[4 * D + j] = a5;
    }
}

template <typename T, bool STABLE>
__global__ void k_bwd(int64_t ntot, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                      const int64_t *left, const int64_t *down, const int64_t *right, T *z,
                      int64_t ldz, const T *dhr, const T *dout, int64_t ldo, int64_t dcol,
                      const T *c, T *dcu, T *dcl, int64_t ldh) {
    RL_CUDA_GRID_LOOP(t, ntot * D) {
        int64_t cell = t / D, j = t % D, k = cell / n;
        int64_t p = pos[cell], u = up[cell], l = left[cell], dn = down[cell], rt = right[cell];
        int64_t kd = k * D + j;
        T *zr = z + p * ldz + k * 5 * D;
        T a1 = zr[j], a2 = zr[D + j], a3 = zr[2 * D + j], a4 = zr[3 * D + j], a5 = zr[4 * D + j];
        T dh = dhr[cell * D + j] + (dout ? dout[p * ldo + k * dcol + j] : T(0));
        T dc = (dn >= 0 ? dcu[dn * ldh + kd] : T(0)) + (rt >= 0 ? dcl[rt * ldh + kd] : T(0));
        T cu = u >= 0 ? c[u * ldh + kd] : T(0), cl = l >= 0 ? c[l * ldh + kd] : T(0);
        cell_bwd(STABLE, &a1, &a2, &a3, &a4, &a5, cu, cl, c[p * ldh + kd], dh, dc,
                 &dcu[p * ldh + kd], &dcl[p * ldh + kd]);
        zr[j] = a1;
        zr[D + j] = a2;
        zr[2 * D + j] = a3;
        zr[3 * D + j] = a4;
        zr[4 * D + j] = a5;
    }
}

template <typename T> __global__ void k_sum_dirs(int64_t N, int nd, int64_t D, const T *h, T *out) {
    RL_CUDA_GRID_LOOP(t, N * D) {
        int64_t r = t / D, j = t % D;
        T a = T(0);
        for (int k = 0; k < nd; k++)
            a += h[r * nd * D + k * D + j];
        out[t] = a;
    }
}

template <typename T>
__global__ void k_zero_padding(int64_t N, int64_t W, int64_t B, int64_t ldz, const int32_t *sz,
                               T *z) {
    RL_CUDA_GRID_LOOP(t, N * ldz) {
        int64_t r = t / ldz, b = r % B, x = (r / B) % W, y = r / (W * B);
        if (y >= sz[2 * b] || x >= sz[2 * b + 1]) z[t] = T(0);
    }
}

/* Block (kCols, kRows) of chunk blockIdx.y: partial[chunk][col] = the sum of z's rows in the
 * chunk, each thread row taking every kRows-th row, then the kRows partial sums in order. */
template <typename T>
__global__ void k_colsum_partial(int64_t N, int64_t cols, int64_t chunk_rows, const T *z,
                                 T *partial) {
    __shared__ T part[kRows][kCols];
    int64_t col = (int64_t)blockIdx.x * kCols + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
    T acc = T(0);
    if (col < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRows)
            acc += z[r * cols + col];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        T s = T(0);
        for (int i = 0; i < kRows; i++)
            s += part[i][threadIdx.x];
        partial[(int64_t)blockIdx.y * cols + col] = s;
    }
}

template <typename T>
__global__ void k_colsum_final(int64_t cols, int64_t chunks, const T *partial, T *db) {
    RL_CUDA_GRID_LOOP(col, cols) {
        T s = T(0);
        for (int64_t i = 0; i < chunks; i++)
            s += partial[i * cols + col];
        db[col] += s;
    }
}

template <typename T>
__global__ void k_shift_left(int64_t N, int64_t W, int64_t B, int nd, unsigned flip_x, int64_t D,
                             const T *h, T *out) {
    int64_t ldh = nd * D;
    RL_CUDA_GRID_LOOP(t, N * ldh) {
        int64_t r = t / ldh, q = t % ldh, k = q / D, x = (r / B) % W;
        int64_t sx = (flip_x >> k) & 1u ? -1 : 1, xp = x - sx;
        out[t] = xp >= 0 && xp < W ? h[(r - sx * B) * ldh + q] : T(0);
    }
}

/* ---- the diagonal loops ---- */

template <typename T>
rl_status forward_loop(cudaStream_t s, rl_dtype dt, bool stable, int nd, int64_t D, int64_t ndiag,
                       const int64_t *first, const int64_t *cells, int64_t cap, T *z, int64_t ldz,
                       const T *ucat, const T *bias, T *c, T *h, int64_t ldh, T *a, T *r) {
    const char *fn = "rl_mdlstm_cuda_forward";
    const int64_t *pos = cells, *up = pos + cap, *left = up + cap;
    for (int64_t d = 0; d < ndiag; d++) {
        int64_t o = first[d], ntot = first[d + 1] - o, n = ntot / nd;
        if (n == 0) continue;
        k_gather<T><<<rl_cuda_blocks_for(ntot * 2 * D), RL_CUDA_THREADS, 0, s>>>(
            ntot, n, D, up + o, left + o, h, ldh, a);
        RL_TRY(rl_cuda_launched("%s: launching k_gather (n=%lld, diagonal %lld)", fn,
                                (long long)(ntot), (long long)(d)));
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, n, 5 * D, 2 * D, 1.0, a, 2 * D,
                                    n * 2 * D, ucat, 5 * D, 2 * D * 5 * D, 0.0, r, 5 * D, n * 5 * D,
                                    nd));
        if (stable)
            k_fwd<T, true><<<rl_cuda_blocks_for(ntot * D), RL_CUDA_THREADS, 0, s>>>(
                ntot, n, D, pos + o, up + o, left + o, z, ldz, r, bias, c, h, ldh);
        else
            k_fwd<T, false><<<rl_cuda_blocks_for(ntot * D), RL_CUDA_THREADS, 0, s>>>(
                ntot, n, D, pos + o, up + o, left + o, z, ldz, r, bias, c, h, ldh);
        RL_TRY(rl_cuda_launched("%s: launching k_fwd (n=%lld, diagonal %lld)", fn,
                                (long long)(ntot), (long long)(d)));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(cudaStream_t s, rl_dtype dt, bool stable, int nd, int64_t D, int64_t ndiag,
                        const int64_t *first, const int64_t *cells, int64_t cap, T *z, int64_t ldz,
                        const T *ucat, const T *dout, int64_t ldo, int64_t dcol, const T *c, T *dcu,
                        T *dcl, int64_t ldh, T *g, T *dh) {
    const char *fn = "rl_mdlstm_cuda_backward";
    const int64_t *pos = cells, *up = pos + cap, *left = up + cap, *down = left + cap,
                  *right = down + cap;
    for (int64_t d = ndiag - 1; d >= 0; d--) {
        int64_t o = first[d], ntot = first[d + 1] - o, n = ntot / nd;
        if (n == 0) continue;
        k_gather<T><<<rl_cuda_blocks_for(ntot * 10 * D), RL_CUDA_THREADS, 0, s>>>(
            ntot, n, 5 * D, down + o, right + o, z, ldz, g);
        RL_TRY(rl_cuda_launched("%s: launching k_gather (n=%lld, diagonal %lld)", fn,
                                (long long)(ntot), (long long)(d)));
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, true, n, D, 10 * D, 1.0, g, 10 * D,
                                    n * 10 * D, ucat, 10 * D, D * 10 * D, 0.0, dh, D, n * D, nd));
        if (stable)
            k_bwd<T, true><<<rl_cuda_blocks_for(ntot * D), RL_CUDA_THREADS, 0, s>>>(
                ntot, n, D, pos + o, up + o, left + o, down + o, right + o, z, ldz, dh, dout, ldo,
                dcol, c, dcu, dcl, ldh);
        else
            k_bwd<T, false><<<rl_cuda_blocks_for(ntot * D), RL_CUDA_THREADS, 0, s>>>(
                ntot, n, D, pos + o, up + o, left + o, down + o, right + o, z, ldz, dh, dout, ldo,
                dcol, c, dcu, dcl, ldh);
        RL_TRY(rl_cuda_launched("%s: launching k_bwd (n=%lld, diagonal %lld)", fn,
                                (long long)(ntot), (long long)(d)));
    }
    return RL_OK;
}

rl_status check_loop(const char *fn, rl_dtype dt, int nd, int64_t D, int64_t ndiag,
                     const int64_t *first, const int64_t *cells) {
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (nd < 1 || D < 1 || ndiag < 0 || (ndiag > 0 && (!first || !cells)))
        return rl_error(RL_EARG, "%s: bad arguments (directions=%d D=%lld diagonals=%lld)", fn, nd,
                        (long long)D, (long long)ndiag);
    for (int64_t d = 0; d < ndiag; d++)
        if (first[d + 1] < first[d] || (first[d + 1] - first[d]) % nd != 0)
            return rl_error(RL_EARG,
                            "%s: diagonal %lld has %lld cells, not a multiple of %d directions", fn,
                            (long long)d, (long long)(first[d + 1] - first[d]), nd);
    return RL_OK;
}

} // namespace

/* ---- the C API ---- */

extern "C" rl_status rl_mdlstm_cuda_stack_u(void *stream, rl_dtype dt, int nd, int64_t D,
                                            const void *Uu, const void *Ul, void *ucat,
                                            bool backward) {
    const char *fn = "rl_mdlstm_cuda_stack_u";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (nd < 1 || D < 1) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, ucat));
    cudaStream_t s = rl_cuda_stream(stream);
    unsigned nb = rl_cuda_blocks_for(nd * 10 * D * D);
    if (dt == RL_FLOAT32)
        k_stack_u<float><<<nb, RL_CUDA_THREADS, 0, s>>>(nd, D, (const float *)Uu, (const float *)Ul,
                                                        (float *)ucat, backward);
    else
        k_stack_u<double><<<nb, RL_CUDA_THREADS, 0, s>>>(
            nd, D, (const double *)Uu, (const double *)Ul, (double *)ucat, backward);
    return rl_cuda_launched("%s: launching k_stack_u (n=%lld)", fn, (long long)(nd * D));
}

extern "C" rl_status rl_mdlstm_cuda_forward(void *stream, rl_dtype dt, bool stable, int nd,
                                            int64_t D, int64_t ndiag, const int64_t *first,
                                            const int64_t *cells, int64_t cap, void *z, int64_t ldz,
                                            const void *ucat, const void *bias, void *c, void *h,
                                            int64_t ldh, void *a, void *r) {
    const char *fn = "rl_mdlstm_cuda_forward";
    RL_TRY(check_loop(fn, dt, nd, D, ndiag, first, cells));
    if (ndiag == 0 || first[ndiag] == first[0]) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        return forward_loop<float>(s, dt, stable, nd, D, ndiag, first, cells, cap, (float *)z, ldz,
                                   (const float *)ucat, (const float *)bias, (float *)c, (float *)h,
                                   ldh, (float *)a, (float *)r);
    return forward_loop<double>(s, dt, stable, nd, D, ndiag, first, cells, cap, (double *)z, ldz,
                                (const double *)ucat, (const double *)bias, (double *)c,
                                (double *)h, ldh, (double *)a, (double *)r);
}

extern "C" rl_status rl_mdlstm_cuda_backward(void *stream, rl_dtype dt, bool stable, int nd,
                                             int64_t D, int64_t ndiag, const int64_t *first,
                                             const int64_t *cells, int64_t cap, void *z,
                                             int64_t ldz, const void *ucat, const void *dout,
                                             int64_t ldo, int64_t dcol, const void *c, void *dcu,
                                             void *dcl, int64_t ldh, void *g, void *dh) {
    const char *fn = "rl_mdlstm_cuda_backward";
    RL_TRY(check_loop(fn, dt, nd, D, ndiag, first, cells));
    if (ndiag == 0 || first[ndiag] == first[0]) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        return backward_loop<float>(s, dt, stable, nd, D, ndiag, first, cells, cap, (float *)z, ldz,
                                    (const float *)ucat, (const float *)dout, ldo, dcol,
                                    (const float *)c, (float *)dcu, (float *)dcl, ldh, (float *)g,
                                    (float *)dh);
    return backward_loop<double>(s, dt, stable, nd, D, ndiag, first, cells, cap, (double *)z, ldz,
                                 (const double *)ucat, (const double *)dout, ldo, dcol,
                                 (const double *)c, (double *)dcu, (double *)dcl, ldh, (double *)g,
                                 (double *)dh);
}

extern "C" rl_status rl_mdlstm_cuda_sum_dirs(void *stream, rl_dtype dt, int64_t N, int nd,
                                             int64_t D, const void *h, void *out) {
    const char *fn = "rl_mdlstm_cuda_sum_dirs";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (N <= 0 || D <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, out));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        k_sum_dirs<float><<<rl_cuda_blocks_for(N * D), RL_CUDA_THREADS, 0, s>>>(
            N, nd, D, (const float *)h, (float *)out);
    else
        k_sum_dirs<double><<<rl_cuda_blocks_for(N * D), RL_CUDA_THREADS, 0, s>>>(
            N, nd, D, (const double *)h, (double *)out);
    return rl_cuda_launched("%s: launching k_sum_dirs (n=%lld)", fn, (long long)(N));
}

extern "C" rl_status rl_mdlstm_cuda_finish_dz(void *stream, rl_dtype dt, int64_t H, int64_t W,
                                              int64_t B, const int32_t *sizes, void *z, int64_t ldz,
                                              void *partial, void *db) {
    const char *fn = "rl_mdlstm_cuda_finish_dz";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t N = H * W * B;
    if (N <= 0 || ldz <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    cudaStream_t s = rl_cuda_stream(stream);
    int64_t chunks = N < RL_MDLSTM_CUDA_CHUNKS ? N : RL_MDLSTM_CUDA_CHUNKS;
    int64_t chunk_rows = (N + chunks - 1) / chunks;
    dim3 block(kCols, kRows), grid((unsigned)((ldz + kCols - 1) / kCols), (unsigned)chunks);
    if (dt == RL_FLOAT32) {
        k_zero_padding<float><<<rl_cuda_blocks_for(N * ldz), RL_CUDA_THREADS, 0, s>>>(
            N, W, B, ldz, sizes, (float *)z);
        RL_TRY(rl_cuda_launched("%s: launching k_zero_padding (n=%lld)", fn, (long long)(N)));
        k_colsum_partial<float>
            <<<grid, block, 0, s>>>(N, ldz, chunk_rows, (const float *)z, (float *)partial);
        RL_TRY(rl_cuda_launched("%s: launching k_colsum_partial (n=%lld)", fn, (long long)(N)));
        k_colsum_final<float><<<rl_cuda_blocks_for(ldz), RL_CUDA_THREADS, 0, s>>>(
            ldz, chunks, (const float *)partial, (float *)db);
    } else {
        k_zero_padding<double><<<rl_cuda_blocks_for(N * ldz), RL_CUDA_THREADS, 0, s>>>(
            N, W, B, ldz, sizes, (double *)z);
        RL_TRY(rl_cuda_launched("%s: launching k_zero_padding (n=%lld)", fn, (long long)(N)));
        k_colsum_partial<double>
            <<<grid, block, 0, s>>>(N, ldz, chunk_rows, (const double *)z, (double *)partial);
        RL_TRY(rl_cuda_launched("%s: launching k_colsum_partial (n=%lld)", fn, (long long)(N)));
        k_colsum_final<double><<<rl_cuda_blocks_for(ldz), RL_CUDA_THREADS, 0, s>>>(
            ldz, chunks, (const double *)partial, (double *)db);
    }
    return rl_cuda_launched("%s: launching k_colsum_final (n=%lld)", fn, (long long)(N));
}

extern "C" rl_status rl_mdlstm_cuda_shift_left(void *stream, rl_dtype dt, int64_t H, int64_t W,
                                               int64_t B, int nd, unsigned flip_x, int64_t D,
                                               const void *h, void *out) {
    const char *fn = "rl_mdlstm_cuda_shift_left";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t N = H * W * B;
    if (N <= 0 || nd < 1 || D < 1) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, out));
    cudaStream_t s = rl_cuda_stream(stream);
    unsigned nb = rl_cuda_blocks_for(N * nd * D);
    if (dt == RL_FLOAT32)
        k_shift_left<float>
            <<<nb, RL_CUDA_THREADS, 0, s>>>(N, W, B, nd, flip_x, D, (const float *)h, (float *)out);
    else
        k_shift_left<double><<<nb, RL_CUDA_THREADS, 0, s>>>(N, W, B, nd, flip_x, D,
                                                            (const double *)h, (double *)out);
    return rl_cuda_launched("%s: launching k_shift_left (n=%lld)", fn, (long long)(N));
}
