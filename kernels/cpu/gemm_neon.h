/* The AArch64 Advanced SIMD kernel of the packed small-M GEMM (gemm_small.h), which
 * rl_gemm_packed_f32 runs at the RL_CPU_NEON level of cpu_level.h. Same operands and result as
 * rl_gemm_packed_f32 on one thread; defined on AArch64 only.
 */
#ifndef RL_KERNELS_CPU_GEMM_NEON_H
#define RL_KERNELS_CPU_GEMM_NEON_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __aarch64__
/* c (m x n, rows ldc apart) = a (m x k, rows lda apart) * packed (+ c with accumulate), where
 * packed is rl_gemm_pack_f32's layout of a k x n operand. */
void rl_gemm_packed_neon(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *packed, bool accumulate, float *c, int64_t ldc);
#endif

#ifdef __cplusplus
}
#endif

#endif
