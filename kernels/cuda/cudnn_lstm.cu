/* The cuDNN 9 path of the lstm layer (impl = "cudnn"; API: kernels/cuda/lstm_cuda.h).
 *
 * Design: one unidirectional single-layer cuDNN LSTM per rnnlua layer (CUDNN_LSTM,
 * CUDNN_LINEAR_INPUT, CUDNN_RNN_SINGLE_INP_BIAS so that cuDNN's one bias per gate is our b,
 * padded I/O in CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, which is our time-major (T, B, F) with
 * per-sequence lengths, fill 0). float32 runs with CUDNN_FMA_MATH: no TF32, the same arithmetic
 * as our kernels and the CPU. A layer with direction -1 reverses each sequence within its own
 * length (k_reverse, a gather that also zeroes padded frames) before cuDNN and reverses the
 * result after, in forward (x, y) and in backward (dy, dx); cuDNN's initial state then sits at
 * each sequence's last frame, as in layers/lstm.c.
 *
 * Weights: cuDNN keeps per gate q (linLayerID q for the input matrix, 4 + q for the recurrent
 * one, gate order i, f, g(c~), o as ours) an (H, in) matrix, that is W^T's and U^T's gate
 * blocks; their addresses and strides come from cudnnGetRNNWeightParams at creation and are
 * checked there, so the conversion kernels (k_convert) do not assume cuDNN's packing. The
 * object owns the weight space; it is repacked from the layer's W, U, b before each forward
 * (4H (F + H + 1) elements, small next to the recurrence). Gradients go to a separate space that
 * is zeroed before cudnnRNNBackwardWeights_v8 (which adds, CUDNN_WGRAD_MODE_ADD) and added to the
 * layer's dW, dU, db by the same conversion.
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
#include "lstm_cuda.h"
}
#include "launch.h"

namespace {

/* Where cuDNN keeps one gate's matrix (element offset into the weight space, strides of its
 * rows and columns) and bias (offset, or -1 when absent). */
struct Mat {
    int64_t off, rs, cs;
};
struct Layout {
    int64_t F, H;
    Mat w[4], u[4];
    int64_t b[4], rb[4]; /* input bias; recurrent bias (absent with SINGLE_INP_BIAS) */
};

/* ---- kernels ---- */

/* Between rnnlua's W (F, 4H), U (H, 4H), b (4H) and cuDNN's space, walking ours in order.
 * TO_CUDNN: ours -> cuDNN (the recurrent bias, if any, becomes 0); else cuDNN -> ours,
 * overwriting (ACC false) or adding (ACC true). */
template <typename T, bool TO_CUDNN, bool ACC>
__global__ void k_convert(Layout L, T *W, T *U, T *b, T *space) {
    int64_t H4 = 4 * L.H, nw = L.F * H4, nu = L.H * H4, n = nw + nu + H4;
    RL_CUDA_GRID_LOOP(e, n) {
        T *ours;
        int64_t theirs;
        if (e < nw + nu) {
            bool in_w = e < nw;
            int64_t k = in_w ? e : e - nw;
            int64_t c = k / H4, col = k - c * H4, q = col / L.H, r = col - q * L.H;
            const Mat &m = in_w ? L.w[q] : L.u[q];
            ours = (in_w ? W : U) + k;
            theirs = m.off + r * m.rs + c * m.cs;
        } else {
            int64_t k = e - nw - nu, q = k / L.H, r = k - q * L.H;
            ours = b + k;
            theirs = L.b[q] + r;
            if (TO_CUDNN && L.rb[q] >= 0) space[L.rb[q] + r] = T(0);
        }
        if (TO_CUDNN)
            space[theirs] = *ours;
        else
            *ours = ACC ? *ours + space[theirs] : space[theirs];
    }
}

/* dst[t, b, :] = src[len[b] - 1 - t, b, :] on valid frames, 0 on padded ones (T, B, D). */
template <typename T>
__global__ void k_reverse(int64_t T_, int64_t B, int64_t D, const int32_t *__restrict__ len,
                          const T *__restrict__ src, T *__restrict__ dst) {
    int64_t n = T_ * B * D;
    RL_CUDA_GRID_LOOP(e, n) {
        int64_t d = e % D, tb = e / D, b = tb % B, t = tb / B;
        int64_t L = len[b];
        dst[e] = t < L ? src[((L - 1 - t) * B + b) * D + d] : T(0);
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

struct rl_cudnn_lstm {
    int device = 0;
    rl_dtype dt = RL_FLOAT32;
    int64_t F = 0, H = 0;
    int direction = 1;
    cudaStream_t stream = nullptr;
    cudnnHandle_t handle = nullptr;
    cudnnDropoutDescriptor_t drop = nullptr;
    cudnnRNNDescriptor_t rnn = nullptr;
    cudnnRNNDataDescriptor_t xdesc = nullptr, ydesc = nullptr;
    cudnnTensorDescriptor_t hdesc = nullptr;
    Layout layout = {};
    Buf w, dw, work, reserve, xr, yr, dyr, dxr, dx_scratch;
    /* what the last training forward saw, for backward */
    bool have_train = false;
    int64_t T = 0, B = 0;
    const int32_t *len_dev = nullptr;
    const void *x = nullptr, *y = nullptr, *h0 = nullptr, *c0 = nullptr;
    std::vector<int> lens;
};

namespace {

size_t esize(const rl_cudnn_lstm *r) { return rl_dtype_size(r->dt); }

rl_status cudnn_fail(const rl_cudnn_lstm *r, const char *call, cudnnStatus_t st) {
    return rl_error(RL_EDEVICE, "cudnn %s: %s (lstm F=%lld H=%lld, batch T=%lld B=%lld)", call,
                    cudnnGetErrorString(st), (long long)r->F, (long long)r->H, (long long)r->T,
                    (long long)r->B);
}

#define RL_CUDNN_CTX "cudnn lstm (F=%lld H=%lld, batch T=%lld B=%lld): %s"
#define RL_CUDNN_SIZES(r) (long long)(r)->F, (long long)(r)->H, (long long)(r)->T, (long long)(r)->B

rl_status cuda_fail(const rl_cudnn_lstm *r, const char *call, cudaError_t e) {
    return rl_cuda_fail(e, RL_CUDNN_CTX, RL_CUDNN_SIZES(r), call);
}

#define CUDNN_TRY(r, call, expr)                                                                   \
    do {                                                                                           \
        cudnnStatus_t st_ = (expr);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) return cudnn_fail((r), (call), st_);                      \
    } while (0)

rl_status use_device(const rl_cudnn_lstm *r) { return rl_cuda_use_device("cudnn lstm", r->device); }

rl_status launched(const rl_cudnn_lstm *r, const char *kernel) {
    return rl_cuda_launched(RL_CUDNN_CTX, RL_CUDNN_SIZES(r), kernel);
}

void buf_free(rl_cudnn_lstm *r, Buf *b) {
    const rl_device_backend *be = rl_device_cuda_backend();
    if (b->p && be) be->free(r->device, b->p, b->bytes);
    b->p = nullptr;
    b->bytes = 0;
}

/* Grows b to at least `bytes`. The device is synchronised first: the old block may still be in
 * use on the object's stream, and the allocator may hand out a block that another side stream
 * (another layer's) has released but not finished with (kernels/cuda/context.h). */
rl_status buf_ensure(rl_cudnn_lstm *r, Buf *b, size_t bytes) {
    if (b->p && b->bytes >= bytes) return RL_OK;
    const rl_device_backend *be = rl_device_cuda_backend();
    if (!be) return rl_error(RL_EDEVICE, "cudnn lstm: the CUDA backend is not registered");
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
rl_status read_param(rl_cudnn_lstm *r, int id, cudnnTensorDescriptor_t mdesc, void *maddr,
                     cudnnTensorDescriptor_t bdesc, void *baddr, Mat *m, int64_t *boff) {
    int64_t in = id < 4 ? r->F : r->H;
    int dims[3] = {0, 0, 0}, strides[3] = {0, 0, 0}, nb = 0;
    cudnnDataType_t t;
    if (!maddr)
        return rl_error(RL_EDEVICE, "cudnn lstm: no matrix for linear layer %d (F=%lld H=%lld)", id,
                        (long long)r->F, (long long)r->H);
    CUDNN_TRY(r, "cudnnGetTensorNdDescriptor",
              cudnnGetTensorNdDescriptor(mdesc, 3, &t, &nb, dims, strides));
    /* [1,] rows, cols: take the last two dims */
    int lo = nb - 2;
    if (nb < 2 || nb > 3 || (nb == 3 && dims[0] != 1) || dims[lo] != r->H || dims[lo + 1] != in)
        return rl_error(RL_EDEVICE,
                        "cudnn lstm: linear layer %d is a %d-dim [%d, %d, %d] matrix, expected "
                        "[1, %lld, %lld]",
                        id, nb, dims[0], dims[1], dims[2], (long long)r->H, (long long)in);
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
                            "cudnn lstm: the bias of linear layer %d has %lld elements, expected "
                            "%lld",
                            id, (long long)n, (long long)r->H);
        *boff = (int64_t)(((char *)baddr - (char *)r->w.p) / (ptrdiff_t)es);
    }
    return RL_OK;
}

rl_status read_layout(rl_cudnn_lstm *r) {
    cudnnTensorDescriptor_t mdesc = nullptr, bdesc = nullptr;
    CUDNN_TRY(r, "cudnnCreateTensorDescriptor", cudnnCreateTensorDescriptor(&mdesc));
    cudnnStatus_t cs = cudnnCreateTensorDescriptor(&bdesc);
    rl_status st =
        cs == CUDNN_STATUS_SUCCESS ? RL_OK : cudnn_fail(r, "cudnnCreateTensorDescriptor", cs);
    r->layout.F = r->F;
    r->layout.H = r->H;
    for (int id = 0; id < 8 && st == RL_OK; id++) {
        void *maddr = nullptr, *baddr = nullptr;
        cs = cudnnGetRNNWeightParams(r->handle, r->rnn, 0, r->w.bytes, r->w.p, id, mdesc, &maddr,
                                     bdesc, &baddr);
        if (cs != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(r, "cudnnGetRNNWeightParams", cs);
            break;
        }
        int q = id & 3;
        st = read_param(r, id, mdesc, maddr, bdesc, baddr,
                        id < 4 ? &r->layout.w[q] : &r->layout.u[q],
                        id < 4 ? &r->layout.b[q] : &r->layout.rb[q]);
        if (st == RL_OK && id < 4 && r->layout.b[q] < 0)
            st = rl_error(RL_EDEVICE, "cudnn lstm: no input bias for gate %d", q);
    }
    if (mdesc) cudnnDestroyTensorDescriptor(mdesc);
    if (bdesc) cudnnDestroyTensorDescriptor(bdesc);
    return st;
}

rl_status setup(rl_cudnn_lstm *r) {
    RL_TRY(use_device(r));
    CUDNN_TRY(r, "cudnnCreate", cudnnCreate(&r->handle));
    CUDNN_TRY(r, "cudnnCreateDropoutDescriptor", cudnnCreateDropoutDescriptor(&r->drop));
    /* no dropout: cuDNN needs no RNG states then */
    CUDNN_TRY(r, "cudnnSetDropoutDescriptor",
              cudnnSetDropoutDescriptor(r->drop, r->handle, 0.0f, nullptr, 0, 0));
    CUDNN_TRY(r, "cudnnCreateRNNDescriptor", cudnnCreateRNNDescriptor(&r->rnn));
    cudnnDataType_t t = cudnn_type(r->dt);
    CUDNN_TRY(r, "cudnnSetRNNDescriptor_v8",
              cudnnSetRNNDescriptor_v8(
                  r->rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, CUDNN_RNN_SINGLE_INP_BIAS,
                  CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, t, t,
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
rl_status convert(rl_cudnn_lstm *r, void *W, void *U, void *b, void *space, const char *fn) {
    if (!W || !U || !b)
        return rl_error(RL_EARG, "%s: W, U and b must be given (F=%lld H=%lld)", fn,
                        (long long)r->F, (long long)r->H);
    RL_TRY(use_device(r));
    int64_t n = 4 * r->H * (r->F + r->H + 1);
    k_convert<T, TO_CUDNN, ACC><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
        r->layout, (T *)W, (T *)U, (T *)b, (T *)space);
    return launched(r, fn);
}

template <bool TO_CUDNN, bool ACC>
rl_status convert_any(rl_cudnn_lstm *r, void *W, void *U, void *b, void *space, const char *fn) {
    if (r->dt == RL_FLOAT32) return convert<float, TO_CUDNN, ACC>(r, W, U, b, space, fn);
    return convert<double, TO_CUDNN, ACC>(r, W, U, b, space, fn);
}

rl_status reverse(rl_cudnn_lstm *r, int64_t D, const void *src, void *dst) {
    int64_t n = r->T * r->B * D;
    if (r->dt == RL_FLOAT32)
        k_reverse<float><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const float *)src, (float *)dst);
    else
        k_reverse<double><<<rl_cuda_blocks_for(n), RL_CUDA_THREADS, 0, r->stream>>>(
            r->T, r->B, D, r->len_dev, (const double *)src, (double *)dst);
    return launched(r, "k_reverse");
}

rl_status zero_padded(rl_cudnn_lstm *r, int64_t D, void *buf) {
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
rl_status describe_batch(rl_cudnn_lstm *r) {
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

extern "C" rl_status rl_cudnn_lstm_create(rl_cudnn_lstm **out, int device, rl_dtype dt, int64_t F,
                                          int64_t H, int direction) {
    *out = NULL;
    if (dt != RL_FLOAT32 && dt != RL_FLOAT64)
        return rl_error(RL_EDTYPE, "rl_cudnn_lstm_create: dtype %s not supported",
                        rl_dtype_name(dt));
    if (F < 1 || H < 1 || F > INT32_MAX || H > INT32_MAX || (direction != 1 && direction != -1))
        return rl_error(RL_EARG, "rl_cudnn_lstm_create: bad sizes F=%lld H=%lld direction=%d",
                        (long long)F, (long long)H, direction);
    rl_cudnn_lstm *r = new (std::nothrow) rl_cudnn_lstm;
    if (!r) return rl_error(RL_ENOMEM, "rl_cudnn_lstm_create: out of host memory");
    r->device = device;
    r->dt = dt;
    r->F = F;
    r->H = H;
    r->direction = direction;
    rl_status st = setup(r);
    if (st != RL_OK) {
        rl_cudnn_lstm_free(r);
        return st;
    }
    *out = r;
    return RL_OK;
}

extern "C" void rl_cudnn_lstm_free(rl_cudnn_lstm *r) {
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

extern "C" rl_status rl_cudnn_lstm_set_stream(rl_cudnn_lstm *r, void *stream) {
    RL_TRY(use_device(r));
    CUDNN_TRY(r, "cudnnSetStream", cudnnSetStream(r->handle, (cudaStream_t)stream));
    r->stream = (cudaStream_t)stream;
    return RL_OK;
}

extern "C" rl_status rl_cudnn_lstm_pack_weights(rl_cudnn_lstm *r, const void *W, const void *U,
                                                const void *b) {
    return convert_any<true, false>(r, (void *)W, (void *)U, (void *)b, r->w.p,
                                    "rl_cudnn_lstm_pack_weights");
}

extern "C" rl_status rl_cudnn_lstm_unpack_weights(rl_cudnn_lstm *r, void *W, void *U, void *b) {
    return convert_any<false, false>(r, W, U, b, r->w.p, "rl_cudnn_lstm_unpack_weights");
}

extern "C" rl_status rl_cudnn_lstm_unpack_grads(rl_cudnn_lstm *r, void *dW, void *dU, void *db) {
    return convert_any<false, true>(r, dW, dU, db, r->dw.p, "rl_cudnn_lstm_unpack_grads");
}

extern "C" rl_status rl_cudnn_lstm_forward(rl_cudnn_lstm *r, bool train, int64_t T, int64_t B,
                                           const int32_t *len_host, const int32_t *len_dev,
                                           const void *x, void *y, const void *h0, const void *c0,
                                           void *hT, void *cT) {
    r->have_train = false;
    r->T = T;
    r->B = B;
    if (T < 1 || B < 1 || T > INT32_MAX || B > INT32_MAX || !len_host || !len_dev || !x || !y)
        return rl_error(RL_EARG,
                        "rl_cudnn_lstm_forward: bad batch T=%lld B=%lld (or a missing lengths, "
                        "x or y)",
                        (long long)T, (long long)B);
    try {
        r->lens.resize((size_t)B);
    } catch (...) {
        return rl_error(RL_ENOMEM, "rl_cudnn_lstm_forward: out of host memory (B=%lld)",
                        (long long)B);
    }
    for (int64_t b = 0; b < B; b++) {
        if (len_host[b] < 1 || len_host[b] > T)
            return rl_error(RL_EARG,
                            "rl_cudnn_lstm_forward: length %d of sequence %lld not in 1..%lld",
                            (int)len_host[b], (long long)b, (long long)T);
        r->lens[(size_t)b] = (int)len_host[b];
    }
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
    if (r->direction < 0) {
        RL_TRY(buf_ensure(r, &r->xr, (size_t)(T * B * r->F) * es));
        RL_TRY(buf_ensure(r, &r->yr, (size_t)(T * B * r->H) * es));
        RL_TRY(reverse(r, r->F, x, r->xr.p));
        xin = r->xr.p;
        yout = r->yr.p;
    }
    CUDNN_TRY(r, "cudnnRNNForward",
              cudnnRNNForward(r->handle, r->rnn, mode, len_dev, r->xdesc, xin, r->ydesc, yout,
                              r->hdesc, h0, hT, r->hdesc, c0, cT, r->w.bytes, r->w.p, work,
                              r->work.p, train ? reserve : 0, train ? r->reserve.p : nullptr));
    /* the reversal writes 0 to padded frames; cuDNN's padding fill is not relied on */
    if (r->direction < 0)
        RL_TRY(reverse(r, r->H, r->yr.p, y));
    else
        RL_TRY(zero_padded(r, r->H, y));
    r->x = xin;
    r->y = yout;
    r->h0 = h0;
    r->c0 = c0;
    r->have_train = train;
    return RL_OK;
}

extern "C" rl_status rl_cudnn_lstm_backward(rl_cudnn_lstm *r, const void *dy, void *dx, void *dh0,
                                            void *dc0) {
    if (!r->have_train)
        return rl_error(RL_EARG,
                        "rl_cudnn_lstm_backward: no training forward to go back through "
                        "(F=%lld H=%lld)",
                        (long long)r->F, (long long)r->H);
    if (!dy)
        return rl_error(RL_EARG, "rl_cudnn_lstm_backward: dy must be given (T=%lld B=%lld H=%lld)",
                        (long long)r->T, (long long)r->B, (long long)r->H);
    r->have_train = false;
    RL_TRY(use_device(r));
    size_t es = esize(r), work = 0, reserve = 0;
    CUDNN_TRY(r, "cudnnGetRNNTempSpaceSizes",
              cudnnGetRNNTempSpaceSizes(r->handle, r->rnn, CUDNN_FWD_MODE_TRAINING, r->xdesc, &work,
                                        &reserve));
    if (work > r->work.bytes || reserve > r->reserve.bytes)
        return rl_error(RL_EDEVICE,
                        "rl_cudnn_lstm_backward: cuDNN asks for more space than in "
                        "forward (T=%lld B=%lld)",
                        (long long)r->T, (long long)r->B);
    size_t xbytes = (size_t)(r->T * r->B * r->F) * es;
    const void *dyin = dy;
    void *dxout = dx;
    if (r->direction < 0) {
        RL_TRY(buf_ensure(r, &r->dyr, (size_t)(r->T * r->B * r->H) * es));
        RL_TRY(buf_ensure(r, &r->dxr, xbytes));
        RL_TRY(reverse(r, r->H, dy, r->dyr.p));
        dyin = r->dyr.p;
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
        RL_TRY(reverse(r, r->F, r->dxr.p, dx));
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
