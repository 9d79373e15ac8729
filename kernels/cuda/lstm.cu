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
 * (rl_lstm_cuda_param_grads: the same blocks over up to RL_LSTM_CUDA_CHUNKS row chunks, then one
 * thread per column adds the chunks in order, so a full grid however small H is) and dU to one
 * GEMM, so the steps stay short.
 *
 * The GEMMs use the stream's cuBLAS handle of the CUDA context (kernels/cuda/context.h: streams,
 * events, handles; cuBLAS's default math, no TF32, so float32 stays float32).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../lstm_cell.h"
#include "../lstm_ln_row.h"
#include "lstm_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kCols = 32; /* columns per block of the reduction kernels */
constexpr int kRows = 8;  /* batch rows per block of the reduction kernels */

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

/* Zoneout of one frame (kernels/lstm.h's rl_lstm_zo_f32 on the device): the weights mc, mh of
 * the previous cell and hidden state (NULL: that state has none) and c~, the cell before zoneout;
 * ct NULL: no zoneout. */
template <typename T> struct Zo {
    const T *mc, *mh;
    T *ct;
};

/* The three peephole vectors by value (kernel arguments), null without peepholes. */
template <typename T> struct Peep { const T *p[3]; };
template <typename T> struct DPeep { T *p[3]; };

/* ---- kernels ---- */

template <typename T, bool PEEP>
__global__ void k_fwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                      T *__restrict__ z, const T *__restrict__ bias, Peep<T> peep,
                      const T *__restrict__ cp, const T *__restrict__ hp, T *__restrict__ c,
                      T *__restrict__ h, T *__restrict__ out, Zo<T> zo) {
    int64_t n = B * H;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t b = e / H, j = e - b * H;
        if (t >= (int64_t)len[b]) {
            c[e] = cp[e];
            h[e] = hp[e];
            out[e] = T(0);
            if (zo.ct) zo.ct[e] = cp[e]; /* as the CPU's: finite for p_o's gradient */
            continue;
        }
        T *zr = z + b * 4 * H + j;
        T i, f, g, o, cc, hh;
        cell_fwd(zr[0] + bias[j], zr[H] + bias[H + j], zr[2 * H] + bias[2 * H + j],
                 zr[3 * H] + bias[3 * H + j], cp[e], PEEP ? peep.p[0][j] : T(0),
                 PEEP ? peep.p[1][j] : T(0), PEEP ? peep.p[2][j] : T(0), &i, &f, &g, &o, &cc, &hh);
        if (zo.ct) {
            zo.ct[e] = cc;
            if (zo.mc) cc = rl_cuda_zoneout(zo.mc[e], cp[e], cc);
            if (zo.mh) hh = rl_cuda_zoneout(zo.mh[e], hp[e], hh);
        }
        zr[0] = i;
        zr[H] = f;
        zr[2 * H] = g;
        zr[3 * H] = o;
        c[e] = cc;
        h[e] = hh;
        out[e] = hh;
    }
}

/* The block's kRows partial sums of each of the K gradient rows of column j, in row order, added
 * to (add) or stored in dst[k][j]. part: the thread's K partial sums; dst[k]: the K destinations
 * (k < 4: db + k * H, then the peepholes; or the rows of a chunk's partial sums). */
template <typename T, int K>
__device__ __forceinline__ void block_add(const T *part, T *const *dst, int64_t j, int64_t H,
                                          bool add) {
    __shared__ T sh[K][kRows][kCols];
    for (int k = 0; k < K; k++)
        sh[k][threadIdx.y][threadIdx.x] = part[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < H) {
        for (int k = 0; k < K; k++) {
            T s = T(0);
            for (int r = 0; r < kRows; r++)
                s += sh[k][r][threadIdx.x];
            dst[k][j] = add ? dst[k][j] + s : s;
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
         T dz[4], Zo<T> zo) {
    T *zr = z + b * 4 * H + j;
    if (t >= (int64_t)len[b]) {
        zr[0] = zr[H] = zr[2 * H] = zr[3 * H] = T(0);
        return false;
    }
    int64_t e = b * H + j;
    T dcp;
    T dhe = dh[e] + (dout ? dout[b * dout_ld + j] : T(0)), dce = dc[e];
    /* with zoneout the cell sees (1 - m) of each state's gradient and c~ */
    bool zoned = zo.ct != nullptr;
    T mc = zo.mc ? zo.mc[e] : T(0), mh = zo.mh ? zo.mh[e] : T(0);
    cell_bwd(zr[0], zr[H], zr[2 * H], zr[3 * H], cp[e], zoned ? zo.ct[e] : c[e], pi, pf, po,
             zoned ? rl_cuda_zoneout_new(mh, dhe) : dhe, zoned ? rl_cuda_zoneout_new(mc, dce) : dce,
             &dz[0], &dz[1], &dz[2], &dz[3], &dcp);
    zr[0] = dz[0];
    zr[H] = dz[1];
    zr[2 * H] = dz[2];
    zr[3 * H] = dz[3];
    dc[e] = zoned ? dcp + rl_cuda_zoneout_prev(mc, dce) : dcp;
    dh[e] = zoned ? rl_cuda_zoneout_prev(mh, dhe) : T(0);
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
            if (!bwd_elem(b, j, H, t, len, z, pi, pf, po, cp, c, dout, dout_ld, dh, dc, dz,
                          Zo<T>{}))
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
    block_add<T, NG>(part, dst, j, H, true);
}

/* The backward step with no column sums (what the whole recurrence runs; db and dpeep come
 * after the loop from rl_lstm_cuda_param_grads): one thread per (b, j) over a grid like the
 * forward's, so H = 512, B = 64 fills 128 blocks of 256 threads, not 16 of 256. */
template <typename T, bool PEEP>
__global__ void k_bwd_pw(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                         T *__restrict__ z, Peep<T> peep, const T *__restrict__ cp,
                         const T *__restrict__ c, const T *__restrict__ dout, int64_t dout_ld,
                         T *__restrict__ dh, T *__restrict__ dc, Zo<T> zo) {
    int64_t n = B * H;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t b = e / H, j = e - b * H;
        T dz[4];
        (void)bwd_elem(b, j, H, t, len, z, PEEP ? peep.p[0][j] : T(0), PEEP ? peep.p[1][j] : T(0),
                       PEEP ? peep.p[2][j] : T(0), cp, c, dout, dout_ld, dh, dc, dz, zo);
    }
}

/* Stage 1 of db and dpeep over N frames: block (kCols, kRows) of row chunk blockIdx.y writes
 * that chunk's K = 4 (or 7 with PEEP) column sums of column j to partial rows
 * blockIdx.y * K + k (same order of summation within the chunk as k_bwd). */
template <typename T, bool PEEP>
__global__ void k_param_partial(int64_t N, int64_t H, int64_t chunk_rows, const T *__restrict__ dz,
                                const T *__restrict__ cprev, const T *__restrict__ cur,
                                T *__restrict__ partial) {
    constexpr int K = PEEP ? 7 : 4;
    int64_t j = (int64_t)blockIdx.x * kCols + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
    T part[7] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
    if (j < H) {
        for (int64_t n = r0 + threadIdx.y; n < r1; n += kRows) {
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
    T *row = partial + (int64_t)blockIdx.y * K * H;
    T *dst[7] = {row, row + H, row + 2 * H, row + 3 * H, row + 4 * H, row + 5 * H, row + 6 * H};
    block_add<T, K>(part, dst, j, H, false);
}

/* Stage 2: per column j the chunks' partial sums added in chunk order into db and dpeep. */
template <typename T, bool PEEP>
__global__ void k_param_final(int64_t H, int64_t chunks, const T *__restrict__ partial,
                              T *__restrict__ db, DPeep<T> dpeep) {
    constexpr int K = PEEP ? 7 : 4;
    RL_CUDA_GRID_LOOP(j, H) {
        T s[7] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
        for (int64_t c = 0; c < chunks; c++)
            for (int k = 0; k < K; k++)
                s[k] += partial[(c * K + k) * H + j];
        for (int k = 0; k < 4; k++)
            db[k * H + j] += s[k];
        if (PEEP)
            for (int k = 0; k < 3; k++)
                dpeep.p[k][j] += s[4 + k];
    }
}

/* ---- launchers ---- */

template <typename T>
rl_status fwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *z, const T *bias, const T *const *peep, const T *cp,
                   const T *hp, T *c, T *h, T *out, Zo<T> zo = Zo<T>{}) {
    if (B <= 0 || H <= 0) return RL_OK;
    Peep<T> pp = {{peep ? peep[0] : nullptr, peep ? peep[1] : nullptr, peep ? peep[2] : nullptr}};
    unsigned g = rl_cuda_blocks_for(B * H);
    if (peep)
        k_fwd<T, true>
            <<<g, RL_CUDA_THREADS, 0, s>>>(B, H, t, len, z, bias, pp, cp, hp, c, h, out, zo);
    else
        k_fwd<T, false>
            <<<g, RL_CUDA_THREADS, 0, s>>>(B, H, t, len, z, bias, pp, cp, hp, c, h, out, zo);
    return rl_cuda_launched("%s: launching k_fwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status bwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *z, const T *const *peep, const T *cp, const T *c,
                   const T *dout, int64_t dout_ld, T *dh, T *dc, T *db, T *const *dpeep,
                   Zo<T> zo = Zo<T>{}) {
    if (B <= 0 || H <= 0) return RL_OK;
    if (dpeep && !db)
        return rl_error(RL_EARG, "%s: peephole gradients need the bias gradient too (H=%lld)", fn,
                        (long long)H);
    Peep<T> pp = {{peep ? peep[0] : nullptr, peep ? peep[1] : nullptr, peep ? peep[2] : nullptr}};
    DPeep<T> dp = {
        {dpeep ? dpeep[0] : nullptr, dpeep ? dpeep[1] : nullptr, dpeep ? dpeep[2] : nullptr}};
    if (!db) { /* no column sums: the forward's geometry */
        unsigned g = rl_cuda_blocks_for(B * H);
        if (peep)
            k_bwd_pw<T, true><<<g, RL_CUDA_THREADS, 0, s>>>(B, H, t, len, z, pp, cp, c, dout,
                                                            dout_ld, dh, dc, zo);
        else
            k_bwd_pw<T, false><<<g, RL_CUDA_THREADS, 0, s>>>(B, H, t, len, z, pp, cp, c, dout,
                                                             dout_ld, dh, dc, zo);
        return rl_cuda_launched("%s: launching k_bwd_pw (B=%lld H=%lld t=%lld)", fn, (long long)B,
                                (long long)H, (long long)t);
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
    return rl_cuda_launched("%s: launching k_bwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status param_grads(cudaStream_t s, int64_t N, int64_t H, const T *dz, const T *cprev,
                      const T *cur, T *partial, T *db, T *const *dpeep) {
    const char *fn = "rl_lstm_cuda_param_grads";
    if (N <= 0 || H <= 0) return RL_OK;
    DPeep<T> dp = {
        {dpeep ? dpeep[0] : nullptr, dpeep ? dpeep[1] : nullptr, dpeep ? dpeep[2] : nullptr}};
    int64_t chunk_rows, chunks = rl_cuda_colsum_chunks(N, RL_LSTM_CUDA_CHUNKS, &chunk_rows);
    dim3 block(kCols, kRows), grid((unsigned)((H + kCols - 1) / kCols), (unsigned)chunks);
    if (dpeep)
        k_param_partial<T, true><<<grid, block, 0, s>>>(N, H, chunk_rows, dz, cprev, cur, partial);
    else
        k_param_partial<T, false><<<grid, block, 0, s>>>(N, H, chunk_rows, dz, cprev, cur, partial);
    RL_TRY(rl_cuda_launched("%s: launching k_param_partial (N=%lld H=%lld)", fn, (long long)N,
                            (long long)H));
    unsigned g2 = rl_cuda_blocks_for(H);
    if (dpeep)
        k_param_final<T, true><<<g2, RL_CUDA_THREADS, 0, s>>>(H, chunks, partial, db, dp);
    else
        k_param_final<T, false><<<g2, RL_CUDA_THREADS, 0, s>>>(H, chunks, partial, db, dp);
    return rl_cuda_launched("%s: launching k_param_final (N=%lld H=%lld)", fn, (long long)N,
                            (long long)H);
}

/* ---- whole recurrences ---- */

/* n_proj, forward: after h_t = m_t R, a padded row carries h_prev and outputs 0, a valid one
 * outputs h_t (rows of P). */
template <typename T>
__global__ void k_proj_rows(int64_t B, int64_t P, int64_t t, const int32_t *__restrict__ len,
                            const T *__restrict__ hp, T *__restrict__ h, T *__restrict__ out) {
    RL_CUDA_GRID_LOOP(e, B * P) {
        bool valid = t < (int64_t)len[e / P];
        if (!valid) h[e] = hp[e];
        out[e] = valid ? h[e] : T(0);
    }
}

/* n_proj, backward: drs = dh + dout and dh = 0 on valid rows; drs = 0 on padded ones, whose dh
 * passes through (rows of P). */
template <typename T>
__global__ void k_unproj_rows(int64_t B, int64_t P, int64_t t, const int32_t *__restrict__ len,
                              T *__restrict__ dh, const T *__restrict__ dout, int64_t dout_ld,
                              T *__restrict__ drs) {
    RL_CUDA_GRID_LOOP(e, B * P) {
        int64_t i = e / P;
        if (t >= (int64_t)len[i]) {
            drs[e] = T(0);
            continue;
        }
        drs[e] = dh[e] + (dout ? dout[i * dout_ld + e - i * P] : T(0));
        dh[e] = T(0);
    }
}

/* The projection's buffers typed (all NULL, P = H: none). */
template <typename T> struct Proj {
    int64_t P;
    const T *R;
    T *ms, *mscr, *drs, *dm, *dR;
};

template <typename T> Proj<T> proj_of(const rl_lstm_cuda_proj *p, int64_t H) {
    if (!p) return Proj<T>{H, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    return Proj<T>{p->P,        (const T *)p->R, (T *)p->ms, (T *)p->mscr,
                   (T *)p->drs, (T *)p->dm,      (T *)p->dR};
}

/* ---- layer_norm: kernels/lstm_ln_row.h per row ---- */

template <typename T> struct LnOf;
template <> struct LnOf<float> { typedef rl_lstm_ln_f32 type; };
template <> struct LnOf<double> { typedef rl_lstm_ln_f64 type; };

template <typename T>
__device__ __forceinline__ void ln_row_fwd(int64_t H, int64_t b, bool valid, T *z, const T *bias,
                                           const T *cp, const T *hp, T *c, T *h, T *out,
                                           const typename LnOf<T>::type *ln) {
    if constexpr (sizeof(T) == sizeof(float))
        rl_lstm_ln_row_fwd_f32(H, b, valid, z, bias, cp, hp, c, h, out, ln);
    else
        rl_lstm_ln_row_fwd_f64(H, b, valid, z, bias, cp, hp, c, h, out, ln);
}
template <typename T>
__device__ __forceinline__ void ln_row_bwd(int64_t H, int64_t b, bool valid, T *z, const T *cp,
                                           const T *c, const T *dout, T *dh, T *dc,
                                           const typename LnOf<T>::type *ln) {
    if constexpr (sizeof(T) == sizeof(float))
        rl_lstm_ln_row_bwd_f32(H, b, valid, z, cp, c, dout, dh, dc, ln);
    else
        rl_lstm_ln_row_bwd_f64(H, b, valid, z, cp, c, dout, dh, dc, ln);
}

template <typename T>
__global__ void k_ln_fwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len, T *z,
                         const T *bias, const T *cp, const T *hp, T *c, T *h, T *out,
                         typename LnOf<T>::type ln) {
    RL_CUDA_GRID_LOOP(b, B) {
        ln_row_fwd<T>(H, b, t < (int64_t)len[b], z, bias, cp, hp, c, h, out, &ln);
    }
}

template <typename T>
__global__ void k_ln_bwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len, T *z,
                         const T *cp, const T *c, const T *dout, int64_t dout_ld, T *dh, T *dc,
                         typename LnOf<T>::type ln) {
    RL_CUDA_GRID_LOOP(b, B) {
        ln_row_bwd<T>(H, b, t < (int64_t)len[b], z, cp, c, dout ? dout + b * dout_ld : nullptr, dh,
                      dc, &ln);
    }
}

/* db, dgx, dgh (4H) and dgc, dbc (H) += the sums over N rows (kernels/lstm.h's
 * rl_lstm_ln_cpu_param_grads): one thread per column, rows in order. */
template <typename T>
__global__ void k_ln_sums(int64_t N, int64_t H, typename LnOf<T>::type ln, T *db, T *dgx, T *dgh,
                          T *dgc, T *dbc) {
    RL_CUDA_GRID_LOOP(e, 5 * H) {
        T s0 = T(0), s1 = T(0), s2 = T(0);
        if (e < 4 * H) {
            for (int64_t r = 0; r < N; r++) {
                T d = ln.dg[r * 4 * H + e];
                s0 += d;
                s1 += d * ln.xh[r * 4 * H + e];
                s2 += d * ln.hh[r * 4 * H + e];
            }
            db[e] += s0;
            dgx[e] += s1;
            dgh[e] += s2;
        } else {
            int64_t j = e - 4 * H;
            for (int64_t r = 0; r < N; r++) {
                s0 += ln.du[r * H + j] * ln.cn[r * H + j];
                s1 += ln.du[r * H + j];
            }
            dgc[j] += s0;
            dbc[j] += s1;
        }
    }
}

/* The layer_norm buffers' rows of frame t, typed (frame 0: all frames). */
template <typename T>
typename LnOf<T>::type ln_frame(const rl_lstm_cuda_ln *p, int64_t t, int64_t B, int64_t H) {
    int64_t r = t * B;
    return {(T *)p->xh + r * 4 * H, (T *)p->hh + r * 4 * H,  (T *)p->cn + r * H, (T *)p->rs + r * 9,
            (T *)p->dg + r * 4 * H, (T *)p->dzh + r * 4 * H, (T *)p->du + r * H, (const T *)p->gx,
            (const T *)p->gh,       (const T *)p->gc,        (const T *)p->bc};
}

/* Zoneout's weights and c~ of frame t (all NULL without zoneout). */
template <typename T> Zo<T> zo_frame(const rl_cuda_rec_opts *o, int64_t t, int64_t BH) {
    if (!o || !o->ct) return Zo<T>{};
    return Zo<T>{o->zc ? (const T *)o->zc + t * BH : nullptr,
                 o->zh ? (const T *)o->zh + t * BH : nullptr, (T *)o->ct + t * BH};
}

template <typename T>
rl_status forward_loop(cudaStream_t s, rl_dtype dt, int64_t T_, int64_t B, int64_t H, int dir,
                       const int32_t *len, T *gates, const T *U, const T *bias,
                       const T *const *peep, T *hs, T *cs, T *out, const Proj<T> &pj,
                       const rl_lstm_cuda_ln *ln, const rl_cuda_rec_opts *o) {
    const char *fn = "rl_lstm_cuda_forward";
    int64_t BH = B * H, P = pj.P, BP = B * P;
    T *ms = pj.R ? pj.ms : hs; /* the cell's state 0 */
    for (int64_t st = 0; st < T_; st++) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *zt = gates + t * B * 4 * H, *cellout = pj.R ? pj.mscr : out + t * BH;
        typename LnOf<T>::type lt = ln ? ln_frame<T>(ln, t, B, H) : typename LnOf<T>::type{};
        /* with layer_norm the product is the recurrent part, normalised apart; with rec_dropout
         * it reads the dropped state */
        const void *x;
        RL_TRY(rl_cuda_rec_operand(s, dt, o, t, B, P, hs + prev * BP, &x));
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, B, 4 * H, P, 1.0, x, P, 0, U, 4 * H, 0,
                                    ln ? 0.0 : 1.0, ln ? lt.hh : zt, 4 * H, 0, 1));
        if (ln) {
            k_ln_fwd<T><<<rl_cuda_blocks_for(B), RL_CUDA_THREADS, 0, s>>>(
                B, H, t, len, zt, bias, cs + prev * BH, ms + prev * BH, cs + cur * BH,
                ms + cur * BH, cellout, lt);
            RL_TRY(rl_cuda_launched("%s: launching k_ln_fwd (B=%lld H=%lld t=%lld)", fn,
                                    (long long)B, (long long)H, (long long)t));
        } else {
            RL_TRY(fwd_step<T>(fn, s, B, H, t, len, zt, bias, peep, cs + prev * BH, ms + prev * BH,
                               cs + cur * BH, ms + cur * BH, cellout, zo_frame<T>(o, t, BH)));
        }
        if (!pj.R) continue;
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, B, P, H, 1.0, ms + cur * BH, H, 0,
                                    pj.R, P, 0, 0.0, hs + cur * BP, P, 0, 1));
        k_proj_rows<T><<<rl_cuda_blocks_for(BP), RL_CUDA_THREADS, 0, s>>>(
            B, P, t, len, hs + prev * BP, hs + cur * BP, out + t * BP);
        RL_TRY(rl_cuda_launched("%s: launching k_proj_rows (B=%lld P=%lld t=%lld)", fn,
                                (long long)B, (long long)P, (long long)t));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(cudaStream_t s, rl_dtype dt, int64_t T_, int64_t B, int64_t H, int dir,
                        const int32_t *len, T *gates, const T *U, const T *const *peep, const T *hs,
                        const T *cs, const T *dout, int64_t dout_ld, T *dh, T *dc, T *dU, T *db,
                        T *const *dpeep, T *partial, const Proj<T> &pj, const rl_lstm_cuda_ln *ln,
                        const rl_cuda_rec_opts *o) {
    const char *fn = "rl_lstm_cuda_backward";
    int64_t BH = B * H, P = pj.P, BP = B * P;
    for (int64_t st = T_ - 1; st >= 0; st--) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *zt = gates + t * B * 4 * H, *dcell = dh;
        const T *dot = dout ? dout + t * B * dout_ld : nullptr;
        if (pj.R) { /* the cell kernel sees dLoss/dm */
            k_unproj_rows<T><<<rl_cuda_blocks_for(BP), RL_CUDA_THREADS, 0, s>>>(
                B, P, t, len, dh, dot, dout_ld, pj.drs + t * BP);
            RL_TRY(rl_cuda_launched("%s: launching k_unproj_rows (B=%lld P=%lld t=%lld)", fn,
                                    (long long)B, (long long)P, (long long)t));
            RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, true, B, H, P, 1.0, pj.drs + t * BP, P, 0,
                                        pj.R, P, 0, 0.0, pj.dm, H, 0, 1));
            dcell = pj.dm;
            dot = nullptr;
        }
        typename LnOf<T>::type lt = ln ? ln_frame<T>(ln, t, B, H) : typename LnOf<T>::type{};
        if (ln) {
            k_ln_bwd<T><<<rl_cuda_blocks_for(B), RL_CUDA_THREADS, 0, s>>>(
                B, H, t, len, zt, cs + prev * BH, cs + cur * BH, dot, dout_ld, dcell, dc, lt);
            RL_TRY(rl_cuda_launched("%s: launching k_ln_bwd (B=%lld H=%lld t=%lld)", fn,
                                    (long long)B, (long long)H, (long long)t));
        } else {
            RL_TRY(bwd_step<T>(fn, s, B, H, t, len, zt, peep, cs + prev * BH, cs + cur * BH, dot,
                               dout_ld, dcell, dc, nullptr, nullptr, zo_frame<T>(o, t, BH)));
        }
        /* padded rows of dz_t are 0, so their dh passes through unchanged; with layer_norm the
         * product reads the recurrent part's gradients; with rec_dropout it goes through the
         * mask */
        void *dprod;
        double beta;
        rl_cuda_rec_product_dst(o, dh, &dprod, &beta);
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, true, B, P, 4 * H, 1.0, ln ? lt.dzh : zt,
                                    4 * H, 0, U, 4 * H, 0, beta, dprod, P, 0, 1));
        RL_TRY(rl_cuda_rec_unmask(s, dt, o, B, P, dh));
    }
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1) */
    const T *hprev = hs + (dir > 0 ? 0 : BP), *cprev = cs + (dir > 0 ? 0 : BH);
    /* p_o's gradient pairs dz_o with c~ under zoneout */
    const T *ccur = o && o->ct ? (const T *)o->ct : cs + (dir > 0 ? BH : 0);
    hprev = (const T *)rl_cuda_rec_dU_operand(o, hprev);
    RL_TRY(rl_cuda_gemm_batched(fn, s, dt, true, false, P, 4 * H, T_ * B, 1.0, hprev, P, 0,
                                ln ? (const T *)ln->dzh : gates, 4 * H, 0, 1.0, dU, 4 * H, 0, 1));
    if (pj.R) /* each frame's m (rows cur) against its dLoss/dh */
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, true, false, H, P, T_ * B, 1.0,
                                    pj.ms + (dir > 0 ? BH : 0), H, 0, pj.drs, P, 0, 1.0, pj.dR, P,
                                    0, 1));
    if (!ln) return param_grads<T>(s, T_ * B, H, gates, cprev, ccur, partial, db, dpeep);
    k_ln_sums<T><<<rl_cuda_blocks_for(5 * H), RL_CUDA_THREADS, 0, s>>>(
        T_ * B, H, ln_frame<T>(ln, 0, B, H), db, (T *)ln->dgx, (T *)ln->dgh, (T *)ln->dgc,
        (T *)ln->dbc);
    return rl_cuda_launched("%s: launching k_ln_sums (N=%lld H=%lld)", fn, (long long)(T_ * B),
                            (long long)H);
}

} // namespace

/* ---- the C API ---- */

/* The projection's buffers a forward (or backward) needs, and 1 <= P. */
static rl_status check_proj(const char *fn, const rl_lstm_cuda_proj *p, bool backward, int64_t T,
                            int64_t B, int64_t H) {
    if (!p) return RL_OK;
    if (p->P < 1 || !p->R || !p->ms || (!backward && !p->mscr) ||
        (backward && (!p->drs || !p->dm || !p->dR)))
        return rl_error(RL_EARG,
                        "%s: n_proj needs P >= 1, R, ms and %s (T=%lld B=%lld H=%lld P=%lld)", fn,
                        backward ? "drs, dm, dR" : "mscr", (long long)T, (long long)B, (long long)H,
                        (long long)p->P);
    return RL_OK;
}

/* layer_norm's buffers a forward (or backward) needs; not with peepholes. */
static rl_status check_ln(const char *fn, const rl_lstm_cuda_ln *p, bool peep, bool backward,
                          int64_t T, int64_t B, int64_t H) {
    if (!p) return RL_OK;
    bool fwd_ok = p->xh && p->hh && p->cn && p->rs && p->gx && p->gh && p->gc && p->bc;
    bool bwd_ok = p->dg && p->dzh && p->du && p->dgx && p->dgh && p->dgc && p->dbc;
    if (peep || !fwd_ok || (backward && !bwd_ok))
        return rl_error(RL_EARG,
                        "%s: layer_norm needs its buffers and gains%s and takes no peepholes "
                        "(T=%lld B=%lld H=%lld)",
                        fn, backward ? ", their gradients" : "", (long long)T, (long long)B,
                        (long long)H);
    return RL_OK;
}

extern "C" rl_status rl_lstm_cuda_fwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, float *z, const float *bias,
                                          const float *const *peep, const float *cp,
                                          const float *hp, float *c, float *h, float *out) {
    const char *fn = "rl_lstm_cuda_fwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    return fwd_step<float>(fn, rl_cuda_stream(stream), B, H, t, len, z, bias, peep, cp, hp, c, h,
                           out);
}

extern "C" rl_status rl_lstm_cuda_fwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, double *z, const double *bias,
                                          const double *const *peep, const double *cp,
                                          const double *hp, double *c, double *h, double *out) {
    const char *fn = "rl_lstm_cuda_fwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    return fwd_step<double>(fn, rl_cuda_stream(stream), B, H, t, len, z, bias, peep, cp, hp, c, h,
                            out);
}

extern "C" rl_status rl_lstm_cuda_bwd_f32(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, float *z, const float *const *peep,
                                          const float *cp, const float *c, const float *dout,
                                          int64_t dout_ld, float *dh, float *dc, float *db,
                                          float *const *dpeep) {
    const char *fn = "rl_lstm_cuda_bwd_f32";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    return bwd_step<float>(fn, rl_cuda_stream(stream), B, H, t, len, z, peep, cp, c, dout, dout_ld,
                           dh, dc, db, dpeep);
}

extern "C" rl_status rl_lstm_cuda_bwd_f64(void *stream, int64_t B, int64_t H, int64_t t,
                                          const int32_t *len, double *z, const double *const *peep,
                                          const double *cp, const double *c, const double *dout,
                                          int64_t dout_ld, double *dh, double *dc, double *db,
                                          double *const *dpeep) {
    const char *fn = "rl_lstm_cuda_bwd_f64";
    if (B <= 0 || H <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, z));
    return bwd_step<double>(fn, rl_cuda_stream(stream), B, H, t, len, z, peep, cp, c, dout, dout_ld,
                            dh, dc, db, dpeep);
}

extern "C" rl_status rl_lstm_cuda_param_grads(void *stream, rl_dtype dt, int64_t N, int64_t H,
                                              const void *dz, const void *cprev, const void *cur,
                                              void *partial, void *db, void *const *dpeep) {
    const char *fn = "rl_lstm_cuda_param_grads";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (N <= 0 || H <= 0) return RL_OK;
    if (dpeep && (!cprev || !cur))
        return rl_error(RL_EARG, "%s: peephole gradients need the cell states (N=%lld H=%lld)", fn,
                        (long long)N, (long long)H);
    if (!db || !partial)
        return rl_error(RL_EARG,
                        "%s: db and the partial sums' scratch must be given (N=%lld H=%lld)", fn,
                        (long long)N, (long long)H);
    RL_TRY(rl_cuda_enter(fn, db));
    if (dt == RL_FLOAT32)
        return param_grads<float>(rl_cuda_stream(stream), N, H, (const float *)dz,
                                  (const float *)cprev, (const float *)cur, (float *)partial,
                                  (float *)db, (float *const *)dpeep);
    return param_grads<double>(rl_cuda_stream(stream), N, H, (const double *)dz,
                               (const double *)cprev, (const double *)cur, (double *)partial,
                               (double *)db, (double *const *)dpeep);
}

extern "C" rl_status rl_lstm_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                          int64_t H, int direction, const int32_t *len, void *gates,
                                          const void *U, const void *bias, const void *const *peep,
                                          void *hs, void *cs, void *out,
                                          const rl_lstm_cuda_proj *proj, const rl_lstm_cuda_ln *ln,
                                          const rl_cuda_rec_opts *o) {
    const char *fn = "rl_lstm_cuda_forward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    RL_TRY(check_proj(fn, proj, false, T, B, H));
    RL_TRY(check_ln(fn, ln, peep != NULL, false, T, B, H));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, gates));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        return forward_loop<float>(s, dt, T, B, H, direction, len, (float *)gates, (const float *)U,
                                   (const float *)bias, (const float *const *)peep, (float *)hs,
                                   (float *)cs, (float *)out, proj_of<float>(proj, H), ln, o);
    return forward_loop<double>(s, dt, T, B, H, direction, len, (double *)gates, (const double *)U,
                                (const double *)bias, (const double *const *)peep, (double *)hs,
                                (double *)cs, (double *)out, proj_of<double>(proj, H), ln, o);
}

extern "C" rl_status rl_lstm_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                           int64_t H, int direction, const int32_t *len,
                                           void *gates, const void *U, const void *const *peep,
                                           const void *hs, const void *cs, const void *dout,
                                           int64_t dout_ld, void *dh, void *dc, void *dU, void *db,
                                           void *const *dpeep, void *partial,
                                           const rl_lstm_cuda_proj *proj, const rl_lstm_cuda_ln *ln,
                                           const rl_cuda_rec_opts *o) {
    const char *fn = "rl_lstm_cuda_backward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    RL_TRY(check_proj(fn, proj, true, T, B, H));
    RL_TRY(check_ln(fn, ln, peep != NULL, true, T, B, H));
    if (T == 0 || B == 0) return RL_OK;
    if (!dU || !db || !partial || (peep && !dpeep))
        return rl_error(RL_EARG,
                        "%s: dU, db, the partial sums' scratch%s must be given (T=%lld "
                        "B=%lld H=%lld)",
                        fn, peep ? " and the peephole gradients" : "", (long long)T, (long long)B,
                        (long long)H);
    RL_TRY(rl_cuda_enter(fn, gates));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        return backward_loop<float>(s, dt, T, B, H, direction, len, (float *)gates,
                                    (const float *)U, (const float *const *)peep, (const float *)hs,
                                    (const float *)cs, (const float *)dout, dout_ld, (float *)dh,
                                    (float *)dc, (float *)dU, (float *)db,
                                    peep ? (float *const *)dpeep : nullptr, (float *)partial,
                                    proj_of<float>(proj, H), ln, o);
    return backward_loop<double>(s, dt, T, B, H, direction, len, (double *)gates, (const double *)U,
                                 (const double *const *)peep, (const double *)hs,
                                 (const double *)cs, (const double *)dout, dout_ld, (double *)dh,
                                 (double *)dc, (double *)dU, (double *)db,
                                 peep ? (double *const *)dpeep : nullptr, (double *)partial,
                                 proj_of<double>(proj, H), ln, o);
}
