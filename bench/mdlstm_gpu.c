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
typedef struct {
    int64_t H, W, B, F, D;
} shape;

static const shape SHAPES[] = {{32, 256, 16, 16, 16}, {16, 256, 10, 105, 120}};
enum { NDIRS = 4 };
static const rl_device DEV = {RL_CUDA, 0};

typedef struct {
    rl_layer *l;
    rl_tensor x, sizes, gout, gin;
    rl_layer_io io;
} model;

static void model_init(model *m, const shape *s, rl_rng *g) {
    memset(m, 0, sizeof *m);
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", (double)s->D);
    rl_options o = gc_options(&t);
    bench_check(rl_layer_create(&m->l, "mdlstm", "md", &o, 1, &s->F), "create");
    bench_layer_params(m->l, g, DEV);
    int64_t xs[4] = {s->H, s->W, s->B, s->F}, ss[2] = {s->B, 2},
            os[4] = {s->H, s->W, s->B, NDIRS * s->D};
    bench_normal(&m->x, 4, xs, g, 1.0, DEV);
    bench_normal(&m->gout, 4, os, g, 0.1, DEV);
    bench_check(rl_tensor_empty(&m->gin, RL_FLOAT32, DEV, 4, xs), "gin");
    bench_check(rl_tensor_empty(&m->sizes, RL_INT32, RL_DEVICE_CPU, 2, ss), "sizes");
    int32_t *sz = rl_tensor_data(&m->sizes);
    for (int64_t b = 0; b < s->B; b++) {
        sz[2 * b] = (int32_t)s->H;
        sz[2 * b + 1] = (int32_t)s->W;
    }
    m->io.n_in = 1;
    m->io.in[0] = &m->x;
    m->io.sizes = &m->sizes;
    m->io.train = true;
}

static void model_free(model *m) {
    rl_layer_free(m->l);
    rl_tensor_release(&m->x);
    rl_tensor_release(&m->sizes);
    rl_tensor_release(&m->gout);
    rl_tensor_release(&m->gin);
}

static void run_step(void *ctx, int64_t reps) {
    model *m = ctx;
    rl_tensor *gin[1] = {&m->gin};
    for (int64_t r = 0; r < reps; r++) {
        bench_check(m->l->ops->forward(m->l, &m->io), "mdlstm forward");
        bench_check(m->l->ops->backward(m->l, &m->io, &m->gout, gin), "mdlstm backward");
    }
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
        model_init(&m, s, &g);
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
