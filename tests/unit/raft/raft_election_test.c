/* Leader election in the raft core, against the Raft paper (section 5.2,
 * 5.4.1, Figure 2 "RequestVote RPC" and "Rules for Servers") and the thesis
 * (3.8 durability, 9.6 pre-vote, 4.2.3 disruptive servers).
 *
 * Each test drives cores through the fixture in raft_fixture.h and compares
 * the messages they emit and the state they persist with the paper's rules. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "raft/raft.h"
#include "tests/check_run.h"
#include "tests/unit/raft/raft_fixture.h"

static struct raft_message vote_msg(uint64_t from, uint64_t to, uint64_t term,
                                    uint64_t last_index, uint64_t last_term)
{
    struct raft_message m = rf_msg(RAFT_MSG_VOTE, from, to, term);
    m.u.vote.last_log_index = last_index;
    m.u.vote.last_log_term = last_term;
    return m;
}

/* Node 2 of three, booted with log terms [1, 1, 2] at term 2, is asked for
 * its vote in term 3 by node 1 whose last entry is (last_index, last_term).
 * Returns whether the vote was granted, after checking the response. */
static bool vote_on(uint64_t last_index, uint64_t last_term)
{
    static const uint64_t terms[] = {1, 1, 2};
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 2, 2, RAFT_NONE, terms, 3);

    struct raft_message m = vote_msg(1, 2, 3, last_index, last_term);
    ck_assert_int_eq(rf_step(c, &m), 0);

    struct raft *r = rf_raft(c, 2);
    ck_assert_uint_eq(raft_term(r), 3);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.term, 3);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_VOTE_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert_uint_eq(resp->term, 3);
    ck_assert(!resp->u.vote_resp.pre_vote);
    bool granted = resp->u.vote_resp.granted;
    ck_assert_uint_eq(raft_vote(r), granted ? 1 : RAFT_NONE);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.vote, granted ? 1 : RAFT_NONE);
    ck_assert_int_eq(raft_role(r), RAFT_FOLLOWER);
    rf_free(c);
    return granted;
}

START_TEST(test_vote_granted_to_up_to_date_candidate)
{
    ck_assert_msg(vote_on(3, 2), "same last entry");
    ck_assert_msg(vote_on(7, 2), "same last term, longer log");
    ck_assert_msg(vote_on(2, 3), "higher last term, shorter log");
}
END_TEST

START_TEST(test_vote_refused_for_lower_last_term)
{
    ck_assert_msg(!vote_on(9, 1), "lower last term, longer log");
    ck_assert_msg(!vote_on(0, 0), "empty log");
}
END_TEST

START_TEST(test_vote_refused_for_same_term_shorter_log)
{
    ck_assert(!vote_on(2, 2));
}
END_TEST

START_TEST(test_vote_refused_when_already_voted_for_another)
{
    struct rf_cluster *c = rf_new(3, NULL);
    struct raft *r = rf_raft(c, 2);

    struct raft_message m = vote_msg(1, 2, 1, 0, 0);
    rf_step(c, &m);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_VOTE_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(resp->u.vote_resp.granted);
    ck_assert_uint_eq(raft_vote(r), 1);

    /* Node 3 is just as up to date, in the same term: one vote per term. */
    m = vote_msg(3, 2, 1, 0, 0);
    rf_step(c, &m);
    resp = rf_queued_find(c, 2, 3, RAFT_MSG_VOTE_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(!resp->u.vote_resp.granted);
    ck_assert_uint_eq(raft_vote(r), 1);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.vote, 1);

    /* The candidate it voted for may ask again (a lost response). */
    rf_net_clear(c);
    m = vote_msg(1, 2, 1, 0, 0);
    rf_step(c, &m);
    resp = rf_queued_find(c, 2, 1, RAFT_MSG_VOTE_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(resp->u.vote_resp.granted);
    rf_free(c);
}
END_TEST

/* Node 2 of three, booted at term 5 without a vote, with log terms [1, 1, 2],
 * is asked by node 1 for a vote (or a pre-vote) in term 4 with a log more up
 * to date than its own: only the stale term can refuse it.
 * Figure 2, RequestVote receiver rule 1: "Reply false if term < currentTerm".
 * Checks that nothing was granted and the voter's term, vote and persisted
 * hard state are untouched; returns the response, or NULL if none was sent.
 *
 * Either way the refusal carries the voter's term, so a stale candidate or
 * pre-candidate learns of it and steps down instead of waiting out its
 * election timeout. */
static const struct raft_message *stale_vote(struct rf_cluster *c, bool pre_vote)
{
    static const uint64_t terms[] = {1, 1, 2};
    rf_boot_log(c, 2, 5, RAFT_NONE, terms, 3);
    struct raft *r = rf_raft(c, 2);

    struct raft_message m = vote_msg(1, 2, 4, 10, 4);
    m.u.vote.pre_vote = pre_vote;
    ck_assert_int_eq(rf_step(c, &m), 0);

    ck_assert_uint_eq(raft_term(r), 5);
    ck_assert_uint_eq(raft_vote(r), RAFT_NONE);
    ck_assert_int_eq(raft_role(r), RAFT_FOLLOWER);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.term, 5);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.vote, RAFT_NONE);
    ck_assert_uint_eq(rf_store_last_index(c, 2), 3);
    /* A refusal may be sent at once: nobody relies on it (thesis 3.8). */
    ck_assert_uint_le(rf_queued_count(c, 2, 1, RAFT_MSG_VOTE_RESP), 1);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_VOTE_RESP);
    if (resp != NULL) {
        ck_assert(!resp->u.vote_resp.granted);
        ck_assert_uint_eq(resp->term, 5);
        ck_assert(resp->u.vote_resp.pre_vote == pre_vote);
    }
    /* Nothing else leaves node 2 either. */
    ck_assert_uint_eq(rf_queued_count(c, 2, 0, RAFT_MSG_NONE), resp != NULL ? 1 : 0);
    return resp;
}

START_TEST(test_vote_refused_for_lower_term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    ck_assert_ptr_nonnull(stale_vote(c, false));
    rf_free(c);
}
END_TEST

START_TEST(test_prevote_refused_for_lower_term_with_voters_term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    ck_assert_ptr_nonnull(stale_vote(c, true));
    rf_free(c);
}
END_TEST

static void assert_follower_of(struct rf_cluster *c, uint64_t id, uint64_t term)
{
    struct raft *r = rf_raft(c, id);
    ck_assert_int_eq(raft_role(r), RAFT_FOLLOWER);
    ck_assert_uint_eq(raft_term(r), term);
    ck_assert_uint_eq(rf_node(c, id)->store_hs.term, term);
}

START_TEST(test_higher_term_in_response_makes_leader_follower)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = rf_elect(c, 1);

    struct raft_message m = rf_msg(RAFT_MSG_APPEND_RESP, 2, 1, t + 5);
    m.u.append_resp.reject = true;
    m.u.append_resp.index = 1;
    rf_step(c, &m);

    assert_follower_of(c, 1, t + 5);
    ck_assert_uint_eq(raft_vote(rf_raft(c, 1)), RAFT_NONE);
    ck_assert_uint_eq(rf_node(c, 1)->store_hs.vote, RAFT_NONE);
    ck_assert_uint_ne(raft_leader(rf_raft(c, 1)), 1);
    rf_free(c);
}
END_TEST

START_TEST(test_higher_term_in_vote_response_makes_candidate_follower)
{
    struct raft_options o;
    rf_options(&o);
    o.pre_vote = false;
    struct rf_cluster *c = rf_new(3, &o);
    rf_tick_until_campaign(c, 1, 100);
    struct raft *r = rf_raft(c, 1);
    ck_assert_int_eq(raft_role(r), RAFT_CANDIDATE);
    ck_assert_uint_eq(raft_term(r), 1);
    ck_assert_uint_eq(raft_vote(r), 1);

    struct raft_message m = rf_msg(RAFT_MSG_VOTE_RESP, 2, 1, 4);
    m.u.vote_resp.granted = false;
    rf_step(c, &m);

    assert_follower_of(c, 1, 4);
    ck_assert_uint_eq(raft_vote(r), RAFT_NONE);
    ck_assert_uint_eq(rf_node(c, 1)->store_hs.vote, RAFT_NONE);
    rf_free(c);
}
END_TEST

START_TEST(test_higher_term_in_append_clears_vote_and_sets_leader)
{
    struct rf_cluster *c = rf_new(3, NULL);
    struct raft *r = rf_raft(c, 2);
    struct raft_message m = vote_msg(1, 2, 3, 0, 0);
    rf_step(c, &m);
    ck_assert_uint_eq(raft_vote(r), 1);

    m = rf_msg(RAFT_MSG_APPEND, 3, 2, 4);
    rf_step(c, &m);

    assert_follower_of(c, 2, 4);
    ck_assert_uint_eq(raft_vote(r), RAFT_NONE);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.vote, RAFT_NONE);
    ck_assert_uint_eq(raft_leader(r), 3);
    const struct raft_message *resp = rf_queued_find(c, 2, 3, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert_uint_eq(resp->term, 4);
    rf_free(c);
}
END_TEST

START_TEST(test_candidate_with_majority_becomes_leader_with_noop)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = rf_elect(c, 1);
    struct raft *r = rf_raft(c, 1);

    ck_assert_uint_eq(raft_leader(r), 1);
    /* The first entry of the new term, right after the empty log, is the
     * no-op (a new cluster's leader may add its bootstrap config after it). */
    const struct raft_entry *e = raft_entry_at(r, 1);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->type, RAFT_ENTRY_NOOP);
    ck_assert_uint_eq(e->term, t);
    uint64_t last = raft_last_index(r);
    /* The no-op commits once a majority holds it, and everyone applies it. */
    rf_heartbeat_rounds(c, 1, 2);
    for (uint64_t id = 1; id <= 3; id++) {
        ck_assert_uint_eq(raft_commit(rf_raft(c, id)), last);
        ck_assert_uint_eq(raft_leader(rf_raft(c, id)), 1);
        struct rf_node *nd = rf_node(c, id);
        ck_assert_uint_eq(nd->n_applied, last);
        ck_assert_int_eq(nd->applied[0].type, RAFT_ENTRY_NOOP);
        ck_assert_uint_eq(nd->applied[0].term, t);
    }
    rf_free(c);
}
END_TEST

START_TEST(test_candidate_in_five_needs_three_votes)
{
    struct rf_cluster *c = rf_new(5, NULL);
    /* Two of five unreachable: node 1 still has a majority (1, 2, 3). */
    c->isolated[4] = c->isolated[5] = true;
    rf_elect(c, 1);
    rf_free(c);

    c = rf_new(5, NULL);
    c->isolated[3] = c->isolated[4] = c->isolated[5] = true;
    rf_tick_until_campaign(c, 1, 100);
    rf_run(c);
    for (int i = 0; i < 100; i++) {
        rf_tick(c, 1);
        rf_run(c);
        ck_assert_int_ne(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    }
    rf_free(c);
}
END_TEST

START_TEST(test_vote_response_waits_for_persisted)
{
    struct rf_cluster *c = rf_new(3, NULL);
    struct raft *r = rf_raft(c, 2);
    rf_hold(c, 2);

    struct raft_message m = vote_msg(1, 2, 1, 0, 0);
    rf_step(c, &m);
    /* The ready carried the vote to persist... */
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.term, 1);
    ck_assert_uint_eq(rf_node(c, 2)->store_hs.vote, 1);
    ck_assert_uint_eq(raft_vote(r), 1);
    /* ...but the grant must not leave before it is durable (thesis 3.8). */
    ck_assert_uint_eq(rf_queued_count(c, 2, 0, RAFT_MSG_VOTE_RESP), 0);
    rf_tick(c, 2);
    ck_assert_uint_eq(rf_queued_count(c, 2, 0, RAFT_MSG_VOTE_RESP), 0);

    rf_release(c, 2);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_VOTE_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(resp->u.vote_resp.granted);
    ck_assert_uint_eq(resp->term, 1);
    rf_free(c);
}
END_TEST

/* Keeps the cluster in lockstep for `ticks` ticks: every node not isolated
 * ticks, then the network runs. */
static void lockstep(struct rf_cluster *c, int ticks, bool tick_isolated)
{
    for (int i = 0; i < ticks; i++) {
        for (uint64_t id = 1; id <= c->n; id++)
            if (tick_isolated || !c->isolated[id])
                rf_tick(c, id);
        rf_run(c);
    }
}

START_TEST(test_prevote_does_not_increase_term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = rf_elect(c, 1);
    c->isolated[3] = true;
    struct raft *r3 = rf_raft(c, 3);
    for (int i = 0; i < 60; i++) {
        lockstep(c, 1, true);
        ck_assert_uint_eq(raft_term(r3), t);
        ck_assert_int_ne(raft_role(r3), RAFT_CANDIDATE);
    }
    /* It did campaign, only never past pre-vote. */
    ck_assert_int_eq(raft_role(r3), RAFT_PRE_CANDIDATE);
    ck_assert_uint_eq(rf_node(c, 3)->store_hs.term, t);
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(rf_raft(c, 1)), t);
    rf_free(c);
}
END_TEST

/* The contrast that shows the test above can fail: without pre-vote, an
 * isolated node's term does run away (paper 5.2). */
START_TEST(test_without_prevote_isolated_node_raises_term)
{
    struct raft_options o;
    rf_options(&o);
    o.pre_vote = false;
    struct rf_cluster *c = rf_new(3, &o);
    uint64_t t = rf_elect(c, 1);
    c->isolated[3] = true;
    lockstep(c, 60, true);
    ck_assert_uint_gt(raft_term(rf_raft(c, 3)), t + 1);
    rf_free(c);
}
END_TEST

START_TEST(test_prevote_rejoining_node_does_not_depose_leader)
{
    struct rf_cluster *c = rf_new(3, NULL);
    uint64_t t = rf_elect(c, 1);
    c->isolated[3] = true;
    lockstep(c, 60, true);
    ck_assert_int_eq(raft_role(rf_raft(c, 3)), RAFT_PRE_CANDIDATE);

    /* Heal, and let node 3 campaign before it hears a heartbeat. */
    c->isolated[3] = false;
    rf_net_clear(c);
    size_t before = rf_trace_count(c, 3, 0, RAFT_MSG_VOTE);
    for (int i = 0; i < 100 && rf_queued_count(c, 3, 0, RAFT_MSG_VOTE) == 0; i++)
        rf_tick(c, 3);
    const struct raft_message *pv = rf_queued_find(c, 3, 0, RAFT_MSG_VOTE);
    ck_assert_ptr_nonnull(pv);
    ck_assert(pv->u.vote.pre_vote);
    ck_assert_uint_eq(raft_term(rf_raft(c, 3)), t);
    rf_run(c);
    ck_assert_uint_gt(rf_trace_count(c, 3, 0, RAFT_MSG_VOTE), before);

    /* Nobody granted: both peers heard from their leader recently. */
    for (size_t i = 0; i < c->trace.n; i++) {
        const struct raft_message *m = &c->trace.v[i];
        if (m->type == RAFT_MSG_VOTE_RESP && m->to == 3)
            ck_assert_msg(!m->u.vote_resp.granted, "node %llu granted",
                          (unsigned long long)m->from);
    }
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(rf_raft(c, 1)), t);
    ck_assert_uint_eq(raft_term(rf_raft(c, 2)), t);

    /* The leader's heartbeats bring node 3 back as a follower. */
    lockstep(c, 30, true);
    for (uint64_t id = 1; id <= 3; id++) {
        ck_assert_uint_eq(raft_term(rf_raft(c, id)), t);
        ck_assert_uint_eq(raft_leader(rf_raft(c, id)), 1);
    }
    ck_assert_int_eq(raft_role(rf_raft(c, 3)), RAFT_FOLLOWER);
    rf_assert_logs_equal(c, 1, 3, 1);
    rf_free(c);
}
END_TEST

START_TEST(test_election_timeout_randomized_in_range)
{
    struct raft_options o;
    rf_options(&o);
    const uint32_t e = o.election_ticks;
    bool seen[64] = {false};
    int distinct = 0;
    for (uint64_t s = 1; s <= 40; s++) {
        o.seed = s * 7919;
        struct rf_cluster *c = rf_new(3, &o);
        uint32_t k = rf_tick_until_campaign(c, 1, 4 * e);
        ck_assert_msg(k >= e && k < 2 * e, "seed %llu: first timeout %u ticks",
                      (unsigned long long)o.seed, k);
        if (!seen[k]) {
            seen[k] = true;
            distinct++;
        }
        /* Nobody answers: the next campaign comes after a fresh timeout. */
        rf_net_clear(c);
        uint32_t k2 = 0;
        while (rf_queued_count(c, 1, 0, RAFT_MSG_VOTE) == 0) {
            ck_assert_uint_lt(k2, 4 * e);
            rf_tick(c, 1);
            k2++;
        }
        ck_assert_msg(k2 >= e && k2 < 2 * e, "seed %llu: second timeout %u",
                      (unsigned long long)o.seed, k2);
        rf_free(c);
    }
    ck_assert_int_ge(distinct, 3);
}
END_TEST

START_TEST(test_election_timeout_differs_across_nodes)
{
    /* Same template seed: the nodes of one cluster must still differ. */
    struct raft_options o;
    rf_options(&o);
    o.election_ticks = 50;
    struct rf_cluster *c = rf_new(5, &o);
    uint32_t k[5];
    for (uint64_t id = 1; id <= 5; id++)
        k[id - 1] = rf_tick_until_campaign(c, id, 200);
    bool differ = false;
    for (int i = 1; i < 5; i++)
        differ = differ || k[i] != k[0];
    ck_assert(differ);
    rf_free(c);
}
END_TEST

/* A message whose term is above RAFT_TERM_CEIL, or more than RAFT_TERM_LEAP
 * above the receiver's, is refused as bad input (issue 15: one forged
 * AppendEntries at 2^64-1 used to leave the cluster leaderless for good;
 * issue 49: so did one at 2^64 - 2^32 - 1). The boundary values, message by
 * message, are in raft_terms_test.c. */
START_TEST(test_huge_term_is_refused)
{
    struct rf_cluster *c = rf_new(3, NULL);
    rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t term = raft_term(r2);
    const uint64_t huge[] = {UINT64_MAX, RAFT_TERM_CEIL + 1, term + RAFT_TERM_LEAP + 1};
    for (size_t i = 0; i < 3; i++) {
        /* from 3: a member, lying */
        struct raft_message m = rf_msg(RAFT_MSG_APPEND, 3, 2, huge[i]);
        ck_assert_int_eq(raft_step(r2, &m), TK_ERANGE);
        m.type = RAFT_MSG_VOTE;
        ck_assert_int_eq(raft_step(r2, &m), TK_ERANGE);
        m.type = RAFT_MSG_TIMEOUT_NOW;
        ck_assert_int_eq(raft_step(r2, &m), TK_ERANGE);
    }
    ck_assert_uint_eq(raft_terms_refused(r2), 9);
    ck_assert_uint_eq(raft_term(r2), term);
    ck_assert_uint_eq(raft_leader(r2), 1);
    ck_assert_int_eq(raft_role(r2), RAFT_FOLLOWER);
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 8, &first), 0);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_ge(raft_commit(r2), first);
    rf_free(c);
}
END_TEST

/* A node at the term ceiling never campaigns: its term cannot pass it. */
START_TEST(test_term_at_ceiling_never_campaigns)
{
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 1, RAFT_TERM_CEIL, RAFT_NONE, NULL, 0);
    struct raft *r1 = rf_raft(c, 1);
    for (int i = 0; i < 200; i++)
        rf_tick(c, 1);
    ck_assert_uint_eq(raft_term(r1), RAFT_TERM_CEIL);
    ck_assert_int_eq(raft_role(r1), RAFT_FOLLOWER);
    ck_assert_uint_eq(rf_queued_count(c, 1, 0, RAFT_MSG_VOTE), 0);
    rf_free(c);
}
END_TEST

/* While there is a live leader, a TimeoutNow or a vote request from an id
 * outside the configuration changes neither the term nor the leader, and
 * forces no election (issue 15). (Appends and snapshots from non-members stay
 * accepted: raft.c from_accepted says why.) */
START_TEST(test_non_member_cannot_change_term_or_leader)
{
    struct rf_cluster *c = rf_new(3, NULL);
    rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);
    rf_net_clear(c);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t term = raft_term(r2);
    const int types[] = {RAFT_MSG_TIMEOUT_NOW, RAFT_MSG_VOTE};
    for (size_t i = 0; i < 2; i++) {
        for (uint64_t dt = 0; dt < 2; dt++) {
            struct raft_message m = rf_msg(types[i], 99, 2, term + dt * 5);
            m.u.vote.last_log_index = 1000;
            m.u.vote.last_log_term = term + 5;
            ck_assert_int_eq(raft_step(r2, &m), 0);
        }
    }
    ck_assert_uint_eq(raft_term(r2), term);
    ck_assert_uint_eq(raft_leader(r2), 1);
    ck_assert_int_eq(raft_role(r2), RAFT_FOLLOWER);
    rf_drain(c, 2);
    ck_assert_uint_eq(rf_queued_count(c, 2, 0, RAFT_MSG_VOTE), 0);
    rf_free(c);
}
END_TEST

static Suite *election_suite(void)
{
    Suite *s = suite_create("raft_election");
    TCase *tc = tcase_create("election");
    tcase_add_test(tc, test_vote_granted_to_up_to_date_candidate);
    tcase_add_test(tc, test_vote_refused_for_lower_last_term);
    tcase_add_test(tc, test_vote_refused_for_same_term_shorter_log);
    tcase_add_test(tc, test_vote_refused_when_already_voted_for_another);
    tcase_add_test(tc, test_vote_refused_for_lower_term);
    tcase_add_test(tc, test_prevote_refused_for_lower_term_with_voters_term);
    tcase_add_test(tc, test_higher_term_in_response_makes_leader_follower);
    tcase_add_test(tc, test_higher_term_in_vote_response_makes_candidate_follower);
    tcase_add_test(tc, test_higher_term_in_append_clears_vote_and_sets_leader);
    tcase_add_test(tc, test_candidate_with_majority_becomes_leader_with_noop);
    tcase_add_test(tc, test_candidate_in_five_needs_three_votes);
    tcase_add_test(tc, test_vote_response_waits_for_persisted);
    tcase_add_test(tc, test_prevote_does_not_increase_term);
    tcase_add_test(tc, test_without_prevote_isolated_node_raises_term);
    tcase_add_test(tc, test_prevote_rejoining_node_does_not_depose_leader);
    tcase_add_test(tc, test_election_timeout_randomized_in_range);
    tcase_add_test(tc, test_election_timeout_differs_across_nodes);
    tcase_add_test(tc, test_huge_term_is_refused);
    tcase_add_test(tc, test_term_at_ceiling_never_campaigns);
    tcase_add_test(tc, test_non_member_cannot_change_term_or_leader);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(election_suite()));
}
