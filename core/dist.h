/* Communication between the processes of a data-parallel run: MPI underneath (Open MPI, MPICH),
 * NCCL for buffers on CUDA devices when the CUDA backend registers it. No MPI or CUDA type
 * appears here; only core/dist.c includes mpi.h.
 *
 * The world: rl_dist_init() joins it when the process was started by an MPI launcher (mpirun,
 * srun; detected from the launcher's environment variables), so a plain `./rnnlua` never needs
 * one. Without a launcher, or in a build without MPI (RL_WITH_MPI undefined), the world is this
 * process alone: rank 0 of 1, and every collective is a no-op that returns at once.
 *
 * Collectives are run non-blocking and polled against a deadline (rl_dist_set_timeout, default
 * 300 s): a rank that died or hangs makes the others fail with RL_EDEVICE and a message naming
 * the operation, its sequence number, this rank and, where known, the ranks that never arrived
 * (rank 0 learns of every other rank's arrival, the others of rank 0's). MPI errors come back
 * as statuses too (MPI_ERRORS_RETURN), never as an abort. After a failed collective the world
 * is broken (rl_dist_broken): later collectives fail at once, and rl_dist_finalize ends the
 * job with MPI_Abort, because MPI_Finalize would wait for the lost rank.
 *
 * Threads: MPI is initialised with MPI_THREAD_FUNNELED; only the thread that called
 * rl_dist_init may call the collectives.
 */
#ifndef RL_DIST_H
#define RL_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the MPI world when an MPI launcher started this process; returns RL_OK without doing
 * anything otherwise (and in a build without MPI). */
rl_status rl_dist_init(void);
/* 1 when this build has MPI. */
int rl_dist_built(void);
/* 1 when rl_dist_init joined an MPI world (of any size, 1 included). */
int rl_dist_active(void);
int rl_dist_rank(void);
int rl_dist_size(void);
/* Rank among the processes on this machine (the CUDA device of this rank); 0 without MPI. */
int rl_dist_local_rank(void);
/* The deadline of each collective in seconds (> 0). */
void rl_dist_set_timeout(double seconds);
double rl_dist_get_timeout(void);
/* 1 after a collective failed (the world cannot be used any more). */
int rl_dist_broken(void);
/* Why the world is broken ("" when it is not). */
const char *rl_dist_broken_reason(void);
/* Marks the world broken: a caller that left the ranks' common sequence of collectives (an
 * error on this rank alone) must not start another one that would pair with a different one
 * elsewhere. */
void rl_dist_set_broken(void);

/* In-place elementwise sum over all ranks of a contiguous tensor (float32, float64, int32). A
 * CPU tensor goes through MPI; a CUDA tensor through the registered device communicator (NCCL)
 * when there is one, otherwise through a host copy and MPI. Every rank must pass a tensor of
 * the same dtype and number of elements; the result is the same, bit for bit, on every rank. */
rl_status rl_dist_allreduce(rl_tensor *t);
/* Copies root's contents of a contiguous tensor into every rank's tensor of the same size. */
rl_status rl_dist_broadcast(rl_tensor *t, int root);
rl_status rl_dist_barrier(void);

/* MPI_Finalize after a normal end; MPI_Abort(code) when `failed` is set or the world is
 * broken (the others may be waiting in a collective that will never complete). No-op when the
 * world was never joined. Messages must be printed before this call. */
void rl_dist_finalize(int failed);

/* A communicator for buffers on CUDA devices (NCCL), registered by the CUDA backend. All
 * functions work on the device rl_dist chose with init; allreduce and broadcast return when
 * the operation has completed on the device, or fail once `timeout` seconds have passed (the
 * communicator is then aborted). */
typedef struct rl_dist_device_comm {
    const char *name;
    size_t id_bytes; /* size of the bootstrap id that rank 0 makes and MPI broadcasts */
    rl_status (*make_id)(void *id);
    rl_status (*init)(const void *id, int rank, int size, int device);
    rl_status (*allreduce)(void *buf, int64_t n, rl_dtype dt, double timeout);
    rl_status (*broadcast)(void *buf, size_t nbytes, int root, double timeout);
    void (*finalize)(void);
} rl_dist_device_comm;

/* Called by the CUDA backend's initialisation; the table must outlive the process. */
void rl_dist_register_device_comm(const rl_dist_device_comm *c);

#ifdef __cplusplus
}
#endif

#endif
