/* The MDLSTM training step that bench/mdlstm.c (CPU) and bench/mdlstm_gpu.c (CUDA) time: one
 * 4-direction mdlstm layer over (H, W, B, F) images of full size, forward then backward. Include
 * after bench.h. */
#ifndef RL_BENCH_MDLSTM_MODEL_H
#define RL_BENCH_MDLSTM_MODEL_H

#include <string.h>

#include "bench.h"

typedef struct {
    int64_t H, W, B, F, D;
} shape;

static const shape SHAPES[] = {{32, 256, 16, 16, 16}, {16, 256, 10, 105, 120}};
enum { NDIRS = 4 };

typedef struct {
    rl_layer *l;
    rl_tensor x, sizes, gout, gin;
    rl_layer_io io;
} model;

/* The layer (parameters from g), a random input and output gradient, on dev; sizes on the CPU. */
static inline void model_init(model *m, const shape *s, rl_rng *g, rl_device dev) {
    memset(m, 0, sizeof *m);
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", (double)s->D);
    rl_options o = gc_options(&t);
    bench_check(rl_layer_create(&m->l, "mdlstm", "md", &o, 1, &s->F), "create");
    bench_layer_params(m->l, g, dev);
    int64_t xs[4] = {s->H, s->W, s->B, s->F}, ss[2] = {s->B, 2},
            os[4] = {s->H, s->W, s->B, NDIRS * s->D};
    bench_normal(&m->x, 4, xs, g, 1.0, dev);
    bench_check(rl_tensor_empty(&m->gin, RL_FLOAT32, dev, 4, xs), "gin");
    bench_normal(&m->gout, 4, os, g, 0.1, dev);
    bench_check(rl_tensor_empty(&m->sizes, RL_INT32, RL_DEVICE_CPU, 2, ss), "sizes");
    int32_t *sz = rl_tensor_data(&m->sizes);
    for (int64_t b = 0; b < s->B; b++) {
        sz[2 * b] = (int32_t)s->H;
        sz[2 * b + 1] = (int32_t)s->W;
    }
    m->io.n_in = 1;
    m->io.in[0] = &m->x;
    m->io.sizes = &m->sizes;
    m->io.train = true;
}

static inline void model_free(model *m) {
    rl_layer_free(m->l);
    rl_tensor_release(&m->x);
    rl_tensor_release(&m->sizes);
    rl_tensor_release(&m->gout);
    rl_tensor_release(&m->gin);
}

/* reps training steps, queued (a device's work is not waited for) */
static inline void model_steps(model *m, int64_t reps) {
    rl_tensor *gin[1] = {&m->gin};
    for (int64_t r = 0; r < reps; r++) {
        bench_check(m->l->ops->forward(m->l, &m->io), "mdlstm forward");
        bench_check(m->l->ops->backward(m->l, &m->io, &m->gout, gin), "mdlstm backward");
    }
}

#endif
