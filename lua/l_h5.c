/* rl.save(path, {name = tensor, ...}) and rl.load(path [, name]): tables of tensors in HDF5
 * files, on top of core/h5io.
 *
 * Names are dataset paths: "lstm1/W" is the dataset W in the group lstm1, and rl.load gives
 * back every dataset of the file under such a path (no leading "/"). rl.save writes a
 * temporary file and renames it over `path` only when everything was written, so a failed
 * save leaves an older file as it was. CUDA tensors are copied to the CPU to be written;
 * rl.load gives CPU tensors. */
#include <stdlib.h>
#include <string.h>

#include "../core/h5io.h"
#include "../kernels/ops.h"
#include "l_dataset.h"
#include "l_tensor.h"

/* What rl.load holds while it builds its result, in a userdata so that a Lua error (out of
 * memory while pushing a tensor) still closes the file and frees the names in __gc. */
#define RL_H5_LOAD_MT "rnnlua.H5Load"

typedef struct {
    rl_h5file *f;
    char **names;
    int64_t count;
} h5_load_state;

static void load_state_free(h5_load_state *s) {
    rl_h5_list_free(s->names, s->count);
    s->names = NULL;
    s->count = 0;
    rl_h5_close(s->f);
    s->f = NULL;
}

static int load_state_gc(lua_State *L) {
    load_state_free(luaL_checkudata(L, 1, RL_H5_LOAD_MT));
    return 0;
}

typedef struct {
    const char *name;
    const rl_tensor *t;
} h5_entry;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const h5_entry *)a)->name, ((const h5_entry *)b)->name);
}

static int l_save(lua_State *L) {
    const char *path = rl_lua_check_cstring(L, 1, "rl.save");
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_settop(L, 2);

    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            return luaL_error(L, "rl.save: %s: names must be strings, got a %s key", path,
                              luaL_typename(L, -2));
        const char *key = rl_lua_nul_free(L, -2, "rl.save", "a name");
        if (!rl_lua_to_tensor(L, -1))
            return luaL_error(L, "rl.save: %s: value for '%s' is not a tensor (got %s)", path, key,
                              luaL_typename(L, -1));
        if (key[strspn(key, "/")] == '\0')
            return luaL_error(L, "rl.save: %s: empty dataset name '%s'", path, key);
        n++;
        lua_pop(L, 1);
    }

    /* An empty table is most often a table of nils ({x = y} with y unset): replacing a file with
     * an empty one would lose it without a word. */
    if (n == 0)
        return luaL_error(L,
                          "rl.save: %s: nothing to save (the table has no tensors; a field "
                          "set to nil is no field)",
                          path);

    /* The entries and the CPU copies of CUDA tensors live in userdata on the stack (3 and 4),
     * so every error below can simply raise. The name strings are keys of the argument table. */
    h5_entry *entries = lua_newuserdatauv(L, (n ? n : 1) * sizeof *entries, 0);
    lua_newtable(L);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        rl_tensor *t = rl_lua_to_tensor(L, -1);
        if (t->storage && t->storage->device.type != RL_CPU) {
            rl_tensor *cpu = rl_lua_push_tensor(L);
            if (rl_op_to(cpu, t, t->dtype, RL_DEVICE_CPU) != RL_OK)
                return rl_lua_raise(L, "rl.save");
            lua_rawseti(L, 4, (lua_Integer)lua_rawlen(L, 4) + 1);
            t = cpu;
        }
        entries[i].name = lua_tostring(L, -2);
        entries[i].t = t;
        i++;
        lua_pop(L, 1);
    }
    qsort(entries, n, sizeof *entries, entry_cmp);

    rl_h5file *f;
    if (rl_h5_create(&f, path) != RL_OK) return rl_lua_raise(L, "rl.save");
    for (i = 0; i < n; i++) {
        if (rl_h5_write_tensor(f, entries[i].name, entries[i].t) != RL_OK) {
            rl_h5_close(f);
            return rl_lua_raise(L, "rl.save");
        }
    }
    if (rl_h5_commit(f) != RL_OK) return rl_lua_raise(L, "rl.save");
    return 0;
}

static int l_load(lua_State *L) {
    const char *path = rl_lua_check_cstring(L, 1, "rl.load");
    const char *only = lua_isnoneornil(L, 2) ? NULL : rl_lua_check_cstring(L, 2, "rl.load");
    h5_load_state *s = lua_newuserdatauv(L, sizeof *s, 0);
    memset(s, 0, sizeof *s);
    luaL_setmetatable(L, RL_H5_LOAD_MT);
    if (rl_h5_open(&s->f, path, false) != RL_OK) return rl_lua_raise(L, "rl.load");
    if (only) {
        rl_tensor *t = rl_lua_push_tensor(L);
        if (rl_h5_read_tensor(s->f, only, t) != RL_OK) {
            load_state_free(s);
            return rl_lua_raise(L, "rl.load");
        }
        load_state_free(s);
        return 1;
    }
    if (rl_h5_list(s->f, "/", &s->names, &s->count) != RL_OK) {
        load_state_free(s);
        return rl_lua_raise(L, "rl.load");
    }
    lua_createtable(L, 0, s->count > 0 && s->count < 1 << 20 ? (int)s->count : 0);
    for (int64_t i = 0; i < s->count; i++) {
        rl_tensor *t = rl_lua_push_tensor(L);
        if (rl_h5_read_tensor(s->f, s->names[i], t) != RL_OK) {
            load_state_free(s);
            return rl_lua_raise(L, "rl.load");
        }
        lua_setfield(L, -2, s->names[i]);
    }
    load_state_free(s);
    return 1;
}

static const luaL_Reg h5_funcs[] = {
    {"save", l_save},
    {"load", l_load},
    {NULL, NULL},
};

void rl_lua_open_h5(lua_State *L) {
    if (luaL_newmetatable(L, RL_H5_LOAD_MT)) {
        lua_pushcfunction(L, load_state_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    luaL_setfuncs(L, h5_funcs, 0);
}
