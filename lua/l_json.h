/* rl.json_decode: JSON text to Lua values, read by jansson (lua/l_json.c). */
#ifndef RL_L_JSON_H
#define RL_L_JSON_H

#include <lua.h>

/* rl.json_decode and rl.json_null into the module table on top of the stack. */
void rl_lua_open_json(lua_State *L);

#endif
