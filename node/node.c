/* The consensus loop of one node (see node.h for the threads and the path of
 * a write): the loop's callbacks, drain -> propose -> ready -> persist ->
 * apply -> complete, reads, and the public API of node.h. It drives the other
 * files of node/ (node_internal.h lists them): recovery at start, the tier
 * jobs each turn, forwarding on a follower's writes and on FORWARD frames.
 *
 * Invariants:
 *  - Only the loop thread touches `raft`, `sm`, the pending lists and the
 *    transport. Other threads reach the loop through `loop.queue` (bounded
 *    MPSC) and `loop.wake` (node_wake.h), and the storage thread through
 *    `persist.durable_seq`.
 *  - raft_persisted(seq) is called only when every ready up to seq is durable:
 *    `persist` lists the seqs handed to storage in order; async appends finish
 *    in submission order, synchronous metadata saves finish at once, and the
 *    list is popped only from its head.
 *  - Every request completes exactly once: on success, on an explicit error,
 *    on its deadline, or with TK_ESHUTDOWN at stop.
 *  - Each loop turn processes at most one burst from the queue (batch_max
 *    entries, of those queued when the burst began: none a callback submits
 *    during it) and then one ready, so no turn does unbounded work. */
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
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/dirlock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/nice.h"
#include "base/queue.h"
#include "kv/kv.h"
#include "node/node.h"
#include "node/node_internal.h"
#include "store/store.h"
#include "transport/transport.h"

/* ---- small helpers ----------------------------------------------------- */

/* ---- storage: node_persist.c ---------------------------------------- */

/* ---- apply ------------------------------------------------------------- */

static void serve_reads(struct node *n)
{
    uint64_t applied = kv_sm_applied_index(n->sm);
    struct req_list keep = {0};
    struct node_req *r;
    while ((r = node__list_pop(&n->req.read_ready)) != NULL) {
        if (r->index <= applied)
            node__finish_read(n, r, 0);
        else
            node__list_push(&keep, r);
    }
    n->req.read_ready = keep;
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
    while ((r = n->req.committed_wait.head) != NULL &&
           (r->index <= commit || (known && r->term < commit_term))) {
        node__list_pop(&n->req.committed_wait);
        if (r->index > commit) {
            node__finish_write(n, r, TK_ELOST, NULL);
            continue;
        }
        uint64_t t = 0;
        int rc = raft_term_at(n->raft, r->index, &t);
        memset(&n->res, 0, sizeof(n->res));
        n->res.revision = r->index;
        if (rc == 0 && t == r->term)
            node__finish_write(n, r, 0, &n->res);
        else if (rc == 0)
            node__finish_write(n, r, TK_ELOST, NULL);
        else
            node__finish_write(n, r, TK_ETIMEDOUT, NULL); /* compacted: unknown */
    }
}

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
            node__tier_snap_count(n, len);
            n->loop.turn_apply_bytes += len;
            n->loop.turn_apply_entries++;
            rc = kv_sm_apply(n->sm, x->index, x->term, x->time_ms, p, len, &n->res);
        } else {
            memset(&n->res, 0, sizeof(n->res));
            rc = kv_sm_skip(n->sm, x->index, x->term, x->time_ms);
        }
        if (rc != 0) {
            node__fail(n, rc, "apply");
            return;
        }
        n->m.metrics.applied_entries++;
        node__client_applied_index(n, x->index);
        node__tier_count(n, x->index, x->data != NULL ? x->data->len : 0);
        /* Writes proposed here complete in index order. */
        /* ... and those above it from an older term can never commit (see
         * complete_committed). */
        struct node_req *r;
        while ((r = n->req.applied_wait.head) != NULL &&
               (r->index <= x->index || r->term < x->term)) {
            node__list_pop(&n->req.applied_wait);
            if (r->index == x->index && r->term == x->term)
                node__finish_write(n, r, 0, &n->res);
            else if (r->index >= x->index)
                node__finish_write(n, r, TK_ELOST, NULL);
            else
                node__finish_write(n, r, TK_ETIMEDOUT, NULL); /* skipped by a snapshot */
        }
    }
}

/* getrusage is a system call (3-4 us on a paravirtual guest under load), so
 * the usage is sampled at a turn's end at most this often, and after every
 * slow turn (half_timeout_ns): a slow turn's figures cover the turn and at
 * most this much before it. */
#define USAGE_EVERY_NS (10 * 1000000ull)

/* Half the election timeout: a loop turn this long is slow (warned about;
 * counted as held with NODE_HELD_CPU_NS of CPU): a follower's loop that long
 * has used half its patience, a leader's delayed its heartbeats that long. */
static uint64_t half_timeout_ns(const struct node *n)
{
    return (uint64_t)n->o.tick_ms * n->o.election_ticks * 1000000ull / 2;
}

/* A snapshot from the leader replaces the state machine and the log: begun
 * here, installed on the thread pool, swapped in on a later turn
 * (node_install.c). */
static int install_snapshot(struct node *n, const struct raft_snapshot_meta *meta,
                            struct tk_blob *data)
{
    int rc = node__install_wait(n); /* one at a time */
    if (rc != 0)
        return rc;
    node__persist_drain(n);
    /* A failed append must fail the node before the install makes the readies
     * after it count as durable (install_finish raises durable_seq). */
    rc = atomic_load(&n->persist.store_status);
    if (rc != 0)
        return rc;
    node__tier_compact_cancel(n);
    if (!node__tier_idle(n)) {
        node__tier_stop(n); /* a snapshot read ends at its next chunk */
        n->m.metrics.installs_parked++;
        return node__install_park(n, meta, data);
    }
    return node__install_start(n, meta, data);
}

/* ---- the ready loop ---------------------------------------------------- */

static void handle_read_states(struct node *n, const struct raft_read_state *rs,
                               size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) {
        struct req_list keep = {0};
        struct node_req *r;
        while ((r = node__list_pop(&n->req.read_wait)) != NULL) {
            if (r->ctx != rs[i].ctx) {
                node__list_push(&keep, r);
                continue;
            }
            if (rs[i].failed) {
                node__finish_read(n, r, TK_ENOLEADER);
            } else {
                r->index = rs[i].index;
                node__list_push(&n->req.read_ready, r);
            }
        }
        n->req.read_wait = keep;
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
    if (leader == n->req.read_leader)
        return;
    n->req.read_leader = leader;
    struct req_list keep = {0};
    struct node_req *r;
    while ((r = node__list_pop(&n->req.read_wait)) != NULL) {
        if (r->asked != 0 && r->asked != leader)
            node__finish_read(n, r, TK_ENOLEADER);
        else
            node__list_push(&keep, r);
    }
    n->req.read_wait = keep;
}

/* Where a loop turn's time went (enum node_turn_phase), for the slow-turn
 * warning and node_metrics.loop_turn_max_ns. */
#define PH_READY NODE_PH_READY
#define PH_STORE NODE_PH_STORE
#define PH_SEND NODE_PH_SEND
#define PH_APPLY NODE_PH_APPLY
#define PH_ADVANCE NODE_PH_ADVANCE
#define PH_SNAP NODE_PH_SNAPSHOT
#define PH_N NODE_PH_N
_Static_assert(PH_N == sizeof(((struct node *)0)->loop.turn_ns) / sizeof(uint64_t),
               "struct node's turn_ns has a slot per phase");
_Static_assert(PH_N == sizeof(((struct node_metrics *)0)->loop_turn_max_ns) /
                           sizeof(uint64_t),
               "node_metrics has a slot per phase");
static const char *const phase_name[PH_N] = {"ready",   "store",    "send", "apply",
                                             "advance", "snapshot", "tier", "compact",
                                             "recv",    "other"};

const char *node_turn_phase_name(int phase)
{
    return phase >= 0 && phase < PH_N ? phase_name[phase] : NULL;
}

static void drain_queue(struct node *n);

static void phase_end(struct node *n, enum node_turn_phase ph, uint64_t *t)
{
    uint64_t now = node__mono_ns();
    n->loop.turn_ns[ph] += now - *t;
    *t = now;
}

/* ---- the operator's log lines (node_oplog.h) ---------------------------- */

static const char *id_text(uint64_t id, char *buf, size_t cap)
{
    if (id == RAFT_NONE)
        return "none";
    snprintf(buf, cap, "%llu", (unsigned long long)id);
    return buf;
}

/* Members that joined, were promoted or left between the configuration seen
 * last (was) and the one in force (c), at config index ci. */
static void oplog_config(struct node *n, const struct raft_config *was,
                         const struct raft_config *c, uint64_t ci)
{
    uint64_t term = raft_term(n->raft);
    for (uint32_t i = 0; i < c->n_voters; i++) {
        uint64_t id = c->voters[i];
        if (raft_config_has_learner(was, id))
            NODE_OPLOG(n, MEMBER_PROMOTED, TK_LOG_INFO, term, "id=%llu index=%llu",
                       (unsigned long long)id, (unsigned long long)ci);
        else if (!raft_config_has(was, id))
            NODE_OPLOG(n, MEMBER_ADDED, TK_LOG_INFO, term, "id=%llu as=voter index=%llu",
                       (unsigned long long)id, (unsigned long long)ci);
    }
    for (uint32_t i = 0; i < c->n_learners; i++) {
        uint64_t id = c->learners[i];
        if (!raft_config_is_member(was, id))
            NODE_OPLOG(n, MEMBER_ADDED, TK_LOG_INFO, term,
                       "id=%llu as=learner index=%llu", (unsigned long long)id,
                       (unsigned long long)ci);
    }
    const uint64_t *lists[2] = {was->voters, was->learners};
    uint32_t counts[2] = {was->n_voters, was->n_learners};
    for (int l = 0; l < 2; l++)
        for (uint32_t i = 0; i < counts[l]; i++)
            if (!raft_config_is_member(c, lists[l][i]))
                NODE_OPLOG(n, MEMBER_REMOVED, TK_LOG_INFO, term, "id=%llu index=%llu",
                           (unsigned long long)lists[l][i], (unsigned long long)ci);
}

/* Compares what the core says (role, term, leader, configuration) with the
 * last look and writes a line per change an operator acts on: elections,
 * the leader, members. raft/ logs nothing; this runs after each ready step
 * and at each turn's end of the ready loop, three loads when nothing
 * changed. The first look only records. */
static void oplog_observe(struct node *n)
{
    struct node_oplog *l = &n->oplog;
    int role = raft_role(n->raft);
    uint64_t term = raft_term(n->raft), leader = raft_leader(n->raft);
    uint64_t ci = raft_config_index(n->raft);
    if (l->seen && role == l->role && term == l->term && ci == l->config_index &&
        (leader == RAFT_NONE || leader == l->leader))
        return;
    if (!l->seen) {
        l->seen = true;
        l->role = role;
        l->term = term;
        l->leader = leader;
        l->config_index = ci;
        l->config = *raft_config(n->raft);
        return;
    }
    char a[24], b[24];
    if (role == RAFT_CANDIDATE && (l->role != RAFT_CANDIDATE || term != l->term))
        NODE_OPLOG(n, ELECTION_STARTED, TK_LOG_INFO, term, "last_leader=%s",
                   id_text(l->leader, a, sizeof(a)));
    if (role == RAFT_LEADER && l->role != RAFT_LEADER)
        NODE_OPLOG(n, ELECTION_WON, TK_LOG_INFO, term, "voters=%u",
                   (unsigned)raft_config(n->raft)->n_voters);
    if (l->role == RAFT_CANDIDATE && role == RAFT_FOLLOWER)
        NODE_OPLOG(n, ELECTION_LOST, TK_LOG_INFO, term, "leader=%s",
                   id_text(leader, a, sizeof(a)));
    /* A known leader only: "none" between two leaders is the elections'. */
    if (leader != RAFT_NONE && leader != l->leader) {
        NODE_OPLOG(n, LEADER_CHANGED, TK_LOG_INFO, term, "from=%s to=%s",
                   id_text(l->leader, a, sizeof(a)), id_text(leader, b, sizeof(b)));
        l->leader = leader;
    }
    if (ci != l->config_index) {
        const struct raft_config *c = raft_config(n->raft);
        oplog_config(n, &l->config, c, ci);
        l->config = *c;
        l->config_index = ci;
    }
    l->role = role;
    l->term = term;
}

/* Transport: the connection to a peer came up or was lost. */
static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    struct node *n = data;
    (void)t;
    if (n->loop.closing)
        return;
    if (up)
        NODE_OPLOG(n, PEER_CONNECTED, TK_LOG_INFO, raft_term(n->raft), "peer=%llu",
                   (unsigned long long)id);
    else
        NODE_OPLOG(n, PEER_LOST, TK_LOG_INFO, raft_term(n->raft), "peer=%llu",
                   (unsigned long long)id);
}

/* A snapshot's first message to a follower (not its resends). */
static void oplog_snapshot_sent(struct node *n, const struct raft_message *m)
{
    const struct raft_msg_snapshot *s = &m->u.snapshot;
    if (m->type != RAFT_MSG_SNAPSHOT || s->offset != 0)
        return;
    struct node_oplog *l = &n->oplog;
    uint64_t now = node__mono_ns();
    if (m->to == l->snap_to && s->meta.index == l->snap_index &&
        now - l->snap_ns < NODE_OPLOG_RESEND_NS)
        return; /* a resend */
    l->snap_to = m->to;
    l->snap_index = s->meta.index;
    l->snap_ns = now;
    uint64_t bytes = s->total != 0 ? s->total : s->data != NULL ? s->data->len : 0;
    NODE_OPLOG(n, SNAPSHOT_SENT, TK_LOG_INFO, raft_term(n->raft),
               "to=%llu index=%llu bytes=%llu", (unsigned long long)m->to,
               (unsigned long long)s->meta.index, (unsigned long long)bytes);
}

/* Step: a snapshot to install and the hard state, saved synchronously (before
 * any of the ready's messages leave: a vote). Returns 0, or the error with
 * *what naming the failed step. */
static int ready_save(struct node *n, const struct raft_ready *rd, const char **what)
{
    int rc;
    if (rd->snapshot != NULL) {
        *what = "install snapshot";
        rc = install_snapshot(n, rd->snapshot, rd->snapshot_data);
        if (rc != 0)
            return rc;
    }
    if (rd->hard_state_changed) {
        *what = "save hard state";
        rc = store_save_hard_state(n->store, &rd->hard_state);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Step: the entries to the storage thread, or written here (`now`,
 * node__append_inline). Returns as ready_save. */
static int ready_append(struct node *n, const struct raft_ready *rd, bool now,
                        const char **what)
{
    int rc;
    if (rd->n_entries > 0) {
        /* During an install the entries wait beside it (they follow the
         * snapshot in the store); past the bounds on that, the loop waits. */
        if (!node__install_defer(n, rd->entries, rd->n_entries, rd->seq)) {
            *what = "install snapshot";
            rc = node__install_wait(n);
            if (rc != 0)
                return rc;
            *what = "append";
            rc = node__store_append(n, rd->entries, rd->n_entries, rd->seq, now);
            if (rc != 0)
                return rc;
        }
        node__persist_push(n, rd->seq, true);
    } else if (rd->seq != 0) {
        /* Durable already (sync saves), unless a snapshot install is in
         * flight: then durable with it (pushed as pending, like an append). */
        node__persist_push(n, rd->seq, node__install_hold(n, rd->seq));
    }
    return 0;
}

/* Step: apply the committed entries and serve what they release. */
static void ready_apply(struct node *n, const struct raft_ready *rd, uint64_t *t)
{
    if (rd->n_committed > 0) {
        uint64_t t0 = *t;
        apply_entries(n, rd->committed, rd->n_committed);
        phase_end(n, PH_APPLY, t);
        tk_hist_record(&n->m.lat.apply, *t - t0);
        n->loop.turn_applied += rd->n_committed;
        if (n->o.on_applied != NULL)
            n->o.on_applied(n, n->loop.uv, n->o.hook_data);
        if (n->client.on)
            node__client_applied(n);
    }
    if (rd->n_read_states > 0)
        handle_read_states(n, rd->read_states, rd->n_read_states);
}

/* One ready, step by step: persist, send, apply, advance and complete.
 * Returns false when a step failed the node (the ready is advanced first). */
static bool handle_ready(struct node *n, uint64_t *t)
{
    struct raft_ready rd;
    raft_ready(n->raft, &rd);
    /* Answers completed below name the leader (X-Tierkv-Leader): let them see
     * a change of leader that this ready carries. Becoming leader is
     * published at the end of the turn instead, once this ready's messages
     * (the term's first appends) have left. */
    uint64_t leader = raft_leader(n->raft);
    if (leader != n->m.status.leader && leader != n->o.id)
        node__publish_status(n);
    oplog_observe(n);
    phase_end(n, PH_READY, t);
    /* The entries go to the storage thread before the messages leave (it
     * writes while the loop sends), or, written on the loop, after them. */
    const char *what = NULL;
    bool inl = node__append_inline(n);
    int rc = ready_save(n, &rd, &what);
    if (rc == 0 && !inl)
        rc = ready_append(n, &rd, inl, &what);
    if (rc != 0)
        goto fail;
    phase_end(n, PH_STORE, t);
    for (size_t i = 0; i < rd.n_messages; i++) {
        oplog_snapshot_sent(n, &rd.messages[i]);
        (void)transport_send(n->transport, &rd.messages[i]); /* Raft retries */
    }
    phase_end(n, PH_SEND, t);
    if (inl) {
        rc = ready_append(n, &rd, inl, &what);
        if (rc != 0)
            goto fail;
        phase_end(n, PH_STORE, t);
    }
    ready_apply(n, &rd, t);
    raft_advance(n->raft, &rd);
    if (rd.n_committed > 0)
        raft_applied(n->raft, kv_sm_applied_index(n->sm));
    node__persist_poll(n);
    complete_committed(n);
    serve_reads(n);
    phase_end(n, PH_ADVANCE, t);
    return true;
fail:
    raft_advance(n->raft, &rd);
    node__fail(n, rc, what);
    return false;
}

/* Payload applied per loop turn before the rest waits for the next turn
 * (readies hand out at most raft_options.max_apply_bytes each): a backlog of
 * big entries, after a hold or a slow disk, applied at once held the loop
 * for hundreds of ms (memcpy into fresh ring pages). */
#define NODE_APPLY_TURN_BYTES (2u << 20)
/* ... and at most this many entries: 8 MiB of 100-byte writes was 67k applies
 * in one turn (120 ms of CPU) after a hold at 7M keys. */
#define NODE_APPLY_TURN_ENTRIES 8192
/* ... and no new ready once this much of the turn went to applying: a
 * follower catching up at 10M keys (overwrites of cold keys, 5-8 us each)
 * took turns of 46-68 ms for 8,192 entries. Readies hand out at most 1,024
 * entries (node_recover.c), so a turn applies for about this long at most. */
#define NODE_APPLY_TURN_NS (10u * 1000 * 1000)

static void process_ready(struct node *n)
{
    int guard = 0;
    uint64_t t = node__mono_ns();
    node__tier_hold(n);
    while (!n->persist.failed && raft_has_ready(n->raft) && guard++ < 8 &&
           n->loop.turn_apply_bytes < NODE_APPLY_TURN_BYTES &&
           n->loop.turn_apply_entries < NODE_APPLY_TURN_ENTRIES &&
           n->loop.turn_ns[PH_APPLY] < NODE_APPLY_TURN_NS) {
        if (!handle_ready(n, &t))
            return;
        node__tier_hold(n); /* what this ready applied may have filled the ring */
    }
    if (!n->persist.failed) {
        node__install_unpark(n); /* begins a parked install once the tier is idle */
        node__tier_turn(n);      /* claims its own phases */
        t = node__mono_ns();
    }
    if (!n->persist.failed && node__gate_ready(n))
        drain_queue(n); /* large writes the gate let go (node_gate.c) */
    if (!n->persist.failed && raft_has_ready(n->raft))
        node__kick(n); /* bounded work per turn: the rest on the next one */
    node__publish_status(n);
    oplog_observe(n);
    if (!n->persist.failed)
        fail_orphan_reads(n); /* after publishing: its answers name no old leader */
}

/* ---- requests from other threads --------------------------------------- */

static void start_read(struct node *n, struct node_req *r)
{
    if (r->consistency == NODE_READ_STALE) {
        node__finish_read(n, r, 0);
        return;
    }
    n->m.metrics.read_index++;
    r->ctx = ++n->req.read_ctx;
    r->asked = raft_role(n->raft) == RAFT_LEADER ? 0 : raft_leader(n->raft);
    int rc = raft_read_index(n->raft, r->ctx);
    if (rc != 0) {
        node__finish_read(n, r, rc);
        return;
    }
    node__list_push(&n->req.read_wait, r);
}

/* Transport callback: a FORWARD frame from a peer (node_forward.c decodes it).
 * A request for this node as leader comes back to be submitted like a local
 * write, through the queue, so it joins the next proposal batch. */
static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    struct node *n = data;
    (void)t;
    if (n->loop.closing)
        return;
    struct node_req *r = node__forward_recv(n, from, buf, len);
    while (r != NULL) {
        struct node_req *next = r->next;
        int rc = node_submit(n, r);
        if (rc != 0)
            node__forward_refuse(r, rc);
        r = next;
    }
    node__kick(n);
}

/* Drains one burst from the queue: writes become one raft_propose batch. */
static void drain_queue(struct node *n)
{
    size_t nb = 0;
    struct node_req *first = NULL, *last = NULL;
    uint64_t now = tk_wall_ms();
    void *item;
    /* Only what was queued when the drain began: a request submitted from a
     * callback of this drain (a stale read is answered at once, and a read in
     * steps submits its next step from there) waits for the next loop turn
     * (its submit woke the loop), so no chain of them holds this turn. */
    size_t left = atomic_load_explicit(&n->loop.queued, memory_order_relaxed);
    for (;;) {
        /* First the large writes the gate held that may go now (node_gate.c),
         * then the queue. */
        struct node_req *r = nb < n->o.batch_max ? node__gate_take(n) : NULL;
        bool from_gate = r != NULL;
        if (r == NULL) {
            if (nb >= n->o.batch_max || left == 0 ||
                (item = tk_mpsc_pop(&n->loop.queue)) == NULL)
                break;
            left--;
            n->loop.activity++;
            atomic_fetch_sub_explicit(&n->loop.queued, 1, memory_order_relaxed);
            r = item;
            r->deadline_ms = now + (r->timeout_ms ? r->timeout_ms : n->o.timeout_ms);
        }
        if (n->persist.failed) {
            node__finish(n, r, TK_EIO);
            continue;
        }
        if (n->mem.rejected) { /* refused by the cluster: serves nothing */
            node__finish(n, r, TK_ENOLEADER);
            continue;
        }
        if (r->is_read) {
            start_read(n, r);
            continue;
        }
        if (raft_role(n->raft) != RAFT_LEADER) {
            node__forward_write(n, r);
            continue;
        }
        if (!from_gate && node__gate_hold(n, r))
            continue;
        n->loop.batch[nb++] = (struct raft_entry){
            .type = RAFT_ENTRY_NORMAL, .time_ms = now, .data = r->cmd};
        r->next = NULL;
        if (last)
            last->next = r;
        else
            first = r;
        last = r;
    }
    node__forward_flush(n); /* the writes gathered for the leader */
    if (nb == 0)
        return;
    uint64_t index = 0, term = 0;
    int rc = raft_propose(n->raft, n->loop.batch, nb, &index, &term);
    if (rc == 0) {
        n->m.metrics.proposals += nb;
        n->m.metrics.batches++;
        tk_hist_record(&n->m.lat.batch_size, nb);
    }
    struct node_req *r = first;
    while (r != NULL) {
        struct node_req *next = r->next;
        node__gate_proposed(n, index, r->cmd->len, rc == 0);
        if (rc != 0) {
            node__finish_write(n, r, rc, NULL);
        } else {
            r->index = index++;
            r->term = term;
            tk_blob_unref(r->cmd); /* the log holds its own reference */
            r->cmd = NULL;
            node__list_push(r->mode == NODE_MODE_COMMITTED ? &n->req.committed_wait
                                                           : &n->req.applied_wait,
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
        node__list_pop(l);
        node__finish(n, r, TK_ETIMEDOUT);
    }
}

/* ---- loop callbacks ---------------------------------------------------- */

static void begin_close(struct node *n);

static void on_wake(struct node_wake *w)
{
    struct node *n = w->data;
    node__client_loop_awake(n);
    if (atomic_load(&n->loop.stopping)) {
        begin_close(n);
        return;
    }
    n->m.metrics.loop_wakeups++;
    int st = atomic_load(&n->persist.store_status);
    if (st != 0)
        node__fail(n, st, "append");
    uint64_t to = atomic_exchange(&n->loop.transfer_to, 0);
    if (to != 0)
        (void)raft_transfer_leadership(n->raft, to);
    drain_queue(n);
    node__kick(n);
}

static void on_tick(uv_timer_t *h)
{
    struct node *n = h->data;
    if (n->persist.failed || n->mem.rejected)
        return;
    raft_tick(n->raft);
    node__kick(n);
    uint64_t now = tk_wall_ms();
    expire_list(n, &n->req.applied_wait, now);
    expire_list(n, &n->req.committed_wait, now);
    expire_list(n, &n->req.read_wait, now);
    expire_list(n, &n->req.read_ready, now);
    node__gate_expire(n, now);
    expire_list(n, &n->fwd.wait, now);
    node__forward_leader_check(n);
    node__member_tick(n);
    struct node_req *due[NODE_DUTY_N]; /* the leader's own commands */
    size_t k = node__duty_due(n, now, due);
    for (size_t i = 0; i < k; i++)
        if (node_submit(n, due[i]) != 0) /* queue full: the next tick */
            node__duty_refused(due[i]);
}

struct thread_usage {
    uint64_t cpu_ns, majflt, minflt, nvcsw, nivcsw;
    uint64_t wait_ns; /* runnable, waiting for a core (schedstat's run_delay) */
};

static void read_thread_usage(struct thread_usage *u)
{
    u->wait_ns = tk_thread_wait_ns();
    struct rusage ru;
    memset(&ru, 0, sizeof(ru));
    getrusage(RUSAGE_THREAD, &ru);
    u->cpu_ns =
        ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
        ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
    u->majflt = (uint64_t)ru.ru_majflt;
    u->minflt = (uint64_t)ru.ru_minflt;
    u->nvcsw = (uint64_t)ru.ru_nvcsw;
    u->nivcsw = (uint64_t)ru.ru_nivcsw;
}

/* The slow-turn warning (a turn past half the election timeout). Its usage
 * figures tell work (cpu_ms: the turn's own) from waiting, over the window
 * since the last usage sample (window_ms: the turn and at most
 * USAGE_EVERY_NS before it): for a core (wait_ms, the time runnable on a run
 * queue, and involuntary switches: preempted on a loaded machine; what is
 * left beyond work and both waits is time the machine did not run the guest,
 * steal), for the disk (major page faults) or for a lock or I/O (voluntary
 * switches, one of them the loop's own wait for events). */
static void slow_turn_log(struct node *n, uint64_t dt, int worst, uint64_t cpu,
                          const struct thread_usage *u, uint64_t window_ns)
{
    NODE_OPLOG(n, SLOW_TURN, TK_LOG_WARN, raft_term(n->raft),
               "turn_ms=%llu timeout_ms=%u phase=%s cpu_ms=%llu applied=%llu "
               "window_ms=%llu wait_ms=%llu majflt=%llu minflt=%llu vcsw=%llu ivcsw=%llu",
               (unsigned long long)(dt / 1000000), n->o.tick_ms * n->o.election_ticks,
               phase_name[worst], (unsigned long long)(cpu / 1000000),
               (unsigned long long)n->loop.turn_applied,
               (unsigned long long)(window_ns / 1000000),
               (unsigned long long)((u->wait_ns - n->loop.turn_wait_ns) / 1000000),
               (unsigned long long)(u->majflt - n->loop.turn_majflt),
               (unsigned long long)(u->minflt - n->loop.turn_minflt),
               (unsigned long long)(u->nvcsw - n->loop.turn_nvcsw),
               (unsigned long long)(u->nivcsw - n->loop.turn_nivcsw));
}

/* The usage sample (USAGE_EVERY_NS) at the end of a turn of dt ns, ending
 * now, with `cpu` ns of CPU, and the slow-turn warning. */
static void turn_usage(struct node *n, uint64_t dt, int worst, uint64_t cpu, uint64_t now)
{
    bool slow = dt > half_timeout_ns(n);
    if (!slow && now - n->loop.usage_at_ns < USAGE_EVERY_NS)
        return;
    struct thread_usage u;
    read_thread_usage(&u);
    if (slow)
        slow_turn_log(n, dt, worst, cpu, &u,
                      n->loop.usage_at_ns ? now - n->loop.usage_at_ns : dt);
    n->loop.turn_cpu_ns = u.cpu_ns;
    n->loop.turn_wait_ns = u.wait_ns;
    n->loop.turn_majflt = u.majflt;
    n->loop.turn_minflt = u.minflt;
    n->loop.turn_nvcsw = u.nvcsw;
    n->loop.turn_nivcsw = u.nivcsw;
    n->loop.usage_at_ns = now;
}

/* The loop thread's CPU in the turn of dt ns ending now (node_oplog.h): the
 * clock is read when its last read is NODE_CPU_EVERY_NS old or the turn is
 * the longest yet, else the turn was short and its CPU is not known
 * (UINT64_MAX). */
static uint64_t turn_cpu(struct node *n, uint64_t dt, uint64_t now)
{
    struct node_turn_cpu *c = &n->cpu;
    if (now - c->at_ns < NODE_CPU_EVERY_NS && dt <= c->max_wall) {
        c->busy_ns += dt;
        return UINT64_MAX;
    }
    uint64_t clock = node__thread_cpu_ns();
    uint64_t used = clock - c->cpu_ns;
    c->cpu_ns = clock;
    c->at_ns = now;
    uint64_t before = c->busy_ns; /* earlier turns' share, at most their time */
    c->busy_ns = 0;
    used = used > before ? used - before : 0;
    /* What the thread spent between turns (in epoll) is in the reading too:
     * one thread's CPU in a turn is never more than the turn's time. */
    return used < dt ? used : dt;
}

/* The first read of the CPU clock, as the loop starts. */
static void turn_cpu_start(struct node *n)
{
    n->cpu.cpu_ns = node__thread_cpu_ns();
    n->cpu.at_ns = node__mono_ns();
}

/* A loop turn of dt ns, ending now, is over: its histogram, the longest turn
 * by phase (the one most of it went to; what no phase claims is "other"),
 * its CPU (the longest turn's, held turns) and the slow-turn warning. */
static void turn_end(struct node *n, uint64_t dt, uint64_t now)
{
    uint64_t claimed = 0;
    for (int i = 0; i < PH_N; i++)
        claimed += n->loop.turn_ns[i];
    n->loop.turn_ns[NODE_PH_OTHER] += dt > claimed ? dt - claimed : 0;
    int worst = 0;
    for (int i = 1; i < PH_N; i++)
        if (n->loop.turn_ns[i] > n->loop.turn_ns[worst])
            worst = i;
    tk_hist_record(&n->m.lat.loop_turn, dt);
    if (dt > n->m.metrics.loop_turn_max_ns[worst])
        n->m.metrics.loop_turn_max_ns[worst] = dt;
    uint64_t cpu = turn_cpu(n, dt, now);
    if (dt > n->cpu.max_wall) { /* read above */
        n->cpu.max_wall = dt;
        n->m.metrics.loop_turn_max_cpu_ns = cpu;
    }
    if (cpu != UINT64_MAX && cpu >= NODE_HELD_CPU_NS) {
        if (dt > half_timeout_ns(n))
            n->m.metrics.loop_turns_held++;
        if (dt > n->m.metrics.loop_turn_held_max_ns)
            n->m.metrics.loop_turn_held_max_ns = dt;
    }
    turn_usage(n, dt, worst, cpu != UINT64_MAX ? cpu : 0, now);
    memset(n->loop.turn_ns, 0, sizeof(n->loop.turn_ns));
    n->loop.turn_applied = 0;
    n->loop.turn_apply_bytes = 0;
    n->loop.turn_apply_entries = 0;
}

/* Just before the loop blocks for events: the turn since the last prepare,
 * less the time the loop was blocked (libuv's idle time), was busy. */
static void on_prepare(uv_prepare_t *h)
{
    struct node *n = h->data;
    uint64_t now = node__mono_ns(),
             idle = uv_metrics_idle_time(n->loop.uv) + node__client_idle_ns(n);
    if (n->loop.prep_ns != 0) {
        uint64_t wall = now - n->loop.prep_ns, blocked = idle - n->loop.prep_idle_ns;
        turn_end(n, wall > blocked ? wall - blocked : 0, now);
    }
    atomic_fetch_add_explicit(&n->loop.turns, 1, memory_order_relaxed);
    n->loop.prep_ns = now;
    n->loop.prep_idle_ns = idle;
}

static void on_check(uv_check_t *h)
{
    struct node *n = h->data;
    node__client_loop_awake(n);
    if (n->loop.closing)
        return;
    uint64_t t0 = node__mono_ns();
    if (raft_has_ready(n->raft))
        n->loop.activity++;
    if (n->loop.activity != n->loop.activity_seen) {
        n->loop.activity_seen = n->loop.activity;
        n->loop.active_ns = t0;
    }
    /* Spin: the idle handle keeps the loop polling without blocking for
     * spin_us after the last activity. */
    bool spin =
        n->o.spin_us != 0 && t0 - n->loop.active_ns < (uint64_t)n->o.spin_us * 1000;
    if (n->loop.kicked || (n->loop.spinning && !spin)) {
        n->loop.kicked = false;
        n->loop.spinning = false;
        uv_idle_stop(&n->loop.idle);
    }
    if (spin && !n->loop.spinning) {
        n->loop.spinning = true;
        uv_idle_start(&n->loop.idle, node__on_idle);
    }
    node__persist_poll(n);
    process_ready(n);
    node__forward_flush(n); /* the answers this turn completed */
#ifndef NDEBUG
    const char *broken = node__check(n);
    if (broken != NULL)
        tk__assert_fail(broken, __FILE__, __LINE__, __func__);
#endif
    /* On a loop of our own, on_prepare measures the whole turn instead. */
    if (!n->loop.idle_metrics) {
        uint64_t now = node__mono_ns();
        turn_end(n, now - t0, now);
    }
    /* A burst bigger than one batch: come back next turn without sleeping. */
    if (atomic_load_explicit(&n->loop.queued, memory_order_relaxed) > 0)
        node__wake_send(&n->loop.wake);
}

/* The core refused `m` for its term (past RAFT_TERM_CEIL, or more than
 * RAFT_TERM_LEAP above ours): bad input from a peer, one line a second. */
static void term_refused(struct node *n, const struct raft_message *m)
{
    uint64_t now = node__mono_ns();
    if (n->oplog.terms_logged_ns != 0 && now - n->oplog.terms_logged_ns < 1000000000ull) {
        n->oplog.terms_quiet++;
        return;
    }
    TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
           "refused a raft message from %llu with term %llu: past the ceiling or too far "
           "above ours (%llu more since the last report)",
           (unsigned long long)m->from, (unsigned long long)m->term,
           (unsigned long long)n->oplog.terms_quiet);
    n->oplog.terms_logged_ns = now;
    n->oplog.terms_quiet = 0;
}

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    struct node *n = data;
    (void)t;
    if (!n->loop.closing && !n->persist.failed && !n->mem.rejected) {
        /* A stranger (dropped by --force-new-cluster, or removed) is never
         * heard, whatever the transport let through (node_member.c). */
        if (node__member_fenced(n, m->from))
            return;
        /* One install at a time, and waiting for the one in flight would hold
         * the loop: a newer snapshot is dropped, and the leader, hearing no
         * ack, sends it again later. */
        if (m->type == RAFT_MSG_SNAPSHOT && node__installing(n) &&
            m->u.snapshot.meta.index > n->install.meta.index) {
            n->m.metrics.installs_dropped++;
            return;
        }
        if (m->type == RAFT_MSG_SNAPSHOT && node__install_check(n, m))
            return; /* bad input: refused, the core hears nothing */
        uint64_t t0 = node__mono_ns();
        if (raft_step(n->raft, m) == TK_ERANGE)
            term_refused(n, m);
        if (m->type == RAFT_MSG_SNAPSHOT)
            node__drop_replaced_log(n);
        n->loop.turn_ns[NODE_PH_RECV] += node__mono_ns() - t0;
        n->loop.activity++;
        node__kick(n);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    node__handle_gone(h->data);
}

static void on_transport_closed(struct transport *t, void *data)
{
    struct node *n = data;
    (void)t;
    n->transport = NULL;
    node__handle_gone(n);
}

static void begin_close(struct node *n)
{
    if (n->loop.closing)
        return;
    n->loop.closing = true;
    node__tier_stop(n);
    if (n->o.on_loop_stop != NULL)
        n->o.on_loop_stop(n, n->loop.uv, n->o.hook_data);
    node__client_close(n);
    node__backup_fail_all(n, TK_ESHUTDOWN);
    void *item;
    while ((item = tk_mpsc_pop(&n->loop.queue)) != NULL)
        node__finish(n, item, TK_ESHUTDOWN);
    node__fail_list(n, &n->req.applied_wait, TK_ESHUTDOWN);
    node__fail_list(n, &n->req.committed_wait, TK_ESHUTDOWN);
    node__fail_list(n, &n->req.read_wait, TK_ESHUTDOWN);
    node__fail_list(n, &n->req.read_ready, TK_ESHUTDOWN);
    node__gate_fail_all(n, TK_ESHUTDOWN);
    node__fail_list(n, &n->fwd.wait, TK_ESHUTDOWN);
    node__member_shutdown(n);
    /* The storage thread wakes us from its callbacks: let those finish
     * before the wake handle goes away. */
    node__persist_drain(n);
    node__wake_close(&n->loop.wake, on_handle_closed);
    uv_close((uv_handle_t *)&n->loop.ticker, on_handle_closed);
    uv_close((uv_handle_t *)&n->loop.check, on_handle_closed);
    uv_close((uv_handle_t *)&n->loop.idle, on_handle_closed);
    uv_close((uv_handle_t *)&n->loop.prepare, on_handle_closed);
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

static int open_transport(struct node *n)
{
    struct transport_callbacks cbs = {.recv = on_recv,
                                      .peer = on_peer,
                                      .forward = on_forward,
                                      .incarnation = node__member_incarnation,
                                      .refused = node__member_refused,
                                      .member = node__member_known,
                                      .data = n};
    if (n->o.hub != NULL)
        return transport_inproc_new(n->o.hub, n->loop.uv, n->o.id, 0, &cbs,
                                    &n->transport);
    struct transport_tcp_options to;
    transport_tcp_options_default(&to);
    to.frame_max = NODE_FRAME_MAX; /* NODE_ENTRY_MAX is derived from it */
    to.id = n->o.id;
    to.cluster_id = n->o.cluster_id;
    to.listen_host = n->o.listen_host;
    to.listen_port = n->o.listen_port;
    to.seed = n->o.seed;
    to.peer_token = n->o.peer_token;
    to.peer_token_len = n->o.peer_token_len;
    to.tls_server = n->o.peer_tls_server;
    to.tls_client = n->o.peer_tls_client;
    memcpy(to.incarnation, n->mem.incarnation, sizeof(to.incarnation));
    int rc = transport_tcp_new(n->loop.uv, &to, &cbs, &n->transport);
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
    if (node__wake_open(&n->loop.wake) != 0) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "no eventfd for the loop's wake-up: %s",
               strerror(errno));
        return TK_EIO;
    }
    int rc = node__recover(n);
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
            TK_ASSERT(!n->loop.shared);
            n->loop.handles_open = 1;
            transport_close(n->transport, on_transport_closed, n);
            uv_run(n->loop.uv, UV_RUN_DEFAULT);
        }
        return rc;
    }
    node__member_init(n);
    node__wake_start(n->loop.uv, &n->loop.wake, on_wake, n);
    uv_timer_init(n->loop.uv, &n->loop.ticker);
    uv_check_init(n->loop.uv, &n->loop.check);
    uv_idle_init(n->loop.uv, &n->loop.idle);
    uv_prepare_init(n->loop.uv, &n->loop.prepare);
    n->loop.ticker.data = n->loop.check.data = n->loop.idle.data = n;
    n->loop.prepare.data = n;
    n->loop.handles_open = 6;
    node__tier_boot(n);
    uv_timer_start(&n->loop.ticker, on_tick, n->o.tick_ms, n->o.tick_ms);
    uv_check_start(&n->loop.check, on_check);
    if (n->loop.idle_metrics)
        uv_prepare_start(&n->loop.prepare, on_prepare);
    node__publish_status(n);
    oplog_observe(n); /* records the state recovered */
    turn_cpu_start(n);
    TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft), "node started (applied %llu)",
           (unsigned long long)kv_sm_applied_index(n->sm));
    if (n->o.on_loop_start != NULL)
        n->o.on_loop_start(n, n->loop.uv, n->o.hook_data);
    return 0;
}

static void node_thread(void *arg)
{
    struct node *n = arg;
    char name[16]; /* what top -H and perf show */
    snprintf(name, sizeof(name), "tk-node-%llu", (unsigned long long)(n->o.id % 100000));
    pthread_setname_np(pthread_self(), name);
    node__stall_mark_loop_thread(n);
    n->loop.start_rc = uv_loop_init(n->loop.uv) == 0 ? 0 : TK_EIO;
    /* The loop's own idle time, so that on_prepare can tell a turn's work
     * from the time it waited for events. */
    n->loop.idle_metrics =
        n->loop.start_rc == 0 && uv_loop_configure(n->loop.uv, UV_METRICS_IDLE_TIME) == 0;
    if (n->loop.start_rc == 0)
        n->loop.start_rc = node__client_prepare(n);
    if (n->loop.start_rc == 0)
        n->loop.start_rc = node_init(n);
    node__client_begin(n, n->loop.start_rc == 0); /* on_client_start has run */
    if (n->loop.start_rc != 0) {
        (void)uv_loop_close(n->loop.uv);
        uv_sem_post(&n->loop.started);
        return;
    }
    uv_sem_post(&n->loop.started);
    if (n->client.on)
        node__client_run(n); /* the state lock held but while it waits */
    else
        uv_run(n->loop.uv, UV_RUN_DEFAULT);
    int rc = uv_loop_close(n->loop.uv);
    if (rc != 0)
        TK_LOG(TK_LOG_WARN, n->o.id, 0, "loop closed with live handles: %s",
               uv_strerror(rc));
}

void node_options_default(struct node_options *o)
{
    memset(o, 0, sizeof(*o));
    o->tick_ms = 10;
    o->election_ticks = 20;
    o->lease_checkpoint_ms = 200;
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
    if (n->dir_locked) /* after the log and the KV, which wrote into it */
        tk_dirlock_release(n->dir_lock_fd);
    tk_blob_unref(n->tier.blob); /* node_tier.c's reference to the snapshot */
    tk_free(n->tier.marks);
    tk_free(n->tier.compact_blobs);
    node__forward_free(n);
    if (n->own_volume)
        store_mem_volume_free(n->volume);
    if (n->tmp_dir)
        nftw(n->data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    tk_mpsc_destroy(&n->loop.queue);
    node__install_defer_clear(n);
    tk_blob_unref(n->install.data); /* a parked install's, at close */
    node__persist_free(n);
    tk_free(n->loop.batch);
    node__lease_free(n);
    tk_free(n->data_dir);
    uv_sem_destroy(&n->loop.started);
    uv_sem_destroy(&n->loop.closed);
    pthread_mutex_destroy(&n->m.mu);
    node__wake_discard(&n->loop.wake); /* every thread that sends is gone */
    tk_free(n);
}

int node_start(const struct node_options *o, struct node **out)
{
    if (o->id == RAFT_NONE || raft_config_has(&o->members, o->id) == o->join ||
        o->members.n_voters == 0 || o->tick_ms == 0 || o->heartbeat_ticks == 0 ||
        o->heartbeat_ticks >= o->election_ticks || o->queue_max == 0 || o->batch_max == 0)
        return TK_EINVAL;
    struct node *n = tk_calloc(1, sizeof(*n));
    n->o = *o;
    n->loop.wake.fd = -1; /* not opened (node_free) */
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
    tk_mpsc_init(&n->loop.queue, o->queue_max);
    node__lease_init(n);
    node__duty_init(n);
    n->loop.batch = tk_malloc(o->batch_max * sizeof(*n->loop.batch));
    tk_hist_init(&n->m.lat.append);
    tk_hist_init(&n->m.lat.fsync);
    tk_hist_init(&n->m.lat.apply);
    tk_hist_init(&n->m.lat.batch_size);
    uv_sem_init(&n->loop.started, 0);
    uv_sem_init(&n->loop.closed, 0);
    node__persist_init(n);
    pthread_mutex_init(&n->m.mu, NULL);
    if (o->loop != NULL && (o->hub == NULL || o->on_client_start != NULL)) {
        node_free(n);
        return TK_EINVAL;
    }
    if (o->loop != NULL) {
        n->loop.shared = true;
        n->loop.uv = o->loop;
        int rc = node_init(n);
        if (rc != 0) {
            node_free(n);
            return rc;
        }
        *out = n;
        return 0;
    }
    n->loop.uv = &n->loop.own;
    if (uv_thread_create(&n->loop.thread, node_thread, n) != 0) {
        node_free(n);
        return TK_EIO;
    }
    uv_sem_wait(&n->loop.started);
    if (n->loop.start_rc != 0) {
        int rc = n->loop.start_rc;
        uv_thread_join(&n->loop.thread);
        node__client_join(n);
        node_free(n);
        return rc;
    }
    if (n->loop.idle_metrics) /* its turns are counted (on_prepare) */
        node__stall_start(n);
    *out = n;
    return 0;
}

void node_stop(struct node *n)
{
    if (n == NULL)
        return;
    node__stall_stop(n);
    atomic_store(&n->loop.stopping, true);
    node__wake_send(&n->loop.wake);
    if (n->loop.shared)
        uv_sem_wait(&n->loop.closed); /* the caller's loop closes our handles */
    else
        uv_thread_join(&n->loop.thread);
    node__client_join(n); /* its last completions, then its thread */
    node_free(n);
}

struct kv_sm *node_kv(struct node *n)
{
    return n->sm;
}

int node_submit(struct node *n, struct node_req *req)
{
    if (atomic_load(&n->loop.stopping))
        return TK_ESHUTDOWN;
    if (!req->is_read && (req->cmd == NULL || req->write_cb == NULL))
        return TK_EINVAL;
    if (!req->is_read && req->cmd->len > NODE_ENTRY_MAX)
        return TK_ETOOBIG; /* could never be replicated: refused, not resent */
    if (req->is_read && req->read_cb == NULL)
        return TK_EINVAL;
    if (req->on_client && (!n->client.on || (!req->is_read && req->res_out == NULL)))
        return TK_EINVAL; /* no client loop, or nowhere for the result */
    atomic_fetch_add_explicit(&n->loop.queued, 1, memory_order_relaxed);
    int rc = tk_mpsc_push(&n->loop.queue, req);
    if (rc != 0) {
        atomic_fetch_sub_explicit(&n->loop.queued, 1, memory_order_relaxed);
        return rc;
    }
    if (!node__client_defer_wake(n))
        node__wake_send(&n->loop.wake);
    return 0;
}

const struct node_latency *node_latency(struct node *n)
{
    if (n->store != NULL)
        store_sync_latency(n->store, &n->m.lat.fsync);
    return &n->m.lat;
}

void node_metrics(struct node *n, struct node_metrics *out)
{
    pthread_mutex_lock(&n->m.mu);
    *out = n->m.pub;
    pthread_mutex_unlock(&n->m.mu);
    /* Asked of the store here, per call, not on every loop turn. */
    out->store_log_bytes = n->store != NULL ? store_log_bytes(n->store) : 0;
}

void node_status(struct node *n, struct node_status *out)
{
    pthread_mutex_lock(&n->m.mu);
    *out = n->m.status;
    pthread_mutex_unlock(&n->m.mu);
}

int node_transfer_leadership(struct node *n, uint64_t to)
{
    if (to == RAFT_NONE || to == n->o.id)
        return TK_EINVAL; /* the core checks `to` against the configuration */
    atomic_store(&n->loop.transfer_to, to);
    node__wake_send(&n->loop.wake);
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