/* Read bandwidth of this machine, for the least time a push can take (docs/embedding.md,
 * "Latency"): a model that reads W bytes of weights a frame needs at least W / bandwidth.
 * Sums float32 buffers of several sizes (from ones that fit the caches to one far larger than
 * the last level) with 1 and 2 threads, each thread its own half, and prints the best of
 * --reps passes in GB/s (10^9 bytes a second) and the least time to read the 3 x 512 LSTM's
 * weights of bench/stream.c (25.2 MB in float32, 12.6 MB in bf16) at that rate.
 * Usage: membw [--reps N] [--threads T] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct {
    const float *p;
    size_t n;
    pthread_barrier_t *go;
    int reps;
    double best; /* seconds of the fastest pass */
    float sink;
} reader;

/* 16 independent sums, so that the loop waits on memory, not on the adds. */
static float sum(const float *p, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            acc[k] += p[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++)
        s += acc[k];
    return s;
}

static void *read_passes(void *arg) {
    reader *r = arg;
    r->best = 1e9;
    for (int i = 0; i < r->reps; i++) {
        pthread_barrier_wait(r->go); /* the threads' passes start together */
        double t0 = bench_now();
        r->sink += sum(r->p, r->n);
        double t = bench_now() - t0;
        if (t < r->best) r->best = t;
    }
    return NULL;
}

/* GB/s of `threads` threads reading `bytes` (split in equal parts) `reps` times, the slowest
 * thread of the best passes counting. */
static double bandwidth(const float *buf, size_t bytes, int threads, int reps) {
    pthread_t th[2];
    reader r[2];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)threads);
    size_t n = bytes / sizeof(float) / (size_t)threads / 16 * 16;
    for (int t = 0; t < threads; t++) {
        r[t] = (reader){.p = buf + (size_t)t * n, .n = n, .go = &go, .reps = reps};
        if (t > 0) pthread_create(&th[t], NULL, read_passes, &r[t]);
    }
    read_passes(&r[0]);
    double slowest = r[0].best;
    for (int t = 1; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (r[t].best > slowest) slowest = r[t].best;
    }
    pthread_barrier_destroy(&go);
    if (r[0].sink == 12345.0f) puts(""); /* keeps the sums */
    return (double)(n * (size_t)threads * sizeof(float)) / slowest / 1e9;
}

int main(int argc, char **argv) {
    int reps = 20, max_threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            max_threads = atoi(argv[i + 1]);
    }
    if (reps < 1 || max_threads < 1 || max_threads > 2) {
        fputs("usage: membw [--reps N>=1] [--threads 1|2]\n", stderr);
        return 2;
    }
    static const double mb[] = {1, 12.6, 25.2, 64, 1024};
    const int nsizes = (int)(sizeof mb / sizeof mb[0]);
    size_t most = (size_t)(mb[nsizes - 1] * 1e6);
    float *buf = malloc(most);
    if (buf == NULL) return 1;
    for (size_t i = 0; i < most / sizeof(float); i++)
        buf[i] = (float)(i % 7);
    printf("### Read bandwidth (bench/membw.c)\n\n"
           "The best of %d passes; each thread sums its own half of the buffer.\n\n"
           "| MB read | threads | GB/s | 25.2 MB (fp32 weights) ms | 12.6 MB (bf16) ms |\n"
           "|---:|---:|---:|---:|---:|\n",
           reps);
    for (int s = 0; s < nsizes; s++)
        for (int t = 1; t <= max_threads; t++) {
            /* the largest buffer once a pass is enough: it leaves no cache warm */
            double gbs = bandwidth(buf, (size_t)(mb[s] * 1e6), t, mb[s] > 100 ? 3 : reps);
            printf("| %.1f | %d | %.1f | %.3f | %.3f |\n", mb[s], t, gbs, 25.2 / gbs, 12.6 / gbs);
        }
    free(buf);
    return 0;
}
