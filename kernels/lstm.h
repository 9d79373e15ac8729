/* The fused pointwise passes of one LSTM step over a batch (B, H), CPU, float32 and float64.
 * The formulas are those of kernels/lstm_cell.h; the recurrent driver (layers/recurrent.c)
 * calls these between its GEMMs for the lstm cell (layers/lstm.c).
 *
 * Layout of one step (all row-major, contiguous, host memory):
 *   z       (B, 4H)  gate blocks in the order i, f, g, o (PyTorch/cuDNN order)
 *   cp, hp  (B, H)   the previous cell and hidden state
 *   c, h    (B, H)   this step's cell and hidden state (the recurrent state)
 *   out     (B, H)   this step's output: h on valid rows, 0 on padded ones
 * A row b is valid when t < len[b]. A padded row carries the state (c = cp, h = hp) and, in
 * backward, passes the state gradients through unchanged and contributes nothing else.
 * peep: p_i, p_f, p_o (H each), or NULL for an LSTM without peepholes.
 */
#ifndef RL_KERNELS_LSTM_H
#define RL_KERNELS_LSTM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Zoneout of one step (kernels/pointwise.h, rl_zoneoutf), or NULL for none: mc, mh (B, H) the
 * weights of the previous cell and hidden state (NULL: that state has no zoneout); ct (B, H) the
 * cell before zoneout c~ = f cp + i g, which forward writes and backward reads (o's gate, tanh
 * and the peephole p_o see c~; the state carried on is c = mc cp + (1 - mc) c~, h = mh hp +
 * (1 - mh) o tanh(c~)). */
typedef struct {
    const float *mc, *mh;
    float *ct;
} rl_lstm_zo_f32;
typedef struct {
    const double *mc, *mh;
    double *ct;
} rl_lstm_zo_f64;

/* Forward: z holds the pre-activations without bias on entry (input and recurrent
 * projections) and the gate activations i, f, g, o on return (kept for backward; rows of
 * padded frames are left as they were). */
void rl_lstm_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *bias, const float *const *peep, const float *cp,
                         const float *hp, float *c, float *h, float *out, const rl_lstm_zo_f32 *zo);
void rl_lstm_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                         const double *bias, const double *const *peep, const double *cp,
                         const double *hp, double *c, double *h, double *out,
                         const rl_lstm_zo_f64 *zo);

/* Backward: z holds the activations on entry and dLoss/dz on return (0 on padded rows).
 * dout: dLoss/dout of this step, rows dout_ld elements apart (NULL: zero).
 * dh (B, H): on entry dLoss/dh_t from the next step's recurrent projection; on return 0 on
 * valid rows (the caller then adds dz U^T) and unchanged on padded rows.
 * dc (B, H): dLoss/dc_t on entry, dLoss/dc_{t-1} on return. With zoneout, dh on return is the
 * direct part mh dLoss/dh_t on valid rows (the caller adds dz U^T to it). */
void rl_lstm_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                         const float *const *peep, const float *cp, const float *c,
                         const float *dout, int64_t dout_ld, float *dh, float *dc,
                         const rl_lstm_zo_f32 *zo);
void rl_lstm_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                         const double *const *peep, const double *cp, const double *c,
                         const double *dout, int64_t dout_ld, double *dh, double *dc,
                         const rl_lstm_zo_f64 *zo);

/* After the backward steps, over all of them at once (rows = T * B): dz (rows, 4H) the gate
 * gradients (0 on padded rows), cp, c (rows, H) each row's previous and own cell.
 * db (4H) += column sums of dz; dpeep (3 pointers, H each, or NULL) += the peephole
 * gradients. */
void rl_lstm_cpu_param_grads_f32(int64_t rows, int64_t H, const float *dz, const float *cp,
                                 const float *c, float *db, float *const *dpeep);
void rl_lstm_cpu_param_grads_f64(int64_t rows, int64_t H, const double *dz, const double *cp,
                                 const double *c, double *db, double *const *dpeep);

/* layer_norm = true (the formulas of kernels/lstm_cell.h; no peepholes, no zoneout): the step's
 * rows of the layer's buffers. Forward: z holds the input part x W (without bias) on entry and
 * the activations i, f, g, o on return; hh the recurrent part h_prev U on entry and its
 * normalised blocks on return; it writes xh (the input part's normalised blocks), cn (the
 * normalised cell) and rs (1/std of the 4 input blocks, the 4 recurrent blocks, the cell), and
 * on padded rows zeros in xh, hh and cn. Backward: z holds the activations on entry and dLoss/d
 * of the input part on return; it writes dzh (dLoss/d of the recurrent part), dg (the gates'
 * pre-activation gradients, for b and the gains) and du (the normalised cell's gradient, for
 * its gain and bias), zeros on padded rows; dh and dc as rl_lstm_cpu_bwd_*. */
typedef struct {
    float *xh, *hh, *cn, *rs;       /* (B, 4H), (B, 4H), (B, H), (B, 9) */
    float *dg, *dzh, *du;           /* backward: (B, 4H), (B, 4H), (B, H) */
    const float *gx, *gh, *gc, *bc; /* the gains (4H, 4H, H) and the cell's bias (H) */
} rl_lstm_ln_f32;
typedef struct {
    double *xh, *hh, *cn, *rs;
    double *dg, *dzh, *du;
    const double *gx, *gh, *gc, *bc;
} rl_lstm_ln_f64;

void rl_lstm_ln_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                            const float *bias, const float *cp, const float *hp, float *c, float *h,
                            float *out, const rl_lstm_ln_f32 *ln);
void rl_lstm_ln_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                            const double *bias, const double *cp, const double *hp, double *c,
                            double *h, double *out, const rl_lstm_ln_f64 *ln);
void rl_lstm_ln_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *z,
                            const float *cp, const float *c, const float *dout, int64_t dout_ld,
                            float *dh, float *dc, const rl_lstm_ln_f32 *ln);
void rl_lstm_ln_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *z,
                            const double *cp, const double *c, const double *dout, int64_t dout_ld,
                            double *dh, double *dc, const rl_lstm_ln_f64 *ln);
/* Over rows = T * B at once (the buffers of all steps): db, dgx, dgh (4H), dgc, dbc (H) +=. */
void rl_lstm_ln_cpu_param_grads_f32(int64_t rows, int64_t H, const rl_lstm_ln_f32 *ln, float *db,
                                    float *dgx, float *dgh, float *dgc, float *dbc);
void rl_lstm_ln_cpu_param_grads_f64(int64_t rows, int64_t H, const rl_lstm_ln_f64 *ln, double *db,
                                    double *dgx, double *dgh, double *dgc, double *dbc);

#ifdef __cplusplus
}
#endif

#endif
