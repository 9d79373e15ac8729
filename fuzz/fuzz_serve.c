/* libFuzzer target: the request checks of `rnnlua serve` (lua/serve.c), in process, on arbitrary
 * bytes: the gate's check of a connection's first request head, and the parser of forward and
 * decode bodies. The first two bytes choose the model's interface (input size 1..8, sparse,
 * images, decode, an LM); the rest is a request, its body after the head's empty line. An error
 * answer must have a 4xx/5xx status and a message; a body it accepts must hold 1..max_frames
 * frames; never a crash, a sanitizer finding, a leak or a hang. Seeds: fuzz/corpus/serve. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lua/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void invariant(bool ok, const char *what, int status, const char *msg) {
    if (ok) return;
    fprintf(stderr, "FUZZ INVARIANT: %s: status %d, message '%s'\n", what, status, msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    rl_serve_model m = {.in_dim = 1 + data[0] % 8,
                        .sparse = data[1] & 1,
                        .images = (data[1] & 2) && !(data[1] & 1),
                        .decode = data[1] & 4,
                        .lm_file = data[1] & 8 ? "lm.arpa" : NULL,
                        .max_frames = 64,
                        .max_beam = 8};
    const char *req = (const char *)data + 2;
    size_t n = size - 2;
    char msg[512] = "";
    int h = rl_serve_check_head(req, n, msg, sizeof msg);
    invariant(h == 0 || h == 1 || h == 2 || (h >= 400 && h < 600 && msg[0] != 0), "head", h, msg);
    /* the body: after the first empty line, or the whole input when there is none */
    const char *body = req;
    for (size_t i = 0; i + 1 < n; i++) {
        if (req[i] == '\n' &&
            (req[i + 1] == '\n' || (req[i + 1] == '\r' && i + 2 < n && req[i + 2] == '\n'))) {
            body = req + i + (req[i + 1] == '\n' ? 2 : 3);
            break;
        }
    }
    size_t bn = n - (size_t)(body - req);
    int64_t frames = -1;
    msg[0] = 0;
    int b = rl_serve_check_body(&m, body, bn, &frames, msg, sizeof msg);
    if (b == 200)
        invariant(frames >= 1 && frames <= m.max_frames, "body accepted", b, msg);
    else
        invariant(b >= 400 && b < 600 && msg[0] != 0, "body refused", b, msg);
    return 0;
}
