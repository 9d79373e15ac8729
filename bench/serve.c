/* `rnnlua serve` under load, against a minimal PyTorch server (bench/torch_serve.py), in one run.
 *
 * The model is the demo's 12AX BLSTM (lstm 32 forward and backward, softmax 2 over 9 one-hot
 * inputs; untrained weights from a fixed seed: speed does not depend on them), saved as a
 * checkpoint by BUILD/rnnlua and handed to the PyTorch server as text, so both servers compute
 * the same function (checked on one request before timing). Each request is one 100-frame
 * 12AX sequence (random symbols of "123ABCXYZ", one-hot), POST /v1/forward over a keep-alive
 * connection. Servers: rnnlua serve with dynamic batching (the defaults: --max-batch-frames
 * 1000, --max-wait-ms 1; --max-batch-frames F here changes it), rnnlua serve without
 * (--max-batch-frames 0: each request alone), and the PyTorch server (ThreadingHTTPServer,
 * torch.set_num_threads(1), no batching). For 1, 8 and 32 closed-loop clients (threads of this
 * program, one connection each: a client sends its next request when the answer is in) every server
 * is measured RL_BENCH_ROUNDS times (default 3) for RL_SERVE_BENCH_SECONDS (default 2) each, the
 * servers interleaved within a round; the table gives the median round's requests/s and the median
 * p50/p99 latency over rounds. The clients run on the same cores as the servers.
 *
 * Options: --clients 1,8,32  --seconds S  --rounds R  --only rnnlua|nobatch|torch (repeatable)
 *          --max-batch-frames F (of the batching server)
 * The PyTorch server needs `bash bench/torch_env.sh BUILD` (PyPI's torch in a venv); without it
 * the torch rows print SKIP. Bench programs are not library code: errors print and exit 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define NSEQ 64
#define T_FRAMES 100
#define MAX_SERVERS 3
#define MAX_LAT 400000 /* latencies kept per client */

typedef struct {
    const char *name;
    pid_t pid;
    int port;
} server;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "bench serve: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(1);
}

/* Starts argv with stdout on a pipe and reads its "listening on http://HOST:PORT" line. */
static int start_server(server *s, char **argv) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    char line[256];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t r = read(fd[0], line + n, 1);
        if (r <= 0 || line[n] == '\n') break;
        n++;
    }
    line[n] = '\0';
    close(fd[0]);
    const char *colon = strrchr(line, ':');
    s->pid = pid;
    s->port = strstr(line, "listening on http://") && colon ? atoi(colon + 1) : 0;
    if (s->port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return 0;
}

static void stop_server(server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One request on a keep-alive connection: the status, the body into buf (NUL-terminated).
 * -1 when the connection failed. */
static int exchange(int fd, const char *req, size_t reqlen, char *buf, size_t cap) {
    size_t off = 0;
    while (off < reqlen) {
        ssize_t w = send(fd, req + off, reqlen - off, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    size_t n = 0;
    char *hdr_end = NULL;
    while (!hdr_end) {
        if (n + 1 >= cap) return -1;
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r <= 0) return -1;
        n += (size_t)r;
        buf[n] = '\0';
        hdr_end = strstr(buf, "\r\n\r\n");
    }
    int status = atoi(buf + 9);
    const char *cl = strcasestr(buf, "Content-Length:");
    if (cl == NULL || cl > hdr_end) return -1;
    size_t body = (size_t)atol(cl + 15), start = (size_t)(hdr_end + 4 - buf);
    if (start + body + 1 > cap) return -1;
    while (n < start + body) {
        ssize_t r = recv(fd, buf + n, start + body - n, 0);
        if (r <= 0) return -1;
        n += (size_t)r;
    }
    memmove(buf, buf + start, body);
    buf[body] = '\0';
    return status;
}

/* ---- the requests ----------------------------------------------------------------------- */

static char *requests[NSEQ];
static size_t request_len[NSEQ];

static void make_requests(void) {
    uint64_t x = 12345;
    for (int s = 0; s < NSEQ; s++) {
        size_t cap = 64 + (size_t)T_FRAMES * 9 * 2 + T_FRAMES * 4;
        char *body = malloc(cap), *p = body;
        p += sprintf(p, "{\"data\": [");
        for (int t = 0; t < T_FRAMES; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int sym = (int)((x >> 33) % 9);
            *p++ = t ? ',' : '[';
            if (t) *p++ = '[';
            for (int k = 0; k < 9; k++)
                p += sprintf(p, k ? ",%d" : "%d", k == sym);
            *p++ = ']';
        }
        p += sprintf(p, "]}");
        size_t blen = (size_t)(p - body);
        char *req = malloc(blen + 256);
        int h = sprintf(req,
                        "POST /v1/forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                        "application/json\r\nContent-Length: %zu\r\n\r\n",
                        blen);
        memcpy(req + h, body, blen);
        requests[s] = req;
        request_len[s] = (size_t)h + blen;
        free(body);
    }
}

/* ---- load ------------------------------------------------------------------------------ */

typedef struct {
    int port, id;
    double until; /* set by run_load between the two barriers */
    pthread_barrier_t *ready, *go;
    double *lat;
    long n, failed;
} client;

/* One closed-loop client: a first request on its new connection (not timed: the PyTorch server
 * stalls for seconds on some new connections' first request), then requests until `until`. */
static void *client_main(void *arg) {
    client *c = arg;
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    int fd = connect_to(c->port);
    int s = c->id;
    if (fd >= 0 && exchange(fd, requests[s], request_len[s], buf, cap) != 200) c->failed++;
    pthread_barrier_wait(c->ready);
    pthread_barrier_wait(c->go);
    while (now_s() < c->until) {
        s = (s + 7) % NSEQ;
        double t0 = now_s();
        int st = fd >= 0 ? exchange(fd, requests[s], request_len[s], buf, cap) : -1;
        double dt = now_s() - t0;
        if (st != 200) {
            c->failed++;
            if (fd >= 0) close(fd);
            fd = connect_to(c->port);
            continue;
        }
        if (c->n < MAX_LAT) c->lat[c->n] = dt;
        c->n++;
    }
    if (fd >= 0) close(fd);
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double rps, p50, p99;
    long failed;
} result;

static result run_load(int port, int clients, double seconds) {
    client *c = calloc((size_t)clients, sizeof *c);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    pthread_barrier_t ready, go;
    pthread_barrier_init(&ready, NULL, (unsigned)clients + 1);
    pthread_barrier_init(&go, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        c[i] = (client){.port = port, .id = i, .ready = &ready, .go = &go};
        c[i].lat = malloc(sizeof(double) * MAX_LAT);
        pthread_create(&th[i], NULL, client_main, &c[i]);
    }
    pthread_barrier_wait(&ready);
    double t0 = now_s();
    for (int i = 0; i < clients; i++)
        c[i].until = t0 + seconds;
    pthread_barrier_wait(&go);
    long n = 0, failed = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        n += c[i].n;
        failed += c[i].failed;
    }
    double wall = now_s() - t0;
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    double *all = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    long k = 0;
    for (int i = 0; i < clients; i++) {
        long m = c[i].n < MAX_LAT ? c[i].n : MAX_LAT;
        memcpy(all + k, c[i].lat, sizeof(double) * (size_t)m);
        k += m;
        free(c[i].lat);
    }
    qsort(all, (size_t)k, sizeof *all, cmp_double);
    result r = {.rps = (double)n / wall, .failed = failed};
    r.p50 = k ? all[k / 2] * 1e3 : NAN;
    r.p99 = k ? all[(long)((double)(k - 1) * 0.99)] * 1e3 : NAN;
    free(all);
    free(c);
    free(th);
    return r;
}

/* The "output" rows of a response, flattened (at most cap values); -1 if there is none. */
static int output_values(const char *body, double *v, int cap) {
    json_error_t e;
    json_t *doc = json_loads(body, 0, &e);
    json_t *rows = json_object_get(doc, "output");
    int n = 0;
    size_t i, j;
    json_t *row, *x;
    json_array_foreach(rows, i, row) {
        json_array_foreach(row, j, x) {
            if (n < cap) v[n++] = json_number_value(x);
        }
    }
    json_decref(doc);
    return rows ? n : -1;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int clients[8] = {1, 8, 32}, nclients = 3, rounds = 3;
    char *mbf = "1000"; /* the server's default */
    double seconds = 2;
    const char *env = getenv("RL_SERVE_BENCH_SECONDS");
    if (env) seconds = atof(env);
    if ((env = getenv("RL_BENCH_ROUNDS"))) rounds = atoi(env);
    bool want[MAX_SERVERS] = {true, true, true}, only = false;
    const char *names[MAX_SERVERS] = {"rnnlua", "nobatch", "torch"};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--clients") == 0 && i + 1 < argc) {
            nclients = 0;
            for (char *t = strtok(argv[++i], ","); t && nclients < 8; t = strtok(NULL, ","))
                clients[nclients++] = atoi(t);
        } else if (strcmp(argv[i], "--max-batch-frames") == 0 && i + 1 < argc) {
            mbf = argv[++i];
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            if (!only) want[0] = want[1] = want[2] = false;
            only = true;
            i++;
            for (int k = 0; k < MAX_SERVERS; k++)
                if (strcmp(argv[i], names[k]) == 0) want[k] = true;
        } else {
            die("unknown argument %s (--clients 1,8,32 --seconds S --rounds R --only NAME "
                "--max-batch-frames F)",
                argv[i]);
        }
    }
    if (rounds < 1 || rounds > 99 || !(seconds > 0)) die("bad --rounds or --seconds%s", "");

    /* BUILD/bench/serve -> BUILD */
    char build[4096];
    snprintf(build, sizeof build, "%s", argv[0]);
    for (int k = 0; k < 2; k++) {
        char *slash = strrchr(build, '/');
        if (slash == NULL) die("run me as BUILD/bench/serve, not %s", argv[0]);
        *slash = '\0';
    }
    char rnnlua[4200], dir[] = "/tmp/rnnlua-bench-serve-XXXXXX", model[4200], weights[4200];
    snprintf(rnnlua, sizeof rnnlua, "%s/rnnlua", build);
    if (mkdtemp(dir) == NULL) die("cannot make a temporary directory%s", "");
    snprintf(model, sizeof model, "%s/model.h5", dir);
    snprintf(weights, sizeof weights, "%s/weights.txt", dir);
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "'%s' -e 'rl.manual_seed(1)\n"
             "local net = rl.network({fw = {class = \"lstm\", n_out = 32},\n"
             "  bw = {class = \"lstm\", n_out = 32, direction = -1},\n"
             "  output = {class = \"softmax\", from = {\"fw\", \"bw\"}, loss = \"ce\", target = "
             "\"classes\"}},\n"
             "  {data = {dim = 9}, classes = {dim = 2, sparse = true}})\n"
             "rl.save_checkpoint(\"%s\", {net = net, epoch = 1})\n"
             "local f = assert(io.open(\"%s\", \"w\"))\n"
             "for _, p in ipairs(net:param_list()) do\n"
             "  local v = p.value:contiguous():view(p.value:numel()):totable()\n"
             "  f:write(p.layer, \"/\", p.name, \" \", #v)\n"
             "  for _, x in ipairs(v) do f:write(string.format(\" %%.9g\", x)) end\n"
             "  f:write(\"\\n\")\n"
             "end\n"
             "f:close()'",
             rnnlua, model, weights);
    if (system(cmd) != 0) die("could not write the checkpoint with %s", rnnlua);
    make_requests();

    char py[4096] = "";
    if (want[2]) {
        snprintf(cmd, sizeof cmd, "bash bench/torch_env.sh '%s' 2>/dev/null | tail -n 1", build);
        FILE *p = popen(cmd, "r");
        if (p && fgets(py, sizeof py, p)) py[strcspn(py, "\n")] = '\0';
        if (p) pclose(p);
        if (access(py, X_OK) != 0) py[0] = '\0';
    }

    server sv[MAX_SERVERS] = {{"rnnlua serve, dynamic batching", 0, 0},
                              {"rnnlua serve, no batching", 0, 0},
                              {"PyTorch http.server", 0, 0}};
    char *a0[] = {rnnlua, "serve", model, "--port", "0", "--max-batch-frames", mbf, NULL};
    char *a1[] = {rnnlua, "serve", model, "--port", "0", "--max-batch-frames", "0", NULL};
    char *a2[] = {py, "bench/torch_serve.py", weights, NULL};
    char **args[MAX_SERVERS] = {a0, a1, a2};
    for (int k = 0; k < MAX_SERVERS; k++) {
        if (!want[k] || (k == 2 && py[0] == '\0')) continue;
        if (start_server(&sv[k], args[k]) != 0) die("%s did not start", sv[k].name);
    }

    printf("### Serving: 12AX BLSTM, 100-frame requests (rnnlua serve vs PyTorch http.server)\n\n");
    /* the same numbers from every server */
    double ref[2 * T_FRAMES], v[2 * T_FRAMES];
    int have_ref = 0;
    char *buf = malloc(1 << 20);
    for (int k = 0; k < MAX_SERVERS; k++) {
        if (sv[k].port == 0) continue;
        int fd = connect_to(sv[k].port);
        int st = fd >= 0 ? exchange(fd, requests[0], request_len[0], buf, 1 << 20) : -1;
        if (fd >= 0) close(fd);
        if (st != 200 || output_values(buf, v, 2 * T_FRAMES) != 2 * T_FRAMES)
            die("%s did not answer a request correctly", sv[k].name);
        if (!have_ref) {
            memcpy(ref, v, sizeof ref);
            have_ref = 1;
            continue;
        }
        double md = 0;
        for (int i = 0; i < 2 * T_FRAMES; i++)
            md = fmax(md, fabs(v[i] - ref[i]));
        printf("- %s: answers differ from the first server's by at most %.2g\n", sv[k].name, md);
        if (md > 1e-4) die("%s computes another function", sv[k].name);
    }
    if (want[2] && py[0] == '\0')
        printf("- SKIP PyTorch server: `bash bench/torch_env.sh %s` gave no python\n", build);
    /* warm-up: PyTorch's first requests are slow, and every server's buffers settle */
    for (int k = 0; k < MAX_SERVERS; k++)
        if (sv[k].port) run_load(sv[k].port, 8, 0.5);
    printf("- %d rounds of %.1f s per cell, servers interleaved; clients are threads of the bench "
           "program on the same machine (closed loop, keep-alive)\n\n",
           rounds, seconds);
    printf("| clients | server | requests/s | p50 ms | p99 ms | failed |\n");
    printf("|---:|---|---:|---:|---:|---:|\n");
    double best_rps[8][MAX_SERVERS];
    for (int ci = 0; ci < nclients; ci++) {
        double rps[MAX_SERVERS][99], p50[MAX_SERVERS][99], p99[MAX_SERVERS][99];
        long failed[MAX_SERVERS] = {0};
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < MAX_SERVERS; k++) {
                if (sv[k].port == 0) continue;
                result res = run_load(sv[k].port, clients[ci], seconds);
                rps[k][r] = res.rps;
                p50[k][r] = res.p50;
                p99[k][r] = res.p99;
                failed[k] += res.failed;
            }
        for (int k = 0; k < MAX_SERVERS; k++) {
            if (sv[k].port == 0) continue;
            best_rps[ci][k] = median(rps[k], rounds);
            printf("| %d | %s | %.0f | %.2f | %.2f | %ld |\n", clients[ci], sv[k].name,
                   best_rps[ci][k], median(p50[k], rounds), median(p99[k], rounds), failed[k]);
        }
        fflush(stdout);
    }
    if (sv[0].port && sv[2].port) {
        printf("\nThroughput of rnnlua serve (dynamic batching) over the PyTorch server:");
        for (int ci = 0; ci < nclients; ci++)
            printf("%s%d clients %.1fx", ci ? ", " : " ", clients[ci],
                   best_rps[ci][0] / best_rps[ci][2]);
        printf(".\n");
    }
    for (int k = 0; k < MAX_SERVERS; k++)
        stop_server(&sv[k]);
    free(buf);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench serve: could not remove %s\n", dir);
    return 0;
}
