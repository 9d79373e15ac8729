/* The CTC loss and gradient on CUDA devices (API: kernels/cuda/ctc_cuda.h; formulas:
 * kernels/ctc_step.h, the same functions the CPU loops call).
 *
 * One block per sequence; its threads stride over the extended label positions u (and over
 * the classes v for the log-softmax and the gradient). Per block, in the float64 scratch:
 *   ls    (T)        log sum_v exp(logit(t, v)) of each valid frame
 *   alpha (T, U + 2) two leading sentinel columns (RL_CTC_NEG), as on the CPU
 *   beta, nb (U + 2) the current beta row and beta + emission of the next frame, two trailing
 *                    sentinels
 *   post  (U)        exp(alpha + beta - log P) of the frame whose gradient is being written
 * and in the int32 region, besides the packed labels and lengths, the positions of each class
 * in the extended sequence (a CSR list built by thread 0: pos[start[v] .. start[v + 1]]), so
 * that thread v sums its posteriors in a fixed order: no atomics, the same bits every run.
 * Frames run one after the other with a __syncthreads between them: alpha forward, log P,
 * then beta backward with the gradient of each frame written as soon as its beta is known
 * (grad = exp(logit - ls) - gamma; 0 on padded frames and for sequences without an
 * alignment). The recursions run in float64 for both dtypes (the results are stored in the
 * logits' dtype); they agree with the CPU up to rounding (nvcc contracts into FMAs, and the
 * CPU's float32 path uses rl_expf/rl_logf). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ctc_step.h"
#include "../ops.h"
#include "ctc_cuda.h"
#include "launch.h"

namespace {

/* the int32 region: labels (B, S), in_len (B), lab_len (B), then per sequence
 * start (V + 1) and pos (W) */
struct Layout {
    int64_t T, B, V, S, W;
    int64_t scratch_per_seq; /* doubles */
    int64_t csr_per_seq;     /* ints */
};

template <typename F>
__global__ void k_ctc(Layout L, const F *__restrict__ x, int32_t *__restrict__ ints, int32_t blank,
                      bool zero_inf, double *__restrict__ scratch, F *__restrict__ loss,
                      F *__restrict__ grad) {
    const int64_t b = blockIdx.x;
    const int64_t T = L.T, B = L.B, V = L.V, W = L.W;
    const int32_t *lab = ints + b * L.S;
    const int64_t Tb = ints[B * L.S + b], Sb = ints[B * L.S + B + b], U = 2 * Sb + 1;
    int32_t *csr = ints + B * L.S + 2 * B + b * L.csr_per_seq;
    int32_t *start = csr, *fill = csr + V + 1, *pos = fill + V; /* fill: next free slot */
    double *ls = scratch + b * L.scratch_per_seq;
    double *alpha = ls + T;
    double *lb = alpha + T * W;
    double *nb = lb + W;
    double *post = nb + W;
    const F *xb = x + b * V;
    const int64_t BV = B * V;
    __shared__ double s_logp;
    __shared__ int s_feasible;

    /* log-softmax normalisers of the valid frames, one thread per frame */
    for (int64_t t = threadIdx.x; t < Tb; t += blockDim.x) {
        const F *row = xb + t * BV;
        double m = (double)row[0];
        for (int64_t v = 1; v < V; v++)
            m = fmax(m, (double)row[v]);
        double s = 0.0;
        for (int64_t v = 0; v < V; v++)
            s += exp((double)row[v] - m);
        ls[t] = m + log(s);
    }
    /* the positions of each class (thread 0; O(U + V)) */
    if (threadIdx.x == 0 && grad) {
        for (int64_t v = 0; v <= V; v++)
            start[v] = 0;
        for (int64_t u = 0; u < U; u++)
            start[rl_ctc_ext(lab, 1, u, blank) + 1]++;
        for (int64_t v = 0; v < V; v++)
            start[v + 1] += start[v];
        for (int64_t v = 0; v < V; v++)
            fill[v] = start[v];
        for (int64_t u = 0; u < U; u++)
            pos[fill[rl_ctc_ext(lab, 1, u, blank)]++] = (int32_t)u;
    }
    __syncthreads();

    /* alpha, frame by frame */
    double *a0 = alpha + 2;
    for (int64_t u = threadIdx.x; u < U; u += blockDim.x) {
        double v = RL_CTC_NEG;
        if (Tb > 0 && u < 2) v = rl_ctc_floor_f64((double)xb[rl_ctc_ext(lab, 1, u, blank)] - ls[0]);
        a0[u] = v;
    }
    if (threadIdx.x < 2) alpha[threadIdx.x] = RL_CTC_NEG;
    __syncthreads();
    for (int64_t t = 1; t < Tb; t++) {
        const double *prev = alpha + (t - 1) * W + 2;
        double *cur = alpha + t * W + 2;
        const F *row = xb + t * BV;
        for (int64_t u = threadIdx.x; u < U; u += blockDim.x) {
            double em = rl_ctc_floor_f64((double)row[rl_ctc_ext(lab, 1, u, blank)] - ls[t]);
            cur[u] = rl_ctc_alpha_f64(prev[u], prev[u - 1], prev[u - 2],
                                      rl_ctc_skip_mask(lab, 1, u, U), em);
        }
        if (threadIdx.x < 2) cur[(int64_t)threadIdx.x - 2] = RL_CTC_NEG;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double lp = 0.0; /* T_b = 0 (then S_b = 0): the empty path, probability 1 */
        if (Tb > 0) {
            const double *last = alpha + (Tb - 1) * W + 2;
            lp = rl_ctc_logp_f64(last[U - 1], U > 1 ? last[U - 2] : (double)RL_CTC_NEG);
        }
        s_feasible = lp > RL_CTC_IMPOSSIBLE || lp != lp;
        s_logp = lp;
        loss[b] = s_feasible ? (F)(-lp) : (zero_inf ? (F)0 : (F)INFINITY);
    }
    __syncthreads();
    if (!grad) return;
    const double logp = s_logp;
    /* padded frames, and every frame of a sequence without an alignment: gradient 0 */
    for (int64_t t = s_feasible ? Tb : 0; t < T; t++)
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
            grad[t * BV + b * V + v] = (F)0;
    if (!s_feasible || Tb == 0) return;

    for (int64_t u = threadIdx.x; u < W; u += blockDim.x) {
        lb[u] = (u == U - 1 || u == U - 2) ? 0.0 : (double)RL_CTC_NEG;
        nb[u] = RL_CTC_NEG;
    }
    __syncthreads();
    for (int64_t t = Tb - 1; t >= 0; t--) {
        const double *at = alpha + t * W + 2;
        const F *row = xb + t * BV;
        for (int64_t u = threadIdx.x; u < U; u += blockDim.x)
            post[u] = rl_ctc_post_f64(at[u], lb[u], logp);
        __syncthreads();
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            double g = 0.0;
            for (int32_t k = start[v]; k < start[v + 1]; k++)
                g += post[pos[k]];
            grad[t * BV + b * V + v] = (F)(exp((double)row[v] - ls[t]) - g);
        }
        if (t == 0) break;
        for (int64_t u = threadIdx.x; u < U; u += blockDim.x)
            nb[u] = lb[u] + rl_ctc_floor_f64((double)row[rl_ctc_ext(lab, 1, u, blank)] - ls[t]);
        __syncthreads();
        for (int64_t u = threadIdx.x; u < U; u += blockDim.x)
            lb[u] =
                rl_ctc_beta_f64(nb[u], nb[u + 1], nb[u + 2], rl_ctc_skip_mask(lab, 1, u + 2, U));
        __syncthreads();
    }
}

template <typename F>
rl_status launch(const Layout &L, const rl_tensor *logits, int32_t *ints, int32_t blank,
                 bool zero_inf, double *scratch, rl_tensor *loss, rl_tensor *grad) {
    k_ctc<F><<<(unsigned)L.B, RL_CUDA_THREADS>>>(L, (const F *)rl_tensor_data(logits), ints, blank,
                                                 zero_inf, scratch, (F *)rl_tensor_data(loss),
                                                 grad ? (F *)rl_tensor_data(grad) : NULL);
    return rl_cuda_launched("ctc_loss (cuda, %lld sequences): launching k_ctc", (long long)L.B);
}

} // namespace

extern "C" rl_status rl_ctc_cuda(rl_ctc_work *w, const rl_tensor *logits, const rl_tensor *labels,
                                 const int32_t *input_len, const int32_t *label_len, int64_t blank,
                                 bool zero_infinity, rl_tensor *loss, rl_tensor *grad) {
    const rl_device dev = rl_tensor_device(logits);
    RL_TRY(rl_cuda_use_device("ctc_loss (cuda)", dev.index));
    Layout L;
    L.T = logits->shape[0];
    L.B = logits->shape[1];
    L.V = logits->shape[2];
    if (L.B == 0) return RL_OK;
    int64_t S = 0;
    for (int64_t b = 0; b < L.B; b++)
        S = label_len[b] > S ? label_len[b] : S;
    L.S = S > 0 ? S : 1;
    L.W = 2 * S + 3;
    /* ls (T), alpha (T, W), beta, nb, post (W each); CSR start (V + 1), fill (V), pos (W) */
    L.scratch_per_seq = L.T + L.T * L.W + 3 * L.W;
    L.csr_per_seq = 2 * L.V + 1 + L.W;
    /* pack the labels and lengths on the host, then one copy to the device */
    int64_t nint = L.B * L.S + 2 * L.B;
    int64_t hshape[1] = {nint}, dshape[1] = {nint + L.B * L.csr_per_seq};
    rl_tensor host = {0};
    RL_TRY(rl_tensor_empty(&host, RL_INT32, RL_DEVICE_CPU, 1, hshape));
    int32_t *h = (int32_t *)rl_tensor_data(&host);
    for (int64_t b = 0; b < L.B; b++) {
        for (int64_t s = 0; s < L.S; s++)
            h[b * L.S + s] = s < label_len[b]
                                 ? ((const int32_t *)rl_tensor_data(
                                       labels))[b * labels->stride[0] + s * labels->stride[1]]
                                 : 0;
        h[L.B * L.S + b] = input_len[b];
        h[L.B * L.S + L.B + b] = label_len[b];
    }
    rl_status st = rl_buffer_ensure(&w->dev_int, RL_INT32, dev, 1, dshape);
    rl_tensor head = {0};
    if (st == RL_OK) st = rl_tensor_narrow(&head, &w->dev_int, 0, 0, nint);
    if (st == RL_OK) st = rl_op_copy(&head, &host);
    rl_tensor_release(&head);
    rl_tensor_release(&host);
    RL_TRY(st);
    int64_t sshape[1] = {L.B * L.scratch_per_seq};
    RL_TRY(rl_buffer_ensure(&w->scratch, RL_FLOAT64, dev, 1, sshape));
    int32_t *ints = (int32_t *)rl_tensor_data(&w->dev_int);
    double *scratch = (double *)rl_tensor_data(&w->scratch);
    if (logits->dtype == RL_FLOAT32)
        return launch<float>(L, logits, ints, (int32_t)blank, zero_infinity, scratch, loss, grad);
    return launch<double>(L, logits, ints, (int32_t)blank, zero_infinity, scratch, loss, grad);
}
