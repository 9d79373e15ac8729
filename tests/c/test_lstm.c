/* The lstm layer against a float64 reference written here (per-step loops, no BLAS), both
 * directions, peepholes, ragged lengths, several inputs, a given initial state; a central-
 * difference gradient check in float64 of inputs, parameters and initial state; float32 near
 * float64; error messages that name the layer, including impl = "cudnn" on CPU tensors and with
 * peepholes, and backward calls that do not match their forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "../../core/blas.h"
#include "../../core/rng.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/cpu/gemm_small.h"
#include "../../kernels/lstm.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"

/* Options from a fixed table: key -> number (booleans as 0/1); the string option impl is
 * impl_opt (absent while NULL). */
typedef struct {
    const char *keys[8];
    double vals[8];
    int n;
} opt_table;
static const char *impl_opt;

static rl_status opt_num(void *ctx, const char *key, double *v, int *found) {
    opt_table *t = ctx;
    *found = 0;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->keys[i], key) == 0) {
            *v = t->vals[i];
            *found = 1;
        }
    return RL_OK;
}
static rl_status opt_str(void *ctx, const char *key, const char **v, int *found) {
    (void)ctx;
    *found = impl_opt && strcmp(key, "impl") == 0;
    if (*found) *v = impl_opt;
    return RL_OK;
}
static rl_status opt_bool(void *ctx, const char *key, bool *v, int *found) {
    double d = 0;
    opt_num(ctx, key, &d, found);
    if (*found) *v = d != 0;
    return RL_OK;
}

typedef struct {
    int dir;
    bool peep;
    double fb;
    bool init_state;
    int n_in;
    int64_t F[2];
} config;

enum { T = 4, B = 3, H = 3 };
static const int32_t LENS[B] = {4, 1, 3};

typedef struct {
    rl_layer *l;
    rl_tensor x[2], len, h0, c0, gout, gin[2];
    rl_rng g;
} fixture;

static double urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill_rand(rl_tensor *t, uint64_t *s, double scale) {
    double *p = rl_tensor_data(t);
    for (int64_t i = 0; i < rl_tensor_numel(t); i++)
        p[i] = scale * urand(s);
}

static rl_status make_layer(rl_layer **l, const config *c) {
    opt_table t = {
        {"n_out", "direction", "peepholes", "forget_bias"}, {H, c->dir, c->peep, c->fb}, 4};
    rl_options o = {&t, opt_num, opt_str, opt_bool, NULL};
    return rl_layer_create(l, "lstm", "enc", &o, c->n_in, c->F);
}

/* float64 layer, params randomised (not the init) so peepholes and biases matter */
static void fixture_init(fixture *f, const config *c, rl_dtype dt) {
    memset(f, 0, sizeof *f);
    uint64_t s = 12345;
    CHECK_OK(make_layer(&f->l, c));
    rl_rng_seed(&f->g, 7);
    for (int i = 0; i < f->l->n_params; i++) {
        rl_param *p = &f->l->params[i];
        CHECK_OK(rl_tensor_empty(&p->value, RL_FLOAT64, RL_DEVICE_CPU, p->ndim, p->shape));
        CHECK_OK(rl_tensor_empty(&p->grad, RL_FLOAT64, RL_DEVICE_CPU, p->ndim, p->shape));
        fill_rand(&p->value, &s, 0.6);
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
    }
    for (int k = 0; k < c->n_in; k++) {
        int64_t sh[3] = {T, B, c->F[k]};
        CHECK_OK(rl_tensor_empty(&f->x[k], RL_FLOAT64, RL_DEVICE_CPU, 3, sh));
        fill_rand(&f->x[k], &s, 1.0);
        CHECK_OK(rl_tensor_empty(&f->gin[k], RL_FLOAT64, RL_DEVICE_CPU, 3, sh));
    }
    int64_t bs[1] = {B}, st[2] = {B, H}, os[3] = {T, B, H};
    CHECK_OK(rl_tensor_empty(&f->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    memcpy(rl_tensor_data(&f->len), LENS, sizeof LENS);
    CHECK_OK(rl_tensor_empty(&f->h0, RL_FLOAT64, RL_DEVICE_CPU, 2, st));
    CHECK_OK(rl_tensor_empty(&f->c0, RL_FLOAT64, RL_DEVICE_CPU, 2, st));
    fill_rand(&f->h0, &s, 0.5);
    fill_rand(&f->c0, &s, 0.5);
    CHECK_OK(rl_tensor_empty(&f->gout, RL_FLOAT64, RL_DEVICE_CPU, 3, os));
    fill_rand(&f->gout, &s, 1.0);
    if (c->init_state) CHECK_OK(rl_lstm_set_initial_state(f->l, &f->h0, &f->c0));
    if (dt == RL_FLOAT32) { /* convert everything to float32 */
        for (int i = 0; i < f->l->n_params; i++) {
            rl_param *p = &f->l->params[i];
            rl_tensor v = {0}, gr = {0};
            CHECK_OK(rl_op_to(&v, &p->value, RL_FLOAT32, RL_DEVICE_CPU));
            CHECK_OK(rl_op_to(&gr, &p->grad, RL_FLOAT32, RL_DEVICE_CPU));
            rl_tensor_release(&p->value);
            rl_tensor_release(&p->grad);
            p->value = v;
            p->grad = gr;
        }
        for (int k = 0; k < c->n_in; k++) {
            rl_tensor v = {0};
            CHECK_OK(rl_op_to(&v, &f->x[k], RL_FLOAT32, RL_DEVICE_CPU));
            rl_tensor_release(&f->x[k]);
            f->x[k] = v;
        }
    }
}

static void fixture_free(fixture *f, int n_in) {
    rl_layer_free(f->l);
    for (int k = 0; k < n_in; k++) {
        rl_tensor_release(&f->x[k]);
        rl_tensor_release(&f->gin[k]);
    }
    rl_tensor *ts[] = {&f->len, &f->h0, &f->c0, &f->gout};
    for (int i = 0; i < 4; i++)
        rl_tensor_release(ts[i]);
}

static rl_layer_io make_io(fixture *f, const config *c) {
    rl_layer_io io = {0};
    io.n_in = c->n_in;
    for (int k = 0; k < c->n_in; k++)
        io.in[k] = &f->x[k];
    io.lengths = &f->len;
    return io;
}

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The reference: out (T, B, H), final states hT, cT (B, H). */
static void reference(fixture *f, const config *c, double *out, double *hT, double *cT) {
    const double *W = rl_tensor_data(&f->l->params[0].value);
    const double *U = rl_tensor_data(&f->l->params[1].value);
    const double *bb = rl_tensor_data(&f->l->params[2].value);
    const double *pp[3] = {0};
    for (int k = 0; k < 3 && c->peep; k++)
        pp[k] = rl_tensor_data(&f->l->params[3 + k].value);
    const double *h0 = rl_tensor_data(&f->h0), *c0 = rl_tensor_data(&f->c0);
    for (int b = 0; b < B; b++) {
        double h[H], cc[H];
        for (int j = 0; j < H; j++) {
            h[j] = c->init_state ? h0[b * H + j] : 0.0;
            cc[j] = c->init_state ? c0[b * H + j] : 0.0;
        }
        for (int s = 0; s < T; s++) {
            int t = c->dir > 0 ? s : T - 1 - s;
            if (t >= LENS[b]) {
                for (int j = 0; j < H; j++)
                    out[(t * B + b) * H + j] = 0.0;
                continue;
            }
            double z[4 * H];
            for (int n = 0; n < 4 * H; n++) {
                z[n] = bb[n];
                int row = 0;
                for (int k = 0; k < c->n_in; k++) {
                    const double *x = rl_tensor_data(&f->x[k]);
                    for (int i = 0; i < c->F[k]; i++)
                        z[n] += x[(t * B + b) * c->F[k] + i] * W[(row + i) * 4 * H + n];
                    row += (int)c->F[k];
                }
                for (int i = 0; i < H; i++)
                    z[n] += h[i] * U[i * 4 * H + n];
            }
            for (int j = 0; j < H; j++) {
                double ig = sig(z[j] + (c->peep ? pp[0][j] * cc[j] : 0));
                double fg = sig(z[H + j] + (c->peep ? pp[1][j] * cc[j] : 0));
                double gg = tanh(z[2 * H + j]);
                cc[j] = fg * cc[j] + ig * gg;
                double og = sig(z[3 * H + j] + (c->peep ? pp[2][j] * cc[j] : 0));
                h[j] = og * tanh(cc[j]);
                out[(t * B + b) * H + j] = h[j];
            }
        }
        for (int j = 0; j < H; j++) {
            hT[b * H + j] = h[j];
            cT[b * H + j] = cc[j];
        }
    }
}

static double loss_of(fixture *f, const config *c) {
    rl_layer_io io = make_io(f, c);
    CHECK_OK(f->l->ops->forward(f->l, &io));
    const double *o = rl_tensor_data(&f->l->out), *r = rl_tensor_data(&f->gout);
    double L = 0;
    for (int i = 0; i < T * B * H; i++)
        L += o[i] * r[i];
    return L;
}

static double max_rel = 0;

/* Compares the analytic gradient ga[i] with central differences of the loss in v[i]. */
static void check_grad(fixture *f, const config *c, double *v, const double *ga, int64_t n,
                       const char *what) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double keep = v[i], eps = 1e-5;
        v[i] = keep + eps;
        double lp = loss_of(f, c);
        v[i] = keep - eps;
        double lm = loss_of(f, c);
        v[i] = keep;
        double num = (lp - lm) / (2 * eps);
        double den = fmax(fmax(fabs(num), fabs(ga[i])), 1e-3);
        double rel = fabs(num - ga[i]) / den;
        if (rel > worst) worst = rel;
    }
    if (worst > max_rel) max_rel = worst;
    if (!(worst < 1e-6))
        fprintf(stderr, "gradient of %s (dir %d, peep %d, init %d): rel error %.3g\n", what, c->dir,
                c->peep, c->init_state, worst);
    CHECK(worst < 1e-6);
}

/* The largest difference between the layer's final state and the reference hT, cT. */
static double final_state_err(rl_layer *l, const double *hT, const double *cT) {
    rl_tensor hf = {0}, cf = {0};
    CHECK_OK(rl_lstm_final_state(l, &hf, &cf));
    if (!hf.storage || !cf.storage) return INFINITY;
    double err = 0;
    for (int i = 0; i < B * H; i++) {
        err = fmax(err, fabs(((double *)rl_tensor_data(&hf))[i] - hT[i]));
        err = fmax(err, fabs(((double *)rl_tensor_data(&cf))[i] - cT[i]));
    }
    rl_tensor_release(&hf);
    rl_tensor_release(&cf);
    return err;
}

static void test_config(const config *c) {
    fixture f;
    fixture_init(&f, c, RL_FLOAT64);
    double ref[T * B * H], hT[B * H], cT[B * H];
    reference(&f, c, ref, hT, cT);
    (void)loss_of(&f, c);
    const double *o = rl_tensor_data(&f.l->out);
    double err = 0;
    for (int i = 0; i < T * B * H; i++)
        err = fmax(err, fabs(o[i] - ref[i]));
    CHECK(err < 1e-12);
    int zeros_ok = 1;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++)
                if (t >= LENS[b] && o[(t * B + b) * H + j] != 0.0) zeros_ok = 0;
    CHECK(zeros_ok);
    CHECK(final_state_err(f.l, hT, cT) < 1e-12);

    /* analytic gradients: params += twice over zeroed grads checks the += rule */
    rl_layer_io io = make_io(&f, c);
    rl_tensor *gin[2] = {&f.gin[0], &f.gin[1]};
    for (int rep = 0; rep < 2; rep++) {
        (void)loss_of(&f, c);
        CHECK_OK(f.l->ops->backward(f.l, &io, &f.gout, gin));
    }
    /* backward leaves the states alone: the final state stays readable until the next forward
     * (a carried state is read after the training step) */
    CHECK(final_state_err(f.l, hT, cT) < 1e-12);
    rl_tensor dh0 = {0}, dc0 = {0};
    CHECK_OK(rl_lstm_initial_state_grad(f.l, &dh0, &dc0));
    double gh[B * H], gc[B * H];
    memcpy(gh, rl_tensor_data(&dh0), sizeof gh);
    memcpy(gc, rl_tensor_data(&dc0), sizeof gc);
    rl_tensor_release(&dh0);
    rl_tensor_release(&dc0);
    for (int i = 0; i < f.l->n_params; i++) {
        rl_param *p = &f.l->params[i];
        int64_t n = rl_tensor_numel(&p->grad);
        double *half = malloc((size_t)n * sizeof *half);
        for (int64_t k = 0; k < n; k++)
            half[k] = 0.5 * ((double *)rl_tensor_data(&p->grad))[k];
        check_grad(&f, c, rl_tensor_data(&p->value), half, n, p->name);
        free(half);
    }
    for (int k = 0; k < c->n_in; k++)
        check_grad(&f, c, rl_tensor_data(&f.x[k]), rl_tensor_data(&f.gin[k]),
                   rl_tensor_numel(&f.x[k]), "input");
    if (c->init_state) {
        check_grad(&f, c, rl_tensor_data(&f.h0), gh, B * H, "h0");
        check_grad(&f, c, rl_tensor_data(&f.c0), gc, B * H, "c0");
    }
    fixture_free(&f, c->n_in);

    /* float32 forward close to float64 */
    fixture f32;
    fixture_init(&f32, c, RL_FLOAT32);
    rl_layer_io io32 = make_io(&f32, c);
    CHECK_OK(f32.l->ops->forward(f32.l, &io32));
    const float *o32 = rl_tensor_data(&f32.l->out);
    double e32 = 0;
    for (int i = 0; i < T * B * H; i++)
        e32 = fmax(e32, fabs(o32[i] - ref[i]));
    CHECK(e32 < 1e-5);
    fixture_free(&f32, c->n_in);
}

static void test_errors(void) {
    opt_table t = {{"direction"}, {1}, 1};
    rl_options o = {&t, opt_num, opt_str, opt_bool, NULL};
    int64_t F[1] = {2};
    rl_layer *l = NULL;
    CHECK(rl_layer_create(&l, "lstm", "enc", &o, 1, F) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") && strstr(rl_errmsg(), "n_out"));
    opt_table t2 = {{"n_out", "direction"}, {3, 2}, 2};
    o.ctx = &t2;
    CHECK(rl_layer_create(&l, "lstm", "enc", &o, 1, F) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") && strstr(rl_errmsg(), "direction"));

    config c = {1, false, 0, false, 1, {2, 0}};
    fixture f;
    fixture_init(&f, &c, RL_FLOAT64);
    int64_t bad[2] = {T, 2};
    rl_tensor x2 = {0};
    CHECK_OK(rl_tensor_empty(&x2, RL_FLOAT64, RL_DEVICE_CPU, 2, bad));
    /* the final state before any forward */
    rl_tensor hf = {0}, cf = {0};
    CHECK(rl_lstm_final_state(f.l, &hf, &cf) == RL_EARG && !hf.storage && !cf.storage);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "no forward"));
    rl_layer_io io = make_io(&f, &c);
    io.in[0] = &x2;
    CHECK(f.l->ops->forward(f.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") != NULL);
    rl_tensor_release(&x2);
    int64_t wrongf[3] = {T, B, 5};
    CHECK_OK(rl_tensor_empty(&x2, RL_FLOAT64, RL_DEVICE_CPU, 3, wrongf));
    CHECK(f.l->ops->forward(f.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") != NULL);
    rl_tensor_release(&x2);
    int64_t hs[2] = {B + 1, H};
    rl_tensor h = {0};
    CHECK_OK(rl_tensor_empty(&h, RL_FLOAT64, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_op_fill(&h, 0.0));
    CHECK_OK(rl_lstm_set_initial_state(f.l, &h, NULL));
    io = make_io(&f, &c);
    CHECK(f.l->ops->forward(f.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") && strstr(rl_errmsg(), "initial"));
    CHECK_OK(rl_lstm_set_initial_state(f.l, NULL, NULL));
    CHECK_OK(f.l->ops->forward(f.l, &io));
    rl_tensor_release(&h);
    fixture_free(&f, 1);
}

/* impl = "cudnn": an error naming the layer on CPU tensors (no silent fallback) and together
 * with peepholes (at creation); an unknown impl is an error; impl = "own" is the default. */
static void test_impl(void) {
    int64_t F[1] = {2};
    rl_layer *l = NULL;
    opt_table tp = {{"n_out", "peepholes"}, {H, 1}, 2};
    impl_opt = "cudnn";
    rl_options o = {&tp, opt_num, opt_str, opt_bool, NULL};
    CHECK(rl_layer_create(&l, "lstm", "enc", &o, 1, F) == RL_EARG && !l);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "peepholes") &&
          strstr(rl_errmsg(), "cudnn"));
    opt_table tb = {{"n_out"}, {H}, 1};
    o.ctx = &tb;
    impl_opt = "fast";
    CHECK(rl_layer_create(&l, "lstm", "enc", &o, 1, F) == RL_EARG && !l);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "fast"));

    /* the fixture's layer is rebuilt with impl = "cudnn" and the same params and inputs */
    impl_opt = NULL;
    config c = {1, false, 0, false, 1, {2, 0}};
    fixture f;
    fixture_init(&f, &c, RL_FLOAT64);
    opt_table tc = {{"n_out"}, {H}, 1};
    o.ctx = &tc;
    impl_opt = "cudnn";
    rl_layer *cl = NULL;
    CHECK_OK(rl_layer_create(&cl, "lstm", "enc_cudnn", &o, 1, F));
    if (cl) {
        for (int i = 0; i < cl->n_params; i++) {
            rl_tensor_share(&cl->params[i].value, &f.l->params[i].value);
            rl_tensor_share(&cl->params[i].grad, &f.l->params[i].grad);
        }
        rl_layer_io io = make_io(&f, &c);
        CHECK(cl->ops->forward(cl, &io) == RL_EDEVICE);
        CHECK(strstr(rl_errmsg(), "'enc_cudnn'") && strstr(rl_errmsg(), "cudnn") &&
              strstr(rl_errmsg(), "cpu"));
        CHECK(cl->ops->backward(cl, &io, &f.gout, NULL) == RL_EARG);
        CHECK(strstr(rl_errmsg(), "'enc_cudnn'") != NULL);
        rl_layer_free(cl);
    }
    /* impl = "own" spelled out is the default */
    opt_table to = {{"n_out"}, {H}, 1};
    o.ctx = &to;
    impl_opt = "own";
    CHECK_OK(rl_layer_create(&l, "lstm", "enc_own", &o, 1, F));
    rl_layer_free(l);
    impl_opt = NULL;
    fixture_free(&f, 1);
}

/* Device checks at every entry: a backward whose inputs are not the forward's, a grad_in of
 * another dtype, an initial state of the wrong shape are errors naming the layer, before any
 * buffer is read. (Mixed CPU/CUDA tensors are checked by the same code; the GPU parity suite
 * runs those cases.) */
static void test_entry_checks(void) {
    config c = {-1, false, 0, false, 1, {2, 0}};
    fixture f;
    fixture_init(&f, &c, RL_FLOAT64);
    rl_layer_io io = make_io(&f, &c);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    int64_t xs[3] = {T, B, 2}, xs2[3] = {T - 1, B, 2};
    rl_tensor x32 = {0}, xshort = {0};
    CHECK_OK(rl_tensor_empty(&x32, RL_FLOAT32, RL_DEVICE_CPU, 3, xs));
    CHECK_OK(rl_tensor_empty(&xshort, RL_FLOAT64, RL_DEVICE_CPU, 3, xs2));
    rl_layer_io bad = io;
    bad.in[0] = &xshort;
    CHECK(f.l->ops->backward(f.l, &bad, &f.gout, NULL) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "backward"));
    rl_tensor *gin[1] = {&x32};
    CHECK(f.l->ops->backward(f.l, &io, &f.gout, gin) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "grad_in"));
    /* after the rejected calls the forward's buffers are intact: a real backward still works */
    gin[0] = &f.gin[0];
    CHECK_OK(f.l->ops->backward(f.l, &io, &f.gout, gin));
    rl_tensor_release(&x32);
    rl_tensor_release(&xshort);
    fixture_free(&f, 1);
}

/* the declared parameters, their init kinds and layout */
static void test_params(void) {
    config c = {-1, true, 1.0, false, 2, {2, 3}};
    rl_layer *l = NULL;
    CHECK_OK(make_layer(&l, &c));
    if (!l) return;
    CHECK(l->n_out == H && l->n_params == 6);
    CHECK(strcmp(l->params[0].name, "W") == 0 && l->params[0].shape[0] == 5 &&
          l->params[0].shape[1] == 4 * H && l->params[0].init == RL_INIT_GLOROT);
    CHECK(strcmp(l->params[1].name, "U") == 0 && l->params[1].init == RL_INIT_ORTHOGONAL);
    CHECK(strcmp(l->params[2].name, "b") == 0 && l->params[2].shape[0] == 4 * H);
    CHECK(strcmp(l->params[5].name, "p_o") == 0 && l->params[5].shape[0] == H);
    rl_layer_free(l);
}

/* A float tensor of the given shape (3-D with s2 > 0, else 2-D or 1-D), uniform in
 * [-scale, scale). */
static void rand_tensor(rl_tensor *t, rl_dtype dt, int ndim, const int64_t *shape, uint64_t *s,
                        double scale) {
    CHECK_OK(rl_tensor_empty(t, RL_FLOAT64, RL_DEVICE_CPU, ndim, shape));
    fill_rand(t, s, scale);
    if (dt == RL_FLOAT32) {
        rl_tensor v = {0};
        CHECK_OK(rl_op_to(&v, t, RL_FLOAT32, RL_DEVICE_CPU));
        rl_tensor_release(t);
        *t = v;
    }
}

/* max |a - b| / (1 + max |b|) over two tensors of any float dtype and the same size */
static double rel_diff(const rl_tensor *a, const rl_tensor *b) {
    rl_tensor a64 = {0}, b64 = {0};
    CHECK_OK(rl_op_to(&a64, a, RL_FLOAT64, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&b64, b, RL_FLOAT64, RL_DEVICE_CPU));
    const double *x = rl_tensor_data(&a64), *y = rl_tensor_data(&b64);
    double d = 0, m = 0;
    for (int64_t i = 0; i < rl_tensor_numel(&b64); i++) {
        d = fmax(d, fabs(x[i] - y[i]));
        m = fmax(m, fabs(y[i]));
    }
    rl_tensor_release(&a64);
    rl_tensor_release(&b64);
    return d / (1.0 + m);
}

/* The packed small-M GEMM against rl_op_gemm (BLAS) on odd sizes: both packings, with and
 * without accumulation, padded leading dimensions whose padding must stay untouched, on one
 * thread and split across two. */
static void test_packed_gemm(void) {
    static const int64_t sizes[][3] = {
        {1, 1, 1},       {3, 5, 47},    {8, 7, 48},     {9, 13, 49},    {17, 33, 100},
        {16, 300, 1000}, {20, 650, 97}, {64, 128, 512}, {5, 2048, 130}, {6, 129, 72},
        {2, 257, 30},    {7, 128, 24},  {11, 1, 25},    {4, 19, 81}};
    int saved = rl_blas_get_threads();
    uint64_t seed = 99;
    double worst = 0;
    bool pad_ok = true;
    for (int threads = 1; threads <= 2; threads++) {
        rl_blas_set_threads(threads);
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int trans = 0; trans <= 1; trans++)
                for (int acc = 0; acc <= 1; acc++) {
                    int64_t m = sizes[si][0], k = sizes[si][1], n = sizes[si][2];
                    int64_t as[2] = {m, k + 2}, bs[2] = {trans ? n : k, trans ? k : n},
                            cs[2] = {m, n + 3};
                    rl_tensor a = {0}, b = {0}, c = {0}, ref = {0}, av = {0};
                    rand_tensor(&a, RL_FLOAT32, 2, as, &seed, 1.0);
                    rand_tensor(&b, RL_FLOAT32, 2, bs, &seed, 1.0);
                    rand_tensor(&c, RL_FLOAT32, 2, cs, &seed, 1.0);
                    CHECK_OK(rl_tensor_narrow(&av, &a, 1, 0, k));
                    CHECK_OK(rl_tensor_empty(&ref, RL_FLOAT32, RL_DEVICE_CPU, 2, cs));
                    CHECK_OK(rl_op_copy(&ref, &c));
                    rl_tensor rv = {0};
                    CHECK_OK(rl_tensor_narrow(&rv, &ref, 1, 0, n));
                    CHECK_OK(rl_op_gemm(&rv, &av, &b, false, trans, 1.0, acc ? 1.0 : 0.0));
                    float *packed = malloc((size_t)rl_gemm_packed_size(k, n) * sizeof *packed);
                    rl_gemm_pack_f32(packed, rl_tensor_data(&b), trans ? k : n, trans, k, n);
                    rl_gemm_packed_f32(m, n, k, rl_tensor_data(&a), k + 2, packed, acc,
                                       rl_tensor_data(&c), n + 3);
                    free(packed);
                    const float *cp = rl_tensor_data(&c), *rp = rl_tensor_data(&ref);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n + 3; j++) {
                            float x = cp[i * (n + 3) + j], y = rp[i * (n + 3) + j];
                            if (j >= n)
                                pad_ok = pad_ok && x == y;
                            else
                                worst = fmax(worst, fabs(x - y) / (1.0 + fabs(y)) / (double)k);
                        }
                    rl_tensor *ts[] = {&a, &b, &c, &ref, &av, &rv};
                    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
                        rl_tensor_release(ts[i]);
                }
    }
    rl_blas_set_threads(saved);
    printf("packed gemm (%s): worst error per k term %.3g\n", rl_cpu_level_name(rl_cpu_level_get()),
           worst);
    CHECK(worst < 1e-6);
    CHECK(pad_ok);
}

/* A float32 layer large enough for the packed, two-thread recurrent products (several
 * panels, a partial last one, B not a multiple of the row block), forward and backward,
 * against the float64 layer (BLAS, checked above against the reference and by central
 * differences) with the same weights and inputs; both directions, ragged lengths, with and
 * without peepholes. The float32 layer runs on 2 threads (the batch's rows in two parts) and
 * on 1 (BLAS's own results may differ in the last bits between thread counts). */
static void test_float32_large(void) {
    enum { TL = 9, BL = 19, HL = 100, FL = 37 }; /* T B 4H >= 2^16: the bias sums run in parts */
    int saved = rl_blas_get_threads();
    for (int peep = 0; peep <= 1; peep++)
        for (int dir = -1; dir <= 1; dir += 2) {
            rl_layer *l[3] = {NULL, NULL, NULL};
            rl_tensor x[3] = {{0}}, gout[3] = {{0}}, gin[3] = {{0}}, len = {0};
            int64_t xs[3] = {TL, BL, FL}, os[3] = {TL, BL, HL}, bs[1] = {BL}, F[1] = {FL};
            CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, bs));
            int32_t *lp = rl_tensor_data(&len);
            for (int b = 0; b < BL; b++)
                lp[b] = b % 4 == 1 ? 1 : TL - b % 3;
            for (int v = 0; v < 3; v++) {
                rl_dtype dt = v ? RL_FLOAT32 : RL_FLOAT64;
                rl_blas_set_threads(v == 2 ? 1 : 2);
                uint64_t s = 4242;
                opt_table t = {{"n_out", "direction", "peepholes"}, {HL, dir, peep}, 3};
                rl_options o = {&t, opt_num, opt_str, opt_bool, NULL};
                CHECK_OK(rl_layer_create(&l[v], "lstm", "big", &o, 1, F));
                if (!l[v]) return;
                for (int i = 0; i < l[v]->n_params; i++) {
                    rl_param *p = &l[v]->params[i];
                    rand_tensor(&p->value, dt, p->ndim, p->shape, &s, 0.15);
                    CHECK_OK(rl_tensor_empty(&p->grad, dt, RL_DEVICE_CPU, p->ndim, p->shape));
                    CHECK_OK(rl_op_fill(&p->grad, 0.0));
                }
                rand_tensor(&x[v], dt, 3, xs, &s, 1.0);
                rand_tensor(&gout[v], dt, 3, os, &s, 1.0);
                CHECK_OK(rl_tensor_empty(&gin[v], dt, RL_DEVICE_CPU, 3, xs));
                rl_layer_io io = {0};
                io.n_in = 1;
                io.in[0] = &x[v];
                io.lengths = &len;
                rl_tensor *gi[1] = {&gin[v]};
                CHECK_OK(l[v]->ops->forward(l[v], &io));
                CHECK_OK(l[v]->ops->backward(l[v], &io, &gout[v], gi));
            }
            double e[2] = {0, 0}; /* float32 on 2 threads, on 1 thread, vs float64 */
            for (int v = 1; v < 3; v++) {
                e[v - 1] = fmax(rel_diff(&l[v]->out, &l[0]->out), rel_diff(&gin[v], &gin[0]));
                for (int i = 0; i < l[0]->n_params; i++)
                    e[v - 1] =
                        fmax(e[v - 1], rel_diff(&l[v]->params[i].grad, &l[0]->params[i].grad));
            }
            printf("float32 layer (%d x %d x %d, direction %d, peepholes %d) vs float64: %.3g on "
                   "2 threads, %.3g on 1\n",
                   TL, BL, HL, dir, peep, e[0], e[1]);
            CHECK(e[0] < 1e-4 && e[1] < 1e-4);
            for (int v = 0; v < 3; v++) {
                rl_layer_free(l[v]);
                rl_tensor_release(&x[v]);
                rl_tensor_release(&gout[v]);
                rl_tensor_release(&gin[v]);
            }
            rl_tensor_release(&len);
        }
    rl_blas_set_threads(saved);
}

/* The bias and peephole sums over all frames split by columns over 2 threads: the same bits as
 * on 1 thread, and the float64 sums of the same data within rounding. */
static void test_param_grads_split(void) {
    enum { R = 300, HG = 70 }; /* R 4H >= 2^16: parts; H not a multiple of 16 */
    int saved = rl_blas_get_threads();
    float *dz = malloc(sizeof(float) * R * 4 * HG), *cp = malloc(sizeof(float) * R * HG),
          *c = malloc(sizeof(float) * R * HG), *g[2];
    double *ref = calloc(7 * HG, sizeof(double));
    uint64_t s = 99;
    for (int64_t i = 0; i < R * 4 * HG; i++)
        dz[i] = (float)(urand(&s) - 0.5);
    for (int64_t i = 0; i < R * HG; i++) {
        cp[i] = (float)(urand(&s) - 0.5);
        c[i] = (float)(urand(&s) - 0.5);
    }
    for (int v = 0; v < 2; v++) {
        g[v] = calloc(7 * HG, sizeof(float));
        float *dp[3] = {g[v] + 4 * HG, g[v] + 5 * HG, g[v] + 6 * HG};
        rl_blas_set_threads(v + 1);
        rl_lstm_cpu_param_grads_f32(R, HG, dz, cp, c, g[v], dp);
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < HG; j++) {
            for (int k = 0; k < 4; k++)
                ref[k * HG + j] += dz[r * 4 * HG + k * HG + j];
            ref[4 * HG + j] += (double)dz[r * 4 * HG + j] * cp[r * HG + j];
            ref[5 * HG + j] += (double)dz[r * 4 * HG + HG + j] * cp[r * HG + j];
            ref[6 * HG + j] += (double)dz[r * 4 * HG + 3 * HG + j] * c[r * HG + j];
        }
    double err = 0;
    for (int64_t i = 0; i < 7 * HG; i++)
        err = fmax(err, fabs(g[0][i] - ref[i]) / (1.0 + fabs(ref[i])));
    printf("param grads split: rel err %.3g\n", err);
    CHECK(err < 1e-5); /* R float32 additions: a few hundred units of rounding at most */
    CHECK(memcmp(g[0], g[1], sizeof(float) * 7 * HG) == 0);
    rl_blas_set_threads(saved);
    free(dz), free(cp), free(c), free(g[0]), free(g[1]), free(ref);
}

/* The float32 fast paths (packed GEMM, fused pointwise passes) at every level this CPU has,
 * each against the reference; then the level's error messages. */
static void test_cpu_levels(void) {
    rl_cpu_level best = rl_cpu_level_supported();
    for (int lv = RL_CPU_GENERIC; lv <= (int)best; lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        CHECK(rl_gemm_packed_fast() == (lv >= RL_CPU_AVX2));
        test_packed_gemm();
        test_float32_large();
        test_param_grads_split();
    }
    CHECK_OK(rl_cpu_level_set(best));
    if (best < RL_CPU_AVX512) {
        CHECK(rl_cpu_level_set(RL_CPU_AVX512) == RL_EARG);
        CHECK(strstr(rl_errmsg(), "avx512 is not supported") != NULL);
    }
    CHECK(rl_cpu_level_set((rl_cpu_level)7) == RL_EARG);
    CHECK(rl_cpu_level_get() == best);
    setenv("RL_CPU_LEVEL", "avx3", 1);
    CHECK(rl_cpu_level_check_env() == RL_EARG);
    CHECK(strstr(rl_errmsg(), "RL_CPU_LEVEL=avx3: expected generic, avx2 or avx512") != NULL);
    setenv("RL_CPU_LEVEL", "generic", 1);
    CHECK_OK(rl_cpu_level_check_env());
    unsetenv("RL_CPU_LEVEL");
}

int main(void) {
    rl_ops_init();
    for (int dir = -1; dir <= 1; dir += 2)
        for (int peep = 0; peep <= 1; peep++)
            for (int init = 0; init <= 1; init++) {
                config c = {dir, peep, peep ? 0.7 : 0.0, init, 2, {2, 3}};
                test_config(&c);
            }
    config one = {1, true, 0.0, true, 1, {4, 0}};
    test_config(&one);
    test_errors();
    test_impl();
    test_entry_checks();
    test_params();
    test_cpu_levels();
    printf("max gradient rel error %.3g\n", max_rel);
    TEST_MAIN_END();
}
