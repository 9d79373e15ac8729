/* Audio reading (libsndfile, libsamplerate) and speech features (FFTW), see core/audio.h.
 *
 * Features follow Kaldi's compute-fbank-feats / compute-mfcc-feats (and so
 * torchaudio.compliance.kaldi.fbank / .mfcc with snip_edges=True), on a waveform x of n
 * samples at rate R:
 *   W = floor(R * window_ms / 1000) samples per frame, S = floor(R * hop_ms / 1000) per hop,
 *   snip_edges (Kaldi's default): T = 1 + floor((n - W) / S) frames, frame t starts at
 *     s_t = t S (only whole windows; n < W is an error).
 *   snip_edges = false: T = floor((n + floor(S / 2)) / S) frames (frame t centred near
 *     t S + S / 2), s_t = t S + floor(S / 2) - floor(W / 2); a sample position j outside
 *     [0, n) is reflected into it (repeatedly): j < 0 -> -j - 1, j >= n -> 2n - 1 - j
 *     (Kaldi's ExtractWindow; torchaudio pads the same way). n < S / 2 gives no frame: an error.
 *   Frame t, i = 0..W-1:  a_i = x[s_t + i] + dither * g_i          (g_i ~ N(0, 1), seeded)
 *     remove_dc:          a_i -= mean_i a_i
 *     pre-emphasis p:     b_i = a_i - p a_{i-1} (i > 0),  b_0 = a_0 - p a_0
 *     window w, c = 2 pi / (W - 1):  hann 0.5 - 0.5 cos(c i),  hamming 0.54 - 0.46 cos(c i),
 *                         povey (0.5 - 0.5 cos(c i))^0.85
 *     FFT of P points (P = next power of two >= W, or W), b w zero-padded:
 *                         X_k = sum_i b_i w_i exp(-2 pi j k i / P),  k = 0..P/2
 *     spectrum:           s_k = |X_k|^2 (use_power) or |X_k|
 *   Mel filters, mel(f) = 1127 ln(1 + f / 700), lo = mel(low_freq), hi = mel(high_freq)
 *   (high_freq <= 0 means R/2 + high_freq), d = (hi - lo) / (M + 1); filter m = 0..M-1 has
 *   left, centre, right edges l = lo + m d, c = l + d, r = c + d, and on bin k < P/2 (frequency
 *   k R / P, mel value u) the weight max(0, min((u - l) / (c - l), (r - u) / (r - c))); the
 *   Nyquist bin k = P/2 gets no weight, as in Kaldi.
 *     log-mel:            L_m = ln(max(sum_k weight_mk s_k, floor))
 *   MFCC (n_ceps = C > 0): orthonormal DCT-II of the log-mels, then liftering with Q:
 *     c_q = sqrt((q == 0 ? 1 : 2) / M) sum_m L_m cos(pi q (m + 0.5) / M),  q = 0..C-1
 *     c_q *= 1 + (Q / 2) sin(pi q / Q)                                     (Q > 0)
 *   Deltas over N frames each side (edge frames repeated), appended as columns:
 *     d_t = sum_{k=1..N} k (c_{t+k} - c_{t-k}) / (2 sum_{k=1..N} k^2); delta-deltas = d of d.
 *   normalize: every column v of the (T, F) result becomes (v - mean) / sqrt(var + 1e-10), the
 *   mean and (population) variance taken over this utterance's T frames.
 */
#include "audio.h"

#include <fftw3.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <samplerate.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

/* ---- reading ---- */

/* Resamples the n floats of `in` from rate `from` to `to` into a new tensor `out`. */
static rl_status resample(const char *path, const float *in, int64_t n, int64_t from, int64_t to,
                          rl_tensor *out) {
    double ratio = (double)to / (double)from;
    if (!src_is_valid_ratio(ratio))
        return rl_error(RL_EARG, "rl.audio.load: '%s': cannot resample %lld Hz to %lld Hz", path,
                        (long long)from, (long long)to);
    /* a few frames of slack: libsamplerate rounds the output length either way */
    int64_t cap = (int64_t)ceil((double)n * ratio) + 16;
    rl_tensor tmp = {0};
    RL_TRY(rl_tensor_empty(&tmp, RL_FLOAT32, RL_DEVICE_CPU, 1, &cap));
    SRC_DATA d = {.data_in = in,
                  .data_out = rl_tensor_data(&tmp),
                  .input_frames = (long)n,
                  .output_frames = (long)cap,
                  .src_ratio = ratio};
    int err = src_simple(&d, SRC_SINC_MEDIUM_QUALITY, 1);
    if (err) {
        rl_tensor_release(&tmp);
        return rl_error(RL_EIO, "rl.audio.load: '%s': resampling %lld Hz to %lld Hz: %s", path,
                        (long long)from, (long long)to, src_strerror(err));
    }
    int64_t got = d.output_frames_gen;
    const float *y = rl_tensor_data(&tmp);
    /* the filter's sums overflow float32 for samples near FLT_MAX (a float file may hold any
     * finite value) */
    for (int64_t i = 0; i < got; i++)
        if (!isfinite(y[i])) {
            rl_tensor_release(&tmp);
            return rl_error(RL_EIO,
                            "rl.audio.load: '%s': resampling %lld Hz to %lld Hz overflows "
                            "float32 at output sample %lld (the file's samples are far outside "
                            "[-1, 1])",
                            path, (long long)from, (long long)to, (long long)i);
        }
    if (got == 0) {
        rl_tensor_release(&tmp);
        return rl_error(RL_EIO, "rl.audio.load: '%s': %lld samples resampled to none", path,
                        (long long)n);
    }
    /* a view of the first `got` samples, sharing the storage */
    rl_tensor_share(out, &tmp);
    out->shape[0] = got;
    rl_tensor_release(&tmp);
    return RL_OK;
}

/* libsndfile logs a WAV/AIFF data chunk longer than the file as "data : N (should be M)";
 * N of 2^31 - 1 or more is a placeholder of streaming writers, not a truncation. */
static bool log_says_truncated(const char *log) {
    if (strstr(log, "truncated")) return true;
    const char *d = strstr(log, "\ndata : ");
    long long said, is;
    return d && sscanf(d, "\ndata : %lld (should be %lld)", &said, &is) == 2 && said > is &&
           said < 0x7fffffffLL;
}

rl_status rl_audio_load(const char *path, int64_t want_rate, bool resample_ok, rl_tensor *out,
                        int64_t *rate) {
    if (want_rate < 0)
        return rl_error(RL_EARG, "rl.audio.load: rate must be positive, got %lld",
                        (long long)want_rate);
    SF_INFO info = {0};
    SNDFILE *f = sf_open(path, SFM_READ, &info);
    if (!f) return rl_error(RL_EIO, "rl.audio.load: cannot read '%s': %s", path, sf_strerror(NULL));
    /* libsndfile shortens the data chunk of a truncated file to what is there and says so only
     * in its log: a file cut short is an error, not a shorter utterance. */
    char log[4096];
    sf_command(f, SFC_GET_LOG_INFO, log, sizeof log);
    if (log_says_truncated(log)) {
        sf_close(f);
        return rl_error(RL_EIO,
                        "rl.audio.load: '%s' is truncated (its header promises more "
                        "samples than the file holds)",
                        path);
    }
    int64_t total;
    if (info.frames <= 0 || info.channels <= 0 || info.samplerate <= 0) {
        sf_close(f);
        return rl_error(RL_EIO, "rl.audio.load: '%s' holds no samples", path);
    }
    if (!rl_mul_ok(info.frames, info.channels, &total) || total > RL_MAX_NUMEL) {
        sf_close(f);
        return rl_error(RL_EIO, "rl.audio.load: '%s': %lld frames of %d channels is too large",
                        path, (long long)info.frames, info.channels);
    }
    if (want_rate != 0 && want_rate != info.samplerate && !resample_ok) {
        sf_close(f);
        return rl_error(RL_EARG,
                        "rl.audio.load: '%s' has rate %d Hz, %lld Hz asked for and resample = "
                        "false",
                        path, info.samplerate, (long long)want_rate);
    }
    /* The header's frame count is a claim: the buffer grows with what is decoded (a 45-byte
     * file announced 3.9e9 samples, and the allocation for them came first). */
    int64_t ch = info.channels, cap = 0, got = 0;
    float *buf = NULL;
    int sferr = 0;
    while (got < info.frames) {
        if (got == cap) {
            cap = cap == 0 ? (65536 + ch - 1) / ch : 2 * cap;
            cap = cap < info.frames ? cap : info.frames;
            float *nb = realloc(buf, (size_t)(cap * ch) * sizeof *buf);
            if (!nb) {
                free(buf);
                sf_close(f);
                return rl_error(RL_ENOMEM, "rl.audio.load: '%s': no memory for %lld samples", path,
                                (long long)(cap * ch));
            }
            buf = nb;
        }
        sf_count_t r = sf_readf_float(f, buf + got * ch, cap - got);
        sferr = sf_error(f);
        if (r <= 0 || sferr) break;
        got += r;
    }
    sf_close(f);
    if (got != info.frames || sferr) {
        free(buf);
        return rl_error(RL_EIO,
                        "rl.audio.load: '%s' is truncated or corrupt: %lld of %lld frames "
                        "read",
                        path, (long long)got, (long long)info.frames);
    }
    int64_t n = info.frames;
    /* a float file can hold NaN or Inf, which would turn every later feature into NaN */
    for (int64_t i = 0; i < total; i++)
        if (!isfinite(buf[i])) {
            free(buf);
            return rl_error(RL_EIO, "rl.audio.load: '%s': sample %lld (channel %lld) is not finite",
                            path, (long long)(i / ch), (long long)(i % ch));
        }
    /* mono: the mean of the channels, in place (frame i's channels start at i * ch >= i) */
    if (ch > 1)
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t c = 0; c < ch; c++)
                s += buf[i * ch + c];
            buf[i] = (float)(s / (double)ch);
        }
    rl_status st;
    if (want_rate != 0 && want_rate != info.samplerate) {
        st = resample(path, buf, n, info.samplerate, want_rate, out);
        if (st == RL_OK) *rate = want_rate;
    } else {
        st = rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 1, &n);
        if (st == RL_OK) {
            memcpy(rl_tensor_data(out), buf, (size_t)n * sizeof *buf);
            *rate = info.samplerate;
        }
    }
    free(buf);
    return st;
}

/* ---- features ---- */

rl_audio_cfg rl_audio_cfg_default(void) {
    return (rl_audio_cfg){.rate = 16000,
                          .window_ms = 25,
                          .hop_ms = 10,
                          .n_mels = 80,
                          .low_freq = 20,
                          .high_freq = 0,
                          .preemph = 0.97,
                          .window = RL_WINDOW_POVEY,
                          .dither = 0,
                          .seed = 0,
                          .remove_dc = true,
                          .use_power = true,
                          .round_pow2 = true,
                          .floor = FLT_EPSILON,
                          .n_ceps = 0,
                          .lifter = 0,
                          .deltas = 0,
                          .delta_window = 2,
                          .normalize = false,
                          .snip_edges = true};
}

static int64_t window_len(const rl_audio_cfg *c) {
    return (int64_t)(c->rate * c->window_ms * 1e-3);
}
static int64_t hop_len(const rl_audio_cfg *c) { return (int64_t)(c->rate * c->hop_ms * 1e-3); }
static int64_t fft_len(const rl_audio_cfg *c) {
    int64_t w = window_len(c), p = 1;
    if (!c->round_pow2) return w;
    while (p < w)
        p *= 2;
    return p;
}
static double mel(double hz) { return 1127.0 * log(1.0 + hz / 700.0); }

rl_status rl_audio_cfg_check(const char *who, const rl_audio_cfg *c) {
    if (!(c->rate > 0 && c->rate <= 1e7))
        return rl_error(RL_EARG, "%s: rate must be in (0, 1e7] Hz, got %g", who, c->rate);
    if (!(c->window_ms > 0 && c->window_ms <= 1000))
        return rl_error(RL_EARG, "%s: window_ms must be in (0, 1000], got %g", who, c->window_ms);
    if (!(c->hop_ms > 0 && c->hop_ms <= 1000))
        return rl_error(RL_EARG, "%s: hop_ms must be in (0, 1000], got %g", who, c->hop_ms);
    if (window_len(c) < 2)
        return rl_error(RL_EARG, "%s: window_ms = %g at %g Hz is under 2 samples", who,
                        c->window_ms, c->rate);
    if (hop_len(c) < 1)
        return rl_error(RL_EARG, "%s: hop_ms = %g at %g Hz is under 1 sample", who, c->hop_ms,
                        c->rate);
    if (c->n_mels < 1 || c->n_mels > 4096)
        return rl_error(RL_EARG, "%s: n_mels must be in [1, 4096], got %lld", who,
                        (long long)c->n_mels);
    double nyq = c->rate / 2, hf = c->high_freq <= 0 ? nyq + c->high_freq : c->high_freq;
    if (!(c->low_freq >= 0 && c->low_freq < nyq))
        return rl_error(RL_EARG, "%s: low_freq must be in [0, %g) (the Nyquist frequency), got %g",
                        who, nyq, c->low_freq);
    if (!(hf > c->low_freq && hf <= nyq))
        return rl_error(RL_EARG,
                        "%s: high_freq = %g gives an upper edge of %g Hz, not in (low_freq = %g, "
                        "%g]",
                        who, c->high_freq, hf, c->low_freq, nyq);
    if (!(c->preemph >= 0 && c->preemph <= 1))
        return rl_error(RL_EARG, "%s: preemph must be in [0, 1], got %g", who, c->preemph);
    if ((unsigned)c->window > RL_WINDOW_HANN)
        return rl_error(RL_EARG, "%s: window must be povey, hamming or hann", who);
    if (!(c->dither >= 0 && isfinite(c->dither)))
        return rl_error(RL_EARG, "%s: dither must be >= 0, got %g", who, c->dither);
    if (!(c->floor > 0 && isfinite(c->floor)))
        return rl_error(RL_EARG, "%s: floor must be > 0 (it is taken the log of), got %g", who,
                        c->floor);
    if (c->n_ceps < 0 || c->n_ceps > c->n_mels)
        return rl_error(RL_EARG, "%s: n_ceps must be in [0, n_mels = %lld], got %lld", who,
                        (long long)c->n_mels, (long long)c->n_ceps);
    if (!(c->lifter >= 0 && isfinite(c->lifter)))
        return rl_error(RL_EARG, "%s: lifter must be >= 0, got %g", who, c->lifter);
    if (c->lifter > 0 && c->n_ceps == 0)
        return rl_error(RL_EARG, "%s: lifter applies to MFCCs: set n_ceps too", who);
    if (c->deltas < 0 || c->deltas > 2)
        return rl_error(RL_EARG, "%s: deltas must be 0, 1 or 2, got %d", who, c->deltas);
    if (c->delta_window < 1 || c->delta_window > 100)
        return rl_error(RL_EARG, "%s: delta_window must be in [1, 100], got %lld", who,
                        (long long)c->delta_window);
    return RL_OK;
}

int64_t rl_audio_num_frames(const rl_audio_cfg *c, int64_t n) {
    int64_t w = window_len(c), s = hop_len(c);
    if (!c->snip_edges) return (n + s / 2) / s;
    return n < w ? 0 : 1 + (n - w) / s;
}

/* The sample a position of a frame reads with snip_edges = false (Kaldi's reflection). */
static int64_t reflect(int64_t j, int64_t n) {
    while (j < 0 || j >= n)
        j = j < 0 ? -j - 1 : 2 * n - 1 - j;
    return j;
}

/* FFTW's planner is not thread-safe; executing a plan is. */
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* The triangular filters, stored sparse: filter m has weights wt[off[m] .. off[m+1]) on bins
 * first[m], first[m]+1, ... */
typedef struct {
    int64_t *first, *off;
    float *wt;
} melbank;

static rl_status melbank_make(const char *who, const rl_audio_cfg *c, int64_t p, melbank *mb) {
    int64_t m_n = c->n_mels, nb = p / 2;
    double hf = c->high_freq <= 0 ? c->rate / 2 + c->high_freq : c->high_freq;
    double lo = mel(c->low_freq), d = (mel(hf) - lo) / (double)(m_n + 1);
    mb->first = malloc((size_t)m_n * sizeof *mb->first);
    mb->off = malloc((size_t)(m_n + 1) * sizeof *mb->off);
    mb->wt = malloc((size_t)(m_n * nb + 1) * sizeof *mb->wt);
    double *u_of = malloc((size_t)nb * sizeof *u_of); /* mel value of each bin */
    if (!mb->first || !mb->off || !mb->wt || !u_of) {
        free(u_of);
        return rl_error(RL_ENOMEM, "%s: no memory for the mel filters", who);
    }
    for (int64_t k = 0; k < nb; k++)
        u_of[k] = mel((double)k * c->rate / (double)p);
    int64_t o = 0;
    for (int64_t m = 0; m < m_n; m++) {
        double l = lo + (double)m * d, ce = l + d, r = ce + d;
        mb->off[m] = o;
        mb->first[m] = -1;
        for (int64_t k = 0; k < nb; k++) {
            double u = u_of[k];
            double w = fmin((u - l) / (ce - l), (r - u) / (r - ce));
            if (w > 0) {
                if (mb->first[m] < 0) mb->first[m] = k;
                /* the weights of one filter are on consecutive bins (a triangle) */
                mb->wt[o++] = (float)w;
            }
        }
        /* an empty filter's log-mel would be the constant ln(floor) */
        if (mb->first[m] < 0) {
            free(u_of);
            return rl_error(
                RL_EARG,
                "%s: n_mels = %lld is too many for a %lld-point FFT: filter %lld covers "
                "no FFT bin (fewer mels, a wider band or a longer window_ms)",
                who, (long long)m_n, (long long)p, (long long)m);
        }
    }
    free(u_of);
    mb->off[m_n] = o;
    return RL_OK;
}

static void melbank_free(melbank *mb) {
    free(mb->first);
    free(mb->off);
    free(mb->wt);
}

/* -O2's cheap vectoriser leaves loops of a run-time length scalar; these few are worth O3 (no
 * -ffast-math: the order of the sums stays as written) */
#define RL_AUDIO_VEC __attribute__((optimize("O3", "no-trapping-math")))

/* DC removal, pre-emphasis and the window of one frame in one pass. */
RL_AUDIO_VEC static void frame_prep(float *restrict buf, const float *restrict x,
                                    const float *restrict win, int64_t w_n, float mean, float pe) {
    buf[0] = ((x[0] - mean) - pe * (x[0] - mean)) * win[0];
    for (int64_t i = 1; i < w_n; i++)
        buf[i] = ((x[i] - mean) - pe * (x[i - 1] - mean)) * win[i];
}

/* |X_k|^2 of nb complex bins (re, im interleaved) */
RL_AUDIO_VEC static void power_spectrum(float *restrict pw, const float *restrict spec,
                                        int64_t nb) {
    for (int64_t k = 0; k < nb; k++)
        pw[k] = spec[2 * k] * spec[2 * k] + spec[2 * k + 1] * spec[2 * k + 1];
}

/* out[i] = ln(max(e[i], fl)) for a normal float fl > 0 (so no argument is 0, subnormal or
 * NaN): Cephes' logf, x = 2^k m with m in [sqrt(1/2), sqrt(2)), ln m by a polynomial of degree 9
 * in m - 1 (relative error about 1e-7, as logf's), written without calls so that the compiler
 * vectorises it; libm's logf took a fifth of the time. */
RL_AUDIO_VEC static void log_floor(float *restrict out, const float *restrict e, int64_t n,
                                   float fl) {
    for (int64_t i = 0; i < n; i++) {
        float v = e[i] > fl ? e[i] : fl;
        uint32_t b;
        memcpy(&b, &v, sizeof b);
        float k = (float)((int32_t)((b >> 23) & 0xff) - 126);
        b = (b & 0x807fffffu) | 0x3f000000u; /* the mantissa as a float in [0.5, 1) */
        float m;
        memcpy(&m, &b, sizeof m);
        bool low = m < 0.707106781186547524f;
        k = low ? k - 1.0f : k;
        float x = low ? m + m - 1.0f : m - 1.0f, z = x * x;
        float y = 7.0376836292e-2f;
        y = y * x - 1.1514610310e-1f;
        y = y * x + 1.1676998740e-1f;
        y = y * x - 1.2420140846e-1f;
        y = y * x + 1.4249322787e-1f;
        y = y * x - 1.6668057665e-1f;
        y = y * x + 2.0000714765e-1f;
        y = y * x - 2.4999993993e-1f;
        y = y * x + 3.3333331174e-1f;
        y = y * x * z - 2.12194440e-4f * k - 0.5f * z;
        out[i] = x + y + 0.693359375f * k;
    }
}

/* The sum of n floats in double, in 4 independent chains (one chain is latency-bound). */
static double sum_double(const float *x, int64_t n) {
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] += x[i + j];
    for (; i < n; i++)
        s[0] += x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* Deltas of the `w` columns starting at src into the columns starting at dst, rows of `ld`. */
static void add_deltas(float *x, int64_t t_n, int64_t ld, int64_t src, int64_t dst, int64_t w,
                       int64_t nw) {
    double den = 0;
    for (int64_t k = 1; k <= nw; k++)
        den += 2.0 * (double)(k * k);
    for (int64_t t = 0; t < t_n; t++)
        for (int64_t j = 0; j < w; j++) {
            double s = 0;
            for (int64_t k = 1; k <= nw; k++) {
                int64_t a = t + k < t_n ? t + k : t_n - 1, b = t - k >= 0 ? t - k : 0;
                s += (double)k * ((double)x[a * ld + src + j] - (double)x[b * ld + src + j]);
            }
            x[t * ld + dst + j] = (float)(s / den);
        }
}

rl_status rl_audio_features(const char *who, const rl_audio_cfg *c, const float *wave, int64_t n,
                            rl_tensor *out) {
    RL_TRY(rl_audio_cfg_check(who, c));
    int64_t w_n = window_len(c), hop = hop_len(c), p = fft_len(c), nb = p / 2 + 1;
    int64_t t_n = rl_audio_num_frames(c, n);
    if (t_n == 0 && c->snip_edges)
        return rl_error(RL_EARG,
                        "%s: the waveform has %lld samples, fewer than one window (%lld samples "
                        "= window_ms %g at %g Hz)",
                        who, (long long)n, (long long)w_n, c->window_ms, c->rate);
    if (t_n == 0)
        return rl_error(RL_EARG,
                        "%s: the waveform has %lld samples, too few for one frame with "
                        "snip_edges = false (half a hop, %lld samples)",
                        who, (long long)n, (long long)(hop - hop / 2));
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(wave[i]))
            return rl_error(RL_EARG, "%s: sample %lld of the waveform is not finite", who,
                            (long long)i);
    int64_t m_n = c->n_mels, base = c->n_ceps ? c->n_ceps : m_n, f_n = base * (1 + c->deltas);
    int64_t shape[2] = {t_n, f_n};
    RL_TRY(rl_tensor_empty(out, RL_FLOAT32, RL_DEVICE_CPU, 2, shape));
    float *y = rl_tensor_data(out);

    melbank mb = {0};
    float *win = malloc((size_t)w_n * sizeof *win);
    float *lm = malloc((size_t)m_n * sizeof *lm), *en = malloc((size_t)m_n * sizeof *en);
    /* the frame when it is dithered or reaches over an edge */
    float *raw = malloc((size_t)w_n * sizeof *raw);
    double *dct = c->n_ceps ? malloc((size_t)(c->n_ceps * m_n) * sizeof *dct) : NULL;
    float *buf = fftwf_malloc((size_t)p * sizeof *buf);
    fftwf_complex *spec = fftwf_malloc((size_t)nb * sizeof *spec);
    float *pw = malloc((size_t)nb * sizeof *pw);
    fftwf_plan plan = NULL;
    rl_status st = RL_OK;
    if (!win || !lm || !en || !raw || (c->n_ceps && !dct) || !buf || !spec || !pw) {
        st = rl_error(RL_ENOMEM, "%s: no memory for the feature buffers", who);
        goto done;
    }
    if ((st = melbank_make(who, c, p, &mb)) != RL_OK) goto done;
    pthread_mutex_lock(&plan_lock);
    plan = fftwf_plan_dft_r2c_1d((int)p, buf, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&plan_lock);
    if (!plan) {
        st = rl_error(RL_ENOMEM, "%s: FFTW could not plan a %lld-point FFT", who, (long long)p);
        goto done;
    }
    double cw = 2.0 * M_PI / (double)(w_n - 1);
    for (int64_t i = 0; i < w_n; i++) {
        double h = 0.5 - 0.5 * cos(cw * (double)i);
        win[i] = (float)(c->window == RL_WINDOW_HANN      ? h
                         : c->window == RL_WINDOW_HAMMING ? 0.54 - 0.46 * cos(cw * (double)i)
                                                          : pow(h, 0.85));
    }
    for (int64_t q = 0; q < c->n_ceps; q++) {
        double sc = sqrt((q == 0 ? 1.0 : 2.0) / (double)m_n);
        double lift = c->lifter > 0 ? 1.0 + 0.5 * c->lifter * sin(M_PI * (double)q / c->lifter) : 1;
        for (int64_t m = 0; m < m_n; m++)
            dct[q * m_n + m] = lift * sc * cos(M_PI * (double)q * ((double)m + 0.5) / (double)m_n);
    }

    /* the floor in float: below FLT_MIN it would be 0 and the log -inf */
    float fl = c->floor < FLT_MIN ? FLT_MIN : (float)c->floor;
    for (int64_t t = 0; t < t_n; t++) {
        int64_t start = c->snip_edges ? t * hop : t * hop + hop / 2 - w_n / 2;
        const float *x = raw;
        if (start >= 0 && start + w_n <= n)
            x = wave + start;
        else
            for (int64_t i = 0; i < w_n; i++)
                raw[i] = wave[reflect(start + i, n)];
        if (c->dither > 0) {
            for (int64_t i = 0; i < w_n; i++) {
                /* Box-Muller on two Philox words; stream = frame, so frames are independent */
                uint64_t e = (uint64_t)(2 * i);
                double u1 = rl_u32_to_unit_open(rl_philox_word(c->seed, (uint64_t)t, 0, e));
                double u2 = rl_u32_to_unit_open(rl_philox_word(c->seed, (uint64_t)t, 0, e + 1));
                raw[i] = x[i] + (float)(c->dither * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            }
            x = raw;
        }
        float mean = 0;
        if (c->remove_dc) mean = (float)(sum_double(x, w_n) / (double)w_n);
        frame_prep(buf, x, win, w_n, mean, (float)c->preemph);
        for (int64_t i = w_n; i < p; i++)
            buf[i] = 0;
        fftwf_execute(plan);
        power_spectrum(pw, &spec[0][0], nb);
        if (!c->use_power)
            for (int64_t k = 0; k < nb; k++)
                pw[k] = sqrtf(pw[k]);
        for (int64_t m = 0; m < m_n; m++) {
            float e = 0;
            const float *wt = mb.wt + mb.off[m], *s = pw + mb.first[m];
            for (int64_t k = 0; k < mb.off[m + 1] - mb.off[m]; k++)
                e += wt[k] * s[k];
            en[m] = e;
            /* samples of a float file may be any finite float: near FLT_MAX (about 1e16 will
             * do) the power spectrum overflows, and the log's floor would turn the NaN or Inf
             * into a plausible constant */
            if (!isfinite(e)) {
                float peak = 0;
                for (int64_t i = 0; i < w_n; i++)
                    peak = fabsf(x[i]) > peak ? fabsf(x[i]) : peak;
                st = rl_error(RL_EARG,
                              "%s: frame %lld overflows float32 (its largest sample is %g): the "
                              "features take a waveform scaled to about [-1, 1]",
                              who, (long long)t, (double)peak);
                goto done;
            }
        }
        log_floor(lm, en, m_n, fl);
        float *row = y + t * f_n;
        if (c->n_ceps) {
            for (int64_t q = 0; q < c->n_ceps; q++) {
                double s = 0;
                for (int64_t m = 0; m < m_n; m++)
                    s += dct[q * m_n + m] * lm[m];
                row[q] = (float)s;
            }
        } else {
            for (int64_t m = 0; m < m_n; m++)
                row[m] = (float)lm[m];
        }
    }
    for (int d = 1; d <= c->deltas; d++)
        add_deltas(y, t_n, f_n, (d - 1) * base, d * base, base, c->delta_window);
    if (c->normalize)
        for (int64_t j = 0; j < f_n; j++) {
            double s = 0, s2 = 0;
            for (int64_t t = 0; t < t_n; t++)
                s += y[t * f_n + j];
            double mean = s / (double)t_n;
            for (int64_t t = 0; t < t_n; t++) {
                double v = y[t * f_n + j] - mean;
                s2 += v * v;
            }
            double inv = 1.0 / sqrt(s2 / (double)t_n + 1e-10);
            for (int64_t t = 0; t < t_n; t++)
                y[t * f_n + j] = (float)((y[t * f_n + j] - mean) * inv);
        }
done:
    if (plan) {
        pthread_mutex_lock(&plan_lock);
        fftwf_destroy_plan(plan);
        pthread_mutex_unlock(&plan_lock);
    }
    melbank_free(&mb);
    free(win);
    free(lm);
    free(en);
    free(raw);
    free(dct);
    fftwf_free(buf);
    fftwf_free(spec);
    free(pw);
    if (st != RL_OK) rl_tensor_release(out);
    return st;
}
