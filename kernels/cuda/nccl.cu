/* NCCL for core/dist.h: the sum and the broadcast of device buffers across the ranks.
 *
 * One communicator per process, on the CUDA device of this rank, created on the first device
 * collective (rank 0's ncclUniqueId reaches the others through MPI, core/dist.c). The
 * communicator is non-blocking (config.blocking = 0), so that no NCCL call can wait forever:
 * every call is followed by a poll of ncclCommGetAsyncError and of the stream against the
 * deadline rl_dist hands in; past it the communicator is aborted and the collective fails with
 * a message naming the rank. The collectives run on the device's legacy default stream, the
 * stream of every rnnlua kernel, so they follow the backward pass that wrote the gradients
 * and precede the optimizer step without events; they return when the result is on the
 * device. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

extern "C" {
#include "../../core/dist.h"
#include "nccl_comm.h"
}

namespace {

ncclComm_t g_comm = nullptr;
int g_rank = 0, g_device = 0;

double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

rl_status nccl_fail(const char *what, ncclResult_t r) {
    return rl_error(RL_EDEVICE, "%s: rank %d (cuda:%d): NCCL: %s%s%s", what, g_rank, g_device,
                    ncclGetErrorString(r), g_comm ? "; " : "",
                    g_comm ? ncclGetLastError(g_comm) : "");
}

/* Waits until the communicator has no call in progress and, when `stream_too`, the stream has
 * finished; aborts the communicator at the deadline. */
rl_status settle(const char *what, double timeout, bool stream_too) {
    double t0 = now();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(g_comm, &st);
        if (r != ncclSuccess) return nccl_fail(what, r);
        if (st != ncclSuccess && st != ncclInProgress) {
            rl_status s = nccl_fail(what, st);
            ncclCommAbort(g_comm);
            g_comm = nullptr;
            return s;
        }
        if (st == ncclSuccess) {
            if (!stream_too) return RL_OK;
            cudaError_t q = cudaStreamQuery(cudaStreamLegacy);
            if (q == cudaSuccess) return RL_OK;
            if (q != cudaErrorNotReady)
                return rl_error(RL_EDEVICE, "%s: rank %d (cuda:%d): %s", what, g_rank, g_device,
                                cudaGetErrorString(q));
        }
        double waited = now() - t0;
        if (waited > timeout) {
            ncclCommAbort(g_comm);
            g_comm = nullptr;
            return rl_error(RL_EDEVICE,
                            "%s: rank %d (cuda:%d) waited %.0f s for the other ranks (one died or "
                            "hangs); the NCCL communicator was aborted",
                            what, g_rank, g_device, waited);
        }
    }
}

rl_status make_id(void *id) {
    ncclResult_t r = ncclGetUniqueId(static_cast<ncclUniqueId *>(id));
    return r == ncclSuccess ? RL_OK : nccl_fail("ncclGetUniqueId", r);
}

rl_status init(const void *id, int rank, int size, int device) {
    g_rank = rank;
    g_device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return rl_error(RL_EDEVICE, "NCCL init: rank %d: cudaSetDevice(%d): %s", rank, device,
                        cudaGetErrorString(e));
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&g_comm, size, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        g_comm = nullptr;
        return nccl_fail("ncclCommInitRankConfig", r);
    }
    return settle("ncclCommInitRankConfig", rl_dist_get_timeout(), false);
}

ncclDataType_t nccl_type(rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return ncclFloat32;
    case RL_FLOAT64: return ncclFloat64;
    default: return ncclInt32;
    }
}

rl_status allreduce(void *buf, int64_t n, rl_dtype dt, double timeout) {
    if (g_comm == nullptr)
        return rl_error(RL_EDEVICE, "allreduce: rank %d: no NCCL communicator", g_rank);
    cudaSetDevice(g_device);
    ncclResult_t r =
        ncclAllReduce(buf, buf, (size_t)n, nccl_type(dt), ncclSum, g_comm, cudaStreamLegacy);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail("ncclAllReduce", r);
    return settle("ncclAllReduce", timeout, true);
}

rl_status broadcast(void *buf, size_t nbytes, int root, double timeout) {
    if (g_comm == nullptr)
        return rl_error(RL_EDEVICE, "broadcast: rank %d: no NCCL communicator", g_rank);
    cudaSetDevice(g_device);
    ncclResult_t r = ncclBroadcast(buf, buf, nbytes, ncclUint8, root, g_comm, cudaStreamLegacy);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail("ncclBroadcast", r);
    return settle("ncclBroadcast", timeout, true);
}

void finalize() {
    if (g_comm == nullptr) return;
    /* a normal end: the communicator's work is done; its resources go back */
    ncclResult_t r = ncclCommFinalize(g_comm);
    ncclResult_t st = r == ncclSuccess || r == ncclInProgress ? ncclInProgress : r;
    double t0 = now();
    while (st == ncclInProgress && now() - t0 < 10.0)
        ncclCommGetAsyncError(g_comm, &st);
    ncclCommDestroy(g_comm);
    g_comm = nullptr;
}

const rl_dist_device_comm g_nccl = {
    "NCCL", sizeof(ncclUniqueId), make_id, init, allreduce, broadcast, finalize,
};

} // namespace

extern "C" void rl_nccl_register(void) { rl_dist_register_device_comm(&g_nccl); }
