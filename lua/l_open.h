/* Setting up a Lua state for the rnnlua library (lua/l_open.c). */
#ifndef RL_L_OPEN_H
#define RL_L_OPEN_H

#include <lua.h>

/* Names a source tree whose Lua files (lua/rnnlua/X.lua, layers/X.lua) replace the embedded
 * library. */
#define RL_LUA_DIR_ENV "RNNLUA_LUA_DIR"

/* Inserts the searcher of the modules rnnlua.* (embedded, or from $RNNLUA_LUA_DIR) as
 * package.searchers[2], right after the preload searcher. */
void rl_lua_add_searcher(lua_State *L);
/* load, loadfile, dofile and require's file searcher accept Lua source text only: Lua does not
 * verify bytecode, so a precompiled chunk can crash the VM. */
void rl_lua_text_only(lua_State *L);
/* package.preload.lfs and package.preload.rnnlua. */
void rl_lua_add_preloads(lua_State *L);
/* What luaopen_rnnlua needs in a state that another program made (a system Lua's
 * require "rnnlua"): the searcher, and package.preload.lfs unless lfs is there already. */
void rl_lua_add_module_needs(lua_State *L);
/* The standard libraries and the three above: a state where require "rnnlua" works. Raises
 * (out of memory) like any Lua API call: call it in protected mode. */
void rl_lua_open_state(lua_State *L);

/* A network's bf16 context (rl._bf16_ctx) shared between the Lua states of the C API
 * (lua/capi.c): the context of the userdata at idx, or NULL when it is none; pushing one onto
 * another state holds a reference, released by that state's garbage collector. */
struct rl_bf16_ctx;
struct rl_bf16_ctx *rl_lua_test_bf16_ctx(lua_State *L, int idx);
void rl_lua_push_bf16_ctx(lua_State *L, struct rl_bf16_ctx *ctx);

#endif
