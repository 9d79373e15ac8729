/* The packed small-M GEMM of kernels/cpu/gemm_small.h on the LSTM's per-step shapes, one
 * thread: the AVX-512 and the AVX2+FMA kernel (where the CPU has them) against cblas_sgemm
 * (which repacks its operand on every call, as a per-step BLAS call would), interleaved.
 *   build/bench/gemm_small            prints a Markdown table
 * Times are process CPU time per call (median of RL_BENCH_ROUNDS rounds, default 5, each about
 * RL_BENCH_SECONDS, default 0.5), so that a machine shared with other work still ranks the
 * kernels: wall time would charge them for the time other processes ran. OpenBLAS runs one
 * thread. Exits 1 when a kernel's result differs from cblas_sgemm's. */
#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "../kernels/cpu/cpu_level.h"
#include "../kernels/cpu/gemm_small.h"
#include "bench.h"

typedef struct {
    const char *what;
    int64_t m, n, k;
} shape;

static const shape shapes[] = {
    {"seqmnist fwd, 2 threads", 32, 512, 128},
    {"seqmnist bwd, 2 threads", 32, 128, 512},
    {"seqmnist fwd, 1 thread", 64, 512, 128},
    {"seqmnist bwd, 1 thread", 64, 128, 512},
    {"ptb_small fwd", 10, 800, 200},
    {"ptb_small bwd", 10, 200, 800},
    {"odd fwd", 7, 1200, 300},
    {"odd bwd", 7, 300, 1200},
    {"chime fwd", 16, 2048, 512},
    /* a batch-3 step of an LSTM 257 (tiny3), each of 2 threads on its half of U */
    {"tiny3 fwd, 2 threads", 3, 528, 257},
    {"tiny3 bwd, 2 threads", 3, 144, 1028},
    /* the input projections of all frames where the input is narrow */
    {"seqmnist input projection", 1792, 512, 28},
    {"odd layer 1 input projection", 959, 1200, 61},
    {"ptb_small input projection", 400, 800, 200},
    {"odd layer 2 input projection", 959, 1200, 600},
};

typedef struct {
    const shape *s;
    float *a, *b, *packed, *c;
    rl_cpu_level level; /* RL_CPU_GENERIC: cblas_sgemm */
} ctx;

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(ctx *x, int64_t reps) {
    int64_t m = x->s->m, n = x->s->n, k = x->s->k;
    if (x->level == RL_CPU_GENERIC) {
        for (int64_t r = 0; r < reps; r++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                        x->a, (int)k, x->b, (int)n, 1.0f, x->c, (int)n);
        return;
    }
    bench_check(rl_cpu_level_set(x->level), "rl_cpu_level_set");
    for (int64_t r = 0; r < reps; r++)
        rl_gemm_packed_f32(m, n, k, x->a, k, x->packed, true, x->c, n);
}

static double timed(ctx *x, int64_t reps) {
    double t0 = cpu_now();
    run(x, reps);
    return cpu_now() - t0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    rl_blas_set_threads(1);
    rl_cpu_level best = rl_cpu_level_supported();
    rl_cpu_level levels[3] = {RL_CPU_GENERIC};
    int nv = 1;
    if (best >= RL_CPU_AVX512) levels[nv++] = RL_CPU_AVX512;
    if (best >= RL_CPU_AVX2) levels[nv++] = RL_CPU_AVX2;
    double target = bench_seconds();
    int rounds = bench_rounds();
    printf("| shape | m x n x k |");
    for (int v = 0; v < nv; v++)
        printf(" %s GFLOP/s |", v ? rl_cpu_level_name(levels[v]) : "cblas_sgemm");
    printf("\n|---|---|");
    for (int v = 0; v < nv; v++)
        printf("---:|");
    printf("\n");
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        float *a = malloc(sizeof(float) * (size_t)(s->m * s->k)),
              *b = malloc(sizeof(float) * (size_t)(s->k * s->n)),
              *p = malloc(sizeof(float) * (size_t)rl_gemm_packed_size(s->k, s->n)),
              *c = malloc(sizeof(float) * (size_t)(s->m * s->n)),
              *ref = malloc(sizeof(float) * (size_t)(s->m * s->n));
        if (!a || !b || !p || !c || !ref) {
            fprintf(stderr, "bench: out of memory\n");
            return 1;
        }
        for (int64_t i = 0; i < s->m * s->k; i++)
            a[i] = (float)((i * 7919) % 23) / 23.0f - 0.5f;
        for (int64_t i = 0; i < s->k * s->n; i++)
            b[i] = (float)((i * 104729) % 31) / 31.0f - 0.5f;
        rl_gemm_pack_f32(p, b, s->n, false, s->k, s->n);
        ctx xs[3];
        int64_t reps[3];
        double times[3][BENCH_MAX_ROUNDS];
        for (int v = 0; v < nv; v++) {
            xs[v] = (ctx){s, a, b, p, c, levels[v]};
            memset(c, 0, sizeof(float) * (size_t)(s->m * s->n));
            run(&xs[v], 1);
            if (v == 0) memcpy(ref, c, sizeof(float) * (size_t)(s->m * s->n));
            for (int64_t i = 0; i < s->m * s->n; i++)
                if (fabsf(c[i] - ref[i]) > 1e-3f * (1.0f + fabsf(ref[i]))) {
                    fprintf(stderr, "bench: %s differs from cblas_sgemm on %s at %" PRId64 "\n",
                            rl_cpu_level_name(levels[v]), s->what, i);
                    bad = 1;
                    break;
                }
            int64_t r = 1;
            double t;
            while ((t = timed(&xs[v], r)) < target / 10)
                r *= 2;
            reps[v] = (int64_t)(target * (double)r / t) + 1;
        }
        for (int k = 0; k < rounds; k++)
            for (int v = 0; v < nv; v++)
                times[v][k] = timed(&xs[v], reps[v]) / (double)reps[v];
        printf("| %s | %" PRId64 " x %" PRId64 " x %" PRId64 " |", s->what, s->m, s->n, s->k);
        for (int v = 0; v < nv; v++) {
            qsort(times[v], (size_t)rounds, sizeof(double), cmp);
            double sec = times[v][rounds / 2];
            printf(" %.1f |", 2.0 * (double)(s->m * s->n * s->k) / sec / 1e9);
        }
        printf("\n");
        free(a), free(b), free(p), free(c), free(ref);
    }
    bench_check(rl_cpu_level_set(best), "rl_cpu_level_set");
    return bad;
}
