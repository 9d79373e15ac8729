/* The kernel table (kernels/backend.h) for tensors on CUDA devices.
 *
 * Geometry: every elementwise kernel walks the row-major linear index i over the op's shape and
 * turns it into one element offset per operand (Geo, passed by value). On the host, size-1 dims
 * are dropped and neighbouring dims that are contiguous in every operand are merged, so
 * contiguous tensors take one multiply per element and views pay one 64-bit division per
 * remaining dim. All index arithmetic is 64-bit; kernels use grid-stride loops.
 *
 * Formulas: the pointwise math comes from kernels/pointwise.h and the random words from
 * core/philox.h, the same definitions the CPU loops use, so results agree with the CPU up to
 * the last bits of the device's libm (and exactly for int32, comparisons and random words).
 *
 * Reductions accumulate float32 and float64 in double (int32 sums and products wrap in 64-bit
 * unsigned, then keep their low 32 bits). max/min return the first occurrence; a NaN wins over
 * every number and the first NaN wins. One thread per output when there are many outputs or
 * the reduced dim is short, else one block per output with a shared-memory tree.
 *
 * gemm maps row-major onto cuBLAS's column-major by computing C^T = op(B)^T op(A)^T, that is by
 * swapping the operands (and m with n), in the CUDA context (kernels/cuda/context.cu).
 *
 * Streams: everything runs on the legacy default stream of the tensors' device, the stream the
 * allocator (device.cu) and cuBLAS's default use too. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

extern "C" {
#include "../../core/philox.h"
#include "../pointwise.h"
#include "cuda.h"
}
#include "launch.h"

namespace {

/* ---- geometry ---- */

template <int K> struct Geo {
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    int64_t st[K][RL_MAX_DIMS];
};

/* Geometry of K operands over one shape, with size-1 dims dropped and mergeable dims merged
 * (this keeps the row-major order of the linear index). */
template <int K> Geo<K> geo_build(int ndim, const int64_t *shape, const int64_t *const *strides) {
    Geo<K> g;
    g.ndim = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        bool merge = g.ndim > 0;
        for (int k = 0; k < K && merge; k++)
            merge = g.st[k][g.ndim - 1] == strides[k][d] * shape[d];
        if (merge) {
            g.shape[g.ndim - 1] *= shape[d];
            for (int k = 0; k < K; k++)
                g.st[k][g.ndim - 1] = strides[k][d];
        } else {
            g.shape[g.ndim] = shape[d];
            for (int k = 0; k < K; k++)
                g.st[k][g.ndim] = strides[k][d];
            g.ndim++;
        }
    }
    return g;
}

template <int K> Geo<K> geo_of(const rl_tensor *const *ts) {
    const int64_t *strides[K];
    for (int k = 0; k < K; k++)
        strides[k] = ts[k]->stride;
    return geo_build<K>(ts[0]->ndim, ts[0]->shape, strides);
}

template <int K>
__device__ __forceinline__ void geo_offsets(const Geo<K> &g, int64_t i, int64_t *off) {
#pragma unroll
    for (int k = 0; k < K; k++)
        off[k] = 0;
        /* unrolled over RL_MAX_DIMS so that g is read with constant indices (no local copy) */
#pragma unroll
    for (int d = RL_MAX_DIMS - 1; d > 0; d--) {
        if (d >= g.ndim) continue;
        int64_t q = i / g.shape[d];
        int64_t c = i - q * g.shape[d];
#pragma unroll
        for (int k = 0; k < K; k++)
            off[k] += c * g.st[k][d];
        i = q;
    }
    if (g.ndim > 0) {
#pragma unroll
        for (int k = 0; k < K; k++)
            off[k] += i * g.st[k][0];
    }
}

/* ---- errors and devices ---- */

rl_status use_device_of(const char *op, const rl_tensor *t) {
    return rl_cuda_use_device(op, t->storage->device.index);
}

rl_status launched(const char *op) { return rl_cuda_launched("%s: kernel launch", op); }

rl_status bad_dtype(const char *op, rl_dtype dt) {
    return rl_error(RL_EDTYPE, "%s (cuda): dtype %s not supported", op, rl_dtype_name(dt));
}

/* Calls f with a value of the C type of dt (float, double or int32_t). */
template <typename F> rl_status with_dtype(const char *op, rl_dtype dt, F f) {
    switch (dt) {
    case RL_FLOAT32: return f(float{});
    case RL_FLOAT64: return f(double{});
    case RL_INT32: return f(int32_t{});
    default: return bad_dtype(op, dt);
    }
}

/* A double scalar in the element type: a C cast for floats; saturating (NaN -> 0) for int32,
 * where an out-of-range C cast would be undefined. */
template <typename T> T scalar_as(double v) { return (T)v; }
template <> int32_t scalar_as<int32_t>(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

template <typename T> T *data_of(const rl_tensor *t) { return (T *)rl_tensor_data(t); }

/* ---- pointwise overloads over the shared formulas ---- */

__device__ __forceinline__ float unary_of(rl_unary_op op, float x, float p0, float p1) {
    return rl_unary_f32(op, x, p0, p1);
}
__device__ __forceinline__ double unary_of(rl_unary_op op, double x, double p0, double p1) {
    return rl_unary_f64(op, x, p0, p1);
}
__device__ __forceinline__ int32_t unary_of(rl_unary_op op, int32_t x, int32_t p0, int32_t p1) {
    return rl_unary_i32(op, x, p0, p1);
}
__device__ __forceinline__ float binary_of(rl_binary_op op, float a, float b) {
    return rl_binary_f32(op, a, b);
}
__device__ __forceinline__ double binary_of(rl_binary_op op, double a, double b) {
    return rl_binary_f64(op, a, b);
}
__device__ __forceinline__ int32_t binary_of(rl_binary_op op, int32_t a, int32_t b) {
    return rl_binary_i32(op, a, b);
}

/* ---- fill, copy, unary, binary, masked_fill ---- */

template <typename T> __global__ void k_fill(Geo<1> g, T *p, T v, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[1];
        geo_offsets(g, i, off);
        p[off[0]] = v;
    }
}

template <typename D, typename S>
__global__ void k_copy(Geo<2> g, D *dst, const S *src, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[2];
        geo_offsets(g, i, off);
        dst[off[0]] = (D)src[off[1]];
    }
}

template <typename T>
__global__ void k_unary(Geo<2> g, T *out, const T *a, rl_unary_op op, T p0, T p1, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[2];
        geo_offsets(g, i, off);
        out[off[0]] = unary_of(op, a[off[1]], p0, p1);
    }
}

template <typename T>
__global__ void k_binary(Geo<3> g, T *out, const T *a, const T *b, rl_binary_op op, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[3];
        geo_offsets(g, i, off);
        out[off[0]] = binary_of(op, a[off[1]], b[off[2]]);
    }
}

template <typename T>
__global__ void k_binary_scalar(Geo<2> g, T *out, const T *a, T s, rl_binary_op op,
                                bool scalar_first, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[2];
        geo_offsets(g, i, off);
        T x = a[off[1]];
        out[off[0]] = scalar_first ? binary_of(op, s, x) : binary_of(op, x, s);
    }
}

template <typename T, typename M>
__global__ void k_masked_fill(Geo<2> g, T *a, const M *mask, T v, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t off[2];
        geo_offsets(g, i, off);
        if (mask[off[1]] != (M)0) a[off[0]] = v;
    }
}

rl_status cuda_fill(rl_tensor *t, double value) {
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("fill", t));
    const rl_tensor *ts[1] = {t};
    Geo<1> g = geo_of<1>(ts);
    return with_dtype("fill", t->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_fill<T>
            <<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(g, data_of<T>(t), scalar_as<T>(value), n);
        return launched("fill");
    });
}

rl_status cuda_copy(rl_tensor *dst, const rl_tensor *src) {
    int64_t n = rl_tensor_numel(dst);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("copy", dst));
    const rl_tensor *ts[2] = {dst, src};
    Geo<2> g = geo_of<2>(ts);
    return with_dtype("copy", dst->dtype, [&](auto dtag) {
        using D = decltype(dtag);
        return with_dtype("copy", src->dtype, [&](auto stag) {
            using S = decltype(stag);
            k_copy<D, S><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(g, data_of<D>(dst),
                                                                     data_of<S>(src), n);
            return launched("copy");
        });
    });
}

rl_status cuda_unary(rl_tensor *out, const rl_tensor *a, rl_unary_op op, double p0, double p1) {
    int64_t n = rl_tensor_numel(out);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of(rl_unary_name(op), out));
    const rl_tensor *ts[2] = {out, a};
    Geo<2> g = geo_of<2>(ts);
    return with_dtype(rl_unary_name(op), out->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_unary<T><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(
            g, data_of<T>(out), data_of<T>(a), op, scalar_as<T>(p0), scalar_as<T>(p1), n);
        return launched(rl_unary_name(op));
    });
}

rl_status cuda_binary(rl_tensor *out, const rl_tensor *a, const rl_tensor *b, rl_binary_op op) {
    int64_t n = rl_tensor_numel(out);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of(rl_binary_name(op), out));
    const rl_tensor *ts[3] = {out, a, b};
    Geo<3> g = geo_of<3>(ts);
    return with_dtype(rl_binary_name(op), out->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_binary<T><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(g, data_of<T>(out), data_of<T>(a),
                                                                data_of<T>(b), op, n);
        return launched(rl_binary_name(op));
    });
}

rl_status cuda_binary_scalar(rl_tensor *out, const rl_tensor *a, double s, rl_binary_op op,
                             bool scalar_first) {
    int64_t n = rl_tensor_numel(out);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of(rl_binary_name(op), out));
    const rl_tensor *ts[2] = {out, a};
    Geo<2> g = geo_of<2>(ts);
    return with_dtype(rl_binary_name(op), out->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_binary_scalar<T><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(
            g, data_of<T>(out), data_of<T>(a), scalar_as<T>(s), op, scalar_first, n);
        return launched(rl_binary_name(op));
    });
}

rl_status cuda_masked_fill(rl_tensor *a, const rl_tensor *mask, double value) {
    int64_t n = rl_tensor_numel(a);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("masked_fill", a));
    const rl_tensor *ts[2] = {a, mask};
    Geo<2> g = geo_of<2>(ts);
    return with_dtype("masked_fill", a->dtype, [&](auto tag) {
        using T = decltype(tag);
        return with_dtype("masked_fill", mask->dtype, [&](auto mtag) {
            using M = decltype(mtag);
            k_masked_fill<T, M><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(
                g, data_of<T>(a), data_of<M>(mask), scalar_as<T>(value), n);
            return launched("masked_fill");
        });
    });
}

/* ---- reductions ---- */

/* Accumulator of sum, mean, prod and norm: double, or wrapping uint64_t for int32 sum/prod. */
template <typename A> __device__ __forceinline__ A red_init(rl_reduce_op op) {
    return op == RL_RED_PROD ? (A)1 : (A)0;
}

template <typename A, typename T>
__device__ __forceinline__ A red_step(A acc, T x, rl_reduce_op op) {
    A v = (A)x;
    switch (op) {
    case RL_RED_PROD: return acc * v;
    case RL_RED_NORM: return acc + v * v;
    default: return acc + v;
    }
}

template <typename A> __device__ __forceinline__ A red_join(A a, A b, rl_reduce_op op) {
    return op == RL_RED_PROD ? a * b : a + b;
}

template <typename T>
__device__ __forceinline__ T red_finish(double acc, rl_reduce_op op, int64_t len) {
    if (op == RL_RED_MEAN) return (T)(acc / (double)len);
    if (op == RL_RED_NORM) return (T)sqrt(acc);
    return (T)acc;
}
template <typename T> __device__ __forceinline__ T red_finish(uint64_t acc, rl_reduce_op, int64_t) {
    return (T)(int32_t)(uint32_t)acc;
}

/* (v, i) beats the best so far (bv, bi) for max (is_max) or min: a NaN beats every number, the
 * lower index wins a tie, and index -1 marks "nothing yet". */
template <typename T>
__device__ __forceinline__ bool red_beats(T v, int64_t i, T bv, int64_t bi, bool is_max) {
    if (i < 0) return false;
    if (bi < 0) return true;
    bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    if (v == bv) return i < bi;
    return is_max ? v > bv : v < bv;
}

/* Geo<3> offsets: 0 into a (the reduced run starts there), 1 into out, 2 into indices. */
template <typename T, typename A>
__global__ void k_reduce_thread(Geo<3> g, const T *a, T *out, int64_t len, int64_t rs,
                                rl_reduce_op op, int64_t nout) {
    for (int64_t o = rl_cuda_thread_start(); o < nout; o += rl_cuda_thread_step()) {
        int64_t off[3];
        geo_offsets(g, o, off);
        A acc = red_init<A>(op);
        for (int64_t j = 0; j < len; j++)
            acc = red_step(acc, a[off[0] + j * rs], op);
        out[off[1]] = red_finish<T>(acc, op, len);
    }
}

template <typename T, typename A>
__global__ void k_reduce_block(Geo<3> g, const T *a, T *out, int64_t len, int64_t rs,
                               rl_reduce_op op, int64_t nout) {
    __shared__ A sh[RL_CUDA_THREADS];
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t off[3];
        geo_offsets(g, o, off);
        A acc = red_init<A>(op);
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            acc = red_step(acc, a[off[0] + j * rs], op);
        sh[threadIdx.x] = acc;
        __syncthreads();
        for (int s = RL_CUDA_THREADS / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s)
                sh[threadIdx.x] = red_join(sh[threadIdx.x], sh[threadIdx.x + s], op);
            __syncthreads();
        }
        if (threadIdx.x == 0) out[off[1]] = red_finish<T>(sh[0], op, len);
        __syncthreads();
    }
}

/* Two-stage full reduction of one long run (nout == 1): stage 1, block b reduces the fixed chunk
 * [b * chunk, (b + 1) * chunk) into part[b]; stage 2, one block joins the parts in a fixed tree
 * and finishes. The chunks depend only on len, so the result is the same on every device and run
 * (deterministic), and a loss's sums over (T * B * C) use the whole grid, not one block of 256
 * threads. */
template <typename A> __device__ __forceinline__ A block_join(A *sh, A acc, rl_reduce_op op) {
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = RL_CUDA_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] = red_join(sh[threadIdx.x], sh[threadIdx.x + s], op);
        __syncthreads();
    }
    return sh[0];
}

template <typename T, typename A>
__global__ void k_reduce_partial(const T *a, int64_t len, int64_t rs, int64_t chunk,
                                 rl_reduce_op op, A *part) {
    __shared__ A sh[RL_CUDA_THREADS];
    int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < len ? lo + chunk : len;
    A acc = red_init<A>(op);
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
        acc = red_step(acc, a[j * rs], op);
    A r = block_join(sh, acc, op);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

template <typename T, typename A>
__global__ void k_reduce_final(const A *part, int64_t nparts, int64_t len, rl_reduce_op op,
                               T *out) {
    __shared__ A sh[RL_CUDA_THREADS];
    /* the parts are already squared (norm) or summed: join them, do not step them */
    A acc = red_init<A>(op);
    for (int64_t j = threadIdx.x; j < nparts; j += blockDim.x)
        acc = red_join(acc, part[j], op);
    A r = block_join(sh, acc, op);
    if (threadIdx.x == 0) out[0] = red_finish<T>(r, op, len);
}

constexpr int64_t kTwoStageMin = 1 << 16; /* shorter runs: one block is enough */
constexpr int64_t kChunk = 4096;          /* elements per stage-1 block (16 per thread) */
constexpr int64_t kMaxParts = 1024;

/* One long run reduced in two stages (see k_reduce_partial); the partial sums live in a
 * temporary device tensor of 8-byte elements (A is double or uint64_t). */
template <typename T, typename A>
rl_status reduce_two_stage(const char *name, const rl_tensor *a, const T *pa, T *po, int64_t len,
                           int64_t rs, rl_reduce_op op) {
    int64_t nparts = (len + kChunk - 1) / kChunk;
    if (nparts > kMaxParts) nparts = kMaxParts;
    int64_t chunk = (len + nparts - 1) / nparts;
    rl_tensor part = {0};
    RL_TRY(rl_tensor_empty(&part, RL_FLOAT64, rl_tensor_device(a), 1, &nparts));
    A *pp = (A *)rl_tensor_data(&part);
    k_reduce_partial<T, A><<<(unsigned)nparts, RL_CUDA_THREADS>>>(pa, len, rs, chunk, op, pp);
    rl_status st = launched(name);
    if (st == RL_OK) {
        k_reduce_final<T, A><<<1, RL_CUDA_THREADS>>>(pp, nparts, len, op, po);
        st = launched(name);
    }
    rl_tensor_release(&part); /* stream-ordered like every op here (the legacy stream) */
    return st;
}

template <typename T>
__global__ void k_argext_thread(Geo<3> g, const T *a, T *out, int32_t *idx, int64_t len, int64_t rs,
                                bool is_max, int64_t nout) {
    for (int64_t o = rl_cuda_thread_start(); o < nout; o += rl_cuda_thread_step()) {
        int64_t off[3];
        geo_offsets(g, o, off);
        T bv = T{};
        int64_t bi = -1;
        for (int64_t j = 0; j < len; j++) {
            T v = a[off[0] + j * rs];
            if (red_beats(v, j, bv, bi, is_max)) {
                bv = v;
                bi = j;
            }
        }
        out[off[1]] = bv;
        if (idx) idx[off[2]] = (int32_t)bi;
    }
}

template <typename T>
__global__ void k_argext_block(Geo<3> g, const T *a, T *out, int32_t *idx, int64_t len, int64_t rs,
                               bool is_max, int64_t nout) {
    __shared__ T shv[RL_CUDA_THREADS];
    __shared__ int64_t shi[RL_CUDA_THREADS];
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t off[3];
        geo_offsets(g, o, off);
        T bv = T{};
        int64_t bi = -1;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
            T v = a[off[0] + j * rs];
            if (red_beats(v, j, bv, bi, is_max)) {
                bv = v;
                bi = j;
            }
        }
        shv[threadIdx.x] = bv;
        shi[threadIdx.x] = bi;
        __syncthreads();
        for (int s = RL_CUDA_THREADS / 2; s > 0; s >>= 1) {
            int t = (int)threadIdx.x;
            if (t < s && red_beats(shv[t + s], shi[t + s], shv[t], shi[t], is_max)) {
                shv[t] = shv[t + s];
                shi[t] = shi[t + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            out[off[1]] = shv[0];
            if (idx) idx[off[2]] = (int32_t)shi[0];
        }
        __syncthreads();
    }
}

rl_status cuda_reduce(rl_tensor *out, rl_tensor *indices, const rl_tensor *a, int dim,
                      rl_reduce_op op) {
    const char *name = rl_reduce_name(op);
    int64_t nout = rl_tensor_numel(out);
    if (nout == 0) return RL_OK;
    RL_TRY(use_device_of(name, out));
    int64_t len = a->shape[dim], rs = a->stride[dim];
    int64_t shape[RL_MAX_DIMS], zero[RL_MAX_DIMS] = {0};
    for (int d = 0; d < a->ndim; d++)
        shape[d] = d == dim ? 1 : a->shape[d];
    const int64_t *strides[3] = {a->stride, out->stride, indices ? indices->stride : zero};
    Geo<3> g = geo_build<3>(a->ndim, shape, strides);
    int32_t *idx = indices ? data_of<int32_t>(indices) : NULL;
    /* many outputs or short runs: a thread each; few long runs: a block each */
    bool per_thread = nout >= 4096 || len <= 32;
    unsigned grid = per_thread ? rl_cuda_blocks_for(nout)
                               : (unsigned)(nout < RL_CUDA_MAX_BLOCKS ? nout : RL_CUDA_MAX_BLOCKS);
    return with_dtype(name, a->dtype, [&](auto tag) {
        using T = decltype(tag);
        const T *pa = data_of<T>(a);
        T *po = data_of<T>(out);
        if (op == RL_RED_MAX || op == RL_RED_MIN) {
            bool is_max = op == RL_RED_MAX;
            if (per_thread)
                k_argext_thread<T>
                    <<<grid, RL_CUDA_THREADS>>>(g, pa, po, idx, len, rs, is_max, nout);
            else
                k_argext_block<T><<<grid, RL_CUDA_THREADS>>>(g, pa, po, idx, len, rs, is_max, nout);
            return launched(name);
        }
        bool two_stage = nout == 1 && len >= kTwoStageMin;
        if constexpr (std::is_same<T, int32_t>::value) {
            if (op == RL_RED_SUM || op == RL_RED_PROD) {
                if (two_stage) return reduce_two_stage<T, uint64_t>(name, a, pa, po, len, rs, op);
                if (per_thread)
                    k_reduce_thread<T, uint64_t>
                        <<<grid, RL_CUDA_THREADS>>>(g, pa, po, len, rs, op, nout);
                else
                    k_reduce_block<T, uint64_t>
                        <<<grid, RL_CUDA_THREADS>>>(g, pa, po, len, rs, op, nout);
                return launched(name);
            }
        }
        if (two_stage) return reduce_two_stage<T, double>(name, a, pa, po, len, rs, op);
        if (per_thread)
            k_reduce_thread<T, double><<<grid, RL_CUDA_THREADS>>>(g, pa, po, len, rs, op, nout);
        else
            k_reduce_block<T, double><<<grid, RL_CUDA_THREADS>>>(g, pa, po, len, rs, op, nout);
        return launched(name);
    });
}

/* ---- gemm ---- */

rl_status cuda_gemm(rl_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, int64_t stride_a, const void *b,
                    int64_t ldb, int64_t stride_b, double beta, void *c, int64_t ldc,
                    int64_t stride_c, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return RL_OK;
    if (dt != RL_FLOAT32 && dt != RL_FLOAT64) return bad_dtype("gemm", dt);
    /* the table's gemm takes bare pointers: the device is the one that holds c */
    RL_TRY(rl_cuda_enter("gemm (cuda)", c));
    return rl_cuda_gemm_batched("gemm (cuda)", NULL, dt, trans_a, trans_b, m, n, k, alpha, a, lda,
                                stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
}

/* ---- index_select, arange ---- */

struct SelGeo {
    int ndim, dim;
    int64_t shape[RL_MAX_DIMS]; /* out's shape */
    int64_t so[RL_MAX_DIMS], sa[RL_MAX_DIMS];
    int64_t si; /* stride of the index vector */
};

template <typename T>
__global__ void k_index_select(SelGeo g, T *out, const T *a, const int32_t *index, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step()) {
        int64_t r = i, oo = 0, oa = 0;
#pragma unroll
        for (int d = RL_MAX_DIMS - 1; d >= 0; d--) {
            if (d >= g.ndim) continue;
            int64_t q = r / g.shape[d];
            int64_t c = r - q * g.shape[d];
            r = q;
            oo += c * g.so[d];
            oa += (d == g.dim ? (int64_t)index[c * g.si] : c) * g.sa[d];
        }
        out[oo] = a[oa];
    }
}

rl_status cuda_index_select(rl_tensor *out, const rl_tensor *a, int dim, const rl_tensor *index) {
    int64_t n = rl_tensor_numel(out);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("index_select", out));
    SelGeo g;
    g.ndim = out->ndim;
    g.dim = dim;
    for (int d = 0; d < out->ndim; d++) {
        g.shape[d] = out->shape[d];
        g.so[d] = out->stride[d];
        g.sa[d] = a->stride[d];
    }
    g.si = index->ndim > 0 ? index->stride[0] : 0;
    const int32_t *pi = data_of<int32_t>(index);
    return with_dtype("index_select", out->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_index_select<T>
            <<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(g, data_of<T>(out), data_of<T>(a), pi, n);
        return launched("index_select");
    });
}

template <typename T>
__global__ void k_arange(T *t, int64_t stride, double start, double step, int64_t n) {
    for (int64_t i = rl_cuda_thread_start(); i < n; i += rl_cuda_thread_step())
        t[i * stride] = (T)(start + (double)i * step);
}

rl_status cuda_arange(rl_tensor *t, double start, double step) {
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("arange", t));
    int64_t stride = t->ndim > 0 ? t->stride[t->ndim - 1] : 0;
    return with_dtype("arange", t->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_arange<T>
            <<<rl_cuda_blocks_for(n), RL_CUDA_THREADS>>>(data_of<T>(t), stride, start, step, n);
        return launched("arange");
    });
}

/* ---- random numbers ---- */

/* Thread q computes Philox block offset+q once and writes the four elements 4q..4q+3 that use
 * its words (element i uses word i % 4 of block offset + i / 4, as rl_philox_word). */
template <typename T>
__global__ void k_uniform(Geo<1> g, T *t, uint64_t seed, uint64_t offset, double lo, double hi,
                          int64_t n) {
    int64_t nblocks = (n + 3) / 4;
    for (int64_t q = rl_cuda_thread_start(); q < nblocks; q += rl_cuda_thread_step()) {
        rl_philox_block b = rl_philox(seed, 0, offset + (uint64_t)q);
        for (int j = 0; j < 4; j++) {
            int64_t i = 4 * q + j;
            if (i >= n) break;
            int64_t off[1];
            geo_offsets(g, i, off);
            t[off[0]] = (T)(lo + (hi - lo) * (double)rl_u32_to_unit(b.v[j]));
        }
    }
}

/* Element i uses words 2i and 2i+1, so block offset+q serves elements 2q and 2q+1. */
template <typename T>
__global__ void k_normal(Geo<1> g, T *t, uint64_t seed, uint64_t offset, double mean, double std,
                         int64_t n) {
    int64_t nblocks = (n + 1) / 2;
    for (int64_t q = rl_cuda_thread_start(); q < nblocks; q += rl_cuda_thread_step()) {
        rl_philox_block b = rl_philox(seed, 0, offset + (uint64_t)q);
        for (int j = 0; j < 2; j++) {
            int64_t i = 2 * q + j;
            if (i >= n) break;
            int64_t off[1];
            geo_offsets(g, i, off);
            double z =
                rl_box_muller(rl_u32_to_unit_open(b.v[2 * j]), rl_u32_to_unit(b.v[2 * j + 1]));
            t[off[0]] = (T)(mean + std * z);
        }
    }
}

rl_status cuda_uniform(rl_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi) {
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("uniform", t));
    const rl_tensor *ts[1] = {t};
    Geo<1> g = geo_of<1>(ts);
    return with_dtype("uniform", t->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_uniform<T><<<rl_cuda_blocks_for((n + 3) / 4), RL_CUDA_THREADS>>>(g, data_of<T>(t), seed,
                                                                           offset, lo, hi, n);
        return launched("uniform");
    });
}

rl_status cuda_normal(rl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    RL_TRY(use_device_of("normal", t));
    const rl_tensor *ts[1] = {t};
    Geo<1> g = geo_of<1>(ts);
    return with_dtype("normal", t->dtype, [&](auto tag) {
        using T = decltype(tag);
        k_normal<T><<<rl_cuda_blocks_for((n + 1) / 2), RL_CUDA_THREADS>>>(g, data_of<T>(t), seed,
                                                                          offset, mean, std, n);
        return launched("normal");
    });
}

const rl_kernels g_kernels = {
    cuda_fill,        cuda_copy,   cuda_unary,          cuda_binary,       cuda_binary_scalar,
    cuda_masked_fill, cuda_reduce, cuda_gemm,           cuda_index_select, cuda_arange,
    cuda_uniform,     cuda_normal, rl_cuda_synchronize,
};

} // namespace

extern "C" const rl_kernels *rl_kernels_cuda(void) { return &g_kernels; }
