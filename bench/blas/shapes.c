/* One sgemm shape through whichever CBLAS this program is linked against (bench/blas_compare.sh
 * builds it once per BLAS library Debian ships): row-major C (m x n) += op(A) op(B), threads
 * from the library's own environment variable. Prints the GFLOP/s of the calls made in
 * SECONDS (default 0.3) after one warm-up call.
 *   shapes TRANS_A TRANS_B M N K [SECONDS] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
/* the CBLAS prototype, declared here so that no library's header is needed */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s TRANS_A TRANS_B M N K [SECONDS]\n", argv[0]);
        return 2;
    }
    int ta = atoi(argv[1]), tb = atoi(argv[2]), m = atoi(argv[3]), n = atoi(argv[4]),
        k = atoi(argv[5]);
    double secs = argc > 6 ? atof(argv[6]) : 0.3;
    float *a = malloc(sizeof(float) * (size_t)m * (size_t)k),
          *b = malloc(sizeof(float) * (size_t)k * (size_t)n),
          *c = calloc((size_t)m * (size_t)n, sizeof(float));
    if (!a || !b || !c) return 1;
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++)
        a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * (size_t)n; i++)
        b[i] = (float)(i % 7) * 0.01f;
    int lda = ta ? m : k, ldb = tb ? k : n, oa = ta ? TRANS : NO_TRANS, ob = tb ? TRANS : NO_TRANS;
    cblas_sgemm(ROW_MAJOR, oa, ob, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
    long reps = 0;
    double t0 = now(), t;
    do {
        cblas_sgemm(ROW_MAJOR, oa, ob, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
        reps++;
    } while ((t = now() - t0) < secs);
    printf("%.1f\n", 2.0 * m * n * (double)k * (double)reps / t / 1e9);
    return 0;
}
