#include "matrix.h"

#include "../core/blas.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cuda/context.h"
#include "../kernels/ops.h"

rl_status rl_mat_gemm(rl_device dev, void *stream, rl_dtype dt, bool ta, bool tb, int64_t m,
                      int64_t n, int64_t k, rl_mat a, rl_mat b, double beta, rl_mat c) {
    if (m == 0 || n == 0) return RL_OK;
#ifdef RL_WITH_CUDA
    if (dev.type == RL_CUDA)
        return rl_cuda_gemm(stream, dt, ta, tb, m, n, k, 1.0, a.p, a.ld, b.p, b.ld, beta, c.p,
                            c.ld);
#else
    (void)dev, (void)stream;
#endif
    rl_bf16_ctx *bf16 = dt == RL_FLOAT32 ? rl_bf16_active() : NULL;
    if (bf16)
        return rl_gemm_bf16_ctx(bf16, ta, tb, m, n, k, 1.0f, a.p, a.ld, b.p, b.ld, (float)beta, c.p,
                                c.ld);
    if (dt == RL_FLOAT32)
        rl_blas_sgemm(ta, tb, m, n, k, 1.0f, a.p, a.ld, b.p, b.ld, (float)beta, c.p, c.ld);
    else
        rl_blas_dgemm(ta, tb, m, n, k, 1.0, a.p, a.ld, b.p, b.ld, beta, c.p, c.ld);
    return RL_OK;
}

rl_status rl_param_mat(const rl_layer *l, const rl_tensor *t, const char *what, rl_dtype dt,
                       rl_device dev, rl_mat *m) {
    char s[96], d[32];
    if (!t->storage || !rl_tensor_is_contiguous(t) || t->dtype != dt ||
        !rl_device_eq(rl_tensor_device(t), dev)) {
        rl_device_name(dev, d, sizeof d);
        return rl_error(RL_EARG,
                        RL_LAYER_WHERE ": parameter %s must be a contiguous %s tensor on %s "
                                       "(the inputs' device), got %s",
                        l->name, l->ops->class_name, what, rl_dtype_name(dt), d,
                        t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing");
    }
    m->p = rl_tensor_data(t);
    m->ld = t->ndim == 2 ? t->shape[1] : 1;
    return RL_OK;
}

bool rl_mat_fold_tb(const rl_tensor *x, rl_mat *m) {
    if (x->shape[2] > 1 && x->stride[2] != 1) return false;
    if (x->shape[0] > 1 && x->stride[0] != x->shape[1] * x->stride[1]) return false;
    int64_t ld = x->shape[1] > 1 ? x->stride[1] : (x->shape[0] > 1 ? x->stride[0] : x->shape[2]);
    if (ld < x->shape[2]) return false;
    m->p = rl_tensor_data(x);
    m->ld = ld > 0 ? ld : 1;
    return true;
}

rl_status rl_buffer_ensure_synced(rl_tensor *buf, rl_dtype dt, rl_device dev, int ndim,
                                  const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    rl_storage *s = buf->storage;
    bool fits = s && rl_device_eq(s->device, dev) && s->nbytes >= (size_t)n * rl_dtype_size(dt);
    if (!fits && s && s->device.type != RL_CPU) RL_TRY(rl_op_synchronize(s->device));
    if (!fits && dev.type != RL_CPU) RL_TRY(rl_op_synchronize(dev));
    return rl_buffer_ensure(buf, dt, dev, ndim, shape);
}
