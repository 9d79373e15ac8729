/* collapse: images to sequences over the width, by collapsing each column's height (the 2-D
 * to 1-D step of RETURNN's IAM handwriting setups: an MDLSTM stack feeding a BLSTM or a
 * softmax over the columns).
 *
 *   in  x (H, W, B, F) with sizes (B, 2) = (h_b, w_b);  out y (W, B, F) with lengths w_b
 *   sum:  y[x, b, f] = sum_{y < h_b} x[y, x, b, f]
 *   max:  y[x, b, f] = max_{y < h_b} x[y, x, b, f]   (the first row on ties)
 *   last: y[x, b, f] = x[h_b - 1, x, b, f]           (each image's own last row)
 *   y = 0 for x >= w_b
 * Backward: grad_in = grad_out routed back to the rows that made each output (every valid row
 * for sum, the winning row for max, the last row for last), 0 on padding.
 * Option: mode = "sum" (default) | "max" | "last".
 * Buffers: out (W, B, F); lengths (B) int32 (the widths, see rl_collapse_out_lengths); for
 * max the winning row per output element (W, B, F) int32, kept for backward.
 * On a CUDA device: out, arg and the sizes' copy live there (the copy made once per forward),
 * forward and backward are one kernel each (kernels/cuda/image.cu; backward sets every input
 * element, no atomics); the lengths stay a CPU tensor. */
#include <stdio.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../core/device.h"
#include "../kernels/cuda/image_cuda.h"
#include "../kernels/ops.h"

enum { MODE_SUM, MODE_MAX, MODE_LAST };
#ifdef RL_WITH_CUDA
_Static_assert((int)MODE_SUM == (int)RL_IMAGE_COLLAPSE_SUM &&
                   (int)MODE_MAX == (int)RL_IMAGE_COLLAPSE_MAX &&
                   (int)MODE_LAST == (int)RL_IMAGE_COLLAPSE_LAST,
               "collapse modes are passed to the CUDA kernels as they are");
#endif

typedef struct {
    rl_layer base;
    int mode;
    int64_t H, W, B;
    rl_tensor lengths; /* (B) int32 */
    rl_tensor arg;     /* (W, B, F) int32, max only; on the input's device */
    rl_tensor sizes;   /* (B, 2) int32, a copy of the last forward's sizes; on the input's device */
    rl_device dev;     /* of the last forward's input */
} collapse_layer;

static const rl_layer_ops collapse_ops;

/* Element (y, x, b, f) of a contiguous (H, W, B, F) image batch, as a flat offset. */
static int64_t at(const collapse_layer *c, int64_t F, int64_t y, int64_t x, int64_t b) {
    return ((y * c->W + x) * c->B + b) * F;
}

/* The CUDA half of forward (out, the sizes' copy and arg already on the device): the lengths
 * on the host, then one kernel. A CPU-only build never has CUDA data (rl_layer_check_device refuses
 * it). */
static rl_status forward_cuda(collapse_layer *c, const rl_layer_io *io) {
#ifdef RL_WITH_CUDA
    rl_tensor t = {0};
    RL_TRY(rl_op_contiguous(&t, io->sizes));
    const int32_t *s = rl_tensor_data(&t);
    int32_t *len = rl_tensor_data(&c->lengths);
    for (int64_t b = 0; b < c->B; b++)
        len[b] = s[2 * b + 1];
    rl_tensor_release(&t);
    RL_TRY(rl_op_contiguous(&t, io->in[0]));
    rl_status st = rl_image_cuda_collapse_forward(
        t.dtype, c->mode, c->H, c->W, c->B, c->base.n_out, rl_tensor_data(&c->sizes),
        rl_tensor_data(&t), rl_tensor_data(&c->base.out),
        c->mode == MODE_MAX ? rl_tensor_data(&c->arg) : NULL);
    rl_tensor_release(&t);
    return st;
#else
    (void)io;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", c->base.name,
                    "collapse");
#endif
}

/* The CUDA half of backward: grad_in from the contiguous grad_out gc, set on every element. */
static rl_status backward_cuda(collapse_layer *c, const rl_tensor *gc, rl_tensor *grad_in) {
#ifdef RL_WITH_CUDA
    return rl_image_cuda_collapse_backward(gc->dtype, c->mode, c->H, c->W, c->B, c->base.n_out,
                                           rl_tensor_data(&c->sizes),
                                           c->mode == MODE_MAX ? rl_tensor_data(&c->arg) : NULL,
                                           rl_tensor_data(gc), rl_tensor_data(grad_in));
#else
    (void)gc, (void)grad_in;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", c->base.name,
                    "collapse");
#endif
}

static rl_status collapse_forward(rl_layer *l, rl_layer_io *io) {
    collapse_layer *c = (collapse_layer *)l;
    int64_t H, W, B, F = l->n_out;
    RL_TRY(rl_layer_check_inputs_2d(l, io, &H, &W, &B));
    rl_device dev = rl_tensor_device(io->in[0]);
    RL_TRY(rl_layer_check_device(l, dev));
    c->dev = dev;
    c->H = H;
    c->W = W;
    c->B = B;
    rl_dtype dt = io->in[0]->dtype;
    int64_t oshape[3] = {W, B, F}, sshape[2] = {B, 2};
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, oshape));
    RL_TRY(rl_buffer_ensure(&c->lengths, RL_INT32, RL_DEVICE_CPU, 1, &B));
    RL_TRY(rl_buffer_ensure(&c->sizes, RL_INT32, dev, 2, sshape));
    RL_TRY(rl_op_copy(&c->sizes, io->sizes));
    if (c->mode == MODE_MAX) RL_TRY(rl_buffer_ensure(&c->arg, RL_INT32, dev, 3, oshape));
    if (dev.type != RL_CPU) return forward_cuda(c, io);
    RL_TRY(rl_op_fill(&l->out, 0.0));
    rl_tensor xc = {0};
    RL_TRY(rl_op_contiguous(&xc, io->in[0]));
    const int32_t *s = rl_tensor_data(&c->sizes);
    int32_t *len = rl_tensor_data(&c->lengths);
    int32_t *arg = c->mode == MODE_MAX ? rl_tensor_data(&c->arg) : NULL;
    bool f32 = dt == RL_FLOAT32;
    const void *xv = rl_tensor_data(&xc);
    void *yv = rl_tensor_data(&l->out);
    for (int64_t b = 0; b < B; b++) {
        int64_t h = s[2 * b], w = s[2 * b + 1];
        len[b] = (int32_t)w;
        for (int64_t x = 0; x < w; x++) {
            int64_t o = (x * B + b) * F;
            int64_t y0 = c->mode == MODE_LAST ? h - 1 : 0;
            for (int64_t y = y0; y < h; y++) {
                int64_t i = at(c, F, y, x, b);
                for (int64_t f = 0; f < F; f++) {
                    double v = f32 ? ((const float *)xv)[i + f] : ((const double *)xv)[i + f];
                    double cur = f32 ? ((float *)yv)[o + f] : ((double *)yv)[o + f];
                    if (c->mode == MODE_MAX) {
                        if (y > 0 && v <= cur) continue;
                        arg[o + f] = (int32_t)y;
                    } else if (c->mode == MODE_SUM) {
                        v += cur;
                    }
                    if (f32)
                        ((float *)yv)[o + f] = (float)v;
                    else
                        ((double *)yv)[o + f] = v;
                }
            }
        }
    }
    rl_tensor_release(&xc);
    return RL_OK;
}

static rl_status collapse_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                   rl_tensor *const *grad_in) {
    collapse_layer *c = (collapse_layer *)l;
    (void)io;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "collapse");
    if (!grad_in[0]) return RL_OK;
    rl_tensor gc = {0};
    if (c->dev.type != RL_CPU) {
        RL_TRY(rl_op_contiguous(&gc, grad_out));
        rl_status st = backward_cuda(c, &gc, grad_in[0]);
        rl_tensor_release(&gc);
        return st;
    }
    RL_TRY(rl_op_fill(grad_in[0], 0.0));
    RL_TRY(rl_op_contiguous(&gc, grad_out));
    int64_t B = c->B, F = l->n_out;
    const int32_t *s = rl_tensor_data(&c->sizes);
    const int32_t *arg = c->mode == MODE_MAX ? rl_tensor_data(&c->arg) : NULL;
    bool f32 = l->out.dtype == RL_FLOAT32;
    const void *dy = rl_tensor_data(&gc);
    void *dx = rl_tensor_data(grad_in[0]);
    for (int64_t b = 0; b < B; b++) {
        int64_t h = s[2 * b], w = s[2 * b + 1];
        for (int64_t x = 0; x < w; x++) {
            int64_t o = (x * B + b) * F;
            for (int64_t f = 0; f < F; f++) {
                int64_t y0 = c->mode == MODE_SUM ? 0 : c->mode == MODE_MAX ? arg[o + f] : h - 1;
                int64_t y1 = c->mode == MODE_SUM ? h : y0 + 1;
                for (int64_t y = y0; y < y1; y++) {
                    int64_t i = at(c, F, y, x, b) + f;
                    if (f32)
                        ((float *)dx)[i] = ((const float *)dy)[o + f];
                    else
                        ((double *)dx)[i] = ((const double *)dy)[o + f];
                }
            }
        }
    }
    rl_tensor_release(&gc);
    return RL_OK;
}

static void collapse_destroy(rl_layer *l) {
    collapse_layer *c = (collapse_layer *)l;
    rl_tensor_release(&c->lengths);
    rl_tensor_release(&c->arg);
    rl_tensor_release(&c->sizes);
}

static const rl_layer_ops collapse_ops = {.class_name = "collapse",
                                          .forward = collapse_forward,
                                          .backward = collapse_backward,
                                          .destroy = collapse_destroy};

const rl_tensor *rl_collapse_out_lengths(const rl_layer *l) {
    return l->ops == &collapse_ops ? &((const collapse_layer *)l)->lengths : NULL;
}

rl_status rl_collapse_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                             const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": takes one input, got %d (concatenate images "
                                       "with a copy layer)",
                        name, "collapse", n_in);
    const char *m;
    RL_TRY(rl_opt_string(opts, name, "mode", "sum", &m));
    int mode = !strcmp(m, "sum")    ? MODE_SUM
               : !strcmp(m, "max")  ? MODE_MAX
               : !strcmp(m, "last") ? MODE_LAST
                                    : -1;
    if (mode < 0)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": mode must be \"sum\", \"max\" or \"last\", got '%s'",
                        name, "collapse", m);
    RL_TRY(rl_layer_alloc(out, sizeof(collapse_layer), &collapse_ops, name, n_in, in_dims));
    ((collapse_layer *)*out)->mode = mode;
    (*out)->n_out = in_dims[0];
    return RL_OK;
}
