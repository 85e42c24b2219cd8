/* The generic store: the bounded request queue, the storage thread with group
 * commit, the synchronous calls and the failed state, over a backend (fs.c or
 * mem.c) reached through struct store__ops.
 *
 * Group commit: the storage thread sleeps on q_cv until a request is queued,
 * then takes every queued request (up to STORE_GROUP_BYTES_MAX of payload),
 * writes them as runs of consecutive entries, calls the backend's sync once,
 * and completes the requests in order. Requests that arrive during the sync
 * form the next group, and the writer lingers briefly (linger()) when fewer
 * are queued than the last group had and its producers are refilling. The
 * thread never polls, and it is woken only on the
 * idle transition: it sets `sleeping` (under q_mu) before it waits on q_cv,
 * and a producer signals q_cv only when it sees `sleeping` (counted in
 * store_stats.wakeups). An append queued while the thread writes or syncs
 * costs no wake-up and no syscall.
 *
 * Failed state: the first TK_EIO/TK_ENOSPC (or other backend failure) sticks
 * in s->failed; the group that met it completes with that error, and every
 * later call returns it without touching the disk. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "store/store_internal.h"

int store__err(struct store *s, int rc, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&s->err_mu);
    va_start(ap, fmt);
    vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&s->err_mu);
    return rc;
}

int store__errbuf(char *buf, size_t len, int rc, const char *fmt, ...)
{
    if (buf == NULL || len == 0)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return rc;
}

const char *store_errmsg(struct store *s)
{
    return s->errmsg;
}

int store_failed(struct store *s)
{
    return atomic_load(&s->failed);
}

int store__fail(struct store *s, int rc)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&s->failed, &expected, rc))
        TK_LOG(TK_LOG_ERROR, 0, 0, "store failed: %s", s->errmsg);
    return atomic_load(&s->failed);
}

void store_options_default(struct store_options *o)
{
    memset(o, 0, sizeof(*o));
    o->segment_bytes = STORE_SEGMENT_BYTES_DEFAULT;
    o->queue_max = STORE_QUEUE_MAX;
}

struct store *store__alloc(const struct store_options *o)
{
    struct store *s = tk_calloc(1, sizeof(*s));
    if (o != NULL)
        s->opts = *o;
    else
        store_options_default(&s->opts);
    if (s->opts.segment_bytes == 0)
        s->opts.segment_bytes = STORE_SEGMENT_BYTES_DEFAULT;
    if (s->opts.queue_max == 0)
        s->opts.queue_max = STORE_QUEUE_MAX;
    s->entry_bytes_max = STORE_ENTRY_BYTES_MAX;
    atomic_init(&s->failed, 0);
    atomic_init(&s->st_wakeups, 0);
    atomic_init(&s->last_sync_ns, 0);
    pthread_mutex_init(&s->err_mu, NULL);
    pthread_mutex_init(&s->meta_mu, NULL);
    pthread_mutex_init(&s->write_mu, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* linger's deadline */
    pthread_cond_init(&s->q_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->stats_mu, NULL);
    tk_hist_init(&s->sync_ns);
    s->q_cap = s->opts.queue_max;
    s->q = tk_calloc(s->q_cap, sizeof(*s->q));
    s->group = tk_calloc(s->q_cap, sizeof(*s->group));
    return s;
}

void store__free(struct store *s)
{
    pthread_mutex_destroy(&s->stats_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_mutex_destroy(&s->write_mu);
    pthread_mutex_destroy(&s->meta_mu);
    pthread_mutex_destroy(&s->err_mu);
    for (size_t i = 0; i < s->n_spare_reqs; i++)
        tk_free(s->spare_reqs[i]);
    tk_free(s->q);
    tk_free(s->group);
    tk_free(s->spans);
    tk_free(s);
}

void store__fill_boot(struct store *s, struct store_boot *boot)
{
    if (boot == NULL)
        return;
    memset(boot, 0, sizeof(*boot));
    boot->hard_state = s->meta.hard_state;
    boot->snapshot = s->meta.snapshot;
    boot->pending = s->meta.pending;
    boot->has_bootstrap = s->meta.has_bootstrap;
    boot->bootstrap = s->meta.bootstrap;
    boot->cluster_id = s->meta.cluster_id;
    boot->node_id = s->meta.node_id;
    boot->has_incarnation = s->meta.has_incarnation;
    memcpy(boot->incarnation, s->meta.incarnation, sizeof(boot->incarnation));
    s->ops->bounds(s, &boot->first_index, &boot->last_index);
    uint64_t t = 0;
    if (boot->first_index > 1 && s->ops->term_at(s, boot->first_index - 1, &t) == 0)
        boot->prev_term = t;
}

/* ---- the storage thread ------------------------------------------------ */

/* The backend's sync, timed and counted (store_stats.syncs and
 * store_sync_latency). write_mu held. */
static int sync_timed(struct store *s)
{
    uint64_t t0 = tk_mono_ns();
    int rc = s->ops->sync(s);
    uint64_t ns = tk_mono_ns() - t0;
    atomic_store_explicit(&s->last_sync_ns, ns, memory_order_relaxed);
    atomic_fetch_add(&s->st_syncs, 1);
    pthread_mutex_lock(&s->stats_mu);
    tk_hist_record(&s->sync_ns, ns);
    pthread_mutex_unlock(&s->stats_mu);
    return rc;
}

/* Requests are kept for reuse (STORE_REQ_SPARES, each with room for at least
 * REQ_MIN_ENTRIES): one append per ready on every node, so a steady write
 * load allocates none. q_mu held. */
#define REQ_MIN_ENTRIES 64
static struct store__req *req_take(struct store *s, size_t n)
{
    for (size_t i = s->n_spare_reqs; i-- > 0;) {
        struct store__req *r = s->spare_reqs[i];
        if (r->cap >= n) {
            s->spare_reqs[i] = s->spare_reqs[--s->n_spare_reqs];
            return r;
        }
    }
    size_t cap = n > REQ_MIN_ENTRIES ? n : REQ_MIN_ENTRIES;
    struct store__req *r = tk_malloc(sizeof(*r) + cap * sizeof(r->own[0]));
    r->cap = cap;
    return r;
}

/* A written request's references dropped, and it kept or freed. q_mu held
 * (the references are dropped before, by the caller: not under the lock). */
static void req_recycle(struct store *s, struct store__req *r)
{
    if (s->n_spare_reqs < STORE_REQ_SPARES && r->cap <= 4 * REQ_MIN_ENTRIES) {
        s->spare_reqs[s->n_spare_reqs++] = r;
        return;
    }
    tk_free(r);
}

static void req_unref(struct store__req *r)
{
    for (size_t i = 0; i < r->n; i++)
        tk_blob_unref(r->own[i].data);
    r->n = 0;
}

static void spans_reserve(struct store *s, size_t n)
{
    if (n <= s->spans_cap)
        return;
    size_t cap = s->spans_cap ? s->spans_cap : 16;
    while (cap < n)
        cap *= 2;
    s->spans = tk_realloc(s->spans, cap * sizeof(*s->spans));
    s->spans_cap = cap;
}

/* Writes and syncs group[0..n). Sets each request's status. write_mu held. */
static void write_group(struct store *s, struct store__req **group, size_t n)
{
    int failed = atomic_load(&s->failed);
    if (failed != 0) {
        for (size_t i = 0; i < n; i++)
            group[i]->status = failed;
        return;
    }
    uint64_t first, last;
    s->ops->bounds(s, &first, &last);
    spans_reserve(s, n);
    size_t nspans = 0;
    size_t written = 0; /* requests handed to the backend so far */
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct store__req *r = group[i];
        uint64_t lo = r->e[0].index;
        if (lo < first || lo > last + 1) {
            r->status = store__err(s, TK_EINVAL,
                                   "append at index %llu: the log holds "
                                   "%llu..%llu",
                                   (unsigned long long)lo, (unsigned long long)first,
                                   (unsigned long long)last);
            continue;
        }
        if (lo != last + 1 && nspans > 0) {
            /* This request overwrites a suffix: write the run so far first. */
            rc = s->ops->write(s, s->spans, nspans);
            nspans = 0;
        }
        s->spans[nspans].e = r->e;
        s->spans[nspans].n = r->n;
        nspans++;
        r->status = 1; /* pending sync */
        last = r->e[r->n - 1].index;
        written++;
    }
    if (rc == 0 && nspans > 0)
        rc = s->ops->write(s, s->spans, nspans);
    if (rc == 0 && written > 0)
        rc = sync_timed(s);
    if (rc != 0)
        rc = store__fail(s, rc);
    for (size_t i = 0; i < n; i++) {
        if (group[i]->status == 1) {
            group[i]->status = rc;
            if (rc == 0) {
                atomic_fetch_add(&s->st_entries, group[i]->n);
                atomic_fetch_add(&s->st_bytes, group[i]->bytes);
            }
        }
    }
    atomic_fetch_add(&s->st_groups, 1);
}

/* Wakes the storage thread if it sleeps (the idle transition). q_mu held. */
static void wake_writer(struct store *s)
{
    if (!s->sleeping || s->q_len < s->linger_want)
        return;
    s->sleeping = false; /* one wake-up per transition */
    atomic_fetch_add_explicit(&s->st_wakeups, 1, memory_order_relaxed);
    pthread_cond_signal(&s->q_cv);
}

/* Linger: with several producers, the callbacks of one group let them queue
 * their next appends (as many as just completed), which otherwise arrive just
 * after the writer took a thin group and wait a whole sync. So when the queue
 * holds fewer requests than the last group had, the writer waits until it
 * holds as many, or LINGER_NS (at most a quarter of the last sync), which
 * ever comes first. A lone producer (groups of one) never lingers, and
 * producers too slow to refill in time (a linger that timed out) turn it off
 * for the next LINGER_BACKOFF groups. q_mu held. */
#define LINGER_NS 100000u
#define LINGER_BACKOFF 8
static void linger(struct store *s)
{
    size_t want = s->last_group_n;
    if (want < 2 || s->q_len >= want || s->stopping)
        return;
    if (s->linger_score < 0) {
        s->linger_score++;
        return;
    }
    uint64_t ns = atomic_load_explicit(&s->last_sync_ns, memory_order_relaxed) / 4;
    if (ns > LINGER_NS)
        ns = LINGER_NS;
    if (ns < 5000)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
    s->linger_want = want;
    while (s->q_len < want && !s->stopping) {
        s->sleeping = true;
        int rc = pthread_cond_timedwait(&s->q_cv, &s->q_mu, &ts);
        s->sleeping = false;
        if (rc == ETIMEDOUT) {
            s->linger_score = -LINGER_BACKOFF;
            break;
        }
    }
    s->linger_want = 0;
}

static void *storage_thread(void *arg)
{
    struct store *s = arg;
    pthread_setname_np(pthread_self(), "tk-store");
    pthread_mutex_lock(&s->q_mu);
    for (;;) {
        while (((s->q_len == 0 && !s->idle_due) || s->inline_busy) && !s->stopping) {
            s->sleeping = true;
            pthread_cond_wait(&s->q_cv, &s->q_mu);
            s->sleeping = false;
        }
        if (s->q_len == 0 && s->idle_due && !s->stopping) {
            /* Asked for by an inline append (append_inline). */
            s->idle_due = false;
            s->thread_busy = true;
            pthread_mutex_unlock(&s->q_mu);
            if (atomic_load(&s->failed) == 0) {
                pthread_mutex_lock(&s->write_mu);
                s->ops->idle(s);
                pthread_mutex_unlock(&s->write_mu);
            }
            pthread_mutex_lock(&s->q_mu);
            s->thread_busy = false;
            continue;
        }
        if (s->q_len == 0)
            break; /* stopping and drained */
        linger(s);
        s->thread_busy = true;
        size_t n = 0;
        uint64_t bytes = 0;
        while (s->q_len > 0 && (n == 0 || bytes < STORE_GROUP_BYTES_MAX)) {
            struct store__req *r = s->q[s->q_head];
            s->q_head = (s->q_head + 1) % s->q_cap;
            s->q_len--;
            s->group[n++] = r;
            bytes += r->bytes;
        }
        pthread_mutex_unlock(&s->q_mu);

        pthread_mutex_lock(&s->write_mu);
        write_group(s, s->group, n);
        pthread_mutex_unlock(&s->write_mu);
        s->last_group_n = n;
        for (size_t i = 0; i < n; i++) {
            struct store__req *r = s->group[i];
            atomic_fetch_add(&s->st_appends, 1);
            r->cb(r->data, r->seq, r->e[r->n - 1].index, r->e[r->n - 1].term, r->status);
            req_unref(r);
        }
        if (s->ops->idle != NULL && atomic_load(&s->failed) == 0) {
            pthread_mutex_lock(&s->write_mu);
            s->ops->idle(s);
            pthread_mutex_unlock(&s->write_mu);
        }
        pthread_mutex_lock(&s->q_mu);
        for (size_t i = 0; i < n; i++)
            req_recycle(s, s->group[i]);
        s->thread_busy = false;
    }
    pthread_mutex_unlock(&s->q_mu);
    return NULL;
}

int store__start(struct store *s)
{
    if (pthread_create(&s->thread, NULL, storage_thread, s) != 0)
        return TK_ENOMEM;
    s->thread_started = true;
    return 0;
}

void store_close(struct store *s)
{
    if (s->thread_started) {
        pthread_mutex_lock(&s->q_mu);
        s->stopping = true;
        pthread_cond_signal(&s->q_cv);
        pthread_mutex_unlock(&s->q_mu);
        pthread_join(s->thread, NULL);
    }
    s->ops->close(s);
    store__free(s);
}

/* ---- appends ----------------------------------------------------------- */

static int check_batch(struct store *s, const struct raft_entry *e, size_t n,
                       uint64_t *bytes)
{
    if (n == 0 || n > STORE_BATCH_MAX)
        return store__err(s, TK_EINVAL, "append of %zu entries", n);
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++) {
        if (e[i].index == 0 || (i > 0 && e[i].index != e[i - 1].index + 1))
            return store__err(s, TK_EINVAL,
                              "append: entry %zu has index %llu, not "
                              "consecutive",
                              i, (unsigned long long)e[i].index);
        size_t len = e[i].data != NULL ? e[i].data->len : 0;
        if (len > s->entry_bytes_max)
            return store__err(s, TK_EINVAL,
                              "append: entry %llu has %zu payload bytes, "
                              "above the limit %llu",
                              (unsigned long long)e[i].index, len,
                              (unsigned long long)s->entry_bytes_max);
        b += len;
    }
    *bytes = b;
    return 0;
}

/* A memory volume without latency, nothing queued or being written: the
 * batch is written here, in order, skipping the two thread hand-offs (about
 * 40 us each on a 2-core VM). The caller's entries outlive the call: no copy,
 * no allocation. Entered with q_mu held; returns with it released. */
static int append_inline(struct store *s, const struct raft_entry *entries, size_t n,
                         uint64_t bytes, uint64_t seq, void *data, store_append_cb *cb)
{
    s->inline_busy = true;
    pthread_mutex_unlock(&s->q_mu);
    struct store__req in = {
        .seq = seq, .data = data, .cb = cb, .n = n, .bytes = bytes, .e = entries};
    struct store__req *r = &in;
    pthread_mutex_lock(&s->write_mu);
    write_group(s, &r, 1);
    bool idle =
        s->ops->idle_due != NULL && atomic_load(&s->failed) == 0 && s->ops->idle_due(s);
    pthread_mutex_unlock(&s->write_mu);
    atomic_fetch_add(&s->st_appends, 1);
    cb(data, seq, entries[n - 1].index, entries[n - 1].term, in.status);
    pthread_mutex_lock(&s->q_mu);
    s->inline_busy = false;
    if (idle && !s->idle_due) {
        /* The backend's work between groups (fs: the next segment) stays
         * off the caller: the storage thread does it. */
        s->idle_due = true;
        if (s->sleeping) {
            s->sleeping = false;
            atomic_fetch_add_explicit(&s->st_wakeups, 1, memory_order_relaxed);
            pthread_cond_signal(&s->q_cv);
        }
    }
    if (s->q_len > 0)
        wake_writer(s);
    pthread_mutex_unlock(&s->q_mu);
    return 0;
}

static int append_async(struct store *s, const struct raft_entry *entries, size_t n,
                        uint64_t seq, void *data, store_append_cb *cb, uint64_t inline_ns)
{
    TK_ASSERT(cb != NULL);
    int rc = atomic_load(&s->failed);
    if (rc != 0)
        return rc;
    uint64_t bytes;
    rc = check_batch(s, entries, n, &bytes);
    if (rc != 0)
        return rc;
    if (inline_ns != 0 &&
        atomic_load_explicit(&s->last_sync_ns, memory_order_relaxed) <= inline_ns) {
        pthread_mutex_lock(&s->q_mu);
        if (s->q_len == 0 && !s->thread_busy && !s->inline_busy && !s->stopping)
            return append_inline(s, entries, n, bytes, seq, data, cb);
        pthread_mutex_unlock(&s->q_mu);
    }
    pthread_mutex_lock(&s->q_mu);
    if (s->q_len == s->q_cap || s->stopping) {
        pthread_mutex_unlock(&s->q_mu);
        return s->stopping ? TK_ECLOSED : TK_EBUSY;
    }
    struct store__req *r = req_take(s, n);
    r->seq = seq;
    r->data = data;
    r->cb = cb;
    r->n = n;
    r->bytes = bytes;
    r->status = 0;
    r->e = r->own;
    for (size_t i = 0; i < n; i++) {
        r->own[i] = entries[i];
        r->own[i].data = tk_blob_ref(entries[i].data);
    }
    s->q[(s->q_head + s->q_len) % s->q_cap] = r;
    s->q_len++;
    wake_writer(s);
    pthread_mutex_unlock(&s->q_mu);
    return 0;
}

int store_append_async(struct store *s, const struct raft_entry *entries, size_t n,
                       uint64_t seq, void *data, store_append_cb *cb)
{
    return append_async(s, entries, n, seq, data, cb, s->inline_sync ? UINT64_MAX : 0);
}

int store_append_now_if_idle(struct store *s, const struct raft_entry *entries, size_t n,
                             uint64_t seq, void *data, store_append_cb *cb,
                             uint64_t max_sync_ns)
{
    return append_async(s, entries, n, seq, data, cb, max_sync_ns);
}

int store_append(struct store *s, const struct raft_entry *entries, size_t n)
{
    uint64_t bytes;
    int rc = check_batch(s, entries, n, &bytes);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->write_mu);
    rc = atomic_load(&s->failed);
    if (rc != 0)
        goto out;
    uint64_t first, last;
    s->ops->bounds(s, &first, &last);
    if (entries[0].index < first || entries[0].index > last + 1) {
        rc = store__err(s, TK_EINVAL, "append at index %llu: the log holds %llu..%llu",
                        (unsigned long long)entries[0].index, (unsigned long long)first,
                        (unsigned long long)last);
        goto out;
    }
    struct store__span sp = {.e = entries, .n = n};
    rc = s->ops->write(s, &sp, 1);
    if (rc == 0)
        rc = sync_timed(s);
    if (rc != 0) {
        rc = store__fail(s, rc);
        goto out;
    }
    atomic_fetch_add(&s->st_appends, 1);
    atomic_fetch_add(&s->st_groups, 1);
    atomic_fetch_add(&s->st_entries, n);
    atomic_fetch_add(&s->st_bytes, bytes);
    if (s->ops->idle != NULL)
        s->ops->idle(s);
out:
    pthread_mutex_unlock(&s->write_mu);
    return rc;
}

/* The log now starts after (index, term). write_mu held. */
static void set_log_start(struct store *s, uint64_t index, uint64_t term)
{
    pthread_mutex_lock(&s->meta_mu);
    s->meta.has_log_start = true;
    s->meta.log_first = index + 1;
    s->meta.log_prev_term = term;
    pthread_mutex_unlock(&s->meta_mu);
}

int store_compact(struct store *s, uint64_t index)
{
    pthread_mutex_lock(&s->write_mu);
    int rc = atomic_load(&s->failed);
    if (rc != 0)
        goto out;
    uint64_t first, last, term;
    s->ops->bounds(s, &first, &last);
    if (index < first)
        goto out;
    if (index > last) {
        rc = store__err(s, TK_EINVAL, "compact to index %llu: the log ends at %llu",
                        (unsigned long long)index, (unsigned long long)last);
        goto out;
    }
    rc = s->ops->term_at(s, index, &term);
    TK_ASSERT(rc == 0);
    rc = s->ops->compact(s, index, term);
    if (rc != 0) {
        rc = store__fail(s, rc);
        goto out;
    }
    set_log_start(s, index, term);
out:
    pthread_mutex_unlock(&s->write_mu);
    return rc;
}

int store_reset(struct store *s, uint64_t index, uint64_t term)
{
    pthread_mutex_lock(&s->write_mu);
    int rc = atomic_load(&s->failed);
    if (rc != 0)
        goto out;
    rc = s->ops->reset(s, index, term);
    if (rc != 0) {
        rc = store__fail(s, rc);
        goto out;
    }
    set_log_start(s, index, term);
out:
    pthread_mutex_unlock(&s->write_mu);
    return rc;
}

/* ---- readers ----------------------------------------------------------- */

uint64_t store_first_index(struct store *s)
{
    uint64_t first, last;
    s->ops->bounds(s, &first, &last);
    return first;
}

uint64_t store_last_index(struct store *s)
{
    uint64_t first, last;
    s->ops->bounds(s, &first, &last);
    return last;
}

int store_term_at(struct store *s, uint64_t index, uint64_t *term)
{
    return s->ops->term_at(s, index, term);
}

int store_read(struct store *s, uint64_t lo, uint64_t hi, uint64_t max_bytes,
               struct raft_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (lo > hi)
        return store__err(s, TK_EINVAL, "read %llu..%llu: lo > hi",
                          (unsigned long long)lo, (unsigned long long)hi);
    return s->ops->read(s, lo, hi, max_bytes, out, n);
}

int store_raft_boot(struct store *s, const struct store_boot *boot, struct raft_boot *rb,
                    struct raft_entry **entries)
{
    memset(rb, 0, sizeof(*rb));
    *entries = NULL;
    rb->hard_state = boot->hard_state;
    rb->snapshot = boot->snapshot;
    if (boot->has_bootstrap)
        rb->bootstrap = boot->bootstrap;
    uint64_t lo = boot->first_index;
    if (lo < boot->snapshot.index + 1)
        lo = boot->snapshot.index + 1;
    if (boot->snapshot.index > 0 && boot->first_index > boot->snapshot.index + 1 &&
        boot->last_index >= boot->first_index)
        return store__err(s, TK_ECORRUPT,
                          "the log starts at index %llu but the snapshot ends at %llu: "
                          "entries in between are missing",
                          (unsigned long long)boot->first_index,
                          (unsigned long long)boot->snapshot.index);
    if (lo > boot->last_index)
        return 0;
    size_t n;
    int rc = store_read(s, lo, boot->last_index + 1, 0, entries, &n);
    if (rc != 0)
        return rc;
    rb->entries = *entries;
    rb->n_entries = n;
    return 0;
}

void store_entries_free(struct raft_entry *entries, size_t n)
{
    if (entries == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        tk_blob_unref(entries[i].data);
    tk_free(entries);
}

/* ---- metadata ---------------------------------------------------------- */

static int save_meta(struct store *s, const struct store_meta_state *st, unsigned mask)
{
    int rc = atomic_load(&s->failed);
    if (rc != 0)
        return rc;
    rc = s->ops->save_meta(s, st, mask);
    if (rc == TK_EIO || rc == TK_ENOSPC)
        return store__fail(s, rc);
    return rc;
}

int store_save_hard_state(struct store *s, const struct raft_hard_state *hs)
{
    pthread_mutex_lock(&s->meta_mu);
    struct store_meta_state st = s->meta;
    st.hard_state = *hs;
    int rc = save_meta(s, &st, STORE_META_HARD_STATE);
    if (rc == 0)
        s->meta = st;
    pthread_mutex_unlock(&s->meta_mu);
    return rc;
}

/* A snapshot descriptor into the slot `mask` names (STORE_META_SNAPSHOT or
 * STORE_META_PENDING). */
static int save_descriptor(struct store *s, const struct raft_snapshot_meta *m,
                           unsigned mask)
{
    if (m->config.n_voters > RAFT_VOTERS_MAX)
        return store__err(s, TK_EINVAL, "snapshot config has %u voters",
                          m->config.n_voters);
    pthread_mutex_lock(&s->meta_mu);
    struct store_meta_state st = s->meta;
    if (mask == STORE_META_SNAPSHOT)
        st.snapshot = *m;
    else
        st.pending = *m;
    int rc = save_meta(s, &st, mask);
    if (rc == 0)
        s->meta = st;
    pthread_mutex_unlock(&s->meta_mu);
    return rc;
}

int store_save_snapshot(struct store *s, const struct raft_snapshot_meta *m)
{
    return save_descriptor(s, m, STORE_META_SNAPSHOT);
}

int store_save_pending_snapshot(struct store *s, const struct raft_snapshot_meta *m)
{
    return save_descriptor(s, m, STORE_META_PENDING);
}

int store_save_bootstrap(struct store *s, const struct raft_config *c)
{
    if (c->n_voters == 0 || c->n_voters > RAFT_VOTERS_MAX)
        return store__err(s, TK_EINVAL, "bootstrap config has %u voters", c->n_voters);
    pthread_mutex_lock(&s->meta_mu);
    struct store_meta_state st = s->meta;
    st.has_bootstrap = true;
    st.bootstrap = *c;
    int rc = save_meta(s, &st, STORE_META_BOOTSTRAP);
    if (rc == 0)
        s->meta = st;
    pthread_mutex_unlock(&s->meta_mu);
    return rc;
}

int store_save_ids(struct store *s, uint64_t cluster_id, uint64_t node_id)
{
    pthread_mutex_lock(&s->meta_mu);
    struct store_meta_state st = s->meta;
    st.cluster_id = cluster_id;
    st.node_id = node_id;
    int rc = save_meta(s, &st, STORE_META_IDS);
    if (rc == 0)
        s->meta = st;
    pthread_mutex_unlock(&s->meta_mu);
    return rc;
}

int store_save_incarnation(struct store *s, const uint8_t *inc)
{
    pthread_mutex_lock(&s->meta_mu);
    struct store_meta_state st = s->meta;
    st.has_incarnation = true;
    memcpy(st.incarnation, inc, sizeof(st.incarnation));
    int rc = save_meta(s, &st, STORE_META_IDS);
    if (rc == 0)
        s->meta = st;
    pthread_mutex_unlock(&s->meta_mu);
    return rc;
}

void store_stats(struct store *s, struct store_stats *out)
{
    out->appends = atomic_load(&s->st_appends);
    out->entries = atomic_load(&s->st_entries);
    out->bytes = atomic_load(&s->st_bytes);
    out->syncs = atomic_load(&s->st_syncs);
    out->groups = atomic_load(&s->st_groups);
    out->wakeups = atomic_load(&s->st_wakeups);
    out->recycled = atomic_load(&s->st_recycled);
}

uint64_t store_log_bytes(struct store *s)
{
    return s->ops->log_bytes(s);
}

void store_sync_latency(struct store *s, struct tk_hist *out)
{
    pthread_mutex_lock(&s->stats_mu);
    *out = s->sync_ns;
    pthread_mutex_unlock(&s->stats_mu);
}
