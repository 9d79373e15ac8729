/* The Advanced SIMD (NEON) kernel of the packed small-M GEMM on AArch64 (gemm_neon.h).
 *
 * AArch64 has 32 registers of 4 floats. A tile is up to 4 rows of c by a third of a panel
 * (16 columns, 4 vectors): 16 accumulators. Per 4 steps of k it loads 4 values of each row of a
 * in one vector and 4 x 4 panel vectors, and multiplies each panel vector by one lane of each
 * row's vector (fmla by element), i.e. 20 loads for 64 FMAs; about 24 registers are live, so
 * nothing spills. As in the AVX2 kernel, 4-row tiles read a panel B/4 times per step, so k is
 * cut into blocks of KC rows (KC x 48 floats, 24 KiB) that stay in L1 across the row tiles
 * and the three thirds; partial sums go through c between blocks, in the order of k, and every
 * element is one chain of FMAs in the order of k, so the result does not depend on the blocking.
 */
#include "gemm_neon.h"

#ifdef __aarch64__
#include <arm_neon.h>

#include "gemm_small.h"

#define NR RL_GEMM_PANEL
#define MR 4
#define NT 16  /* a third of a panel */
#define KC 128 /* k rows of a panel block kept in L1 */
/* the row and vector loops must unroll fully, so that the accumulators stay in registers */
#define RL_UNROLL _Pragma("GCC unroll 16")

/* cnt (>= 1) floats of p as a vector, the rest 0 */
static inline float32x4_t load_part(const float *p, int64_t cnt) {
    if (cnt >= 4) return vld1q_f32(p);
    float t[4] = {0, 0, 0, 0};
    for (int j = 0; j < 3 && j < cnt; j++)
        t[j] = p[j];
    return vld1q_f32(t);
}

static inline void store_part(float *p, float32x4_t v, int64_t cnt) {
    if (cnt >= 4) {
        vst1q_f32(p, v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (int j = 0; j < 3 && j < cnt; j++)
        p[j] = t[j];
}

/* acc[r][v] += panel row pp (vector v) * lane L of av[r], for every row and vector */
#define STEP(L)                                                                                    \
    do {                                                                                           \
        RL_UNROLL                                                                                  \
        for (int v = 0; v < nv; v++) {                                                             \
            float32x4_t b = vld1q_f32(pp + (L)*NR + 4 * v);                                        \
            RL_UNROLL                                                                              \
            for (int r = 0; r < mr; r++)                                                           \
                acc[r][v] = vfmaq_laneq_f32(acc[r][v], b, av[r], (L));                             \
        }                                                                                          \
    } while (0)

/* One mr x 16 tile over kc rows of k, of which the first nv 4-column vectors are computed (a
 * narrow last third); with load_c the tile starts from c (a partial sum of earlier k blocks,
 * or the accumulate operand), else from zero. w (1..16) columns are stored. mr and nv are
 * constants in each instantiation. */
static inline __attribute__((always_inline)) void tile(const int mr, const int nv, int64_t kc,
                                                       const float *a, int64_t lda, const float *pp,
                                                       bool load_c, float *c, int64_t ldc,
                                                       int64_t w) {
    float32x4_t acc[MR][NT / 4];
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        RL_UNROLL
        for (int v = 0; v < nv; v++)
            acc[r][v] = load_c ? load_part(c + r * ldc + 4 * v, w - 4 * v) : vdupq_n_f32(0.0f);
    }
    int64_t i = 0;
    for (; i + 4 <= kc; i += 4, pp += 4 * NR) {
        float32x4_t av[MR];
        RL_UNROLL
        for (int r = 0; r < mr; r++)
            av[r] = vld1q_f32(a + r * lda + i);
        STEP(0);
        STEP(1);
        STEP(2);
        STEP(3);
    }
    for (; i < kc; i++, pp += NR) {
        RL_UNROLL
        for (int v = 0; v < nv; v++) {
            float32x4_t b = vld1q_f32(pp + 4 * v);
            RL_UNROLL
            for (int r = 0; r < mr; r++)
                acc[r][v] = vfmaq_n_f32(acc[r][v], b, a[r * lda + i]);
        }
    }
    RL_UNROLL
    for (int r = 0; r < mr; r++) {
        RL_UNROLL
        for (int v = 0; v < nv; v++)
            store_part(c + r * ldc + 4 * v, acc[r][v], w - 4 * v);
    }
}

/* All row tiles of one third of a panel (kc rows of k) with nv vectors. */
static inline __attribute__((always_inline)) void third(const int nv, int64_t m, int64_t kc,
                                                        const float *a, int64_t lda,
                                                        const float *pb, bool load_c, float *c,
                                                        int64_t ldc, int64_t w) {
    for (int64_t r0 = 0; r0 < m; r0 += MR) {
        const float *ar = a + r0 * lda;
        float *cr = c + r0 * ldc;
        switch (m - r0 < MR ? m - r0 : MR) {
        case 1: tile(1, nv, kc, ar, lda, pb, load_c, cr, ldc, w); break;
        case 2: tile(2, nv, kc, ar, lda, pb, load_c, cr, ldc, w); break;
        case 3: tile(3, nv, kc, ar, lda, pb, load_c, cr, ldc, w); break;
        default: tile(4, nv, kc, ar, lda, pb, load_c, cr, ldc, w); break;
        }
    }
}

void rl_gemm_packed_neon(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *packed, bool accumulate, float *c, int64_t ldc) {
    for (int64_t p0 = 0; p0 < n; p0 += NR) {
        int64_t w = n - p0 < NR ? n - p0 : NR;
        const float *pp = packed + p0 * k;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kc = k - k0 < KC ? k - k0 : KC;
            bool load_c = accumulate || k0 > 0;
            for (int64_t h = 0; h < w; h += NT) {
                int64_t wt = w - h < NT ? w - h : NT;
                const float *pb = pp + k0 * NR + h, *ak = a + k0;
                float *ch = c + p0 + h;
                switch ((wt + 3) / 4) {
                case 1: third(1, m, kc, ak, lda, pb, load_c, ch, ldc, wt); break;
                case 2: third(2, m, kc, ak, lda, pb, load_c, ch, ldc, wt); break;
                case 3: third(3, m, kc, ak, lda, pb, load_c, ch, ldc, wt); break;
                default: third(4, m, kc, ak, lda, pb, load_c, ch, ldc, wt); break;
                }
            }
        }
    }
}
#endif
