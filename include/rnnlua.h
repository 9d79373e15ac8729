/* rnnlua's C inference API: load a checkpoint, run padded batches through it, stream frames
 * through a causal model chunk by chunk, decode a CTC layer's outputs and search with an
 * attention decoder, with or without a language model. docs/embedding.md explains it;
 * examples/embed.c uses it.
 *
 * Linking: `pkg-config --cflags --libs rnnlua` (the shared library librnnlua.so.1; its exported
 * symbols are exactly the functions below).
 *
 * Errors: every function that can fail returns an rl_status; on failure rl_errmsg() gives the
 * message, "<call>: <argument or file>: <what>", kept per thread until the next failing call
 * on that thread. Nothing here prints, exits or aborts; the environment variable
 * RNNLUA_CAPI_DEBUG=1 makes rl_model_load write one line to stderr saying whether the model's
 * pushes run in C or through its Lua network (docs/embedding.md, "Streaming").
 *
 * Threads: a model may be shared by any number of threads. rl_model_forward calls on one model
 * run one at a time (they share the model's network); for calls in parallel each thread opens
 * its own session (rl_session_open), which holds its own copy of the network. A session is
 * used by one thread at a time.
 *
 * Ownership: rl_model_load and rl_session_open return handles the caller frees with
 * rl_model_free and rl_session_free. A session keeps its model's memory alive; once the model
 * was freed, the session's calls fail (RL_EARG, "the model was freed") until the session is
 * freed. Outputs (rl_output) point into memory the handle owns, valid until the next call on
 * that handle or its free.
 *
 * Data: a batch is time-major and padded, as everywhere in rnnlua: frame t of sequence b of a
 * dense input is x[(t * B + b) * input_dim + i]; lengths[b] <= T frames of it are valid. */
#ifndef RNNLUA_H
#define RNNLUA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The soname's major number: the ABI of this header. */
#define RL_API_VERSION 1

typedef enum {
    RL_OK = 0,
    RL_EARG,    /* a bad argument: NULL, unknown name, value out of range, a freed model */
    RL_ESHAPE,  /* shapes or dims that do not fit together */
    RL_EDTYPE,  /* a dtype the operation does not take */
    RL_EINDEX,  /* an index out of range */
    RL_ENOMEM,  /* an allocation failed (host or device) */
    RL_EIO,     /* a file could not be read, or is not what was expected */
    RL_EDEVICE, /* no such device, no CUDA build, or a failing device call */
} rl_status;

/* The message of the last failure on this thread ("" when none). */
const char *rl_errmsg(void);

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *rl_version(void);

typedef struct rl_model rl_model;
typedef struct rl_session rl_session;

typedef struct rl_model_options {
    const char *layer;    /* the layer whose output the model gives; NULL: "output" */
    const char *device;   /* "cpu" (NULL) or "cuda:N" (a CUDA build) */
    int threads;          /* CPU threads of the math (process-wide); 0: leave as it is */
    const char *lua_file; /* NULL, or a Lua file the model's states run before it loads: the
                           * rl.layers.register calls of its Lua layer classes (as `rnnlua
                           * serve --lua`); the checkpoint itself never runs code */
} rl_model_options;

/* Loads the checkpoint at `path` (an rnnlua checkpoint: parameters and network description)
 * and builds the network that computes options->layer (losses left out); options may be NULL.
 * The network is built by rnnlua's own network builder; a layer class that a recipe registered
 * in Lua (rl.layers.register) is unknown here and refused by name unless options->lua_file
 * registers it. */
rl_status rl_model_load(rl_model **out, const char *path, const rl_model_options *options);
/* Releases the caller's reference; sessions still open keep the memory, not the use. NULL is
 * ignored. */
void rl_model_free(rl_model *model);

/* The precision of the model's matrix products: "fp32" (the default) or "bf16" (operands rounded
 * to bfloat16, sums in float32: half the bytes of weights to read; AVX512-BF16 or AMX where
 * the CPU has them, a float32 emulation elsewhere; a CPU model of dtype float32 only). It holds
 * for rl_model_forward and for the sessions opened after the call; sessions already open keep
 * theirs. The bf16 copies of the weights are made once, here, and shared by those sessions. */
rl_status rl_model_set_precision(rl_model *model, const char *precision);

typedef struct rl_info {
    const char *input;      /* the name of the network's one input ("data") */
    int64_t input_dim;      /* values a frame (dense) or classes (sparse) */
    int input_sparse;       /* 1: a frame is one class index (int32), 0: input_dim floats */
    const char *output;     /* the model's layer */
    int64_t output_dim;     /* values a frame of its output */
    int causal;             /* 1: the model can stream (rl_session_push) */
    const char *not_causal; /* when causal is 0: why, naming the layer; else NULL */
    int64_t num_params;     /* parameters of the network */
} rl_info;

/* Fills *info; its strings are owned by the model. */
rl_status rl_model_info(const rl_model *model, rl_info *info);

typedef struct rl_batch {
    int64_t T, B;           /* padded frames, sequences */
    int64_t F;              /* values a frame: input_dim (dense) or 1 (sparse) */
    const float *x;         /* dense input: (T, B, input_dim); NULL for a sparse one */
    const int32_t *classes; /* sparse input: (T, B) class indices; NULL for a dense one */
    const int32_t *lengths; /* (B) valid frames of each sequence, 1..T (NULL for a push: T) */
} rl_batch;

typedef struct rl_output {
    const float *y;         /* (T, B, dim), time-major; zeros past a sequence's length */
    const int32_t *lengths; /* (B) valid output frames of each sequence */
    int64_t T, B, dim;
} rl_output;

/* One batch through the model: the output of `layer` (NULL: the model's layer; any layer the
 * model's network computes). Calls on one model are serialised. */
rl_status rl_model_forward(rl_model *model, const rl_batch *batch, const char *layer,
                           rl_output *out);

/* CTC models (a softmax layer trained with loss = "ctc"): *blank gets the blank's class of the
 * model's layer (-1: the layer is no CTC layer), *n and *labels the text of each target class
 * as the checkpoint stores it (its target's labels, e.g. the characters of a recipe's
 * alphabet; the blank is not among them: label i names class i of rl_ctc_decode), owned by the
 * model; *n = 0 and *labels = NULL when the checkpoint has none. */
rl_status rl_model_labels(const rl_model *model, int32_t *blank, int64_t *n,
                          const char *const **labels);

/* The labels of sequence b of out, a CTC layer's output (its softmax probabilities, from
 * rl_model_forward, rl_session_forward or rl_session_push), blank its blank class: beam = 1
 * takes the best path (the likeliest class of each frame, repeats merged, blanks removed),
 * beam > 1 a prefix beam search of that width (rl.ctc_decode's, without an LM). The labels are
 * numbered as the targets are (the blank taken out: class c > blank is label c - 1); at most
 * cap of them go to labels, their number to *n (a sequence with more than cap is RL_ESHAPE,
 * *n saying how many it has). A stream decoded chunk by chunk is not the whole stream's
 * decoding: decode the outputs of all its pushes at once. */
rl_status rl_ctc_decode(const rl_output *out, int64_t b, int32_t blank, int beam, int32_t *labels,
                        int64_t cap, int64_t *n);

/* A session: the model's network of its own, for one thread at a time; it carries the
 * recurrent state of a stream between rl_session_push calls. */
rl_status rl_session_open(rl_session **out, rl_model *model);
void rl_session_free(rl_session *session);
/* rl_model_forward on the session's own network (calls on different sessions run in
 * parallel). */
rl_status rl_session_forward(rl_session *session, const rl_batch *batch, const char *layer,
                             rl_output *out);
/* The next chunk->T frames of one stream (chunk->B = 1). The recurrent state is carried from
 * the previous push, so a sequence pushed in chunks gives the outputs of the whole sequence at
 * once: out gets (T, 1, output_dim). Models that are not causal (a backward or bidirectional
 * recurrence, a window over future frames) are refused, naming the layer. A refused chunk (bad
 * dims, NaN) leaves the stream as it was; a push that fails inside the network ends it (the
 * next push starts from the initial state). rl_session_forward also ends the stream. */
rl_status rl_session_push(rl_session *session, const rl_batch *chunk, rl_output *out);
/* Starts a new stream: the next push begins from the initial (zero) state. */
rl_status rl_session_reset(rl_session *session);

/* The next chunk of n streams at once, one batched forward: chunks[i] (chunks[i].B = 1, any
 * T) goes on the stream of sessions[i], from the state that stream carries, and outs[i] gets
 * what rl_session_push(sessions[i], &chunks[i], &outs[i]) would give (to float32 rounding: a
 * product of n rows may sum in another order than one of one row), in sessions[i]'s memory;
 * the stream's new state is kept by its session. Streams whose chunks wait at the same time
 * read the weights once instead of n times. The sessions are n different sessions of one
 * model, opened at the model's present precision; the batch runs in the calling thread on a
 * network the model keeps for batches (calls on one model run one at a time), and no other
 * thread may use any of the n sessions meanwhile. A refused call (a NULL, a duplicate, a
 * session of another model or precision, a bad chunk: the argument named) leaves every stream
 * as it was; a batch that fails inside the network ends all n streams (their next push starts
 * anew). */
rl_status rl_session_push_many(rl_session *const *sessions, const rl_batch *chunks, int n,
                               rl_output *outs);
/* ---- Language models in decoding -------------------------------------------------------------
 * Shallow fusion of a language model into CTC's prefix beam search, as rl.ctc_decode{lm = ...}
 * and rl.forward{decode = "ctc", lm = ...} do it (docs/ctc.md): a prefix ranks by
 *   log p_ctc + weight * log p_lm + bonus * (LM tokens),
 * the end of the sentence scored before the best is chosen. The LM is an ARPA n-gram file
 * (character-level, or word-level with a word boundary label) or an rnnlua character LM
 * checkpoint (recipes/char_lm.lua's).
 *
 * Ownership: rl_lm_load returns a handle the caller frees with rl_lm_free, after the last call
 * that uses it has returned (an LM holds no model: it keeps the model's blank, classes and labels
 * from the load). Calls that use one LM run one at a time (they share its state); for decoding
 * in parallel, load the LM once per thread. The structs below begin with their size, which the
 * caller sets to sizeof the struct: a later version of the library appends fields (taking the
 * ones a caller's older struct lacks as 0) without a new RL_API_VERSION. */
typedef struct rl_lm rl_lm;

typedef struct rl_lm_options {
    size_t size;               /* sizeof(rl_lm_options) */
    const char *const *labels; /* NULL: the model's labels (rl_model_labels; the class numbers
                                * "0", "1", ... when it has none); else n_labels strings, the
                                * LM token of each label (a CTC layer's: the blank left out; an
                                * attention decoder's: all, the end label 0 too) */
    int64_t n_labels;
    const char *word_boundary; /* NULL: every label is one LM token (a character LM); else the
                                * label (its text) that ends words: a word n-gram scoring the
                                * labels between two boundaries as one word (lexicon-free) */
    const char *layer;         /* a neural LM's softmax layer; NULL: "output" */
} rl_lm_options;

/* Loads the LM at path for the outputs of model's CTC layer (rl_model_labels: blank >= 0) or
 * for its attention decoder (rl_model_search, below): an ARPA file, or an rnnlua checkpoint (an
 * HDF5 file) of a character LM. Each label must be in the LM's vocabulary (a character LM; a
 * word LM scores unknown words as <unk>): a label outside it is refused, named. options may be
 * NULL. */
rl_status rl_lm_load(rl_lm **out, const rl_model *model, const char *path,
                     const rl_lm_options *options);
/* NULL is ignored. */
void rl_lm_free(rl_lm *lm);

typedef struct rl_decode_options {
    size_t size;     /* sizeof(rl_decode_options) */
    int32_t blank;   /* the blank class (rl_model_labels); with an LM, the LM's model's */
    int beam;        /* 1..4096; with an LM the prefix beam search runs at every beam (1 too) */
    const rl_lm *lm; /* NULL: rl_ctc_decode's decoding */
    double weight;   /* the LM's weight (finite) */
    double bonus;    /* added per LM token (finite) */
} rl_decode_options;

/* rl_ctc_decode with the options above: sequence b of out, a CTC layer's output, decoded into
 * labels (numbered as the targets are, cap of them at most, their number in *n) exactly as
 * rl.forward{decode = "ctc", beam =, lm = {file =, weight =, bonus =}} decodes it. With an LM,
 * out must be an output of the LM's model's layer (its classes and blank). */
rl_status rl_ctc_decode_lm(const rl_output *out, int64_t b, const rl_decode_options *options,
                           int32_t *labels, int64_t cap, int64_t *n);

/* ---- Attention decoding ----------------------------------------------------------------------
 * A model whose layer (rl_model_options.layer) is an attention decoder, a rec layer with a
 * choice layer in its unit (docs/rec.md), gives label sequences by a beam search, exactly as
 * rl.search does it (the end label 0, the rec layer's max_seq_len). Its rl_model_forward and its
 * sessions' forwards and pushes are refused (its network runs with the labels it chooses); the
 * network's input is its one input other than the choice's target. An LM for it is loaded with
 * rl_lm_load on that model: labels then names each of the choice's labels, the end label 0 among
 * them (default: the target's labels the checkpoint stores, else the class numbers). */
typedef struct rl_search_options {
    size_t size;     /* sizeof(rl_search_options) */
    int beam;        /* 0: the choice layer's beam_size; else 1..4096 */
    const rl_lm *lm; /* NULL: none; else an LM loaded for this model */
    double weight;   /* the LM's weight (finite) */
    double bonus;    /* added per label the LM scores (finite) */
} rl_search_options;

typedef struct rl_hyps {
    size_t size;            /* sizeof(rl_hyps), set by the caller */
    int64_t B;              /* sequences */
    const int32_t *labels;  /* the best label sequence of each, one after another (end label left
                             * out): sequence b's are labels[offsets[b] .. offsets[b + 1]) */
    const int64_t *offsets; /* (B + 1) */
    const double *scores;   /* (B) each best hypothesis' score (log p, plus the LM's terms) */
} rl_hyps;

/* The beam search of the model's attention decoder over a padded batch (as rl_model_forward's);
 * out's arrays are owned by the model, valid until its next rl_model_search or its free. Calls on
 * one model are serialised with its other calls; with an LM they hold its lock too. */
rl_status rl_model_search(rl_model *model, const rl_batch *batch, const rl_search_options *options,
                          rl_hyps *out);

#ifdef __cplusplus
}
#endif

#endif
