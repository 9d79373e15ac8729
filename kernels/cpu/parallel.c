/* The helper pool of parallel.h. Every helper acknowledges every generation, also those without
 * a part, so that none can still be reading a job when the next is posted. */
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#define MAX_HELPERS (RL_CPU_MAX_PARTS - 1)
#define SPIN_ROUNDS 2000

static struct {
    pthread_mutex_t call_lock, lock;
    pthread_cond_t wake;
    atomic_uint gen;
    atomic_int done;
    atomic_int sleeping;
    int helpers;
    unsigned start_gen[MAX_HELPERS + 1]; /* the generation each helper was created at */
    void (*fn)(void *, int, int);        /* the job posted with the current generation */
    void *ctx;
    int parts;
} pool = {.call_lock = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static void *helper_main(void *arg) {
    int part = (int)(intptr_t)arg;
    unsigned seen = pool.start_gen[part];
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ROUNDS) {
                /* yield rather than pause: a BLAS thread may want this core meanwhile */
                if (spins > 64) sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleeping, 1);
            while (atomic_load(&pool.gen) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.lock);
            spins = 0;
        }
        seen = g;
        if (part < pool.parts) pool.fn(pool.ctx, part, pool.parts);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
    return NULL;
}

/* Starts helpers up to want (once each); returns how many run. */
static int ensure_helpers(int want) {
    if (want > MAX_HELPERS) want = MAX_HELPERS;
    while (pool.helpers < want) {
        pthread_t th;
        pool.start_gen[pool.helpers + 1] = atomic_load(&pool.gen);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, helper_main, (void *)(intptr_t)(pool.helpers + 1));
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        pool.helpers++;
    }
    return pool.helpers;
}

void rl_cpu_parallel(int parts, void (*fn)(void *ctx, int part, int parts), void *ctx) {
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > 1 && pthread_mutex_trylock(&pool.call_lock) == 0) {
        if (1 + ensure_helpers(parts - 1) >= parts) {
            pool.fn = fn;
            pool.ctx = ctx;
            pool.parts = parts;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            /* sequentially consistent: with the helper's sleeping++ then gen check, either it
             * sees the new generation or this sees it sleeping */
            atomic_fetch_add(&pool.gen, 1);
            if (atomic_load(&pool.sleeping) > 0) {
                pthread_mutex_lock(&pool.lock);
                pthread_cond_broadcast(&pool.wake);
                pthread_mutex_unlock(&pool.lock);
            }
            fn(ctx, 0, parts);
            int spins = 0;
            while (atomic_load_explicit(&pool.done, memory_order_acquire) < pool.helpers)
                if (++spins % 1024 == 0) sched_yield();
            pthread_mutex_unlock(&pool.call_lock);
            return;
        }
        pthread_mutex_unlock(&pool.call_lock);
    }
    for (int p = 0; p < parts; p++)
        fn(ctx, p, parts);
}
