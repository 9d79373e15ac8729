/* The softmax output layer's row passes on the CPU, fused: softmax with the frame-wise cross
 * entropy in one sweep over each row (forward) and p - onehot in one more (backward), instead of
 * a dozen generic ops over (T, B, C) and three (T, B, C) temporaries (layers/softmax.c uses
 * these for CPU tensors, the generic ops elsewhere; the formulas are those of layers/loss.h).
 *
 * Layout: (T, B, C) contiguous, row r = t * B + b; row r is valid when t < len[b].
 *   p = exp(z - max z) / sum exp(z - max z)                         (every row)
 *   loss = -sum over valid rows of log p[target] = sum (max + log sum - z[target])
 *   n_errors = valid rows whose argmax z (first maximum; a NaN wins) is not the target
 *   grad: dz = p - onehot(target) on valid rows, 0 on padded rows (or added to dz)
 * A NaN or Inf in a row of z gives NaN probabilities and a NaN loss, as the generic path does.
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

/* p = softmax(z) row-wise (p may be z: in place); with tgt (rl_ce_targets_cpu) also *loss and
 * *n_errors over the rows with tgt >= 0. */
void rl_softmax_ce_cpu_f32(int64_t rows, int64_t C, const float *z, float *p, const int32_t *tgt,
                           double *loss, double *n_errors);
void rl_softmax_ce_cpu_f64(int64_t rows, int64_t C, const double *z, double *p, const int32_t *tgt,
                           double *loss, double *n_errors);

/* dz = p - onehot(tgt) on rows with tgt >= 0, 0 elsewhere; with accumulate dz += the same. */
void rl_ce_grad_cpu_f32(int64_t rows, int64_t C, const float *p, const int32_t *tgt, float *dz,
                        bool accumulate);
void rl_ce_grad_cpu_f64(int64_t rows, int64_t C, const double *p, const int32_t *tgt, double *dz,
                        bool accumulate);

#ifdef __cplusplus
}
#endif

#endif
