/* The rnnlua module: the C functions of every binding file, then the embedded Lua library
 * (lua/rnnlua/init.lua), which receives the module table and completes it. */
#include <lauxlib.h>
#include <lua.h>

#include "../core/blas.h"
#include "../kernels/cpu/cpu_level.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/ops.h"
#include "embedded.h"
#include "l_attention.h"
#include "l_audio.h"
#include "l_augment.h"
#include "l_ctc.h"
#include "l_dataset.h"
#include "l_dist.h"
#include "l_json.h"
#include "l_layers.h"
#include "l_open.h"
#include "l_optim.h"
#include "l_sys.h"
#include "l_tensor.h"
#include "version.h"

static int l_cuda_built(lua_State *L) {
#ifdef RL_WITH_CUDA
    lua_pushboolean(L, 1);
#else
    lua_pushboolean(L, 0);
#endif
    return 1;
}

static int l_set_num_threads(lua_State *L) {
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < 1 || n > 1024)
        return luaL_error(L, "set_num_threads: %d threads is out of range 1..1024", (int)n);
    rl_blas_set_threads((int)n);
    return 0;
}

static int l_get_num_threads(lua_State *L) {
    lua_pushinteger(L, rl_blas_get_threads());
    return 1;
}

/* rl.cpu_level([name]) -> the level in use, the best this CPU supports; with a name
 * ("generic", "avx2", "avx512"; "neon" on AArch64) it first switches to that level. */
static int l_cpu_level(lua_State *L) {
    if (!lua_isnoneornil(L, 1)) {
        rl_cpu_level level;
        if (rl_cpu_level_from_name(luaL_checkstring(L, 1), &level) != RL_OK)
            return luaL_argerror(L, 1, rl_errmsg());
        if (rl_cpu_level_set(level) != RL_OK) return luaL_error(L, "cpu_level: %s", rl_errmsg());
    }
    lua_pushstring(L, rl_cpu_level_name(rl_cpu_level_get()));
    lua_pushstring(L, rl_cpu_level_name(rl_cpu_level_supported()));
    return 2;
}

/* rl._bf16_begin(params, fresh), rl._bf16_mode(on), rl._bf16_end(): the bf16 mode of the
 * float32 CPU products (kernels/cpu/gemm_bf16.h) around a network's forward or backward;
 * params is its flat parameter buffer (a contiguous float32 CPU tensor), whose operands are
 * packed once per fresh begin. For the network module, not for users. */
static int l_bf16_begin(lua_State *L) {
    const rl_tensor *p = rl_lua_check_tensor(L, 1);
    bool fresh = lua_toboolean(L, 2);
    if (p->dtype != RL_FLOAT32 || rl_tensor_device(p).type != RL_CPU || !rl_tensor_is_contiguous(p))
        return luaL_argerror(L, 1, "a contiguous float32 CPU tensor expected");
    rl_bf16_mode_begin(rl_tensor_data(p), (size_t)rl_tensor_numel(p) * sizeof(float), fresh);
    return 0;
}

static int l_bf16_mode(lua_State *L) {
    rl_bf16_mode_set(lua_toboolean(L, 1));
    return 0;
}

static int l_bf16_end(lua_State *L) {
    rl_bf16_mode_end();
    return 0;
}

static const luaL_Reg module_funcs[] = {
    {"_bf16_begin", l_bf16_begin},
    {"_bf16_mode", l_bf16_mode},
    {"_bf16_end", l_bf16_end},
    {"cpu_level", l_cpu_level},
    {"cuda_built", l_cuda_built},
    {"set_num_threads", l_set_num_threads},
    {"get_num_threads", l_get_num_threads},
    {NULL, NULL},
};

int luaopen_rnnlua(lua_State *L) {
    rl_lua_add_module_needs(L);
    rl_ops_init();
    if (rl_cpu_level_check_env() != RL_OK || rl_bf16_level_check_env() != RL_OK)
        return luaL_error(L, "rnnlua: %s", rl_errmsg());
    lua_newtable(L);
    luaL_setfuncs(L, module_funcs, 0);
    lua_pushstring(L, RL_VERSION);
    lua_setfield(L, -2, "version");
    rl_lua_open_tensor(L);
    rl_lua_open_h5(L);
    rl_lua_open_layers(L);
    rl_lua_open_optim(L);
    rl_lua_open_dataset(L);
    rl_lua_open_sys(L);
    rl_lua_open_json(L);
    rl_lua_open_ctc(L);
    rl_lua_open_dist(L);
    rl_lua_open_audio(L);
    rl_lua_open_augment(L);
    rl_lua_open_attention(L);

    size_t len;
    const char *src = rl_embedded_find("rnnlua.init", &len);
    if (!src) return luaL_error(L, "rnnlua: the embedded Lua library lacks rnnlua.init");
    if (luaL_loadbuffer(L, src, len, "@lua/rnnlua/init.lua") != LUA_OK) return lua_error(L);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
    return 1;
}
