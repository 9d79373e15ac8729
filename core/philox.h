/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
 * a counter-based generator. Block `counter` under `key` gives four 32-bit words; no state is
 * carried from one number to the next, so the CPU and CUDA produce the same stream by
 * computing the same blocks. Shared by the CPU loops and the CUDA kernels. */
#ifndef RL_PHILOX_H
#define RL_PHILOX_H

#include <stdint.h>

#include "hd.h"

typedef struct {
    uint32_t v[4];
} rl_philox_block;

static inline RL_HD void rl_philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

/* Four words for the 128-bit counter (c0 = low 64 bits of `counter`, c1 = `stream`) under the
 * 64-bit key `seed`. */
static inline RL_HD rl_philox_block rl_philox(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        rl_philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        rl_philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    rl_philox_block b = {{c0, c1, c2, c3}};
    return b;
}

/* Element i of a draw: word i % 4 of block (offset + i / 4). */
static inline RL_HD uint32_t rl_philox_word(uint64_t seed, uint64_t stream, uint64_t offset,
                                            uint64_t i) {
    rl_philox_block b = rl_philox(seed, stream, offset + i / 4);
    return b.v[i % 4];
}

/* A uniform float in [0, 1) from the top 24 bits, exactly representable in float32. */
static inline RL_HD float rl_u32_to_unit(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* A uniform double in (0, 1], never 0 (safe for log). */
static inline RL_HD double rl_u32_to_unit_open(uint32_t x) {
    return ((double)x + 1.0) * (1.0 / 4294967296.0);
}

#endif
