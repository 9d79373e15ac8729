/* One attention step on CUDA devices (kernels/cuda/attention.cu), the device counterpart of
 * kernels/attention.h's CPU kernels. A plain C header: no CUDA include. Only present in a CUDA
 * build (RL_WITH_CUDA); rl_attention_forward / rl_attention_backward (kernels/attention.c) call
 * it after their checks, so every pointer is device memory of one device, of dtype dt
 * (float32 or float64), laid out as kernels/attention.h says; len (B) int32 on the device,
 * clamped to 0..Te by the kernels. pre, v, dpre and dv are NULL for dot. Queued on the legacy
 * default stream of that device; errors: RL_EDEVICE naming the function, the kernel and the
 * sizes. Deterministic: one block per sequence, every sum in a fixed order, no atomics. */
#ifndef RL_KERNELS_CUDA_ATTENTION_H
#define RL_KERNELS_CUDA_ATTENTION_H

#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../attention.h"

#ifdef __cplusplus
extern "C" {
#endif

rl_status rl_attention_cuda_fwd(rl_dtype dt, rl_att_kind kind, int64_t Te, int64_t B, int64_t E,
                                int64_t A, const void *e, const int32_t *len, const void *q,
                                const void *pre, const void *v, void *alpha, void *ctx);
rl_status rl_attention_cuda_bwd(rl_dtype dt, rl_att_kind kind, int64_t Te, int64_t B, int64_t E,
                                int64_t A, const void *e, const int32_t *len, const void *q,
                                const void *pre, const void *v, const void *alpha, const void *dctx,
                                void *ds, void *de, void *dq, void *dpre, void *dv);

#ifdef __cplusplus
}
#endif

#endif
