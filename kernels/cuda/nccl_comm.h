/* NCCL as the device communicator of core/dist.h (kernels/cuda/nccl.cu): allreduce and
 * broadcast of buffers on CUDA devices, one device per rank, bootstrapped by core/dist.c over
 * MPI. A plain C header; present in a CUDA build with NCCL (RL_WITH_NCCL). */
#ifndef RL_KERNELS_NCCL_COMM_H
#define RL_KERNELS_NCCL_COMM_H

#ifdef __cplusplus
extern "C" {
#endif

/* Registers NCCL with rl_dist_register_device_comm(); nothing is initialised before the first
 * collective on a CUDA tensor. */
void rl_nccl_register(void);

#ifdef __cplusplus
}
#endif

#endif
