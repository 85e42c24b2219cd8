/* Installing a snapshot from the leader without holding the loop (issue 22).
 *
 * The stream (15 MB per 100k keys of 100 B) used to go into LMDB on the loop,
 * record by record, then be committed and synced there: seconds at a million
 * keys, with no heartbeat answered meanwhile. Now the loop only begins the
 * install (a fresh LMDB environment next to the current one) and ends it (the
 * in-memory swap: reopening the cold tier on the new environment, fresh hot
 * structures and the sessions, TTL and lease tables swapped in); the records,
 * the LMDB commit, its sync, reading those tables back from it (kv's
 * prepare) and its publication (the directory's link renamed to it) and the
 * log store's reset run on libuv's thread pool, and what the swap replaced
 * (the old environment, still mapped, the old hot structures and tables) is
 * freed there.
 *
 * Raft safety while it runs: the core already counts the snapshot as its log
 * (handle_snapshot: commit, applying and applied are its index), but
 *  - the ready that carried it, and every ready after it, is reported durable
 *    (raft_persisted) only once the install is done: node.c pushes their seqs
 *    as held (node__install_hold). So the ack to the leader, any vote and any
 *    append ack wait for it, and nothing after the snapshot is handed out to
 *    apply (the core applies only up to its durable index);
 *  - the KV keeps its old, whole state at its old applied index until the
 *    swap: reads wait for an applied index at or past their read index
 *    (serve_reads), which only the swap provides; stale reads see the old
 *    state, which is a state the log went through;
 *  - log entries after the snapshot cannot be appended before the store is
 *    reset to it. A leader sends them before the ack arrives (its snapshot
 *    wait times out, it probes just past the snapshot), so a ready with
 *    entries is kept beside the install (node__install_defer, bounded) and
 *    appended once the store is reset; past the bounds the loop waits for the
 *    install (node__install_wait). A newer snapshot during an install is
 *    dropped before the core sees it (node.c on_recv); the leader sends it
 *    again;
 *  - no tier-down job, snapshot or compaction starts meanwhile
 *    (node__tier_turn returns early), since the swap switches the cold tier;
 *    one in flight when the snapshot arrives is not waited for on the loop:
 *    the install is parked (busy, not begun) and begins on the first turn
 *    after that work ends (node__install_unpark), its results dropped.
 * A crash before the job publishes the new environment leaves the old state
 * and log, as before the snapshot arrived; the publication is atomic, then
 * the store is reset, as the synchronous install did. The job saves the
 * snapshot's descriptor as pending before it publishes: a crash, or a store
 * failure, between the publication and the reset or the descriptor's save
 * leaves a state machine ahead of its log, and recovery (node_recover.c,
 * finish_install) finishes the install from that descriptor.
 *
 * Bad input first: a snapshot message's stream is checked whole
 * (kv_snap_check: every record decoded, lengths bounded, the count and CRC32C
 * of the trailer, the header's index and term against the message's) before
 * the core sees the message (node__install_check), because the core replaces
 * its log with a snapshot the moment it steps one, and from there an install
 * that fails can only fail the node. The check runs on the loop, in order
 * with the messages after it (on the pool it waited behind tier work, and
 * entries sent after the snapshot reached the core before it): one pass
 * over bytes the transport has just reassembled on the loop, with no
 * allocation and no system call. A refused snapshot is counted
 * (snapshots_refused), logged at most once a second, and the core hears
 * nothing: the node stays a follower with its state, and the leader sends
 * the snapshot again (a good one then installs) or entries.
 *
 * Loop thread, except install_work (a pool thread), which touches only
 * n->install's kv_install and blob (which read the cold tier's directory and
 * generation) and the idle store, and trash_run, which frees what the swap
 * handed it. Called by node.c; calls node_persist.c (the log's reset goes
 * through node__store_append), node_tier.c (waits for its jobs, frees on the
 * pool) and node_status.c on failure. */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/log.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "store/store.h"

/* Any thread: the whole stream into the new environment, its commit, sync
 * and publication (from there a restart finds the snapshot's state), then
 * the log store's reset to the snapshot (removing its segments took 123 ms
 * of the loop at 10M keys). On an error the install is aborted here, on the
 * thread whose LMDB write transaction it was. The store is idle meanwhile:
 * appends wait for the install, or are kept beside it. */
static void install_run(struct node *n)
{
    struct node_install *s = &n->install;
    int rc = 0;
    if (s->data != NULL && s->data->len > 0)
        rc = kv_install_write(s->in, s->data->data, s->data->len);
    /* A store that failed meanwhile could not be reset: keep the old state
     * (publishing it would leave a state machine ahead of its log). The
     * descriptor goes first, as pending: recovery finishes the install from
     * it if the process stops between the publication and the reset. */
    if (rc == 0)
        rc = store_failed(n->store);
    if (rc == 0)
        rc = store_save_pending_snapshot(n->store, &s->meta);
    if (rc == 0)
        rc = kv_install_prepare(s->in);
    if (rc != 0) {
        kv_install_abort(s->in);
        s->in = NULL;
    }
    if (rc == 0)
        rc = store_reset(n->store, s->meta.index, s->meta.term);
    if (rc == 0)
        rc = store_save_snapshot(n->store, &s->meta);
    s->rc = rc;
    atomic_store_explicit(&s->ran, true, memory_order_release);
}

struct node_install_job {
    uv_work_t work;
    struct node *n;
};

/* Readies of log entries kept during an install (node__install_defer). */
struct node_install_batch {
    struct raft_entry *ents; /* copies, with references on the payloads */
    size_t n;
    uint64_t seq;
};

#define NODE_DEFER_BATCHES 256
#define NODE_DEFER_BYTES (64u << 20)

void node__install_defer_clear(struct node *n)
{
    struct node_install *s = &n->install;
    for (size_t i = 0; i < s->n_defer; i++) {
        for (size_t k = 0; k < s->defer[i].n; k++)
            tk_blob_unref(s->defer[i].ents[k].data);
        tk_free(s->defer[i].ents);
    }
    tk_free(s->defer);
    s->defer = NULL;
    s->n_defer = 0;
    s->defer_bytes = 0;
}

bool node__install_defer(struct node *n, const struct raft_entry *entries, size_t cnt,
                         uint64_t seq)
{
    struct node_install *s = &n->install;
    if (!s->busy || s->n_defer >= NODE_DEFER_BATCHES)
        return false;
    uint64_t bytes = 0;
    for (size_t k = 0; k < cnt; k++)
        bytes += sizeof(entries[k]) + (entries[k].data ? entries[k].data->len : 0);
    if (s->defer_bytes + bytes > NODE_DEFER_BYTES)
        return false;
    if (s->n_defer == 0)
        s->defer = tk_malloc(NODE_DEFER_BATCHES * sizeof(*s->defer));
    struct node_install_batch *b = &s->defer[s->n_defer++];
    b->ents = tk_malloc(cnt * sizeof(*b->ents));
    memcpy(b->ents, entries, cnt * sizeof(*b->ents));
    for (size_t k = 0; k < cnt; k++)
        if (b->ents[k].data != NULL)
            tk_blob_ref(b->ents[k].data);
    b->n = cnt;
    b->seq = seq;
    s->defer_bytes += bytes;
    n->m.metrics.installs_deferred++;
    return true;
}

/* After the swap and the store's reset: the kept entries go to storage, in
 * order. The readies before the first of them waited only for the install
 * and are durable now; the held readies after it (no entries) are durable
 * once the last batch is, so that batch carries the newest held seq. */
static int defer_flush(struct node *n)
{
    struct node_install *s = &n->install;
    int rc = atomic_load(&n->persist.store_status);
    if (rc != 0) { /* an append failed: nothing more counts as durable */
        node__install_defer_clear(n);
        return rc;
    }
    uint64_t durable = s->hold_seq;
    if (s->n_defer > 0 && s->defer[0].seq - 1 < durable)
        durable = s->defer[0].seq - 1;
    /* Before any append is submitted: the storage thread raises it from
     * there, and nothing may lower it after. */
    node__persist_durable_raise(n, durable);
    for (size_t i = 0; i < s->n_defer && rc == 0; i++) {
        struct node_install_batch *b = &s->defer[i];
        uint64_t seq = b->seq;
        if (i + 1 == s->n_defer && s->hold_seq > seq)
            seq = s->hold_seq;
        rc = node__store_append(n, b->ents, b->n, seq, false);
    }
    node__install_defer_clear(n); /* the store took its own references */
    return rc;
}

static void install_work(uv_work_t *w)
{
    struct node_install_job *j = w->data;
    install_run(j->n);
}

static void trash_free(void *t)
{
    kv_trash_free(t);
}

/* What an install replaced, freed on the thread pool: unlinking the old cold
 * environment's synced data file took 140 ms per 300 MB on the loop, and
 * unmapping it and freeing the old hot structures take long too. */
static void trash_remove(struct node *n)
{
    struct kv_trash *t = kv_sm_install_trash(n->sm);
    if (t != NULL)
        node__free_on_pool(n, trash_free, t, 0); /* at the pool's own priority */
}

/* Loop thread, once the job ran (the new state published, the log store
 * reset): swap the new state in, and let the readies held behind it count
 * as durable. */
static int install_finish(struct node *n)
{
    struct node_install *s = &n->install;
    uint64_t t0 = node__mono_ns();
    tk_blob_unref(s->data);
    s->data = NULL;
    s->busy = false;
    int rc = s->rc;
    if (rc == 0)
        rc = kv_install_commit(s->in);
    if (rc != 0) /* after a failed commit, only abort (kv.h); the job's may be gone */
        kv_install_abort(s->in);
    s->in = NULL;
    if (rc == 0)
        trash_remove(n);
    uint64_t t1 = node__mono_ns();
    if (rc != 0) {
        node__install_defer_clear(n);
        return rc;
    }
    node__tier_snap_at(n, s->meta.index);
    n->m.metrics.installs++;
    /* Writes waiting at or below the snapshot: their outcome is unknown. */
    node__req_end_applied_upto(n, s->meta.index, TK_ETIMEDOUT);
    /* Nothing else was in flight to storage (appends wait for the install,
     * or are kept beside it), so no storage callback races this. */
    rc = defer_flush(n);
    if (rc != 0)
        return rc;
    uint64_t now = node__mono_ns();
    s->loop_ns += now - t0;
    NODE_OPLOG(
        n, SNAPSHOT_INSTALLED, TK_LOG_INFO, raft_term(n->raft),
        "index=%llu total_ms=%llu parked_ms=%llu loop_us=%llu swap_us=%llu rest_us=%llu",
        (unsigned long long)s->meta.index, (unsigned long long)((now - s->t0) / 1000000),
        (unsigned long long)(s->parked_ns / 1000000),
        (unsigned long long)(s->loop_ns / 1000), (unsigned long long)((t1 - t0) / 1000),
        (unsigned long long)((now - t1) / 1000));
    node__kick(n); /* the held readies are durable now */
    return 0;
}

static void install_done(struct node *n)
{
    int rc = install_finish(n);
    if (rc != 0)
        node__fail(n, rc, "install snapshot");
}

static void install_after(uv_work_t *w, int status)
{
    struct node_install_job *j = w->data;
    struct node *n = j->n;
    (void)status;
    /* A job the loop waited out (node__install_wait) is no longer current:
     * its install is finished, and another may be running. */
    bool current = n->install.job == j;
    if (current)
        n->install.job = NULL;
    tk_free(j);
    if (current && n->install.busy) {
        uint64_t t0 = node__mono_ns();
        if (n->loop.closing || n->persist.failed) {
            /* Stopping: as after a crash, the disk holds the old state and
             * log, or, once the job published the new state, the snapshot
             * (and, once it reset the log store, its log). */
            kv_install_abort(n->install.in);
            n->install.in = NULL;
            tk_blob_unref(n->install.data);
            n->install.data = NULL;
            n->install.busy = false;
            node__install_defer_clear(n);
        } else {
            install_done(n);
        }
        node__turn_add(n, NODE_PH_STORE, node__mono_ns() - t0);
    }
    node__kick(n);
    node__handle_gone(n);
}

/* ---- the check before the core sees a snapshot ---- */

#define REFUSED_LOG_NS (1000 * 1000000ull) /* one refusal line a second at most */

static void refuse(struct node *n, const struct raft_message *m, int rc, const char *why)
{
    struct node_install *s = &n->install;
    n->m.metrics.snapshots_refused++;
    uint64_t now = node__mono_ns();
    if (s->refused_logged_ns != 0 && now - s->refused_logged_ns < REFUSED_LOG_NS) {
        s->refused_quiet++;
        return;
    }
    TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
           "refused a snapshot from %llu at index %llu (%zu bytes): %s: %s (%llu more "
           "refused since the last report)",
           (unsigned long long)m->from, (unsigned long long)m->u.snapshot.meta.index,
           m->u.snapshot.data != NULL ? m->u.snapshot.data->len : 0, tk_strerror(rc), why,
           (unsigned long long)s->refused_quiet);
    s->refused_logged_ns = now;
    s->refused_quiet = 0;
}

bool node__install_check(struct node *n, const struct raft_message *m)
{
    TK_ASSERT(m->type == RAFT_MSG_SNAPSHOT);
    const struct raft_msg_snapshot *snap = &m->u.snapshot;
    const struct tk_blob *b = snap->data;
    uint64_t index = 0, term = 0;
    char why[128];
    int rc = kv_snap_check(n->sm, b != NULL ? b->data : NULL, b != NULL ? b->len : 0,
                           &index, &term, why, sizeof(why));
    if (rc == 0 && (index != snap->meta.index || term != snap->meta.term)) {
        snprintf(why, sizeof(why),
                 "the stream is at index %llu term %llu, the message says %llu term %llu",
                 (unsigned long long)index, (unsigned long long)term,
                 (unsigned long long)snap->meta.index,
                 (unsigned long long)snap->meta.term);
        rc = TK_ECORRUPT;
    }
    if (rc == 0)
        return false;
    refuse(n, m, rc, why);
    return true;
}

int node__install_park(struct node *n, const struct raft_snapshot_meta *meta,
                       struct tk_blob *data)
{
    struct node_install *s = &n->install;
    TK_ASSERT(!s->busy);
    s->meta = *meta;
    s->data = data != NULL ? tk_blob_ref(data) : NULL;
    s->hold_seq = 0;
    s->rc = 0;
    s->t0 = node__mono_ns();
    s->loop_ns = 0;
    s->parked_ns = 0;
    s->busy = true;
    s->parked = true;
    atomic_store(&s->ran, false);
    return 0;
}

/* Begins the parked install: a fresh LMDB environment, and the job. */
static int install_begin(struct node *n)
{
    struct node_install *s = &n->install;
    uint64_t t0 = node__mono_ns();
    s->parked = false;
    s->parked_ns = t0 - s->t0;
    int rc = kv_sm_install_begin(n->sm, &s->in);
    if (rc != 0) {
        tk_blob_unref(s->data);
        s->data = NULL;
        s->busy = false;
        node__install_defer_clear(n);
        return rc;
    }
    struct node_install_job *j = tk_malloc(sizeof(*j));
    j->n = n;
    j->work.data = j;
    if (uv_queue_work(n->loop.uv, &j->work, install_work, install_after) == 0) {
        s->job = j;
        node__handle_opened(n);
        s->loop_ns += node__mono_ns() - t0;
        return 0;
    }
    tk_free(j);
    install_run(n);
    s->loop_ns += node__mono_ns() - t0;
    return install_finish(n);
}

int node__install_start(struct node *n, const struct raft_snapshot_meta *meta,
                        struct tk_blob *data)
{
    node__install_park(n, meta, data);
    return install_begin(n);
}

void node__install_unpark(struct node *n)
{
    if (!n->install.parked || !node__tier_idle(n))
        return;
    int rc = install_begin(n);
    if (rc != 0)
        node__fail(n, rc, "install snapshot");
}

bool node__install_hold(struct node *n, uint64_t seq)
{
    if (!n->install.busy)
        return false;
    if (seq > n->install.hold_seq)
        n->install.hold_seq = seq;
    return true;
}

int node__install_wait(struct node *n)
{
    struct node_install *s = &n->install;
    if (!s->busy)
        return 0;
    uint64_t t0 = node__mono_ns();
    if (s->parked) { /* the tier's work first, here */
        node__tier_wait(n, true);
        int rc = install_begin(n);
        if (rc != 0 || !s->busy)
            return rc;
    }
    /* Not started yet (the pool may be busy): take it back and run it here
     * rather than wait for a thread; its after-work callback then finds
     * nothing to do. */
    if (s->job != NULL && uv_cancel((uv_req_t *)&s->job->work) == 0)
        install_run(n);
    while (!atomic_load_explicit(&s->ran, memory_order_acquire)) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    /* Its after-work callback is still to come (libuv owns the request until
     * then) and will find it no longer current: the next install, if a
     * second snapshot is what arrived, gets a request of its own. */
    s->job = NULL;
    TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
           "log entries (or a snapshot) arrived during a snapshot install: the loop "
           "waited %llu ms for it",
           (unsigned long long)((node__mono_ns() - t0) / 1000000));
    s->loop_ns += node__mono_ns() - t0;
    return install_finish(n);
}
