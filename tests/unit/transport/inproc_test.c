/* Unit tests for the in-process hub (transport/inproc.c).
 *
 * Delivery in order with payloads passed by reference (the receiver sees the
 * sender's very blobs, which outlive the sender's own references); delivery to
 * a node on another loop thread; the bounded queue refusing with TK_EBUSY;
 * faults: drop, duplicate, delay (which reorders), symmetric and one-way
 * partitions and heal; peer up/down events; argument errors. Every test ends
 * with uv_loop_close() == 0. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/blob.h"
#include "base/err.h"
#include "tests/check_run.h"
#include "transport/transport.h"

#define MAX_SEEN 20000

struct node {
    struct transport *t;
    uint64_t seen_ctx[MAX_SEEN]; /* read_ctx of each received append, in order */
    size_t n_seen;
    uint64_t ups, downs;
    uint64_t last_up, last_down;
    size_t seen_at_down; /* n_seen when the last peer-down event came */
    size_t close_after;  /* close self after this many messages (0: never) */
    struct tk_blob *last_blob;
    bool closed;
    size_t fwd_n;
    uint64_t fwd_from;
    char fwd_last[32];
};

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    struct node *n = data;
    ck_assert_uint_eq(m->to, transport_id(t));
    if (m->type == RAFT_MSG_APPEND) {
        ck_assert_uint_lt(n->n_seen, MAX_SEEN);
        n->seen_ctx[n->n_seen++] = m->u.append.read_ctx;
        if (m->u.append.n_entries > 0) {
            const struct raft_entry *e = &m->u.append.entries[0];
            ck_assert_uint_eq(e->index, m->u.append.prev_index + 1);
            ck_assert_ptr_nonnull(e->data);
            ck_assert_uint_eq(e->data->len, 8);
            uint64_t v;
            memcpy(&v, e->data->data, 8);
            ck_assert_uint_eq(v, m->u.append.read_ctx);
            tk_blob_unref(n->last_blob);
            n->last_blob = tk_blob_ref(e->data);
        }
    } else if (m->type == RAFT_MSG_SNAPSHOT) {
        tk_blob_unref(n->last_blob);
        n->last_blob = tk_blob_ref(m->u.snapshot.data);
        n->n_seen++;
    } else {
        n->n_seen++;
    }
    if (n->close_after != 0 && n->n_seen == n->close_after && !n->closed) {
        n->closed = true;
        transport_close(t, NULL, NULL);
    }
}

static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    (void)t;
    struct node *n = data;
    n->fwd_n++;
    n->fwd_from = from;
    ck_assert_uint_lt(len, sizeof(n->fwd_last));
    memcpy(n->fwd_last, buf, len);
    n->fwd_last[len] = 0;
}

static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    (void)t;
    struct node *n = data;
    if (up) {
        n->ups++;
        n->last_up = id;
    } else {
        n->downs++;
        n->last_down = id;
        n->seen_at_down = n->n_seen;
    }
}

static struct node *node_new(struct transport_inproc_hub *hub, uv_loop_t *loop,
                             uint64_t id, uint32_t queue_max)
{
    struct node *n = calloc(1, sizeof(*n));
    struct transport_callbacks cbs = {
        .recv = on_recv, .peer = on_peer, .forward = on_forward, .data = n};
    ck_assert_int_eq(transport_inproc_new(hub, loop, id, queue_max, &cbs, &n->t), 0);
    return n;
}

static void node_close(struct node *n)
{
    if (!n->closed) {
        n->closed = true;
        transport_close(n->t, NULL, NULL);
    }
}

static void node_free(struct node *n)
{
    tk_blob_unref(n->last_blob);
    free(n);
}

/* An append carrying `seq` as read_ctx and as an 8-byte payload. */
static int send_seq(struct transport *t, uint64_t to, uint64_t seq)
{
    uint64_t v = seq;
    struct raft_entry e = {.term = 1,
                           .index = seq + 1,
                           .type = RAFT_ENTRY_NORMAL,
                           .data = tk_blob_copy(&v, 8)};
    struct raft_message m = {
        .type = RAFT_MSG_APPEND, .from = transport_id(t), .to = to, .term = 1};
    m.u.append.prev_index = seq;
    m.u.append.read_ctx = seq;
    m.u.append.n_entries = 1;
    m.u.append.entries = &e;
    int rc = transport_send(t, &m);
    tk_blob_unref(e.data);       /* the transport took its own reference */
    memset(&e, 0xab, sizeof(e)); /* and copied the entries array */
    return rc;
}

static void finish(uv_loop_t *loop, struct transport_inproc_hub *hub)
{
    ck_assert_int_eq(uv_run(loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(loop), 0);
    transport_inproc_hub_free(hub);
}

START_TEST(test_delivers_in_order_with_payloads_by_reference)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(1);
    struct node *a = node_new(hub, &loop, 1, 0), *b = node_new(hub, &loop, 2, 0);
    for (uint64_t i = 0; i < 3000; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i), 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    while (b->n_seen < 3000)
        uv_run(&loop, UV_RUN_ONCE);
    for (size_t i = 0; i < 3000; i++)
        ck_assert_uint_eq(b->seen_ctx[i], i);

    /* A snapshot arrives with the sender's blob itself: no copy. */
    struct tk_blob *data = tk_blob_copy("snapshot-bytes", 14);
    struct raft_message m = {.type = RAFT_MSG_SNAPSHOT, .from = 1, .to = 2, .term = 3};
    m.u.snapshot.meta.index = 10;
    m.u.snapshot.meta.config.n_voters = 1;
    m.u.snapshot.meta.config.voters[0] = 1;
    m.u.snapshot.done = true;
    m.u.snapshot.data = data;
    ck_assert_int_eq(transport_send(a->t, &m), 0);
    while (b->n_seen < 3001)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_ptr_eq(b->last_blob, data);
    tk_blob_unref(data);

    /* Forwarded bytes are copied: the sender's buffer may change at once. */
    char fwd[] = "forwarded";
    ck_assert_int_eq(transport_send_forward(a->t, 2, (const uint8_t *)fwd, 9), 0);
    memset(fwd, 'x', 9);
    ck_assert_int_eq(transport_send_forward(a->t, 1, (const uint8_t *)fwd, 9), TK_EINVAL);
    ck_assert_int_eq(transport_send_forward(a->t, 7, (const uint8_t *)fwd, 9),
                     TK_ENOTFOUND);
    while (b->fwd_n < 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_str_eq(b->fwd_last, "forwarded");
    ck_assert_uint_eq(b->fwd_from, 1);

    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.msgs_sent, 3001);
    ck_assert_uint_eq(st.fwd_sent, 1);
    transport_stats(b->t, &st);
    ck_assert_uint_eq(st.msgs_received, 3001);
    node_close(a);
    node_close(b);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

START_TEST(test_peer_events_and_argument_errors)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(1);
    struct node *a = node_new(hub, &loop, 1, 0), *b = node_new(hub, &loop, 2, 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(a->ups, 1);
    ck_assert_uint_eq(a->last_up, 2);
    ck_assert_uint_eq(b->ups, 1);
    ck_assert_uint_eq(b->last_up, 1);

    struct transport *dup;
    struct transport_callbacks cbs = {.recv = on_recv, .data = a};
    ck_assert_int_eq(transport_inproc_new(hub, &loop, 2, 0, &cbs, &dup), TK_EINVAL);
    ck_assert_int_eq(transport_inproc_new(hub, &loop, 0, 0, &cbs, &dup), TK_EINVAL);

    struct raft_message m = {.type = RAFT_MSG_TIMEOUT_NOW, .from = 1, .to = 9, .term = 1};
    ck_assert_int_eq(transport_send(a->t, &m), TK_ENOTFOUND);
    m.to = 1;
    ck_assert_int_eq(transport_send(a->t, &m), TK_EINVAL);
    m.to = 2;
    m.type = RAFT_MSG_NONE;
    ck_assert_int_eq(transport_send(a->t, &m), TK_EINVAL);
    m.type = RAFT_MSG_TYPE_COUNT;
    ck_assert_int_eq(transport_send(a->t, &m), TK_EINVAL);

    node_close(b);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(a->downs, 1);
    ck_assert_uint_eq(a->last_down, 2);
    /* A known but detached peer is down: the message is lost, counted. */
    m.type = RAFT_MSG_TIMEOUT_NOW;
    ck_assert_int_eq(transport_send(a->t, &m), 0);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.send_dropped, 1);
    node_close(a);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

/* Endpoints on one loop hand items over without the hub's lock (a local
 * list): still in order, and a peer's down event comes after every message it
 * sent before it closed, as on a connection. */
START_TEST(test_same_loop_keeps_order_and_down_comes_last)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(1);
    struct node *a = node_new(hub, &loop, 1, 64), *b = node_new(hub, &loop, 2, 64);
    uv_run(&loop, UV_RUN_NOWAIT); /* deliver the peer-up events */
    for (uint64_t i = 0; i < 40; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i), 0);
    node_close(a); /* before b has drained any of them */
    while (b->downs == 0)
        ck_assert_int_ne(uv_run(&loop, UV_RUN_ONCE), 0);
    ck_assert_uint_eq(b->n_seen, 40);
    ck_assert_uint_eq(b->seen_at_down, 40);
    for (size_t i = 0; i < 40; i++)
        ck_assert_uint_eq(b->seen_ctx[i], i);
    /* The closed peer is gone for b: a send to it is dropped, counted. */
    ck_assert_int_eq(send_seq(b->t, 1, 0), 0);
    struct transport_stats st;
    transport_stats(b->t, &st);
    ck_assert_uint_eq(st.send_dropped, 1);
    node_close(b);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

START_TEST(test_full_queue_refuses_with_busy)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(1);
    struct node *a = node_new(hub, &loop, 1, 8), *b = node_new(hub, &loop, 2, 8);
    uv_run(&loop, UV_RUN_NOWAIT); /* deliver the peer-up events */
    int ok = 0, busy = 0;
    for (uint64_t i = 0; i < 20; i++) {
        int rc = send_seq(a->t, 2, i);
        ck_assert(rc == 0 || rc == TK_EBUSY);
        rc == 0 ? ok++ : busy++;
    }
    ck_assert_int_eq(ok, 8);
    ck_assert_int_eq(busy, 12);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.send_busy, 12);
    while (b->n_seen < 8)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(send_seq(a->t, 2, 8), 0); /* room again once drained */
    node_close(a);
    node_close(b);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

/* Sends n appends a -> b and runs the loop until quiet (delays bounded). */
static void send_n_and_settle(uv_loop_t *loop, struct node *a, uint64_t to,
                              uint64_t first, uint64_t n)
{
    for (uint64_t i = first; i < first + n; i++)
        ck_assert_int_eq(send_seq(a->t, to, i), 0);
    uv_run(loop, UV_RUN_NOWAIT);
}

START_TEST(test_faults_drop_dup_partition_heal)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(7);
    struct node *a = node_new(hub, &loop, 1, 0), *b = node_new(hub, &loop, 2, 0);
    uv_run(&loop, UV_RUN_NOWAIT);

    struct transport_link_faults f = {.drop = 1.0};
    ck_assert_int_eq(transport_inproc_set_faults(hub, 1, 2, &f), 0);
    send_n_and_settle(&loop, a, 2, 0, 10);
    ck_assert_uint_eq(b->n_seen, 0);

    f = (struct transport_link_faults){.drop = 0.5};
    ck_assert_int_eq(transport_inproc_set_faults(hub, 1, 2, &f), 0);
    send_n_and_settle(&loop, a, 2, 0, 1000);
    ck_assert_uint_gt(b->n_seen, 350);
    ck_assert_uint_lt(b->n_seen, 650);

    f = (struct transport_link_faults){.dup = 1.0};
    ck_assert_int_eq(transport_inproc_set_faults(hub, 1, 2, &f), 0);
    b->n_seen = 0;
    send_n_and_settle(&loop, a, 2, 0, 10);
    ck_assert_uint_eq(b->n_seen, 20);
    ck_assert_uint_eq(b->seen_ctx[0], 0);
    ck_assert_uint_eq(b->seen_ctx[1], 0);

    /* Symmetric partition: nothing either way, forwarded bytes included. */
    transport_inproc_heal(hub);
    ck_assert_int_eq(transport_inproc_partition(hub, 1, 2, false), 0);
    b->n_seen = a->n_seen = 0;
    send_n_and_settle(&loop, a, 2, 0, 5);
    send_n_and_settle(&loop, b, 1, 0, 5);
    ck_assert_int_eq(transport_send_forward(a->t, 2, (const uint8_t *)"f", 1), 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(b->n_seen, 0);
    ck_assert_uint_eq(a->n_seen, 0);
    ck_assert_uint_eq(b->fwd_n, 0);
    /* One way: a -> b blocked, b -> a flows. */
    transport_inproc_heal(hub);
    ck_assert_int_eq(transport_inproc_partition(hub, 1, 2, true), 0);
    send_n_and_settle(&loop, a, 2, 0, 5);
    send_n_and_settle(&loop, b, 1, 0, 5);
    ck_assert_uint_eq(b->n_seen, 0);
    ck_assert_uint_eq(a->n_seen, 5);
    /* Heal: a -> b flows again. */
    transport_inproc_heal(hub);
    send_n_and_settle(&loop, a, 2, 100, 5);
    ck_assert_uint_eq(b->n_seen, 5);
    ck_assert_uint_eq(b->seen_ctx[0], 100);

    f = (struct transport_link_faults){.delay_min_ms = 5, .delay_max_ms = 1};
    ck_assert_int_eq(transport_inproc_set_faults(hub, 1, 2, &f), TK_EINVAL);
    ck_assert_int_eq(transport_inproc_set_faults(hub, 0, 2, &f), TK_EINVAL);
    node_close(a);
    node_close(b);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

START_TEST(test_delay_holds_back_and_reorders)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct node *a = node_new(hub, &loop, 1, 0), *b = node_new(hub, &loop, 2, 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    struct transport_link_faults f = {.delay_min_ms = 20, .delay_max_ms = 40};
    ck_assert_int_eq(transport_inproc_set_faults(hub, 1, 2, &f), 0);
    uint64_t t0 = uv_hrtime();
    send_n_and_settle(&loop, a, 2, 0, 200);
    ck_assert_uint_eq(b->n_seen, 0); /* held back */
    while (b->n_seen < 200)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_ge(uv_hrtime() - t0, 20u * 1000000u);
    size_t inversions = 0;
    for (size_t i = 1; i < 200; i++)
        inversions += b->seen_ctx[i] < b->seen_ctx[i - 1];
    ck_assert_uint_gt(inversions, 0);
    /* Closing with delayed messages pending frees them (ASan checks). */
    send_n_and_settle(&loop, a, 2, 0, 10);
    node_close(a);
    node_close(b);
    finish(&loop, hub);
    node_free(a);
    node_free(b);
}
END_TEST

/* ---- Two loops on two threads ---- */

struct remote {
    uv_loop_t loop;
    struct node *n;
    struct transport_inproc_hub *hub;
    uv_sem_t ready;
};

static void remote_main(void *arg)
{
    struct remote *r = arg;
    uv_loop_init(&r->loop);
    r->n = node_new(r->hub, &r->loop, 2, 1 << 15);
    r->n->close_after = 8000; /* closes itself after the last message */
    uv_sem_post(&r->ready);
    uv_run(&r->loop, UV_RUN_DEFAULT);
}

static void on_peer_down_close(struct transport *t, uint64_t id, bool up, void *data)
{
    struct node *n = data;
    on_peer(t, id, up, data);
    if (!up && !n->closed) {
        n->closed = true;
        transport_close(t, NULL, NULL);
    }
}

START_TEST(test_delivers_across_loop_threads)
{
    struct remote r;
    memset(&r, 0, sizeof(r));
    r.hub = transport_inproc_hub_new(1);
    uv_sem_init(&r.ready, 0);
    uv_thread_t th;
    ck_assert_int_eq(uv_thread_create(&th, remote_main, &r), 0);
    uv_sem_wait(&r.ready);

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct node *a = calloc(1, sizeof(*a));
    struct transport_callbacks cbs = {
        .recv = on_recv, .peer = on_peer_down_close, .data = a};
    ck_assert_int_eq(transport_inproc_new(r.hub, &loop, 1, 0, &cbs, &a->t), 0);
    for (uint64_t i = 0; i < 8000; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i), 0);
    /* b closes after 8000 messages; its down event closes a. */
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    uv_thread_join(&th);
    ck_assert_uint_eq(r.n->n_seen, 8000);
    for (size_t i = 0; i < 8000; i++)
        ck_assert_uint_eq(r.n->seen_ctx[i], i);
    ck_assert_int_eq(uv_loop_close(&r.loop), 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    transport_inproc_hub_free(r.hub);
    uv_sem_destroy(&r.ready);
    node_free(r.n);
    node_free(a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("transport_inproc");
    TCase *tc = tcase_create("inproc");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_delivers_in_order_with_payloads_by_reference);
    tcase_add_test(tc, test_peer_events_and_argument_errors);
    tcase_add_test(tc, test_full_queue_refuses_with_busy);
    tcase_add_test(tc, test_same_loop_keeps_order_and_down_comes_last);
    tcase_add_test(tc, test_faults_drop_dup_partition_heal);
    tcase_add_test(tc, test_delay_holds_back_and_reorders);
    tcase_add_test(tc, test_delivers_across_loop_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
