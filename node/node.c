/* The consensus loop of one node (see node.h for the threads and the path of
 * a write).
 *
 * Invariants:
 *  - Only the loop thread touches `raft`, `sm`, the pending lists and the
 *    transport. Other threads reach the loop through `queue` (bounded MPSC)
 *    and `wake` (uv_async), and the storage thread through `durable_seq`.
 *  - raft_persisted(seq) is called only when every ready up to seq is durable:
 *    `persist` lists the seqs handed to storage in order; async appends finish
 *    in submission order, synchronous metadata saves finish at once, and the
 *    list is popped only from its head.
 *  - Every request completes exactly once: on success, on an explicit error,
 *    on its deadline, or with TK_ESHUTDOWN at stop.
 *  - Each loop turn processes at most one burst from the queue (batch_max
 *    entries) and then one ready, so no turn does unbounded work. */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/log.h"
#include "base/queue.h"
#include "kv/kv.h"
#include "node/node.h"
#include "store/store.h"
#include "transport/transport.h"

#define NODE_PERSIST_MAX (1u << 17)

struct req_list {
    struct node_req *head;
    struct node_req *tail;
    size_t n;
};

struct node {
    struct node_options o;
    char *data_dir;  /* owned copy, or the temporary kv dir */
    bool tmp_dir;    /* data_dir is ours to delete at stop */
    bool own_volume; /* we created the memory volume */

    uv_thread_t thread;
    uv_sem_t started;
    uv_sem_t closed; /* posted when the node's last handle has closed */
    int start_rc;
    uv_loop_t own_loop;
    uv_loop_t *loop; /* &own_loop, or the caller's shared loop */
    bool shared;     /* on o.loop, run by the caller; no thread of our own */
    uv_async_t wake;
    uv_timer_t ticker;
    uv_check_t check;
    uv_idle_t idle; /* active while the core has work for the next check */
    bool kicked;
    bool spinning;     /* idle kept active by spin_us */
    uint64_t activity; /* bumped by messages, requests and readies */
    uint64_t activity_seen;
    uint64_t active_ns; /* when activity last changed, seen from on_check */
    atomic_bool stopping;
    bool closing;
    int handles_open;

    struct tk_mpsc queue;
    atomic_size_t queued;

    struct raft *raft;
    struct store *store;
    struct store_mem_volume *volume;
    struct kv_sm *sm;
    struct transport *transport;

    /* Durability: seqs handed to storage, oldest first. */
    uint64_t *persist_seq;
    bool *persist_async;
    uint64_t *persist_ns; /* when each was handed to storage */
    size_t persist_head, persist_n, persist_cap;
    _Atomic uint64_t durable_seq; /* written by the storage thread */
    atomic_int store_status;
    pthread_mutex_t drain_mu;
    pthread_cond_t drain_cv;
    uint64_t async_submitted; /* loop thread */
    uint64_t async_done;      /* under drain_mu */
    bool failed;

    /* Requests waiting, each list in index (or arrival) order. */
    struct req_list applied_wait;   /* writes, applied mode */
    struct req_list committed_wait; /* writes, committed mode */
    struct req_list read_wait;      /* reads waiting for a read index */
    struct req_list read_ready;     /* reads with an index, waiting to apply */
    struct req_list forward_wait;   /* writes forwarded to the leader */
    uint64_t read_ctx;
    uint64_t read_leader; /* the leader known when read_wait was last checked */
    uint64_t forward_id;

    uint64_t snap_index;
    uint64_t snap_bytes;   /* payload bytes applied since the last snapshot began */
    uint64_t compact_goal; /* compact the log up to here, a step per turn */
    /* The KV's tier-down job in flight on the thread pool (see maybe_snapshot). */
    uv_work_t tier_work;
    struct kv_tier_job *tier_job; /* until completed */
    bool tier_busy;               /* until the after-work callback */
    bool tier_snapshot;
    atomic_bool tier_ran;
    struct raft_config tier_config;
    uint64_t tier_t0, tier_t_done;
    uint64_t turn_ns[6], turn_applied; /* this loop turn's, by phase */
    struct kv_result res;              /* scratch for apply */
    struct raft_entry *batch;

    pthread_mutex_t status_mu;
    struct node_status status;   /* written by the loop under status_mu (which
                                    the loop itself may read it without) */
    struct node_metrics metrics; /* loop thread; copied under status_mu */
    struct node_metrics metrics_pub;
    struct node_latency lat; /* loop thread */

    /* Cross-thread leadership transfer request. */
    _Atomic uint64_t transfer_to;
};

/* ---- small helpers ----------------------------------------------------- */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void list_push(struct req_list *l, struct node_req *r)
{
    r->next = NULL;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static struct node_req *list_pop(struct req_list *l)
{
    struct node_req *r = l->head;
    if (r == NULL)
        return NULL;
    l->head = r->next;
    if (l->head == NULL)
        l->tail = NULL;
    l->n--;
    r->next = NULL;
    return r;
}

static void finish_write(struct node *n, struct node_req *r, int status,
                         const struct kv_result *res)
{
    (void)n;
    tk_blob_unref(r->cmd);
    r->cmd = NULL;
    r->write_cb(r, status, res, r->data);
}

static void finish_read(struct node *n, struct node_req *r, int status)
{
    if (status == 0)
        n->metrics.reads++;
    r->read_cb(r, status, status == 0 ? n->sm : NULL, r->data);
}

static void finish(struct node *n, struct node_req *r, int status)
{
    if (r->is_read)
        finish_read(n, r, status);
    else
        finish_write(n, r, status, NULL);
}

static void fail_write(struct node *n, struct node_req *r, int status)
{
    finish_write(n, r, status, NULL);
}

static void fail_list(struct node *n, struct req_list *l, int status)
{
    struct node_req *r;
    while ((r = list_pop(l)) != NULL)
        finish(n, r, status);
}

/* ---- storage ----------------------------------------------------------- */

/* Storage thread: a batch is durable (or failed). Runs in submission order. */
static void on_appended(void *data, uint64_t seq, uint64_t last_index, uint64_t last_term,
                        int status)
{
    struct node *n = data;
    (void)last_index;
    (void)last_term;
    if (status != 0)
        atomic_store(&n->store_status, status);
    else
        atomic_store_explicit(&n->durable_seq, seq, memory_order_release);
    pthread_mutex_lock(&n->drain_mu);
    n->async_done++;
    pthread_cond_signal(&n->drain_cv);
    pthread_mutex_unlock(&n->drain_mu);
    uv_async_send(&n->wake);
}

static void persist_push(struct node *n, uint64_t seq, bool async)
{
    if (n->persist_n == n->persist_cap) {
        size_t cap = n->persist_cap ? n->persist_cap * 2 : 256;
        TK_ASSERT(cap <= NODE_PERSIST_MAX);
        uint64_t *s = tk_malloc(cap * sizeof(*s));
        bool *a = tk_malloc(cap * sizeof(*a));
        uint64_t *t = tk_malloc(cap * sizeof(*t));
        for (size_t i = 0; i < n->persist_n; i++) {
            size_t at = (n->persist_head + i) % n->persist_cap;
            s[i] = n->persist_seq[at];
            a[i] = n->persist_async[at];
            t[i] = n->persist_ns[at];
        }
        tk_free(n->persist_seq);
        tk_free(n->persist_async);
        tk_free(n->persist_ns);
        n->persist_seq = s;
        n->persist_async = a;
        n->persist_ns = t;
        n->persist_head = 0;
        n->persist_cap = cap;
    }
    size_t at = (n->persist_head + n->persist_n) % n->persist_cap;
    n->persist_seq[at] = seq;
    n->persist_async[at] = async;
    n->persist_ns[at] = async ? mono_ns() : 0;
    n->persist_n++;
}

/* Reports to the core every seq whose ready is durable, oldest first. */
static void persist_poll(struct node *n)
{
    uint64_t durable = atomic_load_explicit(&n->durable_seq, memory_order_acquire);
    uint64_t upto = 0, now = 0;
    while (n->persist_n > 0) {
        size_t at = n->persist_head;
        if (n->persist_async[at] && n->persist_seq[at] > durable)
            break;
        if (n->persist_async[at]) {
            if (now == 0)
                now = mono_ns();
            tk_hist_record(&n->lat.append, now - n->persist_ns[at]);
        }
        upto = n->persist_seq[at];
        n->persist_head = (n->persist_head + 1) % n->persist_cap;
        n->persist_n--;
    }
    if (upto != 0)
        raft_persisted(n->raft, upto);
}

/* Waits until every async append submitted so far has finished: needed before
 * a snapshot replaces the log (store_reset must not race queued appends). */
static void drain_appends(struct node *n)
{
    pthread_mutex_lock(&n->drain_mu);
    while (n->async_done < n->async_submitted)
        pthread_cond_wait(&n->drain_cv, &n->drain_mu);
    pthread_mutex_unlock(&n->drain_mu);
}

static void publish_status(struct node *n);

static void node_fail(struct node *n, int rc, const char *what)
{
    if (n->failed)
        return;
    n->failed = true;
    publish_status(n);
    TK_LOG(TK_LOG_ERROR, n->o.id, raft_term(n->raft),
           "storage failed, node stops serving: %s: %s", what, tk_strerror(rc));
    fail_list(n, &n->applied_wait, TK_EIO);
    fail_list(n, &n->committed_wait, TK_EIO);
    fail_list(n, &n->read_wait, TK_EIO);
    fail_list(n, &n->read_ready, TK_EIO);
    fail_list(n, &n->forward_wait, TK_EIO);
}

/* ---- apply ------------------------------------------------------------- */

static void serve_reads(struct node *n)
{
    uint64_t applied = kv_sm_applied_index(n->sm);
    struct req_list keep = {0};
    struct node_req *r;
    while ((r = list_pop(&n->read_ready)) != NULL) {
        if (r->index <= applied)
            finish_read(n, r, 0);
        else
            list_push(&keep, r);
    }
    n->read_ready = keep;
}

/* A proposal of term T at an index above a committed entry of a later term
 * can never commit: logs are ordered by term, and every later leader holds
 * that entry. Such proposals end with TK_ELOST at once instead of waiting for
 * the log to grow past them (which, with no new writes, is never). */
static void complete_committed(struct node *n)
{
    uint64_t commit = raft_commit(n->raft);
    uint64_t commit_term = 0;
    bool known = raft_term_at(n->raft, commit, &commit_term) == 0;
    struct node_req *r;
    while ((r = n->committed_wait.head) != NULL &&
           (r->index <= commit || (known && r->term < commit_term))) {
        list_pop(&n->committed_wait);
        if (r->index > commit) {
            finish_write(n, r, TK_ELOST, NULL);
            continue;
        }
        uint64_t t = 0;
        int rc = raft_term_at(n->raft, r->index, &t);
        memset(&n->res, 0, sizeof(n->res));
        n->res.revision = r->index;
        if (rc == 0 && t == r->term)
            finish_write(n, r, 0, &n->res);
        else if (rc == 0)
            finish_write(n, r, TK_ELOST, NULL);
        else
            finish_write(n, r, TK_ETIMEDOUT, NULL); /* compacted: unknown */
    }
}

static void maybe_snapshot(struct node *n);
static void kick(struct node *n);

/* Entries ahead whose index bucket, then record, apply_entries asks the KV
 * to start loading: their cache misses overlap the current entry's work. */
#define PREFETCH_BUCKET 8
#define PREFETCH_RECORD 4

/* Stage one for an entry: its bucket; remembers the key's hash (and whether
 * it has one) for stage two. */
static void prefetch_bucket(struct node *n, const struct raft_entry *x, uint64_t *hash,
                            bool *have)
{
    *have = x->type == RAFT_ENTRY_NORMAL && x->data != NULL &&
            kv_sm_prefetch(n->sm, x->data->data, x->data->len, hash);
}

static void apply_entries(struct node *n, const struct raft_entry *e, size_t cnt)
{
    uint64_t hash[PREFETCH_BUCKET];
    bool have[PREFETCH_BUCKET];
    for (size_t i = 0; i < cnt && i < PREFETCH_BUCKET; i++)
        prefetch_bucket(n, &e[i], &hash[i], &have[i]);
    for (size_t i = 0; i < cnt && i < PREFETCH_RECORD; i++)
        if (have[i])
            kv_sm_prefetch_record(n->sm, hash[i]);
    for (size_t i = 0; i < cnt; i++) {
        const struct raft_entry *x = &e[i];
        size_t ahead_r = i + PREFETCH_RECORD, ahead_b = i + PREFETCH_BUCKET;
        if (ahead_r < cnt && have[ahead_r % PREFETCH_BUCKET])
            kv_sm_prefetch_record(n->sm, hash[ahead_r % PREFETCH_BUCKET]);
        if (ahead_b < cnt) /* takes entry i's slot, which is done */
            prefetch_bucket(n, &e[ahead_b], &hash[ahead_b % PREFETCH_BUCKET],
                            &have[ahead_b % PREFETCH_BUCKET]);
        int rc;
        if (x->type == RAFT_ENTRY_NORMAL) {
            const void *p = x->data ? x->data->data : NULL;
            size_t len = x->data ? x->data->len : 0;
            n->snap_bytes += len;
            rc = kv_sm_apply(n->sm, x->index, x->term, x->time_ms, p, len, &n->res);
        } else {
            memset(&n->res, 0, sizeof(n->res));
            rc = kv_sm_skip(n->sm, x->index, x->term, x->time_ms);
        }
        if (rc != 0) {
            node_fail(n, rc, "apply");
            return;
        }
        n->metrics.applied_entries++;
        /* Writes proposed here complete in index order. */
        /* ... and those above it from an older term can never commit (see
         * complete_committed). */
        struct node_req *r;
        while ((r = n->applied_wait.head) != NULL &&
               (r->index <= x->index || r->term < x->term)) {
            list_pop(&n->applied_wait);
            if (r->index == x->index && r->term == x->term)
                finish_write(n, r, 0, &n->res);
            else if (r->index >= x->index)
                finish_write(n, r, TK_ELOST, NULL);
            else
                finish_write(n, r, TK_ETIMEDOUT, NULL); /* skipped by a snapshot */
        }
    }
}

/* Log compaction (DESIGN "Ring-log KV state machine"): once enough entries are
 * applied past the last snapshot, the KV tiers down to the applied index, its
 * cold tier becomes the snapshot, and the log is compacted behind it, keeping
 * a trailing window for followers that are only a little behind.
 *
 * None of the heavy work stalls the loop: the KV's tier-down job (the LMDB
 * transaction and reading the snapshot stream) runs on libuv's thread pool
 * while the loop goes on replicating and applying, and the log is then
 * compacted a bounded step per loop turn. The same job moves the ring's
 * oldest pages to LMDB when the ring is over its budget. A job in flight
 * counts as an open handle, so the node is not freed under it. */
#define COMPACT_STEP 32768
#define TIER_NICE 5
#define SLOW_TURN_NS (100 * 1000000ull) /* warn about loop turns this long */

static void tier_work(uv_work_t *w)
{
    struct node *n = w->data;
    /* libuv's pool threads inherit the name of the loop that started them. A
     * job yields the CPU to the loops (nice 5: about a quarter of a core
     * against a busy loop) so that it cannot delay heartbeats on a machine
     * with fewer cores than busy threads. */
    pthread_setname_np(pthread_self(), "tk-tier");
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int was = getpriority(PRIO_PROCESS, tid);
    bool niced =
        errno == 0 && was < TIER_NICE && setpriority(PRIO_PROCESS, tid, TIER_NICE) == 0;
    kv_tier_run(n->tier_job);
    /* The pool is the process's: give the thread back as it was, where the
     * process may raise a priority again (CAP_SYS_NICE or RLIMIT_NICE). */
    if (niced)
        (void)setpriority(PRIO_PROCESS, tid, was);
    atomic_store_explicit(&n->tier_ran, true, memory_order_release);
}

static void snapshot_taken(struct node *n, struct kv_tier_result *res)
{
    struct raft_snapshot_meta meta = {
        .index = res->index, .term = res->term, .config = n->tier_config};
    struct tk_blob *blob = tk_blob_copy(res->stream, res->stream_len);
    size_t len = res->stream_len;
    tk_free(res->stream);
    int rc = raft_snapshot_set(n->raft, &meta, blob);
    tk_blob_unref(blob);
    if (rc != 0) {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "snapshot at %llu refused by the core: %s", (unsigned long long)meta.index,
               tk_strerror(rc));
        n->snap_index = meta.index; /* try again a full interval later */
        return;
    }
    rc = store_save_snapshot(n->store, &meta);
    if (rc != 0) {
        node_fail(n, rc, "save snapshot");
        return;
    }
    n->snap_index = meta.index;
    n->metrics.snapshots++;
    if (meta.index > n->o.trailing_entries)
        n->compact_goal = meta.index - n->o.trailing_entries;
    TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
           "snapshot at %llu (%zu bytes): %llu ms in all, %llu us of it on the loop",
           (unsigned long long)meta.index, len,
           (unsigned long long)((mono_ns() - n->tier_t0) / 1000000),
           (unsigned long long)((mono_ns() - n->tier_t_done) / 1000));
}

/* Loop thread, once the job has run: publish it in the KV, then take the
 * snapshot (unless `discard`: an installed snapshot is replacing it). */
static void tier_complete(struct node *n, bool discard)
{
    struct kv_tier_job *j = n->tier_job;
    n->tier_job = NULL;
    n->tier_t_done = mono_ns();
    struct kv_tier_result res;
    int rc = kv_sm_tier_finish(n->sm, j, &res);
    if (rc != 0) {
        node_fail(n, rc, "tier-down");
        return;
    }
    if (res.stream == NULL)
        return;
    if (!n->tier_snapshot || discard || n->closing || n->failed) {
        tk_free(res.stream);
        return;
    }
    snapshot_taken(n, &res);
}

static void handle_gone(struct node *n);

static void tier_after(uv_work_t *w, int status)
{
    struct node *n = w->data;
    (void)status;
    n->tier_busy = false;
    if (n->tier_job != NULL)
        tier_complete(n, false);
    kick(n);
    handle_gone(n);
}

/* Loop thread: blocks until the job in flight has run, then completes it.
 * Only for what cannot go on beside it (installing a snapshot, a ring past
 * twice its budget); its after-work callback later finds nothing to do. */
static void tier_wait(struct node *n, bool discard)
{
    if (n->tier_job == NULL)
        return;
    /* Not started yet (the pool may be busy with other work, such as DNS
     * lookups): take it back and run it here rather than wait for a thread. */
    if (n->tier_busy && uv_cancel((uv_req_t *)&n->tier_work) == 0) {
        kv_tier_run(n->tier_job);
        atomic_store_explicit(&n->tier_ran, true, memory_order_release);
    }
    while (!atomic_load_explicit(&n->tier_ran, memory_order_acquire)) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    tier_complete(n, discard);
}

static void tier_start(struct node *n, bool snapshot, bool inline_run)
{
    struct kv_tier_job *j;
    int rc = kv_sm_tier_start(n->sm, snapshot, &j);
    if (rc != 0) {
        node_fail(n, rc, "tier-down");
        return;
    }
    if (j == NULL)
        return;
    n->tier_job = j;
    n->tier_snapshot = snapshot;
    if (snapshot)
        n->snap_bytes = 0; /* what was applied so far is in this snapshot */
    n->tier_config = *raft_config(n->raft);
    n->tier_t0 = mono_ns();
    atomic_store(&n->tier_ran, false);
    if (!inline_run) {
        n->tier_work.data = n;
        if (uv_queue_work(n->loop, &n->tier_work, tier_work, tier_after) == 0) {
            n->tier_busy = true;
            n->handles_open++;
            return;
        }
    }
    kv_tier_run(j);
    atomic_store(&n->tier_ran, true);
    tier_complete(n, false);
}

/* One bounded step of compaction towards compact_goal: dropping millions of
 * entries at once would hold the loop (and the memory volume's lock) for tens
 * of milliseconds. */
static void compact_step(struct node *n)
{
    uint64_t first = raft_first_index(n->raft);
    uint64_t upto = n->compact_goal;
    if (upto < first)
        return;
    if (upto - first >= COMPACT_STEP)
        upto = first + COMPACT_STEP - 1;
    if (upto > raft_stable_index(n->raft))
        upto = raft_stable_index(n->raft);
    if (upto < first || raft_compact(n->raft, upto) != 0)
        return;
    int rc = store_compact(n->store, upto);
    if (rc != 0)
        node_fail(n, rc, "compact");
}

static void maybe_snapshot(struct node *n)
{
    compact_step(n);
    if (n->tier_busy) {
        if (n->tier_job != NULL && kv_sm_tier_urgent(n->sm)) {
            uint64_t t0 = mono_ns();
            tier_wait(n, false);
            TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
                   "the KV ring passed twice its budget during a tier-down: the loop "
                   "waited %llu ms for it",
                   (unsigned long long)((mono_ns() - t0) / 1000000));
        }
        return;
    }
    uint64_t applied = kv_sm_applied_index(n->sm);
    if ((n->o.snapshot_entries != 0 &&
         applied >= n->snap_index + n->o.snapshot_entries) ||
        (n->o.snapshot_bytes != 0 && n->snap_bytes >= n->o.snapshot_bytes))
        tier_start(n, true, false);
    else if (kv_sm_tier_wanted(n->sm))
        tier_start(n, false, false);
}

/* A snapshot from the leader replaces the state machine and the log. */
static int install_snapshot(struct node *n, const struct raft_snapshot_meta *meta,
                            struct tk_blob *data)
{
    drain_appends(n);
    tier_wait(n, true);
    n->compact_goal = 0;
    struct kv_install *in;
    int rc = kv_sm_install_begin(n->sm, &in);
    if (rc != 0)
        return rc;
    if (data != NULL && data->len > 0)
        rc = kv_install_write(in, data->data, data->len);
    if (rc == 0)
        rc = kv_install_commit(in);
    else
        kv_install_abort(in);
    if (rc != 0)
        return rc;
    rc = store_reset(n->store, meta->index, meta->term);
    if (rc == 0)
        rc = store_save_snapshot(n->store, meta);
    n->snap_index = meta->index;
    n->metrics.installs++;
    /* Writes waiting at or below the snapshot: their outcome is unknown. */
    struct node_req *r;
    while ((r = n->applied_wait.head) != NULL && r->index <= meta->index) {
        list_pop(&n->applied_wait);
        finish_write(n, r, TK_ETIMEDOUT, NULL);
    }
    return rc;
}

/* ---- the ready loop ---------------------------------------------------- */

static void publish_status(struct node *n)
{
    pthread_mutex_lock(&n->status_mu);
    n->status.id = n->o.id;
    n->status.term = raft_term(n->raft);
    n->status.leader = raft_leader(n->raft);
    n->status.role = raft_role(n->raft);
    n->status.commit = raft_commit(n->raft);
    n->status.applied = kv_sm_applied_index(n->sm);
    n->status.last_index = raft_last_index(n->raft);
    n->status.snapshot_index = n->snap_index;
    n->status.failed = n->failed;
    struct store_stats ss;
    store_stats(n->store, &ss);
    n->metrics.store_syncs = ss.syncs;
    n->metrics.store_bytes = ss.bytes;
    n->metrics.read_index_rounds = raft_read_rounds(n->raft);
    struct kv_sm_stats ks;
    kv_sm_stats(n->sm, &ks);
    n->metrics.kv_ring_bytes = ks.ring_bytes;
    n->metrics.kv_hot_keys = ks.hot_keys;
    n->metrics.kv_cold_keys = ks.cold_keys;
    n->metrics.kv_cold_bytes = ks.cold_bytes;
    n->metrics.kv_tier_downs = ks.tier_downs;
    n->metrics.kv_bad_records = ks.bad_records;
    if (n->transport != NULL) {
        struct transport_stats ts;
        transport_stats(n->transport, &ts);
        n->metrics.net_bytes_sent = ts.bytes_sent;
        n->metrics.net_bytes_received = ts.bytes_received;
        n->metrics.net_reconnects = ts.conns_dialed;
    }
    n->metrics_pub = n->metrics;
    pthread_mutex_unlock(&n->status_mu);
}

static void handle_read_states(struct node *n, const struct raft_read_state *rs,
                               size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) {
        struct req_list keep = {0};
        struct node_req *r;
        while ((r = list_pop(&n->read_wait)) != NULL) {
            if (r->ctx != rs[i].ctx) {
                list_push(&keep, r);
                continue;
            }
            if (rs[i].failed) {
                finish_read(n, r, TK_ENOLEADER);
            } else {
                r->index = rs[i].index;
                list_push(&n->read_ready, r);
            }
        }
        n->read_wait = keep;
    }
}

/* A follower's read waits for the leader it asked (thesis 6.4). Once this
 * node knows another leader, or none, that answer may never come: the read
 * fails now with TK_ENOLEADER (a 503 the client retries) rather than at its
 * deadline (a 504 ten seconds later). The reads a leader confirms itself are
 * failed by the core when it steps down. Walks read_wait only when the known
 * leader changed. */
static void fail_orphan_reads(struct node *n)
{
    uint64_t leader = raft_leader(n->raft);
    if (leader == n->read_leader)
        return;
    n->read_leader = leader;
    struct req_list keep = {0};
    struct node_req *r;
    while ((r = list_pop(&n->read_wait)) != NULL) {
        if (r->asked != 0 && r->asked != leader)
            finish_read(n, r, TK_ENOLEADER);
        else
            list_push(&keep, r);
    }
    n->read_wait = keep;
}

/* Where a loop turn's time went, for the slow-turn warning. */
enum turn_phase { PH_READY, PH_STORE, PH_SEND, PH_APPLY, PH_ADVANCE, PH_SNAP, PH_N };
_Static_assert(PH_N == sizeof(((struct node *)0)->turn_ns) / sizeof(uint64_t),
               "struct node's turn_ns has a slot per phase");
static const char *const phase_name[PH_N] = {"ready", "store",   "send",
                                             "apply", "advance", "snapshot"};

static void phase_end(struct node *n, enum turn_phase ph, uint64_t *t)
{
    uint64_t now = mono_ns();
    n->turn_ns[ph] += now - *t;
    *t = now;
}

static void process_ready(struct node *n)
{
    int guard = 0;
    uint64_t t = mono_ns();
    while (!n->failed && raft_has_ready(n->raft) && guard++ < 8) {
        struct raft_ready rd;
        raft_ready(n->raft, &rd);
        /* Answers completed below name the leader (X-Tierkv-Leader): let
         * them see a change of leader that this ready carries. Becoming
         * leader is published at the end of the turn instead, once this
         * ready's messages (the term's first appends) have left. */
        uint64_t leader = raft_leader(n->raft);
        if (leader != n->status.leader && leader != n->o.id)
            publish_status(n);
        phase_end(n, PH_READY, &t);
        int rc = 0;
        if (rd.snapshot != NULL) {
            rc = install_snapshot(n, rd.snapshot, rd.snapshot_data);
            if (rc != 0) {
                raft_advance(n->raft, &rd);
                node_fail(n, rc, "install snapshot");
                return;
            }
        }
        if (rd.hard_state_changed) {
            rc = store_save_hard_state(n->store, &rd.hard_state);
            if (rc != 0) {
                raft_advance(n->raft, &rd);
                node_fail(n, rc, "save hard state");
                return;
            }
        }
        if (rd.n_entries > 0) {
            rc = store_append_async(n->store, rd.entries, rd.n_entries, rd.seq, n,
                                    on_appended);
            if (rc != 0) {
                raft_advance(n->raft, &rd);
                node_fail(n, rc, "append");
                return;
            }
            n->async_submitted++;
            persist_push(n, rd.seq, true);
        } else if (rd.seq != 0) {
            persist_push(n, rd.seq, false); /* durable already (sync saves) */
        }
        phase_end(n, PH_STORE, &t);
        for (size_t i = 0; i < rd.n_messages; i++)
            (void)transport_send(n->transport, &rd.messages[i]); /* Raft retries */
        phase_end(n, PH_SEND, &t);
        if (rd.n_committed > 0) {
            uint64_t t0 = t;
            apply_entries(n, rd.committed, rd.n_committed);
            phase_end(n, PH_APPLY, &t);
            tk_hist_record(&n->lat.apply, t - t0);
            n->turn_applied += rd.n_committed;
        }
        if (rd.n_read_states > 0)
            handle_read_states(n, rd.read_states, rd.n_read_states);
        raft_advance(n->raft, &rd);
        if (rd.n_committed > 0)
            raft_applied(n->raft, kv_sm_applied_index(n->sm));
        persist_poll(n);
        complete_committed(n);
        serve_reads(n);
        phase_end(n, PH_ADVANCE, &t);
    }
    if (!n->failed) {
        maybe_snapshot(n);
        phase_end(n, PH_SNAP, &t);
    }
    if (!n->failed && raft_has_ready(n->raft))
        kick(n); /* bounded work per turn: the rest on the next one */
    publish_status(n);
    if (!n->failed)
        fail_orphan_reads(n); /* after publishing: its answers name no old leader */
}

/* ---- requests from other threads --------------------------------------- */

static void start_read(struct node *n, struct node_req *r)
{
    if (r->consistency == NODE_READ_STALE) {
        finish_read(n, r, 0);
        return;
    }
    n->metrics.read_index++;
    r->ctx = ++n->read_ctx;
    r->asked = raft_role(n->raft) == RAFT_LEADER ? 0 : raft_leader(n->raft);
    int rc = raft_read_index(n->raft, r->ctx);
    if (rc != 0) {
        finish_read(n, r, rc);
        return;
    }
    list_push(&n->read_wait, r);
}

/* ---- forwarding (follower -> leader, over the transport) ---------------
 *
 * A write submitted on a follower travels to the leader in a FORWARD frame
 * and its result comes back in another, so a client never chases the leader:
 *   request:  [u8 1][u8 mode][u64 id][command bytes]
 *   response: [u8 2][u8 0][u64 id][i32 status][kv_result_encode() bytes]
 * (integers little-endian). The leader proposes a forwarded command like its
 * own; a leader that is no longer one answers TK_ENOTLEADER. */

#define FWD_REQ 1
#define FWD_RESP 2
#define FWD_HDR 10

struct fwd_req {
    struct node_req req;
    struct node *n;
    uint64_t origin;
    uint64_t id;
};

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void forward_answer(struct node *n, uint64_t to, uint64_t id, int status,
                           const struct kv_result *res)
{
    uint8_t buf[FWD_HDR + 4 + KV_RESULT_ENCODED_MAX];
    buf[0] = FWD_RESP;
    buf[1] = 0;
    put_le(buf + 2, id, 8);
    put_le(buf + FWD_HDR, (uint32_t)status, 4);
    size_t len = FWD_HDR + 4;
    if (status == 0 && res != NULL)
        len += kv_result_encode(res, buf + len);
    if (n->transport != NULL)
        (void)transport_send_forward(n->transport, to, buf, len); /* origin times out */
}

static void forwarded_done(struct node_req *req, int status, const struct kv_result *res,
                           void *data)
{
    struct fwd_req *f = data;
    (void)req;
    forward_answer(f->n, f->origin, f->id, status, res);
    tk_free(f);
}

static void forward_request(struct node *n, uint64_t from, const uint8_t *buf, size_t len)
{
    uint64_t id = get_le(buf + 2, 8);
    if (raft_role(n->raft) != RAFT_LEADER || n->failed || n->closing) {
        forward_answer(n, from, id, n->failed ? TK_EIO : TK_ENOTLEADER, NULL);
        return;
    }
    struct fwd_req *f = tk_calloc(1, sizeof(*f));
    f->n = n;
    f->origin = from;
    f->id = id;
    f->req.mode = buf[1] == NODE_MODE_COMMITTED ? NODE_MODE_COMMITTED : NODE_MODE_APPLIED;
    f->req.cmd = tk_blob_copy(buf + FWD_HDR, len - FWD_HDR);
    f->req.write_cb = forwarded_done;
    f->req.data = f;
    int rc = node_submit(n, &f->req);
    if (rc != 0) {
        tk_blob_unref(f->req.cmd);
        forward_answer(n, from, id, rc, NULL);
        tk_free(f);
    }
}

static void forward_response(struct node *n, const uint8_t *buf, size_t len)
{
    if (len < FWD_HDR + 4)
        return;
    uint64_t id = get_le(buf + 2, 8);
    int status = (int)(int32_t)(uint32_t)get_le(buf + FWD_HDR, 4);
    struct node_req *r, *found = NULL;
    if (n->forward_wait.head != NULL && n->forward_wait.head->ctx == id) {
        /* The usual case: answers come back in the order they were sent. */
        found = list_pop(&n->forward_wait);
    } else {
        struct req_list keep = {0};
        while ((r = list_pop(&n->forward_wait)) != NULL) {
            if (found == NULL && r->ctx == id)
                found = r;
            else
                list_push(&keep, r);
        }
        n->forward_wait = keep;
    }
    if (found == NULL)
        return; /* timed out already, or a duplicate */
    if (status == 0) {
        int rc = kv_result_decode(buf + FWD_HDR + 4, len - FWD_HDR - 4, &n->res);
        if (rc != 0) {
            finish_write(n, found, TK_EPROTO, NULL);
            return;
        }
        finish_write(n, found, 0, &n->res);
        return;
    }
    if (status > 0 || status < -100)
        status = TK_EPROTO;
    finish_write(n, found, status, NULL);
}

/* Transport callback: a FORWARD frame from a peer. Bad frames are dropped. */
static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    struct node *n = data;
    (void)t;
    if (n->closing || len < FWD_HDR)
        return;
    if (buf[0] == FWD_REQ)
        forward_request(n, from, buf, len);
    else if (buf[0] == FWD_RESP)
        forward_response(n, buf, len);
    kick(n);
}

/* Sends a write to the leader, or fails it here when no leader is known. */
static void forward_write(struct node *n, struct node_req *r)
{
    uint64_t leader = raft_leader(n->raft);
    if (leader == RAFT_NONE || leader == n->o.id) {
        fail_write(n, r, TK_ENOLEADER);
        return;
    }
    size_t len = FWD_HDR + r->cmd->len;
    uint8_t *buf = tk_malloc(len);
    buf[0] = FWD_REQ;
    buf[1] = r->mode;
    r->ctx = ++n->forward_id;
    put_le(buf + 2, r->ctx, 8);
    memcpy(buf + FWD_HDR, r->cmd->data, r->cmd->len);
    int rc = transport_send_forward(n->transport, leader, buf, len);
    tk_free(buf);
    if (rc != 0) {
        fail_write(n, r, rc == TK_ENOTFOUND ? TK_ENOLEADER : rc);
        return;
    }
    n->metrics.forwarded++;
    list_push(&n->forward_wait, r);
}

/* Drains one burst from the queue: writes become one raft_propose batch. */
static void drain_queue(struct node *n)
{
    size_t nb = 0;
    struct node_req *first = NULL, *last = NULL;
    uint64_t now = wall_ms();
    void *item;
    while (nb < n->o.batch_max && (item = tk_mpsc_pop(&n->queue)) != NULL) {
        n->activity++;
        atomic_fetch_sub_explicit(&n->queued, 1, memory_order_relaxed);
        struct node_req *r = item;
        r->deadline_ms = now + (r->timeout_ms ? r->timeout_ms : n->o.timeout_ms);
        if (n->failed) {
            finish(n, r, TK_EIO);
            continue;
        }
        if (r->is_read) {
            start_read(n, r);
            continue;
        }
        if (raft_role(n->raft) != RAFT_LEADER) {
            forward_write(n, r);
            continue;
        }
        n->batch[nb++] = (struct raft_entry){
            .type = RAFT_ENTRY_NORMAL, .time_ms = now, .data = r->cmd};
        r->next = NULL;
        if (last)
            last->next = r;
        else
            first = r;
        last = r;
    }
    if (nb == 0)
        return;
    uint64_t index = 0, term = 0;
    int rc = raft_propose(n->raft, n->batch, nb, &index, &term);
    if (rc == 0) {
        n->metrics.proposals += nb;
        n->metrics.batches++;
        tk_hist_record(&n->lat.batch_size, nb);
    }
    struct node_req *r = first;
    while (r != NULL) {
        struct node_req *next = r->next;
        if (rc != 0) {
            fail_write(n, r, rc);
        } else {
            r->index = index++;
            r->term = term;
            tk_blob_unref(r->cmd); /* the log holds its own reference */
            r->cmd = NULL;
            list_push(r->mode == NODE_MODE_COMMITTED ? &n->committed_wait
                                                     : &n->applied_wait,
                      r);
        }
        r = next;
    }
}

static void expire_list(struct node *n, struct req_list *l, uint64_t now)
{
    /* Lists are in arrival order and share one default timeout: expired
     * requests are at the head; the scan stops at the first live one. */
    struct node_req *r;
    while ((r = l->head) != NULL && r->deadline_ms <= now) {
        list_pop(l);
        finish(n, r, TK_ETIMEDOUT);
    }
}

/* ---- loop callbacks ---------------------------------------------------- */

static void begin_close(struct node *n);

static void on_wake(uv_async_t *h)
{
    struct node *n = h->data;
    if (atomic_load(&n->stopping)) {
        begin_close(n);
        return;
    }
    int st = atomic_load(&n->store_status);
    if (st != 0)
        node_fail(n, st, "append");
    uint64_t to = atomic_exchange(&n->transfer_to, 0);
    if (to != 0)
        (void)raft_transfer_leadership(n->raft, to);
    drain_queue(n);
    kick(n);
}

static void on_tick(uv_timer_t *h)
{
    struct node *n = h->data;
    if (n->failed)
        return;
    raft_tick(n->raft);
    kick(n);
    uint64_t now = wall_ms();
    expire_list(n, &n->applied_wait, now);
    expire_list(n, &n->committed_wait, now);
    expire_list(n, &n->read_wait, now);
    expire_list(n, &n->read_ready, now);
    expire_list(n, &n->forward_wait, now);
}

static void on_idle(uv_idle_t *h)
{
    (void)h; /* its being active keeps the loop from blocking in poll */
}

/* Something changed the core outside this node's check callback (a message,
 * a tick, a wake-up): make sure the loop comes round to on_check without
 * sleeping. With several nodes on one loop, a message from another node's
 * check would otherwise wait for the next timer. */
static void kick(struct node *n)
{
    if (!n->kicked && !n->closing) {
        n->kicked = true;
        uv_idle_start(&n->idle, on_idle);
    }
}

static void on_check(uv_check_t *h)
{
    struct node *n = h->data;
    if (n->closing)
        return;
    uint64_t t0 = mono_ns();
    if (raft_has_ready(n->raft))
        n->activity++;
    if (n->activity != n->activity_seen) {
        n->activity_seen = n->activity;
        n->active_ns = t0;
    }
    /* Spin: the idle handle keeps the loop polling without blocking for
     * spin_us after the last activity. */
    bool spin = n->o.spin_us != 0 && t0 - n->active_ns < (uint64_t)n->o.spin_us * 1000;
    if (n->kicked || (n->spinning && !spin)) {
        n->kicked = false;
        n->spinning = false;
        uv_idle_stop(&n->idle);
    }
    if (spin && !n->spinning) {
        n->spinning = true;
        uv_idle_start(&n->idle, on_idle);
    }
    persist_poll(n);
    memset(n->turn_ns, 0, sizeof(n->turn_ns));
    n->turn_applied = 0;
    process_ready(n);
    uint64_t dt = mono_ns() - t0;
    if (dt > SLOW_TURN_NS) {
        int worst = 0;
        for (int i = 1; i < PH_N; i++)
            if (n->turn_ns[i] > n->turn_ns[worst])
                worst = i;
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "a loop turn took %llu ms (election timeout %u ms): heartbeats were late; "
               "most of it (%llu ms) in %s; %llu entries applied",
               (unsigned long long)(dt / 1000000), n->o.tick_ms * n->o.election_ticks,
               (unsigned long long)(n->turn_ns[worst] / 1000000), phase_name[worst],
               (unsigned long long)n->turn_applied);
    }
    /* A burst bigger than one batch: come back next turn without sleeping. */
    if (atomic_load_explicit(&n->queued, memory_order_relaxed) > 0)
        uv_async_send(&n->wake);
}

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    struct node *n = data;
    (void)t;
    if (!n->closing && !n->failed) {
        (void)raft_step(n->raft, m);
        n->activity++;
        kick(n);
    }
}

static void handle_gone(struct node *n)
{
    if (--n->handles_open == 0)
        uv_sem_post(&n->closed);
}

static void on_handle_closed(uv_handle_t *h)
{
    handle_gone(h->data);
}

static void on_transport_closed(struct transport *t, void *data)
{
    struct node *n = data;
    (void)t;
    n->transport = NULL;
    handle_gone(n);
}

static void begin_close(struct node *n)
{
    if (n->closing)
        return;
    n->closing = true;
    if (n->o.on_loop_stop != NULL)
        n->o.on_loop_stop(n, n->loop, n->o.hook_data);
    void *item;
    while ((item = tk_mpsc_pop(&n->queue)) != NULL)
        finish(n, item, TK_ESHUTDOWN);
    fail_list(n, &n->applied_wait, TK_ESHUTDOWN);
    fail_list(n, &n->committed_wait, TK_ESHUTDOWN);
    fail_list(n, &n->read_wait, TK_ESHUTDOWN);
    fail_list(n, &n->read_ready, TK_ESHUTDOWN);
    fail_list(n, &n->forward_wait, TK_ESHUTDOWN);
    /* The storage thread wakes us from its callbacks: let those finish
     * before the wake handle goes away. */
    drain_appends(n);
    uv_close((uv_handle_t *)&n->wake, on_handle_closed);
    uv_close((uv_handle_t *)&n->ticker, on_handle_closed);
    uv_close((uv_handle_t *)&n->check, on_handle_closed);
    uv_close((uv_handle_t *)&n->idle, on_handle_closed);
    transport_close(n->transport, on_transport_closed, n);
}

/* ---- start and stop ---------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Room, in entries, for the in-memory logs (the core's and a memory volume's)
 * from the start: twice what they hold at most between snapshots (the
 * interval, the trailing window, what a snapshot job lets pass meanwhile), so
 * they never grow (copying millions of entries) in the middle of a write, and
 * moving the live entries to the front of the array happens rarely. Pages are
 * only touched as they fill. At most 8M entries (about 320 MiB of address
 * space): past that, or without an entry threshold, the logs grow as needed. */
#define RESERVE_HOLD_MAX ((uint64_t)4 << 20) /* beyond: grow as needed */

static size_t log_reserve(const struct node *n)
{
    uint64_t se = n->o.snapshot_entries, te = n->o.trailing_entries;
    if (se == 0 || se > RESERVE_HOLD_MAX || te > RESERVE_HOLD_MAX)
        return (size_t)(2 * RESERVE_HOLD_MAX);
    uint64_t hold = se + se / 4 + te + 65536; /* no overflow: each <= 4M */
    if (hold > RESERVE_HOLD_MAX)
        hold = RESERVE_HOLD_MAX;
    return (size_t)(2 * hold);
}

static int open_storage(struct node *n, struct raft_boot *boot, struct raft_entry **ents,
                        size_t *n_ents)
{
    char path[4096];
    char err[STORE_ERRMSG_MAX] = "";
    struct store_boot sb;
    struct store_options so;
    store_options_default(&so);
    so.queue_max = NODE_PERSIST_MAX;
    int rc;
    if (n->o.data_dir != NULL) {
        if (mkdir(n->data_dir, 0700) != 0 && errno != EEXIST) {
            TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot create the data directory %s: %s",
                   n->data_dir, strerror(errno));
            return TK_EIO;
        }
        snprintf(path, sizeof(path), "%s/log", n->data_dir);
        rc = store_open_fs(path, &so, &n->store, &sb, err, sizeof(err));
    } else {
        n->volume = n->o.volume;
        if (n->volume == NULL) {
            n->volume = store_mem_volume_new();
            n->own_volume = true;
        }
        store_mem_volume_reserve(n->volume, log_reserve(n));
        rc = store_open_mem(n->volume, &so, &n->store, &sb, err, sizeof(err));
    }
    if (rc != 0) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot open the log: %s", err);
        return rc;
    }
    if (!sb.has_bootstrap) {
        rc = store_save_bootstrap(n->store, &n->o.members);
        if (rc == 0)
            rc = store_save_ids(n->store, n->o.cluster_id, n->o.id);
        if (rc != 0)
            return rc;
        sb.bootstrap = n->o.members;
    } else if (sb.node_id != 0 && sb.node_id != n->o.id) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "the data directory belongs to node %llu, not %llu",
               (unsigned long long)sb.node_id, (unsigned long long)n->o.id);
        return TK_EINVAL;
    }

    struct kv_config kc;
    kv_config_default(&kc);
    snprintf(path, sizeof(path), "%s/kv", n->data_dir);
    kc.dir = path;
    kc.no_sync = n->o.kv_no_sync;
    kc.background_tier = true;
    if (n->o.kv_map_bytes != 0)
        kc.map_bytes = n->o.kv_map_bytes;
    rc = kv_sm_open(&kc, &n->sm);
    if (rc != 0) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot open the state machine in %s: %s", path,
               tk_strerror(rc));
        return rc;
    }
    uint64_t applied = kv_sm_applied_index(n->sm);
    if (applied < sb.snapshot.index) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "state machine at %llu is behind the snapshot at %llu",
               (unsigned long long)applied, (unsigned long long)sb.snapshot.index);
        return TK_ECORRUPT;
    }
    /* The core gets the whole stored log (so it can serve lagging followers
     * from it) and starts applying after the state machine's index. */
    if (applied + 1 < sb.first_index || applied > sb.last_index) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "log %llu..%llu does not continue the state machine at %llu",
               (unsigned long long)sb.first_index, (unsigned long long)sb.last_index,
               (unsigned long long)applied);
        return TK_ECORRUPT;
    }
    *ents = NULL;
    *n_ents = 0;
    if (sb.first_index <= sb.last_index) {
        rc = store_read(n->store, sb.first_index, sb.last_index + 1, 0, ents, n_ents);
        if (rc != 0)
            return rc;
    }
    memset(boot, 0, sizeof(*boot));
    boot->hard_state = sb.hard_state;
    boot->snapshot.index = sb.first_index - 1;
    boot->snapshot.term = sb.prev_term;
    boot->snapshot.config = sb.snapshot.index > 0 ? sb.snapshot.config : sb.bootstrap;
    boot->entries = *ents;
    boot->n_entries = *n_ents;
    boot->bootstrap = sb.bootstrap;
    boot->applied = applied;
    n->snap_index = sb.snapshot.index;
    return 0;
}

static int open_transport(struct node *n)
{
    struct transport_callbacks cbs = {
        .recv = on_recv, .peer = NULL, .forward = on_forward, .data = n};
    if (n->o.hub != NULL)
        return transport_inproc_new(n->o.hub, n->loop, n->o.id, 0, &cbs, &n->transport);
    struct transport_tcp_options to;
    transport_tcp_options_default(&to);
    to.id = n->o.id;
    to.cluster_id = n->o.cluster_id;
    to.listen_host = n->o.listen_host;
    to.listen_port = n->o.listen_port;
    to.seed = n->o.seed;
    int rc = transport_tcp_new(n->loop, &to, &cbs, &n->transport);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < n->o.members.n_voters; i++) {
        uint64_t id = n->o.members.voters[i];
        if (id == n->o.id)
            continue;
        if (n->o.peer_hosts[i] == NULL)
            return TK_EINVAL;
        rc = transport_tcp_add_peer(n->transport, id, n->o.peer_hosts[i],
                                    n->o.peer_ports[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Recovers and starts the node on n->loop. On the loop's thread (or before
 * the loop runs). Returns 0 or the error; on error nothing is left open. */
static int node_init(struct node *n)
{
    struct raft_boot boot;
    struct raft_entry *ents = NULL;
    size_t n_ents = 0;
    int rc = open_storage(n, &boot, &ents, &n_ents);
    if (rc == 0) {
        struct raft_options ro;
        raft_options_default(&ro);
        ro.id = n->o.id;
        ro.seed = n->o.seed;
        ro.election_ticks = n->o.election_ticks;
        ro.heartbeat_ticks = n->o.heartbeat_ticks;
        ro.log_reserve = log_reserve(n);
        rc = raft_new(&ro, &boot, &n->raft);
    }
    store_entries_free(ents, n_ents);
    if (rc != 0)
        return rc;
    /* The transport first: its callbacks run only once the loop turns, by
     * which time the handles below exist. */
    rc = open_transport(n);
    if (rc != 0) {
        if (n->transport != NULL) {
            /* A TCP transport that listens but could not add a peer: close
             * it on our own loop (a shared loop only carries inproc ones,
             * whose creation fails whole). */
            TK_ASSERT(!n->shared);
            n->handles_open = 1;
            transport_close(n->transport, on_transport_closed, n);
            uv_run(n->loop, UV_RUN_DEFAULT);
        }
        return rc;
    }
    uv_async_init(n->loop, &n->wake, on_wake);
    uv_timer_init(n->loop, &n->ticker);
    uv_check_init(n->loop, &n->check);
    uv_idle_init(n->loop, &n->idle);
    n->wake.data = n->ticker.data = n->check.data = n->idle.data = n;
    n->handles_open = 5;
    if (raft_first_index(n->raft) > 1) {
        /* The log was compacted: followers that need what is gone get a
         * snapshot of the state machine, so one must exist now. */
        n->snap_index = 0;
        tier_start(n, true, true);
    }
    uv_timer_start(&n->ticker, on_tick, n->o.tick_ms, n->o.tick_ms);
    uv_check_start(&n->check, on_check);
    publish_status(n);
    TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft), "node started (applied %llu)",
           (unsigned long long)kv_sm_applied_index(n->sm));
    if (n->o.on_loop_start != NULL)
        n->o.on_loop_start(n, n->loop, n->o.hook_data);
    return 0;
}

static void node_thread(void *arg)
{
    struct node *n = arg;
    char name[16]; /* what top -H and perf show */
    snprintf(name, sizeof(name), "tk-node-%llu", (unsigned long long)(n->o.id % 100000));
    pthread_setname_np(pthread_self(), name);
    n->start_rc = uv_loop_init(n->loop) == 0 ? node_init(n) : TK_EIO;
    if (n->start_rc != 0) {
        (void)uv_loop_close(n->loop);
        uv_sem_post(&n->started);
        return;
    }
    uv_sem_post(&n->started);
    uv_run(n->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(n->loop);
    if (rc != 0)
        TK_LOG(TK_LOG_WARN, n->o.id, 0, "loop closed with live handles: %s",
               uv_strerror(rc));
}

void node_options_default(struct node_options *o)
{
    memset(o, 0, sizeof(*o));
    o->tick_ms = 10;
    o->election_ticks = 20;
    o->heartbeat_ticks = 2;
    o->queue_max = 65536;
    o->batch_max = 4096;
    o->timeout_ms = 10000;
    o->snapshot_entries = 100000;
    o->trailing_entries = 10000;
    o->snapshot_bytes = (uint64_t)64 << 20;
}

static void node_free(struct node *n)
{
    if (n->raft)
        raft_free(n->raft);
    if (n->store)
        store_close(n->store);
    if (n->sm)
        kv_sm_close(n->sm);
    if (n->own_volume)
        store_mem_volume_free(n->volume);
    if (n->tmp_dir)
        nftw(n->data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    tk_mpsc_destroy(&n->queue);
    tk_free(n->persist_seq);
    tk_free(n->persist_async);
    tk_free(n->persist_ns);
    tk_free(n->batch);
    tk_free(n->data_dir);
    uv_sem_destroy(&n->started);
    uv_sem_destroy(&n->closed);
    pthread_mutex_destroy(&n->drain_mu);
    pthread_cond_destroy(&n->drain_cv);
    pthread_mutex_destroy(&n->status_mu);
    tk_free(n);
}

int node_start(const struct node_options *o, struct node **out)
{
    if (o->id == RAFT_NONE || !raft_config_has(&o->members, o->id) || o->tick_ms == 0 ||
        o->heartbeat_ticks == 0 || o->heartbeat_ticks >= o->election_ticks ||
        o->queue_max == 0 || o->batch_max == 0)
        return TK_EINVAL;
    struct node *n = tk_calloc(1, sizeof(*n));
    n->o = *o;
    if (o->data_dir != NULL) {
        n->data_dir = tk_strdup(o->data_dir);
    } else {
        char tmpl[] = "/tmp/tierkv-node-XXXXXX";
        if (mkdtemp(tmpl) == NULL) {
            tk_free(n);
            return TK_EIO;
        }
        n->data_dir = tk_strdup(tmpl);
        n->tmp_dir = true;
    }
    tk_mpsc_init(&n->queue, o->queue_max);
    n->batch = tk_malloc(o->batch_max * sizeof(*n->batch));
    tk_hist_init(&n->lat.append);
    tk_hist_init(&n->lat.fsync);
    tk_hist_init(&n->lat.apply);
    tk_hist_init(&n->lat.batch_size);
    uv_sem_init(&n->started, 0);
    uv_sem_init(&n->closed, 0);
    pthread_mutex_init(&n->drain_mu, NULL);
    pthread_cond_init(&n->drain_cv, NULL);
    pthread_mutex_init(&n->status_mu, NULL);
    if (o->loop != NULL && o->hub == NULL) {
        node_free(n);
        return TK_EINVAL;
    }
    if (o->loop != NULL) {
        n->shared = true;
        n->loop = o->loop;
        int rc = node_init(n);
        if (rc != 0) {
            node_free(n);
            return rc;
        }
        *out = n;
        return 0;
    }
    n->loop = &n->own_loop;
    if (uv_thread_create(&n->thread, node_thread, n) != 0) {
        node_free(n);
        return TK_EIO;
    }
    uv_sem_wait(&n->started);
    if (n->start_rc != 0) {
        int rc = n->start_rc;
        uv_thread_join(&n->thread);
        node_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

void node_stop(struct node *n)
{
    if (n == NULL)
        return;
    atomic_store(&n->stopping, true);
    uv_async_send(&n->wake);
    if (n->shared)
        uv_sem_wait(&n->closed); /* the caller's loop closes our handles */
    else
        uv_thread_join(&n->thread);
    node_free(n);
}

int node_submit(struct node *n, struct node_req *req)
{
    if (atomic_load(&n->stopping))
        return TK_ESHUTDOWN;
    if (!req->is_read && (req->cmd == NULL || req->write_cb == NULL))
        return TK_EINVAL;
    if (req->is_read && req->read_cb == NULL)
        return TK_EINVAL;
    atomic_fetch_add_explicit(&n->queued, 1, memory_order_relaxed);
    int rc = tk_mpsc_push(&n->queue, req);
    if (rc != 0) {
        atomic_fetch_sub_explicit(&n->queued, 1, memory_order_relaxed);
        return rc;
    }
    uv_async_send(&n->wake);
    return 0;
}

const struct node_latency *node_latency(struct node *n)
{
    if (n->store != NULL)
        store_sync_latency(n->store, &n->lat.fsync);
    return &n->lat;
}

void node_metrics(struct node *n, struct node_metrics *out)
{
    pthread_mutex_lock(&n->status_mu);
    *out = n->metrics_pub;
    pthread_mutex_unlock(&n->status_mu);
    /* Asked of the store here, per call, not on every loop turn. */
    out->store_log_bytes = n->store != NULL ? store_log_bytes(n->store) : 0;
}

void node_status(struct node *n, struct node_status *out)
{
    pthread_mutex_lock(&n->status_mu);
    *out = n->status;
    pthread_mutex_unlock(&n->status_mu);
}

int node_transfer_leadership(struct node *n, uint64_t to)
{
    if (!raft_config_has(&n->o.members, to) || to == n->o.id)
        return TK_EINVAL;
    atomic_store(&n->transfer_to, to);
    uv_async_send(&n->wake);
    return 0;
}

int node_isolate(struct node *n, bool isolated)
{
    if (n->o.hub == NULL)
        return TK_EINVAL;
    for (uint32_t i = 0; i < n->o.members.n_voters; i++) {
        uint64_t peer = n->o.members.voters[i];
        if (peer == n->o.id)
            continue;
        struct transport_link_faults f = {.blocked = isolated};
        int rc = transport_inproc_set_faults(n->o.hub, n->o.id, peer, &f);
        if (rc == 0)
            rc = transport_inproc_set_faults(n->o.hub, peer, n->o.id, &f);
        if (rc != 0)
            return rc;
    }
    return 0;
}
