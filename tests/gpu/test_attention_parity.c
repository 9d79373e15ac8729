/* Attention step parity on a GPU: rl_attention_forward / rl_attention_backward
 * (kernels/attention.h) on CUDA tensors against the same calls on the CPU, dot and additive,
 * float32 (to 1e-5 of each tensor's largest magnitude) and float64 (1e-10), Te = 9, B = 5 with
 * ragged encoder lengths {9, 4, 0, 1, 7} (NaN in the padded frames), E = 150 and A = 130 (more
 * than one pass of a block's 128 threads). Compared: alpha, the context, ds, de, dq, dpre, dv,
 * with de, dpre and dv starting from non-zero values (they accumulate).
 *
 * Without a GPU (or without a CUDA build) the device-free parts still run: the CPU float32
 * kernel against the CPU float64 kernel on the same inputs (the reference the device is held
 * to), a check that no NaN of the padding reaches a result, a check that the comparison catches
 * a wrong element, and the device comparison itself with the CPU as the device side
 * (tests/gpu/device_side.h). Run by `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "tests/c/check.h"
#include "tests/gpu/device_side.h"

enum { TE = 9, B = 5, E = 150, A = 130 };
static const int32_t LENS[B] = {9, 4, 0, 1, 7};

/* A tensor of dt on dev, uniform in [-1, 1); for (Te, B, .) tensors `pad` in padded frames. */
static rl_tensor make(rl_dtype dt, rl_device dev, int ndim, int64_t d0, int64_t d1, int64_t d2,
                      bool seq, double pad) {
    const int64_t shape[3] = {d0, d1, d2};
    rl_tensor t = rand_tensor(dt, ndim, shape, -1, 1, seq ? LENS : NULL, pad);
    rl_tensor c = copy_to(&t, dev);
    rl_tensor_release(&t);
    return c;
}

/* One side: the inputs and the results of a forward and a backward step on one device. */
typedef struct {
    rl_tensor e, len, q, pre, v, dctx, alpha, ctx, ds, de, dq, dpre, dv;
} side;

enum { N_TENSORS = 13 };

static rl_tensor *member(side *s, int i) {
    rl_tensor *m[N_TENSORS] = {&s->e,   &s->len, &s->q,  &s->pre, &s->v,    &s->dctx, &s->alpha,
                               &s->ctx, &s->ds,  &s->de, &s->dq,  &s->dpre, &s->dv};
    return m[i];
}

/* The same values on every side of a seed, in dt on dev. */
static void side_run(side *s, rl_att_kind kind, rl_dtype dt, rl_device dev, uint64_t seed) {
    memset(s, 0, sizeof *s);
    rand_state = seed;
    const bool add = kind == RL_ATT_ADDITIVE;
    const int64_t Q = add ? A : E, lshape[1] = {B};
    s->e = make(dt, dev, 3, TE, B, E, true, NAN);
    rl_tensor l = {0};
    CHECK_OK(rl_tensor_empty(&l, RL_INT32, RL_DEVICE_CPU, 1, lshape));
    memcpy(rl_tensor_data(&l), LENS, sizeof LENS);
    CHECK_OK(rl_op_to(&s->len, &l, RL_INT32, dev));
    rl_tensor_release(&l);
    s->q = make(dt, dev, 2, B, Q, 0, false, 0);
    s->dctx = make(dt, dev, 2, B, E, 0, false, 0);
    s->de = make(dt, dev, 3, TE, B, E, false, 0);
    if (add) {
        s->pre = make(dt, dev, 3, TE, B, A, true, NAN);
        s->v = make(dt, dev, 1, A, 0, 0, false, 0);
        s->dpre = make(dt, dev, 3, TE, B, A, false, 0);
        s->dv = make(dt, dev, 2, B, A, 0, false, 0);
    }
    s->alpha = make(dt, dev, 2, B, TE, 0, false, 0);
    s->ctx = make(dt, dev, 2, B, E, 0, false, 0);
    s->ds = make(dt, dev, 2, B, TE, 0, false, 0);
    s->dq = make(dt, dev, 2, B, Q, 0, false, 0);
    const rl_tensor *pre = add ? &s->pre : NULL, *v = add ? &s->v : NULL;
    CHECK_OK(
        rl_attention_forward("parity", kind, &s->e, &s->len, &s->q, pre, v, &s->alpha, &s->ctx));
    CHECK_OK(rl_attention_backward("parity", kind, &s->e, &s->len, &s->q, pre, v, &s->alpha,
                                   &s->dctx, &s->ds, &s->de, &s->dq, add ? &s->dpre : NULL,
                                   add ? &s->dv : NULL));
}

static void side_free(side *s) {
    for (int i = 0; i < N_TENSORS; i++)
        rl_tensor_release(member(s, i));
}

static const char *const NAMES[N_TENSORS] = {"e",   "len", "q",  "pre", "v",    "dctx", "alpha",
                                             "ctx", "ds",  "de", "dq",  "dpre", "dv"};

/* The results (alpha onwards) of two sides. */
static void side_compare(const char *tag, side *want, side *got, double rtol) {
    for (int i = 6; i < N_TENSORS; i++)
        if (member(want, i)->storage) compare(tag, NAMES[i], member(want, i), member(got, i), rtol);
}

/* No NaN of the padding may reach a result. */
static void check_finite(const char *tag, side *s) {
    for (int i = 6; i < N_TENSORS; i++) {
        rl_tensor *t = member(s, i), d = {0};
        if (!t->storage) continue;
        CHECK_OK(rl_op_to(&d, t, RL_FLOAT64, RL_DEVICE_CPU));
        const double *p = rl_tensor_data(&d);
        bool ok = true;
        for (int64_t k = 0; k < rl_tensor_numel(&d); k++)
            ok = ok && isfinite(p[k]);
        if (!ok) fprintf(stderr, "FAIL %s: %s holds a NaN or Inf\n", tag, NAMES[i]);
        CHECK(ok);
        rl_tensor_release(&d);
    }
}

static void test_reference(void) {
    for (int k = 0; k < 2; k++) {
        rl_att_kind kind = k ? RL_ATT_ADDITIVE : RL_ATT_DOT;
        const char *tag = k ? "cpu f32 vs f64 additive" : "cpu f32 vs f64 dot";
        side s64, s32;
        side_run(&s64, kind, RL_FLOAT64, RL_DEVICE_CPU, 42);
        side_run(&s32, kind, RL_FLOAT32, RL_DEVICE_CPU, 42);
        check_finite(tag, &s64);
        check_finite(tag, &s32);
        side_compare(tag, &s64, &s32, 1e-5);
        /* the comparison must catch one wrong element */
        double *p = rl_tensor_data(&s64.ctx);
        p[7] += 0.5;
        CHECK(rel_err(&s64.ctx, &s32.ctx) > 1e-3);
        side_free(&s64);
        side_free(&s32);
    }
}

/* The device side against the CPU: both kinds, both dtypes, the same inputs. */
static void test_device(rl_device dev) {
    for (int k = 0; k < 2; k++) {
        for (int f = 0; f < 2; f++) {
            rl_att_kind kind = k ? RL_ATT_ADDITIVE : RL_ATT_DOT;
            rl_dtype dt = f ? RL_FLOAT64 : RL_FLOAT32;
            char tag[64];
            snprintf(tag, sizeof tag, "%s vs cpu %s %s", dev.type == RL_CUDA ? "cuda" : "cpu",
                     k ? "additive" : "dot", rl_dtype_name(dt));
            side cpu, got;
            side_run(&cpu, kind, dt, RL_DEVICE_CPU, 99);
            side_run(&got, kind, dt, dev, 99);
            CHECK_OK(rl_op_synchronize(dev));
            check_finite(tag, &got);
            side_compare(tag, &cpu, &got, f ? 1e-10 : 1e-5);
            side_free(&cpu);
            side_free(&got);
        }
    }
}

int main(void) {
    rl_ops_init();
    test_reference();
    test_device(device_side(NULL));
    TEST_MAIN_END();
}
