/* The node runtime's internals, shared by its files:
 *   node.c          the loop: callbacks, drain -> propose -> ready -> persist ->
 *                   apply -> complete, the public API (node.h), start and stop;
 *   node_recover.c  open the store and the state machine, build the core's boot;
 *   node_tier.c     the KV's tier-down and snapshot jobs, log compaction;
 *   node_install.c  installing a snapshot from the leader on the thread pool;
 *   node_forward.c  follower -> leader write forwarding (proto/tierkv.proto);
 *   node_status.c   publishing status and metrics, failing the node;
 *   node_member.c   membership: address records, dialing members, one change
 *                   at a time, incarnation checks (node.h "membership").
 * Calls run one way: node.c calls the others; node_tier.c and node_member.c
 * call only node_status.c; node_recover.c, node_forward.c and node_status.c call none
 * of them. What several files need on the hot path (the request lists,
 * completing a write, kick) is inline here, so that the split costs no call
 * per request.
 *
 * Each sub-struct of struct node is written by one file, its owner
 * (docs/architecture.md's sub-struct table, which the structure test checks):
 * another file reads it and changes it only through an owner's function, an
 * inline one in the owner's `---- x.c ----` section below on the hot path.
 *
 * Everything here runs on the node's loop thread unless a field says
 * otherwise (see node.c for the invariants). */
#ifndef TK_NODE_NODE_INTERNAL_H
#define TK_NODE_NODE_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <uv.h>

#include "base/blob.h"
#include "base/clock.h"
#include "base/queue.h"
#include "kv/kv.h"
#include "node/node.h"
#include "node/node_oplog.h"
#include "node/node_reqs.h"
#include "node/node_wake.h"
#include "raft/raft.h"

struct store;
struct store_mem_volume;
struct transport;

/* The most readies handed to storage and not yet durable (the store's queue
 * bound as well). */
#define NODE_PERSIST_MAX (1u << 17)
/* Bytes of a forwarding request token (see node_forward.c). */
#define NODE_TOKEN_BYTES 16
/* Tokens drawn from getrandom() at once. */
#define NODE_TOKEN_POOL 16

/* The loop and its scheduling. */
struct node_loop {
    uv_thread_t thread;
    uv_sem_t started;
    uv_sem_t closed; /* posted when the node's last handle has closed */
    int start_rc;
    uv_loop_t own;
    uv_loop_t *uv;         /* &own, or the caller's shared loop */
    bool shared;           /* on o.loop, run by the caller; no thread of our own */
    struct node_wake wake; /* node_wake.h: uv_async_t without its spin */
    uv_timer_t ticker;
    uv_check_t check;
    uv_idle_t idle; /* active while the core has work for the next check */
    bool kicked;
    bool spinning;     /* idle kept active by spin_us */
    uint64_t activity; /* bumped by messages, requests and readies */
    uint64_t activity_seen;
    uint64_t active_ns; /* when activity last changed, seen from on_check */
    atomic_bool stopping;
    bool closing;
    int handles_open;

    uint64_t turn_ns[NODE_PH_N], turn_applied; /* this loop turn's, by phase */
    uint64_t turn_apply_bytes;   /* payload applied this turn (NODE_APPLY_TURN_BYTES) */
    uint64_t turn_apply_entries; /* entries applied this turn (NODE_APPLY_TURN_ENTRIES) */
    uv_prepare_t prepare;        /* measures whole turns (idle_metrics) */
    bool idle_metrics;           /* own loop with UV_METRICS_IDLE_TIME */
    uint64_t prep_ns, prep_idle_ns; /* at the last prepare */
    _Atomic uint64_t turns;         /* turns ended (on_prepare): the stall probe's */
    /* The loop thread's usage at the last sample (getrusage, taken at a
     * turn's end at most every USAGE_EVERY_NS, and after every long turn):
     * CPU time, major and minor page faults, voluntary and involuntary
     * context switches, time waiting for a core (schedstat); usage_at_ns is
     * when it was taken. */
    uint64_t turn_cpu_ns, turn_majflt, turn_minflt, turn_nvcsw, turn_nivcsw, turn_wait_ns;
    uint64_t usage_at_ns;
    struct raft_entry *batch; /* batch_max entries: one drain's proposal */

    struct tk_mpsc queue;
    /* Written by other threads (node_submit, node_transfer_leadership): a
     * cache line apart from what the loop writes on every turn. */
    _Alignas(64) atomic_size_t queued;
    _Atomic uint64_t transfer_to; /* a leadership transfer request */
    /* (struct node_loop's size rounds up to the alignment: the next field
     * of struct node starts a line of its own.) */
};

/* The client loop (node_client.c): a second thread and libuv loop for client
 * work, completions delivered to it in batches, and the state lock. */
struct node_client {
    bool on; /* o.on_client_start is set and the thread runs */
    uv_thread_t thread;
    uv_loop_t loop;
    struct node_wake wake; /* the client loop's: completions, calls, applies, stop */
    uv_prepare_t wait;     /* the consensus loop's: hands the state to a client,
                              and wakes the client loop for the turn's posts */
    uv_prepare_t flush;    /* the client loop's: wakes the consensus loop for
                              the turn's submits */
    uv_sem_t go;           /* the consensus loop started (or failed: abort) */
    uv_sem_t started;      /* on_client_start ran */
    bool abort;            /* the node did not start: no hooks run */
    /* The state lock: the consensus loop holds it (node__client_run) but
     * while it hands it to a client that asks (on_wait). */
    pthread_mutex_t state_mu;
    atomic_int waiting;      /* clients waiting for state_mu */
    atomic_int loop_waiting; /* the consensus loop waits for it */
    int depth;            /* client loop: how often it holds state_mu (a read's callback
                             may call node_client_lock again) */
    uint64_t ext_idle_ns; /* consensus loop: time the state was handed over */
    bool post_due;        /* consensus loop: the inbox got its first post */
    /* Each loop says it may be about to wait for events (set in its last
     * prepare callback, cleared once it runs again): the other wakes it only
     * then; a loop that runs will look at the queue or inbox before it
     * waits (on_wait, on_flush). */
    atomic_int loop_idle, client_idle;
    uv_check_t awake;        /* the client loop's: client_idle cleared after a poll */
    pthread_mutex_t wake_mu; /* loop_wake_closed, and a client's wake-up of the loop */
    bool loop_wake_closed;
    atomic_int applied_wanted; /* on_client_applied is called while > 0 */
    /* Completions for the client loop, oldest first, and calls
     * (node_client_call) (inbox_mu). */
    pthread_mutex_t inbox_mu;
    struct node_req *inbox_head, *inbox_tail;
    struct node_client_call *calls_head, *calls_tail;
    atomic_bool applied_due; /* the consensus loop applied since */
    /* The state machine's applied index, stored by the consensus loop as
     * each entry applies and at each status publication (node_applied_index:
     * any thread; a completion delivered on the client loop sees its own
     * entry's index or a newer one). */
    _Atomic uint64_t applied;
    atomic_bool final_due;       /* the consensus loop is gone: stop */
    bool stopped;                /* client loop: on_client_stop ran */
    uint64_t delivered, wakeups; /* client loop: requests handed, drains */
    bool submit_due;             /* client loop: node_submit queued without a wake */
};

/* A leader duty (node_duty.c): a command the leader proposes on its own,
 * at most one in flight. */
enum node_duty_kind {
    NODE_DUTY_EXPIRE,     /* keys whose TTL ran out (node_expire.c) */
    NODE_DUTY_REVOKE,     /* a lease past its deadline (node_lease.c) */
    NODE_DUTY_CHECKPOINT, /* the leases' remaining TTLs (node_lease.c) */
    NODE_DUTY_N
};
/* The duty's next command at now_ms (an encoded kvpb.Command), or NULL. */
typedef struct tk_blob *node_duty_build(struct node *n, uint64_t now_ms);
struct node_duty {
    node_duty_build *build;
    uint8_t mode;        /* enum node_mode of its command */
    bool busy;           /* a command in flight */
    struct node_req req; /* that command */
    uint64_t proposed;   /* commands submitted */
    uint64_t done;       /* answered applied, code 0 */
};

/* Durability: seqs handed to storage, oldest first. */
struct node_persist {
    uint64_t *seq;
    bool *async;
    uint64_t *ns; /* when each was handed to storage */
    size_t head, n, cap;
    _Atomic uint64_t durable_seq; /* written by the storage thread */
    atomic_int store_status;      /* written by the storage thread */
    pthread_mutex_t drain_mu;
    pthread_cond_t drain_cv;
    uint64_t async_submitted; /* loop thread */
    /* The seq whose node__store_append runs now (0: none): its completion
     * leaves the loop's wake-up to that call (node_persist.c). */
    _Atomic uint64_t inline_seq;
    uint64_t async_done; /* under drain_mu */
    bool failed;         /* storage or apply failed: the node serves nothing */
};

/* Writes forwarded to the leader (node_forward.c). A batch frame holds at
 * most NODE_FWD_BATCH_MAX requests or answers and NODE_FWD_BATCH_BYTES of
 * them; a command over NODE_FWD_ALONE_BYTES travels alone. */
struct fwd_req;
struct fwd_scratch;
#define NODE_FWD_SPARES 256
#define NODE_FWD_BATCH_MAX 64
#define NODE_FWD_BATCH_BYTES (32u * 1024)
#define NODE_FWD_ALONE_BYTES (4u * 1024)
struct node_forward {
    struct req_list wait; /* in the order sent; each with its token */
    uint64_t next_id;
    uint8_t pool[NODE_TOKEN_POOL * NODE_TOKEN_BYTES]; /* random, unused */
    uint32_t pool_left;                               /* tokens left in pool */
    /* Follower: the writes of this turn not sent yet (to out_to, out_bytes
     * of them; empty between turns), and the leader that said it takes
     * batches, in the term it said so (0: none). */
    struct req_list out;
    uint64_t out_to;
    size_t out_bytes;
    uint64_t batch_leader, batch_term;
    /* Leader: answered forwarded writes, for the next (at most
     * NODE_FWD_SPARES; a steady forwarded load allocates none). */
    struct fwd_req *spare;
    uint32_t n_spare;
    /* Both: the batch frames' messages, answers not sent yet and decoding
     * arena (made at the first forward frame). */
    struct fwd_scratch *scratch;
    /* Follower: the leader seen at the last node__forward_leader_check. */
    uint64_t seen_leader;
};

/* Marks of the payload bytes applied (node_tier.c, trailing_goal): one at
 * least every NODE_MARK_ENTRIES entries and every 1/64 of snapshot_bytes (at
 * most NODE_MARK_BYTES), the last NODE_MARKS of them: enough to reach a
 * snapshot's trailing window 4M entries behind the applied index. */
#define NODE_MARKS 16384
#define NODE_MARK_ENTRIES 256
#define NODE_MARK_BYTES (1u << 20)
struct node_mark {
    uint64_t index; /* the last entry it counts */
    uint64_t bytes; /* payload bytes applied up to and with it, since boot */
};

/* Snapshots, tier-down jobs and compaction (node_tier.c). */
struct node_tier {
    uint64_t snap_index;
    uint64_t big_allocs, big_check_ns; /* big_blobs_turn: tk_blob_big_allocs, and when */
    uint64_t snap_bytes;     /* payload bytes applied since the last snapshot began */
    uint64_t applied_bytes;  /* payload bytes applied since boot */
    struct node_mark *marks; /* a ring of NODE_MARKS, the newest at mark_head - 1 */
    uint32_t mark_head, n_marks;
    uint64_t next_mark_index, next_mark_bytes; /* the next mark is due there */
    uint64_t compact_goal; /* compact the log up to here, a step per turn */
    /* The KV's tier-down job in flight on the thread pool. */
    uv_work_t work;
    struct kv_tier_job *job; /* until completed */
    bool busy;               /* until the after-work callback */
    bool snapshot;
    bool descriptor; /* a snapshot job that reads no stream (descriptor_turn) */
    atomic_bool ran;
    struct raft_config config;
    uint64_t t0, t_done, t_published; /* job began; after-work began; KV published */
    uint64_t cpu_done;  /* the loop thread's CPU time when the after-work began */
    uint64_t wait_done; /* and its time waiting for a core (tk_thread_wait_ns) */
    /* The snapshot's descriptor, saved by the job's thread after the job
     * (an LMDB commit: its fsync waited behind the job's own on the loop). */
    bool saved;
    int save_rc;
    /* The log store's compaction in flight on the thread pool (its LMDB
     * commit and segment removal sync the disk: never on the loop). */
    uv_work_t compact_work;
    bool compacting; /* until its after-work callback */
    atomic_bool compact_ran;
    uint64_t compact_upto;
    int compact_rc;
    /* The compacted entries' payloads (COMPACT_STEP room), freed with it. */
    struct tk_blob **compact_blobs;
    size_t compact_n;
    /* A reference to the snapshot blob last given to the core, so that the
     * previous one's last reference (tens of MB: freeing it unmaps them) is
     * dropped on the thread pool, not inside raft_snapshot_set. */
    struct tk_blob *blob;           /* NULL after a descriptor-only snapshot */
    uint64_t blob_index, blob_term; /* what `blob` holds */
    uint64_t blob_at; /* when it was read on demand (node__mono_ns), else 0 */
    /* Applying is held (raft_hold_apply) while the KV ring is past twice its
     * budget during a tier-down, instead of the loop waiting for the job:
     * since when (0: not held). */
    uint64_t hold_since;
    /* A snapshot read of the cold tier as the last tier-down left it, on the
     * thread pool beside the tier-down jobs (node_tier.c, reader_*). */
    struct node_snap_read *reader; /* until its after-work callback */
};

/* A snapshot from the leader being installed (node_install.c). The stream
 * goes into a fresh LMDB environment on the thread pool; the loop keeps
 * stepping the core meanwhile (heartbeats arrive, votes and acks wait), but
 * applies nothing and answers no read past the old state: the core counts
 * the install's ready, and every ready after it, durable only once the swap
 * is done. */
struct node_install_job;
struct node_install {
    /* The current install's request on the thread pool, until its after-work
     * callback. Each install has its own: libuv owns a request until that
     * callback, which may come after the loop waited the install out
     * (node__install_wait) and a second snapshot began. */
    struct node_install_job *job;
    struct kv_install *in; /* NULL once the job has aborted it */
    struct tk_blob *data;  /* a reference to the stream, until the job ran */
    struct raft_snapshot_meta meta;
    uint64_t hold_seq; /* the newest seq waiting for it (durable when it is) */
    /* Log entries that arrived meanwhile (node__install_defer): appended, in
     * order, once the store is reset to the snapshot. Bounded by
     * NODE_DEFER_BATCHES and NODE_DEFER_BYTES. */
    struct node_install_batch *defer;
    size_t n_defer;
    uint64_t defer_bytes;
    uint64_t t0;        /* when it began */
    uint64_t loop_ns;   /* of it on the loop: begin and the swap */
    uint64_t parked_ns; /* of it parked behind the tier's work */
    int rc;             /* the job's */
    bool busy;          /* from start (or park) to finish */
    bool parked;        /* busy, but not begun: node__install_unpark begins it */
    atomic_bool ran;
    /* Snapshots from the leader refused as bad input (node__install_check):
     * counted (m.metrics.snapshots_refused), logged at most once a second
     * (refused_quiet since the last). */
    uint64_t refused_logged_ns;
    uint64_t refused_quiet;
};

/* Backups waiting for a snapshot (node_backup.c). */
struct node_backups {
    struct node_backup *head;
    uint32_t n;
    /* One waits for a snapshot newer than tier.blob (node_tier.c reads it). */
    bool wanted;
};

/* Membership changes and the peers dialed (node_member.c). */
#define NODE_PEERS_MAX 64
#define NODE_FENCE_SEEN 8
struct node_membership {
    bool busy; /* a change in progress */
    int phase; /* node_member.c's enum */
    struct node_member_change c;
    node_member_cb *cb;
    void *data;
    uint64_t rec_index, rec_term; /* the address record entry */
    uint64_t index, term;         /* the configuration entry appended */
    uint64_t deadline_ms;
    uint64_t peers[NODE_PEERS_MAX]; /* ids added to the TCP transport */
    uint32_t n_peers;
    uint64_t seen_config;             /* raft_config_index when last reconciled */
    uint32_t ticks;                   /* since the last reconcile */
    uint8_t incarnation[16];          /* this node's data directory's (store) */
    bool rejected;                    /* a member refused our incarnation */
    uint64_t binding[NODE_PEERS_MAX]; /* ids whose incarnation is being recorded */
    uint32_t n_binding;
    struct {
        uint64_t id;
        char hex[40];
    } seen[NODE_PEERS_MAX]; /* the incarnation each peer last presented */
    uint32_t n_seen;
    /* The fence of --force-new-cluster (node_member.c): the ids a forced
     * configuration in the boot log dropped, refused as strangers even
     * before their removed records apply; the cluster's epoch (how many
     * forced recoveries its log went through); refusals counted per
     * refused id for the log line's rate (the NODE_FENCE_SEEN ids refused
     * most, the least refused giving its place to a new one). */
    uint64_t fenced[NODE_PEERS_MAX];
    uint32_t n_fenced;
    uint64_t epoch;
    struct {
        uint64_t id;
        uint64_t refused;
    } fence_seen[NODE_FENCE_SEEN];
};

/* The leader's gate for large writes (node_gate.c): entries of
 * NODE_GATE_ENTRY_BYTES (node.h) or more in the pipeline (proposed, and not yet
 * applied here and persisted by every voter keeping up) are kept to
 * NODE_GATE_PIPE_BYTES, or one; the others wait in `held`, in order, at most
 * NODE_GATE_HELD_BYTES. A voter whose match has not moved for
 * NODE_GATE_IDLE_MS while behind does not hold the gate. When smaller writes
 * were proposed while large ones filled the pipeline, it then stays empty of
 * large ones for NODE_GATE_REST_SHARE times as long as they took
 * (rest_until_ns), at most NODE_GATE_REST_MAX_MS. */
#define NODE_GATE_PIPE_BYTES (4u << 20)
#define NODE_GATE_PIPE_MAX 256
#define NODE_GATE_HELD_BYTES (256u << 20)
#define NODE_GATE_IDLE_MS 1000
#define NODE_GATE_REST_SHARE 2
#define NODE_GATE_REST_MAX_MS 1000
struct node_gate_entry {
    uint64_t index, bytes;
};
struct node_gate_peer {
    uint64_t id, match, moved_ms;
};
struct node_gate {
    struct req_list held;
    uint64_t held_bytes;
    /* The large entries in the pipeline, oldest first (a ring), and their
     * bytes with those admitted by the drain under way (pending_*, not yet
     * proposed). For this term and configuration only. */
    struct node_gate_entry pipe[NODE_GATE_PIPE_MAX];
    uint32_t pipe_head, pipe_n, pending_n;
    uint64_t pipe_bytes, pending_bytes;
    uint64_t term, config;
    /* Since when large entries fill the pipeline; whether a smaller write
     * was proposed meanwhile; until when none may enter it again. */
    uint64_t busy_ns, rest_until_ns;
    bool small_seen;
    uint64_t held_total, refused, rests; /* counters (node_metrics' gate_*) */
    struct node_gate_peer
        peer[RAFT_VOTERS_MAX]; /* each voter's match, and when it moved */
    uint32_t n_peers;
};

/* What other threads read: status and metrics (node_status.c). */
struct node_metrics_state {
    pthread_mutex_t mu;
    struct node_status status;   /* written by the loop under mu (which
                                    the loop itself may read it without) */
    struct node_metrics metrics; /* loop thread; copied under mu */
    struct node_metrics pub;
    struct node_latency lat; /* loop thread */
    uint64_t resident_ns;    /* when mem_lmdb_resident was last measured */
    bool resident_busy;      /* a measure in flight on the thread pool */
};

/* The stall probe (node_stall.c): its thread and what it looks at. */
struct node_stall {
    pthread_t thread;
    pthread_mutex_t mu; /* stop, and the probe's sleep */
    pthread_cond_t cv;
    bool stop, running;
    _Atomic pid_t tid; /* the loop thread's, set as it starts */
};

struct node {
    struct node_options o;
    char *data_dir;  /* owned copy, or the temporary kv dir */
    bool tmp_dir;    /* data_dir is ours to delete at stop */
    bool own_volume; /* we created the memory volume */
    bool dir_locked; /* dir_lock_fd holds o.data_dir's LOCK (node_recover.c) */
    int dir_lock_fd;

    struct node_loop loop;
    struct node_client client;

    struct raft *raft;
    struct store *store;
    struct store_mem_volume *volume;
    struct kv_sm *sm;
    struct transport *transport;

    struct node_persist persist;
    struct node_requests req;
    struct node_forward fwd;
    struct node_gate gate;
    struct node_tier tier;
    struct node_install install;
    struct node_membership mem;
    struct node_backups backups;
    struct kv_result res;               /* scratch for apply and forwarded answers */
    struct node_duty duty[NODE_DUTY_N]; /* the leader's own commands (node_duty.c) */
    struct {                            /* leases on the leader (node_lease.c) */
        bool leader;                    /* as of the last tick */
        uint64_t next_ckpt_ms, ckpt_after;
        uint64_t *ids, *rem; /* checkpoint scratch */
    } lease;
    struct node_metrics_state m;
    struct node_stall stall;
    struct node_oplog oplog;  /* the operator's log lines (node_oplog.h) */
    struct node_turn_cpu cpu; /* the loop thread's CPU per turn (node_oplog.h) */
};

/* ---- node_client.c ---- */

/* A request with on_client goes to the client loop's inbox (its result
 * copied for a write). */
void node__client_post(struct node *n, struct node_req *r, int status,
                       const struct kv_result *res);
/* node_submit on the client loop's thread: true, and the consensus loop is
 * woken at the end of the client loop's turn (one wake-up for the turn's
 * requests); false elsewhere (the caller wakes it). */
bool node__client_defer_wake(struct node *n);
/* The consensus loop runs (woken, or past its poll): clients need not wake it
 * for what they queue (it looks before it waits: on_wait). */
static inline void node__client_loop_awake(struct node *n)
{
    if (n->client.on)
        atomic_store_explicit(&n->client.loop_idle, 0, memory_order_relaxed);
}
/* The state machine applied up to `index` (node_applied_index). */
static inline void node__client_applied_index(struct node *n, uint64_t index)
{
    atomic_store_explicit(&n->client.applied, index, memory_order_release);
}
/* The node applied entries: on_client_applied on the client loop (coalesced). */
void node__client_applied(struct node *n);
/* Start: the thread, waiting (prepare, before node_init); then go, or abort
 * when the node did not start (begin). Stop: the rest delivered,
 * on_client_stop, the thread joined (join, after the consensus loop's thread
 * ended). */
int node__client_prepare(struct node *n);
void node__client_begin(struct node *n, bool ok);
void node__client_join(struct node *n);
/* Runs the consensus loop holding the state lock but while a client holds
 * it; node__client_close closes the wait handle (begin_close). */
void node__client_run(struct node *n);
void node__client_close(struct node *n);
/* The time the consensus loop handed the state to a client (not its turns'). */
uint64_t node__client_idle_ns(const struct node *n);

/* ---- node.c: inline helpers other files use on the hot path ---- */

/* Old names for base/clock.h's readers, kept while node/ is reshaped (issue 52
 * item 1) so its files need not all change at once; new code calls tk_*. */
#define node__mono_ns() tk_mono_ns()
#define node__thread_cpu_ns() tk_thread_cpu_ns()

static inline void node__finish_write(struct node *n, struct node_req *r, int status,
                                      const struct kv_result *res)
{
    tk_blob_unref(r->cmd);
    r->cmd = NULL;
    if (r->on_client) {
        node__client_post(n, r, status, res);
        return;
    }
    r->write_cb(r, status, res, r->data);
}

static inline void node__finish_read(struct node *n, struct node_req *r, int status)
{
    if (status == 0)
        n->m.metrics.reads++;
    if (r->on_client) {
        if (status == 0 && r->collect_cb != NULL)
            r->collect_cb(r, 0, n->sm, r->data);
        node__client_post(n, r, status, NULL);
        return;
    }
    r->read_cb(r, status, status == 0 ? n->sm : NULL, r->data);
}

/* Ends a request of either kind with an error (or a read with 0). */
static inline void node__finish(struct node *n, struct node_req *r, int status)
{
    if (r->is_read)
        node__finish_read(n, r, status);
    else
        node__finish_write(n, r, status, NULL);
}

/* Its being active keeps the loop from blocking in poll. While the node spins
 * (spin_us) and nothing is due, the loop gives its CPU to any other runnable
 * thread first: with three nodes and a client on two cores, spinners that do
 * not yield hold the cores from the very threads whose hand-off they wait for
 * (in-process serial p50 237 us without the yield, 26-45 us with it, at
 * spin_us 100: docs/history/benchmarks.md, "Spinning that yields"). A kick (work is
 * due) never yields. */
static inline void node__on_idle(uv_idle_t *h)
{
    struct node *n = h->data;
    if (n->loop.spinning && !n->loop.kicked)
        sched_yield();
}

/* Something changed the core outside this node's check callback (a message,
 * a tick, a wake-up): make sure the loop comes round to on_check without
 * sleeping. With several nodes on one loop, a message from another node's
 * check would otherwise wait for the next timer. */
static inline void node__kick(struct node *n)
{
    if (!n->loop.kicked && !n->loop.closing) {
        n->loop.kicked = true;
        uv_idle_start(&n->loop.idle, node__on_idle);
    }
}

/* One more of the node's handles (or a job on the thread pool) is open: the
 * node's close waits for it (node__handle_gone). */
static inline void node__handle_opened(struct node *n)
{
    n->loop.handles_open++;
}

/* Adds `ns` to this loop turn's time in phase `ph`. */
static inline void node__turn_add(struct node *n, enum node_turn_phase ph, uint64_t ns)
{
    n->loop.turn_ns[ph] += ns;
}

/* One of the node's handles (or its tier job, or its transport) is gone. */
static inline void node__handle_gone(struct node *n)
{
    if (--n->loop.handles_open == 0)
        uv_sem_post(&n->loop.closed);
}

/* ---- node_status.c ---- */

/* Publishes the status and the metrics for other threads. */
void node__publish_status(struct node *n);
/* The store or the state machine failed: the node stops serving and every
 * waiting request ends with TK_EIO. Once only. */
void node__fail(struct node *n, int rc, const char *what);
/* Completes every request of `l` with `status`. */
void node__fail_list(struct node *n, struct req_list *l, int status);

/* ---- node_gate.c ---- */

/* What the gate decides on (node__gate_room), taken from the core: the term,
 * the configuration's index, this node's applied index and id, the time, and
 * each voter's match (this node's own ignored). */
struct node_gate_view {
    uint64_t term, config, applied, self, now_ns;
    uint32_t n_voters;
    uint64_t voter[RAFT_VOTERS_MAX], match[RAFT_VOTERS_MAX];
};
/* The gate's rule, on `g` and `v` alone (no node, no core: gate tests drive
 * it): drops the entries that left the pipeline, starts a rest when it
 * empties after smaller writes, and says whether `len` more bytes of large
 * entries may enter it now. */
bool node__gate_room(struct node_gate *g, const struct node_gate_view *v, uint64_t len);
/* A large entry of `len` bytes let in, about to be proposed (pending). */
void node__gate_admit(struct node_gate *g, uint64_t len);
/* That pending entry was proposed at `index` (ok) or refused by the core. */
void node__gate_note(struct node_gate *g, uint64_t index, uint64_t len, bool ok,
                     uint64_t now_ns);

/* drain_queue, for a write this leader is about to propose: whether the gate
 * took it (held, or refused with TK_EBUSY past NODE_GATE_HELD_BYTES). A
 * large write it lets through counts as pending until node__gate_proposed. */
bool node__gate_hold(struct node *n, struct node_req *r);
/* The oldest held write, if it may go now (or this node no longer leads: it
 * is then forwarded); it counts as pending like one node__gate_hold passed. */
struct node_req *node__gate_take(struct node *n);
/* Whether node__gate_take would return a write (for the loop turn). */
bool node__gate_ready(struct node *n);
/* drain_queue: a write was proposed at `index` (ok) or refused by the core;
 * a large one was pending, a smaller one marks the large ones' time as
 * contended. */
static inline void node__gate_proposed(struct node *n, uint64_t index, uint64_t len,
                                       bool ok)
{
    if (len >= NODE_GATE_ENTRY_BYTES)
        node__gate_note(&n->gate, index, len, ok, tk_mono_ns());
    else if (ok && n->gate.pipe_n > 0)
        n->gate.small_seen = true;
}
/* Ends the held writes past their deadline with TK_ETIMEDOUT (on_tick). */
void node__gate_expire(struct node *n, uint64_t now_ms);
/* Ends every held write with `status` (the node fails or stops). */
void node__gate_fail_all(struct node *n, int status);

/* ---- node.c: its request lists, changed for node_status.c and node_install.c ---- */

/* Ends every request waiting in the applied, committed and read lists with
 * `status` (the node failed). */
static inline void node__req_fail_all(struct node *n, int status)
{
    node__fail_list(n, &n->req.applied_wait, status);
    node__fail_list(n, &n->req.committed_wait, status);
    node__fail_list(n, &n->req.read_wait, status);
    node__fail_list(n, &n->req.read_ready, status);
    node__gate_fail_all(n, status);
}

/* Ends the writes waiting to apply at or below `index` with `status` (a
 * snapshot installed past them: their outcome is unknown). */
static inline void node__req_end_applied_upto(struct node *n, uint64_t index, int status)
{
    struct node_req *r;
    while ((r = n->req.applied_wait.head) != NULL && r->index <= index) {
        node__list_pop(&n->req.applied_wait);
        node__finish_write(n, r, status, NULL);
    }
}

/* ---- node_tier.c ---- */

/* Once per loop turn: a compaction step, then a snapshot or tier-down job
 * when one is due (or waits for the one in flight if the ring is past twice
 * its budget). Fails the node on a storage error. */
void node__tier_turn(struct node *n);
/* Calls free_fn(arg) on a thread of libuv's pool at `nice` (0: the pool
 * thread's own; inline if no job can be queued), so that dropping a large
 * structure (GBs of pages, millions of entries) never holds the loop. */
void node__free_on_pool(struct node *n, void (*free_fn)(void *), void *arg, int nice);
/* Runs fn(arg) on a thread of libuv's pool at `nice`; when it cannot run
 * (no job can be queued, or the loop closes with it still queued),
 * cancel_fn(arg) runs on the loop instead (NULL: nothing). */
void node__run_on_pool(struct node *n, void (*fn)(void *), void (*cancel_fn)(void *),
                       void *arg, int nice);
/* Frees on the thread pool the log a snapshot from the leader replaced in the
 * core (raft_take_dropped), if it kept one. */
void node__drop_replaced_log(struct node *n);
/* node_backup.c: hands the snapshot in n->tier.blob to the backups it
 * satisfies and says whether one waits for a newer snapshot (each turn, from
 * node__tier_turn); fails every waiting backup with `status` (at close). */
void node__backup_turn(struct node *n);
/* The newest index a waiting backup needs a snapshot at or past (0: none). */
uint64_t node__backup_target(const struct node *n);
/* node_restore.c: --force-new-cluster's configuration entry (unless this
 * node is already the only voter), appended to the stored log and to the
 * boot log before the core reads it. */
int node__force_config(struct node *n, struct raft_boot *boot, struct raft_entry **ents,
                       size_t *n_ents);
void node__backup_fail_all(struct node *n, int status);
/* Starts a tier-down job (a snapshot when `snapshot`), on the thread pool or,
 * with `inline_run`, at once on this thread. */
void node__tier_start(struct node *n, bool snapshot, bool inline_run);
/* At boot, after the core: a snapshot job at once (inline) if the log was
 * compacted and the state is small; a large one is read out only when a
 * follower or a backup needs it (descriptor_turn). */
void node__tier_boot(struct node *n);
/* Blocks until the job in flight (if any) has run, then completes it; with
 * `discard` its snapshot is dropped (an installed one replaces it). */
void node__tier_wait(struct node *n, bool discard);
/* No tier-down job, snapshot read or compaction in flight. */
bool node__tier_idle(const struct node *n);
/* The node stops, or waits for tier work: a snapshot read in flight ends at
 * its next chunk, a paced tier-down commit stops pacing. */
void node__tier_stop(struct node *n);
/* Holds or releases applying for the KV ring's sake; before each ready. */
void node__tier_hold(struct node *n);

/* Records a mark at `index` (applied; n->tier.applied_bytes counts it). */
void node__tier_mark(struct node *n, uint64_t index);

/* Counts `len` payload bytes of a normal entry applied towards the next
 * snapshot (apply's hot path). */
static inline void node__tier_snap_count(struct node *n, size_t len)
{
    n->tier.snap_bytes += len;
}

/* The snapshot the log now starts from is at `index` (recovery, an install). */
static inline void node__tier_snap_at(struct node *n, uint64_t index)
{
    n->tier.snap_index = index;
}

/* Drops the compaction goal (a snapshot from the leader replaces the log). */
static inline void node__tier_compact_cancel(struct node *n)
{
    n->tier.compact_goal = 0;
}

/* Counts an applied entry of `len` payload bytes at `index` (apply's hot
 * path: a mark only when one is due). */
static inline void node__tier_count(struct node *n, uint64_t index, size_t len)
{
    n->tier.applied_bytes += len;
    if (index >= n->tier.next_mark_index ||
        n->tier.applied_bytes >= n->tier.next_mark_bytes)
        node__tier_mark(n, index);
}

/* ---- node_record.c ---- */

/* A record's value: RECORD_FORMAT_V1 then a kvpb.MemberRecord (node_member.c's
 * record_cmd). Builds before it wrote text, "raft=<addr|-> http=<addr|-> removed=<0|1>
 * inc=<hex|->" (inc and removed absent in the oldest): read, never written. */
#define NODE_MEMBER_REC_V1 KVPB__RECORD_FORMAT__RECORD_FORMAT_V1
#define NODE_MEMBER_REC_MAX 1024 /* no valid value of either format is longer */

/* A member record, decoded. */
struct node_member_rec {
    bool found;
    bool corrupt; /* found, but refused by node__member_rec_decode: why says why */
    bool removed;
    char inc[40]; /* the data directory's incarnation, hex; "" until known */
    char raft[NODE_ADDR_MAX];
    char http[NODE_ADDR_MAX];
    char why[96];
};

/* Decodes a member record's value (either format) into r, found. 0, or
 * TK_ECORRUPT with r->corrupt and r->why set and no field filled. */
int node__member_rec_decode(const uint8_t *v, size_t len, struct node_member_rec *r);
/* b's 16 bytes in hex (out: 33 bytes at least). */
void node__hex16(const uint8_t *b, char *out);

/* ---- node_persist.c ---- */

/* Whether this ready's append may be written on the loop
 * (node_options.follower_inline_sync_us): its messages then leave first. */
bool node__append_inline(struct node *n);
/* Queues entries for the storage thread (which reports them durable, by seq,
 * and wakes the loop), or with `now` writes them on the loop when the store is
 * idle and fast (node__append_inline); counts the append in flight. Returns
 * 0 or the store's error. */
int node__store_append(struct node *n, const struct raft_entry *entries, size_t cnt,
                       uint64_t seq, bool now);
/* Records a ready's seq handed to storage (`async`) or durable already. */
void node__persist_push(struct node *n, uint64_t seq, bool async);
/* Reports to the core every seq whose ready is durable, oldest first. */
void node__persist_poll(struct node *n);
/* Waits until every append submitted so far has finished: before a snapshot
 * replaces the log (store_reset must not race queued appends) and at close. */
void node__persist_drain(struct node *n);
void node__persist_init(struct node *n);
void node__persist_free(struct node *n);
/* The node failed (node__fail): it serves nothing from now on. */
static inline void node__persist_fail(struct node *n)
{
    n->persist.failed = true;
}
/* An install made every ready up to `seq` durable: raises durable_seq to it,
 * before any append after the install is submitted (the storage thread
 * raises it from there; nothing may lower it). */
static inline void node__persist_durable_raise(struct node *n, uint64_t seq)
{
    if (seq > atomic_load(&n->persist.durable_seq))
        atomic_store_explicit(&n->persist.durable_seq, seq, memory_order_release);
}

/* ---- node_install.c ---- */

/* Begins installing `meta`/`data` (a snapshot the core handed out): the
 * caller has drained the store's appends and the tier job. Takes a reference
 * on `data`. Returns 0 or the error (the node is then to fail). */
int node__install_start(struct node *n, const struct raft_snapshot_meta *meta,
                        struct tk_blob *data);
/* The same, while the tier's work (a tier-down job, a snapshot read, a
 * compaction) is in flight: rather than wait for it on the loop (a
 * tier-down's LMDB commit took 3.4 s at 10M keys, its sync queued behind
 * other writers' at the disk), the install is parked: busy (readies held,
 * entries kept beside it, no tier work started) but not begun.
 * node__install_unpark, each turn, begins it once that work is over; the
 * work's results are dropped meanwhile (the install replaces them). */
int node__install_park(struct node *n, const struct raft_snapshot_meta *meta,
                       struct tk_blob *data);
void node__install_unpark(struct node *n);
/* A ready of seq `seq` with no entries: true when it must wait for the
 * install in flight before it counts as durable (it is recorded as held). */
bool node__install_hold(struct node *n, uint64_t seq);
/* Blocks until the install in flight (if any) is done and completes it (for
 * what cannot go on beside it: log entries after the snapshot, another
 * snapshot). Returns 0 or the error it failed with. */
int node__install_wait(struct node *n);
/* A ready of seq `seq` with log entries, during an install: keeps them (with
 * references on their payloads) to append once the store is reset to the
 * snapshot, instead of the loop waiting for the install. False (nothing
 * kept) when no install is in flight or the bounds are reached: the caller
 * then waits (node__install_wait) and appends them itself. */
bool node__install_defer(struct node *n, const struct raft_entry *entries, size_t cnt,
                         uint64_t seq);
/* Drops the kept entries (the node stops, or the install failed). */
void node__install_defer_clear(struct node *n);
static inline bool node__installing(const struct node *n)
{
    return n->install.busy;
}
/* A snapshot message from the transport (on_recv), before the core sees it
 * (the core replaces its log with a snapshot the moment it steps one): its
 * stream is checked (kv_snap_check, and its header against the message's
 * index and term). True: refused as bad input (counted in snapshots_refused,
 * logged at most once a second), and the core must hear nothing of it (the
 * leader sends again, or entries). False: step it. */
bool node__install_check(struct node *n, const struct raft_message *m);

/* ---- node_recover.c ---- */

/* Opens the store and the state machine, checks they agree, and creates the
 * core from what they hold. On the loop's thread before its handles exist.
 * Returns 0 or the error (logged); on error the caller frees what is open. */
int node__recover(struct node *n);

/* ---- node_member.c ---- */

/* Records the peers open_transport dialed. */
void node__member_init(struct node *n);
/* Transport callbacks: is `inc` the data directory this cluster knows for
 * member `id` (recorded on first contact by the leader)? And: a member
 * refused ours. */
bool node__member_incarnation(struct transport *t, uint64_t id, const uint8_t *inc,
                              void *data);
void node__member_refused(struct transport *t, uint64_t by, void *data);
/* Transport callback: `id` is a member of the configuration in force (or
 * this node is joining and has none yet), so it may connect before its
 * address is known here. */
bool node__member_known(struct transport *t, uint64_t id, void *data);
/* The fence (--force-new-cluster, removals): true if `id` is a stranger to
 * this cluster: not a member of the configuration in force, this node being
 * one, and dropped by a forced configuration or removed (a removed record or
 * a bootstrap member, once the configuration without it is committed). A
 * fenced id is never heard (transport handshake, node.c's on_recv), so it is
 * never followed, voted for or forwarded to. */
bool node__member_fenced(struct node *n, uint64_t id);
/* At recovery, before the core is made: the epoch (the reserved record
 * NODE_EPOCH_KEY, applied or still in the boot log) into n->mem.epoch, and
 * the ids each forced configuration of the boot log dropped into
 * n->mem.fenced. A forced configuration is a configuration entry followed at
 * once by an epoch record (node__force_config writes them together). */
void node__member_boot_fence(struct node *n, const struct raft_boot *b);
/* The commands --force-new-cluster writes after its configuration: the
 * epoch record, and the removed record of a dropped id (its addresses and
 * incarnation kept). Each a new blob (one reference, the caller's). */
struct tk_blob *node__member_epoch_cmd(uint64_t epoch);
struct tk_blob *node__member_removed_cmd(struct node *n, uint64_t id);
#define NODE_EPOCH_KEY "\x01tierkv/epoch"
/* Every tick: dials members whose address became known, and moves the
 * change in progress on (commit, promotion, deadline). */
void node__member_tick(struct node *n);
/* At stop: the change in progress ends with TK_ESHUTDOWN. */
void node__member_shutdown(struct node *n);

/* ---- node_forward.c ---- */

/* Follower: gathers write `r` into this turn's batch to the leader (sent
 * when full or by node__forward_flush) or sends it alone, and parks it; or
 * fails it at once when no leader is known or the send fails. */
void node__forward_write(struct node *n, struct node_req *r);
/* Sends what this turn gathered: the follower's batch of writes, the
 * leader's answers (one frame per follower). Called at the end of each drain
 * and of each loop turn. */
void node__forward_flush(struct node *n);
/* A forwarding frame from peer `from`. An answer completes its parked
 * request; the requests for this node, as leader, are returned for the
 * caller to submit, a chain linked by `next` (NULL if none; a refused one is
 * answered here). Malformed or unmatched frames are dropped with a log
 * line. */
struct node_req *node__forward_recv(struct node *n, uint64_t from, const uint8_t *buf,
                                    size_t len);
/* Answers a request node__forward_recv returned that could not be submitted,
 * with `status`, and frees it. */
void node__forward_refuse(struct node_req *r, int status);
/* Follower, each tick: once another leader is known, the writes parked for
 * the one before end with TK_ETIMEDOUT (outcome unknown, as at their
 * deadline), not at their deadline. */
void node__forward_leader_check(struct node *n);
/* Frees the kept forwarded-write records (node teardown). */
void node__forward_free(struct node *n);

/* ---- node_check.c ---- */

/* The broken invariant of the node's state (node_check.c lists them), or
 * NULL; node.c checks after each loop turn unless NDEBUG. The parts, for the
 * unit test: */
const char *node__check(const struct node *n);
const char *node__check_lists(const struct node_requests *q, const struct req_list *fwd,
                              const struct req_list *gate);
const char *node__check_persist(const struct node_persist *p);

/* ---- node_duty.c ---- */

void node__duty_init(struct node *n);
/* Once per tick: on the leader, each idle duty's next command, as requests
 * for node_submit in out (room for NODE_DUTY_N; busy from now); their count. */
size_t node__duty_due(struct node *n, uint64_t now_ms, struct node_req **out);
/* A request node__duty_due gave that the queue refused: dropped, its duty
 * idle. */
void node__duty_refused(struct node_req *r);

/* ---- node_expire.c ---- */

/* The expire command of the keys due at now_ms (node_duty_build). */
struct tk_blob *node__expire_build(struct node *n, uint64_t now_ms);

/* node_stall.c: the stall probe (node_options.stall_probe_ms). The loop
 * thread marks itself as it starts; start and stop run on node_start's and
 * node_stop's thread. */
void node__stall_mark_loop_thread(struct node *n);
void node__stall_start(struct node *n);
void node__stall_stop(struct node *n);
/* ---- node_lease.c ---- */

void node__lease_init(struct node *n);
void node__lease_free(struct node *n);
/* Each tick, before the duties: on a change of role, forgets every deadline. */
void node__lease_role(struct node *n, bool leader, uint64_t now_ms);
/* The revoke of a lease past its deadline; the checkpoint, when due
 * (node_duty_build). */
struct tk_blob *node__lease_revoke_build(struct node *n, uint64_t now_ms);
struct tk_blob *node__lease_checkpoint_build(struct node *n, uint64_t now_ms);

#endif
