/* The helper pool of parallel.h. The parts of a job are claimed, not assigned: the caller and
 * every helper take the next unclaimed part until none is left, so a helper that is not on a
 * core when the job is posted (another process has it, on a loaded machine) costs nothing but
 * its share of the work, which the caller does; before, the caller waited for it. The claim
 * counter carries the job's generation and part count, so a helper that wakes late, after its
 * job is over or another has been posted, claims nothing of the wrong job. */
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
    /* generation << 32 | parts << 16 | the next part to claim, of the current job */
    _Atomic uint64_t claim;
    atomic_int finished; /* parts of the current job done */
    atomic_int sleeping;
    int helpers;
    unsigned start_gen[MAX_HELPERS + 1]; /* the generation each helper was created at */
    void (*fn)(void *, int, int);        /* the job of the current generation */
    void *ctx;
} pool = {.call_lock = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

/* Runs parts of generation g until none is left unclaimed. A part claimed keeps its job (fn,
 * ctx) current: the caller does not return before every part is finished. */
static void run_parts(unsigned g) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        int part = (int)(c & 0xffff), parts = (int)((c >> 16) & 0xffff);
        if ((unsigned)(c >> 32) != g || part >= parts) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        pool.fn(pool.ctx, part, parts);
        atomic_fetch_add_explicit(&pool.finished, 1, memory_order_release);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

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
        run_parts(g);
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
            atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
            unsigned g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
            atomic_store(&pool.claim, (uint64_t)g << 32 | (uint64_t)parts << 16);
            /* sequentially consistent: with the helper's sleeping++ then gen check, either it
             * sees the new generation or this sees it sleeping */
            atomic_fetch_add(&pool.gen, 1);
            if (atomic_load(&pool.sleeping) > 0) {
                pthread_mutex_lock(&pool.lock);
                pthread_cond_broadcast(&pool.wake);
                pthread_mutex_unlock(&pool.lock);
            }
            run_parts(g);
            int spins = 0;
            while (atomic_load_explicit(&pool.finished, memory_order_acquire) < parts)
                if (++spins % 1024 == 0) sched_yield();
            pthread_mutex_unlock(&pool.call_lock);
            return;
        }
        pthread_mutex_unlock(&pool.call_lock);
    }
    for (int p = 0; p < parts; p++)
        fn(ctx, p, parts);
}
