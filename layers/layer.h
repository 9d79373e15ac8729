/* Layer objects: the contract every layer of rnnlua follows, C or Lua.
 *
 * Data is time-major: an input or output is (T, B, F) with int32 lengths[B] on the CPU
 * (1 <= lengths[b] <= T). Frames t >= lengths[b] are padding: they never reach a loss, a
 * gradient or a recurrent state, and a layer writes 0 to its output there when that is
 * cheap (the network does not rely on it: losses mask by lengths).
 *
 * The gradient rule: backward writes the gradient of each input with `=` into the buffer the
 * network gives (grad_in[i], NULL when that input needs none) and accumulates the gradient of
 * each parameter with `+=` into param.grad. A layer may keep in its own buffers whatever its
 * forward computed for its backward (activations, gates); backward is called at most once
 * after each forward, with the same inputs.
 *
 * Buffers: a layer owns `out` and its scratch and (re)sizes them with rl_buffer_ensure at the
 * start of forward, so batches of one shape allocate nothing after the first.
 *
 * 2-D data (images): an input or output is (H, W, B, F) with int32 sizes (B, 2) on the CPU,
 * sizes[b] = (height, width) of image b (1 <= height <= H, 1 <= width <= W). Positions with
 * y >= height or x >= width are padding, under the same rules as padded frames. Which layers
 * take or give 2-D data is a property of the class (rl_layer_class_flags).
 *
 * dtype: a layer computes in its inputs' dtype (float32 for training, float64 on the CPU for
 * gradient checks); its parameters have the same dtype (the network's).
 *
 * Per-step use (a rec unit, lua/rnnlua/rec.lua): a layer may be run on (1, B, F) views, one
 * step of a sequence at a time, with lengths all 1 (the rec layer keeps finished sequences'
 * gradients at zero itself). A layer with recurrent state (ops->state, rl_state_ops below) takes
 * it explicitly instead of keeping it between calls: before forward the previous state
 * (rl_layer_set_initial_state), after it the new one (rl_layer_final_state); before backward the
 * gradient of the new state from the step after (rl_layer_set_final_state_grad), after it the
 * gradient of the previous state (rl_layer_initial_state_grad). Callers (the rec layer, the
 * network's carried state, the bindings) learn a layer's state tensors from
 * rl_layer_state_info, never from its class name. Since backward must follow the forward it
 * belongs to, the rec layer re-runs each step's forward from its stored inputs and state right
 * before that step's backward; a layer needs nothing else for per-step use.
 *
 * Adding a layer type: one file layers/X.c with its ops and a create function, and one line
 * in layers/registry.c.
 */
#ifndef RL_LAYER_H
#define RL_LAYER_H

#include <stdbool.h>

#include "../core/rng.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RL_LAYER_MAX_INPUTS 16
#define RL_LAYER_MAX_PARAMS 8
#define RL_LAYER_NAME_MAX 64
#define RL_LAYER_MAX_STATES 4 /* recurrent state tensors of one layer (rl_state_ops) */
/* The one way a message names a layer, with its name and class as the next two arguments:
 * "layer 'fw' (class lstm): ..." (util.layer_where on the Lua side). */
#define RL_LAYER_WHERE "layer '%s' (class %s)"

/* How a parameter is initialised (by the network, from the seeded generator). */
typedef enum {
    RL_INIT_ZEROS = 0,
    RL_INIT_CONSTANT,   /* a */
    RL_INIT_UNIFORM,    /* U(-a, a) */
    RL_INIT_NORMAL,     /* N(0, a^2) */
    RL_INIT_GLOROT,     /* U(-s, s), s = a * sqrt(6 / (fan_in + fan_out)); a is the gain */
    RL_INIT_ORTHOGONAL, /* each (rows, rows) block of a 2-D (rows, k*rows) matrix orthogonal, else
                           orthonormal rows of a (rows, cols >= rows) one */
} rl_init_kind;

typedef struct rl_param {
    char name[32]; /* "W", "U", "b", ... unique within the layer */
    int ndim;
    int64_t shape[RL_MAX_DIMS];
    rl_init_kind init;
    double init_a;
    int64_t fan_in, fan_out; /* for glorot */
    rl_tensor value;         /* view into the network's flat parameter buffer */
    rl_tensor grad;          /* view into the flat gradient buffer (same geometry) */
} rl_param;

/* Options of a layer description ({class = "lstm", n_out = 32, ...}), read by name. The Lua
 * side implements it over the description table and reports every key no layer asked for as
 * an unknown option, so layers only read what they understand. Each getter returns RL_OK
 * with the default when the key is absent, and an error naming the layer and the key when
 * the value has the wrong type or is out of range. */
typedef struct rl_options {
    void *ctx;
    /* found: 1 when present, 0 absent; an error status when present with the wrong type */
    rl_status (*number)(void *ctx, const char *key, double *v, int *found);
    rl_status (*string)(void *ctx, const char *key, const char **v, int *found);
    rl_status (*boolean)(void *ctx, const char *key, bool *v, int *found);
    /* the class being created, for the messages (RL_LAYER_WHERE): rl_layer_create fills it */
    const char *class_name;
} rl_options;

rl_status rl_opt_number(const rl_options *o, const char *layer, const char *key, double def,
                        double *v);
/* An integer >= min; `required` makes absence an error
 * ("layer 'x' (class linear): missing option n_out"). */
rl_status rl_opt_int(const rl_options *o, const char *layer, const char *key, int64_t def,
                     int64_t min, bool required, int64_t *v);
/* A pair option such as filter_size = {fh, fw}: read as the numbers "KEY[1]" and "KEY[2]"
 * (the Lua binding also accepts KEY = n for both); KEY[2] defaults to KEY[1]. */
rl_status rl_opt_pair(const rl_options *o, const char *layer, const char *key, int64_t def,
                      int64_t min, bool required, int64_t v[2]);
rl_status rl_opt_string(const rl_options *o, const char *layer, const char *key, const char *def,
                        const char **v);
rl_status rl_opt_bool(const rl_options *o, const char *layer, const char *key, bool def, bool *v);

/* What the network hands a layer for one batch. */
typedef struct rl_layer_io {
    int n_in;
    const rl_tensor *in[RL_LAYER_MAX_INPUTS]; /* (T, B, in_dims[i]) */
    const rl_tensor *lengths;                 /* (B) int32, CPU; for 2-D inputs NULL */
    const rl_tensor *sizes;                   /* 2-D inputs: (B, 2) int32, CPU; else NULL */
    const rl_tensor *target;                  /* loss layers: (T, B) int32 or (T, B, F) */
    /* a target of its own length (loss "ctc": (S, B) int32 labels): (B) int32 CPU, else NULL */
    const rl_tensor *target_lengths;
    bool train;  /* dropout and the like act only when true */
    rl_rng *rng; /* the network's generator (dropout masks) */
    /* loss layers fill these in forward when target is set: the summed loss over valid
     * frames, the number of wrongly classified frames (0 for mse) and of valid frames; a
     * sequence-level loss (ctc) counts label errors (edit distance of the best path to the
     * target) in n_errors, their reference labels in n_labels and the sequences it left out
     * of the loss (no alignment fits: infinite loss) in n_skipped */
    double loss, n_errors, n_frames, n_labels, n_skipped;
} rl_layer_io;

typedef struct rl_layer rl_layer;

/* A layer's recurrent state: n tensors, each (B, dims[i]), named names[i] in messages and by
 * callers ("h", "c"); state 0 is what the layer outputs at each step (its h). Every array below
 * has one entry per state, in that order. */
typedef struct rl_state_ops {
    /* The number of states; *names, *dims: the layer's arrays (valid while it lives). */
    int (*info)(const rl_layer *l, const char *const **names, const int64_t **dims);
    /* The states the following forwards start from: each NULL (zeros) or a float (B, dims[i])
     * tensor, shared, not copied (batch size and device checked at each forward). */
    rl_status (*set_initial)(rl_layer *l, const rl_tensor *const *s);
    /* The gradients of the final states the following backwards start from, as set_initial. */
    rl_status (*set_final_grad)(rl_layer *l, const rl_tensor *const *g);
    /* out[i] (NULL: skipped) become views (B, dims[i]) of each sequence's state after its own
     * last frame, valid until the next forward (an error before any forward). */
    rl_status (*final)(rl_layer *l, rl_tensor *const *out);
    /* out[i] (NULL: skipped) become views (B, dims[i]) of dLoss/d(initial state i) after a
     * backward, valid until the next backward (an error before any backward). */
    rl_status (*initial_grad)(rl_layer *l, rl_tensor *const *out);
} rl_state_ops;

typedef struct rl_layer_ops {
    const char *class_name;
    /* Computes l->out (T, B, n_out) from io->in; loss layers also the loss when io->target. */
    rl_status (*forward)(rl_layer *l, rl_layer_io *io);
    /* grad_out: dLoss/dout (T, B, n_out), 0 on padded frames; NULL for a loss layer starting
     * from its own loss (a loss layer given a grad_out adds it to its own loss's gradient).
     * grad_in[i]: set tensors shaped like io->in[i] to write with `=`, or NULL. */
    rl_status (*backward)(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                          rl_tensor *const *grad_in);
    /* Frees what the layer owns beyond the struct fields below (may be NULL). */
    void (*destroy)(rl_layer *l);
    /* Runs after every param got its init kind's values (rl_layer_init_params), for inits no
     * kind expresses, such as the LSTM's forget-gate bias; may be NULL. */
    rl_status (*init_params)(rl_layer *l, rl_rng *g);
    /* The recurrent state (per-step use above), or NULL for a layer without. */
    const rl_state_ops *state;
} rl_layer_ops;

struct rl_layer {
    const rl_layer_ops *ops;
    char name[RL_LAYER_NAME_MAX];
    int n_in;
    int64_t in_dims[RL_LAYER_MAX_INPUTS];
    int64_t n_out;
    bool is_loss; /* computes a loss from a target (softmax with loss = "ce"/"mse") */
    int n_params;
    rl_param params[RL_LAYER_MAX_PARAMS];
    rl_tensor out; /* (T, B, n_out), owned */
};

/* Creates a layer of a registered class. in_dims: the feature dim of each input. */
typedef rl_status (*rl_layer_create_fn)(rl_layer **out, const char *name, const rl_options *opts,
                                        int n_in, const int64_t *in_dims);

/* What a class takes and gives (registry.c): sequences (T, B, F) by default. */
enum {
    RL_LAYER_IN_2D = 1,     /* its inputs are (H, W, B, F) with sizes */
    RL_LAYER_OUT_2D = 2,    /* its output is (H, W, B, F) with the inputs' sizes */
    RL_LAYER_ANY_RANK = 4,  /* works on (T, B, F) and (H, W, B, F) alike, keeping the rank */
    RL_LAYER_SPARSE_IN = 8, /* its input is (T, B) int32 class indices; in_dims[0] = classes */
};
/* The flags of a registered class, or -1 when there is no such class. */
int rl_layer_class_flags(const char *class_name);

rl_status rl_layer_create(rl_layer **out, const char *class_name, const char *name,
                          const rl_options *opts, int n_in, const int64_t *in_dims);
/* Names of the registered C classes, NULL-terminated. */
const char *const *rl_layer_classes(void);
/* Releases out, the params' views and everything else the layer owns; frees it. */
void rl_layer_free(rl_layer *l);

/* Helpers for layer implementations. */
/* Allocates a zeroed layer struct of `size` bytes (>= sizeof(rl_layer)) and fills the common
 * fields; the struct's first member must be the rl_layer. */
rl_status rl_layer_alloc(rl_layer **out, size_t size, const rl_layer_ops *ops, const char *name,
                         int n_in, const int64_t *in_dims);
/* Declares parameter number l->n_params; returns its index. */
rl_status rl_layer_add_param(rl_layer *l, const char *pname, int ndim, const int64_t *shape,
                             rl_init_kind init, double init_a, int64_t fan_in, int64_t fan_out,
                             int *index);
/* Checks the batch: every input (T, B, in_dims[i]) with the same T and B and dtype, lengths
 * (B) int32 within 1..T; sets T and B. Errors name the layer and the shapes. */
rl_status rl_layer_check_inputs(const rl_layer *l, const rl_layer_io *io, int64_t *T, int64_t *B);
/* Classes flagged RL_LAYER_SPARSE_IN (embedding, linear, softmax) also take (T, B) int32 class
 * indices as an input (in_dims[i] = the number of classes): rl_layer_check_inputs then also
 * checks every index of a valid frame against 0..in_dims[i]-1 (padded frames are never read)
 * and that it is on the CPU. rl_layer_input_sparse tells such an input apart;
 * rl_layer_compute_type gives the dtype and device a layer computes in: its first dense
 * input's, else its parameters'. */
bool rl_layer_input_sparse(const rl_layer *l, const rl_tensor *x);
rl_status rl_layer_compute_type(const rl_layer *l, const rl_layer_io *io, rl_dtype *dt,
                                rl_device *dev);
/* Sparse rows: z (T*B, D) row (t*B + b) += W[x[t, b]] (W (V, D)) on valid frames t < len[b],
 * or with scatter W[x[t, b]] += z row (the weight gradient). CPU tensors of one float dtype,
 * indices checked before (rl_layer_check_inputs). */
void rl_sparse_rows_add(rl_tensor *z, const rl_tensor *x, const rl_tensor *len, rl_tensor *W,
                        bool scatter);
/* The same for 2-D inputs: every input (H, W, B, in_dims[i]), sizes (B, 2) int32 within
 * 1..H and 1..W. */
rl_status rl_layer_check_inputs_2d(const rl_layer *l, const rl_layer_io *io, int64_t *H, int64_t *W,
                                   int64_t *B);
/* RL_OK when dev can hold tensors now (the CPU, or an existing CUDA device in a CUDA build);
 * else an RL_EDEVICE error naming the layer, its class and the device. */
rl_status rl_layer_check_device(const rl_layer *l, rl_device dev);
/* Grows a layer-owned index array *p of *cap entries to at least n (realloc; kept otherwise);
 * an out-of-memory error names the layer. */
rl_status rl_layer_grow_index(const rl_layer *l, int64_t **p, size_t *cap, size_t n);
/* Concatenated inputs: writes io->in[0..n_in-1] side by side along the feature dim into out
 * (set, (T, B, sum in_dims)); and the transpose, each grad_in[i] (NULL to skip) = its slice of
 * grad_out. Used by every layer whose output is its inputs concatenated. */
rl_status rl_layer_concat_inputs(const rl_layer *l, const rl_layer_io *io, rl_tensor *out);
rl_status rl_layer_split_grad(const rl_layer *l, const rl_tensor *grad_out,
                              rl_tensor *const *grad_in);
/* Fills params[i].value per its init (fan-in/out, orthogonal via Gram-Schmidt in float64). */
rl_status rl_param_init(rl_param *p, rl_rng *g);
/* Initialises every (bound) param of the layer in order, then runs ops->init_params. */
rl_status rl_layer_init_params(rl_layer *l, rl_rng *g);
/* The index of the param named pname, or -1. */
int rl_layer_find_param(const rl_layer *l, const char *pname);
/* The layer's total parameter count. */
int64_t rl_layer_num_params(const rl_layer *l);

/* Recurrent state through ops->state: the number of states (0 for a layer without; names and
 * dims may be NULL when not wanted). */
int rl_layer_state_info(const rl_layer *l, const char *const **names, const int64_t **dims);
/* The rl_state_ops calls with n entries (n <= the number of states; the states beyond n count
 * as NULL). Errors name the layer and its class: a layer without state, n too large, a
 * tensor of the wrong shape or dtype, a read before the forward or backward that makes it. */
rl_status rl_layer_set_initial_state(rl_layer *l, int n, const rl_tensor *const *s);
rl_status rl_layer_set_final_state_grad(rl_layer *l, int n, const rl_tensor *const *g);
rl_status rl_layer_final_state(rl_layer *l, int n, rl_tensor *const *out);
rl_status rl_layer_initial_state_grad(rl_layer *l, int n, rl_tensor *const *out);

#ifdef __cplusplus
}
#endif

#endif
