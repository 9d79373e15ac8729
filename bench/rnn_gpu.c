/* LSTM and GRU training steps on a GPU: the lstm (then gru) layer stacks of bench/lstm.c's three
 * topologies (chime, ptb_large, seqmnist) plus DeepBench's training sizes (H=1024, B=64, T=25 and
 * H=256, B=32, T=150, input size = H, one layer), float32 on cuda:0, each with rnnlua's own
 * kernels (impl = "own") and with cuDNN (impl = "cudnn"), interleaved in one bench_row. A step is
 * the forward and backward of every recurrent layer (input gradients included, the two directions
 * of a bidirectional level queued back to back so their streams overlap, while a layer's stream
 * waits for the events of the layers whose outputs or input gradients it reads:
 * layers/recurrent.c), ended by rl_op_synchronize; the top layer's output gradient is a fixed
 * random tensor, the output layer itself is left out (it is the same GEMMs for both
 * implementations). FLOPs per step: bench/lstm.c's accounting, 6*G*T*B*H*(I+H) per direction and
 * layer with G gates (LSTM 4, GRU 3; the output layer's 6*T*B*H*C is not counted, as it is not
 * run). Prints a Markdown table with ms/step, frames/s, TFLOP/s and the time ratio own/cuDNN (below
 * 1: ours is faster). Without a CUDA build or device it prints one SKIP line and exits 0 at once.
 * Run by `make bench-gpu` (and `make bench`). */
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
    const char *name;
    int layers, dirs;
    int64_t in, hidden, T, B;
} topology;

static const topology TOPOS[] = {
    {"chime", 3, 2, 45, 512, 250, 16},           {"ptb_large", 2, 1, 650, 650, 50, 20},
    {"seqmnist", 1, 1, 28, 128, 28, 64},         {"deepbench_h1024", 1, 1, 1024, 1024, 25, 64},
    {"deepbench_h256", 1, 1, 256, 256, 150, 32},
};

#define MAX_L BENCH_MAX_L
#define MAX_D BENCH_MAX_D

static const rl_device DEV = {RL_CUDA, 0};

typedef struct {
    const topology *tp;
    rl_layer *l[MAX_L][MAX_D];
    rl_tensor x, len, gin[MAX_L][MAX_D][MAX_D]; /* gin[layer][dir][input] */
    rl_tensor gtop[MAX_D];                      /* the top layer's output gradient */
} model;

static void model_init(model *m, const topology *tp, const char *cls, const char *impl, rl_rng *g) {
    memset(m, 0, sizeof *m);
    m->tp = tp;
    int64_t T = tp->T, B = tp->B, H = tp->hidden;
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            m->l[li][d] = bench_stack_layer(cls, impl, li, d, tp->dirs, tp->in, H, T, B,
                                            m->gin[li][d], g, DEV);
    int64_t xs[3] = {T, B, tp->in}, ls[1] = {B}, hs[3] = {T, B, H};
    bench_normal(&m->x, 3, xs, g, 1.0, DEV);
    bench_check(rl_tensor_empty(&m->len, RL_INT32, RL_DEVICE_CPU, 1, ls), "len");
    bench_check(rl_op_fill(&m->len, (double)T), "len");
    for (int d = 0; d < tp->dirs; d++)
        bench_normal(&m->gtop[d], 3, hs, g, 0.01, DEV);
}

/* One training step of the stack: forward bottom up, backward top down; a lower output's
 * gradient is the sum over the directions above (rl_op_binary, on the legacy default stream).
 * Only independent layers overlap: the layers order themselves with the ones they read from
 * (events, kernels/cuda/context.h), so a level never reads the level below before it is
 * written, nor a layer's grad_out before the layer above has written it; without that order the
 * stacked timings would measure a race. */
static void train_step(model *m) {
    const topology *tp = m->tp;
    rl_layer_io io[MAX_L][MAX_D];
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            bench_stack_io(&io[li][d], li, tp->dirs, m->l, &m->x, &m->len);
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            bench_check(m->l[li][d]->ops->forward(m->l[li][d], &io[li][d]), "forward");
    rl_tensor *gout[MAX_D] = {&m->gtop[0], &m->gtop[1]};
    for (int li = tp->layers - 1; li >= 0; li--) {
        for (int d = 0; d < tp->dirs; d++) {
            rl_tensor *gin[MAX_D] = {NULL, NULL};
            for (int k = 0; k < tp->dirs && li > 0; k++)
                gin[k] = &m->gin[li][d][k];
            bench_check(m->l[li][d]->ops->backward(m->l[li][d], &io[li][d], gout[d], gin),
                        "backward");
        }
        if (li == 0) break;
        bench_stack_sum_grads(li, tp->dirs, m->gin, gout);
    }
}

static void model_free(model *m) {
    bench_stack_free(m->tp->layers, m->tp->dirs, m->l, m->gin);
    rl_tensor *ts[] = {&m->x, &m->len, &m->gtop[0], &m->gtop[1]};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void run_steps(void *ctx, int64_t reps) {
    model *m = ctx;
    for (int64_t r = 0; r < reps; r++)
        train_step(m);
    bench_check(rl_op_synchronize(DEV), "synchronize");
}

static double step_flops(const topology *tp, double gates) {
    double f = 0, H = (double)tp->hidden, TB = (double)tp->T * (double)tp->B;
    for (int li = 0; li < tp->layers; li++) {
        double I = li ? (double)tp->dirs * H : (double)tp->in;
        f += tp->dirs * 6.0 * gates * TB * H * (I + H);
    }
    return f;
}
#endif

int main(int argc, char **argv) {
#ifdef RL_WITH_CUDA
    rl_ops_init();
    const rl_device_backend *be = rl_device_cuda_backend();
    if (!be || be->count() < 1) {
        printf("SKIP rnn_gpu: no CUDA device (the GPU LSTM and GRU benchmark needs one)\n");
        return 0;
    }
    rl_rng g;
    rl_rng_seed(&g, 1);
    const char *cells[2] = {"lstm", "gru"};
    for (int ci = 0; ci < 2; ci++) {
        const char *cls = cells[ci];
        printf(
            "### %s training step on the GPU (rnnlua, float32, cuda:0): own kernels vs cuDNN\n\n",
            ci ? "GRU" : "LSTM");
        printf("| config | impl | ms/step | frames/s | TFLOP/s | own/cuDNN time |\n");
        printf("|---|---|---:|---:|---:|---:|\n");
        for (size_t i = 0; i < sizeof TOPOS / sizeof TOPOS[0]; i++) {
            const topology *tp = &TOPOS[i];
            if (argc > 1 && strcmp(argv[1], tp->name) != 0) continue;
            model m[2];
            model_init(&m[0], tp, cls, "own", &g);
            model_init(&m[1], tp, cls, "cudnn", &g);
            bench_variant v[2] = {{run_steps, &m[0]}, {run_steps, &m[1]}};
            double sec[2];
            bench_row(2, v, sec);
            for (int k = 0; k < 2; k++) {
                double tf = step_flops(tp, ci ? 3 : 4) / sec[k] / 1e12;
                printf("| %s | %s | %.2f | %.0f | %.2f |", tp->name, k ? "cudnn" : "own",
                       sec[k] * 1e3, (double)(tp->T * tp->B) / sec[k], tf);
                if (k == 0)
                    printf(" %.2f |\n", sec[0] / sec[1]);
                else
                    printf(" |\n");
            }
            fflush(stdout);
            model_free(&m[0]);
            model_free(&m[1]);
        }
        printf("\n");
    }
    printf("A step: forward + backward of every recurrent layer (input gradients included), ended "
           "by a device synchronisation; FLOPs 6*G*T*B*H*(I+H) per direction and layer (G gates: "
           "LSTM 4, GRU 3).\n");
    return 0;
#else
    (void)argc, (void)argv;
    printf("SKIP rnn_gpu: not a CUDA build (the GPU LSTM and GRU benchmark needs CUDA=1 and a "
           "GPU)\n");
    return 0;
#endif
}
