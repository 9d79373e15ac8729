/* Parity of the bf16 matrix product (precision "bf16"): rl_cuda_gemm_bf16 on cuda:0 (bf16
 * operands rounded by its conversion kernel, cublasGemmEx with CUBLAS_COMPUTE_32F and a float32
 * result) against the float32 inputs' exact product computed here in double. Without a CUDA device
 * the device side is the CPU's rl_gemm_bf16 (the same rounding), so every case, the reference and
 * the tolerance run in CI and must pass there too.
 *
 * Tolerance, from bf16's unit roundoff u = 2^-8 (half its epsilon 2^-7, round to nearest even):
 * each rounded operand is x(1 + d), |d| <= u, so each product term is off by at most
 * (2u + u^2) of its magnitude; with positive inputs every term has the sign of the sum, so the sum
 * is off by at most (2u + u^2) of itself, plus float32 accumulation over k terms and the float32
 * reference (k + 2) 2^-24: rtol = 2u + u^2 + (k + 2) 2^-24 (0.00784 at k = 64), element by
 * element. The product must also show bf16 rounding (largest relative error above 2^-14: a float32
 * product is within ~1e-6), so a path that skips the rounding fails. Small integers are exact in
 * bf16 and their sums exact in float32: those cases must match exactly, which checks the layout
 * (transposes, leading dimensions) independently of rounding. Run by `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/ops.h"
#include "tests/c/check.h"
#include "tests/gpu/device_side.h"
#ifdef RL_WITH_CUDA
#include "kernels/cuda/context.h"
#endif

static const double BF16_U = 1.0 / 256.0;

/* a stored rows x cols with rows ld apart (ld >= cols; the padding holds NaN, which must never
 * reach a result); values uniform in [lo, hi), or integers in [lo, hi] with ints */
static rl_tensor operand(int64_t rows, int64_t cols, int64_t ld, double lo, double hi, bool ints) {
    int64_t shape[2] = {rows, ld};
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, RL_FLOAT32, RL_DEVICE_CPU, 2, shape));
    for (int64_t i = 0; i < rows * ld; i++) {
        double v = ints ? floor(lo + (hi - lo + 1) * urand(0, 1)) : urand(lo, hi);
        set_flat(&t, i, i % ld < cols ? v : NAN);
    }
    return t;
}

static void gemm_case(rl_device dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, bool ints) {
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + 3, ldb = bc + 1;
    rl_tensor a = ints ? operand(ar, ac, lda, -8, 8, true) : operand(ar, ac, lda, 0.5, 2.0, false);
    rl_tensor b = ints ? operand(br, bc, ldb, -8, 8, true) : operand(br, bc, ldb, 0.5, 2.0, false);
    int64_t cshape[2] = {m, n};
    rl_tensor want = {0}, c = {0};
    CHECK_OK(rl_tensor_empty(&want, RL_FLOAT32, RL_DEVICE_CPU, 2, cshape));
    CHECK_OK(rl_tensor_empty(&c, RL_FLOAT32, RL_DEVICE_CPU, 2, cshape));
    const float *pa = rl_tensor_data(&a), *pb = rl_tensor_data(&b);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++)
                s += (double)(ta ? pa[l * lda + i] : pa[i * lda + l]) *
                     (double)(tb ? pb[j * ldb + l] : pb[l * ldb + j]);
            set_flat(&want, i * n + j, s);
            set_flat(&c, i * n + j, NAN); /* beta = 0 must only write c */
        }
    rl_tensor da = copy_to(&a, dev), db = copy_to(&b, dev), dc = copy_to(&c, dev);
    if (dev.type == RL_CPU) {
        CHECK_OK(rl_gemm_bf16(ta, tb, m, n, k, 1.0f, rl_tensor_data(&da), lda, rl_tensor_data(&db),
                              ldb, 0.0f, rl_tensor_data(&dc), n));
    } else {
#ifdef RL_WITH_CUDA
        CHECK_OK(rl_cuda_gemm_bf16(NULL, ta, tb, m, n, k, 1.0f, rl_tensor_data(&da), lda,
                                   rl_tensor_data(&db), ldb, 0.0f, rl_tensor_data(&dc), n));
        CHECK_OK(rl_device_cuda_backend()->synchronize(dev.index));
#endif
    }
    rl_tensor got = copy_to(&dc, RL_DEVICE_CPU);
    char what[96];
    snprintf(what, sizeof what, "bf16 gemm %s%s m=%lld n=%lld k=%lld%s", ta ? "A^T" : "A",
             tb ? " B^T" : " B", (long long)m, (long long)n, (long long)k, ints ? " integers" : "");
    double rtol = ints ? 0 : 2 * BF16_U + BF16_U * BF16_U + (double)(k + 2) / 16777216.0;
    compare_elems(what, &want, &got, rtol, 0);
    if (!ints) {
        double e = rel_err(&want, &got);
        if (!(e > 1.0 / 16384.0))
            fprintf(stderr, "%s: largest relative error %g shows no bf16 rounding\n", what, e);
        CHECK(e > 1.0 / 16384.0);
    }
    rl_tensor ts[8] = {a, b, want, c, da, db, dc, got};
    for (int i = 0; i < 8; i++)
        rl_tensor_release(&ts[i]);
}

/* The products of a network in bf16 or fp16 (fmt 1 or 2: RL_CUDA_BF16, RL_CUDA_FP16): a float32
 * rl_cuda_gemm while a half context is active, with b a weight inside the context's weights
 * range (read from its kept rounded copy, at an offset, with a leading dimension) and a either an
 * activation outside it (rounded per call) or another weight (both_kept). The same tolerance
 * with the format's u (fp16: 2^-11), the same exact integer cases, rounding visible (error above
 * u/64), and the weights rounded once per version. The CPU stands in for bf16 only (rl_gemm_bf16,
 * the same rounding); fp16 runs on a GPU alone. */
static void ctx_case(rl_device dev, int fmt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                     bool ints, bool both_kept) {
    double u = fmt == 1 ? BF16_U : 1.0 / 2048.0;
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + 2, ldb = bc + 3, boff = 5, aoff = boff + br * ldb + 1;
    int64_t nw = (both_kept ? aoff + ar * lda : boff + br * ldb) + 4;
    rl_tensor a = ints ? operand(ar, ac, lda, -8, 8, true) : operand(ar, ac, lda, 0.5, 2.0, false);
    rl_tensor b = ints ? operand(br, bc, ldb, -8, 8, true) : operand(br, bc, ldb, 0.5, 2.0, false);
    /* the weights range: NaN around b (and a), which no product may read */
    int64_t wshape[1] = {nw};
    rl_tensor w = {0};
    CHECK_OK(rl_tensor_empty(&w, RL_FLOAT32, RL_DEVICE_CPU, 1, wshape));
    float *pw = rl_tensor_data(&w);
    for (int64_t i = 0; i < nw; i++)
        pw[i] = NAN;
    memcpy(pw + boff, rl_tensor_data(&b), (size_t)(br * ldb) * sizeof(float));
    if (both_kept) memcpy(pw + aoff, rl_tensor_data(&a), (size_t)(ar * lda) * sizeof(float));
    int64_t cshape[2] = {m, n};
    rl_tensor want = {0}, c = {0};
    CHECK_OK(rl_tensor_empty(&want, RL_FLOAT32, RL_DEVICE_CPU, 2, cshape));
    CHECK_OK(rl_tensor_empty(&c, RL_FLOAT32, RL_DEVICE_CPU, 2, cshape));
    const float *pa = rl_tensor_data(&a), *pb = rl_tensor_data(&b);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0;
            for (int64_t l = 0; l < k; l++)
                sum += (double)(ta ? pa[l * lda + i] : pa[i * lda + l]) *
                       (double)(tb ? pb[j * ldb + l] : pb[l * ldb + j]);
            set_flat(&want, i * n + j, sum);
            set_flat(&c, i * n + j, NAN);
        }
    rl_tensor da = copy_to(&a, dev), dw = copy_to(&w, dev), dc = copy_to(&c, dev);
    float *dwp = rl_tensor_data(&dw);
    const float *opa = both_kept ? dwp + aoff : (const float *)rl_tensor_data(&da);
    if (dev.type == RL_CPU) {
        CHECK_OK(rl_gemm_bf16(ta, tb, m, n, k, 1.0f, opa, lda, dwp + boff, ldb, 0.0f,
                              rl_tensor_data(&dc), n));
    } else {
#ifdef RL_WITH_CUDA
        rl_cuda_half_ctx *ctx = rl_cuda_half_ctx_new(fmt == 1 ? RL_CUDA_BF16 : RL_CUDA_FP16);
        CHECK(ctx != NULL);
        CHECK_OK(rl_cuda_half_ctx_begin(ctx, dwp, nw, 7));
        CHECK_OK(rl_cuda_half_ctx_begin(ctx, dwp, nw, 7)); /* same version: kept */
        CHECK(rl_cuda_half_ctx_conversions(ctx) == 1);
        rl_cuda_half_activate(ctx);
        CHECK_OK(rl_cuda_gemm(NULL, RL_FLOAT32, ta, tb, m, n, k, 1.0, opa, lda, dwp + boff, ldb,
                              0.0, rl_tensor_data(&dc), n));
        rl_cuda_half_activate(NULL);
        CHECK_OK(rl_device_cuda_backend()->synchronize(dev.index));
        CHECK_OK(rl_cuda_half_ctx_begin(ctx, dwp, nw, 8)); /* a new version: rounded again */
        CHECK(rl_cuda_half_ctx_conversions(ctx) == 2);
        rl_cuda_half_ctx_free(ctx);
#endif
    }
    rl_tensor got = copy_to(&dc, RL_DEVICE_CPU);
    char what[128];
    snprintf(what, sizeof what, "%s gemm through the half context %s%s m=%lld n=%lld k=%lld%s%s",
             fmt == 1 ? "bf16" : "fp16", ta ? "A^T" : "A", tb ? " B^T" : " B", (long long)m,
             (long long)n, (long long)k, ints ? " integers" : "", both_kept ? " both kept" : "");
    double rtol = ints ? 0 : 2 * u + u * u + (double)(k + 2) / 16777216.0;
    compare_elems(what, &want, &got, rtol, 0);
    if (!ints) {
        double e = rel_err(&want, &got);
        if (!(e > u / 64))
            fprintf(stderr, "%s: largest relative error %g shows no rounding\n", what, e);
        CHECK(e > u / 64);
    }
    rl_tensor ts[8] = {a, b, w, want, c, da, dw, dc};
    for (int i = 0; i < 8; i++)
        rl_tensor_release(&ts[i]);
    rl_tensor_release(&got);
}

int main(void) {
    rl_ops_init();
    rl_device dev = device_side("fp16 products through the half context (the CPU has none)");
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        gemm_case(dev, ta, tb, 7, 33, 64, false);
        gemm_case(dev, ta, tb, 40, 5, 17, false);
        gemm_case(dev, ta, tb, 9, 12, 64, true);
        for (int fmt = 1; fmt <= 2; fmt++) {
            if (fmt == 2 && dev.type == RL_CPU) continue;
            ctx_case(dev, fmt, ta, tb, 7, 33, 64, false, false);
            ctx_case(dev, fmt, ta, tb, 40, 5, 17, false, true);
            ctx_case(dev, fmt, ta, tb, 9, 12, 64, true, false);
        }
    }
    TEST_MAIN_END();
}
