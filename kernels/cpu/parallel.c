/* The helper pool of parallel.h. The parts of a job are claimed, not assigned: the caller and
 * every helper take the next unclaimed part until none is left, so a helper that is not on a
 * core when the job is posted (another process has it, on a loaded machine) costs nothing but
 * its share of the work, which the caller does, instead of making the caller wait. The claim
 * counter carries the job's generation and part count, so a helper that wakes late, after its
 * job is over or another has been posted, claims nothing of the wrong job.
 *
 * Waiting: a helper between jobs and the caller waiting for the last parts spin for a bounded
 * time with the CPU's pause instruction (a sched_yield every YIELD_EVERY rounds, which costs a
 * syscall but no context switch when nothing else wants the core, and hands the core to a BLAS
 * thread that does), then sleep on a futex: the helper on the generation, the caller on the
 * count of finished parts. Spinning on sched_yield alone, without the sleep, would keep waiting
 * threads on the cores that working ones need: with other threads also yielding between their
 * jobs, a training run spends a large share of its time in sched_yield and the scheduler. A
 * sleeper is woken only by the change it waits for (a new generation;
 * the last part finished), published before the waker reads the sleeper's flag, and the
 * sleeper sets its flag before it reads the value once more and passes that value to the
 * futex, which sleeps only while the value is unchanged: no wake-up is lost. */
#include "parallel.h"

#include "../../core/blas.h"

#include "gemm_bf16.h"
#ifdef RL_WITH_CUDA
#include "../cuda/context.h"
#endif

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELPERS (RL_CPU_MAX_PARTS - 1)
/* how long a waiter spins before it sleeps: about the gap between the parallel products of a
 * recurrent step, so that a helper is awake for the next one; a futex wake-up costs tens of
 * microseconds on a virtual machine */
#define SPIN_NS 100000
#define YIELD_EVERY 64

static struct {
    pthread_mutex_t call_lock;
    atomic_uint gen; /* futex word of the helpers: bumped once per job */
    /* generation << 32 | parts << 16 | the next part to claim, of the current job */
    _Atomic uint64_t claim;
    atomic_uint finished; /* futex word of the caller: parts of the current job done */
    atomic_int sleeping;  /* helpers asleep (or about to sleep) on gen */
    atomic_int caller_sleeping;
    int helpers;
    unsigned start_gen[MAX_HELPERS + 1]; /* the generation each helper was created at */
    void (*fn)(void *, int, int);        /* the job of the current generation */
    void *ctx;
    rl_bf16_ctx *bf16; /* the caller's active bf16 context (gemm_bf16.h), the parts' too */
#ifdef RL_WITH_CUDA
    rl_cuda_half_ctx *half; /* the same for its CUDA products (kernels/cuda/context.h) */
#endif
} pool = {.call_lock = PTHREAD_MUTEX_INITIALIZER};

static void futex_wait(atomic_uint *word, unsigned expected) {
    /* returns at once if *word != expected; spurious returns are re-checked by the callers */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *word, int n) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until *word != value or SPIN_NS have passed; returns whether it changed. */
static int spin_while(atomic_uint *word, unsigned value) {
    int64_t t0 = 0;
    for (unsigned round = 1;; round++) {
        if (atomic_load_explicit(word, memory_order_acquire) != value) return 1;
        cpu_relax();
        if (round % YIELD_EVERY == 0) {
            int64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return 0;
            sched_yield();
        }
    }
}

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
        rl_bf16_ctx *own = rl_bf16_active();
        rl_bf16_activate(pool.bf16);
#ifdef RL_WITH_CUDA
        rl_cuda_half_ctx *own_half = rl_cuda_half_active();
        rl_cuda_half_activate(pool.half);
#endif
        pool.fn(pool.ctx, part, parts);
        rl_bf16_activate(own);
#ifdef RL_WITH_CUDA
        rl_cuda_half_activate(own_half);
#endif
        /* sequentially consistent, as the caller's caller_sleeping++ then finished check:
         * either the caller sees this part finished or this sees the caller asleep */
        if (atomic_fetch_add(&pool.finished, 1) + 1 == (unsigned)parts &&
            atomic_load(&pool.caller_sleeping))
            futex_wake(&pool.finished, 1);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static void *helper_main(void *arg) {
    int part = (int)(intptr_t)arg;
    unsigned seen = pool.start_gen[part];
    for (;;) {
        if (!spin_while(&pool.gen, seen)) {
            /* sequentially consistent: with the caller's gen++ then sleeping check, either
             * this sees the new generation or the caller sees it sleeping */
            atomic_fetch_add(&pool.sleeping, 1);
            while (atomic_load(&pool.gen) == seen)
                futex_wait(&pool.gen, seen);
            atomic_fetch_sub(&pool.sleeping, 1);
        }
        seen = atomic_load_explicit(&pool.gen, memory_order_acquire);
        run_parts(seen);
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
            pool.bf16 = rl_bf16_active();
#ifdef RL_WITH_CUDA
            pool.half = rl_cuda_half_active();
#endif
            atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
            unsigned g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
            atomic_store(&pool.claim, (uint64_t)g << 32 | (uint64_t)parts << 16);
            atomic_fetch_add(&pool.gen, 1);
            /* parts - 1 sleepers at most: a helper awake claims too, and the caller claims what
             * no helper does */
            if (atomic_load(&pool.sleeping) > 0) futex_wake(&pool.gen, parts - 1);
            run_parts(g);
            unsigned done;
            while ((done = atomic_load_explicit(&pool.finished, memory_order_acquire)) <
                   (unsigned)parts) {
                if (spin_while(&pool.finished, done)) continue;
                atomic_store(&pool.caller_sleeping, 1);
                while ((done = atomic_load(&pool.finished)) < (unsigned)parts)
                    futex_wait(&pool.finished, done);
                atomic_store_explicit(&pool.caller_sleeping, 0, memory_order_relaxed);
            }
            pthread_mutex_unlock(&pool.call_lock);
            return;
        }
        pthread_mutex_unlock(&pool.call_lock);
    }
    for (int p = 0; p < parts; p++)
        fn(ctx, p, parts);
}

int rl_cpu_pass_parts(int64_t elements, int64_t units) {
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > units) parts = (int)units;
    return parts > 1 && elements >= ((int64_t)1 << 16) ? parts : 1;
}
