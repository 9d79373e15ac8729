/* rl.dist: the Lua face of core/dist.h (lua/l_dist.c). */
#ifndef RL_L_DIST_H
#define RL_L_DIST_H

#include <lua.h>

/* Sets the module table's field `dist` (the table on top of the stack). */
void rl_lua_open_dist(lua_State *L);

#endif
