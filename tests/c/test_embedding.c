/* The embedding layer's class grouping (rl_embedding_groups), which the CUDA backward's
 * deterministic scatter-add walks (kernels/cuda/embedding.cu): checked without a device against
 * the frames themselves, and the kernel's summation (each class's frames added in list order into
 * a running sum started from dW) replayed on the host must equal the CPU layer's gradient bit for
 * bit (float32), on a ragged batch with padding values outside the vocabulary and strided
 * indices. */
#include <stdio.h>
#include <string.h>

#include "kernels/ops.h"
#include "layers/layer.h"
#include "layers/layers.h"
#include "tests/c/check.h"

enum { T = 9, B = 4, V = 6, D = 5 };
static const int32_t LENS[B] = {9, 3, 1, 6};

static uint64_t rand_state = 0x9E3779B97F4A7C15u;
static uint32_t rnd(void) {
    rand_state ^= rand_state << 13;
    rand_state ^= rand_state >> 7;
    rand_state ^= rand_state << 17;
    return (uint32_t)(rand_state >> 32);
}

static void test_groups(void) {
    /* x: a (T, B) view with stride (2B, 2) into a wider buffer; padding holds -1 and V */
    int64_t ws[2] = {T, 2 * B}, ls[1] = {B};
    rl_tensor wide = {0}, x = {0}, len = {0};
    CHECK_OK(rl_tensor_empty(&wide, RL_INT32, RL_DEVICE_CPU, 2, ws));
    CHECK_OK(rl_tensor_empty(&len, RL_INT32, RL_DEVICE_CPU, 1, ls));
    if (!wide.storage || !len.storage) return;
    int32_t *w = rl_tensor_data(&wide);
    for (int64_t i = 0; i < T * 2 * B; i++)
        w[i] = i % 2 ? V : (int32_t)(rnd() % V);
    memcpy(rl_tensor_data(&len), LENS, sizeof LENS);
    rl_tensor_share(&x, &wide);
    x.shape[1] = B;
    x.stride[1] = 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < B; b++)
            if (t >= LENS[b]) w[t * 2 * B + 2 * b] = -1;
    int32_t pairs[2 * T * B], out[3 * T * B + 1];
    int64_t n_used = rl_embedding_groups(&x, &len, pairs, out);
    const int32_t *start = out, *cls = out + n_used + 1, *rows = cls + n_used;
    int64_t nv = 0;
    for (int b = 0; b < B; b++)
        nv += LENS[b];
    CHECK(n_used >= 1 && n_used <= V);
    CHECK(start[0] == 0 && start[n_used] == nv);
    /* classes ascending, each class's frames ascending and really of that class, every valid frame
     * once */
    int seen[T * B] = {0};
    for (int64_t u = 0; u < n_used; u++) {
        CHECK(u == 0 || cls[u] > cls[u - 1]);
        CHECK(start[u + 1] > start[u]);
        for (int32_t k = start[u]; k < start[u + 1]; k++) {
            int32_t r = rows[k], t = r / B, b = r % B;
            CHECK(k == start[u] || r > rows[k - 1]);
            CHECK(t < LENS[b] && w[t * 2 * B + 2 * b] == cls[u]);
            seen[r]++;
        }
    }
    int once = 1;
    for (int64_t r = 0; r < T * B; r++)
        once = once && seen[r] == (r / B < LENS[r % B] ? 1 : 0);
    CHECK(once);

    /* the kernel's sums replayed on the host against the CPU layer's scatter (float32) */
    int64_t gs[2] = {T * B, D}, vs[2] = {V, D};
    rl_tensor g = {0}, dw_cpu = {0};
    CHECK_OK(rl_tensor_empty(&g, RL_FLOAT32, RL_DEVICE_CPU, 2, gs));
    CHECK_OK(rl_tensor_empty(&dw_cpu, RL_FLOAT32, RL_DEVICE_CPU, 2, vs));
    if (g.storage && dw_cpu.storage) {
        float *gp = rl_tensor_data(&g), *dc = rl_tensor_data(&dw_cpu), dk[V * D];
        for (int64_t i = 0; i < T * B * D; i++)
            gp[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f + 1e-4f * (float)(rnd() % 7);
        for (int64_t i = 0; i < V * D; i++)
            dc[i] = dk[i] = 0.25f;
        rl_sparse_rows_add(&g, &x, &len, &dw_cpu, true);
        for (int64_t u = 0; u < n_used; u++)
            for (int64_t j = 0; j < D; j++) {
                float acc = dk[cls[u] * D + j];
                for (int32_t k = start[u]; k < start[u + 1]; k++)
                    acc += gp[rows[k] * D + j];
                dk[cls[u] * D + j] = acc;
            }
        CHECK(memcmp(dk, dc, sizeof dk) == 0);
    }
    rl_tensor *ts[] = {&wide, &x, &len, &g, &dw_cpu};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        rl_tensor_release(ts[i]);
}

int main(void) {
    rl_ops_init();
    test_groups();
    TEST_MAIN_END();
}
