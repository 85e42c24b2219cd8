/* Membership changes in the raft core (thesis ch. 4, single-server changes):
 * learners, promotion and demotion, removal, one change at a time, the own-term
 * commit before a change (Ongaro, raft-dev, July 2015), the removed leader's
 * step-down, non-members that cannot disrupt a cluster, the snapshot's
 * configuration and the configuration payload's two formats. The cases of
 * etcd-io/raft's confchange test data are here in our own words: simple_safety
 * (one voter change at a time; a learner is promoted, not added twice),
 * joint_safety (not applicable to single-server changes: a second change is
 * refused while one is pending), simple_promote_demote, and
 * joint_learners_next (a demoted voter is a learner from when the entry is
 * appended). */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/err.h"
#include "raft/raft.h"
#include "tests/check_run.h"
#include "tests/unit/raft/raft_fixture.h"

static void elect_settled(struct rf_cluster *c, uint64_t id)
{
    rf_elect(c, id);
    rf_heartbeat_rounds(c, id, 2);
    ck_assert_uint_eq(raft_commit(rf_raft(c, id)), raft_last_index(rf_raft(c, id)));
}

static int change(struct rf_cluster *c, uint64_t leader, uint8_t type, uint64_t id,
                  uint64_t *index)
{
    struct raft_change ch = {.type = type, .id = id};
    int rc = raft_change_membership(rf_raft(c, leader), &ch, index);
    rf_drain(c, leader);
    return rc;
}

/* Adds `id` as a learner, lets it catch up and commits the change. */
static void add_learner(struct rf_cluster *c, uint64_t leader, uint64_t id)
{
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, leader, RAFT_CHANGE_ADD_LEARNER, id, &idx), 0);
    rf_heartbeat_rounds(c, leader, 3);
    ck_assert_uint_ge(raft_commit(rf_raft(c, leader)), idx);
}

START_TEST(test_add_learner_then_promote)
{
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, &idx), 0);
    ck_assert_uint_eq(idx, raft_last_index(r1));
    /* In force at once on the leader, before it commits. */
    ck_assert(raft_config_has_learner(raft_config(r1), 4));
    ck_assert_uint_eq(raft_config(r1)->n_voters, 3);
    ck_assert_uint_eq(raft_config_index(r1), idx);
    /* joint_safety, single-server style: a second change waits. */
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 3, NULL), RAFT_ECHANGE_PENDING);
    ck_assert_uint_eq(raft_last_index(r1), idx); /* nothing appended */
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_ge(raft_commit(r1), idx);
    for (uint64_t id = 1; id <= 4; id++)
        ck_assert(raft_config_has_learner(raft_config(rf_raft(c, id)), 4));
    /* simple_safety: an id that is a member cannot be added again. */
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, NULL), RAFT_EMEMBER);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 2, NULL), RAFT_EMEMBER);

    struct raft_catch_up cu;
    ck_assert_int_eq(raft_catch_up(r1, 4, &cu), 0);
    ck_assert(cu.caught_up);
    ck_assert_uint_eq(cu.behind, 0);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 4, &idx), 0);
    ck_assert(raft_config_has(raft_config(r1), 4));
    ck_assert(!raft_config_has_learner(raft_config(r1), 4));
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_ge(raft_commit(r1), idx);
    /* A retried promote is idempotent: 0, no new entry. */
    uint64_t last = raft_last_index(r1), again = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 4, &again), 0);
    ck_assert_uint_eq(raft_last_index(r1), last);
    ck_assert_uint_eq(again, idx);
    /* Four voters now: a quorum is three. */
    c->isolated[3] = true;
    c->isolated[4] = true;
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, &first), 0);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_lt(raft_commit(r1), first);
    c->isolated[4] = false;
    rf_heartbeat_rounds(c, 1, 2 * (int)c->tmpl.election_ticks);
    ck_assert_uint_ge(raft_commit(r1), first);
    rf_free(c);
}
END_TEST

static bool drop_append_resp(const struct raft_message *m, void *data)
{
    (void)data;
    return m->type == RAFT_MSG_APPEND_RESP;
}

START_TEST(test_change_refused_until_own_term_commit)
{
    /* The scenario Ongaro reported: a new leader must not append a change
     * before an entry of its term commits (the no-op does that). */
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    c->drop = drop_append_resp;
    rf_elect(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_uint_lt(raft_commit(r1), raft_last_index(r1));
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, NULL),
                     RAFT_ECHANGE_PENDING);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 3, NULL), RAFT_ECHANGE_PENDING);
    c->drop = NULL;
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_eq(raft_commit(r1), raft_last_index(r1));
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, NULL), 0);
    rf_free(c);
}
END_TEST

START_TEST(test_promote_refused_until_caught_up)
{
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    c->isolated[4] = true;
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, &idx), 0);
    ck_assert_int_eq(rf_propose(c, 1, 20, 8, NULL), 0);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_ge(raft_commit(r1), idx); /* learner 4 counts for nothing */
    struct raft_catch_up cu;
    ck_assert_int_eq(raft_catch_up(r1, 4, &cu), 0);
    ck_assert(!cu.caught_up);
    ck_assert_uint_eq(cu.behind, raft_last_index(r1));
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 4, NULL), RAFT_ENOT_CAUGHT_UP);
    ck_assert(raft_config_has_learner(raft_config(r1), 4));
    /* A learner cannot be handed the leadership either. */
    ck_assert_int_eq(raft_transfer_leadership(r1, 4), TK_EINVAL);
    ck_assert_int_eq(raft_catch_up(r1, 9, &cu), TK_EINVAL);
    ck_assert_int_eq(raft_catch_up(rf_raft(c, 2), 4, &cu), TK_ENOTLEADER);
    c->isolated[4] = false;
    rf_heartbeat_rounds(c, 1, 4);
    ck_assert_int_eq(raft_catch_up(r1, 4, &cu), 0);
    ck_assert(cu.caught_up);
    ck_assert_uint_eq(cu.behind, 0);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 4, NULL), 0);
    rf_free(c);
}
END_TEST

START_TEST(test_promote_demote_and_learner_from_append)
{
    /* simple_promote_demote and joint_learners_next: voter 3 is demoted; it is
     * a learner from when the entry is appended, on the leader and on a
     * follower, committed or not; then promoted back. */
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_DEMOTE, 3, &idx), 0);
    ck_assert(raft_config_has_learner(raft_config(r1), 3));
    ck_assert(!raft_config_has(raft_config(r1), 3));
    ck_assert_uint_eq(raft_config(r1)->n_voters, 2);
    /* Deliver the append to node 2 only: its configuration changes with the
     * append, before any commit. */
    ck_assert(rf_deliver_first(c, 1, 2, RAFT_MSG_APPEND));
    struct raft *r2 = rf_raft(c, 2);
    ck_assert_uint_eq(raft_last_index(r2), idx);
    ck_assert_uint_lt(raft_commit(r2), idx);
    ck_assert(raft_config_has_learner(raft_config(r2), 3));
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_ge(raft_commit(r1), idx);
    /* A demoted voter never campaigns. */
    struct raft *r3 = rf_raft(c, 3);
    for (int i = 0; i < 50; i++)
        rf_tick(c, 3);
    ck_assert_int_eq(raft_role(r3), RAFT_FOLLOWER);
    /* Demoting a learner again is idempotent; the last voters cannot all go. */
    uint64_t last = raft_last_index(r1);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_DEMOTE, 3, NULL), 0);
    ck_assert_uint_eq(raft_last_index(r1), last);
    rf_net_clear(c);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 3, &idx), 0);
    ck_assert(raft_config_has(raft_config(r1), 3));
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_ge(raft_commit(r1), idx);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 9, NULL), TK_EINVAL);
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_PROMOTE, 9, NULL), TK_EINVAL);
    ck_assert_int_eq(change(c, 1, 77, 3, NULL), TK_EINVAL);
    ck_assert_int_eq(change(c, 2, RAFT_CHANGE_REMOVE, 3, NULL), TK_ENOTLEADER);
    rf_free(c);
}
END_TEST

START_TEST(test_truncated_config_falls_back)
{
    /* A configuration in force from its append is undone with it. */
    struct rf_cluster *c = rf_new(5, NULL);
    elect_settled(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 5, &idx), 0);
    ck_assert(rf_deliver_first(c, 1, 2, RAFT_MSG_APPEND));
    struct raft *r2 = rf_raft(c, 2);
    ck_assert(!raft_config_has(raft_config(r2), 5));
    rf_net_clear(c);
    c->isolated[1] = true;
    c->isolated[2] = true;
    for (uint32_t i = 0; i < c->tmpl.election_ticks; i++) {
        rf_tick(c, 4); /* their leader's lease runs out */
        rf_tick(c, 5);
    }
    rf_elect(c, 3);
    rf_heartbeat_rounds(c, 3, 2);
    c->isolated[2] = false;
    rf_heartbeat_rounds(c, 3, 3);
    ck_assert(raft_config_has(raft_config(r2), 5));
    ck_assert_uint_eq(raft_config(r2)->n_voters, 5);
    ck_assert_uint_ne(rf_term_at(c, 2, idx), rf_term_at(c, 1, idx));
    rf_free(c);
}
END_TEST

START_TEST(test_removed_leader_steps_down_after_commit)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 1, &idx), 0);
    /* Still leading (and replicating) until the change commits. */
    ck_assert_int_eq(raft_role(r1), RAFT_LEADER);
    ck_assert(!raft_config_has(raft_config(r1), 1));
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, &first), 0);
    ck_assert_uint_lt(raft_commit(r1), idx);
    rf_run(c);
    ck_assert_uint_ge(raft_commit(r1), idx);
    ck_assert_int_eq(raft_role(r1), RAFT_FOLLOWER);
    /* The others learned the commit from the last heartbeat. */
    ck_assert_uint_ge(raft_commit(rf_raft(c, 2)), idx);
    /* It never campaigns again; the remaining two elect a leader. */
    for (int i = 0; i < 50; i++)
        rf_tick(c, 1);
    ck_assert_int_eq(raft_role(r1), RAFT_FOLLOWER);
    ck_assert_uint_eq(rf_queued_count(c, 1, 0, RAFT_MSG_VOTE), 0);
    rf_net_clear(c);
    for (uint32_t i = 0; i < c->tmpl.election_ticks; i++)
        rf_tick(c, 3); /* its leader's lease runs out */
    rf_elect(c, 2);
    ck_assert_int_eq(rf_propose(c, 2, 1, 8, &first), 0);
    rf_heartbeat_rounds(c, 2, 2);
    ck_assert_uint_ge(raft_commit(rf_raft(c, 2)), first);
    rf_free(c);
}
END_TEST

START_TEST(test_leader_lost_before_its_removal_commits)
{
    /* {1, 2}: leader 1 removes itself, and loses its leadership before node 2
     * has the entry. Node 2 (config {1, 2}) needs node 1's vote, which its
     * shorter log cannot get; node 1 (config {2}) must still campaign, since
     * the committed configuration has it as a voter: it wins with node 2's
     * vote, commits its removal, steps down, and node 2 leads alone. */
    struct rf_cluster *c = rf_new(2, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_REMOVE, 1, &idx), 0);
    rf_net_clear(c);
    c->isolated[1] = true;
    for (uint32_t i = 0; i < 2 * c->tmpl.election_ticks; i++)
        rf_tick(c, 1); /* check-quorum: no contact with voter 2 */
    ck_assert_int_ne(raft_role(r1), RAFT_LEADER);
    rf_net_clear(c);
    c->isolated[1] = false;
    for (int i = 0; i < 40 * (int)c->tmpl.election_ticks; i++) {
        rf_tick(c, 1);
        rf_tick(c, 2);
        rf_run(c);
        if (raft_role(r2) == RAFT_LEADER)
            break;
    }
    ck_assert_int_eq(raft_role(r2), RAFT_LEADER);
    ck_assert_uint_ge(raft_commit(r2), idx);
    ck_assert_uint_eq(raft_config(r2)->n_voters, 1);
    ck_assert_int_eq(raft_role(r1), RAFT_FOLLOWER);
    rf_free(c);
}
END_TEST

START_TEST(test_learner_never_campaigns_and_does_not_count)
{
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    elect_settled(c, 1);
    add_learner(c, 1, 4);
    struct raft *r1 = rf_raft(c, 1);
    struct raft *r4 = rf_raft(c, 4);
    for (int i = 0; i < 60; i++)
        rf_tick(c, 4);
    ck_assert_int_eq(raft_role(r4), RAFT_FOLLOWER);
    ck_assert_uint_eq(rf_queued_count(c, 4, 0, RAFT_MSG_VOTE), 0);
    ck_assert_uint_eq(rf_trace_count(c, 4, 0, RAFT_MSG_VOTE), 0);
    /* TimeoutNow makes a voter campaign; a learner ignores it. */
    struct raft_message tn = rf_msg(RAFT_MSG_TIMEOUT_NOW, 1, 4, raft_term(r1));
    rf_step(c, &tn);
    ck_assert_int_eq(raft_role(r4), RAFT_FOLLOWER);
    rf_net_clear(c);
    /* Only the learner acknowledges: nothing commits. */
    c->isolated[2] = true;
    c->isolated[3] = true;
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 2, 8, &first), 0);
    rf_heartbeat_rounds(c, 1, 3);
    uint64_t match = 0, next = 0;
    ck_assert_int_eq(raft_progress(r1, 4, &match, &next), 0);
    ck_assert_uint_eq(match, raft_last_index(r1));
    ck_assert_uint_lt(raft_commit(r1), first);
    rf_free(c);
}
END_TEST

START_TEST(test_non_member_vote_does_not_disrupt)
{
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    elect_settled(c, 1);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t term = raft_term(r2);
    for (int pre = 0; pre <= 1; pre++) {
        /* from 4: a spare core, not a member */
        struct raft_message v = rf_msg(RAFT_MSG_VOTE, 4, 2, term + 5);
        v.u.vote.last_log_index = 1000;
        v.u.vote.last_log_term = term + 4;
        v.u.vote.pre_vote = pre;
        rf_step(c, &v);
        ck_assert_uint_eq(raft_term(r2), term);
        ck_assert_uint_eq(raft_leader(r2), 1);
        ck_assert_uint_eq(raft_vote(r2), 1);
        ck_assert_uint_eq(rf_queued_count(c, 2, 4, RAFT_MSG_VOTE_RESP), 0);
    }
    /* The same from a learner. */
    add_learner(c, 1, 4);
    struct raft_message v = rf_msg(RAFT_MSG_VOTE, 4, 3, term + 5);
    v.u.vote.last_log_index = 1000;
    v.u.vote.last_log_term = term + 4;
    rf_step(c, &v);
    ck_assert_uint_eq(raft_term(rf_raft(c, 3)), term);
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    rf_free(c);
}
END_TEST

START_TEST(test_snapshot_carries_config_at_its_index)
{
    struct rf_cluster *c = rf_new_spare(4, 3, NULL);
    elect_settled(c, 1);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_int_eq(rf_propose(c, 1, 5, 8, NULL), 0);
    rf_heartbeat_rounds(c, 1, 2);
    uint64_t snap = raft_commit(r1);
    ck_assert_uint_eq(raft_applied_index(r1), snap);
    c->isolated[4] = true;
    uint64_t idx = 0;
    ck_assert_int_eq(change(c, 1, RAFT_CHANGE_ADD_LEARNER, 4, &idx), 0);
    ck_assert_uint_eq(idx, snap + 1);
    rf_heartbeat_rounds(c, 1, 2);
    /* The caller reads the newest configuration, which has learner 4; the
     * snapshot at `snap` must not. */
    struct raft_snapshot_meta meta;
    memset(&meta, 0, sizeof(meta));
    meta.index = snap;
    meta.term = rf_term_at(c, 1, snap);
    meta.config = *raft_config(r1);
    ck_assert_uint_eq(meta.config.n_learners, 1);
    struct raft_config at;
    ck_assert_int_eq(raft_config_at(r1, snap, &at), 0);
    ck_assert_uint_eq(at.n_learners, 0);
    ck_assert_uint_eq(at.n_voters, 3);
    ck_assert_int_eq(raft_config_at(r1, idx, &at), 0);
    ck_assert(raft_config_has_learner(&at, 4));
    struct tk_blob *data = tk_blob_copy("sm", 2);
    ck_assert_int_eq(raft_snapshot_set(r1, &meta, data), 0);
    tk_blob_unref(data);
    ck_assert_int_eq(raft_compact(r1, snap), 0);
    ck_assert_int_eq(raft_config_at(r1, snap - 1, &at), TK_ECOMPACTED);
    ck_assert(raft_config_has_learner(raft_config(r1), 4)); /* still in force */
    c->isolated[4] = false;
    rf_heartbeat_rounds(c, 1, 3 * (int)c->tmpl.election_ticks);
    const struct raft_message *sm = rf_trace_find(c, 1, 4, RAFT_MSG_SNAPSHOT);
    ck_assert_ptr_nonnull(sm);
    ck_assert_uint_eq(sm->u.snapshot.meta.config.n_learners, 0);
    struct rf_node *n4 = rf_node(c, 4);
    ck_assert(n4->installed_snapshot);
    ck_assert_uint_eq(n4->snap_meta.config.n_voters, 3);
    ck_assert_uint_eq(n4->snap_meta.config.n_learners, 0);
    /* Then the entry that added it: node 4 knows it is a learner. */
    ck_assert(raft_config_has_learner(raft_config(rf_raft(c, 4)), 4));
    ck_assert_uint_eq(raft_last_index(rf_raft(c, 4)), raft_last_index(r1));
    rf_free(c);
}
END_TEST

/* A snapshot whose configuration names an id twice, or id 0, is input from a peer:
 * the follower refuses it (nothing installed) and never aborts on it. */
START_TEST(test_snapshot_with_malformed_config_is_refused)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c, 1);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t commit = raft_commit(r2);
    static const uint64_t bad[][3] = {{1, 1, 2}, {1, 0, 2}};
    for (size_t k = 0; k < 2; k++) {
        struct raft_message m = rf_msg(RAFT_MSG_SNAPSHOT, 1, 2, raft_term(r2));
        m.u.snapshot.meta.index = commit + 100;
        m.u.snapshot.meta.term = raft_term(r2);
        m.u.snapshot.meta.config.n_voters = 3;
        memcpy(m.u.snapshot.meta.config.voters, bad[k], sizeof(bad[k]));
        m.u.snapshot.done = true;
        m.u.snapshot.data = tk_blob_copy("sm", 2);
        raft_step(r2, &m);
        tk_blob_unref(m.u.snapshot.data);
        ck_assert_uint_eq(raft_commit(r2), commit);
        ck_assert_uint_eq(raft_last_index(r2), raft_last_index(rf_raft(c, 1)));
    }
    rf_free(c);
}
END_TEST

/* A snapshot from the leader that replaces a follower's log hands the
 * replaced entries to the driver (raft_take_dropped) instead of dropping their
 * payloads inside raft_step: a node frees them on its thread pool, not on its
 * loop. The core keeps its reference on each payload until the driver frees
 * what it took; raft_free frees one the driver never took. */
static struct raft_message snapshot_over(struct raft *r, uint64_t index)
{
    struct raft_message m = rf_msg(RAFT_MSG_SNAPSHOT, 1, raft_id(r), raft_term(r));
    m.u.snapshot.meta.index = index;
    m.u.snapshot.meta.term = raft_term(r);
    m.u.snapshot.meta.config.n_voters = 3;
    for (uint64_t i = 0; i < 3; i++)
        m.u.snapshot.meta.config.voters[i] = i + 1;
    m.u.snapshot.done = true;
    m.u.snapshot.data = tk_blob_copy("sm", 2);
    return m;
}

static uint32_t refs_of(struct tk_blob *b)
{
    return tk_blob_refs(b);
}

START_TEST(test_snapshot_hands_the_replaced_log_to_the_driver)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c, 1);
    ck_assert_int_eq(rf_propose(c, 1, 50, 64, NULL), 0);
    rf_run(c);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t last = raft_last_index(r2), first = raft_first_index(r2);
    ck_assert_uint_ge(last - first + 1, 50);
    struct tk_blob *b = raft_entry_at(r2, last)->data;
    ck_assert_ptr_nonnull(b);
    tk_blob_ref(b);
    uint32_t refs = refs_of(b);

    struct raft_dropped d;
    ck_assert(!raft_take_dropped(r2, &d)); /* nothing replaced yet */
    struct raft_message m = snapshot_over(r2, last + 100);
    raft_step(r2, &m);
    tk_blob_unref(m.u.snapshot.data);
    ck_assert_uint_eq(raft_first_index(r2), last + 101); /* installed */
    ck_assert_uint_eq(refs_of(b), refs);                 /* not dropped in the step */
    ck_assert(raft_take_dropped(r2, &d));
    ck_assert_uint_eq(d.n, last - first + 1);
    ck_assert_ptr_eq(d.ents[d.head + d.n - 1].data, b);
    struct raft_dropped again;
    ck_assert(!raft_take_dropped(r2, &again)); /* taken once */
    raft_dropped_free(&d);
    ck_assert_uint_eq(refs_of(b), refs - 1);
    tk_blob_unref(b);

    /* Node 3's log replaced too, never taken: rf_free (raft_free) frees it,
     * or the sanitizer build's leak check fails. */
    struct raft *r3 = rf_raft(c, 3);
    m = snapshot_over(r3, raft_last_index(r3) + 100);
    raft_step(r3, &m);
    tk_blob_unref(m.u.snapshot.data);
    rf_free(c);
}
END_TEST

START_TEST(test_config_encoding_both_formats)
{
    struct raft_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.n_voters = 2;
    cfg.voters[0] = 1;
    cfg.voters[1] = 2;
    struct tk_blob *b = raft_config_encode(&cfg);
    ck_assert_uint_eq(b->len, 4 + 2 * 8); /* no learner: the old format */
    tk_blob_unref(b);
    cfg.n_learners = 2;
    cfg.learners[0] = 7;
    cfg.learners[1] = UINT64_MAX;
    b = raft_config_encode(&cfg);
    ck_assert_uint_eq(b->len, 12 + 4 * 8);
    struct raft_config back;
    ck_assert_int_eq(raft_config_decode(b->data, b->len, &back), 0);
    ck_assert(raft_config_equal(&cfg, &back));
    ck_assert(raft_config_has_learner(&back, UINT64_MAX));
    ck_assert(!raft_config_has(&back, 7));
    ck_assert(raft_config_is_member(&back, 7));
    ck_assert_int_eq(raft_config_decode(b->data, b->len - 1, &back), TK_ECORRUPT);
    ck_assert_int_eq(raft_config_decode(b->data, 11, &back), TK_ECORRUPT);
    /* A learner that is also a voter, no voter, too many learners. */
    uint8_t *p = b->data;
    uint8_t save[8];
    memcpy(save, p + 12 + 16, 8);
    memcpy(p + 12 + 16, p + 12, 8);
    ck_assert_int_eq(raft_config_decode(p, b->len, &back), TK_ECORRUPT);
    memcpy(p + 12 + 16, save, 8);
    p[4] = 0;
    ck_assert_int_eq(raft_config_decode(p, b->len, &back), TK_ECORRUPT);
    p[4] = 2;
    ck_assert_int_eq(raft_config_decode(p, b->len, &back), 0);
    p[8] = RAFT_LEARNERS_MAX + 1;
    ck_assert_int_eq(raft_config_decode(p, b->len, &back), TK_ECORRUPT);
    tk_blob_unref(b);
}
END_TEST

static Suite *membership_suite(void)
{
    Suite *s = suite_create("raft_membership");
    TCase *tc = tcase_create("membership");
    tcase_add_test(tc, test_add_learner_then_promote);
    tcase_add_test(tc, test_change_refused_until_own_term_commit);
    tcase_add_test(tc, test_promote_refused_until_caught_up);
    tcase_add_test(tc, test_promote_demote_and_learner_from_append);
    tcase_add_test(tc, test_truncated_config_falls_back);
    tcase_add_test(tc, test_removed_leader_steps_down_after_commit);
    tcase_add_test(tc, test_leader_lost_before_its_removal_commits);
    tcase_add_test(tc, test_learner_never_campaigns_and_does_not_count);
    tcase_add_test(tc, test_non_member_vote_does_not_disrupt);
    tcase_add_test(tc, test_snapshot_carries_config_at_its_index);
    tcase_add_test(tc, test_config_encoding_both_formats);
    tcase_add_test(tc, test_snapshot_with_malformed_config_is_refused);
    tcase_add_test(tc, test_snapshot_hands_the_replaced_log_to_the_driver);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(membership_suite()));
}
