/* The rnnlua module: the C functions of every binding file, then the embedded Lua library
 * (lua/rnnlua/init.lua), which receives the module table and completes it. */
#include <lauxlib.h>
#include <lua.h>
#include <stdbool.h>
#include <string.h>

#include "../core/blas.h"
#include "../kernels/cpu/cpu_level.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_int8.h"
#include "../kernels/cuda/context.h"
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

/* rl.blas_core() -> the BLAS kernels in use (OpenBLAS's core name), the ones the library chose
 * for itself (core/blas.c replaces those below the CPU's level) */
static int l_blas_core(lua_State *L) {
    const char *found;
    lua_pushstring(L, rl_blas_core(&found));
    lua_pushstring(L, found);
    return 2;
}

/* A network's bf16 context (kernels/cpu/gemm_bf16.h), for the network module, not for users:
 *   rl._bf16_ctx([kind]) -> a context (freed with it by the garbage collector); kind "bf16"
 *       (default) or "int8" (rl_bf16_ctx_set_int8: int8 weights, for inference);
 *   rl._bf16_enter(ctx | nil, params) -> prev: makes ctx (nil: none, float32 products) the
 *       active context of this thread and returns the one it replaces, for _bf16_leave;
 *       params is the network's flat parameter buffer (a contiguous float32 CPU tensor),
 *       whose operands ctx keeps packed while the buffer's storage version stays (every
 *       write from Lua changes it; taking it here does not);
 *   rl._bf16_on(ctx | nil): the active context from now on (per layer);
 *   rl._bf16_leave(prev): restores the context _bf16_enter replaced;
 *   rl._bf16_bytes(ctx) -> bytes of kept packs;
 *   rl._bf16_packs(ctx) -> weight operands packed so far (kept or per product).;
 *   rl._bf16_is_int8(ctx) -> whether it is an int8 context;
 *   rl._bf16_freeze(ctx): its weights never change (rl_bf16_ctx_freeze; the C API's models). */
#define BF16_CTX_MT "rnnlua.bf16_ctx"

static int l_bf16_ctx_gc(lua_State *L) {
    rl_bf16_ctx **u = luaL_checkudata(L, 1, BF16_CTX_MT);
    rl_bf16_ctx_free(*u);
    *u = NULL;
    return 0;
}

static rl_bf16_ctx **push_bf16_ud(lua_State *L) {
    rl_bf16_ctx **u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = NULL;
    if (luaL_newmetatable(L, BF16_CTX_MT)) {
        lua_pushcfunction(L, l_bf16_ctx_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    return u;
}

static int l_bf16_ctx(lua_State *L) {
    const char *kind = luaL_optstring(L, 1, "bf16");
    bool int8 = strcmp(kind, "int8") == 0;
    if (!int8 && strcmp(kind, "bf16") != 0)
        return luaL_argerror(L, 1, "\"bf16\" or \"int8\" expected");
    rl_bf16_ctx **u = push_bf16_ud(L);
    *u = rl_bf16_ctx_new();
    if (!*u) return luaL_error(L, "rnnlua: precision %s: out of memory for its context", kind);
    if (int8) rl_bf16_ctx_set_int8(*u);
    return 1;
}

rl_bf16_ctx *rl_lua_test_bf16_ctx(lua_State *L, int idx) {
    rl_bf16_ctx **u = luaL_testudata(L, idx, BF16_CTX_MT);
    return u ? *u : NULL;
}

void rl_lua_push_bf16_ctx(lua_State *L, rl_bf16_ctx *ctx) {
    rl_bf16_ctx **u = push_bf16_ud(L);
    rl_bf16_ctx_hold(ctx);
    *u = ctx;
}

static int l_bf16_freeze(lua_State *L) {
    rl_bf16_ctx *ctx = *(rl_bf16_ctx **)luaL_checkudata(L, 1, BF16_CTX_MT);
    if (ctx) rl_bf16_ctx_freeze(ctx);
    return 0;
}

static rl_bf16_ctx *opt_bf16_ctx(lua_State *L, int i) {
    if (lua_isnoneornil(L, i)) return NULL;
    return *(rl_bf16_ctx **)luaL_checkudata(L, i, BF16_CTX_MT);
}

static int l_bf16_enter(lua_State *L) {
    rl_bf16_ctx *ctx = opt_bf16_ctx(L, 1);
    if (ctx) {
        /* read only: taking it must not make its packs stale */
        const rl_tensor *p = rl_lua_check_tensor_read(L, 2);
        if (p->dtype != RL_FLOAT32 || rl_tensor_device(p).type != RL_CPU ||
            !rl_tensor_is_contiguous(p))
            return luaL_argerror(L, 2, "a contiguous float32 CPU tensor expected");
        rl_bf16_ctx_begin(ctx, rl_tensor_data(p), (size_t)rl_tensor_numel(p) * sizeof(float),
                          rl_storage_version(p->storage));
    }
    rl_bf16_ctx *prev = rl_bf16_active();
    /* the layers turn it on one by one (_bf16_on) */
    rl_bf16_activate(NULL);
    if (prev)
        lua_pushlightuserdata(L, prev);
    else
        lua_pushnil(L);
    return 1;
}

static int l_bf16_on(lua_State *L) {
    rl_bf16_activate(opt_bf16_ctx(L, 1));
    return 0;
}

static int l_bf16_leave(lua_State *L) {
    rl_bf16_activate(lua_islightuserdata(L, 1) ? lua_touserdata(L, 1) : NULL);
    return 0;
}

static int l_bf16_is_int8(lua_State *L) {
    rl_bf16_ctx *ctx = *(rl_bf16_ctx **)luaL_checkudata(L, 1, BF16_CTX_MT);
    lua_pushboolean(L, ctx && rl_bf16_ctx_is_int8(ctx));
    return 1;
}

static int l_bf16_packs(lua_State *L) {
    lua_pushinteger(
        L, (lua_Integer)rl_bf16_ctx_packs(*(rl_bf16_ctx **)luaL_checkudata(L, 1, BF16_CTX_MT)));
    return 1;
}

static int l_bf16_bytes(lua_State *L) {
    lua_pushinteger(
        L, (lua_Integer)rl_bf16_ctx_bytes(*(rl_bf16_ctx **)luaL_checkudata(L, 1, BF16_CTX_MT)));
    return 1;
}

#ifdef RL_WITH_CUDA
/* A network's half-precision context on a CUDA device (kernels/cuda/context.h), for the network
 * module, as the bf16 one above:
 *   rl._cuda_half_ctx("bf16" | "fp16") -> a context (freed with it by the garbage collector);
 *   rl._cuda_half_enter(ctx | nil, params) -> prev: rounds params (the network's flat parameter
 *       buffer, a contiguous float32 CUDA tensor) into ctx's copy when its storage version
 *       changed, makes no context active (the layers turn it on) and returns the one replaced;
 *   rl._cuda_half_on(ctx | nil), rl._cuda_half_leave(prev): as _bf16_on and _bf16_leave;
 *   rl._cuda_half_conversions(ctx) -> how many times the weights were rounded. */
#define HALF_CTX_MT "rnnlua.cuda_half_ctx"

static int l_half_ctx_gc(lua_State *L) {
    rl_cuda_half_ctx **u = luaL_checkudata(L, 1, HALF_CTX_MT);
    rl_cuda_half_ctx_free(*u);
    *u = NULL;
    return 0;
}

static int l_half_ctx(lua_State *L) {
    static const char *const names[] = {"bf16", "fp16", NULL};
    int i = luaL_checkoption(L, 1, NULL, names);
    rl_cuda_half_ctx **u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = NULL;
    if (luaL_newmetatable(L, HALF_CTX_MT)) {
        lua_pushcfunction(L, l_half_ctx_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    *u = rl_cuda_half_ctx_new(i == 0 ? RL_CUDA_BF16 : RL_CUDA_FP16);
    if (!*u) return luaL_error(L, "rnnlua: precision %s: out of memory for its context", names[i]);
    return 1;
}

static rl_cuda_half_ctx *opt_half_ctx(lua_State *L, int i) {
    if (lua_isnoneornil(L, i)) return NULL;
    return *(rl_cuda_half_ctx **)luaL_checkudata(L, i, HALF_CTX_MT);
}

static int l_half_enter(lua_State *L) {
    rl_cuda_half_ctx *ctx = opt_half_ctx(L, 1);
    if (ctx) {
        const rl_tensor *p = rl_lua_check_tensor_read(L, 2);
        if (p->dtype != RL_FLOAT32 || rl_tensor_device(p).type != RL_CUDA ||
            !rl_tensor_is_contiguous(p))
            return luaL_argerror(L, 2, "a contiguous float32 CUDA tensor expected");
        if (rl_cuda_half_ctx_begin(ctx, rl_tensor_data(p), rl_tensor_numel(p),
                                   rl_storage_version(p->storage)) != RL_OK)
            return luaL_error(L, "rnnlua: precision %s: %s",
                              rl_cuda_half_ctx_format(ctx) == RL_CUDA_BF16 ? "bf16" : "fp16",
                              rl_errmsg());
    }
    rl_cuda_half_ctx *prev = rl_cuda_half_active();
    rl_cuda_half_activate(NULL);
    if (prev)
        lua_pushlightuserdata(L, prev);
    else
        lua_pushnil(L);
    return 1;
}

static int l_half_on(lua_State *L) {
    rl_cuda_half_activate(opt_half_ctx(L, 1));
    return 0;
}

static int l_half_leave(lua_State *L) {
    rl_cuda_half_activate(lua_islightuserdata(L, 1) ? lua_touserdata(L, 1) : NULL);
    return 0;
}

static int l_half_conversions(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)rl_cuda_half_ctx_conversions(
                           *(rl_cuda_half_ctx **)luaL_checkudata(L, 1, HALF_CTX_MT)));
    return 1;
}
#endif

static const luaL_Reg module_funcs[] = {
#ifdef RL_WITH_CUDA
    {"_cuda_half_ctx", l_half_ctx},
    {"_cuda_half_enter", l_half_enter},
    {"_cuda_half_on", l_half_on},
    {"_cuda_half_leave", l_half_leave},
    {"_cuda_half_conversions", l_half_conversions},
#endif
    {"_bf16_bytes", l_bf16_bytes},
    {"_bf16_packs", l_bf16_packs},
    {"_bf16_ctx", l_bf16_ctx},
    {"_bf16_enter", l_bf16_enter},
    {"_bf16_freeze", l_bf16_freeze},
    {"_bf16_is_int8", l_bf16_is_int8},
    {"_bf16_leave", l_bf16_leave},
    {"_bf16_on", l_bf16_on},
    {"cpu_level", l_cpu_level},
    {"blas_core", l_blas_core},
    {"cuda_built", l_cuda_built},
    {"set_num_threads", l_set_num_threads},
    {"get_num_threads", l_get_num_threads},
    {NULL, NULL},
};

int luaopen_rnnlua(lua_State *L) {
    rl_lua_add_module_needs(L);
    rl_ops_init();
    if (rl_cpu_level_check_env() != RL_OK || rl_bf16_level_check_env() != RL_OK ||
        rl_int8_level_check_env() != RL_OK)
        return luaL_error(L, "%s", rl_errmsg()); /* the host adds "rnnlua: " */
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
