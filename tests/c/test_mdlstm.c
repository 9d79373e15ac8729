/* The mdlstm layer against a float64 reference written here (raster loops per direction and
 * cell, libm activations, no BLAS, no diagonals) on tiny ragged images: every single
 * direction and all four, concat and sum, both cell types, two inputs (one a narrowed view);
 * outputs 0 on padding; a central-difference gradient check in float64 of the inputs and all
 * parameters for every direction and both cells, with the padding's input gradient exactly 0
 * and perturbations there changing nothing; float32 near float64; errors that name the layer;
 * the cell lists of every diagonal that the CUDA path copies to the device, against lists
 * derived here from each image's positions; NaN in the padding of the inputs and of grad_out
 * of the layer used directly reaching no output or gradient, at every CPU level.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"

#include "../../core/blas.h"
#include "../../core/rng.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"

enum { H = 4, W = 5, B = 3, F1 = 2, F2 = 3, F = F1 + F2 };
/* n_out per direction: 2, wider in test_float32 (the recurrent products' panel widths) */
static int64_t D = 2;
static const int32_t SIZES[B][2] = {{4, 5}, {2, 3}, {3, 1}};

typedef struct {
    const char *dirs;
    const char *combine;
    const char *cell;
} config;

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static bool padded(int64_t y, int64_t x, int64_t b) { return y >= SIZES[b][0] || x >= SIZES[b][1]; }

/* Direction codes of a "tl,br"-style string, in order (bit 0 flips x, bit 1 flips y). */
static int parse(const char *s, int *codes) {
    int n = 0;
    for (const char *p = s; *p; p++) {
        if (*p != 't' && *p != 'b') continue;
        codes[n++] = (p[0] == 'b' ? 2 : 0) + (p[1] == 'r' ? 1 : 0);
        p++;
    }
    return n;
}

static int64_t n_out_of(const config *cf) {
    int codes[4];
    int nd = parse(cf->dirs, codes);
    return strcmp(cf->combine, "sum") == 0 ? D : nd * D;
}

/* out (H, W, B, n_out), contiguous float64, from x (H, W, B, F) = the inputs side by side and
 * the layer's params: each image in its direction's raster order. */
static void reference(const config *cf, const double *x, const double *Wp, const double *Uu,
                      const double *Ul, const double *bp, double *out) {
    int codes[4];
    int nd = parse(cf->dirs, codes);
    bool stable = strcmp(cf->cell, "stable") == 0, sum = strcmp(cf->combine, "sum") == 0;
    int64_t G = nd * 5 * D, n_out = n_out_of(cf);
    memset(out, 0, sizeof(double) * H * W * B * (size_t)n_out);
    for (int k = 0; k < nd; k++) {
        bool fx = codes[k] & 1, fy = codes[k] & 2;
        for (int64_t b = 0; b < B; b++) {
            int64_t h = SIZES[b][0], w = SIZES[b][1];
            double hs[H][W][D], cs[H][W][D]; /* scan coordinates */
            for (int64_t ys = 0; ys < h; ys++)
                for (int64_t xs = 0; xs < w; xs++) {
                    int64_t y = fy ? h - 1 - ys : ys, xx = fx ? w - 1 - xs : xs;
                    const double *xr = x + ((y * W + xx) * B + b) * F;
                    for (int64_t j = 0; j < D; j++) {
                        double z[5];
                        for (int q = 0; q < 5; q++) {
                            int64_t col = k * 5 * D + q * D + j;
                            double a = bp[col];
                            for (int64_t f = 0; f < F; f++)
                                a += xr[f] * Wp[f * G + col];
                            for (int64_t m = 0; m < D; m++) {
                                if (ys > 0) a += hs[ys - 1][xs][m] * Uu[m * G + col];
                                if (xs > 0) a += hs[ys][xs - 1][m] * Ul[m * G + col];
                            }
                            z[q] = a;
                        }
                        double cu = ys > 0 ? cs[ys - 1][xs][j] : 0;
                        double cl = xs > 0 ? cs[ys][xs - 1][j] : 0;
                        double i = sigm(z[0]), a = sigm(z[1]), l = sigm(z[2]), g = tanh(z[3]),
                               o = sigm(z[4]);
                        double c =
                            stable ? a * (l * cu + (1 - l) * cl) + i * g : a * cu + l * cl + i * g;
                        cs[ys][xs][j] = c;
                        hs[ys][xs][j] = o * tanh(c);
                        out[((y * W + xx) * B + b) * n_out + (sum ? 0 : k * D) + j] +=
                            hs[ys][xs][j];
                    }
                }
        }
    }
}

/* ---- fixture ---- */

typedef struct {
    config cf;
    rl_layer *l;
    rl_tensor pv, pg;       /* flat params and grads */
    rl_tensor xbig, x1, x2; /* x2 is a feature-narrowed view of xbig */
    rl_tensor sizes;
    rl_layer_io io;
} fixture;

static rl_status make_layer(rl_layer **l, const config *cf, rl_dtype dt, rl_tensor *pv,
                            rl_tensor *pg) {
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", D);
    gc_opt_str(&t, "directions", cf->dirs);
    gc_opt_str(&t, "combine", cf->combine);
    gc_opt_str(&t, "cell", cf->cell);
    gc_opt_num(&t, "forget_bias", 0.5);
    rl_options o = gc_options(&t);
    int64_t dims[2] = {F1, F2};
    RL_TRY(rl_layer_create(l, "mdlstm", "img", &o, 2, dims));
    rl_rng g;
    rl_rng_seed(&g, 7);
    RL_TRY(gc_bind_params(*l, dt, &g, pv, pg));
    /* random biases and larger recurrent weights, so every path carries signal */
    for (int i = 0; i < (*l)->n_params; i++)
        if (strcmp((*l)->params[i].name, "W") != 0)
            RL_TRY(rl_op_uniform(&(*l)->params[i].value, &g, -0.8, 0.8));
    return RL_OK;
}

static rl_status fixture_init(fixture *fx, const config *cf, rl_dtype dt) {
    memset(fx, 0, sizeof *fx);
    fx->cf = *cf;
    RL_TRY(make_layer(&fx->l, cf, dt, &fx->pv, &fx->pg));
    int64_t s1[4] = {H, W, B, F1}, sb[4] = {H, W, B, F2 + 2}, ss[2] = {B, 2};
    rl_rng g;
    rl_rng_seed(&g, 11);
    RL_TRY(rl_tensor_empty(&fx->x1, dt, RL_DEVICE_CPU, 4, s1));
    RL_TRY(rl_op_uniform(&fx->x1, &g, -1, 1));
    RL_TRY(rl_tensor_empty(&fx->xbig, dt, RL_DEVICE_CPU, 4, sb));
    RL_TRY(rl_op_uniform(&fx->xbig, &g, -1, 1));
    RL_TRY(rl_tensor_narrow(&fx->x2, &fx->xbig, 3, 1, F2));
    RL_TRY(rl_tensor_empty(&fx->sizes, RL_INT32, RL_DEVICE_CPU, 2, ss));
    memcpy(rl_tensor_data(&fx->sizes), SIZES, sizeof SIZES);
    fx->io.n_in = 2;
    fx->io.in[0] = &fx->x1;
    fx->io.in[1] = &fx->x2;
    fx->io.sizes = &fx->sizes;
    return RL_OK;
}

static void fixture_free(fixture *fx) {
    rl_layer_free(fx->l);
    rl_tensor *ts[] = {&fx->pv, &fx->pg, &fx->xbig, &fx->x1, &fx->x2, &fx->sizes};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static double get4(const rl_tensor *t, int64_t y, int64_t x, int64_t b, int64_t f) {
    int64_t idx[4] = {y, x, b, f};
    return rl_tensor_get(t, idx);
}

/* the inputs side by side as a contiguous float64 (H, W, B, F) array (caller frees) */
static double *joined_input(const fixture *fx) {
    double *x = malloc(sizeof(double) * H * W * B * F);
    for (int64_t y = 0; y < H; y++)
        for (int64_t xx = 0; xx < W; xx++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t f = 0; f < F; f++)
                    x[((y * W + xx) * B + b) * F + f] =
                        f < F1 ? get4(&fx->x1, y, xx, b, f) : get4(&fx->x2, y, xx, b, f - F1);
    return x;
}

static double *param_copy(const rl_layer *l, const char *name) {
    const rl_tensor *v = &l->params[rl_layer_find_param(l, name)].value;
    int64_t n = rl_tensor_numel(v);
    double *p = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[2] = {v->ndim == 2 ? i / v->shape[1] : i, i % v->shape[v->ndim - 1]};
        p[i] = rl_tensor_get(v, idx);
    }
    return p;
}

/* max |layer out - reference| over all positions, and max |out| on padding */
static void compare_forward(fixture *fx, double *err, double *pad) {
    int64_t n_out = n_out_of(&fx->cf);
    double *x = joined_input(fx), *Wp = param_copy(fx->l, "W"), *Uu = param_copy(fx->l, "U_up"),
           *Ul = param_copy(fx->l, "U_left"), *bp = param_copy(fx->l, "b");
    double *ref = malloc(sizeof(double) * H * W * B * (size_t)n_out);
    reference(&fx->cf, x, Wp, Uu, Ul, bp, ref);
    *err = 0;
    *pad = 0;
    for (int64_t y = 0; y < H; y++)
        for (int64_t xx = 0; xx < W; xx++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t f = 0; f < n_out; f++) {
                    double v = get4(&fx->l->out, y, xx, b, f);
                    *err = fmax(*err, fabs(v - ref[((y * W + xx) * B + b) * n_out + f]));
                    if (padded(y, xx, b)) *pad = fmax(*pad, fabs(v));
                }
    free(x);
    free(Wp);
    free(Uu);
    free(Ul);
    free(bp);
    free(ref);
}

static const config CONFIGS[] = {
    {"tl", "concat", "standard"},
    {"tr", "concat", "standard"},
    {"bl", "concat", "standard"},
    {"br", "concat", "standard"},
    {"tl,tr,bl,br", "concat", "standard"},
    {"br tl", "sum", "standard"},
    {"tl,tr,bl,br", "sum", "standard"},
    {"tl", "concat", "stable"},
    {"tr", "concat", "stable"},
    {"bl", "concat", "stable"},
    {"br", "concat", "stable"},
    {"tl,tr,bl,br", "concat", "stable"},
    {"tl,tr,bl,br", "sum", "stable"},
};
#define N_CONFIGS (sizeof CONFIGS / sizeof CONFIGS[0])

static void test_forward(void) {
    for (size_t c = 0; c < N_CONFIGS; c++) {
        fixture fx;
        CHECK_OK(fixture_init(&fx, &CONFIGS[c], RL_FLOAT64));
        CHECK_OK(fx.l->ops->forward(fx.l, &fx.io));
        double err, pad;
        compare_forward(&fx, &err, &pad);
        if (err > 1e-12 || pad != 0.0)
            fprintf(stderr, "forward %s/%s/%s: max err %.3g, max |out| on padding %.3g\n",
                    CONFIGS[c].dirs, CONFIGS[c].combine, CONFIGS[c].cell, err, pad);
        CHECK(err < 1e-12);
        CHECK(pad == 0.0);
        /* a second forward on the same buffers gives the same */
        CHECK_OK(fx.l->ops->forward(fx.l, &fx.io));
        compare_forward(&fx, &err, &pad);
        CHECK(err < 1e-12);
        fixture_free(&fx);
    }
}

/* ---- gradient check (2-D): L = sum over valid positions of out * R ---- */

static rl_status loss_of(fixture *fx, const double *R, double *L) {
    RL_TRY(fx->l->ops->forward(fx->l, &fx->io));
    int64_t n_out = fx->l->n_out;
    const double *o = rl_tensor_data(&fx->l->out);
    double s = 0;
    for (int64_t r = 0; r < H * W * B; r++)
        for (int64_t f = 0; f < n_out; f++)
            s += o[r * n_out + f] * R[r * n_out + f]; /* R is 0 on padding */
    *L = s;
    return RL_OK;
}

typedef struct {
    double max_rel, pad_analytic, pad_numeric;
    int64_t n;
    char worst[128];
} gc2_report;

/* Perturbs every element of t (float64; any strides, via get/set) and compares with ag (the
 * analytic gradient in t's index order). */
static rl_status sweep(fixture *fx, const double *R, rl_tensor *t, const double *ag,
                       const char *what, bool is_input, gc2_report *rep) {
    const double eps = 1e-6;
    int64_t n = rl_tensor_numel(t);
    for (int64_t e = 0; e < n; e++) {
        int64_t idx[4], rem = e;
        for (int d = t->ndim - 1; d >= 0; d--) {
            idx[d] = rem % t->shape[d];
            rem /= t->shape[d];
        }
        double keep = rl_tensor_get(t, idx), lp, lm;
        rl_tensor_set(t, idx, keep + eps);
        RL_TRY(loss_of(fx, R, &lp));
        rl_tensor_set(t, idx, keep - eps);
        RL_TRY(loss_of(fx, R, &lm));
        rl_tensor_set(t, idx, keep);
        double num = (lp - lm) / (2 * eps);
        if (is_input && padded(idx[0], idx[1], idx[2])) {
            rep->pad_analytic = fmax(rep->pad_analytic, ag[e] == ag[e] ? fabs(ag[e]) : INFINITY);
            rep->pad_numeric = fmax(rep->pad_numeric, fabs(lp - lm));
        }
        double r = gc_rel_(ag[e], num, 1e-2);
        if (r > rep->max_rel || rep->n == 0) {
            rep->max_rel = fmax(rep->max_rel, r);
            snprintf(rep->worst, sizeof rep->worst, "%s[%lld]: backward %.9g, numeric %.9g", what,
                     (long long)e, ag[e], num);
        }
        rep->n++;
    }
    return RL_OK;
}

static rl_status gradcheck(fixture *fx, gc2_report *rep) {
    memset(rep, 0, sizeof *rep);
    rl_layer *l = fx->l;
    int64_t n_out = l->n_out, N = H * W * B;
    double *R = malloc(sizeof(double) * (size_t)(N * n_out));
    uint64_t s = 99;
    for (int64_t r = 0; r < N; r++)
        for (int64_t f = 0; f < n_out; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int64_t y = r / (W * B), x = (r / B) % W, b = r % B;
            R[r * n_out + f] =
                padded(y, x, b) ? 0.0 : (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        }
    int64_t gs[4] = {H, W, B, n_out};
    rl_tensor gout = {0}, gin[2] = {{0}};
    rl_status st = rl_tensor_empty(&gout, RL_FLOAT64, RL_DEVICE_CPU, 4, gs);
    if (st == RL_OK) memcpy(rl_tensor_data(&gout), R, sizeof(double) * (size_t)(N * n_out));
    for (int i = 0; i < 2 && st == RL_OK; i++) {
        st = rl_tensor_empty_like(&gin[i], fx->io.in[i]);
        if (st == RL_OK) st = rl_op_fill(&gin[i], NAN);
    }
    if (st == RL_OK) st = rl_op_fill(&fx->pg, 0.25);
    double L0;
    if (st == RL_OK) st = loss_of(fx, R, &L0);
    rl_tensor *gp[2] = {&gin[0], &gin[1]};
    if (st == RL_OK) st = l->ops->backward(l, &fx->io, &gout, gp);
    int64_t np = rl_tensor_numel(&fx->pg);
    double *pgrad = malloc(sizeof(double) * (size_t)np);
    memcpy(pgrad, rl_tensor_data(&fx->pg), sizeof(double) * (size_t)np);
    for (int64_t e = 0; e < np; e++)
        pgrad[e] -= 0.25;
    for (int i = 0; i < 2 && st == RL_OK; i++) {
        rl_tensor *x = (rl_tensor *)fx->io.in[i];
        st = sweep(fx, R, x, rl_tensor_data(&gin[i]), i ? "input 2" : "input 1", true, rep);
    }
    int64_t off = 0;
    for (int i = 0; i < l->n_params && st == RL_OK; i++) {
        st = sweep(fx, R, &l->params[i].value, pgrad + off, l->params[i].name, false, rep);
        off += rl_tensor_numel(&l->params[i].value);
    }
    free(pgrad);
    free(R);
    rl_tensor_release(&gout);
    rl_tensor_release(&gin[0]);
    rl_tensor_release(&gin[1]);
    return st;
}

static void test_gradients(void) {
    for (size_t c = 0; c < N_CONFIGS; c++) {
        fixture fx;
        CHECK_OK(fixture_init(&fx, &CONFIGS[c], RL_FLOAT64));
        gc2_report rep;
        CHECK_OK(gradcheck(&fx, &rep));
        fprintf(stderr,
                "gradcheck %-12s %-6s %-8s max rel %.2e over %lld values (pad: backward %.1e, "
                "loss change %.1e)%s%s\n",
                CONFIGS[c].dirs, CONFIGS[c].combine, CONFIGS[c].cell, rep.max_rel, (long long)rep.n,
                rep.pad_analytic, rep.pad_numeric, rep.max_rel > 1e-6 ? "; worst " : "",
                rep.max_rel > 1e-6 ? rep.worst : "");
        CHECK(rep.max_rel < 1e-6);
        CHECK(rep.pad_analytic == 0.0);
        CHECK(rep.pad_numeric == 0.0);
        fixture_free(&fx);
    }
}

/* A float32 forward and backward on b: out, the parameter gradients and both input gradients
 * copied side by side into res (allocated here). */
static void run_f32(fixture *b, rl_tensor *res) {
    rl_tensor gb = {0}, ib[2] = {{0}};
    CHECK_OK(rl_op_fill(&b->pg, 0.0));
    CHECK_OK(b->l->ops->forward(b->l, &b->io));
    CHECK_OK(rl_tensor_empty_like(&gb, &b->l->out));
    CHECK_OK(rl_op_fill(&gb, 0.5));
    for (int i = 0; i < 2; i++)
        CHECK_OK(rl_tensor_empty_like(&ib[i], b->io.in[i]));
    const rl_tensor *parts[4] = {&b->l->out, &b->pg, &ib[0], &ib[1]};
    rl_tensor *pb[2] = {&ib[0], &ib[1]};
    CHECK_OK(b->l->ops->backward(b->l, &b->io, &gb, pb));
    int64_t n = 0;
    for (int i = 0; i < 4; i++)
        n += rl_tensor_numel(parts[i]);
    CHECK_OK(rl_tensor_empty(res, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
    float *r = rl_tensor_data(res);
    for (int i = 0; i < 4; i++) {
        rl_tensor c = {0};
        CHECK_OK(rl_op_contiguous(&c, parts[i]));
        memcpy(r, rl_tensor_data(&c), (size_t)rl_tensor_numel(&c) * sizeof *r);
        r += rl_tensor_numel(&c);
        rl_tensor_release(&c);
    }
    rl_tensor_release(&gb);
    for (int i = 0; i < 2; i++)
        rl_tensor_release(&ib[i]);
}

/* float32 forward and backward near float64 on the same values, at widths D whose recurrent
 * products end in panels of 1, 2 and 3 AVX-512 vectors (5D forward, 2D backward); the float32
 * pass once with the directions on 2 threads and once on 1, bit for bit the same */
static void test_float32(void) {
    const config cfs[2] = {{"tl,tr,bl,br", "concat", "standard"}, {"tl,br", "sum", "stable"}};
    const int64_t widths[] = {2, 7, 12, 20};
    int saved = rl_blas_get_threads();
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (int c = 0; c < 2; c++) {
            D = widths[wi];
            fixture a, b;
            CHECK_OK(fixture_init(&a, &cfs[c], RL_FLOAT64));
            CHECK_OK(fixture_init(&b, &cfs[c], RL_FLOAT32));
            CHECK_OK(rl_op_copy(&b.pv, &a.pv));
            CHECK_OK(rl_op_copy(&b.x1, &a.x1));
            CHECK_OK(rl_op_copy(&b.xbig, &a.xbig));
            rl_blas_set_threads(1);
            rl_tensor one = {0}, two = {0};
            run_f32(&b, &one);
            rl_blas_set_threads(2);
            run_f32(&b, &two);
            bool same = rl_tensor_numel(&one) == rl_tensor_numel(&two) &&
                        memcmp(rl_tensor_data(&one), rl_tensor_data(&two),
                               (size_t)rl_tensor_numel(&one) * sizeof(float)) == 0;
            CHECK(same);
            rl_tensor_release(&one);
            rl_tensor_release(&two);
            CHECK_OK(rl_op_fill(&a.pg, 0.0));
            CHECK_OK(a.l->ops->forward(a.l, &a.io));
            double err = 0;
            int64_t n = rl_tensor_numel(&a.l->out);
            const double *oa = rl_tensor_data(&a.l->out);
            const float *ob = rl_tensor_data(&b.l->out);
            for (int64_t i = 0; i < n; i++)
                err = fmax(err, fabs(oa[i] - (double)ob[i]));
            CHECK(err < 1e-5);
            rl_tensor ga = {0}, ia[2] = {{0}}, ib[2] = {{0}};
            CHECK_OK(rl_tensor_empty_like(&ga, &a.l->out));
            CHECK_OK(rl_op_fill(&ga, 0.5));
            for (int i = 0; i < 2; i++) {
                CHECK_OK(rl_tensor_empty_like(&ia[i], a.io.in[i]));
                CHECK_OK(rl_tensor_empty_like(&ib[i], b.io.in[i]));
            }
            rl_tensor *pa[2] = {&ia[0], &ia[1]}, *pb[2] = {&ib[0], &ib[1]};
            CHECK_OK(a.l->ops->backward(a.l, &a.io, &ga, pa));
            /* b's last backward (2 threads) again, for its input gradients */
            CHECK_OK(rl_op_fill(&b.pg, 0.0));
            CHECK_OK(b.l->ops->forward(b.l, &b.io));
            rl_tensor gb = {0};
            CHECK_OK(rl_tensor_empty_like(&gb, &b.l->out));
            CHECK_OK(rl_op_fill(&gb, 0.5));
            CHECK_OK(b.l->ops->backward(b.l, &b.io, &gb, pb));
            double gerr = 0, gmax = 0;
            const double *da = rl_tensor_data(&a.pg);
            const float *dbp = rl_tensor_data(&b.pg);
            for (int64_t i = 0; i < rl_tensor_numel(&a.pg); i++) {
                gerr = fmax(gerr, fabs(da[i] - (double)dbp[i]));
                gmax = fmax(gmax, fabs(da[i]));
            }
            for (int i = 0; i < 2; i++)
                for (int64_t e = 0; e < rl_tensor_numel(&ia[i]); e++) {
                    int64_t idx[4] = {e / (W * B * ia[i].shape[3]), (e / (B * ia[i].shape[3])) % W,
                                      (e / ia[i].shape[3]) % B, e % ia[i].shape[3]};
                    gerr =
                        fmax(gerr, fabs(rl_tensor_get(&ia[i], idx) - rl_tensor_get(&ib[i], idx)));
                }
            fprintf(stderr,
                    "float32 vs float64 (%s, D %d, %s, %s): out %.2e, grads %.2e (max |grad| "
                    "%.2f)\n",
                    rl_cpu_level_name(rl_cpu_level_get()), (int)D, cfs[c].dirs, cfs[c].cell, err,
                    gerr, gmax);
            CHECK(gerr < 1e-4 * fmax(1.0, gmax));
            rl_tensor_release(&ga);
            rl_tensor_release(&gb);
            for (int i = 0; i < 2; i++) {
                rl_tensor_release(&ia[i]);
                rl_tensor_release(&ib[i]);
            }
            fixture_free(&a);
            fixture_free(&b);
        }
    D = 2;
    rl_blas_set_threads(saved);
}

/* ---- every diagonal's cell lists (what layers/mdlstm.c copies to a CUDA device) ---- */

/* Checks the lists of directions `codes` on (Hh, Ww, Bb) images of sizes sz against ones derived
 * from each image's scan coordinates: per diagonal s and direction k, the positions whose scan
 * coordinates (ys, xs) add up to s, by ys and then image by image, with their neighbours' rows
 * in that direction (-1 outside the image). Returns the mismatches. */
static int64_t check_lists(const int *codes, int nd, int64_t Hh, int64_t Ww, int64_t Bb,
                           const int32_t *sz) {
    int64_t cap = rl_mdlstm_count_cells(nd, Bb, sz), bad = 0, want_cap = 0;
    for (int64_t b = 0; b < Bb; b++)
        want_cap += nd * sz[2 * b] * sz[2 * b + 1];
    if (cap != want_cap) return 1;
    int64_t *cells = malloc(sizeof(int64_t) * (size_t)(5 * cap)),
            *first = malloc(sizeof(int64_t) * (size_t)(Hh + Ww));
    rl_mdlstm_list_all(codes, nd, Hh, Ww, Bb, sz, cells, cap, first);
    bad += first[0] != 0 || first[Hh + Ww - 1] != cap;
    for (int64_t s = 0; s + 1 < Hh + Ww && !bad; s++) {
        int64_t ntot = first[s + 1] - first[s], n = ntot / nd;
        bad += ntot % nd != 0;
        for (int k = 0; k < nd && !bad; k++) {
            bool fx = codes[k] & 1, fy = codes[k] & 2;
            int64_t e = first[s] + k * n; /* the next entry to match */
            for (int64_t ys = 0; ys <= s && ys < Hh; ys++)
                for (int64_t b = 0; b < Bb; b++) {
                    int64_t h = sz[2 * b], w = sz[2 * b + 1], xs = s - ys;
                    if (ys >= h || xs >= w) continue;
                    int64_t y = fy ? h - 1 - ys : ys, x = fx ? w - 1 - xs : xs;
                    int64_t uy = fy ? y + 1 : y - 1, lx = fx ? x + 1 : x - 1;
                    int64_t dy = fy ? y - 1 : y + 1, rx = fx ? x - 1 : x + 1;
                    int64_t want[5] = {
                        (y * Ww + x) * Bb + b,
                        uy >= 0 && uy < h ? (uy * Ww + x) * Bb + b : -1,
                        lx >= 0 && lx < w ? (y * Ww + lx) * Bb + b : -1,
                        dy >= 0 && dy < h ? (dy * Ww + x) * Bb + b : -1,
                        rx >= 0 && rx < w ? (y * Ww + rx) * Bb + b : -1,
                    };
                    for (int a = 0; a < 5; a++)
                        bad += e >= first[s] + (k + 1) * n || cells[a * cap + e] != want[a];
                    e++;
                }
            bad += e != first[s] + (k + 1) * n;
        }
    }
    free(cells);
    free(first);
    return bad;
}

static void test_device_lists(void) {
    const int32_t tall[4][2] = {{7, 2}, {1, 1}, {3, 2}, {5, 1}};
    int all[4] = {0, 1, 2, 3}, two[2] = {3, 0}, one[1] = {2};
    CHECK(check_lists(all, 4, H, W, B, &SIZES[0][0]) == 0);
    CHECK(check_lists(two, 2, H, W, B, &SIZES[0][0]) == 0);
    CHECK(check_lists(one, 1, H, W, B, &SIZES[0][0]) == 0);
    CHECK(check_lists(all, 4, 7, 2, 4, &tall[0][0]) == 0);
    CHECK(check_lists(two, 2, 8, 3, 4, &tall[0][0]) == 0);
    /* the check can fail: a list built for other sizes does not match */
    int32_t other[B][2];
    memcpy(other, SIZES, sizeof other);
    CHECK(check_lists(all, 4, H, W, B, &other[0][0]) == 0);
    other[1][1] = 4;
    int64_t cap = rl_mdlstm_count_cells(4, B, &other[0][0]);
    int64_t *cells = malloc(sizeof(int64_t) * (size_t)(5 * cap)), first[H + W];
    rl_mdlstm_list_all(all, 4, H, W, B, &SIZES[0][0], cells, cap, first);
    CHECK(first[H + W - 1] != cap);
    free(cells);
}

static void test_options_and_errors(void) {
    CHECK(rl_layer_class_flags("mdlstm") == (RL_LAYER_IN_2D | RL_LAYER_OUT_2D));
    int64_t dims[1] = {3};
    rl_layer *l = NULL;
    {
        gc_opts t = {0};
        rl_options o = gc_options(&t);
        CHECK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims) != RL_OK);
        CHECK(strstr(rl_errmsg(), "scan") && strstr(rl_errmsg(), "n_out"));
        CHECK(l == NULL);
    }
    {
        gc_opts t = {0};
        gc_opt_num(&t, "n_out", 4);
        gc_opt_str(&t, "directions", "tl,up");
        rl_options o = gc_options(&t);
        CHECK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims) != RL_OK);
        CHECK(strstr(rl_errmsg(), "scan") && strstr(rl_errmsg(), "'up'"));
    }
    {
        gc_opts t = {0};
        gc_opt_num(&t, "n_out", 4);
        gc_opt_str(&t, "directions", "tl,tl");
        rl_options o = gc_options(&t);
        CHECK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims) != RL_OK);
        CHECK(strstr(rl_errmsg(), "twice") != NULL);
    }
    {
        gc_opts t = {0};
        gc_opt_num(&t, "n_out", 4);
        gc_opt_str(&t, "cell", "lstm");
        rl_options o = gc_options(&t);
        CHECK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims) != RL_OK);
        CHECK(strstr(rl_errmsg(), "scan") && strstr(rl_errmsg(), "cell"));
    }
    /* defaults: four directions concatenated; params and forget-gate bias blocks */
    {
        gc_opts t = {0};
        gc_opt_num(&t, "n_out", 4);
        gc_opt_num(&t, "forget_bias", 1.0);
        rl_options o = gc_options(&t);
        CHECK_OK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims));
        CHECK(l->n_out == 16);
        CHECK(l->n_params == 4);
        CHECK(l->params[0].shape[0] == 3 && l->params[0].shape[1] == 80);
        CHECK(l->params[1].shape[0] == 4 && l->params[1].shape[1] == 80);
        rl_tensor pv = {0}, pg = {0};
        rl_rng g;
        rl_rng_seed(&g, 1);
        CHECK_OK(gc_bind_params(l, RL_FLOAT64, &g, &pv, &pg));
        const double *bp = rl_tensor_data(&l->params[3].value);
        int ok = 1;
        for (int64_t j = 0; j < 80; j++) {
            int64_t q = (j % 20) / 4; /* gate of column j */
            ok &= bp[j] == ((q == 1 || q == 2) ? 1.0 : 0.0);
        }
        CHECK(ok);
        /* a (T, B, F) input is refused with the layer's name */
        int64_t s3[3] = {4, 2, 3}, ss[2] = {2, 2};
        rl_tensor x = {0}, sz = {0};
        CHECK_OK(rl_tensor_empty(&x, RL_FLOAT64, RL_DEVICE_CPU, 3, s3));
        CHECK_OK(rl_op_fill(&x, 0.0));
        CHECK_OK(rl_tensor_empty(&sz, RL_INT32, RL_DEVICE_CPU, 2, ss));
        CHECK_OK(rl_op_fill(&sz, 1.0));
        rl_layer_io io = {0};
        io.n_in = 1;
        io.in[0] = &x;
        io.sizes = &sz;
        CHECK(l->ops->forward(l, &io) != RL_OK);
        CHECK(strstr(rl_errmsg(), "scan") && strstr(rl_errmsg(), "(H, W, B"));
        CHECK(l->ops->backward(l, &io, NULL, NULL) != RL_OK);
        rl_tensor_release(&x);
        rl_tensor_release(&sz);
        rl_tensor_release(&pv);
        rl_tensor_release(&pg);
        rl_layer_free(l);
    }
    {
        gc_opts t = {0};
        gc_opt_num(&t, "n_out", 4);
        gc_opt_str(&t, "cell", "stable");
        gc_opt_str(&t, "combine", "sum");
        gc_opt_str(&t, "directions", "br");
        gc_opt_num(&t, "forget_bias", 2.0);
        rl_options o = gc_options(&t);
        CHECK_OK(rl_layer_create(&l, "mdlstm", "scan", &o, 1, dims));
        CHECK(l->n_out == 4 && l->params[3].shape[0] == 20);
        rl_tensor pv = {0}, pg = {0};
        rl_rng g;
        rl_rng_seed(&g, 1);
        CHECK_OK(gc_bind_params(l, RL_FLOAT64, &g, &pv, &pg));
        const double *bp = rl_tensor_data(&l->params[3].value);
        int ok = 1;
        for (int64_t j = 0; j < 20; j++)
            ok &= bp[j] == (j / 4 == 1 ? 2.0 : 0.0);
        CHECK(ok);
        rl_tensor_release(&pv);
        rl_tensor_release(&pg);
        rl_layer_free(l);
    }
}

/* ---- NaN in the padding of a layer used directly (no network zeroing its inputs) ---- */

/* forward and backward (grad_out 0.5, NaN on padding when nan) on fx; out, the parameter
 * gradients and both input gradients as float64, side by side, into res (allocated here) */
static void run_any(fixture *fx, bool nan, rl_tensor *res) {
    rl_tensor g = {0}, gi[2] = {{0}};
    CHECK_OK(rl_op_fill(&fx->pg, 0.0));
    CHECK_OK(fx->l->ops->forward(fx->l, &fx->io));
    CHECK_OK(rl_tensor_empty_like(&g, &fx->l->out));
    CHECK_OK(rl_op_fill(&g, 0.5));
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t f = 0; f < fx->l->n_out && nan && padded(y, x, b); f++) {
                    int64_t idx[4] = {y, x, b, f};
                    rl_tensor_set(&g, idx, NAN);
                }
    for (int i = 0; i < 2; i++) {
        CHECK_OK(rl_tensor_empty_like(&gi[i], fx->io.in[i]));
        CHECK_OK(rl_op_fill(&gi[i], 7.0)); /* every entry must be set */
    }
    rl_tensor *pg[2] = {&gi[0], &gi[1]};
    CHECK_OK(fx->l->ops->backward(fx->l, &fx->io, &g, pg));
    const rl_tensor *parts[4] = {&fx->l->out, &fx->pg, &gi[0], &gi[1]};
    int64_t n = 0;
    for (int i = 0; i < 4; i++)
        n += rl_tensor_numel(parts[i]);
    CHECK_OK(rl_tensor_empty(res, RL_FLOAT64, RL_DEVICE_CPU, 1, &n));
    double *r = rl_tensor_data(res);
    for (int i = 0; i < 4; i++) {
        rl_tensor c = {0}, d = {0};
        CHECK_OK(rl_op_contiguous(&c, parts[i]));
        CHECK_OK(rl_op_to(&d, &c, RL_FLOAT64, RL_DEVICE_CPU));
        memcpy(r, rl_tensor_data(&d), (size_t)rl_tensor_numel(&d) * sizeof *r);
        r += rl_tensor_numel(&d);
        rl_tensor_release(&c);
        rl_tensor_release(&d);
    }
    rl_tensor_release(&g);
    for (int i = 0; i < 2; i++)
        rl_tensor_release(&gi[i]);
}

/* NaN in every padded input position and in grad_out there: out, all gradients bit for bit
 * those of the same batch with finite padding (so none is NaN), input gradients 0 on padding;
 * float32 and float64, standard and stable cells, concat and sum */
static void test_nan_padding(void) {
    const config cfs[2] = {{"tl,tr,bl,br", "concat", "standard"}, {"tl,br", "sum", "stable"}};
    const rl_dtype dts[2] = {RL_FLOAT32, RL_FLOAT64};
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++) {
            fixture a, b;
            CHECK_OK(fixture_init(&a, &cfs[c], dts[t]));
            CHECK_OK(fixture_init(&b, &cfs[c], dts[t]));
            for (int64_t y = 0; y < H; y++)
                for (int64_t x = 0; x < W; x++)
                    for (int64_t bb = 0; bb < B; bb++) {
                        if (!padded(y, x, bb)) continue;
                        for (int64_t f = 0; f < F1; f++) {
                            int64_t idx[4] = {y, x, bb, f};
                            rl_tensor_set(&b.x1, idx, NAN);
                        }
                        for (int64_t f = 0; f < F2 + 2; f++) {
                            int64_t idx[4] = {y, x, bb, f};
                            rl_tensor_set(&b.xbig, idx, NAN);
                        }
                    }
            rl_tensor ra = {0}, rb = {0};
            run_any(&a, false, &ra);
            run_any(&b, true, &rb);
            const double *pa = rl_tensor_data(&ra), *pb = rl_tensor_data(&rb);
            int64_t n = rl_tensor_numel(&ra), bad = 0, nans = 0;
            for (int64_t i = 0; i < n; i++) {
                if (isnan(pb[i])) nans++;
                if (memcmp(&pa[i], &pb[i], sizeof *pa) != 0) bad++;
            }
            if (nans || bad)
                fprintf(stderr, "NaN padding (%s, %s, %s): %lld NaN, %lld differ of %lld\n",
                        rl_cpu_level_name(rl_cpu_level_get()), cfs[c].dirs, rl_dtype_name(dts[t]),
                        (long long)nans, (long long)bad, (long long)n);
            CHECK(nans == 0);
            CHECK(bad == 0);
            /* the input gradients (the last entries) are 0 on padding */
            int64_t n1 = (int64_t)H * W * B * F1, n2 = (int64_t)H * W * B * F2, e = n - n1 - n2;
            double pad = 0;
            for (int64_t i = 0; i < n1 + n2; i++) {
                int64_t Fi = i < n1 ? F1 : F2, j = i < n1 ? i : i - n1;
                int64_t y = j / (W * B * Fi), x = (j / (B * Fi)) % W, bb = (j / Fi) % B;
                if (padded(y, x, bb)) pad = fmax(pad, fabs(pb[e + i]));
            }
            CHECK(pad == 0.0);
            rl_tensor_release(&ra);
            rl_tensor_release(&rb);
            fixture_free(&a);
            fixture_free(&b);
        }
}

int main(void) {
    rl_ops_init();
    test_options_and_errors();
    test_device_lists();
    test_forward();
    /* the packed recurrent products at every level this CPU has */
    for (int lv = RL_CPU_GENERIC; lv <= (int)rl_cpu_level_supported(); lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        test_float32();
        test_nan_padding();
    }
    CHECK_OK(rl_cpu_level_set(rl_cpu_level_supported()));
    test_gradients();
    TEST_MAIN_END();
}
