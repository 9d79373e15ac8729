/* The 2-D image layers on CUDA devices (kernels/cuda/image.cu): im2col and its transpose for
 * conv2d, max and average pooling for pool2d, the height collapse of collapse and the whole-image
 * pooling of global_pool. A plain C header: no CUDA include. Only present in a CUDA build
 * (RL_WITH_CUDA).
 *
 * Layout and rules are those of the CPU layers (layers/conv2d.c, pool2d.c, collapse.c,
 * global_pool.c) and kernels/im2col.h: images (H, W, B, F) contiguous, element (y, x, b, f) at
 * ((y W + x) B + b) F + f; output rows r = (yo Wo + xo) B + b. sizes and out_sizes are int32
 * (B, 2) (height, width per image) in device memory; every other pointer is device memory of the
 * same device (the launchers make it current), dt float32 or float64.
 *
 * Every call is one kernel launch on the legacy default stream (the stream of the tensor ops and
 * the caching allocator), asynchronous. Errors: RL_EDEVICE (a failing CUDA call, naming the
 * function and the sizes), RL_EDTYPE. Deterministic: the backward passes gather over input
 * positions (one thread per input element, no atomics) and add their terms in the CPU's order,
 * output rows ascending. */
#ifndef RL_KERNELS_CUDA_IMAGE_H
#define RL_KERNELS_CUDA_IMAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"
#include "../im2col.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The modes of rl_image_cuda_collapse_*: a column's valid rows summed, their maximum (the
 * first row on ties), or the image's last row. */
enum { RL_IMAGE_COLLAPSE_SUM = 0, RL_IMAGE_COLLAPSE_MAX = 1, RL_IMAGE_COLLAPSE_LAST = 2 };

/* cols (Ho Wo B, fh fw F) <- rl_im2col's columns: tap (i, j) of output (yo, xo, b) reads
 * x[yo sy - py + i][xo sx - px + j][b][.], 0 outside image b or outside its output size. */
rl_status rl_image_cuda_im2col(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                               const int32_t *out_sizes, const void *x, void *cols);
/* dx (H, W, B, F) = the transpose of rl_image_cuda_im2col applied to dcols (set, not added;
 * 0 on padding). */
rl_status rl_image_cuda_col2im(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                               const int32_t *out_sizes, const void *dcols, void *dx);
/* mask (Ho Wo B) = 1 on rows inside their image's output size, else 0. */
rl_status rl_image_cuda_row_mask(rl_dtype dt, const rl_conv_geom *g, const int32_t *out_sizes,
                                 void *mask);

/* y (Ho Wo B, F) = the max (max) or the mean (avg) over each window's taps inside the image
 * (window geometry g: fh, fw the pooling window), 0 on rows outside the output size. max: arg
 * (Ho Wo B, F) = the winning tap i fw + j (the first on ties), -1 where there is none. */
rl_status rl_image_cuda_pool_forward(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                                     const int32_t *out_sizes, bool max, const void *x, void *y,
                                     int32_t *arg);
/* dx (H, W, B, F) = dy routed back (max: to the tap in arg; avg: spread evenly over the
 * window's taps); set, 0 on padding. */
rl_status rl_image_cuda_pool_backward(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                                      const int32_t *out_sizes, bool max, const int32_t *arg,
                                      const void *dy, void *dx);

/* y (W, B, F) from x (H, W, B, F) by mode over each column's valid rows, 0 for x >= w_b; max:
 * arg (W, B, F) = the winning row. */
rl_status rl_image_cuda_collapse_forward(rl_dtype dt, int mode, int64_t H, int64_t W, int64_t B,
                                         int64_t F, const int32_t *sizes, const void *x, void *y,
                                         int32_t *arg);
/* dx (H, W, B, F) = dy (W, B, F) routed back to the rows that made each output; set, 0 on
 * padding and on rows that did not win. */
rl_status rl_image_cuda_collapse_backward(rl_dtype dt, int mode, int64_t H, int64_t W, int64_t B,
                                          int64_t F, const int32_t *sizes, const int32_t *arg,
                                          const void *dy, void *dx);

/* y (B, F) = the mean (accumulated in double) or the max over each image's valid positions;
 * max: arg (B, F) = the winning position y W + x (the first in row-major order on ties). */
rl_status rl_image_cuda_global_pool_forward(rl_dtype dt, bool max, int64_t H, int64_t W, int64_t B,
                                            int64_t F, const int32_t *sizes, const void *x, void *y,
                                            int32_t *arg);
/* dx (H, W, B, F): mean dy / (h_b w_b) on each valid position, max dy at the winner; set, 0
 * elsewhere. */
rl_status rl_image_cuda_global_pool_backward(rl_dtype dt, bool max, int64_t H, int64_t W, int64_t B,
                                             int64_t F, const int32_t *sizes, const int32_t *arg,
                                             const void *dy, void *dx);

#ifdef __cplusplus
}
#endif

#endif
