#include "scratch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "../../core/error.h"

/* Buffers are mapped from the system, not taken from malloc: a buffer that grows leaves no hole
 * in malloc's heap for later tensors to fragment (a growing bf16 scratch of 0.5-4.5 MB raised
 * ptb_small's peak resident set by 2.9 MiB from malloc), its old pages go back at once, and a
 * buffer's pages count as resident only once a product has written them. Each mapping starts
 * with a header of HEADER bytes holding its length; the buffer follows, 64-byte aligned. Under
 * AddressSanitizer they come from malloc, whose redzones catch a kernel writing past its
 * buffer. */
#define HEADER 64
#if defined(__SANITIZE_ADDRESS__)
#define RL_SCRATCH_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RL_SCRATCH_MALLOC 1
#endif
#endif

static _Thread_local struct {
    void *p;
    size_t bytes;
} slots[RL_SCRATCH_SLOTS];
static pthread_key_t keys[RL_SCRATCH_SLOTS]; /* free a thread's buffers when the thread ends */
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void *map(size_t bytes) {
    if (bytes > SIZE_MAX - HEADER) return NULL;
#ifdef RL_SCRATCH_MALLOC
    void *base = aligned_alloc(64, bytes + HEADER);
    if (!base) return NULL;
#else
    void *base =
        mmap(NULL, bytes + HEADER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
#endif
    *(size_t *)base = bytes + HEADER;
    return (char *)base + HEADER;
}

static void unmap(void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
#ifdef RL_SCRATCH_MALLOC
    free(base);
#else
    (void)munmap(base, *(size_t *)base);
#endif
}

static void keys_init(void) {
    for (int i = 0; i < RL_SCRATCH_SLOTS; i++)
        (void)pthread_key_create(&keys[i], unmap);
}

void *rl_thread_scratch(rl_scratch_slot slot, size_t bytes, const char *what) {
    bytes = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    if (bytes <= slots[slot].bytes) return slots[slot].p;
    pthread_once(&keys_once, keys_init);
    void *p = map(bytes);
    if (!p) {
        if (what) rl_error(RL_ENOMEM, "%s: cannot allocate %zu bytes", what, bytes);
        return NULL;
    }
    unmap(slots[slot].p);
    slots[slot].p = p;
    slots[slot].bytes = bytes;
    (void)pthread_setspecific(keys[slot], p);
    return p;
}
