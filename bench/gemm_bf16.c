/* bf16 GEMM benchmark: C (M,N) = A (M,K) @ B (K,N), float32 in and out, against the float32
 * product in the same run:
 *   sgemm         rl_blas_sgemm (OpenBLAS on rnnlua's threads, core/blas.c);
 *   bf16 LEVEL    rl_gemm_bf16_packed at each bf16 level this machine has (kernels/cpu/
 *                 gemm_bf16.h), B packed beforehand as a layer's weights are, A rounded per call;
 *   bf16 +pack    rl_gemm_bf16 at the best level: B rounded and packed inside every call.
 * Prints a Markdown table, GFLOP/s = 2*M*N*K / seconds per call (median of bench.h's
 * interleaved rounds), and each bf16 variant's speed over sgemm's. Exits 1 when a bf16 result
 * is further from sgemm's than bf16 allows (2^-6 of the largest |C|, a loose sanity bound; the
 * tight ones are tests/c/test_gemm_bf16.c's). */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "../kernels/cpu/cpu_level.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "bench.h"

typedef struct {
    int64_t m, k, n;
    const char *what;
} shape;

static const shape shapes[] = {
    {1024, 1024, 1024, "square"},
    {2048, 2048, 2048, "square"},
    {16, 512, 2048, "LSTM 512 step, batch 16"},
    {64, 1024, 4096, "LSTM 1024 step, batch 64"},
    {1, 768, 3072, "LSTM 768 step, batch 1"},
    {4000, 45, 2048, "input projection, 4000 frames"},
    {4000, 1024, 4096, "input projection, 4000 frames"},
};

typedef struct {
    const shape *s;
    float *a, *b, *c;
    uint16_t *packed;
    rl_bf16_level level;
} ctx;

static void run_sgemm(void *p, int64_t reps) {
    ctx *g = p;
    for (int64_t r = 0; r < reps; r++)
        rl_blas_sgemm(false, false, g->s->m, g->s->n, g->s->k, 1.0f, g->a, g->s->k, g->b, g->s->n,
                      0.0f, g->c, g->s->n);
}

static void run_packed(void *p, int64_t reps) {
    ctx *g = p;
    bench_check(rl_bf16_level_set(g->level), "bf16 level");
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_gemm_bf16_packed(false, g->s->m, g->s->n, g->s->k, 1.0f, g->a, g->s->k,
                                        g->packed, 0.0f, g->c, g->s->n),
                    "rl_gemm_bf16_packed");
}

static void run_unpacked(void *p, int64_t reps) {
    ctx *g = p;
    bench_check(rl_bf16_level_set(g->level), "bf16 level");
    for (int64_t r = 0; r < reps; r++)
        bench_check(rl_gemm_bf16(false, false, g->s->m, g->s->n, g->s->k, 1.0f, g->a, g->s->k, g->b,
                                 g->s->n, 0.0f, g->c, g->s->n),
                    "rl_gemm_bf16");
}

static void *alloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fputs("bench: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

static uint64_t state = 88172645463325252ull;
static float next_value(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (float)((double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(void) {
    rl_bf16_level best = rl_bf16_level_get();
    int nlev = (int)best + 1, nv = nlev + 2;
    printf("bf16 GEMM, %d threads, kernel level %s, bf16 levels generic .. %s\n\n",
           rl_blas_get_threads(), rl_cpu_level_name(rl_cpu_level_get()), rl_bf16_level_name(best));
    printf("| M | K | N | shape | sgemm GFLOP/s |");
    for (int l = 0; l < nlev; l++)
        printf(" bf16 %s |", rl_bf16_level_name((rl_bf16_level)l));
    printf(" bf16 %s +pack |\n|---|---|---|---|---|", rl_bf16_level_name(best));
    for (int l = 0; l <= nlev; l++)
        printf("---|");
    printf("\n");
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n), nc = (size_t)(s->m * s->n);
        float *a = alloc(sizeof(float) * na), *b = alloc(sizeof(float) * nb),
              *c = alloc(sizeof(float) * nc), *ref = alloc(sizeof(float) * nc);
        uint16_t *packed = alloc(sizeof(uint16_t) * (size_t)rl_bf16_packed_size(s->k, s->n));
        for (size_t i = 0; i < na; i++)
            a[i] = next_value();
        for (size_t i = 0; i < nb; i++)
            b[i] = next_value();
        rl_bf16_pack(packed, b, s->n, false, s->k, s->n);
        ctx cs[BENCH_MAX_VARIANTS];
        bench_variant vs[BENCH_MAX_VARIANTS];
        for (int v = 0; v < nv; v++) {
            cs[v] = (ctx){
                s, a,      b,
                c, packed, v == 0 ? RL_BF16_GENERIC : v <= nlev ? (rl_bf16_level)(v - 1) : best};
            vs[v] = (bench_variant){v == 0      ? run_sgemm
                                    : v <= nlev ? run_packed
                                                : run_unpacked,
                                    &cs[v]};
        }
        vs[0].fn(vs[0].ctx, 1);
        memcpy(ref, c, sizeof(float) * nc);
        double cmax = 0;
        for (size_t i = 0; i < nc; i++)
            cmax = fmax(cmax, fabs(ref[i]));
        for (int v = 1; v < nv; v++) {
            memset(c, 0xff, sizeof(float) * nc);
            vs[v].fn(vs[v].ctx, 1);
            double d = 0;
            for (size_t i = 0; i < nc; i++)
                d = fmax(d, fabs((double)c[i] - ref[i]));
            if (!(d <= cmax / 64)) {
                fprintf(stderr, "bench: bf16 variant %d differs from sgemm by %g (max |C| %g)\n", v,
                        d, cmax);
                return 1;
            }
        }
        double t[BENCH_MAX_VARIANTS];
        bench_row(nv, vs, t);
        double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        printf("| %" PRId64 " | %" PRId64 " | %" PRId64 " | %s | %.1f |", s->m, s->k, s->n, s->what,
               flop / t[0] / 1e9);
        for (int v = 1; v < nv; v++)
            printf(" %.1f (%.2fx) |", flop / t[v] / 1e9, t[0] / t[v]);
        printf("\n");
        fflush(stdout);
        free(a), free(b), free(c), free(ref), free(packed);
    }
    bench_check(rl_bf16_level_set(best), "bf16 level");
    return 0;
}
