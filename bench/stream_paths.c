/* The two paths of a push (docs/embedding.md, "Pushes in C") side by side in one process: the
 * causal 3 x 512 LSTM of bench/stream.c loaded twice, once with its pushes in C (the default)
 * and once with RNNLUA_CAPI_PUSH=lua (through its Lua network), and S streams of each pushed one
 * 40-value frame a call, the two models' calls alternating, so that both see the same load.
 * push: rl_session_push of one stream; many: rl_session_push_many of S streams. Prints p50, p90,
 * p99 and the largest latency of each path.
 * Usage: stream_paths [--mode push|many] [--streams S] [--calls N] [--threads T]
 *                     [--precision fp32|bf16] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/rnnlua.h"
#include "bench.h"

#define NFEAT BENCH_STREAM_FEATURES

static void die(const char *what) {
    fprintf(stderr, "stream_paths: %s: %s\n", what, rl_errmsg());
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double p) {
    return sorted[(int)(p / 100.0 * (n - 1) + 0.5)];
}

int main(int argc, char **argv) {
    const char *mode = "push", *precision = "fp32";
    int streams = 1, calls = 2000, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mode") == 0)
            mode = argv[i + 1];
        else if (strcmp(argv[i], "--streams") == 0)
            streams = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--calls") == 0)
            calls = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--precision") == 0)
            precision = argv[i + 1];
    }
    int many = strcmp(mode, "many") == 0;
    if ((!many && strcmp(mode, "push") != 0) || streams < 1 || streams > 4096 || calls < 10 ||
        threads < 1 || (!many && streams != 1)) {
        fputs("usage: stream_paths [--mode push|many] [--streams S (many)] [--calls N>=10] "
              "[--threads T] [--precision fp32|bf16]\n",
              stderr);
        return 2;
    }
    char model[256];
    snprintf(model, sizeof model, "/tmp/rnnlua-bench-paths-%d.h5", (int)getpid());
    if (bench_write_stream_model(argv[0], model) != 0) return 1;
    rl_model *m[2]; /* 0: pushes in C, 1: through Lua */
    rl_model_options o = {.threads = threads};
    setenv("RNNLUA_CAPI_PUSH", "lua", 1);
    if (rl_model_load(&m[1], model, &o) != RL_OK) die("rl_model_load");
    unsetenv("RNNLUA_CAPI_PUSH");
    if (rl_model_load(&m[0], model, &o) != RL_OK) die("rl_model_load");
    remove(model);
    rl_session **ss[2];
    rl_batch *c = calloc((size_t)streams, sizeof *c);
    rl_output *out = calloc((size_t)streams, sizeof *out);
    float *x = calloc((size_t)streams * NFEAT, sizeof *x);
    double *lat[2] = {calloc((size_t)calls, sizeof(double)), calloc((size_t)calls, sizeof(double))};
    if (!c || !out || !x || !lat[0] || !lat[1]) return 1;
    for (int v = 0; v < 2; v++) {
        if (rl_model_set_precision(m[v], precision) != RL_OK) die("rl_model_set_precision");
        ss[v] = calloc((size_t)streams, sizeof *ss[v]);
        if (ss[v] == NULL) return 1;
        for (int i = 0; i < streams; i++)
            if (rl_session_open(&ss[v][i], m[v]) != RL_OK) die("rl_session_open");
    }
    for (int r = 0; r < calls + 50; r++) /* 50 calls of warm-up */
        for (int v = 0; v < 2; v++) {
            for (int i = 0; i < streams; i++) {
                for (int k = 0; k < NFEAT; k++)
                    x[i * NFEAT + k] = (float)(((r + i) * 31 + k * 7) % 17) / 17.0f - 0.5f;
                c[i] = (rl_batch){.T = 1, .B = 1, .F = NFEAT, .x = x + i * NFEAT};
            }
            double t0 = bench_now();
            rl_status st = many ? rl_session_push_many(ss[v], c, streams, out)
                                : rl_session_push(ss[v][0], c, out);
            if (st != RL_OK) die(many ? "rl_session_push_many" : "rl_session_push");
            if (r >= 50) lat[v][r - 50] = bench_now() - t0;
        }
    printf("### Pushes in C and through Lua (bench/stream_paths.c)\n\n"
           "One 40-value frame a call through the causal 3 x 512 LSTM of bench/stream.c, %d calls "
           "after 50 of warm-up, the model loaded twice (pushes in C; RNNLUA_CAPI_PUSH=lua), "
           "the two models' calls alternating.\n\n",
           calls);
    printf("| path | call | streams | threads | precision | p50 ms | p90 ms | p99 ms | max ms |\n"
           "|---|---|---:|---:|---|---:|---:|---:|---:|\n");
    for (int v = 0; v < 2; v++) {
        qsort(lat[v], (size_t)calls, sizeof(double), cmp_double);
        printf("| %s | %s | %d | %d | %s | %.3f | %.3f | %.3f | %.3f |\n", v ? "Lua" : "C",
               many ? "`rl_session_push_many`" : "`rl_session_push`", streams, threads, precision,
               1e3 * pct(lat[v], calls, 50), 1e3 * pct(lat[v], calls, 90),
               1e3 * pct(lat[v], calls, 99), 1e3 * lat[v][calls - 1]);
        for (int i = 0; i < streams; i++)
            rl_session_free(ss[v][i]);
        free(ss[v]);
        rl_model_free(m[v]);
        free(lat[v]);
    }
    free(c), free(out), free(x);
    return 0;
}
