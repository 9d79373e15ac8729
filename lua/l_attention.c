/* The Lua face of one attention step (kernels/attention.h), for lua/rnnlua/attention.lua and
 * for tests that check the kernel directly:
 *   rl.attention_forward(kind, e, len, q, pre, v, alpha, ctx [, who])
 *   rl.attention_backward(kind, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv [, who])
 * kind "dot" or "additive"; pre, v (and dpre, dv) nil for dot; shapes as in kernels/attention.h
 * (q is the projected query q W_q for additive). alpha, ctx, ds and dq are written, de, dpre
 * and dv accumulated; nothing is allocated. who (default the function's name) starts the
 * error messages, e.g. "layer 'dec' (rec), unit layer 'att'". */
#include "l_attention.h"

#include <lauxlib.h>

#include "../kernels/attention.h"
#include "l_tensor.h"

static rl_att_kind check_kind(lua_State *L) {
    static const char *const kinds[] = {"dot", "additive", NULL};
    return luaL_checkoption(L, 1, NULL, kinds) == 0 ? RL_ATT_DOT : RL_ATT_ADDITIVE;
}

/* The tensor at i, or NULL for nil (an optional buffer). */
static rl_tensor *opt_tensor(lua_State *L, int i) {
    if (lua_isnoneornil(L, i)) return NULL;
    return rl_lua_check_tensor(L, i);
}

static int l_attention_forward(lua_State *L) {
    rl_att_kind kind = check_kind(L);
    rl_tensor *e = rl_lua_check_tensor(L, 2), *len = rl_lua_check_tensor(L, 3);
    rl_tensor *q = rl_lua_check_tensor(L, 4), *pre = opt_tensor(L, 5), *v = opt_tensor(L, 6);
    rl_tensor *alpha = rl_lua_check_tensor(L, 7), *ctx = rl_lua_check_tensor(L, 8);
    const char *who = luaL_optstring(L, 9, "rl.attention_forward");
    if (rl_attention_forward(who, kind, e, len, q, pre, v, alpha, ctx) != RL_OK)
        return rl_lua_raise(L, who);
    return 0;
}

static int l_attention_backward(lua_State *L) {
    rl_att_kind kind = check_kind(L);
    rl_tensor *e = rl_lua_check_tensor(L, 2), *len = rl_lua_check_tensor(L, 3);
    rl_tensor *q = rl_lua_check_tensor(L, 4), *pre = opt_tensor(L, 5), *v = opt_tensor(L, 6);
    rl_tensor *alpha = rl_lua_check_tensor(L, 7), *dctx = rl_lua_check_tensor(L, 8);
    rl_tensor *ds = rl_lua_check_tensor(L, 9), *de = rl_lua_check_tensor(L, 10);
    rl_tensor *dq = rl_lua_check_tensor(L, 11), *dpre = opt_tensor(L, 12), *dv = opt_tensor(L, 13);
    const char *who = luaL_optstring(L, 14, "rl.attention_backward");
    if (rl_attention_backward(who, kind, e, len, q, pre, v, alpha, dctx, ds, de, dq, dpre, dv) !=
        RL_OK)
        return rl_lua_raise(L, who);
    return 0;
}

static const luaL_Reg attention_funcs[] = {
    {"attention_forward", l_attention_forward},
    {"attention_backward", l_attention_backward},
    {NULL, NULL},
};

void rl_lua_open_attention(lua_State *L) { luaL_setfuncs(L, attention_funcs, 0); }
