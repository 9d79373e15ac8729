/* global_pool: each whole image to one frame, for whole-image classification.
 *
 *   in  x (H, W, B, F) with sizes (B, 2) = (h_b, w_b);  out y (1, B, F), lengths all 1
 *   mean: y[0, b, f] = (1 / (h_b w_b)) sum_{y < h_b, x < w_b} x[y, x, b, f]
 *   max:  y[0, b, f] = max over the same positions (the first in row-major order on ties)
 * Backward: mean spreads grad_out / (h_b w_b) over the image's positions, max routes it to the
 * winning position; padding gets 0.
 * Option: mode = "mean" (default) | "max".
 * Buffers: out (1, B, F); lengths (B) int32 of ones (rl_global_pool_out_lengths); a copy of
 * the sizes and, for max, the winning position y W + x per output element (B, F) int32, kept
 * for backward.
 * On a CUDA device: out, arg and the sizes' copy live there (the copy made once per forward),
 * forward and backward are one kernel each (kernels/cuda/image.cu: the mean accumulated in
 * double as here; backward sets every input element, no atomics); the lengths stay a CPU
 * tensor. */
#include <stdio.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../core/device.h"
#include "../kernels/cuda/image_cuda.h"
#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    bool max;
    int64_t W, B;
    rl_tensor lengths; /* (B) int32, ones */
    rl_tensor sizes;   /* (B, 2) int32, on the input's device */
    rl_tensor arg;     /* (B, F) int32, max only, on the input's device */
    int64_t H;
    rl_device dev; /* of the last forward's input */
} global_pool_layer;

static const rl_layer_ops global_pool_ops;

/* The CUDA half of forward (out, the sizes' copy and arg already on the device): one kernel.
 * A CPU-only build never has CUDA data (rl_layer_check_device refuses it). */
static rl_status forward_cuda(global_pool_layer *g, const rl_tensor *x) {
#ifdef RL_WITH_CUDA
    rl_tensor t = {0};
    RL_TRY(rl_op_contiguous(&t, x));
    rl_status st = rl_image_cuda_global_pool_forward(
        t.dtype, g->max, g->H, g->W, g->B, g->base.n_out, rl_tensor_data(&g->sizes),
        rl_tensor_data(&t), rl_tensor_data(&g->base.out), g->max ? rl_tensor_data(&g->arg) : NULL);
    rl_tensor_release(&t);
    return st;
#else
    (void)x;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", g->base.name,
                    "global_pool");
#endif
}

/* The CUDA half of backward: grad_in from the contiguous grad_out gc, set on every element. */
static rl_status backward_cuda(global_pool_layer *g, const rl_tensor *gc, rl_tensor *grad_in) {
#ifdef RL_WITH_CUDA
    return rl_image_cuda_global_pool_backward(
        gc->dtype, g->max, g->H, g->W, g->B, g->base.n_out, rl_tensor_data(&g->sizes),
        g->max ? rl_tensor_data(&g->arg) : NULL, rl_tensor_data(gc), rl_tensor_data(grad_in));
#else
    (void)gc, (void)grad_in;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", g->base.name,
                    "global_pool");
#endif
}

static rl_status global_pool_forward(rl_layer *l, rl_layer_io *io) {
    global_pool_layer *g = (global_pool_layer *)l;
    int64_t H, W, B, F = l->n_out;
    RL_TRY(rl_layer_check_inputs_2d(l, io, &H, &W, &B));
    rl_device dev = rl_tensor_device(io->in[0]);
    RL_TRY(rl_layer_check_device(l, dev));
    g->dev = dev;
    g->H = H;
    g->W = W;
    g->B = B;
    rl_dtype dt = io->in[0]->dtype;
    int64_t oshape[3] = {1, B, F}, sshape[2] = {B, 2}, ashape[2] = {B, F};
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 3, oshape));
    RL_TRY(rl_buffer_ensure(&g->lengths, RL_INT32, RL_DEVICE_CPU, 1, &B));
    RL_TRY(rl_op_fill(&g->lengths, 1.0));
    RL_TRY(rl_buffer_ensure(&g->sizes, RL_INT32, dev, 2, sshape));
    RL_TRY(rl_op_copy(&g->sizes, io->sizes));
    if (g->max) RL_TRY(rl_buffer_ensure(&g->arg, RL_INT32, dev, 2, ashape));
    if (dev.type != RL_CPU) return forward_cuda(g, io->in[0]);
    rl_tensor xc = {0};
    RL_TRY(rl_op_contiguous(&xc, io->in[0]));
    const int32_t *s = rl_tensor_data(&g->sizes);
    int32_t *arg = g->max ? rl_tensor_data(&g->arg) : NULL;
    bool f32 = dt == RL_FLOAT32;
    const void *xv = rl_tensor_data(&xc);
    void *yv = rl_tensor_data(&l->out);
    for (int64_t b = 0; b < B; b++) {
        int64_t h = s[2 * b], w = s[2 * b + 1];
        for (int64_t f = 0; f < F; f++) {
            double acc = 0;
            int32_t best = 0;
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    int64_t i = ((y * W + x) * B + b) * F + f;
                    double v = f32 ? ((const float *)xv)[i] : ((const double *)xv)[i];
                    if (!g->max) {
                        acc += v;
                    } else if ((y == 0 && x == 0) || v > acc) {
                        acc = v;
                        best = (int32_t)(y * W + x);
                    }
                }
            if (!g->max) acc /= (double)(h * w);
            if (arg) arg[b * F + f] = best;
            if (f32)
                ((float *)yv)[b * F + f] = (float)acc;
            else
                ((double *)yv)[b * F + f] = acc;
        }
    }
    rl_tensor_release(&xc);
    return RL_OK;
}

static rl_status global_pool_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                      rl_tensor *const *grad_in) {
    global_pool_layer *g = (global_pool_layer *)l;
    (void)io;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name,
                        "global_pool");
    if (!grad_in[0]) return RL_OK;
    rl_tensor gc = {0};
    if (g->dev.type != RL_CPU) {
        RL_TRY(rl_op_contiguous(&gc, grad_out));
        rl_status st = backward_cuda(g, &gc, grad_in[0]);
        rl_tensor_release(&gc);
        return st;
    }
    RL_TRY(rl_op_fill(grad_in[0], 0.0));
    RL_TRY(rl_op_contiguous(&gc, grad_out));
    int64_t W = g->W, B = g->B, F = l->n_out;
    const int32_t *s = rl_tensor_data(&g->sizes);
    const int32_t *arg = g->max ? rl_tensor_data(&g->arg) : NULL;
    bool f32 = l->out.dtype == RL_FLOAT32;
    const void *dy = rl_tensor_data(&gc);
    void *dx = rl_tensor_data(grad_in[0]);
    for (int64_t b = 0; b < B; b++) {
        int64_t h = s[2 * b], w = s[2 * b + 1];
        for (int64_t f = 0; f < F; f++) {
            double d = f32 ? ((const float *)dy)[b * F + f] : ((const double *)dy)[b * F + f];
            if (g->max) {
                int64_t i = ((int64_t)arg[b * F + f] * B + b) * F + f;
                if (f32)
                    ((float *)dx)[i] = (float)d;
                else
                    ((double *)dx)[i] = d;
                continue;
            }
            d /= (double)(h * w);
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    int64_t i = ((y * W + x) * B + b) * F + f;
                    if (f32)
                        ((float *)dx)[i] = (float)d;
                    else
                        ((double *)dx)[i] = d;
                }
        }
    }
    rl_tensor_release(&gc);
    return RL_OK;
}

static void global_pool_destroy(rl_layer *l) {
    global_pool_layer *g = (global_pool_layer *)l;
    rl_tensor_release(&g->lengths);
    rl_tensor_release(&g->sizes);
    rl_tensor_release(&g->arg);
}

static const rl_layer_ops global_pool_ops = {.class_name = "global_pool",
                                             .forward = global_pool_forward,
                                             .backward = global_pool_backward,
                                             .destroy = global_pool_destroy};

const rl_tensor *rl_global_pool_out_lengths(const rl_layer *l) {
    return l->ops == &global_pool_ops ? &((const global_pool_layer *)l)->lengths : NULL;
}

rl_status rl_global_pool_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                                const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": takes one input, got %d (concatenate images "
                                       "with a copy layer)",
                        name, "global_pool", n_in);
    const char *m;
    RL_TRY(rl_opt_string(opts, name, "mode", "mean", &m));
    if (strcmp(m, "mean") != 0 && strcmp(m, "max") != 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": mode must be \"mean\" or \"max\", got '%s'",
                        name, "global_pool", m);
    RL_TRY(rl_layer_alloc(out, sizeof(global_pool_layer), &global_pool_ops, name, n_in, in_dims));
    ((global_pool_layer *)*out)->max = strcmp(m, "max") == 0;
    (*out)->n_out = in_dims[0];
    return RL_OK;
}
