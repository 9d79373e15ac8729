/* Error reporting for library code.
 *
 * Library functions never print, exit or abort. A failing function records a message with
 * rl_error() and returns its status; the caller (ultimately the Lua binding) reads the message
 * with rl_errmsg() and raises it. The message buffer is per thread.
 */
#ifndef RL_ERROR_H
#define RL_ERROR_H

#include "../include/rnnlua.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rl_status and rl_errmsg belong to the public C API (include/rnnlua.h): one definition. */

/* Formats a message into the thread's buffer and returns `code`, so that callers can write
 * `return rl_error(RL_ESHAPE, "matmul: ...")`. */
rl_status rl_error(rl_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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
