/* The bf16 matrix product of the CPU: C (m x n, float32) = alpha * bf16(op(A)) * bf16(op(B))
 * + beta * C, operands rounded to bfloat16 (core/bf16.h: nearest, ties to even), products and
 * sums in float32. Row-major, as the tensors are.
 *
 * The right-hand operand (the weights, in the layers) is packed once into column panels of
 * RL_BF16_PANEL columns, each stored as pairs of rows: panel p, row pair r, column j holds
 * op(B)[2r][16p + j] then op(B)[2r + 1][16p + j] (zeros past k and n, k padded to a multiple
 * of 32). That is the operand layout of both vector instructions used: AVX512-BF16's
 * vdpbf16ps (one pair of rows per instruction, 16 columns) and an AMX-BF16 B tile (16 row
 * pairs of one panel). The left operand is rounded into a per-thread scratch on each call, in
 * blocks of rows that keep the scratch under 2 MB (or comes rounded: rl_gemm_bf16_lhs). A sum
 * longer than 2048 whose op(B) packed whole would pass 4 MB is split into blocks of k that fit,
 * each added to C in turn, by every entry point alike (the split depends on k and n only).
 *
 * Three kernels, the bf16 level (chosen at run time, the best the CPU and the OS allow):
 *   generic     converts to float32 and sums with float32 multiply-adds (any CPU);
 *   avx512bf16  vdpbf16ps, 8 rows x 32 columns of C in registers (Zen 4, Cooper Lake and later);
 *   amx         AMX-BF16 tiles, 32 x 32 blocks of C (Sapphire Rapids and later), once Linux
 *               grants the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM); when it refuses,
 *               avx512bf16 is the best.
 * RL_CPU_LEVEL below avx512 (cpu_level.h) makes it generic; RL_BF16_LEVEL (a level name,
 * read at the first use) or rl_bf16_level_set() lowers it further. Levels differ only in the
 * order and rounding of the float32 sums; within one level a row of C has the same bits
 * whatever the rows around it and the thread count.
 */
#ifndef RL_KERNELS_CPU_GEMM_BF16_H
#define RL_KERNELS_CPU_GEMM_BF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RL_BF16_PANEL 16

typedef enum {
    RL_BF16_GENERIC = 0,
    RL_BF16_AVX512BF16 = 1,
    RL_BF16_AMX = 2,
} rl_bf16_level;

/* The level in use now (thread-safe; each product reads it once). */
rl_bf16_level rl_bf16_level_get(void);
/* The best level of this CPU and OS (asks Linux for the AMX tile state the first time). */
rl_bf16_level rl_bf16_level_supported(void);
/* Sets the level; RL_EARG (naming both) when the CPU or OS does not support it. */
rl_status rl_bf16_level_set(rl_bf16_level level);
/* "generic", "avx512bf16", "amx"; "unknown" otherwise. */
const char *rl_bf16_level_name(rl_bf16_level level);
/* The level of that name; RL_EARG naming the valid ones otherwise. */
rl_status rl_bf16_level_from_name(const char *name, rl_bf16_level *out);
/* RL_EARG with a message when RL_BF16_LEVEL names no level (for hosts, at start-up; a level
 * the CPU lacks is not an error: the best one it has runs). */
rl_status rl_bf16_level_check_env(void);

/* uint16 elements needed to pack a k x n operand. */
int64_t rl_bf16_packed_size(int64_t k, int64_t n);

/* Packs op(b) (k x n; op(b)[i][j] is b[i * ldb + j], or b[j * ldb + i] with trans) into dst
 * (rl_bf16_packed_size(k, n) elements), rounding to bf16. */
void rl_bf16_pack(uint16_t *dst, const float *b, int64_t ldb, bool trans, int64_t k, int64_t n);

/* c (m x n, rows ldc apart) = alpha * op(a) * packed + beta * c, where op(a) (m x k) is
 * a[i * lda + l], or a[l * lda + i] with trans_a, and packed holds a k x n operand packed by
 * rl_bf16_pack. With beta == 0 c is only written (NaN there does not propagate).
 * RL_ENOMEM when the scratch for the rounded op(a) cannot grow. */
rl_status rl_gemm_bf16_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const uint16_t *packed, float beta,
                              float *c, int64_t ldc);

/* The same with op(b) (k x n) given as float32, packed into a per-thread scratch on each call
 * (for one-off products; callers that reuse the operand pack it once). */
rl_status rl_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* ---- operands rounded once, for two products ----
 *
 * An operand used by two products (the output layer's dY: the left operand of dX = dY W^T and
 * the right one of dW = X^T dY) can be rounded once, where it is made (rl_ce_grad_cpu_bf16,
 * kernels/softmax_ce.h), into the layout of a rounded left operand: an m x k matrix in rows of
 * rl_bf16_lhs_stride(k) elements (k padded to a multiple of 32), m padded to a multiple of 16
 * rows, zeros in the padding (rl_bf16_lhs_size(m, k) elements in all). Products of it give the
 * bits rl_gemm_bf16 gives for the float32 operand it was rounded from. */
int64_t rl_bf16_lhs_stride(int64_t k);
int64_t rl_bf16_lhs_size(int64_t m, int64_t k);
/* op(a) (m x k, as in rl_gemm_bf16) rounded into dst in that layout */
void rl_bf16_round_lhs(uint16_t *dst, bool trans, int64_t m, int64_t k, const float *a,
                       int64_t lda);
/* c = alpha * A * op(b) + beta * c, A (m x k) rounded in that layout */
rl_status rl_gemm_bf16_lhs(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                           bool trans_b, const float *b, int64_t ldb, float beta, float *c,
                           int64_t ldc);
/* c = alpha * op(a) * B + beta * c, B (k x n) bf16 in rows ldb >= n elements apart (a rounded
 * left operand's rows serve) */
rl_status rl_gemm_bf16_rhs(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                           float *c, int64_t ldc);

/* ---- bf16 products of a network (precision = "bf16") ----
 *
 * A network in bf16 owns an rl_bf16_ctx: its weights range (its flat parameter buffer) and the
 * kept bf16 packs of the weight operands. The context is active on a thread, never process-wide:
 * while a thread has a context active, the float32 CPU products that thread calls
 * (rl_mat_gemm in layers/matrix.h, the gemm op rl_op_gemm/rl_op_matmul) run through
 * rl_gemm_bf16_ctx, and rl_gemm_packed_fast() says false so that the LSTM's and GRU's products
 * take that path too. rl_cpu_parallel (parallel.h) runs its parts with the caller's active
 * context, so the layers of a concurrent pair, run on the pool's helpers, see their network's.
 * Another network (or another thread) running float32 meanwhile is untouched: it has none.
 *
 * A right operand inside the weights range that is used more than once while the weights stay
 * the same (a recurrent matrix, at every time step; any weight, from the second forward of
 * unchanged weights on) is packed at its second use and kept, keyed by its address, leading
 * dimension, shape and transposition (the forward's and the backward's layouts of one weight are
 * two packs), until a rl_bf16_ctx_begin finds the weights changed: another range, or another
 * version of their storage (rl_storage_version, core/tensor.h; every write from Lua, an
 * optimizer step, a checkpoint load, changes it). An operand once kept is packed and kept at its
 * first use under the next weights. Training thus packs each weight once per update and layout,
 * inference once. Any other operand (a weight used once per pass in training, activations,
 * gradients) is packed on each call, in blocks of columns. A kept pack
 * holds the bits a per-call one would: the products are the same whichever path packed them.
 * Looking packs up takes no lock (the layers of a concurrent pair do it at once). */
typedef struct rl_bf16_ctx rl_bf16_ctx;

/* A context with no weights range, one reference held; NULL when out of memory. */
rl_bf16_ctx *rl_bf16_ctx_new(void);
/* Releases a reference (the context goes with the last); rl_bf16_ctx_hold takes one. */
void rl_bf16_ctx_free(rl_bf16_ctx *ctx);
void rl_bf16_ctx_hold(rl_bf16_ctx *ctx);
/* For weights that never change (an inference model's): from now on every weight operand is
 * packed at its first use and kept for good, and rl_bf16_ctx_begin keeps the first weights range
 * and the packs (products of operands outside it pack per call), so that networks in several
 * threads that read the same parameter buffer can share the context. Called before the context
 * is shared. */
void rl_bf16_ctx_freeze(rl_bf16_ctx *ctx);
/* Makes ctx an int8 context (before its first product): weight operands are quantized as
 * gemm_int8.h says (per output unit) instead of rounded to bf16, kept the same way, and products
 * with them run rl_gemm_int8_packed; products of operands outside the weights run in float32.
 * For inference: the int8 products have no backward of their own. */
void rl_bf16_ctx_set_int8(rl_bf16_ctx *ctx);
bool rl_bf16_ctx_is_int8(const rl_bf16_ctx *ctx);
/* Before a pass, with no product of ctx running: sets the weights range and the version of
 * their contents; when either differs from the last begin's, drops every kept pack (their
 * buffers are reused). */
void rl_bf16_ctx_begin(rl_bf16_ctx *ctx, const void *weights, size_t bytes, uint64_t version);
/* bytes of kept packs the context holds now (for tests and memory figures). */
size_t rl_bf16_ctx_bytes(const rl_bf16_ctx *ctx);
/* weight operands packed through ctx so far, kept or per call (for tests). */
uint64_t rl_bf16_ctx_packs(const rl_bf16_ctx *ctx);

/* The context active on this thread (NULL: float32 products) and setting it (NULL: none). */
rl_bf16_ctx *rl_bf16_active(void);
void rl_bf16_activate(rl_bf16_ctx *ctx);

/* The float32 product through ctx: rl_gemm_bf16, with the packs of its weights kept. */
rl_status rl_gemm_bf16_ctx(rl_bf16_ctx *ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc);
/* rl_gemm_bf16_lhs through ctx (op(b) a weight or not); RL_EARG in an int8 context */
rl_status rl_gemm_bf16_ctx_lhs(rl_bf16_ctx *ctx, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, bool trans_b, const float *b, int64_t ldb,
                               float beta, float *c, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif
