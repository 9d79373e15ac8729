/* The optimizer kernels for tensors on CUDA devices (kernels/cuda/optim.cu), the device
 * counterparts of rl_optim_cpu_update, rl_optim_cpu_sqnorm and rl_optim_cpu_max_norm
 * (kernels/optim.h). A plain C header: no CUDA include. Only present in a CUDA build
 * (RL_WITH_CUDA); the dispatcher (kernels/optim.c) calls these after its checks, so the buffers
 * are float32 or float64, of one dtype, on one CUDA device, and (except the max-norm weight)
 * contiguous with equal numbers of elements.
 *
 * Everything runs on the legacy default stream of the tensors' device (made current here), the
 * stream of the tensor ops and of the allocator. The update and max-norm are asynchronous;
 * rl_optim_cuda_sqnorm returns its result on the host, so it waits for the work queued before
 * it (one 8-byte copy per optimizer step: the outlier test and the global-norm scale need it on
 * the host). Errors: RL_EDEVICE naming the function and the CUDA message, RL_ENOMEM. */
#ifndef RL_KERNELS_CUDA_OPTIM_H
#define RL_KERNELS_CUDA_OPTIM_H

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fused update pass (same contract and formulas as rl_optim_cpu_update): element i of a
 * noisy step uses Philox block coef->noise_offset + i / 2, as on the CPU. s1, s2 are NULL where
 * the method keeps fewer states. */
rl_status rl_optim_cuda_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1,
                               rl_tensor *s2, const rl_optim_coef *coef);

/* sum of t[i]^2 in double, to the host. Deterministic: per-block partial sums in a fixed order,
 * then one block adds them in a fixed order (no atomics), so one buffer length always gives the
 * same bits. */
rl_status rl_optim_cuda_sqnorm(double *sq, const rl_tensor *t);

/* Max-norm per column of a 2-D weight (any strides), as rl_optim_cpu_max_norm. */
rl_status rl_optim_cuda_max_norm(rl_tensor *w, double max_norm);

#ifdef __cplusplus
}
#endif

#endif
