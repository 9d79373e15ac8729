/* The fused pointwise passes of an MDLSTM diagonal on the CPU (see kernels/mdlstm.h for the
 * layout and kernels/mdlstm_cell.h for the formulas).
 *
 * One pass per direction and diagonal reads each cell's pre-activations once and writes the
 * gate activations, the cell and the state (forward), or the gate gradients and the cell
 * gradients passed to both predecessors (backward). The float32 loops are compiled three times
 * (AVX-512, AVX2+FMA, baseline) and picked at run time (kernels/cpu/cpu_level.h), as the LSTM's
 * are; the cell type is a constant in each inlined body, so the standard cell's loop carries
 * no stable-cell arithmetic. float64 serves the gradient checks.
 */
#include <string.h>

#include "../mdlstm.h"
#include "../mdlstm_cell.h"
#include "cpu_level.h"

#define RL_INLINE static inline __attribute__((always_inline))

RL_INLINE void fwd_body_f32(bool stable, int64_t n, int64_t D, const int64_t *pos,
                            const int64_t *up, const int64_t *left, float *z, int64_t ldz,
                            const float *r, const float *bias, float *c, float *h, int64_t ldh) {
    for (int64_t k = 0; k < n; k++) {
        float *restrict z1 = z + pos[k] * ldz, *restrict z2 = z1 + D, *restrict z3 = z1 + 2 * D,
                        *restrict z4 = z1 + 3 * D, *restrict z5 = z1 + 4 * D;
        const float *restrict rk = r + k * 5 * D;
        /* a missing predecessor contributes a zero state; cells with both predecessors (all
         * but an image's first row and column) get the loop without the tests */
        const float *restrict cu = up[k] >= 0 ? c + up[k] * ldh : NULL;
        const float *restrict cl = left[k] >= 0 ? c + left[k] * ldh : NULL;
        float *restrict cr = c + pos[k] * ldh, *restrict hr = h + pos[k] * ldh;
        if (cu && cl) {
            RL_IVDEP
            for (int64_t j = 0; j < D; j++) {
                float a1 = z1[j] + rk[j] + bias[j], a2 = z2[j] + rk[D + j] + bias[D + j],
                      a3 = z3[j] + rk[2 * D + j] + bias[2 * D + j],
                      a4 = z4[j] + rk[3 * D + j] + bias[3 * D + j],
                      a5 = z5[j] + rk[4 * D + j] + bias[4 * D + j];
                rl_mdlstm_cell_fwd_f32(stable, &a1, &a2, &a3, &a4, &a5, cu[j], cl[j], &cr[j],
                                       &hr[j]);
                z1[j] = a1;
                z2[j] = a2;
                z3[j] = a3;
                z4[j] = a4;
                z5[j] = a5;
            }
        } else {
            for (int64_t j = 0; j < D; j++) {
                float a1 = z1[j] + rk[j] + bias[j], a2 = z2[j] + rk[D + j] + bias[D + j],
                      a3 = z3[j] + rk[2 * D + j] + bias[2 * D + j],
                      a4 = z4[j] + rk[3 * D + j] + bias[3 * D + j],
                      a5 = z5[j] + rk[4 * D + j] + bias[4 * D + j];
                rl_mdlstm_cell_fwd_f32(stable, &a1, &a2, &a3, &a4, &a5, cu ? cu[j] : 0.0f,
                                       cl ? cl[j] : 0.0f, &cr[j], &hr[j]);
                z1[j] = a1;
                z2[j] = a2;
                z3[j] = a3;
                z4[j] = a4;
                z5[j] = a5;
            }
        }
    }
}

RL_INLINE void bwd_body_f32(bool stable, int64_t n, int64_t D, const int64_t *pos,
                            const int64_t *up, const int64_t *left, const int64_t *down,
                            const int64_t *right, const int64_t *dn, const int64_t *rt, float *z,
                            int64_t ldz, float *dz, const float *pnext, const float *dout,
                            int64_t ldo, const float *c, float *dcu, float *dcl, int64_t ldh,
                            float *db) {
    float *restrict b1 = db, *restrict b2 = db + D, *restrict b3 = db + 2 * D,
                    *restrict b4 = db + 3 * D, *restrict b5 = db + 4 * D;
    for (int64_t k = 0; k < n; k++) {
        float *restrict z1 = z + pos[k] * ldz, *restrict z2 = z1 + D, *restrict z3 = z1 + 2 * D,
                        *restrict z4 = z1 + 3 * D, *restrict z5 = z1 + 4 * D;
        float *restrict d1 = dz + k * 5 * D, *restrict d2 = d1 + D, *restrict d3 = d1 + 2 * D,
                        *restrict d4 = d1 + 3 * D, *restrict d5 = d1 + 4 * D;
        const float *restrict hd = dn[k] >= 0 ? pnext + dn[k] * 2 * D : NULL;
        const float *restrict hr = rt[k] >= 0 ? pnext + rt[k] * 2 * D + D : NULL;
        const float *restrict dor = dout ? dout + pos[k] * ldo : NULL;
        const float *restrict cu = up[k] >= 0 ? c + up[k] * ldh : NULL;
        const float *restrict cl = left[k] >= 0 ? c + left[k] * ldh : NULL;
        const float *restrict cr = c + pos[k] * ldh;
        const float *restrict gd = down[k] >= 0 ? dcu + down[k] * ldh : NULL;
        const float *restrict gr = right[k] >= 0 ? dcl + right[k] * ldh : NULL;
        float *restrict ou = dcu + pos[k] * ldh, *restrict ol = dcl + pos[k] * ldh;
        RL_IVDEP
        for (int64_t j = 0; j < D; j++) {
            float a1 = z1[j], a2 = z2[j], a3 = z3[j], a4 = z4[j], a5 = z5[j];
            float dhj = (dor ? dor[j] : 0.0f) + (hd ? hd[j] : 0.0f) + (hr ? hr[j] : 0.0f);
            float dcj = (gd ? gd[j] : 0.0f) + (gr ? gr[j] : 0.0f);
            rl_mdlstm_cell_bwd_f32(stable, &a1, &a2, &a3, &a4, &a5, cu ? cu[j] : 0.0f,
                                   cl ? cl[j] : 0.0f, cr[j], dhj, dcj, &ou[j], &ol[j]);
            z1[j] = d1[j] = a1;
            z2[j] = d2[j] = a2;
            z3[j] = d3[j] = a3;
            z4[j] = d4[j] = a4;
            z5[j] = d5[j] = a5;
            b1[j] += a1;
            b2[j] += a2;
            b3[j] += a3;
            b4[j] += a4;
            b5[j] += a5;
        }
    }
}

/* The three compilations of each float32 pass (see the top of the file). */
#define FWD_ARGS                                                                                   \
    bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up, const int64_t *left, \
        float *z, int64_t ldz, const float *r, const float *bias, float *c, float *h, int64_t ldh
#define BWD_ARGS                                                                                   \
    bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up, const int64_t *left, \
        const int64_t *down, const int64_t *right, const int64_t *dn, const int64_t *rt, float *z, \
        int64_t ldz, float *dz, const float *pnext, const float *dout, int64_t ldo,                \
        const float *c, float *dcu, float *dcl, int64_t ldh, float *db
#define FWD_CALL(st) fwd_body_f32(st, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh)
#define BWD_CALL(st)                                                                               \
    bwd_body_f32(st, n, D, pos, up, left, down, right, dn, rt, z, ldz, dz, pnext, dout, ldo, c,    \
                 dcu, dcl, ldh, db)

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void fwd_avx512(FWD_ARGS) {
    if (stable)
        FWD_CALL(true);
    else
        FWD_CALL(false);
}

RL_TARGET_AVX2 static void fwd_avx2(FWD_ARGS) {
    if (stable)
        FWD_CALL(true);
    else
        FWD_CALL(false);
}

RL_TARGET_AVX512 static void bwd_avx512(BWD_ARGS) {
    if (stable)
        BWD_CALL(true);
    else
        BWD_CALL(false);
}

RL_TARGET_AVX2 static void bwd_avx2(BWD_ARGS) {
    if (stable)
        BWD_CALL(true);
    else
        BWD_CALL(false);
}
#endif

RL_TARGET_BASE static void fwd_base(FWD_ARGS) {
    if (stable)
        FWD_CALL(true);
    else
        FWD_CALL(false);
}

RL_TARGET_BASE static void bwd_base(BWD_ARGS) {
    if (stable)
        BWD_CALL(true);
    else
        BWD_CALL(false);
}

void rl_mdlstm_cpu_fwd_f32(FWD_ARGS) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: fwd_avx512(stable, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh); return;
    case RL_CPU_AVX2: fwd_avx2(stable, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh); return;
#endif
    default: fwd_base(stable, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh); return;
    }
}

void rl_mdlstm_cpu_bwd_f32(BWD_ARGS) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512:
        bwd_avx512(stable, n, D, pos, up, left, down, right, dn, rt, z, ldz, dz, pnext, dout, ldo,
                   c, dcu, dcl, ldh, db);
        return;
    case RL_CPU_AVX2:
        bwd_avx2(stable, n, D, pos, up, left, down, right, dn, rt, z, ldz, dz, pnext, dout, ldo, c,
                 dcu, dcl, ldh, db);
        return;
#endif
    default:
        bwd_base(stable, n, D, pos, up, left, down, right, dn, rt, z, ldz, dz, pnext, dout, ldo, c,
                 dcu, dcl, ldh, db);
        return;
    }
}

void rl_mdlstm_cpu_fwd_f64(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, double *z, int64_t ldz, const double *r,
                           const double *bias, double *c, double *h, int64_t ldh) {
    for (int64_t k = 0; k < n; k++) {
        double *zr = z + pos[k] * ldz;
        const double *rk = r + k * 5 * D;
        double *cr = c + pos[k] * ldh, *hr = h + pos[k] * ldh;
        for (int64_t j = 0; j < D; j++) {
            double a[5];
            for (int q = 0; q < 5; q++)
                a[q] = zr[q * D + j] + rk[q * D + j] + bias[q * D + j];
            double cu = up[k] >= 0 ? c[up[k] * ldh + j] : 0.0;
            double cl = left[k] >= 0 ? c[left[k] * ldh + j] : 0.0;
            rl_mdlstm_cell_fwd_f64(stable, &a[0], &a[1], &a[2], &a[3], &a[4], cu, cl, &cr[j],
                                   &hr[j]);
            for (int q = 0; q < 5; q++)
                zr[q * D + j] = a[q];
        }
    }
}

void rl_mdlstm_cpu_bwd_f64(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, const int64_t *down, const int64_t *right,
                           const int64_t *dn, const int64_t *rt, double *z, int64_t ldz, double *dz,
                           const double *pnext, const double *dout, int64_t ldo, const double *c,
                           double *dcu, double *dcl, int64_t ldh, double *db) {
    for (int64_t k = 0; k < n; k++) {
        double *zr = z + pos[k] * ldz, *dr = dz + k * 5 * D;
        int64_t p = pos[k] * ldh;
        for (int64_t j = 0; j < D; j++) {
            double a[5];
            for (int q = 0; q < 5; q++)
                a[q] = zr[q * D + j];
            double cu = up[k] >= 0 ? c[up[k] * ldh + j] : 0.0;
            double cl = left[k] >= 0 ? c[left[k] * ldh + j] : 0.0;
            double dh = (dout ? dout[pos[k] * ldo + j] : 0.0) +
                        (dn[k] >= 0 ? pnext[dn[k] * 2 * D + j] : 0.0) +
                        (rt[k] >= 0 ? pnext[rt[k] * 2 * D + D + j] : 0.0);
            double dc = (down[k] >= 0 ? dcu[down[k] * ldh + j] : 0.0) +
                        (right[k] >= 0 ? dcl[right[k] * ldh + j] : 0.0);
            rl_mdlstm_cell_bwd_f64(stable, &a[0], &a[1], &a[2], &a[3], &a[4], cu, cl, c[p + j], dh,
                                   dc, &dcu[p + j], &dcl[p + j]);
            for (int q = 0; q < 5; q++) {
                zr[q * D + j] = dr[q * D + j] = a[q];
                db[q * D + j] += a[q];
            }
        }
    }
}

void rl_mdlstm_cpu_gather_f32(int64_t n, int64_t cols, const int64_t *idx, const float *src,
                              int64_t lds, float *dst, int64_t ldd) {
    for (int64_t k = 0; k < n; k++) {
        if (idx[k] >= 0)
            memcpy(dst + k * ldd, src + idx[k] * lds, (size_t)cols * sizeof *dst);
        else
            memset(dst + k * ldd, 0, (size_t)cols * sizeof *dst);
    }
}

void rl_mdlstm_cpu_gather_f64(int64_t n, int64_t cols, const int64_t *idx, const double *src,
                              int64_t lds, double *dst, int64_t ldd) {
    for (int64_t k = 0; k < n; k++) {
        if (idx[k] >= 0)
            memcpy(dst + k * ldd, src + idx[k] * lds, (size_t)cols * sizeof *dst);
        else
            memset(dst + k * ldd, 0, (size_t)cols * sizeof *dst);
    }
}
