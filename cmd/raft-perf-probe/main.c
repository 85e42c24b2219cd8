/* raft-perf-probe: the RaftPerfProbe equivalent.
 *
 * Three nodes (raft log store on a memory volume or on disk + apply pipeline +
 * KV state machine + in-process hub or TCP transport) in this process. It
 * measures:
 *   serial     - one put at a time on the leader, p50 and p99 latency;
 *   pipelined  - rounds of RAFT_PROBE_INFLIGHT puts in flight for
 *                RAFT_PROBE_SECONDS: sustained = entries / wall time; each
 *                round's own throughput gives the round median, p10 and p90;
 *   allocation - bytes allocated (through tk_malloc) per entry;
 *   floor      - for TCP, a plain loopback ping-pong in the same run.
 * Knobs (environment): RAFT_PROBE_SECONDS (5), RAFT_PROBE_NET=inproc|tcp,
 * RAFT_PROBE_COMMITTED=1, RAFT_PROBE_ROUNDS (a cap on rounds), RAFT_PROBE_HOLD
 * (seconds to keep the cluster up afterwards, for profiling),
 * RAFT_PROBE_INFLIGHT (800), RAFT_PROBE_STORE=mem|fs, RAFT_PROBE_VALUE_BYTES
 * (16), RAFT_PROBE_ONE_LOOP=1 (in-process: all three nodes on one loop thread),
 * RAFT_PROBE_SERIAL (2000 serial puts), RAFT_PROBE_SPIN_US (tk_options.spin_us: loops and
 * waiters poll, yielding, this long before sleeping; the serial phase reports the
 * process's CPU per put beside its latency, which is what the spinning costs). Last line:
 * the longest loop turn the nodes logged (they log those over 100 ms).
 * `--all` runs inproc-applied, tcp-applied and tcp-committed alternately
 * three times and reports medians. Prints a table and one JSON line per shape.
 * --plot FILE.svg draws each pipelined round's throughput against the time
 * it ended, one line per shape (with --all, its first run), and the sustained
 * throughput as a dashed line (bench_plot.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/log.h"
#include "cmd/benchplot/bench_plot.h"
#include "include/tierkv.h"

struct shape {
    const char *net; /* "inproc" or "tcp" */
    bool committed;
    const char *store; /* "mem" or "fs" */
};

struct result {
    double serial_p50_us, serial_p99_us;
    double serial_cpu_us; /* the process's CPU (all threads) per serial put:
                             what a spinning loop (RAFT_PROBE_SPIN_US) costs */
    double sustained;
    double round_median, round_p10, round_p90;
    double alloc_per_entry;
    double floor_rtt_p50_us;
    uint64_t entries;
    double early_ops_per_s;      /* the first fifth of the pipelined run */
    double late_ops_per_s;       /* the last fifth: flat when compaction works */
    double max_round_ms;         /* the slowest round: the longest stall */
    uint64_t failed;             /* proposals that failed (busy or lost) */
    double late_alloc_per_entry; /* bytes allocated per entry over the last
                                    fifth: the steady state, without the
                                    one-time growth of rings and arrays */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* User + system CPU time of the whole process, in seconds. */
static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : def;
}

/* The nodes' slow-turn warnings (msg="slow loop turn" turn_ms=N ... phase=P;
 * a node logs every turn past half its election timeout): the longest seen,
 * over the whole run. Other lines go to stderr as before. */
static pthread_mutex_t slow_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long slow_turn_max_ms;
static unsigned long slow_turns;
static char slow_turn_phase[16] = "-";

static void probe_log_sink(const char *line, size_t len, void *data)
{
    (void)data;
    fwrite(line, 1, len, stderr);
    static const char key[] = "msg=\"slow loop turn\" turn_ms=";
    const char *p = memmem(line, len, key, sizeof(key) - 1);
    if (p == NULL)
        return;
    unsigned long long ms = strtoull(p + sizeof(key) - 1, NULL, 10);
    const char *ph = memmem(p, len - (size_t)(p - line), " phase=", 7);
    pthread_mutex_lock(&slow_mu);
    if (ms > 100)
        slow_turns++;
    if (ms > slow_turn_max_ms) {
        slow_turn_max_ms = ms;
        if (ph == NULL || sscanf(ph + 7, "%15[a-z_]", slow_turn_phase) != 1)
            snprintf(slow_turn_phase, sizeof(slow_turn_phase), "-");
    }
    pthread_mutex_unlock(&slow_mu);
}

/* The library's log lines (tk_options.log_cb) into the same sink: the nodes
 * log through libtierkv's logger, which tk_*_start sets up. */
static enum tk_log_level probe_log_level = TK_LOG_WARN;

static void probe_log_cb(enum tk_loglevel level, const char *line, void *data)
{
    (void)level;
    char buf[1024];
    int n = snprintf(buf, sizeof(buf), "%s\n", line);
    if (n > 0)
        probe_log_sink(buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1, data);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i];
}

/* ---- the plain loopback floor ------------------------------------------ */

static void *echo_server(void *arg)
{
    int ls = *(int *)arg;
    int c = accept(ls, NULL, NULL);
    if (c < 0)
        return NULL;
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[64];
    for (;;) {
        ssize_t got = 0;
        while (got < 64) {
            ssize_t r = read(c, buf + got, (size_t)(64 - got));
            if (r <= 0)
                goto out;
            got += r;
        }
        if (write(c, buf, 64) != 64)
            break;
    }
out:
    close(c);
    return NULL;
}

static double floor_rtt_p50_us(int iters)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
        close(ls);
        return 0;
    }
    pthread_t t;
    pthread_create(&t, NULL, echo_server, &ls);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(c);
        close(ls);
        pthread_join(t, NULL);
        return 0;
    }
    char buf[64] = {0};
    double *lat = malloc(sizeof(double) * (size_t)iters);
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = tk_mono_ns();
        if (write(c, buf, 64) != 64)
            break;
        ssize_t got = 0;
        while (got < 64) {
            ssize_t r = read(c, buf + got, (size_t)(64 - got));
            if (r <= 0)
                break;
            got += r;
        }
        lat[i] = (double)(tk_mono_ns() - t0) / 1000.0;
    }
    close(c);
    pthread_join(t, NULL);
    close(ls);
    double p50 = quantile(lat, (size_t)iters, 0.5);
    free(lat);
    return p50;
}

/* ---- the cluster ------------------------------------------------------- */

struct probe_cluster {
    struct tk_cluster *inproc;
    struct tk_node *tcp[3];
    struct tk_node *leader;
    char dir[256];
};

static uint16_t free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    uint16_t port = 0;
    if (bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

static int cluster_up(const struct shape *sh, struct probe_cluster *pc)
{
    memset(pc, 0, sizeof(*pc));
    struct tk_options o;
    tk_options_default(&o);
    o.kv_no_sync = true; /* the KV cold tier is not what is measured */
    o.log_level = (enum tk_loglevel)(probe_log_level + 1);
    o.log_cb = probe_log_cb;
    o.snapshot_entries = 2000000;
    o.trailing_entries = 100000;
    o.queue_max = 1u << 17;
    o.one_loop = env_long("RAFT_PROBE_ONE_LOOP", 0) == 1;
    o.spin_us = (uint32_t)env_long("RAFT_PROBE_SPIN_US", 0);
    /* A smaller LMDB map (MiB) for tools that cannot map the default 64 GiB,
     * such as valgrind. */
    o.kv_map_bytes = (size_t)env_long("RAFT_PROBE_KV_MAP_MB", 0) << 20;
    if (strcmp(sh->store, "fs") == 0) {
        snprintf(pc->dir, sizeof(pc->dir), "/tmp/raft-probe-XXXXXX");
        if (mkdtemp(pc->dir) == NULL)
            return TK_EIO;
        o.data_dir = pc->dir;
    }
    if (strcmp(sh->net, "inproc") == 0) {
        int rc = tk_cluster_start(3, &o, &pc->inproc);
        if (rc != 0)
            return rc;
        return tk_cluster_wait_leader(pc->inproc, 10000, &pc->leader);
    }
    o.n_members = 3;
    for (int i = 0; i < 3; i++) {
        o.members[i].id = (uint64_t)i + 1;
        o.members[i].host = "127.0.0.1";
        o.members[i].port = free_port();
    }
    for (int i = 0; i < 3; i++) {
        o.id = (uint64_t)i + 1;
        o.seed = (uint64_t)i + 7;
        char sub[300];
        if (o.data_dir) {
            snprintf(sub, sizeof(sub), "%s/n%d", pc->dir, i + 1);
            o.data_dir = sub;
        }
        int rc = tk_node_start(&o, &pc->tcp[i]);
        if (o.data_dir)
            o.data_dir = pc->dir;
        if (rc != 0)
            return rc;
    }
    for (int waited = 0; waited < 10000; waited += 10) {
        for (int i = 0; i < 3; i++) {
            struct tk_status st;
            tk_node_status(pc->tcp[i], &st);
            if (st.is_leader) {
                pc->leader = pc->tcp[i];
                return 0;
            }
        }
        usleep(10000);
    }
    return TK_ETIMEDOUT;
}

static void cluster_down(struct probe_cluster *pc)
{
    if (pc->inproc)
        tk_cluster_stop(pc->inproc);
    for (int i = 0; i < 3; i++)
        tk_node_stop(pc->tcp[i]);
    if (pc->dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", pc->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", pc->dir);
    }
}

/* ---- the rounds -------------------------------------------------------- */

struct round {
    atomic_long left;
    atomic_long failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
};

static void on_done(int status, const struct tk_write_result *res, void *data)
{
    struct round *r = data;
    (void)res;
    if (status != 0 && atomic_fetch_add(&r->failed, 1) == 0)
        fprintf(stderr, "probe: a proposal failed: %s\n", tk_strerror(status));
    if (atomic_fetch_sub(&r->left, 1) == 1) {
        pthread_mutex_lock(&r->mu);
        r->done = true;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

static const char *plot_path; /* --plot */
static struct bench_plot plot;

static void shape_name(const struct shape *sh, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s/%s", sh->net, sh->committed ? "committed" : "applied",
             sh->store);
}

/* --plot: the rounds of a shape's first run. */
static void plot_rounds(const struct shape *sh, const double *rate, const double *end,
                        size_t n, double sustained)
{
    char name[64];
    shape_name(sh, name, sizeof(name));
    if (plot_path == NULL)
        return;
    for (size_t i = 0; i < plot.n_series; i++)
        if (strcmp(plot.series[i].name, name) == 0)
            return;
    int s = bench_plot_series(&plot, 0, name);
    for (size_t i = 0; i < n; i++)
        bench_plot_point(&plot, s, end[i], rate[i]);
    char line[96];
    snprintf(line, sizeof(line), "%s sustained", name);
    bench_plot_hline(&plot, 0, line, sustained);
}

/* One shape's run: its knobs (from the environment), its cluster and the
 * value every put writes. */
struct probe_run {
    const struct shape *sh;
    bool tty; /* stderr is a terminal: show progress */
    double seconds;
    long inflight, max_rounds, value_bytes;
    enum tk_mode mode;
    struct probe_cluster pc;
    char *value;
};

/* Warm-up, then serial latency: one put at a time on the leader. */
static void run_serial(struct probe_run *pr, struct result *out)
{
    char key[32];
    for (int i = 0; i < 200; i++) {
        int kl = snprintf(key, sizeof(key), "w%d", i);
        (void)tk_put(pr->pc.leader, key, (size_t)kl, pr->value, (size_t)pr->value_bytes,
                     pr->mode, NULL);
    }
    int serial = (int)env_long("RAFT_PROBE_SERIAL", 2000);
    if (serial < 1)
        serial = 1;
    double *lat = malloc(sizeof(double) * (size_t)serial);
    int ok = 0;
    double cpu0 = process_cpu_s();
    for (int i = 0; i < serial; i++) {
        int kl = snprintf(key, sizeof(key), "s%d", i % 1000);
        uint64_t t0 = tk_mono_ns();
        if (tk_put(pr->pc.leader, key, (size_t)kl, pr->value, (size_t)pr->value_bytes,
                   pr->mode, NULL) == 0)
            lat[ok++] = (double)(tk_mono_ns() - t0) / 1000.0;
    }
    if (ok > 0)
        out->serial_cpu_us = (process_cpu_s() - cpu0) * 1e6 / ok;
    out->serial_p50_us = quantile(lat, (size_t)ok, 0.5);
    out->serial_p99_us = quantile(lat, (size_t)ok, 0.99);
    free(lat);
}

/* One round: `inflight` puts submitted at once (keys from *k on), then a
 * wait for every completion. Sets *t0 to its start; returns how many were
 * submitted (r->failed says how many of those failed). */
static long round_run(struct probe_run *pr, struct round *r, uint64_t *k, double *t0)
{
    atomic_store(&r->left, pr->inflight);
    atomic_store(&r->failed, 0);
    r->done = false;
    *t0 = now_s();
    char key[32];
    long submitted = 0;
    for (long i = 0; i < pr->inflight; i++) {
        int kl =
            snprintf(key, sizeof(key), "p%llu", (unsigned long long)((*k)++ % 100000));
        if (tk_put_async(pr->pc.leader, key, (size_t)kl, pr->value,
                         (size_t)pr->value_bytes, pr->mode, on_done, r) == 0)
            submitted++;
    }
    long unsent = pr->inflight - submitted;
    if (unsent > 0 && atomic_fetch_sub(&r->left, unsent) == unsent)
        r->done = true;
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return submitted;
}

/* The pipelined rounds, one entry per round. */
struct rounds {
    size_t n, cap;
    double *rate;    /* entries/s of the round */
    double *end;     /* seconds into the phase when it ended */
    uint64_t *total; /* entries written by then */
};

/* The round figures of `out`: quantiles of the rounds' rates (sorting
 * rd->rate), and throughput over the first and the last fifth of `wall`. */
static void rounds_summarise(struct rounds *rd, double wall, struct result *out)
{
    out->round_median = quantile(rd->rate, rd->n, 0.5);
    out->round_p10 = quantile(rd->rate, rd->n, 0.1);
    out->round_p90 = quantile(rd->rate, rd->n, 0.9);
    size_t e_end = 0, l_begin = 0, n = rd->n;
    for (size_t i = 0; i < n; i++) {
        if (rd->end[i] <= wall * 0.2)
            e_end = i;
        if (rd->end[i] <= wall * 0.8)
            l_begin = i;
    }
    if (n > 2 && rd->end[e_end] > 0)
        out->early_ops_per_s = (double)rd->total[e_end] / rd->end[e_end];
    if (n > 2 && rd->end[n - 1] > rd->end[l_begin])
        out->late_ops_per_s = (double)(rd->total[n - 1] - rd->total[l_begin]) /
                              (rd->end[n - 1] - rd->end[l_begin]);
}

static void print_progress(const struct shape *sh, double at_s, uint64_t entries)
{
    fprintf(stderr, "\r  %s/%s/%s: %4.1fs  %llu entries  %.0f op/s   ", sh->net,
            sh->committed ? "committed" : "applied", sh->store, at_s,
            (unsigned long long)entries, (double)entries / at_s);
}

/* Pipelined rounds for pr->seconds (or pr->max_rounds rounds). */
static void run_pipelined(struct probe_run *pr, struct result *out)
{
    struct rounds rd = {.cap = 1 << 16};
    rd.rate = malloc(sizeof(double) * rd.cap);
    rd.end = malloc(sizeof(double) * rd.cap);
    rd.total = malloc(sizeof(uint64_t) * rd.cap);
    uint64_t entries = 0, failures = 0, k = 0, entries_late = 0;
    struct tk_alloc_stats a0, a1, a_late = {0};
    tk_alloc_stats(&a0);
    double t_start = now_s(), last_print = t_start;
    struct round r;
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    bool late = false;
    while (now_s() - t_start < pr->seconds && rd.n < rd.cap &&
           (pr->max_rounds == 0 || (long)rd.n < pr->max_rounds)) {
        double t0;
        long submitted = round_run(pr, &r, &k, &t0);
        if (!late && now_s() - t_start >= pr->seconds * 0.8) {
            late = true;
            tk_alloc_stats(&a_late);
            entries_late = entries;
        }
        double dt = now_s() - t0;
        if (dt * 1000.0 > out->max_round_ms)
            out->max_round_ms = dt * 1000.0;
        long good = submitted - atomic_load(&r.failed);
        failures += (uint64_t)(pr->inflight - good);
        entries += (uint64_t)good;
        rd.rate[rd.n] = (double)good / dt;
        rd.end[rd.n] = now_s() - t_start;
        rd.total[rd.n] = entries;
        rd.n++;
        if (pr->tty && now_s() - last_print > 0.5) {
            last_print = now_s();
            print_progress(pr->sh, last_print - t_start, entries);
        }
    }
    double wall = now_s() - t_start;
    tk_alloc_stats(&a1);
    if (pr->tty)
        fprintf(stderr, "\r%70s\r", "");
    out->entries = entries;
    out->sustained = (double)entries / wall;
    plot_rounds(pr->sh, rd.rate, rd.end, rd.n, out->sustained); /* before the sort */
    rounds_summarise(&rd, wall, out);
    out->alloc_per_entry = entries ? (double)(a1.bytes - a0.bytes) / (double)entries : 0;
    if (late && entries > entries_late)
        out->late_alloc_per_entry =
            (double)(a1.bytes - a_late.bytes) / (double)(entries - entries_late);
    out->failed = failures;
    if (failures > 0)
        fprintf(stderr, "probe: %llu proposals failed (busy or lost)\n",
                (unsigned long long)failures);
    free(rd.rate);
    free(rd.end);
    free(rd.total);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
}

static int run_shape(const struct shape *sh, struct result *out, bool tty)
{
    memset(out, 0, sizeof(*out));
    struct probe_run pr = {.sh = sh,
                           .tty = tty,
                           .seconds = (double)env_long("RAFT_PROBE_SECONDS", 5),
                           .inflight = env_long("RAFT_PROBE_INFLIGHT", 800),
                           .max_rounds = env_long("RAFT_PROBE_ROUNDS", 0),
                           .value_bytes = env_long("RAFT_PROBE_VALUE_BYTES", 16),
                           .mode = sh->committed ? TK_MODE_COMMITTED : TK_MODE_APPLIED};
    if (pr.inflight < 1 || pr.value_bytes < 0 || pr.value_bytes > (1 << 20))
        return TK_EINVAL;
    int rc = cluster_up(sh, &pr.pc);
    if (rc != 0) {
        fprintf(stderr, "probe: cluster did not start: %s\n", tk_strerror(rc));
        cluster_down(&pr.pc);
        return rc;
    }
    pr.value = calloc(1, (size_t)pr.value_bytes + 1);
    memset(pr.value, 'v', (size_t)pr.value_bytes);
    run_serial(&pr, out);
    run_pipelined(&pr, out);
    long hold = env_long("RAFT_PROBE_HOLD", 0);
    if (hold > 0)
        sleep((unsigned)hold);
    cluster_down(&pr.pc);
    free(pr.value);
    if (strcmp(sh->net, "tcp") == 0)
        out->floor_rtt_p50_us = floor_rtt_p50_us(5000);
    return 0;
}

static void print_header(void)
{
    printf("| engine | transport / completion | store | serial p50 (p99) | pipelined "
           "sustained | round median (p10/p90) | alloc/entry | loopback floor p50 | "
           "CPU per serial put |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
}

static void print_row(const struct shape *sh, const struct result *r)
{
    char floor[32] = "-";
    if (r->floor_rtt_p50_us > 0)
        snprintf(floor, sizeof(floor), "%.1f us", r->floor_rtt_p50_us);
    printf("| tierkv | %s, %s | %s | %.1f us (%.1f us) | %.0f op/s | %.0f (%.0f/%.0f) | "
           "%.0f B | %s | %.1f us |\n",
           strcmp(sh->net, "tcp") == 0 ? "TCP" : "in-proc",
           sh->committed ? "committed" : "applied", sh->store, r->serial_p50_us,
           r->serial_p99_us, r->sustained, r->round_median, r->round_p10, r->round_p90,
           r->alloc_per_entry, floor, r->serial_cpu_us);
}

/* The longest loop turn the nodes reported (they report those over 100 ms). */
static void print_slow_turns(void)
{
    pthread_mutex_lock(&slow_mu);
    if (slow_turns == 0)
        printf("longest loop turn: none over 100 ms\n");
    else
        printf("longest loop turn: %llu ms, in %s (%lu turns over 100 ms)\n",
               slow_turn_max_ms, slow_turn_phase, slow_turns);
    pthread_mutex_unlock(&slow_mu);
}

static void print_json(const struct shape *sh, const struct result *r, int runs)
{
    printf("{\"bench\":\"raft-probe\",\"net\":\"%s\",\"mode\":\"%s\",\"store\":\"%s\","
           "\"runs\":%d,\"serial_p50_us\":%.1f,\"serial_p99_us\":%.1f,"
           "\"sustained_ops_per_s\":%.0f,\"round_median_ops_per_s\":%.0f,"
           "\"round_p10_ops_per_s\":%.0f,\"round_p90_ops_per_s\":%.0f,"
           "\"alloc_bytes_per_entry\":%.0f,\"entries\":%llu,"
           "\"early_ops_per_s\":%.0f,\"late_ops_per_s\":%.0f,\"max_round_ms\":%.1f,"
           "\"failed\":%llu,\"late_alloc_bytes_per_entry\":%.0f,"
           "\"serial_cpu_us_per_op\":%.1f,\"spin_us\":%ld",
           sh->net, sh->committed ? "committed" : "applied", sh->store, runs,
           r->serial_p50_us, r->serial_p99_us, r->sustained, r->round_median,
           r->round_p10, r->round_p90, r->alloc_per_entry, (unsigned long long)r->entries,
           r->early_ops_per_s, r->late_ops_per_s, r->max_round_ms,
           (unsigned long long)r->failed, r->late_alloc_per_entry, r->serial_cpu_us,
           env_long("RAFT_PROBE_SPIN_US", 0));
    if (strcmp(sh->net, "tcp") == 0)
        printf(",\"floor_rtt_p50_us\":%.1f", r->floor_rtt_p50_us);
    printf("}\n");
}

/* Median of each field over runs. */
static void median_result(struct result *runs, int n, struct result *out)
{
    double v[16];
#define MED(f)                                                                           \
    do {                                                                                 \
        for (int i = 0; i < n; i++)                                                      \
            v[i] = runs[i].f;                                                            \
        out->f = quantile(v, (size_t)n, 0.5);                                            \
    } while (0)
    MED(serial_p50_us);
    MED(serial_p99_us);
    MED(serial_cpu_us);
    MED(sustained);
    MED(round_median);
    MED(round_p10);
    MED(round_p90);
    MED(alloc_per_entry);
    MED(floor_rtt_p50_us);
    MED(early_ops_per_s);
    MED(late_ops_per_s);
    MED(entries);
    MED(max_round_ms);
    MED(late_alloc_per_entry);
    MED(failed);
#undef MED
}

static int plot_finish(void)
{
    if (plot_path == NULL)
        return 0;
    int rc = bench_plot_write(&plot, plot_path);
    bench_plot_free(&plot);
    if (rc == 0)
        fprintf(stderr, "raft-perf-probe: plot written to %s\n", plot_path);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) {
            all = true;
        } else if (strcmp(argv[i], "--plot") == 0 && i + 1 < argc) {
            plot_path = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: raft-perf-probe [--all] [--plot FILE.svg]\n"
                   "environment: RAFT_PROBE_SECONDS=5 RAFT_PROBE_NET=inproc|tcp "
                   "RAFT_PROBE_COMMITTED=0|1\n"
                   "  RAFT_PROBE_ROUNDS RAFT_PROBE_HOLD RAFT_PROBE_INFLIGHT=800 "
                   "RAFT_PROBE_STORE=mem|fs RAFT_PROBE_VALUE_BYTES=16 "
                   "RAFT_PROBE_ONE_LOOP=0|1 RAFT_PROBE_SPIN_US=0 RAFT_PROBE_SERIAL=2000 "
                   "RAFT_PROBE_KV_MAP_MB=0 (default map)\n");
            return 0;
        } else {
            fprintf(stderr, "raft-perf-probe: unknown argument '%s' (try --help)\n",
                    argv[i]);
            return 2;
        }
    }
    enum tk_log_level lvl = TK_LOG_WARN;
    const char *ll = getenv("RAFT_PROBE_LOG");
    if (ll != NULL && tk_log_parse_level(ll, &lvl) != 0) {
        fprintf(stderr, "raft-perf-probe: RAFT_PROBE_LOG=%s is not a log level\n", ll);
        return 2;
    }
    tk_log_set_level(lvl);
    tk_log_set_sink(probe_log_sink, NULL);
    probe_log_level = lvl;
    bool tty = isatty(2);
    if (plot_path != NULL) {
        bench_plot_init(&plot, all ? "raft-perf-probe --all: pipelined rounds, 3 nodes"
                                   : "raft-perf-probe: pipelined rounds, 3 nodes");
        bench_plot_panel(&plot, "throughput of each round (puts in flight / round time)",
                         "seconds into the run", "puts/s", false, false);
    }
    const char *store = getenv("RAFT_PROBE_STORE");
    if (store == NULL || (strcmp(store, "fs") != 0 && strcmp(store, "mem") != 0))
        store = "mem";
    if (!all) {
        const char *net = getenv("RAFT_PROBE_NET");
        struct shape sh = {.net = net && strcmp(net, "tcp") == 0 ? "tcp" : "inproc",
                           .committed = env_long("RAFT_PROBE_COMMITTED", 0) == 1,
                           .store = store};
        struct result r;
        if (run_shape(&sh, &r, tty) != 0)
            return 1;
        print_header();
        print_row(&sh, &r);
        print_json(&sh, &r, 1);
        print_slow_turns();
        return plot_finish();
    }
    const struct shape shapes[3] = {
        {"inproc", false, store}, {"tcp", false, store}, {"tcp", true, store}};
    struct result runs[3][3];
    for (int rep = 0; rep < 3; rep++)
        for (int s = 0; s < 3; s++)
            if (run_shape(&shapes[s], &runs[s][rep], tty) != 0)
                return 1;
    print_header();
    struct result med[3];
    for (int s = 0; s < 3; s++) {
        median_result(runs[s], 3, &med[s]);
        print_row(&shapes[s], &med[s]);
    }
    for (int s = 0; s < 3; s++)
        print_json(&shapes[s], &med[s], 3);
    print_slow_turns();
    return plot_finish();
}
