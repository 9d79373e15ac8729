/* rnnlua's own float32 GEMMs, CPU: a few rows against a pre-packed right-hand side, and the
 * general product that core/blas.c runs for every float32 product at the avx2 and avx512 levels.
 *
 * The LSTM's per-step recurrent products are (B x H) x (H x 4H) forward and
 * (B x 4H) x (4H x H) backward with B small (16-64): a BLAS call repacks the whole large
 * operand on every step and reaches a fraction of the machine's GEMM speed. Here the large
 * operand is packed once (per forward or backward pass) into column panels of
 * RL_GEMM_PANEL columns, each stored k-major (panel p, row k: columns p*RL_GEMM_PANEL ..
 * +RL_GEMM_PANEL-1, zero-padded past n), and every step streams the panels through a
 * register-blocked kernel for AVX-512, AVX2+FMA or AArch64's NEON (gemm_neon.c), the best of
 * kernels/cpu/cpu_level.h's level.
 * At the generic level a portable loop computes the same result (rl_gemm_packed_fast() then
 * says false, so callers may prefer BLAS).
 *
 * The general product (rl_gemm_f32) runs the same register tiles over panels packed one at a
 * time, so that every float32 product gives each element the same chain of FMAs whatever the
 * number of rows: the promise that a sequence gives the same bits alone as in a batch, which
 * OpenBLAS's faster kernels do not keep.
 */
#ifndef RL_KERNELS_CPU_GEMM_SMALL_H
#define RL_KERNELS_CPU_GEMM_SMALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RL_GEMM_PANEL 48

/* Floats needed to pack a k x n operand. */
int64_t rl_gemm_packed_size(int64_t k, int64_t n);

/* Packs op(b) (k x n) into dst (rl_gemm_packed_size(k, n) floats): op(b)[i][j] is
 * b[i * ldb + j], or b[j * ldb + i] with trans. */
void rl_gemm_pack_f32(float *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n);

/* c (m x n, rows ldc apart) = a (m x k, rows lda apart) * packed (+ c with accumulate). */
void rl_gemm_packed_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *packed, bool accumulate, float *c, int64_t ldc);

/* The general float32 product of core/blas.c: c (m x n, rows ldc apart) = alpha * op(a) *
 * op(b) + beta * c, row-major, op(a) m x k (a stored k x m with trans_a), op(b) k x n, on the
 * calling thread (core/blas.c splits it over threads by whole columns or rows). Each element is
 * one chain of float32 FMAs over k in order, from zero, then alpha * sum + beta * c (c not read
 * when beta is 0): a row's bits depend neither on the rows around it nor on the thread split,
 * and are the same at the AVX-512 and AVX2 levels. Returns false, computing nothing, where the
 * level has no kernel (generic, non-x86) or the panel's scratch cannot be had: the caller then
 * uses BLAS. */
bool rl_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc);

/* Whether rl_gemm_f32 has a kernel at the current level (it computes rather than declines). */
bool rl_gemm_f32_fast(void);

/* Whether rl_gemm_f32 copies a transposed a row-major (it reads a transposed a in place for a
 * product of an untransposed b with few columns, at the avx512 level). */
bool rl_gemm_f32_copies_a(bool trans_a, bool trans_b, int64_t n);

/* Rows m0 .. m1-1 of op(a) = a' (a stored k x m, lda apart) copied row-major into t (m x k
 * floats, row r at t + r * k): what rl_gemm_f32 does with a transposed a, for a caller that
 * shares one copy among the parts of a product split by columns. */
void rl_gemm_f32_transpose(float *t, const float *a, int64_t lda, int64_t k, int64_t m0,
                           int64_t m1);

/* Whether rl_gemm_packed_f32 runs a vector kernel (AVX2+FMA, AVX-512, NEON) at the current
 * level; false while the calling thread has a bf16 context active (gemm_bf16.h), whose
 * products the callers then reach through rl_mat_gemm. */
bool rl_gemm_packed_fast(void);

#ifdef __cplusplus
}
#endif

#endif
