/* The fused pointwise passes of a janet step on the CPU (kernels/janet.h for the layout,
 * kernels/janet_cell.h for the formulas).
 *
 * One pass per step reads the step's pre-activations once and writes the activations, the state
 * and the output (forward), or the pre-activation gradients and the state gradient (backward).
 * The float32 passes are compiled once per level (AVX-512, AVX2+FMA, baseline; on AArch64 the
 * baseline, which GCC vectorises with Advanced SIMD) and picked at run time
 * (kernels/cpu/cpu_level.h), as the lstm's and gru's are: one body, one function per level that
 * inlines it. float64 serves the gradient checks and runs the baseline body.
 */
#include <stdbool.h>
#include <string.h>

#include "../janet.h"
#include "../janet_cell.h"
#include "cpu_level.h"

#define RL_INLINE static inline __attribute__((always_inline))

/* One float32 step's operands, forward's and backward's. */
typedef struct {
    int64_t B, H, t;
    const int32_t *len;
    float *g;
    const float *b, *hp, *mh, *dout;
    float beta;
    float *h, *out; /* forward */
    int64_t dout_ld;
    float *dh; /* backward */
} step_f32;

/* zo: mh given; a constant in each call, so the loop without zoneout carries no dead work. */
RL_INLINE void fwd_body(bool zo, const step_f32 *a) {
    int64_t H = a->H;
    const float *restrict bf = a->b, *restrict bc = a->b + H;
    for (int64_t r = 0; r < a->B; r++) {
        const float *restrict hpr = a->hp + r * H;
        float *restrict hr = a->h + r * H, *restrict orow = a->out + r * H;
        if (a->t >= a->len[r]) { /* the state carried, output 0 */
            for (int64_t j = 0; j < H; j++) {
                hr[j] = hpr[j];
                orow[j] = 0.0f;
            }
            continue;
        }
        float *restrict gs = a->g + r * 3 * H, *restrict ga = gs + H, *restrict gi = gs + 2 * H;
        const float *restrict m = zo ? a->mh + r * H : NULL;
        /* the row pointers never overlap; restrict on locals does not tell GCC so */
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float h;
            rl_janet_cell_fwd_f32(gs[j] + bf[j], ga[j] + bc[j], hpr[j], a->beta, &gs[j], &ga[j],
                                  &gi[j], &h);
            orow[j] = hr[j] = zo ? rl_zoneoutf(m[j], hpr[j], h) : h;
        }
    }
}

RL_INLINE void bwd_body(bool zo, const step_f32 *a) {
    int64_t H = a->H;
    for (int64_t r = 0; r < a->B; r++) {
        float *restrict gs = a->g + r * 3 * H, *restrict ga = gs + H, *restrict gi = gs + 2 * H;
        if (a->t >= a->len[r]) {
            memset(gs, 0, (size_t)(3 * H) * sizeof *gs);
            continue;
        }
        const float *restrict hpr = a->hp + r * H, *restrict m = zo ? a->mh + r * H : NULL;
        const float *restrict dor = a->dout ? a->dout + r * a->dout_ld : NULL;
        float *restrict dhr = a->dh + r * H;
        RL_IVDEP
        for (int64_t j = 0; j < H; j++) {
            float ds, da, dhp, d = dhr[j] + (dor ? dor[j] : 0.0f);
            /* with zoneout the cell sees (1 - m) of the state's gradient */
            rl_janet_cell_bwd_f32(gs[j], ga[j], gi[j], hpr[j], zo ? rl_zoneout_newf(m[j], d) : d,
                                  &ds, &da, &dhp);
            gs[j] = ds;
            ga[j] = da;
            gi[j] = 0.0f;
            dhr[j] = zo ? dhp + rl_zoneout_prevf(m[j], d) : dhp;
        }
    }
}

RL_INLINE void pass(const step_f32 *a, bool backward) {
    if (backward && a->mh)
        bwd_body(true, a);
    else if (backward)
        bwd_body(false, a);
    else if (a->mh)
        fwd_body(true, a);
    else
        fwd_body(false, a);
}

#ifdef RL_CPU_X86
RL_TARGET_AVX512 static void pass_avx512(const step_f32 *a, bool backward) { pass(a, backward); }
RL_TARGET_AVX2 static void pass_avx2(const step_f32 *a, bool backward) { pass(a, backward); }
#endif
RL_TARGET_BASE static void pass_base(const step_f32 *a, bool backward) { pass(a, backward); }

static void run_f32(const step_f32 *a, bool backward) {
    switch (rl_cpu_level_get()) {
#ifdef RL_CPU_X86
    case RL_CPU_AVX512: pass_avx512(a, backward); return;
    case RL_CPU_AVX2: pass_avx2(a, backward); return;
#endif
    default: pass_base(a, backward); return;
    }
}

void rl_janet_cpu_fwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                          const float *b, float beta, const float *hp, float *h, float *out,
                          const float *mh) {
    run_f32(&(step_f32){B, H, t, len, g, b, hp, mh, NULL, beta, h, out, 0, NULL}, false);
}

void rl_janet_cpu_bwd_f32(int64_t B, int64_t H, int64_t t, const int32_t *len, float *g,
                          const float *hp, const float *dout, int64_t dout_ld, float *dh,
                          const float *mh) {
    run_f32(&(step_f32){B, H, t, len, g, NULL, hp, mh, dout, 0.0f, NULL, NULL, dout_ld, dh}, true);
}

void rl_janet_cpu_fwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                          const double *b, double beta, const double *hp, double *h, double *out,
                          const double *mh) {
    for (int64_t r = 0; r < B; r++) {
        const double *hpr = hp + r * H;
        double *hr = h + r * H, *orow = out + r * H, *gs = g + r * 3 * H;
        if (t >= len[r]) {
            memcpy(hr, hpr, (size_t)H * sizeof *hr);
            memset(orow, 0, (size_t)H * sizeof *orow);
            continue;
        }
        for (int64_t j = 0; j < H; j++) {
            rl_janet_cell_fwd_f64(gs[j] + b[j], gs[H + j] + b[H + j], hpr[j], beta, &gs[j],
                                  &gs[H + j], &gs[2 * H + j], &hr[j]);
            if (mh) hr[j] = rl_zoneout(mh[r * H + j], hpr[j], hr[j]);
            orow[j] = hr[j];
        }
    }
}

void rl_janet_cpu_bwd_f64(int64_t B, int64_t H, int64_t t, const int32_t *len, double *g,
                          const double *hp, const double *dout, int64_t dout_ld, double *dh,
                          const double *mh) {
    for (int64_t r = 0; r < B; r++) {
        double *gs = g + r * 3 * H, *dhr = dh + r * H;
        if (t >= len[r]) {
            memset(gs, 0, (size_t)(3 * H) * sizeof *gs);
            continue;
        }
        for (int64_t j = 0; j < H; j++) {
            double d = dhr[j] + (dout ? dout[r * dout_ld + j] : 0.0);
            double m = mh ? mh[r * H + j] : 0.0, dhp;
            rl_janet_cell_bwd_f64(gs[j], gs[H + j], gs[2 * H + j], hp[r * H + j],
                                  mh ? rl_zoneout_new(m, d) : d, &gs[j], &gs[H + j], &dhp);
            gs[2 * H + j] = 0.0;
            dhr[j] = mh ? rl_zoneout_prev(m, d) + dhp : dhp;
        }
    }
}

RL_TARGET_BASE void rl_janet_cpu_bias_grads_f32(int64_t rows, int64_t H, const float *g,
                                                float *db) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gr = g + r * 3 * H;
        float *restrict d = db;
        RL_IVDEP
        for (int64_t j = 0; j < 2 * H; j++)
            d[j] += gr[j];
    }
}

/* Per column in row order, then added: the float64 reference's summation. */
void rl_janet_cpu_bias_grads_f64(int64_t rows, int64_t H, const double *g, double *db) {
    for (int64_t j = 0; j < 2 * H; j++) {
        double sum = 0.0;
        for (int64_t r = 0; r < rows; r++)
            sum += g[r * 3 * H + j];
        db[j] += sum;
    }
}
