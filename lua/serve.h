/* `rnnlua serve MODEL.h5 [options]`: an HTTP service for a checkpoint (lua/serve.c). */
#ifndef RL_SERVE_H
#define RL_SERVE_H

#include <lua.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Runs the server until SIGTERM or SIGINT; argv[0] is "serve". L holds the rnnlua library
 * (the global `rl`). Returns the process exit status: 0 after a drained shutdown, 1 when the
 * model cannot be loaded or the port cannot be opened, 2 on a bad command line. */
int rl_serve_main(lua_State *L, int argc, char **argv);

/* The service's request checks, callable without a server (fuzz/fuzz_serve.c runs them in
 * process on arbitrary bytes).
 *
 * rl_serve_check_head: the gate's check of a connection's first `n` bytes (the request line
 * and headers as they arrive): 0 while the head is incomplete, 1 when it is handed to
 * libmicrohttpd, 2 when it is a /healthz the gate answers itself, or the status of the JSON error
 * answer (400, 414, 431, 505) with its message in msg.
 *
 * rl_serve_check_body: the parser of a POST /v1/forward (or, with decode, /v1/decode) body for
 * a model whose interface is described by m: 200 when the body makes a job, with its frames in
 * *frames, or the status of the error answer (400, 413, 422, 503) with its message in msg. */
typedef struct {
    int64_t in_dim;
    bool sparse, images, decode;
    const char *lm_file; /* the server's --lm, or NULL */
    int64_t max_frames;
    int max_beam;
} rl_serve_model;

int rl_serve_check_head(const char *b, size_t n, char *msg, size_t msgn);
int rl_serve_check_body(const rl_serve_model *m, const char *body, size_t n, int64_t *frames,
                        char *msg, size_t msgn);

/* Whether the message that libmicrohttpd is sending on fd with sendmsg is one of its own HTML
 * error answers, which has then been answered in JSON instead (*ret: what sendmsg returns to
 * the library). The rnnlua executable's sendmsg asks this first (lua/rnnlua.c). */
bool rl_serve_own_answer(int fd, const struct msghdr *m, ssize_t *ret);

#endif
