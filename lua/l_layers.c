/* The Lua face of the C layers: a Layer userdata per rl_layer, made by the network builder
 * (lua/rnnlua/network.lua) through rl._layer_new, and the C helpers Lua-side layers share.
 *
 *   rl._layer_new(class, name, desc, in_dims) -> layer, read
 *       creates a layer of a registered C class; its options are read from the description
 *       table `desc`, and `read` is the set of keys the layer asked for, so that the caller
 *       can report every other key as an unknown option (one rule for C and Lua layers).
 *   layer:params()                     -> {{name=, shape=Size, numel=, init=, ...}, ...}
 *   layer:bind(values, grads, offset)  -> offset after the layer's parameters; each param
 *       becomes a view of the flat 1-D buffers at a 0-based element offset (shares storage)
 *   layer:init_params()                initialises the bound params in order (seeded RNG)
 *   layer:forward(inputs, lengths, train [, target [, target_lengths]])
 *       -> out [, loss, n_errors, n_frames, n_labels, n_skipped] (layer.h: rl_layer_io)
 *       out is a view of the layer's own output buffer: the next forward overwrites it.
 *       The inputs stay referenced by the layer until the next forward, for backward.
 *       For a class taking images (RL_LAYER_IN_2D) `lengths` is the (B, 2) int32 sizes
 *       tensor, given to the layer as io->sizes (a (B) tensor is io->lengths).
 *   layer:_forward_queue(inputs, lengths, train [, target]) and
 *   layer:_backward_queue(grad_out | nil, grad_in) check their arguments as forward and
 *       backward do and queue the call; layer:_wait() runs every queued call at once, one part
 *       each of the helper pool (kernels/cpu/parallel.h: the caller runs one, the pool's
 *       helpers the others), if it has not run yet, and returns what this layer's forward or
 *       backward returns (or raises its error, which names the layer). The queued layers must
 *       share no buffer (the network queues the two directions of a bidirectional LSTM pair);
 *       while they run, BLAS and the kernels use one thread each. On one thread
 *       (rl.set_num_threads(1)) they run one after the other. Touching a queued layer before
 *       its _wait is an error; garbage collection drops it from the queue. The pool's
 *       helpers run the parts, not threads created per call: those would add a thread
 *       creation per call and a third thread beside the helper on two cores.
 *   layer:out_geometry() -> the (B, 2) sizes of a conv2d/pool2d output or the (B) lengths of a
 *       collapse/global_pool output after a forward (a view of the layer's buffer), or nil for
 *       layers whose output keeps its inputs' sizes or lengths
 *   rl._layer_class_flags(class) -> RL_LAYER_* flags of a C class (1 = takes images, 2 = gives
 *       images, 4 = any rank), or nil for a class that is not a C class
 *
 * Pair options (filter_size = {fh, fw}, strides, pool_size) reach C as the numbers "KEY[1]" and
 * "KEY[2]" (rl_opt_pair): the description may give KEY = {a, b} or KEY = n for both. Options
 * with named fields (zoneout = {cell = a, hidden = b}) reach C as "KEY.FIELD"; KEY = n gives n
 * to every field, and a field no layer read is an unknown option (layers.lua).
 *   layer:backward(grad_out | nil, grad_in)  grad_in: one entry per input, a tensor shaped
 *       like that input (written with `=`) or false; parameter gradients are added (`+=`)
 *   fields: name, class, n_out, n_in, in_dims, is_loss, num_params
 *   recurrent state (layer.h, rl_state_ops; any class that has it, empty for the others):
 *         layer:state_names() -> {"h", "c"}, {dims} (the first state is the output),
 *         layer:set_initial_state(s1, s2, ... | nil), layer:final_state() -> s1, s2, ...,
 *         layer:initial_state_grad() -> g1, g2, ... (after backward),
 *         layer:set_final_state_grad(g1, g2, ... | nil) (where backward starts; rec units); one
 *         (B, dim) tensor per state in state_names order, nil or left out: zeros
 *   recurrent layers (layers/recurrent.h): layer:_share_packs(owner), layer:_set_pack_pass(n)
 *         (rec units: the step objects' packed weights, built once per pass; layers/layers.h),
 *         layer:_pack_count() -> n (the operands packed so far, for tests),
 *         layer:_set_zero_inputs(mask) (bit k: input k is all zeros in the following forwards;
 *         its products are skipped), layer:_set_gates(t | nil) (t (T, B, layer:_gates_cols()):
 *         the gates buffer from the next forward on; backward then leaves the weight gradients
 *         to the caller), layer:_weight_grads(k, x, dz) (W_k's gradient (k = 0: U's) += x^T dz
 *         over the rows of x and dz; both in layers/layers.h)
 *   rl._layer_classes()                -> the C class names
 *   rl._param_init(t, kind, a, fan_in, fan_out)  the C initialisers, for Lua layers
 *   rl._loss_mse(out, target, lengths [, grad]) -> loss, n_frames (grad written with `=`)
 *
 * Errors from C already name the layer; they are raised as they are. The userdata is pushed
 * before the layer is created, so a failure leaves nothing behind; __gc frees the layer,
 * which releases its views of the network's flat buffers. */
#include "l_layers.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

#include "../core/blas.h"
#include "../core/rng.h"
#include "../kernels/cpu/parallel.h"
#include "../layers/layer.h"
#include "../layers/layers.h"
#include "../layers/loss.h"
#include "l_tensor.h"

typedef struct {
    rl_layer *layer;
    rl_layer_io io; /* of the last forward; its tensors point into kept_* */
    /* shares of the last forward's inputs, lengths (or sizes), target and target lengths: a
     * batch tensor its caller closes (<close>) between forward and backward releases only
     * the caller's view, not what the backward reads (which then found an unset tensor) */
    rl_tensor kept_in[RL_LAYER_MAX_INPUTS], kept_len, kept_target, kept_tlen;
    bool forwarded; /* a forward succeeded and its backward has not run yet */
    /* a forward or backward queued (_forward_queue, _backward_queue) and not yet waited for;
     * ran: it has run (its status and message are set) */
    bool queued, ran, run_backward;
    const rl_tensor *gout;
    rl_tensor *gin[RL_LAYER_MAX_INPUTS];
    rl_status status;
    char err[512]; /* the message of its error (messages are per thread) */
} layer_ud;

/* The calls queued and not yet run: at most one per layer; a network queues two. */
#define MAX_QUEUED 8
static layer_ud *queue[MAX_QUEUED];
static int n_queued;

static int raise_plain(lua_State *L) {
    lua_pushstring(L, rl_errmsg());
    return lua_error(L);
}

/* Pushes msg about layer `name` of class `cls` in the one form a message names a layer,
 * RL_LAYER_WHERE ": what": the layer code's "layer 'name': " or "layer 'name' (...): " at its
 * start is replaced, a message that names no layer gets it in front. */
static const char *push_layer_msg(lua_State *L, const char *name, const char *cls,
                                  const char *msg) {
    size_t n = strlen(name);
    const char *rest = msg;
    if (strncmp(msg, "layer '", 7) == 0 && strncmp(msg + 7, name, n) == 0 && msg[7 + n] == '\'') {
        const char *p = msg + 8 + n;
        const char *close = p[0] == ' ' && p[1] == '(' ? strstr(p, "): ") : NULL;
        if (p[0] == ':' && p[1] == ' ')
            rest = p + 2;
        else if (close != NULL)
            rest = close + 3;
    }
    return lua_pushfstring(L, RL_LAYER_WHERE ": %s", name, cls, rest);
}

/* Raises the error just set by a call on a layer named name of class cls. */
static int raise_named(lua_State *L, const char *name, const char *cls) {
    push_layer_msg(L, name, cls, rl_errmsg());
    return lua_error(L);
}

static const char *class_of(const rl_layer *l) { return l->ops->class_name; }

/* Raises the error just set by a call on layer l (push_layer_msg). */
static int raise_layer(lua_State *L, const rl_layer *l) {
    return raise_named(L, l->name, class_of(l));
}

static void run_queued(layer_ud *ud) {
    rl_layer *l = ud->layer;
    ud->status = ud->run_backward ? l->ops->backward(l, &ud->io, ud->gout, ud->gin)
                                  : l->ops->forward(l, &ud->io);
    if (ud->status != RL_OK) snprintf(ud->err, sizeof ud->err, "%s", rl_errmsg());
    ud->ran = true;
}

static void queue_part(void *ctx, int part, int parts) { run_queued(((layer_ud **)ctx)[part]); }

/* Runs every queued call, one part of the pool each, with one BLAS thread per part; the thread
 * count is restored after. */
static void run_queue(void) {
    layer_ud *run[MAX_QUEUED];
    int n = n_queued, threads = rl_blas_get_threads();
    memcpy(run, queue, sizeof run);
    n_queued = 0;
    rl_blas_set_threads(1);
    if (threads > 1 && n > 1) {
        rl_cpu_parallel(n, queue_part, run);
    } else {
        for (int i = 0; i < n; i++)
            run_queued(run[i]);
    }
    rl_blas_set_threads(threads);
}

/* Before the arguments are checked (backward_prepare consumes the forward). */
static void check_queue_room(lua_State *L) {
    if (n_queued == MAX_QUEUED)
        luaL_error(L,
                   "layer:_forward_queue/_backward_queue: %d calls are queued already "
                   "(layer:_wait() runs them)",
                   MAX_QUEUED);
}

static void queue_call(layer_ud *ud, bool backward) {
    ud->run_backward = backward;
    ud->queued = true;
    ud->ran = false;
    queue[n_queued++] = ud;
}

/* Runs the queue if ud's call has not run, and ends ud's call; returns its status, the
 * message set on this thread. */
static rl_status wait_call(layer_ud *ud) {
    if (!ud->queued) return RL_OK;
    if (!ud->ran) run_queue();
    ud->queued = false;
    if (ud->status != RL_OK) return rl_error(ud->status, "%s", ud->err);
    return RL_OK;
}

/* Drops ud's call from the queue if it has not run (the layer is being freed). */
static void drop_call(layer_ud *ud) {
    for (int i = 0; i < n_queued; i++) {
        if (queue[i] != ud) continue;
        memmove(queue + i, queue + i + 1, (size_t)(n_queued - i - 1) * sizeof *queue);
        n_queued--;
        break;
    }
    ud->queued = false;
}

rl_layer *rl_lua_to_layer(lua_State *L, int idx) {
    layer_ud *ud = luaL_testudata(L, idx, RL_LAYER_MT);
    return ud && !ud->queued ? ud->layer : NULL;
}

static layer_ud *check_layer(lua_State *L, int idx) {
    layer_ud *ud = luaL_checkudata(L, idx, RL_LAYER_MT);
    if (!ud->layer) luaL_error(L, "layer: the layer has been freed");
    if (ud->queued)
        luaL_error(L, RL_LAYER_WHERE ": a forward or backward of it is queued (layer:_wait())",
                   ud->layer->name, class_of(ud->layer));
    return ud;
}

/* ---------------------------------------------------------------- options over a table */

typedef struct {
    lua_State *L;
    int desc; /* stack index of the description table */
    int read; /* stack index of the set of keys read */
    const char *layer;
    const char *cls;
} opts_ctx;

/* Pushes desc[key] (raw: a description is plain data) and records the key as read. A key
 * "NAME[i]" (i = 1, 2) reads element i of a table desc.NAME, or desc.NAME itself when it is a
 * number, and records NAME. A key "NAME.FIELD" reads desc.NAME.FIELD of a table desc.NAME, or
 * desc.NAME itself when it is not a table (zoneout = z for every field), and records FIELD in
 * the set read[NAME]. */
static int opt_get(opts_ctx *c, const char *key) {
    const char *br = strchr(key, '[');
    if (br && (br[1] == '1' || br[1] == '2') && br[2] == ']' && br[3] == '\0') {
        lua_pushlstring(c->L, key, (size_t)(br - key));
        lua_pushvalue(c->L, -1);
        lua_pushboolean(c->L, 1);
        lua_rawset(c->L, c->read);
        int t = lua_rawget(c->L, c->desc);
        if (t != LUA_TTABLE) return t;
        if (luaL_len(c->L, -1) != 2) {
            lua_pop(c->L, 1);
            lua_pushliteral(c->L, "a table of other than 2 numbers");
            return LUA_TSTRING;
        }
        t = lua_rawgeti(c->L, -1, br[1] - '0');
        lua_remove(c->L, -2);
        return t;
    }
    const char *dot = strchr(key, '.');
    if (dot) {
        /* read[NAME] = the set of fields read, so that layers.lua reports the others */
        lua_pushlstring(c->L, key, (size_t)(dot - key));
        if (lua_rawget(c->L, c->read) != LUA_TTABLE) {
            lua_pop(c->L, 1);
            lua_newtable(c->L);
            lua_pushlstring(c->L, key, (size_t)(dot - key));
            lua_pushvalue(c->L, -2);
            lua_rawset(c->L, c->read);
        }
        lua_pushboolean(c->L, 1);
        lua_setfield(c->L, -2, dot + 1);
        lua_pop(c->L, 1);
        lua_pushlstring(c->L, key, (size_t)(dot - key));
        int t = lua_rawget(c->L, c->desc);
        if (t != LUA_TTABLE) return t;
        t = lua_getfield(c->L, -1, dot + 1);
        lua_remove(c->L, -2);
        return t;
    }
    lua_pushboolean(c->L, 1);
    lua_setfield(c->L, c->read, key);
    lua_pushstring(c->L, key);
    return lua_rawget(c->L, c->desc);
}

static rl_status opt_type_error(opts_ctx *c, const char *key, const char *want) {
    rl_status st = rl_error(RL_EARG, RL_LAYER_WHERE ": option %s must be %s, got %s", c->layer,
                            c->cls, key, want, luaL_typename(c->L, -1));
    lua_pop(c->L, 1);
    return st;
}

static rl_status opt_number(void *ctx, const char *key, double *v, int *found) {
    opts_ctx *c = ctx;
    int t = opt_get(c, key);
    *found = 0;
    if (t == LUA_TNIL) {
        lua_pop(c->L, 1);
        return RL_OK;
    }
    if (t != LUA_TNUMBER) return opt_type_error(c, key, "a number");
    *v = lua_tonumber(c->L, -1);
    *found = 1;
    lua_pop(c->L, 1);
    return RL_OK;
}

/* The string stays valid while the description table lives, i.e. during create: a layer
 * that keeps an option string copies it. */
static rl_status opt_string(void *ctx, const char *key, const char **v, int *found) {
    opts_ctx *c = ctx;
    int t = opt_get(c, key);
    *found = 0;
    if (t == LUA_TNIL) {
        lua_pop(c->L, 1);
        return RL_OK;
    }
    if (t != LUA_TSTRING) return opt_type_error(c, key, "a string");
    *v = lua_tostring(c->L, -1);
    *found = 1;
    lua_pop(c->L, 1);
    return RL_OK;
}

static rl_status opt_boolean(void *ctx, const char *key, bool *v, int *found) {
    opts_ctx *c = ctx;
    int t = opt_get(c, key);
    *found = 0;
    if (t == LUA_TNIL) {
        lua_pop(c->L, 1);
        return RL_OK;
    }
    if (t != LUA_TBOOLEAN) return opt_type_error(c, key, "a boolean");
    *v = lua_toboolean(c->L, -1);
    *found = 1;
    lua_pop(c->L, 1);
    return RL_OK;
}

/* ---------------------------------------------------------------- creation */

/* rl._layer_new(class, name, desc, in_dims) -> layer, read */
static int l_layer_new(lua_State *L) {
    const char *cls = luaL_checkstring(L, 1);
    const char *name = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    luaL_checktype(L, 4, LUA_TTABLE);
    lua_settop(L, 4);
    lua_Integer n = luaL_len(L, 4);
    if (n > RL_LAYER_MAX_INPUTS)
        return luaL_error(L, RL_LAYER_WHERE ": %d inputs, at most %d are supported", name, cls,
                          (int)n, RL_LAYER_MAX_INPUTS);
    int64_t dims[RL_LAYER_MAX_INPUTS];
    for (lua_Integer i = 0; i < n; i++) {
        lua_geti(L, 4, i + 1);
        int isnum;
        lua_Integer d = lua_tointegerx(L, -1, &isnum);
        if (!isnum || d < 1)
            return luaL_error(L, RL_LAYER_WHERE ": input dim %d must be a positive integer", name,
                              cls, (int)i + 1);
        dims[i] = d;
        lua_pop(L, 1);
    }
    rl_lua_collect_if_needed(L); /* a layer's weights and workspaces are storages too */
    lua_newtable(L);             /* 5: keys read */
    layer_ud *ud = lua_newuserdatauv(L, sizeof *ud, 1);
    memset(ud, 0, sizeof *ud);
    luaL_setmetatable(L, RL_LAYER_MT);
    lua_newtable(L);
    lua_setiuservalue(L, -2, 1);
    opts_ctx c = {L, 3, 5, name, cls};
    rl_options o = {&c, opt_number, opt_string, opt_boolean, NULL};
    if (rl_layer_create(&ud->layer, cls, name, &o, (int)n, dims) != RL_OK)
        return raise_named(L, name, cls);
    lua_pushvalue(L, 5);
    return 2;
}

static int l_layer_classes(lua_State *L) {
    const char *const *names = rl_layer_classes();
    lua_newtable(L);
    for (int i = 0; names[i]; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* ---------------------------------------------------------------- parameters */

static const struct {
    const char *name;
    rl_init_kind kind;
} init_kinds[] = {
    {"zeros", RL_INIT_ZEROS},   {"constant", RL_INIT_CONSTANT}, {"uniform", RL_INIT_UNIFORM},
    {"normal", RL_INIT_NORMAL}, {"glorot", RL_INIT_GLOROT},     {"orthogonal", RL_INIT_ORTHOGONAL},
};
#define N_INIT_KINDS (sizeof init_kinds / sizeof init_kinds[0])

static const char *init_name(rl_init_kind k) {
    for (size_t i = 0; i < N_INIT_KINDS; i++)
        if (init_kinds[i].kind == k) return init_kinds[i].name;
    return "?";
}

static void push_shape(lua_State *L, int ndim, const int64_t *shape) {
    lua_createtable(L, ndim, 0);
    for (int d = 0; d < ndim; d++) {
        lua_pushinteger(L, shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    luaL_setmetatable(L, "rnnlua.Size");
}

static int64_t param_numel(const rl_param *p) {
    int64_t k = 1;
    for (int d = 0; d < p->ndim; d++)
        k *= p->shape[d];
    return k;
}

static int m_params(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    lua_createtable(L, l->n_params, 0);
    for (int i = 0; i < l->n_params; i++) {
        const rl_param *p = &l->params[i];
        lua_createtable(L, 0, 7);
        lua_pushstring(L, p->name);
        lua_setfield(L, -2, "name");
        push_shape(L, p->ndim, p->shape);
        lua_setfield(L, -2, "shape");
        lua_pushinteger(L, param_numel(p));
        lua_setfield(L, -2, "numel");
        lua_pushstring(L, init_name(p->init));
        lua_setfield(L, -2, "init");
        lua_pushnumber(L, p->init_a);
        lua_setfield(L, -2, "init_scale");
        lua_pushinteger(L, p->fan_in);
        lua_setfield(L, -2, "fan_in");
        lua_pushinteger(L, p->fan_out);
        lua_setfield(L, -2, "fan_out");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static void check_flat(lua_State *L, const rl_layer *l, const rl_tensor *t, const char *what) {
    char s[160];
    if (t->ndim != 1 || !rl_tensor_is_contiguous(t) || t->dtype == RL_INT32)
        luaL_error(L,
                   RL_LAYER_WHERE ": bind: the %s must be a contiguous 1-D float tensor, "
                                  "got %s",
                   l->name, class_of(l), what, rl_tensor_describe(t, s, sizeof s));
}

/* Makes *dst a (shape) view of flat[off : off + numel(shape)]. */
static rl_status flat_view(rl_tensor *dst, const rl_tensor *flat, int64_t off, const rl_param *p) {
    rl_tensor part = {0};
    RL_TRY(rl_tensor_narrow(&part, flat, 0, off, param_numel(p)));
    rl_status st = rl_tensor_view(dst, &part, p->ndim, p->shape);
    rl_tensor_release(&part);
    return st;
}

/* layer:bind(values, grads, offset) -> offset after this layer's parameters */
static int m_bind(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    rl_tensor *v = rl_lua_check_tensor(L, 2), *g = rl_lua_check_tensor(L, 3);
    lua_Integer off = luaL_checkinteger(L, 4);
    check_flat(L, l, v, "parameter buffer");
    check_flat(L, l, g, "gradient buffer");
    if (v->dtype != g->dtype || v->shape[0] != g->shape[0])
        return luaL_error(L, RL_LAYER_WHERE ": bind: parameter and gradient buffers differ",
                          l->name, class_of(l));
    if (off < 0 || off + rl_layer_num_params(l) > v->shape[0])
        return luaL_error(
            L, RL_LAYER_WHERE ": bind: %I parameters at offset %I do not fit a buffer of %I",
            l->name, class_of(l), (lua_Integer)rl_layer_num_params(l), off,
            (lua_Integer)v->shape[0]);
    for (int i = 0; i < l->n_params; i++) {
        rl_param *p = &l->params[i];
        rl_tensor nv = {0}, ng = {0};
        if (flat_view(&nv, v, off, p) != RL_OK || flat_view(&ng, g, off, p) != RL_OK) {
            rl_tensor_release(&nv);
            return raise_layer(L, l);
        }
        rl_tensor_release(&p->value);
        rl_tensor_release(&p->grad);
        p->value = nv;
        p->grad = ng;
        off += param_numel(p);
    }
    lua_pushinteger(L, off);
    return 1;
}

static int m_init_params(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    for (int i = 0; i < l->n_params; i++)
        if (!l->params[i].value.storage)
            return luaL_error(L, RL_LAYER_WHERE ": init_params before bind", l->name, class_of(l));
    if (rl_layer_init_params(l, rl_rng_default()) != RL_OK) {
        return raise_layer(L, l);
    }
    /* written without a tensor handle: what was derived from the values is stale */
    for (int i = 0; i < l->n_params; i++)
        rl_storage_touch(l->params[i].value.storage);
    return 0;
}

/* rl._param_init(t, kind, a, fan_in, fan_out [, name]): the C initialisers for any tensor */
static int l_param_init(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    const char *kind = luaL_checkstring(L, 2);
    rl_param p;
    memset(&p, 0, sizeof p);
    size_t k = 0;
    while (k < N_INIT_KINDS && strcmp(init_kinds[k].name, kind) != 0)
        k++;
    if (k == N_INIT_KINDS)
        return luaL_error(L,
                          "param_init: unknown init '%s' (known: zeros, constant, uniform, "
                          "normal, glorot, orthogonal)",
                          kind);
    p.init = init_kinds[k].kind;
    p.init_a = luaL_optnumber(L, 3, 1.0);
    p.fan_in = luaL_optinteger(L, 4, 0);
    p.fan_out = luaL_optinteger(L, 5, 0);
    snprintf(p.name, sizeof p.name, "%s", luaL_optstring(L, 6, "param"));
    /* a borrowed view: p is not released, the userdata keeps owning t */
    p.value = *t;
    p.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++)
        p.shape[d] = t->shape[d];
    if (rl_param_init(&p, rl_rng_default()) != RL_OK) return raise_plain(L);
    return 0;
}

/* ---------------------------------------------------------------- forward and backward */

/* *slot becomes a share of t (the slot's last one dropped); returns the slot, NULL for no t */
static const rl_tensor *keep(rl_tensor *slot, const rl_tensor *t) {
    rl_tensor_release(slot);
    if (!t) return NULL;
    rl_tensor_share(slot, t);
    return slot;
}

static void drop_kept(layer_ud *ud) {
    for (int i = 0; i < RL_LAYER_MAX_INPUTS; i++)
        rl_tensor_release(&ud->kept_in[i]);
    rl_tensor_release(&ud->kept_len);
    rl_tensor_release(&ud->kept_target);
    rl_tensor_release(&ud->kept_tlen);
}

/* layer:forward(inputs, lengths, train [, target [, target_lengths]])
 *     -> out [, loss, n_errors, n_frames, n_labels, n_skipped] */
/* Checks forward's arguments (the layer at 1) and fills the layer's io; on return the stack
 * holds the 5 arguments and the io's user value. */
static layer_ud *forward_prepare(lua_State *L) {
    layer_ud *ud = check_layer(L, 1);
    rl_layer *l = ud->layer;
    luaL_checktype(L, 2, LUA_TTABLE);
    rl_tensor *len = rl_lua_check_tensor(L, 3);
    bool train = lua_toboolean(L, 4);
    rl_tensor *target = lua_isnoneornil(L, 5) ? NULL : rl_lua_check_tensor(L, 5);
    rl_tensor *tlen = lua_isnoneornil(L, 6) ? NULL : rl_lua_check_tensor(L, 6);
    lua_settop(L, 6);
    lua_getiuservalue(L, 1, 1); /* 7: what this forward's io points to */
    lua_pushvalue(L, 6);
    lua_setfield(L, 7, "target_lengths");
    lua_remove(L, 6); /* the user value table is now at 6 */
    int n = (int)luaL_len(L, 2);
    if (n != l->n_in)
        luaL_error(L, RL_LAYER_WHERE ": %d inputs given, %d expected", l->name, class_of(l), n,
                   l->n_in);
    ud->forwarded = false;
    rl_layer_io *io = &ud->io;
    memset(io, 0, sizeof *io);
    for (int i = 0; i < n; i++) {
        lua_geti(L, 2, i + 1);
        rl_tensor *x = rl_lua_to_tensor(L, -1);
        if (!x)
            luaL_error(L, RL_LAYER_WHERE ": input %d is a %s, expected a tensor", l->name,
                       class_of(l), i + 1, luaL_typename(L, -1));
        lua_seti(L, 6, i + 1);
        io->in[i] = keep(&ud->kept_in[i], x);
    }
    lua_pushvalue(L, 3);
    lua_setfield(L, 6, "lengths");
    lua_pushvalue(L, 5);
    lua_setfield(L, 6, "target");
    io->n_in = n;
    if (len->ndim == 2)
        io->sizes = keep(&ud->kept_len, len);
    else
        io->lengths = keep(&ud->kept_len, len);
    io->target = keep(&ud->kept_target, target);
    io->target_lengths = keep(&ud->kept_tlen, tlen);
    io->train = train;
    io->rng = rl_rng_default();
    return ud;
}

/* forward's results after its status st: out [, loss, n_errors, n_frames, n_labels, n_skipped] */
static int forward_finish(lua_State *L, layer_ud *ud, rl_tensor *out, rl_status st) {
    rl_layer *l = ud->layer;
    if (st != RL_OK) return raise_layer(L, l);
    rl_tensor_share(out, &l->out);
    ud->forwarded = true;
    if (!l->is_loss || !ud->io.target) return 1;
    lua_pushnumber(L, ud->io.loss);
    lua_pushnumber(L, ud->io.n_errors);
    lua_pushnumber(L, ud->io.n_frames);
    lua_pushnumber(L, ud->io.n_labels);
    lua_pushnumber(L, ud->io.n_skipped);
    return 6;
}

static int m_forward(lua_State *L) {
    layer_ud *ud = forward_prepare(L);
    rl_tensor *out = rl_lua_push_tensor(L);
    return forward_finish(L, ud, out, ud->layer->ops->forward(ud->layer, &ud->io));
}

static int m_forward_queue(lua_State *L) {
    check_queue_room(L);
    queue_call(forward_prepare(L), false);
    return 0;
}

static void check_grad(lua_State *L, const rl_layer *l, const rl_tensor *g, const rl_tensor *like,
                       const char *what) {
    char s1[160], s2[160];
    if (!rl_tensor_same_shape(g, like) || g->dtype != like->dtype || !rl_tensor_is_contiguous(g))
        luaL_error(L, RL_LAYER_WHERE ": %s must be a contiguous %s, got %s", l->name, class_of(l),
                   what, rl_tensor_describe(like, s1, sizeof s1),
                   rl_tensor_describe(g, s2, sizeof s2));
}

/* Checks backward's arguments (the layer at 1) into ud->gout and ud->gin. */
static layer_ud *backward_prepare(lua_State *L) {
    layer_ud *ud = check_layer(L, 1);
    rl_layer *l = ud->layer;
    if (!ud->forwarded)
        luaL_error(L,
                   RL_LAYER_WHERE ": backward needs a forward before it (once "
                                  "per forward)",
                   l->name, class_of(l));
    ud->gout = NULL;
    if (!lua_isnoneornil(L, 2)) {
        ud->gout = rl_lua_check_tensor(L, 2);
        check_grad(L, l, ud->gout, &l->out, "grad_out");
    } else if (!l->is_loss || !ud->io.target) {
        luaL_error(L,
                   RL_LAYER_WHERE ": backward needs grad_out (only a loss layer "
                                  "given a target starts from its own loss)",
                   l->name, class_of(l));
    }
    luaL_checktype(L, 3, LUA_TTABLE);
    memset(ud->gin, 0, sizeof ud->gin);
    char what[32];
    for (int i = 0; i < l->n_in; i++) {
        lua_geti(L, 3, i + 1);
        if (lua_toboolean(L, -1)) {
            ud->gin[i] = rl_lua_check_tensor(L, -1);
            snprintf(what, sizeof what, "grad_in[%d]", i + 1);
            check_grad(L, l, ud->gin[i], ud->io.in[i], what);
        }
        lua_pop(L, 1); /* the caller's table keeps it alive */
    }
    ud->forwarded = false;
    return ud;
}

/* layer:backward(grad_out | nil, grad_in) */
static int m_backward(lua_State *L) {
    layer_ud *ud = backward_prepare(L);
    rl_layer *l = ud->layer;
    if (l->ops->backward(l, &ud->io, ud->gout, ud->gin) != RL_OK) return raise_layer(L, l);
    return 0;
}

static int m_backward_queue(lua_State *L) {
    check_queue_room(L);
    queue_call(backward_prepare(L), true);
    return 0;
}

/* layer:_wait() -> what the queued forward or backward returns */
static int m_wait(lua_State *L) {
    layer_ud *ud = luaL_checkudata(L, 1, RL_LAYER_MT);
    if (!ud->queued) return luaL_error(L, "layer:_wait(): nothing was queued");
    bool backward = ud->run_backward;
    rl_status st = wait_call(ud);
    if (backward) return st == RL_OK ? 0 : raise_layer(L, ud->layer);
    rl_tensor *out = rl_lua_push_tensor(L);
    return forward_finish(L, ud, out, st);
}

/* layer:out_geometry() -> sizes (B, 2) | lengths (B) | nil */
static int m_out_geometry(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    const rl_tensor *g = rl_conv2d_out_sizes(l);
    if (!g) g = rl_pool2d_out_sizes(l);
    if (!g) g = rl_collapse_out_lengths(l);
    if (!g) g = rl_global_pool_out_lengths(l);
    if (!g || !g->storage) {
        lua_pushnil(L);
        return 1;
    }
    rl_tensor_share(rl_lua_push_tensor(L), g);
    return 1;
}

static int l_layer_class_flags(lua_State *L) {
    int flags = rl_layer_class_flags(luaL_checkstring(L, 1));
    if (flags < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, flags);
    return 1;
}

/* ---------------------------------------------------------------- recurrent state */

/* The tensors at stack slots 2 .. top (nil: none given; trailing nils dropped); *n their count. */
static void given_states(lua_State *L, const rl_tensor **s, int *n) {
    int top = lua_gettop(L);
    while (top > 1 && lua_isnil(L, top))
        top--;
    if (top - 1 > RL_LAYER_MAX_STATES)
        luaL_error(L, "at most %d state tensors, got %d", RL_LAYER_MAX_STATES, top - 1);
    *n = top - 1;
    for (int i = 0; i < *n; i++)
        s[i] = lua_isnil(L, i + 2) ? NULL : rl_lua_check_tensor(L, i + 2);
}

/* layer:state_names() -> {names}, {dims}: the layer's recurrent state tensors ("h", "c"; the
 * first is its output), each (B, dim); empty tables for a layer without state */
static int m_state_names(lua_State *L) {
    const char *const *names;
    const int64_t *dims;
    int n = rl_layer_state_info(check_layer(L, 1)->layer, &names, &dims);
    lua_createtable(L, n, 0);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -3, i + 1);
        lua_pushinteger(L, dims[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 2;
}

/* layer:set_initial_state(s1, s2, ...): one (B, dim) tensor or nil (zeros) per state, in
 * state_names order; states left out start from zeros */
static int m_set_initial_state(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    const rl_tensor *s[RL_LAYER_MAX_STATES];
    int n;
    given_states(L, s, &n);
    if (rl_layer_set_initial_state(l, n, s) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:set_final_state_grad(g1, g2, ...): dLoss/d(final state) per state as set_initial_state,
 * where the following backward passes start */
static int m_set_final_state_grad(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    const rl_tensor *g[RL_LAYER_MAX_STATES];
    int n;
    given_states(L, g, &n);
    if (rl_layer_set_final_state_grad(l, n, g) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* Pushes one new tensor per state of l and fills them with read (final_state or
 * initial_state_grad); returns their number. */
static int push_states(lua_State *L, rl_layer *l,
                       rl_status (*read)(rl_layer *, int, rl_tensor *const *)) {
    int n = rl_layer_state_info(l, NULL, NULL);
    rl_tensor *out[RL_LAYER_MAX_STATES];
    luaL_checkstack(L, n, "state tensors");
    for (int i = 0; i < n; i++)
        out[i] = rl_lua_push_tensor(L);
    if (read(l, n, out) != RL_OK) return raise_layer(L, l);
    return n;
}

/* layer:final_state() -> s1, s2, ... (B, dim): each sequence's state after its last frame */
static int m_final_state(lua_State *L) {
    return push_states(L, check_layer(L, 1)->layer, rl_layer_final_state);
}

/* layer:initial_state_grad() -> g1, g2, ...: dLoss/d(initial state) per state, after backward */
static int m_initial_state_grad(lua_State *L) {
    return push_states(L, check_layer(L, 1)->layer, rl_layer_initial_state_grad);
}

/* layer:_gates_cols() -> the width of its gates buffer (_set_gates, _weight_grads' dz) */
static int m_gates_cols(lua_State *L) {
    int64_t n;
    rl_layer *l = check_layer(L, 1)->layer;
    if (rl_recurrent_gates_cols(l, &n) != RL_OK) return raise_layer(L, l);
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

/* layer:_share_packs(owner): an lstm or gru step object shares owner's packed weights (rec
 * units) */
static int m_share_packs(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    if (rl_recurrent_share_packs(l, check_layer(L, 2)->layer) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_set_pack_pass(n): an lstm's or gru's packed weights are packed once per pass n (0:
 * always) */
static int m_set_pack_pass(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0, 2, "the pass must be >= 0");
    if (rl_recurrent_set_pack_pass(l, (uint64_t)n) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_freeze_packs() -> whether it is a recurrent cell, whose packed weights are from now on
 * packed once (the parameters of an inference model never change) */
static int m_freeze_packs(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    /* refused: no recurrent cell (or a rec unit's step object), which packs as it always does */
    bool cell = rl_recurrent_freeze_packs(l) == RL_OK;
    lua_pushboolean(L, cell);
    return 1;
}

/* layer:_frozen_packs() -> its frozen packs as a light userdata (valid while the layer lives;
 * rl_lua_push_packs holds them for another state), or nil */
static int m_frozen_packs(lua_State *L) {
    void *p = rl_recurrent_frozen_packs(check_layer(L, 1)->layer);
    if (p)
        lua_pushlightuserdata(L, p);
    else
        lua_pushnil(L);
    return 1;
}

#define PACKS_MT "rnnlua.Packs"

static int packs_gc(lua_State *L) {
    void **u = luaL_checkudata(L, 1, PACKS_MT);
    rl_recurrent_packs_drop(*u), *u = NULL;
    return 0;
}

void rl_lua_push_packs(lua_State *L, void *packs) {
    static const luaL_Reg meta[] = {{"__gc", packs_gc}, {NULL, NULL}};
    void **u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = NULL; /* until the metatable is set: nothing to drop if that raises */
    if (luaL_newmetatable(L, PACKS_MT)) luaL_setfuncs(L, meta, 0);
    lua_setmetatable(L, -2);
    rl_recurrent_packs_hold(packs);
    *u = packs;
}

/* layer:_adopted_inputs(on): its input products read the adopted packs' W (on) or OpenBLAS's */
static int m_adopted_inputs(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    if (rl_recurrent_adopted_inputs(l, lua_toboolean(L, 2)) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_adopt_packs(packs): reads the frozen packs of another network's layer (a C API
 * session's network, rl_lua_push_packs) instead of packing its own */
static int m_adopt_packs(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    void **u = luaL_checkudata(L, 2, PACKS_MT);
    if (rl_recurrent_adopt_packs(l, *u) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_set_zero_inputs(mask): the inputs of bit mask are all zeros in the following forwards
 * (rec units: prev: sources at the first step) */
static int m_set_zero_inputs(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    lua_Integer m = luaL_checkinteger(L, 2);
    luaL_argcheck(L, m >= 0 && m <= 0xffffffff, 2, "the mask must be in 0 .. 2^32 - 1");
    if (rl_recurrent_set_zero_inputs(l, (uint32_t)m) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_set_gates(t | nil): the layer's gates buffer is t from the next forward on, and its
 * backward leaves the weight gradients to layer:_weight_grads (rec units) */
static int m_set_gates(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    const rl_tensor *g = lua_isnoneornil(L, 2) ? NULL : rl_lua_check_tensor(L, 2);
    if (rl_recurrent_set_gates(l, g) != RL_OK) return raise_layer(L, l);
    return 0;
}

/* layer:_weight_grads(k, x, dz): input k's weights (1-based; 0: U) get x^T dz added */
static int m_weight_grads(lua_State *L) {
    rl_layer *l = check_layer(L, 1)->layer;
    lua_Integer k = luaL_checkinteger(L, 2);
    luaL_argcheck(L, k >= 0 && k <= RL_LAYER_MAX_INPUTS, 2,
                  "k must be an input (1..n_in) or 0 (U)");
    if (rl_recurrent_weight_grads(l, (int)k - 1, rl_lua_check_tensor(L, 3),
                                  rl_lua_check_tensor(L, 4)) != RL_OK)
        return raise_layer(L, l);
    return 0;
}

/* layer:_pack_count() -> the operands its packs (shared or not) have packed so far */
static int m_pack_count(lua_State *L) {
    uint64_t n;
    rl_layer *l = check_layer(L, 1)->layer;
    if (rl_recurrent_pack_count(l, &n) != RL_OK) return raise_layer(L, l);
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

/* ---------------------------------------------------------------- losses */

/* rl._loss_mse(out, target, lengths [, grad]) -> loss, n_frames */
static int l_loss_mse(lua_State *L) {
    rl_tensor *out = rl_lua_check_tensor(L, 1);
    rl_tensor *target = rl_lua_check_tensor(L, 2);
    rl_tensor *len = rl_lua_check_tensor(L, 3);
    rl_tensor *grad = lua_isnoneornil(L, 4) ? NULL : rl_lua_check_tensor(L, 4);
    double loss = 0, n_frames = 0;
    if (rl_loss_mse(out, target, len, &loss, &n_frames, grad) != RL_OK) return raise_plain(L);
    lua_pushnumber(L, loss);
    lua_pushnumber(L, n_frames);
    return 2;
}

/* ---------------------------------------------------------------- metatable */

static int mm_index(lua_State *L) {
    layer_ud *ud = luaL_checkudata(L, 1, RL_LAYER_MT);
    if (lua_getfield(L, lua_upvalueindex(1), luaL_checkstring(L, 2)) != LUA_TNIL) return 1;
    const char *k = lua_tostring(L, 2);
    const rl_layer *l = ud->layer;
    if (!l) return 0;
    if (strcmp(k, "name") == 0) {
        lua_pushstring(L, l->name);
    } else if (strcmp(k, "class") == 0) {
        lua_pushstring(L, class_of(l));
    } else if (strcmp(k, "n_out") == 0) {
        lua_pushinteger(L, l->n_out);
    } else if (strcmp(k, "n_in") == 0) {
        lua_pushinteger(L, l->n_in);
    } else if (strcmp(k, "is_loss") == 0) {
        lua_pushboolean(L, l->is_loss);
    } else if (strcmp(k, "num_params") == 0) {
        lua_pushinteger(L, rl_layer_num_params(l));
    } else if (strcmp(k, "in_dims") == 0) {
        lua_createtable(L, l->n_in, 0);
        for (int i = 0; i < l->n_in; i++) {
            lua_pushinteger(L, l->in_dims[i]);
            lua_rawseti(L, -2, i + 1);
        }
    } else {
        lua_pushnil(L);
    }
    return 1;
}

static int mm_gc(lua_State *L) {
    layer_ud *ud = luaL_checkudata(L, 1, RL_LAYER_MT);
    drop_call(ud);
    drop_kept(ud);
    rl_layer_free(ud->layer);
    ud->layer = NULL;
    ud->forwarded = false;
    return 0;
}

static int mm_tostring(lua_State *L) {
    layer_ud *ud = luaL_checkudata(L, 1, RL_LAYER_MT);
    const rl_layer *l = ud->layer;
    if (!l) {
        lua_pushstring(L, "Layer (freed)");
        return 1;
    }
    lua_pushfstring(L, "Layer '%s' (class %s, %d inputs, n_out %d, %d params)", l->name,
                    class_of(l), l->n_in, (int)l->n_out, (int)rl_layer_num_params(l));
    return 1;
}

static const luaL_Reg layer_methods[] = {
    {"params", m_params},
    {"bind", m_bind},
    {"init_params", m_init_params},
    {"forward", m_forward},
    {"backward", m_backward},
    {"_forward_queue", m_forward_queue},
    {"_backward_queue", m_backward_queue},
    {"_wait", m_wait},
    {"out_geometry", m_out_geometry},
    {"state_names", m_state_names},
    {"set_initial_state", m_set_initial_state},
    {"final_state", m_final_state},
    {"initial_state_grad", m_initial_state_grad},
    {"set_final_state_grad", m_set_final_state_grad},
    {"_share_packs", m_share_packs},
    {"_set_pack_pass", m_set_pack_pass},
    {"_pack_count", m_pack_count},
    {"_set_zero_inputs", m_set_zero_inputs},
    {"_freeze_packs", m_freeze_packs},
    {"_frozen_packs", m_frozen_packs},
    {"_adopt_packs", m_adopt_packs},
    {"_adopted_inputs", m_adopted_inputs},
    {"_set_gates", m_set_gates},
    {"_weight_grads", m_weight_grads},
    {"_gates_cols", m_gates_cols},
    {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"_layer_new", l_layer_new},
    {"_layer_classes", l_layer_classes},
    {"_layer_class_flags", l_layer_class_flags},
    {"_param_init", l_param_init},
    {"_loss_mse", l_loss_mse},
    {NULL, NULL},
};

void rl_lua_open_layers(lua_State *L) {
    int module = lua_gettop(L);
    luaL_newmetatable(L, RL_LAYER_MT);
    lua_newtable(L);
    luaL_setfuncs(L, layer_methods, 0);
    lua_pushcclosure(L, mm_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, mm_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, mm_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    luaL_setfuncs(L, module_funcs, 0);
    lua_settop(L, module);
}
