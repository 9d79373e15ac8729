#include "blas.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/cpu/cpu_level.h"
#include "../kernels/cpu/gemm_small.h"
#include "../kernels/cpu/parallel.h"
#include "../kernels/cpu/scratch.h"

/* One pool of threads for products: the BLAS library runs single-threaded, and a product big
 * enough to share is split into blocks of C (whole columns or whole rows, never K, so each
 * element's sum runs in the same order on any thread count) that rnnlua's helper pool
 * (kernels/cpu/parallel.c) deals out, the same helpers the packed small-M GEMM, the LSTM's and
 * GRU's pointwise passes and the MDLSTM sweep use. The library gets no threads of its own
 * because its pool would spin with sched_yield between calls beside rnnlua's, and on a machine
 * with few cores the two pools' waiting threads take the cores from each other. rl_threads is
 * the thread count of both. */
static atomic_int rl_threads; /* 0: not set yet, every CPU (or the library's env setting) */
static _Thread_local int local_threads;    /* rl_blas_set_local_threads; 0: rl_threads */
static char core_found[32], core_used[32]; /* rl_blas_core's answers */

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

/* At the avx2 and avx512 levels, float32 products run rnnlua's own kernels (rl_gemm_f32 of
 * kernels/cpu/gemm_small.h: each element one chain of FMAs, so a row has the same bits at any
 * row count); OpenBLAS runs the float64 products, and the float32 ones at the generic level.
 * rnnlua promises that a sequence gives the same bits alone as inside a batch
 * (tests/c/test_blas.c), and which of OpenBLAS's kernels keep that promise depends on its core:
 * its AVX-512 ones (SkylakeX, Cooperlake, SapphireRapids) take other kernels for products under
 * 10^6 multiply-adds (float32 and float64 rows then differ), its AVX2 ones (Haswell, Zen) give
 * other float32 bits for row counts off their blocking but keep float64's, its AVX ones
 * (Sandybridge) and older keep both. Debian's OpenBLAS (DYNAMIC_ARCH) picks its core by the
 * CPU's family and model when it is loaded, and a model it does not know gets the generic SSE3
 * kernels ("Prescott": OpenBLAS 0.3.21 on an Emerald Rapids Xeon, family 6, model 207). So
 * once, before the first product, when no product can be running, rnnlua has it load the
 * fastest kernels that keep the promise: Haswell where rnnlua's level is avx2 or avx512 (unless
 * it chose Haswell or Zen), Sandybridge at the generic level where it chose AVX2 or AVX-512
 * ones; through the entry points its loader uses and the OPENBLAS_CORETYPE variable it reads
 * there, restored afterwards. A user's own OPENBLAS_CORETYPE is followed as it is, and an
 * OpenBLAS without these entry points (built for one CPU) is left alone. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

#ifdef __x86_64__
/* Whether OpenBLAS's core `name` has kernels of AVX or later */
static bool core_has_avx(const char *name) {
    static const char *const avx[] = {"Sandybridge", "Haswell",        "Zen",       "SkylakeX",
                                      "Cooperlake",  "SapphireRapids", "Bulldozer", "Piledriver",
                                      "Steamroller", "Excavator"};
    for (size_t i = 0; i < sizeof avx / sizeof *avx; i++)
        if (!strcmp(name, avx[i])) return true;
    return false;
}
#endif

static void copy_name(char *dst, const char *src) {
    snprintf(dst, sizeof core_found, "%s", src ? src : "unknown");
}

static void library_core(void) {
    copy_name(core_found, openblas_get_corename());
    copy_name(core_used, core_found);
#ifdef __x86_64__
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || getenv("OPENBLAS_CORETYPE")) return;
    const char *want = NULL;
    if (rl_cpu_level_get() >= RL_CPU_AVX2) {
        if (strcmp(core_found, "Haswell") != 0 && strcmp(core_found, "Zen") != 0) want = "Haswell";
    } else if (core_has_avx(core_found) && strcmp(core_found, "Sandybridge") != 0) {
        want = "Sandybridge";
    }
    if (!want || setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    copy_name(core_used, openblas_get_corename());
#endif
}
#endif

static pthread_once_t core_once = PTHREAD_ONCE_INIT;

static void choose_core(void) {
#ifdef RL_BLAS_BLIS
    snprintf(core_used, sizeof core_used, "BLIS");
#else
    library_core();
#endif
}

const char *rl_blas_core(const char **found) {
    pthread_once(&core_once, choose_core);
#ifdef RL_BLAS_BLIS
    if (found) *found = core_used;
#else
    if (found) *found = core_found;
#endif
    return core_used;
}

/* The default, once: the library's own count (OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS) or every
 * CPU; from then on the library itself runs one thread. */
static int threads_now(void) {
    int n = atomic_load_explicit(&rl_threads, memory_order_acquire);
    if (n > 0) return n;
    rl_blas_core(NULL);
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

void rl_blas_set_local_threads(int n) { local_threads = n < 0 ? 0 : n; }

int rl_blas_get_threads(void) { return local_threads > 0 ? local_threads : threads_now(); }

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

static void library_gemm(bool f64, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                         double beta, void *c, int64_t ldc) {
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans,
                         tb = trans_b ? CblasTrans : CblasNoTrans;
    if (f64)
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, alpha,
                    (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb, beta,
                    (double *)c, (blasint)ldc);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)alpha,
                    (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb, (float)beta,
                    (float *)c, (blasint)ldc);
}

/* The last m % 4 rows of C computed as the first rows of a four-row product. OpenBLAS on some
 * CPUs (seen on an AVX-512 Xeon with OpenBLAS 0.3.21, not on AMD Zen 4) computes a product's
 * last rows, when M is not a multiple of 4, with other kernels whose sums round differently
 * (every such M where N % 8 >= 4, odd M for other N). A frame's output would then depend on
 * its row's place among the T * B rows, a sequence alone would not give the bits it gives
 * inside a batch, and rnnlua serve's answers would depend on which requests it batched
 * together. Rows of groups of four are what every M gives. The scratch is per thread and only
 * grows, so steady batches of one shape allocate nothing; if it cannot grow, the library runs
 * the rows as they are (right to rounding). */
#define ROW_GROUP 4

/* rows (< ROW_GROUP) rows of A from a (row 0 of them) into C at c, n columns */
static bool gemm_tail_rows(const gemm_job *j, int64_t rows, const char *a, const char *b, char *c,
                           int64_t n) {
    size_t es = j->f64 ? sizeof(double) : sizeof(float);
    size_t need = es * (size_t)(ROW_GROUP * (j->k + n));
    char *a2 = rl_thread_scratch(RL_SCRATCH_BLAS_ROWS, need, NULL);
    if (!a2) return false;
    char *c2 = a2 + es * (size_t)(ROW_GROUP * j->k);
    /* the caller's transposition, so the same packing and kernels run: A's rows are rows of
     * A (lda apart) or columns of the stored A' (K x M); rows past `rows` are zeros */
    memset(a2, 0, es * (size_t)(ROW_GROUP * j->k));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < j->k; i++)
            memcpy(a2 + es * (size_t)(j->ta ? i * ROW_GROUP + r : r * j->k + i),
                   a + es * (size_t)(j->ta ? i * j->lda + r : r * j->lda + i), es);
    if (j->beta != 0) {
        memset(c2, 0, es * (size_t)(ROW_GROUP * n));
        for (int64_t r = 0; r < rows; r++)
            memcpy(c2 + es * (size_t)(r * n), c + es * (size_t)(r * j->ldc), es * (size_t)n);
    }
    library_gemm(j->f64, j->ta, j->tb, ROW_GROUP, n, j->k, j->alpha, a2, j->ta ? ROW_GROUP : j->k,
                 b, j->ldb, j->beta, c2, n);
    for (int64_t r = 0; r < rows; r++)
        memcpy(c + es * (size_t)(r * j->ldc), c2 + es * (size_t)(r * n), es * (size_t)n);
    return true;
}

static void gemm_range(const gemm_job *j, int64_t m0, int64_t m, int64_t n0, int64_t n) {
    size_t es = j->f64 ? sizeof(double) : sizeof(float);
    /* A's rows m0.. are row m0 of A, or column m0 of the stored A' (K x M); likewise B */
    const char *a = (const char *)j->a + es * (size_t)(j->ta ? m0 : m0 * j->lda);
    const char *b = (const char *)j->b + es * (size_t)(j->tb ? n0 * j->ldb : n0);
    char *c = (char *)j->c + es * (size_t)(m0 * j->ldc + n0);
    if (!j->f64 && rl_gemm_f32(j->ta, j->tb, m, n, j->k, (float)j->alpha, (const float *)a, j->lda,
                               (const float *)b, j->ldb, (float)j->beta, (float *)c, j->ldc))
        return;
    int64_t tail = j->k > 0 ? m % ROW_GROUP : 0, body = m - tail;
    if (body > 0)
        library_gemm(j->f64, j->ta, j->tb, body, n, j->k, j->alpha, a, j->lda, b, j->ldb, j->beta,
                     c, j->ldc);
    if (tail == 0) return;
    const char *a_tail = a + es * (size_t)(j->ta ? body : body * j->lda);
    char *c_tail = c + es * (size_t)(body * j->ldc);
    if (!gemm_tail_rows(j, tail, a_tail, b, c_tail, n))
        library_gemm(j->f64, j->ta, j->tb, tail, n, j->k, j->alpha, a_tail, j->lda, b, j->ldb,
                     j->beta, c_tail, j->ldc);
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

/* Below ~1 MFLOP per part (~10 us) a handoff costs more than it saves. A higher threshold (4
 * MFLOP) leaves the few-row products of a decoder step serial (G2P: the readout's 64 x 384 x 128,
 * the attention's 64 x 128 x 128 and their gradients): the 2-thread G2P step takes 11.89 ms at 1
 * MFLOP, 12.36 at 4 (medians of 7 interleaved rounds, quiet machine); 0.5 MFLOP is no better
 * (12.51 against 12.24). */
#define MIN_PART_FLOP 1000000

typedef struct {
    float *t;
    const float *a;
    int64_t lda, m, k;
} transpose_job;

static void transpose_part(void *ctx, int part, int parts) {
    const transpose_job *t = ctx;
    rl_gemm_f32_transpose(t->t, t->a, t->lda, t->k, t->m * part / parts, t->m * (part + 1) / parts);
}

/* A float32 product with a transposed A split by columns would have every part copy all of A
 * row-major for rnnlua's kernels (gemm_small.h): the parts copy their share of it once, into
 * the calling thread's scratch, and all multiply from there. False when the scratch cannot
 * grow (then each part copies for itself). */
static bool share_transposed_a(gemm_job *j, int parts) {
    if (j->f64 || !j->by_cols || j->k <= 0 || !rl_gemm_f32_copies_a(j->ta, j->tb, j->n))
        return false;
    float *t =
        rl_thread_scratch(RL_SCRATCH_F32_A_SHARED, sizeof(float) * (size_t)(j->m * j->k), NULL);
    if (!t) return false;
    transpose_job tj = {t, j->a, j->lda, j->m, j->k};
    rl_cpu_parallel(parts, transpose_part, &tj);
    j->a = t;
    j->lda = j->k;
    j->ta = false;
    return true;
}

static void gemm(gemm_job *j) {
    j->by_cols = j->n >= j->m;
    j->blocks = ((j->by_cols ? j->n : j->m) + BLOCK - 1) / BLOCK;
    int parts = rl_blas_get_threads();
    double flop = 2.0 * (double)j->m * (double)j->n * (double)j->k;
    if (parts > j->blocks) parts = (int)j->blocks;
    if (parts > flop / MIN_PART_FLOP) parts = (int)(flop / MIN_PART_FLOP);
    if (parts > 1) share_transposed_a(j, parts);
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
