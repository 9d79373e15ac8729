/* The tensor userdata shared by every Lua binding file.
 *
 * A tensor userdata holds an rl_tensor inline under the metatable "rnnlua.Tensor". A new
 * userdata is pushed holding an unset tensor before anything that can fail, so a C error
 * after it leaves nothing to leak: __gc releases whatever it came to hold. */
#ifndef RL_L_TENSOR_H
#define RL_L_TENSOR_H

#include <lauxlib.h>
#include <lua.h>

#include "../core/tensor.h"

#define RL_TENSOR_MT "rnnlua.Tensor"

/* Runs a full garbage collection when the bytes of all live tensor storages passed this
 * state's limit (see l_tensor.c); every function that makes a tensor or a layer calls it. */
void rl_lua_collect_if_needed(lua_State *L);
/* Pushes a new tensor userdata holding an unset tensor; returns its rl_tensor to fill. */
rl_tensor *rl_lua_push_tensor(lua_State *L);
/* The tensor at idx, or a Lua argument error ("tensor expected, got X"); both raise for a
 * tensor that was freed (by <close>, a closed coroutine or __gc before a resurrection). Both
 * touch its storage (rl_storage_touch): the caller may write it. */
rl_tensor *rl_lua_check_tensor(lua_State *L, int idx);
/* The tensor at idx, or NULL when it is not a tensor userdata. */
rl_tensor *rl_lua_to_tensor(lua_State *L, int idx);
/* rl_lua_check_tensor for a caller that only reads the data: the storage's version stays. */
const rl_tensor *rl_lua_check_tensor_read(lua_State *L, int idx);
/* Raises the library's last error (rl_errmsg) as a Lua error prefixed by `fname`. Every C
 * temporary must already be released or owned by a userdata on the stack. */
int rl_lua_raise(lua_State *L, const char *fname);
/* luaL_checkinteger for a dim: 1-based Lua positions (negative from the end) to 0-based. */
int rl_lua_check_dim(lua_State *L, int arg, const rl_tensor *t, const char *fname);

/* Registers the Tensor metatable and the tensor functions into the module table on top. */
void rl_lua_open_tensor(lua_State *L);
/* rl.save / rl.load (lua/l_h5.c) */
void rl_lua_open_h5(lua_State *L);

/* The rnnlua module: pushes the module table (the global `rl` in the host). */
int luaopen_rnnlua(lua_State *L);

#endif
