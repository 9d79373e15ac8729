/* The int8 matrix product of the CPU, as PyTorch's dynamic quantization does it for Linear and
 * LSTM layers: C (m x n, float32) = alpha * dequant(quant(op(A)) * quant(op(B))) + beta * C.
 *
 *  - op(B) (the weights, k x n) is quantized once per column, i.e. per output unit:
 *    s_j = max_l |op(B)[l][j]| / 127, q = round(op(B) / s_j) in [-127, 127];
 *  - op(A) (the activations, m x k) is quantized on each call, per row (per time step and
 *    batch row): s_i = max_l |op(A)[i][l]| / 127, q = round(op(A) / s_i) in [-127, 127];
 *  - the products of the quantized values are summed exactly in int32 and the sum scaled back
 *    by s_i s_j in float32.
 * Each quantized element is off by at most half its step, so per element
 *     |c - exact| <= |alpha| (s_i/2 sum_l |b_lj| + s_j/2 sum_l |a_il| + k s_i s_j / 4)
 * plus the float32 rounding of the final scaling (tests/c/test_gemm_int8.c checks that bound).
 * NaN or infinity in a row of op(A) (a column of op(B)) makes that row (column) of C NaN.
 *
 * Packed op(B): column scales and column sums (float32[np], int32[np], np = n rounded up to
 * RL_INT8_COLS), then panels of 16 columns, each k rounded up to 4 as quads: panel p, quad r,
 * column jj holds the 4 bytes q[4r..4r+3][16p + jj] (zeros past k and n): the operand layout of
 * AVX512-VNNI's vpdpbusd. That instruction multiplies unsigned by signed bytes, so the
 * activations go in with an offset of 128 (0..255), and the offset's share, 128 times the
 * column's sum of quantized weights, is taken off the int32 sum.
 *
 * Two kernels, the int8 level (chosen at run time): generic (portable C, the same int32 sums)
 * and avx512vnni (vpdpbusd, 4 rows x 64 columns of C in registers). RL_CPU_LEVEL below avx512
 * (cpu_level.h) runs the generic one; so does rl_int8_level_set(RL_INT8_GENERIC). Both levels
 * compute the same integer sums; the float32 scaling may round differently in the last bit.
 */
#ifndef RL_KERNELS_CPU_GEMM_INT8_H
#define RL_KERNELS_CPU_GEMM_INT8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RL_INT8_PANEL 16
#define RL_INT8_COLS 64 /* columns of one kernel tile: packs hold whole tiles */

typedef enum {
    RL_INT8_GENERIC = 0,
    RL_INT8_AVX512VNNI = 1,
} rl_int8_level;

/* The level in use now (each product reads it once). */
rl_int8_level rl_int8_level_get(void);
/* The best level of this CPU. */
rl_int8_level rl_int8_level_supported(void);
/* Sets the level; RL_EARG (naming both) when the CPU does not support it. */
rl_status rl_int8_level_set(rl_int8_level level);
/* "generic", "avx512vnni"; "unknown" otherwise. */
const char *rl_int8_level_name(rl_int8_level level);

/* Bytes needed to pack a k x n operand (a multiple of 64). */
size_t rl_int8_packed_bytes(int64_t k, int64_t n);

/* Quantizes and packs op(b) (k x n; op(b)[i][j] is b[i * ldb + j], or b[j * ldb + i] with trans)
 * into dst (rl_int8_packed_bytes(k, n) bytes, 64-byte aligned). */
void rl_int8_pack(void *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n);

/* c (m x n, rows ldc apart) = alpha * q(op(a)) * packed + beta * c, op(a) (m x k) being
 * a[i * lda + l], or a[l * lda + i] with trans_a. With beta == 0 c is only written.
 * RL_ENOMEM when the scratch for the quantized op(a) cannot grow. */
rl_status rl_gemm_int8_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const void *packed, float beta, float *c,
                              int64_t ldc);

/* The same with op(b) given as float32, quantized into a per-thread scratch on each call. */
rl_status rl_gemm_int8(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif
