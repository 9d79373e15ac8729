/* The 2-D image layers' CUDA kernels and their launchers (API and layout:
 * kernels/cuda/image_cuda.h).
 *
 * Forward kernels run one thread per output element (im2col: per column element) and read the
 * per-image sizes from device memory, so padding is decided on the device exactly as the CPU's
 * tap map (kernels/cpu/im2col.c) decides it. Backward kernels run one thread per input element
 * and gather the terms of every output that read it: a position is read by at most one tap of
 * each output row, so the thread finds those rows by inverting y = yo sy - py + i (and the same
 * for x) and adds them with yo, then xo ascending, the order of the CPU's scatter loops. No
 * atomics: results do not depend on scheduling, and float sums match the CPU's term by term.
 * Reductions that the CPU layers accumulate in double (global mean) are accumulated in double
 * here too. All index arithmetic is 64-bit; grid-stride loops.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "image_cuda.h"
}
#include "launch.h"

namespace {

/* Whether the last launch went through, naming the launcher and the image sizes. */
rl_status launched(const char *fn, long long H, long long W, long long B, long long F) {
    return rl_cuda_launched("%s: kernel launch on (H, W, B, F) = (%lld, %lld, %lld, %lld)", fn, H,
                            W, B, F);
}

/* ---- conv2d and pool2d: windows over ragged images ---- */

/* The output row r = (yo Wo + xo) B + b split into its parts. */
struct Row {
    int64_t yo, xo, b;
};
__device__ __forceinline__ Row split_row(const rl_conv_geom &g, int64_t r) {
    return Row{r / (g.B * g.Wo), (r / g.B) % g.Wo, r % g.B};
}
__device__ __forceinline__ bool row_valid(const int32_t *out_sizes, const Row &w) {
    return w.yo < out_sizes[2 * w.b] && w.xo < out_sizes[2 * w.b + 1];
}

/* How many of the n taps starting at first lie in [0, extent). */
__device__ __forceinline__ int64_t taps_inside(int64_t first, int64_t n, int64_t extent) {
    int64_t lo = first > 0 ? first : 0, hi = first + n < extent ? first + n : extent;
    return hi > lo ? hi - lo : 0;
}

template <typename T>
__global__ void k_im2col(rl_conv_geom g, const int32_t *sizes, const int32_t *out_sizes, const T *x,
                         T *cols) {
    int64_t K = g.fh * g.fw, total = g.Ho * g.Wo * g.B * K * g.F;
    RL_CUDA_GRID_LOOP(t, total) {
        int64_t f = t % g.F, tk = t / g.F, k = tk % K, r = tk / K;
        Row w = split_row(g, r);
        int64_t y = w.yo * g.sy - g.py + k / g.fw, xx = w.xo * g.sx - g.px + k % g.fw;
        bool ok = row_valid(out_sizes, w) && y >= 0 && y < sizes[2 * w.b] && xx >= 0 &&
                  xx < sizes[2 * w.b + 1];
        cols[t] = ok ? x[((y * g.W + xx) * g.B + w.b) * g.F + f] : T(0);
    }
}

template <typename T>
__global__ void k_col2im(rl_conv_geom g, const int32_t *sizes, const int32_t *out_sizes,
                         const T *dcols, T *dx) {
    int64_t K = g.fh * g.fw, total = g.H * g.W * g.B * g.F;
    RL_CUDA_GRID_LOOP(t, total) {
        int64_t f = t % g.F, b = (t / g.F) % g.B, xx = (t / (g.F * g.B)) % g.W,
                y = t / (g.F * g.B * g.W);
        T acc = T(0);
        if (y < sizes[2 * b] && xx < sizes[2 * b + 1]) {
            int64_t ho = out_sizes[2 * b], wo = out_sizes[2 * b + 1];
            /* i descending is yo ascending: the CPU's order of the terms */
            for (int64_t i = g.fh - 1; i >= 0; i--) {
                int64_t ny = y + g.py - i;
                if (ny < 0 || ny % g.sy != 0 || ny / g.sy >= ho) continue;
                int64_t yo = ny / g.sy;
                for (int64_t j = g.fw - 1; j >= 0; j--) {
                    int64_t nx = xx + g.px - j;
                    if (nx < 0 || nx % g.sx != 0 || nx / g.sx >= wo) continue;
                    int64_t r = (yo * g.Wo + nx / g.sx) * g.B + b;
                    acc += dcols[(r * K + i * g.fw + j) * g.F + f];
                }
            }
        }
        dx[t] = acc;
    }
}

template <typename T> __global__ void k_row_mask(rl_conv_geom g, const int32_t *out_sizes, T *m) {
    RL_CUDA_GRID_LOOP(r, g.Ho * g.Wo * g.B) {
        m[r] = row_valid(out_sizes, split_row(g, r)) ? T(1) : T(0);
    }
}

template <typename T>
__global__ void k_pool_fwd(rl_conv_geom g, const int32_t *sizes, const int32_t *out_sizes, bool max,
                           const T *x, T *y, int32_t *arg) {
    RL_CUDA_GRID_LOOP(t, g.Ho * g.Wo * g.B * g.F) {
        int64_t f = t % g.F;
        Row w = split_row(g, t / g.F);
        T acc = T(0);
        int32_t best = -1;
        int64_t n = 0;
        if (row_valid(out_sizes, w)) {
            int64_t h = sizes[2 * w.b], wd = sizes[2 * w.b + 1];
            for (int64_t i = 0; i < g.fh; i++) {
                int64_t yy = w.yo * g.sy - g.py + i;
                if (yy < 0 || yy >= h) continue;
                for (int64_t j = 0; j < g.fw; j++) {
                    int64_t xx = w.xo * g.sx - g.px + j;
                    if (xx < 0 || xx >= wd) continue;
                    T v = x[((yy * g.W + xx) * g.B + w.b) * g.F + f];
                    if (!max) {
                        acc += v;
                    } else if (n == 0 || v > acc) {
                        acc = v;
                        best = (int32_t)(i * g.fw + j);
                    }
                    n++;
                }
            }
        }
        if (!max && n > 0) acc /= (T)n;
        y[t] = acc;
        if (max) arg[t] = best;
    }
}

template <typename T>
__global__ void k_pool_bwd(rl_conv_geom g, const int32_t *sizes, const int32_t *out_sizes, bool max,
                           const int32_t *arg, const T *dy, T *dx) {
    RL_CUDA_GRID_LOOP(t, g.H * g.W * g.B * g.F) {
        int64_t f = t % g.F, b = (t / g.F) % g.B, xx = (t / (g.F * g.B)) % g.W,
                y = t / (g.F * g.B * g.W);
        int64_t h = sizes[2 * b], wd = sizes[2 * b + 1];
        T acc = T(0);
        if (y < h && xx < wd) {
            int64_t ho = out_sizes[2 * b], wo = out_sizes[2 * b + 1];
            for (int64_t i = g.fh - 1; i >= 0; i--) {
                int64_t ny = y + g.py - i;
                if (ny < 0 || ny % g.sy != 0 || ny / g.sy >= ho) continue;
                int64_t yo = ny / g.sy;
                for (int64_t j = g.fw - 1; j >= 0; j--) {
                    int64_t nx = xx + g.px - j;
                    if (nx < 0 || nx % g.sx != 0 || nx / g.sx >= wo) continue;
                    int64_t xo = nx / g.sx, o = ((yo * g.Wo + xo) * g.B + b) * g.F + f;
                    if (max) {
                        if (arg[o] == (int32_t)(i * g.fw + j)) acc += dy[o];
                    } else {
                        int64_t n = taps_inside(yo * g.sy - g.py, g.fh, h) *
                                    taps_inside(xo * g.sx - g.px, g.fw, wd);
                        acc += dy[o] / (T)n;
                    }
                }
            }
        }
        dx[t] = acc;
    }
}

/* ---- collapse and global_pool ---- */

template <typename T>
__global__ void k_collapse_fwd(int mode, int64_t W, int64_t B, int64_t F, const int32_t *sizes,
                               const T *x, T *y, int32_t *arg) {
    RL_CUDA_GRID_LOOP(t, W * B * F) {
        int64_t f = t % F, b = (t / F) % B, xx = t / (F * B);
        int64_t h = sizes[2 * b];
        T acc = T(0);
        int32_t best = 0;
        if (xx < sizes[2 * b + 1]) {
            int64_t y0 = mode == RL_IMAGE_COLLAPSE_LAST ? h - 1 : 0;
            for (int64_t yy = y0; yy < h; yy++) {
                T v = x[((yy * W + xx) * B + b) * F + f];
                if (mode == RL_IMAGE_COLLAPSE_SUM) {
                    acc += v;
                } else if (mode == RL_IMAGE_COLLAPSE_LAST || yy == 0 || !(v <= acc)) {
                    acc = v;
                    best = (int32_t)yy;
                }
            }
        }
        y[t] = acc;
        if (mode == RL_IMAGE_COLLAPSE_MAX) arg[t] = best;
    }
}

template <typename T>
__global__ void k_collapse_bwd(int mode, int64_t H, int64_t W, int64_t B, int64_t F,
                               const int32_t *sizes, const int32_t *arg, const T *dy, T *dx) {
    RL_CUDA_GRID_LOOP(t, H * W * B * F) {
        int64_t f = t % F, b = (t / F) % B, xx = (t / (F * B)) % W, y = t / (F * B * W);
        int64_t h = sizes[2 * b], o = (xx * B + b) * F + f;
        bool take = false;
        if (y < h && xx < sizes[2 * b + 1])
            take = mode == RL_IMAGE_COLLAPSE_SUM   ? true
                   : mode == RL_IMAGE_COLLAPSE_MAX ? y == arg[o]
                                                   : y == h - 1;
        dx[t] = take ? dy[o] : T(0);
    }
}

template <typename T>
__global__ void k_global_fwd(bool max, int64_t W, int64_t B, int64_t F, const int32_t *sizes,
                             const T *x, T *y, int32_t *arg) {
    RL_CUDA_GRID_LOOP(t, B * F) {
        int64_t f = t % F, b = t / F, h = sizes[2 * b], wd = sizes[2 * b + 1];
        double acc = 0;
        int32_t best = 0;
        for (int64_t yy = 0; yy < h; yy++)
            for (int64_t xx = 0; xx < wd; xx++) {
                double v = (double)x[((yy * W + xx) * B + b) * F + f];
                if (!max) {
                    acc += v;
                } else if ((yy == 0 && xx == 0) || v > acc) {
                    acc = v;
                    best = (int32_t)(yy * W + xx);
                }
            }
        if (!max) acc /= (double)(h * wd);
        y[t] = (T)acc;
        if (max) arg[t] = best;
    }
}

template <typename T>
__global__ void k_global_bwd(bool max, int64_t H, int64_t W, int64_t B, int64_t F,
                             const int32_t *sizes, const int32_t *arg, const T *dy, T *dx) {
    RL_CUDA_GRID_LOOP(t, H * W * B * F) {
        int64_t f = t % F, b = (t / F) % B, xx = (t / (F * B)) % W, y = t / (F * B * W);
        int64_t h = sizes[2 * b], wd = sizes[2 * b + 1], o = b * F + f;
        T v = T(0);
        if (y < h && xx < wd) {
            if (!max)
                v = (T)((double)dy[o] / (double)(h * wd));
            else if (arg[o] == (int32_t)(y * W + xx))
                v = dy[o];
        }
        dx[t] = v;
    }
}

} // namespace

/* ---- launchers ---- */

extern "C" rl_status rl_image_cuda_im2col(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                                          const int32_t *out_sizes, const void *x, void *cols) {
    const char *fn = "rl_image_cuda_im2col";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = g->Ho * g->Wo * g->B * g->fh * g->fw * g->F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, cols));
    if (dt == RL_FLOAT32)
        k_im2col<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, (const float *)x, (float *)cols);
    else
        k_im2col<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, (const double *)x, (double *)cols);
    return launched(fn, g->H, g->W, g->B, g->F);
}

extern "C" rl_status rl_image_cuda_col2im(rl_dtype dt, const rl_conv_geom *g, const int32_t *sizes,
                                          const int32_t *out_sizes, const void *dcols, void *dx) {
    const char *fn = "rl_image_cuda_col2im";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = g->H * g->W * g->B * g->F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, dx));
    if (dt == RL_FLOAT32)
        k_col2im<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, (const float *)dcols, (float *)dx);
    else
        k_col2im<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, (const double *)dcols, (double *)dx);
    return launched(fn, g->H, g->W, g->B, g->F);
}

extern "C" rl_status rl_image_cuda_row_mask(rl_dtype dt, const rl_conv_geom *g,
                                            const int32_t *out_sizes, void *mask) {
    const char *fn = "rl_image_cuda_row_mask";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = g->Ho * g->Wo * g->B;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, mask));
    if (dt == RL_FLOAT32)
        k_row_mask<float>
            <<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(*g, out_sizes, (float *)mask);
    else
        k_row_mask<double>
            <<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(*g, out_sizes, (double *)mask);
    return launched(fn, g->H, g->W, g->B, g->F);
}

extern "C" rl_status rl_image_cuda_pool_forward(rl_dtype dt, const rl_conv_geom *g,
                                                const int32_t *sizes, const int32_t *out_sizes,
                                                bool max, const void *x, void *y, int32_t *arg) {
    const char *fn = "rl_image_cuda_pool_forward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = g->Ho * g->Wo * g->B * g->F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, y));
    if (dt == RL_FLOAT32)
        k_pool_fwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, max, (const float *)x, (float *)y, arg);
    else
        k_pool_fwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, max, (const double *)x, (double *)y, arg);
    return launched(fn, g->H, g->W, g->B, g->F);
}

extern "C" rl_status rl_image_cuda_pool_backward(rl_dtype dt, const rl_conv_geom *g,
                                                 const int32_t *sizes, const int32_t *out_sizes,
                                                 bool max, const int32_t *arg, const void *dy,
                                                 void *dx) {
    const char *fn = "rl_image_cuda_pool_backward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = g->H * g->W * g->B * g->F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, dx));
    if (dt == RL_FLOAT32)
        k_pool_bwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, max, arg, (const float *)dy, (float *)dx);
    else
        k_pool_bwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            *g, sizes, out_sizes, max, arg, (const double *)dy, (double *)dx);
    return launched(fn, g->H, g->W, g->B, g->F);
}

extern "C" rl_status rl_image_cuda_collapse_forward(rl_dtype dt, int mode, int64_t H, int64_t W,
                                                    int64_t B, int64_t F, const int32_t *sizes,
                                                    const void *x, void *y, int32_t *arg) {
    const char *fn = "rl_image_cuda_collapse_forward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = W * B * F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, y));
    if (dt == RL_FLOAT32)
        k_collapse_fwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            mode, W, B, F, sizes, (const float *)x, (float *)y, arg);
    else
        k_collapse_fwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            mode, W, B, F, sizes, (const double *)x, (double *)y, arg);
    return launched(fn, H, W, B, F);
}

extern "C" rl_status rl_image_cuda_collapse_backward(rl_dtype dt, int mode, int64_t H, int64_t W,
                                                     int64_t B, int64_t F, const int32_t *sizes,
                                                     const int32_t *arg, const void *dy, void *dx) {
    const char *fn = "rl_image_cuda_collapse_backward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = H * W * B * F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, dx));
    if (dt == RL_FLOAT32)
        k_collapse_bwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            mode, H, W, B, F, sizes, arg, (const float *)dy, (float *)dx);
    else
        k_collapse_bwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            mode, H, W, B, F, sizes, arg, (const double *)dy, (double *)dx);
    return launched(fn, H, W, B, F);
}

extern "C" rl_status rl_image_cuda_global_pool_forward(rl_dtype dt, bool max, int64_t H, int64_t W,
                                                       int64_t B, int64_t F, const int32_t *sizes,
                                                       const void *x, void *y, int32_t *arg) {
    const char *fn = "rl_image_cuda_global_pool_forward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = B * F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, y));
    if (dt == RL_FLOAT32)
        k_global_fwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            max, W, B, F, sizes, (const float *)x, (float *)y, arg);
    else
        k_global_fwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            max, W, B, F, sizes, (const double *)x, (double *)y, arg);
    return launched(fn, H, W, B, F);
}

extern "C" rl_status rl_image_cuda_global_pool_backward(rl_dtype dt, bool max, int64_t H, int64_t W,
                                                        int64_t B, int64_t F, const int32_t *sizes,
                                                        const int32_t *arg, const void *dy,
                                                        void *dx) {
    const char *fn = "rl_image_cuda_global_pool_backward";
    RL_TRY(rl_cuda_check_dtype(fn, dt));
    int64_t work = H * W * B * F;
    if (work == 0) return RL_OK;
    RL_TRY(rl_cuda_enter(fn, dx));
    if (dt == RL_FLOAT32)
        k_global_bwd<float><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            max, H, W, B, F, sizes, arg, (const float *)dy, (float *)dx);
    else
        k_global_bwd<double><<<rl_cuda_blocks_for(work), RL_CUDA_THREADS>>>(
            max, H, W, B, F, sizes, arg, (const double *)dy, (double *)dx);
    return launched(fn, H, W, B, F);
}
