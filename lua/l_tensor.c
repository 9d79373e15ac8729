/* The Lua face of tensors: the Tensor metatable and the rl.* functions that make tensors.
 *
 * One rule for results, as in PyTorch: a method returns a new tensor; a method whose name
 * ends in `_` (add_, mul_, fill_, ...) writes into self and returns self; view methods
 * (narrow, select, view, transpose, t, permute, squeeze, unsqueeze, expand, and t[i] on a
 * tensor of 2+ dims) return a tensor that shares self's storage. Positions (narrow, select,
 * t[i], dims, index_select's indices, the indices that max/min return) are 1-based; a
 * negative dim counts from the end.
 *
 * Every function pushes its result userdata (holding an unset tensor) before calling into C,
 * so a failing op leaves nothing to free when the error is raised. */
#include "l_tensor.h"

#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#include <pthread.h>
#endif
#include <math.h>
#include <string.h>

#include "../core/device.h"
#include "../core/rng.h"
#include "../kernels/ops.h"

/* ---------------------------------------------------------------- userdata basics */

/* The userdata: the tensor and whether it was freed. `<close>`, a closed coroutine's pending
 * closes and __gc release the storage, but the userdata itself can still be reached (the
 * variable stays in scope after a close; a finaliser can resurrect an object), so every entry
 * point checks `freed` before it touches the tensor. */
typedef struct {
    rl_tensor t;
    bool freed;
} tensor_ud;

/* Lua's collector paces itself by the bytes Lua allocates, and a tensor is a small userdata
 * whose storage (kilobytes to gigabytes) Lua never sees: in the generational mode rnnlua runs,
 * a tensor that lived through two minor collections waits for a major one, which comes only
 * when the Lua heap itself doubles. Garbage tensors then pile up (a training grew to gigabytes
 * while it needed tens of megabytes). So every new tensor or layer first compares the bytes of
 * all live storages with a limit, and above it runs a full collection and sets the limit to
 * what survived plus as much again, at least RL_GC_HEADROOM: resident memory stays within about
 * twice the live tensors plus the headroom. A full collection costs with the Lua heap (a G2P
 * training's 60 MB of word lists: tens of ms), so the headroom keeps them rare (with 64 MiB a
 * G2P epoch took about twice the CPU time). The limit is per Lua state (the registry); the byte
 * count is the process's, so a state may also collect when another's tensors grew. */
#define RL_GC_HEADROOM ((int64_t)256 << 20)
static const char gc_limit_key = 'g';

#ifdef __GLIBC__
/* glibc's defaults make a training fault its storages in again and again, and every page fault
 * is system time: a storage above the mmap threshold (128 KiB at first, rising with each such
 * free, up to 32 MiB) is mapped when made and unmapped when freed, and free() hands the top of
 * the heap back whenever more than twice that threshold lies free there, which is the case
 * after every collection. So storages up to 32 MiB (glibc's largest threshold) come from the
 * heap, and free() keeps up to RL_GC_HEADROOM free at its top: what a collection frees is
 * reused, resident, by the storages made until the next one. */
static pthread_once_t malloc_once = PTHREAD_ONCE_INIT;

static void malloc_setup(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, (int)RL_GC_HEADROOM);
}
#endif

void rl_lua_collect_if_needed(lua_State *L) {
#ifdef __GLIBC__
    pthread_once(&malloc_once, malloc_setup);
#endif
    int64_t live = rl_storage_live_bytes();
    lua_rawgetp(L, LUA_REGISTRYINDEX, &gc_limit_key);
    int64_t limit = lua_isinteger(L, -1) ? (int64_t)lua_tointeger(L, -1) : RL_GC_HEADROOM;
    lua_pop(L, 1);
    if (live <= limit) return;
    lua_gc(L, LUA_GCCOLLECT);
    live = rl_storage_live_bytes();
    int64_t headroom = live > RL_GC_HEADROOM ? live : RL_GC_HEADROOM;
#ifdef __GLIBC__
    /* The storages made before the next collection reuse at most `headroom` bytes of what
     * glibc holds free; when it holds more than a quarter more (holes between survivors that
     * the next storages do not fit, a working set that shrank or moved), the rest would stay
     * resident for nothing: then, and only then, hand the free pages back. Trimming after
     * every collection would make every page used again fault anew (docs/tensors.md,
     * Memory). */
    if ((int64_t)mallinfo2().fordblks > headroom + headroom / 4) malloc_trim(0);
#endif
    lua_pushinteger(L, (lua_Integer)(live + headroom));
    lua_rawsetp(L, LUA_REGISTRYINDEX, &gc_limit_key);
}

rl_tensor *rl_lua_push_tensor(lua_State *L) {
    rl_lua_collect_if_needed(L);
    tensor_ud *u = lua_newuserdatauv(L, sizeof(tensor_ud), 0);
    memset(u, 0, sizeof *u);
    luaL_setmetatable(L, RL_TENSOR_MT);
    return &u->t;
}

static rl_tensor *live_tensor(lua_State *L, int idx, tensor_ud *u) {
    if (u && u->freed)
        luaL_error(L,
                   "argument %d: the tensor was freed (closed by <close> or a closed coroutine, "
                   "or collected) and cannot be used any more",
                   idx);
    return u ? &u->t : NULL;
}

rl_tensor *rl_lua_to_tensor(lua_State *L, int idx) {
    return live_tensor(L, idx, luaL_testudata(L, idx, RL_TENSOR_MT));
}

rl_tensor *rl_lua_check_tensor(lua_State *L, int idx) {
    tensor_ud *u = luaL_testudata(L, idx, RL_TENSOR_MT);
    if (!u) {
        const char *msg = lua_pushfstring(L, "tensor expected, got %s", luaL_typename(L, idx));
        luaL_argerror(L, idx, msg);
    }
    return live_tensor(L, idx, u);
}

int rl_lua_raise(lua_State *L, const char *fname) {
    const char *msg = rl_errmsg();
    size_t n = strlen(fname);
    luaL_where(L, 1);
    if (strncmp(msg, fname, n) == 0 && msg[n] == ':')
        lua_pushstring(L, msg);
    else
        lua_pushfstring(L, "%s: %s", fname, msg);
    lua_concat(L, 2);
    return lua_error(L);
}

static int raise_if(lua_State *L, rl_status st, const char *fname) {
    if (st != RL_OK) rl_lua_raise(L, fname);
    return 0;
}

static int check_dim_range(lua_State *L, int arg, int ndim, int extra, const char *fname) {
    lua_Integer d = luaL_checkinteger(L, arg);
    int n = ndim + extra;
    if (d < 0) d += n + 1;
    if (d < 1 || d > n) {
        return luaL_error(L,
                          "%s: dim %I out of range for a %d-dim tensor (valid: 1..%d or -%d..-1)",
                          fname, luaL_checkinteger(L, arg), ndim, n, n);
    }
    return (int)d - 1;
}

int rl_lua_check_dim(lua_State *L, int arg, const rl_tensor *t, const char *fname) {
    return check_dim_range(L, arg, t->ndim, 0, fname);
}

/* Sizes given as numbers (2, 3), a table {2, 3} or a Size; stores them and returns the index
 * of the first argument after them. */
static int read_shape(lua_State *L, int first, const char *fname, int *ndim, int64_t *shape) {
    int n = 0, arg = first;
    if (lua_istable(L, first)) {
        lua_Integer len = (lua_Integer)luaL_len(L, first);
        if (len > RL_MAX_DIMS)
            luaL_error(L, "%s: %d dims given, at most %d are supported", fname, (int)len,
                       RL_MAX_DIMS);
        for (lua_Integer i = 1; i <= len; i++) {
            lua_geti(L, first, i);
            int isnum;
            lua_Integer v = lua_tointegerx(L, -1, &isnum);
            if (!isnum)
                luaL_error(L, "%s: size %d is not an integer (%s)", fname, (int)i,
                           luaL_typename(L, -1));
            lua_pop(L, 1);
            shape[n++] = v;
        }
        arg = first + 1;
    } else {
        while (lua_type(L, arg) == LUA_TNUMBER) {
            if (n == RL_MAX_DIMS) luaL_error(L, "%s: more than %d sizes given", fname, RL_MAX_DIMS);
            int isnum;
            lua_Integer v = lua_tointegerx(L, arg, &isnum);
            if (!isnum)
                luaL_error(L, "%s: size %d is not an integer (%f)", fname, n + 1,
                           lua_tonumber(L, arg));
            shape[n++] = v;
            arg++;
        }
    }
    for (int d = 0; d < n; d++)
        if (shape[d] < 0)
            luaL_error(L, "%s: negative size %I in dim %d", fname, (lua_Integer)shape[d], d + 1);
    *ndim = n;
    return arg;
}

typedef struct {
    rl_dtype dtype;
    rl_device device;
} tensor_opts;

static void parse_dtype(lua_State *L, const char *name, const char *fname, rl_dtype *dt) {
    if (rl_dtype_parse(name, dt) != RL_OK) luaL_error(L, "%s: %s", fname, rl_errmsg());
}

static void parse_device(lua_State *L, const char *name, const char *fname, rl_device *dev) {
    if (rl_device_parse(name, dev) != RL_OK) luaL_error(L, "%s: %s", fname, rl_errmsg());
}

/* Optional trailing options: a dtype name ("int32"), a device name ("cuda:0"), or a table
 * {dtype = ..., device = ...}; any other argument is an error. */
static void read_opts(lua_State *L, int arg, const char *fname, tensor_opts *o) {
    o->dtype = RL_FLOAT32;
    o->device = RL_DEVICE_CPU;
    int top = lua_gettop(L);
    for (; arg <= top; arg++) {
        if (lua_type(L, arg) == LUA_TSTRING) {
            const char *s = lua_tostring(L, arg);
            if (strcmp(s, "cpu") == 0 || strncmp(s, "cuda", 4) == 0)
                parse_device(L, s, fname, &o->device);
            else
                parse_dtype(L, s, fname, &o->dtype);
        } else if (lua_istable(L, arg)) {
            if (lua_getfield(L, arg, "dtype") != LUA_TNIL)
                parse_dtype(L, luaL_checkstring(L, -1), fname, &o->dtype);
            if (lua_getfield(L, arg, "device") != LUA_TNIL)
                parse_device(L, luaL_checkstring(L, -1), fname, &o->device);
            lua_pop(L, 2);
        } else if (!lua_isnil(L, arg)) {
            luaL_error(L,
                       "%s: argument %d: expected a size, a dtype, a device or an options "
                       "table, got %s",
                       fname, arg, luaL_typename(L, arg));
        }
    }
}

/* Pushes a new tensor of the given geometry; raises on failure. */
static rl_tensor *push_empty(lua_State *L, const char *fname, rl_dtype dt, rl_device dev, int ndim,
                             const int64_t *shape) {
    rl_tensor *t = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_empty(t, dt, dev, ndim, shape), fname);
    return t;
}

/* ---------------------------------------------------------------- creation */

static int l_empty_filled(lua_State *L, const char *fname, double value, bool fill) {
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    int next = read_shape(L, 1, fname, &ndim, shape);
    tensor_opts o;
    read_opts(L, next, fname, &o);
    rl_tensor *t = push_empty(L, fname, o.dtype, o.device, ndim, shape);
    if (fill) raise_if(L, rl_op_fill(t, value), fname);
    return 1;
}

static int l_zeros(lua_State *L) { return l_empty_filled(L, "zeros", 0.0, true); }
static int l_ones(lua_State *L) { return l_empty_filled(L, "ones", 1.0, true); }
static int l_empty(lua_State *L) { return l_empty_filled(L, "empty", 0.0, false); }

/* rl.full(shape, value [, opts]) */
static int l_full(lua_State *L) {
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    luaL_checktype(L, 1, LUA_TTABLE);
    read_shape(L, 1, "full", &ndim, shape);
    double v = luaL_checknumber(L, 2);
    tensor_opts o;
    read_opts(L, 3, "full", &o);
    rl_tensor *t = push_empty(L, "full", o.dtype, o.device, ndim, shape);
    raise_if(L, rl_op_fill(t, v), "full");
    return 1;
}

static int l_random(lua_State *L, const char *fname, bool normal) {
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    int next = read_shape(L, 1, fname, &ndim, shape);
    tensor_opts o;
    read_opts(L, next, fname, &o);
    if (o.dtype == RL_INT32) return luaL_error(L, "%s: needs a float dtype, got int32", fname);
    rl_tensor *t = push_empty(L, fname, o.dtype, o.device, ndim, shape);
    rl_status st = normal ? rl_op_normal(t, rl_rng_default(), 0.0, 1.0)
                          : rl_op_uniform(t, rl_rng_default(), 0.0, 1.0);
    raise_if(L, st, fname);
    return 1;
}

static int l_rand(lua_State *L) { return l_random(L, "rand", false); }
static int l_randn(lua_State *L) { return l_random(L, "randn", true); }

/* rl.arange(stop) | rl.arange(start, stop [, step]) [, opts]: start, start+step, ... < stop */
static int l_arange(lua_State *L) {
    double start = 0, stop, step = 1;
    int next;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        start = luaL_checknumber(L, 1);
        stop = luaL_checknumber(L, 2);
        next = 3;
        if (lua_type(L, 3) == LUA_TNUMBER) {
            step = lua_tonumber(L, 3);
            next = 4;
        }
    } else {
        stop = luaL_checknumber(L, 1);
        next = 2;
    }
    if (step == 0 || isnan(step) || isnan(start) || isnan(stop))
        return luaL_error(L, "arange: step must be a non-zero number");
    double count = ceil((stop - start) / step);
    if (count < 0) count = 0;
    if (count > 1e12) return luaL_error(L, "arange: %f elements is too many", count);
    tensor_opts o;
    read_opts(L, next, "arange", &o);
    int64_t n = (int64_t)count;
    rl_tensor *t = push_empty(L, "arange", o.dtype, o.device, 1, &n);
    raise_if(L, rl_op_arange(t, start, step), "arange");
    return 1;
}

/* Shape of a nested table, checked to be rectangular and numeric by fill_from_table. */
static void table_shape(lua_State *L, int idx, int *ndim, int64_t *shape) {
    int n = 0;
    lua_pushvalue(L, idx);
    while (lua_istable(L, -1)) {
        if (n == RL_MAX_DIMS) luaL_error(L, "rl.tensor: nested deeper than %d levels", RL_MAX_DIMS);
        shape[n++] = (int64_t)luaL_len(L, -1);
        if (shape[n - 1] == 0) break;
        lua_geti(L, -1, 1);
        lua_remove(L, -2);
    }
    lua_pop(L, 1);
    *ndim = n;
}

static void path_str(char *buf, size_t size, const int64_t *index, int depth) {
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < depth && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "[%" PRId64 "]", index[d] + 1);
}

static void fill_from_table(lua_State *L, rl_tensor *t, int depth, int64_t *index) {
    char where[96];
    int64_t len = (int64_t)luaL_len(L, -1);
    if (len != t->shape[depth]) {
        path_str(where, sizeof where, index, depth);
        luaL_error(L, "rl.tensor: ragged table: %s has %d elements, expected %d",
                   depth ? where : "the outer table", (int)len, (int)t->shape[depth]);
    }
    for (int64_t i = 0; i < len; i++) {
        index[depth] = i;
        lua_geti(L, -1, i + 1);
        if (depth + 1 < t->ndim) {
            if (!lua_istable(L, -1)) {
                path_str(where, sizeof where, index, depth + 1);
                luaL_error(L, "rl.tensor: element %s is a %s, expected a table", where,
                           luaL_typename(L, -1));
            }
            fill_from_table(L, t, depth + 1, index);
        } else {
            int isnum;
            lua_Number v = lua_tonumberx(L, -1, &isnum);
            if (!isnum || lua_type(L, -1) != LUA_TNUMBER) {
                path_str(where, sizeof where, index, depth + 1);
                luaL_error(L, "rl.tensor: element %s is a %s, expected a number", where,
                           luaL_typename(L, -1));
            }
            if (t->dtype == RL_INT32 && (v != floor(v) || v < -2147483648.0 || v > 2147483647.0)) {
                path_str(where, sizeof where, index, depth + 1);
                luaL_error(L, "rl.tensor: element %s = %f is not an int32", where, v);
            }
            rl_tensor_set(t, index, v);
        }
        lua_pop(L, 1);
    }
}

/* rl.tensor(nested_table | number | tensor [, opts]) */
static int l_tensor(lua_State *L) {
    tensor_opts o;
    read_opts(L, 2, "rl.tensor", &o);
    rl_tensor *src = rl_lua_to_tensor(L, 1);
    if (src) {
        rl_tensor *t = rl_lua_push_tensor(L);
        if (lua_isnoneornil(L, 2)) o.dtype = src->dtype, o.device = rl_tensor_device(src);
        raise_if(L, rl_op_to(t, src, o.dtype, o.device), "rl.tensor");
        return 1;
    }
    if (lua_type(L, 1) == LUA_TNUMBER) {
        rl_tensor *t = push_empty(L, "rl.tensor", o.dtype, RL_DEVICE_CPU, 0, NULL);
        rl_tensor_set(t, NULL, lua_tonumber(L, 1));
    } else if (lua_istable(L, 1)) {
        int ndim;
        int64_t shape[RL_MAX_DIMS], index[RL_MAX_DIMS] = {0};
        table_shape(L, 1, &ndim, shape);
        rl_tensor *t = push_empty(L, "rl.tensor", o.dtype, RL_DEVICE_CPU, ndim, shape);
        lua_pushvalue(L, 1);
        if (rl_tensor_numel(t) > 0) fill_from_table(L, t, 0, index);
        lua_pop(L, 1);
    } else {
        return luaL_argerror(L, 1, "expected a table of numbers, a number or a tensor");
    }
    if (o.device.type != RL_CPU) {
        rl_tensor *cpu = rl_lua_to_tensor(L, -1);
        rl_tensor *t = rl_lua_push_tensor(L);
        raise_if(L, rl_op_to(t, cpu, o.dtype, o.device), "rl.tensor");
    }
    return 1;
}

/* ---------------------------------------------------------------- queries */

static void push_size(lua_State *L, const rl_tensor *t) {
    lua_createtable(L, t->ndim, 0);
    for (int d = 0; d < t->ndim; d++) {
        lua_pushinteger(L, t->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    luaL_setmetatable(L, "rnnlua.Size");
}

static int m_size(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (lua_isnoneornil(L, 2)) {
        push_size(L, t);
    } else {
        lua_pushinteger(L, t->shape[rl_lua_check_dim(L, 2, t, "size")]);
    }
    return 1;
}

static int m_stride(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (!lua_isnoneornil(L, 2)) {
        lua_pushinteger(L, t->stride[rl_lua_check_dim(L, 2, t, "stride")]);
        return 1;
    }
    lua_createtable(L, t->ndim, 0);
    for (int d = 0; d < t->ndim; d++) {
        lua_pushinteger(L, t->stride[d]);
        lua_rawseti(L, -2, d + 1);
    }
    return 1;
}

static int m_dim(lua_State *L) {
    lua_pushinteger(L, rl_lua_check_tensor(L, 1)->ndim);
    return 1;
}

static int m_numel(lua_State *L) {
    lua_pushinteger(L, rl_tensor_numel(rl_lua_check_tensor(L, 1)));
    return 1;
}

static int m_dtype(lua_State *L) {
    lua_pushstring(L, rl_dtype_name(rl_lua_check_tensor(L, 1)->dtype));
    return 1;
}

static int m_device(lua_State *L) {
    char buf[32];
    rl_device_name(rl_tensor_device(rl_lua_check_tensor(L, 1)), buf, sizeof buf);
    lua_pushstring(L, buf);
    return 1;
}

static int m_is_contiguous(lua_State *L) {
    lua_pushboolean(L, rl_tensor_is_contiguous(rl_lua_check_tensor(L, 1)));
    return 1;
}

/* ---------------------------------------------------------------- views */

static int m_narrow(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int dim = rl_lua_check_dim(L, 2, t, "narrow");
    lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
    if (start < 1)
        return luaL_error(L, "narrow: start position %I must be >= 1 (positions are 1-based)",
                          start);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_narrow(out, t, dim, start - 1, len), "narrow");
    return 1;
}

static int m_select(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int dim = rl_lua_check_dim(L, 2, t, "select");
    lua_Integer i = luaL_checkinteger(L, 3);
    if (i < 0) i += t->shape[dim] + 1;
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_select(out, t, dim, i - 1), "select");
    return 1;
}

static int view_or_reshape(lua_State *L, bool reshape) {
    const char *fname = reshape ? "reshape" : "view";
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int ndim = 0;
    int64_t shape[RL_MAX_DIMS];
    int next = 2;
    if (lua_istable(L, 2)) {
        next = read_shape(L, 2, fname, &ndim, shape);
    } else {
        for (; lua_type(L, next) == LUA_TNUMBER; next++) {
            if (ndim == RL_MAX_DIMS)
                return luaL_error(L, "%s: more than %d sizes given", fname, RL_MAX_DIMS);
            shape[ndim++] = luaL_checkinteger(L, next);
        }
    }
    if (!lua_isnone(L, next))
        return luaL_error(L, "%s: argument %d: expected a size, got %s", fname, next,
                          luaL_typename(L, next));
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, reshape ? rl_op_reshape(out, t, ndim, shape) : rl_tensor_view(out, t, ndim, shape),
             fname);
    return 1;
}

static int m_view(lua_State *L) { return view_or_reshape(L, false); }
static int m_reshape(lua_State *L) { return view_or_reshape(L, true); }

static int m_transpose(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int d0 = rl_lua_check_dim(L, 2, t, "transpose"), d1 = rl_lua_check_dim(L, 3, t, "transpose");
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_transpose(out, t, d0, d1), "transpose");
    return 1;
}

static int m_t(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (t->ndim != 2) {
        char s[128];
        return luaL_error(L, "t: expects a 2-dim tensor, got %s", rl_shape_str(t, s, sizeof s));
    }
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_transpose(out, t, 0, 1), "t");
    return 1;
}

static int m_permute(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int perm[RL_MAX_DIMS];
    int n = lua_gettop(L) - 1;
    if (n != t->ndim)
        return luaL_error(L, "permute: %d dims given for a %d-dim tensor", n, t->ndim);
    for (int d = 0; d < n; d++)
        perm[d] = rl_lua_check_dim(L, d + 2, t, "permute");
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_permute(out, t, perm), "permute");
    return 1;
}

static int m_squeeze(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int dim = lua_isnoneornil(L, 2) ? -1 : rl_lua_check_dim(L, 2, t, "squeeze");
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_squeeze(out, t, dim), "squeeze");
    return 1;
}

static int m_unsqueeze(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int dim = check_dim_range(L, 2, t->ndim, 1, "unsqueeze");
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_unsqueeze(out, t, dim), "unsqueeze");
    return 1;
}

static int m_expand(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    read_shape(L, 2, "expand", &ndim, shape);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_expand(out, t, ndim, shape), "expand");
    return 1;
}

static int m_contiguous(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_contiguous(out, t), "contiguous");
    return 1;
}

/* ---------------------------------------------------------------- copies and conversion */

static int m_clone(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_to(out, t, t->dtype, rl_tensor_device(t)), "clone");
    return 1;
}

static int m_copy(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_tensor *src = rl_lua_check_tensor(L, 2);
    raise_if(L, rl_op_copy(t, src), "copy");
    lua_settop(L, 1);
    return 1;
}

static int convert(lua_State *L, rl_dtype dt, rl_device dev, const char *fname) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (t->dtype == dt && rl_device_eq(rl_tensor_device(t), dev)) {
        lua_settop(L, 1);
        return 1;
    }
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_to(out, t, dt, dev), fname);
    return 1;
}

static int m_float(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    return convert(L, RL_FLOAT32, rl_tensor_device(t), "float");
}
static int m_double(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    return convert(L, RL_FLOAT64, rl_tensor_device(t), "double");
}
static int m_int(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    return convert(L, RL_INT32, rl_tensor_device(t), "int");
}
static int m_cpu(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    return convert(L, t->dtype, RL_DEVICE_CPU, "cpu");
}
static int m_cuda(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_device dev = {RL_CUDA, (int)luaL_optinteger(L, 2, 0)};
    return convert(L, t->dtype, dev, "cuda");
}

/* t:to("cuda:0"), t:to("float64"), t:to("cuda", "float64"), t:to{device=..., dtype=...} */
static int m_to(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    tensor_opts o = {t->dtype, rl_tensor_device(t)};
    int top = lua_gettop(L);
    if (top < 2) return luaL_error(L, "to: expected a device or dtype name, or {device=, dtype=}");
    for (int arg = 2; arg <= top; arg++) {
        if (lua_istable(L, arg)) {
            if (lua_getfield(L, arg, "dtype") != LUA_TNIL)
                parse_dtype(L, luaL_checkstring(L, -1), "to", &o.dtype);
            if (lua_getfield(L, arg, "device") != LUA_TNIL)
                parse_device(L, luaL_checkstring(L, -1), "to", &o.device);
            lua_pop(L, 2);
        } else {
            const char *s = luaL_checkstring(L, arg);
            if (strcmp(s, "cpu") == 0 || strncmp(s, "cuda", 4) == 0)
                parse_device(L, s, "to", &o.device);
            else
                parse_dtype(L, s, "to", &o.dtype);
        }
    }
    lua_settop(L, 1);
    return convert(L, o.dtype, o.device, "to");
}

/* A CPU tensor holding t's values: t itself, or a copy pushed on the stack. */
static rl_tensor *on_cpu(lua_State *L, rl_tensor *t, const char *fname) {
    if (rl_tensor_device(t).type == RL_CPU) return t;
    rl_tensor *c = rl_lua_push_tensor(L);
    raise_if(L, rl_op_to(c, t, t->dtype, RL_DEVICE_CPU), fname);
    return c;
}

static void push_number(lua_State *L, const rl_tensor *t, double v) {
    if (t->dtype == RL_INT32)
        lua_pushinteger(L, (lua_Integer)v);
    else
        lua_pushnumber(L, v);
}

static void push_table(lua_State *L, const rl_tensor *t, int depth, int64_t *index) {
    if (depth == t->ndim) {
        push_number(L, t, rl_tensor_get(t, index));
        return;
    }
    lua_createtable(L, (int)t->shape[depth], 0);
    for (int64_t i = 0; i < t->shape[depth]; i++) {
        index[depth] = i;
        push_table(L, t, depth + 1, index);
        lua_rawseti(L, -2, i + 1);
    }
}

static int m_totable(lua_State *L) {
    rl_tensor *t = on_cpu(L, rl_lua_check_tensor(L, 1), "totable");
    int64_t index[RL_MAX_DIMS] = {0};
    luaL_checkstack(L, 2 * RL_MAX_DIMS + 4, "totable");
    push_table(L, t, 0, index);
    return 1;
}

static int m_item(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (rl_tensor_numel(t) != 1) {
        char s[128];
        return luaL_error(L, "item: expects a tensor of one element, got %s",
                          rl_shape_str(t, s, sizeof s));
    }
    t = on_cpu(L, t, "item");
    int64_t index[RL_MAX_DIMS] = {0};
    push_number(L, t, rl_tensor_get(t, index));
    return 1;
}

/* ---------------------------------------------------------------- filling */

/* The end of an in-place method: raises fname's error, else returns the tensor itself. */
static int self_or_raise(lua_State *L, rl_status st, const char *fname) {
    raise_if(L, st, fname);
    lua_settop(L, 1);
    return 1;
}

static int m_fill_(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    return self_or_raise(L, rl_op_fill(t, luaL_checknumber(L, 2)), "fill_");
}

static int m_zero_(lua_State *L) {
    return self_or_raise(L, rl_op_fill(rl_lua_check_tensor(L, 1), 0.0), "zero_");
}

/* t:uniform_([lo = 0 [, hi = 1]]), t:normal_([mean = 0 [, sd = 1]]) from the default generator */
static int random_fill(lua_State *L, bool normal) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    double a = luaL_optnumber(L, 2, 0.0), b = luaL_optnumber(L, 3, 1.0);
    rl_rng *g = rl_rng_default();
    return self_or_raise(L, normal ? rl_op_normal(t, g, a, b) : rl_op_uniform(t, g, a, b),
                         normal ? "normal_" : "uniform_");
}

static int m_uniform_(lua_State *L) { return random_fill(L, false); }
static int m_normal_(lua_State *L) { return random_fill(L, true); }

static int m_masked_fill(lua_State *L, bool inplace) {
    const char *fname = inplace ? "masked_fill_" : "masked_fill";
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_tensor *mask = rl_lua_check_tensor(L, 2);
    double v = luaL_checknumber(L, 3);
    rl_tensor *dst = t;
    if (!inplace) {
        dst = rl_lua_push_tensor(L);
        raise_if(L, rl_op_to(dst, t, t->dtype, rl_tensor_device(t)), fname);
    }
    raise_if(L, rl_op_masked_fill(dst, mask, v), fname);
    if (inplace) lua_settop(L, 1);
    return 1;
}
static int m_masked_fill_new(lua_State *L) { return m_masked_fill(L, false); }
static int m_masked_fill_inplace(lua_State *L) { return m_masked_fill(L, true); }

/* ---------------------------------------------------------------- elementwise */

/* Unary ops: method `name` (new tensor) and `name_` (in place); also rl.name(t). */
static const struct {
    const char *name;
    rl_unary_op op;
} unary_ops[] = {
    {"neg", RL_UN_NEG},
    {"abs", RL_UN_ABS},
    {"sign", RL_UN_SIGN},
    {"exp", RL_UN_EXP},
    {"log", RL_UN_LOG},
    {"log1p", RL_UN_LOG1P},
    {"expm1", RL_UN_EXPM1},
    {"sqrt", RL_UN_SQRT},
    {"rsqrt", RL_UN_RSQRT},
    {"square", RL_UN_SQUARE},
    {"reciprocal", RL_UN_RECIPROCAL},
    {"sin", RL_UN_SIN},
    {"cos", RL_UN_COS},
    {"tanh", RL_UN_TANH},
    {"sigmoid", RL_UN_SIGMOID},
    {"relu", RL_UN_RELU},
    {"elu", RL_UN_ELU},
    {"softplus", RL_UN_SOFTPLUS},
    {"floor", RL_UN_FLOOR},
    {"ceil", RL_UN_CEIL},
    {"round", RL_UN_ROUND},
    {"clamp", RL_UN_CLAMP},
};
#define N_UNARY (sizeof unary_ops / sizeof unary_ops[0])

/* upvalue 1: index into unary_ops; upvalue 2: in place (boolean) */
static int l_unary(lua_State *L) {
    size_t k = (size_t)lua_tointeger(L, lua_upvalueindex(1));
    bool inplace = lua_toboolean(L, lua_upvalueindex(2));
    rl_unary_op op = unary_ops[k].op;
    const char *fname = lua_tostring(L, lua_upvalueindex(3));
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    double p0 = 0, p1 = 0;
    if (op == RL_UN_ELU) {
        p0 = luaL_optnumber(L, 2, 1.0);
    } else if (op == RL_UN_CLAMP) {
        p0 = luaL_optnumber(L, 2, -HUGE_VAL);
        p1 = luaL_optnumber(L, 3, HUGE_VAL);
        if (lua_isnoneornil(L, 2) && lua_isnoneornil(L, 3))
            return luaL_error(L, "%s: expects a lower and/or an upper bound", fname);
        if (p0 > p1)
            return luaL_error(L, "%s: lower bound %f is above upper bound %f", fname, p0, p1);
    }
    rl_tensor *out = t;
    if (!inplace) out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_unary(out, t, op, p0, p1), fname);
    if (inplace) lua_settop(L, 1);
    return 1;
}

static const struct {
    const char *name;
    rl_binary_op op;
} binary_ops[] = {
    {"add", RL_BIN_ADD}, {"sub", RL_BIN_SUB},     {"mul", RL_BIN_MUL},     {"div", RL_BIN_DIV},
    {"pow", RL_BIN_POW}, {"maximum", RL_BIN_MAX}, {"minimum", RL_BIN_MIN}, {"eq", RL_BIN_EQ},
    {"ne", RL_BIN_NE},   {"lt", RL_BIN_LT},       {"le", RL_BIN_LE},       {"gt", RL_BIN_GT},
    {"ge", RL_BIN_GE},
};
#define N_BINARY (sizeof binary_ops / sizeof binary_ops[0])

/* out (pushed or given) = a op b where either may be a number (not both). */
static int binary(lua_State *L, int ia, int ib, rl_binary_op op, const char *fname,
                  rl_tensor *out) {
    rl_tensor *a = rl_lua_to_tensor(L, ia), *b = rl_lua_to_tensor(L, ib);
    if (!a && !b)
        return luaL_error(L, "%s: expected a tensor operand, got %s and %s", fname,
                          luaL_typename(L, ia), luaL_typename(L, ib));
    if (!out) out = rl_lua_push_tensor(L);
    rl_status st;
    if (a && b) {
        st = rl_op_binary(out, a, b, op);
    } else {
        int inum = a ? ib : ia;
        if (lua_type(L, inum) != LUA_TNUMBER)
            return luaL_error(L, "%s: expected a tensor or a number, got %s", fname,
                              luaL_typename(L, inum));
        st = rl_op_binary_scalar(out, a ? a : b, lua_tonumber(L, inum), op, a == NULL);
    }
    return raise_if(L, st, fname);
}

static int l_binary(lua_State *L) {
    size_t k = (size_t)lua_tointeger(L, lua_upvalueindex(1));
    bool inplace = lua_toboolean(L, lua_upvalueindex(2));
    const char *fname = lua_tostring(L, lua_upvalueindex(3));
    if (inplace) {
        rl_tensor *t = rl_lua_check_tensor(L, 1);
        binary(L, 1, 2, binary_ops[k].op, fname, t);
        lua_settop(L, 1);
        return 1;
    }
    /* rl.add(a, b [, out]) writes into out when given */
    rl_tensor *out = rl_lua_to_tensor(L, 3);
    binary(L, 1, 2, binary_ops[k].op, fname, out);
    if (out) lua_settop(L, 3);
    return 1;
}

static int mm_add(lua_State *L) { return binary(L, 1, 2, RL_BIN_ADD, "+", NULL), 1; }
static int mm_sub(lua_State *L) { return binary(L, 1, 2, RL_BIN_SUB, "-", NULL), 1; }
static int mm_mul(lua_State *L) { return binary(L, 1, 2, RL_BIN_MUL, "*", NULL), 1; }
static int mm_div(lua_State *L) { return binary(L, 1, 2, RL_BIN_DIV, "/", NULL), 1; }
static int mm_pow(lua_State *L) { return binary(L, 1, 2, RL_BIN_POW, "^", NULL), 1; }
static int mm_unm(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_unary(out, t, RL_UN_NEG, 0, 0), "unary -");
    return 1;
}

/* ---------------------------------------------------------------- reductions */

/* t:sum() -> number; t:sum(dim [, keepdim]) -> tensor. Likewise mean, prod, norm. */
static int reduce(lua_State *L, rl_reduce_op op, const char *fname) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (lua_isnoneornil(L, 2)) {
        double r;
        raise_if(L, rl_op_reduce_all(&r, NULL, t, op), fname);
        push_number(L, t, r);
        return 1;
    }
    int dim = rl_lua_check_dim(L, 2, t, fname);
    bool keep = lua_toboolean(L, 3);
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_reduce_dim(out, NULL, t, dim, keep, op), fname);
    return 1;
}

static int m_sum(lua_State *L) { return reduce(L, RL_RED_SUM, "sum"); }
static int m_mean(lua_State *L) { return reduce(L, RL_RED_MEAN, "mean"); }
static int m_prod(lua_State *L) { return reduce(L, RL_RED_PROD, "prod"); }
static int m_norm(lua_State *L) { return reduce(L, RL_RED_NORM, "norm"); }

/* Positions returned to Lua are 1-based: add 1 to the kernels' 0-based indices. */
static void indices_to_lua(lua_State *L, rl_tensor *idx, const char *fname) {
    raise_if(L, rl_op_binary_scalar(idx, idx, 1.0, RL_BIN_ADD, false), fname);
}

/* t:max() -> value, position (1-based, flat); t:max(dim [, keepdim]) -> values, positions;
 * t:max(other_tensor) is the elementwise maximum. */
/* max/min (values true): the values and 1-based indices; argmax/argmin: the indices alone. */
static int minmax(lua_State *L, rl_reduce_op op, const char *fname, bool values) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (values && rl_lua_to_tensor(L, 2))
        return binary(L, 1, 2, op == RL_RED_MAX ? RL_BIN_MAX : RL_BIN_MIN, fname, NULL), 1;
    if (lua_isnoneornil(L, 2)) {
        double r;
        int64_t index;
        raise_if(L, rl_op_reduce_all(&r, &index, t, op), fname);
        if (values) push_number(L, t, r);
        lua_pushinteger(L, index + 1);
        return values ? 2 : 1;
    }
    int dim = rl_lua_check_dim(L, 2, t, fname);
    bool keep = lua_toboolean(L, 3);
    rl_tensor *vals = rl_lua_push_tensor(L);
    rl_tensor *idx = rl_lua_push_tensor(L);
    raise_if(L, rl_op_reduce_dim(vals, idx, t, dim, keep, op), fname);
    indices_to_lua(L, idx, fname);
    return values ? 2 : 1;
}

static int m_max(lua_State *L) { return minmax(L, RL_RED_MAX, "max", true); }
static int m_min(lua_State *L) { return minmax(L, RL_RED_MIN, "min", true); }
static int m_argmax(lua_State *L) { return minmax(L, RL_RED_MAX, "argmax", false); }
static int m_argmin(lua_State *L) { return minmax(L, RL_RED_MIN, "argmin", false); }

/* ---------------------------------------------------------------- products, joins, gathers */

/* rl.matmul(a, b [, out]) */
static int l_matmul(lua_State *L) {
    rl_tensor *a = rl_lua_check_tensor(L, 1), *b = rl_lua_check_tensor(L, 2);
    rl_tensor *out = rl_lua_to_tensor(L, 3);
    if (out) {
        lua_settop(L, 3);
    } else {
        if (!lua_isnoneornil(L, 3)) return luaL_argerror(L, 3, "expected an output tensor");
        out = rl_lua_push_tensor(L);
    }
    raise_if(L, rl_op_matmul(out, a, b), "matmul");
    return 1;
}

/* rl.gemm(a, b, {trans_a=, trans_b=, alpha=, beta=, out=}) -> out */
static int l_gemm(lua_State *L) {
    rl_tensor *a = rl_lua_check_tensor(L, 1), *b = rl_lua_check_tensor(L, 2);
    bool ta = false, tb = false;
    double alpha = 1, beta = 0;
    rl_tensor *out = NULL;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "trans_a");
        ta = lua_toboolean(L, -1);
        lua_getfield(L, 3, "trans_b");
        tb = lua_toboolean(L, -1);
        lua_getfield(L, 3, "alpha");
        alpha = luaL_optnumber(L, -1, 1.0);
        lua_getfield(L, 3, "beta");
        beta = luaL_optnumber(L, -1, 0.0);
        lua_getfield(L, 3, "out");
        out = rl_lua_to_tensor(L, -1);
        if (!out && !lua_isnil(L, -1))
            return luaL_error(L, "gemm: out must be a tensor, got %s", luaL_typename(L, -1));
    } else if (!lua_isnoneornil(L, 3)) {
        return luaL_argerror(L, 3, "expected an options table");
    }
    if (!out)
        out = rl_lua_push_tensor(L);
    else
        lua_pushvalue(L, -1);
    raise_if(L, rl_op_gemm(out, a, b, ta, tb, alpha, beta), "gemm");
    return 1;
}

static int m_matmul(lua_State *L) { return l_matmul(L); }

/* rl.cat({t1, t2, ...} [, dim]) with dim 1-based (default 1) */
static int l_cat(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    int n = (int)luaL_len(L, 1);
    if (n == 0) return luaL_error(L, "cat: expects a non-empty list of tensors");
    if (n > 4096) return luaL_error(L, "cat: at most 4096 tensors");
    const rl_tensor *ts[4096];
    for (int i = 0; i < n; i++) {
        lua_geti(L, 1, i + 1);
        ts[i] = rl_lua_to_tensor(L, -1);
        if (!ts[i])
            return luaL_error(L, "cat: element %d is a %s, expected a tensor", i + 1,
                              luaL_typename(L, -1));
        lua_pop(L, 1); /* the table keeps it alive */
    }
    int dim = 0;
    if (!lua_isnoneornil(L, 2)) dim = check_dim_range(L, 2, ts[0]->ndim, 0, "cat");
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_cat(out, ts, n, dim), "cat");
    return 1;
}

/* t:index_select(dim, idx) with idx a 1-D int32 tensor (or a table) of 1-based positions. The
 * positions are checked here, so that an error names them 1-based, as the caller wrote them. */
static void check_position(lua_State *L, lua_Integer v, int64_t entry, int64_t size, int dim) {
    if (v < 1 || v > size || v > INT32_MAX)
        luaL_error(L,
                   "index_select: position %I (entry %I of the index) out of range 1..%I for "
                   "dim %d",
                   v, (lua_Integer)entry + 1, (lua_Integer)size, dim + 1);
}

static int m_index_select(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int dim = rl_lua_check_dim(L, 2, t, "index_select");
    rl_tensor *idx = rl_lua_to_tensor(L, 3);
    rl_tensor *zero_based = rl_lua_push_tensor(L);
    if (idx) {
        if (idx->dtype != RL_INT32 || idx->ndim != 1) {
            char s[160];
            return luaL_error(L, "index_select: the index must be a 1-D int32 tensor, got %s",
                              rl_tensor_describe(idx, s, sizeof s));
        }
        rl_tensor *host = on_cpu(L, idx, "index_select");
        for (int64_t i = 0; i < host->shape[0]; i++)
            check_position(L, (lua_Integer)rl_tensor_get(host, &i), i, t->shape[dim], dim);
        raise_if(L, rl_op_binary_scalar(zero_based, idx, 1.0, RL_BIN_SUB, false), "index_select");
    } else if (lua_istable(L, 3)) {
        int64_t n = (int64_t)luaL_len(L, 3);
        raise_if(L, rl_tensor_empty(zero_based, RL_INT32, rl_tensor_device(t), 1, &n),
                 "index_select");
        rl_tensor *host = zero_based;
        if (rl_tensor_device(t).type != RL_CPU) {
            host = rl_lua_push_tensor(L);
            raise_if(L, rl_tensor_empty(host, RL_INT32, RL_DEVICE_CPU, 1, &n), "index_select");
        }
        for (int64_t i = 0; i < n; i++) {
            lua_geti(L, 3, i + 1);
            int isnum;
            lua_Integer v = lua_tointegerx(L, -1, &isnum);
            if (!isnum)
                return luaL_error(L, "index_select: entry %I of the index is not an integer (%s)",
                                  (lua_Integer)i + 1, luaL_typename(L, -1));
            lua_pop(L, 1);
            check_position(L, v, i, t->shape[dim], dim);
            ((int32_t *)rl_tensor_data(host))[i] = (int32_t)(v - 1);
        }
        if (host != zero_based) {
            raise_if(L, rl_op_copy(zero_based, host), "index_select");
            lua_pop(L, 1);
        }
    } else {
        return luaL_argerror(L, 3, "expected an int32 tensor or a table of positions");
    }
    rl_tensor *out = rl_lua_push_tensor(L);
    raise_if(L, rl_op_index_select(out, t, dim, zero_based), "index_select");
    return 1;
}

/* ---------------------------------------------------------------- indexing */

/* t[i]: a number for a 1-D tensor, else the view t:select(1, i). Strings index methods. */
static int mm_index(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    if (lua_type(L, 2) != LUA_TNUMBER) {
        lua_getmetatable(L, 1);
        lua_getfield(L, -1, "__methods");
        lua_pushvalue(L, 2);
        lua_rawget(L, -2);
        return 1;
    }
    int isint;
    lua_Integer i = lua_tointegerx(L, 2, &isint);
    if (!isint) return luaL_error(L, "index: %f is not an integer position", lua_tonumber(L, 2));
    if (t->ndim == 0) return luaL_error(L, "index: cannot index a 0-dim tensor (use item())");
    if (i < 1 || i > t->shape[0]) {
        char s[128];
        return luaL_error(L, "index: position %I out of range 1..%I for %s", i,
                          (lua_Integer)t->shape[0], rl_shape_str(t, s, sizeof s));
    }
    rl_tensor *v = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_select(v, t, 0, i - 1), "index");
    if (v->ndim == 0) {
        rl_tensor *c = on_cpu(L, v, "index");
        push_number(L, c, rl_tensor_get(c, NULL));
    }
    return 1;
}

/* t[i] = number fills row i; t[i] = tensor copies into it (broadcasting). */
static int mm_newindex(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    int isint;
    lua_Integer i = lua_tointegerx(L, 2, &isint);
    if (!isint)
        return luaL_error(L, "index assignment: key must be an integer position, got %s",
                          luaL_typename(L, 2));
    if (t->ndim == 0 || i < 1 || i > t->shape[0]) {
        char s[128];
        return luaL_error(L, "index assignment: position %I out of range for %s", i,
                          rl_shape_str(t, s, sizeof s));
    }
    rl_tensor *v = rl_lua_push_tensor(L);
    raise_if(L, rl_tensor_select(v, t, 0, i - 1), "index assignment");
    rl_tensor *src = rl_lua_to_tensor(L, 3);
    if (src)
        raise_if(L, rl_op_copy(v, src), "index assignment");
    else if (lua_type(L, 3) == LUA_TNUMBER)
        raise_if(L, rl_op_fill(v, lua_tonumber(L, 3)), "index assignment");
    else
        return luaL_error(L, "index assignment: value must be a number or a tensor, got %s",
                          luaL_typename(L, 3));
    return 0;
}

static int mm_len(lua_State *L) {
    rl_tensor *t = rl_lua_check_tensor(L, 1);
    lua_pushinteger(L, t->ndim ? t->shape[0] : 0);
    return 1;
}

static int mm_gc(lua_State *L) {
    tensor_ud *u = luaL_checkudata(L, 1, RL_TENSOR_MT);
    rl_tensor_release(&u->t);
    u->freed = true;
    return 0;
}

/* ---------------------------------------------------------------- module functions */

static int l_storage_bytes(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)rl_storage_live_bytes());
    return 1;
}

static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, luaL_testudata(L, 1, RL_TENSOR_MT) != NULL);
    return 1;
}

static int l_manual_seed(lua_State *L) {
    lua_Integer s = luaL_checkinteger(L, 1);
    rl_rng_seed(rl_rng_default(), (uint64_t)s);
    return 0;
}

static int l_get_rng_state(lua_State *L) {
    rl_rng *g = rl_rng_default();
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)g->seed);
    lua_setfield(L, -2, "seed");
    lua_pushinteger(L, (lua_Integer)g->offset);
    lua_setfield(L, -2, "offset");
    return 1;
}

static int l_set_rng_state(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "seed");
    lua_getfield(L, 1, "offset");
    int ok1, ok2;
    lua_Integer seed = lua_tointegerx(L, -2, &ok1), offset = lua_tointegerx(L, -1, &ok2);
    if (!ok1 || !ok2)
        return luaL_error(L, "set_rng_state: expects {seed = integer, offset = integer}");
    rl_rng *g = rl_rng_default();
    g->seed = (uint64_t)seed;
    g->offset = (uint64_t)offset;
    return 0;
}

static int l_device_count(lua_State *L) {
    const rl_device_backend *b = rl_device_cuda_backend();
    lua_pushinteger(L, b ? b->count() : 0);
    return 1;
}

static int l_synchronize(lua_State *L) {
    rl_device dev = RL_DEVICE_CPU;
    if (!lua_isnoneornil(L, 1)) parse_device(L, luaL_checkstring(L, 1), "synchronize", &dev);
    raise_if(L, rl_op_synchronize(dev), "synchronize");
    return 0;
}

static int size_tostring(lua_State *L) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addchar(&b, '(');
    lua_Integer n = luaL_len(L, 1);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        if (i > 1) luaL_addstring(&b, ", ");
        luaL_addvalue(&b);
    }
    luaL_addchar(&b, ')');
    luaL_pushresult(&b);
    return 1;
}

static int size_eq(lua_State *L) {
    lua_Integer n = luaL_len(L, 1);
    if (!lua_istable(L, 2) || luaL_len(L, 2) != n) {
        lua_pushboolean(L, 0);
        return 1;
    }
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        lua_geti(L, 2, i);
        if (!lua_rawequal(L, -1, -2)) {
            lua_pushboolean(L, 0);
            return 1;
        }
        lua_pop(L, 2);
    }
    lua_pushboolean(L, 1);
    return 1;
}

static const luaL_Reg tensor_methods[] = {
    {"size", m_size},
    {"stride", m_stride},
    {"dim", m_dim},
    {"nDimension", m_dim},
    {"numel", m_numel},
    {"nElement", m_numel},
    {"dtype", m_dtype},
    {"type", m_dtype},
    {"device", m_device},
    {"is_contiguous", m_is_contiguous},
    {"narrow", m_narrow},
    {"select", m_select},
    {"view", m_view},
    {"reshape", m_reshape},
    {"transpose", m_transpose},
    {"t", m_t},
    {"permute", m_permute},
    {"squeeze", m_squeeze},
    {"unsqueeze", m_unsqueeze},
    {"expand", m_expand},
    {"contiguous", m_contiguous},
    {"clone", m_clone},
    {"copy", m_copy},
    {"copy_", m_copy},
    {"float", m_float},
    {"double", m_double},
    {"int", m_int},
    {"cpu", m_cpu},
    {"cuda", m_cuda},
    {"to", m_to},
    {"totable", m_totable},
    {"item", m_item},
    {"fill", m_fill_},
    {"fill_", m_fill_},
    {"zero", m_zero_},
    {"zero_", m_zero_},
    {"uniform_", m_uniform_},
    {"normal_", m_normal_},
    {"masked_fill", m_masked_fill_new},
    {"masked_fill_", m_masked_fill_inplace},
    {"sum", m_sum},
    {"mean", m_mean},
    {"prod", m_prod},
    {"norm", m_norm},
    {"max", m_max},
    {"min", m_min},
    {"argmax", m_argmax},
    {"argmin", m_argmin},
    {"matmul", m_matmul},
    {"index_select", m_index_select},
    {NULL, NULL},
};

static const luaL_Reg tensor_meta[] = {
    {"__index", mm_index}, {"__newindex", mm_newindex}, {"__len", mm_len}, {"__gc", mm_gc},
    {"__close", mm_gc},    {"__add", mm_add},           {"__sub", mm_sub}, {"__mul", mm_mul},
    {"__div", mm_div},     {"__pow", mm_pow},           {"__unm", mm_unm}, {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"tensor", l_tensor},
    {"storage_bytes", l_storage_bytes},
    {"zeros", l_zeros},
    {"ones", l_ones},
    {"empty", l_empty},
    {"full", l_full},
    {"rand", l_rand},
    {"randn", l_randn},
    {"arange", l_arange},
    {"matmul", l_matmul},
    {"gemm", l_gemm},
    {"cat", l_cat},
    {"is_tensor", l_is_tensor},
    {"manual_seed", l_manual_seed},
    {"get_rng_state", l_get_rng_state},
    {"set_rng_state", l_set_rng_state},
    {"device_count", l_device_count},
    {"synchronize", l_synchronize},
    {NULL, NULL},
};

/* Adds fname -> closure(k, inplace, fname) to the table on top. */
static void add_op_closure(lua_State *L, lua_CFunction f, size_t k, bool inplace,
                           const char *name) {
    lua_pushinteger(L, (lua_Integer)k);
    lua_pushboolean(L, inplace);
    lua_pushstring(L, name);
    lua_pushcclosure(L, f, 3);
    lua_setfield(L, -2, name);
}

void rl_lua_open_tensor(lua_State *L) {
    int module = lua_gettop(L);

    luaL_newmetatable(L, "rnnlua.Size");
    lua_pushcfunction(L, size_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, size_eq);
    lua_setfield(L, -2, "__eq");
    lua_pop(L, 1);

    luaL_newmetatable(L, RL_TENSOR_MT);
    luaL_setfuncs(L, tensor_meta, 0);
    lua_pushstring(L, "rnnlua.Tensor");
    lua_setfield(L, -2, "__name");
    /* methods live in mt.__methods; __index looks them up (and handles t[i]) */
    lua_newtable(L);
    luaL_setfuncs(L, tensor_methods, 0);
    char name[64];
    for (size_t k = 0; k < N_UNARY; k++) {
        add_op_closure(L, l_unary, k, false, unary_ops[k].name);
        snprintf(name, sizeof name, "%s_", unary_ops[k].name);
        add_op_closure(L, l_unary, k, true, name);
    }
    for (size_t k = 0; k < N_BINARY; k++) {
        add_op_closure(L, l_binary, k, false, binary_ops[k].name);
        snprintf(name, sizeof name, "%s_", binary_ops[k].name);
        add_op_closure(L, l_binary, k, true, name);
    }
    lua_setfield(L, -2, "__methods");
    lua_pop(L, 1);

    luaL_setfuncs(L, module_funcs, 0);
    lua_pushinteger(L, RL_MAX_NUMEL);
    lua_setfield(L, -2, "MAX_NUMEL");
    for (size_t k = 0; k < N_UNARY; k++)
        add_op_closure(L, l_unary, k, false, unary_ops[k].name);
    for (size_t k = 0; k < N_BINARY; k++)
        add_op_closure(L, l_binary, k, false, binary_ops[k].name);
    lua_settop(L, module);
}
