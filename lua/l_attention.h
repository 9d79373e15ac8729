/* The Lua face of the attention step kernels (lua/l_attention.c). */
#ifndef RL_L_ATTENTION_H
#define RL_L_ATTENTION_H

#include <lua.h>

/* rl.attention_forward and rl.attention_backward into the module table on top of the stack. */
void rl_lua_open_attention(lua_State *L);

#endif
