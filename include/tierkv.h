/* tierkv: the public embedding API.
 *
 * Start one node (a cluster of one: it commits after its own persist), a node
 * of a TCP cluster, or a whole in-process cluster of N nodes over the inproc
 * transport, with the memory or the fs store; then put, get, delete, scan,
 * increment and submit batches or transactions, blocking or with a callback.
 *
 *     struct tk_cluster *c;
 *     tk_cluster_start(3, NULL, &c);
 *     struct tk_node *leader;
 *     tk_cluster_wait_leader(c, 5000, &leader);
 *     tk_put(leader, "k", 1, "v", 1, TK_MODE_APPLIED, NULL);
 *     struct tk_value v;
 *     tk_get(leader, "k", 1, TK_READ_LINEARIZABLE, &v);
 *     tk_value_free(&v);
 *     tk_cluster_stop(c);
 *
 * Threads: every function may be called from any thread except from inside a
 * tk callback (which runs on the node's own thread). Blocking calls wait on a
 * condition variable, never by polling. Errors are the negative TK_E* codes
 * below (tk_strerror names them). A write submitted on a follower is
 * forwarded to the leader over the Raft transport and completes on the
 * follower; TK_ENOLEADER when no leader is known.
 *
 * This header is self-contained: it is what `meson install` puts in
 * $prefix/include, next to libtierkv.so.0, libtierkv.a and tierkv.pc
 * (docs/embedding.md). Only the functions marked TK_API are exported from the
 * shared library (node/tierkv.map lists them; tests/consumer checks it). */
#ifndef TIERKV_H
#define TIERKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TK_VERSION_MAJOR 0
#define TK_VERSION_MINOR 1
#define TK_VERSION_PATCH 0

/* The error codes (TK_ERRORS, enum tk_err): one list, in tierkv_errors.h, which
 * the tree's base/err.h includes too; it also defines TK_API, the mark of
 * every exported function (visible under -fvisibility=hidden). */
#include "tierkv_errors.h"

/* A static, human-readable message for `rc`; "unknown error" for codes that are
 * not in TK_ERRORS. Thread-safe. */
TK_API const char *tk_strerror(int rc);

/* The symbolic name ("TK_EBUSY") of `rc`, or "TK_E?" if unknown. Thread-safe. */
TK_API const char *tk_errname(int rc);

#define TK_MEMBERS_MAX 16

enum tk_mode {
    TK_MODE_APPLIED = 0,   /* complete when applied; returns the result */
    TK_MODE_COMMITTED = 1, /* complete when a majority holds it */
};

enum tk_consistency {
    TK_READ_LINEARIZABLE = 0,
    TK_READ_STALE = 1,
};

/* How much the library logs (tk_options.log_level). Lines are logfmt:
 *   ts=2026-11-30T04:28:00.123Z level=warn node=2 term=5 msg="..." k=v
 * The default logs errors only: an embedding program is quiet unless it asks
 * for more (TK_LOGLEVEL_INFO shows elections, membership and snapshots, as
 * tierkvd logs them). A zeroed level (TK_LOGLEVEL_DEFAULT) is the default. */
enum tk_loglevel {
    TK_LOGLEVEL_DEFAULT = 0, /* = TK_LOGLEVEL_ERROR */
    TK_LOGLEVEL_DEBUG = 1,
    TK_LOGLEVEL_INFO = 2,
    TK_LOGLEVEL_WARN = 3,
    TK_LOGLEVEL_ERROR = 4,
    TK_LOGLEVEL_OFF = 5, /* nothing at all */
};

/* Receives each log line at or above tk_options.log_level instead of stderr:
 * `level` is DEBUG..ERROR, `line` is one logfmt line without a newline,
 * NUL-terminated, borrowed for the call only. Called on the thread that logs
 * (a node's loop or storage thread, any of them, at the same time from
 * several): it must be thread-safe, return soon, and call no tk_* function. */
typedef void tk_log_cb(enum tk_loglevel level, const char *line, void *data);

struct tk_member {
    uint64_t id;
    const char *host; /* TCP only */
    uint16_t port;
};

struct tk_options {
    uint64_t id;         /* this node (tk_node_start) */
    uint64_t cluster_id; /* TCP handshake */
    uint32_t n_members;
    struct tk_member members[TK_MEMBERS_MAX];
    const char *listen_host;   /* TCP: NULL = the member's own host */
    const char *data_dir;      /* fs store under this dir; NULL = memory volume */
    bool kv_no_sync;           /* tests and benchmarks only */
    size_t kv_map_bytes;       /* LMDB map of the KV cold tier: 0 = 64 GiB (sparse);
                                  smaller under valgrind, which cannot map that much */
    uint32_t tick_ms;          /* 10 */
    uint32_t election_ticks;   /* 20 */
    uint32_t heartbeat_ticks;  /* 2 */
    uint32_t queue_max;        /* pending requests per node: 65536 */
    uint64_t timeout_ms;       /* per request: 10000 */
    uint64_t snapshot_entries; /* 100000 */
    uint64_t snapshot_bytes;   /* or payload bytes: 64 MiB */
    uint64_t trailing_entries; /* 10000 */
    uint64_t seed;
    /* After work, a node's loop keeps polling for this long before it sleeps,
     * and a blocking tk_* call polls for its result this long before it
     * sleeps: each hand-off that lands meanwhile costs no thread wake-up
     * (tens of us on a VM), for up to this much CPU per request. A spinner
     * gives its CPU to any other runnable thread on each pass (sched_yield),
     * so a thread per node works on fewer cores than threads. 0 = off. */
    uint32_t spin_us;
    /* tk_cluster_start: run every node on one loop thread instead of a
     * thread each. Lower latency for one request at a time (no wake-ups
     * between nodes), lower throughput (one core for the whole cluster). */
    bool one_loop;
    /* tk_node_start over TCP: the cluster token of the peer handshake (at least
     * 16 bytes, the same on every node; copied), as tierkvd's --peer-token-file.
     * A node whose raft address is not loopback needs one, or insecure_peers
     * set explicitly (then anyone who reaches the port can join the cluster's
     * traffic): without either, tk_node_start returns TK_EINVAL. */
    const uint8_t *peer_token;
    size_t peer_token_len;
    bool insecure_peers;
    size_t kv_ring_bytes; /* the KV ring's (hot tier's) memory budget: 0 = 64 MiB */
    /* A follower writes and syncs an append on its own loop when its storage
     * thread is idle and the last sync took at most this long (no hand-off to
     * that thread and back; a stall of the disk then holds its loop); 0 (the
     * default) = always hand over. */
    uint32_t follower_inline_sync_us;
    /* Logging (see enum tk_loglevel): lines below log_level are dropped; the
     * rest go to log_cb(level, line, log_data), or to stderr when log_cb is
     * NULL. The logger is the process's: tk_node_start and tk_cluster_start
     * set it from their options, and it stays so (for every node of the
     * process) until the next start sets it again. A level past
     * TK_LOGLEVEL_OFF makes the start return TK_EINVAL. */
    enum tk_loglevel log_level;
    tk_log_cb *log_cb;
    void *log_data;
};

/* Fills `o` with the defaults: log_level TK_LOGLEVEL_DEFAULT (errors only),
 * no log_cb (stderr), the numbers shown beside each field. */
TK_API void tk_options_default(struct tk_options *o);

struct tk_node;
struct tk_cluster;

/* Starts one node of a TCP cluster (or a single node when n_members is 1 or
 * 0). Returns 0, TK_EINVAL (also for a raft address off loopback with neither
 * peer_token nor insecure_peers), TK_EIO, TK_ECORRUPT. */
TK_API int tk_node_start(const struct tk_options *o, struct tk_node **out);
/* Stops a node started with tk_node_start; in-flight requests complete with
 * TK_ESHUTDOWN first. */
TK_API void tk_node_stop(struct tk_node *n);

/* An in-process cluster of n (1..TK_MEMBERS_MAX) nodes with ids 1..n over the
 * inproc hub. `o` may be NULL; its data_dir, if set, gets one subdirectory per
 * node (n1, n2, ...). */
TK_API int tk_cluster_start(uint32_t n, const struct tk_options *o,
                            struct tk_cluster **out);
TK_API void tk_cluster_stop(struct tk_cluster *c);
/* Node i (0-based). */
TK_API struct tk_node *tk_cluster_node(struct tk_cluster *c, uint32_t i);
/* Waits up to timeout_ms until a node leads and every running node that
 * tk_cluster_isolate has not cut off knows it (so a request through any of
 * them reaches it); TK_ETIMEDOUT otherwise. An isolated node is never the
 * answer. */
TK_API int tk_cluster_wait_leader(struct tk_cluster *c, uint32_t timeout_ms,
                                  struct tk_node **out);
/* Stops node i (as a crash of the process would, minus unsynced loss for the
 * fs store) and restarts it from its storage. */
TK_API int tk_cluster_restart_node(struct tk_cluster *c, uint32_t i);
/* Cuts node i off from every peer, or heals it. */
TK_API int tk_cluster_isolate(struct tk_cluster *c, uint32_t i, bool isolated);

struct tk_status {
    uint64_t id;
    uint64_t term;
    uint64_t leader; /* 0 when unknown */
    bool is_leader;
    uint64_t commit;
    uint64_t applied;
    uint64_t last_index;
    uint64_t snapshot_index;
};
TK_API void tk_node_status(struct tk_node *n, struct tk_status *out);
TK_API uint64_t tk_node_leader(struct tk_node *n);
TK_API int tk_node_transfer_leadership(struct tk_node *n, uint64_t to);

/* ---- writes ------------------------------------------------------------ */

struct tk_write_result {
    int code;          /* the command's own outcome: 0, TK_ECOMPARE, TK_ERANGE,
                          TK_EINVAL, TK_ETOOBIG (applied mode only) */
    uint64_t revision; /* the entry's index */
    bool succeeded;    /* txn: the compares held */
    int64_t value;     /* increment: the new value */
    uint64_t deleted;  /* delete: keys deleted */
};

/* A write finished: status is 0 or TK_ENOLEADER, TK_ENOTLEADER (the leader
 * changed while forwarding), TK_EBUSY, TK_ELOST,
 * TK_ETIMEDOUT (outcome unknown), TK_ESHUTDOWN, TK_EIO. `res` is NULL unless
 * status is 0. Runs on the node's thread. */
typedef void tk_write_cb(int status, const struct tk_write_result *res, void *data);

/* Submits an encoded kvpb.Command (proto/kv.proto). Returns 0 (cb runs once),
 * TK_EBUSY (queue full), TK_EINVAL, TK_ESHUTDOWN (cb does not run). */
TK_API int tk_submit_async(struct tk_node *n, const void *cmd, size_t len,
                           enum tk_mode mode, tk_write_cb *cb, void *data);
/* Blocking forms: return the status; `out` (may be NULL) gets the result. */
TK_API int tk_submit(struct tk_node *n, const void *cmd, size_t len, enum tk_mode mode,
                     struct tk_write_result *out);
TK_API int tk_put(struct tk_node *n, const void *key, size_t key_len, const void *value,
                  size_t value_len, enum tk_mode mode, struct tk_write_result *out);
TK_API int tk_put_async(struct tk_node *n, const void *key, size_t key_len,
                        const void *value, size_t value_len, enum tk_mode mode,
                        tk_write_cb *cb, void *data);
TK_API int tk_delete(struct tk_node *n, const void *key, size_t key_len,
                     enum tk_mode mode, struct tk_write_result *out);
TK_API int tk_incr(struct tk_node *n, const void *key, size_t key_len, int64_t delta,
                   enum tk_mode mode, struct tk_write_result *out);

/* An atomic batch, or a transaction: puts and deletes (value NULL = delete). */
struct tk_op {
    const void *key;
    size_t key_len;
    const void *value; /* NULL: delete */
    size_t value_len;
};
TK_API int tk_batch(struct tk_node *n, const struct tk_op *ops, size_t n_ops,
                    enum tk_mode mode, struct tk_write_result *out);
/* If every key in `if_versions` has that version (0: absent), apply then_ops,
 * else else_ops; out->succeeded says which. */
struct tk_version_cmp {
    const void *key;
    size_t key_len;
    uint64_t version;
};
TK_API int tk_txn(struct tk_node *n, const struct tk_version_cmp *cmps, size_t n_cmps,
                  const struct tk_op *then_ops, size_t n_then,
                  const struct tk_op *else_ops, size_t n_else, enum tk_mode mode,
                  struct tk_write_result *out);

/* ---- reads ------------------------------------------------------------- */

struct tk_value {
    uint8_t *value; /* malloc'd copy; tk_value_free */
    size_t len;
    uint64_t create_revision;
    uint64_t mod_revision;
    uint64_t version;
};
TK_API void tk_value_free(struct tk_value *v);

/* Returns 0, TK_ENOTFOUND, TK_ENOLEADER, TK_ETIMEDOUT, TK_ESHUTDOWN. */
TK_API int tk_get(struct tk_node *n, const void *key, size_t key_len,
                  enum tk_consistency c, struct tk_value *out);

struct tk_item {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
    uint64_t mod_revision;
    uint64_t version;
};
/* Called per key in byte order, on the node's thread, while the caller waits;
 * the item is valid during the call. Return nonzero to stop. */
typedef int tk_item_cb(const struct tk_item *item, void *data);
/* Keys with `prefix` (prefix_len 0: all keys), at most `limit` (0: no limit).
 * Read in steps of at most 1024 keys (and 16384 deleted ones), each its own
 * read on the node's loop and consistent at its own applied index, so that a
 * long scan never holds the loop. TK_EINVAL: no cb, or a prefix of 64 KiB. */
TK_API int tk_scan(struct tk_node *n, const void *prefix, size_t prefix_len, size_t limit,
                   enum tk_consistency c, tk_item_cb *cb, void *data);

/* ---- watch: the change log ---------------------------------------------- */

enum tk_event_type { TK_EVENT_PUT = 1, TK_EVENT_DELETE = 2, TK_EVENT_EXPIRE = 3 };
struct tk_event {
    uint64_t revision;
    int type; /* enum tk_event_type */
    const void *key;
    size_t key_len;
    const void *value; /* put: the new value */
    size_t value_len;
    uint64_t version, create_revision; /* put: the key's */
};
/* Called per event, in revision order, on the node's thread while the caller
 * waits; the event is valid during the call. Return nonzero to stop after
 * this event's revision (its other events are still passed). */
typedef int tk_event_cb(const struct tk_event *ev, void *data);
/* Follows the changes of the keys with `prefix` (prefix_len 0: all keys) in
 * this node's change log (docs/api.md, Watch), from revision *from (0: from
 * now on): passes what the node has applied, whole revisions at a time, and
 * waits for more (polling every 10 ms) until cb returns nonzero or
 * timeout_ms (0: no limit) passes. On return *from is where to resume: past
 * the last revision passed whole. Returns 0, TK_ECOMPACTED (*from is older
 * than the node's log; *from is set to the oldest revision it holds: read the
 * state, then watch from there), TK_EINVAL, TK_ESHUTDOWN. Any thread but the
 * node's; a follower passes only what it has applied. */
TK_API int tk_watch(struct tk_node *n, const void *prefix, size_t prefix_len,
                    uint64_t *from, uint32_t timeout_ms, tk_event_cb *cb, void *data);

/* ---- leases (docs/api.md, Leases) ----
 *
 * A lease is a replicated TTL that keys attach to (tk_put_lease); the leader
 * revokes it once its TTL runs out without a keepalive, deleting every
 * attached key at one revision. Blocking, like tk_put (applied mode); any
 * node (a follower forwards to the leader). Each returns the write's status
 * (TK_ENOLEADER, TK_ETIMEDOUT...) or else the command's outcome:
 * tk_lease_grant: 0 with *id (> 0), TK_EINVAL (ttl_ms 0 or over a week);
 * tk_lease_keepalive, tk_lease_revoke: 0 or TK_ENOTFOUND (expired, revoked or
 * never granted); tk_put_lease: 0 or TK_ENOTFOUND (no such lease),
 * TK_ETOOBIG (the lease holds its most keys). `deleted` may be NULL. */
TK_API int tk_lease_grant(struct tk_node *n, uint64_t ttl_ms, uint64_t *id);
TK_API int tk_lease_keepalive(struct tk_node *n, uint64_t id);
TK_API int tk_lease_revoke(struct tk_node *n, uint64_t id, uint64_t *deleted);
TK_API int tk_put_lease(struct tk_node *n, const void *key, size_t key_len,
                        const void *value, size_t value_len, uint64_t lease,
                        struct tk_write_result *out);

#endif
