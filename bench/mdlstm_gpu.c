/* MDLSTM training step on a GPU: the mdlstm layer, four directions concatenated, forward and
 * backward (input gradient included) on full-size images, float32 on cuda:0, at bench/mdlstm.c's
 * sizes (H, W, B, F, D) = (32, 256, 16, 16, 16) and (16, 256, 10, 105, 120). A step ends with
 * rl_op_synchronize. FLOPs per step as in bench/mdlstm.c: 3 * directions * 2 * 5D * (F + 2D) per
 * pixel (the forward's GEMMs, twice that for backward). Prints a Markdown table with ms/step,
 * pixels/s and TFLOP/s. Without a CUDA build or device it prints one SKIP line and exits 0 at
 * once. Run by `make bench-gpu` (and `make bench`). */
#include <stdio.h>
#include <string.h>

#include "bench.h"

#include "../core/device.h"
#include "../core/rng.h"
#include "../kernels/ops.h"
#include "../layers/layer.h"
#include "../layers/layers.h"

#ifdef RL_WITH_CUDA
#include "mdlstm_model.h"

static const rl_device DEV = {RL_CUDA, 0};

static void run_step(void *ctx, int64_t reps) {
    model_steps(ctx, reps);
    bench_check(rl_op_synchronize(DEV), "synchronize");
}
#endif

int main(void) {
#ifdef RL_WITH_CUDA
    rl_ops_init();
    const rl_device_backend *be = rl_device_cuda_backend();
    if (!be || be->count() < 1) {
        printf("SKIP mdlstm_gpu: no CUDA device (the GPU MDLSTM benchmark needs one)\n");
        return 0;
    }
    rl_rng g;
    rl_rng_seed(&g, 1);
    printf("### MDLSTM training step on the GPU (rnnlua, float32, cuda:0)\n\n");
    printf("| H, W, B, F, D | directions | ms/step | pixels/s | TFLOP/s |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        const shape *s = &SHAPES[i];
        model m;
        model_init(&m, s, &g, DEV);
        bench_variant v = {run_step, &m};
        double sec;
        bench_row(1, &v, &sec);
        double pixels = (double)(s->H * s->W * s->B);
        double flops = pixels * 3.0 * NDIRS * 2.0 * 5.0 * (double)s->D * (double)(s->F + 2 * s->D);
        printf("| %lld, %lld, %lld, %lld, %lld | %d | %.2f | %.0f | %.3f |\n", (long long)s->H,
               (long long)s->W, (long long)s->B, (long long)s->F, (long long)s->D, NDIRS, sec * 1e3,
               pixels / sec, flops / sec / 1e12);
        fflush(stdout);
        model_free(&m);
    }
    printf("\nA step: forward + backward with the input gradient, ended by a device "
           "synchronisation; FLOPs 3 * directions * 2 * 5D * (F + 2D) per pixel.\n");
#else
    printf("SKIP mdlstm_gpu: not a CUDA build (the GPU MDLSTM benchmark needs CUDA=1 and a GPU)\n");
#endif
    return 0;
}
