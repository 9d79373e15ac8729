/* The float32 CTC recursion: kernels/cpu/ctc_seq.h with kernels/pointwise.h's vectorisable
 * rl_expf / rl_logf and kernels/ctc_step.h's float32 formulas. */
#include "../ctc_step.h"
#include "ctc_cpu.h"

typedef float ctc_real;
static inline float ctc_exp(float x) { return rl_expf(x); }
static inline float ctc_log(float x) { return rl_logf(x); }
static inline float ctc_alpha(float a0, float a1, float a2, float skip, float em) {
    return rl_ctc_alpha_f32(a0, a1, a2, skip, em);
}
static inline float ctc_beta(float n0, float n1, float n2, float skip2) {
    return rl_ctc_beta_f32(n0, n1, n2, skip2);
}
static inline float ctc_post(float a, float b, float off) { return rl_ctc_post_f32(a, b, off); }
static inline float ctc_logp(float a, float b) { return rl_ctc_logp_f32(a, b); }

static inline float ctc_floor(float lp) { return rl_ctc_floor_f32(lp); }

#include "ctc_seq.h"

RL_CTC_VEC void rl_ctc_cpu_seq_f32(const rl_ctc_cpu_job *j, int64_t b, void *scratch) {
    ctc_seq(j, b, scratch);
}
