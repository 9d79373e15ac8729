/* The int8 products (kernels/cpu/gemm_int8.h) at every kernel level and int8 level this machine
 * has.
 *
 * Two references per element of C:
 *  - the quantization done again here (the same float32 steps: amax, 127 / amax, rintf) with the
 *    integer sum in int64: the kernel's int32 sum must be that exact integer D, so its result
 *    may differ from alpha * (float)D * (s_i s_j) + beta * c0 only by the float32 rounding of the
 *    scaling: at most 4 * 2^-24 (|alpha v| + |beta c0|) (pins packing, offsets, indexing);
 *  - a float64 product of the float32 operands: each quantized activation is off by at most
 *    s_i / 2, each weight by s_j / 2 (half a step), so
 *        |c - ref| <= |alpha| (s_i/2 sum_l |b_lj| + s_j/2 sum_l |a_il| + k s_i s_j / 4)
 *                     + 1e-6 (|alpha| (S + that) + |beta c0|),  S = sum_l |a_il b_lj|,
 *    the last term the float32 rounding of the scaling (a few units of 2^-24).
 * Shapes: m 1..5 (the kernel's tiles of 4 rows and the one-row path), odd n around the 16-column
 * panels and 64-column tiles, k around multiples of 4 (a quad), 16 and 64, and 0.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/blas.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/cpu/gemm_int8.h"
#include "check.h"

static uint64_t state = 0x9e3779b97f4a7c15ull;
static double next_value(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* the quantization of gemm_int8.h: q (k values, step apart) and its scale */
static float quantize(const float *x, int64_t step, int64_t k, int32_t *q) {
    float amax = 0.0f;
    for (int64_t l = 0; l < k; l++)
        amax = fmaxf(amax, fabsf(x[l * step]));
    if (amax == 0.0f) {
        for (int64_t l = 0; l < k; l++)
            q[l] = 0;
        return 0.0f;
    }
    float inv = 127.0f / amax;
    for (int64_t l = 0; l < k; l++)
        q[l] = (int32_t)rintf(x[l * step] * inv);
    return amax / 127.0f;
}

typedef struct {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
} gcase;

static double worst_ratio; /* largest |c - ref64| / bound seen (printed) */

static void run_case(gcase g, bool packed) {
    int64_t m = g.m, n = g.n, k = g.k;
    int64_t lda = (g.ta ? m : k) + 3, ldb = (g.tb ? k : n) + 1, ldc = n + 2;
    int64_t arows = g.ta ? k : m, brows = g.tb ? n : k;
    float *a = malloc(sizeof(float) * (size_t)(arows * lda + 1)),
          *b = malloc(sizeof(float) * (size_t)(brows * ldb + 1)),
          *c = malloc(sizeof(float) * (size_t)(m * ldc + 1)),
          *c0 = malloc(sizeof(float) * (size_t)(m * ldc + 1));
    for (int64_t i = 0; i < arows * lda; i++)
        a[i] = (float)next_value();
    /* weights of different sizes per output unit (the per-column scales matter) */
    for (int64_t i = 0; i < brows * ldb; i++)
        b[i] = (float)(next_value() * (1 + i % 7));
    for (int64_t i = 0; i < m * ldc; i++)
        c[i] = c0[i] = (float)next_value();
    if (packed) {
        void *p = aligned_alloc(64, rl_int8_packed_bytes(k, n));
        rl_int8_pack(p, b, ldb, g.tb, k, n);
        CHECK_OK(rl_gemm_int8_packed(g.ta, m, n, k, g.alpha, a, lda, p, g.beta, c, ldc));
        free(p);
    } else {
        CHECK_OK(rl_gemm_int8(g.ta, g.tb, m, n, k, g.alpha, a, lda, b, ldb, g.beta, c, ldc));
    }
    int32_t *qa = malloc(sizeof(int32_t) * (size_t)(m * k + 1)),
            *qb = malloc(sizeof(int32_t) * (size_t)(n * k + 1));
    float *sa = malloc(sizeof(float) * (size_t)m), *sb = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < m; i++)
        sa[i] = quantize(g.ta ? a + i : a + i * lda, g.ta ? lda : 1, k, qa + i * k);
    for (int64_t j = 0; j < n; j++)
        sb[j] = quantize(g.tb ? b + j * ldb : b + j, g.tb ? 1 : ldb, k, qb + j * k);
    int bad_exact = 0, bad_bound = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t d = 0;
            double ref = 0, s = 0, suma = 0, sumb = 0;
            for (int64_t l = 0; l < k; l++) {
                d += (int64_t)qa[i * k + l] * qb[j * k + l];
                double av = g.ta ? a[l * lda + i] : a[i * lda + l];
                double bv = g.tb ? b[j * ldb + l] : b[l * ldb + j];
                ref += av * bv;
                s += fabs(av * bv);
                suma += fabs(av);
                sumb += fabs(bv);
            }
            double cin = c0[i * ldc + j], got = c[i * ldc + j];
            float v = (float)d * (sa[i] * sb[j]);
            double want = (double)g.alpha * v + (double)g.beta * cin;
            double tol =
                4.0 / 16777216.0 * (fabs((double)g.alpha * v) + fabs(g.beta * cin)) + 1e-30;
            if (!(fabs(got - want) <= tol)) bad_exact++;
            double q =
                (double)sa[i] / 2 * sumb + (double)sb[j] / 2 * suma + (double)k * sa[i] * sb[j] / 4;
            double bound =
                fabs(g.alpha) * q + 1e-6 * (fabs(g.alpha) * (s + q) + fabs(g.beta * cin)) + 1e-30;
            double err = fabs(got - ((double)g.alpha * ref + (double)g.beta * cin));
            if (!(err <= bound)) bad_bound++;
            if (err / bound > worst_ratio) worst_ratio = err / bound;
        }
    if (bad_exact || bad_bound)
        fprintf(stderr,
                "case m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g packed=%d: %d off the "
                "integer reference, %d past the bound\n",
                (long long)m, (long long)n, (long long)k, g.ta, g.tb, g.alpha, g.beta, packed,
                bad_exact, bad_bound);
    CHECK(bad_exact == 0);
    CHECK(bad_bound == 0);
    /* the padding between rows of c is untouched */
    bool pad_ok = true;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = n; j < ldc; j++)
            if (i * ldc + j < m * ldc && c[i * ldc + j] != c0[i * ldc + j]) pad_ok = false;
    CHECK(pad_ok);
    free(a), free(b), free(c), free(c0), free(qa), free(qb), free(sa), free(sb);
}

static void run_shapes(void) {
    static const int64_t ms[] = {1, 2, 3, 4, 5, 9}, ns[] = {1, 15, 17, 63, 65, 129},
                         ks[] = {0, 1, 3, 5, 15, 17, 63, 65, 130};
    int t = 0;
    for (size_t im = 0; im < sizeof ms / sizeof *ms; im++)
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
            for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++, t++) {
                gcase g = {ms[im], ns[in], ks[ik], t & 1, (t >> 1) & 1, 1.0f, 0.0f};
                if (t % 3 == 1) g.alpha = -0.5f, g.beta = 1.0f;
                if (t % 3 == 2) g.beta = 0.25f;
                run_case(g, t % 5 == 0);
            }
}

/* c = one product of a fixed set of operands at the int8 level in use */
static void product(int64_t m, int64_t n, int64_t k, bool ta, bool tb, float beta, const float *a,
                    const float *b, float *c) {
    for (int64_t i = 0; i < m * n; i++)
        c[i] = (float)(i % 13) * 0.25f - 1.5f;
    CHECK_OK(rl_gemm_int8(ta, tb, m, n, k, 0.75f, a, ta ? m : k, b, tb ? k : n, beta, c, n));
}

/* Every level computes the same integer sums and scales them in the same float32 steps: the
 * same bits as the generic level, on random operands (shapes around the 2-row and 4-row tiles
 * and the 32- and 64-column tiles, beta 0 and not) and on the largest sums there are: every
 * activation and weight at +-127 with matching signs, where each pair of products in AVX2's
 * vpmaddubsw reaches 2 * 127 * 127 = 32258, just under its int16 saturation at 32767. */
static void check_levels_agree(void) {
    static const int64_t ms[] = {1, 2, 3, 5, 37}, ns[] = {7, 33, 200}, ks[] = {1, 61, 301};
    const int64_t mmax = 37, nmax = 200, kmax = 301;
    float *a = malloc(sizeof(float) * mmax * kmax), *b = malloc(sizeof(float) * nmax * kmax),
          *c1 = malloc(sizeof(float) * mmax * nmax), *c2 = malloc(sizeof(float) * mmax * nmax);
    int t = 0;
    for (int extreme = 0; extreme < 2; extreme++)
        for (size_t im = 0; im < sizeof ms / sizeof *ms; im++)
            for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
                for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++, t++) {
                    int64_t m = ms[im], n = ns[in], k = ks[ik];
                    bool ta = t & 1, tb = (t >> 1) & 1;
                    float beta = t % 3 ? 0.0f : -0.5f;
                    /* op(a)[i][l] and op(b)[l][j] from index pairs; extreme: signs of l % 3 */
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t l = 0; l < k; l++) {
                            float v = extreme ? (l % 3 ? 2.0f : -2.0f) : (float)next_value();
                            a[ta ? l * m + i : i * k + l] = v;
                        }
                    for (int64_t l = 0; l < k; l++)
                        for (int64_t j = 0; j < n; j++) {
                            float v = extreme ? (l % 3 ? 0.5f : -0.5f) * (float)(1 + j % 4)
                                              : (float)next_value();
                            b[tb ? j * k + l : l * n + j] = v;
                        }
                    CHECK_OK(rl_int8_level_set(RL_INT8_GENERIC));
                    product(m, n, k, ta, tb, beta, a, b, c1);
                    for (int il = 1; il <= (int)rl_int8_level_supported(); il++) {
                        if (!rl_int8_level_available((rl_int8_level)il)) continue;
                        CHECK_OK(rl_int8_level_set((rl_int8_level)il));
                        if ((int)rl_int8_level_get() != il) continue; /* capped: ran already */
                        product(m, n, k, ta, tb, beta, a, b, c2);
                        bool same = memcmp(c1, c2, sizeof(float) * (size_t)(m * n)) == 0;
                        if (!same)
                            fprintf(stderr,
                                    "int8 level %s differs from generic: m=%lld n=%lld k=%lld "
                                    "ta=%d tb=%d beta=%g extreme=%d\n",
                                    rl_int8_level_name((rl_int8_level)il), (long long)m,
                                    (long long)n, (long long)k, ta, tb, beta, extreme);
                        CHECK(same);
                    }
                    if (extreme && !ta && !tb && beta == 0.0f) {
                        /* column 0: k products of 2 * 0.5, each quantized to 127 * 127 */
                        double want = 0.75 * (double)k;
                        CHECK(fabs(c1[0] - want) <= 1e-6 * want);
                    }
                }
    free(a), free(b), free(c1), free(c2);
}

/* NaN or infinity in a row of op(A) (a column of op(B)) gives NaN in that row (column) only */
static void check_non_finite(void) {
    enum { M = 3, N = 20, K = 9 };
    float a[M * K], b[N * K], c[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)next_value();
    for (int i = 0; i < N * K; i++)
        b[i] = (float)next_value();
    a[1 * K + 4] = NAN;
    b[7 * K + 2] = INFINITY;
    CHECK_OK(rl_gemm_int8(false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            if ((i == 1 || j == 7) != (bool)isnan(c[i * N + j])) bad++;
    CHECK(bad == 0);
}

/* operands past the 2 MB per-call scratch run in blocks of rows and columns; with 2 threads the
 * parts split the columns or the rows: the bits of one whole product on 1 thread */
static void check_blocks_threads(void) {
    const int64_t m = 300, n = 300, k = 8200;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * n * k),
          *c1 = malloc(sizeof(float) * m * n), *c2 = malloc(sizeof(float) * m * n);
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)next_value();
    for (int64_t i = 0; i < n * k; i++)
        b[i] = (float)next_value();
    int threads = rl_blas_get_threads();
    rl_blas_set_threads(1);
    CHECK_OK(rl_gemm_int8(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c1, n));
    rl_blas_set_threads(2);
    CHECK_OK(rl_gemm_int8(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c2, n));
    CHECK(memcmp(c1, c2, sizeof(float) * m * n) == 0);
    rl_blas_set_threads(threads);
    /* one row and column of the blocked product against the unblocked kernel */
    float c3[300];
    CHECK_OK(rl_gemm_int8(false, true, 1, n, k, 1.0f, a + 299 * k, k, b, k, 0.0f, c3, n));
    CHECK(memcmp(c3, c1 + 299 * n, sizeof c3) == 0);
    free(a), free(b), free(c1), free(c2);
}

int main(void) {
    rl_cpu_level cpu = rl_cpu_level_get();
    CHECK(rl_int8_level_set((rl_int8_level)5) == RL_EARG);
    CHECK(rl_int8_level_set((rl_int8_level)-1) == RL_EARG);
    printf("cpu level %s, int8 levels supported: generic .. %s\n", rl_cpu_level_name(cpu),
           rl_int8_level_name(rl_int8_level_supported()));
    for (int lv = 0; lv <= (int)rl_cpu_level_supported() && lv <= (int)cpu; lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        for (int il = 0; il <= (int)rl_int8_level_supported(); il++) {
            if (!rl_int8_level_available((rl_int8_level)il)) {
                CHECK(rl_int8_level_set((rl_int8_level)il) == RL_EARG);
                continue;
            }
            CHECK_OK(rl_int8_level_set((rl_int8_level)il));
            rl_int8_level got = rl_int8_level_get();
            /* the kernel level caps the int8 level: generic, then the 256-bit kernels */
            if (lv < RL_CPU_AVX2) CHECK(got == RL_INT8_GENERIC);
            if (lv < RL_CPU_AVX512) CHECK(got <= RL_INT8_AVXVNNI);
            CHECK(got <= (rl_int8_level)il);
            if ((int)got != il) continue; /* a lower level's kernel: it ran already */
            printf("level %s / int8 %s\n", rl_cpu_level_name((rl_cpu_level)lv),
                   rl_int8_level_name(got));
            run_shapes();
            check_non_finite();
        }
    }
    CHECK_OK(rl_cpu_level_set(cpu));
    rl_int8_level name_level;
    CHECK_OK(rl_int8_level_from_name("avx2", &name_level));
    CHECK(name_level == RL_INT8_AVX2);
    CHECK(rl_int8_level_from_name("sse9", &name_level) == RL_EARG);
    check_levels_agree();
    CHECK_OK(rl_int8_level_set(rl_int8_level_supported()));
    check_blocks_threads();
    printf("largest error / bound against float64: %.3f\n", worst_ratio);
    TEST_MAIN_END();
}
