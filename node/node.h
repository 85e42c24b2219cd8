/* The node runtime: drives one pure Raft core (raft/) with real storage
 * (store/), a transport (transport/) and the KV state machine (kv/).
 *
 * Threads. A node owns one thread running one libuv loop: the consensus loop,
 * the only writer of Raft state. On that loop it steps the core, hands entries
 * to the store's storage thread (group commit), sends messages, and applies
 * committed entries to the state machine (the apply stage runs on the loop
 * thread: on this 2-core VM a wake-up of another thread costs about 40 us each
 * way, more than applying a whole batch; docs/architecture.md has the
 * numbers). Other threads talk to the node only through node_submit() and
 * node_read(), which push a request onto a bounded MPSC queue and wake the loop
 * with uv_async_send. Completions run on the loop thread.
 *
 * A write submitted on a follower is forwarded to the leader over the
 * transport (a FORWARD frame) and completes here with the leader's answer.
 *
 * The path of a write: node_submit -> queue -> (loop turn) drain a burst into
 * one raft_propose batch -> ready: store_append_async + sends in parallel ->
 * store callback (storage thread) -> uv_async -> raft_persisted -> commit ->
 * committed-mode requests complete -> apply -> applied-mode requests complete
 * with the state machine's result. */
#ifndef TK_NODE_NODE_H
#define TK_NODE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/blob.h"
#include "base/hist.h"
#include "kv/kv.h"
#include "raft/raft.h"

struct transport_inproc_hub;
struct uv_loop_s;
struct node;

/* Runs on the node's loop thread: at start (after recovery, before the first
 * tick) and at stop (before the loop winds down; it must uv_close every handle
 * it opened, the loop runs until they are closed). Requests still pending
 * when on_loop_stop returns then complete with TK_ESHUTDOWN, on the loop, so
 * their owner must keep what their callbacks touch alive until then. Lets a
 * gateway share the node's loop, so a request costs no thread hop. */
typedef void node_hook_cb(struct node *n, struct uv_loop_s *loop, void *data);

enum node_mode {
    NODE_MODE_APPLIED = 0,   /* complete once applied, with the sm's result */
    NODE_MODE_COMMITTED = 1, /* complete once a majority holds the entry */
};

enum node_read_kind {
    NODE_READ_GET = 0,
    NODE_READ_SCAN = 1,
};

enum node_consistency {
    NODE_READ_LINEARIZABLE = 0, /* ReadIndex (thesis 6.4) */
    NODE_READ_STALE = 1,        /* local state, no round trip */
};

struct node_req;

/* A write finished. `status` is 0 (and `res` holds the sm's result in applied
 * mode; only res->revision in committed mode), TK_ENOLEADER, TK_ENOTLEADER
 * (forwarded to a node that is no longer leader), TK_EBUSY,
 * TK_ELOST (leadership changed and the entry was replaced), TK_ETIMEDOUT,
 * TK_ESHUTDOWN or TK_EIO. Runs on the node's loop thread; `res` is borrowed. */
typedef void node_write_cb(struct node_req *req, int status, const struct kv_result *res,
                           void *data);

/* A read may run. Called on the loop thread when the state is at least as new
 * as the consistency asks (status 0), or with an error (TK_ENOLEADER,
 * TK_ETIMEDOUT, TK_ESHUTDOWN). With status 0 the callback reads the state
 * machine itself through `sm` (kv_sm_get / kv_sm_scan), only during the call.
 * A linearizable read fails with TK_ENOLEADER as soon as the leader it asked
 * is no longer the one this node knows (this node was deposed, or, on a
 * follower, it gave up on that leader): no answer can be counted on, and a
 * failed read changes nothing. */
typedef void node_read_cb(struct node_req *req, int status, struct kv_sm *sm, void *data);

/* A request, allocated and owned by the caller, untouched by the caller from
 * node_submit/node_read until its callback has run. */
struct node_req {
    /* Set by the caller. */
    uint8_t is_read;
    uint8_t mode;        /* enum node_mode (writes) */
    uint8_t consistency; /* enum node_consistency (reads) */
    struct tk_blob *cmd; /* writes: an encoded kvpb.Command; the node takes
                            this reference */
    node_write_cb *write_cb;
    node_read_cb *read_cb;
    void *data;
    uint64_t timeout_ms; /* 0: the node's default */

    /* Owned by the node. A read and a write this node proposes have an index
     * (and the write a term); a write it forwards to the leader has a token
     * instead. */
    union {
        struct {
            uint64_t index;
            uint64_t term;
        };
        uint8_t token[16]; /* forwarded writes: the request's random token */
    };
    uint64_t ctx;
    uint64_t asked; /* reads: the leader asked for the index (0: self);
                       forwarded writes: the leader they went to */
    uint64_t deadline_ms;
    struct node_req *next;
};

struct node_options {
    uint64_t id;
    uint64_t cluster_id;
    struct raft_config members; /* every voter's id, this node's included */

    /* Transport: inproc when `hub` is set, else TCP with the addresses. */
    struct transport_inproc_hub *hub;
    const char *listen_host;
    uint16_t listen_port;
    const char *peer_hosts[RAFT_VOTERS_MAX]; /* by position in members */
    uint16_t peer_ports[RAFT_VOTERS_MAX];
    /* The shared cluster token of the TCP handshake (transport.h; copied by
     * the transport): NULL for none, else at least TRANSPORT_TCP_TOKEN_MIN
     * bytes, the same on every node. */
    const uint8_t *peer_token;
    size_t peer_token_len;

    /* Storage: fs under data_dir/log and data_dir/kv when `data_dir` is set,
     * else a memory volume (taken, may be NULL: a fresh one). */
    const char *data_dir;
    struct store_mem_volume *volume;
    bool kv_no_sync;     /* the kv cold tier without fsync (tests, benchmarks) */
    size_t kv_map_bytes; /* LMDB map size of the kv cold tier; 0: kv's default */
    size_t events_max;   /* the kv change log's events (kv_config.events_max) */
    size_t events_bytes; /* ... and bytes; both 0: kv's defaults */

    uint32_t tick_ms;        /* 10 */
    uint32_t election_ticks; /* 20: 200-400 ms */
    /* The leader checkpoints the leases' remaining TTLs this often: 200 (a
     * lease outlives its TTL by at most this plus an election per leader
     * change). */
    uint32_t lease_checkpoint_ms;
    uint32_t heartbeat_ticks;  /* 2 */
    uint32_t queue_max;        /* proposal+read queue bound: 65536 */
    uint32_t batch_max;        /* entries per raft_propose: 4096 */
    uint64_t timeout_ms;       /* default request deadline: 10000 */
    uint64_t snapshot_entries; /* compact once this many entries are applied
                                  past the last snapshot: 100000 */
    uint64_t snapshot_bytes;   /* ... or once this many payload bytes are:
                                  64 MiB (0: no byte threshold) */
    uint64_t trailing_entries; /* entries kept behind a snapshot: 10000 */
    uint64_t seed;
    /* After a loop turn that did work, keep polling (without sleeping) for this
     * long before blocking: a message or request arriving meanwhile costs no
     * thread wake-up (about 40 us on a VM) but the loop burns up to this much
     * CPU after each burst. 0 = block at once. */
    uint32_t spin_us;

    /* A loop shared with other nodes (an in-process cluster on one thread:
     * no wake-ups between nodes), run by the caller on one thread. NULL: the
     * node starts its own thread and loop. With a shared loop, node_start
     * runs on that loop's thread or before the loop runs, and node_stop on
     * any other thread while the loop runs. Inproc transport only. */
    struct uv_loop_s *loop;

    node_hook_cb *on_loop_start;
    node_hook_cb *on_loop_stop;
    /* After a loop step applied entries (the change log, kv_sm_events_*,
     * has new events): lets a watch follow them without polling. */
    node_hook_cb *on_applied;
    void *hook_data;
};

void node_options_default(struct node_options *o);

/* Starts the node's thread, opens its store and state machine, recovers and
 * joins the cluster. Blocks until it runs or fails. Returns 0, TK_EINVAL (bad
 * options), TK_ECORRUPT/TK_EIO (storage) with a logged reason. */
int node_start(const struct node_options *o, struct node **out);

/* Stops: pending requests complete with TK_ESHUTDOWN, the store and the sm are
 * closed, the thread joins, the node is freed. Blocks. Not from a callback. */
void node_stop(struct node *n);

/* The largest command a write may carry: the transport's 4 MiB frame limit
 * (transport_tcp_options.frame_max, the same on every node) less room for the
 * AppendEntries message around one entry. A larger entry could never be
 * replicated, so node_submit refuses it (TK_ETOOBIG) and tierkvd refuses to
 * start with a --max-body-bytes above the frame limit. */
#define NODE_FRAME_MAX (4u << 20)
#define NODE_ENTRY_MAX (NODE_FRAME_MAX - 4096u)

/* Queues a write (req->cmd) or a read. Any thread (the loop thread too: a
 * gateway on the node's loop submits from there), never blocks. Returns 0
 * (the callback will run exactly once) or TK_EBUSY (queue full) / TK_ESHUTDOWN /
 * TK_ETOOBIG (a command over NODE_ENTRY_MAX) (the callback will not run). */
int node_submit(struct node *n, struct node_req *req);

/* The node's state machine, for reading on the loop thread only (from a
 * hook or a loop callback of the gateway): the change log
 * (kv_sm_events_read) and what the hooks need. Valid until on_loop_stop. */
struct kv_sm *node_kv(struct node *n);

/* What the node knows; any thread (values are published by the loop). */
struct node_status {
    uint64_t id;
    uint64_t term;
    uint64_t leader;
    int role;
    uint64_t commit;
    uint64_t applied;
    uint64_t last_index;
    uint64_t snapshot_index;
    bool failed; /* storage or apply failed: the node serves nothing */
};
void node_status(struct node *n, struct node_status *out);

/* Asks the leader to hand leadership to `to` (thesis 3.10). Any thread;
 * returns once the loop has passed the request to the core. */
int node_transfer_leadership(struct node *n, uint64_t to);

/* Counters for /metrics; any thread (published by the loop each turn). */
struct node_metrics {
    uint64_t proposals;         /* writes proposed by this node */
    uint64_t batches;           /* raft_propose calls */
    uint64_t forwarded;         /* writes forwarded to the leader */
    uint64_t forward_dropped;   /* forwarding frames from a non-member, dropped */
    uint64_t reads;             /* reads served */
    uint64_t read_index;        /* linearizable reads that asked for a read index */
    uint64_t read_index_rounds; /* leader: heartbeat rounds confirming them
                                   (raft_read_rounds) */
    uint64_t applied_entries;
    uint64_t snapshots;   /* snapshots taken */
    uint64_t installs;    /* snapshots installed from a leader */
    uint64_t store_syncs; /* log syncs (store_stats.syncs) */
    uint64_t store_bytes; /* payload bytes appended to the log since start
                             (store_stats.bytes; a counter, not a size) */
    /* The state machine's size (kv_sm_stats). */
    uint64_t kv_ring_bytes;   /* ring pages held: the hot tier's memory */
    uint64_t kv_hot_keys;     /* keys in the hot index */
    uint64_t kv_cold_keys;    /* keys in the cold tier (LMDB) */
    uint64_t kv_cold_bytes;   /* the cold tier's LMDB file in use */
    uint64_t store_log_bytes; /* the Raft log's bytes (store_log_bytes) */
    uint64_t kv_tier_downs;   /* tier-down transactions committed */
    uint64_t kv_bad_records;  /* ring records that failed their check */
    uint64_t net_bytes_sent;
    uint64_t net_bytes_received;
    uint64_t net_reconnects;
    /* The loop's turns (one pass of the node's loop, callbacks of every kind,
     * without the time blocked waiting for events): the longest so far by
     * the phase most of it went to (enum node_turn_phase), and the snapshot
     * and tier-down work done on the loop. */
    uint64_t loop_turn_max_ns[9];
    uint64_t snapshot_loop_ns;  /* publishing snapshots, in all */
    uint64_t tier_drain_ns;     /* dropping released index entries, in all */
    uint64_t tier_drain_max_ns; /* the longest slice of it */
    /* Memory by owner, bytes (kv_sm_stats; LMDB's from the kernel). */
    uint64_t mem_index_bytes;    /* the hot index's table */
    uint64_t mem_view_bytes;     /* the ordered view (the hot keys in order) */
    uint64_t mem_sessions_bytes; /* the exactly-once session table */
    uint64_t mem_lmdb_mapped;    /* the cold tier's map size */
    uint64_t mem_lmdb_resident;  /* of it, pages in memory (mincore) */
};
void node_metrics(struct node *n, struct node_metrics *out);

/* What a loop turn's time went to (node_metrics.loop_turn_max_ns): the
 * ready loop's steps, starting a snapshot (snapshot), publishing a tier-down
 * and dropping its index entries (tier), compacting the log (compact), and
 * the rest of the turn (other: transport reads, timers, the gateway, other
 * handles). */
enum node_turn_phase {
    NODE_PH_READY,
    NODE_PH_STORE,
    NODE_PH_SEND,
    NODE_PH_APPLY,
    NODE_PH_ADVANCE,
    NODE_PH_SNAPSHOT,
    NODE_PH_TIER,
    NODE_PH_COMPACT,
    NODE_PH_OTHER,
    NODE_PH_N
};
/* "ready", "store", ... "other"; NULL past NODE_PH_N. */
const char *node_turn_phase_name(int phase);

/* Latency histograms in nanoseconds (base/hist.h), and the proposal batch
 * sizes. Loop thread only: a gateway on the node's loop reads them in place;
 * they stay valid until node_stop. node_latency first refreshes `fsync` from
 * the store (store_sync_latency: a 30 KiB copy), so call it per scrape, not
 * per request. */
struct node_latency {
    struct tk_hist append;     /* a batch handed to storage -> durable */
    struct tk_hist fsync;      /* one log sync on the storage thread */
    struct tk_hist apply;      /* applying one ready's committed entries */
    struct tk_hist batch_size; /* entries per raft_propose */
    struct tk_hist loop_turn;  /* one loop turn (see node_metrics) */
};
const struct node_latency *node_latency(struct node *n);

/* The node's inproc transport faults, for tests: cut this node off from every
 * peer (both directions) or heal. Only for inproc nodes. Any thread. */
int node_isolate(struct node *n, bool isolated);

#endif
