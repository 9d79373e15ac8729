/* `rnnlua serve MODEL.h5`: a checkpoint as an HTTP service (libmicrohttpd, JSON via jansson).
 *
 * Threads. The Lua state is single-threaded, so exactly one thread, the model thread (the
 * caller of rl_serve_main), ever touches it. libmicrohttpd's pool of --threads HTTP threads
 * receives requests, parses and validates the JSON (no Lua), turns each forward or decode
 * request into a job holding its frames as floats, suspends the connection and appends the
 * job to one queue. The model thread takes jobs from the head of the queue as one batch (up to
 * --max-batch-frames padded frames, waiting at most --max-wait-ms after the oldest job arrived
 * for more to come), builds the padded batch tensors, runs them through rnnlua.serve (the
 * same network and forward code as rl.forward), copies each job's rows out of the output,
 * marks the job done and resumes its connection; the HTTP thread then writes the JSON answer.
 * A signal thread turns SIGTERM/SIGINT into a drain (new requests get 503, every queued and
 * in-flight request is answered, then the listening socket is closed and the process exits 0;
 * the socket stays open while draining because closing it would reset the connections the
 * kernel has already accepted into its backlog, requests the server never saw) and SIGHUP into a
 * reload; POST /v1/reload queues a reload job.
 *
 * Ownership: a request (struct request) belongs to its HTTP connection and is freed by
 * libmicrohttpd's completion callback; its job is only read or written by the model thread
 * between being queued and being marked done (under the queue mutex), after which the model
 * thread never touches it again.
 *
 * Limits: body size (413), frames per request (413), queued frames (503), open connections
 * (503), time waited in the queue (503), idle connections and requests whose headers or body
 * take longer than --timeout seconds to arrive (closed). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <microhttpd.h>

#include "../core/blas.h"
#include "../include/rnnlua.h"
#include "json_real.h"
#include "l_tensor.h"
#include "serve.h"

#define JSON_TYPE "application/json"
/* A client reads an answer at least this fast (bytes/s), after --timeout seconds of grace. */
#define MIN_READ_RATE (1024.0 * 1024.0)
/* the gate's limits (gate_main) */
#define GATE_LINE_MAX 8192  /* the request line: method, path, version */
#define GATE_HEAD_MAX 32768 /* the request line and the headers */
#define GATE_MAX 1024       /* connections waiting for their first head */

typedef struct {
    const char *model_path, *listen, *layer, *lua_file, *lm_file, *lm_word_boundary, *admin_token,
        *precision;
    int port, threads, blas_threads, max_connections, timeout_s, max_beam, max_streams,
        stream_batch;
    int64_t max_batch_frames, max_frames, max_queue_frames;
    double max_wait_ms, drain_s, stream_timeout_s;
    size_t max_body;
} serve_opts;

/* POST /v1/stream/{id}: a stream's session of the C API (include/rnnlua.h), which carries the
 * recurrent state between its chunks. A slot whose stream was closed for idleness keeps the id
 * (expired) until a new stream needs the slot, so the stream's next chunk is told why. */
#define STREAM_ID_MAX 64
typedef struct stream_slot {
    char id[STREAM_ID_MAX + 1];
    rl_session *session; /* NULL: a free or expired slot, or its first chunk runs */
    double last;         /* the last chunk ended then */
    int64_t frames;      /* pushed so far */
    bool busy;           /* a chunk is going through */
    bool expired;        /* closed for idleness; id kept */
} stream_slot;

enum job_kind { JOB_FORWARD, JOB_DECODE, JOB_RELOAD, JOB_STREAM };

/* One request's work for the model thread, and its answer. Sequence s has T[s] valid frames
 * (H[s] x W[s] for images) starting at frame off[s] of x (F floats a frame; one class index
 * a frame in xi for a sparse input). */
typedef struct job {
    struct job *next;
    enum job_kind kind;
    struct MHD_Connection *conn;
    double t_queued;
    bool single; /* {"data": ...} (answered as one object), not {"batch": [...]} */
    bool end;    /* POST /v1/stream: {"end": true} closes the stream after this chunk */
    int beam;
    bool lm;                    /* decode: fuse the server's --lm */
    double lm_weight, lm_bonus; /* its weight and bonus */
    int64_t nseq, frames;
    int64_t maxT, maxH, maxW; /* the longest sequence; the largest height and width */
    int64_t *T, *H, *W, *off;
    float *x;
    int32_t *xi;
    /* the answer, written by the model thread */
    bool done;
    int status;
    char *error;  /* malloc'd message of a failed job */
    float **outs; /* forward: the oT[s] rows of sequence s (oH[s] x oW[s] for images) */
    int64_t *oT, *oH, *oW;
    json_t *extra; /* reload: the answer; decode: {"labels": [...]} of each sequence */
    char *text;    /* stream: the answer's JSON text (text_len bytes, its newline included) */
    size_t text_len;
} job;

typedef struct request {
    double t0;
    int route;
    char *body;
    size_t len, cap;
    bool too_large;
    bool incoming; /* counted in server.incoming: its body is on its way, not yet queued */
    job *job;
} request;

/* An open connection, watched for a request that arrives too slowly: libmicrohttpd's timeout
 * only closes connections that send nothing for --timeout seconds, so a client sending one
 * header byte a second held a connection (of --max-connections) for ever. */
typedef struct conn {
    struct conn *prev, *next;
    struct server *S;
    int fd;
    double since;          /* the connection opened, or its last answer was sent */
    bool in_request;       /* its request's headers have arrived (the body has its own deadline) */
    double answer_since;   /* > 0: its answer is queued since then and not all sent yet */
    uint64_t answer_bytes; /* of that answer: its size, or what a streamed one has made so far */
} conn;

typedef struct server {
    serve_opts o;
    lua_State *L;
    int model_ref; /* registry reference of the rnnlua.serve model */
    /* the model's interface, fixed for the server's life (a reload may not change it) */
    int64_t in_dim, out_dim;
    bool sparse, images, out_images;
    /* under mu: the queue, the model's description, flags set by signals */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    atomic_llong queued_frames; /* changed under mu; atomic for /healthz, which takes no lock */
    char *info_json;
    atomic_llong epoch; /* the same */
    char *decode_error; /* why POST /v1/decode cannot be answered (NULL: it can) */
    int decode_status;
    bool stop, reload;
    atomic_bool draining;
    atomic_int connections, requests;
    atomic_llong batches_run; /* model batches run (GET /healthz) */
    atomic_int started;       /* connections ever started (drain: a quiet spell before closing) */
    atomic_int incoming;      /* forward/decode requests being received or parsed */
    struct MHD_Daemon *daemon;
    int listen_fd;
    int gate_pipe[2]; /* wakes the gate thread to stop */
    pthread_t gate_thread;
    bool gate_running;
    pthread_mutex_t cmu; /* the list of open connections */
    conn *conns;
    pthread_t sig_thread;
    /* POST /v1/stream: the model through the C API (NULL: capi_error says why), the slots */
    rl_model *capi;
    char *capi_error;
    pthread_mutex_t smu;
    stream_slot *streams;
    atomic_int stream_workers; /* chunks in flight (answer_stream until stream_finish) */
    pthread_mutex_t bmu;       /* the chunks waiting for a batched push (stream_run_batches) */
    struct stream_work *waiting, *waiting_tail; /* oldest first */
    bool batching;                              /* stream_run_batches is running, or about to */
    /* the threads that run the streams' tasks (stream_thread_main): a stream's first chunk (its
     * session opened), each chunk with --stream-batch 1, the batches; one is started when none
     * is idle, so a task never waits for a thread */
    pthread_mutex_t pmu;
    pthread_cond_t pcv;         /* signalled when a thread ends (stream_pool_stop) */
    struct stream_thread *idle; /* waiting for a task */
    int pool_threads;           /* alive */
    bool pool_quit;
} server;

/* ---- small helpers --------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rnnlua: serve: ", stderr); /* "rnnlua: <where>: <what>" (docs/tools.md) */
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

static char *vformat(const char *fmt, va_list ap) {
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) return NULL;
    return s;
}

static char *format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

static void conn_answering(struct MHD_Connection *c, uint64_t bytes);

/* Queues the n bytes of JSON text (malloc'd, taken) as the answer; allow: the Allow header of a
 * 405. */
static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, char *text, size_t n,
                                  const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) conn_answering(c, n);
    return ret;
}

/* Queues `doc` (taken) as the JSON answer; allow: the Allow header of a 405. */
static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *doc,
                                  const char *allow) {
    char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(doc);
    if (text == NULL) { /* out of memory, or a NaN that slipped through: still a JSON answer */
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        text = strdup("{\"error\":\"the answer could not be encoded as JSON\"}");
        if (text == NULL) return MHD_NO;
    }
    /* the closing newline takes the place of the terminating zero: MHD takes the length */
    size_t n = strlen(text);
    text[n] = '\n';
    return reply_text(c, status, text, n + 1, allow);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *allow,
                                   const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    json_t *doc = json_pack("{s:s}", "error", msg ? msg : "out of memory");
    free(msg);
    return reply_json(c, status, doc, allow);
}

/* ---- routes ----------------------------------------------------------------------------- */

enum { R_HEALTH, R_MODEL, R_FORWARD, R_DECODE, R_RELOAD, R_STREAM, R_COUNT };

static const struct {
    const char *path, *method;
} routes[R_COUNT] = {
    [R_HEALTH] = {"/healthz", "GET"},      [R_MODEL] = {"/v1/model", "GET"},
    [R_FORWARD] = {"/v1/forward", "POST"}, [R_DECODE] = {"/v1/decode", "POST"},
    [R_RELOAD] = {"/v1/reload", "POST"},   [R_STREAM] = {"/v1/stream/", "POST"},
};

/* libmicrohttpd decodes %XX in the path before on_request sees it: a %00 would cut the C string
 * there, so "/healthz%00x" would be answered as GET /healthz. Such a path is left as it came (no
 * route). */
static size_t unescape_path(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    for (const char *p = strchr(s, '%'); p != NULL; p = strchr(p + 1, '%'))
        if (p[1] == '0' && p[2] == '0') return strlen(s);
    return MHD_http_unescape(s);
}

static int find_route(const char *url) {
    for (int i = 0; i < R_COUNT; i++)
        if (strcmp(url, routes[i].path) == 0) return i;
    if (strncmp(url, routes[R_STREAM].path, strlen(routes[R_STREAM].path)) == 0) return R_STREAM;
    return -1;
}

/* ---- jobs ------------------------------------------------------------------------------- */

static void job_free(job *j) {
    if (j == NULL) return;
    free(j->T);
    free(j->H);
    free(j->W);
    free(j->off);
    free(j->x);
    free(j->xi);
    free(j->error);
    for (int64_t s = 0; j->outs && s < j->nseq; s++)
        free(j->outs[s]);
    free(j->outs);
    free(j->oT);
    free(j->oH);
    free(j->oW);
    json_decref(j->extra);
    free(j->text);
    free(j);
}

static bool job_alloc_seqs(job *j, int64_t n) {
    size_t sz = (size_t)(n > 0 ? n : 1) * sizeof(int64_t);
    j->nseq = n;
    j->T = calloc(1, sz);
    j->H = calloc(1, sz);
    j->W = calloc(1, sz);
    j->off = calloc(1, sz);
    j->oT = calloc(1, sz);
    j->oH = calloc(1, sz);
    j->oW = calloc(1, sz);
    j->outs = calloc((size_t)(n > 0 ? n : 1), sizeof *j->outs);
    return j->T && j->H && j->W && j->off && j->oT && j->oH && j->oW && j->outs;
}

/* Gives j an error answer (model thread; complete() then marks it done). */
static void job_fail(job *j, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    free(j->error);
    j->error = vformat(fmt, ap);
    va_end(ap);
    j->status = status;
}

/* ---- parsing a request (HTTP threads) ---------------------------------------------------- */

typedef struct {
    char msg[512];
    int status;
} perr;

static bool bad(perr *e, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    return false;
}

/* Checks one sequence object {"data": ..., "size": [h, w]} (where names it in errors) and
 * returns its frames in *T (and H, W for images). */
static bool check_seq(const server *S, json_t *seq, const char *where, const char *pfx, int64_t *T,
                      int64_t *H, int64_t *W, perr *e) {
    if (!json_is_object(seq)) return bad(e, 400, "%s must be an object {\"data\": ...}", where);
    const char *key;
    json_t *v;
    /* the body's own keys (data, beam, ...) were checked by parse_job */
    json_object_foreach(seq, key, v) {
        if (pfx[0] != '\0' && strcmp(key, "data") != 0 && !(S->images && strcmp(key, "size") == 0))
            return bad(e, 400, "%s: unknown key '%s' (known: data%s)", where, key,
                       S->images ? ", size" : "");
    }
    json_t *data = json_object_get(seq, "data");
    if (data == NULL) return bad(e, 400, "%s has no \"data\"", where);
    if (!json_is_array(data))
        return bad(e, 400, "%sdata must be a list of frames, got a %s", pfx,
                   json_is_object(data) ? "object" : "scalar");
    int64_t n = (int64_t)json_array_size(data);
    if (n == 0) return bad(e, 422, "%sdata has no frames", pfx);
    if (n > S->o.max_frames)
        return bad(e, 413, "%sdata has %lld frames; the limit is %lld (--max-frames)", pfx,
                   (long long)n, (long long)S->o.max_frames);
    *T = n;
    *H = n;
    *W = 1;
    if (S->images) {
        json_t *size = json_object_get(seq, "size");
        json_int_t h, w;
        if (size == NULL)
            return bad(e, 422, "%s needs \"size\": [height, width]: the model takes images", where);
        if (!json_is_array(size) || json_array_size(size) != 2 ||
            !json_is_integer(json_array_get(size, 0)) || !json_is_integer(json_array_get(size, 1)))
            return bad(e, 422, "%ssize must be [height, width], two integers", pfx);
        h = json_integer_value(json_array_get(size, 0));
        w = json_integer_value(json_array_get(size, 1));
        if (h < 1 || w < 1 || h > n || w > n || h * w != n)
            return bad(e, 422, "%ssize [%lld, %lld] does not match the %lld frames of %sdata", pfx,
                       (long long)h, (long long)w, (long long)n, pfx);
        *H = h;
        *W = w;
    }
    return true;
}

/* Copies the frames of a checked sequence into x (dense) or xi (sparse), checking each value. */
static bool fill_seq(const server *S, json_t *seq, const char *where, float *x, int32_t *xi,
                     perr *e) {
    /* where: "" for the body's own data, "batch[3]." for an entry */
    json_t *data = json_object_get(seq, "data");
    size_t t;
    json_t *frame;
    int64_t F = S->in_dim;
    json_array_foreach(data, t, frame) {
        if (S->sparse) {
            if (!json_is_integer(frame))
                return bad(e, 422,
                           "%sdata[%zu] must be a class index (an integer in 0..%lld): "
                           "the model's input is sparse",
                           where, t, (long long)F - 1);
            json_int_t v = json_integer_value(frame);
            if (v < 0 || v >= F)
                return bad(e, 422, "%sdata[%zu] = %lld is not a class index in 0..%lld", where, t,
                           (long long)v, (long long)F - 1);
            xi[t] = (int32_t)v;
            continue;
        }
        if (!json_is_array(frame))
            return bad(e, 422, "%sdata[%zu] must be a list of %lld numbers", where, t,
                       (long long)F);
        if ((int64_t)json_array_size(frame) != F)
            return bad(e, 422, "%sdata[%zu] has %zu values; the model takes %lld per frame", where,
                       t, json_array_size(frame), (long long)F);
        size_t d;
        json_t *v;
        json_array_foreach(frame, d, v) {
            if (!json_is_number(v))
                return bad(e, 422, "%sdata[%zu][%zu] is not a number", where, t, d);
            double dv = json_number_value(v);
            float fv = (float)dv;
            if (!isfinite(fv))
                return bad(e, 422, "%sdata[%zu][%zu] = %g is not a finite float32", where, t, d,
                           dv);
            x[(size_t)t * (size_t)F + d] = fv;
        }
    }
    return true;
}

/* The "lm" of a decode body: {"weight": w, "bonus": b, "file": the server's --lm} (bonus 0 and
 * file by default); false with *e set. A client names no file of its own: the server fuses only
 * the LM it loaded and checked at start-up. */
static bool parse_lm(const server *S, json_t *jl, double *weight, double *bonus, perr *e) {
    if (S->o.lm_file == NULL) {
        bad(e, 422, "\"lm\": this server has no language model (start it with --lm FILE)");
        return false;
    }
    if (!json_is_object(jl)) {
        bad(e, 400, "\"lm\" must be an object {\"weight\": w, \"bonus\": b}");
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(jl, key, v) {
        if (strcmp(key, "weight") != 0 && strcmp(key, "bonus") != 0 && strcmp(key, "file") != 0) {
            bad(e, 400, "\"lm\": unknown key '%s' (known: weight, bonus, file)", key);
            return false;
        }
    }
    json_t *jw = json_object_get(jl, "weight"), *jb = json_object_get(jl, "bonus");
    json_t *jf = json_object_get(jl, "file");
    if (!json_is_number(jw) || !isfinite(json_number_value(jw))) {
        bad(e, 422, "\"lm\": \"weight\" must be a finite number");
        return false;
    }
    if (jb != NULL && (!json_is_number(jb) || !isfinite(json_number_value(jb)))) {
        bad(e, 422, "\"lm\": \"bonus\" must be a finite number");
        return false;
    }
    if (jf != NULL && (!json_is_string(jf) || strcmp(json_string_value(jf), S->o.lm_file) != 0)) {
        bad(e, 422, "\"lm\": \"file\" must be the server's language model (--lm), or left out");
        return false;
    }
    *weight = json_number_value(jw);
    *bonus = jb ? json_number_value(jb) : 0;
    return true;
}

/* The job for a forward or decode body, or NULL with *e set. */
static job *parse_job(const server *S, int route, const char *body, size_t len, perr *e) {
    json_error_t jerr;
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL) {
        bad(e, 400, "bad JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    job *j = NULL;
    if (!json_is_object(doc)) {
        bad(e, 400, "the body must be a JSON object {\"data\": ...} or {\"batch\": [...]}");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v) {
        bool known = strcmp(key, "data") == 0 || strcmp(key, "batch") == 0 ||
                     (S->images && strcmp(key, "size") == 0) ||
                     (route == R_DECODE && (strcmp(key, "beam") == 0 || strcmp(key, "lm") == 0)) ||
                     (route == R_STREAM && strcmp(key, "end") == 0);
        if (!known) {
            bad(e, 400, "unknown key '%s' (known: data, batch%s%s)", key, S->images ? ", size" : "",
                route == R_DECODE   ? ", beam, lm"
                : route == R_STREAM ? ", end"
                                    : "");
            goto out;
        }
    }
    json_t *batch = json_object_get(doc, "batch");
    bool single = batch == NULL;
    if (single == (json_object_get(doc, "data") == NULL)) {
        bad(e, 400,
            single ? "the body needs \"data\" (one sequence) or \"batch\" (a list)"
                   : "give either \"data\" or \"batch\", not both");
        goto out;
    }
    if (route == R_STREAM && !single) {
        bad(e, 400, "a stream's chunk is one sequence: {\"data\": [[f, ...], ...]}, no \"batch\"");
        goto out;
    }
    json_t *jend = json_object_get(doc, "end");
    if (jend != NULL && !json_is_boolean(jend)) {
        bad(e, 400, "\"end\" must be true or false");
        goto out;
    }
    if (!single && (!json_is_array(batch) || json_array_size(batch) == 0)) {
        bad(e, 400, "\"batch\" must be a non-empty list of {\"data\": ...} objects");
        goto out;
    }
    if (!single && json_object_get(doc, "size") != NULL) {
        bad(e, 400, "\"size\" belongs inside each batch entry");
        goto out;
    }
    int beam = 1;
    json_t *jb = json_object_get(doc, "beam");
    if (jb != NULL) {
        if (!json_is_integer(jb) || json_integer_value(jb) < 1 ||
            json_integer_value(jb) > S->o.max_beam) {
            bad(e, 422, "\"beam\" must be an integer in 1..%d", S->o.max_beam);
            goto out;
        }
        beam = (int)json_integer_value(jb);
    }
    bool lm = false;
    double lm_weight = 0, lm_bonus = 0;
    json_t *jl = json_object_get(doc, "lm");
    if (jl != NULL && !parse_lm(S, jl, &lm_weight, &lm_bonus, e)) goto out;
    lm = jl != NULL;
    int64_t n = single ? 1 : (int64_t)json_array_size(batch);
    j = calloc(1, sizeof *j);
    if (j == NULL || !job_alloc_seqs(j, n)) {
        bad(e, 503, "out of memory");
        goto out;
    }
    j->kind = route == R_DECODE ? JOB_DECODE : JOB_FORWARD;
    j->single = single;
    j->end = jend != NULL && json_is_true(jend);
    j->beam = beam;
    j->lm = lm;
    j->lm_weight = lm_weight;
    j->lm_bonus = lm_bonus;
    char where[64], pfx[64];
    int64_t total = 0, maxT = 0;
    for (int64_t s = 0; s < n; s++) {
        json_t *seq = single ? doc : json_array_get(batch, (size_t)s);
        snprintf(where, sizeof where, single ? "the body" : "batch[%lld]", (long long)s);
        snprintf(pfx, sizeof pfx, single ? "" : "batch[%lld].", (long long)s);
        if (!check_seq(S, seq, where, pfx, &j->T[s], &j->H[s], &j->W[s], e)) goto fail;
        j->off[s] = total;
        total += j->T[s];
        if (total > S->o.max_frames) {
            bad(e, 413, "the request holds more than %lld frames (--max-frames)",
                (long long)S->o.max_frames);
            goto fail;
        }
        maxT = j->T[s] > maxT ? j->T[s] : maxT;
    }
    j->frames = total;
    j->maxT = maxT;
    for (int64_t s = 0; s < n; s++) {
        j->maxH = j->H[s] > j->maxH ? j->H[s] : j->maxH;
        j->maxW = j->W[s] > j->maxW ? j->W[s] : j->maxW;
    }
    if (S->sparse)
        j->xi = malloc((size_t)total * sizeof *j->xi);
    else
        j->x = malloc((size_t)total * (size_t)S->in_dim * sizeof *j->x);
    if (j->xi == NULL && j->x == NULL) {
        bad(e, 503, "out of memory for %lld frames", (long long)total);
        goto fail;
    }
    for (int64_t s = 0; s < n; s++) {
        json_t *seq = single ? doc : json_array_get(batch, (size_t)s);
        snprintf(pfx, sizeof pfx, single ? "" : "batch[%lld].", (long long)s);
        float *x = j->x ? j->x + j->off[s] * S->in_dim : NULL;
        int32_t *xi = j->xi ? j->xi + j->off[s] : NULL;
        if (!fill_seq(S, seq, pfx, x, xi, e)) goto fail;
    }
    goto out;
fail:
    job_free(j);
    j = NULL;
out:
    json_decref(doc);
    return j;
}

/* ---- a stream's chunk without the jansson tree ------------------------------------------- */

/* A stream's chunk is parsed 100 times a second per stream; jansson's tree (a malloc a number)
 * was about a seventh of the server's CPU time at 64 streams of 10 ms frames. The
 * plain form, {"data": [[v, ...], ...]} and an optional "end": true/false, is read here into
 * the numbers jansson would give; anything else (another key, a key twice, an escape, a number
 * jansson refuses or a value that is not a finite float32, a sparse or image model, too many
 * frames) is left to parse_job, so every refusal keeps its message. */
typedef struct {
    const char *p, *end;
} scan;

static void scan_ws(scan *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool scan_char(scan *c, char ch) {
    scan_ws(c);
    if (c->p == c->end || *c->p != ch) return false;
    c->p++;
    return true;
}

static bool scan_word(scan *c, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
    c->p += n;
    return true;
}

/* A JSON number as jansson reads it: an integer token (no fraction, no exponent) through
 * strtoll, a real through strtod; false where jansson would refuse it or it is no float32. */
static bool scan_number(scan *c, float *out) {
    char buf[64];
    const char *q = c->p;
    bool real = false;
    if (q < c->end && *q == '-') q++;
    if (q == c->end || *q < '0' || *q > '9') return false;
    if (*q == '0') {
        q++;
    } else {
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < c->end && *q == '.') {
        real = true;
        q++;
        if (q == c->end || *q < '0' || *q > '9') return false;
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < c->end && (*q == 'e' || *q == 'E')) {
        real = true;
        q++;
        if (q < c->end && (*q == '+' || *q == '-')) q++;
        if (q == c->end || *q < '0' || *q > '9') return false;
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    }
    size_t n = (size_t)(q - c->p);
    if (n >= sizeof buf) return false;
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    double v;
    errno = 0;
    if (real) {
        v = strtod(buf, NULL);
        if ((v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE) return false;
    } else {
        long long i = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return false;
        v = (double)i;
    }
    float f = (float)v;
    if (!isfinite(f)) return false;
    *out = f;
    c->p = q;
    return true;
}

/* The job of a chunk body of the plain form, or NULL: parse_job is to read it. */
static job *parse_chunk(const server *S, const char *body, size_t len) {
    if (S->sparse || S->images || S->in_dim < 1) return NULL;
    scan c = {body, body + len};
    int64_t F = S->in_dim, T = 0, cap = 0;
    float *x = NULL;
    bool have_data = false, have_end = false, end = false, ok = false;
    if (!scan_char(&c, '{')) return NULL;
    for (;;) {
        if (!scan_char(&c, '"')) goto out;
        if (scan_word(&c, "data\"")) {
            if (have_data) goto out;
            have_data = true;
            if (!scan_char(&c, ':') || !scan_char(&c, '[')) goto out;
            do {
                if (T == S->o.max_frames) goto out;
                if (T == cap) {
                    cap = cap ? 2 * cap : 16;
                    float *x2 = realloc(x, (size_t)(cap * F) * sizeof *x);
                    if (x2 == NULL) goto out;
                    x = x2;
                }
                if (!scan_char(&c, '[')) goto out;
                for (int64_t k = 0; k < F; k++) {
                    if (k && !scan_char(&c, ',')) goto out;
                    scan_ws(&c);
                    if (!scan_number(&c, &x[T * F + k])) goto out;
                }
                if (!scan_char(&c, ']')) goto out;
                T++;
            } while (scan_char(&c, ','));
            if (!scan_char(&c, ']')) goto out;
        } else if (scan_word(&c, "end\"")) {
            if (have_end) goto out;
            have_end = true;
            if (!scan_char(&c, ':')) goto out;
            scan_ws(&c);
            if (scan_word(&c, "true"))
                end = true;
            else if (!scan_word(&c, "false"))
                goto out;
        } else {
            goto out;
        }
        if (scan_char(&c, '}')) break;
        if (!scan_char(&c, ',')) goto out;
    }
    scan_ws(&c);
    ok = have_data && c.p == c.end;
out:;
    job *j = ok ? calloc(1, sizeof *j) : NULL;
    if (j == NULL || !job_alloc_seqs(j, 1)) {
        free(x);
        job_free(j);
        return NULL;
    }
    j->kind = JOB_FORWARD;
    j->single = true;
    j->end = end;
    j->beam = 1;
    j->T[0] = j->H[0] = T;
    j->W[0] = 1;
    j->frames = j->maxT = j->maxH = T;
    j->maxW = 1;
    j->x = x;
    return j;
}

/* "batch[s]: " naming sequence s of j in messages; "" for a body holding one sequence. */
static const char *seq_name(const job *j, int64_t s, char buf[48]) {
    if (j->single) return "";
    snprintf(buf, 48, "batch[%lld]: ", (long long)s);
    return buf;
}

/* The JSON answer of a finished decode job (NULL: out of memory). */
static json_t *decode_answer(const job *j) {
    if (!j->single) return json_pack("{s:O}", "batch", j->extra);
    return json_incref(json_array_get(j->extra, 0));
}

/* The text of a forward answer, written a piece at a time without building it as a jansson
 * tree: a tree costs about 50 bytes a value (1.5 GB for 20000 frames of a 1000-way softmax,
 * within the default limits, 6 GB at 4000 outputs), the text about 12. Numbers are written as
 * jansson writes them with JSON_REAL_PRECISION(9): %.9g (9 significant digits read back as the
 * same float32), ".0" on integral values, exponents without '+' or leading zeros. */
typedef struct {
    const server *S;
    const job *j;
    int64_t s, t, d; /* the next value: sequence s, row t, column d */
    int phase;       /* 0 start, 1 open sequence s, 2 values, 3 close sequence s, 4 end, 5 done */
    char pend[96];   /* a piece that did not fit into the last buffer */
    size_t pend_len, pend_off;
} answer_text;

/* v as jansson writes it (lua/json_real.h); NaN and infinities as snprintf writes them. */
static int format_real(char *buf, float v) {
    return isfinite(v) ? rl_json_real(buf, v) : rl_json_real_slow(buf, (double)v);
}

/* The next piece of the answer into tok (at most 96 bytes); 0 at the end. */
static size_t answer_piece(answer_text *w, char *tok) {
    const job *j = w->j;
    int64_t D = w->S->out_dim;
    size_t n = 0;
    switch (w->phase) {
    case 0:
        w->phase = 1;
        if (!j->single) return (size_t)sprintf(tok, "{\"batch\":[");
        /* fall through */
    case 1:
        w->t = w->d = 0;
        w->phase = j->oT[w->s] > 0 ? 2 : 3;
        return (size_t)sprintf(tok, "%s{\"output\":[", w->s > 0 ? "," : "");
    case 2:
        if (w->d == 0) tok[n++] = w->t > 0 ? ',' : '[';
        if (w->d == 0 && w->t > 0) tok[n++] = '[';
        if (w->d > 0) tok[n++] = ',';
        n += (size_t)format_real(tok + n, j->outs[w->s][w->t * D + w->d]);
        if (++w->d == D) {
            tok[n++] = ']';
            w->d = 0;
            if (++w->t == j->oT[w->s]) w->phase = 3;
        }
        return n;
    case 3:
        w->phase = ++w->s < j->nseq ? 1 : 4;
        if (!w->S->out_images) return (size_t)sprintf(tok, "]}");
        return (size_t)sprintf(tok, "],\"size\":[%lld,%lld]}", (long long)j->oH[w->s - 1],
                               (long long)j->oW[w->s - 1]);
    case 4: w->phase = 5; return (size_t)sprintf(tok, "%s\n", j->single ? "" : "]}");
    default: return 0;
    }
}

/* libmicrohttpd's reader of a streamed answer: fills buf with the next pieces. */
static void conn_answer_made(struct MHD_Connection *c, uint64_t bytes);

static ssize_t answer_read(void *cls, uint64_t pos, char *buf, size_t max) {
    answer_text *w = cls;
    conn_answer_made(w->j->conn, pos); /* what the client has taken, give or take a buffer */
    size_t got = 0;
    for (;;) {
        if (w->pend_off == w->pend_len) {
            w->pend_len = answer_piece(w, w->pend);
            w->pend_off = 0;
            if (w->pend_len == 0) break;
        }
        size_t k = w->pend_len - w->pend_off;
        if (k > max - got) k = max - got;
        memcpy(buf + got, w->pend + w->pend_off, k);
        w->pend_off += k;
        got += k;
        if (got == max) break;
    }
    return got > 0 ? (ssize_t)got : (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
}

/* Answers a finished forward job: one buffer with its Content-Length, or beyond a million values
 * streamed (chunked), so that an answer never needs more memory than its floats. */
static enum MHD_Result reply_forward(const server *S, struct MHD_Connection *c, const job *j) {
    answer_text *w = calloc(1, sizeof *w);
    if (w == NULL) return MHD_NO;
    *w = (answer_text){.S = S, .j = j};
    int64_t values = 0;
    for (int64_t s = 0; s < j->nseq; s++)
        values += j->oT[s] * S->out_dim;
    struct MHD_Response *r = NULL;
    bool streamed = values > (1 << 20);
    size_t len = 0;
    if (streamed) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1 << 16, answer_read, w, free);
        if (r == NULL) free(w);
    } else {
        size_t cap = 256 + (size_t)values * 16;
        char *text = malloc(cap);
        for (size_t n; text && (n = answer_piece(w, text + len)) > 0;) {
            len += n;
            if (cap - len < sizeof w->pend) { /* room for the longest piece */
                char *t2 = realloc(text, cap *= 2);
                if (t2 == NULL) free(text);
                text = t2;
            }
        }
        free(w);
        r = text ? MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE) : NULL;
        if (r == NULL) free(text);
    }
    if (r == NULL)
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL,
                           "out of memory writing the answer");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) conn_answering(c, streamed ? 0 : len);
    return ret;
}

/* ---- the queue ---------------------------------------------------------------------------- */

/* Reserves room for `frames` in the queue (503 text in *e when full). A request's frames count
 * until its answer has been written (on_completed), not only until the model is done with it:
 * clients that did not read their answers made the server hold them all (the floats of 20000
 * frames of a 1000-way softmax are 80 MB, for each of --max-connections). */
static bool queue_reserve(server *S, int64_t frames, perr *e) {
    pthread_mutex_lock(&S->mu);
    bool ok = S->queued_frames + frames <= S->o.max_queue_frames || S->queued_frames == 0;
    if (ok) S->queued_frames += frames;
    pthread_mutex_unlock(&S->mu);
    if (!ok)
        bad(e, 503,
            "the server is busy: %lld frames are queued or being answered (--max-queue-frames "
            "%lld)",
            (long long)S->queued_frames, (long long)S->o.max_queue_frames);
    return ok;
}

static void not_incoming(server *S, request *r);
static void conn_mark(server *S, struct MHD_Connection *c, bool in_request);

/* Makes the coming close of socket fd a reset: what the kernel still holds of an answer that
 * will never be complete (megabytes) would otherwise trickle out to a slow reader for minutes
 * after a plain close. */
static void reset_on_close(int fd) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
}

/* Appends j (the job of r) and wakes the model thread. */
static void queue_push(server *S, job *j, request *r) {
    pthread_mutex_lock(&S->mu);
    not_incoming(S, r);
    j->t_queued = now_s();
    if (S->tail)
        S->tail->next = j;
    else
        S->head = j;
    S->tail = j;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
}

/* ---- HTTP handlers (libmicrohttpd's threads) ---------------------------------------------- */

/* The answer of GET /healthz, from atomics only: it takes no lock, so neither the queue nor the
 * model thread can make it wait. *status: 200, or 503 while the server drains. */
static json_t *health_doc(server *S, unsigned *status) {
    bool draining = atomic_load(&S->draining);
    *status = draining ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK;
    return json_pack("{s:s,s:I,s:I,s:i,s:i,s:I}", "status", draining ? "draining" : "ok", "epoch",
                     (json_int_t)atomic_load(&S->epoch), "queued_frames",
                     (json_int_t)atomic_load(&S->queued_frames), "incoming",
                     atomic_load(&S->incoming), "connections", atomic_load(&S->connections),
                     "batches_run", (json_int_t)atomic_load(&S->batches_run));
}

static enum MHD_Result answer_get(server *S, struct MHD_Connection *c, int route) {
    if (route == R_HEALTH) {
        unsigned status;
        json_t *doc = health_doc(S, &status);
        return reply_json(c, status, doc, NULL);
    }
    pthread_mutex_lock(&S->mu);
    json_error_t jerr;
    json_t *doc = json_loads(S->info_json, 0, &jerr);
    pthread_mutex_unlock(&S->mu);
    return reply_json(c, MHD_HTTP_OK, doc, NULL);
}

/* Whether the Authorization header is "Bearer <the --admin-token>". The comparison takes the
 * same time wherever the first difference is, so the answer's timing tells nothing of how much
 * of a guess was right (only whether its length was). */
static bool admin_authorized(const server *S, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    static const char scheme[] = "Bearer ";
    if (h == NULL || strncasecmp(h, scheme, sizeof scheme - 1) != 0) return false;
    const volatile unsigned char *a = (const unsigned char *)h + sizeof scheme - 1;
    const volatile unsigned char *b = (const unsigned char *)S->o.admin_token;
    size_t na = strlen((const char *)a), nb = strlen((const char *)b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < nb; i++)
        diff |= (unsigned char)(b[i] ^ a[i < na ? i : 0]);
    return diff == 0;
}

/* The first call for a request: route, method and the limits known from the headers. */
static enum MHD_Result add_header_size(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* Whether a request's Content-Length headers differ (libmicrohttpd takes the first). */
typedef struct {
    const char *first;
    bool differ;
} lengths_seen;

static enum MHD_Result compare_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    (void)kind;
    lengths_seen *l = cls;
    if (strcasecmp(key, "Content-Length") != 0 || value == NULL) return MHD_YES;
    if (l->first == NULL) l->first = value;
    if (strcmp(l->first, value) != 0) l->differ = true;
    return MHD_YES;
}

static enum MHD_Result begin_request(server *S, struct MHD_Connection *c, request *r,
                                     const char *url, const char *method) {
    /* the gate's limits, for the later requests of a kept-alive connection */
    if (strlen(url) + strlen(method) + 10 > GATE_LINE_MAX)
        return reply_error(c, MHD_HTTP_URI_TOO_LONG, NULL,
                           "the request line is longer than %d bytes", GATE_LINE_MAX);
    size_t head = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_size, &head);
    if (head > GATE_HEAD_MAX)
        return reply_error(c, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE, NULL,
                           "the request's headers are larger than %d bytes", GATE_HEAD_MAX);
    lengths_seen cls = {NULL, false};
    MHD_get_connection_values(c, MHD_HEADER_KIND, compare_length, &cls);
    if (cls.differ)
        return reply_error(c, MHD_HTTP_BAD_REQUEST, NULL,
                           "bad Content-Length '%.40s' (decimal digits, at most 18, the same each "
                           "time)",
                           cls.first);
    r->route = find_route(url);
    if (r->route < 0)
        return reply_error(c, MHD_HTTP_NOT_FOUND, NULL,
                           "no such path '%s' (GET /healthz, GET /v1/model, POST /v1/forward, "
                           "POST /v1/decode, POST /v1/reload, POST /v1/stream/{id})",
                           url);
    /* HEAD is GET without the body (libmicrohttpd leaves it out): monitors use it */
    bool get = strcmp(routes[r->route].method, "GET") == 0;
    if (strcmp(method, routes[r->route].method) != 0 && !(get && strcmp(method, "HEAD") == 0))
        return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, get ? "GET, HEAD" : "POST",
                           "%s takes %s, not %s", url, routes[r->route].method, method);
    if (atomic_load(&S->draining) && r->route != R_HEALTH)
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "the server is shutting down");
    if (r->route == R_HEALTH || r->route == R_MODEL) return answer_get(S, c, r->route);
    if (r->route == R_RELOAD && S->o.admin_token == NULL)
        return reply_error(c, MHD_HTTP_FORBIDDEN, NULL,
                           "/v1/reload is off: the server was started without --admin-token "
                           "(SIGHUP reloads too)");
    if (r->route == R_RELOAD && !admin_authorized(S, c))
        return reply_error(c, MHD_HTTP_UNAUTHORIZED, NULL,
                           "/v1/reload needs the header 'Authorization: Bearer TOKEN' with the "
                           "server's --admin-token");
    if (r->route == R_DECODE) {
        pthread_mutex_lock(&S->mu);
        char *why = S->decode_error ? strdup(S->decode_error) : NULL;
        int status = S->decode_status;
        pthread_mutex_unlock(&S->mu);
        if (why) {
            enum MHD_Result ret = reply_error(c, (unsigned)status, NULL, "%s", why);
            free(why);
            return ret;
        }
    }
    if (atomic_load(&S->connections) > S->o.max_connections)
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                           "too many open connections (%d; --max-connections %d)",
                           atomic_load(&S->connections), S->o.max_connections);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl != NULL) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && *end == '\0' && n > S->o.max_body)
            return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                               "the body has %llu bytes; the limit is %zu (--max-body)", n,
                               S->o.max_body);
    }
    if (r->route != R_RELOAD) {
        r->incoming = true;
        atomic_fetch_add(&S->incoming, 1);
    }
    return MHD_YES;
}

/* The request's body has been queued or refused: it no longer keeps the model thread waiting. */
static void not_incoming(server *S, request *r) {
    if (!r->incoming) return;
    r->incoming = false;
    atomic_fetch_sub(&S->incoming, 1);
}

/* reply_error for a request whose body was read and is refused. */
static enum MHD_Result reply_refused(server *S, request *r, struct MHD_Connection *c,
                                     unsigned status, const char *allow, const char *fmt, ...) {
    not_incoming(S, r);
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    enum MHD_Result ret = reply_error(c, status, allow, "%s", msg ? msg : "out of memory");
    free(msg);
    return ret;
}

/* Appends a piece of the body; beyond the limit (a chunked body without Content-Length) the
 * rest is read and dropped, and 413 answered at the end. */
static void take_body(server *S, request *r, const char *data, size_t n) {
    if (r->too_large || r->len + n > S->o.max_body) {
        r->too_large = true;
        return;
    }
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1)
            cap *= 2;
        char *b = realloc(r->body, cap);
        if (b == NULL) {
            r->too_large = true;
            return;
        }
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
}

/* ---- POST /v1/stream/{id} ---------------------------------------------------------------- */

/* A chunk of a stream. Its session is opened (the first chunk) in a thread of the pool
 * (stream_dispatch), so that the HTTP thread that received it goes on serving its other
 * connections; it is pushed (stream_enqueue), the answer or the error left in the job, the slot
 * updated and the connection resumed (stream_finish; on_request then writes the answer). */
typedef struct stream_work {
    server *S;
    job *j;
    stream_slot *slot;
    rl_session *session; /* NULL: the stream's first chunk */
    int64_t before;      /* frames pushed before this chunk */
    char id[STREAM_ID_MAX + 1];
    struct stream_work *next; /* in S->waiting */
    rl_batch chunk;
} stream_work;

static void complete(server *S, job *j);

/* The answer to a chunk, {"id":...,"output":[[...],...],"frames":N,"end":false} and a newline,
 * written as the text jansson's json_dumps(JSON_COMPACT | JSON_REAL_PRECISION(9)) makes of that
 * object (format_real), without building the tree: the tree and its dump took about a tenth of
 * the server's CPU time at 64 streams of 10 ms frames. NULL: out of memory, or a value of out
 * is not finite (its row and column in *bad_t, *bad_k). */
static char *stream_answer(const char *id, const rl_output *out, int64_t frames, bool end,
                           size_t *len, int64_t *bad_t, int64_t *bad_k) {
    for (int64_t i = 0; i < out->T * out->dim; i++)
        if (!isfinite(out->y[i])) {
            *bad_t = i / out->dim, *bad_k = i % out->dim;
            return NULL;
        }
    /* a value and its comma take at most 16 bytes (format_real's longest: "-1.17549435e-38"),
     * its terminating zero one more */
    size_t cap = strlen(id) + 96 + (size_t)out->T * ((size_t)out->dim * 17 + 3);
    char *text = malloc(cap), *p = text;
    if (text == NULL) return NULL;
    p += sprintf(p, "{\"id\":\"%s\",\"output\":[", id); /* id: A-Z a-z 0-9 . _ - only */
    for (int64_t t = 0; t < out->T; t++) {
        *p++ = t ? ',' : '[';
        if (t) *p++ = '[';
        for (int64_t k = 0; k < out->dim; k++) {
            if (k) *p++ = ',';
            p += format_real(p, out->y[t * out->dim + k]);
        }
        *p++ = ']';
    }
    p += sprintf(p, "],\"frames\":%lld,\"end\":%s}\n", (long long)frames, end ? "true" : "false");
    *len = (size_t)(p - text);
    return text;
}

/* Ends the chunk w: st and err (taken; NULL: out of memory) say how its push went, out is its
 * output; the answer or the error into its job, the slot updated, w freed, the connection
 * resumed. */
static void stream_finish(server *S, stream_work *w, rl_status st, char *err,
                          const rl_output *out) {
    job *j = w->j;
    rl_session *session = w->session;
    if (st == RL_OK) {
        int64_t bad_t = -1, bad_k = 0;
        j->text =
            stream_answer(w->id, out, w->before + j->T[0], j->end, &j->text_len, &bad_t, &bad_k);
        if (j->text == NULL) {
            j->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
            j->error = bad_t >= 0 ? format("layer '%s' gave NaN or Inf (output[%lld][%lld] of the "
                                           "chunk), which JSON cannot write",
                                           S->o.layer, (long long)bad_t, (long long)bad_k)
                                  : strdup("out of memory writing the answer");
        }
    } else {
        j->status = st == RL_ENOMEM ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_UNPROCESSABLE_CONTENT;
        j->error = err ? err : strdup("out of memory");
        err = NULL;
    }
    free(err);
    rl_session *to_free = NULL;
    stream_slot *slot = w->slot;
    pthread_mutex_lock(&S->smu);
    slot->busy = false;
    slot->last = now_s();
    slot->frames = w->before + (st == RL_OK ? j->T[0] : 0);
    slot->session = session;
    /* a chunk refused before it ran leaves the stream as it was; "end" closes it */
    if (j->end || session == NULL) {
        to_free = session;
        memset(slot, 0, sizeof *slot);
    }
    pthread_mutex_unlock(&S->smu);
    rl_session_free(to_free);
    free(w);
    complete(S, j);
    atomic_fetch_sub(&S->stream_workers, 1);
}

/* Runs the waiting chunks until none is left (a task of the pool, one at a time: S->batching).
 * Chunks of different streams that wait at the same time go through as one batched forward
 * (rl_session_push_many: the weights read once for all of them, not once a stream), the oldest
 * first, at most --stream-batch; the chunks that arrive meanwhile wait for the next batch. A
 * batch the C API refuses (a chunk it cannot take) runs again chunk by chunk, so that each
 * stream gets its own answer. The answers are written and their connections resumed here: a
 * chunk waiting for its batch holds no thread, and no thread is woken a chunk but the HTTP
 * thread that sends its answer. */
static void stream_run_batches(void *arg) {
    server *S = arg;
    /* at most one chunk a stream waits (409 beyond) */
    int cap = S->o.stream_batch < S->o.max_streams ? S->o.stream_batch : S->o.max_streams;
    rl_session **ss = malloc(sizeof *ss * (size_t)cap);
    rl_batch *cs = malloc(sizeof *cs * (size_t)cap);
    rl_output *os = malloc(sizeof *os * (size_t)cap);
    pthread_mutex_lock(&S->bmu);
    while (S->waiting) {
        stream_work *list = S->waiting, *last = list;
        int take = 1;
        while (take < cap && last->next)
            last = last->next, take++;
        S->waiting = last->next;
        if (S->waiting == NULL) S->waiting_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&S->bmu);
        stream_work *q = list;
        for (int i = 0; ss && cs && os && i < take; i++, q = q->next)
            ss[i] = q->session, cs[i] = q->chunk;
        /* One thread for the usual batch of a few chunks, whose products are too small to
         * gain from a second: its helper would spin between them on the core that the HTTP
         * threads need. A backlog (after a disturbance, 16 to --stream-batch chunks at once)
         * takes every --blas-threads, so that it clears sooner. */
        rl_blas_set_local_threads(take >= 16 ? S->o.blas_threads : 1);
        rl_status st = ss && cs && os ? rl_session_push_many(ss, cs, take, os) : RL_ENOMEM;
        q = list;
        for (int i = 0; i < take; i++) {
            stream_work *nq = q->next;
            if (st == RL_OK) {
                stream_finish(S, q, RL_OK, NULL, &os[i]);
            } else {
                rl_output out;
                rl_status st1 = rl_session_push(q->session, &q->chunk, &out);
                stream_finish(S, q, st1, st1 == RL_OK ? NULL : strdup(rl_errmsg()), &out);
            }
            q = nq;
        }
        pthread_mutex_lock(&S->bmu);
    }
    S->batching = false;
    pthread_mutex_unlock(&S->bmu);
    rl_blas_set_local_threads(0); /* the pool's thread runs other tasks next */
    free(ss), free(cs), free(os);
}

static void stream_dispatch(server *S, void (*fn)(void *), void *arg);

/* Pushes the chunk of w (its session open): alone in this thread with --stream-batch 1 (each
 * chunk in a thread of its own, side by side), else queued for stream_run_batches, which is
 * started on the pool when it is not running. */
static void stream_enqueue(server *S, stream_work *w) {
    if (S->o.stream_batch == 1) {
        rl_output out;
        rl_status st = rl_session_push(w->session, &w->chunk, &out);
        stream_finish(S, w, st, st == RL_OK ? NULL : strdup(rl_errmsg()), &out);
        return;
    }
    pthread_mutex_lock(&S->bmu);
    w->next = NULL;
    if (S->waiting_tail)
        S->waiting_tail->next = w;
    else
        S->waiting = w;
    S->waiting_tail = w;
    bool start = !S->batching;
    S->batching = true;
    pthread_mutex_unlock(&S->bmu);
    if (start) stream_dispatch(S, stream_run_batches, S);
}

/* A chunk in a thread of the pool: its stream's session opened if it is the first, then
 * pushed. */
static void stream_main(void *arg) {
    stream_work *w = arg;
    server *S = w->S;
    rl_status st = w->session ? RL_OK : rl_session_open(&w->session, S->capi);
    if (st != RL_OK) {
        w->session = NULL;
        stream_finish(S, w, st, strdup(rl_errmsg()), NULL);
        return;
    }
    stream_enqueue(S, w);
}

/* A thread of the pool: runs its task, then waits for the next one. Threads are kept rather
 * than started a chunk: starting one cost about a quarter of the server's CPU time at 64 streams
 * of 10 ms frames (the stack, and the thread-local blocks of the libraries, OpenBLAS's 60 KB,
 * cleared each time). One idle for STREAM_THREAD_IDLE_S ends. */
#define STREAM_THREAD_IDLE_S 30

typedef struct stream_thread {
    server *S;
    void (*fn)(void *); /* the task handed to this thread (NULL: none yet) */
    void *arg;
    pthread_cond_t cv;
    struct stream_thread *next; /* in S->idle */
} stream_thread;

static void *stream_thread_main(void *arg) {
    stream_thread *t = arg;
    server *S = t->S;
    pthread_setname_np(pthread_self(), "rl-stream");
    pthread_mutex_lock(&S->pmu);
    for (;;) {
        void (*fn)(void *) = t->fn;
        void *fa = t->arg;
        t->fn = NULL;
        pthread_mutex_unlock(&S->pmu);
        fn(fa);
        pthread_mutex_lock(&S->pmu);
        if (S->pool_quit) break;
        t->next = S->idle;
        S->idle = t;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += STREAM_THREAD_IDLE_S;
        while (t->fn == NULL && !S->pool_quit)
            if (pthread_cond_timedwait(&t->cv, &S->pmu, &until) == ETIMEDOUT) break;
        if (t->fn == NULL) { /* idle too long, or the server stops: out of the idle list */
            for (stream_thread **q = &S->idle; *q; q = &(*q)->next)
                if (*q == t) {
                    *q = t->next;
                    break;
                }
            break;
        }
    }
    S->pool_threads--;
    pthread_cond_broadcast(&S->pcv);
    pthread_mutex_unlock(&S->pmu);
    pthread_cond_destroy(&t->cv);
    free(t);
    return NULL;
}

/* Runs fn(arg) in an idle thread of the pool, or a new one; in this thread when no thread can
 * be started. The tasks are the chunks' (stream_main, counted in S->stream_workers) and the
 * batches' (stream_run_batches, which runs only while a chunk waits). */
static void stream_dispatch(server *S, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&S->pmu);
    stream_thread *t = S->idle;
    if (t) {
        S->idle = t->next;
        t->fn = fn, t->arg = arg;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&S->pmu);
        return;
    }
    S->pool_threads++;
    pthread_mutex_unlock(&S->pmu);
    t = malloc(sizeof *t);
    bool started = false;
    if (t) {
        *t = (stream_thread){.S = S, .fn = fn, .arg = arg};
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&t->cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&th, &at, stream_thread_main, t) == 0;
        pthread_attr_destroy(&at);
        if (!started) {
            pthread_cond_destroy(&t->cv);
            free(t);
        }
    }
    if (started) return;
    pthread_mutex_lock(&S->pmu);
    S->pool_threads--;
    pthread_mutex_unlock(&S->pmu);
    fn(arg);
}

/* Ends the pool's threads; no chunk may be running (S->stream_workers is 0). */
static void stream_pool_stop(server *S) {
    pthread_mutex_lock(&S->pmu);
    S->pool_quit = true;
    for (stream_thread *t = S->idle; t; t = t->next)
        pthread_cond_signal(&t->cv);
    while (S->pool_threads > 0)
        pthread_cond_wait(&S->pcv, &S->pmu);
    pthread_mutex_unlock(&S->pmu);
}

/* A stream's chunk: checked here, then pushed through the stream's own session, which carries
 * the recurrent state (stream_main, stream_enqueue); the model thread's queue is not involved
 * and streams run side by side. */
static enum MHD_Result answer_stream(server *S, request *r, struct MHD_Connection *c,
                                     const char *url) {
    const char *id = url + strlen(routes[R_STREAM].path);
    size_t idn = strlen(id);
    bool id_ok = idn >= 1 && idn <= STREAM_ID_MAX;
    for (size_t i = 0; id_ok && i < idn; i++)
        id_ok = (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
                (id[i] >= '0' && id[i] <= '9') || id[i] == '.' || id[i] == '_' || id[i] == '-';
    if (!id_ok)
        return reply_refused(S, r, c, MHD_HTTP_BAD_REQUEST, NULL,
                             "POST /v1/stream/{id}: the id must be 1..%d characters of A-Z, a-z, "
                             "0-9, '.', '_' and '-'",
                             STREAM_ID_MAX);
    if (S->capi == NULL)
        return reply_refused(S, r, c, MHD_HTTP_UNPROCESSABLE_CONTENT, NULL,
                             "POST /v1/stream is off: %s", S->capi_error);
    rl_info info;
    rl_model_info(S->capi, &info);
    if (!info.causal)
        return reply_refused(S, r, c, MHD_HTTP_UNPROCESSABLE_CONTENT, NULL,
                             "POST /v1/stream: the model cannot stream: %s", info.not_causal);
    perr e = {{0}, 0};
    job *j = r->body ? parse_chunk(S, r->body, r->len) : NULL;
    if (j == NULL) j = parse_job(S, R_STREAM, r->body ? r->body : "", r->len, &e);
    free(r->body);
    r->body = NULL;
    if (j == NULL) return reply_refused(S, r, c, (unsigned)e.status, NULL, "%s", e.msg);

    /* the slot: streams idle past --stream-timeout are closed first (their sessions freed below,
     * outside the lock), keeping their ids to tell their next chunk */
    int cap = S->o.max_streams, expired_n = 0;
    rl_session **expired = calloc((size_t)cap, sizeof *expired);
    stream_slot *slot = NULL, *spare = NULL;
    unsigned status = 0;
    double now = now_s();
    pthread_mutex_lock(&S->smu);
    for (int i = 0; expired && i < cap; i++) {
        stream_slot *q = &S->streams[i];
        if (q->session && !q->busy && now - q->last > S->o.stream_timeout_s) {
            expired[expired_n++] = q->session;
            q->session = NULL;
            q->expired = true;
        }
    }
    for (int i = 0; i < cap && slot == NULL; i++)
        if (S->streams[i].id[0] && strcmp(S->streams[i].id, id) == 0) slot = &S->streams[i];
    if (slot && slot->expired) {
        memset(slot, 0, sizeof *slot);
        status = MHD_HTTP_GONE;
    } else if (slot && slot->busy) {
        status = MHD_HTTP_CONFLICT;
    } else if (slot == NULL) {
        for (int i = 0; i < cap && spare == NULL; i++)
            if (S->streams[i].id[0] == '\0') spare = &S->streams[i];
        for (int i = 0; i < cap && spare == NULL; i++)
            if (S->streams[i].expired) spare = &S->streams[i];
        if (spare == NULL) {
            status = MHD_HTTP_SERVICE_UNAVAILABLE;
        } else {
            memset(spare, 0, sizeof *spare);
            memcpy(spare->id, id, idn + 1);
            slot = spare;
        }
    }
    if (status == 0) slot->busy = true;
    rl_session *session = status == 0 ? slot->session : NULL;
    int64_t before = status == 0 ? slot->frames : 0;
    pthread_mutex_unlock(&S->smu);
    for (int i = 0; i < expired_n; i++)
        rl_session_free(expired[i]);
    free(expired);
    if (status != 0) {
        job_free(j);
        if (status == MHD_HTTP_GONE)
            return reply_refused(S, r, c, status, NULL,
                                 "stream '%s' was idle for more than %g s (--stream-timeout) and "
                                 "was closed; a chunk sent to it again starts a new stream",
                                 id, S->o.stream_timeout_s);
        if (status == MHD_HTTP_CONFLICT)
            return reply_refused(S, r, c, status, NULL,
                                 "stream '%s': its previous chunk is still going through (send a "
                                 "stream's chunks one after the other)",
                                 id);
        return reply_refused(S, r, c, status, NULL,
                             "too many streams (%d open; --max-streams): end one with "
                             "{\"end\": true} or wait for --stream-timeout",
                             cap);
    }

    stream_work *w = malloc(sizeof *w);
    if (w == NULL) {
        pthread_mutex_lock(&S->smu);
        slot->busy = false;
        if (slot->session == NULL) memset(slot, 0, sizeof *slot);
        pthread_mutex_unlock(&S->smu);
        job_free(j);
        return reply_refused(S, r, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "out of memory");
    }
    *w = (stream_work){.S = S, .j = j, .slot = slot, .session = session, .before = before};
    memcpy(w->id, id, idn + 1);
    j->kind = JOB_STREAM;
    j->frames = 0; /* not in the model queue's count (on_completed subtracts it) */
    j->conn = c;
    r->job = j;
    not_incoming(S, r);
    atomic_fetch_add(&S->stream_workers, 1);
    w->chunk = (rl_batch){
        .T = j->T[0], .B = 1, .F = S->sparse ? 1 : S->in_dim, .x = j->x, .classes = j->xi};
    /* suspended before the chunk is handed on: it may resume the connection at once */
    MHD_suspend_connection(c);
    if (session && S->o.stream_batch > 1)
        stream_enqueue(S, w);
    else
        stream_dispatch(S, stream_main, w);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    server *S = cls;
    request *r = *con_cls;
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r == NULL) return MHD_NO;
        *con_cls = r;
        atomic_fetch_add(&S->requests, 1);
        r->t0 = now_s();
        conn_mark(S, c, true);
        return begin_request(S, c, r, url, method);
    }
    if (r->job != NULL) { /* resumed by the model thread: the answer is ready */
        job *j = r->job;
        pthread_mutex_lock(&S->mu);
        bool done = j->done;
        pthread_mutex_unlock(&S->mu);
        if (!done) return MHD_YES;
        if (j->error) return reply_error(c, (unsigned)j->status, NULL, "%s", j->error);
        if (j->kind == JOB_STREAM) {
            char *text = j->text;
            j->text = NULL;
            return reply_text(c, MHD_HTTP_OK, text, j->text_len, NULL);
        }
        if (j->kind == JOB_RELOAD) return reply_json(c, MHD_HTTP_OK, json_incref(j->extra), NULL);
        if (j->kind == JOB_FORWARD) return reply_forward(S, c, j);
        json_t *doc = decode_answer(j);
        if (doc == NULL)
            return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL,
                               "out of memory writing the answer");
        return reply_json(c, MHD_HTTP_OK, doc, NULL);
    }
    if (*upload_size != 0) {
        if (now_s() - r->t0 > S->o.timeout_s) return MHD_NO; /* a client trickling its body */
        take_body(S, r, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->too_large)
        return reply_refused(S, r, c, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                             "the body is larger than %zu bytes (--max-body)", S->o.max_body);
    if (r->route == R_STREAM) return answer_stream(S, r, c, url);
    perr e = {{0}, 0};
    job *j;
    if (r->route == R_RELOAD) {
        j = calloc(1, sizeof *j);
        if (j == NULL)
            return reply_refused(S, r, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "out of memory");
        j->kind = JOB_RELOAD;
    } else {
        j = parse_job(S, r->route, r->body ? r->body : "", r->len, &e);
        if (j == NULL) return reply_refused(S, r, c, (unsigned)e.status, NULL, "%s", e.msg);
    }
    free(r->body);
    r->body = NULL;
    if (!queue_reserve(S, j->frames, &e)) {
        job_free(j);
        return reply_refused(S, r, c, (unsigned)e.status, NULL, "%s", e.msg);
    }
    j->conn = c;
    r->job = j;
    /* suspended before it is queued: the model thread may resume it at once */
    MHD_suspend_connection(c);
    queue_push(S, j, r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *S = cls;
    /* libmicrohttpd's own timeout (no progress for --timeout seconds) ends an answer too */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && ci) reset_on_close(ci->connect_fd);
    conn_mark(S, c, false);
    request *r = *con_cls;
    if (r == NULL) return;
    not_incoming(S, r);
    if (r->job) { /* queue_reserve's frames */
        pthread_mutex_lock(&S->mu);
        S->queued_frames -= r->job->frames;
        pthread_mutex_unlock(&S->mu);
    }
    job_free(r->job);
    free(r->body);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&S->requests, 1);
}

/* An error answer {"error": msg} written straight to a socket that libmicrohttpd does not (or
 * not yet) read, with "Connection: close": the caller ends the connection. A socket whose send
 * buffer cannot take these few hundred bytes at once gets nothing. */
static void raw_error(int fd, int status, const char *reason, const char *msg) {
    json_t *doc = json_pack("{s:s}", "error", msg);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (body == NULL) return;
    char head[200];
    int nh = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: " JSON_TYPE
                      "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      status, reason, strlen(body) + 1);
    if (send(fd, head, (size_t)nh, MSG_NOSIGNAL | MSG_DONTWAIT) == nh &&
        send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)strlen(body))
        (void)send(fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
}

/* Connections beyond --max-connections get 503 for their requests; this many more (idle ones,
 * a monitor's /healthz) are let in, and a connection beyond those is answered at once. */
static int open_limit(const server *S) { return S->o.max_connections + 16 * S->o.threads; }

/* ---- the gate: each new connection's first request head, before libmicrohttpd -------------- */

/* libmicrohttpd answers some malformed requests itself, in HTML, before any callback of ours
 * runs: a request line longer than its buffer (414), headers larger than it (431), a
 * Content-Length that is not a number (400; 0.9.75 also sends its headers twice for a huge one),
 * an HTTP version it does not speak (505). So the listening socket is ours: the gate thread
 * accepts, waits (poll: one slow client holds nobody) until a connection's first request head
 * has arrived, peeks at it without taking it, answers those cases in JSON and ends the
 * connection, and hands every other connection to libmicrohttpd (MHD_add_connection), which
 * reads the request from its start. The later requests of a kept-alive connection have their
 * sizes checked by begin_request (libmicrohttpd's buffer is made larger than these limits), and
 * what the library still answers itself there goes out in JSON (rl_serve_own_answer). The gate
 * keeps its own checks for the first request: its answers name the bad line or value, and it
 * answers before 0.9.75's defects (the headers twice for a huge Content-Length). A connection
 * whose requests are all GET /healthz stays in the gate, which answers them itself. */

typedef struct {
    int fd;
    double t0;
    bool closing; /* answered: its input is read and dropped until it closes, or 1 s */
    struct sockaddr_storage addr;
    socklen_t alen;
} gate_conn;

/* The first `n` bytes of a connection: 0 while its head is incomplete, 1 to hand it over
 * (*head_len: the head's bytes, up to its empty line), or -1 with the answer's status and
 * message. */
static int gate_check(const char *b, size_t n, int *status, const char **reason, char *msg,
                      size_t msgn, size_t *head_len) {
    const char *nl = memchr(b, '\n', n);
    size_t line = nl ? (size_t)(nl - b) : n;
    if (line > GATE_LINE_MAX) {
        *status = 414;
        *reason = "URI Too Long";
        snprintf(msg, msgn, "the request line is longer than %d bytes", GATE_LINE_MAX);
        return -1;
    }
    if (nl == NULL) return 0;
    const char *end = NULL; /* the empty line that ends the head */
    for (const char *p = nl; p != NULL && p + 1 < b + n;
         p = memchr(p + 1, '\n', (size_t)(b + n - p - 1))) {
        if (p[1] == '\n' || (p[1] == '\r' && p + 2 < b + n && p[2] == '\n')) {
            end = p + 1;
            break;
        }
    }
    if (end == NULL) {
        if (n <= GATE_HEAD_MAX) return 0;
        *status = 431;
        *reason = "Request Header Fields Too Large";
        snprintf(msg, msgn, "the request's headers are larger than %d bytes", GATE_HEAD_MAX);
        return -1;
    }
    /* "METHOD PATH HTTP/x.y": a version other than 1.0 and 1.1 */
    const char *sp = memrchr(b, ' ', line);
    if (sp != NULL && (size_t)(b + line - sp) > 6 && strncmp(sp + 1, "HTTP/", 5) == 0) {
        size_t vl = (size_t)(b + line - sp - 1);
        if (vl > 0 && sp[vl] == '\r') vl--;
        if (!(vl == 8 &&
              (strncmp(sp + 1, "HTTP/1.1", 8) == 0 || strncmp(sp + 1, "HTTP/1.0", 8) == 0))) {
            *status = 505;
            *reason = "HTTP Version Not Supported";
            snprintf(msg, msgn, "HTTP/1.0 and HTTP/1.1 only, got %.*s", (int)(vl < 40 ? vl : 40),
                     sp + 1);
            return -1;
        }
    }
    /* every header line "name: value" (or a folded one's continuation, which libmicrohttpd
     * takes); Content-Length: decimal digits that fit an int64, the same value if given twice */
    long long seen = -1;
    for (const char *h = nl + 1; h < end;
         h = (const char *)memchr(h, '\n', (size_t)(end - h)) + 1) {
        static const char name[] = "content-length:";
        const char *eol = memchr(h, '\n', (size_t)(end - h));
        size_t len = (size_t)(eol - h) - (eol > h && eol[-1] == '\r');
        if (len > 0 && h[0] != ' ' && h[0] != '\t' && memchr(h, ':', len) == NULL) {
            *status = 400;
            *reason = "Bad Request";
            snprintf(msg, msgn, "a header line without a colon: '%.*s'", (int)(len < 40 ? len : 40),
                     h);
            return -1;
        }
        if ((size_t)(eol - h) < sizeof name - 1 || strncasecmp(h, name, sizeof name - 1) != 0)
            continue;
        const char *v = h + sizeof name - 1, *ve = eol;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        long long x = 0;
        bool ok = ve > v && ve - v <= 18;
        for (const char *q = v; ok && q < ve; q++) {
            ok = *q >= '0' && *q <= '9';
            x = x * 10 + (*q - '0');
        }
        if (!ok || (seen >= 0 && x != seen)) {
            *status = 400;
            *reason = "Bad Request";
            snprintf(msg, msgn, "bad Content-Length '%.*s' (decimal digits, at most 18%s)",
                     (int)(ve - v < 40 ? ve - v : 40), v, seen >= 0 ? ", the same each time" : "");
            return -1;
        }
        seen = x;
    }
    *head_len = (size_t)(end - b) + (*end == '\r' ? 2 : 1);
    return 1;
}

/* Whether the head b[0, n) (checked by gate_check) is a GET or HEAD of /healthz without a body,
 * which the gate answers itself; *head_only: HEAD; *closing: the client asked for the connection
 * to end (HTTP/1.0 without keep-alive, or "Connection: close"). */
static bool gate_health(const char *b, size_t n, bool *head_only, bool *closing) {
    static const char get[] = "GET /healthz", head[] = "HEAD /healthz";
    *head_only = n > sizeof head && strncmp(b, head, sizeof head - 1) == 0;
    size_t k = *head_only ? sizeof head - 1 : sizeof get - 1;
    if (!*head_only && !(n > k && strncmp(b, get, k) == 0)) return false;
    if (b[k] != ' ' && b[k] != '?') return false;
    const char *nl = memchr(b, '\n', n);
    size_t line = (size_t)(nl - b);
    if (line > 0 && b[line - 1] == '\r') line--;
    if (line < k + 9 || strncmp(b + line - 9, " HTTP/1.", 8) != 0) return false;
    bool keep_alive = b[line - 1] == '1', asked_close = false;
    for (const char *h = nl + 1; h < b + n;
         h = (const char *)memchr(h, '\n', (size_t)(b + n - h)) + 1) {
        const char *eol = memchr(h, '\n', (size_t)(b + n - h));
        size_t hl = (size_t)(eol - h);
        if ((hl >= 15 && strncasecmp(h, "content-length:", 15) == 0 &&
             strspn(h + 15, " \t0") < hl - 15 - (eol[-1] == '\r')) ||
            (hl >= 18 && strncasecmp(h, "transfer-encoding:", 18) == 0))
            return false; /* a body: libmicrohttpd reads it */
        if (hl >= 11 && strncasecmp(h, "connection:", 11) == 0) {
            for (const char *q = h + 11; q + 5 <= eol; q++) {
                if (strncasecmp(q, "close", 5) == 0) asked_close = true;
                if (q + 10 <= eol && strncasecmp(q, "keep-alive", 10) == 0) keep_alive = true;
            }
        }
    }
    *closing = asked_close || !keep_alive;
    return true;
}

/* Answers a /healthz straight on the socket: the gate thread takes no lock and waits on
 * nothing, so a monitor is answered however busy the model and libmicrohttpd's threads are.
 * False when the answer could not be sent whole (the client is not reading its answers). */
static bool gate_answer_health(server *S, int fd, bool head_only, bool closing) {
    unsigned status;
    json_t *doc = health_doc(S, &status);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (body == NULL) return false;
    char text[600];
    int nh = snprintf(
        text, sizeof text,
        "HTTP/1.1 %u %s\r\nContent-Type: " JSON_TYPE "\r\nContent-Length: %zu\r\n%s\r\n%s%s",
        status, status == MHD_HTTP_OK ? "OK" : "Service Unavailable", strlen(body) + 1,
        closing ? "Connection: close\r\n" : "", head_only ? "" : body, head_only ? "" : "\n");
    free(body);
    if (nh <= 0 || nh >= (int)sizeof text) return false;
    return send(fd, text, (size_t)nh, MSG_NOSIGNAL | MSG_DONTWAIT) == nh;
}

int rl_serve_check_head(const char *b, size_t n, char *msg, size_t msgn) {
    int status;
    const char *reason;
    size_t head_len;
    int v = gate_check(b, n, &status, &reason, msg, msgn, &head_len);
    bool head_only, closing;
    if (v > 0 && gate_health(b, head_len, &head_only, &closing)) return 2;
    return v < 0 ? status : v;
}

int rl_serve_check_body(const rl_serve_model *m, const char *body, size_t n, int64_t *frames,
                        char *msg, size_t msgn) {
    server S = {.in_dim = m->in_dim, .sparse = m->sparse, .images = m->images};
    S.o.lm_file = m->lm_file;
    S.o.max_frames = m->max_frames;
    S.o.max_beam = m->max_beam;
    perr e = {{0}, 0};
    job *j = parse_job(&S, m->decode ? R_DECODE : R_FORWARD, body, n, &e);
    if (j == NULL) {
        snprintf(msg, msgn, "%s", e.msg);
        return e.status;
    }
    *frames = j->frames;
    job_free(j);
    return 200;
}

static void *gate_main(void *arg) {
    server *S = arg;
    gate_conn *g = calloc(GATE_MAX, sizeof *g);
    struct pollfd *pf = calloc(GATE_MAX + 2, sizeof *pf);
    char *buf = malloc(GATE_HEAD_MAX + 1);
    int n = 0;
    bool stop = g == NULL || pf == NULL || buf == NULL;
    if (stop) logf_("the gate thread has no memory: no connection is taken");
    /* all that is waiting is taken at each wake-up, until accept says there is no more */
    fcntl(S->listen_fd, F_SETFL, fcntl(S->listen_fd, F_GETFL) | O_NONBLOCK);
    while (!stop) {
        pf[0] = (struct pollfd){.fd = S->listen_fd, .events = n < GATE_MAX ? POLLIN : 0};
        pf[1] = (struct pollfd){.fd = S->gate_pipe[0], .events = POLLIN};
        for (int i = 0; i < n; i++)
            pf[i + 2] = (struct pollfd){.fd = g[i].fd, .events = POLLIN};
        int ready = poll(pf, (nfds_t)n + 2, 100);
        if (ready < 0 && errno != EINTR) break;
        if (pf[1].revents) break;
        double now = now_s();
        for (int i = 0; i < n; i++) {
            gate_conn *k = &g[i];
            bool done = false;
            if (k->closing) {
                ssize_t r = pf[i + 2].revents ? recv(k->fd, buf, GATE_HEAD_MAX, MSG_DONTWAIT) : -1;
                done = r == 0 ||
                       (r < 0 && errno != EAGAIN && errno != EINTR && pf[i + 2].revents) ||
                       now - k->t0 > 1.0;
                if (done) close(k->fd);
            } else if (pf[i + 2].revents) {
                ssize_t r = recv(k->fd, buf, GATE_HEAD_MAX + 1, MSG_PEEK | MSG_DONTWAIT);
                if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR))) {
                    close(k->fd); /* closed, or reset, before a request */
                    done = true;
                } else if (r > 0) {
                    int status;
                    const char *reason;
                    char msg[200];
                    size_t hl = 0;
                    bool head_only, end_it;
                    int v = gate_check(buf, (size_t)r, &status, &reason, msg, sizeof msg, &hl);
                    if (v < 0) {
                        raw_error(k->fd, status, reason, msg);
                        shutdown(k->fd, SHUT_WR);
                        k->closing = true;
                        k->t0 = now;
                    } else if (v > 0 && gate_health(buf, hl, &head_only, &end_it)) {
                        /* the head is taken (a request pipelined behind it stays for the next
                         * turn); the connection stays here until a request of another kind */
                        bool sent = recv(k->fd, buf, hl, MSG_DONTWAIT) == (ssize_t)hl &&
                                    gate_answer_health(S, k->fd, head_only, end_it);
                        if (!sent || end_it) {
                            shutdown(k->fd, SHUT_WR);
                            k->closing = true;
                        }
                        k->t0 = now;
                    } else if (v > 0) {
                        /* libmicrohttpd closes the socket if it cannot take it */
                        if (MHD_add_connection(S->daemon, k->fd, (struct sockaddr *)&k->addr,
                                               k->alen) != MHD_YES)
                            logf_("libmicrohttpd did not take a connection: %s", strerror(errno));
                        done = true;
                    }
                }
            }
            if (!done && !k->closing && now - k->t0 > S->o.timeout_s) {
                close(k->fd); /* no request head within --timeout */
                done = true;
            }
            if (done) {
                atomic_fetch_sub(&S->connections, 1);
                g[i] = g[n - 1];
                pf[i + 2] = pf[n + 1];
                n--;
                i--;
            }
        }
        while (n < GATE_MAX && (pf[0].revents & POLLIN)) {
            gate_conn *k = &g[n];
            k->alen = sizeof k->addr;
            int fd = accept4(S->listen_fd, (struct sockaddr *)&k->addr, &k->alen,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) break;
            atomic_fetch_add(&S->started, 1);
            /* held here, a connection counts as open (/healthz, --max-connections) */
            int open = atomic_fetch_add(&S->connections, 1);
            k->fd = fd;
            k->t0 = now_s();
            k->closing = false;
            if (open >= open_limit(S)) {
                char msg[120];
                snprintf(msg, sizeof msg,
                         "too many open connections (more than %d; --max-connections %d)",
                         open_limit(S), S->o.max_connections);
                raw_error(fd, 503, "Service Unavailable", msg);
                shutdown(fd, SHUT_WR);
                k->closing = true;
            }
            n++;
        }
    }
    for (int i = 0; i < n; i++) {
        close(g[i].fd);
        atomic_fetch_sub(&S->connections, 1);
    }
    free(g);
    free(pf);
    free(buf);
    return NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    server *S = cls;
    atomic_fetch_add(&S->connections, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&S->started, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn *k = ci ? calloc(1, sizeof *k) : NULL;
        if (k == NULL) return; /* not watched: libmicrohttpd's idle timeout still applies */
        k->S = S;
        k->fd = ci->connect_fd;
        k->since = now_s();
        pthread_mutex_lock(&S->cmu);
        k->next = S->conns;
        if (S->conns) S->conns->prev = k;
        S->conns = k;
        pthread_mutex_unlock(&S->cmu);
        *socket_context = k;
        return;
    }
    /* closed: libmicrohttpd closes the socket after this call, so the watchdog, which shuts
     * sockets down under cmu, never touches a descriptor that was closed (and maybe reused) */
    conn *k = *socket_context;
    if (k == NULL) return;
    pthread_mutex_lock(&S->cmu);
    if (k->prev) k->prev->next = k->next;
    if (k->next) k->next->prev = k->prev;
    if (S->conns == k) S->conns = k->next;
    pthread_mutex_unlock(&S->cmu);
    free(k);
    *socket_context = NULL;
}

/* The request on c has arrived up to its headers (true), or has been answered (false). */
static void conn_mark(server *S, struct MHD_Connection *c, bool in_request) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn *k = ci ? ci->socket_context : NULL;
    if (k == NULL) return;
    pthread_mutex_lock(&S->cmu);
    k->in_request = in_request;
    k->since = now_s();
    k->answer_since = 0;
    pthread_mutex_unlock(&S->cmu);
}

static conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* c's answer of `bytes` (0: streamed, size unknown) has been queued: from now on the client has
 * --timeout seconds, and one more for each MIN_READ_RATE bytes, to read it all. */
static void conn_answering(struct MHD_Connection *c, uint64_t bytes) {
    conn *k = conn_of(c);
    if (k == NULL) return;
    pthread_mutex_lock(&k->S->cmu);
    k->answer_since = now_s();
    k->answer_bytes = bytes;
    pthread_mutex_unlock(&k->S->cmu);
}

/* A streamed answer has been made up to `bytes`: libmicrohttpd asks for more only as the client
 * reads, so its deadline moves on with it. */
static void conn_answer_made(struct MHD_Connection *c, uint64_t bytes) {
    conn *k = conn_of(c);
    if (k == NULL) return;
    pthread_mutex_lock(&k->S->cmu);
    if (bytes > k->answer_bytes) k->answer_bytes = bytes;
    pthread_mutex_unlock(&k->S->cmu);
}

/* Shuts down the connections whose request has not got its headers through within --timeout
 * seconds of the connection opening or of the last answer, whose client reads its answer slower
 * than --timeout seconds plus one a MIN_READ_RATE bytes allow (libmicrohttpd's own timeout
 * restarts at every byte sent, so a reader taking a byte now and then held its connection and
 * answer for ever); libmicrohttpd then closes them. */
static void close_slow_connections(server *S) {
    double now = now_s();
    pthread_mutex_lock(&S->cmu);
    for (conn *k = S->conns; k; k = k->next) {
        if (k->fd < 0) continue;
        bool idle = !k->in_request && now - k->since > S->o.timeout_s;
        bool slow_reader =
            k->answer_since > 0 &&
            now - k->answer_since > S->o.timeout_s + (double)k->answer_bytes / MIN_READ_RATE;
        if (slow_reader) reset_on_close(k->fd);
        if (idle || slow_reader) {
            shutdown(k->fd, SHUT_RDWR);
            k->fd = -1;
        }
    }
    pthread_mutex_unlock(&S->cmu);
}

/* ---- libmicrohttpd's own error answers, in JSON ---------------------------------------------
 *
 * libmicrohttpd 0.9.75 answers some malformed requests itself, with a static HTML body and before
 * any callback of ours runs for them: a header or trailer line without a colon, a malformed
 * chunked body or too large a chunk, a bad Content-Length, an HTTP version it does not speak, an
 * HTTP/1.1 request without Host, a head larger than its buffer. The gate answers these in a
 * connection's first request before the library sees it; a later request of a kept-alive
 * connection goes to the library alone. Just before queuing such an answer the library logs
 * "Error processing request (HTTP response code is %u ('%s'))" with the body's address, which
 * on_mhd_log notes here (a handful of the library's static strings). The library sends an
 * answer's head and body with one sendmsg, which the rnnlua executable defines (lua/rnnlua.c)
 * to ask rl_serve_own_answer first: a message whose body is one of those strings goes out as a
 * JSON answer of the same status instead, and the library closes the connection as it would have
 * after its own. The connection is known exactly (the socket being written), whichever of a
 * thread's connections the log message was about. */
#define MHD_BODIES 32
static _Atomic(const char *) mhd_bodies[MHD_BODIES];

static void note_mhd_body(const char *body) {
    if (body == NULL || body[0] != '<') return;
    for (int i = 0; i < MHD_BODIES; i++) {
        const char *cur = atomic_load_explicit(&mhd_bodies[i], memory_order_acquire);
        if (cur == body) return;
        /* slots fill in order; a slot taken meanwhile by another body moves us on */
        if (cur == NULL &&
            (atomic_compare_exchange_strong(&mhd_bodies[i], &cur, body) || cur == body))
            return;
    }
}

static bool is_mhd_body(const void *p) {
    for (int i = 0; i < MHD_BODIES; i++) {
        const char *cur = atomic_load_explicit(&mhd_bodies[i], memory_order_acquire);
        if (cur == NULL) return false;
        if ((const void *)cur == p) return true;
    }
    return false;
}

/* What a body of the library's says, in the words of the gate's own answers; *status is the
 * library's, changed where the gate answers the same request otherwise (413 for a Content-Length
 * over 64 bits, which the gate answers 400 as every other bad Content-Length). */
static const char *mhd_answer_text(const char *html, size_t n, int *status) {
    static const struct {
        const char *says, *text;
    } known[] = {
        {"chunked encoding was syntactically", "malformed chunked request body: a chunk size "
                                               "line, or the line end after a chunk's data"},
        {"chunk size used", "a chunk size of the chunked request body is too large"},
        {"too large value for <b>Content-Length",
         "bad Content-Length (decimal digits, at most 18): too large"},
        {"wrong value for <b>Content-Length", "bad Content-Length (decimal digits, at most 18)"},
        {"&quot;Host:&quot;", "an HTTP/1.1 request without a Host header"},
        {"request was syntactically incorrect",
         "malformed request: a header or trailer line without a colon, or a bad HTTP version"},
        {"version is too old", "HTTP version not supported (1.0 and 1.1 are)"},
        {"version is not supported", "HTTP version not supported (1.0 and 1.1 are)"},
        {"Internal server error", "internal error of the HTTP library"},
    };
    if (memmem(html, n, "header was too big", 18) != NULL)
        return *status == 414 ? "request line is longer than the server's buffer"
                              : "request headers are larger than the server's buffer";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (memmem(html, n, known[i].says, strlen(known[i].says)) == NULL) continue;
        if (strstr(known[i].text, "Content-Length") != NULL) *status = 400;
        return known[i].text;
    }
    return "malformed request (answered by the HTTP library)";
}

bool rl_serve_own_answer(int fd, const struct msghdr *m, ssize_t *ret) {
    if (m == NULL || m->msg_iovlen != 2 || m->msg_iov == NULL ||
        !is_mhd_body(m->msg_iov[1].iov_base))
        return false;
    const char *h = m->msg_iov[0].iov_base;
    size_t hl = m->msg_iov[0].iov_len, bl = m->msg_iov[1].iov_len;
    int status = 400;
    if (hl >= 12 && memcmp(h, "HTTP/1.", 7) == 0 && h[8] == ' ' && h[9] >= '1' && h[9] <= '5' &&
        h[10] >= '0' && h[10] <= '9' && h[11] >= '0' && h[11] <= '9')
        status = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
    const char *text = mhd_answer_text(m->msg_iov[1].iov_base, bl, &status);
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    json_t *doc = json_pack("{s:s}", "error", text);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    char *reply = NULL;
    int n = body ? asprintf(&reply,
                            "HTTP/1.1 %d %s\r\nContent-Type: " JSON_TYPE
                            "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                            status, reason && reason[0] ? reason : "Error", strlen(body) + 1, body)
                 : -1;
    free(body);
    if (n > 0 && send(fd, reply, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n) {
        /* what the client sent after the bad part is read and dropped, so that the library's
         * close does not reset the connection before the client has read the answer */
        char buf[4096];
        for (int i = 0; i < 256 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0; i++)
            ;
        *ret = (ssize_t)(hl + bl); /* the library's answer counts as sent */
    } else {
        shutdown(fd, SHUT_RDWR); /* no room for the answer, or no memory: the library closes */
        errno = EPIPE;
        *ret = -1;
    }
    free(reply);
    return true;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static const char error_answer[] = "Error processing request (HTTP response code is %u ('%s'))";
    if (strncmp(fmt, error_answer, sizeof error_answer - 1) == 0) {
        va_list aq;
        va_copy(aq, ap);
        (void)va_arg(aq, unsigned);
        note_mhd_body(va_arg(aq, const char *));
        va_end(aq);
    }
    char *msg = vformat(fmt, ap);
    if (msg == NULL) return;
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    logf_("libmicrohttpd: %s", msg);
    free(msg);
}

/* ---- the model (model thread only) --------------------------------------------------------- */

/* A Lua value as JSON: a table with a sequence part as a list, any other as an object (keys
 * as strings); non-finite numbers and other types as null. */
static json_t *lua_to_json(lua_State *L, int idx, int depth) {
    idx = lua_absindex(L, idx);
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: return json_boolean(lua_toboolean(L, idx));
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) return json_integer((json_int_t)lua_tointeger(L, idx));
        return isfinite(lua_tonumber(L, idx)) ? json_real(lua_tonumber(L, idx)) : json_null();
    case LUA_TSTRING: {
        size_t len;
        const char *str = lua_tolstring(L, idx, &len);
        json_t *v = json_stringn(str, len);
        return v ? v : json_string("(not UTF-8)");
    }
    case LUA_TTABLE: {
        if (depth > 32 || !lua_checkstack(L, 4)) return json_null();
        lua_Unsigned n = lua_rawlen(L, idx);
        if (n > 0) {
            json_t *a = json_array();
            for (lua_Unsigned i = 1; i <= n && a; i++) {
                lua_rawgeti(L, idx, (lua_Integer)i);
                json_array_append_new(a, lua_to_json(L, -1, depth + 1));
                lua_pop(L, 1);
            }
            return a;
        }
        json_t *o = json_object();
        lua_pushnil(L);
        while (o && lua_next(L, idx)) {
            lua_pushvalue(L, -2);
            const char *k = lua_tostring(L, -1); /* converts the copy, not the key lua_next uses */
            if (k) json_object_set_new(o, k, lua_to_json(L, -2, depth + 1));
            lua_pop(L, 2);
        }
        return o;
    }
    default: return json_null();
    }
}

/* The --lua file (the user's code, e.g. the model's Lua layer classes: a checkpoint holds only
 * their names) under pcall, in the model thread's state: LUA_OK, or an error message. */
static int run_lua_file(server *S) {
    int st = luaL_loadfilex(S->L, S->o.lua_file, "t"); /* source only, as recipes */
    return st == LUA_OK ? lua_pcall(S->L, 0, 0, 0) : st;
}

/* rnnlua.serve.load(path, layer, max_values, lm, precision) under pcall: the model on the stack
 * (LUA_OK), or an error message. */
static int load_model(server *S) {
    lua_State *L = S->L;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "rnnlua.serve");
    int st = lua_pcall(L, 1, 1, 0);
    if (st != LUA_OK) return st;
    lua_getfield(L, -1, "load");
    lua_remove(L, -2);
    lua_pushstring(L, S->o.model_path);
    lua_pushstring(L, S->o.layer);
    lua_pushinteger(L, (lua_Integer)(S->o.max_body / 2));
    if (S->o.lm_file) {
        lua_createtable(L, 0, 2);
        lua_pushstring(L, S->o.lm_file);
        lua_setfield(L, -2, "file");
        if (S->o.lm_word_boundary) {
            lua_pushstring(L, S->o.lm_word_boundary);
            lua_setfield(L, -2, "word_boundary");
        }
    } else {
        lua_pushnil(L);
    }
    lua_pushstring(L, S->o.precision);
    st = lua_pcall(L, 5, 1, 0);
    /* rnnlua.forward's load_model names its caller, "rnnlua serve: ", which the log line and
     * the reload answer already say ("rnnlua: serve: rnnlua serve: no layer 'x' ...") */
    static const char who[] = "rnnlua serve: ";
    const char *msg = st != LUA_OK ? lua_tostring(L, -1) : NULL;
    if (msg && strncmp(msg, who, sizeof who - 1) == 0) {
        lua_pushstring(L, msg + sizeof who - 1);
        lua_replace(L, -2);
    }
    return st;
}

static int64_t int_field(lua_State *L, int idx, const char *k) {
    lua_getfield(L, idx, k);
    int64_t v = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

static bool bool_field(lua_State *L, int idx, const char *k) {
    lua_getfield(L, idx, k);
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* m:info() of the model at idx as JSON text (malloc'd), and its epoch. */
static char *model_info(lua_State *L, int idx, long long *epoch) {
    idx = lua_absindex(L, idx);
    lua_getfield(L, idx, "info");
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        return NULL;
    }
    *epoch = (long long)int_field(L, -1, "epoch");
    json_t *doc = lua_to_json(L, -1, 0);
    lua_pop(L, 1);
    char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(doc);
    return text;
}

/* Takes the model on top of the stack as the served one (its interface already checked). */
static bool install_model(server *S) {
    lua_State *L = S->L;
    long long epoch = 0;
    char *info = model_info(L, -1, &epoch);
    if (info == NULL) {
        lua_pop(L, 1);
        return false;
    }
    lua_getfield(L, -1, "decode_error");
    char *decode_error = lua_isstring(L, -1) ? strdup(lua_tostring(L, -1)) : NULL;
    lua_pop(L, 1);
    int decode_status = (int)int_field(L, -1, "decode_status");
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (S->model_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, S->model_ref);
    S->model_ref = ref;
    pthread_mutex_lock(&S->mu);
    free(S->info_json);
    S->info_json = info;
    S->epoch = epoch;
    free(S->decode_error);
    S->decode_error = decode_error;
    S->decode_status = decode_status;
    pthread_mutex_unlock(&S->mu);
    return true;
}

/* "input dim 9 (class indices), output dim 2 (sequences)" into buf (128 bytes). */
static void interface_text(char *buf, int64_t in_dim, bool sparse, bool images, int64_t out_dim,
                           bool out_images) {
    snprintf(buf, 128, "input dim %lld (%s), output dim %lld (%s)", (long long)in_dim,
             sparse   ? "class indices"
             : images ? "images"
                      : "frames",
             (long long)out_dim, out_images ? "images" : "sequences");
}

/* Loads the model again from its path; on any failure the old one stays. Returns the answer of
 * POST /v1/reload; *status is its HTTP status. */
static json_t *reload(server *S, int *status) {
    lua_State *L = S->L;
    long long old_epoch = S->epoch;
    char *why = NULL;
    if (load_model(S) != LUA_OK) {
        why = format("%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)");
        lua_pop(L, 1);
    } else if (int_field(L, -1, "in_dim") != S->in_dim ||
               int_field(L, -1, "out_dim") != S->out_dim ||
               bool_field(L, -1, "sparse") != S->sparse ||
               bool_field(L, -1, "images") != S->images ||
               bool_field(L, -1, "out_images") != S->out_images) {
        /* the kinds too: a sparse input of the same dim would read "(9, 2) differs from (9, 2)" */
        char now[128], was[128];
        interface_text(now, int_field(L, -1, "in_dim"), bool_field(L, -1, "sparse"),
                       bool_field(L, -1, "images"), int_field(L, -1, "out_dim"),
                       bool_field(L, -1, "out_images"));
        interface_text(was, S->in_dim, S->sparse, S->images, S->out_dim, S->out_images);
        why = format("its interface (%s) differs from the served one (%s); restart the server to "
                     "change it",
                     now, was);
        lua_pop(L, 1);
    } else if (!install_model(S)) {
        why = format("its description could not be read");
    }
    if (why) {
        logf_("reload of %s rejected, still serving epoch %lld: %s", S->o.model_path, old_epoch,
              why);
        json_t *doc =
            json_pack("{s:s+}", "error", "reload rejected, still serving the old model: ", why);
        free(why);
        *status = MHD_HTTP_CONFLICT;
        return doc;
    }
    logf_("reloaded %s: epoch %lld (was %lld)", S->o.model_path, (long long)S->epoch, old_epoch);
    *status = MHD_HTTP_OK;
    return json_pack("{s:b,s:s,s:I,s:I}", "reloaded", 1, "model", S->o.model_path, "epoch",
                     (json_int_t)S->epoch, "previous_epoch", (json_int_t)old_epoch);
}

/* Marks j done and resumes its connection; the model thread must not touch j afterwards. */
static void complete(server *S, job *j) {
    struct MHD_Connection *c = j->conn;
    pthread_mutex_lock(&S->mu);
    j->done = true;
    pthread_mutex_unlock(&S->mu);
    MHD_resume_connection(c);
}

/* Pushes a new float32/int32 CPU tensor of the given shape, zero-filled. */
static rl_tensor *push_zeros(lua_State *L, rl_dtype dt, int ndim, const int64_t *shape) {
    rl_tensor *t = rl_lua_push_tensor(L);
    if (rl_tensor_empty(t, dt, RL_DEVICE_CPU, ndim, shape) != RL_OK) return NULL;
    memset(rl_tensor_data(t), 0, (size_t)rl_tensor_numel(t) * rl_dtype_size(dt));
    return t;
}

/* Sequences s0 .. s0 + ns - 1 of one job: what the model thread puts into a model batch (whole
 * jobs; the pieces of a request too large for one batch; a sequence run alone). */
typedef struct {
    job *j;
    int64_t s0, ns;
} part;

/* Pushes m[method], m and the padded batch of parts p[0..n): x (T, B, F), (T, B) class indices
 * or (H, W, B, F), and its lengths (B) or sizes (B, 2). Returns NULL or a message (stack as it
 * was). */
static char *push_batch(server *S, const part *p, int n, const char *method) {
    lua_State *L = S->L;
    int top = lua_gettop(L);
    int64_t B = 0, T = 0, H = 0, W = 0, F = S->in_dim;
    for (int i = 0; i < n; i++)
        for (int64_t s = p[i].s0; s < p[i].s0 + p[i].ns; s++, B++) {
            T = p[i].j->T[s] > T ? p[i].j->T[s] : T;
            H = p[i].j->H[s] > H ? p[i].j->H[s] : H;
            W = p[i].j->W[s] > W ? p[i].j->W[s] : W;
        }
    lua_rawgeti(L, LUA_REGISTRYINDEX, S->model_ref);
    lua_getfield(L, -1, method);
    lua_insert(L, -2);
    rl_tensor *x, *g;
    if (S->images) {
        int64_t xs[4] = {H, W, B, F}, gs[2] = {B, 2};
        x = push_zeros(L, RL_FLOAT32, 4, xs);
        g = x ? push_zeros(L, RL_INT32, 2, gs) : NULL;
    } else {
        int64_t xs[3] = {T, B, F};
        x = push_zeros(L, S->sparse ? RL_INT32 : RL_FLOAT32, S->sparse ? 2 : 3, xs);
        g = x ? push_zeros(L, RL_INT32, 1, &B) : NULL;
    }
    if (g == NULL) {
        lua_settop(L, top);
        return format("cannot allocate a batch of %lld sequences: %s", (long long)B, rl_errmsg());
    }
    float *xf = S->sparse ? NULL : rl_tensor_data(x);
    int32_t *xi = S->sparse ? rl_tensor_data(x) : NULL;
    int32_t *gi = rl_tensor_data(g);
    int64_t b = 0;
    for (int i = 0; i < n; i++) {
        const job *j = p[i].j;
        for (int64_t s = p[i].s0; s < p[i].s0 + p[i].ns; s++, b++) {
            if (S->images) {
                gi[2 * b] = (int32_t)j->H[s];
                gi[2 * b + 1] = (int32_t)j->W[s];
                for (int64_t r = 0; r < j->H[s]; r++)
                    for (int64_t c = 0; c < j->W[s]; c++)
                        memcpy(xf + ((r * W + c) * B + b) * F,
                               j->x + (j->off[s] + r * j->W[s] + c) * F, (size_t)F * sizeof *xf);
                continue;
            }
            gi[b] = (int32_t)j->T[s];
            for (int64_t t = 0; t < j->T[s]; t++) {
                if (xi)
                    xi[t * B + b] = j->xi[j->off[s] + t];
                else
                    memcpy(xf + (t * B + b) * F, j->x + (j->off[s] + t) * F,
                           (size_t)F * sizeof *xf);
            }
        }
    }
    return NULL;
}

/* m[method](m, x, geom, ...) of push_batch with nargs arguments under pcall. Returns NULL, or the
 * message of its error (stack as it was before push_batch) with *raised: the model raised it
 * (a run-time error of the network on this input), not a failure to allocate the batch. */
static char *call_model(server *S, int top, int nargs, int nret, bool *raised) {
    lua_State *L = S->L;
    int st = lua_pcall(L, nargs, nret, 0);
    if (st == LUA_OK) return NULL;
    *raised = st == LUA_ERRRUN;
    char *msg = format("%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "(no message)");
    lua_settop(L, top);
    return msg;
}

/* Runs parts p[0..n) (forward jobs) as one padded batch through m:forward and copies each
 * sequence's rows into its job. Returns NULL, or the message of a failure of the whole batch
 * (*raised: see call_model). */
static char *forward_batch(server *S, const part *p, int n, bool *raised) {
    lua_State *L = S->L;
    int top = lua_gettop(L);
    int64_t B = 0, D = S->out_dim;
    for (int i = 0; i < n; i++)
        B += p[i].ns;
    char *err = push_batch(S, p, n, "forward");
    if (err == NULL) err = call_model(S, top, 3, 2, raised);
    if (err) return err;
    const rl_tensor *out = rl_lua_to_tensor(L, -2), *og = rl_lua_to_tensor(L, -1);
    int ondim = S->out_images ? 4 : 3;
    if (out == NULL || og == NULL || out->dtype != RL_FLOAT32 || out->ndim != ondim ||
        !rl_tensor_is_contiguous(out) || out->shape[ondim - 2] != B || out->shape[ondim - 1] != D ||
        og->ndim != (S->out_images ? 2 : 1) || og->shape[0] != B) {
        lua_settop(L, top);
        return format("rnnlua.serve's forward gave an output of an unexpected shape");
    }
    const float *o = rl_tensor_data(out);
    int64_t OW = S->out_images ? out->shape[1] : 1, b = 0;
    for (int i = 0; i < n; i++) {
        job *j = p[i].j;
        for (int64_t s = p[i].s0; s < p[i].s0 + p[i].ns; s++, b++) {
            int64_t idx[2] = {b, 0};
            int64_t oH = (int64_t)rl_tensor_get(og, idx);
            idx[1] = 1;
            int64_t oW = S->out_images ? (int64_t)rl_tensor_get(og, idx) : 1;
            if (oH < 0 || oH > out->shape[0] || oW < 0 || oW > OW) {
                lua_settop(L, top);
                return format("layer '%s' reports %lld x %lld valid frames in an output of %lld x "
                              "%lld",
                              S->o.layer, (long long)oH, (long long)oW, (long long)out->shape[0],
                              (long long)OW);
            }
            j->oH[s] = oH;
            j->oW[s] = oW;
            j->oT[s] = oH * oW;
            free(j->outs[s]);
            float *dst = j->outs[s] = malloc((size_t)(oH * oW * D + 1) * sizeof *dst);
            if (dst == NULL) {
                job_fail(j, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory for the output");
                continue;
            }
            bool finite = true;
            for (int64_t r = 0; r < oH; r++)
                for (int64_t c = 0; c < oW; c++, dst += D) {
                    memcpy(dst, o + ((r * OW + c) * B + b) * D, (size_t)D * sizeof *dst);
                    for (int64_t d = 0; d < D; d++)
                        finite = finite && isfinite(dst[d]);
                }
            char nm[48];
            if (!finite) /* not JSON, and not a number to hand out */
                job_fail(j, MHD_HTTP_INTERNAL_SERVER_ERROR, "%slayer '%s' gave NaN or Inf",
                         seq_name(j, s, nm), S->o.layer);
        }
    }
    lua_settop(L, top);
    return NULL;
}

/* Runs parts p[0..n) (decode jobs of one beam width and LM setting) through m:decode: one list of
 * labels per sequence, kept in its job's extra. */
static char *decode_batch(server *S, const part *p, int n, bool *raised) {
    lua_State *L = S->L;
    int top = lua_gettop(L);
    char *err = push_batch(S, p, n, "decode");
    if (err) return err;
    lua_pushinteger(L, p[0].j->beam);
    if (p[0].j->lm) {
        lua_createtable(L, 0, 2);
        lua_pushnumber(L, p[0].j->lm_weight);
        lua_setfield(L, -2, "weight");
        lua_pushnumber(L, p[0].j->lm_bonus);
        lua_setfield(L, -2, "bonus");
    } else {
        lua_pushnil(L);
    }
    err = call_model(S, top, 5, 1, raised);
    if (err) return err;
    lua_Integer b = 1;
    for (int i = 0; i < n && !err; i++) {
        job *j = p[i].j;
        if (j->extra == NULL) {
            j->extra = json_array();
            for (int64_t s = 0; s < j->nseq && j->extra; s++)
                if (json_array_append_new(j->extra, json_null()) != 0) {
                    json_decref(j->extra);
                    j->extra = NULL;
                }
        }
        for (int64_t s = p[i].s0; s < p[i].s0 + p[i].ns && !err; s++, b++) {
            lua_rawgeti(L, -1, b);
            json_t *labels = lua_istable(L, -1) ? lua_to_json(L, -1, 0) : NULL;
            lua_pop(L, 1);
            if (labels == NULL || (!json_is_array(labels) && json_object_size(labels) != 0)) {
                json_decref(labels);
                err = format("decoding gave no label list for sequence %lld", (long long)b);
                break;
            }
            if (!json_is_array(labels)) { /* an empty Lua table: no labels */
                json_decref(labels);
                labels = json_array();
            }
            if (j->extra == NULL ||
                json_array_set_new(j->extra, (size_t)s, json_pack("{s:o}", "labels", labels)) != 0)
                job_fail(j, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory for the labels");
        }
    }
    lua_settop(L, top);
    return err;
}

/* ---- the model thread's loop --------------------------------------------------------------- */

/* The padded frames of a batch of jobs a..b (inclusive) */
static int64_t batch_cost(const server *S, int64_t B, int64_t T, int64_t H, int64_t W) {
    return S->images ? B * H * W : B * T;
}

/* Whether jobs a and b can share one decode batch (one beam width, one LM setting). */
static bool same_decode(const job *a, const job *b) {
    return a->beam == b->beam && a->lm == b->lm &&
           (!a->lm || (a->lm_weight == b->lm_weight && a->lm_bonus == b->lm_bonus));
}

/* Waits for work and takes the next batch from the queue into jobs (at most cap); returns the
 * number taken, 0 when a SIGHUP reload was done instead, -1 when it is time to exit. */
static int take_batch(server *S, job **jobs, int cap) {
    pthread_mutex_lock(&S->mu);
    for (;;) {
        if (S->reload) {
            S->reload = false;
            pthread_mutex_unlock(&S->mu);
            int st;
            json_decref(reload(S, &st));
            return 0;
        }
        if (S->head) break;
        if (S->stop) {
            pthread_mutex_unlock(&S->mu);
            return -1;
        }
        pthread_cond_wait(&S->cv, &S->mu);
    }
    job *first = S->head;
    if (first->kind == JOB_FORWARD || first->kind == JOB_DECODE) {
        double deadline = first->t_queued + S->o.max_wait_ms * 1e-3;
        for (;;) {
            int64_t B = 0, T = 0, H = 0, W = 0;
            bool full = false;
            for (job *j = S->head; j && !full; j = j->next) {
                if (j->kind != first->kind || !same_decode(j, first)) {
                    full = true;
                    break;
                }
                B += j->nseq;
                T = j->maxT > T ? j->maxT : T;
                H = j->maxH > H ? j->maxH : H;
                W = j->maxW > W ? j->maxW : W;
                full = batch_cost(S, B, T, H, W) >= S->o.max_batch_frames;
            }
            /* wait only while requests are on their way: a closed-loop client waits for its
             * answer, and waiting for requests nobody is sending only adds latency */
            double left = deadline - now_s();
            if (full || S->stop || left <= 0 || atomic_load(&S->incoming) == 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + left;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&S->cv, &S->mu, &ts);
        }
    }
    int n = 0;
    int64_t B = 0, T = 0, H = 0, W = 0;
    while (S->head && n < cap) {
        job *j = S->head;
        if (n > 0) {
            if (j->kind != first->kind || !same_decode(j, first) || first->kind == JOB_RELOAD)
                break;
            int64_t nB = B + j->nseq, nT = j->maxT > T ? j->maxT : T;
            int64_t nH = j->maxH > H ? j->maxH : H, nW = j->maxW > W ? j->maxW : W;
            if (batch_cost(S, nB, nT, nH, nW) > S->o.max_batch_frames) break;
        }
        B += j->nseq;
        T = j->maxT > T ? j->maxT : T;
        H = j->maxH > H ? j->maxH : H;
        W = j->maxW > W ? j->maxW : W;
        S->head = j->next;
        if (S->head == NULL) S->tail = NULL;
        j->next = NULL;
        jobs[n++] = j;
    }
    pthread_mutex_unlock(&S->mu);
    return n;
}

/* Runs parts p[0..n) (those of jobs without an error) as one model batch. When the model raises
 * on a batch of several sequences, its two halves are run one after the other, down to single
 * sequences: the request whose sequence the network cannot take (an image smaller than a "valid"
 * filter, a Lua layer that fails on it) gets 422 naming that sequence and the layer's message,
 * and the requests batched with it their answers. Halving finds one such sequence among n in
 * about 2 log2(n) runs (running each sequence alone took n: 20000 for one request). */
static void run_parts(server *S, const part *p, int n) {
    part *q = malloc((size_t)(n + 1) * sizeof *q);
    int m = 0;
    int64_t seqs = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].j->error) continue;
        if (q == NULL) {
            job_fail(p[i].j, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
            continue;
        }
        q[m++] = p[i];
        seqs += p[i].ns;
    }
    if (m == 0) {
        free(q);
        return;
    }
    bool raised = false;
    atomic_fetch_add(&S->batches_run, 1);
    char *err = q[0].j->kind == JOB_DECODE ? decode_batch(S, q, m, &raised)
                                           : forward_batch(S, q, m, &raised);
    if (err && raised && seqs > 1) {
        free(err);
        int64_t half = seqs / 2, acc = 0;
        int k = 0;
        while (acc + q[k].ns <= half)
            acc += q[k++].ns;
        part rest = {q[k].j, q[k].s0 + (half - acc), q[k].ns - (half - acc)};
        q[k].ns = half - acc;
        run_parts(S, q, q[k].ns > 0 ? k + 1 : k);
        q[k] = rest;
        run_parts(S, q + k, m - k);
        free(q);
        return;
    }
    const char *what = q[0].j->kind == JOB_DECODE ? "decoding" : "forward";
    if (err && !raised) logf_("%s failed: %s", what, err);
    for (int i = 0; err && i < m; i++) {
        char nm[48];
        if (q[i].j->error) continue;
        if (raised)
            job_fail(q[i].j, 422, "%sthe model cannot take this input: %s",
                     seq_name(q[i].j, q[i].s0, nm), err);
        else
            job_fail(q[i].j, MHD_HTTP_INTERNAL_SERVER_ERROR, "%s failed: %s", what, err);
    }
    free(err);
    free(q);
}

/* The padded frames of sequences s0 .. s0 + ns - 1 of j as one batch. */
static int64_t seqs_cost(const server *S, const job *j, int64_t s0, int64_t ns) {
    int64_t T = 0, H = 0, W = 0;
    for (int64_t s = s0; s < s0 + ns; s++) {
        T = j->T[s] > T ? j->T[s] : T;
        H = j->H[s] > H ? j->H[s] : H;
        W = j->W[s] > W ? j->W[s] : W;
    }
    return batch_cost(S, ns, T, H, W);
}

static void run_jobs(server *S, job **jobs, int n) {
    if (jobs[0]->kind == JOB_RELOAD) {
        jobs[0]->extra = reload(S, &jobs[0]->status);
        if (jobs[0]->status != MHD_HTTP_OK) {
            json_t *e = json_object_get(jobs[0]->extra, "error");
            job_fail(jobs[0], jobs[0]->status, "%s", json_string_value(e));
        }
        complete(S, jobs[0]);
        return;
    }
    /* jobs that waited too long are answered without being run */
    int m = 0;
    double now = now_s();
    for (int i = 0; i < n; i++) {
        if (now - jobs[i]->t_queued > S->o.timeout_s) {
            job_fail(jobs[i], MHD_HTTP_SERVICE_UNAVAILABLE,
                     "the request waited %.1f s for the model (--timeout %d s)",
                     now - jobs[i]->t_queued, S->o.timeout_s);
            complete(S, jobs[i]);
        } else {
            jobs[m++] = jobs[i];
        }
    }
    if (m == 0) return;
    /* A request is padded to its longest sequence (its largest height and width): 10000
     * one-frame sequences and one of 10000 frames, within --max-frames, would make a batch of
     * 10^8 frames. One that pads to more than the larger of --max-batch-frames and --max-frames
     * runs in pieces of consecutive sequences within that bound (take_batch takes it alone);
     * its answers are the same. */
    int64_t limit =
        S->o.max_batch_frames > S->o.max_frames ? S->o.max_batch_frames : S->o.max_frames;
    job *j = jobs[0];
    if (m == 1 && seqs_cost(S, j, 0, j->nseq) > limit) {
        for (int64_t s0 = 0, ns; s0 < j->nseq && j->error == NULL; s0 += ns) {
            for (ns = 1; s0 + ns < j->nseq && seqs_cost(S, j, s0, ns + 1) <= limit; ns++) {
            }
            run_parts(S, &(part){j, s0, ns}, 1);
        }
    } else {
        part *p = malloc((size_t)m * sizeof *p);
        for (int i = 0; p && i < m; i++)
            p[i] = (part){jobs[i], 0, jobs[i]->nseq};
        if (p)
            run_parts(S, p, m);
        else
            for (int i = 0; i < m; i++)
                job_fail(jobs[i], MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
        free(p);
    }
    for (int i = 0; i < m; i++)
        complete(S, jobs[i]);
}
/* ---- signals ----------------------------------------------------------------------------- */

/* Threads that libraries started before rl_serve_main (OpenBLAS's pool) do not block signals,
 * so a signal may land on any thread: the handler only writes its number into a pipe, and the
 * signal thread turns it into flags under the queue mutex. */
static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) { /* a full pipe already holds a wake-up */
    }
    errno = saved;
}

/* The signal thread also closes slow connections (close_slow_connections), every 200 ms. */
static void *signal_main(void *arg) {
    server *S = arg;
    for (;;) {
        struct pollfd pf = {.fd = sig_pipe[0], .events = POLLIN};
        int ready = poll(&pf, 1, 200);
        close_slow_connections(S);
        if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
        unsigned char b;
        ssize_t n = read(sig_pipe[0], &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || b == 0) break; /* 0: rl_serve_main is done */
        pthread_mutex_lock(&S->mu);
        if (b == SIGHUP)
            S->reload = true;
        else
            S->stop = true;
        pthread_cond_broadcast(&S->cv);
        pthread_mutex_unlock(&S->mu);
    }
    return NULL;
}

static bool install_signals(void) {
    if (pipe2(sig_pipe, O_CLOEXEC) != 0) return false;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return true;
}

/* ---- command line and start-up ----------------------------------------------------------- */

static void serve_usage(FILE *f) {
    fputs(
        "usage: rnnlua serve MODEL.h5 [options]\n"
        "Serves the checkpoint MODEL.h5 over HTTP: POST /v1/forward {\"data\": [[f, ...], ...]}\n"
        "(or {\"batch\": [{\"data\": ...}, ...]}) answers {\"output\": [[...], ...]}, the\n"
        "activations rl.forward writes; also POST /v1/decode, GET /v1/model, GET /healthz,\n"
        "POST /v1/reload (with --admin-token; or SIGHUP) to load MODEL.h5 again. SIGTERM or\n"
        "SIGINT: answer what is in flight, then exit 0. POST /v1/stream/ID {\"data\": [[...]]}\n"
        "streams a causal model chunk by chunk (the state kept between chunks; {\"end\": true}\n"
        "closes the stream), through the C API (include/rnnlua.h) on the model as started.\n"
        "\n"
        "Options (defaults in brackets; ++port P is --port P, ++max_body N is --max-body N):\n"
        "  --port P               TCP port; 0 picks a free one [8080]\n"
        "  --listen ADDR          address to listen on [127.0.0.1]\n"
        "  --layer NAME           the layer whose activations are served [output]\n"
        "  --precision P          fp32, or bf16: the products of linear, softmax, lstm and\n"
        "                         gru layers with bf16 operands, float32 sums; or int8:\n"
        "                         those with int8 weights and activations, int32 sums [fp32]\n"
        "  --lua FILE             a Lua file to run before the model loads: the\n"
        "                         rl.layers.register calls of the model's Lua layer classes\n"
        "  --lm FILE              an ARPA n-gram LM that POST /v1/decode fuses when a request\n"
        "                         says {\"lm\": {\"weight\": w, \"bonus\": b}}; its tokens:\n"
        "                         the checkpoint's target labels (else the class numbers)\n"
        "  --lm-word-boundary L   the label that ends words: a word-level LM [char-level]\n"
        "  --threads N            HTTP threads (parsing JSON, writing answers) [2]\n"
        "  --blas-threads N       threads of the model's products [1]: the HTTP threads\n"
        "                         need the other cores; stream batches of fewer than 16\n"
        "                         chunks run on one, a backlog on N\n"
        "  --max-batch-frames F   padded frames per model batch; 0 runs each request alone\n"
        "                         [1000]\n"
        "  --max-wait-ms W        longest wait for more requests to fill a batch [1]\n"
        "  --max-body BYTES       largest request body [4194304]\n"
        "  --max-frames N         most frames in one request [20000]\n"
        "  --max-queue-frames N   most frames queued, running or being answered (503\n"
        "                         beyond) [200000]\n"
        "  --max-connections N    most open connections (503 beyond) [64]\n"
        "  --timeout S            idle connections close, queued requests give up after S\n"
        "                         seconds [10]\n"
        "  --drain-timeout S      longest wait for in-flight requests at shutdown [30]\n"
        "  --admin-token TOKEN    turns POST /v1/reload on; it must then carry the header\n"
        "                         'Authorization: Bearer TOKEN' [off]\n"
        "  --max-streams N        open streams of POST /v1/stream/{id} (503 beyond; 0 turns\n"
        "                         streaming off) [64]\n"
        "  --stream-timeout S     a stream idle this long is closed (410 for its next chunk)\n"
        "                         [60]\n"
        "  --stream-batch N       most chunks of different streams waiting at once that go\n"
        "                         through as one batched forward (1: each alone) [64]\n"
        "The bound address goes to stdout as \"listening on http://ADDR:PORT\"; logs to stderr.\n",
        f);
}

/* The value of --name VALUE or --name=VALUE (arg, the option at argv[*i]; advancing *i), or
 * NULL. */
static const char *opt_value(int argc, char **argv, int *i, const char *arg, const char *name) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return argv[*i] + n + 1;
    if (arg[n] != '\0') return NULL;
    if (*i + 1 >= argc) return "";
    return argv[++*i];
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    /* decimal only: strtod also reads "0x10" (--port 0x10 listened on port 16) and " 80" */
    if (strpbrk(s, "xXpP") != NULL ||
        !(s[0] == '-' || s[0] == '+' || s[0] == '.' || (s[0] >= '0' && s[0] <= '9')))
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* The name of spec closest to the unknown option `a` (rnnlua.cli's edit distance, so that every
 * command line suggests alike), "" when none is found; pushes it on L's stack. */
static const char *closest_option(lua_State *L, const char *a, const char *const *names, size_t n) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "rnnlua.cli");
    if (lua_pcall(L, 1, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
        lua_pop(L, 1);
        return lua_pushliteral(L, "");
    }
    lua_getfield(L, -1, "closest");
    lua_remove(L, -2);
    lua_pushstring(L, a);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    if (lua_pcall(L, 2, 1, 0) != LUA_OK || !lua_isstring(L, -1)) {
        lua_pop(L, 1);
        return lua_pushliteral(L, "");
    }
    return lua_tostring(L, -1);
}

static int parse_options(lua_State *L, int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.listen = "127.0.0.1",
                      .layer = "output",
                      .precision = "fp32",
                      .port = 8080,
                      .threads = 2,
                      .blas_threads = 1,
                      .max_connections = 64,
                      .timeout_s = 10,
                      .max_beam = 64,
                      .max_batch_frames = 1000,
                      .max_frames = 20000,
                      .max_queue_frames = 200000,
                      .max_wait_ms = 1,
                      .drain_s = 30,
                      .max_streams = 64,
                      .stream_batch = 64,
                      .stream_timeout_s = 60,
                      .max_body = 4u << 20};
    static const struct {
        const char *name;
        double lo, hi;
        int kind; /* 0 string, 1 integer, 2 real */
        size_t off;
    } spec[] = {
        {"--listen", 0, 0, 0, offsetof(serve_opts, listen)},
        {"--layer", 0, 0, 0, offsetof(serve_opts, layer)},
        {"--precision", 0, 0, 0, offsetof(serve_opts, precision)},
        {"--lua", 0, 0, 0, offsetof(serve_opts, lua_file)},
        {"--lm-word-boundary", 0, 0, 0, offsetof(serve_opts, lm_word_boundary)},
        {"--lm", 0, 0, 0, offsetof(serve_opts, lm_file)},
        {"--admin-token", 0, 0, 0, offsetof(serve_opts, admin_token)},
        {"--port", 0, 65535, 1, offsetof(serve_opts, port)},
        {"--threads", 1, 256, 1, offsetof(serve_opts, threads)},
        {"--blas-threads", 1, 256, 1, offsetof(serve_opts, blas_threads)},
        {"--max-connections", 1, 100000, 1, offsetof(serve_opts, max_connections)},
        {"--timeout", 1, 86400, 1, offsetof(serve_opts, timeout_s)},
        {"--max-batch-frames", 0, 1e9, 3, offsetof(serve_opts, max_batch_frames)},
        {"--max-frames", 1, 1e9, 3, offsetof(serve_opts, max_frames)},
        {"--max-queue-frames", 1, 1e12, 3, offsetof(serve_opts, max_queue_frames)},
        {"--max-wait-ms", 0, 60000, 2, offsetof(serve_opts, max_wait_ms)},
        {"--drain-timeout", 0, 86400, 2, offsetof(serve_opts, drain_s)},
        {"--max-streams", 0, 100000, 1, offsetof(serve_opts, max_streams)},
        {"--stream-batch", 1, 100000, 1, offsetof(serve_opts, stream_batch)},
        {"--stream-timeout", 0.001, 86400, 2, offsetof(serve_opts, stream_timeout_s)},
        {"--max-body", 16, 1 << 30, 4, offsetof(serve_opts, max_body)},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (a[0] != '-' && !(a[0] == '+' && a[1] == '+')) {
            if (o->model_path) {
                fprintf(stderr, "rnnlua: serve: one model only (got %s and %s)\n", o->model_path,
                        a);
                return 2;
            }
            o->model_path = a;
            continue;
        }
        /* ++max_batch_frames 2000 is --max-batch-frames 2000: the command-line convention of
         * every other subcommand (docs/tools.md) */
        char norm[64];
        const char *arg = a;
        if (a[0] == '+' && a[1] == '+' && strlen(a) < sizeof norm) {
            snprintf(norm, sizeof norm, "--%s", a + 2);
            for (char *c = norm + 2; *c && *c != '='; c++)
                if (*c == '_') *c = '-';
            arg = norm;
        }
        size_t k = 0;
        const char *v = NULL;
        for (; k < sizeof spec / sizeof spec[0]; k++)
            if ((v = opt_value(argc, argv, &i, arg, spec[k].name)) != NULL) break;
        if (v == NULL) {
            const char *names[sizeof spec / sizeof spec[0]];
            for (size_t j = 0; j < sizeof spec / sizeof spec[0]; j++)
                names[j] = spec[j].name;
            char key[64];
            snprintf(key, sizeof key, "--%s", a + strspn(a, "-+"));
            for (char *c = key + 2; *c && *c != '='; c++)
                if (*c == '_') *c = '-';
            char *eq = strchr(key, '=');
            if (eq) *eq = '\0';
            const char *near = closest_option(L, key, names, sizeof names / sizeof names[0]);
            fprintf(stderr, "rnnlua: %s: unknown option%s%s%s\n(rnnlua serve --help)\n", a,
                    near[0] ? " (did you mean " : "", near, near[0] ? "?)" : "");
            lua_pop(L, 1);
            return 2;
        }
        char *field = (char *)o + spec[k].off;
        double d = 0;
        if (spec[k].kind == 0 && v[0] != '\0') {
            memcpy(field, &v, sizeof v);
            continue;
        }
        if (spec[k].kind != 0 && parse_num(v, spec[k].lo, spec[k].hi, &d) &&
            (spec[k].kind == 2 || d == floor(d))) {
            if (spec[k].kind == 1) *(int *)(void *)field = (int)d;
            if (spec[k].kind == 2) *(double *)(void *)field = d;
            if (spec[k].kind == 3) *(int64_t *)(void *)field = (int64_t)d;
            if (spec[k].kind == 4) *(size_t *)(void *)field = (size_t)d;
            continue;
        }
        if (spec[k].kind == 0)
            fprintf(stderr, "rnnlua: %s: needs a value, got '%s'\n", spec[k].name, v);
        else
            fprintf(stderr, "rnnlua: %s: needs %s in %.15g..%.15g, got '%s'\n", spec[k].name,
                    spec[k].kind == 2 ? "a number" : "an integer", spec[k].lo, spec[k].hi, v);
        return 2;
    }
    if (o->model_path == NULL) {
        serve_usage(stderr);
        return 2;
    }
    return -1;
}

/* A listening TCP socket on ADDR:PORT; writes the bound port to *port. -1 with a message. */
static int open_listener(const char *addr, int *port, char *err, size_t errn) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", *port);
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, errn, "cannot resolve --listen %s: %s", addr, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 256) != 0) {
        snprintf(err, errn, "cannot listen on %s port %d: %s", addr, *port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        *port = atoi(serv);
    return fd;
}

/* Answers everything still queued and waits until every request has been answered (or the
 * drain timeout has passed), then closes the listening socket and stops the HTTP threads. */
/* Stops taking connections: the gate thread ends (closing the connections it held) and the
 * listening socket closes. */
static void stop_gate(server *S) {
    if (S->gate_running) {
        unsigned char b = 0;
        if (write(S->gate_pipe[1], &b, 1) == 1) pthread_join(S->gate_thread, NULL);
        S->gate_running = false;
    }
    if (S->gate_pipe[0] >= 0) close(S->gate_pipe[0]);
    if (S->gate_pipe[1] >= 0) close(S->gate_pipe[1]);
    S->gate_pipe[0] = S->gate_pipe[1] = -1;
    if (S->listen_fd >= 0) close(S->listen_fd);
    S->listen_fd = -1;
}

static void drain_and_stop(server *S, job **jobs, int cap) {
    double until = now_s() + S->o.drain_s;
    for (;;) {
        int n = take_batch(S, jobs, cap);
        if (n > 0) {
            run_jobs(S, jobs, n);
            continue;
        }
        if (atomic_load(&S->requests) == 0 || now_s() > until) break;
        usleep(2000);
    }
    /* Then a quiet spell of 200 ms (no new connection, nothing being received or answered)
     * before the listening socket closes: connections the kernel has already completed into
     * its backlog are taken by libmicrohttpd and answered (503) instead of being reset. */
    int seen = atomic_load(&S->started);
    double quiet_since = now_s();
    while (now_s() <= until) {
        usleep(10000);
        int started = atomic_load(&S->started);
        if (started != seen || atomic_load(&S->requests) > 0 || atomic_load(&S->incoming) > 0) {
            seen = started;
            quiet_since = now_s();
            int n = take_batch(S, jobs, cap);
            if (n > 0) run_jobs(S, jobs, n);
        } else if (now_s() - quiet_since >= 0.2) {
            break;
        }
    }
    int left = atomic_load(&S->requests);
    if (left > 0) logf_("drain timeout: %d requests were not answered", left);
    /* a stream's chunk resumes its connection when done: the daemon must outlive it */
    while (atomic_load(&S->stream_workers) > 0)
        usleep(1000);
    stop_gate(S);
    MHD_stop_daemon(S->daemon);
    S->daemon = NULL;
}

int rl_serve_main(lua_State *L, int argc, char **argv) {
    server S_;
    server *S = &S_;
    memset(S, 0, sizeof *S);
    int rc = parse_options(L, argc, argv, &S->o);
    if (rc >= 0) return rc;
    S->L = L;
    S->model_ref = LUA_NOREF;
    rl_blas_set_threads(S->o.blas_threads);
    S->listen_fd = -1;
    S->gate_pipe[0] = S->gate_pipe[1] = -1;
    pthread_mutex_init(&S->mu, NULL);
    pthread_mutex_init(&S->cmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&S->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* until the signal thread runs, a SIGHUP (a reload asked for while the first load runs: the
     * file being loaded is the current one) would end the process */
    signal(SIGHUP, SIG_IGN);
    if (S->o.lua_file && run_lua_file(S) != LUA_OK) {
        logf_("--lua %s: %s", S->o.lua_file, lua_tostring(L, -1));
        lua_pop(L, 1);
        return 1;
    }
    if (load_model(S) != LUA_OK) {
        logf_("%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return 1;
    }
    S->in_dim = int_field(L, -1, "in_dim");
    S->out_dim = int_field(L, -1, "out_dim");
    S->sparse = bool_field(L, -1, "sparse");
    S->images = bool_field(L, -1, "images");
    S->out_images = bool_field(L, -1, "out_images");
    if (!install_model(S)) {
        logf_("%s: the model's description could not be read", S->o.model_path);
        return 1;
    }

    char err[256];
    pthread_mutex_init(&S->smu, NULL);
    pthread_mutex_init(&S->bmu, NULL);
    pthread_mutex_init(&S->pmu, NULL);
    pthread_cond_init(&S->pcv, NULL);
    if (S->o.max_streams == 0) {
        S->capi_error = strdup("the server was started with --max-streams 0");
    } else {
        rl_model_options mo = {.layer = S->o.layer, .lua_file = S->o.lua_file};
        /* the streams run in the precision of the batch endpoints */
        if (rl_model_load(&S->capi, S->o.model_path, &mo) != RL_OK ||
            rl_model_set_precision(S->capi, S->o.precision) != RL_OK) {
            S->capi_error = strdup(rl_errmsg());
            rl_model_free(S->capi);
            S->capi = NULL;
        }
        S->streams = calloc((size_t)S->o.max_streams, sizeof *S->streams);
        if (S->streams == NULL) {
            logf_("no memory for --max-streams %d", S->o.max_streams);
            return 1;
        }
    }
    int port = S->o.port;
    S->listen_fd = open_listener(S->o.listen, &port, err, sizeof err);
    if (S->listen_fd < 0) {
        logf_("%s", err);
        return 1;
    }
    /* the gate thread accepts (gate_main); MHD_USE_ITC wakes libmicrohttpd's threads for the
     * connections it hands over */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    S->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, S, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, S,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape_path, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(4 * GATE_HEAD_MAX), MHD_OPTION_THREAD_POOL_SIZE, (unsigned)S->o.threads,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(open_limit(S) + 256 * S->o.threads),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->o.timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, S, MHD_OPTION_NOTIFY_CONNECTION, on_connection, S, MHD_OPTION_END);
    if (S->daemon == NULL) {
        logf_("libmicrohttpd did not start on %s port %d", S->o.listen, port);
        close(S->listen_fd);
        return 1;
    }
    if (pipe2(S->gate_pipe, O_CLOEXEC) != 0 ||
        pthread_create(&S->gate_thread, NULL, gate_main, S) != 0) {
        logf_("cannot start the gate thread");
        MHD_stop_daemon(S->daemon);
        close(S->listen_fd);
        return 1;
    }
    S->gate_running = true;
    if (!install_signals() || pthread_create(&S->sig_thread, NULL, signal_main, S) != 0) {
        logf_("cannot start the signal thread");
        stop_gate(S);
        MHD_stop_daemon(S->daemon);
        return 1;
    }
    bool v6 = strchr(S->o.listen, ':') != NULL;
    printf("listening on http://%s%s%s:%d\n", v6 ? "[" : "", S->o.listen, v6 ? "]" : "", port);
    fflush(stdout);
    logf_("%s (epoch %lld), layer '%s', input dim %lld, output dim %lld; %d HTTP threads, "
          "batches up to %lld frames, waiting up to %g ms",
          S->o.model_path, (long long)S->epoch, S->o.layer, (long long)S->in_dim,
          (long long)S->out_dim, S->o.threads, (long long)S->o.max_batch_frames, S->o.max_wait_ms);

    enum { CAP = 1024 };
    job **jobs = malloc(CAP * sizeof *jobs);
    for (;;) {
        int n = jobs ? take_batch(S, jobs, CAP) : -1;
        if (n < 0) break;
        if (n > 0) run_jobs(S, jobs, n);
    }
    logf_("shutting down: answering %d requests in flight", atomic_load(&S->requests));
    atomic_store(&S->draining, true);
    if (jobs) {
        drain_and_stop(S, jobs, CAP);
    } else {
        while (atomic_load(&S->stream_workers) > 0)
            usleep(1000);
        stop_gate(S);
        MHD_stop_daemon(S->daemon);
    }
    free(jobs);
    stream_pool_stop(S);
    unsigned char quit = 0;
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (write(sig_pipe[1], &quit, 1) == 1) pthread_join(S->sig_thread, NULL);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    luaL_unref(L, LUA_REGISTRYINDEX, S->model_ref);
    free(S->info_json);
    free(S->decode_error);
    for (int i = 0; S->streams && i < S->o.max_streams; i++)
        rl_session_free(S->streams[i].session);
    free(S->streams);
    rl_model_free(S->capi);
    free(S->capi_error);
    pthread_mutex_destroy(&S->smu);
    pthread_mutex_destroy(&S->bmu);
    pthread_mutex_destroy(&S->pmu);
    pthread_cond_destroy(&S->pcv);
    pthread_cond_destroy(&S->cv);
    pthread_mutex_destroy(&S->mu);
    pthread_mutex_destroy(&S->cmu);
    logf_("stopped");
    return 0;
}
