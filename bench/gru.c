/* GRU training step: stacks of gru layers on the LSTM benchmark's topologies (bench/lstm.c:
 * layers, directions, input, hidden, T, B), forward and backward with a fixed gradient at the
 * top (no output layer: the figure is the GRU layers'), float32 on the CPU, full-length
 * sequences. FLOPs per step: 18*T*B*H*(I+H) per GRU direction and layer (forward 6*H*(I+H) per
 * frame for the input and recurrent products, backward twice that); the pointwise work is not
 * counted. The lowest layer computes no input gradient (as PyTorch with an input that needs
 * none).
 *
 *   gru [CONFIG]           prints a Markdown table of rnnlua's time per step
 *   gru --serve CONFIG     for bench/torch_gru.py, which interleaves rnnlua and PyTorch
 *                          measurements in one run: reads a repetition count per line on stdin,
 *                          runs that many steps and prints the seconds they took, until EOF
 *   gru --gemms CONFIG     the step's matrix products alone, each shape timed on its own with
 *                          the faster of the BLAS and the packed kernel (operands warm, packing
 *                          not counted), their sum against the whole step in the same run: how
 *                          much of the step the products take at the best speed this machine
 *                          gives them, i.e. a floor for any implementation built on them
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"

#include "../core/rng.h"
#include "../kernels/cpu/gemm_small.h"
#include "../layers/layer.h"
#include "../layers/layers.h"

typedef struct {
    const char *name;
    int layers, dirs;
    int64_t in, hidden, T, B;
} topology;

/* bench/lstm.c's configurations (their output layers left out) */
static const topology TOPOS[] = {
    {"chime", 3, 2, 45, 512, 250, 16},
    {"ptb_large", 2, 1, 650, 650, 50, 20},
    {"seqmnist", 1, 1, 28, 128, 28, 64},
};

#define MAX_L BENCH_MAX_L
#define MAX_D BENCH_MAX_D

typedef struct {
    const topology *tp;
    rl_layer *l[MAX_L][MAX_D];
    rl_tensor x, len, gtop, gin[MAX_L][MAX_D][MAX_D], gsum[MAX_D];
    rl_layer_io io[MAX_L][MAX_D];
} model;

static void empty(rl_tensor *t, int ndim, const int64_t *shape, const char *what) {
    bench_check(rl_tensor_empty(t, RL_FLOAT32, RL_DEVICE_CPU, ndim, shape), what);
}

static void model_init(model *m, const topology *tp, rl_rng *g) {
    memset(m, 0, sizeof *m);
    m->tp = tp;
    int64_t T = tp->T, B = tp->B, H = tp->hidden, hs[3] = {T, B, H};
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++) {
            m->l[li][d] = bench_stack_layer("gru", NULL, li, d, tp->dirs, tp->in, H, T, B,
                                            m->gin[li][d], g, RL_DEVICE_CPU);
            bench_stack_io(&m->io[li][d], li, tp->dirs, m->l, &m->x, &m->len);
        }
    int64_t xs[3] = {T, B, tp->in}, ls[1] = {B};
    empty(&m->x, 3, xs, "x");
    bench_check(rl_op_normal(&m->x, g, 0, 1), "x");
    bench_check(rl_tensor_empty(&m->len, RL_INT32, RL_DEVICE_CPU, 1, ls), "len");
    bench_check(rl_op_fill(&m->len, (double)T), "len");
    empty(&m->gtop, 3, hs, "gtop");
    bench_check(rl_op_normal(&m->gtop, g, 0, 0.1), "gtop");
    for (int d = 0; d < tp->dirs; d++)
        empty(&m->gsum[d], 3, hs, "gsum");
}

/* One training step: forward up the stack, backward down it; a lower output's gradient is the
 * sum over the layers above. */
static void train_step(model *m) {
    const topology *tp = m->tp;
    for (int li = 0; li < tp->layers; li++)
        for (int d = 0; d < tp->dirs; d++)
            bench_check(m->l[li][d]->ops->forward(m->l[li][d], &m->io[li][d]), "gru forward");
    const rl_tensor *gout[MAX_D] = {&m->gtop, &m->gtop};
    for (int li = tp->layers - 1; li >= 0; li--) {
        for (int d = 0; d < tp->dirs; d++) {
            rl_tensor *gin[MAX_D] = {NULL, NULL};
            for (int k = 0; k < tp->dirs && li > 0; k++)
                gin[k] = &m->gin[li][d][k];
            bench_check(m->l[li][d]->ops->backward(m->l[li][d], &m->io[li][d], gout[d], gin),
                        "gru backward");
        }
        if (li == 0) break;
        for (int k = 0; k < tp->dirs; k++) {
            gout[k] = &m->gin[li][0][k];
            if (tp->dirs == 1) continue;
            bench_check(rl_op_binary(&m->gsum[k], &m->gin[li][0][k], &m->gin[li][1][k], RL_BIN_ADD),
                        "add");
            gout[k] = &m->gsum[k];
        }
    }
}

static void model_free(model *m) {
    bench_stack_free(m->tp->layers, m->tp->dirs, m->l, m->gin);
    rl_tensor *ts[] = {&m->x, &m->len, &m->gtop, &m->gsum[0], &m->gsum[1]};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void run_steps(void *ctx, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        train_step(ctx);
}

static double step_flops(const topology *tp) {
    double f = 0, H = (double)tp->hidden, TB = (double)tp->T * (double)tp->B;
    for (int li = 0; li < tp->layers; li++) {
        double I = li ? (double)tp->dirs * H : (double)tp->in;
        f += tp->dirs * 18.0 * TB * H * (I + H);
    }
    return f;
}

/* --gemms: one product shape of the step, m x n = (m x k)(k x n), `count` times per step. */
typedef struct {
    const char *what;
    int64_t m, n, k, count;
    bool packable; /* a row-major left operand: the packed kernel applies */
} product;

typedef struct {
    const product *p;
    float *a, *b, *c, *packed;
    bool use_packed;
    int copies; /* how many directions and layers have this shape */
    rl_tensor t[4];
} product_ctx;

static void run_product(void *ctx, int64_t reps) {
    const product_ctx *x = ctx;
    const product *p = x->p;
    for (int64_t r = 0; r < reps; r++)
        for (int64_t i = 0; i < p->count; i++)
            if (x->use_packed)
                rl_gemm_packed_f32(p->m, p->n, p->k, x->a, p->k, x->packed, false, x->c, p->n);
            else if (p->packable)
                rl_blas_sgemm(false, false, p->m, p->n, p->k, 1.0f, x->a, p->k, x->b, p->n, 0.0f,
                              x->c, p->n);
            else /* the weight gradients: (k x m)^T (k x n) */
                rl_blas_sgemm(true, false, p->m, p->n, p->k, 1.0f, x->a, p->m, x->b, p->n, 0.0f,
                              x->c, p->n);
}

static float *bench_alloc(rl_tensor *t, int64_t elems, rl_rng *g) {
    int64_t sh[1] = {elems};
    empty(t, 1, sh, "operand");
    bench_check(rl_op_normal(t, g, 0, 1), "operand");
    return rl_tensor_data(t);
}

/* Sets up one shape's operands in x and times it with both kernels where the packed one
 * applies; x keeps the faster. Returns its seconds per step. */
static double time_product(const product *p, rl_rng *g, product_ctx *x) {
    *x = (product_ctx){.p = p};
    x->a = bench_alloc(&x->t[0], p->m * p->k, g);
    x->b = bench_alloc(&x->t[1], p->k * p->n, g);
    x->c = bench_alloc(&x->t[2], p->m * p->n, g);
    if (!p->packable || !rl_gemm_packed_fast()) {
        double sec;
        bench_row(1, &(bench_variant){run_product, x}, &sec);
        return sec;
    }
    product_ctx y = *x;
    y.packed = bench_alloc(&x->t[3], rl_gemm_packed_size(p->k, p->n), g);
    rl_gemm_pack_f32(y.packed, y.b, p->n, false, p->k, p->n);
    y.use_packed = true;
    bench_variant v[2] = {{run_product, x}, {run_product, &y}};
    double sec[2];
    bench_row(2, v, sec);
    if (sec[1] >= sec[0]) return sec[0];
    x->packed = y.packed, x->use_packed = true;
    return sec[1];
}

/* --gemms' products at their faster kernels, each as often as a step has it. */
typedef struct {
    product_ctx *xs;
    int n;
} product_set;

static void run_products(void *ctx, int64_t reps) {
    const product_set *s = ctx;
    for (int64_t r = 0; r < reps; r++)
        for (int i = 0; i < s->n; i++)
            for (int c = 0; c < s->xs[i].copies; c++)
                run_product(&s->xs[i], 1);
}

/* The products of one GRU direction of a layer with F inputs: the input projection, the
 * per-step recurrent products forward and backward, the weight gradients and (above the lowest
 * layer) the input gradient. */
static int layer_products(const topology *tp, int64_t F, bool input_grad, product *out) {
    int64_t TB = tp->T * tp->B, B = tp->B, H = tp->hidden, G = 3 * H;
    product ps[] = {
        {"input projection X W", TB, G, F, 1, true},
        {"recurrent h U, per step", B, G, H, tp->T, true},
        {"recurrent dG U^T, per step", B, H, G, tp->T, true},
        {"dU = H^T dG", H, G, TB, 1, false},
        {"dW = X^T dG", F, G, TB, 1, false},
        {"dX = dG W^T", TB, F, G, 1, true},
    };
    int n = input_grad ? 6 : 5;
    memcpy(out, ps, (size_t)n * sizeof *ps);
    return n;
}

static int gemms(const topology *tp, rl_rng *g) {
    printf("### GRU step's products alone, %s (rnnlua, float32, CPU, %d threads)\n\n", tp->name,
           rl_blas_get_threads());
    printf("| layer | product | m x n x k | per step | kernel | ms/step | GFLOP/s |\n");
    printf("|---|---|---|---:|---|---:|---:|\n");
    double flops = 0;
    product ps[2][6];
    product_ctx xs[12];
    product_set set = {xs, 0};
    for (int li = 0; li < tp->layers && li < 2; li++) { /* layers above 2 repeat layer 2 */
        int64_t F = li ? (int64_t)tp->dirs * tp->hidden : tp->in;
        int n = layer_products(tp, F, li > 0, ps[li]);
        for (int i = 0; i < n; i++) {
            const product *p = &ps[li][i];
            product_ctx *x = &xs[set.n++];
            double sec = time_product(p, g, x);
            double f = 2.0 * (double)p->m * (double)p->n * (double)p->k * (double)p->count;
            x->copies = tp->dirs * (li ? tp->layers - 1 : 1);
            printf("| %d%s | %s | %lld x %lld x %lld | %lld | %s | %.2f | %.1f |\n", li + 1,
                   li && tp->layers > 2 ? "+" : "", p->what, (long long)p->m, (long long)p->n,
                   (long long)p->k, (long long)p->count, x->use_packed ? "packed" : "BLAS",
                   sec * 1e3, f / sec / 1e9);
            flops += x->copies * f;
        }
    }
    /* the products in sequence and the whole step, measured alternately */
    model m;
    model_init(&m, tp, g);
    bench_variant v[2] = {{run_products, &set}, {run_steps, &m}};
    double sec[2];
    bench_row(2, v, sec);
    model_free(&m);
    for (int i = 0; i < set.n; i++)
        for (int k = 0; k < 4; k++)
            rl_tensor_release(&xs[i].t[k]);
    printf("\nEach product as often as a step has it (%d direction(s) x %d layer(s)), measured "
           "alternately with the whole step: products alone %.1f ms (%.1f GFLOP/s), the whole "
           "step %.1f ms (%.1f GFLOP/s of products); the products at their best take %.0f%% of "
           "the step.\n",
           tp->dirs, tp->layers, sec[0] * 1e3, flops / sec[0] / 1e9, sec[1] * 1e3,
           flops / sec[1] / 1e9, 100 * sec[0] / sec[1]);
    return 0;
}

static const topology *find(const char *name) {
    for (size_t i = 0; i < sizeof TOPOS / sizeof TOPOS[0]; i++)
        if (strcmp(TOPOS[i].name, name) == 0) return &TOPOS[i];
    fprintf(stderr, "gru bench: unknown configuration '%s' (chime, ptb_large, seqmnist)\n", name);
    exit(1);
}

/* The serving side of bench/torch_gru.py's interleaved measurements. */
static int serve(const topology *tp, rl_rng *g) {
    model m;
    model_init(&m, tp, g);
    train_step(&m); /* page faults and buffers */
    printf("ready %.6g\n", step_flops(tp));
    fflush(stdout);
    long long reps;
    while (scanf("%lld", &reps) == 1 && reps > 0) {
        double t0 = bench_now();
        run_steps(&m, reps);
        printf("%.9f\n", bench_now() - t0);
        fflush(stdout);
    }
    model_free(&m);
    return 0;
}

int main(int argc, char **argv) {
    rl_ops_init();
    rl_rng g;
    rl_rng_seed(&g, 1);
    if (argc == 3 && strcmp(argv[1], "--serve") == 0) return serve(find(argv[2]), &g);
    if (argc == 3 && strcmp(argv[1], "--gemms") == 0) return gemms(find(argv[2]), &g);
    const topology *only = argc > 1 ? find(argv[1]) : NULL;
    printf("### GRU training step (rnnlua, float32, CPU, %d BLAS threads)\n\n",
           rl_blas_get_threads());
    printf("| config | ms/step | frames/s | GFLOP/s |\n");
    printf("|---|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof TOPOS / sizeof TOPOS[0]; i++) {
        const topology *tp = &TOPOS[i];
        if (only && only != tp) continue;
        model m;
        model_init(&m, tp, &g);
        bench_variant v = {run_steps, &m};
        double sec;
        bench_row(1, &v, &sec);
        printf("| %s | %.1f | %.0f | %.1f |\n", tp->name, sec * 1e3, (double)(tp->T * tp->B) / sec,
               step_flops(tp) / sec / 1e9);
        fflush(stdout);
        model_free(&m);
    }
    printf("\nFLOPs per step: 18*T*B*H*(I+H) per GRU direction and layer; bench/torch_gru.py "
           "compares with PyTorch's nn.GRU in one interleaved run.\n");
    return 0;
}
