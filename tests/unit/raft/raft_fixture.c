/* The raft scenario-test driver; see raft_fixture.h.
 *
 * The fixture checks the ready contract as it drains: committed entries come
 * in order without gaps, and ready entries replace the mirrored log from
 * their first index on, exactly as a store would. A core that breaks the
 * contract fails the test that happens to drive it. */
#include "tests/unit/raft/raft_fixture.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/err.h"

/* A ready loop that never settles is a bug in the core, not a slow test. */
#define RF_DRAIN_MAX 1000
#define RF_RUN_MAX 200000

static void *rf_grow(void *v, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return v;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *nv = realloc(v, ncap * elem);
    ck_assert_ptr_nonnull(nv);
    *cap = ncap;
    return nv;
}

struct raft_message rf_msg(int type, uint64_t from, uint64_t to, uint64_t term)
{
    struct raft_message m;
    memset(&m, 0, sizeof(m));
    m.type = (uint8_t)type;
    m.from = from;
    m.to = to;
    m.term = term;
    return m;
}

void rf_msg_copy(struct raft_message *dst, const struct raft_message *src)
{
    *dst = *src;
    if (src->type == RAFT_MSG_APPEND) {
        uint32_t n = src->u.append.n_entries;
        dst->u.append.entries = NULL;
        if (n > 0) {
            struct raft_entry *e = malloc(n * sizeof(*e));
            ck_assert_ptr_nonnull(e);
            for (uint32_t i = 0; i < n; i++) {
                e[i] = src->u.append.entries[i];
                tk_blob_ref(e[i].data);
            }
            dst->u.append.entries = e;
        }
    } else if (src->type == RAFT_MSG_SNAPSHOT) {
        tk_blob_ref(src->u.snapshot.data);
    }
}

void rf_msg_release(struct raft_message *m)
{
    if (m->type == RAFT_MSG_APPEND) {
        for (uint32_t i = 0; i < m->u.append.n_entries; i++)
            tk_blob_unref(m->u.append.entries[i].data);
        free(m->u.append.entries);
        m->u.append.entries = NULL;
        m->u.append.n_entries = 0;
    } else if (m->type == RAFT_MSG_SNAPSHOT) {
        tk_blob_unref(m->u.snapshot.data);
        m->u.snapshot.data = NULL;
    }
}

static void rf_msgs_push(struct rf_msgs *l, const struct raft_message *m)
{
    l->v = rf_grow(l->v, &l->cap, l->n + 1, sizeof(*l->v));
    rf_msg_copy(&l->v[l->n++], m);
}

static void rf_msgs_free(struct rf_msgs *l)
{
    for (size_t i = 0; i < l->n; i++)
        rf_msg_release(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

void rf_options(struct raft_options *o)
{
    raft_options_default(o);
    o->seed = 1000;
    o->election_ticks = 10;
    o->heartbeat_ticks = 1;
}

struct rf_node *rf_node(struct rf_cluster *c, uint64_t id)
{
    ck_assert_uint_ge(id, 1);
    ck_assert_uint_le(id, c->n);
    return &c->nodes[id - 1];
}

struct raft *rf_raft(struct rf_cluster *c, uint64_t id)
{
    return rf_node(c, id)->r;
}

static void rf_store_clear(struct rf_node *nd, size_t keep)
{
    for (size_t i = keep; i < nd->n_store; i++)
        tk_blob_unref(nd->store[i].data);
    nd->n_store = keep;
}

static void rf_store_append(struct rf_node *nd, const struct raft_entry *e)
{
    ck_assert_uint_eq(e->index, nd->store_snap_index + nd->n_store + 1);
    nd->store = rf_grow(nd->store, &nd->cap_store, nd->n_store + 1, sizeof(*nd->store));
    nd->store[nd->n_store] = *e;
    tk_blob_ref(e->data);
    nd->n_store++;
}

static void rf_node_clear(struct rf_node *nd)
{
    if (nd->r != NULL)
        raft_free(nd->r);
    rf_store_clear(nd, 0);
    free(nd->store);
    free(nd->applied);
    free(nd->reads);
    tk_blob_unref(nd->snap_data);
    memset(nd, 0, sizeof(*nd));
}

static struct tk_blob *rf_payload(uint64_t index, uint64_t term)
{
    char buf[48];
    int len = snprintf(buf, sizeof(buf), "i%llu t%llu", (unsigned long long)index,
                       (unsigned long long)term);
    ck_assert_int_gt(len, 0);
    return tk_blob_copy(buf, (size_t)len);
}

static void rf_node_start(struct rf_cluster *c, uint64_t id, uint64_t term, uint64_t vote,
                          const uint64_t *terms, size_t n_terms)
{
    struct rf_node *nd = rf_node(c, id);
    rf_node_clear(nd);
    nd->id = id;

    struct raft_entry *entries = NULL;
    if (n_terms > 0) {
        entries = calloc(n_terms, sizeof(*entries));
        ck_assert_ptr_nonnull(entries);
    }
    for (size_t i = 0; i < n_terms; i++) {
        entries[i].index = i + 1;
        entries[i].term = terms[i];
        entries[i].time_ms = 1000 + i;
        entries[i].type = RAFT_ENTRY_NORMAL;
        entries[i].data = rf_payload(i + 1, terms[i]);
    }

    struct raft_boot boot;
    memset(&boot, 0, sizeof(boot));
    boot.hard_state.term = term;
    boot.hard_state.vote = vote;
    boot.entries = entries;
    boot.n_entries = n_terms;
    size_t nv = c->n_voters ? c->n_voters : c->n;
    boot.bootstrap.n_voters = (uint32_t)nv;
    for (size_t i = 0; i < nv; i++)
        boot.bootstrap.voters[i] = i + 1;

    struct raft_options o = c->tmpl;
    o.id = id;
    o.seed = c->tmpl.seed + id;
    int rc = raft_new(&o, &boot, &nd->r);
    ck_assert_msg(rc == 0, "raft_new(node %llu): %s", (unsigned long long)id,
                  tk_errname(rc));

    nd->store_hs = boot.hard_state;
    for (size_t i = 0; i < n_terms; i++) {
        rf_store_append(nd, &entries[i]);
        tk_blob_unref(entries[i].data); /* the core and the mirror hold theirs */
    }
    free(entries);
}

struct rf_cluster *rf_new_spare(size_t n, size_t voters, const struct raft_options *tmpl)
{
    ck_assert_uint_ge(voters, 1);
    ck_assert_uint_le(voters, n);
    ck_assert_uint_ge(n, 1);
    ck_assert_uint_le(n, RAFT_VOTERS_MAX);
    struct rf_cluster *c = calloc(1, sizeof(*c));
    ck_assert_ptr_nonnull(c);
    c->n = n;
    c->n_voters = voters;
    if (tmpl != NULL)
        c->tmpl = *tmpl;
    else
        rf_options(&c->tmpl);
    for (uint64_t id = 1; id <= n; id++)
        rf_node_start(c, id, 0, RAFT_NONE, NULL, 0);
    return c;
}

struct rf_cluster *rf_new(size_t n, const struct raft_options *tmpl)
{
    return rf_new_spare(n, n, tmpl);
}

void rf_free(struct rf_cluster *c)
{
    for (size_t i = 0; i < c->n; i++)
        rf_node_clear(&c->nodes[i]);
    rf_msgs_free(&c->net);
    rf_msgs_free(&c->trace);
    free(c);
}

void rf_boot_log(struct rf_cluster *c, uint64_t id, uint64_t term, uint64_t vote,
                 const uint64_t *terms, size_t n_terms)
{
    rf_node_start(c, id, term, vote, terms, n_terms);
}

/* Mirrors one ready onto the node's disk and state machine, and queues its
 * messages. Called between raft_ready and raft_advance. */
static void rf_take_ready(struct rf_cluster *c, struct rf_node *nd,
                          const struct raft_ready *rd)
{
    nd->n_readies++;
    if (rd->hard_state_changed)
        nd->store_hs = rd->hard_state;

    if (rd->snapshot != NULL) {
        nd->installed_snapshot = true;
        nd->snap_meta = *rd->snapshot;
        tk_blob_unref(nd->snap_data);
        nd->snap_data = tk_blob_ref(rd->snapshot_data);
        /* Replace the whole log; matching entries after it may stay. */
        uint64_t keep_from = rd->snapshot->index + 1;
        bool match = false;
        uint64_t off = 0;
        if (rd->snapshot->index > nd->store_snap_index &&
            rd->snapshot->index <= nd->store_snap_index + nd->n_store) {
            off = rd->snapshot->index - nd->store_snap_index - 1;
            match = nd->store[off].term == rd->snapshot->term;
        }
        if (match) {
            size_t drop = (size_t)off + 1;
            for (size_t i = 0; i < drop; i++)
                tk_blob_unref(nd->store[i].data);
            memmove(nd->store, nd->store + drop,
                    (nd->n_store - drop) * sizeof(*nd->store));
            nd->n_store -= drop;
        } else {
            rf_store_clear(nd, 0);
        }
        nd->store_snap_index = keep_from - 1;
        nd->store_snap_term = rd->snapshot->term;
        nd->applied_index = rd->snapshot->index;
    }

    if (rd->n_entries > 0) {
        uint64_t first = rd->entries[0].index;
        ck_assert_msg(first > nd->store_snap_index,
                      "node %llu: ready entries start at %llu, inside the "
                      "snapshot (%llu)",
                      (unsigned long long)nd->id, (unsigned long long)first,
                      (unsigned long long)nd->store_snap_index);
        ck_assert_msg(first <= nd->store_snap_index + nd->n_store + 1,
                      "node %llu: ready entries start at %llu, after a gap "
                      "(disk last %llu)",
                      (unsigned long long)nd->id, (unsigned long long)first,
                      (unsigned long long)(nd->store_snap_index + nd->n_store));
        rf_store_clear(nd, (size_t)(first - nd->store_snap_index - 1));
        for (size_t i = 0; i < rd->n_entries; i++)
            rf_store_append(nd, &rd->entries[i]);
        nd->last_ready_first_index = first;
        nd->last_ready_n_entries = rd->n_entries;
        nd->entries_written += rd->n_entries;
    }

    for (size_t i = 0; i < rd->n_committed; i++) {
        const struct raft_entry *e = &rd->committed[i];
        ck_assert_msg(e->index == nd->applied_index + 1,
                      "node %llu: committed entry %llu applied after %llu",
                      (unsigned long long)nd->id, (unsigned long long)e->index,
                      (unsigned long long)nd->applied_index);
        nd->applied = rf_grow(nd->applied, &nd->cap_applied, nd->n_applied + 1,
                              sizeof(*nd->applied));
        nd->applied[nd->n_applied].index = e->index;
        nd->applied[nd->n_applied].term = e->term;
        nd->applied[nd->n_applied].type = e->type;
        nd->n_applied++;
        nd->applied_index = e->index;
    }

    for (size_t i = 0; i < rd->n_read_states; i++) {
        nd->reads =
            rf_grow(nd->reads, &nd->cap_reads, nd->n_reads + 1, sizeof(*nd->reads));
        nd->reads[nd->n_reads++] = rd->read_states[i];
    }

    for (size_t i = 0; i < rd->n_messages; i++) {
        const struct raft_message *m = &rd->messages[i];
        ck_assert_msg(m->from == nd->id, "node %llu sent a message from %llu",
                      (unsigned long long)nd->id, (unsigned long long)m->from);
        rf_msgs_push(&c->net, m);
    }
}

void rf_drain(struct rf_cluster *c, uint64_t id)
{
    struct rf_node *nd = rf_node(c, id);
    for (int i = 0; raft_has_ready(nd->r); i++) {
        ck_assert_msg(i < RF_DRAIN_MAX, "node %llu: ready never settles",
                      (unsigned long long)id);
        struct raft_ready rd;
        raft_ready(nd->r, &rd);
        rf_take_ready(c, nd, &rd);
        uint64_t applied = nd->applied_index;
        uint64_t seq = rd.seq;
        raft_advance(nd->r, &rd);
        if (rd.n_committed > 0 || rd.snapshot != NULL)
            raft_applied(nd->r, applied);
        if (seq == 0)
            continue; /* nothing to persist: keep the newest held seq */
        if (nd->hold)
            nd->held_seq = seq;
        else
            raft_persisted(nd->r, seq);
    }
}

void rf_drain_all(struct rf_cluster *c)
{
    for (uint64_t id = 1; id <= c->n; id++)
        rf_drain(c, id);
}

void rf_hold(struct rf_cluster *c, uint64_t id)
{
    rf_drain(c, id);
    rf_node(c, id)->hold = true;
}

void rf_release(struct rf_cluster *c, uint64_t id)
{
    struct rf_node *nd = rf_node(c, id);
    nd->hold = false;
    if (nd->held_seq != 0) {
        raft_persisted(nd->r, nd->held_seq);
        nd->held_seq = 0;
    }
    rf_drain(c, id);
}

void rf_tick(struct rf_cluster *c, uint64_t id)
{
    raft_tick(rf_raft(c, id));
    rf_drain(c, id);
}

int rf_step(struct rf_cluster *c, const struct raft_message *m)
{
    int rc = raft_step(rf_raft(c, m->to), m);
    rf_drain(c, m->to);
    return rc;
}

static bool rf_dropped(const struct rf_cluster *c, const struct raft_message *m)
{
    if (m->from <= RAFT_VOTERS_MAX && c->isolated[m->from])
        return true;
    if (m->to <= RAFT_VOTERS_MAX && c->isolated[m->to])
        return true;
    return c->drop != NULL && c->drop(m, c->drop_data);
}

static bool rf_match(const struct raft_message *m, uint64_t from, uint64_t to, int type)
{
    return (from == 0 || m->from == from) && (to == 0 || m->to == to) &&
           (type == RAFT_MSG_NONE || m->type == type);
}

static void rf_deliver(struct rf_cluster *c, struct raft_message *m)
{
    if (!rf_dropped(c, m) && m->to >= 1 && m->to <= c->n) {
        rf_msgs_push(&c->trace, m);
        int rc = rf_step(c, m);
        ck_assert_msg(rc == 0, "raft_step(%s %llu->%llu): %s",
                      raft_msg_type_name(m->type), (unsigned long long)m->from,
                      (unsigned long long)m->to, tk_errname(rc));
    }
    rf_msg_release(m);
}

bool rf_deliver_first(struct rf_cluster *c, uint64_t from, uint64_t to, int type)
{
    for (size_t i = c->net_head; i < c->net.n; i++) {
        if (!rf_match(&c->net.v[i], from, to, type))
            continue;
        struct raft_message m = c->net.v[i];
        memmove(&c->net.v[i], &c->net.v[i + 1], (c->net.n - i - 1) * sizeof(m));
        c->net.n--;
        rf_deliver(c, &m);
        return true;
    }
    return false;
}

bool rf_deliver_one(struct rf_cluster *c)
{
    if (c->net_head == c->net.n) {
        /* Everything queued so far went out: reuse the array. */
        rf_msgs_free(&c->net);
        c->net_head = 0;
        return false;
    }
    struct raft_message m = c->net.v[c->net_head];
    memset(&c->net.v[c->net_head], 0, sizeof(m));
    c->net_head++;
    rf_deliver(c, &m);
    return true;
}

void rf_run(struct rf_cluster *c)
{
    rf_drain_all(c);
    for (int i = 0; rf_deliver_one(c); i++)
        ck_assert_msg(i < RF_RUN_MAX, "the network never goes quiet");
}

void rf_net_clear(struct rf_cluster *c)
{
    for (size_t i = c->net_head; i < c->net.n; i++)
        rf_msg_release(&c->net.v[i]);
    rf_msgs_free(&c->net);
    c->net_head = 0;
}

uint32_t rf_tick_until_campaign(struct rf_cluster *c, uint64_t id, uint32_t max)
{
    struct raft *r = rf_raft(c, id);
    for (uint32_t t = 1; t <= max; t++) {
        rf_tick(c, id);
        if (raft_role(r) != RAFT_FOLLOWER)
            return t;
    }
    ck_abort_msg("node %llu did not campaign within %u ticks", (unsigned long long)id,
                 max);
    return 0;
}

uint64_t rf_elect(struct rf_cluster *c, uint64_t id)
{
    rf_tick_until_campaign(c, id, 4 * c->tmpl.election_ticks);
    rf_run(c);
    struct raft *r = rf_raft(c, id);
    ck_assert_msg(raft_role(r) == RAFT_LEADER, "node %llu is %s, not leader",
                  (unsigned long long)id, raft_role_name(raft_role(r)));
    return raft_term(r);
}

void rf_heartbeat_rounds(struct rf_cluster *c, uint64_t id, int rounds)
{
    for (int i = 0; i < rounds; i++) {
        rf_tick(c, id);
        rf_run(c);
    }
}

size_t rf_queued_count(const struct rf_cluster *c, uint64_t from, uint64_t to, int type)
{
    size_t n = 0;
    for (size_t i = c->net_head; i < c->net.n; i++)
        n += rf_match(&c->net.v[i], from, to, type);
    return n;
}

const struct raft_message *rf_queued_find(const struct rf_cluster *c, uint64_t from,
                                          uint64_t to, int type)
{
    for (size_t i = c->net_head; i < c->net.n; i++)
        if (rf_match(&c->net.v[i], from, to, type))
            return &c->net.v[i];
    return NULL;
}

size_t rf_trace_count(const struct rf_cluster *c, uint64_t from, uint64_t to, int type)
{
    size_t n = 0;
    for (size_t i = 0; i < c->trace.n; i++)
        n += rf_match(&c->trace.v[i], from, to, type);
    return n;
}

const struct raft_message *rf_trace_find(const struct rf_cluster *c, uint64_t from,
                                         uint64_t to, int type)
{
    for (size_t i = 0; i < c->trace.n; i++)
        if (rf_match(&c->trace.v[i], from, to, type))
            return &c->trace.v[i];
    return NULL;
}

int rf_propose(struct rf_cluster *c, uint64_t id, size_t n, size_t payload_bytes,
               uint64_t *first_index)
{
    struct raft_entry *e = calloc(n ? n : 1, sizeof(*e));
    ck_assert_ptr_nonnull(e);
    for (size_t i = 0; i < n; i++) {
        e[i].type = RAFT_ENTRY_NORMAL;
        e[i].time_ms = 5000 + i;
        if (payload_bytes > 0) {
            e[i].data = tk_blob_new(payload_bytes);
            memset(e[i].data->data, 'a' + (int)(i % 26), payload_bytes);
        }
    }
    uint64_t first = 0;
    uint64_t term = 0;
    int rc = raft_propose(rf_raft(c, id), e, n, &first, &term);
    for (size_t i = 0; i < n; i++)
        tk_blob_unref(e[i].data);
    free(e);
    if (rc == 0)
        ck_assert_uint_eq(term, raft_term(rf_raft(c, id)));
    if (first_index != NULL)
        *first_index = first;
    rf_drain(c, id);
    return rc;
}

const struct raft_read_state *rf_read_state(const struct rf_cluster *c, uint64_t id,
                                            uint64_t ctx)
{
    const struct rf_node *nd = &c->nodes[id - 1];
    for (size_t i = 0; i < nd->n_reads; i++)
        if (nd->reads[i].ctx == ctx)
            return &nd->reads[i];
    return NULL;
}

uint64_t rf_term_at(struct rf_cluster *c, uint64_t id, uint64_t index)
{
    uint64_t term = 0;
    if (raft_term_at(rf_raft(c, id), index, &term) != 0)
        return 0;
    return term;
}

uint64_t rf_store_term_at(const struct rf_cluster *c, uint64_t id, uint64_t index)
{
    const struct rf_node *nd = &c->nodes[id - 1];
    if (index == nd->store_snap_index)
        return nd->store_snap_term;
    if (index < nd->store_snap_index || index > nd->store_snap_index + nd->n_store)
        return 0;
    return nd->store[index - nd->store_snap_index - 1].term;
}

uint64_t rf_store_last_index(const struct rf_cluster *c, uint64_t id)
{
    const struct rf_node *nd = &c->nodes[id - 1];
    return nd->store_snap_index + nd->n_store;
}

void rf_assert_logs_equal(struct rf_cluster *c, uint64_t a, uint64_t b, uint64_t from)
{
    struct raft *ra = rf_raft(c, a);
    struct raft *rb = rf_raft(c, b);
    uint64_t last = raft_last_index(ra);
    ck_assert_msg(raft_last_index(rb) == last,
                  "node %llu last index %llu, node %llu last index %llu",
                  (unsigned long long)b, (unsigned long long)raft_last_index(rb),
                  (unsigned long long)a, (unsigned long long)last);
    ck_assert_msg(rf_store_last_index(c, b) == last,
                  "node %llu disk last index %llu, node %llu last index %llu",
                  (unsigned long long)b, (unsigned long long)rf_store_last_index(c, b),
                  (unsigned long long)a, (unsigned long long)last);
    for (uint64_t i = from; i <= last; i++) {
        uint64_t ta = rf_term_at(c, a, i);
        ck_assert_msg(ta != 0, "node %llu has no term at %llu", (unsigned long long)a,
                      (unsigned long long)i);
        ck_assert_msg(rf_term_at(c, b, i) == ta,
                      "index %llu: node %llu term %llu, node %llu term %llu",
                      (unsigned long long)i, (unsigned long long)b,
                      (unsigned long long)rf_term_at(c, b, i), (unsigned long long)a,
                      (unsigned long long)ta);
        ck_assert_msg(rf_store_term_at(c, b, i) == ta,
                      "index %llu: node %llu disk term %llu, node %llu term %llu",
                      (unsigned long long)i, (unsigned long long)b,
                      (unsigned long long)rf_store_term_at(c, b, i),
                      (unsigned long long)a, (unsigned long long)ta);
    }
}
