/* The device side of a GPU parity harness: cuda:0 when the build and the machine have one, else
 * the CPU itself, so that the whole harness (references, runs, comparisons) still runs and a
 * broken test shows on a machine without a GPU. Prints which side runs; `skipped` names what the
 * harness leaves out without a device (NULL: nothing). */
#ifndef RL_TESTS_GPU_DEVICE_SIDE_H
#define RL_TESTS_GPU_DEVICE_SIDE_H

#include <stdio.h>

#include "core/device.h"

static inline rl_device device_side(const char *skipped) {
    rl_device d = RL_DEVICE_CPU;
#ifdef RL_WITH_CUDA
    const rl_device_backend *be = rl_device_cuda_backend();
    if (be && be->count() > 0) d = (rl_device){RL_CUDA, 0};
#endif
    if (d.type == RL_CPU)
        printf("no CUDA device: the harness runs with the CPU as the device side (nothing of the "
               "GPU is tested%s%s)\n",
               skipped ? "; skipped: " : "", skipped ? skipped : "");
    else
        printf("device side: cuda:0\n");
    return d;
}

#endif
