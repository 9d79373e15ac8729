/* Tests of the built-in non-recurrent layers (linear, activation, dropout, combine, window,
 * softmax) and the losses: forward against float64 references written here with plain loops,
 * at T = 5, B = 3 with ragged lengths {5, 2, 3}; central-difference gradient checks of every
 * input and parameter (gradcheck.h), including that padded frames get exactly zero gradient
 * and do not change the loss; the CE loss, frame errors and its gradient; dropout statistics;
 * errors that name the layer; no reallocation for a second batch of the same shape. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/tensor.h"
#include "../../kernels/cpu/gemm_bf16.h"
#include "../../kernels/ops.h"
#include "../../kernels/softmax_ce.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"
#include "../../layers/loss.h"
#include "check.h"
#include "gradcheck.h"

enum { T = 5, B = 3 };
static const int LENS[B] = {5, 2, 3};

/* A layer with random inputs (padded frames included) and bound, initialised parameters. */
typedef struct {
    rl_layer *l;
    int n_in;
    rl_tensor in[4];
    rl_tensor *pin[4];
    rl_tensor len, pv, pg;
} fixture;

static void fx_free(fixture *f) {
    rl_layer_free(f->l);
    for (int i = 0; i < f->n_in; i++)
        rl_tensor_release(&f->in[i]);
    rl_tensor_release(&f->len);
    rl_tensor_release(&f->pv);
    rl_tensor_release(&f->pg);
    memset(f, 0, sizeof *f);
}

static bool fx_make(fixture *f, const char *cls, const char *name, gc_opts *o, int n_in,
                    const int64_t *dims, rl_dtype dt, uint64_t seed) {
    memset(f, 0, sizeof *f);
    rl_options opts = gc_options(o);
    rl_status st = rl_layer_create(&f->l, cls, name, &opts, n_in, dims);
    CHECK_OK(st);
    if (st != RL_OK) return false;
    rl_rng g;
    rl_rng_seed(&g, seed);
    f->n_in = n_in;
    for (int i = 0; i < n_in && st == RL_OK; i++) {
        st = gc_random_input(&f->in[i], dt, T, B, dims[i], &g);
        f->pin[i] = &f->in[i];
    }
    if (st == RL_OK) st = gc_lengths(&f->len, B, LENS);
    if (st == RL_OK) st = gc_bind_params_nonzero(f->l, dt, &g, &f->pv, &f->pg);
    CHECK_OK(st);
    if (st != RL_OK) fx_free(f);
    return st == RL_OK;
}

static rl_layer_io fx_io(fixture *f, bool train, const rl_tensor *target, rl_rng *g) {
    rl_layer_io io;
    memset(&io, 0, sizeof io);
    io.n_in = f->n_in;
    for (int i = 0; i < f->n_in; i++)
        io.in[i] = &f->in[i];
    io.lengths = &f->len;
    io.target = target;
    io.train = train;
    io.rng = g;
    return io;
}

static double get3(const rl_tensor *t, int64_t a, int64_t b, int64_t c) {
    int64_t idx[3] = {a, b, c};
    return rl_tensor_get(t, idx);
}

static double param_at(const rl_layer *l, const char *name, int64_t i, int64_t j) {
    for (int p = 0; p < l->n_params; p++)
        if (strcmp(l->params[p].name, name) == 0) {
            int64_t idx[2] = {i, j};
            if (l->params[p].ndim == 1) idx[0] = j;
            return rl_tensor_get(&l->params[p].value, idx);
        }
    return NAN;
}

/* x[t, b, :] of the concatenated inputs at feature f */
static double xcat(const fixture *f, int64_t t, int64_t b, int64_t k) {
    for (int i = 0; i < f->n_in; i++) {
        if (k < f->l->in_dims[i]) return get3(&f->in[i], t, b, k);
        k -= f->l->in_dims[i];
    }
    return NAN;
}

static int64_t fan_in(const rl_layer *l) {
    int64_t n = 0;
    for (int i = 0; i < l->n_in; i++)
        n += l->in_dims[i];
    return n;
}

/* the affine map of linear/softmax by loops */
static double ref_affine(const fixture *f, int64_t t, int64_t b, int64_t o) {
    double s = f->l->n_params > 1 ? param_at(f->l, "b", 0, o) : 0.0;
    for (int64_t k = 0; k < fan_in(f->l); k++)
        s += xcat(f, t, b, k) * param_at(f->l, "W", k, o);
    return s;
}

static double ref_act(const char *a, double x) {
    if (!strcmp(a, "identity")) return x;
    if (!strcmp(a, "tanh")) return tanh(x);
    if (!strcmp(a, "sigmoid")) return 1.0 / (1.0 + exp(-x));
    if (!strcmp(a, "relu")) return x > 0 ? x : 0;
    if (!strcmp(a, "elu")) return x > 0 ? x : exp(x) - 1.0;
    if (!strcmp(a, "softplus")) return log(1.0 + exp(x));
    if (!strcmp(a, "exp")) return exp(x);
    if (!strcmp(a, "square")) return x * x;
    return NAN;
}

static const char *const ACTS[] = {"identity", "tanh",     "sigmoid", "relu",
                                   "elu",      "softplus", "exp",     "square"};

/* The gradient check with the tolerances of the brief: max rel < 1e-6, padding exactly 0. */
static void run_gradcheck(const char *what, fixture *f, bool train, const rl_tensor *target) {
    gc_config cfg = {1e-6, 0, target, train, 7};
    gc_report rep;
    CHECK_OK(gc_check(f->l, f->n_in, f->pin, &f->len, &cfg, &rep));
    gc_print(what, &rep);
    CHECK(rep.n_checked > 0);
    CHECK(rep.max_rel < 1e-6);
    CHECK(rep.max_pad_analytic == 0.0);
    CHECK(rep.max_pad_numeric < 1e-12);
}

static void test_linear(void) {
    for (size_t a = 0; a < sizeof ACTS / sizeof ACTS[0]; a++) {
        gc_opts o = {0};
        gc_opt_num(&o, "n_out", 4);
        gc_opt_str(&o, "activation", ACTS[a]);
        int64_t dims[2] = {3, 2};
        fixture f;
        if (!fx_make(&f, "linear", "lin", &o, 2, dims, RL_FLOAT64, 10 + a)) continue;
        CHECK(f.l->n_out == 4 && f.l->n_params == 2);
        CHECK(f.l->params[0].shape[0] == 5 && f.l->params[0].shape[1] == 4);
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        double err = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < LENS[b]; t++)
                for (int64_t o2 = 0; o2 < 4; o2++)
                    err = fmax(err, fabs(get3(&f.l->out, t, b, o2) -
                                         ref_act(ACTS[a], ref_affine(&f, t, b, o2))));
        CHECK(err < 1e-12);
        char what[64];
        snprintf(what, sizeof what, "linear %s", ACTS[a]);
        run_gradcheck(what, &f, false, NULL);
        fx_free(&f);
    }
    /* one input, no bias */
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 3);
    gc_opt_bool(&o, "with_bias", false);
    int64_t dims[1] = {4};
    fixture f;
    if (fx_make(&f, "linear", "lin_nobias", &o, 1, dims, RL_FLOAT64, 3)) {
        CHECK(f.l->n_params == 1 && rl_layer_num_params(f.l) == 12);
        CHECK(f.l->params[0].init == RL_INIT_GLOROT && f.l->params[0].fan_in == 4 &&
              f.l->params[0].fan_out == 3);
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        CHECK_NEAR(get3(&f.l->out, 1, 2, 1), ref_affine(&f, 1, 2, 1), 1e-12);
        run_gradcheck("linear no bias", &f, false, NULL);
        fx_free(&f);
    }
}

/* float32 gives the float64 result to float32 precision */
static void test_float32(void) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 4);
    gc_opt_str(&o, "activation", "tanh");
    int64_t dims[2] = {3, 2};
    fixture f64, f32;
    if (!fx_make(&f64, "linear", "lin", &o, 2, dims, RL_FLOAT64, 5)) return;
    if (!fx_make(&f32, "linear", "lin", &o, 2, dims, RL_FLOAT32, 5)) {
        fx_free(&f64);
        return;
    }
    CHECK_OK(rl_op_copy(&f32.pv, &f64.pv));
    for (int i = 0; i < 2; i++)
        CHECK_OK(rl_op_copy(&f32.in[i], &f64.in[i]));
    rl_layer_io io64 = fx_io(&f64, false, NULL, NULL), io32 = fx_io(&f32, false, NULL, NULL);
    CHECK_OK(f64.l->ops->forward(f64.l, &io64));
    CHECK_OK(f32.l->ops->forward(f32.l, &io32));
    CHECK(f32.l->out.dtype == RL_FLOAT32);
    double err = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < 4; k++)
                err = fmax(err, fabs(get3(&f32.l->out, t, b, k) - get3(&f64.l->out, t, b, k)));
    CHECK(err < 1e-5);
    fx_free(&f32);
    fx_free(&f64);
}

static void test_activation(void) {
    for (size_t a = 0; a < sizeof ACTS / sizeof ACTS[0]; a++) {
        gc_opts o = {0};
        gc_opt_str(&o, "activation", ACTS[a]);
        int64_t dims[2] = {2, 3};
        fixture f;
        if (!fx_make(&f, "activation", "act", &o, 2, dims, RL_FLOAT64, 20 + a)) continue;
        CHECK(f.l->n_out == 5 && f.l->n_params == 0);
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        double err = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < LENS[b]; t++)
                for (int64_t k = 0; k < 5; k++)
                    err = fmax(
                        err, fabs(get3(&f.l->out, t, b, k) - ref_act(ACTS[a], xcat(&f, t, b, k))));
        CHECK(err < 1e-13);
        char what[64];
        snprintf(what, sizeof what, "activation %s", ACTS[a]);
        run_gradcheck(what, &f, false, NULL);
        fx_free(&f);
    }
}

static void test_dropout(void) {
    gc_opts o = {0};
    gc_opt_num(&o, "dropout", 0.3);
    int64_t dims[1] = {200};
    fixture f;
    if (!fx_make(&f, "dropout", "drop", &o, 1, dims, RL_FLOAT64, 30)) return;
    rl_rng g;
    rl_rng_seed(&g, 99);
    rl_layer_io io = fx_io(&f, true, NULL, &g);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    int64_t n = 0, dropped = 0, bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < 200; k++) {
                double x = get3(&f.in[0], t, b, k), y = get3(&f.l->out, t, b, k);
                n++;
                if (y == 0)
                    dropped++;
                else if (fabs(y - x / 0.7) > 1e-12)
                    bad++;
            }
    double frac = (double)dropped / (double)n; /* n = 3000: sd 0.0084 */
    CHECK(fabs(frac - 0.3) < 0.035);
    CHECK(bad == 0);
    /* backward: grad_in = grad_out * mask, the mask being out / x */
    rl_tensor go = {0}, gi = {0};
    CHECK_OK(rl_tensor_empty_like(&go, &f.l->out));
    CHECK_OK(rl_tensor_empty_like(&gi, &f.in[0]));
    CHECK_OK(rl_op_fill(&go, 2.0));
    rl_tensor *gp[1] = {&gi};
    CHECK_OK(f.l->ops->backward(f.l, &io, &go, gp));
    double err = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < 200; k++)
                err = fmax(err, fabs(get3(&gi, t, b, k) -
                                     2.0 * get3(&f.l->out, t, b, k) / get3(&f.in[0], t, b, k)));
    CHECK(err < 1e-12);
    /* a second draw differs; the same generator state gives the same mask */
    rl_rng keep = g;
    double s1, s2, s3;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK_OK(rl_op_reduce_all(&s1, NULL, &f.l->out, RL_RED_SUM));
    g = keep;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK_OK(rl_op_reduce_all(&s2, NULL, &f.l->out, RL_RED_SUM));
    CHECK(s1 == s2);
    rl_rng_seed(&g, 100);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK_OK(rl_op_reduce_all(&s3, NULL, &f.l->out, RL_RED_SUM));
    CHECK(s3 != s1);
    /* evaluation: identity, forward and backward */
    io.train = false;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    err = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < 200; k++)
                err = fmax(err, fabs(get3(&f.l->out, t, b, k) - get3(&f.in[0], t, b, k)));
    CHECK(err == 0);
    CHECK_OK(f.l->ops->backward(f.l, &io, &go, gp));
    double gsum;
    CHECK_OK(rl_op_reduce_all(&gsum, NULL, &gi, RL_RED_SUM));
    CHECK_NEAR(gsum, 2.0 * T * B * 200, 1e-9);
    rl_tensor_release(&go);
    rl_tensor_release(&gi);
    fx_free(&f);

    /* gradient check in training, two inputs (fixed mask) */
    gc_opts o2 = {0};
    gc_opt_num(&o2, "dropout", 0.5);
    int64_t dims2[2] = {3, 2};
    if (fx_make(&f, "dropout", "drop2", &o2, 2, dims2, RL_FLOAT64, 31)) {
        run_gradcheck("dropout train", &f, true, NULL);
        run_gradcheck("dropout eval", &f, false, NULL);
        fx_free(&f);
    }
}

static void test_combine(void) {
    const char *kinds[3] = {"add", "concat", "mul"};
    int64_t dims_same[3] = {3, 3, 3}, dims_cat[3] = {2, 3, 1};
    int n_ins[3] = {3, 3, 2};
    for (int k = 0; k < 3; k++) {
        gc_opts o = {0};
        gc_opt_str(&o, "kind", kinds[k]);
        const int64_t *dims = k == 1 ? dims_cat : dims_same;
        fixture f;
        if (!fx_make(&f, "combine", "comb", &o, n_ins[k], dims, RL_FLOAT64, 40 + k)) continue;
        CHECK(f.l->n_out == (k == 1 ? 6 : 3));
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        double err = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < f.l->n_out; j++) {
                    double r;
                    if (k == 0)
                        r = get3(&f.in[0], t, b, j) + get3(&f.in[1], t, b, j) +
                            get3(&f.in[2], t, b, j);
                    else if (k == 1)
                        r = xcat(&f, t, b, j);
                    else
                        r = get3(&f.in[0], t, b, j) * get3(&f.in[1], t, b, j);
                    err = fmax(err, fabs(get3(&f.l->out, t, b, j) - r));
                }
        CHECK(err < 1e-14);
        char what[64];
        snprintf(what, sizeof what, "combine %s", kinds[k]);
        run_gradcheck(what, &f, false, NULL);
        fx_free(&f);
    }
}

/* window reference: zeros outside each sequence's own frames and on padded output frames */
static double ref_window(const fixture *f, int64_t L, int64_t F, int64_t t, int64_t b, int64_t j) {
    int64_t k = j / F, s = t - L + k;
    if (t >= LENS[b] || s < 0 || s >= LENS[b]) return 0.0;
    return xcat(f, s, b, j % F);
}

static void test_window(void) {
    struct {
        int64_t size, left, right;
    } cases[4] = {{3, 1, 1}, {0, 2, 0}, {0, 0, 2}, {5, 2, 2}};
    for (int c = 0; c < 4; c++) {
        gc_opts o = {0};
        if (cases[c].size)
            gc_opt_num(&o, "window", (double)cases[c].size);
        else {
            if (cases[c].left) gc_opt_num(&o, "left", (double)cases[c].left);
            if (cases[c].right) gc_opt_num(&o, "right", (double)cases[c].right);
        }
        int64_t dims[2] = {2, 1};
        fixture f;
        if (!fx_make(&f, "window", "win", &o, 2, dims, RL_FLOAT64, 50 + c)) continue;
        int64_t W = cases[c].left + 1 + cases[c].right;
        CHECK(f.l->n_out == 3 * W);
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        double err = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < f.l->n_out; j++)
                    err = fmax(err, fabs(get3(&f.l->out, t, b, j) -
                                         ref_window(&f, cases[c].left, 3, t, b, j)));
        CHECK(err == 0);
        char what[64];
        snprintf(what, sizeof what, "window L=%d R=%d", (int)cases[c].left, (int)cases[c].right);
        run_gradcheck(what, &f, false, NULL);
        fx_free(&f);
    }
}

static double ref_softmax(const fixture *f, int64_t t, int64_t b, int64_t o, int64_t C) {
    double m = -INFINITY, s = 0, z[16];
    for (int64_t c = 0; c < C; c++) {
        z[c] = ref_affine(f, t, b, c);
        m = fmax(m, z[c]);
    }
    for (int64_t c = 0; c < C; c++)
        s += exp(z[c] - m);
    return exp(z[o] - m) / s;
}

static void test_softmax(void) {
    int64_t dims[2] = {3, 2}, C = 4;
    /* plain softmax output: the Jacobian path */
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", (double)C);
    fixture f;
    if (fx_make(&f, "softmax", "sm", &o, 2, dims, RL_FLOAT64, 60)) {
        CHECK(!f.l->is_loss);
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        CHECK_OK(f.l->ops->forward(f.l, &io));
        double err = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < LENS[b]; t++)
                for (int64_t c = 0; c < C; c++)
                    err = fmax(err, fabs(get3(&f.l->out, t, b, c) - ref_softmax(&f, t, b, c, C)));
        CHECK(err < 1e-14);
        run_gradcheck("softmax (no loss)", &f, false, NULL);
        fx_free(&f);
    }

    /* cross entropy */
    gc_opts oc = {0};
    gc_opt_num(&oc, "n_out", (double)C);
    gc_opt_str(&oc, "loss", "ce");
    if (!fx_make(&f, "softmax", "output", &oc, 2, dims, RL_FLOAT64, 61)) return;
    CHECK(f.l->is_loss);
    rl_tensor tgt = {0};
    int64_t tshape[2] = {T, B};
    CHECK_OK(rl_tensor_empty(&tgt, RL_INT32, RL_DEVICE_CPU, 2, tshape));
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            int64_t idx[2] = {t, b};
            /* targets on padded frames, in range or not, must be ignored */
            rl_tensor_set(&tgt, idx,
                          t < LENS[b] ? (double)((t * 3 + b) % C)
                                      : (t == 3 ? 1 : (t % 2 ? 99 : -5)));
        }
    rl_layer_io io = fx_io(&f, true, &tgt, NULL);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    double loss = 0, errors = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < LENS[b]; t++) {
            int64_t y = (t * 3 + b) % C, best = 0;
            loss -= log(ref_softmax(&f, t, b, y, C));
            for (int64_t c = 1; c < C; c++)
                if (ref_softmax(&f, t, b, c, C) > ref_softmax(&f, t, b, best, C)) best = c;
            errors += best != y;
        }
    CHECK_NEAR(io.loss, loss, 1e-12);
    CHECK(io.n_errors == errors);
    CHECK(io.n_frames == 10);
    /* dz from the loss is p - onehot: d loss / d b[c] = sum over valid frames of that */
    rl_tensor gi[2] = {{0}, {0}};
    rl_tensor *gp[2] = {&gi[0], &gi[1]};
    for (int i = 0; i < 2; i++)
        CHECK_OK(rl_tensor_empty_like(&gi[i], &f.in[i]));
    CHECK_OK(rl_op_fill(&f.pg, 0.0));
    CHECK_OK(f.l->ops->backward(f.l, &io, NULL, gp));
    for (int64_t c = 0; c < C; c++) {
        double r = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < LENS[b]; t++)
                r += ref_softmax(&f, t, b, c, C) - (c == (t * 3 + b) % C);
        int64_t cc = c;
        CHECK_NEAR(rl_tensor_get(&f.l->params[1].grad, &cc), r, 1e-12);
    }
    /* a zero grad_out adds nothing to the loss gradient */
    double s_null, s_zero;
    CHECK_OK(rl_op_reduce_all(&s_null, NULL, &gi[0], RL_RED_NORM));
    rl_tensor zero = {0};
    CHECK_OK(rl_tensor_empty_like(&zero, &f.l->out));
    CHECK_OK(rl_op_fill(&zero, 0.0));
    CHECK_OK(f.l->ops->backward(f.l, &io, &zero, gp));
    CHECK_OK(rl_op_reduce_all(&s_zero, NULL, &gi[0], RL_RED_NORM));
    CHECK_NEAR(s_zero, s_null, 1e-14);
    CHECK(s_null > 0);
    rl_tensor_release(&zero);
    run_gradcheck("softmax ce", &f, true, &tgt);

    /* a target out of range on a valid frame names the layer, the frame and the value */
    int64_t bad[2] = {1, 2};
    rl_tensor_set(&tgt, bad, 4);
    rl_status st = f.l->ops->forward(f.l, &io);
    CHECK(st == RL_EINDEX);
    CHECK(strstr(rl_errmsg(), "'output'") && strstr(rl_errmsg(), "target 4") &&
          strstr(rl_errmsg(), "frame 2 of sequence 3"));
    rl_tensor_set(&tgt, bad, 1);
    /* a wrong target shape */
    rl_tensor tgt_bad = {0};
    int64_t tb[2] = {T, B + 1};
    CHECK_OK(rl_tensor_empty(&tgt_bad, RL_INT32, RL_DEVICE_CPU, 2, tb));
    io.target = &tgt_bad;
    CHECK(f.l->ops->forward(f.l, &io) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'output'") != NULL);
    io.target = &tgt;
    /* Inf in a valid input frame: no crash, the loss reports it */
    int64_t at[3] = {0, 0, 0};
    rl_tensor_set(&f.in[0], at, INFINITY);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK(!isfinite(io.loss));
    /* backward from the loss without a target */
    io.target = NULL;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK(f.l->ops->backward(f.l, &io, NULL, gp) != RL_OK);
    CHECK(strstr(rl_errmsg(), "'output'") != NULL);
    for (int i = 0; i < 2; i++)
        rl_tensor_release(&gi[i]);
    rl_tensor_release(&tgt_bad);
    rl_tensor_release(&tgt);
    fx_free(&f);
}

/* A CE softmax in a bf16 network writes dz only rounded, once (rl_ce_grad_cpu_bf16), for both
 * products: its gradients must have the bits of the float32 dz's products, each rounding it
 * (rl_gemm_bf16, as rl_op_gemm runs them under a bf16 context); with and without label
 * smoothing, and with C = 8200 classes against 250 features, where dX's k is split in two. */
static void check_softmax_bf16(int64_t C, double smoothing) {
    int64_t dims[2] = {250, 33};
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", (double)C);
    gc_opt_str(&o, "loss", "ce");
    if (smoothing > 0) gc_opt_num(&o, "label_smoothing", smoothing);
    fixture f;
    if (!fx_make(&f, "softmax", "out", &o, 2, dims, RL_FLOAT32, 62)) return;
    rl_tensor tgt = {0}, gi[2] = {{0}, {0}};
    rl_tensor *gp[2] = {&gi[0], &gi[1]};
    int64_t tshape[2] = {T, B}, rows = T * B;
    CHECK_OK(rl_tensor_empty(&tgt, RL_INT32, RL_DEVICE_CPU, 2, tshape));
    int32_t *target = rl_tensor_data(&tgt);
    for (int64_t r = 0; r < rows; r++)
        target[r] = (int32_t)((r * 2654435761u) % (uint64_t)C);
    for (int i = 0; i < 2; i++)
        CHECK_OK(rl_tensor_empty_like(&gi[i], &f.in[i]));
    rl_bf16_ctx *ctx = rl_bf16_ctx_new();
    rl_bf16_activate(ctx);
    rl_layer_io io = fx_io(&f, true, &tgt, NULL);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK_OK(rl_op_fill(&f.pg, 0.0));
    /* the layer takes the rounded path (and would not without a bf16 context) */
    CHECK(rl_affine_bf16_ok(f.l, &io, &f.l->params[0], gp));
    CHECK_OK(f.l->ops->backward(f.l, &io, NULL, gp));
    rl_bf16_activate(NULL);
    CHECK(!rl_affine_bf16_ok(f.l, &io, &f.l->params[0], gp));
    /* the float32 dz and db, then each product as the float32 path runs it */
    int32_t tg[T * B];
    CHECK(rl_ce_targets_cpu(T, B, C, target, rl_tensor_data(&f.len), tg) < 0);
    float *dz = malloc(sizeof(float) * (size_t)(rows * C)), *db = malloc(sizeof(float) * (size_t)C);
    rl_ce_grad_cpu_f32(rows, C, rl_tensor_data(&f.l->out), tg, smoothing, dz, false, db, NULL);
    int bad_w = 0, bad_x = 0;
    int64_t off = 0;
    const float *W = rl_tensor_data(&f.l->params[0].value),
                *dW = rl_tensor_data(&f.l->params[0].grad);
    for (int i = 0; i < 2; i++) {
        int64_t F = dims[i];
        float *rw = calloc((size_t)(F * C), sizeof(float)),
              *rx = malloc(sizeof(float) * (size_t)(rows * F));
        CHECK_OK(rl_gemm_bf16(true, false, F, C, rows, 1.0f, rl_tensor_data(&f.in[i]), F, dz, C,
                              1.0f, rw, C));
        CHECK_OK(rl_gemm_bf16(false, true, rows, F, C, 1.0f, dz, C, W + off * C, C, 0.0f, rx, F));
        bad_w += memcmp(rw, dW + off * C, sizeof(float) * (size_t)(F * C)) != 0;
        bad_x += memcmp(rx, rl_tensor_data(&gi[i]), sizeof(float) * (size_t)(rows * F)) != 0;
        free(rw), free(rx);
        off += F;
    }
    bool same_db = memcmp(db, rl_tensor_data(&f.l->params[1].grad), sizeof(float) * (size_t)C) == 0;
    CHECK(bad_w == 0);
    CHECK(bad_x == 0);
    CHECK(same_db);
    if (bad_w || bad_x || !same_db)
        fprintf(stderr, "  softmax bf16, C %lld, smoothing %g: dW %d dX %d inputs differ, db %s\n",
                (long long)C, smoothing, bad_w, bad_x, same_db ? "same" : "differs");
    free(dz), free(db);
    /* a gradient buffer of another shape takes the float32 path, whose products report it */
    rl_bf16_activate(ctx);
    rl_tensor bad = {0};
    int64_t bad_shape[3] = {T, B, dims[0] + 1};
    CHECK_OK(rl_tensor_empty(&bad, RL_FLOAT32, RL_DEVICE_CPU, 3, bad_shape));
    rl_tensor *bp[2] = {&bad, NULL};
    CHECK(!rl_affine_bf16_ok(f.l, &io, &f.l->params[0], bp));
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK(f.l->ops->backward(f.l, &io, NULL, bp) != RL_OK);
    rl_bf16_activate(NULL);
    rl_bf16_ctx_free(ctx);
    rl_tensor_release(&bad);
    for (int i = 0; i < 2; i++)
        rl_tensor_release(&gi[i]);
    rl_tensor_release(&tgt);
    fx_free(&f);
}

static void test_mse(void) {
    rl_rng g;
    rl_rng_seed(&g, 70);
    rl_tensor out = {0}, tgt = {0}, len = {0}, grad = {0};
    CHECK_OK(gc_random_input(&out, RL_FLOAT64, T, B, 2, &g));
    CHECK_OK(gc_random_input(&tgt, RL_FLOAT64, T, B, 2, &g));
    CHECK_OK(gc_lengths(&len, B, LENS));
    CHECK_OK(rl_tensor_empty_like(&grad, &out));
    double ref = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < LENS[b]; t++)
            for (int64_t k = 0; k < 2; k++) {
                double d = get3(&out, t, b, k) - get3(&tgt, t, b, k);
                ref += d * d;
            }
    double loss = 0, nf = 0, loss2 = 0;
    CHECK_OK(rl_loss_mse(&out, &tgt, &len, &loss, &nf, &grad));
    CHECK_NEAR(loss, ref, 1e-12);
    CHECK(nf == 10);
    CHECK_OK(rl_loss_mse(&out, &tgt, &len, &loss2, &nf, NULL));
    CHECK_NEAR(loss2, ref, 1e-12);
    /* gradient by central differences of the loss, padded frames included */
    double err = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < 2; k++) {
                int64_t idx[3] = {t, b, k};
                double x = rl_tensor_get(&out, idx), lp, lm;
                rl_tensor_set(&out, idx, x + 1e-6);
                CHECK_OK(rl_loss_mse(&out, &tgt, &len, &lp, &nf, NULL));
                rl_tensor_set(&out, idx, x - 1e-6);
                CHECK_OK(rl_loss_mse(&out, &tgt, &len, &lm, &nf, NULL));
                rl_tensor_set(&out, idx, x);
                double num = (lp - lm) / 2e-6, a = rl_tensor_get(&grad, idx);
                err = fmax(err, fabs(a - num) / fmax(fmax(fabs(a), fabs(num)), 1e-2));
                if (t >= LENS[b]) CHECK(a == 0.0 && num == 0.0);
            }
    CHECK(err < 1e-6);
    /* shape mismatch */
    rl_tensor small = {0};
    CHECK_OK(gc_random_input(&small, RL_FLOAT64, T, B, 3, &g));
    CHECK(rl_loss_mse(&out, &small, &len, &loss, &nf, NULL) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "mse") != NULL);
    rl_tensor_release(&small);
    rl_tensor_release(&out);
    rl_tensor_release(&tgt);
    rl_tensor_release(&len);
    rl_tensor_release(&grad);
}

/* rl_layer_create fails with a message naming the layer and containing `needle` */
static void expect_create_error(const char *cls, const char *name, gc_opts *o, int n_in,
                                const int64_t *dims, const char *needle) {
    rl_options opts = gc_options(o);
    rl_layer *l = NULL;
    rl_status st = rl_layer_create(&l, cls, name, &opts, n_in, dims);
    CHECK(st != RL_OK && l == NULL);
    CHECK(strstr(rl_errmsg(), name) != NULL);
    CHECK(strstr(rl_errmsg(), needle) != NULL);
    if (st == RL_OK || !strstr(rl_errmsg(), needle))
        fprintf(stderr, "  %s '%s': got \"%s\", wanted \"%s\"\n", cls, name, rl_errmsg(), needle);
    rl_layer_free(l);
}

static void test_errors(void) {
    int64_t d1[1] = {3}, d2[2] = {2, 3}, d3[3] = {3, 3, 3};
    gc_opts none = {0};
    /* every layer message starts with RL_LAYER_WHERE: the generic option checks included */
    expect_create_error("linear", "lin_a", &none, 1, d1,
                        "layer 'lin_a' (class linear): missing option n_out");
    expect_create_error("softmax", "sm_a", &none, 1, d1, "n_out");
    gc_opts neg = {0};
    gc_opt_num(&neg, "n_out", 0);
    expect_create_error("linear", "lin_b", &neg, 1, d1, "n_out");
    gc_opts act = {0};
    gc_opt_num(&act, "n_out", 2);
    gc_opt_str(&act, "activation", "swish");
    expect_create_error("linear", "lin_c", &act, 1, d1, "swish");
    expect_create_error("activation", "act_a", &none, 1, d1, "activation");
    expect_create_error("dropout", "drop_a", &none, 1, d1, "dropout");
    gc_opts p1 = {0};
    gc_opt_num(&p1, "dropout", 1.0);
    expect_create_error("dropout", "drop_b", &p1, 1, d1, "[0, 1)");
    expect_create_error("combine", "comb_a", &none, 2, d2, "kind");
    gc_opts add = {0};
    gc_opt_str(&add, "kind", "add");
    expect_create_error("combine", "comb_b", &add, 2, d2, "one dim");
    gc_opts mul = {0};
    gc_opt_str(&mul, "kind", "mul");
    expect_create_error("combine", "comb_c", &mul, 3, d3, "two inputs");
    expect_create_error("window", "win_a", &none, 1, d1, "window");
    gc_opts even = {0};
    gc_opt_num(&even, "window", 4);
    expect_create_error("window", "win_b", &even, 1, d1, "odd");
    gc_opts both = {0};
    gc_opt_num(&both, "window", 3);
    gc_opt_num(&both, "left", 1);
    expect_create_error("window", "win_c", &both, 1, d1, "either");
    gc_opts sl = {0};
    gc_opt_num(&sl, "n_out", 3);
    gc_opt_str(&sl, "loss", "hinge");
    expect_create_error("softmax", "sm_b", &sl, 1, d1, "unknown loss 'hinge'");
    gc_opts wrong_type = {0};
    gc_opt_str(&wrong_type, "n_out", "three");
    expect_create_error("linear", "n_out", &wrong_type, 1, d1, "n_out");
    expect_create_error("nosuch", "lay", &none, 1, d1, "nosuch");

    /* wrong input dims at forward time */
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 2);
    fixture f;
    if (fx_make(&f, "linear", "lin_dims", &o, 1, d1, RL_FLOAT64, 80)) {
        rl_rng g;
        rl_rng_seed(&g, 1);
        rl_tensor x = {0};
        CHECK_OK(gc_random_input(&x, RL_FLOAT64, T, B, 4, &g));
        rl_layer_io io = fx_io(&f, false, NULL, NULL);
        io.in[0] = &x;
        CHECK(f.l->ops->forward(f.l, &io) == RL_ESHAPE);
        const char *want = "layer 'lin_dims' (class linear): input 1 has 4 features";
        CHECK(strncmp(rl_errmsg(), want, strlen(want)) == 0);
        /* parameters of the wrong dtype */
        rl_tensor x32 = {0};
        CHECK_OK(gc_random_input(&x32, RL_FLOAT32, T, B, 3, &g));
        io.in[0] = &x32;
        CHECK(f.l->ops->forward(f.l, &io) != RL_OK);
        CHECK(strstr(rl_errmsg(), "'lin_dims'") != NULL);
        rl_tensor_release(&x32);
        rl_tensor_release(&x);
        fx_free(&f);
    }
    /* the registry lists the classes */
    const char *const *names = rl_layer_classes();
    int found = 0;
    for (int i = 0; names[i]; i++)
        for (int k = 0; k < 6; k++)
            found += !strcmp(names[i], (const char *[]){"linear", "activation", "dropout",
                                                        "combine", "window", "softmax"}[k]);
    CHECK(found == 6);
}

/* A second batch of the same shape, or a smaller one, reuses every buffer. */
static void test_no_realloc(void) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 3);
    gc_opt_str(&o, "activation", "square");
    int64_t d1[1] = {2};
    fixture f;
    if (!fx_make(&f, "linear", "lin", &o, 1, d1, RL_FLOAT64, 90)) return;
    rl_layer_io io = fx_io(&f, false, NULL, NULL);
    CHECK_OK(f.l->ops->forward(f.l, &io));
    rl_storage *s = f.l->out.storage;
    void *data = s->data;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK(f.l->out.storage == s && s->data == data);
    rl_tensor x = {0}, len = {0};
    rl_rng g;
    rl_rng_seed(&g, 2);
    int lens2[2] = {3, 1};
    CHECK_OK(gc_random_input(&x, RL_FLOAT64, 3, 2, 2, &g));
    CHECK_OK(gc_lengths(&len, 2, lens2));
    io.in[0] = &x;
    io.lengths = &len;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    CHECK(f.l->out.storage == s && f.l->out.shape[0] == 3 && f.l->out.shape[1] == 2);
    rl_tensor_release(&x);
    rl_tensor_release(&len);
    fx_free(&f);
}

int main(void) {
    test_linear();
    test_float32();
    test_activation();
    test_dropout();
    test_combine();
    test_window();
    test_softmax();
    check_softmax_bf16(45, 0.0);
    check_softmax_bf16(8200, 0.1);
    test_mse();
    test_errors();
    test_no_realloc();
    TEST_MAIN_END();
}
