/* The CPU CTC kernel's internals, shared by its driver (kernels/cpu/ctc.c) and the two
 * instantiations of its per-sequence recursion (kernels/cpu/ctc_f32.c and ctc_f64.c, which
 * include kernels/cpu/ctc_seq.h with ctc_real = float and double). Not a public header. */
#ifndef RL_KERNELS_CPU_CTC_CPU_H
#define RL_KERNELS_CPU_CTC_CPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One call of rl_ctc_cpu: its arguments, the per-thread scratch and the queue. */
typedef struct rl_ctc_cpu_job {
    int64_t T, B, V, W; /* W = U_max + 2 */
    const void *logits;
    const int32_t *labels;
    int64_t sb, ss;
    const int32_t *in_len, *lab_len;
    int32_t blank;
    bool zero_inf;
    void *loss, *grad;
    size_t elem;
    char *work; /* per-thread blocks of `block` bytes after the order array */
    size_t block;
    const int64_t *order; /* sequences, longest first */
    atomic_long next;
    void (*seq)(const struct rl_ctc_cpu_job *job, int64_t b, void *scratch);
} rl_ctc_cpu_job;

/* Sequence b of the job: loss[b] and, with a gradient, its rows of grad; scratch: one
 * thread's block. */
void rl_ctc_cpu_seq_f32(const rl_ctc_cpu_job *j, int64_t b, void *scratch);
void rl_ctc_cpu_seq_f64(const rl_ctc_cpu_job *j, int64_t b, void *scratch);

/* Zero gradient rows of sequence b for frames t0..T-1. */
void rl_ctc_cpu_zero_rows(const rl_ctc_cpu_job *j, int64_t b, int64_t t0);

#endif
