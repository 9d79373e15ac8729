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
#define MR 4  /* rows of C per kernel tile */
#define MRY 2 /* rows of C per tile of the 256-bit kernels (16 registers: 8 sums) */
#define HALF (2 * RL_INT8_PANEL) /* columns per tile of the 256-bit kernels: two panels */

/* ---- levels ---- */

static const char *const NAMES[] = {"generic", "avx2", "avxvnni", "avx512vnni"};
#define N_LEVELS 4
#define NAME_LIST "generic, avx2, avxvnni or avx512vnni"
#define ENV_NAME "RL_INT8_LEVEL"

const char *rl_int8_level_name(rl_int8_level level) {
    return rl_level_name((int)level, NAMES, N_LEVELS);
}

rl_status rl_int8_level_from_name(const char *name, rl_int8_level *out) {
    int i = rl_level_index(name, NAMES, N_LEVELS);
    if (i < 0) return rl_error(RL_EARG, "int8 level '%s': expected %s", name, NAME_LIST);
    *out = (rl_int8_level)i;
    return RL_OK;
}

/* bit l set: this CPU has level l's instructions (the levels are ranks, not nested sets: an
 * AVX-512 CPU may lack AVX-VNNI, as Ice Lake and Zen 4 do) */
static unsigned available_mask = 1u << RL_INT8_GENERIC;
static int best_level = RL_INT8_GENERIC;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

static void find_best(void) {
#ifdef RL_CPU_X86
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) available_mask |= 1u << RL_INT8_AVX2;
    if (avx2 && __builtin_cpu_supports("avxvnni")) available_mask |= 1u << RL_INT8_AVXVNNI;
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        available_mask |= 1u << RL_INT8_AVX512VNNI;
#endif
    for (int l = 0; l < N_LEVELS; l++)
        if (available_mask & (1u << l)) best_level = l;
}

rl_int8_level rl_int8_level_supported(void) {
    pthread_once(&best_once, find_best);
    return (rl_int8_level)best_level;
}

bool rl_int8_level_available(rl_int8_level level) {
    pthread_once(&best_once, find_best);
    return (int)level >= 0 && (int)level < N_LEVELS && (available_mask & (1u << level));
}

/* -1: not set by rl_int8_level_set (then RL_INT8_LEVEL, else the best) */
static atomic_int chosen = -1;

static int env_level(void) { return rl_level_env(ENV_NAME, NAMES, N_LEVELS); }

rl_int8_level rl_int8_level_get(void) {
    int best = (int)rl_int8_level_supported();
    int l = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (l < 0) {
        int want = env_level();
        l = want >= 0 ? want : best;
        int expected = -1;
        atomic_compare_exchange_strong(&chosen, &expected, l);
    }
    if (l > best) l = best;
    /* the kernel level caps the instruction set: avx2 runs the 256-bit kernels, generic the
     * portable one */
    rl_cpu_level cpu = rl_cpu_level_get();
    if (cpu < RL_CPU_AVX2) return RL_INT8_GENERIC;
    if (cpu < RL_CPU_AVX512 && l > RL_INT8_AVXVNNI) l = RL_INT8_AVXVNNI;
    /* a level this CPU lacks (RL_INT8_LEVEL=avxvnni on Ice Lake, or the cap above) runs the
     * next one down */
    while (l > 0 && !(available_mask & (1u << l)))
        l--;
    return (rl_int8_level)l;
}

rl_status rl_int8_level_set(rl_int8_level level) {
    RL_TRY(rl_level_check_set("int8", (int)level, (int)rl_int8_level_supported(), NAMES, N_LEVELS));
    if (!rl_int8_level_available(level))
        return rl_error(RL_EARG, "int8 level: %s is not supported by this CPU (best: %s)",
                        rl_int8_level_name(level), rl_int8_level_name(rl_int8_level_supported()));
    atomic_store_explicit(&chosen, (int)level, memory_order_relaxed);
    return RL_OK;
}

rl_status rl_int8_level_check_env(void) {
    const char *s = getenv(ENV_NAME);
    if (s && *s && env_level() < 0)
        return rl_error(RL_EARG, "%s=%s: expected %s", ENV_NAME, s, NAME_LIST);
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

/* The scaling of an integer sum d, one rounding per step in this order at every level (the
 * vector kernels do the same multiplies and one fused beta * c + v), so that all levels give
 * the same bits. */
static inline float out_value(int32_t d, float sa, float sw, float alpha, float beta,
                              const float *c) {
    float v = alpha * ((float)d * (sa * sw));
    return beta != 0.0f ? fmaf(beta, *c, v) : v;
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
                cr[jj] = out_value(acc[jj] - 128 * j->sum[c0 + jj], j->sa[i], j->scale[c0 + jj],
                                   j->alpha, j->beta, cr + jj);
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
        for (int p = 0; p < NP; p++) {
            vb[p] = _mm512_loadu_si512(b + p * ps + r * 64);
            /* in a register, not folded into each of the mr rows' vpdpbusd as a load */
            __asm__("" : "+v"(vb[p]));
        }
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

/* The 256-bit kernels: mr (1..MRY) rows x one half tile (two panels, 32 columns, 4 vectors of
 * 8 int32 sums per row); a at the first row, b at the first panel, w valid columns (1..32).
 *
 * vnni (AVX-VNNI's vpdpbusd on ymm): the unsigned offset activations times the signed weights,
 * and the offset's share 128 * sum taken off after, as the AVX-512 kernel does.
 *
 * Without VNNI the activations are made signed again (x ^ 0x80 is x - 128 as an int8: -127..127,
 * 0 in the padding) and each quad goes through vpmaddubsw(|a|, sign(a) * b) and vpmaddwd by
 * ones. vpmaddubsw saturates its int16 pair sums, but here |a| <= 127 and |b| <= 127 (both are
 * clamped to [-127, 127] when quantized), so a pair sums to at most 2 * 127 * 127 = 32258 <
 * 32767: it never saturates, and the int32 sums are the exact integer dot products. */
/* AVX-VNNI's vpdpbusd (VEX, ymm): acc + the 4-byte dot products of unsigned a and signed b, per
 * int32 lane. Written out because tile_ymm serves both 256-bit levels and so is compiled for
 * AVX2 only, where GCC refuses the avxvnni intrinsic; "x" keeps the operands in ymm0-15, which
 * the VEX encoding can name. */
RL_TARGET_AVX2 static inline __attribute__((always_inline)) __m256i
dpbusd_vex(__m256i acc, __m256i a, __m256i b) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    return acc;
}

RL_TARGET_AVX2 static inline __attribute__((always_inline)) void
tile_ymm(bool vnni, int mr, int64_t kq, const uint8_t *a, const float *sa, const int8_t *b,
         const float *scale, const int32_t *sum, float *c, int64_t ldc, int64_t w, float alpha,
         float beta) {
    enum { NV = HALF / 8 };
    int64_t quads = kq / 4, ps = kq * RL_INT8_PANEL;
    __m256i acc[MRY][NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < NV; v++)
            acc[i][v] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    int64_t r = 0;
    if (vnni && mr == 1) {
        /* one row: sums of even and odd quads apart, so that 8 chains of vpdpbusd overlap */
        __m256i odd[NV];
        for (int v = 0; v < NV; v++)
            odd[v] = _mm256_setzero_si256();
        for (; r + 1 < quads; r += 2) {
            int32_t x0, x1;
            memcpy(&x0, a + 4 * r, 4);
            memcpy(&x1, a + 4 * r + 4, 4);
            __m256i va0 = _mm256_set1_epi32(x0), va1 = _mm256_set1_epi32(x1);
            for (int v = 0; v < NV; v++) {
                const int8_t *bp = b + (v / 2) * ps + r * 64 + (v % 2) * 32;
                acc[0][v] = dpbusd_vex(acc[0][v], va0, _mm256_loadu_si256((const __m256i *)bp));
                odd[v] = dpbusd_vex(odd[v], va1, _mm256_loadu_si256((const __m256i *)(bp + 64)));
            }
        }
        for (int v = 0; v < NV; v++)
            acc[0][v] = _mm256_add_epi32(acc[0][v], odd[v]);
    }
    for (; r < quads; r++) {
        __m256i vb[NV];
        for (int v = 0; v < NV; v++)
            vb[v] = _mm256_loadu_si256((const __m256i *)(b + (v / 2) * ps + r * 64 + (v % 2) * 32));
        for (int i = 0; i < mr; i++) {
            int32_t x;
            memcpy(&x, a + i * kq + 4 * r, 4);
            __m256i va = _mm256_set1_epi32(x);
            if (vnni) {
                for (int v = 0; v < NV; v++)
                    acc[i][v] = dpbusd_vex(acc[i][v], va, vb[v]);
            } else {
                __m256i sa8 = _mm256_xor_si256(va, flip), ua = _mm256_abs_epi8(sa8);
                for (int v = 0; v < NV; v++) {
                    __m256i p = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(vb[v], sa8));
                    acc[i][v] = _mm256_add_epi32(acc[i][v], _mm256_madd_epi16(p, ones));
                }
            }
        }
    }
    __m256 valpha = _mm256_set1_ps(alpha), vbeta = _mm256_set1_ps(beta);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int v = 0; v < NV; v++) {
        int64_t off = v * 8, left = w - off;
        if (left <= 0) break;
        __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(left < 8 ? (int)left : 8), lane);
        __m256 vs = _mm256_loadu_ps(scale + off);
        __m256i vsum = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(sum + off)), 7);
        for (int i = 0; i < mr; i++) {
            __m256i d = vnni ? _mm256_sub_epi32(acc[i][v], vsum) : acc[i][v];
            __m256 sc = _mm256_mul_ps(_mm256_set1_ps(sa[i]), vs);
            __m256 x = _mm256_mul_ps(valpha, _mm256_mul_ps(_mm256_cvtepi32_ps(d), sc));
            float *cp = c + i * ldc + off;
            if (beta != 0.0f) x = _mm256_fmadd_ps(vbeta, _mm256_maskload_ps(cp, mk), x);
            _mm256_maskstore_ps(cp, mk, x);
        }
    }
}

/* rows [r0, r1) and column tiles [t0, t1) with tile_ymm, each 64-column tile as two halves */
RL_TARGET_AVX2 static inline __attribute__((always_inline)) void
part_ymm(bool vnni, const job *j, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
    int64_t kq = j->kq;
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < RL_INT8_COLS / HALF; h++) {
            int64_t c0 = t * RL_INT8_COLS + h * HALF, w = j->n - c0 < HALF ? j->n - c0 : HALF;
            if (w <= 0) return;
            const int8_t *bt = j->q + c0 * kq;
            for (int64_t i = r0; i < r1; i += MRY) {
                const uint8_t *ai = j->qa + i * kq;
                const float *sa = j->sa + i;
                float *ci = j->c + i * j->ldc + c0;
                const float *sc = j->scale + c0;
                const int32_t *su = j->sum + c0;
                if (r1 - i == 1)
                    tile_ymm(vnni, 1, kq, ai, sa, bt, sc, su, ci, j->ldc, w, j->alpha, j->beta);
                else
                    tile_ymm(vnni, 2, kq, ai, sa, bt, sc, su, ci, j->ldc, w, j->alpha, j->beta);
            }
        }
}

RL_TARGET_AVX2 static void part_avx2(const job *j, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
    part_ymm(false, j, r0, r1, t0, t1);
}

/* the CPU has AVX-VNNI when this level is chosen (rl_int8_level_get) */
RL_TARGET_AVX2 static void part_avxvnni(const job *j, int64_t r0, int64_t r1, int64_t t0,
                                        int64_t t1) {
    part_ymm(true, j, r0, r1, t0, t1);
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
    switch (j->level) {
    case RL_INT8_AVX512VNNI: part_vnni(j, r0, r1, t0, t1); return;
    case RL_INT8_AVXVNNI: part_avxvnni(j, r0, r1, t0, t1); return;
    case RL_INT8_AVX2: part_avx2(j, r0, r1, t0, t1); return;
    default: break;
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
