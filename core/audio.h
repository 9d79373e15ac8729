/* Audio in, speech features out (core/audio.c).
 *
 * rl_audio_load reads a sound file through libsndfile (WAV, FLAC, OGG/Vorbis and the other
 * formats it knows), mixes the channels down to mono (their mean) and, when asked for another
 * rate, resamples with libsamplerate (sinc, medium quality). rl_audio_features turns a mono
 * waveform into Kaldi-style log-mel filterbank or MFCC frames with FFTW; the formulas are
 * written at the top of core/audio.c. Errors name the file or the option that was wrong.
 */
#ifndef RL_AUDIO_H
#define RL_AUDIO_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads `path` into `out` (unset on entry): a new CPU float32 tensor (N) of samples, integer
 * PCM scaled to [-1, 1), float files as stored. want_rate == 0 keeps the file's rate; another
 * rate resamples when `resample` is true and is an RL_EARG error otherwise. *rate receives the
 * rate of `out`. An unreadable, empty, truncated or zero-length file is an RL_EIO error naming
 * `path`. */
rl_status rl_audio_load(const char *path, int64_t want_rate, bool resample, rl_tensor *out,
                        int64_t *rate);

typedef enum { RL_WINDOW_POVEY = 0, RL_WINDOW_HAMMING, RL_WINDOW_HANN } rl_window_type;

typedef struct {
    double rate;           /* samples per second of the waveform */
    double window_ms;      /* frame length (Kaldi's frame_length), 25 */
    double hop_ms;         /* frame shift, 10 */
    int64_t n_mels;        /* triangular mel filters, 80 */
    double low_freq;       /* Hz, lower edge of the first filter, 20 */
    double high_freq;      /* Hz, upper edge of the last; <= 0 means nyquist + high_freq, 0 */
    double preemph;        /* pre-emphasis coefficient, 0.97; 0 turns it off */
    rl_window_type window; /* povey */
    double dither;         /* stddev of Gaussian noise added to each frame, 0 (off) */
    uint64_t seed;         /* of the dither noise */
    bool remove_dc;        /* subtract each frame's mean before pre-emphasis, true */
    bool use_power;        /* power spectrum (true) or magnitude (false) */
    bool round_pow2;       /* FFT size: next power of two >= window (true), else the window */
    double floor;          /* mel energies below it are clamped before the log, FLT_EPSILON */
    int64_t n_ceps;        /* 0: log-mel output; > 0: that many MFCCs (<= n_mels) */
    double lifter;         /* cepstral liftering coefficient Q for MFCCs, 0 = none */
    int deltas;            /* 0, 1 (+ deltas) or 2 (+ deltas + delta-deltas) */
    int64_t delta_window;  /* N of the delta regression, 2 (5 frames) */
    bool normalize;        /* per-utterance mean/variance normalisation of every column */
    bool snip_edges;       /* true: only whole windows; false: frames centred on the hops,
                              edges reflected (Kaldi's snip_edges), true */
} rl_audio_cfg;

/* Kaldi's fbank defaults with 80 mels (above). */
rl_audio_cfg rl_audio_cfg_default(void);

/* Checks every field; RL_EARG naming the option (`who` prefixes the message). */
rl_status rl_audio_cfg_check(const char *who, const rl_audio_cfg *cfg);

/* Number of frames of n samples (snip_edges: whole windows only; else about n / hop). */
int64_t rl_audio_num_frames(const rl_audio_cfg *cfg, int64_t n);

/* Features of the mono waveform `wave` (n floats) into `out` (unset on entry): a new CPU
 * float32 tensor (T, F), T = rl_audio_num_frames, F = (n_ceps or n_mels) * (1 + deltas).
 * RL_EARG for a bad option or a waveform shorter than one window. */
rl_status rl_audio_features(const char *who, const rl_audio_cfg *cfg, const float *wave, int64_t n,
                            rl_tensor *out);

#ifdef __cplusplus
}
#endif

#endif
