/* The int8 products of gemm_int8.h.
 *
 * The quantized op(A) is a per-thread scratch: rows of kq bytes (the activations plus 128, 128
 * in the padding past k) and a float32 scale per row, in blocks of rows that keep it under
 * 2 MB. Parts of a product (kernels/cpu/parallel.c) get whole tiles of RL_INT8_COLS columns or
 * whole blocks of ROW_BLOCK rows; a row of C is the same integer sum whichever part holds it.
 */
#include "gemm_int8.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/blas.h"
#include "cpu_level.h"
#include "parallel.h"
#include "scratch.h"

#ifdef RL_CPU_X86
#include <immintrin.h>
#define RL_TARGET_VNNI                                                                             \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"), RL_VECTORISE))
#endif

#define ROW_BLOCK 32
#define MR 4 /* rows of C per kernel tile */

/* ---- levels ---- */

static const char *const NAMES[] = {"generic", "avx512vnni"};
#define N_LEVELS 2

const char *rl_int8_level_name(rl_int8_level level) {
    return rl_level_name((int)level, NAMES, N_LEVELS);
}

static int best_level = RL_INT8_GENERIC;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

static void find_best(void) {
#ifdef RL_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        best_level = RL_INT8_AVX512VNNI;
#endif
}

rl_int8_level rl_int8_level_supported(void) {
    pthread_once(&best_once, find_best);
    return (rl_int8_level)best_level;
}

/* -1: not set by rl_int8_level_set (then the best) */
static atomic_int chosen = -1;

rl_int8_level rl_int8_level_get(void) {
    int best = (int)rl_int8_level_supported();
    /* the vector kernel is AVX-512 code: a lower kernel level runs the generic one */
    if (rl_cpu_level_get() < RL_CPU_AVX512) return RL_INT8_GENERIC;
    int l = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (l < 0) l = best;
    return (rl_int8_level)(l < best ? l : best);
}

rl_status rl_int8_level_set(rl_int8_level level) {
    RL_TRY(rl_level_check_set("int8", (int)level, (int)rl_int8_level_supported(), NAMES, N_LEVELS));
    atomic_store_explicit(&chosen, (int)level, memory_order_relaxed);
    return RL_OK;
}

/* ---- packing ---- */

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

size_t rl_int8_packed_bytes(int64_t k, int64_t n) {
    int64_t np = round_up(n, RL_INT8_COLS), kq = round_up(k, 4);
    return (size_t)(np * 8 + np * kq);
}

void rl_int8_pack(void *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n) {
    int64_t np = round_up(n, RL_INT8_COLS), kq = round_up(k, 4);
    float *scale = dst;
    int32_t *sum = (int32_t *)(scale + np);
    int8_t *q = (int8_t *)(sum + np);
    memset(q, 0, (size_t)(np * kq));
    int64_t si = trans ? 1 : ldb, sj = trans ? ldb : 1; /* op(b)[l][j] = b[l * si + j * sj] */
    for (int64_t j = 0; j < np; j++) {
        scale[j] = 0.0f;
        sum[j] = 0;
        if (j >= n) continue;
        const float *col = b + j * sj;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t l = 0; l < k; l++) {
            float x = fabsf(col[l * si]);
            if (!(x <= 3.4e38f)) finite = false; /* NaN or infinity */
            amax = x > amax ? x : amax;
        }
        if (!finite) {
            scale[j] = NAN;
            continue;
        }
        if (amax == 0.0f) continue;
        float inv = 127.0f / amax;
        scale[j] = amax / 127.0f;
        int8_t *qp = q + (j / RL_INT8_PANEL) * kq * RL_INT8_PANEL + (j % RL_INT8_PANEL) * 4;
        int32_t s = 0;
        for (int64_t l = 0; l < k; l++) {
            float v = rintf(col[l * si] * inv);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qp[(l / 4) * 4 * RL_INT8_PANEL + l % 4] = (int8_t)v;
            s += (int32_t)v;
        }
        sum[j] = s;
    }
}

/* op(a)'s rows [0, m) quantized into qa (rows kq apart, plus 128) and sa (their scales) */
static inline __attribute__((always_inline)) void quant_rows_body(uint8_t *qa, float *sa,
                                                                  bool trans, int64_t m, int64_t k,
                                                                  int64_t kq, const float *a,
                                                                  int64_t lda) {
    int64_t si = trans ? 1 : lda, sl = trans ? lda : 1; /* op(a)[i][l] = a[i * si + l * sl] */
    for (int64_t i = 0; i < m; i++) {
        const float *row = a + i * si;
        uint8_t *d = qa + i * kq;
        float amax = 0.0f;
        if (sl == 1)
            for (int64_t l = 0; l < k; l++) {
                float x = fabsf(row[l]);
                amax = x > amax ? x : amax;
            }
        else
            for (int64_t l = 0; l < k; l++) {
                float x = fabsf(row[l * sl]);
                amax = x > amax ? x : amax;
            }
        /* NaN compares false above: look for it (and infinity) separately */
        bool finite = amax <= 3.4e38f;
        if (finite)
            for (int64_t l = 0; l < k && finite; l++)
                finite = row[l * sl] == row[l * sl] && fabsf(row[l * sl]) <= 3.4e38f;
        if (!finite || amax == 0.0f) {
            sa[i] = finite ? 0.0f : NAN;
            memset(d, 128, (size_t)kq);
            continue;
        }
        float inv = 127.0f / amax;
        sa[i] = amax / 127.0f;
        if (sl == 1)
            for (int64_t l = 0; l < k; l++) {
                float v = rintf(row[l] * inv);
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                d[l] = (uint8_t)(int)(v + 128.0f);
            }
        else
            for (int64_t l = 0; l < k; l++) {
                float v = rintf(row[l * sl] * inv);
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                d[l] = (uint8_t)(int)(v + 128.0f);
            }
        memset(d + k, 128, (size_t)(kq - k));
    }
}

/* compiled per level for the vector loops (the results are the same at every level) */
void rl_int8_quant_rows(uint8_t *qa, float *sa, bool trans, int64_t m, int64_t k, int64_t kq,
                        const float *a, int64_t lda);
RL_CPU_LEVELS(rl_int8_quant_rows, quant_rows_body,
              (uint8_t * qa, float *sa, bool trans, int64_t m, int64_t k, int64_t kq,
               const float *a, int64_t lda),
              (qa, sa, trans, m, k, kq, a, lda))

/* ---- kernels: rows [r0, r1) and column tiles [t0, t1) of C ---- */

typedef struct {
    int64_t m, n, kq, ldc;
    float alpha, beta;
    const uint8_t *qa;
    const float *sa;
    const float *scale;
    const int32_t *sum;
    const int8_t *q;
    float *c;
    rl_int8_level level; /* read once per call: every part runs the same kernel */
    bool by_cols;        /* parts get tiles of columns (else blocks of ROW_BLOCK rows) */
    int64_t units;
} job;

static inline float out_value(int32_t acc, int32_t sum, float sa, float sw, float alpha, float beta,
                              const float *c) {
    float v = (float)(acc - 128 * sum) * (sa * sw);
    return beta != 0.0f ? alpha * v + beta * *c : alpha * v;
}

RL_TARGET_BASE static void part_generic(const job *j, int64_t r0, int64_t r1, int64_t t0,
                                        int64_t t1) {
    int64_t kq = j->kq, quads = kq / 4;
    for (int64_t t = t0; t < t1; t++) {
        int64_t c0 = t * RL_INT8_COLS, w = j->n - c0 < RL_INT8_COLS ? j->n - c0 : RL_INT8_COLS;
        if (w <= 0) break;
        const int8_t *bt = j->q + c0 * kq;
        for (int64_t i = r0; i < r1; i++) {
            const uint8_t *ar = j->qa + i * kq;
            int32_t acc[RL_INT8_COLS];
            for (int p = 0; p < RL_INT8_COLS / RL_INT8_PANEL; p++) {
                const int8_t *bp = bt + p * kq * RL_INT8_PANEL;
                /* lane e of a quad row holds column e / 4, element e % 4: sums per lane over
                 * contiguous bytes (a loop that vectorises), the 4 lanes of a column added
                 * after */
                int32_t lanes[4 * RL_INT8_PANEL] = {0};
                for (int64_t r = 0; r < quads; r++) {
                    const int8_t *br = bp + r * 4 * RL_INT8_PANEL;
                    int32_t a4[4] = {ar[4 * r], ar[4 * r + 1], ar[4 * r + 2], ar[4 * r + 3]};
                    for (int e = 0; e < 4 * RL_INT8_PANEL; e++)
                        lanes[e] += a4[e & 3] * br[e];
                }
                for (int jj = 0; jj < RL_INT8_PANEL; jj++)
                    acc[p * RL_INT8_PANEL + jj] =
                        lanes[4 * jj] + lanes[4 * jj + 1] + lanes[4 * jj + 2] + lanes[4 * jj + 3];
            }
            float *cr = j->c + i * j->ldc + c0;
            for (int64_t jj = 0; jj < w; jj++)
                cr[jj] = out_value(acc[jj], j->sum[c0 + jj], j->sa[i], j->scale[c0 + jj], j->alpha,
                                   j->beta, cr + jj);
        }
    }
}

#ifdef RL_CPU_X86
/* mr (1..MR) rows x one tile of 64 columns; a at the first row (rows kq apart), b at the tile */
RL_TARGET_VNNI static inline __attribute__((always_inline)) void
tile_vnni(int mr, int64_t kq, const uint8_t *a, const float *sa, const int8_t *b,
          const float *scale, const int32_t *sum, float *c, int64_t ldc, int64_t w, float alpha,
          float beta) {
    enum { NP = RL_INT8_COLS / RL_INT8_PANEL };
    int64_t quads = kq / 4, ps = kq * RL_INT8_PANEL;
    __m512i acc[MR][NP];
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NP; p++)
            acc[i][p] = _mm512_setzero_si512();
    int64_t r = 0;
    if (mr == 1) {
        /* one row: two sets of sums (even and odd quads), so that 8 chains of vpdpbusd
         * overlap; integer sums, the same result */
        __m512i odd[NP];
        for (int p = 0; p < NP; p++)
            odd[p] = _mm512_setzero_si512();
        for (; r + 1 < quads; r += 2) {
            int32_t x0, x1;
            memcpy(&x0, a + 4 * r, 4);
            memcpy(&x1, a + 4 * r + 4, 4);
            __m512i va0 = _mm512_set1_epi32(x0), va1 = _mm512_set1_epi32(x1);
            for (int p = 0; p < NP; p++) {
                const int8_t *bp = b + p * ps + r * 64;
                acc[0][p] = _mm512_dpbusd_epi32(acc[0][p], va0, _mm512_loadu_si512(bp));
                odd[p] = _mm512_dpbusd_epi32(odd[p], va1, _mm512_loadu_si512(bp + 64));
            }
        }
        for (int p = 0; p < NP; p++)
            acc[0][p] = _mm512_add_epi32(acc[0][p], odd[p]);
    }
    for (; r < quads; r++) {
        __m512i vb[NP];
        for (int p = 0; p < NP; p++)
            vb[p] = _mm512_loadu_si512(b + p * ps + r * 64);
        for (int i = 0; i < mr; i++) {
            int32_t x;
            memcpy(&x, a + i * kq + 4 * r, 4);
            __m512i va = _mm512_set1_epi32(x);
            for (int p = 0; p < NP; p++)
                acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], va, vb[p]);
        }
    }
    __m512 valpha = _mm512_set1_ps(alpha), vbeta = _mm512_set1_ps(beta);
    for (int p = 0; p < NP; p++) {
        int64_t off = p * RL_INT8_PANEL, left = w - off;
        if (left <= 0) break;
        __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 vs = _mm512_loadu_ps(scale + off);
        __m512i vsum = _mm512_slli_epi32(_mm512_loadu_si512(sum + off), 7);
        for (int i = 0; i < mr; i++) {
            __m512 sc = _mm512_mul_ps(_mm512_set1_ps(sa[i]), vs);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][p], vsum)), sc);
            v = _mm512_mul_ps(valpha, v);
            float *cp = c + i * ldc + off;
            if (beta != 0.0f) v = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(mk, cp), v);
            _mm512_mask_storeu_ps(cp, mk, v);
        }
    }
}

RL_TARGET_VNNI static void part_vnni(const job *j, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
    int64_t kq = j->kq;
    for (int64_t t = t0; t < t1; t++) {
        int64_t c0 = t * RL_INT8_COLS, w = j->n - c0 < RL_INT8_COLS ? j->n - c0 : RL_INT8_COLS;
        if (w <= 0) break;
        const int8_t *bt = j->q + c0 * kq;
        const float *sc = j->scale + c0;
        const int32_t *su = j->sum + c0;
        for (int64_t i = r0; i < r1; i += MR) {
            const uint8_t *ai = j->qa + i * kq;
            const float *sa = j->sa + i;
            float *ci = j->c + i * j->ldc + c0;
            float al = j->alpha, be = j->beta;
            switch (r1 - i < MR ? r1 - i : MR) {
            case 1: tile_vnni(1, kq, ai, sa, bt, sc, su, ci, j->ldc, w, al, be); break;
            case 2: tile_vnni(2, kq, ai, sa, bt, sc, su, ci, j->ldc, w, al, be); break;
            case 3: tile_vnni(3, kq, ai, sa, bt, sc, su, ci, j->ldc, w, al, be); break;
            default: tile_vnni(4, kq, ai, sa, bt, sc, su, ci, j->ldc, w, al, be); break;
            }
        }
    }
}
#endif

static void run_part(void *ctx, int part, int parts) {
    const job *j = ctx;
    int64_t u0 = j->units * part / parts, u1 = j->units * (part + 1) / parts;
    if (u0 >= u1) return;
    int64_t r0 = 0, r1 = j->m, t0 = 0, t1 = round_up(j->n, RL_INT8_COLS) / RL_INT8_COLS;
    if (j->by_cols) {
        t0 = u0;
        t1 = u1;
    } else {
        r0 = u0 * ROW_BLOCK;
        r1 = u1 * ROW_BLOCK < j->m ? u1 * ROW_BLOCK : j->m;
    }
#ifdef RL_CPU_X86
    if (j->level == RL_INT8_AVX512VNNI) {
        part_vnni(j, r0, r1, t0, t1);
        return;
    }
#endif
    part_generic(j, r0, r1, t0, t1);
}

#define SCRATCH_BYTES ((int64_t)2 << 20)

rl_status rl_gemm_int8_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const void *packed, float beta, float *c,
                              int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    int64_t kq = round_up(k, 4), np = round_up(n, RL_INT8_COLS);
    int64_t rows = SCRATCH_BYTES / (kq + 4) / ROW_BLOCK * ROW_BLOCK;
    if (rows < ROW_BLOCK) rows = ROW_BLOCK;
    if (rows > m) rows = m;
    uint8_t *qa = rl_thread_scratch(RL_SCRATCH_INT8_A, (size_t)(rows * (kq + 4)) + 64,
                                    "int8 gemm: the quantized left operand");
    if (!qa) return RL_ENOMEM;
    float *sa = (float *)(qa + round_up(rows * kq, 64));
    const float *scale = packed;
    job j = {.n = n,
             .kq = kq,
             .ldc = ldc,
             .alpha = alpha,
             .beta = beta,
             .qa = qa,
             .sa = sa,
             .scale = scale,
             .sum = (const int32_t *)(scale + np),
             .q = (const int8_t *)(scale + 2 * np),
             .level = rl_int8_level_get()};
    int threads = rl_blas_get_threads();
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
        int64_t mi = m - i0 < rows ? m - i0 : rows;
        rl_int8_quant_rows(qa, sa, trans_a, mi, k, kq, trans_a ? a + i0 : a + i0 * lda, lda);
        j.m = mi;
        j.c = c + i0 * ldc;
        int64_t col_units = np / RL_INT8_COLS, row_units = (mi + ROW_BLOCK - 1) / ROW_BLOCK;
        j.by_cols = col_units >= row_units;
        j.units = j.by_cols ? col_units : row_units;
        /* below ~1 M multiply-adds per part a handoff costs more than it saves */
        int parts = threads < j.units ? threads : (int)j.units;
        double macs = (double)mi * (double)n * (double)k;
        if (parts > macs / 1e6) parts = (int)(macs / 1e6);
        if (parts > 1)
            rl_cpu_parallel(parts, run_part, &j);
        else
            run_part(&j, 0, 1);
    }
    return RL_OK;
}

rl_status rl_gemm_int8(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    int64_t kq = round_up(k, 4);
    int64_t cols = SCRATCH_BYTES / (kq + 8) / RL_INT8_COLS * RL_INT8_COLS;
    if (cols < RL_INT8_COLS) cols = RL_INT8_COLS;
    if (cols > n) cols = n;
    void *pb = rl_thread_scratch(RL_SCRATCH_INT8_B, rl_int8_packed_bytes(k, cols),
                                 "int8 gemm: the quantized right operand");
    if (!pb) return RL_ENOMEM;
    for (int64_t j0 = 0; j0 < n; j0 += cols) {
        int64_t nj = n - j0 < cols ? n - j0 : cols;
        rl_int8_pack(pb, trans_b ? b + j0 * ldb : b + j0, ldb, trans_b, k, nj);
        RL_TRY(rl_gemm_int8_packed(trans_a, m, nj, k, alpha, a, lda, pb, beta, c + j0, ldc));
    }
    return RL_OK;
}
