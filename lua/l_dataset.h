/* rl.h5file and rl.dataset_scan (lua/l_dataset.c): the C half of the datasets library. */
#ifndef RL_L_DATASET_H
#define RL_L_DATASET_H

#include <lua.h>

/* Registers the H5File metatable and the functions into the module table on top. */
void rl_lua_open_dataset(lua_State *L);

#endif
