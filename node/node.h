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
struct tk_tls_ctx;

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
    /* With the client loop (node_options.on_client_start): the callback runs
     * on the client loop's thread instead of the node's. A write's result is
     * copied into *res_out first (required for such a write; only the ops
     * the result has); a read's callback runs holding the node's state lock
     * (node_client_lock), so it reads the state machine as on the loop. */
    uint8_t on_client;
    struct kv_result *res_out;
    /* With on_client, a read may copy out what it needs instead: collect_cb
     * runs on the node's loop when the read may run (status 0 only, `sm`
     * valid during the call; it touches nothing but the request's own
     * memory), and read_cb then runs on the client loop without the state
     * lock, with `sm` NULL. The consensus loop pays the lookup and the copy,
     * not a hand-over of the lock per batch of reads (two wake-ups); so copy
     * only what is small. collect_cb may decline, by setting
     * req->collect_cb to NULL: read_cb then reads in place under the lock
     * as without it. */
    node_read_cb *collect_cb;

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
    int client_status; /* on_client: the status its callback gets */
    bool client_res;   /* ... and whether res_out holds its result */
    struct node_req *next;
};

struct store_fileops;

struct node_options {
    uint64_t id;
    uint64_t cluster_id;
    struct raft_config members; /* every voter's id, this node's included; with
                                   `join`, the cluster's (this node not in it) */
    /* A new node joining a running cluster: it has no bootstrap
     * configuration of its own (its id is not in `members`, which lists the
     * running cluster's voters and addresses so it can reach them) and waits
     * to be added (node_member_change on the leader). */
    bool join;

    /* Transport: inproc when `hub` is set, else TCP with the addresses. */
    struct transport_inproc_hub *hub;
    const char *listen_host;
    uint16_t listen_port;
    const char *peer_hosts[RAFT_VOTERS_MAX]; /* by position in members */
    uint16_t peer_ports[RAFT_VOTERS_MAX];
    /* The members' HTTP addresses (tierkvd's --members-http), by position in
     * members, NULL when not given: the leader writes them into the member
     * records, so every node can name the leader's address. */
    const char *peer_http[RAFT_VOTERS_MAX];
    /* The shared cluster token of the TCP handshake (transport.h; copied by
     * the transport): NULL for none, else at least TRANSPORT_TCP_TOKEN_MIN
     * bytes, the same on every node. */
    const uint8_t *peer_token;
    size_t peer_token_len;
    /* Peer mutual TLS (transport.h's tls_server and tls_client; borrowed,
     * they outlive the node): both or neither. */
    struct tk_tls_ctx *peer_tls_server;
    struct tk_tls_ctx *peer_tls_client;

    /* Storage: fs under data_dir/log and data_dir/kv when `data_dir` is set,
     * else a memory volume (taken, may be NULL: a fresh one). */
    const char *data_dir;
    struct store_mem_volume *volume;
    /* The fs store's file operations (tests inject faults); NULL: the real
     * ones. */
    const struct store_fileops *store_fileops;
    bool kv_no_sync;       /* the kv cold tier without fsync (tests, benchmarks) */
    size_t kv_map_bytes;   /* LMDB map size of the kv cold tier; 0: kv's default */
    size_t kv_ring_bytes;  /* the kv ring's (hot tier's) budget; 0: kv's, 64 MiB */
    int kv_writeback_pace; /* a background tier-down's LMDB writeback paced
                              (kv_config.writeback_pace); 0: kv's, 3; < 0: not
                              paced */
    /* A snapshot's read of the whole state (beside the tier-downs, or in a
     * snapshot job: kv_config.read_pace) sleeps N times the CPU time it uses
     * (tk_pace_cpu); 0: 3; < 0: not paced. */
    int snapshot_read_pace;
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
    uint64_t trailing_entries; /* entries kept behind a snapshot: 10000, and
                                  at most snapshot_bytes of payload */
    uint64_t seed;
    /* After a loop turn that did work, keep polling (without sleeping) for this
     * long before blocking: a message or request arriving meanwhile costs no
     * thread wake-up (about 40 us on a VM) but the loop burns up to this much
     * CPU after each burst; each pass with nothing due yields the CPU to any
     * other runnable thread first. 0 = block at once. */
    uint32_t spin_us;
    /* A follower writes and syncs an append on its loop when its storage
     * thread is idle and the last sync took at most this long: no hand-off
     * to the storage thread and back (two thread wake-ups on every write's
     * path), for a loop held through one sync, however long that one takes
     * (a disk's stall: 59-122 ms turns at millions of keys on a shared
     * disk). After a slower sync the appends go to the storage thread until
     * one is fast again. The leader always hands its appends over (its
     * AppendEntries and its own sync run in parallel). 0 (the default) =
     * followers hand every append over. */
    uint32_t follower_inline_sync_us;
    /* The stall probe (node_stall.c): a thread that, while one loop turn has
     * run this long (and at each further multiple, up to 4 times), logs what
     * the loop thread is doing as the kernel sees it: its state, system call,
     * wait channel and kernel stack. It looks every stall_probe_ms / 4. Only
     * with the node's own loop thread. 0 = off. */
    uint32_t stall_probe_ms;

    /* A loop shared with other nodes (an in-process cluster on one thread:
     * no wake-ups between nodes), run by the caller on one thread. NULL: the
     * node starts its own thread and loop. With a shared loop, node_start
     * runs on that loop's thread or before the loop runs, and node_stop on
     * any other thread while the loop runs. Inproc transport only. */
    struct uv_loop_s *loop;

    /* Disaster recovery (--force-new-cluster): at start, append a
     * configuration entry that makes this node the only voter, keeping every
     * entry of its log (node_restore.c). Then add the others back as new
     * members. */
    bool force_new_cluster;

    node_hook_cb *on_loop_start;
    node_hook_cb *on_loop_stop;
    /* After a loop step applied entries (the change log, kv_sm_events_*,
     * has new events): lets a watch follow them without polling. */
    node_hook_cb *on_applied;
    void *hook_data;

    /* The client loop (node_client.c; issue 48): with on_client_start set,
     * the node starts a second thread, "tk-client-<id>", with a libuv loop
     * of its own, for client work (an HTTP gateway), so that no client can
     * hold the consensus loop. These hooks run on that thread, as the
     * on_loop_* ones run on the node's: at start (after recovery; node_start
     * returns once it has run), at stop (once the consensus loop has ended
     * and every request's callback has run: no callback comes after it; it
     * must uv_close every handle it opened on the client loop, node_stop
     * waits for that), and after the node applied entries (coalesced: one
     * call for any number of applies since the last; only while the client
     * wants them: node_client_want_applied). Until on_client_stop,
     * while the node stops, node_submit refuses (TK_ESHUTDOWN) and
     * node_client_lock says no. A request with on_client set completes on
     * the client loop, many in one wake-up (below). Needs the node's own
     * loop thread (not `loop`). */
    node_hook_cb *on_client_start;
    node_hook_cb *on_client_stop;
    node_hook_cb *on_client_applied;
    void *client_hook_data;
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
 * gateway on the node's loop submits from there), never blocks. On the
 * client loop's thread it only queues: the consensus loop is woken once at
 * the end of the client loop's turn. Returns 0
 * (the callback will run exactly once) or TK_EBUSY (queue full) / TK_ESHUTDOWN /
 * TK_ETOOBIG (a command over NODE_ENTRY_MAX) (the callback will not run). */
int node_submit(struct node *n, struct node_req *req);

/* The node's state machine, for reading on the loop thread only (from a
 * hook or a loop callback of the gateway), or on the client loop's thread
 * holding node_client_lock: the change log (kv_sm_events_read) and what the
 * hooks need. Valid until on_loop_stop. */
struct kv_sm *node_kv(struct node *n);

/* The node's state lock, for the client loop's thread (node_options.
 * on_client_start): the consensus loop holds it, and hands it over at the
 * end of a turn to a client that asks (waking the loop), so a client holding
 * it may read the state machine (node_kv) and call the functions this header
 * says are for the loop thread only (node_members, node_member_http,
 * node_member_change, node_backup_start), for as long as it holds it: the
 * consensus loop waits meanwhile, so hold it briefly, for bounded work.
 * Returns false, not holding it, once the node is stopping (its state is
 * then not to be touched). A read's callback on the client loop holds it
 * already; taking it again there only counts. `changed`: the client started
 * something (node_member_change, node_backup_start), and the consensus loop
 * is woken to go on with it. */
bool node_client_lock(struct node *n);
void node_client_unlock(struct node *n, bool changed);

/* Whether on_client_applied runs (off at start): a wake-up of the client
 * loop per apply costs its CPU when nothing there follows the change log.
 * Counted, for several users of one client loop (a gateway's watches, the
 * etcd API's): each `true` is undone by one `false`; it runs while more
 * `true`s than `false`s were said. */
void node_client_want_applied(struct node *n, bool on);

/* Runs fn(arg) on the client loop, after the completions posted before it:
 * for a callback the node runs on its own loop (node_member_change's,
 * node_backup_start's) whose work belongs to the client loop. Any thread
 * until the consensus loop has ended (every call posted by then runs before
 * on_client_stop). Without a client loop, fn(arg) runs at once. */
typedef void node_call_fn(void *arg);
void node_client_call(struct node *n, node_call_fn *fn, void *arg);

/* The state machine's applied index, without the state lock; any thread.
 * A completion sees at least its own entry's index; under the state lock
 * (or on the loop thread) it is kv_sm_applied_index(node_kv(n)). */
uint64_t node_applied_index(struct node *n);

/* Backups (node_backup.c): a consistent snapshot stream of the state machine
 * (kv.h, "Snapshots") at an applied index at or past the one applied when
 * asked, so every write acknowledged before the call is in it. It is the
 * Raft snapshot path: the newest snapshot when it is recent enough, else a
 * new snapshot job on the thread pool (the LMDB read transaction lasts only
 * for its copy). Loop thread only (the gateway's). cb runs once, on the
 * loop, later (never inside node_backup_start): status 0 with a reference on
 * `stream` that the callee owns (tk_blob_unref), or TK_EIO (the node
 * failed), TK_ESHUTDOWN (stopping). The handle is freed after cb (a node
 * that closes runs it with TK_ESHUTDOWN). Returns 0, or TK_EBUSY
 * (NODE_BACKUPS_MAX waiting), TK_EIO, TK_ESHUTDOWN (cb will not run). */
#define NODE_BACKUPS_MAX 4
struct tk_blob;
struct node_backup;
typedef void node_backup_cb(int status, struct tk_blob *stream, uint64_t index,
                            uint64_t term, void *data);
int node_backup_start(struct node *n, node_backup_cb *cb, void *data,
                      struct node_backup **out);
/* The cluster id this node was started with (loop or any thread). */
uint64_t node_cluster_id(const struct node *n);

/* Restore (node_restore.c): makes `data_dir` (missing or empty, else
 * TK_EINVAL) the data directory of node `id` of a new cluster from the backup
 * file `file` (kv/backup.h), which is checked twice (before, and while it is
 * installed). The cluster id must differ from the backup's (TK_EINVAL), so
 * that the old cluster's nodes are refused by the new one. Every node of the
 * new cluster restores the same file with the same `members`. Blocks; before
 * node_start. Returns 0 with *info (may be NULL) the backup's header, or
 * TK_EINVAL / TK_ECORRUPT / TK_EIO with the reason (for a damaged file: the
 * byte offset) in err; on failure the directory is left empty. */
struct kv_backup_info;
struct node_restore_options {
    const char *file;
    const char *data_dir;
    uint64_t id;
    uint64_t cluster_id;
    struct raft_config members;
    bool kv_no_sync;
};
int node_restore(const struct node_restore_options *o, struct kv_backup_info *info,
                 char *err, size_t err_cap);

/* What the node knows; any thread (values are published by the loop). */
struct node_status {
    uint64_t id;
    uint64_t term;
    uint64_t leader;
    int role;
    uint64_t commit;
    uint64_t applied;
    uint64_t last_index;
    uint64_t last_term; /* of last_index: with it, picks the survivor to recover */
    uint64_t snapshot_index;
    bool failed; /* storage or apply failed: the node serves nothing */
    /* A member refused this node's data directory in the handshake: its id
     * belongs to a data directory this one is not (it was wiped). It serves
     * nothing: remove the id and add the node again under a new one. */
    bool rejected;
    /* This node's id was removed from the cluster: the configuration it
     * holds leaves it out (a bootstrap member), or its member record says
     * removed=1 and it knows no leader or is out of its configuration. Ids
     * are never reused: to serve again it joins under a new id. */
    bool removed;
};
void node_status(struct node *n, struct node_status *out);

/* Asks the leader to hand leadership to `to` (thesis 3.10). Any thread;
 * returns once the loop has passed the request to the core. */
int node_transfer_leadership(struct node *n, uint64_t to);

/* Writes whose command is this large or larger are "large": the leader keeps
 * few of them in the pipeline at a time (node_gate.c), and a small write
 * submitted after one may be proposed before it. A submitter that needs two
 * writes in order waits for the large one's answer first (the gateway holds
 * a connection's later requests until then). */
#define NODE_GATE_ENTRY_BYTES (32u << 10)

/* Counters for /metrics; any thread (published by the loop each turn). */
struct node_metrics {
    uint64_t proposals; /* writes proposed by this node */
    uint64_t batches;   /* raft_propose calls */
    uint64_t forwarded; /* writes forwarded to the leader */
    /* The leader's gate for large writes (node_gate.c): writes held, in all;
     * refused past its bound (TK_EBUSY); held now (a gauge). */
    uint64_t gate_held_total;
    uint64_t gate_refused;
    uint64_t gate_held;
    uint64_t gate_rests;        /* pauses for competing smaller writes */
    uint64_t forward_dropped;   /* forwarding frames from a non-member, dropped */
    uint64_t forward_orphaned;  /* forwarded writes ended (outcome unknown) when
                                   another leader was known */
    uint64_t members_refused;   /* handshakes refused: a member id presenting
                                   another data directory (an amnesiac) */
    uint64_t reads;             /* reads served */
    uint64_t read_index;        /* linearizable reads that asked for a read index */
    uint64_t read_index_rounds; /* leader: heartbeat rounds confirming them
                                   (raft_read_rounds) */
    uint64_t acks_merged;       /* follower: append acks folded into the next
                                   one to the leader (raft_acks_merged) */
    uint64_t applied_entries;
    uint64_t snapshots;            /* snapshots taken */
    uint64_t installs;             /* snapshots installed from a leader */
    uint64_t installs_dropped;     /* newer snapshots dropped during an install */
    uint64_t installs_parked;      /* installs begun only after tier work ended */
    uint64_t snapshot_reads;       /* snapshots read out of the cold tier when a
                                      follower or a backup needed one */
    uint64_t snapshot_descriptors; /* snapshots taken as a descriptor only (a
                                      large state, read out when needed) */
    uint64_t trailing_reads;       /* log entries read on the loop to find a
                                      snapshot's trailing window (0 while the
                                      marks of the bytes applied reach back) */
    uint64_t replaced_log_entries; /* log entries a leader's snapshot replaced,
                                      freed on the thread pool */
    uint64_t installs_deferred;    /* readies of log entries kept beside an install */
    uint64_t snapshots_refused;    /* snapshots from a leader refused as bad input
                                      (checksum or structure), before any install step */
    uint64_t terms_refused;        /* messages whose term is past RAFT_TERM_CEIL or more
                                      than RAFT_TERM_LEAP above ours (raft_terms_refused) */
    uint64_t store_syncs;          /* log syncs (store_stats.syncs) */
    uint64_t store_recycled;       /* segments recycled (store_stats.recycled) */
    /* Appends the storage thread completed, and the times a producer had to
     * wake it (only when it slept: store_stats.wakeups); and the loop's own
     * wake-ups (its async handle's callbacks: storage completions, requests
     * from other threads, stops). Per request: divide by the requests. */
    uint64_t store_appends;
    uint64_t store_wakeups;
    uint64_t loop_wakeups;
    uint64_t store_bytes; /* payload bytes appended to the log since start
                             (store_stats.bytes; a counter, not a size) */
    /* The state machine's size (kv_sm_stats). */
    uint64_t kv_ring_bytes;     /* ring pages held: the hot tier's memory */
    uint64_t kv_hot_keys;       /* keys in the hot index */
    uint64_t kv_cold_keys;      /* keys in the cold tier (LMDB) */
    uint64_t kv_cold_bytes;     /* the cold tier's LMDB file in use */
    uint64_t store_log_bytes;   /* the Raft log's bytes (store_log_bytes) */
    uint64_t kv_tier_downs;     /* tier-down transactions committed */
    uint64_t kv_paced_syncs;    /* tier-down commits whose writeback was paced */
    uint64_t kv_paced_slept_ns; /* ... and the time they slept between slices */
    uint64_t kv_bad_records;    /* ring records that failed their check */
    uint64_t net_bytes_sent;
    uint64_t net_bytes_received;
    uint64_t net_reconnects;
    /* Peer security (transport_stats): handshakes refused (token proof, TLS,
     * certificate name, non-member), messages dropped for a spoofed `from`,
     * connections closed for bad input, unauthenticated ones evicted at the
     * pending cap or past their deadline, idle ones, snapshot reassemblies
     * dropped. */
    uint64_t net_auth_failed;
    uint64_t net_spoofed;
    uint64_t net_conns_bad;
    uint64_t net_pending_evicted;
    uint64_t net_conns_idle;
    uint64_t net_snapshots_dropped;
    uint64_t net_reads_paused; /* Raft connections' reads put off to the next turn */
    uint64_t net_snapshot_faulted_ahead; /* bytes of big snapshots' reassembly
                                            faulted in off the loop, ahead */
    uint64_t net_snapshot_fault_waits;   /* reads stopped until that caught up */
    /* The loop's turns (one pass of the node's loop, callbacks of every kind,
     * without the time blocked waiting for events): the longest so far by
     * the phase most of it went to (enum node_turn_phase), and the snapshot
     * and tier-down work done on the loop. */
    uint64_t loop_turn_max_ns[10];
    /* The loop thread's CPU in turns (a lower bound, low by under 1 ms; see
     * node/node_oplog.h): the longest turn's (of any phase); turns "held",
     * longer than half the election timeout with NODE_HELD_CPU_NS or more of
     * CPU; and the longest turn with that much CPU (any length). */
    uint64_t loop_turn_max_cpu_ns;
    uint64_t loop_turns_held;
    uint64_t loop_turn_held_max_ns;
    uint64_t snapshot_loop_ns;  /* publishing snapshots, in all */
    uint64_t tier_drain_ns;     /* dropping released index entries, in all */
    uint64_t tier_drain_max_ns; /* the longest slice of it */
    /* Applying held while the KV ring was past twice its budget during a
     * tier-down (the loop goes on): how often, and for how long in all. */
    uint64_t apply_holds;
    uint64_t apply_held_ns;
    /* Memory by owner, bytes (kv_sm_stats; LMDB's from the kernel). */
    uint64_t mem_index_bytes;    /* the hot index's table */
    uint64_t mem_view_bytes;     /* the ordered view (the hot keys in order) */
    uint64_t mem_sessions_bytes; /* the exactly-once session table */
    uint64_t mem_lmdb_mapped;    /* the cold tier's map size */
    uint64_t mem_lmdb_resident;  /* of it, pages in memory (mincore) */
    uint64_t mem_snapshot_spare; /* spare snapshot stream mappings (the process's) */
    uint64_t mem_blob_cache;     /* freed small blobs kept for reuse (the process's) */
};
void node_metrics(struct node *n, struct node_metrics *out);
/* The CPU a loop turn holds to count as held (node_metrics.loop_turns_held). */
#define NODE_HELD_CPU_NS (20 * 1000000ull)

/* The node runtime under an embedding handle (include/tierkv.h), for tests
 * that look at its metrics. Not exported by libtierkv.so. */
struct tk_node;
struct node *tk_node_runtime(struct tk_node *n);

/* What a loop turn's time went to (node_metrics.loop_turn_max_ns): the
 * ready loop's steps, starting a snapshot (snapshot), publishing a tier-down
 * and dropping its index entries (tier), compacting the log (compact), the
 * core's steps of received messages (recv: appending a leader's entries),
 * and the rest of the turn (other: transport reads and decoding, timers, the
 * gateway, other handles). */
enum node_turn_phase {
    NODE_PH_READY,
    NODE_PH_STORE,
    NODE_PH_SEND,
    NODE_PH_APPLY,
    NODE_PH_ADVANCE,
    NODE_PH_SNAPSHOT,
    NODE_PH_TIER,
    NODE_PH_COMPACT,
    NODE_PH_RECV,
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

/* ---- membership (node_member.c) ------------------------------------------
 *
 * The configuration (voters and learners) is Raft's (raft/raft.h: config
 * entries in the log). Each member's addresses are node-level data: a record
 * per id in the replicated KV under the reserved key NODE_MEMBER_KEY_PREFIX
 * followed by the decimal id, value "raft=<host:port> http=<host:port>
 * removed=<0|1>", written by the leader before it appends the configuration
 * change (so every node that sees the new member can find its address). The
 * members of the bootstrap configuration need no record: every node has their
 * addresses from node_options (peer_hosts). A record with removed=1 is the
 * never-reuse list: an id once removed is refused by a later add. Each node
 * dials (adds to its TCP transport) every member of the configuration in
 * force whose address it knows, checked every tick. */
#define NODE_MEMBER_KEY_PREFIX "\x01tierkv/member/"
#define NODE_ADDR_MAX 128

struct node_member {
    uint64_t id;
    bool voter; /* else a learner */
    char raft[NODE_ADDR_MAX];
    char http[NODE_ADDR_MAX]; /* empty when unknown */
    /* The leader's view (has_progress only on the leader): */
    bool has_progress;
    uint64_t match;  /* highest index known replicated to it */
    uint64_t behind; /* leader's last index minus match */
    bool caught_up;  /* raft_catch_up's verdict (promotable) */
};

/* The members of the configuration in force, voters first, up to `cap`;
 * returns how many there are. *config_index is the index of the
 * configuration entry (0: the bootstrap one), *committed whether it is
 * committed. Loop thread only (a gateway on the node's loop). */
size_t node_members(struct node *n, struct node_member *out, size_t cap,
                    uint64_t *config_index, bool *committed);

/* The HTTP address recorded for member `id` (a member added at run time);
 * false when none is. Loop thread only. */
bool node_member_http(struct node *n, uint64_t id, char *out, size_t cap);

enum node_member_op {
    NODE_MEMBER_ADD = 1,     /* a new id, as a learner (then promoted unless learner) */
    NODE_MEMBER_PROMOTE = 2, /* a caught-up learner becomes a voter */
    NODE_MEMBER_REMOVE = 3,  /* a voter or learner leaves */
};

struct node_member_change {
    int op; /* enum node_member_op */
    uint64_t id;
    bool learner;             /* add: stay a learner (else promote once caught up) */
    char raft[NODE_ADDR_MAX]; /* add: host:port of its raft listener */
    char http[NODE_ADDR_MAX]; /* add: host:port of its HTTP gateway (may be empty) */
};

/* What a change ended with: status 0 (committed), or an error with a message:
 * TK_ENOTLEADER, TK_EBUSY (another change is in progress), TK_ECOMPARE (add:
 * already a member, or an id that was removed once: ids are never reused),
 * TK_ENOTFOUND (not a member), TK_ERANGE (promote: the learner is not caught
 * up; `behind` says by how many entries), TK_EINVAL, TK_ELOST, TK_ETIMEDOUT,
 * TK_ESHUTDOWN. */
struct node_member_result {
    int status;
    uint64_t index; /* the configuration entry (0 when none was appended) */
    uint64_t behind, match;
    char msg[192];
};
typedef void node_member_cb(const struct node_member_result *res, void *data);

/* Starts one membership change on the leader. Returns 0 and calls cb once,
 * later, on the loop thread (also TK_ESHUTDOWN at stop), or returns the
 * refusal at once, filled in *res (cb never runs). One change at a time per
 * node; the core refuses a second uncommitted one cluster-wide. Loop thread
 * only. */
int node_member_change(struct node *n, const struct node_member_change *c,
                       node_member_cb *cb, void *data, struct node_member_result *res);

/* The node's inproc transport faults, for tests: cut this node off from every
 * peer (both directions) or heal. Only for inproc nodes. Any thread. */
int node_isolate(struct node *n, bool isolated);

#endif
