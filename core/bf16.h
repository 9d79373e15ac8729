/* bfloat16: the upper 16 bits of a float32 (sign, 8 exponent bits, 7 stored significand bits),
 * the one definition of both conversions, for the bf16 products (kernels/cpu/gemm_bf16.c) and
 * their tests. The significand has 8 bits with the implicit one, so rounding a float32 to
 * bf16 changes it by at most 2^-8 of its magnitude (the unit roundoff the tests' tolerances
 * are derived from), and a product of two bf16 values is exact in float32 (8 + 8 <= 24 bits).
 */
#ifndef RL_BF16_H
#define RL_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest, ties to even. NaN stays NaN (made quiet, so that dropping the low bits
 * can never turn a NaN into an infinity); values past bf16's largest round to infinity as
 * float32's rounding does. */
static inline uint16_t rl_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float rl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
