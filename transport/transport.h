/* The Raft transport: moves struct raft_message between nodes.
 *
 * One interface, two implementations: an in-process hub (inproc.c), for tests,
 * benchmarks and embedded clusters, and libuv TCP (tcp.c) for deployments. The
 * node layer holds a `struct transport *` and does not care which it has.
 *
 * Threading: a transport belongs to the libuv loop it was created on. Every
 * function here, and every callback, runs on that loop's thread. (The inproc
 * hub itself is shared by many loops; see transport_inproc_*.)
 *
 * Ownership on send: transport_send() borrows `m`, including the AppendEntries
 * entries array and every payload blob. Before it returns, the transport has
 * copied or serialized whatever it needs (taking tk_blob references where it
 * passes payloads on without copying), so the caller may raft_advance() at once.
 *
 * Ownership on receive: the message given to recv_cb, its entries array and its
 * blobs are valid only during the callback. A receiver that keeps a payload
 * takes its own tk_blob_ref (raft_step does exactly that). A snapshot arrives
 * whole (offset 0, done), whatever chunking happened on the wire.
 *
 * Order: messages from one sender to one receiver arrive in the order they were
 * sent, or not at all (a connection loss drops what was queued; inproc faults
 * may drop, duplicate or, with a delay distribution, reorder on purpose).
 * Nothing is retried: Raft retries. */
#ifndef TK_TRANSPORT_H
#define TK_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "raft/raft.h"

struct transport;

/* A message for this node. `m` is valid only during the call (see above). */
typedef void transport_recv_cb(struct transport *t, const struct raft_message *m,
                               void *data);
/* Peer `id` became reachable (up) or unreachable (down). For TCP: our outgoing
 * connection to it completed its handshake, or was lost. Informational only:
 * sends to a down peer are queued (TCP, bounded) or dropped (inproc). */
typedef void transport_peer_cb(struct transport *t, uint64_t id, bool up, void *data);
/* Opaque bytes from node `from`, sent with transport_send_forward (the node
 * layer's follower -> leader proposal forwarding and its answers). `buf` is
 * valid only during the call. */
typedef void transport_forward_cb(struct transport *t, uint64_t from, const uint8_t *buf,
                                  size_t len, void *data);
/* TCP handshake: authenticated peer `id` presents the data-directory
 * incarnation `inc` (16 bytes, all zero when it has none). Return false to
 * refuse it (the connection closes; an inbound dialer is told, see
 * `refused`). Called only once the peer's proof checked. */
typedef bool transport_incarnation_cb(struct transport *t, uint64_t id,
                                      const uint8_t *inc, void *data);
/* TCP: may node `id`, which is not an added peer (no address known yet),
 * connect to us? (A member added at run time whose address record this node
 * has not applied yet: it must be heard to learn it.) */
typedef bool transport_member_cb(struct transport *t, uint64_t id, void *data);
/* TCP: peer `by` refused this node's incarnation in the handshake (an
 * authenticated refusal only: a cluster token's proof, or peer TLS). */
typedef void transport_refused_cb(struct transport *t, uint64_t by, void *data);
/* The transport is closed; called once, after which `t` is freed. */
typedef void transport_close_cb(struct transport *t, void *data);

struct transport_callbacks {
    transport_recv_cb *recv;
    transport_peer_cb *peer;               /* may be NULL */
    transport_forward_cb *forward;         /* may be NULL: forwarded bytes are dropped */
    transport_incarnation_cb *incarnation; /* may be NULL: every one accepted */
    transport_refused_cb *refused;         /* may be NULL */
    transport_member_cb *member;           /* may be NULL: added peers only */
    void *data;
};

/* Counters, cumulative since creation; read with transport_stats(). */
struct transport_stats {
    uint64_t msgs_sent;              /* accepted by transport_send */
    uint64_t msgs_received;          /* delivered to recv_cb */
    uint64_t bytes_sent;             /* TCP: bytes written to sockets */
    uint64_t bytes_received;         /* TCP: bytes read from sockets */
    uint64_t bytes_by_ref;           /* TCP: of bytes_sent, entries' bytes written from
                                      * the log's own buffers, not copied into a frame */
    uint64_t send_busy;              /* sends refused with TK_EBUSY (queue full) */
    uint64_t send_dropped;           /* accepted, then dropped (faults, lost conns) */
    uint64_t conns_accepted;         /* TCP: inbound connections accepted */
    uint64_t conns_dialed;           /* TCP: outbound handshakes completed */
    uint64_t conns_failed;           /* TCP: dials that failed or were refused */
    uint64_t conns_bad;              /* TCP: closed for bad input or a bad handshake */
    uint64_t writes;                 /* TCP: uv_write calls (frames coalesce into one) */
    uint64_t fwd_sent;               /* transport_send_forward calls accepted */
    uint64_t fwd_received;           /* forwarded byte strings delivered */
    uint64_t auth_failed;            /* TCP: handshakes refused: a wrong or missing token
                                      * proof, or an id that is not a peer (member) */
    uint64_t msgs_spoofed;           /* TCP: messages dropped, `from` (or `to`) not the
                                      * connection's authenticated ids */
    uint64_t accepts_deferred;       /* TCP: connections left in the listen queue for the
                                        next loop turn (more than 64 in one turn) */
    uint64_t pending_evicted;        /* TCP: unauthenticated connections closed to make
                                      * room for a newer one (pending cap) */
    uint64_t conns_idle;             /* TCP: authenticated inbound closed for idling */
    uint64_t snapshots_dropped;      /* TCP: reassemblies dropped (deadline, memory) */
    uint64_t reads_paused;           /* TCP: a connection's reads put off to the next
                                      * loop turn (over 2 MiB in one turn) */
    uint64_t snapshot_faulted_ahead; /* TCP: bytes of big snapshots' reassembly
                                      * faulted in on the thread pool ahead
                                      * of the chunks */
    uint64_t snapshot_fault_waits;   /* TCP: a connection's reads stopped until
                                      * the pages ahead were faulted in */
};

/* Sends `m` to node m->to, never blocking. Borrows `m` (see above).
 * Returns 0 (queued; delivery is not guaranteed), TK_EBUSY (the peer's bounded
 * queue is full: retry later or let Raft retry), TK_ENOTFOUND (no such peer),
 * TK_ETOOBIG (a message larger than the frame limit, snapshots excepted, which
 * are chunked), TK_EINVAL (malformed message: unknown type, to == self) or
 * TK_ECLOSED (closing). Loop thread only. */
int transport_send(struct transport *t, const struct raft_message *m);

/* Sends `len` opaque bytes to node `to`, never blocking: the channel the node
 * layer forwards proposals (and their answers) on, alongside the Raft messages
 * and with the same order, queue bound and faults. Borrows `buf` (copied
 * before returning). Returns 0, TK_EBUSY, TK_ENOTFOUND, TK_ETOOBIG (above the
 * frame limit), TK_EINVAL (to == self) or TK_ECLOSED, as transport_send.
 * Loop thread only. */
int transport_send_forward(struct transport *t, uint64_t to, const uint8_t *buf,
                           size_t len);

/* Starts closing: stops receiving, drops queues, closes handles, then calls
 * close_cb (which may be NULL) from the loop, never from inside this call.
 * `t` is freed after close_cb returns. Loop thread only; call once. */
void transport_close(struct transport *t, transport_close_cb *close_cb, void *data);

void transport_stats(const struct transport *t, struct transport_stats *out);

/* This node's id. */
uint64_t transport_id(const struct transport *t);

/* ---- In-process hub ------------------------------------------------------
 *
 * A hub connects up to TRANSPORT_INPROC_NODES_MAX endpoints, each on its own
 * loop (nodes may share a loop, or each have a loop on its own thread). A send
 * copies the message header and the entries array and takes references on the
 * payload blobs (no serialization), pushes it onto the target's bounded MPSC
 * queue and wakes the target loop with uv_async_send. The hub is thread-safe;
 * each endpoint is owned by its loop thread.
 *
 * Faults, for tests, per directed link (from -> to), settable from any thread
 * at any time: drop probability, duplicate probability, a uniform delay in
 * [delay_min_ms, delay_max_ms] (which reorders), and a block (partition). The
 * random choices use a PRNG per sending endpoint, seeded from the hub seed and
 * the node id, so a single-threaded run replays. Faults make no peer events:
 * like a real network, a partition is silent.
 *
 * Measured (docs/history/benchmarks-transport.md): nodes sharing one loop thread hand
 * a message over with no syscall and no malloc (3 us round trip); a loop
 * thread per node pays a cross-thread wake-up per hop (36 us on the 2-core VM).
 * Prefer one loop for the nodes of one process. */
#define TRANSPORT_INPROC_NODES_MAX 64

struct uv_loop_s;
struct transport_inproc_hub;

/* Returns a new hub; `seed` drives fault randomness. Thread-safe to use. */
struct transport_inproc_hub *transport_inproc_hub_new(uint64_t seed);
/* Frees the hub. Every endpoint must have completed its close. */
void transport_inproc_hub_free(struct transport_inproc_hub *hub);

/* Attaches node `id` on `loop`. `queue_max` bounds the messages waiting for
 * this node (0 = 4096, rounded up to a power of two; a full queue makes the
 * sender's transport_send return TK_EBUSY). Other attached nodes get a peer-up event for
 * it and it gets one for each of them. Returns 0, TK_EINVAL (id 0, or already attached)
 * or TK_EBUSY (the hub is full). Call on `loop`'s thread. */
int transport_inproc_new(struct transport_inproc_hub *hub, struct uv_loop_s *loop,
                         uint64_t id, uint32_t queue_max,
                         const struct transport_callbacks *cbs, struct transport **out);

struct transport_link_faults {
    double drop; /* probability a message is dropped */
    double dup;  /* probability a message is delivered twice */
    uint32_t delay_min_ms;
    uint32_t delay_max_ms; /* 0: no delay */
    bool blocked;          /* partitioned: everything is dropped */
};

/* Sets the faults of the directed link from -> to (ids need not be attached
 * yet). Returns TK_EINVAL for a zero id or TK_EBUSY if the hub tracks
 * TRANSPORT_INPROC_NODES_MAX ids already. Any thread. */
int transport_inproc_set_faults(struct transport_inproc_hub *hub, uint64_t from,
                                uint64_t to, const struct transport_link_faults *f);
/* Blocks both directions between a and b (symmetric partition); `one_way`
 * blocks only a -> b. */
int transport_inproc_partition(struct transport_inproc_hub *hub, uint64_t a, uint64_t b,
                               bool one_way);
/* Clears every fault on every link. */
void transport_inproc_heal(struct transport_inproc_hub *hub);

/* ---- TCP -----------------------------------------------------------------
 *
 * One connection per peer direction: we dial each peer and send on that
 * connection; peers dial us and we receive on the accepted ones. The handshake
 * (protocol version 4; an older peer is refused, so a cluster upgrades by
 * restarting every node) is four frames: the dialer's HELLO (magic, version,
 * flags, cluster id, node id, a 32-byte random nonce, its data directory's
 * 16-byte incarnation); the acceptor's HELLO (the same, its own nonce, and its
 * proof); the dialer's AUTH (its proof); the acceptor's verdict, WELCOME or
 * REFUSE (a proof each). With a cluster token (peer_token), a proof is an
 * HMAC-SHA256 of the token over a label and both HELLOs whole, so it covers
 * every field both sides said (ids, flags, cluster id, incarnations, both
 * fresh nonces), compared in constant time: each side proves it knows the
 * token, no recorded proof is valid in another handshake, and no field can be
 * changed on the way. Nothing a peer says is acted on before its proof is
 * checked: the acceptor asks its node about the dialer's incarnation
 * (callbacks.incarnation) only once the AUTH checks, and the dialer asks about
 * the acceptor's once the acceptor's HELLO checks. A refused dialer gets the
 * REFUSE before the close, and callbacks.refused tells its node, only when
 * the REFUSE's proof checks (or peer TLS carried it): a refusal nothing
 * authenticates is a failed dial, logged and retried. The token authenticates
 * the handshake only: it does not encrypt or sign the frames after it (an
 * on-path attacker is out of scope; use peer TLS, a private network or a
 * tunnel). Both sides must have a token, or neither (then anyone who can
 * reach the port may claim a member id).
 *
 * An inbound connection must name a peer added with transport_tcp_add_peer
 * or one callbacks.member accepts (the members); anything else is refused. It counts as
 * pending until its AUTH is checked: pending ones have handshake_timeout_ms to finish,
 * at most TRANSPORT_TCP_PENDING_PER_ADDR of them come from one remote address and at most
 * TRANSPORT_TCP_PENDING_MAX exist in all. A new one past the address's cap evicts one of
 * that address's; past the total, one of the address with the most; in both cases the
 * oldest that has sent nothing yet, else the oldest that has sent only bytes (with peer
 * TLS: no ClientHello answered yet), else the oldest. An authenticated connection is
 * never evicted, so a flood of sockets cannot shut a member out: it only evicts its own,
 * and a member's handshake completes within its round trip. Once authenticated it
 * replaces any older inbound connection of the same id, and is closed after
 * idle_timeout_ms without a frame (dialers send a PING on an idle link). Raft messages
 * whose `from` is not the authenticated id are dropped and counted (msgs_spoofed).
 * Snapshot reassembly is bounded per connection (snapshot_max), in total
 * (snapshot_total_max) and in time (snapshot_timeout_ms from its first chunk). A mismatch
 * closes the connection with a logged reason and counts it in conns_bad.
 *
 * Sends are framed into a per-peer buffer; everything queued during one loop
 * turn leaves in one uv_write of iovecs. The queued bytes per peer are bounded
 * (send_queue_bytes); a full queue refuses with TK_EBUSY. Forwarded bytes
 * (transport_send_forward) may fill only a quarter of it (one frame, however
 * large, when no forwarded frame is queued or being written): beyond that a
 * forward is refused with TK_EBUSY, so Raft messages always find room and a
 * heartbeat waits behind at most max(send_queue_bytes / 4, one frame) bytes
 * of forwards. A lost or refused
 * connection is redialed with exponential backoff (backoff_min_ms doubling up
 * to backoff_max_ms) with jitter (a uniform factor in [0.5, 1]). Bad input on
 * any connection (bad CRC, oversized length, garbage, a frame not completed
 * within io_timeout_ms, an unknown frame kind or message type) closes that
 * connection only. */
struct transport_tcp_options {
    uint64_t id;
    uint64_t cluster_id;
    const char *listen_host;       /* e.g. "127.0.0.1"; NULL: do not listen */
    uint16_t listen_port;          /* 0: pick one (see transport_tcp_port) */
    uint32_t frame_max;            /* largest frame payload; 0 = 4 MiB; the same on
                                    * every node (a larger frame closes the link) */
    uint32_t snapshot_chunk;       /* snapshot bytes per frame; 0 = 256 KiB */
    uint32_t read_turn_bytes;      /* bytes a connection hands in per loop turn
                                    * before its reads wait for the next; 0 = 2 MiB */
    uint64_t snapshot_max;         /* largest snapshot accepted; 0 = 16 GiB */
    uint64_t send_queue_bytes;     /* per peer; 0 = 8 MiB */
    uint32_t backoff_min_ms;       /* 0 = 50 */
    uint32_t backoff_max_ms;       /* 0 = 5000 */
    uint32_t io_timeout_ms;        /* handshake / partial frame deadline; 0 = 10000 */
    uint64_t seed;                 /* backoff jitter */
    const uint8_t *peer_token;     /* shared cluster token, copied; NULL: none */
    size_t peer_token_len;         /* at least TRANSPORT_TCP_TOKEN_MIN when set */
    uint32_t handshake_timeout_ms; /* inbound, unauthenticated; 0 = 2000 */
    uint32_t idle_timeout_ms;      /* inbound, authenticated; 0 = 60000 */
    uint32_t snapshot_timeout_ms;  /* one snapshot's reassembly; 0 = 600000 */
    uint64_t snapshot_total_max;   /* all reassemblies; 0 = snapshot_max */
    /* Peer mutual TLS (tls/tls.h; borrowed, they outlive the transport):
     * both set, or neither. Every connection is TLS, both sides show a
     * certificate chaining to the context's CA, and a peer's certificate must
     * name "node-<id>" (a DNS SAN, or the CN without one) for the id its
     * HELLO claims. Beside a peer_token or instead of it. */
    struct tk_tls_ctx *tls_server; /* for inbound connections */
    struct tk_tls_ctx *tls_client; /* for the connections we dial */
    uint8_t incarnation[16];       /* this node's data directory's; sent in HELLO */
};

#define TRANSPORT_TCP_TOKEN_MIN 16
#define TRANSPORT_TCP_PENDING_MAX 64
#define TRANSPORT_TCP_PENDING_PER_ADDR 16

void transport_tcp_options_default(struct transport_tcp_options *o);

/* Creates a TCP transport on `loop` and starts listening. The listen host is
 * a numeric IPv4 or IPv6 address (a name cannot be bound; peers may be names,
 * see transport_tcp_add_peer). Returns 0, TK_EINVAL (id 0, bad
 * address, frame_max below 4 KiB, snapshot_chunk + 1 KiB above frame_max) or
 * TK_EIO (bind or listen failed; the reason is logged, and the half-made
 * transport's handles are closing on `loop`: run it to release them).
 * A peer_token shorter than TRANSPORT_TCP_TOKEN_MIN is TK_EINVAL. */
int transport_tcp_new(struct uv_loop_s *loop, const struct transport_tcp_options *o,
                      const struct transport_callbacks *cbs, struct transport **out);
/* The port we listen on (useful with listen_port 0); 0 when not listening. */
uint16_t transport_tcp_port(const struct transport *t);
/* Adds peer `id` at host:port and starts dialing it. `host` is an IPv4 or IPv6
 * literal or a DNS name; a name is resolved (uv_getaddrinfo, on libuv's thread
 * pool, IPv4 preferred) again before every dial, so a peer that comes back on
 * another address is found; a failed lookup counts as a failed dial and is
 * retried with backoff. `host` is copied. Returns 0, TK_ECLOSED (closing),
 * TK_EINVAL (id 0, self, duplicate, a host that is neither a literal nor a
 * valid name, a name with port 0). Loop thread. */
int transport_tcp_add_peer(struct transport *t, uint64_t id, const char *host,
                           uint16_t port);
/* Stops dialing peer `id` (a removed member): its connection, in and out,
 * is closed, its queue dropped (a peer callback reports it down if it was
 * up), and sends to it fail as to any unknown peer. It may be added again.
 * Returns 0, TK_ECLOSED (closing), TK_ENOTFOUND (not a peer). Loop thread. */
int transport_tcp_remove_peer(struct transport *t, uint64_t id);
/* The peer records the transport holds: its current peers, plus removed ones
 * that something of theirs still names while it closes (a connection, the
 * backoff timer, a write or a name lookup in flight). A removed peer's record
 * is freed when the last of these ends, a loop turn or so after its removal,
 * so the count never grows with the removals seen. Loop thread. */
size_t transport_tcp_peer_records(const struct transport *t);

#endif
