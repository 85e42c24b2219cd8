/* Unit tests for the TCP transport (transport/tcp.c), two or more transports on
 * one loop over 127.0.0.1.
 *
 * Delivery in order both ways, payloads intact, a multi-chunk snapshot arriving
 * whole, frames coalesced into few writes; peer up/down events and reconnection
 * after the peer restarts; handshake mismatches on either side (cluster id,
 * node id behind the address, magic, version); backpressure when a peer stops
 * reading; and every bad-input case from a raw client (garbage, a wrong CRC, an
 * oversized length, a truncated frame, a trickling peer, an unknown frame kind,
 * an unknown message type, a frame before the handshake), each closing that
 * connection only and counted, while another peer keeps being served.
 * Every test ends with uv_loop_close() == 0. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/blob.h"
#include "base/err.h"
#include "base/log.h"
#include "tests/check_run.h"
#include "transport/transport.h"
#include "transport/transport_internal.h"

#define CLUSTER 0xC1C1u
#define MAX_SEEN 40000

struct tnode {
    struct transport *t;
    uint64_t fwd_from;
    size_t fwd_n;
    uint8_t fwd_last[64];
    size_t fwd_last_len;
    uint64_t seen[MAX_SEEN];
    size_t n_seen;
    size_t bytes_seen;
    uint64_t ups, downs;
    struct tk_blob *snap;
    bool closed;
};

static void on_recv(struct transport *t, const struct raft_message *m, void *data)
{
    struct tnode *n = data;
    ck_assert_uint_eq(m->to, transport_id(t));
    if (m->type == RAFT_MSG_APPEND) {
        ck_assert_uint_lt(n->n_seen, MAX_SEEN);
        n->seen[n->n_seen++] = m->u.append.read_ctx;
        for (uint32_t i = 0; i < m->u.append.n_entries; i++) {
            const struct tk_blob *b = m->u.append.entries[i].data;
            ck_assert_ptr_nonnull(b);
            ck_assert_uint_ge(b->len, 9);
            uint64_t v;
            memcpy(&v, b->data, 8);
            ck_assert_uint_eq(v, m->u.append.read_ctx);
            ck_assert_uint_eq(b->data[b->len - 1], (uint8_t)(v * 7));
            n->bytes_seen += b->len;
        }
    } else if (m->type == RAFT_MSG_SNAPSHOT) {
        ck_assert_int_eq(m->u.snapshot.done, 1);
        ck_assert_uint_eq(m->u.snapshot.offset, 0);
        tk_blob_unref(n->snap);
        n->snap = tk_blob_ref(m->u.snapshot.data);
    } else {
        n->n_seen++;
    }
}

static void on_forward(struct transport *t, uint64_t from, const uint8_t *buf, size_t len,
                       void *data)
{
    (void)t;
    struct tnode *n = data;
    n->fwd_from = from;
    n->fwd_n++;
    ck_assert_uint_le(len, sizeof(n->fwd_last));
    memcpy(n->fwd_last, buf, len);
    n->fwd_last_len = len;
}

static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    (void)t;
    (void)id;
    struct tnode *n = data;
    up ? n->ups++ : n->downs++;
}

static void base_opts(struct transport_tcp_options *o, uint64_t id)
{
    transport_tcp_options_default(o);
    o->id = id;
    o->cluster_id = CLUSTER;
    o->listen_host = "127.0.0.1";
    o->backoff_min_ms = 10;
    o->backoff_max_ms = 80;
    o->io_timeout_ms = 400;
    o->frame_max = 256u << 10;
    o->snapshot_chunk = 64u << 10;
    o->seed = id;
}

static struct tnode *tnode_new(uv_loop_t *loop, const struct transport_tcp_options *o)
{
    struct tnode *n = calloc(1, sizeof(*n));
    struct transport_callbacks cbs = {
        .recv = on_recv, .peer = on_peer, .forward = on_forward, .data = n};
    ck_assert_int_eq(transport_tcp_new(loop, o, &cbs, &n->t), 0);
    return n;
}

static struct tnode *tnode(uv_loop_t *loop, uint64_t id)
{
    struct transport_tcp_options o;
    base_opts(&o, id);
    return tnode_new(loop, &o);
}

static void tnode_close(struct tnode *n)
{
    if (!n->closed) {
        n->closed = true;
        transport_close(n->t, NULL, NULL);
    }
}

static void tnode_free(struct tnode *n)
{
    tk_blob_unref(n->snap);
    free(n);
}

static void link2(struct tnode *a, struct tnode *b)
{
    ck_assert_int_eq(transport_tcp_add_peer(a->t, transport_id(b->t), "127.0.0.1",
                                            transport_tcp_port(b->t)),
                     0);
}

/* An append with `seq` in read_ctx and one entry of `len` bytes (at least 9):
 * seq, filler, and seq * 7 in the last byte. */
static int send_seq(struct transport *t, uint64_t to, uint64_t seq, size_t len)
{
    if (len < 9)
        len = 9;
    struct tk_blob *b = tk_blob_new(len);
    memset(b->data, 0x5a, len);
    memcpy(b->data, &seq, 8);
    b->data[len - 1] = (uint8_t)(seq * 7);
    struct raft_entry e = {.term = 2, .index = seq + 1, .data = b};
    struct raft_message m = {
        .type = RAFT_MSG_APPEND, .from = transport_id(t), .to = to, .term = 2};
    m.u.append.prev_index = seq;
    m.u.append.read_ctx = seq;
    m.u.append.n_entries = 1;
    m.u.append.entries = &e;
    int rc = transport_send(t, &m);
    tk_blob_unref(b);
    return rc;
}

/* Runs the loop until *flag or the deadline; fails the test on the deadline. */
static bool deadline_hit;

static void on_deadline(uv_timer_t *t)
{
    (void)t;
    deadline_hit = true;
}

#define RUN_UNTIL(loop, cond, ms)                                                        \
    do {                                                                                 \
        uv_timer_t dl_;                                                                  \
        uv_timer_init((loop), &dl_);                                                     \
        deadline_hit = false;                                                            \
        uv_timer_start(&dl_, on_deadline, (ms), 0);                                      \
        while (!(cond) && !deadline_hit)                                                 \
            uv_run((loop), UV_RUN_ONCE);                                                 \
        uv_close((uv_handle_t *)&dl_, NULL);                                             \
        uv_run((loop), UV_RUN_NOWAIT);                                                   \
        ck_assert_msg((cond), "timed out waiting for: %s", #cond);                       \
    } while (0)

/* Runs the loop for `ms` regardless. */
static void run_for(uv_loop_t *loop, uint64_t ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    deadline_hit = false;
    uv_timer_start(&t, on_deadline, ms, 0);
    while (!deadline_hit)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void finish(uv_loop_t *loop)
{
    ck_assert_int_eq(uv_run(loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

START_TEST(test_delivers_in_order_both_ways_and_coalesces)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tnode *a = tnode(&loop, 1), *b = tnode(&loop, 2);
    link2(a, b);
    link2(b, a);
    /* Sent before the connection exists: queued, then delivered in order. */
    for (uint64_t i = 0; i < 100; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i, 8 + (i % 600)), 0);
    RUN_UNTIL(&loop, a->ups == 1 && b->ups == 1, 10000);
    for (uint64_t i = 100; i < 8000; i++) {
        int rc;
        while ((rc = send_seq(a->t, 2, i, 8 + (i % 600))) == TK_EBUSY)
            uv_run(&loop, UV_RUN_ONCE);
        ck_assert_int_eq(rc, 0);
        if (i % 10 == 0)
            ck_assert_int_eq(send_seq(b->t, 1, i / 10, 16), 0);
    }
    RUN_UNTIL(&loop, b->n_seen == 8000 && a->n_seen == 790, 20000);
    for (size_t i = 0; i < 8000; i++)
        ck_assert_uint_eq(b->seen[i], i);
    for (size_t i = 0; i < 790; i++) /* b sent 10, 11, ... 799 */
        ck_assert_uint_eq(a->seen[i], i + 10);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.msgs_sent, 8000);
    ck_assert_uint_lt(st.writes, 8000 / 4); /* frames coalesce into writes */
    ck_assert_uint_eq(st.conns_dialed, 1);
    ck_assert_uint_eq(st.conns_accepted, 1);

    /* A snapshot of several chunks (64 KiB each here) arrives whole. */
    struct tk_blob *data = tk_blob_new(300000);
    for (size_t i = 0; i < data->len; i++)
        data->data[i] = (uint8_t)(i * 31 + 7);
    struct raft_message m = {.type = RAFT_MSG_SNAPSHOT, .from = 1, .to = 2, .term = 3};
    m.u.snapshot.meta.index = 77;
    m.u.snapshot.meta.term = 3;
    m.u.snapshot.meta.config.n_voters = 2;
    m.u.snapshot.meta.config.voters[0] = 1;
    m.u.snapshot.meta.config.voters[1] = 2;
    m.u.snapshot.done = true;
    m.u.snapshot.data = data;
    ck_assert_int_eq(transport_send(a->t, &m), 0);
    RUN_UNTIL(&loop, b->snap != NULL, 10000);
    ck_assert_uint_eq(b->snap->len, data->len);
    ck_assert_mem_eq(b->snap->data, data->data, data->len);
    tk_blob_unref(data);

    /* Forwarded bytes, both ways, in order with the Raft messages. */
    ck_assert_int_eq(send_seq(a->t, 2, 8000, 16), 0);
    ck_assert_int_eq(transport_send_forward(a->t, 2, (const uint8_t *)"fwd-req", 7), 0);
    ck_assert_int_eq(transport_send_forward(b->t, 1, (const uint8_t *)"fwd-resp!", 9), 0);
    RUN_UNTIL(&loop, b->fwd_n == 1 && a->fwd_n == 1, 10000);
    ck_assert_uint_eq(b->n_seen, 8001); /* the append sent before it arrived first */
    ck_assert_uint_eq(b->fwd_from, 1);
    ck_assert_uint_eq(b->fwd_last_len, 7);
    ck_assert_mem_eq(b->fwd_last, "fwd-req", 7);
    ck_assert_uint_eq(a->fwd_from, 2);
    ck_assert_mem_eq(a->fwd_last, "fwd-resp!", 9);
    ck_assert_int_eq(transport_send_forward(a->t, 1, (const uint8_t *)"x", 1), TK_EINVAL);
    ck_assert_int_eq(transport_send_forward(a->t, 9, (const uint8_t *)"x", 1),
                     TK_ENOTFOUND);
    uint8_t *huge = calloc(1, 256u << 10);
    ck_assert_int_eq(transport_send_forward(a->t, 2, huge, 256u << 10), TK_ETOOBIG);
    free(huge);
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.fwd_sent, 1);
    ck_assert_uint_eq(st.fwd_received, 1);

    /* Argument errors. */
    m.type = RAFT_MSG_TIMEOUT_NOW;
    m.to = 9;
    ck_assert_int_eq(transport_send(a->t, &m), TK_ENOTFOUND);
    m.to = 1;
    ck_assert_int_eq(transport_send(a->t, &m), TK_EINVAL);
    m.to = 2;
    m.from = 5;
    ck_assert_int_eq(transport_send(a->t, &m), TK_EINVAL);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 2, "127.0.0.1", 1), TK_EINVAL);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 1, "127.0.0.1", 1), TK_EINVAL);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 3, "not a host!", 1), TK_EINVAL);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 3, "", 1), TK_EINVAL);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 3, "localhost", 0), TK_EINVAL);
    /* An append larger than the frame limit. */
    ck_assert_int_eq(send_seq(a->t, 2, 1, 300u << 10), TK_ETOOBIG);

    tnode_close(a);
    tnode_close(b);
    finish(&loop);
    tnode_free(a);
    tnode_free(b);
}
END_TEST

/* A receiver that closes its transport from inside recv_cb, with more frames
 * of the same read still unparsed: nothing more is delivered, nothing leaks. */
static void on_recv_close_at_5(struct transport *t, const struct raft_message *m,
                               void *data)
{
    struct tnode *n = data;
    on_recv(t, m, data);
    if (n->n_seen == 5 && !n->closed) {
        n->closed = true;
        transport_close(t, NULL, NULL);
    }
}

START_TEST(test_close_from_inside_receive_callback)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tnode *a = tnode(&loop, 1);
    struct tnode *b = calloc(1, sizeof(*b));
    struct transport_tcp_options o;
    base_opts(&o, 2);
    struct transport_callbacks cbs = {.recv = on_recv_close_at_5, .data = b};
    ck_assert_int_eq(transport_tcp_new(&loop, &o, &cbs, &b->t), 0);
    link2(a, b);
    for (uint64_t i = 0; i < 100; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i, 300), 0);
    RUN_UNTIL(&loop, b->closed && a->downs == 1, 10000);
    ck_assert_uint_eq(b->n_seen, 5);
    tnode_close(a);
    finish(&loop);
    tnode_free(a);
    tnode_free(b);
}
END_TEST

START_TEST(test_reconnects_after_peer_restart)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tnode *a = tnode(&loop, 1), *b = tnode(&loop, 2);
    uint16_t port = transport_tcp_port(b->t);
    link2(a, b);
    ck_assert_int_eq(send_seq(a->t, 2, 0, 8), 0);
    RUN_UNTIL(&loop, b->n_seen == 1, 10000);
    ck_assert_uint_eq(a->ups, 1);

    tnode_close(b);
    RUN_UNTIL(&loop, a->downs == 1, 10000);
    run_for(&loop, 100); /* a few refused redials, backing off */
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_ge(st.conns_failed, 1);

    struct transport_tcp_options o;
    base_opts(&o, 2);
    o.listen_port = port;
    struct tnode *b2 = tnode_new(&loop, &o);
    RUN_UNTIL(&loop, a->ups == 2, 10000);
    ck_assert_int_eq(send_seq(a->t, 2, 1, 8), 0);
    RUN_UNTIL(&loop, b2->n_seen == 1, 10000);
    ck_assert_uint_eq(b2->seen[0], 1);
    tnode_close(a);
    tnode_close(b2);
    finish(&loop);
    tnode_free(a);
    tnode_free(b);
    tnode_free(b2);
}
END_TEST

START_TEST(test_redials_with_exponential_backoff)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    tk_log_set_level(TK_LOG_ERROR);
    /* A port nobody listens on: take one, then close it. */
    struct tnode *gone = tnode(&loop, 2);
    uint16_t port = transport_tcp_port(gone->t);
    tnode_close(gone);
    uv_run(&loop, UV_RUN_NOWAIT);
    struct tnode *a = tnode(&loop, 1); /* backoff 10 ms doubling to 80 ms */
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 2, "127.0.0.1", port), 0);
    run_for(&loop, 400);
    struct transport_stats st;
    transport_stats(a->t, &st);
    /* Delays of at least 5, 10, 20, 40, 40, ... ms (jitter halves at most):
     * no more than 12 dials fit in 400 ms; without backoff there would be
     * hundreds. And it keeps trying. */
    ck_assert_uint_ge(st.conns_failed, 4);
    ck_assert_uint_le(st.conns_failed, 12);
    ck_assert_uint_eq(a->ups, 0);
    tnode_close(a);
    finish(&loop);
    tnode_free(a);
    tnode_free(gone);
}
END_TEST

/* A peer named by a host name is resolved before each dial; a name that does
 * not resolve counts as a failed dial and is retried; closing while a lookup
 * is in flight completes. */
START_TEST(test_peer_by_host_name)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    tk_log_set_level(TK_LOG_ERROR);
    struct tnode *a = tnode(&loop, 1), *b = tnode(&loop, 2);
    ck_assert_int_eq(
        transport_tcp_add_peer(a->t, 2, "localhost", transport_tcp_port(b->t)), 0);
    ck_assert_int_eq(
        transport_tcp_add_peer(b->t, 1, "localhost", transport_tcp_port(a->t)), 0);
    RUN_UNTIL(&loop, a->ups == 1 && b->ups == 1, 5000);
    for (uint64_t i = 1; i <= 3; i++)
        ck_assert_int_eq(send_seq(a->t, 2, i, 64), 0);
    RUN_UNTIL(&loop, b->n_seen == 3, 5000);
    struct tnode *c = tnode(&loop, 3);
    ck_assert_int_eq(transport_tcp_add_peer(c->t, 9, "no-such-host.invalid", 7000), 0);
    struct transport_stats st;
    transport_stats(c->t, &st);
    RUN_UNTIL(&loop, (transport_stats(c->t, &st), st.conns_failed >= 2), 10000);
    ck_assert_uint_eq(c->ups, 0);
    tnode_close(a);
    tnode_close(b);
    tnode_close(c); /* a lookup may be in flight */
    finish(&loop);
    tnode_free(a);
    tnode_free(b);
    tnode_free(c);
}
END_TEST

START_TEST(test_handshake_mismatch_closes_and_counts)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct transport_tcp_options o;
    base_opts(&o, 1);
    o.cluster_id = 0xBAD;
    struct tnode *wrong_cluster = tnode_new(&loop, &o);
    struct tnode *b = tnode(&loop, 2);
    struct tnode *c = tnode(&loop, 3);
    /* Cluster mismatch: b refuses the dialer. */
    link2(wrong_cluster, b);
    /* Node mismatch: c believes node 4 listens where b does. */
    ck_assert_int_eq(
        transport_tcp_add_peer(c->t, 4, "127.0.0.1", transport_tcp_port(b->t)), 0);
    ck_assert_int_eq(send_seq(wrong_cluster->t, 2, 0, 8), 0);
    ck_assert_int_eq(send_seq(c->t, 4, 0, 8), 0);
    struct transport_stats sb, sc, sw;
    RUN_UNTIL(&loop,
              (transport_stats(c->t, &sc), transport_stats(wrong_cluster->t, &sw),
               sc.conns_failed >= 3 && sw.conns_failed >= 3),
              10000);
    transport_stats(b->t, &sb);
    ck_assert_uint_ge(sb.conns_bad, 3); /* the cluster mismatches, each redial */
    ck_assert_uint_ge(sc.conns_bad, 3); /* c saw the wrong node answer */
    ck_assert_uint_eq(b->n_seen, 0);    /* nothing was delivered */
    ck_assert_uint_eq(c->ups, 0);
    ck_assert_uint_eq(wrong_cluster->ups, 0);
    ck_assert_uint_gt(sw.send_dropped, 0);
    tnode_close(wrong_cluster);
    tnode_close(b);
    tnode_close(c);
    finish(&loop);
    tnode_free(wrong_cluster);
    tnode_free(b);
    tnode_free(c);
}
END_TEST

/* ---- A raw peer: a client or server that speaks bytes, not the protocol ---- */

struct raw {
    uv_tcp_t handle;
    uv_connect_t creq;
    uv_timer_t trickle;
    const uint8_t *trickle_buf;
    size_t trickle_len, trickle_pos;
    bool eof, connected, read_stop_after_hello, got_hello;
    uint64_t hello_node;
    uint8_t in[256];
    size_t in_len;
    uint8_t out[64];
};

static void raw_alloc(uv_handle_t *h, size_t s, uv_buf_t *b)
{
    (void)s;
    struct raw *r = h->data;
    if (r->in_len == sizeof(r->in))
        r->in_len = 0;
    *b = uv_buf_init((char *)r->in + r->in_len, (unsigned)(sizeof(r->in) - r->in_len));
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)b;
    struct raw *r = s->data;
    if (n < 0) {
        r->eof = true;
        uv_read_stop(s);
        return;
    }
    r->in_len += (size_t)n;
    if (r->read_stop_after_hello && !r->got_hello &&
        r->in_len >= FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES) {
        /* Acting as a server: answer the hello, then never read again. */
        r->got_hello = true;
        size_t len = frame__hello_write(r->out, CLUSTER, r->hello_node);
        uv_buf_t ob = uv_buf_init((char *)r->out, (unsigned)len);
        uv_try_write(s, &ob, 1);
        uv_read_stop(s);
    }
}

static void raw_connected(uv_connect_t *req, int status)
{
    struct raw *r = req->data;
    ck_assert_int_eq(status, 0);
    r->connected = true;
    uv_read_start((uv_stream_t *)&r->handle, raw_alloc, raw_read);
}

static void raw_connect(uv_loop_t *loop, struct raw *r, uint16_t port)
{
    memset(r, 0, sizeof(*r));
    struct sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", port, &addr);
    uv_tcp_init(loop, &r->handle);
    uv_timer_init(loop, &r->trickle);
    r->handle.data = r;
    r->trickle.data = r;
    r->creq.data = r;
    ck_assert_int_eq(
        uv_tcp_connect(&r->creq, &r->handle, (struct sockaddr *)&addr, raw_connected), 0);
    RUN_UNTIL(loop, r->connected, 10000);
}

static void raw_write(struct raw *r, const uint8_t *buf, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    ck_assert_int_eq(uv_try_write((uv_stream_t *)&r->handle, &b, 1), (int)len);
}

static void on_trickle(uv_timer_t *t)
{
    struct raw *r = t->data;
    if (r->eof || r->trickle_pos == r->trickle_len) {
        uv_timer_stop(t);
        return;
    }
    uv_buf_t b = uv_buf_init((char *)r->trickle_buf + r->trickle_pos, 1);
    if (uv_try_write((uv_stream_t *)&r->handle, &b, 1) == 1)
        r->trickle_pos++;
}

static void raw_close(struct raw *r)
{
    uv_close((uv_handle_t *)&r->handle, NULL);
    uv_close((uv_handle_t *)&r->trickle, NULL);
}

/* A framed payload (kind byte first) with a correct CRC. */
static size_t frame_of(uint8_t *out, uint8_t kind, const uint8_t *body, size_t len)
{
    out[FRAME_HEADER_BYTES] = kind;
    memcpy(out + FRAME_HEADER_BYTES + 1, body, len);
    frame__seal(out, out + FRAME_HEADER_BYTES, (uint32_t)(1 + len));
    return FRAME_HEADER_BYTES + 1 + len;
}

/* A valid TimeoutNow from node 9 to node 1, framed. */
static size_t good_raft_frame(uint8_t *out)
{
    struct raft_message m = {.type = RAFT_MSG_TIMEOUT_NOW, .from = 9, .to = 1, .term = 1};
    struct codec_enc e;
    codec__enc_init(&e);
    size_t size;
    ck_assert_int_eq(codec__enc_prepare(&e, &m, 0, 0, &size), 0);
    uint8_t body[256];
    ck_assert_uint_le(size, sizeof(body));
    size = codec__enc_pack(&e, body);
    codec__enc_destroy(&e);
    return frame_of(out, FRAME_KIND_RAFT, body, size);
}

enum bad_case {
    BAD_GARBAGE,
    BAD_CRC,
    BAD_OVERSIZED,
    BAD_TRUNCATED,
    BAD_TRICKLE,
    BAD_KIND_ZERO,
    BAD_KIND_UNKNOWN,
    BAD_MSG_TYPE,
    BAD_MSG_IDS,
    BAD_NO_HELLO,
    BAD_MAGIC,
    BAD_VERSION,
    BAD_SECOND_HELLO,
    BAD_COUNT,
};

START_TEST(test_bad_input_closes_only_that_connection)
{
    int which = _i;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tk_log_set_level(TK_LOG_ERROR);
    struct tnode *a = tnode(&loop, 1), *b = tnode(&loop, 2);
    link2(b, a);
    RUN_UNTIL(&loop, b->ups == 1, 10000);

    struct raw r;
    uv_shutdown_t sreq;
    raw_connect(&loop, &r, transport_tcp_port(a->t));
    uint8_t buf[512];
    size_t n = 0;
    uint8_t hello[64];
    size_t hello_len = frame__hello_write(hello, CLUSTER, 9);
    if (which != BAD_NO_HELLO && which != BAD_GARBAGE && which != BAD_MAGIC &&
        which != BAD_VERSION) {
        raw_write(&r, hello, hello_len);
        /* The handshake is answered; the connection is up. */
        RUN_UNTIL(&loop, r.in_len >= hello_len, 10000);
        n = good_raft_frame(buf);
        raw_write(&r, buf, n);
        RUN_UNTIL(&loop, a->n_seen == 1, 10000);
    }
    switch (which) {
    case BAD_GARBAGE:
        memset(buf, 0xee, 100);
        raw_write(&r, buf, 100);
        break;
    case BAD_CRC:
        n = good_raft_frame(buf);
        buf[n - 1] ^= 0x01;
        raw_write(&r, buf, n);
        break;
    case BAD_OVERSIZED:
        n = good_raft_frame(buf);
        buf[3] = 0x7f; /* length ~2 GiB */
        raw_write(&r, buf, n);
        break;
    case BAD_TRUNCATED:
        n = good_raft_frame(buf);
        raw_write(&r, buf, n - 3);
        uv_shutdown(&sreq, (uv_stream_t *)&r.handle, NULL);
        break;
    case BAD_TRICKLE:
        n = good_raft_frame(buf);
        r.trickle_buf = buf;
        r.trickle_len = n;
        uv_timer_start(&r.trickle, on_trickle, 0, 100); /* io_timeout is 400 ms */
        break;
    case BAD_KIND_ZERO:
        raw_write(&r, buf, frame_of(buf, 0, (const uint8_t *)"x", 1));
        break;
    case BAD_KIND_UNKNOWN:
        raw_write(&r, buf, frame_of(buf, 99, (const uint8_t *)"x", 1));
        break;
    case BAD_MSG_TYPE: {
        /* from=9 to=1 and a body in field 12, which this version does not know. */
        const uint8_t body[] = {0x08, 0x09, 0x10, 0x01, 0x62, 0x02, 0x08, 0x01};
        raw_write(&r, buf, frame_of(buf, FRAME_KIND_RAFT, body, sizeof(body)));
        break;
    }
    case BAD_MSG_IDS: {
        /* A message claiming to come from node 2 on node 9's connection. */
        const uint8_t body[] = {0x08, 0x02, 0x10, 0x01, 0x4a, 0x00};
        raw_write(&r, buf, frame_of(buf, FRAME_KIND_RAFT, body, sizeof(body)));
        break;
    }
    case BAD_NO_HELLO:
        raw_write(&r, buf, good_raft_frame(buf));
        break;
    case BAD_MAGIC:
        hello[FRAME_HEADER_BYTES + 1] ^= 0xff;
        frame__seal(hello, hello + FRAME_HEADER_BYTES, 1 + FRAME_HELLO_BYTES);
        raw_write(&r, hello, hello_len);
        break;
    case BAD_VERSION:
        hello[FRAME_HEADER_BYTES + 5] = 0x77;
        frame__seal(hello, hello + FRAME_HEADER_BYTES, 1 + FRAME_HELLO_BYTES);
        raw_write(&r, hello, hello_len);
        break;
    case BAD_SECOND_HELLO:
        raw_write(&r, hello, hello_len);
        break;
    }
    RUN_UNTIL(&loop, r.eof, 10000);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_eq(st.conns_bad, 1);
    /* The other peer is still served. */
    ck_assert_int_eq(send_seq(b->t, 1, 42, 8), 0);
    size_t before = a->n_seen;
    RUN_UNTIL(&loop, a->n_seen == before + 1, 10000);
    ck_assert_uint_eq(a->seen[before], 42);
    raw_close(&r);
    tnode_close(a);
    tnode_close(b);
    finish(&loop);
    tnode_free(a);
    tnode_free(b);
}
END_TEST

/* A peer that completes the handshake and then never reads. */
static void raw_server_conn(uv_stream_t *server, int status)
{
    ck_assert_int_eq(status, 0);
    struct raw *r = server->data;
    uv_tcp_init(server->loop, &r->handle);
    r->handle.data = r;
    ck_assert_int_eq(uv_accept(server, (uv_stream_t *)&r->handle), 0);
    r->connected = true;
    uv_read_start((uv_stream_t *)&r->handle, raw_alloc, raw_read);
}

START_TEST(test_backpressure_when_peer_stops_reading)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_tcp_t server;
    struct raw r;
    memset(&r, 0, sizeof(r));
    r.read_stop_after_hello = true;
    r.hello_node = 2;
    uv_tcp_init(&loop, &server);
    server.data = &r;
    struct sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", 0, &addr);
    ck_assert_int_eq(uv_tcp_bind(&server, (struct sockaddr *)&addr, 0), 0);
    ck_assert_int_eq(uv_listen((uv_stream_t *)&server, 8, raw_server_conn), 0);
    struct sockaddr_in bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&server, (struct sockaddr *)&bound, &blen);

    struct transport_tcp_options o;
    base_opts(&o, 1);
    o.send_queue_bytes = 1u << 20;
    o.listen_host = NULL;
    struct tnode *a = tnode_new(&loop, &o);
    ck_assert_int_eq(transport_tcp_add_peer(a->t, 2, "127.0.0.1", ntohs(bound.sin_port)),
                     0);
    RUN_UNTIL(&loop, a->ups == 1, 10000);
    /* Keep sending 60 KiB messages; once the kernel buffers and our bounded
     * queue are full, every send is refused, however long we wait. */
    uint64_t accepted = 0;
    int busy_rounds = 0;
    for (uint64_t i = 0; busy_rounds < 5 && accepted < (512u << 20); i++) {
        int rc = send_seq(a->t, 2, i, 60u << 10);
        if (rc == 0) {
            accepted += 60u << 10;
            busy_rounds = 0;
            uv_run(&loop, UV_RUN_NOWAIT);
        } else {
            ck_assert_int_eq(rc, TK_EBUSY);
            busy_rounds++;
            run_for(&loop, 20);
        }
    }
    ck_assert_int_eq(busy_rounds, 5);
    ck_assert_uint_lt(accepted, 256u << 20);
    struct transport_stats st;
    transport_stats(a->t, &st);
    ck_assert_uint_ge(st.send_busy, 5);
    tnode_close(a);
    uv_close((uv_handle_t *)&server, NULL);
    uv_close((uv_handle_t *)&r.handle, NULL);
    finish(&loop);
    tnode_free(a);
}
END_TEST

START_TEST(test_listen_failure_is_reported)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    tk_log_set_level(TK_LOG_OFF);
    struct tnode *a = tnode(&loop, 1);
    struct transport_tcp_options o;
    base_opts(&o, 2);
    o.listen_port = transport_tcp_port(a->t); /* taken */
    struct transport *t;
    struct transport_callbacks cbs = {.recv = on_recv, .data = a};
    ck_assert_int_eq(transport_tcp_new(&loop, &o, &cbs, &t), TK_EIO);
    o.listen_host = "999.1.1.1";
    ck_assert_int_eq(transport_tcp_new(&loop, &o, &cbs, &t), TK_EINVAL);
    o.listen_host = "127.0.0.1";
    o.snapshot_chunk = o.frame_max;
    ck_assert_int_eq(transport_tcp_new(&loop, &o, &cbs, &t), TK_EINVAL);
    o.id = 0;
    ck_assert_int_eq(transport_tcp_new(&loop, &o, &cbs, &t), TK_EINVAL);
    tnode_close(a);
    finish(&loop);
    tnode_free(a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("transport_tcp");
    TCase *tc = tcase_create("tcp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_delivers_in_order_both_ways_and_coalesces);
    tcase_add_test(tc, test_reconnects_after_peer_restart);
    tcase_add_test(tc, test_close_from_inside_receive_callback);
    tcase_add_test(tc, test_redials_with_exponential_backoff);
    tcase_add_test(tc, test_peer_by_host_name);
    tcase_add_test(tc, test_handshake_mismatch_closes_and_counts);
    tcase_add_test(tc, test_backpressure_when_peer_stops_reading);
    tcase_add_test(tc, test_listen_failure_is_reported);
    tcase_add_loop_test(tc, test_bad_input_closes_only_that_connection, 0, BAD_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
