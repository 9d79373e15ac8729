/* The fused pointwise passes of an MDLSTM diagonal on the CPU (see kernels/mdlstm.h for the
 * layout and kernels/mdlstm_cell.h for the formulas).
 *
 * One pass per direction and diagonal reads each cell's pre-activations once and writes the
 * gate activations, the cell and the state (forward), or the gate gradients and the cell
 * gradients passed to both predecessors (backward). The float32 loops are built with the full
 * vectoriser (as in kernels/cpu/lstm.c; the build's -march already picks the instruction
 * set); the cell type is a constant in each inlined body, so the standard cell's loop carries
 * no stable-cell arithmetic. float64 serves the gradient checks.
 */
#include <string.h>

#include "../mdlstm.h"
#include "../mdlstm_cell.h"

#define RL_INLINE static inline __attribute__((always_inline))
#if defined(__GNUC__) && !defined(__clang__)
#define RL_VECTORISE __attribute__((optimize("O3", "no-trapping-math")))
#define RL_IVDEP _Pragma("GCC ivdep")
#else
#define RL_VECTORISE
#define RL_IVDEP
#endif

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
                            const int64_t *right, float *z, int64_t ldz, const float *dhr,
                            const float *dout, int64_t ldo, const float *c, float *dcu, float *dcl,
                            int64_t ldh) {
    for (int64_t k = 0; k < n; k++) {
        float *restrict z1 = z + pos[k] * ldz, *restrict z2 = z1 + D, *restrict z3 = z1 + 2 * D,
                        *restrict z4 = z1 + 3 * D, *restrict z5 = z1 + 4 * D;
        const float *restrict dh = dhr + k * D;
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
            float dhj = dh[j] + (dor ? dor[j] : 0.0f);
            float dcj = (gd ? gd[j] : 0.0f) + (gr ? gr[j] : 0.0f);
            rl_mdlstm_cell_bwd_f32(stable, &a1, &a2, &a3, &a4, &a5, cu ? cu[j] : 0.0f,
                                   cl ? cl[j] : 0.0f, cr[j], dhj, dcj, &ou[j], &ol[j]);
            z1[j] = a1;
            z2[j] = a2;
            z3[j] = a3;
            z4[j] = a4;
            z5[j] = a5;
        }
    }
}

RL_VECTORISE void rl_mdlstm_cpu_fwd_f32(bool stable, int64_t n, int64_t D, const int64_t *pos,
                                        const int64_t *up, const int64_t *left, float *z,
                                        int64_t ldz, const float *r, const float *bias, float *c,
                                        float *h, int64_t ldh) {
    if (stable)
        fwd_body_f32(true, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh);
    else
        fwd_body_f32(false, n, D, pos, up, left, z, ldz, r, bias, c, h, ldh);
}

RL_VECTORISE void rl_mdlstm_cpu_bwd_f32(bool stable, int64_t n, int64_t D, const int64_t *pos,
                                        const int64_t *up, const int64_t *left, const int64_t *down,
                                        const int64_t *right, float *z, int64_t ldz,
                                        const float *dhr, const float *dout, int64_t ldo,
                                        const float *c, float *dcu, float *dcl, int64_t ldh) {
    if (stable)
        bwd_body_f32(true, n, D, pos, up, left, down, right, z, ldz, dhr, dout, ldo, c, dcu, dcl,
                     ldh);
    else
        bwd_body_f32(false, n, D, pos, up, left, down, right, z, ldz, dhr, dout, ldo, c, dcu, dcl,
                     ldh);
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
                           double *z, int64_t ldz, const double *dhr, const double *dout,
                           int64_t ldo, const double *c, double *dcu, double *dcl, int64_t ldh) {
    for (int64_t k = 0; k < n; k++) {
        double *zr = z + pos[k] * ldz;
        int64_t p = pos[k] * ldh;
        for (int64_t j = 0; j < D; j++) {
            double a[5];
            for (int q = 0; q < 5; q++)
                a[q] = zr[q * D + j];
            double cu = up[k] >= 0 ? c[up[k] * ldh + j] : 0.0;
            double cl = left[k] >= 0 ? c[left[k] * ldh + j] : 0.0;
            double dh = dhr[k * D + j] + (dout ? dout[pos[k] * ldo + j] : 0.0);
            double dc = (down[k] >= 0 ? dcu[down[k] * ldh + j] : 0.0) +
                        (right[k] >= 0 ? dcl[right[k] * ldh + j] : 0.0);
            rl_mdlstm_cell_bwd_f64(stable, &a[0], &a[1], &a[2], &a[3], &a[4], cu, cl, c[p + j], dh,
                                   dc, &dcu[p + j], &dcl[p + j]);
            for (int q = 0; q < 5; q++)
                zr[q * D + j] = a[q];
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
