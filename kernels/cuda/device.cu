/* The CUDA device backend of core/device.h: device count, a caching allocator, copies between
 * host and devices, and synchronisation.
 *
 * Allocator: cudaMalloc and cudaFree are slow and cudaFree synchronises the device, so freed
 * blocks are kept per device in buckets of a rounded size class and handed out again for any
 * request of the same class. A request that cudaMalloc cannot satisfy first returns every
 * cached block of that device to the driver and tries once more. All work runs on each
 * device's legacy default stream, so a block reused at once is only touched after the kernels
 * that used it before have finished.
 *
 * Every failing CUDA call becomes rl_error(RL_EDEVICE, "<call>: <CUDA message> (...)"), out of
 * memory RL_ENOMEM; nothing here prints, exits or throws into C. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

extern "C" {
#include "../../core/device.h"
#include "context.h"
#include "cuda.h"
}

/* More ordinals than any machine has; the caches are a fixed array indexed by ordinal. */
#define RL_CUDA_MAX_DEVICES 64

namespace {

struct BlockCache {
    std::mutex mu;
    std::unordered_map<size_t, std::vector<void *>> free_blocks; /* size class -> blocks */
    std::unordered_map<void *, size_t> live;                     /* block -> size class */
};

std::mutex g_caches_mu;
/* Created on first use and never destroyed: a storage released from a Lua finaliser or an
 * atexit handler may reach free() after static destructors have run. */
BlockCache *g_caches[RL_CUDA_MAX_DEVICES];

/* Size classes: at least 512 bytes; up to 32 MiB a quarter of the request's highest power of
 * two (at most 25% slack); above that multiples of 2 MiB. */
size_t size_class(size_t n) {
    if (n <= 512) return 512;
    size_t step;
    if (n > ((size_t)32 << 20)) {
        step = (size_t)2 << 20;
    } else {
        int hb = 63 - __builtin_clzll((unsigned long long)n);
        step = (size_t)1 << (hb - 2);
    }
    return (n + step - 1) / step * step;
}

BlockCache *cache_for(int index) {
    std::lock_guard<std::mutex> lock(g_caches_mu);
    if (!g_caches[index]) g_caches[index] = new (std::nothrow) BlockCache;
    return g_caches[index];
}

/* Hands every cached block of the device back to the driver (the caller holds c->mu). */
void empty_cache(BlockCache *c) {
    for (auto &bucket : c->free_blocks)
        for (void *p : bucket.second)
            cudaFree(p);
    c->free_blocks.clear();
    cudaGetLastError();
}

rl_status check_index(const char *op, int index) {
    if (index < 0 || index >= RL_CUDA_MAX_DEVICES)
        return rl_error(RL_EDEVICE, "%s: no CUDA device cuda:%d", op, index);
    return RL_OK;
}

rl_status set_device(const char *op, int index) {
    RL_TRY(check_index(op, index));
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rl_error(RL_EDEVICE, "%s: cudaSetDevice(%d): %s", op, index, cudaGetErrorString(e));
    }
    return RL_OK;
}

int cuda_count(void) {
    static std::once_flag once;
    static int n;
    std::call_once(once, [] {
        int k = 0;
        if (cudaGetDeviceCount(&k) != cudaSuccess) {
            cudaGetLastError();
            k = 0;
        }
        n = k < RL_CUDA_MAX_DEVICES ? k : RL_CUDA_MAX_DEVICES;
    });
    return n;
}

rl_status cuda_alloc(int index, size_t nbytes, void **ptr) {
    *ptr = NULL;
    RL_TRY(check_index("cuda alloc", index));
    if (nbytes > ((size_t)1 << 62))
        return rl_error(RL_ENOMEM, "cuda alloc: out of memory allocating %zu bytes on cuda:%d",
                        nbytes, index);
    BlockCache *c = cache_for(index);
    if (!c) return rl_error(RL_ENOMEM, "cuda alloc: out of host memory for the block cache");
    size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(c->mu);
    try {
        auto it = c->free_blocks.find(cls);
        if (it != c->free_blocks.end() && !it->second.empty()) {
            void *p = it->second.back();
            c->live[p] = cls;
            it->second.pop_back();
            *ptr = p;
            return RL_OK;
        }
    } catch (...) {
        return rl_error(RL_ENOMEM, "cuda alloc: out of host memory for the block cache");
    }
    RL_TRY(set_device("cuda alloc", index));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        empty_cache(c);
        e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorMemoryAllocation)
            return rl_error(
                RL_ENOMEM,
                "cuda alloc: out of memory allocating %zu bytes on cuda:%d (cudaMalloc: "
                "%s)",
                nbytes, index, cudaGetErrorString(e));
        return rl_error(RL_EDEVICE, "cudaMalloc: %s (%zu bytes on cuda:%d)", cudaGetErrorString(e),
                        nbytes, index);
    }
    try {
        c->live[p] = cls;
    } catch (...) {
        cudaFree(p);
        return rl_error(RL_ENOMEM, "cuda alloc: out of host memory for the block cache");
    }
    *ptr = p;
    return RL_OK;
}

/* The block map knows each block's size class, so the byte count is not needed. */
void cuda_free(int index, void *ptr, size_t) {
    if (!ptr || check_index("cuda free", index) != RL_OK) return;
    BlockCache *c = cache_for(index);
    if (c) {
        std::lock_guard<std::mutex> lock(c->mu);
        auto it = c->live.find(ptr);
        if (it != c->live.end()) {
            size_t cls = it->second;
            c->live.erase(it);
            try {
                c->free_blocks[cls].push_back(ptr);
                return;
            } catch (...) {
                /* no room to cache it: give it back below */
            }
        }
    }
    int prev = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(index) == cudaSuccess) {
        cudaFree(ptr);
        cudaSetDevice(prev);
    }
    cudaGetLastError();
}

void describe(rl_device d, char *buf, size_t n) { rl_device_name(d, buf, n); }

rl_status cuda_memcpy(void *dst, rl_device ddev, const void *src, rl_device sdev, size_t nbytes) {
    if (nbytes == 0) return RL_OK;
    if (ddev.type == RL_CPU && sdev.type == RL_CPU) {
        memmove(dst, src, nbytes);
        return RL_OK;
    }
    cudaError_t e;
    const char *call = "cudaMemcpy";
    if (sdev.type == RL_CPU) {
        RL_TRY(set_device("cuda memcpy", ddev.index));
        e = cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice);
    } else if (ddev.type == RL_CPU) {
        RL_TRY(set_device("cuda memcpy", sdev.index));
        e = cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost);
    } else if (ddev.index == sdev.index) {
        RL_TRY(set_device("cuda memcpy", sdev.index));
        e = cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToDevice);
    } else {
        RL_TRY(check_index("cuda memcpy", sdev.index));
        RL_TRY(check_index("cuda memcpy", ddev.index));
        call = "cudaMemcpyPeer";
        e = cudaMemcpyPeer(dst, ddev.index, src, sdev.index, nbytes);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        char dn[32], sn[32];
        describe(ddev, dn, sizeof dn);
        describe(sdev, sn, sizeof sn);
        return rl_error(RL_EDEVICE, "%s: %s (%zu bytes from %s to %s)", call, cudaGetErrorString(e),
                        nbytes, sn, dn);
    }
    return RL_OK;
}

const rl_device_backend g_backend = {
    "cuda", cuda_count, cuda_alloc, cuda_free, cuda_memcpy, rl_cuda_synchronize,
};

} // namespace

extern "C" void rl_cuda_register(void) { rl_device_register_cuda(&g_backend); }
