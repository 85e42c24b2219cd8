/* A tiny driver for the raft core scenario tests (Check).
 *
 * A cluster of N cores (ids 1..N, one bootstrap configuration of all of them)
 * lives in one struct rf_cluster. The fixture plays the node runtime around
 * each core: it drains readies into a mirror of the node's disk (hard state,
 * log, snapshot), applies committed entries, records read states and copies
 * outgoing messages into one FIFO network queue. Messages in a ready point
 * into core memory that is valid only until raft_advance(), so every message
 * is deep-copied (its entries array, and a reference on each payload blob).
 *
 * A node normally reports every ready durable at once (raft_persisted right
 * after raft_advance). With rf_hold() it keeps the ready's sequence number
 * back until rf_release(): that is how tests look at the window between
 * "written" and "durable".
 *
 * Delivery is explicit: rf_deliver_one() hands the oldest queued message to
 * its target and drains the target; rf_run() repeats until the queue is
 * empty. Messages from or to an isolated node, or matching the drop filter,
 * are discarded at delivery time. Every delivered message is also kept in the
 * trace so tests can check the conversation after the fact.
 *
 * All failures are Check assertions, so the fixture is for Check tests only. */
#ifndef TK_TESTS_RAFT_FIXTURE_H
#define TK_TESTS_RAFT_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "raft/raft.h"

/* A growable list of deep-copied messages. */
struct rf_msgs {
    struct raft_message *v;
    size_t n;
    size_t cap;
};

/* What the fixture remembers of an applied entry. */
struct rf_applied {
    uint64_t index;
    uint64_t term;
    uint8_t type;
};

struct rf_node {
    uint64_t id;
    struct raft *r;

    /* The node's "disk", built only from readies (and the boot state). The
     * log holds entries store_snap_index+1 .. store_snap_index+n_store. */
    struct raft_hard_state store_hs;
    uint64_t store_snap_index;
    uint64_t store_snap_term;
    struct raft_entry *store;
    size_t n_store;
    size_t cap_store;

    /* The last snapshot a ready installed, if any. */
    bool installed_snapshot;
    struct raft_snapshot_meta snap_meta;
    struct tk_blob *snap_data;

    /* Persistence: while `hold` is set, readies are not reported durable;
     * `held_seq` is the newest seq not yet given to raft_persisted. */
    bool hold;
    uint64_t held_seq;

    /* The state machine: every applied entry, in order. */
    struct rf_applied *applied;
    size_t n_applied;
    size_t cap_applied;
    uint64_t applied_index;

    /* Every read state served, in order. */
    struct raft_read_state *reads;
    size_t n_reads;
    size_t cap_reads;

    /* Entries of the most recent ready that carried any (index, term). */
    uint64_t last_ready_first_index;
    size_t last_ready_n_entries;
    uint64_t entries_written; /* sum of n_entries over all readies */

    uint64_t n_readies;
};

typedef bool rf_drop_fn(const struct raft_message *m, void *data);

struct rf_cluster {
    size_t n;
    size_t n_voters; /* bootstrap configuration {1..n_voters}; 0: all n */
    struct raft_options tmpl;
    struct rf_node nodes[RAFT_VOTERS_MAX];
    bool isolated[RAFT_VOTERS_MAX + 1]; /* by node id */

    struct rf_msgs net;   /* queued, oldest first */
    size_t net_head;      /* first undelivered message in net */
    struct rf_msgs trace; /* every delivered message, in order */

    rf_drop_fn *drop;
    void *drop_data;
};

/* Options used by every test unless it changes them: the defaults with the
 * given election and heartbeat ticks. */
void rf_options(struct raft_options *o);

/* A new cluster of `n` nodes with empty logs, all booted with the same
 * bootstrap configuration {1..n}. `tmpl` (may be NULL for rf_options()) gives
 * every option but id; the seed of node i is tmpl->seed + i. */
struct rf_cluster *rf_new(size_t n, const struct raft_options *tmpl);
/* Like rf_new, but only nodes 1..voters are in the bootstrap configuration:
 * the others are spare cores, not members, to be added by a test. */
struct rf_cluster *rf_new_spare(size_t n, size_t voters, const struct raft_options *tmpl);
void rf_free(struct rf_cluster *c);

/* Replaces node `id` with a fresh core booted from hard state (term, vote)
 * and a log whose entry i (1-based) has term terms[i-1]. Entries are normal
 * entries with a small payload naming (index, term). */
void rf_boot_log(struct rf_cluster *c, uint64_t id, uint64_t term, uint64_t vote,
                 const uint64_t *terms, size_t n_terms);

struct rf_node *rf_node(struct rf_cluster *c, uint64_t id);
struct raft *rf_raft(struct rf_cluster *c, uint64_t id);

/* Drains every ready of node `id`: mirror, apply, capture messages. */
void rf_drain(struct rf_cluster *c, uint64_t id);
void rf_drain_all(struct rf_cluster *c);

/* Stops / resumes reporting node `id`'s readies durable. rf_release reports
 * everything written so far and drains. */
void rf_hold(struct rf_cluster *c, uint64_t id);
void rf_release(struct rf_cluster *c, uint64_t id);

/* One raft_tick on node `id`, then drain it. */
void rf_tick(struct rf_cluster *c, uint64_t id);

/* Steps a message (which the caller keeps) into its target, then drains it.
 * Returns raft_step's result. */
int rf_step(struct rf_cluster *c, const struct raft_message *m);

/* Delivers the oldest queued message (or drops it). Returns false when the
 * queue is empty. */
bool rf_deliver_one(struct rf_cluster *c);

/* Delivers the oldest queued message matching (from, to, type), wildcards as
 * in rf_queued_count, leaving the others queued in order. Returns false if
 * none matches. */
bool rf_deliver_first(struct rf_cluster *c, uint64_t from, uint64_t to, int type);

/* Drains every node, then delivers until the queue is empty. */
void rf_run(struct rf_cluster *c);

/* Discards every queued message. */
void rf_net_clear(struct rf_cluster *c);

/* Ticks node `id` (delivering nothing) until it leaves the follower role;
 * returns the number of ticks it took. Fails the test after `max` ticks. */
uint32_t rf_tick_until_campaign(struct rf_cluster *c, uint64_t id, uint32_t max);

/* Makes node `id` leader: ticks it until it campaigns, then rf_run(); the
 * node must end up leader with its no-op entry committed (unless a drop
 * filter stops that). Returns the leader's term. */
uint64_t rf_elect(struct rf_cluster *c, uint64_t id);

/* Ticks the leader `id` once and runs the network, `rounds` times. */
void rf_heartbeat_rounds(struct rf_cluster *c, uint64_t id, int rounds);

/* Queued (undelivered) messages: count, and the first match. from/to 0 and
 * type RAFT_MSG_NONE match anything. */
size_t rf_queued_count(const struct rf_cluster *c, uint64_t from, uint64_t to, int type);
const struct raft_message *rf_queued_find(const struct rf_cluster *c, uint64_t from,
                                          uint64_t to, int type);

/* Delivered messages (the trace): count and first match, same wildcards. */
size_t rf_trace_count(const struct rf_cluster *c, uint64_t from, uint64_t to, int type);
const struct raft_message *rf_trace_find(const struct rf_cluster *c, uint64_t from,
                                         uint64_t to, int type);

/* Proposes `n` normal entries with `payload_bytes` bytes each on node `id`,
 * then drains it. Returns raft_propose's result; *first_index if not NULL. */
int rf_propose(struct rf_cluster *c, uint64_t id, size_t n, size_t payload_bytes,
               uint64_t *first_index);

/* The read state with `ctx` served by node `id`, or NULL. */
const struct raft_read_state *rf_read_state(const struct rf_cluster *c, uint64_t id,
                                            uint64_t ctx);

/* The term of the entry at `index` in the core's log (0 if unknown). */
uint64_t rf_term_at(struct rf_cluster *c, uint64_t id, uint64_t index);

/* The term at `index` in the fixture's mirror of node `id`'s disk, 0 if the
 * mirror has no such entry. */
uint64_t rf_store_term_at(const struct rf_cluster *c, uint64_t id, uint64_t index);
uint64_t rf_store_last_index(const struct rf_cluster *c, uint64_t id);

/* Asserts that node `b`'s log, in the core and on its mirrored disk, equals
 * node `a`'s core log from index `from` to a's last index. */
void rf_assert_logs_equal(struct rf_cluster *c, uint64_t a, uint64_t b, uint64_t from);

/* A message of `type` (enum raft_msg_type) from -> to at term, every other
 * field zero. */
struct raft_message rf_msg(int type, uint64_t from, uint64_t to, uint64_t term);
/* Deep copy and release of a message (entries array and payload refs). */
void rf_msg_copy(struct raft_message *dst, const struct raft_message *src);
void rf_msg_release(struct raft_message *m);

#endif
