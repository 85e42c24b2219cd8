/* Term bounds in the raft core (raft.h: RAFT_TERM_CEIL, RAFT_TERM_LEAP;
 * issue 49): no message, from a stranger or a member, can leave the cluster
 * unable to elect a leader.
 *
 * Thesis 3.3 has a server take any higher term it sees. The core takes a
 * message's term only if it is at most RAFT_TERM_CEIL (2^62) and at most
 * RAFT_TERM_LEAP (2^32) above its own; anything else is refused before it
 * changes a thing (nothing to persist, nothing sent), like a lost message.
 * Each test sends the boundary values (ceiling - 1, ceiling, ceiling + 1,
 * 2^63, 2^64 - 2^32 - 1, 2^64 - 1) in each kind of message, from a member id,
 * to a node whose term is small (all refused by the leap bound) and to a
 * node near the ceiling (the first two taken, the rest refused), and after
 * each refusal requires the cluster to elect a new leader and commit. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "raft/raft.h"
#include "tests/check_run.h"
#include "tests/unit/raft/raft_fixture.h"

#define CEIL RAFT_TERM_CEIL

static const uint64_t boundary[] = {
    CEIL - 1,
    CEIL,
    CEIL + 1,
    UINT64_C(1) << 63,
    UINT64_MAX - (UINT64_C(1) << 32), /* 2^64 - 2^32 - 1: the old guard's limit */
    UINT64_MAX,
};
#define N_BOUNDARY (sizeof(boundary) / sizeof(boundary[0]))

/* The kinds of message a lying member can send. Requests go from node 3 to
 * follower 2, responses from node 2 to leader 1. */
enum kind {
    K_APPEND,
    K_VOTE,     /* with transfer set: it bypasses leader stickiness */
    K_PRE_VOTE, /* likewise */
    K_TIMEOUT_NOW,
    K_APPEND_RESP,
    K_VOTE_RESP,
    K_COUNT,
};

static const char *const kind_names[K_COUNT] = {
    "AppendEntries", "RequestVote", "PreVote", "TimeoutNow", "AppendResp", "VoteResp",
};

static struct raft_message forged(enum kind k, uint64_t term)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    bool resp = k == K_APPEND_RESP || k == K_VOTE_RESP;
    m.from = resp ? 2 : 3;
    m.to = resp ? 1 : 2;
    m.term = term;
    switch (k) {
    case K_APPEND:
        m.type = RAFT_MSG_APPEND; /* a heartbeat that claims nothing */
        break;
    case K_VOTE:
    case K_PRE_VOTE:
        m.type = RAFT_MSG_VOTE;
        m.u.vote.pre_vote = k == K_PRE_VOTE;
        m.u.vote.transfer = true;
        m.u.vote.last_log_index = 1u << 20;
        m.u.vote.last_log_term = term;
        break;
    case K_TIMEOUT_NOW:
        m.type = RAFT_MSG_TIMEOUT_NOW;
        break;
    case K_APPEND_RESP:
        m.type = RAFT_MSG_APPEND_RESP;
        m.u.append_resp.reject = true;
        break;
    case K_VOTE_RESP:
        m.type = RAFT_MSG_VOTE_RESP;
        m.u.vote_resp.granted = true;
        break;
    default:
        ck_abort_msg("kind %d", (int)k);
    }
    return m;
}

/* Three nodes booted at `term` (each with an empty log); node 1 elected and
 * settled: every node has committed its no-op and nothing is pending. */
static struct rf_cluster *settled_cluster(uint64_t term)
{
    struct rf_cluster *c = rf_new(3, NULL);
    if (term > 0)
        for (uint64_t id = 1; id <= 3; id++)
            rf_boot_log(c, id, term, RAFT_NONE, NULL, 0);
    rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);
    for (uint64_t id = 1; id <= 3; id++) {
        ck_assert_uint_eq(raft_commit(rf_raft(c, id)), raft_last_index(rf_raft(c, 1)));
        ck_assert(!raft_has_ready(rf_raft(c, id)));
    }
    return c;
}

/* With node `cut` cut off (RAFT_NONE: none), the other nodes tick in
 * lockstep until one of them leads in the highest term any node holds; then
 * `cut` comes back, and an entry proposed to the new leader commits on every
 * node. Returns the new leader. */
static uint64_t elect_and_commit(struct rf_cluster *c, uint64_t cut)
{
    c->isolated[cut] = cut != RAFT_NONE;
    uint64_t leader = RAFT_NONE;
    for (int t = 0; t < 200 && leader == RAFT_NONE; t++) {
        for (uint64_t id = 1; id <= c->n; id++)
            if (!c->isolated[id])
                rf_tick(c, id);
        rf_run(c);
        uint64_t top = 0;
        for (uint64_t id = 1; id <= c->n; id++)
            if (!c->isolated[id] && raft_term(rf_raft(c, id)) > top)
                top = raft_term(rf_raft(c, id));
        for (uint64_t id = 1; id <= c->n; id++)
            if (!c->isolated[id] && raft_role(rf_raft(c, id)) == RAFT_LEADER &&
                raft_term(rf_raft(c, id)) == top)
                leader = id;
    }
    ck_assert_msg(leader != RAFT_NONE, "no leader within 200 ticks without node %llu",
                  (unsigned long long)cut);
    c->isolated[cut] = false;
    rf_heartbeat_rounds(c, leader, 3);
    ck_assert_int_eq(raft_role(rf_raft(c, leader)), RAFT_LEADER);
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, leader, 1, 8, &first), 0);
    rf_heartbeat_rounds(c, leader, 3);
    for (uint64_t id = 1; id <= c->n; id++)
        ck_assert_msg(raft_commit(rf_raft(c, id)) >= first,
                      "node %llu commit %llu, entry %llu", (unsigned long long)id,
                      (unsigned long long)raft_commit(rf_raft(c, id)),
                      (unsigned long long)first);
    if (cut != RAFT_NONE)
        ck_assert_int_eq(raft_role(rf_raft(c, cut)), RAFT_FOLLOWER);
    return leader;
}

/* Sends the forged message to a settled cluster booted at `boot_term` and
 * requires it to be refused: TK_ERANGE, counted, and nothing changed (term,
 * vote, leader, role, nothing to persist or send); then the cluster elects a
 * new leader and commits. */
static void expect_refused(uint64_t boot_term, enum kind k, uint64_t term)
{
    struct rf_cluster *c = settled_cluster(boot_term);
    struct raft_message m = forged(k, term);
    struct raft *r = rf_raft(c, m.to);
    uint64_t t0 = raft_term(r), v0 = raft_vote(r), l0 = raft_leader(r);
    int role0 = raft_role(r);
    struct raft_hard_state hs0 = rf_node(c, m.to)->store_hs;

    ck_assert_msg(raft_step(r, &m) == TK_ERANGE, "%s at term %llu to node %llu: taken",
                  kind_names[k], (unsigned long long)term, (unsigned long long)m.to);
    ck_assert_uint_eq(raft_terms_refused(r), 1);
    ck_assert_uint_eq(raft_term(r), t0);
    ck_assert_uint_eq(raft_vote(r), v0);
    ck_assert_uint_eq(raft_leader(r), l0);
    ck_assert_int_eq(raft_role(r), role0);
    ck_assert_msg(!raft_has_ready(r), "%s at term %llu: a ready to persist or send",
                  kind_names[k], (unsigned long long)term);
    rf_drain(c, m.to);
    ck_assert_uint_eq(rf_node(c, m.to)->store_hs.term, hs0.term);
    ck_assert_uint_eq(rf_node(c, m.to)->store_hs.vote, hs0.vote);

    uint64_t leader = elect_and_commit(c, 1);
    ck_assert_uint_ne(leader, 1);
    for (uint64_t id = 1; id <= 3; id++)
        ck_assert_uint_lt(raft_term(rf_raft(c, id)), t0 + 100);
    rf_free(c);
}

/* A node at a small term refuses every boundary value in every kind of
 * message: all are more than RAFT_TERM_LEAP above its term. */
START_TEST(test_boundary_terms_refused_at_small_term)
{
    for (size_t i = 0; i < N_BOUNDARY; i++)
        for (int k = 0; k < K_COUNT; k++)
            expect_refused(0, (enum kind)k, boundary[i]);
}
END_TEST

/* A node near the ceiling (ceiling - 1000) refuses every value above the
 * ceiling, in every kind of message. */
START_TEST(test_terms_over_ceiling_refused_near_ceiling)
{
    for (size_t i = 0; i < N_BOUNDARY; i++) {
        if (boundary[i] <= CEIL)
            continue;
        for (int k = 0; k < K_COUNT; k++)
            expect_refused(CEIL - 1000, (enum kind)k, boundary[i]);
    }
}
END_TEST

/* ... and takes ceiling - 1 and the ceiling (within the leap bound). From
 * ceiling - 1 the cluster still elects a leader, at the ceiling, and commits;
 * a node at the ceiling itself never campaigns again, so its term never passes
 * it (reaching it from term 1 takes about 2^30 such messages). */
START_TEST(test_ceiling_and_below_taken_near_ceiling)
{
    static const enum kind kinds[] = {K_APPEND, K_VOTE, K_APPEND_RESP, K_VOTE_RESP};
    for (size_t i = 0; i < 2; i++) {
        uint64_t term = boundary[i];
        for (size_t j = 0; j < sizeof(kinds) / sizeof(kinds[0]); j++) {
            struct rf_cluster *c = settled_cluster(CEIL - 1000);
            struct raft_message m = forged(kinds[j], term);
            struct raft *r = rf_raft(c, m.to);
            ck_assert_int_eq(raft_step(r, &m), 0);
            ck_assert_uint_eq(raft_terms_refused(r), 0);
            ck_assert_msg(raft_term(r) == term, "%s at ceiling - %llu: term %llu",
                          kind_names[kinds[j]], (unsigned long long)(CEIL - term),
                          (unsigned long long)raft_term(r));
            ck_assert_int_ne(raft_role(r), RAFT_LEADER);
            rf_drain(c, m.to);
            ck_assert_uint_eq(rf_node(c, m.to)->store_hs.term, term); /* persisted */
            if (term < CEIL) {
                uint64_t leader = elect_and_commit(c, RAFT_NONE);
                ck_assert_uint_eq(raft_term(rf_raft(c, leader)), CEIL);
            } else {
                for (int t = 0; t < 200; t++)
                    rf_tick(c, m.to);
                ck_assert_uint_eq(raft_term(r), CEIL);
                ck_assert_int_eq(raft_role(r), RAFT_FOLLOWER);
                ck_assert_uint_eq(rf_queued_count(c, m.to, 0, RAFT_MSG_VOTE), 0);
            }
            rf_free(c);
        }
    }
}
END_TEST

/* The leap bound's own edge: RAFT_TERM_LEAP above the node's term is taken,
 * one more is refused, and a cluster taken there elects and commits. */
START_TEST(test_leap_bound_edge)
{
    struct rf_cluster *c = settled_cluster(0);
    struct raft *r2 = rf_raft(c, 2);
    uint64_t t0 = raft_term(r2);
    struct raft_message m = forged(K_APPEND, t0 + RAFT_TERM_LEAP + 1);
    ck_assert_int_eq(raft_step(r2, &m), TK_ERANGE);
    ck_assert_uint_eq(raft_term(r2), t0);
    m.term = t0 + RAFT_TERM_LEAP;
    ck_assert_int_eq(raft_step(r2, &m), 0);
    ck_assert_uint_eq(raft_term(r2), t0 + RAFT_TERM_LEAP);
    ck_assert_uint_eq(raft_leader(r2), 3);
    ck_assert_uint_eq(raft_terms_refused(r2), 1);
    /* Node 2's answer carries its new term to node 3 (exactly the leap above
     * node 3's), and its answer to the leader's next heartbeat to node 1. */
    rf_run(c);
    uint64_t leader = elect_and_commit(c, RAFT_NONE);
    ck_assert_uint_gt(raft_term(rf_raft(c, leader)), t0 + RAFT_TERM_LEAP);
    rf_free(c);
}
END_TEST

/* A boot state with a term above the ceiling (hard state, snapshot or entry)
 * is corrupt storage: raft_new refuses it with TK_ECORRUPT, never asserts; at
 * the ceiling it boots. */
START_TEST(test_boot_term_over_ceiling_is_corrupt)
{
    struct raft_options o;
    rf_options(&o);
    o.id = 1;
    struct raft_entry e = {.term = 1, .index = 1, .type = RAFT_ENTRY_NOOP};
    for (int what = 0; what < 3; what++) {
        for (size_t i = 0; i < N_BOUNDARY; i++) {
            struct raft_boot b;
            memset(&b, 0, sizeof(b));
            b.bootstrap.n_voters = 1;
            b.bootstrap.voters[0] = 1;
            b.hard_state.term = what == 0 ? boundary[i] : CEIL;
            if (what == 1) {
                b.snapshot.index = 5;
                b.snapshot.term = boundary[i];
                b.snapshot.config = b.bootstrap;
                b.applied = 5;
            } else if (what == 2) {
                e.term = boundary[i];
                b.entries = &e;
                b.n_entries = 1;
            }
            struct raft *r = NULL;
            int rc = raft_new(&o, &b, &r);
            if (boundary[i] <= CEIL) {
                ck_assert_msg(rc == 0, "case %d, term %llu: %s", what,
                              (unsigned long long)boundary[i], tk_errname(rc));
                raft_free(r);
            } else {
                ck_assert_msg(rc == TK_ECORRUPT, "case %d, term %llu: %s", what,
                              (unsigned long long)boundary[i], tk_errname(rc));
                ck_assert_ptr_null(r);
            }
        }
    }
}
END_TEST

static Suite *terms_suite(void)
{
    Suite *s = suite_create("raft_terms");
    TCase *tc = tcase_create("terms");
    tcase_add_test(tc, test_boundary_terms_refused_at_small_term);
    tcase_add_test(tc, test_terms_over_ceiling_refused_near_ceiling);
    tcase_add_test(tc, test_ceiling_and_below_taken_near_ceiling);
    tcase_add_test(tc, test_leap_bound_edge);
    tcase_add_test(tc, test_boot_term_over_ceiling_is_corrupt);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(terms_suite()));
}
