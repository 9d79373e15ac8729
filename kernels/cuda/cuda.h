/* The CUDA backend's face to the C side: the kernel table for tensors on CUDA devices
 * (kernels/cuda/ops.cu) and the registration of the CUDA device backend with core/device.h
 * (kernels/cuda/device.cu). A plain C header: no CUDA include, so kernels/ops.c can use it.
 * Only present in a CUDA build (RL_WITH_CUDA); the dispatcher calls rl_cuda_register() from
 * rl_ops_init() and then rl_kernels_cuda() for tensors on cuda:N. */
#ifndef RL_KERNELS_CUDA_H
#define RL_KERNELS_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "../backend.h"

/* The kernels for tensors on any CUDA device; each kernel runs on the device of its tensors,
 * on that device's default stream. The table lives as long as the process. */
const rl_kernels *rl_kernels_cuda(void);

/* Registers the CUDA device backend (count, caching allocator, copies) with
 * rl_device_register_cuda(). Idempotent; safe on a machine without a driver or a device (the
 * backend then counts 0 devices). */
void rl_cuda_register(void);

#ifdef __cplusplus
}
#endif

#endif
