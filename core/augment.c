/* Data augmentation on the fly, see core/augment.h.
 *
 * SpecAugment (Park et al. 2019), on a time axis of T frames and a frequency axis of F:
 *   time warp W: centre c uniform in [W, T - W), distance d uniform in [-W, W]; output frame t
 *     reads the input at u = t c / (c + d) for t < c + d, else c + (t - c - d) (T - 1 - c) /
 *     (T - 1 - c - d), linearly interpolated (frames 0 and T - 1 stay where they are).
 *   frequency warp a: a factor alpha uniform in [1 - a, 1 + a] (a <= 0.2); with the boundary
 *     c = 0.8 (F - 1), output bin g reads the input at u = g / alpha for g < alpha c, else
 *     c + (g - alpha c) (F - 1 - c) / (F - 1 - alpha c), linearly interpolated: the spectral
 *     envelope (the formants) below the boundary moves by alpha, the rest is squeezed or
 *     stretched to keep the last bin, as VTLP (Jaitly and Hinton 2013) warps the filterbank:
 *     the speaker's vocal tract length, which CMVN leaves. Its draw comes from a counter range
 *     of its own, so the time warp's and the masks' are those of a config without it.
 *   time masks: width w uniform in [0, min(time_width, floor(time_ratio T))], first frame
 *     uniform in [0, T - w]; frequency masks alike over F with freq_width. Masks only ever
 *     cover frames of the sequence itself: padding is added later, by the batcher.
 * Images: pixel centres at integer coordinates; a map A sends p to A (p - c_in) + c_out (c the
 *   centres of the input and of the output's bounding box), and each output pixel reads the
 *   input bilinearly at A^-1 (q - c_out) + c_in, `fill` outside. A = R(r) Sh(s) S(k) with
 *   S(k) = k I, Sh(s) = [[1, -s], [0, 1]] (y points down: s > 0 leans the tops right),
 *   R(r) the rotation by r. Identity parameters read every pixel at its own place: an exact
 *   copy.
 *   Elastic: u, v uniform in [-1, 1] per pixel, each convolved with a Gaussian of sigma
 *   (separable, radius ceil(3 sigma), edges clamped), both scaled by alpha / RMS(u, v).
 *   Stroke: y(p) = max (r > 0) or min (r < 0) of x over the disk |q - p|^2 <= r^2, clipped at
 *   the image's border.
 * Waveforms: speed f resamples at ratio 1 / f (libsamplerate); noise segment z of the chosen
 *   file from the drawn start (looped), g = sqrt(P_x / (P_z 10^(snr / 10))), P the mean square.
 *   Tempo f (WSOLA): h = round(0.015 rate) samples, frames of 2h samples under the periodic
 *   Hann window w_i = (1 - cos(pi i / h)) / 2 (so w_i + w_(i+h) = 1); output frame k covers
 *   output samples [(k - 1) h, (k + 1) h) and reads the input (zero outside it) from
 *   s_k = round(k h f) - h + d_k, d_0 = 0 and d_k in [-D, D] (D = round(0.010 rate))
 *   maximising sum_i x[s_(k-1) + h + i] x[s_k + i] / sqrt(sum_i x[s_k + i]^2), i < h (searched
 *   at every g-th d, g = round(0.00025 rate), then at the d within g of the best of those): the
 *   first half of frame k resembles what followed frame k - 1's input, so the overlap joins
 *   waveforms in phase and the local periods (the pitch) are kept while the frames advance
 *   f times faster through the input than through the output.
 */
#include "augment.h"

#include <math.h>
#include <samplerate.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

/* ---- random numbers: one stream per (seed, epoch, index), one counter range per transform */

enum {
    AUG_SPEC = 1,
    AUG_AFFINE,
    AUG_ELASTIC,
    AUG_STROKE,
    AUG_SPEED,
    AUG_NOISE,
    AUG_TEMPO,
    AUG_FREQ_WARP
};

typedef struct {
    uint64_t seed, stream, counter;
    rl_philox_block b;
    int pos;
} aug_rng;

static aug_rng rng_make(uint64_t seed, uint64_t epoch, uint64_t index, int which) {
    aug_rng r = {.seed = seed,
                 .stream = (epoch << 32) ^ (index & 0xffffffffu),
                 .counter = (uint64_t)which << 48,
                 .pos = 4};
    return r;
}

static uint32_t rng_word(aug_rng *r) {
    if (r->pos == 4) {
        r->b = rl_philox(r->seed, r->stream, r->counter++);
        r->pos = 0;
    }
    return r->b.v[r->pos++];
}

/* uniform in [0, 1) with 53 bits */
static double rng_unit(aug_rng *r) {
    uint64_t hi = rng_word(r) >> 5, lo = rng_word(r) >> 6;
    return (double)(hi * 67108864u + lo) * (1.0 / 9007199254740992.0);
}

static double rng_range(aug_rng *r, double a, double b) { return a + (b - a) * rng_unit(r); }

/* uniform integer in [a, b] */
static int64_t rng_int(aug_rng *r, int64_t a, int64_t b) {
    if (b <= a) return a;
    int64_t v = a + (int64_t)(rng_unit(r) * (double)(b - a + 1));
    return v > b ? b : v;
}

/* ---- configuration ---- */

rl_aug_cfg rl_aug_cfg_default(void) {
    return (rl_aug_cfg){.time_ratio = 1.0,
                        .scale = 0,
                        .speed_min = 1,
                        .speed_max = 1,
                        .tempo_min = 1,
                        .tempo_max = 1};
}

static bool prob_ok(double p) { return p >= 0 && p <= 1; }

rl_status rl_aug_cfg_check(const char *who, const rl_aug_cfg *c) {
    struct {
        const char *name;
        double p;
    } probs[] = {{"spec.p", c->spec_p},     {"affine.p", c->affine_p}, {"elastic.p", c->elastic_p},
                 {"stroke.p", c->stroke_p}, {"speed.p", c->speed_p},   {"noise.p", c->noise_p},
                 {"tempo.p", c->tempo_p}};
    for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++)
        if (!prob_ok(probs[i].p))
            return rl_error(RL_EARG, "%s.%s: a probability must be in [0, 1], got %g", who,
                            probs[i].name, probs[i].p);
    struct {
        const char *name;
        int64_t v;
    } counts[] = {{"spec.time_masks", c->time_masks}, {"spec.time_width", c->time_width},
                  {"spec.freq_masks", c->freq_masks}, {"spec.freq_width", c->freq_width},
                  {"spec.time_warp", c->time_warp},   {"stroke.radius", c->stroke_radius}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].v < 0 || counts[i].v > 100000)
            return rl_error(RL_EARG, "%s.%s must be an integer in [0, 100000], got %lld", who,
                            counts[i].name, (long long)counts[i].v);
    if (!(c->time_ratio > 0 && c->time_ratio <= 1))
        return rl_error(RL_EARG, "%s.spec.time_ratio must be in (0, 1], got %g", who,
                        c->time_ratio);
    if (!(c->freq_warp >= 0 && c->freq_warp <= 0.2))
        return rl_error(RL_EARG, "%s.spec.freq_warp must be in [0, 0.2], got %g", who,
                        c->freq_warp);
    if (!(c->shear >= 0 && c->shear <= 2))
        return rl_error(RL_EARG, "%s.affine.shear must be in [0, 2], got %g", who, c->shear);
    if (!(c->scale >= 0 && c->scale < 1))
        return rl_error(RL_EARG, "%s.affine.scale must be in [0, 1), got %g", who, c->scale);
    if (!(c->rotate >= 0 && c->rotate <= 45))
        return rl_error(RL_EARG, "%s.affine.rotate must be in [0, 45] degrees, got %g", who,
                        c->rotate);
    if (!(c->elastic_alpha >= 0 && c->elastic_alpha <= 100))
        return rl_error(RL_EARG, "%s.elastic.alpha must be in [0, 100] pixels, got %g", who,
                        c->elastic_alpha);
    if (!(c->elastic_sigma > 0 && c->elastic_sigma <= 100))
        return rl_error(RL_EARG, "%s.elastic.sigma must be in (0, 100] pixels, got %g", who,
                        c->elastic_sigma);
    if (!(c->speed_min >= 0.5 && c->speed_min <= c->speed_max && c->speed_max <= 2))
        return rl_error(RL_EARG,
                        "%s.speed: the factors must satisfy 0.5 <= min <= max <= 2, got min %g, "
                        "max %g",
                        who, c->speed_min, c->speed_max);
    if (!(c->tempo_min >= 0.5 && c->tempo_min <= c->tempo_max && c->tempo_max <= 2))
        return rl_error(RL_EARG,
                        "%s.tempo: the factors must satisfy 0.5 <= min <= max <= 2, got min %g, "
                        "max %g",
                        who, c->tempo_min, c->tempo_max);
    if (!(c->snr_min >= -50 && c->snr_min <= c->snr_max && c->snr_max <= 100))
        return rl_error(RL_EARG,
                        "%s.noise.snr must be {lo, hi} dB with -50 <= lo <= hi <= 100, got "
                        "{%g, %g}",
                        who, c->snr_min, c->snr_max);
    if (!isfinite(c->fill) || !isfinite(c->mask_value))
        return rl_error(RL_EARG, "%s: fill and spec.value must be finite", who);
    return RL_OK;
}

/* ---- SpecAugment ---- */

void rl_aug_mask(float *x, int64_t nt, int64_t ts, int64_t nf, int64_t fs, int64_t nc, int64_t t0,
                 int64_t width, float value) {
    int64_t lo = t0 < 0 ? 0 : t0, hi = t0 + width > nt ? nt : t0 + width;
    for (int64_t t = lo; t < hi; t++)
        for (int64_t f = 0; f < nf; f++) {
            float *p = x + t * ts + f * fs;
            for (int64_t c = 0; c < nc; c++)
                p[c] = value;
        }
}

/* The piecewise linear warp of both: input position centre moves to `to` along the axis of nt
 * (stride ts), positions 0 and nt - 1 stay. */
static void warp_axis(float *x, int64_t nt, int64_t ts, int64_t nf, int64_t fs, int64_t nc,
                      double centre, double to, float *scratch) {
    double last = (double)(nt - 1);
    if (to == centre || nt < 3) return;
    if (centre <= 0 || centre >= last || to <= 0 || to >= last) return;
    /* scratch: the input, packed (t, f, c) */
    for (int64_t t = 0; t < nt; t++)
        for (int64_t f = 0; f < nf; f++)
            memcpy(scratch + (t * nf + f) * nc, x + t * ts + f * fs, (size_t)nc * sizeof(float));
    for (int64_t t = 0; t < nt; t++) {
        double u = (double)t < to ? (double)t * centre / to
                                  : centre + ((double)t - to) * (last - centre) / (last - to);
        int64_t a = (int64_t)floor(u);
        if (a >= nt - 1) a = nt - 2;
        float w = (float)(u - (double)a);
        for (int64_t f = 0; f < nf; f++) {
            const float *p = scratch + (a * nf + f) * nc, *q = p + nf * nc;
            float *o = x + t * ts + f * fs;
            for (int64_t c = 0; c < nc; c++)
                o[c] = p[c] + w * (q[c] - p[c]);
        }
    }
}

void rl_aug_warp(float *x, int64_t nt, int64_t ts, int64_t nf, int64_t fs, int64_t nc,
                 int64_t centre, int64_t dist, float *scratch) {
    warp_axis(x, nt, ts, nf, fs, nc, (double)centre, (double)(centre + dist), scratch);
}

/* SpecAugment over an axis layout; scratch for the warp is allocated here. */
static rl_status spec(const rl_aug_cfg *cfg, aug_rng *r, float *x, int64_t nt, int64_t ts,
                      int64_t nf, int64_t fs, int64_t nc) {
    if (!(rng_unit(r) < cfg->spec_p)) return RL_OK;
    int64_t W = cfg->time_warp;
    /* the draws are made whether or not the sequence is long enough to use them, so that one
     * sequence's masks do not depend on whether its warp applied */
    int64_t centre = rng_int(r, W, nt - 1 - W), dist = rng_int(r, -W, W);
    double alpha = 1;
    if (cfg->freq_warp > 0) {
        aug_rng fr = *r;
        fr.counter = (uint64_t)AUG_FREQ_WARP << 48, fr.pos = 4;
        alpha = rng_range(&fr, 1 - cfg->freq_warp, 1 + cfg->freq_warp);
    }
    bool twarp = W > 0 && nt > 2 * W + 1, fwarp = alpha != 1 && nf >= 3;
    if (twarp || fwarp) {
        float *scratch = malloc((size_t)(nt * nf * nc) * sizeof *scratch);
        if (!scratch) return rl_error(RL_ENOMEM, "augment: no memory for the warp");
        if (twarp) rl_aug_warp(x, nt, ts, nf, fs, nc, centre, dist, scratch);
        /* the frequency axis as the "time" of the warp: the boundary moves by alpha */
        double boundary = 0.8 * (double)(nf - 1);
        if (fwarp) warp_axis(x, nf, fs, nt, ts, nc, boundary, alpha * boundary, scratch);
        free(scratch);
    }
    int64_t tw = cfg->time_width, cap = (int64_t)floor(cfg->time_ratio * (double)nt);
    if (tw > cap) tw = cap;
    for (int64_t m = 0; m < cfg->time_masks; m++) {
        int64_t w = rng_int(r, 0, tw);
        int64_t t0 = rng_int(r, 0, nt - w);
        rl_aug_mask(x, nt, ts, nf, fs, nc, t0, w, cfg->mask_value);
    }
    int64_t fw = cfg->freq_width > nf ? nf : cfg->freq_width;
    for (int64_t m = 0; m < cfg->freq_masks; m++) {
        int64_t w = rng_int(r, 0, fw);
        int64_t f0 = rng_int(r, 0, nf - w);
        /* the frequency axis as the "time" of rl_aug_mask: rows f0 .. f0 + w - 1 */
        rl_aug_mask(x, nf, fs, nt, ts, nc, f0, w, cfg->mask_value);
    }
    return RL_OK;
}

rl_status rl_augment_features(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                              float *x, int64_t T, int64_t F) {
    if (T < 1 || F < 1) return RL_OK;
    aug_rng r = rng_make(seed, epoch, index, AUG_SPEC);
    return spec(cfg, &r, x, T, F, F, 1, 1);
}

/* ---- images ---- */

static float bilinear(const float *x, int64_t H, int64_t W, int64_t C, int64_t c, double px,
                      double py, float fill) {
    double fx = floor(px), fy = floor(py);
    int64_t x0 = (int64_t)fx, y0 = (int64_t)fy;
    double ax = px - fx, ay = py - fy;
    double acc = 0;
    for (int dy = 0; dy < 2; dy++)
        for (int dx = 0; dx < 2; dx++) {
            double w = (dx ? ax : 1 - ax) * (dy ? ay : 1 - ay);
            if (w == 0) continue;
            int64_t xx = x0 + dx, yy = y0 + dy;
            float v = (xx < 0 || xx >= W || yy < 0 || yy >= H) ? fill : x[(yy * W + xx) * C + c];
            acc += w * v;
        }
    return (float)acc;
}

rl_status rl_aug_affine(const float *x, int64_t H, int64_t W, int64_t C, double k, double s,
                        double r, float fill, rl_tensor *out) {
    if (!(k > 0) || !isfinite(s) || !isfinite(r))
        return rl_error(RL_EARG, "augment: affine needs scale > 0 and finite shear, rotation");
    double cr = cos(r), sr = sin(r);
    /* A = R Sh S */
    double a00 = k * cr, a01 = k * (-s * cr - sr), a10 = k * sr, a11 = k * (-s * sr + cr);
    double cx = (double)(W - 1) / 2, cy = (double)(H - 1) / 2;
    double minx = INFINITY, maxx = -INFINITY, miny = INFINITY, maxy = -INFINITY;
    for (int i = 0; i < 4; i++) {
        double px = (i & 1 ? (double)W - 0.5 : -0.5) - cx,
               py = (i & 2 ? (double)H - 0.5 : -0.5) - cy;
        double qx = a00 * px + a01 * py, qy = a10 * px + a11 * py;
        minx = fmin(minx, qx);
        maxx = fmax(maxx, qx);
        miny = fmin(miny, qy);
        maxy = fmax(maxy, qy);
    }
    /* (the 1e-9 keeps an identity map at its own size despite rounding) */
    int64_t W2 = (int64_t)ceil(maxx - minx - 1e-9), H2 = (int64_t)ceil(maxy - miny - 1e-9);
    if (W2 < 1) W2 = 1;
    if (H2 < 1) H2 = 1;
    if (W2 > 65536 || H2 > 65536)
        return rl_error(RL_EARG, "augment: affine map makes a %lld x %lld image", (long long)H2,
                        (long long)W2);
    int64_t shape[3] = {H2, W2, C};
    RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 3, shape));
    float *y = rl_tensor_data(out);
    double det = a00 * a11 - a01 * a10;
    double i00 = a11 / det, i01 = -a01 / det, i10 = -a10 / det, i11 = a00 / det;
    double ox = (double)(W2 - 1) / 2, oy = (double)(H2 - 1) / 2;
    for (int64_t v = 0; v < H2; v++)
        for (int64_t u = 0; u < W2; u++) {
            double qx = (double)u - ox, qy = (double)v - oy;
            double px = i00 * qx + i01 * qy + cx, py = i10 * qx + i11 * qy + cy;
            for (int64_t c = 0; c < C; c++)
                y[(v * W2 + u) * C + c] = bilinear(x, H, W, C, c, px, py, fill);
        }
    return RL_OK;
}

void rl_aug_displace(const float *x, int64_t H, int64_t W, int64_t C, const float *dx,
                     const float *dy, float fill, float *y) {
    for (int64_t v = 0; v < H; v++)
        for (int64_t u = 0; u < W; u++) {
            int64_t p = v * W + u;
            for (int64_t c = 0; c < C; c++)
                y[p * C + c] = bilinear(x, H, W, C, c, (double)u + dx[p], (double)v + dy[p], fill);
        }
}

/* Gaussian smoothing of a (H, W) field in place, separable, edges clamped; tmp H * W. */
static rl_status smooth(float *f, int64_t H, int64_t W, double sigma, float *tmp) {
    int64_t R = (int64_t)ceil(3 * sigma);
    double *k = malloc((size_t)(2 * R + 1) * sizeof *k), sum = 0;
    if (!k) return rl_error(RL_ENOMEM, "augment: no memory for the elastic distortion's kernel");
    for (int64_t i = -R; i <= R; i++)
        sum += k[i + R] = exp(-(double)(i * i) / (2 * sigma * sigma));
    for (int64_t i = 0; i <= 2 * R; i++)
        k[i] /= sum;
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++) {
            double a = 0;
            for (int64_t i = -R; i <= R; i++) {
                int64_t xx = x + i < 0 ? 0 : (x + i >= W ? W - 1 : x + i);
                a += k[i + R] * f[y * W + xx];
            }
            tmp[y * W + x] = (float)a;
        }
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++) {
            double a = 0;
            for (int64_t i = -R; i <= R; i++) {
                int64_t yy = y + i < 0 ? 0 : (y + i >= H ? H - 1 : y + i);
                a += k[i + R] * tmp[yy * W + x];
            }
            f[y * W + x] = (float)a;
        }
    free(k);
    return RL_OK;
}

void rl_aug_stroke(const float *x, int64_t H, int64_t W, int64_t C, int64_t r, float *y) {
    int64_t R = r < 0 ? -r : r;
    for (int64_t v = 0; v < H; v++)
        for (int64_t u = 0; u < W; u++)
            for (int64_t c = 0; c < C; c++) {
                float m = x[(v * W + u) * C + c];
                for (int64_t j = -R; j <= R; j++) {
                    int64_t yy = v + j;
                    if (yy < 0 || yy >= H) continue;
                    for (int64_t i = -R; i <= R; i++) {
                        int64_t xx = u + i;
                        if (xx < 0 || xx >= W || i * i + j * j > R * R) continue;
                        float q = x[(yy * W + xx) * C + c];
                        m = r > 0 ? (q > m ? q : m) : (q < m ? q : m);
                    }
                }
                y[(v * W + u) * C + c] = m;
            }
}

rl_status rl_augment_image(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                           const float *x, int64_t H, int64_t W, int64_t C, rl_tensor *out) {
    int64_t shape[3] = {H, W, C};
    size_t bytes = (size_t)(H * W * C) * sizeof(float);
    rl_tensor cur = {0};
    RL_TRY(rl_tensor_empty(&cur, RL_FLOAT32, RL_DEVICE_CPU, 3, shape));
    memcpy(rl_tensor_data(&cur), x, bytes);

    aug_rng r = rng_make(seed, epoch, index, AUG_STROKE);
    if (rng_unit(&r) < cfg->stroke_p) {
        int64_t rad = rng_int(&r, -cfg->stroke_radius, cfg->stroke_radius);
        if (rad != 0) rl_aug_stroke(x, H, W, C, rad, rl_tensor_data(&cur));
    }

    r = rng_make(seed, epoch, index, AUG_AFFINE);
    if (rng_unit(&r) < cfg->affine_p) {
        double k = rng_range(&r, 1 - cfg->scale, 1 + cfg->scale);
        double s = rng_range(&r, -cfg->shear, cfg->shear);
        double rot = rng_range(&r, -cfg->rotate, cfg->rotate) * (M_PI / 180);
        rl_tensor next = {0};
        rl_status st = rl_aug_affine(rl_tensor_data(&cur), H, W, C, k, s, rot, cfg->fill, &next);
        rl_tensor_release(&cur);
        if (st != RL_OK) return st;
        cur = next;
        H = cur.shape[0];
        W = cur.shape[1];
    }

    r = rng_make(seed, epoch, index, AUG_ELASTIC);
    if (rng_unit(&r) < cfg->elastic_p && cfg->elastic_alpha > 0) {
        size_t n = (size_t)(H * W);
        float *buf = malloc((3 * n + (size_t)(H * W * C)) * sizeof *buf);
        if (!buf) {
            rl_tensor_release(&cur);
            return rl_error(RL_ENOMEM, "augment: no memory for the elastic distortion");
        }
        float *dx = buf, *dy = buf + n, *tmp = buf + 2 * n, *img = buf + 3 * n;
        for (size_t i = 0; i < n; i++) {
            dx[i] = (float)rng_range(&r, -1, 1);
            dy[i] = (float)rng_range(&r, -1, 1);
        }
        rl_status st = smooth(dx, H, W, cfg->elastic_sigma, tmp);
        if (st == RL_OK) st = smooth(dy, H, W, cfg->elastic_sigma, tmp);
        if (st != RL_OK) {
            free(buf);
            rl_tensor_release(&cur);
            return st;
        }
        double ss = 0;
        for (size_t i = 0; i < n; i++)
            ss += (double)dx[i] * dx[i] + (double)dy[i] * dy[i];
        double g = ss > 0 ? cfg->elastic_alpha / sqrt(ss / (double)n) : 0;
        for (size_t i = 0; i < n; i++) {
            dx[i] = (float)(dx[i] * g);
            dy[i] = (float)(dy[i] * g);
        }
        memcpy(img, rl_tensor_data(&cur), (size_t)(H * W * C) * sizeof *img);
        rl_aug_displace(img, H, W, C, dx, dy, cfg->fill, rl_tensor_data(&cur));
        free(buf);
    }

    r = rng_make(seed, epoch, index, AUG_SPEC);
    /* images: time is the width (stride C), frequency the height (stride W C) */
    rl_status st = spec(cfg, &r, rl_tensor_data(&cur), W, C, H, W * C, C);
    if (st != RL_OK) {
        rl_tensor_release(&cur);
        return st;
    }
    *out = cur;
    return RL_OK;
}

/* ---- waveforms ---- */

rl_status rl_aug_speed(const float *x, int64_t n, double factor, rl_tensor *out) {
    double ratio = 1.0 / factor;
    if (!(factor > 0) || !src_is_valid_ratio(ratio))
        return rl_error(RL_EARG, "augment: speed factor %g is not usable", factor);
    if (factor == 1) { /* the converter's low-pass would still take the top of the band off */
        RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
        memcpy(rl_tensor_data(out), x, (size_t)n * sizeof *x);
        return RL_OK;
    }
    int64_t cap = (int64_t)ceil((double)n * ratio) + 16;
    RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 1, &cap));
    SRC_DATA d = {.data_in = x,
                  .data_out = rl_tensor_data(out),
                  .input_frames = (long)n,
                  .output_frames = (long)cap,
                  .src_ratio = ratio};
    /* the medium sinc converter (90% bandwidth): the fastest one's 80% took 6.4..8 kHz of
     * 16 kHz audio off every perturbed utterance (a 6 kHz tone lost 20% of its amplitude at
     * factor 1.05, a 7 kHz one 95%), so the top mel bands of perturbed utterances were
     * 1..3 standard deviations below those of the cached ones; the best converter (97%) took
     * 3 times as long again (60..110 ms for 2 s of audio on the loaded development machine) */
    int err = src_simple(&d, SRC_SINC_MEDIUM_QUALITY, 1);
    if (err || d.output_frames_gen < 1) {
        rl_tensor_release(out);
        return rl_error(RL_EIO, "augment: speed %g of %lld samples: %s", factor, (long long)n,
                        err ? src_strerror(err) : "no output");
    }
    out->shape[0] = d.output_frames_gen;
    return RL_OK;
}

/* sum_i a_i b_i / sqrt(sum_i b_i^2), i < h (0 for a silent b) */
static double tempo_similarity(const float *a, const float *b, int64_t h) {
    float ab = 0, bb = 0;
    for (int64_t i = 0; i < h; i++) {
        ab += a[i] * b[i];
        bb += b[i] * b[i];
    }
    return bb > 0 ? (double)ab / sqrt((double)bb) : 0;
}

rl_status rl_aug_tempo(const float *x, int64_t n, double factor, double rate, rl_tensor *out) {
    if (!(factor > 0 && isfinite(factor)) || !(rate > 0 && isfinite(rate)))
        return rl_error(RL_EARG, "augment: tempo needs a factor > 0 and a rate > 0, got %g, %g",
                        factor, rate);
    if (n < 1) return rl_error(RL_EARG, "augment: tempo of an empty waveform");
    int64_t m = (int64_t)llround((double)n / factor);
    if (m < 1) m = 1;
    RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 1, &m));
    float *y = rl_tensor_data(out);
    if (factor == 1) {
        memcpy(y, x, (size_t)n * sizeof *x);
        return RL_OK;
    }
    int64_t h = (int64_t)llround(0.015 * rate), D = (int64_t)llround(0.010 * rate);
    /* the coarse search's step: 0.25 ms, a twelfth of the period of 4 kHz */
    int64_t g = (int64_t)llround(0.00025 * rate);
    if (h < 1) h = 1;
    if (g < 1) g = 1;
    /* the input with zeros around it: s_k + d >= -h - D; the last frame has (k - 1) h < m,
     * so round(k h f) <= m f + h f + 1 <= n + h f + 2, and it reads up to s_k + D + 2 h */
    int64_t lpad = h + D, rpad = (int64_t)ceil(factor) * h + h + D + 4;
    float *buf = calloc((size_t)(lpad + n + rpad + 2 * h), sizeof *buf);
    if (!buf) {
        rl_tensor_release(out);
        return rl_error(RL_ENOMEM, "augment: no memory for the tempo of %lld samples",
                        (long long)n);
    }
    float *xp = buf + lpad, *w = buf + lpad + n + rpad;
    memcpy(xp, x, (size_t)n * sizeof *x);
    for (int64_t i = 0; i < 2 * h; i++)
        w[i] = (float)(0.5 - 0.5 * cos(M_PI * (double)i / (double)h));
    memset(y, 0, (size_t)m * sizeof *y);
    int64_t prev = 0;
    for (int64_t k = 0; (k - 1) * h < m; k++) {
        int64_t s = (int64_t)llround((double)(k * h) * factor) - h;
        if (k > 0) {
            /* every g-th move first, then the moves around the best of them */
            const float *nat = xp + prev + h;
            int64_t best = 0;
            double best_score = tempo_similarity(nat, xp + s, h);
            for (int64_t d = g; d <= D; d += g)
                for (int sign = -1; sign <= 1; sign += 2) {
                    double sc = tempo_similarity(nat, xp + s + sign * d, h);
                    if (sc > best_score) {
                        best_score = sc;
                        best = sign * d;
                    }
                }
            int64_t lo = best - g + 1 < -D ? -D : best - g + 1,
                    hi = best + g - 1 > D ? D : best + g - 1, coarse = best;
            for (int64_t d = lo; d <= hi; d++) {
                if (d == coarse) continue;
                double sc = tempo_similarity(nat, xp + s + d, h);
                if (sc > best_score) {
                    best_score = sc;
                    best = d;
                }
            }
            s += best;
        }
        prev = s;
        int64_t o = (k - 1) * h;
        for (int64_t i = 0; i < 2 * h; i++)
            if (o + i >= 0 && o + i < m) y[o + i] += w[i] * xp[s + i];
    }
    free(buf);
    return RL_OK;
}

void rl_aug_add_noise(float *x, int64_t n, const float *noise, int64_t nn, int64_t offset,
                      double snr_db, double *gain) {
    double px = 0, pz = 0;
    for (int64_t i = 0; i < n; i++) {
        double z = noise[(offset + i) % nn];
        px += (double)x[i] * x[i];
        pz += z * z;
    }
    *gain = 0;
    if (px <= 0 || pz <= 0) return;
    double g = sqrt(px / (pz * pow(10, snr_db / 10)));
    for (int64_t i = 0; i < n; i++)
        x[i] += (float)(g * noise[(offset + i) % nn]);
    *gain = g;
}

bool rl_augment_wave_fires(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index) {
    aug_rng a = rng_make(seed, epoch, index, AUG_SPEED);
    aug_rng t = rng_make(seed, epoch, index, AUG_TEMPO);
    aug_rng b = rng_make(seed, epoch, index, AUG_NOISE);
    bool speed = rng_unit(&a) < cfg->speed_p, tempo = rng_unit(&t) < cfg->tempo_p,
         noise = rng_unit(&b) < cfg->noise_p;
    return speed || tempo || noise;
}

rl_status rl_augment_wave(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                          const float *x, int64_t n, double rate, const rl_aug_noise *noises,
                          int64_t n_noises, rl_tensor *out) {
    aug_rng r = rng_make(seed, epoch, index, AUG_SPEED);
    if (rng_unit(&r) < cfg->speed_p) {
        RL_TRY(rl_aug_speed(x, n, rng_range(&r, cfg->speed_min, cfg->speed_max), out));
    } else {
        RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 1, &n));
        memcpy(rl_tensor_data(out), x, (size_t)n * sizeof *x);
    }
    r = rng_make(seed, epoch, index, AUG_TEMPO);
    if (rng_unit(&r) < cfg->tempo_p) {
        rl_tensor t = {0};
        rl_status st = rl_aug_tempo(rl_tensor_data(out), out->shape[0],
                                    rng_range(&r, cfg->tempo_min, cfg->tempo_max), rate, &t);
        rl_tensor_release(out);
        if (st != RL_OK) return st;
        *out = t;
    }
    r = rng_make(seed, epoch, index, AUG_NOISE);
    if (rng_unit(&r) < cfg->noise_p && n_noises > 0) {
        const rl_aug_noise *z = &noises[rng_int(&r, 0, n_noises - 1)];
        int64_t off = rng_int(&r, 0, z->n - 1);
        double snr = rng_range(&r, cfg->snr_min, cfg->snr_max), g;
        rl_aug_add_noise(rl_tensor_data(out), out->shape[0], z->x, z->n, off, snr, &g);
    }
    return RL_OK;
}
