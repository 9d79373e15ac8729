/* What every Lua state that runs rnnlua needs besides the standard libraries (lua/l_open.h):
 * the searcher of the library's own modules, the text-only loaders and the preloads. The host
 * (lua/rnnlua.c), the C API (lua/capi.c) and the module for a system Lua use the same code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lfs.h>
#include <lua.h>
#include <lualib.h>

#include "embedded.h"
#include "l_open.h"
#include "l_tensor.h"

/* ---- the Lua library: embedded, or from RNNLUA_LUA_DIR ----------------------------------- */

static const rl_embedded_file *embedded_file(const char *module) {
    size_t n;
    const rl_embedded_file *files = rl_embedded_list(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(files[i].module, module) == 0) return &files[i];
    return NULL;
}

static int readable(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    fclose(f);
    return 1;
}

/* Loads `module` from the source tree `dir`, inverting embed's naming rule: rnnlua.X.Y from
 * lua/rnnlua/X/Y.lua; rnnlua.layers.X from layers/X.lua first. */
static int search_dir(lua_State *L, const char *module, const char *dir) {
    const char *rest = module + strlen("rnnlua.");
    luaL_Buffer notfound;
    int ncand = 0;
    const char *cand[2];
    if (strncmp(rest, "layers.", 7) == 0 && strchr(rest + 7, '.') == NULL)
        cand[ncand++] = lua_pushfstring(L, "%s/layers/%s.lua", dir, rest + 7);
    cand[ncand++] =
        lua_pushfstring(L, "%s/lua/rnnlua/%s.lua", dir, luaL_gsub(L, rest, ".", LUA_DIRSEP));
    luaL_buffinit(L, &notfound);
    for (int i = 0; i < ncand; i++) {
        if (!readable(cand[i])) {
            lua_pushfstring(L, "%sno file '%s' (" RL_LUA_DIR_ENV ")", i ? "\n\t" : "", cand[i]);
            luaL_addvalue(&notfound);
            continue;
        }
        if (luaL_loadfilex(L, cand[i], "t") != LUA_OK)
            return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", module, cand[i],
                              lua_tostring(L, -1));
        lua_pushstring(L, cand[i]);
        return 2;
    }
    luaL_pushresult(&notfound);
    return 1;
}

/* A package.searchers entry for the modules rnnlua.*; others are left to the standard
 * searchers. Embedded chunks are named "@<source path>" so tracebacks name the file. */
static int searcher_rnnlua(lua_State *L) {
    const char *module = luaL_checkstring(L, 1);
    if (strncmp(module, "rnnlua.", 7) != 0) return 0;
    const char *dir = getenv(RL_LUA_DIR_ENV);
    if (dir != NULL && dir[0] != '\0') return search_dir(L, module, dir);
    const rl_embedded_file *f = embedded_file(module);
    if (f == NULL) {
        lua_pushfstring(L, "no embedded module '%s'", module);
        return 1;
    }
    const char *chunkname = lua_pushfstring(L, "@%s", f->path);
    if (luaL_loadbufferx(L, f->bytes, f->len, chunkname, "t") != LUA_OK)
        return luaL_error(L, "error loading embedded module '%s' (%s):\n\t%s", module, f->path,
                          lua_tostring(L, -1));
    lua_pushstring(L, f->path);
    return 2;
}

/* Inserts searcher_rnnlua as package.searchers[2], right after the preload searcher. */
void rl_lua_add_searcher(lua_State *L) {
    /* once a state: the host adds it before require "rnnlua", a system Lua's require "rnnlua"
     * (luaopen_rnnlua) after */
    if (lua_getfield(L, LUA_REGISTRYINDEX, "rnnlua.searcher") != LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "rnnlua.searcher");
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchers");
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = n; i >= 2; i--) {
        lua_rawgeti(L, -1, i);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushcfunction(L, searcher_rnnlua);
    lua_rawseti(L, -2, 2);
    lua_pop(L, 2);
}

/* ---- text-only chunks: Lua does not verify bytecode, so a precompiled chunk (crafted or just
 * corrupted) can crash the VM. Recipes and -e are loaded with mode "t"; so are load, loadfile,
 * dofile and require's file searcher, whatever mode a script asks for. */

/* After a failed load (message on top): names `who` and the chunk, and says why. */
static int text_only_error(lua_State *L, const char *who, const char *name) {
    const char *msg = lua_tostring(L, -1);
    if (msg && strstr(msg, "binary chunk"))
        return luaL_error(L,
                          "%s: %s: %s: rnnlua loads Lua source text only, never precompiled "
                          "chunks",
                          who, name, msg);
    return lua_error(L);
}

/* load(chunk [, chunkname [, mode [, env]]]) with mode "t"; a failure returns nil, message as
 * Lua's load does, except that asking for binary chunks only is an error. */
static int text_load(lua_State *L) {
    const char *mode = luaL_optstring(L, 3, "bt");
    if (!strchr(mode, 't'))
        return luaL_error(L,
                          "load: mode \"%s\" refused: rnnlua loads Lua source text only, never "
                          "precompiled chunks",
                          mode);
    int n = lua_gettop(L) < 3 ? 3 : lua_gettop(L); /* env given (even nil) or not is kept */
    lua_settop(L, n);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    int nres = lua_gettop(L);
    if (nres == 2 && lua_isnil(L, 1) && lua_isstring(L, 2) &&
        strstr(lua_tostring(L, 2), "binary chunk")) {
        lua_pushfstring(L, "load: %s: rnnlua loads Lua source text only, never precompiled chunks",
                        lua_tostring(L, 2));
        lua_replace(L, 2);
    }
    return nres;
}

/* loadfile([filename [, mode [, env]]]) with mode "t", returning nil, message on failure. */
static int text_loadfile(lua_State *L) {
    const char *fname = luaL_optstring(L, 1, NULL);
    const char *mode = luaL_optstring(L, 2, "bt");
    if (!strchr(mode, 't'))
        return luaL_error(L, "loadfile: mode \"%s\" refused: rnnlua loads Lua source text only",
                          mode);
    int env = !lua_isnone(L, 3) ? 3 : 0;
    if (luaL_loadfilex(L, fname, "t") != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        luaL_pushfail(L);
        if (msg && strstr(msg, "binary chunk"))
            lua_pushfstring(L,
                            "loadfile: %s: %s: rnnlua loads Lua source text only, never "
                            "precompiled chunks",
                            fname ? fname : "stdin", msg);
        else
            lua_pushvalue(L, -2);
        return 2;
    }
    if (env) { /* the first upvalue of a main chunk is _ENV */
        lua_pushvalue(L, env);
        if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
}

/* dofile([filename]) with mode "t". */
static int text_dofile(lua_State *L) {
    const char *fname = luaL_optstring(L, 1, NULL);
    lua_settop(L, 1);
    if (luaL_loadfilex(L, fname, "t") != LUA_OK)
        return text_only_error(L, "dofile", fname ? fname : "stdin");
    lua_call(L, 0, LUA_MULTRET);
    return lua_gettop(L) - 1;
}

/* require's searcher for Lua files on package.path (the standard one loads bytecode too). */
static int text_searcher_lua(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    lua_getglobal(L, "package");
    if (!lua_istable(L, -1)) return luaL_error(L, "require: 'package' is not a table");
    lua_getfield(L, -1, "searchpath");
    lua_pushstring(L, name);
    lua_getfield(L, -3, "path");
    if (!lua_isstring(L, -1)) return luaL_error(L, "require: 'package.path' must be a string");
    lua_call(L, 2, 2);
    if (lua_isnil(L, -2)) return 1; /* the list of files tried */
    lua_pop(L, 1);
    const char *filename = lua_tostring(L, -1);
    if (luaL_loadfilex(L, filename, "t") != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        return luaL_error(
            L, "error loading module '%s' from file '%s':\n\t%s%s", name, filename, msg,
            msg && strstr(msg, "binary chunk") ? ": rnnlua loads Lua source text only" : "");
    }
    lua_pushstring(L, filename);
    return 2;
}

void rl_lua_text_only(lua_State *L) {
    lua_getglobal(L, "load");
    lua_pushcclosure(L, text_load, 1);
    lua_setglobal(L, "load");
    lua_pushcfunction(L, text_loadfile);
    lua_setglobal(L, "loadfile");
    lua_pushcfunction(L, text_dofile);
    lua_setglobal(L, "dofile");
    /* package.searchers: preload, then the Lua file searcher that this replaces */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchers");
    lua_pushcfunction(L, text_searcher_lua);
    lua_rawseti(L, -2, 2);
    lua_pop(L, 2);
}

void rl_lua_add_preloads(lua_State *L) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_lfs);
    lua_setfield(L, -2, "lfs");
    lua_pushcfunction(L, luaopen_rnnlua);
    lua_setfield(L, -2, "rnnlua");
    lua_pop(L, 1);
}

void rl_lua_add_module_needs(lua_State *L) {
    rl_lua_add_searcher(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    if (lua_getfield(L, -1, "lfs") == LUA_TNIL) {
        lua_pushcfunction(L, luaopen_lfs);
        lua_setfield(L, -3, "lfs");
    }
    lua_pop(L, 2);
}

void rl_lua_open_state(lua_State *L) {
    luaL_openlibs(L);
    rl_lua_text_only(L);
    rl_lua_add_preloads(L);
    rl_lua_add_searcher(L);
}
