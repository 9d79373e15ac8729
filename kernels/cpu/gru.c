/* The fused pointwise passes of a GRU step on the CPU (see kernels/gru.h for the layout and
 * kernels/gru_cell.h for the formulas).
 *
 * One pass per step reads the step's pre-activations once and writes the gate activations, the
 * state and the output (forward), or the gate gradients, the state gradient and the bias
 * gradients (backward, in the same loop). The float32 loops are compiled three times (AVX-512,
 * AVX2+FMA, baseline) and picked at run time (kernels/cpu/cpu_level.h), as the lstm's are;
 * float64 serves the gradient checks and uses one baseline loop.
 */
#include <stdbool.h>
#include <string.h>

#include "../gru.h"
#include "../gru_cell.h"
#include "../gru_ln_row.h"
#include "cpu_level.h"

#define RL_INLINE static inline __attribute__((always_inline))

/* zo: whether mh (the zoneout weights, kernels/gru.h) is given; a constant in each call, so the
 * loop without zoneout carries no dead work. */
RL_INLINE void fwd_body_f32(bool zo, int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                            const float *b, const float *bh, const float *hp, float *h, float *out,
                            const float *mh) {
    const float *restrict br = b, *restrict bz = b + H, *restrict bn = b + 2 * H;
    const float *restrict hr = bh, *restrict hz = bh + H, *restrict hn = bh + 2 * H;
    for (int64_t i = 0; i < B; i++) {
        const float *restrict hpr = hp + i * H;
        float *restrict hrow = h + i * H, *restrict orow = out + i * H;
        if (t >= len[i]) {
            memcpy(hrow, hpr, (size_t)H * sizeof *hrow);
            memset(orow, 0, (size_t)H * sizeof *orow);
            continue;
        }
        float *restrict gr = g + i * 4 * H, *restrict gz = gr + H, *restrict gh = gr + 2 * H,
                        *restrict gn = gr + 3 * H;
        const float *restrict mr = zo ? mh + i * H : NULL;
        /* the row pointers never overlap; restrict on locals does not tell GCC so */
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float r, z, n, hh, hnj = gh[j] + hn[j];
            rl_gru_cell_fwd_f32(gr[j] + br[j] + hr[j], gz[j] + bz[j] + hz[j], gn[j] + bn[j], hnj,
                                hpr[j], &r, &z, &n, &hh);
            if (zo) hh = rl_zoneoutf(mr[j], hpr[j], hh);
            gr[j] = r;
            gz[j] = z;
            gh[j] = hnj;
            gn[j] = n;
            hrow[j] = hh;
            orow[j] = hh;
        }
    }
}

/* sums: whether db and dbh are given (a constant in each call, so the loop without them carries
 * no dead additions) */
RL_INLINE void bwd_body_f32(bool sums, bool zo, int64_t B, int64_t H, int64_t t, const int32_t *len,
                            float *g, const float *hp, const float *dout, int64_t dout_ld,
                            float *dh, float *db, float *dbh, const float *mh) {
    float *restrict dbr = db, *restrict dbz = sums ? db + H : NULL,
                    *restrict dbn = sums ? db + 2 * H : NULL;
    float *restrict dhr_ = dbh, *restrict dhz_ = sums ? dbh + H : NULL,
                    *restrict dhn_ = sums ? dbh + 2 * H : NULL;
    for (int64_t i = 0; i < B; i++) {
        float *restrict gr = g + i * 4 * H, *restrict gz = gr + H, *restrict gh = gr + 2 * H,
                        *restrict gn = gr + 3 * H;
        if (t >= len[i]) {
            memset(gr, 0, (size_t)(4 * H) * sizeof *gr);
            continue;
        }
        const float *restrict hpr = hp + i * H;
        const float *restrict dor = dout ? dout + i * dout_ld : NULL;
        float *restrict dhr = dh + i * H;
        const float *restrict mr = zo ? mh + i * H : NULL;
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float dar, daz, dan, dhn, dhp;
            float dhj = dhr[j] + (dor ? dor[j] : 0.0f);
            /* with zoneout the cell sees (1 - m) of the state's gradient */
            rl_gru_cell_bwd_f32(gr[j], gz[j], gn[j], gh[j], hpr[j],
                                zo ? rl_zoneout_newf(mr[j], dhj) : dhj, &dar, &daz, &dan, &dhn,
                                &dhp);
            gr[j] = dar;
            gz[j] = daz;
            gh[j] = dhn;
            gn[j] = dan;
            dhr[j] = zo ? dhp + rl_zoneout_prevf(mr[j], dhj) : dhp;
            if (sums) {
                dbr[j] += dar;
                dbz[j] += daz;
                dbn[j] += dan;
                dhr_[j] += dar;
                dhz_[j] += daz;
                dhn_[j] += dhn;
            }
        }
    }
}

RL_INLINE void fwd_flags(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                         const float *b, const float *bh, const float *hp, float *h, float *out,
                         const float *mh) {
    if (mh)
        fwd_body_f32(true, B, H, t, len, g, b, bh, hp, h, out, mh);
    else
        fwd_body_f32(false, B, H, t, len, g, b, bh, hp, h, out, NULL);
}

RL_INLINE void bwd_flags(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                         const float *hp, const float *dout, int64_t dout_ld, float *dh, float *db,
                         float *dbh, const float *mh) {
    bool sums = db && dbh;
    if (sums && mh)
        bwd_body_f32(true, true, B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh);
    else if (sums)
        bwd_body_f32(true, false, B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, NULL);
    else if (mh)
        bwd_body_f32(false, true, B, H, t, len, g, hp, dout, dout_ld, dh, NULL, NULL, mh);
    else
        bwd_body_f32(false, false, B, H, t, len, g, hp, dout, dout_ld, dh, NULL, NULL, NULL);
}

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void fwd_avx512(int64_t B, int64_t H, int64_t t, const int32_t *len,
                                        float *g, const float *b, const float *bh, const float *hp,
                                        float *h, float *out, const float *mh) {
    fwd_flags(B, H, t, len, g, b, bh, hp, h, out, mh);
}
RL_TARGET_AVX2 static void fwd_avx2(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                                    const float *b, const float *bh, const float *hp, float *h,
                                    float *out, const float *mh) {
    fwd_flags(B, H, t, len, g, b, bh, hp, h, out, mh);
}
RL_TARGET_AVX512 static void bwd_avx512(int64_t B, int64_t H, int64_t t, const int32_t *len,
                                        float *g, const float *hp, const float *dout,
                                        int64_t dout_ld, float *dh, float *db, float *dbh,
                                        const float *mh) {
    bwd_flags(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh);
}
RL_TARGET_AVX2 static void bwd_avx2(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                                    const float *hp, const float *dout, int64_t dout_ld, float *dh,
                                    float *db, float *dbh, const float *mh) {
    bwd_flags(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh);
}
#endif

RL_TARGET_BASE static void fwd_base(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                                    const float *b, const float *bh, const float *hp, float *h,
                                    float *out, const float *mh) {
    fwd_flags(B, H, t, len, g, b, bh, hp, h, out, mh);
}
RL_TARGET_BASE static void bwd_base(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                                    const float *hp, const float *dout, int64_t dout_ld, float *dh,
                                    float *db, float *dbh, const float *mh) {
    bwd_flags(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh);
}

void rl_gru_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                        const float *b, const float *bh, const float *hp, float *h, float *out,
                        const float *mh) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: fwd_avx512(B, H, t, len, g, b, bh, hp, h, out, mh); return;
    case RL_CPU_AVX2: fwd_avx2(B, H, t, len, g, b, bh, hp, h, out, mh); return;
#endif
    default: fwd_base(B, H, t, len, g, b, bh, hp, h, out, mh); return;
    }
}

void rl_gru_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                        const float *hp, const float *dout, int64_t dout_ld, float *dh, float *db,
                        float *dbh, const float *mh) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: bwd_avx512(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh); return;
    case RL_CPU_AVX2: bwd_avx2(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh); return;
#endif
    default: bwd_base(B, H, t, len, g, hp, dout, dout_ld, dh, db, dbh, mh); return;
    }
}

void rl_gru_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                        const double *b, const double *bh, const double *hp, double *h, double *out,
                        const double *mh) {
    for (int64_t i = 0; i < B; i++) {
        const double *hpr = hp + i * H;
        double *hrow = h + i * H, *orow = out + i * H;
        if (t >= len[i]) {
            memcpy(hrow, hpr, (size_t)H * sizeof *hrow);
            memset(orow, 0, (size_t)H * sizeof *orow);
            continue;
        }
        double *gr = g + i * 4 * H, *gz = gr + H, *gh = gr + 2 * H, *gn = gr + 3 * H;
        for (int64_t j = 0; j < H; j++) {
            double hnj = gh[j] + bh[2 * H + j];
            rl_gru_cell_fwd_f64(gr[j] + b[j] + bh[j], gz[j] + b[H + j] + bh[H + j],
                                gn[j] + b[2 * H + j], hnj, hpr[j], &gr[j], &gz[j], &gn[j],
                                &hrow[j]);
            if (mh) hrow[j] = rl_zoneout(mh[i * H + j], hpr[j], hrow[j]);
            gh[j] = hnj;
            orow[j] = hrow[j];
        }
    }
}

void rl_gru_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                        const double *hp, const double *dout, int64_t dout_ld, double *dh,
                        double *db, double *dbh, const double *mh) {
    for (int64_t i = 0; i < B; i++) {
        double *gr = g + i * 4 * H, *gz = gr + H, *gh = gr + 2 * H, *gn = gr + 3 * H;
        if (t >= len[i]) {
            memset(gr, 0, (size_t)(4 * H) * sizeof *gr);
            continue;
        }
        const double *hpr = hp + i * H;
        double *dhr = dh + i * H;
        for (int64_t j = 0; j < H; j++) {
            double dhj = dhr[j] + (dout ? dout[i * dout_ld + j] : 0.0);
            double m = mh ? mh[i * H + j] : 0.0;
            rl_gru_cell_bwd_f64(gr[j], gz[j], gn[j], gh[j], hpr[j], rl_zoneout_new(m, dhj), &gr[j],
                                &gz[j], &gn[j], &gh[j], &dhr[j]);
            if (mh) dhr[j] += rl_zoneout_prev(m, dhj);
            if (db) {
                db[j] += gr[j];
                db[H + j] += gz[j];
                db[2 * H + j] += gn[j];
            }
            if (dbh) {
                dbh[j] += gr[j];
                dbh[H + j] += gz[j];
                dbh[2 * H + j] += gh[j];
            }
        }
    }
}

/* Rows in memory order, columns vectorised: the same sums whatever split the steps ran in. */
RL_TARGET_BASE void rl_gru_cpu_bias_grads_f32(int64_t rows, int64_t H, const float *g, float *db,
                                              float *dbh) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gr = g + r * 4 * H, *restrict gn = gr + 3 * H;
        float *restrict b = db, *restrict bh = dbh;
        RL_IVDEP
        for (int64_t j = 0; j < 2 * H; j++) {
            b[j] += gr[j];
            bh[j] += gr[j];
        }
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            b[2 * H + j] += gn[j];
            bh[2 * H + j] += gr[2 * H + j];
        }
    }
}

/* ---------------------------------------------------------------- layer_norm (kernels/gru.h) */

/* The layer_norm step kernels' bodies in one precision, REAL float (S f32) or double (S f64): one
 * body for both, the same formulas in the same order */
#define RL_GRU_LN_CPU(REAL, S)                                                                     \
    RL_INLINE void ln_fwd_##S(int64_t B, int64_t H, int64_t t, const int32_t *len, REAL *g,        \
                              const rl_gru_ln_##S *ln) {                                           \
        for (int64_t b = 0; b < B; b++)                                                            \
            rl_gru_ln_row_fwd_##S(H, b, t < len[b], g, ln);                                        \
    }                                                                                              \
                                                                                                   \
    RL_INLINE void ln_bwd_##S(int64_t B, int64_t H, int64_t t, const int32_t *len, REAL *g,        \
                              const rl_gru_ln_##S *ln) {                                           \
        for (int64_t b = 0; b < B; b++)                                                            \
            rl_gru_ln_row_bwd_##S(H, b, t < len[b], g, ln);                                        \
    }                                                                                              \
                                                                                                   \
    RL_INLINE void ln_param_grads_##S(int64_t rows, int64_t H, const rl_gru_ln_##S *ln,            \
                                      REAL *restrict db, REAL *restrict dbh, REAL *restrict dgx,   \
                                      REAL *restrict dgh) {                                        \
        for (int64_t r = 0; r < rows; r++) {                                                       \
            const REAL *restrict dg = ln->dg + r * 4 * H, *restrict xh = ln->xh + r * 3 * H,       \
                                 *restrict hh = ln->hh + r * 3 * H;                                \
            RL_IVDEP                                                                               \
            for (int64_t e = 0; e < 2 * H; e++) {                                                  \
                db[e] += dg[e];                                                                    \
                dbh[e] += dg[e];                                                                   \
                dgx[e] += dg[e] * xh[e];                                                           \
                dgh[e] += dg[e] * hh[e];                                                           \
            }                                                                                      \
            RL_IVDEP                                                                               \
            for (int64_t j = 0; j < H; j++) {                                                      \
                db[2 * H + j] += dg[3 * H + j];                                                    \
                dbh[2 * H + j] += dg[2 * H + j];                                                   \
                dgx[2 * H + j] += dg[3 * H + j] * xh[2 * H + j];                                   \
                dgh[2 * H + j] += dg[2 * H + j] * hh[2 * H + j];                                   \
            }                                                                                      \
        }                                                                                          \
    }

RL_GRU_LN_CPU(float, f32)
RL_GRU_LN_CPU(double, f64)

/* float32 at every level (the sums of kernels/pointwise.h's rl_ln_* vectorise there); float64 (the
 * gradient checks) once */
RL_CPU_LEVELS(rl_gru_ln_cpu_fwd_f32, ln_fwd_f32,
              (int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
               const rl_gru_ln_f32 *ln),
              (B, H, t, len, g, ln))
RL_CPU_LEVELS(rl_gru_ln_cpu_bwd_f32, ln_bwd_f32,
              (int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
               const rl_gru_ln_f32 *ln),
              (B, H, t, len, g, ln))
RL_CPU_LEVELS(rl_gru_ln_cpu_param_grads_f32, ln_param_grads_f32,
              (int64_t rows, int64_t H, const rl_gru_ln_f32 *ln, float *db, float *dbh, float *dgx,
               float *dgh),
              (rows, H, ln, db, dbh, dgx, dgh))

void rl_gru_ln_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                           const rl_gru_ln_f64 *ln) {
    ln_fwd_f64(B, H, t, len, g, ln);
}
void rl_gru_ln_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                           const rl_gru_ln_f64 *ln) {
    ln_bwd_f64(B, H, t, len, g, ln);
}
void rl_gru_ln_cpu_param_grads_f64(int64_t rows, int64_t H, const rl_gru_ln_f64 *ln, double *db,
                                   double *dbh, double *dgx, double *dgh) {
    ln_param_grads_f64(rows, H, ln, db, dbh, dgx, dgh);
}
