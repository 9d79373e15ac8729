/* CPU BLAS dispatch (OpenBLAS, or BLIS with make BLAS=blis, through CBLAS). Row-major, as the
 * tensors are. C = alpha * op(A) * op(B) + beta * C with op(A) M x K, op(B) K x N, C M x N. */
#ifndef RL_BLAS_H
#define RL_BLAS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void rl_blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc);
void rl_blas_dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                   double *c, int64_t ldc);
/* Threads used by BLAS and by rnnlua's own CPU loops. */
void rl_blas_set_threads(int n);
int rl_blas_get_threads(void);
/* A thread count for the products and loops that the calling thread starts (0: the process's
 * again); rl_blas_get_threads answers it on that thread. The stream server's batch task runs
 * its usual small batches on one thread and a backlog on all. */
void rl_blas_set_local_threads(int n);
/* The BLAS library's kernels in use (OpenBLAS's core name, e.g. "SkylakeX"; "BLIS" and its
 * configuration); *found (when not NULL) the ones the library chose for itself, which rnnlua
 * replaces where they are below the CPU's level (core/blas.c). Chosen once, at the first product
 * or thread setting. */
const char *rl_blas_core(const char **found);

#ifdef __cplusplus
}
#endif

#endif
