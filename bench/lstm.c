/* LSTM training step: the lstm layer stacks of three reference topologies, forward and
 * backward, plus the output layer (a GEMM, softmax and the cross-entropy gradient, written
 * here with BLAS), float32 on the CPU. Prints a Markdown table: time per step, frames per
 * second, GFLOP/s and the fraction of the sgemm peak measured in this program (the best of a
 * 1024^3 and a 2048^3 sgemm). FLOPs per step: 24*T*B*H*(I+H) per LSTM direction and layer
 * (forward 8*H*(I+H) per frame for the input and recurrent products, backward twice that for
 * the input, recurrent and weight gradients), plus 6*T*B*H_last*C for the output layer; the
 * pointwise work, the softmax and the gradient sums are not counted.
 *
 * The plain row calls the layers one after the other, as a network does, each using every
 * BLAS thread. For bidirectional stacks a second row, "directions in pairs", runs the
 * forward and backward layers of a level at the same time on two threads with one BLAS
 * thread each, as a network does (layer:_forward_start in lua/l_layers.c);
 * bench/lstm_compare.sh times whole networks against PyTorch. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

#include "../core/blas.h"
#include "../core/rng.h"
#include "../kernels/ops.h"
#include "../layers/layer.h"
#include "../layers/layers.h"

typedef struct {
    const char *name;
    int layers, dirs;
    int64_t in, hidden, classes, T, B;
} topology;

static const topology TOPOS[] = {
    {"chime", 3, 2, 45, 512, 1501, 250, 16},
    {"ptb_large", 2, 1, 650, 650, 10000, 50, 20},
    {"seqmnist", 1, 1, 28, 128, 10, 28, 64},
};

#define MAX_L BENCH_MAX_L
#define MAX_D BENCH_MAX_D

typedef struct {
    const topology *tp;
    rl_layer *l[MAX_L][MAX_D];
    rl_tensor x, len, gin[MAX_L][MAX_D][MAX_D]; /* gin[layer][dir][input] */
    rl_tensor Wo, dWo, logits, labels;
    rl_tensor dhid[MAX_D]; /* gradient w.r.t. the top layer's outputs */
    bool pairs;            /* run the two directions of a layer concurrently */
} model;

static void model_init(model *m, const topology *tp, rl_rng *g) {
    memset(m, 0, sizeof *m);
    m->tp = tp;
    int64_t T = tp->T, B = tp->B, H = tp->hidden;
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            m->l[li][d] = bench_stack_layer("lstm", NULL, li, d, tp->dirs, tp->in, H, T, B,
                                            m->gin[li][d], g, RL_DEVICE_CPU);
    int64_t xs[3] = {T, B, tp->in}, ls[1] = {B}, ws[2] = {tp->dirs * H, tp->classes},
            zs[2] = {T * B, tp->classes}, ys[1] = {T * B}, hs[3] = {T, B, H};
    bench_check(rl_tensor_empty(&m->x, RL_FLOAT32, RL_DEVICE_CPU, 3, xs), "x");
    bench_check(rl_op_normal(&m->x, g, 0, 1), "x");
    bench_check(rl_tensor_empty(&m->len, RL_INT32, RL_DEVICE_CPU, 1, ls), "len");
    bench_check(rl_op_fill(&m->len, (double)T), "len");
    bench_check(rl_tensor_empty(&m->Wo, RL_FLOAT32, RL_DEVICE_CPU, 2, ws), "Wo");
    bench_check(rl_op_normal(&m->Wo, g, 0, 0.05), "Wo");
    bench_check(rl_tensor_empty(&m->dWo, RL_FLOAT32, RL_DEVICE_CPU, 2, ws), "dWo");
    bench_check(rl_op_fill(&m->dWo, 0.0), "dWo");
    bench_check(rl_tensor_empty(&m->logits, RL_FLOAT32, RL_DEVICE_CPU, 2, zs), "logits");
    bench_check(rl_tensor_empty(&m->labels, RL_INT32, RL_DEVICE_CPU, 1, ys), "labels");
    int32_t *y = rl_tensor_data(&m->labels);
    for (int64_t i = 0; i < T * B; i++)
        y[i] = (int32_t)((i * 2654435761u) % (uint64_t)tp->classes);
    for (int d = 0; d < tp->dirs; d++)
        bench_check(rl_tensor_empty(&m->dhid[d], RL_FLOAT32, RL_DEVICE_CPU, 3, hs), "dhid");
}

/* The two directions of a layer, run one after the other or (pairs) at the same time on two
 * threads with one BLAS thread each. */
typedef struct {
    rl_layer *l;
    rl_layer_io *io;
    const rl_tensor *gout;
    rl_tensor **gin;
} layer_call;

static void call_layer(const layer_call *c) {
    if (c->gout)
        bench_check(c->l->ops->backward(c->l, c->io, c->gout, c->gin), "lstm backward");
    else
        bench_check(c->l->ops->forward(c->l, c->io), "lstm forward");
}

static void *call_layer_thread(void *arg) {
    call_layer(arg);
    return NULL;
}

static void call_layers(const layer_call *c, int n, bool pairs) {
    if (!pairs || n != 2) {
        for (int i = 0; i < n; i++)
            call_layer(&c[i]);
        return;
    }
    int threads = rl_blas_get_threads();
    rl_blas_set_threads(1);
    pthread_t th;
    if (pthread_create(&th, NULL, call_layer_thread, (void *)&c[1]) != 0) {
        fprintf(stderr, "lstm bench: pthread_create failed\n");
        exit(1);
    }
    call_layer(&c[0]);
    pthread_join(th, NULL);
    rl_blas_set_threads(threads);
}

/* One training step: forward and backward through the stack and the output layer. */
static void train_step(model *m) {
    const topology *tp = m->tp;
    int64_t N = tp->T * tp->B, H = tp->hidden, C = tp->classes;
    rl_layer_io io[MAX_L][MAX_D];
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            bench_stack_io(&io[li][d], li, tp->dirs, m->l, &m->x, &m->len);
    for (int li = 0; li < tp->layers; li++) {
        layer_call c[MAX_D];
        for (int d = 0; d < tp->dirs; d++)
            c[d] = (layer_call){m->l[li][d], &io[li][d], NULL, NULL};
        call_layers(c, tp->dirs, m->pairs);
    }
    /* output layer: logits = sum_d out_d Wo_d, softmax, dlogits = p - onehot (in place) */
    float *z = rl_tensor_data(&m->logits), *Wo = rl_tensor_data(&m->Wo),
          *dWo = rl_tensor_data(&m->dWo);
    int top = tp->layers - 1;
    for (int d = 0; d < tp->dirs; d++)
        rl_blas_sgemm(false, false, N, C, H, 1.0f, rl_tensor_data(&m->l[top][d]->out), H,
                      Wo + d * H * C, C, d ? 1.0f : 0.0f, z, C);
    const int32_t *y = rl_tensor_data(&m->labels);
    for (int64_t n = 0; n < N; n++) {
        float *r = z + n * C, mx = r[0], sum = 0;
        for (int64_t c = 1; c < C; c++)
            mx = r[c] > mx ? r[c] : mx;
        for (int64_t c = 0; c < C; c++)
            sum += (r[c] = expf(r[c] - mx));
        for (int64_t c = 0; c < C; c++)
            r[c] /= sum;
        r[y[n]] -= 1.0f;
    }
    for (int d = 0; d < tp->dirs; d++) {
        float *hd = rl_tensor_data(&m->l[top][d]->out);
        rl_blas_sgemm(true, false, H, C, N, 1.0f, hd, H, z, C, 1.0f, dWo + d * H * C, C);
        rl_blas_sgemm(false, true, N, H, C, 1.0f, z, C, Wo + d * H * C, C, 0.0f,
                      rl_tensor_data(&m->dhid[d]), H);
    }
    /* the stack, top down; a lower output's gradient is the sum over the layers above */
    rl_tensor *gout[MAX_D] = {&m->dhid[0], &m->dhid[1]};
    for (int li = top; li >= 0; li--) {
        rl_tensor *gin[MAX_D][MAX_D] = {{NULL}};
        layer_call c[MAX_D];
        for (int d = 0; d < tp->dirs; d++) {
            for (int k = 0; k < tp->dirs && li > 0; k++)
                gin[d][k] = &m->gin[li][d][k];
            c[d] = (layer_call){m->l[li][d], &io[li][d], gout[d], gin[d]};
        }
        call_layers(c, tp->dirs, m->pairs);
        if (li == 0) break;
        bench_stack_sum_grads(li, tp->dirs, m->gin, gout);
    }
}

static void model_free(model *m) {
    bench_stack_free(m->tp->layers, m->tp->dirs, m->l, m->gin);
    rl_tensor *ts[] = {&m->x,      &m->len,    &m->Wo,      &m->dWo,
                       &m->logits, &m->labels, &m->dhid[0], &m->dhid[1]};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

typedef struct {
    model *m;
    bool pairs;
} step_ctx;

static void run_step(void *ctx, int64_t reps) {
    step_ctx *c = ctx;
    c->m->pairs = c->pairs;
    for (int64_t r = 0; r < reps; r++)
        train_step(c->m);
}

static double step_flops(const topology *tp) {
    double f = 0, H = (double)tp->hidden, TB = (double)tp->T * (double)tp->B;
    for (int li = 0; li < tp->layers; li++) {
        double I = li ? (double)tp->dirs * H : (double)tp->in;
        f += tp->dirs * 24.0 * TB * H * (I + H);
    }
    return f + 6.0 * TB * tp->dirs * H * (double)tp->classes;
}

int main(int argc, char **argv) {
    rl_ops_init();
    rl_rng g;
    rl_rng_seed(&g, 1);
    double peak = bench_sgemm_peak();
    printf("### LSTM training step (rnnlua, float32, CPU, %d BLAS threads)\n\n",
           rl_blas_get_threads());
    printf("sgemm peak in this run: %.1f GFLOP/s (best of 1024^3 and 2048^3)\n\n", peak);
    printf("| config | ms/step | frames/s | GFLOP/s | of sgemm peak |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof TOPOS / sizeof TOPOS[0]; i++) {
        const topology *tp = &TOPOS[i];
        if (argc > 1 && strcmp(argv[1], tp->name) != 0) continue;
        model m;
        model_init(&m, tp, &g);
        step_ctx ctx[2] = {{&m, false}, {&m, true}};
        bench_variant v[2] = {{run_step, &ctx[0]}, {run_step, &ctx[1]}};
        double sec[2];
        int nv = tp->dirs == 2 ? 2 : 1;
        bench_row(nv, v, sec);
        for (int k = 0; k < nv; k++) {
            double gf = step_flops(tp) / sec[k] / 1e9;
            printf("| %s%s | %.1f | %.0f | %.1f | %.0f%% |\n", tp->name,
                   k ? " (directions in pairs)" : "", sec[k] * 1e3,
                   (double)(tp->T * tp->B) / sec[k], gf, 100.0 * gf / peak);
        }
        fflush(stdout);
        model_free(&m);
    }
    printf("\nFLOPs per step: 24*T*B*H*(I+H) per LSTM direction and layer + 6*T*B*H_last*C "
           "(output layer); bench/lstm_compare.sh compares whole networks with PyTorch.\n");
    return 0;
}
