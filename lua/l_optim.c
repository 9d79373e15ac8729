/* The C half of rl.optimizer (kernels/optim.h): an Optimizer userdata holding an rl_optimizer,
 * and the max-norm and gradient-norm helpers. lua/rnnlua/optim.lua checks the configuration's
 * keys and builds the user-facing object on top of these. */
#include "l_optim.h"

#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "../core/rng.h"
#include "../kernels/optim.h"
#include "l_tensor.h"

#define RL_OPTIM_MT "rnnlua.Optimizer"

static rl_optimizer *check_opt(lua_State *L, int idx) {
    return luaL_checkudata(L, idx, RL_OPTIM_MT);
}

/* cfg[key] as a number into *v when present; a wrong type is an error naming the key. */
static void opt_number(lua_State *L, int cfg, const char *key, double *v) {
    int t = lua_getfield(L, cfg, key);
    if (t != LUA_TNIL) {
        if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1))
            *v = 0;
        else if (t == LUA_TNUMBER)
            *v = lua_tonumber(L, -1);
        else
            luaL_error(L, "rl.optimizer: %s must be a number, got %s", key, luaL_typename(L, -1));
    }
    lua_pop(L, 1);
}

/* rl._optimizer_new(cfg, params): cfg.class and the numeric options of rl_optim_config. */
static int l_optimizer_new(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    rl_tensor *params = rl_lua_check_tensor(L, 2);
    lua_getfield(L, 1, "class");
    const char *name = lua_isnil(L, -1) ? "sgd" : lua_tostring(L, -1);
    if (!name) return luaL_error(L, "rl.optimizer: class must be a string");
    rl_optim_kind kind;
    if (rl_optim_parse(name, &kind) != RL_OK) return rl_lua_raise(L, "optimizer");
    lua_pop(L, 1);

    rl_optim_config cfg;
    rl_optim_config_default(&cfg, kind);
    opt_number(L, 1, "momentum", &cfg.momentum);
    opt_number(L, 1, "beta1", &cfg.beta1);
    opt_number(L, 1, "beta2", &cfg.beta2);
    opt_number(L, 1, "epsilon", &cfg.epsilon);
    opt_number(L, 1, "rho", &cfg.rho);
    opt_number(L, 1, "weight_decay", &cfg.weight_decay);
    opt_number(L, 1, "l2", &cfg.l2);
    opt_number(L, 1, "gradient_clip", &cfg.gradient_clip);
    opt_number(L, 1, "gradient_clip_global_norm", &cfg.gradient_clip_global_norm);
    opt_number(L, 1, "gradient_noise", &cfg.gradient_noise);
    opt_number(L, 1, "outlier_factor", &cfg.outlier_factor);
    double warmup = (double)cfg.outlier_warmup;
    opt_number(L, 1, "outlier_warmup", &warmup);
    if (!(warmup >= 0 && warmup <= 1e15) || warmup != (double)(int64_t)warmup)
        return luaL_error(L, "rl.optimizer: outlier_warmup = %f must be an integer >= 0", warmup);
    cfg.outlier_warmup = (int64_t)warmup;

    rl_optimizer *o = lua_newuserdatauv(L, sizeof *o, 0);
    memset(o, 0, sizeof *o);
    luaL_setmetatable(L, RL_OPTIM_MT);
    if (rl_optimizer_init(o, &cfg, params) != RL_OK) return rl_lua_raise(L, "optimizer");
    return 1;
}

/* o:step(params, grads, lr) -> applied, reason (nil when applied) */
static int m_step(lua_State *L) {
    rl_optimizer *o = check_opt(L, 1);
    rl_tensor *params = rl_lua_check_tensor(L, 2);
    rl_tensor *grads = rl_lua_check_tensor(L, 3);
    double lr = luaL_checknumber(L, 4);
    bool applied;
    if (rl_optimizer_step(o, params, grads, lr, rl_rng_default(), &applied) != RL_OK)
        return rl_lua_raise(L, "opt:step");
    lua_pushboolean(L, applied);
    if (applied)
        lua_pushnil(L);
    else
        lua_pushstring(L, o->skip_reason);
    return 2;
}

/* o:info() -> {class, num_steps, skipped, norm_count, avg_norm, last_grad_norm} */
static int m_info(lua_State *L) {
    rl_optimizer *o = check_opt(L, 1);
    lua_createtable(L, 0, 6);
    lua_pushstring(L, rl_optim_name(o->cfg.kind));
    lua_setfield(L, -2, "class");
    lua_pushinteger(L, (lua_Integer)o->num_steps);
    lua_setfield(L, -2, "num_steps");
    lua_pushinteger(L, (lua_Integer)o->skipped);
    lua_setfield(L, -2, "skipped");
    lua_pushinteger(L, (lua_Integer)o->norm_count);
    lua_setfield(L, -2, "norm_count");
    lua_pushnumber(L, o->avg_norm);
    lua_setfield(L, -2, "avg_norm");
    lua_pushnumber(L, o->last_grad_norm);
    lua_setfield(L, -2, "last_grad_norm");
    return 1;
}

static int64_t field_count(lua_State *L, const char *key) {
    lua_getfield(L, 2, key);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || v < 0)
        return luaL_error(L, "opt:load_state: %s must be an integer >= 0, got %s", key,
                          luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
    return (int64_t)v;
}

static double field_number(lua_State *L, const char *key) {
    lua_getfield(L, 2, key);
    if (!lua_isnumber(L, -1))
        return luaL_error(L, "opt:load_state: %s must be a number, got %s", key,
                          luaL_typename(L, -1));
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* o:set_info(t): the counters of o:info() back (checked before anything changes). */
static int m_set_info(lua_State *L) {
    rl_optimizer *o = check_opt(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int64_t num_steps = field_count(L, "num_steps"), skipped = field_count(L, "skipped");
    int64_t norm_count = field_count(L, "norm_count");
    double avg = field_number(L, "avg_norm"), last = field_number(L, "last_grad_norm");
    o->num_steps = num_steps;
    o->skipped = skipped;
    o->norm_count = norm_count;
    o->avg_norm = avg;
    o->last_grad_norm = last;
    return 0;
}

/* o:state_tensors() -> {name = tensor, ...}: views sharing the live state buffers. */
static int m_state_tensors(lua_State *L) {
    rl_optimizer *o = check_opt(L, 1);
    int n = rl_optim_num_states(o->cfg.kind);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        rl_tensor_share(rl_lua_push_tensor(L), &o->state[i]);
        lua_setfield(L, -2, rl_optim_state_name(o->cfg.kind, i));
    }
    return 1;
}

static int mm_gc(lua_State *L) {
    rl_optimizer_free(check_opt(L, 1));
    return 0;
}

static int mm_tostring(lua_State *L) {
    rl_optimizer *o = check_opt(L, 1);
    lua_pushfstring(L, "optimizer %s (%d steps, %d skipped)", rl_optim_name(o->cfg.kind),
                    (int)o->num_steps, (int)o->skipped);
    return 1;
}

/* rl._optim_max_norm(w, max_norm): the constraint on one 2-D weight, in place. */
static int l_max_norm(lua_State *L) {
    rl_tensor *w = rl_lua_check_tensor(L, 1);
    if (rl_optim_max_norm(w, luaL_checknumber(L, 2)) != RL_OK) return rl_lua_raise(L, "max_norm");
    return 0;
}

/* rl._optim_grad_norm(g) -> ||g||_2 of a contiguous float buffer */
static int l_grad_norm(lua_State *L) {
    double norm;
    if (rl_optim_grad_norm(&norm, rl_lua_check_tensor(L, 1)) != RL_OK)
        return rl_lua_raise(L, "grad_norm");
    lua_pushnumber(L, norm);
    return 1;
}

static const luaL_Reg methods[] = {
    {"step", m_step},
    {"info", m_info},
    {"set_info", m_set_info},
    {"state_tensors", m_state_tensors},
    {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"_optimizer_new", l_optimizer_new},
    {"_optim_max_norm", l_max_norm},
    {"_optim_grad_norm", l_grad_norm},
    {NULL, NULL},
};

void rl_lua_open_optim(lua_State *L) {
    int module = lua_gettop(L);
    luaL_newmetatable(L, RL_OPTIM_MT);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, mm_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, mm_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    luaL_setfuncs(L, module_funcs, 0);
    lua_settop(L, module);
}
