/* The CPU kernels with an AArch64 path, cross-compiled for AArch64 and run under qemu-aarch64 by
 * tests/sh/test_aarch64.sh (the rest of rnnlua needs AArch64 builds of Lua, HDF5 and OpenBLAS,
 * which a cross toolchain lacks): the level names and errors of cpu_level.h, the packed
 * small-M GEMM (the NEON kernel of gemm_neon.c and the generic loop, on one thread and on two)
 * against a float64 reference, and the float32 LSTM and GRU pointwise passes (the generic loops,
 * vectorised with Advanced SIMD) against their float64 versions.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/error.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/cpu/gemm_int8.h"
#include "../../kernels/cpu/gemm_small.h"
#include "../../kernels/gru.h"
#include "../../kernels/lstm.h"
#include "../c/check.h"

/* core/blas.c needs an AArch64 OpenBLAS; the packed GEMM asks BLAS only for its thread count,
 * which the test sets itself to run the GEMM on one thread and split across two. */
static int blas_threads = 1;
int rl_blas_get_threads(void);
int rl_blas_get_threads(void) { return blas_threads; }

/* gemm_bf16.c's int8 context runs products of two activations through sgemm (a plain loop
 * here; these tests do not reach it) */
void rl_blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc);
void rl_blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                   int64_t ldc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0;
            for (int64_t l = 0; l < k; l++)
                s += (trans_a ? a[l * lda + i] : a[i * lda + l]) *
                     (trans_b ? b[j * ldb + l] : b[l * ldb + j]);
            c[i * ldc + j] = alpha * s + (beta != 0 ? beta * c[i * ldc + j] : 0);
        }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

/* uniform in [-scale, scale) */
static float frand(float scale) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return scale * ((float)(rng_state >> 40) / (float)(1u << 23) - 1.0f);
}

static float *frand_array(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = frand(scale);
    return p;
}

static double *to_f64(const float *p, int64_t n) {
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

/* largest |x - y| / (1 + |y|); not inlined: GCC 12's AArch64 vectoriser fails with an
 * internal error on this loop inlined into the tests */
__attribute__((noinline)) static double max_diff(const float *x, const double *y, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)x[i] - y[i]) / (1.0 + fabs(y[i])));
    return worst;
}

static void test_levels(void) {
    rl_cpu_level lv = RL_CPU_GENERIC;
    CHECK(rl_cpu_level_supported() == RL_CPU_NEON);
    CHECK(strcmp(rl_cpu_level_name(RL_CPU_NEON), "neon") == 0);
    CHECK(strcmp(rl_cpu_level_name(RL_CPU_GENERIC), "generic") == 0);
    CHECK_OK(rl_cpu_level_from_name("neon", &lv));
    CHECK(lv == RL_CPU_NEON);
    CHECK(rl_cpu_level_from_name("avx2", &lv) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "cpu level 'avx2': expected generic or neon") != NULL);
    CHECK(rl_cpu_level_set((rl_cpu_level)2) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "not supported by this CPU (best: neon)") != NULL);
    setenv("RL_CPU_LEVEL", "avx512", 1);
    CHECK(rl_cpu_level_check_env() == RL_EARG);
    CHECK(strstr(rl_errmsg(), "RL_CPU_LEVEL=avx512: expected generic or neon") != NULL);
    setenv("RL_CPU_LEVEL", "neon", 1);
    CHECK_OK(rl_cpu_level_check_env());
    unsetenv("RL_CPU_LEVEL");
}

/* c = a op(b) (+ c), sizes over and under the panel (48), the row tile (4), the k block (128)
 * and the 4-wide k steps; a and c with row gaps, whose padding must stay untouched. */
static void test_packed_gemm(void) {
    static const int64_t sizes[][3] = {
        {1, 1, 1},       {3, 5, 47},    {8, 7, 48},     {9, 13, 49},    {17, 33, 100},
        {16, 300, 1000}, {20, 650, 97}, {64, 128, 512}, {5, 2048, 130}, {6, 129, 72},
        {2, 257, 30},    {7, 128, 24},  {11, 1, 25},    {4, 131, 17},   {13, 3, 5}};
    double worst = 0;
    bool pad_ok = true;
    for (int threads = 1; threads <= 2; threads++) {
        blas_threads = threads;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int trans = 0; trans <= 1; trans++)
                for (int acc = 0; acc <= 1; acc++) {
                    int64_t m = sizes[si][0], k = sizes[si][1], n = sizes[si][2];
                    int64_t lda = k + 2, ldc = n + 3, ldb = trans ? k : n;
                    float *a = frand_array(m * lda, 1.0f), *b = frand_array(k * n, 1.0f);
                    float *c = frand_array(m * ldc, 1.0f);
                    double *ref = to_f64(c, m * ldc);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double s = acc ? ref[i * ldc + j] : 0.0;
                            for (int64_t q = 0; q < k; q++)
                                s += (double)a[i * lda + q] *
                                     (double)(trans ? b[j * ldb + q] : b[q * ldb + j]);
                            ref[i * ldc + j] = s;
                        }
                    float *packed = malloc((size_t)rl_gemm_packed_size(k, n) * sizeof *packed);
                    rl_gemm_pack_f32(packed, b, ldb, trans, k, n);
                    rl_gemm_packed_f32(m, n, k, a, lda, packed, acc, c, ldc);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < ldc; j++) {
                            double x = c[i * ldc + j], y = ref[i * ldc + j];
                            if (j >= n)
                                pad_ok = pad_ok && x == y;
                            else
                                worst = fmax(worst, fabs(x - y) / (1.0 + fabs(y)) / (double)k);
                        }
                    free(a);
                    free(b);
                    free(c);
                    free(ref);
                    free(packed);
                }
    }
    blas_threads = 1;
    printf("packed gemm (%s): worst error per k term %.3g\n", rl_cpu_level_name(rl_cpu_level_get()),
           worst);
    CHECK(worst < 1e-6);
    CHECK(pad_ok);
}

enum { B = 6, H = 37, T_STEP = 2 };               /* H: no multiple of the vector width */
static const int32_t LEN[B] = {3, 1, 2, 5, 2, 0}; /* rows 1 and 5 are padding at t = 2 */

/* One forward and one backward step of the LSTM, with and without peepholes. */
static void test_lstm(void) {
    double worst = 0;
    for (int peep = 0; peep <= 1; peep++) {
        float *z = frand_array(B * 4 * H, 2.0f), *bias = frand_array(4 * H, 0.5f);
        float *pw = frand_array(3 * H, 0.5f), *cp = frand_array(B * H, 1.0f);
        float *hp = frand_array(B * H, 1.0f), *c = frand_array(B * H, 1.0f);
        float *h = frand_array(B * H, 1.0f), *out = frand_array(B * H, 1.0f);
        double *zd = to_f64(z, B * 4 * H), *biasd = to_f64(bias, 4 * H), *pwd = to_f64(pw, 3 * H);
        double *cpd = to_f64(cp, B * H), *hpd = to_f64(hp, B * H), *cd = to_f64(c, B * H);
        double *hd = to_f64(h, B * H), *outd = to_f64(out, B * H);
        const float *pf[3] = {pw, pw + H, pw + 2 * H};
        const double *pd[3] = {pwd, pwd + H, pwd + 2 * H};
        rl_lstm_cpu_fwd_f32(B, H, T_STEP, LEN, z, bias, peep ? pf : NULL, cp, hp, c, h, out, NULL);
        rl_lstm_cpu_fwd_f64(B, H, T_STEP, LEN, zd, biasd, peep ? pd : NULL, cpd, hpd, cd, hd, outd,
                            NULL);
        worst = fmax(worst, max_diff(z, zd, B * 4 * H));
        worst = fmax(worst, max_diff(c, cd, B * H));
        worst = fmax(worst, max_diff(h, hd, B * H));
        worst = fmax(worst, max_diff(out, outd, B * H));

        /* backward from the forward's activations (the same in both: compared above) */
        float *dout = frand_array(B * H, 1.0f), *dh = frand_array(B * H, 1.0f);
        float *dc = frand_array(B * H, 1.0f);
        double *doutd = to_f64(dout, B * H), *dhd = to_f64(dh, B * H), *dcd = to_f64(dc, B * H);
        for (int64_t i = 0; i < B * 4 * H; i++)
            zd[i] = z[i];
        rl_lstm_cpu_bwd_f32(B, H, T_STEP, LEN, z, peep ? pf : NULL, cp, c, dout, H, dh, dc, NULL);
        rl_lstm_cpu_bwd_f64(B, H, T_STEP, LEN, zd, peep ? pd : NULL, cpd, cd, doutd, H, dhd, dcd,
                            NULL);
        worst = fmax(worst, max_diff(z, zd, B * 4 * H));
        worst = fmax(worst, max_diff(dh, dhd, B * H));
        worst = fmax(worst, max_diff(dc, dcd, B * H));
        void *all[] = {z,   bias, pw, cp, hp,   c,    h,  out, zd,    biasd, pwd,
                       cpd, hpd,  cd, hd, outd, dout, dh, dc,  doutd, dhd,   dcd};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    printf("lstm pointwise (%s): float32 vs float64 %.3g\n", rl_cpu_level_name(rl_cpu_level_get()),
           worst);
    CHECK(worst < 1e-5);
}

/* One forward and one backward step of the GRU, with the bias sums. */
static void test_gru(void) {
    double worst = 0;
    float *g = frand_array(B * 4 * H, 2.0f), *b = frand_array(3 * H, 0.5f);
    float *bh = frand_array(3 * H, 0.5f), *hp = frand_array(B * H, 1.0f);
    float *h = frand_array(B * H, 1.0f), *out = frand_array(B * H, 1.0f);
    double *gd = to_f64(g, B * 4 * H), *bd = to_f64(b, 3 * H), *bhd = to_f64(bh, 3 * H);
    double *hpd = to_f64(hp, B * H), *hd = to_f64(h, B * H), *outd = to_f64(out, B * H);
    rl_gru_cpu_fwd_f32(B, H, T_STEP, LEN, g, b, bh, hp, h, out, NULL);
    rl_gru_cpu_fwd_f64(B, H, T_STEP, LEN, gd, bd, bhd, hpd, hd, outd, NULL);
    worst = fmax(worst, max_diff(g, gd, B * 4 * H));
    worst = fmax(worst, max_diff(h, hd, B * H));
    worst = fmax(worst, max_diff(out, outd, B * H));

    float *dout = frand_array(B * H, 1.0f), *dh = frand_array(B * H, 1.0f);
    float *db = frand_array(3 * H, 1.0f), *dbh = frand_array(3 * H, 1.0f);
    double *doutd = to_f64(dout, B * H), *dhd = to_f64(dh, B * H);
    double *dbd = to_f64(db, 3 * H), *dbhd = to_f64(dbh, 3 * H);
    for (int64_t i = 0; i < B * 4 * H; i++)
        gd[i] = g[i];
    rl_gru_cpu_bwd_f32(B, H, T_STEP, LEN, g, hp, dout, H, dh, db, dbh, NULL);
    rl_gru_cpu_bwd_f64(B, H, T_STEP, LEN, gd, hpd, doutd, H, dhd, dbd, dbhd, NULL);
    worst = fmax(worst, max_diff(g, gd, B * 4 * H));
    worst = fmax(worst, max_diff(dh, dhd, B * H));
    worst = fmax(worst, max_diff(db, dbd, 3 * H));
    worst = fmax(worst, max_diff(dbh, dbhd, 3 * H));
    void *all[] = {g,  b,    bh,   hp, h,  out, gd,    bd,  bhd, hpd,
                   hd, outd, dout, dh, db, dbh, doutd, dhd, dbd, dbhd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    printf("gru pointwise (%s): float32 vs float64 %.3g\n", rl_cpu_level_name(rl_cpu_level_get()),
           worst);
    CHECK(worst < 1e-5);
}

/* The int8 product's generic kernel (gemm_int8.h): operands that are integers with 127 as the
 * largest magnitude of each row of A and each column of B quantize exactly (scale 1), so C is
 * the exact integer product (pins the packing, the offset of 128 and the column sums). */
static void test_int8(void) {
    enum { M = 5, N = 67, K = 37 };
    static float a[M * K], b[N * K], c[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((int)(rng_state = rng_state * 6364136223846793005u + 1442695040888963407u) %
                       128);
    for (int i = 0; i < N * K; i++)
        b[i] = (float)((int)(rng_state = rng_state * 6364136223846793005u + 1442695040888963407u) %
                       128);
    for (int i = 0; i < M; i++)
        a[i * K + i % K] = i % 2 ? 127.0f : -127.0f;
    for (int j = 0; j < N; j++)
        b[j * K + j % K] = j % 2 ? -127.0f : 127.0f;
    CHECK(rl_int8_level_get() == RL_INT8_GENERIC);
    CHECK_OK(rl_gemm_int8(false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int l = 0; l < K; l++)
                s += (double)a[i * K + l] * b[j * K + l];
            if (c[i * N + j] != (float)s) bad++;
        }
    CHECK(bad == 0);
}

int main(void) {
    test_levels();
    for (int lv = RL_CPU_GENERIC; lv <= (int)rl_cpu_level_supported(); lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        CHECK(rl_gemm_packed_fast() == (lv == RL_CPU_NEON));
        test_packed_gemm();
        test_lstm();
        test_gru();
        test_int8();
    }
    TEST_MAIN_END();
}
