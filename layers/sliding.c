/* The sliding-window geometry shared by conv2d and pool2d (declared in layers.h). */
#include <inttypes.h>

#include "layers.h"

#include "../kernels/ops.h"

/* Output extent of a window of k sliding by s over n positions: "same" pads so that every
 * s-th position is a window centre (ceil(n / s)); "valid" keeps windows inside (-1: none). */
static int64_t out_extent(bool same, int64_t n, int64_t k, int64_t s) {
    if (same) return (n + s - 1) / s;
    return n < k ? -1 : (n - k) / s + 1;
}

rl_status rl_sliding_geometry(const rl_layer *l, const char *window, const rl_layer_io *io,
                              int64_t fh, int64_t fw, int64_t sy, int64_t sx, bool same,
                              rl_conv_geom *g, rl_tensor *out_sizes, rl_tensor *sizes) {
    const rl_tensor *x0 = io->in[0];
    int64_t H = x0->shape[0], W = x0->shape[1], B = x0->shape[2];
    *g = (rl_conv_geom){.H = H,
                        .W = W,
                        .B = B,
                        .F = l->in_dims[0],
                        .Ho = out_extent(same, H, fh, sy),
                        .Wo = out_extent(same, W, fw, sx),
                        .fh = fh,
                        .fw = fw,
                        .sy = sy,
                        .sx = sx,
                        .py = same ? (fh - 1) / 2 : 0,
                        .px = same ? (fw - 1) / 2 : 0};
    int64_t sshape[2] = {B, 2};
    RL_TRY(rl_buffer_ensure(out_sizes, RL_INT32, RL_DEVICE_CPU, 2, sshape));
    int32_t *os = rl_tensor_data(out_sizes);
    RL_TRY(rl_op_contiguous(sizes, io->sizes));
    const int32_t *s = rl_tensor_data(sizes);
    for (int64_t b = 0; b < B; b++) {
        int64_t ho = out_extent(same, s[2 * b], fh, sy),
                wo = out_extent(same, s[2 * b + 1], fw, sx);
        if (ho < 1 || wo < 1) {
            rl_tensor_release(sizes);
            return rl_error(
                RL_ESHAPE,
                RL_LAYER_WHERE ": image %" PRId64 " is %d x %d, smaller than the %" PRId64
                               " x %" PRId64 " %s (padding \"valid\")",
                l->name, l->ops->class_name, b + 1, s[2 * b], s[2 * b + 1], fh, fw, window);
        }
        os[2 * b] = (int32_t)ho;
        os[2 * b + 1] = (int32_t)wo;
    }
    return RL_OK;
}
