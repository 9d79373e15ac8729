/* The C API's checks beyond examples/embed.c (tests/sh/test_embed.sh builds this against the
 * installed library with pkg-config): bad input of every call gives a status and a message
 * naming the call and the argument; a session used after its model was freed fails cleanly;
 * sessions in threads give the numbers of the serial run; any layer's output; refusals of
 * models that cannot stream or be built.
 * Pushes in C against the Lua network's (check_c_push).
 * Usage: embed_check CAUSAL.h5 BIDIRECTIONAL.h5 DATASET.h5 LUACLASS.h5 SPARSE.h5 LUACLASS.lua
 *        CTC.h5 DIR (test_embed.sh's folder: the dev sequences, LMs and rl.forward's decodings)
 *        STACK.h5 (a causal model of data dim 9 with more kinds of C layers) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <pthread.h>
#include <rnnlua.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Allocations counted while `counting` (check_c_push: a push in C allocates nothing): this
 * program's malloc family, which the library's calls reach, over glibc's. Not with
 * AddressSanitizer, which has its own. */
#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_ALLOCS 0
#endif
#endif
#ifndef COUNT_ALLOCS
#define COUNT_ALLOCS 1
#endif
static atomic_int counting;
static atomic_long n_allocs;
#if COUNT_ALLOCS
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t k);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t a, size_t n);
static void counted(void) {
    if (atomic_load(&counting)) atomic_fetch_add(&n_allocs, 1);
}
void *malloc(size_t n) {
    counted();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t k) {
    counted();
    return __libc_calloc(n, k);
}
void *realloc(void *p, size_t n) {
    counted();
    return __libc_realloc(p, n);
}
int posix_memalign(void **p, size_t a, size_t n) {
    counted();
    *p = __libc_memalign(a, n);
    return *p ? 0 : 12; /* ENOMEM */
}
void *aligned_alloc(size_t a, size_t n) {
    counted();
    return __libc_memalign(a, n);
}
#endif

static int pass, fail;

/* A call expected to fail with status `want` and a message holding every one of `words`. */
static void expect_error(const char *name, rl_status got, rl_status want, const char *words) {
    const char *msg = rl_errmsg();
    int ok = got == want;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", words);
    for (char *w = strtok(buf, "|"); ok && w; w = strtok(NULL, "|"))
        ok = strstr(msg, w) != NULL;
    if (ok) {
        pass++;
    } else {
        fail++;
        printf("FAIL %s: status %d (expected %d), message \"%s\" (expected the words \"%s\")\n",
               name, (int)got, (int)want, msg, words);
    }
}

static void expect(const char *name, int cond) {
    if (cond) {
        pass++;
    } else {
        fail++;
        printf("FAIL %s (%s)\n", name, rl_errmsg());
    }
}

enum { T = 40, B = 3, F = 9 };
static float x[T * B * F];
static int32_t lengths[B] = {40, 17, 29};
static float serial[T * B * 2];

typedef struct {
    rl_model *m;
    int ok;
} job;

static void *thread_main(void *p) {
    job *j = p;
    rl_session *s;
    rl_output out;
    rl_batch b = {.T = T, .B = B, .F = F, .x = x, .lengths = lengths};
    j->ok = rl_session_open(&s, j->m) == RL_OK;
    for (int r = 0; j->ok && r < 20; r++)
        j->ok = rl_session_forward(s, &b, NULL, &out) == RL_OK && out.T == T && out.dim == 2 &&
                memcmp(out.y, serial, sizeof serial) == 0;
    rl_session_free(s);
    return NULL;
}

/* A CTC model (3 labels "a", "b", "c" and the blank 3): its labels; decoding a model's output and
 * hand-made outputs whose labels are known; bad arguments. */
static void check_ctc(const char *file, rl_model *ce) {
    rl_model *m = NULL;
    int32_t blank = 0;
    int64_t n = -1;
    const char *const *names = NULL;
    expect("load ctc", rl_model_load(&m, file, NULL) == RL_OK);
    if (m == NULL) return;
    expect("ctc labels", rl_model_labels(m, &blank, &n, &names) == RL_OK && blank == 3 && n == 3 &&
                             names && strcmp(names[0], "a") == 0 && strcmp(names[2], "c") == 0);
    expect("no ctc layer: blank -1", rl_model_labels(ce, &blank, &n, &names) == RL_OK &&
                                         blank == -1 && n == 0 && names == NULL);
    expect_error("labels model NULL", rl_model_labels(NULL, &blank, &n, &names), RL_EARG,
                 "rl_model_labels|model is NULL");
    expect_error("labels blank NULL", rl_model_labels(m, NULL, &n, &names), RL_EARG,
                 "rl_model_labels|blank is NULL");
    expect_error("labels labels NULL", rl_model_labels(m, &blank, &n, NULL), RL_EARG,
                 "rl_model_labels|labels is NULL");

    /* hand-made: a a _ b b c | a _ a (shorter) -> {0, 1, 2} and {0, 0} by both decoders */
    enum { HT = 6, HB = 2, V = 4 };
    static const int path[HB][HT] = {{0, 0, 3, 1, 1, 2}, {0, 3, 0, 1, 1, 1}};
    static float y[HT * HB * V];
    int32_t len[HB] = {6, 3}, got[8];
    for (int t = 0; t < HT; t++)
        for (int b = 0; b < HB; b++)
            for (int c = 0; c < V; c++)
                y[(t * HB + b) * V + c] = c == path[b][t] ? 0.97f : 0.01f;
    rl_output h = {.y = y, .lengths = len, .T = HT, .B = HB, .dim = V};
    for (int beam = 1; beam <= 8; beam += 7) {
        expect("decode best path / beam", rl_ctc_decode(&h, 0, 3, beam, got, 8, &n) == RL_OK &&
                                              n == 3 && got[0] == 0 && got[1] == 1 && got[2] == 2);
        expect("decode a blank between repeats",
               rl_ctc_decode(&h, 1, 3, beam, got, 8, &n) == RL_OK && n == 2 && got[0] == 0 &&
                   got[1] == 0);
    }
    /* the blank elsewhere: class 3 is then label 2 and class 2 is the blank */
    expect("decode blank 2", rl_ctc_decode(&h, 0, 2, 1, got, 8, &n) == RL_OK && n == 3 &&
                                 got[0] == 0 && got[1] == 2 && got[2] == 1);

    /* the model's own output: labels of the target's classes, at most one a frame */
    rl_batch b = {.T = T, .B = B, .F = F, .x = x, .lengths = lengths};
    rl_output out;
    expect("ctc forward", rl_model_forward(m, &b, NULL, &out) == RL_OK && out.dim == V);
    int32_t many[T];
    int ok = 1;
    for (int s = 0; s < B; s++)
        for (int beam = 1; beam <= 4; beam += 3) {
            ok = ok && rl_ctc_decode(&out, s, 3, beam, many, T, &n) == RL_OK && n >= 0 &&
                 n <= lengths[s];
            for (int64_t i = 0; ok && i < n; i++)
                ok = many[i] >= 0 && many[i] < 3;
        }
    expect("decode the model's output", ok);

    expect_error("decode out NULL", rl_ctc_decode(NULL, 0, 3, 1, got, 8, &n), RL_EARG,
                 "rl_ctc_decode|out is NULL");
    expect_error("decode labels NULL", rl_ctc_decode(&h, 0, 3, 1, NULL, 8, &n), RL_EARG,
                 "rl_ctc_decode|labels is NULL");
    expect_error("decode b", rl_ctc_decode(&h, 2, 3, 1, got, 8, &n), RL_EINDEX,
                 "rl_ctc_decode|b = 2");
    expect_error("decode blank", rl_ctc_decode(&h, 0, 4, 1, got, 8, &n), RL_EARG,
                 "rl_ctc_decode|blank = 4");
    expect_error("decode beam", rl_ctc_decode(&h, 0, 3, 0, got, 8, &n), RL_EARG,
                 "rl_ctc_decode|beam = 0");
    expect_error("decode cap", rl_ctc_decode(&h, 0, 3, 1, got, 2, &n), RL_ESHAPE,
                 "rl_ctc_decode|cap = 2|3 labels");
    expect("decode cap gives the count", n == 3);
    y[(2 * HB + 0) * V + 1] = NAN;
    for (int beam = 1; beam <= 8; beam += 7)
        expect_error("decode NaN", rl_ctc_decode(&h, 0, 3, beam, got, 8, &n), RL_EARG,
                     "rl_ctc_decode|NaN");
    rl_model_free(m);
}

/* ---- language models in CTC decoding (rl_lm_load, rl_ctc_decode_lm) */

/* Sequence i of DIR/in<i>.txt ("T F", then T x F numbers) into x (malloc'ed); 0 when unreadable. */
static int read_seq(const char *dir, int i, float **xs, int *Ts) {
    char path[4096];
    snprintf(path, sizeof path, "%s/in%d.txt", dir, i);
    FILE *f = fopen(path, "r");
    int Fs = 0;
    if (f == NULL || fscanf(f, "%d %d", Ts, &Fs) != 2 || *Ts < 1 || Fs != F) {
        if (f) fclose(f);
        return 0;
    }
    *xs = malloc(sizeof **xs * (size_t)(*Ts * F));
    for (int k = 0; *xs && k < *Ts * F; k++)
        if (fscanf(f, "%f", &(*xs)[k]) != 1) return fclose(f), 0;
    fclose(f);
    return *xs != NULL;
}

/* Line i (1-based) of DIR/<name>.txt: the labels rl.forward decoded. Returns their number, -1 when
 * unreadable. */
static int64_t read_ref(const char *dir, const char *name, int i, int32_t *ref, int64_t cap) {
    char path[4096], line[8192];
    snprintf(path, sizeof path, "%s/%s.txt", dir, name);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int64_t n = -1;
    for (int k = 1; fgets(line, sizeof line, f); k++) {
        if (k != i) continue;
        n = 0;
        for (char *tok = strtok(line, " \n"); tok && n < cap; tok = strtok(NULL, " \n"))
            ref[n++] = (int32_t)atoi(tok);
        break;
    }
    fclose(f);
    return n;
}

/* Whether got[0..n) are the labels of line i of DIR/<name>.txt (printing both when not); *same
 * gets whether they are those of line i of DIR/<other>.txt. */
static int match_ref(const char *dir, const char *name, const char *other, int i,
                     const int32_t *got, int64_t n, int *same) {
    int32_t ref[256], alt[256];
    int64_t nr = read_ref(dir, name, i, ref, 256), na = read_ref(dir, other, i, alt, 256);
    *same = na == n && memcmp(alt, got, sizeof *got * (size_t)(n > 0 ? n : 0)) == 0;
    if (n == nr && memcmp(got, ref, sizeof *got * (size_t)(n > 0 ? n : 0)) == 0) return 1;
    printf("FAIL %s: sequence %d: %lld labels, rl.forward/rl.search %lld:", name, i, (long long)n,
           (long long)nr);
    for (int64_t k = 0; k < n && k < 20; k++)
        printf(" %d", got[k]);
    printf(" vs");
    for (int64_t k = 0; k < nr && k < 20; k++)
        printf(" %d", ref[k]);
    printf("\n");
    return 0;
}

/* The labels of the 5 dev sequences, each alone through the CTC model and decoded with opt, equal
 * rl.forward's (DIR/<name>.txt). Returns how many sequences differ from DIR/<other>.txt. */
static int same_as_lua(rl_model *m, const char *dir, const rl_decode_options *opt, const char *name,
                       const char *other) {
    int ok = 1, differ = 0;
    for (int i = 1; i <= 5; i++) {
        float *xs = NULL;
        int Ts = 0, same = 0;
        int32_t len, got[256];
        int64_t n = -1;
        if (!read_seq(dir, i, &xs, &Ts)) {
            ok = 0;
            printf("FAIL %s: cannot read %s/in%d.txt\n", name, dir, i);
            break;
        }
        len = Ts;
        rl_batch b1 = {.T = Ts, .B = 1, .F = F, .x = xs, .lengths = &len};
        rl_output o;
        rl_status st = rl_model_forward(m, &b1, NULL, &o);
        if (st == RL_OK) st = rl_ctc_decode_lm(&o, 0, opt, got, 256, &n);
        if (st != RL_OK) printf("FAIL %s: sequence %d: %s\n", name, i, rl_errmsg());
        ok = ok && st == RL_OK && match_ref(dir, name, other, i, got, n, &same);
        differ += !same;
        free(xs);
    }
    expect(name, ok);
    return differ;
}

/* The search of the 5 dev sequences' first 12 frames in one batch equals rl.search's labels
 * (DIR/<name>.txt). Returns how many sequences differ from DIR/<other>.txt. */
static int search_as_lua(rl_model *m, const char *dir, const rl_search_options *opt,
                         const char *name, const char *other) {
    enum { ST = 12, SB = 5 };
    static float xs[ST * SB * F];
    int32_t len[SB] = {ST, ST, ST, ST, ST};
    int ok = 1, differ = 0;
    for (int i = 1; i <= SB; i++) {
        float *seq = NULL;
        int Ts = 0;
        if (!read_seq(dir, i, &seq, &Ts) || Ts < ST) {
            printf("FAIL %s: cannot read %s/in%d.txt\n", name, dir, i);
            free(seq);
            expect(name, 0);
            return 0;
        }
        for (int t = 0; t < ST; t++)
            memcpy(xs + ((size_t)t * SB + (size_t)(i - 1)) * F, seq + (size_t)t * F,
                   F * sizeof(float));
        free(seq);
    }
    rl_batch b = {.T = ST, .B = SB, .F = F, .x = xs, .lengths = len};
    rl_hyps h = {.size = sizeof h};
    if (rl_model_search(m, &b, opt, &h) != RL_OK || h.B != SB) {
        printf("FAIL %s: %s\n", name, rl_errmsg());
        expect(name, 0);
        return 0;
    }
    for (int i = 1; i <= SB; i++) {
        int same = 0;
        ok = match_ref(dir, name, other, i, h.labels + h.offsets[i - 1],
                       h.offsets[i] - h.offsets[i - 1], &same) &&
             ok;
        ok = ok && isfinite(h.scores[i - 1]) && h.scores[i - 1] <= 0;
        differ += !same;
    }
    expect(name, ok);
    return differ;
}

typedef struct {
    const rl_output *out;
    const rl_decode_options *opt;
    const int32_t *want;
    int64_t n_want;
    int ok;
} lm_job;

static void *lm_thread(void *p) {
    lm_job *j = p;
    int32_t got[256];
    int64_t n = -1;
    j->ok = 1;
    for (int r = 0; j->ok && r < 10; r++)
        j->ok = rl_ctc_decode_lm(j->out, 0, j->opt, got, 256, &n) == RL_OK && n == j->n_want &&
                memcmp(got, j->want, sizeof *got * (size_t)n) == 0;
    return NULL;
}

/* Threads decoding with one LM (its calls serialised) give the serial labels. */
static void lm_threads(rl_model *m, const char *dir, const rl_decode_options *opt) {
    float *xs = NULL;
    int Ts = 0;
    int32_t len, want[256];
    int64_t n = -1;
    rl_output o;
    if (!read_seq(dir, 1, &xs, &Ts)) {
        expect("lm: threads: read", 0);
        return;
    }
    len = Ts;
    rl_batch b1 = {.T = Ts, .B = 1, .F = F, .x = xs, .lengths = &len};
    expect("lm: threads: serial", rl_model_forward(m, &b1, NULL, &o) == RL_OK &&
                                      rl_ctc_decode_lm(&o, 0, opt, want, 256, &n) == RL_OK);
    lm_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (lm_job){.out = &o, .opt = opt, .want = want, .n_want = n};
        pthread_create(&th[i], NULL, lm_thread, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        expect("lm: 3 threads with one LM", jobs[i].ok);
    }
    free(xs);
}

static void check_lm(const char *file, const char *dir, rl_model *ce) {
    rl_model *m = NULL;
    rl_lm *lm = NULL, *word = NULL, *neural = NULL, *bad = NULL;
    char arpa[4096], ab[4096], charlm[4096], junk[4096], dev[4096];
    snprintf(arpa, sizeof arpa, "%s/lm.arpa", dir);
    snprintf(ab, sizeof ab, "%s/lm_ab.arpa", dir);
    snprintf(charlm, sizeof charlm, "%s/charlm.h5", dir);
    snprintf(junk, sizeof junk, "%s/junk.arpa", dir);
    snprintf(dev, sizeof dev, "%s/dev.h5", dir);
    expect("lm: load ctc", rl_model_load(&m, file, NULL) == RL_OK);
    if (m == NULL) return;
    rl_lm_options wo = {.size = sizeof wo, .word_boundary = "b"};
    expect("lm: load arpa", rl_lm_load(&lm, m, arpa, NULL) == RL_OK);
    expect("lm: load a word LM", rl_lm_load(&word, m, arpa, &wo) == RL_OK);
    expect("lm: load a neural LM", rl_lm_load(&neural, m, charlm, NULL) == RL_OK);

    /* rl.forward{decode = "ctc", lm = ...}'s labels, and the LM changes them */
    rl_decode_options o = {.size = sizeof o, .blank = 3, .beam = 4};
    same_as_lua(m, dir, &o, "dec_plain", "dec_plain");
    o = (rl_decode_options){
        .size = sizeof o, .blank = 3, .beam = 4, .lm = lm, .weight = 1.5, .bonus = 0.5};
    expect("lm: the n-gram LM changes the labels",
           same_as_lua(m, dir, &o, "dec_arpa", "dec_plain") > 0);
    o = (rl_decode_options){
        .size = sizeof o, .blank = 3, .beam = 1, .lm = lm, .weight = 1, .bonus = -0.25};
    same_as_lua(m, dir, &o, "dec_arpa1", "dec_plain");
    o = (rl_decode_options){
        .size = sizeof o, .blank = 3, .beam = 4, .lm = word, .weight = 1, .bonus = 0.5};
    same_as_lua(m, dir, &o, "dec_word", "dec_plain");
    o = (rl_decode_options){
        .size = sizeof o, .blank = 3, .beam = 3, .lm = neural, .weight = 1, .bonus = 0.2};
    expect("lm: the neural LM changes the labels",
           same_as_lua(m, dir, &o, "dec_neural", "dec_plain") > 0);
    lm_threads(m, dir, &o);
    /* the labels given: the model's own are the same LM */
    const char *abc[3] = {"a", "b", "c"}, *xbc[3] = {"x", "b", "c"};
    rl_lm_options lo = {.size = sizeof lo, .labels = abc, .n_labels = 3};
    expect("lm: labels given", rl_lm_load(&bad, m, arpa, &lo) == RL_OK);
    o = (rl_decode_options){
        .size = sizeof o, .blank = 3, .beam = 4, .lm = bad, .weight = 1.5, .bonus = 0.5};
    same_as_lua(m, dir, &o, "dec_arpa", "dec_arpa");
    rl_lm_free(bad);
    bad = NULL;

    /* bad LMs */
    expect_error("lm: out NULL", rl_lm_load(NULL, m, arpa, NULL), RL_EARG,
                 "rl_lm_load|out is NULL");
    expect_error("lm: model NULL", rl_lm_load(&bad, NULL, arpa, NULL), RL_EARG,
                 "rl_lm_load|model is NULL");
    expect_error("lm: path NULL", rl_lm_load(&bad, m, NULL, NULL), RL_EARG,
                 "rl_lm_load|path is NULL");
    expect_error("lm: missing file", rl_lm_load(&bad, m, "no/such.arpa", NULL), RL_EIO,
                 "rl_lm_load|path|no/such.arpa");
    FILE *f = fopen(junk, "w");
    fputs("\\data\\\nngram 1=x\n", f);
    fclose(f);
    expect_error("lm: corrupt ARPA", rl_lm_load(&bad, m, junk, NULL), RL_EIO,
                 "rl_lm_load|junk.arpa:2");
    printf("corrupt ARPA: %s\n", rl_errmsg());
    f = fopen(junk, "w");
    fputs("hello world\n", f);
    fclose(f);
    expect_error("lm: not ARPA", rl_lm_load(&bad, m, junk, NULL), RL_EIO, "rl_lm_load|junk.arpa");
    expect_error("lm: a dataset", rl_lm_load(&bad, m, dev, NULL), RL_EIO, "rl_lm_load|dev.h5");
    printf("dataset as LM: %s\n", rl_errmsg());
    expect_error("lm: vocabulary lacks a label", rl_lm_load(&bad, m, ab, NULL), RL_EIO,
                 "rl_lm_load|lm_ab.arpa|does not cover|'c'");
    printf("uncovered: %s\n", rl_errmsg());
    lo.labels = xbc;
    expect_error("lm: given label not in the vocabulary", rl_lm_load(&bad, m, arpa, &lo), RL_EIO,
                 "rl_lm_load|does not cover|'x'");
    lo.labels = abc;
    lo.n_labels = 2;
    expect_error("lm: n_labels", rl_lm_load(&bad, m, arpa, &lo), RL_EIO,
                 "rl_lm_load|labels must be a list of 3 strings");
    const char *anull[3] = {"a", NULL, "c"};
    lo.labels = anull;
    lo.n_labels = 3;
    expect_error("lm: a label NULL", rl_lm_load(&bad, m, arpa, &lo), RL_EARG,
                 "rl_lm_load|options->labels[1] is NULL");
    lo = (rl_lm_options){.size = 3};
    expect_error("lm: options size", rl_lm_load(&bad, m, arpa, &lo), RL_EARG,
                 "rl_lm_load|options->size = 3");
    lo = (rl_lm_options){.size = sizeof lo, .word_boundary = "z"};
    expect_error("lm: word boundary no label", rl_lm_load(&bad, m, arpa, &lo), RL_EIO,
                 "rl_lm_load|word_boundary 'z'");
    lo = (rl_lm_options){.size = sizeof lo, .layer = "output"};
    expect_error("lm: layer of an ARPA file", rl_lm_load(&bad, m, arpa, &lo), RL_EARG,
                 "rl_lm_load|options->layer");
    expect_error("lm: model without a CTC layer", rl_lm_load(&bad, ce, arpa, NULL), RL_EARG,
                 "rl_lm_load|model|neither a CTC layer");
    expect("lm: bad loads give no LM", bad == NULL);

    /* bad decodes */
    enum { HT = 4, V = 4 };
    static float y[HT * V];
    int32_t len = HT, got[8];
    int64_t n;
    for (int i = 0; i < HT * V; i++)
        y[i] = 0.25f;
    rl_output h = {.y = y, .lengths = &len, .T = HT, .B = 1, .dim = V};
    o = (rl_decode_options){.size = sizeof o, .blank = 3, .beam = 4, .lm = lm, .weight = 1};
    expect("lm: decode uniform", rl_ctc_decode_lm(&h, 0, &o, got, 8, &n) == RL_OK);
    expect_error("lm: options NULL", rl_ctc_decode_lm(&h, 0, NULL, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|options is NULL");
    expect_error("lm: decode out NULL", rl_ctc_decode_lm(NULL, 0, &o, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|out is NULL");
    expect_error("lm: decode labels NULL", rl_ctc_decode_lm(&h, 0, &o, NULL, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|labels is NULL");
    rl_decode_options e = o;
    e.weight = NAN;
    expect_error("lm: weight NaN", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|options->weight = nan");
    e = o;
    e.bonus = INFINITY;
    expect_error("lm: bonus inf", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|options->bonus = inf");
    e = o;
    e.beam = 0;
    expect_error("lm: beam 0", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|beam = 0|1..4096");
    e.beam = 5000;
    expect_error("lm: beam 5000", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|beam = 5000");
    e = o;
    e.blank = 0;
    expect_error("lm: blank not the LM's", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_ESHAPE,
                 "rl_ctc_decode_lm|blank 0|blank 3");
    e = o;
    e.size = sizeof e + 8;
    expect_error("lm: decode options size", rl_ctc_decode_lm(&h, 0, &e, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|options->size");
    rl_output h3 = h;
    h3.dim = 3;
    e = o;
    e.blank = 2;
    expect_error("lm: classes not the LM's", rl_ctc_decode_lm(&h3, 0, &e, got, 8, &n), RL_ESHAPE,
                 "rl_ctc_decode_lm|out has 3 classes");
    y[2 * V + 1] = NAN;
    expect_error("lm: NaN", rl_ctc_decode_lm(&h, 0, &o, got, 8, &n), RL_EARG,
                 "rl_ctc_decode_lm|out->y|class 1 of frame 2 of sequence 0 is NaN");
    y[2 * V + 1] = 0.25f;
    for (int t = 0; t < HT; t++) /* a b a b: 4 labels */
        for (int c = 0; c < V; c++)
            y[t * V + c] = c == t % 2 ? 0.97f : 0.01f;
    o.weight = 0; /* the CTC labels alone */
    expect_error("lm: cap", rl_ctc_decode_lm(&h, 0, &o, got, 2, &n), RL_ESHAPE,
                 "rl_ctc_decode_lm|cap = 2|4 labels");
    expect("lm: cap gives the count", n == 4);
    rl_lm_free(lm);
    rl_lm_free(word);
    rl_lm_free(neural);
    rl_lm_free(NULL);
    rl_model_free(m);
}

/* ---- attention decoding (rl_model_search) */
static void check_search(const char *dir, const char *ctc_file, rl_model *ce) {
    char s2s[4096], lmfile[4096], arpa[4096];
    snprintf(s2s, sizeof s2s, "%s/s2s.h5", dir);
    snprintf(lmfile, sizeof lmfile, "%s/lm_s2s.arpa", dir);
    snprintf(arpa, sizeof arpa, "%s/lm.arpa", dir);
    rl_model *m = NULL, *ctc = NULL;
    rl_model_options mo = {.layer = "dec"};
    expect("search: load the decoder", rl_model_load(&m, s2s, &mo) == RL_OK);
    if (m == NULL) return;
    rl_search_options so = {.size = sizeof so};
    search_as_lua(m, dir, &so, "search_plain", "search_plain");
    so.beam = 1;
    search_as_lua(m, dir, &so, "search_beam1", "search_plain");
    rl_lm *lm = NULL, *ctc_lm = NULL;
    expect("search: load an LM for the decoder", rl_lm_load(&lm, m, lmfile, NULL) == RL_OK);
    so = (rl_search_options){.size = sizeof so, .lm = lm, .weight = 1, .bonus = 0.3};
    expect("search: the LM changes the labels",
           search_as_lua(m, dir, &so, "search_lm", "search_plain") > 0);

    /* bad input */
    float x1[4 * F] = {0};
    int32_t l1 = 4;
    rl_batch b = {.T = 4, .B = 1, .F = F, .x = x1, .lengths = &l1};
    rl_hyps h = {.size = sizeof h};
    rl_output out;
    so = (rl_search_options){.size = sizeof so};
    expect_error("search: model NULL", rl_model_search(NULL, &b, &so, &h), RL_EARG,
                 "rl_model_search|model is NULL");
    expect_error("search: batch NULL", rl_model_search(m, NULL, &so, &h), RL_EARG,
                 "rl_model_search|batch is NULL");
    expect_error("search: out NULL", rl_model_search(m, &b, &so, NULL), RL_EARG,
                 "rl_model_search|out is NULL");
    h.size = 0;
    expect_error("search: out size", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|out->size = 0");
    h.size = sizeof h;
    so.size = 1;
    expect_error("search: options size", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|options->size = 1");
    so = (rl_search_options){.size = sizeof so, .beam = 5000};
    expect_error("search: beam", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|options->beam = 5000");
    so = (rl_search_options){.size = sizeof so, .lm = lm, .weight = NAN};
    expect_error("search: weight NaN", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|options->weight = nan");
    so = (rl_search_options){.size = sizeof so};
    x1[3] = NAN;
    expect_error("search: NaN input", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|batch->x|NaN");
    x1[3] = 0;
    expect("search: NULL options", rl_model_search(m, &b, NULL, &h) == RL_OK && h.B == 1);
    expect_error("search: a model without a decoder", rl_model_search(ce, &b, &so, &h), RL_EARG,
                 "rl_model_search|model|no attention decoder");
    expect_error("search: forward of the decoder", rl_model_forward(m, &b, NULL, &out), RL_EARG,
                 "rl_model_forward|attention decoder|rl_model_search");
    expect_error("search: forward of the encoder", rl_model_forward(m, &b, "enc", &out), RL_EARG,
                 "rl_model_forward|attention decoder|load the model with that layer");
    if (rl_model_load(&ctc, ctc_file, NULL) == RL_OK &&
        rl_lm_load(&ctc_lm, ctc, arpa, NULL) == RL_OK) {
        so = (rl_search_options){.size = sizeof so, .lm = ctc_lm, .weight = 1};
        expect_error("search: a CTC layer's LM", rl_model_search(m, &b, &so, &h), RL_EARG,
                     "rl_model_search|options->lm|CTC layer");
    } else {
        expect("search: load the CTC model and its LM", 0);
    }
    static float y[2 * 4];
    int32_t yl = 2;
    rl_output yo = {.y = y, .lengths = &yl, .T = 2, .B = 1, .dim = 4};
    rl_decode_options dopt = {.size = sizeof dopt, .blank = 3, .beam = 2, .lm = lm, .weight = 1};
    int32_t got[4];
    int64_t n;
    expect_error("search: the decoder's LM in CTC decoding",
                 rl_ctc_decode_lm(&yo, 0, &dopt, got, 4, &n), RL_EARG,
                 "rl_ctc_decode_lm|options->lm|attention decoder");
    rl_lm_options lo = {
        .size = sizeof lo, .labels = (const char *const[]){"a", "b"}, .n_labels = 2};
    rl_lm *bad = NULL;
    expect_error("search: labels of the decoder", rl_lm_load(&bad, m, lmfile, &lo), RL_EIO,
                 "rl_lm_load|labels must be a list of 6 strings");
    rl_lm_free(ctc_lm);
    rl_model_free(ctc);
    /* the model freed under an open session: its LMs and searches refused, not a crash */
    rl_session *s = NULL;
    expect("search: open a session", rl_session_open(&s, m) == RL_OK);
    rl_model_free(m);
    expect_error("search: LM after model free", rl_lm_load(&bad, m, lmfile, NULL), RL_EARG,
                 "rl_lm_load|model was freed");
    so = (rl_search_options){.size = sizeof so};
    expect_error("search after model free", rl_model_search(m, &b, &so, &h), RL_EARG,
                 "rl_model_search|model was freed");
    rl_session_free(s);
    rl_lm_free(lm);
}

/* rl_session_push_many: 4 streams (sequences 0, 1, 2 of x and 0 again) in chunks of different
 * lengths, pushed together in rounds whose members and order change (a stream pushed alone in
 * between, a batch of one, one reset midway), each stream's outputs against the same stream pushed
 * alone in a session of its own; refused calls leave the streams as they were. */
static void check_push_many(rl_model *m, const char *file) {
    enum { S = 4 };
    rl_session *bat[S] = {0}, *ref[S] = {0}, *other = NULL;
    rl_model *m2 = NULL;
    static float seq[S][T * F];
    int pos[S] = {0};
    for (int k = 0; k < S; k++) {
        expect("push_many open",
               rl_session_open(&bat[k], m) == RL_OK && rl_session_open(&ref[k], m) == RL_OK);
        for (int t = 0; t < T; t++)
            memcpy(seq[k] + t * F, x + ((size_t)t * B + (size_t)(k % B)) * F, F * sizeof(float));
    }
    if (!bat[S - 1] || !ref[S - 1]) return;
    float dmax = 0;
    int rounds = 0, alone = 0;
    for (int r = 0;; r++) {
        rl_session *list[S];
        rl_batch chunks[S];
        rl_output outs[S], o1;
        static float want[S][T * 2];
        int n = 0, who[S];
        if (r == 3) { /* stream 2 starts again from its first frame */
            pos[2] = 0;
            expect("push_many reset",
                   rl_session_reset(bat[2]) == RL_OK && rl_session_reset(ref[2]) == RL_OK);
        }
        for (int i = 0; i < S; i++) {
            int k = r % 2 ? S - 1 - i : i; /* another stream leads the batch every round */
            /* a batch of one stream between batches of more: the runner goes back to the plan
             * of the larger size that it keeps */
            if (r == 4 && i > 0) continue;
            if (pos[k] >= T) continue;
            int len = (int[]){1, 3, 7, 2, 5}[(k + r) % 5];
            if (len > T - pos[k]) len = T - pos[k];
            chunks[n] = (rl_batch){.T = len, .B = 1, .F = F, .x = seq[k] + pos[k] * F};
            if (rl_session_push(ref[k], &chunks[n], &o1) != RL_OK || o1.T != len) {
                expect("push_many reference push", 0);
                goto done;
            }
            memcpy(want[k], o1.y, (size_t)len * 2 * sizeof(float));
            if (r == 2 && k == 1) { /* pushed alone this round */
                expect("push between batches",
                       rl_session_push(bat[k], &chunks[n], &o1) == RL_OK && o1.T == len &&
                           memcmp(o1.y, want[k], (size_t)len * 2 * sizeof(float)) == 0);
                alone++;
                pos[k] += len;
                continue;
            }
            list[n] = bat[k];
            who[n++] = k;
        }
        if (n == 0) break;
        if (r == 1) { /* refusals between rounds leave the streams as they were */
            rl_session *dup[3] = {list[0], list[1], list[0]};
            expect_error("push_many sessions NULL", rl_session_push_many(NULL, chunks, n, outs),
                         RL_EARG, "rl_session_push_many|sessions is NULL");
            expect_error("push_many chunks NULL", rl_session_push_many(list, NULL, n, outs),
                         RL_EARG, "rl_session_push_many|chunks is NULL");
            expect_error("push_many outs NULL", rl_session_push_many(list, chunks, n, NULL),
                         RL_EARG, "rl_session_push_many|outs is NULL");
            expect_error("push_many n = 0", rl_session_push_many(list, chunks, 0, outs), RL_EARG,
                         "rl_session_push_many|n = 0");
            expect_error("push_many duplicate", rl_session_push_many(dup, chunks, 3, outs), RL_EARG,
                         "rl_session_push_many|sessions[0] and sessions[2] are the same");
            rl_session *withnull[2] = {list[0], NULL};
            expect_error("push_many NULL session", rl_session_push_many(withnull, chunks, 2, outs),
                         RL_EARG, "rl_session_push_many|sessions[1] is NULL");
            expect("push_many other model",
                   rl_model_load(&m2, file, NULL) == RL_OK && rl_session_open(&other, m2) == RL_OK);
            rl_session *mixed[2] = {list[0], other};
            expect_error("push_many another model", rl_session_push_many(mixed, chunks, 2, outs),
                         RL_EARG, "rl_session_push_many|sessions[1] is a session of another model");
            rl_batch badc[S];
            memcpy(badc, chunks, sizeof badc);
            badc[1].F = 10;
            expect_error("push_many chunk dims", rl_session_push_many(list, badc, n, outs),
                         RL_ESHAPE, "rl_session_push_many|chunks[1]->F = 10");
            badc[1] = chunks[1];
            badc[1].B = 2;
            expect_error("push_many chunk B", rl_session_push_many(list, badc, n, outs), RL_ESHAPE,
                         "chunks[1]->B = 2");
            static float nan_frame[7 * F];
            memcpy(nan_frame, chunks[n - 1].x, (size_t)chunks[n - 1].T * F * sizeof(float));
            nan_frame[0] = NAN;
            memcpy(badc, chunks, sizeof badc);
            badc[n - 1].x = nan_frame;
            char words[64];
            snprintf(words, sizeof words, "chunks[%d]->x|NaN", n - 1);
            expect_error("push_many NaN", rl_session_push_many(list, badc, n, outs), RL_EARG,
                         words);
        }
        if (rl_session_push_many(list, chunks, n, outs) != RL_OK) {
            expect("push_many", 0);
            goto done;
        }
        rounds++;
        for (int i = 0; i < n; i++) {
            int k = who[i];
            expect("push_many output shape", outs[i].T == chunks[i].T && outs[i].B == 1 &&
                                                 outs[i].dim == 2 &&
                                                 outs[i].lengths[0] == chunks[i].T);
            for (int j = 0; j < chunks[i].T * 2; j++)
                dmax = fmaxf(dmax, fabsf(outs[i].y[j] - want[k][j]));
            pos[k] += (int)chunks[i].T;
        }
    }
    printf("push_many: %d rounds, %d pushes alone between; largest difference to pushing alone "
           "%g\n",
           rounds, alone, dmax);
    expect("push_many = pushing alone (float32 rounding)",
           rounds >= 8 && alone == 1 && dmax < 1e-5f);
done:
    for (int k = 0; k < S; k++) {
        rl_session_free(bat[k]);
        rl_session_free(ref[k]);
    }
    rl_session_free(other);
    rl_model_free(m2);
}

/* Pushes in C (the default for a stack of C layers) against the Lua network's pushes
 * (RNNLUA_CAPI_PUSH=lua) of the same model: one stream of 120 frames (x's frames one after
 * another) in chunks of 1, 7, 50, 3 and 2 frames, a refused chunk, a reset midway, a plain
 * forward and a batched push between, in fp32 and bf16: the same numbers bit for bit; after the
 * reset the stream equals the whole rest at once to float32 rounding (the pushes' products read
 * the packed weights); and a push whose chunk is no longer than an earlier chunk of the stream
 * allocates nothing in C (through the Lua network it allocates). */
static void check_c_push(const char *file, int threads) {
    enum { N = T * B };
    rl_model *mc = NULL, *ml = NULL;
    rl_model_options o = {.threads = threads}; /* process-wide; 0: as it is */
    setenv("RNNLUA_CAPI_PUSH", "lua", 1);
    int okl = rl_model_load(&ml, file, &o) == RL_OK;
    unsetenv("RNNLUA_CAPI_PUSH");
    int okc = rl_model_load(&mc, file, &o) == RL_OK;
    expect("load for pushes in C and in Lua", okl && okc);
    /* chunk k's frames; before chunk 1 a plain forward, before 2 a batched push, before 3 a
     * refused chunk, before 4 a reset */
    static const int lens[] = {1, 7, 3, 2, 1, 7, 50, 3, 1, 7, 1, 50};
    for (int prec = 0; okl && okc && prec < 2; prec++) {
        const char *p = prec ? "bf16" : "fp32";
        expect("precision for pushes",
               rl_model_set_precision(mc, p) == RL_OK && rl_model_set_precision(ml, p) == RL_OK);
        rl_session *sc = NULL, *sl = NULL, *sc2 = NULL, *sl2 = NULL;
        if (rl_session_open(&sc, mc) != RL_OK || rl_session_open(&sl, ml) != RL_OK ||
            rl_session_open(&sc2, mc) != RL_OK || rl_session_open(&sl2, ml) != RL_OK) {
            expect("open for pushes", 0);
            rl_session_free(sc2);
            rl_session_free(sl2);
            rl_session_free(sc);
            rl_session_free(sl);
            break;
        }
        static float rest[N * 64];
        int same = 1, pushes = 0, start = 0, k = 0, longest = 0;
        long allocs_c = -1, allocs_lua = -1;
        for (int t0 = 0; t0 < N; k++) {
            if (k == 1) { /* a plain batch in between: the stream starts anew after it */
                rl_batch b = {.T = T, .B = B, .F = F, .x = x, .lengths = lengths};
                rl_output o1, o2;
                same &= rl_session_forward(sc, &b, NULL, &o1) == RL_OK &&
                        rl_session_forward(sl, &b, NULL, &o2) == RL_OK &&
                        memcmp(o1.y, o2.y, sizeof(float) * (size_t)(o1.T * o1.B * o1.dim)) == 0;
            }
            if (k == 2) { /* a batched push: the stream (2 frames) and another one (3 frames) */
                rl_batch c2[2] = {{.T = 2, .B = 1, .F = F, .x = x + (size_t)t0 * F},
                                  {.T = 3, .B = 1, .F = F, .x = x + (size_t)(N - 3) * F}};
                rl_output oc2[2], ol2[2];
                rl_session *two_c[2] = {sc, sc2}, *two_l[2] = {sl, sl2};
                same &= rl_session_push_many(two_c, c2, 2, oc2) == RL_OK &&
                        rl_session_push_many(two_l, c2, 2, ol2) == RL_OK;
                for (int i = 0; same && i < 2; i++)
                    same &= oc2[i].T == c2[i].T && ol2[i].T == c2[i].T &&
                            memcmp(oc2[i].y, ol2[i].y,
                                   sizeof(float) * (size_t)(c2[i].T * oc2[i].dim)) == 0;
                t0 += 2;
            }
            if (k == 3) { /* refused: the stream stays as it was */
                float bad[2 * F];
                memcpy(bad, x + (size_t)t0 * F, sizeof bad);
                bad[F + 2] = NAN;
                rl_batch c = {.T = 2, .B = 1, .F = F, .x = bad};
                rl_output o;
                expect_error("push in C: NaN", rl_session_push(sc, &c, &o), RL_EARG,
                             "rl_session_push|chunk->x|value 2 of frame 1 of sequence 0 is NaN");
            }
            if (k == 4) { /* midway: a new stream from here, compared with the rest at once */
                expect("reset for pushes",
                       rl_session_reset(sc) == RL_OK && rl_session_reset(sl) == RL_OK);
                start = t0;
            }
            int len = lens[k % 12] < N - t0 ? lens[k % 12] : N - t0;
            rl_batch c = {.T = len, .B = 1, .F = F, .x = x + (size_t)t0 * F};
            rl_output oc, ol;
            int counted_push = k >= 4 && len <= longest; /* no buffer to grow */
            if (len > longest) longest = len;
            if (counted_push) atomic_store(&n_allocs, 0), atomic_store(&counting, 1);
            rl_status stc = rl_session_push(sc, &c, &oc);
            atomic_store(&counting, 0);
            if (counted_push) allocs_c = (allocs_c < 0 ? 0 : allocs_c) + atomic_load(&n_allocs);
            if (counted_push) atomic_store(&n_allocs, 0), atomic_store(&counting, 1);
            rl_status stl = rl_session_push(sl, &c, &ol);
            atomic_store(&counting, 0);
            if (counted_push)
                allocs_lua = (allocs_lua < 0 ? 0 : allocs_lua) + atomic_load(&n_allocs);
            if (stc != RL_OK || stl != RL_OK || oc.T != len || ol.T != len || oc.dim != ol.dim ||
                oc.dim > 64) {
                printf("push in C: %s: chunk %d (%d frames at %d): %s\n", p, k, len, t0,
                       rl_errmsg());
                same = 0;
                break;
            }
            same &= memcmp(oc.y, ol.y, sizeof(float) * (size_t)(len * oc.dim)) == 0;
            if (k >= 4)
                memcpy(rest + (size_t)(t0 - start) * oc.dim, oc.y,
                       sizeof(float) * (size_t)(len * oc.dim));
            t0 += len;
            pushes++;
        }
        char name[96];
        snprintf(name, sizeof name, "%s: %d pushes in C = in Lua, bit for bit", p, pushes);
        expect(name, same);
        rl_batch whole = {.T = N - start,
                          .B = 1,
                          .F = F,
                          .x = x + (size_t)start * F,
                          .lengths = (int32_t[]){N - start}};
        rl_output o;
        float d = 1;
        if (rl_session_forward(sc, &whole, NULL, &o) == RL_OK) {
            d = 0;
            for (int64_t i = 0; i < o.T * o.dim; i++)
                d = fmaxf(d, fabsf(o.y[i] - rest[i]));
        }
        printf("push in C (%s, %s): largest difference to the whole sequence %g; allocations "
               "of the pushes after the reset: %ld in C, %ld in Lua\n",
               file, p, (double)d, allocs_c, allocs_lua);
        snprintf(name, sizeof name, "%s: streamed after a reset = the whole rest", p);
        expect(name, d < 1e-5f);
        if (COUNT_ALLOCS) {
            snprintf(name, sizeof name, "%s: pushes in C allocate nothing (Lua's: %ld)", p,
                     allocs_lua);
            expect(name, allocs_c == 0 && allocs_lua > 0);
            /* batched pushes in C: nothing allocated once the batch had its size */
            long many[2] = {0, 0};
            for (int r = 0; r < 3; r++)
                for (int v = 0; v < 2; v++) {
                    rl_session *two[2] = {v ? sl : sc, v ? sl2 : sc2};
                    rl_batch c2[2] = {{.T = 1, .B = 1, .F = F, .x = x + (size_t)r * F},
                                      {.T = 2, .B = 1, .F = F, .x = x + (size_t)r * F}};
                    rl_output o2[2];
                    atomic_store(&n_allocs, 0), atomic_store(&counting, r > 0);
                    rl_status stm = rl_session_push_many(two, c2, 2, o2);
                    atomic_store(&counting, 0);
                    many[v] += atomic_load(&n_allocs);
                    expect("push_many for the allocations", stm == RL_OK);
                }
            printf("push in C (%s, %s): allocations of 2 batched pushes of 2 streams: %ld in C, "
                   "%ld in Lua\n",
                   file, p, many[0], many[1]);
            snprintf(name, sizeof name, "%s: batched pushes in C allocate nothing", p);
            expect(name, many[0] == 0 && many[1] > 0);
        }
        rl_session_free(sc2);
        rl_session_free(sl2);
        rl_session_free(sc);
        rl_session_free(sl);
    }
    rl_model_free(mc);
    rl_model_free(ml);
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fputs("usage: embed_check CAUSAL.h5 BIDIRECTIONAL.h5 DATASET.h5 LUACLASS.h5 SPARSE.h5 "
              "LUACLASS.lua CTC.h5 DIR STACK.h5 NORM.h5\n",
              stderr);
        return 2;
    }
    for (int i = 0; i < T * B; i++) /* one-hot frames, as the 12AX task gives */
        x[i * F + (i * 7 + i / 5) % F] = 1;
    rl_model *m = NULL, *bad = NULL;
    rl_session *s = NULL;
    rl_output out;
    rl_info info;

    /* loading */
    expect_error("load out NULL", rl_model_load(NULL, argv[1], NULL), RL_EARG,
                 "rl_model_load|out is NULL");
    expect_error("load path NULL", rl_model_load(&bad, NULL, NULL), RL_EARG,
                 "rl_model_load|path is NULL");
    expect_error("load missing file", rl_model_load(&bad, "no/such/model.h5", NULL), RL_EIO,
                 "rl_model_load|no/such/model.h5");
    expect_error("load a dataset", rl_model_load(&bad, argv[3], NULL), RL_EIO, "rl_model_load|");
    printf("dataset as model: %s\n", rl_errmsg());
    expect_error("load Lua class", rl_model_load(&bad, argv[4], NULL), RL_EIO,
                 "rl_model_load|scale");
    printf("Lua class: %s\n", rl_errmsg());
    rl_model_options o = {.lua_file = argv[6]};
    expect("load Lua class with lua_file", rl_model_load(&bad, argv[4], &o) == RL_OK);
    rl_batch lb = {.T = 2, .B = 1, .F = F, .x = x, .lengths = (int32_t[]){2}};
    expect("forward Lua class", bad && rl_model_forward(bad, &lb, NULL, &out) == RL_OK);
    rl_model_free(bad);
    bad = NULL;
    o = (rl_model_options){.lua_file = "no/such.lua"};
    expect_error("load lua_file missing", rl_model_load(&bad, argv[4], &o), RL_EIO,
                 "rl_model_load|lua_file no/such.lua");
    o = (rl_model_options){.layer = "nosuch"};
    expect_error("load unknown layer", rl_model_load(&bad, argv[1], &o), RL_EIO,
                 "rl_model_load|no layer 'nosuch'");
    o = (rl_model_options){.threads = -1};
    expect_error("load threads", rl_model_load(&bad, argv[1], &o), RL_EARG, "options->threads");
    expect("bad loads give no model", bad == NULL);
    expect("load", rl_model_load(&m, argv[1], NULL) == RL_OK);
    if (m == NULL) {
        printf("%d passed, %d failed\n", pass, fail + 1);
        return 1;
    }

    /* info */
    expect_error("info NULL", rl_model_info(m, NULL), RL_EARG, "rl_model_info|info is NULL");
    expect("info", rl_model_info(m, &info) == RL_OK && strcmp(info.input, "data") == 0 &&
                       info.input_dim == 9 && !info.input_sparse && info.output_dim == 2 &&
                       strcmp(info.output, "output") == 0 && info.causal &&
                       info.not_causal == NULL && info.num_params > 0);

    /* forward: bad batches */
    rl_batch b = {.T = T, .B = B, .F = F, .x = x, .lengths = lengths};
    expect_error("forward model NULL", rl_model_forward(NULL, &b, NULL, &out), RL_EARG,
                 "rl_model_forward|model is NULL");
    expect_error("forward batch NULL", rl_model_forward(m, NULL, NULL, &out), RL_EARG,
                 "rl_model_forward|batch is NULL");
    expect_error("forward out NULL", rl_model_forward(m, &b, NULL, NULL), RL_EARG,
                 "rl_model_forward|out is NULL");
    rl_batch e = b;
    e.F = 8;
    expect_error("forward dims disagree", rl_model_forward(m, &e, NULL, &out), RL_ESHAPE,
                 "rl_model_forward|batch->F = 8|takes 9");
    e = b;
    e.x = NULL;
    expect_error("forward x NULL", rl_model_forward(m, &e, NULL, &out), RL_EARG,
                 "rl_model_forward|batch->x is NULL");
    e = b;
    e.lengths = NULL;
    expect_error("forward lengths NULL", rl_model_forward(m, &e, NULL, &out), RL_EARG,
                 "batch->lengths is NULL");
    int32_t badlen[B] = {40, 41, 3};
    e = b;
    e.lengths = badlen;
    expect_error("forward length > T", rl_model_forward(m, &e, NULL, &out), RL_ESHAPE,
                 "batch->lengths[1] = 41");
    e = b;
    e.T = 0;
    expect_error("forward T = 0", rl_model_forward(m, &e, NULL, &out), RL_ESHAPE, "batch->T = 0");
    x[5 * B * F + 1 * F + 3] = NAN;
    expect_error("forward NaN", rl_model_forward(m, &b, NULL, &out), RL_EARG,
                 "rl_model_forward|batch->x|frame 5 of sequence 1 is NaN");
    x[5 * B * F + 1 * F + 3] = 0;
    expect_error("forward unknown layer", rl_model_forward(m, &b, "nosuch", &out), RL_EARG,
                 "rl_model_forward|no layer 'nosuch'");

    /* forward: the output, padded frames zero; another layer's output */
    expect("forward", rl_model_forward(m, &b, NULL, &out) == RL_OK && out.T == T && out.B == B &&
                          out.dim == 2 && out.lengths[1] == 17);
    memcpy(serial, out.y, sizeof serial);
    expect("padded frames are zero", serial[(20 * B + 1) * 2] == 0 && serial[(5 * B + 1) * 2] != 0);
    expect("softmax rows sum to 1", fabsf(serial[0] + serial[1] - 1) < 1e-5f);
    expect("layer l1", rl_model_forward(m, &b, "l1", &out) == RL_OK && out.dim == 16 && out.T == T);

    /* sessions in threads give the serial numbers */
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){.m = m};
        pthread_create(&th[i], NULL, thread_main, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        expect("sessions in 4 threads", jobs[i].ok);
    }

    /* push: bad chunks */
    expect_error("open out NULL", rl_session_open(NULL, m), RL_EARG, "rl_session_open|out is NULL");
    expect_error("open model NULL", rl_session_open(&s, NULL), RL_EARG,
                 "rl_session_open|model is NULL");
    expect("open", rl_session_open(&s, m) == RL_OK);
    rl_batch c = {.T = 5, .B = 1, .F = F, .x = x};
    expect_error("push session NULL", rl_session_push(NULL, &c, &out), RL_EARG,
                 "rl_session_push|session is NULL");
    expect_error("push chunk NULL", rl_session_push(s, NULL, &out), RL_EARG,
                 "rl_session_push|chunk is NULL");
    rl_batch cb = c;
    cb.B = 2;
    expect_error("push B = 2", rl_session_push(s, &cb, &out), RL_ESHAPE, "chunk->B = 2");
    cb = c;
    cb.F = 10;
    expect_error("push dims", rl_session_push(s, &cb, &out), RL_ESHAPE,
                 "rl_session_push|chunk->F = 10");
    x[2 * F] = NAN;
    expect_error("push NaN", rl_session_push(s, &c, &out), RL_EARG,
                 "rl_session_push|chunk->x|value 0 of frame 2 of sequence 0 is NaN");
    x[2 * F] = INFINITY;
    expect_error("push Inf", rl_session_push(s, &c, &out), RL_EARG, "infinite");
    x[2 * F] = 0;
    expect("push", rl_session_push(s, &c, &out) == RL_OK && out.T == 5 && out.B == 1);
    expect("reset", rl_session_reset(s) == RL_OK);
    expect_error("reset NULL", rl_session_reset(NULL), RL_EARG, "rl_session_reset|session is NULL");
    check_push_many(m, argv[1]);
    check_c_push(argv[1], 0);
    check_c_push(argv[9], 0);
    check_c_push(argv[10], 0); /* the stack with data_norm: its chunks normalised in C */
    char pair[512];
    snprintf(pair, sizeof pair, "%s/pair.h5", argv[8]);
    /* two forward LSTMs that net:forward runs at once on 2 threads (each on its own thread): in C
     * one after the other, the same bits */
    check_c_push(pair, 2);

    /* precision: bad arguments; bf16 close to float32; streamed in bf16 the whole sequence's bf16
     * numbers; a session opened before keeps float32; back to fp32 the float32 numbers */
    expect_error("precision model NULL", rl_model_set_precision(NULL, "bf16"), RL_EARG,
                 "rl_model_set_precision|model is NULL");
    expect_error("precision NULL", rl_model_set_precision(m, NULL), RL_EARG,
                 "rl_model_set_precision|precision is NULL");
    expect_error("precision fp16", rl_model_set_precision(m, "fp16"), RL_EARG,
                 "rl_model_set_precision|precision|\"fp16\"");
    expect("precision bf16", rl_model_set_precision(m, "bf16") == RL_OK);
    static float half[T * B * 2], seq0[T * F];
    expect("bf16 forward", rl_model_forward(m, &b, NULL, &out) == RL_OK && out.T == T);
    memcpy(half, out.y, sizeof half);
    float d_half = 0, d_stream = 0, d_old = 0;
    for (int i = 0; i < T * B * 2; i++)
        d_half = fmaxf(d_half, fabsf(half[i] - serial[i]));
    expect("bf16 differs from float32 by rounding only", d_half > 0 && d_half < 0.05f);
    for (int t = 0; t < T; t++)
        memcpy(seq0 + t * F, x + (size_t)t * B * F, F * sizeof(float));
    rl_session *s16;
    expect("open bf16", rl_session_open(&s16, m) == RL_OK);
    for (int t0 = 0; s16 && t0 < T; t0 += 7) {
        rl_batch k = {.T = t0 + 7 <= T ? 7 : T - t0, .B = 1, .F = F, .x = seq0 + t0 * F};
        expect("push bf16", rl_session_push(s16, &k, &out) == RL_OK && out.T == k.T);
        for (int t = 0; t < k.T; t++)
            for (int j = 0; j < 2; j++)
                d_stream = fmaxf(d_stream, fabsf(out.y[t * 2 + j] - half[((t0 + t) * B) * 2 + j]));
    }
    expect("bf16 streamed = bf16 whole", d_stream < 1e-6f);
    rl_output outs2[2];
    rl_batch two[2] = {c, c};
    expect_error("push_many precisions",
                 rl_session_push_many((rl_session *[]){s, s16}, two, 2, outs2), RL_EARG,
                 "rl_session_push_many|sessions[1] runs in bf16, sessions[0] in fp32");
    rl_session_free(s16);
    rl_batch whole0 = {.T = T, .B = 1, .F = F, .x = seq0};
    expect("push float32 session", rl_session_push(s, &whole0, &out) == RL_OK && out.T == T);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 2; j++)
            d_old = fmaxf(d_old, fabsf(out.y[t * 2 + j] - serial[(t * B) * 2 + j]));
    expect("a session opened before bf16 keeps float32", d_old < 1e-6f);
    expect("reset", rl_session_reset(s) == RL_OK);
    expect("precision fp32", rl_model_set_precision(m, "fp32") == RL_OK &&
                                 rl_model_forward(m, &b, NULL, &out) == RL_OK &&
                                 memcmp(out.y, serial, sizeof serial) == 0);

    /* int8: close to float32 (within 8/254, tests/lua/test_int8.lua's bound), and streamed the
     * whole sequence's int8 numbers (the activations are quantized per row, each frame alone) */
    expect("precision int8", rl_model_set_precision(m, "int8") == RL_OK);
    static float q8[T * B * 2];
    expect("int8 forward", rl_model_forward(m, &b, NULL, &out) == RL_OK && out.T == T);
    memcpy(q8, out.y, sizeof q8);
    float d_q8 = 0, d_q8_stream = 0;
    for (int i = 0; i < T * B * 2; i++)
        d_q8 = fmaxf(d_q8, fabsf(q8[i] - serial[i]));
    expect("int8 differs from float32 by quantization only", d_q8 > 0 && d_q8 <= 8.0f / 254);
    rl_session *s8;
    expect("open int8", rl_session_open(&s8, m) == RL_OK);
    for (int t0 = 0; s8 && t0 < T; t0 += 7) {
        rl_batch k = {.T = t0 + 7 <= T ? 7 : T - t0, .B = 1, .F = F, .x = seq0 + t0 * F};
        expect("push int8", rl_session_push(s8, &k, &out) == RL_OK && out.T == k.T);
        for (int t = 0; t < k.T; t++)
            for (int j = 0; j < 2; j++)
                d_q8_stream =
                    fmaxf(d_q8_stream, fabsf(out.y[t * 2 + j] - q8[((t0 + t) * B) * 2 + j]));
    }
    expect("int8 streamed = int8 whole", d_q8_stream < 1e-6f);
    rl_session_free(s8);
    expect("precision int8 -> fp32", rl_model_set_precision(m, "fp32") == RL_OK &&
                                         rl_model_forward(m, &b, NULL, &out) == RL_OK &&
                                         memcmp(out.y, serial, sizeof serial) == 0);

    check_ctc(argv[7], m);
    check_lm(argv[7], argv[8], m);
    check_search(argv[8], argv[7], m);

    /* the model freed under an open session */
    rl_model_free(m);
    expect_error("push after model free", rl_session_push(s, &c, &out), RL_EARG,
                 "rl_session_push|model was freed");
    expect_error("forward after model free", rl_session_forward(s, &b, NULL, &out), RL_EARG,
                 "rl_session_forward|model was freed");
    expect_error("reset after model free", rl_session_reset(s), RL_EARG, "model was freed");
    expect_error("push_many after model free", rl_session_push_many(&s, &c, 1, &out), RL_EARG,
                 "rl_session_push_many|sessions[0]|model was freed");
    rl_session_free(s);
    rl_session_free(NULL);
    rl_model_free(NULL);

    /* a bidirectional model: forward works, streaming is refused naming the layer */
    expect("load bidirectional", rl_model_load(&m, argv[2], NULL) == RL_OK);
    expect("bidirectional info", rl_model_info(m, &info) == RL_OK && !info.causal &&
                                     info.not_causal && strstr(info.not_causal, "'bw'"));
    expect("bidirectional forward", rl_model_forward(m, &b, NULL, &out) == RL_OK);
    expect("open", rl_session_open(&s, m) == RL_OK);
    expect_error("push bidirectional", rl_session_push(s, &c, &out), RL_EARG,
                 "rl_session_push|cannot stream|'bw'");
    printf("bidirectional push: %s\n", rl_errmsg());
    expect_error("push_many bidirectional", rl_session_push_many(&s, &c, 1, &out), RL_EARG,
                 "rl_session_push_many|cannot stream|'bw'");
    rl_session_free(s);
    rl_model_free(m);

    /* a sparse input: class indices */
    expect("load sparse", rl_model_load(&m, argv[5], NULL) == RL_OK);
    expect("sparse info",
           rl_model_info(m, &info) == RL_OK && info.input_sparse && info.input_dim == 6);
    int32_t cls[6] = {0, 1, 5, 2, 3, 4};
    int32_t len6 = 6;
    rl_batch sb = {.T = 6, .B = 1, .F = 1, .classes = cls, .lengths = &len6};
    expect("sparse forward", rl_model_forward(m, &sb, NULL, &out) == RL_OK && out.T == 6);
    cls[3] = 6;
    expect_error("sparse class out of range", rl_model_forward(m, &sb, NULL, &out), RL_EINDEX,
                 "batch->classes[3]|= 6|0..5");
    sb.F = 9;
    expect_error("sparse F", rl_model_forward(m, &sb, NULL, &out), RL_ESHAPE, "it is sparse");
    sb.F = 1;
    sb.classes = NULL;
    expect_error("sparse classes NULL", rl_model_forward(m, &sb, NULL, &out), RL_EARG,
                 "batch->classes is NULL");
    /* sparse streams pushed together: each gets what it gets pushed alone */
    cls[3] = 2;
    rl_session *sp[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        expect("sparse open", rl_session_open(&sp[i], m) == RL_OK);
    rl_batch sc[2] = {{.T = 4, .B = 1, .F = 1, .classes = cls},
                      {.T = 2, .B = 1, .F = 1, .classes = cls + 3}};
    rl_output so[2], alone;
    static float want_sparse[2][4 * 64];
    int sparse_ok = 1;
    for (int r = 0; r < 3 && sp[3]; r++) {
        for (int i = 0; i < 2; i++) {
            sparse_ok &= rl_session_push(sp[2 + i], &sc[i], &alone) == RL_OK;
            memcpy(want_sparse[i], alone.y, (size_t)(alone.T * alone.dim) * sizeof(float));
        }
        sparse_ok &= rl_session_push_many(sp, sc, 2, so) == RL_OK;
        for (int i = 0; sparse_ok && i < 2; i++)
            for (int64_t j = 0; j < so[i].T * so[i].dim; j++)
                sparse_ok &= fabsf(so[i].y[j] - want_sparse[i][j]) < 1e-6f;
    }
    expect("sparse push_many = pushing alone", sparse_ok);
    cls[3] = 6;
    expect_error("sparse push_many class out of range", rl_session_push_many(sp, sc, 2, so),
                 RL_EINDEX, "rl_session_push_many|chunks[0]->classes[3]|= 6");
    for (int i = 0; i < 4; i++)
        rl_session_free(sp[i]);
    rl_model_free(m);

    printf("%d passed, %d failed\n", pass, fail);
    return fail != 0;
}
