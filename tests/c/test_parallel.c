/* Tests of the CPU helper pool (kernels/cpu/parallel.c): every part of every job runs exactly
 * once with the job's part count, back to back and after the helpers have gone to sleep; a
 * helper asleep is woken for a new job (a lost wake-up shows as parts that never run at the
 * same time); the caller asleep on a long part is woken when it ends (a lost wake-up hangs:
 * an alarm turns that into a failure); nested and concurrent callers run their parts
 * themselves. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    test_every_part_once();
    test_sleeping_helper_woken();
    test_sleeping_caller_woken();
    test_nested();
    test_concurrent_callers();
    alarm(0);
    TEST_MAIN_END();
}
