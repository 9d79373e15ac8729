/* conv2d: a 2-D convolution over ragged images, by im2col and one GEMM (CPU).
 *
 *   in  x (H, W, B, F) with sizes (B, 2) = (h_b, w_b);  out y (Ho, Wo, B, n_out)
 *   z[yo, xo, b, o] = bias[o] + sum_{i < fh, j < fw, f < F} x~[yo sy - py + i, xo sx - px + j, b,
 * f]
 *                                                          * W[(i fw + j) F + f, o]
 *   y = act(z) on each image's valid outputs (yo < ho_b, xo < wo_b), 0 elsewhere
 * with x~ = x inside image b and 0 outside it (batch padding is never read).
 * Params: W (fh fw F, n_out), rows ordered (i, j, f) as above (TensorFlow's HWIO filter
 * flattened), glorot with fan_in = fh fw F; b (n_out) zeros unless with_bias = false.
 * Options: n_out, filter_size = {fh, fw} (or one number), padding = "same" (default) | "valid",
 * strides = {sy, sx} (default 1), activation (default identity), with_bias (default true).
 *   same:  py = (fh - 1) / 2, ho = ceil(h / sy)  (stride 1 keeps each image's size)
 *   valid: py = 0,            ho = (h - fh) / sy + 1, an error for an image smaller than fh
 * (the same for the width with fw, sx, px). Each image's output size depends only on its own
 * size, so a result never depends on the other images of the batch.
 *
 * Forward: map (Ho Wo B, fh fw) tap sources (kernels/im2col.h), cols (Ho Wo B, fh fw F),
 * z = cols W + b (one GEMM), y = act(z) on valid outputs, set to 0 on the others (selected by
 * pad = 1 - the row mask, not multiplied: a NaN or Inf there must not survive as NaN).
 * Backward: dz = grad_out act'(z), set to 0 on padded outputs (grad_out there may hold anything,
 * NaN included); dW += cols^T dz; db += sum_rows dz; grad_in = col2im(
 * dz W^T), which is 0 on padding. Backward keeps cols, map, pad, out and (for activations
 * whose derivative needs the input) z from forward.
 * On a CUDA device the same steps run there: im2col, col2im and the mask are kernels of
 * kernels/cuda/image.cu that read the sizes and output sizes from a device copy made once per
 * forward (no tap map), the GEMMs are cuBLAS through rl_op_gemm, and bias, activation and mask
 * go through rl_op_* as on the CPU. The output sizes stay a CPU tensor. */
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
    int64_t fh, fw, sy, sx;
    bool same;
    rl_activation act;
    int iW, ib;
    int64_t *map;
    size_t map_cap; /* entries */
    rl_conv_geom g;
    rl_tensor cols;      /* (Ho Wo B, fh fw F) */
    rl_tensor mask;      /* (Ho Wo B, 1): 1 on valid output rows */
    rl_tensor pad;       /* (Ho Wo B, 1): 1 - mask, what masked_fill zeroes */
    rl_tensor z;         /* (Ho, Wo, B, n_out), only when act' needs it */
    rl_tensor dz;        /* (Ho, Wo, B, n_out) */
    rl_tensor dcols;     /* (Ho Wo B, fh fw F) */
    rl_tensor db;        /* (n_out) */
    rl_tensor out_sizes; /* (B, 2) int32 */
    rl_device dev;       /* of the last forward's input */
    rl_tensor dsizes;    /* (2, B, 2) int32 on a CUDA device: sizes, out_sizes */
} conv2d_layer;

static const rl_layer_ops conv2d_ops;

/* A 2-D (rows, cols) view of a contiguous tensor. */
static rl_status rows_view(rl_tensor *out, const rl_tensor *t, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return rl_tensor_view(out, t, 2, shape);
}

/* The CUDA half of forward: the sizes and output sizes to the device, then cols and mask there.
 * A CPU-only build never has CUDA data (rl_layer_check_device refuses it). */
static rl_status cols_cuda(conv2d_layer *C, const rl_tensor *sizes, const rl_tensor *xc) {
#ifdef RL_WITH_CUDA
    int64_t B = C->g.B, dshape[3] = {2, B, 2};
    RL_TRY(rl_buffer_ensure(&C->dsizes, RL_INT32, C->dev, 3, dshape));
    rl_tensor v = {0};
    RL_TRY(rl_tensor_select(&v, &C->dsizes, 0, 0));
    rl_status st = rl_op_copy(&v, sizes);
    rl_tensor_release(&v);
    if (st == RL_OK) st = rl_tensor_select(&v, &C->dsizes, 0, 1);
    if (st == RL_OK) st = rl_op_copy(&v, &C->out_sizes);
    rl_tensor_release(&v);
    RL_TRY(st);
    const int32_t *ds = rl_tensor_data(&C->dsizes);
    rl_dtype dt = xc->dtype;
    RL_TRY(rl_image_cuda_im2col(dt, &C->g, ds, ds + 2 * B, rl_tensor_data(xc),
                                rl_tensor_data(&C->cols)));
    return rl_image_cuda_row_mask(dt, &C->g, ds + 2 * B, rl_tensor_data(&C->mask));
#else
    (void)sizes, (void)xc;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", C->base.name,
                    "conv2d");
#endif
}

static rl_status conv2d_forward(rl_layer *l, rl_layer_io *io) {
    conv2d_layer *C = (conv2d_layer *)l;
    int64_t H, W, B;
    RL_TRY(rl_layer_check_inputs_2d(l, io, &H, &W, &B));
    const rl_tensor *x0 = io->in[0];
    rl_device dev = rl_tensor_device(x0);
    RL_TRY(rl_layer_check_device(l, dev));
    C->dev = dev;
    rl_dtype dt = x0->dtype;
    int64_t F = l->in_dims[0];
    rl_conv_geom *g = &C->g;
    rl_tensor sz = {0};
    RL_TRY(rl_sliding_geometry(l, "filter", io, C->fh, C->fw, C->sy, C->sx, C->same, g,
                               &C->out_sizes, &sz));
    const int32_t *s = rl_tensor_data(&sz), *os = rl_tensor_data(&C->out_sizes);
    rl_status st = RL_OK;
    int64_t R = g->Ho * g->Wo * B, K = C->fh * C->fw;
    if (st == RL_OK && dev.type == RL_CPU)
        st = rl_layer_grow_index(l, &C->map, &C->map_cap, (size_t)(R * K));
    if (st == RL_OK && dev.type == RL_CPU) rl_im2col_map(C->map, g, s, os);
    rl_tensor_release(&sz);
    RL_TRY(st);

    int64_t cshape[2] = {R, K * F}, mshape[2] = {R, 1};
    int64_t oshape[4] = {g->Ho, g->Wo, B, l->n_out};
    RL_TRY(rl_buffer_ensure(&C->cols, dt, dev, 2, cshape));
    RL_TRY(rl_buffer_ensure(&C->mask, dt, dev, 2, mshape));
    RL_TRY(rl_buffer_ensure(&C->pad, dt, dev, 2, mshape));
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 4, oshape));
    rl_tensor xc = {0};
    RL_TRY(rl_op_contiguous(&xc, x0));
    if (dev.type == RL_CPU) {
        rl_im2col(rl_tensor_data(&C->cols), rl_tensor_data(&xc), C->map, R * K, F,
                  rl_dtype_size(dt));
        for (int64_t r = 0; r < R; r++) {
            int64_t b = r % B, xo = (r / B) % g->Wo, yo = r / (B * g->Wo);
            int64_t idx[2] = {r, 0};
            rl_tensor_set(&C->mask, idx, yo < os[2 * b] && xo < os[2 * b + 1] ? 1.0 : 0.0);
        }
    } else {
        st = cols_cuda(C, io->sizes, &xc);
    }
    rl_tensor_release(&xc);
    RL_TRY(st);
    RL_TRY(rl_op_binary_scalar(&C->pad, &C->mask, 1.0, RL_BIN_SUB, true));

    rl_tensor *z = &l->out;
    if (rl_activation_needs_input(C->act)) {
        RL_TRY(rl_buffer_ensure(&C->z, dt, dev, 4, oshape));
        z = &C->z;
    }
    rl_tensor z2 = {0}, y2 = {0};
    st = rows_view(&z2, z, R, l->n_out);
    if (st == RL_OK && C->ib >= 0) st = rl_op_copy(&z2, &l->params[C->ib].value);
    if (st == RL_OK)
        st = rl_op_gemm(&z2, &C->cols, &l->params[C->iW].value, false, false, 1.0,
                        C->ib >= 0 ? 1.0 : 0.0);
    if (st == RL_OK) st = rl_activation_forward(C->act, &l->out, z);
    if (st == RL_OK) st = rows_view(&y2, &l->out, R, l->n_out);
    if (st == RL_OK) st = rl_op_masked_fill(&y2, &C->pad, 0.0);
    rl_tensor_release(&y2);
    rl_tensor_release(&z2);
    return st;
}

/* The CUDA half of backward: grad_in = col2im(dcols), set on every element. */
static rl_status col2im_cuda(conv2d_layer *C, rl_tensor *grad_in) {
#ifdef RL_WITH_CUDA
    const int32_t *ds = rl_tensor_data(&C->dsizes);
    return rl_image_cuda_col2im(C->dcols.dtype, &C->g, ds, ds + 2 * C->g.B,
                                rl_tensor_data(&C->dcols), rl_tensor_data(grad_in));
#else
    (void)grad_in;
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": rnnlua was built without CUDA", C->base.name,
                    "conv2d");
#endif
}

static rl_status conv2d_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                 rl_tensor *const *grad_in) {
    conv2d_layer *C = (conv2d_layer *)l;
    (void)io;
    if (!grad_out)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward needs grad_out", l->name, "conv2d");
    rl_dtype dt = l->out.dtype;
    int64_t R = C->g.Ho * C->g.Wo * C->g.B, KF = C->fh * C->fw * C->g.F;
    RL_TRY(rl_buffer_ensure(&C->dz, dt, C->dev, 4, l->out.shape));
    RL_TRY(rl_activation_backward(C->act, &C->dz, grad_out, &C->z, &l->out));
    rl_tensor dz2 = {0};
    RL_TRY(rows_view(&dz2, &C->dz, R, l->n_out));
    rl_status st = rl_op_masked_fill(&dz2, &C->pad, 0.0);
    if (st == RL_OK) st = rl_op_gemm(&l->params[C->iW].grad, &C->cols, &dz2, true, false, 1.0, 1.0);
    if (st == RL_OK && C->ib >= 0) {
        st = rl_buffer_ensure(&C->db, dt, C->dev, 1, &l->n_out);
        if (st == RL_OK) st = rl_op_reduce_dim(&C->db, NULL, &dz2, 0, false, RL_RED_SUM);
        if (st == RL_OK)
            st = rl_op_binary(&l->params[C->ib].grad, &l->params[C->ib].grad, &C->db, RL_BIN_ADD);
    }
    if (st == RL_OK && grad_in[0]) {
        int64_t cshape[2] = {R, KF};
        st = rl_buffer_ensure(&C->dcols, dt, C->dev, 2, cshape);
        if (st == RL_OK)
            st = rl_op_gemm(&C->dcols, &dz2, &l->params[C->iW].value, false, true, 1.0, 0.0);
        if (st == RL_OK && C->dev.type == RL_CPU) {
            st = rl_op_fill(grad_in[0], 0.0);
            if (st == RL_OK)
                rl_col2im(rl_tensor_data(grad_in[0]), rl_tensor_data(&C->dcols), C->map,
                          R * C->fh * C->fw, C->g.F, dt);
        } else if (st == RL_OK) {
            st = col2im_cuda(C, grad_in[0]);
        }
    }
    rl_tensor_release(&dz2);
    return st;
}

static void conv2d_destroy(rl_layer *l) {
    conv2d_layer *C = (conv2d_layer *)l;
    free(C->map);
    rl_tensor_release(&C->cols);
    rl_tensor_release(&C->mask);
    rl_tensor_release(&C->pad);
    rl_tensor_release(&C->z);
    rl_tensor_release(&C->dz);
    rl_tensor_release(&C->dcols);
    rl_tensor_release(&C->db);
    rl_tensor_release(&C->out_sizes);
    rl_tensor_release(&C->dsizes);
}

static const rl_layer_ops conv2d_ops = {.class_name = "conv2d",
                                        .forward = conv2d_forward,
                                        .backward = conv2d_backward,
                                        .destroy = conv2d_destroy};

const rl_tensor *rl_conv2d_out_sizes(const rl_layer *l) {
    return l->ops == &conv2d_ops ? &((const conv2d_layer *)l)->out_sizes : NULL;
}

rl_status rl_conv2d_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims) {
    *out = NULL;
    if (n_in != 1)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": takes one input, got %d (concatenate images with a "
                                       "copy layer)",
                        name, "conv2d", n_in);
    int64_t n_out, fsize[2], strides[2];
    const char *pad, *act_s;
    bool with_bias;
    rl_activation act;
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &n_out));
    RL_TRY(rl_opt_pair(opts, name, "filter_size", 0, 1, true, fsize));
    RL_TRY(rl_opt_pair(opts, name, "strides", 1, 1, false, strides));
    RL_TRY(rl_opt_string(opts, name, "padding", "same", &pad));
    if (strcmp(pad, "same") != 0 && strcmp(pad, "valid") != 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": padding must be \"same\" or \"valid\", got '%s'",
                        name, "conv2d", pad);
    RL_TRY(rl_opt_string(opts, name, "activation", "identity", &act_s));
    RL_TRY(rl_activation_parse(act_s, name, &act));
    RL_TRY(rl_opt_bool(opts, name, "with_bias", true, &with_bias));
    RL_TRY(rl_layer_alloc(out, sizeof(conv2d_layer), &conv2d_ops, name, n_in, in_dims));
    conv2d_layer *C = (conv2d_layer *)*out;
    C->fh = fsize[0];
    C->fw = fsize[1];
    C->sy = strides[0];
    C->sx = strides[1];
    C->same = strcmp(pad, "same") == 0;
    C->act = act;
    C->ib = -1;
    (*out)->n_out = n_out;
    int64_t K = C->fh * C->fw * in_dims[0];
    int64_t wshape[2] = {K, n_out};
    rl_status st = rl_layer_add_param(*out, "W", 2, wshape, RL_INIT_GLOROT, 1.0, K, n_out, &C->iW);
    if (st == RL_OK && with_bias)
        st = rl_layer_add_param(*out, "b", 1, &n_out, RL_INIT_ZEROS, 0.0, 0, 0, &C->ib);
    if (st != RL_OK) {
        rl_layer_free(*out);
        *out = NULL;
    }
    return st;
}
