/* store-bench: how fast the Raft log store makes entries durable.
 *
 * Measures, on the fs backend (in --dir, default $TMPDIR or /tmp) and on the
 * memory volume:
 *   - the floor: a plain 4 KiB append + fdatasync loop in the same directory
 *     (and the same into a preallocated file, which is what the store does);
 *   - append throughput (entries/s, MB/s), fdatasync calls per entry and
 *     per-batch latency p50/p99 for 64 B and 4 KiB entries, batches of 1, 16
 *     and 256, with 1 appender (the synchronous store_append, and the async
 *     path with a wait for the callback) and with 64 concurrent appenders
 *     (async, each waiting for its own completion: group commit);
 *   - throughput of 64 appenders x 64 B on a log holding 10k entries and on
 *     one holding 5M entries (O(1) addressing: no slowdown with length);
 *   - time to open and recover a 1 GiB log, with the page cache warm and
 *     after dropping the files' pages (posix_fadvise DONTNEED).
 * Each figure is the median of several runs. Prints a table and one JSON
 * line. --quick shortens everything (a smoke run under 30 s; the 5M and
 * 1 GiB figures then come from smaller logs and say so in the JSON).
 *
 * --plot FILE.svg draws the fs figures for 64 B entries (bench_plot.h):
 * entries/s and p99 against batch size, one line per appender shape, with
 * the 4 KiB append + fdatasync floor (p50 and p99) drawn on the latency panel.
 *
 * --only appenders|length runs one part alone (for A/B runs of a change);
 * --log-entries N sets the long log's length (default 5M, --quick 200k);
 * --seconds S sets each measurement window (default 1, --quick 0.05);
 * --mem-sync-us N runs --only appenders on a memory volume whose syncs take
 * N us (a disk without the neighbours' noise: for A/B runs of the CPU path
 * and the overlap of wake-ups with syncs).
 *
 * Usage: store-bench [--quick] [--dir DIR] [--runs N] [--recovery-only]
 *                    [--plot FILE.svg] [--only appenders|length]
 *                    [--log-entries N] [--seconds S]
 *                    [--mem-sync-us N] */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/blob.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/log.h"
#include "cmd/benchplot/bench_args.h"
#include "cmd/benchplot/bench_plot.h"
#include "store/store.h"

static bool quick;
static bool recovery_only;
static int runs = 3;
static char base_dir[4096];
static int dir_seq;
static const char *plot_path; /* --plot */
static const char *only;      /* --only appenders|length: one part alone */
static uint64_t log_entries;  /* --log-entries: the long log (0 = default) */
static double window_s;       /* --seconds: one measurement window (0 = default) */
static unsigned mem_sync_us;  /* --mem-sync-us: --only appenders on a memory
                                 volume whose syncs take this long */
static struct bench_plot plot;

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void rmrf(const char *dir)
{
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void fresh_dir(char *out, size_t len)
{
    snprintf(out, len, "%s/run-%d", base_dir, dir_seq++);
    rmrf(out);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static struct store *open_store(int backend, const char *dir,
                                struct store_mem_volume **vol)
{
    struct store *s;
    char err[STORE_ERRMSG_MAX];
    int rc;
    if (backend == 0) {
        *vol = store_mem_volume_new();
        struct store_options o;
        store_options_default(&o);
        o.mem_sync_latency_us = mem_sync_us;
        rc = store_open_mem(*vol, &o, &s, NULL, err, sizeof(err));
    } else {
        rc = store_open_fs(dir, NULL, &s, NULL, err, sizeof(err));
    }
    if (rc != 0) {
        fprintf(stderr, "store-bench: open: %s: %s\n", tk_errname(rc), err);
        exit(1);
    }
    return s;
}

/* ---- the floor ---------------------------------------------------------- */

static double floor_p50_us(bool prealloc, int n, double *p99)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/floor", base_dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | (prealloc ? 0 : O_APPEND), 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    if (prealloc) {
        if (fallocate(fd, 0, 0, (off_t)n * 4096) != 0)
            perror("fallocate");
        fsync(fd);
    }
    static uint8_t buf[4096];
    memset(buf, 0x5a, sizeof(buf));
    struct tk_hist h;
    tk_hist_init(&h);
    for (int i = 0; i < n; i++) {
        uint64_t t0 = tk_mono_ns();
        ssize_t w = prealloc ? pwrite(fd, buf, sizeof(buf), (off_t)i * 4096)
                             : write(fd, buf, sizeof(buf));
        if (w != (ssize_t)sizeof(buf) || fdatasync(fd) != 0) {
            perror("floor write");
            exit(1);
        }
        tk_hist_record(&h, tk_mono_ns() - t0);
    }
    close(fd);
    unlink(path);
    *p99 = (double)tk_hist_quantile(&h, 0.99) / 1000.0;
    return (double)tk_hist_quantile(&h, 0.5) / 1000.0;
}

/* The comparison the targets ask for, made robust to a drifting machine: one
 * synchronous batch-of-1 append (64 B entry) to a fresh fs store, then one
 * plain 4 KiB O_APPEND write + fdatasync, alternately, `n` times each, in the
 * same directory. Returns the two p50s in microseconds. */
static void floor_interleaved(int n, double *store_p50, double *floor_p50)
{
    char dir[4200], path[4200];
    fresh_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/floor-interleaved", base_dir);
    struct store_mem_volume *vol = NULL;
    struct store *s = open_store(1, dir, &vol);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    static uint8_t buf[4096];
    memset(buf, 0x5a, sizeof(buf));
    struct tk_blob *blob = tk_blob_new(64);
    memset(blob->data, 1, 64);
    struct tk_hist hs, hf;
    tk_hist_init(&hs);
    tk_hist_init(&hf);
    for (int i = 0; i < n; i++) {
        struct raft_entry e = {.index = (uint64_t)i + 1, .term = 1, .data = blob};
        uint64_t t0 = tk_mono_ns();
        if (store_append(s, &e, 1) != 0) {
            fprintf(stderr, "store-bench: append: %s\n", store_errmsg(s));
            exit(1);
        }
        uint64_t t1 = tk_mono_ns();
        if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) || fdatasync(fd) != 0) {
            perror("floor write");
            exit(1);
        }
        uint64_t t2 = tk_mono_ns();
        tk_hist_record(&hs, t1 - t0);
        tk_hist_record(&hf, t2 - t1);
    }
    close(fd);
    unlink(path);
    tk_blob_unref(blob);
    store_close(s);
    rmrf(dir);
    *store_p50 = (double)tk_hist_quantile(&hs, 0.5) / 1000.0;
    *floor_p50 = (double)tk_hist_quantile(&hf, 0.5) / 1000.0;
}

/* ---- appenders ---------------------------------------------------------- */

struct slot {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    uint64_t t_done;
};

struct shared {
    struct store *s;
    size_t entry_bytes, batch;
    pthread_mutex_t submit_mu;
    uint64_t next_index;
    atomic_bool stop;
    atomic_uint_fast64_t entries;
};

struct appender {
    pthread_t th;
    struct shared *sh;
    struct slot slot;
    struct tk_hist hist;
};

static void on_done(void *data, uint64_t seq, uint64_t last_index, uint64_t last_term,
                    int status)
{
    struct slot *sl = data;
    (void)seq;
    (void)last_index;
    (void)last_term;
    uint64_t t = tk_mono_ns();
    pthread_mutex_lock(&sl->mu);
    sl->done = true;
    sl->status = status;
    sl->t_done = t;
    pthread_mutex_unlock(&sl->mu);
    pthread_cond_signal(&sl->cv);
}

/* The pipelined form: one submitter keeps up to `window` appends in flight,
 * as the node's loop does; completions come back on the storage thread. */
struct pipe_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned inflight;
    bool waiting;
    uint64_t entries;
    struct tk_hist hist; /* written by the storage thread only */
};

static void on_pipe_done(void *data, uint64_t seq, uint64_t last_index,
                         uint64_t last_term, int status)
{
    struct pipe_state *ps = data;
    (void)last_index;
    (void)last_term;
    if (status != 0) {
        fprintf(stderr, "store-bench: append: %s\n", tk_errname(status));
        exit(1);
    }
    tk_hist_record(&ps->hist, tk_mono_ns() - seq); /* seq = submit time */
    pthread_mutex_lock(&ps->mu);
    ps->inflight--;
    bool wake = ps->waiting;
    ps->waiting = false;
    pthread_mutex_unlock(&ps->mu);
    if (wake)
        pthread_cond_signal(&ps->cv);
}

static struct raft_entry *make_batch(size_t n, size_t bytes, struct tk_blob **blob)
{
    *blob = tk_blob_new(bytes);
    for (size_t i = 0; i < bytes; i++)
        (*blob)->data[i] = (uint8_t)(i * 131 + 7);
    struct raft_entry *v = calloc(n, sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        v[i].term = 1;
        v[i].data = *blob;
    }
    return v;
}

static void *appender_async(void *arg)
{
    struct appender *a = arg;
    struct shared *sh = a->sh;
    struct tk_blob *blob;
    struct raft_entry *v = make_batch(sh->batch, sh->entry_bytes, &blob);
    while (!atomic_load(&sh->stop)) {
        pthread_mutex_lock(&sh->submit_mu);
        for (size_t i = 0; i < sh->batch; i++)
            v[i].index = sh->next_index + i;
        sh->next_index += sh->batch;
        a->slot.done = false;
        uint64_t t0 = tk_mono_ns();
        int rc = store_append_async(sh->s, v, sh->batch, 0, &a->slot, on_done);
        pthread_mutex_unlock(&sh->submit_mu);
        if (rc != 0) {
            fprintf(stderr, "store-bench: append: %s\n", tk_errname(rc));
            exit(1);
        }
        pthread_mutex_lock(&a->slot.mu);
        while (!a->slot.done)
            pthread_cond_wait(&a->slot.cv, &a->slot.mu);
        pthread_mutex_unlock(&a->slot.mu);
        if (a->slot.status != 0) {
            fprintf(stderr, "store-bench: append: %s\n", tk_errname(a->slot.status));
            exit(1);
        }
        tk_hist_record(&a->hist, a->slot.t_done - t0);
        atomic_fetch_add(&sh->entries, sh->batch);
    }
    free(v);
    tk_blob_unref(blob);
    return NULL;
}

struct result {
    double entries_per_s;
    double mb_per_s;
    double syncs_per_entry;
    double p50_us, p99_us;
    double cpu_us_per_entry;   /* the whole process: store and appenders */
    double csw_per_entry;      /* context switches (voluntary + not) */
    double wake_per_append;    /* storage thread wake-ups (store_stats.wakeups) */
    double sync_p50_us;        /* the store's log syncs (store_sync_latency) */
    double store_us_per_entry; /* CPU of the storage thread alone */
};

/* CPU time (us) of the store's threads (named tk-store) so far, from
 * /proc/self/task/TID/schedstat (nanoseconds on the CPU). */
static double store_thread_cpu_us(void)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return 0;
    double us = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char p[300], comm[64] = "";
        snprintf(p, sizeof(p), "/proc/self/task/%s/comm", de->d_name);
        FILE *fp = fopen(p, "r");
        if (fp == NULL)
            continue;
        bool ours =
            fgets(comm, sizeof(comm), fp) != NULL && strncmp(comm, "tk-store", 8) == 0;
        fclose(fp);
        if (!ours)
            continue;
        snprintf(p, sizeof(p), "/proc/self/task/%s/schedstat", de->d_name);
        fp = fopen(p, "r");
        unsigned long long ns = 0;
        if (fp != NULL && fscanf(fp, "%llu", &ns) == 1)
            us += (double)ns / 1000.0;
        if (fp != NULL)
            fclose(fp);
    }
    closedir(d);
    return us;
}

/* CPU time (us) and context switches of the whole process so far. */
static void proc_usage(double *cpu_us, double *csw)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *cpu_us = (double)ru.ru_utime.tv_sec * 1e6 + (double)ru.ru_utime.tv_usec +
              (double)ru.ru_stime.tv_sec * 1e6 + (double)ru.ru_stime.tv_usec;
    *csw = (double)ru.ru_nvcsw + (double)ru.ru_nivcsw;
}

/* What one measurement window drives: an open store whose log ends at
 * next_index - 1, and the shape of the appends (see run_on()). */
struct run_spec {
    struct store *s;
    uint64_t next_index;
    size_t entry_bytes, batch;
    int appenders;
    double seconds;
};

/* The counters a window's figures are differences of, read as it opens. */
struct window {
    struct store_stats st;
    double cpu_us, csw, store_cpu_us;
    uint64_t t0;
};

/* The store's sync latencies at the window's two ends (about 30 KiB each:
 * not on the stack). */
static struct tk_hist sync_hist_open, sync_hist_close;

static void window_open(struct store *s, struct window *w)
{
    store_stats(s, &w->st);
    proc_usage(&w->cpu_us, &w->csw);
    w->store_cpu_us = store_thread_cpu_us();
    store_sync_latency(s, &sync_hist_open);
    w->t0 = tk_mono_ns();
}

/* Mode 2: this thread keeps `appenders` async appends in flight until the
 * window ends. Returns the entries appended; their latencies go into h. */
static uint64_t drive_inflight(const struct run_spec *rs, uint64_t t0, struct tk_hist *h)
{
    uint64_t budget = (uint64_t)(rs->seconds * 1e9);
    uint64_t next_index = rs->next_index, entries = 0;
    struct pipe_state ps;
    memset(&ps, 0, sizeof(ps));
    pthread_mutex_init(&ps.mu, NULL);
    pthread_cond_init(&ps.cv, NULL);
    tk_hist_init(&ps.hist);
    struct tk_blob *blob;
    struct raft_entry *v = make_batch(rs->batch, rs->entry_bytes, &blob);
    while (tk_mono_ns() - t0 < budget) {
        pthread_mutex_lock(&ps.mu);
        while (ps.inflight >= (unsigned)rs->appenders) {
            ps.waiting = true;
            pthread_cond_wait(&ps.cv, &ps.mu);
        }
        ps.inflight++;
        pthread_mutex_unlock(&ps.mu);
        for (size_t i = 0; i < rs->batch; i++)
            v[i].index = next_index + i;
        int rc = store_append_async(rs->s, v, rs->batch, tk_mono_ns(), &ps, on_pipe_done);
        if (rc != 0) {
            fprintf(stderr, "store-bench: append: %s\n", tk_errname(rc));
            exit(1);
        }
        next_index += rs->batch;
        entries += rs->batch;
    }
    pthread_mutex_lock(&ps.mu);
    while (ps.inflight > 0) {
        ps.waiting = true;
        pthread_cond_wait(&ps.cv, &ps.mu);
    }
    pthread_mutex_unlock(&ps.mu);
    tk_hist_merge(h, &ps.hist);
    free(v);
    tk_blob_unref(blob);
    return entries;
}

/* Mode 0: synchronous store_append from this thread until the window ends. */
static uint64_t drive_sync(const struct run_spec *rs, uint64_t t0, struct tk_hist *h)
{
    uint64_t budget = (uint64_t)(rs->seconds * 1e9);
    uint64_t next_index = rs->next_index, entries = 0;
    struct tk_blob *blob;
    struct raft_entry *v = make_batch(rs->batch, rs->entry_bytes, &blob);
    while (tk_mono_ns() - t0 < budget) {
        for (size_t i = 0; i < rs->batch; i++)
            v[i].index = next_index + i;
        uint64_t a = tk_mono_ns();
        int rc = store_append(rs->s, v, rs->batch);
        if (rc != 0) {
            fprintf(stderr, "store-bench: append: %s: %s\n", tk_errname(rc),
                    store_errmsg(rs->s));
            exit(1);
        }
        tk_hist_record(h, tk_mono_ns() - a);
        next_index += rs->batch;
        entries += rs->batch;
    }
    free(v);
    tk_blob_unref(blob);
    return entries;
}

/* Mode 1: `appenders` threads, each submitting async and waiting for its own
 * completion, for the window's length. */
static uint64_t drive_threads(const struct run_spec *rs, struct tk_hist *h)
{
    struct shared sh = {.s = rs->s,
                        .entry_bytes = rs->entry_bytes,
                        .batch = rs->batch,
                        .next_index = rs->next_index};
    pthread_mutex_init(&sh.submit_mu, NULL);
    atomic_init(&sh.stop, false);
    atomic_init(&sh.entries, 0);
    struct appender *ap = calloc((size_t)rs->appenders, sizeof(*ap));
    for (int i = 0; i < rs->appenders; i++) {
        ap[i].sh = &sh;
        pthread_mutex_init(&ap[i].slot.mu, NULL);
        pthread_cond_init(&ap[i].slot.cv, NULL);
        tk_hist_init(&ap[i].hist);
        pthread_create(&ap[i].th, NULL, appender_async, &ap[i]);
    }
    double seconds = rs->seconds;
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL); /* the measurement window */
    atomic_store(&sh.stop, true);
    for (int i = 0; i < rs->appenders; i++) {
        pthread_join(ap[i].th, NULL);
        tk_hist_merge(h, &ap[i].hist);
        pthread_mutex_destroy(&ap[i].slot.mu);
        pthread_cond_destroy(&ap[i].slot.cv);
    }
    free(ap);
    pthread_mutex_destroy(&sh.submit_mu);
    return atomic_load(&sh.entries);
}

/* The window's figures: `entries` appended since window_open(), with the
 * latencies in h. */
static struct result window_close(const struct run_spec *rs, const struct window *w,
                                  uint64_t entries, const struct tk_hist *h)
{
    struct result r;
    memset(&r, 0, sizeof(r));
    double el = (double)(tk_mono_ns() - w->t0) / 1e9;
    double cpu1, csw1;
    proc_usage(&cpu1, &csw1);
    double scpu1 = store_thread_cpu_us();
    struct store_stats st1;
    store_stats(rs->s, &st1);
    const struct store_stats *st0 = &w->st;
    r.store_us_per_entry = entries ? (scpu1 - w->store_cpu_us) / (double)entries : 0;
    r.cpu_us_per_entry = entries ? (cpu1 - w->cpu_us) / (double)entries : 0;
    r.csw_per_entry = entries ? (csw1 - w->csw) / (double)entries : 0;
    r.wake_per_append =
        st1.appends > st0->appends
            ? (double)(st1.wakeups - st0->wakeups) / (double)(st1.appends - st0->appends)
            : 0;
    r.entries_per_s = (double)entries / el;
    r.mb_per_s = (double)entries * (double)rs->entry_bytes / el / 1e6;
    r.syncs_per_entry = entries ? (double)(st1.syncs - st0->syncs) / (double)entries : 0;
    r.p50_us = (double)tk_hist_quantile(h, 0.5) / 1000.0;
    r.p99_us = (double)tk_hist_quantile(h, 0.99) / 1000.0;
    /* The syncs of this window only: the difference of the two copies. */
    struct tk_hist *sh1 = &sync_hist_close;
    store_sync_latency(rs->s, sh1);
    for (unsigned b = 0; b < TK_HIST_BUCKETS; b++)
        sh1->buckets[b] -= sync_hist_open.buckets[b];
    sh1->count -= sync_hist_open.count;
    sh1->sum -= sync_hist_open.sum;
    sh1->min = 0;
    r.sync_p50_us = (double)tk_hist_quantile(sh1, 0.5) / 1000.0;
    return r;
}

/* One timed run on an open store whose log ends at next_index - 1.
 * mode: 0 = synchronous store_append from one thread, 1 = `appenders`
 * threads each submitting async and waiting for its own completion, 2 = one
 * thread keeping `appenders` async appends in flight. */
static struct result run_on(struct store *s, uint64_t next_index, int mode,
                            size_t entry_bytes, size_t batch, int appenders,
                            double seconds)
{
    const struct run_spec rs = {.s = s,
                                .next_index = next_index,
                                .entry_bytes = entry_bytes,
                                .batch = batch,
                                .appenders = appenders,
                                .seconds = seconds};
    struct tk_hist h;
    tk_hist_init(&h);
    struct window w;
    window_open(s, &w);
    uint64_t entries = mode == 2   ? drive_inflight(&rs, w.t0, &h)
                       : mode == 0 ? drive_sync(&rs, w.t0, &h)
                                   : drive_threads(&rs, &h);
    return window_close(&rs, &w, entries, &h);
}

/* Median over `runs` fresh stores of one configuration. */
static struct result run_config(int backend, int mode, size_t entry_bytes, size_t batch,
                                int appenders, double seconds)
{
    double eps[16], mbs[16], spe[16], p50[16], p99[16], cpu[16], csw[16], wk[16], sp[16],
        su[16];
    for (int k = 0; k < runs; k++) {
        char dir[4200];
        fresh_dir(dir, sizeof(dir));
        struct store_mem_volume *vol = NULL;
        struct store *s = open_store(backend, dir, &vol);
        struct result r = run_on(s, 1, mode, entry_bytes, batch, appenders, seconds);
        store_close(s);
        store_mem_volume_free(vol);
        if (backend == 1)
            rmrf(dir);
        eps[k] = r.entries_per_s;
        mbs[k] = r.mb_per_s;
        spe[k] = r.syncs_per_entry;
        p50[k] = r.p50_us;
        p99[k] = r.p99_us;
        cpu[k] = r.cpu_us_per_entry;
        csw[k] = r.csw_per_entry;
        wk[k] = r.wake_per_append;
        sp[k] = r.sync_p50_us;
        su[k] = r.store_us_per_entry;
    }
    struct result m;
    m.entries_per_s = median(eps, runs);
    m.mb_per_s = median(mbs, runs);
    m.syncs_per_entry = median(spe, runs);
    m.p50_us = median(p50, runs);
    m.p99_us = median(p99, runs);
    m.cpu_us_per_entry = median(cpu, runs);
    m.csw_per_entry = median(csw, runs);
    m.wake_per_append = median(wk, runs);
    m.sync_p50_us = median(sp, runs);
    m.store_us_per_entry = median(su, runs);
    return m;
}

/* Fills a store with `n` entries of `bytes` in large synchronous batches. */
static uint64_t fill(struct store *s, uint64_t n, size_t bytes)
{
    const size_t batch = 8192;
    struct tk_blob *blob;
    struct raft_entry *v = make_batch(batch, bytes, &blob);
    uint64_t next = store_last_index(s) + 1;
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < batch ? (size_t)(n - done) : batch;
        for (size_t i = 0; i < k; i++)
            v[i].index = next + i;
        int rc = store_append(s, v, k);
        if (rc != 0) {
            fprintf(stderr, "store-bench: fill: %s: %s\n", tk_errname(rc),
                    store_errmsg(s));
            exit(1);
        }
        next += k;
        done += k;
    }
    free(v);
    tk_blob_unref(blob);
    return next;
}

/* Throughput of 64 in-flight appends x 64 B x batch 1 (one submitter) on a
 * log of `small` entries and on one of `big` entries. The two stores are
 * filled first (and the file system synced, so neither pays for the fill),
 * then measured in alternating windows (in the order ABBA..., so that
 * neither always runs first) so drift in the machine's load hits both alike;
 * each figure is the median of its windows. */
static void throughput_compare(uint64_t small, uint64_t big, double seconds,
                               double *at_small, double *at_big, double cpu_us[2],
                               double store_us[2], double sync_us[2])
{
    char dir[2][4200];
    struct store *s[2];
    uint64_t next[2];
    const uint64_t len[2] = {small, big};
    for (int k = 0; k < 2; k++) {
        fresh_dir(dir[k], sizeof(dir[k]));
        struct store_mem_volume *vol = NULL;
        s[k] = open_store(1, dir[k], &vol);
        next[k] = fill(s[k], len[k], 64);
    }
    int fd = open(base_dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
    double v[2][16], c[2][16], su[2][16], sp[2][16];
    for (int r = 0; r < runs; r++) {
        for (int kk = 0; kk < 2; kk++) {
            int k = r % 2 ? 1 - kk : kk; /* ABBA: neither always goes first */
            struct result res = run_on(s[k], next[k], 2, 64, 1, 64, seconds);
            next[k] = store_last_index(s[k]) + 1;
            v[k][r] = res.entries_per_s;
            c[k][r] = res.cpu_us_per_entry;
            su[k][r] = res.store_us_per_entry;
            sp[k][r] = res.sync_p50_us;
        }
    }
    for (int k = 0; k < 2; k++) {
        store_close(s[k]);
        rmrf(dir[k]);
    }
    *at_small = median(v[0], runs);
    *at_big = median(v[1], runs);
    for (int k = 0; k < 2; k++) {
        cpu_us[k] = median(c[k], runs);
        store_us[k] = median(su[k], runs);
        sync_us[k] = median(sp[k], runs);
    }
}

static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strstr(de->d_name, ".seg") == NULL)
            continue;
        char p[8192];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        int fd = open(p, O_RDONLY);
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    closedir(d);
}

/* Builds a log of about `bytes` of 1 KiB entries, then times reopening it. */
static void recovery(uint64_t bytes, double *warm_s, double *cold_s,
                     uint64_t *entries_out)
{
    char dir[4200];
    fresh_dir(dir, sizeof(dir));
    struct store_mem_volume *vol = NULL;
    struct store *s = open_store(1, dir, &vol);
    uint64_t n = bytes / (1024 + 48);
    fill(s, n, 1024);
    store_close(s);
    double w[16], c[16];
    for (int k = 0; k < runs; k++) {
        uint64_t t0 = tk_mono_ns();
        s = open_store(1, dir, &vol);
        w[k] = (double)(tk_mono_ns() - t0) / 1e9;
        if (store_last_index(s) != n) {
            fprintf(stderr, "store-bench: recovered %llu of %llu entries\n",
                    (unsigned long long)store_last_index(s), (unsigned long long)n);
            exit(1);
        }
        store_close(s);
        drop_cache(dir);
        t0 = tk_mono_ns();
        s = open_store(1, dir, &vol);
        c[k] = (double)(tk_mono_ns() - t0) / 1e9;
        store_close(s);
    }
    rmrf(dir);
    *warm_s = median(w, runs);
    *cold_s = median(c, runs);
    *entries_out = n;
}

/* --plot: one row of the table, if it is an fs row of 64 B entries. */
static void plot_row(int backend, size_t entry, size_t batch, const char *appenders,
                     const struct result *r)
{
    if (plot_path == NULL || backend != 1 || entry != 64)
        return;
    bench_plot_point(&plot, bench_plot_series_named(&plot, 0, appenders), (double)batch,
                     r->entries_per_s);
    bench_plot_point(&plot, bench_plot_series_named(&plot, 1, appenders), (double)batch,
                     r->p99_us);
}

static int plot_finish(double floor_p50, double floor_p99)
{
    if (plot_path == NULL)
        return 0;
    bench_plot_hline(&plot, 1, "floor: 4 KiB append + fdatasync, p50", floor_p50);
    bench_plot_hline(&plot, 1, "floor, p99", floor_p99);
    int rc = bench_plot_write(&plot, plot_path);
    bench_plot_free(&plot);
    if (rc == 0)
        fprintf(stderr, "store-bench: plot written to %s\n", plot_path);
    return rc;
}

/* The long log's length for the 10k- vs long-log comparison. */
static uint64_t long_log_entries(void)
{
    return log_entries > 0 ? log_entries : quick ? 200000 : 5000000;
}

/* --only: one part of the bench, for A/B runs of a change to the store.
 * "appenders": the fs rows of 64 B x batch 1 (1 async appender, 64 threads,
 * 64 in flight) with CPU time and context switches per entry; "length": the
 * 10k- vs long-log comparison. One JSON line each. */
static int only_part(double secs)
{
    if (strcmp(only, "length") == 0) {
        uint64_t big = long_log_entries();
        double at_small, at_big, cpu[2], st[2], sy[2];
        throughput_compare(10000, big, secs, &at_small, &at_big, cpu, st, sy);
        printf("fs, 64 in flight x 64 B x batch 1: %.0f entries/s (%.2f us CPU/entry) "
               "on a 10k-entry log, %.0f entries/s (%.2f us CPU/entry) on a "
               "%llu-entry log (%+.1f%%)\n",
               at_small, cpu[0], at_big, cpu[1], (unsigned long long)big,
               at_small > 0 ? 100.0 * (at_big - at_small) / at_small : 0);
        printf("  storage thread CPU/entry %.2f vs %.2f us; sync p50 %.1f vs %.1f us\n",
               st[0], st[1], sy[0], sy[1]);
        printf("{\"bench\":\"store-length\",\"runs\":%d,\"fs_10k_entries_per_s\":%.0f,"
               "\"fs_long_entries_per_s\":%.0f,\"fs_long_log_entries\":%llu,"
               "\"cpu_us_per_entry_10k\":%.2f,\"cpu_us_per_entry_long\":%.2f,"
               "\"store_thread_us_per_entry_10k\":%.2f,"
               "\"store_thread_us_per_entry_long\":%.2f,\"sync_p50_us_10k\":%.1f,"
               "\"sync_p50_us_long\":%.1f}\n",
               runs, at_small, at_big, (unsigned long long)big, cpu[0], cpu[1], st[0],
               st[1], sy[0], sy[1]);
        return 0;
    }
    static const struct {
        int mode, appenders;
        const char *name, *key;
    } shapes[3] = {{1, 1, "1 (async)", "async1"},
                   {1, 64, "64 threads", "threads64"},
                   {2, 64, "64 inflight", "inflight64"}};
    struct result r[3];
    printf("%-12s %12s %11s %10s %10s %10s %10s %10s %10s %10s\n", "appenders",
           "entries/s", "syncs/entry", "p50 us", "p99 us", "cpu us/e", "csw/e",
           "wakes/app", "sync p50", "store us/e");
    for (int i = 0; i < 3; i++) {
        r[i] = run_config(mem_sync_us > 0 ? 0 : 1, shapes[i].mode, 64, 1,
                          shapes[i].appenders, secs);
        printf("%-12s %12.0f %11.4f %10.1f %10.1f %10.2f %10.2f %10.3f %10.1f %10.2f\n",
               shapes[i].name, r[i].entries_per_s, r[i].syncs_per_entry, r[i].p50_us,
               r[i].p99_us, r[i].cpu_us_per_entry, r[i].csw_per_entry,
               r[i].wake_per_append, r[i].sync_p50_us, r[i].store_us_per_entry);
    }
    printf("{\"bench\":\"store-appenders\",\"runs\":%d", runs);
    for (int i = 0; i < 3; i++)
        printf(
            ",\"%s_entries_per_s\":%.0f,\"%s_p50_us\":%.1f,\"%s_cpu_us_per_entry\":%.2f,"
            "\"%s_csw_per_entry\":%.2f,\"%s_wakeups_per_append\":%.3f,"
            "\"%s_sync_p50_us\":%.1f,\"%s_store_thread_us_per_entry\":%.2f",
            shapes[i].key, r[i].entries_per_s, shapes[i].key, r[i].p50_us, shapes[i].key,
            r[i].cpu_us_per_entry, shapes[i].key, r[i].csw_per_entry, shapes[i].key,
            r[i].wake_per_append, shapes[i].key, r[i].sync_p50_us, shapes[i].key,
            r[i].store_us_per_entry);
    printf("}\n");
    return 0;
}

/* Recovery of a 1 GiB log (--quick: 64 MiB), printed as measured. */
struct recovery_figs {
    uint64_t bytes, entries;
    double warm_s, cold_s;
};

static void recovery_report(struct recovery_figs *f)
{
    f->bytes = quick ? (64ull << 20) : (1ull << 30);
    recovery(f->bytes, &f->warm_s, &f->cold_s, &f->entries);
    printf("open + recover a %llu MiB log (%llu x 1 KiB entries): %.3f s "
           "warm cache, %.3f s cold\n",
           (unsigned long long)(f->bytes >> 20), (unsigned long long)f->entries,
           f->warm_s, f->cold_s);
}

/* The floors, in microseconds. */
struct floors {
    double p50, p99;           /* 4 KiB append + fdatasync */
    double pre_p50, pre_p99;   /* 4 KiB pwrite into a preallocated file */
    double il_store, il_floor; /* interleaved: fs batch-of-1 append vs append */
};

static void floors_measure(struct floors *f)
{
    f->p50 = floor_p50_us(false, quick ? 100 : 3000, &f->p99);
    f->pre_p50 = floor_p50_us(true, quick ? 100 : 3000, &f->pre_p99);
    floor_interleaved(quick ? 100 : 2000, &f->il_store, &f->il_floor);
}

static void floors_print(const struct floors *f)
{
    printf("floor: 4 KiB append + fdatasync  p50 %.1f us  p99 %.1f us\n", f->p50, f->p99);
    printf("interleaved: fs batch-of-1 (64 B) append p50 %.1f us vs 4 KiB append + "
           "fdatasync "
           "p50 %.1f us: %.2fx\n",
           f->il_store, f->il_floor, f->il_store / f->il_floor);
    printf("floor: 4 KiB pwrite into preallocated file + fdatasync  p50 %.1f "
           "us  p99 %.1f us\n\n",
           f->pre_p50, f->pre_p99);
}

/* The table's appender shapes, in the order of its rows. */
static const struct table_shape {
    int mode, appenders; /* run_on()'s */
    const char *name;    /* in the table */
    const char *legend;  /* in the plot */
} table_shapes[4] = {{0, 1, "1 (sync)", "1 appender (sync)"},
                     {1, 1, "1 (async)", "1 appender (async)"},
                     {1, 64, "64 threads", "64 appender threads"},
                     {2, 64, "64 inflight", "64 appends in flight"}};

/* The table's figures the JSON line repeats: 64 B entries, batches of 1. */
struct table_marks {
    double fs_batch1_p50, fs_batch1_async_p50; /* 1 appender, sync and async */
    double fs_64, fs_64_inflight, mem_64;      /* entries/s */
};

static void table_row(int backend, size_t entry, size_t batch, int shape, double secs,
                      struct table_marks *m)
{
    const struct table_shape *ts = &table_shapes[shape];
    struct result r = run_config(backend, ts->mode, entry, batch, ts->appenders, secs);
    printf("%-4s %-6zu %-5zu %-10s %12.0f %9.1f %11.4f "
           "%10.1f %10.1f\n",
           backend ? "fs" : "mem", entry, batch, ts->name, r.entries_per_s, r.mb_per_s,
           r.syncs_per_entry, r.p50_us, r.p99_us);
    plot_row(backend, entry, batch, ts->legend, &r);
    if (entry != 64 || batch != 1)
        return;
    if (backend == 1 && shape == 0)
        m->fs_batch1_p50 = r.p50_us;
    else if (backend == 1 && shape == 1)
        m->fs_batch1_async_p50 = r.p50_us;
    else if (shape == 2)
        *(backend == 1 ? &m->fs_64 : &m->mem_64) = r.entries_per_s;
    else if (backend == 1 && shape == 3)
        m->fs_64_inflight = r.entries_per_s;
}

/* Every shape for 64 B and 4 KiB entries in batches of 1, 16 and 256, on the
 * fs backend, then on the memory volume. */
static void table_run(double secs, struct table_marks *m)
{
    printf("%-4s %-6s %-5s %-10s %12s %9s %11s %10s %10s\n", "vol", "entry", "batch",
           "appenders", "entries/s", "MB/s", "syncs/entry", "p50 us", "p99 us");
    const size_t sizes[2] = {64, 4096};
    const size_t batches[3] = {1, 16, 256};
    for (int backend = 1; backend >= 0; backend--)
        for (int si = 0; si < 2; si++)
            for (int bi = 0; bi < 3; bi++)
                for (int shape = 0; shape < 4; shape++)
                    table_row(backend, sizes[si], batches[bi], shape, secs, m);
}

/* What the whole bench's JSON line reports. */
struct summary {
    struct floors floors;
    struct table_marks marks;
    uint64_t long_entries;  /* the long log's length */
    double at_10k, at_long; /* entries/s on the 10k-entry and the long log */
    struct recovery_figs rec;
};

static void length_report(double secs, struct summary *sm)
{
    double cpu[2], st[2], sy[2];
    uint64_t big = sm->long_entries = long_log_entries();
    throughput_compare(10000, big, secs, &sm->at_10k, &sm->at_long, cpu, st, sy);
    printf("\nfs, 64 in flight x 64 B x batch 1: %.0f entries/s on a 10k-entry "
           "log, %.0f entries/s on a %llu-entry log (%.1f%%)\n",
           sm->at_10k, sm->at_long, (unsigned long long)big,
           sm->at_10k > 0 ? 100.0 * (sm->at_long - sm->at_10k) / sm->at_10k : 0);
}

static void summary_print_json(const struct summary *sm)
{
    const struct floors *f = &sm->floors;
    const struct table_marks *m = &sm->marks;
    printf("{\"bench\":\"store\",\"quick\":%s,\"runs\":%d,"
           "\"floor_fsync_p50_us\":%.1f,\"floor_fsync_p99_us\":%.1f,"
           "\"floor_prealloc_fsync_p50_us\":%.1f,"
           "\"fs_batch1_p50_us\":%.1f,\"fs_batch1_async_p50_us\":%.1f,"
           "\"interleaved_fs_batch1_p50_us\":%.1f,\"interleaved_floor_p50_us\":%.1f,"
           "\"fs_64_appenders_entries_per_s\":%.0f,"
           "\"fs_64_inflight_entries_per_s\":%.0f,"
           "\"mem_64_appenders_entries_per_s\":%.0f,"
           "\"fs_10k_entries_per_s\":%.0f,\"fs_5m_entries_per_s\":%.0f,"
           "\"fs_5m_log_entries\":%llu,"
           "\"recover_1gib_s\":%.3f,\"recover_1gib_cold_s\":%.3f,"
           "\"recover_log_bytes\":%llu}\n",
           quick ? "true" : "false", runs, f->p50, f->p99, f->pre_p50, m->fs_batch1_p50,
           m->fs_batch1_async_p50, f->il_store, f->il_floor, m->fs_64, m->fs_64_inflight,
           m->mem_64, sm->at_10k, sm->at_long, (unsigned long long)sm->long_entries,
           sm->rec.warm_s, sm->rec.cold_s, (unsigned long long)sm->rec.bytes);
}

/* The whole bench: the floors, the table, the 10k- vs long-log comparison,
 * recovery, then the JSON line. */
static int full_run(double secs)
{
    struct summary sm;
    memset(&sm, 0, sizeof(sm));
    floors_measure(&sm.floors);
    printf("store-bench%s: dir %s, %d run(s) per figure, medians\n",
           quick ? " --quick" : "", base_dir, runs);
    floors_print(&sm.floors);
    table_run(secs, &sm.marks);
    length_report(secs, &sm);
    recovery_report(&sm.rec);
    printf("\nbatch-of-1 p50 / floor p50: %.2fx (sync API), %.2fx (async "
           "path)\n",
           sm.marks.fs_batch1_p50 / sm.floors.p50,
           sm.marks.fs_batch1_async_p50 / sm.floors.p50);
    summary_print_json(&sm);
    rmrf(base_dir);
    return plot_finish(sm.floors.p50, sm.floors.p99) == 0 ? 0 : 1;
}

/* ---- the command line --------------------------------------------------- */

static const char *dir_arg; /* --dir */
static bool runs_given;     /* --runs */

static int parse_runs(const char *v, void *dest)
{
    runs_given = true;
    return bench_parse_int(v, dest);
}

/* One row per option, in the order the usage message names them. */
static const struct bench_option options[] = {
    {"--quick", NULL, bench_parse_flag, &quick, false},
    {"--dir", "DIR", bench_parse_str, &dir_arg, false},
    {"--runs", "N", parse_runs, &runs, false},
    {"--recovery-only", NULL, bench_parse_flag, &recovery_only, false},
    {"--plot", "FILE.svg", bench_parse_str, &plot_path, false},
    {"--only", "appenders|length", bench_parse_str, &only, true},
    {"--log-entries", "N", bench_parse_u64, &log_entries, false},
    {"--seconds", "S", bench_parse_double, &window_s, false},
    {"--mem-sync-us", "N", bench_parse_uint, &mem_sync_us, false},
};

/* Returns 0, or the exit code (2) after saying what is wrong. */
static int parse_args(int argc, char **argv)
{
    int rc = bench_args_parse("store-bench", options,
                              sizeof(options) / sizeof(options[0]), argc, argv);
    if (rc != 0)
        return rc;
    if (runs < 1 || runs > 16)
        runs = 3;
    if (only != NULL && strcmp(only, "appenders") != 0 && strcmp(only, "length") != 0) {
        fprintf(stderr, "store-bench: --only takes appenders or length\n");
        return 2;
    }
    if (quick && !runs_given)
        runs = 2; /* a smoke run: short windows, median of two */
    return 0;
}

static void plot_start(void)
{
    if (plot_path == NULL)
        return;
    bench_plot_init(&plot, quick ? "store-bench --quick: fs, 64 B entries"
                                 : "store-bench: fs, 64 B entries");
    bench_plot_panel(&plot, "throughput", "entries per batch", "entries/s", true, true);
    bench_plot_panel(&plot, "latency of a batch, p99", "entries per batch",
                     "microseconds", true, true);
}

int main(int argc, char **argv)
{
    int rc = parse_args(argc, argv);
    if (rc != 0)
        return rc;
    tk_log_set_level(TK_LOG_ERROR);
    const char *tmp = getenv("TMPDIR");
    snprintf(base_dir, sizeof(base_dir), "%s/store-bench-%d",
             dir_arg ? dir_arg : (tmp ? tmp : "/tmp"), (int)getpid());
    rmrf(base_dir);
    if (mkdir(base_dir, 0755) != 0) {
        perror(base_dir);
        return 1;
    }
    double secs = window_s > 0 ? window_s : quick ? 0.05 : 1.0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    plot_start();
    if (only != NULL) {
        rc = only_part(secs);
        rmrf(base_dir);
        return rc;
    }
    if (recovery_only) {
        struct recovery_figs rec;
        recovery_report(&rec);
        rmrf(base_dir);
        return 0;
    }
    return full_run(secs);
}
