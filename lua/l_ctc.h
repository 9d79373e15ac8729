/* The Lua face of CTC (lua/l_ctc.c). */
#ifndef RL_L_CTC_H
#define RL_L_CTC_H

#include <lua.h>

/* rl.ctc_loss and rl.edit_distance into the module table on top of the stack. */
void rl_lua_open_ctc(lua_State *L);

#endif
