/* The MDLSTM on CUDA devices (kernels/cuda/mdlstm.cu): the diagonal loops of layers/mdlstm.c
 * and the few elementwise passes around them. A plain C header: no CUDA include; streams are
 * `void *` holding a cudaStream_t (NULL: the legacy default stream, which the tensor ops and the
 * caching allocator use too). Only present in a CUDA build (RL_WITH_CUDA).
 *
 * Layout and equations are those of layers/mdlstm.c and kernels/mdlstm.h: position-major
 * buffers, row = (y * W + x) * B + b; nd directions, direction k owning columns k*5D .. k*5D+5D-1
 * of z (gate blocks i, a, b, g, o) and k*D .. k*D+D-1 of the states; dt float32 or float64.
 *
 * Cell lists (device memory, built on the host by layers/mdlstm.c for all diagonals at once and
 * copied once per batch): five int64 arrays of `cap` entries each, back to back: pos, up, left,
 * down, right (the rows of a cell, of its predecessors and of its successors in its direction's
 * scan order, -1 outside the image). Diagonal d's cells are entries first[d] .. first[d+1]-1
 * (`first`: host memory, ndiag + 1 entries); every direction has the same number of cells on a
 * diagonal (the count depends only on the images' sizes), n = (first[d+1] - first[d]) / nd, and
 * direction k's cells are the k-th block of n.
 *
 * Every pointer not named host is device memory of one device (the launchers make it current).
 * Calls are asynchronous on their stream; errors come back as RL_EDEVICE (a failing CUDA or cuBLAS
 * call, naming the function and the sizes), RL_EDTYPE or RL_EARG. Deterministic: no atomics, every
 * sum in a fixed order.
 */
#ifndef RL_KERNELS_CUDA_MDLSTM_H
#define RL_KERNELS_CUDA_MDLSTM_H

#include <stdbool.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of the column sums' partial results: rl_mdlstm_cuda_finish_dz needs a scratch of
 * RL_MDLSTM_CUDA_CHUNKS * ldz elements. */
#define RL_MDLSTM_CUDA_CHUNKS 128

/* ucat <- each direction's U_up (D, nd*5D) and U_left (D, nd*5D) blocks side by side: forward
 * (nd, 2D, 5D) with rows [U_up_k; U_left_k], backward (nd, D, 10D) with rows [U_up_k | U_left_k]
 * (the stack_u of layers/mdlstm.c). */
rl_status rl_mdlstm_cuda_stack_u(void *stream, rl_dtype dt, int nd, int64_t D, const void *Uu,
                                 const void *Ul, void *ucat, bool backward);

/* All diagonals in scan order. Per diagonal: one gather of the predecessors' states of every
 * direction into a (nd*n, 2D) (rows [h_up | h_left], 0 for a missing one), one strided-batched
 * GEMM over the directions r_k (n, 5D) = a_k ucat_k, one fused pointwise launch (nd*n*D threads)
 * that adds z[pos] + r + bias and writes the gate activations over z[pos], c[pos] and h[pos].
 * z: input projections on entry; c and h: 0 on entry (padding stays 0). a, r: scratch of
 * nd*nmax*2D and nd*nmax*5D elements, nmax the most cells of one direction on a diagonal. */
rl_status rl_mdlstm_cuda_forward(void *stream, rl_dtype dt, bool stable, int nd, int64_t D,
                                 int64_t ndiag, const int64_t *first, const int64_t *cells,
                                 int64_t cap, void *z, int64_t ldz, const void *ucat,
                                 const void *bias, void *c, void *h, int64_t ldh, void *a, void *r);

/* All diagonals in reverse order. Per diagonal: one gather of the successors' dz of every
 * direction into g (nd*n, 10D) (rows [dz_down | dz_right]), one strided-batched GEMM
 * dh_k (n, D) = g_k ucat_k^T (ucat stacked for backward), one fused pointwise launch that turns
 * z[pos] (gate activations) into dz and writes dcu[pos], dcl[pos] (the cell gradients passed to
 * the up / left predecessor). dout: dLoss/dout, rows ldo apart, direction k's columns at
 * k * dcol (D for concatenated outputs, 0 for summed ones), or NULL. g, dh: scratch of
 * nd*nmax*10D and nd*nmax*D elements. Padded rows of z are left as they are. */
rl_status rl_mdlstm_cuda_backward(void *stream, rl_dtype dt, bool stable, int nd, int64_t D,
                                  int64_t ndiag, const int64_t *first, const int64_t *cells,
                                  int64_t cap, void *z, int64_t ldz, const void *ucat,
                                  const void *dout, int64_t ldo, int64_t dcol, const void *c,
                                  void *dcu, void *dcl, int64_t ldh, void *g, void *dh);

/* out (N, D) = sum over the nd directions of h (N, nd*D), directions added in order. */
rl_status rl_mdlstm_cuda_sum_dirs(void *stream, rl_dtype dt, int64_t N, int nd, int64_t D,
                                  const void *h, void *out);

/* z (H*W*B, ldz), contiguous: rows of padded positions (sizes: int32 (B, 2) on the device,
 * height and width per image) set to 0, then db (ldz) += the column sums of z (two passes over
 * RL_MDLSTM_CUDA_CHUNKS row chunks, in a fixed order). partial: scratch, see above. */
rl_status rl_mdlstm_cuda_finish_dz(void *stream, rl_dtype dt, int64_t H, int64_t W, int64_t B,
                                   const int32_t *sizes, void *z, int64_t ldz, void *partial,
                                   void *db);

/* out (H*W*B, nd*D) = h shifted so that row r holds the state of r's left predecessor in
 * direction k's scan order (columns k*D .. k*D+D-1; position x-1 or, where bit k of flip_x is
 * set, x+1), 0 where that lies outside the array: then dU_left_k = out_k^T dz_k is one GEMM
 * over all positions (padded positions hold h = 0 and dz = 0). */
rl_status rl_mdlstm_cuda_shift_left(void *stream, rl_dtype dt, int64_t H, int64_t W, int64_t B,
                                    int nd, unsigned flip_x, int64_t D, const void *h, void *out);

#ifdef __cplusplus
}
#endif

#endif
