/* Back-off n-gram models from ARPA files (kernels/ngram.h).
 *
 * Storage: the vocabulary is a string pool with an open-addressing hash (word -> id); every
 * n-gram of every order is an entry (its word ids in one int32 pool, its log-probability and
 * log-back-off) in one open-addressing hash keyed by the id sequence, so a lookup is one hash
 * and a short probe whatever the order. Every allocation is bounded by the file's size (an
 * n-gram line takes at least 2 bytes a word), so a header announcing 2^60 n-grams is refused
 * before anything is allocated for it. */
#include "ngram.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t off; /* into ids */
    int32_t n;
    double prob, bow; /* natural logs */
} entry;

struct rl_ngram {
    int order;
    int64_t count[RL_NGRAM_MAX_ORDER + 1];
    /* vocabulary */
    char *chars;
    size_t chars_len, chars_cap;
    int64_t *word_off; /* id -> offset in chars */
    int32_t n_words, words_cap;
    int32_t *word_slots;
    uint64_t word_mask;
    int32_t bos, eos, unk;
    /* n-grams */
    entry *entries;
    int64_t n_entries, entries_cap;
    int32_t *ids;
    int64_t n_ids, ids_cap;
    int64_t *slots;
    uint64_t mask;
    /* followers: the n-grams (n >= 2) whose context is entry e are follow[follow_off[e] ..
     * follow_off[e + 1]); uni[id]: the 1-gram log-probability of word id (rl_ngram_row) */
    int64_t *follow_off, *follow;
    double *uni;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_ids(const int32_t *w, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)w[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    return h ^ (h >> 31);
}

int32_t rl_ngram_word(const rl_ngram *lm, const char *w, size_t len) {
    for (uint64_t i = hash_bytes(w, len) & lm->word_mask;; i = (i + 1) & lm->word_mask) {
        int32_t id = lm->word_slots[i];
        if (id < 0) return -1;
        const char *s = lm->chars + lm->word_off[id];
        if (strlen(s) == len && memcmp(s, w, len) == 0) return id;
    }
}

static const entry *find(const rl_ngram *lm, const int32_t *w, int32_t n) {
    for (uint64_t i = hash_ids(w, n) & lm->mask;; i = (i + 1) & lm->mask) {
        int64_t e = lm->slots[i];
        if (e < 0) return NULL;
        const entry *x = &lm->entries[e];
        if (x->n == n && memcmp(lm->ids + x->off, w, (size_t)n * sizeof *w) == 0) return x;
    }
}

void rl_ngram_free(rl_ngram *lm) {
    if (!lm) return;
    free(lm->chars);
    free(lm->word_off);
    free(lm->word_slots);
    free(lm->entries);
    free(lm->ids);
    free(lm->slots);
    free(lm->follow_off);
    free(lm->follow);
    free(lm->uni);
    free(lm);
}

int rl_ngram_order(const rl_ngram *lm) { return lm->order; }
int64_t rl_ngram_count(const rl_ngram *lm, int order) {
    return order >= 1 && order <= lm->order ? lm->count[order] : 0;
}
int32_t rl_ngram_vocab_size(const rl_ngram *lm) { return lm->n_words; }
const char *rl_ngram_word_text(const rl_ngram *lm, int32_t id) {
    return id >= 0 && id < lm->n_words ? lm->chars + lm->word_off[id] : NULL;
}
int32_t rl_ngram_bos(const rl_ngram *lm) { return lm->bos; }
int32_t rl_ngram_eos(const rl_ngram *lm) { return lm->eos; }
int32_t rl_ngram_unk(const rl_ngram *lm) { return lm->unk; }

void rl_ngram_begin(const rl_ngram *lm, rl_ngram_state *s) {
    s->n = 0;
    if (lm->order > 1) s->w[s->n++] = lm->bos;
}

double rl_ngram_score(const rl_ngram *lm, const rl_ngram_state *in, int32_t word,
                      rl_ngram_state *out) {
    if (word < 0) word = lm->unk;
    if (word < 0) {
        if (out) out->n = 0;
        return -100.0 * M_LN10;
    }
    int32_t k = in->n, h[RL_NGRAM_MAX_ORDER];
    memcpy(h, in->w, (size_t)k * sizeof *h);
    h[k] = word;
    double acc = 0, r = 0;
    int32_t start = 0;
    for (; start < k; start++) {
        const entry *e = find(lm, h + start, k - start + 1);
        if (e) {
            r = acc + e->prob;
            break;
        }
        const entry *b = find(lm, h + start, k - start);
        if (b) acc += b->bow;
    }
    if (start == k) r = acc + find(lm, &word, 1)->prob;
    if (out) {
        int32_t keep = k + 1 < lm->order - 1 ? k + 1 : lm->order - 1;
        memmove(out->w, h + (k + 1 - keep), (size_t)keep * sizeof *h);
        out->n = keep;
    }
    return r;
}

void rl_ngram_row(const rl_ngram *lm, const rl_ngram_state *in, double *row) {
    /* the contexts c_j = the last j words of the history, j = 1..k, and B_j: the back-offs of
     * the contexts longer than j, added longest first as rl_ngram_score adds them */
    int32_t k = in->n;
    const entry *ctx[RL_NGRAM_MAX_ORDER];
    double B[RL_NGRAM_MAX_ORDER];
    B[k] = 0;
    for (int32_t j = k; j >= 1; j--) {
        ctx[j] = find(lm, in->w + (k - j), j);
        B[j - 1] = ctx[j] ? B[j] + ctx[j]->bow : B[j];
    }
    for (int32_t id = 0; id < lm->n_words; id++)
        row[id] = B[0] + lm->uni[id];
    for (int32_t j = 1; j <= k; j++) {
        if (!ctx[j]) continue;
        int64_t e = ctx[j] - lm->entries;
        for (int64_t f = lm->follow_off[e]; f < lm->follow_off[e + 1]; f++) {
            const entry *x = &lm->entries[lm->follow[f]];
            row[lm->ids[x->off + j]] = B[j] + x->prob;
        }
    }
}

/* The follower lists and the 1-gram array of a model just read (false: out of memory). */
static bool index_followers(rl_ngram *lm) {
    int64_t ne = lm->n_entries;
    lm->follow_off = calloc((size_t)ne + 1, sizeof *lm->follow_off);
    lm->follow = malloc((size_t)(ne ? ne : 1) * sizeof *lm->follow);
    lm->uni = malloc((size_t)(lm->n_words ? lm->n_words : 1) * sizeof *lm->uni);
    int64_t *ctx = malloc((size_t)(ne ? ne : 1) * sizeof *ctx);
    if (!lm->follow_off || !lm->follow || !lm->uni || !ctx) {
        free(ctx);
        return false;
    }
    for (int64_t e = 0; e < ne; e++) {
        const entry *x = &lm->entries[e];
        ctx[e] = -1;
        if (x->n == 1) {
            lm->uni[lm->ids[x->off]] = x->prob;
            continue;
        }
        ctx[e] = find(lm, lm->ids + x->off, x->n - 1) - lm->entries; /* listed: checked */
        lm->follow_off[ctx[e] + 1]++;
    }
    for (int64_t e = 0; e < ne; e++)
        lm->follow_off[e + 1] += lm->follow_off[e];
    int64_t *fill = malloc((size_t)(ne ? ne : 1) * sizeof *fill);
    if (!fill) {
        free(ctx);
        return false;
    }
    memcpy(fill, lm->follow_off, (size_t)ne * sizeof *fill);
    for (int64_t e = 0; e < ne; e++)
        if (ctx[e] >= 0) lm->follow[fill[ctx[e]]++] = e;
    free(fill);
    free(ctx);
    return true;
}

/* ------------------------------------------------------------------------------- reading */

typedef struct {
    const char *text, *name;
    size_t len, pos;
    int64_t line;    /* of the line last read, 1-based */
    const char *cur; /* that line, without its end of line and trailing blanks */
    size_t cur_len;
} reader;

static bool next_line(reader *r) {
    if (r->pos >= r->len) return false;
    const char *s = r->text + r->pos;
    const char *nl = memchr(s, '\n', r->len - r->pos);
    size_t n = nl ? (size_t)(nl - s) : r->len - r->pos;
    r->pos += n + (nl ? 1 : 0);
    r->line++;
    while (n > 0 && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    r->cur = s;
    r->cur_len = n;
    return true;
}

static bool line_is(const reader *r, const char *s) {
    return r->cur_len == strlen(s) && memcmp(r->cur, s, r->cur_len) == 0;
}

static rl_status bad_at(const reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static rl_status bad_at(const reader *r, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rl_error(RL_EARG, "%s:%lld: %s", r->name, (long long)r->line, msg);
}

/* The printable head of the current line for messages. */
static const char *shown(const reader *r, char *buf, size_t cap) {
    size_t n = r->cur_len < cap - 4 ? r->cur_len : cap - 4;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        buf[k++] = (unsigned char)r->cur[i] < 32 ? '?' : r->cur[i];
    if (n < r->cur_len) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = '\0';
    return buf;
}

/* The words w[0..n) joined by blanks, cut to fit buf. */
static const char *context_text(const rl_ngram *lm, const int32_t *w, int32_t n, char *buf,
                                size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < n && k + 1 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? " " : "",
                              lm->chars + lm->word_off[w[i]]);
    return buf;
}

/* A number field: the whole of s[0..n) must be a finite decimal number. */
static bool parse_number(const char *s, size_t n, double *v) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    /* strtod also reads "inf", "nan" and hexadecimal: ARPA numbers are plain decimals */
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789+-.eE", buf[i])) return false;
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    return end == buf + n && isfinite(*v);
}

static int32_t add_word(rl_ngram *lm, const char *w, size_t len) {
    if (lm->chars_len + len + 1 > lm->chars_cap) return -2;
    memcpy(lm->chars + lm->chars_len, w, len);
    lm->chars[lm->chars_len + len] = '\0';
    int32_t id = lm->n_words++;
    lm->word_off[id] = (int64_t)lm->chars_len;
    lm->chars_len += len + 1;
    uint64_t i = hash_bytes(w, len) & lm->word_mask;
    while (lm->word_slots[i] >= 0)
        i = (i + 1) & lm->word_mask;
    lm->word_slots[i] = id;
    return id;
}

/* Inserts the n-gram w[0..n); false when it is listed already. */
static bool add_entry(rl_ngram *lm, const int32_t *w, int32_t n, double prob, double bow) {
    uint64_t i = hash_ids(w, n) & lm->mask;
    for (;; i = (i + 1) & lm->mask) {
        int64_t e = lm->slots[i];
        if (e < 0) break;
        const entry *x = &lm->entries[e];
        if (x->n == n && memcmp(lm->ids + x->off, w, (size_t)n * sizeof *w) == 0) return false;
    }
    entry *x = &lm->entries[lm->n_entries];
    x->off = lm->n_ids;
    x->n = n;
    x->prob = prob;
    x->bow = bow;
    memcpy(lm->ids + lm->n_ids, w, (size_t)n * sizeof *w);
    lm->n_ids += n;
    lm->slots[i] = lm->n_entries++;
    return true;
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n)
        p *= 2;
    return p;
}

/* The n-gram lines of order n (count of them), after their header was read. */
static rl_status read_section(rl_ngram *lm, reader *r, int n) {
    char buf[80];
    for (int64_t k = 0; k < lm->count[n]; k++) {
        do {
            if (!next_line(r))
                return bad_at(r,
                              "the file ends inside the %d-grams: %lld of the %lld announced "
                              "(truncated?)",
                              n, (long long)k, (long long)lm->count[n]);
        } while (r->cur_len == 0);
        if (r->cur[0] == '\\')
            return bad_at(r, "'%s' after %lld %d-grams; the header announced %lld",
                          shown(r, buf, 40), (long long)k, n, (long long)lm->count[n]);
        /* fields: prob, n words, optional back-off */
        const char *f[RL_NGRAM_MAX_ORDER + 3];
        size_t fl[RL_NGRAM_MAX_ORDER + 3];
        int nf = 0;
        size_t i = 0;
        while (i < r->cur_len) {
            while (i < r->cur_len && (r->cur[i] == ' ' || r->cur[i] == '\t'))
                i++;
            if (i >= r->cur_len) break;
            size_t j = i;
            while (j < r->cur_len && r->cur[j] != ' ' && r->cur[j] != '\t')
                j++;
            if (nf == n + 2) {
                nf++;
                break;
            }
            f[nf] = r->cur + i;
            fl[nf++] = j - i;
            i = j;
        }
        bool has_bow = nf == n + 2;
        if (nf < n + 1 || nf > n + 2 || (has_bow && n == lm->order))
            return bad_at(r, "a %d-gram line holds a log10 probability, %d words%s; got '%s'", n, n,
                          n < lm->order ? " and an optional log10 back-off" : "",
                          shown(r, buf, 60));
        double p, b = 0;
        if (!parse_number(f[0], fl[0], &p))
            return bad_at(r, "the log10 probability '%.*s' is not a finite number",
                          (int)(fl[0] < 40 ? fl[0] : 40), f[0]);
        if (p > 0)
            return bad_at(r, "the log10 probability %g is above 0 (a probability above 1)", p);
        if (has_bow && !parse_number(f[n + 1], fl[n + 1], &b))
            return bad_at(r, "the log10 back-off '%.*s' is not a finite number",
                          (int)(fl[n + 1] < 40 ? fl[n + 1] : 40), f[n + 1]);
        int32_t w[RL_NGRAM_MAX_ORDER];
        for (int q = 0; q < n; q++) {
            if (n == 1) {
                if (rl_ngram_word(lm, f[1], fl[1]) >= 0)
                    return bad_at(r, "the word '%.*s' is listed twice among the 1-grams",
                                  (int)(fl[1] < 40 ? fl[1] : 40), f[1]);
                w[0] = add_word(lm, f[1], fl[1]);
                if (w[0] < 0) return bad_at(r, "more text than the file holds (internal)");
            } else {
                w[q] = rl_ngram_word(lm, f[q + 1], fl[q + 1]);
                if (w[q] < 0)
                    return bad_at(r, "the word '%.*s' of this %d-gram is not among the 1-grams",
                                  (int)(fl[q + 1] < 40 ? fl[q + 1] : 40), f[q + 1], n);
            }
        }
        if (n > 1 && !find(lm, w, n - 1))
            return bad_at(r, "the context '%s' of this %d-gram is not listed among the %d-grams",
                          context_text(lm, w, n - 1, buf, sizeof buf), n, n - 1);
        if (!add_entry(lm, w, n, p * M_LN10, b * M_LN10))
            return bad_at(r, "the %d-gram '%s' is listed twice", n, shown(r, buf, 60));
    }
    return RL_OK;
}

static rl_status parse(rl_ngram *lm, reader *r) {
    char buf[80];
    do {
        if (!next_line(r)) {
            r->line = 1;
            return bad_at(r, "no \\data\\ line: not an ARPA language model");
        }
    } while (!line_is(r, "\\data\\"));
    /* the counts */
    int64_t total = 0;
    for (;;) {
        if (!next_line(r)) return bad_at(r, "the file ends in the \\data\\ header (truncated?)");
        if (r->cur_len == 0) continue;
        if (r->cur[0] == '\\') break;
        int n;
        long long c;
        char tail;
        char line[128];
        size_t m = r->cur_len < sizeof line - 1 ? r->cur_len : sizeof line - 1;
        memcpy(line, r->cur, m);
        line[m] = '\0';
        if (m != r->cur_len || sscanf(line, "ngram %d = %lld %c", &n, &c, &tail) != 2 ||
            !strchr(line, '='))
            return bad_at(r, "expected 'ngram N=COUNT' in the \\data\\ header, got '%s'",
                          shown(r, buf, 60));
        if (n != lm->order + 1)
            return bad_at(r, "'ngram %d=' where 'ngram %d=' was expected (orders go 1, 2, ...)", n,
                          lm->order + 1);
        if (n > RL_NGRAM_MAX_ORDER)
            return bad_at(r, "order %d is above the %d this reader takes", n, RL_NGRAM_MAX_ORDER);
        if (c < 0 || (n == 1 && c == 0))
            return bad_at(r, "ngram %d=%lld: a count must be %s", n, c,
                          n == 1 ? "positive" : ">= 0");
        /* each n-gram line takes at least 2 bytes a word and 2 for the number */
        if ((uint64_t)c > (uint64_t)r->len / (uint64_t)(2 * n + 2))
            return bad_at(r,
                          "ngram %d=%lld announces more n-grams than the file's %zu bytes can hold",
                          n, c, r->len);
        lm->order = n;
        lm->count[n] = c;
        total += c;
    }
    if (lm->order == 0) return bad_at(r, "the \\data\\ header lists no 'ngram N=COUNT' line");
    /* sizes bounded by the file: total <= len / 4 */
    lm->words_cap = (int32_t)lm->count[1];
    lm->chars_cap = r->len + 1;
    lm->chars = malloc(lm->chars_cap);
    lm->word_off = malloc((size_t)lm->words_cap * sizeof *lm->word_off);
    uint64_t ws = pow2_at_least(2 * (uint64_t)lm->words_cap);
    lm->word_mask = ws - 1;
    lm->word_slots = malloc(ws * sizeof *lm->word_slots);
    lm->entries_cap = total;
    lm->entries = malloc((size_t)total * sizeof *lm->entries);
    lm->ids_cap = 0;
    for (int n = 1; n <= lm->order; n++)
        lm->ids_cap += lm->count[n] * n;
    lm->ids = malloc((size_t)(lm->ids_cap ? lm->ids_cap : 1) * sizeof *lm->ids);
    uint64_t es = pow2_at_least(2 * (uint64_t)total);
    lm->mask = es - 1;
    lm->slots = malloc(es * sizeof *lm->slots);
    if (!lm->chars || !lm->word_off || !lm->word_slots || !lm->entries || !lm->ids || !lm->slots)
        return rl_error(RL_ENOMEM, "%s: out of memory for %lld n-grams", r->name, (long long)total);
    memset(lm->word_slots, 0xff, ws * sizeof *lm->word_slots);
    memset(lm->slots, 0xff, es * sizeof *lm->slots);
    for (int n = 1; n <= lm->order; n++) {
        char want[32];
        snprintf(want, sizeof want, "\\%d-grams:", n);
        if (n > 1) {
            do {
                if (!next_line(r))
                    return bad_at(r, "the file ends before the %s section (truncated?)", want);
            } while (r->cur_len == 0);
        }
        if (!line_is(r, want)) {
            if (n > 1 && r->cur[0] != '\\')
                return bad_at(r, "more %d-grams than the header's ngram %d=%lld", n - 1, n - 1,
                              (long long)lm->count[n - 1]);
            return bad_at(r, "expected '%s', got '%s'", want, shown(r, buf, 60));
        }
        RL_TRY(read_section(lm, r, n));
    }
    do {
        if (!next_line(r)) return bad_at(r, "the file ends without '\\end\\' (truncated?)");
    } while (r->cur_len == 0);
    if (!line_is(r, "\\end\\")) {
        if (r->cur[0] != '\\')
            return bad_at(r, "more %d-grams than the header's ngram %d=%lld", lm->order, lm->order,
                          (long long)lm->count[lm->order]);
        return bad_at(r, "expected '\\end\\' after the %d-grams, got '%s'", lm->order,
                      shown(r, buf, 60));
    }
    if (!index_followers(lm)) return rl_error(RL_ENOMEM, "%s: out of memory", r->name);
    lm->bos = rl_ngram_word(lm, "<s>", 3);
    lm->eos = rl_ngram_word(lm, "</s>", 4);
    lm->unk = rl_ngram_word(lm, "<unk>", 5);
    if (lm->bos < 0 || lm->eos < 0)
        return rl_error(RL_EARG, "%s: the 1-grams lack %s: a sentence model needs <s> and </s>",
                        r->name, lm->bos < 0 ? "<s>" : "</s>");
    return RL_OK;
}

rl_status rl_ngram_parse(rl_ngram **out, const char *text, size_t len, const char *name) {
    *out = NULL;
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        int64_t line = 1;
        for (const char *p = text; p < nul; p++)
            line += *p == '\n';
        return rl_error(RL_EARG, "%s:%lld: a NUL byte: not an ARPA text file", name,
                        (long long)line);
    }
    rl_ngram *lm = calloc(1, sizeof *lm);
    if (!lm) return rl_error(RL_ENOMEM, "%s: out of memory", name);
    reader r = {.text = text, .name = name, .len = len};
    rl_status st = parse(lm, &r);
    if (st != RL_OK) {
        rl_ngram_free(lm);
        return st;
    }
    *out = lm;
    return RL_OK;
}

rl_status rl_ngram_load(rl_ngram **out, const char *path) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return rl_error(RL_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return rl_error(RL_ENOMEM, "%s: out of memory reading the file", path);
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return rl_error(RL_EIO, "%s: read error", path);
    }
    rl_status st = rl_ngram_parse(out, buf, len, path);
    free(buf);
    return st;
}
