/* GRU parity on a GPU: the gru layer (layers/gru.c) on CUDA tensors against the same layer on
 * the CPU, with the same random weights and inputs: T=7, B=3 with ragged lengths {7, 4, 1}, H=5,
 * two inputs (F = 4 and 3; NaN in the padded frames of the first), a given initial state, both
 * directions queued at once (one stream per layer object), float32 (to 1e-5 of each tensor's
 * largest magnitude) and float64 (1e-10). Compared: the output, each sequence's final state,
 * both input gradients, every parameter gradient and the initial state's gradient, over two
 * batches (the second reuses the buffers and accumulates the parameter gradients). Then the
 * per-step kernels of kernels/cuda/gru_cuda.h against kernels/gru.h's CPU steps on random
 * buffers (padded rows included) and the bias sums against a host sum (also over more rows than
 * the sums' row chunks and more columns than one block).
 *
 * Without a GPU (or without a CUDA build) the device-free parts still run: the CPU reference
 * runs (two layer objects must agree bit for bit, and no NaN of the padding may reach a result),
 * a check that the comparison catches a wrong element, and the layer harness with the CPU as the
 * device side (tests/gpu/device_side.h); the per-step CUDA kernels and the bias sums need a GPU and
 * are skipped. Run by `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "kernels/cudnn_layout.h"
#include "kernels/gru.h"
#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "tests/c/check.h"
#include "tests/c/gradcheck.h"
#include "tests/gpu/device_side.h"
#ifdef RL_WITH_CUDA
#include "kernels/cuda/cudnn_rnn.h"
#include "kernels/cuda/gru_cuda.h"
#endif

enum { T = 7, B = 3, H = 5, F1 = 4, F2 = 3 };
static const int32_t LENS[B] = {7, 4, 1};

/* ---- one side of a comparison: a gru layer with its batch on one device ---- */

typedef struct {
    rl_layer *l;
    rl_tensor x[2], len, h0, gout, gin[2], hT, dh0;
} side;

/* The layer and its batch on dev; the values depend only on seed, so both sides get the same. */
static bool side_init(side *s, rl_dtype dt, int dir, rl_device dev, uint64_t seed,
                      const char *impl) {
    memset(s, 0, sizeof *s);
    rand_state = seed;
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", H);
    gc_opt_num(&t, "direction", dir);
    if (impl) gc_opt_str(&t, "impl", impl);
    rl_options o = gc_options(&t);
    int64_t F[2] = {F1, F2};
    CHECK_OK(rl_layer_create(&s->l, "gru", dir > 0 ? "fw" : "bw", &o, 2, F));
    if (!s->l) return false;
    for (int i = 0; i < s->l->n_params; i++) {
        rl_param *p = &s->l->params[i];
        rl_tensor v = rand_tensor(dt, p->ndim, p->shape, -0.5, 0.5, NULL, 0);
        p->value = copy_to(&v, dev);
        rl_tensor_release(&v);
        CHECK_OK(rl_tensor_empty(&p->grad, dt, dev, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
    }
    for (int k = 0; k < 2; k++) {
        int64_t xs[3] = {T, B, F[k]};
        rl_tensor x = rand_tensor(dt, 3, xs, -1.0, 1.0, LENS, k == 0 ? NAN : 0.0);
        s->x[k] = copy_to(&x, dev);
        rl_tensor_release(&x);
        CHECK_OK(rl_tensor_empty(&s->gin[k], dt, dev, 3, xs));
    }
    int64_t bs[1] = {B}, hs[2] = {B, H}, os[3] = {T, B, H};
    CHECK_OK(rl_tensor_empty(&s->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    memcpy(rl_tensor_data(&s->len), LENS, sizeof LENS);
    rl_tensor h0 = rand_tensor(dt, 2, hs, -0.5, 0.5, NULL, 0),
              g = rand_tensor(dt, 3, os, -1.0, 1.0, LENS, 0.0);
    s->h0 = copy_to(&h0, dev);
    s->gout = copy_to(&g, dev);
    rl_tensor_release(&h0);
    rl_tensor_release(&g);
    CHECK_OK(rl_gru_set_initial_state(s->l, &s->h0));
    return true;
}

static rl_layer_io side_io(side *s) {
    rl_layer_io io = {.n_in = 2, .in = {&s->x[0], &s->x[1]}, .lengths = &s->len};
    return io;
}

static void side_forward(side *s) {
    rl_layer_io io = side_io(s);
    CHECK_OK(s->l->ops->forward(s->l, &io));
}

static void side_backward(side *s) {
    rl_layer_io io = side_io(s);
    rl_tensor *gi[2] = {&s->gin[0], &s->gin[1]};
    rl_tensor_release(&s->hT);
    CHECK_OK(rl_gru_final_state(s->l, &s->hT));
    rl_tensor hT = {0};
    CHECK_OK(rl_op_to(
        &hT, &s->hT, s->hT.dtype,
        rl_tensor_device(&s->hT))); /* a copy: the view lives only until the next forward */
    rl_tensor_release(&s->hT);
    s->hT = hT;
    CHECK_OK(s->l->ops->backward(s->l, &io, &s->gout, gi));
    rl_tensor_release(&s->dh0);
    CHECK_OK(rl_gru_initial_state_grad(s->l, &s->dh0));
}

static void side_free(side *s) {
    rl_layer_free(s->l);
    rl_tensor *ts[] = {&s->x[0],   &s->x[1],   &s->len, &s->h0, &s->gout,
                       &s->gin[0], &s->gin[1], &s->hT,  &s->dh0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void side_compare(const char *tag, side *want, side *got, double rtol) {
    compare(tag, "output", &want->l->out, &got->l->out, rtol);
    compare(tag, "final state", &want->hT, &got->hT, rtol);
    compare(tag, "input 1 gradient", &want->gin[0], &got->gin[0], rtol);
    compare(tag, "input 2 gradient", &want->gin[1], &got->gin[1], rtol);
    compare(tag, "initial state gradient", &want->dh0, &got->dh0, rtol);
    for (int i = 0; i < want->l->n_params; i++)
        compare(tag, want->l->params[i].name, &want->l->params[i].grad, &got->l->params[i].grad,
                rtol);
}

/* ---- device-free: the CPU reference and the comparison itself ---- */

static void test_reference(void) {
    for (int dir = 1; dir >= -1; dir -= 2) {
        side a, b;
        if (!side_init(&a, RL_FLOAT32, dir, RL_DEVICE_CPU, 11, NULL) ||
            !side_init(&b, RL_FLOAT32, dir, RL_DEVICE_CPU, 11, NULL))
            return;
        for (int rep = 0; rep < 2; rep++) {
            side_forward(&a);
            side_forward(&b);
            side_backward(&a);
            side_backward(&b);
        }
        side_compare(dir > 0 ? "cpu reference fw" : "cpu reference bw", &a, &b, 0.0);
        /* no NaN of the padding reached a result (rel_err of a tensor with itself is NaN-free) */
        CHECK(rel_err(&a.l->out, &a.l->out) == 0.0);
        CHECK(rel_err(&a.gin[0], &a.gin[0]) == 0.0);
        CHECK(rel_err(&a.l->params[0].grad, &a.l->params[0].grad) == 0.0);
        /* the comparison catches one wrong element, and a NaN */
        float *o = rl_tensor_data(&b.l->out);
        float keep = o[5];
        o[5] = keep + 1e-3f;
        CHECK(rel_err(&a.l->out, &b.l->out) > 1e-5);
        o[5] = NAN;
        CHECK(!(rel_err(&a.l->out, &b.l->out) <= 1e-5));
        o[5] = keep;
        side_free(&a);
        side_free(&b);
    }
}

/* ---- cuDNN's GRU, device-free: the parameter mapping and cuDNN's equations on the CPU ---- */

enum { FS = F1 + F2, NG = 3 }; /* the GRU's input size and gates */

/* A layout as cuDNN might report one, unlike the packed one: ids in reverse order, each bias
 * before its matrix, matrices column-major, one unused element after each piece. *n: its size. */
static rl_cudnn_layout scrambled_layout(int64_t *n) {
    rl_cudnn_layout L = {.F = FS, .H = H, .gates = NG, .two_biases = true};
    int64_t off = 0;
    for (int id = 2 * NG - 1; id >= 0; id--) {
        int64_t in = id < NG ? FS : H;
        *(id < NG ? &L.b[id] : &L.rb[id - NG]) = off;
        off += H + 1;
        *(id < NG ? &L.w[id] : &L.u[id - NG]) = (rl_cudnn_mat){off, 1, H};
        off += H * in + 1;
    }
    *n = off;
    return L;
}

/* Random W, U, b, b_h (float64) packed into the space and back: bit-exact, every parameter
 * written, the unused places untouched. */
static void test_layout_round_trip(rl_dtype dt) {
    for (int variant = 0; variant < 2; variant++) {
        rl_cudnn_layout L;
        int64_t n = 0;
        if (variant == 0)
            n = rl_cudnn_layout_packed(&L, RL_CUDNN_GRU, FS, H);
        else
            L = scrambled_layout(&n);
        CHECK(n == (variant ? (FS + H + 2) * NG * H + 4 * NG : (FS + H + 2) * NG * H));
        CHECK_OK(rl_cudnn_layout_check(&L, n, "round trip"));
        int64_t ws[2] = {FS, NG * H}, us[2] = {H, NG * H}, bs[1] = {NG * H}, ns[1] = {n};
        rand_state = 41 + (uint64_t)variant;
        rl_tensor ours[4] = {
            rand_tensor(dt, 2, ws, -1.0, 1.0, NULL, 0), rand_tensor(dt, 2, us, -1.0, 1.0, NULL, 0),
            rand_tensor(dt, 1, bs, -1.0, 1.0, NULL, 0), rand_tensor(dt, 1, bs, -1.0, 1.0, NULL, 0)};
        rl_tensor space = {0}, back[4] = {{0}};
        CHECK_OK(rl_tensor_empty(&space, dt, RL_DEVICE_CPU, 1, ns));
        CHECK_OK(rl_op_fill(&space, 777.0));
        for (int i = 0; i < 4; i++) {
            CHECK_OK(rl_tensor_empty(&back[i], dt, RL_DEVICE_CPU, ours[i].ndim, ours[i].shape));
            CHECK_OK(rl_op_fill(&back[i], 0.0));
        }
        rl_cudnn_layout_pack_host(&L, dt, rl_tensor_data(&ours[0]), rl_tensor_data(&ours[1]),
                                  rl_tensor_data(&ours[2]), rl_tensor_data(&ours[3]),
                                  rl_tensor_data(&space));
        rl_cudnn_layout_unpack_host(&L, dt, rl_tensor_data(&space), rl_tensor_data(&back[0]),
                                    rl_tensor_data(&back[1]), rl_tensor_data(&back[2]),
                                    rl_tensor_data(&back[3]));
        for (int i = 0; i < 4; i++) {
            size_t bytes = (size_t)rl_tensor_numel(&ours[i]) * rl_dtype_size(dt);
            CHECK(memcmp(rl_tensor_data(&ours[i]), rl_tensor_data(&back[i]), bytes) == 0);
        }
        rl_tensor sp64 = {0};
        CHECK_OK(rl_op_to(&sp64, &space, RL_FLOAT64, RL_DEVICE_CPU));
        int64_t untouched = 0;
        for (int64_t i = 0; i < n; i++)
            untouched += ((double *)rl_tensor_data(&sp64))[i] == 777.0;
        CHECK(untouched == (variant ? 4 * NG : 0));
        /* one known element: W[c, q H + r] is cuDNN's matrix q at (r, c) */
        int64_t c = 2, q = 1, r = 3, theirs = L.w[q].off + r * L.w[q].rs + c * L.w[q].cs;
        rl_tensor w64 = {0};
        CHECK_OK(rl_op_to(&w64, &ours[0], RL_FLOAT64, RL_DEVICE_CPU));
        CHECK(((double *)rl_tensor_data(&w64))[c * NG * H + q * H + r] ==
              ((double *)rl_tensor_data(&sp64))[theirs]);
        rl_tensor_release(&w64);
        rl_tensor_release(&sp64);
        rl_tensor_release(&space);
        for (int i = 0; i < 4; i++) {
            rl_tensor_release(&ours[i]);
            rl_tensor_release(&back[i]);
        }
    }
}

/* The layout check refuses what would silently mix weights; the LSTM's single bias mode holds
 * the recurrent biases cuDNN may keep at 0. */
static void test_layout_check(void) {
    rl_cudnn_layout L;
    int64_t n = rl_cudnn_layout_packed(&L, RL_CUDNN_GRU, FS, H);
    rl_cudnn_layout bad = L;
    bad.u[1].off = bad.w[0].off + 1;
    CHECK(rl_cudnn_layout_check(&bad, n, "cudnn gru") == RL_EDEVICE);
    CHECK(strstr(rl_errmsg(), "cudnn gru") && strstr(rl_errmsg(), "already uses"));
    CHECK(rl_cudnn_layout_check(&L, n - 1, "cudnn gru") == RL_EDEVICE);
    CHECK(strstr(rl_errmsg(), "outside the weight space") != NULL);
    bad = L;
    bad.rb[2] = -1;
    CHECK(rl_cudnn_layout_check(&bad, n, "cudnn gru") == RL_EDEVICE);
    CHECK(strstr(rl_errmsg(), "no recurrent bias for gate 2") != NULL);
    bad = L;
    bad.w[0].cs = 0; /* every column of matrix 0 on one place */
    CHECK(rl_cudnn_layout_check(&bad, n, "cudnn gru") == RL_EDEVICE);

    rl_cudnn_layout S;
    int64_t ns = rl_cudnn_layout_packed(&S, RL_CUDNN_LSTM, FS, H);
    CHECK(ns == (FS + H + 1) * 4 * H && S.rb[0] == -1 && !S.two_biases);
    CHECK_OK(rl_cudnn_layout_check(&S, ns, "cudnn lstm"));
    for (int q = 0; q < 4; q++)
        S.rb[q] = ns + q * H; /* recurrent biases appended */
    ns += 4 * H;
    CHECK_OK(rl_cudnn_layout_check(&S, ns, "cudnn lstm"));
    double W[FS * 4 * H], U[H * 4 * H], b[4 * H], sp[(FS + H + 2) * 4 * H];
    for (size_t i = 0; i < sizeof W / sizeof W[0]; i++)
        W[i] = 1.0;
    for (size_t i = 0; i < sizeof U / sizeof U[0]; i++)
        U[i] = 2.0;
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        b[i] = 3.0;
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        sp[i] = 9.0;
    rl_cudnn_layout_pack_host(&S, RL_FLOAT64, W, U, b, NULL, sp);
    int64_t zeros = 0, nine = 0;
    for (int64_t i = 0; i < ns; i++)
        zeros += sp[i] == 0.0, nine += sp[i] == 9.0;
    CHECK(zeros == 4 * H && nine == 0);
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Row r of cuDNN's matrix m times v (length n). */
static double mat_row(const double *sp, rl_cudnn_mat m, int64_t r, const double *v, int64_t n) {
    double s = 0;
    for (int64_t c = 0; c < n; c++)
        s += sp[m.off + r * m.rs + c * m.cs] * v[c];
    return s;
}

/* cuDNN's GRU as its documentation writes it (ids 0, 1, 2: reset, update, new-memory gate):
 *   r = sigma(W_0 x + R_3 h + bW_0 + bR_3)   u = sigma(W_1 x + R_4 h + bW_1 + bR_4)
 *   h' = tanh(W_2 x + bW_2 + r (R_5 h + bR_5))   h_new = (1 - u) h' + u h
 * on the CPU, reading every weight (with layout L) from a space packed from the layer's
 * parameters with layout P; each sequence in the layer's direction within its own length, from
 * the layer's initial state. Returns the largest difference to the layer's output and final
 * state. */
static double cudnn_equations_err(side *a, int dir, const rl_cudnn_layout *P,
                                  const rl_cudnn_layout *L, int64_t n) {
    rl_tensor p[4] = {{0}};
    for (int i = 0; i < 4; i++)
        CHECK_OK(rl_op_to(&p[i], &a->l->params[i].value, RL_FLOAT64, RL_DEVICE_CPU));
    double *sp = calloc((size_t)n, sizeof *sp);
    CHECK(sp != NULL);
    if (!sp) return INFINITY;
    rl_cudnn_layout_pack_host(P, RL_FLOAT64, rl_tensor_data(&p[0]), rl_tensor_data(&p[1]),
                              rl_tensor_data(&p[2]), rl_tensor_data(&p[3]), sp);
    const double *x1 = rl_tensor_data(&a->x[0]), *x2 = rl_tensor_data(&a->x[1]);
    const double *h0 = rl_tensor_data(&a->h0), *out = rl_tensor_data(&a->l->out);
    rl_tensor hf = {0};
    CHECK_OK(rl_gru_final_state(a->l, &hf));
    const double *hT = rl_tensor_data(&hf);
    double err = 0;
    for (int64_t b = 0; b < B; b++) {
        double h[H], hn[H], x[FS];
        memcpy(h, h0 + b * H, sizeof h);
        for (int64_t s = 0; s < LENS[b]; s++) {
            int64_t t = dir > 0 ? s : LENS[b] - 1 - s, row = t * B + b;
            memcpy(x, x1 + row * F1, F1 * sizeof *x);
            memcpy(x + F1, x2 + row * F2, F2 * sizeof *x);
            for (int64_t j = 0; j < H; j++) {
                double r = sigm(mat_row(sp, L->w[0], j, x, FS) + mat_row(sp, L->u[0], j, h, H) +
                                sp[L->b[0] + j] + sp[L->rb[0] + j]);
                double u = sigm(mat_row(sp, L->w[1], j, x, FS) + mat_row(sp, L->u[1], j, h, H) +
                                sp[L->b[1] + j] + sp[L->rb[1] + j]);
                double nn = tanh(mat_row(sp, L->w[2], j, x, FS) + sp[L->b[2] + j] +
                                 r * (mat_row(sp, L->u[2], j, h, H) + sp[L->rb[2] + j]));
                hn[j] = (1 - u) * nn + u * h[j];
            }
            memcpy(h, hn, sizeof h);
            for (int64_t j = 0; j < H; j++)
                err = fmax(err, fabs(out[row * H + j] - h[j]));
        }
        for (int64_t t = LENS[b]; t < T; t++) /* padded frames: output 0 */
            for (int64_t j = 0; j < H; j++)
                err = fmax(err, fabs(out[(t * B + b) * H + j]));
        for (int64_t j = 0; j < H; j++)
            err = fmax(err, fabs(hT[b * H + j] - h[j]));
    }
    free(sp);
    rl_tensor_release(&hf);
    for (int i = 0; i < 4; i++)
        rl_tensor_release(&p[i]);
    return err;
}

/* The gru layer's forward (float64, CPU, ragged, given initial state) equals cuDNN's equations
 * evaluated from the packed space, for both layouts and directions; a layout with the reset and
 * update gates' ids swapped does not (the check can fail). */
static void test_cudnn_equations(void) {
    for (int dir = 1; dir >= -1; dir -= 2) {
        side a;
        if (!side_init(&a, RL_FLOAT64, dir, RL_DEVICE_CPU, 31, NULL)) return;
        side_forward(&a);
        rl_cudnn_layout L;
        int64_t n = rl_cudnn_layout_packed(&L, RL_CUDNN_GRU, FS, H);
        double e = cudnn_equations_err(&a, dir, &L, &L, n);
        if (!(e <= 1e-12)) fprintf(stderr, "FAIL cudnn equations dir %d: error %.3g\n", dir, e);
        CHECK(e <= 1e-12);
        L = scrambled_layout(&n);
        CHECK(cudnn_equations_err(&a, dir, &L, &L, n) <= 1e-12);
        rl_cudnn_layout R = L; /* read as if ids 0 and 1 were the other way round */
        R.w[0] = L.w[1], R.w[1] = L.w[0], R.u[0] = L.u[1], R.u[1] = L.u[0];
        CHECK(cudnn_equations_err(&a, dir, &L, &R, n) > 1e-3);
        side_free(&a);
    }
}

/* impl takes "own" or "cudnn", nothing else, and says which layer. */
static void test_impl_option(void) {
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", H);
    gc_opt_num(&t, "direction", 1);
    gc_opt_str(&t, "impl", "cuDNN");
    rl_options o = gc_options(&t);
    int64_t F[1] = {F1};
    rl_layer *l = NULL;
    CHECK(rl_layer_create(&l, "gru", "enc", &o, 1, F) == RL_EARG && !l);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "impl") &&
          strstr(rl_errmsg(), "cuDNN"));
}

/* the side compared with the CPU: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

/* Both directions on the GPU queued at once (forward of both, then backward of both, no
 * synchronisation between), against the CPU layer with its own kernels; two batches. impl: the
 * GPU side's (on the CPU, "cudnn" falls back to the own kernels and must agree exactly). */
static void test_layer(rl_dtype dt, double rtol, const char *impl) {
    side cpu[2], gpu[2];
    for (int d = 0; d < 2; d++) {
        int dir = d ? -1 : 1;
        if (!side_init(&cpu[d], dt, dir, RL_DEVICE_CPU, 21 + d, NULL) ||
            !side_init(&gpu[d], dt, dir, DEV, 21 + d, impl))
            return;
    }
    for (int rep = 0; rep < 2; rep++) {
        for (int d = 0; d < 2; d++) {
            side_forward(&cpu[d]);
            side_forward(&gpu[d]);
        }
        for (int d = 0; d < 2; d++) {
            side_backward(&cpu[d]);
            side_backward(&gpu[d]);
        }
    }
    CHECK_OK(rl_op_synchronize(DEV));
    for (int d = 0; d < 2; d++) {
        char tag[64];
        snprintf(tag, sizeof tag, "layer %s %s %s", impl, rl_dtype_name(dt), d ? "bw" : "fw");
        side_compare(tag, &cpu[d], &gpu[d], rtol);
        side_free(&cpu[d]);
        side_free(&gpu[d]);
    }
}

#ifdef RL_WITH_CUDA
static const rl_device CUDA0 = {RL_CUDA, 0};

/* The cuDNN object alone: the layout cuDNN reports (checked at creation; said whether it is the
 * packed one), a pack/unpack round trip on the device, and misuse as errors. */
static void test_cudnn_object(rl_dtype dt) {
    rl_cudnn_rnn *c = NULL;
    CHECK_OK(rl_cudnn_rnn_create(&c, RL_CUDNN_GRU, 0, dt, FS, H, 1));
    if (!c) return;
    int64_t n = 0, np;
    const rl_cudnn_layout *L = rl_cudnn_rnn_layout(c, &n);
    rl_cudnn_layout P;
    np = rl_cudnn_layout_packed(&P, RL_CUDNN_GRU, FS, H);
    bool same = n == np && memcmp(L->w, P.w, sizeof P.w) == 0 &&
                memcmp(L->u, P.u, sizeof P.u) == 0 && memcmp(L->b, P.b, sizeof P.b) == 0 &&
                memcmp(L->rb, P.rb, sizeof P.rb) == 0;
    printf("cuDNN's GRU weight space (%s): %lld elements, %s the packed layout\n",
           rl_dtype_name(dt), (long long)n, same ? "the same as" : "different from");
    CHECK_OK(rl_cudnn_layout_check(L, n, "cudnn gru"));
    int64_t ws[2] = {FS, NG * H}, us[2] = {H, NG * H}, bs[1] = {NG * H};
    rand_state = 51;
    rl_tensor hostp[4] = {
        rand_tensor(dt, 2, ws, -1.0, 1.0, NULL, 0), rand_tensor(dt, 2, us, -1.0, 1.0, NULL, 0),
        rand_tensor(dt, 1, bs, -1.0, 1.0, NULL, 0), rand_tensor(dt, 1, bs, -1.0, 1.0, NULL, 0)};
    rl_tensor d[4], back[4] = {{0}};
    for (int i = 0; i < 4; i++) {
        d[i] = copy_to(&hostp[i], CUDA0);
        CHECK_OK(rl_tensor_empty(&back[i], dt, CUDA0, hostp[i].ndim, hostp[i].shape));
    }
    CHECK_OK(rl_cudnn_rnn_pack_weights(c, rl_tensor_data(&d[0]), rl_tensor_data(&d[1]),
                                       rl_tensor_data(&d[2]), rl_tensor_data(&d[3])));
    CHECK_OK(rl_cudnn_rnn_unpack_weights(c, rl_tensor_data(&back[0]), rl_tensor_data(&back[1]),
                                         rl_tensor_data(&back[2]), rl_tensor_data(&back[3])));
    CHECK_OK(rl_op_synchronize(CUDA0));
    const char *names[4] = {"W", "U", "b", "b_h"};
    for (int i = 0; i < 4; i++)
        compare("cudnn object round trip", names[i], &hostp[i], &back[i], 0.0);
    CHECK(rl_cudnn_rnn_pack_weights(c, rl_tensor_data(&d[0]), rl_tensor_data(&d[1]),
                                    rl_tensor_data(&d[2]), NULL) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "b_h") != NULL);
    CHECK(rl_cudnn_rnn_backward(c, rl_tensor_data(&d[0]), NULL, NULL, NULL) == RL_EARG);
    int64_t xs[3] = {T, B, FS}, os[3] = {T, B, H}, ls[1] = {B};
    rl_tensor x = {0}, y = {0}, len = {0};
    CHECK_OK(rl_tensor_empty(&x, dt, CUDA0, 3, xs));
    CHECK_OK(rl_tensor_empty(&y, dt, CUDA0, 3, os));
    CHECK_OK(rl_tensor_empty(&len, RL_INT32, CUDA0, 1, ls));
    CHECK(rl_cudnn_rnn_forward(c, true, T, B, LENS, rl_tensor_data(&len), rl_tensor_data(&x),
                               rl_tensor_data(&y), NULL, rl_tensor_data(&y), NULL,
                               NULL) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "cell state") != NULL);
    rl_tensor *ts[] = {&x, &y, &len};
    for (size_t i = 0; i < 3; i++)
        rl_tensor_release(ts[i]);
    for (int i = 0; i < 4; i++) {
        rl_tensor_release(&hostp[i]);
        rl_tensor_release(&d[i]);
        rl_tensor_release(&back[i]);
    }
    rl_cudnn_rnn_free(c);
}

/* The per-step kernels and the bias sums against the CPU steps on the same random buffers. */
static void test_steps(void) {
    rand_state = 99;
    int64_t gs[2] = {B, 4 * H}, hs[2] = {B, H}, bs[1] = {3 * H}, ls[1] = {B};
    int64_t t = 3; /* row 2 (length 1) is padded at this step */
    rl_tensor g = rand_tensor(RL_FLOAT32, 2, gs, -1.0, 1.0, NULL, 0),
              b = rand_tensor(RL_FLOAT32, 1, bs, -0.5, 0.5, NULL, 0),
              bh = rand_tensor(RL_FLOAT32, 1, bs, -0.5, 0.5, NULL, 0),
              hp = rand_tensor(RL_FLOAT32, 2, hs, -0.8, 0.8, NULL, 0),
              dout = rand_tensor(RL_FLOAT32, 2, hs, -1.0, 1.0, NULL, 0),
              dh = rand_tensor(RL_FLOAT32, 2, hs, -1.0, 1.0, NULL, 0), h = {0}, out = {0},
              len = {0};
    CHECK_OK(rl_tensor_empty(&h, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_tensor_empty(&out, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, ls));
    memcpy(rl_tensor_data(&len), LENS, sizeof LENS);
    rl_tensor G = copy_to(&g, CUDA0), Bd = copy_to(&b, CUDA0), BHd = copy_to(&bh, CUDA0),
              HP = copy_to(&hp, CUDA0), DO = copy_to(&dout, CUDA0), DH = copy_to(&dh, CUDA0),
              Hd = copy_to(&h, CUDA0), Od = copy_to(&out, CUDA0), L = copy_to(&len, CUDA0);
    rl_gru_cpu_fwd_f32(B, H, t, LENS, rl_tensor_data(&g), rl_tensor_data(&b), rl_tensor_data(&bh),
                       rl_tensor_data(&hp), rl_tensor_data(&h), rl_tensor_data(&out), NULL);
    CHECK_OK(rl_gru_cuda_fwd_f32(NULL, B, H, t, rl_tensor_data(&L), rl_tensor_data(&G),
                                 rl_tensor_data(&Bd), rl_tensor_data(&BHd), rl_tensor_data(&HP),
                                 rl_tensor_data(&Hd), rl_tensor_data(&Od)));
    compare("step fwd", "gates", &g, &G, 1e-5);
    compare("step fwd", "state", &h, &Hd, 1e-5);
    compare("step fwd", "output", &out, &Od, 1e-5);
    /* backward from the activations just computed; bias sums on the host vs the kernel */
    rl_tensor db = {0}, dbh = {0};
    CHECK_OK(rl_tensor_empty(&db, RL_FLOAT32, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_tensor_empty(&dbh, RL_FLOAT32, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_op_fill(&db, 0.0));
    CHECK_OK(rl_op_fill(&dbh, 0.0));
    rl_tensor DB = copy_to(&db, CUDA0), DBH = copy_to(&dbh, CUDA0);
    rl_gru_cpu_bwd_f32(B, H, t, LENS, rl_tensor_data(&g), rl_tensor_data(&hp),
                       rl_tensor_data(&dout), H, rl_tensor_data(&dh), rl_tensor_data(&db),
                       rl_tensor_data(&dbh), NULL);
    CHECK_OK(rl_gru_cuda_bwd_f32(NULL, B, H, t, rl_tensor_data(&L), rl_tensor_data(&G),
                                 rl_tensor_data(&HP), rl_tensor_data(&DO), H, rl_tensor_data(&DH)));
    int64_t ps[1] = {RL_GRU_CUDA_CHUNKS * 4 * H};
    rl_tensor P = {0};
    CHECK_OK(rl_tensor_empty(&P, RL_FLOAT32, CUDA0, 1, ps));
    CHECK_OK(rl_gru_cuda_bias_grads(NULL, RL_FLOAT32, B, H, rl_tensor_data(&G), rl_tensor_data(&P),
                                    rl_tensor_data(&DB), rl_tensor_data(&DBH)));
    compare("step bwd", "dG", &g, &G, 1e-5);
    compare("step bwd", "dh", &dh, &DH, 1e-5);
    compare("step bwd", "db", &db, &DB, 1e-5);
    compare("step bwd", "db_h", &dbh, &DBH, 1e-5);
    rl_tensor *ts[] = {&g,  &b,  &bh, &hp, &dout, &dh, &h,  &out, &len, &G,   &Bd, &BHd,
                       &HP, &DO, &DH, &Hd, &Od,   &L,  &db, &dbh, &DB,  &DBH, &P};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

/* The bias sums over more rows than RL_GRU_CUDA_CHUNKS (several rows per chunk, a last chunk
 * with fewer) and more columns than one block (4H = 164), against a host sum in float64. */
static void test_bias_sums(void) {
    enum { N = 2 * RL_GRU_CUDA_CHUNKS + 5, HB = 41 };
    rand_state = 7;
    int64_t gs[2] = {N, 4 * HB}, bs[1] = {3 * HB}, ps[1] = {RL_GRU_CUDA_CHUNKS * 4 * HB};
    rl_tensor g = rand_tensor(RL_FLOAT64, 2, gs, -1.0, 1.0, NULL, 0), db = {0}, dbh = {0}, P = {0};
    CHECK_OK(rl_tensor_empty(&db, RL_FLOAT64, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_tensor_empty(&dbh, RL_FLOAT64, RL_DEVICE_CPU, 1, bs));
    const double *pg = rl_tensor_data(&g);
    double *pdb = rl_tensor_data(&db), *pdbh = rl_tensor_data(&dbh);
    for (int64_t j = 0; j < HB; j++) {
        double s[4] = {0, 0, 0, 0};
        for (int64_t n = 0; n < N; n++)
            for (int k = 0; k < 4; k++)
                s[k] += pg[n * 4 * HB + k * HB + j];
        /* db and dbh start at 1: the sums are added to them */
        pdb[j] = 1 + s[0], pdb[HB + j] = 1 + s[1], pdb[2 * HB + j] = 1 + s[3];
        pdbh[j] = 1 + s[0], pdbh[HB + j] = 1 + s[1], pdbh[2 * HB + j] = 1 + s[2];
    }
    rl_tensor G = copy_to(&g, CUDA0), DB = {0}, DBH = {0};
    CHECK_OK(rl_tensor_empty(&DB, RL_FLOAT64, CUDA0, 1, bs));
    CHECK_OK(rl_tensor_empty(&DBH, RL_FLOAT64, CUDA0, 1, bs));
    CHECK_OK(rl_tensor_empty(&P, RL_FLOAT64, CUDA0, 1, ps));
    CHECK_OK(rl_op_fill(&DB, 1.0));
    CHECK_OK(rl_op_fill(&DBH, 1.0));
    CHECK_OK(rl_gru_cuda_bias_grads(NULL, RL_FLOAT64, N, HB, rl_tensor_data(&G), rl_tensor_data(&P),
                                    rl_tensor_data(&DB), rl_tensor_data(&DBH)));
    compare("bias sums", "db", &db, &DB, 1e-12);
    compare("bias sums", "db_h", &dbh, &DBH, 1e-12);
    rl_tensor *ts[] = {&g, &db, &dbh, &G, &DB, &DBH, &P};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}
#endif

int main(void) {
    rl_ops_init();
    test_reference();
    test_layout_round_trip(RL_FLOAT32);
    test_layout_round_trip(RL_FLOAT64);
    test_layout_check();
    test_cudnn_equations();
    test_impl_option();
    DEV = device_side("the per-step CUDA kernels, the bias sums, the cuDNN object; impl = "
                      "\"cudnn\" runs the own CPU kernels there");
    test_layer(RL_FLOAT32, 1e-5, "own");
    test_layer(RL_FLOAT64, 1e-10, "own");
    /* cuDNN sums in its own order (3e-5 as for the lstm); on the CPU the fallback is exact */
    test_layer(RL_FLOAT32, DEV.type == RL_CUDA ? 3e-5 : 0.0, "cudnn");
    test_layer(RL_FLOAT64, DEV.type == RL_CUDA ? 1e-10 : 0.0, "cudnn");
#ifdef RL_WITH_CUDA
    if (DEV.type == RL_CUDA) {
        test_steps();
        test_bias_sums();
        test_cudnn_object(RL_FLOAT32);
        test_cudnn_object(RL_FLOAT64);
    }
#endif
    TEST_MAIN_END();
}
