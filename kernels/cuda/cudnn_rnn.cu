/* The cuDNN 9 path of the lstm and gru layers (impl = "cudnn"; API: kernels/cuda/cudnn_rnn.h).
 *
 * Design: one unidirectional single-layer cuDNN RNN per rnnlua layer, CUDNN_LINEAR_INPUT, padded
 * I/O in CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, which is our time-major (T, B, F) with
 * per-sequence lengths, fill 0. float32 runs with CUDNN_FMA_MATH: no TF32, the same arithmetic
 * as our kernels and the CPU.
 *   LSTM: CUDNN_LSTM with CUDNN_RNN_SINGLE_INP_BIAS, so that cuDNN's one bias per gate is our b.
 *   GRU: CUDNN_GRU with CUDNN_RNN_DOUBLE_BIAS: b is the input bias, b_h the recurrent one. cuDNN's
 *   documented GRU (cudnnRNNMode_t, CUDNN_GRU) is r = sigma(W_r x + R_r h + b_Wr + b_Rr),
 *   u = sigma(W_u x + R_u h + b_Wu + b_Ru), h' = tanh(W_h x + b_Wh + r * (R_h h + b_Rh)),
 *   h_new = (1 - u) h' + u h: the reset gate multiplies the recurrent product with its bias
 *   ("linear before reset"), which is PyTorch's nn.GRU and layers/gru.c's n (u is our z), so
 *   the two biases cannot be folded into one and both are kept.
 * A layer with direction -1 reverses each sequence within its own length (k_gather, which also
 * zeroes padded frames) before cuDNN and reverses the result after, in forward (x, y) and in
 * backward (dy, dx); cuDNN's initial state then sits at each sequence's last frame, as in
 * layers/lstm.c and layers/gru.c. In a ragged batch of direction 1, x and dy reach cuDNN as
 * copies with the padded frames zeroed (the same gather without the reversal): a NaN or Inf the
 * caller left in the padding then reaches no output and no gradient, as with the own kernels,
 * whatever cuDNN does with padded frames inside.
 *
 * Weights: the mapping between our W, U, b (, b_h) and cuDNN's matrices and biases per linLayerID
 * is kernels/cudnn_layout.h's, with the addresses and strides cuDNN reports
 * (cudnnGetRNNWeightParams) read at creation and checked there (rl_cudnn_layout_check), so the
 * conversion kernel (k_convert) assumes nothing about cuDNN's packing. The object owns the weight
 * space; it is repacked from the layer's parameters before each forward (G H (F + H + 1 or 2)
 * elements, small next to the recurrence). Gradients go to a separate space that is zeroed before
 * cudnnRNNBackwardWeights_v8 (which adds, CUDNN_WGRAD_MODE_ADD) and added to the layer's
 * gradients by the same conversion.
 *
 * Buffers come from the caching allocator of kernels/cuda/device.cu, grow to the largest batch
 * seen and are reused; growing one synchronises the device first (see buf_ensure). Every cuDNN
 * error becomes rl_error(RL_EDEVICE, "cudnn <call>: <message> (sizes)").
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <new>
#include <vector>

#include <cudnn.h>

extern "C" {
#include "../../core/device.h"
#include "../cudnn_layout.h"
#include "cudnn_rnn.h"
}
#include "launch.h"

namespace {

/* ---- kernels ---- */

/* Between our W, U, b, b_h and cuDNN's space, walking ours in order (kernels/cudnn_layout.h).
 * TO_CUDNN: ours -> cuDNN (an unused recurrent bias becomes 0); else cuDNN -> ours, overwriting
 * (ACC false) or adding (ACC true). */
template <typename T, bool TO_CUDNN, bool ACC>
__global__ void k_convert(rl_cudnn_layout L, T *W, T *U, T *b, T *bh, T *space) {
    int64_t n = rl_cudnn_layout_count(&L);
    RL_CUDA_GRID_LOOP(e, n) {
        int which;
        int64_t k, theirs = rl_cudnn_layout_map(&L, e, &which, &k);
        T *ours = (which == 0 ? W : which == 1 ? U : which == 2 ? b : bh) + k;
        if (TO_CUDNN) {
            space[theirs] = *ours;
            int64_t z = which == 2 ? rl_cudnn_layout_unused_bias(&L, k) : -1;
            if (z >= 0) space[z] = T(0);
        } else {
            *ours = ACC ? *ours + space[theirs] : space[theirs];
        }
    }
}

/* dst[t, b, :] = src[len[b] - 1 - t, b, :] (REV) or src[t, b, :] on valid frames, 0 on padded
 * ones (T, B, D). */
template <typename T, bool REV>
__global__ void k_gather(int64_t T_, int64_t B, int64_t D, const int32_t *__restrict__ len,
                         const T *__restrict__ src, T *__restrict__ dst) {
    int64_t n = T_ * B * D;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t d = e % D, tb = e / D, b = tb % B, t = tb / B;
        int64_t L = len[b];
        dst[e] = t < L ? src[((REV ? L - 1 - t : t) * B + b) * D + d] : T(0);
    }
}

/* Zeroes the padded frames of a (T, B, D) buffer. */
template <typename T>
__global__ void k_zero_padded(int64_t T_, int64_t B, int64_t D, const int32_t *__restrict__ len,
                              T *__restrict__ buf) {
    int64_t n = T_ * B * D;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t tb = e / D, b = tb % B, t = tb / B;
        if (t >= (int64_t)len[b]) buf[e] = T(0);
    }
}

/* A device buffer of the caching allocator that only grows. */
struct Buf {
    void *p = nullptr;
    size_t bytes = 0;
};

} // namespace

struct rl_cudnn_rnn {
    int device = 0;
    rl_dtype dt = RL_FLOAT32;
    rl_cudnn_cell cell = RL_CUDNN_LSTM;
    int64_t F = 0, H = 0;
    int direction = 1;
    cudaStream_t stream = nullptr;
    cudnnHandle_t handle = nullptr;
    cudnnDropoutDescriptor_t drop = nullptr;
    cudnnRNNDescriptor_t rnn = nullptr;
    cudnnRNNDataDescriptor_t xdesc = nullptr, ydesc = nullptr;
    cudnnTensorDescriptor_t hdesc = nullptr;
    rl_cudnn_layout layout = {};
    Buf w, dw, work, reserve, xr, yr, dyr, dxr, dx_scratch;
    /* what the last training forward saw, for backward */
    bool have_train = false;
    int64_t T = 0, B = 0;
    const int32_t *len_dev = nullptr;
    const void *x = nullptr, *y = nullptr, *h0 = nullptr, *c0 = nullptr;
    std::vector<int> lens;
    bool ragged = false; /* some sequence of the batch is shorter than T */
};

namespace {

size_t esize(const rl_cudnn_rnn *r) { return rl_dtype_size(r->dt); }

const char *cell_name(const rl_cudnn_rnn *r) { return r->cell == RL_CUDNN_GRU ? "gru" : "lstm"; }
int n_gates(const rl_cudnn_rnn *r) { return r->cell == RL_CUDNN_GRU ? 3 : 4; }

rl_status cudnn_fail(const rl_cudnn_rnn *r, const char *call, cudnnStatus_t st) {
    return rl_error(RL_EDEVICE, "cudnn %s: %s (%s F=%lld H=%lld, batch T=%lld B=%lld)", call,
                    cudnnGetErrorString(st), cell_name(r), (long long)r->F, (long long)r->H,
                    (long long)r->T, (long long)r->B);
}

#define RL_CUDNN_CTX "cudnn %s (F=%lld H=%lld, batch T=%lld B=%lld): %s"
#define RL_CUDNN_SIZES(r)                                                                          \
    cell_name(r), (long long)(r)->F, (long long)(r)->H, (long long)(r)->T, (long long)(r)->B

rl_status cuda_fail(const rl_cudnn_rnn *r, const char *call, cudaError_t e) {
    return rl_cuda_fail(e, RL_CUDNN_CTX, RL_CUDNN_SIZES(r), call);
}

#define CUDNN_TRY(r, call, expr)                                                                   \
    do {                                                                                           \
        cudnnStatus_t st_ = (expr);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) return cudnn_fail((r), (call), st_);                      \
    } while (0)

rl_status use_device(const rl_cudnn_rnn *r) {
    return rl_cuda_use_device(r->cell == RL_CUDNN_GRU ? "cudnn gru" : "cudnn lstm", r->device);
}

rl_status launched(const rl_cudnn_rnn *r, const char *kernel) {
    return rl_cuda_launched(RL_CUDNN_CTX, RL_CUDNN_SIZES(r), kernel);
}

void buf_free(rl_cudnn_rnn *r, Buf *b) {
    const rl_device_backend *be = rl_device_cuda_backend();
    if (b->p && be) be->free(r->device, b->p, b->bytes);
    b->p = nullptr;
    b->bytes = 0;
}

/* Grows b to at least `bytes`. The device is synchronised first: the old block may still be in
 * use on the object's stream, and the allocator may hand out a block that another side stream
 * (another layer's) has released but not finished with (kernels/cuda/context.h). */
rl_status buf_ensure(rl_cudnn_rnn *r, Buf *b, size_t bytes) {
    if (b->p && b->bytes >= bytes) return RL_OK;
    const rl_device_backend *be = rl_device_cuda_backend();
    if (!be)
        return rl_error(RL_EDEVICE, "cudnn %s: the CUDA backend is not registered", cell_name(r));
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return cuda_fail(r, "cudaDeviceSynchronize", e);
    buf_free(r, b);
    if (bytes == 0) return RL_OK;
    RL_TRY(be->alloc(r->device, bytes, &b->p));
    b->bytes = bytes;
    return RL_OK;
}

cudnnDataType_t cudnn_type(rl_dtype dt) {
    return dt == RL_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

/* A matrix or bias of the weight space: its offset in elements and, for a matrix, the strides
 * of its (H, in) rows and columns; checks the shape cuDNN reports. */
rl_status read_param(rl_cudnn_rnn *r, int id, cudnnTensorDescriptor_t mdesc, void *maddr,
                     cudnnTensorDescriptor_t bdesc, void *baddr, rl_cudnn_mat *m, int64_t *boff) {
    int64_t in = id < n_gates(r) ? r->F : r->H;
    int dims[3] = {0, 0, 0}, strides[3] = {0, 0, 0}, nb = 0;
    cudnnDataType_t t;
    if (!maddr)
        return rl_error(RL_EDEVICE, "cudnn %s: no matrix for linear layer %d (F=%lld H=%lld)",
                        cell_name(r), id, (long long)r->F, (long long)r->H);
    CUDNN_TRY(r, "cudnnGetTensorNdDescriptor",
              cudnnGetTensorNdDescriptor(mdesc, 3, &t, &nb, dims, strides));
    /* [1,] rows, cols: take the last two dims */
    int lo = nb - 2;
    if (nb < 2 || nb > 3 || (nb == 3 && dims[0] != 1) || dims[lo] != r->H || dims[lo + 1] != in)
        return rl_error(RL_EDEVICE,
                        "cudnn %s: linear layer %d is a %d-dim [%d, %d, %d] matrix, expected "
                        "[1, %lld, %lld]",
                        cell_name(r), id, nb, dims[0], dims[1], dims[2], (long long)r->H,
                        (long long)in);
    size_t es = esize(r);
    m->off = (int64_t)(((char *)maddr - (char *)r->w.p) / (ptrdiff_t)es);
    m->rs = strides[lo];
    m->cs = strides[lo + 1];
    *boff = -1;
    if (baddr) {
        CUDNN_TRY(r, "cudnnGetTensorNdDescriptor",
                  cudnnGetTensorNdDescriptor(bdesc, 3, &t, &nb, dims, strides));
        int64_t n = 1;
        for (int k = 0; k < nb; k++)
            n *= dims[k];
        if (n != r->H)
            return rl_error(RL_EDEVICE,
                            "cudnn %s: the bias of linear layer %d has %lld elements, expected "
                            "%lld",
                            cell_name(r), id, (long long)n, (long long)r->H);
        *boff = (int64_t)(((char *)baddr - (char *)r->w.p) / (ptrdiff_t)es);
    }
    return RL_OK;
}

rl_status read_layout(rl_cudnn_rnn *r) {
    cudnnTensorDescriptor_t mdesc = nullptr, bdesc = nullptr;
    CUDNN_TRY(r, "cudnnCreateTensorDescriptor", cudnnCreateTensorDescriptor(&mdesc));
    cudnnStatus_t cs = cudnnCreateTensorDescriptor(&bdesc);
    rl_status st =
        cs == CUDNN_STATUS_SUCCESS ? RL_OK : cudnn_fail(r, "cudnnCreateTensorDescriptor", cs);
    int G = n_gates(r);
    r->layout.F = r->F;
    r->layout.H = r->H;
    r->layout.gates = G;
    r->layout.two_biases = r->cell == RL_CUDNN_GRU;
    for (int id = 0; id < 2 * G && st == RL_OK; id++) {
        void *maddr = nullptr, *baddr = nullptr;
        cs = cudnnGetRNNWeightParams(r->handle, r->rnn, 0, r->w.bytes, r->w.p, id, mdesc, &maddr,
                                     bdesc, &baddr);
        if (cs != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(r, "cudnnGetRNNWeightParams", cs);
            break;
        }
        int q = id % G;
        st = read_param(r, id, mdesc, maddr, bdesc, baddr,
                        id < G ? &r->layout.w[q] : &r->layout.u[q],
                        id < G ? &r->layout.b[q] : &r->layout.rb[q]);
    }
    if (mdesc) cudnnDestroyTensorDescriptor(mdesc);
    if (bdesc) cudnnDestroyTensorDescriptor(bdesc);
    /* every parameter somewhere in the space, no two on one place, the biases the mode needs */
    if (st == RL_OK)
        st = rl_cudnn_layout_check(&r->layout, (int64_t)(r->w.bytes / esize(r)),
                                   r->cell == RL_CUDNN_GRU ? "cudnn gru" : "cudnn lstm");
    return st;
}

rl_status setup(rl_cudnn_rnn *r) {
    RL_TRY(use_device(r));
    CUDNN_TRY(r, "cudnnCreate", cudnnCreate(&r->handle));
    CUDNN_TRY(r, "cudnnCreateDropoutDescriptor", cudnnCreateDropoutDescriptor(&r->drop));
    /* no dropout: cuDNN needs no RNG states then */
    CUDNN_TRY(r, "cudnnSetDropoutDescriptor",
              cudnnSetDropoutDescriptor(r->drop, r->handle, 0.0f, nullptr, 0, 0));
    CUDNN_TRY(r, "cudnnCreateRNNDescriptor", cudnnCreateRNNDescriptor(&r->rnn));
    cudnnDataType_t t = cudnn_type(r->dt);
    bool gru = r->cell == RL_CUDNN_GRU;
    CUDNN_TRY(r, "cudnnSetRNNDescriptor_v8",
              cudnnSetRNNDescriptor_v8(
                  r->rnn, CUDNN_RNN_ALGO_STANDARD, gru ? CUDNN_GRU : CUDNN_LSTM,
                  gru ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_SINGLE_INP_BIAS, CUDNN_UNIDIRECTIONAL,
                  CUDNN_LINEAR_INPUT, t, t,
                  r->dt == RL_FLOAT32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH, (int32_t)r->F,
                  (int32_t)r->H, (int32_t)r->H, 1, r->drop, CUDNN_RNN_PADDED_IO_ENABLED));
    CUDNN_TRY(r, "cudnnCreateRNNDataDescriptor", cudnnCreateRNNDataDescriptor(&r->xdesc));
    CUDNN_TRY(r, "cudnnCreateRNNDataDescriptor", cudnnCreateRNNDataDescriptor(&r->ydesc));
    CUDNN_TRY(r, "cudnnCreateTensorDescriptor", cudnnCreateTensorDescriptor(&r->hdesc));
    size_t wbytes = 0;
    CUDNN_TRY(r, "cudnnGetRNNWeightSpaceSize",
              cudnnGetRNNWeightSpaceSize(r->handle, r->rnn, &wbytes));
    RL_TRY(buf_ensure(r, &r->w, wbytes));
    RL_TRY(buf_ensure(r, &r->dw, wbytes));
    /* parts of the space no parameter maps to must not hold garbage */
    cudaError_t e = cudaMemset(r->w.p, 0, wbytes);
    if (e != cudaSuccess) return cuda_fail(r, "cudaMemset", e);
    return read_layout(r);
}

template <typename T, bool TO_CUDNN, bool ACC>
void convert(rl_cudnn_rnn *r, void *W, void *U, void *b, void *bh, void *space) {
    int64_t n = rl_cudnn_layout_count(&r->layout);
    k_convert<T, TO_CUDNN, ACC><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
        r->layout, (T *)W, (T *)U, (T *)b, (T *)bh, (T *)space);
}

/* The GRU needs b_h, the LSTM has none. */
template <bool TO_CUDNN, bool ACC>
rl_status convert_any(rl_cudnn_rnn *r, void *W, void *U, void *b, void *bh, void *space,
                      const char *fn) {
    bool gru = r->cell == RL_CUDNN_GRU;
    if (!W || !U || !b || (gru && !bh) || (!gru && bh))
        return rl_error(RL_EARG, "%s: W, U and b%s must be given%s (%s F=%lld H=%lld)", fn,
                        gru ? " and b_h" : "", gru ? "" : ", b_h not", cell_name(r),
                        (long long)r->F, (long long)r->H);
    RL_TRY(use_device(r));
    if (r->dt == RL_FLOAT32)
        convert<float, TO_CUDNN, ACC>(r, W, U, b, bh, space);
    else
        convert<double, TO_CUDNN, ACC>(r, W, U, b, bh, space);
    return launched(r, fn);
}

/* src -> dst (T, B, D) through k_gather: each sequence reversed within its length for
 * direction -1, in place in time for 1; padded frames 0 either way. */
rl_status gather(rl_cudnn_rnn *r, int64_t D, const void *src, void *dst) {
    int64_t n = r->T * r->B * D;
    unsigned blocks = rl_cuda_blocks_for(n);
    bool rev = r->direction < 0;
    if (r->dt == RL_FLOAT32 && rev)
        k_gather<float, true><<<blocks, RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const float *)src, (float *)dst);
    else if (r->dt == RL_FLOAT32)
        k_gather<float, false><<<blocks, RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const float *)src, (float *)dst);
    else if (rev)
        k_gather<double, true><<<blocks, RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const double *)src, (double *)dst);
    else
        k_gather<double, false><<<blocks, RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const double *)src, (double *)dst);
    return launched(r, "k_gather");
}

rl_status zero_padded(rl_cudnn_rnn *r, int64_t D, void *buf) {
    int64_t n = r->T * r->B * D;
    if (r->dt == RL_FLOAT32)
        k_zero_padded<float><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (float *)buf);
    else
        k_zero_padded<double><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (double *)buf);
    return launched(r, "k_zero_padded");
}

/* The data descriptors and hdesc for a batch. */
rl_status describe_batch(rl_cudnn_rnn *r) {
    cudnnDataType_t t = cudnn_type(r->dt);
    double fill64 = 0.0;
    float fill32 = 0.0f;
    void *fill = r->dt == RL_FLOAT64 ? (void *)&fill64 : (void *)&fill32;
    CUDNN_TRY(r, "cudnnSetRNNDataDescriptor (x)",
              cudnnSetRNNDataDescriptor(r->xdesc, t, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                        (int)r->T, (int)r->B, (int)r->F, r->lens.data(), fill));
    CUDNN_TRY(r, "cudnnSetRNNDataDescriptor (y)",
              cudnnSetRNNDataDescriptor(r->ydesc, t, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                        (int)r->T, (int)r->B, (int)r->H, r->lens.data(), fill));
    int dims[3] = {1, (int)r->B, (int)r->H}, strides[3] = {(int)(r->B * r->H), (int)r->H, 1};
    CUDNN_TRY(r, "cudnnSetTensorNdDescriptor",
              cudnnSetTensorNdDescriptor(r->hdesc, t, 3, dims, strides));
    return RL_OK;
}

} // namespace

/* ---- the C API ---- */

extern "C" rl_status rl_cudnn_rnn_create(rl_cudnn_rnn **out, rl_cudnn_cell cell, int device,
                                         rl_dtype dt, int64_t F, int64_t H, int direction) {
    *out = NULL;
    if (cell != RL_CUDNN_LSTM && cell != RL_CUDNN_GRU)
        return rl_error(RL_EARG, "rl_cudnn_rnn_create: unknown cell %d", (int)cell);
    if (dt != RL_FLOAT32 && dt != RL_FLOAT64)
        return rl_error(RL_EDTYPE, "rl_cudnn_rnn_create: dtype %s not supported",
                        rl_dtype_name(dt));
    if (F < 1 || H < 1 || F > INT32_MAX || H > INT32_MAX || (direction != 1 && direction != -1))
        return rl_error(RL_EARG, "rl_cudnn_rnn_create: bad sizes F=%lld H=%lld direction=%d",
                        (long long)F, (long long)H, direction);
    rl_cudnn_rnn *r = new (std::nothrow) rl_cudnn_rnn;
    if (!r) return rl_error(RL_ENOMEM, "rl_cudnn_rnn_create: out of host memory");
    r->cell = cell;
    r->device = device;
    r->dt = dt;
    r->F = F;
    r->H = H;
    r->direction = direction;
    rl_status st = setup(r);
    if (st != RL_OK) {
        rl_cudnn_rnn_free(r);
        return st;
    }
    *out = r;
    return RL_OK;
}

extern "C" void rl_cudnn_rnn_free(rl_cudnn_rnn *r) {
    if (!r) return;
    if (cudaSetDevice(r->device) == cudaSuccess) cudaStreamSynchronize(r->stream);
    cudaGetLastError();
    Buf *bufs[] = {&r->w,  &r->dw,  &r->work, &r->reserve,   &r->xr,
                   &r->yr, &r->dyr, &r->dxr,  &r->dx_scratch};
    for (Buf *b : bufs)
        buf_free(r, b);
    if (r->hdesc) cudnnDestroyTensorDescriptor(r->hdesc);
    if (r->ydesc) cudnnDestroyRNNDataDescriptor(r->ydesc);
    if (r->xdesc) cudnnDestroyRNNDataDescriptor(r->xdesc);
    if (r->rnn) cudnnDestroyRNNDescriptor(r->rnn);
    if (r->drop) cudnnDestroyDropoutDescriptor(r->drop);
    if (r->handle) cudnnDestroy(r->handle);
    delete r;
}

extern "C" rl_status rl_cudnn_rnn_set_stream(rl_cudnn_rnn *r, void *stream) {
    RL_TRY(use_device(r));
    CUDNN_TRY(r, "cudnnSetStream", cudnnSetStream(r->handle, (cudaStream_t)stream));
    r->stream = (cudaStream_t)stream;
    return RL_OK;
}

extern "C" const rl_cudnn_layout *rl_cudnn_rnn_layout(const rl_cudnn_rnn *r, int64_t *n) {
    *n = (int64_t)(r->w.bytes / esize(r));
    return &r->layout;
}

extern "C" rl_status rl_cudnn_rnn_pack_weights(rl_cudnn_rnn *r, const void *W, const void *U,
                                               const void *b, const void *bh) {
    return convert_any<true, false>(r, (void *)W, (void *)U, (void *)b, (void *)bh, r->w.p,
                                    "rl_cudnn_rnn_pack_weights");
}

extern "C" rl_status rl_cudnn_rnn_unpack_weights(rl_cudnn_rnn *r, void *W, void *U, void *b,
                                                 void *bh) {
    return convert_any<false, false>(r, W, U, b, bh, r->w.p, "rl_cudnn_rnn_unpack_weights");
}

extern "C" rl_status rl_cudnn_rnn_unpack_grads(rl_cudnn_rnn *r, void *dW, void *dU, void *db,
                                               void *dbh) {
    return convert_any<false, true>(r, dW, dU, db, dbh, r->dw.p, "rl_cudnn_rnn_unpack_grads");
}

extern "C" rl_status rl_cudnn_rnn_forward(rl_cudnn_rnn *r, bool train, int64_t T, int64_t B,
                                          const int32_t *len_host, const int32_t *len_dev,
                                          const void *x, void *y, const void *h0, const void *c0,
                                          void *hT, void *cT) {
    r->have_train = false;
    r->T = T;
    r->B = B;
    if (T < 1 || B < 1 || T > INT32_MAX || B > INT32_MAX || !len_host || !len_dev || !x || !y)
        return rl_error(RL_EARG,
                        "rl_cudnn_rnn_forward: bad batch T=%lld B=%lld (or a missing lengths, "
                        "x or y)",
                        (long long)T, (long long)B);
    if (r->cell == RL_CUDNN_GRU && (c0 || cT))
        return rl_error(RL_EARG, "rl_cudnn_rnn_forward: a gru has no cell state (c0, cT given)");
    try {
        r->lens.resize((size_t)B);
    } catch (...) {
        return rl_error(RL_ENOMEM, "rl_cudnn_rnn_forward: out of host memory (B=%lld)",
                        (long long)B);
    }
    for (int64_t b = 0; b < B; b++) {
        if (len_host[b] < 1 || len_host[b] > T)
            return rl_error(RL_EARG,
                            "rl_cudnn_rnn_forward: length %d of sequence %lld not in 1..%lld",
                            (int)len_host[b], (long long)b, (long long)T);
        r->lens[(size_t)b] = (int)len_host[b];
    }
    r->ragged = false;
    for (int64_t b = 0; b < B; b++)
        r->ragged = r->ragged || len_host[b] < T;
    r->len_dev = len_dev;
    RL_TRY(use_device(r));
    RL_TRY(describe_batch(r));
    size_t work = 0, reserve = 0;
    cudnnForwardMode_t mode = train ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
    CUDNN_TRY(r, "cudnnGetRNNTempSpaceSizes",
              cudnnGetRNNTempSpaceSizes(r->handle, r->rnn, mode, r->xdesc, &work, &reserve));
    RL_TRY(buf_ensure(r, &r->work, work));
    if (train) RL_TRY(buf_ensure(r, &r->reserve, reserve));
    const void *xin = x;
    void *yout = y;
    size_t es = esize(r);
    /* cuDNN reads a copy of x with the padded frames zeroed in a ragged batch too: whatever the
     * caller left there (even NaN) must reach no result, whether or not cuDNN reads it */
    if (r->direction < 0 || r->ragged) {
        RL_TRY(buf_ensure(r, &r->xr, (size_t)(T * B * r->F) * es));
        RL_TRY(gather(r, r->F, x, r->xr.p));
        xin = r->xr.p;
    }
    if (r->direction < 0) {
        RL_TRY(buf_ensure(r, &r->yr, (size_t)(T * B * r->H) * es));
        yout = r->yr.p;
    }
    CUDNN_TRY(r, "cudnnRNNForward",
              cudnnRNNForward(r->handle, r->rnn, mode, len_dev, r->xdesc, xin, r->ydesc, yout,
                              r->hdesc, h0, hT, r->hdesc, c0, cT, r->w.bytes, r->w.p, work,
                              r->work.p, train ? reserve : 0, train ? r->reserve.p : nullptr));
    /* the reversal writes 0 to padded frames; cuDNN's padding fill is not relied on */
    if (r->direction < 0)
        RL_TRY(gather(r, r->H, r->yr.p, y));
    else
        RL_TRY(zero_padded(r, r->H, y));
    r->x = xin;
    r->y = yout;
    r->h0 = h0;
    r->c0 = c0;
    r->have_train = train;
    return RL_OK;
}

extern "C" rl_status rl_cudnn_rnn_backward(rl_cudnn_rnn *r, const void *dy, void *dx, void *dh0,
                                           void *dc0) {
    if (!r->have_train)
        return rl_error(RL_EARG,
                        "rl_cudnn_rnn_backward: no training forward to go back through "
                        "(F=%lld H=%lld)",
                        (long long)r->F, (long long)r->H);
    if (!dy)
        return rl_error(RL_EARG, "rl_cudnn_rnn_backward: dy must be given (T=%lld B=%lld H=%lld)",
                        (long long)r->T, (long long)r->B, (long long)r->H);
    if (r->cell == RL_CUDNN_GRU && dc0)
        return rl_error(RL_EARG, "rl_cudnn_rnn_backward: a gru has no cell state (dc0 given)");
    r->have_train = false;
    RL_TRY(use_device(r));
    size_t es = esize(r), work = 0, reserve = 0;
    CUDNN_TRY(r, "cudnnGetRNNTempSpaceSizes",
              cudnnGetRNNTempSpaceSizes(r->handle, r->rnn, CUDNN_FWD_MODE_TRAINING, r->xdesc, &work,
                                        &reserve));
    if (work > r->work.bytes || reserve > r->reserve.bytes)
        return rl_error(RL_EDEVICE,
                        "rl_cudnn_rnn_backward: cuDNN asks for more space than in "
                        "forward (T=%lld B=%lld)",
                        (long long)r->T, (long long)r->B);
    size_t xbytes = (size_t)(r->T * r->B * r->F) * es;
    const void *dyin = dy;
    void *dxout = dx;
    if (r->direction < 0 || r->ragged) { /* dy's padded frames as x's in forward */
        RL_TRY(buf_ensure(r, &r->dyr, (size_t)(r->T * r->B * r->H) * es));
        RL_TRY(gather(r, r->H, dy, r->dyr.p));
        dyin = r->dyr.p;
    }
    if (r->direction < 0) {
        RL_TRY(buf_ensure(r, &r->dxr, xbytes));
        dxout = r->dxr.p;
    } else if (!dx) {
        RL_TRY(buf_ensure(r, &r->dx_scratch, xbytes));
        dxout = r->dx_scratch.p;
    }
    CUDNN_TRY(r, "cudnnRNNBackwardData_v8",
              cudnnRNNBackwardData_v8(r->handle, r->rnn, r->len_dev, r->ydesc, r->y, dyin, r->xdesc,
                                      dxout, r->hdesc, r->h0, nullptr, dh0, r->hdesc, r->c0,
                                      nullptr, dc0, r->w.bytes, r->w.p, work, r->work.p, reserve,
                                      r->reserve.p));
    if (dx && r->direction < 0)
        RL_TRY(gather(r, r->F, r->dxr.p, dx));
    else if (dx)
        RL_TRY(zero_padded(r, r->F, dx));
    cudaError_t e = cudaMemsetAsync(r->dw.p, 0, r->dw.bytes, r->stream);
    if (e != cudaSuccess) return cuda_fail(r, "cudaMemsetAsync", e);
    CUDNN_TRY(r, "cudnnRNNBackwardWeights_v8",
              cudnnRNNBackwardWeights_v8(r->handle, r->rnn, CUDNN_WGRAD_MODE_ADD, r->len_dev,
                                         r->xdesc, r->x, r->hdesc, r->h0, r->ydesc, r->y,
                                         r->dw.bytes, r->dw.p, work, r->work.p, reserve,
                                         r->reserve.p));
    return RL_OK;
}
