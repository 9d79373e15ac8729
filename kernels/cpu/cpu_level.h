/* The instruction-set level of the CPU kernels that are compiled more than once (the packed
 * small-M GEMM, the LSTM's and MDLSTM's fused pointwise passes) and picked at run time, so that
 * one binary runs its fastest path on AVX-512 machines and on AVX2-only ones alike.
 *
 * The level in use is the best the CPU supports, lowered by the environment variable
 * RL_CPU_LEVEL (generic, avx2, avx512; read once, at the first use) or by rl_cpu_level_set()
 * (the tests run every kernel at each level the machine has). A lower level runs the same
 * results through other code: AVX2+FMA kernels on an AVX-512 machine are those an AVX2-only
 * machine runs. Thread-safe; changing the level while kernels run on other threads is allowed
 * (each call reads it once).
 */
#ifndef RL_KERNELS_CPU_CPU_LEVEL_H
#define RL_KERNELS_CPU_CPU_LEVEL_H

#include "../../core/error.h"

/* For the kernels compiled once per level: RL_TARGET_AVX512, RL_TARGET_AVX2 (defined with
 * RL_CPU_X86 on x86-64 GCC) and RL_TARGET_BASE mark a function's instruction set. Their loops
 * vectorise only with the full cost model and without trapping-math (which keeps clamps as
 * branches); nothing there relies on FP exceptions, and NaN still propagates. */
#if defined(__GNUC__) && !defined(__clang__)
#define RL_VECTORISE optimize("O3", "no-trapping-math")
#define RL_IVDEP _Pragma("GCC ivdep")
#else
#define RL_VECTORISE
#define RL_IVDEP
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RL_CPU_X86 1
#define RL_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma"), RL_VECTORISE))
#define RL_TARGET_AVX2 __attribute__((target("avx2,fma"), RL_VECTORISE))
#endif
#define RL_TARGET_BASE __attribute__((RL_VECTORISE))

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_CPU_GENERIC = 0, /* portable C (vectorised for the build's -march) */
    RL_CPU_AVX2 = 1,    /* x86-64 AVX2 + FMA */
    RL_CPU_AVX512 = 2,  /* x86-64 AVX-512 F + VL */
} rl_cpu_level;

/* The level the kernels use now. */
rl_cpu_level rl_cpu_level_get(void);

/* The best level of this CPU (RL_CPU_GENERIC off x86-64). */
rl_cpu_level rl_cpu_level_supported(void);

/* Sets the level; RL_EARG (naming both) when the CPU does not support it. */
rl_status rl_cpu_level_set(rl_cpu_level level);

/* RL_EARG with a message when RL_CPU_LEVEL is set to anything but a level name, or names a
 * level this CPU lacks (rl_cpu_level_get() then ignores it, or uses the supported one); for
 * hosts to report at start-up. */
rl_status rl_cpu_level_check_env(void);

/* "generic", "avx2", "avx512". */
const char *rl_cpu_level_name(rl_cpu_level level);

#ifdef __cplusplus
}
#endif

#endif
