/* LSTM parity on a GPU: rnnlua's own CUDA kernels and the cuDNN path against the CPU lstm layer
 * (layers/lstm.c, built with rl_layer_create) on the same random weights and inputs: T=7, B=3
 * with ragged lengths {7, 4, 1}, H=5, F=4, both directions, with and without peepholes (own
 * kernels only; cuDNN has none). Compared: the output, each sequence's final state, the input
 * gradient, every parameter gradient and the initial state's gradients; float32 to 1e-5 of each
 * tensor's largest magnitude (cuDNN 3e-5: its own activation functions), float64 to 1e-10.
 * The own kernels run three ways: the whole-recurrence calls of both directions queued at once on
 * two streams, and the per-step calls (with their fused bias and peephole sums) on the default
 * stream. The cuDNN weight conversion must round-trip exactly. Then the lstm LAYER itself
 * (rl_layer_create on CUDA tensors, impl = "own" and "cudnn") against the CPU layer: both
 * directions queued at once, two inputs (one a strided view), a given initial state, peepholes
 * (own), every gradient, two runs; and mixed CPU/CUDA arguments as errors naming the layer.
 * Without a CUDA device (or build) the "device" side is the CPU itself, so a broken test shows
 * there too: the per-step harness runs with the CPU step kernels of kernels/lstm.h in place of
 * the CUDA ones, and the layer harness with impl = "own" runs whole (both directions, two inputs,
 * initial state, peepholes, final state, every gradient, two runs); the whole-recurrence calls on
 * streams, the bias and peephole sums over many row chunks (rl_lstm_cuda_param_grads), the
 * cuDNN cases and the mixed-device checks need a GPU and are skipped. The line
 * printed says which side ran. Run by `make test-gpu`. */
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/lstm.h"
#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "layers/matrix.h"
#include "tests/c/check.h"
#include "tests/c/gradcheck.h"
#include "tests/gpu/device_side.h"

#ifdef RL_WITH_CUDA
#include "kernels/cuda/context.h"
#include "kernels/cuda/cudnn_rnn.h"
#include "kernels/cuda/lstm_cuda.h"
#endif

enum { T = 7, B = 3, H = 5, F = 4 };
static const int32_t LENS[B] = {7, 4, 1};
/* the side compared with the CPU layer: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

/* ---- inputs ---- */

static rl_tensor zeros_dev(rl_dtype dt, int ndim, const int64_t *shape) {
    rl_tensor g = {0};
    CHECK_OK(rl_tensor_empty(&g, dt, DEV, ndim, shape));
    if (g.storage) CHECK_OK(rl_op_fill(&g, 0.0));
    return g;
}

/* byte offset i elements into a tensor's data */
static void *el(const rl_tensor *t, int64_t i) {
    return (char *)rl_tensor_data(t) + (size_t)i * rl_dtype_size(t->dtype);
}

/* ---- the CPU reference ---- */

/* The options of an lstm layer (impl NULL: the default) in t. */
static rl_options lstm_options(gc_opts *t, int dir, bool peep, const char *impl) {
    gc_opt_num(t, "n_out", H);
    gc_opt_num(t, "direction", dir);
    gc_opt_bool(t, "peepholes", peep);
    if (impl) gc_opt_str(t, "impl", impl);
    return gc_options(t);
}

typedef struct {
    int dir;
    bool peep;
    rl_dtype dt;
    rl_layer *l;
    rl_tensor x, len, gout, gx; /* CPU inputs and the input gradient */
    rl_tensor hT, cT, dh0, dc0; /* views of the layer's final state and initial-state grads */
} ref;

/* Builds the CPU layer with random parameters and inputs, runs forward and backward. */
static bool ref_run(ref *r, int dir, bool peep, rl_dtype dt) {
    memset(r, 0, sizeof *r);
    r->dir = dir;
    r->peep = peep;
    r->dt = dt;
    gc_opts t = {0};
    rl_options o = lstm_options(&t, dir, peep, NULL);
    int64_t in_dims[1] = {F};
    CHECK_OK(rl_layer_create(&r->l, "lstm", peep ? "lstm_peep" : "lstm", &o, 1, in_dims));
    if (!r->l) return false;
    for (int i = 0; i < r->l->n_params; i++) {
        rl_param *p = &r->l->params[i];
        p->value = rand_tensor(dt, p->ndim, p->shape, -0.6, 0.6, NULL, 0.0);
        CHECK_OK(rl_tensor_empty(&p->grad, dt, RL_DEVICE_CPU, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
    }
    int64_t xs[3] = {T, B, F}, os[3] = {T, B, H}, bs[1] = {B};
    r->x = rand_tensor(dt, 3, xs, -1.0, 1.0, NULL, 0.0);
    r->gout = rand_tensor(dt, 3, os, -1.0, 1.0, LENS, 0.0);
    CHECK_OK(rl_tensor_empty(&r->gx, dt, RL_DEVICE_CPU, 3, xs));
    CHECK_OK(rl_tensor_empty(&r->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    if (!r->len.storage || !r->gx.storage) return false;
    memcpy(rl_tensor_data(&r->len), LENS, sizeof LENS);
    rl_layer_io io = {0};
    io.n_in = 1;
    io.in[0] = &r->x;
    io.lengths = &r->len;
    io.train = true;
    rl_tensor *gin[1] = {&r->gx};
    rl_status st = r->l->ops->forward(r->l, &io);
    CHECK_OK(st);
    if (st == RL_OK) CHECK_OK(st = rl_lstm_final_state(r->l, &r->hT, &r->cT));
    if (st == RL_OK) CHECK_OK(st = r->l->ops->backward(r->l, &io, &r->gout, gin));
    if (st == RL_OK) CHECK_OK(st = rl_lstm_initial_state_grad(r->l, &r->dh0, &r->dc0));
    return st == RL_OK;
}

static void ref_free(ref *r) {
    rl_tensor *ts[] = {&r->x, &r->len, &r->gout, &r->gx, &r->hT, &r->cT, &r->dh0, &r->dc0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    if (r->l) rl_layer_free(r->l); /* with the params' values and gradients */
}

static const rl_tensor *param(const ref *r, int i) { return &r->l->params[i].value; }
static const rl_tensor *grad(const ref *r, int i) { return &r->l->params[i].grad; }

/* ---- own kernels ---- */

/* The device buffers of one run, laid out as layers/lstm.c lays out its own. */
typedef struct {
    rl_tensor W, U, b, p[3], x, len, gout;
    rl_tensor gates, hs, cs, out, dh, dc, dW, dU, db, dp[3], dx;
    rl_tensor red; /* CUDA: the bias sums' scratch of rl_lstm_cuda_backward */
    const void *peep[3];
    void *dpeep[3];
} dev_run;

static void dev_setup(dev_run *d, const ref *r) {
    memset(d, 0, sizeof *d);
    rl_dtype dt = r->dt;
    d->W = copy_to(param(r, 0), DEV);
    d->U = copy_to(param(r, 1), DEV);
    d->b = copy_to(param(r, 2), DEV);
    d->x = copy_to(&r->x, DEV);
    d->len = copy_to(&r->len, DEV);
    d->gout = copy_to(&r->gout, DEV);
    int64_t gs[3] = {T, B, 4 * H}, ss[3] = {T + 1, B, H}, os[3] = {T, B, H}, xs[3] = {T, B, F};
    int64_t bh[2] = {B, H}, ws[2] = {F, 4 * H}, us[2] = {H, 4 * H}, b4[1] = {4 * H}, h1[1] = {H};
    d->gates = zeros_dev(dt, 3, gs);
    d->hs = zeros_dev(dt, 3, ss); /* the initial state row: zeros */
    d->cs = zeros_dev(dt, 3, ss);
    d->out = zeros_dev(dt, 3, os);
    d->dx = zeros_dev(dt, 3, xs);
    d->dh = zeros_dev(dt, 2, bh);
    d->dc = zeros_dev(dt, 2, bh);
    d->dW = zeros_dev(dt, 2, ws);
    d->dU = zeros_dev(dt, 2, us);
    d->db = zeros_dev(dt, 1, b4);
#ifdef RL_WITH_CUDA
    int64_t rs[1] = {RL_LSTM_CUDA_CHUNKS * 7 * H};
    d->red = zeros_dev(dt, 1, rs);
#endif
    for (int k = 0; k < 3 && r->peep; k++) {
        d->p[k] = copy_to(param(r, 3 + k), DEV);
        d->dp[k] = zeros_dev(dt, 1, h1);
        d->peep[k] = rl_tensor_data(&d->p[k]);
        d->dpeep[k] = rl_tensor_data(&d->dp[k]);
    }
}

static void dev_free(dev_run *d) {
    rl_tensor *ts[] = {&d->W,     &d->U,     &d->b,     &d->x,     &d->len,  &d->gout,
                       &d->gates, &d->hs,    &d->cs,    &d->out,   &d->dh,   &d->dc,
                       &d->dW,    &d->dU,    &d->db,    &d->dx,    &d->p[0], &d->p[1],
                       &d->p[2],  &d->dp[0], &d->dp[1], &d->dp[2], &d->red};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void *D(const rl_tensor *t) { return rl_tensor_data(t); }

/* The device side's GEMM (row-major c = op(a) op(b) + beta c) and step kernels: CUDA's on a GPU,
 * the CPU's (BLAS, kernels/lstm.h) when the CPU is the device side. */
static rl_status gemm_on(void *s, rl_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                         void *c, int64_t ldc) {
#ifdef RL_WITH_CUDA
    if (DEV.type == RL_CUDA)
        return rl_cuda_gemm(s, dt, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
#endif
    (void)s;
    return rl_mat_gemm(RL_DEVICE_CPU, NULL, dt, ta, tb, m, n, k, (rl_mat){(void *)a, lda},
                       (rl_mat){(void *)b, ldb}, beta, (rl_mat){c, ldc});
}

static rl_status fwd_step(rl_dtype dt, int64_t t, const int32_t *len, void *z, const void *bias,
                          const void *const *peep, const void *cp, const void *hp, void *c, void *h,
                          void *out) {
#ifdef RL_WITH_CUDA
    if (DEV.type == RL_CUDA && dt == RL_FLOAT32)
        return rl_lstm_cuda_fwd_f32(NULL, B, H, t, len, z, bias, (const float *const *)peep, cp, hp,
                                    c, h, out);
    if (DEV.type == RL_CUDA)
        return rl_lstm_cuda_fwd_f64(NULL, B, H, t, len, z, bias, (const double *const *)peep, cp,
                                    hp, c, h, out);
#endif
    if (dt == RL_FLOAT32)
        rl_lstm_cpu_fwd_f32(B, H, t, len, z, bias, (const float *const *)peep, cp, hp, c, h, out,
                            NULL);
    else
        rl_lstm_cpu_fwd_f64(B, H, t, len, z, bias, (const double *const *)peep, cp, hp, c, h, out,
                            NULL);
    return RL_OK;
}

static rl_status bwd_step(rl_dtype dt, int64_t t, const int32_t *len, void *z,
                          const void *const *peep, const void *cp, const void *c, const void *dout,
                          void *dh, void *dc, void *db, void *const *dpeep) {
#ifdef RL_WITH_CUDA
    if (DEV.type == RL_CUDA && dt == RL_FLOAT32)
        return rl_lstm_cuda_bwd_f32(NULL, B, H, t, len, z, (const float *const *)peep, cp, c, dout,
                                    H, dh, dc, db, (float *const *)dpeep);
    if (DEV.type == RL_CUDA)
        return rl_lstm_cuda_bwd_f64(NULL, B, H, t, len, z, (const double *const *)peep, cp, c, dout,
                                    H, dh, dc, db, (double *const *)dpeep);
#endif
    /* the CPU step leaves the bias and peephole sums to rl_lstm_cpu_param_grads: over this
     * step's B rows they are what the CUDA step adds */
    if (dt == RL_FLOAT32) {
        rl_lstm_cpu_bwd_f32(B, H, t, len, z, (const float *const *)peep, cp, c, dout, H, dh, dc,
                            NULL);
        if (db) rl_lstm_cpu_param_grads_f32(B, H, z, cp, c, db, (float *const *)dpeep);
    } else {
        rl_lstm_cpu_bwd_f64(B, H, t, len, z, (const double *const *)peep, cp, c, dout, H, dh, dc,
                            NULL);
        if (db) rl_lstm_cpu_param_grads_f64(B, H, z, cp, c, db, (double *const *)dpeep);
    }
    return RL_OK;
}

/* gates = x W (what the layer does before the recurrence) */
static rl_status input_projection(void *s, const dev_run *d, rl_dtype dt) {
    return gemm_on(s, dt, false, false, T * B, 4 * H, F, D(&d->x), F, D(&d->W), 4 * H, 0.0,
                   D(&d->gates), 4 * H);
}

/* dW += X^T dZ, dx = dZ W^T (what the layer does after the recurrence) */
static rl_status input_grads(void *s, const dev_run *d, rl_dtype dt) {
    RL_TRY(gemm_on(s, dt, true, false, F, 4 * H, T * B, D(&d->x), F, D(&d->gates), 4 * H, 1.0,
                   D(&d->dW), 4 * H));
    return gemm_on(s, dt, false, true, T * B, F, 4 * H, D(&d->gates), 4 * H, D(&d->W), 4 * H, 0.0,
                   D(&d->dx), F);
}

#ifdef RL_WITH_CUDA
static rl_status loop_forward(void *s, const dev_run *d, const ref *r) {
    RL_TRY(input_projection(s, d, r->dt));
    return rl_lstm_cuda_forward(s, r->dt, T, B, H, r->dir, D(&d->len), D(&d->gates), D(&d->U),
                                D(&d->b), r->peep ? d->peep : NULL, D(&d->hs), D(&d->cs),
                                D(&d->out), NULL, NULL, NULL);
}

static rl_status loop_backward(void *s, const dev_run *d, const ref *r) {
    RL_TRY(rl_lstm_cuda_backward(
        s, r->dt, T, B, H, r->dir, D(&d->len), D(&d->gates), D(&d->U), r->peep ? d->peep : NULL,
        D(&d->hs), D(&d->cs), D(&d->gout), H, D(&d->dh), D(&d->dc), D(&d->dU), D(&d->db),
        r->peep ? (void *const *)d->dpeep : NULL, D(&d->red), NULL, NULL, NULL));
    return input_grads(s, d, r->dt);
}
#endif

/* The per-step API on the default stream, in the order of layers/lstm.c's loops, with the bias
 * and peephole sums done per step by the backward kernel. */
static rl_status steps(const dev_run *d, const ref *r) {
    rl_dtype dt = r->dt;
    int64_t BH = B * H;
    const int32_t *len = D(&d->len);
    const void *const *peep = r->peep ? d->peep : NULL;
    RL_TRY(input_projection(NULL, d, dt));
    for (int64_t s = 0; s < T; s++) {
        int64_t t = r->dir > 0 ? s : T - 1 - s;
        int64_t prev = r->dir > 0 ? t : t + 1, cur = r->dir > 0 ? t + 1 : t;
        void *zt = el(&d->gates, t * B * 4 * H);
        RL_TRY(gemm_on(NULL, dt, false, false, B, 4 * H, H, el(&d->hs, prev * BH), H, D(&d->U),
                       4 * H, 1.0, zt, 4 * H));
        RL_TRY(fwd_step(dt, t, len, zt, D(&d->b), peep, el(&d->cs, prev * BH),
                        el(&d->hs, prev * BH), el(&d->cs, cur * BH), el(&d->hs, cur * BH),
                        el(&d->out, t * BH)));
    }
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = r->dir > 0 ? s : T - 1 - s;
        int64_t prev = r->dir > 0 ? t : t + 1, cur = r->dir > 0 ? t + 1 : t;
        void *zt = el(&d->gates, t * B * 4 * H);
        RL_TRY(bwd_step(dt, t, len, zt, peep, el(&d->cs, prev * BH), el(&d->cs, cur * BH),
                        el(&d->gout, t * BH), D(&d->dh), D(&d->dc), D(&d->db),
                        r->peep ? d->dpeep : NULL));
        RL_TRY(gemm_on(NULL, dt, false, true, B, H, 4 * H, zt, 4 * H, D(&d->U), 4 * H, 1.0,
                       D(&d->dh), H));
    }
    RL_TRY(gemm_on(NULL, dt, true, false, H, 4 * H, T * B, el(&d->hs, r->dir > 0 ? 0 : BH), H,
                   D(&d->gates), 4 * H, 1.0, D(&d->dU), 4 * H));
    return input_grads(NULL, d, dt);
}

static void dev_compare(const char *tag, const dev_run *d, const ref *r, double rtol) {
    rl_tensor hT = {0}, cT = {0};
    int64_t last = r->dir > 0 ? T : 0;
    CHECK_OK(rl_tensor_select(&hT, &d->hs, 0, last));
    CHECK_OK(rl_tensor_select(&cT, &d->cs, 0, last));
    compare(tag, "out", &r->l->out, &d->out, rtol);
    compare(tag, "final h", &r->hT, &hT, rtol);
    compare(tag, "final c", &r->cT, &cT, rtol);
    compare(tag, "dx", &r->gx, &d->dx, rtol);
    compare(tag, "dW", grad(r, 0), &d->dW, rtol);
    compare(tag, "dU", grad(r, 1), &d->dU, rtol);
    compare(tag, "db", grad(r, 2), &d->db, rtol);
    for (int k = 0; k < 3 && r->peep; k++)
        compare(tag, r->l->params[3 + k].name, grad(r, 3 + k), &d->dp[k], rtol);
    compare(tag, "dh0", &r->dh0, &d->dh, rtol);
    compare(tag, "dc0", &r->dc0, &d->dc, rtol);
    rl_tensor_release(&hT);
    rl_tensor_release(&cT);
}

/* Both directions queued at once on two streams, then compared (a GPU only); then the per-step
 * API. */
static void test_own(rl_dtype dt, bool peep, double rtol) {
    ref r[2];
    dev_run d[2];
    bool ok = ref_run(&r[0], 1, peep, dt) & ref_run(&r[1], -1, peep, dt);
    char tag[2][64];
#ifdef RL_WITH_CUDA
    void *s[2] = {NULL, NULL};
    for (int k = 0; k < 2 && ok && DEV.type == RL_CUDA; k++) {
        snprintf(tag[k], sizeof tag[k], "own %s dir %d%s (streams)", rl_dtype_name(dt), r[k].dir,
                 peep ? " peep" : "");
        CHECK_OK(rl_cuda_stream_create(0, &s[k]));
    }
    if (ok && DEV.type == RL_CUDA) {
        for (int k = 0; k < 2; k++)
            dev_setup(&d[k], &r[k]);
        for (int k = 0; k < 2; k++)
            CHECK_OK(loop_forward(s[k], &d[k], &r[k]));
        for (int k = 0; k < 2; k++)
            CHECK_OK(loop_backward(s[k], &d[k], &r[k]));
        for (int k = 0; k < 2; k++) {
            CHECK_OK(rl_cuda_stream_sync(s[k]));
            dev_compare(tag[k], &d[k], &r[k], rtol);
            dev_free(&d[k]);
        }
    }
    for (int k = 0; k < 2; k++)
        rl_cuda_stream_destroy(s[k]);
#endif
    for (int k = 0; k < 2 && ok; k++) {
        snprintf(tag[k], sizeof tag[k], "own %s dir %d%s (steps)", rl_dtype_name(dt), r[k].dir,
                 peep ? " peep" : "");
        dev_setup(&d[k], &r[k]);
        CHECK_OK(steps(&d[k], &r[k]));
        CHECK_OK(rl_op_synchronize(DEV));
        dev_compare(tag[k], &d[k], &r[k], rtol);
        dev_free(&d[k]);
    }
    for (int k = 0; k < 2; k++)
        ref_free(&r[k]);
}

/* ---- cuDNN ---- */

#ifdef RL_WITH_CUDA

static void test_cudnn(rl_dtype dt, int dir, double rtol) {
    ref r;
    char tag[64];
    snprintf(tag, sizeof tag, "cudnn %s dir %d", rl_dtype_name(dt), dir);
    if (!ref_run(&r, dir, false, dt)) {
        ref_free(&r);
        return;
    }
    rl_cudnn_rnn *c = NULL;
    void *s = NULL;
    CHECK_OK(rl_cudnn_rnn_create(&c, RL_CUDNN_LSTM, 0, dt, F, H, dir));
    /* the backward direction also runs on a stream of its own */
    if (dir < 0) CHECK_OK(rl_cuda_stream_create(0, &s));
    if (c && s) CHECK_OK(rl_cudnn_rnn_set_stream(c, s));
    if (c) {
        int64_t ws[2] = {F, 4 * H}, us[2] = {H, 4 * H}, b4[1] = {4 * H}, os[3] = {T, B, H};
        int64_t xs[3] = {T, B, F}, bh[2] = {B, H};
        rl_tensor W = copy_to(param(&r, 0), DEV), U = copy_to(param(&r, 1), DEV),
                  b = copy_to(param(&r, 2), DEV);
        rl_tensor x = copy_to(&r.x, DEV), len = copy_to(&r.len, DEV), gout = copy_to(&r.gout, DEV);
        rl_tensor W2 = zeros_dev(dt, 2, ws), U2 = zeros_dev(dt, 2, us), b2 = zeros_dev(dt, 1, b4);
        rl_tensor dW = zeros_dev(dt, 2, ws), dU = zeros_dev(dt, 2, us), db = zeros_dev(dt, 1, b4);
        rl_tensor y = zeros_dev(dt, 3, os), dx = zeros_dev(dt, 3, xs);
        rl_tensor hT = zeros_dev(dt, 2, bh), cT = zeros_dev(dt, 2, bh);
        rl_tensor dh0 = zeros_dev(dt, 2, bh), dc0 = zeros_dev(dt, 2, bh);
        CHECK_OK(rl_cudnn_rnn_pack_weights(c, D(&W), D(&U), D(&b), NULL));
        CHECK_OK(rl_cudnn_rnn_unpack_weights(c, D(&W2), D(&U2), D(&b2), NULL));
        CHECK_OK(rl_cudnn_rnn_forward(c, true, T, B, LENS, D(&len), D(&x), D(&y), NULL, NULL,
                                      D(&hT), D(&cT)));
        CHECK_OK(rl_cudnn_rnn_backward(c, D(&gout), D(&dx), D(&dh0), D(&dc0)));
        CHECK_OK(rl_cudnn_rnn_unpack_grads(c, D(&dW), D(&dU), D(&db), NULL));
        CHECK_OK(s ? rl_cuda_stream_sync(s) : rl_op_synchronize(DEV));
        compare(tag, "W round trip", param(&r, 0), &W2, 0.0);
        compare(tag, "U round trip", param(&r, 1), &U2, 0.0);
        compare(tag, "b round trip", param(&r, 2), &b2, 0.0);
        compare(tag, "out", &r.l->out, &y, rtol);
        compare(tag, "final h", &r.hT, &hT, rtol);
        compare(tag, "final c", &r.cT, &cT, rtol);
        compare(tag, "dx", &r.gx, &dx, rtol);
        compare(tag, "dW", grad(&r, 0), &dW, rtol);
        compare(tag, "dU", grad(&r, 1), &dU, rtol);
        compare(tag, "db", grad(&r, 2), &db, rtol);
        compare(tag, "dh0", &r.dh0, &dh0, rtol);
        compare(tag, "dc0", &r.dc0, &dc0, rtol);
        rl_tensor *ts[] = {&W,  &U,  &b,  &x, &len, &gout, &W2, &U2,  &b2,
                           &dW, &dU, &db, &y, &dx,  &hT,   &cT, &dh0, &dc0};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            rl_tensor_release(ts[i]);
    }
    rl_cudnn_rnn_free(c);
    rl_cuda_stream_destroy(s);
    ref_free(&r);
}

/* A backward without a forward and a bad length are errors, not crashes. */
static void test_cudnn_misuse(void) {
    rl_cudnn_rnn *c = NULL;
    CHECK_OK(rl_cudnn_rnn_create(&c, RL_CUDNN_LSTM, 0, RL_FLOAT32, F, H, 1));
    if (!c) return;
    CHECK(rl_cudnn_rnn_backward(c, NULL, NULL, NULL, NULL) == RL_EARG);
    int32_t bad[B] = {7, 0, 9};
    int64_t os[3] = {T, B, H}, xs[3] = {T, B, F};
    rl_tensor x = zeros_dev(RL_FLOAT32, 3, xs), y = zeros_dev(RL_FLOAT32, 3, os);
    CHECK(rl_cudnn_rnn_forward(c, true, T, B, bad, bad, D(&x), D(&y), NULL, NULL, NULL, NULL) ==
          RL_EARG);
    CHECK(strstr(rl_errmsg(), "rl_cudnn_rnn_forward") != NULL);
    rl_tensor_release(&x);
    rl_tensor_release(&y);
    rl_cudnn_rnn_free(c);
}

#endif

/* ---- the layer itself on CUDA tensors ---- */

enum { F1 = 3, F2 = 2, F2W = 4 }; /* input 2 is columns 1..2 of a (T, B, 4) tensor */

/* One direction: the CPU reference layer and the same layer class on cuda:0. */
typedef struct {
    rl_layer *cpu, *gpu;
    rl_tensor x1, x2w, x2, len, h0, c0, gout, gx1, gx2;           /* CPU */
    rl_tensor dx1, dx2w, dx2, dh0, dc0, dgout, dgx1, dgx2w, dgx2; /* device */
} layer_case;

static rl_layer *make_lstm(int dir, bool peep, const char *impl, const char *name) {
    gc_opts t = {0};
    rl_options o = lstm_options(&t, dir, peep, impl);
    int64_t in_dims[2] = {F1, F2};
    rl_layer *l = NULL;
    CHECK_OK(rl_layer_create(&l, "lstm", name, &o, 2, in_dims));
    return l;
}

static void narrow_cols(rl_tensor *out, const rl_tensor *wide) {
    CHECK_OK(rl_tensor_narrow(out, wide, 2, 1, F2));
}

/* The CPU run (forward, final state, backward with both input gradients) and the device copies
 * of everything; the device layer gets the CPU layer's parameter values. */
static bool case_setup(layer_case *c, rl_dtype dt, int dir, bool peep, const char *impl) {
    memset(c, 0, sizeof *c);
    c->cpu = make_lstm(dir, peep, NULL, "ref");
    c->gpu = make_lstm(dir, peep, impl, "dev");
    if (!c->cpu || !c->gpu) return false;
    for (int i = 0; i < c->cpu->n_params; i++) {
        rl_param *p = &c->cpu->params[i], *q = &c->gpu->params[i];
        p->value = rand_tensor(dt, p->ndim, p->shape, -0.6, 0.6, NULL, 0.0);
        CHECK_OK(rl_tensor_empty(&p->grad, dt, RL_DEVICE_CPU, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
        q->value = copy_to(&p->value, DEV);
        q->grad = zeros_dev(dt, q->ndim, q->shape);
    }
    int64_t x1s[3] = {T, B, F1}, x2ws[3] = {T, B, F2W}, os[3] = {T, B, H}, bs[1] = {B};
    int64_t bh[2] = {B, H};
    c->x1 = rand_tensor(dt, 3, x1s, -1.0, 1.0, NULL, 0.0);
    c->x2w = rand_tensor(dt, 3, x2ws, -1.0, 1.0, NULL, 0.0);
    narrow_cols(&c->x2, &c->x2w);
    c->h0 = rand_tensor(dt, 2, bh, -0.5, 0.5, NULL, 0.0);
    c->c0 = rand_tensor(dt, 2, bh, -0.5, 0.5, NULL, 0.0);
    c->gout = rand_tensor(dt, 3, os, -1.0, 1.0, LENS, 0.0);
    CHECK_OK(rl_tensor_empty(&c->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    if (!c->len.storage) return false;
    memcpy(rl_tensor_data(&c->len), LENS, sizeof LENS);
    CHECK_OK(rl_tensor_empty(&c->gx1, dt, RL_DEVICE_CPU, 3, x1s));
    int64_t x2s[3] = {T, B, F2};
    CHECK_OK(rl_tensor_empty(&c->gx2, dt, RL_DEVICE_CPU, 3, x2s));
    CHECK_OK(rl_lstm_set_initial_state(c->cpu, &c->h0, &c->c0));
    rl_layer_io io = {0};
    io.n_in = 2;
    io.in[0] = &c->x1;
    io.in[1] = &c->x2;
    io.lengths = &c->len;
    io.train = true;
    rl_tensor *gin[2] = {&c->gx1, &c->gx2};
    rl_status st = c->cpu->ops->forward(c->cpu, &io);
    CHECK_OK(st);
    if (st == RL_OK) CHECK_OK(st = c->cpu->ops->backward(c->cpu, &io, &c->gout, gin));
    if (st != RL_OK) return false;

    c->dx1 = copy_to(&c->x1, DEV);
    c->dx2w = copy_to(&c->x2w, DEV);
    narrow_cols(&c->dx2, &c->dx2w);
    c->dh0 = copy_to(&c->h0, DEV);
    c->dc0 = copy_to(&c->c0, DEV);
    c->dgout = copy_to(&c->gout, DEV);
    c->dgx1 = zeros_dev(dt, 3, x1s);
    c->dgx2w = zeros_dev(dt, 3, x2ws);
    narrow_cols(&c->dgx2, &c->dgx2w);
    CHECK_OK(rl_lstm_set_initial_state(c->gpu, &c->dh0, &c->dc0));
    return true;
}

static void case_free(layer_case *c) {
    rl_tensor *ts[] = {&c->x1,   &c->x2w, &c->x2,    &c->len,  &c->h0,    &c->c0,
                       &c->gout, &c->gx1, &c->gx2,   &c->dx1,  &c->dx2w,  &c->dx2,
                       &c->dh0,  &c->dc0, &c->dgout, &c->dgx1, &c->dgx2w, &c->dgx2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    rl_layer_free(c->cpu);
    rl_layer_free(c->gpu);
}

static rl_layer_io case_io(layer_case *c) {
    rl_layer_io io = {0};
    io.n_in = 2;
    io.in[0] = &c->dx1;
    io.in[1] = &c->dx2;
    io.lengths = &c->len;
    io.train = true;
    return io;
}

static void case_compare(const char *tag, layer_case *c, double rtol) {
    rl_tensor hw = {0}, cw = {0}, hg = {0}, cg = {0}, dhw = {0}, dcw = {0}, dhg = {0}, dcg = {0};
    CHECK_OK(rl_lstm_final_state(c->cpu, &hw, &cw));
    CHECK_OK(rl_lstm_final_state(c->gpu, &hg, &cg));
    CHECK_OK(rl_lstm_initial_state_grad(c->cpu, &dhw, &dcw));
    CHECK_OK(rl_lstm_initial_state_grad(c->gpu, &dhg, &dcg));
    compare(tag, "out", &c->cpu->out, &c->gpu->out, rtol);
    compare(tag, "final h", &hw, &hg, rtol);
    compare(tag, "final c", &cw, &cg, rtol);
    compare(tag, "dx1", &c->gx1, &c->dgx1, rtol);
    compare(tag, "dx2 (strided)", &c->gx2, &c->dgx2, rtol);
    for (int i = 0; i < c->cpu->n_params; i++)
        compare(tag, c->cpu->params[i].name, &c->cpu->params[i].grad, &c->gpu->params[i].grad,
                rtol);
    compare(tag, "dh0", &dhw, &dhg, rtol);
    compare(tag, "dc0", &dcw, &dcg, rtol);
    /* the columns of the strided input's gradient outside its view stay untouched (0) */
    rl_tensor col0 = {0};
    CHECK_OK(rl_tensor_narrow(&col0, &c->dgx2w, 2, 0, 1));
    rl_tensor zero = {0};
    int64_t zs[3] = {T, B, 1};
    CHECK_OK(rl_tensor_empty(&zero, c->cpu->out.dtype, RL_DEVICE_CPU, 3, zs));
    CHECK_OK(rl_op_fill(&zero, 0.0));
    compare(tag, "dx2 outside its view", &zero, &col0, 0.0);
    rl_tensor *ts[] = {&hw, &cw, &hg, &cg, &dhw, &dcw, &dhg, &dcg, &col0, &zero};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

/* Both directions of a bidirectional pair as lstm layers on cuda:0 against the CPU layer: two
 * inputs (one a strided view), ragged lengths, a given initial state, forward and every gradient.
 * The two layers' calls are queued back to back (forward, forward, backward, backward) so their
 * streams overlap; the batch runs twice (gradients zeroed between) to cover buffer reuse and the
 * cuDNN weight repacking. */
static void test_layer(rl_dtype dt, bool peep, const char *impl, double rtol) {
    layer_case c[2];
    bool ok = case_setup(&c[0], dt, 1, peep, impl) & case_setup(&c[1], dt, -1, peep, impl);
    for (int rep = 0; rep < 2 && ok; rep++) {
        rl_layer_io io[2] = {case_io(&c[0]), case_io(&c[1])};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < c[k].gpu->n_params; i++)
                CHECK_OK(rl_op_fill(&c[k].gpu->params[i].grad, 0.0));
        for (int k = 0; k < 2; k++)
            CHECK_OK(c[k].gpu->ops->forward(c[k].gpu, &io[k]));
        for (int k = 0; k < 2; k++) {
            rl_tensor *gin[2] = {&c[k].dgx1, &c[k].dgx2};
            CHECK_OK(c[k].gpu->ops->backward(c[k].gpu, &io[k], &c[k].dgout, gin));
        }
        CHECK_OK(rl_op_synchronize(DEV));
        for (int k = 0; k < 2; k++) {
            char tag[96];
            snprintf(tag, sizeof tag, "layer impl=%s %s dir %d%s (run %d)", impl, rl_dtype_name(dt),
                     k ? -1 : 1, peep ? " peep" : "", rep + 1);
            case_compare(tag, &c[k], rtol);
        }
    }
    for (int k = 0; k < 2; k++)
        case_free(&c[k]);
}

/* Mixed devices are errors naming the layer, before any buffer is touched. */
static void test_layer_devices(void) {
    layer_case c;
    if (case_setup(&c, RL_FLOAT32, 1, false, "own")) {
        rl_layer_io io = case_io(&c);
        io.in[0] = &c.x1; /* a CPU input beside a CUDA one */
        CHECK(c.gpu->ops->forward(c.gpu, &io) != RL_OK);
        CHECK(strstr(rl_errmsg(), "'dev'") != NULL);
        /* CUDA inputs with the CPU layer's CPU params */
        io = case_io(&c);
        CHECK(c.cpu->ops->forward(c.cpu, &io) != RL_OK);
        CHECK(strstr(rl_errmsg(), "'ref'") && strstr(rl_errmsg(), "parameter"));
        /* a CPU initial state with CUDA inputs */
        CHECK_OK(rl_lstm_set_initial_state(c.gpu, &c.h0, NULL));
        CHECK(c.gpu->ops->forward(c.gpu, &io) == RL_EDEVICE);
        CHECK(strstr(rl_errmsg(), "'dev'") && strstr(rl_errmsg(), "initial"));
        CHECK_OK(rl_lstm_set_initial_state(c.gpu, NULL, NULL));
        CHECK_OK(c.gpu->ops->forward(c.gpu, &io));
        /* a CPU grad_out for a CUDA forward */
        CHECK(c.gpu->ops->backward(c.gpu, &io, &c.gout, NULL) != RL_OK);
        CHECK(strstr(rl_errmsg(), "'dev'") && strstr(rl_errmsg(), "grad_out"));
        CHECK_OK(rl_op_synchronize(DEV));
    }
    case_free(&c);
}

#ifdef RL_WITH_CUDA
/* The bias and peephole sums over more frames than RL_LSTM_CUDA_CHUNKS (several rows per chunk,
 * a last chunk with fewer) and more columns than one block (H = 41), against host sums in
 * float64; db and dpeep start at 1 (the sums are added to them). */
static void test_param_sums(void) {
    enum { N = 2 * RL_LSTM_CUDA_CHUNKS + 5, HS = 41 };
    int64_t zs[2] = {N, 4 * HS}, cs[2] = {N, HS}, bs[1] = {4 * HS}, hs[1] = {HS},
            ps[1] = {RL_LSTM_CUDA_CHUNKS * 7 * HS};
    rl_tensor z = rand_tensor(RL_FLOAT64, 2, zs, -1.0, 1.0, NULL, 0.0),
              cp = rand_tensor(RL_FLOAT64, 2, cs, -1.0, 1.0, NULL, 0.0),
              cc = rand_tensor(RL_FLOAT64, 2, cs, -1.0, 1.0, NULL, 0.0), db = {0}, dp[3] = {{0}};
    CHECK_OK(rl_tensor_empty(&db, RL_FLOAT64, RL_DEVICE_CPU, 1, bs));
    for (int k = 0; k < 3; k++)
        CHECK_OK(rl_tensor_empty(&dp[k], RL_FLOAT64, RL_DEVICE_CPU, 1, hs));
    const double *pz = rl_tensor_data(&z), *pcp = rl_tensor_data(&cp), *pcc = rl_tensor_data(&cc);
    double *pdb = rl_tensor_data(&db),
           *pdp[3] = {rl_tensor_data(&dp[0]), rl_tensor_data(&dp[1]), rl_tensor_data(&dp[2])};
    for (int64_t j = 0; j < 4 * HS; j++) {
        pdb[j] = 1;
        for (int64_t n = 0; n < N; n++)
            pdb[j] += pz[n * 4 * HS + j];
    }
    for (int64_t j = 0; j < HS; j++) {
        pdp[0][j] = pdp[1][j] = pdp[2][j] = 1;
        for (int64_t n = 0; n < N; n++) {
            const double *zr = pz + n * 4 * HS + j;
            pdp[0][j] += zr[0] * pcp[n * HS + j];
            pdp[1][j] += zr[HS] * pcp[n * HS + j];
            pdp[2][j] += zr[3 * HS] * pcc[n * HS + j];
        }
    }
    rl_tensor Z = copy_to(&z, DEV), CP = copy_to(&cp, DEV), CC = copy_to(&cc, DEV),
              DB = zeros_dev(RL_FLOAT64, 1, bs), P = zeros_dev(RL_FLOAT64, 1, ps), DP[3];
    CHECK_OK(rl_op_fill(&DB, 1.0));
    void *dpp[3];
    for (int k = 0; k < 3; k++) {
        DP[k] = zeros_dev(RL_FLOAT64, 1, hs);
        CHECK_OK(rl_op_fill(&DP[k], 1.0));
        dpp[k] = rl_tensor_data(&DP[k]);
    }
    CHECK_OK(rl_lstm_cuda_param_grads(NULL, RL_FLOAT64, N, HS, rl_tensor_data(&Z),
                                      rl_tensor_data(&CP), rl_tensor_data(&CC), rl_tensor_data(&P),
                                      rl_tensor_data(&DB), dpp));
    compare("param sums", "db", &db, &DB, 1e-12);
    for (int k = 0; k < 3; k++)
        compare("param sums", "dpeep", &dp[k], &DP[k], 1e-12);
    rl_tensor *ts[] = {&z,  &cp, &cc, &db, &dp[0], &dp[1], &dp[2], &Z,
                       &CP, &CC, &DB, &P,  &DP[0], &DP[1], &DP[2]};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}
#endif

static void run_all(void) {
    bool gpu = DEV.type == RL_CUDA;
    for (int peep = 0; peep < 2; peep++) {
        test_own(RL_FLOAT32, peep, 1e-5);
        test_own(RL_FLOAT64, peep, 1e-10);
    }
#ifdef RL_WITH_CUDA
    for (int dir = 1; dir >= -1 && gpu; dir -= 2) {
        test_cudnn(RL_FLOAT32, dir, 3e-5);
        test_cudnn(RL_FLOAT64, dir, 1e-10);
    }
    if (gpu) test_cudnn_misuse();
    if (gpu) test_param_sums();
#endif
    for (int peep = 0; peep < 2; peep++) {
        test_layer(RL_FLOAT32, peep, "own", 1e-5);
        test_layer(RL_FLOAT64, peep, "own", 1e-10);
    }
    if (gpu) {
        test_layer(RL_FLOAT32, false, "cudnn", 3e-5);
        test_layer(RL_FLOAT64, false, "cudnn", 1e-10);
        test_layer_devices();
    }
}

int main(void) {
    rl_ops_init();
    rand_state = 0x2545F4914F6CDD1Du;
    DEV = device_side("the stream, bias-sum, cuDNN and mixed-device cases");
    run_all();
    TEST_MAIN_END();
}
