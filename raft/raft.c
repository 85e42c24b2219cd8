/* The Raft state machine: elections, replication, commitment, reads,
 * leadership transfer and snapshots, driven only by its inputs.
 *
 * Sections of the Raft thesis (Ongaro 2014) are cited where they apply. The
 * invariants this file keeps:
 *  - `stable` <= last index, and every entry up to `stable` is durable and is
 *    the same entry as in the log (a truncation lowers it).
 *  - `applying` <= min(commit, stable): committed entries are handed out to be
 *    applied only once they are durable locally (an installed snapshot is the
 *    one exception: it is handed out whole, and `applying` is its index).
 *  - a vote, a term change and an append ack never leave before the ready that
 *    carried them is reported durable (raft_persisted); see hold().
 *  - the leader counts itself toward a quorum only up to `stable`, and
 *    commits only an index whose entry has the current term (figure 3.7 / the
 *    "figure 8" rule of the paper).
 * raft__check_invariants() (check.c) checks the first two, and more, at the
 * end of every public mutator; internal functions assert their preconditions
 * (the role they need) on entry, and entries are checked (index, term) on
 * their way into the log and again when the ready that carried them is
 * recorded for storage. Bad input from a peer is never asserted on: it is
 * ignored or answered. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "raft/raft_internal.h"

#ifndef RAFT_PLANTED_BUG
#define RAFT_PLANTED_BUG 0
#endif

/* ---- small helpers ----------------------------------------------------- */

void raft__grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    *arr = tk_realloc(*arr, c * elem);
    *cap = c;
}

static uint32_t quorum(const struct raft *r)
{
    return r->config.n_voters / 2 + 1;
}

/* The largest value that a quorum of voters has reached, given one value per
 * voter in `v[0 .. n_voters)` (etcd's MajorityConfig.CommittedIndex): the
 * quorum-th largest. Sorts `v` in place, descending; an insertion sort, as
 * n_voters <= RAFT_VOTERS_MAX. */
static uint64_t quorum_index(const struct raft *r, uint64_t *v)
{
    uint32_t n = r->config.n_voters;
    TK_ASSERT(n >= 1);
    TK_ASSERT(n <= RAFT_VOTERS_MAX);
    for (uint32_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        uint32_t j = i;
        while (j > 0 && v[j - 1] < x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
    return v[quorum(r) - 1];
}

static int voter_slot(const struct raft *r, uint64_t id)
{
    for (uint32_t i = 0; i < r->config.n_voters; i++)
        if (r->config.voters[i] == id)
            return (int)i;
    return -1;
}

/* Members are the voters, then the learners: a leader's prs[] in order. */
static uint32_t n_members(const struct raft *r)
{
    return r->config.n_voters + r->config.n_learners;
}

static uint64_t member_id(const struct raft_config *c, uint32_t i)
{
    return i < c->n_voters ? c->voters[i] : c->learners[i - c->n_voters];
}

static int member_slot(const struct raft *r, uint64_t id)
{
    for (uint32_t i = 0; i < n_members(r); i++)
        if (member_id(&r->config, i) == id)
            return (int)i;
    return -1;
}

static uint64_t last_index(const struct raft *r)
{
    return raft__log_last_index(&r->log);
}

static uint64_t last_term(const struct raft *r)
{
    return raft__log_last_term(&r->log);
}

static uint64_t term_at(const struct raft *r, uint64_t index)
{
    return raft__log_term_or0(&r->log, index);
}

static void set_role(struct raft *r, uint8_t role, uint64_t leader)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(role <= RAFT_LEADER);
    if (r->role != role || r->leader != leader)
        r->soft_dirty = true;
    r->role = role;
    r->leader = leader;
}

static void reset_election_timeout(struct raft *r)
{
    TK_ASSERT(r != NULL);
    r->election_elapsed = 0;
    r->election_timeout =
        r->o.election_ticks + (uint32_t)tk_prng_below(&r->prng, r->o.election_ticks);
}

/* True when there is state changed since the last ready that the next ready
 * will hand to storage. */
static bool dirty(const struct raft *r)
{
    return r->hs_dirty || r->snap_install || r->unstable <= last_index(r);
}

/* The seq whose durability covers the state as it is now, or 0 if all of it
 * is durable already. */
static uint64_t needed_seq(const struct raft *r)
{
    if (dirty(r))
        return r->next_seq;
    if (r->handed_seq > r->persisted_seq)
        return r->handed_seq;
    return 0;
}

/* ---- the outbox -------------------------------------------------------- */

static struct raft__out *out_push(struct raft *r, uint8_t type, uint64_t to)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(type != RAFT_MSG_NONE);
    TK_ASSERT(type < RAFT_MSG_TYPE_COUNT);
    TK_ASSERT(to != r->o.id);
    raft__grow((void **)&r->out, &r->cap_out, r->n_out + 1, sizeof(*r->out));
    struct raft__out *o = &r->out[r->n_out++];
    memset(o, 0, sizeof(*o));
    o->m.type = type;
    o->m.from = r->o.id;
    o->m.to = to;
    o->m.term = r->term;
    return o;
}

/* Queues a successful append ack. Acks to one leader only grow within a
 * term, and the leader takes an ack of index i for every one below it (match
 * and the inflight window move to i, the read round to the highest seen), so
 * an ack that follows another to the same peer in the same term replaces it:
 * a follower answers a loop turn's appends, released together when they are
 * durable, with one message. */
static void out_push_ack(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(m->type == RAFT_MSG_APPEND_RESP && !m->u.append_resp.reject);
    if (r->n_out > 0) {
        struct raft_message *last = &r->out[r->n_out - 1].m;
        if (last->type == RAFT_MSG_APPEND_RESP && !last->u.append_resp.reject &&
            last->to == m->to && last->term == m->term &&
            last->u.append_resp.index <= m->u.append_resp.index) {
            uint64_t ctx = last->u.append_resp.read_ctx;
            *last = *m;
            if (ctx > last->u.append_resp.read_ctx)
                last->u.append_resp.read_ctx = ctx;
            r->acks_merged++;
            return;
        }
    }
    struct raft__out *o = out_push(r, m->type, m->to);
    o->m = *m;
}

static void out_drop_snapshot_ref(struct raft__out *o)
{
    if (o->m.type == RAFT_MSG_SNAPSHOT) {
        tk_blob_unref(o->m.u.snapshot.data);
        o->m.u.snapshot.data = NULL;
    }
}

/* Sends `m` once the state it depends on is durable (thesis 3.8: a server
 * must persist its vote and log before answering). `check_term`, for an
 * append ack, is the term the acked index must still hold at release. */
static void hold(struct raft *r, const struct raft_message *m, uint64_t check_term)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(m->from == r->o.id);
    uint64_t seq = needed_seq(r);
    if (seq == 0) {
        struct raft__out *o = out_push(r, m->type, m->to);
        o->m = *m;
        return;
    }
    raft__grow((void **)&r->held, &r->cap_held, r->n_held + 1, sizeof(*r->held));
    struct raft__held *h = &r->held[r->n_held++];
    h->m = *m;
    h->seq = seq;
    h->check_term = check_term;
}

static void release_held(struct raft *r)
{
    TK_ASSERT(r != NULL);
    size_t keep = 0;
    for (size_t i = 0; i < r->n_held; i++) {
        struct raft__held *h = &r->held[i];
        if (h->seq > r->persisted_seq) {
            r->held[keep++] = *h;
            continue;
        }
        bool ack = h->m.type == RAFT_MSG_APPEND_RESP && !h->m.u.append_resp.reject;
        if (ack && term_at(r, h->m.u.append_resp.index) != h->check_term)
            continue; /* the acked entries were replaced meanwhile */
        if (ack) {
            out_push_ack(r, &h->m);
            continue;
        }
        struct raft__out *o = out_push(r, h->m.type, h->m.to);
        o->m = h->m;
    }
    r->n_held = keep;
}

/* A truncation at `index` invalidates acks held for entries at or beyond it. */
static void drop_held_acks_from(struct raft *r, uint64_t index)
{
    TK_ASSERT(r != NULL);
    size_t keep = 0;
    for (size_t i = 0; i < r->n_held; i++) {
        struct raft__held *h = &r->held[i];
        if (h->m.type == RAFT_MSG_APPEND_RESP && !h->m.u.append_resp.reject &&
            h->m.u.append_resp.index >= index)
            continue;
        r->held[keep++] = *h;
    }
    r->n_held = keep;
}

/* ---- the log and the configuration ------------------------------------- */

/* The configuration in force at `index` (which must be in the log or its
 * base): the newest config entry at or below it, else the one in force at the
 * log's base (the snapshot's or the bootstrap one). *at is the entry's index,
 * 0 for the latter. */
static void config_scan(const struct raft *r, uint64_t index, struct raft_config *out,
                        uint64_t *at)
{
    TK_ASSERT(index >= r->log.base_index);
    TK_ASSERT(index <= last_index(r));
    for (uint64_t i = index; i > r->log.base_index; i--) {
        const struct raft_entry *e = raft__log_at(&r->log, i);
        if (e->type != RAFT_ENTRY_CONFIG)
            continue;
        if (e->data != NULL &&
            raft_config_decode(e->data->data, e->data->len, out) == 0) {
            *at = i;
            return;
        }
    }
    *out = r->base_config;
    *at = 0;
}

/* config_scan, for a caller whose config_index and config are current (not
 * config_refresh, which computes them): config_index is the newest config
 * entry in the log (0: none, the base's is in force) and r->config its
 * decoded form, so at or below `index` that is the answer without walking
 * the log. A snapshot and a compaction ask at an index far back: the walk
 * read every entry since the log's base, 200k of them between snapshots at
 * 100k. */
static void config_at(const struct raft *r, uint64_t index, struct raft_config *out,
                      uint64_t *at)
{
    if (r->config_index <= index) {
        if (r->config_index > r->log.base_index) {
            *out = r->config;
            *at = r->config_index;
            return;
        }
        if (r->config_index == 0) {
            *out = r->base_config;
            *at = 0;
            return;
        }
    }
    config_scan(r, index, out, at);
}

/* Makes a leader's prs[] follow the configuration now in force, which
 * replaced `old`: a member of both keeps its progress, a new member starts
 * probing from the log's end and begins its first catch-up round. The
 * progress structs (and their inflight rings) are permuted, never copied. */
static void progress_follow(struct raft *r, const struct raft_config *old)
{
    struct raft__progress prev[RAFT_MEMBERS_MAX];
    bool used[RAFT_MEMBERS_MAX] = {false};
    uint32_t n_old = old->n_voters + old->n_learners;
    memcpy(prev, r->prs, sizeof(prev));
    bool placed[RAFT_MEMBERS_MAX] = {false};
    for (uint32_t i = 0; i < n_members(r); i++) {
        uint64_t id = member_id(&r->config, i);
        for (uint32_t j = 0; j < n_old; j++) {
            if (!used[j] && prev[j].id == id && member_id(old, j) == id) {
                r->prs[i] = prev[j];
                used[j] = placed[i] = true;
                break;
            }
        }
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < RAFT_MEMBERS_MAX; i++) {
        if (placed[i])
            continue;
        while (used[k])
            k++;
        r->prs[i] = prev[k];
        used[k] = true;
        if (i < n_members(r)) {
            raft__pr_reset(&r->prs[i], member_id(&r->config, i), last_index(r) + 1);
            r->prs[i].round_target = last_index(r);
            r->prs[i].round_start = r->leader_ticks;
        }
    }
}

static void config_set(struct raft *r, const struct raft_config *c, uint64_t index)
{
    raft__check_config(c);
    struct raft_config old = r->config;
    r->config = *c;
    r->config_index = index;
    if (r->role == RAFT_LEADER)
        progress_follow(r, &old);
}

/* The configuration in force: the newest config entry in the log, else the
 * snapshot's, else the bootstrap one (thesis 4.1: a server uses the latest
 * configuration in its log, committed or not). */
static void config_refresh(struct raft *r)
{
    TK_ASSERT(r != NULL);
    struct raft_config c;
    uint64_t at;
    config_scan(r, last_index(r), &c, &at);
    config_set(r, &c, at);
}

/* Appends entries that continue the log: from a leader (validated by
 * append_well_formed and matched against our log) or our own (proposals, a
 * new leader's no-op). Their indexes and terms are checked here on the way in,
 * and again (the last one) when storage reports them durable. */
static void log_append(struct raft *r, const struct raft_entry *e, size_t n)
{
    TK_ASSERT(r != NULL);
    uint64_t prev_term = last_term(r);
    for (size_t i = 0; i < n; i++) {
        TK_ASSERT(e[i].index == last_index(r) + 1 + i);
        TK_ASSERT(e[i].term >= prev_term);
        TK_ASSERT(e[i].term <= r->term);
        prev_term = e[i].term;
    }
    raft__log_append(&r->log, e, n);
    for (size_t i = 0; i < n; i++) {
        struct raft_config c;
        if (e[i].type == RAFT_ENTRY_CONFIG && e[i].data != NULL &&
            raft_config_decode(e[i].data->data, e[i].data->len, &c) == 0)
            config_set(r, &c, e[i].index);
    }
}

static void log_truncate(struct raft *r, uint64_t index)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(index > r->commit);
    raft__log_truncate(&r->log, index);
    if (r->stable >= index)
        r->stable = index - 1;
    if (r->unstable > index)
        r->unstable = index;
    drop_held_acks_from(r, index);
    if (r->config_index >= index)
        config_refresh(r);
}

/* ---- role changes ------------------------------------------------------ */

static void fail_pending_reads(struct raft *r);

static void become_follower(struct raft *r, uint64_t term, uint64_t leader)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(term >= r->term);
    TK_ASSERT(term <= RAFT_TERM_CEIL);
    if (term != r->term) {
        r->term = term;
        r->vote = RAFT_NONE;
        r->hs_dirty = true;
    }
    if (r->role == RAFT_LEADER)
        fail_pending_reads(r);
    set_role(r, RAFT_FOLLOWER, leader);
    r->transfer_to = RAFT_NONE;
    r->committed_in_term = false;
    reset_election_timeout(r);
}

static void send_append(struct raft *r, struct raft__progress *pr, bool heartbeat);

/* Sends appends to `pr` until its window is full or it has everything: in
 * replicate state the pipeline is kept full (thesis 10.2.2). */
static void fill_pipeline(struct raft *r, struct raft__progress *pr)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    TK_ASSERT(pr->id != r->o.id);
    uint64_t before;
    do {
        before = pr->next;
        send_append(r, pr, false);
    } while (pr->state == RAFT__PR_REPLICATE && pr->next != before &&
             pr->next <= last_index(r));
}

static void bcast_append(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    for (uint32_t i = 0; i < n_members(r); i++)
        if (r->prs[i].id != r->o.id)
            fill_pipeline(r, &r->prs[i]);
}

static void bcast_heartbeat(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    for (uint32_t i = 0; i < n_members(r); i++)
        if (r->prs[i].id != r->o.id)
            send_append(r, &r->prs[i], true);
    r->heartbeat_elapsed = 0;
}

static void maybe_commit(struct raft *r);

static void become_leader(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_CANDIDATE);
    TK_ASSERT(r->vote == r->o.id);
    TK_ASSERT(r->self_vote_durable);
    set_role(r, RAFT_LEADER, r->o.id);
    r->snap_wanted = false;
    r->transfer_to = RAFT_NONE;
    r->committed_in_term = false;
    r->heartbeat_elapsed = 0;
    r->election_elapsed = 0;
    for (uint32_t i = 0; i < n_members(r); i++) {
        raft__pr_reset(&r->prs[i], member_id(&r->config, i), last_index(r) + 1);
        r->prs[i].round_target = last_index(r);
        r->prs[i].round_start = r->leader_ticks;
    }

    /* Thesis 6.4: a no-op entry of the new term lets the leader learn which
     * entries are committed. On a new cluster, the bootstrap configuration
     * also becomes data in the log. */
    struct raft_entry e[2];
    size_t n = 0;
    uint64_t idx = last_index(r);
    e[n++] =
        (struct raft_entry){.term = r->term, .index = ++idx, .type = RAFT_ENTRY_NOOP};
    struct tk_blob *cfg = NULL;
    if (r->config_index == 0 && r->snap.index == 0) {
        cfg = raft_config_encode(&r->config);
        e[n++] = (struct raft_entry){
            .term = r->term, .index = ++idx, .type = RAFT_ENTRY_CONFIG, .data = cfg};
    }
    log_append(r, e, n);
    tk_blob_unref(cfg);
    bcast_append(r);
    maybe_commit(r);
}

static void send_vote_requests(struct raft *r, bool pre, bool transfer)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == (pre ? RAFT_PRE_CANDIDATE : RAFT_CANDIDATE));
    TK_ASSERT(!pre || r->term < RAFT_TERM_CEIL); /* campaign() checked */
    uint64_t term = pre ? r->term + 1 : r->term;
    for (uint32_t i = 0; i < r->config.n_voters; i++) {
        uint64_t id = r->config.voters[i];
        if (id == r->o.id)
            continue;
        struct raft__out *o = out_push(r, RAFT_MSG_VOTE, id);
        o->m.term = term;
        o->m.u.vote.last_log_index = last_index(r);
        o->m.u.vote.last_log_term = last_term(r);
        o->m.u.vote.pre_vote = pre;
        o->m.u.vote.transfer = transfer;
    }
}

static void tally(struct raft *r);

/* Whether this node may stand for election: it is a voter of the
 * configuration in force, or of the committed one while a change that removed
 * or demoted it is still uncommitted. Without the latter a cluster can wedge:
 * if the leader that removed itself is lost before the change commits, the
 * remaining voter of the new configuration may lack the entry, and need this
 * node's vote in the old one, which it cannot get with a shorter log (thesis
 * 4.2.2: a server not in its newest configuration may still lead until that
 * configuration commits). The votes are counted in the newest configuration
 * either way. Learners and removed nodes never campaign. */
static bool may_campaign(const struct raft *r)
{
    if (voter_slot(r, r->o.id) >= 0)
        return true;
    if (r->config_index <= r->commit)
        return false;
    struct raft_config c;
    uint64_t at;
    config_scan(r, r->commit, &c, &at); /* rare: a timeout of such a node */
    return raft_config_has(&c, r->o.id);
}

/* Thesis 3.4 (election) and 9.6 (pre-vote). */
static void campaign(struct raft *r, bool pre, bool transfer)
{
    TK_ASSERT(r != NULL);
    if (!may_campaign(r) || r->term >= RAFT_TERM_CEIL)
        return; /* at the ceiling (raft.h): no term above it, ever */
    for (uint32_t i = 0; i < RAFT_VOTERS_MAX; i++)
        r->votes[i] = -1;
    reset_election_timeout(r);
    if (pre) {
        set_role(r, RAFT_PRE_CANDIDATE, RAFT_NONE);
        r->self_vote_durable = true; /* a pre-vote changes no durable state */
    } else {
        if (r->role == RAFT_LEADER)
            fail_pending_reads(r);
        TK_ASSERT(r->term < RAFT_TERM_CEIL);
        r->term++;
        r->vote = r->o.id;
        r->hs_dirty = true;
        set_role(r, RAFT_CANDIDATE, RAFT_NONE);
        r->self_vote_seq = r->next_seq;
        r->self_vote_durable = false;
    }
    r->transfer_to = RAFT_NONE;
    send_vote_requests(r, pre, transfer);
    tally(r);
}

/* Counts votes; our own counts once durable. */
static void tally(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_PRE_CANDIDATE || r->role == RAFT_CANDIDATE);
    uint32_t yes = 0, no = 0;
    for (uint32_t i = 0; i < r->config.n_voters; i++) {
        if (r->config.voters[i] == r->o.id) {
            if (r->self_vote_durable)
                yes++;
            continue;
        }
        if (r->votes[i] == 1)
            yes++;
        else if (r->votes[i] == 0)
            no++;
    }
    if (yes >= quorum(r)) {
        if (r->role == RAFT_PRE_CANDIDATE)
            campaign(r, false, false);
        else if (r->self_vote_durable)
            become_leader(r); /* never lead a term we might forget (3.8) */
    } else if (no >= quorum(r)) {
        become_follower(r, r->term, RAFT_NONE);
    }
}

/* ---- replication (leader) ---------------------------------------------- */

static struct raft__progress *progress_of(struct raft *r, uint64_t id)
{
    int s = member_slot(r, id);
    return s < 0 ? NULL : &r->prs[s];
}

static void send_snapshot(struct raft *r, struct raft__progress *pr)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    TK_ASSERT(pr->id != r->o.id);
    if (r->snap_data == NULL) {
        /* The driver gave the descriptor only, or none yet (after a restart):
         * it reads the state when asked (raft_snapshot_wanted), for a
         * follower that is answering now, not one that is down or cut off
         * (heartbeats and the stall rule probe those on and on). */
        if (r->answering == pr->id)
            r->snap_wanted = true;
        return;
    }
    struct raft__out *o = out_push(r, RAFT_MSG_SNAPSHOT, pr->id);
    o->m.u.snapshot.meta = r->snap;
    o->m.u.snapshot.offset = 0;
    o->m.u.snapshot.done = true;
    o->m.u.snapshot.data = tk_blob_ref(r->snap_data);
    raft__pr_become_snapshot(pr, r->snap.index);
}

/* Thesis 3.5 and 10.2: a batch of entries from pr->next, or a heartbeat that
 * carries only the commit index and a read round. */
static void send_append(struct raft *r, struct raft__progress *pr, bool heartbeat)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    TK_ASSERT(pr->id != r->o.id);
    if (heartbeat) {
        /* prev = match is known to be in the follower's log, so a heartbeat
         * never fails because appends are still in flight. */
        uint64_t prev = pr->match;
        uint64_t prev_term;
        if (raft__log_term(&r->log, prev, &prev_term) != 0) {
            /* match is compacted: index 0 (term 0) matches every log, and the
             * follower answers with its commit index. */
            prev = 0;
            prev_term = 0;
        }
        struct raft__out *o = out_push(r, RAFT_MSG_APPEND, pr->id);
        o->m.u.append.prev_index = prev;
        o->m.u.append.prev_term = prev_term;
        o->m.u.append.commit = r->commit < prev ? r->commit : prev;
        o->m.u.append.read_ctx = r->read_round;
        o->last_term = prev_term;
        if (pr->state == RAFT__PR_PROBE)
            pr->probe_sent = false; /* the heartbeat's answer resumes probing */
        return;
    }
    if (raft__pr_paused(pr, r->o.max_inflight_bytes))
        return;
    uint64_t prev = pr->next - 1;
    uint64_t prev_term;
    if (raft__log_term(&r->log, prev, &prev_term) != 0) {
        send_snapshot(r, pr);
        return;
    }
    uint64_t last = last_index(r);
    uint64_t n = 0, bytes = 0;
    while (prev + n < last && n < r->o.max_append_entries) {
        const struct raft_entry *e = raft__log_at(&r->log, prev + n + 1);
        uint64_t sz = e->data ? e->data->len : 0;
        if (n > 0 && bytes + sz > r->o.max_append_bytes)
            break;
        bytes += sz;
        n++;
    }
    if (n == 0 && pr->state == RAFT__PR_REPLICATE)
        return; /* nothing new; heartbeats carry the commit index */
    struct raft__out *o = out_push(r, RAFT_MSG_APPEND, pr->id);
    o->m.u.append.prev_index = prev;
    o->m.u.append.prev_term = prev_term;
    o->m.u.append.commit = r->commit;
    o->m.u.append.read_ctx = 0;
    o->m.u.append.n_entries = (uint32_t)n;
    o->last_term = n ? term_at(r, prev + n) : prev_term;
    if (pr->state == RAFT__PR_REPLICATE) {
        pr->next = prev + n + 1;
        raft__pr_infl_add(pr, prev + n, bytes);
    } else {
        pr->probe_sent = true;
    }
}

/* Thesis 3.6.2: commit the highest index stored on a quorum, but only if its
 * entry is of the current term (figure 3.7). The leader counts itself only up
 * to its durable index (10.2.1). */
static void maybe_commit(struct raft *r)
{
    TK_ASSERT(r != NULL);
    if (r->role != RAFT_LEADER)
        return;
    uint64_t m[RAFT_VOTERS_MAX];
    uint32_t n = r->config.n_voters;
    for (uint32_t i = 0; i < n; i++)
        m[i] = r->prs[i].id == r->o.id ? r->stable : r->prs[i].match;
    uint64_t idx = quorum_index(r, m);
    if (idx <= r->commit)
        return;
#if RAFT_PLANTED_BUG == 2
        /* Planted bug: commit whatever a quorum stores, whatever its term. */
#else
    if (term_at(r, idx) != r->term)
        return;
#endif
    r->commit = idx;
    if (term_at(r, idx) == r->term && !r->committed_in_term) {
        r->committed_in_term = true;
        /* Reads that waited for this (thesis 6.4 step 1) can start a round. */
        for (size_t i = 0; i < r->n_reads; i++) {
            if (r->reads[i].index == 0) {
                r->reads[i].index = r->commit;
                r->read_hb_needed = true;
            }
        }
    }
    bcast_append(r);
    if (r->config_index <= r->commit && voter_slot(r, r->o.id) < 0) {
        /* Thesis 4.2.2: a leader that removed (or demoted) itself steps down
         * once that configuration commits; the heartbeat tells the others
         * the commit first. */
        bcast_heartbeat(r);
        become_follower(r, r->term, RAFT_NONE);
    }
}

/* ---- reads (thesis 6.4) ------------------------------------------------ */

static void read_state_push(struct raft *r, uint64_t ctx, uint64_t index, bool failed)
{
    TK_ASSERT(r != NULL);
    raft__grow((void **)&r->rs, &r->cap_rs, r->n_rs + 1, sizeof(*r->rs));
    r->rs[r->n_rs++] =
        (struct raft_read_state){.ctx = ctx, .index = index, .failed = failed};
}

static void read_answer(struct raft *r, const struct raft__read *rd, bool failed)
{
    if (rd->from == r->o.id) {
        read_state_push(r, rd->ctx, failed ? 0 : rd->index, failed);
        return;
    }
    struct raft__out *o = out_push(r, RAFT_MSG_READ_INDEX_RESP, rd->from);
    o->m.u.read_index.ctx = rd->ctx;
    o->m.u.read_index.index = failed ? 0 : rd->index;
    o->m.u.read_index.reject = failed;
}

static void fail_pending_reads(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    for (size_t i = 0; i < r->n_reads; i++)
        read_answer(r, &r->reads[i], true);
    r->n_reads = 0;
    r->read_hb_needed = false;
}

/* Releases the reads whose heartbeat round a quorum has acknowledged. */
static void reads_release(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    if (r->n_reads == 0)
        return;
    uint64_t m[RAFT_VOTERS_MAX];
    uint32_t n = r->config.n_voters;
    for (uint32_t i = 0; i < n; i++)
        m[i] = r->prs[i].id == r->o.id ? r->read_round : r->prs[i].read_round;
    uint64_t acked = quorum_index(r, m);
    size_t keep = 0;
    for (size_t i = 0; i < r->n_reads; i++) {
        struct raft__read *rd = &r->reads[i];
        if (rd->round != 0 && rd->round <= acked)
            read_answer(r, rd, false);
        else
            r->reads[keep++] = *rd;
    }
    r->n_reads = keep;
}

static void read_add(struct raft *r, uint64_t ctx, uint64_t from)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    struct raft__read rd = {.ctx = ctx, .from = from};
    if (r->n_reads >= RAFT__READS_MAX) {
        read_answer(r, &rd, true);
        return;
    }
    raft__grow((void **)&r->reads, &r->cap_reads, r->n_reads + 1, sizeof(*r->reads));
    if (r->committed_in_term) {
        rd.index = r->commit;
        r->read_hb_needed = true;
    }
    r->reads[r->n_reads++] = rd;
}

/* Starts one heartbeat round for every read waiting for one: one round serves
 * a whole batch of reads. */
static void reads_start_round(struct raft *r)
{
    TK_ASSERT(r != NULL);
    if (!r->read_hb_needed || r->role != RAFT_LEADER)
        return;
    r->read_hb_needed = false;
    r->read_round++;
    r->read_rounds++;
    for (size_t i = 0; i < r->n_reads; i++)
        if (r->reads[i].index != 0 && r->reads[i].round == 0)
            r->reads[i].round = r->read_round;
    bcast_heartbeat(r);
    reads_release(r); /* a single-voter cluster needs no round trip */
}

/* ---- message handlers -------------------------------------------------- */

static void handle_vote(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(m->term >= r->term);
    const struct raft_msg_vote *v = &m->u.vote;
    bool up_to_date =
        v->last_log_term > last_term(r) ||
        (v->last_log_term == last_term(r) && v->last_log_index >= last_index(r));
    bool can_vote = r->vote == m->from ||
                    (r->vote == RAFT_NONE && r->leader == RAFT_NONE) ||
                    (v->pre_vote && m->term > r->term);
    struct raft_message resp;
    memset(&resp, 0, sizeof(resp));
    resp.type = RAFT_MSG_VOTE_RESP;
    resp.from = r->o.id;
    resp.to = m->from;
    resp.u.vote_resp.pre_vote = v->pre_vote;
    if (can_vote && up_to_date) {
        resp.term = m->term; /* for a pre-vote: the term it would have */
        resp.u.vote_resp.granted = true;
        if (!v->pre_vote) {
            r->vote = m->from;
            r->hs_dirty = true;
            r->election_elapsed = 0;
#if RAFT_PLANTED_BUG == 1
            struct raft__out *o = out_push(r, resp.type, resp.to);
            o->m = resp; /* planted bug: the vote leaves before it is durable */
            return;
#endif
        }
        hold(r, &resp, 0);
        return;
    }
    resp.term = r->term;
    resp.u.vote_resp.granted = false;
    struct raft__out *o = out_push(r, resp.type, resp.to);
    o->m = resp;
}

static void send_append_resp(struct raft *r, const struct raft_message *m,
                             const struct raft_msg_append_resp *ar)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_FOLLOWER);
    struct raft_message resp;
    memset(&resp, 0, sizeof(resp));
    resp.type = RAFT_MSG_APPEND_RESP;
    resp.from = r->o.id;
    resp.to = m->from;
    resp.term = r->term;
    resp.u.append_resp = *ar;
    if (ar->reject) {
        struct raft__out *o = out_push(r, resp.type, resp.to);
        o->m = resp;
        return;
    }
#if RAFT_PLANTED_BUG == 3
    {
        /* Planted bug: ack before the entries are durable. */
        struct raft__out *o = out_push(r, resp.type, resp.to);
        o->m = resp;
        return;
    }
#endif
    if (ar->index <= r->stable) {
        out_push_ack(r, &resp);
        return;
    }
    hold(r, &resp, term_at(r, ar->index));
}

static bool append_well_formed(const struct raft_message *m)
{
    const struct raft_msg_append *a = &m->u.append;
    if (a->n_entries > 0 && a->entries == NULL)
        return false;
    uint64_t prev_term = a->prev_term;
    for (uint32_t i = 0; i < a->n_entries; i++) {
        const struct raft_entry *e = &a->entries[i];
        if (e->index != a->prev_index + 1 + i || e->term < prev_term ||
            e->term > m->term || e->type > RAFT_ENTRY_CONFIG)
            return false;
        prev_term = e->term;
    }
    return a->prev_term <= m->term;
}

static void commit_to(struct raft *r, uint64_t index)
{
    if (index > r->commit)
        r->commit = index;
}

/* Thesis 3.5, figure 3.1 "AppendEntries RPC: receiver implementation". */
static void handle_append(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_FOLLOWER);
    TK_ASSERT(r->leader == m->from);
    TK_ASSERT(m->term == r->term);
    const struct raft_msg_append *a = &m->u.append;
    struct raft_msg_append_resp ar;
    memset(&ar, 0, sizeof(ar));
    ar.read_ctx = a->read_ctx;
    if (!append_well_formed(m))
        return;
    if (a->prev_index < r->commit) {
        /* Everything up to commit matches any leader's log already. If the
         * batch reaches beyond commit, process the part past it. */
        uint64_t skip = r->commit - a->prev_index;
        if (skip >= a->n_entries) {
            ar.index = r->commit;
            send_append_resp(r, m, &ar);
            return;
        }
        struct raft_message m2 = *m;
        m2.u.append.prev_index = r->commit;
        m2.u.append.prev_term = a->entries[skip - 1].term;
        m2.u.append.entries = a->entries + skip;
        m2.u.append.n_entries = a->n_entries - (uint32_t)skip;
        if (term_at(r, r->commit) != m2.u.append.prev_term) {
            /* A committed entry differs from the leader's: impossible from a
             * correct leader; refuse the message rather than lose data. */
            return;
        }
        handle_append(r, &m2);
        return;
    }
    uint64_t t;
    int rc = raft__log_term(&r->log, a->prev_index, &t);
    if (rc != 0 || t != a->prev_term) {
        /* Reject with a hint (thesis 5.3): the largest index <= prev whose term
         * is <= prev_term. */
        uint64_t hint = a->prev_index < last_index(r) ? a->prev_index : last_index(r);
        while (hint > r->log.base_index && term_at(r, hint) > a->prev_term)
            hint--;
        ar.reject = true;
        ar.index = a->prev_index;
        ar.conflict_index = hint;
        ar.conflict_term = term_at(r, hint);
        send_append_resp(r, m, &ar);
        return;
    }
    uint32_t i = 0;
    for (; i < a->n_entries; i++) {
        const struct raft_entry *e = &a->entries[i];
        if (e->index > last_index(r))
            break;
        if (term_at(r, e->index) != e->term) {
            if (e->index <= r->commit)
                return; /* would truncate a committed entry: refuse */
            log_truncate(r, e->index);
            break;
        }
    }
    if (i < a->n_entries)
        log_append(r, a->entries + i, a->n_entries - i);
    uint64_t last_new = a->prev_index + a->n_entries;
    commit_to(r, a->commit < last_new ? a->commit : last_new);
    ar.index = last_new;
    send_append_resp(r, m, &ar);
}

/* Thesis 5.2: install a snapshot that is ahead of our log. */
static void handle_snapshot(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_FOLLOWER);
    TK_ASSERT(r->leader == m->from);
    TK_ASSERT(m->term == r->term);
    const struct raft_snapshot_meta *meta = &m->u.snapshot.meta;
    struct raft_msg_append_resp ar;
    memset(&ar, 0, sizeof(ar));
    if (!m->u.snapshot.done || m->u.snapshot.offset != 0 || meta->index == 0 ||
        meta->term == 0 || meta->term > m->term || !raft__config_valid(&meta->config))
        return; /* the node layer reassembles chunks; a partial one is bad input */
    if (meta->index <= r->commit) {
        ar.index = r->commit;
        send_append_resp(r, m, &ar);
        return;
    }
    if (term_at(r, meta->index) == meta->term) {
        /* We already hold the entries: only commit advances (5.2). */
        commit_to(r, meta->index);
        ar.index = meta->index;
        send_append_resp(r, m, &ar);
        return;
    }
    raft__log_reset_into(&r->log, meta->index, meta->term, &r->dropped);
    if (r->stable > meta->index - 1)
        r->stable = meta->index - 1;
    r->unstable = meta->index + 1;
    drop_held_acks_from(r, 1); /* every held ack was for the replaced log */
    r->snap = *meta;
    r->base_config = meta->config;
    tk_blob_unref(r->snap_data);
    r->snap_data = tk_blob_ref(m->u.snapshot.data);
    tk_blob_unref(r->snap_install_data);
    r->snap_install_data = tk_blob_ref(m->u.snapshot.data);
    r->snap_install = true;
    r->commit = meta->index;
    r->applying = meta->index;
    r->applied = meta->index;
    config_refresh(r);
    ar.index = meta->index;
    send_append_resp(r, m, &ar);
}

/* cowsql's rule: the member's last catch-up round took less than an election
 * timeout, and so far does the one under way; or it holds the whole log. */
static bool caught_up(const struct raft *r, const struct raft__progress *pr)
{
    if (pr->match >= last_index(r))
        return true;
    return pr->rounds > 0 && pr->round_ticks < r->o.election_ticks &&
           r->leader_ticks - pr->round_start < r->o.election_ticks;
}

/* Ends the member's catch-up round if its match reached the round's target,
 * and begins the next one (cowsql's rule, see raft_catch_up). */
static void catch_up_note(struct raft *r, struct raft__progress *pr)
{
    if (pr->match < pr->round_target)
        return;
    uint64_t took = r->leader_ticks - pr->round_start;
    pr->round_ticks = took > UINT32_MAX ? UINT32_MAX : (uint32_t)took;
    pr->rounds++;
    pr->round_target = last_index(r);
    pr->round_start = r->leader_ticks;
}

/* The leader's side of an append or snapshot response. */
static void handle_append_resp_from(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    TK_ASSERT(m->term == r->term);
    struct raft__progress *pr = progress_of(r, m->from);
    if (pr == NULL || pr->id == r->o.id)
        return;
    const struct raft_msg_append_resp *ar = &m->u.append_resp;
    pr->recent_active = true;
    if (ar->read_ctx > pr->read_round && ar->read_ctx <= r->read_round)
        pr->read_round = ar->read_ctx;
    if (ar->reject) {
        /* Stale rejections (for an older probe or pipeline, or overtaken by
         * a later ack) are ignored: the follower holds everything up to
         * match, so a refusal at or below it is old news. */
        bool stale = ar->index <= pr->match ||
                     (pr->state == RAFT__PR_PROBE && ar->index != pr->next - 1);
        if (!stale) {
            uint64_t next = ar->conflict_index;
            if (next > last_index(r))
                next = last_index(r);
            while (next > r->log.base_index && term_at(r, next) > ar->conflict_term)
                next--;
            next++; /* retry with prev = the index found */
            if (next > ar->index)
                next = ar->index; /* never beyond what was refused */
            if (next <= pr->match)
                next = pr->match + 1;
            raft__pr_become_probe(pr);
            pr->next = next;
            send_append(r, pr, false);
        }
        reads_release(r);
        return;
    }
    if (ar->index > last_index(r)) {
        reads_release(r);
        return; /* acks an index we never sent: ignore */
    }
    bool progressed = false;
    if (ar->index > pr->match) {
        pr->match = ar->index;
        pr->stall_ticks = 0;
        progressed = true;
    }
    if (pr->next < pr->match + 1)
        pr->next = pr->match + 1;
    catch_up_note(r, pr);
    switch (pr->state) {
    case RAFT__PR_PROBE:
        if (progressed || ar->index == pr->match)
            raft__pr_become_replicate(pr);
        break;
    case RAFT__PR_SNAPSHOT:
        if (pr->match >= pr->pending_snapshot)
            raft__pr_become_probe(pr);
        break;
    case RAFT__PR_REPLICATE:
        raft__pr_infl_free_to(pr, ar->index);
        if (!progressed && pr->infl_count >= pr->infl_cap)
            raft__pr_infl_free_first(pr); /* unstick a window of lost appends */
        break;
    default:
        break;
    }
    if (progressed)
        maybe_commit(r);
    if (r->role != RAFT_LEADER)
        return;
    fill_pipeline(r, pr);
    if (r->transfer_to == pr->id && !r->transfer_sent && pr->match == last_index(r)) {
        out_push(r, RAFT_MSG_TIMEOUT_NOW, pr->id);
        r->transfer_sent = true;
    }
    reads_release(r);
}

static void handle_append_resp(struct raft *r, const struct raft_message *m)
{
    r->answering = m->from; /* send_snapshot: this follower is alive */
    handle_append_resp_from(r, m);
    r->answering = RAFT_NONE;
}

static void handle_vote_resp(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(m->term >= r->term);
    bool pre = m->u.vote_resp.pre_vote;
    if ((pre && r->role != RAFT_PRE_CANDIDATE) || (!pre && r->role != RAFT_CANDIDATE))
        return;
    int s = voter_slot(r, m->from);
    if (s < 0 || r->votes[s] != -1)
        return;
    r->votes[s] = m->u.vote_resp.granted ? 1 : 0;
    tally(r);
}

static void reject_read_index(struct raft *r, const struct raft_message *m)
{
    struct raft__out *o = out_push(r, RAFT_MSG_READ_INDEX_RESP, m->from);
    o->m.u.read_index.ctx = m->u.read_index.ctx;
    o->m.u.read_index.reject = true;
}

/* A message of a higher term (thesis 3.3): we move to that term, except for
 * pre-votes (9.6) and while we have a live leader (leader stickiness, 4.2.3).
 * Returns false when the message is to be dropped. */
static bool step_higher_term(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(m->term > r->term);
    bool is_vote = m->type == RAFT_MSG_VOTE;
    if (is_vote && (r->o.check_quorum || m->u.vote.pre_vote) && !m->u.vote.transfer &&
        r->leader != RAFT_NONE && r->election_elapsed < r->o.election_ticks)
        return false; /* leader stickiness (thesis 4.2.3): we have a live leader */
    if (is_vote && m->u.vote.pre_vote) {
        /* A pre-vote never changes our term. */
    } else if (m->type == RAFT_MSG_VOTE_RESP && m->u.vote_resp.pre_vote &&
               m->u.vote_resp.granted) {
        /* A granted pre-vote carries the term we would campaign in. */
    } else {
        bool from_leader = m->type == RAFT_MSG_APPEND || m->type == RAFT_MSG_SNAPSHOT ||
                           m->type == RAFT_MSG_TIMEOUT_NOW;
        become_follower(r, m->term, from_leader ? m->from : RAFT_NONE);
    }
    return true;
}

/* A message of a lower term is dropped, after telling its sender of the newer
 * term where that helps it step down. */
static void step_lower_term(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(m->term < r->term);
    if (m->type == RAFT_MSG_APPEND || m->type == RAFT_MSG_SNAPSHOT) {
        /* Tell a stale leader about the newer term so it steps down;
         * with pre-vote it would otherwise never learn of it. */
        struct raft__out *o = out_push(r, RAFT_MSG_APPEND_RESP, m->from);
        o->m.u.append_resp.reject = true;
    } else if (m->type == RAFT_MSG_READ_INDEX) {
        reject_read_index(r, m);
    } else if (m->type == RAFT_MSG_VOTE) {
        /* Refuse at our term (Figure 2): a stale candidate learns the
         * newer term and steps down instead of waiting out its timeout. */
        struct raft__out *o = out_push(r, RAFT_MSG_VOTE_RESP, m->from);
        o->m.u.vote_resp.pre_vote = m->u.vote.pre_vote;
        o->m.u.vote_resp.granted = false;
    }
}

/* Who may talk to us (thesis 4.2.3): a leader may be new to us, so appends
 * and snapshots come from anyone; a vote request from a non-voter is heard
 * only while we have no live leader (a removed or not-yet-added server cannot
 * disrupt a working cluster, and a voter we do not know of yet can still be
 * elected); everything else (TimeoutNow, responses, read index) only from
 * members. Stricter filtering of appends and votes (issue 15) breaks liveness
 * under membership changes: a member that missed the entry adding a node
 * must follow that node once it leads (the membership sweeps of tests/sim
 * fail without this, e.g. --seed 2808 --nodes 3 --membership). Strangers are
 * kept out by the transport instead (authenticated members only), and a
 * forged huge term, from anyone, by term_acceptable(). */
static bool from_accepted(const struct raft *r, const struct raft_message *m)
{
    if (m->type == RAFT_MSG_APPEND || m->type == RAFT_MSG_SNAPSHOT)
        return true;
    if (m->type == RAFT_MSG_VOTE && voter_slot(r, m->from) < 0)
        return r->role != RAFT_LEADER &&
               (r->leader == RAFT_NONE || r->election_elapsed >= r->o.election_ticks);
    return member_slot(r, m->from) >= 0;
}

/* Whether a message's term may be taken at all (raft.h, RAFT_TERM_CEIL and
 * RAFT_TERM_LEAP): never above the ceiling, and never more than the leap above
 * our own term. No correct peer sends such a term (a cluster would need 2^32
 * elections without us), so it is bad input; refusing it is as safe as losing
 * the message. Without the leap bound one forged message at the ceiling would
 * leave this node, and through it the cluster, unable to campaign for good. */
static bool term_acceptable(const struct raft *r, uint64_t term)
{
    if (term > RAFT_TERM_CEIL)
        return false;
#if RAFT_PLANTED_BUG == 5
    (void)r;
    return true; /* planted bug: any term up to the ceiling, in one message */
#else
    return term <= r->term || term - r->term <= RAFT_TERM_LEAP;
#endif
}

static int step(struct raft *r, const struct raft_message *m)
{
    if (m == NULL || m->to != r->o.id || m->type == RAFT_MSG_NONE ||
        m->type >= RAFT_MSG_TYPE_COUNT || m->from == RAFT_NONE || m->from == r->o.id)
        return TK_EINVAL;
    if (!term_acceptable(r, m->term)) {
        r->terms_refused++;
        return TK_ERANGE; /* before anything changes: nothing to persist */
    }
    if (!from_accepted(r, m))
        return 0; /* a stranger: dropped */
    if (m->term > r->term && !step_higher_term(r, m))
        return 0;
    if (m->term < r->term) {
        step_lower_term(r, m);
        return 0;
    }

    switch (m->type) {
    case RAFT_MSG_VOTE:
        if (r->role == RAFT_LEADER && m->term == r->term)
            return 0;
        handle_vote(r, m);
        return 0;
    case RAFT_MSG_VOTE_RESP:
        handle_vote_resp(r, m);
        return 0;
    case RAFT_MSG_APPEND:
    case RAFT_MSG_SNAPSHOT:
        if (r->role == RAFT_LEADER)
            return 0; /* one leader per term: cannot be a correct peer */
        if (r->role != RAFT_FOLLOWER || r->leader != m->from)
            become_follower(r, r->term, m->from);
        r->election_elapsed = 0;
        if (m->type == RAFT_MSG_APPEND)
            handle_append(r, m);
        else
            handle_snapshot(r, m);
        return 0;
    case RAFT_MSG_APPEND_RESP:
        if (r->role == RAFT_LEADER)
            handle_append_resp(r, m);
        return 0;
    case RAFT_MSG_TIMEOUT_NOW:
        if (r->role != RAFT_LEADER)
            campaign(r, false, true); /* thesis 3.10: skip pre-vote */
        return 0;
    case RAFT_MSG_READ_INDEX:
        if (r->role == RAFT_LEADER)
            read_add(r, m->u.read_index.ctx, m->from);
        else
            reject_read_index(r, m);
        return 0;
    case RAFT_MSG_READ_INDEX_RESP:
        read_state_push(r, m->u.read_index.ctx,
                        m->u.read_index.reject ? 0 : m->u.read_index.index,
                        m->u.read_index.reject);
        return 0;
    default:
        return TK_EINVAL;
    }
}

int raft_step(struct raft *r, const struct raft_message *m)
{
    TK_ASSERT(r != NULL);
    int rc = step(r, m);
    raft__check_invariants(r);
    return rc;
}

/* ---- time -------------------------------------------------------------- */

static bool quorum_active(struct raft *r)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(r->role == RAFT_LEADER);
    uint32_t active = 0;
    for (uint32_t i = 0; i < n_members(r); i++) {
        struct raft__progress *pr = &r->prs[i];
        if (i < r->config.n_voters && (pr->id == r->o.id || pr->recent_active))
            active++;
        pr->recent_active = false;
    }
    return active >= quorum(r);
}

static void tick_election(struct raft *r)
{
    TK_ASSERT(r->role != RAFT_LEADER);
    r->election_elapsed++;
    if (r->election_elapsed >= r->election_timeout && may_campaign(r))
        campaign(r, r->o.pre_vote, false);
}

static void tick_heartbeat(struct raft *r)
{
    TK_ASSERT(r->role == RAFT_LEADER);
    r->election_elapsed++;
    r->heartbeat_elapsed++;
    r->leader_ticks++;
    for (uint32_t i = 0; i < n_members(r); i++) {
        struct raft__progress *pr = &r->prs[i];
        if (pr->id == r->o.id)
            continue;
        if (pr->state == RAFT__PR_SNAPSHOT && ++pr->snapshot_ticks >= r->o.election_ticks)
            raft__pr_become_probe(pr); /* the snapshot was lost: retry */
        /* Appends in flight with no progress for an election timeout were
         * lost (or their follower restarted): probe again from match. */
        if (pr->state == RAFT__PR_REPLICATE && pr->next > pr->match + 1 &&
            ++pr->stall_ticks >= r->o.election_ticks) {
            raft__pr_become_probe(pr);
            send_append(r, pr, false);
        }
    }
    if (r->transfer_to != RAFT_NONE && ++r->transfer_elapsed >= r->o.election_ticks)
        r->transfer_to = RAFT_NONE; /* thesis 3.10: abort a slow transfer */
    if (r->election_elapsed >= r->o.election_ticks) {
        r->election_elapsed = 0;
        if (r->o.check_quorum && !quorum_active(r)) {
            become_follower(r, r->term, RAFT_NONE);
            return;
        }
    }
    /* Heartbeats always carry the newest read round, so a lost round is
     * confirmed by the next heartbeat. */
    if (r->heartbeat_elapsed >= r->o.heartbeat_ticks)
        bcast_heartbeat(r);
}

void raft_tick(struct raft *r)
{
    TK_ASSERT(r != NULL);
    if (r->role == RAFT_LEADER)
        tick_heartbeat(r);
    else
        tick_election(r);
    raft__check_invariants(r);
}

/* ---- driver inputs ----------------------------------------------------- */

int raft_propose(struct raft *r, const struct raft_entry *entries, size_t n,
                 uint64_t *first_index, uint64_t *term)
{
    TK_ASSERT(r != NULL);
    if (n == 0)
        return TK_EINVAL;
    TK_ASSERT(entries != NULL);
    if (r->role != RAFT_LEADER)
        return TK_ENOTLEADER;
    if (r->transfer_to != RAFT_NONE)
        return TK_EBUSY;
    for (size_t i = 0; i < n; i++)
        if (entries[i].type == RAFT_ENTRY_CONFIG || entries[i].type > RAFT_ENTRY_CONFIG)
            return TK_EINVAL;
    uint64_t last = last_index(r);
    if (last - r->commit + n > r->o.max_uncommitted)
        return TK_EBUSY;
    for (size_t i = 0; i < n; i++) {
        struct raft_entry e = entries[i];
        e.term = r->term;
        e.index = last + 1 + i;
        log_append(r, &e, 1);
    }
    if (first_index)
        *first_index = last + 1;
    if (term)
        *term = r->term;
    bcast_append(r);
    maybe_commit(r); /* a single voter commits once it is durable */
    raft__check_invariants(r);
    return 0;
}

/* The configuration `c` makes of the one in force, or an error; *noop when
 * it is already so (an idempotent retry). */
static int change_apply(const struct raft *r, const struct raft_change *c,
                        struct raft_config *nc, bool *noop)
{
    *nc = r->config;
    *noop = false;
    bool voter = raft_config_has(nc, c->id);
    bool learner = raft_config_has_learner(nc, c->id);
    switch (c->type) {
    case RAFT_CHANGE_ADD_LEARNER:
        if (voter || learner)
            return RAFT_EMEMBER;
        if (nc->n_learners >= RAFT_LEARNERS_MAX)
            return TK_ENOSPC;
        nc->learners[nc->n_learners++] = c->id;
        return 0;
    case RAFT_CHANGE_PROMOTE:
        if (voter)
            *noop = true;
        else if (!learner)
            return TK_EINVAL;
        else if (nc->n_voters >= RAFT_VOTERS_MAX)
            return TK_ENOSPC;
        else if (!caught_up(r, &r->prs[member_slot(r, c->id)]))
            return RAFT_ENOT_CAUGHT_UP;
        break;
    case RAFT_CHANGE_DEMOTE:
        if (learner)
            *noop = true;
        else if (!voter)
            return TK_EINVAL;
        else if (nc->n_learners >= RAFT_LEARNERS_MAX)
            return TK_ENOSPC;
        break;
    case RAFT_CHANGE_REMOVE:
        if (!voter && !learner)
            return TK_EINVAL;
        break;
    default:
        return TK_EINVAL;
    }
    if (*noop)
        return 0;
    struct raft_config out = {.n_voters = 0};
    for (uint32_t i = 0; i < nc->n_voters; i++)
        if (nc->voters[i] != c->id)
            out.voters[out.n_voters++] = nc->voters[i];
    for (uint32_t i = 0; i < nc->n_learners; i++)
        if (nc->learners[i] != c->id)
            out.learners[out.n_learners++] = nc->learners[i];
    if (c->type == RAFT_CHANGE_PROMOTE)
        out.voters[out.n_voters++] = c->id;
    else if (c->type == RAFT_CHANGE_DEMOTE)
        out.learners[out.n_learners++] = c->id;
    if (out.n_voters == 0)
        return TK_EINVAL;
    *nc = out;
    return 0;
}

int raft_change_membership(struct raft *r, const struct raft_change *c, uint64_t *index)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(c != NULL);
    if (r->role != RAFT_LEADER)
        return TK_ENOTLEADER;
    if (c->id == RAFT_NONE)
        return TK_EINVAL;
    if (r->transfer_to != RAFT_NONE)
        return RAFT_ECHANGE_PENDING;
#if RAFT_PLANTED_BUG != 4
    /* One change at a time, and only once this term has committed an entry
     * (Ongaro, raft-dev, July 2015): then no change of an earlier term can
     * still be pending, so the new one differs by one server from every
     * configuration that may yet decide. */
    if (r->config_index > r->commit || !r->committed_in_term)
        return RAFT_ECHANGE_PENDING;
#endif
    struct raft_config nc;
    bool noop;
    int rc = change_apply(r, c, &nc, &noop);
    if (rc != 0)
        return rc;
    if (noop) {
        if (index)
            *index = r->config_index;
        return 0;
    }
    struct raft_entry e = {.term = r->term,
                           .index = last_index(r) + 1,
                           .type = RAFT_ENTRY_CONFIG,
                           .data = raft_config_encode(&nc)};
    log_append(r, &e, 1); /* in force from here on (thesis 4.1) */
    tk_blob_unref(e.data);
    if (index)
        *index = e.index;
    bcast_append(r);
    maybe_commit(r); /* a single voter commits once it is durable */
    raft__check_invariants(r);
    return 0;
}

void raft_persisted(struct raft *r, uint64_t seq)
{
    TK_ASSERT(r != NULL);
    if (seq <= r->persisted_seq || seq > r->handed_seq)
        return;
    r->persisted_seq = seq;
    while (r->n_prec > 0 && r->prec[r->prec_head].seq <= seq) {
        struct raft__persist_rec *p = &r->prec[r->prec_head];
        /* Paired with raft_advance: the record names the last entry (index
         * and term) of a ready handed to storage. */
        TK_ASSERT(p->seq <= r->handed_seq);
        if (p->index > r->stable && term_at(r, p->index) == p->term) {
            TK_ASSERT(p->index <= last_index(r));
            r->stable = p->index;
        }
        r->prec_head++;
        r->n_prec--;
    }
    if (r->n_prec == 0)
        r->prec_head = 0;
    if ((r->role == RAFT_CANDIDATE) && !r->self_vote_durable && seq >= r->self_vote_seq) {
        r->self_vote_durable = true;
        tally(r);
    }
    release_held(r);
    maybe_commit(r);
    raft__check_invariants(r);
}

void raft_hold_apply(struct raft *r, bool hold)
{
    TK_ASSERT(r != NULL);
    r->apply_held = hold;
}

void raft_applied(struct raft *r, uint64_t index)
{
    TK_ASSERT(r != NULL);
    if (index > r->applied && index <= r->applying)
        r->applied = index;
    raft__check_invariants(r);
}

int raft_read_index(struct raft *r, uint64_t ctx)
{
    TK_ASSERT(r != NULL);
    if (r->role == RAFT_LEADER) {
        read_add(r, ctx, r->o.id); /* the round starts in raft_ready */
        raft__check_invariants(r);
        return 0;
    }
    if (r->leader == RAFT_NONE)
        return TK_ENOLEADER;
    struct raft__out *o = out_push(r, RAFT_MSG_READ_INDEX, r->leader);
    o->m.u.read_index.ctx = ctx;
    raft__check_invariants(r);
    return 0;
}

int raft_transfer_leadership(struct raft *r, uint64_t to)
{
    TK_ASSERT(r != NULL);
    if (r->role != RAFT_LEADER)
        return TK_ENOTLEADER;
    struct raft__progress *pr = progress_of(r, to);
    if (pr == NULL || voter_slot(r, to) < 0 || to == r->o.id)
        return TK_EINVAL; /* a learner cannot lead */
    if (r->transfer_to == to)
        return 0;
    r->transfer_to = to;
    r->transfer_elapsed = 0;
    r->transfer_sent = false;
    if (pr->match == last_index(r)) {
        out_push(r, RAFT_MSG_TIMEOUT_NOW, to);
        r->transfer_sent = true;
    } else {
        /* Catch the target up now rather than waiting for lost appends to
         * be noticed: probe from what it is known to hold. */
        raft__pr_become_probe(pr);
        fill_pipeline(r, pr);
    }
    raft__check_invariants(r);
    return 0;
}

int raft_snapshot_set(struct raft *r, const struct raft_snapshot_meta *meta,
                      struct tk_blob *data)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(meta != NULL);
    if (meta->index > r->applied || meta->index < r->snap.index ||
        meta->config.n_voters == 0)
        return TK_EINVAL;
    uint64_t t;
    if (raft__log_term(&r->log, meta->index, &t) != 0 || t != meta->term)
        return TK_EINVAL;
    r->snap = *meta;
    /* The configuration in force at the snapshot's index, not the newest one
     * the caller may have read (a later, possibly uncommitted, entry). */
    uint64_t at;
    config_at(r, meta->index, &r->snap.config, &at);
    tk_blob_unref(r->snap_data);
    r->snap_data = tk_blob_ref(data);
    if (data != NULL)
        r->snap_wanted = false;
    raft__check_invariants(r);
    return 0;
}

bool raft_snapshot_wanted(const struct raft *r)
{
    TK_ASSERT(r != NULL);
    return r->role == RAFT_LEADER && r->snap_wanted && r->snap_data == NULL;
}

int raft_compact(struct raft *r, uint64_t index)
{
    return raft_compact_take(r, index, NULL, NULL);
}

int raft_compact_take(struct raft *r, uint64_t index, struct tk_blob **out, size_t *n_out)
{
    TK_ASSERT(r != NULL);
    if (n_out != NULL)
        *n_out = 0;
    if (index > r->snap.index || index > r->stable)
        return TK_EINVAL;
    if (index <= r->log.base_index)
        return 0;
    uint64_t at;
    config_at(r, index, &r->base_config, &at);
    size_t n = raft__log_compact(&r->log, index, out);
    if (n_out != NULL)
        *n_out = n;
    if (r->config_index <= index)
        r->config_index = 0; /* its entry is gone: it is the base's now */
    /* An append waiting in the outbox for entries now gone is dropped in
     * raft_ready; its follower goes back to probing and gets the snapshot. */
    raft__check_invariants(r);
    return 0;
}

/* ---- ready / advance --------------------------------------------------- */

static uint64_t apply_limit(const struct raft *r)
{
    return r->commit < r->stable ? r->commit : r->stable;
}

/* What the next ready hands out to apply: up to apply_limit, or nothing
 * while the driver holds applying (raft_hold_apply). */
static uint64_t apply_handout(const struct raft *r)
{
    return r->apply_held ? r->applying : apply_limit(r);
}

bool raft_take_dropped(struct raft *r, struct raft_dropped *out)
{
    if (r->dropped.ents == NULL)
        return false;
    out->ents = r->dropped.ents;
    out->cap = r->dropped.cap;
    out->head = r->dropped.head;
    out->n = r->dropped.n;
    raft__log_init(&r->dropped);
    return true;
}

void raft_dropped_free(struct raft_dropped *d)
{
    struct raft__log l = {.ents = d->ents, .cap = d->cap, .head = d->head, .n = d->n};
    raft__log_free(&l);
    memset(d, 0, sizeof(*d));
}

bool raft_has_ready(const struct raft *r)
{
    TK_ASSERT(r != NULL);
    return dirty(r) || r->soft_dirty || r->n_out > 0 || r->n_rs > 0 ||
           r->read_hb_needed || apply_handout(r) > r->applying;
}

/* Resolves an outbox entry to a sendable message; false drops it (its
 * entries were compacted or replaced since it was queued). */
static bool resolve(struct raft *r, struct raft__out *o, struct raft_message *dst)
{
    TK_ASSERT(r != NULL);
    *dst = o->m;
    if (o->m.type != RAFT_MSG_APPEND || o->m.u.append.n_entries == 0)
        return true;
    uint64_t first = o->m.u.append.prev_index + 1;
    uint64_t last = o->m.u.append.prev_index + o->m.u.append.n_entries;
    if (first <= r->log.base_index || last > last_index(r) ||
        term_at(r, last) != o->last_term) {
        struct raft__progress *pr =
            r->role == RAFT_LEADER ? progress_of(r, o->m.to) : NULL;
        if (pr != NULL)
            raft__pr_become_probe(pr);
        return false;
    }
    dst->u.append.entries = raft__log_at(&r->log, first);
    return true;
}

void raft_ready(struct raft *r, struct raft_ready *rd)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(rd != NULL);
    reads_start_round(r);
    memset(rd, 0, sizeof(*rd));
    bool work = dirty(r);
    rd->seq = work ? r->next_seq : 0;
    rd->hard_state_changed = r->hs_dirty;
    rd->hard_state = (struct raft_hard_state){.term = r->term, .vote = r->vote};
    if (r->snap_install) {
        rd->snapshot = &r->snap;
        rd->snapshot_data = r->snap_install_data;
    }
    if (r->unstable <= last_index(r)) {
        if (r->unstable <= r->log.base_index)
            r->unstable = r->log.base_index + 1;
        rd->entries = raft__log_at(&r->log, r->unstable);
        rd->n_entries = (size_t)(last_index(r) - r->unstable + 1);
    }
    raft__grow((void **)&r->ready_msgs, &r->cap_ready_msgs, r->n_out,
               sizeof(*r->ready_msgs));
    size_t n = 0;
    for (size_t i = 0; i < r->n_out; i++)
        if (resolve(r, &r->out[i], &r->ready_msgs[n]))
            n++;
    rd->messages = r->ready_msgs;
    rd->n_messages = n;
    uint64_t lim = apply_handout(r);
    if (lim > r->applying) {
        rd->committed = raft__log_at(&r->log, r->applying + 1);
        size_t cnt = (size_t)(lim - r->applying);
        if (r->o.max_apply_entries != 0 && cnt > r->o.max_apply_entries)
            cnt = r->o.max_apply_entries; /* the rest in the next readies */
        if (r->o.max_apply_bytes != 0) {
            /* At most max_apply_bytes of payload (and at least one entry):
             * the rest in the next readies (raft_has_ready stays true). */
            uint64_t bytes = 0;
            size_t k = 0;
            for (; k < cnt; k++) {
                const struct raft_entry *e = &rd->committed[k];
                uint64_t sz = e->data != NULL ? e->data->len : 0;
                if (k > 0 && bytes + sz > r->o.max_apply_bytes)
                    break;
                bytes += sz;
            }
            cnt = k;
        }
        rd->n_committed = cnt;
    }
    rd->read_states = r->rs;
    rd->n_read_states = r->n_rs;
    rd->leader = r->leader;
    rd->role = r->role;
    rd->commit = r->commit;
}

/* Records that storage now holds everything up to the log's last entry once
 * `rd->seq` is durable (raft_persisted turns the record into `stable`). */
static void persist_record(struct raft *r, const struct raft_ready *rd)
{
    TK_ASSERT(rd->seq == r->next_seq);
    /* The records still waiting for raft_persisted sit at prec[prec_head..].
     * While storage lags, prec_head only rises: slide them to the front once
     * at least half the array lies before them, so the array stays as large as
     * the most records ever waiting at once (each record moves O(1) times on
     * average; no growth per ready). */
    if (r->prec_head > 0 && r->prec_head + r->n_prec == r->cap_prec &&
        r->prec_head >= r->n_prec) {
        memmove(r->prec, r->prec + r->prec_head, r->n_prec * sizeof(*r->prec));
        r->prec_head = 0;
    }
    raft__grow((void **)&r->prec, &r->cap_prec, r->prec_head + r->n_prec + 1,
               sizeof(*r->prec));
    struct raft__persist_rec *p = &r->prec[r->prec_head + r->n_prec++];
    p->seq = rd->seq;
    p->index = last_index(r);
    p->term = last_term(r);
    if (rd->n_entries > 0) {
        /* Paired with raft_persisted: the entries handed to storage are
         * exactly unstable .. last, and the record names the last one. */
        const struct raft_entry *e = &rd->entries[rd->n_entries - 1];
        TK_ASSERT(rd->entries[0].index == r->unstable);
        TK_ASSERT(e->index == p->index);
        TK_ASSERT(e->term == p->term);
    }
    r->handed_seq = rd->seq;
    r->next_seq++;
    r->hs_dirty = false;
    r->unstable = last_index(r) + 1;
    if (r->snap_install) {
        r->snap_install = false;
        tk_blob_unref(r->snap_install_data);
        r->snap_install_data = NULL;
    }
}

void raft_advance(struct raft *r, const struct raft_ready *rd)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(rd != NULL);
    TK_ASSERT(rd->seq != 0 || rd->n_entries == 0);
    if (rd->seq != 0)
        persist_record(r, rd);
    for (size_t i = 0; i < r->n_out; i++)
        out_drop_snapshot_ref(&r->out[i]);
    r->n_out = 0;
    if (rd->n_committed > 0) {
        /* What raft_ready handed out to apply: applying + 1 .. apply_limit. */
        TK_ASSERT(rd->committed[0].index == r->applying + 1);
        r->applying = rd->committed[rd->n_committed - 1].index;
        TK_ASSERT(r->applying <= apply_limit(r));
    }
    r->n_rs = 0;
    r->soft_dirty = false;
    raft__check_invariants(r);
}

/* ---- construction ------------------------------------------------------ */

void raft_options_default(struct raft_options *o)
{
    memset(o, 0, sizeof(*o));
    o->election_ticks = 10;
    o->heartbeat_ticks = 1;
    o->pre_vote = true;
    o->check_quorum = true;
    o->max_append_entries = 256;
    o->max_append_bytes = 1u << 20;
    o->max_apply_bytes = 2u << 20;
    o->max_apply_entries = 4096;
    o->max_inflight_msgs = 64;
    o->max_inflight_bytes = 8u << 20;
    o->max_uncommitted = 65536;
}

int raft_new(const struct raft_options *o, const struct raft_boot *boot,
             struct raft **out)
{
    TK_ASSERT(o != NULL);
    TK_ASSERT(boot != NULL);
    TK_ASSERT(out != NULL);
    if (o->id == RAFT_NONE || o->heartbeat_ticks == 0 ||
        o->heartbeat_ticks >= o->election_ticks || o->max_append_entries == 0 ||
        o->max_inflight_msgs == 0 || o->max_uncommitted == 0)
        return TK_EINVAL;
    uint64_t base = boot->snapshot.index;
    for (size_t i = 0; i < boot->n_entries; i++)
        if (boot->entries[i].index != base + 1 + i)
            return TK_EINVAL;
    /* No core ever holds a term above the ceiling (raft.h): storage that
     * does is corrupt, not a state to assert on or to campaign from. */
    if (boot->hard_state.term > RAFT_TERM_CEIL || boot->snapshot.term > RAFT_TERM_CEIL)
        return TK_ECORRUPT;
    for (size_t i = 0; i < boot->n_entries; i++)
        if (boot->entries[i].term > RAFT_TERM_CEIL)
            return TK_ECORRUPT;
    if (boot->applied < base || boot->applied > base + boot->n_entries)
        return TK_EINVAL;
    if (!raft__config_valid(boot->snapshot.index > 0 ? &boot->snapshot.config
                                                     : &boot->bootstrap))
        return TK_EINVAL;

    struct raft *r = tk_calloc(1, sizeof(*r));
    r->o = *o;
    tk_prng_seed(&r->prng, o->seed ^ (o->id * 0x9E3779B97F4A7C15ull));
    r->term = boot->hard_state.term;
    r->vote = boot->hard_state.vote;
    raft__log_init(&r->log);
    raft__log_init(&r->dropped);
    raft__log_reset(&r->log, boot->snapshot.index, boot->snapshot.term);
    if (o->log_reserve > 0)
        raft__log_reserve(&r->log, (size_t)o->log_reserve);
    r->base_config = boot->snapshot.index > 0 ? boot->snapshot.config : boot->bootstrap;
    r->snap = boot->snapshot;
    r->snap_data = tk_blob_ref(boot->snapshot_data);
    raft__log_append(&r->log, boot->entries, boot->n_entries);
    config_refresh(r);
    for (uint32_t i = 0; i < RAFT_MEMBERS_MAX; i++)
        raft__pr_init(&r->prs[i], o->max_inflight_msgs);
    r->commit = boot->applied;
    r->applied = boot->applied;
    r->applying = boot->applied;
    r->stable = last_index(r);
    r->unstable = last_index(r) + 1;
    r->next_seq = 1;
    r->role = RAFT_FOLLOWER;
    reset_election_timeout(r);
    *out = r;
    return 0;
}

void raft_free(struct raft *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_out; i++)
        out_drop_snapshot_ref(&r->out[i]);
    raft__log_free(&r->log);
    raft__log_free(&r->dropped);
    for (uint32_t i = 0; i < RAFT_MEMBERS_MAX; i++)
        raft__pr_free(&r->prs[i]);
    tk_blob_unref(r->snap_data);
    tk_blob_unref(r->snap_install_data);
    tk_free(r->reads);
    tk_free(r->out);
    tk_free(r->held);
    tk_free(r->rs);
    tk_free(r->ready_msgs);
    tk_free(r->prec);
    tk_free(r);
}

/* ---- introspection ----------------------------------------------------- */

uint64_t raft_id(const struct raft *r)
{
    return r->o.id;
}
uint64_t raft_term(const struct raft *r)
{
    return r->term;
}
uint64_t raft_vote(const struct raft *r)
{
    return r->vote;
}
uint64_t raft_leader(const struct raft *r)
{
    return r->leader;
}
int raft_role(const struct raft *r)
{
    return r->role;
}
uint64_t raft_commit(const struct raft *r)
{
    return r->commit;
}
uint64_t raft_applied_index(const struct raft *r)
{
    return r->applied;
}
uint64_t raft_first_index(const struct raft *r)
{
    return r->log.base_index + 1;
}
uint64_t raft_last_index(const struct raft *r)
{
    return last_index(r);
}
uint64_t raft_stable_index(const struct raft *r)
{
    return r->stable;
}
uint64_t raft_read_rounds(const struct raft *r)
{
    return r->read_rounds;
}
uint64_t raft_acks_merged(const struct raft *r)
{
    return r->acks_merged;
}
uint64_t raft_terms_refused(const struct raft *r)
{
    return r->terms_refused;
}
const struct raft_config *raft_config(const struct raft *r)
{
    return &r->config;
}
uint64_t raft_config_index(const struct raft *r)
{
    return r->config_index;
}

int raft_config_at(const struct raft *r, uint64_t index, struct raft_config *out)
{
    TK_ASSERT(r != NULL);
    if (index < r->log.base_index)
        return TK_ECOMPACTED;
    if (index > last_index(r))
        return TK_EUNAVAIL;
    uint64_t at;
    config_at(r, index, out, &at);
    return 0;
}

int raft_catch_up(const struct raft *r, uint64_t id, struct raft_catch_up *out)
{
    TK_ASSERT(r != NULL);
    TK_ASSERT(out != NULL);
    if (r->role != RAFT_LEADER)
        return TK_ENOTLEADER;
    int s = member_slot(r, id);
    if (s < 0)
        return TK_EINVAL;
    const struct raft__progress *pr = &r->prs[s];
    memset(out, 0, sizeof(*out));
    out->match = id == r->o.id ? last_index(r) : pr->match;
    out->behind = last_index(r) - out->match;
    out->caught_up = id == r->o.id || caught_up(r, pr);
    out->rounds = pr->rounds;
    out->round_ticks = pr->round_ticks;
    return 0;
}

int raft_term_at(const struct raft *r, uint64_t index, uint64_t *term)
{
    return raft__log_term(&r->log, index, term);
}

const struct raft_entry *raft_entry_at(const struct raft *r, uint64_t index)
{
    return raft__log_at(&r->log, index);
}

int raft_progress(const struct raft *r, uint64_t peer, uint64_t *match, uint64_t *next)
{
    TK_ASSERT(r != NULL);
    if (r->role != RAFT_LEADER)
        return TK_ENOTLEADER;
    int s = member_slot(r, peer);
    if (s < 0)
        return TK_EINVAL;
    *match = r->prs[s].match;
    *next = r->prs[s].next;
    return 0;
}

const char *raft_msg_type_name(int type)
{
    static const char *const names[] = {
        "none",     "vote",        "vote_resp",  "append",          "append_resp",
        "snapshot", "timeout_now", "read_index", "read_index_resp",
    };
    if (type < 0 || type >= RAFT_MSG_TYPE_COUNT)
        return "unknown";
    return names[type];
}

const char *raft_role_name(int role)
{
    static const char *const names[] = {"follower", "pre_candidate", "candidate",
                                        "leader"};
    if (role < 0 || role > RAFT_LEADER)
        return "unknown";
    return names[role];
}
