/* The fused pointwise passes of an LSTM step on the CPU (see kernels/lstm.h for the layout
 * and kernels/lstm_cell.h for the formulas).
 *
 * One pass per step reads the step's pre-activations once and writes the gate activations,
 * the cell, the state and the output (forward), or the gate gradients and the state gradients
 * (backward); the bias and peephole gradients are one pass over all steps' gate gradients
 * afterwards. The float32 loops are compiled three times
 * (AVX-512, AVX2+FMA, baseline) and picked at run time (kernels/cpu/cpu_level.h), since a
 * portable build targets the baseline x86-64 and these loops are a fixed share of every step;
 * float64 serves the gradient checks and uses one baseline loop.
 */
#include <stdbool.h>
#include <string.h>

#include "../../core/blas.h"
#include "../lstm.h"
#include "../lstm_cell.h"
#include "../lstm_ln_row.h"
#include "cpu_level.h"
#include "parallel.h"

#define RL_INLINE static inline __attribute__((always_inline))

RL_INLINE void fwd_body_f32(bool has_peep, bool has_zo, int64_t B, int64_t H, int64_t t,
                            const int32_t *len, float *z, const float *bias,
                            const float *const *peep, const float *cp, const float *hp, float *c,
                            float *h, float *out, const rl_lstm_zo_f32 *zo) {
    const float *restrict bi = bias, *restrict bf = bias + H, *restrict bg = bias + 2 * H,
                          *restrict bo = bias + 3 * H;
    const float *restrict pi = has_peep ? peep[0] : NULL;
    const float *restrict pf = has_peep ? peep[1] : NULL;
    const float *restrict po = has_peep ? peep[2] : NULL;
    for (int64_t b = 0; b < B; b++) {
        const float *restrict cpr = cp + b * H;
        float *restrict cr = c + b * H, *restrict hr = h + b * H, *restrict outr = out + b * H;
        if (t >= len[b]) {
            memcpy(cr, cpr, (size_t)H * sizeof *cr);
            memcpy(hr, hp + b * H, (size_t)H * sizeof *hr);
            memset(outr, 0, (size_t)H * sizeof *outr);
            /* c~ of a padded row: the carried cell (p_o's gradient reads it, times dz_o = 0) */
            if (has_zo) memcpy(zo->ct + b * H, cpr, (size_t)H * sizeof *cr);
            continue;
        }
        float *restrict zi = z + b * 4 * H, *restrict zf = zi + H, *restrict zg = zi + 2 * H,
                        *restrict zo_ = zi + 3 * H;
        const float *restrict hpr = hp + b * H;
        const float *restrict mcr = has_zo && zo->mc ? zo->mc + b * H : NULL;
        const float *restrict mhr = has_zo && zo->mh ? zo->mh + b * H : NULL;
        float *restrict ctr = has_zo ? zo->ct + b * H : NULL;
        /* the row pointers never overlap; restrict on locals does not tell GCC so */
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float ii, ff, gg, oo, cc, hh;
            rl_lstm_cell_fwd_f32(zi[j] + bi[j], zf[j] + bf[j], zg[j] + bg[j], zo_[j] + bo[j],
                                 cpr[j], has_peep ? pi[j] : 0.0f, has_peep ? pf[j] : 0.0f,
                                 has_peep ? po[j] : 0.0f, &ii, &ff, &gg, &oo, &cc, &hh);
            if (has_zo) {
                ctr[j] = cc;
                if (mcr) cc = rl_zoneoutf(mcr[j], cpr[j], cc);
                if (mhr) hh = rl_zoneoutf(mhr[j], hpr[j], hh);
            }
            zi[j] = ii;
            zf[j] = ff;
            zg[j] = gg;
            zo_[j] = oo;
            cr[j] = cc;
            hr[j] = hh;
            outr[j] = hh;
        }
    }
}

RL_INLINE void bwd_body_f32(bool has_peep, bool has_zo, int64_t B, int64_t H, int64_t t,
                            const int32_t *len, float *z, const float *const *peep, const float *cp,
                            const float *c, const float *dout, int64_t dout_ld, float *dh,
                            float *dc, const rl_lstm_zo_f32 *zo) {
    const float *restrict pi = has_peep ? peep[0] : NULL;
    const float *restrict pf = has_peep ? peep[1] : NULL;
    const float *restrict po = has_peep ? peep[2] : NULL;
    for (int64_t b = 0; b < B; b++) {
        float *restrict zi = z + b * 4 * H, *restrict zf = zi + H, *restrict zg = zi + 2 * H,
                        *restrict zo_b = zi + 3 * H;
        if (t >= len[b]) {
            memset(zi, 0, (size_t)(4 * H) * sizeof *zi);
            continue;
        }
        const float *restrict cpr = cp + b * H, *restrict cr = c + b * H;
        const float *restrict dor = dout ? dout + b * dout_ld : NULL;
        float *restrict dhr = dh + b * H, *restrict dcr = dc + b * H;
        const float *restrict mcr = has_zo && zo->mc ? zo->mc + b * H : NULL;
        const float *restrict mhr = has_zo && zo->mh ? zo->mh + b * H : NULL;
        const float *restrict ctr = has_zo ? zo->ct + b * H : NULL;
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float dzi, dzf, dzg, dzo, dcp;
            float dhj = dhr[j] + (dor ? dor[j] : 0.0f), dcj = dcr[j];
            float mc = mcr ? mcr[j] : 0.0f, mh = mhr ? mhr[j] : 0.0f;
            /* with zoneout the cell sees (1 - m) of each state's gradient and c~ */
            rl_lstm_cell_bwd_f32(zi[j], zf[j], zg[j], zo_b[j], cpr[j], has_zo ? ctr[j] : cr[j],
                                 has_peep ? pi[j] : 0.0f, has_peep ? pf[j] : 0.0f,
                                 has_peep ? po[j] : 0.0f, has_zo ? rl_zoneout_newf(mh, dhj) : dhj,
                                 has_zo ? rl_zoneout_newf(mc, dcj) : dcj, &dzi, &dzf, &dzg, &dzo,
                                 &dcp);
            zi[j] = dzi;
            zf[j] = dzf;
            zg[j] = dzg;
            zo_b[j] = dzo;
            dcr[j] = has_zo ? dcp + rl_zoneout_prevf(mc, dcj) : dcp;
            dhr[j] = has_zo ? rl_zoneout_prevf(mh, dhj) : 0.0f;
        }
    }
}

/* The compilations of each float32 pass (AVX-512, AVX2+FMA, baseline); the peephole and zoneout
 * flags are constants in each call so that the loop without them carries no dead work. */
RL_INLINE void fwd_flags(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *bias, const float *const *peep, const float *cp,
                         const float *hp, float *c, float *h, float *out,
                         const rl_lstm_zo_f32 *zo) {
    if (peep && zo)
        fwd_body_f32(true, true, B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
    else if (peep)
        fwd_body_f32(true, false, B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
    else if (zo)
        fwd_body_f32(false, true, B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
    else
        fwd_body_f32(false, false, B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
}

RL_INLINE void bwd_flags(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *const *peep, const float *cp, const float *c,
                         const float *dout, int64_t dout_ld, float *dh, float *dc,
                         const rl_lstm_zo_f32 *zo) {
    if (peep && zo)
        bwd_body_f32(true, true, B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
    else if (peep)
        bwd_body_f32(true, false, B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
    else if (zo)
        bwd_body_f32(false, true, B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
    else
        bwd_body_f32(false, false, B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
}

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void fwd_avx512(int64_t B, int64_t H, int64_t t, const int32_t *len,
                                        float *z, const float *bias, const float *const *peep,
                                        const float *cp, const float *hp, float *c, float *h,
                                        float *out, const rl_lstm_zo_f32 *zo) {
    fwd_flags(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
}
RL_TARGET_AVX2 static void fwd_avx2(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                                    const float *bias, const float *const *peep, const float *cp,
                                    const float *hp, float *c, float *h, float *out,
                                    const rl_lstm_zo_f32 *zo) {
    fwd_flags(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
}
RL_TARGET_AVX512 static void bwd_avx512(int64_t B, int64_t H, int64_t t, const int32_t *len,
                                        float *z, const float *const *peep, const float *cp,
                                        const float *c, const float *dout, int64_t dout_ld,
                                        float *dh, float *dc, const rl_lstm_zo_f32 *zo) {
    bwd_flags(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
}
RL_TARGET_AVX2 static void bwd_avx2(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                                    const float *const *peep, const float *cp, const float *c,
                                    const float *dout, int64_t dout_ld, float *dh, float *dc,
                                    const rl_lstm_zo_f32 *zo) {
    bwd_flags(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
}
#endif

RL_TARGET_BASE static void fwd_base(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                                    const float *bias, const float *const *peep, const float *cp,
                                    const float *hp, float *c, float *h, float *out,
                                    const rl_lstm_zo_f32 *zo) {
    fwd_flags(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo);
}
RL_TARGET_BASE static void bwd_base(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                                    const float *const *peep, const float *cp, const float *c,
                                    const float *dout, int64_t dout_ld, float *dh, float *dc,
                                    const rl_lstm_zo_f32 *zo) {
    bwd_flags(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo);
}

void rl_lstm_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *bias, const float *const *peep, const float *cp,
                         const float *hp, float *c, float *h, float *out,
                         const rl_lstm_zo_f32 *zo) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: fwd_avx512(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo); return;
    case RL_CPU_AVX2: fwd_avx2(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo); return;
#endif
    default: fwd_base(B, H, t, len, z, bias, peep, cp, hp, c, h, out, zo); return;
    }
}

void rl_lstm_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *const *peep, const float *cp, const float *c,
                         const float *dout, int64_t dout_ld, float *dh, float *dc,
                         const rl_lstm_zo_f32 *zo) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: bwd_avx512(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo); return;
    case RL_CPU_AVX2: bwd_avx2(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo); return;
#endif
    default: bwd_base(B, H, t, len, z, peep, cp, c, dout, dout_ld, dh, dc, zo); return;
    }
}

/* Columns j0 .. j1-1 of each gate block (and of the peepholes); rows in memory order, columns
 * vectorised, so each column's sum has the same order whatever split ran it. */
RL_TARGET_BASE static void param_grads_cols(int64_t rows, int64_t H, int64_t j0, int64_t j1,
                                            const float *dz, const float *cp, const float *c,
                                            float *db, float *const *dpeep) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict zr = dz + r * 4 * H;
        for (int g = 0; g < 4; g++) {
            float *restrict dbg = db + g * H;
            const float *restrict zg = zr + g * H;
            RL_IVDEP
            for (int64_t j = j0; j < j1; j++)
                dbg[j] += zg[j];
        }
        if (!dpeep) continue;
        const float *restrict cpr = cp + r * H, *restrict cr = c + r * H;
        float *restrict dpi = dpeep[0], *restrict dpf = dpeep[1], *restrict dpo = dpeep[2];
        RL_IVDEP
        for (int64_t j = j0; j < j1; j++) {
            dpi[j] += zr[j] * cpr[j];
            dpf[j] += zr[H + j] * cpr[j];
            dpo[j] += zr[3 * H + j] * cr[j];
        }
    }
}

typedef struct {
    int64_t rows, H;
    const float *dz, *cp, *c;
    float *db;
    float *const *dpeep;
} grads_job;

/* Part `part` of `parts`: a range of columns, cut at multiples of 16 (whole vectors). */
static void grads_part(void *ctx, int part, int parts) {
    const grads_job *j = ctx;
    int64_t j0 = j->H * part / parts / 16 * 16, j1 = j->H * (part + 1) / parts / 16 * 16;
    if (part == parts - 1) j1 = j->H;
    if (j0 < j1) param_grads_cols(j->rows, j->H, j0, j1, j->dz, j->cp, j->c, j->db, j->dpeep);
}

/* A serial pass over all frames' dZ would be a fixed share of a step that the BLAS threads
 * leave idle: with several threads it is split by columns (the same sums, see above). */
void rl_lstm_cpu_param_grads_f32(int64_t rows, int64_t H, const float *dz, const float *cp,
                                 const float *c, float *db, float *const *dpeep) {
    grads_job j = {rows, H, dz, cp, c, db, dpeep};
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > H / 16) parts = (int)(H / 16);
    if (parts > 1 && rows * 4 * H >= (1 << 16))
        rl_cpu_parallel(parts, grads_part, &j);
    else
        param_grads_cols(rows, H, 0, H, dz, cp, c, db, dpeep);
}

void rl_lstm_cpu_param_grads_f64(int64_t rows, int64_t H, const double *dz, const double *cp,
                                 const double *c, double *db, double *const *dpeep) {
    for (int64_t r = 0; r < rows; r++) {
        const double *zr = dz + r * 4 * H;
        for (int64_t j = 0; j < 4 * H; j++)
            db[j] += zr[j];
        if (!dpeep) continue;
        for (int64_t j = 0; j < H; j++) {
            dpeep[0][j] += zr[j] * cp[r * H + j];
            dpeep[1][j] += zr[H + j] * cp[r * H + j];
            dpeep[2][j] += zr[3 * H + j] * c[r * H + j];
        }
    }
}

void rl_lstm_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                         const double *bias, const double *const *peep, const double *cp,
                         const double *hp, double *c, double *h, double *out,
                         const rl_lstm_zo_f64 *zo) {
    for (int64_t b = 0; b < B; b++) {
        const double *cpr = cp + b * H;
        double *cr = c + b * H, *hr = h + b * H, *outr = out + b * H;
        if (t >= len[b]) {
            memcpy(cr, cpr, (size_t)H * sizeof *cr);
            memcpy(hr, hp + b * H, (size_t)H * sizeof *hr);
            memset(outr, 0, (size_t)H * sizeof *outr);
            if (zo) memcpy(zo->ct + b * H, cpr, (size_t)H * sizeof *cr);
            continue;
        }
        double *zr = z + b * 4 * H;
        for (int64_t j = 0; j < H; j++) {
            double *zi = zr + j, *zf = zr + H + j, *zg = zr + 2 * H + j, *zog = zr + 3 * H + j;
            rl_lstm_cell_fwd_f64(*zi + bias[j], *zf + bias[H + j], *zg + bias[2 * H + j],
                                 *zog + bias[3 * H + j], cpr[j], peep ? peep[0][j] : 0.0,
                                 peep ? peep[1][j] : 0.0, peep ? peep[2][j] : 0.0, zi, zf, zg, zog,
                                 &cr[j], &hr[j]);
            if (zo) {
                int64_t e = b * H + j;
                zo->ct[e] = cr[j];
                if (zo->mc) cr[j] = rl_zoneout(zo->mc[e], cpr[j], cr[j]);
                if (zo->mh) hr[j] = rl_zoneout(zo->mh[e], hp[e], hr[j]);
            }
            outr[j] = hr[j];
        }
    }
}

void rl_lstm_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                         const double *const *peep, const double *cp, const double *c,
                         const double *dout, int64_t dout_ld, double *dh, double *dc,
                         const rl_lstm_zo_f64 *zo) {
    for (int64_t b = 0; b < B; b++) {
        double *zr = z + b * 4 * H;
        if (t >= len[b]) {
            memset(zr, 0, (size_t)(4 * H) * sizeof *zr);
            continue;
        }
        const double *cpr = cp + b * H, *cr = c + b * H;
        double *dhr = dh + b * H, *dcr = dc + b * H;
        for (int64_t j = 0; j < H; j++) {
            double *zi = zr + j, *zf = zr + H + j, *zg = zr + 2 * H + j, *zog = zr + 3 * H + j;
            double dhj = dhr[j] + (dout ? dout[b * dout_ld + j] : 0.0), dcj = dcr[j];
            int64_t e = b * H + j;
            double mc = zo && zo->mc ? zo->mc[e] : 0.0, mh = zo && zo->mh ? zo->mh[e] : 0.0;
            /* with zoneout the cell sees (1 - m) of each state's gradient and c~ */
            rl_lstm_cell_bwd_f64(*zi, *zf, *zg, *zog, cpr[j], zo ? zo->ct[e] : cr[j],
                                 peep ? peep[0][j] : 0.0, peep ? peep[1][j] : 0.0,
                                 peep ? peep[2][j] : 0.0, rl_zoneout_new(mh, dhj),
                                 rl_zoneout_new(mc, dcj), zi, zf, zg, zog, &dcr[j]);
            dcr[j] += rl_zoneout_prev(mc, dcj);
            dhr[j] = rl_zoneout_prev(mh, dhj);
        }
    }
}

/* ---------------------------------------------------------------- layer_norm (kernels/lstm.h) */

/* The layer_norm step kernels' bodies in one precision, REAL float (S f32) or double (S f64): one
 * body for both, the same formulas in the same order */
#define RL_LSTM_LN_CPU(REAL, S)                                                                    \
    RL_INLINE void ln_fwd_##S(int64_t B, int64_t H, int64_t t, const int32_t *len, REAL *z,        \
                              const REAL *bias, const REAL *cp, const REAL *hp, REAL *c, REAL *h,  \
                              REAL *out, const rl_lstm_ln_##S *ln) {                               \
        for (int64_t b = 0; b < B; b++)                                                            \
            rl_lstm_ln_row_fwd_##S(H, b, t < len[b], z, bias, cp, hp, c, h, out, ln);              \
    }                                                                                              \
                                                                                                   \
    RL_INLINE void ln_bwd_##S(int64_t B, int64_t H, int64_t t, const int32_t *len, REAL *z,        \
                              const REAL *cp, const REAL *c, const REAL *dout, int64_t dout_ld,    \
                              REAL *dh, REAL *dc, const rl_lstm_ln_##S *ln) {                      \
        for (int64_t b = 0; b < B; b++)                                                            \
            rl_lstm_ln_row_bwd_##S(H, b, t < len[b], z, cp, c, dout ? dout + b * dout_ld : NULL,   \
                                   dh, dc, ln);                                                    \
    }                                                                                              \
                                                                                                   \
    RL_INLINE void ln_param_grads_##S(int64_t rows, int64_t H, const rl_lstm_ln_##S *ln,           \
                                      REAL *restrict db, REAL *restrict dgx, REAL *restrict dgh,   \
                                      REAL *restrict dgc, REAL *restrict dbc) {                    \
        for (int64_t r = 0; r < rows; r++) {                                                       \
            const REAL *restrict dg = ln->dg + r * 4 * H, *restrict xh = ln->xh + r * 4 * H,       \
                                 *restrict hh = ln->hh + r * 4 * H;                                \
            const REAL *restrict du = ln->du + r * H, *restrict cn = ln->cn + r * H;               \
            RL_IVDEP                                                                               \
            for (int64_t e = 0; e < 4 * H; e++) {                                                  \
                db[e] += dg[e];                                                                    \
                dgx[e] += dg[e] * xh[e];                                                           \
                dgh[e] += dg[e] * hh[e];                                                           \
            }                                                                                      \
            RL_IVDEP                                                                               \
            for (int64_t j = 0; j < H; j++) {                                                      \
                dgc[j] += du[j] * cn[j];                                                           \
                dbc[j] += du[j];                                                                   \
            }                                                                                      \
        }                                                                                          \
    }

RL_LSTM_LN_CPU(float, f32)
RL_LSTM_LN_CPU(double, f64)

/* float32 at every level (the sums of kernels/pointwise.h's rl_ln_* vectorise there); float64 (the
 * gradient checks) once */
RL_CPU_LEVELS(rl_lstm_ln_cpu_fwd_f32, ln_fwd_f32,
              (int64_t B, int64_t H, int64_t t, const int32_t *len, float *z, const float *bias,
               const float *cp, const float *hp, float *c, float *h, float *out,
               const rl_lstm_ln_f32 *ln),
              (B, H, t, len, z, bias, cp, hp, c, h, out, ln))
RL_CPU_LEVELS(rl_lstm_ln_cpu_bwd_f32, ln_bwd_f32,
              (int64_t B, int64_t H, int64_t t, const int32_t *len, float *z, const float *cp,
               const float *c, const float *dout, int64_t dout_ld, float *dh, float *dc,
               const rl_lstm_ln_f32 *ln),
              (B, H, t, len, z, cp, c, dout, dout_ld, dh, dc, ln))
RL_CPU_LEVELS(rl_lstm_ln_cpu_param_grads_f32, ln_param_grads_f32,
              (int64_t rows, int64_t H, const rl_lstm_ln_f32 *ln, float *db, float *dgx, float *dgh,
               float *dgc, float *dbc),
              (rows, H, ln, db, dgx, dgh, dgc, dbc))

void rl_lstm_ln_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                            const double *bias, const double *cp, const double *hp, double *c,
                            double *h, double *out, const rl_lstm_ln_f64 *ln) {
    ln_fwd_f64(B, H, t, len, z, bias, cp, hp, c, h, out, ln);
}
void rl_lstm_ln_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                            const double *cp, const double *c, const double *dout, int64_t dout_ld,
                            double *dh, double *dc, const rl_lstm_ln_f64 *ln) {
    ln_bwd_f64(B, H, t, len, z, cp, c, dout, dout_ld, dh, dc, ln);
}
void rl_lstm_ln_cpu_param_grads_f64(int64_t rows, int64_t H, const rl_lstm_ln_f64 *ln, double *db,
                                    double *dgx, double *dgh, double *dgc, double *dbc) {
    ln_param_grads_f64(rows, H, ln, db, dgx, dgh, dgc, dbc);
}
