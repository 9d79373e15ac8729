/* pool2d: max or average pooling over ragged images.
 *
 *   in  x (H, W, B, F) with sizes (B, 2);  out y (Ho, Wo, B, F)
 *   window of output (yo, xo): rows yo sy - py + i, columns xo sx - px + j, i < ph, j < pw,
 *   restricted to the taps inside image b (batch padding is never read)
 *   max: y = max over the window's taps;  avg: y = their mean (padding not counted)
 *   y = 0 on outputs outside the image's output size (ho_b, wo_b)
 * Options: mode = "max" (default) | "avg", pool_size = {ph, pw} (or one number, required),
 * strides = {sy, sx} (default pool_size), padding = "valid" (default) | "same", with the
 * output sizes of conv2d: valid ho = (h - ph) / sy + 1 (an error for an image smaller than the
 * window), same ho = ceil(h / sy) with py = (ph - 1) / 2.
 * Backward: max routes each output's gradient to the tap that won (the first in window order
 * on ties), avg spreads it evenly over the window's taps; padding gets 0.
 * Buffers: out; the tap map (kernels/im2col.h) and, for max, the winning input offset per
 * output element (arg, int64), both kept for backward.
 * On a CUDA device: the kernels of kernels/cuda/image.cu, which read the sizes and output sizes
 * from a device copy made once per forward (no tap map); max keeps the winning tap i pw + j per
 * output element (darg, int32, -1 for none); backward gathers over input positions (no
 * atomics, also for overlapping windows), so it is deterministic. The output sizes stay a CPU
 * tensor. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

#include "../core/device.h"
#include "../kernels/cuda/image_cuda.h"
#include "../kernels/im2col.h"
#include "../kernels/ops.h"

typedef struct {
    rl_layer base;
    int64_t ph, pw, sy, sx;
    bool same, max;
    rl_conv_geom g;
    int64_t *map, *arg;
    size_t map_cap, arg_cap;
    rl_tensor out_sizes; /* (B, 2) int32 */
    rl_device dev;       /* of the last forward's input */
    rl_tensor dsizes;    /* (2, B, 2) int32 on a CUDA device: sizes, out_sizes */
    rl_tensor darg;      /* (Ho Wo B, F) int32 on a CUDA device, max only */
} pool2d_layer;

static const rl_layer_ops pool2d_ops;

/* One output row r in one precision, REAL float (S f32) or double (S f64): the window's taps
 * map[0..K-1] over x, F features, into y (and arg). */
#define RL_POOL_ROW(REAL, S)                                                                       \
    static void pool_row_##S(REAL *y, int64_t *arg, const REAL *x, const int64_t *map, int64_t K,  \
                             int64_t F, bool max) {                                                \
        int64_t n = 0;                                                                             \
        for (int64_t f = 0; f < F; f++) {                                                          \
            y[f] = 0;                                                                              \
            if (arg) arg[f] = -1;                                                                  \
        }                                                                                          \
        for (int64_t k = 0; k < K; k++) {                                                          \
            if (map[k] < 0) continue;                                                              \
            const REAL *v = x + map[k];                                                            \
            for (int64_t f = 0; f < F; f++) {                                                      \
                if (!max)                                                                          \
                    y[f] += v[f];                                                                  \
                else if (n == 0 || v[f] > y[f]) {                                                  \
                    y[f] = v[f];                                                                   \
                    arg[f] = map[k] + f;                                                           \
                }                                                                                  \
            }                                                                                      \
            n++;                                                                                   \
        }                                                                                          \
        if (!max && n > 0)                                                                         \
            for (int64_t f = 0; f < F; f++)                                                        \
                y[f] /= (REAL)n;                                                                   \
    }

RL_POOL_ROW(float, f32)
RL_POOL_ROW(double, f64)

/* The CUDA half of forward: the sizes and output sizes to the device, then one kernel. A
 * CPU-only build never has CUDA data (rl_layer_check_device refuses it). */
static rl_status forward_cuda(pool2d_layer *P, const rl_tensor *sizes, const rl_tensor *xc) {
#ifdef RL_WITH_CUDA
    int64_t B = P->g.B, dshape[3] = {2, B, 2}, ashape[2] = {P->g.Ho * P->g.Wo * B, P->g.F};
    RL_TRY(rl_buffer_ensure(&P->dsizes, RL_INT32, P->dev, 3, dshape));
    if (P->max) RL_TRY(rl_buffer_ensure(&P->darg, RL_INT32, P->dev, 2, ashape));
    rl_tensor v = {0};
    RL_TRY(rl_tensor_select(&v, &P->dsizes, 0, 0));
    rl_status st = rl_op_copy(&v, sizes);
    rl_tensor_release(&v);
    if (st == RL_OK) st = rl_tensor_select(&v, &P->dsizes, 0, 1);
    if (st == RL_OK) st = rl_op_copy(&v, &P->out_sizes);
    rl_tensor_release(&v);
    RL_TRY(st);
    const int32_t *ds = rl_tensor_data(&P->dsizes);
    return rl_image_cuda_pool_forward(xc->dtype, &P->g, ds, ds + 2 * B, P->max, rl_tensor_data(xc),
                                      rl_tensor_data(&P->base.out),
                                      P->max ? rl_tensor_data(&P->darg) : NULL);
#else
    (void)sizes, (void)xc;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", P->base.name,
                    "pool2d");
#endif
}

/* The CUDA half of backward: grad_in from the contiguous grad_out gc, set on every element. */
static rl_status backward_cuda(pool2d_layer *P, const rl_tensor *gc, rl_tensor *grad_in) {
#ifdef RL_WITH_CUDA
    const int32_t *ds = rl_tensor_data(&P->dsizes);
    return rl_image_cuda_pool_backward(gc->dtype, &P->g, ds, ds + 2 * P->g.B, P->max,
                                       P->max ? rl_tensor_data(&P->darg) : NULL, rl_tensor_data(gc),
                                       rl_tensor_data(grad_in));
#else
    (void)gc, (void)grad_in;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", P->base.name,
                    "pool2d");
#endif
}

static rl_status pool2d_forward(rl_layer *l, rl_layer_io *io) {
    pool2d_layer *P = (pool2d_layer *)l;
    int64_t H, W, B;
    RL_TRY(rl_layer_check_inputs_2d(l, io, &H, &W, &B));
    const rl_tensor *x0 = io->in[0];
    rl_device dev = rl_tensor_device(x0);
    RL_TRY(rl_layer_check_device(l, dev));
    P->dev = dev;
    rl_dtype dt = x0->dtype;
    int64_t F = l->in_dims[0];
    rl_conv_geom *g = &P->g;
    rl_tensor sz = {0};
    RL_TRY(rl_sliding_geometry(l, "window", io, P->ph, P->pw, P->sy, P->sx, P->same, g,
                               &P->out_sizes, &sz));
    const int32_t *s = rl_tensor_data(&sz), *os = rl_tensor_data(&P->out_sizes);
    rl_status st = RL_OK;
    int64_t R = g->Ho * g->Wo * B, K = P->ph * P->pw;
    bool cpu = dev.type == RL_CPU;
    if (st == RL_OK && cpu) st = rl_layer_grow_index(l, &P->map, &P->map_cap, (size_t)(R * K));
    if (st == RL_OK && cpu && P->max)
        st = rl_layer_grow_index(l, &P->arg, &P->arg_cap, (size_t)(R * F));
    if (st == RL_OK && cpu) rl_im2col_map(P->map, g, s, os);
    rl_tensor_release(&sz);
    RL_TRY(st);
    int64_t oshape[4] = {g->Ho, g->Wo, B, F};
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 4, oshape));
    rl_tensor xc = {0};
    RL_TRY(rl_op_contiguous(&xc, x0));
    if (!cpu) {
        st = forward_cuda(P, io->sizes, &xc);
        rl_tensor_release(&xc);
        return st;
    }
    for (int64_t r = 0; r < R; r++) {
        int64_t *arg = P->max ? P->arg + r * F : NULL;
        if (dt == RL_FLOAT32)
            pool_row_f32((float *)rl_tensor_data(&l->out) + r * F, arg, rl_tensor_data(&xc),
                         P->map + r * K, K, F, P->max);
        else
            pool_row_f64((double *)rl_tensor_data(&l->out) + r * F, arg, rl_tensor_data(&xc),
                         P->map + r * K, K, F, P->max);
    }
    rl_tensor_release(&xc);
    return RL_OK;
}

static rl_status pool2d_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                 rl_tensor *const *grad_in) {
    pool2d_layer *P = (pool2d_layer *)l;
    (void)io;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "pool2d");
    if (!grad_in[0]) return RL_OK;
    rl_tensor gc = {0};
    if (P->dev.type != RL_CPU) {
        RL_TRY(rl_op_contiguous(&gc, grad_out));
        rl_status st = backward_cuda(P, &gc, grad_in[0]);
        rl_tensor_release(&gc);
        return st;
    }
    RL_TRY(rl_op_fill(grad_in[0], 0.0));
    RL_TRY(rl_op_contiguous(&gc, grad_out));
    int64_t F = P->g.F, R = P->g.Ho * P->g.Wo * P->g.B, K = P->ph * P->pw;
    bool f32 = l->out.dtype == RL_FLOAT32;
    void *dx = rl_tensor_data(grad_in[0]);
    const void *dy = rl_tensor_data(&gc);
    for (int64_t r = 0; r < R; r++) {
        if (P->max) {
            for (int64_t f = 0; f < F; f++) {
                int64_t a = P->arg[r * F + f];
                if (a < 0) continue;
                if (f32)
                    ((float *)dx)[a] += ((const float *)dy)[r * F + f];
                else
                    ((double *)dx)[a] += ((const double *)dy)[r * F + f];
            }
            continue;
        }
        const int64_t *m = P->map + r * K;
        int64_t n = 0;
        for (int64_t k = 0; k < K; k++)
            n += m[k] >= 0;
        for (int64_t k = 0; k < K && n > 0; k++) {
            if (m[k] < 0) continue;
            for (int64_t f = 0; f < F; f++) {
                if (f32)
                    ((float *)dx)[m[k] + f] += ((const float *)dy)[r * F + f] / (float)n;
                else
                    ((double *)dx)[m[k] + f] += ((const double *)dy)[r * F + f] / (double)n;
            }
        }
    }
    rl_tensor_release(&gc);
    return RL_OK;
}

static void pool2d_destroy(rl_layer *l) {
    pool2d_layer *P = (pool2d_layer *)l;
    free(P->map);
    free(P->arg);
    rl_tensor_release(&P->out_sizes);
    rl_tensor_release(&P->dsizes);
    rl_tensor_release(&P->darg);
}

static const rl_layer_ops pool2d_ops = {.class_name = "pool2d",
                                        .forward = pool2d_forward,
                                        .backward = pool2d_backward,
                                        .destroy = pool2d_destroy};

const rl_tensor *rl_pool2d_out_sizes(const rl_layer *l) {
    return l->ops == &pool2d_ops ? &((const pool2d_layer *)l)->out_sizes : NULL;
}

rl_status rl_pool2d_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": takes one input, got %d (concatenate images with a "
                                       "copy layer)",
                        name, "pool2d", n_in);
    int64_t psize[2], strides[2];
    const char *mode, *pad;
    RL_TRY(rl_opt_pair(opts, name, "pool_size", 0, 1, true, psize));
    double given;
    int found = 0;
    RL_TRY(opts->number(opts->ctx, "strides[1]", &given, &found));
    strides[0] = psize[0];
    strides[1] = psize[1];
    if (found) RL_TRY(rl_opt_pair(opts, name, "strides", 1, 1, false, strides));
    RL_TRY(rl_opt_string(opts, name, "mode", "max", &mode));
    RL_TRY(rl_opt_string(opts, name, "padding", "valid", &pad));
    if (strcmp(mode, "max") != 0 && strcmp(mode, "avg") != 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": mode must be \"max\" or \"avg\", got '%s'", name,
                        "pool2d", mode);
    if (strcmp(pad, "same") != 0 && strcmp(pad, "valid") != 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": padding must be \"same\" or \"valid\", got '%s'",
                        name, "pool2d", pad);
    RL_TRY(rl_layer_alloc(out, sizeof(pool2d_layer), &pool2d_ops, name, n_in, in_dims));
    pool2d_layer *P = (pool2d_layer *)*out;
    P->ph = psize[0];
    P->pw = psize[1];
    P->sy = strides[0];
    P->sx = strides[1];
    P->max = strcmp(mode, "max") == 0;
    P->same = strcmp(pad, "same") == 0;
    (*out)->n_out = in_dims[0];
    return RL_OK;
}
