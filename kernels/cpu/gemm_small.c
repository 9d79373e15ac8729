/* The float32 GEMMs of gemm_small.h: packing, the AVX-512 and AVX2+FMA kernels (picked at run
 * time by kernels/cpu/cpu_level.h), their portable counterpart, and the general product.
 *
 * AVX-512: a tile of up to 8 rows of c by one 48-column panel lives in 24 zmm accumulators;
 * each k loads three panel vectors and broadcasts 8 values of a, i.e. 11 loads for 24 FMAs,
 * so the loop is FMA-bound while the panel streams from L2. Panels are the outer loop so that
 * the row blocks of one panel (B = 16: two) reuse it from cache; the whole packed operand of
 * a 512-unit LSTM (4 MiB) is read once per step.
 *
 * AVX2 has 16 ymm registers: a tile is up to 4 rows by half a panel (24 columns, 12
 * accumulators, 3 panel vectors, 1 broadcast), 7 loads for 12 FMAs. With 4-row tiles a panel
 * is read B/4 times per step, so k is cut into blocks of KC rows (KC x 48 floats, 24 KiB, stay
 * in L1 across the row tiles and both halves); partial sums go through c between blocks, in
 * the same order of k, so the rounding does not depend on the blocking.
 *
 * The general product packs one panel of op(b) at a time (k x 48, kept in L2) and streams all
 * rows of a past it in the same tiles; a transposed a is first copied row-major (or, with few
 * columns, read in place). Each element's sum starts from zero and runs over k in order as one
 * chain of FMAs: a long k goes in blocks whose partial sums are stored and reloaded as the next
 * block's start (a float32 store and load change no bit), and alpha and beta apply after the
 * last. So the AVX-512 and AVX2 tiles give the same bits, those of a scalar fmaf loop, at any
 * row count and thread split (tests/c/test_gemm_f32.c).
 */
#include "gemm_small.h"

#include <string.h>

#include "../../core/blas.h"
#include "cpu_level.h"
#include "gemm_bf16.h"
#include "gemm_neon.h"
#include "parallel.h"
#include "scratch.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define RL_GEMM_X86 1
#include <immintrin.h>
#endif

#define MR 8
#define NR RL_GEMM_PANEL
/* A product of 2..PF_ROWS rows (one row tile per panel) prefetches the panel PF_DIST rows of k
 * ahead into L1: with so few rows a k step has too few FMAs to cover its 192 bytes of panel
 * coming from L2 (a recurrent step's product of 3 rows by an LSTM 257's packed U, 1 MiB: 36 ->
 * 45 GMAC/s on one core, the best of 20 timings each, under load). One row ran about 10%
 * slower with it; with more rows the FMAs hide the loads, and later row tiles find the panel
 * in L1 or L2 already. */
#define PF_DIST 8
#define PF_ROWS 4

int64_t rl_gemm_packed_size(int64_t k, int64_t n) { return (n + NR - 1) / NR * NR * k; }

static void pack_trans(float *d, const float *b, int64_t ldb, int64_t k, int64_t p0, int64_t w);

/* Columns p0 .. p0+w-1 (w <= NR) of op(b) into one k-major panel at d, zero-padded to NR. */
static void pack_one(float *d, const float *b, int64_t ldb, bool trans, int64_t k, int64_t p0,
                     int64_t w) {
    if (trans) {
        pack_trans(d, b, ldb, k, p0, w);
        return;
    }
    for (int64_t i = 0; i < k; i++, d += NR) {
        memcpy(d, b + i * ldb + p0, (size_t)w * sizeof *d);
        for (int64_t j = w; j < NR; j++)
            d[j] = 0.0f;
    }
}

/* Panels p0 .. p1-1 (column offsets, multiples of NR). */
static void pack_panels(float *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n,
                        int64_t p0, int64_t p1) {
    for (; p0 < p1 && p0 < n; p0 += NR)
        pack_one(dst + p0 * k, b, ldb, trans, k, p0, n - p0 < NR ? n - p0 : NR);
}

typedef struct {
    float *dst;
    const float *b;
    int64_t ldb, k, n;
    bool trans;
} pack_job;

static void pack_part(void *ctx, int part, int parts) {
    const pack_job *j = ctx;
    int64_t panels = (j->n + NR - 1) / NR;
    pack_panels(j->dst, j->b, j->ldb, j->trans, j->k, j->n, panels * part / parts * NR,
                panels * (part + 1) / parts * NR);
}

/* Packing runs once per pass, split into whole panels (rl_cpu_pass_parts). */
void rl_gemm_pack_f32(float *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n) {
    pack_job j = {dst, b, ldb, k, n, trans};
    int parts = rl_cpu_pass_parts(k * n, (n + NR - 1) / NR);
    if (parts > 1)
        rl_cpu_parallel(parts, pack_part, &j);
    else
        pack_panels(dst, b, ldb, trans, k, n, 0, n);
}

static void packed_portable(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            const float *packed, bool accumulate, float *c, int64_t ldc) {
    for (int64_t p0 = 0; p0 < n; p0 += NR) {
        int64_t w = n - p0 < NR ? n - p0 : NR;
        const float *pp = packed + p0 * k;
        for (int64_t r = 0; r < m; r++) {
            float acc[NR] = {0};
            const float *ar = a + r * lda;
            for (int64_t i = 0; i < k; i++)
                for (int j = 0; j < NR; j++)
                    acc[j] += ar[i] * pp[i * NR + j];
            float *cr = c + r * ldc + p0;
            for (int64_t j = 0; j < w; j++)
                cr[j] = accumulate ? cr[j] + acc[j] : acc[j];
        }
    }
}

/* How a tile's sums start and reach c. They start from zero, or from `start` (lds floats a row
 * apart: the partial sums of earlier blocks of k, continuing their chains). They are stored,
 * added to c (the packed GEMM's accumulate), or, for the general GEMM, alpha * sum (beta 0: c
 * is not read, as BLAS does) or alpha * sum + beta * c. Alpha 1 with beta 0 or 1 takes the
 * first two, which give the same bits as the last. */
typedef enum { EP_STORE, EP_ADD, EP_SCALE, EP_AXPBY } epilogue_kind;
typedef struct {
    epilogue_kind kind;
    float alpha, beta;
    const float *start;
    int64_t lds;
} epilogue;

/* ep for the tile rows from r0 and the columns from col on */
static inline epilogue ep_at(epilogue ep, int64_t r0, int64_t col) {
    if (ep.start) ep.start += r0 * ep.lds + col;
    return ep;
}

#ifdef RL_GEMM_X86
#define RL_AVX512 __attribute__((target("avx512f")))
/* the row loops must unroll fully (-O2 leaves them rolled, the accumulators on the stack) */
#define RL_UNROLL _Pragma("GCC unroll 8")

/* One mr x 48 tile over all k, of which the first nv 16-column vectors are computed (a last
 * panel of w <= 32 columns needs fewer: the MDLSTM's narrow products would otherwise spend up
 * to two thirds of their FMAs on padding); mr, nv and pf are constants in each
 * instantiation, so the loops unroll and the accumulators stay in registers. The panel's
 * rows are ldp floats apart (RL_GEMM_PANEL when packed, B's own stride when read in place).
 * With tn (a transposed product read in place) element i of row r of a is a[i * lda + r] and
 * the panel's rows are B's own, w columns read with masked loads.
 * Each element's sum is one chain of FMAs in the order of k from zero, whatever the tile,
 * which is what makes a row's bits independent of the rows around it; ep then stores it (w
 * columns, 1..48). */
RL_AVX512 static inline __attribute__((always_inline)) void
tile(const int mr, const int nv, const bool pf, const bool tn, int64_t k, const float *a,
     int64_t lda, const float *pp, int64_t ldp, epilogue ep, float *c, int64_t ldc, int64_t w) {
    __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    __mmask16 m1 = (__mmask16)(w >= 32 ? 0xffff : w <= 16 ? 0 : (1u << (w - 16)) - 1);
    __mmask16 m2 = (__mmask16)(w >= 48 ? 0xffff : w <= 32 ? 0 : (1u << (w - 32)) - 1);
    __m512 c0[MR], c1[MR], c2[MR];
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        c0[r] = c1[r] = c2[r] = _mm512_setzero_ps();
        if (ep.start) {
            const float *sr = ep.start + r * ep.lds;
            c0[r] = _mm512_maskz_loadu_ps(m0, sr);
            if (nv > 1) c1[r] = _mm512_maskz_loadu_ps(m1, sr + 16);
            if (nv > 2) c2[r] = _mm512_maskz_loadu_ps(m2, sr + 32);
        }
    }
    for (int64_t i = 0; i < k; i++, pp += ldp) {
        if (pf) {
            _mm_prefetch((const char *)(pp + PF_DIST * NR), _MM_HINT_T0);
            _mm_prefetch((const char *)(pp + PF_DIST * NR + 16), _MM_HINT_T0);
            _mm_prefetch((const char *)(pp + PF_DIST * NR + 32), _MM_HINT_T0);
        }
        __m512 b0 = tn ? _mm512_maskz_loadu_ps(m0, pp) : _mm512_loadu_ps(pp);
        __m512 b1 = nv < 2 ? b0
                    : tn   ? _mm512_maskz_loadu_ps(m1, pp + 16)
                           : _mm512_loadu_ps(pp + 16);
        __m512 b2 = nv < 3 ? b0
                    : tn   ? _mm512_maskz_loadu_ps(m2, pp + 32)
                           : _mm512_loadu_ps(pp + 32);
        /* as in tile_avx2: the panel's vectors stay in registers, not folded into mr FMAs */
        __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2));
        RL_UNROLL
        for (int r = 0; r < mr; r++) {
            __m512 ar = _mm512_set1_ps(tn ? a[i * lda + r] : a[r * lda + i]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            if (nv > 1) c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
            if (nv > 2) c2[r] = _mm512_fmadd_ps(ar, b2, c2[r]);
        }
    }
    __m512 alpha = _mm512_set1_ps(ep.alpha), beta = _mm512_set1_ps(ep.beta);
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        if (ep.kind == EP_ADD) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, cr));
            if (nv > 1) c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, cr + 16));
            if (nv > 2) c2[r] = _mm512_add_ps(c2[r], _mm512_maskz_loadu_ps(m2, cr + 32));
        } else if (ep.kind == EP_SCALE) {
            c0[r] = _mm512_mul_ps(alpha, c0[r]);
            if (nv > 1) c1[r] = _mm512_mul_ps(alpha, c1[r]);
            if (nv > 2) c2[r] = _mm512_mul_ps(alpha, c2[r]);
        } else if (ep.kind == EP_AXPBY) {
            c0[r] =
                _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, cr), _mm512_mul_ps(alpha, c0[r]));
            if (nv > 1)
                c1[r] = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, cr + 16),
                                        _mm512_mul_ps(alpha, c1[r]));
            if (nv > 2)
                c2[r] = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m2, cr + 32),
                                        _mm512_mul_ps(alpha, c2[r]));
        }
        _mm512_mask_storeu_ps(cr, m0, c0[r]);
        if (nv > 1) _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
        if (nv > 2) _mm512_mask_storeu_ps(cr + 32, m2, c2[r]);
    }
}

/* All row tiles of one panel with nv vectors (tn: a transposed a read in place). */
RL_AVX512 static inline __attribute__((always_inline)) void
panel_avx512(const int nv, const bool tn, int64_t m, int64_t k, const float *a, int64_t lda,
             const float *pp, int64_t ldp, epilogue ep, float *c, int64_t ldc, int64_t w) {
    /* the panel's only row tile streams it from L2 once: there the prefetch pays */
    if (!tn && ldp == NR && m >= 2 && m <= PF_ROWS) {
        switch (m) {
        case 2: tile(2, nv, true, false, k, a, lda, pp, NR, ep, c, ldc, w); return;
        case 3: tile(3, nv, true, false, k, a, lda, pp, NR, ep, c, ldc, w); return;
        default: tile(4, nv, true, false, k, a, lda, pp, NR, ep, c, ldc, w); return;
        }
    }
    for (int64_t r0 = 0; r0 < m; r0 += MR) {
        const float *ar = tn ? a + r0 : a + r0 * lda;
        float *cr = c + r0 * ldc;
        epilogue e = ep_at(ep, r0, 0);
        switch (m - r0 < MR ? m - r0 : MR) {
        case 1: tile(1, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 2: tile(2, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 3: tile(3, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 4: tile(4, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 5: tile(5, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 6: tile(6, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        case 7: tile(7, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        default: tile(8, nv, false, tn, k, ar, lda, pp, ldp, e, cr, ldc, w); break;
        }
    }
}

/* c's w columns (1..48) of one panel whose rows are ldp floats apart. */
RL_AVX512 static void panel_run_avx512(int64_t m, int64_t k, const float *a, int64_t lda,
                                       const float *pp, int64_t ldp, epilogue ep, float *c,
                                       int64_t ldc, int64_t w) {
    if (w > 32)
        panel_avx512(3, false, m, k, a, lda, pp, ldp, ep, c, ldc, w);
    else if (w > 16)
        panel_avx512(2, false, m, k, a, lda, pp, ldp, ep, c, ldc, w);
    else
        panel_avx512(1, false, m, k, a, lda, pp, ldp, ep, c, ldc, w);
}

/* The same for a transposed product read in place (tile's tn). */
RL_AVX512 static void panel_tn_avx512(int64_t m, int64_t k, const float *a, int64_t lda,
                                      const float *pp, int64_t ldp, epilogue ep, float *c,
                                      int64_t ldc, int64_t w) {
    if (w > 32)
        panel_avx512(3, true, m, k, a, lda, pp, ldp, ep, c, ldc, w);
    else if (w > 16)
        panel_avx512(2, true, m, k, a, lda, pp, ldp, ep, c, ldc, w);
    else
        panel_avx512(1, true, m, k, a, lda, pp, ldp, ep, c, ldc, w);
}

RL_AVX512 static void packed_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                    const float *packed, bool accumulate, float *c, int64_t ldc) {
    epilogue ep = {accumulate ? EP_ADD : EP_STORE, 1.0f, 0.0f, NULL, 0};
    for (int64_t p0 = 0; p0 < n; p0 += NR)
        panel_run_avx512(m, k, a, lda, packed + p0 * k, NR, ep, c + p0, ldc,
                         n - p0 < NR ? n - p0 : NR);
}

#define RL_AVX2 __attribute__((target("avx2,fma")))
#define MR2 4
#define NH 24  /* half a panel */
#define KC 128 /* k rows of a panel block kept in L1 */

/* One mr x 24 tile over kc rows of k, of which the first nv 8-column vectors are computed (as
 * in the AVX-512 tile: a narrow last half panel); with load_c the tile starts from c (a
 * partial sum of earlier k blocks, or the accumulate operand), else from zero; so does
 * ep.start. The panel's rows are ldp floats apart, and ep (EP_STORE, EP_SCALE or
 * EP_AXPBY) finishes the sums. w (1..8 nv) columns are stored; masked moves only where w < 8
 * nv, since AMD cores microcode vmaskmovps stores. */
RL_AVX2 static inline __attribute__((always_inline)) void
tile_avx2(const int mr, const int nv, int64_t kc, const float *a, int64_t lda, const float *pp,
          int64_t ldp, bool load_c, epilogue ep, float *c, int64_t ldc, int64_t w) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w), lane),
            m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w - 8), lane),
            m2 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w - 16), lane);
    bool full = w == 8 * nv;
    __m256 c0[MR2], c1[MR2], c2[MR2];
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        const float *cr = load_c ? c + r * ldc : ep.start ? ep.start + r * ep.lds : NULL;
        c0[r] = c1[r] = c2[r] = _mm256_setzero_ps();
        if (cr && full) {
            c0[r] = _mm256_loadu_ps(cr);
            if (nv > 1) c1[r] = _mm256_loadu_ps(cr + 8);
            if (nv > 2) c2[r] = _mm256_loadu_ps(cr + 16);
        } else if (cr) {
            c0[r] = _mm256_maskload_ps(cr, m0);
            if (nv > 1) c1[r] = _mm256_maskload_ps(cr + 8, m1);
            if (nv > 2) c2[r] = _mm256_maskload_ps(cr + 16, m2);
        }
    }
    for (int64_t i = 0; i < kc; i++, pp += ldp) {
        __m256 b0 = _mm256_loadu_ps(pp);
        __m256 b1 = nv > 1 ? _mm256_loadu_ps(pp + 8) : b0;
        __m256 b2 = nv > 2 ? _mm256_loadu_ps(pp + 16) : b0;
        /* keep the panel vectors in registers: folded into each FMA as memory operands they
         * would be loaded mr times, and the loop would be bound by loads, not FMAs */
        __asm__("" : "+x"(b0), "+x"(b1), "+x"(b2));
        RL_UNROLL
        for (int r = 0; r < mr; r++) {
            __m256 ar = _mm256_broadcast_ss(a + r * lda + i);
            c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
            if (nv > 1) c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
            if (nv > 2) c2[r] = _mm256_fmadd_ps(ar, b2, c2[r]);
        }
    }
    __m256 alpha = _mm256_set1_ps(ep.alpha), beta = _mm256_set1_ps(ep.beta);
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        if (ep.kind == EP_SCALE || ep.kind == EP_AXPBY) {
            c0[r] = _mm256_mul_ps(alpha, c0[r]);
            if (nv > 1) c1[r] = _mm256_mul_ps(alpha, c1[r]);
            if (nv > 2) c2[r] = _mm256_mul_ps(alpha, c2[r]);
        }
        if (ep.kind == EP_AXPBY) {
            c0[r] = _mm256_fmadd_ps(beta, full ? _mm256_loadu_ps(cr) : _mm256_maskload_ps(cr, m0),
                                    c0[r]);
            if (nv > 1)
                c1[r] = _mm256_fmadd_ps(
                    beta, full ? _mm256_loadu_ps(cr + 8) : _mm256_maskload_ps(cr + 8, m1), c1[r]);
            if (nv > 2)
                c2[r] = _mm256_fmadd_ps(
                    beta, full ? _mm256_loadu_ps(cr + 16) : _mm256_maskload_ps(cr + 16, m2), c2[r]);
        }
        if (full) {
            _mm256_storeu_ps(cr, c0[r]);
            if (nv > 1) _mm256_storeu_ps(cr + 8, c1[r]);
            if (nv > 2) _mm256_storeu_ps(cr + 16, c2[r]);
        } else {
            _mm256_maskstore_ps(cr, m0, c0[r]);
            if (nv > 1) _mm256_maskstore_ps(cr + 8, m1, c1[r]);
            if (nv > 2) _mm256_maskstore_ps(cr + 16, m2, c2[r]);
        }
    }
}

/* All row tiles of one half panel (kc rows of k) with nv vectors. */
RL_AVX2 static inline __attribute__((always_inline)) void
half_avx2(const int nv, int64_t m, int64_t kc, const float *a, int64_t lda, const float *pb,
          int64_t ldp, bool load_c, epilogue ep, float *c, int64_t ldc, int64_t wh) {
    for (int64_t r0 = 0; r0 < m; r0 += MR2) {
        const float *ar = a + r0 * lda;
        float *cr = c + r0 * ldc;
        epilogue e = ep_at(ep, r0, 0);
        switch (m - r0 < MR2 ? m - r0 : MR2) {
        case 1: tile_avx2(1, nv, kc, ar, lda, pb, ldp, load_c, e, cr, ldc, wh); break;
        case 2: tile_avx2(2, nv, kc, ar, lda, pb, ldp, load_c, e, cr, ldc, wh); break;
        case 3: tile_avx2(3, nv, kc, ar, lda, pb, ldp, load_c, e, cr, ldc, wh); break;
        default: tile_avx2(4, nv, kc, ar, lda, pb, ldp, load_c, e, cr, ldc, wh); break;
        }
    }
}

/* How a panel of w columns splits into halves: a 25..32-column panel as 16 + 16, not 24 + 8: an
 * 8-column tile has 4 accumulators, each waiting out the FMA latency every k, and 16 + 16 does
 * the same vectors in two 8-accumulator tiles (the sums do not change) */
static inline int64_t half_width(int64_t w) { return w > NH && w <= 32 ? 16 : NH; }

/* The general GEMM's panel (w columns, rows ldp apart) over all of k, no k blocks: ep needs c
 * as it was, which partial sums through c would overwrite. */
RL_AVX2 static void panel_run_avx2(int64_t m, int64_t k, const float *a, int64_t lda,
                                   const float *pp, int64_t ldp, epilogue ep, float *c, int64_t ldc,
                                   int64_t w) {
    int64_t h1 = half_width(w);
    for (int64_t h = 0; h < w; h += h1) {
        int64_t wh = w - h < h1 ? w - h : h1;
        if (wh > 16)
            half_avx2(3, m, k, a, lda, pp + h, ldp, false, ep_at(ep, 0, h), c + h, ldc, wh);
        else if (wh > 8)
            half_avx2(2, m, k, a, lda, pp + h, ldp, false, ep_at(ep, 0, h), c + h, ldc, wh);
        else
            half_avx2(1, m, k, a, lda, pp + h, ldp, false, ep_at(ep, 0, h), c + h, ldc, wh);
    }
}

RL_AVX2 static void packed_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                const float *packed, bool accumulate, float *c, int64_t ldc) {
    epilogue st = {EP_STORE, 1.0f, 0.0f, NULL, 0};
    for (int64_t p0 = 0; p0 < n; p0 += NR) {
        int64_t w = n - p0 < NR ? n - p0 : NR;
        const float *pp = packed + p0 * k;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kc = k - k0 < KC ? k - k0 : KC;
            bool load_c = accumulate || k0 > 0;
            int64_t h1 = half_width(w);
            for (int64_t h = 0; h < w; h += h1) {
                int64_t wh = w - h < h1 ? w - h : h1;
                const float *pb = pp + k0 * NR + h, *ak = a + k0;
                float *ch = c + p0 + h;
                if (wh > 16)
                    half_avx2(3, m, kc, ak, lda, pb, NR, load_c, st, ch, ldc, wh);
                else if (wh > 8)
                    half_avx2(2, m, kc, ak, lda, pb, NR, load_c, st, ch, ldc, wh);
                else
                    half_avx2(1, m, kc, ak, lda, pb, NR, load_c, st, ch, ldc, wh);
            }
        }
    }
}
#endif

bool rl_gemm_packed_fast(void) {
    /* with a bf16 context active the products go through rl_mat_gemm, which runs them in bf16 */
    if (rl_bf16_active()) return false;
#ifdef RL_GEMM_X86
    return rl_cpu_level_get() >= RL_CPU_AVX2;
#elif defined(__aarch64__)
    return rl_cpu_level_get() >= RL_CPU_NEON;
#else
    return false;
#endif
}

typedef struct {
    int64_t m, n, k, lda, ldc;
    const float *a, *packed;
    float *c;
    bool accumulate;
    rl_cpu_level level; /* read once per call: every part runs the same kernel */
} job;

/* Part `part` of `parts`: a contiguous range of whole panels. */
static void run_part(void *ctx, int part, int parts) {
    const job *j = ctx;
    int64_t panels = (j->n + NR - 1) / NR;
    int64_t p0 = panels * part / parts * NR, p1 = panels * (part + 1) / parts * NR;
    if (p1 > j->n) p1 = j->n;
    if (p0 >= p1) return;
    void (*fn)(int64_t, int64_t, int64_t, const float *, int64_t, const float *, bool, float *,
               int64_t) = packed_portable;
#ifdef RL_GEMM_X86
    switch (j->level) {
    case RL_CPU_AVX512: fn = packed_avx512; break;
    case RL_CPU_AVX2: fn = packed_avx2; break;
    default: break;
    }
#elif defined(__aarch64__)
    if (j->level == RL_CPU_NEON) fn = rl_gemm_packed_neon;
#endif
    fn(j->m, p1 - p0, j->k, j->a, j->lda, j->packed + p0 * j->k, j->accumulate, j->c + p0, j->ldc);
}

void rl_gemm_packed_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *packed, bool accumulate, float *c, int64_t ldc) {
    job j = {m, n, k, lda, ldc, a, packed, c, accumulate, rl_cpu_level_get()};
    int64_t panels = (n + NR - 1) / NR;
    int threads = rl_blas_get_threads();
    /* column parts of whole panels, from 0.5 MFLOP on: a recurrent step's product of 1-3 rows
     * by an LSTM 257's packed U (1.1 MB, past a Zen 4 core's 1 MB L2) split in two keeps each
     * half in its core's L2 from step to step (tiny3 and tiny1 on 2 threads: 56-62 and 24-25
     * ms a step, where a split only from 2 MFLOP gives 75-86 and 36-39) */
    int parts = threads < panels ? threads : (int)panels;
    if (parts > 1 && 2 * m * n * k >= 500000)
        rl_cpu_parallel(parts, run_part, &j);
    else
        run_part(&j, 0, 1);
}

/* The general product of gemm_small.h's rl_gemm_f32: the level's panel kernel, or NULL. */
typedef void (*panel_fn)(int64_t, int64_t, const float *, int64_t, const float *, int64_t, epilogue,
                         float *, int64_t, int64_t);

static panel_fn general_panel(void) {
#ifdef RL_GEMM_X86
    switch (rl_cpu_level_get()) {
    case RL_CPU_AVX512: return panel_run_avx512;
    case RL_CPU_AVX2: return panel_run_avx2;
    default: return NULL;
    }
#else
    return NULL;
#endif
}

/* Up to this many rows (one row tile), a product with B as stored (not transposed) reads B's
 * rows in place rather than packing each panel first: the copy would cost about as much as the
 * product. From two tiles on the packed panel (contiguous, in L1/L2) pays: one thread, 16 x 512
 * -> 2048 took 53-62 GFLOP/s packed against 42-52 in place, 8 rows 35-37 against 39-49. */
#define DIRECT_ROWS 8

/* Rows of k a panel block has when k is long: 1024 x 48 floats (192 KiB) stay in L2 beside the
 * rows of A streaming past, where a whole panel of k = 6000 (1.1 MiB) would not. */
#ifndef KB_GENERAL
#define KB_GENERAL 1024
#endif

#ifdef RL_GEMM_X86
/* t (16 rows, ldt apart) = the transpose of a's 16 x 16 block (rows lda apart) */
RL_AVX512 static inline void transpose16(float *t, int64_t ldt, const float *a, int64_t lda) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(a + i * lda);
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(u[i], u[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(u[i], u[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        u[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        u[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        u[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        u[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        _mm512_storeu_ps(t + i * ldt, _mm512_shuffle_f32x4(u[i], u[i + 8], 0x88));
        _mm512_storeu_ps(t + (i + 8) * ldt, _mm512_shuffle_f32x4(u[i], u[i + 8], 0xDD));
    }
}

/* the same for 8 x 8 */
RL_AVX2 static inline void transpose8(float *t, int64_t ldt, const float *a, int64_t lda) {
    __m256 r[8], u[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(a + i * lda);
    for (int i = 0; i < 8; i += 2) {
        u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(t + i * ldt, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(t + (i + 4) * ldt, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

RL_AVX512 static void blocks16(float *t, const float *a, int64_t lda, int64_t k, int64_t kb,
                               int64_t m0, int64_t m1) {
    for (int64_t r0 = m0; r0 < m1; r0 += 16)
        for (int64_t i0 = 0; i0 < kb; i0 += 16)
            transpose16(t + r0 * k + i0, k, a + i0 * lda + r0, lda);
}

RL_AVX2 static void blocks8(float *t, const float *a, int64_t lda, int64_t k, int64_t kb,
                            int64_t m0, int64_t m1) {
    for (int64_t r0 = m0; r0 < m1; r0 += 8)
        for (int64_t i0 = 0; i0 < kb; i0 += 8)
            transpose8(t + r0 * k + i0, k, a + i0 * lda + r0, lda);
}

/* panel rows i0 .. i0+bs-1 from bs rows of b at a time: the panel's columns [0, wb) */
RL_AVX512 static void panel_blocks16(float *d, const float *b, int64_t ldb, int64_t kb,
                                     int64_t wb) {
    for (int64_t i0 = 0; i0 < kb; i0 += 16)
        for (int64_t j0 = 0; j0 < wb; j0 += 16)
            transpose16(d + i0 * NR + j0, NR, b + j0 * ldb + i0, ldb);
}

RL_AVX2 static void panel_blocks8(float *d, const float *b, int64_t ldb, int64_t kb, int64_t wb) {
    for (int64_t i0 = 0; i0 < kb; i0 += 8)
        for (int64_t j0 = 0; j0 < wb; j0 += 8)
            transpose8(d + i0 * NR + j0, NR, b + j0 * ldb + i0, ldb);
}
#endif

/* The panel of a transposed op(b): each of its columns is a row of b. Whole blocks go through
 * the register transposes (a backward product's W^T: copied element by element, the input
 * gradients' products ran at 0.91x OpenBLAS's AVX-512 kernels on a Zen 4 core, with the blocks
 * at 0.98-1.01x); the edges go one element at a time, 16 of k (a cache line of b) per pass so
 * that the 16 panel rows written (3 KiB) stay in L1 while the w rows of b are read. */
static void pack_trans(float *d, const float *b, int64_t ldb, int64_t k, int64_t p0, int64_t w) {
    b += p0 * ldb;
    int64_t bs = 1;
#ifdef RL_GEMM_X86
    rl_cpu_level level = rl_cpu_level_get();
    bs = level >= RL_CPU_AVX512 ? 16 : level >= RL_CPU_AVX2 ? 8 : 1;
#endif
    int64_t kb = k / bs * bs, wb = w / bs * bs;
    if (bs == 1) kb = wb = 0;
#ifdef RL_GEMM_X86
    if (bs == 16 && kb > 0 && wb > 0) panel_blocks16(d, b, ldb, kb, wb);
    if (bs == 8 && kb > 0 && wb > 0) panel_blocks8(d, b, ldb, kb, wb);
#endif
    for (int64_t i0 = 0; i0 < k; i0 += 16) {
        int64_t i1 = i0 + 16 < k ? i0 + 16 : k;
        /* rows i0 .. done-1 have their first wb columns from the blocks */
        int64_t done = kb < i0 ? i0 : kb > i1 ? i1 : kb;
        for (int64_t j = 0; j < w; j++) {
            const float *bj = b + j * ldb;
            for (int64_t i = j < wb ? done : i0; i < i1; i++)
                d[i * NR + j] = bj[i];
        }
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = w; j < NR; j++)
                d[i * NR + j] = 0.0f;
    }
}

/* Rows r0 .. r1-1 and k i0 .. i1-1 of the copy, one element at a time, in 32 x 32 blocks so
 * that both sides stay in cache lines */
static void transpose_scalar(float *t, const float *a, int64_t lda, int64_t k, int64_t m0,
                             int64_t m1, int64_t k0, int64_t k1) {
    for (int64_t i0 = k0; i0 < k1; i0 += 32)
        for (int64_t r0 = m0; r0 < m1; r0 += 32) {
            int64_t i1 = i0 + 32 < k1 ? i0 + 32 : k1, r1 = r0 + 32 < m1 ? r0 + 32 : m1;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t r = r0; r < r1; r++)
                    t[r * k + i] = a[i * lda + r];
        }
}

/* A transposed left operand (the weight gradient's activations, frames x inputs) read in place
 * would take a cache line and a page per k for each row tile; the copy costs m k moves against
 * the product's m k n FMAs, in 16 x 16 (AVX-512) or 8 x 8 (AVX2) register transposes, a
 * conv2d's weight gradient, whose n (the filters) is small, being where it shows. */
void rl_gemm_f32_transpose(float *t, const float *a, int64_t lda, int64_t k, int64_t m0,
                           int64_t m1) {
    int64_t bs = 1;
#ifdef RL_GEMM_X86
    rl_cpu_level level = rl_cpu_level_get();
    bs = level >= RL_CPU_AVX512 ? 16 : level >= RL_CPU_AVX2 ? 8 : 1;
#endif
    /* whole blocks: rows m0 .. mb-1 (a multiple of bs past m0), k 0 .. kb-1 */
    int64_t mb = m0 + (m1 - m0) / bs * bs, kb = k / bs * bs;
#ifdef RL_GEMM_X86
    if (bs == 16 && mb > m0 && kb > 0) blocks16(t, a, lda, k, kb, m0, mb);
    if (bs == 8 && mb > m0 && kb > 0) blocks8(t, a, lda, k, kb, m0, mb);
#endif
    if (bs == 1) {
        transpose_scalar(t, a, lda, k, m0, m1, 0, k);
        return;
    }
    /* the edges: k past the blocks for the block rows, then the rows past them */
    if (kb < k) transpose_scalar(t, a, lda, k, m0, mb, kb, k);
    if (mb < m1) transpose_scalar(t, a, lda, k, mb, m1, 0, k);
}

bool rl_gemm_f32_fast(void) { return general_panel() != NULL; }

#ifdef RL_GEMM_X86
/* A transposed product with few columns (a conv2d's weight gradient: the filters' inputs x the
 * filters, summed over every pixel of the batch) reads a (k x m) and b (k x n) in place, k in
 * blocks of KB_TN rows (both blocks stay in L2 while the row tiles pass), the blocks' sums
 * continuing each other's chains through `part`: copying a transposed and b into panels would
 * move more bytes than such a product has FMAs. */
#define TN_MAX_N 96
#define KB_TN 256

static bool tn_in_place(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, epilogue ep, float *c, int64_t ldc) {
    int64_t np = (n + NR - 1) / NR * NR;
    float *part = NULL;
    if (k > KB_TN) {
        part = rl_thread_scratch(RL_SCRATCH_F32_SUMS, sizeof(float) * (size_t)(m * np), NULL);
        if (!part) return false;
    }
    for (int64_t k0 = 0; k0 < k; k0 += KB_TN) {
        int64_t kc = k - k0 < KB_TN ? k - k0 : KB_TN;
        bool last = k0 + kc >= k;
        for (int64_t p0 = 0; p0 < n; p0 += NR) {
            epilogue e = ep;
            if (!last) e.kind = EP_STORE;
            e.start = k0 > 0 ? part + p0 : NULL;
            e.lds = np;
            panel_tn_avx512(m, kc, a + k0 * lda, lda, b + k0 * ldb + p0, ldb, e,
                            last ? c + p0 : part + p0, last ? ldc : np, n - p0 < NR ? n - p0 : NR);
        }
    }
    return true;
}
#endif

bool rl_gemm_f32_copies_a(bool trans_a, bool trans_b, int64_t n) {
    if (!trans_a || !rl_gemm_f32_fast()) return false;
#ifdef RL_GEMM_X86
    if (!trans_b && n <= TN_MAX_N && rl_cpu_level_get() >= RL_CPU_AVX512) return false;
#endif
    return true;
}

bool rl_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc) {
    panel_fn run = general_panel();
    if (!run) return false;
    if (m <= 0 || n <= 0) return true;
    if (k < 0) k = 0;
    epilogue ep = {alpha == 1.0f && beta == 0.0f ? EP_STORE
                   : beta == 0.0f                ? EP_SCALE
                                                 : EP_AXPBY,
                   alpha, beta, NULL, 0};
#ifdef RL_GEMM_X86
    if (trans_a && !trans_b && n <= TN_MAX_N && k > 0 && rl_cpu_level_get() >= RL_CPU_AVX512)
        return tn_in_place(m, n, k, a, lda, b, ldb, ep, c, ldc);
#endif
    bool direct = !trans_b && m <= DIRECT_ROWS;
    float *panel = NULL;
    if (k > 0 && (!direct || n % NR)) {
        panel = rl_thread_scratch(RL_SCRATCH_F32_PANEL, sizeof(float) * (size_t)(NR * k), NULL);
        if (!panel) return false;
    }
    if (k > 0 && trans_a) {
        float *t = rl_thread_scratch(RL_SCRATCH_F32_A, sizeof(float) * (size_t)(m * k), NULL);
        if (!t) return false;
        rl_gemm_f32_transpose(t, a, lda, k, 0, m);
        a = t;
        lda = k;
    }
    /* a long k in blocks of KB_GENERAL rows of the panel, each block's sums continuing the
     * chains of the one before through `part` (m x 48), the last one finishing them into c */
    float *part = NULL;
    if (k > KB_GENERAL + KB_GENERAL / 2) {
        part = rl_thread_scratch(RL_SCRATCH_F32_SUMS, sizeof(float) * (size_t)(m * NR), NULL);
        if (!part) return false;
    }
    /* panels outermost: one panel (k x 48) stays in L2 while every row tile of A streams past
     * it, so only one panel's copy is kept */
    for (int64_t p0 = 0; p0 < n; p0 += NR) {
        int64_t w = n - p0 < NR ? n - p0 : NR, ldp = NR;
        const float *pp = panel;
        if (k == 0 || (direct && w == NR)) {
            pp = b + p0;
            ldp = ldb;
        } else {
            pack_one(panel, b, ldb, trans_b, k, p0, w);
        }
        if (!part) {
            run(m, k, a, lda, pp, ldp, ep, c + p0, ldc, w);
            continue;
        }
        for (int64_t k0 = 0; k0 < k; k0 += KB_GENERAL) {
            int64_t kc = k - k0 < KB_GENERAL ? k - k0 : KB_GENERAL;
            bool last = k0 + kc >= k;
            epilogue e = ep;
            if (!last) e.kind = EP_STORE;
            e.start = k0 > 0 ? part : NULL;
            e.lds = NR;
            run(m, kc, a + k0, lda, pp + k0 * ldp, ldp, e, last ? c + p0 : part, last ? ldc : NR,
                w);
        }
    }
    return true;
}
