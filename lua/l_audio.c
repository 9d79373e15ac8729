/* The Lua face of core/audio.h, the table rl.audio:
 *   rl.audio.load(path [, {rate = R, resample = true}]) -> wave (N) float32, rate
 *     rate: the rate wanted (default: the file's); resample = false makes a file of another
 *     rate an error instead of resampling it.
 *   rl.audio.features(wave, cfg) -> (T, F) float32
 *     wave: a 1-D float32 CPU tensor; cfg: a table of the fields of rl_audio_cfg (all optional):
 *     rate, window_ms, hop_ms, n_mels, low_freq, high_freq, preemph, window ("povey",
 *     "hamming", "hann"), dither, seed, remove_dc, use_power, round_pow2, floor, n_ceps,
 *     lifter (default 22 when n_ceps > 0), deltas, delta_window, normalize, snip_edges.
 * Errors name the function and the file or the option. */
#include "l_audio.h"
#include "l_dataset.h"

#include <lauxlib.h>
#include <string.h>

#include "../core/audio.h"
#include "../kernels/ops.h"
#include "l_tensor.h"

static const char *const load_keys = "rate, resample";
static const char *const feat_keys =
    "rate, window_ms, hop_ms, n_mels, low_freq, high_freq, preemph, window, dither, seed, "
    "remove_dc, use_power, round_pow2, floor, n_ceps, lifter, deltas, delta_window, normalize, "
    "snip_edges";

static double opt_number(lua_State *L, const char *who, const char *k) {
    if (!lua_isnumber(L, -1) || lua_type(L, -1) == LUA_TSTRING)
        luaL_error(L, "%s: option '%s' must be a number, got %s", who, k, luaL_typename(L, -1));
    return lua_tonumber(L, -1);
}

static lua_Integer opt_integer(lua_State *L, const char *who, const char *k) {
    if (!lua_isinteger(L, -1))
        luaL_error(L, "%s: option '%s' must be an integer, got %s", who, k,
                   lua_type(L, -1) == LUA_TNUMBER ? "a fraction" : luaL_typename(L, -1));
    return lua_tointeger(L, -1);
}

static bool opt_bool(lua_State *L, const char *who, const char *k) {
    if (!lua_isboolean(L, -1))
        luaL_error(L, "%s: option '%s' must be a boolean, got %s", who, k, luaL_typename(L, -1));
    return lua_toboolean(L, -1);
}

static int l_load(lua_State *L) {
    const char *who = "rl.audio.load";
    const char *path = rl_lua_check_cstring(L, 1, "rl.audio.load");
    lua_Integer rate = 0;
    bool resample = true;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
            if (strcmp(k, "rate") == 0) {
                rate = opt_integer(L, who, k);
                if (rate <= 0)
                    return luaL_error(L, "%s: option 'rate' must be positive, got %d", who,
                                      (int)rate);
            } else if (strcmp(k, "resample") == 0) {
                resample = opt_bool(L, who, k);
            } else {
                return luaL_error(L, "%s: unknown option '%s' (%s)", who, k, load_keys);
            }
            lua_pop(L, 1);
        }
    }
    rl_tensor *wave = rl_lua_push_tensor(L);
    int64_t got_rate = 0;
    if (rl_audio_load(path, rate, resample, wave, &got_rate) != RL_OK) return rl_lua_raise(L, who);
    lua_pushinteger(L, (lua_Integer)got_rate);
    return 2;
}

static int l_features(lua_State *L) {
    const char *who = "rl.audio.features";
    rl_tensor *wave = rl_lua_check_tensor(L, 1);
    if (!wave->storage || wave->ndim != 1 || wave->dtype != RL_FLOAT32 ||
        rl_tensor_device(wave).type != RL_CPU) {
        char buf[96];
        return luaL_error(L, "%s: wave must be a 1-D float32 CPU tensor, got %s", who,
                          rl_tensor_describe(wave, buf, sizeof buf));
    }
    rl_audio_cfg cfg = rl_audio_cfg_default();
    bool lifter_set = false;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
            if (strcmp(k, "rate") == 0)
                cfg.rate = opt_number(L, who, k);
            else if (strcmp(k, "window_ms") == 0)
                cfg.window_ms = opt_number(L, who, k);
            else if (strcmp(k, "hop_ms") == 0)
                cfg.hop_ms = opt_number(L, who, k);
            else if (strcmp(k, "n_mels") == 0)
                cfg.n_mels = opt_integer(L, who, k);
            else if (strcmp(k, "low_freq") == 0)
                cfg.low_freq = opt_number(L, who, k);
            else if (strcmp(k, "high_freq") == 0)
                cfg.high_freq = opt_number(L, who, k);
            else if (strcmp(k, "preemph") == 0)
                cfg.preemph = opt_number(L, who, k);
            else if (strcmp(k, "dither") == 0)
                cfg.dither = opt_number(L, who, k);
            else if (strcmp(k, "seed") == 0)
                cfg.seed = (uint64_t)opt_integer(L, who, k);
            else if (strcmp(k, "remove_dc") == 0)
                cfg.remove_dc = opt_bool(L, who, k);
            else if (strcmp(k, "use_power") == 0)
                cfg.use_power = opt_bool(L, who, k);
            else if (strcmp(k, "round_pow2") == 0)
                cfg.round_pow2 = opt_bool(L, who, k);
            else if (strcmp(k, "floor") == 0)
                cfg.floor = opt_number(L, who, k);
            else if (strcmp(k, "n_ceps") == 0)
                cfg.n_ceps = opt_integer(L, who, k);
            else if (strcmp(k, "delta_window") == 0)
                cfg.delta_window = opt_integer(L, who, k);
            else if (strcmp(k, "normalize") == 0)
                cfg.normalize = opt_bool(L, who, k);
            else if (strcmp(k, "snip_edges") == 0)
                cfg.snip_edges = opt_bool(L, who, k);
            else if (strcmp(k, "lifter") == 0) {
                cfg.lifter = opt_number(L, who, k);
                lifter_set = true;
            } else if (strcmp(k, "deltas") == 0) {
                lua_Integer d = opt_integer(L, who, k);
                if (d < 0 || d > 2)
                    return luaL_error(L, "%s: option 'deltas' must be 0, 1 or 2, got %d", who,
                                      (int)d);
                cfg.deltas = (int)d;
            } else if (strcmp(k, "window") == 0) {
                const char *w = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
                if (strcmp(w, "povey") == 0)
                    cfg.window = RL_WINDOW_POVEY;
                else if (strcmp(w, "hamming") == 0)
                    cfg.window = RL_WINDOW_HAMMING;
                else if (strcmp(w, "hann") == 0)
                    cfg.window = RL_WINDOW_HANN;
                else
                    return luaL_error(L,
                                      "%s: option 'window' must be \"povey\", \"hamming\" or "
                                      "\"hann\", got %s",
                                      who, luaL_tolstring(L, -1, NULL));
            } else {
                return luaL_error(L, "%s: unknown option '%s' (%s)", who, k, feat_keys);
            }
            lua_pop(L, 1);
        }
    }
    /* Kaldi's MFCC default */
    if (!lifter_set && cfg.n_ceps > 0) cfg.lifter = 22;
    rl_tensor *out = rl_lua_push_tensor(L);
    rl_tensor c = {0};
    const rl_tensor *x = wave;
    rl_status st = RL_OK;
    if (!rl_tensor_is_contiguous(wave)) {
        st = rl_op_contiguous(&c, wave);
        x = &c;
    }
    if (st == RL_OK) st = rl_audio_features(who, &cfg, rl_tensor_data(x), x->shape[0], out);
    rl_tensor_release(&c);
    if (st != RL_OK) return rl_lua_raise(L, who);
    return 1;
}

static const luaL_Reg audio_funcs[] = {
    {"load", l_load},
    {"features", l_features},
    {NULL, NULL},
};

void rl_lua_open_audio(lua_State *L) {
    lua_newtable(L);
    luaL_setfuncs(L, audio_funcs, 0);
    lua_setfield(L, -2, "audio");
}
