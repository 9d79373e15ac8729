/* One step of attention over an encoder sequence, forward and backward, fused: the scores,
 * the masked softmax and the context vector (formulas: kernels/attention_step.h). The caller
 * (lua/rnnlua/attention.lua) does the GEMMs around it: pre = e W_e once per sequence,
 * hq = q W_q per step (additive), and after the backward steps the weight gradients and
 * de += dpre W_e^T.
 *
 * Shapes (row-major, contiguous, all on one device, one float dtype):
 *   e      (Te, B, E)  the encoder, time-major as the network gives it
 *   len    (B) int32   encoder lengths on e's device; frames j >= len[b] are padding (never
 *                      read for scores, weight 0)
 *   q      dot: (B, E) the query; additive: (B, A) the projected query q W_q
 *   pre    (Te, B, A)  e W_e (additive; NULL for dot)
 *   v      (A)         the additive score vector (NULL for dot)
 *   alpha  (B, Te)     the weights (forward writes, backward reads)
 *   ctx    (B, E)      sum_j alpha_j e_j (forward writes)
 *   dctx   (B, E)      the context's gradient (backward reads)
 *   ds     (B, Te)     the score gradients (backward writes: scratch a caller may read)
 *   de     (Te, B, E)  += alpha_j dctx (+ ds_j q for dot)
 *   dq     like q      = dLoss/dq (dot) or dLoss/dhq (additive)
 *   dpre   (Te, B, A)  += dLoss/dpre (additive)
 *   dv     (B, A)      += each sequence's part of dLoss/dv (additive; the caller sums over b
 *                      once after all steps, so that no step reduces across sequences)
 * A sequence with len[b] = 0 gets weights 0 and a zero context. */
#ifndef RL_KERNELS_ATTENTION_H
#define RL_KERNELS_ATTENTION_H

#include <stdint.h>

#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { RL_ATT_DOT = 0, RL_ATT_ADDITIVE = 1 } rl_att_kind;

/* The checked entry points (CPU or CUDA tensors). `who` names the caller in errors. Errors:
 * RL_EDTYPE/RL_ESHAPE/RL_EDEVICE/RL_EARG naming `who` and the argument; on the CPU RL_EINDEX
 * for a length outside 0..Te, naming the sequence (1-based). On CUDA the lengths stay on the
 * device: the kernels clamp them to 0..Te (the caller checks its host copy). */
rl_status rl_attention_forward(const char *who, rl_att_kind kind, const rl_tensor *e,
                               const rl_tensor *len, const rl_tensor *q, const rl_tensor *pre,
                               const rl_tensor *v, rl_tensor *alpha, rl_tensor *ctx);
rl_status rl_attention_backward(const char *who, rl_att_kind kind, const rl_tensor *e,
                                const rl_tensor *len, const rl_tensor *q, const rl_tensor *pre,
                                const rl_tensor *v, const rl_tensor *alpha, const rl_tensor *dctx,
                                rl_tensor *ds, rl_tensor *de, rl_tensor *dq, rl_tensor *dpre,
                                rl_tensor *dv);

/* The CPU kernels (kernels/cpu/attention.c), arguments already checked; A is ignored for dot.
 * float32 is compiled per CPU level (kernels/cpu/cpu_level.h). A step is O(B Te (E + A)) and
 * runs between GEMMs that use the BLAS threads, so it splits its sequences over those threads
 * too (results identical on any thread count). */
void rl_attention_cpu_fwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, float *alpha, float *ctx);
void rl_attention_cpu_fwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, double *alpha, double *ctx);
void rl_attention_cpu_bwd_f32(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const float *e, const int32_t *len, const float *q, const float *pre,
                              const float *v, const float *alpha, const float *dctx, float *ds,
                              float *de, float *dq, float *dpre, float *dv);
void rl_attention_cpu_bwd_f64(rl_att_kind kind, int64_t Te, int64_t B, int64_t E, int64_t A,
                              const double *e, const int32_t *len, const double *q,
                              const double *pre, const double *v, const double *alpha,
                              const double *dctx, double *ds, double *de, double *dq, double *dpre,
                              double *dv);

#ifdef __cplusplus
}
#endif

#endif
