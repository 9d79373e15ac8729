/* The bf16 products of gemm_bf16.h.
 *
 * Buffers: the rounded op(A) is a per-thread scratch of mp x kp bf16 (m rounded up to 16 rows,
 * k to kp, a multiple of 32, zeros in the padding), so that AMX's 16-row x 32-element A tiles
 * never read past it; the packed op(B) holds an even number of panels (kp / 2 row pairs x 16
 * columns x 2 each), so that every kernel works on two panels (32 columns) at once.
 * Parts of a product (kernels/cpu/parallel.c) get whole pairs of panels or whole blocks of 32
 * rows; a row of C is summed in the same order whichever part or block holds it.
 */
#include "gemm_bf16.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "../../core/bf16.h"
#include "../../core/blas.h"
#include "cpu_level.h"
#include "gemm_int8.h"
#include "parallel.h"
#include "scratch.h"

#ifdef RL_CPU_X86
#include <immintrin.h>
#define RL_TARGET_BF16                                                                             \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"), RL_VECTORISE))
#define RL_TARGET_AMX                                                                              \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16"),      \
                   RL_VECTORISE))
#endif

#define KP_ALIGN 32 /* k padding: one AMX A tile row (64 bytes of bf16) */
#define MP_ALIGN 16 /* row padding of the rounded op(A): one AMX tile's rows */
#define ROW_BLOCK 32

/* ---- levels ---- */

static const char *const NAMES[] = {"generic", "avx512bf16", "amx"};
#define N_LEVELS 3
#define NAME_LIST "generic, avx512bf16 or amx"
#define ENV_NAME "RL_BF16_LEVEL"

const char *rl_bf16_level_name(rl_bf16_level level) {
    return rl_level_name((int)level, NAMES, N_LEVELS);
}

rl_status rl_bf16_level_from_name(const char *name, rl_bf16_level *out) {
    int i = rl_level_index(name, NAMES, N_LEVELS);
    if (i < 0) return rl_error(RL_EARG, "bf16 level '%s': expected %s", name, NAME_LIST);
    *out = (rl_bf16_level)i;
    return RL_OK;
}

static int best_level = RL_BF16_GENERIC;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

#ifdef RL_CPU_X86
/* Linux keeps the AMX tile data out of a process's saved state until it asks for it; a kernel
 * older than 5.16 (or one that refuses) answers with an error and the tiles stay off. */
static bool amx_permitted(void) {
#ifdef __linux__
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;
#endif
}
#endif

static void find_best(void) {
#ifdef RL_CPU_X86
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
                  __builtin_cpu_supports("fma");
    if (!avx512 || !__builtin_cpu_supports("avx512bf16")) return;
    best_level = RL_BF16_AVX512BF16;
    if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") && amx_permitted())
        best_level = RL_BF16_AMX;
#endif
}

rl_bf16_level rl_bf16_level_supported(void) {
    pthread_once(&best_once, find_best);
    return (rl_bf16_level)best_level;
}

/* -1: not set by rl_bf16_level_set (then RL_BF16_LEVEL, else the best) */
static atomic_int chosen = -1;

static int env_level(void) { return rl_level_env(ENV_NAME, NAMES, N_LEVELS); }

rl_bf16_level rl_bf16_level_get(void) {
    int best = (int)rl_bf16_level_supported();
    /* the vector kernels are AVX-512 code: a lower kernel level (RL_CPU_LEVEL=avx2, a
     * portable build's tests) runs the generic one */
    if (rl_cpu_level_get() < RL_CPU_AVX512) return RL_BF16_GENERIC;
    int l = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (l < 0) {
        int want = env_level();
        l = want >= 0 ? want : best;
        int expected = -1;
        atomic_compare_exchange_strong(&chosen, &expected, l);
    }
    return (rl_bf16_level)(l < best ? l : best);
}

rl_status rl_bf16_level_set(rl_bf16_level level) {
    RL_TRY(rl_level_check_set("bf16", (int)level, (int)rl_bf16_level_supported(), NAMES, N_LEVELS));
    atomic_store_explicit(&chosen, (int)level, memory_order_relaxed);
    return RL_OK;
}

rl_status rl_bf16_level_check_env(void) {
    const char *s = getenv(ENV_NAME);
    if (s && *s && env_level() < 0)
        return rl_error(RL_EARG, "%s=%s: expected %s", ENV_NAME, s, NAME_LIST);
    return RL_OK;
}

/* ---- packing ---- */

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

static int64_t panel_count(int64_t n) {
    return round_up((n + RL_BF16_PANEL - 1) / RL_BF16_PANEL, 2);
}

int64_t rl_bf16_packed_size(int64_t k, int64_t n) {
    return panel_count(n) * round_up(k, KP_ALIGN) * RL_BF16_PANEL;
}

/* One row pair of a panel: d[2 jj] = op(b)[i][j0 + jj], d[2 jj + 1] = op(b)[i + 1][j0 + jj],
 * with r0, r1 those rows' first elements (NULL: a row past k), elements step apart, w valid
 * columns. The common case (whole panel, rows contiguous) is one vector pass. */
RL_TARGET_BASE static void pack_pair(uint16_t *d, const float *r0, const float *r1, int64_t step,
                                     int64_t w) {
    if (r0 && r1 && step == 1 && w == RL_BF16_PANEL) {
        uint32_t two[RL_BF16_PANEL];
        for (int jj = 0; jj < RL_BF16_PANEL; jj++)
            two[jj] = (uint32_t)rl_f32_to_bf16(r0[jj]) | (uint32_t)rl_f32_to_bf16(r1[jj]) << 16;
        memcpy(d, two, sizeof two);
        return;
    }
    for (int64_t jj = 0; jj < RL_BF16_PANEL; jj++) {
        d[2 * jj] = r0 && jj < w ? rl_f32_to_bf16(r0[jj * step]) : 0;
        d[2 * jj + 1] = r1 && jj < w ? rl_f32_to_bf16(r1[jj * step]) : 0;
    }
}

/* Transposed operands (the backward products' W^T and X^T) are read across their rows: one
 * element at a time, such a pass took more time than the AMX products it feeds (ptb_large in
 * bf16: packing and rounding 36% of the samples, the products 29%). On CPUs with AVX-512 a block
 * of 16 source rows is read a vector a row, rounded, and turned into 16 output rows by a 16 x 16
 * transpose of 32-bit lanes; the bits are those of rl_f32_to_bf16 element by element. A forced
 * RL_BF16_LEVEL=generic keeps the element loops (the tests compare the two). */
#ifdef RL_CPU_X86
/* rl_f32_to_bf16 of 16 floats, each in the low half of its 32-bit lane */
RL_TARGET_BF16 static inline __m512i round_lanes(const float *x) {
    __m512i u = _mm512_loadu_si512(x);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(nan, r, quiet);
}

/* r[i] lane l <- r[l] lane i */
RL_TARGET_BF16 static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
    }
}

/* 16 row pairs (32 rows of op(b) = b^T) of one whole panel: b points at op(b)[i][j0], i even;
 * a row of b gives 16 pairs (32-bit words), the transpose puts each pair in its row pair */
RL_TARGET_BF16 static void pack_block_trans(uint16_t *d, const float *b, int64_t ldb) {
    __m512i r[16];
    for (int jj = 0; jj < 16; jj++) {
        const float *row = b + jj * ldb;
        __m256i lo = _mm512_cvtepi32_epi16(round_lanes(row));
        __m256i hi = _mm512_cvtepi32_epi16(round_lanes(row + 16));
        r[jj] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    transpose16(r);
    for (int q = 0; q < 16; q++)
        _mm512_storeu_si512(d + q * 2 * RL_BF16_PANEL, r[q]);
}

/* one row pair of a whole panel from bf16 rows (an operand rounded beforehand) */
RL_TARGET_BF16 static void pack_pair16_vec(uint16_t *d, const uint16_t *r0, const uint16_t *r1) {
    __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)r0));
    __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)r1));
    _mm512_storeu_si512(d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}

/* one row pair of a whole panel, rows r0 and r1 contiguous: pack_pair's common case */
RL_TARGET_BF16 static void pack_pair_vec(uint16_t *d, const float *r0, const float *r1) {
    __m512i w = _mm512_or_si512(round_lanes(r0), _mm512_slli_epi32(round_lanes(r1), 16));
    _mm512_storeu_si512(d, w);
}

/* dst rows i..i+15, columns l..l+15 of op(a) = a^T: a points at a[l][i] */
RL_TARGET_BF16 static void round_block_trans(uint16_t *dst, int64_t kp, const float *a,
                                             int64_t lda) {
    __m512i r[16];
    for (int l = 0; l < 16; l++)
        r[l] = round_lanes(a + l * lda);
    transpose16(r);
    for (int i = 0; i < 16; i++)
        _mm256_storeu_si256((__m256i *)(dst + i * kp), _mm512_cvtepi32_epi16(r[i]));
}
#endif

/* whether the passes take the vector code above */
static bool vector_passes(void) {
#ifdef RL_CPU_X86
    return rl_bf16_level_get() != RL_BF16_GENERIC;
#else
    return false;
#endif
}

/* Rows in blocks of PACK_ROWS, so that a block's source rows stay in the cache and TLB while
 * it is written into every panel, 2 KB at a time. */
#define PACK_ROWS 64

/* pack_pair from bf16 rows (r1 NULL: a row past k) */
static void pack_pair16(uint16_t *d, const uint16_t *r0, const uint16_t *r1, int64_t w) {
    for (int64_t jj = 0; jj < RL_BF16_PANEL; jj++) {
        d[2 * jj] = jj < w ? r0[jj] : 0;
        d[2 * jj + 1] = r1 && jj < w ? r1[jj] : 0;
    }
}

/* A matrix operand: float32 (f, op(f) its transpose with trans) or bf16 already rounded (h,
 * never transposed), rows ld elements apart. */
typedef struct {
    const float *f;
    const uint16_t *h;
    int64_t ld;
    bool trans;
} operand;

/* the operand from row (or column, of op(x)) r0 of op(x) and column c0 on */
static operand offset(operand x, int64_t r0, int64_t c0) {
    if (x.h)
        x.h += r0 * x.ld + c0;
    else
        x.f += x.trans ? c0 * x.ld + r0 : r0 * x.ld + c0;
    return x;
}

/* panels [p0, p1) of the pack of op(B) (k x n) */
static void pack_panels(uint16_t *dst, operand B, int64_t k, int64_t n, int64_t p0, int64_t p1) {
    int64_t kp = round_up(k, KP_ALIGN), ldb = B.ld;
    bool trans = B.trans;
    const float *b = B.f;
    int64_t step = trans ? ldb : 1;
    bool vec = vector_passes();
    for (int64_t i0 = 0; i0 < kp; i0 += PACK_ROWS)
        for (int64_t p = p0; p < p1; p++) {
            int64_t j0 = p * RL_BF16_PANEL, w = n - j0 < RL_BF16_PANEL ? n - j0 : RL_BF16_PANEL;
            if (w < 0) w = 0;
            int64_t i1 = i0 + PACK_ROWS < kp ? i0 + PACK_ROWS : kp;
            int64_t i = i0;
            if (B.h) {
                const uint16_t *h = B.h + j0;
#ifdef RL_CPU_X86
                if (vec && w == RL_BF16_PANEL)
                    for (; i + 2 <= i1 && i + 2 <= k; i += 2)
                        pack_pair16_vec(dst + (p * kp + i) * RL_BF16_PANEL, h + i * ldb,
                                        h + (i + 1) * ldb);
#endif
                for (; i < i1 && i < k && w > 0; i += 2)
                    pack_pair16(dst + (p * kp + i) * RL_BF16_PANEL, h + i * ldb,
                                i + 1 < k ? h + (i + 1) * ldb : NULL, w);
            }
#ifdef RL_CPU_X86
            if (vec && !B.h && trans && w == RL_BF16_PANEL)
                for (; i + 32 <= i1 && i + 32 <= k; i += 32)
                    pack_block_trans(dst + (p * kp + i) * RL_BF16_PANEL, b + j0 * ldb + i, ldb);
            if (vec && !B.h && !trans && w == RL_BF16_PANEL)
                for (; i + 2 <= i1 && i + 2 <= k; i += 2)
                    pack_pair_vec(dst + (p * kp + i) * RL_BF16_PANEL, b + i * ldb + j0,
                                  b + (i + 1) * ldb + j0);
#else
            (void)vec;
#endif
            for (; !B.h && i < i1 && i < k && w > 0; i += 2) {
                const float *r0 = b + (trans ? j0 * ldb + i : i * ldb + j0);
                const float *r1 = i + 1 < k ? (trans ? r0 + 1 : r0 + ldb) : NULL;
                pack_pair(dst + (p * kp + i) * RL_BF16_PANEL, r0, r1, step, w);
            }
            /* k's padding (ptb_small's 200 -> 224: a tenth of the rows) and panels past n */
            if (i < i1)
                memset(dst + (p * kp + i) * RL_BF16_PANEL, 0,
                       sizeof(uint16_t) * (size_t)((i1 - i) * RL_BF16_PANEL));
        }
}

typedef struct {
    uint16_t *dst;
    operand b;
    int64_t k, n;
} pack_job;

static void pack_part(void *ctx, int part, int parts) {
    const pack_job *j = ctx;
    int64_t panels = panel_count(j->n);
    pack_panels(j->dst, j->b, j->k, j->n, panels * part / parts, panels * (part + 1) / parts);
}

static void pack_operand(uint16_t *dst, operand b, int64_t k, int64_t n) {
    pack_job j = {dst, b, k, n};
    int parts = rl_cpu_pass_parts(k * n, panel_count(n));
    if (parts > 1)
        rl_cpu_parallel(parts, pack_part, &j);
    else
        pack_part(&j, 0, 1);
}

void rl_bf16_pack(uint16_t *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n) {
    pack_operand(dst, (operand){.f = b, .ld = ldb, .trans = trans}, k, n);
}

#ifdef RL_CPU_X86
/* one row of op(a) = a: k elements rounded, 16 at a time */
RL_TARGET_BF16 static int64_t round_row_vec(uint16_t *d, const float *a, int64_t k) {
    int64_t l = 0;
    for (; l + 16 <= k; l += 16)
        _mm256_storeu_si256((__m256i *)(d + l), _mm512_cvtepi32_epi16(round_lanes(a + l)));
    return l;
}
#endif

/* Rows [r0, r1) (multiples of 16, r1 <= mp) of op(a) (m x k) rounded into dst (mp x kp), zeros
 * in the padding */
RL_TARGET_BASE static void round_rows(uint16_t *dst, bool trans, int64_t m, int64_t k,
                                      const float *a, int64_t lda, int64_t kp, int64_t r0,
                                      int64_t r1) {
    int64_t rows = r0, cols = 0; /* op(a)'s rows and columns done by vector blocks */
    bool vec = vector_passes();
#ifndef RL_CPU_X86
    (void)vec; /* the vector passes are x86's */
#else
    if (trans && vec) {
        rows = m / 16 * 16 < r1 ? m / 16 * 16 : r1;
        cols = k / 16 * 16;
        /* 16 source rows at a time, read from start to end (the destination, at most
         * SCRATCH_BYTES, stays in the cache) */
        for (int64_t l = 0; l < cols; l += 16)
            for (int64_t i = r0; i < rows; i += 16)
                round_block_trans(dst + i * kp + l, kp, a + l * lda + i, lda);
    }
#endif
    for (int64_t i = r0; i < r1; i++) {
        uint16_t *d = dst + i * kp;
        if (i >= m) {
            memset(d, 0, sizeof(uint16_t) * (size_t)kp);
            continue;
        }
        int64_t l = 0;
        if (trans) {
            for (l = i < rows ? cols : 0; l < k; l++)
                d[l] = rl_f32_to_bf16(a[l * lda + i]);
        } else {
#ifdef RL_CPU_X86
            if (vec) l = round_row_vec(d, a + i * lda, k);
#endif
            for (; l < k; l++)
                d[l] = rl_f32_to_bf16(a[i * lda + l]);
        }
        memset(d + k, 0, sizeof(uint16_t) * (size_t)(kp - k));
    }
}

typedef struct {
    uint16_t *dst;
    bool trans;
    int64_t m, k, lda, mp, kp;
    const float *a;
} round_job;

static void round_part(void *ctx, int part, int parts) {
    const round_job *j = ctx;
    int64_t blocks = j->mp / 16;
    round_rows(j->dst, j->trans, j->m, j->k, j->a, j->lda, j->kp, blocks * part / parts * 16,
               blocks * (part + 1) / parts * 16);
}

/* op(a) (m x k) rounded into dst (mp x kp, mp a multiple of 16), zeros in the padding */
static void round_a(uint16_t *dst, bool trans, int64_t m, int64_t k, const float *a, int64_t lda,
                    int64_t mp, int64_t kp) {
    round_job j = {dst, trans, m, k, lda, mp, kp, a};
    int parts = rl_cpu_pass_parts(m * k, mp / 16);
    if (parts > 1)
        rl_cpu_parallel(parts, round_part, &j);
    else
        round_part(&j, 0, 1);
}

/* ---- kernels: rows [r0, r1) and panels [p0, p1) (p0, p1 even) of C ---- */

typedef struct {
    int64_t m, n, k, kp, ldc;
    int64_t lda; /* the rounded op(A)'s rows: kp apart in the scratch, or the caller's */
    int64_t kb;  /* > 0: k summed in blocks of kb, each added to C (k_block) */
    float alpha, beta;
    const uint16_t *a, *b;
    float *c;
    rl_bf16_level level; /* read once per call: every part runs the same kernel */
    bool by_cols;        /* parts get pairs of panels (else blocks of ROW_BLOCK rows) */
    int64_t units;
    /* by columns only: op(B) unpacked (b unused: b_src.f or .h set), packed a pair of panels at
     * a time by the part that multiplies it, into part * 2 kp x RL_BF16_PANEL elements of pairs */
    operand b_src;
    uint16_t *pairs;
} job;

static inline float out_value(float acc, float alpha, float beta, const float *c) {
    return beta != 0.0f ? alpha * acc + beta * *c : alpha * acc;
}

#define GEN_ROWS 4

RL_TARGET_BASE static void part_generic(const job *j, int64_t r0, int64_t r1, int64_t p0,
                                        int64_t p1) {
    int64_t pairs = (j->k + 1) / 2;
    for (int64_t p = p0; p < p1; p++) {
        const uint16_t *bp = j->b + p * j->kp * RL_BF16_PANEL;
        int64_t c0 = p * RL_BF16_PANEL, w = j->n - c0 < RL_BF16_PANEL ? j->n - c0 : RL_BF16_PANEL;
        if (w <= 0) break;
        for (int64_t i0 = r0; i0 < r1; i0 += GEN_ROWS) {
            int64_t rows = r1 - i0 < GEN_ROWS ? r1 - i0 : GEN_ROWS;
            float acc[GEN_ROWS][RL_BF16_PANEL] = {{0}};
            /* one row at a time: with the rows innermost, GCC 12 at -O2 vectorised the row loop
             * into loads past the last row of the rounded A (a fault at its end) */
            for (int64_t i = 0; i < rows; i++) {
                const uint16_t *ar = j->a + (i0 + i) * j->lda;
                for (int64_t r = 0; r < pairs; r++) {
                    const uint16_t *br = bp + r * 2 * RL_BF16_PANEL;
                    float a0 = rl_bf16_to_f32(ar[2 * r]), a1 = rl_bf16_to_f32(ar[2 * r + 1]);
                    for (int jj = 0; jj < RL_BF16_PANEL; jj++)
                        acc[i][jj] +=
                            a0 * rl_bf16_to_f32(br[2 * jj]) + a1 * rl_bf16_to_f32(br[2 * jj + 1]);
                }
            }
            for (int64_t i = 0; i < rows; i++) {
                float *cr = j->c + (i0 + i) * j->ldc + c0;
                for (int64_t jj = 0; jj < w; jj++)
                    cr[jj] = out_value(acc[i][jj], j->alpha, j->beta, cr + jj);
            }
        }
    }
}

#ifdef RL_CPU_X86
/* C's columns [c0, c0 + w) (w <= 32) of one row from two accumulators */
RL_TARGET_BF16 static inline void store_row(float *c, int64_t w, __m512 lo, __m512 hi, float alpha,
                                            float beta) {
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
    __m512 va = _mm512_set1_ps(alpha);
    lo = _mm512_mul_ps(va, lo);
    hi = _mm512_mul_ps(va, hi);
    if (beta != 0.0f) {
        __m512 vb = _mm512_set1_ps(beta);
        lo = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), lo);
        hi = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), hi);
    }
    _mm512_mask_storeu_ps(c, m0, lo);
    _mm512_mask_storeu_ps(c + 16, m1, hi);
}

/* mr (1..8) rows x two panels; a at the first row (rows lda apart), b at the first panel (panels
 * kp apart) */
RL_TARGET_BF16 static inline __attribute__((always_inline)) void
tile_avx512(int mr, int64_t pairs, int64_t kp, int64_t lda, const uint16_t *a, const uint16_t *b,
            float *c, int64_t ldc, int64_t w, float alpha, float beta) {
    __m512 acc[8][2];
    for (int i = 0; i < mr; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const uint16_t *b1 = b + kp * RL_BF16_PANEL;
    for (int64_t r = 0; r < pairs; r++) {
        __m512bh vb0 = (__m512bh)_mm512_loadu_si512(b + r * 2 * RL_BF16_PANEL);
        __m512bh vb1 = (__m512bh)_mm512_loadu_si512(b1 + r * 2 * RL_BF16_PANEL);
        for (int i = 0; i < mr; i++) {
            int32_t two;
            memcpy(&two, a + i * lda + 2 * r, sizeof two);
            __m512bh va = (__m512bh)_mm512_set1_epi32(two);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], va, vb0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], va, vb1);
        }
    }
    for (int i = 0; i < mr; i++)
        store_row(c + i * ldc, w, acc[i][0], acc[i][1], alpha, beta);
}

/* Panels of a wide tile: a product of one or two rows (a recurrent step at batch 1-2) is bound
 * by reading the packed weights from L3, each panel a separate stream. tile_avx512's 2 panels
 * leave too few vdpbf16ps chains in flight, 8 streams too many: on a Zen 4, one thread, a batch-1
 * step of U 512 x 2048 / 768 x 3072 read 80-81 / 82-83 GB/s with 6 panels, 78 / 77 with 8, 80 /
 * 82 with 4 (257 x 1028, in L2: 98, 98, 95); two rows 76-79 / 80 with 6, 77-78 / 79 with 4.
 * Where a part's panels exceed one core's L2 (WIDE_L2), each stream is also prefetched into L1
 * WIDE_PREFETCH row pairs (256 bytes) ahead: 84 / 86 GB/s (8 ahead 82-83 / 85, 16 ahead 81 /
 * 80); from L2 that cost 2% (257 x 1028: 96 against 98; a batch-1 training step of tiny1). */
#define WIDE_PANELS 6
#define WIDE_PREFETCH 4
#define WIDE_L2 ((int64_t)1 << 20)

/* mr (1..2) rows x WIDE_PANELS panels: each column's sum in tile_avx512's order (so a row has
 * the same bits whatever the rows around it), with one accumulator a panel and row; pf:
 * prefetch the panels. */
RL_TARGET_BF16 static inline __attribute__((always_inline)) void
tile_wide_avx512(int mr, bool pf, int64_t pairs, int64_t kp, int64_t lda, const uint16_t *a,
                 const uint16_t *b, float *c, int64_t ldc, int64_t w, float alpha, float beta) {
    enum { np = WIDE_PANELS };
    __m512 acc[2][WIDE_PANELS];
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < np; q++)
            acc[i][q] = _mm512_setzero_ps();
    for (int64_t r = 0; r < pairs; r++) {
        __m512bh va[2];
        for (int i = 0; i < mr; i++) {
            int32_t two;
            memcpy(&two, a + i * lda + 2 * r, sizeof two);
            va[i] = (__m512bh)_mm512_set1_epi32(two);
        }
        for (int q = 0; q < np; q++) {
            if (pf)
                _mm_prefetch((const char *)(b + (q * kp + (r + WIDE_PREFETCH) * 2) * RL_BF16_PANEL),
                             _MM_HINT_T0);
            __m512bh vb = (__m512bh)_mm512_loadu_si512(b + (q * kp + r * 2) * RL_BF16_PANEL);
            for (int i = 0; i < mr; i++)
                acc[i][q] = _mm512_dpbf16_ps(acc[i][q], va[i], vb);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < np && w - 16 * q > 0; q += 2)
            store_row(c + i * ldc + 16 * q, w - 16 * q, acc[i][q], acc[i][q + 1], alpha, beta);
}

RL_TARGET_BF16 static void part_avx512(const job *j, int64_t r0, int64_t r1, int64_t p0,
                                       int64_t p1) {
    int64_t pairs = (j->k + 1) / 2, kp = j->kp, lda = j->lda;
    if (r1 - r0 <= 2) {
        bool pf = (p1 - p0) * kp * RL_BF16_PANEL * (int64_t)sizeof(uint16_t) > WIDE_L2;
        for (; p0 + WIDE_PANELS <= p1; p0 += WIDE_PANELS) {
            int64_t c0 = p0 * RL_BF16_PANEL, w = j->n - c0;
            if (w <= 0) return;
            const uint16_t *bp = j->b + p0 * kp * RL_BF16_PANEL, *ai = j->a + r0 * lda;
            float *ci = j->c + r0 * j->ldc + c0;
            float al = j->alpha, be = j->beta;
            if (r1 - r0 == 1 && pf)
                tile_wide_avx512(1, true, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be);
            else if (r1 - r0 == 1)
                tile_wide_avx512(1, false, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be);
            else if (pf)
                tile_wide_avx512(2, true, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be);
            else
                tile_wide_avx512(2, false, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be);
        }
    }
    for (int64_t p = p0; p < p1; p += 2) {
        const uint16_t *bp = j->b + p * kp * RL_BF16_PANEL;
        int64_t c0 = p * RL_BF16_PANEL, w = j->n - c0 < 32 ? j->n - c0 : 32;
        if (w <= 0) break;
        for (int64_t i = r0; i < r1; i += 8) {
            const uint16_t *ai = j->a + i * lda;
            float *ci = j->c + i * j->ldc + c0;
            float al = j->alpha, be = j->beta;
            switch (r1 - i < 8 ? r1 - i : 8) {
            case 1: tile_avx512(1, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 2: tile_avx512(2, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 3: tile_avx512(3, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 4: tile_avx512(4, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 5: tile_avx512(5, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 6: tile_avx512(6, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            case 7: tile_avx512(7, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            default: tile_avx512(8, pairs, kp, lda, ai, bp, ci, j->ldc, w, al, be); break;
            }
        }
    }
}

/* The tile configuration (palette 1): every tile 16 rows of 64 bytes. Tiles 0-3 hold a 32 x 32
 * block of C (2 x 2 tiles of 16 x 16 float32), 4-5 two A tiles (16 rows x 32 bf16), 6-7 two B
 * tiles (16 row pairs x 16 columns x 2). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

RL_TARGET_AMX static void part_amx(const job *j, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    float blk[32 * 32] __attribute__((aligned(64)));
    /* kp: the panels' stride; a block of k (rl_gemm_bf16_packed) may end before it */
    int64_t kp = j->kp, kend = round_up(j->k, KP_ALIGN),
            a_stride = j->lda * (int64_t)sizeof(uint16_t);
    for (int64_t p = p0; p < p1; p += 2) {
        const uint16_t *bp = j->b + p * kp * RL_BF16_PANEL;
        int64_t c0 = p * RL_BF16_PANEL, w = j->n - c0 < 32 ? j->n - c0 : 32;
        if (w <= 0) break;
        for (int64_t i = r0; i < r1; i += 32) {
            bool two_rows = r1 - i > 16;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t kb = 0; kb < kend; kb += KP_ALIGN) {
                const uint16_t *ak = j->a + i * j->lda + kb, *bk = bp + kb * RL_BF16_PANEL;
                _tile_loadd(4, ak, a_stride);
                _tile_loadd(6, bk, 64);
                _tile_loadd(7, bk + kp * RL_BF16_PANEL, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (two_rows) {
                    _tile_loadd(5, ak + 16 * j->lda, a_stride);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, blk, 128);
            _tile_stored(1, blk + 16, 128);
            if (two_rows) {
                _tile_stored(2, blk + 16 * 32, 128);
                _tile_stored(3, blk + 16 * 32 + 16, 128);
            }
            int64_t rows = r1 - i < 32 ? r1 - i : 32;
            for (int64_t r = 0; r < rows; r++)
                store_row(j->c + (i + r) * j->ldc + c0, w, _mm512_load_ps(blk + 32 * r),
                          _mm512_load_ps(blk + 32 * r + 16), j->alpha, j->beta);
        }
    }
    _tile_release();
}
#endif

static void level_kernel(const job *j, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
#ifdef RL_CPU_X86
    if (j->level == RL_BF16_AMX) {
        part_amx(j, r0, r1, p0, p1);
        return;
    }
    if (j->level == RL_BF16_AVX512BF16) {
        part_avx512(j, r0, r1, p0, p1);
        return;
    }
#endif
    part_generic(j, r0, r1, p0, p1);
}

/* A part of the product; with kb, over blocks of k, within the part: a product with a kept pack
 * sums as rl_gemm_bf16 does (k_block), with no hand-off between threads per block (a recurrent
 * step of batch 1 with U 768 x 3072 splits its k in two). */
static void run_level(const job *j, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    if (j->kb <= 0 || j->kb >= j->k) {
        level_kernel(j, r0, r1, p0, p1);
        return;
    }
    for (int64_t k0 = 0; k0 < j->k; k0 += j->kb) {
        job jk = *j;
        jk.k = j->k - k0 < j->kb ? j->k - k0 : j->kb;
        jk.a = j->a + k0;
        jk.b = j->b + k0 * RL_BF16_PANEL;
        if (k0) jk.beta = 1.0f;
        level_kernel(&jk, r0, r1, p0, p1);
    }
}

static void run_part(void *ctx, int part, int parts) {
    const job *j = ctx;
    int64_t u0 = j->units * part / parts, u1 = j->units * (part + 1) / parts;
    if (u0 >= u1) return;
    int64_t panels = panel_count(j->n), r0 = 0, r1 = j->m, p0 = 0, p1 = panels;
    if (j->by_cols) {
        p0 = 2 * u0;
        p1 = 2 * u1;
    } else {
        r0 = u0 * ROW_BLOCK;
        r1 = u1 * ROW_BLOCK < j->m ? u1 * ROW_BLOCK : j->m;
    }
    if (!j->b_src.f && !j->b_src.h) {
        run_level(j, r0, r1, p0, p1);
        return;
    }
    /* the pair is packed where it is multiplied, while it is in this core's cache */
    uint16_t *pair = j->pairs + (size_t)part * (size_t)(2 * j->kp * RL_BF16_PANEL);
    for (int64_t p = p0; p < p1; p += 2) {
        int64_t c0 = p * RL_BF16_PANEL, w = j->n - c0 < 32 ? j->n - c0 : 32;
        if (w <= 0) break;
        pack_panels(pair, offset(j->b_src, 0, c0), j->k, w, 0, 2);
        job jp = *j;
        jp.b = pair;
        jp.c = j->c + c0;
        jp.n = w;
        run_level(&jp, r0, r1, 0, 2);
    }
}

/* One call's scratch is one per-thread buffer: the rounded op(A), and beside it the packed op(B)
 * or each part's pair of panels (a call needs both at once, and the largest of each come from
 * different calls: one buffer holds the largest pair, not the largest of each). Each operand's
 * part stays under SCRATCH_BYTES (twice that for op(B) in rl_gemm_bf16's one case): a longer
 * op(A) is rounded and multiplied in blocks of rows, a wider packed op(B) in blocks of columns,
 * as few blocks as that allows and of equal size, so that none is a sliver and the buffer no
 * larger than they need. Rows and columns of C are independent sums, so the blocks give the
 * bits of one whole product. */
#define SCRATCH_BYTES ((int64_t)2 << 20)

/* rows of op(A) (a multiple of ROW_BLOCK) or columns of op(B) (of 2 panels) per block, at most */
static int64_t block_of(int64_t kp, int64_t align) {
    /* k = 0: an empty sum, any block does */
    int64_t b =
        SCRATCH_BYTES / (int64_t)sizeof(uint16_t) / (kp > 0 ? kp : KP_ALIGN) / align * align;
    return b > align ? b : align;
}

/* the size of as few equal blocks of total (each a multiple of align, max one) as cover it */
static int64_t even_block(int64_t total, int64_t max, int64_t align) {
    if (total <= max) return total;
    int64_t blocks = (total + max - 1) / max;
    return round_up((total + blocks - 1) / blocks, align);
}

/* The job of c (m x n) = alpha * ra * packed + beta * c, ra rounded (mp x kp), and how many
 * parts share it */
static job plan(int64_t m, int64_t n, int64_t k, int64_t kp, float alpha, const uint16_t *ra,
                const uint16_t *packed, float beta, float *c, int64_t ldc, int *parts) {
    job j = {.m = m,
             .n = n,
             .k = k,
             .kp = kp,
             .ldc = ldc,
             .alpha = alpha,
             .beta = beta,
             .lda = kp,
             .a = ra,
             .b = packed,
             .c = c,
             .level = rl_bf16_level_get()};
    int64_t col_units = panel_count(n) / 2, row_units = (m + ROW_BLOCK - 1) / ROW_BLOCK;
    j.by_cols = col_units >= row_units;
    j.units = j.by_cols ? col_units : row_units;
    int threads = rl_blas_get_threads();
    /* parts of at least 0.25 MFLOP: a recurrent step of batch 1-3 (an LSTM 257's U, 0.5
     * MFLOP a row) is shared by two threads, which each keep their half of the packed U in
     * cache (tiny1 and tiny3 in bf16 on a Zen 4, 2 threads: 19-20 and 35-38 ms a step, where
     * parts of at least 1 MFLOP give 24-29 and 41-43; seqmnist the same either way) */
    *parts = threads < j.units ? threads : (int)j.units;
    double flop = 2.0 * (double)m * (double)n * (double)k;
    if (*parts > flop / 2.5e5) *parts = (int)(flop / 2.5e5);
    if (*parts < 1) *parts = 1;
    return j;
}

static void run(job *j, int parts) {
    if (parts > 1)
        rl_cpu_parallel(parts, run_part, j);
    else
        run_part(j, 0, 1);
}

/* c (m x n) = alpha * ra * packed + beta * c, ra's rounded rows lda apart */
static void run_rounded(int64_t m, int64_t n, int64_t k, int64_t kp, int64_t kb, float alpha,
                        const uint16_t *ra, int64_t lda, const uint16_t *packed, float beta,
                        float *c, int64_t ldc) {
    int parts;
    job j = plan(m, n, k, kp, alpha, ra, packed, beta, c, ldc, &parts);
    j.lda = lda;
    j.kb = kb;
    run(&j, parts);
}

/* c = alpha * op(A) * packed + beta * c, packed's panels kp apart, k summed in blocks of kb
 * (0: whole): a rounded op(A) at once, a float32 one rounded into ra in blocks of `rows` */
static void run_blocks(operand A, int64_t m, int64_t n, int64_t k, int64_t kp, int64_t kb,
                       int64_t rows, float alpha, uint16_t *ra, const uint16_t *packed, float beta,
                       float *c, int64_t ldc) {
    if (A.h) {
        run_rounded(m, n, k, kp, kb, alpha, A.h, A.ld, packed, beta, c, ldc);
        return;
    }
    for (int64_t i0 = 0; i0 < m; i0 += rows) {
        int64_t mi = m - i0 < rows ? m - i0 : rows;
        round_a(ra, A.trans, mi, k, offset(A, i0, 0).f, A.ld, round_up(mi, MP_ALIGN), kp);
        run_rounded(mi, n, k, kp, kb, alpha, ra, kp, packed, beta, c + i0 * ldc, ldc);
    }
}

static int64_t k_block(int64_t k, int64_t n);

/* c = alpha * op(A) * packed + beta * c, summed over the blocks of k that rl_gemm_bf16 takes */
static rl_status packed_product(operand A, int64_t m, int64_t n, int64_t k, float alpha,
                                const uint16_t *packed, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    int64_t kp = round_up(k, KP_ALIGN), kb = k_block(k, n);
    int64_t rows = A.h ? 0 : even_block(m, block_of(kp, ROW_BLOCK), ROW_BLOCK);
    uint16_t *ra = NULL;
    if (!A.h) {
        ra = rl_thread_scratch(RL_SCRATCH_BF16,
                               sizeof(uint16_t) * (size_t)(round_up(rows, MP_ALIGN) * kp),
                               "bf16 gemm: the rounded left operand");
        if (!ra) return RL_ENOMEM;
    }
    run_blocks(A, m, n, k, kp, kb, rows, alpha, ra, packed, beta, c, ldc);
    return RL_OK;
}

rl_status rl_gemm_bf16_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const uint16_t *packed, float beta,
                              float *c, int64_t ldc) {
    return packed_product((operand){.f = a, .ld = lda, .trans = trans_a}, m, n, k, alpha, packed,
                          beta, c, ldc);
}

/* c = alpha * op(A) * op(B) + beta * c, its k in one pass */
static rl_status gemm_whole_k(operand A, operand B, int64_t m, int64_t n, int64_t k, float alpha,
                              float beta, float *c, int64_t ldc) {
    int64_t kp = round_up(k, KP_ALIGN);
    int64_t cols = block_of(kp, 2 * RL_BF16_PANEL), rows = block_of(kp, ROW_BLOCK);
    if (A.h ? rl_bf16_packed_size(k, n) <= 2 * SCRATCH_BYTES / (int64_t)sizeof(uint16_t)
            : m <= rows) {
        /* An op(A) that fits one block of rows is rounded once (a rounded one is used as it
         * is). Where parts get pairs of panels (a weight gradient: X^T against dY, k = T x B),
         * each part packs its pairs one at a time, just before it multiplies them, into a pair
         * of panels of its own: the whole op(B) is never packed (seqmnist's H^T dG: 1.8 MB),
         * and a pair is multiplied while it is still in the core's cache. */
        int parts;
        job j = plan(m, n, k, kp, alpha, NULL, NULL, beta, c, ldc, &parts);
        /* a multiple of 512: pairs stay aligned */
        int64_t a_elems = A.h ? 0 : round_up(m, MP_ALIGN) * kp;
        /* op(B) whole: n < m, under 2 MB with a float32 op(A), under 4 MB with a rounded one */
        int64_t pb_elems = j.by_cols ? parts * 2 * kp * RL_BF16_PANEL : rl_bf16_packed_size(k, n);
        uint16_t *ra =
            rl_thread_scratch(RL_SCRATCH_BF16, sizeof(uint16_t) * (size_t)(a_elems + pb_elems),
                              "bf16 gemm: the rounded and packed operands");
        if (!ra) return RL_ENOMEM;
        if (A.h) {
            j.a = A.h;
            j.lda = A.ld;
        } else {
            round_a(ra, A.trans, m, k, A.f, A.ld, round_up(m, MP_ALIGN), kp);
            j.a = ra;
        }
        if (j.by_cols) {
            j.b_src = B;
            j.pairs = ra + a_elems;
        } else {
            pack_operand(ra + a_elems, B, k, n);
            j.b = ra + a_elems;
        }
        run(&j, parts);
        return RL_OK;
    }
    /* A longer op(A) is rounded in blocks of rows, again for every block of columns of the
     * packed op(B), so the blocks of columns may be twice as wide as SCRATCH_BYTES allows
     * (rl_gemm_bf16 splits k so that one block of columns holds them all where it can).
     * Packing op(B) again for every block of rows instead would read it once per block. */
    cols = even_block(n, 2 * cols, 2 * RL_BF16_PANEL);
    rows = A.h ? 0 : even_block(m, rows, ROW_BLOCK);
    int64_t pb_elems = rl_bf16_packed_size(k, cols); /* a multiple of 1024: ra stays aligned */
    uint16_t *pb = rl_thread_scratch(
        RL_SCRATCH_BF16, sizeof(uint16_t) * (size_t)(pb_elems + round_up(rows, MP_ALIGN) * kp),
        "bf16 gemm: the rounded and packed operands");
    if (!pb) return RL_ENOMEM;
    for (int64_t j0 = 0; j0 < n; j0 += cols) {
        int64_t nj = n - j0 < cols ? n - j0 : cols;
        pack_operand(pb, offset(B, 0, j0), k, nj);
        run_blocks(A, m, nj, k, kp, 0, rows, alpha, pb + pb_elems, pb, beta, c + j0, ldc);
    }
    return RL_OK;
}

/* The sums' length at most, of a product with a long k whose op(B) packed whole would pass
 * twice SCRATCH_BYTES (the backward of a 10000-class output, dY W^T, k = 10000 against 200 or
 * 650 columns; a weight gradient over 4000 frames). In one pass over k, op(B) would be packed in
 * blocks of columns and op(A) rounded again for each (ptb_large's dY four times, chime's X^T four
 * times); split into blocks of k whose packed op(B) fits, each operand is rounded once, and each
 * block's C is added to the last. The split depends on k and n alone, so that a row's bits stay
 * those it has in any other product of the same k and n, a kept pack's (rl_gemm_bf16_packed)
 * included. Sums of at most K_SPLIT_MIN are never split: a recurrent or input weight is
 * multiplied whole (a batch-1 step of U 768 x 3072 split in two took 7-9% longer, 2 threads on a
 * Zen 4); nor into blocks below K_BLOCK_MIN (n > 4000: more passes over C than it saves). */
#define K_SPLIT_MIN 2048
#define K_BLOCK_MIN 512

static int64_t k_block(int64_t k, int64_t n) {
    int64_t cols = panel_count(n) * RL_BF16_PANEL,
            max_elems = 2 * SCRATCH_BYTES / (int64_t)sizeof(uint16_t);
    if (k <= K_SPLIT_MIN || rl_bf16_packed_size(k, n) <= max_elems) return k;
    int64_t kb = max_elems / cols / KP_ALIGN * KP_ALIGN;
    return kb < K_BLOCK_MIN ? k : even_block(k, kb, KP_ALIGN);
}

static rl_status gemm_split_k(operand A, operand B, int64_t m, int64_t n, int64_t k, float alpha,
                              float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    int64_t kb = k_block(k, n), k0 = 0;
    do { /* k = 0 too: C = beta * C */
        int64_t kk = k - k0 < kb ? k - k0 : kb;
        RL_TRY(gemm_whole_k(offset(A, 0, k0), offset(B, k0, 0), m, n, kk, alpha, k0 ? 1.0f : beta,
                            c, ldc));
        k0 += kb;
    } while (k0 < k);
    return RL_OK;
}

rl_status rl_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc) {
    return gemm_split_k((operand){.f = a, .ld = lda, .trans = trans_a},
                        (operand){.f = b, .ld = ldb, .trans = trans_b}, m, n, k, alpha, beta, c,
                        ldc);
}

int64_t rl_bf16_lhs_stride(int64_t k) { return round_up(k, KP_ALIGN); }

int64_t rl_bf16_lhs_size(int64_t m, int64_t k) {
    return round_up(m, MP_ALIGN) * round_up(k, KP_ALIGN);
}

void rl_bf16_round_lhs(uint16_t *dst, bool trans, int64_t m, int64_t k, const float *a,
                       int64_t lda) {
    round_a(dst, trans, m, k, a, lda, round_up(m, MP_ALIGN), round_up(k, KP_ALIGN));
}

rl_status rl_gemm_bf16_lhs(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *ra,
                           bool trans_b, const float *b, int64_t ldb, float beta, float *c,
                           int64_t ldc) {
    return gemm_split_k((operand){.h = ra, .ld = rl_bf16_lhs_stride(k)},
                        (operand){.f = b, .ld = ldb, .trans = trans_b}, m, n, k, alpha, beta, c,
                        ldc);
}

rl_status rl_gemm_bf16_rhs(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                           float *c, int64_t ldc) {
    return gemm_split_k((operand){.f = a, .ld = lda, .trans = trans_a},
                        (operand){.h = b, .ld = ldb}, m, n, k, alpha, beta, c, ldc);
}

/* ---- a network's context and the kept packs of its weights ---- */

/* The weight operands a network uses (a 3-layer BLSTM and its softmax, forward and backward
 * layouts: 26); past this many the rest are packed per call. */
#define CACHE_SLOTS 64

/* A slot's state. Claimed (SEEN) by one product, whose thread writes its key first; STALE when
 * the weights changed since (the key stays); PACKING by the one product that won its second
 * use (or the first since the weights changed, for a slot used twice before: hot), whose thread
 * alone writes its buffer and hot; READY from then on, read by any. Slots change otherwise only
 * in rl_bf16_ctx_begin, when no product of the network runs. */
enum { FREE = 0, SEEN, STALE, PACKING, READY };

typedef struct {
    _Atomic int state;
    const float *b;
    int64_t ldb, k, n;
    bool trans;
    bool hot;     /* used twice while the weights stayed the same, once */
    void *packed; /* the slot's buffer (bf16 pack or int8 pack), kept for its next key */
    size_t cap;   /* bytes */
} cache_slot;

struct rl_bf16_ctx {
    /* shared by the networks of threads that read one frozen model's parameters */
    atomic_int refs;
    _Atomic bool frozen; /* rl_bf16_ctx_freeze */
    bool int8;           /* rl_bf16_ctx_set_int8: int8 packs and products */
    const char *weights_lo, *weights_hi;
    uint64_t version; /* of the weights' storage when the slots were filled */
    _Atomic int used; /* slots claimed (may pass CACHE_SLOTS: then all are) */
    _Atomic uint64_t packs;
    cache_slot cache[CACHE_SLOTS];
};

static _Thread_local rl_bf16_ctx *active;

rl_bf16_ctx *rl_bf16_active(void) { return active; }

void rl_bf16_activate(rl_bf16_ctx *ctx) { active = ctx; }

rl_bf16_ctx *rl_bf16_ctx_new(void) {
    rl_bf16_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx) atomic_init(&ctx->refs, 1);
    return ctx;
}

void rl_bf16_ctx_hold(rl_bf16_ctx *ctx) {
    if (ctx) atomic_fetch_add(&ctx->refs, 1);
}

void rl_bf16_ctx_freeze(rl_bf16_ctx *ctx) { atomic_store(&ctx->frozen, true); }

void rl_bf16_ctx_set_int8(rl_bf16_ctx *ctx) { ctx->int8 = true; }

bool rl_bf16_ctx_is_int8(const rl_bf16_ctx *ctx) { return ctx->int8; }

void rl_bf16_ctx_free(rl_bf16_ctx *ctx) {
    if (!ctx || atomic_fetch_sub(&ctx->refs, 1) > 1) return;
    for (int i = 0; i < CACHE_SLOTS; i++)
        free(ctx->cache[i].packed);
    free(ctx);
}

void rl_bf16_ctx_begin(rl_bf16_ctx *ctx, const void *weights, size_t bytes, uint64_t version) {
    const char *lo = weights, *hi = lo + bytes;
    /* a frozen context keeps its first weights and their packs for good (other threads read
     * them) */
    if (atomic_load(&ctx->frozen) && ctx->weights_lo) return;
    bool same_range = lo == ctx->weights_lo && hi == ctx->weights_hi;
    if (same_range && version == ctx->version) return;
    ctx->weights_lo = lo;
    ctx->weights_hi = hi;
    ctx->version = version;
    /* every operand is packed again; the buffers stay for the coming ones, and the keys, when
     * the weights are the same tensors */
    if (!same_range) atomic_store(&ctx->used, 0);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cache_slot *c = &ctx->cache[i];
        if (!same_range) c->hot = false;
        atomic_store(&c->state, same_range && atomic_load(&c->state) != FREE ? STALE : FREE);
    }
}

size_t rl_bf16_ctx_bytes(const rl_bf16_ctx *ctx) {
    size_t n = 0;
    for (int i = 0; i < CACHE_SLOTS; i++)
        n += ctx->cache[i].cap;
    return n;
}

uint64_t rl_bf16_ctx_packs(const rl_bf16_ctx *ctx) { return atomic_load(&ctx->packs); }

/* The kept pack of op(b), or NULL: when b is no weight; at the first use of the operand since
 * the weights changed, unless it was used twice under some earlier weights (a weight used
 * once per update, as an input projection's or a softmax's in training, is packed per call, in
 * blocks, and keeps no copy; a recurrent matrix, used at every time step, is kept from its
 * second use under the first weights, from its first use under the next ones; any weight in a
 * second forward of the same weights is kept); while another product packs it; when no slot
 * is left. A frozen context keeps every weight from its first use. Lock-free: the two layers of a
 * concurrent pair look up their packs at once. */
static const void *kept_pack(rl_bf16_ctx *ctx, const float *b, int64_t ldb, bool trans, int64_t k,
                             int64_t n, rl_status *st) {
    const char *lo = (const char *)b;
    int64_t rows = trans ? n : k, cols = trans ? k : n;
    const char *hi = (const char *)(b + (rows - 1) * ldb + cols);
    if (!ctx->weights_lo || lo < ctx->weights_lo || hi > ctx->weights_hi) return NULL;
    int used = atomic_load(&ctx->used);
    if (used > CACHE_SLOTS) used = CACHE_SLOTS;
    cache_slot *s = NULL;
    int state = FREE;
    for (int i = 0; i < used && !s; i++) {
        cache_slot *c = &ctx->cache[i];
        /* the key is written before the state leaves FREE (sequentially consistent atomics) */
        state = atomic_load(&c->state);
        if (state != FREE && c->b == b && c->ldb == ldb && c->trans == trans && c->k == k &&
            c->n == n)
            s = c;
    }
    if (!s) {
        int i = atomic_fetch_add(&ctx->used, 1);
        if (i >= CACHE_SLOTS) return NULL;
        cache_slot *c = &ctx->cache[i];
        c->b = b;
        c->ldb = ldb;
        c->k = k;
        c->n = n;
        c->trans = trans;
        atomic_store(&c->state, SEEN);
        if (!atomic_load(&ctx->frozen)) return NULL;
        s = c; /* frozen: every weight is kept from its first use */
        state = SEEN;
    }
    if (state == READY) return s->packed;
    if (state == STALE) {
        /* its first use since the weights changed */
        int stale = STALE;
        if (!atomic_compare_exchange_strong(&s->state, &stale, PACKING)) return NULL;
        if (!s->hot) {
            atomic_store(&s->state, SEEN);
            return NULL;
        }
    } else {
        int seen = SEEN;
        if (state != SEEN || !atomic_compare_exchange_strong(&s->state, &seen, PACKING))
            return NULL;
    }
    s->hot = true;
    size_t need = ctx->int8 ? rl_int8_packed_bytes(k, n)
                            : sizeof(uint16_t) * (size_t)rl_bf16_packed_size(k, n);
    if (need > s->cap) {
        void *p = realloc(s->packed, need);
        if (!p) {
            atomic_store(&s->state, SEEN);
            *st = rl_error(RL_ENOMEM, "%s gemm: cannot allocate %zu bytes for a packed weight",
                           ctx->int8 ? "int8" : "bf16", need);
            return NULL;
        }
        s->packed = p;
        s->cap = need;
    }
    if (ctx->int8)
        rl_int8_pack(s->packed, b, ldb, trans, k, n);
    else
        rl_bf16_pack(s->packed, b, ldb, trans, k, n);
    atomic_fetch_add(&ctx->packs, 1);
    atomic_store(&s->state, READY);
    return s->packed;
}

/* whether b lies in ctx's weights (a weight operand, packed per call when not kept) */
static bool in_weights(const rl_bf16_ctx *ctx, const float *b) {
    const char *lo = (const char *)b;
    return ctx->weights_lo && lo >= ctx->weights_lo && lo < ctx->weights_hi;
}

rl_status rl_gemm_bf16_ctx(rl_bf16_ctx *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return RL_OK;
    if (k > 0) {
        rl_status st = RL_OK;
        const void *p = kept_pack(ctx, b, ldb, trans_b, k, n, &st);
        if (st != RL_OK) return st;
        /* a kept pack is only replaced at a begin that finds the weights changed, on the
         * network's thread, after every product of the pass has returned */
        if (p && ctx->int8)
            return rl_gemm_int8_packed(trans_a, m, n, k, alpha, a, lda, p, beta, c, ldc);
        if (p) return rl_gemm_bf16_packed(trans_a, m, n, k, alpha, a, lda, p, beta, c, ldc);
        bool weight = in_weights(ctx, b);
        if (weight) atomic_fetch_add(&ctx->packs, 1);
        /* int8 quantizes weights only: a product of two activations stays float32 */
        if (ctx->int8 && weight)
            return rl_gemm_int8(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        if (ctx->int8) {
            rl_blas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            return RL_OK;
        }
    }
    return rl_gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

rl_status rl_gemm_bf16_ctx_lhs(rl_bf16_ctx *ctx, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, bool trans_b, const float *b, int64_t ldb,
                               float beta, float *c, int64_t ldc) {
    if (ctx->int8)
        return rl_error(RL_EARG, "int8 gemm: an operand rounded to bf16 has no int8 product "
                                 "(int8 is for inference)");
    if (m > 0 && n > 0 && k > 0) {
        rl_status st = RL_OK;
        const void *p = kept_pack(ctx, b, ldb, trans_b, k, n, &st);
        if (st != RL_OK) return st;
        if (p)
            return packed_product((operand){.h = a, .ld = rl_bf16_lhs_stride(k)}, m, n, k, alpha, p,
                                  beta, c, ldc);
        if (in_weights(ctx, b)) atomic_fetch_add(&ctx->packs, 1);
    }
    return rl_gemm_bf16_lhs(m, n, k, alpha, a, trans_b, b, ldb, beta, c, ldc);
}
