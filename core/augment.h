/* Data augmentation on the fly (core/augment.c): SpecAugment for feature sequences and images,
 * random affine maps, elastic distortion and stroke-width change for images, speed perturbation
 * and tempo perturbation and additive noise for waveforms.
 *
 * Every random draw comes from Philox4x32-10 (philox.h) under the key `seed`, on the stream
 * (epoch << 32) | index, so a sequence's augmentation depends only on (seed, epoch, index):
 * neither on the order sequences are read in, nor on threads, nor on an earlier run (a resume
 * gets the same bits). Each transform draws from its own counter range, so switching one on or
 * off leaves the others' draws as they were. Each transform first draws one uniform number u
 * and is applied when u < its probability p (so p = 0 never and p = 1 always applies it).
 *
 * Layouts: a feature sequence is (T, F) float32 row-major, time the outer axis; an image is
 * (H, W, C) float32 row-major (pixel (y, x) channel c at (y W + x) C + c), its time axis the
 * width and its frequency axis the height. A waveform is (N) float32.
 * Buffers are the caller's; functions that change a size write a new tensor into `out` (unset
 * on entry). Errors (RL_EARG, RL_ENOMEM) name the option or the buffer.
 */
#ifndef RL_AUGMENT_H
#define RL_AUGMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* SpecAugment (Park et al. 2019): time_masks masks of width uniform in [0, time_width]
     * (and at most time_ratio * T) frames, freq_masks masks of width uniform in
     * [0, freq_width] columns (image rows), set to mask_value; time warping of the sequence by
     * a distance uniform in [-time_warp, time_warp] frames at a point uniform in
     * [time_warp, T - time_warp), the length kept; frequency warping (vocal tract length
     * perturbation, after Jaitly and Hinton's VTLP, 2013, on the features) by a factor uniform
     * in [1 - freq_warp, 1 + freq_warp] (0 <= freq_warp <= 0.2), see core/augment.c. */
    double spec_p;
    int64_t time_masks, time_width;
    double time_ratio;
    int64_t freq_masks, freq_width;
    int64_t time_warp;
    double freq_warp;
    float mask_value;
    /* images: the affine map scale (uniform in [1 - scale, 1 + scale]), then shear (slant,
     * x += s (y_c - y) with s uniform in [-shear, shear]), then rotation (uniform in
     * [-rotate, rotate] degrees) about the image centre, into the bounding box of the result */
    double affine_p, shear, scale, rotate;
    /* elastic distortion (Simard et al. 2003): per-pixel displacements uniform in [-1, 1],
     * smoothed by a Gaussian of sigma pixels, scaled to an RMS of alpha pixels */
    double elastic_p, elastic_alpha, elastic_sigma;
    /* stroke width: grey-scale dilation (r > 0, ink is the high value) or erosion (r < 0) by a
     * disk of radius |r|, r uniform in [-stroke_radius, stroke_radius] */
    double stroke_p;
    int64_t stroke_radius;
    float fill; /* the background: pixels mapped from outside the image */
    /* waveforms: speed factor uniform in [speed_min, speed_max] (1.1 = 10% faster, shorter,
     * and higher pitched) */
    double speed_p, speed_min, speed_max;
    /* tempo factor uniform in [tempo_min, tempo_max]: 1.1 = 10% faster and shorter, the pitch
     * kept (WSOLA, rl_aug_tempo) */
    double tempo_p, tempo_min, tempo_max;
    /* additive noise: a noise file chosen uniformly, a start uniform in it (looped when
     * shorter than the utterance), at an SNR uniform in [snr_min, snr_max] dB */
    double noise_p, snr_min, snr_max;
} rl_aug_cfg;

/* Everything off (all probabilities 0), fill and mask value 0. */
rl_aug_cfg rl_aug_cfg_default(void);

/* Checks every field: RL_EARG naming the option as `who`.<group>.<name>. */
rl_status rl_aug_cfg_check(const char *who, const rl_aug_cfg *cfg);

/* A noise recording for rl_augment_wave: n samples at the waveform's rate. */
typedef struct {
    const float *x;
    int64_t n;
} rl_aug_noise;

/* SpecAugment of a feature sequence x (T, F), in place. */
rl_status rl_augment_features(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                              float *x, int64_t T, int64_t F);

/* stroke, affine, elastic, then SpecAugment of an image x (H, W, C); out: a new (H', W', C)
 * float32 tensor (H' = H and W' = W unless the affine map fired). */
rl_status rl_augment_image(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                           const float *x, int64_t H, int64_t W, int64_t C, rl_tensor *out);

/* Whether speed, tempo or noise fires for this sequence (so the caller needs the waveform). */
bool rl_augment_wave_fires(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index);

/* Speed perturbation, tempo perturbation, then additive noise of a waveform x (n) sampled at
 * `rate` Hz (the tempo's window lengths follow from it): out a new (N') tensor. */
rl_status rl_augment_wave(const rl_aug_cfg *cfg, uint64_t seed, uint64_t epoch, uint64_t index,
                          const float *x, int64_t n, double rate, const rl_aug_noise *noises,
                          int64_t n_noises, rl_tensor *out);

/* The deterministic transforms underneath (also what the tests check by hand). */

/* Sets frames [t0, t0 + width) of the time axis (nt steps of stride ts) to value, across the
 * nf x nc other elements (frequency stride fs, channels contiguous); clipped to the axis. */
void rl_aug_mask(float *x, int64_t nt, int64_t ts, int64_t nf, int64_t fs, int64_t nc, int64_t t0,
                 int64_t width, float value);

/* Time warp of the time axis: frame `centre` moves to centre + dist, both sides stretched
 * linearly, linear interpolation between frames; scratch holds nt * nf * nc floats. */
void rl_aug_warp(float *x, int64_t nt, int64_t ts, int64_t nf, int64_t fs, int64_t nc,
                 int64_t centre, int64_t dist, float *scratch);

/* The affine map (scale k, shear s, rotation r radians) of image x (H, W, C) into out. */
rl_status rl_aug_affine(const float *x, int64_t H, int64_t W, int64_t C, double k, double s,
                        double r, float fill, rl_tensor *out);

/* Pixels displaced by (dx, dy) (H * W each), bilinear, into y (H, W, C). */
void rl_aug_displace(const float *x, int64_t H, int64_t W, int64_t C, const float *dx,
                     const float *dy, float fill, float *y);

/* Grey-scale dilation (r > 0) or erosion (r < 0) by a disk of radius |r| into y. */
void rl_aug_stroke(const float *x, int64_t H, int64_t W, int64_t C, int64_t r, float *y);

/* Resampling by 1 / factor with libsamplerate (sinc, medium quality): about n / factor
 * samples into out. */
rl_status rl_aug_speed(const float *x, int64_t n, double factor, rl_tensor *out);

/* Tempo change by `factor` keeping the pitch, by WSOLA (Verhelst and Roelands 1993), the
 * time-scale modification of sox's `tempo` effect: Hann-windowed frames of about 30 ms taken
 * from the input every 15 ms * factor, each moved by up to +-10 ms to the offset whose samples
 * best continue the previous frame (the largest normalised cross-correlation), overlap-added
 * every 15 ms. round(n / factor) samples into out; factor 1 copies x. */
rl_status rl_aug_tempo(const float *x, int64_t n, double factor, double rate, rl_tensor *out);

/* x += g * noise[(offset + i) mod nn], g making 10 log10(P_x / P_noise) = snr_db over the n
 * samples; *gain receives g (0, nothing added, when x or the noise segment is silent). */
void rl_aug_add_noise(float *x, int64_t n, const float *noise, int64_t nn, int64_t offset,
                      double snr_db, double *gain);

#ifdef __cplusplus
}
#endif

#endif
