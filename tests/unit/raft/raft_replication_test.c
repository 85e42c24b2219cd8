/* Log replication in the raft core, against the Raft paper (section 5.3 log
 * matching, Figure 2 "AppendEntries RPC", Figure 7 follower logs, 5.4.2 and
 * Figure 8 commit rule) and the thesis (3.8 durability, 10.2.1 the leader's
 * own write in parallel, 5.3 / etcd conflict hints, 10.2.2 pipelining). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "raft/raft.h"
#include "raft/raft_internal.h"
#include "tests/check_run.h"
#include "tests/unit/raft/raft_fixture.h"

static struct raft_message append_msg(uint64_t from, uint64_t to, uint64_t term,
                                      uint64_t prev_index, uint64_t prev_term,
                                      uint64_t commit, struct raft_entry *e, uint32_t n)
{
    struct raft_message m = rf_msg(RAFT_MSG_APPEND, from, to, term);
    m.u.append.prev_index = prev_index;
    m.u.append.prev_term = prev_term;
    m.u.append.commit = commit;
    m.u.append.entries = e;
    m.u.append.n_entries = n;
    return m;
}

/* Entries first..first+n-1 with the given terms and no payload. */
static void make_entries(struct raft_entry *e, uint64_t first, const uint64_t *terms,
                         uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&e[i], 0, sizeof(e[i]));
        e[i].index = first + i;
        e[i].term = terms[i];
        e[i].type = RAFT_ENTRY_NORMAL;
    }
}

static void assert_log_terms(struct rf_cluster *c, uint64_t id, const uint64_t *terms,
                             size_t n)
{
    ck_assert_uint_eq(raft_last_index(rf_raft(c, id)), n);
    ck_assert_uint_eq(rf_store_last_index(c, id), n);
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(rf_term_at(c, id, i + 1), terms[i]);
        ck_assert_uint_eq(rf_store_term_at(c, id, i + 1), terms[i]);
    }
}

/* The in-memory log under a rolling window (append at the end, compact the
 * front, as the node does between snapshots): every entry stays addressable by
 * index across the array's moves and growth, reserved or not. */
START_TEST(test_log_rolling_window_moves_and_grows)
{
    for (int reserved = 0; reserved < 2; reserved++) {
        struct raft__log l;
        raft__log_init(&l);
        raft__log_reset(&l, 0, 0);
        if (reserved)
            raft__log_reserve(&l, 256);
        uint64_t next = 1;
        for (int round = 0; round < 300; round++) {
            struct raft_entry e[7];
            for (int i = 0; i < 7; i++) {
                e[i] = (struct raft_entry){.index = next + (uint64_t)i, .term = 1};
                e[i].data = tk_blob_new(8);
                memcpy(e[i].data->data, &e[i].index, 8);
            }
            raft__log_append(&l, e, 7);
            for (int i = 0; i < 7; i++)
                tk_blob_unref(e[i].data);
            next += 7;
            if (round % 3 == 2 && next > 60)
                (void)raft__log_compact(&l, next - 50, NULL); /* a window of about 50 */
            uint64_t first = l.base_index + 1;
            for (uint64_t i = first; i < next; i++) {
                const struct raft_entry *x = raft__log_at(&l, i);
                ck_assert_ptr_nonnull(x);
                ck_assert_uint_eq(x->index, i);
                uint64_t v;
                memcpy(&v, x->data->data, 8);
                ck_assert_uint_eq(v, i);
            }
            /* Ranges stay contiguous: the core hands them out by pointer. */
            ck_assert_ptr_eq(raft__log_at(&l, next - 1),
                             raft__log_at(&l, first) + (next - 1 - first));
        }
        raft__log_truncate(&l, next - 3);
        ck_assert_uint_eq(raft__log_last_index(&l), next - 4);
        raft__log_free(&l);
    }
}
END_TEST

START_TEST(test_follower_truncates_conflicting_suffix)
{
    static const uint64_t boot[] = {1, 1, 2, 2};
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 2, 2, RAFT_NONE, boot, 4);
    struct rf_node *nd = rf_node(c, 2);

    static const uint64_t nt[] = {3, 3, 3};
    struct raft_entry e[3];
    make_entries(e, 3, nt, 3);
    struct raft_message m = append_msg(1, 2, 3, 2, 1, 0, e, 3);
    ck_assert_int_eq(rf_step(c, &m), 0);

    /* The ready replaces the store from the first conflicting index on. */
    ck_assert_uint_eq(nd->last_ready_first_index, 3);
    ck_assert_uint_eq(nd->last_ready_n_entries, 3);
    static const uint64_t want[] = {1, 1, 3, 3, 3};
    assert_log_terms(c, 2, want, 5);

    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(!resp->u.append_resp.reject);
    ck_assert_uint_eq(resp->u.append_resp.index, 5);
    ck_assert_uint_eq(resp->term, 3);
    rf_free(c);
}
END_TEST

START_TEST(test_append_rejected_on_prev_mismatch_with_hint)
{
    static const uint64_t boot[] = {1, 1, 2, 2};
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 2, 2, RAFT_NONE, boot, 4);

    /* Index 4 holds term 2, not 3: the hint is the largest index <= prev
     * whose term is <= prev_term (raft.h), here index 4 itself, term 2. */
    static const uint64_t nt[] = {3};
    struct raft_entry e[1];
    make_entries(e, 5, nt, 1);
    struct raft_message m = append_msg(1, 2, 3, 4, 3, 0, e, 1);
    rf_step(c, &m);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(resp->u.append_resp.reject);
    ck_assert_uint_eq(resp->u.append_resp.index, 4);
    ck_assert_uint_eq(resp->u.append_resp.conflict_term, 2);
    ck_assert_uint_eq(resp->u.append_resp.conflict_index, 4);
    assert_log_terms(c, 2, boot, 4);

    /* A prev beyond the follower's log: the hint is its last index. */
    rf_net_clear(c);
    make_entries(e, 7, nt, 1);
    m = append_msg(1, 2, 3, 6, 3, 0, e, 1);
    rf_step(c, &m);
    resp = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(resp->u.append_resp.reject);
    ck_assert_uint_eq(resp->u.append_resp.index, 6);
    ck_assert_uint_eq(resp->u.append_resp.conflict_index, 4);
    assert_log_terms(c, 2, boot, 4);
    rf_free(c);
}
END_TEST

START_TEST(test_duplicate_and_stale_appends_answered_idempotently)
{
    struct rf_cluster *c = rf_new(3, NULL);
    struct rf_node *nd = rf_node(c, 2);
    static const uint64_t t[] = {1, 1, 2};
    struct raft_entry e[3];
    make_entries(e, 1, t, 3);
    struct raft_message m = append_msg(1, 2, 2, 0, 0, 0, e, 3);
    rf_step(c, &m);
    ck_assert_uint_eq(nd->entries_written, 3);
    assert_log_terms(c, 2, t, 3);

    /* The same message again: acked, nothing rewritten. */
    rf_net_clear(c);
    rf_step(c, &m);
    const struct raft_message *resp = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(!resp->u.append_resp.reject);
    ck_assert_uint_eq(resp->u.append_resp.index, 3);
    ck_assert_uint_eq(nd->entries_written, 3);
    assert_log_terms(c, 2, t, 3);

    /* An older, shorter append of the same leader (reordered): acked, and the
     * matching entries after it are kept. */
    rf_net_clear(c);
    m = append_msg(1, 2, 2, 0, 0, 0, e, 1);
    rf_step(c, &m);
    resp = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(resp);
    ck_assert(!resp->u.append_resp.reject);
    ck_assert_uint_ge(resp->u.append_resp.index, 1);
    ck_assert_uint_le(resp->u.append_resp.index, 3);
    ck_assert_uint_eq(nd->entries_written, 3);
    assert_log_terms(c, 2, t, 3);

    /* A deposed leader's append (term 1 < 2) changes nothing; if answered,
     * the answer carries the current term so the sender steps down. */
    rf_net_clear(c);
    static const uint64_t old[] = {1, 1};
    struct raft_entry oe[2];
    make_entries(oe, 2, old, 2);
    m = append_msg(3, 2, 1, 1, 1, 0, oe, 2);
    rf_step(c, &m);
    assert_log_terms(c, 2, t, 3);
    ck_assert_uint_eq(raft_term(rf_raft(c, 2)), 2);
    ck_assert_uint_eq(raft_leader(rf_raft(c, 2)), 1);
    for (size_t i = c->net_head; i < c->net.n; i++) {
        ck_assert_uint_eq(c->net.v[i].term, 2);
        if (c->net.v[i].type == RAFT_MSG_APPEND_RESP)
            ck_assert(c->net.v[i].u.append_resp.index != 3 ||
                      c->net.v[i].u.append_resp.reject);
    }
    rf_free(c);
}
END_TEST

/* Figure 7: the leader of term 8 and six possible follower logs (a)-(f). */
static const uint64_t fig7_leader[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6};
static const uint64_t fig7_a[] = {1, 1, 1, 4, 4, 5, 5, 6, 6};
static const uint64_t fig7_b[] = {1, 1, 1, 4};
static const uint64_t fig7_c[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6};
static const uint64_t fig7_d[] = {1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7};
static const uint64_t fig7_e[] = {1, 1, 1, 4, 4, 4, 4};
static const uint64_t fig7_f[] = {1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3};

static const struct {
    const char *name;
    const uint64_t *terms;
    size_t n;
} fig7_cases[] = {
    {"a", fig7_a, sizeof(fig7_a) / sizeof(fig7_a[0])},
    {"b", fig7_b, sizeof(fig7_b) / sizeof(fig7_b[0])},
    {"c", fig7_c, sizeof(fig7_c) / sizeof(fig7_c[0])},
    {"d", fig7_d, sizeof(fig7_d) / sizeof(fig7_d[0])},
    {"e", fig7_e, sizeof(fig7_e) / sizeof(fig7_e[0])},
    {"f", fig7_f, sizeof(fig7_f) / sizeof(fig7_f[0])},
};

START_TEST(test_figure7_follower_converges_to_leader)
{
    const size_t nl = sizeof(fig7_leader) / sizeof(fig7_leader[0]);
    const uint64_t *ft = fig7_cases[_i].terms;
    const size_t nf = fig7_cases[_i].n;
    struct rf_cluster *c = rf_new(3, NULL);
    /* Node 1 becomes the leader of term 8; node 3 has its log and votes for
     * it; node 2 is the follower of case (a)-(f). */
    rf_boot_log(c, 1, 7, RAFT_NONE, fig7_leader, nl);
    rf_boot_log(c, 3, 7, RAFT_NONE, fig7_leader, nl);
    rf_boot_log(c, 2, ft[nf - 1], RAFT_NONE, ft, nf);

    uint64_t t = rf_elect(c, 1);
    ck_assert_uint_eq(t, 8);
    const struct raft_entry *noop = raft_entry_at(rf_raft(c, 1), nl + 1);
    ck_assert_ptr_nonnull(noop);
    ck_assert_int_eq(noop->type, RAFT_ENTRY_NOOP);
    ck_assert_uint_eq(noop->term, 8);

    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    ck_assert_uint_eq(raft_term(rf_raft(c, 2)), 8);
    rf_assert_logs_equal(c, 1, 2, 1);
    rf_assert_logs_equal(c, 1, 3, 1);
    uint64_t last = raft_last_index(rf_raft(c, 1));
    for (uint64_t id = 1; id <= 3; id++) {
        ck_assert_uint_eq(raft_commit(rf_raft(c, id)), last);
        ck_assert_uint_eq(rf_node(c, id)->applied_index, last);
    }
    /* Every node applied the same entries (state machine safety). */
    for (size_t i = 0; i < rf_node(c, 1)->n_applied; i++)
        ck_assert_uint_eq(rf_node(c, 2)->applied[i].term, rf_node(c, 1)->applied[i].term);
    rf_free(c);
}
END_TEST

START_TEST(test_hold_apply_keeps_committing_and_hands_out_later)
{
    /* A follower whose state machine cannot take more (raft_hold_apply) is
     * handed no committed entries, but goes on appending, acking and
     * answering heartbeats, so the leader commits with it; once the hold is
     * cleared, everything committed is handed out in order. */
    struct rf_cluster *c = rf_new(3, NULL);
    rf_elect(c, 1);
    uint64_t before = rf_node(c, 2)->applied_index;
    raft_hold_apply(rf_raft(c, 2), true);
    c->isolated[3] = true;
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 5, 16, &first), 0);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 3);
    uint64_t last = first + 4;
    /* Commits needed node 2's acks: node 3 is cut off. */
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), last);
    ck_assert_uint_ge(raft_commit(rf_raft(c, 2)), last);
    ck_assert_uint_eq(rf_node(c, 1)->applied_index, last);
    ck_assert_uint_eq(rf_node(c, 2)->applied_index, before);
    ck_assert_int_eq(raft_role(rf_raft(c, 1)), RAFT_LEADER);
    ck_assert_uint_eq(raft_leader(rf_raft(c, 2)), 1);
    raft_hold_apply(rf_raft(c, 2), false);
    ck_assert(raft_has_ready(rf_raft(c, 2)));
    rf_drain(c, 2);
    ck_assert_uint_eq(rf_node(c, 2)->applied_index, last);
    for (size_t i = 0; i < rf_node(c, 2)->n_applied; i++)
        ck_assert_uint_eq(rf_node(c, 2)->applied[i].index,
                          rf_node(c, 1)->applied[i].index);
    rf_free(c);
}
END_TEST

START_TEST(test_committed_entries_per_ready_are_bounded_by_bytes)
{
    /* max_apply_bytes: a backlog of committed entries is handed out a few
     * at a time (here 2 of 40 bytes within 100), over several readies. */
    struct raft_options o;
    rf_options(&o);
    o.max_apply_bytes = 100;
    struct rf_cluster *c = rf_new(3, &o);
    rf_elect(c, 1);
    raft_hold_apply(rf_raft(c, 2), true);
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 6, 40, &first), 0);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_ge(raft_commit(rf_raft(c, 2)), first + 5);
    ck_assert_uint_lt(rf_node(c, 2)->applied_index, first);
    uint64_t readies = rf_node(c, 2)->n_readies;
    raft_hold_apply(rf_raft(c, 2), false);
    rf_drain(c, 2);
    ck_assert_uint_eq(rf_node(c, 2)->applied_index, first + 5);
    ck_assert_uint_ge(rf_node(c, 2)->n_readies - readies, 3);
    rf_free(c);
}
END_TEST

START_TEST(test_committed_entries_per_ready_are_bounded_by_count)
{
    /* max_apply_entries: small entries within the bytes bound still come at
     * most that many per ready. */
    struct raft_options o;
    rf_options(&o);
    o.max_apply_entries = 4;
    struct rf_cluster *c = rf_new(3, &o);
    rf_elect(c, 1);
    raft_hold_apply(rf_raft(c, 2), true);
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 20, 8, &first), 0);
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_ge(raft_commit(rf_raft(c, 2)), first + 19);
    uint64_t readies = rf_node(c, 2)->n_readies;
    raft_hold_apply(rf_raft(c, 2), false);
    rf_drain(c, 2);
    ck_assert_uint_eq(rf_node(c, 2)->applied_index, first + 19);
    ck_assert_uint_ge(rf_node(c, 2)->n_readies - readies, 5);
    rf_free(c);
}
END_TEST

static bool drop_appends_from_1(const struct raft_message *m, void *data)
{
    (void)data;
    return m->from == 1 && m->type == RAFT_MSG_APPEND;
}

START_TEST(test_figure8_no_commit_of_old_term_by_counting)
{
    /* Figure 8 (c): S1 leads term 4 and carries index 2 of term 2 to S2 and
     * S3, a majority of five. S5 holds (2, 3) and could still win an election
     * with S2-S4's votes, so index 2 must not count as committed yet. */
    static const uint64_t s12[] = {1, 2};
    static const uint64_t s34[] = {1};
    static const uint64_t s5[] = {1, 3};
    struct rf_cluster *c = rf_new(5, NULL);
    rf_boot_log(c, 1, 3, RAFT_NONE, s12, 2);
    rf_boot_log(c, 2, 3, RAFT_NONE, s12, 2);
    rf_boot_log(c, 3, 3, RAFT_NONE, s34, 1);
    rf_boot_log(c, 4, 3, RAFT_NONE, s34, 1);
    rf_boot_log(c, 5, 3, RAFT_NONE, s5, 2);

    c->drop = drop_appends_from_1;
    uint64_t t = rf_elect(c, 1);
    ck_assert_uint_eq(t, 4);
    rf_net_clear(c);

    /* S2 and S3 really acknowledge index 2 (what a one-entry append from S1
     * makes them say); S1's later appends are lost. */
    static const uint64_t two[] = {2};
    struct raft_entry e[1];
    make_entries(e, 2, two, 1);
    for (uint64_t id = 2; id <= 3; id++) {
        struct raft_message m = append_msg(1, id, 4, 1, 1, 0, e, 1);
        rf_step(c, &m);
        const struct raft_message *ack = rf_queued_find(c, id, 1, RAFT_MSG_APPEND_RESP);
        ck_assert_ptr_nonnull(ack);
        ck_assert(!ack->u.append_resp.reject);
        ck_assert_uint_eq(ack->u.append_resp.index, 2);
    }
    rf_run(c);
    rf_heartbeat_rounds(c, 1, 3);
    struct raft *r1 = rf_raft(c, 1);
    ck_assert_int_eq(raft_role(r1), RAFT_LEADER);
    uint64_t match = 0, next = 0;
    ck_assert_int_eq(raft_progress(r1, 3, &match, &next), 0);
    ck_assert_uint_eq(match, 2);
    ck_assert_uint_ge(raft_stable_index(r1), 3);
    ck_assert_msg(raft_commit(r1) < 2,
                  "leader committed index %llu of an old term by counting",
                  (unsigned long long)raft_commit(r1));
    ck_assert_uint_eq(rf_node(c, 1)->n_applied, 0);

    /* Figure 8 (e): once an entry of term 4 is on a majority, it and
     * everything before it are committed. */
    c->drop = NULL;
    /* Lost appends are retried within a few election timeouts. */
    rf_heartbeat_rounds(c, 1, 3 * 10);
    uint64_t last = raft_last_index(r1);
    ck_assert_uint_eq(raft_commit(r1), last);
    ck_assert_uint_ge(rf_node(c, 1)->n_applied, 3);
    ck_assert_uint_eq(rf_node(c, 1)->applied[1].index, 2);
    ck_assert_uint_eq(rf_node(c, 1)->applied[1].term, 2);
    /* S5's (2, 3) is overwritten; S2 and S3 get the appends they lost. */
    for (uint64_t id = 2; id <= 5; id++)
        rf_assert_logs_equal(c, 1, id, 1);
    rf_free(c);
}
END_TEST

static uint64_t elect_settled(struct rf_cluster *c)
{
    uint64_t t = rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), raft_last_index(rf_raft(c, 1)));
    return t;
}

START_TEST(test_append_ack_waits_for_persisted)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    rf_hold(c, 2);
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 16, &idx), 0);
    rf_run(c);

    /* Node 2 wrote the entry but must not acknowledge it yet (thesis 3.8). */
    ck_assert_uint_eq(rf_store_last_index(c, 2), idx);
    for (size_t i = 0; i < c->trace.n; i++) {
        const struct raft_message *m = &c->trace.v[i];
        if (m->from == 2 && m->type == RAFT_MSG_APPEND_RESP)
            ck_assert_msg(m->u.append_resp.reject || m->u.append_resp.index < idx,
                          "node 2 acked %llu before it was durable",
                          (unsigned long long)m->u.append_resp.index);
    }
    ck_assert_uint_eq(rf_queued_count(c, 2, 0, RAFT_MSG_APPEND_RESP), 0);
    uint64_t match = 0, next = 0;
    raft_progress(rf_raft(c, 1), 2, &match, &next);
    ck_assert_uint_lt(match, idx);

    rf_release(c, 2);
    const struct raft_message *ack = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert_ptr_nonnull(ack);
    ck_assert(!ack->u.append_resp.reject);
    ck_assert_uint_ge(ack->u.append_resp.index, idx);
    rf_run(c);
    raft_progress(rf_raft(c, 1), 2, &match, &next);
    ck_assert_uint_ge(match, idx);
    rf_free(c);
}
END_TEST

/* Appends that became durable together are answered with one ack, the
 * newest: the follower folds the older ones into it (raft_acks_merged), and
 * the leader's match moves to the newest at once. */
START_TEST(test_acks_released_together_are_one_message)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    rf_hold(c, 2);
    uint64_t idx = 0;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(rf_propose(c, 1, 1, 16, &idx), 0);
        rf_run(c); /* one append each, held by node 2 */
    }
    ck_assert_uint_eq(rf_store_last_index(c, 2), idx);
    ck_assert_uint_eq(rf_queued_count(c, 2, 1, RAFT_MSG_APPEND_RESP), 0);
    uint64_t merged0 = raft_acks_merged(rf_raft(c, 2));
    rf_release(c, 2);
    ck_assert_uint_eq(rf_queued_count(c, 2, 1, RAFT_MSG_APPEND_RESP), 1);
    const struct raft_message *ack = rf_queued_find(c, 2, 1, RAFT_MSG_APPEND_RESP);
    ck_assert(!ack->u.append_resp.reject);
    ck_assert_uint_eq(ack->u.append_resp.index, idx);
    ck_assert_uint_eq(raft_acks_merged(rf_raft(c, 2)) - merged0, 2);
    rf_run(c);
    uint64_t match = 0, next = 0;
    raft_progress(rf_raft(c, 1), 2, &match, &next);
    ck_assert_uint_eq(match, idx);
    rf_free(c);
}
END_TEST

START_TEST(test_leader_undurable_commits_with_two_follower_acks)
{
    /* Thesis 10.2.1: the leader writes in parallel with its followers; a
     * majority of followers is enough. */
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    rf_hold(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 16, &idx), 0);
    rf_run(c);
    ck_assert_uint_lt(raft_stable_index(rf_raft(c, 1)), idx);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), idx);
    rf_release(c, 1);
    rf_free(c);
}
END_TEST

START_TEST(test_leader_undurable_one_follower_ack_no_commit)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    c->isolated[3] = true;
    rf_hold(c, 1);
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 16, &idx), 0);
    rf_run(c);
    /* The append left before the leader's own write was durable... */
    bool sent = false;
    for (size_t i = 0; i < c->trace.n; i++) {
        const struct raft_message *m = &c->trace.v[i];
        if (m->from == 1 && m->to == 2 && m->type == RAFT_MSG_APPEND)
            for (uint32_t k = 0; k < m->u.append.n_entries; k++)
                sent = sent || m->u.append.entries[k].index == idx;
    }
    ck_assert(sent);
    uint64_t match = 0, next = 0;
    raft_progress(rf_raft(c, 1), 2, &match, &next);
    ck_assert_uint_eq(match, idx);
    /* ...but one durable copy of three is no majority. */
    ck_assert_uint_lt(raft_commit(rf_raft(c, 1)), idx);

    /* The leader's own durable write makes two. */
    rf_release(c, 1);
    ck_assert_uint_eq(raft_stable_index(rf_raft(c, 1)), idx);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), idx);
    rf_free(c);
}
END_TEST

START_TEST(test_leader_durable_without_acks_no_commit)
{
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    c->isolated[2] = c->isolated[3] = true;
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 1, 1, 16, &idx), 0);
    rf_run(c);
    rf_tick(c, 1);
    rf_run(c);
    ck_assert_uint_eq(raft_stable_index(rf_raft(c, 1)), idx);
    ck_assert_uint_lt(raft_commit(rf_raft(c, 1)), idx);
    rf_free(c);
}
END_TEST

static bool drop_appends_with_entries_to_2(const struct raft_message *m, void *data)
{
    (void)data;
    return m->to == 2 && m->type == RAFT_MSG_APPEND && m->u.append.n_entries > 0;
}

START_TEST(test_lost_appends_are_retried)
{
    /* Paper 5.3: "If followers crash or run slowly, or if network packets are
     * lost, the leader retries AppendEntries RPCs indefinitely". A follower
     * in the replicate state loses the appends for new entries; no further
     * proposal comes; heartbeats alone must get it caught up. */
    struct rf_cluster *c = rf_new(3, NULL);
    elect_settled(c);
    c->drop = drop_appends_with_entries_to_2;
    uint64_t idx = 0;
    ck_assert_int_eq(rf_propose(c, 1, 3, 8, &idx), 0);
    rf_run(c);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), idx + 2);
    ck_assert_uint_lt(raft_last_index(rf_raft(c, 2)), idx);
    c->drop = NULL;
    rf_heartbeat_rounds(c, 1, 3 * 10); /* a few election timeouts */
    rf_assert_logs_equal(c, 1, 2, 1);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 2)), idx + 2);
    rf_free(c);
}
END_TEST

/* Index in the trace of the first rejection from `from`, or trace.n. */
static size_t first_reject(const struct rf_cluster *c, uint64_t from)
{
    for (size_t i = 0; i < c->trace.n; i++)
        if (c->trace.v[i].from == from && c->trace.v[i].type == RAFT_MSG_APPEND_RESP &&
            c->trace.v[i].u.append_resp.reject)
            return i;
    return c->trace.n;
}

static size_t count_rejects(const struct rf_cluster *c, uint64_t from)
{
    size_t n = 0;
    for (size_t i = 0; i < c->trace.n; i++)
        n += c->trace.v[i].from == from && c->trace.v[i].type == RAFT_MSG_APPEND_RESP &&
             c->trace.v[i].u.append_resp.reject;
    return n;
}

/* The first append from 1 to 2 delivered after trace position `after`. */
static const struct raft_message *next_append(const struct rf_cluster *c, size_t after)
{
    for (size_t i = after + 1; i < c->trace.n; i++)
        if (c->trace.v[i].from == 1 && c->trace.v[i].to == 2 &&
            c->trace.v[i].type == RAFT_MSG_APPEND)
            return &c->trace.v[i];
    return NULL;
}

/* Node 1 is elected with a log node 2 conflicts with: node 2's first
 * rejection carries a hint that takes the leader straight to index 1 or
 * below (at most two rejections in all), and then the logs agree. Frees c. */
static void elect_and_backtrack_at_once(struct rf_cluster *c)
{
    rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);

    size_t rj = first_reject(c, 2);
    ck_assert_msg(rj < c->trace.n, "node 2 never rejected");
    const struct raft_message *a = next_append(c, rj);
    ck_assert_ptr_nonnull(a);
    ck_assert_msg(a->u.append.prev_index <= 1,
                  "after the hint the leader probed at %llu, not <= 1",
                  (unsigned long long)a->u.append.prev_index);
    ck_assert_uint_le(count_rejects(c, 2), 2);
    rf_assert_logs_equal(c, 1, 2, 1);
    rf_free(c);
}

START_TEST(test_fast_backtracking_skips_conflicting_term)
{
    uint64_t lt[11], ft[11];
    lt[0] = ft[0] = 1;
    for (int i = 1; i < 11; i++) {
        lt[i] = 3;
        ft[i] = 2;
    }
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 1, 3, RAFT_NONE, lt, 11);
    rf_boot_log(c, 3, 3, RAFT_NONE, lt, 11);
    rf_boot_log(c, 2, 2, RAFT_NONE, ft, 11);
    elect_and_backtrack_at_once(c);
}
END_TEST

START_TEST(test_fast_backtracking_jumps_to_short_follower_end)
{
    uint64_t lt[10];
    for (int i = 0; i < 10; i++)
        lt[i] = 1;
    struct rf_cluster *c = rf_new(3, NULL);
    rf_boot_log(c, 1, 1, RAFT_NONE, lt, 10);
    rf_boot_log(c, 3, 1, RAFT_NONE, lt, 10);
    rf_boot_log(c, 2, 1, RAFT_NONE, lt, 1);
    elect_and_backtrack_at_once(c);
}
END_TEST

static size_t queued_appends_with_entries(const struct rf_cluster *c, uint64_t to,
                                          uint64_t *max_index)
{
    size_t n = 0;
    for (size_t i = c->net_head; i < c->net.n; i++) {
        const struct raft_message *m = &c->net.v[i];
        if (m->from != 1 || m->to != to || m->type != RAFT_MSG_APPEND ||
            m->u.append.n_entries == 0)
            continue;
        n++;
        uint64_t li = m->u.append.entries[m->u.append.n_entries - 1].index;
        if (max_index != NULL && li > *max_index)
            *max_index = li;
    }
    return n;
}

START_TEST(test_inflight_limit_caps_unacked_appends)
{
    struct raft_options o;
    rf_options(&o);
    o.max_append_entries = 1;
    o.max_inflight_msgs = 4;
    struct rf_cluster *c = rf_new(3, &o);
    elect_settled(c);
    c->isolated[3] = true;
    uint64_t first = 0;
    ck_assert_int_eq(rf_propose(c, 1, 10, 8, &first), 0);

    /* Replicate state: the window fills (pipelining) and stops at 4. */
    uint64_t maxi = 0;
    ck_assert_uint_eq(queued_appends_with_entries(c, 2, &maxi), 4);
    ck_assert_uint_eq(maxi, first + 3);
    for (int i = 0; i < 5; i++)
        rf_tick(c, 1);
    ck_assert_uint_eq(queued_appends_with_entries(c, 2, NULL), 4);

    /* One ack frees one slot: exactly one more append. */
    ck_assert(rf_deliver_first(c, 1, 2, RAFT_MSG_APPEND));
    ck_assert(rf_deliver_first(c, 2, 1, RAFT_MSG_APPEND_RESP));
    maxi = 0;
    ck_assert_uint_eq(queued_appends_with_entries(c, 2, &maxi), 4);
    ck_assert_uint_eq(maxi, first + 4);

    c->isolated[3] = false;
    rf_heartbeat_rounds(c, 1, 3);
    ck_assert_uint_eq(raft_commit(rf_raft(c, 1)), first + 9);
    rf_assert_logs_equal(c, 1, 2, 1);
    rf_assert_logs_equal(c, 1, 3, 1);
    rf_free(c);
}
END_TEST

/* ---- no allocation per step in steady state ----------------------------- */

/* raft.h promises that a step allocates nothing once the core's arrays have
 * reached their working size. The test replicates a warm-up's worth of
 * entries, then counts tk_malloc/tk_calloc/tk_realloc calls (tk_alloc_stats)
 * across many more rounds of propose, replicate, ack and commit on a cluster
 * of three. The fixture copies messages and mirrors logs with plain malloc,
 * and the payload blobs (tk_blob_new is tk_malloc) are made before the
 * measured window, so every counted call is the core's.
 *
 * The log must not grow during the window, which the node arranges in one of
 * two ways, one per loop iteration: a log_reserve that covers the whole run,
 * or (no reservation) a snapshot and a compaction every STEADY_WINDOW
 * entries, so the live entries move to the front of the array instead.
 *
 * The third iteration keeps storage always one round behind (with a
 * reservation): the core's queue of persist records (r->prec) then never
 * empties, and must still not grow. */
enum steady_mode {
    STEADY_RESERVED = 0,
    STEADY_ROLLING = 1,
    STEADY_LAGGING = 2,
};
#define STEADY_MODES 3 /* the modes the test loops over */

#define STEADY_BATCH 4
#define STEADY_WARM_ROUNDS 200 /* 800 entries */
#define STEADY_ROUNDS 400      /* 1,600 entries measured */
#define STEADY_WINDOW 64
#define STEADY_PAYLOAD_BYTES 64

/* Every node snapshots at its applied index once STEADY_WINDOW entries have
 * gathered, and compacts all but the last STEADY_WINDOW / 2 of them. */
static void steady_compact(struct rf_cluster *c, struct tk_blob *snap_data)
{
    for (uint64_t id = 1; id <= c->n; id++) {
        struct raft *r = rf_raft(c, id);
        uint64_t applied = raft_applied_index(r);
        if (applied < raft_first_index(r) + STEADY_WINDOW)
            continue;
        struct raft_snapshot_meta meta;
        memset(&meta, 0, sizeof(meta));
        meta.index = applied;
        meta.term = rf_term_at(c, id, applied);
        meta.config = *raft_config(r);
        ck_assert_int_eq(raft_snapshot_set(r, &meta, snap_data), 0);
        ck_assert_int_eq(raft_compact(r, applied - STEADY_WINDOW / 2), 0);
    }
}

struct steady {
    int mode;
    struct tk_blob *snap_data;
    uint64_t lag_seq[RAFT_VOTERS_MAX + 1]; /* STEADY_LAGGING: by node id */
};

/* One round: the leader (node 1) proposes STEADY_BATCH entries whose
 * payloads the caller made, every node ticks once, and the network runs
 * until it is quiet. STEADY_LAGGING reports each node's writes durable one
 * round late, as a node whose storage thread is always one group behind. */
static void steady_round(struct rf_cluster *c, struct steady *st,
                         struct tk_blob **payloads)
{
    if (st->mode == STEADY_LAGGING) {
        for (uint64_t id = 1; id <= c->n; id++) {
            if (st->lag_seq[id] != 0)
                raft_persisted(rf_raft(c, id), st->lag_seq[id]);
            rf_drain(c, id);
            st->lag_seq[id] = rf_node(c, id)->held_seq;
        }
    }
    struct raft_entry e[STEADY_BATCH];
    memset(e, 0, sizeof(e));
    for (size_t i = 0; i < STEADY_BATCH; i++) {
        e[i].type = RAFT_ENTRY_NORMAL;
        e[i].time_ms = 7000 + i;
        e[i].data = payloads[i];
    }
    uint64_t first = 0, term = 0;
    ck_assert_int_eq(raft_propose(rf_raft(c, 1), e, STEADY_BATCH, &first, &term), 0);
    for (uint64_t id = 1; id <= c->n; id++)
        rf_tick(c, id);
    rf_run(c);
    if (st->mode == STEADY_ROLLING)
        steady_compact(c, st->snap_data);
}

START_TEST(test_steady_state_replication_allocates_nothing)
{
    const int mode = _i;
    struct raft_options o;
    rf_options(&o);
    if (mode != STEADY_ROLLING)
        o.log_reserve = 4096; /* more than the whole run */
    struct rf_cluster *c = rf_new(3, &o);
    rf_elect(c, 1);
    rf_heartbeat_rounds(c, 1, 2);

    const size_t n_payloads = (STEADY_WARM_ROUNDS + STEADY_ROUNDS) * STEADY_BATCH;
    struct tk_blob **payloads = malloc(n_payloads * sizeof(*payloads));
    ck_assert_ptr_nonnull(payloads);
    for (size_t i = 0; i < n_payloads; i++) {
        payloads[i] = tk_blob_new(STEADY_PAYLOAD_BYTES);
        memset(payloads[i]->data, 'a' + (int)(i % 26), STEADY_PAYLOAD_BYTES);
    }
    struct steady st;
    memset(&st, 0, sizeof(st));
    st.mode = mode;
    st.snap_data = tk_blob_copy("state", 5);
    if (mode == STEADY_LAGGING)
        for (uint64_t id = 1; id <= 3; id++)
            rf_hold(c, id);

    struct tk_blob **next = payloads;
    for (int i = 0; i < STEADY_WARM_ROUNDS; i++, next += STEADY_BATCH)
        steady_round(c, &st, next);
    uint64_t start = raft_commit(rf_raft(c, 1));

    struct tk_alloc_stats before, after;
    tk_alloc_stats(&before);
    for (int i = 0; i < STEADY_ROUNDS; i++, next += STEADY_BATCH)
        steady_round(c, &st, next);
    tk_alloc_stats(&after);

    /* The window did the work: every entry committed and applied everywhere. */
    if (mode == STEADY_LAGGING)
        for (uint64_t id = 1; id <= 3; id++)
            rf_release(c, id);
    rf_heartbeat_rounds(c, 1, 2);
    uint64_t last = raft_last_index(rf_raft(c, 1));
    ck_assert_uint_ge(last - start, STEADY_ROUNDS * STEADY_BATCH);
    for (uint64_t id = 1; id <= 3; id++) {
        ck_assert_uint_eq(raft_commit(rf_raft(c, id)), last);
        ck_assert_uint_eq(rf_node(c, id)->applied_index, last);
    }
    if (mode == STEADY_ROLLING)
        ck_assert_uint_gt(raft_first_index(rf_raft(c, 1)), start);
    ck_assert_msg(after.calls == before.calls,
                  "mode %d: the core allocated %llu times (%llu bytes) while "
                  "replicating %d entries",
                  mode, (unsigned long long)(after.calls - before.calls),
                  (unsigned long long)(after.bytes - before.bytes),
                  STEADY_ROUNDS * STEADY_BATCH);

    for (size_t i = 0; i < n_payloads; i++)
        tk_blob_unref(payloads[i]);
    free(payloads);
    tk_blob_unref(st.snap_data);
    rf_free(c);
}
END_TEST

static Suite *replication_suite(void)
{
    Suite *s = suite_create("raft_replication");
    TCase *tc = tcase_create("replication");
    tcase_add_test(tc, test_follower_truncates_conflicting_suffix);
    tcase_add_test(tc, test_append_rejected_on_prev_mismatch_with_hint);
    tcase_add_test(tc, test_duplicate_and_stale_appends_answered_idempotently);
    tcase_add_loop_test(tc, test_figure7_follower_converges_to_leader, 0,
                        (int)(sizeof(fig7_cases) / sizeof(fig7_cases[0])));
    tcase_add_test(tc, test_figure8_no_commit_of_old_term_by_counting);
    tcase_add_test(tc, test_append_ack_waits_for_persisted);
    tcase_add_test(tc, test_acks_released_together_are_one_message);
    tcase_add_test(tc, test_leader_undurable_commits_with_two_follower_acks);
    tcase_add_test(tc, test_leader_undurable_one_follower_ack_no_commit);
    tcase_add_test(tc, test_leader_durable_without_acks_no_commit);
    tcase_add_test(tc, test_lost_appends_are_retried);
    tcase_add_test(tc, test_fast_backtracking_skips_conflicting_term);
    tcase_add_test(tc, test_fast_backtracking_jumps_to_short_follower_end);
    tcase_add_test(tc, test_inflight_limit_caps_unacked_appends);
    tcase_add_test(tc, test_log_rolling_window_moves_and_grows);
    tcase_add_test(tc, test_hold_apply_keeps_committing_and_hands_out_later);
    tcase_add_test(tc, test_committed_entries_per_ready_are_bounded_by_bytes);
    tcase_add_test(tc, test_committed_entries_per_ready_are_bounded_by_count);
    tcase_add_loop_test(tc, test_steady_state_replication_allocates_nothing, 0,
                        STEADY_MODES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(replication_suite()));
}
