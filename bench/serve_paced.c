/* Streaming through `rnnlua serve` in real time: S streams (64) each send one 10 ms frame (40
 * features) every 10 ms to POST /v1/stream/{id}, over a keep-alive connection of their own, their
 * phases spread over the 10 ms; a frame's latency runs from the time it was due to its answer,
 * so a stream that falls behind counts its waiting too. The model is bench/stream.c's causal
 * 3 x 512 LSTM. Up to four servers run side by side: fp32 and bf16 (--precision: one), each
 * with --stream-batch 1 (each chunk its own forward, in its own thread) and --stream-batch S
 * (the chunks of different streams waiting at the same time as one batched forward,
 * rl_session_push_many; --stream-batch: only those), all with --blas-threads B (2: the math of
 * a push or a batch on both cores). They are measured in turn, R rounds (2) of N seconds (2)
 * each, the others idle meanwhile; a first short round opens the sessions, and the first 20
 * frames of each stream in a round are left out. Prints a Markdown section for
 * bench/README.md. The clients are threads of this process on the same cores: their CPU time
 * is in the figures, and printed apart with the server's and the rest of the machine's.
 * Usage: serve_paced [--streams S] [--seconds N] [--rounds R] [--precision fp32|bf16]
 *                    [--blas-threads B] [--stream-batch 1|S] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define PERIOD 0.010 /* s: one frame */
#define SKIP 20      /* frames of each stream a round leaves out */

typedef struct {
    pid_t pid;
    int port;
    const char *precision;
    int batch;
    double *lat; /* the kept latencies of all rounds */
    size_t n, cap;
    int64_t late, failed;
    double sent, wall;            /* frames sent and seconds taken, all rounds */
    double cpu_server, cpu_bench; /* CPU seconds of the server and of this process, all rounds */
    double cpu_all;               /* CPU seconds of the whole machine meanwhile (/proc/stat) */
} server;

typedef struct {
    server *sv;
    int id, streams;
    double seconds, t0;
    double *lat;
    int n;
    int failed;
    pthread_barrier_t *start;
} client;

/* Starts `rnnlua serve` on model; fills sv->pid and sv->port (0 on failure). */
static void start_server(server *sv, const char *argv0, const char *model, int streams,
                         int blas_threads) {
    char bin[4096], batch[16], maxs[16], conns[16], blas[16];
    const char *slash = strrchr(argv0, '/');
    snprintf(bin, sizeof bin, "%.*s/../rnnlua", slash ? (int)(slash - argv0) : 1,
             slash ? argv0 : ".");
    snprintf(batch, sizeof batch, "%d", sv->batch);
    snprintf(blas, sizeof blas, "%d", blas_threads);
    snprintf(maxs, sizeof maxs, "%d", streams);
    snprintf(conns, sizeof conns, "%d", streams + 16);
    int fd[2];
    sv->port = 0;
    if (pipe(fd) != 0) return;
    sv->pid = fork();
    if (sv->pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (freopen("/dev/null", "w", stderr) == NULL) _exit(127);
        execl(bin, bin, "serve", model, "--port", "0", "--precision", sv->precision,
              "--stream-batch", batch, "--max-streams", maxs, "--max-connections", conns,
              "--stream-timeout", "3600", "--blas-threads", blas, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on http://");
        const char *colon = p ? strrchr(p, ':') : NULL;
        if (colon) {
            sv->port = atoi(colon + 1);
            break;
        }
    }
    /* the pipe stays open (not read again): the server writes nothing more to stdout */
}

/* The values of frame k of a stream: they repeat every 17 frames. */
#define PATTERNS 17

/* One request (n bytes) on fd, its whole answer read; 0 when it was a 200. */
static int post(int fd, const char *req, size_t n, char *buf, size_t cap) {
    if (send(fd, req, n, 0) != (ssize_t)n) return -1;
    size_t got = 0;
    char *end = NULL;
    while (end == NULL) {
        ssize_t r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
        buf[got] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    const char *cl = strcasestr(buf, "Content-Length:");
    size_t want = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
    if (want >= cap) return -1;
    while (got < want) {
        ssize_t r = recv(fd, buf + got, want - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return strncmp(buf, "HTTP/1.1 200", 12) == 0 ? 0 : -1;
}

static void sleep_until(double t) {
    double d = t - bench_now();
    if (d <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *client_main(void *p) {
    client *c = p;
    char path[64], body[2048], buf[65536];
    snprintf(path, sizeof path, "/v1/stream/p%d", c->id);
    /* the requests written before the clock starts, so that a frame's cost to the client is
     * its send and its answer's reads, as in a client that has its features at hand */
    char *req[PATTERNS];
    size_t reqn[PATTERNS];
    for (int k = 0; k < PATTERNS; k++) {
        int n = snprintf(body, sizeof body, "{\"data\": [[");
        for (int i = 0; i < BENCH_STREAM_FEATURES; i++)
            n += snprintf(body + n, sizeof body - (size_t)n, "%s%.4f", i ? ", " : "",
                          (double)((k * 31 + i * 7) % 17) / 17.0 - 0.5);
        snprintf(body + n, sizeof body - (size_t)n, "]]}");
        req[k] = malloc(4096);
        reqn[k] = (size_t)snprintf(req[k], 4096,
                                   "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                   "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                   path, strlen(body), body);
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->sv->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    pthread_barrier_wait(c->start);
    /* frame k of this stream is due at t0 + phase + k * PERIOD */
    double phase = PERIOD * c->id / c->streams;
    int frames = (int)(c->seconds / PERIOD);
    for (int k = 0; ok && k < frames; k++) {
        double due = c->t0 + phase + k * PERIOD;
        sleep_until(due);
        if (post(fd, req[k % PATTERNS], reqn[k % PATTERNS], buf, sizeof buf) != 0) {
            c->failed = 1;
            break;
        }
        if (k >= SKIP) c->lat[c->n++] = bench_now() - due;
    }
    if (!ok) c->failed = 1;
    close(fd);
    for (int k = 0; k < PATTERNS; k++)
        free(req[k]);
    return NULL;
}

/* CPU seconds (user + system) the process pid has used, its ended threads included. */
static double cpu_of(pid_t pid) {
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = '\0';
    const char *p = strrchr(line, ')'); /* the name may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds the whole machine has been busy (all cores; steal time counted as busy). */
static double cpu_machine(void) {
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7])
              : 0;
    if (f) fclose(f);
    if (n != 8) return 0;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static void measure(server *sv, int streams, double seconds) {
    pthread_t th[1024];
    client cs[1024];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)streams);
    int per = (int)(seconds / PERIOD) + 1;
    double t0 = bench_now() + 0.05 + 0.002 * streams;
    double cpu_s = cpu_of(sv->pid), cpu_b = cpu_of(getpid()), cpu_m = cpu_machine();
    for (int i = 0; i < streams; i++) {
        cs[i] = (client){.sv = sv,
                         .id = i,
                         .streams = streams,
                         .seconds = seconds,
                         .t0 = t0,
                         .lat = malloc(sizeof(double) * (size_t)per),
                         .start = &start};
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    for (int i = 0; i < streams; i++)
        pthread_join(th[i], NULL);
    sv->wall += bench_now() - t0;
    sv->cpu_server += cpu_of(sv->pid) - cpu_s;
    sv->cpu_bench += cpu_of(getpid()) - cpu_b;
    sv->cpu_all += cpu_machine() - cpu_m;
    sv->sent += (double)streams * (int)(seconds / PERIOD);
    for (int i = 0; i < streams; i++) {
        if (sv->n + (size_t)cs[i].n > sv->cap) {
            sv->cap = 2 * (sv->n + (size_t)cs[i].n);
            sv->lat = realloc(sv->lat, sizeof *sv->lat * sv->cap);
        }
        for (int k = 0; k < cs[i].n; k++) {
            sv->lat[sv->n++] = cs[i].lat[k];
            sv->late += cs[i].lat[k] > PERIOD;
        }
        sv->failed += cs[i].failed;
        free(cs[i].lat);
    }
    pthread_barrier_destroy(&start);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p) {
    return n ? 1e3 * v[(size_t)(p / 100.0 * (double)(n - 1) + 0.5)] : 0;
}

int main(int argc, char **argv) {
    int streams = 64, rounds = 2, blas_threads = 2, only_batch = 0;
    double seconds = 2;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--streams") == 0)
            streams = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--precision") == 0)
            only = argv[i + 1];
        else if (strcmp(argv[i], "--blas-threads") == 0)
            blas_threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--stream-batch") == 0)
            only_batch = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "serve_paced: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "serve_paced: %s needs a value\n", argv[argc - 1]);
        return 2;
    }
    if (streams < 1 || streams > 1024 || seconds < 0.5 || seconds > 600 || rounds < 1 ||
        rounds > 20 || blas_threads < 1 || blas_threads > 64 || only_batch < 0 ||
        (only_batch != 0 && only_batch != 1 && only_batch != streams) ||
        (only && strcmp(only, "fp32") != 0 && strcmp(only, "bf16") != 0)) {
        fputs("usage: serve_paced [--streams 1..1024] [--seconds 0.5..600] [--rounds 1..20] "
              "[--precision fp32|bf16] [--blas-threads 1..64] [--stream-batch 1|S]\n",
              stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char model[256];
    snprintf(model, sizeof model, "/tmp/rnnlua-bench-paced-%d.h5", (int)getpid());
    if (bench_write_stream_model(argv[0], model) != 0) return 1;
    double load[3] = {0};
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = 0;
        fclose(lf);
    }
    server svs[4];
    int ns = 0;
    const char *precs[2] = {"fp32", "bf16"};
    for (int p = 0; p < 2; p++) {
        if (only && strcmp(only, precs[p]) != 0) continue;
        if (only_batch != streams) svs[ns++] = (server){.precision = precs[p], .batch = 1};
        if (only_batch != 1) svs[ns++] = (server){.precision = precs[p], .batch = streams};
    }
    int status = 0;
    for (int i = 0; i < ns; i++) {
        start_server(&svs[i], argv[0], model, streams, blas_threads);
        if (svs[i].port == 0) {
            fprintf(stderr, "serve_paced: the server (%s, --stream-batch %d) did not start\n",
                    svs[i].precision, svs[i].batch);
            status = 1;
        }
    }
    for (int i = 0; status == 0 && i < ns; i++) { /* the sessions opened, not measured */
        measure(&svs[i], streams, 0.3);
        svs[i].n = 0, svs[i].late = 0, svs[i].sent = 0, svs[i].wall = 0;
        svs[i].cpu_server = 0, svs[i].cpu_bench = 0, svs[i].cpu_all = 0;
    }
    for (int r = 0; status == 0 && r < rounds; r++)
        for (int i = 0; i < ns; i++)
            measure(&svs[i], streams, seconds);
    for (int i = 0; i < ns; i++) {
        if (svs[i].pid > 0) {
            kill(svs[i].pid, SIGINT);
            waitpid(svs[i].pid, NULL, 0);
        }
    }
    remove(model);
    if (status != 0) return status;
    printf("### Streams in real time through rnnlua serve (bench/serve_paced.c)\n\n"
           "%d streams, each one 40-value frame (10 ms of audio) every 10 ms to `POST "
           "/v1/stream/{id}` of a causal 3 x 512 LSTM (softmax 40 out); latency from the time a "
           "frame was due to its answer; %d rounds of %g s per server, interleaved, the first %d "
           "frames of each stream in a round left out; servers with --blas-threads %d; load "
           "average %.2f %.2f %.2f at the start. `--stream-batch 1`: each chunk its own forward; "
           "%d: the chunks waiting at "
           "once as one batched forward. Frames/s: all frames sent over the time the rounds took "
           "(real "
           "time is %d frames/s); below it the streams fall behind and the latencies grow with "
           "the length of the run. CPU a frame: the server's and the clients' (this process) CPU "
           "time over the frames sent (2 cores: 0.31 ms a frame in all is the whole machine at "
           "6400 frames/s); other CPU: the cores the rest of the machine kept busy meanwhile "
           "(/proc/stat, steal time included).\n\n"
           "| precision | --stream-batch | frames | frames/s | p50 ms | p90 ms | p99 ms | max ms | "
           "later than 10 ms | server CPU ms a frame | clients' CPU ms a frame | other CPU "
           "(cores) | clients failed "
           "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           streams, rounds, seconds, SKIP, blas_threads, load[0], load[1], load[2], streams,
           (int)(streams / PERIOD + 0.5));
    for (int i = 0; i < ns; i++) {
        server *sv = &svs[i];
        qsort(sv->lat, sv->n, sizeof *sv->lat, cmp_double);
        printf("| %s | %d | %zu | %.0f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %.3f | %.3f | %.2f | "
               "%lld "
               "|\n",
               sv->precision, sv->batch, sv->n, sv->wall > 0 ? sv->sent / sv->wall : 0,
               pct(sv->lat, sv->n, 50), pct(sv->lat, sv->n, 90), pct(sv->lat, sv->n, 99),
               sv->n ? 1e3 * sv->lat[sv->n - 1] : 0,
               sv->n ? 100.0 * (double)sv->late / (double)sv->n : 0,
               sv->sent > 0 ? 1e3 * sv->cpu_server / sv->sent : 0,
               sv->sent > 0 ? 1e3 * sv->cpu_bench / sv->sent : 0,
               sv->wall > 0 ? (sv->cpu_all - sv->cpu_server - sv->cpu_bench) / sv->wall : 0,
               (long long)sv->failed);
        free(sv->lat);
    }
    return 0;
}
