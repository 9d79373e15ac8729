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
#include <cuda_fp16.h>

#include <new>

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

namespace {
rl_status half_gemm(const char *fn, cudaStream_t s, rl_cuda_half fmt, const rl_cuda_half_ctx *ctx,
                    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                    int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                    int64_t batch);
} // namespace

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
    /* a network in bf16 or fp16 (rl_cuda_half_active): its float32 products take half operands */
    rl_cuda_half_ctx *half = dt == RL_FLOAT32 ? rl_cuda_half_active() : nullptr;
    if (half)
        return half_gemm(fn, s, rl_cuda_half_ctx_format(half), half, trans_a, trans_b, m, n, k,
                         (float)alpha, (const float *)a, lda, stride_a, (const float *)b, ldb,
                         stride_b, (float)beta, (float *)c, ldc, stride_c, batch);
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

/* ---- half-precision products: bf16 or fp16 operands, float32 accumulation and result ---- */

namespace {

constexpr size_t HALF_BYTES = 2; /* bf16 and fp16 alike */

template <typename H> __device__ H to_half(float x);
template <> __device__ __nv_bfloat16 to_half<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __half to_half<__half>(float x) { return __float2half_rn(x); }

template <typename H>
__global__ void k_to_half(H *__restrict__ dst, const float *__restrict__ src, int64_t rows,
                          int64_t cols, int64_t ld) {
    RL_CUDA_GRID_LOOP(i, rows * cols) dst[i] = to_half<H>(src[(i / cols) * ld + i % cols]);
}

const char *half_name(rl_cuda_half fmt) { return fmt == RL_CUDA_BF16 ? "bf16" : "fp16"; }

/* src (rows x cols, rows ld apart) rounded to fmt (nearest even; fp16 past 65504 becomes Inf)
 * into dst (dense, rows cols apart) */
rl_status to_half_fmt(const char *fn, cudaStream_t s, rl_cuda_half fmt, void *dst, const float *src,
                      int64_t rows, int64_t cols, int64_t ld) {
    if (rows * cols == 0) return RL_OK;
    if (fmt == RL_CUDA_BF16)
        k_to_half<__nv_bfloat16><<<rl_cuda_blocks_for(rows * cols), RL_CUDA_THREADS, 0, s>>>(
            (__nv_bfloat16 *)dst, src, rows, cols, ld);
    else
        k_to_half<__half><<<rl_cuda_blocks_for(rows * cols), RL_CUDA_THREADS, 0, s>>>(
            (__half *)dst, src, rows, cols, ld);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? RL_OK
                            : rl_cuda_fail(e, "%s: rounding a %lld x %lld operand to %s", fn,
                                           (long long)rows, (long long)cols, half_name(fmt));
}

} // namespace

/* The weights range of a network in bf16 or fp16 and its rounded copy (same layout, 2 bytes an
 * element), valid for one (range, version). */
struct rl_cuda_half_ctx {
    rl_cuda_half fmt;
    const float *w;   /* the range, device memory; NULL: none yet */
    int64_t n;        /* its elements */
    uint64_t version; /* of its contents when copy was made */
    int device;       /* of w and copy */
    void *copy;       /* n elements of fmt */
    int64_t cap;      /* copy's elements */
    uint64_t conversions;
};

static thread_local rl_cuda_half_ctx *t_half_active;

extern "C" rl_cuda_half_ctx *rl_cuda_half_ctx_new(rl_cuda_half fmt) {
    if (fmt != RL_CUDA_BF16 && fmt != RL_CUDA_FP16) return nullptr;
    rl_cuda_half_ctx *c = new (std::nothrow) rl_cuda_half_ctx();
    if (c) c->fmt = fmt;
    return c;
}

extern "C" void rl_cuda_half_ctx_free(rl_cuda_half_ctx *ctx) {
    if (!ctx) return;
    if (t_half_active == ctx) t_half_active = nullptr;
    if (ctx->copy) {
        int cur = -1;
        bool have = cudaGetDevice(&cur) == cudaSuccess;
        cudaSetDevice(ctx->device);
        cudaFree(ctx->copy); /* synchronises: no queued product still reads it */
        if (have) cudaSetDevice(cur);
        cudaGetLastError();
    }
    delete ctx;
}

extern "C" rl_cuda_half rl_cuda_half_ctx_format(const rl_cuda_half_ctx *ctx) { return ctx->fmt; }

extern "C" uint64_t rl_cuda_half_ctx_conversions(const rl_cuda_half_ctx *ctx) {
    return ctx->conversions;
}

extern "C" rl_status rl_cuda_half_ctx_begin(rl_cuda_half_ctx *ctx, const float *weights, int64_t n,
                                            uint64_t version) {
    const char *fn = "rl_cuda_half_ctx_begin";
    if (ctx->w == weights && ctx->n == n && ctx->version == version && ctx->copy) return RL_OK;
    ctx->w = nullptr; /* invalid until the new copy is queued */
    if (n <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, weights));
    int dev = 0;
    cudaGetDevice(&dev);
    if (ctx->copy && (ctx->cap < n || ctx->device != dev)) {
        int cur = dev;
        cudaSetDevice(ctx->device);
        cudaFree(ctx->copy);
        cudaSetDevice(cur);
        ctx->copy = nullptr;
        ctx->cap = 0;
    }
    if (!ctx->copy) {
        cudaError_t e = cudaMalloc(&ctx->copy, (size_t)n * HALF_BYTES);
        if (e != cudaSuccess) {
            ctx->copy = nullptr;
            return rl_cuda_fail(e, "%s: cudaMalloc of the %s copy of %lld weights", fn,
                                half_name(ctx->fmt), (long long)n);
        }
        ctx->cap = n;
        ctx->device = dev;
    }
    /* on the legacy stream: after the optimizer's update, before every layer's stream (blocking
     * streams wait for it) */
    RL_TRY(to_half_fmt(fn, 0, ctx->fmt, ctx->copy, weights, 1, n, n));
    ctx->w = weights;
    ctx->n = n;
    ctx->version = version;
    ctx->conversions++;
    return RL_OK;
}

extern "C" rl_cuda_half_ctx *rl_cuda_half_active(void) { return t_half_active; }
extern "C" void rl_cuda_half_activate(rl_cuda_half_ctx *ctx) { t_half_active = ctx; }

namespace {

/* Whether x (rows x cols stored, rows ld apart, `batch` of them stride apart) lies in the ctx's
 * weights range, whose rounded copy is kept. */
bool in_ctx(const rl_cuda_half_ctx *ctx, const float *x, int64_t rows, int64_t ld, int64_t cols,
            int64_t stride, int64_t batch) {
    int64_t span = (batch - 1) * stride + (rows - 1) * ld + cols;
    return ctx && ctx->w && x >= ctx->w && stride >= 0 && x - ctx->w + span <= ctx->n;
}

/* The rounded operand x: inside the ctx's weights range, its place in the kept copy (same ld and
 * stride); otherwise rounded into scratch (dense: ld cols, stride rows * cols). */
const void *half_operand(const char *fn, cudaStream_t s, rl_cuda_half fmt,
                         const rl_cuda_half_ctx *ctx, const float *x, int64_t rows, int64_t cols,
                         int64_t *ld, int64_t *stride, int64_t batch, char *scratch,
                         rl_status *st) {
    if (in_ctx(ctx, x, rows, *ld, cols, *stride, batch))
        return (const char *)ctx->copy + (size_t)(x - ctx->w) * HALF_BYTES;
    for (int64_t i = 0; i < batch && *st == RL_OK; i++)
        *st = to_half_fmt(fn, s, fmt, scratch + (size_t)(i * rows * cols) * HALF_BYTES,
                          x + i * *stride, rows, cols, *ld);
    *ld = cols;
    *stride = rows * cols;
    return scratch;
}

/* Row-major C_i = alpha op(A_i) op(B_i) + beta C_i (float32 A, B, C; batch strided) with both
 * operands rounded to fmt (ctx's kept copy for a weight, a stream-ordered scratch otherwise),
 * cublasGemmEx with CUBLAS_COMPUTE_32F: the one definition of the half products. */
rl_status half_gemm(const char *fn, cudaStream_t s, rl_cuda_half fmt, const rl_cuda_half_ctx *ctx,
                    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                    int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                    int64_t batch) {
    if (m <= 0 || n <= 0 || batch <= 0) return RL_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || ldc > INT32_MAX || lda > INT32_MAX ||
        ldb > INT32_MAX || batch > INT32_MAX)
        return rl_error(RL_EARG,
                        "%s: m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld: the %s products "
                        "(cublasGemmEx) take sizes up to 2^31 - 1",
                        fn, (long long)m, (long long)n, (long long)k, (long long)lda,
                        (long long)ldb, (long long)ldc, half_name(fmt));
    cublasHandle_t h;
    RL_TRY(rl_cuda_blas_handle(fn, s, &h));
    if (batch == 1) stride_a = stride_b = stride_c = 0;
    /* stored shapes of a and b (rows x cols) */
    int64_t ar = trans_a ? k : m, ac = trans_a ? m : k;
    int64_t br = trans_b ? n : k, bc = trans_b ? k : n;
    lda = fix_ld(ar, ac, lda);
    ldb = fix_ld(br, bc, ldb);
    ldc = fix_ld(m, n, ldc);
    size_t need = 0;
    if (!in_ctx(ctx, a, ar, lda, ac, stride_a, batch)) need += (size_t)(batch * ar * ac);
    if (!in_ctx(ctx, b, br, ldb, bc, stride_b, batch)) need += (size_t)(batch * br * bc);
    char *buf = nullptr;
    if (need > 0) {
        cudaError_t e = cudaMallocAsync((void **)&buf, need * HALF_BYTES, s);
        if (e != cudaSuccess)
            return rl_cuda_fail(e, "%s: cudaMallocAsync of the %s operands (%zu elements)", fn,
                                half_name(fmt), need);
    }
    rl_status st = RL_OK;
    char *next = buf;
    bool a_kept = in_ctx(ctx, a, ar, lda, ac, stride_a, batch);
    const void *ha = half_operand(fn, s, fmt, ctx, a, ar, ac, &lda, &stride_a, batch, next, &st);
    if (!a_kept) next += (size_t)(batch * ar * ac) * HALF_BYTES;
    const void *hb =
        st == RL_OK ? half_operand(fn, s, fmt, ctx, b, br, bc, &ldb, &stride_b, batch, next, &st)
                    : nullptr;
    lda = fix_ld(ar, ac, lda); /* a scratch's ld is its column count */
    ldb = fix_ld(br, bc, ldb);
    if (st == RL_OK) {
        cudaDataType_t t = fmt == RL_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, as in the float32
         * path */
        cublasStatus_t bs =
            batch == 1
                ? cublasGemmEx(h, ob, oa, (int)n, (int)m, (int)k, &alpha, hb, t, (int)ldb, ha, t,
                               (int)lda, &beta, c, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT)
                : cublasGemmStridedBatchedEx(h, ob, oa, (int)n, (int)m, (int)k, &alpha, hb, t,
                                             (int)ldb, stride_b, ha, t, (int)lda, stride_a, &beta,
                                             c, CUDA_R_32F, (int)ldc, stride_c, (int)batch,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)
            st = rl_error(RL_EDEVICE,
                          "%s: cublasGemmEx (%s operands): %s (m=%lld n=%lld k=%lld batch=%lld, "
                          "%s%s)",
                          fn, half_name(fmt), cublasGetStatusString(bs), (long long)m, (long long)n,
                          (long long)k, (long long)batch, trans_a ? "A^T" : "A",
                          trans_b ? " B^T" : " B");
    }
    if (buf) {
        cudaError_t e = cudaFreeAsync(buf, s);
        if (e != cudaSuccess && st == RL_OK)
            st = rl_cuda_fail(e, "%s: cudaFreeAsync of the %s operands", fn, half_name(fmt));
    }
    return st;
}

} // namespace

extern "C" rl_status rl_cuda_gemm_bf16(void *stream, bool trans_a, bool trans_b, int64_t m,
                                       int64_t n, int64_t k, float alpha, const float *a,
                                       int64_t lda, const float *b, int64_t ldb, float beta,
                                       float *c, int64_t ldc) {
    const char *fn = "rl_cuda_gemm_bf16";
    if (m <= 0 || n <= 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, c));
    return half_gemm(fn, rl_cuda_stream(stream), RL_CUDA_BF16, nullptr, trans_a, trans_b, m, n, k,
                     alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
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
