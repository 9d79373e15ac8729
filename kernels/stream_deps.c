/* Producer/consumer bookkeeping between streams (kernels/stream_deps.h). */
#include "stream_deps.h"

#include <stdbool.h>
#include <stdlib.h>

rl_status rl_stream_deps_wrote(rl_stream_deps *d, void *stream, const void *p, size_t bytes) {
    if (!p || bytes == 0) return RL_OK;
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    for (size_t i = 0; i < d->n; i++) {
        if (d->e[i].lo == lo && d->e[i].hi == hi) {
            d->e[i].stream = stream;
            return RL_OK;
        }
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        rl_stream_dep *e = realloc(d->e, cap * sizeof *e);
        if (!e)
            return rl_error(RL_ENOMEM, "rl_stream_deps_wrote: out of host memory for %zu entries",
                            cap);
        d->e = e;
        d->cap = cap;
    }
    d->e[d->n++] = (rl_stream_dep){lo, hi, stream};
    return RL_OK;
}

size_t rl_stream_deps_writers(const rl_stream_deps *d, void *stream, const void *p, size_t bytes,
                              void **out, size_t max) {
    if (!p || bytes == 0) return 0;
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++) {
        const rl_stream_dep *e = &d->e[i];
        if (e->stream == stream || e->hi <= lo || e->lo >= hi) continue;
        bool seen = false;
        for (size_t k = 0; k < n && k < max && !seen; k++)
            seen = out[k] == e->stream;
        if (seen) continue;
        if (n < max) out[n] = e->stream;
        n++;
    }
    return n;
}

void rl_stream_deps_forget(rl_stream_deps *d, void *stream) {
    size_t k = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].stream != stream) d->e[k++] = d->e[i];
    d->n = k;
}

void rl_stream_deps_free(rl_stream_deps *d) {
    free(d->e);
    *d = (rl_stream_deps){0};
}
