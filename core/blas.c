#include "blas.h"

#include <stdatomic.h>
#include <unistd.h>

#include "../kernels/cpu/parallel.h"

/* One pool of threads for products: the BLAS library runs single-threaded, and a product big
 * enough to share is split into blocks of C (whole columns or whole rows, never K, so each
 * element's sum runs in the same order on any thread count) that rnnlua's helper pool
 * (kernels/cpu/parallel.c) deals out, the same helpers the packed small-M GEMM, the LSTM's and
 * GRU's pointwise passes and the MDLSTM sweep use. Before, OpenBLAS kept threads of its own
 * that spun with sched_yield between its calls, and on 2 cores the two pools' waiting threads
 * took cores from each other (15-17% of training samples in sched_yield). rl_threads is the
 * thread count of both. */
static atomic_int rl_threads; /* 0: not set yet, every CPU (or the library's env setting) */

#ifdef RL_BLAS_BLIS
/* BLIS (make BLAS=blis) through its CBLAS layer. */
#include <blis.h>
typedef f77_int blasint;

static int library_threads(void) {
    dim_t n = bli_thread_get_num_threads(); /* BLIS_NUM_THREADS, when set */
    return n < 1 ? 0 : (int)n;
}

static void library_single_thread(void) { bli_thread_set_num_threads(1); }
#else
#include <cblas.h>

static int library_threads(void) { return openblas_get_num_threads(); }

static void library_single_thread(void) { openblas_set_num_threads(1); }
#endif

/* The default, once: the library's own count (OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS) or every
 * CPU; from then on the library itself runs one thread. */
static int threads_now(void) {
    int n = atomic_load_explicit(&rl_threads, memory_order_relaxed);
    if (n > 0) return n;
    n = library_threads();
    if (n < 1) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (int)cpus : 1;
    }
    library_single_thread();
    int expected = 0;
    atomic_compare_exchange_strong(&rl_threads, &expected, n);
    return atomic_load(&rl_threads);
}

void rl_blas_set_threads(int n) {
    threads_now();
    atomic_store(&rl_threads, n < 1 ? 1 : n);
}

int rl_blas_get_threads(void) { return threads_now(); }

typedef struct {
    bool ta, tb, f64;
    int64_t m, n, k, lda, ldb, ldc;
    double alpha, beta;
    const void *a, *b;
    void *c;
    bool by_cols; /* split the columns of C (else its rows) */
    int64_t blocks;
} gemm_job;

/* Columns (rows) of C per block: a multiple of the kernels' vector width */
#define BLOCK 16

static void gemm_range(const gemm_job *j, int64_t m0, int64_t m, int64_t n0, int64_t n) {
    size_t es = j->f64 ? sizeof(double) : sizeof(float);
    /* A's rows m0.. are row m0 of A, or column m0 of the stored A' (K x M); likewise B */
    const char *a = (const char *)j->a + es * (size_t)(j->ta ? m0 : m0 * j->lda);
    const char *b = (const char *)j->b + es * (size_t)(j->tb ? n0 * j->ldb : n0);
    char *c = (char *)j->c + es * (size_t)(m0 * j->ldc + n0);
    enum CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans,
                         tb = j->tb ? CblasTrans : CblasNoTrans;
    if (j->f64)
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)j->k, j->alpha,
                    (const double *)a, (blasint)j->lda, (const double *)b, (blasint)j->ldb, j->beta,
                    (double *)c, (blasint)j->ldc);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)j->k, (float)j->alpha,
                    (const float *)a, (blasint)j->lda, (const float *)b, (blasint)j->ldb,
                    (float)j->beta, (float *)c, (blasint)j->ldc);
}

static void gemm_part(void *ctx, int part, int parts) {
    const gemm_job *j = ctx;
    int64_t b0 = j->blocks * part / parts * BLOCK, b1 = j->blocks * (part + 1) / parts * BLOCK;
    int64_t len = j->by_cols ? j->n : j->m;
    if (b1 > len) b1 = len;
    if (b0 >= b1) return;
    if (j->by_cols)
        gemm_range(j, 0, j->m, b0, b1 - b0);
    else
        gemm_range(j, b0, b1 - b0, 0, j->n);
}

/* Below ~1 MFLOP per part (~10 us) a handoff costs more than it saves. It was 4 MFLOP, which
 * left the few-row products of a decoder step serial (G2P: the readout's 64 x 384 x 128, the
 * attention's 64 x 128 x 128 and their gradients): the 2-thread G2P step took 11.89 ms at 1
 * MFLOP, 12.36 at 4 (medians of 7 interleaved rounds, quiet machine); 0.5 MFLOP was no better
 * (12.51 against 12.24). */
#define MIN_PART_FLOP 1000000

static void gemm(gemm_job *j) {
    j->by_cols = j->n >= j->m;
    j->blocks = ((j->by_cols ? j->n : j->m) + BLOCK - 1) / BLOCK;
    int parts = threads_now();
    double flop = 2.0 * (double)j->m * (double)j->n * (double)j->k;
    if (parts > j->blocks) parts = (int)j->blocks;
    if (parts > flop / MIN_PART_FLOP) parts = (int)(flop / MIN_PART_FLOP);
    if (parts > 1)
        rl_cpu_parallel(parts, gemm_part, j);
    else
        gemm_range(j, 0, j->m, 0, j->n);
}

void rl_blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc) {
    gemm_job j = {.ta = trans_a,
                  .tb = trans_b,
                  .m = m,
                  .n = n,
                  .k = k,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta,
                  .a = a,
                  .b = b,
                  .c = c};
    gemm(&j);
}

void rl_blas_dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                   double *c, int64_t ldc) {
    gemm_job j = {.ta = trans_a,
                  .tb = trans_b,
                  .f64 = true,
                  .m = m,
                  .n = n,
                  .k = k,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta,
                  .a = a,
                  .b = b,
                  .c = c};
    gemm(&j);
}
