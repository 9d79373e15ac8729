/* The float32 formulas of kernels/pointwise.h that replace libm (rl_expf, rl_logf, rl_tanhf,
 * rl_sigmoidf) against the float64 libm functions over their whole range, plus NaN, +-inf
 * and the saturated ends. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../kernels/pointwise.h"
#include "check.h"

/* distance in units in the last place of float32 between got and the correctly rounded want */
static double ulps(float got, double want) {
    float w = (float)want;
    if (got == w) return 0;
    float next = nextafterf(w, got > w ? INFINITY : -INFINITY);
    double ulp = fabs((double)next - (double)w);
    return fabs((double)got - want) / ulp;
}

static void sweep(const char *name, float (*f)(float), double (*ref)(double), float lo, float hi,
                  double max_ulps, double abs_tol) {
    double worst = 0, worst_x = 0;
    int n = 200001;
    for (int i = 0; i < n; i++) {
        float x = lo + (hi - lo) * (float)i / (float)(n - 1);
        double want = ref((double)x);
        float got = f(x);
        double e = fabs((double)got - want) <= abs_tol ? 0 : ulps(got, want);
        if (e > worst) {
            worst = e;
            worst_x = x;
        }
    }
    if (worst > max_ulps) fprintf(stderr, "%s: %.1f ulp at x = %.9g\n", name, worst, worst_x);
    CHECK(worst <= max_ulps);
}

static double sigmoid_ref(double x) { return 1.0 / (1.0 + exp(-x)); }

int main(void) {
    sweep("expf", rl_expf, exp, -87.0f, 88.0f, 2.0, 0.0);
    sweep("tanhf", rl_tanhf, tanh, -10.0f, 10.0f, 7.0, 0.0);
    sweep("tanhf small", rl_tanhf, tanh, -0.7f, 0.7f, 5.0, 0.0);
    sweep("sigmoidf", rl_sigmoidf, sigmoid_ref, -80.0f, 20.0f, 3.0, 0.0);
    sweep("logf", rl_logf, log, 1e-6f, 4.0f, 2.0, 0.0);
    sweep("logf large", rl_logf, log, 1.0f, 3e38f, 2.0, 0.0);
    sweep("logf [1, 3]", rl_logf, log, 1.0f, 3.0f, 2.0, 0.0);
    for (float x = 1e-44f; x < 1e-30f; x *= 3.7f) /* subnormals and small normals */
        CHECK(ulps(rl_logf(x), log((double)x)) <= 2.0);
    CHECK(isnan(rl_logf(NAN)) && isnan(rl_logf(-1.0f)) && rl_logf(0.0f) == -INFINITY);
    CHECK(rl_logf(INFINITY) == INFINITY && rl_logf(1.0f) == 0.0f);
    CHECK(isnan(rl_expf(NAN)) && isnan(rl_tanhf(NAN)) && isnan(rl_sigmoidf(NAN)));
    /* At run time, not folded by the compiler: a NaN must not reach the int32 conversion of
     * the exponent (undefined behaviour, which the sanitizer build traps). */
    volatile float nans[3] = {NAN, -NAN, 0.0f};
    nans[2] = nans[0] * 0.0f;
    for (int i = 0; i < 3; i++)
        CHECK(isnan(rl_expf(nans[i])) && isnan(rl_sigmoidf(nans[i])));
    CHECK(rl_expf(INFINITY) == INFINITY && rl_expf(100.0f) == INFINITY);
    CHECK(rl_expf(-INFINITY) == 0.0f && rl_expf(-90.0f) == 0.0f);
    CHECK(rl_tanhf(50.0f) == 1.0f && rl_tanhf(-50.0f) == -1.0f && rl_tanhf(0.0f) == 0.0f);
    CHECK(rl_tanhf(INFINITY) == 1.0f && rl_tanhf(-INFINITY) == -1.0f);
    CHECK(rl_sigmoidf(-200.0f) >= 0.0f && rl_sigmoidf(200.0f) == 1.0f);
    CHECK(rl_expf(0.0f) == 1.0f);
    TEST_MAIN_END();
}
