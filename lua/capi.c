/* The C inference API (include/rnnlua.h) over the library's own Lua layer.
 *
 * Networks are described, built and loaded from checkpoints by rnnlua's Lua code
 * (rnnlua.network, rnnlua.checkpoint, rnnlua.forward), so a handle holds a Lua state of its own
 * with the library loaded and the model of lua/rnnlua/capi.lua in it; nothing of Lua shows in
 * the header. A model's state is used under its mutex (rl_model_forward); a session has a state
 * of its own, so sessions run in parallel. A model's state reads the checkpoint through libhdf5,
 * which is not thread-safe, so model loads take one process-wide lock. A session's state reads
 * no file: it shares its model's parameter tensors (the storage refcount is atomic), taken under
 * the model's lock, and builds its network with no lock held, so sessions open in parallel.
 *
 * Pushes (rl_session_push, rl_session_push_many) of a model whose network is a stack of C layers
 * run in C: the session's layers (or the runner's) called as net:forward calls them, with no
 * Lua call and no allocation a push (push_node, below); other models' pushes run the Lua
 * network's forward, as every rl_session_forward and rl_model_forward does.
 *
 * The model is reference-counted: the caller's reference and one per session. rl_model_free
 * drops the caller's and marks the model freed, after which its sessions refuse to run; the
 * memory goes with the last reference. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "../core/blas.h"
#include "../core/error.h"
#include "../include/rnnlua.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/ctc.h"
#include "../layers/layer.h"
#include "l_layers.h"
#include "l_open.h"
#include "l_tensor.h"
#include "version.h"

/* A Lua state holding one loaded model, and the buffers its outputs are copied into. */
typedef struct engine {
    lua_State *L;
    int ref; /* the capi Model in the registry */
    float *y;
    size_t y_cap; /* floats */
    int32_t *len;
    size_t len_cap;
} engine;

/* Batch sizes whose runner plans a model keeps (runner_slot) */
#define RUNNER_PLANS 17

struct rl_model {
    pthread_mutex_t mu; /* the engine's state and buffers */
    atomic_int refs;
    atomic_int freed;
    engine e;
    rl_info info;  /* strings malloc'ed */
    int32_t blank; /* a CTC layer's blank class, else -1 */
    int64_t n_labels;
    char **labels; /* the target's labels the checkpoint stores (n_labels), malloc'ed */
    char *path, *layer, *device, *lua_file;
    char precision[8]; /* of the sessions opened now (rl_model_set_precision) */
    /* its sessions' pushes run in C (c_push, below) when push_lua is NULL; else why they go
     * through the Lua network (malloc'ed) */
    char *push_lua;
    /* rl_session_push_many's network: one batch at a time (run_mu), at runner_precision */
    pthread_mutex_t run_mu;
    engine runner;
    char runner_precision[8];
    /* the runner's pushes in C (push_lua NULL), malloc'ed: a plan for each batch size
     * (runner_slot), so that a server whose batches change size from one to the next takes
     * each plan (a Lua call and the batch's state buffers: about 0.25 ms) once */
    struct c_push *runner_cp[RUNNER_PLANS];
};

/* A push run in C: the session's own network, its C layers called in the order net:forward
 * calls them (lua/rnnlua/capi.lua: Model:c_push_unfit, Model:c_push_plan), with the tensors
 * net:forward would hand them, so that a push gives the Lua path's numbers bit for bit and
 * neither calls Lua nor allocates (the layers' buffers, the chunk's and the output's are kept
 * from push to push; a chunk longer than any before grows them). */
typedef struct push_node {
    rl_layer *l; /* owned by the session's Lua state (the plan keeps it referenced) */
    int n_in;
    int src[RL_LAYER_MAX_INPUTS];          /* -1: the chunk, else the node whose output it reads */
    bool bf16;                             /* its products in bf16 (precision "bf16") */
    int n_states;                          /* a carried layer's: its states, in state[] */
    rl_tensor *state[RL_LAYER_MAX_STATES]; /* the stream's (1, dim) own buffers (Lua's) */
    /* their data and widths, taken with the plan: a batch of 64 streams reads them for every
     * stream, and a pointer chase through each session's tensors misses the cache */
    float *sdata[RL_LAYER_MAX_STATES];
    int64_t sdim[RL_LAYER_MAX_STATES];
} push_node;

typedef struct c_push {
    int ref; /* the plan in the session's registry; LUA_NOREF: none taken since the last forward */
    int n, cap, out;
    push_node *nodes;
    rl_bf16_ctx *bf16; /* the network's context in bf16, else NULL */
    const rl_tensor *params;
    rl_tensor x, len; /* the chunk and its length, owned */
    /* the checkpoint's data_norm, (x - mean) * inv a feature (the plan's tensors), or NULL */
    const float *norm_mean, *norm_inv;
    int64_t norm_n;
    int64_t rows; /* the runner's: the rows of its batches; a session's: 0 */
} c_push;

struct rl_session {
    rl_model *model;
    engine e;
    int started;       /* a push went through since the last reset */
    char precision[8]; /* the model's when the session was opened */
    c_push cp;         /* when the model's pushes run in C */
};

/* State q of node k of s's plan (its plan taken). */
static float *session_state(const rl_session *s, int k, int q) { return s->cp.nodes[k].sdata[q]; }

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

const char *rl_version(void) { return RL_VERSION; }

/* ---- engines ------------------------------------------------------------------------------ */

typedef struct {
    engine *e;
    const char *path, *layer, *device, *lua_file, *who;
    rl_info *info;   /* NULL: not wanted */
    rl_model *model; /* with info: its blank and labels filled */
    int snap_ref;    /* a session's: its copy of the model's snapshot in its registry; else
                        LUA_NOREF */
} load_args;

/* Pushes onto `to` a copy of the value at idx of `from`: nil, booleans, numbers, strings,
 * tables of them and CPU tensors, which are shared (a new view of the same storage, whose
 * refcount is atomic): the session's network only reads them; light userdata are the model's
 * frozen packed weights and a userdata the model's frozen bf16 context, shared the same way
 * (their refcounts are atomic too). Reads `from` with raw operations
 * only, so only `to` can raise. */
static void copy_value(lua_State *from, int idx, lua_State *to, int depth) {
    idx = lua_absindex(from, idx);
    luaL_checkstack(to, 4, "copying the model");
    switch (lua_type(from, idx)) {
    case LUA_TBOOLEAN: lua_pushboolean(to, lua_toboolean(from, idx)); return;
    case LUA_TNUMBER:
        if (lua_isinteger(from, idx))
            lua_pushinteger(to, lua_tointeger(from, idx));
        else
            lua_pushnumber(to, lua_tonumber(from, idx));
        return;
    case LUA_TSTRING: {
        size_t n;
        const char *str = lua_tolstring(from, idx, &n);
        lua_pushlstring(to, str, n);
        return;
    }
    case LUA_TTABLE:
        if (depth > 64) luaL_error(to, "copying the model: tables nested too deep");
        if (!lua_checkstack(from, 3)) luaL_error(to, "copying the model: no stack");
        lua_newtable(to);
        lua_pushnil(from);
        while (lua_next(from, idx) != 0) {
            copy_value(from, -2, to, depth + 1);
            copy_value(from, -1, to, depth + 1);
            lua_rawset(to, -3);
            lua_pop(from, 1);
        }
        return;
    case LUA_TUSERDATA: {
        const rl_tensor *src = rl_lua_to_tensor(from, idx);
        if (src && src->storage && src->storage->device.type == RL_CPU) {
            rl_tensor_share(rl_lua_push_tensor(to), src);
            return;
        }
        struct rl_bf16_ctx *ctx = src ? NULL : rl_lua_test_bf16_ctx(from, idx);
        if (ctx) { /* a frozen bf16 context (Model:snapshot): held by `to` */
            rl_lua_push_bf16_ctx(to, ctx);
            return;
        }
        break;
    }
    case LUA_TLIGHTUSERDATA: /* frozen packed weights (Model:snapshot): held by `to` */
        rl_lua_push_packs(to, lua_touserdata(from, idx));
        return;
    case LUA_TNIL: lua_pushnil(to); return;
    default: break;
    }
    luaL_error(to, "copying the model: a %s cannot be copied", luaL_typename(from, idx));
}

static char *dup_field(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    const char *s = lua_tostring(L, -1);
    char *d = s ? strdup(s) : NULL;
    lua_pop(L, 1);
    if (s && !d) luaL_error(L, "out of memory");
    return d;
}

static int64_t int_field(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    int64_t v = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The library opened in a new state, "rnnlua.capi" left in the registry's field capi. */
static int open_protected(lua_State *L) {
    rl_lua_open_state(L);
    luaL_requiref(L, "rnnlua", luaopen_rnnlua, 0);
    lua_setglobal(L, "rl"); /* as in the host: lua_file and Lua layer classes use it */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "rnnlua.capi");
    lua_call(L, 1, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "capi");
    return 0;
}

/* A copy of the snapshot on top of the state at 1 (the model's) into the registry: its ref. */
static int copy_protected(lua_State *L) {
    lua_State *from = lua_touserdata(L, 1);
    int *ref = lua_touserdata(L, 2);
    copy_value(from, -1, L, 0);
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* fn called in protected mode on L with the light userdata p and q as its arguments. */
static int lua_cpcall_like(lua_State *L, lua_CFunction fn, void *p, void *q) {
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, p);
    lua_pushlightuserdata(L, q);
    return lua_pcall(L, 2, 0, 0);
}

static int load_protected(lua_State *L) {
    load_args *a = lua_touserdata(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "capi");
    lua_getfield(L, -1, "load");
    if (a->snap_ref != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, a->snap_ref);
        luaL_unref(L, LUA_REGISTRYINDEX, a->snap_ref);
    } else {
        lua_pushstring(L, a->path);
    }
    lua_pushstring(L, a->layer);
    lua_pushstring(L, a->device);
    lua_pushstring(L, a->who);
    lua_pushstring(L, a->lua_file);
    lua_call(L, 5, 1);
    if (a->info) {
        rl_info *in = a->info;
        int m = lua_gettop(L);
        in->input_dim = int_field(L, m, "in_dim");
        in->output_dim = int_field(L, m, "out_dim");
        in->num_params = int_field(L, m, "num_params");
        lua_getfield(L, m, "sparse");
        in->input_sparse = lua_toboolean(L, -1);
        lua_pop(L, 1);
        /* the strings last: a failure among them leaves the ones made for free_info */
        in->input = dup_field(L, m, "key");
        in->output = dup_field(L, m, "layer");
        in->not_causal = dup_field(L, m, "not_causal");
        in->causal = in->not_causal == NULL;
        rl_model *md = a->model;
        md->push_lua = dup_field(L, m, "c_push_unfit_why");
        lua_getfield(L, m, "blank");
        md->blank = lua_isinteger(L, -1) ? (int32_t)lua_tointeger(L, -1) : -1;
        lua_pop(L, 1);
        lua_getfield(L, m, "labels");
        if (lua_istable(L, -1)) {
            int64_t n = (int64_t)lua_rawlen(L, -1);
            md->labels = calloc((size_t)n + 1, sizeof *md->labels);
            if (md->labels == NULL) luaL_error(L, "out of memory");
            for (int64_t i = 0; i < n; i++) {
                lua_rawgeti(L, -1, i + 1);
                const char *t = lua_tostring(L, -1);
                md->labels[i] = strdup(t ? t : "");
                if (md->labels[i] == NULL) luaL_error(L, "out of memory");
                md->n_labels = i + 1;
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
    }
    a->e->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static void free_info(rl_info *in) {
    free((char *)in->input);
    free((char *)in->output);
    free((char *)in->not_causal);
    memset(in, 0, sizeof *in);
}

static void engine_close(engine *e) {
    if (e->L) lua_close(e->L);
    free(e->y);
    free(e->len);
    memset(e, 0, sizeof *e);
}

/* The status of a failed pcall, its message moved into the thread's error buffer. */
static rl_status lua_failure(lua_State *L, rl_status code, const char *who) {
    const char *msg = lua_tostring(L, -1);
    if (msg == NULL) msg = "(error object is not a string)";
    size_t n = strlen(who);
    rl_status st = strncmp(msg, who, n) == 0 && msg[n] == ':' ? rl_error(code, "%s", msg)
                                                              : rl_error(code, "%s: %s", who, msg);
    lua_pop(L, 1);
    return st;
}

/* A failed pcall of an engine being opened: its status, the engine closed. */
static rl_status open_failure(engine *e, int status, rl_info *info, const char *who) {
    rl_status st = lua_failure(e->L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EIO, who);
    if (info) free_info(info);
    engine_close(e);
    return st;
}

/* A model's engine from its file (m NULL), or a session's from model m's snapshot, which is
 * copied under the model's lock; the session's network is built with no lock held. */
static rl_status engine_open(engine *e, const rl_model *file, rl_model *m, const char *who,
                             rl_info *info) {
    memset(e, 0, sizeof *e);
    e->L = luaL_newstate();
    if (e->L == NULL) return rl_error(RL_ENOMEM, "%s: no memory for a Lua state", who);
    int status = lua_cpcall_like(e->L, open_protected, NULL, NULL);
    if (status != LUA_OK) return open_failure(e, status, info, who);
    const rl_model *src = m ? m : file;
    load_args a = {.e = e,
                   .path = src->path,
                   .layer = src->layer,
                   .device = src->device,
                   .lua_file = src->lua_file,
                   .who = who,
                   .info = info,
                   .model = (rl_model *)file,
                   .snap_ref = LUA_NOREF};
    if (m) {
        pthread_mutex_lock(&m->mu);
        lua_State *ML = m->e.L;
        if (ML == NULL) {
            pthread_mutex_unlock(&m->mu);
            engine_close(e);
            return rl_error(RL_EARG, "%s: model: the model was freed", who);
        }
        lua_rawgeti(ML, LUA_REGISTRYINDEX, m->e.ref);
        lua_getfield(ML, -1, "snapshot");
        lua_insert(ML, -2);
        status = lua_pcall(ML, 1, 1, 0);
        if (status != LUA_OK) {
            rl_status st = lua_failure(ML, RL_ENOMEM, who);
            lua_settop(ML, 0);
            pthread_mutex_unlock(&m->mu);
            engine_close(e);
            return st;
        }
        status = lua_cpcall_like(e->L, copy_protected, ML, &a.snap_ref);
        lua_settop(ML, 0);
        pthread_mutex_unlock(&m->mu);
        if (status != LUA_OK) return open_failure(e, status, info, who);
    } else {
        pthread_mutex_lock(&load_mu);
    }
    status = lua_cpcall_like(e->L, load_protected, &a, NULL);
    if (!m) pthread_mutex_unlock(&load_mu);
    if (status != LUA_OK) return open_failure(e, status, info, who);
    return RL_OK;
}

typedef struct {
    engine *e;
    const rl_batch *b;
    int sparse;
    const char *layer, *who;
    int state_from; /* -1: a plain batch */
    rl_output *out;
} run_args;

/* Pushes the input tensors of batch b: x (T, B, F) float32 or (T, B) int32 classes, and the
 * lengths (B) int32 (T each when b->lengths is NULL). */
static void push_input(lua_State *L, const rl_batch *b, int sparse, const char *who) {
    int64_t shape[3] = {b->T, b->B, b->F};
    rl_tensor *x = rl_lua_push_tensor(L);
    if (rl_tensor_empty(x, sparse ? RL_INT32 : RL_FLOAT32, RL_DEVICE_CPU, sparse ? 2 : 3, shape) !=
        RL_OK)
        rl_lua_raise(L, who);
    size_t n = (size_t)(b->T * b->B * (sparse ? 1 : b->F));
    memcpy(rl_tensor_data(x), sparse ? (const void *)b->classes : (const void *)b->x,
           n * (sparse ? sizeof(int32_t) : sizeof(float)));
    rl_tensor *len = rl_lua_push_tensor(L);
    if (rl_tensor_empty(len, RL_INT32, RL_DEVICE_CPU, 1, &shape[1]) != RL_OK) rl_lua_raise(L, who);
    int32_t *l = rl_tensor_data(len);
    for (int64_t i = 0; i < b->B; i++)
        l[i] = b->lengths ? b->lengths[i] : (int32_t)b->T;
}

/* e's output buffers grown to ny floats and nl lengths (raises naming who). */
static void engine_reserve(lua_State *L, engine *e, size_t ny, size_t nl, const char *who) {
    if (ny > e->y_cap) {
        float *p = realloc(e->y, ny * sizeof *p);
        if (p == NULL) luaL_error(L, "%s: no memory for the output", who);
        e->y = p, e->y_cap = ny;
    }
    if (nl > e->len_cap) {
        int32_t *p = realloc(e->len, nl * sizeof *p);
        if (p == NULL) luaL_error(L, "%s: no memory for the output", who);
        e->len = p, e->len_cap = nl;
    }
}

static int run_protected(lua_State *L) {
    run_args *a = lua_touserdata(L, 1);
    const rl_batch *b = a->b;
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->e->ref);
    lua_getfield(L, -1, "run");
    lua_insert(L, -2);
    push_input(L, b, a->sparse, a->who);
    if (a->layer)
        lua_pushstring(L, a->layer);
    else
        lua_pushnil(L);
    if (a->state_from >= 0)
        lua_pushinteger(L, a->state_from);
    else
        lua_pushnil(L);
    lua_pushstring(L, a->who);
    lua_call(L, 6, 2);
    const rl_tensor *out = rl_lua_to_tensor(L, -2), *og = rl_lua_to_tensor(L, -1);
    if (out == NULL || og == NULL || out->ndim != 3 || og->ndim != 1 ||
        og->shape[0] != out->shape[1] || og->dtype != RL_INT32)
        return luaL_error(L, "%s: the network gave no sequence output", a->who);
    engine *e = a->e;
    size_t ny = (size_t)rl_tensor_numel(out), nl = (size_t)og->shape[0];
    engine_reserve(L, e, ny, nl, a->who);
    memcpy(e->y, rl_tensor_data(out), ny * sizeof(float));
    memcpy(e->len, rl_tensor_data(og), nl * sizeof(int32_t));
    /* layers need not write zeros on padded frames (layers/layer.h); the API promises them */
    int64_t To = out->shape[0], Bo = out->shape[1], D = out->shape[2];
    for (int64_t t = 0; t < To; t++)
        for (int64_t s = 0; s < Bo; s++)
            if (t >= e->len[s]) memset(e->y + (t * Bo + s) * D, 0, (size_t)D * sizeof(float));
    a->out->y = e->y;
    a->out->lengths = e->len;
    a->out->T = out->shape[0];
    a->out->B = out->shape[1];
    a->out->dim = out->shape[2];
    return 0;
}

/* The checks of a batch against the model, each naming the call and the argument. */
static rl_status check_batch(const rl_info *in, const rl_batch *b, const char *who, const char *arg,
                             int stream) {
    if (b == NULL) return rl_error(RL_EARG, "%s: %s is NULL", who, arg);
    if (b->T < 1 || b->B < 1)
        return rl_error(RL_ESHAPE, "%s: %s->T = %lld, %s->B = %lld: both must be at least 1", who,
                        arg, (long long)b->T, arg, (long long)b->B);
    if (stream && b->B != 1)
        return rl_error(RL_ESHAPE, "%s: %s->B = %lld: a push carries one stream (B = 1)", who, arg,
                        (long long)b->B);
    int64_t F = in->input_sparse ? 1 : in->input_dim;
    if (b->F != F)
        return rl_error(RL_ESHAPE,
                        "%s: %s->F = %lld values a frame, but input '%s' of the model takes %lld%s",
                        who, arg, (long long)b->F, in->input, (long long)F,
                        in->input_sparse ? " (a class index a frame: it is sparse)" : "");
    if (b->T > INT32_MAX || b->B > INT32_MAX || b->T * b->B > ((int64_t)1 << 40) / (F > 0 ? F : 1))
        return rl_error(RL_ESHAPE, "%s: %s: %lld x %lld frames is too large", who, arg,
                        (long long)b->T, (long long)b->B);
    if (in->input_sparse) {
        if (b->classes == NULL)
            return rl_error(RL_EARG, "%s: %s->classes is NULL (input '%s' is sparse)", who, arg,
                            in->input);
    } else if (b->x == NULL) {
        return rl_error(RL_EARG, "%s: %s->x is NULL (input '%s' is dense)", who, arg, in->input);
    }
    if (b->lengths == NULL && !stream)
        return rl_error(RL_EARG, "%s: %s->lengths is NULL", who, arg);
    for (int64_t i = 0; b->lengths && i < b->B; i++)
        if (b->lengths[i] < 1 || b->lengths[i] > b->T)
            return rl_error(RL_ESHAPE, "%s: %s->lengths[%lld] = %d is not in 1..T = %lld", who, arg,
                            (long long)i, (int)b->lengths[i], (long long)b->T);
    for (int64_t t = 0; t < b->T; t++)
        for (int64_t s = 0; s < b->B; s++) {
            if (b->lengths && t >= b->lengths[s]) continue;
            if (in->input_sparse) {
                int32_t c = b->classes[t * b->B + s];
                if (c < 0 || c >= in->input_dim)
                    return rl_error(RL_EINDEX,
                                    "%s: %s->classes[%lld] (frame %lld of sequence %lld) = %d is "
                                    "not a class 0..%lld",
                                    who, arg, (long long)(t * b->B + s), (long long)t, (long long)s,
                                    (int)c, (long long)in->input_dim - 1);
                continue;
            }
            const float *f = b->x + (t * b->B + s) * F;
            for (int64_t i = 0; i < F; i++)
                if (!isfinite(f[i]))
                    return rl_error(RL_EARG,
                                    "%s: %s->x: value %lld of frame %lld of sequence %lld is %s",
                                    who, arg, (long long)i, (long long)t, (long long)s,
                                    isnan(f[i]) ? "NaN" : "infinite");
        }
    return RL_OK;
}

/* One batch (checked by the caller) through the engine's model. */
static rl_status engine_run(engine *e, const rl_info *in, const rl_batch *b, const char *layer,
                            int state_from, rl_output *out, const char *who) {
    run_args a = {.e = e,
                  .b = b,
                  .sparse = in->input_sparse,
                  .layer = layer,
                  .who = who,
                  .state_from = state_from,
                  .out = out};
    lua_pushcfunction(e->L, run_protected);
    lua_pushlightuserdata(e->L, &a);
    int status = lua_pcall(e->L, 1, 0, 0);
    rl_status st = RL_OK;
    if (status != LUA_OK) st = lua_failure(e->L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
    lua_settop(e->L, 0);
    return st;
}

/* ---- models ------------------------------------------------------------------------------- */

static void c_push_clear(c_push *p);

/* The runner closed, and its pushes' plans with it. */
static void runner_close(rl_model *m) {
    engine_close(&m->runner);
    for (int i = 0; i < RUNNER_PLANS; i++)
        if (m->runner_cp[i]) c_push_clear(m->runner_cp[i]);
}

static void model_release(rl_model *m) {
    if (atomic_fetch_sub(&m->refs, 1) != 1) return;
    engine_close(&m->e);
    runner_close(m);
    for (int i = 0; i < RUNNER_PLANS; i++)
        free(m->runner_cp[i]);
    pthread_mutex_destroy(&m->run_mu);
    free_info(&m->info);
    for (int64_t i = 0; i < m->n_labels; i++)
        free(m->labels[i]);
    free(m->labels);
    free(m->path);
    free(m->layer);
    free(m->device);
    free(m->lua_file);
    free(m->push_lua);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

rl_status rl_model_load(rl_model **out, const char *path, const rl_model_options *options) {
    static const char who[] = "rl_model_load";
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    *out = NULL;
    if (path == NULL) return rl_error(RL_EARG, "%s: path is NULL", who);
    rl_model_options o = {0};
    if (options) o = *options;
    if (o.threads < 0 || o.threads > 1024)
        return rl_error(RL_EARG, "%s: options->threads = %d is out of range 0..1024", who,
                        o.threads);
    rl_model *m = calloc(1, sizeof *m);
    if (m == NULL) return rl_error(RL_ENOMEM, "%s: no memory", who);
    m->path = strdup(path);
    m->layer = strdup(o.layer ? o.layer : "output");
    m->device = strdup(o.device ? o.device : "cpu");
    m->lua_file = o.lua_file ? strdup(o.lua_file) : NULL;
    if (!m->path || !m->layer || !m->device || (o.lua_file && !m->lua_file)) {
        free(m->path), free(m->layer), free(m->device), free(m->lua_file), free(m);
        return rl_error(RL_ENOMEM, "%s: no memory", who);
    }
    snprintf(m->precision, sizeof m->precision, "fp32");
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->run_mu, NULL);
    atomic_init(&m->refs, 1);
    atomic_init(&m->freed, 0);
    if (o.threads > 0) rl_blas_set_threads(o.threads);
    rl_status st = engine_open(&m->e, m, NULL, who, &m->info);
    if (st != RL_OK) {
        model_release(m);
        return st;
    }
    /* RNNLUA_CAPI_PUSH=lua: every push through the Lua network (to compare the paths) */
    const char *force = getenv("RNNLUA_CAPI_PUSH");
    if (m->info.causal && !m->push_lua && force && strcmp(force, "lua") == 0)
        m->push_lua = strdup("RNNLUA_CAPI_PUSH=lua");
    /* RNNLUA_CAPI_DEBUG=1: the one line the library prints, which path the pushes take */
    const char *debug = getenv("RNNLUA_CAPI_DEBUG");
    if (debug && *debug && strcmp(debug, "0") != 0 && m->info.causal)
        fprintf(stderr, "%s: %s: pushes run %s%s\n", who, path,
                m->push_lua ? "through the Lua network: " : "in C", m->push_lua ? m->push_lua : "");
    *out = m;
    return RL_OK;
}

void rl_model_free(rl_model *model) {
    if (model == NULL) return;
    atomic_store(&model->freed, 1);
    /* the model's own network goes now; its sessions keep only what they read (info, path) */
    pthread_mutex_lock(&model->mu);
    engine_close(&model->e);
    pthread_mutex_unlock(&model->mu);
    pthread_mutex_lock(&model->run_mu);
    runner_close(model);
    pthread_mutex_unlock(&model->run_mu);
    model_release(model);
}

typedef struct {
    engine *e;
    const char *precision, *who;
} precision_args;

static int precision_protected(lua_State *L) {
    precision_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->e->ref);
    lua_getfield(L, -1, "set_precision");
    lua_insert(L, -2);
    lua_pushstring(L, a->precision);
    lua_pushstring(L, a->who);
    lua_call(L, 3, 0);
    return 0;
}

rl_status rl_model_set_precision(rl_model *model, const char *precision) {
    static const char who[] = "rl_model_set_precision";
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (precision == NULL) return rl_error(RL_EARG, "%s: precision is NULL", who);
    if (atomic_load(&model->freed)) return rl_error(RL_EARG, "%s: model: the model was freed", who);
    precision_args a = {.e = &model->e, .precision = precision, .who = who};
    pthread_mutex_lock(&model->mu);
    rl_status st = RL_OK;
    if (model->e.L == NULL) {
        st = rl_error(RL_EARG, "%s: model: the model was freed", who);
    } else {
        lua_pushcfunction(model->e.L, precision_protected);
        lua_pushlightuserdata(model->e.L, &a);
        int status = lua_pcall(model->e.L, 1, 0, 0);
        if (status != LUA_OK)
            st = lua_failure(model->e.L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
        else
            snprintf(model->precision, sizeof model->precision, "%s", precision);
        lua_settop(model->e.L, 0);
    }
    pthread_mutex_unlock(&model->mu);
    return st;
}

rl_status rl_model_labels(const rl_model *model, int32_t *blank, int64_t *n,
                          const char *const **labels) {
    static const char who[] = "rl_model_labels";
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (blank == NULL) return rl_error(RL_EARG, "%s: blank is NULL", who);
    if (n == NULL) return rl_error(RL_EARG, "%s: n is NULL", who);
    if (labels == NULL) return rl_error(RL_EARG, "%s: labels is NULL", who);
    *blank = model->blank;
    *n = model->n_labels;
    *labels = (const char *const *)model->labels;
    return RL_OK;
}

/* RL_OK, or an error naming the first NaN among the T frames of sequence b of out. */
static rl_status check_frames(const rl_output *out, int64_t b, int64_t T, const char *who) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < out->dim; c++)
            if (isnan(out->y[(t * out->B + b) * out->dim + c]))
                return rl_error(RL_EARG,
                                "%s: out->y: class %lld of frame %lld of sequence %lld is NaN", who,
                                (long long)c, (long long)t, (long long)b);
    return RL_OK;
}

/* The checks of rl_ctc_decode's arguments; *T gets the frames of sequence b. */
static rl_status decode_checks(const rl_output *out, int64_t b, int32_t blank, int beam,
                               const int32_t *labels, int64_t cap, int64_t *n, const char *who,
                               int64_t *T) {
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    if (labels == NULL) return rl_error(RL_EARG, "%s: labels is NULL", who);
    if (n == NULL) return rl_error(RL_EARG, "%s: n is NULL", who);
    *n = 0;
    if (out->y == NULL || out->lengths == NULL || out->T < 1 || out->B < 1 || out->dim < 2)
        return rl_error(RL_ESHAPE,
                        "%s: out: %lld x %lld x %lld (y %s, lengths %s) is no output of a model "
                        "(rl_model_forward, rl_session_push) with 2 or more classes",
                        who, (long long)out->T, (long long)out->B, (long long)out->dim,
                        out->y ? "set" : "NULL", out->lengths ? "set" : "NULL");
    if (b < 0 || b >= out->B)
        return rl_error(RL_EINDEX, "%s: b = %lld is no sequence of out (0..%lld)", who,
                        (long long)b, (long long)out->B - 1);
    if (blank < 0 || blank >= out->dim)
        return rl_error(RL_EARG, "%s: blank = %d is no class of out (0..%lld)", who, (int)blank,
                        (long long)out->dim - 1);
    if (beam < 1 || beam > 4096)
        return rl_error(RL_EARG, "%s: beam = %d is out of range 1..4096", who, beam);
    if (cap < 0) return rl_error(RL_EARG, "%s: cap = %lld is negative", who, (long long)cap);
    *T = out->lengths[b];
    if (*T < 0 || *T > out->T)
        return rl_error(RL_ESHAPE, "%s: out->lengths[%lld] = %lld is not in 0..T = %lld", who,
                        (long long)b, (long long)*T, (long long)out->T);
    return RL_OK;
}

/* got decoded labels (numbered as the targets) into the caller's labels, at most cap. */
static rl_status put_labels(const int32_t *got_labels, int64_t got, int32_t *labels, int64_t cap,
                            int64_t *n, const char *who) {
    *n = got;
    for (int64_t i = 0; i < got && i < cap; i++)
        labels[i] = got_labels[i];
    if (got > cap)
        return rl_error(RL_ESHAPE, "%s: cap = %lld: the sequence has %lld labels", who,
                        (long long)cap, (long long)got);
    return RL_OK;
}

/* rl_ctc_decode for `who`, the arguments checked: no LM. */
static rl_status decode_plain(const rl_output *out, int64_t b, int64_t T, int32_t blank, int beam,
                              int32_t *labels, int64_t cap, int64_t *n, const char *who) {
    int64_t V = out->dim, B = out->B;
    int32_t *path = malloc(sizeof *path * (size_t)(T > 0 ? T : 1));
    if (path == NULL)
        return rl_error(RL_ENOMEM, "%s: no memory for %lld frames", who, (long long)T);
    rl_status st = RL_OK;
    int64_t got = 0;
    if (beam == 1) { /* best path: the likeliest class of each frame, repeats merged, blanks out */
        st = check_frames(out, b, T, who);
        for (int64_t t = 0; t < T && st == RL_OK; t++) {
            const float *p = out->y + (t * B + b) * V;
            int32_t best = 0;
            for (int64_t c = 0; c < V; c++)
                if (p[c] > p[best]) best = (int32_t)c;
            path[t] = best;
        }
        if (st == RL_OK) got = rl_ctc_collapse(path, T, 1, blank, path);
    } else { /* prefix beam search over the log of the probabilities */
        double *logp = malloc(sizeof *logp * (size_t)(T > 0 ? T * V : 1));
        if (logp == NULL) {
            free(path);
            return rl_error(RL_ENOMEM, "%s: no memory for %lld frames", who, (long long)T);
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < V; c++)
                logp[t * V + c] = log((double)out->y[(t * B + b) * V + c]);
        int32_t len = (int32_t)T;
        st = rl_ctc_beam_search_cpu(T, 1, V, logp, &len, blank, beam, NULL, path, &got, 1);
        free(logp);
        if (st != RL_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", rl_errmsg());
            st = rl_error(st, "%s: %s", who, msg);
        }
    }
    if (st == RL_OK) {
        for (int64_t i = 0; i < got; i++)
            path[i] = path[i] < blank ? path[i] : path[i] - 1;
        st = put_labels(path, got, labels, cap, n, who);
    }
    free(path);
    return st;
}

rl_status rl_ctc_decode(const rl_output *out, int64_t b, int32_t blank, int beam, int32_t *labels,
                        int64_t cap, int64_t *n) {
    static const char who[] = "rl_ctc_decode";
    int64_t T = 0;
    RL_TRY(decode_checks(out, b, blank, beam, labels, cap, n, who, &T));
    return decode_plain(out, b, T, blank, beam, labels, cap, n, who);
}

rl_status rl_model_info(const rl_model *model, rl_info *info) {
    if (model == NULL) return rl_error(RL_EARG, "rl_model_info: model is NULL");
    if (info == NULL) return rl_error(RL_EARG, "rl_model_info: info is NULL");
    *info = model->info;
    return RL_OK;
}

rl_status rl_model_forward(rl_model *model, const rl_batch *batch, const char *layer,
                           rl_output *out) {
    static const char who[] = "rl_model_forward";
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    RL_TRY(check_batch(&model->info, batch, who, "batch", 0));
    pthread_mutex_lock(&model->mu);
    rl_status st = engine_run(&model->e, &model->info, batch, layer, -1, out, who);
    pthread_mutex_unlock(&model->mu);
    return st;
}

/* ---- sessions ----------------------------------------------------------------------------- */

static rl_status take_plan(engine *e, struct c_push *p, int64_t rows, const char *who);

rl_status rl_session_open(rl_session **out, rl_model *model) {
    static const char who[] = "rl_session_open";
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    *out = NULL;
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (atomic_load(&model->freed)) return rl_error(RL_EARG, "%s: model: the model was freed", who);
    rl_session *s = calloc(1, sizeof *s);
    if (s == NULL) return rl_error(RL_ENOMEM, "%s: no memory", who);
    atomic_fetch_add(&model->refs, 1); /* before the model's lock: its memory stays */
    pthread_mutex_lock(&model->mu);
    memcpy(s->precision, model->precision, sizeof s->precision);
    pthread_mutex_unlock(&model->mu);
    /* the session's network comes from the model's memory (its checkpoint as loaded, its
     * parameters shared), not from the file again, which may have changed or gone since */
    rl_status st = engine_open(&s->e, NULL, model, who, NULL);
    if (st != RL_OK) {
        free(s);
        model_release(model);
        return st;
    }
    s->model = model;
    s->cp.ref = LUA_NOREF;
    /* a push in C takes its plan at the session's first push when it has none; taking it here
     * keeps that cost (1-2 ms: the plan's state buffers start a collection of the session's Lua
     * heap) out of the first push, which a server runs in one batch with the other streams'
     * frames. A failure here leaves it to the push, which reports it. */
    if (model->info.causal && !model->push_lua) (void)take_plan(&s->e, &s->cp, 0, who);
    *out = s;
    return RL_OK;
}

void rl_session_free(rl_session *session) {
    if (session == NULL) return;
    c_push_clear(&session->cp);
    engine_close(&session->e);
    model_release(session->model);
    free(session);
}

static rl_status session_usable(const rl_session *s, const char *who) {
    if (s == NULL) return rl_error(RL_EARG, "%s: session is NULL", who);
    if (atomic_load(&s->model->freed))
        return rl_error(RL_EARG,
                        "%s: session: the model was freed (rl_model_free) while the session was "
                        "open; free the session",
                        who);
    return RL_OK;
}

rl_status rl_session_forward(rl_session *session, const rl_batch *batch, const char *layer,
                             rl_output *out) {
    static const char who[] = "rl_session_forward";
    RL_TRY(session_usable(session, who));
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    RL_TRY(check_batch(&session->model->info, batch, who, "batch", 0));
    /* a plain batch drops the carried state (rnnlua.network): the stream starts anew; it also
     * turns the pushes' settings of the layers off, so the next push takes its plan anew */
    session->started = 0;
    if (session->cp.ref != LUA_NOREF) {
        luaL_unref(session->e.L, LUA_REGISTRYINDEX, session->cp.ref);
        session->cp.ref = LUA_NOREF;
    }
    return engine_run(&session->e, &session->model->info, batch, layer, -1, out, who);
}

/* The tensor at index i of the list at idx: a contiguous float32 CPU (rows, dim) one (raises). */
static rl_tensor *plan_state(lua_State *L, int idx, int i, int64_t rows, int64_t dim,
                             const char *who) {
    lua_rawgeti(L, idx, i);
    rl_tensor *t = rl_lua_to_tensor(L, -1);
    lua_pop(L, 1); /* the plan keeps it */
    if (t == NULL || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != dim ||
        t->dtype != RL_FLOAT32 || !t->storage || t->storage->device.type != RL_CPU ||
        !rl_tensor_is_contiguous(t))
        luaL_error(L, "%s: the push plan's state %d does not fit its layer", who, i);
    return t;
}

typedef struct {
    engine *e;
    c_push *p;
    int64_t rows; /* 0: a session's plan; else the runner's for batches of rows streams */
    const char *who;
} plan_args;

/* Model:c_push_plan(rows) of e's state into p (its table kept in the registry). */
static int plan_protected(lua_State *L) {
    plan_args *a = lua_touserdata(L, 1);
    c_push *p = a->p;
    const char *who = a->who;
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->e->ref);
    lua_getfield(L, -1, "c_push_plan");
    lua_insert(L, -2);
    if (a->rows)
        lua_pushinteger(L, a->rows);
    else
        lua_pushnil(L);
    lua_call(L, 2, 1);
    int t = lua_gettop(L);
    lua_getfield(L, t, "nodes"); /* t + 1 */
    int n = (int)lua_rawlen(L, t + 1);
    if (n > p->cap) {
        push_node *nodes = realloc(p->nodes, sizeof *nodes * (size_t)n);
        if (nodes == NULL) return luaL_error(L, "%s: no memory for the push plan", who);
        p->nodes = nodes, p->cap = n;
    }
    memset(p->nodes, 0, sizeof *p->nodes * (size_t)n);
    for (int i = 0; i < n; i++) {
        push_node *d = &p->nodes[i];
        lua_rawgeti(L, t + 1, i + 1); /* t + 2 */
        lua_getfield(L, t + 2, "layer");
        d->l = rl_lua_to_layer(L, -1);
        lua_getfield(L, t + 2, "bf16");
        d->bf16 = lua_toboolean(L, -1);
        lua_getfield(L, t + 2, "srcs"); /* t + 5 */
        d->n_in = (int)lua_rawlen(L, t + 5);
        if (d->l == NULL || d->n_in != d->l->n_in)
            return luaL_error(L, "%s: node %d of the push plan is no C layer", who, i + 1);
        for (int k = 0; k < d->n_in; k++) {
            lua_rawgeti(L, t + 5, k + 1);
            int src = (int)lua_tointeger(L, -1) - 1;
            lua_pop(L, 1);
            if (src < -1 || src >= i)
                return luaL_error(L, "%s: node %d of the push plan reads node %d", who, i + 1,
                                  src + 1);
            d->src[k] = src;
        }
        lua_settop(L, t + 1);
    }
    p->n = n;
    p->out = (int)int_field(L, t, "out") - 1;
    if (p->out < 0 || p->out >= n) return luaL_error(L, "%s: the push plan has no output", who);
    lua_getfield(L, t, "carried"); /* t + 2 */
    lua_getfield(L, t, "states");  /* t + 3 */
    int carried = (int)lua_rawlen(L, t + 2), j = 1;
    for (int k = 0; k < carried; k++) {
        lua_rawgeti(L, t + 2, k + 1);
        int i = (int)lua_tointeger(L, -1) - 1;
        lua_pop(L, 1);
        if (i < 0 || i >= n) return luaL_error(L, "%s: the push plan carries no node", who);
        push_node *d = &p->nodes[i];
        const int64_t *dims;
        d->n_states = rl_layer_state_info(d->l, NULL, &dims);
        for (int q = 0; q < d->n_states; q++) {
            d->state[q] = plan_state(L, t + 3, j++, a->rows ? a->rows : 1, dims[q], who);
            d->sdata[q] = rl_tensor_data(d->state[q]);
            d->sdim[q] = dims[q];
        }
    }
    if (j - 1 != (int)lua_rawlen(L, t + 3))
        return luaL_error(L, "%s: the push plan's states do not fit its layers", who);
    p->norm_mean = p->norm_inv = NULL;
    p->norm_n = 0;
    if (lua_getfield(L, t, "norm") == LUA_TTABLE) {
        lua_getfield(L, -1, "mean");
        lua_getfield(L, -2, "inv");
        const rl_tensor *mean = rl_lua_to_tensor(L, -2), *inv = rl_lua_to_tensor(L, -1);
        if (mean == NULL || inv == NULL || mean->dtype != RL_FLOAT32 || inv->dtype != RL_FLOAT32 ||
            !mean->storage || mean->storage->device.type != RL_CPU || !inv->storage ||
            inv->storage->device.type != RL_CPU || !rl_tensor_is_contiguous(mean) ||
            !rl_tensor_is_contiguous(inv) || rl_tensor_numel(mean) != rl_tensor_numel(inv))
            return luaL_error(L, "%s: the push plan's data_norm is no pair of float32 vectors",
                              who);
        p->norm_mean = rl_tensor_data(mean);
        p->norm_inv = rl_tensor_data(inv);
        p->norm_n = rl_tensor_numel(mean);
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "bf16_ctx");
    p->bf16 = lua_isnil(L, -1) ? NULL : rl_lua_test_bf16_ctx(L, -1);
    lua_getfield(L, t, "params");
    p->params = rl_lua_to_tensor(L, -1);
    if (p->bf16 && (p->params == NULL || p->params->dtype != RL_FLOAT32 ||
                    !rl_tensor_is_contiguous(p->params)))
        return luaL_error(L, "%s: the push plan's parameters are no float32 buffer", who);
    lua_settop(L, t);
    p->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* p's plan taken from e's state when it has none (rows as plan_args'). */
static rl_status take_plan(engine *e, c_push *p, int64_t rows, const char *who) {
    if (p->ref != LUA_NOREF) return RL_OK;
    plan_args a = {.e = e, .p = p, .rows = rows, .who = who};
    int status = lua_cpcall_like(e->L, plan_protected, &a, NULL);
    rl_status st = RL_OK;
    if (status != LUA_OK) st = lua_failure(e->L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
    lua_settop(e->L, 0);
    return st;
}

/* What p holds beyond its plan (the state that owns the plan's table closes apart). */
static void c_push_clear(c_push *p) {
    free(p->nodes);
    rl_tensor_release(&p->x);
    rl_tensor_release(&p->len);
    memset(p, 0, sizeof *p);
    p->ref = LUA_NOREF;
}

/* The n chunks (checked) as one padded batch of `rows` rows in p->x and p->len: chunk i in row i,
 * the rows past n one frame of zeros (as rl_session_push_many's Lua batch), T the longest; with
 * the checkpoint's data_norm each chunk's frames normalised as forward.lua's `normalized` does,
 * (x - mean) * inv in float32 (the padding stays zeros: its outputs are never read). */
static rl_status plan_input(c_push *p, const rl_info *in, const rl_batch *chunks, int n,
                            int64_t rows, int64_t T) {
    int sparse = in->input_sparse;
    int64_t shape[3] = {T, rows, in->input_dim};
    RL_TRY(rl_buffer_ensure(&p->x, sparse ? RL_INT32 : RL_FLOAT32, RL_DEVICE_CPU, sparse ? 2 : 3,
                            shape));
    RL_TRY(rl_buffer_ensure(&p->len, RL_INT32, RL_DEVICE_CPU, 1, &rows));
    char *x = rl_tensor_data(&p->x);
    int32_t *len = rl_tensor_data(&p->len);
    size_t frame = (size_t)(sparse ? 1 : in->input_dim) * 4; /* float or int32 */
    if (p->norm_mean && (sparse || p->norm_n != in->input_dim))
        return rl_error(RL_ESHAPE, "the model's data_norm has %lld values for an input of %lld",
                        (long long)p->norm_n, (long long)in->input_dim);
    if (rows > 1) memset(x, 0, (size_t)(T * rows) * frame);
    for (int64_t i = 0; i < rows; i++) {
        len[i] = i < n ? (int32_t)chunks[i].T : 1;
        if (i >= n) continue;
        const char *src = sparse ? (const char *)chunks[i].classes : (const char *)chunks[i].x;
        for (int64_t t = 0; t < chunks[i].T; t++) {
            char *dst = x + (size_t)(t * rows + i) * frame;
            memcpy(dst, src + (size_t)t * frame, frame);
            if (p->norm_mean) {
                float *f = (float *)dst;
                for (int64_t k = 0; k < p->norm_n; k++)
                    f[k] = (f[k] - p->norm_mean[k]) * p->norm_inv[k];
            }
        }
    }
    return RL_OK;
}

struct rl_session;
static float *session_state(const struct rl_session *s, int k, int q);

/* The plan's layers over p->x and p->len, each carried layer from its plan states (from_state)
 * or zeros, their final states written after into the plan states, or with ss (the runner's
 * batch of n streams) row i straight into stream i's own. */
static rl_status plan_forward(c_push *p, int from_state, struct rl_session *const *ss, int n) {
    /* as net:forward's bf16_enter and bf16_node: float32 products unless a node has bf16 */
    rl_bf16_ctx *prev = rl_bf16_active();
    if (p->bf16)
        rl_bf16_ctx_begin(p->bf16, rl_tensor_data(p->params),
                          (size_t)rl_tensor_numel(p->params) * sizeof(float),
                          rl_storage_version(p->params->storage));
    rl_bf16_activate(NULL);
    rl_status st = RL_OK;
    for (int i = 0; i < p->n && st == RL_OK; i++) {
        push_node *d = &p->nodes[i];
        rl_layer_io io = {.n_in = d->n_in, .lengths = &p->len, .rng = rl_rng_default()};
        for (int k = 0; k < d->n_in; k++)
            io.in[k] = d->src[k] < 0 ? &p->x : &p->nodes[d->src[k]].l->out;
        if (d->n_states) {
            const rl_tensor *init[RL_LAYER_MAX_STATES] = {NULL};
            for (int q = 0; from_state && q < d->n_states; q++)
                init[q] = d->state[q];
            st = rl_layer_set_initial_state(d->l, d->n_states, init);
        }
        if (p->bf16) rl_bf16_activate(d->bf16 ? p->bf16 : NULL);
        if (st == RL_OK) st = d->l->ops->forward(d->l, &io);
    }
    rl_bf16_activate(prev);
    /* each carried layer's final states (each row's after its own last frame) */
    for (int i = 0; i < p->n && st == RL_OK; i++) {
        push_node *d = &p->nodes[i];
        if (!d->n_states) continue;
        rl_tensor fin[RL_LAYER_MAX_STATES];
        rl_tensor *to[RL_LAYER_MAX_STATES];
        memset(fin, 0, sizeof fin);
        for (int q = 0; q < RL_LAYER_MAX_STATES; q++)
            to[q] = &fin[q];
        st = rl_layer_final_state(d->l, d->n_states, to);
        for (int q = 0; q < d->n_states && st == RL_OK; q++) {
            int64_t numel = rl_tensor_numel(d->state[q]), dim = d->sdim[q];
            const float *f = rl_tensor_data(&fin[q]);
            if (fin[q].dtype != RL_FLOAT32 || rl_tensor_numel(&fin[q]) != numel ||
                !rl_tensor_is_contiguous(&fin[q]))
                st = rl_error(RL_ESHAPE,
                              RL_LAYER_WHERE ": its final state does not fit the stream's",
                              d->l->name, d->l->ops->class_name);
            else if (ss == NULL)
                memcpy(d->sdata[q], f, (size_t)numel * sizeof(float));
            else
                for (int r = 0; r < n; r++)
                    memcpy(session_state(ss[r], i, q), f + r * dim, (size_t)dim * sizeof(float));
        }
        for (int q = 0; q < d->n_states; q++)
            rl_tensor_release(&fin[q]);
    }
    return st;
}

/* e's output buffers grown to ny floats and one length, without Lua. */
static rl_status out_reserve(engine *e, size_t ny, const char *who) {
    if (ny > e->y_cap) {
        float *q = realloc(e->y, ny * sizeof *q);
        if (q == NULL) return rl_error(RL_ENOMEM, "%s: no memory for the output", who);
        e->y = q, e->y_cap = ny;
    }
    if (e->len_cap < 1) {
        int32_t *q = realloc(e->len, sizeof *q);
        if (q == NULL) return rl_error(RL_ENOMEM, "%s: no memory for the output", who);
        e->len = q, e->len_cap = 1;
    }
    return RL_OK;
}

/* A failure inside the network: st with who in front of its message. */
static rl_status network_failure(rl_status st, const char *who) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rl_errmsg());
    return rl_error(st, "%s: %s", who, msg);
}

/* The output of the plan's model layer, (T, rows, D) float32: *y, or an error. */
static rl_status plan_output(const c_push *p, int64_t T, int64_t rows, const rl_tensor **y,
                             const char *who) {
    *y = &p->nodes[p->out].l->out;
    const rl_tensor *o = *y;
    if (o->ndim != 3 || o->shape[0] != T || o->shape[1] != rows || o->dtype != RL_FLOAT32 ||
        !rl_tensor_is_contiguous(o))
        return rl_error(RL_ESHAPE, "%s: the network gave no sequence output", who);
    return RL_OK;
}

/* A push of a model whose pushes run in C: the plan taken at the session's first push (and
 * after a plain forward, which turns the layers' push settings off), then the chunk through
 * the plan, the carried state updated in place. */
static rl_status push_in_c(rl_session *s, const rl_batch *chunk, rl_output *out, const char *who) {
    c_push *p = &s->cp;
    RL_TRY(take_plan(&s->e, p, 0, who));
    RL_TRY(plan_input(p, &s->model->info, chunk, 1, 1, chunk->T));
    rl_status st = plan_forward(p, s->started, NULL, 0);
    if (st != RL_OK) return network_failure(st, who);
    const rl_tensor *y;
    RL_TRY(plan_output(p, chunk->T, 1, &y, who));
    engine *e = &s->e;
    size_t ny = (size_t)rl_tensor_numel(y);
    RL_TRY(out_reserve(e, ny, who));
    memcpy(e->y, rl_tensor_data(y), ny * sizeof(float));
    e->len[0] = (int32_t)chunk->T;
    *out = (rl_output){.y = e->y, .lengths = e->len, .T = chunk->T, .B = 1, .dim = y->shape[2]};
    return RL_OK;
}

rl_status rl_session_push(rl_session *session, const rl_batch *chunk, rl_output *out) {
    static const char who[] = "rl_session_push";
    RL_TRY(session_usable(session, who));
    const rl_info *in = &session->model->info;
    if (!in->causal)
        return rl_error(RL_EARG, "%s: the model of %s cannot stream: %s", who, session->model->path,
                        in->not_causal);
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    /* a refused chunk leaves the stream as it was */
    RL_TRY(check_batch(in, chunk, who, "chunk", 1));
    rl_status st = session->model->push_lua
                       ? engine_run(&session->e, in, chunk, NULL, session->started, out, who)
                       : push_in_c(session, chunk, out, who);
    /* a push that failed inside the network leaves no carried state: the stream starts anew */
    session->started = st == RL_OK;
    return st;
}

rl_status rl_session_reset(rl_session *session) {
    RL_TRY(session_usable(session, "rl_session_reset"));
    session->started = 0;
    return RL_OK;
}

/* ---- language models: rl_lm_load, rl_ctc_decode_lm --------------------------------------------
 * An LM handle holds a Lua state of its own with the LM as rl.forward's decoding takes it
 * (lua/rnnlua/capi.lua's lm_load: forward.ctc_lm, the n-gram model read by kernels/ngram.c or
 * the character LM's network), so rl_ctc_decode_lm decodes by the very function rl.forward
 * decodes with (forward.ctc_labels, rl.ctc_decode). Its state is used under its mutex. */

struct rl_lm {
    pthread_mutex_t mu;
    lua_State *L;
    int ref;       /* capi.lm_load's table in the registry */
    int32_t blank; /* the model's CTC blank; -1: an LM for an attention decoder */
    int64_t V;     /* classes of the model's layer (a decoder's: of its choice) */
    int search;    /* an LM for an attention decoder (rl_model_search) */
};

typedef struct {
    rl_lm *lm;
    int target_ref; /* Model:lm_target()'s table, copied into the LM's state */
    const char *kind, *path, *word_boundary, *layer, *who;
    const char *const *labels; /* the caller's, or NULL */
    int64_t n_labels;
} lm_load_args;

static int lm_load_protected(lua_State *L) {
    lm_load_args *a = lua_touserdata(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "capi");
    lua_getfield(L, -1, "lm_load");
    lua_pushstring(L, a->kind);
    lua_pushstring(L, a->path);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->target_ref);
    if (a->labels) {
        lua_createtable(L, (int)a->n_labels, 0);
        for (int64_t i = 0; i < a->n_labels; i++) {
            lua_pushstring(L, a->labels[i]);
            lua_rawseti(L, -2, i + 1);
        }
    } else {
        lua_pushnil(L);
    }
    lua_pushstring(L, a->word_boundary);
    lua_pushstring(L, a->layer);
    lua_pushstring(L, a->who);
    lua_call(L, 7, 1);
    int h = lua_gettop(L);
    lua_getfield(L, h, "blank");
    a->lm->blank = lua_isinteger(L, -1) ? (int32_t)lua_tointeger(L, -1) : -1;
    a->lm->V = int_field(L, h, "V");
    lua_getfield(L, h, "search");
    a->lm->search = lua_toboolean(L, -1);
    lua_settop(L, h);
    a->lm->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Pushes Model:lm_target() of the model's state (its CTC layer or decoder, or nil). */
static int lm_target_protected(lua_State *L) {
    const rl_model *m = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->e.ref);
    lua_getfield(L, -1, "lm_target");
    lua_insert(L, -2);
    lua_call(L, 1, 1);
    return 1;
}

/* The fields of a caller's struct that begins with its size: the bytes its size covers, the rest
 * 0. A size below the first version's or above this library's is refused. */
static rl_status sized_struct(void *dst, size_t dst_size, const void *src, size_t first_size,
                              const char *who, const char *arg, const char *type) {
    memset(dst, 0, dst_size);
    if (src == NULL) return RL_OK;
    size_t size = *(const size_t *)src;
    if (size < first_size || size > dst_size)
        return rl_error(RL_EARG, "%s: %s->size = %zu is not sizeof(%s) (%zu): set it so", who, arg,
                        size, type, dst_size);
    memcpy(dst, src, size);
    return RL_OK;
}

void rl_lm_free(rl_lm *lm) {
    if (lm == NULL) return;
    if (lm->L) lua_close(lm->L);
    pthread_mutex_destroy(&lm->mu);
    free(lm);
}

rl_status rl_lm_load(rl_lm **out, const rl_model *model, const char *path,
                     const rl_lm_options *options) {
    static const char who[] = "rl_lm_load";
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    *out = NULL;
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (path == NULL) return rl_error(RL_EARG, "%s: path is NULL", who);
    if (atomic_load(&model->freed)) return rl_error(RL_EARG, "%s: model: the model was freed", who);
    rl_lm_options o;
    RL_TRY(sized_struct(&o, sizeof o, options, sizeof o, who, "options", "rl_lm_options"));
    if (o.labels && (o.n_labels < 1 || o.n_labels > (1 << 24)))
        return rl_error(RL_EARG, "%s: options->n_labels = %lld is out of range 1..%d", who,
                        (long long)o.n_labels, 1 << 24);
    for (int64_t i = 0; o.labels && i < o.n_labels; i++)
        if (o.labels[i] == NULL)
            return rl_error(RL_EARG, "%s: options->labels[%lld] is NULL", who, (long long)i);
    /* an rnnlua checkpoint is an HDF5 file: a neural LM; anything else is read as ARPA text */
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return rl_error(RL_EIO, "%s: path: cannot open %s: %s", who, path, strerror(errno));
    unsigned char magic[8] = {0};
    size_t got = fread(magic, 1, sizeof magic, f);
    fclose(f);
    int hdf5 = got == 8 && memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0;
    if (o.layer && !hdf5)
        return rl_error(RL_EARG,
                        "%s: options->layer = '%s' names a neural LM's layer, but %s is no rnnlua "
                        "checkpoint (read as an ARPA file)",
                        who, o.layer, path);
    rl_lm *lm = calloc(1, sizeof *lm);
    if (lm == NULL) return rl_error(RL_ENOMEM, "%s: no memory", who);
    pthread_mutex_init(&lm->mu, NULL);
    lm->L = luaL_newstate();
    if (lm->L == NULL) {
        rl_lm_free(lm);
        return rl_error(RL_ENOMEM, "%s: no memory for a Lua state", who);
    }
    int status = lua_cpcall_like(lm->L, open_protected, NULL, NULL);
    lm_load_args a = {.lm = lm, .target_ref = LUA_NOREF};
    if (status == LUA_OK) { /* what the LM is for: the model's lm_target, copied */
        rl_model *mm = (rl_model *)model;
        pthread_mutex_lock(&mm->mu);
        lua_State *ML = mm->e.L;
        rl_status st = RL_OK;
        if (ML == NULL) {
            st = rl_error(RL_EARG, "%s: model: the model was freed", who);
        } else if (lua_pushcfunction(ML, lm_target_protected), lua_pushlightuserdata(ML, mm),
                   lua_pcall(ML, 1, 1, 0) != LUA_OK) {
            st = lua_failure(ML, RL_EARG, who);
        } else if (lua_isnil(ML, -1)) {
            st = rl_error(RL_EARG,
                          "%s: model: layer '%s' of %s is neither a CTC layer (a softmax trained "
                          "with loss = \"ctc\") nor an attention decoder (a rec layer with a "
                          "choice): an LM fuses into their decoding",
                          who, model->info.output, model->path);
        } else {
            status = lua_cpcall_like(lm->L, copy_protected, ML, &a.target_ref);
        }
        lua_settop(ML, 0);
        pthread_mutex_unlock(&mm->mu);
        if (st != RL_OK) {
            rl_lm_free(lm);
            return st;
        }
    }
    if (status == LUA_OK) {
        a = (lm_load_args){.lm = lm,
                           .target_ref = a.target_ref,
                           .kind = hdf5 ? "model" : "file",
                           .path = path,
                           .word_boundary = o.word_boundary,
                           .layer = o.layer,
                           .who = who,
                           .labels = o.labels,
                           .n_labels = o.n_labels};
        pthread_mutex_lock(&load_mu); /* a neural LM's checkpoint is read through libhdf5 */
        status = lua_cpcall_like(lm->L, lm_load_protected, &a, NULL);
        pthread_mutex_unlock(&load_mu);
    }
    if (status != LUA_OK) {
        rl_status st = lua_failure(lm->L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EIO, who);
        rl_lm_free(lm);
        return st;
    }
    *out = lm;
    return RL_OK;
}

typedef struct {
    const rl_lm *lm;
    const rl_output *out;
    int64_t b, T;
    int beam;
    double weight, bonus;
    int32_t *path; /* T labels at most */
    int64_t got;
    const char *who;
} lm_decode_args;

static int lm_decode_protected(lua_State *L) {
    lm_decode_args *a = lua_touserdata(L, 1);
    const rl_output *o = a->out;
    lua_getfield(L, LUA_REGISTRYINDEX, "capi");
    lua_getfield(L, -1, "lm_decode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->lm->ref);
    /* the sequence's frames, (T, 1, V); a sequence of no frames gets one frame, not read */
    int64_t Tp = a->T > 0 ? a->T : 1, V = o->dim;
    int64_t shape[3] = {Tp, 1, V};
    rl_tensor *y = rl_lua_push_tensor(L);
    if (rl_tensor_empty(y, RL_FLOAT32, RL_DEVICE_CPU, 3, shape) != RL_OK)
        return rl_lua_raise(L, a->who);
    float *yd = rl_tensor_data(y);
    for (int64_t t = 0; t < Tp; t++)
        memcpy(yd + t * V, o->y + ((t < a->T ? t : 0) * o->B + a->b) * V,
               (size_t)V * sizeof(float));
    rl_tensor *len = rl_lua_push_tensor(L);
    if (rl_tensor_empty(len, RL_INT32, RL_DEVICE_CPU, 1, &shape[1]) != RL_OK)
        return rl_lua_raise(L, a->who);
    *(int32_t *)rl_tensor_data(len) = (int32_t)a->T;
    lua_pushinteger(L, a->beam);
    lua_pushnumber(L, a->weight);
    lua_pushnumber(L, a->bonus);
    lua_call(L, 6, 1);
    int64_t n = (int64_t)lua_rawlen(L, -1);
    if (n > a->T)
        return luaL_error(L, "%s: %lld labels of %lld frames", a->who, (long long)n,
                          (long long)a->T);
    for (int64_t i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        a->path[i] = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    a->got = n;
    return 0;
}

static int finite_d(double v) { return !isnan(v) && !isinf(v); }

rl_status rl_ctc_decode_lm(const rl_output *out, int64_t b, const rl_decode_options *options,
                           int32_t *labels, int64_t cap, int64_t *n) {
    static const char who[] = "rl_ctc_decode_lm";
    if (options == NULL) return rl_error(RL_EARG, "%s: options is NULL", who);
    rl_decode_options o;
    RL_TRY(sized_struct(&o, sizeof o, options, sizeof o, who, "options", "rl_decode_options"));
    int64_t T = 0;
    RL_TRY(decode_checks(out, b, o.blank, o.beam, labels, cap, n, who, &T));
    if (o.lm == NULL) return decode_plain(out, b, T, o.blank, o.beam, labels, cap, n, who);
    const rl_lm *lm = o.lm;
    if (lm->search)
        return rl_error(RL_EARG,
                        "%s: options->lm was loaded for an attention decoder (rl_model_search), "
                        "not a CTC layer",
                        who);
    if (!finite_d(o.weight))
        return rl_error(RL_EARG, "%s: options->weight = %g is not a finite number", who, o.weight);
    if (!finite_d(o.bonus))
        return rl_error(RL_EARG, "%s: options->bonus = %g is not a finite number", who, o.bonus);
    if (out->dim != lm->V || o.blank != lm->blank)
        return rl_error(RL_ESHAPE,
                        "%s: out has %lld classes with blank %d (options->blank), the LM's model "
                        "%lld classes with blank %d: out is no output of that model's layer",
                        who, (long long)out->dim, (int)o.blank, (long long)lm->V, (int)lm->blank);
    RL_TRY(check_frames(out, b, T, who));
    int32_t *path = malloc(sizeof *path * (size_t)(T > 0 ? T : 1));
    if (path == NULL)
        return rl_error(RL_ENOMEM, "%s: no memory for %lld frames", who, (long long)T);
    lm_decode_args a = {.lm = lm,
                        .out = out,
                        .b = b,
                        .T = T,
                        .beam = o.beam,
                        .weight = o.weight,
                        .bonus = o.bonus,
                        .path = path,
                        .who = who};
    pthread_mutex_lock((pthread_mutex_t *)&lm->mu);
    int status = lua_cpcall_like(lm->L, lm_decode_protected, &a, NULL);
    rl_status st = RL_OK;
    if (status != LUA_OK) st = lua_failure(lm->L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
    lua_settop(lm->L, 0);
    pthread_mutex_unlock((pthread_mutex_t *)&lm->mu);
    if (st == RL_OK) st = put_labels(path, a.got, labels, cap, n, who);
    free(path);
    return st;
}

/* ---- attention decoding: rl_model_search ------------------------------------------------------
 * The beam search of an attention decoder (a rec layer with a choice in its unit) over one batch,
 * by rl.search's own search (net:search, lua/rnnlua/rec.lua) in the model's state: capi.lua's
 * Model:search. The results live in a userdata of the model's state, kept in its registry until
 * the next search replaces it. */

typedef struct {
    rl_model *m;
    const rl_batch *b;
    int beam;
    const rl_lm *lm;
    double weight, bonus;
    rl_hyps *out;
    const char *who;
} search_args;

static int search_protected(lua_State *L) {
    search_args *a = lua_touserdata(L, 1);
    const rl_batch *b = a->b;
    const rl_info *in = &a->m->info;
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->m->e.ref);
    lua_getfield(L, -1, "search");
    lua_insert(L, -2);
    int64_t shape[3] = {b->T, b->B, b->F};
    rl_tensor *x = rl_lua_push_tensor(L);
    if (rl_tensor_empty(x, in->input_sparse ? RL_INT32 : RL_FLOAT32, RL_DEVICE_CPU,
                        in->input_sparse ? 2 : 3, shape) != RL_OK)
        return rl_lua_raise(L, a->who);
    size_t n = (size_t)(b->T * b->B * (in->input_sparse ? 1 : b->F));
    memcpy(rl_tensor_data(x), in->input_sparse ? (const void *)b->classes : (const void *)b->x,
           n * (in->input_sparse ? sizeof(int32_t) : sizeof(float)));
    rl_tensor *len = rl_lua_push_tensor(L);
    if (rl_tensor_empty(len, RL_INT32, RL_DEVICE_CPU, 1, &shape[1]) != RL_OK)
        return rl_lua_raise(L, a->who);
    memcpy(rl_tensor_data(len), b->lengths, (size_t)b->B * sizeof(int32_t));
    if (a->beam > 0)
        lua_pushinteger(L, a->beam);
    else
        lua_pushnil(L);
    if (a->lm) /* the LM's table, copied from its state (the caller holds its lock) */
        copy_value(a->lm->L, -1, L, 0);
    else
        lua_pushnil(L);
    lua_pushnumber(L, a->weight);
    lua_pushnumber(L, a->bonus);
    lua_pushstring(L, a->who);
    lua_call(L, 8, 1);
    int res = lua_gettop(L);
    int64_t B = b->B, total = 0;
    for (int64_t i = 0; i < B; i++) {
        lua_rawgeti(L, res, i + 1);
        lua_getfield(L, -1, "labels");
        total += (int64_t)lua_rawlen(L, -1);
        lua_pop(L, 2);
    }
    /* offsets (B + 1) and scores (B), then the labels */
    size_t bytes = sizeof(int64_t) * (size_t)(B + 1) + sizeof(double) * (size_t)B +
                   sizeof(int32_t) * (size_t)(total > 0 ? total : 1);
    char *mem = lua_newuserdatauv(L, bytes, 0);
    lua_setfield(L, LUA_REGISTRYINDEX, "rl_model_search");
    int64_t *off = (int64_t *)mem;
    double *score = (double *)(off + B + 1);
    int32_t *labels = (int32_t *)(score + B);
    off[0] = 0;
    for (int64_t i = 0; i < B; i++) {
        lua_rawgeti(L, res, i + 1);
        lua_getfield(L, -1, "score");
        score[i] = lua_tonumber(L, -1);
        lua_getfield(L, -2, "labels");
        int64_t k = (int64_t)lua_rawlen(L, -1);
        for (int64_t j = 0; j < k; j++) {
            lua_rawgeti(L, -1, j + 1);
            labels[off[i] + j] = (int32_t)lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        off[i + 1] = off[i] + k;
        lua_pop(L, 3);
    }
    rl_hyps *h = a->out;
    h->B = B;
    h->labels = labels;
    h->offsets = off;
    h->scores = score;
    return 0;
}

rl_status rl_model_search(rl_model *model, const rl_batch *batch, const rl_search_options *options,
                          rl_hyps *out) {
    static const char who[] = "rl_model_search";
    if (model == NULL) return rl_error(RL_EARG, "%s: model is NULL", who);
    if (out == NULL) return rl_error(RL_EARG, "%s: out is NULL", who);
    if (out->size != sizeof *out)
        return rl_error(RL_EARG, "%s: out->size = %zu is not sizeof(rl_hyps) (%zu): set it so", who,
                        out->size, sizeof *out);
    rl_search_options o;
    RL_TRY(sized_struct(&o, sizeof o, options, sizeof o, who, "options", "rl_search_options"));
    if (o.beam < 0 || o.beam > 4096)
        return rl_error(RL_EARG,
                        "%s: options->beam = %d is out of range 0..4096 (0: the choice "
                        "layer's beam_size)",
                        who, o.beam);
    if (o.lm) {
        if (!o.lm->search)
            return rl_error(RL_EARG,
                            "%s: options->lm was loaded for a CTC layer, not an "
                            "attention decoder",
                            who);
        if (!finite_d(o.weight))
            return rl_error(RL_EARG, "%s: options->weight = %g is not a finite number", who,
                            o.weight);
        if (!finite_d(o.bonus))
            return rl_error(RL_EARG, "%s: options->bonus = %g is not a finite number", who,
                            o.bonus);
    }
    if (atomic_load(&model->freed)) return rl_error(RL_EARG, "%s: model: the model was freed", who);
    RL_TRY(check_batch(&model->info, batch, who, "batch", 0));
    search_args a = {.m = model,
                     .b = batch,
                     .beam = o.beam,
                     .lm = o.lm,
                     .weight = o.weight,
                     .bonus = o.bonus,
                     .out = out,
                     .who = who};
    /* the model's lock, then the LM's (rl_ctc_decode_lm takes the LM's alone) */
    pthread_mutex_lock(&model->mu);
    rl_status st = RL_OK;
    if (model->e.L == NULL) {
        st = rl_error(RL_EARG, "%s: model: the model was freed", who);
    } else {
        if (o.lm) {
            pthread_mutex_lock((pthread_mutex_t *)&o.lm->mu);
            lua_rawgeti(o.lm->L, LUA_REGISTRYINDEX, o.lm->ref);
        }
        int status = lua_cpcall_like(model->e.L, search_protected, &a, NULL);
        if (o.lm) {
            lua_settop(o.lm->L, 0);
            pthread_mutex_unlock((pthread_mutex_t *)&o.lm->mu);
        }
        if (status != LUA_OK)
            st = lua_failure(model->e.L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
        lua_settop(model->e.L, 0);
    }
    pthread_mutex_unlock(&model->mu);
    return st;
}

/* ---- batched pushes ----------------------------------------------------------------------- */

/* Streams pushed as one batch (rl_session_push_many) run in a network the model keeps for
 * batches (the runner: an engine like a session's, opened at the first batch), not in one of
 * the streams' sessions: its buffers keep their shapes from batch to batch, where a session's
 * would be made anew whenever it led a batch of another size (garbage that every Lua state of
 * the process would collect for). Each stream's carried state is copied (copy_rows, in C:
 * no tensor handle made a row) from its own state's tensors into its row of the batch's
 * (Model:batch_state), the batch goes through Model:run_many, and each stream's row of the final
 * states is copied into the stream's own state buffers (Model:own_state), so that it goes on
 * alone or in another batch. The batch is padded to a multiple of 8 streams (rows of one zero frame
 * that start from zeros, their outputs dropped), so that its size, and the runner's buffers,
 * change seldom while the streams of a server come and go. */
#define MANY_ROUND 8

/* The runner plan slot of batches of `rows` rows: one slot a size up to 128 streams (1, 8, 16,
 * .., 128), the last shared by the larger sizes. */
static int runner_slot(int64_t rows) {
    int64_t slot = rows == 1 ? 0 : rows / MANY_ROUND;
    return slot < RUNNER_PLANS - 1 ? (int)slot : RUNNER_PLANS - 1;
}

typedef struct {
    rl_session *const *s;
    const rl_batch *chunks;
    int n; /* streams */
    int sparse;
    engine *runner;
    const rl_batch *all; /* the chunks as one padded batch, stream i its sequence i */
    rl_output *outs;
    const char *who;
} many_args;

/* In a session's own state: the flat list of its states on top of the stack: what it carries
 * (Model:state) when `own` is NULL, else its own buffers made its carried state
 * (Model:own_state), which the batch's final states are copied into. */
static int state_protected(lua_State *L) {
    engine *e = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->ref);
    lua_getfield(L, -1, lua_touserdata(L, 2) ? "own_state" : "state");
    lua_insert(L, -2);
    lua_call(L, 1, 1);
    return 1;
}

/* Row `fr` of each tensor of the flat list at index fi of state F into row `tr` of the tensor
 * at the same place of the list at index ti of state T, with raw reads only (no Lua error);
 * 0 when the lists do not fit together (lengths, shapes, dtypes, a tensor not on the CPU or not
 * contiguous). */
static int copy_rows(lua_State *F, int fi, int64_t fr, lua_State *T, int ti, int64_t tr) {
    fi = lua_absindex(F, fi), ti = lua_absindex(T, ti);
    size_t n = lua_rawlen(F, fi);
    if (n != lua_rawlen(T, ti) || !lua_checkstack(F, 2) || !lua_checkstack(T, 2)) return 0;
    for (size_t j = 1; j <= n; j++) {
        lua_rawgeti(F, fi, (lua_Integer)j);
        const rl_tensor *a = rl_lua_to_tensor(F, -1);
        lua_pop(F, 1); /* the list keeps it */
        lua_rawgeti(T, ti, (lua_Integer)j);
        const rl_tensor *b = rl_lua_to_tensor(T, -1);
        lua_pop(T, 1);
        if (a == NULL || b == NULL || a->ndim != 2 || b->ndim != 2 || a->dtype != b->dtype ||
            a->shape[1] != b->shape[1] || fr >= a->shape[0] || tr >= b->shape[0] || !a->storage ||
            !b->storage || a->storage->device.type != RL_CPU || b->storage->device.type != RL_CPU ||
            !rl_tensor_is_contiguous(a) || !rl_tensor_is_contiguous(b))
            return 0;
        size_t row = (size_t)a->shape[1] * rl_dtype_size(a->dtype);
        memcpy((char *)rl_tensor_data(b) + (size_t)tr * row,
               (const char *)rl_tensor_data(a) + (size_t)fr * row, row);
    }
    return 1;
}

/* In the runner's state: the batch, each stream's outputs into its session's buffers; returns
 * the final states for the streams. */
static int many_protected(lua_State *L) {
    many_args *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->runner->ref); /* 2: the Model */
    lua_getfield(L, 2, "batch_state");
    lua_pushvalue(L, 2);
    lua_pushinteger(L, a->all->B);
    lua_call(L, 2, 1);               /* 3: the batch's states */
    for (int i = 0; i < a->n; i++) { /* the streams' states, left by state_protected */
        lua_State *SL = a->s[i]->e.L;
        if (a->s[i]->started && !copy_rows(SL, lua_gettop(SL), 0, L, 3, i))
            return luaL_error(L, "%s: sessions[%d]: its carried state does not fit the batch's",
                              a->who, i);
    }
    lua_getfield(L, 2, "run_many");
    lua_pushvalue(L, 2);
    push_input(L, a->all, a->sparse, a->who);
    lua_createtable(L, (int)a->all->B, 0); /* state_from: a padding row, a stream that starts: 0 */
    for (int i = 0; i < a->all->B; i++) {
        lua_pushinteger(L, i < a->n && a->s[i]->started ? i + 1 : 0);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushstring(L, a->who);
    lua_call(L, 5, 3);
    const rl_tensor *out = rl_lua_to_tensor(L, -3), *og = rl_lua_to_tensor(L, -2);
    if (out == NULL || og == NULL || out->ndim != 3 || og->ndim != 1 ||
        out->shape[1] != a->all->B || og->shape[0] != a->all->B || og->dtype != RL_INT32 ||
        out->shape[0] < a->all->T)
        return luaL_error(L, "%s: the network gave no sequence output", a->who);
    const float *y = rl_tensor_data(out);
    const int32_t *ol = rl_tensor_data(og);
    int64_t n = a->all->B, D = out->shape[2];
    for (int64_t i = 0; i < a->n; i++) { /* stream i: frames t < T of row i */
        engine *e = &a->s[i]->e;
        int64_t T = a->chunks[i].T;
        engine_reserve(L, e, (size_t)(T * D), 1, a->who);
        e->len[0] = ol[i] < T ? ol[i] : (int32_t)T;
        for (int64_t t = 0; t < T; t++) {
            float *row = e->y + t * D;
            if (t < e->len[0])
                memcpy(row, y + (t * n + i) * D, (size_t)D * sizeof *row);
            else
                memset(row, 0, (size_t)D * sizeof *row);
        }
        a->outs[i] = (rl_output){.y = e->y, .lengths = e->len, .T = T, .B = 1, .dim = D};
    }
    return 1; /* the final states */
}

/* rl_session_push_many of a model whose pushes run in C (run_mu held, the runner open): each
 * stream's state (its session's plan states) copied into its row of the runner's, the batch
 * through the runner's plan, each row's final state copied back, with no Lua call once the
 * sessions and the runner (for this number of rows) have their plans. */
static rl_status many_in_c(rl_session *const *ss, const rl_batch *chunks, int n, int64_t rows,
                           int64_t T, rl_output *outs, const char *who) {
    rl_model *m = ss[0]->model;
    int slot = runner_slot(rows);
    if (m->runner_cp[slot] == NULL) {
        m->runner_cp[slot] = calloc(1, sizeof *m->runner_cp[slot]);
        if (m->runner_cp[slot] == NULL) return rl_error(RL_ENOMEM, "%s: no memory", who);
        m->runner_cp[slot]->ref = LUA_NOREF;
    }
    c_push *r = m->runner_cp[slot];
    if (r->ref != LUA_NOREF && r->rows != rows) { /* the last slot's: another size, anew */
        luaL_unref(m->runner.L, LUA_REGISTRYINDEX, r->ref);
        r->ref = LUA_NOREF;
    }
    RL_TRY(take_plan(&m->runner, r, rows, who));
    r->rows = rows;
    for (int i = 0; i < n; i++) {
        RL_TRY(take_plan(&ss[i]->e, &ss[i]->cp, 0, who));
        if (ss[i]->cp.n != r->n)
            return rl_error(RL_EARG, "%s: sessions[%d]: its network does not fit the batch's", who,
                            i);
    }
    RL_TRY(plan_input(r, &m->info, chunks, n, rows, T));
    /* row i starts from stream i's state, zeros where the stream starts or the row pads */
    for (int k = 0; k < r->n; k++)
        for (int q = 0; q < r->nodes[k].n_states; q++) {
            int64_t dim = r->nodes[k].sdim[q];
            float *rowq = r->nodes[k].sdata[q];
            for (int64_t i = 0; i < rows; i++) {
                float *dst = rowq + i * dim;
                if (i < n && ss[i]->started && ss[i]->cp.nodes[k].n_states > q)
                    memcpy(dst, session_state(ss[i], k, q), (size_t)dim * sizeof *dst);
                else
                    memset(dst, 0, (size_t)dim * sizeof *dst);
            }
        }
    /* each row's final state goes straight to its stream's buffers (a batch that fails ends
     * its streams, whatever those hold then) */
    rl_status st = plan_forward(r, 1, ss, n);
    if (st != RL_OK) st = network_failure(st, who);
    const rl_tensor *y = NULL;
    if (st == RL_OK) st = plan_output(r, T, rows, &y, who);
    for (int i = 0; i < n && st == RL_OK; i++)
        st = out_reserve(&ss[i]->e, (size_t)(chunks[i].T * y->shape[2]), who);
    if (st != RL_OK) { /* the batch failed inside the network: its streams end */
        for (int i = 0; i < n; i++)
            ss[i]->started = 0;
        return st;
    }
    const float *yd = rl_tensor_data(y);
    int64_t D = y->shape[2];
    for (int i = 0; i < n; i++) { /* stream i: frames t < its T of row i */
        engine *e = &ss[i]->e;
        for (int64_t t = 0; t < chunks[i].T; t++)
            memcpy(e->y + t * D, yd + (t * rows + i) * D, (size_t)D * sizeof *yd);
        e->len[0] = (int32_t)chunks[i].T;
        outs[i] = (rl_output){.y = e->y, .lengths = e->len, .T = chunks[i].T, .B = 1, .dim = D};
        ss[i]->started = 1;
    }
    return RL_OK;
}

rl_status rl_session_push_many(rl_session *const *sessions, const rl_batch *chunks, int n,
                               rl_output *outs) {
    static const char who[] = "rl_session_push_many";
    if (sessions == NULL) return rl_error(RL_EARG, "%s: sessions is NULL", who);
    if (chunks == NULL) return rl_error(RL_EARG, "%s: chunks is NULL", who);
    if (outs == NULL) return rl_error(RL_EARG, "%s: outs is NULL", who);
    if (n < 1 || n > 65536) return rl_error(RL_EARG, "%s: n = %d is out of range 1..65536", who, n);
    for (int i = 0; i < n; i++) {
        const rl_session *s = sessions[i];
        if (s == NULL) return rl_error(RL_EARG, "%s: sessions[%d] is NULL", who, i);
        if (atomic_load(&s->model->freed))
            return rl_error(RL_EARG,
                            "%s: sessions[%d]: the model was freed (rl_model_free) while the "
                            "session was open; free the session",
                            who, i);
        if (s->model != sessions[0]->model)
            return rl_error(RL_EARG,
                            "%s: sessions[%d] is a session of another model (%s) than "
                            "sessions[0] (%s): one batch runs one model",
                            who, i, s->model->path, sessions[0]->model->path);
        if (strcmp(s->precision, sessions[0]->precision) != 0)
            return rl_error(RL_EARG,
                            "%s: sessions[%d] runs in %s, sessions[0] in %s (opened before and "
                            "after rl_model_set_precision): one batch runs one precision",
                            who, i, s->precision, sessions[0]->precision);
        for (int k = 0; k < i; k++)
            if (sessions[k] == s)
                return rl_error(RL_EARG,
                                "%s: sessions[%d] and sessions[%d] are the same session: a "
                                "stream pushes one chunk at a time",
                                who, k, i);
    }
    const rl_info *in = &sessions[0]->model->info;
    if (!in->causal)
        return rl_error(RL_EARG, "%s: the model of %s cannot stream: %s", who,
                        sessions[0]->model->path, in->not_causal);
    int64_t T = 0, F = in->input_sparse ? 1 : in->input_dim;
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "chunks[%d]", i);
        RL_TRY(check_batch(in, &chunks[i], who, arg, 1));
        if (chunks[i].T > T) T = chunks[i].T;
    }
    int64_t rows = n == 1 ? 1 : (n + MANY_ROUND - 1) / MANY_ROUND * MANY_ROUND;
    if (T * rows > ((int64_t)1 << 40) / F)
        return rl_error(RL_ESHAPE, "%s: %lld x %d frames is too large", who, (long long)T, n);
    rl_model *m = sessions[0]->model;
    pthread_mutex_lock(&m->run_mu);
    rl_status st = RL_OK;
    if (m->runner.L && strcmp(m->runner_precision, sessions[0]->precision) != 0)
        runner_close(m); /* the model's precision changed since: a runner of theirs */
    if (m->runner.L == NULL) {
        st = engine_open(&m->runner, NULL, m, who, NULL);
        if (st == RL_OK && strcmp(m->precision, sessions[0]->precision) != 0) {
            runner_close(m);
            st = rl_error(RL_EARG,
                          "%s: sessions: opened in %s, but the model runs in %s now "
                          "(rl_model_set_precision): reopen the sessions",
                          who, sessions[0]->precision, m->precision);
        }
        memcpy(m->runner_precision, sessions[0]->precision, sizeof m->runner_precision);
    }
    if (st != RL_OK || !m->push_lua) {
        if (st == RL_OK) st = many_in_c(sessions, chunks, n, rows, T, outs, who);
        pthread_mutex_unlock(&m->run_mu);
        return st;
    }
    /* the chunks as one padded batch, time-major; padding rows: one frame of zeros */
    size_t esz = in->input_sparse ? sizeof(int32_t) : sizeof(float);
    char *x = calloc((size_t)(T * rows * F), esz);
    int32_t *lengths = malloc(sizeof *lengths * (size_t)rows);
    if (x == NULL || lengths == NULL) {
        free(x), free(lengths);
        pthread_mutex_unlock(&m->run_mu);
        return rl_error(RL_ENOMEM, "%s: no memory for %lld x %d frames", who, (long long)T, n);
    }
    for (int64_t i = 0; i < rows; i++) {
        if (i >= n) {
            lengths[i] = 1;
            continue;
        }
        const rl_batch *c = &chunks[i];
        const char *src = in->input_sparse ? (const char *)c->classes : (const char *)c->x;
        lengths[i] = (int32_t)c->T;
        for (int64_t t = 0; t < c->T; t++)
            memcpy(x + (size_t)((t * rows + i) * F) * esz, src + (size_t)(t * F) * esz,
                   (size_t)F * esz);
    }
    rl_batch all = {.T = T,
                    .B = rows,
                    .F = F,
                    .x = in->input_sparse ? NULL : (const float *)x,
                    .classes = in->input_sparse ? (const int32_t *)x : NULL,
                    .lengths = lengths};
    /* the streams' states, each on top of its own state's stack */
    for (int i = 0; i < n && st == RL_OK; i++) {
        lua_State *SL = sessions[i]->e.L;
        if (!sessions[i]->started) continue;
        lua_pushcfunction(SL, state_protected);
        lua_pushlightuserdata(SL, &sessions[i]->e);
        lua_pushlightuserdata(SL, NULL);
        int status = lua_pcall(SL, 2, 1, 0);
        if (status != LUA_OK) st = lua_failure(SL, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
    }
    lua_State *L = m->runner.L;
    if (st == RL_OK) {
        many_args a = {.s = sessions,
                       .chunks = chunks,
                       .n = n,
                       .sparse = in->input_sparse,
                       .runner = &m->runner,
                       .all = &all,
                       .outs = outs,
                       .who = who};
        lua_settop(L, 0); /* the final states at index 1 */
        lua_pushcfunction(L, many_protected);
        lua_pushlightuserdata(L, &a);
        int status = lua_pcall(L, 1, 1, 0);
        if (status != LUA_OK) st = lua_failure(L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
    }
    for (int i = 0; i < n; i++)
        lua_settop(sessions[i]->e.L, 0);
    free(x);
    free(lengths);
    /* each stream takes its row of the final states */
    for (int i = 0; i < n && st == RL_OK; i++) {
        lua_State *SL = sessions[i]->e.L;
        lua_pushcfunction(SL, state_protected);
        lua_pushlightuserdata(SL, &sessions[i]->e);
        lua_pushlightuserdata(SL, sessions[i]); /* any non-NULL: its own buffers */
        int status = lua_pcall(SL, 2, 1, 0);
        if (status == LUA_OK && !copy_rows(L, 1, i, SL, -1, 0)) {
            lua_pushfstring(SL, "sessions[%d]: the batch's states do not fit its own", i);
            status = LUA_ERRRUN;
        }
        sessions[i]->started = status == LUA_OK;
        if (status != LUA_OK) {
            char msg[512];
            rl_status s2 =
                lua_failure(sessions[i]->e.L, status == LUA_ERRMEM ? RL_ENOMEM : RL_EARG, who);
            snprintf(msg, sizeof msg, "%s", rl_errmsg());
            st = rl_error(s2, "%s (sessions[%d]: its stream ended)", msg, i);
            for (int k = i + 1; k < n; k++) /* their states were not taken */
                sessions[k]->started = 0;
        }
        lua_settop(sessions[i]->e.L, 0);
    }
    if (L) lua_settop(L, 0);
    pthread_mutex_unlock(&m->run_mu);
    return st;
}
