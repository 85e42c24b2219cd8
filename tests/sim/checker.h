/* The simulator's invariant checker: Raft's safety properties (thesis 3.6.3,
 * figure 3.2) checked incrementally from plain facts the driver reports.
 *
 * The checker knows nothing about struct raft: the simulator tells it what each
 * node did (became leader, advanced its commit index, appended or applied an
 * entry, made state durable, sent a message) and answers three questions about a
 * node's current log through struct ck_ops. That keeps the checker small enough
 * to be tested on its own with known-bad histories (checker_test.c).
 *
 * Invariants, each named in the violation message:
 *   election-safety       at most one leader per term
 *   log-matching          entries with the same (index, term) are identical and
 *                         follow the same previous term, hence equal prefixes
 *   leader-completeness   an entry committed in term T is in the log of every
 *                         leader of a term above T
 *   state-machine-safety  the same entry (and the same state) at each applied
 *                         index on every node; only committed entries applied;
 *                         no command applied at two indexes
 *   commit-monotonic      a node's commit index never decreases while it is up
 *   commit-durability     a committed entry is durable on a majority of the
 *                         voters it was committed under (the committing node's
 *                         configuration, ck_voters) when it is committed, and
 *                         stays so across crashes
 *   commit-rule           a leader advances its commit index only to an
 *                         entry of its own term (figure 8, thesis 3.6.2)
 *   durable-before-send   a granted vote, the entries an append ack covers
 *                         and a leader's term and self-vote are durable
 *                         before the message that relies on them is sent
 *   read-linearizable     a read index covers every entry committed before the
 *                         read was asked for
 *
 * Election safety, log matching, leader completeness and state-machine safety
 * do not depend on the configuration, so they hold under every one: a
 * membership change (simulated with spare node ids) must keep them.
 * Node ids are 1..n. Single-threaded, like the simulator. The first violation is
 * kept (ck_violation) and every later call is a no-op returning -1. */
#ifndef TK_SIM_CHECK_H
#define TK_SIM_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_TERM_UNKNOWN UINT64_MAX

struct ck_ops {
    /* The entry at `index` in `node`'s current log: 0 with *term and *digest
     * set, or nonzero if it is not there (compacted or beyond the end). */
    int (*entry_at)(void *data, uint64_t node, uint64_t index, uint64_t *term,
                    uint64_t *digest);
    /* The index of `node`'s current snapshot (entries up to it are covered). */
    uint64_t (*snapshot_index)(void *data, uint64_t node);
    /* The term `node` leads in, or 0 if it is down or not a leader. */
    uint64_t (*leader_term)(void *data, uint64_t node);
    void *data;
};

struct ck;

struct ck *ck_new(uint32_t n_nodes, const struct ck_ops *ops);
void ck_free(struct ck *ck);

/* Virtual time for messages, in milliseconds. */
void ck_set_time(struct ck *ck, uint64_t now_ms);
/* Turns the protocol-rule checks (commit-rule, durable-before-send) off, to
 * see whether the end-to-end invariants alone catch a bug. On by default. */
void ck_set_rule_checks(struct ck *ck, bool on);

bool ck_failed(const struct ck *ck);
/* The first violation, one line; "" if none. */
const char *ck_violation(const struct ck *ck);
/* Highest index known committed anywhere. */
uint64_t ck_committed(const struct ck *ck);
/* Number of individual checks performed (for the summary). */
uint64_t ck_checks(const struct ck *ck);

/* The digest the checker expects for a payload (entry type and bytes). */
uint64_t ck_digest(uint8_t type, const uint8_t *data, size_t len);

/* `node` is in role leader in `term`. Checks election safety and, the first
 * time this (node, term) is seen, leader completeness over all entries
 * committed in earlier terms. Returns 0 or -1 on a violation. */
int ck_leader(struct ck *ck, uint64_t node, uint64_t term);

/* `node` (currently in `term`, `leader` if it leads) has commit index
 * `commit`. Entries committed for the first time are read through
 * ops.entry_at. */
int ck_commit(struct ck *ck, uint64_t node, uint64_t term, bool leader, uint64_t commit);

/* An entry entered `node`'s log at `index`; `prev_term` is the term of the
 * entry before it (0 for index 1, CK_TERM_UNKNOWN if unknown). */
int ck_append(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
              uint64_t digest, uint64_t prev_term);

/* `node` applied the entry at `index` to its state machine, which then has
 * state `state_hash`. `payload` is the client command id, 0 for none. */
int ck_applied(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
               uint64_t digest, uint64_t payload, uint64_t state_hash);
/* `node`'s state machine was replaced by a snapshot at (index, term) with
 * state `state_hash` (install, or restart from a durable snapshot). */
int ck_sm_restored(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
                   uint64_t state_hash);

/* Durable storage of `node` changed. */
void ck_durable_hard_state(struct ck *ck, uint64_t node, uint64_t term, uint64_t vote);
/* Entries [first, first + n) with `terms` are durable, after every durable
 * entry at or beyond `first` was discarded. */
int ck_durable_entries(struct ck *ck, uint64_t node, uint64_t first, size_t n,
                       const uint64_t *terms);
/* A snapshot at (index, term) is durable; `keep_suffix` tells whether the
 * durable entries after it were kept (else discarded). Earlier entries are
 * dropped. */
int ck_durable_snapshot(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
                        bool keep_suffix);

/* `node` sent a message. `type` is enum raft_msg_type; `flag` is pre_vote for
 * RAFT_MSG_VOTE, granted for VOTE_RESP (with pre_vote in `flag2`), !reject for
 * APPEND_RESP and READ_INDEX_RESP; `index` is the APPEND_RESP index. */
int ck_sent(struct ck *ck, uint64_t node, int type, uint64_t to, uint64_t term, bool flag,
            bool flag2, uint64_t index);

/* A read is asked for now: returns the token to give to ck_read_done. */
uint64_t ck_read_begin(const struct ck *ck);
int ck_read_done(struct ck *ck, uint64_t node, uint64_t token, uint64_t read_index);

/* `node`'s configuration in force now has the voters in `mask` (bit id - 1);
 * by default every node is a voter. */
void ck_voters(struct ck *ck, uint64_t node, uint32_t mask);

/* `node` restarted (new incarnation): its commit may start lower again. */
void ck_restart(struct ck *ck, uint64_t node);

#endif
