/* The softmax output layer's row passes on the CPU, fused: softmax with the frame-wise cross
 * entropy in one sweep over each row (forward) and p - onehot in one more (backward), instead of
 * a dozen generic ops over (T, B, C) and three (T, B, C) temporaries (layers/softmax.c uses
 * these for CPU tensors, the generic ops elsewhere; the formulas are those of layers/loss.h).
 *
 * Layout: (T, B, C) contiguous, row r = t * B + b; row r is valid when t < len[b].
 *   p = exp(z - max z) / sum exp(z - max z)                         (every row)
 *   loss = -sum over valid rows of log p[target] = sum (max + log sum - z[target])
 *   n_errors = valid rows whose argmax z (first maximum; a NaN wins) is not the target
 *   grad: dz = p - onehot(target) on valid rows, 0 on padded rows (or added to dz), and
 *         optionally db = sum over rows of dz (fused: one sweep instead of a second over dz)
 * A NaN or Inf in a row of z gives NaN probabilities and a NaN loss, as the generic path does.
 * Label smoothing eps in [0, 1) (PyTorch's CrossEntropyLoss(label_smoothing = eps)): the target
 * is (1 - eps) onehot + eps / C, so a valid row's loss is
 *   (1 - eps) (max + log sum - z[target]) + eps (max + log sum - mean_c z)
 * and dz = p - (1 - eps) onehot - eps / C; eps = 0 computes exactly the plain formulas above.
 */
#ifndef RL_KERNELS_SOFTMAX_CE_H
#define RL_KERNELS_SOFTMAX_CE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Valid-frame targets: tgt[r] = target[r] on valid rows, -1 on padded ones. Returns the first
 * valid row whose target is outside 0..C-1 (tgt is then incomplete), or -1. */
int64_t rl_ce_targets_cpu(int64_t T, int64_t B, int64_t C, const int32_t *target,
                          const int32_t *len, int32_t *tgt);

/* Rows per block of the bias gradient's partial sums (rl_ce_grad_cpu_f32). */
#define RL_CE_DB_ROWS 64

/* p = softmax(z) row-wise (p may be z: in place); with tgt (rl_ce_targets_cpu) also *loss (with
 * label smoothing eps) and *n_errors over the rows with tgt >= 0. float32 takes an optional
 * bias (C, or NULL) added to every row of z first (so that the affine map's GEMM need not start
 * from a broadcast copy of it), and splits the rows over the BLAS threads (a (T, B, 10000) output
 * would otherwise be a serial tenth of a 2-thread step); each row's loss and error go to row_stats
 * (2 * rows doubles, with tgt; may be NULL without) and are added up in row order afterwards, so
 * the sums do not depend on the split. */
void rl_softmax_ce_cpu_f32(int64_t rows, int64_t C, const float *z, const float *bias, float *p,
                           const int32_t *tgt, double eps, double *row_stats, double *loss,
                           double *n_errors);
void rl_softmax_ce_cpu_f64(int64_t rows, int64_t C, const double *z, double *p, const int32_t *tgt,
                           double eps, double *loss, double *n_errors);

/* Floats of scratch rl_ce_grad_cpu_f32 needs for a bias gradient over rows x C. */
int64_t rl_ce_grad_scratch_size(int64_t rows, int64_t C);

/* dz = p - onehot(tgt) (smoothed by eps) on rows with tgt >= 0, 0 elsewhere; with accumulate
 * dz += the same. With db (C) also db = the column sums of the resulting dz (the bias gradient of
 * the affine map before the softmax), in the same sweep: float32 sums blocks of RL_CE_DB_ROWS rows
 * into scratch (rl_ce_grad_scratch_size floats) and then the blocks in order, so db does not depend
 * on how the rows were split over the BLAS threads. */
void rl_ce_grad_cpu_f32(int64_t rows, int64_t C, const float *p, const int32_t *tgt, double eps,
                        float *dz, bool accumulate, float *db, float *scratch);
void rl_ce_grad_cpu_f64(int64_t rows, int64_t C, const double *p, const int32_t *tgt, double eps,
                        double *dz, bool accumulate, double *db);
/* For a network in bf16 (kernels/cpu/gemm_bf16.h), whose products round dz to bf16 anyway: the
 * float32 pass without accumulate, dz written only rounded, in the layout of a rounded left
 * operand of rows x C (rl_bf16_lhs_size elements: rows of rl_bf16_lhs_stride(C), zeros in the
 * padding), for rl_gemm_bf16_lhs and _rhs; db as the float32 pass's, bit for bit. */
void rl_ce_grad_cpu_bf16(int64_t rows, int64_t C, const float *p, const int32_t *tgt, double eps,
                         uint16_t *dz, float *db, float *scratch);

#ifdef __cplusplus
}
#endif

#endif
