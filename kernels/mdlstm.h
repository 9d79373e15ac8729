/* The fused pointwise passes of an MDLSTM over the cells of one anti-diagonal of one scan
 * direction, CPU, float32 and float64. The formulas are those of kernels/mdlstm_cell.h;
 * layers/mdlstm.c calls these between its per-diagonal GEMMs.
 *
 * Cells are named by row indices into position-major buffers (one row per image position
 * (y, x, b), row = (y * W + x) * B + b): pos[k] is cell k's own row; up[k], left[k] its
 * predecessors' rows and down[k], right[k] its successors' rows in the scan direction, -1 where
 * that neighbour lies outside the image. Rows of one pass never repeat, so the cells are
 * independent (a CUDA kernel runs one thread per element).
 *
 * Buffers (host memory; pointers already offset to this direction's column block):
 *   z        rows ldz apart, 5D used: gate blocks i, a, b, g, o of kernels/mdlstm_cell.h
 *   c, h     rows ldh apart, D used: cell and hidden state of every position (0 where no cell
 *            has been computed: padding stays 0)
 *   r        (n, 5D), contiguous: this pass's recurrent projections, row k for cell k
 *   dcu, dcl rows ldh apart, D used: what each cell passed to its up / left predecessor's
 *            cell gradient
 */
#ifndef RL_KERNELS_MDLSTM_H
#define RL_KERNELS_MDLSTM_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Forward: z[pos] holds the input projection on entry and the gate activations on return
 * (kept for backward); the pre-activation is z[pos] + r[k] + bias. Writes c[pos], h[pos]. */
void rl_mdlstm_cpu_fwd_f32(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, float *z, int64_t ldz, const float *r,
                           const float *bias, float *c, float *h, int64_t ldh);
void rl_mdlstm_cpu_fwd_f64(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, double *z, int64_t ldz, const double *r,
                           const double *bias, double *c, double *h, int64_t ldh);

/* Backward: z[pos] holds the gate activations on entry and dLoss/dz on return; dz row k
 * ((n, 5D), contiguous) gets the same, the operand of the next GEMM. The cell's dh is
 * dout[pos] (rows ldo apart; NULL: zero) + what its successors passed back: pnext holds the
 * previous pass's (the next diagonal's) products dz [U_up^T | U_left^T], rows 2D, row dn[k]
 * for the down successor (its first D columns) and row rt[k] for the right one (its last D),
 * -1 where there is none. Its dc is dcu[down] + dcl[right]. Writes dcu[pos], dcl[pos];
 * db (5D) += the cells' dz. */
void rl_mdlstm_cpu_bwd_f32(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, const int64_t *down, const int64_t *right,
                           const int64_t *dn, const int64_t *rt, float *z, int64_t ldz, float *dz,
                           const float *pnext, const float *dout, int64_t ldo, const float *c,
                           float *dcu, float *dcl, int64_t ldh, float *db);
void rl_mdlstm_cpu_bwd_f64(bool stable, int64_t n, int64_t D, const int64_t *pos, const int64_t *up,
                           const int64_t *left, const int64_t *down, const int64_t *right,
                           const int64_t *dn, const int64_t *rt, double *z, int64_t ldz, double *dz,
                           const double *pnext, const double *dout, int64_t ldo, const double *c,
                           double *dcu, double *dcl, int64_t ldh, double *db);

/* dst row k (cols elements; rows ldd apart) = src row idx[k] (rows lds apart), or zeros
 * where idx[k] < 0: the operands of the per-diagonal GEMMs. */
void rl_mdlstm_cpu_gather_f32(int64_t n, int64_t cols, const int64_t *idx, const float *src,
                              int64_t lds, float *dst, int64_t ldd);
void rl_mdlstm_cpu_gather_f64(int64_t n, int64_t cols, const int64_t *idx, const double *src,
                              int64_t lds, double *dst, int64_t ldd);

#ifdef __cplusplus
}
#endif

#endif
