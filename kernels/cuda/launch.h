/* Error and device helpers of the recurrent layers' CUDA launchers (kernels/cuda/lstm.cu,
 * kernels/cuda/gru.cu): one definition of each. A C++ header for .cu files only (it includes
 * the CUDA runtime). Every function returns an rl_status and sets a message naming the
 * launcher (fn), the call or kernel, and the sizes. */
#ifndef RL_KERNELS_CUDA_LAUNCH_H
#define RL_KERNELS_CUDA_LAUNCH_H

#include <cuda_runtime.h>

extern "C" {
#include "../../core/error.h"
}

namespace rl_launch {

/* A failed CUDA runtime call; clears the sticky error state. */
inline rl_status cuda_fail(const char *fn, const char *call, cudaError_t e, long long B,
                           long long H) {
    cudaGetLastError();
    return rl_error(RL_EDEVICE, "%s: %s: %s (B=%lld H=%lld)", fn, call, cudaGetErrorString(e), B,
                    H);
}

/* Makes the device that holds p current (the launchers take bare pointers); an error when p is
 * not device memory. */
inline rl_status enter(const char *fn, const void *p, long long B, long long H) {
    cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) return cuda_fail(fn, "cudaPointerGetAttributes", e, B, H);
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return rl_error(RL_EDEVICE, "%s: a buffer is not in CUDA device memory (B=%lld H=%lld)", fn,
                        B, H);
    int cur = -1;
    e = cudaGetDevice(&cur);
    if (e != cudaSuccess) return cuda_fail(fn, "cudaGetDevice", e, B, H);
    if (cur != attr.device) {
        e = cudaSetDevice(attr.device);
        if (e != cudaSuccess) return cuda_fail(fn, "cudaSetDevice", e, B, H);
    }
    return RL_OK;
}

/* Whether the last kernel launch went through (t: the step, -1 for none). */
inline rl_status launched(const char *fn, const char *kernel, long long B, long long H,
                          long long t) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return RL_OK;
    return rl_error(RL_EDEVICE, "%s: launching %s (B=%lld H=%lld t=%lld): %s", fn, kernel, B, H, t,
                    cudaGetErrorString(e));
}

} // namespace rl_launch

#endif
