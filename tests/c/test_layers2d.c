/* Tests of the 2-D layers (conv2d, pool2d, collapse, global_pool) on tiny ragged images:
 * forward against float64 references written here with plain loops, the per-image output
 * sizes/lengths, zeros on output padding, results that do not depend on the other images of
 * the batch, central-difference gradient checks of every input and parameter (gradcheck2d.h)
 * with exactly zero gradient on input padding, and errors that name the layer. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../core/device.h"
#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"
#include "check.h"
#include "gradcheck.h"
#include "gradcheck2d.h"

enum { H = 5, W = 6, B = 3, F = 2 };
static const int SIZES[2 * B] = {5, 6, 2, 3, 4, 1};

typedef struct {
    rl_layer *l;
    rl_tensor x, sizes, pv, pg;
    rl_tensor *px;
} fixture;

static void fx_free(fixture *f) {
    rl_layer_free(f->l);
    rl_tensor_release(&f->x);
    rl_tensor_release(&f->sizes);
    rl_tensor_release(&f->pv);
    rl_tensor_release(&f->pg);
    memset(f, 0, sizeof *f);
}

/* A layer of class cls on random (h, w, nb, F) float64 images with sizes hw. */
static bool fx_make(fixture *f, const char *cls, gc_opts *o, int64_t h, int64_t w, int64_t nb,
                    const int *hw, uint64_t seed) {
    memset(f, 0, sizeof *f);
    rl_options opts = gc_options(o);
    int64_t dims[1] = {F};
    rl_status st = rl_layer_create(&f->l, cls, cls, &opts, 1, dims);
    CHECK_OK(st);
    if (st != RL_OK) return false;
    rl_rng g;
    rl_rng_seed(&g, seed);
    st = gc2d_random_input(&f->x, RL_FLOAT64, h, w, nb, F, &g);
    f->px = &f->x;
    if (st == RL_OK) st = gc2d_sizes(&f->sizes, nb, hw);
    if (st == RL_OK) st = gc_bind_params_nonzero(f->l, RL_FLOAT64, &g, &f->pv, &f->pg);
    CHECK_OK(st);
    if (st != RL_OK) fx_free(f);
    return st == RL_OK;
}

static rl_status fx_forward(fixture *f) {
    rl_layer_io io;
    memset(&io, 0, sizeof io);
    io.n_in = 1;
    io.in[0] = &f->x;
    io.sizes = &f->sizes;
    return f->l->ops->forward(f->l, &io);
}

static double get4(const rl_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t idx[4] = {a, b, c, d};
    return rl_tensor_get(t, idx);
}

static double get3(const rl_tensor *t, int64_t a, int64_t b, int64_t c) {
    int64_t idx[3] = {a, b, c};
    return rl_tensor_get(t, idx);
}

static int64_t size_of(const rl_tensor *s, int64_t b, int64_t k) {
    int64_t idx[2] = {b, k};
    return (int64_t)rl_tensor_get(s, idx);
}

/* x inside image b, 0 outside it */
static double xin(const fixture *f, int64_t y, int64_t x, int64_t b, int64_t c) {
    if (y < 0 || x < 0 || y >= size_of(&f->sizes, b, 0) || x >= size_of(&f->sizes, b, 1)) return 0;
    return get4(&f->x, y, x, b, c);
}

static void run_gc(const char *what, fixture *f, const rl_tensor *(*geo)(const rl_layer *)) {
    gc2d_config cfg = {1e-6, 0, false, 11, geo};
    gc_report rep;
    CHECK_OK(gc2d_check(f->l, 1, &f->px, &f->sizes, &cfg, &rep));
    gc_print(what, &rep);
    CHECK(rep.n_checked > 0);
    CHECK(rep.max_rel < 1e-6);
    CHECK(rep.max_pad_analytic == 0.0);
    CHECK(rep.max_pad_numeric < 1e-12);
}

/* ---------------------------------------------------------------- conv2d */

typedef struct {
    int fh, fw, sy, sx;
    bool same;
    const char *act;
} conv_case;

static int64_t extent(bool same, int64_t n, int64_t k, int64_t s) {
    return same ? (n + s - 1) / s : (n - k) / s + 1;
}

static void check_conv(const conv_case *cc, const char *name) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 3);
    gc_opt_num(&o, "filter_size[1]", cc->fh);
    gc_opt_num(&o, "filter_size[2]", cc->fw);
    gc_opt_num(&o, "strides[1]", cc->sy);
    gc_opt_num(&o, "strides[2]", cc->sx);
    gc_opt_str(&o, "padding", cc->same ? "same" : "valid");
    gc_opt_str(&o, "activation", cc->act);
    fixture f;
    int sizes[2 * B] = {5, 6, 2, 3, 4, 2};
    if (!fx_make(&f, "conv2d", &o, H, W, B, cc->same ? SIZES : sizes, 3)) return;
    CHECK_OK(fx_forward(&f));
    const rl_tensor *os = rl_conv2d_out_sizes(f.l);
    CHECK(os != NULL && rl_pool2d_out_sizes(f.l) == NULL);
    int64_t Ho = extent(cc->same, H, cc->fh, cc->sy), Wo = extent(cc->same, W, cc->fw, cc->sx);
    CHECK(f.l->out.ndim == 4 && f.l->out.shape[0] == Ho && f.l->out.shape[1] == Wo &&
          f.l->out.shape[2] == B && f.l->out.shape[3] == 3);
    int64_t py = cc->same ? (cc->fh - 1) / 2 : 0, px = cc->same ? (cc->fw - 1) / 2 : 0;
    double maxerr = 0, maxpad = 0;
    int64_t W_ = rl_layer_find_param(f.l, "W"), b_ = rl_layer_find_param(f.l, "b");
    for (int64_t b = 0; b < B; b++) {
        int64_t ho = extent(cc->same, size_of(&f.sizes, b, 0), cc->fh, cc->sy);
        int64_t wo = extent(cc->same, size_of(&f.sizes, b, 1), cc->fw, cc->sx);
        CHECK(size_of(os, b, 0) == ho && size_of(os, b, 1) == wo);
        for (int64_t yo = 0; yo < Ho; yo++)
            for (int64_t xo = 0; xo < Wo; xo++)
                for (int64_t k = 0; k < 3; k++) {
                    double got = get4(&f.l->out, yo, xo, b, k);
                    if (yo >= ho || xo >= wo) {
                        maxpad = fmax(maxpad, fabs(got));
                        continue;
                    }
                    int64_t bi[1] = {k};
                    double z = rl_tensor_get(&f.l->params[b_].value, bi);
                    for (int64_t i = 0; i < cc->fh; i++)
                        for (int64_t j = 0; j < cc->fw; j++)
                            for (int64_t c = 0; c < F; c++) {
                                int64_t wi[2] = {(i * cc->fw + j) * F + c, k};
                                z += xin(&f, yo * cc->sy - py + i, xo * cc->sx - px + j, b, c) *
                                     rl_tensor_get(&f.l->params[W_].value, wi);
                            }
                    double want = !strcmp(cc->act, "tanh") ? tanh(z) : z > 0 ? z : 0;
                    maxerr = fmax(maxerr, fabs(got - want));
                }
    }
    CHECK(maxerr < 1e-12);
    CHECK(maxpad == 0.0);
    run_gc(name, &f, rl_conv2d_out_sizes);

    /* image 2 alone in a batch of its own size gives the same outputs */
    int64_t h2 = size_of(&f.sizes, 1, 0), w2 = size_of(&f.sizes, 1, 1);
    int hw2[2] = {(int)h2, (int)w2};
    fixture g;
    if (fx_make(&g, "conv2d", &o, h2, w2, 1, hw2, 5)) {
        CHECK_OK(rl_op_copy(&g.pv, &f.pv));
        for (int64_t y = 0; y < h2; y++)
            for (int64_t x = 0; x < w2; x++)
                for (int64_t c = 0; c < F; c++) {
                    int64_t idx[4] = {y, x, 0, c};
                    rl_tensor_set(&g.x, idx, get4(&f.x, y, x, 1, c));
                }
        CHECK_OK(fx_forward(&g));
        CHECK_OK(fx_forward(&f)); /* the gradient check left a perturbed forward behind */
        double d = 0;
        for (int64_t y = 0; y < size_of(os, 1, 0); y++)
            for (int64_t x = 0; x < size_of(os, 1, 1); x++)
                for (int64_t k = 0; k < 3; k++)
                    d = fmax(d, fabs(get4(&g.l->out, y, x, 0, k) - get4(&f.l->out, y, x, 1, k)));
        CHECK(d < 1e-12);
        fx_free(&g);
    }
    fx_free(&f);
}

static void test_conv2d(void) {
    conv_case a = {3, 3, 1, 1, true, "tanh"};
    conv_case b = {2, 2, 1, 2, false, "relu"};
    conv_case c = {3, 2, 2, 2, true, "tanh"};
    check_conv(&a, "conv2d same 3x3");
    check_conv(&b, "conv2d valid 2x2 stride 1,2");
    check_conv(&c, "conv2d same 3x2 stride 2");
}

/* ---------------------------------------------------------------- pool2d */

static void check_pool(const char *mode, int ph, int pw, int s, bool same, const char *name) {
    gc_opts o = {0};
    gc_opt_str(&o, "mode", mode);
    gc_opt_num(&o, "pool_size[1]", ph);
    gc_opt_num(&o, "pool_size[2]", pw);
    if (s) {
        gc_opt_num(&o, "strides[1]", s);
        gc_opt_num(&o, "strides[2]", s);
    }
    gc_opt_str(&o, "padding", same ? "same" : "valid");
    int sizes[2 * B] = {5, 6, 2, 3, 4, 2};
    fixture f;
    if (!fx_make(&f, "pool2d", &o, H, W, B, sizes, 9)) return;
    int64_t sy = s ? s : ph, sx = s ? s : pw;
    int64_t py = same ? (ph - 1) / 2 : 0, px = same ? (pw - 1) / 2 : 0;
    CHECK_OK(fx_forward(&f));
    const rl_tensor *os = rl_pool2d_out_sizes(f.l);
    CHECK(os != NULL);
    double maxerr = 0, maxpad = 0;
    bool is_max = !strcmp(mode, "max");
    for (int64_t b = 0; b < B; b++) {
        int64_t h = size_of(&f.sizes, b, 0), w = size_of(&f.sizes, b, 1);
        int64_t ho = extent(same, h, ph, sy), wo = extent(same, w, pw, sx);
        CHECK(size_of(os, b, 0) == ho && size_of(os, b, 1) == wo);
        for (int64_t yo = 0; yo < f.l->out.shape[0]; yo++)
            for (int64_t xo = 0; xo < f.l->out.shape[1]; xo++)
                for (int64_t c = 0; c < F; c++) {
                    double got = get4(&f.l->out, yo, xo, b, c);
                    if (yo >= ho || xo >= wo) {
                        maxpad = fmax(maxpad, fabs(got));
                        continue;
                    }
                    double acc = is_max ? -INFINITY : 0;
                    int n = 0;
                    for (int64_t i = 0; i < ph; i++)
                        for (int64_t j = 0; j < pw; j++) {
                            int64_t y = yo * sy - py + i, x = xo * sx - px + j;
                            if (y < 0 || x < 0 || y >= h || x >= w) continue;
                            double v = get4(&f.x, y, x, b, c);
                            acc = is_max ? fmax(acc, v) : acc + v;
                            n++;
                        }
                    if (!is_max) acc /= n;
                    maxerr = fmax(maxerr, fabs(got - acc));
                }
    }
    CHECK(maxerr < 1e-12);
    CHECK(maxpad == 0.0);
    run_gc(name, &f, rl_pool2d_out_sizes);
    fx_free(&f);
}

/* NaN in the padding of a batch (outside an image: its input frames and the gradient arriving
 * for its padded outputs) must not reach outputs, parameter gradients or input gradients:
 * padding is zeroed by selection, not by a multiplication (NaN * 0 = NaN). */
static void test_conv2d_nan_padding(void) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 3);
    gc_opt_num(&o, "filter_size[1]", 3);
    gc_opt_str(&o, "activation", "tanh");
    fixture f;
    if (!fx_make(&f, "conv2d", &o, H, W, B, SIZES, 31)) return;
    rl_tensor gout = {0}, gin = {0}, gref = {0}, gin_ref = {0};
    CHECK_OK(fx_forward(&f));
    CHECK_OK(rl_tensor_empty(&gout, RL_FLOAT64, RL_DEVICE_CPU, 4, f.l->out.shape));
    CHECK_OK(rl_tensor_empty(&gin, RL_FLOAT64, RL_DEVICE_CPU, 4, f.x.shape));
    CHECK_OK(rl_tensor_empty(&gin_ref, RL_FLOAT64, RL_DEVICE_CPU, 4, f.x.shape));
    const rl_tensor *os = rl_conv2d_out_sizes(f.l);
    /* reference: clean input, grad_out 0.5 on valid outputs and 0 on padded ones */
    for (int pass = 0; pass < 2; pass++) {
        bool nan = pass == 1;
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++)
                for (int64_t b = 0; b < B; b++)
                    for (int64_t c = 0; c < F; c++) {
                        bool in = y < size_of(&f.sizes, b, 0) && x < size_of(&f.sizes, b, 1);
                        int64_t idx[4] = {y, x, b, c};
                        if (!in) rl_tensor_set(&f.x, idx, nan ? NAN : 0.0);
                    }
        for (int64_t y = 0; y < f.l->out.shape[0]; y++)
            for (int64_t x = 0; x < f.l->out.shape[1]; x++)
                for (int64_t b = 0; b < B; b++)
                    for (int64_t k = 0; k < 3; k++) {
                        bool in = y < size_of(os, b, 0) && x < size_of(os, b, 1);
                        int64_t idx[4] = {y, x, b, k};
                        rl_tensor_set(&gout, idx, in ? 0.5 : nan ? NAN : 0.0);
                    }
        CHECK_OK(rl_op_fill(&f.pg, 0.0));
        CHECK_OK(fx_forward(&f));
        rl_layer_io io;
        memset(&io, 0, sizeof io);
        io.n_in = 1;
        io.in[0] = &f.x;
        io.sizes = &f.sizes;
        rl_tensor *gi[1] = {nan ? &gin : &gin_ref};
        CHECK_OK(f.l->ops->backward(f.l, &io, &gout, gi));
        if (!nan) {
            CHECK_OK(rl_op_contiguous(&gref, &f.pg));
            continue;
        }
        double dout = 0, dpar = 0, dgin = 0;
        for (int64_t e = 0; e < rl_tensor_numel(&f.l->out); e++) {
            double v = ((const double *)rl_tensor_data(&f.l->out))[e];
            dout = isnan(v) ? INFINITY : fmax(dout, fabs(v) > 1 ? INFINITY : 0);
        }
        const double *pg = rl_tensor_data(&f.pg), *pr = rl_tensor_data(&gref);
        for (int64_t e = 0; e < rl_tensor_numel(&gref); e++)
            dpar = fmax(dpar, isnan(pg[e]) ? INFINITY : fabs(pg[e] - pr[e]));
        for (int64_t e = 0; e < rl_tensor_numel(&gin); e++) {
            double a = ((const double *)rl_tensor_data(&gin))[e];
            double r = ((const double *)rl_tensor_data(&gin_ref))[e];
            dgin = fmax(dgin, isnan(a) ? INFINITY : fabs(a - r));
        }
        CHECK(dout == 0);   /* every output finite and within tanh's range */
        CHECK(dpar == 0.0); /* parameter gradients as with zero padding, bit for bit */
        CHECK(dgin == 0.0); /* input gradients too (0 on padding) */
    }
    rl_tensor_release(&gout);
    rl_tensor_release(&gin);
    rl_tensor_release(&gin_ref);
    rl_tensor_release(&gref);
    fx_free(&f);
}

static void test_pool2d(void) {
    check_pool("max", 2, 2, 0, false, "pool2d max 2x2");
    check_pool("avg", 2, 2, 0, false, "pool2d avg 2x2");
    check_pool("max", 3, 3, 2, true, "pool2d max 3x3 same stride 2");
    check_pool("avg", 3, 2, 1, true, "pool2d avg 3x2 same");
}

/* ---------------------------------------------------------------- collapse, global_pool */

static void check_collapse(const char *mode) {
    gc_opts o = {0};
    gc_opt_str(&o, "mode", mode);
    fixture f;
    if (!fx_make(&f, "collapse", &o, H, W, B, SIZES, 13)) return;
    CHECK_OK(fx_forward(&f));
    const rl_tensor *len = rl_collapse_out_lengths(f.l);
    CHECK(len != NULL && rl_global_pool_out_lengths(f.l) == NULL);
    CHECK(f.l->out.ndim == 3 && f.l->out.shape[0] == W && f.l->out.shape[1] == B);
    double maxerr = 0, maxpad = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t h = size_of(&f.sizes, b, 0), w = size_of(&f.sizes, b, 1);
        CHECK((int64_t)rl_tensor_get(len, &b) == w);
        for (int64_t x = 0; x < W; x++)
            for (int64_t c = 0; c < F; c++) {
                double got = get3(&f.l->out, x, b, c);
                if (x >= w) {
                    maxpad = fmax(maxpad, fabs(got));
                    continue;
                }
                double want = !strcmp(mode, "max") ? -INFINITY : 0;
                for (int64_t y = 0; y < h; y++) {
                    double v = get4(&f.x, y, x, b, c);
                    want = !strcmp(mode, "max") ? fmax(want, v) : want + v;
                }
                if (!strcmp(mode, "last")) want = get4(&f.x, h - 1, x, b, c);
                maxerr = fmax(maxerr, fabs(got - want));
            }
    }
    CHECK(maxerr < 1e-12);
    CHECK(maxpad == 0.0);
    char name[64];
    snprintf(name, sizeof name, "collapse %s", mode);
    run_gc(name, &f, rl_collapse_out_lengths);
    fx_free(&f);
}

static void check_global_pool(const char *mode) {
    gc_opts o = {0};
    gc_opt_str(&o, "mode", mode);
    fixture f;
    if (!fx_make(&f, "global_pool", &o, H, W, B, SIZES, 17)) return;
    CHECK_OK(fx_forward(&f));
    const rl_tensor *len = rl_global_pool_out_lengths(f.l);
    CHECK(len != NULL);
    CHECK(f.l->out.ndim == 3 && f.l->out.shape[0] == 1 && f.l->out.shape[1] == B);
    double maxerr = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t h = size_of(&f.sizes, b, 0), w = size_of(&f.sizes, b, 1);
        CHECK((int64_t)rl_tensor_get(len, &b) == 1);
        for (int64_t c = 0; c < F; c++) {
            double want = !strcmp(mode, "max") ? -INFINITY : 0;
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    double v = get4(&f.x, y, x, b, c);
                    want = !strcmp(mode, "max") ? fmax(want, v) : want + v;
                }
            if (!strcmp(mode, "mean")) want /= (double)(h * w);
            maxerr = fmax(maxerr, fabs(get3(&f.l->out, 0, b, c) - want));
        }
    }
    CHECK(maxerr < 1e-12);
    char name[64];
    snprintf(name, sizeof name, "global_pool %s", mode);
    run_gc(name, &f, rl_global_pool_out_lengths);
    fx_free(&f);
}

static void test_collapse_global_pool(void) {
    check_collapse("sum");
    check_collapse("max");
    check_collapse("last");
    check_global_pool("mean");
    check_global_pool("max");
}

/* ---------------------------------------------------------------- float32, errors */

static void test_float32(void) {
    gc_opts o = {0};
    gc_opt_num(&o, "n_out", 4);
    gc_opt_num(&o, "filter_size[1]", 3);
    fixture f;
    if (!fx_make(&f, "conv2d", &o, H, W, B, SIZES, 21)) return;
    rl_tensor x32 = {0};
    CHECK_OK(rl_op_to(&x32, &f.x, RL_FLOAT32, RL_DEVICE_CPU));
    rl_tensor v64 = {0};
    CHECK_OK(rl_op_contiguous(&v64, &f.pv));
    CHECK_OK(fx_forward(&f));
    rl_tensor out64 = {0};
    CHECK_OK(rl_op_to(&out64, &f.l->out, RL_FLOAT64, RL_DEVICE_CPU));
    rl_tensor pv32 = {0}, pg32 = {0};
    CHECK_OK(rl_op_to(&pv32, &f.pv, RL_FLOAT32, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&pg32, &f.pg, RL_FLOAT32, RL_DEVICE_CPU));
    int64_t off = 0;
    for (int i = 0; i < f.l->n_params; i++) {
        rl_param *p = &f.l->params[i];
        int64_t k = rl_tensor_numel(&p->value);
        rl_tensor a = {0}, b = {0};
        rl_tensor_release(&p->value);
        rl_tensor_release(&p->grad);
        CHECK_OK(rl_tensor_narrow(&a, &pv32, 0, off, k));
        CHECK_OK(rl_tensor_narrow(&b, &pg32, 0, off, k));
        CHECK_OK(rl_tensor_view(&p->value, &a, p->ndim, p->shape));
        CHECK_OK(rl_tensor_view(&p->grad, &b, p->ndim, p->shape));
        rl_tensor_release(&a);
        rl_tensor_release(&b);
        off += k;
    }
    rl_layer_io io;
    memset(&io, 0, sizeof io);
    io.n_in = 1;
    io.in[0] = &x32;
    io.sizes = &f.sizes;
    CHECK_OK(f.l->ops->forward(f.l, &io));
    double d = 0;
    for (int64_t e = 0; e < rl_tensor_numel(&out64); e++)
        d = fmax(d, fabs(((const float *)rl_tensor_data(&f.l->out))[e] -
                         ((const double *)rl_tensor_data(&out64))[e]));
    CHECK(d < 1e-5);
    rl_tensor_release(&x32);
    rl_tensor_release(&v64);
    rl_tensor_release(&out64);
    rl_tensor_release(&pv32);
    rl_tensor_release(&pg32);
    fx_free(&f);
}

static void expect_error(rl_status st, const char *needle) {
    CHECK(st != RL_OK);
    if (st != RL_OK && !strstr(rl_errmsg(), needle)) {
        fprintf(stderr, "error message '%s' lacks '%s'\n", rl_errmsg(), needle);
        CHECK(0);
    }
}

static void test_errors(void) {
    rl_layer *l = NULL;
    int64_t dims[2] = {F, F};
    gc_opts o = {0};
    rl_options opts = gc_options(&o);
    expect_error(rl_layer_create(&l, "conv2d", "c1", &opts, 1, dims), "n_out");
    gc_opt_num(&o, "n_out", 2);
    expect_error(rl_layer_create(&l, "conv2d", "c1", &opts, 1, dims), "filter_size");
    gc_opt_num(&o, "filter_size[1]", 3);
    expect_error(rl_layer_create(&l, "conv2d", "c1", &opts, 2, dims), "one input");
    gc_opt_str(&o, "padding", "full");
    expect_error(rl_layer_create(&l, "conv2d", "c1", &opts, 1, dims), "padding");
    gc_opts m = {0};
    gc_opt_str(&m, "mode", "median");
    rl_options mo = gc_options(&m);
    expect_error(rl_layer_create(&l, "collapse", "col", &mo, 1, dims), "mode");
    expect_error(rl_layer_create(&l, "global_pool", "gp", &mo, 1, dims), "mode");
    expect_error(rl_layer_create(&l, "pool2d", "p", &mo, 1, dims), "pool_size");
    CHECK(rl_layer_class_flags("conv2d") == (RL_LAYER_IN_2D | RL_LAYER_OUT_2D));
    CHECK(rl_layer_class_flags("collapse") == RL_LAYER_IN_2D);
    CHECK(rl_layer_class_flags("activation") == RL_LAYER_ANY_RANK);

    /* valid padding on an image smaller than the filter; a 3-D input */
    gc_opts v = {0};
    gc_opt_num(&v, "n_out", 2);
    gc_opt_num(&v, "filter_size[1]", 3);
    gc_opt_str(&v, "padding", "valid");
    fixture f;
    if (fx_make(&f, "conv2d", &v, H, W, B, SIZES, 23)) {
        expect_error(fx_forward(&f), "image 2 is 2 x 3");
        rl_tensor x3 = {0};
        int64_t s3[3] = {H, W * B, F};
        CHECK_OK(rl_tensor_view(&x3, &f.x, 3, s3));
        rl_layer_io io;
        memset(&io, 0, sizeof io);
        io.n_in = 1;
        io.in[0] = &x3;
        io.sizes = &f.sizes;
        expect_error(f.l->ops->forward(f.l, &io), "'conv2d'");
        rl_tensor_release(&x3);
        fx_free(&f);
    }
}

/* CUDA data where no CUDA device can be used (a CPU-only build, or no GPU): each 2-D layer
 * refuses it with an error naming the layer and the device, before it reads the data. The input
 * is the fixture's CPU tensor relabelled as cuda:0, so this runs only where cuda:0 is unusable. */
static void test_cuda_unavailable(void) {
    rl_device cuda0 = {RL_CUDA, 0};
    if (rl_device_check(cuda0) == RL_OK) return;
    static const char *const classes[4] = {"conv2d", "pool2d", "collapse", "global_pool"};
    for (int c = 0; c < 4; c++) {
        gc_opts o = {0};
        gc_opt_num(&o, "n_out", 2);
        gc_opt_num(&o, "filter_size[1]", 3);
        gc_opt_num(&o, "pool_size[1]", 2);
        fixture f;
        if (!fx_make(&f, classes[c], &o, H, W, B, SIZES, 29)) continue;
        rl_storage fake = *f.x.storage;
        fake.device = cuda0;
        rl_tensor xf = f.x;
        xf.storage = &fake;
        rl_layer_io io;
        memset(&io, 0, sizeof io);
        io.n_in = 1;
        io.in[0] = &xf;
        io.sizes = &f.sizes;
        char needle[64];
        snprintf(needle, sizeof needle, "(class %s)", classes[c]);
        rl_status st = f.l->ops->forward(f.l, &io);
        CHECK(st == RL_EDEVICE);
        expect_error(st, needle);
        expect_error(st, "cuda:0");
        fx_free(&f);
    }
}

int main(void) {
    rl_ops_init();
    test_conv2d();
    test_conv2d_nan_padding();
    test_pool2d();
    test_collapse_global_pool();
    test_float32();
    test_errors();
    test_cuda_unavailable();
    TEST_MAIN_END();
}
