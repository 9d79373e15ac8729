/* The producer/consumer bookkeeping between layer streams (kernels/stream_deps.h), without a
 * device: the calls a 2-layer BLSTM makes (each direction its own stream) are replayed in the
 * order layers/lstm.c makes them, and every read must be told to wait for exactly the other
 * streams that wrote what it reads. */
#include <stdint.h>

#include "../../kernels/stream_deps.h"
#include "check.h"

static char mem[4096];     /* stands in for device buffers: only addresses matter */
static int sA, sB, sC, sD; /* four layers' streams: fwd1, bwd1, fwd2, bwd2 */

static size_t writers(rl_stream_deps *d, void *s, size_t at, size_t n, void **out) {
    return rl_stream_deps_writers(d, s, mem + at, n, out, 4);
}

static void test_blstm_stack(void) {
    rl_stream_deps d = {0};
    void *w[4];
    /* forward: fwd1 and bwd1 read the data (written by no stream), write out1 at [0,100) and
     * out2 at [100,200) */
    CHECK(writers(&d, &sA, 1000, 50, w) == 0);
    CHECK_OK(rl_stream_deps_wrote(&d, &sA, mem + 0, 100));
    CHECK(writers(&d, &sB, 1000, 50, w) == 0); /* the pair overlaps: no wait on fwd1 */
    CHECK_OK(rl_stream_deps_wrote(&d, &sB, mem + 100, 100));
    /* fwd2 reads both: waits for A and B */
    size_t n = writers(&d, &sC, 0, 100, w);
    CHECK(n == 1 && w[0] == &sA);
    n = writers(&d, &sC, 100, 100, w);
    CHECK(n == 1 && w[0] == &sB);
    n = writers(&d, &sC, 0, 200, w); /* one range spanning both: both, each once */
    CHECK(n == 2 && ((w[0] == &sA && w[1] == &sB) || (w[0] == &sB && w[1] == &sA)));
    CHECK_OK(rl_stream_deps_wrote(&d, &sC, mem + 200, 100));
    CHECK_OK(rl_stream_deps_wrote(&d, &sD, mem + 300, 100));
    /* a reader never waits for its own stream */
    CHECK(writers(&d, &sA, 0, 100, w) == 0);
    /* backward: fwd2 writes its grad_in into grad_out of layer 1 at [400,600); bwd2 then
     * overwrites the same range (beta 0): it must wait for fwd2 first */
    CHECK(writers(&d, &sC, 400, 200, w) == 0);
    CHECK_OK(rl_stream_deps_wrote(&d, &sC, mem + 400, 200));
    n = writers(&d, &sD, 400, 200, w);
    CHECK(n == 1 && w[0] == &sC);
    CHECK_OK(rl_stream_deps_wrote(&d, &sD, mem + 400, 200)); /* same range: replaces C's */
    n = writers(&d, &sA, 400, 100, w);                       /* fwd1 reads its half of grad_out */
    CHECK(n == 1 && w[0] == &sD);
    /* adjacent but not overlapping ranges do not count */
    CHECK(writers(&d, &sD, 399, 1, w) == 0);
    CHECK(writers(&d, &sD, 600, 10, w) == 0);
    CHECK(writers(&d, &sA, 399, 2, w) == 1);
    /* an empty or null range waits for nothing and records nothing */
    CHECK(writers(&d, &sA, 0, 0, w) == 0);
    CHECK(rl_stream_deps_writers(&d, &sA, NULL, 10, w, 4) == 0);
    CHECK_OK(rl_stream_deps_wrote(&d, &sA, NULL, 10));
    /* a destroyed stream is forgotten (its address may return as another stream) */
    rl_stream_deps_forget(&d, &sD);
    CHECK(writers(&d, &sA, 400, 100, w) == 0);
    CHECK(writers(&d, &sD, 0, 100, w) == 1);
    /* more writers than room: the count says so, the caller then waits for everything */
    CHECK_OK(rl_stream_deps_wrote(&d, &sD, mem + 700, 10));
    n = rl_stream_deps_writers(&d, &sA, mem, 800, w, 1);
    CHECK(n >= 2);
    rl_stream_deps_free(&d);
    CHECK(d.n == 0 && d.e == NULL);
}

static void test_growth(void) {
    rl_stream_deps d = {0};
    void *w[2];
    for (size_t i = 0; i < 1000; i++)
        CHECK_OK(rl_stream_deps_wrote(&d, (i % 2) ? (void *)&sA : (void *)&sB, mem + i * 4, 4));
    CHECK(d.n == 1000);
    CHECK(rl_stream_deps_writers(&d, &sC, mem + 3996, 4, w, 2) == 1 && w[0] == &sA);
    CHECK(rl_stream_deps_writers(&d, &sC, mem, 8, w, 2) == 2);
    rl_stream_deps_free(&d);
}

int main(void) {
    test_blstm_stack();
    test_growth();
    TEST_MAIN_END();
}
