/* The common part of the libFuzzer targets (fuzz/fuzz_*.c, `make fuzz`): one Lua state with the
 * rnnlua module as the global `rl`, made once, and a Lua function that each target runs on
 * every input under pcall. A Lua error is the expected answer to a bad input; what libFuzzer
 * reports is a crash, a sanitizer finding, a timeout (a hang) or an abort from the target's own
 * assertions. A target defines FUZZ_LUA (the Lua function, as source) and FUZZ_AS_FILE (1: the
 * input is written to a file whose path the function receives; 0: it receives the bytes). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lua/embedded.h"
#include "../lua/l_tensor.h"

int luaopen_lfs(lua_State *L);
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lua_State *fuzz_L;
static int fuzz_fn = LUA_NOREF;
static char fuzz_path[64];

/* package.preload entries for the embedded modules rnnlua.* (the host binary has a searcher
 * for them, lua/rnnlua.c). */
static int load_embedded(lua_State *L) {
    const char *module = luaL_checkstring(L, 1);
    size_t len;
    const char *src = rl_embedded_find(module, &len);
    if (!src || luaL_loadbufferx(L, src, len, module, "t") != LUA_OK)
        return luaL_error(L, "fuzz: cannot load the embedded module %s", module);
    lua_pushstring(L, module);
    lua_call(L, 1, 1);
    return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* core/h5io's probe child must give up on a hang before libFuzzer's -timeout (10 s) */
    setenv("RNNLUA_H5_CHILD_SECONDS", "5", 1);
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    size_t n;
    const rl_embedded_file *files = rl_embedded_list(&n);
    for (size_t i = 0; i < n; i++) {
        lua_pushcfunction(L, load_embedded);
        lua_setfield(L, -2, files[i].module);
    }
    lua_pushcfunction(L, luaopen_lfs);
    lua_setfield(L, -2, "lfs");
    lua_pushcfunction(L, luaopen_rnnlua);
    lua_setfield(L, -2, "rnnlua");
    lua_pop(L, 1);
    if (luaL_dostring(L, "rl = require('rnnlua')") != LUA_OK ||
        luaL_loadstring(L, "return " FUZZ_LUA) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
        fprintf(stderr, "fuzz: setup failed: %s\n", lua_tostring(L, -1));
        abort();
    }
    fuzz_fn = luaL_ref(L, LUA_REGISTRYINDEX);
    snprintf(fuzz_path, sizeof fuzz_path, "/tmp/rnnlua-fuzz-%ld.h5", (long)getpid());
    fuzz_L = L;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fuzz_L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, fuzz_fn);
    if (FUZZ_AS_FILE) {
        FILE *f = fopen(fuzz_path, "wb");
        if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
        lua_pushstring(L, fuzz_path);
    } else {
        lua_pushlstring(L, (const char *)data, size);
    }
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        /* a Lua error is fine unless the target marks it as a broken invariant */
        const char *msg = lua_tostring(L, -1);
        if (msg && strstr(msg, "FUZZ INVARIANT")) {
            fprintf(stderr, "%s\n", msg);
            abort();
        }
        lua_pop(L, 1);
    }
    lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
