/* The mixed-device checks of the recurrent layers, without a GPU: in a build without CUDA a
 * stand-in backend registered as "cuda" keeps its tensors in host memory, so tensors on cuda:0
 * exist and every device comparison runs, while no kernel is ever reached (each case must fail
 * in its checks). A CUDA build registers the real backend: there tests/gpu/test_lstm_parity.c
 * runs the same cases on a GPU, and this program says so and checks nothing else.
 *
 * The order of the checks is what is tested: an lstm or gru whose parameters are on the CPU,
 * given CUDA inputs, must name a parameter even when it holds a CPU initial state (the state
 * is checked against the inputs' device too, and naming it would hide the real mistake). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"

#include "../../core/device.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "../../layers/layers.h"

enum { T = 3, B = 2, F = 4, H = 5 };

static int host_count(void) { return 1; }

static rl_status host_alloc(int index, size_t nbytes, void **ptr) {
    (void)index;
    *ptr = malloc(nbytes ? nbytes : 1);
    return *ptr ? RL_OK : rl_error(RL_ENOMEM, "stand-in device: out of memory");
}

static void host_free(int index, void *ptr, size_t nbytes) {
    (void)index, (void)nbytes;
    free(ptr);
}

static rl_status host_memcpy(void *dst, rl_device ddev, const void *src, rl_device sdev,
                             size_t nbytes) {
    (void)ddev, (void)sdev;
    if (nbytes) memcpy(dst, src, nbytes);
    return RL_OK;
}

static rl_status host_sync(int index) {
    (void)index;
    return RL_OK;
}

static const rl_device_backend stand_in = {"host memory standing in for cuda", host_count,
                                           host_alloc, host_free, host_memcpy, host_sync};

static const rl_device CUDA0 = {RL_CUDA, 0};

/* A layer of class cls with its parameters (values and gradients) on the CPU. */
static rl_layer *cpu_layer(const char *cls) {
    gc_opts t = {0};
    gc_opt_num(&t, "n_out", H);
    rl_options o = gc_options(&t);
    int64_t in_dims[1] = {F};
    rl_layer *l = NULL;
    CHECK_OK(rl_layer_create(&l, cls, "ref", &o, 1, in_dims));
    for (int i = 0; l && i < l->n_params; i++) {
        rl_param *p = &l->params[i];
        CHECK_OK(rl_tensor_empty(&p->value, RL_FLOAT32, RL_DEVICE_CPU, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->value, 0.1));
        CHECK_OK(rl_tensor_empty(&p->grad, RL_FLOAT32, RL_DEVICE_CPU, p->ndim, p->shape));
        CHECK_OK(rl_op_fill(&p->grad, 0.0));
    }
    return l;
}

static void expect_param_error(const char *cls, rl_layer *l, const rl_tensor *x,
                               const rl_tensor *len, const char *with) {
    rl_layer_io io = {0};
    io.n_in = 1;
    io.in[0] = x;
    io.lengths = len;
    io.train = true;
    rl_status st = l->ops->forward(l, &io);
    CHECK(st != RL_OK);
    const char *msg = rl_errmsg();
    if (!(strstr(msg, "'ref'") && strstr(msg, "parameter"))) {
        check_failed++;
        fprintf(stderr, "FAIL %s with CUDA inputs and %s: the error names no parameter: %s\n", cls,
                with, msg);
    } else {
        check_passed++;
    }
}

static void test_class(const char *cls) {
    rl_layer *l = cpu_layer(cls);
    if (!l) return;
    int64_t xs[3] = {T, B, F}, bs[1] = {B}, hs[2] = {B, H};
    const int lens[B] = {3, 2};
    rl_tensor xh = {0}, x = {0}, len = {0}, h0 = {0}, c0 = {0};
    CHECK_OK(rl_tensor_empty(&xh, RL_FLOAT32, RL_DEVICE_CPU, 3, xs));
    CHECK_OK(rl_op_fill(&xh, 0.5));
    /* the stand-in has no kernels: the copy is the backend's own */
    CHECK_OK(rl_tensor_empty(&x, RL_FLOAT32, CUDA0, 3, xs));
    if (x.storage && xh.storage)
        CHECK_OK(rl_device_memcpy(rl_tensor_data(&x), CUDA0, rl_tensor_data(&xh), RL_DEVICE_CPU,
                                  sizeof(float) * T * B * F));
    CHECK_OK(gc_lengths(&len, bs[0], lens));
    CHECK_OK(rl_tensor_empty(&h0, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_tensor_empty(&c0, RL_FLOAT32, RL_DEVICE_CPU, 2, hs));
    CHECK_OK(rl_op_fill(&h0, 0.0));
    CHECK_OK(rl_op_fill(&c0, 0.0));
    expect_param_error(cls, l, &x, &len, "no initial state");
    if (strcmp(cls, "lstm") == 0)
        CHECK_OK(rl_lstm_set_initial_state(l, &h0, &c0));
    else
        CHECK_OK(rl_gru_set_initial_state(l, &h0));
    expect_param_error(cls, l, &x, &len, "a CPU initial state");
    rl_tensor *ts[] = {&xh, &x, &len, &h0, &c0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
    rl_layer_free(l);
}

int main(void) {
    rl_ops_init();
    if (rl_device_cuda_backend()) {
        printf("this build registers the CUDA backend: the mixed-device cases run in the CUDA=0 "
               "build and on a GPU (tests/gpu/test_lstm_parity.c)\n");
    } else {
        rl_device_register_cuda(&stand_in);
        test_class("lstm");
        test_class("gru");
    }
    TEST_MAIN_END();
}
