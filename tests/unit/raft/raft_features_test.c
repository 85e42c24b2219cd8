/* The raft core's features beyond basic election and replication, against the
 * Raft thesis: check-quorum (6.2), leadership transfer (3.10), ReadIndex
 * (6.4), snapshots and log compaction (5.1, 5.2), and the configuration as
 * data in the log (4.1). Also: the core's own invariant check
 * (raft__check_invariants) aborts on a corrupted state, so it can fail. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/blob.h"
#include "base/err.h"
#include "raft/raft.h"
#include "raft/raft_internal.h"
#include "tests/check_run.h"
#include "tests/unit/raft/raft_fixture.h"

static uint64_t elect_settled(struct rf_cluster *c)
{
    uint64_t t = rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), raft_last_index(rf_raft(c, 1)));
    return t;
}

/* Every node not isolated ticks once, then the network runs; `ticks` times. */
static void lockstep(struct rf_cluster *c, int ticks)
{
    for (int i = 0; i < ticks; i++) {
        for (uint64_t id = 1; id <= c->n; id++)
            if (!c->isolated[id])
                rf_tick(c, id);
        rf_run(c);
    }
}

/* ---- check-quorum ------------------------------------------------------ */

START_TEST(test_check_quorum_isolated_leader_steps_down)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = elect_settled(c);
    const uint32_t e = c->tmpl.election_ticks;
    struct raft *r = rf_raft(c, 1);
    c->isolated[1] = true;
    uint32_t k = 0;
    while (raft_role(r) == RAFT_LEADER) {
        ck_assert_msg(k < 2 * e, "an isolated leader still leads after %u ticks", k);
        rf_tick(c, 1);
        rf_run(c);
        k++;
    }
    ck_assert_int_eq(raft_role(r), RAFT_FOLLOWER);
    ck_assert_uint_eq(raft_term(r), t); /* stepping down is no new term */
    ck_assert_uint_eq(raft_leader(r), RAFT_NONE);
    rf_free(c);
}
END_TEST

START_TEST(test_check_quorum_leader_with_majority_stays)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = elect_settled(c);
    c->isolated[3] = true;
    lockstep(c, 5 * (int)c->tmpl.election_ticks);
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(rf_raft(c, 1)), t);
    rf_free(c);
}
END_TEST

START_TEST(test_without_check_quorum_isolated_leader_stays)
{
    struct raft_options o;
    rf_options(&o);
    o.check_quorum = false;
    struct rf_cluster *c = rf_new(3, &o);
    elect_settled(c);
    c->isolated[1] = true;
    for (int i = 0; i < 5 * (int)o.election_ticks; i++) {
        rf_tick(c, 1);
        rf_run(c);
    }
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    rf_free(c);
}
END_TEST

/* ---- leadership transfer ----------------------------------------------- */

START_TEST(test_transfer_timeout_now_once_target_caught_up)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);

    /* Node 3 falls behind. */
    c->isolated[3] = true;
    ck_assert_int_eq(rf_propose(c, 1, 5, 8, NULL), 0);
    rf_run(c);
    ck_assert_uint_eq(raft_commit(r1), raft_last_index(r1));
    c->isolated[3] = false;

    ck_assert_int_eq(raft_transfer_leadership(r1, 3), 0);
    rf_drain(c, 1);
    uint64_t match = 0, next = 0;
    ck_assert_int_eq(raft_progress(r1, 3, &match, &next), 0);
    ck_assert_uint_lt(match, raft_last_index(r1));
    ck_assert_uint_eq(rf_queued_count(c, 1, 3, RAFT_MSG_TIMEOUT_NOW), 0);

    /* Proposals wait while leadership moves (3.10). */
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, NULL), TK_EBUSY);

    /* Deliver one message at a time; TimeoutNow must not leave before node 3
     * holds the leader's whole log. */
    bool sent = false;
    for (int i = 0; i < 10000 && !sent; i++) {
        if (raft_role(r1) == RAFT_LEADER &&
            rf_queued_count(c, 1, 3, RAFT_MSG_TIMEOUT_NOW) > 0) {
            ck_assert_int_eq(raft_progress(r1, 3, &match, &next), 0);
            ck_assert_uint_eq(match, raft_last_index(r1));
            sent = true;
        } else if (!rf_deliver_one(c)) {
            rf_tick(c, 1);
        }
    }
    ck_assert(sent);

    rf_run(c);
    struct raft *r3 = rf_raft(c, 3);
    ck_assert_int_eq(raft_role(r3), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(r3), t + 1);
    ck_assert_int_eq(raft_role(r1), RAFT_FOLLOWER);
    ck_assert_uint_eq(raft_leader(r1), 3);
    ck_assert_uint_eq(raft_leader(rf_raft(c, 2)), 3);
    ck_assert_uint_eq(rf_trace_count(c, 1, 3, RAFT_MSG_TIMEOUT_NOW), 1);
    /* The new leader's election was not a pre-vote round held up by the
     * peers' leader leases: its vote requests carried the transfer flag. */
    const struct raft_message *v = NULL;
    for (size_t i = 0; i < c->trace.n; i++)
        if (c->trace.v[i].from == 3 && c->trace.v[i].type == RAFT_MSG_VOTE &&
            c->trace.v[i].term == t + 1 && !c->trace.v[i].u.vote.pre_vote)
            v = &c->trace.v[i];
    ck_assert_ptr_nonnull(v);
    ck_assert(v->u.vote.transfer);

    /* The new leader serves: proposals commit in term t + 1. */
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 3, 1, 8, &idx), 0);
    rf_heartbeat_rounds(c, 3, 2);
    ck_assert_uint_ge(raft_commit(r3), idx);
    ck_assert_uint_eq(rf_term_at(c, 1, idx), t + 1);
    rf_free(c);
}
END_TEST

START_TEST(test_transfer_to_caught_up_target_wins_next_term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_int_eq(raft_transfer_leadership(r1, 2), 0);
    rf_drain(c, 1);
    ck_assert_ptr_nonnull(rf_queued_find(c, 1, 2, RAFT_MSG_TIMEOUT_NOW));
    rf_run(c);
    ck_assert_int_eq(raft_role(rf_raft(c, 2)), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(rf_raft(c, 2)), t + 1);
    for (uint64_t id = 1; id <= 3; id++)
        ck_assert_uint_eq(raft_leader(rf_raft(c, id)), 2);
    rf_free(c);
}
END_TEST

START_TEST(test_transfer_refusals_and_abort)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_int_eq(raft_transfer_leadership(rf_raft(c, 2), 3), TK_ENOTLEADER);
    ck_assert_int_eq(raft_transfer_leadership(r1, 1), TK_EINVAL);
    ck_assert_int_eq(raft_transfer_leadership(r1, 9), TK_EINVAL);

    /* An unreachable target: after an election timeout the leader gives up
     * and takes proposals again. */
    c->isolated[3] = true;
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, NULL), 0);
    rf_run(c);
    ck_assert_int_eq(raft_transfer_leadership(r1, 3), 0);
    rf_drain(c, 1);
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, NULL), TK_EBUSY);
    lockstep(c, 2 * (int)c->tmpl.election_ticks);
    ck_assert_int_eq(raft_role(r1), RAFT_LEADER);
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, NULL), 0);
    rf_free(c);
}
END_TEST

/* ---- ReadIndex --------------------------------------------------------- */

static bool drop_entry_appends(const struct raft_message *m, void *data)
{
    (void)data;
    return m->type == RAFT_MSG_APPEND && m->u.append.n_entries > 0;
}

START_TEST(test_read_index_waits_for_commit_in_term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    c->drop = drop_entry_appends; /* heartbeats pass, the no-op does not */
    rf_elect(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_uint_eq(raft_commit(r1), 0);

    ck_assert_int_eq(raft_read_index(r1, 7), 0);
    rf_drain(c, 1);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_int_eq(raft_role(r1), RAFT_LEADER);
    ck_assert_uint_eq(raft_commit(r1), 0);
    /* Thesis 6.4: until an entry of its term is committed the leader does not
     * know the commit index, so it must not hand out a read index. */
    const struct raft_read_state *rs = rf_read_state(c, 1, 7);
    ck_assert_msg(rs == NULL || rs->failed,
                  "read served at %llu before the leader committed in its term",
                  (unsigned long long)rs->index);
    bool refused = rs != NULL;

    c->drop = NULL;
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);
    uint64_t commit = raft_commit(r1);
    ck_assert_uint_ge(commit, 1);
    ck_assert_uint_eq(rf_term_at(c, 1, commit), raft_term(r1));
    if (!refused) {
        rs = rf_read_state(c, 1, 7);
        ck_assert_ptr_nonnull(rs);
        ck_assert(!rs->failed);
        ck_assert_uint_ge(rs->index, 1);
        ck_assert_uint_le(rs->index, commit);
    }

    ck_assert_int_eq(raft_read_index(r1, 8), 0);
    rf_drain(c, 1);
    rf_run(c);
    rs = rf_read_state(c, 1, 8);
    ck_assert_ptr_nonnull(rs);
    ck_assert(!rs->failed);
    ck_assert_uint_eq(rs->index, commit);
    rf_free(c);
}
END_TEST

/* Delivers every queued message from 1 to 2, then every answer from 2 to 1:
 * one heartbeat round trip with one follower. */
static void round_trip_with_2(struct rf_cluster *c)
{
    while (rf_deliver_first(c, 1, 2, RAFT_MSG_NONE))
        ;
    while (rf_deliver_first(c, 2, 1, RAFT_MSG_NONE))
        ;
}

START_TEST(test_read_index_batch_served_by_one_round)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    rf_net_clear(c);
    uint64_t commit = raft_commit(r1);

    for (uint64_t ctx = 1; ctx <= 3; ctx++)
        ck_assert_int_eq(raft_read_index(r1, ctx), 0);
    rf_drain(c, 1);
    /* Alone, the leader is no quorum of three: nothing is served yet. */
    for (uint64_t ctx = 1; ctx <= 3; ctx++)
        ck_assert_ptr_null(rf_read_state(c, 1, ctx));
    /* One round for the whole batch. */
    ck_assert_uint_eq(rf_queued_count(c, 1, 2, RAFT_MSG_APPEND), 1);
    ck_assert_uint_eq(rf_queued_count(c, 1, 3, RAFT_MSG_APPEND), 1);

    round_trip_with_2(c);
    for (uint64_t ctx = 1; ctx <= 3; ctx++) {
        const struct raft_read_state *rs = rf_read_state(c, 1, ctx);
        ck_assert_ptr_nonnull(rs);
        ck_assert(!rs->failed);
        ck_assert_uint_eq(rs->index, commit);
    }
    rf_free(c);
}
END_TEST

START_TEST(test_read_index_not_confirmed_by_earlier_round)
{
    /* A read may only be confirmed by a heartbeat round that started after
     * it arrived: an older ack proves nothing about leadership now. */
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    rf_net_clear(c);

    ck_assert_int_eq(raft_read_index(r1, 1), 0);
    rf_drain(c, 1);
    ck_assert(rf_deliver_first(c, 1, 2, RAFT_MSG_APPEND));
    /* Node 2's answer to the first round is queued; now the second read. */
    ck_assert_int_eq(raft_read_index(r1, 2), 0);
    rf_drain(c, 1);
    ck_assert(rf_deliver_first(c, 2, 1, RAFT_MSG_APPEND_RESP));
    ck_assert_ptr_nonnull(rf_read_state(c, 1, 1));
    ck_assert_ptr_null(rf_read_state(c, 1, 2));

    round_trip_with_2(c);
    const struct raft_read_state *rs = rf_read_state(c, 1, 2);
    ck_assert_ptr_nonnull(rs);
    ck_assert(!rs->failed);
    rf_free(c);
}
END_TEST

START_TEST(test_follower_read_index_through_leader)
{
    struct rf_cluster *c = rf_new(3, NULL);
    ck_assert_int_eq(raft_read_index(rf_raft(c, 2), 1), TK_ENOLEADER);
    elect_settled(c);
    ck_assert_int_eq(rf_propose(c, 1, 2, 8, NULL), 0);
    rf_run(c);
    uint64_t commit = raft_commit(rf_raft(c, 1));

    ck_assert_int_eq(raft_read_index(rf_raft(c, 2), 42), 0);
    rf_drain(c, 2);
    const struct raft_message *m = rf_queued_find(c, 2, 1, RAFT_MSG_READ_INDEX);
    ck_assert_ptr_nonnull(m);
    rf_run(c);
    const struct raft_message *resp = rf_trace_find(c, 1, 2, RAFT_MSG_READ_INDEX_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(!resp->u.read_index.reject);
    const struct raft_read_state *rs = rf_read_state(c, 2, 42);
    ck_assert_ptr_nonnull(rs);
    ck_assert(!rs->failed);
    ck_assert_uint_eq(rs->index, commit);
    /* The follower may serve once it has applied up to the read index. */
    rf_heartbeat_rounds(c, 1, 1);
    ck_assert_uint_ge(rf_node(c, 2)->applied_index, rs->index);
    rf_free(c);
}
END_TEST

/* ---- snapshots --------------------------------------------------------- */

/* A driver that frees payloads off its loop takes the compacted entries'
 * references instead of the core dropping them: the same blobs, in order,
 * each still holding the reference the log held. */
START_TEST(test_compact_take_hands_over_the_payloads)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_int_eq(rf_propose(c, 1, 10, 8, NULL), 0);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 1);
    uint64_t snap = raft_commit(r1);
    struct raft_snapshot_meta meta;
    memset(&meta, 0, sizeof(meta));
    meta.index = snap;
    meta.term = rf_term_at(c, 1, snap);
    meta.config = *raft_config(r1);
    struct tk_blob *data = tk_blob_copy("s", 1);
    ck_assert_int_eq(raft_snapshot_set(r1, &meta, data), 0);
    tk_blob_unref(data);

    uint64_t first = raft_first_index(r1), upto = snap - 2;
    ck_assert_uint_ge(upto - first + 1, 8);
    struct tk_blob *want[64], *got[64];
    uint_fast32_t refs[64];
    size_t n = 99;
    ck_assert_int_eq(raft_compact_take(r1, snap + 1, got, &n), TK_EINVAL);
    ck_assert_uint_eq(n, 0);
    for (uint64_t i = first; i <= upto; i++) {
        want[i - first] = raft_entry_at(r1, i)->data;
        refs[i - first] = want[i - first] != NULL ? tk_blob_refs(want[i - first]) : 0;
    }
    ck_assert_int_eq(raft_compact_take(r1, upto, got, &n), 0);
    ck_assert_uint_eq(n, upto - first + 1);
    ck_assert_uint_eq(raft_first_index(r1), upto + 1);
    size_t payloads = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_ptr_eq(got[i], want[i]);
        if (got[i] == NULL)
            continue;
        payloads++;
        ck_assert_uint_eq(tk_blob_refs(got[i]), refs[i]); /* handed, not dropped */
        tk_blob_unref(got[i]);
    }
    ck_assert_uint_ge(payloads, 8);
    ck_assert_int_eq(raft_compact_take(r1, upto, got, &n), 0); /* nothing left to take */
    ck_assert_uint_eq(n, 0);
    rf_free(c);
}
END_TEST

/* Three nodes, node 1 leading, node 3 cut off while node 1 commits and
 * applies 10 entries: *meta describes a snapshot at that commit index. */
static struct rf_cluster *snapshot_setup(struct raft_snapshot_meta *meta)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    struct raft *r1 = rf_raft(c, 1);
    c->isolated[3] = true;
    ck_assert_int_eq(rf_propose(c, 1, 10, 8, NULL), 0);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 1);
    uint64_t snap = raft_commit(r1);
    ck_assert_uint_eq(snap, raft_last_index(r1));
    ck_assert_uint_eq(raft_applied_index(r1), snap);
    memset(meta, 0, sizeof(*meta));
    meta->index = snap;
    meta->term = rf_term_at(c, 1, snap);
    meta->config = *raft_config(r1);
    return c;
}

START_TEST(test_snapshot_install_replaces_log_prefix)
{
    struct raft_snapshot_meta meta;
    struct rf_cluster *c = snapshot_setup(&meta);
    struct raft *r1 = rf_raft(c, 1);
    uint64_t snap = meta.index;
    static const char bytes[] = "state machine at the snapshot";
    struct tk_blob *data = tk_blob_copy(bytes, sizeof(bytes));
    struct raft_snapshot_meta bad = meta;
    bad.index = snap + 1;
    ck_assert_int_eq(raft_snapshot_set(r1, &bad, data), TK_EINVAL);
    ck_assert_int_eq(raft_snapshot_set(r1, &meta, data), 0);
    tk_blob_unref(data);
    ck_assert_int_eq(raft_compact(r1, snap + 1), TK_EINVAL);
    ck_assert_int_eq(raft_compact(r1, snap), 0);
    rf_drain(c, 1);
    ck_assert_uint_eq(raft_first_index(r1), snap + 1);
    uint64_t term = 0;
    ck_assert_int_eq(raft_term_at(r1, snap - 1, &term), TK_ECOMPACTED);
    ck_assert_int_eq(raft_term_at(r1, snap, &term), 0);
    ck_assert_uint_eq(term, meta.term);

    /* More entries after the snapshot, then node 3 comes back. */
    ck_assert_int_eq(rf_propose(c, 1, 2, 8, NULL), 0);
    rf_run(c);
    c->isolated[3] = false;
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);

    const struct raft_message *sm = rf_trace_find(c, 1, 3, RAFT_MSG_SNAPSHOT);
    ck_assert_ptr_nonnull(sm);
    ck_assert_uint_eq(sm->u.snapshot.meta.index, snap);
    struct rf_node *n3 = rf_node(c, 3);
    struct raft *r3 = rf_raft(c, 3);
    ck_assert(n3->installed_snapshot);
    ck_assert_uint_eq(n3->snap_meta.index, snap);
    ck_assert_uint_eq(n3->snap_meta.term, meta.term);
    ck_assert_uint_eq(n3->snap_meta.config.n_voters, 3);
    ck_assert_ptr_nonnull(n3->snap_data);
    ck_assert_uint_eq(n3->snap_data->len, sizeof(bytes));
    ck_assert_mem_eq(n3->snap_data->data, bytes, sizeof(bytes));

    /* Node 3's log now starts right after the snapshot. */
    ck_assert_uint_eq(raft_first_index(r3), snap + 1);
    ck_assert_int_eq(raft_term_at(r3, snap, &term), 0);
    ck_assert_uint_eq(term, meta.term);
    ck_assert_int_eq(raft_term_at(r3, snap - 1, &term), TK_ECOMPACTED);
    ck_assert_uint_eq(raft_last_index(r3), raft_last_index(r1));
    rf_assert_logs_equal(c, 1, 3, snap + 1);
    ck_assert_uint_eq(n3->store_snap_index, snap);
    ck_assert_uint_eq(raft_commit(r3), raft_commit(r1));
    ck_assert_uint_eq(n3->applied_index, raft_commit(r1));
    rf_free(c);
}
END_TEST

/* A snapshot set as a descriptor only (data NULL) compacts the log as any
 * other; a follower that then needs it gets nothing until the driver gives
 * the data, and the leader says so (raft_snapshot_wanted) meanwhile. */
START_TEST(test_snapshot_descriptor_only_is_read_when_wanted)
{
    struct raft_snapshot_meta meta;
    struct rf_cluster *c = snapshot_setup(&meta);
    struct raft *r1 = rf_raft(c, 1);
    uint64_t snap = meta.index;
    ck_assert_int_eq(raft_snapshot_set(r1, &meta, NULL), 0);
    ck_assert_int_eq(raft_compact(r1, snap), 0);
    rf_drain(c, 1);
    ck_assert(!raft_snapshot_wanted(r1)); /* nobody needs it yet */
    ck_assert_int_eq(rf_propose(c, 1, 2, 8, NULL), 0);
    rf_run(c);
    /* Node 3 cut off: heartbeats and the stall rule probe it on and on, but
     * nobody answers, so reading the state out for it would be wasted. */
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);
    ck_assert(!raft_snapshot_wanted(r1));
    c->isolated[3] = false;
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);
    ck_assert_uint_eq(rf_trace_count(c, 1, 3, RAFT_MSG_SNAPSHOT), 0);
    ck_assert(raft_snapshot_wanted(r1));
    ck_assert(!raft_snapshot_wanted(rf_raft(c, 2)));  /* a follower never asks */
    ck_assert_uint_eq(raft_leader(rf_raft(c, 3)), 1); /* no election meanwhile */

    /* The driver reads the state out and sets it at the same index. */
    static const char bytes[] = "state machine read out later";
    struct tk_blob *data = tk_blob_copy(bytes, sizeof(bytes));
    ck_assert_int_eq(raft_snapshot_set(r1, &meta, data), 0);
    tk_blob_unref(data);
    ck_assert(!raft_snapshot_wanted(r1));
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);
    const struct raft_message *sm = rf_trace_find(c, 1, 3, RAFT_MSG_SNAPSHOT);
    ck_assert_ptr_nonnull(sm);
    ck_assert_uint_eq(sm->u.snapshot.meta.index, snap);
    struct rf_node *n3 = rf_node(c, 3);
    ck_assert(n3->installed_snapshot);
    ck_assert_ptr_nonnull(n3->snap_data);
    ck_assert_mem_eq(n3->snap_data->data, bytes, sizeof(bytes));
    ck_assert_uint_eq(raft_commit(rf_raft(c, 3)), raft_commit(r1));
    ck_assert(!raft_snapshot_wanted(r1));
    rf_free(c);
}
END_TEST

/* ---- configuration ----------------------------------------------------- */

static size_t put_config(uint8_t *b, uint32_t count, const uint64_t *ids, size_t n_ids)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(count >> (8 * i));
    for (size_t k = 0; k < n_ids; k++)
        for (int i = 0; i < 8; i++)
            b[4 + 8 * k + (size_t)i] = (uint8_t)(ids[k] >> (8 * i));
    return 4 + 8 * n_ids;
}

static void expect_corrupt(const uint8_t *b, size_t len, const char *why)
{
    struct raft_config out;
    int rc = raft_config_decode(b, len, &out);
    ck_assert_msg(rc == TK_ECORRUPT, "%s: decode returned %s", why, tk_errname(rc));
}

START_TEST(test_config_decode_rejects_malformed_bytes)
{
    struct raft_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.n_voters = 3;
    cfg.voters[0] = 1;
    cfg.voters[1] = 2;
    cfg.voters[2] = UINT64_MAX;
    struct tk_blob *b = raft_config_encode(&cfg);
    ck_assert_uint_eq(b->len, 4 + 3 * 8);
    uint8_t manual[4 + 3 * 8];
    put_config(manual, 3, cfg.voters, 3);
    ck_assert_mem_eq(b->data, manual, sizeof(manual)); /* little-endian */
    struct raft_config back;
    ck_assert_int_eq(raft_config_decode(b->data, b->len, &back), 0);
    ck_assert_uint_eq(back.n_voters, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(back.voters[i], cfg.voters[i]);
    ck_assert(raft_config_has(&back, UINT64_MAX));
    ck_assert(!raft_config_has(&back, 3));

    expect_corrupt(b->data, 0, "empty");
    expect_corrupt(b->data, 3, "short count");
    expect_corrupt(b->data, b->len - 1, "truncated id");
    uint8_t longer[4 + 3 * 8 + 1];
    memcpy(longer, b->data, b->len);
    longer[b->len] = 0;
    expect_corrupt(longer, sizeof(longer), "trailing byte");
    tk_blob_unref(b);

    uint8_t buf[4 + 8 * (RAFT_VOTERS_MAX + 1)];
    size_t len = put_config(buf, 0, NULL, 0);
    expect_corrupt(buf, len, "count 0");

    uint64_t ids[RAFT_VOTERS_MAX + 1];
    for (uint64_t i = 0; i <= RAFT_VOTERS_MAX; i++)
        ids[i] = i + 1;
    len = put_config(buf, RAFT_VOTERS_MAX + 1, ids, RAFT_VOTERS_MAX + 1);
    expect_corrupt(buf, len, "too many voters");
    len = put_config(buf, RAFT_VOTERS_MAX, ids, RAFT_VOTERS_MAX);
    ck_assert_int_eq(raft_config_decode(buf, len, &back), 0);
    ck_assert_uint_eq(back.n_voters, RAFT_VOTERS_MAX);

    len = put_config(buf, 3, ids, 2);
    expect_corrupt(buf, len, "count larger than the ids");
    len = put_config(buf, 0xffffffffu, ids, 2);
    expect_corrupt(buf, len, "huge count");

    const uint64_t zero[] = {1, 0, 3};
    len = put_config(buf, 3, zero, 3);
    expect_corrupt(buf, len, "zero id");
    const uint64_t dup[] = {1, 2, 1};
    len = put_config(buf, 3, dup, 3);
    expect_corrupt(buf, len, "duplicate id");
}
END_TEST

START_TEST(test_propose_refusals)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    ck_assert_int_eq(rf_propose(c, 2, 1, 8, NULL), TK_ENOTLEADER);
    ck_assert_int_eq(rf_propose(c, 1, 0, 8, NULL), TK_EINVAL);
    struct raft_config cfg = *raft_config(rf_raft(c, 1));
    struct raft_entry e;
    memset(&e, 0, sizeof(e));
    e.type = RAFT_ENTRY_CONFIG;
    e.data = raft_config_encode(&cfg);
    uint64_t first = 0, term = 0;
    ck_assert_int_eq(raft_propose(rf_raft(c, 1), &e, 1, &first, &term), TK_EINVAL);
    tk_blob_unref(e.data);
    rf_free(c);
}
END_TEST

/* ---- the invariant check can fail ------------------------------------- */

/* Each case corrupts one field of a settled leader (node 1 of three) and then
 * makes one ordinary call; the check at the end of that call must abort and
 * name the broken invariant. Case 0 corrupts nothing: the child must exit. */
struct corruption {
    const char *what; /* the failed expression, as TK_ASSERT prints it */
    int call;         /* 0: raft_tick, 1: raft_step, 2: raft_ready/advance */
};

static const struct corruption corruptions[] = {
    {NULL, 1},
    {"r->stable <= last", 0},
    {"r->applying <= r->commit", 1},
    {"r->applied <= r->applying", 2},
    {"r->vote == r->o.id", 1},
    {"pr->match < pr->next", 0},
    {"l->ents[l->head + l->n - 1].index == l->base_index + l->n", 2},
    {"r->term <= RAFT_TERM_CEIL", 2},
};

static void corrupt(struct raft *r, int k)
{
    switch (k) {
    case 1:
        r->stable = raft__log_last_index(&r->log) + 1;
        break;
    case 2:
        r->applying = r->commit + 1;
        break;
    case 3:
        r->applied = r->applying + 1;
        break;
    case 4:
        r->vote = 3;
        break;
    case 5:
        r->prs[1].match = r->prs[1].next;
        break;
    case 6:
        r->log.ents[r->log.head + r->log.n - 1].index++;
        break;
    case 7:
        r->term = RAFT_TERM_CEIL + 1;
        break;
    default:
        break;
    }
}

static void corrupt_and_call(struct rf_cluster *c, int k)
{
    struct raft *r = rf_raft(c, 1);
    corrupt(r, k);
    if (corruptions[k].call == 0) {
        raft_tick(r);
    } else if (corruptions[k].call == 1) {
        struct raft_message m = rf_msg(RAFT_MSG_READ_INDEX_RESP, 2, 1, raft_term(r));
        raft_step(r, &m);
    } else {
        struct raft_ready rd;
        raft_ready(r, &rd);
        raft_advance(r, &rd);
    }
}

/* Runs case `k` in a child with stderr captured; returns the wait status. */
static int run_corrupted(struct rf_cluster *c, int k, char *err, size_t cap)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        corrupt_and_call(c, k);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (len < cap - 1 && (n = read(fds[0], err + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    err[len] = '\0';
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

START_TEST(test_invariant_check_aborts_on_a_corrupted_state)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    ck_assert_uint_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    for (int k = 0; k < (int)(sizeof(corruptions) / sizeof(corruptions[0])); k++) {
        char err[1024];
        int st = run_corrupted(c, k, err, sizeof(err));
        if (corruptions[k].what == NULL) {
            ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                          "an intact state failed the check: %s", err);
            continue;
        }
        ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                      "case %d (%s): the check did not abort", k, corruptions[k].what);
        ck_assert_msg(strstr(err, corruptions[k].what) != NULL,
                      "case %d: expected \"%s\" in: %s", k, corruptions[k].what, err);
        ck_assert_msg(strstr(err, "check.c") != NULL, "case %d: not from check.c: %s", k,
                      err);
    }
    rf_free(c);
}
END_TEST

static Suite *features_suite(void)
{
    Suite *s = suite_create("raft_features");
    TCase *tc = tcase_create("features");
    tcase_add_test(tc, test_check_quorum_isolated_leader_steps_down);
    tcase_add_test(tc, test_check_quorum_leader_with_majority_stays);
    tcase_add_test(tc, test_without_check_quorum_isolated_leader_stays);
    tcase_add_test(tc, test_transfer_timeout_now_once_target_caught_up);
    tcase_add_test(tc, test_transfer_to_caught_up_target_wins_next_term);
    tcase_add_test(tc, test_transfer_refusals_and_abort);
    tcase_add_test(tc, test_read_index_waits_for_commit_in_term);
    tcase_add_test(tc, test_read_index_batch_served_by_one_round);
    tcase_add_test(tc, test_read_index_not_confirmed_by_earlier_round);
    tcase_add_test(tc, test_follower_read_index_through_leader);
    tcase_add_test(tc, test_compact_take_hands_over_the_payloads);
    tcase_add_test(tc, test_snapshot_install_replaces_log_prefix);
    tcase_add_test(tc, test_snapshot_descriptor_only_is_read_when_wanted);
    tcase_add_test(tc, test_config_decode_rejects_malformed_bytes);
    tcase_add_test(tc, test_propose_refusals);
    tcase_add_test(tc, test_invariant_check_aborts_on_a_corrupted_state);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(features_suite()));
}
