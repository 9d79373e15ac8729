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
 *   rl.edit_distance(a, b) -> integer: Levenshtein distance (substitution, insertion and
 *     deletion cost 1) between two label sequences, tables of integers or 1-D int32 tensors. */
#include "l_ctc.h"

#include <lauxlib.h>
#include <string.h>

#include "../core/blas.h"
#include "../kernels/ctc.h"
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
    int32_t *out = lua_newuserdatauv(L, (size_t)(B * T > 0 ? B * T : 1) * sizeof *out, 0);
    int64_t *out_len = lua_newuserdatauv(L, (size_t)(B > 0 ? B : 1) * sizeof *out_len, 0);
    if (rl_ctc_beam_search_cpu(T, B, V, rl_tensor_data(lp), rl_tensor_data(len), (int32_t)blank,
                               (int64_t)beam, out, out_len, rl_blas_get_threads()) != RL_OK)
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
    {"ctc_loss", l_ctc_loss},
    {"edit_distance", l_edit_distance},
    {NULL, NULL},
};

void rl_lua_open_ctc(lua_State *L) { luaL_setfuncs(L, ctc_funcs, 0); }
