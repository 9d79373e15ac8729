/* The general float32 GEMM (kernels/cpu/gemm_small.h's rl_gemm_f32, which core/blas.c's
 * rl_blas_sgemm runs at the avx2 and avx512 levels): every element must be, bit for bit, the
 * chain of fmaf over k in order from zero followed by alpha * sum (+ beta * c), the scalar
 * reference below. That one definition is what makes a row's bits independent of the rows
 * around it, of the thread split and of the level, so the test compares exact bits: every
 * transpose, row counts around the 8-row (AVX-512) and 4-row (AVX2) tiles and the 8-row in-place
 * bound, widths around the 48-column panels and their 16/24-column halves, k from 0 (and a k
 * of 2600, which runs in blocks), four alpha/beta pairs, a C with a wider stride whose extra
 * columns must stay untouched, and NaN in C with beta 0 (BLAS does not read C then); a transposed A
 * is copied or, with few columns, read in place. Then the same through rl_blas_sgemm on 1 and 2
 * threads, and at the generic level rl_gemm_f32 must decline (BLAS runs there). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/blas.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/cpu/gemm_small.h"
#include "check.h"

static uint64_t state = 0x9e3779b97f4a7c15ull;
static float next_value(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (float)((double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Extra columns of C beyond N (ldc = n + PAD) that no product may touch */
#define PAD 3

static void reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < k; i++)
                acc = fmaf(ta ? a[i * lda + r] : a[r * lda + i],
                           tb ? b[j * ldb + i] : b[i * ldb + j], acc);
            float *cr = c + r * ldc + j;
            if (alpha == 1.0f && beta == 0.0f)
                *cr = acc;
            else if (beta == 0.0f)
                *cr = alpha * acc;
            else
                *cr = fmaf(beta, *cr, alpha * acc);
        }
}

typedef enum { DIRECT, THROUGH_BLAS } route;

/* One case: 0 when every bit agrees with the reference and the padding is untouched */
static int one_case(route how, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    float beta, bool nan_c) {
    int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n + PAD;
    size_t na = (size_t)(m * k) + 1, nb = (size_t)(k * n) + 1, nc = (size_t)(m * ldc);
    float *a = malloc(sizeof *a * na), *b = malloc(sizeof *b * nb), *c = malloc(sizeof *c * nc),
          *want = malloc(sizeof *want * nc);
    for (size_t i = 0; i < na; i++)
        a[i] = next_value();
    for (size_t i = 0; i < nb; i++)
        b[i] = next_value();
    for (size_t i = 0; i < nc; i++)
        c[i] = nan_c && (int64_t)i % ldc < n ? NAN : next_value();
    memcpy(want, c, sizeof *c * nc);
    reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc);
    int bad = 0;
    if (how == DIRECT) {
        if (!rl_gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) bad = 2;
    } else {
        rl_blas_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    if (!bad && memcmp(c, want, sizeof *c * nc) != 0) bad = 1;
    if (bad)
        fprintf(
            stderr, "%s level %s: ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g nan_c=%d: %s\n",
            how == DIRECT ? "rl_gemm_f32" : "rl_blas_sgemm", rl_cpu_level_name(rl_cpu_level_get()),
            ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta, nan_c,
            bad == 2 ? "declined" : "bits differ from the fmaf chain");
    free(a);
    free(b);
    free(c);
    free(want);
    return bad;
}

static const int64_t rows[] = {1, 3, 4, 8, 9, 16, 17, 33, 70};
static const int64_t widths[] = {1, 5, 16, 20, 24, 30, 47, 48, 49, 100, 130};
static const int64_t depths[] = {0, 1, 7, 30, 64, 129};
static const float alphas[] = {1.0f, 1.0f, 0.5f, -2.0f};
static const float betas[] = {0.0f, 1.0f, 0.0f, 0.25f};

static void level_cases(route how) {
    int failed = 0;
    for (int tr = 0; tr < 4; tr++)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
                for (size_t d = 0; d < sizeof depths / sizeof *depths; d++)
                    for (size_t e = 0; e < sizeof alphas / sizeof *alphas; e++) {
                        bool nan_c = betas[e] == 0.0f && (r + w) % 2 == 0;
                        if (failed < 10 && one_case(how, tr & 1, tr & 2, rows[r], widths[w],
                                                    depths[d], alphas[e], betas[e], nan_c))
                            failed++;
                    }
    CHECK(failed == 0);
}

/* A k long enough to run in blocks whose partial sums continue each other's chains */
static void long_k_cases(void) {
    static const int64_t long_rows[] = {1, 9, 33}, long_widths[] = {20, 100};
    int failed = 0;
    for (int tr = 0; tr < 4; tr++)
        for (size_t r = 0; r < 3; r++)
            for (size_t w = 0; w < 2; w++)
                for (size_t e = 0; e < sizeof alphas / sizeof *alphas; e++)
                    if (failed < 10 && one_case(DIRECT, tr & 1, tr & 2, long_rows[r],
                                                long_widths[w], 2600, alphas[e], betas[e], false))
                        failed++;
    CHECK(failed == 0);
}

/* Products big enough for core/blas.c to split them over 2 threads, by columns and by rows */
static void split_cases(void) {
    static const int64_t shapes[][3] = {
        {64, 1300, 200}, {600, 100, 300}, {129, 777, 65}, {600, 40, 700}, {40, 90, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tr = 0; tr < 4; tr++)
            CHECK(one_case(THROUGH_BLAS, tr & 1, tr & 2, shapes[s][0], shapes[s][1], shapes[s][2],
                           1.0f, tr == 3 ? 1.0f : 0.0f, false) == 0);
}

int main(void) {
    int saved_threads = rl_blas_get_threads();
    rl_cpu_level best = rl_cpu_level_supported(), saved = rl_cpu_level_get();
    int levels = 0;
    for (int lv = RL_CPU_GENERIC; lv <= (int)best; lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        float one = 1.0f, out = 0.0f;
        bool has = rl_gemm_f32(false, false, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &out, 1);
#if defined(__x86_64__) && defined(__GNUC__)
        CHECK(has == (lv >= RL_CPU_AVX2));
#endif
        if (!has) continue;
        levels++;
        level_cases(DIRECT);
        long_k_cases();
        for (int threads = 1; threads <= 2; threads++) {
            rl_blas_set_threads(threads);
            level_cases(THROUGH_BLAS);
            split_cases();
        }
        rl_blas_set_threads(saved_threads);
    }
    CHECK_OK(rl_cpu_level_set(saved));
    fprintf(stderr, "rl_gemm_f32 checked at %d level(s) up to %s\n", levels,
            rl_cpu_level_name(best));
    TEST_MAIN_END();
}
