#include "matrix.h"

#include "../core/blas.h"
#ifdef RL_WITH_CUDA
#include "../kernels/cuda/lstm_cuda.h"
#endif

rl_status rl_mat_gemm(rl_device dev, void *stream, rl_dtype dt, bool ta, bool tb, int64_t m,
                      int64_t n, int64_t k, rl_mat a, rl_mat b, double beta, rl_mat c) {
    if (m == 0 || n == 0) return RL_OK;
#ifdef RL_WITH_CUDA
    if (dev.type == RL_CUDA)
        return rl_lstm_cuda_gemm(stream, dt, ta, tb, m, n, k, 1.0, a.p, a.ld, b.p, b.ld, beta, c.p,
                                 c.ld);
#else
    (void)dev, (void)stream;
#endif
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
                        "layer '%s' (%s): parameter %s must be a contiguous %s tensor on %s "
                        "(the inputs' device), got %s",
                        l->name, l->ops->class_name, what, rl_dtype_name(dt), d,
                        t->storage ? rl_tensor_describe(t, s, sizeof s) : "nothing");
    }
    m->p = rl_tensor_data(t);
    m->ld = t->ndim == 2 ? t->shape[1] : 1;
    return RL_OK;
}
