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

const char *rl_level_name(int level, const char *const *names, int n) {
    return level >= 0 && level < n ? names[level] : "unknown";
}

int rl_level_index(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

int rl_level_env(const char *env, const char *const *names, int n) {
    const char *s = getenv(env);
    return s && *s ? rl_level_index(s, names, n) : -1;
}

rl_status rl_level_check_set(const char *family, int level, int best, const char *const *names,
                             int n) {
    if (level >= 0 && level <= best) return RL_OK;
    return rl_error(RL_EARG, "%s level: %s is not supported by this CPU (best: %s)", family,
                    rl_level_name(level, names, n), rl_level_name(best, names, n));
}

const char *rl_cpu_level_name(rl_cpu_level level) {
    return rl_level_name((int)level, NAMES, N_LEVELS);
}

rl_status rl_cpu_level_from_name(const char *name, rl_cpu_level *out) {
    int i = rl_level_index(name, NAMES, N_LEVELS);
    if (i < 0) return rl_error(RL_EARG, "cpu level '%s': expected %s", name, NAME_LIST);
    *out = (rl_cpu_level)i;
    return RL_OK;
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

static int env_level(void) { return rl_level_env(ENV_NAME, NAMES, N_LEVELS); }

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
    RL_TRY(rl_level_check_set("cpu", (int)level, (int)rl_cpu_level_supported(), NAMES, N_LEVELS));
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
