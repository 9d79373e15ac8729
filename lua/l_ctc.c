/* The Lua face of CTC (kernels/ctc.h):
 *   rl.ctc_loss(logits, targets, input_lengths, target_lengths [, {blank = k,
 *               zero_infinity = false}]) -> loss (B), grad (T, B, V)
 *     logits (T, B, V) float32/float64 (any device; unnormalised, log-softmax inside),
 *     targets (B, S) int32 0-based labels padded after each target's length, lengths (B) int32
 *     CPU tensors. blank defaults to V - 1 (the softmax layer's place for it). grad is
 *     d (sum of loss) / d logits, 0 on padded frames. Errors name rl.ctc_loss and the sequence.
 *   rl._ctc_beam_search(logp, lengths, blank, beam) -> {{labels...}, ...}: the prefix beam search
 *     of rl.ctc_decode (lua/rnnlua/ctc.lua checks the arguments and takes the log-softmax):
 *     logp (T, B, V) float64 CPU contiguous, lengths (B) int32, blank 0-based, beam >= 1.
 *   rl._ctc_beam_search(logp, lengths, blank, beam, lm): the same with shallow fusion of an n-gram
 *     LM (kernels/ctc.h's rl_ctc_lm), lm = {ngram = an rl.ngram userdata, weight =, bonus =,
 *     token = {V LM word ids, 0-based, the blank's any}, boundary = 0-based label or nil,
 *     text = {V strings} (word-level)}, prepared and checked by lua/rnnlua/lm.lua; a neural LM:
 *     {step = function(from, token) -> ids, logp, token = {V LM classes}, weight =, bonus =}
 *     (rl_ctc_lm.step; the search then runs on this thread).
 *   rl._ngram_load(path) -> an n-gram model (kernels/ngram.h), raising "FILE:LINE: ..." for a
 *     malformed file. Methods: order(), counts() -> {n1, n2, ...}, vocab_size(), id(word) ->
 *     0-based id or nil, word(id) -> string, has_unk(), logp(history, word) -> natural-log
 *     p(word | history) (history: a list of words, most recent last; a word outside the
 *     vocabulary is <unk> or the -100 log10 floor), sentence(words) -> the natural-log
 *     probability of the sentence after <s>, </s> included, row(history) -> {log p of each
 *     word id, 1-based} (one pass, kernels/ngram.h's rl_ngram_row).
 *   rl.edit_distance(a, b) -> integer: Levenshtein distance (substitution, insertion and
 *     deletion cost 1) between two label sequences, tables of integers or 1-D int32 tensors. */
#include "l_ctc.h"

#include <lauxlib.h>
#include <string.h>

#include "../core/blas.h"
#include "../kernels/ctc.h"
#include "../kernels/ngram.h"
#include "../kernels/ops.h"
#include "l_tensor.h"

static int l_ctc_loss(lua_State *L) {
    const char *who = "rl.ctc_loss";
    rl_tensor *logits = rl_lua_check_tensor(L, 1);
    rl_tensor *targets = rl_lua_check_tensor(L, 2);
    rl_tensor *il = rl_lua_check_tensor(L, 3);
    rl_tensor *tl = rl_lua_check_tensor(L, 4);
    lua_Integer blank = 0;
    bool zero_inf = false, has_blank = false;
    if (!lua_isnoneornil(L, 5)) {
        luaL_checktype(L, 5, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 5)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
            if (strcmp(k, "blank") == 0) {
                if (!lua_isinteger(L, -1))
                    return luaL_error(L, "%s: blank must be an integer (0-based class)", who);
                blank = lua_tointeger(L, -1);
                has_blank = true;
            } else if (strcmp(k, "zero_infinity") == 0) {
                if (!lua_isboolean(L, -1))
                    return luaL_error(L, "%s: zero_infinity must be a boolean", who);
                zero_inf = lua_toboolean(L, -1);
            } else {
                return luaL_error(L, "%s: unknown option '%s' (blank, zero_infinity)", who, k);
            }
            lua_pop(L, 1);
        }
    }
    if (logits->storage && logits->ndim == 3 && !has_blank) blank = logits->shape[2] - 1;
    rl_tensor *loss = rl_lua_push_tensor(L);
    rl_tensor *grad = rl_lua_push_tensor(L);
    rl_tensor c = {0};
    rl_ctc_work w = {0};
    rl_status st = RL_OK;
    const rl_tensor *x = logits;
    if (logits->storage && !rl_tensor_is_contiguous(logits)) {
        st = rl_op_contiguous(&c, logits);
        x = &c;
    }
    if (st == RL_OK) st = rl_ctc_loss(&w, who, x, targets, il, tl, blank, zero_inf, loss, grad);
    rl_tensor_release(&c);
    rl_ctc_work_release(&w);
    if (st != RL_OK) return rl_lua_raise(L, who);
    return 2;
}

/* The labels of argument i (a table of integers or a 1-D int32 tensor) as a new userdata
 * array of int32 pushed on the stack (freed by Lua); *n their count. */
static int32_t *labels_arg(lua_State *L, int i, int64_t *n) {
    rl_tensor *t = rl_lua_to_tensor(L, i);
    if (t) {
        if (t->ndim != 1 || t->dtype != RL_INT32)
            luaL_argerror(L, i, "a table of labels or a 1-D int32 tensor expected");
        *n = t->shape[0];
        int32_t *a = lua_newuserdatauv(L, (size_t)(*n ? *n : 1) * sizeof *a, 0);
        for (int64_t k = 0; k < *n; k++)
            a[k] = (int32_t)rl_tensor_get(t, &k);
        return a;
    }
    luaL_checktype(L, i, LUA_TTABLE);
    *n = (int64_t)luaL_len(L, i);
    int32_t *a = lua_newuserdatauv(L, (size_t)(*n ? *n : 1) * sizeof *a, 0);
    for (int64_t k = 0; k < *n; k++) {
        lua_geti(L, i, k + 1);
        if (!lua_isinteger(L, -1))
            luaL_error(L, "rl.edit_distance: argument %d: entry %d is not an integer", i,
                       (int)(k + 1));
        a[k] = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    return a;
}

/* rl.edit_distance(a, b) -> the Levenshtein distance between two label sequences */
static int l_edit_distance(lua_State *L) {
    int64_t na, nb;
    int32_t *a = labels_arg(L, 1, &na);
    int32_t *b = labels_arg(L, 2, &nb);
    int64_t *row = lua_newuserdatauv(L, (size_t)(nb + 1) * sizeof *row, 0);
    lua_pushinteger(L, (lua_Integer)rl_edit_distance(a, na, b, nb, row));
    return 1;
}

#define NGRAM_MT "rl.ngram"

static rl_ngram *check_ngram(lua_State *L, int i) {
    rl_ngram **p = luaL_checkudata(L, i, NGRAM_MT);
    if (!*p) luaL_argerror(L, i, "a freed n-gram model");
    return *p;
}

static int l_ngram_load(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    rl_ngram **p = lua_newuserdatauv(L, sizeof *p, 0);
    *p = NULL;
    luaL_setmetatable(L, NGRAM_MT);
    if (rl_ngram_load(p, path) != RL_OK) { /* the message names the file and line */
        lua_pushstring(L, rl_errmsg());
        return lua_error(L);
    }
    return 1;
}

static int ngram_gc(lua_State *L) {
    rl_ngram **p = luaL_checkudata(L, 1, NGRAM_MT);
    rl_ngram_free(*p);
    *p = NULL;
    return 0;
}

static int ngram_order(lua_State *L) {
    lua_pushinteger(L, rl_ngram_order(check_ngram(L, 1)));
    return 1;
}

static int ngram_counts(lua_State *L) {
    rl_ngram *lm = check_ngram(L, 1);
    lua_createtable(L, rl_ngram_order(lm), 0);
    for (int n = 1; n <= rl_ngram_order(lm); n++) {
        lua_pushinteger(L, (lua_Integer)rl_ngram_count(lm, n));
        lua_rawseti(L, -2, n);
    }
    return 1;
}

static int ngram_vocab_size(lua_State *L) {
    lua_pushinteger(L, rl_ngram_vocab_size(check_ngram(L, 1)));
    return 1;
}

static int ngram_has_unk(lua_State *L) {
    lua_pushboolean(L, rl_ngram_unk(check_ngram(L, 1)) >= 0);
    return 1;
}

static int ngram_id(lua_State *L) {
    rl_ngram *lm = check_ngram(L, 1);
    size_t n;
    const char *w = luaL_checklstring(L, 2, &n);
    int32_t id = rl_ngram_word(lm, w, n);
    if (id < 0) return 0;
    lua_pushinteger(L, id);
    return 1;
}

static int ngram_word(lua_State *L) {
    const char *w = rl_ngram_word_text(check_ngram(L, 1), (int32_t)luaL_checkinteger(L, 2));
    if (!w) return luaL_argerror(L, 2, "no word of that id");
    lua_pushstring(L, w);
    return 1;
}

static int32_t word_at(lua_State *L, rl_ngram *lm, int t, lua_Integer k) {
    lua_geti(L, t, k);
    size_t n;
    const char *w = lua_tolstring(L, -1, &n);
    if (!w) luaL_error(L, "n-gram model: word %d is not a string", (int)k);
    int32_t id = rl_ngram_word(lm, w, n);
    lua_pop(L, 1);
    return id;
}

static int ngram_logp(lua_State *L) {
    rl_ngram *lm = check_ngram(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    size_t n;
    const char *w = luaL_checklstring(L, 3, &n);
    rl_ngram_state st = {0};
    lua_Integer len = luaL_len(L, 2), keep = rl_ngram_order(lm) - 1;
    for (lua_Integer k = len - keep + 1 > 1 ? len - keep + 1 : 1; k <= len; k++) {
        int32_t id = word_at(L, lm, 2, k);
        if (id < 0) id = rl_ngram_unk(lm);
        if (id < 0) {
            st.n = 0; /* the history restarts after a word the model cannot name */
            continue;
        }
        st.w[st.n++] = id;
    }
    lua_pushnumber(L, rl_ngram_score(lm, &st, rl_ngram_word(lm, w, n), NULL));
    return 1;
}

/* lm:row(history) -> {log p of word id 0, 1, ...} (rl_ngram_row; for the tests) */
static int ngram_row(lua_State *L) {
    rl_ngram *lm = check_ngram(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    rl_ngram_state st = {0};
    lua_Integer len = luaL_len(L, 2), keep = rl_ngram_order(lm) - 1;
    for (lua_Integer k = len - keep + 1 > 1 ? len - keep + 1 : 1; k <= len; k++) {
        int32_t id = word_at(L, lm, 2, k);
        if (id < 0)
            return luaL_error(L, "n-gram row: history word %d is not in the vocabulary", (int)k);
        st.w[st.n++] = id;
    }
    int32_t n = rl_ngram_vocab_size(lm);
    double *row = lua_newuserdatauv(L, (size_t)n * sizeof *row, 0);
    rl_ngram_row(lm, &st, row);
    lua_createtable(L, n, 0);
    for (int32_t i = 0; i < n; i++) {
        lua_pushnumber(L, row[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int ngram_sentence(lua_State *L) {
    rl_ngram *lm = check_ngram(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    rl_ngram_state st;
    rl_ngram_begin(lm, &st);
    double sum = 0;
    for (lua_Integer k = 1; k <= luaL_len(L, 2); k++)
        sum += rl_ngram_score(lm, &st, word_at(L, lm, 2, k), &st);
    sum += rl_ngram_score(lm, &st, rl_ngram_eos(lm), NULL);
    lua_pushnumber(L, sum);
    return 1;
}

static const luaL_Reg ngram_methods[] = {
    {"order", ngram_order}, {"counts", ngram_counts},     {"vocab_size", ngram_vocab_size},
    {"id", ngram_id},       {"word", ngram_word},         {"has_unk", ngram_has_unk},
    {"logp", ngram_logp},   {"sentence", ngram_sentence}, {"row", ngram_row},
    {NULL, NULL},
};

/* A neural LM's step (rl_ctc_lm.step): calls the Lua function step(from, token) -> ids, logp
 * (a table of n state ids, an (n, V + 1) float64 tensor) under pcall, on the search's thread. */
typedef struct {
    lua_State *L;
    int fn; /* stack index of the function */
    int64_t V;
} step_ctx;

static rl_status lua_step(void *vctx, int64_t n, const int32_t *from, const int32_t *token,
                          int32_t *to, double *logp) {
    step_ctx *c = vctx;
    lua_State *L = c->L;
    int top = lua_gettop(L);
    if (!lua_checkstack(L, 8)) return rl_error(RL_ENOMEM, "rl.ctc_decode: lm: Lua stack");
    lua_pushvalue(L, c->fn);
    lua_createtable(L, (int)n, 0);
    lua_createtable(L, (int)n, 0);
    for (int64_t k = 0; k < n; k++) {
        lua_pushinteger(L, from[k]);
        lua_rawseti(L, -3, k + 1);
        lua_pushinteger(L, token[k]);
        lua_rawseti(L, -2, k + 1);
    }
    if (lua_pcall(L, 2, 2, 0) != LUA_OK) {
        rl_status st = rl_error(RL_EARG, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
        lua_settop(L, top);
        return st;
    }
    const rl_tensor *t = rl_lua_to_tensor(L, -1);
    bool ok = lua_istable(L, -2) && t && t->ndim == 2 && t->shape[0] == n &&
              t->shape[1] == c->V + 1 && t->dtype == RL_FLOAT64 && rl_tensor_is_contiguous(t) &&
              rl_tensor_device(t).type == RL_CPU;
    for (int64_t k = 0; ok && k < n; k++) {
        int isnum;
        lua_rawgeti(L, -2, k + 1);
        lua_Integer id = lua_tointegerx(L, -1, &isnum);
        lua_pop(L, 1);
        ok = isnum && id >= 0 && id <= INT32_MAX;
        to[k] = (int32_t)id;
    }
    if (ok) memcpy(logp, rl_tensor_data(t), (size_t)(n * (c->V + 1)) * sizeof *logp);
    lua_settop(L, top);
    if (!ok)
        return rl_error(RL_EARG, "rl.ctc_decode: lm: the neural LM's step gave no state ids and "
                                 "(n, V + 1) float64 log-probabilities");
    return RL_OK;
}

/* The LM table of _ctc_beam_search (argument i) as an rl_ctc_lm; token and text live in
 * userdata left on the stack. A neural LM's table has step (a function) instead of ngram. */
static void lm_arg(lua_State *L, int i, int64_t V, rl_ctc_lm *lm, step_ctx *sc) {
    const char *who = "rl.ctc_decode";
    luaL_checktype(L, i, LUA_TTABLE);
    lua_getfield(L, i, "step");
    if (lua_isfunction(L, -1)) {
        lm->ngram = NULL;
        lm->step = lua_step;
        sc->L = L;
        sc->fn = lua_gettop(L); /* left on the stack for the call */
        sc->V = V;
        lm->ctx = sc;
    } else {
        lua_pop(L, 1);
        lua_getfield(L, i, "ngram");
        lm->ngram = check_ngram(L, -1);
        lua_pop(L, 1);
    }
    lua_getfield(L, i, "weight");
    lm->weight = luaL_checknumber(L, -1);
    lua_getfield(L, i, "bonus");
    lm->bonus = luaL_checknumber(L, -1);
    lua_getfield(L, i, "boundary");
    lm->boundary = lua_isnil(L, -1) ? -1 : (int32_t)luaL_checkinteger(L, -1);
    lua_pop(L, 3);
    if (!lm->ngram && lm->boundary >= 0) luaL_error(L, "%s: a neural LM is character-level", who);
    if (lm->boundary >= V)
        luaL_error(L, "%s: boundary label %d outside 0..%d", who, (int)lm->boundary, (int)V - 1);
    if (lm->boundary < 0) {
        int32_t *tok = lua_newuserdatauv(L, (size_t)V * sizeof *tok, 0);
        lua_getfield(L, i, "token");
        lua_Integer nw = lm->ngram ? rl_ngram_vocab_size(lm->ngram) : INT32_MAX;
        for (int64_t c = 0; c < V; c++) {
            lua_geti(L, -1, c + 1);
            lua_Integer id = lua_tointeger(L, -1);
            if (!lua_isinteger(L, -1) || id < 0 || id >= nw)
                luaL_error(L, "%s: LM token of label %d is not a word id", who, (int)c);
            tok[c] = (int32_t)id;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        lm->token = tok;
        lm->text = NULL;
    } else {
        const char **text = lua_newuserdatauv(L, (size_t)V * sizeof *text, 1);
        lua_getfield(L, i, "text");
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, -3, 1); /* the strings stay alive with the array */
        for (int64_t c = 0; c < V; c++) {
            lua_geti(L, -1, c + 1);
            if (lua_type(L, -1) != LUA_TSTRING)
                luaL_error(L, "%s: the text of label %d is not a string", who, (int)c);
            text[c] = lua_tostring(L, -1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        lm->text = text;
        lm->token = NULL;
    }
}

static int l_ctc_beam_search(lua_State *L) {
    const char *who = "rl.ctc_decode";
    rl_tensor *lp = rl_lua_check_tensor(L, 1);
    rl_tensor *len = rl_lua_check_tensor(L, 2);
    lua_Integer blank = luaL_checkinteger(L, 3), beam = luaL_checkinteger(L, 4);
    if (lp->ndim != 3 || lp->dtype != RL_FLOAT64 || !rl_tensor_is_contiguous(lp) ||
        rl_tensor_device(lp).type != RL_CPU)
        return luaL_error(L,
                          "%s: the log-probabilities must be a contiguous (T, B, V) float64 "
                          "CPU tensor",
                          who);
    int64_t T = lp->shape[0], B = lp->shape[1], V = lp->shape[2];
    if (len->ndim != 1 || len->dtype != RL_INT32 || len->shape[0] != B ||
        !rl_tensor_is_contiguous(len) || rl_tensor_device(len).type != RL_CPU)
        return luaL_error(L, "%s: lengths must be a (%lld) int32 CPU tensor", who, (long long)B);
    if (blank < 0 || blank >= V || beam < 1)
        return luaL_error(L, "%s: blank %lld or beam %lld out of range", who, (long long)blank,
                          (long long)beam);
    rl_ctc_lm lm = {0};
    step_ctx sc = {0};
    bool with_lm = !lua_isnoneornil(L, 5);
    if (with_lm) lm_arg(L, 5, V, &lm, &sc);
    int32_t *out = lua_newuserdatauv(L, (size_t)(B * T > 0 ? B * T : 1) * sizeof *out, 0);
    int64_t *out_len = lua_newuserdatauv(L, (size_t)(B > 0 ? B : 1) * sizeof *out_len, 0);
    if (rl_ctc_beam_search_cpu(T, B, V, rl_tensor_data(lp), rl_tensor_data(len), (int32_t)blank,
                               (int64_t)beam, with_lm ? &lm : NULL, out, out_len,
                               rl_blas_get_threads()) != RL_OK)
        return rl_lua_raise(L, who);
    lua_createtable(L, (int)B, 0);
    for (int64_t b = 0; b < B; b++) {
        lua_createtable(L, (int)out_len[b], 0);
        for (int64_t k = 0; k < out_len[b]; k++) {
            lua_pushinteger(L, out[b * T + k]);
            lua_rawseti(L, -2, k + 1);
        }
        lua_rawseti(L, -2, b + 1);
    }
    return 1;
}

static const luaL_Reg ctc_funcs[] = {
    {"_ctc_beam_search", l_ctc_beam_search},
    {"_ngram_load", l_ngram_load},
    {"ctc_loss", l_ctc_loss},
    {"edit_distance", l_edit_distance},
    {NULL, NULL},
};

void rl_lua_open_ctc(lua_State *L) {
    luaL_newmetatable(L, NGRAM_MT);
    lua_pushcfunction(L, ngram_gc);
    lua_setfield(L, -2, "__gc");
    luaL_newlib(L, ngram_methods);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    luaL_setfuncs(L, ctc_funcs, 0);
}
