/* Elementwise benchmark: memory bandwidth of the tensor API's CPU loops on 16M float32
 * (64 MiB per tensor), against memcpy of the same bytes measured in the same run.
 *
 * GB/s counts bytes read plus bytes written by the op (1 GB = 1e9 bytes): a copy moves 2 x 64
 * MiB, out = a + b 3 x 64 MiB, fill 1 x 64 MiB, a sum 1 x 64 MiB. Write-allocate traffic is not
 * counted, for memcpy as for the ops, so the ratio compares like with like. The loops are
 * single-threaded, so OpenBLAS is set to 1 thread to leave the machine quiet. Timing and
 * interleaving as in bench.h. Prints a Markdown table. */
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "../core/rng.h"
#include "../kernels/ops.h"
#include "bench.h"

#define NUMEL (16 * 1024 * 1024)

typedef struct {
    rl_tensor a, b, out;
} tensors;

typedef struct {
    const char *name;
    int traffic; /* bytes moved per element, in units of one tensor */
    bench_fn fn;
} op_case;

static tensors T;

static void run_memcpy(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        memcpy(rl_tensor_data(&T.out), rl_tensor_data(&T.a), (size_t)NUMEL * sizeof(float));
}

static void run_copy(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_copy(&T.out, &T.a), "rl_op_copy");
}

static void run_fill(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_fill(&T.out, 0.5), "rl_op_fill");
}

static void run_add(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_binary(&T.out, &T.a, &T.b, RL_BIN_ADD), "rl_op_binary add");
}

static void run_mul_scalar(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_binary_scalar(&T.out, &T.a, 0.5, RL_BIN_MUL, false),
                    "rl_op_binary_scalar mul");
}

/* out is scratch that every other op overwrites, so its values stay small */
static void run_add_inplace(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_binary(&T.out, &T.out, &T.b, RL_BIN_ADD), "rl_op_binary add_");
}

static void unary(rl_unary_op op, int64_t reps) {
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_unary(&T.out, &T.a, op, 0, 0), rl_unary_name(op));
}

static void run_tanh(void *p, int64_t reps) { unary(RL_UN_TANH, reps); }
static void run_sigmoid(void *p, int64_t reps) { unary(RL_UN_SIGMOID, reps); }
static void run_exp(void *p, int64_t reps) { unary(RL_UN_EXP, reps); }
static void run_relu(void *p, int64_t reps) { unary(RL_UN_RELU, reps); }

static volatile double sink;

static void run_sum(void *p, int64_t reps) {
    for (int64_t r = 0; r < reps; r++) {
        double s;
        bench_check(rl_op_reduce_all(&s, NULL, &T.a, RL_RED_SUM), "rl_op_reduce_all sum");
        sink = s;
    }
}

static const op_case cases[] = {
    {"memcpy", 2, run_memcpy},
    {"copy (`rl_op_copy`)", 2, run_copy},
    {"fill", 1, run_fill},
    {"add: out = a + b", 3, run_add},
    {"mul by scalar: out = 0.5 a", 2, run_mul_scalar},
    {"add in place: a += b", 3, run_add_inplace},
    {"tanh", 2, run_tanh},
    {"sigmoid", 2, run_sigmoid},
    {"exp", 2, run_exp},
    {"relu", 2, run_relu},
    {"sum (reduce all)", 1, run_sum},
};

#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Spot checks that the ops computed what their names say, so that a broken kernel cannot
 * pass for a fast one. */
static void check_results(void) {
    const float *a = rl_tensor_data(&T.a), *b = rl_tensor_data(&T.b);
    const float *o = rl_tensor_data(&T.out);
    const int64_t probe[] = {0, 1, 12345, NUMEL / 2 + 7, NUMEL - 1};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        int64_t j = probe[i];
        run_add(NULL, 1);
        float add = o[j];
        run_tanh(NULL, 1);
        float th = o[j];
        if (add != a[j] + b[j] || fabsf(th - tanhf(a[j])) > 1e-6f) {
            fprintf(stderr, "bench: wrong result at %lld: add %g (want %g), tanh %g (want %g)\n",
                    (long long)j, add, a[j] + b[j], th, tanhf(a[j]));
            exit(1);
        }
    }
    double s = 0, want = 0;
    run_sum(NULL, 1);
    s = sink;
    for (int64_t j = 0; j < NUMEL; j++)
        want += a[j];
    if (fabs(s - want) > 1e-6 * NUMEL) {
        fprintf(stderr, "bench: sum is %g, want %g\n", s, want);
        exit(1);
    }
}

int main(void) {
    rl_ops_init();
    rl_blas_set_threads(1);
    rl_rng *rng = rl_rng_default();
    rl_rng_seed(rng, 1);
    int64_t shape[1] = {NUMEL};
    bench_check(rl_tensor_empty(&T.a, RL_FLOAT32, RL_DEVICE_CPU, 1, shape), "empty");
    bench_check(rl_tensor_empty(&T.b, RL_FLOAT32, RL_DEVICE_CPU, 1, shape), "empty");
    bench_check(rl_tensor_empty(&T.out, RL_FLOAT32, RL_DEVICE_CPU, 1, shape), "empty");
    bench_check(rl_op_normal(&T.a, rng, 0, 1), "normal");
    bench_check(rl_op_normal(&T.b, rng, 0, 1), "normal");
    bench_check(rl_op_fill(&T.out, 0), "fill");
    check_results();

    bench_variant vs[NCASES];
    for (int i = 0; i < NCASES; i++)
        vs[i] = (bench_variant){cases[i].fn, NULL};
    double t[NCASES];
    bench_row(NCASES, vs, t);

    double mib = (double)NUMEL * sizeof(float);
    printf("### Elementwise, float32, %d elements (64 MiB per tensor), 1 thread\n\n", NUMEL);
    printf("| op | bytes moved | ms per call | GB/s | / memcpy |\n|---|---:|---:|---:|---:|\n");
    double base = 2 * mib / t[0];
    for (int i = 0; i < NCASES; i++) {
        double gbs = cases[i].traffic * mib / t[i];
        printf("| %s | %d x 64 MiB | %.2f | %.2f | %.2f |\n", cases[i].name, cases[i].traffic,
               1e3 * t[i], 1e-9 * gbs, gbs / base);
    }
    printf("\nGB/s counts bytes read + written (1 GB = 1e9 bytes); / memcpy is the ratio to "
           "memcpy's GB/s in this run.\n");
    rl_tensor_release(&T.a);
    rl_tensor_release(&T.b);
    rl_tensor_release(&T.out);
    return 0;
}
