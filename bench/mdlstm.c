/* MDLSTM training step: the mdlstm layer, four directions concatenated, forward and backward
 * (input gradient included) on full-size images, float32 on the CPU. Prints a Markdown table:
 * time per step, pixels per second, GFLOP/s and the fraction of the sgemm peak. The peak is a
 * 2048^3 sgemm through the BLAS rnnlua links, timed in the same row as the step (interleaved
 * measurements, bench.h), so that the fraction holds on a machine shared with other jobs;
 * RL_SGEMM_PEAK_GFLOPS (exported by bench/run.sh) is printed beside it for reference.
 * The last column is the same fraction in CPU time (FLOPs per CPU-second of this process, steps
 * and sgemms alternating), which a machine shared with other jobs distorts far less than wall
 * time. FLOPs per step: 3 * ndirs * 2 * 5D * (F + 2D) per pixel (the forward's GEMMs, and twice
 * that for backward); the pointwise work is not counted.
 * RL_BENCH_MDLSTM=small|large runs one size only (for profiling). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#include "../core/blas.h"
#include "../core/rng.h"
#include "../kernels/cpu/cpu_level.h"
#include "../kernels/ops.h"
#include "../layers/layer.h"
#include "../layers/layers.h"
#include "mdlstm_model.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_step(void *ctx, int64_t reps) { model_steps(ctx, reps); }

int main(void) {
    rl_ops_init();
    rl_rng g;
    rl_rng_seed(&g, 1);
    const char *only = getenv("RL_BENCH_MDLSTM");
    if (only && strcmp(only, "small") != 0 && strcmp(only, "large") != 0) {
        fprintf(stderr, "bench: RL_BENCH_MDLSTM=%s, expected small or large\n", only);
        return 1;
    }
    double env_peak = bench_env("RL_SGEMM_PEAK_GFLOPS", 0, 0, 1e9);
    printf("### MDLSTM training step (rnnlua, float32, CPU, %d BLAS threads, level %s)\n\n",
           rl_blas_get_threads(), rl_cpu_level_name(rl_cpu_level_get()));
    if (env_peak > 0) printf("sgemm peak of bench/gemm: %.1f GFLOP/s\n\n", env_peak);
    printf("| H, W, B, F, D | directions | ms/step | pixels/s | GFLOP/s | sgemm GFLOP/s (same "
           "row) | of sgemm peak | of sgemm, per CPU-second |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    bench_sgemm_ctx sg;
    rl_tensor sgt[3];
    bench_sgemm_init(&sg, sgt, 2048);
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        const shape *s = &SHAPES[i];
        if (only && strcmp(only, i == 0 ? "small" : "large") != 0) continue;
        model m;
        model_init(&m, s, &g, RL_DEVICE_CPU);
        bench_variant v[2] = {{run_step, &m}, {bench_run_sgemm, &sg}};
        double sec[2];
        bench_row(2, v, sec);
        double pixels = (double)(s->H * s->W * s->B);
        double flops = pixels * 3.0 * NDIRS * 2.0 * 5.0 * (double)s->D * (double)(s->F + 2 * s->D);
        double sflops = 2.0 * 2048.0 * 2048.0 * 2048.0;
        double gf = flops / sec[0] / 1e9, peak = sflops / sec[1] / 1e9;
        /* the same ratio in CPU time: steps and sgemms alternating, each side's FLOPs per
         * CPU-second of this process (threads' spinning counts as spent) */
        int64_t greps = (int64_t)(sec[0] / sec[1] + 0.5);
        greps = greps < 1 ? 1 : greps;
        double cs = 0, cg = 0;
        for (int r = 0; r < 3; r++) {
            double c0 = cpu_seconds();
            run_step(&m, 1);
            double c1 = cpu_seconds();
            bench_run_sgemm(&sg, greps);
            cs += c1 - c0;
            cg += cpu_seconds() - c1;
        }
        double cpu_frac = (flops / cs) / (sflops * (double)greps / cg);
        printf(
            "| %lld, %lld, %lld, %lld, %lld | %d | %.1f | %.0f | %.1f | %.1f | %.0f%% | %.0f%% |\n",
            (long long)s->H, (long long)s->W, (long long)s->B, (long long)s->F, (long long)s->D,
            NDIRS, sec[0] * 1e3, pixels / sec[0], gf, peak, 100.0 * gf / peak, 100.0 * cpu_frac);
        fflush(stdout);
        model_free(&m);
    }
    bench_sgemm_free(sgt);
    printf("\nFLOPs per step: 3 * directions * 2 * 5D * (F + 2D) per pixel (forward GEMMs, "
           "twice that for backward); forward + backward with the input gradient. Last column: "
           "the same fraction per CPU-second of the process (steps and sgemms alternating).\n");
    return 0;
}
