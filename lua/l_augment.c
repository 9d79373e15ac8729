/* The Lua face of core/augment.h, the table rl.augment:
 *   rl.augment.config(opts [, who]) -> cfg, a parsed augment = {...} table (see
 *     lua/rnnlua/augment.lua for the options); errors name the option as who.group.name
 *     (who defaults to "augment"). The keys seed and from_epoch (top) and files (in noise) are
 *     left to the Lua side and ignored here.
 *   cfg:features(x, seed, epoch, index) -> a new (T, F) tensor, SpecAugment of x (T, F)
 *   cfg:image(x, seed, epoch, index) -> a new (H', W', C) tensor
 *   cfg:wave_fires(seed, epoch, index) -> whether speed, tempo or noise applies to that sequence
 *   cfg:wave(x, seed, epoch, index, {noise tensors} [, rate]) -> a new (N') tensor (rate: the
 *     waveform's sample rate, which tempo needs)
 *   cfg:uses() -> {spec =, affine =, elastic =, stroke =, speed =, tempo =, noise = } booleans
 *     (p > 0)
 * The transforms with their parameters given, for tests and tools:
 *   rl.augment.affine(img, {scale = 1, shear = 0, rotate = 0 (degrees), fill = 0}) -> img
 *   rl.augment.stroke(img, r) -> img        rl.augment.speed(wave, factor) -> wave
 *   rl.augment.tempo(wave, factor, rate) -> wave (the pitch kept)
 *   rl.augment.add_noise(wave, noise, offset (0-based), snr_db) -> wave, gain
 *   rl.augment.warp(x (T, F), centre (0-based frame), distance) -> x
 * Inputs are float32 CPU tensors (made contiguous here); outputs are new tensors. */
#include "l_augment.h"

#include <lauxlib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/augment.h"
#include "../kernels/ops.h"
#include "l_tensor.h"

#define RL_AUGCFG_MT "rnnlua.AugmentConfig"

typedef struct {
    rl_aug_cfg c;
} augcfg_ud;

/* A contiguous float32 CPU copy or view of argument idx with `ndim` dims, pushed on the stack
 * (the caller keeps it there while using the pointer). */
static const rl_tensor *float_arg(lua_State *L, int idx, int ndim, const char *who,
                                  const char *what) {
    rl_tensor *t = rl_lua_check_tensor(L, idx);
    if (!t->storage || t->ndim != ndim || t->dtype != RL_FLOAT32 ||
        rl_tensor_device(t).type != RL_CPU) {
        char buf[96];
        luaL_error(L, "%s: %s must be a %d-dim float32 CPU tensor, got %s", who, what, ndim,
                   rl_tensor_describe(t, buf, sizeof buf));
    }
    if (rl_tensor_is_contiguous(t)) {
        lua_pushvalue(L, idx);
        return t;
    }
    rl_tensor *c = rl_lua_push_tensor(L);
    if (rl_op_contiguous(c, t) != RL_OK) rl_lua_raise(L, who);
    return c;
}

static double num_field(lua_State *L, const char *who, const char *group, const char *k) {
    if (lua_type(L, -1) != LUA_TNUMBER)
        luaL_error(L, "%s.%s.%s must be a number, got %s", who, group, k, luaL_typename(L, -1));
    double v = lua_tonumber(L, -1);
    if (!isfinite(v)) luaL_error(L, "%s.%s.%s must be finite, got %f", who, group, k, v);
    return v;
}

static int64_t int_field(lua_State *L, const char *who, const char *group, const char *k) {
    if (!lua_isinteger(L, -1))
        luaL_error(L, "%s.%s.%s must be an integer, got %s", who, group, k,
                   lua_type(L, -1) == LUA_TNUMBER ? "a fraction" : luaL_typename(L, -1));
    return (int64_t)lua_tointeger(L, -1);
}

/* {lo, hi} or one number (lo = hi) */
static void range_field(lua_State *L, const char *who, const char *group, const char *k, double *lo,
                        double *hi) {
    if (lua_type(L, -1) == LUA_TNUMBER) {
        *lo = *hi = num_field(L, who, group, k);
        return;
    }
    if (!lua_istable(L, -1) || lua_rawlen(L, -1) != 2)
        luaL_error(L, "%s.%s.%s must be a number or {lo, hi}, got %s", who, group, k,
                   luaL_typename(L, -1));
    lua_rawgeti(L, -1, 1);
    *lo = num_field(L, who, group, k);
    lua_rawgeti(L, -2, 2);
    *hi = num_field(L, who, group, k);
    lua_pop(L, 2);
}

/* The options of one group (the table on top of the stack). */
static void parse_group(lua_State *L, const char *who, const char *group, rl_aug_cfg *c) {
    if (!lua_istable(L, -1))
        luaL_error(L, "%s.%s must be a table of options, got %s", who, group, luaL_typename(L, -1));
    const char *keys = strcmp(group, "spec") == 0
                           ? "p, time_masks, time_width, time_ratio, freq_masks, freq_width, "
                             "time_warp, freq_warp, value"
                       : strcmp(group, "affine") == 0  ? "p, shear, scale, rotate"
                       : strcmp(group, "elastic") == 0 ? "p, alpha, sigma"
                       : strcmp(group, "stroke") == 0  ? "p, radius"
                       : strcmp(group, "speed") == 0   ? "p, min, max"
                       : strcmp(group, "tempo") == 0   ? "p, min, max"
                                                       : "p, files, snr";
    bool p_set = false;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        bool known = true;
        if (strcmp(k, "p") == 0) {
            double p = num_field(L, who, group, k);
            p_set = true;
            if (strcmp(group, "spec") == 0)
                c->spec_p = p;
            else if (strcmp(group, "affine") == 0)
                c->affine_p = p;
            else if (strcmp(group, "elastic") == 0)
                c->elastic_p = p;
            else if (strcmp(group, "stroke") == 0)
                c->stroke_p = p;
            else if (strcmp(group, "speed") == 0)
                c->speed_p = p;
            else if (strcmp(group, "tempo") == 0)
                c->tempo_p = p;
            else
                c->noise_p = p;
        } else if (strcmp(group, "spec") == 0) {
            if (strcmp(k, "time_masks") == 0)
                c->time_masks = int_field(L, who, group, k);
            else if (strcmp(k, "time_width") == 0)
                c->time_width = int_field(L, who, group, k);
            else if (strcmp(k, "time_ratio") == 0)
                c->time_ratio = num_field(L, who, group, k);
            else if (strcmp(k, "freq_masks") == 0)
                c->freq_masks = int_field(L, who, group, k);
            else if (strcmp(k, "freq_width") == 0)
                c->freq_width = int_field(L, who, group, k);
            else if (strcmp(k, "time_warp") == 0)
                c->time_warp = int_field(L, who, group, k);
            else if (strcmp(k, "freq_warp") == 0)
                c->freq_warp = num_field(L, who, group, k);
            else if (strcmp(k, "value") == 0)
                c->mask_value = (float)num_field(L, who, group, k);
            else
                known = false;
        } else if (strcmp(group, "affine") == 0) {
            if (strcmp(k, "shear") == 0)
                c->shear = num_field(L, who, group, k);
            else if (strcmp(k, "scale") == 0)
                c->scale = num_field(L, who, group, k);
            else if (strcmp(k, "rotate") == 0)
                c->rotate = num_field(L, who, group, k);
            else
                known = false;
        } else if (strcmp(group, "elastic") == 0) {
            if (strcmp(k, "alpha") == 0)
                c->elastic_alpha = num_field(L, who, group, k);
            else if (strcmp(k, "sigma") == 0)
                c->elastic_sigma = num_field(L, who, group, k);
            else
                known = false;
        } else if (strcmp(group, "stroke") == 0) {
            if (strcmp(k, "radius") == 0)
                c->stroke_radius = int_field(L, who, group, k);
            else
                known = false;
        } else if (strcmp(group, "speed") == 0 || strcmp(group, "tempo") == 0) {
            bool speed = strcmp(group, "speed") == 0;
            if (strcmp(k, "min") == 0)
                *(speed ? &c->speed_min : &c->tempo_min) = num_field(L, who, group, k);
            else if (strcmp(k, "max") == 0)
                *(speed ? &c->speed_max : &c->tempo_max) = num_field(L, who, group, k);
            else
                known = false;
        } else {
            if (strcmp(k, "snr") == 0)
                range_field(L, who, group, k, &c->snr_min, &c->snr_max);
            else
                known = strcmp(k, "files") == 0;
        }
        if (!known) luaL_error(L, "%s.%s: unknown option '%s' (%s)", who, group, k, keys);
        lua_pop(L, 1);
    }
    /* a group given without p is on: p = 1 */
    if (!p_set) {
        if (strcmp(group, "spec") == 0)
            c->spec_p = 1;
        else if (strcmp(group, "affine") == 0)
            c->affine_p = 1;
        else if (strcmp(group, "elastic") == 0)
            c->elastic_p = 1;
        else if (strcmp(group, "stroke") == 0)
            c->stroke_p = 1;
        else if (strcmp(group, "speed") == 0)
            c->speed_p = 1;
        else if (strcmp(group, "tempo") == 0)
            c->tempo_p = 1;
        else
            c->noise_p = 1;
    }
}

static const char *const groups[] = {"spec",  "affine", "elastic", "stroke",
                                     "speed", "noise",  "tempo"};

static int l_config(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    const char *who = luaL_optstring(L, 2, "augment");
    augcfg_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->c = rl_aug_cfg_default();
    /* defaults a given group starts from */
    u->c.elastic_sigma = 4;
    u->c.snr_min = 10;
    u->c.snr_max = 10;
    luaL_setmetatable(L, RL_AUGCFG_MT);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        bool done = false;
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            if (strcmp(k, groups[g]) == 0) {
                parse_group(L, who, k, &u->c);
                done = true;
            }
        if (!done) {
            if (strcmp(k, "fill") == 0) {
                if (lua_type(L, -1) != LUA_TNUMBER)
                    return luaL_error(L, "%s.fill must be a number, got %s", who,
                                      luaL_typename(L, -1));
                u->c.fill = (float)lua_tonumber(L, -1);
            } else if (strcmp(k, "seed") != 0 && strcmp(k, "from_epoch") != 0) {
                return luaL_error(L,
                                  "%s: unknown option '%s' (spec, affine, elastic, stroke, "
                                  "speed, tempo, noise, fill, seed, from_epoch)",
                                  who, k);
            }
        }
        lua_pop(L, 1);
    }
    /* the message already starts with who.group.option */
    if (rl_aug_cfg_check(who, &u->c) != RL_OK) return luaL_error(L, "%s", rl_errmsg());
    return 1;
}

/* The seed is any integer (its 64 bits are the key); epoch and index are in [0, 2^32). */
static uint64_t key_arg(lua_State *L, int idx, const char *what) {
    lua_Integer v = luaL_checkinteger(L, idx);
    if (strcmp(what, "seed") != 0 && (v < 0 || v > 0xffffffffLL))
        luaL_error(L, "augment: %s must be an integer in [0, 2^32), got %I", what, v);
    return (uint64_t)v;
}

static int m_features(lua_State *L) {
    lua_settop(L, 5);
    augcfg_ud *u = luaL_checkudata(L, 1, RL_AUGCFG_MT);
    const rl_tensor *x = float_arg(L, 2, 2, "augment", "features");
    uint64_t seed = key_arg(L, 3, "seed"), epoch = key_arg(L, 4, "epoch"),
             index = key_arg(L, 5, "index");
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_tensor_empty_like(out, x) != RL_OK) return rl_lua_raise(L, "augment");
    memcpy(rl_tensor_data(out), rl_tensor_data(x),
           (size_t)(x->shape[0] * x->shape[1]) * sizeof(float));
    if (rl_augment_features(&u->c, seed, epoch, index, rl_tensor_data(out), out->shape[0],
                            out->shape[1]) != RL_OK)
        return rl_lua_raise(L, "augment");
    return 1;
}

static int m_image(lua_State *L) {
    lua_settop(L, 5);
    augcfg_ud *u = luaL_checkudata(L, 1, RL_AUGCFG_MT);
    const rl_tensor *x = float_arg(L, 2, 3, "augment", "an image");
    uint64_t seed = key_arg(L, 3, "seed"), epoch = key_arg(L, 4, "epoch"),
             index = key_arg(L, 5, "index");
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_augment_image(&u->c, seed, epoch, index, rl_tensor_data(x), x->shape[0], x->shape[1],
                         x->shape[2], out) != RL_OK)
        return rl_lua_raise(L, "augment");
    return 1;
}

static int m_wave_fires(lua_State *L) {
    augcfg_ud *u = luaL_checkudata(L, 1, RL_AUGCFG_MT);
    uint64_t seed = key_arg(L, 2, "seed"), epoch = key_arg(L, 3, "epoch"),
             index = key_arg(L, 4, "index");
    lua_pushboolean(L, rl_augment_wave_fires(&u->c, seed, epoch, index));
    return 1;
}

static int m_wave(lua_State *L) {
    lua_settop(L, 7);
    augcfg_ud *u = luaL_checkudata(L, 1, RL_AUGCFG_MT);
    const rl_tensor *x = float_arg(L, 2, 1, "augment", "a waveform");
    uint64_t seed = key_arg(L, 3, "seed"), epoch = key_arg(L, 4, "epoch"),
             index = key_arg(L, 5, "index");
    int64_t nn = 0;
    if (!lua_isnoneornil(L, 6)) {
        luaL_checktype(L, 6, LUA_TTABLE);
        nn = (int64_t)lua_rawlen(L, 6);
    }
    double rate = 0;
    if (!lua_isnoneornil(L, 7)) {
        rate = luaL_checknumber(L, 7);
        if (!(rate > 0 && isfinite(rate)))
            return luaL_error(L, "augment: rate must be a number of samples a second > 0, got %f",
                              rate);
    } else if (u->c.tempo_p > 0) {
        return luaL_error(L, "augment: tempo needs the waveform's rate (cfg:wave's 6th argument)");
    }
    rl_aug_noise *z = lua_newuserdatauv(L, (size_t)(nn > 0 ? nn : 1) * sizeof *z, 0);
    for (int64_t i = 0; i < nn; i++) {
        lua_rawgeti(L, 6, (lua_Integer)(i + 1));
        if (!rl_lua_to_tensor(L, -1))
            return luaL_error(L, "augment: noise recording %d is not a tensor", (int)i + 1);
        const rl_tensor *t = float_arg(L, lua_gettop(L), 1, "augment", "a noise recording");
        if (t->shape[0] < 1)
            return luaL_error(L, "augment: noise recording %d is empty", (int)i + 1);
        z[i].x = rl_tensor_data(t);
        z[i].n = t->shape[0];
        /* both stay on the stack (the recording and its contiguous form) while in use */
        luaL_checkstack(L, 4, "augment: noise recordings");
    }
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_augment_wave(&u->c, seed, epoch, index, rl_tensor_data(x), x->shape[0], rate, z, nn,
                        out) != RL_OK)
        return rl_lua_raise(L, "augment");
    return 1;
}

static int m_uses(lua_State *L) {
    augcfg_ud *u = luaL_checkudata(L, 1, RL_AUGCFG_MT);
    lua_createtable(L, 0, 7);
    double p[] = {u->c.spec_p,  u->c.affine_p, u->c.elastic_p, u->c.stroke_p,
                  u->c.speed_p, u->c.noise_p,  u->c.tempo_p};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        lua_pushboolean(L, p[g] > 0);
        lua_setfield(L, -2, groups[g]);
    }
    return 1;
}

static int l_affine(lua_State *L) {
    lua_settop(L, 2);
    const rl_tensor *x = float_arg(L, 1, 3, "rl.augment.affine", "the image");
    double k = 1, s = 0, r = 0, fill = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        lua_getfield(L, 2, "scale");
        k = luaL_optnumber(L, -1, 1);
        lua_getfield(L, 2, "shear");
        s = luaL_optnumber(L, -1, 0);
        lua_getfield(L, 2, "rotate");
        r = luaL_optnumber(L, -1, 0) * (M_PI / 180);
        lua_getfield(L, 2, "fill");
        fill = luaL_optnumber(L, -1, 0);
        lua_pop(L, 4);
    }
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_aug_affine(rl_tensor_data(x), x->shape[0], x->shape[1], x->shape[2], k, s, r,
                      (float)fill, out) != RL_OK)
        return rl_lua_raise(L, "rl.augment.affine");
    return 1;
}

static int l_stroke(lua_State *L) {
    lua_settop(L, 2);
    const rl_tensor *x = float_arg(L, 1, 3, "rl.augment.stroke", "the image");
    lua_Integer r = luaL_checkinteger(L, 2);
    if (r < -100 || r > 100)
        return luaL_error(L, "rl.augment.stroke: radius must be in [-100, 100], got %I", r);
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_tensor_empty_like(out, x) != RL_OK) return rl_lua_raise(L, "rl.augment.stroke");
    rl_aug_stroke(rl_tensor_data(x), x->shape[0], x->shape[1], x->shape[2], (int64_t)r,
                  rl_tensor_data(out));
    return 1;
}

static int l_speed(lua_State *L) {
    lua_settop(L, 2);
    const rl_tensor *x = float_arg(L, 1, 1, "rl.augment.speed", "the waveform");
    double f = luaL_checknumber(L, 2);
    if (!(f >= 0.5 && f <= 2))
        return luaL_error(L, "rl.augment.speed: factor must be in [0.5, 2], got %f", f);
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_aug_speed(rl_tensor_data(x), x->shape[0], f, out) != RL_OK)
        return rl_lua_raise(L, "rl.augment.speed");
    return 1;
}

static int l_tempo(lua_State *L) {
    lua_settop(L, 3);
    const rl_tensor *x = float_arg(L, 1, 1, "rl.augment.tempo", "the waveform");
    double f = luaL_checknumber(L, 2), rate = luaL_checknumber(L, 3);
    if (!(f >= 0.5 && f <= 2))
        return luaL_error(L, "rl.augment.tempo: factor must be in [0.5, 2], got %f", f);
    if (!(rate > 0 && isfinite(rate)))
        return luaL_error(L, "rl.augment.tempo: rate must be > 0 samples a second, got %f", rate);
    if (x->shape[0] < 1) return luaL_error(L, "rl.augment.tempo: the waveform is empty");
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_aug_tempo(rl_tensor_data(x), x->shape[0], f, rate, out) != RL_OK)
        return rl_lua_raise(L, "rl.augment.tempo");
    return 1;
}

static int l_add_noise(lua_State *L) {
    lua_settop(L, 4);
    const rl_tensor *x = float_arg(L, 1, 1, "rl.augment.add_noise", "the waveform");
    const rl_tensor *z = float_arg(L, 2, 1, "rl.augment.add_noise", "the noise");
    lua_Integer off = luaL_checkinteger(L, 3);
    double snr = luaL_checknumber(L, 4);
    if (z->shape[0] < 1 || off < 0 || off >= z->shape[0])
        return luaL_error(L, "rl.augment.add_noise: offset %I outside the noise's %I samples", off,
                          (lua_Integer)z->shape[0]);
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_tensor_empty_like(out, x) != RL_OK) return rl_lua_raise(L, "rl.augment.add_noise");
    memcpy(rl_tensor_data(out), rl_tensor_data(x), (size_t)x->shape[0] * sizeof(float));
    double g;
    rl_aug_add_noise(rl_tensor_data(out), out->shape[0], rl_tensor_data(z), z->shape[0],
                     (int64_t)off, snr, &g);
    lua_pushnumber(L, g);
    return 2;
}

static int l_warp(lua_State *L) {
    lua_settop(L, 3);
    const rl_tensor *x = float_arg(L, 1, 2, "rl.augment.warp", "x");
    lua_Integer c = luaL_checkinteger(L, 2), d = luaL_checkinteger(L, 3);
    int64_t T = x->shape[0], F = x->shape[1];
    rl_tensor *out = rl_lua_push_tensor(L);
    if (rl_tensor_empty_like(out, x) != RL_OK) return rl_lua_raise(L, "rl.augment.warp");
    memcpy(rl_tensor_data(out), rl_tensor_data(x), (size_t)(T * F) * sizeof(float));
    float *scratch = malloc((size_t)(T * F + 1) * sizeof *scratch);
    if (!scratch) return luaL_error(L, "rl.augment.warp: no memory");
    rl_aug_warp(rl_tensor_data(out), T, F, F, 1, 1, (int64_t)c, (int64_t)d, scratch);
    free(scratch);
    return 1;
}

static const luaL_Reg cfg_methods[] = {
    {"features", m_features}, {"image", m_image}, {"wave_fires", m_wave_fires},
    {"wave", m_wave},         {"uses", m_uses},   {NULL, NULL},
};

static const luaL_Reg augment_funcs[] = {
    {"config", l_config}, {"affine", l_affine},       {"stroke", l_stroke}, {"speed", l_speed},
    {"tempo", l_tempo},   {"add_noise", l_add_noise}, {"warp", l_warp},     {NULL, NULL},
};

void rl_lua_open_augment(lua_State *L) {
    luaL_newmetatable(L, RL_AUGCFG_MT);
    lua_newtable(L);
    luaL_setfuncs(L, cfg_methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    lua_newtable(L);
    luaL_setfuncs(L, augment_funcs, 0);
    lua_setfield(L, -2, "augment");
}
