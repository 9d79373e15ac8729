/* mdlstm: a two-dimensional, multi-directional LSTM over images (H, W, B, F) with per-image
 * heights and widths (Graves et al. 2007; RETURNN's MDLSTM, Voigtlaender et al. 2016).
 *
 * Options: n_out (D, per direction, required); directions = a string of names from "tl",
 * "tr", "bl", "br" separated by commas or spaces (default all four; "tl" starts at the top
 * left corner and scans down and right, "br" starts at the bottom right and scans up and
 * left); combine = "concat" (default: n_out = ndirs * D, direction blocks in the order given)
 * or "sum" (n_out = D); cell = "standard" | "stable"; forget_bias (initial bias of the
 * forget gates: a and, for the standard cell, b below).
 *
 * Parameters (ndirs = number of directions, gate order i, a, b, g, o along each 5D block):
 *   W      (sum_k F_k, ndirs*5D)  input weights, inputs' rows stacked in `from` order (glorot)
 *   U_up   (D, ndirs*5D)          recurrent weights from the up predecessor      (orthogonal)
 *   U_left (D, ndirs*5D)          recurrent weights from the left predecessor    (orthogonal)
 *   b      (ndirs*5D)             bias                                           (zeros)
 * Direction k owns columns k*5D .. k*5D+5D-1 of each. Gates: standard a = forget gate of the
 * up predecessor, b = of the left one; stable a = forget gate, b = lambda (see
 * kernels/mdlstm_cell.h for both cells' equations).
 *
 * Equations, direction k, cell (y, x) in that direction's own scan coordinates (each image
 * is scanned from its own corner: "br" starts at (height-1, width-1) of every image):
 *   z = sum_k x W_k + h(y-1, x) U_up + h(y, x-1) U_left + b
 *   c, h = the cell of kernels/mdlstm_cell.h with cu = c(y-1, x), cl = c(y, x-1)
 * A predecessor outside the image contributes zero state. out = the directions' h side by
 * side (concat) or their sum; 0 on padding, which never feeds a state or a gradient.
 *
 * Flipped directions are index arithmetic, not copies: all buffers are position-major
 * (row = (y * W + x) * B + b, actual image coordinates), and each direction maps its scan
 * coordinates to actual ones per image when it lists a diagonal's cells.
 *
 * Cost: the input projection of all positions and directions is one GEMM per input
 * (H*W*B, F_k) x (F_k, ndirs*5D). Then, on the CPU, each direction sweeps its anti-diagonals
 * s = y + x (scan coordinates) of all images together; directions are independent, so they
 * run on separate threads (sweep_cpu). Forward, per diagonal: the predecessors' states are
 * gathered side by side into one (n, 2D) operand, one GEMM against [U_up; U_left] gives the
 * recurrent projection (n, 5D), and one fused pointwise pass (kernels/cpu/mdlstm.c) computes
 * the cells. Backward runs the diagonals in reverse: one pointwise pass gives dZ (in place of
 * the gates, a contiguous copy, and db), taking dh from the successors' products, and the cell
 * gradients passed back; one GEMM dZ (n, 5D) x [U_up; U_left]^T gives what each cell passes
 * to its predecessors' dh, (n, 2D).
 * Afterwards dU_up, dU_left are GEMMs of shifted views of the stored states against dZ (one for
 * U_up, one per image row for U_left, per direction), dW_k = X_k^T dZ and dX_k = dZ W_k^T.
 *
 * Buffers (sized per batch shape with rl_buffer_ensure; all kept from forward for backward):
 *   z        (H, W, B, ndirs*5D)  input projections, then gate activations; backward turns
 *                                 them into dZ (0 on padding)
 *   hs, cs   (H, W, B, ndirs*D)   states of every direction, 0 on padding (hs is out itself
 *                                 with combine = "concat")
 *   dcu, dcl (H, W, B, ndirs*D)   backward: cell gradients each cell passes to its up / left
 *                                 predecessor
 *   s1 (nmax*10D), s3 (nmax*5D)   per-diagonal GEMM operands, nmax = ndirs*B*min(H, W)
 *   ucat     (ndirs*10D*D)        U_up and U_left of each direction stacked (stack_u)
 *   cells    per direction        a diagonal's cell rows (pos, up, left, down, right) and
 *                                 successors' entries (sweep_cells)
 *   xs[k], gout, dxs[k]           contiguous copies of inputs / grad_out / input gradients
 *                                 whose (H, W, B) dims cannot be folded into rows; every
 *                                 input is copied into xs[k] when the batch has padding,
 *                                 with padded positions set to 0 (input_mat)
 *   padh, pad (H, W, B, 1) int32  1 on padded positions (host; pad: its copy on a CUDA device)
 * No allocation happens inside the diagonal loop.
 *
 * On a CUDA device (kernels/cuda/mdlstm.cu) the same buffers live on the device and the large
 * GEMMs go through cuBLAS; the diagonal loop takes all directions of a diagonal together (one
 * gather, one strided-batched GEMM over the directions, one pointwise launch), so it needs the
 * cell lists of every diagonal at once: they are built on the host (rl_mdlstm_list_all, the CPU's
 * list_cells diagonal after diagonal) and copied to the device in one transfer, together with
 * the sizes, only when the batch's shape or sizes differ from the last one's. dU_left is one
 * GEMM per direction against a copy of the states shifted by one column (in dcl, free after
 * the loop) instead of one per image row. Sizes stay a CPU tensor, read on the host.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"
#include "layers.h"
#include "matrix.h"

#include "../core/blas.h"
#include "../core/device.h"
#include "../kernels/cpu/gemm_small.h"
#include "../kernels/cpu/parallel.h"
#include "../kernels/mdlstm.h"
#include "../kernels/ops.h"

enum { P_W, P_UUP, P_ULEFT, P_B };
enum { MAX_DIRS = 4 };

static const char *const DIR_NAMES[MAX_DIRS] = {"tl", "tr", "bl", "br"};

typedef struct {
    rl_layer base;
    int64_t D;
    int ndirs;
    int dirs[MAX_DIRS]; /* index into DIR_NAMES: bit 0 flips x, bit 1 flips y */
    bool sum, stable;
    double forget_bias;
    rl_tensor z, hs, cs, dcu, dcl, s1, s3, ucat, gout;
    rl_tensor upack; /* CPU float32: each direction's block of ucat packed for gemm_small */
    bool packed;     /* upack holds this pass's operands (else the per-diagonal GEMMs use BLAS) */
    rl_tensor xs[RL_LAYER_MAX_INPUTS], dxs[RL_LAYER_MAX_INPUTS];
    rl_tensor padh, pad; /* (H, W, B, 1): 1 on padded positions, on the host and on dev */
    bool padded;         /* the last forward's batch has padding: its inputs are in xs */
    int64_t *cells;
    int64_t cells_cap;
    int64_t H, W, B; /* of the last forward */
    bool have_forward;
    /* CUDA: every diagonal's cell lists (5 * dcap int64, then the sizes (B, 2) int32) on the host
     * and on the device, diagonal d's cells at dfirst[d] .. dfirst[d+1]-1; valid for dkey_* */
    char *dhost;
    size_t dhost_bytes;
    int64_t *dfirst, dfirst_cap, dcap;
    rl_storage *dcells;
    bool dvalid;
    int64_t dkey_H, dkey_W, dkey_B;
    rl_device dkey_dev;
    rl_tensor red; /* (RL_MDLSTM_CUDA_CHUNKS, ndirs*5D): partial column sums of dZ */
} mdlstm_layer;

/* c = op(a) op(b) + beta c on the device that holds the operands (the legacy default stream on
 * a CUDA device, ordered with the tensor ops). */
static rl_status gemm(rl_device dev, rl_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      rl_mat a, rl_mat b, double beta, rl_mat c) {
    return rl_mat_gemm(dev, NULL, dt, ta, tb, m, n, k, a, b, beta, c);
}

/* x (H, W, B, F) as an (H*W*B, F) matrix without a copy when its strides allow. */
static bool fold_hwb(const rl_tensor *x, rl_mat *m) {
    int64_t H = x->shape[0], W = x->shape[1], B = x->shape[2], F = x->shape[3];
    if (F > 1 && x->stride[3] != 1) return false;
    int64_t ld = B > 1 ? x->stride[2] : (W > 1 ? x->stride[1] : (H > 1 ? x->stride[0] : F));
    if (ld < F) return false;
    if (B > 1 && W > 1 && x->stride[1] != B * ld) return false;
    if (H > 1 && x->stride[0] != W * B * ld) return false;
    if (B == 1 && W > 1 && x->stride[1] != ld) return false;
    m->p = rl_tensor_data(x);
    m->ld = ld > 0 ? ld : 1;
    return true;
}

/* Sets L->padded and, when the batch has padding, L->pad: 1 on padded positions, on dev. */
static rl_status pad_mask(mdlstm_layer *L, const int32_t *sz, rl_device dev) {
    int64_t H = L->H, W = L->W, B = L->B, ps[4] = {H, W, B, 1};
    L->padded = false;
    for (int64_t b = 0; b < B; b++)
        if (sz[2 * b] < H || sz[2 * b + 1] < W) L->padded = true;
    if (!L->padded) return RL_OK;
    RL_TRY(rl_buffer_ensure(&L->padh, RL_INT32, RL_DEVICE_CPU, 4, ps));
    int32_t *m = rl_tensor_data(&L->padh);
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int64_t b = 0; b < B; b++)
                m[(y * W + x) * B + b] = y >= sz[2 * b] || x >= sz[2 * b + 1];
    if (dev.type == RL_CPU) return RL_OK;
    rl_tensor_release(&L->pad);
    return rl_op_to(&L->pad, &L->padh, RL_INT32, dev);
}

/* Input k as an (H*W*B, F) matrix for the GEMMs. With padding it is a copy with the padded
 * positions set to 0 by selection (masked_fill, not a product with a mask): whatever they hold,
 * NaN or Inf included, dW = X^T dZ must not see it, and 0 * NaN is NaN. */
static rl_status input_mat(mdlstm_layer *L, const rl_tensor *x, int k, bool copy, rl_mat *X) {
    if (!L->padded && fold_hwb(x, X)) return RL_OK;
    rl_device dev = rl_tensor_device(x);
    if (copy) {
        RL_TRY(rl_buffer_ensure(&L->xs[k], x->dtype, dev, 4, x->shape));
        RL_TRY(rl_op_copy(&L->xs[k], x));
        if (L->padded)
            RL_TRY(rl_op_masked_fill(&L->xs[k], dev.type == RL_CPU ? &L->padh : &L->pad, 0.0));
    }
    *X = rl_mat_of(&L->xs[k], x->shape[3]);
    return RL_OK;
}

/* Lists the cells of scan diagonal s for every direction from entry n0 on: direction k's cells
 * are cells[off[k] .. off[k+1]-1] of each of the five arrays (pos, up, left, down, right; cap
 * entries apart). Direction k's count is the same for every k: it depends only on the sizes.
 * A direction's cells are ordered by ys, then by image: with images of one size, the cells of
 * one ys are B adjacent rows of the position-major buffers, so the passes over a diagonal
 * read memory in runs rather than one row per image.
 * With tab (one direction only, n0 = 0), two more arrays follow: dn, rt, each cell's down and
 * right successor as an entry of diagonal s + 1's list (-1 where there is none); tab (H * B)
 * holds at [ys * B + b] the entry of cell (ys, b) of diagonal s + 1 on entry, of diagonal s on
 * return, so the lists must come diagonal after diagonal in reverse (backward's order). */
static void list_cells(const int *dirs, int nd, int64_t H, int64_t W, int64_t B, int64_t s,
                       const int32_t *sz, int64_t *cells, int64_t cap, int64_t n0, int64_t *off,
                       int64_t *tab) {
    int64_t n = n0;
    int64_t *pos = cells, *up = pos + cap, *left = up + cap, *down = left + cap,
            *right = down + cap, *dn = right + cap, *rt = dn + cap;
    int64_t ys0 = s - W + 1 > 0 ? s - W + 1 : 0, ys1 = s < H - 1 ? s : H - 1;
    for (int k = 0; k < nd; k++) {
        bool fx = dirs[k] & 1, fy = dirs[k] & 2;
        int64_t sy = fy ? -1 : 1, sx = fx ? -1 : 1; /* actual step of a scan step */
        off[k] = n;
        for (int64_t ys = ys0; ys <= ys1; ys++) {
            int64_t xs = s - ys;
            for (int64_t b = 0; b < B; b++) {
                int64_t h = sz[2 * b], w = sz[2 * b + 1];
                if (ys >= h || xs >= w) continue;
                int64_t y = fy ? h - 1 - ys : ys, x = fx ? w - 1 - xs : xs;
                int64_t p = (y * W + x) * B + b;
                pos[n] = p;
                up[n] = ys > 0 ? p - sy * W * B : -1;
                left[n] = xs > 0 ? p - sx * B : -1;
                down[n] = ys + 1 < h ? p + sy * W * B : -1;
                right[n] = xs + 1 < w ? p + sx * B : -1;
                if (tab) {
                    dn[n] = ys + 1 < h ? tab[(ys + 1) * B + b] : -1;
                    rt[n] = xs + 1 < w ? tab[ys * B + b] : -1;
                    tab[ys * B + b] = n;
                }
                n++;
            }
        }
    }
    off[nd] = n;
}

int64_t rl_mdlstm_count_cells(int nd, int64_t B, const int32_t *sz) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        n += (int64_t)sz[2 * b] * sz[2 * b + 1];
    return nd * n;
}

void rl_mdlstm_list_all(const int *dirs, int nd, int64_t H, int64_t W, int64_t B, const int32_t *sz,
                        int64_t *cells, int64_t cap, int64_t *first) {
    int64_t off[MAX_DIRS + 1];
    first[0] = 0;
    for (int64_t s = 0; s < H + W - 1; s++) {
        list_cells(dirs, nd, H, W, B, s, sz, cells, cap, first[s], off, NULL);
        first[s + 1] = off[nd];
    }
}

/* Room for the CPU sweep's cell lists: cap entries per direction (sweep_cells). */
static rl_status ensure_cells(mdlstm_layer *L, int64_t cap) {
    if (cap <= L->cells_cap) return RL_OK;
    int64_t *p = realloc(L->cells, (size_t)(L->ndirs * cap) * sizeof *p);
    if (!p)
        return rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of memory for %" PRId64 " cells",
                        L->base.name, "mdlstm", cap);
    L->cells = p;
    L->cells_cap = cap;
    return RL_OK;
}

/* ucat <- each direction's two recurrent matrices stacked, (ndirs, 2D, 5D) with rows
 * [U_up_k; U_left_k]: forward, one GEMM per direction and diagonal takes both predecessors,
 * [h_up | h_left] (n, 2D) x block k; backward, dz (n, 5D) x block k^T gives what each cell
 * passes back to both predecessors' dh side by side. (The CUDA path stacks its own, see
 * rl_mdlstm_cuda_stack_u.) */
static void stack_u(mdlstm_layer *L, rl_mat Uu, rl_mat Ul, rl_dtype dt) {
    int64_t D = L->D, G = 5 * D;
    size_t es = rl_dtype_size(dt), row = (size_t)G * es;
    char *dst = rl_tensor_data(&L->ucat);
    for (int k = 0; k < L->ndirs; k++)
        for (int64_t m = 0; m < D; m++) {
            char *base = dst + (size_t)(k * 2 * D * G) * es;
            memcpy(base + (size_t)(m * G) * es, rl_mat_sub(Uu, m, k * G, dt).p, row);
            memcpy(base + (size_t)((D + m) * G) * es, rl_mat_sub(Ul, m, k * G, dt).p, row);
        }
}

/* On the CPU in float32 with a vector kernel of kernels/cpu/gemm_small.c (AVX2, AVX-512), the
 * per-diagonal recurrent products (n, 2D) x (2D, 5D) forward and (n, 5D) x (5D, 2D) backward,
 * with n at most B * min(H, W) rows, run against each direction's block of ucat packed once
 * per pass: BLAS would repack that block on every diagonal. Otherwise they stay BLAS calls. */
static rl_status pack_u(mdlstm_layer *L, rl_dtype dt, bool backward) {
    L->packed = dt == RL_FLOAT32 && rl_gemm_packed_fast();
    if (!L->packed) return RL_OK;
    int64_t D = L->D, k = backward ? 5 * D : 2 * D, n = backward ? 2 * D : 5 * D;
    int64_t per = rl_gemm_packed_size(k, n), total = per * L->ndirs;
    RL_TRY(rl_buffer_ensure(&L->upack, RL_FLOAT32, RL_DEVICE_CPU, 1, &total));
    const float *u = rl_tensor_data(&L->ucat);
    float *dst = rl_tensor_data(&L->upack);
    for (int d = 0; d < L->ndirs; d++)
        rl_gemm_pack_f32(dst + (size_t)(d * per), u + (size_t)(d * 10 * D * D), 5 * D, backward, k,
                         n);
    return RL_OK;
}

/* t (a tensor the batch hands in) must be on dev, the device of the layer's inputs. */
static rl_status check_on(const rl_layer *l, const rl_tensor *t, const char *what, rl_device dev) {
    char s[96], dn[32];
    if (rl_device_eq(rl_tensor_device(t), dev)) return RL_OK;
    rl_device_name(dev, dn, sizeof dn);
    return rl_error(RL_EDEVICE, RL_LAYER_WHERE ": %s is %s, expected a tensor on %s", l->name,
                    "mdlstm", what, rl_tensor_describe(t, s, sizeof s), dn);
}

/* The CPU sweeps. Directions never read each other's cells, so each runs all its diagonals
 * alone: with BLAS threads > 1 and more than one direction, the directions are dealt out to
 * parts on kernels/cpu/parallel.h's threads (part p takes directions p, p + parts, ...), one
 * handoff per pass instead of one per diagonal, and the gathers and pointwise passes run in
 * parallel too. Each direction has its own slices of the scratch buffers (cap = B * min(H, W)
 * cells): cell lists (7 * cap), s1 (cap * 10D), s3 (cap * 5D). Only the packed kernels run in
 * parts (BLAS is called from one thread), and the results do not depend on the split. */
typedef struct {
    mdlstm_layer *L;
    rl_dtype dt;
    const int32_t *sz;
    rl_mat Z, Hs, Cs, bias;    /* forward: bias; backward: Hs unused */
    rl_mat Dcu, Dcl, dout, db; /* backward */
    bool backward;
} sweep;

static int64_t sweep_cap(const mdlstm_layer *L) { return L->B * (L->H < L->W ? L->H : L->W); }

/* Entries of a direction's lists: seven arrays of sweep_cap, then list_cells' tab (H * B). */
static int64_t sweep_cells(const mdlstm_layer *L) { return 7 * sweep_cap(L) + L->H * L->B; }

static void *scratch(const rl_tensor *t, int64_t elems, rl_dtype dt) {
    return (char *)rl_tensor_data(t) + (size_t)elems * rl_dtype_size(dt);
}

/* Forward, direction k: per diagonal, gather [h_up | h_left] (n, 2D), one GEMM gives the
 * recurrent projections (n, 5D), one pointwise pass the cells. */
static void sweep_fwd(const sweep *j, int k) {
    mdlstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t D = L->D, cap = sweep_cap(L), ldz = j->Z.ld, ldh = j->Hs.ld, off[2];
    int64_t *cells = L->cells + k * sweep_cells(L);
    const int64_t *pos = cells, *up = pos + cap, *left = up + cap;
    rl_mat hk = rl_mat_sub(j->Hs, 0, k * D, dt), ck = rl_mat_sub(j->Cs, 0, k * D, dt),
           zk = rl_mat_sub(j->Z, 0, k * 5 * D, dt);
    rl_mat A = {scratch(&L->s1, k * cap * 10 * D, dt), 2 * D},
           R = {scratch(&L->s3, k * cap * 5 * D, dt), 5 * D};
    rl_mat Uk = rl_mat_sub(rl_mat_of(&L->ucat, 5 * D), k * 2 * D, 0, dt);
    const float *pk =
        L->packed ? (const float *)rl_tensor_data(&L->upack) + k * rl_gemm_packed_size(2 * D, 5 * D)
                  : NULL;
    const void *bk = rl_mat_sub(j->bias, 0, k * 5 * D, dt).p;
    void *Al = rl_mat_sub(A, 0, D, dt).p;
    for (int64_t s = 0; s < L->H + L->W - 1; s++) {
        list_cells(&L->dirs[k], 1, L->H, L->W, L->B, s, j->sz, cells, cap, 0, off, NULL);
        int64_t n = off[1];
        if (n == 0) continue;
        if (dt == RL_FLOAT32) {
            rl_mdlstm_cpu_gather_f32(n, D, up, hk.p, ldh, A.p, 2 * D);
            rl_mdlstm_cpu_gather_f32(n, D, left, hk.p, ldh, Al, 2 * D);
        } else {
            rl_mdlstm_cpu_gather_f64(n, D, up, hk.p, ldh, A.p, 2 * D);
            rl_mdlstm_cpu_gather_f64(n, D, left, hk.p, ldh, Al, 2 * D);
        }
        if (pk)
            rl_gemm_packed_f32(n, 5 * D, 2 * D, A.p, 2 * D, pk, false, R.p, 5 * D);
        else
            gemm(RL_DEVICE_CPU, dt, false, false, n, 5 * D, 2 * D, A, Uk, 0.0, R);
        if (dt == RL_FLOAT32)
            rl_mdlstm_cpu_fwd_f32(L->stable, n, D, pos, up, left, zk.p, ldz, R.p, bk, ck.p, hk.p,
                                  ldh);
        else
            rl_mdlstm_cpu_fwd_f64(L->stable, n, D, pos, up, left, zk.p, ldz, R.p, bk, ck.p, hk.p,
                                  ldh);
    }
}

/* Backward, direction k, diagonals in reverse: one pointwise pass turns the gates into dz
 * (taking dh from the products of diagonal s + 1, pnext), then one GEMM dz (n, 5D) x
 * [U_up^T | U_left^T] (5D, 2D) gives what each cell passes back to its predecessors' dh
 * (pcur; the two alternate in s3). */
static void sweep_bwd(const sweep *j, int k) {
    mdlstm_layer *L = j->L;
    rl_dtype dt = j->dt;
    int64_t D = L->D, cap = sweep_cap(L), ldz = j->Z.ld, ldh = j->Cs.ld, off[2];
    int64_t *cells = L->cells + k * sweep_cells(L), *tab = cells + 7 * cap;
    const int64_t *pos = cells, *up = pos + cap, *left = up + cap, *down = left + cap,
                  *right = down + cap, *dn = right + cap, *rt = dn + cap;
    rl_mat zk = rl_mat_sub(j->Z, 0, k * 5 * D, dt), ck = rl_mat_sub(j->Cs, 0, k * D, dt),
           ak = rl_mat_sub(j->Dcu, 0, k * D, dt), lk = rl_mat_sub(j->Dcl, 0, k * D, dt);
    rl_mat dZ = {scratch(&L->s1, k * cap * 10 * D, dt), 5 * D},
           pcur = {scratch(&L->s3, k * cap * 5 * D, dt), 2 * D},
           pnext = {scratch(&L->s3, k * cap * 5 * D + cap * 2 * D, dt), 2 * D};
    rl_mat Uk = rl_mat_sub(rl_mat_of(&L->ucat, 5 * D), k * 2 * D, 0, dt);
    const float *pk =
        L->packed ? (const float *)rl_tensor_data(&L->upack) + k * rl_gemm_packed_size(5 * D, 2 * D)
                  : NULL;
    const void *dk = j->dout.p ? rl_mat_sub(j->dout, 0, L->sum ? 0 : k * D, dt).p : NULL;
    void *dbk = rl_mat_sub(j->db, 0, k * 5 * D, dt).p;
    for (int64_t s = L->H + L->W - 2; s >= 0; s--) {
        list_cells(&L->dirs[k], 1, L->H, L->W, L->B, s, j->sz, cells, cap, 0, off, tab);
        int64_t n = off[1];
        if (n == 0) continue;
        if (dt == RL_FLOAT32)
            rl_mdlstm_cpu_bwd_f32(L->stable, n, D, pos, up, left, down, right, dn, rt, zk.p, ldz,
                                  dZ.p, pnext.p, dk, j->dout.ld, ck.p, ak.p, lk.p, ldh, dbk);
        else
            rl_mdlstm_cpu_bwd_f64(L->stable, n, D, pos, up, left, down, right, dn, rt, zk.p, ldz,
                                  dZ.p, pnext.p, dk, j->dout.ld, ck.p, ak.p, lk.p, ldh, dbk);
        if (s == 0) break; /* the first diagonal has no predecessors */
        if (pk)
            rl_gemm_packed_f32(n, 2 * D, 5 * D, dZ.p, 5 * D, pk, false, pcur.p, 2 * D);
        else
            gemm(RL_DEVICE_CPU, dt, false, true, n, 2 * D, 5 * D, dZ, Uk, 0.0, pcur);
        rl_mat t = pcur;
        pcur = pnext;
        pnext = t;
    }
}

static void sweep_part(void *ctx, int part, int parts) {
    const sweep *j = ctx;
    for (int k = part; k < j->L->ndirs; k += parts) {
        if (j->backward)
            sweep_bwd(j, k);
        else
            sweep_fwd(j, k);
    }
}

static void sweep_cpu(const sweep *j) {
    int threads = rl_blas_get_threads(), nd = j->L->ndirs;
    int parts = threads < nd ? threads : nd;
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (j->L->packed && parts > 1)
        rl_cpu_parallel(parts, sweep_part, (void *)j);
    else
        sweep_part((void *)j, 0, 1);
}

/* out = the directions' states summed (0 on padding, where every state is 0) */
static void sum_dirs_cpu(const mdlstm_layer *L, rl_dtype dt, int64_t N, rl_mat Hs, void *out) {
    int64_t D = L->D, nd = L->ndirs, ldh = Hs.ld;
    size_t es = rl_dtype_size(dt);
    for (int64_t r = 0; r < N; r++) {
        char *o = (char *)out + (size_t)(r * D) * es;
        const char *h = (const char *)Hs.p + (size_t)(r * ldh) * es;
        if (dt == RL_FLOAT32) {
            float *of = (float *)o;
            const float *hf = (const float *)h;
            for (int64_t j = 0; j < D; j++) {
                float a = 0;
                for (int k = 0; k < nd; k++)
                    a += hf[k * D + j];
                of[j] = a;
            }
        } else {
            double *od = (double *)o;
            const double *hd = (const double *)h;
            for (int64_t j = 0; j < D; j++) {
                double a = 0;
                for (int k = 0; k < nd; k++)
                    a += hd[k * D + j];
                od[j] = a;
            }
        }
    }
}

/* ---------------------------------------------------------------- the device's part
 *
 * Everything that names CUDA, in one place: the cell lists on the device and the passes of
 * kernels/cuda/mdlstm_cuda.h. A build without CUDA refuses CUDA tensors at the entry
 * (check_device), so its versions below are never reached past it. */
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/context.h"
#include "../kernels/cuda/mdlstm_cuda.h"

static rl_status check_device(const rl_layer *l, rl_device dev) {
    (void)l, (void)dev;
    return RL_OK;
}

/* Every diagonal's cell lists and the sizes on the device, in one transfer; kept while batches
 * come with the same shape and sizes on the same device. */
static rl_status device_cells(mdlstm_layer *L, rl_device dev, const int32_t *sz) {
    int64_t H = L->H, W = L->W, B = L->B;
    int64_t cap = rl_mdlstm_count_cells(L->ndirs, B, sz);
    size_t cbytes = (size_t)(5 * cap) * sizeof(int64_t), sbytes = (size_t)(2 * B) * sizeof *sz;
    size_t bytes = cbytes + sbytes;
    if (L->dvalid && L->dkey_H == H && L->dkey_W == W && L->dkey_B == B && L->dcap == cap &&
        rl_device_eq(L->dkey_dev, dev) && memcmp(L->dhost + cbytes, sz, sbytes) == 0)
        return RL_OK;
    L->dvalid = false;
    if (bytes > L->dhost_bytes) {
        char *p = realloc(L->dhost, bytes);
        if (!p)
            return rl_error(RL_ENOMEM,
                            RL_LAYER_WHERE ": out of host memory for %" PRId64 " cell lists",
                            L->base.name, "mdlstm", cap);
        L->dhost = p;
        L->dhost_bytes = bytes;
    }
    if (H + W > L->dfirst_cap) {
        int64_t *p = realloc(L->dfirst, (size_t)(H + W) * sizeof *p);
        if (!p)
            return rl_error(RL_ENOMEM, RL_LAYER_WHERE ": out of host memory", L->base.name,
                            "mdlstm");
        L->dfirst = p;
        L->dfirst_cap = H + W;
    }
    rl_mdlstm_list_all(L->dirs, L->ndirs, H, W, B, sz, (int64_t *)(void *)L->dhost, cap, L->dfirst);
    memcpy(L->dhost + cbytes, sz, sbytes);
    if (!L->dcells || L->dcells->nbytes < bytes || !rl_device_eq(L->dcells->device, dev)) {
        rl_storage_release(L->dcells);
        L->dcells = NULL;
        RL_TRY(rl_storage_new(&L->dcells, bytes, dev));
    }
    RL_TRY(rl_device_memcpy(L->dcells->data, dev, L->dhost, RL_DEVICE_CPU, bytes));
    L->dcap = cap;
    L->dkey_H = H;
    L->dkey_W = W;
    L->dkey_B = B;
    L->dkey_dev = dev;
    L->dvalid = true;
    return RL_OK;
}

static const int64_t *dev_cells(const mdlstm_layer *L) { return L->dcells->data; }

static const int32_t *dev_sizes(const mdlstm_layer *L) {
    return (const int32_t *)(const void *)((const char *)L->dcells->data +
                                           (size_t)(5 * L->dcap) * sizeof(int64_t));
}

static rl_status cuda_stack_u(mdlstm_layer *L, rl_dtype dt, rl_mat Uu, rl_mat Ul, bool backward) {
    return rl_mdlstm_cuda_stack_u(NULL, dt, (int)L->ndirs, L->D, Uu.p, Ul.p,
                                  rl_tensor_data(&L->ucat), backward);
}

/* The forward sweep (and the directions' sum) on the device. */
static rl_status cuda_forward(mdlstm_layer *L, rl_dtype dt, rl_device dev, const int32_t *sz,
                              rl_mat Z, rl_mat bias, rl_mat Cs, rl_mat Hs) {
    int64_t H = L->H, W = L->W, D = L->D, nd = L->ndirs, N = H * W * L->B;
    RL_TRY(device_cells(L, dev, sz));
    RL_TRY(rl_mdlstm_cuda_forward(NULL, dt, L->stable, (int)nd, D, H + W - 1, L->dfirst,
                                  dev_cells(L), L->dcap, Z.p, Z.ld, rl_tensor_data(&L->ucat),
                                  bias.p, Cs.p, Hs.p, Hs.ld, rl_tensor_data(&L->s1),
                                  rl_tensor_data(&L->s3)));
    if (!L->sum) return RL_OK;
    return rl_mdlstm_cuda_sum_dirs(NULL, dt, N, (int)nd, D, Hs.p, rl_tensor_data(&L->base.out));
}

/* The backward sweep on the device, then dZ's padding and db. */
static rl_status cuda_backward(mdlstm_layer *L, rl_dtype dt, rl_device dev, rl_mat Z, rl_mat dout,
                               rl_mat Cs, rl_mat Dcu, rl_mat Dcl, rl_mat db) {
    int64_t H = L->H, W = L->W, D = L->D, nd = L->ndirs, rs[2] = {RL_MDLSTM_CUDA_CHUNKS, Z.ld};
    RL_TRY(rl_buffer_ensure(&L->red, dt, dev, 2, rs));
    RL_TRY(rl_mdlstm_cuda_backward(NULL, dt, L->stable, (int)nd, D, H + W - 1, L->dfirst,
                                   dev_cells(L), L->dcap, Z.p, Z.ld, rl_tensor_data(&L->ucat),
                                   dout.p, dout.ld, L->sum ? 0 : D, Cs.p, Dcu.p, Dcl.p, Dcu.ld,
                                   rl_tensor_data(&L->s1), rl_tensor_data(&L->s3)));
    return rl_mdlstm_cuda_finish_dz(NULL, dt, H, W, L->B, dev_sizes(L), Z.p, Z.ld,
                                    rl_tensor_data(&L->red), db.p);
}

/* The left predecessors' states of every position in Dcl (shifted by one column, 0 outside). */
static rl_status cuda_shift_left(mdlstm_layer *L, rl_dtype dt, rl_mat Hs, rl_mat Dcl) {
    unsigned flip_x = 0;
    for (int k = 0; k < L->ndirs; k++)
        flip_x |= (L->dirs[k] & 1) ? 1u << k : 0u;
    return rl_mdlstm_cuda_shift_left(NULL, dt, L->H, L->W, L->B, (int)L->ndirs, flip_x, L->D, Hs.p,
                                     Dcl.p);
}
#else
static rl_status check_device(const rl_layer *l, rl_device dev) {
    if (dev.type == RL_CPU) return RL_OK;
    return rl_error(RL_EDEVICE,
                    RL_LAYER_WHERE ": the inputs are on a CUDA device, but rnnlua was "
                                   "built without CUDA",
                    l->name, "mdlstm");
}

static rl_status no_cuda(const mdlstm_layer *L) {
    return check_device(&L->base, (rl_device){RL_CUDA, 0});
}

static rl_status cuda_stack_u(mdlstm_layer *L, rl_dtype dt, rl_mat Uu, rl_mat Ul, bool backward) {
    (void)dt, (void)Uu, (void)Ul, (void)backward;
    return no_cuda(L);
}

static rl_status cuda_forward(mdlstm_layer *L, rl_dtype dt, rl_device dev, const int32_t *sz,
                              rl_mat Z, rl_mat bias, rl_mat Cs, rl_mat Hs) {
    (void)dt, (void)dev, (void)sz, (void)Z, (void)bias, (void)Cs, (void)Hs;
    return no_cuda(L);
}

static rl_status cuda_backward(mdlstm_layer *L, rl_dtype dt, rl_device dev, rl_mat Z, rl_mat dout,
                               rl_mat Cs, rl_mat Dcu, rl_mat Dcl, rl_mat db) {
    (void)dt, (void)dev, (void)Z, (void)dout, (void)Cs, (void)Dcu, (void)Dcl, (void)db;
    return no_cuda(L);
}

static rl_status cuda_shift_left(mdlstm_layer *L, rl_dtype dt, rl_mat Hs, rl_mat Dcl) {
    (void)dt, (void)Hs, (void)Dcl;
    return no_cuda(L);
}
#endif

static rl_status mdlstm_forward(rl_layer *l, rl_layer_io *io) {
    mdlstm_layer *L = (mdlstm_layer *)l;
    int64_t H, W, B, D = L->D, nd = L->ndirs;
    RL_TRY(rl_layer_check_inputs_2d(l, io, &H, &W, &B));
    rl_dtype dt = io->in[0]->dtype;
    rl_device dev = rl_tensor_device(io->in[0]);
    RL_TRY(check_device(l, dev));
    rl_mat Wm, Uu, Ul, bias;
    RL_TRY(rl_param_mat(&L->base, &l->params[P_W].value, "W", dt, dev, &Wm));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_UUP].value, "U_up", dt, dev, &Uu));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_ULEFT].value, "U_left", dt, dev, &Ul));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_B].value, "b", dt, dev, &bias));

    int64_t N = H * W * B, ldz = nd * 5 * D, ldh = nd * D;
    int64_t nmax = nd * B * (H < W ? H : W), s1n = nmax * 10 * D, s3n = nmax * 5 * D,
            un = nd * 10 * D * D;
    int64_t zs[4] = {H, W, B, ldz}, hs4[4] = {H, W, B, ldh}, os[4] = {H, W, B, l->n_out};
    L->H = H;
    L->W = W;
    L->B = B;
    L->have_forward = false;
    RL_TRY(rl_buffer_ensure(&l->out, dt, dev, 4, os));
    RL_TRY(rl_buffer_ensure(&L->z, dt, dev, 4, zs));
    if (L->sum) RL_TRY(rl_buffer_ensure(&L->hs, dt, dev, 4, hs4));
    RL_TRY(rl_buffer_ensure(&L->cs, dt, dev, 4, hs4));
    RL_TRY(rl_buffer_ensure(&L->s1, dt, dev, 1, &s1n));
    RL_TRY(rl_buffer_ensure(&L->s3, dt, dev, 1, &s3n));
    RL_TRY(rl_buffer_ensure(&L->ucat, dt, dev, 1, &un));
    if (dev.type == RL_CPU) {
        stack_u(L, Uu, Ul, dt);
        RL_TRY(pack_u(L, dt, false));
        RL_TRY(ensure_cells(L, sweep_cells(L)));
    } else {
        RL_TRY(cuda_stack_u(L, dt, Uu, Ul, false));
    }
    rl_tensor *hst = L->sum ? &L->hs : &l->out;
    RL_TRY(rl_op_fill(hst, 0.0));
    RL_TRY(rl_op_fill(&L->cs, 0.0));

    const int32_t *sz = rl_tensor_data(io->sizes);
    RL_TRY(pad_mask(L, sz, dev));

    /* input projection of all positions and directions: one GEMM per input */
    rl_mat Z = rl_mat_of(&L->z, ldz);
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        rl_mat X;
        RL_TRY(input_mat(L, io->in[k], k, true, &X));
        RL_TRY(gemm(dev, dt, false, false, N, ldz, l->in_dims[k], X, rl_mat_sub(Wm, row, 0, dt),
                    k ? 1.0 : 0.0, Z));
        row += l->in_dims[k];
    }

    rl_mat Hs = rl_mat_of(hst, ldh), Cs = rl_mat_of(&L->cs, ldh);
    if (dev.type == RL_CPU) {
        sweep j = {.L = L, .dt = dt, .sz = sz, .Z = Z, .Hs = Hs, .Cs = Cs, .bias = bias};
        sweep_cpu(&j);
        if (L->sum) sum_dirs_cpu(L, dt, N, Hs, rl_tensor_data(&l->out));
    } else {
        RL_TRY(cuda_forward(L, dt, dev, sz, Z, bias, Cs, Hs));
    }
    L->have_forward = true;
    return RL_OK;
}

/* Zeroes dZ on padded positions, which hold their input projections (the sweep turned every
 * cell's row into dZ and added it to db). */
static void zero_padding(const mdlstm_layer *L, const int32_t *sz, rl_dtype dt, void *z) {
    int64_t H = L->H, W = L->W, B = L->B, ldz = L->ndirs * 5 * L->D;
    size_t es = rl_dtype_size(dt);
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int64_t b = 0; b < B; b++)
                if (y >= sz[2 * b] || x >= sz[2 * b + 1])
                    memset((char *)z + (size_t)(((y * W + x) * B + b) * ldz) * es, 0,
                           (size_t)ldz * es);
}

static rl_status mdlstm_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                 rl_tensor *const *grad_in) {
    mdlstm_layer *L = (mdlstm_layer *)l;
    int64_t H = L->H, W = L->W, B = L->B, D = L->D, nd = L->ndirs;
    int64_t N = H * W * B, ldz = nd * 5 * D, ldh = nd * D;
    char s1[96], s2[96];
    if (!L->have_forward)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": backward without a forward", l->name, "mdlstm");
    rl_dtype dt = L->z.dtype;
    rl_device dev = rl_tensor_device(&L->z);
    rl_mat dout = {NULL, 0};
    if (grad_out) {
        if (grad_out->ndim != 4 || grad_out->shape[0] != H || grad_out->shape[1] != W ||
            grad_out->shape[2] != B || grad_out->shape[3] != l->n_out || grad_out->dtype != dt)
            return rl_error(RL_ESHAPE,
                            RL_LAYER_WHERE ": grad_out is %s, expected (%" PRId64 ", %" PRId64
                                           ", %" PRId64 ", %" PRId64 ") %s",
                            l->name, "mdlstm", rl_tensor_describe(grad_out, s1, sizeof s1), H, W, B,
                            l->n_out, rl_dtype_name(dt));
        RL_TRY(check_on(l, grad_out, "grad_out", dev));
        if (!fold_hwb(grad_out, &dout)) {
            RL_TRY(rl_buffer_ensure(&L->gout, dt, dev, 4, grad_out->shape));
            RL_TRY(rl_op_copy(&L->gout, grad_out));
            dout = rl_mat_of(&L->gout, l->n_out);
        }
    }
    for (int k = 0; k < io->n_in; k++) {
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi && (!rl_tensor_same_shape(gi, io->in[k]) || gi->dtype != dt))
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": grad_in[%d] is %s, expected %s", l->name,
                            "mdlstm", k + 1, rl_tensor_describe(gi, s1, sizeof s1),
                            rl_tensor_describe(io->in[k], s2, sizeof s2));
        RL_TRY(check_on(l, io->in[k], "an input", dev));
        if (gi) RL_TRY(check_on(l, gi, "an input gradient", dev));
    }
    rl_mat Wm, Uu, Ul, dW, dUu, dUl, db;
    RL_TRY(rl_param_mat(&L->base, &l->params[P_W].value, "W", dt, dev, &Wm));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_UUP].value, "U_up", dt, dev, &Uu));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_ULEFT].value, "U_left", dt, dev, &Ul));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_W].grad, "W (gradient)", dt, dev, &dW));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_UUP].grad, "U_up (gradient)", dt, dev, &dUu));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_ULEFT].grad, "U_left (gradient)", dt, dev, &dUl));
    RL_TRY(rl_param_mat(&L->base, &l->params[P_B].grad, "b (gradient)", dt, dev, &db));
    int64_t hs4[4] = {H, W, B, ldh};
    RL_TRY(rl_buffer_ensure(&L->dcu, dt, dev, 4, hs4));
    RL_TRY(rl_buffer_ensure(&L->dcl, dt, dev, 4, hs4));
    if (dev.type == RL_CPU) {
        stack_u(L, Uu, Ul, dt);
        RL_TRY(pack_u(L, dt, true));
    } else {
        RL_TRY(cuda_stack_u(L, dt, Uu, Ul, true));
    }
    L->have_forward = false; /* the gates become dZ */

    const int32_t *sz = rl_tensor_data(io->sizes);
    rl_mat Z = rl_mat_of(&L->z, ldz), Hs = rl_mat_of(L->sum ? &L->hs : &l->out, ldh),
           Cs = rl_mat_of(&L->cs, ldh);
    rl_mat Dcu = rl_mat_of(&L->dcu, ldh), Dcl = rl_mat_of(&L->dcl, ldh);
    if (dev.type == RL_CPU) {
        sweep j = {.L = L,
                   .dt = dt,
                   .sz = sz,
                   .Z = Z,
                   .Cs = Cs,
                   .Dcu = Dcu,
                   .Dcl = Dcl,
                   .dout = dout,
                   .db = db,
                   .backward = true};
        sweep_cpu(&j);
        zero_padding(L, sz, dt, Z.p);
    } else {
        RL_TRY(cuda_backward(L, dt, dev, Z, dout, Cs, Dcu, Dcl, db));
    }

    /* dU: the predecessors' states are the stored states shifted by one row (up) or one
     * column (left); a predecessor outside the image is a padded position, whose state is 0,
     * and one outside the array is left out of the product */
    int64_t WB = W * B;
    for (int k = 0; k < nd && H > 1; k++) {
        bool fy = L->dirs[k] & 2;
        rl_mat hk = rl_mat_sub(Hs, fy ? WB : 0, k * D, dt),
               zk = rl_mat_sub(Z, fy ? 0 : WB, k * 5 * D, dt);
        RL_TRY(gemm(dev, dt, true, false, D, 5 * D, (H - 1) * WB, hk, zk, 1.0,
                    rl_mat_sub(dUu, 0, k * 5 * D, dt)));
    }
    if (dev.type == RL_CPU) {
        for (int k = 0; k < nd && W > 1; k++) {
            bool fx = L->dirs[k] & 1;
            for (int64_t y = 0; y < H; y++) {
                rl_mat hk = rl_mat_sub(Hs, y * WB + (fx ? B : 0), k * D, dt);
                rl_mat zk = rl_mat_sub(Z, y * WB + (fx ? 0 : B), k * 5 * D, dt);
                gemm(dev, dt, true, false, D, 5 * D, (W - 1) * B, hk, zk, 1.0,
                     rl_mat_sub(dUl, 0, k * 5 * D, dt));
            }
        }
    } else if (W > 1) {
        RL_TRY(cuda_shift_left(L, dt, Hs, Dcl));
        for (int k = 0; k < nd; k++)
            RL_TRY(gemm(dev, dt, true, false, D, 5 * D, N, rl_mat_sub(Dcl, 0, k * D, dt),
                        rl_mat_sub(Z, 0, k * 5 * D, dt), 1.0, rl_mat_sub(dUl, 0, k * 5 * D, dt)));
    }
    int64_t row = 0;
    for (int k = 0; k < io->n_in; k++) {
        int64_t F = l->in_dims[k];
        rl_mat X;
        RL_TRY(input_mat(L, io->in[k], k, false, &X));
        RL_TRY(gemm(dev, dt, true, false, F, ldz, N, X, Z, 1.0, rl_mat_sub(dW, row, 0, dt)));
        rl_tensor *gi = grad_in ? grad_in[k] : NULL;
        if (gi) {
            rl_mat G;
            bool direct = fold_hwb(gi, &G);
            if (!direct) {
                RL_TRY(rl_buffer_ensure(&L->dxs[k], dt, dev, 4, gi->shape));
                G = rl_mat_of(&L->dxs[k], F);
            }
            RL_TRY(gemm(dev, dt, false, true, N, F, ldz, Z, rl_mat_sub(Wm, row, 0, dt), 0.0, G));
            if (!direct) RL_TRY(rl_op_copy(gi, &L->dxs[k]));
        }
        row += F;
    }
    return RL_OK;
}

static void mdlstm_destroy(rl_layer *l) {
    mdlstm_layer *L = (mdlstm_layer *)l;
    rl_tensor *ts[] = {&L->z,    &L->hs,   &L->cs,  &L->dcu,   &L->dcl,  &L->s1, &L->s3,
                       &L->ucat, &L->gout, &L->red, &L->upack, &L->padh, &L->pad};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    for (int k = 0; k < RL_LAYER_MAX_INPUTS; k++) {
        rl_tensor_release(&L->xs[k]);
        rl_tensor_release(&L->dxs[k]);
    }
    free(L->cells);
    free(L->dhost);
    free(L->dfirst);
    rl_storage_release(L->dcells);
}

/* The forget gates' bias blocks start at forget_bias: a of every direction, and b for the
 * standard cell (the stable cell's b is lambda, which starts at 0: an even mix). */
static rl_status mdlstm_init_params(rl_layer *l, rl_rng *g) {
    (void)g;
    mdlstm_layer *L = (mdlstm_layer *)l;
    if (L->forget_bias == 0.0) return RL_OK;
    int64_t D = L->D;
    for (int k = 0; k < L->ndirs; k++) {
        rl_tensor f = {0};
        RL_TRY(
            rl_tensor_narrow(&f, &l->params[P_B].value, 0, k * 5 * D + D, L->stable ? D : 2 * D));
        rl_status st = rl_op_fill(&f, L->forget_bias);
        rl_tensor_release(&f);
        RL_TRY(st);
    }
    return RL_OK;
}

static const rl_layer_ops mdlstm_ops = {.class_name = "mdlstm",
                                        .forward = mdlstm_forward,
                                        .backward = mdlstm_backward,
                                        .destroy = mdlstm_destroy,
                                        .init_params = mdlstm_init_params};

/* "tl, br" -> dirs {0, 3}; names separated by commas or spaces, each at most once. */
static rl_status parse_dirs(const char *name, const char *s, int *dirs, int *nd) {
    *nd = 0;
    const char *p = s;
    while (*p) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        size_t len = strcspn(p, ", ");
        int found = -1;
        for (int k = 0; k < MAX_DIRS; k++)
            if (len == 2 && strncmp(p, DIR_NAMES[k], 2) == 0) found = k;
        if (found < 0)
            return rl_error(RL_EARG,
                            RL_LAYER_WHERE ": unknown direction '%.*s' in directions = "
                                           "\"%s\" (known: tl, tr, bl, br)",
                            name, "mdlstm", (int)(len < 32 ? len : 32), p, s);
        for (int k = 0; k < *nd; k++)
            if (dirs[k] == found)
                return rl_error(RL_EARG,
                                RL_LAYER_WHERE ": direction %s given twice in directions = "
                                               "\"%s\"",
                                name, "mdlstm", DIR_NAMES[found], s);
        dirs[(*nd)++] = found;
        p += len;
    }
    if (*nd == 0)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": directions = \"%s\" names no direction", name,
                        "mdlstm", s);
    return RL_OK;
}

rl_status rl_mdlstm_create(rl_layer **out, const char *name, const rl_options *opts, int n_in,
                           const int64_t *in_dims) {
    int64_t D;
    double fb;
    const char *dirs_s, *combine, *cell;
    int dirs[MAX_DIRS], nd;
    *out = NULL;
    if (n_in < 1)
        return rl_error(RL_EARG, RL_LAYER_WHERE ": needs at least one input", name, "mdlstm");
    RL_TRY(rl_opt_int(opts, name, "n_out", 0, 1, true, &D));
    RL_TRY(rl_opt_string(opts, name, "directions", "tl,tr,bl,br", &dirs_s));
    RL_TRY(parse_dirs(name, dirs_s, dirs, &nd));
    RL_TRY(rl_opt_string(opts, name, "combine", "concat", &combine));
    if (strcmp(combine, "concat") != 0 && strcmp(combine, "sum") != 0)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": combine = \"%s\", expected \"concat\" or \"sum\"", name,
                        "mdlstm", combine);
    RL_TRY(rl_opt_string(opts, name, "cell", "standard", &cell));
    if (strcmp(cell, "standard") != 0 && strcmp(cell, "stable") != 0)
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": cell = \"%s\", expected \"standard\" or \"stable\"", name,
                        "mdlstm", cell);
    RL_TRY(rl_opt_number(opts, name, "forget_bias", 0.0, &fb));
    int64_t F = 0;
    for (int k = 0; k < n_in; k++) {
        if (in_dims[k] < 1)
            return rl_error(RL_ESHAPE, RL_LAYER_WHERE ": input %d has %" PRId64 " features", name,
                            "mdlstm", k + 1, in_dims[k]);
        F += in_dims[k];
    }
    rl_layer *l;
    RL_TRY(rl_layer_alloc(&l, sizeof(mdlstm_layer), &mdlstm_ops, name, n_in, in_dims));
    mdlstm_layer *L = (mdlstm_layer *)l;
    L->D = D;
    L->ndirs = nd;
    memcpy(L->dirs, dirs, sizeof dirs);
    L->sum = strcmp(combine, "sum") == 0;
    L->stable = strcmp(cell, "stable") == 0;
    L->forget_bias = fb;
    l->n_out = L->sum ? D : nd * D;
    int64_t G = nd * 5 * D;
    int64_t ws[2] = {F, G}, us[2] = {D, G}, bs[1] = {G};
    rl_status st = rl_layer_add_param(l, "W", 2, ws, RL_INIT_GLOROT, 1.0, F, 5 * D, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U_up", 2, us, RL_INIT_ORTHOGONAL, 1.0, D, 5 * D, NULL);
    if (st == RL_OK)
        st = rl_layer_add_param(l, "U_left", 2, us, RL_INIT_ORTHOGONAL, 1.0, D, 5 * D, NULL);
    if (st == RL_OK) st = rl_layer_add_param(l, "b", 1, bs, RL_INIT_ZEROS, 0.0, 0, 0, NULL);
    if (st != RL_OK) {
        rl_layer_free(l);
        return st;
    }
    *out = l;
    return RL_OK;
}
