/* The CTC loss on CUDA devices (kernels/cuda/ctc.cu), the device counterpart of the CPU kernel
 * of kernels/ctc.h. A plain C header: no CUDA include. Only present in a CUDA build
 * (RL_WITH_CUDA); rl_ctc_loss (kernels/ctc.c) calls it after its checks, so: logits (T, B, V)
 * contiguous float32/float64 on a CUDA device; labels (B, S) int32 on the host (any strides),
 * valid (0..V-1, never the blank, label_len[b] <= input_len[b]); input_len and label_len (B)
 * int32 on the host; loss (B) and grad (T, B, V) (or NULL) set, contiguous, of the logits'
 * dtype and device.
 *
 * The labels and lengths are packed on the host and copied to w->dev_int once per call; the
 * alphas and betas live in w->scratch (float64, on the device), both sized on the first batch
 * of a shape and reused. Everything runs on the legacy default stream of the logits' device;
 * the call returns once the work is queued. Errors: RL_EDEVICE naming the function and the
 * CUDA message, RL_ENOMEM. */
#ifndef RL_KERNELS_CUDA_CTC_H
#define RL_KERNELS_CUDA_CTC_H

#include <stdbool.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../ctc.h"

#ifdef __cplusplus
extern "C" {
#endif

rl_status rl_ctc_cuda(rl_ctc_work *w, const rl_tensor *logits, const rl_tensor *labels,
                      const int32_t *input_len, const int32_t *label_len, int64_t blank,
                      bool zero_infinity, rl_tensor *loss, rl_tensor *grad);

#ifdef __cplusplus
}
#endif

#endif
