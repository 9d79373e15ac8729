/* The CTC loss and gradient on the CPU (see kernels/ctc.h; formulas in kernels/ctc_step.h): the
 * driver. The per-sequence recursion is written once, in kernels/cpu/ctc_seq.h, and compiled
 * for float32 (kernels/cpu/ctc_f32.c) and float64 (kernels/cpu/ctc_f64.c).
 *
 * One sequence at a time per thread, longest (T_b * U_b) first from a shared counter, so the
 * threads finish together; each thread has its own scratch block (layout in ctc_seq.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../ctc.h"
#include "ctc_cpu.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t block_bytes(size_t elem, int64_t T, int64_t V, int64_t W) {
    return align64((size_t)T * sizeof(double) +
                   ((size_t)T * (size_t)(V + W) + 5 * (size_t)W + (size_t)V) * elem +
                   (size_t)W * sizeof(int32_t));
}

size_t rl_ctc_cpu_work_bytes(size_t elem, int64_t T, int64_t B, int64_t V, int64_t S, int threads) {
    if (threads < 1) threads = 1;
    return align64((size_t)B * sizeof(int64_t)) +
           (size_t)threads * block_bytes(elem, T, V, 2 * S + 3);
}

void rl_ctc_cpu_zero_rows(const rl_ctc_cpu_job *j, int64_t b, int64_t t0) {
    if (!j->grad) return;
    char *g = (char *)j->grad;
    for (int64_t t = t0; t < j->T; t++)
        memset(g + ((size_t)(t * j->B + b) * (size_t)j->V) * j->elem, 0, (size_t)j->V * j->elem);
}

static void *worker(void *arg) {
    rl_ctc_cpu_job *j = ((void **)arg)[0];
    void *scratch = ((void **)arg)[1];
    for (;;) {
        long i = atomic_fetch_add(&j->next, 1);
        if (i >= j->B) break;
        j->seq(j, j->order[i], scratch);
    }
    return NULL;
}

static int by_cost_desc(const void *pa, const void *pb, void *jv) {
    const rl_ctc_cpu_job *j = jv;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    int64_t ca = (int64_t)j->in_len[a] * (2 * j->lab_len[a] + 1);
    int64_t cb = (int64_t)j->in_len[b] * (2 * j->lab_len[b] + 1);
    if (ca != cb) return ca > cb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static void run(rl_ctc_cpu_job *j, int threads) {
    int64_t *order = (int64_t *)j->work;
    int64_t S_max = (j->W - 3) / 2;
    j->block = block_bytes(j->elem, j->T, j->V, j->W);
    char *blocks = j->work + align64((size_t)j->B * sizeof(int64_t));
    int64_t cells = 0;
    for (int64_t b = 0; b < j->B; b++) {
        order[b] = b;
        cells += (int64_t)j->in_len[b] * (2 * S_max + 1);
    }
    /* below ~50k cells (a few tens of microseconds) a thread costs more than it saves */
    if (threads > j->B) threads = (int)j->B;
    if (cells < 50000) threads = 1;
    if (threads > 1) qsort_r(order, (size_t)j->B, sizeof *order, by_cost_desc, j);
    j->order = order;
    atomic_store(&j->next, 0);
    pthread_t th[64];
    void *args[64][2];
    if (threads > 64) threads = 64;
    int started = 0;
    for (int i = 1; i < threads; i++) {
        args[i][0] = j;
        args[i][1] = blocks + (size_t)i * j->block;
        if (pthread_create(&th[i], NULL, worker, args[i]) != 0) break;
        started = i;
    }
    args[0][0] = j;
    args[0][1] = blocks;
    worker(args[0]);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
}

void rl_ctc_cpu(bool f64, int64_t T, int64_t B, int64_t V, const void *logits,
                const int32_t *labels, int64_t lab_stride_b, int64_t lab_stride_s,
                const int32_t *input_len, const int32_t *label_len, int32_t blank,
                bool zero_infinity, void *loss, void *grad, void *work, int threads) {
    int64_t S_max = 0;
    for (int64_t b = 0; b < B; b++)
        S_max = label_len[b] > S_max ? label_len[b] : S_max;
    rl_ctc_cpu_job j = {.T = T,
                        .B = B,
                        .V = V,
                        .W = 2 * S_max + 3,
                        .labels = labels,
                        .sb = lab_stride_b,
                        .ss = lab_stride_s,
                        .in_len = input_len,
                        .lab_len = label_len,
                        .blank = blank,
                        .zero_inf = zero_infinity,
                        .work = work};
    j.logits = logits;
    j.loss = loss;
    j.grad = grad;
    j.elem = f64 ? sizeof(double) : sizeof(float);
    j.seq = f64 ? rl_ctc_cpu_seq_f64 : rl_ctc_cpu_seq_f32;
    run(&j, threads);
}
