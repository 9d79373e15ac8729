/* A layer's options as a small table, standing in for a Lua layer description: for the C unit
 * tests (through gradcheck.h) and the C benchmarks (bench/bench.h). Everything here is static
 * inline.
 *
 *   gc_opts t = {0};
 *   gc_opt_num(&t, "n_out", 8); gc_opt_num(&t, "direction", -1); gc_opt_str(&t, "impl", "own");
 *   rl_options o = gc_options(&t);    (t must outlive o)
 *
 * An option asked for with another type than it was added with is an RL_EARG error. */
#ifndef RL_LAYER_OPTS_H
#define RL_LAYER_OPTS_H

#include <stdbool.h>
#include <string.h>

#include "../../core/error.h"
#include "../../layers/layer.h"

#define GC_MAX_OPTS 16

typedef struct {
    const char *key;
    char kind; /* 'n' number, 's' string, 'b' boolean */
    double num;
    const char *str;
    bool flag;
} gc_opt;

typedef struct {
    int n;
    gc_opt o[GC_MAX_OPTS];
} gc_opts;

static inline gc_opt *gc_opt_add_(gc_opts *t, const char *key, char kind) {
    gc_opt *o = &t->o[t->n < GC_MAX_OPTS ? t->n++ : GC_MAX_OPTS - 1];
    memset(o, 0, sizeof *o);
    o->key = key;
    o->kind = kind;
    return o;
}
static inline void gc_opt_num(gc_opts *t, const char *key, double v) {
    gc_opt_add_(t, key, 'n')->num = v;
}
static inline void gc_opt_str(gc_opts *t, const char *key, const char *v) {
    gc_opt_add_(t, key, 's')->str = v;
}
static inline void gc_opt_bool(gc_opts *t, const char *key, bool v) {
    gc_opt_add_(t, key, 'b')->flag = v;
}

static inline rl_status gc_find_(void *ctx, const char *key, char kind, const gc_opt **out,
                                 int *found) {
    const gc_opts *t = (const gc_opts *)ctx;
    *found = 0;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->o[i].key, key) == 0) {
            if (t->o[i].kind != kind) return rl_error(RL_EARG, "option %s has the wrong type", key);
            *out = &t->o[i];
            *found = 1;
        }
    return RL_OK;
}
static inline rl_status gc_number_(void *ctx, const char *key, double *v, int *found) {
    const gc_opt *o = NULL;
    RL_TRY(gc_find_(ctx, key, 'n', &o, found));
    if (*found) *v = o->num;
    return RL_OK;
}
static inline rl_status gc_string_(void *ctx, const char *key, const char **v, int *found) {
    const gc_opt *o = NULL;
    RL_TRY(gc_find_(ctx, key, 's', &o, found));
    if (*found) *v = o->str;
    return RL_OK;
}
static inline rl_status gc_boolean_(void *ctx, const char *key, bool *v, int *found) {
    const gc_opt *o = NULL;
    RL_TRY(gc_find_(ctx, key, 'b', &o, found));
    if (*found) *v = o->flag;
    return RL_OK;
}
static inline rl_options gc_options(gc_opts *t) {
    rl_options o = {t, gc_number_, gc_string_, gc_boolean_, NULL};
    return o;
}

#endif
