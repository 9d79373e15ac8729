/* Row invariance of the products of core/blas.c: a row of C = op(A) op(B) (+ beta C) has the
 * same bits whatever the number of rows around it, so that a sequence alone gives what it gives
 * inside a batch (rnnlua serve's batched answers, rl.forward's batches). Every M from 1 to 21
 * against the same rows of a 320-row product, float32 and float64, every transpose, beta 0 and
 * 1, widths N whose library kernels treat the last rows differently (N % 8 >= 4 and others),
 * on 1 and 2 threads. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/blas.h"
#include "check.h"

/* the reference product's rows: big enough that it runs the library's kernels for large
 * products (OpenBLAS's AVX-512 kernels take other ones below 10^6 multiply-adds) while the
 * products of 1..21 rows run those for small ones */
#define MBIG 320

static uint64_t state = 88172645463325252ull;
static double next_value(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* op(A) is M x K: stored M x K (lda K) or, transposed, K x MBIG (lda MBIG) whose first M
 * columns are used, so that the same A serves every M */
static void gemm(bool f64, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                 const void *b, double beta, void *c) {
    int64_t lda = ta ? MBIG : k, ldb = tb ? k : n;
    if (f64)
        rl_blas_dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, n);
    else
        rl_blas_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, (float)beta, c, n);
}

static int check_case(bool f64, bool ta, bool tb, int64_t n, int64_t k, double beta) {
    size_t es = f64 ? sizeof(double) : sizeof(float);
    void *a = malloc(es * MBIG * (size_t)k), *b = malloc(es * (size_t)(k * n)),
         *c0 = malloc(es * MBIG * (size_t)n), *ref = malloc(es * MBIG * (size_t)n),
         *c = malloc(es * MBIG * (size_t)n);
    for (int64_t i = 0; i < MBIG * k; i++) {
        double v = next_value();
        if (f64)
            ((double *)a)[i] = v;
        else
            ((float *)a)[i] = (float)v;
    }
    for (int64_t i = 0; i < k * n; i++) {
        double v = next_value();
        if (f64)
            ((double *)b)[i] = v;
        else
            ((float *)b)[i] = (float)v;
    }
    for (int64_t i = 0; i < MBIG * n; i++) {
        double v = next_value();
        if (f64)
            ((double *)c0)[i] = v;
        else
            ((float *)c0)[i] = (float)v;
    }
    memcpy(ref, c0, es * MBIG * (size_t)n);
    gemm(f64, ta, tb, MBIG, n, k, a, b, beta, ref);
    int bad_m = 0;
    for (int64_t m = 1; m <= 21; m++) {
        memcpy(c, c0, es * MBIG * (size_t)n);
        gemm(f64, ta, tb, m, n, k, a, b, beta, c);
        if (memcmp(c, ref, es * (size_t)(m * n)) != 0) {
            if (!bad_m) bad_m = (int)m;
        }
        /* rows past M are not written */
        if (memcmp((char *)c + es * (size_t)(m * n), (char *)c0 + es * (size_t)(m * n),
                   es * (size_t)((MBIG - m) * n)) != 0)
            bad_m = -(int)m;
    }
    free(a);
    free(b);
    free(c0);
    free(ref);
    free(c);
    return bad_m;
}

int main(void) {
    static const int64_t widths[] = {1, 3, 4, 5, 12, 20, 64, 100};
    static const int64_t depths[] = {9, 64, 100};
    int saved = rl_blas_get_threads();
    for (int threads = 1; threads <= 2; threads++) {
        rl_blas_set_threads(threads);
        for (int f64 = 0; f64 <= 1; f64++)
            for (int tr = 0; tr < 4; tr++)
                for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
                    for (size_t d = 0; d < sizeof depths / sizeof *depths; d++)
                        for (int beta = 0; beta <= 1; beta++) {
                            int bad = check_case(f64, tr & 1, tr & 2, widths[w], depths[d], beta);
                            if (bad)
                                fprintf(stderr,
                                        "%s ta=%d tb=%d n=%lld k=%lld beta=%d threads=%d: M = %d "
                                        "%s\n",
                                        f64 ? "dgemm" : "sgemm", tr & 1, (tr & 2) != 0,
                                        (long long)widths[w], (long long)depths[d], beta, threads,
                                        bad < 0 ? -bad : bad,
                                        bad < 0 ? "wrote rows past M"
                                                : "rows differ from the 320-row product's");
                            CHECK(bad == 0);
                        }
    }
    rl_blas_set_threads(saved);
    TEST_MAIN_END();
}
