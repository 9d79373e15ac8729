/* The float32 formulas of kernels/pointwise.h that replace libm (rl_expf, rl_logf, rl_tanhf,
 * rl_sigmoidf) against the float64 libm functions over their whole range, plus NaN, +-inf
 * and the saturated ends: as plain C here, and through loops compiled as the kernels compile
 * them (kernels/cpu/cpu_level.h: vectorised, a * b + c fused into FMAs) at every level this CPU
 * has, since the kernels' rounding is not this file's. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../kernels/cpu/cpu_level.h"
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

/* The formulas over arrays, compiled once per level as the kernels are (one body, inlined
 * into each level's function, as in kernels/cpu/lstm.c). */
enum { F_EXP, F_TANH, F_SIGMOID, F_LOG };
static const char *const NAMES[] = {"expf", "tanhf", "sigmoidf", "logf"};
static inline __attribute__((always_inline)) void batch_body(int f, const float *restrict x,
                                                             float *restrict y, int n) {
    switch (f) {
    case F_EXP:
        for (int i = 0; i < n; i++)
            y[i] = rl_expf(x[i]);
        break;
    case F_TANH:
        for (int i = 0; i < n; i++)
            y[i] = rl_tanhf(x[i]);
        break;
    case F_LOG:
        for (int i = 0; i < n; i++)
            y[i] = rl_logf(x[i]);
        break;
    default:
        for (int i = 0; i < n; i++)
            y[i] = rl_sigmoidf(x[i]);
    }
}
RL_TARGET_BASE static void batch_base(int f, const float *x, float *y, int n) {
    batch_body(f, x, y, n);
}
#ifdef RL_CPU_X86
RL_TARGET_AVX2 static void batch_avx2(int f, const float *x, float *y, int n) {
    batch_body(f, x, y, n);
}
RL_TARGET_AVX512 static void batch_avx512(int f, const float *x, float *y, int n) {
    batch_body(f, x, y, n);
}
#endif

static void sweep_batch(const char *level, void (*fn)(int, const float *, float *, int), int f,
                        double (*ref)(double), float lo, float hi, double max_ulps) {
    enum { N = 200001 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = lo + (hi - lo) * (float)i / (float)(N - 1);
    fn(f, x, y, N);
    double worst = 0, worst_x = 0;
    for (int i = 0; i < N; i++) {
        double e = ulps(y[i], ref((double)x[i]));
        if (e > worst) worst = e, worst_x = x[i];
    }
    if (worst > max_ulps)
        fprintf(stderr, "%s %s: %.1f ulp at x = %.9g\n", level, NAMES[f], worst, worst_x);
    CHECK(worst <= max_ulps);
    /* the special values through the same loop */
    float sx[6] = {NAN, INFINITY, -INFINITY, 100.0f, -100.0f, 0.0f}, sy[6];
    fn(f, sx, sy, 6);
    CHECK(isnan(sy[0]));
    if (f == F_EXP) CHECK(sy[1] == INFINITY && sy[2] == 0.0f && sy[3] == INFINITY && sy[5] == 1.0f);
    if (f == F_TANH) CHECK(sy[1] == 1.0f && sy[2] == -1.0f && sy[4] == -1.0f && sy[5] == 0.0f);
    if (f == F_SIGMOID) CHECK(sy[1] == 1.0f && sy[2] == 0.0f && sy[3] == 1.0f && sy[5] == 0.5f);
    if (f == F_LOG) CHECK(sy[1] == INFINITY && isnan(sy[2]) && sy[5] == -INFINITY);
}

static void sweep_levels(void) {
    struct {
        const char *name;
        void (*fn)(int, const float *, float *, int);
        rl_cpu_level level;
    } lv[] = {{"generic", batch_base, RL_CPU_GENERIC},
#ifdef RL_CPU_X86
              {"avx2", batch_avx2, RL_CPU_AVX2},
              {"avx512", batch_avx512, RL_CPU_AVX512}
#endif
    };
    for (size_t i = 0; i < sizeof lv / sizeof lv[0]; i++) {
        if (lv[i].level > rl_cpu_level_supported()) continue;
        sweep_batch(lv[i].name, lv[i].fn, F_EXP, exp, -87.0f, 88.0f, 2.0);
        sweep_batch(lv[i].name, lv[i].fn, F_TANH, tanh, -10.0f, 10.0f, 7.0);
        sweep_batch(lv[i].name, lv[i].fn, F_SIGMOID, sigmoid_ref, -80.0f, 20.0f, 3.0);
        sweep_batch(lv[i].name, lv[i].fn, F_LOG, log, 1e-6f, 4.0f, 2.0);
    }
}

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
    sweep_levels();
    TEST_MAIN_END();
}
