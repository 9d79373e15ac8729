/* Pointwise formulas, one definition each, compiled for the host (CPU loops) and the device
 * (CUDA kernels) alike. Float32 math stays in float32 (tanhf, expf, ...); float64 in double.
 * The layers' gate functions (sigmoid, tanh and their derivatives) live here too. */
#ifndef RL_POINTWISE_H
#define RL_POINTWISE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../core/hd.h"
#include "ops.h"

/* float32 exp, tanh and sigmoid written in plain arithmetic (no libm call), so that the
 * compiler vectorises the loops that use them: libm's scalar tanhf costs ~17 ns an element,
 * which would dominate an LSTM's pointwise pass. Accuracy (tests/c/test_pointwise.c measures
 * it against float64 libm): exp and sigmoid within 3 ulp, tanh within 7; NaN propagates.
 * float64 uses libm: the gradient checks need exact derivatives.
 *
 * rl_expf: Cephes' method. n = round(x / ln 2) by the 1.5 * 2^23 rounding trick (no call to
 * rintf), r = x - n ln 2 in two parts, e^r by a degree-6 polynomial, times 2^n built in the
 * exponent bits. Below x = -87.3 (results under the smallest normal float) it gives 0, above
 * 88.72 +inf, for NaN NaN. */
RL_HD_INLINE float rl_expf(float x) {
    const float hi = 88.72f, lo = -87.3f;
    /* written so that NaN clamps to lo: n must stay finite, a NaN converted to int32 below is
     * undefined behaviour; the NaN itself is returned at the end. Two selects one after the
     * other, here and at the end, not nested: GCC combines nested ones' masks with extra
     * instructions in the vector loops */
    float xc = x > lo ? x : lo;
    xc = xc < hi ? xc : hi;
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    union {
        float f;
        int32_t i;
    } scale;
    scale.i = ((int32_t)n + 127) * (1 << 23);
    /* + (x - x): + 0, or NaN for a NaN x. A select for NaN would be a third arm that GCC carries
     * through the caller's arithmetic (rl_sigmoidf's division ran twice per element) */
    float y = e * scale.f + (x - x);
    y = x < lo ? 0.0f : y;
    return x > hi ? INFINITY : y;
}

/* rl_logf: Cephes' method. x = m 2^e with m in [sqrt(1/2), sqrt(2)) read from the exponent
 * bits (subnormals scaled by 2^23 first), log(m) by a degree-9 polynomial in m - 1, plus e ln 2
 * in two parts. Special values by selects (so loops stay branch-free): log(0) = -inf,
 * log(x < 0) = NaN, log(+inf) = +inf, NaN propagates. Within 2 ulp (test_pointwise.c). */
RL_HD_INLINE float rl_logf(float x) {
    const float tiny = 1.17549435e-38f; /* FLT_MIN */
    float xs = x < tiny ? x * 8388608.0f : x;
    float ebias = x < tiny ? -23.0f : 0.0f;
    union {
        float f;
        int32_t i;
    } u;
    u.f = xs;
    float e = (float)(((u.i >> 23) & 0xff) - 126) + ebias;
    u.i = (u.i & 0x007fffff) | 0x3f000000; /* m in [0.5, 1) */
    float m = u.f;
    bool low = m < 0.707106781186547524f;
    e = low ? e - 1.0f : e;
    m = low ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float p = 7.0376836292e-2f;
    p = p * m + -1.1514610310e-1f;
    p = p * m + 1.1676998740e-1f;
    p = p * m + -1.2420140846e-1f;
    p = p * m + 1.4249322787e-1f;
    p = p * m + -1.6668057665e-1f;
    p = p * m + 2.0000714765e-1f;
    p = p * m + -2.4999993993e-1f;
    p = p * m + 3.3333331174e-1f;
    float y = p * m * z + e * -2.12194440e-4f - 0.5f * z;
    float r = m + y + e * 0.693359375f;
    r = x == INFINITY ? INFINITY : r;
    r = x == 0.0f ? -INFINITY : r;
    return x < 0.0f || x != x ? NAN : r;
}

/* tanh: Eigen's rational approximation (a degree-13 odd polynomial over a degree-6 even one)
 * on x clamped to +-7.905, beyond which float32 tanh rounds to +-1. No exp, one division. */
RL_HD_INLINE float rl_tanhf(float x) {
    const float lim = 7.90531110763549805f;
    x = x < -lim ? -lim : (x > lim ? lim : x);
    float x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = x2 * p + -8.60467152213735e-11f;
    p = x2 * p + 5.12229709037114e-08f;
    p = x2 * p + 1.48572235717979e-05f;
    p = x2 * p + 6.37261928875436e-04f;
    p = x2 * p + 4.89352455891786e-03f;
    p = x * p;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = x2 * q + 2.26843463243900e-03f;
    q = x2 * q + 4.89352518554385e-03f;
    return p / q;
}

/* Activations and their derivatives, written in terms of the output y where that is how the
 * backward passes use them. */
RL_HD_INLINE float rl_sigmoidf(float x) { return 1.0f / (1.0f + rl_expf(-x)); }
RL_HD_INLINE double rl_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
RL_HD_INLINE float rl_dsigmoidf(float y) { return y * (1.0f - y); }
RL_HD_INLINE double rl_dsigmoid(double y) { return y * (1.0 - y); }
RL_HD_INLINE float rl_dtanhf(float y) { return 1.0f - y * y; }
RL_HD_INLINE double rl_dtanh(double y) { return 1.0 - y * y; }
/* Zoneout (Krueger et al. 2017) of a recurrent state: s = m prev + (1 - m) new, where m is the
 * unit's weight of its previous value: 0 or 1 in training (a Bernoulli(z) draw per unit and
 * step), z in evaluation (the expectation). Exact at m = 0 and m = 1. Backward: the new value
 * gets (1 - m) ds, the previous one m ds. */
RL_HD_INLINE float rl_zoneoutf(float m, float prev, float nw) { return m * prev + (1.0f - m) * nw; }
RL_HD_INLINE double rl_zoneout(double m, double prev, double nw) {
    return m * prev + (1.0 - m) * nw;
}
/* Zoneout's backward: the share (1 - m) ds of the state's gradient ds that reaches the new value
 * (the cell's own pass), and the share m ds that passes to the previous state directly. */
RL_HD_INLINE float rl_zoneout_newf(float m, float ds) { return (1.0f - m) * ds; }
RL_HD_INLINE double rl_zoneout_new(double m, double ds) { return (1.0 - m) * ds; }
RL_HD_INLINE float rl_zoneout_prevf(float m, float ds) { return m * ds; }
RL_HD_INLINE double rl_zoneout_prev(double m, double ds) { return m * ds; }
/* Dropout by a mask k (0, or 1/(1 - p) for a kept unit: rec_dropout's recurrent operand and its
 * gradient, weight_dropout's U and dU): a k, the same rule on the way back. */
RL_HD_INLINE float rl_dropf(float a, float k) { return a * k; }
RL_HD_INLINE double rl_drop(double a, double k) { return a * k; }
/* log(1 + e^x) without overflow for large x */
static inline RL_HD float rl_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static inline RL_HD double rl_softplus(double x) { return x > 30.0 ? x : log1p(exp(x)); }

static inline RL_HD float rl_unary_f32(rl_unary_op op, float x, float p0, float p1) {
    switch (op) {
    case RL_UN_NEG: return -x;
    case RL_UN_ABS: return fabsf(x);
    case RL_UN_SIGN: return (float)((x > 0.0f) - (x < 0.0f));
    case RL_UN_EXP: return expf(x);
    case RL_UN_LOG: return logf(x);
    case RL_UN_LOG1P: return log1pf(x);
    case RL_UN_EXPM1: return expm1f(x);
    case RL_UN_SQRT: return sqrtf(x);
    case RL_UN_RSQRT: return 1.0f / sqrtf(x);
    case RL_UN_SQUARE: return x * x;
    case RL_UN_RECIPROCAL: return 1.0f / x;
    case RL_UN_SIN: return sinf(x);
    case RL_UN_COS: return cosf(x);
    case RL_UN_TANH: return rl_tanhf(x);
    case RL_UN_SIGMOID: return rl_sigmoidf(x);
    case RL_UN_RELU: return x > 0.0f ? x : 0.0f;
    case RL_UN_ELU: return x > 0.0f ? x : p0 * expm1f(x);
    case RL_UN_SOFTPLUS: return rl_softplusf(x);
    case RL_UN_FLOOR: return floorf(x);
    case RL_UN_CEIL: return ceilf(x);
    case RL_UN_ROUND: return roundf(x);
    case RL_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    default: return x;
    }
}

static inline RL_HD double rl_unary_f64(rl_unary_op op, double x, double p0, double p1) {
    switch (op) {
    case RL_UN_NEG: return -x;
    case RL_UN_ABS: return fabs(x);
    case RL_UN_SIGN: return (double)((x > 0.0) - (x < 0.0));
    case RL_UN_EXP: return exp(x);
    case RL_UN_LOG: return log(x);
    case RL_UN_LOG1P: return log1p(x);
    case RL_UN_EXPM1: return expm1(x);
    case RL_UN_SQRT: return sqrt(x);
    case RL_UN_RSQRT: return 1.0 / sqrt(x);
    case RL_UN_SQUARE: return x * x;
    case RL_UN_RECIPROCAL: return 1.0 / x;
    case RL_UN_SIN: return sin(x);
    case RL_UN_COS: return cos(x);
    case RL_UN_TANH: return tanh(x);
    case RL_UN_SIGMOID: return rl_sigmoid(x);
    case RL_UN_RELU: return x > 0.0 ? x : 0.0;
    case RL_UN_ELU: return x > 0.0 ? x : p0 * expm1(x);
    case RL_UN_SOFTPLUS: return rl_softplus(x);
    case RL_UN_FLOOR: return floor(x);
    case RL_UN_CEIL: return ceil(x);
    case RL_UN_ROUND: return round(x);
    case RL_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    default: return x;
    }
}

/* int32 takes only the ops for which rl_unary_needs_float() is false */
static inline RL_HD int32_t rl_unary_i32(rl_unary_op op, int32_t x, int32_t p0, int32_t p1) {
    switch (op) {
    case RL_UN_NEG: return (int32_t)(0u - (uint32_t)x);
    case RL_UN_ABS: return x < 0 ? (int32_t)(0u - (uint32_t)x) : x;
    case RL_UN_SIGN: return (x > 0) - (x < 0);
    case RL_UN_SQUARE: return (int32_t)((uint32_t)x * (uint32_t)x);
    case RL_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    default: return x;
    }
}

static inline RL_HD float rl_binary_f32(rl_binary_op op, float a, float b) {
    switch (op) {
    case RL_BIN_ADD: return a + b;
    case RL_BIN_SUB: return a - b;
    case RL_BIN_MUL: return a * b;
    case RL_BIN_DIV: return a / b;
    case RL_BIN_POW: return powf(a, b);
    case RL_BIN_MAX: return a > b || a != a ? a : b; /* NaN propagates */
    case RL_BIN_MIN: return a < b || a != a ? a : b;
    case RL_BIN_EQ: return (float)(a == b);
    case RL_BIN_NE: return (float)(a != b);
    case RL_BIN_LT: return (float)(a < b);
    case RL_BIN_LE: return (float)(a <= b);
    case RL_BIN_GT: return (float)(a > b);
    case RL_BIN_GE: return (float)(a >= b);
    default: return a;
    }
}

static inline RL_HD double rl_binary_f64(rl_binary_op op, double a, double b) {
    switch (op) {
    case RL_BIN_ADD: return a + b;
    case RL_BIN_SUB: return a - b;
    case RL_BIN_MUL: return a * b;
    case RL_BIN_DIV: return a / b;
    case RL_BIN_POW: return pow(a, b);
    case RL_BIN_MAX: return a > b || a != a ? a : b;
    case RL_BIN_MIN: return a < b || a != a ? a : b;
    case RL_BIN_EQ: return (double)(a == b);
    case RL_BIN_NE: return (double)(a != b);
    case RL_BIN_LT: return (double)(a < b);
    case RL_BIN_LE: return (double)(a <= b);
    case RL_BIN_GT: return (double)(a > b);
    case RL_BIN_GE: return (double)(a >= b);
    default: return a;
    }
}

/* Integer division truncates toward zero; division by zero gives 0 here, but never reaches a
 * kernel (the dispatcher, kernels/ops.c, rejects a zero scalar and looks for a zero in a
 * divisor tensor first). Integer pow with a negative exponent gives 0 unless the base is 1 or
 * -1. Wrapping arithmetic: INT32_MIN / -1 wraps to INT32_MIN, as -INT32_MIN does. */
static inline RL_HD int32_t rl_binary_i32(rl_binary_op op, int32_t a, int32_t b) {
    switch (op) {
    case RL_BIN_ADD: return (int32_t)((uint32_t)a + (uint32_t)b);
    case RL_BIN_SUB: return (int32_t)((uint32_t)a - (uint32_t)b);
    case RL_BIN_MUL: return (int32_t)((uint32_t)a * (uint32_t)b);
    case RL_BIN_DIV: return b == 0 ? 0 : (a == INT32_MIN && b == -1) ? INT32_MIN : a / b;
    case RL_BIN_POW: {
        if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
        uint32_t r = 1, base = (uint32_t)a;
        for (int32_t e = b; e > 0; e >>= 1) {
            if (e & 1) r *= base;
            base *= base;
        }
        return (int32_t)r;
    }
    case RL_BIN_MAX: return a > b ? a : b;
    case RL_BIN_MIN: return a < b ? a : b;
    case RL_BIN_EQ: return a == b;
    case RL_BIN_NE: return a != b;
    case RL_BIN_LT: return a < b;
    case RL_BIN_LE: return a <= b;
    case RL_BIN_GT: return a > b;
    case RL_BIN_GE: return a >= b;
    default: return a;
    }
}

/* Box-Muller: two uniform words -> one standard normal (the cosine branch). */
static inline RL_HD double rl_box_muller(double u1_open, double u2) {
    return sqrt(-2.0 * log(u1_open)) * cos(6.283185307179586 * u2);
}

/* Layer normalisation of one row of n values (the recurrent cells' layer_norm = true, Ba et al.
 * 2016; kernels/lstm_cell.h, kernels/cpu/gru.c): the forward writes xhat = (x - mean) * rs with
 * rs = 1 / sqrt(var + RL_LN_EPS) (the biased variance, as PyTorch's LayerNorm; xhat may be x)
 * and returns rs. The backward takes dLoss/dy for y = gain * xhat + bias and writes dLoss/dx =
 * rs (d - mean(d) - xhat mean(d xhat)), d = dy gain (dx may be xhat or dy: each element is read
 * before it is written). */
#define RL_LN_EPS 1e-5

/* The sums over a row run in RL_LN_LANES interleaved partial sums (element j into lane j mod
 * RL_LN_LANES), added pairwise at the end: a fixed order, the same on every CPU level, thread count
 * and device, which the compiler can keep in one AVX-512 vector (two AVX2 ones) rather than one
 * serial chain. */
#define RL_LN_LANES 16

/* The forward and backward in one precision, REAL float (S f32) or double (S f64). */
#define RL_LN_ROW(REAL, S, SQRT)                                                                   \
    RL_HD_INLINE REAL rl_ln_lanes_##S(REAL *acc) {                                                 \
        for (int w = RL_LN_LANES / 2; w > 0; w /= 2)                                               \
            for (int k = 0; k < w; k++)                                                            \
                acc[k] += acc[k + w];                                                              \
        return acc[0];                                                                             \
    }                                                                                              \
                                                                                                   \
    RL_HD_INLINE REAL rl_ln_fwd_##S(int64_t n, const REAL *x, REAL *xhat) {                        \
        REAL acc[RL_LN_LANES], mu, var;                                                            \
        for (int k = 0; k < RL_LN_LANES; k++)                                                      \
            acc[k] = (REAL)0;                                                                      \
        int64_t m = n - n % RL_LN_LANES, j0;                                                       \
        for (j0 = 0; j0 < m; j0 += RL_LN_LANES)                                                    \
            for (int k = 0; k < RL_LN_LANES; k++)                                                  \
                acc[k] += x[j0 + k];                                                               \
        for (int k = 0; j0 + k < n; k++)                                                           \
            acc[k] += x[j0 + k];                                                                   \
        mu = rl_ln_lanes_##S(acc) / (REAL)n;                                                       \
        for (int k = 0; k < RL_LN_LANES; k++)                                                      \
            acc[k] = (REAL)0;                                                                      \
        for (j0 = 0; j0 < m; j0 += RL_LN_LANES)                                                    \
            for (int k = 0; k < RL_LN_LANES; k++)                                                  \
                acc[k] += (x[j0 + k] - mu) * (x[j0 + k] - mu);                                     \
        for (int k = 0; j0 + k < n; k++)                                                           \
            acc[k] += (x[j0 + k] - mu) * (x[j0 + k] - mu);                                         \
        var = rl_ln_lanes_##S(acc);                                                                \
        REAL rs = (REAL)1 / SQRT(var / (REAL)n + (REAL)RL_LN_EPS);                                 \
        for (int64_t j = 0; j < n; j++)                                                            \
            xhat[j] = (x[j] - mu) * rs;                                                            \
        return rs;                                                                                 \
    }                                                                                              \
                                                                                                   \
    RL_HD_INLINE void rl_ln_bwd_##S(int64_t n, const REAL *xhat, REAL rs, const REAL *dy,          \
                                    const REAL *gain, REAL *dx) {                                  \
        REAL sa[RL_LN_LANES], sb[RL_LN_LANES];                                                     \
        for (int k = 0; k < RL_LN_LANES; k++)                                                      \
            sa[k] = sb[k] = (REAL)0;                                                               \
        int64_t m = n - n % RL_LN_LANES, j0;                                                       \
        for (j0 = 0; j0 < m; j0 += RL_LN_LANES)                                                    \
            for (int k = 0; k < RL_LN_LANES; k++) {                                                \
                sa[k] += dy[j0 + k] * gain[j0 + k];                                                \
                sb[k] += dy[j0 + k] * gain[j0 + k] * xhat[j0 + k];                                 \
            }                                                                                      \
        for (int k = 0; j0 + k < n; k++) {                                                         \
            sa[k] += dy[j0 + k] * gain[j0 + k];                                                    \
            sb[k] += dy[j0 + k] * gain[j0 + k] * xhat[j0 + k];                                     \
        }                                                                                          \
        REAL a = rl_ln_lanes_##S(sa) / (REAL)n, b = rl_ln_lanes_##S(sb) / (REAL)n;                 \
        for (int64_t j = 0; j < n; j++)                                                            \
            dx[j] = rs * (dy[j] * gain[j] - a - xhat[j] * b);                                      \
    }

RL_LN_ROW(float, f32, sqrtf)
RL_LN_ROW(double, f64, sqrt)

#endif
