/* The shared harness of the GPU parity programs (tests/gpu/test_*_parity.c): which device is
 * compared with the CPU, random inputs, copies between devices and the comparisons. Everything
 * is static inline; include after tests/c/check.h (the comparisons count passes and failures).
 *
 *   device_side(skipped)   cuda:0 when the build and the machine have one, else the CPU itself,
 *                          so that the whole harness (references, runs, comparisons) still runs
 *                          and a broken test shows on a machine without a GPU. Prints which side
 *                          runs; `skipped` names what the harness leaves out without a device
 *                          (NULL: nothing).
 *   rand_state, urand      one xorshift64 stream (a test may set rand_state to any non-zero seed
 *                          to get the same values on both sides): urand(lo, hi) in [lo, hi)
 *   rand_tensor            a new contiguous CPU tensor uniform in [lo, hi); with `lens` it is a
 *                          (T, B, ...) batch and padded frames (t >= lens[b]) hold `pad`
 *                          (NaN there checks that padding never reaches a result)
 *   set_flat               element i of a contiguous float32/float64 CPU tensor
 *   copy_to                a copy of t on dev (same dtype); one check
 *   next_index             steps an index through a shape in row-major order
 *   rel_err                max |want - got| / max |want| over all elements (NaN, a missing or
 *                          mis-sized result: infinite); two checks (the copies to float64)
 *   compare                want (CPU) against got (any device) to rtol of want's largest
 *                          magnitude, naming the worst element on failure; three checks (the
 *                          two copies to float64 and the comparison)
 *   compare_elems          want against got element by element, any geometry:
 *                          |a - b| <= atol + rtol |a|, a NaN or an infinity matched exactly;
 *                          one check
 *   compare_scalar         two numbers to rtol; one check */
#ifndef RL_TESTS_GPU_DEVICE_SIDE_H
#define RL_TESTS_GPU_DEVICE_SIDE_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/ops.h"

static inline rl_device device_side(const char *skipped) {
    rl_device d = RL_DEVICE_CPU;
#ifdef RL_WITH_CUDA
    const rl_device_backend *be = rl_device_cuda_backend();
    if (be && be->count() > 0) d = (rl_device){RL_CUDA, 0};
#endif
    if (d.type == RL_CPU)
        printf("no CUDA device: the harness runs with the CPU as the device side (nothing of the "
               "GPU is tested%s%s)\n",
               skipped ? "; skipped: " : "", skipped ? skipped : "");
    else
        printf("device side: cuda:0\n");
    return d;
}

/* ---- inputs ---- */

static uint64_t rand_state = 0x9E3779B97F4A7C15u;

static inline double urand(double lo, double hi) {
    rand_state ^= rand_state << 13;
    rand_state ^= rand_state >> 7;
    rand_state ^= rand_state << 17;
    return lo + (hi - lo) * (double)(rand_state >> 11) * (1.0 / 9007199254740992.0);
}

static inline void set_flat(rl_tensor *t, int64_t i, double v) {
    if (t->dtype == RL_FLOAT32)
        ((float *)rl_tensor_data(t))[i] = (float)v;
    else
        ((double *)rl_tensor_data(t))[i] = v;
}

/* A new contiguous CPU tensor of dt (float32 or float64) uniform in [lo, hi); with lens (one
 * entry per shape[1]) the elements of padded frames t >= lens[b] of a (T, B, ...) tensor are
 * `pad`. The values are drawn in float64 and rounded, so both dtypes see the same stream. */
static inline rl_tensor rand_tensor(rl_dtype dt, int ndim, const int64_t *shape, double lo,
                                    double hi, const int32_t *lens, double pad) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, dt, RL_DEVICE_CPU, ndim, shape));
    if (!t.storage) return t;
    int64_t n = rl_tensor_numel(&t), B = ndim > 1 ? shape[1] : 1, frame = 1;
    for (int d = 2; d < ndim; d++)
        frame *= shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t tb = i / frame, tt = tb / B, b = tb % B;
        set_flat(&t, i, lens && tt >= lens[b] ? pad : urand(lo, hi));
    }
    return t;
}

static inline rl_tensor copy_to(const rl_tensor *t, rl_device dev) {
    rl_tensor d = {0};
    CHECK_OK(rl_op_to(&d, t, t->dtype, dev));
    return d;
}

/* Steps idx through shape in row-major order; false after the last element. */
static inline bool next_index(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return true;
        idx[d] = 0;
    }
    return false;
}

/* ---- comparisons ---- */

static inline double rel_err(const rl_tensor *want, const rl_tensor *got) {
    rl_tensor a = {0}, g = {0};
    if (!want->storage || !got->storage || rl_tensor_numel(want) != rl_tensor_numel(got))
        return INFINITY;
    CHECK_OK(rl_op_to(&a, want, RL_FLOAT64, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&g, got, RL_FLOAT64, RL_DEVICE_CPU));
    double scale = 0, err = a.storage && g.storage ? 0 : INFINITY;
    for (int64_t i = 0; isfinite(err) && i < rl_tensor_numel(&a); i++) {
        const double pa = ((const double *)rl_tensor_data(&a))[i];
        const double pg = ((const double *)rl_tensor_data(&g))[i];
        scale = fmax(scale, fabs(pa));
        if (!(fabs(pa - pg) <= err)) err = isnan(pg - pa) ? INFINITY : fabs(pa - pg);
    }
    rl_tensor_release(&a);
    rl_tensor_release(&g);
    return err / fmax(scale, 1e-30);
}

static inline void compare(const char *tag, const char *what, const rl_tensor *want,
                           const rl_tensor *got, double rtol) {
    rl_tensor a = {0}, g = {0};
    if (!want->storage || !got->storage || rl_tensor_numel(want) != rl_tensor_numel(got)) {
        check_failed++;
        fprintf(stderr, "FAIL %s %s: missing or mis-sized result (%s)\n", tag, what, rl_errmsg());
        return;
    }
    CHECK_OK(rl_op_to(&a, want, RL_FLOAT64, RL_DEVICE_CPU));
    CHECK_OK(rl_op_to(&g, got, RL_FLOAT64, RL_DEVICE_CPU));
    if (a.storage && g.storage) {
        const double *pa = rl_tensor_data(&a), *pg = rl_tensor_data(&g);
        int64_t n = rl_tensor_numel(&a), worst = 0;
        double scale = 0, err = 0;
        for (int64_t i = 0; i < n; i++)
            scale = fmax(scale, fabs(pa[i]));
        for (int64_t i = 0; i < n; i++) {
            double e = fabs(pa[i] - pg[i]);
            if (!(e <= err)) { /* NaN counts as the worst */
                err = e;
                worst = i;
            }
        }
        if (err <= rtol * scale) {
            check_passed++;
        } else {
            check_failed++;
            fprintf(stderr,
                    "FAIL %s %s: max error %.3g (scale %.3g, rtol %g) at %" PRId64
                    ": want %.12g got %.12g\n",
                    tag, what, err, scale, rtol, worst, pa[worst], pg[worst]);
        }
    }
    rl_tensor_release(&a);
    rl_tensor_release(&g);
}

static inline void compare_elems(const char *what, const rl_tensor *want, const rl_tensor *got,
                                 double rtol, double atol) {
    if (!want->storage || !got->storage) {
        check_failed++;
        fprintf(stderr, "FAIL %s: missing result (%s)\n", what, rl_errmsg());
        return;
    }
    char ws[64], gs[64];
    if (!rl_tensor_same_shape(want, got) || want->dtype != got->dtype) {
        check_failed++;
        fprintf(stderr, "FAIL %s: cpu gives %s %s, device %s %s\n", what,
                rl_dtype_name(want->dtype), rl_shape_str(want, ws, sizeof ws),
                rl_dtype_name(got->dtype), rl_shape_str(got, gs, sizeof gs));
        return;
    }
    rl_tensor host = {0};
    if (rl_op_to(&host, got, got->dtype, RL_DEVICE_CPU) != RL_OK) {
        check_failed++;
        fprintf(stderr, "FAIL %s: copy to the host: %s\n", what, rl_errmsg());
        return;
    }
    double worst = 0.0, worst_ratio = 0.0, wa = 0.0, wb = 0.0;
    int64_t worst_at = -1, flat = 0;
    int64_t idx[RL_MAX_DIMS] = {0};
    if (rl_tensor_numel(want) > 0) {
        do {
            double a = rl_tensor_get(want, idx), b = rl_tensor_get(&host, idx);
            double err;
            if (isnan(a) || isnan(b))
                err = isnan(a) && isnan(b) ? 0.0 : INFINITY;
            else if (isinf(a) || isinf(b))
                err = a == b ? 0.0 : INFINITY;
            else
                err = fabs(a - b);
            double ratio = err == 0.0 ? 0.0 : err / (atol + rtol * fabs(a));
            if (ratio > worst_ratio || (worst_at < 0 && ratio > 1.0)) {
                worst_ratio = ratio;
                worst = err;
                worst_at = flat;
                wa = a;
                wb = b;
            }
            flat++;
        } while (next_index(want->ndim, want->shape, idx));
    }
    rl_tensor_release(&host);
    if (worst_ratio <= 1.0) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr,
                "FAIL %s: worst error %.3g at element %" PRId64 " (cpu %.9g, device %.9g; rtol %g, "
                "atol %g)\n",
                what, worst, worst_at, wa, wb, rtol, atol);
    }
}

static inline void compare_scalar(const char *what, double want, double got, double rtol) {
    if (fabs(want - got) <= rtol * fabs(want) + 1e-30 || (isnan(want) && isnan(got))) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "FAIL %s: cpu %.17g, device %.17g\n", what, want, got);
    }
}

#endif
