/* The Lua face of the C layer objects (lua/l_layers.c): the Layer userdata that the network
 * builder (lua/rnnlua/network.lua) wires together, and the few C helpers it needs. */
#ifndef RL_L_LAYERS_H
#define RL_L_LAYERS_H

#include <lua.h>

#define RL_LAYER_MT "rnnlua.Layer"

/* Registers the Layer metatable and rl._layer_new, rl._layer_classes, rl._param_init and
 * rl._loss_mse into the module table on top of the stack. */
void rl_lua_open_layers(lua_State *L);
/* Pushes a userdata holding a reference to frozen packed weights (layer:_frozen_packs of another
 * state's network, rl_recurrent_frozen_packs), released by the garbage collector; a layer of
 * this state reads them after layer:_adopt_packs(u). */
void rl_lua_push_packs(lua_State *L, void *packs);
/* The C layer of the Layer userdata at idx, or NULL (another value, a freed or queued layer).
 * The userdata owns it: it lives while the value is referenced. */
struct rl_layer *rl_lua_to_layer(lua_State *L, int idx);

#endif
