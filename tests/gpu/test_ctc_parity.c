/* CUDA-vs-CPU parity of the CTC loss (kernels/ctc.h, kernels/cuda/ctc.cu): a ragged batch with
 * repeated labels, an empty target, an infeasible target, NaN in the padded frames and garbage
 * after each target's length, in float32 and float64, with and without zero_infinity: loss and
 * gradient from cuda:0 against the CPU's float64 result (relative to the buffer's largest
 * element: 1e-10 for float64, 2e-5 for float32), the infeasible sequence's loss inf (or 0) and
 * zero gradient on both, and the CUDA result bit-identical from run to run (no atomics).
 * The device-free part of the harness runs everywhere: the inputs, the CPU references
 * (float32 against float64 through the same comparison) and a check that the comparison
 * catches a perturbed gradient and a misplaced infinity. Without a CUDA build or device the
 * device part runs with the CPU as the device side (tests/gpu/device_side.h). Run by
 * `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/ctc.h"
#include "kernels/ops.h"
#include "tests/c/check.h"
#include "tests/gpu/device_side.h"

enum { T = 37, B = 6, V = 7, S = 9, BLANK = 6 };
static const int32_t in_len[B] = {37, 20, 9, 5, 1, 30};
static const int32_t lab_len[B] = {9, 4, 0, 4, 1, 7};

static rl_tensor make_int(int ndim, const int64_t *shape, const int32_t *v) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, RL_INT32, RL_DEVICE_CPU, ndim, shape));
    int64_t n = rl_tensor_numel(&t);
    if (t.storage) memcpy(rl_tensor_data(&t), v, (size_t)n * sizeof *v);
    return t;
}

/* logits with NaN on padded frames; labels with repeats, garbage (99) after each length */
static void make_inputs(rl_tensor *x64, rl_tensor *x32, rl_tensor *lab, rl_tensor *il,
                        rl_tensor *ll) {
    int64_t xs[3] = {T, B, V}, ls[2] = {B, S}, bs[1] = {B};
    CHECK_OK(rl_tensor_empty(x64, RL_FLOAT64, RL_DEVICE_CPU, 3, xs));
    CHECK_OK(rl_tensor_empty(x32, RL_FLOAT32, RL_DEVICE_CPU, 3, xs));
    double *d = rl_tensor_data(x64);
    float *f = rl_tensor_data(x32);
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t v = 0; v < V; v++) {
                double val = t < in_len[b] ? 6.0 * urand(0, 1) - 3.0 : NAN;
                f[(t * B + b) * V + v] = (float)val;
                d[(t * B + b) * V + v] = (double)f[(t * B + b) * V + v];
            }
    int32_t labels[B][S];
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            labels[b][s] = s < lab_len[b] ? (int32_t)(urand(0, 1) * 3) : 99; /* 0..2: repeats */
    /* sequence 4: {1, 1, 1, 1} in 5 frames needs 7: infeasible */
    for (int s = 0; s < 4; s++)
        labels[3][s] = 1;
    *lab = make_int(2, ls, &labels[0][0]);
    *il = make_int(1, bs, in_len);
    *ll = make_int(1, bs, lab_len);
}

/* The largest |got - want| relative to want's largest finite magnitude (at least 1); an
 * infinity must be matched exactly, a NaN anywhere is a mismatch (returns inf). */
static double rel_diff(const rl_tensor *want, const rl_tensor *got) {
    rl_tensor a = {0}, b = {0};
    if (rl_op_to(&a, want, RL_FLOAT64, RL_DEVICE_CPU) != RL_OK ||
        rl_op_to(&b, got, RL_FLOAT64, RL_DEVICE_CPU) != RL_OK || a.ndim != b.ndim ||
        rl_tensor_numel(&a) != rl_tensor_numel(&b)) {
        rl_tensor_release(&a);
        rl_tensor_release(&b);
        return INFINITY;
    }
    const double *pa = rl_tensor_data(&a), *pb = rl_tensor_data(&b);
    int64_t n = rl_tensor_numel(&a);
    double scale = 1.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(pa[i]) && fabs(pa[i]) > scale) scale = fabs(pa[i]);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(pa[i]) || isnan(pb[i]) || isinf(pa[i]) != isinf(pb[i]) ||
            (isinf(pa[i]) && pa[i] != pb[i])) {
            worst = INFINITY;
            break;
        }
        if (!isinf(pa[i]) && fabs(pa[i] - pb[i]) / scale > worst)
            worst = fabs(pa[i] - pb[i]) / scale;
    }
    rl_tensor_release(&a);
    rl_tensor_release(&b);
    return worst;
}

static void run(const rl_tensor *x, const rl_tensor *lab, const rl_tensor *il, const rl_tensor *ll,
                bool zero_inf, rl_tensor *loss, rl_tensor *grad) {
    rl_ctc_work w = {0};
    CHECK_OK(rl_ctc_loss(&w, "ctc_parity", x, lab, il, ll, BLANK, zero_inf, loss, grad));
    rl_ctc_work_release(&w);
}

static void check_infeasible(const rl_tensor *loss, const rl_tensor *grad, bool zero_inf) {
    rl_tensor l = {0}, g = {0};
    CHECK_OK(rl_op_to(&l, loss, RL_FLOAT64, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&g, grad, RL_FLOAT64, RL_DEVICE_CPU));
    if (!l.storage || !g.storage) return;
    const double *pl = rl_tensor_data(&l), *pg = rl_tensor_data(&g);
    CHECK(zero_inf ? pl[3] == 0.0 : pl[3] == INFINITY);
    double gmax = 0, padmax = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t v = 0; v < V; v++) {
                double a = fabs(pg[(t * B + b) * V + v]);
                CHECK(!isnan(a));
                if (b == 3) gmax = fmax(gmax, a);
                if (t >= in_len[b]) padmax = fmax(padmax, a);
            }
    CHECK(gmax == 0.0);
    CHECK(padmax == 0.0);
    rl_tensor_release(&l);
    rl_tensor_release(&g);
}

int main(void) {
    rl_ops_init();
    rl_tensor x64 = {0}, x32 = {0}, lab = {0}, il = {0}, ll = {0};
    make_inputs(&x64, &x32, &lab, &il, &ll);
    /* the CPU references */
    rl_tensor l64 = {0}, g64 = {0}, l32 = {0}, g32 = {0};
    run(&x64, &lab, &il, &ll, false, &l64, &g64);
    run(&x32, &lab, &il, &ll, false, &l32, &g32);
    check_infeasible(&l64, &g64, false);
    check_infeasible(&l32, &g32, false);
    CHECK(rel_diff(&l64, &l32) < 2e-6);
    CHECK(rel_diff(&g64, &g32) < 2e-5);
    /* the comparison itself: a perturbed gradient and a misplaced infinity are caught */
    rl_tensor bad = {0};
    CHECK_OK(rl_op_to(&bad, &g64, RL_FLOAT64, RL_DEVICE_CPU));
    if (bad.storage) ((double *)rl_tensor_data(&bad))[5] += 1e-3;
    CHECK(rel_diff(&g64, &bad) > 1e-4);
    rl_tensor badl = {0};
    CHECK_OK(rl_op_to(&badl, &l64, RL_FLOAT64, RL_DEVICE_CPU));
    if (badl.storage) ((double *)rl_tensor_data(&badl))[3] = 0.0;
    CHECK(rel_diff(&l64, &badl) == INFINITY);
    rl_tensor_release(&bad);
    rl_tensor_release(&badl);

    const rl_device dev = device_side(NULL);
    for (int zi = 0; zi < 2; zi++) {
        rl_tensor r64 = {0}, r64g = {0};
        run(&x64, &lab, &il, &ll, zi, &r64, &r64g);
        for (int d = 0; d < 2; d++) {
            const rl_tensor *x = d == 0 ? &x64 : &x32;
            rl_tensor xd = {0}, ld = {0}, gd = {0}, ld2 = {0}, gd2 = {0};
            CHECK_OK(rl_op_to(&xd, x, x->dtype, dev));
            run(&xd, &lab, &il, &ll, zi, &ld, &gd);
            run(&xd, &lab, &il, &ll, zi, &ld2, &gd2);
            double tol = d == 0 ? 1e-10 : 2e-5;
            CHECK(rel_diff(&r64, &ld) <= tol);
            CHECK(rel_diff(&r64g, &gd) <= tol);
            CHECK(rel_diff(&ld, &ld2) == 0.0 && rel_diff(&gd, &gd2) == 0.0);
            check_infeasible(&ld, &gd, zi);
            rl_tensor_release(&xd);
            rl_tensor_release(&ld);
            rl_tensor_release(&gd);
            rl_tensor_release(&ld2);
            rl_tensor_release(&gd2);
        }
        rl_tensor_release(&r64);
        rl_tensor_release(&r64g);
    }
    rl_tensor *all[] = {&x64, &x32, &lab, &il, &ll, &l64, &g64, &l32, &g32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        rl_tensor_release(all[i]);
    TEST_MAIN_END();
}
