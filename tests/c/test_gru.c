/* The gru layer against PyTorch's nn.GRU (values computed once by tests/c/gru_torch_ref.py and
 * stored in gru_torch_ref.h, with the weights copied in PyTorch's layout) and against a float64
 * reference written here (per-step loops, no BLAS): both directions, ragged lengths, NaN in the
 * padded frames of the input that must reach no output and no gradient, several inputs, a given
 * initial state; a central-difference gradient check in float64 of inputs, parameters and the
 * initial state; one step at a time with explicit state equals the whole sequence; float32
 * (packed per-step products, two threads) near float64 at every CPU level of this machine; errors
 * naming the layer for bad options, bad batches and backward calls that do not match their forward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "../../core/blas.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"

#include "gru_torch_ref.h"

/* Options from a fixed table: key -> number. */
typedef struct {
    const char *keys[4];
    double vals[4];
    int n;
} opt_table;

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
    (void)ctx, (void)key, (void)v;
    *found = 0;
    return RL_OK;
}
static rl_status opt_bool(void *ctx, const char *key, bool *v, int *found) {
    (void)ctx, (void)key, (void)v;
    *found = 0;
    return RL_OK;
}

static rl_status make_layer(rl_layer **l, const char *name, double H, double dir, int n_in,
                            const int64_t *F) {
    opt_table t = {{"n_out", "direction"}, {H, dir}, 2};
    rl_options o = {&t, opt_num, opt_str, opt_bool, NULL};
    return rl_layer_create(l, "gru", name, &o, n_in, F);
}

enum { T = 4, B = 3, H = 3 };
static const int32_t LENS[B] = {4, 1, 3};

/* The closed forms of gru_torch_ref.py (kind 0 x, 1 weight_ih, 2 weight_hh, 3 bias_ih,
 * 4 bias_hh, 5 h0, 6 R). */
static double val(int kind, int64_t i) {
    return 0.6 * sin(0.37 * (double)i + 0.9 * kind + 0.2) + (kind == 1 ? 0.1 : 0.0);
}

typedef struct {
    int dir, n_in;
    int64_t F[2];
    bool init_state;
} config;

typedef struct {
    rl_layer *l;
    rl_tensor x[2], len, h0, gout, gin[2];
} fixture;

static double urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void tensor64(rl_tensor *t, int ndim, const int64_t *shape) {
    CHECK_OK(rl_tensor_empty(t, RL_FLOAT64, RL_DEVICE_CPU, ndim, shape));
}

/* The fixture's float64 layer with closed-form values: with one input of 2 features the
 * weights are PyTorch's of gru_torch_ref.py, copied as the layer's header says (W =
 * weight_ih_l0^T, U = weight_hh_l0^T, b = bias_ih_l0, b_h = bias_hh_l0). Padded input frames
 * hold NaN. */
static void fixture_init(fixture *f, const config *c) {
    memset(f, 0, sizeof *f);
    CHECK_OK(make_layer(&f->l, "enc", H, c->dir, c->n_in, c->F));
    if (!f->l) exit(1);
    int64_t Ftot = c->F[0] + (c->n_in > 1 ? c->F[1] : 0);
    for (int i = 0; i < f->l->n_params; i++) {
        rl_param *p = &f->l->params[i];
        tensor64(&p->value, p->ndim, p->shape);
        tensor64(&p->grad, p->ndim, p->shape);
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
        double *v = rl_tensor_data(&p->value);
        for (int64_t r = 0; r < p->shape[0]; r++)
            for (int64_t g = 0; g < (p->ndim == 2 ? 3 * H : 1); g++) {
                if (i == 0) v[r * 3 * H + g] = val(1, g * Ftot + r);
                if (i == 1) v[r * 3 * H + g] = val(2, g * H + r);
                if (i >= 2) v[r] = val(i + 1, r);
            }
    }
    for (int k = 0; k < c->n_in; k++) {
        int64_t sh[3] = {T, B, c->F[k]};
        tensor64(&f->x[k], 3, sh);
        tensor64(&f->gin[k], 3, sh);
        double *x = rl_tensor_data(&f->x[k]);
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < c->F[k]; i++)
                    x[(t * B + b) * c->F[k] + i] =
                        t >= LENS[b] ? NAN : val(0, (t * B + b) * c->F[k] + i + 100 * k);
    }
    int64_t bs[1] = {B}, st[2] = {B, H}, os[3] = {T, B, H};
    CHECK_OK(rl_tensor_empty(&f->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    memcpy(rl_tensor_data(&f->len), LENS, sizeof LENS);
    tensor64(&f->h0, 2, st);
    tensor64(&f->gout, 3, os);
    for (int i = 0; i < B * H; i++)
        ((double *)rl_tensor_data(&f->h0))[i] = val(5, i);
    double *r = rl_tensor_data(&f->gout);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++)
                r[(t * B + b) * H + j] = t < LENS[b] ? val(6, (t * B + b) * H + j) : 0.0;
    if (c->init_state) CHECK_OK(rl_gru_set_initial_state(f->l, &f->h0));
}

static void fixture_free(fixture *f, int n_in) {
    rl_layer_free(f->l);
    for (int k = 0; k < n_in; k++) {
        rl_tensor_release(&f->x[k]);
        rl_tensor_release(&f->gin[k]);
    }
    rl_tensor_release(&f->len);
    rl_tensor_release(&f->h0);
    rl_tensor_release(&f->gout);
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

/* The reference: out (T, B, H), final state hT (B, H); written from the equations, in rnnlua's
 * layout (W (F, 3H), U (H, 3H)). */
static void reference(fixture *f, const config *c, double *out, double *hT) {
    const double *W = rl_tensor_data(&f->l->params[0].value);
    const double *U = rl_tensor_data(&f->l->params[1].value);
    const double *bi = rl_tensor_data(&f->l->params[2].value);
    const double *bh = rl_tensor_data(&f->l->params[3].value);
    const double *h0 = rl_tensor_data(&f->h0);
    for (int b = 0; b < B; b++) {
        double h[H];
        for (int j = 0; j < H; j++)
            h[j] = c->init_state ? h0[b * H + j] : 0.0;
        for (int s = 0; s < T; s++) {
            int t = c->dir > 0 ? s : T - 1 - s;
            if (t >= LENS[b]) {
                for (int j = 0; j < H; j++)
                    out[(t * B + b) * H + j] = 0.0;
                continue;
            }
            double gx[3 * H], gh[3 * H];
            for (int n = 0; n < 3 * H; n++) {
                gx[n] = bi[n];
                gh[n] = bh[n];
                int row = 0;
                for (int k = 0; k < c->n_in; k++) {
                    const double *x = rl_tensor_data(&f->x[k]);
                    for (int i = 0; i < c->F[k]; i++)
                        gx[n] += x[(t * B + b) * c->F[k] + i] * W[(row + i) * 3 * H + n];
                    row += (int)c->F[k];
                }
                for (int i = 0; i < H; i++)
                    gh[n] += h[i] * U[i * 3 * H + n];
            }
            for (int j = 0; j < H; j++) {
                double r = sig(gx[j] + gh[j]), z = sig(gx[H + j] + gh[H + j]);
                double n = tanh(gx[2 * H + j] + r * gh[2 * H + j]);
                h[j] = (1 - z) * n + z * h[j];
                out[(t * B + b) * H + j] = h[j];
            }
        }
        for (int j = 0; j < H; j++)
            hT[b * H + j] = h[j];
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

/* Compares the analytic gradient ga[i] with central differences of the loss in v[i]; NaN
 * entries of v (padding) are skipped, their gradient must be exactly 0. */
static void check_grad(fixture *f, const config *c, double *v, const double *ga, int64_t n,
                       const char *what) {
    double worst = 0;
    bool pad_zero = true;
    for (int64_t i = 0; i < n; i++) {
        double keep = v[i], eps = 1e-5;
        if (isnan(keep)) {
            pad_zero = pad_zero && ga[i] == 0.0;
            continue;
        }
        v[i] = keep + eps;
        double lp = loss_of(f, c);
        v[i] = keep - eps;
        double lm = loss_of(f, c);
        v[i] = keep;
        double num = (lp - lm) / (2 * eps);
        double den = fmax(fmax(fabs(num), fabs(ga[i])), 1e-3);
        double rel = fabs(num - ga[i]) / den;
        if (!(rel <= worst)) worst = rel;
    }
    if (worst > max_rel) max_rel = worst;
    if (!(worst < 1e-6) || !pad_zero)
        fprintf(stderr, "gradient of %s (dir %d, inputs %d, init %d): rel error %.3g%s\n", what,
                c->dir, c->n_in, c->init_state, worst, pad_zero ? "" : ", padding not 0");
    CHECK(worst < 1e-6);
    CHECK(pad_zero);
}

static double max_abs_diff(const double *a, const double *b, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= e)) e = fabs(a[i] - b[i]);
    return e;
}

/* Forward against the reference (and the final state), then backward (twice, checking +=)
 * against central differences. */
static void test_config(const config *c) {
    fixture f;
    fixture_init(&f, c);
    double ref[T * B * H], hT[B * H];
    reference(&f, c, ref, hT);
    (void)loss_of(&f, c);
    CHECK(max_abs_diff(rl_tensor_data(&f.l->out), ref, T * B * H) < 1e-12);
    rl_tensor hf = {0};
    CHECK_OK(rl_gru_final_state(f.l, &hf));
    CHECK(max_abs_diff(rl_tensor_data(&hf), hT, B * H) < 1e-12);
    rl_tensor_release(&hf);

    rl_layer_io io = make_io(&f, c);
    rl_tensor *gin[2] = {&f.gin[0], &f.gin[1]};
    for (int rep = 0; rep < 2; rep++) {
        (void)loss_of(&f, c);
        CHECK_OK(f.l->ops->backward(f.l, &io, &f.gout, gin));
    }
    /* backward leaves the states alone: the final state stays readable until the next forward */
    CHECK_OK(rl_gru_final_state(f.l, &hf));
    CHECK(max_abs_diff(rl_tensor_data(&hf), hT, B * H) < 1e-12);
    rl_tensor_release(&hf);
    rl_tensor dh0 = {0};
    CHECK_OK(rl_gru_initial_state_grad(f.l, &dh0));
    double gh[B * H];
    memcpy(gh, rl_tensor_data(&dh0), sizeof gh);
    rl_tensor_release(&dh0);
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
    if (c->init_state) check_grad(&f, c, rl_tensor_data(&f.h0), gh, B * H, "h0");
    fixture_free(&f, c->n_in);
}

/* PyTorch's numbers: output, final state and every gradient, with the weights copied from
 * PyTorch's layout (transposes checked element by element through the gradients). */
static void test_torch(int dir) {
    config c = {dir, 1, {2, 0}, true};
    fixture f;
    fixture_init(&f, &c);
    const double *out = dir > 0 ? REF_FW_out : REF_BW_out, *hT = dir > 0 ? REF_FW_hT : REF_BW_hT;
    const double *dWih = dir > 0 ? REF_FW_dW_ih : REF_BW_dW_ih;
    const double *dWhh = dir > 0 ? REF_FW_dW_hh : REF_BW_dW_hh;
    const double *dbih = dir > 0 ? REF_FW_db_ih : REF_BW_db_ih;
    const double *dbhh = dir > 0 ? REF_FW_db_hh : REF_BW_db_hh;
    const double *dx = dir > 0 ? REF_FW_dx : REF_BW_dx, *dh0 = dir > 0 ? REF_FW_dh0 : REF_BW_dh0;
    (void)loss_of(&f, &c);
    double e = max_abs_diff(rl_tensor_data(&f.l->out), out, T * B * H);
    rl_tensor hf = {0}, g0 = {0};
    CHECK_OK(rl_gru_final_state(f.l, &hf));
    e = fmax(e, max_abs_diff(rl_tensor_data(&hf), hT, B * H));
    rl_layer_io io = make_io(&f, &c);
    rl_tensor *gin[1] = {&f.gin[0]};
    CHECK_OK(f.l->ops->backward(f.l, &io, &f.gout, gin));
    CHECK_OK(rl_gru_initial_state_grad(f.l, &g0));
    /* the input gradient of padded frames is 0 here, PyTorch never saw those frames */
    const double *gx = rl_tensor_data(&f.gin[0]);
    for (int i = 0; i < T * B * 2; i++)
        e = fmax(e, fabs(gx[i] - dx[i]));
    e = fmax(e, max_abs_diff(rl_tensor_data(&g0), dh0, B * H));
    const double *dW = rl_tensor_data(&f.l->params[0].grad);
    const double *dU = rl_tensor_data(&f.l->params[1].grad);
    for (int g = 0; g < 3 * H; g++) {
        for (int i = 0; i < 2; i++)
            e = fmax(e, fabs(dW[i * 3 * H + g] - dWih[g * 2 + i]));
        for (int i = 0; i < H; i++)
            e = fmax(e, fabs(dU[i * 3 * H + g] - dWhh[g * H + i]));
    }
    e = fmax(e, max_abs_diff(rl_tensor_data(&f.l->params[2].grad), dbih, 3 * H));
    e = fmax(e, max_abs_diff(rl_tensor_data(&f.l->params[3].grad), dbhh, 3 * H));
    printf("gru vs PyTorch nn.GRU (direction %d): max abs difference %.3g\n", dir, e);
    CHECK(e < 1e-12);
    rl_tensor_release(&hf);
    rl_tensor_release(&g0);
    fixture_free(&f, 1);
}

/* One step at a time (T = 1, the state handed on with set_initial_state / final_state, and back
 * with initial_state_grad) gives the whole sequence's outputs and gradients: the per-step use a
 * rec unit makes of the layer. Full-length sequences, direction 1. */
static void test_steps(void) {
    enum { F = 2 };
    int64_t Fi[1] = {F};
    int32_t full[B] = {T, T, T};
    rl_layer *seq = NULL, *step = NULL;
    CHECK_OK(make_layer(&seq, "seq", H, 1, 1, Fi));
    CHECK_OK(make_layer(&step, "step", H, 1, 1, Fi));
    if (!seq || !step) return;
    uint64_t s = 77;
    for (int i = 0; i < seq->n_params; i++) {
        rl_param *p = &seq->params[i], *q = &step->params[i];
        tensor64(&p->value, p->ndim, p->shape);
        tensor64(&p->grad, p->ndim, p->shape);
        tensor64(&q->grad, p->ndim, p->shape);
        for (int64_t k = 0; k < rl_tensor_numel(&p->value); k++)
            ((double *)rl_tensor_data(&p->value))[k] = 0.5 * urand(&s);
        rl_tensor_share(&q->value, &p->value);
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
        CHECK_OK(rl_op_fill(&q->grad, 0.0));
    }
    int64_t xs[3] = {T, B, F}, os[3] = {T, B, H}, bs[1] = {B}, x1[3] = {1, B, F}, o1[3] = {1, B, H};
    rl_tensor x = {0}, gout = {0}, gin = {0}, len = {0}, hs[T + 1], xt[T], gt[T], dxt[T];
    tensor64(&x, 3, xs);
    tensor64(&gout, 3, os);
    tensor64(&gin, 3, xs);
    for (int64_t k = 0; k < T * B * F; k++)
        ((double *)rl_tensor_data(&x))[k] = urand(&s);
    for (int64_t k = 0; k < T * B * H; k++)
        ((double *)rl_tensor_data(&gout))[k] = urand(&s);
    CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    memcpy(rl_tensor_data(&len), full, sizeof full);
    rl_layer_io io = {.n_in = 1, .in = {&x}, .lengths = &len};
    rl_tensor *gi[1] = {&gin};
    CHECK_OK(seq->ops->forward(seq, &io));
    CHECK_OK(seq->ops->backward(seq, &io, &gout, gi));

    /* forward step by step, keeping each step's input and state (as a rec layer would) */
    int64_t st[2] = {B, H};
    tensor64(&hs[0], 2, st);
    CHECK_OK(rl_op_fill(&hs[0], 0.0));
    double out_err = 0;
    for (int t = 0; t < T; t++) {
        tensor64(&xt[t], 3, x1);
        tensor64(&gt[t], 3, o1);
        tensor64(&dxt[t], 3, x1);
        memcpy(rl_tensor_data(&xt[t]), (double *)rl_tensor_data(&x) + t * B * F,
               sizeof(double) * B * F);
        CHECK_OK(rl_gru_set_initial_state(step, &hs[t]));
        rl_layer_io io1 = {.n_in = 1, .in = {&xt[t]}, .lengths = &len};
        /* lengths are 1..T per the contract: each step is a batch of one frame */
        int32_t one[B] = {1, 1, 1};
        rl_tensor len1 = {0};
        CHECK_OK(rl_tensor_empty(&len1, RL_INT32, RL_DEVICE_CPU, 1, bs));
        memcpy(rl_tensor_data(&len1), one, sizeof one);
        io1.lengths = &len1;
        CHECK_OK(step->ops->forward(step, &io1));
        out_err =
            fmax(out_err, max_abs_diff(rl_tensor_data(&step->out),
                                       (double *)rl_tensor_data(&seq->out) + t * B * H, B * H));
        rl_tensor h = {0};
        CHECK_OK(rl_gru_final_state(step, &h));
        tensor64(&hs[t + 1], 2, st);
        CHECK_OK(rl_op_copy(&hs[t + 1], &h));
        rl_tensor_release(&h);
        rl_tensor_release(&len1);
    }
    CHECK(out_err < 1e-14);
    /* backward step by step in reverse: each step's forward is rerun from its kept state (the
     * layer keeps one step), its grad_out is the output gradient plus the next step's dh0 */
    rl_tensor carry = {0};
    tensor64(&carry, 2, st);
    CHECK_OK(rl_op_fill(&carry, 0.0));
    for (int t = T - 1; t >= 0; t--) {
        int32_t one[B] = {1, 1, 1};
        rl_tensor len1 = {0};
        CHECK_OK(rl_tensor_empty(&len1, RL_INT32, RL_DEVICE_CPU, 1, bs));
        memcpy(rl_tensor_data(&len1), one, sizeof one);
        rl_layer_io io1 = {.n_in = 1, .in = {&xt[t]}, .lengths = &len1};
        CHECK_OK(rl_gru_set_initial_state(step, &hs[t]));
        CHECK_OK(step->ops->forward(step, &io1));
        double *g = rl_tensor_data(&gt[t]);
        const double *go = (double *)rl_tensor_data(&gout) + t * B * H;
        const double *cy = rl_tensor_data(&carry);
        for (int k = 0; k < B * H; k++)
            g[k] = go[k] + cy[k];
        rl_tensor *gi1[1] = {&dxt[t]};
        CHECK_OK(step->ops->backward(step, &io1, &gt[t], gi1));
        rl_tensor d = {0};
        CHECK_OK(rl_gru_initial_state_grad(step, &d));
        CHECK_OK(rl_op_copy(&carry, &d));
        rl_tensor_release(&d);
        rl_tensor_release(&len1);
    }
    double gerr = 0;
    for (int t = 0; t < T; t++)
        gerr = fmax(gerr, max_abs_diff(rl_tensor_data(&dxt[t]),
                                       (double *)rl_tensor_data(&gin) + t * B * F, B * F));
    for (int i = 0; i < seq->n_params; i++)
        gerr = fmax(gerr, max_abs_diff(rl_tensor_data(&step->params[i].grad),
                                       rl_tensor_data(&seq->params[i].grad),
                                       rl_tensor_numel(&seq->params[i].grad)));
    printf("gru one step at a time vs whole sequence: outputs %.3g, gradients %.3g\n", out_err,
           gerr);
    CHECK(gerr < 1e-13);
    for (int t = 0; t < T; t++) {
        rl_tensor_release(&xt[t]);
        rl_tensor_release(&gt[t]);
        rl_tensor_release(&dxt[t]);
    }
    for (int t = 0; t <= T; t++)
        rl_tensor_release(&hs[t]);
    rl_tensor *ts[] = {&x, &gout, &gin, &len, &carry};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    rl_layer_free(seq);
    rl_layer_free(step);
}

/* Bad options and bad batches: errors that name the layer (and what was wrong). */
static void test_errors(void) {
    int64_t F[1] = {2};
    rl_layer *l = NULL;
    static const struct {
        double H, dir;
        const char *what;
    } bad[] = {{0, 1, "n_out"},     {-3, 1, "n_out"},    {2.5, 1, "n_out"},
               {3, 2, "direction"}, {3, 0, "direction"}, {1e9, 1, "parameters"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(make_layer(&l, "dec", bad[i].H, bad[i].dir, 1, F) != RL_OK && !l);
        CHECK(strstr(rl_errmsg(), "'dec'") && strstr(rl_errmsg(), bad[i].what));
    }
    opt_table none = {{"direction"}, {1}, 1};
    rl_options o = {&none, opt_num, opt_str, opt_bool, NULL};
    CHECK(rl_layer_create(&l, "gru", "dec", &o, 1, F) != RL_OK && !l);
    CHECK(strstr(rl_errmsg(), "'dec'") && strstr(rl_errmsg(), "n_out"));
    int64_t F0[1] = {0};
    CHECK(make_layer(&l, "dec", 3, 1, 1, F0) != RL_OK && !l);
    CHECK(strstr(rl_errmsg(), "'dec'") && strstr(rl_errmsg(), "features"));

    config c = {-1, 1, {2, 0}, false};
    fixture f;
    fixture_init(&f, &c);
    rl_layer_io io = make_io(&f, &c);
    /* backward before any forward */
    CHECK(f.l->ops->backward(f.l, &io, &f.gout, NULL) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "without a forward"));
    /* the final state before any forward */
    rl_tensor hf = {0};
    CHECK(rl_gru_final_state(f.l, &hf) == RL_EARG && !hf.storage);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "no forward"));
    /* an input of the wrong feature size */
    int64_t wrong[3] = {T, B, 5};
    rl_tensor x2 = {0};
    tensor64(&x2, 3, wrong);
    io.in[0] = &x2;
    CHECK(f.l->ops->forward(f.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "enc") != NULL);
    rl_tensor_release(&x2);
    /* an initial state of the wrong batch size, then of the wrong width */
    int64_t hs[2] = {B + 1, H}, hw[2] = {B, H + 1};
    rl_tensor h = {0};
    tensor64(&h, 2, hs);
    CHECK_OK(rl_op_fill(&h, 0.0));
    CHECK_OK(rl_gru_set_initial_state(f.l, &h));
    io = make_io(&f, &c);
    CHECK(f.l->ops->forward(f.l, &io) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "initial h"));
    rl_tensor_release(&h);
    tensor64(&h, 2, hw);
    CHECK(rl_gru_set_initial_state(f.l, &h) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "initial h"));
    rl_tensor_release(&h);
    CHECK_OK(rl_gru_set_initial_state(f.l, NULL));
    CHECK_OK(f.l->ops->forward(f.l, &io));
    /* a backward whose input is not the forward's, a grad_in of another dtype, a grad_out of the
     * wrong shape */
    int64_t xs[3] = {T, B, 2}, xshort[3] = {T - 1, B, 2};
    rl_tensor x32 = {0}, xs2 = {0};
    CHECK_OK(rl_tensor_empty(&x32, RL_FLOAT32, RL_DEVICE_CPU, 3, xs));
    tensor64(&xs2, 3, xshort);
    rl_layer_io bad_io = io;
    bad_io.in[0] = &xs2;
    CHECK(f.l->ops->backward(f.l, &bad_io, &f.gout, NULL) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "backward"));
    rl_tensor *gin[1] = {&x32};
    CHECK(f.l->ops->backward(f.l, &io, &f.gout, gin) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "grad_in"));
    CHECK(f.l->ops->backward(f.l, &io, &xs2, NULL) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "grad_out"));
    /* the rejected calls left the forward intact */
    gin[0] = &f.gin[0];
    CHECK_OK(f.l->ops->backward(f.l, &io, &f.gout, gin));
    /* the state functions on another class */
    rl_layer *lstm = NULL;
    opt_table t = {{"n_out"}, {3}, 1};
    rl_options ol = {&t, opt_num, opt_str, opt_bool, NULL};
    CHECK_OK(rl_layer_create(&lstm, "lstm", "other", &ol, 1, F));
    CHECK(rl_gru_set_initial_state(lstm, NULL) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "'other'") && strstr(rl_errmsg(), "not a gru"));
    rl_layer_free(lstm);
    rl_tensor_release(&x32);
    rl_tensor_release(&xs2);
    fixture_free(&f, 1);
}

/* The declared parameters, their init kinds and layout. */
static void test_params(void) {
    int64_t F[2] = {2, 3};
    rl_layer *l = NULL;
    CHECK_OK(make_layer(&l, "enc", H, -1, 2, F));
    if (!l) return;
    CHECK(l->n_out == H && l->n_params == 4);
    CHECK(strcmp(l->params[0].name, "W") == 0 && l->params[0].shape[0] == 5 &&
          l->params[0].shape[1] == 3 * H && l->params[0].init == RL_INIT_GLOROT);
    CHECK(strcmp(l->params[1].name, "U") == 0 && l->params[1].shape[0] == H &&
          l->params[1].shape[1] == 3 * H && l->params[1].init == RL_INIT_ORTHOGONAL);
    CHECK(strcmp(l->params[2].name, "b") == 0 && l->params[2].shape[0] == 3 * H);
    CHECK(strcmp(l->params[3].name, "b_h") == 0 && l->params[3].shape[0] == 3 * H);
    rl_layer_free(l);
}

/* max |a - b| / (1 + max |b|) over two tensors of any float dtype and the same size */
static double rel_diff(const rl_tensor *a, const rl_tensor *b) {
    rl_tensor a64 = {0}, b64 = {0};
    CHECK_OK(rl_op_to(&a64, a, RL_FLOAT64, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&b64, b, RL_FLOAT64, RL_DEVICE_CPU));
    const double *x = rl_tensor_data(&a64), *y = rl_tensor_data(&b64);
    double d = 0, m = 0;
    for (int64_t i = 0; i < rl_tensor_numel(&b64); i++) {
        if (!(fabs(x[i] - y[i]) <= d)) d = fabs(x[i] - y[i]);
        m = fmax(m, fabs(y[i]));
    }
    rl_tensor_release(&a64);
    rl_tensor_release(&b64);
    return d / (1.0 + m);
}

/* A float32 layer large enough for the packed, two-thread recurrent products (several panels, a
 * partial last one, B not a multiple of the row block), forward and backward, against the
 * float64 layer (checked above) with the same weights and inputs; both directions, ragged
 * lengths, NaN in the padding. */
static void test_float32_large(void) {
    enum { TL = 6, BL = 19, HL = 100, FL = 37 };
    int saved = rl_blas_get_threads();
    rl_blas_set_threads(2);
    for (int dir = -1; dir <= 1; dir += 2) {
        rl_layer *l[2] = {NULL, NULL};
        rl_tensor x[2] = {{0}}, gout[2] = {{0}}, gin[2] = {{0}}, len = {0};
        int64_t xs[3] = {TL, BL, FL}, os[3] = {TL, BL, HL}, bs[1] = {BL}, F[1] = {FL};
        CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, bs));
        int32_t *lp = rl_tensor_data(&len);
        for (int b = 0; b < BL; b++)
            lp[b] = b % 4 == 1 ? 1 : TL - b % 3;
        for (int v = 0; v < 2; v++) {
            rl_dtype dt = v ? RL_FLOAT32 : RL_FLOAT64;
            uint64_t s = 4242;
            CHECK_OK(make_layer(&l[v], "big", HL, dir, 1, F));
            if (!l[v]) return;
            rl_tensor tmp = {0};
            for (int i = 0; i < l[v]->n_params; i++) {
                rl_param *p = &l[v]->params[i];
                tensor64(&tmp, p->ndim, p->shape);
                for (int64_t k = 0; k < rl_tensor_numel(&tmp); k++)
                    ((double *)rl_tensor_data(&tmp))[k] = 0.15 * urand(&s);
                CHECK_OK(rl_op_to(&p->value, &tmp, dt, RL_DEVICE_CPU));
                rl_tensor_release(&tmp);
                CHECK_OK(rl_tensor_empty(&p->grad, dt, RL_DEVICE_CPU, p->ndim, p->shape));
                CHECK_OK(rl_op_fill(&p->grad, 0.0));
            }
            tensor64(&tmp, 3, xs);
            double *xp = rl_tensor_data(&tmp);
            for (int64_t k = 0; k < TL * BL * FL; k++)
                xp[k] = k / (BL * FL) >= lp[(k / FL) % BL] ? NAN : urand(&s);
            CHECK_OK(rl_op_to(&x[v], &tmp, dt, RL_DEVICE_CPU));
            rl_tensor_release(&tmp);
            tensor64(&tmp, 3, os);
            double *gp = rl_tensor_data(&tmp);
            for (int64_t k = 0; k < TL * BL * HL; k++)
                gp[k] = k / (BL * HL) >= lp[(k / HL) % BL] ? 0.0 : urand(&s);
            CHECK_OK(rl_op_to(&gout[v], &tmp, dt, RL_DEVICE_CPU));
            rl_tensor_release(&tmp);
            CHECK_OK(rl_tensor_empty(&gin[v], dt, RL_DEVICE_CPU, 3, xs));
            rl_layer_io io = {.n_in = 1, .in = {&x[v]}, .lengths = &len};
            rl_tensor *gi[1] = {&gin[v]};
            CHECK_OK(l[v]->ops->forward(l[v], &io));
            CHECK_OK(l[v]->ops->backward(l[v], &io, &gout[v], gi));
        }
        double e = rel_diff(&l[1]->out, &l[0]->out);
        e = fmax(e, rel_diff(&gin[1], &gin[0]));
        for (int i = 0; i < l[0]->n_params; i++)
            e = fmax(e, rel_diff(&l[1]->params[i].grad, &l[0]->params[i].grad));
        printf("float32 gru (%s, %d x %d x %d, direction %d) vs float64: %.3g\n",
               rl_cpu_level_name(rl_cpu_level_get()), TL, BL, HL, dir, e);
        CHECK(e < 1e-4);
        for (int v = 0; v < 2; v++) {
            rl_layer_free(l[v]);
            rl_tensor_release(&x[v]);
            rl_tensor_release(&gout[v]);
            rl_tensor_release(&gin[v]);
        }
        rl_tensor_release(&len);
    }
    rl_blas_set_threads(saved);
}

/* A final-state gradient g (rl_gru_set_final_state_grad) is dLoss/dh of each sequence's last
 * frame in the processing direction, where the output is that state: backward with it equals
 * backward with g added to grad_out at that frame, bit for bit (the cell adds the running dh and
 * grad_out in either case; padded frames pass dh through). Both directions, a ragged batch; a
 * layer ignoring g would miss it in every gradient. */
static void test_final_state_grad(int dir) {
    config c = {dir, 1, {2, 0}, true};
    fixture a, b;
    fixture_init(&a, &c);
    fixture_init(&b, &c);
    int64_t st[2] = {B, H};
    rl_tensor g = {0};
    tensor64(&g, 2, st);
    double *gv = rl_tensor_data(&g), *go = rl_tensor_data(&b.gout);
    for (int k = 0; k < B * H; k++)
        gv[k] = val(4, 7 * k + 3);
    for (int bb = 0; bb < B; bb++) {
        int last = dir > 0 ? LENS[bb] - 1 : 0;
        for (int j = 0; j < H; j++)
            go[(last * B + bb) * H + j] += gv[bb * H + j];
    }
    CHECK_OK(rl_gru_set_final_state_grad(a.l, &g));
    fixture *fs[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        rl_layer_io io = make_io(fs[k], &c);
        rl_tensor *gin[1] = {&fs[k]->gin[0]};
        CHECK_OK(fs[k]->l->ops->forward(fs[k]->l, &io));
        CHECK_OK(fs[k]->l->ops->backward(fs[k]->l, &io, &fs[k]->gout, gin));
    }
    rl_tensor da = {0}, db = {0};
    CHECK_OK(rl_gru_initial_state_grad(a.l, &da));
    CHECK_OK(rl_gru_initial_state_grad(b.l, &db));
    CHECK(max_abs_diff(rl_tensor_data(&da), rl_tensor_data(&db), B * H) == 0.0);
    CHECK(max_abs_diff(rl_tensor_data(&a.gin[0]), rl_tensor_data(&b.gin[0]), T * B * 2) == 0.0);
    for (int i = 0; i < a.l->n_params; i++)
        CHECK(max_abs_diff(rl_tensor_data(&a.l->params[i].grad),
                           rl_tensor_data(&b.l->params[i].grad),
                           rl_tensor_numel(&a.l->params[i].grad)) == 0.0);
    /* a wrong width or an int tensor: an error naming the layer and the state */
    int64_t bad[2] = {B, H + 1};
    rl_tensor w = {0};
    tensor64(&w, 2, bad);
    CHECK(rl_gru_set_final_state_grad(a.l, &w) == RL_ESHAPE);
    CHECK(strstr(rl_errmsg(), "'enc'") && strstr(rl_errmsg(), "gradient of final h"));
    CHECK_OK(rl_gru_set_final_state_grad(a.l, NULL));
    rl_tensor_release(&w);
    rl_tensor_release(&da);
    rl_tensor_release(&db);
    rl_tensor_release(&g);
    fixture_free(&a, 1);
    fixture_free(&b, 1);
}

int main(void) {
    rl_ops_init();
    for (int dir = -1; dir <= 1; dir += 2)
        for (int init = 0; init <= 1; init++) {
            config c = {dir, 2, {2, 3}, init};
            test_config(&c);
        }
    config one = {-1, 1, {4, 0}, true};
    test_config(&one);
    test_torch(1);
    test_torch(-1);
    test_steps();
    test_final_state_grad(1);
    test_final_state_grad(-1);
    test_errors();
    test_params();
    /* the float32 paths (packed products, pointwise passes) at every level this CPU has */
    rl_cpu_level best = rl_cpu_level_supported();
    for (int lv = RL_CPU_GENERIC; lv <= (int)best; lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        test_float32_large();
    }
    CHECK_OK(rl_cpu_level_set(best));
    printf("max gradient rel error %.3g\n", max_rel);
    TEST_MAIN_END();
}
