/* The MPI side of core/dist.h. Collectives run on a private duplicate of MPI_COMM_WORLD, so
 * MPI code of a user's own never matches them; the arrival notices of the watchdog travel on a
 * second duplicate. Each collective is started non-blocking and polled with MPI_Test: Open MPI
 * has no progress thread, so a rank only moves data while it tests, and the poll spins (giving
 * the core away with sched_yield now and then) rather than sleeping, which would stall the
 * transfer of a large buffer fragment by fragment.
 *
 * Watchdog: before collective number k, every rank other than 0 sends k to rank 0 and rank 0
 * sends k to every other rank (small eager messages that are drained at every collective). A
 * rank whose collective is still open at its deadline reads the notices that came and names
 * the ranks whose last notice is older than k: rank 0 knows all of them, the others know
 * whether rank 0 arrived. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"

static const rl_dist_device_comm *g_dev_comm;

void rl_dist_register_device_comm(const rl_dist_device_comm *c) { g_dev_comm = c; }

static double g_timeout = 300.0;

void rl_dist_set_timeout(double seconds) {
    if (seconds > 0) g_timeout = seconds;
}

double rl_dist_get_timeout(void) { return g_timeout; }

static rl_status check_buffer(const rl_tensor *t, const char *op) {
    if (t->storage == NULL) return rl_error(RL_EARG, "%s: the tensor is unset", op);
    if (!rl_tensor_is_contiguous(t)) {
        char d[96];
        return rl_error(RL_EARG, "%s: the tensor (%s) must be contiguous", op,
                        rl_tensor_describe(t, d, sizeof d));
    }
    return RL_OK;
}

/* The number of processes a launcher started, from its environment (0: no launcher); *var:
 * the variable that said so. */
static long launched_size(const char **var) {
    /* SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: an sbatch script itself has SLURM_NTASKS set,
     * and a plain rnnlua run from it is no launch (srun sets the step's variables) */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                       "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && v[0] != '\0') {
            *var = vars[i];
            return strtol(v, NULL, 10);
        }
    }
    *var = getenv("PMIX_RANK") != NULL ? "PMIX_RANK" : "PMI_RANK";
    return getenv("PMIX_RANK") != NULL || getenv("PMI_RANK") != NULL ? 1 : 0;
}

#ifndef RL_WITH_MPI

/* Several copies of a build without MPI would each train alone and write the same files. */
rl_status rl_dist_init(void) {
    const char *var = NULL;
    long n = launched_size(&var);
    if (n > 1)
        return rl_error(RL_EDEVICE,
                        "started by an MPI launcher as one of %ld processes, but this "
                        "rnnlua was built without MPI (build with MPI=1 for distributed training)",
                        n);
    return RL_OK;
}
int rl_dist_built(void) { return 0; }
int rl_dist_active(void) { return 0; }
int rl_dist_rank(void) { return 0; }
int rl_dist_size(void) { return 1; }
int rl_dist_local_rank(void) { return 0; }
int rl_dist_broken(void) { return 0; }
const char *rl_dist_broken_reason(void) { return ""; }
void rl_dist_set_broken(void) {}
rl_status rl_dist_allreduce(rl_tensor *t) { return check_buffer(t, "allreduce"); }
rl_status rl_dist_broadcast(rl_tensor *t, int root) {
    RL_TRY(check_buffer(t, "broadcast"));
    if (root != 0) return rl_error(RL_EARG, "broadcast: root %d is not a rank of 1", root);
    return RL_OK;
}
rl_status rl_dist_barrier(void) { return RL_OK; }
void rl_dist_finalize(int failed) { (void)failed; }

#else

#include <inttypes.h>
#include <mpi.h>
#include <sched.h>

enum { TAG_ARRIVE = 17 };
/* A call's signature: which collective, dtype, number of elements, root (see same_call). */
enum { SIG_OP, SIG_DTYPE, SIG_COUNT, SIG_ROOT, SIG_LEN };
enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_BARRIER };
/* MPI counts are int: larger buffers go in pieces of this many elements. */
#define MAX_PIECE ((int64_t)1 << 30)

static struct {
    int active, broken, rank, size, local_rank;
    long seq;           /* collectives started so far */
    MPI_Comm comm, ctl; /* collectives; watchdog notices */
    long *arrived;      /* the last notice from each rank (rank 0: all; others: rank 0's) */
    long *notice;       /* send buffers of the notices, one per destination */
    int64_t *sigs;      /* every rank's signature of the current call (SIG_LEN each) */
    MPI_Request *req;   /* their requests */
    int dev_ready;      /* the device communicator is set up */
    char why[512];      /* the failure that broke the world */
} g = {.rank = 0, .size = 1};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Marks the world broken by the failure whose message rl_error has just set. */
static rl_status broke(rl_status st) {
    g.broken = 1;
    snprintf(g.why, sizeof g.why, "%s", rl_errmsg());
    return st;
}

static rl_status mpi_error(const char *op, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
    return broke(rl_error(RL_EDEVICE, "%s: rank %d of %d: MPI error: %s", op, g.rank, g.size, s));
}

rl_status rl_dist_init(void) {
    int already = 0;
    MPI_Initialized(&already);
    const char *var = NULL;
    long launched = launched_size(&var);
    if (launched == 0 || already || g.active) return RL_OK;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return rl_error(RL_EDEVICE, "MPI_Init_thread failed (code %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g.active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    /* A launcher of another MPI (MPICH's mpiexec for an Open MPI build, srun --mpi=none) starts
     * N processes that each become a world of one: N copies that train alone and write the
     * same files. */
    if (launched > 1 && g.size != launched)
        return rl_error(RL_EDEVICE,
                        "started by an MPI launcher as one of %ld processes (%s), but MPI_Init "
                        "gave a world of %d: the launcher belongs to another MPI than the one "
                        "rnnlua was built with (use that MPI's mpirun)",
                        launched, var, g.size);
    if (provided < MPI_THREAD_FUNNELED)
        return rl_error(RL_EDEVICE,
                        "rank %d: the MPI library gives thread level %d, rnnlua needs "
                        "MPI_THREAD_FUNNELED",
                        g.rank, provided);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &g.comm)) != MPI_SUCCESS) return mpi_error("init", rc);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &g.ctl)) != MPI_SUCCESS) return mpi_error("init", rc);
    MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g.ctl, MPI_ERRORS_RETURN);
    MPI_Comm local;
    rc = MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) return mpi_error("init", rc);
    MPI_Comm_rank(local, &g.local_rank);
    MPI_Comm_free(&local);
    size_t n = (size_t)g.size;
    g.arrived = calloc(n, sizeof *g.arrived);
    g.notice = calloc(n, sizeof *g.notice);
    g.req = malloc(n * sizeof *g.req);
    g.sigs = calloc(n * SIG_LEN, sizeof *g.sigs);
    if (!g.arrived || !g.notice || !g.req || !g.sigs)
        return rl_error(RL_ENOMEM, "dist init: out of memory");
    for (size_t i = 0; i < n; i++)
        g.req[i] = MPI_REQUEST_NULL;
    return RL_OK;
}

int rl_dist_built(void) { return 1; }
int rl_dist_active(void) { return g.active; }
int rl_dist_rank(void) { return g.rank; }
int rl_dist_size(void) { return g.size; }
int rl_dist_local_rank(void) { return g.local_rank; }
int rl_dist_broken(void) { return g.broken; }
const char *rl_dist_broken_reason(void) { return g.broken ? g.why : ""; }
void rl_dist_set_broken(void) {
    if (!g.active || g.size == 1 || g.broken) return;
    g.broken = 1;
    snprintf(g.why, sizeof g.why,
             "rank %d left the common sequence of collectives after an error of its own", g.rank);
}

/* Reads every notice that has come in. */
static void drain_notices(void) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_ARRIVE, g.ctl, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        long k = 0;
        if (MPI_Recv(&k, 1, MPI_LONG, st.MPI_SOURCE, TAG_ARRIVE, g.ctl, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
            return;
        if (k > g.arrived[st.MPI_SOURCE]) g.arrived[st.MPI_SOURCE] = k;
    }
}

static void notify(int dest) {
    int done = 1;
    /* The previous notice to dest is normally long gone (eager); if not, this one is left out
     * and the next carries a higher number. */
    if (g.req[dest] != MPI_REQUEST_NULL) MPI_Test(&g.req[dest], &done, MPI_STATUS_IGNORE);
    if (!done) return;
    g.notice[dest] = g.seq;
    MPI_Isend(&g.notice[dest], 1, MPI_LONG, dest, TAG_ARRIVE, g.ctl, &g.req[dest]);
}

/* Starts collective number g.seq + 1: the arrival notices and the drain of earlier ones. */
static rl_status begin(const char *op) {
    if (g.broken)
        return rl_error(RL_EDEVICE,
                        "%s: rank %d of %d: the distributed world cannot be used any more "
                        "after an earlier failure: %s",
                        op, g.rank, g.size, g.why);
    g.seq++;
    g.arrived[g.rank] = g.seq;
    if (g.rank == 0) {
        for (int r = 1; r < g.size; r++)
            notify(r);
    } else {
        notify(0);
    }
    drain_notices();
    return RL_OK;
}

static rl_status timed_out(const char *op, double waited) {
    drain_notices();
    char who[256] = "";
    size_t len = 0;
    int missing = 0;
    for (int r = 0; r < g.size && len + 16 < sizeof who; r++) {
        if (g.rank != 0 && r != 0) continue; /* only rank 0's notices come here */
        if (g.arrived[r] < g.seq) {
            len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", missing ? ", " : "", r);
            missing++;
        }
    }
    if (missing > 0)
        return broke(rl_error(RL_EDEVICE,
                              "%s (collective #%ld): rank %d of %d waited %.0f s; rank%s %s "
                              "never reached it (dead or hung)",
                              op, g.seq, g.rank, g.size, waited, missing > 1 ? "s" : "", who));
    if (g.rank == 0)
        return broke(
            rl_error(RL_EDEVICE,
                     "%s (collective #%ld): rank 0 of %d waited %.0f s although every rank "
                     "reached collective #%ld: the ranks call different collectives",
                     op, g.seq, g.size, waited, g.seq));
    return broke(rl_error(RL_EDEVICE,
                          "%s (collective #%ld): rank %d of %d waited %.0f s; rank 0 reached "
                          "it, another rank did not (rank 0 names it)",
                          op, g.seq, g.rank, g.size, waited));
}

static rl_status wait_for(MPI_Request *req, const char *op) {
    double t0 = now();
    for (unsigned long i = 0;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(op, rc);
        if (done) return RL_OK;
        if ((i & 255) == 255) {
            double waited = now() - t0;
            if (waited > g_timeout) return timed_out(op, waited);
            sched_yield();
        }
    }
}

static MPI_Datatype mpi_type(rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return MPI_FLOAT;
    case RL_FLOAT64: return MPI_DOUBLE;
    case RL_INT32: return MPI_INT;
    default: return MPI_INT64_T;
    }
}

static rl_status host_allreduce(void *buf, int64_t n, rl_dtype dt);

/* An int32 sum over the ranks, made in int64: a sum beyond int32 is an error naming the
 * element, on every rank alike (each sees the same sums), and leaves buf as it was. MPI's own
 * int32 sum would wrap without a word (counts of frames or errors over a large world). */
static rl_status host_allreduce_int32(int32_t *buf, int64_t n) {
    int64_t *wide = malloc((size_t)(n ? n : 1) * sizeof *wide);
    if (wide == NULL)
        return rl_error(RL_ENOMEM, "allreduce: no memory to sum %" PRId64 " int32 elements", n);
    for (int64_t i = 0; i < n; i++)
        wide[i] = buf[i];
    rl_status s = host_allreduce(wide, n, RL_NUM_DTYPES);
    for (int64_t i = 0; s == RL_OK && i < n; i++)
        if (wide[i] < INT32_MIN || wide[i] > INT32_MAX)
            s = rl_error(RL_EARG,
                         "allreduce of %" PRId64 " int32 elements: element %" PRId64
                         " sums to %" PRId64 " over the ranks, beyond int32 (use float64)",
                         n, i + 1, wide[i]);
    if (s == RL_OK)
        for (int64_t i = 0; i < n; i++)
            buf[i] = (int32_t)wide[i];
    free(wide);
    return s;
}

/* dt RL_NUM_DTYPES stands for int64 elements (host_allreduce_int32's sums). */
static rl_status host_allreduce(void *buf, int64_t n, rl_dtype dt) {
    if (dt == RL_INT32) return host_allreduce_int32(buf, n);
    size_t es = dt == RL_NUM_DTYPES ? sizeof(int64_t) : rl_dtype_size(dt);
    for (int64_t off = 0; off < n; off += MAX_PIECE) {
        int count = (int)(n - off < MAX_PIECE ? n - off : MAX_PIECE);
        RL_TRY(begin("allreduce"));
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)off * es, count, mpi_type(dt),
                                MPI_SUM, g.comm, &req);
        if (rc != MPI_SUCCESS) return mpi_error("allreduce", rc);
        RL_TRY(wait_for(&req, "allreduce"));
    }
    return RL_OK;
}

static rl_status host_broadcast(void *buf, size_t nbytes, int root) {
    for (size_t off = 0; off < nbytes; off += (size_t)MAX_PIECE) {
        size_t left = nbytes - off;
        int count = (int)(left < (size_t)MAX_PIECE ? left : (size_t)MAX_PIECE);
        RL_TRY(begin("broadcast"));
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + off, count, MPI_BYTE, root, g.comm, &req);
        if (rc != MPI_SUCCESS) return mpi_error("broadcast", rc);
        RL_TRY(wait_for(&req, "broadcast"));
    }
    return RL_OK;
}

/* "allreduce of 4 float32 elements" */
static int describe_sig(char *out, size_t cap, const int64_t *sig) {
    static const char *const ops[] = {"?", "allreduce", "broadcast", "barrier"};
    const char *op = sig[SIG_OP] >= 1 && sig[SIG_OP] <= 3 ? ops[sig[SIG_OP]] : ops[0];
    if (sig[SIG_OP] == OP_BARRIER) return snprintf(out, cap, "%s", op);
    const char *dt = sig[SIG_DTYPE] >= 0 && sig[SIG_DTYPE] < RL_NUM_DTYPES
                         ? rl_dtype_name((rl_dtype)sig[SIG_DTYPE])
                         : "?";
    if (sig[SIG_OP] == OP_BROADCAST)
        return snprintf(out, cap, "%s of %lld %s elements from root %lld", op,
                        (long long)sig[SIG_COUNT], dt, (long long)sig[SIG_ROOT]);
    return snprintf(out, cap, "%s of %lld %s elements", op, (long long)sig[SIG_COUNT], dt);
}

/* Before each collective the ranks exchange what they are about to do (an allgather of a few
 * numbers, itself always the same call on every rank): MPI leaves a call with different counts,
 * dtypes, roots or operations undefined, and Open MPI then fails with an opaque error, aborts,
 * or (a broadcast into a larger buffer) silently leaves part of it as it was. On a mismatch
 * every rank fails alike, with a message naming each rank that differs from rank 0; no data
 * has moved, and the ranks are still paired, so the world stays usable. */
static rl_status same_call(const char *op, int kind, rl_dtype dt, int64_t count, int root) {
    int64_t mine[SIG_LEN] = {kind, kind == OP_BARRIER ? -1 : (int64_t)dt,
                             kind == OP_BARRIER ? 0 : count, kind == OP_BROADCAST ? root : 0};
    RL_TRY(begin(op));
    MPI_Request req;
    int rc = MPI_Iallgather(mine, SIG_LEN, MPI_INT64_T, g.sigs, SIG_LEN, MPI_INT64_T, g.comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(op, rc);
    RL_TRY(wait_for(&req, op));
    char msg[640], d[160];
    size_t len = 0;
    int differ = 0;
    for (int r = 1; r < g.size; r++) {
        if (memcmp(g.sigs + (size_t)r * SIG_LEN, g.sigs, sizeof mine) == 0) continue;
        if (++differ > 4) continue; /* counted, not listed */
        describe_sig(d, sizeof d, g.sigs + (size_t)r * SIG_LEN);
        if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "; rank %d: %s", r, d);
    }
    if (differ == 0) return RL_OK;
    describe_sig(d, sizeof d, g.sigs);
    return rl_error(RL_EARG,
                    "%s (collective #%ld): the ranks called different collectives or passed "
                    "different tensors (every rank must pass the same dtype and number of "
                    "elements): rank 0: %s%s%s",
                    op, g.seq, d, msg, differ > 4 ? " (and more ranks)" : "");
}

rl_status rl_dist_barrier(void) {
    if (!g.active || g.size == 1) return RL_OK;
    RL_TRY(same_call("barrier", OP_BARRIER, RL_FLOAT32, 0, 0));
    RL_TRY(begin("barrier"));
    MPI_Request req;
    int rc = MPI_Ibarrier(g.comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error("barrier", rc);
    return wait_for(&req, "barrier");
}

/* Sets up the device communicator on `device` once: rank 0 makes the id, MPI carries it (with
 * rank 0's status, so that every rank fails alike when it could not). */
static rl_status device_comm_ready(int device, const char *op) {
    if (g.dev_ready) return RL_OK;
    size_t nb = sizeof(int) + g_dev_comm->id_bytes;
    char *msg = calloc(1, nb);
    if (msg == NULL) return rl_error(RL_ENOMEM, "%s: out of memory", op);
    int st = RL_OK;
    if (g.rank == 0) st = g_dev_comm->make_id(msg + sizeof(int));
    memcpy(msg, &st, sizeof st);
    rl_status s = host_broadcast(msg, nb, 0);
    if (s == RL_OK) {
        memcpy(&st, msg, sizeof st);
        if (st != RL_OK)
            s = g.rank == 0 ? (rl_status)st
                            : rl_error(RL_EDEVICE, "%s: rank 0 could not make the %s id", op,
                                       g_dev_comm->name);
        else
            s = g_dev_comm->init(msg + sizeof(int), g.rank, g.size, device);
    }
    free(msg);
    if (s != RL_OK) return broke(s);
    g.dev_ready = 1;
    return RL_OK;
}

/* A CUDA tensor without a device communicator: through a host copy. */
static rl_status via_host(rl_tensor *t, int root, int reduce) {
    size_t nb = (size_t)rl_tensor_numel(t) * rl_dtype_size(t->dtype);
    void *h = malloc(nb ? nb : 1);
    if (h == NULL) return rl_error(RL_ENOMEM, "dist: no host memory for %zu bytes", nb);
    rl_device dev = rl_tensor_device(t);
    rl_status s = rl_device_memcpy(h, RL_DEVICE_CPU, rl_tensor_data(t), dev, nb);
    if (s == RL_OK)
        s = reduce ? host_allreduce(h, rl_tensor_numel(t), t->dtype) : host_broadcast(h, nb, root);
    if (s == RL_OK) s = rl_device_memcpy(rl_tensor_data(t), dev, h, RL_DEVICE_CPU, nb);
    free(h);
    return s;
}

static rl_status collective(rl_tensor *t, int root, int reduce) {
    const char *op = reduce ? "allreduce" : "broadcast";
    RL_TRY(check_buffer(t, op));
    if (!reduce && (root < 0 || root >= g.size))
        return rl_error(RL_EARG, "broadcast: root %d is not a rank of 0..%d", root, g.size - 1);
    if (!g.active || g.size == 1) return RL_OK;
    int64_t n = rl_tensor_numel(t);
    RL_TRY(same_call(op, reduce ? OP_ALLREDUCE : OP_BROADCAST, t->dtype, n, root));
    size_t nb = (size_t)n * rl_dtype_size(t->dtype);
    rl_device dev = rl_tensor_device(t);
    if (dev.type == RL_CPU)
        return reduce ? host_allreduce(rl_tensor_data(t), n, t->dtype)
                      : host_broadcast(rl_tensor_data(t), nb, root);
    /* int32 sums are checked for overflow on the host */
    if (g_dev_comm == NULL || (reduce && t->dtype == RL_INT32)) return via_host(t, root, reduce);
    RL_TRY(device_comm_ready(dev.index, op));
    /* the device collective has its own deadline; the barrier-free notices still mark it */
    RL_TRY(begin(op));
    rl_status s = reduce ? g_dev_comm->allreduce(rl_tensor_data(t), n, t->dtype, g_timeout)
                         : g_dev_comm->broadcast(rl_tensor_data(t), nb, root, g_timeout);
    return s == RL_OK ? s : broke(s);
}

rl_status rl_dist_allreduce(rl_tensor *t) { return collective(t, 0, 1); }
rl_status rl_dist_broadcast(rl_tensor *t, int root) { return collective(t, root, 0); }

void rl_dist_finalize(int failed) {
    if (!g.active) return;
    if (g.dev_ready && g_dev_comm->finalize) g_dev_comm->finalize();
    g.dev_ready = 0;
    if (failed || g.broken) {
        if (g.rank != 0 && g.size > 1) {
            /* rank 0's message, which names the lost rank, goes out before the job ends */
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int r = 0; r < g.size; r++)
        if (g.req[r] != MPI_REQUEST_NULL) MPI_Wait(&g.req[r], MPI_STATUS_IGNORE);
    /* notices nobody read must not stay queued at MPI_Finalize */
    MPI_Barrier(g.ctl);
    drain_notices();
    MPI_Comm_free(&g.ctl);
    MPI_Comm_free(&g.comm);
    free(g.arrived);
    free(g.notice);
    free(g.req);
    free(g.sigs);
    g.active = 0;
    MPI_Finalize();
}

#endif
