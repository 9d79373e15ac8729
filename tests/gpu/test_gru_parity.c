/* GRU parity on a GPU: the gru layer (layers/gru.c) on CUDA tensors against the same layer on
 * the CPU, with the same random weights and inputs: T=7, B=3 with ragged lengths {7, 4, 1}, H=5,
 * two inputs (F = 4 and 3; NaN in the padded frames of the first), a given initial state, both
 * directions queued at once (one stream per layer object), float32 (to 1e-5 of each tensor's
 * largest magnitude) and float64 (1e-10). Compared: the output, each sequence's final state,
 * both input gradients, every parameter gradient and the initial state's gradient, over two
 * batches (the second reuses the buffers and accumulates the parameter gradients). Then the
 * per-step kernels of kernels/cuda/gru_cuda.h against kernels/gru.h's CPU steps on random
 * buffers (padded rows included) and the bias sums against a host sum (also over more rows than
 * the sums' row chunks and more columns than one block).
 *
 * Without a GPU (or without a CUDA build) the device-free parts still run: the CPU reference
 * runs (two layer objects must agree bit for bit, and no NaN of the padding may reach a result),
 * a check that the comparison catches a wrong element, and the layer harness with the CPU as the
 * device side (tests/gpu/device_side.h); the per-step CUDA kernels and the bias sums need a GPU and
 * are skipped. Run by `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/gru.h"
#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "tests/c/check.h"
#include "tests/c/gradcheck.h"
#include "tests/gpu/device_side.h"
#ifdef RL_WITH_CUDA
#include "kernels/cuda/gru_cuda.h"
#endif

enum { T = 7, B = 3, H = 5, F1 = 4, F2 = 3 };
static const int32_t LENS[B] = {7, 4, 1};

/* ---- one side of a comparison: a gru layer with its batch on one device ---- */

typedef struct {
    rl_layer *l;
    rl_tensor x[2], len, h0, gout, gin[2], hT, dh0;
} side;

/* The layer and its batch on dev; the values depend only on seed, so both sides get the same. */
static bool side_init(side *s, rl_dtype dt, int dir, rl_device dev, uint64_t seed) {
    memset(s, 0, sizeof *s);
    rand_state = seed;
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", H);
    gc_opt_num(&t, "direction", dir);
    rl_options o = gc_options(&t);
    int64_t F[2] = {F1, F2};
    CHECK_OK(rl_layer_create(&s->l, "gru", dir > 0 ? "fw" : "bw", &o, 2, F));
    if (!s->l) return false;
    for (int i = 0; i < s->l->n_params; i++) {
        rl_param *p = &s->l->params[i];
        rl_tensor v = rand_tensor(dt, p->ndim, p->shape, -0.5, 0.5, NULL, 0);
        p->value = copy_to(&v, dev);
        rl_tensor_release(&v);
        CHECK_OK(rl_tensor_empty(&p->grad, dt, dev, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
    }
    for (int k = 0; k < 2; k++) {
        int64_t xs[3] = {T, B, F[k]};
        rl_tensor x = rand_tensor(dt, 3, xs, -1.0, 1.0, LENS, k == 0 ? NAN : 0.0);
        s->x[k] = copy_to(&x, dev);
        rl_tensor_release(&x);
        CHECK_OK(rl_tensor_empty(&s->gin[k], dt, dev, 3, xs));
    }
    int64_t bs[1] = {B}, hs[2] = {B, H}, os[3] = {T, B, H};
    CHECK_OK(rl_tensor_empty(&s->len, RL_INT32, RL_DEVICE_CPU, 1, bs));
    memcpy(rl_tensor_data(&s->len), LENS, sizeof LENS);
    rl_tensor h0 = rand_tensor(dt, 2, hs, -0.5, 0.5, NULL, 0),
              g = rand_tensor(dt, 3, os, -1.0, 1.0, LENS, 0.0);
    s->h0 = copy_to(&h0, dev);
    s->gout = copy_to(&g, dev);
    rl_tensor_release(&h0);
    rl_tensor_release(&g);
    CHECK_OK(rl_gru_set_initial_state(s->l, &s->h0));
    return true;
}

static rl_layer_io side_io(side *s) {
    rl_layer_io io = {.n_in = 2, .in = {&s->x[0], &s->x[1]}, .lengths = &s->len};
    return io;
}

static void side_forward(side *s) {
    rl_layer_io io = side_io(s);
    CHECK_OK(s->l->ops->forward(s->l, &io));
}

static void side_backward(side *s) {
    rl_layer_io io = side_io(s);
    rl_tensor *gi[2] = {&s->gin[0], &s->gin[1]};
    rl_tensor_release(&s->hT);
    CHECK_OK(rl_gru_final_state(s->l, &s->hT));
    rl_tensor hT = {0};
    CHECK_OK(rl_op_to(
        &hT, &s->hT, s->hT.dtype,
        rl_tensor_device(&s->hT))); /* a copy: the view lives only until the next forward */
    rl_tensor_release(&s->hT);
    s->hT = hT;
    CHECK_OK(s->l->ops->backward(s->l, &io, &s->gout, gi));
    rl_tensor_release(&s->dh0);
    CHECK_OK(rl_gru_initial_state_grad(s->l, &s->dh0));
}

static void side_free(side *s) {
    rl_layer_free(s->l);
    rl_tensor *ts[] = {&s->x[0],   &s->x[1],   &s->len, &s->h0, &s->gout,
                       &s->gin[0], &s->gin[1], &s->hT,  &s->dh0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

static void side_compare(const char *tag, side *want, side *got, double rtol) {
    compare(tag, "output", &want->l->out, &got->l->out, rtol);
    compare(tag, "final state", &want->hT, &got->hT, rtol);
    compare(tag, "input 1 gradient", &want->gin[0], &got->gin[0], rtol);
    compare(tag, "input 2 gradient", &want->gin[1], &got->gin[1], rtol);
    compare(tag, "initial state gradient", &want->dh0, &got->dh0, rtol);
    for (int i = 0; i < want->l->n_params; i++)
        compare(tag, want->l->params[i].name, &want->l->params[i].grad, &got->l->params[i].grad,
                rtol);
}

/* ---- device-free: the CPU reference and the comparison itself ---- */

static void test_reference(void) {
    for (int dir = 1; dir >= -1; dir -= 2) {
        side a, b;
        if (!side_init(&a, RL_FLOAT32, dir, RL_DEVICE_CPU, 11) ||
            !side_init(&b, RL_FLOAT32, dir, RL_DEVICE_CPU, 11))
            return;
        for (int rep = 0; rep < 2; rep++) {
            side_forward(&a);
            side_forward(&b);
            side_backward(&a);
            side_backward(&b);
        }
        side_compare(dir > 0 ? "cpu reference fw" : "cpu reference bw", &a, &b, 0.0);
        /* no NaN of the padding reached a result (rel_err of a tensor with itself is NaN-free) */
        CHECK(rel_err(&a.l->out, &a.l->out) == 0.0);
        CHECK(rel_err(&a.gin[0], &a.gin[0]) == 0.0);
        CHECK(rel_err(&a.l->params[0].grad, &a.l->params[0].grad) == 0.0);
        /* the comparison catches one wrong element, and a NaN */
        float *o = rl_tensor_data(&b.l->out);
        float keep = o[5];
        o[5] = keep + 1e-3f;
        CHECK(rel_err(&a.l->out, &b.l->out) > 1e-5);
        o[5] = NAN;
        CHECK(!(rel_err(&a.l->out, &b.l->out) <= 1e-5));
        o[5] = keep;
        side_free(&a);
        side_free(&b);
    }
}

/* the side compared with the CPU: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

/* Both directions on the GPU queued at once (forward of both, then backward of both, no
 * synchronisation between), against the CPU; two batches. */
static void test_layer(rl_dtype dt, double rtol) {
    side cpu[2], gpu[2];
    for (int d = 0; d < 2; d++) {
        int dir = d ? -1 : 1;
        if (!side_init(&cpu[d], dt, dir, RL_DEVICE_CPU, 21 + d) ||
            !side_init(&gpu[d], dt, dir, DEV, 21 + d))
            return;
    }
    for (int rep = 0; rep < 2; rep++) {
        for (int d = 0; d < 2; d++) {
            side_forward(&cpu[d]);
            side_forward(&gpu[d]);
        }
        for (int d = 0; d < 2; d++) {
            side_backward(&cpu[d]);
            side_backward(&gpu[d]);
        }
    }
    CHECK_OK(rl_op_synchronize(DEV));
    for (int d = 0; d < 2; d++) {
        char tag[64];
        snprintf(tag, sizeof tag, "layer %s %s", rl_dtype_name(dt), d ? "bw" : "fw");
        side_compare(tag, &cpu[d], &gpu[d], rtol);
        side_free(&cpu[d]);
        side_free(&gpu[d]);
    }
}

#ifdef RL_WITH_CUDA
static const rl_device CUDA0 = {RL_CUDA, 0};

/* The per-step kernels and the bias sums against the CPU steps on the same random buffers. */
static void test_steps(void) {
    rand_state = 99;
    int64_t gs[2] = {B, 4 * H}, hs[2] = {B, H}, bs[1] = {3 * H}, ls[1] = {B};
    int64_t t = 3; /* row 2 (length 1) is padded at this step */
    rl_tensor g = rand_tensor(RL_FLOAT32, 2, gs, -1.0, 1.0, NULL, 0),
              b = rand_tensor(RL_FLOAT32, 1, bs, -0.5, 0.5, NULL, 0),
              bh = rand_tensor(RL_FLOAT32, 1, bs, -0.5, 0.5, NULL, 0),
              hp = rand_tensor(RL_FLOAT32, 2, hs, -0.8, 0.8, NULL, 0),
              dout = rand_tensor(RL_FLOAT32, 2, hs, -1.0, 1.0, NULL, 0),
              dh = rand_tensor(RL_FLOAT32, 2, hs, -1.0, 1.0, NULL, 0), h = {0}, out = {0},
              len = {0};
    CHECK_OK(rl_tensor_empty(&h, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_tensor_empty(&out, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, ls));
    memcpy(rl_tensor_data(&len), LENS, sizeof LENS);
    rl_tensor G = copy_to(&g, CUDA0), Bd = copy_to(&b, CUDA0), BHd = copy_to(&bh, CUDA0),
              HP = copy_to(&hp, CUDA0), DO = copy_to(&dout, CUDA0), DH = copy_to(&dh, CUDA0),
              Hd = copy_to(&h, CUDA0), Od = copy_to(&out, CUDA0), L = copy_to(&len, CUDA0);
    rl_gru_cpu_fwd_f32(B, H, t, LENS, rl_tensor_data(&g), rl_tensor_data(&b), rl_tensor_data(&bh),
                       rl_tensor_data(&hp), rl_tensor_data(&h), rl_tensor_data(&out));
    CHECK_OK(rl_gru_cuda_fwd_f32(NULL, B, H, t, rl_tensor_data(&L), rl_tensor_data(&G),
                                 rl_tensor_data(&Bd), rl_tensor_data(&BHd), rl_tensor_data(&HP),
                                 rl_tensor_data(&Hd), rl_tensor_data(&Od)));
    compare("step fwd", "gates", &g, &G, 1e-5);
    compare("step fwd", "state", &h, &Hd, 1e-5);
    compare("step fwd", "output", &out, &Od, 1e-5);
    /* backward from the activations just computed; bias sums on the host vs the kernel */
    rl_tensor db = {0}, dbh = {0};
    CHECK_OK(rl_tensor_empty(&db, RL_FLOAT32, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_tensor_empty(&dbh, RL_FLOAT32, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_op_fill(&db, 0.0));
    CHECK_OK(rl_op_fill(&dbh, 0.0));
    rl_tensor DB = copy_to(&db, CUDA0), DBH = copy_to(&dbh, CUDA0);
    rl_gru_cpu_bwd_f32(B, H, t, LENS, rl_tensor_data(&g), rl_tensor_data(&hp),
                       rl_tensor_data(&dout), H, rl_tensor_data(&dh), rl_tensor_data(&db),
                       rl_tensor_data(&dbh));
    CHECK_OK(rl_gru_cuda_bwd_f32(NULL, B, H, t, rl_tensor_data(&L), rl_tensor_data(&G),
                                 rl_tensor_data(&HP), rl_tensor_data(&DO), H, rl_tensor_data(&DH)));
    int64_t ps[1] = {RL_GRU_CUDA_CHUNKS * 4 * H};
    rl_tensor P = {0};
    CHECK_OK(rl_tensor_empty(&P, RL_FLOAT32, CUDA0, 1, ps));
    CHECK_OK(rl_gru_cuda_bias_grads(NULL, RL_FLOAT32, B, H, rl_tensor_data(&G), rl_tensor_data(&P),
                                    rl_tensor_data(&DB), rl_tensor_data(&DBH)));
    compare("step bwd", "dG", &g, &G, 1e-5);
    compare("step bwd", "dh", &dh, &DH, 1e-5);
    compare("step bwd", "db", &db, &DB, 1e-5);
    compare("step bwd", "db_h", &dbh, &DBH, 1e-5);
    rl_tensor *ts[] = {&g,  &b,  &bh, &hp, &dout, &dh, &h,  &out, &len, &G,   &Bd, &BHd,
                       &HP, &DO, &DH, &Hd, &Od,   &L,  &db, &dbh, &DB,  &DBH, &P};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

/* The bias sums over more rows than RL_GRU_CUDA_CHUNKS (several rows per chunk, a last chunk
 * with fewer) and more columns than one block (4H = 164), against a host sum in float64. */
static void test_bias_sums(void) {
    enum { N = 2 * RL_GRU_CUDA_CHUNKS + 5, HB = 41 };
    rand_state = 7;
    int64_t gs[2] = {N, 4 * HB}, bs[1] = {3 * HB}, ps[1] = {RL_GRU_CUDA_CHUNKS * 4 * HB};
    rl_tensor g = rand_tensor(RL_FLOAT64, 2, gs, -1.0, 1.0, NULL, 0), db = {0}, dbh = {0}, P = {0};
    CHECK_OK(rl_tensor_empty(&db, RL_FLOAT64, RL_DEVICE_CPU, 1, bs));
    CHECK_OK(rl_tensor_empty(&dbh, RL_FLOAT64, RL_DEVICE_CPU, 1, bs));
    const double *pg = rl_tensor_data(&g);
    double *pdb = rl_tensor_data(&db), *pdbh = rl_tensor_data(&dbh);
    for (int64_t j = 0; j < HB; j++) {
        double s[4] = {0, 0, 0, 0};
        for (int64_t n = 0; n < N; n++)
            for (int k = 0; k < 4; k++)
                s[k] += pg[n * 4 * HB + k * HB + j];
        /* db and dbh start at 1: the sums are added to them */
        pdb[j] = 1 + s[0], pdb[HB + j] = 1 + s[1], pdb[2 * HB + j] = 1 + s[3];
        pdbh[j] = 1 + s[0], pdbh[HB + j] = 1 + s[1], pdbh[2 * HB + j] = 1 + s[2];
    }
    rl_tensor G = copy_to(&g, CUDA0), DB = {0}, DBH = {0};
    CHECK_OK(rl_tensor_empty(&DB, RL_FLOAT64, CUDA0, 1, bs));
    CHECK_OK(rl_tensor_empty(&DBH, RL_FLOAT64, CUDA0, 1, bs));
    CHECK_OK(rl_tensor_empty(&P, RL_FLOAT64, CUDA0, 1, ps));
    CHECK_OK(rl_op_fill(&DB, 1.0));
    CHECK_OK(rl_op_fill(&DBH, 1.0));
    CHECK_OK(rl_gru_cuda_bias_grads(NULL, RL_FLOAT64, N, HB, rl_tensor_data(&G), rl_tensor_data(&P),
                                    rl_tensor_data(&DB), rl_tensor_data(&DBH)));
    compare("bias sums", "db", &db, &DB, 1e-12);
    compare("bias sums", "db_h", &dbh, &DBH, 1e-12);
    rl_tensor *ts[] = {&g, &db, &dbh, &G, &DB, &DBH, &P};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}
#endif

int main(void) {
    rl_ops_init();
    test_reference();
    DEV = device_side("the per-step CUDA kernels and the bias sums");
    test_layer(RL_FLOAT32, 1e-5);
    test_layer(RL_FLOAT64, 1e-10);
#ifdef RL_WITH_CUDA
    if (DEV.type == RL_CUDA) {
        test_steps();
        test_bias_sums();
    }
#endif
    TEST_MAIN_END();
}
