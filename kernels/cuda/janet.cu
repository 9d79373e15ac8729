/* The janet cell's CUDA kernels and launchers (API and layout: kernels/cuda/janet_cuda.h).
 *
 * The cell math is kernels/janet_cell.h, the functions the CPU loops call. Per step one cuBLAS
 * GEMM (h_prev U into the step's [s | a] blocks, through the CUDA context's per-stream handle)
 * and one fused pointwise kernel, one thread per (b, j); padded rows copy the previous state and
 * write 0 out (forward), zero their dG and leave dh as it is (backward). db is a two-stage column
 * sum of dG over all frames (launch.h), dU one GEMM over all frames.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../janet_cell.h"
#include "janet_cuda.h"
}
#include "launch.h"

namespace {

/* The cell of kernels/janet_cell.h for either type. */
template <typename T>
__device__ __forceinline__ void cell_fwd(T s, T a, T hp, T beta, T *f, T *c, T *i, T *h) {
    if constexpr (sizeof(T) == sizeof(float))
        rl_janet_cell_fwd_f32(s, a, hp, beta, f, c, i, h);
    else
        rl_janet_cell_fwd_f64(s, a, hp, beta, f, c, i, h);
}
template <typename T>
__device__ __forceinline__ void cell_bwd(T f, T c, T i, T hp, T dh, T *ds, T *da, T *dhp) {
    if constexpr (sizeof(T) == sizeof(float))
        rl_janet_cell_bwd_f32(f, c, i, hp, dh, ds, da, dhp);
    else
        rl_janet_cell_bwd_f64(f, c, i, hp, dh, ds, da, dhp);
}

template <typename T>
__global__ void k_step_fwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                           T *__restrict__ g, const T *__restrict__ b, T beta,
                           const T *__restrict__ hp, T *__restrict__ h, T *__restrict__ out,
                           const T *__restrict__ mh) {
    RL_CUDA_GRID_LOOP(e, B * H) {
        int64_t r = e / H, j = e - r * H;
        bool valid = t < (int64_t)len[r];
        T *gr = g + r * 3 * H + j, hh = hp[e]; /* a padded row carries the state */
        if (valid)
            cell_fwd<T>(gr[0] + b[j], gr[H] + b[H + j], hp[e], beta, gr, gr + H, gr + 2 * H, &hh);
        if (valid && mh) hh = rl_cuda_zoneout(mh[e], hp[e], hh);
        h[e] = hh;
        out[e] = valid ? hh : T(0);
    }
}

template <typename T>
__global__ void k_step_bwd(int64_t B, int64_t H, int64_t t, const int32_t *__restrict__ len,
                           T *__restrict__ g, const T *__restrict__ hp, const T *__restrict__ dout,
                           int64_t dout_ld, T *__restrict__ dh, const T *__restrict__ mh) {
    RL_CUDA_GRID_LOOP(e, B * H) {
        int64_t r = e / H, j = e - r * H;
        T *gr = g + r * 3 * H + j;
        if (t >= (int64_t)len[r]) {
            gr[0] = gr[H] = gr[2 * H] = T(0);
            continue;
        }
        /* the cell reads its inputs before it writes [ds | da] over them; with zoneout it sees
         * (1 - m) of the state's gradient */
        T d = dh[e] + (dout ? dout[r * dout_ld + j] : T(0)), dhp;
        cell_bwd<T>(gr[0], gr[H], gr[2 * H], hp[e], mh ? rl_cuda_zoneout_new(mh[e], d) : d, gr,
                    gr + H, &dhp);
        dh[e] = mh ? rl_cuda_zoneout_prev(mh[e], d) + dhp : dhp;
        gr[2 * H] = T(0);
    }
}

/* Stage 2 of db: partial (chunks, 3H) holds each row chunk's column sums of dG; the chunks of a
 * column of [ds | da] are added in chunk order. */
template <typename T>
__global__ void k_db_final(int64_t H, int64_t chunks, const T *__restrict__ partial,
                           T *__restrict__ db) {
    RL_CUDA_GRID_LOOP(j, 2 * H) {
        T s = T(0);
        for (int64_t c = 0; c < chunks; c++)
            s += partial[c * 3 * H + j];
        db[j] += s;
    }
}

/* The operands of one direction's recurrence, typed. */
template <typename T> struct pass_args {
    cudaStream_t s;
    int64_t T_, B, H;
    int dir;
    const int32_t *len;
    T *gates;
    const T *U;
    T *hs;
    const rl_cuda_rec_opts *o;
};

/* Zoneout's weights of frame t, or NULL. */
template <typename T> const T *zo_frame(const pass_args<T> &a, int64_t t) {
    return a.o && a.o->zh ? (const T *)a.o->zh + t * a.B * a.H : nullptr;
}

template <typename T> int64_t step_frame(const pass_args<T> &a, int64_t st) {
    return a.dir > 0 ? st : a.T_ - 1 - st;
}

template <typename T>
rl_status forward_loop(const char *fn, const pass_args<T> &a, const T *b, T beta, T *out) {
    rl_dtype dt = sizeof(T) == 4 ? RL_FLOAT32 : RL_FLOAT64;
    int64_t BH = a.B * a.H;
    for (int64_t st = 0; st < a.T_; st++) {
        int64_t t = step_frame(a, st), prev = a.dir > 0 ? t : t + 1, cur = a.dir > 0 ? t + 1 : t;
        T *gt = a.gates + t * a.B * 3 * a.H;
        const void *x; /* with rec_dropout the dropped state */
        RL_TRY(rl_cuda_rec_operand(a.s, dt, a.o, t, a.B, a.H, a.hs + prev * BH, &x));
        RL_TRY(rl_cuda_gemm_batched(fn, a.s, dt, false, false, a.B, 2 * a.H, a.H, 1.0, x, a.H, 0,
                                    a.U, 2 * a.H, 0, 1.0, gt, 3 * a.H, 0, 1));
        k_step_fwd<T><<<rl_cuda_blocks_for(BH), RL_CUDA_THREADS, 0, a.s>>>(
            a.B, a.H, t, a.len, gt, b, beta, a.hs + prev * BH, a.hs + cur * BH, out + t * BH,
            zo_frame(a, t));
        RL_TRY(rl_cuda_launched("%s: launching k_step_fwd (B=%lld H=%lld t=%lld)", fn,
                                (long long)a.B, (long long)a.H, (long long)t));
    }
    return RL_OK;
}

template <typename T>
rl_status backward_loop(const char *fn, const pass_args<T> &a, const T *dout, int64_t dout_ld,
                        T *dh, T *dU, T *db, T *partial) {
    rl_dtype dt = sizeof(T) == 4 ? RL_FLOAT32 : RL_FLOAT64;
    int64_t BH = a.B * a.H, H = a.H;
    for (int64_t st = a.T_ - 1; st >= 0; st--) {
        int64_t t = step_frame(a, st), prev = a.dir > 0 ? t : t + 1;
        T *gt = a.gates + t * a.B * 3 * H;
        k_step_bwd<T><<<rl_cuda_blocks_for(BH), RL_CUDA_THREADS, 0, a.s>>>(
            a.B, H, t, a.len, gt, a.hs + prev * BH, dout ? dout + t * a.B * dout_ld : nullptr,
            dout_ld, dh, zo_frame(a, t));
        RL_TRY(rl_cuda_launched("%s: launching k_step_bwd (B=%lld H=%lld t=%lld)", fn,
                                (long long)a.B, (long long)H, (long long)t));
        /* padded rows of dG_t are 0: their dh passes through unchanged; with rec_dropout the
         * product goes through the mask */
        void *dprod;
        double beta;
        rl_cuda_rec_product_dst(a.o, dh, &dprod, &beta);
        RL_TRY(rl_cuda_gemm_batched(fn, a.s, dt, false, true, a.B, H, 2 * H, 1.0, gt, 3 * H, 0, a.U,
                                    2 * H, 0, beta, dprod, H, 0, 1));
        RL_TRY(rl_cuda_rec_unmask(a.s, dt, a.o, a.B, H, dh));
    }
    /* the previous states of all frames are rows 0..T-1 (direction 1) or 1..T (-1), or with
     * rec_dropout what the products read */
    int64_t N = a.T_ * a.B;
    RL_TRY(rl_cuda_gemm_batched(fn, a.s, dt, true, false, H, 2 * H, N, 1.0,
                                rl_cuda_rec_dU_operand(a.o, a.hs + (a.dir > 0 ? 0 : BH)), H, 0,
                                a.gates, 3 * H, 0, 1.0, dU, 2 * H, 0, 1));
    int64_t chunk_rows, chunks = rl_cuda_colsum_chunks(N, RL_JANET_CUDA_CHUNKS, &chunk_rows);
    dim3 block(RL_CUDA_COLSUM_COLS, RL_CUDA_COLSUM_ROWS),
        grid((unsigned)((3 * H + RL_CUDA_COLSUM_COLS - 1) / RL_CUDA_COLSUM_COLS), (unsigned)chunks);
    rl_cuda_k_colsum_partial<T><<<grid, block, 0, a.s>>>(N, 3 * H, chunk_rows, a.gates, partial);
    RL_TRY(rl_cuda_launched("%s: launching rl_cuda_k_colsum_partial (N=%lld H=%lld)", fn,
                            (long long)N, (long long)H));
    k_db_final<T><<<rl_cuda_blocks_for(2 * H), RL_CUDA_THREADS, 0, a.s>>>(H, chunks, partial, db);
    return rl_cuda_launched("%s: launching k_db_final (N=%lld H=%lld)", fn, (long long)N,
                            (long long)H);
}

template <typename T>
pass_args<T> args_of(void *stream, int64_t T_, int64_t B, int64_t H, int dir, const int32_t *len,
                     void *gates, const void *U, const void *hs, const rl_cuda_rec_opts *o) {
    return pass_args<T>{rl_cuda_stream(stream), T_,      B, H, dir, len, (T *)gates,
                        (const T *)U,           (T *)hs, o};
}

} // namespace

extern "C" rl_status rl_janet_cuda_forward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                           int64_t H, int direction, const int32_t *len,
                                           void *gates, const void *U, const void *b, double beta,
                                           void *hs, void *out, const rl_cuda_rec_opts *o) {
    const char *fn = "rl_janet_cuda_forward";
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return forward_loop<float>(fn,
                                   args_of<float>(stream, T, B, H, direction, len, gates, U, hs, o),
                                   (const float *)b, (float)beta, (float *)out);
    return forward_loop<double>(fn,
                                args_of<double>(stream, T, B, H, direction, len, gates, U, hs, o),
                                (const double *)b, beta, (double *)out);
}

extern "C" rl_status rl_janet_cuda_backward(void *stream, rl_dtype dt, int64_t T, int64_t B,
                                            int64_t H, int direction, const int32_t *len,
                                            void *gates, const void *U, const void *hs,
                                            const void *dout, int64_t dout_ld, void *dh, void *dU,
                                            void *db, void *partial, const rl_cuda_rec_opts *o) {
    const char *fn = "rl_janet_cuda_backward";
    if (!dh || !dU || !db || !partial)
        return rl_error(RL_EARG, "%s: dh, dU, db and the partial sums' scratch must be given", fn);
    RL_TRY(rl_cuda_check_recurrence(fn, dt, T, B, H, direction, len));
    if (T == 0 || B == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, gates));
    if (dt == RL_FLOAT32)
        return backward_loop<float>(
            fn, args_of<float>(stream, T, B, H, direction, len, gates, U, hs, o),
            (const float *)dout, dout_ld, (float *)dh, (float *)dU, (float *)db, (float *)partial);
    return backward_loop<double>(
        fn, args_of<double>(stream, T, B, H, direction, len, gates, U, hs, o), (const double *)dout,
        dout_ld, (double *)dh, (double *)dU, (double *)db, (double *)partial);
}
