/* System helpers of the engine's log (lua/l_sys.c). */
#ifndef RL_L_SYS_H
#define RL_L_SYS_H

#include <lua.h>

/* rl.isatty(fd), rl.clock(), into the module table on top of the stack. */
void rl_lua_open_sys(lua_State *L);

#endif
