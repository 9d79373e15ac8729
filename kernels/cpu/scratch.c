#include "scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "../../core/error.h"

static _Thread_local struct {
    void *p;
    size_t bytes;
} slots[RL_SCRATCH_SLOTS];
static pthread_key_t keys[RL_SCRATCH_SLOTS]; /* free a thread's buffers when the thread ends */
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void keys_init(void) {
    for (int i = 0; i < RL_SCRATCH_SLOTS; i++)
        (void)pthread_key_create(&keys[i], free);
}

void *rl_thread_scratch(rl_scratch_slot slot, size_t bytes, const char *what) {
    bytes = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    if (bytes <= slots[slot].bytes) return slots[slot].p;
    pthread_once(&keys_once, keys_init);
    void *p = aligned_alloc(64, bytes);
    if (!p) {
        if (what) rl_error(RL_ENOMEM, "%s: cannot allocate %zu bytes", what, bytes);
        return NULL;
    }
    free(slots[slot].p);
    slots[slot].p = p;
    slots[slot].bytes = bytes;
    (void)pthread_setspecific(keys[slot], p);
    return p;
}
