/* Host side of kernels/cudnn_layout.h: the packed layout, its check, pack and unpack. */
#include "cudnn_layout.h"

#include <stdlib.h>
#include <string.h>

int64_t rl_cudnn_layout_packed(rl_cudnn_layout *L, rl_cudnn_cell cell, int64_t F, int64_t H) {
    int gates = cell == RL_CUDNN_GRU ? 3 : 4;
    bool two_biases = cell == RL_CUDNN_GRU;
    *L = (rl_cudnn_layout){.F = F, .H = H, .gates = gates, .two_biases = two_biases};
    int64_t off = 0;
    for (int id = 0; id < 2 * gates; id++) {
        int64_t in = id < gates ? F : H;
        rl_cudnn_mat *m = id < gates ? &L->w[id] : &L->u[id - gates];
        *m = (rl_cudnn_mat){off, in, 1};
        off += H * in;
    }
    for (int id = 0; id < 2 * gates; id++) {
        int64_t *b = id < gates ? &L->b[id] : &L->rb[id - gates];
        *b = -1;
        if (id < gates || two_biases) {
            *b = off;
            off += H;
        }
    }
    return off;
}

/* Marks place p of the space as taken (one bit per place); an error when it is outside or taken
 * twice. */
static rl_status mark(unsigned char *used, int64_t n, int64_t p, const char *what, int64_t k,
                      const char *fn) {
    if (p < 0 || p >= n)
        return rl_error(RL_EDEVICE,
                        "%s: element %lld of %s maps to %lld, outside the weight space of %lld", fn,
                        (long long)k, what, (long long)p, (long long)n);
    unsigned char bit = (unsigned char)(1u << (p & 7));
    if (used[p >> 3] & bit)
        return rl_error(RL_EDEVICE,
                        "%s: element %lld of %s maps to %lld, which another parameter already uses",
                        fn, (long long)k, what, (long long)p);
    used[p >> 3] |= bit;
    return RL_OK;
}

rl_status rl_cudnn_layout_check(const rl_cudnn_layout *L, int64_t n, const char *fn) {
    if (L->gates < 3 || L->gates > 4 || L->F < 1 || L->H < 1 || n < 1)
        return rl_error(RL_EARG, "%s: bad layout (gates %d, F=%lld, H=%lld, space %lld)", fn,
                        L->gates, (long long)L->F, (long long)L->H, (long long)n);
    for (int q = 0; q < L->gates; q++)
        if (L->b[q] < 0 || (L->two_biases && L->rb[q] < 0))
            return rl_error(RL_EDEVICE, "%s: cuDNN reports no %s bias for gate %d", fn,
                            L->b[q] < 0 ? "input" : "recurrent", q);
    size_t bytes = (size_t)(n / 8 + 1);
    unsigned char *used = calloc(bytes, 1);
    if (!used) return rl_error(RL_ENOMEM, "%s: out of host memory (%zu bytes)", fn, bytes);
    static const char *names[4] = {"W", "U", "b", "b_h"};
    rl_status st = RL_OK;
    int64_t count = rl_cudnn_layout_count(L);
    for (int64_t e = 0; e < count && st == RL_OK; e++) {
        int which;
        int64_t k, p = rl_cudnn_layout_map(L, e, &which, &k);
        st = mark(used, n, p, names[which], k, fn);
        int64_t z = which == 2 ? rl_cudnn_layout_unused_bias(L, k) : -1;
        if (st == RL_OK && z >= 0) st = mark(used, n, z, "the unused recurrent bias", k, fn);
    }
    free(used);
    return st;
}

/* Element by element in bytes: the same for float32 and float64, and bit-exact both ways. */
static void convert_host(const rl_cudnn_layout *L, rl_dtype dt, bool to_cudnn, char *const ours[4],
                         char *space) {
    size_t es = rl_dtype_size(dt);
    int64_t n = rl_cudnn_layout_count(L);
    for (int64_t e = 0; e < n; e++) {
        int which;
        int64_t k, p = rl_cudnn_layout_map(L, e, &which, &k);
        char *o = ours[which] + (size_t)k * es, *t = space + (size_t)p * es;
        if (!to_cudnn) {
            memcpy(o, t, es);
            continue;
        }
        memcpy(t, o, es);
        int64_t z = which == 2 ? rl_cudnn_layout_unused_bias(L, k) : -1;
        if (z >= 0) memset(space + (size_t)z * es, 0, es);
    }
}

void rl_cudnn_layout_pack_host(const rl_cudnn_layout *L, rl_dtype dt, const void *W, const void *U,
                               const void *b, const void *bh, void *space) {
    char *ours[4] = {(char *)W, (char *)U, (char *)b, (char *)bh};
    convert_host(L, dt, true, ours, space);
}

void rl_cudnn_layout_unpack_host(const rl_cudnn_layout *L, rl_dtype dt, const void *space, void *W,
                                 void *U, void *b, void *bh) {
    char *ours[4] = {W, U, b, bh};
    convert_host(L, dt, false, ours, (char *)space);
}
