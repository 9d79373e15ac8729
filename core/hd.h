/* RL_HD marks a static inline function that is compiled for both the host and the device.
 * Headers of shared formulas (philox.h, kernels/pointwise.h) use it, so one definition of each
 * formula serves the CPU loops and the CUDA kernels. It includes no CUDA header. */
#ifndef RL_HD_H
#define RL_HD_H

#ifdef __CUDACC__
#define RL_HD __host__ __device__
#else
#define RL_HD
#endif

/* For the small formulas the hot loops call: always inlined, also into CPU loops compiled for
 * another instruction set with a target attribute (where GCC inlines only when forced). */
#if defined(__CUDACC__)
#define RL_HD_INLINE static __forceinline__ __host__ __device__
#elif defined(__GNUC__)
#define RL_HD_INLINE static inline __attribute__((always_inline))
#else
#define RL_HD_INLINE static inline
#endif

#endif
