/* rl.h5file and rl.dataset_scan (lua/l_dataset.c): the C half of the datasets library. */
#ifndef RL_L_DATASET_H
#define RL_L_DATASET_H

#include <lua.h>

/* The string argument at idx, refused (a Lua error naming `who`) when it holds a NUL byte: a
 * path, an HDF5 name or string value ends at the first NUL in C, so "a\0b" would silently be
 * "a" (another file, another tag). */
const char *rl_lua_check_cstring(lua_State *L, int idx, const char *who);
/* The same for the string at idx (any stack slot; NULL when it is no string or number), named
 * `what` in the error. */
const char *rl_lua_nul_free(lua_State *L, int idx, const char *who, const char *what);

/* Registers the H5File metatable and the functions into the module table on top. */
void rl_lua_open_dataset(lua_State *L);

#endif
