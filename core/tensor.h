/* Tensors: refcounted storage plus views.
 *
 * A storage is one allocation on one device, shared by every view of it and freed when its
 * last view is released. A tensor is a view: dtype, up to RL_MAX_DIMS dims, a shape, strides
 * in elements (not bytes) and an offset in elements into the storage. A 0-dim tensor holds
 * one element. An rl_tensor with storage == NULL is "unset": it owns nothing, releasing it is
 * a no-op, and ops treat it as an output to allocate (see kernels/ops.h).
 *
 * Ownership: an rl_tensor struct owns one reference to its storage. Every function that fills
 * an `out` tensor expects `out` unset (it does not release what was there) and, on success,
 * leaves it owning a fresh reference; on failure `out` stays unset. Indices and dims in this C
 * API are 0-based; the Lua layer converts from Lua's 1-based positions.
 */
#ifndef RL_TENSOR_H
#define RL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RL_MAX_DIMS 5

typedef enum { RL_FLOAT32 = 0, RL_FLOAT64, RL_INT32, RL_NUM_DTYPES } rl_dtype;

typedef enum { RL_CPU = 0, RL_CUDA } rl_device_type;

typedef struct {
    rl_device_type type;
    int index; /* CUDA ordinal; 0 for the CPU */
} rl_device;

typedef struct rl_storage {
    void *data;
    size_t nbytes;
    long refcount;
    rl_device device;
    uint64_t version; /* rl_storage_touch */
} rl_storage;

typedef struct rl_tensor {
    rl_storage *storage;
    rl_dtype dtype;
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    int64_t stride[RL_MAX_DIMS]; /* in elements; may be 0 (broadcast) */
    int64_t offset;              /* in elements */
} rl_tensor;

static const rl_device RL_DEVICE_CPU = {RL_CPU, 0};

/* dtypes and devices */
size_t rl_dtype_size(rl_dtype dt);
const char *rl_dtype_name(rl_dtype dt);
rl_status rl_dtype_parse(const char *name, rl_dtype *out); /* "float32", "float64", "int32" */
bool rl_device_eq(rl_device a, rl_device b);
/* "cpu", "cuda", "cuda:N"; only parses, see rl_device_check for availability */
rl_status rl_device_parse(const char *name, rl_device *out);
void rl_device_name(rl_device d, char *buf, size_t n);

/* Storage: allocate on a device (zero bytes allowed), take and drop references. */
rl_status rl_storage_new(rl_storage **out, size_t nbytes, rl_device dev);
void rl_storage_retain(rl_storage *s);
void rl_storage_release(rl_storage *s);
/* Bytes held by all live storages of the process (every device, every thread). A host's
 * garbage collector cannot see them behind its small handles; lua/l_tensor.c reads this to
 * collect garbage tensors in proportion to what they really hold. */
int64_t rl_storage_live_bytes(void);
/* The version of a storage's contents: a number no other storage and no earlier version of
 * this one had (process-wide), given at rl_storage_new and again at each rl_storage_touch.
 * Whoever may write the data through a handle of a host touches it (lua/l_tensor.c at every
 * access to a tensor from Lua, reads included), so that what is derived from the data and
 * kept (the bf16 packs of a network's weights, kernels/cpu/gemm_bf16.h) stays valid exactly
 * while the storage and its version are the same. Atomic; any thread. */
void rl_storage_touch(rl_storage *s);
uint64_t rl_storage_version(const rl_storage *s);

/* Checked arithmetic for shapes, sizes and positions: every product or sum of sizes that comes
 * from a user (a Lua call, a network description, a file) goes through these, so a size near
 * 2^31, 2^62 or INT64_MAX is an error instead of a wrapped number (a view that reads outside
 * its storage). A tensor holds at most RL_MAX_NUMEL elements, so that its byte count (at most
 * 8 bytes an element) and any sum of two element offsets stay far from overflowing. */
#define RL_MAX_NUMEL ((int64_t)1 << 59)
/* *r = a * b or a + b; false (and *r unspecified) when the exact result overflows int64. */
static inline bool rl_mul_ok(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool rl_add_ok(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}
/* The element count of a shape. Errors (named by `what`, e.g. "zeros" or "layer 'fw': parameter
 * W"): more than RL_MAX_DIMS dims, a negative size, a count above RL_MAX_NUMEL. */
rl_status rl_shape_numel(const char *what, int ndim, const int64_t *shape, int64_t *numel);

/* Creation: a new contiguous tensor (row-major strides), contents uninitialised. */
rl_status rl_tensor_empty(rl_tensor *out, rl_dtype dt, rl_device dev, int ndim,
                          const int64_t *shape);
/* A new contiguous tensor with the dtype, device and shape of `like`. */
rl_status rl_tensor_empty_like(rl_tensor *out, const rl_tensor *like);
/* Makes `buf` (unset or set) a contiguous tensor of this dtype, device and shape, reusing its
 * storage when it is large enough (views of it taken earlier then see the new contents, as
 * with a Torch module's `output`); allocates only otherwise. Layers
 * keep their activations and scratch in such buffers, so a training loop over batches of one
 * shape allocates nothing after the first. The contents are unspecified afterwards. */
rl_status rl_buffer_ensure(rl_tensor *buf, rl_dtype dt, rl_device dev, int ndim,
                           const int64_t *shape);
/* Drops the reference (if any) and makes `t` unset. */
void rl_tensor_release(rl_tensor *t);
/* `out` becomes another view with the same geometry as `src` (shares storage). */
void rl_tensor_share(rl_tensor *out, const rl_tensor *src);

/* Queries */
int64_t rl_tensor_numel(const rl_tensor *t);
bool rl_tensor_is_contiguous(const rl_tensor *t);
bool rl_tensor_same_shape(const rl_tensor *a, const rl_tensor *b);
rl_device rl_tensor_device(const rl_tensor *t);
/* Address of element [0,...,0] (the view's offset applied), or NULL when unset. */
void *rl_tensor_data(const rl_tensor *t);
/* "(2, 3)" into buf; returns buf, for error messages. */
const char *rl_shape_str(const rl_tensor *t, char *buf, size_t n);
/* "float32 (2, 3) on cpu", for error messages. */
const char *rl_tensor_describe(const rl_tensor *t, char *buf, size_t n);
/* Row-major contiguous strides for a shape. */
void rl_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);

/* Views: `out` (unset) becomes a view sharing `src`'s storage. Errors name the function. */
rl_status rl_tensor_narrow(rl_tensor *out, const rl_tensor *src, int dim, int64_t start,
                           int64_t len);
rl_status rl_tensor_select(rl_tensor *out, const rl_tensor *src, int dim, int64_t index);
/* shape may hold one -1 to infer; needs a contiguous src (use reshape otherwise) */
rl_status rl_tensor_view(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape);
rl_status rl_tensor_transpose(rl_tensor *out, const rl_tensor *src, int d0, int d1);
rl_status rl_tensor_permute(rl_tensor *out, const rl_tensor *src, const int *perm);
/* dim < 0 squeezes every size-1 dim */
rl_status rl_tensor_squeeze(rl_tensor *out, const rl_tensor *src, int dim);
rl_status rl_tensor_unsqueeze(rl_tensor *out, const rl_tensor *src, int dim);
/* Broadcast view to `shape` (size-1 dims get stride 0; leading dims are added). */
rl_status rl_tensor_expand(rl_tensor *out, const rl_tensor *src, int ndim, const int64_t *shape);

/* Broadcast shape of a and b (numpy rules); error names `op`. */
rl_status rl_broadcast_shape(const char *op, const rl_tensor *a, const rl_tensor *b, int *ndim,
                             int64_t *shape);

/* Host-side element access for CPU tensors (used by bindings and tests): index is 0-based
 * per dim, no bounds check. Values convert through double. */
double rl_tensor_get(const rl_tensor *t, const int64_t *index);
void rl_tensor_set(rl_tensor *t, const int64_t *index, double v);

#ifdef __cplusplus
}
#endif

#endif
