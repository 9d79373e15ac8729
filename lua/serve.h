/* `rnnlua serve MODEL.h5 [options]`: an HTTP service for a checkpoint (lua/serve.c). */
#ifndef RL_SERVE_H
#define RL_SERVE_H

#include <lua.h>

/* Runs the server until SIGTERM or SIGINT; argv[0] is "serve". L holds the rnnlua library
 * (the global `rl`). Returns the process exit status: 0 after a drained shutdown, 1 when the
 * model cannot be loaded or the port cannot be opened, 2 on a bad command line. */
int rl_serve_main(lua_State *L, int argc, char **argv);

#endif
