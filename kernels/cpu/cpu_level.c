/* The run-time instruction-set level of cpu_level.h. */
#include "cpu_level.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ENV_NAME "RL_CPU_LEVEL"

/* This architecture's levels by rank, and the list for messages. */
#if defined(__x86_64__)
static const char *const NAMES[] = {"generic", "avx2", "avx512"};
#define NAME_LIST "generic, avx2 or avx512"
#elif defined(__aarch64__)
static const char *const NAMES[] = {"generic", "neon"};
#define NAME_LIST "generic or neon"
#else
static const char *const NAMES[] = {"generic"};
#define NAME_LIST "generic"
#endif
#define N_LEVELS ((int)(sizeof NAMES / sizeof NAMES[0]))

const char *rl_cpu_level_name(rl_cpu_level level) {
    return (int)level >= 0 && (int)level < N_LEVELS ? NAMES[level] : "unknown";
}

rl_status rl_cpu_level_from_name(const char *name, rl_cpu_level *out) {
    for (int i = 0; i < N_LEVELS; i++)
        if (strcmp(name, NAMES[i]) == 0) {
            *out = (rl_cpu_level)i;
            return RL_OK;
        }
    return rl_error(RL_EARG, "cpu level '%s': expected %s", name, NAME_LIST);
}

rl_cpu_level rl_cpu_level_supported(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return RL_CPU_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return RL_CPU_AVX2;
#elif defined(__aarch64__)
    return RL_CPU_NEON; /* Advanced SIMD is part of every AArch64 CPU that Linux runs on */
#endif
    return RL_CPU_GENERIC;
}

/* -1: the environment is not read yet, or it named nothing valid */
static int env_level(void) {
    const char *s = getenv(ENV_NAME);
    if (!s || !*s) return -1;
    for (int i = 0; i < N_LEVELS; i++)
        if (strcmp(s, NAMES[i]) == 0) return i;
    return -1;
}

static atomic_int current = -1;

rl_cpu_level rl_cpu_level_get(void) {
    int l = atomic_load_explicit(&current, memory_order_relaxed);
    if (l >= 0) return (rl_cpu_level)l;
    int best = (int)rl_cpu_level_supported(), want = env_level();
    l = want >= 0 && want < best ? want : best;
    atomic_store_explicit(&current, l, memory_order_relaxed);
    return (rl_cpu_level)l;
}

rl_status rl_cpu_level_set(rl_cpu_level level) {
    rl_cpu_level best = rl_cpu_level_supported();
    if ((int)level < 0 || level > best)
        return rl_error(RL_EARG, "cpu level: %s is not supported by this CPU (best: %s)",
                        rl_cpu_level_name(level), rl_cpu_level_name(best));
    atomic_store_explicit(&current, (int)level, memory_order_relaxed);
    return RL_OK;
}

rl_status rl_cpu_level_check_env(void) {
    const char *s = getenv(ENV_NAME);
    if (!s || !*s) return RL_OK;
    int want = env_level();
    if (want < 0) return rl_error(RL_EARG, "%s=%s: expected %s", ENV_NAME, s, NAME_LIST);
    rl_cpu_level best = rl_cpu_level_supported();
    if (want > (int)best)
        return rl_error(RL_EARG, "%s=%s: this CPU supports at most %s", ENV_NAME, s,
                        rl_cpu_level_name(best));
    return RL_OK;
}
