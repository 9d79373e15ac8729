/* Where a recurrent layer's parameters sit in cuDNN's weight space, and the one mapping between
 * rnnlua's layout and it: used by the conversion kernel of the cuDNN path
 * (kernels/cuda/cudnn_rnn.cu) and by the host pack/unpack of kernels/cudnn_layout.c, so the
 * mapping can be checked on a machine without a GPU. A plain C header (no CUDA include); the
 * mapping is RL_HD, compiled for the host and the device.
 *
 * rnnlua's layout (layers/lstm.c, layers/gru.c), G gates (LSTM: 4, order i, f, g, o; GRU: 3,
 * order r, z, n), row-major, gate q owning the columns q H .. q H + H - 1:
 *   W (F, G H)   U (H, G H)   b (G H)   and for the GRU b_h (G H)
 * cuDNN's, one layer and one direction (cudnnGetRNNWeightParams): per gate q the linLayerID q is
 * the input matrix, (H, F), and G + q the recurrent one, (H, H), each with its bias vector (H). So
 * gate q's input matrix is the transpose of W's column block q, its recurrent one U's. The gate
 * order of the ids is the one of our columns for both cells (cuDNN's documentation of
 * cudnnGetRNNWeightParams: LSTM ids 0..3 / 4..7 are the input, forget, new-memory and output
 * gates; GRU ids 0..2 / 3..5 the reset, update and new-memory gates, i.e. r, z, n as PyTorch's
 * weight_ih_l0 rows). Biases: the LSTM runs with CUDNN_RNN_SINGLE_INP_BIAS, b = the input biases
 * (recurrent ones, if cuDNN reports any, are held at 0); the GRU with CUDNN_RNN_DOUBLE_BIAS,
 * b = the input biases (ids 0..2), b_h = the recurrent ones (ids 3..5), since the new-memory
 * gate's recurrent bias sits inside the reset gate's product (see kernels/cuda/cudnn_rnn.cu).
 *
 * The offsets and strides are whatever cuDNN reports at run time (read_layout there), never
 * assumed; rl_cudnn_layout_packed fills the packing PyTorch's flattened cuDNN weights rely on
 * (all input matrices in id order, then the recurrent ones, then the biases in id order), which
 * the host tests use in place of a GPU's answer. */
#ifndef RL_KERNELS_CUDNN_LAYOUT_H
#define RL_KERNELS_CUDNN_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/error.h"
#include "../core/hd.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cell of a cuDNN RNN: G = 4 gates (LSTM) or 3 (GRU). */
typedef enum { RL_CUDNN_LSTM, RL_CUDNN_GRU } rl_cudnn_cell;

/* One (H, in) matrix of the weight space: element offset, strides of its rows and columns. */
typedef struct {
    int64_t off, rs, cs;
} rl_cudnn_mat;

typedef struct {
    int64_t F, H;
    int gates;       /* G: 4 (LSTM) or 3 (GRU) */
    bool two_biases; /* ours has b_h (GRU): cuDNN's recurrent biases are it; else they are held 0 */
    rl_cudnn_mat w[4], u[4];
    int64_t b[4], rb[4]; /* offsets of the biases of ids q and G + q; -1: cuDNN has none */
} rl_cudnn_layout;

/* How many of our elements there are: W, U, b and (two_biases) b_h. */
RL_HD_INLINE int64_t rl_cudnn_layout_count(const rl_cudnn_layout *L) {
    int64_t GH = L->gates * L->H;
    return (L->F + L->H + (L->two_biases ? 2 : 1)) * GH;
}

/* Our element e, walking W, U, b, then b_h, each row-major: *which = 0 (W), 1 (U), 2 (b) or
 * 3 (b_h), *k its index in that array; returns its offset in cuDNN's space. */
RL_HD_INLINE int64_t rl_cudnn_layout_map(const rl_cudnn_layout *L, int64_t e, int *which,
                                         int64_t *k) {
    int64_t GH = L->gates * L->H, nw = L->F * GH, nu = L->H * GH;
    if (e < nw + nu) {
        bool in_w = e < nw;
        int64_t kk = in_w ? e : e - nw;
        int64_t c = kk / GH, col = kk - c * GH, q = col / L->H, r = col - q * L->H;
        const rl_cudnn_mat *m = in_w ? &L->w[q] : &L->u[q];
        *which = in_w ? 0 : 1;
        *k = kk;
        return m->off + r * m->rs + c * m->cs;
    }
    int64_t kk = e - nw - nu;
    bool in_b = kk < GH;
    if (!in_b) kk -= GH;
    int64_t q = kk / L->H, r = kk - q * L->H;
    *which = in_b ? 2 : 3;
    *k = kk;
    return (in_b ? L->b[q] : L->rb[q]) + r;
}

/* With one bias (LSTM): the offset of the recurrent bias element cuDNN pairs with our b[k], to be
 * held at 0, or -1 when there is none. */
RL_HD_INLINE int64_t rl_cudnn_layout_unused_bias(const rl_cudnn_layout *L, int64_t k) {
    if (L->two_biases) return -1;
    int64_t q = k / L->H;
    return L->rb[q] < 0 ? -1 : L->rb[q] + (k - q * L->H);
}

/* Fills L with the packing PyTorch's flattened cuDNN weights rely on (see the top); returns the
 * number of elements of that space. */
int64_t rl_cudnn_layout_packed(rl_cudnn_layout *L, rl_cudnn_cell cell, int64_t F, int64_t H);

/* Checks L: G in 3..4, sizes >= 1, every matrix and bias inside a space of n elements, no two of
 * our elements on one place of it (a wrong layout would silently mix weights). fn names the
 * caller in the message. */
rl_status rl_cudnn_layout_check(const rl_cudnn_layout *L, int64_t n, const char *fn);

/* Host-side conversion (float32 or float64, host memory): ours -> space (unused recurrent biases
 * set to 0; the rest of space untouched), and space -> ours (overwriting). bh is NULL unless
 * two_biases. */
void rl_cudnn_layout_pack_host(const rl_cudnn_layout *L, rl_dtype dt, const void *W, const void *U,
                               const void *b, const void *bh, void *space);
void rl_cudnn_layout_unpack_host(const rl_cudnn_layout *L, rl_dtype dt, const void *space, void *W,
                                 void *U, void *b, void *bh);

#ifdef __cplusplus
}
#endif

#endif
