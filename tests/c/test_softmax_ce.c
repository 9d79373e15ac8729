/* The fused softmax / cross-entropy row passes (kernels/softmax_ce.h) against a float64
 * reference written here, at every CPU level this machine has: odd row lengths around the
 * 16-lane blocks, in place and not, ties (the first maximum is the argmax), NaN rows (NaN loss,
 * the first NaN the argmax, also beside +inf), +inf at the target, -inf logits (probability 0),
 * very negative logits (exp underflow), padded frames, out-of-range targets, and the gradient
 * written and accumulated with the bias gradient (column sums of dz) fused in; on 1 and on 2 BLAS
 * threads, whose results must be identical (the passes split rows over threads and combine them in
 * row order); and label smoothing in the fused passes and the generic path of layers/loss.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "../../core/blas.h"
#include "../../kernels/cpu/cpu_level.h"
#include "../../kernels/softmax_ce.h"
#include "../../layers/loss.h"

/* reference: probabilities, loss and errors of one row in float64 */
static void ref_row(const float *z, int64_t C, int32_t k, double *p, double *loss, int *err) {
    double mx = -INFINITY;
    int64_t am = 0;
    bool nan = false;
    for (int64_t c = 0; c < C; c++) {
        if (z[c] != z[c] && !nan) {
            nan = true;
            am = c;
        }
        if (!nan && z[c] > mx) {
            mx = z[c];
            am = c;
        }
    }
    if (nan) mx = NAN;
    double s = 0;
    for (int64_t c = 0; c < C; c++)
        s += (p[c] = exp((double)z[c] - mx));
    for (int64_t c = 0; c < C; c++)
        p[c] /= s;
    *loss = k >= 0 ? mx + log(s) - z[k] : 0;
    *err = k >= 0 && am != k;
}

static uint64_t rnd_state = 12345;
static double rnd(void) {
    rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rnd_state >> 11) / 9007199254740992.0;
}

/* The outputs of one threads setting, compared bitwise with the other's. */
typedef struct {
    float *p, *dz, *db;
    double loss, nerr;
} run_out;

static void test_level(int threads, run_out *outs) {
    static const int64_t Cs[] = {1, 2, 15, 16, 17, 33, 100, 10000};
    rnd_state = 12345; /* the same data for each thread count */
    const char *lv = rl_cpu_level_name(rl_cpu_level_get());
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++)
        for (int inplace = 0; inplace <= 1; inplace++) {
            /* T * B = 132 rows: three blocks of the bias gradient's sums at C = 10000 */
            enum { T = 44, B = 3 };
            int64_t C = Cs[ci], rows = T * B;
            int32_t len[B] = {44, 2, 0}, target[T * B], tgt[T * B];
            float *z = malloc((size_t)(rows * C) * sizeof *z),
                  *p = malloc((size_t)(rows * C) * sizeof *p),
                  *zc = malloc((size_t)(rows * C) * sizeof *zc),
                  *dz = malloc((size_t)(rows * C) * sizeof *dz);
            double *pr = malloc((size_t)C * sizeof *pr),
                   *stats = malloc((size_t)(2 * rows) * sizeof *stats),
                   *dbr = malloc((size_t)C * sizeof *dbr);
            float *db = malloc((size_t)C * sizeof *db),
                  *scratch = malloc((size_t)(rl_ce_grad_scratch_size(rows, C) + 1) * sizeof *db);
            for (int64_t i = 0; i < rows * C; i++)
                z[i] = (float)(20.0 * rnd() - 10.0);
            for (int64_t r = 0; r < rows; r++)
                target[r] = (int32_t)(rnd() * (double)C);
            /* row 1: a tie of the maximum before and at the target; row 3: -inf and very
             * negative logits; row 4: a NaN (when C > 1) */
            if (C > 2) {
                z[1 * C + 0] = z[1 * C + 2] = 50.0f;
                target[1] = 2;
                z[3 * C + 1] = -INFINITY;
                z[3 * C + 0] = -200.0f;
                z[4 * C + C - 1] = NAN;
            }
            /* row 6: a NaN at the target (the argmax: no error); row 9: +inf, then a NaN at the
             * target (the first NaN wins over the infinite maximum); row 12: +inf at the target */
            if (C > 5) {
                z[6 * C + 5] = NAN;
                target[6] = 5;
                z[9 * C + 1] = INFINITY;
                z[9 * C + 3] = NAN;
                target[9] = 3;
                z[12 * C + 4] = INFINITY;
                target[12] = 4;
            }
            memcpy(zc, z, (size_t)(rows * C) * sizeof *z);
            CHECK(rl_ce_targets_cpu(T, B, C, target, len, tgt) == -1);
            double loss = -1, nerr = -1;
            float *out = inplace ? z : p;
            rl_softmax_ce_cpu_f32(rows, C, z, NULL, out, tgt, 0.0, stats, &loss, &nerr);
            double rloss = 0, perr = 0;
            int rerr = 0;
            bool nan_loss = false;
            for (int64_t r = 0; r < rows; r++) {
                double l;
                int e;
                ref_row(zc + r * C, C, tgt[r], pr, &l, &e);
                if (tgt[r] >= 0) {
                    rloss += l;
                    rerr += e;
                    nan_loss |= l != l;
                }
                for (int64_t c = 0; c < C; c++) {
                    double d = fabs((double)out[r * C + c] - pr[c]);
                    if (pr[c] != pr[c]) d = out[r * C + c] != out[r * C + c] ? 0 : 1;
                    perr = fmax(perr, d);
                }
            }
            CHECK(perr < 2e-6);
            if (nan_loss)
                CHECK(loss != loss);
            else
                CHECK_NEAR(loss, rloss, 1e-4 * (1 + fabs(rloss)));
            CHECK(nerr == rerr);
            if (perr >= 2e-6 || nerr != rerr)
                fprintf(stderr, "%s C=%lld inplace=%d: p err %.3g, errors %g vs %d\n", lv,
                        (long long)C, inplace, perr, nerr, rerr);
            /* gradient: written, then accumulated onto itself (doubling valid rows) */
            rl_ce_grad_cpu_f32(rows, C, out, tgt, 0.0, dz, false, db, scratch);
            bool gok = true;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < C; c++) {
                    float want = tgt[r] < 0 ? 0.0f : out[r * C + c] - (c == tgt[r] ? 1.0f : 0.0f);
                    float got = dz[r * C + c];
                    gok = gok && (got == want || (got != got && want != want));
                }
            CHECK(gok);
            /* the bias gradient: the column sums of dz (in float64 here) */
            double dberr = 0;
            for (int64_t c = 0; c < C; c++) {
                dbr[c] = 0;
                for (int64_t r = 0; r < rows; r++)
                    dbr[c] += dz[r * C + c];
                double d = fabs((double)db[c] - dbr[c]);
                dberr = dbr[c] != dbr[c] ? (db[c] != db[c] ? dberr : 1) : fmax(dberr, d);
            }
            CHECK(dberr < 1e-5);
            /* without a bias: the same dz alone */
            rl_ce_grad_cpu_f32(rows, C, out, tgt, 0.0, zc, false, NULL, NULL);
            CHECK(memcmp(zc, dz, (size_t)(rows * C) * sizeof *dz) == 0);
            rl_ce_grad_cpu_f32(rows, C, out, tgt, 0.0, dz, true, db, scratch);
            gok = true;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < C; c++) {
                    float g1 = tgt[r] < 0 ? 0.0f : out[r * C + c] - (c == tgt[r] ? 1.0f : 0.0f);
                    float want = g1 + g1, got = dz[r * C + c];
                    gok = gok && (fabsf(got - want) <= 1e-6f || (got != got && want != want));
                }
            CHECK(gok);
            dberr = 0;
            for (int64_t c = 0; c < C; c++) {
                double d = fabs((double)db[c] - 2 * dbr[c]);
                dberr = dbr[c] != dbr[c] ? (db[c] != db[c] ? dberr : 1) : fmax(dberr, d);
            }
            CHECK(dberr < 2e-5);
            /* the same bits on either thread count */
            run_out *o = &outs[ci * 2 + inplace];
            size_t pb = (size_t)(rows * C) * sizeof(float), cb = (size_t)C * sizeof(float);
            if (threads == 1) {
                o->p = malloc(pb), o->dz = malloc(pb), o->db = malloc(cb);
                memcpy(o->p, out, pb), memcpy(o->dz, dz, pb), memcpy(o->db, db, cb);
                o->loss = loss, o->nerr = nerr;
            } else {
                bool same = memcmp(o->p, out, pb) == 0 && memcmp(o->dz, dz, pb) == 0 &&
                            memcmp(o->db, db, cb) == 0 && o->nerr == nerr &&
                            (o->loss == loss || (o->loss != o->loss && loss != loss));
                CHECK(same);
                if (!same)
                    fprintf(stderr, "%s C=%lld: 2 threads differ from 1\n", lv, (long long)C);
                free(o->p), free(o->dz), free(o->db);
            }
            /* out-of-range targets on valid frames are found; on padded ones ignored */
            target[1 * B + 1] = (int32_t)C; /* t = 1 < len[1] = 2: valid */
            target[3 * B + 1] = -5;         /* t = 3 >= len[1]: padded */
            CHECK(rl_ce_targets_cpu(T, B, C, target, len, tgt) == 1 * B + 1);
            target[1 * B + 1] = 0;
            CHECK(rl_ce_targets_cpu(T, B, C, target, len, tgt) == -1);
            CHECK(tgt[3 * B + 1] == -1 && tgt[2] == -1);
            free(z);
            free(p);
            free(zc);
            free(dz);
            free(pr);
            free(stats);
            free(dbr);
            free(db);
            free(scratch);
        }
    /* no target: only the probabilities */
    float z1[3] = {1, 2, 3}, p1[3];
    double l = 7, e = 7;
    rl_softmax_ce_cpu_f32(1, 3, z1, NULL, p1, NULL, 0.0, NULL, &l, &e);
    CHECK_NEAR(p1[2], exp(3.0) / (exp(1.0) + exp(2.0) + exp(3.0)), 1e-7);
    CHECK(l == 7 && e == 7);
    /* a bias added to every row first, z left alone when not in place; the target's logit
     * and the argmax count the bias: z + b = {4, 2, 3} over two rows, target 2 */
    float z2[6] = {1, 2, 3, 1, 2, 3}, b2[3] = {3, 0, 0}, p2[6];
    int32_t t2[2] = {2, -1};
    double st2[4];
    rl_softmax_ce_cpu_f32(2, 3, z2, b2, p2, t2, 0.0, st2, &l, &e);
    double s2 = exp(4.0) + exp(2.0) + exp(3.0);
    CHECK_NEAR(p2[0], exp(4.0) / s2, 1e-7);
    CHECK_NEAR(p2[5], exp(3.0) / s2, 1e-7);
    CHECK_NEAR(l, log(s2) - 3.0, 1e-6);
    CHECK(e == 1);
    CHECK(z2[0] == 1 && z2[3] == 1);
}

/* Label smoothing eps (PyTorch's CrossEntropyLoss(label_smoothing = eps), summed over the
 * valid rows): the fused float32 and float64 passes and the generic path of layers/loss.c (what
 * a CUDA network runs, here on CPU tensors) against a float64 reference of the formula, for
 * the loss, the gradient written and added, and eps = 0 bit-identical to no smoothing. */
static void test_smoothing(void) {
    enum { T = 5, B = 2, C = 7 };
    const int64_t rows = T * B;
    const double eps = 0.1;
    int32_t len[B] = {5, 3}, target[T * B], tgt[T * B];
    float z[T * B * C], p[T * B * C], dz[T * B * C];
    double zd[T * B * C], pd[T * B * C], dzd[T * B * C], ref_dz[T * B * C], ref_loss = 0;
    double stats[2 * T * B], loss = 0, nerr = 0;
    rnd_state = 777;
    for (int64_t i = 0; i < rows * C; i++)
        zd[i] = (double)(z[i] = (float)(6.0 * rnd() - 3.0));
    for (int64_t r = 0; r < rows; r++)
        target[r] = (int32_t)(rnd() * C);
    CHECK(rl_ce_targets_cpu(T, B, C, target, len, tgt) == -1);
    for (int64_t r = 0; r < rows; r++) {
        const double *zr = zd + r * C;
        double mx = -INFINITY, s = 0;
        for (int c = 0; c < C; c++)
            mx = fmax(mx, zr[c]);
        for (int c = 0; c < C; c++)
            s += exp(zr[c] - mx);
        double lse = mx + log(s), smooth = 0;
        for (int c = 0; c < C; c++) {
            smooth -= (zr[c] - lse) / C;
            ref_dz[r * C + c] =
                tgt[r] < 0 ? 0 : exp(zr[c] - lse) - eps / C - (c == tgt[r] ? 1 - eps : 0);
        }
        if (tgt[r] >= 0) ref_loss += (1 - eps) * (lse - zr[tgt[r]]) + eps * smooth;
    }
    /* fused float32 and float64 */
    rl_softmax_ce_cpu_f32(rows, C, z, NULL, p, tgt, eps, stats, &loss, &nerr);
    CHECK_NEAR(loss, ref_loss, 1e-5 * ref_loss);
    rl_ce_grad_cpu_f32(rows, C, p, tgt, eps, dz, false, NULL, NULL);
    double err = 0;
    for (int64_t i = 0; i < rows * C; i++)
        err = fmax(err, fabs(dz[i] - ref_dz[i]));
    CHECK(err < 1e-6);
    rl_softmax_ce_cpu_f64(rows, C, zd, pd, tgt, eps, &loss, &nerr);
    CHECK_NEAR(loss, ref_loss, 1e-12 * ref_loss);
    for (int64_t i = 0; i < rows * C; i++)
        dzd[i] = 1.0;
    rl_ce_grad_cpu_f64(rows, C, pd, tgt, eps, dzd, true, NULL);
    err = 0;
    for (int64_t i = 0; i < rows * C; i++)
        err = fmax(err, fabs(dzd[i] - 1.0 - (tgt[i / C] < 0 ? 0 : ref_dz[i])));
    CHECK(err < 1e-12);
    /* eps = 0: the plain passes, bit for bit */
    float p0[T * B * C], dz0[T * B * C];
    double l0 = 0, e0 = 0;
    rl_softmax_ce_cpu_f32(rows, C, z, NULL, p0, tgt, 0.0, stats, &l0, &e0);
    rl_ce_grad_cpu_f32(rows, C, p0, tgt, 0.0, dz0, false, NULL, NULL);
    double ref0 = 0;
    for (int64_t r = 0; r < rows; r++)
        if (tgt[r] >= 0) ref0 += stats[2 * r];
    CHECK(l0 == ref0 && l0 != loss);
    bool plain = true;
    for (int64_t i = 0; i < rows * C; i++)
        plain = plain &&
                dz0[i] == (tgt[i / C] < 0 ? 0.0f
                                          : p0[i] - (tgt[i / C] == (int32_t)(i % C) ? 1.0f : 0.0f));
    CHECK(plain);

    /* the generic path: logp = z - lse as a (T, B, C) float64 CPU tensor */
    int64_t tbc[3] = {T, B, C}, tb[2] = {T, B}, b1[1] = {B};
    rl_tensor logp = {0}, pt = {0}, g = {0}, tt = {0}, lt = {0};
    rl_ce_work w = {0};
    CHECK_OK(rl_tensor_empty(&logp, RL_FLOAT64, RL_DEVICE_CPU, 3, tbc));
    CHECK_OK(rl_tensor_empty(&pt, RL_FLOAT64, RL_DEVICE_CPU, 3, tbc));
    CHECK_OK(rl_tensor_empty(&g, RL_FLOAT64, RL_DEVICE_CPU, 3, tbc));
    CHECK_OK(rl_tensor_empty(&tt, RL_INT32, RL_DEVICE_CPU, 2, tb));
    CHECK_OK(rl_tensor_empty(&lt, RL_INT32, RL_DEVICE_CPU, 1, b1));
    double *lp = rl_tensor_data(&logp), *pp = rl_tensor_data(&pt), *gp = rl_tensor_data(&g);
    for (int64_t i = 0; i < rows * C; i++) {
        lp[i] = log(pd[i]);
        pp[i] = pd[i];
    }
    memcpy(rl_tensor_data(&tt), target, sizeof target);
    memcpy(rl_tensor_data(&lt), len, sizeof len);
    double gl = 0, ge = 0, gf = 0;
    CHECK_OK(rl_loss_ce(&w, "out", "softmax", &logp, &tt, &lt, eps, &gl, &ge, &gf));
    CHECK_NEAR(gl, ref_loss, 1e-12 * ref_loss);
    CHECK(gf == 8);
    CHECK_OK(rl_loss_ce_grad(&w, &pt, &lt, &g, false));
    err = 0;
    for (int64_t i = 0; i < rows * C; i++)
        err = fmax(err, fabs(gp[i] - ref_dz[i]));
    CHECK(err < 1e-12);
    CHECK_OK(rl_loss_ce_grad(&w, &pt, &lt, &g, true));
    err = 0;
    for (int64_t i = 0; i < rows * C; i++)
        err = fmax(err, fabs(gp[i] - 2 * ref_dz[i]));
    CHECK(err < 1e-12);
    rl_ce_work_release(&w);
    rl_tensor_release(&logp);
    rl_tensor_release(&pt);
    rl_tensor_release(&g);
    rl_tensor_release(&tt);
    rl_tensor_release(&lt);
}

int main(void) {
    test_smoothing();
    for (int lv = RL_CPU_GENERIC; lv <= (int)rl_cpu_level_supported(); lv++) {
        CHECK_OK(rl_cpu_level_set((rl_cpu_level)lv));
        run_out outs[16];
        for (int threads = 1; threads <= 2; threads++) {
            rl_blas_set_threads(threads);
            test_level(threads, outs);
        }
    }
    TEST_MAIN_END();
}
