/* Tests of the simulator's invariant checker (checker.h): a checker that cannot
 * fail is worse than none, so each invariant is fed a known-bad history and
 * must report it by name, and a good history must pass.
 *
 * The nodes' current logs are a fake (struct fake) answered through ck_ops. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "raft/raft.h"
#include "tests/check_run.h"
#include "tests/sim/checker.h"

#define FAKE_MAX 32

struct fake {
    uint64_t term[4][FAKE_MAX]; /* [node][index]; 0: absent */
    uint64_t digest[4][FAKE_MAX];
    uint64_t snap[4];
    uint64_t leader_term[4];
};

static struct fake F;

static int fake_entry_at(void *data, uint64_t node, uint64_t index, uint64_t *term,
                         uint64_t *digest)
{
    struct fake *f = data;
    if (index >= FAKE_MAX || f->term[node][index] == 0)
        return -1;
    *term = f->term[node][index];
    *digest = f->digest[node][index];
    return 0;
}

static uint64_t fake_snapshot_index(void *data, uint64_t node)
{
    return ((struct fake *)data)->snap[node];
}

static uint64_t fake_leader_term(void *data, uint64_t node)
{
    return ((struct fake *)data)->leader_term[node];
}

static struct ck *new_ck(void)
{
    memset(&F, 0, sizeof(F));
    struct ck_ops ops = {fake_entry_at, fake_snapshot_index, fake_leader_term, &F};
    return ck_new(3, &ops);
}

/* Puts entry (index, term, digest = term * 100 + index) in a node's log. */
static void put(uint64_t node, uint64_t index, uint64_t term)
{
    F.term[node][index] = term;
    F.digest[node][index] = term * 100 + index;
}

/* Makes entries 1..n of term `term` durable and present on `nodes`. */
static void replicate(struct ck *ck, uint64_t nodes_mask, uint64_t n, uint64_t term)
{
    uint64_t terms[FAKE_MAX];
    for (uint64_t i = 0; i < n; i++)
        terms[i] = term;
    for (uint64_t node = 1; node <= 3; node++) {
        if (!(nodes_mask & (1u << node)))
            continue;
        for (uint64_t i = 1; i <= n; i++)
            put(node, i, term);
        ck_durable_hard_state(ck, node, term, 1);
        ck_assert_int_eq(ck_durable_entries(ck, node, 1, (size_t)n, terms), 0);
    }
}

/* A checker whose entries 1..n of term 1 are durable on nodes_mask and
 * node 1 (in term 1, not leading) has them committed. */
static struct ck *committed_ck(uint64_t nodes_mask, uint64_t n)
{
    struct ck *ck = new_ck();
    replicate(ck, nodes_mask, n, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, n), 0);
    return ck;
}

static void assert_violation(struct ck *ck, const char *invariant)
{
    ck_assert(ck_failed(ck));
    ck_assert_msg(strstr(ck_violation(ck), invariant) != NULL, "expected %s, got: %s",
                  invariant, ck_violation(ck));
}

START_TEST(test_good_history_passes)
{
    struct ck *ck = new_ck();
    ck_assert_int_eq(ck_leader(ck, 1, 1), 0);
    replicate(ck, 0xe, 3, 1);
    for (uint64_t i = 1; i <= 3; i++)
        ck_assert_int_eq(ck_append(ck, 1, i, 1, 100 + i, i == 1 ? 0 : 1), 0);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 3), 0);
    uint64_t h = 0;
    for (uint64_t i = 1; i <= 3; i++) {
        h = h * 31 + i;
        ck_assert_int_eq(ck_applied(ck, 1, i, 1, 100 + i, i, h), 0);
        ck_assert_int_eq(ck_applied(ck, 2, i, 1, 100 + i, i, h), 0);
    }
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND_RESP, 1, 1, true, false, 3), 0);
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_VOTE_RESP, 1, 1, true, false, 0), 0);
    ck_assert_int_eq(ck_read_done(ck, 2, ck_read_begin(ck), 3), 0);
    /* A new leader of term 2 holding everything committed. */
    ck_assert_int_eq(ck_leader(ck, 2, 2), 0);
    ck_assert(!ck_failed(ck));
    ck_assert_uint_eq(ck_committed(ck), 3);
    ck_free(ck);
}
END_TEST

START_TEST(test_two_leaders_in_one_term)
{
    struct ck *ck = new_ck();
    ck_assert_int_eq(ck_leader(ck, 1, 5), 0);
    ck_assert_int_eq(ck_leader(ck, 1, 5), 0); /* the same one again is fine */
    ck_assert_int_eq(ck_leader(ck, 2, 5), -1);
    assert_violation(ck, "election-safety");
    ck_assert(strstr(ck_violation(ck), "n1 and n2") != NULL);
    ck_free(ck);
}
END_TEST

/* Terms are sparse (raft.h: a term may leap by 2^32, up to 2^62): leaders of
 * huge terms are told apart, and two in one huge term are still caught. */
START_TEST(test_two_leaders_in_one_huge_term)
{
    struct ck *ck = new_ck();
    const uint64_t terms[] = {3, UINT64_C(1) << 32, (UINT64_C(1) << 62) - 1,
                              UINT64_C(1) << 62, UINT64_MAX - 1};
    for (size_t i = 0; i < sizeof(terms) / sizeof(terms[0]); i++)
        ck_assert_int_eq(ck_leader(ck, 1 + i % 3, terms[i]), 0);
    for (uint64_t t = 100; t < 300; t++) /* grows the table past its start */
        ck_assert_int_eq(ck_leader(ck, 1 + t % 3, t), 0);
    ck_assert(!ck_failed(ck));
    ck_assert_int_eq(ck_leader(ck, 2, UINT64_C(1) << 62), -1);
    assert_violation(ck, "election-safety");
    ck_assert(strstr(ck_violation(ck), "n1 and n2") != NULL);
    ck_free(ck);
}
END_TEST

START_TEST(test_two_entries_applied_at_one_index)
{
    struct ck *ck = committed_ck(0xe, 2);
    ck_assert_int_eq(ck_applied(ck, 1, 1, 1, 101, 0, 7), 0);
    /* Node 2 applies a different payload at index 1. */
    ck_assert_int_eq(ck_applied(ck, 2, 1, 1, 999, 0, 7), -1);
    assert_violation(ck, "state-machine-safety");
    ck_free(ck);
}
END_TEST

START_TEST(test_diverging_state_detected)
{
    struct ck *ck = committed_ck(0xe, 2);
    ck_assert_int_eq(ck_applied(ck, 1, 1, 1, 101, 0, 7), 0);
    ck_assert_int_eq(ck_applied(ck, 2, 1, 1, 101, 0, 8), -1);
    assert_violation(ck, "state-machine-safety");
    ck_free(ck);
}
END_TEST

START_TEST(test_uncommitted_apply_detected)
{
    struct ck *ck = new_ck();
    replicate(ck, 0xe, 2, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 1), 0);
    ck_assert_int_eq(ck_applied(ck, 1, 1, 1, 101, 0, 1), 0);
    ck_assert_int_eq(ck_applied(ck, 1, 2, 1, 102, 0, 2), -1);
    assert_violation(ck, "not committed");
    ck_free(ck);
}
END_TEST

START_TEST(test_command_applied_twice)
{
    struct ck *ck = committed_ck(0xe, 2);
    ck_assert_int_eq(ck_applied(ck, 1, 1, 1, 101, 42, 1), 0);
    ck_assert_int_eq(ck_applied(ck, 1, 2, 1, 102, 42, 2), -1);
    assert_violation(ck, "two indexes");
    ck_free(ck);
}
END_TEST

START_TEST(test_log_matching_same_index_term_different_entry)
{
    struct ck *ck = new_ck();
    ck_assert_int_eq(ck_append(ck, 1, 4, 2, 555, 2), 0);
    ck_assert_int_eq(ck_append(ck, 2, 4, 2, 666, 2), -1);
    assert_violation(ck, "log-matching");
    ck_free(ck);
}
END_TEST

START_TEST(test_log_matching_different_prefix)
{
    struct ck *ck = new_ck();
    ck_assert_int_eq(ck_append(ck, 1, 4, 3, 555, 2), 0);
    ck_assert_int_eq(ck_append(ck, 2, 4, 3, 555, CK_TERM_UNKNOWN), 0);
    ck_assert_int_eq(ck_append(ck, 3, 4, 3, 555, 1), -1);
    assert_violation(ck, "log-matching");
    ck_free(ck);
}
END_TEST

START_TEST(test_commit_index_goes_down)
{
    struct ck *ck = committed_ck(0xe, 3);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), -1);
    assert_violation(ck, "commit-monotonic");
    ck_free(ck);
}
END_TEST

START_TEST(test_commit_index_may_restart_lower)
{
    struct ck *ck = committed_ck(0xe, 3);
    ck_restart(ck, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 0), 0);
    ck_assert(!ck_failed(ck));
    ck_free(ck);
}
END_TEST

START_TEST(test_commit_without_durable_majority)
{
    struct ck *ck = new_ck();
    replicate(ck, 0x2, 2, 1); /* durable on node 1 only */
    put(2, 1, 1);             /* node 2 holds it in memory, not on disk */
    put(2, 2, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), -1);
    assert_violation(ck, "commit-durability");
    ck_free(ck);
}
END_TEST

START_TEST(test_commit_without_majority_of_its_voters)
{
    /* Node 1 removed itself: its configuration's voters are {2, 3}. Durable
     * on nodes 1 and 2 is a majority of all three, not of those voters. */
    struct ck *ck = new_ck();
    replicate(ck, 0x6, 2, 1);
    ck_voters(ck, 1, 0x6);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), -1);
    assert_violation(ck, "commit-durability");
    ck_free(ck);
    /* With voters {1, 2} the same commit is fine. */
    ck = new_ck();
    replicate(ck, 0x6, 2, 1);
    ck_voters(ck, 1, 0x3);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), 0);
    ck_free(ck);
}
END_TEST

START_TEST(test_committed_entry_lost_from_disk)
{
    struct ck *ck = committed_ck(0x6, 2); /* durable on nodes 1 and 2 of 3 */
    /* Node 2 overwrites index 2 with an entry of term 2. */
    uint64_t t2 = 2;
    ck_assert_int_eq(ck_durable_entries(ck, 2, 2, 1, &t2), -1);
    assert_violation(ck, "commit-durability");
    ck_free(ck);
}
END_TEST

START_TEST(test_snapshot_covers_durability)
{
    struct ck *ck = committed_ck(0x6, 2);
    /* Node 2 replaces its log with a snapshot at 2: still durable. */
    ck_assert_int_eq(ck_durable_snapshot(ck, 2, 2, 1, false), 0);
    /* Node 3 catches up by snapshot too, then node 1 loses the log: it is
     * still covered by two snapshots. */
    ck_assert_int_eq(ck_durable_snapshot(ck, 3, 2, 1, false), 0);
    uint64_t t2 = 2;
    ck_assert_int_eq(ck_durable_entries(ck, 1, 1, 1, &t2), 0);
    ck_assert(!ck_failed(ck));
    ck_free(ck);
}
END_TEST

START_TEST(test_new_leader_lacks_committed_entry)
{
    struct ck *ck = new_ck();
    ck_assert_int_eq(ck_leader(ck, 1, 1), 0);
    replicate(ck, 0x6, 2, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), 0);
    /* Node 3 has only index 1 and becomes leader of term 2 (Figure 8). */
    put(3, 1, 1);
    ck_assert_int_eq(ck_leader(ck, 3, 2), -1);
    assert_violation(ck, "leader-completeness");
    ck_free(ck);
}
END_TEST

START_TEST(test_existing_leader_lacks_new_commit)
{
    struct ck *ck = new_ck();
    put(3, 1, 1);
    F.leader_term[3] = 2; /* node 3 already leads term 2 without index 2 */
    replicate(ck, 0x6, 2, 1);
    ck_assert_int_eq(ck_commit(ck, 1, 1, false, 2), -1);
    assert_violation(ck, "leader-completeness");
    ck_free(ck);
}
END_TEST

START_TEST(test_vote_sent_before_durable)
{
    struct ck *ck = new_ck();
    ck_durable_hard_state(ck, 2, 3, 0); /* term 3, no vote on disk */
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_VOTE_RESP, 1, 3, true, false, 0), -1);
    assert_violation(ck, "durable-before-send");
    ck_free(ck);
}
END_TEST

START_TEST(test_vote_for_other_node_detected)
{
    struct ck *ck = new_ck();
    ck_durable_hard_state(ck, 2, 3, 3); /* durable: voted for n3 in term 3 */
    /* A pre-vote grant promises nothing. */
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_VOTE_RESP, 1, 4, true, true, 0), 0);
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_VOTE_RESP, 1, 3, true, false, 0), -1);
    assert_violation(ck, "durable-before-send");
    ck_free(ck);
}
END_TEST

START_TEST(test_leader_term_sent_before_durable)
{
    struct ck *ck = new_ck();
    ck_durable_hard_state(ck, 2, 3, 0);
    /* A candidate's own request may leave while its term is persisted; a
     * leader's append may not. */
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_VOTE, 1, 4, false, false, 0), 0);
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND, 1, 4, false, false, 0), -1);
    assert_violation(ck, "durable-before-send");
    ck_free(ck);
}
END_TEST

START_TEST(test_leader_self_vote_not_durable)
{
    struct ck *ck = new_ck();
    ck_durable_hard_state(ck, 2, 4, 0); /* term 4 durable, vote not yet */
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND, 1, 4, false, false, 0), -1);
    assert_violation(ck, "durable-before-send");
    ck_free(ck);
}
END_TEST

START_TEST(test_ack_sent_before_durable)
{
    struct ck *ck = new_ck();
    replicate(ck, 0x4, 2, 1); /* node 2 has 2 entries durable */
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND_RESP, 1, 1, true, false, 2), 0);
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND_RESP, 1, 1, true, false, 3), -1);
    assert_violation(ck, "durable-before-send");
    ck_free(ck);
}
END_TEST

START_TEST(test_rule_checks_can_be_turned_off)
{
    struct ck *ck = new_ck();
    ck_set_rule_checks(ck, false);
    ck_assert_int_eq(ck_sent(ck, 2, RAFT_MSG_APPEND_RESP, 1, 1, true, false, 3), 0);
    ck_free(ck);
}
END_TEST

START_TEST(test_leader_commits_old_term_entry)
{
    struct ck *ck = new_ck();
    replicate(ck, 0xe, 2, 1); /* entries of term 1 on every node */
    /* The leader of term 2 advances its commit to a term-1 entry. */
    ck_assert_int_eq(ck_commit(ck, 1, 2, true, 2), -1);
    assert_violation(ck, "commit-rule");
    ck_free(ck);
}
END_TEST

START_TEST(test_stale_read_index)
{
    struct ck *ck = committed_ck(0xe, 3);
    uint64_t token = ck_read_begin(ck);
    ck_assert_int_eq(ck_read_done(ck, 2, token, 2), -1);
    assert_violation(ck, "read-linearizable");
    ck_free(ck);
}
END_TEST

START_TEST(test_snapshot_with_other_state)
{
    struct ck *ck = committed_ck(0xe, 2);
    ck_assert_int_eq(ck_applied(ck, 1, 1, 1, 101, 0, 11), 0);
    ck_assert_int_eq(ck_applied(ck, 1, 2, 1, 102, 0, 12), 0);
    ck_assert_int_eq(ck_sm_restored(ck, 3, 2, 1, 99), -1);
    assert_violation(ck, "state-machine-safety");
    ck_free(ck);
}
END_TEST

START_TEST(test_first_violation_is_kept)
{
    struct ck *ck = new_ck();
    ck_set_time(ck, 1234);
    ck_assert_int_eq(ck_leader(ck, 1, 2), 0);
    ck_assert_int_eq(ck_leader(ck, 3, 2), -1);
    ck_assert_int_eq(ck_append(ck, 1, 4, 2, 1, 2), -1);
    assert_violation(ck, "election-safety");
    ck_assert(strstr(ck_violation(ck), "t=1234ms") != NULL);
    ck_assert(strstr(ck_violation(ck), "node n3") != NULL);
    ck_free(ck);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sim_check");
    TCase *tc = tcase_create("checker");
    tcase_add_test(tc, test_good_history_passes);
    tcase_add_test(tc, test_two_leaders_in_one_term);
    tcase_add_test(tc, test_two_leaders_in_one_huge_term);
    tcase_add_test(tc, test_two_entries_applied_at_one_index);
    tcase_add_test(tc, test_diverging_state_detected);
    tcase_add_test(tc, test_uncommitted_apply_detected);
    tcase_add_test(tc, test_command_applied_twice);
    tcase_add_test(tc, test_log_matching_same_index_term_different_entry);
    tcase_add_test(tc, test_log_matching_different_prefix);
    tcase_add_test(tc, test_commit_index_goes_down);
    tcase_add_test(tc, test_commit_index_may_restart_lower);
    tcase_add_test(tc, test_commit_without_durable_majority);
    tcase_add_test(tc, test_commit_without_majority_of_its_voters);
    tcase_add_test(tc, test_committed_entry_lost_from_disk);
    tcase_add_test(tc, test_snapshot_covers_durability);
    tcase_add_test(tc, test_new_leader_lacks_committed_entry);
    tcase_add_test(tc, test_existing_leader_lacks_new_commit);
    tcase_add_test(tc, test_vote_sent_before_durable);
    tcase_add_test(tc, test_vote_for_other_node_detected);
    tcase_add_test(tc, test_leader_term_sent_before_durable);
    tcase_add_test(tc, test_leader_self_vote_not_durable);
    tcase_add_test(tc, test_ack_sent_before_durable);
    tcase_add_test(tc, test_rule_checks_can_be_turned_off);
    tcase_add_test(tc, test_leader_commits_old_term_entry);
    tcase_add_test(tc, test_stale_read_index);
    tcase_add_test(tc, test_snapshot_with_other_state);
    tcase_add_test(tc, test_first_violation_is_kept);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
