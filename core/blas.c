#include "blas.h"

#ifdef RL_BLAS_BLIS
/* BLIS (make BLAS=blis) through its CBLAS layer. */
#include <blis.h>
#include <unistd.h>
typedef f77_int blasint;

/* BLIS runs one thread unless told otherwise; rnnlua's default, as OpenBLAS's, is every CPU
 * (BLIS_NUM_THREADS, when set, wins). */
static void blis_default_threads(void) {
    static int done;
    if (done) return;
    done = 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (bli_thread_get_num_threads() < 1 && n > 0) bli_thread_set_num_threads((dim_t)n);
}

void rl_blas_set_threads(int n) {
    blis_default_threads();
    bli_thread_set_num_threads((dim_t)n);
}

int rl_blas_get_threads(void) {
    blis_default_threads();
    dim_t n = bli_thread_get_num_threads();
    return n < 1 ? 1 : (int)n;
}
#else
#include <cblas.h>

void rl_blas_set_threads(int n) { openblas_set_num_threads(n); }

int rl_blas_get_threads(void) { return openblas_get_num_threads(); }
#endif

void rl_blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void rl_blas_dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                   double *c, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}
