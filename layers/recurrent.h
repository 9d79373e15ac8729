/* The recurrent driver (layers/recurrent.c) and the plumbing it is made of: one implementation of
 * a recurrent layer's forward and backward for every cell (layers/lstm.c, gru.c, janet.c; "cells"
 * below says what a cell gives), the layer's CUDA stream and its events, the batch's lengths on
 * the device, the checks at the entry of forward and backward, the state ops and the packed
 * operands.
 *
 * The driver's buffers (rl_recurrent, sized per batch shape with rl_buffer_ensure; all kept from
 * forward for backward):
 *   gates (T, B, gate_blocks H)  pre-activations, then the cell's activations; backward
 *                        overwrites them with dZ
 *   seqs[i] (T+1, B, H)  state i in time order plus the initial state: for direction 1 row 0 is
 *                        the initial state and row t+1 the state after frame t; for -1 row t is
 *                        the state after frame t and row T the initial one. So the previous
 *                        states of all frames are rows 0..T-1 (1) or 1..T (-1). With cuDNN
 *                        (2, B, H): initial and final state.
 *   dstates[i] (B, H)    backward's running state gradients; at the end the initial state's
 *   xs[k], dxs[k]        contiguous copies of inputs (input gradients) whose (T, B) dims cannot be
 *                        folded into one; in a ragged batch also of every input, with the padded
 *                        frames zeroed: dW = X^T dZ over all frames would otherwise turn a NaN or
 *                        Inf in the padding into NaN gradients (0 * NaN), although dZ is 0 there
 *   zmask[i], aux[a] (T, B, H)  zoneout: the weights of each state with z > 0, and the cell's
 *                        per-frame buffers (the lstm's c~)
 *   md (B, H), hd (T, B, H), dtmp (B, H)  rec_dropout: the mask, the dropped previous states of
 *                        every frame (the products' operand, then dU's), backward's recurrent
 *                        product before the mask
 *   wdm, ud, dud (H, rec_gates H)  weight_dropout: the mask (0 or 1/(1-p)), U times it (the
 *                        steps' operand), backward's dU before the mask
 *   red                  CUDA: the launchers' partial sums
 * and in rl_rnn_cudnn (layers/rnn_cudnn.h) the cuDNN path's concatenated inputs.
 *
 * Devices: the inputs' device decides, and the params, the given initial state and
 * grad_out/grad_in must be on it (checked at every entry, so device memory never reaches a host
 * loop; lengths are CPU tensors by the layer contract).
 *
 * CUDA: the layer's work goes on its own blocking stream (kernels/cuda/context.h); _begin makes
 * that stream wait for the streams that last wrote what the call reads or overwrites, _end
 * records its event for what the call wrote ("Streams and ordering" there). The stream belongs to
 * one device; a layer moved to another device (or back to the CPU) gets its old stream
 * synchronised and destroyed, after on_stream_drop (if set) has released whatever is bound to it
 * (the cuDNN object of layers/rnn_cudnn.c).
 *
 * Packed operands (float32 on a CPU level with a vector kernel of kernels/cpu/gemm_small.h): the
 * per-step products read U (forward) or U^T (backward) packed for that kernel, and in per-step
 * use the input weights W_k (forward) and W_k^T (backward) too. A layer run on its own packs at
 * every forward and backward (the parameters may have changed in between), into one buffer. In
 * a rec unit one layer object runs each step, all bound to the same parameters: they share one
 * rl_packs (rl_recurrent_share_packs), and the rec layer names a pass (rl_recurrent_set_pack_pass:
 * a new number whenever the parameters may have changed, i.e. at each of its forwards and
 * backwards), so that each operand is packed once per pass instead of once per step. With a pass
 * set the input projection (T B = B rows: one step) and the input gradients use the packed kernel
 * too: OpenBLAS repacks W on each of those few-row calls. Every cell's layer is an
 * rl_recurrent_layer (its rl_layer, then its rl_recurrent), which is how
 * rl_recurrent_share_packs and its siblings (layers.h) find the packs. */
#ifndef RL_LAYERS_RECURRENT_H
#define RL_LAYERS_RECURRENT_H

#include "layer.h"
#include "matrix.h"

/* ---------------------------------------------------------------- cells
 *
 * The driver (rl_recurrent_create and the ops it installs) owns everything but a cell's
 * pointwise formulas: the options every cell takes, the parameters W and U, the buffers, the
 * time loop in both directions with ragged lengths, the row split over threads, the input
 * projection and the recurrent product (packed on the CPU), the weight and input gradients over
 * all steps, zoneout, rec_dropout and weight_dropout, the CPU/CUDA choice and the cuDNN path.
 * A cell (layers/lstm.c, layers/gru.c, layers/janet.c) is an rl_cell table: how many gate blocks
 * of H columns it has, how W's columns reach them, its states, its extra parameters and its
 * fused pointwise passes.
 *
 * Per step (frame t in processing order) on the CPU the driver computes
 *   gates[:, 0 : rec_gates H] += h_prev U        (U (P, rec_gates H), h_prev = state 0)
 * on top of the input projection written before the steps (in_blocks: W's columns src H ..
 * (src + n) H - 1 go to the gates' columns dst H ..; gate columns below rec_gates H that no
 * block writes start at 0), then calls the cell's fwd; backward calls its bwd, which turns the
 * activations into the pre-activation gradients dZ and the state gradients into their direct
 * parts, and adds dZ[:, 0 : rec_gates H] U^T to the gradient of state 0. Then, over all frames,
 * dW_k[:, block src] += X_k^T dZ[:, block dst], dU += H_prev^T dZ[:, 0 : rec_gates H], the
 * input gradients, and the cell's sums (its bias gradients). P is H, or with n_proj (a cell
 * with .proj) the projected state's width: see rl_recurrent.H below; a cell that normalises the
 * recurrent part apart sets rl_recurrent.rec_apart. */
#define RL_CELL_MAX_AUX 2   /* per-frame (T, B, H) buffers a cell keeps with zoneout */
#define RL_CELL_MAX_FRAME 8 /* per-frame buffers a cell asks for (rl_recurrent.frame_cols) */
#define RL_CELL_MAX_OPTS 4

/* One frame's rows r0 .. r0+n-1 as the driver hands them to a cell's fwd and bwd (CPU memory,
 * float32 or float64 as dt, rows of H elements unless said otherwise). */
typedef struct rl_cell_step {
    const rl_layer *l;
    const double *opt; /* the cell's options (rl_recurrent.cell_opt) */
    rl_dtype dt;
    int64_t n, H, t;                       /* rows, units, the frame */
    const int32_t *len;                    /* the rows' lengths: row b is valid when t < len[b] */
    void *g;                               /* (n, gate_blocks H): the frame's gates rows */
    const void *prev[RL_LAYER_MAX_STATES]; /* each state before the frame */
    void *cur[RL_LAYER_MAX_STATES];        /* each state after it (forward writes them) */
    void *out;                             /* forward: h on valid rows, 0 on padded ones */
    const void *dout;                      /* backward: dLoss/dout rows (NULL: zero) */
    int64_t dout_ld;
    void *dstate[RL_LAYER_MAX_STATES];   /* backward: the running state gradients */
    const void *zo[RL_LAYER_MAX_STATES]; /* zoneout weights of each state, NULL: none */
    void *aux[RL_CELL_MAX_AUX];          /* with zoneout: the cell's per-frame buffers */
    bool zoned;                          /* zoneout on in this pass */
    void *fb[RL_CELL_MAX_FRAME];         /* the frame's rows of the cell's frame buffers */
    const void *const *p;                /* the params' values (W, U, then the cell's) */
    void *const *dp; /* backward: the params' gradients where the cell sums its bias gradients
                        in the steps; NULL: its sums hook does (rl_cell.sums) */
} rl_cell_step;

/* The backward pass over all frames at once after the steps (rows = T B, in time order). */
typedef struct rl_cell_sums {
    const rl_layer *l;
    const double *opt;
    rl_dtype dt;
    int64_t rows, H;
    const void *g; /* (rows, gate_blocks H) the gate gradients dZ, 0 on padded rows */
    const void *prev[RL_LAYER_MAX_STATES], *cur[RL_LAYER_MAX_STATES];
    const void *aux[RL_CELL_MAX_AUX];
    void *fb[RL_CELL_MAX_FRAME]; /* the cell's frame buffers (rows = T B) */
    bool zoned;
    bool in_steps; /* the steps were given dp (rl_cell_step) */
    const void *const *p;
    void *const *dp;
} rl_cell_sums;

/* One direction's whole recurrence on a CUDA device (the cell's launchers). */
typedef struct rl_cell_pass {
    const rl_layer *l;
    const double *opt;
    void *stream;
    rl_device dev;
    rl_dtype dt;
    int64_t T, B, H;
    int direction;
    const int32_t *len; /* device lengths */
    void *gates;        /* (T, B, gate_blocks H), the input projection on entry */
    const void *U;
    const void *const *p;
    void *seq[RL_LAYER_MAX_STATES]; /* (T+1, B, H) each (rl_recurrent.seq) */
    void *out;
    const void *dout; /* backward; NULL: zero */
    int64_t dout_ld;
    void *dstate[RL_LAYER_MAX_STATES];
    void *const *dp;
    void *dU;
    rl_tensor *red; /* the layer's scratch for the launcher's partial sums, sized by it */
    /* n_proj (a cell with .proj; R NULL: none): P, seq[0], out, dout, dstate[0] and U's rows are
     * P wide, and the cell's own state 0 is m: R (H, P), ms (T+1, B, H), forward's mscr (B, H),
     * backward's drs (T, B, P), dm (B, H) and dR, R's gradient (rl_recurrent's fields) */
    int64_t P;
    const void *R;
    void *ms, *mscr, *drs, *dm, *dR;
    void *fb[RL_CELL_MAX_FRAME]; /* the cell's frame buffers over all frames (rl_recurrent.frame) */
    /* The driver's options that the launchers apply inside their loops (NULL: off): rec_dropout's
     * md (B, P), hd (T, B, P), dtmp (B, P) and zoneout's weights zo[i] (T, B, H) of each state
     * with z > 0 and the cell's per-frame buffers aux[a] (rl_recurrent's fields; a cell hands
     * them on with rl_recurrent_cuda_opts). weight_dropout is the driver's alone: U is then U
     * times the mask, and dU goes through the mask after the pass. */
    const void *md;
    void *hd, *dtmp;
    const void *zo[RL_LAYER_MAX_STATES];
    void *aux[RL_CELL_MAX_AUX];
} rl_cell_pass;

typedef struct {
    int src, dst, n; /* in units of H columns */
} rl_cell_block;

typedef struct rl_cell {
    /* class_name and init_params (may be NULL); forward, backward, destroy and state are filled
     * by the driver (RL_CELL_OPS) */
    rl_layer_ops ops;
    int rec_gates, gate_blocks; /* U (H, rec_gates H); gates (T, B, gate_blocks H) */
    int n_in_blocks;
    rl_cell_block in_blocks[2]; /* W (F, sum of n H) */
    int n_states;
    const char *state_names[RL_LAYER_MAX_STATES]; /* state 0 "h"; a state "c" takes zoneout.cell */
    int n_aux; /* per-frame buffers (T, B, H) its passes use with zoneout */
    int cudnn; /* RL_CUDNN_LSTM, RL_CUDNN_GRU (kernels/cudnn_layout.h), or -1: no cuDNN cell */
    bool cudnn_fallback;    /* impl = "cudnn" runs the own passes where cuDNN cannot (CPU tensors,
                               sizes beyond its descriptors) instead of failing */
    bool rec_dropout_first; /* draw the rec_dropout mask before the zoneout masks (the gru's
                               order, which its checkpoints' continued training depends on) */
    bool proj;              /* takes n_proj = P: a projected state 0 (rl_recurrent.p_proj) */
    /* Reads the cell's own options into r->cell_opt and adds its parameters after W and U. */
    rl_status (*create)(rl_layer *l, const rl_options *o, bool cudnn);
    void (*fwd)(const rl_cell_step *s);
    void (*bwd)(const rl_cell_step *s);
    void (*sums)(const rl_cell_sums *s);
    /* CUDA launchers, NULL where the cell has none (or in a build without CUDA) */
    rl_status (*cuda_fwd)(const rl_cell_pass *p);
    rl_status (*cuda_bwd)(const rl_cell_pass *p);
} rl_cell;

/* For a cell's launchers (CUDA builds only): the pass's rec_dropout and zoneout buffers as
 * kernels/cuda/context.h's rl_cuda_rec_opts (zh, zc: the weights of states 0 and 1, ct: the
 * cell's aux buffer 0). */
struct rl_cuda_rec_opts;
void rl_recurrent_cuda_opts(const rl_cell_pass *p, struct rl_cuda_rec_opts *o);

/* A cell's launcher in a CUDA build, NULL in a build without: a cell defines its launchers in
 * an #ifdef RL_WITH_CUDA block and names them with it. */
#ifdef RL_WITH_CUDA
#define RL_CUDA_FN(f) f
#else
#define RL_CUDA_FN(f) NULL
#endif

/* The ops every cell's layers run: give a cell's table `.ops = {RL_CELL_OPS, .class_name = ...}`.
 */
rl_status rl_recurrent_forward(rl_layer *l, rl_layer_io *io);
rl_status rl_recurrent_backward(rl_layer *l, rl_layer_io *io, const rl_tensor *grad_out,
                                rl_tensor *const *grad_in);
void rl_recurrent_destroy(rl_layer *l);
#define RL_CELL_OPS                                                                                \
    .forward = rl_recurrent_forward, .backward = rl_recurrent_backward,                            \
    .destroy = rl_recurrent_destroy, .state = &rl_recurrent_state_ops

/* Creates a layer of the cell's class: reads n_out, direction, impl (a cell with cuDNN),
 * zoneout, rec_dropout and weight_dropout, adds W (glorot) and U (orthogonal), then runs
 * cell->create. Errors name the layer, its class and the option. */
rl_status rl_recurrent_create(rl_layer **out, const rl_cell *cell, const char *name,
                              const rl_options *opts, int n_in, const int64_t *in_dims);
/* For a cell's create, at the place of R among its parameters: adds the projection R (H, P)
 * (glorot) when the layer has n_proj = P, and records its index. */
rl_status rl_recurrent_add_proj(rl_layer *l);
/* The rl_cell of a layer built with rl_recurrent_create, or NULL. */
const rl_cell *rl_recurrent_cell(const rl_layer *l);

typedef struct rl_recurrent {
    const char *cls;   /* the class name, for messages ("lstm", "gru") */
    void *stream;      /* CUDA: the layer's stream (a cudaStream_t), or NULL */
    int stream_dev;    /* its device ordinal */
    rl_tensor len_dev; /* CUDA: the batch's lengths on the device (B) */
    rl_tensor gout;    /* a contiguous copy of grad_out when its (T, B) dims cannot be folded */
    int64_t T, B;      /* of the last forward */
    int64_t last_row;  /* the row of the layer's state buffers that holds the final state */
    bool have_forward; /* backward may run: the buffers hold this forward's activations */
    bool trained;      /* the last forward kept what backward needs */
    bool have_state;   /* the final state of the last forward is readable (also after backward,
                          which leaves the states alone) */
    /* called before the stream is synchronised and destroyed for a move to another device */
    void (*on_stream_drop)(struct rl_recurrent *r);
    struct rl_packs *packs; /* packed operands, possibly shared with other step objects; made on
                               first use */
    bool adopted;           /* packs are another network's frozen ones (rl_recurrent_adopt_packs) */
    bool adopted_w; /* and the input products read their packed W (rl_recurrent_adopted_inputs) */
    uint32_t zero_inputs; /* inputs the caller gives as all zeros (rl_recurrent_set_zero_inputs) */
    uint32_t zero_fwd;    /* the part of it the last forward used (and its backward uses) */
    rl_tensor ext_gates;  /* the caller's gates buffer (rl_recurrent_set_gates), or unset */
    bool gates_shared;    /* the layer's gates tensor is a share of ext_gates, not its own */
    bool defer_fwd;       /* the last forward wrote into ext_gates: its backward leaves the weight
                             gradients to the caller (rl_recurrent_weight_grads) */
    /* The class's weight-gradient product over n rows: k < n_in: W_k's gradient += x^T dz, k =
     * -1: U's += x^T dz (x the previous states); dz the gate gradients as backward leaves them in
     * the gates buffer. The layer's own backward makes its products with it too. */
    rl_status (*weight_grad)(rl_layer *l, rl_device dev, rl_dtype dt, int k, int64_t n, rl_mat x,
                             rl_mat dz);
    /* The recurrent state (rl_recurrent_state_ops), filled by the cell at creation: n_states
     * tensors named state_names[i] ("h", "c"; state 0 is the output), each (B, state_dims[i]);
     * seq[i] the layer's buffer of that state over the steps (T+1 rows as seqs, the final
     * state at row last_row), grad0[i] its backward's running gradient of that state (B, dim),
     * which ends as the initial state's. gates_cols: the width of the gates buffer (for
     * rl_recurrent_set_gates). */
    int n_states;
    const char *state_names[RL_LAYER_MAX_STATES];
    int64_t state_dims[RL_LAYER_MAX_STATES];
    rl_tensor *seq[RL_LAYER_MAX_STATES], *grad0[RL_LAYER_MAX_STATES];
    int64_t gates_cols;
    /* What the caller gave (shared views, or unset): the initial states and the final states'
     * gradients, read at each forward and backward. */
    rl_tensor init[RL_LAYER_MAX_STATES], final_grad[RL_LAYER_MAX_STATES];

    /* The driver's (rl_recurrent_create): the cell, its options and the layer's buffers (the
     * top of this file describes them). */
    const rl_cell *cell;
    double cell_opt[RL_CELL_MAX_OPTS];
    int direction;
    bool cudnn, ran_cudnn; /* impl = "cudnn"; the last forward ran it (so does its backward) */
    struct rl_rnn_cudnn *dnn;
    double zo[RL_LAYER_MAX_STATES]; /* zoneout probability of each state (0: none) */
    double rd, wd;                  /* rec_dropout, weight_dropout (0: none) */
    bool zoned, rdropped, wdropped; /* what the last forward applied (its backward too) */
    rl_tensor gates, seqs[RL_LAYER_MAX_STATES], dstates[RL_LAYER_MAX_STATES], red;
    rl_tensor xs[RL_LAYER_MAX_INPUTS], dxs[RL_LAYER_MAX_INPUTS];
    bool use_xs[RL_LAYER_MAX_INPUTS]; /* the last forward read input k from xs[k] */
    rl_tensor zmask[RL_LAYER_MAX_STATES], aux[RL_CELL_MAX_AUX];
    rl_tensor md, hd, dtmp; /* rec_dropout: the mask (B, P), the dropped previous states of every
                               frame (T, B, P), backward's recurrent product (B, P) */
    rl_tensor wdm, ud, dud; /* weight_dropout: the mask scaled by 1/(1-p) and U times it
                               (P, rec_gates H), backward's dU before the mask */
    /* H: the cell's units (option n_out); state 0, the output and the recurrent product's
     * operand are P = base.n_out wide: H, or n_proj's P, where state 0 is h_t = m_t R with m_t
     * (the cell's own state 0, H wide) kept in ms (T+1, B, H) in the state buffers' row order
     * (its initial row zeros), R the parameter p_proj (0: none). Forward: the cell's pass writes m
     * (its output rows go to mscr (B, H), unused), then h = m R, a padded row carrying h_prev and
     * outputting 0. Backward: drs (T, B, P) the frames' dLoss/dh (0 on padded rows), dm (B, H)
     * the step's dLoss/dm = drs_t R^T, which the cell's pass reads as its state 0's gradient;
     * dR = M^T drs over all frames; rpack: R or R^T packed (float32 CPU). */
    int64_t H;
    int p_proj;
    rl_tensor ms, mscr, drs, dm, rpack;
    /* The cell's per-frame buffers, n_frame of them, (T, B, frame_cols[k]) each, sized at every
     * forward and handed to its passes (rl_cell_step.fb, rl_cell_sums.fb). With rec_apart the
     * recurrent product goes to frame buffer 0 (T, B, rec_gates H) instead of adding to the gates
     * (a cell that normalises it apart), and backward's per-step product and dU read the
     * recurrent part's gradients from frame buffer 1 (T, B, rec_gates H), which the cell's bwd
     * writes; dU is then the layer's own also when a caller makes the other weight gradients
     * (rl_recurrent_set_gates). */
    int n_frame;
    int64_t frame_cols[RL_CELL_MAX_FRAME];
    bool rec_apart;
    rl_tensor frame[RL_CELL_MAX_FRAME];
} rl_recurrent;

/* For a cell's create when an option of it normalises the recurrent part apart: sets rec_apart
 * and the n <= RL_CELL_MAX_FRAME frame buffers of cols[k] columns, the first two (T, B,
 * rec_gates H) each (rl_recurrent.frame). On CUDA the launchers get the frame buffers
 * (rl_cell_pass.fb) and make dU themselves. */
void rl_recurrent_rec_apart(rl_recurrent *r, int n, const int64_t *cols);

/* The state ops of every layer built on rl_recurrent (layer.h's rl_state_ops over the fields
 * above); they are also how the functions below recognise such a layer. */
extern const rl_state_ops rl_recurrent_state_ops;

/* Whether input k of the last forward was given as all zeros: its input projection (forward) and
 * its weight gradient X_k^T dZ (backward) are skipped; its input gradient is computed as usual. */
static inline bool rl_recurrent_zero_input(const rl_recurrent *r, int k) {
    return r->zero_fwd >> k & 1u;
}

/* Every cell's layer (rl_recurrent_create allocates it). */
typedef struct {
    rl_layer base;
    rl_recurrent rec;
} rl_recurrent_layer;

/* The packed operands, and where the input weights' blocks of columns go. */
enum { RL_PACK_U, RL_PACK_UT, RL_PACK_W, RL_PACK_WT, RL_PACK_KINDS };
typedef struct {
    int64_t col, n; /* columns col .. col+n-1 of W (the gate blocks one product writes) */
} rl_pack_block;

/* Checks the inputs (rl_layer_check_inputs: shapes, dtypes, devices, lengths), moves the layer
 * to the inputs' device, checks each given initial state (r->init) is (B, its dim) on that
 * device, waits (CUDA) for
 * the writers of the inputs and states, sizes l->out (T, B, n_out), copies the lengths to the
 * device and records T, B. *dt, *dev: the inputs' dtype and device. */
rl_status rl_recurrent_forward_begin(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                     rl_dtype *dt, rl_device *dev);
/* After the forward's work: last_row is the final state's row; records (CUDA) the stream's event
 * as the writer of l->out and of the n buffers (the state buffers another layer may read). */
rl_status rl_recurrent_forward_end(rl_recurrent *r, rl_layer *l, int64_t last_row, bool trained,
                                   const rl_tensor *const *written, int n);

/* Checks a backward may run and that it sees the forward's batch, waits (CUDA) for the writers of
 * grad_out, of the given states and of grad_in (overwritten), checks grad_out (T, B, n_out) and
 * each grad_in (the input's shape) and the given states ((B, n_out) on the device). *dout:
 * grad_out as a (T*B, n_out) matrix ({NULL, 0} when grad_out is NULL: zero), possibly the copy
 * r->gout, and the given final-state gradients (r->final_grad). Clears have_forward (the layer
 * overwrites its activations). */
rl_status rl_recurrent_backward_begin(rl_recurrent *r, rl_layer *l, const rl_layer_io *io,
                                      const rl_tensor *grad_out, rl_tensor *const *grad_in,
                                      rl_dtype *dt, rl_device *dev, rl_mat *dout);
/* Sizes each grad0[i] (B, dim) and writes the given final-state gradient into it, or zeros:
 * where the backward's running state gradients start. */
rl_status rl_recurrent_start_state_grads(rl_recurrent *r, rl_dtype dt, rl_device dev);
/* After the backward's work: records (CUDA) the stream's event as the writer of grad_in and of
 * the n buffers (the initial state's gradients). */
rl_status rl_recurrent_backward_end(rl_recurrent *r, const rl_layer_io *io,
                                    rl_tensor *const *grad_in, const rl_tensor *const *written,
                                    int n);

/* dst (B, H) <- src, or zeros when src is NULL (or unset); on CUDA queued on the layer's stream
 * when the layouts allow a plain copy, else through the tensor ops. */
rl_status rl_recurrent_write_state(const rl_recurrent *r, rl_tensor *dst, const rl_tensor *src);

/* The final state's row `r->last_row` of a state buffer (T+1, B, H) as a view (B, H); an error
 * naming fn and the layer before any forward. */
rl_status rl_recurrent_final_state(const rl_recurrent *r, const rl_layer *l, const char *fn,
                                   const rl_tensor *states, rl_tensor *out);

/* The buffer of packed operand `kind` (n floats) in *dst; *stale: the caller must (re)pack it now
 * (it was not packed in the current pass, or no pass is set). Without a pass every kind shares
 * one buffer, as a layer on its own needs one operand at a time. Errors: out of memory. */
rl_status rl_recurrent_pack_slot(rl_recurrent *r, const rl_layer *l, int kind, int64_t n,
                                 float **dst, bool *stale);

/* Whether this forward or backward packs the input weights too: a pass set, float32 on the CPU at
 * a level with a vector kernel (rl_gemm_packed_fast). */
bool rl_recurrent_packed_inputs(const rl_recurrent *r, rl_dtype dt, rl_device dev);

/* Packs (when stale) the input weights W (sum_k F_k rows, ld columns, float32) for the packed
 * kernel in *out: for each input k in turn, each of the n_blocks column blocks of its rows, as
 * W_k[:, block] (F_k x block.n) in forward, as its transpose (block.n x F_k) in backward, each
 * rl_gemm_packed_size floats after the previous. */
rl_status rl_recurrent_pack_inputs(rl_recurrent *r, const rl_layer *l, bool backward,
                                   const float *W, int64_t ld, const rl_pack_block *blocks,
                                   int n_blocks, float **out);

/* The gates buffer (T, B, gate_blocks n_out) of a forward in *gates: the caller's (a share of
 * r->ext_gates, after checking its shape, dtype and device: CPU only) when one is set, else the
 * layer's own, sized with rl_buffer_ensure_synced. Sets r->defer_fwd accordingly. */
rl_status rl_recurrent_gates(rl_recurrent *r, const rl_layer *l, rl_tensor *gates, rl_dtype dt,
                             rl_device dev, const int64_t *shape);

/* Options of the recurrent family, read at creation (errors name the layer, its class and the
 * option). A probability in [0, 1), default 0 (off): */
rl_status rl_recurrent_prob_option(const rl_options *o, const char *name, const char *cls,
                                   const char *key, double *p);
/* zoneout = {cell = zc, hidden = zh} (or zoneout = z for both): *zc, *zh; a class without a cell
 * state (has_cell false) reads only hidden (*zc = 0), and impl = "cudnn" (cudnn true) none. */
rl_status rl_recurrent_zoneout_option(const rl_options *o, const char *name, const char *cls,
                                      bool has_cell, bool cudnn, double *zc, double *zh);
/* The zoneout weights of a forward: mask (T, B, H) sized and filled with Bernoulli(z) 0/1 draws
 * from io->rng when io->train (one per unit, step and sequence, padded frames too, so the draws
 * depend only on the batch shape), else with z (the expectation at evaluation). */
rl_status rl_recurrent_zoneout_mask(const rl_recurrent *r, const rl_layer *l, const rl_layer_io *io,
                                    double z, rl_tensor *mask, rl_dtype dt, rl_device dev);
/* rec_dropout = p: variational dropout of the recurrent input (Gal & Ghahramani 2016), *p in
 * [0, 1); not with impl = "cudnn". */
rl_status rl_recurrent_rec_dropout_option(const rl_options *o, const char *name, const char *cls,
                                          bool cudnn, double *p);
/* The rec_dropout mask of a training forward: mask (B, H) sized and filled with 0 or 1/(1 - p)
 * (inverted dropout: evaluation needs no mask), drawn from io->rng; one per sequence and unit,
 * used at every step. Errors: no generator; the layer's gates given by the caller
 * (rl_recurrent_set_gates: a rec unit's step objects, which would draw a mask per step). */
rl_status rl_recurrent_rec_dropout_mask(const rl_recurrent *r, const rl_layer *l,
                                        const rl_layer_io *io, double p, rl_tensor *mask,
                                        rl_dtype dt, rl_device dev);
/* dst = src * mask, or dst += src * mask with accumulate: n rows of H (rows H apart), float32 or
 * float64 CPU memory (the rec_dropout products' operand and their state gradients). */
void rl_recurrent_mask_rows(rl_dtype dt, int64_t n, int64_t H, const void *src, const void *mask,
                            void *dst, bool accumulate);

/* Waits for and destroys the stream (after on_stream_drop), releases len_dev, gout and the packs
 * (freed with their last sharer). The layer calls it before releasing its own buffers, which the
 * stream may still be using. */
void rl_recurrent_free(rl_recurrent *r);

#endif
