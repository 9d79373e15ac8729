/* Producer/consumer ordering between streams, the bookkeeping half (plain C, no CUDA: the CUDA
 * half, events and waits, is in kernels/cuda/lstm.cu; tests/c/test_stream_deps.c checks this
 * half without a device).
 *
 * Why: the lstm and gru layers each queue their work on their own blocking stream, and two
 * blocking streams are not ordered against each other; only the legacy default stream orders
 * them. So a layer reading a buffer another layer's stream wrote (forward: its inputs; backward:
 * the grad_out a later layer wrote as its grad_in) must first make its stream wait for an event
 * the writer recorded after writing. This registry remembers which stream last wrote which byte
 * range; a reader asks which other streams wrote ranges overlapping what it reads.
 *
 * Not thread-safe by itself (the CUDA half holds a mutex around every call). Ranges are never
 * coalesced; a write of exactly the same range replaces the older entry (buffers are kept across
 * batches, so the table stays as small as the number of layer outputs and input gradients). */
#ifndef RL_KERNELS_STREAM_DEPS_H
#define RL_KERNELS_STREAM_DEPS_H

#include <stddef.h>
#include <stdint.h>

#include "../core/error.h"

typedef struct {
    uintptr_t lo, hi; /* [lo, hi) bytes */
    void *stream;     /* the stream that last wrote them */
} rl_stream_dep;

typedef struct {
    rl_stream_dep *e;
    size_t n, cap;
} rl_stream_deps; /* zero-initialised: empty */

/* A call queued on `stream` writes [p, p + bytes). */
rl_status rl_stream_deps_wrote(rl_stream_deps *d, void *stream, const void *p, size_t bytes);
/* The distinct streams other than `stream` that wrote a range overlapping [p, p + bytes), into
 * out (at most max of them); returns how many there are; past max that count is an upper bound
 * (a stream may be counted twice), so a caller seeing more than max waits for the whole device. */
size_t rl_stream_deps_writers(const rl_stream_deps *d, void *stream, const void *p, size_t bytes,
                              void **out, size_t max);
/* Drops every entry of a stream (being destroyed: its address may come back for another). */
void rl_stream_deps_forget(rl_stream_deps *d, void *stream);
void rl_stream_deps_free(rl_stream_deps *d);

#endif
