/* Stacked recurrent layers on a GPU against the CPU: the case of a race between layer streams.
 * Each lstm or gru layer queues its work on its own stream, so a layer reading what
 * another layer wrote (the level below's outputs in forward, the level above's input gradients
 * in backward) depends on the producer/consumer events of kernels/cuda/context.h. Networks: a
 * 3-level unidirectional stack and a 2-level bidirectional one (level 2 reads both directions of
 * level 1; the lower output's gradient is the sum over the directions above), of lstm and of gru
 * layers, float64, T=19 with ragged lengths; every call of a network queued back to back, two
 * batches with no synchronisation between them (the gradients accumulate), then the top outputs,
 * every parameter gradient and the input gradient are compared with the CPU layers' (1e-10 of
 * each tensor's largest magnitude).
 *
 * Without a CUDA device (or build) the "device" side is the CPU itself: the whole harness (the
 * network, both runs, every comparison) runs and must pass, so a broken test shows here too; the
 * line printed says which side ran. Run by `make test-gpu`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "tests/c/check.h"
#include "tests/c/gradcheck.h"
#include "tests/gpu/device_side.h"

enum { T = 19, B = 4, F = 6, H = 7, MAXL = 3, MAXD = 2 };
static const int32_t LENS[B] = {19, 11, 1, 6};

/* ---- a network on one device ---- */

typedef struct {
    const char *cls;
    int levels, dirs;
} topology;

typedef struct {
    const topology *tp;
    rl_device dev;
    rl_layer *l[MAXL][MAXD];
    rl_tensor x, len, gtop[MAXD];
    rl_tensor gin[MAXL][MAXD][MAXD]; /* grad_in of layer (li, d) for input k */
    rl_tensor gx;                    /* dLoss/dx: the sum over the bottom level's directions */
} net;

/* The network's layers on dev with the parameter values of `like` (NULL: random, and x, gtop
 * random too); inputs are copied from `like`. */
static bool net_build(net *n, const topology *tp, rl_device dev, const net *like) {
    memset(n, 0, sizeof *n);
    n->tp = tp;
    n->dev = dev;
    int64_t xs[3] = {T, B, F}, hs[3] = {T, B, H}, ls[1] = {B};
    for (int li = 0; li < tp->levels; li++) {
        for (int d = 0; d < tp->dirs; d++) {
            int n_in = li ? tp->dirs : 1;
            int64_t in_dims[MAXD] = {li ? H : F, H};
            char name[32];
            snprintf(name, sizeof name, "%s%d%c", tp->cls, li + 1, d ? 'b' : 'f');
            gc_opts t = {0};
            gc_opt_num(&t, "n_out", H);
            gc_opt_num(&t, "direction", d ? -1 : 1);
            rl_options o = gc_options(&t);
            rl_status st = rl_layer_create(&n->l[li][d], tp->cls, name, &o, n_in, in_dims);
            CHECK_OK(st);
            if (st != RL_OK) return false;
            rl_layer *l = n->l[li][d];
            for (int p = 0; p < l->n_params; p++) {
                rl_param *pp = &l->params[p];
                if (like) {
                    pp->value = copy_to(&like->l[li][d]->params[p].value, dev);
                } else {
                    rl_tensor c =
                        rand_tensor(RL_FLOAT64, pp->ndim, pp->shape, -0.5, 0.5, NULL, 0.0);
                    pp->value = copy_to(&c, dev);
                    rl_tensor_release(&c);
                }
                CHECK_OK(rl_tensor_empty(&pp->grad, RL_FLOAT64, dev, pp->ndim, pp->shape));
                CHECK_OK(rl_op_fill(&pp->grad, 0.0));
            }
            for (int k = 0; k < n_in && li > 0; k++)
                CHECK_OK(rl_tensor_empty(&n->gin[li][d][k], RL_FLOAT64, dev, 3, hs));
            if (li == 0) CHECK_OK(rl_tensor_empty(&n->gin[0][d][0], RL_FLOAT64, dev, 3, xs));
        }
    }
    CHECK_OK(rl_tensor_empty(&n->len, RL_INT32, RL_DEVICE_CPU, 1, ls));
    if (!n->len.storage) return false;
    memcpy(rl_tensor_data(&n->len), LENS, sizeof LENS);
    rl_tensor x = like ? like->x : rand_tensor(RL_FLOAT64, 3, xs, -1.0, 1.0, NULL, 0.0);
    n->x = copy_to(&x, dev);
    if (!like) rl_tensor_release(&x);
    for (int d = 0; d < tp->dirs; d++) {
        rl_tensor g = like ? like->gtop[d] : rand_tensor(RL_FLOAT64, 3, hs, -1.0, 1.0, LENS, 0.0);
        n->gtop[d] = copy_to(&g, dev);
        if (!like) rl_tensor_release(&g);
    }
    CHECK_OK(rl_tensor_empty(&n->gx, RL_FLOAT64, dev, 3, xs));
    return true;
}

/* One batch: forward bottom up, backward top down, every call queued back to back; a lower
 * output's gradient is gin[li][0][k] += gin[li][d][k] over the directions d above (a tensor op),
 * the bottom's sums into gx. */
static bool net_step(net *n) {
    const topology *tp = n->tp;
    rl_layer_io io[MAXL][MAXD];
    for (int li = 0; li < tp->levels; li++)
        for (int d = 0; d < tp->dirs; d++) {
            rl_layer_io *p = &io[li][d];
            memset(p, 0, sizeof *p);
            p->lengths = &n->len;
            p->train = true;
            p->n_in = li ? tp->dirs : 1;
            for (int k = 0; k < p->n_in; k++)
                p->in[k] = li ? &n->l[li - 1][k]->out : &n->x;
        }
    rl_status st = RL_OK;
    for (int li = 0; li < tp->levels && st == RL_OK; li++)
        for (int d = 0; d < tp->dirs && st == RL_OK; d++)
            CHECK_OK(st = n->l[li][d]->ops->forward(n->l[li][d], &io[li][d]));
    rl_tensor *gout[MAXD] = {&n->gtop[0], &n->gtop[1]};
    for (int li = tp->levels - 1; li >= 0 && st == RL_OK; li--) {
        for (int d = 0; d < tp->dirs && st == RL_OK; d++) {
            rl_tensor *gin[MAXD] = {&n->gin[li][d][0], &n->gin[li][d][1]};
            CHECK_OK(st = n->l[li][d]->ops->backward(n->l[li][d], &io[li][d], gout[d], gin));
        }
        int n_in = li ? tp->dirs : 1;
        for (int k = 0; k < n_in && st == RL_OK; k++) {
            for (int d = 1; d < tp->dirs && st == RL_OK; d++)
                CHECK_OK(st = rl_op_binary(&n->gin[li][0][k], &n->gin[li][0][k], &n->gin[li][d][k],
                                           RL_BIN_ADD));
            gout[k] = &n->gin[li][0][k];
        }
    }
    if (st == RL_OK) CHECK_OK(st = rl_op_copy(&n->gx, &n->gin[0][0][0]));
    return st == RL_OK;
}

static void net_free(net *n) {
    for (int li = 0; li < MAXL; li++)
        for (int d = 0; d < MAXD; d++) {
            rl_layer_free(n->l[li][d]);
            for (int k = 0; k < MAXD; k++)
                rl_tensor_release(&n->gin[li][d][k]);
        }
    rl_tensor *ts[] = {&n->x, &n->len, &n->gtop[0], &n->gtop[1], &n->gx};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

/* The CPU network and its copy on dev, two batches each, then everything compared. */
static void test_stack(const topology *tp, rl_device dev) {
    net ref, got;
    char tag[64];
    snprintf(tag, sizeof tag, "%s %d levels x %d dir", tp->cls, tp->levels, tp->dirs);
    bool ok = net_build(&ref, tp, RL_DEVICE_CPU, NULL);
    ok = ok && net_build(&got, tp, dev, &ref);
    for (int rep = 0; rep < 2 && ok; rep++)
        ok = net_step(&ref) && net_step(&got);
    if (ok) CHECK_OK(rl_op_synchronize(dev));
    for (int d = 0; d < tp->dirs && ok; d++)
        compare(tag, d ? "top out (dir -1)" : "top out", &ref.l[tp->levels - 1][d]->out,
                &got.l[tp->levels - 1][d]->out, 1e-10);
    if (ok) compare(tag, "dx", &ref.gx, &got.gx, 1e-10);
    for (int li = 0; li < tp->levels && ok; li++)
        for (int d = 0; d < tp->dirs; d++) {
            rl_layer *a = ref.l[li][d], *b = got.l[li][d];
            for (int p = 0; p < a->n_params; p++) {
                char what[160];
                snprintf(what, sizeof what, "%s d%s", a->name, a->params[p].name);
                compare(tag, what, &a->params[p].grad, &b->params[p].grad, 1e-10);
            }
        }
    if (!ok) {
        check_failed++;
        fprintf(stderr, "FAIL %s: the network did not run (%s)\n", tag, rl_errmsg());
    }
    net_free(&ref);
    net_free(&got);
}

int main(void) {
    rl_ops_init();
    rl_device dev = device_side(NULL);
    const topology tps[4] = {{"lstm", 3, 1}, {"lstm", 2, 2}, {"gru", 3, 1}, {"gru", 2, 2}};
    for (int i = 0; i < 4; i++)
        test_stack(&tps[i], dev);
    TEST_MAIN_END();
}
