/* The pure Raft core: a deterministic state machine with no I/O.
 *
 * raft/ never reads a clock, touches a file or socket, starts a thread or calls
 * rand(): time comes in as raft_tick() calls and randomness from a seed in the
 * configuration. The same sequence of inputs gives the same outputs, which is
 * what the simulator (tests/sim) relies on to replay a failing run exactly.
 *
 * Inputs:  raft_step (a message from a peer), raft_tick (one logical tick),
 *          raft_propose (a batch of commands), raft_persisted (storage caught
 *          up), raft_applied (the state machine caught up), raft_read_index,
 *          raft_transfer_leadership, raft_snapshot_set / raft_compact.
 * Output:  a ready record (struct raft_ready): hard state and entries to
 *          persist, a snapshot to install, messages to send, committed entries
 *          to apply and read states to serve.
 *
 * The driver's loop (node/ or the simulator):
 *
 *     raft_step / raft_tick / raft_propose / raft_persisted ...
 *     if (raft_has_ready(r)) {
 *         struct raft_ready rd;
 *         raft_ready(r, &rd);
 *         install rd.snapshot if any; persist rd.hard_state and rd.entries
 *             (asynchronously is fine) and later call raft_persisted(r, rd.seq);
 *         send rd.messages; apply rd.committed; serve rd.read_states;
 *         raft_advance(r, &rd);
 *     }
 *
 * Durability (Raft thesis 3.8, 10.2.1): what a peer may rely on must be
 * durable before the peer sees it: a granted vote (its term and vote), an
 * append acknowledgement (the entries it covers), and a leader's own term and
 * self-vote (a candidate becomes leader only once they are durable). The core
 * holds back such messages and releases them in a later ready, after
 * raft_persisted() for the ready that carried that state. Messages nobody can
 * rely on (a RequestVote, a refusal) leave at once. A leader sends
 * AppendEntries before its own write is durable (in parallel), but counts
 * itself toward the quorum only up to its durable index.
 *
 * Threading: a struct raft is owned by one thread; no function is thread-safe.
 * Memory: the core allocates only when its arrays must grow (log, outbox,
 * progress windows); in steady state a step allocates nothing. Entry payloads
 * are reference-counted tk_blobs shared with the caller, never copied.
 *
 * Membership (thesis ch. 4, single-server changes): the configuration (voters
 * and learners) is data in the log. The newest RAFT_ENTRY_CONFIG entry in the
 * log (else the snapshot's configuration, else the bootstrap one) is the one
 * in force, from the moment it is appended, committed or not, on the leader
 * and on followers alike; if that entry is truncated away the previous one is
 * in force again. Why from append and not from commit: a change of one voter
 * keeps every majority of the old configuration overlapping every majority of
 * the new one, so the only rule needed is that a server acts on its newest
 * configuration; waiting for commit would need the leader to know the commit
 * before it counts the new voter, and a follower could elect with a stale one.
 * Learners receive the log and count for nothing: no vote, no quorum, never
 * campaign. A node campaigns only as a voter of the configuration in force,
 * or, while a change that removed or demoted it is uncommitted, of the
 * committed one (else losing the leader mid-change can wedge a cluster); votes
 * are always counted in the configuration in force. Vote requests from
 * non-voters are ignored while a leader is live (thesis 4.2.3), so removed or
 * not-yet-added nodes cannot disrupt the cluster. Changes go through
 * raft_change_membership, one at a time. Up to
 * RAFT_VOTERS_MAX voters and RAFT_LEARNERS_MAX learners; nothing assumes three. */
#ifndef TK_RAFT_H
#define TK_RAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/blob.h"
#include "base/err.h"

#define RAFT_VOTERS_MAX 16
#define RAFT_LEARNERS_MAX 8
#define RAFT_MEMBERS_MAX (RAFT_VOTERS_MAX + RAFT_LEARNERS_MAX)
#define RAFT_NONE 0 /* no node; node ids are 1..UINT64_MAX */
/* Terms (thesis 3.3: a server moves to any higher term it sees) are bounded so
 * that no message, from a stranger or a member, can leave a cluster unable to
 * elect a leader, and so that term arithmetic never wraps:
 *  - RAFT_TERM_CEIL (2^62) is the largest term a core ever holds. raft_step
 *    refuses a message whose term is above it, raft_new refuses a boot state
 *    with a term above it (TK_ECORRUPT), and a core at the ceiling no longer
 *    campaigns. Below it every election is possible, and each increment is
 *    checked: term + 1 <= 2^62 leaves 2^64 - 2^62 of room, so it never wraps.
 *    No real cluster gets near it: 2^62 elections.
 *  - RAFT_TERM_LEAP (2^32) is the most one message may raise a core's term by:
 *    raft_step refuses a message whose term is more than RAFT_TERM_LEAP above
 *    the receiver's. So any one message moves a term by at most 2^32, and
 *    taking a cluster from term 1 to the ceiling takes about 2^30 forged
 *    messages; a real gap is far smaller (2^32 elections of 100 ms each take
 *    13 years).
 * A refused message is dropped before anything changes (nothing to persist,
 * nothing sent), as if it were lost, which Raft always tolerates, and is
 * counted (raft_terms_refused). */
#define RAFT_TERM_CEIL (UINT64_C(1) << 62)
#define RAFT_TERM_LEAP (UINT64_C(1) << 32)

enum raft_entry_type {
    RAFT_ENTRY_NORMAL = 0,
    RAFT_ENTRY_NOOP = 1,   /* appended by each new leader (thesis 6.4) */
    RAFT_ENTRY_CONFIG = 2, /* payload: raft_config_encode() */
};

/* A log entry. `data` is a reference held by whoever holds the entry; NULL for
 * an empty payload. `time_ms` is the leader's wall clock when it proposed the
 * entry, given by the driver (TTL decisions use it, never the applier's clock). */
struct raft_entry {
    uint64_t term;
    uint64_t index;
    uint64_t time_ms;
    uint8_t type; /* enum raft_entry_type */
    struct tk_blob *data;
};

/* The cluster membership. Fields after n_voters/voters were added with
 * learners; a zeroed struct is a valid empty learner set. */
struct raft_config {
    uint32_t n_voters;
    uint64_t voters[RAFT_VOTERS_MAX];
    uint32_t n_learners;
    uint64_t learners[RAFT_LEARNERS_MAX];
};

/* Encodes a configuration as an entry payload. Without learners: the original
 * format, u32 count then count u64 voter ids (so logs stay readable by older
 * builds); with learners: u32 RAFT_CONFIG_V2_TAG, u32 n_voters, u32
 * n_learners, then the voter ids and the learner ids; all little-endian.
 * Returns a new blob with one reference. */
#define RAFT_CONFIG_V2_TAG 0xC0F10002u
struct tk_blob *raft_config_encode(const struct raft_config *c);
/* Decodes either format. Returns 0 or TK_ECORRUPT if the bytes are malformed
 * (wrong length, no voter, more than RAFT_VOTERS_MAX voters or
 * RAFT_LEARNERS_MAX learners, a zero id, an id twice in either list). Never
 * asserts on the bytes. */
int raft_config_decode(const uint8_t *buf, size_t len, struct raft_config *out);
/* True if `id` is a voter of `c` (learners are not). */
bool raft_config_has(const struct raft_config *c, uint64_t id);
/* True if `id` is a learner of `c`. */
bool raft_config_has_learner(const struct raft_config *c, uint64_t id);
/* True if `id` is a voter or a learner of `c`. */
bool raft_config_is_member(const struct raft_config *c, uint64_t id);
/* True if both hold the same voters and learners, in any order. */
bool raft_config_equal(const struct raft_config *a, const struct raft_config *b);

/* Distinct answers of raft_change_membership (aliases of base/err.h codes
 * until that list gets its own names for them). */
#define RAFT_ECHANGE_PENDING                                                             \
    TK_EBUSY                          /* a change is uncommitted, or the leader          \
                                         has not committed in its term yet */
#define RAFT_ENOT_CAUGHT_UP TK_ERANGE /* promotion of a lagging learner */
#define RAFT_EMEMBER TK_ECOMPARE      /* add of an id already a member */

enum raft_change_type {
    RAFT_CHANGE_ADD_LEARNER = 1, /* a new id joins as a learner */
    RAFT_CHANGE_PROMOTE = 2,     /* a caught-up learner becomes a voter */
    RAFT_CHANGE_DEMOTE = 3,      /* a voter becomes a learner */
    RAFT_CHANGE_REMOVE = 4,      /* a voter or learner leaves */
};

/* One single-server membership change. */
struct raft_change {
    uint8_t type; /* enum raft_change_type */
    uint64_t id;
};

/* What a snapshot covers: the log up to and including (index, term), and the
 * configuration in force at that index. */
struct raft_snapshot_meta {
    uint64_t index;
    uint64_t term;
    struct raft_config config;
};

struct raft_hard_state {
    uint64_t term;
    uint64_t vote; /* RAFT_NONE if no vote in `term` */
};

enum raft_msg_type {
    RAFT_MSG_NONE = 0,
    RAFT_MSG_VOTE,            /* RequestVote (pre-vote when .vote.pre_vote) */
    RAFT_MSG_VOTE_RESP,       /* its response */
    RAFT_MSG_APPEND,          /* AppendEntries; a heartbeat has no entries */
    RAFT_MSG_APPEND_RESP,     /* its response (also answers a snapshot) */
    RAFT_MSG_SNAPSHOT,        /* InstallSnapshot */
    RAFT_MSG_TIMEOUT_NOW,     /* leadership transfer: start an election now */
    RAFT_MSG_READ_INDEX,      /* follower -> leader: give me a read index */
    RAFT_MSG_READ_INDEX_RESP, /* leader -> follower */
    RAFT_MSG_TYPE_COUNT,
};

const char *raft_msg_type_name(int type);

struct raft_msg_vote {
    uint64_t last_log_index;
    uint64_t last_log_term;
    bool pre_vote;
    bool transfer; /* sent because of TimeoutNow: bypasses leader stickiness */
};

struct raft_msg_vote_resp {
    bool pre_vote;
    bool granted;
};

/* AppendEntries. `entries` points at `n_entries` entries that the sender keeps
 * alive until the message is consumed (see raft_ready); a receiver that keeps
 * an entry takes its own reference on entry.data. */
struct raft_msg_append {
    uint64_t prev_index;
    uint64_t prev_term;
    uint64_t commit;
    uint64_t read_ctx; /* heartbeat round echoed back (ReadIndex, 6.4) */
    uint32_t n_entries;
    struct raft_entry *entries;
};

/* On success `index` is the highest index known to match the leader's log.
 * On a reject, `index` is the prev_index that was refused and (conflict_index,
 * conflict_term) is the fast-backtracking hint (thesis 5.3): the largest index
 * <= min(prev_index, follower's last) whose term is <= prev_term, and that term.
 * The leader then retries from the largest index of its own log whose term is
 * <= conflict_term, skipping a whole conflicting term per round trip. */
struct raft_msg_append_resp {
    bool reject;
    uint64_t index;
    uint64_t conflict_index;
    uint64_t conflict_term;
    uint64_t read_ctx;
};

/* InstallSnapshot (thesis 5.2). The core sends and receives whole snapshots
 * (offset 0, done); the TCP transport cuts `data` into chunks on the wire and
 * reassembles them before delivery (proto keeps offset and done). */
struct raft_msg_snapshot {
    struct raft_snapshot_meta meta;
    uint64_t offset;
    bool done;
    uint64_t total;       /* the TCP transport's: the whole data's size, 0 unknown */
    struct tk_blob *data; /* borrowed, like entries */
};

struct raft_msg_read_index {
    uint64_t ctx;   /* the requester's read id, echoed in the response */
    uint64_t index; /* response: the read index; 0 with reject */
    bool reject;    /* response: not leader, or not ready to serve reads */
};

struct raft_message {
    uint8_t type; /* enum raft_msg_type */
    uint64_t from;
    uint64_t to;
    uint64_t term;
    union {
        struct raft_msg_vote vote;
        struct raft_msg_vote_resp vote_resp;
        struct raft_msg_append append;
        struct raft_msg_append_resp append_resp;
        struct raft_msg_snapshot snapshot;
        struct raft_msg_read_index read_index;
    } u;
};

/* A read that may be served once the local applied index reaches `index`
 * (ReadIndex, thesis 6.4). `ctx` is the id given to raft_read_index. A read the
 * leader refused comes back with `index` 0 and `failed` set. */
struct raft_read_state {
    uint64_t ctx;
    uint64_t index;
    bool failed;
};

enum raft_role {
    RAFT_FOLLOWER = 0,
    RAFT_PRE_CANDIDATE = 1,
    RAFT_CANDIDATE = 2,
    RAFT_LEADER = 3,
};

const char *raft_role_name(int role);

/* Everything the driver must do. All pointers are borrowed from the core and
 * stay valid until raft_advance(); the driver makes no other raft call on this
 * struct raft between raft_ready() and raft_advance(). */
struct raft_ready {
    uint64_t seq; /* give to raft_persisted() once this ready is durable */

    /* Persist before reporting seq: the hard state if `hard_state_changed`. */
    bool hard_state_changed;
    struct raft_hard_state hard_state;

    /* If not NULL: replace the state machine and the whole log with this
     * snapshot (log entries after it that match may be kept). Do it before
     * persisting `entries`. */
    const struct raft_snapshot_meta *snapshot;
    struct tk_blob *snapshot_data;

    /* Append these entries, first discarding any stored entry whose index is
     * >= entries[0].index. */
    const struct raft_entry *entries;
    size_t n_entries;

    /* Send. Order within one destination matters (pipelined appends). */
    const struct raft_message *messages;
    size_t n_messages;

    /* Apply in order; call raft_applied() when done (may be later). */
    const struct raft_entry *committed;
    size_t n_committed;

    const struct raft_read_state *read_states;
    size_t n_read_states;

    /* Soft state, for information: who leads, and our role. */
    uint64_t leader;
    uint8_t role;
    uint64_t commit;
};

/* What the driver recovered from storage. `entries` are the log after the
 * snapshot (indexes snapshot.index+1 ..), in order; the core takes a reference
 * on each entry.data. If there is neither a snapshot nor a config entry in the
 * log, `bootstrap` is the initial configuration (every node of a new cluster
 * is given the same one). */
struct raft_boot {
    struct raft_hard_state hard_state;
    struct raft_snapshot_meta snapshot; /* index 0 when there is none */
    struct tk_blob *snapshot_data;      /* borrowed; NULL when none */
    const struct raft_entry *entries;
    size_t n_entries;
    struct raft_config bootstrap;
    uint64_t applied; /* the state machine already holds up to here */
};

/* Planted bugs, for proving that the simulator's checks can fail. A raft library
 * compiled with -DRAFT_PLANTED_BUG=n carries bug n; the production library is
 * compiled without it and contains none of this code. tests/sim builds one
 * simulator per bug (raft-sim-bug1..5) and requires each sweep to fail. */
enum raft_bug {
    RAFT_BUG_NONE = 0,
    RAFT_BUG_VOTE_BEFORE_PERSIST = 1, /* grant a vote before it is durable */
    RAFT_BUG_COMMIT_OLD_TERM = 2,     /* commit a previous-term entry by count */
    RAFT_BUG_ACK_BEFORE_PERSIST = 3,  /* ack an append before it is durable */
    RAFT_BUG_CONFIG_UNCOMMITTED = 4,  /* append a config change without the
                                         own-term commit, or with another one
                                         still uncommitted */
    RAFT_BUG_NO_TERM_LEAP = 5,        /* take a term of any height up to
                                         RAFT_TERM_CEIL from one message */
};

struct raft_options {
    uint64_t id;                 /* this node; not RAFT_NONE */
    uint64_t seed;               /* randomness for election timeouts */
    uint32_t election_ticks;     /* timeout is uniform in [e, 2e) ticks; e > heartbeat */
    uint32_t heartbeat_ticks;    /* leader heartbeat period */
    bool pre_vote;               /* thesis 9.6 */
    bool check_quorum;           /* leader steps down without majority contact */
    uint32_t max_append_entries; /* entries per AppendEntries message */
    uint64_t max_append_bytes;   /* payload bytes per AppendEntries message */
    uint32_t max_inflight_msgs;  /* unacked AppendEntries per follower */
    uint64_t max_inflight_bytes; /* unacked payload bytes per follower */
    uint32_t max_uncommitted;    /* proposals refused with TK_EBUSY beyond this */
    uint64_t max_apply_bytes;    /* payload bytes of committed entries per ready
                                    (at least one entry; 0: no limit): the rest
                                    come in the next readies, so the driver's
                                    apply of a backlog is bounded per ready */
    uint32_t max_apply_entries;  /* committed entries per ready (0: no limit):
                                    the bytes bound alone let 4 MiB of 100-byte
                                    writes, 30k+ applies, through at once */
    uint64_t log_reserve;        /* room for this many entries from the start
                                    (0: grow as needed); growing a large log
                                    copies it, which a host may not want to
                                    do in the middle of a write */
};

/* Sensible defaults: election 10, heartbeat 1, pre-vote and check-quorum on,
 * 256 entries / 1 MiB per message, 64 messages / 8 MiB in flight, 65536
 * uncommitted entries, 2 MiB or 4096 committed entries per ready. The caller sets
 * id and seed. */
void raft_options_default(struct raft_options *o);

struct raft;

/* Creates a core from options and recovered state. Returns 0, TK_EINVAL when
 * the options or boot state are inconsistent (id 0, heartbeat >= election,
 * a gap in boot entries, no configuration), or TK_ECORRUPT when a term of the
 * boot state (the hard state's, the snapshot's or an entry's) is above
 * RAFT_TERM_CEIL: no core ever holds such a term, so the storage is bad. */
int raft_new(const struct raft_options *o, const struct raft_boot *boot,
             struct raft **out);
/* Frees the core and drops its references on entry payloads. */
void raft_free(struct raft *r);

/* One logical tick: elections and heartbeats are counted in ticks. */
void raft_tick(struct raft *r);

/* A message from a peer. The core copies what it keeps (taking references on
 * payloads); `m` stays the caller's. Stale or malformed messages are ignored or
 * answered, never asserted on. Returns 0; TK_EINVAL for a message addressed to
 * another node or of an unknown type; TK_ERANGE for a message whose term is
 * above RAFT_TERM_CEIL or more than RAFT_TERM_LEAP above this core's term
 * (bad input: refused before anything changes, and counted in
 * raft_terms_refused). A refused message is dropped; the driver need not act
 * on the error beyond logging or counting it. */
int raft_step(struct raft *r, const struct raft_message *m);

/* Appends a batch of commands to the leader's log. The core takes references
 * on each data blob. On success *first_index is the index of the first entry
 * (the rest follow in order) and *term the term they were proposed in; the
 * driver learns their fate from rd.committed (same index and term: committed;
 * a different term at that index: lost). Returns TK_ENOTLEADER, TK_EBUSY
 * (leadership transfer in progress or too many uncommitted entries) or
 * TK_EINVAL (a config entry: use raft_change_membership; or n == 0). */
int raft_propose(struct raft *r, const struct raft_entry *entries, size_t n,
                 uint64_t *first_index, uint64_t *term);

/* Storage has made everything in readies up to `seq` durable. */
void raft_persisted(struct raft *r, uint64_t seq);

/* The state machine has applied everything up to `index`. */
void raft_applied(struct raft *r, uint64_t index);

/* While `hold` is set, readies hand out no committed entries (commitment,
 * replication, votes and heartbeats go on): the driver's state machine cannot
 * take more for now (the node: its KV ring is past twice its budget while a
 * tier-down runs). Entries keep committing and are handed out, in order,
 * once it is cleared. A snapshot to install is handed out regardless. */
void raft_hold_apply(struct raft *r, bool hold);

/* Asks for a linearizable read index (thesis 6.4). The answer arrives as a
 * read state with this ctx. Returns TK_ENOLEADER when no leader is known. */
int raft_read_index(struct raft *r, uint64_t ctx);

/* Leader only: hands leadership to `to` (thesis 3.10). Proposals are refused
 * with TK_EBUSY until it succeeds or an election timeout passes. Returns
 * TK_ENOTLEADER, or TK_EINVAL if `to` is not a voter (a learner included) or is
 * this node. */
int raft_transfer_leadership(struct raft *r, uint64_t to);

/* The state machine has a snapshot covering up to `meta->index` (which must be
 * applied); the leader sends `data` to followers that need a snapshot. The core
 * takes a reference on `data`. The snapshot records the configuration in force
 * at meta->index, which the core knows (raft_config_at), not meta->config: the
 * newest configuration may be a later, uncommitted one. Returns TK_EINVAL if
 * index > applied. */
int raft_snapshot_set(struct raft *r, const struct raft_snapshot_meta *meta,
                      struct tk_blob *data);

/* raft_snapshot_set takes data = NULL too: the descriptor only (the state
 * machine holds the state at meta->index durably and can read it out later),
 * which is enough to compact the log behind it. A leader that then needs to
 * send a snapshot to a follower sends nothing to it and reports it here, until
 * the driver sets one with data (at the same or a later index); it asks again
 * if it loses leadership and leads again. It asks only on a follower's
 * answer (an append or heartbeat response), not for one that is down or cut
 * off. */
bool raft_snapshot_wanted(const struct raft *r);

/* The configuration in force at `index` (the newest config entry at or below
 * it, else the snapshot's or the bootstrap one): what a snapshot taken at
 * `index` must record. Returns 0, or TK_ECOMPACTED below the snapshot index and
 * TK_EUNAVAIL beyond the last index. */
int raft_config_at(const struct raft *r, uint64_t index, struct raft_config *out);

/* Leader only: appends a configuration entry making one change (thesis 4.1,
 * single-server). On success *index is the entry's index; the change is in
 * force at once and done when that index commits. Refused, with nothing
 * appended:
 *  - TK_ENOTLEADER;
 *  - RAFT_ECHANGE_PENDING (TK_EBUSY) while a configuration entry is
 *    uncommitted, while the leader has not committed an entry of its own term
 *    (the fix Ongaro posted to raft-dev in July 2015: without it, a new
 *    leader's change can be decided against a configuration that a
 *    concurrent, lost change of the previous term overlapped with), or during
 *    a leadership transfer;
 *  - RAFT_EMEMBER (TK_ECOMPARE): ADD_LEARNER of an id already a member;
 *  - RAFT_ENOT_CAUGHT_UP (TK_ERANGE): PROMOTE of a learner that raft_catch_up
 *    does not report caught up;
 *  - TK_ENOSPC: no room (RAFT_VOTERS_MAX / RAFT_LEARNERS_MAX);
 *  - TK_EINVAL: id 0, unknown type, PROMOTE/DEMOTE/REMOVE of a non-member, or
 *    a change leaving no voter.
 * Idempotent retries: PROMOTE of a voter and DEMOTE of a learner return 0 and
 * append nothing (*index is then the index of the configuration in force, 0 if
 * it is the bootstrap one).
 * Ids are never reused: the core refuses ids that are members, but it keeps no
 * record of removed ids; the node layer must (and refuse them before asking).
 * A leader that removes or demotes itself keeps leading (not counting itself
 * toward the new configuration's quorum) until the entry commits, then steps
 * down. */
int raft_change_membership(struct raft *r, const struct raft_change *c, uint64_t *index);

/* Catch-up of a member as the leader sees it (cowsql's rule): rounds of
 * replication, each ending when the member's match reaches the leader's last
 * index at the round's start. A learner is caught up when its latest round
 * took fewer than election_ticks ticks, or when it holds the whole log. */
struct raft_catch_up {
    bool caught_up;
    uint64_t behind;      /* leader's last index minus the member's match */
    uint64_t match;       /* the member's match index */
    uint32_t rounds;      /* rounds completed since the member's progress began */
    uint32_t round_ticks; /* length of the last completed round, in ticks */
};

/* Leader only: fills *out for member `id`. Returns TK_ENOTLEADER, or TK_EINVAL
 * if `id` is not a member. */
int raft_catch_up(const struct raft *r, uint64_t id, struct raft_catch_up *out);

/* Drops log entries up to `index` (which must be <= the snapshot index set with
 * raft_snapshot_set). The driver compacts its store likewise. Returns TK_EINVAL
 * beyond the snapshot. */
int raft_compact(struct raft *r, uint64_t index);

/* raft_compact, handing the dropped entries' payload references to the
 * caller instead of dropping them (a driver that frees payloads off its
 * loop): out must have room for index - raft_first_index(r) + 1 pointers;
 * out[i] is then the payload of entry raft_first_index(r) + i as it was
 * before the call (NULL for an entry without one), and *n_out how many were
 * handed over (0 on an error, or when nothing was compacted). The caller
 * unrefs each. */
int raft_compact_take(struct raft *r, uint64_t index, struct tk_blob **out,
                      size_t *n_out);

/* The log a snapshot from the leader replaced: when raft_step installs one
 * over a log that held entries, it keeps their array and payload references
 * aside instead of dropping them one by one (a follower behind by a snapshot
 * can hold a hundred thousand entries: freeing them held its loop for 240 ms),
 * for the driver to take and free off its loop. One replaced log is kept at a
 * time; a second replacement before the driver takes the first frees inline,
 * as does raft_free. */
struct raft_dropped {
    struct raft_entry *ents;
    size_t cap, head, n; /* the entries are ents[head, head + n) */
};

/* Takes the replaced log into *out (true), or false when none is kept. */
bool raft_take_dropped(struct raft *r, struct raft_dropped *out);

/* Drops what raft_take_dropped handed over: each entry's payload reference and
 * the array. Any thread. */
void raft_dropped_free(struct raft_dropped *d);

bool raft_has_ready(const struct raft *r);
void raft_ready(struct raft *r, struct raft_ready *rd);
void raft_advance(struct raft *r, const struct raft_ready *rd);

/* Introspection (for drivers, tests and the simulator's invariant checks). */
uint64_t raft_id(const struct raft *r);
uint64_t raft_term(const struct raft *r);
uint64_t raft_vote(const struct raft *r);
uint64_t raft_leader(const struct raft *r);
int raft_role(const struct raft *r);
uint64_t raft_commit(const struct raft *r);
uint64_t raft_applied_index(const struct raft *r);
uint64_t raft_first_index(const struct raft *r); /* first entry in memory */
uint64_t raft_last_index(const struct raft *r);
uint64_t raft_stable_index(const struct raft *r); /* durable, matching prefix */
/* ReadIndex heartbeat rounds this core started as leader since raft_new
 * (thesis 6.4). One round confirms every read waiting when it starts, its own
 * and those followers asked for, so it only grows on a leader. */
uint64_t raft_read_rounds(const struct raft *r);
/* Append acks a follower folded into the ack after them (to the same leader
 * in the same term) instead of sending each: a counter for metrics. */
uint64_t raft_acks_merged(const struct raft *r);
/* Messages raft_step refused for their term (above RAFT_TERM_CEIL, or more
 * than RAFT_TERM_LEAP above this core's term) since raft_new: a counter for
 * metrics. Anything but 0 means a broken or hostile peer. */
uint64_t raft_terms_refused(const struct raft *r);
/* Term of the entry at `index`: 0 and TK_ECOMPACTED/TK_EUNAVAIL if unknown.
 * The snapshot index has the snapshot's term. */
int raft_term_at(const struct raft *r, uint64_t index, uint64_t *term);
/* The entry at `index`, borrowed until the next raft call; NULL if absent. */
const struct raft_entry *raft_entry_at(const struct raft *r, uint64_t index);
/* The configuration in force (voters and learners): the newest in the log,
 * committed or not. */
const struct raft_config *raft_config(const struct raft *r);
/* The index of the entry that set it (0: the snapshot's or bootstrap one). */
uint64_t raft_config_index(const struct raft *r);
/* The leader's view of a member's log (voter or learner); returns
 * TK_ENOTLEADER or TK_EINVAL. */
int raft_progress(const struct raft *r, uint64_t peer, uint64_t *match, uint64_t *next);

#endif
