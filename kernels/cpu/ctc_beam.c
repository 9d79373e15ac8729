/* CTC prefix beam search (Hannun et al. 2014) on the CPU, one sequence per thread (declared in
 * kernels/ctc.h).
 *
 * Per frame t, every kept prefix p with log-probabilities pb (its paths end in a blank) and pnb
 * (they end in p's last label), total = lse(pb, pnb), is extended by every class c with
 * log-probability l = logp[t, c]:
 *   c = blank:          p.pb    += total + l
 *   c = last label of p: p+c.pnb += pb + l   and   p.pnb += pnb + l   (a repeat needs a blank)
 *   other c:            p+c.pnb += total + l
 * (+= is log-sum-exp; a new prefix starts at -inf), where p+c is the same entry as a kept prefix
 * q when q = p+c. Then the `beam` best entries by lse(pb, pnb) are kept, ties broken by the text
 * key "l1,l2,...," in byte order, and after the last frame the best one is the result. The
 * order of every sum is the one of the Lua reference (tests/lua/ctc_beam_ref.lua), so both give
 * the same labels.
 *
 * With an LM (rl_ctc_lm, kernels/ctc.h), the ranking score adds each prefix's LM part (weight
 * times its LM log-probability plus bonus per token), a function of its labels only, so two
 * paths to one prefix merge as before: a node keeps its LM part and LM history, made when the
 * node is. Extending node p by c adds ext(p, c): for a char LM the row of weight log p(c | p) +
 * bonus over all labels, computed once per node while it is kept (rows of the kept nodes only);
 * for a word LM the value of ending p's pending word at a boundary label, 0 for other labels.
 * After the last frame each kept prefix adds its end (the pending word, then </s>) and the best
 * of these final scores is the result.
 *
 * Prefixes are nodes of a tree (parent, label), one node per prefix (a hash of (parent, label)
 * finds it again): a kept prefix is a node, a candidate is a kept prefix plus at most one label,
 * and only the candidates kept get a node (at most beam new ones per frame). Scratch per
 * sequence: the nodes (T beam + 1) and their hash, the kept prefixes, and the candidates
 * (beam V), allocated by the thread that decodes it. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ctc.h"
#include "../ngram.h"

typedef struct {
    int32_t node; /* the kept prefix it extends, as a node */
    int32_t c;    /* the label added, -1 for the prefix itself */
    double pb, pnb, score;
} cand;

typedef struct {
    int32_t *parent, *label; /* the prefix tree; node 0 is the empty prefix */
    int32_t n_nodes;
    int32_t *slots; /* open addressing (parent, label) -> node, so each prefix is one node */
    uint64_t mask;
    char *ka, *kb; /* text keys for tie-breaks */
    size_t key_cap;
} tree;

/* The node of prefix `parent` + `c`, made when there is none yet (then *made is set). A prefix
 * dropped from the beam and found again must get its old node back: the tree's parent links are
 * how a kept prefix p+c is recognised as the extension of a kept p. */
static int32_t child(tree *tr, int32_t parent, int32_t c, bool *made) {
    *made = false;
    uint64_t h = ((uint64_t)(uint32_t)parent * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)(uint32_t)c * 0xC2B2AE3D27D4EB4Full);
    for (uint64_t i = (h >> 17) & tr->mask;; i = (i + 1) & tr->mask) {
        int32_t m = tr->slots[i];
        if (m < 0) {
            m = tr->n_nodes++;
            tr->parent[m] = parent;
            tr->label[m] = c;
            tr->slots[i] = m;
            *made = true;
            return m;
        }
        if (tr->parent[m] == parent && tr->label[m] == c) return m;
    }
}

typedef struct {
    int64_t T, B, V, beam;
    const double *logp;
    const int32_t *lengths;
    int32_t blank;
    const rl_ctc_lm *lm;
    size_t max_text; /* word LM: the longest label text */
    int32_t *out;
    int64_t *out_len;
    atomic_long next;
    atomic_int failed; /* 1: out of memory, 2: the neural LM's error (its message is set) */
} beam_job;

static double lse(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    if (a > b) return a + log(1 + exp(b - a));
    return b + log(1 + exp(a - b));
}

/* The labels of node n (then c, when c >= 0) as the text key "l1,l2,...,". */
static void key_of(const tree *tr, int32_t n, int32_t c, char *buf) {
    int32_t depth = 0;
    for (int32_t m = n; m != 0; m = tr->parent[m])
        depth++;
    /* each label takes at most 11 characters plus the comma; fill from the back */
    size_t end = (size_t)(depth + 1) * 12;
    char *p = buf + end;
    *p = '\0';
    char tmp[16];
    if (c >= 0) {
        int k = snprintf(tmp, sizeof tmp, "%d,", (int)c);
        p -= k;
        memcpy(p, tmp, (size_t)k);
    }
    for (int32_t m = n; m != 0; m = tr->parent[m]) {
        int k = snprintf(tmp, sizeof tmp, "%d,", (int)tr->label[m]);
        p -= k;
        memcpy(p, tmp, (size_t)k);
    }
    memmove(buf, p, strlen(p) + 1);
}

/* < 0 when a ranks before b: the higher score, then the smaller key */
static int by_score(const cand *a, const cand *b, tree *tr) {
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    key_of(tr, a->node, a->c, tr->ka);
    key_of(tr, b->node, b->c, tr->kb);
    return strcmp(tr->ka, tr->kb);
}

/* The LM side of one sequence's search (all NULL without an LM). Per node: its history, its LM
 * part, and for a word LM where its pending word starts (the node after which it begins) and
 * the value of ending that word (0 when it is empty). Char LM: rows (beam, V) of ext(p, c) for
 * the kept nodes, node_row / row_node linking them, each
 * row made by one rl_ngram_row. */
typedef struct {
    const rl_ctc_lm *lm;
    int64_t V;
    rl_ngram_state *state;
    double *part;
    int32_t *word_start;
    double *wext;
    double *rows;
    int32_t *node_row, *row_node;
    double *vrow; /* char LM: log p of every vocabulary word after one history */
    /* neural LM: each node's state id and log p(end of sentence) after it (made with its row),
     * and the arguments of one step call (at most beam histories) */
    int32_t *nstate;
    double *eos;
    int32_t *from, *tok, *to, *wait;
    double *logp;
    char *word; /* the text of a word being looked up */
} lm_run;

/* The LM id of node n's pending word (-1: outside the vocabulary). */
static int32_t pending_word(lm_run *lr, const tree *tr, int32_t n) {
    size_t len = 0;
    for (int32_t m = n; m != lr->word_start[n]; m = tr->parent[m]) {
        len += strlen(lr->lm->text[tr->label[m]]);
    }
    size_t at = len;
    for (int32_t m = n; m != lr->word_start[n]; m = tr->parent[m]) {
        const char *t = lr->lm->text[tr->label[m]];
        size_t k = strlen(t);
        at -= k;
        memcpy(lr->word + at, t, k);
    }
    return rl_ngram_word(lr->lm->ngram, lr->word, len);
}

/* The value of ending node n's pending word: weight log p(word | history) + bonus (0 when the
 * word is empty); *after, when not NULL, the history after it. */
static double word_end(lm_run *lr, const tree *tr, int32_t n, rl_ngram_state *after) {
    if (lr->word_start[n] == n) {
        if (after) *after = lr->state[n];
        return 0;
    }
    const rl_ctc_lm *lm = lr->lm;
    return lm->weight * rl_ngram_score(lm->ngram, &lr->state[n], pending_word(lr, tr, n), after) +
           lm->bonus;
}

/* Sets up node m, just made as child of p by label c (its LM part and history). */
static void lm_node(lm_run *lr, const tree *tr, int32_t m, int32_t p, int32_t c) {
    const rl_ctc_lm *lm = lr->lm;
    if (lm->boundary < 0) {
        lr->node_row[m] = -1;
        lr->part[m] = lr->part[p] + lr->rows[(int64_t)lr->node_row[p] * lr->V + c];
        if (lm->ngram) rl_ngram_score(lm->ngram, &lr->state[p], lm->token[c], &lr->state[m]);
        return;
    }
    if (c == lm->boundary) {
        lr->part[m] = lr->part[p] + lr->wext[p];
        word_end(lr, tr, p, &lr->state[m]);
        lr->word_start[m] = m;
    } else {
        lr->part[m] = lr->part[p];
        lr->state[m] = lr->state[p];
        lr->word_start[m] = lr->word_start[p];
    }
    lr->wext[m] = word_end(lr, tr, m, NULL);
}

/* ext(n, c): what extending kept node n by label c adds to the LM part. */
static double lm_ext(const lm_run *lr, int32_t n, int32_t c) {
    if (lr->lm->boundary < 0) return lr->rows[(int64_t)lr->node_row[n] * lr->V + c];
    return c == lr->lm->boundary ? lr->wext[n] : 0;
}

/* A free row of the pool for node n. */
static double *take_row(lm_run *lr, int32_t n) {
    int64_t r = 0;
    while (lr->row_node[r] >= 0)
        r++;
    lr->row_node[r] = n;
    lr->node_row[n] = (int32_t)r;
    return lr->rows + r * lr->V;
}

/* Gives the kept nodes without one a row of ext(n, c) (char LM): an n-gram's one by one, a
 * neural LM's in one step call for all of them. */
static rl_status lm_rows(lm_run *lr, const tree *tr, const cand *kept, int64_t nk, int32_t blank) {
    const rl_ctc_lm *lm = lr->lm;
    int64_t nw = 0;
    for (int64_t i = 0; i < nk; i++) {
        int32_t n = kept[i].node;
        if (lr->node_row[n] >= 0) continue;
        if (lm->ngram) {
            double *row = take_row(lr, n);
            rl_ngram_row(lm->ngram, &lr->state[n], lr->vrow);
            for (int64_t c = 0; c < lr->V; c++)
                row[c] = c == blank ? 0 : lm->weight * lr->vrow[lm->token[c]] + lm->bonus;
        } else {
            lr->wait[nw] = n;
            lr->from[nw] = n == 0 ? -1 : lr->nstate[tr->parent[n]];
            lr->tok[nw++] = n == 0 ? 0 : lm->token[tr->label[n]];
        }
    }
    if (nw == 0) return RL_OK;
    RL_TRY(lm->step(lm->ctx, nw, lr->from, lr->tok, lr->to, lr->logp));
    for (int64_t k = 0; k < nw; k++) {
        int32_t n = lr->wait[k];
        const double *lp = lr->logp + k * (lr->V + 1);
        double *row = take_row(lr, n);
        for (int64_t c = 0; c < lr->V; c++)
            row[c] = c == blank ? 0 : lm->weight * lp[c] + lm->bonus;
        lr->nstate[n] = lr->to[k];
        lr->eos[n] = lp[lr->V];
    }
    return RL_OK;
}

/* Decodes sequence b: RL_ENOMEM, or a neural LM's error, or RL_OK. */
static rl_status decode_one(beam_job *j, int64_t b) {
    const int64_t T = j->lengths[b], V = j->V, beam = j->beam;
    int64_t max_nodes = T * beam + 1;
    tree tr = {0};
    tr.key_cap = (size_t)(T + 2) * 12 + 1;
    tr.parent = malloc((size_t)max_nodes * sizeof(int32_t));
    tr.label = malloc((size_t)max_nodes * sizeof(int32_t));
    int32_t *node_beam = malloc((size_t)max_nodes * sizeof(int32_t)); /* node -> kept index */
    cand *kept = malloc((size_t)beam * sizeof(cand)), *top = malloc((size_t)beam * sizeof(cand));
    cand *cands = malloc((size_t)(beam * V) * sizeof(cand));
    int32_t *redirect = malloc((size_t)(beam * V) * sizeof(int32_t));
    tr.ka = malloc(tr.key_cap);
    tr.kb = malloc(tr.key_cap);
    uint64_t n_slots = 16;
    while (n_slots < 2 * (uint64_t)max_nodes)
        n_slots *= 2;
    tr.mask = n_slots - 1;
    tr.slots = malloc(n_slots * sizeof(int32_t));
    bool ok = tr.parent && tr.label && node_beam && kept && top && cands && redirect && tr.ka &&
              tr.kb && tr.slots;
    lm_run lr = {.lm = j->lm, .V = V};
    if (j->lm) {
        lr.state = malloc((size_t)max_nodes * sizeof *lr.state);
        lr.part = malloc((size_t)max_nodes * sizeof *lr.part);
        ok = ok && lr.state && lr.part;
        if (!j->lm->ngram) {
            lr.nstate = malloc((size_t)max_nodes * sizeof *lr.nstate);
            lr.eos = malloc((size_t)max_nodes * sizeof *lr.eos);
            lr.from = malloc((size_t)beam * sizeof *lr.from);
            lr.tok = malloc((size_t)beam * sizeof *lr.tok);
            lr.to = malloc((size_t)beam * sizeof *lr.to);
            lr.wait = malloc((size_t)beam * sizeof *lr.wait);
            lr.logp = malloc((size_t)(beam * (V + 1)) * sizeof *lr.logp);
            ok = ok && lr.nstate && lr.eos && lr.from && lr.tok && lr.to && lr.wait && lr.logp;
        }
        if (j->lm->boundary >= 0) {
            lr.word_start = malloc((size_t)max_nodes * sizeof *lr.word_start);
            lr.wext = malloc((size_t)max_nodes * sizeof *lr.wext);
            lr.word = malloc((size_t)(T + 1) * j->max_text + 1);
            ok = ok && lr.word_start && lr.wext && lr.word;
        } else {
            lr.rows = malloc((size_t)(beam * V) * sizeof *lr.rows);
            lr.node_row = malloc((size_t)max_nodes * sizeof *lr.node_row);
            lr.row_node = malloc((size_t)beam * sizeof *lr.row_node);
            if (j->lm->ngram) {
                lr.vrow = malloc((size_t)rl_ngram_vocab_size(j->lm->ngram) * sizeof *lr.vrow);
                ok = ok && lr.vrow;
            }
            ok = ok && lr.rows && lr.node_row && lr.row_node;
        }
    }
    rl_status st = ok ? RL_OK : RL_ENOMEM;
    if (ok) {
        memset(tr.slots, 0xff, n_slots * sizeof(int32_t));
        tr.parent[0] = -1;
        tr.label[0] = -1;
        tr.n_nodes = 1;
        node_beam[0] = -1;
        kept[0] = (cand){.node = 0, .c = -1, .pb = 0, .pnb = -INFINITY};
        if (j->lm) {
            if (j->lm->ngram) rl_ngram_begin(j->lm->ngram, &lr.state[0]);
            lr.part[0] = 0;
            if (lr.wext) {
                lr.word_start[0] = 0;
                lr.wext[0] = 0;
            } else {
                lr.node_row[0] = -1;
                for (int64_t r = 0; r < beam; r++)
                    lr.row_node[r] = -1;
            }
        }
        int64_t nk = 1;
        for (int64_t t = 0; t < T && st == RL_OK; t++) {
            const double *row = j->logp + (t * j->B + b) * V;
            /* slot i V + c: kept prefix i extended by c; i V + blank: prefix i itself */
            if (lr.rows && (st = lm_rows(&lr, &tr, kept, nk, j->blank)) != RL_OK) break;
            for (int64_t i = 0; i < nk; i++)
                node_beam[kept[i].node] = (int32_t)i;
            for (int64_t s = 0; s < nk * V; s++)
                redirect[s] = -1;
            for (int64_t i = 0; i < nk; i++) {
                int32_t n = kept[i].node;
                if (n != 0 && node_beam[tr.parent[n]] >= 0)
                    redirect[node_beam[tr.parent[n]] * V + tr.label[n]] =
                        (int32_t)(i * V + j->blank);
            }
            for (int64_t s = 0; s < nk * V; s++) {
                int64_t i = s / V;
                int32_t c = (int32_t)(s % V);
                cands[s] = (cand){.node = kept[i].node,
                                  .c = c == j->blank ? -1 : c,
                                  .pb = -INFINITY,
                                  .pnb = -INFINITY};
            }
            for (int64_t i = 0; i < nk; i++) {
                double pb = kept[i].pb, pnb = kept[i].pnb, total = lse(pb, pnb);
                int32_t last = tr.label[kept[i].node];
                cand *self = &cands[i * V + j->blank];
                for (int32_t c = 0; c < V; c++) {
                    double l = row[c];
                    if (c == j->blank) {
                        self->pb = lse(self->pb, total + l);
                        continue;
                    }
                    int64_t s = i * V + c;
                    cand *e = &cands[redirect[s] >= 0 ? redirect[s] : s];
                    if (c == last) {
                        e->pnb = lse(e->pnb, pb + l);
                        self->pnb = lse(self->pnb, pnb + l);
                    } else {
                        e->pnb = lse(e->pnb, total + l);
                    }
                }
            }
            /* the best `beam` of the candidates (every slot but the redirected ones, whose entry
             * is elsewhere) by insertion into a sorted list: most candidates lose to the list's
             * last entry at once, and only equal scores (often -inf: a prefix whose paths all end
             * in its last label extended by that label) compare keys */
            int64_t nt = 0;
            for (int64_t s = 0; s < nk * V; s++) {
                if (redirect[s] >= 0) continue;
                cand cs = cands[s];
                cs.score = lse(cs.pb, cs.pnb);
                if (j->lm)
                    cs.score +=
                        cs.c < 0 ? lr.part[cs.node] : lr.part[cs.node] + lm_ext(&lr, cs.node, cs.c);
                if (nt == beam && by_score(&cs, &top[nt - 1], &tr) >= 0) continue;
                int64_t at = nt < beam ? nt++ : nt - 1;
                while (at > 0 && by_score(&cs, &top[at - 1], &tr) < 0) {
                    top[at] = top[at - 1];
                    at--;
                }
                top[at] = cs;
            }
            for (int64_t i = 0; i < nk; i++)
                node_beam[kept[i].node] = -1;
            nk = nt;
            for (int64_t i = 0; i < nk; i++) {
                kept[i] = top[i];
                if (top[i].c >= 0) { /* an extended prefix: its node */
                    bool made;
                    int32_t m = child(&tr, top[i].node, top[i].c, &made);
                    node_beam[m] = -1;
                    if (made && j->lm) lm_node(&lr, &tr, m, top[i].node, top[i].c);
                    kept[i].node = m;
                }
                kept[i].c = -1;
            }
            if (lr.rows) /* rows only for the kept nodes */
                for (int64_t r = 0; r < beam; r++) {
                    int32_t n = lr.row_node[r];
                    bool still = false;
                    for (int64_t i = 0; i < nk && n >= 0; i++)
                        still = still || kept[i].node == n;
                    if (n >= 0 && !still) {
                        lr.node_row[n] = -1;
                        lr.row_node[r] = -1;
                    }
                }
        }
        /* with an LM, the end of the sentence decides among the kept prefixes */
        int64_t best = 0;
        if (j->lm && st == RL_OK && !j->lm->ngram) st = lm_rows(&lr, &tr, kept, nk, j->blank);
        if (j->lm && st == RL_OK) {
            const rl_ctc_lm *lm = j->lm;
            for (int64_t i = 0; i < nk; i++) {
                int32_t n = kept[i].node;
                double e = 0;
                if (lm->ngram) {
                    rl_ngram_state hist = lr.state[n];
                    if (lr.wext) e = word_end(&lr, &tr, n, &hist);
                    e = e + lm->weight *
                                rl_ngram_score(lm->ngram, &hist, rl_ngram_eos(lm->ngram), NULL);
                } else {
                    e = e + lm->weight * lr.eos[n];
                }
                kept[i].score = lse(kept[i].pb, kept[i].pnb) + lr.part[n] + e;
                if (i > 0 && by_score(&kept[i], &kept[best], &tr) < 0) best = i;
            }
        }
        /* the best prefix's labels, from the leaf up */
        int64_t n = 0;
        for (int32_t m = kept[best].node; m != 0; m = tr.parent[m])
            n++;
        int32_t *out = j->out + b * j->T;
        int64_t k = n;
        for (int32_t m = kept[best].node; m != 0; m = tr.parent[m])
            out[--k] = tr.label[m];
        j->out_len[b] = n;
    }
    free(tr.parent);
    free(tr.label);
    free(node_beam);
    free(kept);
    free(top);
    free(cands);
    free(redirect);
    free(tr.ka);
    free(tr.kb);
    free(tr.slots);
    free(lr.state);
    free(lr.part);
    free(lr.word_start);
    free(lr.wext);
    free(lr.word);
    free(lr.rows);
    free(lr.node_row);
    free(lr.row_node);
    free(lr.vrow);
    free(lr.nstate);
    free(lr.eos);
    free(lr.from);
    free(lr.tok);
    free(lr.to);
    free(lr.wait);
    free(lr.logp);
    return st;
}

static void *beam_worker(void *arg) {
    beam_job *j = arg;
    for (;;) {
        long b = atomic_fetch_add(&j->next, 1);
        if (b >= j->B) break;
        rl_status st = decode_one(j, b);
        if (st != RL_OK) {
            atomic_store(&j->failed, st == RL_ENOMEM ? 1 : 2);
            if (st != RL_ENOMEM) break; /* a neural LM runs on the caller's thread only */
        }
    }
    return NULL;
}

rl_status rl_ctc_beam_search_cpu(int64_t T, int64_t B, int64_t V, const double *logp,
                                 const int32_t *lengths, int32_t blank, int64_t beam,
                                 const rl_ctc_lm *lm, int32_t *out, int64_t *out_len, int threads) {
    if (beam < 1 || V < 1 || blank < 0 || blank >= V)
        return rl_error(RL_EARG, "rl.ctc_decode: beam %lld with %lld classes, blank %d",
                        (long long)beam, (long long)V, (int)blank);
    if (beam > INT32_MAX / V)
        return rl_error(RL_EARG,
                        "rl.ctc_decode: beam %lld is too large: beam x classes (%lld) must stay "
                        "below 2^31",
                        (long long)beam, (long long)V);
    for (int64_t b = 0; b < B; b++) {
        if (lengths[b] < 0 || lengths[b] > T)
            return rl_error(RL_EARG, "rl.ctc_decode: sequence %lld: length %d is outside 0..%lld",
                            (long long)b + 1, (int)lengths[b], (long long)T);
        if ((int64_t)lengths[b] * beam + 1 > INT32_MAX)
            return rl_error(RL_EARG,
                            "rl.ctc_decode: sequence %lld: %d frames x beam %lld is too "
                            "many prefixes",
                            (long long)b + 1, (int)lengths[b], (long long)beam);
        /* a NaN would make the order of the candidates undefined: name where it is */
        const double *p = logp + b * V;
        for (int64_t t = 0; t < lengths[b]; t++)
            for (int64_t c = 0; c < V; c++)
                if (isnan(p[t * B * V + c]))
                    return rl_error(RL_EARG,
                                    "rl.ctc_decode: sequence %lld, frame %lld: a NaN or +inf "
                                    "logit (its log-probabilities are NaN)",
                                    (long long)b + 1, (long long)t + 1);
    }
    size_t max_text = 0;
    if (lm && lm->boundary >= 0)
        for (int64_t c = 0; c < V; c++)
            if (strlen(lm->text[c]) > max_text) max_text = strlen(lm->text[c]);
    beam_job j = {.T = T,
                  .B = B,
                  .V = V,
                  .beam = beam,
                  .logp = logp,
                  .lengths = lengths,
                  .blank = blank,
                  .lm = lm,
                  .max_text = max_text,
                  .out = out,
                  .out_len = out_len};
    atomic_store(&j.next, 0);
    atomic_store(&j.failed, 0);
    if (threads > B) threads = (int)B;
    if (lm && !lm->ngram) threads = 1; /* its step calls back into the caller */
    if (threads > 64) threads = 64;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&th[i], NULL, beam_worker, &j) != 0) break;
        started = i;
    }
    beam_worker(&j);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&j.failed) == 2) return RL_EARG;
    if (atomic_load(&j.failed))
        return rl_error(RL_ENOMEM,
                        "rl.ctc_decode: out of memory for the beam search (beam %lld, "
                        "%lld classes, %lld frames)",
                        (long long)beam, (long long)V, (long long)T);
    return RL_OK;
}
