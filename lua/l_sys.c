/* System helpers for the engine's log: rl.isatty(fd) (is stdout a terminal: a live progress
 * line or plain lines) and rl.clock() (seconds of a monotonic wall clock, for frames/s and
 * ETA; os.clock measures CPU time, which counts every BLAS thread). */
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>

#include "l_sys.h"

static int l_isatty(lua_State *L) {
    lua_Integer fd = luaL_optinteger(L, 1, 1);
    if (fd < 0 || fd > 1 << 20) return luaL_argerror(L, 1, "not a file descriptor");
    lua_pushboolean(L, isatty((int)fd) == 1);
    return 1;
}

static int l_clock(lua_State *L) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return luaL_error(L, "rl.clock: clock_gettime failed");
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}

static const luaL_Reg sys_funcs[] = {
    {"isatty", l_isatty},
    {"clock", l_clock},
    {NULL, NULL},
};

void rl_lua_open_sys(lua_State *L) { luaL_setfuncs(L, sys_funcs, 0); }
