/* Internals shared by the files of raft/: the in-memory log, per-follower
 * progress and the struct raft itself. Nothing outside raft/ includes this. */
#ifndef TK_RAFT_INTERNAL_H
#define TK_RAFT_INTERNAL_H

#include "base/prng.h"
#include "raft/raft.h"

/* The log after the snapshot: entries [base_index + 1, base_index + n], kept
 * contiguous in `ents[head .. head + n)` so a range can be handed out as one
 * pointer. Each entry holds a reference on its payload. */
struct raft__log {
    struct raft_entry *ents;
    size_t cap;
    size_t head;
    size_t n;
    uint64_t base_index; /* the snapshot (or 0): the entry before the first */
    uint64_t base_term;
};

void raft__log_init(struct raft__log *l);
void raft__log_free(struct raft__log *l);
uint64_t raft__log_last_index(const struct raft__log *l);
uint64_t raft__log_last_term(const struct raft__log *l);
/* 0 and *term set, or TK_ECOMPACTED (below base) or TK_EUNAVAIL (beyond last). */
int raft__log_term(const struct raft__log *l, uint64_t index, uint64_t *term);
/* Term at index, or 0 if unknown. */
uint64_t raft__log_term_or0(const struct raft__log *l, uint64_t index);
struct raft_entry *raft__log_at(const struct raft__log *l, uint64_t index);
/* Appends copies of `e` (which must continue the log), taking references. */
void raft__log_append(struct raft__log *l, const struct raft_entry *e, size_t n);
/* Makes room for `cap` entries at once (no copying while the log stays under
 * about half of that). */
void raft__log_reserve(struct raft__log *l, size_t cap);
/* Drops entries with index >= `index`. */
void raft__log_truncate(struct raft__log *l, uint64_t index);
/* Drops entries with index <= `index` (which must be in the log or base);
 * their payload references go to out[] (one per entry dropped, in order)
 * when out is not NULL, else are dropped. Returns how many were dropped. */
size_t raft__log_compact(struct raft__log *l, uint64_t index, struct tk_blob **out);
/* Moves the whole log into *keep (an empty log: no array) for the driver to
 * free, or drops it inline when keep already holds one; the log restarts
 * after (index, term). */
void raft__log_reset_into(struct raft__log *l, uint64_t index, uint64_t term,
                          struct raft__log *keep);
/* Drops everything; the log restarts after (index, term). */
void raft__log_reset(struct raft__log *l, uint64_t index, uint64_t term);

enum raft__pr_state {
    RAFT__PR_PROBE = 0,
    RAFT__PR_REPLICATE = 1,
    RAFT__PR_SNAPSHOT = 2,
};

/* The leader's view of one member, voter or learner (thesis 3.5; etcd's
 * Progress). In probe state
 * one append is in flight at a time; in replicate state appends are pipelined
 * up to the inflight window (count and bytes); in snapshot state nothing is
 * sent until the snapshot is acknowledged or times out. */
struct raft__progress {
    uint64_t id;
    uint64_t match;
    uint64_t next;
    uint8_t state;
    bool probe_sent;
    bool recent_active;
    uint64_t pending_snapshot;
    uint32_t snapshot_ticks;
    uint32_t stall_ticks; /* replicate: ticks since match last advanced */
    uint64_t read_round;  /* highest heartbeat round acknowledged */
    /* Catch-up rounds (cowsql's rule; raft_catch_up): the round under way ends
     * when match reaches round_target (the leader's last index when it began,
     * at leader tick round_start); round_ticks is the last completed one's
     * length. */
    uint64_t round_target;
    uint64_t round_start;
    uint32_t round_ticks;
    uint32_t rounds;
    /* Inflight window: a ring of (last index, bytes) per unacked append. */
    uint64_t *infl_index;
    uint64_t *infl_bytes;
    uint32_t infl_cap;
    uint32_t infl_start;
    uint32_t infl_count;
    uint64_t infl_total_bytes;
};

void raft__pr_init(struct raft__progress *p, uint32_t inflight_max);
void raft__pr_free(struct raft__progress *p);
void raft__pr_reset(struct raft__progress *p, uint64_t id, uint64_t next);
void raft__pr_become_probe(struct raft__progress *p);
void raft__pr_become_replicate(struct raft__progress *p);
void raft__pr_become_snapshot(struct raft__progress *p, uint64_t index);
bool raft__pr_paused(const struct raft__progress *p, uint64_t bytes_max);
void raft__pr_infl_add(struct raft__progress *p, uint64_t last, uint64_t bytes);
void raft__pr_infl_free_to(struct raft__progress *p, uint64_t index);
void raft__pr_infl_free_first(struct raft__progress *p);
void raft__pr_infl_reset(struct raft__progress *p);

/* An outgoing message in the outbox. AppendEntries messages name their range
 * (prev_index + n_entries, last entry term) and are resolved to log pointers in
 * raft_ready(); a range that changed meanwhile is dropped. */
struct raft__out {
    struct raft_message m;
    uint64_t last_term;
};

/* A message that may leave only after storage reports `seq` durable. An append
 * ack additionally requires the acked index still to hold `check_term`. */
struct raft__held {
    struct raft_message m;
    uint64_t seq;
    uint64_t check_term;
};

struct raft__persist_rec {
    uint64_t seq;
    uint64_t index;
    uint64_t term;
};

struct raft__read {
    uint64_t ctx;
    uint64_t from;  /* who asked: this node or a follower */
    uint64_t index; /* the read index, once known */
    uint64_t round; /* the heartbeat round that confirms it; 0: not yet sent */
};

#define RAFT__READS_MAX 4096

struct raft {
    struct raft_options o;
    struct tk_prng prng;

    /* Persistent state (thesis figure 3.1). */
    uint64_t term;
    uint64_t vote;
    struct raft__log log;
    struct raft__log dropped; /* a log a snapshot replaced (raft_take_dropped) */

    /* Membership in force and the index of the entry that set it (0: it
     * came from the snapshot or the bootstrap configuration). A leader's
     * prs[] follow it: the voters in order, then the learners. */
    struct raft_config config;
    uint64_t config_index;
    struct raft_config base_config; /* in force at log.base_index */

    /* The newest local snapshot (what a lagging follower is sent). */
    struct raft_snapshot_meta snap;
    struct tk_blob *snap_data;
    /* Leader: a follower needs a snapshot and snap_data is NULL (the driver
     * set the snapshot's descriptor only): raft_snapshot_wanted. */
    bool snap_wanted;
    uint64_t answering; /* leader: whose append response is being handled */

    /* Volatile state. */
    uint8_t role;
    uint64_t leader;
    uint64_t commit;
    uint64_t applied;  /* reported by raft_applied */
    uint64_t applying; /* handed out in readies */
    bool apply_held;   /* raft_hold_apply: hand out no committed entries */
    uint64_t stable;   /* durable and matching prefix of the log */
    uint64_t unstable; /* first index not yet handed out to storage */
    bool hs_dirty;
    bool soft_dirty;
    uint32_t election_elapsed;
    uint32_t heartbeat_elapsed;
    uint32_t election_timeout; /* randomized, in [e, 2e) */

    /* Candidate. */
    int8_t votes[RAFT_VOTERS_MAX]; /* -1 unknown, 0 refused, 1 granted */
    uint64_t self_vote_seq;        /* our own vote counts once this is durable */
    bool self_vote_durable;

    /* Leader. */
    struct raft__progress prs[RAFT_MEMBERS_MAX];
    uint64_t leader_ticks; /* ticks as leader, the clock of catch-up rounds */
    uint64_t transfer_to;
    uint32_t transfer_elapsed;
    bool transfer_sent;
    bool committed_in_term;

    /* Reads (thesis 6.4). */
    struct raft__read *reads;
    size_t n_reads, cap_reads;
    uint64_t read_round;
    bool read_hb_needed;
    uint64_t read_rounds;   /* rounds started, a counter for metrics */
    uint64_t acks_merged;   /* append acks folded into a later one (metrics) */
    uint64_t terms_refused; /* messages refused for their term (metrics) */

    /* Snapshot received, to hand out in the next ready. */
    bool snap_install;
    struct tk_blob *snap_install_data;

    /* Outputs. */
    struct raft__out *out;
    size_t n_out, cap_out;
    struct raft__held *held;
    size_t n_held, cap_held;
    struct raft_read_state *rs;
    size_t n_rs, cap_rs;
    struct raft_message *ready_msgs; /* raft_ready's resolved copy of `out` */
    size_t cap_ready_msgs;

    /* Durability bookkeeping. */
    uint64_t next_seq;      /* the seq the next ready with work gets */
    uint64_t handed_seq;    /* the last seq handed out with work */
    uint64_t persisted_seq; /* the last seq reported durable */
    struct raft__persist_rec *prec;
    size_t prec_head, n_prec, cap_prec;
};

/* Grows `*arr` (of `elem` bytes each) to hold at least `need` elements. */
void raft__grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Aborts (TK_ASSERT) if `r` breaks one of the invariants listed in check.c.
 * O(voters). raft.c runs it at the end of every public mutator. */
void raft__check_invariants(const struct raft *r);
/* The shape of a configuration (voter and learner counts, no id 0 or twice); run
 * when one is set. */
void raft__check_config(const struct raft_config *c);
/* True if `c` can be put in force: 1 .. RAFT_VOTERS_MAX voters, at most
 * RAFT_LEARNERS_MAX learners, no id 0 and none twice. For configurations that
 * come from outside the core (a peer's snapshot, the boot state), which are
 * input and refused, never asserted on (config.c). */
bool raft__config_valid(const struct raft_config *c);

#endif
