/* Back-off n-gram language models read from the ARPA text format (Doug Paul's format, as SRILM,
 * KenLM's lmplz and IRSTLM write it), for shallow fusion in decoding (kernels/cpu/ctc_beam.c,
 * lua/rnnlua/lm.lua).
 *
 * The file: optional text, then "\data\", one "ngram N=COUNT" line per order 1..n, then for
 * each order N a "\N-grams:" section of COUNT lines "LOG10PROB w1 ... wN [LOG10BACKOFF]" (fields
 * separated by blanks or tabs, the back-off only below the highest order), then "\end\". Blank
 * lines between sections are allowed. The words of the 1-grams are the vocabulary; every word
 * of a longer n-gram must be one of them, and its context (all but its last word) must be
 * listed among the n-grams of the order below (as SRILM and KenLM write them).
 *
 * Probabilities are stored as natural logarithms (log10 values times ln 10, converted once at
 * load, so every sum of the search is in one base). The probability of w after the history
 * h = (h1 .. hk) (k <= n - 1, most recent last) is the standard back-off:
 *   log p(w | h) = log P(h1 .. hk w)                       when that n-gram is listed,
 *                = log B(h1 .. hk) + log p(w | h2 .. hk)   otherwise (B = 1 when h is unlisted),
 * ending at the 1-gram of w. A word outside the vocabulary is <unk> when the model has one;
 * without <unk> it costs log10 p = -100 (KenLM's convention) and the history restarts after it.
 *
 * Ownership: rl_ngram_load/rl_ngram_parse allocate the model, rl_ngram_free releases it. A
 * loaded model is read-only: any number of threads may score with it at once. */
#ifndef RL_KERNELS_NGRAM_H
#define RL_KERNELS_NGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "../core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The highest order read; a file of a higher order is refused, named. */
#define RL_NGRAM_MAX_ORDER 16

typedef struct rl_ngram rl_ngram;

/* A history: the last n words (ids), most recent last; n <= order - 1. */
typedef struct rl_ngram_state {
    int32_t n;
    int32_t w[RL_NGRAM_MAX_ORDER - 1];
} rl_ngram_state;

/* Reads the ARPA file at path. Errors: RL_EIO (cannot be read), RL_EARG for a malformed file,
 * the message naming the file and line ("FILE:LINE: ..."), RL_ENOMEM. */
rl_status rl_ngram_load(rl_ngram **out, const char *path);
/* The same from text[0..len) (it may hold NUL bytes, which are refused, named); `name` stands
 * for the file in messages. */
rl_status rl_ngram_parse(rl_ngram **out, const char *text, size_t len, const char *name);
void rl_ngram_free(rl_ngram *lm);

int rl_ngram_order(const rl_ngram *lm);
int64_t rl_ngram_count(const rl_ngram *lm, int order); /* n-grams of that order (1-based) */
int32_t rl_ngram_vocab_size(const rl_ngram *lm);
/* The id of word w[0..len), or -1 when it is not in the vocabulary. */
int32_t rl_ngram_word(const rl_ngram *lm, const char *w, size_t len);
const char *rl_ngram_word_text(const rl_ngram *lm, int32_t id);
int32_t rl_ngram_bos(const rl_ngram *lm); /* <s> */
int32_t rl_ngram_eos(const rl_ngram *lm); /* </s> */
int32_t rl_ngram_unk(const rl_ngram *lm); /* <unk>, -1 when the model has none */

/* The history at the start of a sentence: (<s>). */
void rl_ngram_begin(const rl_ngram *lm, rl_ngram_state *s);
/* log p(word | in) (natural log) and, when out is not NULL, the history after word (out may be
 * in). word -1: a word outside the vocabulary. */
double rl_ngram_score(const rl_ngram *lm, const rl_ngram_state *in, int32_t word,
                      rl_ngram_state *out);

/* row[id] = log p(id | in) for every word of the vocabulary (rl_ngram_vocab_size entries), the
 * same numbers as rl_ngram_score gives one at a time, in one pass over the 1-grams and the
 * n-grams that follow the history's contexts (the CTC search's rows of a char LM). */
void rl_ngram_row(const rl_ngram *lm, const rl_ngram_state *in, double *row);

#ifdef __cplusplus
}
#endif

#endif
