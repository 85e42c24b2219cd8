/* The deterministic cluster simulator (see sim.h for the model).
 *
 * One event queue ordered by (virtual time in microseconds, sequence number)
 * drives everything: per-node ticks, message deliveries, storage completions,
 * client actions and faults. Every random choice comes from the one tk_prng
 * seeded with the run's seed, and every event is folded into a trace hash, so
 * a seed replays bit for bit. After each event the touched node is observed
 * (role, term, commit), its readies are handled until none is left, and the
 * checker (checker.h) is told what happened; the first violation stops the run.
 *
 * Storage model: node->log/hs/snap are what survived on disk; writes carry a
 * ready's hard state, snapshot and entries and complete in FIFO order after a
 * sync latency, then raft_persisted(seq) is called. A crash frees the core and
 * drops pending writes; a restart builds struct raft_boot from the durable
 * state. The simulator's own snapshots (of its state machine) are written
 * durably at once, like a synchronous snapshot file, then the log is compacted. */
#include "tests/sim/sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/prng.h"
#include "raft/raft.h"
#include "tests/sim/checker.h"

#define US_PER_MS 1000u
#define TICK_US 10000u            /* one raft tick is 10 ms of virtual time */
#define CLIENT_TAIL_MS 1000       /* clients keep proposing this long after heal */
#define CLIENT_OUTSTANDING_MAX 48 /* commands in flight across all clients */
#define SNAP_MAGIC 0x534e4150u
#define FORGE_GAP_US 100000 /* --forged-terms: one forged message per 50 ms */

enum ev_type {
    EV_TICK = 1,
    EV_DELIVER,
    EV_PERSIST,
    EV_CLIENT,
    EV_FAULT,
    EV_RESTART,
    EV_HEAL,
    EV_CRASH,
    EV_MEMBER,
    EV_FORGE,
};

/* A message in flight: a deep copy of what raft_ready handed out. */
struct sim_msg {
    struct raft_message m;
    struct raft_entry ents[]; /* m.u.append.entries points here */
};

struct ev {
    uint64_t at_us;
    uint64_t seq;
    uint8_t type;
    uint32_t node;
    uint32_t inc;
    struct sim_msg *msg;
};

struct sim_write {
    struct sim_write *next;
    uint64_t seq;
    uint64_t done_us;
    bool has_hs;
    struct raft_hard_state hs;
    bool has_snap;
    struct raft_snapshot_meta meta;
    struct tk_blob *snap_data;
    struct raft_entry *ents;
    size_t n;
};

enum prop_state {
    PROP_PENDING = 1,
    PROP_COMMITTED,
    PROP_FAILED,
};

struct sim_prop {
    uint64_t node;
    uint32_t inc;
    uint64_t index;
    uint64_t term;
    uint8_t state;
};

struct sim_read {
    uint64_t ctx;
    uint64_t node;
    uint32_t inc;
    uint64_t token;
};

struct sim_node {
    uint64_t id;
    bool up;
    uint32_t inc;
    struct raft *r;
    uint64_t tick_us;

    /* Durable storage. */
    struct raft_hard_state hs;
    struct raft_snapshot_meta snap;
    struct tk_blob *snap_data;
    struct raft_entry *log; /* snap.index + 1 .. snap.index + n_log */
    size_t n_log;
    size_t cap_log;
    struct sim_write *wq;
    struct sim_write *wq_tail;
    uint64_t disk_free_us;
    uint64_t disk_slow_until_us;

    /* State machine. */
    uint64_t sm_index;
    uint64_t sm_term;
    uint64_t sm_hash;
    uint64_t sm_snap_index;

    /* Observed soft state. */
    uint8_t role;
    uint64_t term;
    uint64_t commit;
};

struct sim {
    struct sim_config cfg;
    struct tk_prng prng;
    struct ck *ck;
    struct sim_stats st;
    uint64_t hash;
    uint64_t now_us;
    uint64_t ev_seq;
    char violation[1024];
    bool failed;

    struct ev *heap;
    size_t n_heap;
    size_t cap_heap;

    uint32_t n; /* node slots: the first voters, then spares */
    uint32_t n_voters0;
    uint64_t next_spare; /* the next spare id to add; ids are never reused */
    uint64_t member_gap_us;
    struct sim_node nodes[SIM_NODES_MAX];
    struct raft_options opts;
    struct raft_config config;

    /* Network. */
    bool cut[SIM_NODES_MAX + 1][SIM_NODES_MAX + 1];
    uint64_t link_last_us[SIM_NODES_MAX + 1][SIM_NODES_MAX + 1];
    double drop_p;
    double dup_p;
    double reorder_p;
    uint64_t delay_min_us;
    uint64_t delay_max_us;
    uint64_t spike_until_us;
    uint64_t spike_max_us;

    /* Storage and state machine parameters. */
    uint64_t sync_min_us;
    uint64_t sync_max_us;
    uint64_t snap_every;
    uint64_t snap_keep;

    /* Clients. */
    struct sim_prop *props; /* by payload id, 1.. */
    size_t cap_props;
    uint64_t n_props;
    uint64_t *pending; /* payload ids that may still be PENDING */
    size_t n_pending_ids;
    size_t cap_pending;
    uint64_t n_pending;
    struct sim_read *reads;
    size_t n_reads;
    size_t cap_reads;
    uint64_t next_ctx;
    uint64_t applied_max; /* highest index applied anywhere */
    uint64_t client_gap_us;

    /* Scenario. */
    uint64_t heal_us;
    uint64_t clients_stop_us;
    uint64_t deadline_us;
    uint64_t fault_gap_us;
    double leader_kill_p; /* chance a new leader is crashed soon after */
    bool healed;
    bool converged;
};

/* ---- small helpers ----------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static void hmix(struct sim *s, uint64_t v)
{
    s->hash = mix64(s->hash ^ v) + 0x9e3779b97f4a7c15ULL;
}

static uint64_t now_ms(const struct sim *s)
{
    return s->now_us / US_PER_MS;
}

static struct sim_node *node_of(struct sim *s, uint64_t id)
{
    TK_ASSERT(id >= 1);
    TK_ASSERT(id <= s->n);
    return &s->nodes[id - 1];
}

static void grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return;
    size_t cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need)
        cap2 *= 2;
    *arr = tk_realloc(*arr, cap2 * elem);
    *cap = cap2;
}

static void sim_fail(struct sim *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sim_fail(struct sim *s, const char *fmt, ...)
{
    if (s->failed)
        return;
    s->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->violation, sizeof(s->violation), fmt, ap);
    va_end(ap);
}

static bool failed(struct sim *s)
{
    if (!s->failed && ck_failed(s->ck)) {
        s->failed = true;
        snprintf(s->violation, sizeof(s->violation), "%s", ck_violation(s->ck));
    }
    return s->failed;
}

void sim_note(struct sim *s, const char *fmt, ...)
{
    if (s->cfg.notes == NULL)
        return;
    fprintf(s->cfg.notes, "t=%6" PRIu64 "ms  ", now_ms(s));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->cfg.notes, fmt, ap);
    va_end(ap);
    fputc('\n', s->cfg.notes);
}

static void trace(struct sim *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void trace(struct sim *s, const char *fmt, ...)
{
    if (s->cfg.trace == NULL)
        return;
    fprintf(s->cfg.trace, "%10.3fms ", (double)s->now_us / US_PER_MS);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->cfg.trace, fmt, ap);
    va_end(ap);
    fputc('\n', s->cfg.trace);
}

/* ---- event queue: a binary heap on (at_us, seq) -------------------------- */

static bool ev_before(const struct ev *a, const struct ev *b)
{
    return a->at_us < b->at_us || (a->at_us == b->at_us && a->seq < b->seq);
}

static void ev_push(struct sim *s, uint64_t at_us, uint8_t type, uint32_t node,
                    uint32_t inc, struct sim_msg *msg)
{
    grow((void **)&s->heap, &s->cap_heap, s->n_heap + 1, sizeof(*s->heap));
    struct ev e = {at_us, s->ev_seq++, type, node, inc, msg};
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_before(&e, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static struct ev ev_pop(struct sim *s)
{
    struct ev top = s->heap[0];
    struct ev last = s->heap[--s->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n_heap)
            break;
        if (c + 1 < s->n_heap && ev_before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!ev_before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n_heap > 0)
        s->heap[i] = last;
    return top;
}

/* ---- payloads and the state machine ------------------------------------ */

static uint64_t payload_id(const struct raft_entry *e)
{
    if (e->type != RAFT_ENTRY_NORMAL || e->data == NULL || e->data->len < 8)
        return 0;
    uint64_t id;
    memcpy(&id, e->data->data, sizeof(id));
    return id;
}

static uint64_t entry_digest(const struct raft_entry *e)
{
    return ck_digest(e->type, e->data ? e->data->data : NULL, e->data ? e->data->len : 0);
}

static struct tk_blob *snap_encode(uint64_t index, uint64_t term, uint64_t hash)
{
    uint64_t w[4] = {SNAP_MAGIC, index, term, hash};
    return tk_blob_copy(w, sizeof(w));
}

static bool snap_decode(const struct tk_blob *b, uint64_t *index, uint64_t *term,
                        uint64_t *hash)
{
    uint64_t w[4];
    if (b == NULL || b->len != sizeof(w))
        return false;
    memcpy(w, b->data, sizeof(w));
    if (w[0] != SNAP_MAGIC)
        return false;
    *index = w[1];
    *term = w[2];
    *hash = w[3];
    return true;
}

/* ---- checker callbacks ------------------------------------------------- */

static int op_entry_at(void *data, uint64_t node, uint64_t index, uint64_t *term,
                       uint64_t *digest)
{
    struct sim_node *nd = node_of(data, node);
    if (!nd->up)
        return -1;
    const struct raft_entry *e = raft_entry_at(nd->r, index);
    if (e == NULL)
        return -1;
    *term = e->term;
    *digest = entry_digest(e);
    return 0;
}

static uint64_t op_snapshot_index(void *data, uint64_t node)
{
    struct sim_node *nd = node_of(data, node);
    if (!nd->up)
        return 0;
    uint64_t first = raft_first_index(nd->r);
    return first > 0 ? first - 1 : 0;
}

static uint64_t op_leader_term(void *data, uint64_t node)
{
    struct sim_node *nd = node_of(data, node);
    if (!nd->up || raft_role(nd->r) != RAFT_LEADER)
        return 0;
    return raft_term(nd->r);
}

/* ---- clients: proposal bookkeeping ------------------------------------- */

static void prop_resolve(struct sim *s, uint64_t payload, uint8_t state)
{
    struct sim_prop *p = &s->props[payload];
    if (p->state == PROP_PENDING)
        s->n_pending--;
    if (p->state == state)
        return;
    if (p->state == PROP_FAILED && state == PROP_COMMITTED)
        s->st.failed--; /* reported failed, then committed after all */
    p->state = state;
    if (state == PROP_COMMITTED)
        s->st.committed++;
    else
        s->st.failed++;
}

static void pending_compact(struct sim *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n_pending_ids; i++)
        if (s->props[s->pending[i]].state == PROP_PENDING)
            s->pending[k++] = s->pending[i];
    s->n_pending_ids = k;
}

/* A node lost leadership or crashed: its outstanding proposals are reported
 * failed to their clients (their fate is unknown; they may still commit). */
static void props_abandon(struct sim *s, uint64_t node, uint32_t inc)
{
    for (size_t i = 0; i < s->n_pending_ids; i++) {
        struct sim_prop *p = &s->props[s->pending[i]];
        if (p->state == PROP_PENDING && p->node == node && p->inc == inc)
            prop_resolve(s, s->pending[i], PROP_FAILED);
    }
    pending_compact(s);
}

/* The first application of `index` anywhere decides the proposals there. */
static void props_decide(struct sim *s, uint64_t index, uint64_t term, uint64_t payload)
{
    if (payload != 0 && payload <= s->n_props &&
        s->props[payload].state != PROP_COMMITTED)
        prop_resolve(s, payload, PROP_COMMITTED);
    for (size_t i = 0; i < s->n_pending_ids; i++) {
        struct sim_prop *p = &s->props[s->pending[i]];
        if (p->state == PROP_PENDING && p->index == index &&
            (p->term != term || s->pending[i] != payload))
            prop_resolve(s, s->pending[i], PROP_FAILED);
    }
    if (s->n_pending_ids > 64 && s->n_pending * 2 < s->n_pending_ids)
        pending_compact(s);
}

/* ---- network ----------------------------------------------------------- */

static struct sim_msg *msg_copy(const struct raft_message *m)
{
    uint32_t n = m->type == RAFT_MSG_APPEND ? m->u.append.n_entries : 0;
    struct sim_msg *c = tk_malloc(sizeof(*c) + n * sizeof(c->ents[0]));
    c->m = *m;
    if (m->type == RAFT_MSG_APPEND) {
        for (uint32_t i = 0; i < n; i++) {
            c->ents[i] = m->u.append.entries[i];
            tk_blob_ref(c->ents[i].data);
        }
        c->m.u.append.entries = n ? c->ents : NULL;
    } else if (m->type == RAFT_MSG_SNAPSHOT) {
        tk_blob_ref(c->m.u.snapshot.data);
    }
    return c;
}

static void msg_free(struct sim_msg *c)
{
    if (c == NULL)
        return;
    if (c->m.type == RAFT_MSG_APPEND) {
        for (uint32_t i = 0; i < c->m.u.append.n_entries; i++)
            tk_blob_unref(c->ents[i].data);
    } else if (c->m.type == RAFT_MSG_SNAPSHOT) {
        tk_blob_unref(c->m.u.snapshot.data);
    }
    tk_free(c);
}

static uint64_t msg_delay(struct sim *s)
{
    uint64_t d = tk_prng_range(&s->prng, s->delay_min_us, s->delay_max_us);
    if (s->now_us < s->spike_until_us)
        d += tk_prng_range(&s->prng, 0, s->spike_max_us);
    /* A rare straggler far behind the rest. */
    if (tk_prng_chance(&s->prng, 0.002))
        d += tk_prng_range(&s->prng, 20000, 300000);
    return d;
}

static void net_send(struct sim *s, const struct raft_message *m)
{
    uint64_t from = m->from, to = m->to;
    s->st.msgs_sent++;
    hmix(s, m->type);
    hmix(s, from << 8 | to);
    hmix(s, m->term);
    if (from < 1 || from > s->n || to < 1 || to > s->n || from == to) {
        sim_fail(s,
                 "VIOLATION message-address: t=%" PRIu64 "ms node n%" PRIu64
                 ": %s addressed from n%" PRIu64 " to n%" PRIu64,
                 now_ms(s), from, raft_msg_type_name(m->type), from, to);
        return;
    }
    if (s->cut[from][to] || tk_prng_chance(&s->prng, s->drop_p)) {
        s->st.msgs_dropped++;
        trace(s, "drop n%" PRIu64 "->n%" PRIu64 " %s", from, to,
              raft_msg_type_name(m->type));
        return;
    }
    int copies = tk_prng_chance(&s->prng, s->dup_p) ? 2 : 1;
    if (copies == 2)
        s->st.msgs_duplicated++;
    for (int i = 0; i < copies; i++) {
        uint64_t at = s->now_us + msg_delay(s);
        /* Links are FIFO unless this message is picked for reordering. */
        if (!tk_prng_chance(&s->prng, s->reorder_p)) {
            if (at < s->link_last_us[from][to])
                at = s->link_last_us[from][to];
            s->link_last_us[from][to] = at;
        }
        ev_push(s, at, EV_DELIVER, (uint32_t)to, 0, msg_copy(m));
    }
}

/* ---- storage ----------------------------------------------------------- */

static void log_truncate_from(struct sim_node *nd, uint64_t index)
{
    /* Drops durable entries with index >= `index`. */
    uint64_t keep = index > nd->snap.index ? index - nd->snap.index - 1 : 0;
    while (nd->n_log > keep)
        tk_blob_unref(nd->log[--nd->n_log].data);
}

static void log_drop_through(struct sim_node *nd, uint64_t index)
{
    /* Drops durable entries with index <= `index` (below a new snapshot). */
    size_t k = 0;
    while (k < nd->n_log && nd->log[k].index <= index)
        tk_blob_unref(nd->log[k++].data);
    memmove(nd->log, nd->log + k, (nd->n_log - k) * sizeof(*nd->log));
    nd->n_log -= k;
}

static uint64_t durable_term_at(const struct sim_node *nd, uint64_t index)
{
    if (index == nd->snap.index)
        return nd->snap.term;
    if (index <= nd->snap.index || index - nd->snap.index > nd->n_log)
        return 0;
    return nd->log[index - nd->snap.index - 1].term;
}

/* Makes a snapshot durable, keeping the log after it only if the log holds
 * the snapshot's last entry (then everything up to it is the same log). */
static int durable_snapshot(struct sim *s, struct sim_node *nd,
                            const struct raft_snapshot_meta *meta, struct tk_blob *data)
{
    if (meta->index <= nd->snap.index)
        return 0;
    bool keep = durable_term_at(nd, meta->index) == meta->term;
    if (keep)
        log_drop_through(nd, meta->index);
    else
        log_truncate_from(nd, nd->snap.index + 1);
    nd->snap = *meta;
    tk_blob_unref(nd->snap_data);
    nd->snap_data = tk_blob_ref(data);
    return ck_durable_snapshot(s->ck, nd->id, meta->index, meta->term, keep);
}

static int durable_entries(struct sim *s, struct sim_node *nd, const struct raft_entry *e,
                           size_t n)
{
    if (n == 0)
        return 0;
    log_truncate_from(nd, e[0].index);
    uint64_t terms_buf[64];
    uint64_t *terms = n <= 64 ? terms_buf : tk_malloc(n * sizeof(*terms));
    grow((void **)&nd->log, &nd->cap_log, nd->n_log + n, sizeof(*nd->log));
    for (size_t i = 0; i < n; i++) {
        terms[i] = e[i].term;
        if (e[i].index <= nd->snap.index)
            continue;
        if (e[i].index != nd->snap.index + nd->n_log + 1) {
            sim_fail(s,
                     "VIOLATION storage-gap: t=%" PRIu64 "ms node n%" PRIu64
                     " index %" PRIu64 ": write does not continue the "
                     "durable log (last %" PRIu64 ")",
                     now_ms(s), nd->id, e[i].index, nd->snap.index + nd->n_log);
            break;
        }
        nd->log[nd->n_log] = e[i];
        tk_blob_ref(e[i].data);
        nd->n_log++;
    }
    int rc = ck_durable_entries(s->ck, nd->id, e[0].index, n, terms);
    if (terms != terms_buf)
        tk_free(terms);
    return rc;
}

static void write_free(struct sim_write *w)
{
    for (size_t i = 0; i < w->n; i++)
        tk_blob_unref(w->ents[i].data);
    tk_free(w->ents);
    tk_blob_unref(w->snap_data);
    tk_free(w);
}

static uint64_t sync_latency(struct sim *s, struct sim_node *nd)
{
    uint64_t d = tk_prng_range(&s->prng, s->sync_min_us, s->sync_max_us);
    if (s->now_us < nd->disk_slow_until_us)
        d += tk_prng_range(&s->prng, 5000, 60000);
    return d;
}

static void write_submit(struct sim *s, struct sim_node *nd, const struct raft_ready *rd)
{
    struct sim_write *w = tk_calloc(1, sizeof(*w));
    w->seq = rd->seq;
    w->has_hs = rd->hard_state_changed;
    w->hs = rd->hard_state;
    if (rd->snapshot != NULL) {
        w->has_snap = true;
        w->meta = *rd->snapshot;
        w->snap_data = tk_blob_ref(rd->snapshot_data);
    }
    if (rd->n_entries > 0) {
        w->n = rd->n_entries;
        w->ents = tk_malloc(w->n * sizeof(*w->ents));
        for (size_t i = 0; i < w->n; i++) {
            w->ents[i] = rd->entries[i];
            tk_blob_ref(w->ents[i].data);
        }
    }
    /* One disk per node: writes complete in order. */
    uint64_t start = nd->disk_free_us > s->now_us ? nd->disk_free_us : s->now_us;
    w->done_us = start + sync_latency(s, nd);
    nd->disk_free_us = w->done_us;
    if (nd->wq_tail)
        nd->wq_tail->next = w;
    else
        nd->wq = w;
    nd->wq_tail = w;
    ev_push(s, w->done_us, EV_PERSIST, (uint32_t)nd->id, nd->inc, NULL);
}

/* ---- nodes ------------------------------------------------------------- */

static void node_observe(struct sim *s, struct sim_node *nd)
{
    struct raft *r = nd->r;
    uint8_t role = (uint8_t)raft_role(r);
    uint64_t term = raft_term(r);
    uint64_t commit = raft_commit(r);
    if (role != nd->role || term != nd->term) {
        if (nd->role == RAFT_LEADER)
            props_abandon(s, nd->id, nd->inc);
        if (role == RAFT_LEADER) {
            s->st.leaders++;
            /* Leader churn: a leader that dies right after its election,
             * before its own entries spread (figure 8 needs this). */
            if (s->cfg.faults && !s->healed && tk_prng_chance(&s->prng, s->leader_kill_p))
                ev_push(s, s->now_us + tk_prng_range(&s->prng, 0, 3 * s->delay_max_us),
                        EV_CRASH, (uint32_t)nd->id, nd->inc, NULL);
            sim_note(s,
                     "n%" PRIu64 " became leader in term %" PRIu64
                     " (log up to index %" PRIu64 ")",
                     nd->id, term, raft_last_index(r));
        } else if (role == RAFT_CANDIDATE && nd->role != RAFT_CANDIDATE) {
            sim_note(s, "n%" PRIu64 " starts an election for term %" PRIu64, nd->id,
                     term);
        } else if (nd->role == RAFT_LEADER) {
            sim_note(s, "n%" PRIu64 " steps down (term %" PRIu64 ")", nd->id, term);
        }
        trace(s, "n%" PRIu64 " role %s term %" PRIu64, nd->id, raft_role_name(role),
              term);
        nd->role = role;
        nd->term = term;
        hmix(s, nd->id << 8 | role);
        hmix(s, term);
    }
    if (role == RAFT_LEADER)
        ck_leader(s->ck, nd->id, term);
    if (s->cfg.membership) {
        const struct raft_config *c = raft_config(r);
        uint32_t mask = 0;
        for (uint32_t i = 0; i < c->n_voters; i++)
            if (c->voters[i] >= 1 && c->voters[i] <= s->n)
                mask |= 1u << (c->voters[i] - 1);
        ck_voters(s->ck, nd->id, mask);
    }
    if (commit != nd->commit) {
        hmix(s, commit);
        nd->commit = commit;
    }
    ck_commit(s->ck, nd->id, term, role == RAFT_LEADER, commit);
}

static void sm_apply(struct sim *s, struct sim_node *nd, const struct raft_entry *e)
{
    uint64_t digest = entry_digest(e);
    uint64_t payload = payload_id(e);
    nd->sm_hash = mix64(nd->sm_hash ^ mix64(e->index ^ (e->term << 40)) ^ digest);
    nd->sm_index = e->index;
    nd->sm_term = e->term;
    if (ck_applied(s->ck, nd->id, e->index, e->term, digest, payload, nd->sm_hash) != 0)
        return;
    if (e->index > s->applied_max) {
        s->applied_max = e->index;
        props_decide(s, e->index, e->term, payload);
    }
}

static void node_snapshot(struct sim *s, struct sim_node *nd)
{
    if (nd->sm_index == 0 || nd->sm_index < nd->sm_snap_index + s->snap_every)
        return;
    struct raft_snapshot_meta meta;
    memset(&meta, 0, sizeof(meta));
    meta.index = nd->sm_index;
    meta.term = nd->sm_term;
    /* The configuration in force at the snapshot's index, not the newest. */
    if (raft_config_at(nd->r, meta.index, &meta.config) != 0) {
        sim_fail(s, "VIOLATION driver: node n%" PRIu64 ": no configuration at %" PRIu64,
                 nd->id, meta.index);
        return;
    }
    struct tk_blob *data = snap_encode(meta.index, meta.term, nd->sm_hash);
    int rc = raft_snapshot_set(nd->r, &meta, s->cfg.lazy_snapshots ? NULL : data);
    if (rc != 0) {
        sim_fail(s,
                 "VIOLATION driver: t=%" PRIu64 "ms node n%" PRIu64 " index %" PRIu64
                 ": raft_snapshot_set refused an "
                 "applied index: %s",
                 now_ms(s), nd->id, meta.index, tk_strerror(rc));
        tk_blob_unref(data);
        return;
    }
    nd->sm_snap_index = meta.index;
    s->st.snapshots_taken++;
    durable_snapshot(s, nd, &meta, data);
    tk_blob_unref(data);
    uint64_t upto = meta.index > s->snap_keep ? meta.index - s->snap_keep : 0;
    if (upto > 0 && (rc = raft_compact(nd->r, upto)) != 0)
        sim_fail(s,
                 "VIOLATION driver: t=%" PRIu64 "ms node n%" PRIu64 " index %" PRIu64
                 ": raft_compact refused: %s",
                 now_ms(s), nd->id, upto, tk_strerror(rc));
    trace(s, "n%" PRIu64 " snapshot at %" PRIu64 ", compact to %" PRIu64, nd->id,
          meta.index, upto);
}

/* --lazy-snapshots: a leader that needs a snapshot's data (a follower is
 * behind its log's start) gets the durable snapshot's, at the index the core
 * holds: the node reads its cold tier out. The durable snapshot is the last
 * one taken or installed, which is the core's too. */
static void node_serve_snapshot(struct sim *s, struct sim_node *nd)
{
    if (s->cfg.lazy_snapshots != 1 || nd->r == NULL || !raft_snapshot_wanted(nd->r))
        return;
    int rc = raft_snapshot_set(nd->r, &nd->snap, nd->snap_data);
    if (rc != 0) {
        sim_fail(s,
                 "VIOLATION driver: t=%" PRIu64 "ms node n%" PRIu64 " index %" PRIu64
                 ": raft_snapshot_set refused the wanted snapshot's data: %s",
                 now_ms(s), nd->id, nd->snap.index, tk_strerror(rc));
        return;
    }
    s->st.snapshots_served++;
    trace(s, "n%" PRIu64 " snapshot data at %" PRIu64 " given", nd->id, nd->snap.index);
}

struct appended {
    uint64_t first;
    size_t n;
};

static void node_ready(struct sim *s, struct sim_node *nd)
{
    struct raft_ready rd;
    raft_ready(nd->r, &rd);
    hmix(s, rd.seq);
    hmix(s, rd.n_entries << 32 | rd.n_messages << 16 | rd.n_committed);

    if (rd.snapshot != NULL) {
        uint64_t idx = 0, term = 0, hash = 0;
        if (!snap_decode(rd.snapshot_data, &idx, &term, &hash) ||
            idx != rd.snapshot->index || term != rd.snapshot->term) {
            sim_fail(s,
                     "VIOLATION snapshot-data: t=%" PRIu64 "ms node n%" PRIu64
                     " index %" PRIu64 ": the snapshot handed to "
                     "install does not match its metadata",
                     now_ms(s), nd->id, rd.snapshot->index);
        } else {
            s->st.snapshots_installed++;
            nd->sm_index = idx;
            nd->sm_term = term;
            nd->sm_hash = hash;
            nd->sm_snap_index = idx;
            ck_sm_restored(s->ck, nd->id, idx, term, hash);
            sim_note(s, "n%" PRIu64 " installs a snapshot up to index %" PRIu64, nd->id,
                     idx);
        }
    }
    if (rd.seq != 0)
        write_submit(s, nd, &rd);
    struct appended ap = {0, 0};
    if (rd.n_entries > 0) {
        ap.first = rd.entries[0].index;
        ap.n = rd.n_entries;
    }
    for (size_t i = 0; i < rd.n_messages && !failed(s); i++) {
        const struct raft_message *m = &rd.messages[i];
        bool flag = false, flag2 = false;
        uint64_t index = 0;
        if (m->type == RAFT_MSG_VOTE) {
            flag = m->u.vote.pre_vote;
        } else if (m->type == RAFT_MSG_VOTE_RESP) {
            flag = m->u.vote_resp.granted;
            flag2 = m->u.vote_resp.pre_vote;
        } else if (m->type == RAFT_MSG_APPEND_RESP) {
            flag = !m->u.append_resp.reject;
            index = m->u.append_resp.index;
        } else if (m->type == RAFT_MSG_READ_INDEX_RESP) {
            flag = !m->u.read_index.reject;
        }
        if (m->from != nd->id) {
            sim_fail(s,
                     "VIOLATION message-address: t=%" PRIu64 "ms node n%" PRIu64
                     ": sent a message from n%" PRIu64,
                     now_ms(s), nd->id, m->from);
            break;
        }
        if (ck_sent(s->ck, nd->id, m->type, m->to, m->term, flag, flag2, index) != 0)
            break;
        net_send(s, m);
    }
    for (size_t i = 0; i < rd.n_committed && !failed(s); i++)
        sm_apply(s, nd, &rd.committed[i]);
    for (size_t i = 0; i < rd.n_read_states && !failed(s); i++) {
        const struct raft_read_state *rs = &rd.read_states[i];
        for (size_t k = 0; k < s->n_reads; k++) {
            struct sim_read *q = &s->reads[k];
            if (q->ctx != rs->ctx)
                continue;
            if (q->node != nd->id || q->inc != nd->inc) {
                sim_fail(s,
                         "VIOLATION read-linearizable: t=%" PRIu64 "ms node n%" PRIu64
                         ": read state for ctx %" PRIu64
                         " that this node did not ask for",
                         now_ms(s), nd->id, rs->ctx);
                break;
            }
            if (rs->failed)
                s->st.reads_failed++;
            else
                ck_read_done(s->ck, nd->id, q->token, rs->index);
            s->reads[k] = s->reads[--s->n_reads];
            break;
        }
    }
    raft_advance(nd->r, &rd);

    /* Log matching for what entered the log (the core's log still holds it:
     * compaction happens below, after this). */
    for (size_t i = 0; i < ap.n && !failed(s); i++) {
        uint64_t index = ap.first + i;
        const struct raft_entry *e = raft_entry_at(nd->r, index);
        if (e == NULL)
            break; /* replaced meanwhile; the next ready carries it */
        uint64_t prev = CK_TERM_UNKNOWN;
        if (index == 1)
            prev = 0;
        else if (raft_term_at(nd->r, index - 1, &prev) != 0)
            prev = CK_TERM_UNKNOWN;
        ck_append(s->ck, nd->id, index, e->term, entry_digest(e), prev);
    }
    if (rd.n_committed > 0 && !failed(s)) {
        raft_applied(nd->r, nd->sm_index);
        node_snapshot(s, nd);
    }
    if (!failed(s))
        node_serve_snapshot(s, nd);
}

/* After any input to a node: observe, then drain its readies. */
static void node_sync(struct sim *s, struct sim_node *nd)
{
    for (int rounds = 0; nd->up && !failed(s); rounds++) {
        node_observe(s, nd);
        if (failed(s) || !raft_has_ready(nd->r))
            return;
        if (rounds > 1000) {
            sim_fail(s,
                     "VIOLATION driver: t=%" PRIu64 "ms node n%" PRIu64
                     ": raft_has_ready stays true after 1000 readies",
                     now_ms(s), nd->id);
            return;
        }
        node_ready(s, nd);
    }
}

static void node_options(struct sim *s, struct sim_node *nd, struct raft_options *o)
{
    *o = s->opts;
    o->id = nd->id;
    o->seed = mix64(s->cfg.seed * 0x100000001b3ULL + nd->id * 131 + nd->inc);
}

static void node_boot(struct sim *s, struct sim_node *nd)
{
    struct raft_options o;
    node_options(s, nd, &o);
    struct raft_boot boot;
    memset(&boot, 0, sizeof(boot));
    boot.hard_state = nd->hs;
    boot.snapshot = nd->snap;
    boot.snapshot_data = s->cfg.lazy_snapshots ? NULL : nd->snap_data;
    boot.entries = nd->log;
    boot.n_entries = nd->n_log;
    boot.bootstrap = s->config;
    boot.applied = nd->snap.index;
    int rc = raft_new(&o, &boot, &nd->r);
    if (rc != 0) {
        nd->r = NULL;
        sim_fail(s,
                 "VIOLATION restart: t=%" PRIu64 "ms node n%" PRIu64
                 ": raft_new refused the durable state: %s",
                 now_ms(s), nd->id, tk_strerror(rc));
        return;
    }
    nd->up = true;
    nd->role = (uint8_t)raft_role(nd->r);
    nd->term = raft_term(nd->r);
    nd->commit = 0;
    nd->sm_index = 0;
    nd->sm_term = 0;
    nd->sm_hash = 0;
    if (nd->snap.index > 0 &&
        !snap_decode(nd->snap_data, &nd->sm_index, &nd->sm_term, &nd->sm_hash))
        sim_fail(s,
                 "VIOLATION snapshot-data: node n%" PRIu64
                 ": durable snapshot does not decode",
                 nd->id);
    nd->sm_snap_index = nd->sm_index;
    ck_restart(s->ck, nd->id);
    ck_sm_restored(s->ck, nd->id, nd->sm_index, nd->sm_term, nd->sm_hash);
    nd->disk_free_us = s->now_us;
    /* The first tick comes at a random phase of the node's own clock. */
    ev_push(s, s->now_us + tk_prng_range(&s->prng, 1, nd->tick_us), EV_TICK,
            (uint32_t)nd->id, nd->inc, NULL);
    node_sync(s, nd);
}

void sim_crash(struct sim *s, uint64_t node)
{
    struct sim_node *nd = node_of(s, node);
    if (!nd->up)
        return;
    s->st.crashes++;
    bool was_leader = nd->role == RAFT_LEADER;
    sim_note(s, "crash n%" PRIu64 "%s: unsynced writes lost", node,
             was_leader ? " (the leader)" : "");
    trace(s, "crash n%" PRIu64, node);
    hmix(s, 0xc0ffee ^ node);
    props_abandon(s, nd->id, nd->inc);
    for (size_t k = 0; k < s->n_reads;) {
        if (s->reads[k].node == node)
            s->reads[k] = s->reads[--s->n_reads];
        else
            k++;
    }
    while (nd->wq) {
        struct sim_write *w = nd->wq;
        nd->wq = w->next;
        write_free(w);
    }
    nd->wq_tail = NULL;
    raft_free(nd->r);
    nd->r = NULL;
    nd->up = false;
    nd->inc++;
    nd->role = RAFT_FOLLOWER;
}

void sim_restart(struct sim *s, uint64_t node)
{
    struct sim_node *nd = node_of(s, node);
    if (nd->up)
        return;
    sim_note(s,
             "restart n%" PRIu64 " from its disk (term %" PRIu64 ", snapshot %" PRIu64
             ", log to %" PRIu64 ")",
             node, nd->hs.term, nd->snap.index, nd->snap.index + nd->n_log);
    trace(s, "restart n%" PRIu64, node);
    hmix(s, 0xbeef ^ node);
    node_boot(s, nd);
}

/* ---- events ------------------------------------------------------------ */

static void ev_persist(struct sim *s, struct sim_node *nd)
{
    struct sim_write *w = nd->wq;
    TK_ASSERT(w != NULL);
    nd->wq = w->next;
    if (nd->wq == NULL)
        nd->wq_tail = NULL;
    if (w->has_snap)
        durable_snapshot(s, nd, &w->meta, w->snap_data);
    if (w->has_hs) {
        nd->hs = w->hs;
        ck_durable_hard_state(s->ck, nd->id, w->hs.term, w->hs.vote);
    }
    durable_entries(s, nd, w->ents, w->n);
    uint64_t seq = w->seq;
    write_free(w);
    hmix(s, seq);
    trace(s, "n%" PRIu64 " persisted seq %" PRIu64, nd->id, seq);
    if (failed(s))
        return;
    raft_persisted(nd->r, seq);
    node_sync(s, nd);
}

static void trace_msg(struct sim *s, const struct raft_message *m)
{
    char what[160] = "";
    switch (m->type) {
    case RAFT_MSG_VOTE:
        snprintf(what, sizeof(what), " last %" PRIu64 "/%" PRIu64 "%s%s",
                 m->u.vote.last_log_index, m->u.vote.last_log_term,
                 m->u.vote.pre_vote ? " pre" : "", m->u.vote.transfer ? " transfer" : "");
        break;
    case RAFT_MSG_VOTE_RESP:
        snprintf(what, sizeof(what), "%s%s",
                 m->u.vote_resp.granted ? " granted" : " refused",
                 m->u.vote_resp.pre_vote ? " pre" : "");
        break;
    case RAFT_MSG_APPEND:
        snprintf(what, sizeof(what),
                 " prev %" PRIu64 "/%" PRIu64 " n %u commit %" PRIu64 " ctx %" PRIu64,
                 m->u.append.prev_index, m->u.append.prev_term, m->u.append.n_entries,
                 m->u.append.commit, m->u.append.read_ctx);
        break;
    case RAFT_MSG_APPEND_RESP:
        snprintf(what, sizeof(what),
                 "%s index %" PRIu64 " hint %" PRIu64 "/%" PRIu64 " ctx %" PRIu64,
                 m->u.append_resp.reject ? " reject" : " ok", m->u.append_resp.index,
                 m->u.append_resp.conflict_index, m->u.append_resp.conflict_term,
                 m->u.append_resp.read_ctx);
        break;
    case RAFT_MSG_SNAPSHOT:
        snprintf(what, sizeof(what), " at %" PRIu64 "/%" PRIu64, m->u.snapshot.meta.index,
                 m->u.snapshot.meta.term);
        break;
    case RAFT_MSG_READ_INDEX:
    case RAFT_MSG_READ_INDEX_RESP:
        snprintf(what, sizeof(what), " ctx %" PRIu64 " index %" PRIu64 "%s",
                 m->u.read_index.ctx, m->u.read_index.index,
                 m->u.read_index.reject ? " reject" : "");
        break;
    default:
        break;
    }
    trace(s, "n%" PRIu64 "->n%" PRIu64 " %s term %" PRIu64 "%s", m->from, m->to,
          raft_msg_type_name(m->type), m->term, what);
}

static void ev_deliver(struct sim *s, struct sim_msg *c)
{
    const struct raft_message *m = &c->m;
    struct sim_node *nd = node_of(s, m->to);
    if (!nd->up || s->cut[m->from][m->to]) {
        s->st.msgs_dropped++;
        return;
    }
    s->st.msgs_delivered++;
    hmix(s, m->type << 16 | m->from << 8 | m->to);
    if (m->type == RAFT_MSG_APPEND)
        hmix(s, m->u.append.prev_index << 16 | m->u.append.n_entries);
    if (s->cfg.trace != NULL)
        trace_msg(s, m);
    raft_step(nd->r, m);
    node_sync(s, nd);
}

static struct sim_node *pick_up(struct sim *s, bool leader_only)
{
    uint64_t cand[SIM_NODES_MAX];
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->nodes[i].up && (!leader_only || s->nodes[i].role == RAFT_LEADER))
            cand[k++] = s->nodes[i].id;
    if (k == 0)
        return NULL;
    return node_of(s, cand[tk_prng_below(&s->prng, k)]);
}

int sim_propose(struct sim *s, uint64_t node, uint32_t n)
{
    struct sim_node *nd = node_of(s, node);
    if (!nd->up)
        return TK_ECLOSED;
    struct raft_entry ents[8];
    memset(ents, 0, sizeof(ents));
    if (n == 0)
        return TK_EINVAL;
    if (n > 8)
        n = 8;
    uint64_t first_id = s->n_props + 1;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id = first_id + i;
        size_t len = 16;
        if (tk_prng_chance(&s->prng, 0.05))
            len = (size_t)tk_prng_range(&s->prng, 100, 3000);
        struct tk_blob *b = tk_blob_new(len);
        memcpy(b->data, &id, sizeof(id));
        for (size_t k = 8; k < len; k++)
            b->data[k] = (uint8_t)(id * 31 + k);
        ents[i] = (struct raft_entry){.term = 0,
                                      .index = 0,
                                      .time_ms = now_ms(s),
                                      .type = RAFT_ENTRY_NORMAL,
                                      .data = b};
    }
    uint64_t index = 0, term = 0;
    int rc = raft_propose(nd->r, ents, n, &index, &term);
    for (uint32_t i = 0; i < n; i++)
        tk_blob_unref(ents[i].data);
    hmix(s, (uint64_t)(-rc) << 32 | index);
    if (rc == 0) {
        grow((void **)&s->props, &s->cap_props, s->n_props + n + 1, sizeof(*s->props));
        for (uint32_t i = 0; i < n; i++) {
            uint64_t id = first_id + i;
            s->props[id] =
                (struct sim_prop){nd->id, nd->inc, index + i, term, PROP_PENDING};
            grow((void **)&s->pending, &s->cap_pending, s->n_pending_ids + 1,
                 sizeof(*s->pending));
            s->pending[s->n_pending_ids++] = id;
            s->n_pending++;
        }
        s->n_props += n;
        s->st.proposals += n;
        trace(s, "n%" PRIu64 " propose %u at %" PRIu64 " term %" PRIu64, nd->id, n, index,
              term);
    }
    node_sync(s, nd);
    return rc;
}

static void client_read(struct sim *s, struct sim_node *nd)
{
    uint64_t ctx = ++s->next_ctx;
    uint64_t token = ck_read_begin(s->ck);
    int rc = raft_read_index(nd->r, ctx);
    hmix(s, ctx ^ (uint64_t)(-rc));
    if (rc == 0) {
        s->st.reads++;
        grow((void **)&s->reads, &s->cap_reads, s->n_reads + 1, sizeof(*s->reads));
        s->reads[s->n_reads++] = (struct sim_read){ctx, nd->id, nd->inc, token};
    }
    node_sync(s, nd);
}

static void ev_client(struct sim *s)
{
    uint64_t dice = tk_prng_below(&s->prng, 100);
    struct sim_node *nd;
    if (s->n_pending >= CLIENT_OUTSTANDING_MAX) {
        /* Closed-loop clients: wait for answers before proposing more. */
    } else if (dice < 75) {
        nd = pick_up(s, true);
        if (nd == NULL)
            nd = pick_up(s, false);
        if (nd != NULL)
            sim_propose(s, nd->id,
                        (uint32_t)tk_prng_range(&s->prng, 1,
                                                tk_prng_chance(&s->prng, 0.1) ? 8 : 3));
    } else if (dice < 90) {
        nd = pick_up(s, false);
        if (nd != NULL)
            client_read(s, nd);
    } else if (dice < 93 && !s->healed) {
        nd = pick_up(s, true);
        if (nd != NULL) {
            uint64_t to = tk_prng_range(&s->prng, 1, s->n);
            int rc = raft_transfer_leadership(nd->r, to);
            hmix(s, to ^ (uint64_t)(-rc));
            if (rc == 0) {
                s->st.transfers++;
                trace(s, "n%" PRIu64 " transfers leadership to n%" PRIu64, nd->id, to);
            }
            node_sync(s, nd);
        }
    } else if (dice >= 93) {
        nd = pick_up(s, false);
        if (nd != NULL)
            sim_propose(s, nd->id, 1);
    }
    uint64_t next = s->now_us + tk_prng_range(&s->prng, 1, 2 * s->client_gap_us);
    if (next < s->clients_stop_us)
        ev_push(s, next, EV_CLIENT, 0, 0, NULL);
}

static const char *const change_names[] = {"", "add learner", "promote", "demote",
                                           "remove"};

/* One membership change on the leader, if there is one: promote a learner,
 * add the next spare as a learner, or remove a voter (the leader included)
 * while at least two would remain. Refusals (a change pending, a learner not
 * caught up) are part of the test: they are counted in the trace hash. */
static void ev_member(struct sim *s)
{
    struct sim_node *nd = pick_up(s, true);
    uint64_t dice = tk_prng_below(&s->prng, 100);
    if (nd != NULL) {
        const struct raft_config *c = raft_config(nd->r);
        struct raft_change ch = {0};
        if (c->n_learners > 0 && dice < 50) {
            ch = (struct raft_change){RAFT_CHANGE_PROMOTE, c->learners[0]};
        } else if (s->next_spare <= s->n && dice < 75) {
            ch = (struct raft_change){RAFT_CHANGE_ADD_LEARNER, s->next_spare};
        } else if (c->n_voters >= 3) {
            uint64_t v = c->voters[tk_prng_below(&s->prng, c->n_voters)];
            ch = (struct raft_change){RAFT_CHANGE_REMOVE, v};
        }
        if (ch.type != 0) {
            uint64_t index = 0;
            int rc = raft_change_membership(nd->r, &ch, &index);
            hmix(s, (uint64_t)ch.type << 56 ^ ch.id << 8 ^ (uint64_t)(-rc));
            if (rc == 0 && ch.type == RAFT_CHANGE_ADD_LEARNER)
                s->next_spare++;
            if (rc == 0 && index > 0) {
                s->st.changes++;
                sim_note(s, "n%" PRIu64 " appends a change at %" PRIu64 ": %s n%" PRIu64,
                         nd->id, index, change_names[ch.type], ch.id);
                trace(s, "n%" PRIu64 " change %s n%" PRIu64 " at %" PRIu64, nd->id,
                      change_names[ch.type], ch.id, index);
            }
            node_sync(s, nd);
        }
    }
    uint64_t next = s->now_us + tk_prng_range(&s->prng, 1, 2 * s->member_gap_us);
    if (next < s->heal_us)
        ev_push(s, next, EV_MEMBER, 0, 0, NULL);
}

/* The terms a forged message carries (--forged-terms): the boundary values of
 * raft.h's term bounds. A node of a simulated cluster holds a small term, so
 * the core must refuse every one of them (each is more than RAFT_TERM_LEAP
 * above it); the planted bug RAFT_BUG_NO_TERM_LEAP takes the first two. */
static const uint64_t forged_terms[] = {
    RAFT_TERM_CEIL - 1,
    RAFT_TERM_CEIL,
    RAFT_TERM_CEIL + 1,
    UINT64_C(1) << 63,
    UINT64_MAX - (UINT64_C(1) << 32), /* 2^64 - 2^32 - 1 */
    UINT64_MAX,
};

/* A lying member (issue 49): a message with a boundary term from a member id
 * (a voter of the receiver's configuration), stepped straight into an up
 * node, bypassing the network and its checks, as a local process on the Raft
 * port could. Its body claims nothing (a heartbeat of nothing, a vote request
 * with an empty log, a refused vote, a rejected append, a TimeoutNow), so a
 * core that took its term would be wedged (no campaign at the ceiling) without
 * being lied to about logs or votes: what must catch it is liveness. */
static void ev_forge(struct sim *s)
{
    struct sim_node *nd = pick_up(s, false);
    if (nd != NULL) {
        const struct raft_config *c = raft_config(nd->r);
        uint64_t from = c->voters[tk_prng_below(&s->prng, c->n_voters)];
        if (from != nd->id) {
            static const uint8_t types[] = {RAFT_MSG_APPEND, RAFT_MSG_VOTE,
                                            RAFT_MSG_VOTE_RESP, RAFT_MSG_APPEND_RESP,
                                            RAFT_MSG_TIMEOUT_NOW};
            struct raft_message m;
            memset(&m, 0, sizeof(m));
            m.type = types[tk_prng_below(&s->prng, sizeof(types))];
            m.from = from;
            m.to = nd->id;
            m.term = forged_terms[tk_prng_below(&s->prng, sizeof(forged_terms) /
                                                              sizeof(forged_terms[0]))];
            if (m.type == RAFT_MSG_VOTE) {
                m.u.vote.pre_vote = tk_prng_chance(&s->prng, 0.5);
                m.u.vote.transfer = tk_prng_chance(&s->prng, 0.5);
            } else if (m.type == RAFT_MSG_APPEND_RESP) {
                m.u.append_resp.reject = true;
            }
            s->st.forged++;
            hmix(s, 0xf0463d ^ m.type << 8 ^ from);
            hmix(s, m.term);
            trace(s, "forged %s n%" PRIu64 "->n%" PRIu64 " term %" PRIu64,
                  raft_msg_type_name(m.type), from, nd->id, m.term);
            if (raft_step(nd->r, &m) == TK_ERANGE)
                s->st.forged_refused++;
            node_sync(s, nd);
        }
    }
    uint64_t next = s->now_us + tk_prng_range(&s->prng, 1, FORGE_GAP_US);
    if (next < s->heal_us)
        ev_push(s, next, EV_FORGE, 0, 0, NULL);
}

static void heal_network(struct sim *s)
{
    memset(s->cut, 0, sizeof(s->cut));
    s->drop_p = 0;
    s->dup_p = 0;
    s->spike_until_us = 0;
}

static void ev_fault(struct sim *s)
{
    uint64_t dice = tk_prng_below(&s->prng, 100);
    uint32_t n_up = 0;
    for (uint32_t i = 0; i < s->n; i++)
        n_up += s->nodes[i].up;
    if (dice < 30) {
        /* Crash: the leader half the time, else anyone; then restart. */
        struct sim_node *nd = tk_prng_chance(&s->prng, 0.5) ? pick_up(s, true) : NULL;
        if (nd == NULL)
            nd = pick_up(s, false);
        if (nd != NULL && n_up > 1) {
            sim_crash(s, nd->id);
            uint64_t down = tk_prng_chance(&s->prng, 0.3)
                                ? tk_prng_range(&s->prng, 0, 30000)
                                : tk_prng_range(&s->prng, 30000, 1500000);
            ev_push(s, s->now_us + down, EV_RESTART, (uint32_t)nd->id, 0, NULL);
        }
    } else if (dice < 45) {
        /* Symmetric partition: a random side, or the leader alone. */
        uint32_t side = (uint32_t)tk_prng_range(&s->prng, 1, (1u << s->n) - 2);
        struct sim_node *l = pick_up(s, true);
        if (l != NULL && tk_prng_chance(&s->prng, 0.5))
            side = 1u << (l->id - 1);
        memset(s->cut, 0, sizeof(s->cut));
        for (uint32_t a = 1; a <= s->n; a++)
            for (uint32_t b = 1; b <= s->n; b++)
                if (((side >> (a - 1)) & 1) != ((side >> (b - 1)) & 1))
                    s->cut[a][b] = true;
        s->st.partitions++;
        trace(s, "partition side 0x%x", side);
        hmix(s, side);
    } else if (dice < 57) {
        uint64_t a = tk_prng_range(&s->prng, 1, s->n);
        uint64_t b = tk_prng_range(&s->prng, 1, s->n);
        if (a != b) {
            s->cut[a][b] = true;
            s->st.cuts++;
            trace(s, "cut n%" PRIu64 "->n%" PRIu64, a, b);
            hmix(s, a << 8 | b);
        }
    } else if (dice < 70) {
        memset(s->cut, 0, sizeof(s->cut));
        trace(s, "heal partitions");
        hmix(s, 0x4ea1);
    } else if (dice < 80) {
        s->drop_p = tk_prng_chance(&s->prng, 0.5) ? 0 : tk_prng_double(&s->prng) * 0.3;
        s->dup_p = tk_prng_chance(&s->prng, 0.5) ? 0 : tk_prng_double(&s->prng) * 0.1;
        trace(s, "drop %.3f dup %.3f", s->drop_p, s->dup_p);
    } else if (dice < 90) {
        s->spike_until_us = s->now_us + tk_prng_range(&s->prng, 50000, 600000);
        s->spike_max_us = tk_prng_range(&s->prng, 10000, 250000);
        trace(s, "delay spike");
    } else {
        struct sim_node *nd = pick_up(s, false);
        if (nd != NULL)
            nd->disk_slow_until_us = s->now_us + tk_prng_range(&s->prng, 50000, 800000);
        trace(s, "slow disk");
    }
    uint64_t next = s->now_us + tk_prng_range(&s->prng, 10000, s->fault_gap_us);
    if (next < s->heal_us)
        ev_push(s, next, EV_FAULT, 0, 0, NULL);
}

static void ev_heal(struct sim *s)
{
    heal_network(s);
    if (s->cfg.no_heal)
        memset(s->cut, 1, sizeof(s->cut));
    s->healed = true;
    trace(s, "heal: network repaired, every node restarted");
    hmix(s, 0x4ea1ed);
    for (uint32_t i = 0; i < s->n && !failed(s); i++)
        if (!s->nodes[i].up)
            sim_restart(s, s->nodes[i].id);
}

static bool converged(struct sim *s)
{
    uint64_t l = sim_leader(s);
    if (l == 0 || s->n_pending > 0 || s->now_us < s->clients_stop_us)
        return false;
    struct sim_node *ln = node_of(s, l);
    uint64_t commit = raft_commit(ln->r);
    if (commit != raft_last_index(ln->r))
        return false;
    for (uint32_t i = 0; i < s->n; i++) {
        const struct sim_node *nd = &s->nodes[i];
        if (!raft_config_is_member(raft_config(ln->r), nd->id))
            continue; /* a spare never added, or a removed node */
        if (!nd->up || raft_leader(nd->r) != l || nd->sm_index != commit)
            return false;
    }
    return true;
}

static void step(struct sim *s)
{
    struct ev e = ev_pop(s);
    TK_ASSERT(e.at_us >= s->now_us);
    s->now_us = e.at_us;
    ck_set_time(s->ck, now_ms(s));
    s->st.steps++;
    hmix(s, e.at_us);
    hmix(s, e.type);
    switch (e.type) {
    case EV_TICK: {
        struct sim_node *nd = node_of(s, e.node);
        if (!nd->up || nd->inc != e.inc)
            break;
        raft_tick(nd->r);
        node_sync(s, nd);
        ev_push(s, s->now_us + nd->tick_us, EV_TICK, e.node, e.inc, NULL);
        break;
    }
    case EV_DELIVER:
        ev_deliver(s, e.msg);
        msg_free(e.msg);
        break;
    case EV_PERSIST: {
        struct sim_node *nd = node_of(s, e.node);
        if (nd->up && nd->inc == e.inc)
            ev_persist(s, nd);
        break;
    }
    case EV_CLIENT:
        ev_client(s);
        break;
    case EV_FAULT:
        ev_fault(s);
        break;
    case EV_MEMBER:
        ev_member(s);
        break;
    case EV_FORGE:
        ev_forge(s);
        break;
    case EV_RESTART:
        if (!s->healed)
            sim_restart(s, e.node);
        break;
    case EV_HEAL:
        ev_heal(s);
        break;
    case EV_CRASH: {
        struct sim_node *nd = node_of(s, e.node);
        if (!nd->up || nd->inc != e.inc || s->healed)
            break;
        sim_crash(s, e.node);
        ev_push(s, s->now_us + tk_prng_range(&s->prng, 0, 400000), EV_RESTART, e.node, 0,
                NULL);
        break;
    }
    default:
        TK_UNREACHABLE();
    }
    failed(s);
}

/* ---- setup ------------------------------------------------------------- */

/* Node slots: the bootstrap voters 1..n_nodes, then (with membership) the
 * spares, which start as non-members. */
static void sim_slots(struct sim *s, const struct sim_config *c)
{
    s->n = c->n_nodes;
    s->n_voters0 = c->n_nodes;
    if (c->membership) {
        TK_ASSERT(c->n_nodes + SIM_SPARES <= SIM_NODES_MAX);
        s->n += SIM_SPARES;
        s->next_spare = c->n_nodes + 1;
    }
    s->config.n_voters = s->n_voters0;
    for (uint32_t i = 0; i < s->n_voters0; i++)
        s->config.voters[i] = i + 1;
}

struct sim *sim_new(const struct sim_config *c)
{
    TK_ASSERT(c->n_nodes >= 1);
    TK_ASSERT(c->n_nodes <= SIM_NODES_MAX);
    struct sim *s = tk_calloc(1, sizeof(*s));
    s->cfg = *c;
    if (s->cfg.liveness_ms == 0)
        s->cfg.liveness_ms = 10000;
    sim_slots(s, c);
    tk_prng_seed(&s->prng, c->seed);
    s->hash = mix64(c->seed ^ c->n_nodes);
    struct ck_ops ops = {op_entry_at, op_snapshot_index, op_leader_term, s};
    s->ck = ck_new(s->n, &ops);
    ck_set_rule_checks(s->ck, c->rule_checks);

    /* Raft options: defaults, varied by seed when faults are on. */
    struct tk_prng *p = &s->prng;
    raft_options_default(&s->opts);
    if (c->faults) {
        static const uint32_t ents[] = {1, 4, 16, 256};
        static const uint64_t bytes[] = {512, 8192, 1u << 20};
        static const uint32_t infl[] = {1, 4, 64};
        s->opts.heartbeat_ticks = (uint32_t)tk_prng_range(p, 1, 3);
        s->opts.pre_vote = tk_prng_chance(p, 0.7);
        s->opts.check_quorum = tk_prng_chance(p, 0.7);
        s->opts.max_append_entries = ents[tk_prng_below(p, 4)];
        s->opts.max_append_bytes = bytes[tk_prng_below(p, 3)];
        s->opts.max_inflight_msgs = infl[tk_prng_below(p, 3)];
        if (tk_prng_chance(p, 0.3))
            s->opts.max_inflight_bytes = 16384;
        if (tk_prng_chance(p, 0.3))
            s->opts.max_uncommitted = 32;
    }

    s->delay_min_us = c->faults ? tk_prng_range(p, 200, 2000) : 1000;
    s->delay_max_us = s->delay_min_us + (c->faults ? tk_prng_range(p, 500, 15000) : 2000);
    s->reorder_p = c->faults ? tk_prng_double(p) * 0.1 : 0;
    s->sync_min_us = c->faults ? tk_prng_range(p, 100, 3000) : 500;
    s->sync_max_us = s->sync_min_us + (c->faults ? tk_prng_range(p, 0, 10000) : 1500);
    s->snap_every = c->faults ? tk_prng_range(p, 8, 120) : 1000;
    s->snap_keep = c->faults ? tk_prng_range(p, 0, 20) : 10;
    s->client_gap_us = c->faults ? tk_prng_range(p, 3000, 40000) : 10000;
    s->fault_gap_us = tk_prng_range(p, 50000, 600000);
    s->leader_kill_p = c->faults && tk_prng_chance(p, 0.3) ? tk_prng_double(p) * 0.6 : 0;
    uint64_t fault_ms = c->fault_ms ? c->fault_ms : tk_prng_range(p, 2000, 5000);
    if (c->membership)
        s->member_gap_us = tk_prng_range(p, 100000, 800000);
    s->heal_us = fault_ms * US_PER_MS;
    s->clients_stop_us = s->heal_us + CLIENT_TAIL_MS * US_PER_MS;
    s->deadline_us = s->heal_us + s->cfg.liveness_ms * US_PER_MS;

    for (uint32_t i = 0; i < s->n; i++) {
        struct sim_node *nd = &s->nodes[i];
        nd->id = i + 1;
        /* Each node's clock runs a little fast or slow. */
        nd->tick_us =
            c->faults ? tk_prng_range(p, TICK_US - TICK_US / 50, TICK_US + TICK_US / 50)
                      : TICK_US;
    }
    trace(s,
          "seed %" PRIu64 " nodes %u: heartbeat %u election %u "
          "pre_vote %d check_quorum %d append %u/%" PRIu64 "B inflight %u/%" PRIu64
          "B uncommitted %u; delay %" PRIu64 "-%" PRIu64 "us reorder %.3f sync %" PRIu64
          "-%" PRIu64 "us snapshot every %" PRIu64 " keep %" PRIu64 "; heal at %" PRIu64
          "ms",
          c->seed, s->n, s->opts.heartbeat_ticks, s->opts.election_ticks,
          s->opts.pre_vote, s->opts.check_quorum, s->opts.max_append_entries,
          s->opts.max_append_bytes, s->opts.max_inflight_msgs, s->opts.max_inflight_bytes,
          s->opts.max_uncommitted, s->delay_min_us, s->delay_max_us, s->reorder_p,
          s->sync_min_us, s->sync_max_us, s->snap_every, s->snap_keep,
          s->heal_us / US_PER_MS);
    for (uint32_t i = 0; i < s->n && !failed(s); i++)
        node_boot(s, &s->nodes[i]);
    return s;
}

void sim_free(struct sim *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n_heap; i++)
        msg_free(s->heap[i].msg);
    tk_free(s->heap);
    for (uint32_t i = 0; i < s->n; i++) {
        struct sim_node *nd = &s->nodes[i];
        while (nd->wq) {
            struct sim_write *w = nd->wq;
            nd->wq = w->next;
            write_free(w);
        }
        if (nd->r)
            raft_free(nd->r);
        for (size_t k = 0; k < nd->n_log; k++)
            tk_blob_unref(nd->log[k].data);
        tk_free(nd->log);
        tk_blob_unref(nd->snap_data);
    }
    ck_free(s->ck);
    tk_free(s->props);
    tk_free(s->pending);
    tk_free(s->reads);
    tk_free(s);
}

int sim_run(struct sim *s)
{
    if (s->cfg.faults) {
        ev_push(s, tk_prng_range(&s->prng, 1, s->fault_gap_us), EV_FAULT, 0, 0, NULL);
        ev_push(s, s->heal_us, EV_HEAL, 0, 0, NULL);
        if (s->cfg.membership)
            ev_push(s, tk_prng_range(&s->prng, 1, s->member_gap_us), EV_MEMBER, 0, 0,
                    NULL);
        if (s->cfg.forged_terms)
            ev_push(s, tk_prng_range(&s->prng, 1, FORGE_GAP_US), EV_FORGE, 0, 0, NULL);
    }
    ev_push(s, tk_prng_range(&s->prng, 1, s->client_gap_us), EV_CLIENT, 0, 0, NULL);
    while (!failed(s)) {
        if (s->n_heap == 0 || s->heap[0].at_us > s->deadline_us) {
            uint64_t l = sim_leader(s);
            char applied[512];
            int off = 0;
            for (uint32_t i = 0; i < s->n && off < 400; i++) {
                const struct sim_node *nd = &s->nodes[i];
                if (!nd->up) {
                    off += snprintf(applied + off, sizeof(applied) - (size_t)off,
                                    " n%u down", i + 1);
                    continue;
                }
                off += snprintf(applied + off, sizeof(applied) - (size_t)off,
                                " n%u=%" PRIu64 " (%s term %" PRIu64 " commit %" PRIu64
                                " stable %" PRIu64 " last %" PRIu64 ")",
                                i + 1, nd->sm_index, raft_role_name(raft_role(nd->r)),
                                raft_term(nd->r), raft_commit(nd->r),
                                raft_stable_index(nd->r), raft_last_index(nd->r));
            }
            s->now_us = s->deadline_us;
            sim_fail(s,
                     "VIOLATION liveness: t=%" PRIu64 "ms: %" PRIu64
                     " ms after the heal: leader %s%" PRIu64 ", %" PRIu64
                     " proposals outstanding, commit %" PRIu64 ", applied%s",
                     now_ms(s), s->cfg.liveness_ms, l ? "n" : "none ", l, s->n_pending,
                     l ? raft_commit(node_of(s, l)->r) : 0, applied);
            break;
        }
        step(s);
        if (s->now_us >= s->clients_stop_us && !failed(s) && converged(s)) {
            s->converged = true;
            break;
        }
    }
    s->st.end_ms = now_ms(s);
    s->st.checks = ck_checks(s->ck);
    hmix(s, s->st.steps);
    return s->failed ? -1 : 0;
}

/* ---- accessors and scripted driving ------------------------------------- */

const char *sim_violation(const struct sim *s)
{
    return s->failed ? s->violation : "";
}

uint64_t sim_trace_hash(const struct sim *s)
{
    return s->hash;
}

const struct sim_stats *sim_stats(const struct sim *s)
{
    return &s->st;
}

uint64_t sim_now_ms(const struct sim *s)
{
    return now_ms(s);
}

int sim_run_until(struct sim *s, bool (*pred)(struct sim *s, void *data), void *data,
                  uint64_t max_ms)
{
    uint64_t end = s->now_us + max_ms * US_PER_MS;
    while (!failed(s)) {
        if (pred != NULL && pred(s, data))
            return 1;
        if (s->n_heap == 0 || s->heap[0].at_us > end) {
            s->now_us = end;
            break;
        }
        step(s);
    }
    s->st.end_ms = now_ms(s);
    s->st.checks = ck_checks(s->ck);
    return failed(s) ? -1 : 0;
}

int sim_run_for(struct sim *s, uint64_t ms)
{
    return sim_run_until(s, NULL, NULL, ms) < 0 ? -1 : 0;
}

uint64_t sim_leader(const struct sim *s)
{
    uint64_t best = 0, best_term = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const struct sim_node *nd = &s->nodes[i];
        if (nd->up && raft_role(nd->r) == RAFT_LEADER && raft_term(nd->r) > best_term) {
            best = nd->id;
            best_term = raft_term(nd->r);
        }
    }
    return best;
}

bool sim_up(const struct sim *s, uint64_t node)
{
    return node >= 1 && node <= s->n && s->nodes[node - 1].up;
}

uint64_t sim_term(const struct sim *s, uint64_t node)
{
    return sim_up(s, node) ? raft_term(s->nodes[node - 1].r) : 0;
}

uint64_t sim_commit(const struct sim *s, uint64_t node)
{
    return sim_up(s, node) ? raft_commit(s->nodes[node - 1].r) : 0;
}

uint64_t sim_applied(const struct sim *s, uint64_t node)
{
    return sim_up(s, node) ? s->nodes[node - 1].sm_index : 0;
}

uint64_t sim_pending(const struct sim *s)
{
    return s->n_pending;
}
