/* Tests of kernels/optim.h on the CPU. Each optimizer runs three steps on a 4-element buffer
 * in float32 and float64 and is compared with a reference written out here in plain double
 * arithmetic from PyTorch's documented equations (not through kernels/optim_rules.h); then
 * clipping, l2, adamw's decay, the noise stream, max-norm and the outlier protection. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../core/blas.h"
#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "../../kernels/optim.h"
#include "check.h"

#define N 4
#define STEPS 3

static const double W0[N] = {0.5, -1.0, 2.0, 0.0};
/* the gradient of step s (0-based) */
static double grad_of(int s, int i) {
    static const double base[N] = {0.1, -0.2, 0.3, -0.4};
    return base[i] * (s + 1) + 0.05 * (i - 1.5) * s;
}

static rl_tensor vec(rl_dtype dt, const double *v, int64_t n) {
    rl_tensor t = {0};
    int64_t shape[1] = {n};
    rl_tensor_empty(&t, dt, RL_DEVICE_CPU, 1, shape);
    for (int64_t i = 0; i < n; i++)
        rl_tensor_set(&t, &i, v[i]);
    return t;
}

static double at(const rl_tensor *t, int64_t i) { return rl_tensor_get(t, &i); }

/* the value a float32 buffer holds for v */
static double as(rl_dtype dt, double v) { return dt == RL_FLOAT32 ? (double)(float)v : v; }

static double tol_of(rl_dtype dt, double v) {
    return dt == RL_FLOAT32 ? 3e-6 * (1.0 + fabs(v)) : 1e-12 * (1.0 + fabs(v));
}

/* The reference: three steps of `kind` with lr, written from the documented equations. */
static void reference(rl_optim_kind kind, rl_dtype dt, double lr, double *w) {
    double m[N] = {0}, v[N] = {0};
    const double mu = 0.9, b1 = 0.9, b2 = 0.999, rho = 0.9, lambda = 0.01;
    for (int i = 0; i < N; i++)
        w[i] = W0[i];
    for (int s = 0; s < STEPS; s++) {
        int t = s + 1;
        for (int i = 0; i < N; i++) {
            double g = as(dt, grad_of(s, i));
            if (kind == RL_OPT_SGD) {
                w[i] = w[i] - lr * g;
            } else if (kind == RL_OPT_MOMENTUM) {
                m[i] = (t == 1) ? g : mu * m[i] + g;
                w[i] = w[i] - lr * m[i];
            } else if (kind == RL_OPT_NESTEROV) {
                m[i] = (t == 1) ? g : mu * m[i] + g;
                w[i] = w[i] - lr * (g + mu * m[i]);
            } else if (kind == RL_OPT_ADAGRAD) {
                m[i] = m[i] + g * g;
                w[i] = w[i] - lr * g / (sqrt(m[i]) + 1e-10);
            } else if (kind == RL_OPT_ADADELTA) {
                double eps = 1e-6;
                m[i] = rho * m[i] + (1 - rho) * g * g; /* square_avg */
                double delta = sqrt(v[i] + eps) / sqrt(m[i] + eps) * g;
                v[i] = rho * v[i] + (1 - rho) * delta * delta; /* acc_delta */
                w[i] = w[i] - lr * delta;
            } else {
                if (kind == RL_OPT_ADAMW) w[i] = w[i] * (1 - lr * lambda);
                m[i] = b1 * m[i] + (1 - b1) * g;
                v[i] = b2 * v[i] + (1 - b2) * g * g;
                double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
                w[i] = w[i] - lr * mhat / (sqrt(vhat) + 1e-8);
            }
        }
    }
}

static void test_kinds(rl_dtype dt) {
    for (int kind = 0; kind < RL_NUM_OPT; kind++) {
        double lr = kind == RL_OPT_ADADELTA ? 1.0 : 0.1;
        rl_optim_config cfg;
        rl_optim_config_default(&cfg, (rl_optim_kind)kind);
        rl_tensor w = vec(dt, W0, N), g = {0};
        rl_optimizer o;
        CHECK_OK(rl_optimizer_init(&o, &cfg, &w));
        for (int s = 0; s < STEPS; s++) {
            double gv[N];
            for (int i = 0; i < N; i++)
                gv[i] = grad_of(s, i);
            rl_tensor_release(&g);
            g = vec(dt, gv, N);
            bool applied = false;
            CHECK_OK(rl_optimizer_step(&o, &w, &g, lr, NULL, &applied));
            CHECK(applied);
        }
        CHECK(o.num_steps == STEPS && o.skipped == 0);
        double ref[N];
        reference((rl_optim_kind)kind, dt, lr, ref);
        for (int i = 0; i < N; i++)
            CHECK_NEAR(at(&w, i), ref[i], tol_of(dt, ref[i]));
        rl_optimizer_free(&o);
        rl_tensor_release(&w);
        rl_tensor_release(&g);
    }
}

/* One sgd step (lr) with cfg changed by the caller, from w0 with gradient g0. */
static void sgd_step(rl_optim_config *cfg, rl_dtype dt, double lr, const double *w0,
                     const double *g0, double *out, rl_rng *rng) {
    rl_tensor w = vec(dt, w0, N), g = vec(dt, g0, N);
    rl_optimizer o;
    bool applied = false;
    CHECK_OK(rl_optimizer_init(&o, cfg, &w));
    CHECK_OK(rl_optimizer_step(&o, &w, &g, lr, rng, &applied));
    CHECK(applied);
    for (int i = 0; i < N; i++)
        out[i] = at(&w, i);
    rl_optimizer_free(&o);
    rl_tensor_release(&w);
    rl_tensor_release(&g);
}

static void test_regularisers(rl_dtype dt) {
    rl_optim_config cfg;
    double out[N];
    const double zero[N] = {0, 0, 0, 0};

    /* elementwise clipping to [-0.25, 0.25] */
    const double g1[N] = {0.1, -0.5, 1.0, -0.2};
    rl_optim_config_default(&cfg, RL_OPT_SGD);
    cfg.gradient_clip = 0.25;
    sgd_step(&cfg, dt, 1.0, zero, g1, out, NULL);
    const double clipped[N] = {-0.1, 0.25, -0.25, 0.2};
    for (int i = 0; i < N; i++)
        CHECK_NEAR(out[i], as(dt, clipped[i]), tol_of(dt, 1));

    /* global norm: ||(3, 4, 0, 0)|| = 5 scaled to 1; a larger limit leaves it alone */
    const double g2[N] = {3, 4, 0, 0};
    rl_optim_config_default(&cfg, RL_OPT_SGD);
    cfg.gradient_clip_global_norm = 1.0;
    sgd_step(&cfg, dt, 1.0, zero, g2, out, NULL);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(out[i], -g2[i] / (5.0 + 1e-6), tol_of(dt, 1));
    cfg.gradient_clip_global_norm = 10.0;
    sgd_step(&cfg, dt, 1.0, zero, g2, out, NULL);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(out[i], -g2[i], tol_of(dt, 1));

    /* l2: w - lr (g + l2 w) */
    rl_optim_config_default(&cfg, RL_OPT_SGD);
    cfg.l2 = 0.5;
    sgd_step(&cfg, dt, 0.1, W0, g1, out, NULL);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(out[i], W0[i] - 0.1 * (as(dt, g1[i]) + 0.5 * W0[i]), tol_of(dt, 1));

    /* adamw with a zero gradient: only the decoupled decay w (1 - lr lambda) acts */
    rl_optim_config_default(&cfg, RL_OPT_ADAMW);
    cfg.weight_decay = 0.1;
    sgd_step(&cfg, dt, 0.5, W0, zero, out, NULL);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(out[i], W0[i] * (1 - 0.5 * 0.1), tol_of(dt, 1));
    /* ... while adam with l2 = 0.1 and a zero gradient moves by about lr (sign of w) */
    rl_optim_config_default(&cfg, RL_OPT_ADAM);
    cfg.l2 = 0.1;
    sgd_step(&cfg, dt, 0.5, W0, zero, out, NULL);
    for (int i = 0; i < N; i++) {
        double gi = 0.1 * W0[i]; /* first adam step: mhat = g, vhat = g^2 */
        CHECK_NEAR(out[i], W0[i] - 0.5 * gi / (fabs(gi) + 1e-8), tol_of(dt, 1));
    }
}

static void test_noise(rl_dtype dt) {
    rl_optim_config cfg;
    rl_optim_config_default(&cfg, RL_OPT_SGD);
    cfg.gradient_noise = 0.5;
    const double zero[N] = {0, 0, 0, 0};
    double a[N], b[N], c[N];
    rl_rng g1, g2, g3;
    rl_rng_seed(&g1, 42);
    rl_rng_seed(&g2, 42);
    rl_rng_seed(&g3, 43);
    g1.offset = g2.offset = g3.offset = 7;
    sgd_step(&cfg, dt, 1.0, zero, zero, a, &g1);
    sgd_step(&cfg, dt, 1.0, zero, zero, b, &g2);
    sgd_step(&cfg, dt, 1.0, zero, zero, c, &g3);
    CHECK(g1.offset == 7 + 2); /* 2 N words = 2 blocks */
    int same = 0, differ = 0;
    for (int i = 0; i < N; i++) {
        same += a[i] == b[i];
        differ += a[i] != c[i];
    }
    CHECK(same == N);
    CHECK(differ == N);
    /* the stream is rl_op_normal's: the same seed and offset give the same numbers */
    rl_rng r;
    rl_rng_seed(&r, 42);
    r.offset = 7;
    rl_tensor n = vec(RL_FLOAT64, zero, N);
    CHECK_OK(rl_op_normal(&n, &r, 0.0, 0.5));
    for (int i = 0; i < N; i++)
        CHECK_NEAR(a[i], -as(dt, at(&n, i)), tol_of(dt, 1));
    rl_tensor_release(&n);
    /* noise needs a generator */
    rl_tensor w = vec(dt, zero, N), g = vec(dt, zero, N);
    rl_optimizer o;
    bool applied = true;
    CHECK_OK(rl_optimizer_init(&o, &cfg, &w));
    CHECK(rl_optimizer_step(&o, &w, &g, 1.0, NULL, &applied) == RL_EARG && !applied);
    rl_optimizer_free(&o);
    rl_tensor_release(&w);
    rl_tensor_release(&g);
}

static void test_max_norm(rl_dtype dt) {
    /* (3, 2): column 0 = (3, 4, 0) has norm 5, column 1 = (0.1, 0.2, 0.2) norm 0.3 */
    const double v[6] = {3, 0.1, 4, 0.2, 0, 0.2};
    rl_tensor w = vec(dt, v, 6), m = {0};
    int64_t shape[2] = {3, 2};
    CHECK_OK(rl_tensor_view(&m, &w, 2, shape));
    CHECK_OK(rl_optim_max_norm(&m, 1.0));
    const double want[6] = {0.6, 0.1, 0.8, 0.2, 0, 0.2};
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(at(&w, i), as(dt, want[i]), tol_of(dt, 1));
    /* through a transposed view (2, 3): its columns are the rows of m */
    rl_tensor tr = {0};
    CHECK_OK(rl_tensor_transpose(&tr, &m, 0, 1));
    CHECK_OK(rl_optim_max_norm(&tr, 0.5));
    /* rows of m: (0.6, 0.1) norm 0.608 -> scaled; (0.8, 0.2) -> scaled; (0, 0.2) kept */
    double n0 = sqrt(0.36 + 0.01), n1 = sqrt(0.64 + 0.04);
    CHECK_NEAR(at(&w, 0), 0.6 * 0.5 / n0, tol_of(dt, 1));
    CHECK_NEAR(at(&w, 1), 0.1 * 0.5 / n0, tol_of(dt, 1));
    CHECK_NEAR(at(&w, 2), 0.8 * 0.5 / n1, tol_of(dt, 1));
    CHECK_NEAR(at(&w, 3), 0.2 * 0.5 / n1, tol_of(dt, 1));
    CHECK_NEAR(at(&w, 5), 0.2, tol_of(dt, 1));
    CHECK(rl_optim_max_norm(&w, 1.0) == RL_ESHAPE); /* 1-D */
    rl_tensor_release(&tr);
    rl_tensor_release(&m);
    rl_tensor_release(&w);
}

static void test_outliers(rl_dtype dt) {
    rl_optim_config cfg;
    rl_optim_config_default(&cfg, RL_OPT_ADAM);
    rl_tensor w = vec(dt, W0, N), g = {0};
    rl_optimizer o;
    CHECK_OK(rl_optimizer_init(&o, &cfg, &w));
    bool applied;

    /* a NaN gradient at the first step: skipped, nothing touched */
    const double gnan[N] = {0.1, NAN, 0.2, 0.3};
    g = vec(dt, gnan, N);
    CHECK_OK(rl_optimizer_step(&o, &w, &g, 0.1, NULL, &applied));
    CHECK(!applied && o.skipped == 1 && o.num_steps == 0);
    CHECK(strstr(o.skip_reason, "not finite") != NULL);
    for (int i = 0; i < N; i++) {
        CHECK(at(&w, i) == W0[i]);
        CHECK(at(&o.state[0], i) == 0 && at(&o.state[1], i) == 0);
    }
    /* during warm-up (5 accepted steps) a large norm is accepted */
    for (int s = 0; s < 6; s++) {
        double gv[N];
        for (int i = 0; i < N; i++)
            gv[i] = (s == 1 ? 20.0 : 1.0) * grad_of(0, i);
        rl_tensor_release(&g);
        g = vec(dt, gv, N);
        CHECK_OK(rl_optimizer_step(&o, &w, &g, 0.1, NULL, &applied));
        CHECK(applied);
    }
    CHECK(o.num_steps == 6 && o.norm_count == 6);
    /* average of the accepted norms: 5 x ||g0|| + 20 ||g0|| over 6 */
    double n0 = 0;
    for (int i = 0; i < N; i++)
        n0 += as(dt, grad_of(0, i)) * as(dt, grad_of(0, i));
    n0 = sqrt(n0);
    CHECK_NEAR(o.avg_norm, 25.0 * n0 / 6.0, 1e-5);

    /* after warm-up a gradient 1e9 times larger is skipped, then a normal one applies */
    double before[N], m_before[N];
    for (int i = 0; i < N; i++) {
        before[i] = at(&w, i);
        m_before[i] = at(&o.state[0], i);
    }
    double gbig[N];
    for (int i = 0; i < N; i++)
        gbig[i] = 1e9 * grad_of(0, i);
    rl_tensor_release(&g);
    g = vec(dt, gbig, N);
    CHECK_OK(rl_optimizer_step(&o, &w, &g, 0.1, NULL, &applied));
    CHECK(!applied && o.skipped == 2 && o.num_steps == 6);
    CHECK(strstr(o.skip_reason, "> 10 x average") != NULL);
    CHECK_NEAR(o.last_grad_norm, 1e9 * n0, 1e9 * n0 * 1e-6);
    for (int i = 0; i < N; i++) {
        CHECK(at(&w, i) == before[i]);
        CHECK(at(&o.state[0], i) == m_before[i]);
    }
    rl_tensor_release(&g);
    g = vec(dt, W0, N);
    CHECK_OK(rl_optimizer_step(&o, &w, &g, 0.1, NULL, &applied));
    CHECK(applied && o.num_steps == 7 && o.skip_reason[0] == '\0');
    rl_optimizer_free(&o);
    rl_tensor_release(&w);
    rl_tensor_release(&g);
}

/* The gradient norm: bit-identical on any thread count (its chunks depend on the length alone),
 * near a plain sum in long double, for lengths around the chunk bounds and one of more chunks
 * than the cap (chunks of another size); NaN anywhere propagates. */
static void test_grad_norm_threads(rl_dtype dt) {
    const int64_t lens[] = {0, 7, 16384, 16385, 100003, 1024 * 16384 + 77};
    int saved = rl_blas_get_threads();
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        int64_t n = lens[k];
        rl_tensor g = {0};
        CHECK_OK(rl_tensor_empty(&g, dt, RL_DEVICE_CPU, 1, &n));
        long double ref = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = as(dt, sin(0.37 * (double)i) * (1.0 + (double)(i % 13)));
            if (dt == RL_FLOAT32)
                ((float *)rl_tensor_data(&g))[i] = (float)v;
            else
                ((double *)rl_tensor_data(&g))[i] = v;
            ref += (long double)v * v;
        }
        double first = 0;
        for (int threads = 1; threads <= 3; threads++) {
            rl_blas_set_threads(threads);
            double norm = -1;
            CHECK_OK(rl_optim_grad_norm(&norm, &g));
            CHECK_NEAR(norm, sqrtl(ref), 1e-12 * (1.0 + (double)sqrtl(ref)));
            if (threads == 1) first = norm;
            CHECK(memcmp(&norm, &first, sizeof norm) == 0);
        }
        if (n > 16385) {
            if (dt == RL_FLOAT32)
                ((float *)rl_tensor_data(&g))[n - 3] = NAN;
            else
                ((double *)rl_tensor_data(&g))[n - 3] = NAN;
            double norm = 0;
            rl_blas_set_threads(2);
            CHECK_OK(rl_optim_grad_norm(&norm, &g));
            CHECK(isnan(norm));
        }
        rl_tensor_release(&g);
    }
    rl_blas_set_threads(saved);
}

static void test_errors(void) {
    rl_optim_config cfg;
    rl_optim_kind k;
    CHECK(rl_optim_parse("adamax", &k) == RL_EARG);
    CHECK_OK(rl_optim_parse("nesterov", &k));
    CHECK(k == RL_OPT_NESTEROV);
    CHECK(strcmp(rl_optim_state_name(RL_OPT_ADAM, 1), "exp_avg_sq") == 0);
    rl_tensor w = vec(RL_FLOAT32, W0, N), w3 = vec(RL_FLOAT32, W0, 3), w64 = vec(RL_FLOAT64, W0, N);
    rl_optimizer o;
    rl_optim_config_default(&cfg, RL_OPT_ADAM);
    cfg.weight_decay = 0.1;
    CHECK(rl_optimizer_init(&o, &cfg, &w) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "adamw") != NULL);
    rl_optim_config_default(&cfg, RL_OPT_MOMENTUM);
    cfg.momentum = 1.5;
    CHECK(rl_optimizer_init(&o, &cfg, &w) == RL_EARG);
    CHECK(strstr(rl_errmsg(), "momentum") != NULL);
    cfg.momentum = 0.9;
    CHECK_OK(rl_optimizer_init(&o, &cfg, &w));
    bool applied;
    CHECK(rl_optimizer_step(&o, &w, &w3, 0.1, NULL, &applied) == RL_ESHAPE);
    CHECK(rl_optimizer_step(&o, &w, &w64, 0.1, NULL, &applied) == RL_ESHAPE);
    CHECK(rl_optimizer_step(&o, &w, &w, -1.0, NULL, &applied) == RL_EARG);
    rl_optimizer_free(&o);
    rl_tensor_release(&w);
    rl_tensor_release(&w3);
    rl_tensor_release(&w64);
}

int main(void) {
    for (int d = 0; d < 2; d++) {
        rl_dtype dt = d == 0 ? RL_FLOAT32 : RL_FLOAT64;
        test_kinds(dt);
        test_regularisers(dt);
        test_noise(dt);
        test_max_norm(dt);
        test_outliers(dt);
        test_grad_norm_threads(dt);
    }
    test_errors();
    TEST_MAIN_END();
}
