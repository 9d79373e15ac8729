/* Error reporting for library code.
 *
 * Library functions never print, exit or abort. A failing function records a message with
 * rl_error() and returns its status; the caller (ultimately the Lua binding) reads the message
 * with rl_errmsg() and raises it. The message buffer is per thread.
 */
#ifndef RL_ERROR_H
#define RL_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RL_OK = 0,
    RL_EARG,    /* a bad argument: unknown name, value out of range */
    RL_ESHAPE,  /* shapes that do not fit together */
    RL_EDTYPE,  /* a dtype the operation does not take */
    RL_EINDEX,  /* an index out of range */
    RL_ENOMEM,  /* an allocation failed (host or device) */
    RL_EIO,     /* a file could not be read or written */
    RL_EDEVICE, /* no such device, no CUDA build, or a failing device call */
} rl_status;

/* Formats a message into the thread's buffer and returns `code`, so that callers can write
 * `return rl_error(RL_ESHAPE, "matmul: ...")`. */
rl_status rl_error(rl_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message of the last error on this thread ("" when none was set). */
const char *rl_errmsg(void);

void rl_error_clear(void);

#define RL_TRY(expr)                                                                               \
    do {                                                                                           \
        rl_status rl_try_st_ = (expr);                                                             \
        if (rl_try_st_ != RL_OK) return rl_try_st_;                                                \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
