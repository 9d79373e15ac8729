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
 * Four kernels, the int8 level (chosen at run time): generic (portable C), avx2 (vpmaddubsw of
 * the activations' magnitudes by the weights with their signs, which provably never saturates
 * at magnitudes <= 127, then vpmaddwd by ones: 2 rows x 32 columns of C in registers), avxvnni
 * (AVX-VNNI's vpdpbusd on ymm, Alder Lake and later, Zen 5: 2 rows x 32 columns) and avx512vnni
 * (vpdpbusd on zmm, 4 rows x 64 columns). RL_CPU_LEVEL=avx2 (cpu_level.h) caps it at avxvnni,
 * generic at generic; RL_INT8_LEVEL (a level name, read at the first use) or
 * rl_int8_level_set() lowers it. Every level computes the same integer sums and scales them
 * with the same float32 steps: the results are the same bits at every level.
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
    RL_INT8_AVX2 = 1,       /* vpmaddubsw + vpmaddwd on ymm */
    RL_INT8_AVXVNNI = 2,    /* AVX-VNNI vpdpbusd on ymm */
    RL_INT8_AVX512VNNI = 3, /* AVX512-VNNI vpdpbusd on zmm */
} rl_int8_level;

/* The level in use now (each product reads it once): the one set (else RL_INT8_LEVEL's, else
 * the best), at most the best, capped by the kernel level (RL_CPU_LEVEL=avx2: avxvnni at most;
 * generic: generic), and stepped down past levels this CPU lacks. */
rl_int8_level rl_int8_level_get(void);
/* The best level of this CPU. */
rl_int8_level rl_int8_level_supported(void);
/* Whether this CPU has that level's instructions (an AVX-512 CPU may lack AVX-VNNI). */
bool rl_int8_level_available(rl_int8_level level);
/* Sets the level; RL_EARG (naming both) when the CPU does not support it. */
rl_status rl_int8_level_set(rl_int8_level level);
/* "generic", "avx2", "avxvnni", "avx512vnni"; "unknown" otherwise. */
const char *rl_int8_level_name(rl_int8_level level);
/* The level of that name; RL_EARG naming the valid ones otherwise. */
rl_status rl_int8_level_from_name(const char *name, rl_int8_level *out);
/* RL_EARG with a message when RL_INT8_LEVEL names no level (for hosts, at start-up; a level
 * the CPU lacks runs the next one down). */
rl_status rl_int8_level_check_env(void);

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
