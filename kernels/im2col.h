/* im2col for 2-D layers over ragged images (conv2d, pool2d), on the CPU.
 *
 * Images are (H, W, B, F) row-major: element (y, x, b, f) at ((y W + x) B + b) F + f. An
 * output position (yo, xo) of image b with filter tap (i, j) reads input row
 * y = yo sy - py + i, column x = xo sx - px + j. The map holds, for every output row
 * r = (yo Wo + xo) B + b (the row order of an (Ho, Wo, B, .) output) and tap k = i fw + j, the
 * element offset of x[y][x][b][0], or -1 when (y, x) lies outside image b (sizes[b] = (h, w))
 * or (yo, xo) outside that image's output (out_sizes[b]): such taps read zeros and receive no
 * gradient, so padding never leaks into an output or a gradient.
 * cols is (Ho Wo B, fh fw F): row r, column k F + f = the tap's feature f. */
#ifndef RL_IM2COL_H
#define RL_IM2COL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t H, W, B, F; /* input (H, W, B, F) */
    int64_t Ho, Wo;     /* output (Ho, Wo, B, .) */
    int64_t fh, fw;     /* filter (or pooling window) */
    int64_t sy, sx;     /* strides */
    int64_t py, px;     /* top and left padding */
} rl_conv_geom;

/* map (Ho Wo B fh fw): see above. sizes, out_sizes: (B, 2) int32 row-major (height, width). */
void rl_im2col_map(int64_t *map, const rl_conv_geom *g, const int32_t *sizes,
                   const int32_t *out_sizes);
/* cols (n_rows fh fw, F) <- the F-element runs of x the map points at (zeros for -1), for
 * n_taps = n_rows fh fw map entries; any dtype of esize bytes. */
void rl_im2col(void *cols, const void *x, const int64_t *map, int64_t n_taps, int64_t F,
               size_t esize);
/* dx += the transpose of rl_im2col applied to dcols; dt float32 or float64. dx keeps its
 * values elsewhere (the caller zeroes it first). */
void rl_col2im(void *dx, const void *dcols, const int64_t *map, int64_t n_taps, int64_t F,
               rl_dtype dt);

#ifdef __cplusplus
}
#endif

#endif
