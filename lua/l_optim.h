/* The Lua face of the optimizers (lua/l_optim.c): the Optimizer userdata used by
 * lua/rnnlua/optim.lua, and the max-norm and gradient-norm helpers. */
#ifndef RL_L_OPTIM_H
#define RL_L_OPTIM_H

#include <lua.h>

/* Registers the Optimizer metatable and rl._optimizer_new, rl._optim_max_norm and
 * rl._optim_grad_norm into the module table on top of the stack. */
void rl_lua_open_optim(lua_State *L);

#endif
