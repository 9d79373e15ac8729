/* Timing shared by the bench programs (each built on its own against the library).
 *
 * A "row" of a benchmark is a few variants of the same work (e.g. direct BLAS, the C tensor
 * API, the Lua API). bench_row() warms each variant up, picks each one's repetition count so
 * that one measurement takes about RL_BENCH_SECONDS (default 0.5 s) of wall time, then takes
 * RL_BENCH_ROUNDS (default 5) measurements of every variant interleaved (a, b, c, a, b, c, ...)
 * so that machine noise hits all variants alike, and returns the median seconds per call.
 *
 * Bench programs are not library code: on a failing op they print the message and exit 1. */
#ifndef RL_BENCH_H
#define RL_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/blas.h"
#include "../core/error.h"
#include "../core/rng.h"
#include "../core/tensor.h"
#include "../kernels/ops.h"
#include "../layers/layer.h"
#include "../tests/c/layer_opts.h" /* gc_opts: the options of the layers a benchmark makes */

#define BENCH_MAX_VARIANTS 16
#define BENCH_MAX_ROUNDS 99

/* Runs the variant's work `reps` times. */
typedef void (*bench_fn)(void *ctx, int64_t reps);

typedef struct {
    bench_fn fn;
    void *ctx;
} bench_variant;

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double bench_env(const char *name, double dflt, double lo, double hi) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    double v = strtod(s, &end);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "bench: %s=%s is not a number in [%g, %g]\n", name, s, lo, hi);
        exit(1);
    }
    return v;
}

static inline double bench_seconds(void) { return bench_env("RL_BENCH_SECONDS", 0.5, 1e-3, 60); }

static inline int bench_rounds(void) {
    return (int)bench_env("RL_BENCH_ROUNDS", 5, 1, BENCH_MAX_ROUNDS);
}

/* The streaming benchmarks' model (bench/stream.c, bench/serve_paced.c): a causal 3 x 512 LSTM
 * over 40 features, a 512 -> 40 softmax out, untrained (seed 1), written to `path` by the rnnlua
 * next to the bench's folder (argv0: BUILD/bench/NAME). Returns 0 when written. */
#define BENCH_STREAM_FEATURES 40
static inline int bench_write_stream_model(const char *argv0, const char *path) {
    char dir[4096], cmd[16384];
    const char *slash = strrchr(argv0, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - argv0) : 1, slash ? argv0 : ".");
    snprintf(cmd, sizeof cmd,
             "%s/../rnnlua -e \"rl.manual_seed(1); rl.save_checkpoint('%s', {epoch = 1, net = "
             "rl.network({l1 = {class = 'lstm', n_out = 512}, l2 = {class = 'lstm', n_out = 512, "
             "from = 'l1'}, l3 = {class = 'lstm', n_out = 512, from = 'l2'}, output = {class = "
             "'softmax', from = 'l3', loss = 'ce', target = 'classes'}}, {data = {dim = %d}, "
             "classes = {dim = 40, sparse = true}})})\"",
             dir, path, BENCH_STREAM_FEATURES);
    if (system(cmd) == 0) return 0;
    fprintf(stderr, "bench: writing the model failed: %s\n", cmd);
    return 1;
}

static inline void bench_check(rl_status st, const char *what) {
    if (st != RL_OK) {
        fprintf(stderr, "bench: %s failed: %s\n", what, rl_errmsg());
        exit(1);
    }
}

/* t (unset) <- a float32 tensor of the shape on dev, normal(0, std) from g. It is drawn on the
 * CPU and copied, so a run on a device starts from the values the CPU run draws. */
static inline void bench_normal(rl_tensor *t, int ndim, const int64_t *shape, rl_rng *g, double std,
                                rl_device dev) {
    rl_tensor h = {0};
    bench_check(rl_tensor_empty(&h, RL_FLOAT32, RL_DEVICE_CPU, ndim, shape), "tensor");
    bench_check(rl_op_normal(&h, g, 0, std), "normal");
    if (rl_device_eq(dev, RL_DEVICE_CPU)) {
        *t = h;
        return;
    }
    bench_check(rl_op_to(t, &h, RL_FLOAT32, dev), "tensor to the device");
    rl_tensor_release(&h);
}

/* Gives every parameter of l a float32 value on dev, initialised by rl_param_init from g (on
 * the CPU, then copied, as bench_normal), and a zeroed gradient beside it. */
static inline void bench_layer_params(rl_layer *l, rl_rng *g, rl_device dev) {
    for (int p = 0; p < l->n_params; p++) {
        rl_param *pp = &l->params[p];
        bench_check(rl_tensor_empty(&pp->value, RL_FLOAT32, RL_DEVICE_CPU, pp->ndim, pp->shape),
                    "param");
        bench_check(rl_param_init(pp, g), "init");
        if (!rl_device_eq(dev, RL_DEVICE_CPU)) {
            rl_tensor d = {0};
            bench_check(rl_op_to(&d, &pp->value, RL_FLOAT32, dev), "param to the device");
            rl_tensor_release(&pp->value);
            pp->value = d;
        }
        bench_check(rl_tensor_empty(&pp->grad, RL_FLOAT32, dev, pp->ndim, pp->shape), "grad");
        bench_check(rl_op_fill(&pp->grad, 0.0), "grad");
    }
}

static inline double bench_time(const bench_variant *v, int64_t reps) {
    double t0 = bench_now();
    v->fn(v->ctx, reps);
    return bench_now() - t0;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fills per_call[i] with the median seconds per call of variant i. */
static inline void bench_row(int n, const bench_variant *vs, double *per_call) {
    double target = bench_seconds();
    int rounds = bench_rounds();
    int64_t reps[BENCH_MAX_VARIANTS];
    for (int i = 0; i < n; i++) {
        /* the first call pays for page faults and BLAS buffers; then grow the count until one
         * measurement is long enough to estimate the cost of a call */
        bench_time(&vs[i], 1);
        int64_t r = 1;
        double t;
        while ((t = bench_time(&vs[i], r)) < target / 10)
            r *= 2;
        double want = target * (double)r / t;
        reps[i] = want < 1 ? 1 : (int64_t)(want + 0.5);
    }
    double times[BENCH_MAX_VARIANTS][BENCH_MAX_ROUNDS];
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < n; i++)
            times[i][k] = bench_time(&vs[i], reps[i]) / (double)reps[i];
    for (int i = 0; i < n; i++) {
        qsort(times[i], (size_t)rounds, sizeof(double), bench_cmp_double);
        per_call[i] = rounds % 2 ? times[i][rounds / 2]
                                 : 0.5 * (times[i][rounds / 2 - 1] + times[i][rounds / 2]);
    }
}

#define BENCH_MAX_L 3 /* layers of a recurrent stack (bench_stack_*) */
#define BENCH_MAX_D 2 /* its directions */

/* p <- the training io of a layer of the stack's level li: lengths len, its inputs x (li = 0)
 * or the dirs outputs of level li - 1. */
static inline void bench_stack_io(rl_layer_io *p, int li, int dirs, rl_layer *l[][BENCH_MAX_D],
                                  const rl_tensor *x, const rl_tensor *len) {
    memset(p, 0, sizeof *p);
    p->lengths = len;
    p->train = true;
    p->n_in = li ? dirs : 1;
    for (int k = 0; k < p->n_in; k++)
        p->in[k] = li ? &l[li - 1][k]->out : x;
}

/* Frees the layers l[li][d] of a stack of `layers` x `dirs` and its input gradients gin[li][d][k].
 */
static inline void bench_stack_free(int layers, int dirs, rl_layer *l[][BENCH_MAX_D],
                                    rl_tensor gin[][BENCH_MAX_D][BENCH_MAX_D]) {
    for (int li = 0; li < layers; li++)
        for (int d = 0; d < dirs; d++) {
            rl_layer_free(l[li][d]);
            for (int k = 0; k < BENCH_MAX_D; k++)
                rl_tensor_release(&gin[li][d][k]);
        }
}

/* After layer li's backward: the gradient of the layer below's output k is the sum over the
 * directions d of gin[li][d][k], accumulated into gin[li][0][k], where gout[k] then points. */
static inline void bench_stack_sum_grads(int li, int dirs,
                                         rl_tensor gin[][BENCH_MAX_D][BENCH_MAX_D],
                                         rl_tensor **gout) {
    for (int k = 0; k < dirs; k++) {
        for (int d = 1; d < dirs; d++)
            bench_check(rl_op_binary(&gin[li][0][k], &gin[li][0][k], &gin[li][d][k], RL_BIN_ADD),
                        "add");
        gout[k] = &gin[li][0][k];
    }
}

/* Layer li (from 0), direction d (0 forward, 1 backward) of a stack of recurrent layers of class
 * cls (impl: its "impl" option, or NULL): n_out H, reading the data (in features) at li = 0, else
 * the dirs outputs of the layer below; named l<li+1>_fw / l<li+1>_bw; parameters from g on dev
 * (bench_layer_params). Above the first layer, gin[0..dirs-1] (unset) get its input gradients,
 * float32 (T, B, H) on dev. */
static inline rl_layer *bench_stack_layer(const char *cls, const char *impl, int li, int d,
                                          int dirs, int64_t in, int64_t H, int64_t T, int64_t B,
                                          rl_tensor *gin, rl_rng *g, rl_device dev) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", (double)H);
    gc_opt_num(&o, "direction", d ? -1.0 : 1.0);
    if (impl) gc_opt_str(&o, "impl", impl);
    rl_options opts = gc_options(&o);
    int n_in = li ? dirs : 1;
    int64_t dims[2] = {li ? H : in, H}, s[3] = {T, B, H};
    char name[32];
    snprintf(name, sizeof name, "l%d_%s", li + 1, d ? "bw" : "fw");
    rl_layer *l = NULL;
    bench_check(rl_layer_create(&l, cls, name, &opts, n_in, dims), name);
    bench_layer_params(l, g, dev);
    for (int k = 0; k < n_in && li > 0; k++)
        bench_check(rl_tensor_empty(&gin[k], RL_FLOAT32, dev, 3, s), "gin");
    return l;
}

/* The machine's sgemm speed in GFLOP/s: the best of 1024^3 and 2048^3 products through the
 * BLAS rnnlua links (OpenBLAS by default), measured by bench_row. Benchmarks report their
 * speed as a fraction of it. */
typedef struct {
    int64_t n;
    float *a, *b, *c;
} bench_sgemm_ctx;

static inline void bench_run_sgemm(void *ctx, int64_t reps) {
    bench_sgemm_ctx *s = ctx;
    for (int64_t r = 0; r < reps; r++)
        rl_blas_sgemm(false, false, s->n, s->n, s->n, 1.0f, s->a, s->n, s->b, s->n, 0.0f, s->c,
                      s->n);
}

/* s multiplies n x n matrices held in t[0..2] (released by bench_sgemm_free). */
static inline void bench_sgemm_init(bench_sgemm_ctx *s, rl_tensor *t, int64_t n) {
    int64_t sh[2] = {n, n};
    float **p[3] = {&s->a, &s->b, &s->c};
    s->n = n;
    for (int i = 0; i < 3; i++) {
        t[i] = (rl_tensor){0};
        bench_check(rl_tensor_empty(&t[i], RL_FLOAT32, RL_DEVICE_CPU, 2, sh), "sgemm");
        bench_check(rl_op_fill(&t[i], 0.5), "sgemm");
        *p[i] = rl_tensor_data(&t[i]);
    }
}

static inline void bench_sgemm_free(rl_tensor *t) {
    for (int i = 0; i < 3; i++)
        rl_tensor_release(&t[i]);
}

static inline double bench_sgemm_peak(void) {
    double best = 0;
    for (int64_t n = 1024; n <= 2048; n *= 2) {
        rl_tensor t[3];
        bench_sgemm_ctx s;
        bench_sgemm_init(&s, t, n);
        bench_variant v = {bench_run_sgemm, &s};
        double sec;
        bench_row(1, &v, &sec);
        double gf = 2.0 * (double)n * (double)n * (double)n / sec / 1e9;
        best = gf > best ? gf : best;
        bench_sgemm_free(t);
    }
    return best;
}

#endif
