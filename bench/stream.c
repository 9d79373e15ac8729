/* Streaming latency of the C API (include/rnnlua.h): one frame a rl_session_push through a causal
 * 3 x 512 LSTM (40 features in, a 512 -> 40 softmax out), the latency of each push measured
 * alone; then the same with S sessions pushing in S threads at once (each thread one stream).
 * The model is an untrained checkpoint that BUILD/rnnlua writes (the bench is next to it:
 * BUILD/bench/stream). Prints a Markdown section for bench/README.md.
 * Before that, the cost of a session: N sessions opened one after another (the time of each
 * rl_session_open), then N opened at once from N threads (the wall time until all are open),
 * and the process's resident memory with the N sessions open, against the model's alone.
 * --precision bf16: the model's products in bf16 (rl_model_set_precision).
 * Usage: stream [--frames N] [--streams S] [--threads T] [--sessions N] [--precision P] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/rnnlua.h"
#include "bench.h"

#define NFEAT BENCH_STREAM_FEATURES

typedef struct {
    rl_model *m;
    int frames;
    double *lat; /* seconds a push */
} stream_job;

static void die(const char *what) {
    fprintf(stderr, "stream: %s: %s\n", what, rl_errmsg());
    exit(1);
}

static void *run_stream(void *p) {
    stream_job *j = p;
    rl_session *s;
    rl_output out;
    float x[NFEAT];
    if (rl_session_open(&s, j->m) != RL_OK) die("rl_session_open");
    for (int i = 0; i < j->frames + 50; i++) { /* 50 pushes of warm-up */
        for (int k = 0; k < NFEAT; k++)
            x[k] = (float)((i * 31 + k * 7) % 17) / 17.0f - 0.5f;
        rl_batch c = {.T = 1, .B = 1, .F = NFEAT, .x = x};
        double t0 = bench_now();
        if (rl_session_push(s, &c, &out) != RL_OK) die("rl_session_push");
        if (i >= 50) j->lat[i - 50] = bench_now() - t0;
    }
    rl_session_free(s);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* S streams pushed together, one frame each a rl_session_push_many, frames calls after 50 of
 * warm-up from one thread: the latency of each call, sorted, into lat; interleaved with them,
 * the same S frames as one plain batch (rl_session_forward of S sequences of one frame, no
 * carried state) in another session, sorted into plain: what the batch's products cost
 * without the streams' states. */
static void run_many(rl_model *m, int streams, int frames, double *lat, double *plain) {
    rl_session *ss[64];
    rl_batch cs[64];
    rl_output outs[64];
    float x[64][NFEAT];
    int32_t ones[64];
    rl_session *one;
    if (rl_session_open(&one, m) != RL_OK) die("rl_session_open");
    for (int i = 0; i < streams; i++) {
        if (rl_session_open(&ss[i], m) != RL_OK) die("rl_session_open");
        ones[i] = 1;
    }
    for (int k = 0; k < frames + 50; k++) {
        for (int i = 0; i < streams; i++) {
            for (int f = 0; f < NFEAT; f++)
                x[i][f] = (float)((k * 31 + f * 7 + i) % 17) / 17.0f - 0.5f;
            cs[i] = (rl_batch){.T = 1, .B = 1, .F = NFEAT, .x = x[i]};
        }
        double t0 = bench_now();
        if (rl_session_push_many(ss, cs, streams, outs) != RL_OK) die("rl_session_push_many");
        double t1 = bench_now();
        rl_batch all = {.T = 1, .B = streams, .F = NFEAT, .x = x[0], .lengths = ones};
        if (rl_session_forward(one, &all, NULL, &outs[0]) != RL_OK) die("rl_session_forward");
        if (k >= 50) lat[k - 50] = t1 - t0, plain[k - 50] = bench_now() - t1;
    }
    for (int i = 0; i < streams; i++)
        rl_session_free(ss[i]);
    rl_session_free(one);
    qsort(lat, (size_t)frames, sizeof *lat, cmp_double);
    qsort(plain, (size_t)frames, sizeof *plain, cmp_double);
}

static void *open_one(void *p) {
    rl_session **s = p;
    rl_model *m = (rl_model *)*s;
    if (rl_session_open(s, m) != RL_OK) die("rl_session_open");
    return NULL;
}

/* The resident set of this process in MB (Linux /proc/self/statm; 0 elsewhere). */
static double rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f == NULL) return 0;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1e6;
}

static double pct(const double *sorted, int n, double p) {
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return sorted[i];
}

/* S streams at once, frames pushes each: the latencies of all pushes, sorted, into lat. */
static void run(rl_model *m, int streams, int frames, double *lat) {
    pthread_t th[64];
    stream_job jobs[64];
    for (int i = 0; i < streams; i++) {
        jobs[i] = (stream_job){.m = m, .frames = frames, .lat = lat + (size_t)i * frames};
        pthread_create(&th[i], NULL, run_stream, &jobs[i]);
    }
    for (int i = 0; i < streams; i++)
        pthread_join(th[i], NULL);
    qsort(lat, (size_t)streams * frames, sizeof *lat, cmp_double);
}

int main(int argc, char **argv) {
    int frames = 2000, max_streams = 8, threads = 1, sessions = 16;
    const char *precision = "fp32";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--frames") == 0)
            frames = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--streams") == 0)
            max_streams = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--sessions") == 0)
            sessions = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--precision") == 0)
            precision = argv[i + 1];
    }
    if (frames < 10 || max_streams < 1 || max_streams > 64 || threads < 1 || sessions < 1 ||
        sessions > 1024) {
        fputs("usage: stream [--frames N>=10] [--streams 1..64] [--threads T] [--sessions "
              "1..1024] [--precision fp32|bf16]\n",
              stderr);
        return 2;
    }
    char model[256];
    snprintf(model, sizeof model, "/tmp/rnnlua-bench-stream-%d.h5", (int)getpid());
    if (bench_write_stream_model(argv[0], model) != 0) return 1;
    rl_model *m;
    rl_model_options o = {.threads = threads};
    rl_status st = rl_model_load(&m, model, &o);
    remove(model);
    if (st != RL_OK) die("rl_model_load");
    if (rl_model_set_precision(m, precision) != RL_OK) die("rl_model_set_precision");
    double *lat = malloc(sizeof *lat * (size_t)frames * max_streams);
    rl_session **ss = calloc((size_t)sessions, sizeof *ss);
    double *open_s = calloc((size_t)sessions, sizeof *open_s);
    pthread_t *th = calloc((size_t)sessions, sizeof *th);
    if (lat == NULL || ss == NULL || open_s == NULL || th == NULL) return 1;
    double rss0 = rss_mb();
    for (int i = 0; i < sessions; i++) {
        double t0 = bench_now();
        if (rl_session_open(&ss[i], m) != RL_OK) die("rl_session_open");
        open_s[i] = bench_now() - t0;
    }
    double rss_n = rss_mb();
    for (int i = 0; i < sessions; i++)
        rl_session_free(ss[i]);
    qsort(open_s, (size_t)sessions, sizeof *open_s, cmp_double);
    double t0 = bench_now();
    for (int i = 0; i < sessions; i++) {
        ss[i] = (rl_session *)m; /* open_one's argument: the model in, the session out */
        pthread_create(&th[i], NULL, open_one, &ss[i]);
    }
    for (int i = 0; i < sessions; i++)
        pthread_join(th[i], NULL);
    double wall = bench_now() - t0;
    for (int i = 0; i < sessions; i++)
        rl_session_free(ss[i]);
    printf("### Opening sessions (bench/stream.c)\n\n"
           "%d sessions of the model below: opened one after another, rl_session_open took "
           "%.1f ms at the median and %.1f ms at the most; opened at once from %d threads, all "
           "were open after %.1f ms. Resident memory: %.0f MB with the model loaded, %.0f MB "
           "with the %d sessions open (%.1f MB a session).\n\n",
           sessions, 1e3 * pct(open_s, sessions, 50), 1e3 * open_s[sessions - 1], sessions,
           1e3 * wall, rss0, rss_n, sessions, (rss_n - rss0) / sessions);
    free(ss);
    free(open_s);
    free(th);
    printf(
        "### Streaming through the C API (bench/stream.c)\n\n"
        "One 40-value frame a `rl_session_push` through a causal 3 x 512 LSTM (softmax 40 out), "
        "%d pushes a stream after 50 of warm-up, %d BLAS thread(s), precision %s; S streams push "
        "at once from S threads, each with its own session.\n\n"
        "| streams | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|\n",
        frames, threads, precision);
    for (int s = 1; s <= max_streams; s *= 2) {
        run(m, s, frames, lat);
        int n = s * frames;
        printf("| %d | %.3f | %.3f | %.3f | %.3f |\n", s, 1e3 * pct(lat, n, 50),
               1e3 * pct(lat, n, 90), 1e3 * pct(lat, n, 99), 1e3 * lat[n - 1]);
        fflush(stdout);
    }
    printf("\nThe same S streams pushed together from one thread, one frame each a "
           "`rl_session_push_many` (one batched forward); interleaved with them, the same S "
           "frames as one plain batch of S one-frame sequences (`rl_session_forward`, no "
           "carried state):\n\n"
           "| streams | p50 ms | p90 ms | p99 ms | max ms | plain batch p50 ms |\n"
           "|---|---|---|---|---|---|\n");
    double *plain = malloc(sizeof *plain * (size_t)frames);
    if (plain == NULL) return 1;
    for (int s = 1; s <= max_streams; s *= 2) {
        run_many(m, s, frames, lat, plain);
        printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", s, 1e3 * pct(lat, frames, 50),
               1e3 * pct(lat, frames, 90), 1e3 * pct(lat, frames, 99), 1e3 * lat[frames - 1],
               1e3 * pct(plain, frames, 50));
        fflush(stdout);
    }
    free(lat);
    free(plain);
    rl_model_free(m);
    return 0;
}
