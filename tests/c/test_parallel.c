/* Tests of the CPU helper pool (kernels/cpu/parallel.c): every part of every job runs exactly
 * once with the job's part count, back to back and after the helpers have gone to sleep; a
 * helper asleep is woken for a new job (a lost wake-up shows as parts that never run at the
 * same time); the caller asleep on a long part is woken when it ends (a lost wake-up hangs:
 * an alarm turns that into a failure); nested and concurrent callers run their parts
 * themselves; products split over the pool (core/blas.c) equal a float64 reference and are
 * bit-identical on 1, 2 and 3 threads, split by columns and by rows, every transpose, padded
 * leading dimensions, beta != 0; a thread's own thread count stays its own. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../core/blas.h"
#include "../../kernels/cpu/parallel.h"
#include "check.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Counts the runs of each part and any call with a wrong part count. */
typedef struct {
    int parts;
    atomic_int runs[RL_CPU_MAX_PARTS];
    atomic_int wrong_parts;
    long work_us; /* a part sleeps this long (0: returns at once) */
} count_job;

static void count_part(void *ctx, int part, int parts) {
    count_job *j = ctx;
    if (parts != j->parts || part < 0 || part >= parts) {
        atomic_fetch_add(&j->wrong_parts, 1);
        return;
    }
    if (j->work_us > 0) sleep_us(j->work_us);
    atomic_fetch_add(&j->runs[part], 1);
}

/* Posts a job of `parts` parts; true when each part ran once with the right part count. */
static bool run_count_job(int parts, long work_us) {
    count_job j = {.parts = parts > RL_CPU_MAX_PARTS ? RL_CPU_MAX_PARTS : parts,
                   .work_us = work_us};
    rl_cpu_parallel(parts, count_part, &j);
    bool ok = atomic_load(&j.wrong_parts) == 0;
    for (int p = 0; p < RL_CPU_MAX_PARTS; p++)
        ok = ok && atomic_load(&j.runs[p]) == (p < j.parts ? 1 : 0);
    return ok;
}

/* the part counts of most jobs: a few helpers, as on the machines the tests run on */
#define PARTS 8

static void test_every_part_once(void) {
    int bad = 0;
    /* back to back: helpers awake, claiming races with the caller */
    for (int i = 0; i < 20000; i++)
        bad += !run_count_job(1 + i % (PARTS + 1), 0);
    CHECK(bad == 0);
    /* with pauses longer than the helpers' spin, so they sleep between jobs */
    bad = 0;
    for (int i = 0; i < 60; i++) {
        sleep_us(i % 3 == 0 ? 1000 : 150);
        bad += !run_count_job(2 + i % (PARTS - 1), 0);
    }
    CHECK(bad == 0);
    /* more parts than the pool takes are cut to RL_CPU_MAX_PARTS; later jobs of fewer parts
     * wake no more sleepers than they need, and still run every part */
    CHECK(run_count_job(RL_CPU_MAX_PARTS + 3, 0));
    bad = 0;
    for (int i = 0; i < 200; i++) {
        if (i % 20 == 0) sleep_us(1000);
        bad += !run_count_job(2 + i % 3, 0);
    }
    CHECK(bad == 0);
}

/* Two parts that each wait (up to a timeout) until the other has started: they end quickly
 * only when a helper runs one while the caller runs the other. */
typedef struct {
    atomic_int started;
    atomic_int met; /* parts that saw the other start before the timeout */
} meet_job;

static void meet_part(void *ctx, int part, int parts) {
    (void)part;
    (void)parts;
    meet_job *j = ctx;
    atomic_fetch_add(&j->started, 1);
    double t0 = now_s();
    while (atomic_load(&j->started) < 2)
        if (now_s() - t0 > 1.0) return;
    atomic_fetch_add(&j->met, 1);
}

static void test_sleeping_helper_woken(void) {
    int met = 0, rounds = 20;
    for (int i = 0; i < rounds; i++) {
        sleep_us(2000); /* well past the spin: the helper is asleep on the futex */
        meet_job j = {0};
        rl_cpu_parallel(2, meet_part, &j);
        met += atomic_load(&j.met) == 2;
    }
    /* every round, unless a wake-up is lost (then the caller runs both parts, each waiting out
     * the timeout, and none meet) */
    CHECK(met == rounds);
    if (met != rounds) fprintf(stderr, "  helper woken in %d of %d rounds\n", met, rounds);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_parallel: hung (a lost wake-up of the waiting caller)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

static void test_sleeping_caller_woken(void) {
    /* parts of 3 ms: the caller, done with its share, waits past its spin and sleeps */
    int bad = 0;
    for (int i = 0; i < 40; i++)
        bad += !run_count_job(2 + i % 3, i % 2 ? 3000 : 300);
    CHECK(bad == 0);
}

/* A part that posts a job of its own: the pool is busy, so that job runs on this thread. */
static void nested_part(void *ctx, int part, int parts) {
    (void)parts;
    atomic_int *ok = ctx;
    if (run_count_job(3, 0)) atomic_fetch_add(&ok[part], 1);
}

static void test_nested(void) {
    atomic_int ok[4] = {0};
    rl_cpu_parallel(4, nested_part, ok);
    for (int p = 0; p < 4; p++)
        CHECK(atomic_load(&ok[p]) == 1);
}

static void *concurrent_caller(void *arg) {
    atomic_int *bad = arg;
    for (int i = 0; i < 3000; i++)
        if (!run_count_job(1 + i % 4, i % 500 == 0 ? 200 : 0)) atomic_fetch_add(bad, 1);
    return NULL;
}

static void test_concurrent_callers(void) {
    atomic_int bad = 0;
    pthread_t th[3];
    int started = 0;
    for (int t = 0; t < 3; t++)
        started += pthread_create(&th[t], NULL, concurrent_caller, &bad) == 0;
    CHECK(started == 3);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    CHECK(atomic_load(&bad) == 0);
}

/* C (m x n, ldc = n + 3) = alpha op(A) op(B) + beta C; A, B stored with 5 columns of padding */
static void split_product(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          const float *a, const float *b, float *c, const double *ad,
                          const double *bd, double *cd) {
    int64_t lda = (ta ? m : k) + 5, ldb = (tb ? k : n) + 5, ldc = n + 3;
    for (int64_t i = 0; i < m * ldc; i++) {
        c[i] = (float)(i % 11) * 0.25f;
        cd[i] = (double)(i % 11) * 0.25;
    }
    rl_blas_set_threads(threads);
    rl_blas_sgemm(ta, tb, m, n, k, 1.5f, a, lda, b, ldb, 0.5f, c, ldc);
    rl_blas_dgemm(ta, tb, m, n, k, 1.5, ad, lda, bd, ldb, 0.5, cd, ldc);
}

static void test_split_products(void) {
    int saved = rl_blas_get_threads();
    /* 2 m n k >= 3 parts of the split's minimum (1 MFLOP): wide (split by columns), tall (by
     * rows), and a decoder step's few-row products (G2P: 64 rows; 2.1 MFLOP: 2 parts, 6.3: 3) */
    const int64_t shapes[4][3] = {{45, 701, 300}, {701, 45, 300}, {64, 128, 128}, {64, 384, 128}};
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            int64_t na = (ta ? k : m) * ((ta ? m : k) + 5), nb = (tb ? n : k) * ((tb ? k : n) + 5);
            int64_t nc = m * (n + 3);
            float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
            double *ad = malloc(sizeof(double) * (size_t)na);
            double *bd = malloc(sizeof(double) * (size_t)nb);
            float *c[3];
            double *cd[3];
            for (int v = 0; v < 3; v++) {
                c[v] = malloc(sizeof(float) * (size_t)nc);
                cd[v] = malloc(sizeof(double) * (size_t)nc);
            }
            for (int64_t i = 0; i < na; i++)
                ad[i] = a[i] = (float)((i * 7919) % 201 - 100) / 128.0f;
            for (int64_t i = 0; i < nb; i++)
                bd[i] = b[i] = (float)((i * 104729) % 199 - 99) / 128.0f;
            for (int v = 0; v < 3; v++)
                split_product(v + 1, ta, tb, m, n, k, a, b, c[v], ad, bd, cd[v]);
            /* the reference: the float64 product of the same (float-exact) inputs */
            double worst = 0;
            int64_t lda = (ta ? m : k) + 5, ldb = (tb ? k : n) + 5, ldc = n + 3;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double sum = 0;
                    for (int64_t p = 0; p < k; p++)
                        sum +=
                            ad[ta ? p * lda + i : i * lda + p] * bd[tb ? j * ldb + p : p * ldb + j];
                    double want = 1.5 * sum + 0.5 * (double)((i * ldc + j) % 11) * 0.25;
                    double e = fabs((double)c[1][i * ldc + j] - want);
                    if (e > worst) worst = e;
                    if (fabs(cd[1][i * ldc + j] - want) > 1e-9) worst = 1e9;
                }
            CHECK(worst < 1e-3);
            /* the padding of C is never written */
            bool pad = true;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = n; j < ldc; j++)
                    pad = pad && c[1][i * ldc + j] == (float)((i * ldc + j) % 11) * 0.25f;
            CHECK(pad);
            CHECK(memcmp(c[0], c[1], sizeof(float) * (size_t)nc) == 0);
            CHECK(memcmp(c[0], c[2], sizeof(float) * (size_t)nc) == 0);
            CHECK(memcmp(cd[0], cd[1], sizeof(double) * (size_t)nc) == 0);
            CHECK(memcmp(cd[0], cd[2], sizeof(double) * (size_t)nc) == 0);
            if (worst >= 1e-3)
                fprintf(stderr, "  split product %s%s %lld x %lld x %lld: error %g\n",
                        ta ? "A'" : "A", tb ? "B'" : "B", (long long)m, (long long)n, (long long)k,
                        worst);
            free(a), free(b), free(ad), free(bd);
            for (int v = 0; v < 3; v++)
                free(c[v]), free(cd[v]);
        }
    rl_blas_set_threads(saved);
}

static void *local_threads_thread(void *arg) {
    int *seen = arg;
    rl_blas_set_local_threads(1);
    seen[0] = rl_blas_get_threads();
    seen[1] = rl_cpu_pass_parts(1 << 20, 100);
    rl_blas_set_local_threads(0);
    seen[2] = rl_blas_get_threads();
    return NULL;
}

/* A thread's own count (the stream server's batch task) applies to that thread alone; the
 * passes' part count follows it, the elements (64K at least) and the units. */
static void test_local_threads(void) {
    int saved = rl_blas_get_threads();
    rl_blas_set_threads(3);
    CHECK(rl_cpu_pass_parts(1 << 20, 100) == 3);
    CHECK(rl_cpu_pass_parts(1 << 20, 2) == 2);
    CHECK(rl_cpu_pass_parts((1 << 16) - 1, 100) == 1);
    int seen[3] = {0, 0, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, local_threads_thread, seen) == 0);
    pthread_join(th, NULL);
    CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 3);
    CHECK(rl_blas_get_threads() == 3);
    rl_blas_set_threads(saved);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    test_every_part_once();
    test_sleeping_helper_woken();
    test_sleeping_caller_woken();
    test_nested();
    test_concurrent_callers();
    test_split_products();
    test_local_threads();
    alarm(0);
    TEST_MAIN_END();
}
