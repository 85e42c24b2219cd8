/* Forwarded bytes and Raft traffic on one TCP link (transport/tcp.c, issue 19):
 * forwarded frames may fill only a quarter of a peer's send queue (or one
 * frame when none is queued), so a burst of forwarded writes through a
 * follower never refuses a Raft message for want of room and never holds a
 * heartbeat behind more than that share.
 *
 * test_forwards_take_a_quarter_of_the_queue counts it exactly on a queue that
 * cannot drain (the peer is never connected); test_heartbeats_keep_time_under_a
 * _forward_burst saturates a live link with 200 KiB forwards while a heartbeat
 * goes every 10 ms, and requires every heartbeat accepted and delivered in
 * time, printing the delays. With FWD_QUEUE_SHARE 1 (the old shared queue)
 * both fail: forwards take the whole queue and heartbeats are refused. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/blob.h"
#include "base/err.h"
#include "tests/check_run.h"
#include "transport/transport.h"

#define CLUSTER 0xC1C2u
#define HB_MAX 4096

struct side {
    struct transport *t;
    struct side *sender; /* whose heartbeats this side receives */
    uint64_t ups;
    uint64_t fwd_bytes; /* forwarded bytes received */
    uint64_t hb_sent_ns[HB_MAX];
    uint64_t hb_delay_ns[HB_MAX];
    size_t hb_sent, hb_seen, hb_refused;
};

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    (void)t;
    struct side *from = ((struct side *)data)->sender;
    ck_assert_int_eq(m->type, RAFT_MSG_APPEND);
    ck_assert_uint_eq(m->u.append.n_entries, 0);
    uint64_t seq = m->u.append.read_ctx;
    ck_assert_uint_lt(seq, from->hb_sent);
    from->hb_delay_ns[seq] = uv_hrtime() - from->hb_sent_ns[seq];
    from->hb_seen++;
}

static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    (void)t;
    (void)from;
    (void)buf;
    ((struct side *)data)->fwd_bytes += len;
}

static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    (void)t;
    (void)id;
    if (up)
        ((struct side *)data)->ups++;
}

static struct side *side_new(uv_loop_t *loop, uint64_t id, uint64_t queue_bytes)
{
    struct transport_tcp_options o;
    transport_tcp_options_default(&o);
    o.id = id;
    o.cluster_id = CLUSTER;
    o.listen_host = "127.0.0.1";
    o.backoff_min_ms = 10;
    o.backoff_max_ms = 80;
    o.frame_max = 256u << 10;
    o.snapshot_chunk = 64u << 10;
    o.send_queue_bytes = queue_bytes;
    o.seed = id;
    struct side *s = calloc(1, sizeof(*s));
    struct transport_callbacks cbs = {
        .recv = on_recv, .peer = on_peer, .forward = on_forward, .data = s};
    ck_assert_int_eq(transport_tcp_new(loop, &o, &cbs, &s->t), 0);
    return s;
}

static int heartbeat(struct side *s, uint64_t to, uint64_t seq)
{
    struct raft_message m = {
        .type = RAFT_MSG_APPEND, .from = transport_id(s->t), .to = to, .term = 2};
    m.u.append.read_ctx = seq;
    return transport_send(s->t, &m);
}

static int append60k(struct transport *t, uint64_t to)
{
    struct tk_blob *b = tk_blob_new(60u << 10);
    memset(b->data, 0x3c, b->len);
    struct raft_entry e = {.term = 2, .index = 1, .data = b};
    struct raft_message m = {
        .type = RAFT_MSG_APPEND, .from = transport_id(t), .to = to, .term = 2};
    m.u.append.n_entries = 1;
    m.u.append.entries = &e;
    int rc = transport_send(t, &m);
    tk_blob_unref(b);
    return rc;
}

static void finish(uv_loop_t *loop)
{
    ck_assert_int_eq(uv_run(loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

START_TEST(test_forwards_take_a_quarter_of_the_queue)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    /* Peer 2 is never reached (the loop does not run until the end), so the
     * queue only fills: 1 MiB, forwards up to 256 KiB of it. */
    struct side *a = side_new(&loop, 1, 1u << 20);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 2, "127.0.0.1", 1), 0);
    static uint8_t buf[200u << 10];
    int n_fwd = 0, rc;
    while ((rc = transport_send_forward(a->t, 2, buf, 60u << 10)) == 0)
        n_fwd++;
    ck_assert_int_eq(rc, TK_EBUSY);
    ck_assert_int_eq(n_fwd, 4); /* 4 frames of 60 KiB + 9 <= 256 KiB < 5 */
    ck_assert_int_eq(transport_send_forward(a->t, 2, buf, 20u << 10), TK_EBUSY);
    ck_assert_int_eq(transport_send_forward(a->t, 2, buf, 1), 0); /* 16 KiB left */
    /* Raft messages still find the other 3/4 of the queue. */
    int n_raft = 0;
    while ((rc = append60k(a->t, 2)) == 0)
        n_raft++;
    ck_assert_int_eq(rc, TK_EBUSY);
    ck_assert_int_ge(n_raft, 12);
    ck_assert_int_le(n_raft, 13);
    ck_assert_int_eq(heartbeat(a, 2, 0), 0); /* the queue's tail room */

    /* One forward larger than the share goes when none is queued (a 200 KiB
     * frame against 64 KiB of a 256 KiB queue), then none until it leaves. */
    struct side *b = side_new(&loop, 3, 256u << 10);
    ck_assert_int_eq(transport_tcp_add_peer(b->t, 4, "127.0.0.1", 1), 0);
    ck_assert_int_eq(transport_send_forward(b->t, 4, buf, sizeof(buf)), 0);
    ck_assert_int_eq(transport_send_forward(b->t, 4, buf, 1), TK_EBUSY);
    ck_assert_int_eq(append60k(b->t, 4), TK_EBUSY); /* 200 + 60 KiB > 256 KiB */
    ck_assert_int_eq(heartbeat(b, 4, 0), 0);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.fwd_sent, 5);
    ck_assert_uint_eq(st.send_busy, 3);
    transport_close(a->t, NULL, NULL);
    transport_close(b->t, NULL, NULL);
    finish(&loop);
    free(a);
    free(b);
}
END_TEST

struct burst {
    struct side *a;
    uint64_t next_hb;
    uint64_t fwd_sent, fwd_busy;
    uv_timer_t hb, stop;
    bool done;
};

static void on_hb(uv_timer_t *h)
{
    struct burst *x = h->data;
    struct side *a = x->a;
    if (a->hb_sent == HB_MAX)
        return;
    a->hb_sent_ns[a->hb_sent] = uv_hrtime();
    if (heartbeat(a, 2, a->hb_sent) == 0)
        a->hb_sent++;
    else
        a->hb_refused++;
}

static void on_stop(uv_timer_t *h)
{
    ((struct burst *)h->data)->done = true;
}

static int cmp_u64(const void *p, const void *q)
{
    uint64_t a = *(const uint64_t *)p, b = *(const uint64_t *)q;
    return a < b ? -1 : a > b;
}

START_TEST(test_heartbeats_keep_time_under_a_forward_burst)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    /* The default queue (8 MiB: forwards up to 2 MiB) and 200 KiB forwards. */
    struct side *a = side_new(&loop, 1, 0), *b = side_new(&loop, 2, 0);
    ck_assert_int_eq(
        transport_tcp_add_peer(a->t, 2, "127.0.0.1", transport_tcp_port(b->t)), 0);
    ck_assert_int_eq(
        transport_tcp_add_peer(b->t, 1, "127.0.0.1", transport_tcp_port(a->t)), 0);
    b->sender = a; /* b's recv looks up the send times in a's table */
    uint64_t t0 = uv_hrtime();
    while (a->ups == 0 && uv_hrtime() - t0 < 10000000000ull)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_eq(a->ups, 1);
    struct burst x = {.a = a};
    uv_timer_init(&loop, &x.hb);
    uv_timer_init(&loop, &x.stop);
    x.hb.data = x.stop.data = &x;
    uv_timer_start(&x.hb, on_hb, 10, 10);
    uv_timer_start(&x.stop, on_stop, 2000, 0);
    static uint8_t buf[200u << 10];
    while (!x.done) {
        /* Forward as fast as the queue takes them, then one loop turn. */
        int rc;
        while ((rc = transport_send_forward(a->t, 2, buf, sizeof(buf))) == 0)
            x.fwd_sent += sizeof(buf);
        ck_assert_int_eq(rc, TK_EBUSY);
        /* ... and small ones to the brim, as a mix of clients would. */
        while ((rc = transport_send_forward(a->t, 2, buf, 16)) == 0)
            x.fwd_sent += 16;
        ck_assert_int_eq(rc, TK_EBUSY);
        x.fwd_busy++;
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&x.hb);
    t0 = uv_hrtime();
    while (a->hb_seen < a->hb_sent && uv_hrtime() - t0 < 10000000000ull)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_eq(a->hb_seen, a->hb_sent);
    ck_assert_uint_eq(a->hb_refused, 0);
    ck_assert_uint_ge(a->hb_sent, 50); /* 2 s at 10 ms, on a busy machine */
    ck_assert_uint_gt(x.fwd_busy, 10); /* the forwards kept the queue full */
    uint64_t *d = malloc(a->hb_sent * sizeof(*d));
    memcpy(d, a->hb_delay_ns, a->hb_sent * sizeof(*d));
    qsort(d, a->hb_sent, sizeof(*d), cmp_u64);
    double p50 = d[a->hb_sent / 2] / 1e6, mx = d[a->hb_sent - 1] / 1e6;
    printf("forward burst: %.0f MiB forwarded in 2 s (refused %llu times: queue share "
           "full), %zu heartbeats, none refused; delay p50 %.2f ms, max %.2f ms\n",
           x.fwd_sent / 1048576.0, (unsigned long long)x.fwd_busy, a->hb_sent, p50, mx);
    fflush(stdout);
    /* Behind at most 2 MiB of forwards in our queue (plus the kernel's
     * socket buffers, a few MiB on loopback): measured p50 0.9-2.2 ms, max
     * 16-71 ms on the loaded 2-core VM (scheduling; printed, not asserted).
     * The median, with a wide margin, must stay far under the 200 ms
     * election timeout. */
    ck_assert_msg(p50 < 20.0, "heartbeats took %.1f ms (median) behind forwards", p50);
    free(d);
    uv_close((uv_handle_t *)&x.hb, NULL);
    uv_close((uv_handle_t *)&x.stop, NULL);
    transport_close(a->t, NULL, NULL);
    transport_close(b->t, NULL, NULL);
    finish(&loop);
    free(a);
    free(b);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("transport_tcp_forward");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_forwards_take_a_quarter_of_the_queue);
    tcase_add_test(tc, test_heartbeats_keep_time_under_a_forward_burst);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
