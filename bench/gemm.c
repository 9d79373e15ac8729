/* GEMM benchmark: float32 C (M,N) = A (M,K) @ B (K,N), all row-major and contiguous, four ways:
 *   direct        cblas_sgemm on the raw arrays, with OpenBLAS's own threads (as many as
 *                 rnnlua's; rnnlua itself runs OpenBLAS on one thread and splits products
 *                 over its own helpers, core/blas.c, so the ratios compare the two);
 *   rl_op_matmul  the C tensor API into a preallocated output;
 *   rl_op_gemm    the same with alpha = 1, beta = 0;
 *   rl.matmul     the Lua API, rl.matmul(a, b, out) in a Lua loop.
 * All four read and write the very same buffers. The Lua variant runs in a Lua state set up as
 * the rnnlua host sets up its own (standard libraries, generational GC, the rnnlua module as
 * the global `rl`, the embedded Lua library on package.searchers), so the loop is timed with
 * a wall clock from C: Lua itself has only os.clock, which is CPU time summed over threads.
 *
 * Prints a Markdown table (GFLOP/s = 2*M*N*K / seconds per call, median of the interleaved
 * rounds of bench.h) and the measured sgemm peak, the best direct GFLOP/s over the square
 * shapes, on a line "sgemm peak: X GFLOP/s" that bench/run.sh passes on to later benchmarks.
 * Then the FMA units' own limit: independent fused multiply-adds on registers, no memory, at the
 * kernels' level (rl_cpu_level_get: AVX-512 or AVX2 + FMA on x86-64), on 1 thread and on as many
 * as the products use, on the line "FMA peak: X GFLOP/s ..." - the ceiling no float32 product
 * can pass, against which the sgemm peak and the training steps' GFLOP/s can be judged.
 * Then the products of training steps, all four transposes, one thread: rnnlua's float32 kernels
 * (rl_blas_sgemm: kernels/cpu/gemm_small.h's rl_gemm_f32 at the avx2 and avx512 levels) against
 * cblas_sgemm with the OpenBLAS kernels in use (rl.blas_core's; OPENBLAS_CORETYPE=SkylakeX
 * compares with its AVX-512 ones), and the share of the one-thread FMA peak.
 * Exits 1 when the variants disagree. */
#include <cblas.h>
#include <inttypes.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "../core/blas.h"
#include "../core/rng.h"
#include "../kernels/cpu/cpu_level.h"
#include "../kernels/ops.h"
#include "../lua/l_tensor.h"
#include "bench.h"

typedef struct {
    int64_t m, k, n;
    bool square;
} shape;

static const shape shapes[] = {
    {1024, 1024, 1024, true},
    {2048, 2048, 2048, true},
    {16, 512, 2048, false},  /* LSTM: one time step, batch 16, input 512 -> 4 gates of 512 */
    {4000, 45, 2048, false}, /* LSTM: the input projection of all frames at once */
};

typedef struct {
    const shape *s;
    rl_tensor a, b, c;
    lua_State *L; /* stack: loop chunk, a, b, c as tensor userdata */
} gemm_ctx;

static void run_direct(void *p, int64_t reps) {
    gemm_ctx *g = p;
    const float *a = rl_tensor_data(&g->a), *b = rl_tensor_data(&g->b);
    float *c = rl_tensor_data(&g->c);
    int m = (int)g->s->m, k = (int)g->s->k, n = (int)g->s->n;
    openblas_set_num_threads(rl_blas_get_threads());
    for (int64_t r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c,
                    n);
    openblas_set_num_threads(1);
}

static void run_matmul(void *p, int64_t reps) {
    gemm_ctx *g = p;
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_matmul(&g->c, &g->a, &g->b), "rl_op_matmul");
}

static void run_gemm(void *p, int64_t reps) {
    gemm_ctx *g = p;
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_op_gemm(&g->c, &g->a, &g->b, false, false, 1.0, 0.0), "rl_op_gemm");
}

static const char lua_loop[] = "local a, b, out, reps = ...\n"
                               "for _ = 1, reps do rl.matmul(a, b, out) end\n";

static void run_lua(void *p, int64_t reps) {
    gemm_ctx *g = p;
    for (int i = 1; i <= 4; i++)
        lua_pushvalue(g->L, i);
    lua_pushinteger(g->L, (lua_Integer)reps);
    if (lua_pcall(g->L, 4, 0, 0) != LUA_OK) {
        fprintf(stderr, "bench: the Lua loop failed: %s\n", lua_tostring(g->L, -1));
        exit(1);
    }
}

static lua_State *new_lua(void) {
    lua_State *L = luaL_newstate();
    if (!L) {
        fputs("bench: cannot create a Lua state\n", stderr);
        exit(1);
    }
    luaL_openlibs(L);
    lua_gc(L, LUA_GCGEN, 0, 0);
    /* luaopen_rnnlua installs the searcher of the embedded rnnlua.* modules */
    luaL_requiref(L, "rnnlua", luaopen_rnnlua, 0);
    lua_setglobal(L, "rl");
    return L;
}

static void push_shared(lua_State *L, const rl_tensor *t) {
    rl_tensor_share(rl_lua_push_tensor(L), t);
}

/* Largest |x - ref| relative to the largest |ref|. */
static double rel_diff(const float *x, const float *ref, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)x[i] - (double)ref[i]));
        mx = fmax(mx, fabs((double)ref[i]));
    }
    return mx > 0 ? d / mx : d;
}

/* Runs each variant once and compares its result with the direct call's. */
static void check_agree(gemm_ctx *g, const bench_variant *vs, int nv) {
    int64_t n = g->s->m * g->s->n;
    float *ref = malloc((size_t)n * sizeof(float));
    if (!ref) {
        fputs("bench: out of memory\n", stderr);
        exit(1);
    }
    float *c = rl_tensor_data(&g->c);
    vs[0].fn(vs[0].ctx, 1);
    memcpy(ref, c, (size_t)n * sizeof(float));
    for (int i = 1; i < nv; i++) {
        memset(c, 0xff, (size_t)n * sizeof(float)); /* NaNs: a variant that writes nothing fails */
        vs[i].fn(vs[i].ctx, 1);
        double d = rel_diff(c, ref, n);
        if (!(d <= 1e-5)) {
            fprintf(stderr, "bench: variant %d differs from cblas_sgemm by %g\n", i, d);
            exit(1);
        }
    }
    free(ref);
}

enum { NV = 4 };

/* Median seconds per call of each variant on shape s (fresh random operands). */
static void bench_shape(lua_State *L, const shape *s, double *t) {
    gemm_ctx g = {.s = s, .L = L};
    int64_t sa[2] = {s->m, s->k}, sb[2] = {s->k, s->n}, sc[2] = {s->m, s->n};
    bench_check(rl_tensor_empty(&g.a, RL_FLOAT32, RL_DEVICE_CPU, 2, sa), "empty");
    bench_check(rl_tensor_empty(&g.b, RL_FLOAT32, RL_DEVICE_CPU, 2, sb), "empty");
    bench_check(rl_tensor_empty(&g.c, RL_FLOAT32, RL_DEVICE_CPU, 2, sc), "empty");
    bench_check(rl_op_normal(&g.a, rl_rng_default(), 0, 1), "normal");
    bench_check(rl_op_normal(&g.b, rl_rng_default(), 0, 1), "normal");
    if (luaL_loadstring(L, lua_loop) != LUA_OK) {
        fprintf(stderr, "bench: %s\n", lua_tostring(L, -1));
        exit(1);
    }
    push_shared(L, &g.a);
    push_shared(L, &g.b);
    push_shared(L, &g.c);

    bench_variant vs[NV] = {{run_direct, &g}, {run_matmul, &g}, {run_gemm, &g}, {run_lua, &g}};
    check_agree(&g, vs, NV);
    bench_row(NV, vs, t);

    lua_settop(L, 0);
    lua_gc(L, LUA_GCCOLLECT);
    rl_tensor_release(&g.a);
    rl_tensor_release(&g.b);
    rl_tensor_release(&g.c);
}

/* ---- the products of training steps, one thread ---- */

typedef struct {
    const char *what;
    int64_t m, n, k;
    bool ta, tb;
} step_shape;

static const step_shape step_shapes[] = {
    {"ptb_large input product (1000 frames, 650 -> 4 x 650)", 1000, 2600, 650, false, false},
    {"ptb_large input gradient", 1000, 650, 2600, false, true},
    {"ptb_large weight gradient", 650, 2600, 1000, true, false},
    {"ptb_large output layer (650 -> 10000)", 1000, 10000, 650, false, false},
    {"ptb_large output layer's input gradient", 1000, 650, 10000, false, true},
    {"chime input product (4000 frames, 1024 -> 4 x 512)", 4000, 2048, 1024, false, false},
    {"chime weight gradient", 1024, 2048, 4000, true, false},
    {"seqmnist input product (1792 frames, 28 -> 4 x 128)", 1792, 512, 28, false, false},
    {"a conv2d's weight gradient (3 x 3 x 16 -> 32, 50000 pixels)", 144, 32, 50000, true, false},
    {"a 20-row product (650 -> 2600)", 20, 2600, 650, false, false},
};

typedef struct {
    const step_shape *s;
    float *a, *b, *c;
} step_ctx;

static void run_step_blas(void *p, int64_t reps) {
    step_ctx *g = p;
    const step_shape *s = g->s;
    for (int64_t r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n, (int)s->k, 1.0f, g->a,
                    (int)(s->ta ? s->m : s->k), g->b, (int)(s->tb ? s->k : s->n), 0.0f, g->c,
                    (int)s->n);
}

static void run_step_rl(void *p, int64_t reps) {
    step_ctx *g = p;
    const step_shape *s = g->s;
    for (int64_t r = 0; r < reps; r++)
        rl_blas_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, g->a, s->ta ? s->m : s->k, g->b,
                      s->tb ? s->k : s->n, 0.0f, g->c, s->n);
}

static double fma_peak(int threads, const char **level);

static void step_products(void) {
    int saved = rl_blas_get_threads();
    rl_blas_set_threads(1);
    openblas_set_num_threads(1);
    const char *found = NULL, *level = NULL;
    const char *core = rl_blas_core(&found);
    double f1 = fma_peak(1, &level);
    printf("\n### Products of training steps, float32, 1 thread: rnnlua's kernels (level %s) "
           "against OpenBLAS's %s (it chose %s)\n\n",
           rl_cpu_level_name(rl_cpu_level_get()), core, found);
    printf("| product | M x N x K | transposes | rnnlua GFLOP/s | OpenBLAS GFLOP/s | rnnlua / "
           "OpenBLAS | rnnlua / FMA peak (%.1f) |\n|---|---|---|---:|---:|---:|---:|\n",
           f1);
    for (size_t i = 0; i < sizeof step_shapes / sizeof *step_shapes; i++) {
        const step_shape *s = &step_shapes[i];
        step_ctx g = {s, malloc(sizeof(float) * (size_t)(s->m * s->k)),
                      malloc(sizeof(float) * (size_t)(s->k * s->n)),
                      malloc(sizeof(float) * (size_t)(s->m * s->n))};
        if (!g.a || !g.b || !g.c) {
            fprintf(stderr, "bench: out of memory\n");
            exit(1);
        }
        for (int64_t j = 0; j < s->m * s->k; j++)
            g.a[j] = (float)((j * 7919) % 1000) * 1e-3f - 0.5f;
        for (int64_t j = 0; j < s->k * s->n; j++)
            g.b[j] = (float)((j * 104729) % 1000) * 1e-3f - 0.5f;
        bench_variant vs[2] = {{run_step_rl, &g}, {run_step_blas, &g}};
        double t[2];
        bench_row(2, vs, t);
        double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        printf("| %s | %" PRId64 " x %" PRId64 " x %" PRId64 " | %s | %.1f | %.1f | %.2fx | "
               "%.0f%% |\n",
               s->what, s->m, s->n, s->k,
               s->ta ? (s->tb ? "A' B'" : "A' B") : (s->tb ? "A B'" : "A B"), flop / t[0] * 1e-9,
               flop / t[1] * 1e-9, t[1] / t[0], f1 > 0 ? 100 * flop / t[0] * 1e-9 / f1 : 0.0);
        fflush(stdout);
        free(g.a);
        free(g.b);
        free(g.c);
    }
    rl_blas_set_threads(saved);
}

/* ---- the FMA units' limit ---- */

#ifdef RL_CPU_X86
#include <immintrin.h>

/* FMA_CHAINS independent accumulators: more than latency (4 cycles) x FMA pipes (2) needs, so
 * the loop runs at the units' throughput. The values stay finite (x -> x * (1 + 1e-7) + 1e-7). */
#define FMA_CHAINS 12

RL_TARGET_AVX512 static float fma_loop_avx512(int64_t iters) {
    __m512 a[FMA_CHAINS];
    const __m512 m = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < FMA_CHAINS; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < FMA_CHAINS; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    float s = 0;
    for (int i = 0; i < FMA_CHAINS; i++)
        s += _mm512_reduce_add_ps(a[i]);
    return s;
}

RL_TARGET_AVX2 static float fma_loop_avx2(int64_t iters) {
    __m256 a[FMA_CHAINS];
    const __m256 m = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < FMA_CHAINS; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (int64_t k = 0; k < iters; k++)
        for (int i = 0; i < FMA_CHAINS; i++)
            a[i] = _mm256_fmadd_ps(a[i], m, c);
    float v[8], s = 0;
    for (int i = 0; i < FMA_CHAINS; i++) {
        _mm256_storeu_ps(v, a[i]);
        for (int j = 0; j < 8; j++)
            s += v[j];
    }
    return s;
}

typedef struct {
    bool avx512;
    int64_t iters;
    float sink;
} fma_job;

static void *fma_run(void *arg) {
    fma_job *j = arg;
    j->sink = j->avx512 ? fma_loop_avx512(j->iters) : fma_loop_avx2(j->iters);
    return NULL;
}

/* GFLOP/s of `threads` threads running the loop at once (best of 3), or 0 without FMA. */
static double fma_peak(int threads, const char **level) {
    rl_cpu_level lv = rl_cpu_level_get();
    if (lv < RL_CPU_AVX2) return 0;
    *level = lv == RL_CPU_AVX512 ? "AVX-512" : "AVX2 + FMA";
    const int64_t iters = 20 * 1000 * 1000;
    const double width = lv == RL_CPU_AVX512 ? 16 : 8;
    double best = 0;
    for (int round = 0; round < 3; round++) {
        fma_job jobs[16];
        pthread_t tid[16];
        int n = threads < 16 ? threads : 16, started = 0;
        double t0 = bench_now();
        for (int i = 0; i < n; i++) {
            jobs[i] = (fma_job){lv == RL_CPU_AVX512, iters, 0};
            if (i > 0 && pthread_create(&tid[i], NULL, fma_run, &jobs[i]) != 0) break;
            started = i + 1;
        }
        fma_run(&jobs[0]);
        for (int i = 1; i < started; i++)
            pthread_join(tid[i], NULL);
        double t = bench_now() - t0;
        double gf = started * (double)iters * FMA_CHAINS * width * 2 / t * 1e-9;
        if (gf > best) best = gf;
    }
    return best;
}
#else
static double fma_peak(int threads, const char **level) {
    (void)threads;
    (void)level;
    return 0;
}
#endif

int main(void) {
    rl_ops_init();
    rl_rng_seed(rl_rng_default(), 1);
    lua_State *L = new_lua();
    const char *names[NV] = {"cblas_sgemm", "rl_op_matmul", "rl_op_gemm", "rl.matmul (Lua)"};
    double peak = 0, t[NV];

    printf("### GEMM, float32, %d threads (%s)\n\n", rl_blas_get_threads(), openblas_get_config());
    printf("| M x K x N |");
    for (int i = 0; i < NV; i++)
        printf(" %s GFLOP/s |", names[i]);
    printf(" matmul / direct | gemm / direct | Lua / direct |\n|---|");
    for (int i = 0; i < NV + 3; i++)
        printf("---:|");
    printf("\n");
    fflush(stdout);

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        bench_shape(L, s, t);
        double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        /* the best float32 product this machine has, OpenBLAS's or rnnlua's own */
        double best = t[0] < t[1] ? t[0] : t[1];
        if (s->square && flop / best * 1e-9 > peak) peak = flop / best * 1e-9;
        printf("| %" PRId64 " x %" PRId64 " x %" PRId64 " |", s->m, s->k, s->n);
        for (int i = 0; i < NV; i++)
            printf(" %.1f |", flop / t[i] * 1e-9);
        for (int i = 1; i < NV; i++)
            printf(" %.3f |", t[0] / t[i]);
        printf("\n");
        fflush(stdout);
    }
    printf("\nRatios are speeds relative to the direct call (1.000 = the same; the goal is "
           "above 0.95).\n");

    /* A 1 x 1 x 1 product costs next to nothing, so the differences are the cost of each
     * layer itself; unlike the ratios above, they do not drown in machine noise. */
    const shape tiny = {1, 1, 1, false};
    bench_shape(L, &tiny, t);
    printf("Per-call overhead on a 1 x 1 x 1 product: cblas_sgemm %.0f ns; rl_op_matmul "
           "%+.0f ns, rl_op_gemm %+.0f ns, rl.matmul from Lua %+.0f ns over it.\n",
           1e9 * t[0], 1e9 * (t[1] - t[0]), 1e9 * (t[2] - t[0]), 1e9 * (t[3] - t[0]));
    printf("\nsgemm peak: %.1f GFLOP/s (the best of the direct call and rl_op_matmul over the "
           "square shapes)\n",
           peak);
    const char *level = NULL;
    int nt = rl_blas_get_threads();
    double f1 = fma_peak(1, &level), fn = nt > 1 ? fma_peak(nt, &level) : f1;
    if (level)
        printf("FMA peak: %.1f GFLOP/s on %d thread%s, %.1f on 1 (%s fused multiply-adds on "
               "registers); the sgemm peak is %.0f%% of it\n",
               fn, nt, nt > 1 ? "s" : "", f1, level, 100 * peak / fn);
    step_products();
    lua_close(L);
    return 0;
}
