/* The bf16 products (kernels/cpu/gemm_bf16.h) at every bf16 level this machine has, and the
 * conversions of core/bf16.h.
 *
 * Tolerances, from bf16's unit roundoff u = 2^-8 (8 significand bits) and float32's 2^-24:
 *  - against a float64 product of the float32 operands: rounding both operands moves each term
 *    a*b by at most (2u + u^2)|a b|, and k float32 additions plus the alpha/beta step add at
 *    most (k + 4) 2^-24 of the sum of magnitudes, so per element
 *        |c - ref| <= (2u + u^2) |alpha| S + (k + 4) 2^-24 (|alpha| S + |beta c0|),
 *    S = sum_l |a_il b_lj|;
 *  - a level against the generic one: both multiply the very same bf16 values exactly, only the
 *    float32 sums differ: twice the second term (S of the rounded operands, <= (1 + u)^2 S);
 *  - operands that are small integers (exact in bf16, sums exact in float32): every level
 *    gives the float64 result exactly, which pins packing and indexing.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/bf16.h"
#include "../../core/blas.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/cpu/gemm_bf16.h"
#include "../../kernels/cpu/parallel.h"
#include "../../layers/matrix.h"
#include "check.h"

#define U_BF16 (1.0 / 256.0)
#define U_F32 (1.0 / 16777216.0)

static uint64_t state = 0x9e3779b97f4a7c15ull;
static double next_value(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void test_conversions(void) {
    CHECK(rl_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(rl_f32_to_bf16(-2.5f) == 0xc020);
    /* ties go to the even neighbour: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6 */
    CHECK(rl_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
    CHECK(rl_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
    /* past the tie rounds up, below it down (truncation would give 0x3f80 for both) */
    CHECK(rl_f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
    CHECK(rl_f32_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
    CHECK(rl_f32_to_bf16(from_bits(0x3f80ffffu)) == 0x3f81);
    /* a carry through the significand into the exponent */
    CHECK(rl_f32_to_bf16(from_bits(0x3fffffffu)) == 0x4000);
    CHECK(rl_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80); /* FLT_MAX -> inf */
    CHECK(rl_f32_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);
    CHECK(rl_f32_to_bf16(from_bits(0x7f800000u)) == 0x7f80);
    CHECK(rl_f32_to_bf16(from_bits(0xff800000u)) == 0xff80);
    /* NaNs whose payload is only in the dropped bits stay NaN */
    uint16_t nan = rl_f32_to_bf16(from_bits(0x7f800001u));
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0);
    nan = rl_f32_to_bf16(from_bits(0xffc00000u));
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0 && (nan & 0x8000));
    CHECK(rl_f32_to_bf16(0.0f) == 0 && rl_f32_to_bf16(-0.0f) == 0x8000);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue; /* NaN payloads get the quiet bit */
        if (rl_f32_to_bf16(rl_bf16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK(bad == 0);
    CHECK(bits(rl_bf16_to_f32(0x3f81)) == 0x3f810000u);
}

typedef struct {
    int64_t m, n, k;
    bool ta, tb, ints;
    float alpha, beta;
} gcase;

/* op(A) stored M x K (lda K+3) or K x M (lda M+2); op(B) K x N (ldb N+1) or N x K (ldb K+5);
 * C M x N with ldc N+3, whose extra columns must stay untouched */
typedef struct {
    float *a, *b, *c0, *c;
    double *ref, *mag;
    int64_t lda, ldb, ldc;
} operands;

static float draw(bool ints) {
    double v = next_value();
    return ints ? (float)(int)(v * 8.0) : (float)v;
}

static void make(const gcase *g, operands *o) {
    o->lda = g->ta ? g->m + 2 : g->k + 3;
    o->ldb = g->tb ? g->k + 5 : g->n + 1;
    o->ldc = g->n + 3;
    size_t na = (size_t)((g->ta ? g->k : g->m) * o->lda + 1),
           nb = (size_t)((g->tb ? g->n : g->k) * o->ldb + 1), nc = (size_t)(g->m * o->ldc);
    o->a = malloc(sizeof(float) * na);
    o->b = malloc(sizeof(float) * nb);
    o->c0 = malloc(sizeof(float) * nc);
    o->c = malloc(sizeof(float) * nc);
    o->ref = malloc(sizeof(double) * nc);
    o->mag = malloc(sizeof(double) * nc);
    for (size_t i = 0; i < na; i++)
        o->a[i] = draw(g->ints);
    for (size_t i = 0; i < nb; i++)
        o->b[i] = draw(g->ints);
    for (size_t i = 0; i < nc; i++)
        o->c0[i] = draw(g->ints);
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double s = 0, mag = 0;
            for (int64_t l = 0; l < g->k; l++) {
                double x = g->ta ? o->a[l * o->lda + i] : o->a[i * o->lda + l];
                double y = g->tb ? o->b[j * o->ldb + l] : o->b[l * o->ldb + j];
                s += x * y;
                mag += fabs(x * y);
            }
            double c0 = o->c0[i * o->ldc + j];
            o->ref[i * o->ldc + j] = g->alpha * s + (g->beta != 0 ? g->beta * c0 : 0);
            o->mag[i * o->ldc + j] = mag;
        }
}

static void release(operands *o) {
    free(o->a), free(o->b), free(o->c0), free(o->c), free(o->ref), free(o->mag);
}

/* C through the packed entry point or the one-off one (alternately, both are API) */
static rl_status run(const gcase *g, operands *o, bool prepacked, float *c) {
    memcpy(c, o->c0, sizeof(float) * (size_t)(g->m * o->ldc));
    if (g->beta == 0)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++)
                c[i * o->ldc + j] = NAN; /* beta 0 must not read C */
    if (!prepacked)
        return rl_gemm_bf16(g->ta, g->tb, g->m, g->n, g->k, g->alpha, o->a, o->lda, o->b, o->ldb,
                            g->beta, c, o->ldc);
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)rl_bf16_packed_size(g->k, g->n));
    rl_bf16_pack(p, o->b, o->ldb, g->tb, g->k, g->n);
    rl_status st =
        rl_gemm_bf16_packed(g->ta, g->m, g->n, g->k, g->alpha, o->a, o->lda, p, g->beta, c, o->ldc);
    free(p);
    return st;
}

/* worst error over the allowed error (<= 1 passes); -1 when C's padding columns changed */
static double judge(const gcase *g, const operands *o, const float *c, const float *other,
                    double *worst_abs) {
    double worst = 0;
    for (int64_t i = 0; i < g->m; i++) {
        for (int64_t j = 0; j < g->n; j++) {
            int64_t ix = i * o->ldc + j;
            double beta_term = fabs((double)g->beta * o->c0[ix]);
            double sum_err =
                (double)(g->k + 4) * U_F32 *
                (fabs(g->alpha) * o->mag[ix] * (1 + U_BF16) * (1 + U_BF16) + beta_term);
            double err, tol;
            if (other) {
                err = fabs((double)c[ix] - (double)other[ix]);
                tol = 2 * sum_err;
            } else {
                err = fabs((double)c[ix] - o->ref[ix]);
                tol = g->ints
                          ? 0
                          : (2 * U_BF16 + U_BF16 * U_BF16) * fabs(g->alpha) * o->mag[ix] + sum_err;
            }
            if (!(err <= tol)) return INFINITY;
            if (tol > 0 && err / tol > worst) worst = err / tol;
            if (worst_abs && err > *worst_abs) *worst_abs = err;
        }
        for (int64_t j = g->n; j < o->ldc; j++)
            if (bits(c[i * o->ldc + j]) != bits(o->c0[i * o->ldc + j])) return -1;
    }
    return worst;
}

static int failures_shown;

static void check_case(const gcase *g, rl_bf16_level best) {
    operands o;
    make(g, &o);
    size_t nc = (size_t)(g->m * o.ldc);
    float *gen = malloc(sizeof(float) * nc);
    CHECK_OK(rl_bf16_level_set(RL_BF16_GENERIC));
    CHECK_OK(run(g, &o, false, gen));
    for (int lv = RL_BF16_GENERIC; lv <= (int)best; lv++) {
        CHECK_OK(rl_bf16_level_set((rl_bf16_level)lv));
        CHECK_OK(run(g, &o, (g->m + g->n + lv) % 2 == 0, o.c));
        double r_ref = judge(g, &o, o.c, NULL, NULL), r_gen = judge(g, &o, o.c, gen, NULL);
        bool ok = r_ref >= 0 && r_ref <= 1 && r_gen >= 0 && r_gen <= 1;
        CHECK(ok);
        if (!ok && failures_shown++ < 10)
            fprintf(stderr,
                    "  level %s m %lld n %lld k %lld ta %d tb %d ints %d alpha %g beta %g: "
                    "error/tolerance vs float64 %g, vs generic %g (-1: padding written)\n",
                    rl_bf16_level_name((rl_bf16_level)lv), (long long)g->m, (long long)g->n,
                    (long long)g->k, g->ta, g->tb, g->ints, g->alpha, g->beta, r_ref, r_gen);
    }
    free(gen);
    release(&o);
}

/* each row alone, and each pair of rows, gives the bits it gives among the others, on 1 and 2
 * threads (n = 300: one- and two-row products take their wide tiles, then the narrow ones, and
 * end in a part of a panel) */
static void check_rows_alone(rl_bf16_level lv) {
    gcase g = {37, 300, 300, false, true, false, 1.0f, 1.0f};
    operands o;
    make(&g, &o);
    CHECK_OK(rl_bf16_level_set(lv));
    int threads = rl_blas_get_threads();
    rl_blas_set_threads(2);
    CHECK_OK(run(&g, &o, true, o.c));
    rl_blas_set_threads(1);
    int bad = 0;
    float *row = malloc(sizeof(float) * (size_t)(2 * o.ldc));
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)rl_bf16_packed_size(g.k, g.n));
    rl_bf16_pack(p, o.b, o.ldb, g.tb, g.k, g.n);
    for (int rows = 1; rows <= 2; rows++)
        for (int64_t i = 0; i + rows <= g.m; i += rows) {
            memcpy(row, o.c0 + i * o.ldc, sizeof(float) * (size_t)(rows * o.ldc));
            CHECK_OK(rl_gemm_bf16_packed(false, rows, g.n, g.k, 1.0f, o.a + i * o.lda, o.lda, p,
                                         1.0f, row, o.ldc));
            for (int r = 0; r < rows; r++)
                if (memcmp(row + r * o.ldc, o.c + (i + r) * o.ldc, sizeof(float) * (size_t)g.n))
                    bad++;
        }
    rl_blas_set_threads(threads);
    CHECK(bad == 0);
    if (bad)
        fprintf(stderr, "  level %s: %d rows differ alone or in pairs (of %lld)\n",
                rl_bf16_level_name(lv), bad, (long long)g.m);
    free(row);
    free(p);
    release(&o);
}

static void test_levels(rl_bf16_level best) {
    rl_bf16_level lv;
    CHECK(rl_bf16_level_from_name("avx512bf16", &lv) == RL_OK && lv == RL_BF16_AVX512BF16);
    CHECK(rl_bf16_level_from_name("amx", &lv) == RL_OK && lv == RL_BF16_AMX);
    CHECK(rl_bf16_level_from_name("avx512", &lv) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "avx512bf16") != NULL);
    if (best < RL_BF16_AMX) CHECK(rl_bf16_level_set(RL_BF16_AMX) == RL_EARG);
    CHECK(rl_bf16_level_set((rl_bf16_level)7) == RL_EARG);
    /* a kernel level below avx512 runs the generic bf16 kernel */
    rl_cpu_level cpu = rl_cpu_level_get();
    CHECK_OK(rl_bf16_level_set(best));
    if (rl_cpu_level_supported() >= RL_CPU_AVX2) {
        CHECK_OK(rl_cpu_level_set(RL_CPU_AVX2));
        CHECK(rl_bf16_level_get() == RL_BF16_GENERIC);
        CHECK_OK(rl_cpu_level_set(cpu));
    }
    CHECK(rl_bf16_level_get() == (cpu >= RL_CPU_AVX512 ? best : RL_BF16_GENERIC));
}

/* An operand past the 2 MB per-call scratch (rounded op(A) rows, packed op(B) columns, at
 * k = 8200 blocks of at most 96) is multiplied in blocks: the result must have the bits of
 * products small enough to run whole (blocks of 40 rows, every column). With m = 90 op(A) fits
 * one block, is rounded once, and each part packs op(B)'s pairs of panels as it multiplies them;
 * with m = 160 it is rounded in two blocks of rows (96 + 64) for each block of columns (n = 150:
 * one block). With n = 250 op(B) packed whole would pass 4 MB: k is split in two (4128 + 4072),
 * so that it fits in one block of columns, whatever m. The split depends on k and n: columns of
 * C share their bits with a narrower product's only where the split is the same. */
static void check_blocks(bool ta, bool tb, int64_t m, int64_t n) {
    const int64_t k = 8200, T = 40;
    float *a = malloc(sizeof(float) * (size_t)(m * k)),
          *b = malloc(sizeof(float) * (size_t)(k * n));
    float *c = malloc(sizeof(float) * (size_t)(m * n)),
          *t = malloc(sizeof(float) * (size_t)(T * n));
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)next_value();
    for (int64_t i = 0; i < k * n; i++)
        b[i] = (float)next_value();
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    CHECK_OK(rl_gemm_bf16(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n));
    int bad = 0;
    for (int64_t i0 = 0; i0 < m; i0 += T) {
        int64_t mi = m - i0 < T ? m - i0 : T;
        CHECK_OK(rl_gemm_bf16(ta, tb, mi, n, k, 1.0f, ta ? a + i0 : a + i0 * lda, lda, b, ldb, 0.0f,
                              t, n));
        for (int64_t i = 0; i < mi; i++)
            if (memcmp(t + i * n, c + (i0 + i) * n, sizeof(float) * (size_t)n) != 0) bad++;
    }
    if (bad) fprintf(stderr, "  blocks (ta %d, tb %d): %d rows differ\n", ta, tb, bad);
    CHECK(bad == 0);
    free(a), free(b), free(c), free(t);
}

/* rl_gemm_bf16_lhs and _rhs with operands rounded once give rl_gemm_bf16's bits: as the left
 * operand (dX = dY W^T), op(B) both ways, and as the right one (dW = X^T dY) from the same
 * rows; as does rl_gemm_bf16_packed; odd k, k split (k = 8200, n = 250; for dW, 2100 rows
 * against 1100 columns), m past a block of rows (160), 1 and 2 threads. */
static void check_rounded_once(bool tb, int64_t m, int64_t n, int64_t k, int threads) {
    float *y = malloc(sizeof(float) * (size_t)(m * k)),
          *w = malloc(sizeof(float) * (size_t)(k * n)),
          *x = malloc(sizeof(float) * (size_t)(m * n));
    float *c1 = malloc(sizeof(float) * (size_t)(m * n)),
          *c2 = malloc(sizeof(float) * (size_t)(m * n));
    float *g1 = malloc(sizeof(float) * (size_t)(n * k)),
          *g2 = malloc(sizeof(float) * (size_t)(n * k));
    uint16_t *y16 = malloc(sizeof(uint16_t) * (size_t)rl_bf16_lhs_size(m, k));
    for (int64_t i = 0; i < m * k; i++)
        y[i] = (float)next_value();
    for (int64_t i = 0; i < k * n; i++)
        w[i] = (float)next_value();
    for (int64_t i = 0; i < m * n; i++)
        x[i] = (float)next_value();
    int saved = rl_blas_get_threads();
    rl_blas_set_threads(threads);
    memset(y16, 0xff, sizeof(uint16_t) * (size_t)rl_bf16_lhs_size(m, k));
    rl_bf16_round_lhs(y16, false, m, k, y, k);
    int64_t ld16 = rl_bf16_lhs_stride(k), ldw = tb ? k : n;
    /* the layout: k padded to 32 and m to 16, zeros there */
    bool layout = ld16 % 32 == 0 && ld16 >= k && rl_bf16_lhs_size(m, k) % (16 * ld16) == 0;
    for (int64_t i = 0; i < rl_bf16_lhs_size(m, k) / ld16; i++)
        for (int64_t l = 0; l < ld16; l++) {
            uint16_t want = i < m && l < k ? rl_f32_to_bf16(y[i * k + l]) : 0;
            if (y16[i * ld16 + l] != want) layout = false;
        }
    CHECK(layout);
    /* dX = dY op(W): the float32 product, with beta 0.5 over a C of ones */
    for (int64_t i = 0; i < m * n; i++)
        c1[i] = c2[i] = 1.0f;
    CHECK_OK(rl_gemm_bf16(false, tb, m, n, k, 1.0f, y, k, w, ldw, 0.5f, c1, n));
    CHECK_OK(rl_gemm_bf16_lhs(m, n, k, 1.0f, y16, tb, w, ldw, 0.5f, c2, n));
    bool same_lhs = memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
    /* a weight's kept pack (rl_gemm_bf16_packed) gives them too: the same blocks of k */
    uint16_t *pw = malloc(sizeof(uint16_t) * (size_t)rl_bf16_packed_size(k, n));
    rl_bf16_pack(pw, w, ldw, tb, k, n);
    for (int64_t i = 0; i < m * n; i++)
        c2[i] = 1.0f;
    CHECK_OK(rl_gemm_bf16_packed(false, m, n, k, 1.0f, y, k, pw, 0.5f, c2, n));
    same_lhs = same_lhs && memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
    free(pw);
    /* dW (n x k) = X^T dY, alpha -1, beta 0 over NaN */
    for (int64_t i = 0; i < n * k; i++)
        g1[i] = g2[i] = NAN;
    CHECK_OK(rl_gemm_bf16(true, false, n, k, m, -1.0f, x, n, y, k, 0.0f, g1, k));
    CHECK_OK(rl_gemm_bf16_rhs(true, n, k, m, -1.0f, x, n, y16, ld16, 0.0f, g2, k));
    bool same_rhs = memcmp(g1, g2, sizeof(float) * (size_t)(n * k)) == 0;
    rl_blas_set_threads(saved);
    CHECK(same_lhs);
    CHECK(same_rhs);
    if (!same_lhs || !same_rhs)
        fprintf(stderr, "  rounded once: tb %d m %lld n %lld k %lld, %d threads: lhs %d rhs %d\n",
                tb, (long long)m, (long long)n, (long long)k, threads, same_lhs, same_rhs);
    free(y), free(w), free(x), free(c1), free(c2), free(g1), free(g2), free(y16);
}

/* ---- a network's bf16 context: active on its thread only ---- */

#define CM 37
#define CN 150
#define CK 130
/* the weights (right operand) and the left operand of the context tests */
static float ctx_w[CK * CN], ctx_x[CM * CK];

static void ctx_product(float *c) {
    rl_mat a = {ctx_x, CK}, b = {ctx_w, CN}, cm = {c, CN};
    CHECK_OK(rl_mat_gemm(RL_DEVICE_CPU, NULL, RL_FLOAT32, false, false, CM, CN, CK, a, b, 0.0, cm));
}

typedef struct {
    rl_bf16_ctx *ctx; /* active in the thread, or NULL */
    const float *want;
    int bad;
} ctx_thread;

static void *ctx_thread_main(void *arg) {
    ctx_thread *t = arg;
    rl_bf16_activate(t->ctx);
    static _Thread_local float c[CM * CN];
    for (int round = 0; round < 300; round++) {
        ctx_product(c);
        if (memcmp(c, t->want, sizeof c) != 0) t->bad++;
    }
    rl_bf16_activate(NULL);
    return NULL;
}

static void record_active(void *ctx, int part, int parts) {
    ((rl_bf16_ctx **)ctx)[part] = rl_bf16_active();
}

static void test_ctx(void) {
    for (int i = 0; i < CK * CN; i++)
        ctx_w[i] = (float)next_value();
    for (int i = 0; i < CM * CK; i++)
        ctx_x[i] = (float)next_value();
    static float r32[CM * CN], rb[CM * CN];
    rl_bf16_ctx *ctx = rl_bf16_ctx_new();
    CHECK(ctx != NULL);
    rl_bf16_ctx_begin(ctx, ctx_w, sizeof ctx_w, 1);
    CHECK(rl_bf16_active() == NULL);
    ctx_product(r32);
    static float rb2[CM * CN];
    rl_bf16_activate(ctx);
    ctx_product(rb);
    CHECK(rl_bf16_ctx_bytes(ctx) == 0); /* a weight used once is packed per call */
    CHECK(rl_bf16_ctx_packs(ctx) == 1);
    ctx_product(rb2);
    /* the second use keeps its pack, and gives the same bits */
    CHECK(rl_bf16_ctx_bytes(ctx) >= sizeof(uint16_t) * CK * CN);
    CHECK(rl_bf16_ctx_packs(ctx) == 2);
    CHECK(memcmp(rb, rb2, sizeof rb) == 0);
    /* a begin with the same weights and version keeps it: no pack in the next passes */
    for (int pass = 0; pass < 3; pass++) {
        rl_bf16_ctx_begin(ctx, ctx_w, sizeof ctx_w, 1);
        ctx_product(rb2);
        CHECK(memcmp(rb, rb2, sizeof rb) == 0);
    }
    CHECK(rl_bf16_ctx_packs(ctx) == 2);
    /* another version (the weights were written): packed again, from the new values, and kept
     * at its first use, since it was used twice under the first ones */
    float w0 = ctx_w[0];
    ctx_w[0] += 1.0f;
    rl_bf16_ctx_begin(ctx, ctx_w, sizeof ctx_w, 2);
    ctx_product(rb2);
    CHECK(rl_bf16_ctx_packs(ctx) == 3);
    CHECK(memcmp(rb, rb2, sizeof rb) != 0);
    ctx_product(rb2);
    CHECK(rl_bf16_ctx_packs(ctx) == 3);
    rl_bf16_activate(NULL);
    {
        /* what a fresh context gives for the new weights: the kept pack is not stale */
        static float fresh[CM * CN];
        rl_bf16_ctx *c2 = rl_bf16_ctx_new();
        CHECK(c2 != NULL);
        rl_bf16_ctx_begin(c2, ctx_w, sizeof ctx_w, 7);
        rl_bf16_activate(c2);
        ctx_product(fresh);
        rl_bf16_activate(NULL);
        rl_bf16_ctx_free(c2);
        CHECK(memcmp(fresh, rb2, sizeof rb2) == 0);
    }
    ctx_w[0] = w0;
    rl_bf16_ctx_begin(ctx, ctx_w, sizeof ctx_w, 3);
    CHECK(memcmp(r32, rb, sizeof r32) != 0); /* bf16 ran under the context */
    {
        /* another weights range forgets the keys: a weight is packed per call at first use */
        static float other_w[CK * CN];
        rl_bf16_ctx_begin(ctx, other_w, sizeof other_w, 3);
        rl_bf16_activate(ctx);
        ctx_product(rb2);
        rl_bf16_activate(NULL);
        CHECK(rl_bf16_ctx_packs(ctx) == 3);
        rl_bf16_ctx_begin(ctx, ctx_w, sizeof ctx_w, 3);
        rl_bf16_activate(ctx);
        ctx_product(rb2);
        rl_bf16_activate(NULL);
        CHECK(rl_bf16_ctx_packs(ctx) == 4);
        CHECK(memcmp(rb, rb2, sizeof rb) == 0);
    }

    /* the parts of rl_cpu_parallel run with the caller's context, and the helpers drop it after */
    rl_bf16_ctx *seen[4] = {NULL, NULL, NULL, NULL};
    rl_bf16_activate(ctx);
    rl_cpu_parallel(4, record_active, seen);
    rl_bf16_activate(NULL);
    for (int p = 0; p < 4; p++)
        CHECK(seen[p] == ctx);
    rl_cpu_parallel(4, record_active, seen);
    for (int p = 0; p < 4; p++)
        CHECK(seen[p] == NULL);

    /* two bf16 threads of one context (a concurrent pair: they look up and keep the packs at
     * once, without a lock) and a float32 thread: each gets what it gets alone */
    ctx_thread tb = {ctx, rb, 0}, tb2 = {ctx, rb, 0}, tf = {NULL, r32, 0};
    pthread_t thb, thb2, thf;
    CHECK(pthread_create(&thb, NULL, ctx_thread_main, &tb) == 0);
    CHECK(pthread_create(&thb2, NULL, ctx_thread_main, &tb2) == 0);
    CHECK(pthread_create(&thf, NULL, ctx_thread_main, &tf) == 0);
    pthread_join(thb, NULL);
    pthread_join(thb2, NULL);
    pthread_join(thf, NULL);
    if (tb.bad || tb2.bad || tf.bad)
        fprintf(stderr, "  three threads: %d, %d bf16 and %d float32 products of 300 differ\n",
                tb.bad, tb2.bad, tf.bad);
    CHECK(tb.bad == 0 && tb2.bad == 0 && tf.bad == 0);
    /* the weight was kept, not packed per product (600 products; a thread finding the other
     * packing it packs its own product's copy meanwhile) */
    CHECK(rl_bf16_ctx_packs(ctx) < 3 + 300);
    rl_bf16_ctx_free(ctx);

    /* frozen (a C API model's, shared by its sessions' threads): a weight is kept from its first
     * use, the same bits; a later begin (another range) keeps the packs; held by two owners */
    rl_bf16_ctx *fz = rl_bf16_ctx_new();
    CHECK(fz != NULL);
    rl_bf16_ctx_freeze(fz);
    rl_bf16_ctx_begin(fz, ctx_w, sizeof ctx_w, 1);
    rl_bf16_activate(fz);
    ctx_product(rb2);
    CHECK(rl_bf16_ctx_bytes(fz) >= sizeof(uint16_t) * CK * CN);
    CHECK(memcmp(rb, rb2, sizeof rb) == 0);
    size_t kept = rl_bf16_ctx_bytes(fz);
    rl_bf16_ctx_begin(fz, ctx_x, sizeof ctx_x, 2);
    rl_bf16_ctx_hold(fz);
    rl_bf16_ctx_free(fz); /* the other owner's reference is left */
    memset(rb2, 0, sizeof rb2);
    ctx_product(rb2);
    CHECK(rl_bf16_ctx_bytes(fz) == kept && memcmp(rb, rb2, sizeof rb) == 0);
    tb = (ctx_thread){fz, rb, 0};
    tb2 = (ctx_thread){fz, rb, 0};
    CHECK(pthread_create(&thb, NULL, ctx_thread_main, &tb) == 0);
    CHECK(pthread_create(&thf, NULL, ctx_thread_main, &tb2) == 0);
    pthread_join(thb, NULL);
    pthread_join(thf, NULL);
    CHECK(tb.bad == 0 && tb2.bad == 0);
    rl_bf16_activate(NULL);
    rl_bf16_ctx_free(fz);
}

/* The packing and rounding passes take vector code at the avx512bf16 and amx levels (16 x 16
 * blocks for the transposed operands) and element loops at the generic one: the packs must be the
 * same bits, and a product of a^T the same bits as the product of an explicit transposed copy (one
 * kernel, one rounded operand). Values include NaN, infinities, subnormals and rounding ties;
 * sizes leave tails of rows and columns outside the blocks. */
static void test_vector_passes(rl_bf16_level best) {
    static const int64_t ks[] = {1, 31, 32, 33, 64, 100, 130}, ns[] = {1, 15, 16, 17, 48, 70};
    static const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xff800000u, 0x7f800000u,
                                       0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                                       0x7f7fffffu, 0xffffffffu};
    int bad_pack = 0, bad_round = 0;
    for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++)
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
            int64_t k = ks[ik], n = ns[in];
            for (int trans = 0; trans < 2; trans++) {
                int64_t ldb = trans ? k + 3 : n + 3, rows = trans ? n : k;
                float *b = malloc(sizeof(float) * (size_t)(rows * ldb));
                for (int64_t i = 0; i < rows * ldb; i++)
                    b[i] = i % 7 == 3 ? from_bits(special[(i / 7) % 10]) : (float)next_value();
                size_t bytes = sizeof(uint16_t) * (size_t)rl_bf16_packed_size(k, n);
                uint16_t *ref = malloc(bytes), *got = malloc(bytes);
                CHECK_OK(rl_bf16_level_set(RL_BF16_GENERIC));
                rl_bf16_pack(ref, b, ldb, trans, k, n);
                for (int lv = RL_BF16_GENERIC + 1; lv <= (int)best; lv++) {
                    CHECK_OK(rl_bf16_level_set((rl_bf16_level)lv));
                    memset(got, 0xa5, bytes);
                    rl_bf16_pack(got, b, ldb, trans, k, n);
                    if (memcmp(ref, got, bytes) != 0) bad_pack++;
                }
                free(b), free(ref), free(got);
            }
            /* a^T (n x k, a stored k x lda) times a packed b (k x 5), against the transposed copy
             */
            int64_t m = n, lda = n + 2, cols = 5;
            float *a = malloc(sizeof(float) * (size_t)(k * lda)),
                  *at = malloc(sizeof(float) * (size_t)(m * k));
            float *w = malloc(sizeof(float) * (size_t)(k * cols));
            for (int64_t i = 0; i < k * lda; i++)
                a[i] = i % 11 == 5 ? from_bits(special[(i / 11) % 10]) : (float)next_value();
            for (int64_t i = 0; i < m; i++)
                for (int64_t l = 0; l < k; l++)
                    at[i * k + l] = a[l * lda + i];
            for (int64_t i = 0; i < k * cols; i++)
                w[i] = (float)next_value();
            uint16_t *pw = malloc(sizeof(uint16_t) * (size_t)rl_bf16_packed_size(k, cols));
            rl_bf16_pack(pw, w, cols, false, k, cols);
            float *c1 = malloc(sizeof(float) * (size_t)(m * cols)),
                  *c2 = malloc(sizeof(float) * (size_t)(m * cols));
            for (int lv = RL_BF16_GENERIC; lv <= (int)best; lv++) {
                CHECK_OK(rl_bf16_level_set((rl_bf16_level)lv));
                CHECK_OK(rl_gemm_bf16_packed(true, m, cols, k, 1.0f, a, lda, pw, 0.0f, c1, cols));
                CHECK_OK(rl_gemm_bf16_packed(false, m, cols, k, 1.0f, at, k, pw, 0.0f, c2, cols));
                if (memcmp(c1, c2, sizeof(float) * (size_t)(m * cols)) != 0) bad_round++;
            }
            free(a), free(at), free(w), free(pw), free(c1), free(c2);
        }
    CHECK(bad_pack == 0);
    CHECK(bad_round == 0);
    CHECK_OK(rl_bf16_level_set(best));
}

int main(void) {
    test_conversions();
    rl_bf16_level best = rl_bf16_level_supported();
    /* the cpu level may be lowered by RL_CPU_LEVEL: then only the generic kernel runs */
    if (rl_cpu_level_get() < RL_CPU_AVX512) best = RL_BF16_GENERIC;
    printf("bf16 levels tested: generic .. %s (CPU and OS support %s)\n", rl_bf16_level_name(best),
           rl_bf16_level_name(rl_bf16_level_supported()));
    test_levels(rl_bf16_level_supported());
    test_vector_passes(best);
    static const int64_t ms[] = {1, 2, 5, 16, 37, 70}, ns[] = {1, 16, 33, 100, 200},
                         ks[] = {0, 1, 31, 64, 130};
    for (int t = 0; t < 4; t++)
        for (size_t im = 0; im < sizeof ms / sizeof *ms; im++)
            for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
                for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++) {
                    gcase g = {ms[im],
                               ns[in],
                               ks[ik],
                               t & 1,
                               t >> 1,
                               (im + ik) % 3 == 0,
                               ik % 2 ? 1.0f : -0.5f,
                               (float)((im + in) % 3) * 0.5f};
                    check_case(&g, best);
                }
    /* big enough to be split between threads, by columns and by rows */
    gcase big_cols = {50, 700, 520, false, false, false, 1.0f, 0.0f};
    gcase big_rows = {300, 40, 700, true, true, false, 0.75f, 1.0f};
    gcase big_ints = {90, 260, 1000, false, true, true, 1.0f, 1.0f};
    int threads = rl_blas_get_threads();
    rl_blas_set_threads(2);
    check_case(&big_cols, best);
    check_case(&big_rows, best);
    check_case(&big_ints, best);
    rl_blas_set_threads(threads);
    for (int lv = RL_BF16_GENERIC; lv <= (int)best; lv++)
        check_rows_alone((rl_bf16_level)lv);
    for (int lv = RL_BF16_GENERIC; lv <= (int)best; lv++) {
        CHECK_OK(rl_bf16_level_set((rl_bf16_level)lv));
        check_blocks(false, false, 160, 150);
        check_blocks(true, true, 160, 150);
        check_blocks(false, true, 90, 150);
        check_blocks(true, false, 90, 150);
        check_blocks(false, false, 160, 250);
        check_blocks(true, false, 160, 250);
        check_blocks(false, true, 90, 250);
        static const int64_t rm[] = {1, 37, 160}, rn[] = {16, 45, 250}, rk[] = {1, 63, 8200};
        for (size_t i = 0; i < 3; i++)
            for (size_t q = 0; q < 3; q++)
                for (size_t l = 0; l < 3; l++)
                    check_rounded_once((i + q + l) % 2, rm[i], rn[q], rk[l], 1 + (int)(l % 2));
        /* the right operand's sums split: dW over 2100 rows against 1100 columns */
        check_rounded_once(false, 2100, 16, 1100, 2);
    }
    CHECK_OK(rl_bf16_level_set(best));
    test_ctx();
    TEST_MAIN_END();
}
