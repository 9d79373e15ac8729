/* The instruction-set level of the CPU kernels that are compiled more than once (the packed
 * small-M GEMM, the LSTM's, GRU's, janet's and MDLSTM's fused pointwise passes, the softmax rows)
 * and picked at run time, so that one binary runs its fastest path on AVX-512 machines and on
 * AVX2-only ones alike.
 *
 * Levels are ranks within one architecture, 0 being plain C: x86-64 has generic, avx2 and
 * avx512; AArch64 has generic and neon (the packed GEMM's Advanced SIMD kernel; the pointwise
 * passes are the generic loops, which GCC vectorises with Advanced SIMD there, as it is part
 * of every AArch64 CPU). The level in use is the best the CPU supports, lowered by the
 * environment variable RL_CPU_LEVEL (a level name; read once, at the first use) or by
 * rl_cpu_level_set() (the tests run every kernel at each level the machine has). A lower level
 * runs the same results through other code. Thread-safe; changing the level while kernels run
 * on other threads is allowed (each call reads it once).
 *
 * What a level's code may contain depends on the build's -march as well: a target attribute
 * adds instructions to -march's, it never removes any. Built with -march=native on an AVX-512
 * machine, the "avx2" kernels and the generic code use AVX-512 too (GCC also refuses to inline
 * the shared pointwise formulas into a function compiled for less than -march, so they cannot
 * be held back per function); only a build for a lower -march, e.g. `make ARCH=x86-64-v3`,
 * runs on an AVX-512 machine what an AVX2-only machine runs. CI tests that build at the avx2
 * level and an ARCH=x86-64 build at the generic level.
 */
#ifndef RL_KERNELS_CPU_CPU_LEVEL_H
#define RL_KERNELS_CPU_CPU_LEVEL_H

#include "../../core/error.h"

/* For the kernels compiled once per level: RL_TARGET_AVX512, RL_TARGET_AVX2 (defined with
 * RL_CPU_X86 on x86-64 GCC) and RL_TARGET_BASE mark a function's instruction set. Their loops
 * vectorise only with the full cost model and without trapping-math (which keeps clamps as
 * branches); nothing there relies on FP exceptions, and NaN still propagates. fp-contract=fast
 * fuses a * b + c into one FMA where the target has it (-std=c11 turns that off): the
 * polynomials of kernels/pointwise.h are chains of them, and an AVX2 core, with half the
 * vector width of AVX-512 and 16 registers, is bound by the instruction count there (the
 * LSTM's forward pass -28%). Each kernel still gives the same results on every thread count;
 * a level's results may differ in the last bits from another's (as the GEMMs' already do). */
#if defined(__GNUC__) && !defined(__clang__)
#define RL_VECTORISE optimize("O3", "no-trapping-math", "fp-contract=fast")
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

/* Defines NAME PARAMS (a void function) running BODY ARGS, BODY an always-inline function, compiled
 * once per level (static NAME_avx512, NAME_avx2 on x86-64, NAME_base) and picked by
 * rl_cpu_level_get() at each call. PARAMS and ARGS are parenthesised lists. */
#ifdef RL_CPU_X86
#define RL_CPU_LEVELS(NAME, BODY, PARAMS, ARGS)                                                    \
    RL_TARGET_AVX512 static void NAME##_avx512 PARAMS { BODY ARGS; }                               \
    RL_TARGET_AVX2 static void NAME##_avx2 PARAMS { BODY ARGS; }                                   \
    RL_TARGET_BASE static void NAME##_base PARAMS { BODY ARGS; }                                   \
    void NAME PARAMS {                                                                             \
        switch (rl_cpu_level_get()) {                                                              \
        case RL_CPU_AVX512: NAME##_avx512 ARGS; return;                                            \
        case RL_CPU_AVX2: NAME##_avx2 ARGS; return;                                                \
        default: NAME##_base ARGS; return;                                                         \
        }                                                                                          \
    }
#else
#define RL_CPU_LEVELS(NAME, BODY, PARAMS, ARGS)                                                    \
    RL_TARGET_BASE void NAME PARAMS { BODY ARGS; }
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_CPU_GENERIC = 0, /* portable C (vectorised for the build's -march) */
    RL_CPU_AVX2 = 1,    /* x86-64 AVX2 + FMA */
    RL_CPU_AVX512 = 2,  /* x86-64 AVX-512 F + VL */
    RL_CPU_NEON = 1,    /* AArch64 Advanced SIMD: rank 1 of that architecture */
} rl_cpu_level;

/* The level the kernels use now. */
rl_cpu_level rl_cpu_level_get(void);

/* The best level of this CPU (RL_CPU_GENERIC off x86-64 and AArch64). */
rl_cpu_level rl_cpu_level_supported(void);

/* Sets the level; RL_EARG (naming both) when the CPU does not support it. */
rl_status rl_cpu_level_set(rl_cpu_level level);

/* RL_EARG with a message when RL_CPU_LEVEL is set to anything but a level name, or names a
 * level this CPU lacks (rl_cpu_level_get() then ignores it, or uses the supported one); for
 * hosts to report at start-up. */
rl_status rl_cpu_level_check_env(void);

/* "generic", "avx2", "avx512" on x86-64, "generic", "neon" on AArch64; "unknown" past the
 * architecture's levels. */
const char *rl_cpu_level_name(rl_cpu_level level);

/* The level of that name on this architecture; RL_EARG naming the valid ones otherwise. */
rl_status rl_cpu_level_from_name(const char *name, rl_cpu_level *out);

/* Shared by the level families (these levels, the bf16 GEMM's in gemm_bf16.c), each a list of
 * names ranked from 0: rl_level_name gives names[level] or "unknown"; rl_level_index the rank
 * of name, or -1; rl_level_env the rank named by the environment variable env, or -1 when it is
 * unset, empty or no name; rl_level_check_set RL_EARG naming the family and both levels when
 * level is outside 0..best. */
const char *rl_level_name(int level, const char *const *names, int n);
int rl_level_index(const char *name, const char *const *names, int n);
int rl_level_env(const char *env, const char *const *names, int n);
rl_status rl_level_check_set(const char *family, int level, int best, const char *const *names,
                             int n);

#ifdef __cplusplus
}
#endif

#endif
