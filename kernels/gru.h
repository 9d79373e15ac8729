/* The fused pointwise passes of one GRU step over a batch (B, H), CPU, float32 and float64.
 * The formulas are those of kernels/gru_cell.h; the recurrent driver (layers/recurrent.c)
 * calls these between its GEMMs for the gru cell (layers/gru.c).
 *
 * Layout of one step (all row-major, contiguous, host memory):
 *   g       (B, 4H)  four blocks per row, in the order r, z, hn, n (see below)
 *   b, bh   (3H)     the input bias (PyTorch's bias_ih_l0) and the recurrent bias
 *                    (bias_hh_l0), blocks r, z, n
 *   hp      (B, H)   the previous state
 *   h       (B, H)   this step's state (the recurrent state)
 *   out     (B, H)   this step's output: h on valid rows, 0 on padded ones
 * A row b is valid when t < len[b]. A padded row carries the state (h = hp) and, in backward,
 * passes the state gradient through unchanged and contributes nothing else.
 *
 * One step on its own (what the driver does per frame for the gru, and what a caller running its
 * own time loop, such as a rec unit, does with explicit state in and out), with W (F, 3H), U (H,
 * 3H) in layers/gru.c's layout: g[:, 0:2H] = x W[:, 0:2H]   g[:, 3H:4H] = x W[:, 2H:3H]   g[:,
 * 2H:3H] = 0 g[:, 0:3H] += hp U                          (one product: r, z and hn side by side)
 *   rl_gru_cpu_fwd_*(..., g, b, bh, hp, h, out)  -> g = [r | z | hn | n], h
 * and backward, after setting dh = dLoss/dh from later steps (0 for the last):
 *   rl_gru_cpu_bwd_*(..., g, hp, dout, ..., dh, db, dbh) -> g = [dar | daz | dhn | dan],
 *                                                          dh = the direct part dh z
 *   dh += g[:, 0:3H] U^T        (now dLoss/dhp)
 *   dU += hp^T g[:, 0:3H]    dW[:, 0:2H] += x^T g[:, 0:2H]    dW[:, 2H:3H] += x^T g[:, 3H:4H]
 *   dx = g[:, 0:2H] W[:, 0:2H]^T + g[:, 3H:4H] W[:, 2H:3H]^T
 * so the recurrent operand [dar | daz | dhn] is contiguous for the per-step product.
 */
#ifndef RL_KERNELS_GRU_H
#define RL_KERNELS_GRU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Zoneout (kernels/pointwise.h, rl_zoneoutf): mh (B, H), the step's weights of the previous
 * state, or NULL for none: h = mh hp + (1 - mh) h~ with h~ the cell's new state; backward then
 * gives the cell (1 - mh) of dLoss/dh_t and adds mh dLoss/dh_t to the direct part of dh.
 *
 * Forward: g holds [x W_r + hp U_r | x W_z + hp U_z | hp U_n | x W_n] (no biases) on entry and
 * the activations [r | z | hn | n] on return, hn = hp U_n + b_hn (kept for backward; rows of
 * padded frames are left as they were). */
void rl_gru_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                        const float *b, const float *bh, const float *hp, float *h, float *out,
                        const float *mh);
void rl_gru_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                        const double *b, const double *bh, const double *hp, double *h, double *out,
                        const double *mh);

/* Backward: g holds the activations on entry and the pre-activation gradients
 * [dar | daz | dhn | dan] on return (0 on padded rows).
 * dout: dLoss/dout of this step, rows dout_ld elements apart (NULL: zero).
 * dh (B, H): on entry dLoss/dh_t from the next step; on return dLoss/dh_t * z on valid rows
 * (the caller then adds g[:, 0:3H] U^T) and unchanged on padded rows.
 * db (3H) += column sums of [dar | daz | dan], dbh (3H) += those of [dar | daz | dhn]; give
 * both, or both NULL to leave the sums to the caller. */
void rl_gru_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                        const float *hp, const float *dout, int64_t dout_ld, float *dh, float *db,
                        float *dbh, const float *mh);
void rl_gru_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                        const double *hp, const double *dout, int64_t dout_ld, double *dh,
                        double *db, double *dbh, const double *mh);

/* The bias sums left to the caller (float32): db (3H) += the column sums of [dar | daz | dan],
 * dbh (3H) += those of [dar | daz | dhn], over `rows` rows of g (4H each) in memory order. */
void rl_gru_cpu_bias_grads_f32(int64_t rows, int64_t H, const float *g, float *db, float *dbh);

/* layer_norm = true (Ba et al. 2016 per gate block; rl_ln_* of kernels/pointwise.h): with the
 * input part [xr | xz | xn] = x W and the recurrent part [hr | hz | hn] = hp U apart,
 *   ar = LN(xr) g_xr + LN(hr) g_hr (+ b_r + b_hr in the pass above), az likewise,
 *   an = LN(xn) g_xn (+ b_n), hn = LN(hn) g_hn (+ b_hn), n = tanh(an + r hn)
 * Forward, before rl_gru_cpu_fwd_*: g holds the input part in its blocks r, z, n (hn unused) and
 * hh (B, 3H) the recurrent part; on return g holds the normalised sums [ar | az | hn | an]
 * (without biases, for rl_gru_cpu_fwd_*), hh the recurrent part's normalised blocks, xh (B, 3H)
 * the input part's, rs (B, 6) their 1/std; zeros in xh and hh on padded rows. Backward, after
 * rl_gru_cpu_bwd_* (with db, dbh NULL): g holds [dar | daz | dhn | dan] on entry and on return
 * the input part's gradients [dxr | dxz | 0 | dxn] (the layout the input-side products read);
 * it writes dzh (B, 3H), the recurrent part's gradients, and dg (B, 4H) a copy of the entry g
 * for the bias and gain sums; zeros on padded rows. */
typedef struct {
    float *xh, *hh, *rs, *dg, *dzh;
    const float *gx, *gh; /* the gains (3H each, blocks r, z, n) */
} rl_gru_ln_f32;
typedef struct {
    double *xh, *hh, *rs, *dg, *dzh;
    const double *gx, *gh;
} rl_gru_ln_f64;
void rl_gru_ln_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                           const rl_gru_ln_f32 *ln);
void rl_gru_ln_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                           const rl_gru_ln_f64 *ln);
void rl_gru_ln_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                           const rl_gru_ln_f32 *ln);
void rl_gru_ln_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                           const rl_gru_ln_f64 *ln);
/* Over rows = T * B at once: db, dbh, dgx, dgh (3H) += the sums over dg, xh, hh. */
void rl_gru_ln_cpu_param_grads_f32(int64_t rows, int64_t H, const rl_gru_ln_f32 *ln, float *db,
                                   float *dbh, float *dgx, float *dgh);
void rl_gru_ln_cpu_param_grads_f64(int64_t rows, int64_t H, const rl_gru_ln_f64 *ln, double *db,
                                   double *dbh, double *dgx, double *dgh);

#ifdef __cplusplus
}
#endif

#endif
