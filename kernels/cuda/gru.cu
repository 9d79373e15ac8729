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
 * The bias gradients are a two-stage column sum of dG over all frames after the loop (launch.h's
 * rl_cuda_k_colsum_partial over up to RL_GRU_CUDA_CHUNKS row chunks, so a full grid of blocks
 * however small H is, then k_bias_final adds the chunks in order: deterministic, no atomics),
 * dU one GEMM over all frames.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../gru_cell.h"
#include "../gru_ln_row.h"
#include "gru_cuda.h"
}
#include "launch.h"

namespace {

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
                      const T *__restrict__ hp, T *__restrict__ h, T *__restrict__ out,
                      const T *__restrict__ mh) {
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
        if (mh) hh = rl_cuda_zoneout(mh[e], hp[e], hh);
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
                      int64_t dout_ld, T *__restrict__ dh, const T *__restrict__ mh) {
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
        /* with zoneout the cell sees (1 - m) of the state's gradient */
        cell_bwd(gr[0], gr[H], gr[3 * H], gr[2 * H], hp[e], mh ? rl_cuda_zoneout_new(mh[e], d) : d,
                 &dar, &daz, &dan, &dhn, &dhp);
        gr[0] = dar;
        gr[H] = daz;
        gr[2 * H] = dhn;
        gr[3 * H] = dan;
        dh[e] = mh ? dhp + rl_cuda_zoneout_prev(mh[e], d) : dhp;
    }
}

/* Stage 2 of the bias sums: partial (chunks, 4H) holds each row chunk's column sums of dG's
 * blocks [dar | daz | dhn | dan]; per column j the chunks are added in chunk order. */
template <typename T>
__global__ void k_bias_final(int64_t H, int64_t chunks, const T *__restrict__ partial,
                             T *__restrict__ db, T *__restrict__ dbh) {
    RL_CUDA_GRID_LOOP(j, H) {
        T s[4] = {T(0), T(0), T(0), T(0)};
        for (int64_t c = 0; c < chunks; c++)
            for (int k = 0; k < 4; k++)
                s[k] += partial[(c * 4 + k) * H + j];
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
                   const int32_t *len, T *g, const T *b, const T *bh, const T *hp, T *h, T *out,
                   const T *mh = nullptr) {
    if (B <= 0 || H <= 0) return RL_OK;
    k_fwd<T><<<rl_cuda_blocks_for(B * H), RL_CUDA_THREADS, 0, s>>>(B, H, t, len, g, b, bh, hp, h,
                                                                   out, mh);
    return rl_cuda_launched("%s: launching k_fwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status bwd_step(const char *fn, cudaStream_t s, int64_t B, int64_t H, int64_t t,
                   const int32_t *len, T *g, const T *hp, const T *dout, int64_t dout_ld, T *dh,
                   const T *mh = nullptr) {
    if (B <= 0 || H <= 0) return RL_OK;
    k_bwd<T><<<rl_cuda_blocks_for(B * H), RL_CUDA_THREADS, 0, s>>>(B, H, t, len, g, hp, dout,
                                                                   dout_ld, dh, mh);
    return rl_cuda_launched("%s: launching k_bwd (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

template <typename T>
rl_status bias_grads(cudaStream_t s, int64_t N, int64_t H, const T *dg, T *partial, T *db, T *dbh) {
    if (N <= 0 || H <= 0) return RL_OK;
    int64_t chunk_rows, chunks = rl_cuda_colsum_chunks(N, RL_GRU_CUDA_CHUNKS, &chunk_rows);
    dim3 block(RL_CUDA_COLSUM_COLS, RL_CUDA_COLSUM_ROWS),
        grid((unsigned)((4 * H + RL_CUDA_COLSUM_COLS - 1) / RL_CUDA_COLSUM_COLS), (unsigned)chunks);
    rl_cuda_k_colsum_partial<T><<<grid, block, 0, s>>>(N, 4 * H, chunk_rows, dg, partial);
    RL_TRY(rl_cuda_launched(
        "rl_gru_cuda_bias_grads: launching rl_cuda_k_colsum_partial (N=%lld H=%lld)", (long long)N,
        (long long)H));
    k_bias_final<T><<<rl_cuda_blocks_for(H), RL_CUDA_THREADS, 0, s>>>(H, chunks, partial, db, dbh);
    return rl_cuda_launched("rl_gru_cuda_bias_grads: launching k_bias_final (N=%lld H=%lld)",
                            (long long)N, (long long)H);
}

/* ---- layer_norm: kernels/gru_ln_row.h per row ---- */

template <typename T> struct LnOf;
template <> struct LnOf<float> { typedef rl_gru_ln_f32 type; };
template <> struct LnOf<double> { typedef rl_gru_ln_f64 type; };

template <typename T>
__device__ __forceinline__ void ln_row(bool backward, int64_t H, int64_t b, bool valid, T *g,
                                       const typename LnOf<T>::type *ln) {
    if constexpr (sizeof(T) == sizeof(float)) {
        if (backward)
            rl_gru_ln_row_bwd_f32(H, b, valid, g, ln);
        else
            rl_gru_ln_row_fwd_f32(H, b, valid, g, ln);
    } else {
        if (backward)
            rl_gru_ln_row_bwd_f64(H, b, valid, g, ln);
        else
            rl_gru_ln_row_fwd_f64(H, b, valid, g, ln);
    }
}

template <typename T>
__global__ void k_ln_rows(bool backward, int64_t B, int64_t H, int64_t t,
                          const int32_t *__restrict__ len, T *g, typename LnOf<T>::type ln) {
    RL_CUDA_GRID_LOOP(b, B) { ln_row<T>(backward, H, b, t < (int64_t)len[b], g, &ln); }
}

/* db, dbh, dgx, dgh (3H) += the sums over N rows (rl_gru_ln_cpu_param_grads's): one thread per
 * column k of the blocks r, z, n, rows in order; g's input-side block of k is dg's 0, 1, 3 and its
 * recurrent-side one dg's 0, 1, 2. */
template <typename T>
__global__ void k_ln_sums(int64_t N, int64_t H, typename LnOf<T>::type ln, T *db, T *dbh, T *dgx,
                          T *dgh) {
    RL_CUDA_GRID_LOOP(e, 3 * H) {
        /* k = 0: the input side (dg's column of e, xh, db, dgx), 1: the recurrent side */
        int64_t col[2] = {e < 2 * H ? e : e + H, e};
        const T *nrm[2] = {ln.xh, ln.hh};
        T *bias[2] = {db, dbh}, *gain[2] = {dgx, dgh};
        for (int k = 0; k < 2; k++) {
            T sb = T(0), sg = T(0);
            for (int64_t r = 0; r < N; r++) {
                sb += ln.dg[r * 4 * H + col[k]];
                sg += ln.dg[r * 4 * H + col[k]] * nrm[k][r * 3 * H + e];
            }
            bias[k][e] += sb;
            gain[k][e] += sg;
        }
    }
}

/* The layer_norm buffers' rows of frame t, typed (frame 0: all frames). */
template <typename T>
typename LnOf<T>::type ln_frame(const rl_gru_cuda_ln *p, int64_t t, int64_t B, int64_t H) {
    int64_t r = t * B;
    return {(T *)p->xh + r * 3 * H, (T *)p->hh + r * 3 * H,  (T *)p->rs + r * 6,
            (T *)p->dg + r * 4 * H, (T *)p->dzh + r * 3 * H, (const T *)p->gx,
            (const T *)p->gh};
}

template <typename T>
rl_status ln_step(const char *fn, cudaStream_t s, bool backward, int64_t B, int64_t H, int64_t t,
                  const int32_t *len, T *g, const rl_gru_cuda_ln *ln) {
    k_ln_rows<T><<<rl_cuda_blocks_for(B), RL_CUDA_THREADS, 0, s>>>(backward, B, H, t, len, g,
                                                                   ln_frame<T>(ln, t, B, H));
    return rl_cuda_launched("%s: launching k_ln_rows (B=%lld H=%lld t=%lld)", fn, (long long)B,
                            (long long)H, (long long)t);
}

/* Zoneout's weights of frame t, or NULL. */
template <typename T> const T *zo_frame(const rl_cuda_rec_opts *o, int64_t t, int64_t BH) {
    return o && o->zh ? (const T *)o->zh + t * BH : nullptr;
}

template <typename T>
rl_status forward_loop(void *stream, int64_t T_, int64_t B, int64_t H, int dir, const int32_t *len,
                       T *gates, const T *U, const T *b, const T *bh, T *hs, T *out,
                       const rl_gru_cuda_ln *ln, const rl_cuda_rec_opts *o) {
    const char *fn = "rl_gru_cuda_forward";
    cudaStream_t s = rl_cuda_stream(stream);
    rl_dtype dt = dtype_of(T(0));
    int64_t BH = B * H;
    /* the hn block receives the recurrent product alone (with layer_norm: its normalised part) */
    cudaError_t e = ln ? cudaSuccess
                       : cudaMemset2DAsync(gates + 2 * H, (size_t)(4 * H) * sizeof(T), 0,
                                           (size_t)H * sizeof(T), (size_t)(T_ * B), s);
    if (e != cudaSuccess)
        return rl_cuda_fail(e, "%s: cudaMemset2DAsync (T=%lld B=%lld H=%lld)", fn, (long long)T_,
                            (long long)B, (long long)H);
    for (int64_t st = 0; st < T_; st++) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1, cur = dir > 0 ? t + 1 : t;
        T *gt = gates + t * B * 4 * H;
        const void *x; /* with rec_dropout the dropped state */
        RL_TRY(rl_cuda_rec_operand(s, dt, o, t, B, H, hs + prev * BH, &x));
        if (ln) { /* the recurrent part apart, then both parts normalised into gt */
            RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, B, 3 * H, H, 1.0, x, H, 0, U,
                                        3 * H, 0, 0.0, ln_frame<T>(ln, t, B, H).hh, 3 * H, 0, 1));
            RL_TRY(ln_step<T>(fn, s, false, B, H, t, len, gt, ln));
        } else {
            RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, false, B, 3 * H, H, 1.0, x, H, 0, U,
                                        3 * H, 0, 1.0, gt, 4 * H, 0, 1));
        }
        RL_TRY(fwd_step<T>(fn, s, B, H, t, len, gt, b, bh, hs + prev * BH, hs + cur * BH,
                           out + t * BH, zo_frame<T>(o, t, BH)));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(void *stream, int64_t T_, int64_t B, int64_t H, int dir, const int32_t *len,
                        T *gates, const T *U, const T *hs, const T *dout, int64_t dout_ld, T *dh,
                        T *dU, T *db, T *dbh, T *partial, const rl_gru_cuda_ln *ln,
                        const rl_cuda_rec_opts *o) {
    const char *fn = "rl_gru_cuda_backward";
    cudaStream_t s = rl_cuda_stream(stream);
    rl_dtype dt = dtype_of(T(0));
    int64_t BH = B * H;
    for (int64_t st = T_ - 1; st >= 0; st--) {
        int64_t t = dir > 0 ? st : T_ - 1 - st;
        int64_t prev = dir > 0 ? t : t + 1;
        T *gt = gates + t * B * 4 * H;
        RL_TRY(bwd_step<T>(fn, s, B, H, t, len, gt, hs + prev * BH,
                           dout ? dout + t * B * dout_ld : nullptr, dout_ld, dh,
                           zo_frame<T>(o, t, BH)));
        /* padded rows of dG_t are 0, so their dh passes through unchanged; with layer_norm the
         * product reads the recurrent part's gradients; with rec_dropout it goes through the
         * mask */
        if (ln) RL_TRY(ln_step<T>(fn, s, true, B, H, t, len, gt, ln));
        void *dprod;
        double beta;
        rl_cuda_rec_product_dst(o, dh, &dprod, &beta);
        RL_TRY(rl_cuda_gemm_batched(fn, s, dt, false, true, B, H, 3 * H, 1.0,
                                    ln ? ln_frame<T>(ln, t, B, H).dzh : gt, ln ? 3 * H : 4 * H, 0,
                                    U, 3 * H, 0, beta, dprod, H, 0, 1));
        RL_TRY(rl_cuda_rec_unmask(s, dt, o, B, H, dh));
    }
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1), or with
     * rec_dropout what the products read */
    const T *hprev = (const T *)rl_cuda_rec_dU_operand(o, hs + (dir > 0 ? 0 : BH));
    RL_TRY(rl_cuda_gemm_batched(fn, s, dt, true, false, H, 3 * H, T_ * B, 1.0, hprev, H, 0,
                                ln ? (const T *)ln->dzh : gates, ln ? 3 * H : 4 * H, 0, 1.0, dU,
                                3 * H, 0, 1));
    if (!ln) return bias_grads<T>(s, T_ * B, H, gates, partial, db, dbh);
    k_ln_sums<T><<<rl_cuda_blocks_for(3 * H), RL_CUDA_THREADS, 0, s>>>(
        T_ * B, H, ln_frame<T>(ln, 0, B, H), db, dbh, (T *)ln->dgx, (T *)ln->dgh);
    return rl_cuda_launched("%s: launching k_ln_sums (N=%lld H=%lld)", fn, (long long)(T_ * B),
                            (long long)H);
}

} // namespace

/* ---- the C API ---- */

/* layer_norm's buffers a forward (or backward) needs. */
static rl_status check_ln(const char *fn, const rl_gru_cuda_ln *p, bool backward, int64_t T,
                          int64_t B, int64_t H) {
    if (!p) return RL_OK;
    if (!p->xh || !p->hh || !p->rs || !p->gx || !p->gh ||
        (backward && (!p->dg || !p->dzh || !p->dgx || !p->dgh)))
        return rl_error(
            RL_EARG, "%s: layer_norm needs its buffers and gains%s (T=%lld B=%lld H=%lld)", fn,
            backward ? ", their gradients" : "", (long long)T, (long long)B, (long long)H);
    return RL_OK;
}

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
                                            const void *dg, void *partial, void *db, void *dbh) {
    const char *fn = "rl_gru_cuda_bias_grads";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (N <= 0 || H <= 0) return RL_OK;
    if (!db || !dbh || !partial)
        return rl_error(RL_EARG,
                        "%s: db, dbh and the partial sums' scratch must be given (N=%lld H=%lld)",
                        fn, (long long)N, (long long)H);
    RL_TRY(rl_cuda_enter(fn, dg));
    if (dt == RL_FLOAT32)
        return bias_grads<float>(rl_cuda_stream(stream), N, H, (const float *)dg, (float *)partial,
                                 (float *)db, (float *)dbh);
    return bias_grads<double>(rl_cuda_stream(stream), N, H, (const double *)dg, (double *)partial,
                              (double *)db, (double *)dbh);
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
                                         void *out, const rl_gru_cuda_ln *ln,
                                         const rl_cuda_rec_opts *o) {
    const char *fn = "rl_gru_cuda_forward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    RL_TRY(check_ln(fn, ln, false, T, B, H));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return forward_loop<float>(stream, T, B, H, direction, len, (float *)gates,
                                   (const float *)U, (const float *)b, (const float *)bh,
                                   (float *)hs, (float *)out, ln, o);
    return forward_loop<double>(stream, T, B, H, direction, len, (double *)gates, (const double *)U,
                                (const double *)b, (const double *)bh, (double *)hs, (double *)out,
                                ln, o);
}

extern "C" rl_status rl_gru_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                          int64_t H, int direction, const int32_t *len, void *gates,
                                          const void *U, const void *hs, const void *dout,
                                          int64_t dout_ld, void *dh, void *dU, void *db, void *dbh,
                                          void *partial, const rl_gru_cuda_ln *ln,
                                          const rl_cuda_rec_opts *o) {
    const char *fn = "rl_gru_cuda_backward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    RL_TRY(check_ln(fn, ln, true, T, B, H));
    if (T == 0 || B == 0) return RL_OK;
    if (!dU || !db || !dbh || !partial)
        return rl_error(RL_EARG,
                        "%s: dU, db, dbh and the partial sums' scratch must be given (T=%lld "
                        "B=%lld H=%lld)",
                        fn, (long long)T, (long long)B, (long long)H);
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return backward_loop<float>(stream, T, B, H, direction, len, (float *)gates,
                                    (const float *)U, (const float *)hs, (const float *)dout,
                                    dout_ld, (float *)dh, (float *)dU, (float *)db, (float *)dbh,
                                    (float *)partial, ln, o);
    return backward_loop<double>(stream, T, B, H, direction, len, (double *)gates,
                                 (const double *)U, (const double *)hs, (const double *)dout,
                                 dout_ld, (double *)dh, (double *)dU, (double *)db, (double *)dbh,
                                 (double *)partial, ln, o);
}
