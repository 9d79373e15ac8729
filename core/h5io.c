/* HDF5 files of tensors (see h5io.h): open/create-and-commit, datasets of tensors and strings,
 * recursive listing, attributes.
 *
 * Every function releases each HDF5 handle it opened before it returns, on every path: the
 * handles are initialised to H5I_INVALID_HID and closed once at a single exit label. HDF5's
 * error stack is read only to add its innermost reason to our message, then cleared.
 */
#include "h5io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct rl_h5file {
    hid_t id;
    char *path;       /* the final path */
    char *tmp;        /* the temporary file of a created, not yet committed file; NULL otherwise */
    bool refuse_vlen; /* rl_h5_refuse_vlen was called */
};

/* Called before every open or create, so first of all HDF5 calls. H5dont_atexit (before the
 * library initialises; a no-op later) keeps libhdf5 1.10 from closing files itself at exit:
 * after an H5Fclose that failed (a full disk while saving) the half-closed file makes that
 * exit-time close crash. rnnlua closes or commits its files itself (a created file not committed
 * is a temporary one, removed by rl_h5_close). */
static void h5_quiet(void) {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void h5_close_id(hid_t *id, herr_t (*closer)(hid_t)) {
    if (*id >= 0) closer(*id);
    *id = H5I_INVALID_HID;
}

/* HDF5's error stack is walked from the most specific entry: the first one with a description
 * says what was actually wrong ("truncated file: eof = ...", "no write intent on file"). */
typedef struct {
    char text[256];
} h5_reason;

static herr_t h5_reason_cb(unsigned n, const H5E_error2_t *e, void *data) {
    h5_reason *r = data;
    if (r->text[0] != '\0' || !e->desc || !e->desc[0]) return 0;
    /* a failed read or write of the file driver: "file write failed: time = <date>\n,
     * filename = ..., errno = 28, error message = 'No space left on device', buf = ...": its
     * first words and the system's message */
    const char *msg = strstr(e->desc, "error message = '"), *colon = strchr(e->desc, ':');
    if (msg && colon && colon < msg) {
        msg += strlen("error message = '");
        const char *end = strchr(msg, '\'');
        snprintf(r->text, sizeof r->text, "%.*s: %.*s", (int)(colon - e->desc), e->desc,
                 (int)(end ? end - msg : (ptrdiff_t)strlen(msg)), msg);
    } else {
        snprintf(r->text, sizeof r->text, "%s", e->desc);
    }
    return 0;
}

/* RL_EIO with "<file>: <object>: <what>", plus HDF5's reason for the failure that just
 * happened (call it right after the failing HDF5 call). */
static rl_status h5_fail(const char *path, const char *obj, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static rl_status h5_fail(const char *path, const char *obj, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    h5_reason r = {{0}};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_reason_cb, &r);
    H5Eclear2(H5E_DEFAULT);
    char head[1024];
    if (obj)
        snprintf(head, sizeof head, "%s: %s: %s", path, obj, what);
    else
        snprintf(head, sizeof head, "%s: %s", path, what);
    if (r.text[0]) return rl_error(RL_EIO, "%s (HDF5: %s)", head, r.text);
    return rl_error(RL_EIO, "%s", head);
}

/* Paths inside the file are taken relative to the root; a leading "/" is dropped. */
static const char *h5_rel(const char *name) {
    if (!name) return "";
    while (*name == '/')
        name++;
    return name;
}

static hid_t h5_native(rl_dtype dt) {
    switch (dt) {
    case RL_FLOAT32: return H5T_NATIVE_FLOAT;
    case RL_FLOAT64: return H5T_NATIVE_DOUBLE;
    case RL_INT32: return H5T_NATIVE_INT;
    default: return H5I_INVALID_HID;
    }
}

static hid_t h5_fapl(void) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0) H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    return fapl;
}

/* Link creation that makes the missing groups of a path and stores names as UTF-8 (as h5py). */
static hid_t h5_lcpl(void) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl >= 0) {
        H5Pset_create_intermediate_group(lcpl, 1);
        H5Pset_char_encoding(lcpl, H5T_CSET_UTF8);
    }
    return lcpl;
}

/* 1 when every component of `rel` exists, 0 when one is missing, -1 on an HDF5 error. H5Lexists
 * fails rather than answering "no" when an intermediate group is missing, hence the walk. */
static int h5_path_exists(hid_t loc, const char *rel) {
    if (!*rel) return 1;
    char *buf = strdup(rel);
    if (!buf) return -1;
    int result = 1;
    for (char *p = buf;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            htri_t e = H5Lexists(loc, buf, H5P_DEFAULT);
            if (e <= 0) {
                result = e < 0 ? -1 : 0;
                break;
            }
            if (c == '\0') break;
            *p = c;
        }
    }
    free(buf);
    return result;
}

static void h5_file_free(rl_h5file *f) {
    free(f->path);
    free(f->tmp);
    free(f);
}

/* ---- work that libhdf5 may crash or hang on, in a child process ----
 *
 * libhdf5 1.10 trusts what a file says in several places (global heap object sizes, B-tree and
 * heap addresses of dense groups): a crafted file crashes it, and no check from outside its API
 * can rule that out. So rl_h5_open first touches the whole file in a forked child (h5_probe):
 * the child does it and exits (with _exit: no handlers run, nothing is flushed into the file), the
 * parent waits for it with a deadline, and a crash (a signal, or a sanitizer's exit status) or a
 * hang becomes RL_EIO naming the file. The child's stderr goes to /dev/null. */

typedef struct {
    pid_t pid;
    int fd; /* read end of the child's pipe; EOF when the child is gone */
    double deadline, seconds;
    bool late;
} h5_child;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The base deadline of a child, in seconds: RNNLUA_H5_CHILD_SECONDS (the fuzz targets lower
 * it), 30 by default. */
static double h5_child_seconds(void) {
    const char *e = getenv("RNNLUA_H5_CHILD_SECONDS");
    double v = e ? atof(e) : 0;
    return v > 0 ? v : 30.0;
}

/* In a child: the write end of its pipe, for what it reports to the parent. */
static int h5_child_pipe = -1;

/* Forks a child that runs fn(ctx) and exits with its return value; the pipe's write end is
 * held by the child only (h5_child_pipe there), so the parent sees its end as EOF. */
static rl_status h5_child_start(h5_child *c, const char *path, const char *obj, int (*fn)(void *),
                                void *ctx, double seconds) {
    int fds[2];
    if (pipe(fds) != 0)
        return rl_error(RL_EIO, "%s: %s: cannot make a pipe: %s", path, obj ? obj : "",
                        strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return rl_error(RL_EIO, "%s: cannot fork: %s", path, strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        h5_child_pipe = fds[1];
        _exit(fn(ctx));
    }
    close(fds[1]);
    *c = (h5_child){pid, fds[0], now_s() + seconds, seconds, false};
    return RL_OK;
}

/* Reads what the child wrote: > 0 bytes, 0 at its end or at the deadline (c->late). */
static ssize_t h5_child_read(h5_child *c, void *buf, size_t n) {
    for (;;) {
        double left = c->deadline - now_s();
        if (left <= 0) {
            c->late = true;
            return 0;
        }
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r <= 0) continue; /* EINTR or the timeout: the deadline is checked above */
        ssize_t k = read(c->fd, buf, n);
        if (k < 0 && errno == EINTR) continue;
        return k > 0 ? k : 0;
    }
}

/* Waits for the child's end (killing it at the deadline): its exit status, or -1 for a signal
 * or the deadline. */
static int h5_child_finish(h5_child *c) {
    char sink[4096];
    while (h5_child_read(c, sink, sizeof sink) > 0) {
    }
    if (c->late) kill(c->pid, SIGKILL);
    close(c->fd);
    int status = 0;
    while (waitpid(c->pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (c->late || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static rl_status h5_child_error(const h5_child *c, const char *path, const char *obj,
                                const char *what, int code) {
    char where[1024];
    snprintf(where, sizeof where, "%s%s%s", path, obj ? ": " : "", obj ? obj : "");
    if (c->late)
        return rl_error(RL_EIO,
                        "%s: %s did not finish in %.0f s (libhdf5 hangs on it): the file is "
                        "corrupt",
                        where, what, c->seconds);
    return rl_error(RL_EIO, "%s: libhdf5 crashed %s (%s): the file is corrupt", where, what,
                    code < 0 ? "killed by a signal" : "a sanitizer's report");
}

/* The probe run by rl_h5_open: open the file and touch everything rnnlua may later read (every
 * link, object and attribute, the attributes' values, the datasets' types, layouts and chunk
 * indexes, the values of datasets up to 64 MiB and of every variable-length string, whose
 * global heap is where libhdf5 trusts the file most). Failures of libhdf5 are fine here (the
 * parent reports them where they happen); what the probe catches is a crash or a hang. */
static herr_t probe_attr(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    (void)info, (void)data;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return 0;
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    if (t >= 0 && n >= 0 && n <= (1 << 20)) {
        if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0) {
            hid_t m = H5Tcopy(H5T_C_S1);
            char **buf = calloc((size_t)n + 1, sizeof *buf);
            if (m >= 0 && buf && H5Tset_size(m, H5T_VARIABLE) >= 0 &&
                H5Tset_cset(m, H5Tget_cset(t)) >= 0 && H5Aread(a, m, buf) >= 0)
                H5Dvlen_reclaim(m, sp, H5P_DEFAULT, buf);
            free(buf);
            if (m >= 0) H5Tclose(m);
        } else {
            size_t sz = H5Tget_size(t);
            void *buf = sz > 0 && sz <= (1 << 20) ? calloc((size_t)n + 1, sz) : NULL;
            if (buf) H5Aread(a, t, buf);
            free(buf);
        }
    }
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return 0;
}

static void probe_dataset(hid_t d) {
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
    hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    size_t sz = t >= 0 ? H5Tget_size(t) : 0;
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t nchunks = 0;
        if (H5Dget_num_chunks(d, H5S_ALL, &nchunks) >= 0)
            for (hsize_t i = 0; i < nchunks && i < 1000000; i++) {
                hsize_t off[32], size;
                unsigned mask;
                haddr_t addr;
                H5Dget_chunk_info(d, H5S_ALL, i, off, &mask, &addr, &size);
            }
    }
    bool vlen = t >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0;
    if (t >= 0 && n >= 0 && sz > 0 && (vlen || (double)n * (double)sz <= 64.0 * (1 << 20))) {
        hid_t m = vlen ? H5Tcopy(H5T_C_S1) : H5Tget_native_type(t, H5T_DIR_DEFAULT);
        if (vlen && m >= 0) {
            H5Tset_size(m, H5T_VARIABLE);
            H5Tset_cset(m, H5Tget_cset(t));
        }
        size_t msz = m >= 0 ? H5Tget_size(m) : 0;
        void *buf = msz > 0 ? calloc((size_t)n + 1, msz) : NULL;
        if (buf && H5Dread(d, m, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0 && vlen)
            H5Dvlen_reclaim(m, sp, H5P_DEFAULT, buf);
        free(buf);
        if (m >= 0) H5Tclose(m);
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
}

static herr_t probe_obj(hid_t root, const char *name, const H5O_info_t *info, void *data) {
    (void)data;
    hid_t o = H5Oopen(root, name, H5P_DEFAULT);
    if (o < 0) return 0;
    H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, probe_attr, NULL);
    if (info->type == H5O_TYPE_DATASET) probe_dataset(o);
    H5Oclose(o);
    return 0;
}

static herr_t probe_link(hid_t root, const char *name, const H5L_info_t *info, void *data) {
    (void)info, (void)data;
    H5Lexists(root, name, H5P_DEFAULT);
    return 0;
}

/* The memory the probe may grow by, in bytes, for a file of `size` bytes. libhdf5 allocates
 * for a variable-length string the length the file states, and a crafted length made a 6 KB
 * file take 900 MiB in the reader (and in rnnlua after the probe, whose reads are the same). The
 * probe's own reads take at most its 64 MiB datasets, converted, and libhdf5's caches: well under
 * 256 MiB beside what the file's bytes can hold. */
static double probe_budget(double size) { return 256.0 * (1 << 20) + 4.0 * size; }

/* peak resident set of this process, bytes */
static double peak_rss(void) {
    struct rusage r;
    return getrusage(RUSAGE_SELF, &r) == 0 ? (double)r.ru_maxrss * 1024.0 : 0.0;
}

/* Exits 0 whatever libhdf5 says of the file; when reading it took more memory than the file's
 * size allows, writes that many MiB to the pipe. The peak resident set a child starts with is
 * what it shares with the parent, so the growth is counted from there. */
static int probe_child(void *ctx) {
    const char *path = ctx;
    double before = peak_rss();
    struct stat st;
    if (stat(path, &st) != 0 || H5Fis_hdf5(path) <= 0) return 0;
    hid_t fapl = h5_fapl();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f < 0) return 0;
    H5Lvisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, probe_link, NULL);
    H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, probe_obj, NULL);
    double grew = peak_rss() - before;
    if (grew > probe_budget((double)st.st_size)) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "%.0f", grew / (1 << 20));
        if (write(h5_child_pipe, msg, (size_t)n) != n) return 1;
    }
    return 0;
}

static rl_status h5_probe(const char *path) {
    h5_child c;
    RL_TRY(h5_child_start(&c, path, NULL, probe_child, (void *)path, h5_child_seconds()));
    char mib[32];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof mib - 1 && (k = h5_child_read(&c, mib + got, sizeof mib - 1 - got)) > 0)
        got += (size_t)k;
    mib[got] = '\0';
    int code = h5_child_finish(&c);
    if (code != 0) return h5_child_error(&c, path, NULL, "reading the file's structure", code);
    if (got > 0) {
        struct stat st;
        double size = stat(path, &st) == 0 ? (double)st.st_size : 0;
        return rl_error(RL_EIO,
                        "%s: reading the file's structure took %s MiB of memory, more than a file "
                        "of %.0f bytes can need (at most %.0f MiB): a length in it is corrupt or "
                        "crafted",
                        path, mib, size, probe_budget(size) / (1 << 20));
    }
    return RL_OK;
}

/* This host's name for temporary files: gethostname's, '/' made '_' (never seen, but a file
 * name part), "unknown" when there is none. */
static void h5_host(char *host, size_t n) {
    if (gethostname(host, n) != 0 || host[0] == '\0') snprintf(host, n, "unknown");
    host[n - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
}

void rl_h5_temp_name(const char *path, char *buf, size_t n) {
    char host[65];
    h5_host(host, sizeof host);
    snprintf(buf, n, "%s.tmp.%s.%ld", path, host, (long)getpid());
}

static rl_status h5_file_new(rl_h5file **out, const char *path, bool temporary) {
    rl_h5file *f = calloc(1, sizeof *f);
    if (!f) return rl_error(RL_ENOMEM, "%s: out of memory", path);
    f->id = H5I_INVALID_HID;
    f->path = strdup(path);
    if (f->path && temporary) {
        size_t n = strlen(path) + 100;
        f->tmp = malloc(n);
        if (f->tmp) rl_h5_temp_name(path, f->tmp, n);
    }
    if (!f->path || (temporary && !f->tmp)) {
        h5_file_free(f);
        return rl_error(RL_ENOMEM, "%s: out of memory", path);
    }
    *out = f;
    return RL_OK;
}

rl_status rl_h5_open(rl_h5file **out, const char *path, bool writable) {
    *out = NULL;
    h5_quiet();
    struct stat st;
    if (stat(path, &st) != 0) return rl_error(RL_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return rl_error(RL_EIO, "%s: cannot open: is a directory", path);
    /* HDF5 seeks: a FIFO can never be read (its open would also wait for a writer, forever),
     * nor a device or a socket */
    if (!S_ISREG(st.st_mode))
        return rl_error(RL_EIO, "%s: cannot open: not a regular file (a FIFO, device or socket)",
                        path);
    if (access(path, R_OK) != 0)
        return rl_error(RL_EIO, "%s: cannot open: %s", path, strerror(errno));
    RL_TRY(h5_probe(path));
    if (H5Fis_hdf5(path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return rl_error(RL_EIO, "%s: not an HDF5 file", path);
    }
    rl_h5file *f;
    RL_TRY(h5_file_new(&f, path, false));
    hid_t fapl = h5_fapl();
    f->id = H5Fopen(path, writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
    if (f->id < 0) {
        rl_status s = h5_fail(path, NULL, "cannot open (truncated or corrupt file?)");
        h5_close_id(&fapl, H5Pclose);
        h5_file_free(f);
        return s;
    }
    h5_close_id(&fapl, H5Pclose);
    *out = f;
    return RL_OK;
}

/* A save killed before its commit leaves PATH.tmp.HOST.PID behind. The next save of PATH on
 * HOST removes those of processes that no longer exist (kill(pid, 0) fails with ESRCH); a live
 * process's file, perhaps a concurrent save, and another host's are left alone (PATH.tmp.PID,
 * the older name, counts as this host's). Best effort: failures change nothing. */
static void h5_remove_stale_tmp(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    char dir[4096], prefix[512];
    if (dir_len + 1 >= sizeof dir) return;
    if (!slash)
        strcpy(dir, ".");
    else if (dir_len == 0)
        strcpy(dir, "/");
    else
        memcpy(dir, path, dir_len), dir[dir_len] = '\0';
    if ((size_t)snprintf(prefix, sizeof prefix, "%s.tmp.", base) >= sizeof prefix) return;
    size_t plen = strlen(prefix);
    char host[65];
    h5_host(host, sizeof host);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0) continue;
        const char *digits = e->d_name + plen, *dot = strrchr(digits, '.');
        if (dot) { /* HOST.PID: this host's only */
            if ((size_t)(dot - digits) != strlen(host) || strncmp(digits, host, strlen(host)) != 0)
                continue;
            digits = dot + 1;
        }
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (*digits < '0' || *digits > '9' || *end != '\0' || errno != 0 || pid <= 0 ||
            pid == (long)getpid() || pid > INT32_MAX)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char full[4096 + 512];
        if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, e->d_name) < sizeof full)
            unlink(full);
    }
    closedir(d);
}

rl_status rl_h5_create(rl_h5file **out, const char *path) {
    *out = NULL;
    h5_quiet();
    rl_h5file *f;
    RL_TRY(h5_file_new(&f, path, true));
    h5_remove_stale_tmp(path);
    hid_t fapl = h5_fapl();
    f->id = H5Fcreate(f->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (f->id < 0) {
        rl_status s = h5_fail(path, NULL, "cannot create the temporary file %s", f->tmp);
        /* on a full disk the file exists, empty: the superblock's write is what failed */
        unlink(f->tmp);
        h5_close_id(&fapl, H5Pclose);
        h5_file_free(f);
        return s;
    }
    h5_close_id(&fapl, H5Pclose);
    *out = f;
    return RL_OK;
}

/* The data must be on disk before the rename makes it the file at `path`. */
static rl_status h5_fsync(const rl_h5file *f) {
    int fd = open(f->tmp, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return rl_error(RL_EIO, "%s: cannot sync %s: %s", f->path, f->tmp, strerror(e));
    }
    close(fd);
    return RL_OK;
}

rl_status rl_h5_commit(rl_h5file *f) {
    rl_status s = RL_OK;
    if (H5Fclose(f->id) < 0)
        s = h5_fail(f->path, NULL, "closing %s failed", f->tmp ? f->tmp : f->path);
    f->id = H5I_INVALID_HID;
    if (s == RL_OK && f->tmp) {
        s = h5_fsync(f);
        if (s == RL_OK && rename(f->tmp, f->path) != 0)
            s = rl_error(RL_EIO, "%s: cannot rename %s over it: %s", f->path, f->tmp,
                         strerror(errno));
    }
    if (s != RL_OK && f->tmp) unlink(f->tmp);
    h5_file_free(f);
    return s;
}

void rl_h5_close(rl_h5file *f) {
    if (!f) return;
    if (f->id >= 0) H5Fclose(f->id);
    if (f->tmp) unlink(f->tmp);
    H5Eclear2(H5E_DEFAULT);
    h5_file_free(f);
}

const char *rl_h5_path(const rl_h5file *f) { return f->path; }

int64_t rl_h5_open_handles(const rl_h5file *f) {
    return (int64_t)H5Fget_obj_count(f->id, H5F_OBJ_ALL | H5F_OBJ_LOCAL) - 1;
}

/* ---- writing tensors ---- */

/* A CPU tensor's elements in row-major order: the tensor's own memory when it is contiguous,
 * else a gathered copy (*owned set; free it). Empty tensors give NULL. */
static rl_status h5_pack(const char *path, const char *obj, const rl_tensor *t, const void **buf,
                         void **owned) {
    *buf = NULL;
    *owned = NULL;
    if (!t->storage) return rl_error(RL_EARG, "%s: %s: the tensor is unset", path, obj);
    if (t->storage->device.type != RL_CPU) {
        char d[32];
        rl_device_name(t->storage->device, d, sizeof d);
        return rl_error(RL_EDEVICE, "%s: %s: the tensor is on %s; copy it to the CPU first", path,
                        obj, d);
    }
    if (h5_native(t->dtype) < 0)
        return rl_error(RL_EDTYPE, "%s: %s: unsupported dtype %d", path, obj, (int)t->dtype);
    int64_t n = rl_tensor_numel(t);
    if (n == 0) return RL_OK;
    if (rl_tensor_is_contiguous(t)) {
        *buf = rl_tensor_data(t);
        return RL_OK;
    }
    size_t es = rl_dtype_size(t->dtype);
    char *dst = malloc((size_t)n * es);
    if (!dst)
        return rl_error(RL_ENOMEM, "%s: %s: out of memory packing %lld elements", path, obj,
                        (long long)n);
    const char *src = rl_tensor_data(t);
    int64_t idx[RL_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->stride[d];
        memcpy(dst + (size_t)i * es, src + off * (int64_t)es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    *buf = dst;
    *owned = dst;
    return RL_OK;
}

static hid_t h5_space_of(int ndim, const int64_t *shape) {
    if (ndim == 0) return H5Screate(H5S_SCALAR);
    hsize_t dims[RL_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        dims[d] = (hsize_t)shape[d];
    return H5Screate_simple(ndim, dims, NULL);
}

/* Removes the link `rel` when it exists, so that a write replaces it. */
static rl_status h5_unlink_existing(rl_h5file *f, const char *rel) {
    int e = h5_path_exists(f->id, rel);
    if (e < 0) return h5_fail(f->path, rel, "cannot look up");
    if (e > 0 && H5Ldelete(f->id, rel, H5P_DEFAULT) < 0)
        return h5_fail(f->path, rel, "cannot replace the existing object");
    return RL_OK;
}

rl_status rl_h5_write_tensor(rl_h5file *f, const char *name, const rl_tensor *t) {
    const char *rel = h5_rel(name);
    if (!*rel) return rl_error(RL_EARG, "%s: empty dataset name", f->path);
    const void *buf;
    void *owned;
    RL_TRY(h5_pack(f->path, rel, t, &buf, &owned));
    rl_status s = h5_unlink_existing(f, rel);
    hid_t space = H5I_INVALID_HID, lcpl = H5I_INVALID_HID, ds = H5I_INVALID_HID;
    if (s != RL_OK) goto done;
    hid_t mtype = h5_native(t->dtype);
    space = h5_space_of(t->ndim, t->shape);
    lcpl = h5_lcpl();
    if (space < 0 || lcpl < 0) {
        s = h5_fail(f->path, rel, "cannot describe the dataset");
        goto done;
    }
    ds = H5Dcreate2(f->id, rel, mtype, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (ds < 0) {
        s = h5_fail(f->path, rel, "cannot create the dataset");
        goto done;
    }
    if (buf && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        s = h5_fail(f->path, rel, "cannot write the dataset");
done:
    h5_close_id(&ds, H5Dclose);
    h5_close_id(&lcpl, H5Pclose);
    h5_close_id(&space, H5Sclose);
    free(owned);
    return s;
}

/* ---- reading tensors ---- */

/* The dtype a stored type reads as. Integers that might not fit int32 (4-byte unsigned, 8-byte)
 * go through int64 (*wide) and are range-checked, because HDF5 would clamp them silently. */
static rl_status h5_pick_dtype(const char *path, const char *obj, hid_t ftype, rl_dtype *dt,
                               hid_t *mtype, bool *wide) {
    H5T_class_t cls = H5Tget_class(ftype);
    size_t size = H5Tget_size(ftype);
    *wide = false;
    if (cls == H5T_INTEGER) {
        *dt = RL_INT32;
        *mtype = H5T_NATIVE_INT;
        if (size > 4 || (size == 4 && H5Tget_sign(ftype) == H5T_SGN_NONE)) {
            *wide = true;
            *mtype = H5T_NATIVE_LLONG;
        }
        return RL_OK;
    }
    if (cls == H5T_FLOAT) {
        *dt = size >= 8 ? RL_FLOAT64 : RL_FLOAT32;
        *mtype = size >= 8 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
        return RL_OK;
    }
    static const char *const names[] = {"integer",  "float",  "time",     "string",
                                        "bitfield", "opaque", "compound", "reference",
                                        "enum",     "vlen",   "array"};
    const char *cname =
        cls >= 0 && cls < (int)(sizeof names / sizeof names[0]) ? names[cls] : "unknown";
    H5Eclear2(H5E_DEFAULT);
    return rl_error(RL_EIO, "%s: %s: unsupported type (HDF5 class %s); numbers are expected", path,
                    obj, cname);
}

/* ndim and shape of a dataspace; scalar is 0-dim, more than RL_MAX_DIMS is an error. */
static rl_status h5_space_shape(const char *path, const char *obj, hid_t space, int *ndim,
                                int64_t *shape) {
    H5S_class_t cls = H5Sget_simple_extent_type(space);
    if (cls == H5S_SCALAR) {
        *ndim = 0;
        return RL_OK;
    }
    if (cls != H5S_SIMPLE) return h5_fail(path, obj, "has no data (null dataspace)");
    int nd = H5Sget_simple_extent_ndims(space);
    if (nd < 0) return h5_fail(path, obj, "cannot read the dataspace");
    if (nd > RL_MAX_DIMS)
        return rl_error(RL_EIO, "%s: %s: has %d dims, at most %d are supported", path, obj, nd,
                        RL_MAX_DIMS);
    hsize_t dims[RL_MAX_DIMS];
    H5Sget_simple_extent_dims(space, dims, NULL);
    for (int d = 0; d < nd; d++)
        shape[d] = (int64_t)dims[d];
    *ndim = nd;
    return RL_OK;
}

/* Reads a dataset (selection fspace into mspace) or, when `is_attr`, a whole attribute, into a
 * new tensor of the given shape. */
static rl_status h5_read_numeric(const char *path, const char *obj, hid_t id, bool is_attr,
                                 hid_t ftype, hid_t mspace, hid_t fspace, int ndim,
                                 const int64_t *shape, rl_tensor *out) {
    rl_dtype dt;
    hid_t mtype;
    bool wide;
    RL_TRY(h5_pick_dtype(path, obj, ftype, &dt, &mtype, &wide));
    rl_tensor t = {0};
    /* the shape is the file's: a crafted one may be far too large, and the error names where */
    rl_status st = rl_tensor_empty(&t, dt, RL_DEVICE_CPU, ndim, shape);
    if (st != RL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", rl_errmsg());
        return rl_error(st, "%s: %s: %s", path, obj, why);
    }
    int64_t n = rl_tensor_numel(&t);
    if (n == 0) {
        *out = t;
        return RL_OK;
    }
    long long *tmp = NULL;
    if (wide) {
        tmp = malloc((size_t)n * sizeof *tmp);
        if (!tmp) {
            rl_tensor_release(&t);
            return rl_error(RL_ENOMEM, "%s: %s: out of memory", path, obj);
        }
    }
    void *dst = wide ? (void *)tmp : rl_tensor_data(&t);
    herr_t r =
        is_attr ? H5Aread(id, mtype, dst) : H5Dread(id, mtype, mspace, fspace, H5P_DEFAULT, dst);
    rl_status s = RL_OK;
    if (r < 0) {
        s = h5_fail(path, obj, "cannot read the data");
    } else if (wide) {
        int32_t *v = rl_tensor_data(&t);
        for (int64_t i = 0; i < n && s == RL_OK; i++) {
            if (tmp[i] < INT32_MIN || tmp[i] > INT32_MAX)
                s = rl_error(RL_EIO, "%s: %s: value %lld at element %lld does not fit int32", path,
                             obj, tmp[i], (long long)i);
            else
                v[i] = (int32_t)tmp[i];
        }
    }
    free(tmp);
    if (s != RL_OK) {
        rl_tensor_release(&t);
        return s;
    }
    *out = t;
    return RL_OK;
}

static rl_status h5_open_dataset(rl_h5file *f, const char *rel, hid_t *ds) {
    *ds = H5I_INVALID_HID;
    if (!*rel) return rl_error(RL_EIO, "%s: empty dataset name", f->path);
    int e = h5_path_exists(f->id, rel);
    if (e < 0) return h5_fail(f->path, rel, "cannot look up");
    if (e == 0) return rl_error(RL_EIO, "%s: %s: no such dataset", f->path, rel);
    *ds = H5Dopen2(f->id, rel, H5P_DEFAULT);
    if (*ds < 0) return h5_fail(f->path, rel, "cannot open as a dataset");
    return RL_OK;
}

/* HDF5 reads what a file never stored for a dataset (no data, or missing chunks) as its fill
 * value, so a 2 KB file may claim a dataset of gigabytes of zeros, and reading its rows (the
 * sequences of a crafted rl.dataset file) would make and fill that much memory. Data that was
 * written is stored whole or compressed, and deflate, the usual filter of HDF5 files, stores at
 * least one byte for every 1032; so a read of over 16 MiB from a dataset that claims more than
 * 4096 times the bytes the file stores for it is refused as corrupt. Smaller reads are not
 * checked: the stored size of a chunked dataset walks its chunk index, and a dataset's rows
 * (a sequence) are read one call at a time. */
#define H5_MAX_FILL_RATIO 4096
#define H5_FILL_FREE_BYTES ((double)(16 << 20))

static rl_status h5_check_stored(const char *path, const char *obj, hid_t ds, hid_t ftype, int ndim,
                                 const int64_t *shape, int64_t rows) {
    double claimed = (double)H5Tget_size(ftype);
    for (int d = 0; d < ndim; d++)
        claimed *= (double)shape[d];
    if (claimed <= H5_FILL_FREE_BYTES) return RL_OK; /* no read is larger */
    double want = rows < 0 || ndim == 0 ? claimed : claimed / (double)shape[0] * (double)rows;
    if (want <= H5_FILL_FREE_BYTES) return RL_OK;
    double stored = (double)H5Dget_storage_size(ds);
    if (claimed <= stored * H5_MAX_FILL_RATIO) return RL_OK;
    char dims[RL_MAX_DIMS * 24] = "";
    for (int d = 0, at = 0; d < ndim; d++)
        at += snprintf(dims + at, sizeof dims - (size_t)at, "%s%lld", d ? ", " : "",
                       (long long)shape[d]);
    return rl_error(RL_EIO,
                    "%s: %s: its shape [%s] claims %.0f bytes of data but the file stores %.0f "
                    "bytes for it (the rest would read as zeros): the file is corrupt or was "
                    "never written whole",
                    path, obj, dims, claimed, stored);
}

/* Shared by read_tensor (rows < 0: everything) and read_rows. */
static rl_status h5_read_dataset(rl_h5file *f, const char *name, int64_t start, int64_t rows,
                                 rl_tensor *out) {
    const char *rel = h5_rel(name);
    hid_t ds, ftype = H5I_INVALID_HID, fspace = H5I_INVALID_HID, mspace = H5I_INVALID_HID;
    RL_TRY(h5_open_dataset(f, rel, &ds));
    rl_status s = RL_OK;
    int ndim = 0;
    int64_t shape[RL_MAX_DIMS] = {0};
    ftype = H5Dget_type(ds);
    fspace = H5Dget_space(ds);
    if (ftype < 0 || fspace < 0) {
        s = h5_fail(f->path, rel, "cannot read the type or the dataspace");
        goto done;
    }
    s = h5_space_shape(f->path, rel, fspace, &ndim, shape);
    if (s != RL_OK) goto done;
    s = h5_check_stored(f->path, rel, ds, ftype, ndim, shape, rows);
    if (s != RL_OK) goto done;
    if (rows >= 0) {
        if (ndim == 0) {
            s = rl_error(RL_EIO, "%s: %s: a scalar has no rows", f->path, rel);
            goto done;
        }
        if (start < 0 || start > shape[0] || rows > shape[0] - start) {
            /* printed 1-based as the Lua API takes them; start + rows may overflow */
            s = rl_error(RL_EINDEX,
                         "%s: %s: %lld rows from row %lld are out of range for %lld rows", f->path,
                         rel, (long long)rows, (long long)start + 1, (long long)shape[0]);
            goto done;
        }
        shape[0] = rows;
        if (rows > 0) {
            hsize_t off[RL_MAX_DIMS] = {0}, cnt[RL_MAX_DIMS];
            for (int d = 0; d < ndim; d++)
                cnt[d] = (hsize_t)shape[d];
            off[0] = (hsize_t)start;
            mspace = h5_space_of(ndim, shape);
            if (mspace < 0 ||
                H5Sselect_hyperslab(fspace, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0) {
                s = h5_fail(f->path, rel, "cannot select rows");
                goto done;
            }
        }
    }
    s = h5_read_numeric(f->path, rel, ds, false, ftype, mspace >= 0 ? mspace : H5S_ALL,
                        mspace >= 0 ? fspace : H5S_ALL, ndim, shape, out);
done:
    h5_close_id(&mspace, H5Sclose);
    h5_close_id(&fspace, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&ds, H5Dclose);
    return s;
}

rl_status rl_h5_read_tensor(rl_h5file *f, const char *name, rl_tensor *out) {
    return h5_read_dataset(f, name, 0, -1, out);
}

rl_status rl_h5_read_rows(rl_h5file *f, const char *name, int64_t start, int64_t count,
                          rl_tensor *out) {
    if (count < 0)
        return rl_error(RL_EINDEX, "%s: %s: negative row count %lld", f->path, h5_rel(name),
                        (long long)count);
    return h5_read_dataset(f, name, start, count, out);
}

rl_status rl_h5_dataset_info(rl_h5file *f, const char *name, rl_dtype *dtype, int *ndim,
                             int64_t shape[RL_MAX_DIMS]) {
    const char *rel = h5_rel(name);
    hid_t ds, ftype = H5I_INVALID_HID, fspace = H5I_INVALID_HID;
    RL_TRY(h5_open_dataset(f, rel, &ds));
    rl_status s;
    ftype = H5Dget_type(ds);
    fspace = H5Dget_space(ds);
    if (ftype < 0 || fspace < 0) {
        s = h5_fail(f->path, rel, "cannot read the type or the dataspace");
    } else {
        hid_t mtype;
        bool wide;
        s = h5_pick_dtype(f->path, rel, ftype, dtype, &mtype, &wide);
        if (s == RL_OK) s = h5_space_shape(f->path, rel, fspace, ndim, shape);
    }
    h5_close_id(&fspace, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&ds, H5Dclose);
    return s;
}

rl_status rl_h5_exists(rl_h5file *f, const char *name, bool *out) {
    const char *rel = h5_rel(name);
    int e = h5_path_exists(f->id, rel);
    if (e < 0) return h5_fail(f->path, rel, "cannot look up");
    *out = e > 0;
    return RL_OK;
}

/* ---- listing ---- */

typedef struct {
    char **names;
    int64_t count, cap;
    bool nomem;
} h5_list;

static herr_t h5_list_cb(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    h5_list *l = data;
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) return 0;
    bool is_ds = H5Iget_type(obj) == H5I_DATASET;
    H5Oclose(obj);
    if (!is_ds) return 0;
    if (l->count == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        char **grown = realloc(l->names, (size_t)cap * sizeof *grown);
        if (!grown) {
            l->nomem = true;
            return -1;
        }
        l->names = grown;
        l->cap = cap;
    }
    l->names[l->count] = strdup(name);
    if (!l->names[l->count]) {
        l->nomem = true;
        return -1;
    }
    l->count++;
    return 0;
}

rl_status rl_h5_list(rl_h5file *f, const char *group, char ***names, int64_t *count) {
    *names = NULL;
    *count = 0;
    const char *rel = h5_rel(group);
    int e = h5_path_exists(f->id, rel);
    if (e <= 0)
        return e < 0 ? h5_fail(f->path, *rel ? rel : "/", "cannot look up")
                     : rl_error(RL_EIO, "%s: %s: no such group", f->path, rel);
    hid_t g = H5Gopen2(f->id, *rel ? rel : "/", H5P_DEFAULT);
    if (g < 0) return h5_fail(f->path, *rel ? rel : "/", "cannot open as a group");
    h5_list l = {0};
    herr_t r = H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, h5_list_cb, &l);
    rl_status s = RL_OK;
    if (l.nomem)
        s = rl_error(RL_ENOMEM, "%s: out of memory listing datasets", f->path);
    else if (r < 0)
        s = h5_fail(f->path, *rel ? rel : "/", "cannot list the datasets");
    H5Gclose(g);
    if (s != RL_OK) {
        rl_h5_list_free(l.names, l.count);
        return s;
    }
    *names = l.names;
    *count = l.count;
    return RL_OK;
}

void rl_h5_list_free(char **names, int64_t count) {
    for (int64_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

/* ---- strings ---- */

/* Strings are written as fixed-length UTF-8, NUL-padded, sized to the longest (at least 1
 * byte): reading them back needs no global heap. Variable-length strings (what h5py and
 * RETURNN write, and rnnlua wrote before) keep their bytes in the file's global heap, whose
 * reader in libhdf5 1.10 trusts lengths stored in the file: a crafted file makes it copy out of
 * bounds (H5HG_read) or loop on a huge length (H5T__conv_vlen); rl_h5_open's probe meets that
 * first, in its child. */
static hid_t h5_fixed_utf8(size_t len) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t >= 0 && (H5Tset_size(t, len > 0 ? len : 1) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0 ||
                   H5Tset_strpad(t, H5T_STR_NULLPAD) < 0)) {
        H5Tclose(t);
        return H5I_INVALID_HID;
    }
    return t;
}

void rl_h5_refuse_vlen(rl_h5file *f) { f->refuse_vlen = true; }

rl_status rl_h5_write_strings(rl_h5file *f, const char *name, const char *const *strs,
                              int64_t count) {
    const char *rel = h5_rel(name);
    if (!*rel) return rl_error(RL_EARG, "%s: empty dataset name", f->path);
    size_t longest = 0;
    for (int64_t i = 0; i < count; i++) {
        if (!strs[i])
            return rl_error(RL_EARG, "%s: %s: string %lld is NULL", f->path, rel, (long long)i);
        size_t n = strlen(strs[i]);
        if (n > longest) longest = n;
    }
    if (longest == 0) longest = 1;
    if (count > 0 && (size_t)count > SIZE_MAX / longest)
        return rl_error(RL_ENOMEM, "%s: %s: %lld strings of %zu bytes do not fit in memory",
                        f->path, rel, (long long)count, longest);
    RL_TRY(h5_unlink_existing(f, rel));
    rl_status s = RL_OK;
    int64_t shape[1] = {count};
    char *buf = calloc(count > 0 ? (size_t)count : 1, longest);
    hid_t type = h5_fixed_utf8(longest), space = h5_space_of(1, shape), lcpl = h5_lcpl();
    hid_t ds = H5I_INVALID_HID;
    if (!buf) {
        s = rl_error(RL_ENOMEM, "%s: %s: out of memory", f->path, rel);
        goto done;
    }
    for (int64_t i = 0; i < count; i++)
        memcpy(buf + (size_t)i * longest, strs[i], strlen(strs[i]));
    if (type < 0 || space < 0 || lcpl < 0) {
        s = h5_fail(f->path, rel, "cannot describe the dataset");
        goto done;
    }
    ds = H5Dcreate2(f->id, rel, type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (ds < 0)
        s = h5_fail(f->path, rel, "cannot create the dataset");
    else if (count > 0 && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        s = h5_fail(f->path, rel, "cannot write the dataset");
done:
    free(buf);
    h5_close_id(&ds, H5Dclose);
    h5_close_id(&lcpl, H5Pclose);
    h5_close_id(&space, H5Sclose);
    h5_close_id(&type, H5Tclose);
    return s;
}

/* Reads `n` strings of a dataset or attribute (type ftype, dataspace space) into malloc'd
 * copies (out: n entries, NULL on entry; the caller frees what is set, also on error).
 * Variable-length ones are refused when the file's writer never stores them
 * (rl_h5_refuse_vlen); otherwise rl_h5_open's probe has read them once already in a child. */
static rl_status h5_read_string_data(const rl_h5file *f, const char *obj, hid_t id, bool is_attr,
                                     hid_t ftype, hid_t space, int64_t n, char **out) {
    const char *path = f->path;
    if (H5Tget_class(ftype) != H5T_STRING) {
        H5Eclear2(H5E_DEFAULT);
        return rl_error(RL_EIO, "%s: %s: not a string", path, obj);
    }
    htri_t vlen = H5Tis_variable_str(ftype);
    if (vlen > 0 && f->refuse_vlen)
        return rl_error(RL_EIO,
                        "%s: %s: a variable-length string, which this kind of file never holds "
                        "(its writer stores fixed-length strings): the file is corrupt or crafted",
                        path, obj);
    size_t fsize = H5Tget_size(ftype);
    if (!vlen && (fsize == 0 || fsize > ((size_t)1 << 30) ||
                  (n > 0 && (size_t)n > (SIZE_MAX / 2) / (fsize + 1))))
        return rl_error(RL_EIO, "%s: %s: %lld strings of %zu bytes each are too large", path, obj,
                        (long long)n, fsize);
    hid_t mtype = H5Tcopy(H5T_C_S1);
    if (vlen < 0 || mtype < 0 || H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0 ||
        H5Tset_size(mtype, vlen ? H5T_VARIABLE : fsize + 1) < 0 ||
        (!vlen && H5Tset_strpad(mtype, H5T_STR_NULLTERM) < 0)) {
        rl_status s = h5_fail(path, obj, "cannot describe the string type");
        h5_close_id(&mtype, H5Tclose);
        return s;
    }
    size_t elem = vlen ? sizeof(char *) : fsize + 1;
    char *raw = calloc((size_t)(n > 0 ? n : 1), elem);
    rl_status s = RL_OK;
    if (!raw) {
        s = rl_error(RL_ENOMEM, "%s: %s: out of memory", path, obj);
    } else if ((is_attr ? H5Aread(id, mtype, raw)
                        : H5Dread(id, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw)) < 0) {
        s = h5_fail(path, obj, "cannot read the strings");
    } else {
        for (int64_t i = 0; i < n; i++) {
            const char *src = vlen ? ((char **)raw)[i] : raw + (size_t)i * elem;
            out[i] = vlen ? strdup(src ? src : "") : strndup(src, fsize);
            if (!out[i] && s == RL_OK) s = rl_error(RL_ENOMEM, "%s: %s: out of memory", path, obj);
        }
        if (vlen) H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, raw);
    }
    free(raw);
    H5Tclose(mtype);
    return s;
}

rl_status rl_h5_read_strings(rl_h5file *f, const char *name, char ***strs, int64_t *count) {
    *strs = NULL;
    *count = 0;
    const char *rel = h5_rel(name);
    hid_t ds, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID;
    RL_TRY(h5_open_dataset(f, rel, &ds));
    rl_status s;
    int ndim = 0;
    int64_t shape[RL_MAX_DIMS] = {0};
    char **out = NULL;
    int64_t n = 0;
    ftype = H5Dget_type(ds);
    space = H5Dget_space(ds);
    if (ftype < 0 || space < 0) {
        s = h5_fail(f->path, rel, "cannot read the type or the dataspace");
        goto done;
    }
    s = h5_space_shape(f->path, rel, space, &ndim, shape);
    if (s != RL_OK) goto done;
    if (ndim > 1) {
        s = rl_error(RL_EIO, "%s: %s: strings must be 1-dim, not %d-dim", f->path, rel, ndim);
        goto done;
    }
    n = ndim == 0 ? 1 : shape[0];
    out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
    if (!out) {
        s = rl_error(RL_ENOMEM, "%s: %s: out of memory", f->path, rel);
        goto done;
    }
    s = h5_read_string_data(f, rel, ds, false, ftype, space, n, out);
done:
    h5_close_id(&space, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&ds, H5Dclose);
    if (s != RL_OK) {
        if (out) rl_h5_list_free(out, n);
        return s;
    }
    *strs = out;
    *count = n;
    return RL_OK;
}

/* ---- attributes ---- */

/* Opens the object an attribute belongs to; with `create`, a missing one becomes a group. */
static rl_status h5_open_obj(rl_h5file *f, const char *rel, bool create, hid_t *obj) {
    *obj = H5I_INVALID_HID;
    const char *shown = *rel ? rel : "/";
    int e = h5_path_exists(f->id, rel);
    if (e < 0) return h5_fail(f->path, shown, "cannot look up");
    if (e > 0) {
        *obj = H5Oopen(f->id, *rel ? rel : "/", H5P_DEFAULT);
        return *obj < 0 ? h5_fail(f->path, shown, "cannot open") : RL_OK;
    }
    if (!create) return rl_error(RL_EIO, "%s: %s: no such object", f->path, shown);
    hid_t lcpl = h5_lcpl();
    *obj = H5Gcreate2(f->id, rel, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    rl_status s = *obj < 0 ? h5_fail(f->path, shown, "cannot create the group") : RL_OK;
    h5_close_id(&lcpl, H5Pclose);
    return s;
}

/* Writes attribute `name` of `obj` (replacing it) from `buf` of memory type mtype. */
static rl_status h5_attr_write(rl_h5file *f, const char *obj, const char *name, hid_t ftype,
                               hid_t mtype, hid_t space, const void *buf) {
    const char *rel = h5_rel(obj);
    hid_t o, a = H5I_INVALID_HID;
    RL_TRY(h5_open_obj(f, rel, true, &o));
    rl_status s = RL_OK;
    char what[512];
    snprintf(what, sizeof what, "%s attribute %s", *rel ? rel : "/", name);
    htri_t e = H5Aexists(o, name);
    if (e < 0 || (e > 0 && H5Adelete(o, name) < 0)) {
        s = h5_fail(f->path, what, "cannot replace the attribute");
        goto done;
    }
    a = H5Acreate2(o, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0)
        s = h5_fail(f->path, what, "cannot create the attribute");
    else if (buf && H5Awrite(a, mtype, buf) < 0)
        s = h5_fail(f->path, what, "cannot write the attribute");
done:
    h5_close_id(&a, H5Aclose);
    h5_close_id(&o, H5Oclose);
    return s;
}

/* Opens attribute `name` of `obj`; `what` receives "<obj> attribute <name>" for messages. */
static rl_status h5_attr_open(rl_h5file *f, const char *obj, const char *name, hid_t *attr,
                              char *what, size_t wn) {
    const char *rel = h5_rel(obj);
    snprintf(what, wn, "%s attribute %s", *rel ? rel : "/", name);
    *attr = H5I_INVALID_HID;
    hid_t o;
    RL_TRY(h5_open_obj(f, rel, false, &o));
    rl_status s = RL_OK;
    htri_t e = H5Aexists(o, name);
    if (e < 0)
        s = h5_fail(f->path, what, "cannot look up");
    else if (e == 0)
        s = rl_error(RL_EIO, "%s: %s: no such attribute", f->path, what);
    else if ((*attr = H5Aopen(o, name, H5P_DEFAULT)) < 0)
        s = h5_fail(f->path, what, "cannot open");
    H5Oclose(o);
    return s;
}

rl_status rl_h5_attr_write_string(rl_h5file *f, const char *obj, const char *name,
                                  const char *value) {
    size_t len = strlen(value);
    hid_t type = h5_fixed_utf8(len), space = H5Screate(H5S_SCALAR);
    rl_status s;
    if (type < 0 || space < 0)
        s = h5_fail(f->path, name, "cannot describe the attribute");
    else
        s = h5_attr_write(f, obj, name, type, type, space, len > 0 ? value : "");
    h5_close_id(&space, H5Sclose);
    h5_close_id(&type, H5Tclose);
    return s;
}

rl_status rl_h5_attr_read_string(rl_h5file *f, const char *obj, const char *name, char **value) {
    *value = NULL;
    char what[512];
    hid_t a, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID;
    RL_TRY(h5_attr_open(f, obj, name, &a, what, sizeof what));
    rl_status s;
    ftype = H5Aget_type(a);
    space = H5Aget_space(a);
    if (ftype < 0 || space < 0)
        s = h5_fail(f->path, what, "cannot read the type or the dataspace");
    else if (H5Sget_simple_extent_npoints(space) != 1)
        s = rl_error(RL_EIO, "%s: %s: holds %lld strings, not one", f->path, what,
                     (long long)H5Sget_simple_extent_npoints(space));
    else
        s = h5_read_string_data(f, what, a, true, ftype, space, 1, value);
    if (s != RL_OK) {
        free(*value);
        *value = NULL;
    }
    h5_close_id(&space, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&a, H5Aclose);
    return s;
}

rl_status rl_h5_attr_write_tensor(rl_h5file *f, const char *obj, const char *name,
                                  const rl_tensor *t) {
    const void *buf;
    void *owned;
    RL_TRY(h5_pack(f->path, name, t, &buf, &owned));
    hid_t space = h5_space_of(t->ndim, t->shape);
    rl_status s = space < 0 ? h5_fail(f->path, name, "cannot describe the attribute")
                            : h5_attr_write(f, obj, name, h5_native(t->dtype), h5_native(t->dtype),
                                            space, buf);
    h5_close_id(&space, H5Sclose);
    free(owned);
    return s;
}

rl_status rl_h5_attr_read_tensor(rl_h5file *f, const char *obj, const char *name, rl_tensor *out) {
    char what[512];
    hid_t a, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID;
    RL_TRY(h5_attr_open(f, obj, name, &a, what, sizeof what));
    rl_status s;
    int ndim = 0;
    int64_t shape[RL_MAX_DIMS] = {0};
    ftype = H5Aget_type(a);
    space = H5Aget_space(a);
    if (ftype < 0 || space < 0)
        s = h5_fail(f->path, what, "cannot read the type or the dataspace");
    else
        s = h5_space_shape(f->path, what, space, &ndim, shape);
    if (s == RL_OK)
        s = h5_read_numeric(f->path, what, a, true, ftype, H5S_ALL, H5S_ALL, ndim, shape, out);
    h5_close_id(&space, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&a, H5Aclose);
    return s;
}

static rl_status h5_attr_write_scalar(rl_h5file *f, const char *obj, const char *name, hid_t type,
                                      const void *v) {
    hid_t space = H5Screate(H5S_SCALAR);
    rl_status s = space < 0 ? h5_fail(f->path, name, "cannot describe the attribute")
                            : h5_attr_write(f, obj, name, type, type, space, v);
    h5_close_id(&space, H5Sclose);
    return s;
}

rl_status rl_h5_attr_write_int64(rl_h5file *f, const char *obj, const char *name, int64_t v) {
    long long x = v;
    return h5_attr_write_scalar(f, obj, name, H5T_NATIVE_LLONG, &x);
}

rl_status rl_h5_attr_write_double(rl_h5file *f, const char *obj, const char *name, double v) {
    return h5_attr_write_scalar(f, obj, name, H5T_NATIVE_DOUBLE, &v);
}

/* Reads a numeric attribute holding exactly one value, as long long or double. */
static rl_status h5_attr_read_scalar(rl_h5file *f, const char *obj, const char *name, long long *iv,
                                     double *dv) {
    char what[512];
    hid_t a, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID;
    RL_TRY(h5_attr_open(f, obj, name, &a, what, sizeof what));
    rl_status s = RL_OK;
    ftype = H5Aget_type(a);
    space = H5Aget_space(a);
    H5T_class_t cls = ftype >= 0 ? H5Tget_class(ftype) : H5T_NO_CLASS;
    if (ftype < 0 || space < 0) {
        s = h5_fail(f->path, what, "cannot read the type or the dataspace");
    } else if (cls != H5T_INTEGER && cls != H5T_FLOAT) {
        s = rl_error(RL_EIO, "%s: %s: not a number", f->path, what);
    } else if (H5Sget_simple_extent_npoints(space) != 1) {
        s = rl_error(RL_EIO, "%s: %s: holds %lld values, not one", f->path, what,
                     (long long)H5Sget_simple_extent_npoints(space));
    } else if (dv || cls == H5T_FLOAT) {
        double d = 0;
        if (H5Aread(a, H5T_NATIVE_DOUBLE, &d) < 0)
            s = h5_fail(f->path, what, "cannot read the attribute");
        else if (dv)
            *dv = d;
        else if (!(d >= -9.2e18 && d <= 9.2e18) || d != (double)(long long)d)
            s = rl_error(RL_EIO, "%s: %s: %g is not an integer", f->path, what, d);
        else
            *iv = (long long)d;
    } else if (H5Aread(a, H5T_NATIVE_LLONG, iv) < 0) {
        s = h5_fail(f->path, what, "cannot read the attribute");
    }
    h5_close_id(&space, H5Sclose);
    h5_close_id(&ftype, H5Tclose);
    h5_close_id(&a, H5Aclose);
    return s;
}

rl_status rl_h5_attr_read_int64(rl_h5file *f, const char *obj, const char *name, int64_t *v) {
    long long x = 0;
    RL_TRY(h5_attr_read_scalar(f, obj, name, &x, NULL));
    *v = x;
    return RL_OK;
}

rl_status rl_h5_attr_read_double(rl_h5file *f, const char *obj, const char *name, double *v) {
    return h5_attr_read_scalar(f, obj, name, NULL, v);
}
