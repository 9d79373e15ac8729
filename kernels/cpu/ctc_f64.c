/* The float64 CTC recursion (gradient checks, references): kernels/cpu/ctc_seq.h with libm's
 * exp / log and kernels/ctc_step.h's float64 formulas. */
#include <math.h>

#include "../ctc_step.h"
#include "ctc_cpu.h"

typedef double ctc_real;
static inline double ctc_exp(double x) { return exp(x); }
static inline double ctc_log(double x) { return log(x); }
static inline double ctc_alpha(double a0, double a1, double a2, double skip, double em) {
    return rl_ctc_alpha_f64(a0, a1, a2, skip, em);
}
static inline double ctc_beta(double n0, double n1, double n2, double skip2) {
    return rl_ctc_beta_f64(n0, n1, n2, skip2);
}
static inline double ctc_post(double a, double b, double off) { return rl_ctc_post_f64(a, b, off); }
static inline double ctc_logp(double a, double b) { return rl_ctc_logp_f64(a, b); }

static inline double ctc_floor(double lp) { return rl_ctc_floor_f64(lp); }

#include "ctc_seq.h"

RL_CTC_VEC void rl_ctc_cpu_seq_f64(const rl_ctc_cpu_job *j, int64_t b, void *scratch) {
    ctc_seq(j, b, scratch);
}
