/* MDLSTM parity on a GPU: the mdlstm layer on cuda:0 against the same layer on the CPU
 * (layers/mdlstm.c, the CPU path checked against a reference and by finite differences in
 * tests/c/test_mdlstm.c), same weights and inputs: H=5, W=6, B=3 ragged images, two inputs (the
 * second a feature-narrowed view, so the copy path runs), every single direction and all four,
 * concat and sum, standard and stable cells, float32 and float64. Compared: the output, both
 * input gradients (prefilled with NaN: every element must be written) and every parameter
 * gradient (prefilled with 0.25: they must accumulate), float32 to 1e-5 of each tensor's largest
 * magnitude and float64 to 1e-10. Three batches per layer: sizes A, sizes B (the cell lists are
 * rebuilt), sizes A again; gradients accumulate over all three. Then mixed CPU/CUDA arguments
 * must be refused with an error naming the layer.
 * Without a CUDA device (or build) the "device" side is the CPU itself: every configuration and
 * every comparison runs and must pass, so a broken test shows there too (the mixed-device checks
 * need two devices and are skipped); the line printed says which side ran. Run by
 * `make test-gpu`. */
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "tests/c/check.h"
#include "tests/c/gradcheck.h"
#include "tests/gpu/device_side.h"

enum { H = 5, W = 6, B = 3, D = 3, F1 = 2, F2 = 3 };
static const int32_t SIZES_A[B][2] = {{5, 6}, {2, 3}, {4, 1}};
static const int32_t SIZES_B[B][2] = {{3, 6}, {5, 2}, {1, 1}};
/* the side compared with the CPU: cuda:0, or the CPU itself without a device */
static rl_device DEV = {RL_CPU, 0};

typedef struct {
    const char *dirs, *combine, *cell;
} config;

static const config CONFIGS[] = {
    {"tl", "concat", "standard"},
    {"tr", "concat", "standard"},
    {"bl", "concat", "standard"},
    {"br", "concat", "standard"},
    {"tl,tr,bl,br", "concat", "standard"},
    {"tl,tr,bl,br", "sum", "standard"},
    {"br tl", "sum", "standard"},
    {"tl", "concat", "stable"},
    {"tr", "sum", "stable"},
    {"bl", "concat", "stable"},
    {"br", "concat", "stable"},
    {"tl,tr,bl,br", "concat", "stable"},
    {"tl,tr,bl,br", "sum", "stable"},
};

/* One layer with its flat parameter buffers, inputs and gradients, all on one device. */
typedef struct {
    rl_layer *l;
    rl_tensor pv, pg, x1, xbig, x2, gout, gin[2];
} side;

static rl_status make_layer(rl_layer **l, const config *cf) {
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", D);
    gc_opt_str(&t, "directions", cf->dirs);
    gc_opt_str(&t, "combine", cf->combine);
    gc_opt_str(&t, "cell", cf->cell);
    rl_options o = gc_options(&t);
    int64_t dims[2] = {F1, F2};
    return rl_layer_create(l, "mdlstm", "img", &o, 2, dims);
}

static void side_free(side *s) {
    rl_layer_free(s->l);
    rl_tensor *ts[] = {&s->pv, &s->pg, &s->x1, &s->xbig, &s->x2, &s->gout, &s->gin[0], &s->gin[1]};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

/* The CPU side with random weights and inputs, and the CUDA side as copies of it. */
static rl_status make_sides(const config *cf, rl_dtype dt, side *c, side *g) {
    memset(c, 0, sizeof *c);
    memset(g, 0, sizeof *g);
    rl_rng r;
    rl_rng_seed(&r, 5);
    RL_TRY(make_layer(&c->l, cf));
    RL_TRY(gc_bind_params(c->l, dt, &r, &c->pv, &c->pg));
    for (int i = 0; i < c->l->n_params; i++) /* larger recurrent weights and biases */
        if (strcmp(c->l->params[i].name, "W") != 0)
            RL_TRY(rl_op_uniform(&c->l->params[i].value, &r, -0.8, 0.8));
    RL_TRY(rl_op_fill(&c->pg, 0.25));
    int64_t s1[4] = {H, W, B, F1}, sb[4] = {H, W, B, F2 + 2};
    RL_TRY(rl_tensor_empty(&c->x1, dt, RL_DEVICE_CPU, 4, s1));
    RL_TRY(rl_op_uniform(&c->x1, &r, -1, 1));
    RL_TRY(rl_tensor_empty(&c->xbig, dt, RL_DEVICE_CPU, 4, sb));
    RL_TRY(rl_op_uniform(&c->xbig, &r, -1, 1));
    RL_TRY(rl_tensor_narrow(&c->x2, &c->xbig, 3, 1, F2));
    int64_t os[4] = {H, W, B, c->l->n_out};
    RL_TRY(rl_tensor_empty(&c->gout, dt, RL_DEVICE_CPU, 4, os));
    RL_TRY(rl_op_uniform(&c->gout, &r, -1, 1));
    for (int i = 0; i < 2; i++)
        RL_TRY(rl_tensor_empty_like(&c->gin[i], i ? &c->x2 : &c->x1));

    RL_TRY(make_layer(&g->l, cf));
    RL_TRY(rl_op_to(&g->pv, &c->pv, dt, DEV));
    RL_TRY(rl_op_to(&g->pg, &c->pg, dt, DEV));
    RL_TRY(gc_view_params(g->l, &g->pv, &g->pg));
    RL_TRY(rl_op_to(&g->x1, &c->x1, dt, DEV));
    RL_TRY(rl_op_to(&g->xbig, &c->xbig, dt, DEV));
    RL_TRY(rl_tensor_narrow(&g->x2, &g->xbig, 3, 1, F2));
    RL_TRY(rl_op_to(&g->gout, &c->gout, dt, DEV));
    int64_t g1[4] = {H, W, B, F1}, g2[4] = {H, W, B, F2};
    RL_TRY(rl_tensor_empty(&g->gin[0], dt, DEV, 4, g1));
    RL_TRY(rl_tensor_empty(&g->gin[1], dt, DEV, 4, g2));
    return RL_OK;
}

/* grad_out 0 on padding (the layer contract) */
static rl_status mask_gout(side *c, side *g, const int32_t (*sz)[2], rl_dtype dt) {
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int64_t b = 0; b < B; b++)
                if (y >= sz[b][0] || x >= sz[b][1])
                    for (int64_t f = 0; f < c->l->n_out; f++) {
                        int64_t idx[4] = {y, x, b, f};
                        rl_tensor_set(&c->gout, idx, 0.0);
                    }
    rl_tensor_release(&g->gout);
    return rl_op_to(&g->gout, &c->gout, dt, DEV);
}

static rl_status run_batch(side *s, const rl_tensor *sizes) {
    rl_layer_io io = {0};
    io.n_in = 2;
    io.in[0] = &s->x1;
    io.in[1] = &s->x2;
    io.sizes = sizes;
    io.train = true;
    RL_TRY(rl_op_fill(&s->gin[0], NAN));
    RL_TRY(rl_op_fill(&s->gin[1], NAN));
    RL_TRY(s->l->ops->forward(s->l, &io));
    rl_tensor *gp[2] = {&s->gin[0], &s->gin[1]};
    return s->l->ops->backward(s->l, &io, &s->gout, gp);
}

static void test_config(const config *cf, rl_dtype dt) {
    char tag[96];
    snprintf(tag, sizeof tag, "%s/%s/%s/%s", cf->dirs, cf->combine, cf->cell, rl_dtype_name(dt));
    double rtol = dt == RL_FLOAT32 ? 1e-5 : 1e-10;
    side c, g;
    rl_status st = make_sides(cf, dt, &c, &g);
    CHECK_OK(st);
    int64_t ss[2] = {B, 2};
    rl_tensor sa = {0}, sb = {0};
    CHECK_OK(rl_tensor_empty(&sa, RL_INT32, RL_DEVICE_CPU, 2, ss));
    CHECK_OK(rl_tensor_empty(&sb, RL_INT32, RL_DEVICE_CPU, 2, ss));
    if (st == RL_OK && sa.storage && sb.storage) {
        memcpy(rl_tensor_data(&sa), SIZES_A, sizeof SIZES_A);
        memcpy(rl_tensor_data(&sb), SIZES_B, sizeof SIZES_B);
        const rl_tensor *batches[3] = {&sa, &sb, &sa};
        const int32_t(*szs[3])[2] = {SIZES_A, SIZES_B, SIZES_A};
        for (int i = 0; i < 3; i++) {
            char t2[128];
            snprintf(t2, sizeof t2, "%s batch %d", tag, i + 1);
            CHECK_OK(mask_gout(&c, &g, szs[i], dt));
            CHECK_OK(run_batch(&c, batches[i]));
            CHECK_OK(run_batch(&g, batches[i]));
            compare(t2, "output", &c.l->out, &g.l->out, rtol);
            compare(t2, "input 1 gradient", &c.gin[0], &g.gin[0], rtol);
            compare(t2, "input 2 gradient", &c.gin[1], &g.gin[1], rtol);
            for (int p = 0; p < c.l->n_params; p++) {
                char what[64];
                snprintf(what, sizeof what, "d%s", c.l->params[p].name);
                compare(t2, what, &c.l->params[p].grad, &g.l->params[p].grad, rtol);
            }
        }
    }
    rl_tensor_release(&sa);
    rl_tensor_release(&sb);
    side_free(&c);
    side_free(&g);
}

/* CPU and CUDA arguments mixed: refused, naming the layer. */
static void test_mixed(void) {
    const config cf = {"tl,br", "concat", "standard"};
    side c, g;
    CHECK_OK(make_sides(&cf, RL_FLOAT32, &c, &g));
    int64_t ss[2] = {B, 2};
    rl_tensor sa = {0};
    CHECK_OK(rl_tensor_empty(&sa, RL_INT32, RL_DEVICE_CPU, 2, ss));
    if (sa.storage) memcpy(rl_tensor_data(&sa), SIZES_A, sizeof SIZES_A);
    rl_layer_io io = {0};
    io.n_in = 2;
    io.in[0] = &g.x1;
    io.in[1] = &g.x2;
    io.sizes = &sa;
    /* CUDA inputs, CPU parameters */
    CHECK(c.l->ops->forward(c.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "img") != NULL);
    /* CUDA layer, CPU grad_out and CPU input gradients */
    CHECK_OK(g.l->ops->forward(g.l, &io));
    rl_tensor *gp[2] = {&c.gin[0], &c.gin[1]};
    CHECK(g.l->ops->backward(g.l, &io, &c.gout, gp) != RL_OK);
    CHECK(strstr(rl_errmsg(), "img") && strstr(rl_errmsg(), "grad_out"));
    CHECK_OK(g.l->ops->forward(g.l, &io));
    CHECK(g.l->ops->backward(g.l, &io, &g.gout, gp) != RL_OK);
    CHECK(strstr(rl_errmsg(), "img") && strstr(rl_errmsg(), "input gradient"));
    /* one input on each device */
    io.in[1] = &c.x2;
    CHECK(g.l->ops->forward(g.l, &io) != RL_OK);
    CHECK(strstr(rl_errmsg(), "img") != NULL);
    rl_tensor_release(&sa);
    side_free(&c);
    side_free(&g);
}

static void run_all(void) {
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++) {
        test_config(&CONFIGS[i], RL_FLOAT32);
        test_config(&CONFIGS[i], RL_FLOAT64);
    }
    if (DEV.type == RL_CUDA) test_mixed();
}

int main(void) {
    rl_ops_init();
    DEV = device_side("the mixed-device checks");
    run_all();
    TEST_MAIN_END();
}
