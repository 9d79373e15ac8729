/* rl_audio_load on files written here through libsndfile: WAV (16-bit, stereo), FLAC and
 * OGG/Vorbis round trips, resampling 8 kHz -> 16 kHz against the analytic sine, and every bad
 * file (missing, empty, not audio, zero-length, truncated, wrong rate without resampling) as
 * an error naming the file. */
#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/audio.h"

static char dir[] = "/tmp/rl_test_audio_XXXXXX";

static const char *path_of(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* Writes n frames of ch channels: channel c of frame i is sin(2 pi f i / rate) * (c + 1) / ch
 * * 0.5. Returns 0 on success. */
static int write_sine(const char *path, int format, int rate, int ch, int64_t n, double f) {
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *s = sf_open(path, SFM_WRITE, &info);
    if (!s) {
        fprintf(stderr, "cannot write %s: %s\n", path, sf_strerror(NULL));
        return 1;
    }
    float *buf = malloc((size_t)(n * ch + 1) * sizeof *buf);
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < ch; c++)
            buf[i * ch + c] = (float)(0.5 * sin(2 * M_PI * f * (double)i / rate) * (c + 1) / ch);
    sf_count_t w = sf_writef_float(s, buf, n);
    free(buf);
    sf_close(s);
    return w == n ? 0 : 1;
}

/* max |x_i - 0.5 * scale * sin(2 pi f i / rate)| over i in [from, to) */
static double sine_err(const rl_tensor *x, double f, double rate, double scale, int64_t from,
                       int64_t to) {
    const float *p = rl_tensor_data(x);
    double m = 0;
    for (int64_t i = from; i < to; i++)
        m = fmax(m, fabs(p[i] - 0.5 * scale * sin(2 * M_PI * f * (double)i / rate)));
    return m;
}

/* expects RL_EIO/RL_EARG with the path and `what` in the message */
static void expect_fail(const char *path, int64_t rate, bool resample, const char *what) {
    rl_tensor x = {0};
    int64_t r = 0;
    rl_status st = rl_audio_load(path, rate, resample, &x, &r);
    CHECK(st != RL_OK);
    CHECK(x.storage == NULL);
    if (st == RL_OK)
        fprintf(stderr, "%s loaded (%lld samples) instead of failing\n", path,
                (long long)x.shape[0]);
    rl_tensor_release(&x);
    if (st != RL_OK && (!strstr(rl_errmsg(), path) || !strstr(rl_errmsg(), what)))
        fprintf(stderr, "message for %s lacks '%s': %s\n", path, what, rl_errmsg()), check_failed++;
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    rl_tensor x = {0};
    int64_t rate = 0;

    /* 16-bit stereo WAV: mixed down to the mean of the channels, 0.75 * the sine */
    CHECK(write_sine(path_of("a.wav"), SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, 8000, 440) == 0);
    CHECK_OK(rl_audio_load(path_of("a.wav"), 0, true, &x, &rate));
    CHECK(rate == 16000 && x.ndim == 1 && x.shape[0] == 8000 && x.dtype == RL_FLOAT32);
    if (x.storage) CHECK(sine_err(&x, 440, 16000, 0.75, 0, 8000) < 1e-4);
    rl_tensor_release(&x);

    /* FLAC (lossless 16-bit) */
    CHECK(write_sine(path_of("a.flac"), SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 8000, 300) ==
          0);
    CHECK_OK(rl_audio_load(path_of("a.flac"), 0, true, &x, &rate));
    CHECK(rate == 16000 && x.shape[0] == 8000);
    if (x.storage) CHECK(sine_err(&x, 300, 16000, 1, 0, 8000) < 1e-4);
    rl_tensor_release(&x);

    /* OGG/Vorbis (lossy: the sine within a few percent away from the edges) */
    CHECK(write_sine(path_of("a.ogg"), SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 16000, 500) ==
          0);
    CHECK_OK(rl_audio_load(path_of("a.ogg"), 0, true, &x, &rate));
    CHECK(rate == 16000 && x.shape[0] == 16000);
    if (x.storage && x.shape[0] == 16000) CHECK(sine_err(&x, 500, 16000, 1, 1000, 15000) < 0.05);
    rl_tensor_release(&x);

    /* resampling: an 8 kHz sine of 1 kHz read at 16 kHz is the 16 kHz sine (away from edges) */
    CHECK(write_sine(path_of("b8k.wav"), SF_FORMAT_WAV | SF_FORMAT_FLOAT, 8000, 1, 8000, 1000) ==
          0);
    CHECK_OK(rl_audio_load(path_of("b8k.wav"), 16000, true, &x, &rate));
    CHECK(rate == 16000 && llabs(x.shape[0] - 16000) <= 2);
    if (x.storage && x.shape[0] > 15000) CHECK(sine_err(&x, 1000, 16000, 1, 500, 15000) < 2e-3);
    rl_tensor_release(&x);
    expect_fail(path_of("b8k.wav"), 16000, false, "resample = false");

    /* bad files */
    expect_fail(path_of("missing.wav"), 0, true, "cannot read");
    FILE *f = fopen(path_of("empty.wav"), "wb");
    fclose(f);
    expect_fail(path_of("empty.wav"), 0, true, "cannot read");
    f = fopen(path_of("text.wav"), "wb");
    fputs("this is not a sound file, only text that is long enough to have a header\n", f);
    fclose(f);
    expect_fail(path_of("text.wav"), 0, true, "cannot read");
    CHECK(write_sine(path_of("zero.wav"), SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 0, 1) == 0);
    expect_fail(path_of("zero.wav"), 0, true, "no samples");
    CHECK(write_sine(path_of("cut.wav"), SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 8000, 1) == 0);
    CHECK(truncate(path_of("cut.wav"), 44 + 4000) == 0);
    expect_fail(path_of("cut.wav"), 0, true, "truncated");
    CHECK(write_sine(path_of("cut.flac"), SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 16000,
                     300) == 0);
    CHECK(truncate(path_of("cut.flac"), 3000) == 0);
    expect_fail(path_of("cut.flac"), 0, true, "");

    /* a float WAV holding a NaN */
    {
        SF_INFO info = {
            .samplerate = 16000, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_FLOAT};
        SNDFILE *s = sf_open(path_of("nan.wav"), SFM_WRITE, &info);
        float v[4] = {0.1f, 0.2f, NAN, 0.3f};
        CHECK(s && sf_writef_float(s, v, 4) == 4);
        if (s) sf_close(s);
        expect_fail(path_of("nan.wav"), 0, true, "sample 2 (channel 0) is not finite");
    }

    const char *names[] = {"a.wav",    "a.flac",   "a.ogg",   "b8k.wav",  "empty.wav",
                           "text.wav", "zero.wav", "cut.wav", "cut.flac", "nan.wav"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        unlink(path_of(names[i]));
    rmdir(dir);
    TEST_MAIN_END();
}
