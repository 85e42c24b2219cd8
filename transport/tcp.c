/* The TCP transport (libuv): one outgoing connection per peer, inbound
 * connections from peers, frames of protobuf-c Raft messages and of forwarded
 * bytes (transport_send_forward: FRAME_KIND_FORWARD, the body as given).
 *
 * Sending: transport_send encodes the message straight into the peer's queue,
 * a list of output buffers (64 KiB each, or one frame's size when larger) that
 * frames are appended to back to back; nothing else is copied or allocated in
 * steady state. Queued bytes per peer are bounded by send_queue_bytes: a send
 * that does not fit is refused with TK_EBUSY, unless the queue is empty (so a
 * single message larger than the bound can still go). A snapshot is not
 * framed at once: it streams, SNAP_PUMP_CHUNKS chunks (snapshot_chunk bytes
 * each, announcing the whole size) queued ahead at a time, the next framed as
 * each write completes, so no loop turn copies more than that, and other
 * messages to the peer wait behind at most those chunks.
 * Forwarded frames share the queue but may take only a quarter of the bound
 * (FWD_QUEUE_SHARE; or one frame when none is queued or in flight), so a burst
 * of forwarded writes can neither crowd Raft messages out (TK_EBUSY) nor hold
 * a heartbeat behind more than that many bytes of forwards.
 * A uv_prepare and a uv_check handle, started only while there is something to
 * flush, write each peer's queue with one uv_write of up to WRITE_IOV_MAX
 * buffers; one write per peer is in flight at a time and the next flush follows
 * its completion, so everything sent during a loop turn leaves together.
 *
 * Connections: we dial each added peer, send HELLO and wait for the peer's
 * HELLO before writing anything else, so a misdirected dial (wrong node or
 * cluster behind the address) delivers nothing. Frames sent while the peer is
 * not connected wait in the queue (bounded); a connection loss drops the queue
 * and whatever was being written, and redials after a backoff that doubles from
 * backoff_min_ms to backoff_max_ms, times a jitter factor in [0.5, 1].
 *
 * Receiving: each connection reads into a buffer that grows to the frame being
 * read (at most frame_max) and shrinks back afterwards. Frames are parsed and
 * checked in place; a decoded message lives in the connection's codec arena for
 * the duration of recv_cb. Any bad input closes that connection only, logs the
 * reason and counts it in conns_bad. A frame (or the handshake) must complete
 * within io_timeout_ms of its first byte, which rids us of trickling peers.
 *
 * Everything runs on the loop thread that created the transport. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/crc32c.h"
#include "base/err.h"
#include "base/log.h"
#include "base/prng.h"
#include "tls/tls_uv.h"
#include "transport/transport_internal.h"

#define OBUF_BYTES (64u << 10)
#define OBUF_FREE_MAX 8
#define WRITE_IOV_MAX 64
#define FWD_QUEUE_SHARE 4  /* forwarded frames: at most 1/4 of send_queue_bytes */
#define SNAP_PUMP_CHUNKS 2 /* a snapshot under way: chunks queued ahead at most */
/* Snapshot bytes per frame by default: a loop turn copies at most two. At
 * 1 MiB, a leader's turns copying the first chunks of a 1.5 GB stream read
 * just before took 40-57 ms (at about 50 MB/s: docs/history/benchmarks-scale.md,
 * run AC). */
#define SNAP_CHUNK_DEFAULT (256u << 10)
#define RBUF_BYTES (64u << 10)
/* A connection's reads before its handshake ends: a HELLO is 113 bytes, a
 * TLS handshake's records come in pieces; a flood of half-open connections
 * then costs little memory and no page faults. */
#define HS_BUF_BYTES 4096u
/* Connections accepted between two of the loop's prepare callbacks at most:
 * libuv accepts until the queue is empty, so a connection flood faster than
 * the accepts would hold one loop turn for as long as it lasts. The rest wait
 * in the kernel's queue for the next turn. */
#define ACCEPT_TURN_MAX 64
/* A connection keeps a receive buffer up to this size between frames, and
 * the transport up to BIG_OBUFS_MAX output buffers of more than OBUF_BYTES
 * (up to this size each) for the next big frames. Freed after each frame, a
 * follower catching up (1 MiB AppendEntries) mapped a fresh buffer per frame
 * (past the allocator's mmap threshold): 256 page faults per MiB, 4,096
 * faults and about 70 ms of each loop turn at 10M keys, on both sides.
 * 6 MiB: the frame of a write whose body was at the gateway's 4 MiB limit
 * (a command of 4.16 MB, adversary case bodies) is kept too. */
#define BUF_KEEP_BYTES (6u << 20)
#define BIG_OBUFS_MAX 4
#define INBOUND_MAX 256
#define TCP_KEEPALIVE_S 10
#define HELLO_FRAME_BYTES (FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES)
#define AUTH_FRAME_BYTES (FRAME_HEADER_BYTES + 1 + FRAME_PROOF_BYTES)

struct obuf {
    struct obuf *next;
    size_t cap, len;
    size_t fwd; /* bytes of FRAME_KIND_FORWARD frames among the len */
    /* A big entry's bytes, written from its blob (put_frame_ref): len bytes
     * at ref_at, a reference held until written; cap == len, no data. */
    struct tk_blob *ref;
    const uint8_t *ref_at;
    uint8_t data[];
};

/* Entries of at least this many bytes go to the socket from the log's own
 * buffers (a reference on the blob and an iovec of their own), not copied
 * into each follower's frame: packing them was 35-39 % of a leader's loop
 * under 1 MB puts (issue 53 item 1). Below it a copy costs less than the
 * iovec and the reference. */
#define REF_MIN_BYTES (64u << 10)

struct tcp;
struct tcp_peer;

/* CONN_HANDSHAKE waits for the other side's HELLO; CONN_AUTH for the next
 * proof: inbound, the dialer's AUTH; outgoing, the acceptor's verdict. */
enum conn_state { CONN_CONNECTING, CONN_HANDSHAKE, CONN_AUTH, CONN_UP, CONN_CLOSING };

struct tcp_conn {
    struct tcp *t;
    struct tcp_peer *peer; /* outgoing connection of this peer; NULL if inbound */
    struct tcp_conn *next; /* inbound list */
    uv_tcp_t handle;
    uv_timer_t timer;
    uv_connect_t connect_req;
    int handles_open;
    enum conn_state state;
    uint64_t remote_id; /* after the handshake */
    bool pending;       /* inbound, not yet authenticated: counted in n_pending */
    bool tls_hello;     /* inbound TLS: its ClientHello was answered (pending_rank) */
    uint64_t addr_key;  /* inbound: its remote address (conn_addr_key) */
    uint64_t last_rx;   /* loop time of the last read (idle deadline) */
    uint8_t *rbuf;
    size_t rlen, rcap;
    /* Both HELLO bodies of the handshake, proof fields zeroed: every proof
     * covers them (auth.c). */
    uint8_t hello_d[FRAME_HELLO_BYTES];
    uint8_t hello_a[FRAME_HELLO_BYTES];
    uint8_t hello[HELLO_FRAME_BYTES];
    uv_write_t hello_req;
    uint8_t auth[AUTH_FRAME_BYTES];
    uv_write_t auth_req;
    struct codec_dec dec;
    struct codec_snap snap;
    uint64_t snap_started;    /* loop time of the reassembly's first chunk */
    size_t snap_charged;      /* codec__snap_held, as counted in tcp.snap_bytes */
    struct snap_fault *fault; /* faulting in the reassembly's pages ahead */
    const void *fault_blob;   /* the reassembly fault_end is of (compared only) */
    uint64_t fault_end;       /* its bytes faulted in or queued */
    uint64_t fault_done;      /* its bytes faulted in (jobs completed) */
    bool fault_wait;          /* reads stopped until the job in flight ends */
    struct tk_tls *tls;       /* peer TLS: the session; rbuf then holds plaintext */
    uint8_t *tls_buf;         /* peer TLS: ciphertext as read (tls_cap) */
    size_t tls_cap;           /* HS_BUF_BYTES until the handshake ends, then RBUF_BYTES */
    uint64_t rx_ms;           /* loop time of rx_turn's reads */
    size_t rx_turn;           /* bytes read at rx_ms (o.read_turn_bytes) */
    bool read_paused;         /* until the next turn (resume_reads) */
};

/* Faulting in a big snapshot's reassembly ahead of its chunks (snap_fault_ahead). */
struct snap_fault {
    uv_work_t work;
    struct tcp_conn *conn; /* NULL once the connection is freed */
    struct tk_blob *blob;  /* the job's own reference */
    uint64_t from, to;     /* of blob->data */
    atomic_bool started;   /* the pool runs it (else reads never wait for it) */
};

struct wreq {
    uv_write_t req;
    struct tcp_peer *peer;
    struct obuf *bufs;
    size_t bytes;
    uint32_t msgs;
    uv_buf_t iov[WRITE_IOV_MAX];
};

struct tcp_peer {
    struct tcp *t;
    uint64_t id;
    struct sockaddr_storage addr;
    /* A peer named by a host name is resolved again before every dial (a
     * restarted container may come back with a new address). */
    char *host; /* NULL for an IP literal */
    uint16_t port;
    uv_getaddrinfo_t gai; /* in flight while `resolving` */
    bool resolving;
    struct tcp_conn *conn; /* current outgoing connection, or NULL */
    uv_timer_t backoff_timer;
    uint32_t backoff_ms;
    bool up;
    uint64_t last_tx; /* loop time of the last write (pings on idle links) */
    /* The queue: frames not yet handed to uv_write. */
    struct obuf *head, *tail;
    uint64_t queued_bytes; /* in the queue and in the write in flight */
    uint32_t queued_msgs;  /* in the queue only */
    uint64_t fwd_bytes;    /* forward frames in the queue and in flight */
    struct wreq *inflight; /* &wreq while a write is in flight, else NULL */
    struct wreq wreq;
    /* A snapshot under way: its chunks are framed into the queue a few at a
     * time as the queue drains (snap_pump), never the whole snapshot in one
     * turn. type is RAFT_MSG_NONE when there is none; data is referenced. */
    struct raft_message snap;
    uint64_t snap_off; /* bytes of it framed so far */
    bool removed;      /* transport_tcp_remove_peer: never dialed again */
    bool timer_open;   /* backoff_timer not yet closed (removed: closing) */
    uint32_t n_conns;  /* tcp_conns naming it (c->peer), closed or not, not freed */
};

struct tcp {
    struct transport base;
    uv_loop_t *loop;
    struct transport_tcp_options o;
    uv_tcp_t listener;
    bool listening;
    uv_prepare_t prepare;
    uv_check_t check;
    bool flush_armed;
    size_t n_paused; /* connections whose reads wait for the next turn */
    struct tcp_peer **peers;
    size_t n_peers;
    /* Removed peers still named by something closing: their backoff timer
     * (closed at the removal), a connection not yet freed, a write or a
     * name lookup in flight. Each is freed (peer_release) as soon as the
     * last of these ends, a loop turn or so after its removal: this holds
     * the removals of the last few turns, never every removal seen. */
    struct tcp_peer **releasing;
    size_t n_releasing;
    struct tcp_conn *inbound;
    size_t n_inbound;
    size_t n_pending;         /* inbound connections not yet authenticated */
    uint32_t n_accepted_turn; /* accepts since the last prepare (ACCEPT_TURN_MAX) */
    bool accept_waiting;      /* a connection left in the listen queue until then */
    uint64_t snap_bytes;      /* reassembly buffers of every connection */
    uint8_t *token;           /* the cluster token, or NULL */
    size_t token_len;
    uv_timer_t tick; /* idle deadlines, snapshot deadlines, pings */
    struct obuf *free_obufs;
    size_t n_free_obufs;
    struct obuf *big_obufs; /* over OBUF_BYTES, up to BUF_KEEP_BYTES each */
    size_t n_big_obufs;
    struct codec_enc enc;
    struct tk_prng prng;
    int handles_open;
    bool closing;
    transport_close_cb *close_cb;
    void *close_data;
};

static void conn_close(struct tcp_conn *c);
static void peer_dial(struct tcp_peer *p);
static void peer_flush(struct tcp_peer *p);
static void handle_closed(uv_handle_t *h);
static void tcp_handle_gone(struct tcp *t);

/* ---- Output buffers ---- */

static struct obuf *obuf_get(struct tcp *t, size_t need)
{
    for (struct obuf **pb = &t->big_obufs; need > OBUF_BYTES && *pb != NULL;
         pb = &(*pb)->next) {
        struct obuf *b = *pb;
        if (b->cap < need)
            continue;
        *pb = b->next;
        t->n_big_obufs--;
        b->next = NULL;
        b->len = 0;
        b->fwd = 0;
        b->ref = NULL;
        return b;
    }
    if (need <= OBUF_BYTES && t->free_obufs != NULL) {
        struct obuf *b = t->free_obufs;
        t->free_obufs = b->next;
        t->n_free_obufs--;
        b->next = NULL;
        b->len = 0;
        b->fwd = 0;
        b->ref = NULL;
        return b;
    }
    size_t cap = need > OBUF_BYTES ? need : OBUF_BYTES;
    struct obuf *b = tk_malloc(sizeof(*b) + cap);
    b->next = NULL;
    b->cap = cap;
    b->len = 0;
    b->fwd = 0;
    b->ref = NULL;
    return b;
}

static void obuf_put(struct tcp *t, struct obuf *b)
{
    if (b->ref != NULL) {
        tk_blob_unref(b->ref);
        tk_free(b);
    } else if (b->cap == OBUF_BYTES && t->n_free_obufs < OBUF_FREE_MAX && !t->closing) {
        b->next = t->free_obufs;
        t->free_obufs = b;
        t->n_free_obufs++;
    } else if (b->cap > OBUF_BYTES && b->cap <= BUF_KEEP_BYTES &&
               t->n_big_obufs < BIG_OBUFS_MAX && !t->closing) {
        b->next = t->big_obufs;
        t->big_obufs = b;
        t->n_big_obufs++;
    } else {
        tk_free(b);
    }
}

static void obuf_free_list(struct obuf *b)
{
    while (b != NULL) {
        struct obuf *next = b->next;
        tk_blob_unref(b->ref);
        tk_free(b);
        b = next;
    }
}

static void obuf_put_list(struct tcp *t, struct obuf *b)
{
    while (b != NULL) {
        struct obuf *next = b->next;
        obuf_put(t, b);
        b = next;
    }
}

/* Gives back the buffers of `b` that left p's queue (written, failed or
 * dropped), and the forward bytes they held. */
static void peer_put_list(struct tcp_peer *p, struct obuf *b)
{
    for (struct obuf *x = b; x != NULL; x = x->next)
        p->fwd_bytes -= x->fwd;
    obuf_put_list(p->t, b);
}

/* Room for `need` contiguous bytes at the queue's tail. */
static uint8_t *peer_reserve(struct tcp_peer *p, size_t need)
{
    struct obuf *b = p->tail;
    if (b == NULL || b->cap - b->len < need) {
        b = obuf_get(p->t, need);
        if (p->tail != NULL)
            p->tail->next = b;
        else
            p->head = b;
        p->tail = b;
    }
    uint8_t *out = b->data + b->len;
    b->len += need;
    return out;
}

static bool snap_streaming(const struct tcp_peer *p)
{
    return p->snap.type == RAFT_MSG_SNAPSHOT;
}

static void snap_stream_stop(struct tcp_peer *p)
{
    if (!snap_streaming(p))
        return;
    tk_blob_unref(p->snap.u.snapshot.data);
    memset(&p->snap, 0, sizeof(p->snap));
    p->snap_off = 0;
}

/* Drops the queue and the snapshot under way (a lost connection: the core
 * sends the snapshot again after its timeout). */
static void peer_drop_queue(struct tcp_peer *p)
{
    if (snap_streaming(p)) {
        snap_stream_stop(p);
        p->t->base.stats.send_dropped++;
    }
    struct obuf *b = p->head;
    size_t bytes = 0;
    for (struct obuf *x = b; x != NULL; x = x->next)
        bytes += x->len;
    peer_put_list(p, b);
    p->head = p->tail = NULL;
    p->queued_bytes -= bytes;
    p->t->base.stats.send_dropped += p->queued_msgs;
    p->queued_msgs = 0;
}

/* ---- Flushing ---- */

static void flush_all(struct tcp *t)
{
    for (size_t i = 0; i < t->n_peers; i++)
        peer_flush(t->peers[i]);
    if (t->flush_armed && t->n_paused == 0 && !t->accept_waiting) { /* else the prepare
                                                                        resumes them */
        uv_prepare_stop(&t->prepare);
        uv_check_stop(&t->check);
        t->flush_armed = false;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);

static void resume_conn(struct tcp_conn *c)
{
    if (c == NULL || !c->read_paused)
        return;
    c->read_paused = false;
    if (c->state != CONN_CLOSING && !c->fault_wait)
        uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
}

/* The next turn: the connections paused by read_turn_bytes read again. */
static void resume_reads(struct tcp *t)
{
    if (t->n_paused == 0)
        return;
    t->n_paused = 0;
    for (size_t i = 0; i < t->n_peers; i++)
        resume_conn(t->peers[i]->conn);
    for (struct tcp_conn *c = t->inbound; c != NULL; c = c->next)
        resume_conn(c);
}

static void accept_one(struct tcp *t);

/* The next turn: a new budget of accepts, and the connection left waiting
 * (its uv_accept starts libuv's watch of the listener again). */
static void resume_accepts(struct tcp *t)
{
    t->n_accepted_turn = 0;
    if (t->accept_waiting) {
        t->accept_waiting = false;
        accept_one(t);
    }
}

static void on_prepare(uv_prepare_t *h)
{
    struct tcp *t = h->data;
    if (!t->closing) {
        resume_accepts(t);
        resume_reads(t);
    }
    flush_all(t);
}

static void on_check(uv_check_t *h)
{
    flush_all(h->data);
}

static void arm_flush(struct tcp *t)
{
    if (!t->flush_armed) {
        uv_prepare_start(&t->prepare, on_prepare);
        uv_check_start(&t->check, on_check);
        t->flush_armed = true;
    }
}

static void peer_lost(struct tcp_peer *p, const char *why);
static void peer_release(struct tcp_peer *p);

static void on_write(uv_write_t *req, int status)
{
    struct wreq *w = req->data;
    struct tcp_peer *p = w->peer;
    struct tcp *t = p->t;
    p->queued_bytes -= w->bytes;
    peer_put_list(p, w->bufs);
    if (p->inflight == w)
        p->inflight = NULL;
    if (status == 0) {
        t->base.stats.bytes_sent += w->bytes;
    } else {
        t->base.stats.send_dropped += w->msgs;
        if (status != UV_ECANCELED && !t->closing && p->conn != NULL &&
            (uv_stream_t *)&p->conn->handle == req->handle)
            peer_lost(p, uv_strerror(status));
    }
    if (!t->closing && (p->head != NULL || snap_streaming(p)))
        peer_flush(p);
    peer_release(p);
}

/* Tries w's buffers at once (uv_try_write: plaintext, nothing queued in
 * libuv). Returns 1 when the socket took them all (no write request, so no
 * callback and no change to the poll set: libuv 1.44 re-arms the watcher
 * with an epoll_ctl after every uv_write), 0 when the rest is to be written
 * by uv_write (w->iov[0..*n) trimmed to it), or a libuv error. */
static int peer_try_write(struct tcp_peer *p, struct wreq *w, unsigned *n)
{
    uv_stream_t *st = (uv_stream_t *)&p->conn->handle;
    if (p->conn->tls != NULL || uv_stream_get_write_queue_size(st) > 0)
        return 0;
    int k = uv_try_write(st, w->iov, *n);
    if (k == UV_EAGAIN)
        return 0;
    if (k < 0)
        return k;
    if ((size_t)k == w->bytes)
        return 1;
    size_t done = (size_t)k;
    unsigned i = 0;
    while (done >= w->iov[i].len) {
        done -= w->iov[i].len;
        i++;
    }
    w->iov[i].base += done;
    w->iov[i].len -= (unsigned)done;
    memmove(w->iov, w->iov + i, (*n - i) * sizeof(w->iov[0]));
    *n -= i;
    return 0;
}

static void snap_pump(struct tcp_peer *p);

static void peer_flush(struct tcp_peer *p)
{
    if (!p->up || p->inflight != NULL)
        return;
    snap_pump(p);
    if (p->head == NULL)
        return;
    struct wreq *w = &p->wreq;
    w->req.data = w;
    w->peer = p;
    w->bufs = p->head;
    w->bytes = 0;
    unsigned n = 0;
    struct obuf *b = p->head, *last = NULL;
    while (b != NULL && n < WRITE_IOV_MAX) {
        w->iov[n++] =
            uv_buf_init((char *)(b->ref != NULL ? b->ref_at : b->data), (unsigned)b->len);
        w->bytes += b->len;
        last = b;
        b = b->next;
    }
    last->next = NULL;
    p->head = b;
    if (b == NULL)
        p->tail = NULL;
    /* Messages are counted per queue, not per buffer: charge them all to this
     * write if it takes the whole queue, else none (they go with the rest). */
    w->msgs = b == NULL ? p->queued_msgs : 0;
    if (b == NULL)
        p->queued_msgs = 0;
    p->inflight = w;
    p->last_tx = uv_now(p->t->loop);
    p->t->base.stats.writes++;
    uv_stream_t *st = (uv_stream_t *)&p->conn->handle;
    /* The whole queue at once, if the socket takes it; a longer queue, or a
     * snapshot under way, goes by uv_write: one batch per completion, whose
     * callback frames the next chunks, as the loop's turns allow. */
    int rc = b == NULL && !snap_streaming(p) ? peer_try_write(p, w, &n) : 0;
    if (rc == 1) { /* all out: what on_write does, here */
        p->inflight = NULL;
        p->queued_bytes -= w->bytes;
        peer_put_list(p, w->bufs);
        p->t->base.stats.bytes_sent += w->bytes;
        return;
    }
    if (rc == 0)
        rc = p->conn->tls != NULL
                 ? tk_tls_uv_write(p->conn->tls, st, w->iov, n, &w->req, on_write)
                 : uv_write(&w->req, st, w->iov, n, on_write);
    if (rc != 0) {
        p->inflight = NULL;
        p->queued_bytes -= w->bytes;
        peer_put_list(p, w->bufs);
        p->t->base.stats.send_dropped += w->msgs;
        peer_lost(p, uv_strerror(rc));
    }
}

/* ---- Sending ---- */

static struct tcp_peer *peer_find(struct tcp *t, uint64_t id)
{
    for (size_t i = 0; i < t->n_peers; i++)
        if (t->peers[i]->id == id)
            return t->peers[i];
    return NULL;
}

static bool queue_admits(const struct tcp_peer *p, uint64_t need)
{
    return p->queued_bytes == 0 || p->queued_bytes + need <= p->t->o.send_queue_bytes;
}

/* Forwarded frames may fill only a share of the queue (one frame, however
 * large, when none is queued), so that Raft messages, heartbeats and votes
 * first, always find room and never wait behind more than that share. */
static bool forward_admits(const struct tcp_peer *p, uint64_t need)
{
    uint64_t cap = p->t->o.send_queue_bytes / FWD_QUEUE_SHARE;
    return queue_admits(p, need) && (p->fwd_bytes == 0 || p->fwd_bytes + need <= cap);
}

/* Frames the prepared message at the queue's tail: room for its size bound is
 * reserved, and what packing does not use is given back (it is the tail). */
static void put_frame(struct tcp_peer *p, size_t bound)
{
    struct tcp *t = p->t;
    uint8_t *f = peer_reserve(p, FRAME_HEADER_BYTES + 1 + bound);
    f[FRAME_HEADER_BYTES] = FRAME_KIND_RAFT;
    size_t size = codec__enc_pack(&t->enc, f + FRAME_HEADER_BYTES + 1);
    TK_ASSERT(size <= bound);
    p->tail->len -= bound - size;
    frame__seal(f, f + FRAME_HEADER_BYTES, (uint32_t)(1 + size));
    p->queued_bytes += FRAME_HEADER_BYTES + 1 + size;
}

/* put_frame_ref's ProtobufCBuffer: what protobuf-c appends goes to the
 * queue's tail, copied, except a big entry's bytes, which go by reference;
 * the frame's CRC is computed over the pieces as they come. */
struct ref_out {
    ProtobufCBuffer base;
    struct tcp_peer *p;
    const struct raft_msg_append *a;
    uint32_t crc;
    size_t len;
    uint64_t by_ref;
};

/* The entry whose blob `data` is (protobuf-c appends a bytes field's contents
 * in one call, from the blob itself), or NULL. */
static struct tk_blob *ref_blob(const struct raft_msg_append *a, const uint8_t *data,
                                size_t len)
{
    for (uint32_t i = 0; i < a->n_entries; i++) {
        struct tk_blob *b = a->entries[i].data;
        if (b != NULL && b->data == data && b->len == len)
            return b;
    }
    return NULL;
}

static void ref_append(ProtobufCBuffer *buf, size_t len, const uint8_t *data)
{
    struct ref_out *o = (struct ref_out *)buf;
    o->crc = tk_crc32c(o->crc, data, len);
    o->len += len;
    struct tk_blob *blob = len >= REF_MIN_BYTES ? ref_blob(o->a, data, len) : NULL;
    if (blob == NULL) {
        memcpy(peer_reserve(o->p, len), data, len);
        return;
    }
    struct tcp_peer *p = o->p;
    struct obuf *b = tk_malloc(sizeof(*b));
    b->next = NULL;
    b->cap = b->len = len; /* full: peer_reserve starts a new buffer after it */
    b->fwd = 0;
    b->ref = tk_blob_ref(blob);
    b->ref_at = data;
    if (p->tail != NULL)
        p->tail->next = b;
    else
        p->head = b;
    p->tail = b;
    o->by_ref += len;
}

/* As put_frame, for an append carrying an entry of REF_MIN_BYTES or more:
 * the same bytes, its entries' contents sent from their blobs. */
static void put_frame_ref(struct tcp_peer *p, const struct raft_msg_append *a)
{
    struct tcp *t = p->t;
    uint8_t *hdr = peer_reserve(p, FRAME_HEADER_BYTES + 1);
    hdr[FRAME_HEADER_BYTES] = FRAME_KIND_RAFT;
    struct ref_out o = {.base = {.append = ref_append}, .p = p, .a = a, .len = 1};
    o.crc = tk_crc32c(0, hdr + FRAME_HEADER_BYTES, 1);
    codec__enc_pack_to(&t->enc, &o.base);
    frame__seal_crc(hdr, (uint32_t)o.len, o.crc);
    p->queued_bytes += FRAME_HEADER_BYTES + o.len;
    t->base.stats.bytes_by_ref += o.by_ref;
}

/* Whether m is an append worth sending by reference. */
static bool has_big_entry(const struct raft_message *m)
{
    if (m->type != RAFT_MSG_APPEND)
        return false;
    for (uint32_t i = 0; i < m->u.append.n_entries; i++)
        if (m->u.append.entries[i].data != NULL &&
            m->u.append.entries[i].data->len >= REF_MIN_BYTES)
            return true;
    return false;
}

/* Frames the next chunks of the snapshot under way while the peer's queue
 * holds less than SNAP_PUMP_CHUNKS chunks: at most that many per call (a
 * send, a flush, a write's completion), so no loop turn copies more. */
static void snap_pump(struct tcp_peer *p)
{
    struct tcp *t = p->t;
    size_t chunk = t->o.snapshot_chunk;
    while (snap_streaming(p) && p->queued_bytes < (uint64_t)SNAP_PUMP_CHUNKS * chunk) {
        const struct tk_blob *data = p->snap.u.snapshot.data;
        size_t total = data != NULL ? data->len : 0;
        size_t n = total - p->snap_off < chunk ? total - p->snap_off : chunk;
        size_t size;
        if (codec__enc_prepare(&t->enc, &p->snap, p->snap_off, n, &size) != 0) {
            snap_stream_stop(p); /* not reached: send_snapshot checked it */
            t->base.stats.send_dropped++;
            break;
        }
        put_frame(p, size);
        p->snap_off += n;
        if (p->snap_off >= total) {
            p->queued_msgs++; /* the whole snapshot is one message */
            snap_stream_stop(p);
        }
    }
}

/* A snapshot goes as a stream of chunks framed as the queue drains. The same
 * snapshot again while it streams (the core's retry) is already under way;
 * another one replaces it (the receiver restarts at its offset 0). */
static int send_snapshot(struct tcp_peer *p, const struct raft_message *m)
{
    struct tcp *t = p->t;
    size_t total = m->u.snapshot.data ? m->u.snapshot.data->len : 0;
    if (total > t->o.snapshot_max)
        return TK_ETOOBIG;
    if (snap_streaming(p)) {
        const struct raft_message *cur = &p->snap;
        if (cur->term == m->term && cur->u.snapshot.data == m->u.snapshot.data &&
            cur->u.snapshot.meta.index == m->u.snapshot.meta.index)
            return 0;
        snap_stream_stop(p);
    }
    size_t first = total < t->o.snapshot_chunk ? total : t->o.snapshot_chunk;
    size_t size;
    int rc = codec__enc_prepare(&t->enc, m, 0, first, &size);
    if (rc != 0)
        return rc;
    TK_ASSERT(1 + size <= t->o.frame_max);
    if (!queue_admits(p, FRAME_HEADER_BYTES + 1 + size)) {
        t->base.stats.send_busy++;
        return TK_EBUSY;
    }
    p->snap = *m;
    p->snap.u.snapshot.offset = 0;
    p->snap.u.snapshot.data = m->u.snapshot.data ? tk_blob_ref(m->u.snapshot.data) : NULL;
    p->snap_off = 0;
    snap_pump(p);
    return 0;
}

static int tcp_send(struct transport *base, const struct raft_message *m)
{
    struct tcp *t = (struct tcp *)base;
    if (t->closing)
        return TK_ECLOSED;
    if (m->type == RAFT_MSG_NONE || m->type >= RAFT_MSG_TYPE_COUNT ||
        m->to == RAFT_NONE || m->to == base->id || m->from != base->id)
        return TK_EINVAL;
    struct tcp_peer *p = peer_find(t, m->to);
    if (p == NULL)
        return TK_ENOTFOUND;
    int rc;
    if (m->type == RAFT_MSG_SNAPSHOT) {
        rc = send_snapshot(p, m);
    } else {
        size_t size;
        rc = codec__enc_prepare(&t->enc, m, 0, 0, &size);
        if (rc != 0)
            return rc;
        if (size >= t->o.frame_max && codec__enc_size(&t->enc) >= t->o.frame_max)
            return TK_ETOOBIG;
        if (!queue_admits(p, FRAME_HEADER_BYTES + 1 + size)) {
            base->stats.send_busy++;
            return TK_EBUSY;
        }
        if (has_big_entry(m))
            put_frame_ref(p, &m->u.append);
        else
            put_frame(p, size);
        p->queued_msgs++;
    }
    if (rc != 0)
        return rc;
    base->stats.msgs_sent++;
    if (p->up)
        arm_flush(t);
    return 0;
}

static int tcp_send_forward(struct transport *base, uint64_t to, const uint8_t *buf,
                            size_t len)
{
    struct tcp *t = (struct tcp *)base;
    if (t->closing)
        return TK_ECLOSED;
    if (to == RAFT_NONE || to == base->id)
        return TK_EINVAL;
    struct tcp_peer *p = peer_find(t, to);
    if (p == NULL)
        return TK_ENOTFOUND;
    if (len >= t->o.frame_max)
        return TK_ETOOBIG;
    size_t frame = FRAME_HEADER_BYTES + 1 + len;
    if (!forward_admits(p, frame)) {
        base->stats.send_busy++;
        return TK_EBUSY;
    }
    uint8_t *f = peer_reserve(p, frame);
    f[FRAME_HEADER_BYTES] = FRAME_KIND_FORWARD;
    if (len != 0)
        memcpy(f + FRAME_HEADER_BYTES + 1, buf, len);
    frame__seal(f, f + FRAME_HEADER_BYTES, (uint32_t)(1 + len));
    p->tail->fwd += frame; /* peer_reserve put the frame in the tail */
    p->fwd_bytes += frame;
    p->queued_bytes += frame;
    p->queued_msgs++;
    base->stats.fwd_sent++;
    if (p->up)
        arm_flush(t);
    return 0;
}

/* ---- Connections ---- */

static void conn_bad(struct tcp_conn *c, const char *why)
{
    struct tcp *t = c->t;
    t->base.stats.conns_bad++;
    char kv[160];
    snprintf(kv, sizeof(kv), "peer=%llu inbound=%d reason=\"%s\"",
             (unsigned long long)c->remote_id, c->peer == NULL, why);
    if (TK_LOG_WARN >= tk_log_get_level())
        tk_logf(TK_LOG_WARN, t->base.id, 0, kv, "closing connection: bad input");
    if (c->peer != NULL)
        peer_lost(c->peer, why);
    else
        conn_close(c);
}

static void conn_closed(uv_handle_t *h)
{
    struct tcp_conn *c = h->data;
    struct tcp *t = c->t;
    if (--c->handles_open == 0) {
        if (c->fault != NULL)
            c->fault->conn = NULL; /* it finishes on its own */
        if (c->peer != NULL) {
            TK_ASSERT(c->peer->n_conns > 0);
            c->peer->n_conns--;
            peer_release(c->peer);
        }
        codec__dec_destroy(&c->dec);
        codec__snap_destroy(&c->snap);
        tk_free(c->rbuf);
        tk_tls_free(c->tls);
        tk_free(c->tls_buf);
        tk_free(c);
    }
    tcp_handle_gone(t);
}

/* Closes `c` (idempotent). An inbound connection leaves the inbound list; an
 * outgoing one is detached from its peer by the caller (peer_lost). */
static void conn_close(struct tcp_conn *c)
{
    if (c->state == CONN_CLOSING)
        return;
    c->state = CONN_CLOSING;
    struct tcp *t = c->t;
    if (c->pending) {
        c->pending = false;
        t->n_pending--;
    }
    t->snap_bytes -= c->snap_charged;
    c->snap_charged = 0;
    if (c->peer == NULL) {
        struct tcp_conn **pp = &t->inbound;
        while (*pp != c)
            pp = &(*pp)->next;
        *pp = c->next;
        t->n_inbound--;
    }
    uv_close((uv_handle_t *)&c->handle, conn_closed);
    uv_close((uv_handle_t *)&c->timer, conn_closed);
}

static void on_conn_timeout(uv_timer_t *timer)
{
    struct tcp_conn *c = timer->data;
    if (c->state == CONN_CONNECTING) {
        peer_lost(c->peer, "connect timed out"); /* not bad input */
        return;
    }
    conn_bad(c, c->state == CONN_UP ? "frame not completed in time"
                                    : "handshake not completed in time");
}

static struct tcp_conn *conn_new(struct tcp *t, struct tcp_peer *peer)
{
    struct tcp_conn *c = tk_calloc(1, sizeof(*c));
    c->t = t;
    c->peer = peer;
    if (peer != NULL)
        peer->n_conns++;
    TK_ASSERT(uv_tcp_init(t->loop, &c->handle) == 0);
    TK_ASSERT(uv_timer_init(t->loop, &c->timer) == 0);
    c->handle.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    t->handles_open += 2;
    codec__dec_init(&c->dec);
    codec__snap_init(&c->snap, t->o.snapshot_max);
    return c;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct tcp_conn *c = h->data;
    size_t want = c->state == CONN_UP ? RBUF_BYTES : HS_BUF_BYTES;
    if (c->tls != NULL) {
        if (c->tls_cap < want) {
            tk_free(c->tls_buf);
            c->tls_buf = tk_malloc(want);
            c->tls_cap = want;
        }
        *buf = uv_buf_init((char *)c->tls_buf, (unsigned)c->tls_cap); /* ciphertext */
        return;
    }
    if (c->rlen >= FRAME_HEADER_BYTES && c->state == CONN_UP) {
        /* Make room for the whole frame being read (its length was checked
         * against frame_max when the header arrived). */
        uint32_t n = (uint32_t)c->rbuf[0] | (uint32_t)c->rbuf[1] << 8 |
                     (uint32_t)c->rbuf[2] << 16 | (uint32_t)c->rbuf[3] << 24;
        size_t frame = FRAME_HEADER_BYTES + (size_t)n;
        if (frame > c->rlen && frame - c->rlen > want)
            want = frame - c->rlen;
    }
    if (c->rcap - c->rlen < want) {
        c->rcap = c->rlen + want;
        c->rbuf = tk_realloc(c->rbuf, c->rcap);
    }
    *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void on_hello_written(uv_write_t *req, int status)
{
    (void)req;
    (void)status; /* a failure shows up as a read error or the timeout */
}

/* The proof of `label` over this connection's two HELLO bodies into out;
 * zeros without a token. Returns 0 or TK_EIO. */
static int conn_proof(struct tcp_conn *c, uint8_t label, uint8_t *out)
{
    struct tcp *t = c->t;
    memset(out, 0, FRAME_PROOF_BYTES);
    if (t->token == NULL)
        return 0;
    return auth__proof(t->token, t->token_len, label, c->hello_d, c->hello_a, out);
}

/* Checks the other side's proof (`label` is theirs); true without a token. */
static bool conn_proof_ok(struct tcp_conn *c, uint8_t label, const uint8_t *proof)
{
    uint8_t want[FRAME_PROOF_BYTES];
    if (conn_proof(c, label, want) != 0)
        return false;
    return c->t->token == NULL || auth__equal(want, proof, FRAME_PROOF_BYTES);
}

static void conn_write(struct tcp_conn *c, uv_write_t *req, uint8_t *buf, size_t n)
{
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)n);
    int rc = c->tls != NULL
                 ? tk_tls_uv_write(c->tls, (uv_stream_t *)&c->handle, &b, 1, req,
                                   on_hello_written)
                 : uv_write(req, (uv_stream_t *)&c->handle, &b, 1, on_hello_written);
    if (rc != 0)
        TK_LOG(TK_LOG_WARN, c->t->base.id, 0, "handshake write failed: %s",
               uv_strerror(rc));
}

/* A proof frame (AUTH, WELCOME or REFUSE) of `label` to the other side.
 * Returns 0 or TK_EIO. */
static int send_proof(struct tcp_conn *c, uint8_t kind, uint8_t label)
{
    uint8_t proof[FRAME_PROOF_BYTES];
    if (conn_proof(c, label, proof) != 0)
        return TK_EIO;
    conn_write(c, &c->auth_req, c->auth, frame__proof_write(c->auth, kind, proof));
    return 0;
}

/* Our HELLO: a fresh nonce, and (acceptor) our proof over both HELLOs. The
 * body is kept (hello_d or hello_a) for the proofs that follow. Returns 0 or
 * TK_EIO. */
static int send_hello(struct tcp_conn *c)
{
    struct tcp *t = c->t;
    struct frame_hello h = {.cluster_id = t->o.cluster_id, .node_id = t->base.id};
    h.flags = t->token != NULL ? FRAME_HELLO_F_TOKEN : 0;
    memcpy(h.incarnation, t->o.incarnation, FRAME_INC_BYTES);
    if (auth__nonce(h.nonce) != 0)
        return TK_EIO;
    size_t n = frame__hello_write(c->hello, &h);
    uint8_t *body = c->hello + FRAME_HEADER_BYTES + 1;
    bool dialer = c->peer != NULL;
    memcpy(dialer ? c->hello_d : c->hello_a, body, FRAME_HELLO_BYTES);
    if (!dialer) {
        if (conn_proof(c, 'A', h.proof) != 0)
            return TK_EIO;
        n = frame__hello_write(c->hello, &h);
    }
    conn_write(c, &c->hello_req, c->hello, n);
    return 0;
}

/* Checks a HELLO's form and what can be checked without acting on it: the
 * protocol, the cluster, the ids, membership (a lookup), the certificate's
 * name and the token flag. Keeps the body (its proof field zeroed) as the
 * other side's. Returns NULL or the reason it is refused. */
static const char *hello_check(struct tcp_conn *c, const uint8_t *body, size_t len,
                               struct frame_hello *h)
{
    struct tcp *t = c->t;
    if (frame__hello_decode(body, len, h) != 0)
        return "hello of the wrong size (a peer of another protocol version?)";
    if (h->magic != FRAME_HELLO_MAGIC)
        return "hello with a wrong magic";
    if (h->version != FRAME_HELLO_VERSION)
        return "unsupported protocol version";
    if ((h->flags & ~FRAME_HELLO_F_KNOWN) != 0)
        return "hello with unknown flags";
    if (h->cluster_id != t->o.cluster_id)
        return "cluster id mismatch";
    if (h->node_id == RAFT_NONE || h->node_id == t->base.id)
        return "bad node id";
    if (c->peer != NULL && h->node_id != c->peer->id)
        return "node id mismatch: a different node answers at this address";
    uint8_t *keep = c->peer != NULL ? c->hello_a : c->hello_d;
    memcpy(keep, body, FRAME_HELLO_BYTES);
    memset(keep + FRAME_HELLO_PROOF_OFF, 0, FRAME_PROOF_BYTES);
    const char *why = NULL;
    char name[32];
    snprintf(name, sizeof(name), "node-%llu", (unsigned long long)h->node_id);
    if (c->peer == NULL && peer_find(t, h->node_id) == NULL &&
        (t->base.cbs.member == NULL ||
         !t->base.cbs.member(&t->base, h->node_id, t->base.cbs.data)))
        why = "the node id is not a member";
    else if (c->tls != NULL && !tk_tls_peer_has_name(c->tls, name))
        why = "the peer's certificate does not name the node id it claims";
    else if (((h->flags & FRAME_HELLO_F_TOKEN) != 0) != (t->token != NULL))
        why = t->token != NULL ? "the peer has no cluster token"
                               : "the peer wants a cluster token and we have none";
    if (why != NULL) {
        t->base.stats.auth_failed++;
        return why;
    }
    c->remote_id = h->node_id;
    return NULL;
}

/* Asks the node whether the authenticated peer's data directory is the one
 * the cluster knows for its id. */
static bool incarnation_ok(struct tcp_conn *c, const uint8_t *hello)
{
    struct tcp *t = c->t;
    struct frame_hello h;
    if (t->base.cbs.incarnation == NULL ||
        frame__hello_decode(hello, FRAME_HELLO_BYTES, &h) != 0)
        return true;
    return t->base.cbs.incarnation(&t->base, h.node_id, h.incarnation, t->base.cbs.data);
}

static void peer_up(struct tcp_peer *p)
{
    struct tcp *t = p->t;
    p->up = true;
    p->backoff_ms = t->o.backoff_min_ms;
    p->last_tx = uv_now(t->loop);
    t->base.stats.conns_dialed++;
    if (t->base.cbs.peer != NULL)
        t->base.cbs.peer(&t->base, p->id, true, t->base.cbs.data);
    if (!t->closing && p->head != NULL)
        arm_flush(t);
}

/* An inbound connection authenticated: it replaces an older one of its id. */
static void inbound_up(struct tcp_conn *c)
{
    struct tcp *t = c->t;
    for (struct tcp_conn *o = t->inbound; o != NULL; o = o->next) {
        if (o != c && o->state == CONN_UP && o->remote_id == c->remote_id) {
            TK_LOG(TK_LOG_INFO, t->base.id, 0,
                   "a new connection from %llu replaces the old one",
                   (unsigned long long)c->remote_id);
            conn_close(o);
            break; /* there is at most one */
        }
    }
    c->pending = false;
    t->n_pending--;
    c->state = CONN_UP;
    c->last_rx = uv_now(t->loop);
    uv_timer_stop(&c->timer);
    t->base.stats.conns_accepted++;
}

/* Acceptor: the dialer's AUTH. Once its proof checks, the node is asked
 * about the dialer's data directory, and the verdict goes back with a proof
 * of its own: WELCOME, or REFUSE and close. */
static const char *accept_auth(struct tcp_conn *c, uint8_t kind, const uint8_t *body,
                               size_t len)
{
    struct tcp *t = c->t;
    if (kind != FRAME_KIND_AUTH || len != FRAME_PROOF_BYTES)
        return "expected the dialer's proof";
    if (!conn_proof_ok(c, 'D', body)) {
        t->base.stats.auth_failed++;
        return "wrong cluster token proof from the dialer";
    }
    if (!incarnation_ok(c, c->hello_d)) {
        t->base.stats.auth_failed++;
        /* Its AUTH was the last thing it sent before our verdict: nothing is
         * unread, so the close after the REFUSE sends no reset. */
        (void)send_proof(c, FRAME_KIND_REFUSE, 'R');
        return "the node's data directory is not the one this cluster knows for its id "
               "(an amnesiac: remove it and add it as a new member)";
    }
    if (send_proof(c, FRAME_KIND_WELCOME, 'W') != 0)
        return "cannot make a proof";
    inbound_up(c);
    return NULL;
}

/* Dialer: the acceptor's verdict. A REFUSE is acted on only when something
 * authenticates it: its proof (with a token) or peer TLS. */
static const char *dial_verdict(struct tcp_conn *c, uint8_t kind, const uint8_t *body,
                                size_t len)
{
    struct tcp *t = c->t;
    if ((kind != FRAME_KIND_WELCOME && kind != FRAME_KIND_REFUSE) ||
        len != FRAME_PROOF_BYTES)
        return "expected the acceptor's verdict";
    bool refused = kind == FRAME_KIND_REFUSE;
    if (!conn_proof_ok(c, refused ? 'R' : 'W', body)) {
        t->base.stats.auth_failed++;
        return refused ? "a refusal with a wrong proof (forged?): ignored"
                       : "wrong cluster token proof in the acceptor's welcome";
    }
    if (refused) {
        t->base.stats.auth_failed++;
        if (t->token == NULL && c->tls == NULL)
            return "the peer says it refuses this node's data directory, but nothing "
                   "authenticates it (no cluster token, no peer TLS): ignored";
        if (t->base.cbs.refused != NULL)
            t->base.cbs.refused(&t->base, c->remote_id, t->base.cbs.data);
        return "the peer refused this node's data directory (incarnation)";
    }
    c->state = CONN_UP;
    uv_timer_stop(&c->timer);
    peer_up(c->peer);
    return NULL;
}

/* A handshake frame. Returns NULL, or the reason to close. */
static const char *conn_handshake(struct tcp_conn *c, uint8_t kind, const uint8_t *body,
                                  size_t len)
{
    struct tcp *t = c->t;
    if (c->state == CONN_AUTH)
        return c->peer == NULL ? accept_auth(c, kind, body, len)
                               : dial_verdict(c, kind, body, len);
    if (kind != FRAME_KIND_HELLO)
        return "first frame is not a hello";
    struct frame_hello h;
    const char *why = hello_check(c, body, len, &h);
    if (why != NULL)
        return why;
    if (c->peer == NULL) {
        if (send_hello(c) != 0)
            return "cannot make a nonce or a proof";
        c->state = CONN_AUTH;
        return NULL;
    }
    /* Dialer: the acceptor's proof first; only then anything it said. */
    if (!conn_proof_ok(c, 'A', h.proof)) {
        t->base.stats.auth_failed++;
        return "wrong cluster token proof from the acceptor";
    }
    if (!incarnation_ok(c, c->hello_a)) {
        t->base.stats.auth_failed++;
        return "the node's data directory is not the one this cluster knows for its id "
               "(an amnesiac: remove it and add it as a new member)";
    }
    /* The AUTH goes first: uv_write keeps the order of writes on a stream. */
    if (send_proof(c, FRAME_KIND_AUTH, 'D') != 0)
        return "cannot make a proof";
    c->state = CONN_AUTH; /* waiting for the verdict */
    return NULL;
}

static void snap_recharge(struct tcp_conn *c)
{
    uint64_t held = codec__snap_held(&c->snap);
    c->t->snap_bytes = c->t->snap_bytes - c->snap_charged + held;
    c->snap_charged = held;
}

/* Drops an unfinished reassembly and its buffer. */
static void snap_drop(struct tcp_conn *c, const char *why)
{
    struct tcp *t = c->t;
    t->base.stats.snapshots_dropped++;
    TK_LOG(TK_LOG_WARN, t->base.id, 0, "snapshot from %llu dropped: %s",
           (unsigned long long)c->remote_id, why);
    codec__snap_destroy(&c->snap);
    codec__snap_init(&c->snap, t->o.snapshot_max);
    snap_recharge(c);
}

/* A big snapshot's mapping (codec.c, snap_blob) is faulted in on the thread
 * pool, up to SNAP_AHEAD bytes ahead of the chunks received, so that the loop
 * copies into pages already there: each first touch of a huge page zeroes
 * 2 MiB, and a follower's loop sat in that (folio_zero_user) up to 129 ms of
 * a turn while a 1.6 GB snapshot came in at 10M keys. At most SNAP_AHEAD
 * bytes more than received per reassembly (not charged to snapshot_total_max:
 * a bounded, per-connection extra). */
#define SNAP_AHEAD (32u << 20)
#define SNAP_FAULT_JOB (8u << 20)    /* per job: a wait for one is short */
#define SNAP_FAULT_MARGIN (4u << 20) /* a read turn's budget, twice */

static void fault_run(uv_work_t *w)
{
    struct snap_fault *f = w->data;
    atomic_store(&f->started, true);
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = 4096;
    uintptr_t a = ((uintptr_t)f->blob->data + (uintptr_t)f->from) & ~(page - 1);
    uintptr_t e = (uintptr_t)f->blob->data + (uintptr_t)f->to;
    (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE); /* a hint: may fail */
#endif
    tk_blob_unref(f->blob); /* the last one unmaps it here, off the loop */
}

static void snap_fault_ahead(struct tcp_conn *c);

/* Would the next chunks land in pages not faulted in yet, with a job on its
 * way there? Then the connection's reads wait for it: the loop never zeroes
 * the pages itself, and the snapshot arrives at the pool's pace. On this VM
 * a first touch of memory the guest never used cost about 8 ms per 2 MiB
 * page, and one pool thread was no faster than the stream. */
static bool snap_fault_behind(const struct tcp_conn *c)
{
    const struct codec_snap *s = &c->snap;
    return c->fault != NULL && atomic_load(&c->fault->started) && s->blob != NULL &&
           c->fault_blob == (const void *)s->blob &&
           s->len + SNAP_FAULT_MARGIN > c->fault_done && c->fault_done < s->total;
}

static void fault_after(uv_work_t *w, int status)
{
    struct snap_fault *f = w->data;
    struct tcp_conn *c = f->conn;
    (void)status;
    if (c != NULL) {
        c->fault = NULL;
        if (c->fault_blob == (const void *)f->blob) /* compared, not read */
            c->fault_done = f->to;
    }
    tk_free(f);
    if (c == NULL || c->state == CONN_CLOSING)
        return;
    snap_fault_ahead(c);
    if (c->fault_wait && !snap_fault_behind(c)) {
        c->fault_wait = false;
        if (!c->read_paused && !c->t->closing)
            uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
    }
}

/* Queues the next slice of SNAP_FAULT_JOB bytes while what is faulted in or
 * queued is less than SNAP_AHEAD ahead of the chunks (one job at a time per
 * connection; each job's end queues the next). */
static void snap_fault_ahead(struct tcp_conn *c)
{
    const struct codec_snap *s = &c->snap;
    if (c->fault != NULL || s->blob == NULL || s->total < SNAP_AHEAD)
        return;
    if (c->fault_blob != s->blob) { /* a new reassembly */
        c->fault_blob = s->blob;
        c->fault_end = c->fault_done = 0;
    }
    uint64_t from = c->fault_end > s->len ? c->fault_end : s->len;
    if (from >= s->total || from - s->len >= SNAP_AHEAD)
        return;
    uint64_t to = from + SNAP_FAULT_JOB;
    if (to > s->len + SNAP_AHEAD)
        to = s->len + SNAP_AHEAD;
    if (to > s->total)
        to = s->total;
    struct snap_fault *f = tk_calloc(1, sizeof(*f));
    f->conn = c;
    f->blob = tk_blob_ref(s->blob);
    f->from = from;
    f->to = to;
    atomic_init(&f->started, false);
    f->work.data = f;
    if (uv_queue_work(c->t->loop, &f->work, fault_run, fault_after) != 0) {
        tk_blob_unref(f->blob);
        tk_free(f);
        return;
    }
    c->fault = f;
    c->fault_end = to;
    c->t->base.stats.snapshot_faulted_ahead += to - from;
}

/* A snapshot chunk: reassembled within the per-connection, total and time
 * bounds. Returns NULL, or the reason to close. */
static const char *conn_snapshot(struct tcp_conn *c, const struct raft_message *m)
{
    struct tcp *t = c->t;
    const struct raft_msg_snapshot *ch = &m->u.snapshot;
    uint64_t now = uv_now(t->loop);
    if (ch->offset == 0)
        c->snap_started = now;
    else if (c->snap.active && now - c->snap_started > t->o.snapshot_timeout_ms) {
        snap_drop(c, "not completed in time");
        return "snapshot not completed in time";
    }
    uint64_t need = codec__snap_need(&c->snap, ch);
    if (need > t->o.snapshot_max || ch->total > t->o.snapshot_max) {
        snap_drop(c, "larger than snapshot_max");
        return "snapshot too large";
    }
    if (t->snap_bytes - c->snap_charged + need > t->o.snapshot_total_max) {
        snap_drop(c, "the snapshot memory of all peers is used up");
        return "snapshot memory exhausted";
    }
    struct raft_message whole;
    int rc = codec__snap_feed(&c->snap, m, &whole);
    snap_recharge(c);
    if (rc == 1) {
        t->base.stats.msgs_received++;
        t->base.cbs.recv(&t->base, &whole, t->base.cbs.data);
        tk_blob_unref(whole.u.snapshot.data);
    } else if (rc < 0) {
        return rc == TK_ETOOBIG ? "snapshot too large" : "snapshot chunk out of order";
    } else {
        snap_fault_ahead(c);
        if (snap_fault_behind(c) && !c->fault_wait) {
            c->fault_wait = true;
            uv_read_stop((uv_stream_t *)&c->handle);
            t->base.stats.snapshot_fault_waits++;
        }
    }
    return NULL;
}

/* One complete, CRC-checked frame. Returns 0, or the reason to close. */
static const char *conn_frame(struct tcp_conn *c, const uint8_t *payload, uint32_t len)
{
    struct tcp *t = c->t;
    uint8_t kind = payload[0];
    if (c->state == CONN_HANDSHAKE || c->state == CONN_AUTH)
        return conn_handshake(c, kind, payload + 1, len - 1);
    if (c->peer != NULL)
        return "unexpected frame on an outgoing connection";
    if (kind == FRAME_KIND_FORWARD) {
        if (t->base.cbs.forward != NULL) {
            t->base.stats.fwd_received++;
            t->base.cbs.forward(&t->base, c->remote_id, payload + 1, len - 1,
                                t->base.cbs.data);
        }
        return NULL;
    }
    if (kind == FRAME_KIND_PING)
        return NULL;
    if (kind != FRAME_KIND_RAFT)
        return kind == FRAME_KIND_HELLO ? "second hello" : "unknown frame kind";
    struct raft_message m;
    if (codec__decode(&c->dec, payload + 1, len - 1, &m) != 0)
        return "malformed raft message";
    const char *why = NULL;
    if (m.from != c->remote_id || m.to != t->base.id) {
        /* A member lying about its id (or a misrouted message): dropped. */
        t->base.stats.msgs_spoofed++;
        TK_LOG(TK_LOG_WARN, t->base.id, 0,
               "message from %llu to %llu on %llu's connection dropped",
               (unsigned long long)m.from, (unsigned long long)m.to,
               (unsigned long long)c->remote_id);
    } else if (m.type == RAFT_MSG_SNAPSHOT) {
        why = conn_snapshot(c, &m);
    } else {
        t->base.stats.msgs_received++;
        t->base.cbs.recv(&t->base, &m, t->base.cbs.data);
    }
    codec__dec_release(&c->dec);
    return why;
}

static void conn_input(struct tcp_conn *c, size_t n);

/* Peer TLS: the handshake is done. A dialer says HELLO now (an acceptor
 * waits for the dialer's). Returns NULL or why to close. */
static const char *conn_tls_ready(struct tcp_conn *c)
{
    uv_timer_stop(&c->timer);
    if (c->peer != NULL) {
        uv_timer_start(&c->timer, on_conn_timeout, c->t->o.io_timeout_ms, 0);
        if (send_hello(c) != 0)
            return "cannot make a nonce";
    } else {
        uv_timer_start(&c->timer, on_conn_timeout, c->t->o.handshake_timeout_ms, 0);
    }
    return NULL;
}

/* Peer TLS: ciphertext in; the TLS handshake, then the plaintext appended to
 * rbuf a record at a time and parsed (a partial record waits in the session). */
static void conn_tls_in(struct tcp_conn *c, const uint8_t *data, size_t len)
{
    struct tcp *t = c->t;
    const char *why = NULL;
    bool was_ready = tk_tls_handshake_done(c->tls);
    if (tk_tls_feed(c->tls, data, len) != 0)
        why = "too many undecrypted TLS bytes";
    int h = why != NULL || was_ready ? 1 : tk_tls_handshake(c->tls);
    if (why == NULL && h < 0) {
        t->base.stats.auth_failed++;
        why = tk_tls_error(c->tls);
    }
    if (why == NULL && h >= 0 && !was_ready && tk_tls_out_pending(c->tls) > 0)
        c->tls_hello = true; /* a whole ClientHello, answered: not a flood's bytes */
    (void)tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->handle); /* handshake or alert */
    if (why == NULL && h == 1 && !was_ready)
        why = conn_tls_ready(c);
    while (why == NULL && c->state != CONN_CLOSING && !t->closing) {
        size_t room = c->state == CONN_UP ? RBUF_BYTES : HS_BUF_BYTES;
        if (c->rcap - c->rlen < (room < 16384 ? room : 16384)) {
            c->rcap = c->rlen + room;
            c->rbuf = tk_realloc(c->rbuf, c->rcap);
        }
        ssize_t n = tk_tls_read(c->tls, c->rbuf + c->rlen, c->rcap - c->rlen);
        if (n == 0)
            break;
        if (n < 0)
            why = n == TK_ECLOSED ? "the peer closed the TLS session"
                                  : tk_tls_error(c->tls);
        else
            conn_input(c, (size_t)n);
    }
    if (why != NULL && c->state != CONN_CLOSING) {
        char msg[TK_TLS_ERR_MAX];
        snprintf(msg, sizeof(msg), "%s", why); /* the session goes with the conn */
        conn_bad(c, msg);
    }
}

/* Bytes a connection may hand in per loop turn (read_turn_bytes' default).
 * libuv goes on reading while
 * the socket has data (32 reads of a frame-sized buffer): a snapshot
 * streaming in took 32 MiB in one turn, 190-244 ms of a follower's loop at
 * 10M keys. Past this, its reads wait for the next turn (the prepare, which
 * then runs before the poll), so that the node's own work and heartbeats go
 * between; the kernel's socket buffer holds the rest meanwhile. */
#define READ_TURN_BYTES (2u << 20)

static void read_budget(struct tcp_conn *c, size_t n)
{
    struct tcp *t = c->t;
    uint64_t now = uv_now(t->loop);
    if (c->rx_ms != now) {
        c->rx_ms = now;
        c->rx_turn = 0;
    }
    c->rx_turn += n;
    if (c->rx_turn < t->o.read_turn_bytes || c->state != CONN_UP || t->closing ||
        c->read_paused)
        return;
    uv_read_stop((uv_stream_t *)&c->handle);
    c->read_paused = true;
    c->rx_turn = 0;
    t->n_paused++;
    t->base.stats.reads_paused++;
    arm_flush(t);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct tcp_conn *c = s->data;
    struct tcp *t = c->t;
    if (c->state == CONN_CLOSING)
        return;
    if (nread < 0) {
        if (c->rlen != 0) {
            conn_bad(c, "connection ended inside a frame");
        } else if (c->peer != NULL) {
            peer_lost(c->peer, uv_strerror((int)nread));
        } else {
            conn_close(c);
        }
        return;
    }
    c->last_rx = uv_now(t->loop);
    t->base.stats.bytes_received += (uint64_t)nread;
    if (c->tls != NULL)
        conn_tls_in(c, (const uint8_t *)buf->base, (size_t)nread);
    else
        conn_input(c, (size_t)nread);
    read_budget(c, (size_t)nread);
}

/* `n` more bytes are in rbuf (after rlen): every complete frame is handled. */
static void conn_input(struct tcp_conn *c, size_t n)
{
    struct tcp *t = c->t;
    c->rlen += n;
    size_t off = 0;
    while (c->state != CONN_CLOSING && !t->closing) {
        const uint8_t *payload;
        uint32_t plen;
        size_t consumed;
        /* Before the handshake only a HELLO is acceptable: an unknown client
         * cannot make us buffer a large frame. */
        uint32_t limit = c->state == CONN_UP ? t->o.frame_max : 1 + FRAME_HELLO_BYTES;
        if (c->state == CONN_AUTH)
            limit = 1 + FRAME_PROOF_BYTES;
        int rc =
            frame__parse(c->rbuf + off, c->rlen - off, limit, &payload, &plen, &consumed);
        if (rc == 0)
            break;
        if (rc < 0) {
            conn_bad(c, rc == TK_ETOOBIG ? "bad frame length" : "frame CRC mismatch");
            return;
        }
        off += consumed;
        const char *why = conn_frame(c, payload, plen);
        if (why != NULL) {
            if (c->state != CONN_CLOSING)
                conn_bad(c, why);
            return;
        }
    }
    if (c->state == CONN_CLOSING || t->closing)
        return;
    c->rlen -= off;
    if (off != 0 && c->rlen != 0)
        memmove(c->rbuf, c->rbuf + off, c->rlen);
    if (c->rlen == 0 && c->rcap > BUF_KEEP_BYTES) {
        tk_free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
    }
    /* The deadline runs from the first byte of the oldest incomplete frame. */
    if (c->state == CONN_UP) {
        if (c->rlen == 0)
            uv_timer_stop(&c->timer);
        else if (off != 0 || !uv_is_active((uv_handle_t *)&c->timer)) {
            /* The loop's cached time may be old after a long turn. */
            uv_update_time(t->loop);
            uv_timer_start(&c->timer, on_conn_timeout, t->o.io_timeout_ms, 0);
        }
    }
}

/* ---- Inbound ---- */

/* How far an unauthenticated connection got: 3 once its HELLO checked
 * (waiting for the AUTH), 2 with peer TLS once its ClientHello was answered
 * (the TLS handshake under way), 1 with bytes read or waiting in its socket
 * (FIONREAD), 0 silent. A dialing member sends its HELLO (or ClientHello) as
 * soon as it is connected, so its connection is rarely silent, and leaves
 * rank 3 within its round trips. Without rank 2, a member's TLS handshake
 * (two round trips and the certificates' checks) ranked with a flood's
 * half-sent sockets and, the oldest of them, was the next evicted: at 8,000
 * connections a second from its own address (16 pending at most), within a
 * few ms; a member restarted in the flood did not rejoin in 3 s once (CI
 * rehearsal, Dec 7 16:02 UTC) and took 1.2 s in one run of three here. */
static int pending_rank(struct tcp_conn *c)
{
    if (c->state == CONN_AUTH)
        return 3;
    if (c->tls_hello)
        return 2;
    if (c->rlen != 0 || c->last_rx != 0)
        return 1;
    uv_os_fd_t fd;
    int avail = 0;
    if (uv_fileno((uv_handle_t *)&c->handle, &fd) == 0 &&
        ioctl(fd, FIONREAD, &avail) == 0 && avail > 0)
        return 1;
    return 0;
}

/* Closes one pending connection of address `key` to make room: the oldest of
 * the lowest rank (pending_rank). An authenticated connection is never a
 * candidate, and a member's handshake, ranked above a flood's silent or
 * half-sent sockets, is only ever evicted by as many newer HELLOs as the cap
 * arriving within its round trip. */
static void evict_pending(struct tcp *t, uint64_t key)
{
    struct tcp_conn *cand[TRANSPORT_TCP_PENDING_MAX + 1];
    size_t n = 0;
    for (struct tcp_conn *c = t->inbound; c != NULL && n < TRANSPORT_TCP_PENDING_MAX + 1;
         c = c->next)
        if (c->pending && c->addr_key == key)
            cand[n++] = c; /* newest first */
    struct tcp_conn *victim = NULL;
    int best = 4;
    for (size_t i = n; i-- > 0 && best > 0;) { /* oldest first */
        int r = pending_rank(cand[i]);
        if (r < best) {
            best = r;
            victim = cand[i];
        }
    }
    if (victim == NULL)
        return;
    t->base.stats.pending_evicted++;
    TK_LOG(TK_LOG_DEBUG, t->base.id, 0, "pending handshake evicted by a newer one");
    conn_close(victim);
}

/* The address with the most pending connections (ties: the newest's). */
static uint64_t busiest_pending_addr(struct tcp *t)
{
    uint64_t keys[TRANSPORT_TCP_PENDING_MAX + 1];
    uint32_t counts[TRANSPORT_TCP_PENDING_MAX + 1];
    size_t n = 0, best = 0;
    for (struct tcp_conn *c = t->inbound; c != NULL; c = c->next) {
        if (!c->pending)
            continue;
        size_t i = 0;
        while (i < n && keys[i] != c->addr_key)
            i++;
        if (i == n) {
            if (n == TRANSPORT_TCP_PENDING_MAX + 1)
                continue;
            keys[n] = c->addr_key;
            counts[n++] = 0;
        }
        if (++counts[i] > counts[best])
            best = i;
    }
    return n == 0 ? 0 : keys[best];
}

/* The remote address of an accepted connection, as a key (FNV-1a of the
 * address bytes, not the port): the unit of the per-address cap. */
static uint64_t conn_addr_key(struct tcp_conn *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(&c->handle, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    const uint8_t *b = NULL;
    size_t n = 0;
    if (ss.ss_family == AF_INET) {
        b = (const uint8_t *)&((struct sockaddr_in *)&ss)->sin_addr;
        n = 4;
    } else if (ss.ss_family == AF_INET6) {
        b = (const uint8_t *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
        n = 16;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h | 1; /* never 0 */
}

/* Makes room for one more pending connection from `key`: at most
 * TRANSPORT_TCP_PENDING_PER_ADDR from one address (a flood from one host
 * only ever evicts its own), TRANSPORT_TCP_PENDING_MAX in all (then the
 * busiest address gives one up). */
static void pending_admit(struct tcp *t, uint64_t key)
{
    size_t same = 0;
    for (struct tcp_conn *c = t->inbound; c != NULL; c = c->next)
        same += c->pending && c->addr_key == key;
    if (same >= TRANSPORT_TCP_PENDING_PER_ADDR)
        evict_pending(t, key);
    else if (t->n_pending >= TRANSPORT_TCP_PENDING_MAX)
        evict_pending(t, busiest_pending_addr(t));
}

/* The periodic tick: closes idle authenticated inbound connections, drops
 * snapshot reassemblies past their deadline, and pings idle outgoing links so
 * that the peer's idle deadline spares them. */
static void on_tick(uv_timer_t *timer)
{
    struct tcp *t = timer->data;
    uint64_t now = uv_now(t->loop);
    struct tcp_conn *next;
    for (struct tcp_conn *c = t->inbound; c != NULL; c = next) {
        next = c->next;
        if (c->state != CONN_UP)
            continue;
        if (c->snap.active && now - c->snap_started > t->o.snapshot_timeout_ms)
            snap_drop(c, "not completed in time");
        if (c->rlen == 0 && now - c->last_rx > t->o.idle_timeout_ms) {
            t->base.stats.conns_idle++;
            TK_LOG(TK_LOG_INFO, t->base.id, 0, "connection from %llu idle: closed",
                   (unsigned long long)c->remote_id);
            conn_close(c);
        }
    }
    for (size_t i = 0; i < t->n_peers; i++) {
        struct tcp_peer *p = t->peers[i];
        if (p->up && p->head == NULL && p->inflight == NULL &&
            now - p->last_tx >= t->o.idle_timeout_ms / 3) {
            uint8_t *f = peer_reserve(p, FRAME_HEADER_BYTES + 1);
            f[FRAME_HEADER_BYTES] = FRAME_KIND_PING;
            frame__seal(f, f + FRAME_HEADER_BYTES, 1);
            p->queued_bytes += FRAME_HEADER_BYTES + 1;
            arm_flush(t);
        }
    }
}

/* Keepalive notices a peer that vanished without a FIN on an idle
 * connection; TCP_USER_TIMEOUT one that vanished while data was in flight
 * (Raft's heartbeats keep some in flight): the kernel drops the connection
 * when sent data stays unacknowledged for io_timeout_ms, instead of
 * retransmitting for ~15 minutes. Then the link redials, and a peer named by a
 * host name is resolved again: a container that came back at another address
 * (deploy/docker-compose.yml) is found within seconds. */
static void conn_liveness(struct tcp *t, struct tcp_conn *c)
{
    uv_tcp_keepalive(&c->handle, 1, TCP_KEEPALIVE_S);
#ifdef TCP_USER_TIMEOUT
    uv_os_fd_t fd;
    unsigned ms = t->o.io_timeout_ms;
    if (uv_fileno((uv_handle_t *)&c->handle, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
#else
    (void)t;
#endif
}

/* TCP_DEFER_ACCEPT: the kernel hands us a connection only once its first
 * bytes have come (a dialer's HELLO or TLS ClientHello, sent as soon as it is
 * connected), so a flood of silent sockets never takes a pending slot. */
static void listen_defer_accept(struct tcp *t)
{
#ifdef TCP_DEFER_ACCEPT
    uv_os_fd_t fd;
    int secs = (int)((t->o.handshake_timeout_ms + 999) / 1000);
    if (uv_fileno((uv_handle_t *)&t->listener, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &secs, sizeof(secs));
#else
    (void)t;
#endif
}

/* A new connection's first read, at once: its HELLO (or ClientHello) is
 * usually there already (TCP_DEFER_ACCEPT), and handling it now moves a
 * member's handshake past the flood's half-sent sockets before the next
 * accept of the same burst could evict it. */
static void conn_first_read(struct tcp_conn *c)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->handle, &fd) != 0)
        return;
    uv_buf_t b;
    on_alloc((uv_handle_t *)&c->handle, RBUF_BYTES, &b);
    ssize_t n = read(fd, b.base, b.len);
    if (n > 0)
        on_read((uv_stream_t *)&c->handle, n, &b);
}

static void accept_one(struct tcp *t)
{
    uv_stream_t *server = (uv_stream_t *)&t->listener;
    t->n_accepted_turn++;
    struct tcp_conn *c = conn_new(t, NULL);
    if (uv_accept(server, (uv_stream_t *)&c->handle) != 0) {
        c->next = t->inbound;
        t->inbound = c;
        t->n_inbound++;
        conn_close(c);
        return;
    }
    c->addr_key = conn_addr_key(c);
    pending_admit(t, c->addr_key);
    c->next = t->inbound;
    t->inbound = c;
    t->n_inbound++;
    c->pending = true;
    t->n_pending++;
    if (t->n_inbound > INBOUND_MAX) {
        conn_bad(c, "too many inbound connections");
        return;
    }
    uv_tcp_nodelay(&c->handle, 1);
    conn_liveness(t, c);
    c->state = CONN_HANDSHAKE;
    if (t->o.tls_server != NULL) {
        c->tls = tk_tls_new(t->o.tls_server, NULL); /* the name is checked at HELLO */
    }
    uv_timer_start(&c->timer, on_conn_timeout, t->o.handshake_timeout_ms, 0);
    uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
    conn_first_read(c);
}

/* A connection waits in the listen queue. Past ACCEPT_TURN_MAX since the last
 * prepare, it is left there: libuv then stops watching the listener until the
 * next uv_accept, which the prepare makes (resume_accepts). */
static void on_connection(uv_stream_t *server, int status)
{
    struct tcp *t = server->data;
    if (status < 0 || t->closing)
        return;
    if (t->n_accepted_turn >= ACCEPT_TURN_MAX) {
        t->accept_waiting = true;
        t->base.stats.accepts_deferred++;
        arm_flush(t);
        return;
    }
    accept_one(t);
}

/* ---- Outgoing ---- */

static void on_backoff(uv_timer_t *timer)
{
    struct tcp_peer *p = timer->data;
    if (!p->t->closing)
        peer_dial(p);
}

/* The outgoing connection failed or was lost: drop what was queued, tell the
 * node if it was up, and redial after a backoff with jitter. */
static void peer_lost(struct tcp_peer *p, const char *why)
{
    struct tcp *t = p->t;
    bool was_up = p->up;
    if (p->conn != NULL) {
        conn_close(p->conn);
        p->conn = NULL;
    }
    p->up = false;
    peer_drop_queue(p);
    if (!was_up)
        t->base.stats.conns_failed++;
    TK_LOG(TK_LOG_DEBUG, t->base.id, 0, "connection to %llu lost: %s",
           (unsigned long long)p->id, why);
    if (was_up && t->base.cbs.peer != NULL)
        t->base.cbs.peer(&t->base, p->id, false, t->base.cbs.data);
    if (t->closing || p->removed)
        return;
    double jitter = 0.5 + 0.5 * tk_prng_double(&t->prng);
    uint64_t delay = (uint64_t)(p->backoff_ms * jitter);
    uv_timer_start(&p->backoff_timer, on_backoff, delay, 0);
    uint32_t next = p->backoff_ms * 2;
    p->backoff_ms = next > t->o.backoff_max_ms ? t->o.backoff_max_ms : next;
}

static void on_connect(uv_connect_t *req, int status)
{
    struct tcp_conn *c = req->data;
    struct tcp_peer *p = c->peer;
    if (status == UV_ECANCELED || c->state == CONN_CLOSING)
        return;
    if (status < 0) {
        peer_lost(p, uv_strerror(status));
        return;
    }
    c->state = CONN_HANDSHAKE;
    conn_liveness(p->t, c);
    if (p->t->o.tls_client != NULL) {
        /* Peer TLS: the ClientHello now, our HELLO once TLS is up. */
        c->tls = tk_tls_new(p->t->o.tls_client, NULL);
        if (tk_tls_handshake(c->tls) < 0 ||
            tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->handle) != 0) {
            peer_lost(p, "cannot start TLS");
            return;
        }
    } else if (send_hello(c) != 0) {
        peer_lost(p, "cannot make a nonce");
        return;
    }
    uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
}

static void peer_connect(struct tcp_peer *p)
{
    struct tcp *t = p->t;
    TK_ASSERT(p->conn == NULL);
    struct tcp_conn *c = conn_new(t, p);
    p->conn = c;
    c->state = CONN_CONNECTING;
    c->connect_req.data = c;
    uv_tcp_nodelay(&c->handle, 1);
    uv_timer_start(&c->timer, on_conn_timeout, t->o.io_timeout_ms, 0);
    int rc = uv_tcp_connect(&c->connect_req, &c->handle,
                            (const struct sockaddr *)&p->addr, on_connect);
    if (rc != 0)
        peer_lost(p, uv_strerror(rc));
}

static void tcp_handle_gone(struct tcp *t);

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct tcp_peer *p = req->data;
    struct tcp *t = p->t;
    p->resolving = false;
    /* IPv4 first (what container networks hand out), else IPv6. */
    const struct addrinfo *a = res;
    while (a != NULL && a->ai_family != AF_INET)
        a = a->ai_next;
    if (a == NULL)
        for (a = res; a != NULL && a->ai_family != AF_INET6;)
            a = a->ai_next;
    if (status == 0 && a != NULL && a->ai_addrlen <= sizeof(p->addr)) {
        memset(&p->addr, 0, sizeof(p->addr));
        memcpy(&p->addr, a->ai_addr, a->ai_addrlen);
    }
    uv_freeaddrinfo(res);
    if (t->closing) {
        peer_release(p);
        tcp_handle_gone(t);
        return;
    }
    t->handles_open--; /* not the last: the transport's own handles are open */
    if (p->removed) {
        peer_release(p);
        return;
    }
    if (status != 0 || a == NULL) {
        char why[160];
        snprintf(why, sizeof(why), "cannot resolve %s: %s", p->host,
                 status != 0 ? uv_strerror(status) : "no IPv4 or IPv6 address");
        peer_lost(p, why);
        return;
    }
    peer_connect(p);
}

static void peer_dial(struct tcp_peer *p)
{
    struct tcp *t = p->t;
    if (p->host == NULL) {
        peer_connect(p);
        return;
    }
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)p->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    p->gai.data = p;
    int rc = uv_getaddrinfo(t->loop, &p->gai, on_resolved, p->host, port, &hints);
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot resolve %s: %s", p->host, uv_strerror(rc));
        peer_lost(p, why);
        return;
    }
    p->resolving = true;
    t->handles_open++; /* the close waits for the lookup */
}

static int parse_addr(const char *host, uint16_t port, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (host == NULL)
        return TK_EINVAL;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0)
        return 0;
    return TK_EINVAL;
}

/* A DNS name as RFC 1123 allows it: letters, digits, '-', '.', '_' (which
 * docker and Kubernetes service names use), at most 253 bytes. */
static bool host_name_ok(const char *host)
{
    size_t n = strlen(host);
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = host[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_'))
            return false;
    }
    return true;
}

int transport_tcp_add_peer(struct transport *base, uint64_t id, const char *host,
                           uint16_t port)
{
    struct tcp *t = (struct tcp *)base;
    TK_ASSERT(base->ops->send == tcp_send);
    if (t->closing)
        return TK_ECLOSED;
    if (id == RAFT_NONE || id == base->id || peer_find(t, id) != NULL)
        return TK_EINVAL;
    struct tcp_peer *p = tk_calloc(1, sizeof(*p));
    if (parse_addr(host, port, &p->addr) != 0) {
        if (host == NULL || !host_name_ok(host) || port == 0) {
            tk_free(p);
            return TK_EINVAL;
        }
        p->host = tk_strdup(host);
    }
    p->port = port;
    p->t = t;
    p->id = id;
    p->backoff_ms = t->o.backoff_min_ms;
    TK_ASSERT(uv_timer_init(t->loop, &p->backoff_timer) == 0);
    p->backoff_timer.data = p;
    p->timer_open = true;
    t->handles_open++;
    t->peers = tk_realloc(t->peers, (t->n_peers + 1) * sizeof(*t->peers));
    t->peers[t->n_peers++] = p;
    peer_dial(p);
    return 0;
}

/* Frees removed peer `p` once nothing names it any more: its backoff timer
 * closed, no connection of it left to free, no write or name lookup in
 * flight. Called by each of those as it ends; a no-op for a current peer. */
static void peer_release(struct tcp_peer *p)
{
    if (!p->removed || p->timer_open || p->n_conns > 0 || p->inflight != NULL ||
        p->resolving)
        return;
    struct tcp *t = p->t;
    size_t i = 0;
    while (i < t->n_releasing && t->releasing[i] != p)
        i++;
    TK_ASSERT(i < t->n_releasing);
    t->releasing[i] = t->releasing[--t->n_releasing];
    if (t->n_releasing == 0) {
        tk_free(t->releasing);
        t->releasing = NULL;
    }
    TK_ASSERT(p->head == NULL);
    TK_ASSERT(!snap_streaming(p));
    tk_free(p->host);
    tk_free(p);
}

static void removed_timer_closed(uv_handle_t *h)
{
    struct tcp_peer *p = h->data;
    struct tcp *t = p->t;
    p->timer_open = false;
    peer_release(p);
    tcp_handle_gone(t);
}

int transport_tcp_remove_peer(struct transport *base, uint64_t id)
{
    struct tcp *t = (struct tcp *)base;
    TK_ASSERT(base->ops->send == tcp_send);
    if (t->closing)
        return TK_ECLOSED;
    size_t i = 0;
    while (i < t->n_peers && t->peers[i]->id != id)
        i++;
    if (i == t->n_peers)
        return TK_ENOTFOUND;
    struct tcp_peer *p = t->peers[i];
    t->peers[i] = t->peers[--t->n_peers];
    t->releasing = tk_realloc(t->releasing, (t->n_releasing + 1) * sizeof(*t->releasing));
    t->releasing[t->n_releasing++] = p;
    p->removed = true;
    /* Closed now, so the peer is never freed synchronously here: its
     * callback (removed_timer_closed) or a later one releases it. */
    uv_close((uv_handle_t *)&p->backoff_timer, removed_timer_closed);
    if (p->resolving)
        (void)uv_cancel((uv_req_t *)&p->gai); /* on_resolved dials no more */
    if (p->conn != NULL || p->up)
        peer_lost(p, "removed");
    else
        peer_drop_queue(p);
    /* Its connections to us go too; the node refuses new ones (cbs.member). */
    for (struct tcp_conn *c = t->inbound, *next; c != NULL; c = next) {
        next = c->next;
        if (c->remote_id == id)
            conn_close(c);
    }
    TK_LOG(TK_LOG_INFO, t->base.id, 0, "peer %llu removed: no longer dialed",
           (unsigned long long)id);
    return 0;
}

size_t transport_tcp_peer_records(const struct transport *base)
{
    const struct tcp *t = (const struct tcp *)base;
    TK_ASSERT(base->ops->send == tcp_send);
    return t->n_peers + t->n_releasing;
}

/* ---- Lifecycle ---- */

static void tcp_free(struct tcp *t)
{
    for (size_t i = 0; i < t->n_peers; i++) {
        struct tcp_peer *p = t->peers[i];
        TK_ASSERT(p->inflight == NULL);
        snap_stream_stop(p);
        obuf_put_list(t, p->head);
        tk_free(p->host);
        tk_free(p);
    }
    tk_free(t->peers);
    /* Every handle is closed and every request ended: each removed peer was
     * released by the last of its own. */
    TK_ASSERT(t->n_releasing == 0);
    tk_free(t->releasing);
    obuf_free_list(t->free_obufs);
    obuf_free_list(t->big_obufs);
    codec__enc_destroy(&t->enc);
    tk_free(t->token);
    tk_free(t);
}

/* One of the transport's handles (its own, a peer timer or a connection's) is
 * closed; the last one, once closing, ends the close. */
static void tcp_handle_gone(struct tcp *t)
{
    TK_ASSERT(t->handles_open > 0);
    if (--t->handles_open == 0 && t->closing) {
        if (t->close_cb != NULL)
            t->close_cb(&t->base, t->close_data);
        tcp_free(t);
    }
}

static void handle_closed(uv_handle_t *h)
{
    tcp_handle_gone(h->data);
}

static void peer_timer_closed(uv_handle_t *h)
{
    struct tcp_peer *p = h->data;
    tcp_handle_gone(p->t);
}

static void tcp_close(struct transport *base, transport_close_cb *cb, void *data)
{
    struct tcp *t = (struct tcp *)base;
    TK_ASSERT(!t->closing);
    t->closing = true;
    t->close_cb = cb;
    t->close_data = data;
    uv_close((uv_handle_t *)&t->listener, handle_closed);
    uv_close((uv_handle_t *)&t->prepare, handle_closed);
    uv_close((uv_handle_t *)&t->check, handle_closed);
    uv_close((uv_handle_t *)&t->tick, handle_closed);
    while (t->inbound != NULL)
        conn_close(t->inbound);
    for (size_t i = 0; i < t->n_peers; i++) {
        struct tcp_peer *p = t->peers[i];
        if (p->conn != NULL) {
            conn_close(p->conn);
            p->conn = NULL;
        }
        p->up = false;
        peer_drop_queue(p);
        if (p->resolving)
            (void)uv_cancel((uv_req_t *)&p->gai); /* on_resolved ends it */
        uv_close((uv_handle_t *)&p->backoff_timer, peer_timer_closed);
    }
}

static const struct transport_ops tcp_ops = {
    .send = tcp_send,
    .send_forward = tcp_send_forward,
    .close = tcp_close,
};

void transport_tcp_options_default(struct transport_tcp_options *o)
{
    memset(o, 0, sizeof(*o));
    o->listen_host = "127.0.0.1";
}

uint16_t transport_tcp_port(const struct transport *base)
{
    const struct tcp *t = (const struct tcp *)base;
    if (!t->listening)
        return 0;
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&t->listener, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* Fills in the defaults of `o`; returns 0 or TK_EINVAL. */
static int options_fill(struct transport_tcp_options *o)
{
    if (o->frame_max == 0)
        o->frame_max = FRAME_MAX_DEFAULT;
    if (o->snapshot_chunk == 0)
        o->snapshot_chunk = SNAP_CHUNK_DEFAULT;
    if (o->read_turn_bytes == 0)
        o->read_turn_bytes = READ_TURN_BYTES;
    if (o->snapshot_max == 0)
        o->snapshot_max = 16ull << 30; /* 10M keys of 100 B: a 1.5 GB snapshot */
    if (o->send_queue_bytes == 0)
        o->send_queue_bytes = 8u << 20;
    if (o->backoff_min_ms == 0)
        o->backoff_min_ms = 50;
    if (o->backoff_max_ms == 0)
        o->backoff_max_ms = 5000;
    if (o->backoff_max_ms < o->backoff_min_ms)
        o->backoff_max_ms = o->backoff_min_ms;
    if (o->io_timeout_ms == 0)
        o->io_timeout_ms = 10000;
    if (o->handshake_timeout_ms == 0)
        o->handshake_timeout_ms = 2000;
    if (o->idle_timeout_ms == 0)
        o->idle_timeout_ms = 60000;
    if (o->snapshot_timeout_ms == 0)
        o->snapshot_timeout_ms = 600000;
    if (o->snapshot_total_max == 0)
        o->snapshot_total_max = o->snapshot_max;
    if (o->peer_token != NULL && o->peer_token_len < TRANSPORT_TCP_TOKEN_MIN)
        return TK_EINVAL;
    if (o->frame_max < 4096 || o->snapshot_chunk + 1024 > o->frame_max)
        return TK_EINVAL;
    return 0;
}

int transport_tcp_new(uv_loop_t *loop, const struct transport_tcp_options *opts,
                      const struct transport_callbacks *cbs, struct transport **out)
{
    if (opts->id == RAFT_NONE || cbs == NULL || cbs->recv == NULL)
        return TK_EINVAL;
    struct transport_tcp_options o = *opts;
    if (options_fill(&o) != 0 || (o.tls_server == NULL) != (o.tls_client == NULL))
        return TK_EINVAL;
    struct sockaddr_storage addr;
    if (o.listen_host != NULL && parse_addr(o.listen_host, o.listen_port, &addr) != 0)
        return TK_EINVAL;

    struct tcp *t = tk_calloc(1, sizeof(*t));
    t->base.ops = &tcp_ops;
    t->base.id = o.id;
    t->base.cbs = *cbs;
    t->loop = loop;
    t->o = o;
    t->o.listen_host = NULL; /* not kept: the caller's string */
    t->o.peer_token = NULL;  /* copied into t->token */
    if (o.peer_token != NULL) {
        t->token = tk_malloc(o.peer_token_len);
        memcpy(t->token, o.peer_token, o.peer_token_len);
        t->token_len = o.peer_token_len;
    }
    codec__enc_init(&t->enc);
    tk_prng_seed(&t->prng, o.seed ^ o.id);
    TK_ASSERT(uv_tcp_init(loop, &t->listener) == 0);
    TK_ASSERT(uv_prepare_init(loop, &t->prepare) == 0);
    TK_ASSERT(uv_check_init(loop, &t->check) == 0);
    t->listener.data = t;
    t->prepare.data = t;
    t->check.data = t;
    TK_ASSERT(uv_timer_init(loop, &t->tick) == 0);
    t->tick.data = t;
    t->handles_open = 4;
    uint32_t tick = t->o.idle_timeout_ms / 4;
    if (tick > 1000)
        tick = 1000;
    if (tick == 0)
        tick = 1;
    uv_timer_start(&t->tick, on_tick, tick, tick);
    uv_unref((uv_handle_t *)&t->tick); /* never keeps the loop alive alone */
    if (o.listen_host != NULL) {
        int rc = uv_tcp_bind(&t->listener, (const struct sockaddr *)&addr, 0);
        if (rc == 0)
            listen_defer_accept(t);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&t->listener, 511, on_connection);
        if (rc != 0) {
            TK_LOG(TK_LOG_ERROR, o.id, 0, "listen on %s:%u failed: %s", opts->listen_host,
                   o.listen_port, uv_strerror(rc));
            /* Close the handles; the struct goes when they are closed. */
            tcp_close(&t->base, NULL, NULL);
            return TK_EIO;
        }
        t->listening = true;
    }
    *out = &t->base;
    return 0;
}
