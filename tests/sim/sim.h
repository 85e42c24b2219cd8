/* A deterministic Raft cluster simulator: 3 to 7 raft cores (raft/raft.h) in
 * one thread with a virtual clock, a simulated network and simulated storage,
 * all driven by one seeded tk_prng, so a seed replays exactly.
 *
 * Network: per-message delay (FIFO per link, with occasional reordering),
 * drop, duplicate, delay spikes, symmetric partitions and one-way cuts, heal.
 * Messages are deep-copied when sent (entry payloads and snapshot data are
 * shared by reference), because a ready's pointers die at raft_advance.
 * Storage: what a node has made durable (hard state, snapshot, log) plus a FIFO
 * of pending writes that complete after a sync latency and then report
 * raft_persisted; a crash drops the pending writes, a restart boots a new core
 * from what was durable. State machine: a running hash over applied entries,
 * snapshotted every so often, after which the log is compacted so lagging
 * nodes get InstallSnapshot. Clients propose commands, ask for read indexes
 * and transfer leadership.
 *
 * Forged terms (with sim_config.forged_terms): the fault phase also steps
 * messages with out-of-bound terms (raft.h, RAFT_TERM_CEIL and RAFT_TERM_LEAP)
 * from member ids straight into nodes, as a lying member would.
 *
 * Membership (with sim_config.membership): spare node slots start as
 * non-members; the fault phase also adds learners, promotes them, removes
 * voters (the leader included) and so replaces nodes, and the checker judges
 * commits by the voters of the configuration they were committed under.
 *
 * sim_run plays the randomized scenario: a fault phase (crashes, restarts,
 * partitions, cuts, drops, duplicates, spikes, membership changes), then the heal
 * (network repaired, every node restarted), then a liveness bound: a leader must exist,
 * every outstanding proposal must be committed or reported failed and every
 * node caught up. The invariants of checker.h are checked after every step; the
 * first violation stops the run.
 *
 * The sim_* driving functions below let a script (the demo) run a cluster
 * without random faults. Single-threaded; a struct sim is independent of any
 * other. */
#ifndef TK_SIM_SIM_H
#define TK_SIM_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define SIM_NODES_MAX 7
#define SIM_SPARES 2 /* extra node slots with --membership */

struct sim_config {
    uint64_t seed;
    uint32_t n_nodes;     /* 1 .. SIM_NODES_MAX */
    bool faults;          /* play the random fault scenario (sim_run) */
    uint64_t fault_ms;    /* length of the fault phase; 0: chosen by seed */
    uint64_t liveness_ms; /* bound after the heal; 0: 10000 */
    bool rule_checks;     /* commit-rule and durable-before-send checks */
    bool membership;      /* SIM_SPARES more node slots (not members at first)
                           * and membership changes among the faults: add a
                           * spare as a learner, promote it once caught up,
                           * remove a voter (the leader too): with an add,
                           * a replacement. An id is never added twice. */
    bool no_heal;         /* sabotage: the heal cuts every link instead (to
                           * prove that the liveness check can fail) */
    /* 1: snapshots given to the core as descriptors only (data NULL), the
     * data given when a leader asks (raft_snapshot_wanted), as the node does
     * for a large state; the durable snapshot (what a restart boots from)
     * keeps it, and a restart gives the core none. 2: sabotage, the data is
     * never given (to prove that the sweeps would see it: liveness). */
    int lazy_snapshots;
    bool forged_terms; /* the fault phase also steps forged messages into
                        * nodes: from a member id, with the boundary terms of
                        * raft.h's bounds (RAFT_TERM_CEIL - 1 .. UINT64_MAX);
                        * every check still holds and the heal still finds
                        * a leader */
    FILE *trace;       /* every event, or NULL */
    FILE *notes;       /* readable milestones (the demo), or NULL */
};

struct sim_stats {
    uint64_t steps; /* events processed: ticks, deliveries, persists, ... */
    uint64_t msgs_sent;
    uint64_t msgs_delivered;
    uint64_t msgs_dropped;
    uint64_t msgs_duplicated;
    uint64_t crashes;
    uint64_t partitions;
    uint64_t cuts;
    uint64_t leaders; /* (node, term) leaderships seen */
    uint64_t proposals;
    uint64_t committed;
    uint64_t failed; /* lost or abandoned proposals */
    uint64_t reads;
    uint64_t reads_failed;
    uint64_t transfers;
    uint64_t changes; /* membership changes appended */
    uint64_t snapshots_taken;
    uint64_t snapshots_installed;
    uint64_t snapshots_served; /* --lazy-snapshots: data given when wanted */
    uint64_t forged;           /* --forged-terms: forged messages stepped */
    uint64_t forged_refused;   /* ... and refused for their term (TK_ERANGE) */
    uint64_t checks;
    uint64_t end_ms;
};

struct sim;

struct sim *sim_new(const struct sim_config *c);
void sim_free(struct sim *s);

/* Plays the randomized scenario. Returns 0 if every check passed, -1 on a
 * violation (see sim_violation). */
int sim_run(struct sim *s);

/* The first violation, one line ("VIOLATION <invariant>: ..."), or "". */
const char *sim_violation(const struct sim *s);
/* A hash of the whole trace: equal for two runs of the same seed. */
uint64_t sim_trace_hash(const struct sim *s);
const struct sim_stats *sim_stats(const struct sim *s);

/* Driving by script. */
uint64_t sim_now_ms(const struct sim *s);
/* Runs events for `ms` of virtual time. Returns 0 or -1 on a violation. */
int sim_run_for(struct sim *s, uint64_t ms);
/* Runs until pred(s, data) holds (checked after every step). Returns 1 when
 * it does, 0 after `max_ms` without, -1 on a violation. */
int sim_run_until(struct sim *s, bool (*pred)(struct sim *s, void *data), void *data,
                  uint64_t max_ms);
/* The up node that leads in the highest term, or 0. */
uint64_t sim_leader(const struct sim *s);
bool sim_up(const struct sim *s, uint64_t node);
uint64_t sim_term(const struct sim *s, uint64_t node);
uint64_t sim_commit(const struct sim *s, uint64_t node);
uint64_t sim_applied(const struct sim *s, uint64_t node);
/* Proposals neither committed nor failed yet. */
uint64_t sim_pending(const struct sim *s);
/* Proposes `n` commands on `node`, one batch. Returns 0 or the raft error. */
int sim_propose(struct sim *s, uint64_t node, uint32_t n);
void sim_crash(struct sim *s, uint64_t node);
void sim_restart(struct sim *s, uint64_t node);
/* Prints a note "t=  123ms  <text>" to the notes stream. */
void sim_note(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
