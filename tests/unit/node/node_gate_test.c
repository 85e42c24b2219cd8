/* The leader's gate for large writes (node/node_gate.c): its rule,
 * node__gate_room, driven on views of the test's own (no node, no core), so
 * that each case is exact: what holds the gate, what opens it, the rest after
 * contended large entries, a voter that stopped, a new term. */
#include <check.h>
#include <string.h>

#include "node/node_internal.h"
#include "tests/check_run.h"

#define MS 1000000ull
#define BIG (4u << 20) /* one large entry: the pipeline's budget alone */

/* Node 1 leads voters 1, 2, 3; followers at `m2` and `m3`; applied `applied`. */
static struct node_gate_view view(uint64_t now_ms, uint64_t applied, uint64_t m2,
                                  uint64_t m3)
{
    struct node_gate_view v = {.term = 5,
                               .config = 1,
                               .applied = applied,
                               .self = 1,
                               .now_ns = now_ms * MS,
                               .n_voters = 3};
    v.voter[0] = 1;
    v.voter[1] = 2;
    v.voter[2] = 3;
    v.match[0] = 0;
    v.match[1] = m2;
    v.match[2] = m3;
    return v;
}

/* Lets one large entry of `len` in at `index` (the gate must have room). */
static void admit(struct node_gate *g, uint64_t now_ms, uint64_t index, uint64_t len,
                  uint64_t applied)
{
    struct node_gate_view v = view(now_ms, applied, applied, applied);
    ck_assert(node__gate_room(g, &v, len));
    node__gate_admit(g, len);
    node__gate_note(g, index, len, true, now_ms * MS);
}

START_TEST(test_one_large_entry_until_every_voter_has_it)
{
    struct node_gate g;
    memset(&g, 0, sizeof(g));
    admit(&g, 0, 10, BIG, 9);
    struct node_gate_view v = view(5, 9, 9, 9);
    ck_assert(!node__gate_room(&g, &v, BIG)); /* in flight */
    v = view(6, 10, 10, 9);                   /* applied, one follower has it */
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(7, 9, 10, 10); /* both followers, not applied here */
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(8, 10, 10, 10); /* gone: the next goes at once (nothing else ran) */
    ck_assert(node__gate_room(&g, &v, BIG));
    ck_assert_uint_eq(g.pipe_n, 0);
    ck_assert_uint_eq(g.pipe_bytes, 0);
    ck_assert_uint_eq(g.rests, 0);
}
END_TEST

/* Within the pipeline's budget several go together; past it, one more
 * waits; two admitted in one drain count before they are proposed. */
START_TEST(test_budget_in_bytes_and_pending_entries)
{
    struct node_gate g;
    memset(&g, 0, sizeof(g));
    struct node_gate_view v = view(0, 9, 9, 9);
    ck_assert(node__gate_room(&g, &v, 1u << 20));
    node__gate_admit(&g, 1u << 20);
    ck_assert(node__gate_room(&g, &v, 2u << 20)); /* 3 MiB pending */
    node__gate_admit(&g, 2u << 20);
    ck_assert(!node__gate_room(&g, &v, 2u << 20)); /* 5 MiB: over */
    ck_assert(node__gate_room(&g, &v, 1u << 20));  /* 4 MiB: within */
    node__gate_note(&g, 10, 1u << 20, true, 0);
    node__gate_note(&g, 11, 2u << 20, false, 0); /* refused by the core */
    ck_assert_uint_eq(g.pipe_n, 1);
    ck_assert_uint_eq(g.pipe_bytes, 1u << 20);
    ck_assert_uint_eq(g.pending_n, 0);
    ck_assert(node__gate_room(&g, &v, 3u << 20));
    ck_assert(!node__gate_room(&g, &v, (3u << 20) + 1));
}
END_TEST

/* Smaller writes proposed while a large entry was in the pipeline: once it
 * empties, none enters for NODE_GATE_REST_SHARE times as long as it was in
 * it (and never longer than NODE_GATE_REST_MAX_MS). */
START_TEST(test_rest_after_contended_large_entries)
{
    struct node_gate g;
    memset(&g, 0, sizeof(g));
    admit(&g, 100, 10, BIG, 9);
    g.small_seen = true; /* what node__gate_proposed sets for a small write */
    struct node_gate_view v = view(140, 11, 11, 11); /* in the pipeline 40 ms */
    ck_assert(!node__gate_room(&g, &v, BIG));
    ck_assert_uint_eq(g.rests, 1);
    uint64_t rest_end = 140 + NODE_GATE_REST_SHARE * 40;
    v = view(rest_end - 1, 11, 11, 11);
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(rest_end, 11, 11, 11);
    ck_assert(node__gate_room(&g, &v, BIG));

    /* A long one: the rest is capped. */
    admit(&g, 1000, 20, BIG, 19);
    g.small_seen = true;
    v = view(1000 + 5000, 20, 20, 20);
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(6000 + NODE_GATE_REST_MAX_MS, 20, 20, 20);
    ck_assert(node__gate_room(&g, &v, BIG));
    ck_assert_uint_eq(g.rests, 2);
}
END_TEST

/* A voter behind the newest large entry whose match has not moved for
 * NODE_GATE_IDLE_MS (down, or far behind) no longer holds the gate; one that
 * moves again does. */
START_TEST(test_a_voter_that_stopped_does_not_hold_the_gate)
{
    struct node_gate g;
    memset(&g, 0, sizeof(g));
    admit(&g, 0, 10, BIG, 9);
    struct node_gate_view v = view(10, 10, 10, 7); /* node 3 at 7 */
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(NODE_GATE_IDLE_MS - 1, 10, 10, 7);
    ck_assert(!node__gate_room(&g, &v, BIG));
    v = view(10 + NODE_GATE_IDLE_MS, 10, 10, 7); /* unmoved since 10 ms */
    ck_assert(node__gate_room(&g, &v, BIG));
    node__gate_admit(&g, BIG);
    node__gate_note(&g, 11, BIG, true, v.now_ns);
    v = view(20 + NODE_GATE_IDLE_MS, 11, 11, 8); /* it moves: it counts again */
    ck_assert(!node__gate_room(&g, &v, BIG));
}
END_TEST

/* A new term (this node leads again, or another leader's entries replaced
 * ours) or configuration starts the gate afresh. */
START_TEST(test_a_new_term_starts_afresh)
{
    struct node_gate g;
    memset(&g, 0, sizeof(g));
    admit(&g, 0, 10, BIG, 9);
    g.small_seen = true;
    struct node_gate_view v = view(5, 9, 9, 9);
    ck_assert(!node__gate_room(&g, &v, BIG));
    v.term = 6;
    ck_assert(node__gate_room(&g, &v, BIG));
    ck_assert_uint_eq(g.pipe_n, 0);
    ck_assert(!g.small_seen);
    node__gate_admit(&g, BIG);
    node__gate_note(&g, 12, BIG, true, v.now_ns);
    v = view(7, 11, 11, 11);
    v.term = 6;
    ck_assert(!node__gate_room(&g, &v, BIG));
    v.config = 2;
    ck_assert(node__gate_room(&g, &v, BIG));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node_gate");
    TCase *t = tcase_create("rule");
    tcase_add_test(t, test_one_large_entry_until_every_voter_has_it);
    tcase_add_test(t, test_budget_in_bytes_and_pending_entries);
    tcase_add_test(t, test_rest_after_contended_large_entries);
    tcase_add_test(t, test_a_voter_that_stopped_does_not_hold_the_gate);
    tcase_add_test(t, test_a_new_term_starts_afresh);
    suite_add_tcase(s, t);
    return tk_check_run(srunner_create(s));
}
