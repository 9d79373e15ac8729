/* libFuzzer target: the sound file reader (rl_audio_load, core/audio.c: libsndfile, the
 * truncation and non-finite checks, the channel mix and libsamplerate) and the feature frontend
 * (rl_audio_features) on arbitrary bytes written to a .wav file. A bad file must be an error
 * naming the file, never a crash, a sanitizer finding, a hang or an allocation the file's size
 * does not justify (libFuzzer's -rss_limit_mb and -malloc_limit_mb); a file it accepts must give
 * at least one sample, all finite, and features of any that are long enough must be finite or
 * the error of a waveform that overflows float32 (an abort otherwise). Seeds: fuzz/corpus/wav. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/audio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

static void require_names_file(const char *what) {
    if (strstr(rl_errmsg(), path) == NULL) {
        fprintf(stderr, "FUZZ INVARIANT: %s: an error not naming the file: %s\n", what,
                rl_errmsg());
        abort();
    }
}

static void check_wave(const rl_tensor *t, const char *what) {
    const float *x = rl_tensor_data(t);
    int64_t n = t->shape[0];
    if (n < 1) {
        fprintf(stderr, "FUZZ INVARIANT: %s: no samples and no error\n", what);
        abort();
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            fprintf(stderr, "FUZZ INVARIANT: %s: sample %lld is %g\n", what, (long long)i, x[i]);
            abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (path[0] == 0) snprintf(path, sizeof path, "/tmp/rnnlua-fuzz-%ld.wav", (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();

    rl_tensor wave = {0};
    int64_t rate = 0;
    if (rl_audio_load(path, 0, false, &wave, &rate) != RL_OK) {
        require_names_file("load");
        return 0;
    }
    check_wave(&wave, "load");
    int64_t n = wave.shape[0];
    /* features of at most one second: the frontend's cost is per sample, not the file's */
    rl_audio_cfg cfg = rl_audio_cfg_default();
    cfg.rate = 16000;
    int64_t nf = n < 16000 ? n : 16000;
    if (rl_audio_num_frames(&cfg, nf) > 0) {
        rl_tensor feat = {0};
        if (rl_audio_features("fuzz", &cfg, rl_tensor_data(&wave), nf, &feat) != RL_OK) {
            /* samples far outside [-1, 1] overflow float32: an error, the only one allowed */
            if (strncmp(rl_errmsg(), "fuzz: frame ", 12) != 0 ||
                strstr(rl_errmsg(), "overflows float32") == NULL) {
                fprintf(stderr, "FUZZ INVARIANT: features of %lld samples: %s\n", (long long)nf,
                        rl_errmsg());
                abort();
            }
            rl_tensor_release(&wave);
            return 0;
        }
        const float *y = rl_tensor_data(&feat);
        for (int64_t i = 0; i < rl_tensor_numel(&feat); i++)
            if (!isfinite(y[i])) {
                fprintf(stderr, "FUZZ INVARIANT: feature %lld is %g\n", (long long)i, y[i]);
                abort();
            }
        rl_tensor_release(&feat);
    }
    rl_tensor_release(&wave);
    /* resampling costs up to 256 output samples per input one: short files only */
    if (n <= 4000 && rate != 16000) {
        rl_tensor res = {0};
        int64_t r2 = 0;
        if (rl_audio_load(path, 16000, true, &res, &r2) != RL_OK) {
            require_names_file("resample");
            return 0;
        }
        check_wave(&res, "resample");
        rl_tensor_release(&res);
    }
    return 0;
}
