/* One attention step on CUDA (API: kernels/cuda/attention_cuda.h; layout: kernels/attention.h).
 *
 * The formulas are kernels/attention_step.h's, the functions the CPU loops call. One block of
 * kThreads threads per sequence b:
 *   forward:  for each valid frame j the block sums the score over A (additive) or E (dot) in
 *             a fixed-order tree; thread 0 takes the row's softmax (rl_att_softmax_*) in
 *             alpha; then each thread owns context columns k and sums over j.
 *   backward: dalpha_j by the same block sums; thread 0 turns the row into ds
 *             (rl_att_dscores_*); then each thread owns columns k of de (and dq for dot) or a
 *             of dpre, dq (= dhq) and dv (additive) and walks the frames.
 * No atomics: every element has one owner, so the results are deterministic.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "../attention_step.h"
#include "attention_cuda.h"
}
#include "launch.h"

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float att_z(float p, float h) { return rl_att_z_f32(p, h); }
__device__ __forceinline__ double att_z(double p, double h) { return rl_att_z_f64(p, h); }
__device__ __forceinline__ float att_dpre(float s, float v, float z) {
    return rl_att_dpre_f32(s, v, z);
}
__device__ __forceinline__ double att_dpre(double s, double v, double z) {
    return rl_att_dpre_f64(s, v, z);
}
__device__ __forceinline__ void att_softmax(float *s, int64_t L, int64_t Te) {
    rl_att_softmax_f32(s, L, Te);
}
__device__ __forceinline__ void att_softmax(double *s, int64_t L, int64_t Te) {
    rl_att_softmax_f64(s, L, Te);
}
__device__ __forceinline__ void att_dscores(const float *a, float *d, int64_t L, int64_t Te) {
    rl_att_dscores_f32(a, d, L, Te);
}
__device__ __forceinline__ void att_dscores(const double *a, double *d, int64_t L, int64_t Te) {
    rl_att_dscores_f64(a, d, L, Te);
}

/* The block's sum of x, in a fixed order; every thread gets it. */
template <typename T> __device__ T block_sum(T x, T *red) {
    int t = threadIdx.x;
    red[t] = x;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (t < s) red[t] += red[t + s];
        __syncthreads();
    }
    T r = red[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ int64_t valid(const int32_t *len, int64_t b, int64_t Te) {
    int64_t L = len[b];
    return L < 0 ? 0 : (L > Te ? Te : L);
}

template <typename T>
__global__ void k_fwd(bool additive, int64_t Te, int64_t B, int64_t E, int64_t A,
                      const T *__restrict__ e, const int32_t *__restrict__ len,
                      const T *__restrict__ q, const T *__restrict__ pre, const T *__restrict__ v,
                      T *__restrict__ alpha, T *__restrict__ ctx) {
    __shared__ T red[kThreads];
    const int64_t b = blockIdx.x, L = valid(len, b, Te);
    T *al = alpha + b * Te;
    for (int64_t j = 0; j < L; j++) {
        T part = T(0);
        if (additive) {
            const T *p = pre + (j * B + b) * A, *h = q + b * A;
            for (int64_t a = threadIdx.x; a < A; a += kThreads)
                part += v[a] * att_z(p[a], h[a]);
        } else {
            const T *er = e + (j * B + b) * E, *qb = q + b * E;
            for (int64_t k = threadIdx.x; k < E; k += kThreads)
                part += er[k] * qb[k];
        }
        T s = block_sum(part, red);
        if (threadIdx.x == 0) al[j] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) att_softmax(al, L, Te);
    __syncthreads();
    for (int64_t k = threadIdx.x; k < E; k += kThreads) {
        T c = T(0);
        for (int64_t j = 0; j < L; j++)
            c += al[j] * e[(j * B + b) * E + k];
        ctx[b * E + k] = c;
    }
}

template <typename T>
__global__ void k_bwd(bool additive, int64_t Te, int64_t B, int64_t E, int64_t A,
                      const T *__restrict__ e, const int32_t *__restrict__ len,
                      const T *__restrict__ q, const T *__restrict__ pre, const T *__restrict__ v,
                      const T *__restrict__ alpha, const T *__restrict__ dctx, T *__restrict__ ds,
                      T *__restrict__ de, T *__restrict__ dq, T *__restrict__ dpre,
                      T *__restrict__ dv) {
    __shared__ T red[kThreads];
    const int64_t b = blockIdx.x, L = valid(len, b, Te);
    const T *al = alpha + b * Te, *dc = dctx + b * E;
    T *d = ds + b * Te;
    for (int64_t j = 0; j < L; j++) {
        const T *er = e + (j * B + b) * E;
        T part = T(0);
        for (int64_t k = threadIdx.x; k < E; k += kThreads)
            part += er[k] * dc[k];
        T s = block_sum(part, red);
        if (threadIdx.x == 0) d[j] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) att_dscores(al, d, L, Te);
    __syncthreads();
    const T *qb = q + b * (additive ? A : E);
    T *dqb = dq + b * (additive ? A : E);
    for (int64_t k = threadIdx.x; k < E; k += kThreads) {
        T g = T(0);
        for (int64_t j = 0; j < L; j++) {
            int64_t i = (j * B + b) * E + k;
            if (additive) {
                de[i] += al[j] * dc[k];
            } else {
                de[i] += al[j] * dc[k] + d[j] * qb[k];
                g += d[j] * e[i];
            }
        }
        if (!additive) dqb[k] = g;
    }
    if (!additive) return;
    for (int64_t a = threadIdx.x; a < A; a += kThreads) {
        T gq = T(0), gv = T(0);
        for (int64_t j = 0; j < L; j++) {
            int64_t i = (j * B + b) * A + a;
            T z = att_z(pre[i], qb[a]);
            T g = att_dpre(d[j], v[a], z);
            gv += d[j] * z;
            dpre[i] += g;
            gq += g;
        }
        dqb[a] = gq;
        dv[b * A + a] += gv;
    }
}

template <typename T>
rl_status fwd(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A, const void *e,
              const int32_t *len, const void *q, const void *pre, const void *v, void *alpha,
              void *ctx) {
    const char *fn = "rl_attention_cuda_fwd";
    RL_TRY(rl_cuda_enter(fn, e));
    k_fwd<T><<<(unsigned)B, kThreads>>>(kind == RL_ATT_ADDITIVE, Te, B, E, A, (const T *)e, len,
                                        (const T *)q, (const T *)pre, (const T *)v, (T *)alpha,
                                        (T *)ctx);
    return rl_cuda_launched("%s: launching k_fwd (B=%lld E=%lld)", fn, (long long)B, (long long)E);
}

template <typename T>
rl_status bwd(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A, const void *e,
              const int32_t *len, const void *q, const void *pre, const void *v, const void *alpha,
              const void *dctx, void *ds, void *de, void *dq, void *dpre, void *dv) {
    const char *fn = "rl_attention_cuda_bwd";
    RL_TRY(rl_cuda_enter(fn, e));
    k_bwd<T><<<(unsigned)B, kThreads>>>(kind == RL_ATT_ADDITIVE, Te, B, E, A, (const T *)e, len,
                                        (const T *)q, (const T *)pre, (const T *)v,
                                        (const T *)alpha, (const T *)dctx, (T *)ds, (T *)de,
                                        (T *)dq, (T *)dpre, (T *)dv);
    return rl_cuda_launched("%s: launching k_bwd (B=%lld E=%lld)", fn, (long long)B, (long long)E);
}

rl_status check_grid(const char *fn, int64_t B) {
    if (B <= 0x7fffffff) return RL_OK;
    return rl_error(RL_EARG, "%s: B = %lld sequences is more than one grid holds", fn,
                    (long long)B);
}

} // namespace

extern "C" rl_status rl_attention_cuda_fwd(rl_dtype dt, rl_att_kind kind, int64_t Te, int64_t B,
                                           int64_t E, int64_t A, const void *e, const int32_t *len,
                                           const void *q, const void *pre, const void *v,
                                           void *alpha, void *ctx) {
    if (B <= 0) return RL_OK;
    RL_TRY(check_grid("rl_attention_cuda_fwd", B));
    if (dt == RL_FLOAT32) return fwd<float>(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx);
    return fwd<double>(kind, Te, B, E, A, e, len, q, pre, v, alpha, ctx);
}

extern "C" rl_status rl_attention_cuda_bwd(rl_dtype dt, rl_att_kind kind, int64_t Te, int64_t B,
                                           int64_t E, int64_t A, const void *e, const int32_t *len,
                                           const void *q, const void *pre, const void *v,
                                           const void *alpha, const void *dctx, void *ds, void *de,
                                           void *dq, void *dpre, void *dv) {
    if (B <= 0) return RL_OK;
    RL_TRY(check_grid("rl_attention_cuda_bwd", B));
    if (dt == RL_FLOAT32)
        return bwd<float>(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
    return bwd<double>(kind, Te, B, E, A, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv);
}
