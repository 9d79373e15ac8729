#include "rng.h"

static rl_rng rl_default_rng = {0x2545F4914F6CDD1DULL, 0};

void rl_rng_seed(rl_rng *g, uint64_t seed) {
    g->seed = seed;
    g->offset = 0;
}

uint64_t rl_rng_reserve(rl_rng *g, uint64_t nwords) {
    uint64_t first = g->offset;
    g->offset += (nwords + 3) / 4;
    return first;
}

rl_rng *rl_rng_default(void) { return &rl_default_rng; }
