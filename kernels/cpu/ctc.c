/* The CTC loss and gradient on the CPU (see kernels/ctc.h; formulas in kernels/ctc_step.h).
 *
 * One sequence at a time per thread, longest (T_b * U_b) first from a shared counter, so the
 * threads finish together. Per sequence, in the thread's scratch:
 *   lp    (T_b, V)      log-softmax of the valid frames
 *   alpha (T_b, U + 2)  two leading sentinel columns (RL_CTC_NEG) stand for u - 1, u - 2 < 0,
 *                       so every position runs the same branch-free formula (vectorised over u)
 *   beta, nb (U + 2)    the current row of beta and beta + emission of the next frame, with two
 *                       trailing sentinels for u + 1, u + 2 >= U; beta runs backward in one row
 *                       and the gradient of frame t is written as soon as beta(t) is known
 *   em (U + 2), skip (U + 2), ext (U + 2), gam (V), and in float32 the row offsets ca (T)
 * The per-position loops use kernels/pointwise.h's vectorisable rl_expf / rl_logf (float32);
 * float64 uses libm (gradient checks). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../ctc.h"
#include "../ctc_step.h"

#if defined(__GNUC__) && !defined(__clang__)
#define RL_CTC_VEC __attribute__((optimize("O3", "no-trapping-math")))
#else
#define RL_CTC_VEC
#endif

typedef struct {
    int64_t T, B, V, W; /* W = U_max + 2 */
    const void *logits;
    const int32_t *labels;
    int64_t sb, ss;
    const int32_t *in_len, *lab_len;
    int32_t blank;
    bool zero_inf;
    void *loss, *grad;
    size_t elem;
    char *work; /* per-thread blocks of `block` bytes after the order array */
    size_t block;
    const int64_t *order; /* sequences, longest first */
    atomic_long next;
    void (*seq)(const void *job, int64_t b, void *scratch);
} ctc_job;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t block_bytes(size_t elem, int64_t T, int64_t V, int64_t W) {
    return align64((size_t)T * sizeof(double) +
                   ((size_t)T * (size_t)(V + W) + 5 * (size_t)W + (size_t)V) * elem +
                   (size_t)W * sizeof(int32_t));
}

size_t rl_ctc_cpu_work_bytes(size_t elem, int64_t T, int64_t B, int64_t V, int64_t S, int threads) {
    if (threads < 1) threads = 1;
    return align64((size_t)B * sizeof(int64_t)) +
           (size_t)threads * block_bytes(elem, T, V, 2 * S + 3);
}

/* Zero gradient rows of sequence b for frames t0..T-1. */
static void zero_rows(const ctc_job *j, int64_t b, int64_t t0) {
    if (!j->grad) return;
    char *g = (char *)j->grad;
    for (int64_t t = t0; t < j->T; t++)
        memset(g + ((size_t)(t * j->B + b) * (size_t)j->V) * j->elem, 0, (size_t)j->V * j->elem);
}

/* The maximum of x[0..n-1] (n >= 1); NaN entries are skipped (they propagate through the
 * recurrence anyway). Sixteen running maxima, element-wise selects that GCC vectorises (a
 * plain max reduction is not vectorised without -ffinite-math-only, and fmaxf is a libm call). */
RL_CTC_VEC static float row_max(const float *x, int64_t n) {
    float mm[16];
    for (int j = 0; j < 16; j++)
        mm[j] = x[0];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            mm[j] = x[i + j] > mm[j] ? x[i + j] : mm[j];
    float m = x[0];
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int j = 0; j < 16; j++)
        m = mm[j] > m ? mm[j] : m;
    return m;
}

/* out[i] = src[idx[i]]: the emissions lp(t, ext(u)) of one frame (AVX2/AVX-512 gathers). */
RL_CTC_VEC static void gather(float *restrict out, const float *restrict src,
                              const int32_t *restrict idx, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = src[idx[i]];
}

RL_CTC_VEC static void seq_f32(const void *jv, int64_t b, void *scratch) {
    const ctc_job *j = jv;
    const int64_t T = j->in_len[b], S = j->lab_len[b], U = 2 * S + 1, W = j->W, V = j->V;
    const int64_t BV = j->B * V;
    const int32_t *lab = j->labels + b * j->sb;
    const int32_t blank = j->blank;
    float *loss = (float *)j->loss;
    double *restrict ca = scratch;
    float *restrict lp = (float *)(ca + T);
    float *restrict alpha = lp + T * V;
    float *restrict lb = alpha + T * W;
    float *restrict nb = lb + W;
    float *restrict em = nb + W;
    float *restrict skip = em + W;
    float *restrict gam = skip + W;
    int32_t *restrict ext = (int32_t *)(gam + V);
    if (T == 0) { /* then S == 0 too (checked): the empty path, probability 1 */
        loss[b] = 0.0f;
        zero_rows(j, b, 0);
        return;
    }
    const float *x0 = (const float *)j->logits + b * V;
    for (int64_t t = 0; t < T; t++) {
        const float *x = x0 + t * BV;
        float *l = lp + t * V;
        float m = row_max(x, V);
        float s = 0.0f;
        for (int64_t v = 0; v < V; v++)
            s += rl_expf(x[v] - m);
        float ls = m + rl_logf(s);
        for (int64_t v = 0; v < V; v++)
            l[v] = x[v] - ls;
    }
    for (int64_t u = 0; u < U; u++)
        ext[u] = rl_ctc_ext(lab, j->ss, u, blank);
    for (int64_t u = 0; u < W; u++)
        skip[u] = rl_ctc_skip_mask(lab, j->ss, u, U);

    float *a = alpha + 2;
    a[-2] = a[-1] = RL_CTC_NEG;
    for (int64_t u = 0; u < U; u++)
        a[u] = RL_CTC_NEG;
    /* Each row of alpha and of beta is kept relative to its maximum, the offsets summed in
     * float64 (ca, cb): float32 then holds values of order 1-100 instead of the thousands a
     * long sequence's log-probabilities reach, and the posteriors keep float32 precision. */
    a[0] = lp[blank];
    if (U > 1) a[1] = lp[ext[1]];
    ca[0] = a[0] > a[1] || U == 1 ? a[0] : a[1];
    for (int64_t u = 0; u < U; u++)
        a[u] -= (float)ca[0];
    for (int64_t t = 1; t < T; t++) {
        const float *restrict prev = alpha + (t - 1) * W + 2;
        float *restrict cur = alpha + t * W + 2;
        const float *l = lp + t * V;
        cur[-2] = cur[-1] = RL_CTC_NEG;
        gather(em, l, ext, U);
        for (int64_t u = 0; u < U; u++)
            cur[u] = rl_ctc_alpha_f32(prev[u], prev[u - 1], prev[u - 2], skip[u], em[u]);
        float m = row_max(cur, U);
        for (int64_t u = 0; u < U; u++)
            cur[u] -= m;
        ca[t] = ca[t - 1] + m;
    }
    const float *last = alpha + (T - 1) * W + 2;
    float logp_rel = rl_ctc_logp_f32(last[U - 1], last[U - 2]);
    if (logp_rel <= RL_CTC_IMPOSSIBLE) {
        loss[b] = j->zero_inf ? 0.0f : INFINITY;
        zero_rows(j, b, 0);
        return;
    }
    double logp = ca[T - 1] + logp_rel;
    loss[b] = (float)-logp;
    if (!j->grad) return;

    for (int64_t u = 0; u < W; u++)
        lb[u] = RL_CTC_NEG;
    lb[U - 1] = 0.0f;
    if (U > 1) lb[U - 2] = 0.0f;
    nb[U] = nb[U + 1] = RL_CTC_NEG;
    double cb = 0.0;
    float *g0 = (float *)j->grad + b * V;
    for (int64_t t = T - 1; t >= 0; t--) {
        const float *at = alpha + t * W + 2;
        const float *l = lp + t * V;
        const float off = (float)(logp - ca[t] - cb);
        for (int64_t u = 0; u < U; u++)
            em[u] = rl_ctc_post_f32(at[u], lb[u], off);
        for (int64_t v = 0; v < V; v++)
            gam[v] = 0.0f;
        float gb = 0.0f;
        for (int64_t u = 0; u < U; u += 2)
            gb += em[u];
        for (int64_t u = 1; u < U; u += 2)
            gam[ext[u]] += em[u];
        gam[blank] += gb;
        float *g = g0 + t * BV;
        for (int64_t v = 0; v < V; v++)
            g[v] = rl_expf(l[v]) - gam[v];
        if (t == 0) break;
        gather(nb, l, ext, U);
        for (int64_t u = 0; u < U; u++)
            nb[u] += lb[u];
        for (int64_t u = 0; u < U; u++)
            lb[u] = rl_ctc_beta_f32(nb[u], nb[u + 1], nb[u + 2], skip[u + 2]);
        float m = row_max(lb, U);
        for (int64_t u = 0; u < U; u++)
            lb[u] -= m;
        cb += m;
    }
    zero_rows(j, b, T);
}

static void seq_f64(const void *jv, int64_t b, void *scratch) {
    const ctc_job *j = jv;
    const int64_t T = j->in_len[b], S = j->lab_len[b], U = 2 * S + 1, W = j->W, V = j->V;
    const int64_t BV = j->B * V;
    const int32_t *lab = j->labels + b * j->sb;
    const int32_t blank = j->blank;
    double *loss = (double *)j->loss;
    double *restrict lp = (double *)scratch + T; /* the first T doubles are seq_f32's ca */
    double *restrict alpha = lp + T * V;
    double *restrict lb = alpha + T * W;
    double *restrict nb = lb + W;
    double *restrict em = nb + W;
    double *restrict skip = em + W;
    double *restrict gam = skip + W;
    int32_t *restrict ext = (int32_t *)(gam + V);
    if (T == 0) {
        loss[b] = 0.0;
        zero_rows(j, b, 0);
        return;
    }
    const double *x0 = (const double *)j->logits + b * V;
    for (int64_t t = 0; t < T; t++) {
        const double *x = x0 + t * BV;
        double *l = lp + t * V;
        double m = x[0];
        for (int64_t v = 1; v < V; v++)
            m = x[v] > m ? x[v] : m;
        double s = 0.0;
        for (int64_t v = 0; v < V; v++)
            s += exp(x[v] - m);
        double ls = m + log(s);
        for (int64_t v = 0; v < V; v++)
            l[v] = x[v] - ls;
    }
    for (int64_t u = 0; u < U; u++)
        ext[u] = rl_ctc_ext(lab, j->ss, u, blank);
    for (int64_t u = 0; u < W; u++)
        skip[u] = rl_ctc_skip_mask(lab, j->ss, u, U);

    double *a = alpha + 2;
    a[-2] = a[-1] = RL_CTC_NEG;
    for (int64_t u = 0; u < U; u++)
        a[u] = RL_CTC_NEG;
    a[0] = lp[blank];
    if (U > 1) a[1] = lp[ext[1]];
    for (int64_t t = 1; t < T; t++) {
        const double *prev = alpha + (t - 1) * W + 2;
        double *cur = alpha + t * W + 2;
        const double *l = lp + t * V;
        cur[-2] = cur[-1] = RL_CTC_NEG;
        for (int64_t u = 0; u < U; u++)
            cur[u] = rl_ctc_alpha_f64(prev[u], prev[u - 1], prev[u - 2], skip[u], l[ext[u]]);
    }
    const double *last = alpha + (T - 1) * W + 2;
    double logp = rl_ctc_logp_f64(last[U - 1], last[U - 2]);
    if (logp <= RL_CTC_IMPOSSIBLE) {
        loss[b] = j->zero_inf ? 0.0 : INFINITY;
        zero_rows(j, b, 0);
        return;
    }
    loss[b] = -logp;
    if (!j->grad) return;

    for (int64_t u = 0; u < W; u++)
        lb[u] = RL_CTC_NEG;
    lb[U - 1] = 0.0;
    if (U > 1) lb[U - 2] = 0.0;
    nb[U] = nb[U + 1] = RL_CTC_NEG;
    double *g0 = (double *)j->grad + b * V;
    for (int64_t t = T - 1; t >= 0; t--) {
        const double *at = alpha + t * W + 2;
        const double *l = lp + t * V;
        for (int64_t v = 0; v < V; v++)
            gam[v] = 0.0;
        for (int64_t u = 0; u < U; u++)
            gam[ext[u]] += rl_ctc_post_f64(at[u], lb[u], logp);
        double *g = g0 + t * BV;
        for (int64_t v = 0; v < V; v++)
            g[v] = exp(l[v]) - gam[v];
        if (t == 0) break;
        for (int64_t u = 0; u < U; u++)
            nb[u] = lb[u] + l[ext[u]];
        for (int64_t u = 0; u < U; u++)
            lb[u] = rl_ctc_beta_f64(nb[u], nb[u + 1], nb[u + 2], skip[u + 2]);
    }
    zero_rows(j, b, T);
}

static void *worker(void *arg) {
    ctc_job *j = ((void **)arg)[0];
    void *scratch = ((void **)arg)[1];
    for (;;) {
        long i = atomic_fetch_add(&j->next, 1);
        if (i >= j->B) break;
        j->seq(j, j->order[i], scratch);
    }
    return NULL;
}

static int by_cost_desc(const void *pa, const void *pb, void *jv) {
    const ctc_job *j = jv;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    int64_t ca = (int64_t)j->in_len[a] * (2 * j->lab_len[a] + 1);
    int64_t cb = (int64_t)j->in_len[b] * (2 * j->lab_len[b] + 1);
    if (ca != cb) return ca > cb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

static void run(ctc_job *j, int threads) {
    int64_t *order = (int64_t *)j->work;
    int64_t S_max = (j->W - 3) / 2;
    j->block = block_bytes(j->elem, j->T, j->V, j->W);
    char *blocks = j->work + align64((size_t)j->B * sizeof(int64_t));
    int64_t cells = 0;
    for (int64_t b = 0; b < j->B; b++) {
        order[b] = b;
        cells += (int64_t)j->in_len[b] * (2 * S_max + 1);
    }
    /* below ~50k cells (a few tens of microseconds) a thread costs more than it saves */
    if (threads > j->B) threads = (int)j->B;
    if (cells < 50000) threads = 1;
    if (threads > 1) qsort_r(order, (size_t)j->B, sizeof *order, by_cost_desc, j);
    j->order = order;
    atomic_store(&j->next, 0);
    pthread_t th[64];
    void *args[64][2];
    if (threads > 64) threads = 64;
    int started = 0;
    for (int i = 1; i < threads; i++) {
        args[i][0] = j;
        args[i][1] = blocks + (size_t)i * j->block;
        if (pthread_create(&th[i], NULL, worker, args[i]) != 0) break;
        started = i;
    }
    args[0][0] = j;
    args[0][1] = blocks;
    worker(args[0]);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
}

static void setup(ctc_job *j, int64_t T, int64_t B, int64_t V, const int32_t *labels, int64_t sb,
                  int64_t ss, const int32_t *input_len, const int32_t *label_len, int32_t blank,
                  bool zero_infinity, void *work) {
    int64_t S_max = 0;
    for (int64_t b = 0; b < B; b++)
        S_max = label_len[b] > S_max ? label_len[b] : S_max;
    *j = (ctc_job){.T = T,
                   .B = B,
                   .V = V,
                   .W = 2 * S_max + 3,
                   .labels = labels,
                   .sb = sb,
                   .ss = ss,
                   .in_len = input_len,
                   .lab_len = label_len,
                   .blank = blank,
                   .zero_inf = zero_infinity,
                   .work = work};
}

void rl_ctc_cpu_f32(int64_t T, int64_t B, int64_t V, const float *logits, const int32_t *labels,
                    int64_t lab_stride_b, int64_t lab_stride_s, const int32_t *input_len,
                    const int32_t *label_len, int32_t blank, bool zero_infinity, float *loss,
                    float *grad, void *work, int threads) {
    ctc_job j;
    setup(&j, T, B, V, labels, lab_stride_b, lab_stride_s, input_len, label_len, blank,
          zero_infinity, work);
    j.logits = logits;
    j.loss = loss;
    j.grad = grad;
    j.elem = sizeof(float);
    j.seq = seq_f32;
    run(&j, threads);
}

void rl_ctc_cpu_f64(int64_t T, int64_t B, int64_t V, const double *logits, const int32_t *labels,
                    int64_t lab_stride_b, int64_t lab_stride_s, const int32_t *input_len,
                    const int32_t *label_len, int32_t blank, bool zero_infinity, double *loss,
                    double *grad, void *work, int threads) {
    ctc_job j;
    setup(&j, T, B, V, labels, lab_stride_b, lab_stride_s, input_len, label_len, blank,
          zero_infinity, work);
    j.logits = logits;
    j.loss = loss;
    j.grad = grad;
    j.elem = sizeof(double);
    j.seq = seq_f64;
    run(&j, threads);
}
