/* The GRU's CUDA kernels and launchers (API and buffer layout: kernels/cuda/gru_cuda.h).
 *
 * The cell math is kernels/gru_cell.h, the functions the CPU loops call, so the two devices
 * differ only by the last bits of the device's exp. Per step one cuBLAS GEMM (h_prev U into the
 * step's [r | z | hn] blocks, through the CUDA context's per-stream cuBLAS handle,
 * kernels/cuda/context.h, no TF32) and one fused pointwise kernel, one thread per (b, j):
 *   forward: reads the four blocks, adds the biases, writes the activations over them, the
 *            state and the output; padded rows copy the previous state and write 0 out.
 *   backward: writes dG over the activations and dh = dLoss/dh * z (the direct part; the GEMM
 *            then adds dG U^T); padded rows zero their dG and leave dh as it is.
 * The bias gradients are one column-sum kernel over all frames after the loop (blocks of 32
 * columns x 8 rows; each thread walks its column in steps of 8 and the block adds its 8 partial
 * sums in a fixed order, so the result is deterministic), dU one GEMM over all frames.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../gru_cell.h"
#include "gru_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kCols = 32; /* columns per block of the bias sums */
constexpr int kRows = 8;  /* rows per block of the bias sums */

rl_dtype dtype_of(float) { return RL_FLOAT32; }
rl_dtype dtype_of(double) { return RL_FLOAT64; }

/* ---- the cell for either type ---- */

__device__ __forceinline__ void cell_fwd(float ar, float az, float an, float hn, float hp, float *r,
                                         float *z, float *n, float *h) {
    rl_gru_cell_fwd_f32(ar, az, an, hn, hp, r, z, n, h);
}
__device__ __forceinline__ void cell_fwd(double ar, double az, double an, double hn, double hp,
                                         double *r, double *z, double *n, double *h) {
    rl_gru_cell_fwd_f64(ar, az, an, hn, hp, r, z, n, h);
}
__device__ __forceinline__ void cell_bwd(float r, float z, float n, float hn, float hp, float dh,
                                         float *dar, float *daz, float *dan, float *dhn,
                                         float *dhp) {
    rl_gru_cell_bwd_f32(r, z, n, hn, hp, dh, dar, daz, dan, dhn, dhp);
}
__device__ __forceinline__ void cell_bwd(double r, double z, double n, double hn, double hp,
                                         double dh, double *dar, double *daz, double *dan,
                                         double *dhn, double *dhp) {
    rl_gru_cell_bwd_f64(r, z, n, hn, hp, dh, dar, daz, dan, dhn, dhp);
}

/* ---- kernels ---- */

template <typename T>
__global__ void k_fwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                      T *__restrict__ g, const T *__restrict__ b, const T *__restrict__ bh,
                      const T *__restrict__ hp, T *__restrict__ h, T *__restrict__ out) {
    int64_t n = B * H;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t i = e / H, j = e - i * H;
        if (t >= (int64_t)len[i]) {
            h[e] = hp[e];
            out[e] = T(0);
            continue;
        }
        T *gr = g + i * 4 * H + j;
        T r, z, nn, hh, hn = gr[2 * H] + bh[2 * H + j];
        cell_fwd(gr[0] + b[j] + bh[j], gr[H] + b[H + j] + bh[H + j], gr[3 * H] + b[2 * H + j], hn,
                 hp[e], &r, &z, &nn, &hh);
        gr[0] = r;
        gr[H] = z;
        gr[2 * H] = hn;
        gr[3 * H] = nn;
        h[e] = hh;
        out[e] = hh;
    }
}

template <typename T>
__global__ void k_bwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                      T *__restrict__ g, const T *__restrict__ hp, const T *__restrict__ dout,
                      int64_t dout_ld, T *__restrict__ dh) {
    int64_t n = B * H;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t i = e / H, j = e - i * H;
        T *gr = g + i * 4 * H + j;
        if (t >= (int64_t)len[i]) {
            gr[0] = gr[H] = gr[2 * H] = gr[3 * H] = T(0);
            continue;
        }
        T dar, daz, dan, dhn, dhp;
        T d = dh[e] + (dout ? dout[i * dout_ld + j] : T(0));
        cell_bwd(gr[0], gr[H], gr[3 * H], gr[2 * H], hp[e], d, &dar, &daz, &dan, &dhn, &dhp);
        gr[0] = dar;
        gr[H] = daz;
        gr[2 * H] = dhn;
        gr[3 * H] = dan;
        dh[e] = dhp;
    }
}

/* Block (kCols, kRows); grid.x covers the H columns. */
template <typename T>
__global__ void k_bias_grads(int64_t N, int64_t H, const T *__restrict__ dg, T *__restrict__ db,
                             T *__restrict__ dbh) {
    __shared__ T sh[4][kRows][kCols];
    int64_t j = (int64_t)blockIdx.x * kCols + threadIdx.x;
    T part[4] = {T(0), T(0), T(0), T(0)};
    if (j < H)
        for (int64_t n = threadIdx.y; n < N; n += kRows) {
            const T *row = dg + n * 4 * H + j;
            for (int k = 0; k < 4; k++)
                part[k] += row[k * H];
        }
    for (int k = 0; k < 4; k++)
        sh[k][threadIdx.y][threadIdx.x] = part[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < H) {
        T s[4];
        for (int k = 0; k < 4; k++) {
            s[k] = T(0);
            for (int r = 0; r < kRows; r++)
                s[k] += sh[k][r][threadIdx.x];
        }
        /* s: dar, daz, dhn, dan */
        db[j] += s[0];
        db[H + j] += s[1];
        db[2 * H + j] += s[3];
        dbh[j] += s[0];
        dbh[H + j] += s[1];
        dbh[2 * H + j] += s[2];
    }
}

template <typename T>
__global__ void k_zero_padding(int64_t T_, int64_t B, int64_t F, const int32_t *__restrict__ len,
                               T *__restrict__ x) {
    int64_t n = T_ * B * F;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t row = e / F, t = row / B, i = row - t * B;
        if (t >= (int64_t)len[i]) x[e] = T(0);
    }
}

/* ---- launchers ---- */

template <typename T>
rl_status fwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *g, const T *b, const T *bh, const T *hp, T *h, T *out) {
    if (B <= 0 || H <= 0) return RL_OK;
    k_fwd<T>
        <<<rl_cuda_blocks_for(B * H), RL_CUDA_THREADS, 0, s>>>(B, H, t, len, g, b, bh, hp, h, out);
    return rl_cuda_launched("%s: launching k_fwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status bwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *g, const T *hp, const T *dout, int64_t dout_ld, T *dh) {
    if (B <= 0 || H <= 0) return RL_OK;
    k_bwd<T><<<rl_cuda_blocks_for(B * H), RL_CUDA_THREADS, 0, s>>>(B, H, t, len, g, hp, dout,
                                                                   dout_ld, dh);
    return rl_cuda_launched("%s: launching k_bwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status bias_grads(cudaStream_t s, int64_t N, int64_t H, const T *dg, T *db, T *dbh) {
    if (N <= 0 || H <= 0) return RL_OK;
    dim3 block(kCols, kRows), grid((unsigned)((H + kCols - 1) / kCols));
    k_bias_grads<T><<<grid, block, 0, s>>>(N, H, dg, db, dbh);
    return rl_cuda_launched("rl_gru_cuda_bias_grads: launching k_bias_grads (N=%lld H=%lld)",
                            (long long)N, (long long)H);
}

template <typename T>
rl_status forward_loop(void *stream, int64_t T_, int64_t B, int64_t H, int dir, const int32_t *len,
                       T *gates, const T *U, const T *b, const T *bh, T *hs, T *out) {
    const char *fn = "rl_gru_cuda_forward";
    cudaStream_t s = rl_cuda_stream(stream);
    rl_dtype dt = dtype_of(T(0));
    int64_t BH = B * H;
    /* the hn block receives the recurrent product alone */
    cudaError_t e = cudaMemset2DAsync(gates + 2 * H, (size_t)(4 * H) * sizeof(T), 0,
                                      (size_t)H * sizeof(T), (size_t)(T_ * B), s);
    if (e != cudaSuccess)
        return rl_cuda_fail(e, "%s: cudaMemset2DAsync (T=%lld B=%lld H=%lld)", fn, (long long)T_,
                            (long long)B, (long long)H);
    for (int64_t st = 0; st < T_; st++) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *gt = gates + t * B * 4 * H;
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, B, 3 * H, H, 1.0, hs + prev * BH, H, 0,
                                    U, 3 * H, 0, 1.0, gt, 4 * H, 0, 1));
        RL_TRY(fwd_step<T>(fn, s, B, H, t, len, gt, b, bh, hs + prev * BH, hs + cur * BH,
                           out + t * BH));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(void *stream, int64_t T_, int64_t B, int64_t H, int dir, const int32_t *len,
                        T *gates, const T *U, const T *hs, const T *dout, int64_t dout_ld, T *dh,
                        T *dU, T *db, T *dbh) {
    const char *fn = "rl_gru_cuda_backward";
    cudaStream_t s = rl_cuda_stream(stream);
    rl_dtype dt = dtype_of(T(0));
    int64_t BH = B * H;
    for (int64_t st = T_ - 1; st >= 0; st--) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1;
        T *gt = gates + t * B * 4 * H;
        RL_TRY(bwd_step<T>(fn, s, B, H, t, len, gt, hs + prev * BH,
                           dout ? dout + t * B * dout_ld : nullptr, dout_ld, dh));
        /* padded rows of dG_t are 0, so their dh passes through unchanged */
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, true, B, H, 3 * H, 1.0, gt, 4 * H, 0, U,
                                    3 * H, 0, 1.0, dh, H, 0, 1));
    }
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1) */
    const T *hprev = hs + (dir > 0 ? 0 : BH);
    RL_TRY(rl_cuda_gemm_batched(fn, s, dt, true, false, H, 3 * H, T_ * B, 1.0, hprev, H, 0, gates,
                                4 * H, 0, 1.0, dU, 3 * H, 0, 1));
    return bias_grads<T>(s, T_ * B, H, gates, db, dbh);
}

} // namespace

/* ---- the C API ---- */

extern "C" rl_status rl_gru_cuda_fwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                         const int32_t *len, float *g, const float *b,
                                         const float *bh, const float *hp, float *h, float *out) {
    const char *fn = "rl_gru_cuda_fwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, g));
    return fwd_step<float>(fn, rl_cuda_stream(stream), B, H, t, len, g, b, bh, hp, h, out);
}

extern "C" rl_status rl_gru_cuda_fwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                         const int32_t *len, double *g, const double *b,
                                         const double *bh, const double *hp, double *h,
                                         double *out) {
    const char *fn = "rl_gru_cuda_fwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, g));
    return fwd_step<double>(fn, rl_cuda_stream(stream), B, H, t, len, g, b, bh, hp, h, out);
}

extern "C" rl_status rl_gru_cuda_bwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                         const int32_t *len, float *g, const float *hp,
                                         const float *dout, int64_t dout_ld, float *dh) {
    const char *fn = "rl_gru_cuda_bwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, g));
    return bwd_step<float>(fn, rl_cuda_stream(stream), B, H, t, len, g, hp, dout, dout_ld, dh);
}

extern "C" rl_status rl_gru_cuda_bwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                         const int32_t *len, double *g, const double *hp,
                                         const double *dout, int64_t dout_ld, double *dh) {
    const char *fn = "rl_gru_cuda_bwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, g));
    return bwd_step<double>(fn, rl_cuda_stream(stream), B, H, t, len, g, hp, dout, dout_ld, dh);
}

extern "C" rl_status rl_gru_cuda_bias_grads(void *stream, rl_dtype dt, int64_t N, int64_t H,
                                            const void *dg, void *db, void *dbh) {
    const char *fn = "rl_gru_cuda_bias_grads";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (N <= 0 || H <= 0) return RL_OK;
    if (!db || !dbh)
        return rl_error(RL_EARG, "%s: db and dbh must be given (N=%lld H=%lld)", fn, (long long)N,
                        (long long)H);
    RL_TRY(rl_cuda_enter(fn, dg));
    if (dt == RL_FLOAT32)
        return bias_grads<float>(rl_cuda_stream(stream), N, H, (const float *)dg, (float *)db,
                                 (float *)dbh);
    return bias_grads<double>(rl_cuda_stream(stream), N, H, (const double *)dg, (double *)db,
                              (double *)dbh);
}

extern "C" rl_status rl_gru_cuda_zero_padding(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                              int64_t F, const int32_t *len, void *x) {
    const char *fn = "rl_gru_cuda_zero_padding";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (T <= 0 || B <= 0 || F <= 0) return RL_OK;
    if (!len)
        return rl_error(RL_EARG, "%s: no lengths (T=%lld B=%lld)", fn, (long long)T, (long long)B);
    RL_TRY(rl_cuda_enter(fn, x));
    unsigned g = rl_cuda_blocks_for(T * B * F);
    if (dt == RL_FLOAT32)
        k_zero_padding<float>
            <<<g, RL_CUDA_THREADS, 0, rl_cuda_stream(stream)>>>(T, B, F, len, (float *)x);
    else
        k_zero_padding<double>
            <<<g, RL_CUDA_THREADS, 0, rl_cuda_stream(stream)>>>(T, B, F, len, (double *)x);
    return rl_cuda_launched("%s: launching k_zero_padding (T=%lld B=%lld F=%lld)", fn, (long long)T,
                            (long long)B, (long long)F);
}

extern "C" rl_status rl_gru_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                         int direction, const int32_t *len, void *gates,
                                         const void *U, const void *b, const void *bh, void *hs,
                                         void *out) {
    const char *fn = "rl_gru_cuda_forward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return forward_loop<float>(stream, T, B, H, direction, len, (float *)gates,
                                   (const float *)U, (const float *)b, (const float *)bh,
                                   (float *)hs, (float *)out);
    return forward_loop<double>(stream, T, B, H, direction, len, (double *)gates, (const double *)U,
                                (const double *)b, (const double *)bh, (double *)hs, (double *)out);
}

extern "C" rl_status rl_gru_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                          int64_t H, int direction, const int32_t *len, void *gates,
                                          const void *U, const void *hs, const void *dout,
                                          int64_t dout_ld, void *dh, void *dU, void *db,
                                          void *dbh) {
    const char *fn = "rl_gru_cuda_backward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    if (!dU || !db || !dbh)
        return rl_error(RL_EARG, "%s: dU, db and dbh must be given (T=%lld B=%lld H=%lld)", fn,
                        (long long)T, (long long)B, (long long)H);
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return backward_loop<float>(stream, T, B, H, direction, len, (float *)gates,
                                    (const float *)U, (const float *)hs, (const float *)dout,
                                    dout_ld, (float *)dh, (float *)dU, (float *)db, (float *)dbh);
    return backward_loop<double>(stream, T, B, H, direction, len, (double *)gates,
                                 (const double *)U, (const double *)hs, (const double *)dout,
                                 dout_ld, (double *)dh, (double *)dU, (double *)db, (double *)dbh);
}
