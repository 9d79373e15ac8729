/* im2col and its transpose on the CPU (see kernels/im2col.h). */
#include "../im2col.h"

#include <string.h>

void rl_im2col_map(int64_t *map, const rl_conv_geom *g, const int32_t *sizes,
                   const int32_t *out_sizes) {
    int64_t K = g->fh * g->fw;
    for (int64_t yo = 0; yo < g->Ho; yo++)
        for (int64_t xo = 0; xo < g->Wo; xo++)
            for (int64_t b = 0; b < g->B; b++) {
                int64_t *m = map + ((yo * g->Wo + xo) * g->B + b) * K;
                int64_t h = sizes[2 * b], w = sizes[2 * b + 1];
                bool out_valid = yo < out_sizes[2 * b] && xo < out_sizes[2 * b + 1];
                for (int64_t i = 0; i < g->fh; i++)
                    for (int64_t j = 0; j < g->fw; j++) {
                        int64_t y = yo * g->sy - g->py + i, x = xo * g->sx - g->px + j;
                        bool ok = out_valid && y >= 0 && y < h && x >= 0 && x < w;
                        m[i * g->fw + j] = ok ? ((y * g->W + x) * g->B + b) * g->F : -1;
                    }
            }
}

void rl_im2col(void *cols, const void *x, const int64_t *map, int64_t n_taps, int64_t F,
               size_t esize) {
    size_t run = (size_t)F * esize;
    char *c = cols;
    const char *src = x;
    for (int64_t k = 0; k < n_taps; k++, c += run) {
        if (map[k] >= 0)
            memcpy(c, src + (size_t)map[k] * esize, run);
        else
            memset(c, 0, run);
    }
}

void rl_col2im(void *dx, const void *dcols, const int64_t *map, int64_t n_taps, int64_t F,
               rl_dtype dt) {
    for (int64_t k = 0; k < n_taps; k++) {
        if (map[k] < 0) continue;
        if (dt == RL_FLOAT32) {
            float *d = (float *)dx + map[k];
            const float *s = (const float *)dcols + k * F;
            for (int64_t f = 0; f < F; f++)
                d[f] += s[f];
        } else {
            double *d = (double *)dx + map[k];
            const double *s = (const double *)dcols + k * F;
            for (int64_t f = 0; f < F; f++)
                d[f] += s[f];
        }
    }
}
