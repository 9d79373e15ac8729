/* CTC decoding and label error counting on the host (kernels/ctc.h). */
#include "ctc.h"

int64_t rl_ctc_collapse(const int32_t *path, int64_t n, int64_t stride, int32_t blank,
                        int32_t *out) {
    int64_t k = 0;
    int32_t prev = -1;
    for (int64_t t = 0; t < n; t++) {
        int32_t c = path[t * stride];
        if (c != prev && c != blank) out[k++] = c;
        prev = c;
    }
    return k;
}

int64_t rl_edit_distance(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int64_t *row) {
    for (int64_t j = 0; j <= nb; j++)
        row[j] = j;
    for (int64_t i = 1; i <= na; i++) {
        int64_t diag = row[0];
        row[0] = i;
        for (int64_t j = 1; j <= nb; j++) {
            int64_t up = row[j];
            int64_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}
