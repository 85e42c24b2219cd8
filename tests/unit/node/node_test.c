/* Node runtime tests: in-process clusters (inproc transport, memory volumes)
 * and one TCP cluster, driven through the public API (include/tierkv.h). */
#include <arpa/inet.h>
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/hist.h"
#include "base/log.h"
#include "include/tierkv.h"
#include "kv.pb-c.h"
#include "kv/kv.h"
#include "node/node.h"
#include "node/node_internal.h" /* m.metrics.snapshots_refused */
#include "store/store.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"
#include "tierkv.pb-c.h"
#include "transport/transport.h"

static bool one_loop;    /* the tests below run again with every node on one loop */
static uint32_t spin_us; /* ... and with loops and callers that spin before sleeping */

static void test_options(struct tk_options *o, uint64_t snapshot_entries)
{
    nf_options(o);
    o->one_loop = one_loop;
    o->spin_us = spin_us;
    o->seed = 42;
    if (snapshot_entries) {
        o->snapshot_entries = snapshot_entries;
        o->trailing_entries = 10;
    }
}

static struct tk_cluster *start(uint32_t n, uint64_t snapshot_entries)
{
    struct tk_options o;
    test_options(&o, snapshot_entries);
    return nf_cluster_start(n, &o);
}

static int index_of(struct tk_cluster *c, struct tk_node *n)
{
    for (uint32_t i = 0; i < TK_MEMBERS_MAX; i++)
        if (tk_cluster_node(c, i) == n)
            return (int)i;
    return -1;
}

/* Waits until node i has applied at least `index`. */
static void wait_applied(struct tk_cluster *c, uint32_t i, uint64_t index)
{
    for (int t = 0; t < 2000; t++) {
        struct tk_status st;
        tk_node_status(tk_cluster_node(c, i), &st);
        if (st.applied >= index)
            return;
        usleep(5000);
    }
    ck_abort_msg("node %u never applied %llu", i, (unsigned long long)index);
}

static void assert_value(struct tk_node *n, const char *k, const char *want,
                         enum tk_consistency c)
{
    struct tk_value v;
    int rc = tk_get(n, k, strlen(k), c, &v);
    ck_assert_msg(rc == 0, "get %s: %s", k, tk_strerror(rc));
    ck_assert_uint_eq(v.len, strlen(want));
    ck_assert(memcmp(v.value, want, v.len) == 0);
    tk_value_free(&v);
}

START_TEST(test_single_node_commits_after_own_persist)
{
    struct tk_node *n = nf_single_start();
    struct tk_write_result res;
    nf_put(n, "a", "1", TK_MODE_APPLIED, &res);
    ck_assert_uint_gt(res.revision, 0);
    assert_value(n, "a", "1", TK_READ_LINEARIZABLE);
    struct tk_write_result inc;
    ck_assert_int_eq(tk_incr(n, "ctr", 3, 5, TK_MODE_APPLIED, &inc), 0);
    ck_assert_int_eq(tk_incr(n, "ctr", 3, 2, TK_MODE_APPLIED, &inc), 0);
    ck_assert_int_eq(inc.value, 7);
    tk_node_stop(n);
}
END_TEST

START_TEST(test_three_nodes_elect_and_replicate)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_write_result res;
    nf_put(l, "k", "v", TK_MODE_APPLIED, &res);
    for (uint32_t i = 0; i < 3; i++) {
        wait_applied(c, i, res.revision);
        assert_value(tk_cluster_node(c, i), "k", "v", TK_READ_STALE);
    }
    /* Everyone comes to agree on one leader (bounded: on a loaded machine a
     * late heartbeat may start a pre-vote round first). */
    bool agreed = false;
    for (int w = 0; w < 1000 && !agreed; w++) {
        uint64_t l0 = tk_node_leader(tk_cluster_node(c, 0));
        agreed = l0 != 0;
        for (uint32_t i = 1; i < 3 && agreed; i++)
            agreed = tk_node_leader(tk_cluster_node(c, i)) == l0;
        if (!agreed)
            usleep(5000);
    }
    ck_assert_msg(agreed, "the nodes never agreed on a leader");
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_write_on_follower_is_forwarded_to_the_leader)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_node *f = tk_cluster_node(c, (uint32_t)(index_of(c, l) + 1) % 3);
    for (int t = 0; t < 200 && tk_node_leader(f) == 0; t++)
        usleep(5000);
    struct tk_write_result res;
    int rc = tk_put(f, "x", 1, "y", 1, TK_MODE_APPLIED, &res);
    ck_assert_msg(rc == 0, "forwarded put: %s", tk_strerror(rc));
    ck_assert_uint_gt(res.revision, 0);
    struct tk_write_result inc;
    ck_assert_int_eq(tk_incr(f, "n", 1, 4, TK_MODE_COMMITTED, &inc), 0);
    ck_assert_int_eq(tk_incr(f, "n", 1, 4, TK_MODE_APPLIED, &inc), 0);
    ck_assert_int_eq(inc.value, 8); /* the leader's result came back */
    assert_value(l, "x", "y", TK_READ_LINEARIZABLE);
    assert_value(f, "x", "y", TK_READ_LINEARIZABLE);
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_write_without_leader_fails_explicitly)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t fi = (uint32_t)(index_of(c, l) + 1) % 3;
    ck_assert_int_eq(tk_cluster_isolate(c, fi, true), 0);
    ck_assert_int_eq(tk_cluster_restart_node(c, fi), 0); /* knows no leader */
    int rc = tk_put(tk_cluster_node(c, fi), "z", 1, "1", 1, TK_MODE_APPLIED, NULL);
    ck_assert_msg(rc == TK_ENOLEADER || rc == TK_ETIMEDOUT, "%s", tk_strerror(rc));
    ck_assert_int_eq(tk_cluster_isolate(c, fi, false), 0);
    tk_cluster_stop(c);
}
END_TEST

/* Puts through the current leader, again through the next one if leadership
 * moved under the put (a starved loop on a loaded machine can miss its
 * heartbeats); a failure that is not about leadership fails the test. Returns
 * the node that applied the write. */
static struct tk_node *put_on_leader(struct tk_cluster *c, const char *k, const char *v)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        struct tk_node *l = nf_cluster_leader(c);
        int rc = tk_put(l, k, strlen(k), v, strlen(v), TK_MODE_APPLIED, NULL);
        if (rc == 0)
            return l;
        ck_assert_msg(rc == TK_ELOST || rc == TK_ENOTLEADER || rc == TK_ENOLEADER,
                      "put %s: %s", k, tk_strerror(rc));
    }
    ck_abort_msg("put %s: leadership moved five times", k);
    return NULL;
}

START_TEST(test_applied_result_visible_to_immediate_read)
{
    struct tk_cluster *c = start(3, 0);
    for (int i = 0; i < 50; i++) {
        char k[16], v[16];
        snprintf(k, sizeof(k), "k%d", i);
        snprintf(v, sizeof(v), "v%d", i);
        struct tk_node *l = put_on_leader(c, k, v);
        assert_value(l, k, v, TK_READ_STALE); /* read-your-writes, locally */
    }
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_committed_mode_completes_no_later_than_applied)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_write_result rc1, ra;
    nf_put(l, "c", "1", TK_MODE_COMMITTED, &rc1);
    nf_put(l, "a", "1", TK_MODE_APPLIED, &ra);
    ck_assert_uint_gt(rc1.revision, 0);
    ck_assert_uint_gt(ra.revision, rc1.revision);
    /* When the committed-mode put returned, its entry was committed: */
    struct tk_status st;
    tk_node_status(l, &st);
    ck_assert_uint_ge(st.commit, rc1.revision);
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_follower_restarts_and_catches_up)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t f = (uint32_t)(index_of(c, l) + 1) % 3;
    nf_put(l, "before", "1", TK_MODE_APPLIED, NULL);
    ck_assert_int_eq(tk_cluster_isolate(c, f, true), 0);
    struct tk_write_result res;
    for (int i = 0; i < 100; i++)
        nf_put(l, "during", "2", TK_MODE_APPLIED, &res);
    ck_assert_int_eq(tk_cluster_restart_node(c, f), 0);
    ck_assert_int_eq(tk_cluster_isolate(c, f, false), 0);
    wait_applied(c, f, res.revision);
    assert_value(tk_cluster_node(c, f), "before", "1", TK_READ_STALE);
    assert_value(tk_cluster_node(c, f), "during", "2", TK_READ_STALE);
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_lagging_follower_catches_up_by_snapshot)
{
    struct tk_cluster *c = start(3, 50); /* snapshot every 50 entries */
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t f = (uint32_t)(index_of(c, l) + 1) % 3;
    ck_assert_int_eq(tk_cluster_isolate(c, f, true), 0);
    struct tk_write_result res;
    char k[16];
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        nf_put(l, k, "v", TK_MODE_APPLIED, &res);
    }
    /* Snapshots are taken in the background: wait for one past 100. */
    struct tk_status st;
    for (int w = 0; w < 1000; w++) {
        tk_node_status(l, &st);
        if (st.snapshot_index > 100)
            break;
        usleep(5000);
    }
    ck_assert_uint_gt(st.snapshot_index, 100);
    ck_assert_int_eq(tk_cluster_isolate(c, f, false), 0);
    wait_applied(c, f, res.revision);
    struct tk_status fs;
    tk_node_status(tk_cluster_node(c, f), &fs);
    ck_assert_uint_gt(fs.snapshot_index, 0); /* it got there by a snapshot */
    assert_value(tk_cluster_node(c, f), "k0", "v", TK_READ_STALE);
    assert_value(tk_cluster_node(c, f), "k299", "v", TK_READ_STALE);
    tk_cluster_stop(c);
}
END_TEST

/* A large state (a small ring: its LMDB file soon passes 4 times the ring's
 * budget) takes its snapshots as descriptors only, reading nothing while
 * the follower is away (tierkv_snapshot_descriptors_total, with
 * tierkv_snapshot_reads_total still 0); once the follower is back and behind
 * the log's start, the leader reads the cold tier out for it, beside the
 * tier-downs, and the follower catches up from that snapshot. */
START_TEST(test_snapshot_read_beside_tier_downs_catches_a_follower_up)
{
    struct tk_options o;
    test_options(&o, 200);
    o.kv_ring_bytes = 1u << 20;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t f = (uint32_t)(index_of(c, l) + 1) % 3;
    ck_assert_int_eq(tk_cluster_isolate(c, f, true), 0);
    static char val[2048];
    memset(val, 'v', sizeof(val) - 1);
    char k[32];
    struct tk_write_result res;
    struct node_metrics m = {0};
    int i = 0;
    for (; i < 20000 && m.snapshot_descriptors < 2; i++) {
        snprintf(k, sizeof(k), "key%06d", i % 3000);
        nf_put(l, k, val, TK_MODE_APPLIED, &res);
        if (i % 100 == 0)
            node_metrics(tk_node_runtime(l), &m);
    }
    ck_assert_msg(m.snapshot_descriptors >= 2,
                  "descriptors: %llu after %d writes (snapshots %llu, reads %llu)",
                  (unsigned long long)m.snapshot_descriptors, i,
                  (unsigned long long)m.snapshots, (unsigned long long)m.snapshot_reads);
    ck_assert_uint_eq(m.snapshot_reads, 0); /* nobody needed the stream yet */
    /* The small state's streams left spare mappings; a descriptor's job drops
     * them (the one its snapshot replaced, at the next descriptor). */
    int more = 0;
    for (; more < 20000 && m.mem_snapshot_spare != 0; more++) {
        snprintf(k, sizeof(k), "key%06d", i++ % 3000);
        nf_put(l, k, val, TK_MODE_APPLIED, &res);
        if (more % 100 == 0)
            node_metrics(tk_node_runtime(l), &m);
    }
    ck_assert_msg(m.mem_snapshot_spare == 0,
                  "spare mappings: %llu bytes after %d more writes",
                  (unsigned long long)m.mem_snapshot_spare, more);
    ck_assert_int_eq(tk_cluster_isolate(c, f, false), 0);
    wait_applied(c, f, res.revision);
    struct tk_status fs;
    tk_node_status(tk_cluster_node(c, f), &fs);
    ck_assert_uint_gt(fs.snapshot_index, 0); /* it got there by a snapshot */
    node_metrics(tk_node_runtime(l), &m);
    ck_assert_uint_ge(m.snapshot_reads, 1); /* read out for it */
    snprintf(k, sizeof(k), "key%06d", (i - 1) % 3000);
    assert_value(tk_cluster_node(c, f), k, val, TK_READ_STALE);
    assert_value(tk_cluster_node(c, f), "key000000", val, TK_READ_STALE);
    tk_cluster_stop(c);
}
END_TEST

struct tally {
    atomic_int done;
    atomic_int ok;
    atomic_int failed;
};

static void count_cb(int status, const struct tk_write_result *res, void *data)
{
    struct tally *t = data;
    (void)res;
    if (status == 0)
        atomic_fetch_add(&t->ok, 1);
    else
        atomic_fetch_add(&t->failed, 1);
    atomic_fetch_add(&t->done, 1);
}

START_TEST(test_leader_dies_with_proposals_in_flight)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t li = (uint32_t)index_of(c, l);
    struct tally t = {0};
    int sent = 0;
    for (int i = 0; i < 500; i++)
        if (tk_put_async(l, "f", 1, "x", 1, TK_MODE_APPLIED, count_cb, &t) == 0)
            sent++;
    /* Cut the leader off and restart it: every request must complete. */
    ck_assert_int_eq(tk_cluster_isolate(c, li, true), 0);
    ck_assert_int_eq(tk_cluster_restart_node(c, li), 0);
    for (int w = 0; w < 3000 && atomic_load(&t.done) < sent; w++)
        usleep(5000);
    ck_assert_int_eq(atomic_load(&t.done), sent);
    ck_assert_int_eq(atomic_load(&t.ok) + atomic_load(&t.failed), sent);
    ck_assert_int_eq(tk_cluster_isolate(c, li, false), 0);
    tk_cluster_stop(c);
}
END_TEST

/* Proposals left on a deposed leader end with TK_ELOST as soon as it learns
 * of the new term's entries, not at their timeout, even when no write follows
 * (entries past the new leader's log can never commit). Both modes. */
START_TEST(test_deposed_leader_fails_its_proposals_promptly)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    uint32_t li = (uint32_t)index_of(c, l);
    ck_assert_int_eq(tk_cluster_isolate(c, li, true), 0);
    struct tally ta = {0}, tc = {0};
    int sent = 0;
    for (int i = 0; i < 40; i++) {
        enum tk_mode m = i % 2 ? TK_MODE_COMMITTED : TK_MODE_APPLIED;
        if (tk_put_async(l, "d", 1, "x", 1, m, count_cb, i % 2 ? &tc : &ta) == 0)
            sent++;
    }
    ck_assert_int_gt(sent, 0);
    /* A new leader among the other two (the old one steps down by check-quorum). */
    struct tk_node *nl = NULL;
    for (int w = 0; w < 2000 && nl == NULL; w++) {
        for (uint32_t i = 0; i < 3; i++) {
            struct tk_status st;
            tk_node_status(tk_cluster_node(c, i), &st);
            if (i != li && st.is_leader)
                nl = tk_cluster_node(c, i);
        }
        usleep(5000);
    }
    ck_assert_ptr_nonnull(nl);
    ck_assert_int_eq(tk_cluster_isolate(c, li, false), 0);
    /* Well inside the 10 s request timeout. */
    int done = 0;
    for (int w = 0; w < 600 && done < sent; w++) {
        usleep(5000);
        done = atomic_load(&ta.done) + atomic_load(&tc.done);
    }
    ck_assert_msg(done == sent, "%d of %d proposals ended within 3 s", done, sent);
    int ok = atomic_load(&ta.ok) + atomic_load(&tc.ok);
    ck_assert_int_eq(ok, 0);
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_linearizable_read_after_leader_change_sees_acked_writes)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    for (int i = 0; i < 20; i++)
        nf_put(l, "lin", i % 2 ? "odd" : "even", TK_MODE_APPLIED, NULL);
    nf_put(l, "lin", "last", TK_MODE_APPLIED, NULL);
    struct tk_status st;
    tk_node_status(l, &st);
    uint64_t to = st.id % 3 + 1;
    ck_assert_int_eq(tk_node_transfer_leadership(l, to), 0);
    struct tk_node *nl = NULL;
    for (int w = 0; w < 2000; w++) {
        struct tk_status s2;
        tk_node_status(tk_cluster_node(c, (uint32_t)to - 1), &s2);
        if (s2.is_leader) {
            nl = tk_cluster_node(c, (uint32_t)to - 1);
            break;
        }
        usleep(5000);
    }
    ck_assert_ptr_nonnull(nl);
    /* Every node, leader or follower (through a read index), sees it. */
    for (uint32_t i = 0; i < 3; i++) {
        int rc = TK_ENOLEADER;
        struct tk_value v;
        for (int w = 0; w < 200 && rc == TK_ENOLEADER; w++) {
            rc = tk_get(tk_cluster_node(c, i), "lin", 3, TK_READ_LINEARIZABLE, &v);
            if (rc == TK_ENOLEADER)
                usleep(5000);
        }
        ck_assert_msg(rc == 0, "node %u: %s", i, tk_strerror(rc));
        ck_assert_uint_eq(v.len, 4);
        ck_assert(memcmp(v.value, "last", 4) == 0);
        tk_value_free(&v);
    }
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_backpressure_returns_busy)
{
    struct tk_options o;
    nf_options(&o);
    o.queue_max = 4;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    struct tally t = {0};
    int busy = 0, sent = 0;
    for (int i = 0; i < 20000 && busy == 0; i++) {
        int rc = tk_put_async(l, "b", 1, "x", 1, TK_MODE_APPLIED, count_cb, &t);
        if (rc == TK_EBUSY)
            busy++;
        else if (rc == 0)
            sent++;
    }
    ck_assert_int_gt(busy, 0);
    for (int w = 0; w < 2000 && atomic_load(&t.done) < sent; w++)
        usleep(5000);
    ck_assert_int_eq(atomic_load(&t.done), sent);
    tk_cluster_stop(c);
}
END_TEST

START_TEST(test_stop_with_work_in_flight_completes_everything)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    struct tally t = {0};
    int sent = 0;
    for (int i = 0; i < 2000; i++)
        if (tk_put_async(l, "s", 1, "x", 1, TK_MODE_APPLIED, count_cb, &t) == 0)
            sent++;
    tk_cluster_stop(c); /* LeakSanitizer checks the rest at exit */
    ck_assert_int_eq(atomic_load(&t.done), sent);
}
END_TEST

START_TEST(test_batch_and_txn)
{
    struct tk_cluster *c = start(3, 0);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_op ops[2] = {{"b1", 2, "x", 1}, {"b2", 2, "y", 1}};
    struct tk_write_result res;
    ck_assert_int_eq(tk_batch(l, ops, 2, TK_MODE_APPLIED, &res), 0);
    ck_assert_int_eq(res.code, 0);
    assert_value(l, "b2", "y", TK_READ_LINEARIZABLE);
    struct tk_version_cmp cmp = {"b1", 2, 1};
    struct tk_op then_op = {"t", 1, "then", 4};
    struct tk_op else_op = {"t", 1, "else", 4};
    ck_assert_int_eq(tk_txn(l, &cmp, 1, &then_op, 1, &else_op, 1, TK_MODE_APPLIED, &res),
                     0);
    ck_assert(res.succeeded);
    assert_value(l, "t", "then", TK_READ_LINEARIZABLE);
    cmp.version = 7;
    ck_assert_int_eq(tk_txn(l, &cmp, 1, &then_op, 1, &else_op, 1, TK_MODE_APPLIED, &res),
                     0);
    ck_assert(!res.succeeded);
    assert_value(l, "t", "else", TK_READ_LINEARIZABLE);
    tk_cluster_stop(c);
}
END_TEST

static int count_items(const struct tk_item *it, void *data)
{
    (void)it;
    (*(int *)data)++;
    return 0;
}

/* A port the kernel just handed out (bound to 0, then released). */
static uint16_t free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(s, (struct sockaddr *)&a, &al), 0);
    close(s);
    return ntohs(a.sin_port);
}

/* The leader of three nodes started with tk_node_start (a bounded poll). */
static struct tk_node *tcp_leader(struct tk_node *const n[3])
{
    for (int w = 0; w < 2000; w++) {
        for (int i = 0; i < 3; i++) {
            struct tk_status st;
            tk_node_status(n[i], &st);
            if (st.is_leader)
                return n[i];
        }
        usleep(5000);
    }
    ck_abort_msg("no leader among three nodes in 10 s");
    return NULL;
}

/* As tierkvd: a raft address off loopback with neither a cluster token nor
 * insecure_peers is refused before anything listens or dials. */
START_TEST(test_tcp_node_off_loopback_needs_a_token)
{
    struct tk_options o;
    nf_options(&o);
    o.n_members = 2;
    for (int i = 0; i < 2; i++) {
        o.members[i].id = (uint64_t)i + 1;
        o.members[i].host = "127.0.0.1"; /* peers on loopback: nothing leaves */
        o.members[i].port = free_port();
    }
    o.id = 1;
    o.listen_host = "0.0.0.0"; /* but this node's raft port is reachable */
    struct tk_node *n = NULL;
    int rc = tk_node_start(&o, &n);
    if (n != NULL)
        tk_node_stop(n);
    ck_assert_int_eq(rc, TK_EINVAL);
}
END_TEST

START_TEST(test_tcp_cluster_replicates_and_scans)
{
    struct tk_options o;
    nf_options(&o);
    o.cluster_id = 9;
    o.n_members = 3;
    static const uint8_t token[] = "a cluster token of 32 bytes long";
    o.peer_token = token; /* the handshake authenticates the peers */
    o.peer_token_len = sizeof(token) - 1;
    for (int i = 0; i < 3; i++) {
        o.members[i].id = (uint64_t)i + 1;
        o.members[i].host = "127.0.0.1";
        o.members[i].port = free_port();
    }
    struct tk_node *n[3];
    for (int i = 0; i < 3; i++) {
        o.id = (uint64_t)i + 1;
        ck_assert_int_eq(tk_node_start(&o, &n[i]), 0);
    }
    struct tk_node *l = tcp_leader(n);
    char k[16];
    for (int i = 0; i < 30; i++) {
        snprintf(k, sizeof(k), "p/%02d", i);
        nf_put(l, k, "v", TK_MODE_APPLIED, NULL);
    }
    nf_put(l, "q", "other", TK_MODE_APPLIED, NULL);
    int cnt = 0;
    ck_assert_int_eq(tk_scan(l, "p/", 2, 0, TK_READ_LINEARIZABLE, count_items, &cnt), 0);
    ck_assert_int_eq(cnt, 30);
    for (int i = 0; i < 3; i++)
        tk_node_stop(n[i]);
}
END_TEST

/* Issue 18: a steady write load allocates nothing, on any of three nodes over
 * TCP with fs stores, for writes taken by the leader or forwarded to it by a
 * follower: the command and each follower's decoded entry are small blobs
 * that compaction gives back (base/blob.c), the store's requests and the
 * leader's forwarded-write records are kept for reuse, the decoding arenas
 * are reused. A snapshot (and the compaction behind it) allocates in its
 * jobs, and a log segment's offsets array doubles as the segment fills
 * (log2 times a segment, reused by the next one), so the measured writes
 * stay between two snapshots (4200 and 8400) and two doublings (4096 and
 * 8192 records), and take fewer blobs (three a write) than the first
 * compaction gave back (about 4200 a node). What may still allocate is
 * rare and not per write: a peer connection dialled again (a slow
 * ThreadSanitizer run saw 2), an array grown past its high-water mark by
 * a bigger batch than any before. So: fewer than one allocation per 50
 * writes (0 in the normal build's runs). Fails with any of those pools
 * removed (750 to 4500). */
START_TEST(test_steady_writes_allocate_nothing_per_write)
{
    struct tk_options o;
    test_options(&o, 4200);
    o.cluster_id = 11;
    o.n_members = 3;
    static const uint8_t token[] = "a cluster token of 32 bytes long";
    o.peer_token = token;
    o.peer_token_len = sizeof(token) - 1;
    char dirs[3][32];
    for (int i = 0; i < 3; i++) {
        o.members[i].id = (uint64_t)i + 1;
        o.members[i].host = "127.0.0.1";
        o.members[i].port = free_port();
        snprintf(dirs[i], sizeof(dirs[i]), "/tmp/tk-node-alloc-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dirs[i]));
    }
    struct tk_node *n[3];
    for (int i = 0; i < 3; i++) {
        o.id = (uint64_t)i + 1;
        o.data_dir = dirs[i];
        ck_assert_int_eq(tk_node_start(&o, &n[i]), 0);
    }
    struct tk_node *l = tcp_leader(n), *f = NULL;
    f = l == n[0] ? n[1] : n[0];
    /* Past the first snapshot (4200 entries), and its compaction done on
     * every node: the blobs it gave back are in the cache. */
    char k[32], v[65];
    memset(v, 'v', 64);
    v[64] = 0;
    struct tk_write_result res;
    int i = 0;
    for (; i < 4400; i++) {
        snprintf(k, sizeof(k), "bench/%05d", i % 1000);
        nf_put(i % 2 ? f : l, k, v, TK_MODE_APPLIED, &res);
    }
    bool blob_cache = tk_blob_cache_enabled();
    for (int w = 0; w < 2000 && tk_blob_cached_bytes() < 3 * 4000 * 64 && blob_cache; w++)
        usleep(5000);
    /* Two windows of 1500 writes at most; the fewer allocations count. A
     * write that allocates shows in both (4,500 or 750 in the known-bad
     * runs); a pool outgrown once by a starved thread on a loaded machine (the
     * store's append requests, the core's held entries: 46-71 in one window
     * with three busy loops beside the test) shows in one. */
    uint64_t calls[2] = {0, 0}, bytes[2] = {0, 0};
    int windows = 0;
    while (windows < 2) {
        struct tk_alloc_stats a0, a1;
        tk_alloc_stats(&a0);
        for (int end = i + 1500; i < end; i++) {
            snprintf(k, sizeof(k), "bench/%05d", i % 1000);
            nf_put(i % 2 ? f : l, k, v, TK_MODE_APPLIED, &res);
        }
        tk_alloc_stats(&a1);
        calls[windows] = a1.calls - a0.calls;
        bytes[windows] = a1.bytes - a0.bytes;
        windows++;
        if (calls[windows - 1] < 1500 / 50)
            break;
    }
    struct tk_status st;
    tk_node_status(l, &st);
    ck_assert_uint_ge(st.applied, (uint64_t)i);
    ck_assert_uint_lt(st.snapshot_index, 8000); /* no second snapshot came */
    uint64_t least = windows == 2 && calls[1] < calls[0] ? calls[1] : calls[0];
    for (int w = 0; w < windows; w++)
        fprintf(
            stderr,
            "steady writes, window %d: %llu allocations (%llu bytes) over 1500 writes, "
            "blob cache %zu bytes\n",
            w + 1, (unsigned long long)calls[w], (unsigned long long)bytes[w],
            tk_blob_cached_bytes());
    /* Under AddressSanitizer the blob cache is off (blob.c): each write then
     * allocates its blobs, and only that is left. */
    if (blob_cache)
        ck_assert_uint_lt(least, 1500 / 50);
    for (int j = 0; j < 3; j++)
        tk_node_stop(n[j]);
    for (int j = 0; j < 3; j++) {
        char cmd[160];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dirs[j]);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

/* The byte threshold takes a snapshot long before the entry threshold. */
START_TEST(test_snapshot_by_bytes)
{
    struct tk_options o;
    nf_options(&o);
    o.seed = 42;
    o.snapshot_entries = 1000000;
    o.snapshot_bytes = 8192;
    o.trailing_entries = 10;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    char k[16], v[200];
    memset(v, 'x', sizeof(v) - 1);
    v[sizeof(v) - 1] = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof(k), "b%d", i);
        nf_put(l, k, v, TK_MODE_APPLIED, NULL);
    }
    struct tk_status st;
    for (int t = 0; t < 400; t++) {
        tk_node_status(l, &st);
        if (st.snapshot_index > 0)
            break;
        usleep(5000);
    }
    ck_assert_uint_gt(st.snapshot_index, 0);
    ck_assert_uint_lt(st.snapshot_index, 1000000);
    assert_value(l, "b0", v, TK_READ_LINEARIZABLE);
    tk_cluster_stop(c);
}
END_TEST

/* ---- forwarding frames, against a fake leader ----
 *
 * Node 1 runs on the test's loop; node 2 is a bare inproc transport the test
 * drives: it claims leadership with a heartbeat, receives what node 1
 * forwards, and answers (or forges, or sends garbage) by hand. Node 3 is a
 * bystander transport, not a member. */

struct fake {
    struct transport *t;
    uint8_t frame[4096]; /* the last forward frame received */
    size_t len;
    int frames;
    bool closed;
    uint64_t acked; /* the highest index node 1 acknowledged to this fake */
};

struct fwd_env {
    uv_loop_t loop;
    struct transport_inproc_hub *hub;
    struct node *n;
    struct fake leader, other;
    struct node_req req;
    atomic_bool stopped; /* node_stop has returned */
    int status;
    uint64_t revision;
    int done;
};

static void fake_recv(struct transport *t, const struct raft_message *m, void *data)
{
    struct fake *f = data;
    (void)t;
    if (m->type == RAFT_MSG_APPEND_RESP && !m->u.append_resp.reject &&
        m->u.append_resp.index > f->acked)
        f->acked = m->u.append_resp.index;
}

static void fake_forward(struct transport *t, uint64_t from, const uint8_t *buf,
                         size_t len, void *data)
{
    struct fake *f = data;
    (void)t;
    (void)from;
    ck_assert_uint_le(len, sizeof(f->frame));
    memcpy(f->frame, buf, len);
    f->len = len;
    f->frames++;
}

static void fake_closed(struct transport *t, void *data)
{
    struct fake *f = data;
    (void)t;
    f->closed = true;
}

static void fake_open(struct fwd_env *e, struct fake *f, uint64_t id)
{
    struct transport_callbacks cbs = {
        .recv = fake_recv, .forward = fake_forward, .data = f};
    ck_assert_int_eq(transport_inproc_new(e->hub, &e->loop, id, 0, &cbs, &f->t), 0);
}

static void turn(struct fwd_env *e, int times)
{
    for (int i = 0; i < times; i++) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

static void fwd_write_done(struct node_req *req, int status, const struct kv_result *res,
                           void *data)
{
    struct fwd_env *e = data;
    (void)req;
    e->status = status;
    e->revision = res != NULL ? res->revision : 0;
    e->done++;
}

/* fwd_env_start's node keeps its data here (fs store) when set, with these
 * file operations. */
static const char *fwd_data_dir;
static const struct store_fileops *fwd_fileops;
static uint64_t fwd_term = 1;         /* the fake leader's term */
static uint64_t fwd_snapshot_entries; /* 0: the default */

/* Node 1 follows fake node 2 and has forwarded one write to it. */
static void fwd_env_start(struct fwd_env *e)
{
    memset(e, 0, sizeof(*e));
    ck_assert_int_eq(uv_loop_init(&e->loop), 0);
    e->hub = transport_inproc_hub_new(7);
    struct node_options o;
    node_options_default(&o);
    o.id = 1;
    o.members.n_voters = 2;
    o.members.voters[0] = 1;
    o.members.voters[1] = 2;
    o.hub = e->hub;
    o.loop = &e->loop;
    o.election_ticks = 3000; /* 30 s: node 1 never campaigns during a test */
    o.kv_no_sync = true;
    o.data_dir = fwd_data_dir;
    o.store_fileops = fwd_fileops;
    if (fwd_snapshot_entries != 0)
        o.snapshot_entries = fwd_snapshot_entries;
    ck_assert_int_eq(node_start(&o, &e->n), 0);
    fake_open(e, &e->leader, 2);
    fake_open(e, &e->other, 3);
    struct raft_message hb = {
        .type = RAFT_MSG_APPEND, .from = 2, .to = 1, .term = fwd_term};
    ck_assert_int_eq(transport_send(e->leader.t, &hb), 0);
    struct node_status st = {0};
    for (int i = 0; i < 2000 && st.leader != 2; i++) {
        turn(e, 1);
        node_status(e->n, &st);
    }
    ck_assert_uint_eq(st.leader, 2);
    e->req.mode = NODE_MODE_APPLIED;
    e->req.cmd = tk_blob_copy("a command", 9);
    e->req.write_cb = fwd_write_done;
    e->req.data = e;
    ck_assert_int_eq(node_submit(e->n, &e->req), 0);
    for (int i = 0; i < 2000 && e->leader.frames == 0; i++)
        turn(e, 1);
    ck_assert_int_eq(e->leader.frames, 1);
}

static void *stop_thread(void *arg)
{
    struct fwd_env *e = arg;
    node_stop(e->n);
    atomic_store(&e->stopped, true);
    return NULL;
}

static void fwd_env_stop(struct fwd_env *e)
{
    pthread_t th; /* node_stop waits for the loop, which this thread runs */
    ck_assert_int_eq(pthread_create(&th, NULL, stop_thread, e), 0);
    while (!atomic_load(&e->stopped))
        turn(e, 1);
    pthread_join(th, NULL);
    transport_close(e->leader.t, fake_closed, &e->leader);
    transport_close(e->other.t, fake_closed, &e->other);
    while (!e->leader.closed || !e->other.closed)
        uv_run(&e->loop, UV_RUN_ONCE);
    ck_assert_int_eq(uv_loop_close(&e->loop), 0);
    transport_inproc_hub_free(e->hub);
}

/* Sends a ForwardResponse for request `id` with `token` from fake `f`. */
static void send_answer(struct fake *f, uint64_t id, const uint8_t *token,
                        size_t token_len, int status, uint64_t revision)
{
    struct kv_result res = {.revision = revision};
    uint8_t enc[KV_RESULT_ENCODED_MAX], buf[KV_RESULT_ENCODED_MAX + 128];
    Tierkv__ForwardResponse p = TIERKV__FORWARD_RESPONSE__INIT;
    p.id = id;
    p.token.data = (uint8_t *)token;
    p.token.len = token_len;
    p.status = status;
    p.result.data = enc;
    p.result.len = kv_result_encode(&res, enc);
    Tierkv__Forward fw = TIERKV__FORWARD__INIT;
    fw.body_case = TIERKV__FORWARD__BODY_RESPONSE;
    fw.response = &p;
    size_t len = tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(f->t, 1, buf, len), 0);
}

/* Sends a ForwardRequest `id` with a 16-byte `token` and the command `cmd`
 * (a string) from fake `f`, as a node forwarding a write to node 1 would. */
static void send_request(struct fake *f, uint64_t id, const uint8_t *token,
                         const char *cmd)
{
    Tierkv__ForwardRequest q = TIERKV__FORWARD_REQUEST__INIT;
    q.id = id;
    q.token.data = (uint8_t *)token;
    q.token.len = 16;
    q.command.data = (uint8_t *)cmd;
    q.command.len = strlen(cmd);
    Tierkv__Forward fw = TIERKV__FORWARD__INIT;
    fw.body_case = TIERKV__FORWARD__BODY_REQUEST;
    fw.request = &q;
    uint8_t buf[128];
    size_t len = tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(f->t, 1, buf, len), 0);
}

/* The forwarded request node 1 sent: its id and token. */
static void sent_request(struct fake *f, uint64_t *id, uint8_t *token)
{
    Tierkv__Forward *fw = tierkv__forward__unpack(NULL, f->len, f->frame);
    ck_assert_ptr_nonnull(fw);
    ck_assert_int_eq(fw->body_case, TIERKV__FORWARD__BODY_REQUEST);
    ck_assert_uint_eq(fw->request->token.len, 16);
    ck_assert_uint_eq(fw->request->command.len, 9);
    ck_assert(memcmp(fw->request->command.data, "a command", 9) == 0);
    *id = fw->request->id;
    memcpy(token, fw->request->token.data, 16);
    tierkv__forward__free_unpacked(fw, NULL);
}

START_TEST(test_forged_forward_answers_are_ignored)
{
    struct fwd_env e;
    fwd_env_start(&e);
    uint64_t id;
    uint8_t token[16], forged[16];
    sent_request(&e.leader, &id, token);
    memcpy(forged, token, 16);
    forged[5] ^= 1;
    send_answer(&e.leader, id, forged, 16, 0, 99);    /* wrong token */
    send_answer(&e.other, id, token, 16, 0, 98);      /* the right one, wrong peer */
    send_answer(&e.leader, id + 1, token, 16, 0, 97); /* another id */
    send_answer(&e.leader, id, token, 15, 0, 96);     /* a short token */
    turn(&e, 50);
    ck_assert_int_eq(e.done, 0);
    send_answer(&e.leader, id, token, 16, 0, 7); /* the leader's answer */
    for (int i = 0; i < 2000 && e.done == 0; i++)
        turn(&e, 1);
    ck_assert_int_eq(e.done, 1);
    ck_assert_int_eq(e.status, 0);
    ck_assert_uint_eq(e.revision, 7);
    send_answer(&e.leader, id, token, 16, 0, 7); /* a duplicate: dropped */
    turn(&e, 20);
    ck_assert_int_eq(e.done, 1);
    fwd_env_stop(&e);
}
END_TEST

START_TEST(test_garbage_forward_frames_are_dropped)
{
    struct fwd_env e;
    fwd_env_start(&e);
    uint64_t id;
    uint8_t token[16];
    sent_request(&e.leader, &id, token);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    const uint8_t no_body[] = {0x18, 0x01};   /* field 3, a varint: no body */
    const uint8_t cut[] = {0x12, 0x20, 0x08}; /* a response cut short */
    const uint8_t old_format[] = {2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(transport_send_forward(e.leader.t, 1, junk, sizeof(junk)), 0);
    ck_assert_int_eq(transport_send_forward(e.leader.t, 1, no_body, sizeof(no_body)), 0);
    ck_assert_int_eq(transport_send_forward(e.leader.t, 1, cut, sizeof(cut)), 0);
    ck_assert_int_eq(
        transport_send_forward(e.leader.t, 1, old_format, sizeof(old_format)), 0);
    ck_assert_int_eq(transport_send_forward(e.other.t, 1, junk, 1), 0);
    turn(&e, 50);
    ck_assert_int_eq(e.done, 0);
    /* A request to node 1, which is no leader: answered TK_ENOTLEADER, with
     * the id and token echoed. */
    const uint8_t qtoken[16] = {1, 2, 3};
    send_request(&e.leader, 42, qtoken, "cmd");
    for (int i = 0; i < 2000 && e.leader.frames < 2; i++)
        turn(&e, 1);
    Tierkv__Forward *a = tierkv__forward__unpack(NULL, e.leader.len, e.leader.frame);
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(a->body_case, TIERKV__FORWARD__BODY_RESPONSE);
    ck_assert_uint_eq(a->response->id, 42);
    ck_assert_int_eq(a->response->status, TK_ENOTLEADER);
    ck_assert_uint_eq(a->response->token.len, 16);
    ck_assert(memcmp(a->response->token.data, qtoken, 16) == 0);
    tierkv__forward__free_unpacked(a, NULL);
    /* The node still serves: the real answer completes the write. */
    send_answer(&e.leader, id, token, 16, TK_ECOMPARE - 1000, 0); /* unknown code */
    for (int i = 0; i < 2000 && e.done == 0; i++)
        turn(&e, 1);
    ck_assert_int_eq(e.done, 1);
    ck_assert_int_eq(e.status, TK_EPROTO);
    fwd_env_stop(&e);
}
END_TEST

/* A forwarded request from node 3, which is not a member, is dropped: never
 * proposed, never answered (issue 15: it used to write `pwned`). */
START_TEST(test_forward_request_from_a_non_member_is_dropped)
{
    struct fwd_env e;
    fwd_env_start(&e);
    uint64_t id;
    uint8_t token[16];
    sent_request(&e.leader, &id, token);
    const uint8_t qtoken[16] = {4, 5, 6};
    send_request(&e.other, 43, qtoken, "pwned");
    struct node_metrics m = {0};
    for (int i = 0; i < 2000 && m.forward_dropped == 0; i++) {
        turn(&e, 1);
        node_metrics(e.n, &m);
    }
    ck_assert_uint_eq(m.forward_dropped, 1);
    turn(&e, 20);
    ck_assert_int_eq(e.other.frames, 0); /* not even refused */
    send_answer(&e.leader, id, token, 16, 0, 7);
    for (int i = 0; i < 2000 && e.done == 0; i++)
        turn(&e, 1);
    ck_assert_int_eq(e.done, 1);
    fwd_env_stop(&e);
}
END_TEST

/* Log entries that arrive with a snapshot, or during its install, are kept
 * beside the install and appended once the store is reset to it: the loop
 * does not wait for the install, and they are acknowledged once durable. */
/* A real snapshot stream of an empty state at `index` (entries of `term`). */
static struct tk_blob *empty_stream_term(uint64_t index, uint64_t term)
{
    char dir[] = "/tmp/tk-node-snap-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct kv_config kc;
    kv_config_default(&kc);
    kc.dir = dir;
    kc.no_sync = true;
    struct kv_sm *sm;
    ck_assert_int_eq(kv_sm_open(&kc, &sm), 0);
    for (uint64_t i = 1; i <= index; i++)
        ck_assert_int_eq(kv_sm_skip(sm, i, term, 0), 0);
    struct kv_snap *snap;
    ck_assert_int_eq(kv_sm_snapshot(sm, &snap), 0);
    ck_assert_uint_eq(kv_snap_index(snap), index);
    uint8_t *buf = NULL;
    size_t len = 0, got;
    do {
        buf = realloc(buf, len + 65536);
        ck_assert_int_eq(kv_snap_read(snap, buf + len, 65536, &got), 0);
        len += got;
    } while (got != 0);
    kv_snap_close(snap);
    kv_sm_close(sm);
    struct tk_blob *b = tk_blob_copy(buf, len);
    free(buf);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    return b;
}

static struct tk_blob *empty_stream(uint64_t index)
{
    return empty_stream_term(index, 1);
}

/* The leader (node 2, term 1) sends node 1 the whole snapshot of an empty
 * state at `index`, voters {1, 2}, in one message. */
static void send_snapshot(struct fwd_env *e, uint64_t index)
{
    struct raft_message snap = {.type = RAFT_MSG_SNAPSHOT, .from = 2, .to = 1, .term = 1};
    snap.u.snapshot.meta.index = index;
    snap.u.snapshot.meta.term = 1;
    snap.u.snapshot.meta.config.n_voters = 2;
    snap.u.snapshot.meta.config.voters[0] = 1;
    snap.u.snapshot.meta.config.voters[1] = 2;
    snap.u.snapshot.done = true;
    snap.u.snapshot.data = empty_stream(index);
    ck_assert_int_eq(transport_send(e->leader.t, &snap), 0);
    tk_blob_unref(snap.u.snapshot.data);
}

START_TEST(test_entries_during_an_install_wait_beside_it)
{
    struct fwd_env e;
    fwd_env_start(&e);
    send_snapshot(&e, 100);
    struct raft_entry ents[5];
    memset(ents, 0, sizeof(ents));
    for (int i = 0; i < 5; i++) {
        ents[i].term = 1;
        ents[i].index = 101 + (uint64_t)i;
        ents[i].type = RAFT_ENTRY_NOOP;
    }
    struct raft_message app = {.type = RAFT_MSG_APPEND, .from = 2, .to = 1, .term = 1};
    app.u.append.prev_index = 100;
    app.u.append.prev_term = 1;
    app.u.append.commit = 105;
    app.u.append.entries = ents;
    app.u.append.n_entries = 5;
    ck_assert_int_eq(transport_send(e.leader.t, &app), 0);
    struct node_status st = {0};
    for (int i = 0; i < 5000 && (e.leader.acked < 105 || st.applied < 105); i++) {
        turn(&e, 1);
        node_status(e.n, &st);
    }
    ck_assert_uint_eq(e.leader.acked, 105);
    ck_assert_uint_ge(st.applied, 105);
    struct node_metrics m = {0};
    node_metrics(e.n, &m);
    ck_assert_uint_eq(m.installs, 1);
    ck_assert_uint_ge(m.installs_deferred, 1);
    fwd_env_stop(&e);
}
END_TEST

static void send_entries(struct fwd_env *e, uint64_t term, uint64_t prev_index,
                         uint64_t prev_term, uint64_t n, uint64_t commit);

/* The leader (node 2) sends node 1 a snapshot at `index` whose stream is
 * `data` (taken). */
static void send_snapshot_data(struct fwd_env *e, uint64_t index, struct tk_blob *data)
{
    struct raft_message snap = {.type = RAFT_MSG_SNAPSHOT, .from = 2, .to = 1, .term = 1};
    snap.u.snapshot.meta.index = index;
    snap.u.snapshot.meta.term = 1;
    snap.u.snapshot.meta.config.n_voters = 2;
    snap.u.snapshot.meta.config.voters[0] = 1;
    snap.u.snapshot.meta.config.voters[1] = 2;
    snap.u.snapshot.done = true;
    snap.u.snapshot.data = data;
    ck_assert_int_eq(transport_send(e->leader.t, &snap), 0);
    tk_blob_unref(data);
}

/* Waits until node 1 has refused `want` snapshots; it stays a healthy
 * follower of node 2 at its applied index, and acknowledged nothing. */
static void wait_refused(struct fwd_env *e, uint64_t want, uint64_t applied)
{
    for (int i = 0; i < 5000 && e->n->m.metrics.snapshots_refused < want; i++)
        turn(e, 1);
    ck_assert_uint_eq(e->n->m.metrics.snapshots_refused, want);
    turn(e, 20);
    struct node_status st = {0};
    node_status(e->n, &st);
    ck_assert(!st.failed);
    ck_assert_int_eq(st.role, RAFT_FOLLOWER);
    ck_assert_uint_eq(st.leader, 2);
    ck_assert_uint_eq(st.applied, applied);
    ck_assert_uint_lt(e->leader.acked, 100);
    struct node_metrics m = {0};
    node_metrics(e->n, &m);
    ck_assert_uint_eq(m.installs, 0);
}

/* Bad snapshots from the leader's id are bad input (issue 49): garbage, a
 * flipped byte, a truncation, a stream whose header names another index
 * than the message, and no stream at all are each refused before the core
 * sees them, counted, and the node does not fail (before, the first one
 * failed its storage: storage_failed, serving nothing). The good snapshot
 * then installs, and entries after it are acked and applied. */
START_TEST(test_bad_snapshots_are_refused_and_a_good_one_installs)
{
    struct fwd_env e;
    fwd_env_start(&e);
    send_entries(&e, 1, 0, 0, 10, 10);
    struct node_status st = {0};
    for (int i = 0; i < 5000 && st.applied < 10; i++) {
        turn(&e, 1);
        node_status(e.n, &st);
    }
    ck_assert_uint_ge(st.applied, 10);
    uint64_t applied = st.applied;
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 131 + 7);
    send_snapshot_data(&e, 100, tk_blob_copy(junk, sizeof(junk)));
    wait_refused(&e, 1, applied);
    struct tk_blob *good = empty_stream(100);
    struct tk_blob *bad = tk_blob_copy(good->data, good->len);
    bad->data[good->len / 2] ^= 0x01;
    send_snapshot_data(&e, 100, bad);
    wait_refused(&e, 2, applied);
    send_snapshot_data(&e, 100, tk_blob_copy(good->data, good->len - 1));
    wait_refused(&e, 3, applied);
    send_snapshot_data(&e, 100, empty_stream(99)); /* whole, but not at 100 */
    wait_refused(&e, 4, applied);
    send_snapshot_data(&e, 100, NULL);
    wait_refused(&e, 5, applied);
    /* The leader sends the good one again: it installs. */
    send_snapshot_data(&e, 100, good);
    struct node_metrics m = {0};
    for (int i = 0; i < 5000 && (e.leader.acked < 100 || m.installs == 0); i++) {
        turn(&e, 1);
        node_metrics(e.n, &m);
    }
    ck_assert_uint_eq(m.installs, 1);
    ck_assert_uint_ge(e.leader.acked, 100);
    ck_assert_uint_eq(e.n->m.metrics.snapshots_refused, 5);
    send_entries(&e, 1, 100, 1, 5, 105);
    for (int i = 0; i < 5000 && st.applied < 105; i++) {
        turn(&e, 1);
        node_status(e.n, &st);
    }
    ck_assert(!st.failed);
    ck_assert_uint_ge(st.applied, 105);
    fwd_env_stop(&e);
}
END_TEST

/* libuv's thread pool held: every pool thread waits in a blocker until
 * released, so a job queued meanwhile stays in flight. */
#define BLOCKERS 1024 /* libuv's largest pool */
static uv_work_t blockers[BLOCKERS];
static atomic_bool blockers_hold;
static atomic_int blockers_done;

static void blocker_run(uv_work_t *w)
{
    (void)w;
    while (atomic_load(&blockers_hold))
        usleep(200);
}

static void blocker_after(uv_work_t *w, int status)
{
    (void)w;
    (void)status;
    atomic_fetch_add(&blockers_done, 1);
}

static void send_entries(struct fwd_env *e, uint64_t term, uint64_t prev_index,
                         uint64_t prev_term, uint64_t n, uint64_t commit);

/* A snapshot from the leader while a tier job is in flight (here: queued,
 * the pool held) is parked, not waited for on the loop (which ran the job
 * there, or waited seconds for a running one: 3.4 s at 10M keys); the install
 * begins once the job has ended, and completes. */
START_TEST(test_snapshot_during_tier_work_is_parked)
{
    fwd_snapshot_entries = 20;
    struct fwd_env e;
    fwd_env_start(&e);
    fwd_snapshot_entries = 0;
    atomic_store(&blockers_hold, true);
    atomic_store(&blockers_done, 0);
    for (int i = 0; i < BLOCKERS; i++)
        ck_assert_int_eq(uv_queue_work(&e.loop, &blockers[i], blocker_run, blocker_after),
                         0);
    /* 30 entries applied: a snapshot is due, its tier job queued behind the
     * blockers. */
    send_entries(&e, 1, 0, 0, 30, 30);
    struct node_status st = {0};
    for (int i = 0; i < 5000 && st.applied < 30; i++) {
        turn(&e, 1);
        node_status(e.n, &st);
    }
    ck_assert_uint_ge(st.applied, 30);
    turn(&e, 20);
    struct node_metrics m0 = {0};
    node_metrics(e.n, &m0);
    send_snapshot(&e, 100);
    struct node_metrics m = {0};
    for (int i = 0; i < 2000 && m.installs_parked == 0; i++) {
        turn(&e, 1);
        node_metrics(e.n, &m);
    }
    ck_assert_uint_eq(m.installs_parked, 1);
    turn(&e, 50); /* the loop turns on; the job is not run on it */
    node_metrics(e.n, &m);
    ck_assert_uint_eq(m.kv_tier_downs, m0.kv_tier_downs);
    ck_assert_uint_eq(m.installs, 0);
    ck_assert_uint_lt(e.leader.acked, 100);
    atomic_store(&blockers_hold, false);
    for (int i = 0; i < 20000 && (e.leader.acked < 100 || m.installs == 0 ||
                                  atomic_load(&blockers_done) < BLOCKERS);
         i++) {
        turn(&e, 1);
        node_metrics(e.n, &m);
    }
    ck_assert_uint_eq(atomic_load(&blockers_done), BLOCKERS);
    ck_assert_uint_eq(m.installs, 1);
    ck_assert_uint_ge(e.leader.acked, 100);
    node_status(e.n, &st);
    ck_assert_uint_ge(st.applied, 100);
    fwd_env_stop(&e);
}
END_TEST

/* The log store's unlink fails while armed. */
static atomic_bool unlink_fails;

static int unlink_faulty(const char *path)
{
    if (atomic_load(&unlink_fails)) {
        errno = EIO;
        return -1;
    }
    return unlink(path);
}

/* An install whose log store reset fails after the state machine published
 * the snapshot (as a crash between the two would leave it): the node fails,
 * and at its next start recovery finishes the install from the descriptor
 * saved as pending, instead of refusing a state machine ahead of its log (or
 * keeping a diverging log under it): the leader's next entries are acked. */
static char install_dir[64];

static void install_teardown(void)
{
    atomic_store(&unlink_fails, false);
    fwd_data_dir = NULL;
    fwd_fileops = NULL;
    fwd_term = 1;
    if (install_dir[0] != '\0') {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", install_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", install_dir);
        install_dir[0] = '\0';
    }
}

static void send_entries(struct fwd_env *e, uint64_t term, uint64_t prev_index,
                         uint64_t prev_term, uint64_t n, uint64_t commit)
{
    struct raft_entry ents[64];
    ck_assert_uint_le(n, 64);
    memset(ents, 0, sizeof(ents));
    for (uint64_t i = 0; i < n; i++) {
        ents[i].term = term;
        ents[i].index = prev_index + 1 + i;
        ents[i].type = RAFT_ENTRY_NOOP;
    }
    struct raft_message app = {.type = RAFT_MSG_APPEND, .from = 2, .to = 1, .term = term};
    app.u.append.prev_index = prev_index;
    app.u.append.prev_term = prev_term;
    app.u.append.entries = ents;
    app.u.append.n_entries = n;
    app.u.append.commit = commit;
    ck_assert_int_eq(transport_send(e->leader.t, &app), 0);
    for (int i = 0; i < 5000 && e->leader.acked < prev_index + n; i++)
        turn(e, 1);
    ck_assert_uint_eq(e->leader.acked, prev_index + n);
}

/* The follower's log holds 1..`logged` (term 1; the commit stays below 100
 * when it reaches past it) when the snapshot at 100 of `snap_term` comes. */
static void interrupted_install(uint64_t logged, uint64_t snap_term)
{
    snprintf(install_dir, sizeof(install_dir), "/tmp/tk-node-install-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(install_dir));
    static struct store_fileops ops;
    ops = *store_fileops_default();
    ops.unlink = unlink_faulty;
    fwd_data_dir = install_dir;
    fwd_fileops = &ops;
    struct fwd_env e;
    fwd_env_start(&e);
    for (uint64_t done = 0; done < logged; done += 50) { /* a segment to remove */
        uint64_t k = logged - done < 50 ? logged - done : 50;
        send_entries(&e, 1, done, done ? 1 : 0, k, done + k < 99 ? done + k : 99);
    }
    atomic_store(&unlink_fails, true);
    struct raft_message snap = {
        .type = RAFT_MSG_SNAPSHOT, .from = 2, .to = 1, .term = snap_term};
    snap.u.snapshot.meta.index = 100;
    snap.u.snapshot.meta.term = snap_term;
    snap.u.snapshot.meta.config.n_voters = 2;
    snap.u.snapshot.meta.config.voters[0] = 1;
    snap.u.snapshot.meta.config.voters[1] = 2;
    snap.u.snapshot.done = true;
    snap.u.snapshot.data = empty_stream_term(100, snap_term);
    ck_assert_int_eq(transport_send(e.leader.t, &snap), 0);
    tk_blob_unref(snap.u.snapshot.data);
    struct node_status st = {0};
    for (int i = 0; i < 10000 && !st.failed; i++) {
        turn(&e, 1);
        node_status(e.n, &st);
    }
    ck_assert(st.failed || !"the install's reset failed, so the node must");
    fwd_env_stop(&e);
    atomic_store(&unlink_fails, false);
    fwd_fileops = NULL;

    /* Restart on the same directory: the install is finished. */
    fwd_term = snap_term;
    fwd_env_start(&e);
    node_status(e.n, &st);
    ck_assert(!st.failed);
    ck_assert_uint_ge(st.applied, 100);
    ck_assert_uint_eq(st.snapshot_index, 100);
    e.leader.acked = 0;
    send_entries(&e, snap_term, 100, snap_term, 5, 105); /* the log goes on from it */
    fwd_env_stop(&e);
}

START_TEST(test_install_interrupted_after_publishing_is_finished_at_restart)
{
    interrupted_install(5, 1);
}
END_TEST

START_TEST(test_install_over_a_diverging_log_interrupted_is_finished_at_restart)
{
    interrupted_install(150, 2);
}
END_TEST

/* The stall probe (node_options.stall_probe_ms): a loop turn that sleeps
 * 400 ms in one system call is reported while it runs, naming the call and
 * the sleeping state, at most 4 times; the short turns around it are not. */
static uv_timer_t stall_timer;
static atomic_int stall_lines;
static char stall_first[TK_LOG_LINE_MAX];

static void stall_sink(const char *line, size_t len, void *data)
{
    (void)data;
    if (memmem(line, len, "the loop's stack", 16) != NULL)
        return; /* the stack that comes with a first report */
    if (memmem(line, len, "stall probe", 11) == NULL) {
        fwrite(line, 1, len, stderr);
        return;
    }
    if (atomic_fetch_add(&stall_lines, 1) == 0)
        snprintf(stall_first, sizeof(stall_first), "%.*s", (int)len, line);
}

static void stall_fire(uv_timer_t *t)
{
    (void)t;
    struct timespec ts = {0, 400 * 1000000L};
    nanosleep(&ts, NULL);
}

static void stall_loop_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)data;
    uv_timer_init(loop, &stall_timer);
    uv_timer_start(&stall_timer, stall_fire, 100, 0);
}

static void stall_loop_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)loop;
    (void)data;
    uv_close((uv_handle_t *)&stall_timer, NULL);
}

/* A timer on a node's loop from its start to its stop that calls `fire`
 * (the node as the timer's data) every 5 ms: how the member tests drive
 * loop-thread calls. Its hooks take it as hook_data. */
struct ticker {
    uv_timer_t timer;
    uv_timer_cb fire;
};

static void ticker_loop_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct ticker *t = data;
    uv_timer_init(loop, &t->timer);
    t->timer.data = n;
    uv_timer_start(&t->timer, t->fire, 5, 5);
}

static void ticker_loop_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)loop;
    struct ticker *t = data;
    uv_close((uv_handle_t *)&t->timer, NULL);
}

/* Member records (node_member.c): the text of older builds is still read
 * (an id it says was removed is refused, its addresses are used), a record
 * that is neither format refuses an add with TK_ECORRUPT and fences its id,
 * and an add and a remove write 0x01 and a kvpb.MemberRecord. One node on the inproc
 * hub, driven from a timer on its loop (node_member_change and node_members
 * are loop-thread calls); failures are kept for the test thread to report. */
static int mrec_step, mrec_puts;
static atomic_int mrec_done;
static char mrec_failed[256];

#define MREC_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond) && mrec_failed[0] == '\0')                                           \
            snprintf(mrec_failed, sizeof(mrec_failed), "step %d: %s", mrec_step, #cond); \
    } while (0)

static void mrec_put_done(struct node_req *req, int status, const struct kv_result *res,
                          void *data)
{
    (void)data;
    MREC_CHECK(status == 0 && res->code == 0);
    free(req);
    mrec_puts++;
}

/* Puts a raw member record for id (its value as given) through the log. */
static void mrec_put(struct node *n, uint64_t id, const void *v, size_t len)
{
    char key[64];
    int kl = snprintf(key, sizeof(key), "%s%llu", NODE_MEMBER_KEY_PREFIX,
                      (unsigned long long)id);
    struct node_req *req = calloc(1, sizeof(*req));
    req->cmd = nf_put_cmd(key, (size_t)kl, v, len);
    req->write_cb = mrec_put_done;
    MREC_CHECK(node_submit(n, req) == 0);
}

/* The raw value of id's record, as applied here (len 0: none). */
static size_t mrec_get(struct node *n, uint64_t id, uint8_t *out, size_t cap)
{
    char key[64];
    int kl = snprintf(key, sizeof(key), "%s%llu", NODE_MEMBER_KEY_PREFIX,
                      (unsigned long long)id);
    struct kv_item it;
    if (kv_sm_get(node_kv(n), key, (size_t)kl, &it) != 0 || it.value_len > cap)
        return 0;
    memcpy(out, it.value, it.value_len);
    return it.value_len;
}

/* Is id's record as written today (0x01, then a kvpb.MemberRecord) with these
 * fields? */
static bool mrec_record(struct node *n, uint64_t id, const char *raft, const char *http,
                        bool removed)
{
    uint8_t v[1024];
    size_t len = mrec_get(n, id, v, sizeof(v));
    if (len < 1 || v[0] != KVPB__RECORD_FORMAT__RECORD_FORMAT_V1)
        return false;
    Kvpb__MemberRecord *m = kvpb__member_record__unpack(NULL, len - 1, v + 1);
    bool ok = m != NULL && strcmp(m->raft, raft) == 0 && strcmp(m->http, http) == 0 &&
              m->removed == removed && m->incarnation.len == 0;
    if (m != NULL)
        kvpb__member_record__free_unpacked(m, NULL);
    return ok;
}

static void mrec_changed(const struct node_member_result *res, void *data)
{
    (void)data;
    MREC_CHECK(res->status == 0);
    mrec_step++;
}

static int mrec_change(struct node *n, int op, uint64_t id,
                       struct node_member_result *res)
{
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = op;
    c.id = id;
    c.learner = true;
    snprintf(c.raft, sizeof(c.raft), "127.0.0.1:5");
    snprintf(c.http, sizeof(c.http), "127.0.0.1:6");
    return node_member_change(n, &c, mrec_changed, NULL, res);
}

static void mrec_fire(uv_timer_t *tm)
{
    struct node *n = tm->data;
    struct node_member_result res;
    char http[NODE_ADDR_MAX];
    struct node_status st;
    node_status(n, &st);
    if (mrec_step == 0 && st.role == RAFT_LEADER) {
        static const char removed[] = "raft=127.0.0.1:1 http=- removed=1 inc=-";
        static const char kept[] = "raft=127.0.0.1:3 http=127.0.0.1:4 removed=0 inc="
                                   "00112233445566778899aabbccddeeff";
        static const uint8_t bad[] = {0x01, 0x0a, 0x09, '1'}; /* raft overruns */
        mrec_put(n, 7, removed, sizeof(removed) - 1);
        mrec_put(n, 9, kept, sizeof(kept) - 1);
        mrec_put(n, 8, bad, sizeof(bad));
        mrec_put(n, 11, "removed=1 raft=x", 16); /* not as any build wrote it */
        mrec_step = 1;
    } else if (mrec_step == 1 && mrec_puts == 4) {
        MREC_CHECK(mrec_change(n, NODE_MEMBER_ADD, 7, &res) == TK_ECOMPARE);
        MREC_CHECK(mrec_change(n, NODE_MEMBER_ADD, 8, &res) == TK_ECORRUPT);
        MREC_CHECK(strstr(res.msg, "corrupt") != NULL);
        MREC_CHECK(mrec_change(n, NODE_MEMBER_ADD, 11, &res) == TK_ECORRUPT);
        MREC_CHECK(node__member_fenced(n, 7));
        MREC_CHECK(node__member_fenced(n, 8));
        MREC_CHECK(!node__member_fenced(n, 9));
        MREC_CHECK(!node__member_fenced(n, 12));
        MREC_CHECK(node_member_http(n, 9, http, sizeof(http)));
        MREC_CHECK(strcmp(http, "127.0.0.1:4") == 0);
        MREC_CHECK(mrec_change(n, NODE_MEMBER_ADD, 10, &res) == 0);
        mrec_step = 2; /* mrec_changed: 3 */
    } else if (mrec_step == 3) {
        struct node_member m[4];
        uint64_t ci;
        bool committed;
        size_t k = node_members(n, m, 4, &ci, &committed);
        MREC_CHECK(k == 2 && m[1].id == 10 && !m[1].voter);
        MREC_CHECK(strcmp(m[1].raft, "127.0.0.1:5") == 0);
        MREC_CHECK(strcmp(m[1].http, "127.0.0.1:6") == 0);
        MREC_CHECK(mrec_record(n, 10, "127.0.0.1:5", "127.0.0.1:6", false));
        MREC_CHECK(mrec_change(n, NODE_MEMBER_REMOVE, 10, &res) == 0);
        mrec_step = 4; /* mrec_changed: 5 */
    } else if (mrec_step == 5 && st.commit >= st.last_index) {
        MREC_CHECK(node__member_fenced(n, 10));
        MREC_CHECK(mrec_record(n, 10, "127.0.0.1:5", "127.0.0.1:6", true));
        MREC_CHECK(mrec_change(n, NODE_MEMBER_ADD, 10, &res) == TK_ECOMPARE);
        mrec_step = 6;
        atomic_store(&mrec_done, 1);
    }
}

START_TEST(test_member_records_old_new_and_corrupt)
{
    mrec_step = mrec_puts = 0;
    mrec_failed[0] = '\0';
    atomic_store(&mrec_done, 0);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node_options o;
    nf_node_options(&o, hub);
    struct ticker tick = {.fire = mrec_fire};
    o.on_loop_start = ticker_loop_start;
    o.on_loop_stop = ticker_loop_stop;
    o.hook_data = &tick;
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    for (int i = 0; i < 2000 && !atomic_load(&mrec_done) && mrec_failed[0] == '\0'; i++)
        usleep(10000);
    node_stop(n);
    transport_inproc_hub_free(hub);
    printf("member records: %d steps, %s\n", mrec_step,
           mrec_failed[0] ? mrec_failed : "all held");
    ck_assert_msg(mrec_failed[0] == '\0', "%s", mrec_failed);
    ck_assert_msg(atomic_load(&mrec_done), "stopped at step %d", mrec_step);
}
END_TEST

/* Members come and go, 200 in turn (more than NODE_PEERS_MAX, 64): a single
 * TCP node adds each as a learner at an address that refuses (so it is
 * dialed), then removes it. Every one is dialed, and every one is let go
 * once its removal commits, so the 65th and later are dialed too. */
#define CHURN_MEMBERS 200
static atomic_int churn_dialed, churn_forgotten, churn_done, churn_failed;
static int churn_step; /* loop thread: 2k adds member k, 2k+1 removes it */
static bool churn_busy;

static void churn_sink(const char *line, size_t len, void *data)
{
    (void)data;
    if (memmem(line, len, "dialing member", 14) != NULL)
        atomic_fetch_add(&churn_dialed, 1);
    else if (memmem(line, len, "removed: no longer dialed", 25) != NULL &&
             memmem(line, len, "msg=\"member", 11) != NULL)
        atomic_fetch_add(&churn_forgotten, 1);
}

static void churn_changed(const struct node_member_result *res, void *data)
{
    (void)data;
    churn_busy = false;
    if (res->status != 0)
        atomic_fetch_add(&churn_failed, 1);
    else
        churn_step++;
}

static void churn_fire(uv_timer_t *tm)
{
    struct node *n = tm->data;
    if (churn_busy || churn_step == 2 * CHURN_MEMBERS) {
        if (churn_step == 2 * CHURN_MEMBERS)
            atomic_store(&churn_done, 1);
        return;
    }
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.id = 100 + (uint64_t)(churn_step / 2);
    c.op = churn_step % 2 == 0 ? NODE_MEMBER_ADD : NODE_MEMBER_REMOVE;
    c.learner = true;
    snprintf(c.raft, sizeof(c.raft), "127.0.0.1:1");
    struct node_member_result res;
    if (node_member_change(n, &c, churn_changed, NULL, &res) == 0)
        churn_busy = true; /* else not leader yet, or busy: the next tick */
}

START_TEST(test_removed_members_are_let_go_past_the_peer_limit)
{
    churn_step = 0;
    churn_busy = false;
    atomic_store(&churn_dialed, 0);
    atomic_store(&churn_forgotten, 0);
    atomic_store(&churn_done, 0);
    atomic_store(&churn_failed, 0);
    tk_log_set_level(TK_LOG_INFO);
    tk_log_set_sink(churn_sink, NULL);
    struct node_options o;
    nf_node_options(&o, NULL);
    o.listen_host = "127.0.0.1";
    o.listen_port = free_port();
    struct ticker tick = {.fire = churn_fire};
    o.on_loop_start = ticker_loop_start;
    o.on_loop_stop = ticker_loop_stop;
    o.hook_data = &tick;
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    for (int i = 0; i < 5000 && !atomic_load(&churn_done) && !atomic_load(&churn_failed);
         i++)
        usleep(10000);
    usleep(300000); /* the last removal's reconcile */
    node_stop(n);
    tk_log_set_sink(NULL, NULL);
    tk_log_set_level(TK_LOG_WARN);
    int dialed = atomic_load(&churn_dialed), forgotten = atomic_load(&churn_forgotten);
    printf("member churn: %d changes, %d members dialed, %d let go, %d failed\n",
           churn_step, dialed, forgotten, atomic_load(&churn_failed));
    ck_assert_int_eq(atomic_load(&churn_failed), 0);
    ck_assert_int_eq(churn_step, 2 * CHURN_MEMBERS);
    ck_assert_int_eq(dialed, CHURN_MEMBERS);
    ck_assert_int_eq(forgotten, CHURN_MEMBERS);
}
END_TEST

/* A single node with the stall probe at 40 ms, whose loop runs `on_start`
 * (a timer that holds a turn) as it starts. */
static struct node *stall_node_start(struct transport_inproc_hub *hub,
                                     void (*on_start)(struct node *, struct uv_loop_s *,
                                                      void *))
{
    struct node_options o;
    nf_node_options(&o, hub);
    o.stall_probe_ms = 40;
    o.on_loop_start = on_start;
    o.on_loop_stop = stall_loop_stop;
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    return n;
}

START_TEST(test_stall_probe_names_what_a_long_turn_waits_on)
{
    atomic_store(&stall_lines, 0);
    tk_log_set_sink(stall_sink, NULL);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node *n = stall_node_start(hub, stall_loop_start);
    /* The timer fires 100 ms in; its turn sleeps 400 ms. */
    for (int i = 0; i < 500 && atomic_load(&stall_lines) == 0; i++)
        usleep(10000);
    usleep(600000); /* past the sleep, and idle turns after it */
    node_stop(n);
    transport_inproc_hub_free(hub);
    tk_log_set_sink(NULL, NULL);
    int lines = atomic_load(&stall_lines);
    printf("stall probe: %d reports; the first: %s", lines, stall_first);
    ck_assert_int_ge(lines, 1);
    ck_assert_int_le(lines, 4);
    char want[32];
    snprintf(want, sizeof(want), "syscall: %d ", (int)SYS_clock_nanosleep);
    char want_old[32];
    snprintf(want_old, sizeof(want_old), "syscall: %d ", (int)SYS_nanosleep);
    ck_assert_msg(strstr(stall_first, want) != NULL ||
                      strstr(stall_first, want_old) != NULL,
                  "no sleeping syscall named in: %s", stall_first);
    ck_assert_msg(strstr(stall_first, "thread state S") != NULL, "not sleeping: %s",
                  stall_first);
}
END_TEST

/* A turn on the CPU (a spin of 300 ms in stall_spin): the probe's first
 * report also gives the loop's own stack, and a frame of it lies in
 * stall_spin (the executable's frames are named by offset: compare with
 * stall_spin's own offset from dladdr). Not under ThreadSanitizer, where the
 * probe does not take stacks ("unavailable"). */
static char stall_stack[TK_LOG_LINE_MAX];
static atomic_int stall_stacks;

static void stall_stack_sink(const char *line, size_t len, void *data)
{
    (void)data;
    if (memmem(line, len, "the loop's stack", 16) == NULL)
        return;
    if (atomic_fetch_add(&stall_stacks, 1) == 0)
        snprintf(stall_stack, sizeof(stall_stack), "%.*s", (int)len, line);
}

__attribute__((noinline)) static void stall_spin(void)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (volatile int i = 0; i < 1000; i++)
            ;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 300);
}

static void stall_spin_fire(uv_timer_t *t)
{
    (void)t;
    stall_spin();
}

static void stall_spin_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)data;
    uv_timer_init(loop, &stall_timer);
    uv_timer_start(&stall_timer, stall_spin_fire, 100, 0);
}

/* Whether `line` names a frame "(+0xOFF)" with OFF in [lo, lo + span). */
__attribute__((unused)) static bool stack_has_offset(const char *line, uintptr_t lo,
                                                     uintptr_t span)
{
    for (const char *p = strstr(line, "(+0x"); p != NULL; p = strstr(p + 1, "(+0x")) {
        uintptr_t off = (uintptr_t)strtoull(p + 4, NULL, 16);
        if (off >= lo && off < lo + span)
            return true;
    }
    return false;
}

START_TEST(test_stall_probe_gives_the_stack_of_a_turn_on_the_cpu)
{
    atomic_store(&stall_stacks, 0);
    tk_log_set_sink(stall_stack_sink, NULL);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node *n = stall_node_start(hub, stall_spin_start);
    for (int i = 0; i < 500 && atomic_load(&stall_stacks) == 0; i++)
        usleep(10000);
    usleep(400000); /* past the spin */
    node_stop(n);
    transport_inproc_hub_free(hub);
    tk_log_set_sink(NULL, NULL);
    printf("stall probe: %d stacks; the first: %s", atomic_load(&stall_stacks),
           stall_stack);
    ck_assert_int_ge(atomic_load(&stall_stacks), 1);
#if defined(__SANITIZE_THREAD__)
    ck_assert_msg(strstr(stall_stack, "unavailable") != NULL, "%s", stall_stack);
#else
    void (*fn)(void) = stall_spin;
    void *addr;
    memcpy(&addr, &fn, sizeof(addr)); /* ISO C has no function -> object cast */
    Dl_info info;
    ck_assert_int_ne(dladdr(addr, &info), 0);
    uintptr_t off = (uintptr_t)addr - (uintptr_t)info.dli_fbase;
    ck_assert_msg(stack_has_offset(stall_stack, off, 512),
                  "no frame in stall_spin (+0x%lx) in: %s", (unsigned long)off,
                  stall_stack);
#endif
}
END_TEST

/* The followers' store appends and storage-thread wake-ups over 300 serial
 * writes of a three-node cluster on the fs store. */
/* Over 300 serial writes on a three-node cluster (fs store in a temporary
 * directory, or memory volumes): the followers' appends, their storage
 * threads' wake-ups and their loops' wake-ups through the wake handle. */
static void follower_store_counts(bool fs, uint32_t inline_us, uint64_t *appends,
                                  uint64_t *wakeups, uint64_t *loop_wakeups)
{
    char dir[] = "/tmp/tk-node-inline-XXXXXX";
    if (fs)
        ck_assert_ptr_nonnull(mkdtemp(dir));
    struct tk_options o;
    test_options(&o, 0);
    o.data_dir = fs ? dir : NULL;
    o.follower_inline_sync_us = inline_us;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    struct node_metrics m0[3], m;
    for (uint32_t i = 0; i < 3; i++)
        node_metrics(tk_node_runtime(tk_cluster_node(c, i)), &m0[i]);
    struct tk_write_result res;
    char k[32];
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        nf_put(l, k, "v", TK_MODE_APPLIED, &res);
    }
    *appends = *wakeups = *loop_wakeups = 0;
    for (uint32_t i = 0; i < 3; i++) {
        if (tk_cluster_node(c, i) == l)
            continue;
        wait_applied(c, i, res.revision);
        node_metrics(tk_node_runtime(tk_cluster_node(c, i)), &m);
        *appends += m.store_appends - m0[i].store_appends;
        *wakeups += m.store_wakeups - m0[i].store_wakeups;
        *loop_wakeups += m.loop_wakeups - m0[i].loop_wakeups;
    }
    tk_cluster_stop(c);
    if (fs) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}

/* A follower whose disk is fast writes and syncs each append on its own loop
 * (tk_options.follower_inline_sync_us): its storage thread is not woken per
 * write, as it is with the option off, and neither is its loop (the
 * completion runs on it and only keeps it from sleeping). The followers make
 * at least 300 appends between them: each serial write commits only once a
 * follower has appended it, before the next one exists; a follower that lags
 * may take two in one append. */
START_TEST(test_followers_append_on_their_loop)
{
    uint64_t appends, wakeups, loop_wakeups;
    follower_store_counts(true, 1000000, &appends, &wakeups,
                          &loop_wakeups); /* a 1 s bound: any disk */
    fprintf(stderr, "followers, inline: %llu appends, storage wake-ups %llu, loop %llu\n",
            (unsigned long long)appends, (unsigned long long)wakeups,
            (unsigned long long)loop_wakeups);
    ck_assert_msg(appends >= 300 && wakeups * 4 < appends,
                  "inline: the followers' storage threads woke %llu times for %llu "
                  "appends",
                  (unsigned long long)wakeups, (unsigned long long)appends);
    ck_assert_msg(loop_wakeups * 4 < appends,
                  "inline: the followers' loops were woken %llu times for %llu appends",
                  (unsigned long long)loop_wakeups, (unsigned long long)appends);
    follower_store_counts(true, 0, &appends, &wakeups, &loop_wakeups);
    fprintf(stderr, "followers, off: %llu appends, storage wake-ups %llu, loop %llu\n",
            (unsigned long long)appends, (unsigned long long)wakeups,
            (unsigned long long)loop_wakeups);
    ck_assert_msg(appends >= 300 && wakeups * 2 > appends,
                  "off: the followers' storage threads woke %llu times for %llu appends",
                  (unsigned long long)wakeups, (unsigned long long)appends);
    ck_assert_msg(loop_wakeups * 2 > appends,
                  "off: the followers' loops were woken %llu times for %llu appends "
                  "(a storage thread's completion wakes them)",
                  (unsigned long long)loop_wakeups, (unsigned long long)appends);
    /* Memory volumes complete an idle append on the loop too. */
    follower_store_counts(false, 0, &appends, &wakeups, &loop_wakeups);
    fprintf(stderr, "followers, memory: %llu appends, loop wake-ups %llu\n",
            (unsigned long long)appends, (unsigned long long)loop_wakeups);
    ck_assert_msg(appends >= 300 && loop_wakeups * 4 < appends,
                  "memory: the followers' loops were woken %llu times for %llu appends",
                  (unsigned long long)loop_wakeups, (unsigned long long)appends);
}
END_TEST

static Suite *node_suite(void)
{
    Suite *s = suite_create("node");
    TCase *tc = tcase_create("cluster");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_single_node_commits_after_own_persist);
    tcase_add_test(tc, test_three_nodes_elect_and_replicate);
    tcase_add_test(tc, test_write_on_follower_is_forwarded_to_the_leader);
    tcase_add_test(tc, test_write_without_leader_fails_explicitly);
    tcase_add_test(tc, test_applied_result_visible_to_immediate_read);
    tcase_add_test(tc, test_committed_mode_completes_no_later_than_applied);
    tcase_add_test(tc, test_follower_restarts_and_catches_up);
    tcase_add_test(tc, test_lagging_follower_catches_up_by_snapshot);
    tcase_add_test(tc, test_snapshot_read_beside_tier_downs_catches_a_follower_up);
    tcase_add_test(tc, test_snapshot_by_bytes);
    tcase_add_test(tc, test_followers_append_on_their_loop);
    tcase_add_test(tc, test_leader_dies_with_proposals_in_flight);
    tcase_add_test(tc, test_deposed_leader_fails_its_proposals_promptly);
    tcase_add_test(tc, test_linearizable_read_after_leader_change_sees_acked_writes);
    tcase_add_test(tc, test_backpressure_returns_busy);
    tcase_add_test(tc, test_stop_with_work_in_flight_completes_everything);
    tcase_add_test(tc, test_batch_and_txn);
    tcase_add_test(tc, test_tcp_cluster_replicates_and_scans);
    tcase_add_test(tc, test_steady_writes_allocate_nothing_per_write);
    tcase_add_test(tc, test_tcp_node_off_loopback_needs_a_token);
    tcase_add_test(tc, test_stall_probe_names_what_a_long_turn_waits_on);
    tcase_add_test(tc, test_stall_probe_gives_the_stack_of_a_turn_on_the_cpu);
    tcase_add_test(tc, test_member_records_old_new_and_corrupt);
    suite_add_tcase(s, tc);
    return s;
}

/* Forwarding frames from a fake leader: forged answers and garbage. */
static Suite *forward_suite(void)
{
    Suite *s = suite_create("node-forward");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, install_teardown);
    tcase_add_test(tc, test_forged_forward_answers_are_ignored);
    tcase_add_test(tc, test_entries_during_an_install_wait_beside_it);
    tcase_add_test(tc, test_bad_snapshots_are_refused_and_a_good_one_installs);
    tcase_add_test(tc, test_snapshot_during_tier_work_is_parked);
    tcase_add_test(tc, test_install_interrupted_after_publishing_is_finished_at_restart);
    tcase_add_test(tc,
                   test_install_over_a_diverging_log_interrupted_is_finished_at_restart);
    tcase_add_test(tc, test_forward_request_from_a_non_member_is_dropped);
    tcase_add_test(tc, test_garbage_forward_frames_are_dropped);
    suite_add_tcase(s, tc);
    return s;
}

/* The same cluster behaviours with every node on one loop thread. */
static void set_one_loop(void)
{
    one_loop = true;
}

static Suite *one_loop_suite(void)
{
    Suite *s = suite_create("node-one-loop");
    TCase *tc = tcase_create("one-loop");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, set_one_loop, NULL);
    tcase_add_test(tc, test_three_nodes_elect_and_replicate);
    tcase_add_test(tc, test_write_on_follower_is_forwarded_to_the_leader);
    tcase_add_test(tc, test_follower_restarts_and_catches_up);
    tcase_add_test(tc, test_lagging_follower_catches_up_by_snapshot);
    tcase_add_test(tc, test_snapshot_read_beside_tier_downs_catches_a_follower_up);
    tcase_add_test(tc, test_leader_dies_with_proposals_in_flight);
    tcase_add_test(tc, test_linearizable_read_after_leader_change_sees_acked_writes);
    tcase_add_test(tc, test_stop_with_work_in_flight_completes_everything);
    suite_add_tcase(s, tc);
    return s;
}

/* Spinners share the cores they have: the test's process on one CPU, three
 * node loops and the caller spinning 20 ms after each piece of work. A spinner
 * that kept its CPU would hold it from the thread whose hand-off it waits for
 * until the scheduler took it away (a time slice, milliseconds, at each of the
 * four hand-offs of a write: caller, leader, followers, leader); one that
 * yields on each pass hands over within a pass. Serial puts' p50 is bound at
 * 12 ms, three scheduler ticks (4 ms here): 57-97 us with the yield on this
 * VM (90 under ASan, 200 under TSan), 32 ms (eight ticks) without it (checked:
 * the test fails then). A CPU-bound process beside the test (make test runs
 * two at once) gets the CPU at a yield until the next tick: with two to six
 * busy loops on the machine the p50 was 3.9-4.1 ms. */
START_TEST(test_spinning_threads_yield_a_shared_cpu)
{
    cpu_set_t all, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &all)) {
            CPU_SET(cpu, &one);
            break;
        }
    ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
    struct tk_options o;
    test_options(&o, 0);
    o.one_loop = false;
    o.spin_us = 20000;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    enum { WARM = 20, PUTS = 200 };
    struct tk_hist lat;
    tk_hist_init(&lat);
    for (int i = 0; i < WARM + PUTS; i++) {
        char k[16];
        snprintf(k, sizeof(k), "s%d", i);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ck_assert_int_eq(tk_put(l, k, strlen(k), "v", 1, TK_MODE_APPLIED, NULL), 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (i >= WARM)
            tk_hist_record(&lat, (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u +
                                     (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec);
    }
    double p50_us = (double)tk_hist_quantile(&lat, 0.5) / 1000.0;
    fprintf(stderr, "spinning on one CPU: serial put p50 %.1f us, p99 %.1f us\n", p50_us,
            (double)tk_hist_quantile(&lat, 0.99) / 1000.0);
    ck_assert_msg(p50_us < 12000.0,
                  "serial put p50 %.1f us with four spinning threads on one CPU", p50_us);
    tk_cluster_stop(c);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0); /* CK_FORK=no */
}
END_TEST

/* And with spinning loops and callers (tk_options.spin_us), on one loop and on
 * a thread per node. */
static void set_spin_one_loop(void)
{
    one_loop = true;
    spin_us = 50;
}

static void set_spin(void)
{
    one_loop = false;
    spin_us = 50;
}

static Suite *spin_suite(void)
{
    Suite *s = suite_create("node-spin");
    TCase *tcs[2] = {tcase_create("spin-one-loop"), tcase_create("spin")};
    tcase_add_checked_fixture(tcs[0], set_spin_one_loop, NULL);
    tcase_add_checked_fixture(tcs[1], set_spin, NULL);
    for (int i = 0; i < 2; i++) {
        TCase *tc = tcs[i];
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_three_nodes_elect_and_replicate);
        tcase_add_test(tc, test_write_on_follower_is_forwarded_to_the_leader);
        tcase_add_test(tc, test_lagging_follower_catches_up_by_snapshot);
        tcase_add_test(tc, test_snapshot_read_beside_tier_downs_catches_a_follower_up);
        tcase_add_test(tc, test_stop_with_work_in_flight_completes_everything);
        suite_add_tcase(s, tc);
    }
    tcase_add_test(tcs[1], test_spinning_threads_yield_a_shared_cpu);
    tcase_add_test(tcs[1], test_removed_members_are_let_go_past_the_peer_limit);
    return s;
}

int main(void)
{
    tk_log_set_level(TK_LOG_WARN);
    SRunner *sr = srunner_create(node_suite());
    srunner_add_suite(sr, forward_suite());
    srunner_add_suite(sr, one_loop_suite());
    srunner_add_suite(sr, spin_suite());
    return tk_check_run(sr);
}
