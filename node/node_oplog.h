/* The operator's log lines of a node (docs/operations.md, "Log lines") and
 * the loop thread's CPU per turn.
 *
 * Lines: one short logfmt line per event an operator acts on (an election,
 * a change of leader, a peer lost, a member added, a snapshot installed...),
 * each of a kind of NODE_OPLOG_KINDS. Every kind is rate-limited on its own:
 * a burst of NODE_OPLOG_BURST lines, then one per NODE_OPLOG_EVERY_NS; a line
 * that follows suppressed ones says how many with `suppressed=N`. A flapping
 * peer or a storm of elections thus costs a few lines a second, and one kind
 * never silences another.
 *
 * CPU: the loop thread's CPU clock (CLOCK_THREAD_CPUTIME_ID) is a system
 * call, 3.5-4.5 us on this project's paravirtual guests under load, against
 * 50-120 ns for the monotonic clock; a leader under 4,000 writes/s of a
 * 16-connection HTTP client turns 2,300 times a second (218 us each), so a
 * read per turn would cost it about 9 ms of CPU a second, 2% of its loop's
 * busy time, and more as turns get shorter (spin_us, small requests). It is
 * read at the end of a turn (node.c,
 * turn_end) only when the last read is NODE_CPU_EVERY_NS old or more, or the
 * turn could matter (it is the longest yet): at most 1,000 reads a second of
 * busy loop, about 0.4% of a core, however many turns run. A turn's CPU is
 * the clock's advance since the last read less the busy time of the turns in
 * between (each used at most its wall time of CPU): a lower bound, exact when
 * the last read was at the turn's start and low by under NODE_CPU_EVERY_NS
 * otherwise. A turn of NODE_CPU_EVERY_NS or more is always read at its end.
 * On a loop shared by several nodes (node_options.loop, tests) the clock
 * counts every node's work there, so a turn's figure may include theirs.
 *
 * Loop thread only (the node's), like everything in node_internal.h. */
#ifndef TK_NODE_NODE_OPLOG_H
#define TK_NODE_NODE_OPLOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/log.h"
#include "raft/raft.h"

/* Each kind's name is its line's msg. */
#define NODE_OPLOG_KINDS(X)                                                              \
    X(ELECTION_STARTED, "election started")                                              \
    X(ELECTION_WON, "election won")                                                      \
    X(ELECTION_LOST, "election lost")                                                    \
    X(LEADER_CHANGED, "leader changed")                                                  \
    X(PEER_CONNECTED, "peer connected")                                                  \
    X(PEER_LOST, "peer lost")                                                            \
    X(MEMBER_ADDED, "member added")                                                      \
    X(MEMBER_PROMOTED, "member promoted")                                                \
    X(MEMBER_REMOVED, "member removed")                                                  \
    X(SNAPSHOT_SENT, "snapshot sent")                                                    \
    X(SNAPSHOT_INSTALLED, "snapshot installed")                                          \
    X(NODE_REFUSED, "node refused")                                                      \
    X(SLOW_TURN, "slow loop turn")

enum node_oplog_kind {
#define NODE_OPLOG_ENUM(k, msg) NODE_LOG_##k,
    NODE_OPLOG_KINDS(NODE_OPLOG_ENUM)
#undef NODE_OPLOG_ENUM
        NODE_LOG_N
};

#define NODE_OPLOG_BURST 3
#define NODE_OPLOG_EVERY_NS 1000000000ull

#define NODE_OPLOG_RESEND_NS 5000000000ull

/* The CPU clock is read at most this often (see above). */
#define NODE_CPU_EVERY_NS 1000000ull

struct node_oplog {
    /* Per kind: the rate limit's theoretical arrival time (GCRA: a line is
     * allowed while tat - now <= (BURST - 1) * EVERY), and the lines
     * suppressed since the last one written. */
    uint64_t tat_ns[NODE_LOG_N];
    uint64_t quiet[NODE_LOG_N];
    /* The last "term refused" line (one a second), and the refusals since. */
    uint64_t terms_logged_ns;
    uint64_t terms_quiet;
    /* What the core said at the last look (node.c, oplog_observe). */
    int role;
    uint64_t term;
    uint64_t leader;
    uint64_t config_index;
    struct raft_config config; /* the configuration then */
    /* The last "snapshot sent" line: the same snapshot to the same follower
     * again within NODE_OPLOG_RESEND_NS (the core resends it while
     * unacknowledged) writes none. */
    uint64_t snap_to, snap_index, snap_ns;
    bool seen; /* the first look only records */
};

/* The loop thread's CPU clock at its last read (see above). */
struct node_turn_cpu {
    uint64_t cpu_ns;   /* the clock then */
    uint64_t at_ns;    /* node__mono_ns() then (0: never read) */
    uint64_t busy_ns;  /* turns' busy time since, up to the current turn */
    uint64_t max_wall; /* the longest turn so far (any phase) */
};

static inline const char *node__oplog_msg(enum node_oplog_kind k)
{
    static const char *const msg[NODE_LOG_N] = {
#define NODE_OPLOG_MSG(k, m) m,
        NODE_OPLOG_KINDS(NODE_OPLOG_MSG)
#undef NODE_OPLOG_MSG
    };
    return msg[k];
}

/* Whether a line of kind k may be written at now_ns; if so, *quiet gets the
 * lines suppressed since the last one (and the count restarts). */
static inline bool node__oplog_take(struct node_oplog *l, enum node_oplog_kind k,
                                    uint64_t now_ns, uint64_t *quiet)
{
    uint64_t tat = l->tat_ns[k] > now_ns ? l->tat_ns[k] : now_ns;
    if (tat - now_ns > (NODE_OPLOG_BURST - 1) * NODE_OPLOG_EVERY_NS) {
        l->quiet[k]++;
        return false;
    }
    l->tat_ns[k] = tat + NODE_OPLOG_EVERY_NS;
    *quiet = l->quiet[k];
    l->quiet[k] = 0;
    return true;
}

/* Writes the line: msg is the kind's, then the caller's `k=v ...` pairs
 * (kvfmt, printf style), then suppressed=N when lines were. */
static inline void node__oplog_write(enum tk_log_level level, uint64_t node_id,
                                     uint64_t term, enum node_oplog_kind k,
                                     uint64_t quiet, const char *kvfmt, ...)
    __attribute__((format(printf, 6, 7)));
static inline void node__oplog_write(enum tk_log_level level, uint64_t node_id,
                                     uint64_t term, enum node_oplog_kind k,
                                     uint64_t quiet, const char *kvfmt, ...)
{
    char kv[512];
    va_list ap;
    va_start(ap, kvfmt);
    int len = vsnprintf(kv, sizeof(kv), kvfmt, ap);
    va_end(ap);
    if (len < 0)
        len = 0;
    if ((size_t)len >= sizeof(kv))
        len = (int)sizeof(kv) - 1;
    if (quiet != 0)
        snprintf(kv + len, sizeof(kv) - (size_t)len, "%ssuppressed=%llu",
                 len > 0 ? " " : "", (unsigned long long)quiet);
    tk_logf(level, node_id, term, kv, "%s", node__oplog_msg(k));
}

/* One rate-limited line of kind NODE_LOG_<kind> for node n (a struct node *)
 * in term `term`: NODE_OPLOG(n, PEER_LOST, TK_LOG_INFO, term, "peer=%d", 3). */
#define NODE_OPLOG(n, kind, level, term, ...)                                            \
    do {                                                                                 \
        uint64_t node_oplog_quiet_ = 0;                                                  \
        if ((level) >= tk_log_get_level() &&                                             \
            node__oplog_take(&(n)->oplog, NODE_LOG_##kind, node__mono_ns(),              \
                             &node_oplog_quiet_))                                        \
            node__oplog_write((level), (n)->o.id, (term), NODE_LOG_##kind,               \
                              node_oplog_quiet_, __VA_ARGS__);                           \
    } while (0)

#endif
