/* The Lua face of data augmentation (lua/l_augment.c). */
#ifndef RL_L_AUGMENT_H
#define RL_L_AUGMENT_H

#include <lua.h>

/* rl.augment (config, affine, stroke, speed, add_noise, warp) into the module table on top of
 * the stack. */
void rl_lua_open_augment(lua_State *L);

#endif
