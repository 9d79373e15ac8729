/* CUDA-vs-CPU parity of every op in kernels/ops.h: each op runs on fresh random inputs on the
 * CPU and on cuda:0, and the results are compared element by element (float32 to a relative
 * 1e-5, float64 to 1e-12, int32, comparisons, copies and indices exactly; random streams must
 * match the CPU's). Also checks that an impossible device allocation is a clean RL_ENOMEM and
 * that freed blocks are reused. Without a CUDA device (or build) the "device" side is the CPU
 * itself: every op case and every comparison runs and must pass, so a broken test shows there
 * too (only the device checks of test_device need a GPU); the line printed says which side ran.
 * Run by `make test-gpu`, not by tests/run.sh. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/ops.h"
#include "tests/c/check.h"
#include "tests/gpu/device_side.h"

static const rl_device CUDA0 = {RL_CUDA, 0};
/* the side compared with the CPU: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

/* ---- inputs ---- */

/* A new CPU tensor with values uniform in [lo, hi); int32 gets integers in [lo, hi]; with
 * q > 0 float values are rounded to multiples of q (so that ties occur). */
static rl_tensor rand_cpu(rl_dtype dt, int ndim, const int64_t *shape, double lo, double hi,
                          double q) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, dt, RL_DEVICE_CPU, ndim, shape));
    if (!t.storage || rl_tensor_numel(&t) == 0) return t;
    int64_t idx[RL_MAX_DIMS] = {0};
    do {
        double v = lo + (hi - lo) * urand(0, 1);
        if (dt == RL_INT32)
            v = floor(lo + (hi - lo + 1) * urand(0, 1));
        else if (q > 0)
            v = round(v / q) * q;
        rl_tensor_set(&t, idx, v);
    } while (next_index(ndim, shape, idx));
    return t;
}

static void release_all(rl_tensor *ts, int n) {
    for (int i = 0; i < n; i++)
        rl_tensor_release(&ts[i]);
}

static double rtol_of(rl_dtype dt) { return dt == RL_FLOAT64 ? 1e-12 : 1e-5; }

/* ---- elementwise ---- */

static void test_unary(rl_dtype dt) {
    int64_t shape[3] = {3, 4, 5};
    for (int op = 0; op < RL_NUM_UNARY; op++) {
        if (dt == RL_INT32 && rl_unary_needs_float((rl_unary_op)op)) continue;
        bool positive = op == RL_UN_LOG || op == RL_UN_SQRT || op == RL_UN_RSQRT ||
                        op == RL_UN_RECIPROCAL || op == RL_UN_LOG1P;
        double lo = dt == RL_INT32 ? -40 : (positive ? 0.1 : -4.0);
        double hi = dt == RL_INT32 ? 40 : 4.0;
        double p0 = op == RL_UN_CLAMP ? -1.0 : 0.7, p1 = op == RL_UN_CLAMP ? 1.5 : 0.0;
        if (op == RL_UN_CLAMP && dt == RL_INT32) p0 = -10, p1 = 20;
        rl_tensor t[7] = {{0}};
        t[0] = rand_cpu(dt, 3, shape, lo, hi, 0);
        t[1] = copy_to(&t[0], DEV);
        CHECK_OK(rl_op_unary(&t[2], &t[0], (rl_unary_op)op, p0, p1));
        CHECK_OK(rl_op_unary(&t[3], &t[1], (rl_unary_op)op, p0, p1));
        char what[96];
        snprintf(what, sizeof what, "unary %s %s", rl_unary_name((rl_unary_op)op),
                 rl_dtype_name(dt));
        compare_elems(what, &t[2], &t[3], dt == RL_INT32 ? 0 : rtol_of(dt),
                      dt == RL_INT32 ? 0 : 1e-6);
        /* a transposed (strided) input */
        CHECK_OK(rl_tensor_transpose(&t[4], &t[1], 0, 2));
        rl_tensor tc = {0};
        CHECK_OK(rl_tensor_transpose(&tc, &t[0], 0, 2));
        CHECK_OK(rl_op_unary(&t[5], &tc, (rl_unary_op)op, p0, p1));
        CHECK_OK(rl_op_unary(&t[6], &t[4], (rl_unary_op)op, p0, p1));
        snprintf(what, sizeof what, "unary %s %s transposed", rl_unary_name((rl_unary_op)op),
                 rl_dtype_name(dt));
        compare_elems(what, &t[5], &t[6], dt == RL_INT32 ? 0 : rtol_of(dt),
                      dt == RL_INT32 ? 0 : 1e-6);
        rl_tensor_release(&tc);
        release_all(t, 7);
    }
}

/* in place: out is the very view of the input */
static void test_unary_inplace(void) {
    int64_t shape[2] = {6, 7};
    rl_tensor c = rand_cpu(RL_FLOAT32, 2, shape, -2, 2, 0), g = copy_to(&c, DEV);
    CHECK_OK(rl_op_unary(&c, &c, RL_UN_TANH, 0, 0));
    CHECK_OK(rl_op_unary(&g, &g, RL_UN_TANH, 0, 0));
    compare_elems("unary tanh in place", &c, &g, 1e-5, 1e-6);
    rl_tensor_release(&c);
    rl_tensor_release(&g);
}

static bool is_comparison(int op) { return op >= RL_BIN_EQ; }

static void test_binary(rl_dtype dt) {
    int64_t sa[3] = {3, 1, 5}, sb[2] = {4, 5};
    for (int op = 0; op < RL_NUM_BINARY; op++) {
        double alo = -3, ahi = 3, blo = -3, bhi = 3, q = 0;
        if (op == RL_BIN_POW) alo = 0.5, ahi = 2, blo = -2, bhi = 2;
        if (op == RL_BIN_DIV) blo = 0.5, bhi = 3;
        if (is_comparison(op) || op == RL_BIN_MAX || op == RL_BIN_MIN) q = 0.5;
        if (dt == RL_INT32) {
            alo = -20, ahi = 20, blo = -20, bhi = 20;
            if (op == RL_BIN_DIV) blo = 1, bhi = 7;
            if (op == RL_BIN_POW) alo = -3, ahi = 3, blo = -1, bhi = 6;
        }
        rl_tensor t[6] = {{0}};
        t[0] = rand_cpu(dt, 3, sa, alo, ahi, q);
        t[1] = rand_cpu(dt, 2, sb, blo, bhi, q);
        t[2] = copy_to(&t[0], DEV);
        t[3] = copy_to(&t[1], DEV);
        CHECK_OK(rl_op_binary(&t[4], &t[0], &t[1], (rl_binary_op)op));
        CHECK_OK(rl_op_binary(&t[5], &t[2], &t[3], (rl_binary_op)op));
        char what[96];
        snprintf(what, sizeof what, "binary %s %s (3,1,5) with (4,5)",
                 rl_binary_name((rl_binary_op)op), rl_dtype_name(dt));
        bool exact = dt == RL_INT32 || is_comparison(op) || op == RL_BIN_MAX || op == RL_BIN_MIN;
        compare_elems(what, &t[4], &t[5], exact ? 0 : rtol_of(dt), exact ? 0 : 1e-6);
        release_all(t, 6);
    }
}

static void test_binary_scalar(rl_dtype dt) {
    int64_t shape[2] = {5, 6};
    for (int op = 0; op < RL_NUM_BINARY; op++) {
        for (int first = 0; first < 2; first++) {
            double lo = -3, hi = 3, s = 1.5;
            if (op == RL_BIN_POW || op == RL_BIN_DIV) lo = 0.5;
            if (dt == RL_INT32) {
                lo = -10, hi = 10, s = 3;
                if (op == RL_BIN_DIV && first) lo = 1;
                if (op == RL_BIN_POW) lo = -3, hi = first ? 5 : 3;
            }
            rl_tensor t[4] = {{0}};
            t[0] = rand_cpu(dt, 2, shape, lo, hi, 0.5);
            t[1] = copy_to(&t[0], DEV);
            CHECK_OK(rl_op_binary_scalar(&t[2], &t[0], s, (rl_binary_op)op, first));
            CHECK_OK(rl_op_binary_scalar(&t[3], &t[1], s, (rl_binary_op)op, first));
            char what[96];
            snprintf(what, sizeof what, "binary_scalar %s %s%s", rl_binary_name((rl_binary_op)op),
                     rl_dtype_name(dt), first ? " scalar first" : "");
            bool exact = dt == RL_INT32 || is_comparison(op);
            compare_elems(what, &t[2], &t[3], exact ? 0 : rtol_of(dt), exact ? 0 : 1e-6);
            release_all(t, 4);
        }
    }
}

static void test_masked_fill(void) {
    int64_t sa[2] = {3, 4}, sm1[2] = {3, 1}, sm2[1] = {4};
    rl_dtype dts[2] = {RL_FLOAT32, RL_INT32};
    for (int i = 0; i < 2; i++) {
        rl_tensor t[6] = {{0}};
        t[0] = rand_cpu(dts[i], 2, sa, -5, 5, 0);
        t[1] = copy_to(&t[0], DEV);
        t[2] = rand_cpu(RL_INT32, 2, sm1, 0, 1, 0);
        t[3] = copy_to(&t[2], DEV);
        t[4] = rand_cpu(RL_FLOAT32, 1, sm2, 0, 1, 1);
        t[5] = copy_to(&t[4], DEV);
        CHECK_OK(rl_op_masked_fill(&t[0], &t[2], -7));
        CHECK_OK(rl_op_masked_fill(&t[1], &t[3], -7));
        CHECK_OK(rl_op_masked_fill(&t[0], &t[4], 9));
        CHECK_OK(rl_op_masked_fill(&t[1], &t[5], 9));
        compare_elems(i ? "masked_fill int32 (int32 and float32 masks)"
                        : "masked_fill float32 (int32 and float32 masks)",
                      &t[0], &t[1], 0, 0);
        release_all(t, 6);
    }
}

/* ---- reductions ---- */

/* Every reduction of `c` (CPU) and its CUDA copy over all elements and over each dim. */
static void reduce_both(const char *label, const rl_tensor *c, const rl_tensor *g,
                        rl_reduce_op op) {
    char what[128];
    double rtol = c->dtype == RL_INT32 ? 0 : rtol_of(c->dtype);
    double rc = 0, rg = 0;
    int64_t ic = -1, ig = -2;
    bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
    CHECK_OK(rl_op_reduce_all(&rc, &ic, c, op));
    CHECK_OK(rl_op_reduce_all(&rg, &ig, g, op));
    snprintf(what, sizeof what, "reduce_all %s %s %s", rl_reduce_name(op), label,
             rl_dtype_name(c->dtype));
    compare_scalar(what, rc, rg, rtol);
    if (ext) {
        snprintf(what, sizeof what, "reduce_all %s %s index", rl_reduce_name(op), label);
        compare_scalar(what, (double)ic, (double)ig, 0);
    }
    for (int dim = 0; dim < c->ndim; dim++) {
        for (int keep = 0; keep < 2; keep++) {
            rl_tensor t[4] = {{0}};
            CHECK_OK(rl_op_reduce_dim(&t[0], ext ? &t[1] : NULL, c, dim, keep, op));
            CHECK_OK(rl_op_reduce_dim(&t[2], ext ? &t[3] : NULL, g, dim, keep, op));
            snprintf(what, sizeof what, "reduce %s %s %s dim %d%s", rl_reduce_name(op), label,
                     rl_dtype_name(c->dtype), dim, keep ? " keepdim" : "");
            compare_elems(what, &t[0], &t[2], rtol, rtol > 0 ? 1e-6 : 0);
            if (ext) {
                snprintf(what, sizeof what, "reduce %s %s dim %d%s indices", rl_reduce_name(op),
                         label, dim, keep ? " keepdim" : "");
                compare_elems(what, &t[1], &t[3], 0, 0);
            }
            release_all(t, 4);
        }
    }
}

static void test_reduce(void) {
    int64_t s3[3] = {4, 5, 6};
    for (int op = 0; op < RL_NUM_REDUCE; op++) {
        bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
        /* ties (multiples of 0.5) check first-occurrence indices; prod stays near 1 */
        double lo = op == RL_RED_PROD ? 0.6 : -2, hi = op == RL_RED_PROD ? 1.4 : 2;
        rl_tensor c = rand_cpu(RL_FLOAT32, 3, s3, lo, hi, ext ? 0.5 : 0), g = copy_to(&c, DEV);
        reduce_both("(4,5,6)", &c, &g, (rl_reduce_op)op);
        rl_tensor ct = {0}, gt = {0};
        int perm[3] = {2, 0, 1};
        CHECK_OK(rl_tensor_permute(&ct, &c, perm));
        CHECK_OK(rl_tensor_permute(&gt, &g, perm));
        reduce_both("permuted (6,4,5)", &ct, &gt, (rl_reduce_op)op);
        rl_tensor c64 = rand_cpu(RL_FLOAT64, 3, s3, lo, hi, ext ? 0.5 : 0),
                  g64 = copy_to(&c64, DEV);
        reduce_both("(4,5,6)", &c64, &g64, (rl_reduce_op)op);
        rl_tensor *ts[] = {&c, &g, &ct, &gt, &c64, &g64};
        for (int i = 0; i < 6; i++)
            rl_tensor_release(ts[i]);
        if (op == RL_RED_MEAN || op == RL_RED_NORM) continue;
        rl_tensor ci = rand_cpu(RL_INT32, 3, s3, -3, 3, 0), gi = copy_to(&ci, DEV);
        reduce_both("(4,5,6)", &ci, &gi, (rl_reduce_op)op);
        rl_tensor_release(&ci);
        rl_tensor_release(&gi);
    }
    /* long runs (a block per output), many short outputs (a thread per output), and a long
     * run at a stride; non-negative values keep the sums free of cancellation */
    int64_t shapes[3][2] = {{3, 5000}, {9000, 40}, {3000, 3}};
    for (int s = 0; s < 3; s++) {
        for (int op = 0; op < RL_NUM_REDUCE; op++) {
            if (op == RL_RED_PROD) continue;
            bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
            rl_tensor c = rand_cpu(RL_FLOAT32, 2, shapes[s], 0, 1, ext ? 1.0 / 64 : 0);
            rl_tensor g = copy_to(&c, DEV);
            char label[48];
            snprintf(label, sizeof label, "(%" PRId64 ",%" PRId64 ")", shapes[s][0], shapes[s][1]);
            reduce_both(label, &c, &g, (rl_reduce_op)op);
            rl_tensor_release(&c);
            rl_tensor_release(&g);
        }
    }
    /* a full reduction of more than 65536 elements runs in two stages (fixed chunks, then one
     * block over the parts): same value as the CPU, and bit-identical when run again */
    int64_t big[2] = {300, 701};
    rl_dtype bdt[3] = {RL_FLOAT32, RL_FLOAT64, RL_INT32};
    for (int i = 0; i < 3; i++) {
        for (int op = 0; op < RL_NUM_REDUCE; op++) {
            bool ext = op == RL_RED_MAX || op == RL_RED_MIN;
            if (op == RL_RED_PROD || ext) continue;
            if (bdt[i] == RL_INT32 && op != RL_RED_SUM) continue;
            rl_tensor c = rand_cpu(bdt[i], 2, big, bdt[i] == RL_INT32 ? -3 : 0, 1, 0);
            rl_tensor g = copy_to(&c, DEV);
            double r1 = 0, r2 = -1, rc = 0;
            CHECK_OK(rl_op_reduce_all(&rc, NULL, &c, (rl_reduce_op)op));
            CHECK_OK(rl_op_reduce_all(&r1, NULL, &g, (rl_reduce_op)op));
            CHECK_OK(rl_op_reduce_all(&r2, NULL, &g, (rl_reduce_op)op));
            char what[96];
            snprintf(what, sizeof what, "reduce_all %s (300,701) two-stage %s",
                     rl_reduce_name((rl_reduce_op)op), rl_dtype_name(bdt[i]));
            compare_scalar(what, rc, r1, bdt[i] == RL_INT32 ? 0 : rtol_of(bdt[i]));
            CHECK(memcmp(&r1, &r2, sizeof r1) == 0);
            rl_tensor_release(&c);
            rl_tensor_release(&g);
        }
    }
    /* NaN propagates through max/min */
    int64_t s1[1] = {300};
    rl_tensor c = rand_cpu(RL_FLOAT32, 1, s1, -1, 1, 0);
    int64_t at = 123;
    rl_tensor_set(&c, &at, NAN);
    rl_tensor g = copy_to(&c, DEV);
    for (int op = RL_RED_MAX; op <= RL_RED_MIN; op++) {
        double rc = 0, rg = 0;
        int64_t ic = -1, ig = -2;
        CHECK_OK(rl_op_reduce_all(&rc, &ic, &c, (rl_reduce_op)op));
        CHECK_OK(rl_op_reduce_all(&rg, &ig, &g, (rl_reduce_op)op));
        CHECK(isnan(rc) && isnan(rg));
        CHECK(ig == 123 && ic == 123);
    }
    rl_tensor_release(&c);
    rl_tensor_release(&g);
}

/* ---- matrix products ---- */

static void test_gemm(rl_dtype dt) {
    int64_t m = 7, n = 5, k = 9;
    double rtol = dt == RL_FLOAT64 ? 1e-12 : 1e-5, atol = dt == RL_FLOAT64 ? 1e-12 : 1e-5;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
            int64_t sc[2] = {m, n};
            rl_tensor t[10] = {{0}};
            t[0] = rand_cpu(dt, 2, sa, -1, 1, 0);
            t[1] = rand_cpu(dt, 2, sb, -1, 1, 0);
            t[2] = copy_to(&t[0], DEV);
            t[3] = copy_to(&t[1], DEV);
            CHECK_OK(rl_op_gemm(&t[4], &t[0], &t[1], ta, tb, 1.5, 0.0));
            CHECK_OK(rl_op_gemm(&t[5], &t[2], &t[3], ta, tb, 1.5, 0.0));
            char what[96];
            snprintf(what, sizeof what, "gemm %s %s%s", rl_dtype_name(dt), ta ? "A^T" : "A",
                     tb ? " B^T" : " B");
            compare_elems(what, &t[4], &t[5], rtol, atol);
            /* into a set c with beta */
            t[6] = rand_cpu(dt, 2, sc, -1, 1, 0);
            t[7] = copy_to(&t[6], DEV);
            CHECK_OK(rl_op_gemm(&t[6], &t[0], &t[1], ta, tb, -0.5, 0.75));
            CHECK_OK(rl_op_gemm(&t[7], &t[2], &t[3], ta, tb, -0.5, 0.75));
            snprintf(what, sizeof what, "gemm %s %s%s beta 0.75", rl_dtype_name(dt),
                     ta ? "A^T" : "A", tb ? " B^T" : " B");
            compare_elems(what, &t[6], &t[7], rtol, atol);
            /* transposed views instead of the flags */
            CHECK_OK(rl_tensor_transpose(&t[8], &t[3], 0, 1));
            rl_tensor bt = {0}, cc = {0}, gc = {0};
            CHECK_OK(rl_tensor_transpose(&bt, &t[1], 0, 1));
            CHECK_OK(rl_op_gemm(&cc, &t[0], &bt, ta, !tb, 1.0, 0.0));
            CHECK_OK(rl_op_gemm(&gc, &t[2], &t[8], ta, !tb, 1.0, 0.0));
            snprintf(what, sizeof what, "gemm %s %s with a transposed view of B", rl_dtype_name(dt),
                     ta ? "A^T" : "A");
            compare_elems(what, &cc, &gc, rtol, atol);
            rl_tensor_release(&bt);
            rl_tensor_release(&cc);
            rl_tensor_release(&gc);
            release_all(t, 10);
        }
    }
}

static void matmul_case(const char *what, int na, const int64_t *sa, int nb, const int64_t *sb,
                        double rtol, double atol) {
    rl_tensor t[6] = {{0}};
    t[0] = rand_cpu(RL_FLOAT32, na, sa, -1, 1, 0);
    t[1] = rand_cpu(RL_FLOAT32, nb, sb, -1, 1, 0);
    t[2] = copy_to(&t[0], DEV);
    t[3] = copy_to(&t[1], DEV);
    CHECK_OK(rl_op_matmul(&t[4], &t[0], &t[1]));
    CHECK_OK(rl_op_matmul(&t[5], &t[2], &t[3]));
    compare_elems(what, &t[4], &t[5], rtol, atol);
    release_all(t, 6);
}

static void test_matmul(void) {
    int64_t bmk[3] = {3, 7, 9}, bkn[3] = {3, 9, 5}, mk[2] = {7, 9}, kn[2] = {9, 5}, kv[1] = {9};
    int64_t one_k[2] = {1, 9}, big_a[2] = {64, 128}, big_b[2] = {128, 96};
    matmul_case("matmul (3,7,9)@(3,9,5)", 3, bmk, 3, bkn, 1e-5, 1e-5);
    matmul_case("matmul (7,9)@(3,9,5)", 2, mk, 3, bkn, 1e-5, 1e-5);
    matmul_case("matmul (3,7,9)@(9,5)", 3, bmk, 2, kn, 1e-5, 1e-5);
    matmul_case("matmul (7,9)@(9)", 2, mk, 1, kv, 1e-5, 1e-5);
    matmul_case("matmul (9)@(9)", 1, kv, 1, kv, 1e-5, 1e-5);
    matmul_case("matmul (1,9)@(9,5)", 2, one_k, 2, kn, 1e-5, 1e-5);
    matmul_case("matmul (64,128)@(128,96)", 2, big_a, 2, big_b, 1e-4, 1e-4);
}

/* ---- joining, gathering, copying ---- */

static void test_cat(void) {
    for (int dim = 0; dim < 3; dim++) {
        int64_t s[3][3] = {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}};
        s[1][dim] = 1;
        s[2][dim] = 5;
        rl_tensor c[3], g[3], oc = {0}, og = {0};
        for (int i = 0; i < 3; i++) {
            c[i] = rand_cpu(RL_FLOAT32, 3, s[i], -1, 1, 0);
            g[i] = copy_to(&c[i], DEV);
        }
        const rl_tensor *pc[3] = {&c[0], &c[1], &c[2]}, *pg[3] = {&g[0], &g[1], &g[2]};
        CHECK_OK(rl_op_cat(&oc, pc, 3, dim));
        CHECK_OK(rl_op_cat(&og, pg, 3, dim));
        char what[48];
        snprintf(what, sizeof what, "cat dim %d", dim);
        compare_elems(what, &oc, &og, 0, 0);
        release_all(c, 3);
        release_all(g, 3);
        rl_tensor_release(&oc);
        rl_tensor_release(&og);
    }
    /* a transposed view among the inputs */
    int64_t s[2] = {4, 3};
    rl_tensor c0 = rand_cpu(RL_INT32, 2, s, -9, 9, 0), g0 = copy_to(&c0, DEV);
    rl_tensor ct = {0}, gt = {0}, oc = {0}, og = {0};
    CHECK_OK(rl_tensor_transpose(&ct, &c0, 0, 1));
    CHECK_OK(rl_tensor_transpose(&gt, &g0, 0, 1));
    const rl_tensor *pc[2] = {&ct, &ct}, *pg[2] = {&gt, &gt};
    CHECK_OK(rl_op_cat(&oc, pc, 2, 1));
    CHECK_OK(rl_op_cat(&og, pg, 2, 1));
    compare_elems("cat int32 of transposed views", &oc, &og, 0, 0);
    rl_tensor *ts[] = {&c0, &g0, &ct, &gt, &oc, &og};
    for (int i = 0; i < 6; i++)
        rl_tensor_release(ts[i]);
}

static void test_index_select(void) {
    int64_t shape[3] = {4, 5, 6};
    rl_dtype dts[2] = {RL_FLOAT32, RL_INT32};
    for (int i = 0; i < 2; i++) {
        rl_tensor c = rand_cpu(dts[i], 3, shape, -9, 9, 0), g = copy_to(&c, DEV);
        for (int dim = 0; dim < 3; dim++) {
            int64_t ni = 5;
            rl_tensor ic = rand_cpu(RL_INT32, 1, &ni, 0, (double)shape[dim] - 1, 0);
            rl_tensor ig = copy_to(&ic, DEV), oc = {0}, og = {0};
            CHECK_OK(rl_op_index_select(&oc, &c, dim, &ic));
            CHECK_OK(rl_op_index_select(&og, &g, dim, &ig));
            char what[64];
            snprintf(what, sizeof what, "index_select %s dim %d", rl_dtype_name(dts[i]), dim);
            compare_elems(what, &oc, &og, 0, 0);
            rl_tensor *ts[] = {&ic, &ig, &oc, &og};
            for (int j = 0; j < 4; j++)
                rl_tensor_release(ts[j]);
        }
        rl_tensor_release(&c);
        rl_tensor_release(&g);
    }
}

static void test_copy(void) {
    int64_t shape[2] = {5, 7};
    rl_dtype dts[3] = {RL_FLOAT32, RL_FLOAT64, RL_INT32};
    for (int s = 0; s < 3; s++) {
        rl_tensor c = rand_cpu(dts[s], 2, shape, -100, 100, 0), g = copy_to(&c, DEV);
        for (int d = 0; d < 3; d++) {
            rl_tensor oc = {0}, og = {0}, ox = {0}, tg = {0}, otc = {0}, otg = {0};
            CHECK_OK(rl_op_to(&oc, &c, dts[d], RL_DEVICE_CPU));
            CHECK_OK(rl_op_to(&og, &g, dts[d], DEV)); /* converted on the device */
            CHECK_OK(rl_op_to(&ox, &c, dts[d], DEV)); /* converted while moving */
            char what[80];
            snprintf(what, sizeof what, "copy %s to %s on cuda", rl_dtype_name(dts[s]),
                     rl_dtype_name(dts[d]));
            compare_elems(what, &oc, &og, 0, 0);
            snprintf(what, sizeof what, "copy %s on cpu to %s on cuda", rl_dtype_name(dts[s]),
                     rl_dtype_name(dts[d]));
            compare_elems(what, &oc, &ox, 0, 0);
            /* a transposed cuda view back to the host */
            CHECK_OK(rl_tensor_transpose(&tg, &g, 0, 1));
            CHECK_OK(rl_tensor_transpose(&otg, &c, 0, 1));
            CHECK_OK(rl_op_to(&otc, &tg, dts[d], RL_DEVICE_CPU));
            rl_tensor want = {0};
            CHECK_OK(rl_op_to(&want, &otg, dts[d], RL_DEVICE_CPU));
            snprintf(what, sizeof what, "copy transposed %s on cuda to %s on cpu",
                     rl_dtype_name(dts[s]), rl_dtype_name(dts[d]));
            compare_elems(what, &want, &otc, 0, 0); /* both on the host: compare still applies */
            rl_tensor *ts[] = {&oc, &og, &ox, &tg, &otc, &otg, &want};
            for (int j = 0; j < 7; j++)
                rl_tensor_release(ts[j]);
        }
        rl_tensor_release(&c);
        rl_tensor_release(&g);
    }
    /* broadcasting copy from the host into a cuda tensor, and into a cuda view */
    int64_t row[1] = {7};
    rl_tensor src = rand_cpu(RL_FLOAT32, 1, row, -1, 1, 0), dc = {0}, dg = {0};
    CHECK_OK(rl_tensor_empty(&dc, RL_FLOAT32, RL_DEVICE_CPU, 2, shape));
    CHECK_OK(rl_tensor_empty(&dg, RL_FLOAT32, DEV, 2, shape));
    CHECK_OK(rl_op_fill(&dc, 0));
    CHECK_OK(rl_op_fill(&dg, 0));
    CHECK_OK(rl_op_copy(&dc, &src));
    CHECK_OK(rl_op_copy(&dg, &src));
    compare_elems("copy cpu (7) broadcast into cuda (5,7)", &dc, &dg, 0, 0);
    rl_tensor vc = {0}, vg = {0};
    int64_t col[1] = {5};
    rl_tensor src2 = rand_cpu(RL_FLOAT32, 1, col, -1, 1, 0);
    CHECK_OK(rl_tensor_select(&vc, &dc, 1, 3));
    CHECK_OK(rl_tensor_select(&vg, &dg, 1, 3));
    CHECK_OK(rl_op_copy(&vc, &src2));
    CHECK_OK(rl_op_copy(&vg, &src2));
    compare_elems("copy cpu (5) into a strided column of cuda (5,7)", &dc, &dg, 0, 0);
    rl_tensor *ts[] = {&src, &dc, &dg, &vc, &vg, &src2};
    for (int j = 0; j < 6; j++)
        rl_tensor_release(ts[j]);
}

static void test_contiguous(void) {
    int64_t shape[3] = {2, 3, 4};
    rl_tensor c = rand_cpu(RL_FLOAT32, 3, shape, -1, 1, 0), g = copy_to(&c, DEV);
    rl_tensor pc = {0}, pg = {0}, oc = {0}, og = {0};
    int perm[3] = {2, 0, 1};
    CHECK_OK(rl_tensor_permute(&pc, &c, perm));
    CHECK_OK(rl_tensor_permute(&pg, &g, perm));
    CHECK_OK(rl_op_contiguous(&oc, &pc));
    CHECK_OK(rl_op_contiguous(&og, &pg));
    CHECK(og.storage && rl_tensor_is_contiguous(&og));
    compare_elems("contiguous of a permuted view", &oc, &og, 0, 0);
    rl_tensor *ts[] = {&c, &g, &pc, &pg, &oc, &og};
    for (int j = 0; j < 6; j++)
        rl_tensor_release(ts[j]);
}

static void test_fill_arange(void) {
    int64_t shape[2] = {6, 5};
    rl_dtype dts[3] = {RL_FLOAT32, RL_FLOAT64, RL_INT32};
    for (int i = 0; i < 3; i++) {
        rl_tensor c = rand_cpu(dts[i], 2, shape, -5, 5, 0), g = copy_to(&c, DEV);
        rl_tensor vc = {0}, vg = {0}, tc = {0}, tg = {0};
        CHECK_OK(rl_tensor_narrow(&vc, &c, 1, 1, 3));
        CHECK_OK(rl_tensor_narrow(&vg, &g, 1, 1, 3));
        CHECK_OK(rl_tensor_transpose(&tc, &vc, 0, 1));
        CHECK_OK(rl_tensor_transpose(&tg, &vg, 0, 1));
        CHECK_OK(rl_op_fill(&tc, -2.25));
        CHECK_OK(rl_op_fill(&tg, -2.25));
        char what[64];
        snprintf(what, sizeof what, "fill of a strided view %s", rl_dtype_name(dts[i]));
        compare_elems(what, &c, &g, 0, 0);
        rl_tensor *ts[] = {&c, &g, &vc, &vg, &tc, &tg};
        for (int j = 0; j < 6; j++)
            rl_tensor_release(ts[j]);

        int64_t n = 1000;
        rl_tensor ac = {0}, ag = {0};
        CHECK_OK(rl_tensor_empty(&ac, dts[i], RL_DEVICE_CPU, 1, &n));
        CHECK_OK(rl_tensor_empty(&ag, dts[i], DEV, 1, &n));
        double start = dts[i] == RL_INT32 ? -300 : 0.5, step = dts[i] == RL_INT32 ? 3 : 0.125;
        CHECK_OK(rl_op_arange(&ac, start, step));
        CHECK_OK(rl_op_arange(&ag, start, step));
        snprintf(what, sizeof what, "arange %s", rl_dtype_name(dts[i]));
        compare_elems(what, &ac, &ag, 0, 0);
        rl_tensor_release(&ac);
        rl_tensor_release(&ag);
    }
}

/* ---- random numbers: the CUDA draw must be the CPU's draw ---- */

static void test_random(void) {
    rl_dtype dts[2] = {RL_FLOAT32, RL_FLOAT64};
    int64_t shape[2] = {7, 143}; /* 1001 elements: the last Philox block is partial */
    for (int i = 0; i < 2; i++) {
        for (int normal = 0; normal < 2; normal++) {
            for (int view = 0; view < 2; view++) {
                rl_rng gc, gg;
                rl_rng_seed(&gc, 1234 + (uint64_t)i);
                rl_rng_seed(&gg, 1234 + (uint64_t)i);
                rl_rng_reserve(&gc, 17); /* start mid-stream */
                rl_rng_reserve(&gg, 17);
                rl_tensor c = {0}, g = {0}, vc = {0}, vg = {0};
                CHECK_OK(rl_tensor_empty(&c, dts[i], RL_DEVICE_CPU, 2, shape));
                CHECK_OK(rl_tensor_empty(&g, dts[i], DEV, 2, shape));
                if (view) {
                    CHECK_OK(rl_tensor_transpose(&vc, &c, 0, 1));
                    CHECK_OK(rl_tensor_transpose(&vg, &g, 0, 1));
                } else {
                    rl_tensor_share(&vc, &c);
                    rl_tensor_share(&vg, &g);
                }
                if (normal) {
                    CHECK_OK(rl_op_normal(&vc, &gc, 0.5, 2.0));
                    CHECK_OK(rl_op_normal(&vg, &gg, 0.5, 2.0));
                } else {
                    CHECK_OK(rl_op_uniform(&vc, &gc, -2.0, 3.0));
                    CHECK_OK(rl_op_uniform(&vg, &gg, -2.0, 3.0));
                }
                char what[80];
                snprintf(what, sizeof what, "%s %s%s", normal ? "normal" : "uniform",
                         rl_dtype_name(dts[i]), view ? " into a transposed view" : "");
                compare_elems(what, &c, &g, dts[i] == RL_FLOAT64 ? 1e-12 : 1e-6, 1e-12);
                CHECK(gc.seed == gg.seed && gc.offset == gg.offset);
                rl_tensor *ts[] = {&c, &g, &vc, &vg};
                for (int j = 0; j < 4; j++)
                    rl_tensor_release(ts[j]);
            }
        }
    }
}

/* ---- the device itself ---- */

static void test_device(void) {
    rl_storage *s = NULL;
    rl_error_clear();
    rl_status st = rl_storage_new(&s, (size_t)1 << 50, CUDA0);
    CHECK(st == RL_ENOMEM);
    CHECK(s == NULL);
    CHECK(strstr(rl_errmsg(), "bytes") != NULL && strstr(rl_errmsg(), "cuda:0") != NULL);
    if (st != RL_ENOMEM) fprintf(stderr, "1<<50 byte allocation gave: %s\n", rl_errmsg());
    /* the device still works, and a freed block of a size is handed out again */
    int64_t n = 250000;
    rl_tensor a = {0}, b = {0};
    CHECK_OK(rl_tensor_empty(&a, RL_FLOAT32, CUDA0, 1, &n));
    void *p = a.storage ? a.storage->data : NULL;
    rl_tensor_release(&a);
    CHECK_OK(rl_tensor_empty(&b, RL_FLOAT32, CUDA0, 1, &n));
    CHECK(b.storage && b.storage->data == p);
    rl_tensor_release(&b);
    CHECK_OK(rl_op_synchronize(CUDA0));
    const rl_device_backend *be = rl_device_cuda_backend();
    if (be->count() >= 2) {
        int64_t shape[2] = {30, 40};
        rl_device cuda1 = {RL_CUDA, 1};
        rl_tensor c = rand_cpu(RL_FLOAT32, 2, shape, -1, 1, 0), g0 = copy_to(&c, DEV), g1 = {0};
        CHECK_OK(rl_op_to(&g1, &g0, RL_FLOAT32, cuda1));
        compare_elems("copy cuda:0 to cuda:1", &c, &g1, 0, 0);
        rl_tensor *ts[] = {&c, &g0, &g1};
        for (int j = 0; j < 3; j++)
            rl_tensor_release(ts[j]);
    }
}

int main(void) {
    rl_ops_init();
    DEV = device_side("the device checks");
    rl_dtype dts[3] = {RL_FLOAT32, RL_FLOAT64, RL_INT32};
    for (int i = 0; i < 3; i++) {
        test_unary(dts[i]);
        test_binary(dts[i]);
        test_binary_scalar(dts[i]);
    }
    test_unary_inplace();
    test_masked_fill();
    test_reduce();
    test_gemm(RL_FLOAT32);
    test_gemm(RL_FLOAT64);
    test_matmul();
    test_cat();
    test_index_select();
    test_copy();
    test_contiguous();
    test_fill_arange();
    test_random();
    if (DEV.type == RL_CUDA) test_device();
    TEST_MAIN_END();
}
