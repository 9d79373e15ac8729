#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char rl_msg[1024];

rl_status rl_error(rl_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rl_msg, sizeof rl_msg, fmt, ap);
    va_end(ap);
    return code;
}

const char *rl_errmsg(void) { return rl_msg; }

void rl_error_clear(void) { rl_msg[0] = '\0'; }
