/* The fused softmax / cross-entropy row passes of kernels/softmax_ce.h on the CPU.
 *
 * Per row three sweeps, the row (C floats, 40 KiB at C = 10000) staying in L1/L2 between
 * them: the maximum (16 lanes, so it vectorises without reassociating), exp(z - max) with
 * its sum, and the scaling by 1 / sum. float32 computes exp with its own polynomial (below) so
 * that the sweep vectorises; libm's expf is a call per element. The float32 sweeps are compiled
 * per CPU level (kernels/cpu/cpu_level.h). float64 (gradient checks) uses libm.
 *
 * float32 splits the rows over the BLAS threads (kernels/cpu/parallel.h) where a pass has at
 * least PAR_MIN elements: the output GEMMs around these passes run on every thread, so a
 * serial pass would take twice its share of a step. Per-row results (loss, error, the bias
 * gradient's block sums) are combined in row order after the parts, the same for any split.
 */
#include <math.h>
#include <string.h>

#include "../../core/bf16.h"
#include "../../core/blas.h"
#include "../softmax_ce.h"
#include "cpu_level.h"
#include "gemm_bf16.h"
#include "parallel.h"

#define RL_INLINE static inline __attribute__((always_inline))
#define LANES 16
#define PAR_MIN (1 << 16) /* elements of a pass worth a handoff (~10 us of work) */

/* Parts for a pass over `units` (rows or row blocks) of `elems` elements in all. */
static int pass_parts(int64_t units, int64_t elems) {
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > units) parts = (int)units;
    return elems >= PAR_MIN && parts > 1 ? parts : 1;
}

int64_t rl_ce_targets_cpu(int64_t T, int64_t B, int64_t C, const int32_t *target,
                          const int32_t *len, int32_t *tgt) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            int64_t r = t * B + b;
            if (t >= len[b]) {
                tgt[r] = -1;
                continue;
            }
            if (target[r] < 0 || target[r] >= C) return r;
            tgt[r] = target[r];
        }
    return -1;
}

/* e^x for x <= 0 (and NaN): x = n ln2 + f with |f| <= ln2 / 2, e^f by Cephes' expf polynomial
 * (about 1 ulp), 2^n built in the exponent bits. Branch-free, so loops over it vectorise. Below
 * -87.3 (where e^x is subnormal) it returns 0; NaN stays NaN. */
RL_INLINE float exp_f32(float x) {
    float xc = x > -87.3f ? x : -87.3f; /* NaN -> -87.3: no NaN reaches the int conversion */
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float f = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * f + 1.3981999507e-3f;
    y = y * f + 8.3334519073e-3f;
    y = y * f + 4.1665795894e-2f;
    y = y * f + 1.6666665459e-1f;
    y = y * f + 5.0000001201e-1f;
    y = y * f * f + f + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) * (1 << 23)};
    float e = y * s.f;
    e = x < -87.3f ? 0.0f : e;
    return x != x ? x : e;
}

/* The first NaN of a row (the argmax of rl_op_reduce_dim: a NaN wins), -1 when it has none. */
static int64_t first_nan_f32(const float *z, int64_t C) {
    for (int64_t c = 0; c < C; c++)
        if (z[c] != z[c]) return c;
    return -1;
}

/* Rows r0 .. r1-1; with tgt each valid row's loss and error into stats[2r], stats[2r+1]. */
RL_INLINE void softmax_ce_body_f32(int64_t r0, int64_t r1, int64_t C, const float *z,
                                   const float *bias, float *p, const int32_t *tgt, double eps,
                                   double *stats) {
    for (int64_t r = r0; r < r1; r++) {
        const float *zr = z + r * C;
        float *pr = p + r * C;
        if (bias) {
            /* z + b into p, then on in place (the row stays in L1/L2 for the sweeps below) */
            for (int64_t c = 0; c < C; c++)
                pr[c] = zr[c] + bias[c];
            zr = pr;
        }
        /* the row's maximum, NaN passed over (comparisons with it are false): a plain
         * maximum vectorises, one that also flags NaN did not */
        float m[LANES];
        for (int j = 0; j < LANES; j++)
            m[j] = -INFINITY;
        int64_t c = 0;
        for (; c + LANES <= C; c += LANES)
            for (int j = 0; j < LANES; j++)
                m[j] = zr[c + j] > m[j] ? zr[c + j] : m[j];
        float mx = -INFINITY;
        for (int j = 0; j < LANES; j++)
            mx = m[j] > mx ? m[j] : mx;
        for (; c < C; c++)
            mx = zr[c] > mx ? zr[c] : mx;
        /* the target's logit and whether it is the first maximum, before an in-place sweep
         * overwrites z; a NaN in the row is the argmax instead (rl_op_reduce_dim's rule), so
         * the first NaN is looked for: with a finite maximum the sweep below leaves a NaN in p
         * exactly where z has one, and only an infinite maximum (inf - inf) needs z itself */
        int32_t k = tgt ? tgt[r] : -1;
        float zk = k >= 0 ? zr[k] : 0.0f;
        bool first_max = k >= 0 && zk == mx;
        for (int64_t i = 0; i < k && first_max; i++)
            first_max = zr[i] != mx;
        bool finite_max = mx > -INFINITY && mx < INFINITY;
        int64_t nan_at = -1;
        if (k >= 0 && !finite_max) nan_at = first_nan_f32(zr, C);
        /* label smoothing's mean logit, before the sweeps below overwrite z */
        double zmean = 0;
        if (k >= 0 && eps > 0) {
            float zs[LANES] = {0};
            c = 0;
            for (; c + LANES <= C; c += LANES)
                for (int j = 0; j < LANES; j++)
                    zs[j] += zr[c + j];
            for (int j = 0; j < LANES; j++)
                zmean += zs[j];
            for (; c < C; c++)
                zmean += zr[c];
            zmean /= (double)C;
        }
        float s[LANES] = {0};
        c = 0;
        for (; c + LANES <= C; c += LANES)
            for (int j = 0; j < LANES; j++) {
                float e = exp_f32(zr[c + j] - mx);
                pr[c + j] = e;
                s[j] += e;
            }
        float sum = 0;
        for (int j = 0; j < LANES; j++)
            sum += s[j];
        for (; c < C; c++) {
            float e = exp_f32(zr[c] - mx);
            pr[c] = e;
            sum += e;
        }
        if (k >= 0 && finite_max && sum != sum) nan_at = first_nan_f32(pr, C);
        if (nan_at >= 0) first_max = nan_at == k;
        float inv = 1.0f / sum;
        for (c = 0; c < C; c++)
            pr[c] *= inv;
        if (k < 0) continue;
        double lse = (double)mx + log((double)sum);
        stats[2 * r] =
            eps > 0 ? (1 - eps) * (lse - (double)zk) + eps * (lse - zmean) : lse - (double)zk;
        stats[2 * r + 1] = first_max ? 0.0 : 1.0;
    }
}

/* The number of RL_CE_DB_ROWS-row blocks the gradient pass cuts rows into. */
static inline int64_t db_blocks(int64_t rows) { return (rows + RL_CE_DB_ROWS - 1) / RL_CE_DB_ROWS; }

/* One valid row (target t) of a bf16 network's dz: written rounded to bf16 (zeros past C, to
 * ld), summed into acc (or NULL) in float32, so that db and the rounded dz are those of the
 * float32 row (eps = 0: off 0 and hit 1, and p - 0 is p, as the float32 row's p or 0 + p) */
RL_INLINE void grad_row16(const float *restrict pr, int64_t t, int64_t C, float off, float hit,
                          uint16_t *restrict dr, int64_t ld, float *restrict acc) {
    if (acc) {
        RL_IVDEP
        for (int64_t c = 0; c < C; c++) {
            float v = pr[c] - off;
            v = c == t ? v - hit : v;
            dr[c] = rl_f32_to_bf16(v);
            acc[c] += v;
        }
    } else {
        RL_IVDEP
        for (int64_t c = 0; c < C; c++) {
            float v = pr[c] - off;
            dr[c] = rl_f32_to_bf16(c == t ? v - hit : v);
        }
    }
    memset(dr + C, 0, (size_t)(ld - C) * sizeof *dr);
}

/* Row blocks j0 .. j1-1 of RL_CE_DB_ROWS rows: dz, and with db each block's column sums of dz
 * into its row of scratch (or into db itself when there is one block). With dz16 (and without
 * accumulate) dz is written only rounded, rows ld apart (rl_ce_grad_cpu_bf16). */
RL_INLINE void ce_grad_body_f32(int64_t j0, int64_t j1, int64_t rows, int64_t C, const float *p,
                                const int32_t *tgt, double eps, float *dz, uint16_t *dz16,
                                int64_t ld, bool accumulate, float *db, float *scratch) {
    bool one = db_blocks(rows) == 1;
    /* smoothing: every class of a valid row loses eps / C, the target 1 - eps */
    const float off = (float)(eps / (double)C), hit = (float)(1 - eps);
    for (int64_t j = j0; j < j1; j++) {
        int64_t r1 = (j + 1) * RL_CE_DB_ROWS < rows ? (j + 1) * RL_CE_DB_ROWS : rows;
        float *restrict acc = db ? (one ? db : scratch + j * C) : NULL;
        if (acc) memset(acc, 0, (size_t)C * sizeof *acc);
        for (int64_t r = j * RL_CE_DB_ROWS; r < r1; r++) {
            const float *restrict pr = p + r * C;
            if (dz16) {
                if (tgt[r] < 0)
                    memset(dz16 + r * ld, 0, (size_t)ld * sizeof *dz16);
                else
                    grad_row16(pr, tgt[r], C, off, hit, dz16 + r * ld, ld, acc);
                continue;
            }
            float *restrict dr = dz + r * C;
            if (tgt[r] < 0) {
                if (!accumulate) memset(dr, 0, (size_t)C * sizeof *dr);
            } else if (eps > 0) {
                RL_IVDEP
                for (int64_t c = 0; c < C; c++)
                    dr[c] = (accumulate ? dr[c] : 0.0f) + (pr[c] - off);
                dr[tgt[r]] -= hit;
            } else if (accumulate) {
                RL_IVDEP
                for (int64_t c = 0; c < C; c++)
                    dr[c] += pr[c];
                dr[tgt[r]] -= 1.0f;
            } else {
                RL_IVDEP
                for (int64_t c = 0; c < C; c++)
                    dr[c] = pr[c];
                dr[tgt[r]] -= 1.0f;
            }
            /* the row is still in L1/L2: a second loop keeps db the exact sum of dz's rows */
            if (acc && (accumulate || tgt[r] >= 0)) {
                RL_IVDEP
                for (int64_t c = 0; c < C; c++)
                    acc[c] += dr[c];
            }
        }
    }
}

typedef struct {
    int64_t rows, C;
    const float *z, *p, *bias;
    float *out, *db, *scratch;
    uint16_t *out16; /* rl_ce_grad_cpu_bf16: dz rounded, rows ld16 apart */
    int64_t ld16;
    const int32_t *tgt;
    double *stats;
    double eps;
    bool accumulate;
    rl_cpu_level level; /* read once per call: every part runs the same code */
} pass_job;

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void softmax_ce_avx512(const pass_job *j, int64_t r0, int64_t r1) {
    softmax_ce_body_f32(r0, r1, j->C, j->z, j->bias, j->out, j->tgt, j->eps, j->stats);
}
RL_TARGET_AVX2 static void softmax_ce_avx2(const pass_job *j, int64_t r0, int64_t r1) {
    softmax_ce_body_f32(r0, r1, j->C, j->z, j->bias, j->out, j->tgt, j->eps, j->stats);
}
RL_TARGET_AVX512 static void ce_grad_avx512(const pass_job *j, int64_t j0, int64_t j1) {
    ce_grad_body_f32(j0, j1, j->rows, j->C, j->p, j->tgt, j->eps, j->out, j->out16, j->ld16,
                     j->accumulate, j->db, j->scratch);
}
RL_TARGET_AVX2 static void ce_grad_avx2(const pass_job *j, int64_t j0, int64_t j1) {
    ce_grad_body_f32(j0, j1, j->rows, j->C, j->p, j->tgt, j->eps, j->out, j->out16, j->ld16,
                     j->accumulate, j->db, j->scratch);
}
#endif
RL_TARGET_BASE static void softmax_ce_base(const pass_job *j, int64_t r0, int64_t r1) {
    softmax_ce_body_f32(r0, r1, j->C, j->z, j->bias, j->out, j->tgt, j->eps, j->stats);
}
RL_TARGET_BASE static void ce_grad_base(const pass_job *j, int64_t j0, int64_t j1) {
    ce_grad_body_f32(j0, j1, j->rows, j->C, j->p, j->tgt, j->eps, j->out, j->out16, j->ld16,
                     j->accumulate, j->db, j->scratch);
}

static void softmax_part(void *ctx, int part, int parts) {
    const pass_job *j = ctx;
    int64_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts;
    switch (j->level) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: softmax_ce_avx512(j, r0, r1); return;
    case RL_CPU_AVX2: softmax_ce_avx2(j, r0, r1); return;
#endif
    default: softmax_ce_base(j, r0, r1); return;
    }
}

static void ce_grad_part(void *ctx, int part, int parts) {
    const pass_job *j = ctx;
    int64_t blocks = db_blocks(j->rows);
    int64_t j0 = blocks * part / parts, j1 = blocks * (part + 1) / parts;
    switch (j->level) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: ce_grad_avx512(j, j0, j1); return;
    case RL_CPU_AVX2: ce_grad_avx2(j, j0, j1); return;
#endif
    default: ce_grad_base(j, j0, j1); return;
    }
}

void rl_softmax_ce_cpu_f32(int64_t rows, int64_t C, const float *z, const float *bias, float *p,
                           const int32_t *tgt, double eps, double *row_stats, double *loss,
                           double *n_errors) {
    pass_job j = {.rows = rows,
                  .C = C,
                  .z = z,
                  .bias = bias,
                  .out = p,
                  .tgt = tgt,
                  .stats = row_stats,
                  .eps = eps,
                  .level = rl_cpu_level_get()};
    rl_cpu_parallel(pass_parts(rows, rows * C), softmax_part, &j);
    if (!tgt) return;
    double ls = 0, ne = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (tgt[r] < 0) continue;
        ls += row_stats[2 * r];
        ne += row_stats[2 * r + 1];
    }
    *loss = ls;
    *n_errors = ne;
}

int64_t rl_ce_grad_scratch_size(int64_t rows, int64_t C) {
    int64_t blocks = db_blocks(rows);
    return blocks > 1 ? blocks * C : 0;
}

/* the pass of rl_ce_grad_cpu_f32 (out16: rl_ce_grad_cpu_bf16's), then db from its blocks */
static void ce_grad(pass_job *j, float *db, float *scratch) {
    int64_t rows = j->rows, C = j->C, blocks = db_blocks(rows);
    j->db = db;
    j->scratch = scratch;
    j->level = rl_cpu_level_get();
    rl_cpu_parallel(pass_parts(blocks, rows * C), ce_grad_part, j);
    if (!db) return;
    if (blocks == 0) memset(db, 0, (size_t)C * sizeof *db);
    if (blocks <= 1) return;
    memcpy(db, scratch, (size_t)C * sizeof *db);
    for (int64_t b = 1; b < blocks; b++) {
        const float *restrict s = scratch + b * C;
        RL_IVDEP
        for (int64_t c = 0; c < C; c++)
            db[c] += s[c];
    }
}

void rl_ce_grad_cpu_f32(int64_t rows, int64_t C, const float *p, const int32_t *tgt, double eps,
                        float *dz, bool accumulate, float *db, float *scratch) {
    pass_job j = {
        .rows = rows, .C = C, .p = p, .out = dz, .tgt = tgt, .eps = eps, .accumulate = accumulate};
    ce_grad(&j, db, scratch);
}

void rl_ce_grad_cpu_bf16(int64_t rows, int64_t C, const float *p, const int32_t *tgt, double eps,
                         uint16_t *dz, float *db, float *scratch) {
    int64_t ld = rl_bf16_lhs_stride(C), mp = rl_bf16_lhs_size(rows, C) / ld;
    pass_job j = {.rows = rows, .C = C, .p = p, .out16 = dz, .ld16 = ld, .tgt = tgt, .eps = eps};
    ce_grad(&j, db, scratch);
    if (mp > rows) memset(dz + rows * ld, 0, sizeof *dz * (size_t)((mp - rows) * ld));
}

void rl_softmax_ce_cpu_f64(int64_t rows, int64_t C, const double *z, double *p, const int32_t *tgt,
                           double eps, double *loss, double *n_errors) {
    double ls = 0, ne = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *zr = z + r * C;
        double *pr = p + r * C;
        /* argmax as rl_op_reduce_dim: the first maximum, a NaN wins */
        double mx = zr[0];
        int64_t am = 0;
        for (int64_t c = 1; c < C; c++)
            if (zr[c] > mx || (zr[c] != zr[c] && mx == mx)) {
                mx = zr[c];
                am = c;
            }
        int32_t k = tgt ? tgt[r] : -1;
        double zk = k >= 0 ? zr[k] : 0.0, sum = 0, zmean = 0;
        if (k >= 0 && eps > 0) {
            for (int64_t c = 0; c < C; c++)
                zmean += zr[c];
            zmean /= (double)C;
        }
        for (int64_t c = 0; c < C; c++)
            sum += (pr[c] = exp(zr[c] - mx));
        for (int64_t c = 0; c < C; c++)
            pr[c] /= sum;
        if (k < 0) continue;
        double lse = mx + log(sum);
        ls += eps > 0 ? (1 - eps) * (lse - zk) + eps * (lse - zmean) : lse - zk;
        ne += am == k ? 0.0 : 1.0;
    }
    if (tgt) {
        *loss = ls;
        *n_errors = ne;
    }
}

void rl_ce_grad_cpu_f64(int64_t rows, int64_t C, const double *p, const int32_t *tgt, double eps,
                        double *dz, bool accumulate, double *db) {
    if (db) memset(db, 0, (size_t)C * sizeof *db);
    const double off = eps / (double)C;
    for (int64_t r = 0; r < rows; r++) {
        const double *pr = p + r * C;
        double *dr = dz + r * C;
        for (int64_t c = 0; c < C; c++)
            dr[c] = (accumulate ? dr[c] : 0.0) + (tgt[r] >= 0 ? pr[c] - off : 0.0);
        if (tgt[r] >= 0) dr[tgt[r]] -= 1.0 - eps;
        for (int64_t c = 0; db && c < C; c++)
            db[c] += dr[c];
    }
}
