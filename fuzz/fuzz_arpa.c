/* libFuzzer target: the ARPA n-gram reader (kernels/ngram.c) on arbitrary bytes. A bad file must
 * come back as an error (RL_EARG with a "name:line: ..." message), never a crash, a sanitizer
 * finding or a hang; a file it accepts must score every word after every 1-gram history and at
 * the start of a sentence to a finite log-probability, and a whole row (rl_ngram_row) must give
 * the same numbers bit for bit (an abort otherwise). Seeds: fuzz/corpus/arpa. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ngram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rl_ngram *lm;
    rl_status st = rl_ngram_parse(&lm, (const char *)data, size, "fuzz.arpa");
    if (st != RL_OK) {
        if (strncmp(rl_errmsg(), "fuzz.arpa", 9) != 0) {
            fprintf(stderr, "FUZZ INVARIANT: an error not naming the file: %s\n", rl_errmsg());
            abort();
        }
        return 0;
    }
    int32_t nw = rl_ngram_vocab_size(lm);
    int32_t lim = nw < 64 ? nw : 64; /* bounded work per input */
    double *row = malloc((size_t)nw * sizeof *row);
    if (!row) abort();
    for (int32_t h = -1; h < lim; h++) {
        rl_ngram_state s;
        rl_ngram_begin(lm, &s);
        if (h >= 0) rl_ngram_score(lm, &s, h, &s);
        rl_ngram_row(lm, &s, row);
        for (int32_t w = -1; w < lim; w++) {
            rl_ngram_state out;
            double p = rl_ngram_score(lm, &s, w, &out);
            if (!isfinite(p) || out.n < 0 || out.n > rl_ngram_order(lm) - 1) {
                fprintf(stderr, "FUZZ INVARIANT: word %d after %d: log p %g, history %d\n", (int)w,
                        (int)h, p, (int)out.n);
                abort();
            }
            if (w >= 0 && row[w] != p) {
                fprintf(stderr, "FUZZ INVARIANT: word %d after %d: row %.17g, score %.17g\n",
                        (int)w, (int)h, row[w], p);
                abort();
            }
        }
    }
    free(row);
    rl_ngram_free(lm);
    return 0;
}
