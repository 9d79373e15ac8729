/* Devices other than the CPU are reached through a small table of functions, registered at
 * start-up by the backend that implements them (kernels/cuda registers the CUDA one). core/
 * itself knows no CUDA: without a registered backend every request for a cuda device fails
 * with a clear message. */
#ifndef RL_DEVICE_H
#define RL_DEVICE_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rl_device_backend {
    const char *name;
    int (*count)(void);
    rl_status (*alloc)(int index, size_t nbytes, void **ptr);
    void (*free)(int index, void *ptr, size_t nbytes);
    /* Byte copy where either side may be on this backend's device or on the host. */
    rl_status (*memcpy)(void *dst, rl_device ddev, const void *src, rl_device sdev, size_t nbytes);
    rl_status (*synchronize)(int index);
} rl_device_backend;

/* Called once by the CUDA backend's initialisation; the table must outlive the process. */
void rl_device_register_cuda(const rl_device_backend *b);
const rl_device_backend *rl_device_cuda_backend(void);

/* RL_OK when `d` can hold tensors now: the CPU, or an existing CUDA ordinal in a CUDA build. */
rl_status rl_device_check(rl_device d);

/* Copy `nbytes` between any two devices (host<->device, device<->device, host<->host). */
rl_status rl_device_memcpy(void *dst, rl_device ddev, const void *src, rl_device sdev,
                           size_t nbytes);

#ifdef __cplusplus
}
#endif

#endif
