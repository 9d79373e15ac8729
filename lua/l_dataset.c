/* rl.h5file: an HDF5 file held open from Lua, on top of core/h5io. The datasets library
 * (lua/rnnlua/datasets.lua) reads RETURNN-layout files through it one sequence at a time
 * (read_rows) and writes them with it; checkpoints and tools may use it too.
 *
 *   local f = rl.h5file(path [, "r" | "w"])   -- "r": open existing (default); "w": create
 *   f:read(name) -> tensor            f:read_rows(name, first, count) -> rows first..first+count-1
 *   f:info(name) -> dtype, {shape}    f:exists(name) -> bool       f:list(group) -> {names}
 *   f:read_strings(name) -> {strs}    f:write(name, t)             f:write_strings(name, {strs})
 *   f:attr_tensor(obj, name) / f:attr_number(obj, name) / f:attr_string(obj, name)
 *   f:set_attr(obj, name, value)      -- integer -> int64, float -> double, string, tensor
 *   f:refuse_vlen()                   -- variable-length strings are errors from now on
 *   f:commit()                        -- "w": rename the temporary file over path
 *   f:close()                         -- also __gc/__close; an uncommitted "w" file is removed
 *
 * Positions (read_rows' first) are 1-based as everywhere in the Lua API. Errors raise the
 * message of core/h5io, which names the file and the object.
 *
 * rl.dataset_scan(t) -> for a float tensor: the 1-based flat index of the first NaN and of the
 * first +-Inf (nil when none); for an int32 tensor: its min and max (nil for an empty one).
 * One C pass, so every sequence read from a file can be checked without a Lua loop.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/h5io.h"
#include "l_dataset.h"
#include "l_tensor.h"

#define RL_H5FILE_MT "rnnlua.H5File"

typedef struct {
    rl_h5file *f;
} h5file_ud;

const char *rl_lua_nul_free(lua_State *L, int idx, const char *who, const char *what) {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (s && strlen(s) != len)
        luaL_error(L, "%s: %s holds a NUL byte, where it would end in a file (\"%s\\0...\")", who,
                   what, s);
    return s;
}

const char *rl_lua_check_cstring(lua_State *L, int idx, const char *who) {
    luaL_checkstring(L, idx);
    char what[32];
    snprintf(what, sizeof what, "argument %d", idx);
    return rl_lua_nul_free(L, idx, who, what);
}

static rl_h5file *check_open(lua_State *L) {
    h5file_ud *u = luaL_checkudata(L, 1, RL_H5FILE_MT);
    if (!u->f) luaL_error(L, "h5file: the file is closed");
    return u->f;
}

static int l_h5file(lua_State *L) {
    const char *path = rl_lua_check_cstring(L, 1, "rl.h5file");
    const char *mode = luaL_optstring(L, 2, "r");
    if (strcmp(mode, "r") != 0 && strcmp(mode, "w") != 0)
        return luaL_error(L, "rl.h5file: mode must be \"r\" or \"w\", got \"%s\"", mode);
    h5file_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->f = NULL;
    luaL_setmetatable(L, RL_H5FILE_MT);
    rl_status s = mode[0] == 'r' ? rl_h5_open(&u->f, path, false) : rl_h5_create(&u->f, path);
    if (s != RL_OK) return rl_lua_raise(L, "rl.h5file");
    return 1;
}

static int m_close(lua_State *L) {
    h5file_ud *u = luaL_checkudata(L, 1, RL_H5FILE_MT);
    rl_h5_close(u->f);
    u->f = NULL;
    return 0;
}

static int m_commit(lua_State *L) {
    h5file_ud *u = luaL_checkudata(L, 1, RL_H5FILE_MT);
    if (!u->f) return luaL_error(L, "h5file: the file is closed");
    rl_h5file *f = u->f;
    u->f = NULL; /* commit frees it whatever happens */
    if (rl_h5_commit(f) != RL_OK) return rl_lua_raise(L, "h5file:commit");
    return 0;
}

static int m_path(lua_State *L) {
    lua_pushstring(L, rl_h5_path(check_open(L)));
    return 1;
}

static int m_refuse_vlen(lua_State *L) {
    rl_h5_refuse_vlen(check_open(L));
    return 0;
}

static int m_read(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    rl_tensor *t = rl_lua_push_tensor(L);
    if (rl_h5_read_tensor(f, name, t) != RL_OK) return rl_lua_raise(L, "h5file:read");
    return 1;
}

static int m_read_rows(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    lua_Integer first = luaL_checkinteger(L, 3);
    lua_Integer count = luaL_checkinteger(L, 4);
    if (first < 1 || count < 0)
        return luaL_error(L,
                          "h5file:read_rows: %s: %s: bad rows first=%I count=%I (first >= 1, "
                          "count >= 0)",
                          rl_h5_path(f), name, first, count);
    rl_tensor *t = rl_lua_push_tensor(L);
    if (rl_h5_read_rows(f, name, (int64_t)first - 1, (int64_t)count, t) != RL_OK)
        return rl_lua_raise(L, "h5file:read_rows");
    return 1;
}

static int m_info(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    rl_dtype dt;
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    if (rl_h5_dataset_info(f, name, &dt, &ndim, shape) != RL_OK)
        return rl_lua_raise(L, "h5file:info");
    lua_pushstring(L, rl_dtype_name(dt));
    lua_createtable(L, ndim, 0);
    for (int i = 0; i < ndim; i++) {
        lua_pushinteger(L, (lua_Integer)shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 2;
}

static int m_exists(lua_State *L) {
    rl_h5file *f = check_open(L);
    bool e;
    if (rl_h5_exists(f, rl_lua_check_cstring(L, 2, "h5file"), &e) != RL_OK)
        return rl_lua_raise(L, "h5file:exists");
    lua_pushboolean(L, e);
    return 1;
}

/* A list of malloc'd strings from core/h5io held by a userdata while it is copied into Lua,
 * so that a Lua memory error during the copy still frees it (__gc). */
#define RL_STRLIST_MT "rnnlua.H5StringList"

typedef struct {
    char **strs;
    int64_t n;
} strlist_ud;

static int strlist_gc(lua_State *L) {
    strlist_ud *u = luaL_checkudata(L, 1, RL_STRLIST_MT);
    rl_h5_list_free(u->strs, u->n);
    u->strs = NULL;
    u->n = 0;
    return 0;
}

static strlist_ud *push_strlist(lua_State *L) {
    strlist_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->strs = NULL;
    u->n = 0;
    luaL_setmetatable(L, RL_STRLIST_MT);
    return u;
}

/* Replaces the strlist userdata on top by a Lua table of its strings. */
static void strlist_to_table(lua_State *L, strlist_ud *u) {
    lua_createtable(L, u->n > 0 && u->n < (1 << 24) ? (int)u->n : 0, 0);
    for (int64_t i = 0; i < u->n; i++) {
        lua_pushstring(L, u->strs[i] ? u->strs[i] : "");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    rl_h5_list_free(u->strs, u->n);
    u->strs = NULL;
    u->n = 0;
    lua_remove(L, -2);
}

static int m_list(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *group = lua_isnoneornil(L, 2) ? "/" : rl_lua_check_cstring(L, 2, "h5file");
    strlist_ud *u = push_strlist(L);
    if (rl_h5_list(f, group, &u->strs, &u->n) != RL_OK) return rl_lua_raise(L, "h5file:list");
    strlist_to_table(L, u);
    return 1;
}

static int m_read_strings(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    strlist_ud *u = push_strlist(L);
    if (rl_h5_read_strings(f, name, &u->strs, &u->n) != RL_OK)
        return rl_lua_raise(L, "h5file:read_strings");
    strlist_to_table(L, u);
    return 1;
}

static int m_write(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    rl_tensor *t = rl_lua_check_tensor(L, 3);
    if (rl_h5_write_tensor(f, name, t) != RL_OK) return rl_lua_raise(L, "h5file:write");
    return 0;
}

static int m_write_strings(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *name = rl_lua_check_cstring(L, 2, "h5file");
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 3);
    /* The pointers stay valid while the strings are in the table at index 3. */
    const char **strs = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *strs, 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 3, i);
        if (lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "h5file:write_strings: %s: element %d is a %s, not a string", name,
                              (int)i, luaL_typename(L, -1));
        strs[i - 1] = rl_lua_nul_free(L, -1, "h5file:write_strings", name);
        lua_pop(L, 1);
    }
    if (rl_h5_write_strings(f, name, strs, (int64_t)n) != RL_OK)
        return rl_lua_raise(L, "h5file:write_strings");
    return 0;
}

static int m_attr_tensor(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *obj = rl_lua_check_cstring(L, 2, "h5file"),
               *name = rl_lua_check_cstring(L, 3, "h5file");
    rl_tensor *t = rl_lua_push_tensor(L);
    if (rl_h5_attr_read_tensor(f, obj, name, t) != RL_OK)
        return rl_lua_raise(L, "h5file:attr_tensor");
    return 1;
}

static int m_attr_number(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *obj = rl_lua_check_cstring(L, 2, "h5file"),
               *name = rl_lua_check_cstring(L, 3, "h5file");
    double v;
    if (rl_h5_attr_read_double(f, obj, name, &v) != RL_OK)
        return rl_lua_raise(L, "h5file:attr_number");
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        lua_pushinteger(L, (lua_Integer)v);
    else
        lua_pushnumber(L, v);
    return 1;
}

static int m_attr_string(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *obj = rl_lua_check_cstring(L, 2, "h5file"),
               *name = rl_lua_check_cstring(L, 3, "h5file");
    char *v;
    if (rl_h5_attr_read_string(f, obj, name, &v) != RL_OK)
        return rl_lua_raise(L, "h5file:attr_string");
    lua_pushstring(L, v);
    free(v);
    return 1;
}

static int m_set_attr(lua_State *L) {
    rl_h5file *f = check_open(L);
    const char *obj = rl_lua_check_cstring(L, 2, "h5file"),
               *name = rl_lua_check_cstring(L, 3, "h5file");
    rl_status s;
    if (lua_type(L, 4) == LUA_TNUMBER) {
        if (lua_isinteger(L, 4))
            s = rl_h5_attr_write_int64(f, obj, name, (int64_t)lua_tointeger(L, 4));
        else
            s = rl_h5_attr_write_double(f, obj, name, lua_tonumber(L, 4));
    } else if (lua_type(L, 4) == LUA_TSTRING) {
        s = rl_h5_attr_write_string(f, obj, name, rl_lua_nul_free(L, 4, "h5file:set_attr", name));
    } else {
        rl_tensor *t = rl_lua_to_tensor(L, 4);
        if (!t)
            return luaL_error(L,
                              "h5file:set_attr: %s: value must be a number, string or tensor, "
                              "got %s",
                              name, luaL_typename(L, 4));
        s = rl_h5_attr_write_tensor(f, obj, name, t);
    }
    if (s != RL_OK) return rl_lua_raise(L, "h5file:set_attr");
    return 0;
}

static int m_tostring(lua_State *L) {
    h5file_ud *u = luaL_checkudata(L, 1, RL_H5FILE_MT);
    if (u->f)
        lua_pushfstring(L, "h5file(%s)", rl_h5_path(u->f));
    else
        lua_pushstring(L, "h5file(closed)");
    return 1;
}

static int l_dataset_scan(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (rl_tensor_device(t).type != RL_CPU || !rl_tensor_is_contiguous(t))
        return luaL_error(L, "dataset_scan: needs a contiguous CPU tensor");
    int64_t n = rl_tensor_numel(t);
    const void *p = rl_tensor_data(t);
    if (t->dtype == RL_INT32) {
        if (n == 0) return 0;
        const int32_t *x = p;
        int32_t lo = x[0], hi = x[0];
        for (int64_t i = 1; i < n; i++) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
        lua_pushinteger(L, lo);
        lua_pushinteger(L, hi);
        return 2;
    }
    int64_t first_nan = -1, first_inf = -1;
    for (int64_t i = 0; i < n && (first_nan < 0 || first_inf < 0); i++) {
        double v = t->dtype == RL_FLOAT32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
        if (isnan(v) && first_nan < 0) first_nan = i;
        if (isinf(v) && first_inf < 0) first_inf = i;
    }
    if (first_nan >= 0)
        lua_pushinteger(L, (lua_Integer)first_nan + 1);
    else
        lua_pushnil(L);
    if (first_inf >= 0)
        lua_pushinteger(L, (lua_Integer)first_inf + 1);
    else
        lua_pushnil(L);
    return 2;
}

static const luaL_Reg h5file_methods[] = {
    {"path", m_path},
    {"refuse_vlen", m_refuse_vlen},
    {"read", m_read},
    {"read_rows", m_read_rows},
    {"info", m_info},
    {"exists", m_exists},
    {"list", m_list},
    {"read_strings", m_read_strings},
    {"write", m_write},
    {"write_strings", m_write_strings},
    {"attr_tensor", m_attr_tensor},
    {"attr_number", m_attr_number},
    {"attr_string", m_attr_string},
    {"set_attr", m_set_attr},
    {"commit", m_commit},
    {"close", m_close},
    {NULL, NULL},
};

static const luaL_Reg dataset_funcs[] = {
    {"h5file", l_h5file},
    {"dataset_scan", l_dataset_scan},
    {NULL, NULL},
};

void rl_lua_open_dataset(lua_State *L) {
    luaL_newmetatable(L, RL_H5FILE_MT);
    luaL_newlib(L, h5file_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, m_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, m_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, m_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    luaL_newmetatable(L, RL_STRLIST_MT);
    lua_pushcfunction(L, strlist_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_setfuncs(L, dataset_funcs, 0);
}
