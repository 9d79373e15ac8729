/* The CUDA context: what every CUDA user shares (kernels/cuda/context.cu). A plain C header: no
 * CUDA include, so layers/ can use it; streams are `void *` holding a cudaStream_t (NULL: the
 * legacy default stream, the stream of the tensor ops, the optimizers, CTC and the allocator).
 * Only present in a CUDA build (RL_WITH_CUDA). The .cu files reach the same module through
 * kernels/cuda/launch.h (error helpers, launch geometry, cuBLAS handles).
 *
 * What the context owns, per process:
 *   - side streams (rl_cuda_stream_create) and one event per side stream;
 *   - which side stream last wrote which device bytes (kernels/stream_deps.h), for the events;
 *   - the cuBLAS handles, one per (device, stream), created on first use with the default math
 *     mode (no TF32: float32 stays float32, as on the CPU); a handle owns its workspace, and
 *     rl_cuda_stream_destroy destroys the handles of its stream, so building and freeing networks
 *     leaks nothing. The legacy stream's handle, one per device, lives as long as the process.
 *
 * Every pointer named a buffer is device memory; the functions make the device that holds it
 * current. Calls are asynchronous on their stream; errors come back as RL_EDEVICE (a failing CUDA
 * or cuBLAS call, naming the function and the sizes), RL_ENOMEM or RL_EARG.
 *
 * Streams and ordering: each lstm or gru layer object (each direction of a bidirectional pair)
 * gets its own blocking stream from rl_cuda_stream_create and passes it to every call of that
 * layer; the host only queues work, so independent layers (the two directions) overlap on the
 * GPU. Blocking streams are ordered with the legacy default stream, which every tensor op
 * (kernels/cuda/ops.cu) uses, but NOT with each other: a layer on stream B reading what a layer on
 * stream A wrote, with no legacy-stream work queued in between (a stacked LSTM, the second layer
 * of a BLSTM reading both directions, backward handing grad_in to the layer below), would race.
 * So the order is explicit: after queuing a call a layer calls rl_cuda_stream_wrote with what it
 * wrote (forward: its output and state buffers, the final state's home; backward: its grad_in and
 * the initial state's gradients), which records its stream's event, and before queuing a call it
 * calls rl_cuda_stream_wait_for with everything it will read or overwrite (forward: its inputs
 * and given initial state; backward: grad_out, the given final state gradients and grad_in),
 * which makes its stream wait for the events of the other streams that last wrote those bytes.
 * Reading across batches (backward reads the inputs again) is ordered by the legacy-stream work
 * between (loss, optimizer).
 *
 * Memory: a buffer released by one side stream and handed by the caching allocator to another
 * side stream with no default-stream work queued in between would be in use twice. So a user of
 * side streams synchronises the device before it allocates (layers/recurrent.c does when a buffer
 * must grow; the cuDNN object when its spaces grow) and its own stream before it frees a buffer
 * that stream may still use; buffers are kept across batches, so both are rare.
 */
#ifndef RL_KERNELS_CUDA_CONTEXT_H
#define RL_KERNELS_CUDA_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/error.h"
#include "../../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---- */

/* Waits until all work queued on cuda:device (every stream) has finished. */
rl_status rl_cuda_synchronize(int device);

/* ---- side streams ---- */

/* A new blocking stream on cuda:device and its event (see above); destroy it with
 * rl_cuda_stream_destroy (queued work finishes first), which also destroys its event and the
 * cuBLAS handles made for it. */
rl_status rl_cuda_stream_create(int device, void **stream);
void rl_cuda_stream_destroy(void *stream);
/* Before queuing work on stream that reads or overwrites the n tensors (NULL, unset and non-CUDA
 * ones are skipped): the stream waits for the other streams that last wrote any of their bytes.
 * A NULL stream (the legacy one) needs no wait. */
rl_status rl_cuda_stream_wait_for(void *stream, const rl_tensor *const *ts, int n);
/* After queuing work on stream that wrote the n tensors: records the stream's event and notes it
 * as their writer, for rl_cuda_stream_wait_for of later readers on other streams. */
rl_status rl_cuda_stream_wrote(void *stream, const rl_tensor *const *ts, int n);
/* Waits until all work queued on the stream has finished. */
rl_status rl_cuda_stream_sync(void *stream);

/* ---- stream-ordered helpers (nothing here touches the legacy default stream, so queuing them
 * never waits for another layer's stream) ---- */

/* len_dev (B int32, device) <- len_host (B, host), queued on the stream. The values travel as
 * kernel arguments (chunks of 512), so len_host need not be pinned, may change as soon as this
 * returns, and the host never waits: a cudaMemcpy from pageable memory would first synchronise
 * (with the legacy default stream, and so with every blocking stream). */
rl_status rl_cuda_set_lengths(void *stream, int32_t *len_dev, const int32_t *len_host, int64_t B);
/* `bytes` zero bytes at p (device), queued on the stream. */
rl_status rl_cuda_zero(void *stream, void *p, size_t bytes);
/* `rows` rows of `row_bytes` bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart),
 * device to device on the stream: concatenating and splitting feature blocks, state copies. */
rl_status rl_cuda_copy_rows(void *stream, void *dst, size_t dst_pitch, const void *src,
                            size_t src_pitch, size_t row_bytes, int64_t rows);
/* Row-major c = alpha op(a) op(b) + beta c on the stream (the stream's cuBLAS handle, no TF32),
 * on the device that holds c; dt float32 or float64. */
rl_status rl_cuda_gemm(void *stream, rl_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, double alpha, const void *a, int64_t lda, const void *b,
                       int64_t ldb, double beta, void *c, int64_t ldc);
/* The same in float32 with both operands rounded to bf16 (round to nearest even) by a conversion
 * kernel into a stream-ordered scratch on each call (no context: the network products below share
 * its definition), then cublasGemmEx with bf16 inputs,
 * CUBLAS_COMPUTE_32F and a float32 c: the rounding of rl_gemm_bf16 on the CPU. Matrices up to
 * 2^31 - 1 rows and columns (cublasGemmEx's int sizes). */
rl_status rl_cuda_gemm_bf16(void *stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                            int64_t ldb, float beta, float *c, int64_t ldc);

/* ---- half-precision products of a network (precision "bf16" or "fp16" on a CUDA device) ----
 *
 * A network in bf16 or fp16 on a CUDA device owns an rl_cuda_half_ctx: its format, its weights
 * range (its flat parameter buffer, float32 device memory) and a copy of that range rounded to
 * the format (nearest even; fp16 past 65504 becomes Inf), made by rl_cuda_half_ctx_begin once per
 * version of the weights' storage (rl_storage_version: every optimizer step, write from Lua or
 * checkpoint load changes it), so training converts the weights once per update and inference
 * once. While a thread has a context active (rl_cuda_half_activate; rl_cpu_parallel hands the
 * caller's to its parts), every float32 product that thread queues through the context's cuBLAS
 * path (rl_cuda_gemm, the tensor ops' gemm, the recurrent cells' launchers: all of them go
 * through rl_cuda_gemm_batched) takes both operands in the format and sums in float32
 * (cublasGemmEx, CUBLAS_COMPUTE_32F, float32 result): an operand inside the weights range is read
 * from the kept copy (same leading dimension), any other (activations, gradients, a weight times
 * its dropout mask) is rounded into a stream-ordered scratch on each call. Float64 products are
 * untouched. */
typedef enum { RL_CUDA_BF16 = 1, RL_CUDA_FP16 = 2 } rl_cuda_half;
typedef struct rl_cuda_half_ctx rl_cuda_half_ctx;
/* A context of that format with no weights yet; NULL when out of memory or fmt is neither. */
rl_cuda_half_ctx *rl_cuda_half_ctx_new(rl_cuda_half fmt);
/* Frees it and its copy (after the products queued on it have finished). */
void rl_cuda_half_ctx_free(rl_cuda_half_ctx *ctx);
rl_cuda_half rl_cuda_half_ctx_format(const rl_cuda_half_ctx *ctx);
/* Before a pass: weights (n float32 elements, device) at that version of their contents; when
 * the range or the version differs from the last begin's, rounds them into the copy, queued on
 * the legacy stream (so after the optimizer's update and before every layer's blocking stream).
 * RL_ENOMEM/RL_EDEVICE naming the sizes when the copy cannot be made. */
rl_status rl_cuda_half_ctx_begin(rl_cuda_half_ctx *ctx, const float *weights, int64_t n,
                                 uint64_t version);
/* How many times begin rounded the weights (for tests: once per weights version). */
uint64_t rl_cuda_half_ctx_conversions(const rl_cuda_half_ctx *ctx);
/* The context active on this thread (NULL: float32 products) and setting it. */
rl_cuda_half_ctx *rl_cuda_half_active(void);
void rl_cuda_half_activate(rl_cuda_half_ctx *ctx);

/* dst = src * mask, or dst += src * mask with accumulate (kernels/pointwise.h's rl_drop), n
 * elements of dt (float32 or float64) on the stream: the recurrent driver's dropout masks
 * (layers/recurrent.h: rec_dropout's operand and state gradient, weight_dropout's dU). */
rl_status rl_cuda_mask(void *stream, rl_dtype dt, int64_t n, const void *src, const void *mask,
                       void *dst, bool accumulate);

/* ---- the recurrent driver's options inside a cell's whole-recurrence launchers ----
 *
 * What layers/recurrent.c hands every cell's launchers (kernels/cuda/lstm_cuda.h, gru_cuda.h,
 * janet_cuda.h) besides the cell's own buffers; NULL pointers (or a NULL struct): that option is
 * off. P is the width of state 0 and of the product's operand (n_proj's P, else H).
 *   md (B, P)       rec_dropout's mask (0 or 1/(1 - p), one per sequence)
 *   hd (T, B, P)    forward writes frame t's dropped previous state hd_t = h_prev * md, which the
 *                   step's product reads; backward's dU = Hd^T dZ reads all of them
 *   dtmp (B, P)     backward: the step's product dZ_t U^T before the mask (dh += dtmp * md)
 *   zh, zc (T, B, H)  zoneout's weights of the hidden state and of the cell (NULL: none)
 *   ct (T, B, H)    the lstm under zoneout: the cell before zoneout c~ (forward writes it)
 * weight_dropout needs nothing here: the driver hands U times its mask as U and makes dU through
 * the mask (rl_cuda_mask) after the launcher. */
typedef struct rl_cuda_rec_opts {
    const void *md;
    void *hd, *dtmp;
    const void *zh, *zc;
    void *ct;
} rl_cuda_rec_opts;

/* The operand of frame t's recurrent product in *x: hp itself, or with rec_dropout hd_t = hp * md
 * (queued on the stream). */
rl_status rl_cuda_rec_operand(void *stream, rl_dtype dt, const rl_cuda_rec_opts *o, int64_t t,
                              int64_t B, int64_t P, const void *hp, const void **x);
/* Backward's per-step product dZ_t U^T goes to *dst with beta *beta: dh (beta 1) or, with
 * rec_dropout, dtmp (beta 0), after which rl_cuda_rec_unmask adds dtmp * md to dh. */
void rl_cuda_rec_product_dst(const rl_cuda_rec_opts *o, void *dh, void **dst, double *beta);
rl_status rl_cuda_rec_unmask(void *stream, rl_dtype dt, const rl_cuda_rec_opts *o, int64_t B,
                             int64_t P, void *dh);
/* dU's left operand over all frames: hprev, or with rec_dropout hd. */
const void *rl_cuda_rec_dU_operand(const rl_cuda_rec_opts *o, const void *hprev);

#ifdef __cplusplus
}
#endif

#endif
