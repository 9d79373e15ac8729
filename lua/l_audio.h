/* The Lua face of audio reading and speech features (lua/l_audio.c). */
#ifndef RL_L_AUDIO_H
#define RL_L_AUDIO_H

#include <lua.h>

/* rl.audio (load, features) into the module table on top of the stack. */
void rl_lua_open_audio(lua_State *L);

#endif
