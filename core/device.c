/* The CPU allocator and the registry of the CUDA backend (see device.h). */
#include "device.h"

#include <stdio.h>
#include <string.h>

static const rl_device_backend *rl_cuda_backend;

void rl_device_register_cuda(const rl_device_backend *b) { rl_cuda_backend = b; }

const rl_device_backend *rl_device_cuda_backend(void) { return rl_cuda_backend; }

rl_status rl_device_check(rl_device d) {
    if (d.type == RL_CPU) return RL_OK;
    if (!rl_cuda_backend)
        return rl_error(RL_EDEVICE,
                        "cuda:%d requested, but this rnnlua was built without CUDA "
                        "(rebuild with `make CUDA=1` on a machine with the toolkit)",
                        d.index);
    int n = rl_cuda_backend->count();
    if (n <= 0)
        return rl_error(RL_EDEVICE, "cuda:%d requested, but no CUDA device is available", d.index);
    if (d.index < 0 || d.index >= n)
        return rl_error(RL_EDEVICE, "cuda:%d requested, but only %d CUDA device%s (cuda:0%s)",
                        d.index, n, n == 1 ? "" : "s", n == 1 ? "" : "..");
    return RL_OK;
}

rl_status rl_device_memcpy(void *dst, rl_device ddev, const void *src, rl_device sdev,
                           size_t nbytes) {
    if (nbytes == 0) return RL_OK;
    if (ddev.type == RL_CPU && sdev.type == RL_CPU) {
        memmove(dst, src, nbytes);
        return RL_OK;
    }
    if (!rl_cuda_backend)
        return rl_error(RL_EDEVICE, "copy to/from a CUDA device in a build without CUDA");
    return rl_cuda_backend->memcpy(dst, ddev, src, sdev, nbytes);
}
