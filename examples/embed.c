/* rnnlua's C API in 30 lines (docs/embedding.md): `embed MODEL.h5 CHUNK < frames` reads one
 * sequence ("T F", then T x F numbers) and prints the model's output, a line a frame: with CHUNK 0
 * the whole sequence at once (rl_model_forward), else streamed CHUNK frames a push.
 * Build: cc embed.c $(pkg-config --cflags --libs rnnlua) -o embed */
#include <rnnlua.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(void) { return fprintf(stderr, "embed: %s\n", rl_errmsg()), 1; }

static void print(const rl_output *o) {
    for (int64_t i = 0; i < o->T * o->dim; i++)
        printf("%.9g%c", o->y[i], (i + 1) % o->dim ? ' ' : '\n');
}

int main(int argc, char **argv) {
    long long T, F, chunk = argc == 3 ? atoll(argv[2]) : -1;
    if (chunk < 0 || scanf("%lld %lld", &T, &F) != 2 || T < 1 || F < 1)
        return fputs("usage: embed MODEL.h5 CHUNK < frames\n", stderr), 2;
    float *x = malloc(sizeof *x * T * F);
    for (long long i = 0; i < T * F; i++)
        if (scanf("%f", &x[i]) != 1) return fputs("embed: short input\n", stderr), 2;
    rl_model *m;
    rl_session *s;
    rl_output out;
    int32_t len = (int32_t)T;
    if (rl_model_load(&m, argv[1], NULL) != RL_OK) return fail();
    if (chunk == 0) {
        rl_batch b = {.T = T, .B = 1, .F = F, .x = x, .lengths = &len};
        if (rl_model_forward(m, &b, NULL, &out) != RL_OK) return fail();
        print(&out);
    } else {
        if (rl_session_open(&s, m) != RL_OK) return fail();
        for (long long t = 0; t < T; t += chunk) {
            rl_batch c = {.T = t + chunk < T ? chunk : T - t, .B = 1, .F = F, .x = x + t * F};
            if (rl_session_push(s, &c, &out) != RL_OK) return fail();
            print(&out);
        }
        rl_session_free(s);
    }
    rl_model_free(m);
    free(x);
    return 0;
}
