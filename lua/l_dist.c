/* rl.dist: the processes of a data-parallel run (core/dist.h).
 *
 *   rl.dist.rank(), rl.dist.size(), rl.dist.local_rank()   0, 1, 0 outside an MPI launch
 *   rl.dist.allreduce(t)        in-place sum over the ranks of a contiguous tensor; returns t
 *   rl.dist.broadcast(t, root)  root's contents into every rank's t (root default 0); returns t
 *   rl.dist.barrier()
 *   rl.dist.built()             the binary was built with MPI
 *   rl.dist.active()            this process was started by an MPI launcher and joined its world
 *   rl.dist.set_timeout(s), rl.dist.timeout()   the deadline of every collective (seconds)
 *   rl.dist.broken()            a collective failed; the world cannot be used any more
 *   rl.dist.set_broken()        this rank left the common sequence of collectives (an error
 *                               of its own): its later collectives fail at once
 * Every rank must call the collectives in the same order with tensors of the same size and
 * dtype. A failure (an MPI error, a rank that died or hangs past the deadline) raises an error
 * that names the operation and this rank. */
#include <lauxlib.h>
#include <math.h>

#include "../core/dist.h"
#include "l_dist.h"
#include "l_tensor.h"

static int l_rank(lua_State *L) {
    lua_pushinteger(L, rl_dist_rank());
    return 1;
}

static int l_size(lua_State *L) {
    lua_pushinteger(L, rl_dist_size());
    return 1;
}

static int l_local_rank(lua_State *L) {
    lua_pushinteger(L, rl_dist_local_rank());
    return 1;
}

static int l_built(lua_State *L) {
    lua_pushboolean(L, rl_dist_built());
    return 1;
}

static int l_active(lua_State *L) {
    lua_pushboolean(L, rl_dist_active());
    return 1;
}

static int l_broken(lua_State *L) {
    lua_pushboolean(L, rl_dist_broken());
    return 1;
}

static int l_set_broken(lua_State *L) {
    rl_dist_set_broken();
    return 0;
}

static int l_allreduce(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (rl_dist_allreduce(t) != RL_OK) return rl_lua_raise(L, "rl.dist.allreduce");
    lua_settop(L, 1);
    return 1;
}

static int l_broadcast(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    lua_Integer root = luaL_optinteger(L, 2, 0);
    if (root < 0 || root >= rl_dist_size())
        return luaL_error(L, "rl.dist.broadcast: root %I is not a rank of 0..%d", root,
                          rl_dist_size() - 1);
    if (rl_dist_broadcast(t, (int)root) != RL_OK) return rl_lua_raise(L, "rl.dist.broadcast");
    lua_settop(L, 1);
    return 1;
}

static int l_barrier(lua_State *L) {
    if (rl_dist_barrier() != RL_OK) return rl_lua_raise(L, "rl.dist.barrier");
    return 0;
}

static int l_set_timeout(lua_State *L) {
    lua_Number s = luaL_checknumber(L, 1);
    /* an infinite deadline would let a lost rank hang the job for ever */
    if (!(s > 0) || s == HUGE_VAL)
        return luaL_argerror(L, 1, "the timeout must be a finite number of seconds > 0");
    rl_dist_set_timeout((double)s);
    return 0;
}

static int l_timeout(lua_State *L) {
    lua_pushnumber(L, rl_dist_get_timeout());
    return 1;
}

static const luaL_Reg dist_funcs[] = {
    {"rank", l_rank},
    {"size", l_size},
    {"local_rank", l_local_rank},
    {"built", l_built},
    {"active", l_active},
    {"broken", l_broken},
    {"set_broken", l_set_broken},
    {"allreduce", l_allreduce},
    {"broadcast", l_broadcast},
    {"barrier", l_barrier},
    {"set_timeout", l_set_timeout},
    {"timeout", l_timeout},
    {NULL, NULL},
};

void rl_lua_open_dist(lua_State *L) {
    lua_newtable(L);
    luaL_setfuncs(L, dist_funcs, 0);
    lua_setfield(L, -2, "dist");
}
