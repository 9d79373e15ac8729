/* Short parallel jobs on the CPU: a fixed pool of helper threads that the BLAS products
 * (core/blas.c: blocks of C; the BLAS library itself runs one thread), the packed small-M GEMM
 * (column panels of one product), the LSTM's and GRU's pointwise passes, the softmax passes and
 * the MDLSTM's diagonal sweep (one part per group of directions) hand their parts to.
 *
 * A recurrent step's product takes ~0.1-0.3 ms, so a handoff must cost microseconds, not the
 * tens of microseconds of creating or waking a thread: helpers spin on a generation counter for
 * a while after each job (about 100 us) and only then sleep on a futex. One caller at a time
 * uses the helpers; a second caller (a layer running concurrently on another thread, or a part
 * of a running job that calls a parallel kernel itself) runs its parts one after another on
 * its own thread. The results never depend on which thread ran a part.
 */
#ifndef RL_KERNELS_CPU_PARALLEL_H
#define RL_KERNELS_CPU_PARALLEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls fn(ctx, part, parts) for part = 0 .. parts-1, each on the calling thread or a helper,
 * whichever claims it first (or all on the caller, see above), and returns when every part is
 * done. Parts must not wait for each other: any of them may run after another on one thread.
 * parts is at most RL_CPU_MAX_PARTS (more are cut to it): the callers ask for one part per
 * thread (rl_blas_get_threads), and every product big enough to share is split here, so the
 * cap is that of a big machine's cores (OpenBLAS's own limit in Debian's build is 64). */
#define RL_CPU_MAX_PARTS 64
void rl_cpu_parallel(int parts, void (*fn)(void *ctx, int part, int parts), void *ctx);

/* How many parts a serial pass over `elements` values (packing or rounding a GEMM operand) gets
 * when it splits into `units` equal pieces (panels, row blocks): one per BLAS thread where the
 * pass is big enough (64K elements) for the handoff to cost less than the work, else 1. Such a
 * pass runs once per product while the other threads would wait for it. */
int rl_cpu_pass_parts(int64_t elements, int64_t units);

#ifdef __cplusplus
}
#endif

#endif
