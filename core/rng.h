/* The one seeded random number generator of rnnlua (Philox4x32-10, see philox.h).
 *
 * The state is (seed, offset). A draw of n numbers uses the blocks offset .. offset+ceil(n/4)-1
 * (normal draws use 2n words) and advances offset past them, so the numbers depend only on
 * the seed and on the sequence of draws, never on the device or on the thread count. The
 * state is two integers, saved in checkpoints as they are. */
#ifndef RL_RNG_H
#define RL_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t seed;
    uint64_t offset; /* next unused Philox block */
} rl_rng;

void rl_rng_seed(rl_rng *g, uint64_t seed);
/* Reserves the blocks for `nwords` words; returns the first block's index. */
uint64_t rl_rng_reserve(rl_rng *g, uint64_t nwords);
/* The process-wide generator used by rl.manual_seed and by ops given no generator. */
rl_rng *rl_rng_default(void);

#ifdef __cplusplus
}
#endif

#endif
