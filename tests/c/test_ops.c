/* Tests of kernels/ops.h on the CPU: every op against a reference computed here in double
 * from the elements (read through rl_tensor_get), on contiguous and strided inputs, plus the
 * errors that bad shapes and dtypes return. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "check.h"

static uint64_t lcg_state = 12345;

/* A deterministic value in [lo, hi), independent of the library's RNG. */
static double rnd(double lo, double hi) {
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(lcg_state >> 11) / 9007199254740992.0;
}

static void unflat(const rl_tensor *t, int64_t flat, int64_t *idx) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? flat % t->shape[d] : 0;
        flat = t->shape[d] ? flat / t->shape[d] : 0;
    }
}

static double at(const rl_tensor *t, int64_t flat) {
    int64_t idx[RL_MAX_DIMS] = {0};
    unflat(t, flat, idx);
    return rl_tensor_get(t, idx);
}

static void set_at(rl_tensor *t, int64_t flat, double v) {
    int64_t idx[RL_MAX_DIMS] = {0};
    unflat(t, flat, idx);
    rl_tensor_set(t, idx, v);
}

/* A new CPU tensor; vals (row-major) may be NULL for random values in [lo, hi). */
static rl_tensor mk(rl_dtype dt, int nd, const int64_t *shape, const double *vals, double lo,
                    double hi) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, dt, RL_DEVICE_CPU, nd, shape));
    int64_t n = rl_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        double v = vals ? vals[i] : rnd(lo, hi);
        set_at(&t, i, dt == RL_INT32 ? floor(v) : v);
    }
    return t;
}

static rl_tensor mk2(rl_dtype dt, int64_t r, int64_t c) {
    int64_t s[2] = {r, c};
    return mk(dt, 2, s, NULL, -2, 2);
}

static bool has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

/* relative-or-absolute closeness */
static bool close_to(double got, double want, double tol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

static void test_broadcast(void) {
    int64_t s31[2] = {3, 1}, s14[2] = {1, 4}, s23[2] = {2, 3}, s3[1] = {3};
    double va[3] = {1, 2, 3}, vb[4] = {10, 20, 30, 40};
    rl_tensor a = mk(RL_FLOAT32, 2, s31, va, 0, 0), b = mk(RL_FLOAT32, 2, s14, vb, 0, 0);
    rl_tensor c = {0};
    CHECK_OK(rl_op_binary(&c, &a, &b, RL_BIN_ADD));
    CHECK(c.ndim == 2 && c.shape[0] == 3 && c.shape[1] == 4);
    int bad = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            bad += at(&c, i * 4 + j) != va[i] + vb[j];
    CHECK(bad == 0);
    rl_tensor_release(&c);
    /* b - a the other way round */
    CHECK_OK(rl_op_binary(&c, &b, &a, RL_BIN_SUB));
    bad = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            bad += at(&c, i * 4 + j) != vb[j] - va[i];
    CHECK(bad == 0);
    rl_tensor_release(&c);

    rl_tensor x = mk(RL_FLOAT64, 2, s23, NULL, -1, 1), r = mk(RL_FLOAT64, 1, s3, NULL, -1, 1);
    CHECK_OK(rl_op_binary(&c, &x, &r, RL_BIN_MUL));
    bad = 0;
    for (int i = 0; i < 6; i++)
        bad += at(&c, i) != at(&x, i) * at(&r, i % 3);
    CHECK(bad == 0);
    /* in place: x = x + r, out is x itself */
    double before[6];
    for (int i = 0; i < 6; i++)
        before[i] = at(&x, i);
    CHECK_OK(rl_op_binary(&x, &x, &r, RL_BIN_ADD));
    bad = 0;
    for (int i = 0; i < 6; i++)
        bad += at(&x, i) != before[i] + at(&r, i % 3);
    CHECK(bad == 0);
    /* scalars, both orders, in place */
    rl_tensor d = {0};
    CHECK_OK(rl_op_binary_scalar(&d, &x, 3.0, RL_BIN_SUB, true));
    CHECK_NEAR(at(&d, 4), 3.0 - at(&x, 4), 1e-15);
    CHECK_OK(rl_op_binary_scalar(&x, &x, 0.5, RL_BIN_MUL, false));
    CHECK_NEAR(at(&x, 5), 0.5 * (before[5] + at(&r, 2)), 1e-15);
    /* (3,1) + (3) broadcasts to (3,3) */
    rl_tensor e = {0};
    CHECK(rl_op_binary(&e, &a, &r, RL_BIN_ADD) == RL_EDTYPE); /* float32 + float64 */
    rl_tensor r32 = mk(RL_FLOAT32, 1, s3, va, 0, 0);
    CHECK_OK(rl_op_binary(&e, &a, &r32, RL_BIN_ADD));
    CHECK(e.ndim == 2 && e.shape[0] == 3 && e.shape[1] == 3);
    CHECK(at(&e, 5) == va[1] + va[2]);
    /* shapes that do not broadcast, and a wrong out */
    rl_tensor f = {0};
    CHECK(rl_op_binary(&f, &b, &r32, RL_BIN_ADD) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "add"));
    CHECK(f.storage == NULL);
    CHECK(rl_op_binary(&b, &a, &b, RL_BIN_ADD) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "add") && has(rl_errmsg(), "(3, 4)"));
    rl_tensor_release(&a);
    rl_tensor_release(&b);
    rl_tensor_release(&c);
    rl_tensor_release(&d);
    rl_tensor_release(&e);
    rl_tensor_release(&x);
    rl_tensor_release(&r);
    rl_tensor_release(&r32);
}

static double ref_unary(rl_unary_op op, double x, double p0, double p1) {
    switch (op) {
    case RL_UN_NEG: return -x;
    case RL_UN_ABS: return fabs(x);
    case RL_UN_SIGN: return x > 0 ? 1 : (x < 0 ? -1 : 0);
    case RL_UN_EXP: return exp(x);
    case RL_UN_LOG: return log(x);
    case RL_UN_LOG1P: return log(1 + x);
    case RL_UN_EXPM1: return exp(x) - 1;
    case RL_UN_SQRT: return sqrt(x);
    case RL_UN_RSQRT: return 1 / sqrt(x);
    case RL_UN_SQUARE: return x * x;
    case RL_UN_RECIPROCAL: return 1 / x;
    case RL_UN_SIN: return sin(x);
    case RL_UN_COS: return cos(x);
    case RL_UN_TANH: return (exp(2 * x) - 1) / (exp(2 * x) + 1);
    case RL_UN_SIGMOID: return 1 / (1 + exp(-x));
    case RL_UN_RELU: return x > 0 ? x : 0;
    case RL_UN_ELU: return x > 0 ? x : p0 * (exp(x) - 1);
    case RL_UN_SOFTPLUS: return log(1 + exp(x));
    case RL_UN_FLOOR: return floor(x);
    case RL_UN_CEIL: return ceil(x);
    case RL_UN_ROUND: return x >= 0 ? floor(x + 0.5) : -floor(-x + 0.5);
    case RL_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    default: return NAN;
    }
}

static void test_unary(void) {
    int64_t s[2] = {4, 6};
    const double p0 = 0.7, p1 = 1.3;
    for (int op = 0; op < RL_NUM_UNARY; op++) {
        bool positive = op == RL_UN_LOG || op == RL_UN_SQRT || op == RL_UN_RSQRT ||
                        op == RL_UN_LOG1P || op == RL_UN_RECIPROCAL;
        for (int dti = 0; dti < 3; dti++) {
            rl_dtype dt = (rl_dtype)dti;
            rl_tensor a = mk(dt, 2, s, NULL, positive ? 0.2 : -3.0, 3.0);
            /* halves for round's ties */
            set_at(&a, 0, dt == RL_INT32 ? 2 : 2.5);
            set_at(&a, 1, dt == RL_INT32 ? -2 : -2.5);
            rl_tensor o = {0};
            rl_status st = rl_op_unary(&o, &a, (rl_unary_op)op, p0, dt == RL_INT32 ? 2 : p1);
            if (dt == RL_INT32 && rl_unary_needs_float((rl_unary_op)op)) {
                CHECK(st == RL_EDTYPE);
                CHECK(has(rl_errmsg(), rl_unary_name((rl_unary_op)op)));
                CHECK(o.storage == NULL);
                rl_tensor_release(&a);
                continue;
            }
            CHECK_OK(st);
            double tol = dt == RL_FLOAT32 ? 3e-6 : 1e-12;
            int bad = 0;
            for (int64_t i = 0; i < 24 && o.storage; i++) {
                double want = ref_unary((rl_unary_op)op, at(&a, i), dt == RL_INT32 ? 0 : p0,
                                        dt == RL_INT32 ? 2 : p1);
                if (!close_to(at(&o, i), want, tol)) {
                    bad++;
                    fprintf(stderr, "  %s %s x=%g: %.9g vs %.9g\n", rl_unary_name((rl_unary_op)op),
                            rl_dtype_name(dt), at(&a, i), at(&o, i), want);
                }
            }
            CHECK(bad == 0);
            /* a transposed (strided) input gives the transpose of the result */
            rl_tensor at_ = {0}, ot = {0};
            CHECK_OK(rl_tensor_transpose(&at_, &a, 0, 1));
            CHECK_OK(rl_op_unary(&ot, &at_, (rl_unary_op)op, p0, dt == RL_INT32 ? 2 : p1));
            bad = 0;
            for (int i = 0; i < 4 && ot.storage; i++)
                for (int j = 0; j < 6; j++) {
                    double x = at(&ot, j * 4 + i), y = at(&o, i * 6 + j);
                    bad += !(x == y || (isnan(x) && isnan(y)));
                }
            CHECK(bad == 0);
            rl_tensor_release(&ot);
            rl_tensor_release(&at_);
            rl_tensor_release(&o);
            rl_tensor_release(&a);
        }
    }
}

static double ref_binary(rl_binary_op op, double a, double b, bool integer) {
    switch (op) {
    case RL_BIN_ADD: return a + b;
    case RL_BIN_SUB: return a - b;
    case RL_BIN_MUL: return a * b;
    case RL_BIN_DIV: return integer ? (b == 0 ? 0 : trunc(a / b)) : a / b;
    case RL_BIN_POW:
        if (integer && b < 0) return a == 1 ? 1 : (a == -1 ? (fmod(b, 2) != 0 ? -1 : 1) : 0);
        return pow(a, b);
    case RL_BIN_MAX: return isnan(a) || isnan(b) ? NAN : (a > b ? a : b);
    case RL_BIN_MIN: return isnan(a) || isnan(b) ? NAN : (a < b ? a : b);
    case RL_BIN_EQ: return a == b;
    case RL_BIN_NE: return a != b;
    case RL_BIN_LT: return a < b;
    case RL_BIN_LE: return a <= b;
    case RL_BIN_GT: return a > b;
    case RL_BIN_GE: return a >= b;
    default: return NAN;
    }
}

static void test_binary(void) {
    int64_t s[2] = {5, 7};
    for (int op = 0; op < RL_NUM_BINARY; op++)
        for (int dti = 0; dti < 3; dti++) {
            rl_dtype dt = (rl_dtype)dti;
            bool integer = dt == RL_INT32, pw = op == RL_BIN_POW;
            rl_tensor a = mk(dt, 2, s, NULL, pw && !integer ? 0.1 : -4, 4);
            rl_tensor b = mk(dt, 2, s, NULL, pw ? -2 : -4, pw ? 3 : 4);
            set_at(&b, 3, at(&a, 3)); /* equal pairs for the comparisons */
            set_at(&b, 4, at(&a, 4));
            if (integer && op == RL_BIN_DIV) {
                /* a zero in an int32 divisor tensor is refused (not 0), either way
                 * round; then the comparison below runs on divisors without zeros */
                rl_tensor r = {0};
                set_at(&b, 5, 0);
                CHECK(rl_op_binary(&r, &a, &b, RL_BIN_DIV) == RL_EARG && r.storage == NULL);
                CHECK(has(rl_errmsg(), "int32 division by zero (element "));
                CHECK(rl_op_binary_scalar(&r, &b, 7, RL_BIN_DIV, true) == RL_EARG);
                CHECK(r.storage == NULL);
                for (int64_t i = 0; i < 35; i++) {
                    if (at(&a, i) == 0) set_at(&a, i, 3);
                    if (at(&b, i) == 0) set_at(&b, i, -3);
                }
            }
            if (!integer) {
                set_at(&a, 6, NAN);
                set_at(&b, 8, NAN);
            }
            rl_tensor o = {0}, os = {0}, osf = {0};
            CHECK_OK(rl_op_binary(&o, &a, &b, (rl_binary_op)op));
            /* scalar forms use b[2] as the scalar */
            double sc = at(&b, 2);
            if (!(integer && op == RL_BIN_DIV && sc == 0)) {
                CHECK_OK(rl_op_binary_scalar(&os, &a, sc, (rl_binary_op)op, false));
            }
            CHECK_OK(rl_op_binary_scalar(&osf, &a, sc, (rl_binary_op)op, true));
            double tol = dt == RL_FLOAT32 ? 2e-6 : 1e-13;
            int bad = 0;
            for (int64_t i = 0; i < 35; i++) {
                double x = at(&a, i), y = at(&b, i);
                if (op == RL_BIN_POW && integer && y >= 0) tol = 0;
                bad += !close_to(at(&o, i), ref_binary((rl_binary_op)op, x, y, integer), tol);
                if (os.storage)
                    bad += !close_to(at(&os, i), ref_binary((rl_binary_op)op, x, sc, integer), tol);
                if (!(integer && op == RL_BIN_DIV && x == 0))
                    bad +=
                        !close_to(at(&osf, i), ref_binary((rl_binary_op)op, sc, x, integer), tol);
            }
            if (bad)
                fprintf(stderr, "  binary %s %s: %d mismatches\n", rl_binary_name((rl_binary_op)op),
                        rl_dtype_name(dt), bad);
            CHECK(bad == 0);
            rl_tensor_release(&a);
            rl_tensor_release(&b);
            rl_tensor_release(&o);
            rl_tensor_release(&os);
            rl_tensor_release(&osf);
        }
    /* int32 division by a zero scalar is refused */
    rl_tensor a = mk(RL_INT32, 2, s, NULL, -4, 4), o = {0};
    CHECK(rl_op_binary_scalar(&o, &a, 0, RL_BIN_DIV, false) == RL_EARG);
    /* INT32_MIN / -1 wraps to INT32_MIN, as -INT32_MIN does (not 0) */
    int64_t one = 1;
    double lo = INT32_MIN, neg = -1;
    rl_tensor m = mk(RL_INT32, 1, &one, &lo, 0, 0), n1 = mk(RL_INT32, 1, &one, &neg, 0, 0);
    rl_tensor q = {0};
    CHECK_OK(rl_op_binary(&q, &m, &n1, RL_BIN_DIV));
    CHECK(at(&q, 0) == INT32_MIN);
    rl_tensor_release(&q);
    rl_tensor_release(&m);
    rl_tensor_release(&n1);
    CHECK(rl_op_binary_scalar(&o, &a, 1e10, RL_BIN_ADD, false) == RL_EARG);
    CHECK(o.storage == NULL);
    rl_tensor_release(&a);
}

/* Reference reductions over dim `dim` of a 3-D tensor (or over everything when dim < 0). */
static void check_reduce(const rl_tensor *a, rl_reduce_op op) {
    const char *name = rl_reduce_name(op);
    bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
    int64_t n = rl_tensor_numel(a);
    double tol = a->dtype == RL_FLOAT32 ? 2e-6 : 1e-12;
    /* over all */
    double want = op == RL_RED_PROD ? 1 : 0;
    int64_t want_i = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = at(a, i);
        switch (op) {
        case RL_RED_SUM:
        case RL_RED_MEAN: want += v; break;
        case RL_RED_PROD: want *= v; break;
        case RL_RED_NORM: want += v * v; break;
        default:
            if (i == 0 || (op == RL_RED_MAX ? v > want : v < want)) {
                want = v;
                want_i = i;
            }
        }
    }
    if (op == RL_RED_MEAN) want /= (double)n;
    if (op == RL_RED_NORM) want = sqrt(want);
    double got;
    int64_t got_i = -1;
    CHECK_OK(rl_op_reduce_all(&got, &got_i, a, op));
    if (!close_to(got, want, tol) || (ext && got_i != want_i))
        fprintf(stderr, "  reduce_all %s %s: %g@%lld vs %g@%lld\n", name, rl_dtype_name(a->dtype),
                got, (long long)got_i, want, (long long)want_i);
    CHECK(close_to(got, want, tol));
    if (ext) CHECK(got_i == want_i);
    /* over each dim, with and without keepdim */
    for (int dim = 0; dim < a->ndim; dim++)
        for (int keep = 0; keep < 2; keep++) {
            rl_tensor o = {0}, idx = {0};
            CHECK_OK(rl_op_reduce_dim(&o, ext ? &idx : NULL, a, dim, keep, op));
            CHECK(o.ndim == (keep ? a->ndim : a->ndim - 1));
            if (keep) CHECK(o.shape[dim] == 1);
            int64_t len = a->shape[dim];
            int64_t on = rl_tensor_numel(&o);
            int bad = 0;
            for (int64_t j = 0; j < on; j++) {
                /* position in a of the reduction's first element */
                int64_t oi[RL_MAX_DIMS] = {0}, ai[RL_MAX_DIMS] = {0};
                unflat(&o, j, oi);
                for (int d = 0, e = 0; d < a->ndim; d++)
                    ai[d] = d == dim ? 0 : oi[keep ? d : e++];
                double w = op == RL_RED_PROD ? 1 : 0;
                int64_t wi = 0;
                for (int64_t r = 0; r < len; r++) {
                    ai[dim] = r;
                    double v = rl_tensor_get(a, ai);
                    switch (op) {
                    case RL_RED_SUM:
                    case RL_RED_MEAN: w += v; break;
                    case RL_RED_PROD: w *= v; break;
                    case RL_RED_NORM: w += v * v; break;
                    default:
                        if (r == 0 || (op == RL_RED_MAX ? v > w : v < w)) {
                            w = v;
                            wi = r;
                        }
                    }
                }
                if (op == RL_RED_MEAN) w /= (double)len;
                if (op == RL_RED_NORM) w = sqrt(w);
                bad += !close_to(at(&o, j), w, tol);
                if (ext) bad += at(&idx, j) != (double)wi;
            }
            if (bad)
                fprintf(stderr, "  reduce_dim %s %s dim %d keep %d: %d bad\n", name,
                        rl_dtype_name(a->dtype), dim, keep, bad);
            CHECK(bad == 0);
            if (ext) CHECK(idx.dtype == RL_INT32 && rl_tensor_same_shape(&idx, &o));
            rl_tensor_release(&o);
            rl_tensor_release(&idx);
        }
}

static void test_reduce(void) {
    int64_t s[3] = {3, 4, 5};
    for (int dti = 0; dti < 3; dti++) {
        rl_dtype dt = (rl_dtype)dti;
        rl_tensor a = mk(dt, 3, s, NULL, -5, 5);
        /* ties: the first occurrence must win */
        set_at(&a, 7, 5);
        set_at(&a, 9, 5);
        set_at(&a, 50, 5);
        rl_tensor p = {0}, tr = {0};
        int perm[3] = {2, 0, 1};
        CHECK_OK(rl_tensor_permute(&p, &a, perm));
        CHECK_OK(rl_tensor_transpose(&tr, &a, 0, 2));
        for (int op = 0; op < RL_NUM_REDUCE; op++) {
            if (dt == RL_INT32 && (op == RL_RED_MEAN || op == RL_RED_NORM)) {
                rl_tensor o = {0};
                CHECK(rl_op_reduce_dim(&o, NULL, &a, 0, false, (rl_reduce_op)op) == RL_EDTYPE);
                continue;
            }
            check_reduce(&a, (rl_reduce_op)op);
            check_reduce(&p, (rl_reduce_op)op);
            check_reduce(&tr, (rl_reduce_op)op);
        }
        rl_tensor_release(&p);
        rl_tensor_release(&tr);
        rl_tensor_release(&a);
    }
    /* a wide column reduction (the chunked path) and an exact float32 sum of a million ones */
    int64_t big[2] = {1000, 1000};
    rl_tensor ones = {0}, col = {0};
    CHECK_OK(rl_tensor_empty(&ones, RL_FLOAT32, RL_DEVICE_CPU, 2, big));
    CHECK_OK(rl_op_fill(&ones, 1.0));
    double r;
    CHECK_OK(rl_op_reduce_all(&r, NULL, &ones, RL_RED_SUM));
    CHECK(r == 1e6);
    CHECK_OK(rl_op_reduce_dim(&col, NULL, &ones, 0, false, RL_RED_SUM));
    CHECK(col.ndim == 1 && col.shape[0] == 1000 && at(&col, 999) == 1000.0);
    rl_tensor_release(&col);
    rl_tensor_release(&ones);
    /* NaN wins max and min, at its first position */
    int64_t s6[1] = {6};
    double v[6] = {1, 7, NAN, 9, NAN, -3};
    rl_tensor nanv = mk(RL_FLOAT32, 1, s6, v, 0, 0);
    int64_t i;
    CHECK_OK(rl_op_reduce_all(&r, &i, &nanv, RL_RED_MAX));
    CHECK(isnan(r) && i == 2);
    CHECK_OK(rl_op_reduce_all(&r, &i, &nanv, RL_RED_MIN));
    CHECK(isnan(r) && i == 2);
    rl_tensor_release(&nanv);
    /* empty reductions */
    int64_t s0[2] = {0, 3};
    rl_tensor e = {0}, eo = {0};
    CHECK_OK(rl_tensor_empty(&e, RL_FLOAT32, RL_DEVICE_CPU, 2, s0));
    CHECK_OK(rl_op_reduce_all(&r, NULL, &e, RL_RED_SUM));
    CHECK(r == 0);
    CHECK_OK(rl_op_reduce_all(&r, NULL, &e, RL_RED_PROD));
    CHECK(r == 1);
    CHECK(rl_op_reduce_all(&r, NULL, &e, RL_RED_MAX) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "max"));
    CHECK_OK(rl_op_reduce_dim(&eo, NULL, &e, 0, false, RL_RED_SUM));
    CHECK(eo.ndim == 1 && eo.shape[0] == 3 && at(&eo, 2) == 0);
    rl_tensor_release(&eo);
    CHECK(rl_op_reduce_dim(&eo, NULL, &e, 2, false, RL_RED_SUM) == RL_EINDEX);
    rl_tensor_release(&e);
}

/* c = alpha * op(a) op(b) + beta * c0 in double, naive */
static void ref_gemm(double *c, const rl_tensor *a, const rl_tensor *b, bool ta, bool tb,
                     double alpha, double beta, const double *c0) {
    int64_t m = ta ? a->shape[1] : a->shape[0], k = ta ? a->shape[0] : a->shape[1];
    int64_t n = tb ? b->shape[0] : b->shape[1];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++) {
                int64_t ia[2] = {ta ? l : i, ta ? i : l}, ib[2] = {tb ? j : l, tb ? l : j};
                s += rl_tensor_get(a, ia) * rl_tensor_get(b, ib);
            }
            c[i * n + j] = alpha * s + (c0 ? beta * c0[i * n + j] : 0);
        }
}

static int diff_count(const rl_tensor *t, const double *want, int64_t n, double tol) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !close_to(at(t, i), want[i], tol);
    return bad;
}

static void test_gemm(void) {
    const int64_t m = 5, k = 7, n = 4;
    double want[64], c0[64];
    for (int dti = 0; dti < 2; dti++) {
        rl_dtype dt = (rl_dtype)dti;
        double tol = dt == RL_FLOAT32 ? 1e-5 : 1e-12;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                /* stored contiguous in the shape op() expects */
                rl_tensor a = ta ? mk2(dt, k, m) : mk2(dt, m, k);
                rl_tensor b = tb ? mk2(dt, n, k) : mk2(dt, k, n);
                rl_tensor c = {0};
                CHECK_OK(rl_op_gemm(&c, &a, &b, ta, tb, 1.5, 7.0));
                ref_gemm(want, &a, &b, ta, tb, 1.5, 0, NULL);
                CHECK(c.shape[0] == m && c.shape[1] == n);
                CHECK(diff_count(&c, want, m * n, tol) == 0);
                /* beta with a set c */
                for (int i = 0; i < m * n; i++)
                    c0[i] = at(&c, i);
                CHECK_OK(rl_op_gemm(&c, &a, &b, ta, tb, -0.5, 2.0));
                ref_gemm(want, &a, &b, ta, tb, -0.5, 2.0, c0);
                CHECK(diff_count(&c, want, m * n, tol) == 0);
                /* the same product through transposed views (no flags) */
                rl_tensor av = {0}, bv = {0}, cv = {0};
                if (ta)
                    CHECK_OK(rl_tensor_transpose(&av, &a, 0, 1));
                else
                    rl_tensor_share(&av, &a);
                if (tb)
                    CHECK_OK(rl_tensor_transpose(&bv, &b, 0, 1));
                else
                    rl_tensor_share(&bv, &b);
                CHECK_OK(rl_op_matmul(&cv, &av, &bv));
                ref_gemm(want, &a, &b, ta, tb, 1, 0, NULL);
                CHECK(diff_count(&cv, want, m * n, tol) == 0);
                rl_tensor_release(&av);
                rl_tensor_release(&bv);
                rl_tensor_release(&cv);
                rl_tensor_release(&a);
                rl_tensor_release(&b);
                rl_tensor_release(&c);
            }
        /* views with no unit stride (every other column), and an out stored transposed */
        rl_tensor a, b = mk2(dt, k, n), c = {0}, ct = {0};
        int64_t s3[3] = {3, m, 2 * k};
        rl_tensor big3 = {0}, ev = {0};
        CHECK_OK(rl_tensor_empty(&big3, dt, RL_DEVICE_CPU, 3, s3));
        for (int64_t i = 0; i < rl_tensor_numel(&big3); i++)
            set_at(&big3, i, rnd(-1, 1));
        /* every other column: strides (2k, 2) in the last two dims */
        CHECK_OK(rl_tensor_select(&ev, &big3, 0, 1));
        a = ev;
        a.shape[1] = k;
        a.stride[1] = 2;
        CHECK_OK(rl_op_matmul(&c, &a, &b));
        ref_gemm(want, &a, &b, false, false, 1, 0, NULL);
        CHECK(diff_count(&c, want, m * n, tol) == 0);
        /* out = a transposed view of an (n, m) tensor, with beta */
        int64_t snm[2] = {n, m};
        rl_tensor store = mk(dt, 2, snm, NULL, -1, 1);
        CHECK_OK(rl_tensor_transpose(&ct, &store, 0, 1));
        for (int i = 0; i < m * n; i++)
            c0[i] = at(&ct, i);
        CHECK_OK(rl_op_gemm(&ct, &a, &b, false, false, 1.0, 1.0));
        ref_gemm(want, &a, &b, false, false, 1, 1, c0);
        CHECK(diff_count(&ct, want, m * n, tol) == 0);
        rl_tensor_release(&ct);
        rl_tensor_release(&store);
        rl_tensor_release(&c);
        rl_tensor_release(&ev);
        rl_tensor_release(&big3);

        /* batched (3,m,k)@(3,k,n), (3,m,k)@(k,n), (m,k)@(3,k,n) */
        int64_t sa[3] = {3, m, k}, sb[3] = {3, k, n};
        rl_tensor A = mk(dt, 3, sa, NULL, -1, 1), B = mk(dt, 3, sb, NULL, -1, 1), C = {0};
        rl_tensor A2 = mk2(dt, m, k), B2 = b;
        for (int variant = 0; variant < 3; variant++) {
            const rl_tensor *x = variant == 2 ? &A2 : &A, *y = variant == 1 ? &B2 : &B;
            CHECK_OK(rl_op_matmul(&C, x, y));
            CHECK(C.ndim == 3 && C.shape[0] == 3 && C.shape[1] == m && C.shape[2] == n);
            int bad = 0;
            for (int64_t i = 0; i < 3; i++) {
                rl_tensor xi = {0}, yi = {0}, ci = {0};
                if (x->ndim == 3)
                    CHECK_OK(rl_tensor_select(&xi, x, 0, i));
                else
                    rl_tensor_share(&xi, x);
                if (y->ndim == 3)
                    CHECK_OK(rl_tensor_select(&yi, y, 0, i));
                else
                    rl_tensor_share(&yi, y);
                CHECK_OK(rl_tensor_select(&ci, &C, 0, i));
                ref_gemm(want, &xi, &yi, false, false, 1, 0, NULL);
                bad += diff_count(&ci, want, m * n, tol);
                rl_tensor_release(&xi);
                rl_tensor_release(&yi);
                rl_tensor_release(&ci);
            }
            CHECK(bad == 0);
            rl_tensor_release(&C);
        }
        /* a transposed batch: (3,k,m) permuted to (3,m,k) */
        rl_tensor At = {0};
        CHECK_OK(rl_tensor_transpose(&At, &A, 1, 2)); /* (3,k,m) view */
        CHECK_OK(rl_op_matmul(&C, &At, &A));          /* (3,k,m)@(3,m,k) -> (3,k,k) */
        {
            rl_tensor x = {0}, y = {0}, ci = {0};
            CHECK_OK(rl_tensor_select(&x, &At, 0, 2));
            CHECK_OK(rl_tensor_select(&y, &A, 0, 2));
            CHECK_OK(rl_tensor_select(&ci, &C, 0, 2));
            ref_gemm(want, &x, &y, false, false, 1, 0, NULL);
            CHECK(diff_count(&ci, want, k * k, tol) == 0);
            rl_tensor_release(&x);
            rl_tensor_release(&y);
            rl_tensor_release(&ci);
        }
        rl_tensor_release(&C);
        rl_tensor_release(&At);

        /* 2-D @ 1-D, 1-D @ 1-D, 1-D @ 2-D */
        int64_t sk[1] = {k};
        rl_tensor v = mk(dt, 1, sk, NULL, -1, 1), mv = {0}, dot = {0}, vm = {0};
        CHECK_OK(rl_op_matmul(&mv, &A2, &v));
        CHECK(mv.ndim == 1 && mv.shape[0] == m);
        for (int64_t i = 0; i < m; i++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++)
                s += at(&A2, i * k + l) * at(&v, l);
            CHECK(close_to(at(&mv, i), s, tol));
        }
        CHECK_OK(rl_op_matmul(&dot, &v, &v));
        double s = 0;
        for (int64_t l = 0; l < k; l++)
            s += at(&v, l) * at(&v, l);
        CHECK(dot.ndim == 0 && close_to(at(&dot, 0), s, tol));
        CHECK_OK(rl_op_matmul(&vm, &v, &b));
        CHECK(vm.ndim == 1 && vm.shape[0] == n);
        for (int64_t j = 0; j < n; j++) {
            double t = 0;
            for (int64_t l = 0; l < k; l++)
                t += at(&v, l) * at(&b, l * n + j);
            CHECK(close_to(at(&vm, j), t, tol));
        }
        /* errors */
        rl_tensor bad_out = {0};
        CHECK(rl_op_matmul(&bad_out, &A2, &A2) == RL_ESHAPE);
        CHECK(has(rl_errmsg(), "matmul") && has(rl_errmsg(), "(5, 7) @ (5, 7)"));
        CHECK(rl_op_gemm(&bad_out, &A2, &A2, false, false, 1, 0) == RL_ESHAPE);
        CHECK(has(rl_errmsg(), "gemm"));
        CHECK(bad_out.storage == NULL);
        rl_tensor_release(&v);
        rl_tensor_release(&mv);
        rl_tensor_release(&dot);
        rl_tensor_release(&vm);
        rl_tensor_release(&A);
        rl_tensor_release(&B);
        rl_tensor_release(&A2);
        rl_tensor_release(&b);
    }
    /* int32 gemm and mixed dtypes are refused */
    rl_tensor ai = mk2(RL_INT32, 2, 2), af = mk2(RL_FLOAT32, 2, 2), o = {0};
    CHECK(rl_op_matmul(&o, &ai, &ai) == RL_EDTYPE);
    CHECK(has(rl_errmsg(), "matmul"));
    CHECK(rl_op_matmul(&o, &af, &ai) == RL_EDTYPE);
    rl_tensor_release(&ai);
    rl_tensor_release(&af);
}

static void test_cat_index_mask_copy(void) {
    /* cat along each dim of (2,3,4)-shaped parts */
    for (int dim = 0; dim < 3; dim++) {
        int64_t s1[3] = {2, 3, 4}, s2[3] = {2, 3, 4};
        s2[dim] = 1;
        rl_tensor p = mk(RL_FLOAT32, 3, s1, NULL, -1, 1), q = mk(RL_FLOAT32, 3, s2, NULL, -1, 1);
        const rl_tensor *parts[2] = {&p, &q};
        rl_tensor o = {0};
        CHECK_OK(rl_op_cat(&o, parts, 2, dim));
        CHECK(o.shape[dim] == s1[dim] + 1);
        int bad = 0;
        for (int64_t i = 0; i < rl_tensor_numel(&o); i++) {
            int64_t idx[3];
            unflat(&o, i, idx);
            double want;
            if (idx[dim] < s1[dim]) {
                want = rl_tensor_get(&p, idx);
            } else {
                idx[dim] -= s1[dim];
                want = rl_tensor_get(&q, idx);
            }
            bad += at(&o, i) != want;
        }
        CHECK(bad == 0);
        rl_tensor_release(&o);
        /* mismatch outside dim */
        int64_t s3[3] = {2, 3, 4};
        s3[(dim + 1) % 3] = 9;
        rl_tensor r = mk(RL_FLOAT32, 3, s3, NULL, -1, 1);
        const rl_tensor *badp[2] = {&p, &r};
        CHECK(rl_op_cat(&o, badp, 2, dim) == RL_ESHAPE);
        CHECK(has(rl_errmsg(), "cat"));
        rl_tensor_release(&r);
        rl_tensor_release(&p);
        rl_tensor_release(&q);
    }
    /* index_select along both dims of a (4,3) */
    int64_t s43[2] = {4, 3}, s5[1] = {5};
    rl_tensor a = mk(RL_FLOAT64, 2, s43, NULL, -1, 1);
    double iv[5] = {3, 0, 0, 2, 1};
    rl_tensor ix = mk(RL_INT32, 1, s5, iv, 0, 0), o = {0};
    CHECK_OK(rl_op_index_select(&o, &a, 0, &ix));
    CHECK(o.shape[0] == 5 && o.shape[1] == 3);
    int bad = 0;
    for (int j = 0; j < 5; j++)
        for (int c = 0; c < 3; c++)
            bad += at(&o, j * 3 + c) != at(&a, (int64_t)iv[j] * 3 + c);
    CHECK(bad == 0);
    rl_tensor_release(&o);
    CHECK(rl_op_index_select(&o, &a, 1, &ix) == RL_EINDEX);
    CHECK(has(rl_errmsg(), "index_select"));
    double iv2[5] = {2, 2, 1, 0, 1};
    rl_tensor ix2 = mk(RL_INT32, 1, s5, iv2, 0, 0);
    CHECK_OK(rl_op_index_select(&o, &a, 1, &ix2));
    bad = 0;
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 5; j++)
            bad += at(&o, r * 5 + j) != at(&a, r * 3 + (int64_t)iv2[j]);
    CHECK(bad == 0);
    rl_tensor_release(&o);
    rl_tensor_release(&ix);
    rl_tensor_release(&ix2);

    /* masked_fill with a broadcast int32 mask (4,1) and a float mask (3) */
    int64_t s41[2] = {4, 1}, s3[1] = {3};
    double mv[4] = {0, 1, 0, 1}, mf[3] = {0, 0, 2.5};
    rl_tensor m1 = mk(RL_INT32, 2, s41, mv, 0, 0), m2 = mk(RL_FLOAT32, 1, s3, mf, 0, 0);
    double before[12];
    for (int i = 0; i < 12; i++)
        before[i] = at(&a, i);
    CHECK_OK(rl_op_masked_fill(&a, &m1, -9));
    CHECK_OK(rl_op_masked_fill(&a, &m2, 4));
    bad = 0;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) {
            double w = c == 2 ? 4 : (mv[r] ? -9 : before[r * 3 + c]);
            bad += at(&a, r * 3 + c) != w;
        }
    CHECK(bad == 0);
    rl_tensor m5 = mk(RL_INT32, 1, s5, iv, 0, 0);
    CHECK(rl_op_masked_fill(&a, &m5, 0) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "masked_fill"));
    rl_tensor_release(&m5);
    rl_tensor_release(&m1);
    rl_tensor_release(&m2);

    /* copy between dtypes, including a transposed source and truncation toward zero */
    double cv[6] = {1.7, -1.7, 2.5, -0.4, NAN, 3e10};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    rl_tensor f = mk(RL_FLOAT64, 2, s23, cv, 0, 0), i32 = {0}, f32 = {0}, back = {0};
    CHECK_OK(rl_op_to(&i32, &f, RL_INT32, RL_DEVICE_CPU));
    double wi[6] = {1, -1, 2, 0, 0, 2147483647};
    CHECK(diff_count(&i32, wi, 6, 0) == 0);
    CHECK_OK(rl_op_to(&f32, &f, RL_FLOAT32, RL_DEVICE_CPU));
    CHECK(at(&f32, 0) == (double)1.7f && isnan(at(&f32, 4)));
    rl_tensor ft = {0};
    CHECK_OK(rl_tensor_transpose(&ft, &f32, 0, 1));
    CHECK_OK(rl_tensor_empty(&back, RL_FLOAT64, RL_DEVICE_CPU, 2, s32));
    CHECK_OK(rl_op_copy(&back, &ft));
    CHECK(at(&back, 1) == (double)-0.4f && at(&back, 4) == (double)2.5f);
    /* copy broadcasts the source */
    double row[2] = {5, 6};
    int64_t s2[1] = {2};
    rl_tensor rw = mk(RL_INT32, 1, s2, row, 0, 0);
    CHECK_OK(rl_op_copy(&back, &rw));
    CHECK(at(&back, 0) == 5 && at(&back, 5) == 6);
    CHECK(rl_op_copy(&rw, &back) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "copy"));
    rl_tensor_release(&rw);
    rl_tensor_release(&ft);
    rl_tensor_release(&back);
    rl_tensor_release(&f32);
    rl_tensor_release(&i32);
    rl_tensor_release(&f);
    rl_tensor_release(&a);
}

static void test_fill_arange_reshape(void) {
    int64_t s[2] = {3, 4}, s5[1] = {5};
    rl_tensor a = {0}, r = {0}, t = {0}, v = {0}, w = {0};
    CHECK_OK(rl_tensor_empty(&a, RL_INT32, RL_DEVICE_CPU, 2, s));
    CHECK_OK(rl_op_fill(&a, -3));
    CHECK(at(&a, 11) == -3);
    CHECK(rl_op_fill(&a, 1e12) == RL_EARG);
    CHECK_OK(rl_tensor_empty(&r, RL_FLOAT32, RL_DEVICE_CPU, 1, s5));
    CHECK_OK(rl_op_arange(&r, 2, 0.5));
    CHECK(at(&r, 0) == 2 && at(&r, 4) == 4);
    /* reshape of a contiguous tensor is a view; of a transpose, a copy */
    rl_tensor f = mk2(RL_FLOAT32, 3, 4);
    CHECK_OK(rl_op_reshape(&v, &f, 2, (int64_t[]){2, -1}));
    CHECK(v.storage == f.storage && v.shape[1] == 6);
    CHECK_OK(rl_tensor_transpose(&t, &f, 0, 1));
    CHECK_OK(rl_op_reshape(&w, &t, 1, (int64_t[]){12}));
    CHECK(w.storage != t.storage && w.shape[0] == 12);
    CHECK(at(&w, 1) == at(&f, 4) && at(&w, 5) == at(&f, 9));
    rl_tensor_release(&w);
    /* a transpose split along a dim that stays contiguous is still a view */
    rl_tensor x = {0}, xt = {0};
    int64_t s3[3] = {2, 3, 4};
    CHECK_OK(rl_tensor_empty(&x, RL_FLOAT32, RL_DEVICE_CPU, 3, s3));
    CHECK_OK(rl_tensor_transpose(&xt, &x, 0, 1)); /* (3,2,4) */
    CHECK_OK(rl_op_reshape(&w, &xt, 4, (int64_t[]){3, 2, 2, 2}));
    CHECK(w.storage == x.storage);
    rl_tensor_release(&w);
    CHECK(rl_op_reshape(&w, &xt, 2, (int64_t[]){5, 5}) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "reshape"));
    rl_tensor_release(&x);
    rl_tensor_release(&xt);
    rl_tensor_release(&a);
    rl_tensor_release(&r);
    rl_tensor_release(&t);
    rl_tensor_release(&v);
    rl_tensor_release(&f);
}

int main(void) {
    rl_ops_init();
    test_broadcast();
    test_unary();
    test_binary();
    test_reduce();
    test_gemm();
    test_cat_index_mask_copy();
    test_fill_arange_reshape();
    TEST_MAIN_END();
}
