/* The registry of C layer classes: adding a class is one line here (and its file). */
#include <stdio.h>
#include <string.h>

#include "layer.h"
#include "layers.h"

static const struct {
    const char *name;
    rl_layer_create_fn create;
    int flags; /* RL_LAYER_* of layer.h */
} classes[] = {
    {"copy", rl_copy_create, RL_LAYER_ANY_RANK},
    {"linear", rl_linear_create, RL_LAYER_ANY_RANK | RL_LAYER_SPARSE_IN},
    {"activation", rl_activation_create, RL_LAYER_ANY_RANK},
    {"dropout", rl_dropout_create, RL_LAYER_ANY_RANK},
    {"combine", rl_combine_create, RL_LAYER_ANY_RANK},
    {"window", rl_window_create, 0},
    {"softmax", rl_softmax_create, RL_LAYER_SPARSE_IN},
    {"lstm", rl_lstm_create, 0},
    {"gru", rl_gru_create, 0},
    {"janet", rl_janet_create, 0},
    {"embedding", rl_embedding_create, RL_LAYER_SPARSE_IN},
    {"conv2d", rl_conv2d_create, RL_LAYER_IN_2D | RL_LAYER_OUT_2D},
    {"pool2d", rl_pool2d_create, RL_LAYER_IN_2D | RL_LAYER_OUT_2D},
    {"collapse", rl_collapse_create, RL_LAYER_IN_2D},
    {"global_pool", rl_global_pool_create, RL_LAYER_IN_2D},
    {"mdlstm", rl_mdlstm_create, RL_LAYER_IN_2D | RL_LAYER_OUT_2D},
};

#define N_CLASSES (sizeof classes / sizeof classes[0])

const char *const *rl_layer_classes(void) {
    static const char *names[N_CLASSES + 1];
    for (size_t i = 0; i < N_CLASSES; i++)
        names[i] = classes[i].name;
    names[N_CLASSES] = NULL;
    return names;
}

int rl_layer_class_flags(const char *class_name) {
    for (size_t i = 0; i < N_CLASSES; i++)
        if (strcmp(classes[i].name, class_name) == 0) return classes[i].flags;
    return -1;
}

rl_status rl_layer_create(rl_layer **out, const char *class_name, const char *name,
                          const rl_options *opts, int n_in, const int64_t *in_dims) {
    *out = NULL;
    for (size_t i = 0; i < N_CLASSES; i++)
        if (strcmp(classes[i].name, class_name) == 0) {
            rl_options o = *opts;
            o.class_name = classes[i].name;
            return classes[i].create(out, name, &o, n_in, in_dims);
        }
    char known[512];
    size_t used = 0;
    known[0] = '\0';
    for (size_t i = 0; i < N_CLASSES && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                                 classes[i].name);
    return rl_error(RL_EARG, "layer '%s': unknown class '%s' (known: %s)", name, class_name, known);
}
