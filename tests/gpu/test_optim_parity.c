/* CUDA-vs-CPU parity of the optimizers (kernels/optim.h, kernels/cuda/optim.cu): for every
 * method, every regulariser (l2, elementwise clip, global-norm scale, gradient noise, all at
 * once; adamw with its decoupled decay) and both float dtypes, the same params and gradients
 * go through rl_optimizer_step on the CPU and on cuda:0 for several steps, one of them an
 * outlier and one with a NaN gradient (both must be skipped on both devices), and params,
 * states, norms and counters are compared (float32 to 1e-6, float64 to 1e-10, relative to the
 * element or to the buffer's largest element). The gradient norm is also compared on lengths
 * around the block sizes and must be bit-identical from run to run; max-norm is compared on
 * contiguous, transposed and narrowed weights. Buffers have odd lengths on purpose, small enough
 * that a slow device (a simulator) finishes in minutes; the norm still runs on a buffer longer
 * than one pass of its stage-1 grid (1024 blocks of 256 threads).
 * Without a CUDA device (or build) the "device" side is the CPU itself: every case and every
 * comparison runs and must pass, so a broken test shows there too; the line printed says which
 * side ran. Run by `make test-gpu`. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "tests/c/check.h"
#include "tests/gpu/device_side.h"

/* the side compared with the CPU: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

/* ---- inputs ---- */

/* want (CPU) against got (the device, any geometry): |a - b| <= rtol (|a| + max |want|), so
 * elements that cancel to near zero are judged on the buffer's scale. One check. */
static void compare_scaled(const char *what, const rl_tensor *want, const rl_tensor *got,
                           double rtol) {
    int64_t idx[RL_MAX_DIMS] = {0};
    double scale = 0.0;
    if (want->storage && rl_tensor_numel(want) > 0) do
            scale = fmax(scale, fabs(rl_tensor_get(want, idx)));
        while (next_index(want->ndim, want->shape, idx));
    compare_elems(what, want, got, rtol, rtol * scale);
}

static double rtol_of(rl_dtype dt) { return dt == RL_FLOAT64 ? 1e-10 : 1e-6; }

/* ---- the gradient norm ---- */

static void test_grad_norm(rl_dtype dt) {
    const int64_t lens[] = {1, 2, 255, 256, 257, 10007, 262145};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        rl_tensor c = rand_tensor(dt, 1, &lens[k], -2.0, 2.0, NULL, 0);
        rl_tensor g = copy_to(&c, DEV);
        double nc = -1, ng = -1, ng2 = -2;
        CHECK_OK(rl_optim_grad_norm(&nc, &c));
        CHECK_OK(rl_optim_grad_norm(&ng, &g));
        CHECK_OK(rl_optim_grad_norm(&ng2, &g));
        char what[96];
        snprintf(what, sizeof what, "grad_norm %s n=%" PRId64, rl_dtype_name(dt), lens[k]);
        compare_scalar(what, nc, ng, 1e-11);
        if (memcmp(&ng, &ng2, sizeof ng) != 0) {
            check_failed++;
            fprintf(stderr, "FAIL %s: not reproducible (%.17g, then %.17g)\n", what, ng, ng2);
        } else {
            check_passed++;
        }
        rl_tensor_release(&c);
        rl_tensor_release(&g);
    }
    /* NaN and Inf propagate as on the CPU */
    int64_t n = 1001;
    rl_tensor c = rand_tensor(dt, 1, &n, -1.0, 1.0, NULL, 0);
    set_flat(&c, 500, INFINITY);
    rl_tensor g = copy_to(&c, DEV);
    double nc = 0, ng = 0;
    CHECK_OK(rl_optim_grad_norm(&ng, &g));
    CHECK_OK(rl_optim_grad_norm(&nc, &c));
    CHECK(isinf(nc) && isinf(ng));
    rl_tensor_release(&g);
    set_flat(&c, 7, NAN);
    g = copy_to(&c, DEV);
    CHECK_OK(rl_optim_grad_norm(&ng, &g));
    CHECK(isnan(ng));
    rl_tensor_release(&c);
    rl_tensor_release(&g);
}

/* ---- optimizer steps ---- */

typedef struct {
    const char *name;
    double l2, clip, global_norm, noise;
} options;

static const options option_sets[] = {
    {"plain", 0, 0, 0, 0},        {"l2", 1e-2, 0, 0, 0},   {"clip", 0, 0.5, 0, 0},
    {"global-norm", 0, 0, 10, 0}, {"noise", 0, 0, 0, 0.1}, {"all", 1e-2, 0.5, 10, 0.1},
};

#define NUM_STEPS 8
#define OUTLIER_STEP 4 /* gradients 1000x larger: skipped after the warmup */
#define NAN_STEP 5     /* one NaN gradient: skipped */

static void test_steps(rl_optim_kind kind, const options *opt, rl_dtype dt) {
    char what[128];
    snprintf(what, sizeof what, "%s %s %s", rl_optim_name(kind), opt->name, rl_dtype_name(dt));
    rl_optim_config cfg;
    rl_optim_config_default(&cfg, kind);
    cfg.l2 = opt->l2;
    cfg.gradient_clip = opt->clip;
    cfg.gradient_clip_global_norm = opt->global_norm;
    cfg.gradient_noise = opt->noise;
    cfg.outlier_warmup = 2;

    int64_t n = 1031;
    rl_tensor pc = rand_tensor(dt, 1, &n, -1.0, 1.0, NULL, 0);
    rl_tensor pg = copy_to(&pc, DEV);
    rl_optimizer oc, og;
    CHECK_OK(rl_optimizer_init(&oc, &cfg, &pc));
    if (rl_optimizer_init(&og, &cfg, &pg) != RL_OK) {
        check_failed++;
        fprintf(stderr, "FAIL %s: rl_optimizer_init on the device: %s\n", what, rl_errmsg());
        rl_optimizer_free(&oc);
        rl_tensor_release(&pc);
        rl_tensor_release(&pg);
        return;
    }
    for (int i = 0; i < rl_optim_num_states(kind); i++)
        CHECK(rl_device_eq(rl_tensor_device(&og.state[i]), DEV));

    rl_rng rc, rg;
    rl_rng_seed(&rc, 20160101);
    rl_rng_seed(&rg, 20160101);
    for (int step = 0; step < NUM_STEPS; step++) {
        double s = step == OUTLIER_STEP ? 1000.0 : 1.0;
        rl_tensor gc = rand_tensor(dt, 1, &n, -s, s, NULL, 0);
        if (step == NAN_STEP) set_flat(&gc, 17, NAN);
        rl_tensor gg = copy_to(&gc, DEV);
        double lr = 0.05 / (1 + step);
        bool ac = false, ag = false;
        CHECK_OK(rl_optimizer_step(&oc, &pc, &gc, lr, &rc, &ac));
        CHECK_OK(rl_optimizer_step(&og, &pg, &gg, lr, &rg, &ag));
        bool want = step != OUTLIER_STEP && step != NAN_STEP;
        if (ac != want || ag != want) {
            check_failed++;
            fprintf(stderr, "FAIL %s step %d: applied cpu %d, device %d, expected %d (%s | %s)\n",
                    what, step, ac, ag, want, oc.skip_reason, og.skip_reason);
        } else {
            check_passed++;
        }
        char sw[160];
        snprintf(sw, sizeof sw, "%s step %d grad norm", what, step);
        compare_scalar(sw, oc.last_grad_norm, og.last_grad_norm, 1e-12);
        rl_tensor_release(&gc);
        rl_tensor_release(&gg);
    }
    CHECK(oc.num_steps == NUM_STEPS - 2 && og.num_steps == oc.num_steps);
    CHECK(oc.skipped == 2 && og.skipped == 2);
    CHECK(oc.norm_count == og.norm_count);
    CHECK(rc.offset == rg.offset);
    char sw[160];
    snprintf(sw, sizeof sw, "%s avg_norm", what);
    compare_scalar(sw, oc.avg_norm, og.avg_norm, 1e-12);
    double rtol = rtol_of(dt);
    snprintf(sw, sizeof sw, "%s params", what);
    compare_scaled(sw, &pc, &pg, rtol);
    for (int i = 0; i < rl_optim_num_states(kind); i++) {
        snprintf(sw, sizeof sw, "%s %s", what, rl_optim_state_name(kind, i));
        compare_scaled(sw, &oc.state[i], &og.state[i], rtol);
    }
    rl_optimizer_free(&oc);
    rl_optimizer_free(&og);
    rl_tensor_release(&pc);
    rl_tensor_release(&pg);
}

/* The noise must be there at all: the same run without it ends elsewhere (on the CPU, where
 * the stream is rl_op_normal's; the parity above then pins the GPU to it). */
static void test_noise_matters(void) {
    int64_t n = 1001;
    rl_tensor p0 = rand_tensor(RL_FLOAT32, 1, &n, -1, 1, NULL, 0),
              g = rand_tensor(RL_FLOAT32, 1, &n, -1, 1, NULL, 0);
    rl_tensor p1 = copy_to(&p0, RL_DEVICE_CPU);
    rl_optim_config cfg;
    rl_optim_config_default(&cfg, RL_OPT_SGD);
    rl_optimizer a, b;
    CHECK_OK(rl_optimizer_init(&a, &cfg, &p0));
    cfg.gradient_noise = 0.1;
    CHECK_OK(rl_optimizer_init(&b, &cfg, &p1));
    rl_rng r;
    rl_rng_seed(&r, 5);
    bool applied;
    CHECK_OK(rl_optimizer_step(&a, &p0, &g, 1.0, &r, &applied));
    CHECK_OK(rl_optimizer_step(&b, &p1, &g, 1.0, &r, &applied));
    int64_t i0 = 0, i1 = 1;
    CHECK(rl_tensor_get(&p0, &i0) != rl_tensor_get(&p1, &i0));
    CHECK(rl_tensor_get(&p0, &i1) != rl_tensor_get(&p1, &i1));
    rl_optimizer_free(&a);
    rl_optimizer_free(&b);
    rl_tensor_release(&p0);
    rl_tensor_release(&p1);
    rl_tensor_release(&g);
}

/* ---- max-norm ---- */

/* Columns j % 3 == 0 are made 5x longer, so some columns exceed the bound and some do not. */
static rl_tensor weight_cpu(rl_dtype dt, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    rl_tensor w = rand_tensor(dt, 2, shape, -1, 1, NULL, 0);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j += 3) {
            int64_t idx[2] = {i, j};
            rl_tensor_set(&w, idx, 5 * rl_tensor_get(&w, idx));
        }
    return w;
}

static void check_max_norm(const char *what, rl_tensor *wc, rl_tensor *wg, double bound,
                           double rtol) {
    CHECK_OK(rl_optim_max_norm(wc, bound));
    CHECK_OK(rl_optim_max_norm(wg, bound));
    compare_scaled(what, wc, wg, rtol);
    /* and independently of the CPU kernel: no column is longer than the bound afterwards */
    double longest = 0;
    for (int64_t j = 0; j < wc->shape[1]; j++) {
        double s = 0;
        for (int64_t i = 0; i < wc->shape[0]; i++) {
            int64_t idx[2] = {i, j};
            s += rl_tensor_get(wc, idx) * rl_tensor_get(wc, idx);
        }
        if (sqrt(s) > longest) longest = sqrt(s);
    }
    CHECK(longest <= bound * (1 + 1e-6));
}

static void test_max_norm(rl_dtype dt) {
    const int64_t sizes[][2] = {{37, 101}, {5000, 3}, {3, 5003}, {1, 1}};
    double rtol = rtol_of(dt);
    char what[96];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        rl_tensor wc = weight_cpu(dt, sizes[k][0], sizes[k][1]);
        rl_tensor wg = copy_to(&wc, DEV);
        double bound = 0.8 * sqrt((double)sizes[k][0] / 3.0) + 0.1;
        snprintf(what, sizeof what, "max_norm %s (%" PRId64 ", %" PRId64 ")", rl_dtype_name(dt),
                 sizes[k][0], sizes[k][1]);
        check_max_norm(what, &wc, &wg, bound, rtol);
        rl_tensor_release(&wc);
        rl_tensor_release(&wg);
    }
    /* a transposed view (strides (1, rows)) and a narrowed one (offset, row stride > cols) */
    rl_tensor bc = weight_cpu(dt, 101, 37), bg = copy_to(&bc, DEV);
    rl_tensor tc = {0}, tg = {0}, nc = {0}, ng = {0};
    CHECK_OK(rl_tensor_transpose(&tc, &bc, 0, 1));
    CHECK_OK(rl_tensor_transpose(&tg, &bg, 0, 1));
    snprintf(what, sizeof what, "max_norm %s transposed", rl_dtype_name(dt));
    check_max_norm(what, &tc, &tg, 4.0, rtol);
    compare_scaled("max_norm: the base of the transposed view", &bc, &bg, rtol);
    CHECK_OK(rl_tensor_narrow(&nc, &bc, 1, 5, 20));
    CHECK_OK(rl_tensor_narrow(&ng, &bg, 1, 5, 20));
    snprintf(what, sizeof what, "max_norm %s narrowed", rl_dtype_name(dt));
    check_max_norm(what, &nc, &ng, 2.0, rtol);
    compare_scaled("max_norm: the base of the narrowed view", &bc, &bg, rtol);
    rl_tensor *ts[] = {&bc, &bg, &tc, &tg, &nc, &ng};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void run_all(void) {
    rl_dtype dts[2] = {RL_FLOAT32, RL_FLOAT64};
    for (int d = 0; d < 2; d++) {
        test_grad_norm(dts[d]);
        for (int k = 0; k < RL_NUM_OPT; k++)
            for (size_t o = 0; o < sizeof option_sets / sizeof option_sets[0]; o++)
                test_steps((rl_optim_kind)k, &option_sets[o], dts[d]);
        test_max_norm(dts[d]);
    }
    test_noise_matters();
}

int main(void) {
    rl_ops_init();
    rand_state = 0x2545F4914F6CDD1Du;
    DEV = device_side(NULL);
    run_all();
    TEST_MAIN_END();
}
