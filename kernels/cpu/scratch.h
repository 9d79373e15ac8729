/* Per-thread scratch buffers of the CPU products (core/blas.c's row groups, the bf16 and int8
 * GEMMs' rounded or quantized operands and packed panels): one buffer per slot and thread, 64-byte
 * aligned, that only grows, so steady products of one shape allocate nothing; a thread's buffers
 * are freed when it ends. */
#ifndef RL_KERNELS_CPU_SCRATCH_H
#define RL_KERNELS_CPU_SCRATCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_SCRATCH_BLAS_ROWS,
    RL_SCRATCH_BF16,
    RL_SCRATCH_INT8_A,
    RL_SCRATCH_INT8_B,
    RL_SCRATCH_F32_PANEL,
    RL_SCRATCH_F32_A,
    RL_SCRATCH_F32_A_SHARED,
    RL_SCRATCH_F32_SUMS,
    RL_SCRATCH_SLOTS
} rl_scratch_slot;

/* This thread's buffer of `slot`, at least `bytes` long (its contents are not kept when it
 * grows), or NULL when it cannot grow: then, with `what` (e.g. "bf16 gemm: the packed right
 * operand"), the error says so (rl_errmsg); with what NULL the caller falls back quietly. */
void *rl_thread_scratch(rl_scratch_slot slot, size_t bytes, const char *what);

#ifdef __cplusplus
}
#endif

#endif
