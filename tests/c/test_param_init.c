/* The orthogonal initialisation of recurrent matrices (rl_param_init, RL_INIT_ORTHOGONAL): the
 * rows of each (r, w) block orthonormal, and the values exactly those of modified Gram-Schmidt
 * run one row at a time (the reference below) on the same normal draws, so that a seed gives
 * the same network whatever the implementation's grouping of rows. */
#include <stdlib.h>
#include <string.h>

#include "../../core/rng.h"
#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "../../layers/layer.h"
#include "check.h"

static void reference(double *m, int64_t r, int64_t c, int64_t w) {
    for (int64_t blk = 0; blk + w <= c; blk += w)
        for (int64_t i = 0; i < r; i++) {
            double *ri = m + i * c + blk;
            for (int64_t j = 0; j < i; j++) {
                const double *rj = m + j * c + blk;
                double dot = 0;
                for (int64_t k = 0; k < w; k++)
                    dot += ri[k] * rj[k];
                for (int64_t k = 0; k < w; k++)
                    ri[k] -= dot * rj[k];
            }
            double norm = 0;
            for (int64_t k = 0; k < w; k++)
                norm += ri[k] * ri[k];
            norm = sqrt(norm);
            for (int64_t k = 0; k < w; k++)
                ri[k] = norm > 0 ? ri[k] / norm : 0;
        }
}

static void check_shape(int64_t r, int64_t c, double gain) {
    int64_t shape[2] = {r, c};
    int64_t w = c % r == 0 ? r : c;
    rl_param p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "U");
    p.ndim = 2;
    p.shape[0] = r;
    p.shape[1] = c;
    p.init = RL_INIT_ORTHOGONAL;
    p.init_a = gain;
    CHECK_OK(rl_tensor_empty(&p.value, RL_FLOAT32, RL_DEVICE_CPU, 2, shape));
    rl_rng g, g2;
    rl_rng_seed(&g, 1234 + (uint64_t)(r * 1000 + c));
    g2 = g;
    CHECK_OK(rl_param_init(&p, &g));

    /* the same draws, the reference's order of operations */
    rl_tensor ref = {0};
    CHECK_OK(rl_tensor_empty(&ref, RL_FLOAT64, RL_DEVICE_CPU, 2, shape));
    CHECK_OK(rl_op_normal(&ref, &g2, 0.0, 1.0));
    double *m = rl_tensor_data(&ref);
    reference(m, r, c, w);
    const float *v = rl_tensor_data(&p.value);
    int64_t differ = 0;
    for (int64_t i = 0; i < r * c; i++)
        if (v[i] != (float)(m[i] * (gain != 0.0 ? gain : 1.0))) differ++;
    CHECK(differ == 0);
    if (differ)
        fprintf(stderr, "  (%lld x %lld): %lld values differ\n", (long long)r, (long long)c,
                (long long)differ);

    /* orthonormal rows in each block (scaled by the gain) */
    double worst = 0;
    for (int64_t blk = 0; blk + w <= c; blk += w)
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j <= i; j++) {
                double dot = 0;
                for (int64_t k = 0; k < w; k++)
                    dot += m[i * c + blk + k] * m[j * c + blk + k];
                double e = fabs(dot - (i == j ? 1.0 : 0.0));
                if (e > worst) worst = e;
            }
    CHECK(worst < 1e-9);
    rl_tensor_release(&ref);
    rl_tensor_release(&p.value);
}

int main(void) {
    /* square blocks (an lstm's U, (H, 4H); a gru's (H, 3H)), rows not a multiple of the group,
     * whole rows (an lstmp's (P, 4H)), a single row, and a gain */
    check_shape(1, 4, 1.0);
    check_shape(7, 28, 1.0);
    check_shape(8, 24, 1.0);
    check_shape(19, 76, 1.0);
    check_shape(37, 111, 0.5);
    check_shape(20, 30, 1.0);
    check_shape(130, 520, 1.0);
    TEST_MAIN_END();
}
