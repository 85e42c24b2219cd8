/* The node as other threads see it: the published status and metrics, and
 * failing the node when its storage or its state machine fails.
 *
 * Loop thread only; other threads read the published copies under
 * n->m.mu (node_status, node_metrics in node.c). A failed node stays failed:
 * node__fail runs once and every waiting request ends with TK_EIO.
 *
 * Called by node.c (each loop turn and on failures), node_tier.c (a failed
 * tier-down, snapshot save or compaction), node_install.c (a failed install)
 * and node_member.c; calls node_record.c (is this node removed?). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/log.h"
#include "kv.pb-c.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "store/store.h"
#include "transport/transport.h"

/* The LMDB residency (mincore over the cold tier's file: 60-80 ms of CPU per
 * GB, which at 3M keys held every node's loop that long every 10 s) is
 * measured on the thread pool through a duplicate of the file's descriptor,
 * so an install swapping the file meanwhile only makes it a little stale. */
struct resident_job {
    uv_work_t work;
    struct node *n;
    int fd;
    uint64_t len, bytes;
};

static void resident_work(uv_work_t *w)
{
    struct resident_job *j = w->data;
    j->bytes = kv_file_resident(j->fd, j->len);
}

static void resident_after(uv_work_t *w, int status)
{
    struct resident_job *j = w->data;
    struct node *n = j->n;
    if (status == 0)
        n->m.metrics.mem_lmdb_resident = j->bytes;
    close(j->fd);
    n->m.resident_busy = false;
    tk_free(j);
    node__handle_gone(n);
}

static void resident_start(struct node *n)
{
    int fd;
    uint64_t len;
    if (n->loop.closing || kv_sm_cold_file(n->sm, &fd, &len) != 0)
        return;
    struct resident_job *j = tk_malloc(sizeof(*j));
    j->n = n;
    j->fd = fd;
    j->len = len;
    j->work.data = j;
    if (uv_queue_work(n->loop.uv, &j->work, resident_work, resident_after) != 0) {
        close(fd);
        tk_free(j);
        return;
    }
    n->m.resident_busy = true;
    node__handle_opened(n);
}

/* Does the member record `v` say removed? One that does not decode is not
 * read as removed here; node_member.c refuses it (its fence, an add) and
 * says why. */
static bool rec_removed(const uint8_t *v, size_t len)
{
    struct node_member_rec r;
    return node__member_rec_decode(v, len, &r) == 0 && r.removed;
}

/* The newest entries a removed node's log may end with unapplied: the
 * leader writes the record, then appends the configuration without the node
 * and stops sending to it, so the node may hold the record without ever
 * learning that it committed. */
#define REMOVED_TAIL_ENTRIES 4

/* node_status.removed (node.h). The record is looked for (applied, else in
 * the last REMOVED_TAIL_ENTRIES unapplied entries) only while the node knows
 * no leader or is out of its configuration, so a serving member pays
 * nothing per turn. */
static bool removed(struct node *n, uint64_t leader)
{
    bool member = raft_config_is_member(raft_config(n->raft), n->o.id);
    if (!member && !n->o.join)
        return true;
    if (member && leader != 0)
        return false;
    char key[64];
    int kl = snprintf(key, sizeof(key), "%s%" PRIu64, NODE_MEMBER_KEY_PREFIX, n->o.id);
    if (kl <= 0 || (size_t)kl >= sizeof(key))
        return false;
    uint64_t lo = kv_sm_applied_index(n->sm) + 1, hi = raft_last_index(n->raft);
    if (lo < raft_first_index(n->raft))
        lo = raft_first_index(n->raft);
    if (hi >= REMOVED_TAIL_ENTRIES && lo < hi - REMOVED_TAIL_ENTRIES + 1)
        lo = hi - REMOVED_TAIL_ENTRIES + 1;
    for (uint64_t i = hi; i >= lo && i > 0; i--) {
        const struct raft_entry *e = raft_entry_at(n->raft, i);
        if (e == NULL || e->type != RAFT_ENTRY_NORMAL || e->data == NULL ||
            memmem(e->data->data, e->data->len, key, (size_t)kl) == NULL)
            continue;
        Kvpb__Command *c = kvpb__command__unpack(NULL, e->data->len, e->data->data);
        if (c == NULL)
            continue;
        bool hit = c->cmd_case == KVPB__COMMAND__CMD_PUT && c->put != NULL &&
                   c->put->key.len == (size_t)kl &&
                   memcmp(c->put->key.data, key, (size_t)kl) == 0;
        bool rm = hit && rec_removed(c->put->value.data, c->put->value.len);
        kvpb__command__free_unpacked(c, NULL);
        if (hit)
            return rm;
    }
    struct kv_item it;
    if (kv_sm_get(n->sm, key, (size_t)kl, &it) != 0)
        return false;
    return rec_removed(it.value, it.value_len);
}

void node__publish_status(struct node *n)
{
    struct node_metrics *mt = &n->m.metrics;
    /* A refused node hears its leader no more: it looks for its record. */
    bool rm =
        !n->persist.failed && removed(n, n->mem.rejected ? 0 : raft_leader(n->raft));
    pthread_mutex_lock(&n->m.mu);
    n->m.status.id = n->o.id;
    n->m.status.term = raft_term(n->raft);
    n->m.status.leader = raft_leader(n->raft);
    n->m.status.role = raft_role(n->raft);
    n->m.status.commit = raft_commit(n->raft);
    n->m.status.applied = kv_sm_applied_index(n->sm);
    node__client_applied_index(n, n->m.status.applied);
    n->m.status.last_index = raft_last_index(n->raft);
    if (raft_term_at(n->raft, n->m.status.last_index, &n->m.status.last_term) != 0)
        n->m.status.last_term = 0;
    n->m.status.snapshot_index = n->tier.snap_index;
    n->m.status.failed = n->persist.failed;
    /* A removed member that redials is refused too (node_member.c): its
     * removed record is the more precise reason. */
    n->m.status.rejected = n->mem.rejected && !rm;
    n->m.status.removed = rm;
    struct store_stats ss;
    store_stats(n->store, &ss);
    mt->store_syncs = ss.syncs;
    mt->store_recycled = ss.recycled;
    mt->gate_held = n->gate.held.n;
    mt->gate_held_total = n->gate.held_total;
    mt->gate_refused = n->gate.refused;
    mt->gate_rests = n->gate.rests;
    mt->store_appends = ss.appends;
    mt->store_wakeups = ss.wakeups;
    mt->store_bytes = ss.bytes;
    mt->read_index_rounds = raft_read_rounds(n->raft);
    mt->acks_merged = raft_acks_merged(n->raft);
    mt->terms_refused = raft_terms_refused(n->raft);
    struct kv_sm_stats ks;
    kv_sm_stats(n->sm, &ks);
    mt->kv_ring_bytes = ks.ring_bytes;
    mt->kv_hot_keys = ks.hot_keys;
    mt->kv_cold_keys = ks.cold_keys;
    mt->kv_cold_bytes = ks.cold_bytes;
    mt->kv_tier_downs = ks.tier_downs;
    mt->kv_paced_syncs = ks.paced_syncs;
    mt->kv_paced_slept_ns = ks.paced_slept_ns;
    mt->kv_bad_records = ks.bad_records;
    mt->mem_index_bytes = ks.index_bytes;
    mt->mem_view_bytes = ks.view_bytes;
    mt->mem_sessions_bytes = ks.sessions_bytes;
    mt->mem_lmdb_mapped = ks.cold_map_bytes;
    mt->mem_snapshot_spare = tk_blob_spare_bytes();
    mt->mem_blob_cache = tk_blob_cached_bytes();
    uint64_t now = node__mono_ns();
    if (now - n->m.resident_ns > 10000000000ull && !n->m.resident_busy) {
        n->m.resident_ns = now;
        resident_start(n);
    }
    if (n->transport != NULL) {
        struct transport_stats ts;
        transport_stats(n->transport, &ts);
        mt->net_bytes_sent = ts.bytes_sent;
        mt->net_bytes_received = ts.bytes_received;
        mt->net_reconnects = ts.conns_dialed;
        mt->net_auth_failed = ts.auth_failed;
        mt->net_spoofed = ts.msgs_spoofed;
        mt->net_conns_bad = ts.conns_bad;
        mt->net_pending_evicted = ts.pending_evicted;
        mt->net_conns_idle = ts.conns_idle;
        mt->net_snapshots_dropped = ts.snapshots_dropped;
        mt->net_reads_paused = ts.reads_paused;
        mt->net_snapshot_faulted_ahead = ts.snapshot_faulted_ahead;
        mt->net_snapshot_fault_waits = ts.snapshot_fault_waits;
    }
    n->m.pub = *mt;
    pthread_mutex_unlock(&n->m.mu);
}

void node__fail_list(struct node *n, struct req_list *l, int status)
{
    struct node_req *r;
    while ((r = node__list_pop(l)) != NULL)
        node__finish(n, r, status);
}

void node__fail(struct node *n, int rc, const char *what)
{
    if (n->persist.failed)
        return;
    node__persist_fail(n);
    node__publish_status(n);
    TK_LOG(TK_LOG_ERROR, n->o.id, raft_term(n->raft),
           "storage failed, node stops serving: %s: %s", what, tk_strerror(rc));
    node__req_fail_all(n, TK_EIO);
    node__fail_list(n, &n->fwd.wait, TK_EIO);
}
