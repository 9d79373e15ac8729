/* The CPU loops of the optimizers (kernels/optim.h): one pass over contiguous flat buffers for
 * the update, one for the squared gradient norm, and the column rescaling of max-norm. The
 * formulas come from kernels/optim_rules.h; each loop converts to double, applies them and
 * stores in the buffers' dtype. The dispatcher (kernels/optim.c) has checked dtypes, devices,
 * lengths and contiguity. The update and the norm split their elements over the BLAS threads
 * (rl_optim_cpu_update, rl_optim_cpu_sqnorm). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../core/blas.h"
#include "../optim.h"
#include "../optim_rules.h"
#include "cpu_level.h"
#include "parallel.h"

/* The noise of elements i and i + 1 (i even) comes from one Philox block. */
static double noise_at(const rl_optim_coef *c, rl_philox_block *b, uint64_t i) {
    if (i % 2 == 0) *b = rl_philox(c->noise_seed, 0, c->noise_offset + i / 2);
    return rl_optim_noise(*b, i);
}

/* One loop per method and dtype: `kind` is a constant at each inlined call, so the switch of
 * rl_optim_rule and the state tests fold away, and the loop without noise vectorises (the
 * noise loop stays scalar: Philox and Box-Muller per element). */
#define LOOP_ATTR static inline __attribute__((always_inline))

/* elem_S, loop_S and update_S in one precision, REAL float (S f32) or double (S f64): the
 * same rule for both, converted to double and back to REAL (a no-op for double). RL_TARGET_BASE
 * on update_S: the full cost model vectorises the loops without noise (at -O2 GCC leaves them
 * scalar); the double math is unchanged element by element, so results are too. */
#define RL_OPTIM_LOOPS(REAL, S)                                                                    \
    LOOP_ATTR void elem_##S(const rl_optim_coef *c, REAL *restrict w, const REAL *restrict g,      \
                            REAL *restrict s1, REAL *restrict s2, int64_t i, double nz) {          \
        bool has1 = rl_optim_states_of(c->kind) >= 1, has2 = rl_optim_states_of(c->kind) >= 2;     \
        double a = has1 ? s1[i] : 0.0, z = has2 ? s2[i] : 0.0;                                     \
        w[i] = (REAL)rl_optim_rule(c, w[i], g[i], nz, &a, &z);                                     \
        if (has1) s1[i] = (REAL)a;                                                                 \
        if (has2) s2[i] = (REAL)z;                                                                 \
    }                                                                                              \
                                                                                                   \
    LOOP_ATTR void loop_##S(rl_optim_kind kind, REAL *restrict w, const REAL *restrict g,          \
                            REAL *restrict s1, REAL *restrict s2, int64_t lo, int64_t hi,          \
                            const rl_optim_coef *coef) {                                           \
        rl_optim_coef c = *coef;                                                                   \
        c.kind = kind;                                                                             \
        if (c.noise_std != 0) {                                                                    \
            rl_philox_block b = {{0, 0, 0, 0}};                                                    \
            for (int64_t i = lo; i < hi; i++)                                                      \
                elem_##S(&c, w, g, s1, s2, i, noise_at(&c, &b, (uint64_t)i));                      \
        } else {                                                                                   \
            for (int64_t i = lo; i < hi; i++)                                                      \
                elem_##S(&c, w, g, s1, s2, i, 0.0);                                                \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    RL_TARGET_BASE static void update_##S(REAL *w, const REAL *g, REAL *s1, REAL *s2, int64_t lo,  \
                                          int64_t hi, const rl_optim_coef *c) {                    \
        switch (c->kind) {                                                                         \
        case RL_OPT_MOMENTUM: loop_##S(RL_OPT_MOMENTUM, w, g, s1, s2, lo, hi, c); break;           \
        case RL_OPT_NESTEROV: loop_##S(RL_OPT_NESTEROV, w, g, s1, s2, lo, hi, c); break;           \
        case RL_OPT_ADAGRAD: loop_##S(RL_OPT_ADAGRAD, w, g, s1, s2, lo, hi, c); break;             \
        case RL_OPT_ADADELTA: loop_##S(RL_OPT_ADADELTA, w, g, s1, s2, lo, hi, c); break;           \
        case RL_OPT_ADAM: loop_##S(RL_OPT_ADAM, w, g, s1, s2, lo, hi, c); break;                   \
        case RL_OPT_ADAMW: loop_##S(RL_OPT_ADAMW, w, g, s1, s2, lo, hi, c); break;                 \
        default: loop_##S(RL_OPT_SGD, w, g, s1, s2, lo, hi, c); break;                             \
        }                                                                                          \
    }

RL_OPTIM_LOOPS(float, f32)
RL_OPTIM_LOOPS(double, f64)

typedef struct {
    rl_tensor *params, *s1, *s2;
    const rl_tensor *grads;
    const rl_optim_coef *coef;
    int64_t n;
} update_job;

/* Part `part` of `parts` updates elements lo .. hi-1; the bounds are multiples of 16, so a part
 * starts on an even element (the noise of a pair comes from one Philox block, noise_at) and on
 * a cache line. Every element's update reads and writes only that element, so the result is
 * the same for any split. */
static void update_part(void *ctx, int part, int parts) {
    const update_job *j = ctx;
    int64_t units = (j->n + 15) / 16;
    int64_t lo = units * part / parts * 16, hi = units * (part + 1) / parts * 16;
    if (hi > j->n) hi = j->n;
    if (lo >= hi) return;
    rl_tensor *s1 = j->s1, *s2 = j->s2;
    if (j->params->dtype == RL_FLOAT32)
        update_f32(rl_tensor_data(j->params), rl_tensor_data(j->grads),
                   s1 ? rl_tensor_data(s1) : NULL, s2 ? rl_tensor_data(s2) : NULL, lo, hi, j->coef);
    else
        update_f64(rl_tensor_data(j->params), rl_tensor_data(j->grads),
                   s1 ? rl_tensor_data(s1) : NULL, s2 ? rl_tensor_data(s2) : NULL, lo, hi, j->coef);
}

/* Elements of an update worth a handoff to the BLAS threads: Adam takes ~1 ns per element, a
 * handoff a few microseconds. A model's parameters are one flat buffer (G2P: ~0.5 M elements,
 * ~3% of a training step on one thread). */
#define UPDATE_PAR_MIN (1 << 15)

void rl_optim_cpu_update(rl_tensor *params, const rl_tensor *grads, rl_tensor *s1, rl_tensor *s2,
                         const rl_optim_coef *coef) {
    update_job j = {params, s1, s2, grads, coef, rl_tensor_numel(params)};
    int parts = rl_blas_get_threads();
    if (parts > RL_CPU_MAX_PARTS) parts = RL_CPU_MAX_PARTS;
    if (parts > 1 && j.n >= UPDATE_PAR_MIN)
        rl_cpu_parallel(parts, update_part, &j);
    else
        update_part(&j, 0, 1);
}

/* The squared sum of p[lo .. hi-1] in eight independent partial sums, so the loop vectorises
 * without reassociation (-ffast-math is never used); the order is fixed, so the result is
 * deterministic. Plain -O2: RL_TARGET_BASE's cost model makes the loop no faster (an Adam step
 * of 0.5 M elements on one thread: 0.650 ms with it, 0.634 without). */
static double sqsum(const rl_tensor *t, int64_t lo, int64_t hi) {
    double acc[8] = {0};
    int64_t i = lo;
    if (t->dtype == RL_FLOAT32) {
        const float *p = rl_tensor_data(t);
        for (; i + 8 <= hi; i += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += (double)p[i + k] * (double)p[i + k];
        for (; i < hi; i++)
            acc[0] += (double)p[i] * (double)p[i];
    } else {
        const double *p = rl_tensor_data(t);
        for (; i + 8 <= hi; i += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += p[i + k] * p[i + k];
        for (; i < hi; i++)
            acc[0] += p[i] * p[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The norm is taken every step (the outlier check, last_grad_norm) over the whole flat gradient
 * (G2P: ~0.5 M elements, ~0.1 ms): on the main thread alone the helpers waited for it. It is
 * summed in chunks whose bounds depend on the length alone (SQ_CHUNK elements, more for a
 * buffer of over SQ_MAX_CHUNKS chunks), each chunk's sum stored and the sums added in order by
 * the caller, so the result is the same on any thread count; the threads take whole chunks. */
#define SQ_CHUNK 16384
#define SQ_MAX_CHUNKS 1024

typedef struct {
    const rl_tensor *t;
    int64_t n, chunk, chunks;
    double *sums;
} sqnorm_job;

static void sqnorm_part(void *ctx, int part, int parts) {
    const sqnorm_job *j = ctx;
    for (int64_t c = j->chunks * part / parts; c < j->chunks * (part + 1) / parts; c++) {
        int64_t hi = (c + 1) * j->chunk;
        j->sums[c] = sqsum(j->t, c * j->chunk, hi < j->n ? hi : j->n);
    }
}

double rl_optim_cpu_sqnorm(const rl_tensor *t) {
    double sums[SQ_MAX_CHUNKS];
    sqnorm_job j = {t, rl_tensor_numel(t), SQ_CHUNK, 0, sums};
    if (j.n > (int64_t)SQ_CHUNK * SQ_MAX_CHUNKS)
        j.chunk = (j.n + SQ_MAX_CHUNKS - 1) / SQ_MAX_CHUNKS;
    j.chunks = (j.n + j.chunk - 1) / j.chunk;
    int parts = rl_blas_get_threads();
    if (parts > j.chunks) parts = (int)j.chunks;
    if (parts > 1)
        rl_cpu_parallel(parts, sqnorm_part, &j);
    else
        sqnorm_part(&j, 0, 1);
    double sum = 0.0;
    for (int64_t c = 0; c < j.chunks; c++)
        sum += sums[c];
    return sum;
}

static double get(const rl_tensor *w, int64_t i, int64_t j) {
    int64_t k = i * w->stride[0] + j * w->stride[1];
    return w->dtype == RL_FLOAT32 ? ((const float *)rl_tensor_data(w))[k]
                                  : ((const double *)rl_tensor_data(w))[k];
}

static void scale_at(rl_tensor *w, int64_t i, int64_t j, double s) {
    int64_t k = i * w->stride[0] + j * w->stride[1];
    if (w->dtype == RL_FLOAT32)
        ((float *)rl_tensor_data(w))[k] = (float)(((float *)rl_tensor_data(w))[k] * s);
    else
        ((double *)rl_tensor_data(w))[k] *= s;
}

void rl_optim_cpu_max_norm(rl_tensor *w, double max_norm) {
    for (int64_t j = 0; j < w->shape[1]; j++) {
        double sum = 0.0;
        for (int64_t i = 0; i < w->shape[0]; i++)
            sum += get(w, i, j) * get(w, i, j);
        double norm = sqrt(sum);
        if (!(norm > max_norm)) continue;
        double s = max_norm / norm;
        for (int64_t i = 0; i < w->shape[0]; i++)
            scale_at(w, i, j, s);
    }
}
