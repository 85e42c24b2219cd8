/* kill -9 crash test for the fs store (suite 'slow').
 *
 * A child process opens the store and appends batches through the async path
 * (several in flight, so group commit is exercised), now and then rewriting a
 * suffix in a new term (after saving the hard state) and compacting the
 * prefix. From the storage thread's completion callback it reports every
 * acknowledged batch to the parent over a pipe (one atomic write per message).
 * The parent kills the child with SIGKILL at a random moment, reads every
 * report the child managed to send, reopens the store itself and checks:
 *   - open succeeds (a torn tail is repaired, never refused);
 *   - every acknowledged entry is present with the acknowledged term, intact;
 *   - everything past the acknowledged tail is intact too (no garbage), terms
 *     never decrease, and the hard state is at least the last one reported;
 *   - the log starts no later than the last compaction the child announced.
 * Then it starts the next child on the same directory. It stops after
 * --kills kills or --seconds seconds and fails if it made fewer kills.
 *
 * Usage: store_crash_test [--kills N] [--seconds S] [--seed X] [--plant-lie]
 * (--plant-lie makes the child over-report its acknowledgements, past
 * anything it can have written: the run must then fail, which shows the
 * checks can.) */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "base/prng.h"
#include "store/store.h"
#include "store_testlib.h"

#define SEGMENT_BYTES (64u << 10)
#define INFLIGHT_MAX 8
#define BATCH_MAX 20 /* entries per append */
#define LIE_ENTRIES (INFLIGHT_MAX * BATCH_MAX + 2)
#define LOG_KEEP 3000

struct msg {
    /* 'R' store open, 'A' ack lo..hi in term, 'H' hard state term saved,
     * 'T' about to overwrite from lo, 'C' about to compact to a. */
    char type;
    uint64_t a, b, c;
};

/* ---- child ------------------------------------------------------------- */

static bool plant_lie;

static struct {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inflight;
    uint64_t durable;
} K = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void send_msg(char type, uint64_t a, uint64_t b, uint64_t c)
{
    struct msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.a = a;
    m.b = b;
    m.c = c;
    if (write(K.fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
        _exit(3);
}

static void child_on_append(void *data, uint64_t seq, uint64_t last_index,
                            uint64_t last_term, int status)
{
    (void)data;
    if (status != 0)
        _exit(4);
    /* --plant-lie: claim more entries than can have been written, to prove
     * the parent's checks can fail. The claim must pass everything that can
     * be written but unacknowledged at the kill (INFLIGHT_MAX batches of at
     * most BATCH_MAX): a kill -9 keeps written pages, so a claim of only two
     * more was caught only when the kill found nothing past the last ack,
     * and missed in 2 of 3 seeded runs of 20 kills. */
    send_msg('A', seq, last_index + (plant_lie ? LIE_ENTRIES : 0), last_term);
    pthread_mutex_lock(&K.mu);
    K.inflight--;
    K.durable = last_index;
    pthread_cond_signal(&K.cv);
    pthread_mutex_unlock(&K.mu);
}

/* Opens the store at dir, with this test's small segments: the child to
 * write it, the parent to read it back after a kill. */
static int open_store(const char *dir, struct store **s, struct store_boot *boot,
                      char err[STORE_ERRMSG_MAX])
{
    struct store_options o;
    store_options_default(&o);
    o.segment_bytes = SEGMENT_BYTES;
    return store_open_fs(dir, &o, s, boot, err, STORE_ERRMSG_MAX);
}

static _Noreturn void child_main(const char *dir, int fd, uint64_t seed)
{
    K.fd = fd;
    struct store *s;
    struct store_boot boot;
    char err[STORE_ERRMSG_MAX];
    int rc = open_store(dir, &s, &boot, err);
    if (rc != 0) {
        fprintf(stderr, "child: open: %s: %s\n", tk_errname(rc), err);
        _exit(2);
    }
    send_msg('R', 0, 0, 0);
    struct tk_prng p;
    tk_prng_seed(&p, seed);
    uint64_t term = boot.hard_state.term;
    uint64_t last = boot.last_index;
    uint64_t first = boot.first_index;
    uint64_t t;
    if (last >= first && store_term_at(s, last, &t) == 0 && t > term)
        _exit(5); /* an entry newer than the hard state: impossible */
    if (term == 0) {
        term = 1;
        struct raft_hard_state hs = {.term = term, .vote = 1};
        if (store_save_hard_state(s, &hs) != 0)
            _exit(6);
        send_msg('H', term, 0, 0);
    }
    K.durable = last;
    for (;;) {
        pthread_mutex_lock(&K.mu);
        while (K.inflight >= INFLIGHT_MAX)
            pthread_cond_wait(&K.cv, &K.mu);
        K.inflight++;
        uint64_t durable = K.durable;
        pthread_mutex_unlock(&K.mu);

        uint64_t lo = last + 1;
        if (last >= first && tk_prng_chance(&p, 0.05)) {
            /* A new leader overwrites a suffix. Let what is in flight land
             * first, then announce it: from here on the parent may no
             * longer count on entries >= lo. */
            pthread_mutex_lock(&K.mu);
            while (K.inflight > 1)
                pthread_cond_wait(&K.cv, &K.mu);
            pthread_mutex_unlock(&K.mu);
            uint64_t back = tk_prng_below(&p, 10);
            lo = last - back >= first ? last - back : first;
            send_msg('T', lo, 0, 0);
            term++;
            struct raft_hard_state hs = {.term = term, .vote = 1};
            if (store_save_hard_state(s, &hs) != 0)
                _exit(6);
            send_msg('H', term, 0, 0);
        }
        size_t n = 1 + (size_t)tk_prng_below(&p, BATCH_MAX);
        struct raft_entry *v = tl_batch(lo, n, term);
        rc = store_append_async(s, v, n, lo, NULL, child_on_append);
        tl_free(v, n);
        if (rc != 0)
            _exit(7);
        last = lo + n - 1;
        if (durable >= first + LOG_KEEP && durable <= last && tk_prng_chance(&p, 0.2)) {
            uint64_t c = durable - LOG_KEEP / 2;
            send_msg('C', c, 0, 0);
            if (store_compact(s, c) != 0)
                _exit(8);
            first = c + 1;
        }
    }
}

/* ---- parent ------------------------------------------------------------ */

static uint64_t *acked_term; /* by index; 0 = unknown */
static size_t acked_cap;
static uint64_t acked_hi;
static uint64_t hard_term;
static uint64_t compact_max;
static uint64_t n_acks, n_truncations, n_compactions, n_torn;
static bool ready; /* the child has opened the store */

static void set_term(uint64_t index, uint64_t term)
{
    if (index >= acked_cap) {
        size_t cap = acked_cap ? acked_cap : 4096;
        while (cap <= index)
            cap *= 2;
        acked_term = realloc(acked_term, cap * sizeof(*acked_term));
        memset(acked_term + acked_cap, 0, (cap - acked_cap) * sizeof(*acked_term));
        acked_cap = cap;
    }
    acked_term[index] = term;
}

/* An acknowledged batch starting where entries were already known is a
 * rewrite of a suffix. */
static bool acked_term_known(uint64_t index)
{
    return index < acked_cap && acked_term[index] != 0;
}

static void handle(const struct msg *m)
{
    switch (m->type) {
    case 'A':
        if (acked_term_known(m->a))
            n_truncations++;
        for (uint64_t i = m->a; i <= m->b; i++)
            set_term(i, m->c);
        acked_hi = m->b;
        n_acks++;
        break;
    case 'H':
        if (m->a > hard_term)
            hard_term = m->a;
        break;
    case 'R':
        ready = true;
        break;
    case 'T':
        if (acked_hi >= m->a)
            acked_hi = m->a - 1;
        break;
    case 'C':
        if (m->a > compact_max)
            compact_max = m->a;
        n_compactions++;
        break;
    default:
        fprintf(stderr, "bad message type %d\n", m->type);
        exit(1);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads reports until `deadline` (or EOF). Returns false at EOF. */
static bool read_reports(int fd, double deadline, bool until_eof)
{
    static uint8_t buf[sizeof(struct msg) * 256];
    static size_t have;
    for (;;) {
        int timeout_ms = -1;
        if (!until_eof) {
            double left = deadline - now_s();
            if (left <= 0)
                return true;
            timeout_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return true;
        ssize_t n = read(fd, buf + have, sizeof(buf) - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            have = 0;
            return false;
        }
        have += (size_t)n;
        size_t k = 0;
        while (have - k >= sizeof(struct msg)) {
            struct msg m;
            memcpy(&m, buf + k, sizeof(m));
            handle(&m);
            k += sizeof(m);
        }
        memmove(buf, buf + k, have - k);
        have -= k;
    }
}

static int verify(const char *dir, int kill_no)
{
    struct store *s;
    struct store_boot boot;
    char err[STORE_ERRMSG_MAX];
    int rc = open_store(dir, &s, &boot, err);
    if (rc != 0) {
        fprintf(stderr, "kill %d: reopen failed: %s: %s\n", kill_no, tk_errname(rc), err);
        return 1;
    }
    int bad = 0;
    if (boot.hard_state.term < hard_term) {
        fprintf(stderr, "kill %d: hard state term %llu < reported %llu\n", kill_no,
                (unsigned long long)boot.hard_state.term, (unsigned long long)hard_term);
        bad = 1;
    }
    if (boot.first_index > compact_max + 1 && boot.first_index > 1) {
        fprintf(stderr, "kill %d: log starts at %llu, compacted only to %llu\n", kill_no,
                (unsigned long long)boot.first_index, (unsigned long long)compact_max);
        bad = 1;
    }
    if (boot.last_index < acked_hi) {
        fprintf(stderr, "kill %d: log ends at %llu but %llu was acknowledged\n", kill_no,
                (unsigned long long)boot.last_index, (unsigned long long)acked_hi);
        bad = 1;
    }
    struct raft_entry *e = NULL;
    size_t n = 0;
    if (!bad) {
        rc = store_read(s, boot.first_index, boot.last_index + 1, 0, &e, &n);
        if (rc != 0) {
            fprintf(stderr, "kill %d: read: %s: %s\n", kill_no, tk_errname(rc),
                    store_errmsg(s));
            bad = 1;
        }
    }
    uint64_t prev = boot.prev_term;
    for (size_t i = 0; i < n && !bad; i++) {
        uint64_t idx = boot.first_index + i;
        if (!tl_check(&e[i], idx)) {
            fprintf(stderr, "kill %d: entry %llu is garbage\n", kill_no,
                    (unsigned long long)idx);
            bad = 1;
        } else if (e[i].term < prev) {
            fprintf(stderr, "kill %d: term goes down at %llu\n", kill_no,
                    (unsigned long long)idx);
            bad = 1;
        } else if (idx <= acked_hi && idx < acked_cap && acked_term[idx] != 0 &&
                   acked_term[idx] != e[i].term) {
            fprintf(stderr, "kill %d: entry %llu has term %llu, acknowledged %llu\n",
                    kill_no, (unsigned long long)idx, (unsigned long long)e[i].term,
                    (unsigned long long)acked_term[idx]);
            bad = 1;
        }
        prev = e[i].term;
        /* What survived unacknowledged is what the next child builds on. */
        if (idx > acked_hi)
            set_term(idx, e[i].term);
    }
    if (boot.last_index > acked_hi)
        n_torn++; /* more survived than was acknowledged: the kill hit a write */
    store_entries_free(e, n);
    store_close(s);
    return bad;
}

int main(int argc, char **argv)
{
    int kills_want = 200;
    double seconds = 150;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plant-lie") == 0) {
            plant_lie = true;
            continue;
        }
        if (i + 1 >= argc)
            break;
        if (strcmp(argv[i], "--kills") == 0)
            kills_want = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--seed") == 0)
            seed = strtoull(argv[i + 1], NULL, 0);
        else
            continue;
        i++;
    }
    tk_log_set_level(TK_LOG_ERROR);
    char *dir = tl_tmpdir("crash");
    struct tk_prng p;
    tk_prng_seed(&p, seed);
    double start = now_s();
    int kills = 0;
    int failed = 0;
    while (kills < kills_want && now_s() - start < seconds && !failed) {
        int fds[2];
        if (pipe(fds) != 0) {
            perror("pipe");
            return 1;
        }
        uint64_t child_seed = tk_prng_next(&p);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            close(fds[0]);
            child_main(dir, fds[1], child_seed);
        }
        close(fds[1]);
        /* Some kills land during open and recovery, most while appending
         * (a random time after the child reports the store open). */
        ready = false;
        bool open = true;
        if (tk_prng_chance(&p, 0.2)) {
            open = read_reports(fds[0], now_s() + tk_prng_double(&p) * 0.03, false);
        } else {
            double give_up = now_s() + 10;
            while (open && !ready && now_s() < give_up)
                open = read_reports(fds[0], now_s() + 0.01, false);
            if (!ready) {
                fprintf(stderr,
                        "kill %d: the child did not open the store "
                        "within 10 s\n",
                        kills);
                failed = 1;
            }
            if (open)
                open = read_reports(fds[0], now_s() + tk_prng_double(&p) * 0.040, false);
        }
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        if (open)
            read_reports(fds[0], 0, true); /* everything sent before death */
        close(fds[0]);
        if (failed)
            break;
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
            fprintf(stderr, "kill %d: child exited on its own (status %d)\n", kills,
                    status);
            failed = 1;
            break;
        }
        kills++;
        failed = verify(dir, kills);
    }
    double took = now_s() - start;
    printf("store crash test: %d kills in %.1f s, %llu acknowledged batches, "
           "%llu rewrites of a suffix, %llu compactions, %llu kills "
           "mid-write, acknowledged tail %llu, %s\n",
           kills, took, (unsigned long long)n_acks, (unsigned long long)n_truncations,
           (unsigned long long)n_compactions, (unsigned long long)n_torn,
           (unsigned long long)acked_hi, failed ? "FAILED" : "ok");
    if (!failed && kills < kills_want) {
        fprintf(stderr, "only %d kills of %d within %.0f s\n", kills, kills_want,
                seconds);
        failed = 1;
    }
    tl_tmpdir_drop(dir);
    free(acked_term);
    return failed ? 1 : 0;
}
