/* The CUDA context (API: kernels/cuda/context.h for C, kernels/cuda/launch.h for .cu files): the
 * error and device helpers, the cuBLAS handles, the side streams with their events and the
 * stream-ordered helpers every CUDA user shares, so no kernel file keeps its own copy.
 *
 * cuBLAS: one handle per (device, stream), in one registry for the whole process (the tensor ops'
 * gemm on the legacy stream, the recurrent layers' streams, the MDLSTM's batched GEMMs), since a
 * handle's workspace must not be shared by two streams running at once. rl_cuda_stream_destroy
 * destroys the handles of its stream (and with them their workspaces); the legacy stream's
 * handles live as long as the process.
 *
 * Producer/consumer events: every stream from rl_cuda_stream_create owns one event;
 * rl_cuda_stream_wrote records it after a layer call and notes (kernels/stream_deps.h) which
 * byte ranges that call wrote; rl_cuda_stream_wait_for makes a reader's stream wait for the
 * events of the other streams that last wrote what it reads.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <utility>

#include "launch.h"

extern "C" {
#include "../stream_deps.h"
}

/* ---- errors, devices ---- */

namespace {

rl_status vfail(const char *what, const char *fmt, va_list ap) {
    char ctx[512];
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    return rl_error(RL_EDEVICE, "%s: %s", ctx, what);
}

} // namespace

rl_status rl_cuda_fail(cudaError_t e, const char *fmt, ...) {
    cudaGetLastError();
    va_list ap;
    va_start(ap, fmt);
    rl_status st = vfail(cudaGetErrorString(e), fmt, ap);
    va_end(ap);
    return st;
}

rl_status rl_cuda_launched(const char *fmt, ...) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return RL_OK;
    va_list ap;
    va_start(ap, fmt);
    rl_status st = vfail(cudaGetErrorString(e), fmt, ap);
    va_end(ap);
    return st;
}

rl_status rl_cuda_enter(const char *fn, const void *p) {
    cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaPointerGetAttributes", fn);
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return rl_error(RL_EDEVICE, "%s: a buffer is not in CUDA device memory", fn);
    int cur = -1;
    e = cudaGetDevice(&cur);
    if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaGetDevice", fn);
    return cur == attr.device ? RL_OK : rl_cuda_use_device(fn, attr.device);
}

rl_status rl_cuda_use_device(const char *fn, int device) {
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? RL_OK : rl_cuda_fail(e, "%s: cudaSetDevice(%d)", fn, device);
}

rl_status rl_cuda_check_dtype(const char *fn, rl_dtype dt) {
    if (dt == RL_FLOAT32 || dt == RL_FLOAT64) return RL_OK;
    return rl_error(RL_EDTYPE, "%s (cuda): dtype %s not supported (float32, float64)", fn,
                    rl_dtype_name(dt));
}

rl_status rl_cuda_check_recurrence(const char *fn, rl_dtype dt, int64_t T, int64_t B, int64_t H,
                                   int dir, const int32_t *len) {
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (T < 0 || B < 0 || H < 1 || (dir != 1 && dir != -1) || !len)
        return rl_error(RL_EARG, "%s: bad sizes T=%lld B=%lld H=%lld direction=%d%s", fn,
                        (long long)T, (long long)B, (long long)H, dir, len ? "" : " or no lengths");
    return RL_OK;
}

extern "C" rl_status rl_cuda_synchronize(int device) {
    RL_TRY(rl_cuda_use_device("rl_cuda_synchronize", device));
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? RL_OK : rl_cuda_fail(e, "cudaDeviceSynchronize (cuda:%d)", device);
}

/* ---- cuBLAS handles, one per (device, stream) ---- */

namespace {

std::mutex g_handles_mu;
std::map<std::pair<int, void *>, cublasHandle_t> *g_handles;

rl_status blas_fail(const char *fn, const char *call, cublasStatus_t st) {
    return rl_error(RL_EDEVICE, "%s: %s: %s", fn, call, cublasGetStatusString(st));
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

/* cuBLAS wants ld >= max(1, rows) of its column-major view even where the ld is never used (a
 * single row-major row); rows x cols is the row-major stored shape. */
int64_t fix_ld(int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 1 && ld < cols) ld = cols;
    return ld > 1 ? ld : 1;
}

} // namespace

rl_status rl_cuda_blas_handle(const char *fn, cudaStream_t s, cublasHandle_t *out) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaGetDevice", fn);
    std::lock_guard<std::mutex> lock(g_handles_mu);
    try {
        if (!g_handles) g_handles = new std::map<std::pair<int, void *>, cublasHandle_t>;
        auto key = std::make_pair(dev, (void *)s);
        auto it = g_handles->find(key);
        if (it == g_handles->end()) {
            cublasHandle_t h = nullptr;
            cublasStatus_t st = cublasCreate(&h);
            if (st != CUBLAS_STATUS_SUCCESS) return blas_fail(fn, "cublasCreate", st);
            /* float32 stays float32, as on the CPU: no TF32 tensor-core rounding */
            st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
            if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(h, s);
            if (st != CUBLAS_STATUS_SUCCESS) {
                cublasDestroy(h);
                return blas_fail(fn, "configuring a new cuBLAS handle", st);
            }
            it = g_handles->emplace(key, h).first;
        }
        *out = it->second;
    } catch (...) {
        return rl_error(RL_ENOMEM, "%s: out of host memory for the cuBLAS handles", fn);
    }
    return RL_OK;
}

rl_status rl_cuda_gemm_batched(const char *fn, cudaStream_t s, rl_dtype dt, bool trans_a,
                               bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                               const void *a, int64_t lda, int64_t stride_a, const void *b,
                               int64_t ldb, int64_t stride_b, double beta, void *c, int64_t ldc,
                               int64_t stride_c, int64_t batch) {
    if (m <= 0 || n <= 0 || batch <= 0) return RL_OK;
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    cublasHandle_t h;
    RL_TRY(rl_cuda_blas_handle(fn, s, &h));
    lda = trans_a ? fix_ld(k, m, lda) : fix_ld(m, k, lda);
    ldb = trans_b ? fix_ld(n, k, ldb) : fix_ld(k, n, ldb);
    ldc = fix_ld(m, n, ldc);
    cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    const char *call;
    if (dt == RL_FLOAT32) {
        float al = (float)alpha, be = (float)beta;
        const float *fa = (const float *)a, *fb = (const float *)b;
        call = batch == 1 ? "cublasSgemm" : "cublasSgemmStridedBatched";
        st = batch == 1
                 ? cublasSgemm_64(h, ob, oa, n, m, k, &al, fb, ldb, fa, lda, &be, (float *)c, ldc)
                 : cublasSgemmStridedBatched_64(h, ob, oa, n, m, k, &al, fb, ldb, stride_b, fa, lda,
                                                stride_a, &be, (float *)c, ldc, stride_c, batch);
    } else {
        const double *da = (const double *)a, *db = (const double *)b;
        call = batch == 1 ? "cublasDgemm" : "cublasDgemmStridedBatched";
        st = batch == 1 ? cublasDgemm_64(h, ob, oa, n, m, k, &alpha, db, ldb, da, lda, &beta,
                                         (double *)c, ldc)
                        : cublasDgemmStridedBatched_64(h, ob, oa, n, m, k, &alpha, db, ldb,
                                                       stride_b, da, lda, stride_a, &beta,
                                                       (double *)c, ldc, stride_c, batch);
    }
    if (st == CUBLAS_STATUS_SUCCESS) return RL_OK;
    return rl_error(RL_EDEVICE,
                    "%s: %s: %s (m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld batch=%lld, %s%s)",
                    fn, call, cublasGetStatusString(st), (long long)m, (long long)n, (long long)k,
                    (long long)lda, (long long)ldb, (long long)ldc, (long long)batch,
                    trans_a ? "A^T" : "A", trans_b ? " B^T" : " B");
}

extern "C" rl_status rl_cuda_gemm(void *stream, rl_dtype dt, bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                                  const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
    const char *fn = "rl_cuda_gemm";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (m <= 0 || n <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, c));
    return rl_cuda_gemm_batched(fn, rl_cuda_stream(stream), dt, trans_a, trans_b, m, n, k, alpha, a,
                                lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* ---- bf16 products: bf16 operands, float32 accumulation and result ---- */

__global__ void k_to_bf16(__nv_bfloat16 *__restrict__ dst, const float *__restrict__ src,
                          int64_t rows, int64_t cols, int64_t ld) {
    RL_CUDA_GRID_LOOP(i, rows * cols) dst[i] = __float2bfloat16_rn(src[(i / cols) * ld + i % cols]);
}

/* src (rows x cols, rows ld apart) rounded to bf16 into dst (dense, rows cols apart) */
static rl_status to_bf16(const char *fn, cudaStream_t s, __nv_bfloat16 *dst, const float *src,
                         int64_t rows, int64_t cols, int64_t ld) {
    k_to_bf16<<<rl_cuda_blocks_for(rows * cols), RL_CUDA_THREADS, 0, s>>>(dst, src, rows, cols, ld);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? RL_OK
                            : rl_cuda_fail(e, "%s: rounding a %lld x %lld operand to bf16", fn,
                                           (long long)rows, (long long)cols);
}

extern "C" rl_status rl_cuda_gemm_bf16(void *stream, bool trans_a, bool trans_b, int64_t m,
                                       int64_t n, int64_t k, float alpha, const float *a,
                                       int64_t lda, const float *b, int64_t ldb, float beta,
                                       float *c, int64_t ldc) {
    const char *fn = "rl_cuda_gemm_bf16";
    if (m <= 0 || n <= 0) return RL_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || ldc > INT32_MAX)
        return rl_error(RL_EARG,
                        "%s: m=%lld n=%lld k=%lld ldc=%lld: cublasGemmEx takes sizes up to "
                        "2^31 - 1",
                        fn, (long long)m, (long long)n, (long long)k, (long long)ldc);
    RL_TRY(rl_cuda_enter(fn, c));
    cudaStream_t s = rl_cuda_stream(stream);
    cublasHandle_t h;
    RL_TRY(rl_cuda_blas_handle(fn, s, &h));
    /* stored shapes of a and b (rows x cols) */
    int64_t ar = trans_a ? k : m, ac = trans_a ? m : k;
    int64_t br = trans_b ? n : k, bc = trans_b ? k : n;
    lda = fix_ld(ar, ac, lda);
    ldb = fix_ld(br, bc, ldb);
    ldc = fix_ld(m, n, ldc);
    size_t na = (size_t)(ar * ac), nb = (size_t)(br * bc);
    __nv_bfloat16 *buf = nullptr;
    if (na + nb > 0) {
        cudaError_t e = cudaMallocAsync((void **)&buf, (na + nb) * sizeof *buf, s);
        if (e != cudaSuccess)
            return rl_cuda_fail(e, "%s: cudaMallocAsync of the bf16 operands (%zu elements)", fn,
                                na + nb);
    }
    rl_status st = RL_OK;
    if (na) st = to_bf16(fn, s, buf, a, ar, ac, lda);
    if (st == RL_OK && nb) st = to_bf16(fn, s, buf + na, b, br, bc, ldb);
    if (st == RL_OK) {
        /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, as in the float32 path;
         * the rounded copies are dense, so their leading dimensions are their column counts */
        cublasStatus_t bs = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
                                         (int)k, &alpha, buf + na, CUDA_R_16BF, (int)(bc ? bc : 1),
                                         buf, CUDA_R_16BF, (int)(ac ? ac : 1), &beta, c, CUDA_R_32F,
                                         (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)
            st = rl_error(RL_EDEVICE, "%s: cublasGemmEx: %s (m=%lld n=%lld k=%lld, %s%s)", fn,
                          cublasGetStatusString(bs), (long long)m, (long long)n, (long long)k,
                          trans_a ? "A^T" : "A", trans_b ? " B^T" : " B");
    }
    if (buf) {
        cudaError_t e = cudaFreeAsync(buf, s);
        if (e != cudaSuccess && st == RL_OK)
            st = rl_cuda_fail(e, "%s: cudaFreeAsync of the bf16 operands", fn);
    }
    return st;
}

/* ---- side streams and their events ---- */

namespace {

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

/* Up to kLenChunk lengths by value (a kernel argument: 2 KiB, below the 4 KiB limit). */
constexpr int kLenChunk = 512;
struct LenChunk {
    int32_t v[kLenChunk];
};

__global__ void k_set_lengths(int32_t *__restrict__ dst, LenChunk c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = c.v[i];
}

} // namespace

extern "C" rl_status rl_cuda_stream_create(int device, void **stream) {
    const char *fn = "rl_cuda_stream_create";
    *stream = NULL;
    RL_TRY(rl_cuda_use_device(fn, device));
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamDefault);
    if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaStreamCreate on cuda:%d", fn, device);
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaStreamDestroy(s);
        return rl_cuda_fail(e, "%s: cudaEventCreate on cuda:%d", fn, device);
    }
    std::lock_guard<std::mutex> lock(g_deps_mu);
    try {
        g_events[(void *)s] = ev;
    } catch (...) {
        cudaEventDestroy(ev);
        cudaStreamDestroy(s);
        return rl_error(RL_ENOMEM, "%s: out of host memory", fn);
    }
    *stream = (void *)s;
    return RL_OK;
}

extern "C" void rl_cuda_stream_destroy(void *stream) {
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
    destroy_handles_of(rl_cuda_stream(stream));
    cudaStreamDestroy(rl_cuda_stream(stream));
    cudaGetLastError();
}

extern "C" rl_status rl_cuda_stream_wait_for(void *stream, const rl_tensor *const *ts, int n) {
    const char *fn = "rl_cuda_stream_wait_for";
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
            RL_TRY(rl_cuda_enter(fn, p));
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaDeviceSynchronize", fn);
            continue;
        }
        for (size_t k = 0; k < nw; k++) {
            auto it = g_events.find(w[k]);
            if (it == g_events.end()) continue; /* not ours: cannot happen, forget drops it */
            cudaError_t e = cudaStreamWaitEvent(rl_cuda_stream(stream), it->second, 0);
            if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaStreamWaitEvent", fn);
        }
    }
    return RL_OK;
}

extern "C" rl_status rl_cuda_stream_wrote(void *stream, const rl_tensor *const *ts, int n) {
    const char *fn = "rl_cuda_stream_wrote";
    if (!stream) return RL_OK;
    std::lock_guard<std::mutex> lock(g_deps_mu);
    auto it = g_events.find(stream);
    if (it == g_events.end())
        return rl_error(RL_EARG, "%s: not a stream from rl_cuda_stream_create", fn);
    bool recorded = false;
    for (int i = 0; i < n; i++) {
        const void *p;
        size_t bytes;
        if (!cuda_range(ts[i], &p, &bytes)) continue;
        if (!recorded) {
            /* the event lives on the stream's device, which the caller's tensors are on */
            RL_TRY(rl_cuda_enter(fn, p));
            cudaError_t e = cudaEventRecord(it->second, rl_cuda_stream(stream));
            if (e != cudaSuccess) return rl_cuda_fail(e, "%s: cudaEventRecord", fn);
            recorded = true;
        }
        RL_TRY(rl_stream_deps_wrote(&g_deps, stream, p, bytes));
    }
    return RL_OK;
}

extern "C" rl_status rl_cuda_stream_sync(void *stream) {
    cudaError_t e = cudaStreamSynchronize(rl_cuda_stream(stream));
    return e == cudaSuccess ? RL_OK : rl_cuda_fail(e, "rl_cuda_stream_sync: cudaStreamSynchronize");
}

/* ---- stream-ordered helpers ---- */

extern "C" rl_status rl_cuda_set_lengths(void *stream, int32_t *len_dev, const int32_t *len_host,
                                         int64_t B) {
    const char *fn = "rl_cuda_set_lengths";
    if (B <= 0) return RL_OK;
    if (!len_dev || !len_host)
        return rl_error(RL_EARG, "%s: no lengths buffer (B=%lld)", fn, (long long)B);
    RL_TRY(rl_cuda_enter(fn, len_dev));
    for (int64_t at = 0; at < B; at += kLenChunk) {
        int n = (int)(B - at < kLenChunk ? B - at : kLenChunk);
        LenChunk c;
        for (int i = 0; i < n; i++)
            c.v[i] = len_host[at + i];
        k_set_lengths<<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, rl_cuda_stream(stream)>>>(
            len_dev + at, c, n);
        RL_TRY(rl_cuda_launched("%s: launching k_set_lengths (B=%lld)", fn, (long long)B));
    }
    return RL_OK;
}

extern "C" rl_status rl_cuda_zero(void *stream, void *p, size_t bytes) {
    const char *fn = "rl_cuda_zero";
    if (bytes == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, p));
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, rl_cuda_stream(stream));
    return e == cudaSuccess ? RL_OK : rl_cuda_fail(e, "%s: cudaMemsetAsync (%zu bytes)", fn, bytes);
}

extern "C" rl_status rl_cuda_copy_rows(void *stream, void *dst, size_t dst_pitch, const void *src,
                                       size_t src_pitch, size_t row_bytes, int64_t rows) {
    const char *fn = "rl_cuda_copy_rows";
    if (rows <= 0 || row_bytes == 0) return RL_OK;
    if (dst_pitch < row_bytes || src_pitch < row_bytes)
        return rl_error(RL_EARG, "%s: pitches %zu, %zu below the row size %zu", fn, dst_pitch,
                        src_pitch, row_bytes);
    RL_TRY(rl_cuda_enter(fn, dst));
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, (size_t)rows,
                                      cudaMemcpyDeviceToDevice, rl_cuda_stream(stream));
    return e == cudaSuccess ? RL_OK
                            : rl_cuda_fail(e, "%s: cudaMemcpy2DAsync (%lld rows of %zu bytes)", fn,
                                           (long long)rows, row_bytes);
}

/* ---- the recurrent driver's masks ---- */

namespace {

__device__ __forceinline__ float drop(float a, float k) { return rl_dropf(a, k); }
__device__ __forceinline__ double drop(double a, double k) { return rl_drop(a, k); }

template <typename T>
__global__ void k_mask(int64_t n, const T *__restrict__ a, const T *__restrict__ k,
                       T *__restrict__ d, bool accumulate) {
    RL_CUDA_GRID_LOOP(i, n) { d[i] = accumulate ? d[i] + drop(a[i], k[i]) : drop(a[i], k[i]); }
}

} // namespace

extern "C" rl_status rl_cuda_mask(void *stream, rl_dtype dt, int64_t n, const void *src,
                                  const void *mask, void *dst, bool accumulate) {
    const char *fn = "rl_cuda_mask";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    if (n <= 0) return RL_OK;
    if (!src || !mask || !dst)
        return rl_error(RL_EARG, "%s: a NULL buffer (n=%lld)", fn, (long long)n);
    RL_TRY(rl_cuda_enter(fn, dst));
    cudaStream_t s = rl_cuda_stream(stream);
    if (dt == RL_FLOAT32)
        k_mask<float><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, s>>>(
            n, (const float *)src, (const float *)mask, (float *)dst, accumulate);
    else
        k_mask<double><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, s>>>(
            n, (const double *)src, (const double *)mask, (double *)dst, accumulate);
    return rl_cuda_launched("%s: launching k_mask (n=%lld)", fn, (long long)n);
}

extern "C" rl_status rl_cuda_rec_operand(void *stream, rl_dtype dt, const rl_cuda_rec_opts *o,
                                         int64_t t, int64_t B, int64_t P, const void *hp,
                                         const void **x) {
    *x = hp;
    if (!o || !o->md) return RL_OK;
    char *hd = (char *)o->hd + (size_t)(t * B * P) * rl_dtype_size(dt);
    *x = hd;
    return rl_cuda_mask(stream, dt, B * P, hp, o->md, hd, false);
}

extern "C" void rl_cuda_rec_product_dst(const rl_cuda_rec_opts *o, void *dh, void **dst,
                                        double *beta) {
    bool masked = o && o->md;
    *dst = masked ? o->dtmp : dh;
    *beta = masked ? 0.0 : 1.0;
}

extern "C" rl_status rl_cuda_rec_unmask(void *stream, rl_dtype dt, const rl_cuda_rec_opts *o,
                                        int64_t B, int64_t P, void *dh) {
    if (!o || !o->md) return RL_OK;
    return rl_cuda_mask(stream, dt, B * P, o->dtmp, o->md, dh, true);
}

extern "C" const void *rl_cuda_rec_dU_operand(const rl_cuda_rec_opts *o, const void *hprev) {
    return o && o->md ? o->hd : hprev;
}
