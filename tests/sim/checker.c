/* The simulator's invariant checker (see checker.h for the list).
 *
 * Everything is incremental so that checking after every simulated step stays
 * cheap: the committed log is a dense array indexed by raft index (committed
 * indexes always form a prefix), each committed entry carries a bitmask of the
 * nodes that hold it durably, log matching uses one global table keyed by
 * (index, term), and the leader of each term is a dense array indexed by term.
 * A full pass over the committed log happens only when a node first becomes
 * leader in a term (leader completeness). */
#include "tests/sim/checker.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "raft/raft.h"

struct ck_centry {
    uint64_t term;
    uint64_t digest;
    uint64_t commit_term;  /* the term of the node that first saw it committed */
    uint64_t state_hash;   /* state machine after applying it, once applied */
    uint32_t durable_mask; /* bit (node - 1): durable on that node */
    uint32_t voters_mask;  /* the committing node's voters when it committed */
    bool applied;
};

/* One (index, term) ever seen in any log. */
struct ck_lm {
    uint64_t index; /* 0: empty slot */
    uint64_t term;
    uint64_t digest;
    uint64_t prev_term;
};

/* The leader of one term. Terms are sparse (a core may take a term up to
 * RAFT_TERM_LEAP above its own from one message, and up to RAFT_TERM_CEIL in
 * all), so they are keys of a table, not indexes of an array. */
struct ck_lt {
    uint64_t term; /* 0: empty slot */
    uint64_t node;
};

struct ck_node {
    /* Durable state, as the simulated storage reports it. */
    uint64_t hs_term;
    uint64_t hs_vote;
    uint64_t snap_index;
    uint64_t snap_term;
    uint64_t *terms; /* durable entries snap_index + 1 .. snap_index + n */
    size_t n_terms;
    size_t cap_terms;
    /* Volatile, per incarnation. */
    uint64_t commit;
    uint64_t applied;
    uint64_t led_term; /* last term in which completeness was checked */
    uint32_t voters;   /* its configuration's voters, bit (id - 1) */
};

struct ck {
    uint32_t n;
    struct ck_ops ops;
    uint64_t now_ms;
    bool rule_checks;
    bool failed;
    char msg[768];
    uint64_t checks;
    struct ck_node *nodes;

    struct ck_centry *c; /* c[i] for committed index i, 1 <= i <= c_n */
    size_t c_cap;
    uint64_t c_n;

    struct ck_lt *lt; /* leader by term, open addressing */
    size_t lt_cap;    /* a power of two */
    size_t lt_n;

    struct ck_lm *lm;
    size_t lm_cap; /* a power of two */
    size_t lm_n;

    uint64_t *payload_index; /* by payload id: where it was applied */
    size_t payload_cap;
};

static void grow_u64(uint64_t **arr, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    *arr = tk_realloc(*arr, cap2 * sizeof(**arr));
    memset(*arr + *cap, 0, (cap2 - *cap) * sizeof(**arr));
    *cap = cap2;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t ck_digest(uint8_t type, const uint8_t *data, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ type;
    for (size_t i = 0; i < len; i++)
        h = (h ^ data[i]) * 0x100000001b3ULL;
    return mix64(h ^ len);
}

static int fail(struct ck *ck, const char *inv, uint64_t node, uint64_t index,
                uint64_t term, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static int fail(struct ck *ck, const char *inv, uint64_t node, uint64_t index,
                uint64_t term, const char *fmt, ...)
{
    if (ck->failed)
        return -1;
    ck->failed = true;
    int off = snprintf(ck->msg, sizeof(ck->msg),
                       "VIOLATION %s: t=%" PRIu64 "ms node n%" PRIu64 " index %" PRIu64
                       " term %" PRIu64 ": ",
                       inv, ck->now_ms, node, index, term);
    if (off < 0 || (size_t)off >= sizeof(ck->msg))
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ck->msg + off, sizeof(ck->msg) - (size_t)off, fmt, ap);
    va_end(ap);
    return -1;
}

struct ck *ck_new(uint32_t n_nodes, const struct ck_ops *ops)
{
    struct ck *ck = tk_calloc(1, sizeof(*ck));
    ck->n = n_nodes;
    ck->ops = *ops;
    ck->rule_checks = true;
    ck->nodes = tk_calloc(n_nodes, sizeof(*ck->nodes));
    for (uint32_t i = 0; i < n_nodes; i++)
        ck->nodes[i].voters = n_nodes >= 32 ? UINT32_MAX : (1u << n_nodes) - 1;
    ck->lm_cap = 1024;
    ck->lm = tk_calloc(ck->lm_cap, sizeof(*ck->lm));
    ck->lt_cap = 64;
    ck->lt = tk_calloc(ck->lt_cap, sizeof(*ck->lt));
    return ck;
}

void ck_free(struct ck *ck)
{
    if (ck == NULL)
        return;
    for (uint32_t i = 0; i < ck->n; i++)
        tk_free(ck->nodes[i].terms);
    tk_free(ck->nodes);
    tk_free(ck->c);
    tk_free(ck->lt);
    tk_free(ck->lm);
    tk_free(ck->payload_index);
    tk_free(ck);
}

void ck_set_time(struct ck *ck, uint64_t now_ms)
{
    ck->now_ms = now_ms;
}

void ck_set_rule_checks(struct ck *ck, bool on)
{
    ck->rule_checks = on;
}

bool ck_failed(const struct ck *ck)
{
    return ck->failed;
}

const char *ck_violation(const struct ck *ck)
{
    return ck->failed ? ck->msg : "";
}

uint64_t ck_committed(const struct ck *ck)
{
    return ck->c_n;
}

uint64_t ck_checks(const struct ck *ck)
{
    return ck->checks;
}

static struct ck_node *node_of(struct ck *ck, uint64_t node)
{
    if (node < 1 || node > ck->n)
        return NULL;
    return &ck->nodes[node - 1];
}

static bool durable_covers(const struct ck_node *nd, uint64_t index, uint64_t term)
{
    if (index <= nd->snap_index)
        return true;
    uint64_t off = index - nd->snap_index - 1;
    return off < nd->n_terms && nd->terms[off] == term;
}

static uint32_t popcount32(uint32_t x)
{
    uint32_t c = 0;
    for (; x != 0; x &= x - 1)
        c++;
    return c;
}

/* A committed entry is durable on a majority of the voters of the
 * configuration it was committed under. */
static bool durable_quorum(const struct ck_centry *e)
{
    return popcount32(e->durable_mask & e->voters_mask) >=
           popcount32(e->voters_mask) / 2 + 1;
}

void ck_voters(struct ck *ck, uint64_t node, uint32_t mask)
{
    struct ck_node *nd = node_of(ck, node);
    if (nd != NULL && mask != 0)
        nd->voters = mask;
}

/* Recomputes `node`'s durable bit for committed indexes in [lo, hi] and checks
 * that each still has a durable majority. */
static int recheck_durable(struct ck *ck, uint64_t node, uint64_t lo, uint64_t hi)
{
    struct ck_node *nd = node_of(ck, node);
    if (lo < 1)
        lo = 1;
    if (hi > ck->c_n)
        hi = ck->c_n;
    uint32_t bit = 1u << (node - 1);
    for (uint64_t i = lo; i <= hi; i++) {
        struct ck_centry *e = &ck->c[i];
        if (durable_covers(nd, i, e->term))
            e->durable_mask |= bit;
        else
            e->durable_mask &= ~bit;
        ck->checks++;
        if (!durable_quorum(e))
            return fail(ck, "commit-durability", node, i, e->term,
                        "committed entry is now durable on only %u of its %u "
                        "voters (lost from n%" PRIu64 "'s storage)",
                        popcount32(e->durable_mask & e->voters_mask),
                        popcount32(e->voters_mask), node);
    }
    return 0;
}

/* The slot of `term` in the leader table: the one holding it, or the empty
 * one where it goes. */
static struct ck_lt *lt_slot(struct ck_lt *lt, size_t cap, uint64_t term)
{
    size_t s = (size_t)(mix64(term) & (cap - 1));
    while (lt[s].term != 0 && lt[s].term != term)
        s = (s + 1) & (cap - 1);
    return &lt[s];
}

/* The leader of `term`, 0 if none yet; with `node` not 0, records it as
 * that leader when there was none. */
static uint64_t leader_of(struct ck *ck, uint64_t term, uint64_t node)
{
    struct ck_lt *e = lt_slot(ck->lt, ck->lt_cap, term);
    if (e->term != 0 || node == 0)
        return e->node;
    *e = (struct ck_lt){term, node};
    if (++ck->lt_n * 2 > ck->lt_cap) {
        struct ck_lt *old = ck->lt;
        size_t old_cap = ck->lt_cap;
        ck->lt_cap *= 2;
        ck->lt = tk_calloc(ck->lt_cap, sizeof(*ck->lt));
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].term != 0)
                *lt_slot(ck->lt, ck->lt_cap, old[i].term) = old[i];
        tk_free(old);
    }
    return 0;
}

int ck_leader(struct ck *ck, uint64_t node, uint64_t term)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    if (nd == NULL || term == 0)
        return fail(ck, "election-safety", node, 0, term,
                    "leader with an invalid node id or term 0");
    ck->checks++;
    uint64_t other = leader_of(ck, term, node);
    if (other != 0 && other != node)
        return fail(ck, "election-safety", node, 0, term,
                    "two leaders in term %" PRIu64 ": n%" PRIu64 " and n%" PRIu64, term,
                    other, node);
    if (nd->led_term == term)
        return 0;
    nd->led_term = term;
    /* Leader completeness (thesis 3.6.3): every entry committed in an earlier
     * term is in the new leader's log. */
    uint64_t snap = ck->ops.snapshot_index(ck->ops.data, node);
    for (uint64_t i = snap + 1; i <= ck->c_n; i++) {
        const struct ck_centry *e = &ck->c[i];
        if (e->commit_term >= term)
            continue;
        uint64_t t = 0, d = 0;
        ck->checks++;
        if (ck->ops.entry_at(ck->ops.data, node, i, &t, &d) != 0)
            return fail(ck, "leader-completeness", node, i, e->term,
                        "new leader of term %" PRIu64 " lacks an entry "
                        "committed in term %" PRIu64,
                        term, e->commit_term);
        if (t != e->term || d != e->digest)
            return fail(ck, "leader-completeness", node, i, e->term,
                        "new leader of term %" PRIu64 " has term %" PRIu64
                        " where an entry was committed in term %" PRIu64,
                        term, t, e->commit_term);
    }
    return 0;
}

/* Index `i` is committed for the first time, seen by `node` in `term` with
 * commit index `commit`: records
 * it and checks its durability and that later leaders hold it. */
static int commit_first(struct ck *ck, uint64_t node, uint64_t term, uint64_t commit,
                        uint64_t i)
{
    uint64_t t = 0, d = 0;
    if (ck->ops.entry_at(ck->ops.data, node, i, &t, &d) != 0)
        return fail(ck, "commit-known", node, i, term,
                    "commit index %" PRIu64 " covers an entry the "
                    "node's log does not hold",
                    commit);
    struct ck_centry *e = &ck->c[i];
    e->term = t;
    e->digest = d;
    e->commit_term = term;
    e->durable_mask = 0;
    e->voters_mask = node_of(ck, node)->voters;
    for (uint32_t k = 0; k < ck->n; k++)
        if (durable_covers(&ck->nodes[k], i, t))
            e->durable_mask |= 1u << k;
    ck->c_n = i;
    ck->checks++;
    if (!durable_quorum(e))
        return fail(ck, "commit-durability", node, i, t,
                    "entry committed while durable on only %u of "
                    "its %u voters",
                    popcount32(e->durable_mask & e->voters_mask),
                    popcount32(e->voters_mask));
    /* Leaders of later terms that already exist must hold it too. */
    for (uint64_t m = 1; m <= ck->n; m++) {
        uint64_t lt = ck->ops.leader_term(ck->ops.data, m);
        if (lt <= term)
            continue;
        if (i <= ck->ops.snapshot_index(ck->ops.data, m))
            continue;
        uint64_t mt = 0, md = 0;
        ck->checks++;
        if (ck->ops.entry_at(ck->ops.data, m, i, &mt, &md) != 0 || mt != t || md != d)
            return fail(ck, "leader-completeness", m, i, t,
                        "leader of term %" PRIu64 " lacks an entry "
                        "committed in term %" PRIu64 " (seen by n%" PRIu64 ")",
                        lt, term, node);
    }
    return 0;
}

int ck_commit(struct ck *ck, uint64_t node, uint64_t term, bool leader, uint64_t commit)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    ck->checks++;
    if (commit < nd->commit)
        return fail(ck, "commit-monotonic", node, commit, term,
                    "commit index went down from %" PRIu64 " to %" PRIu64, nd->commit,
                    commit);
    if (commit == nd->commit)
        return 0;
    nd->commit = commit;
    if (leader && ck->rule_checks) {
        uint64_t t = 0, d = 0;
        ck->checks++;
        if (ck->ops.entry_at(ck->ops.data, node, commit, &t, &d) != 0 || t != term)
            return fail(ck, "commit-rule", node, commit, t,
                        "leader of term %" PRIu64 " advanced its commit index "
                        "to an entry of term %" PRIu64 " (figure 8)",
                        term, t);
    }
    if (commit > ck->c_n) {
        if (commit + 1 > ck->c_cap) {
            size_t cap = ck->c_cap ? ck->c_cap : 256;
            while (cap < commit + 1)
                cap *= 2;
            ck->c = tk_realloc(ck->c, cap * sizeof(*ck->c));
            memset(ck->c + ck->c_cap, 0, (cap - ck->c_cap) * sizeof(*ck->c));
            ck->c_cap = cap;
        }
        for (uint64_t i = ck->c_n + 1; i <= commit; i++)
            if (commit_first(ck, node, term, commit, i) != 0)
                return -1;
        return 0;
    }
    /* A spot check of the node's log at its new commit index. */
    uint64_t t = 0, d = 0;
    if (ck->ops.entry_at(ck->ops.data, node, commit, &t, &d) == 0) {
        ck->checks++;
        if (t != ck->c[commit].term || d != ck->c[commit].digest)
            return fail(ck, "state-machine-safety", node, commit, t,
                        "node commits an entry of term %" PRIu64 " where term %" PRIu64
                        " was committed",
                        t, ck->c[commit].term);
    }
    return 0;
}

static size_t lm_slot(const struct ck *ck, uint64_t index, uint64_t term)
{
    return (size_t)(mix64(index * 0x9e3779b97f4a7c15ULL ^ term) & (ck->lm_cap - 1));
}

static void lm_grow(struct ck *ck)
{
    struct ck_lm *old = ck->lm;
    size_t old_cap = ck->lm_cap;
    ck->lm_cap *= 2;
    ck->lm = tk_calloc(ck->lm_cap, sizeof(*ck->lm));
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].index == 0)
            continue;
        size_t s = lm_slot(ck, old[i].index, old[i].term);
        while (ck->lm[s].index != 0)
            s = (s + 1) & (ck->lm_cap - 1);
        ck->lm[s] = old[i];
    }
    tk_free(old);
}

int ck_append(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
              uint64_t digest, uint64_t prev_term)
{
    if (ck->failed)
        return -1;
    if (index == 0)
        return fail(ck, "log-matching", node, index, term, "entry index 0");
    if (index == 1 && prev_term == CK_TERM_UNKNOWN)
        prev_term = 0;
    ck->checks++;
    if (prev_term != CK_TERM_UNKNOWN && prev_term > term)
        return fail(ck, "log-matching", node, index, term,
                    "entry follows an entry of the higher term %" PRIu64, prev_term);
    size_t s = lm_slot(ck, index, term);
    while (ck->lm[s].index != 0) {
        struct ck_lm *e = &ck->lm[s];
        if (e->index == index && e->term == term) {
            if (e->digest != digest)
                return fail(ck, "log-matching", node, index, term,
                            "two different entries with the same index "
                            "and term");
            if (prev_term != CK_TERM_UNKNOWN) {
                if (e->prev_term == CK_TERM_UNKNOWN)
                    e->prev_term = prev_term;
                else if (e->prev_term != prev_term)
                    return fail(ck, "log-matching", node, index, term,
                                "same (index, term) but the entry before "
                                "has term %" PRIu64 " here and %" PRIu64 " elsewhere",
                                prev_term, e->prev_term);
            }
            return 0;
        }
        s = (s + 1) & (ck->lm_cap - 1);
    }
    ck->lm[s] = (struct ck_lm){index, term, digest, prev_term};
    if (++ck->lm_n * 2 > ck->lm_cap)
        lm_grow(ck);
    return 0;
}

int ck_applied(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
               uint64_t digest, uint64_t payload, uint64_t state_hash)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    ck->checks++;
    if (index != nd->applied + 1)
        return fail(ck, "state-machine-safety", node, index, term,
                    "applied out of order (previous applied %" PRIu64 ")", nd->applied);
    if (index > ck->c_n)
        return fail(ck, "state-machine-safety", node, index, term,
                    "applied an entry that is not committed (committed "
                    "up to %" PRIu64 ")",
                    ck->c_n);
    struct ck_centry *e = &ck->c[index];
    if (e->term != term || e->digest != digest)
        return fail(ck, "state-machine-safety", node, index, term,
                    "applied an entry other than the committed one (term "
                    "%" PRIu64 ")",
                    e->term);
    if (!e->applied) {
        e->applied = true;
        e->state_hash = state_hash;
    } else if (e->state_hash != state_hash) {
        return fail(ck, "state-machine-safety", node, index, term,
                    "state after applying differs from another node's");
    }
    if (payload != 0) {
        grow_u64(&ck->payload_index, &ck->payload_cap, payload + 1);
        if (ck->payload_index[payload] == 0)
            ck->payload_index[payload] = index;
        else if (ck->payload_index[payload] != index)
            return fail(ck, "state-machine-safety", node, index, term,
                        "command %" PRIu64 " applied at two indexes (also "
                        "%" PRIu64 ")",
                        payload, ck->payload_index[payload]);
    }
    nd->applied = index;
    return 0;
}

int ck_sm_restored(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
                   uint64_t state_hash)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    nd->applied = index;
    if (index == 0)
        return 0;
    ck->checks++;
    if (index > ck->c_n)
        return fail(ck, "state-machine-safety", node, index, term,
                    "snapshot covers uncommitted entries (committed up to "
                    "%" PRIu64 ")",
                    ck->c_n);
    const struct ck_centry *e = &ck->c[index];
    if (e->term != term)
        return fail(ck, "state-machine-safety", node, index, term,
                    "snapshot ends at an entry of term %" PRIu64
                    " but the committed entry has term %" PRIu64,
                    term, e->term);
    if (e->applied && e->state_hash != state_hash)
        return fail(ck, "state-machine-safety", node, index, term,
                    "snapshot state differs from the state other nodes "
                    "reached at this index");
    return 0;
}

void ck_durable_hard_state(struct ck *ck, uint64_t node, uint64_t term, uint64_t vote)
{
    struct ck_node *nd = node_of(ck, node);
    nd->hs_term = term;
    nd->hs_vote = vote;
}

int ck_durable_entries(struct ck *ck, uint64_t node, uint64_t first, size_t n,
                       const uint64_t *terms)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    uint64_t old_last = nd->snap_index + nd->n_terms;
    /* Entries at or below the snapshot are already covered by it. */
    size_t skip = 0;
    if (first <= nd->snap_index) {
        skip = (size_t)(nd->snap_index + 1 - first);
        if (skip > n)
            skip = n;
        first = nd->snap_index + 1;
        nd->n_terms = 0;
    } else if (first - nd->snap_index - 1 < nd->n_terms) {
        nd->n_terms = (size_t)(first - nd->snap_index - 1);
    } else if (first != old_last + 1 && n > skip) {
        return fail(ck, "log-matching", node, first, terms[skip],
                    "durable write leaves a gap after index %" PRIu64, old_last);
    }
    grow_u64(&nd->terms, &nd->cap_terms, nd->n_terms + (n - skip));
    memcpy(nd->terms + nd->n_terms, terms + skip, (n - skip) * sizeof(*terms));
    nd->n_terms += n - skip;
    uint64_t new_last = nd->snap_index + nd->n_terms;
    return recheck_durable(ck, node, first, old_last > new_last ? old_last : new_last);
}

int ck_durable_snapshot(struct ck *ck, uint64_t node, uint64_t index, uint64_t term,
                        bool keep_suffix)
{
    if (ck->failed)
        return -1;
    struct ck_node *nd = node_of(ck, node);
    uint64_t old_snap = nd->snap_index;
    uint64_t old_last = nd->snap_index + nd->n_terms;
    if (index <= old_snap)
        return 0;
    if (keep_suffix && index < old_last) {
        size_t drop = (size_t)(index - old_snap);
        memmove(nd->terms, nd->terms + drop, (nd->n_terms - drop) * sizeof(*nd->terms));
        nd->n_terms -= drop;
    } else {
        nd->n_terms = 0;
    }
    nd->snap_index = index;
    nd->snap_term = term;
    uint64_t new_last = nd->snap_index + nd->n_terms;
    return recheck_durable(ck, node, old_snap + 1,
                           old_last > new_last ? old_last : new_last);
}

int ck_sent(struct ck *ck, uint64_t node, int type, uint64_t to, uint64_t term, bool flag,
            bool flag2, uint64_t index)
{
    if (ck->failed)
        return -1;
    if (!ck->rule_checks)
        return 0;
    const struct ck_node *nd = node_of(ck, node);
    bool pre = type == RAFT_MSG_VOTE_RESP && flag2;
    ck->checks++;
    /* What a leader sends in term T requires T (and its vote for itself)
     * durable: otherwise a crash makes it forget term T, the voters that
     * chose it grant it term T again, and it leads term T a second time with
     * a different log (two entries with the same index and term). Other
     * messages may reveal a term still being persisted: a candidate's
     * RequestVote (its own vote counts only once durable), a refusal, and an
     * append ack, which covers only durable entries (entries of term T are
     * written together with term T, so an ack before T is durable covers only
     * older entries, which a leader of T never commits by counting). */
    bool from_leader = type == RAFT_MSG_APPEND || type == RAFT_MSG_SNAPSHOT ||
                       type == RAFT_MSG_TIMEOUT_NOW ||
                       (type == RAFT_MSG_READ_INDEX_RESP && flag);
    if (from_leader &&
        (term > nd->hs_term || (term == nd->hs_term && nd->hs_vote != node)))
        return fail(ck, "durable-before-send", node, 0, term,
                    "sent %s as leader of term %" PRIu64 " to n%" PRIu64
                    " but the durable term is %" PRIu64 " with vote n%" PRIu64,
                    raft_msg_type_name(type), term, to, nd->hs_term, nd->hs_vote);
    if (type == RAFT_MSG_VOTE_RESP && flag && !pre &&
        (nd->hs_term != term || nd->hs_vote != to))
        return fail(ck, "durable-before-send", node, 0, term,
                    "granted a vote to n%" PRIu64 " but the durable vote "
                    "is n%" PRIu64 " in term %" PRIu64,
                    to, nd->hs_vote, nd->hs_term);
    if (type == RAFT_MSG_APPEND_RESP && flag && index > nd->snap_index + nd->n_terms)
        return fail(ck, "durable-before-send", node, index, term,
                    "acknowledged index %" PRIu64 " to n%" PRIu64
                    " but only up to %" PRIu64 " is durable",
                    index, to, nd->snap_index + nd->n_terms);
    return 0;
}

uint64_t ck_read_begin(const struct ck *ck)
{
    return ck->c_n;
}

int ck_read_done(struct ck *ck, uint64_t node, uint64_t token, uint64_t read_index)
{
    if (ck->failed)
        return -1;
    ck->checks++;
    if (read_index < token)
        return fail(ck, "read-linearizable", node, read_index, 0,
                    "read index %" PRIu64 " misses entries committed before "
                    "the read was asked (up to %" PRIu64 ")",
                    read_index, token);
    return 0;
}

void ck_restart(struct ck *ck, uint64_t node)
{
    struct ck_node *nd = node_of(ck, node);
    nd->commit = 0;
    nd->applied = 0;
}
