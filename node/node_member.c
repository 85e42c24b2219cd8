/* Membership at the node level (node.h, "membership"): the replicated record
 * of each member's addresses, dialing members as they appear, and driving one
 * membership change on the leader: write the address record, append the
 * configuration change (raft_change_membership), wait for it to commit, and
 * for an add as a voter, promote the learner once raft_catch_up says it is
 * caught up.
 *
 * Why the addresses are KV records and not part of the configuration entry:
 * raft/ stays pure and knows only ids (its config entry format is shared with
 * the simulator and the store); the KV is replicated, snapshotted and
 * recovered already, so the records survive compaction and restarts with no
 * new persistence. The record is written (and applied on the leader) before
 * the configuration entry is appended, so it precedes that entry in every
 * log: any node holding the new configuration either has applied the record
 * or will, and dials the member once it has (node__member_tick). Once a
 * committed configuration drops a member, the transport forgets it and its
 * slots in the tables below are freed (forget_removed); the fence refuses it
 * from the configuration and its removed record, not from those tables.
 *
 * Called by node.c: node__member_init after the transport opens,
 * node__member_tick on every tick, node__member_shutdown at stop; by
 * node_forward.c (fences), node_recover.c and node_restore.c (the boot fence,
 * records). Calls node_record.c (a record's decoder) and node_status.c.
 * Loop thread only. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/hostport.h"
#include "base/log.h"
#include "kv.pb-c.h"
#include "node/node_internal.h"
#include "transport/transport.h"

enum { PH_IDLE, PH_RECORD, PH_COMMIT, PH_PROMOTE };

/* What a change waits for at most, per phase: its record, its commit, a
 * learner's catch-up. */
#define MEMBER_PROMOTE_WAIT_MS 30000

static size_t member_key(uint64_t id, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s%" PRIu64, NODE_MEMBER_KEY_PREFIX, id);
    return k > 0 ? (size_t)k : 0;
}

/* The record of `id` as this node has applied it. */
static void rec_read(struct node *n, uint64_t id, struct node_member_rec *r)
{
    memset(r, 0, sizeof(*r));
    char key[64];
    size_t kl = member_key(id, key, sizeof(key));
    struct kv_item it;
    if (kv_sm_get(n->sm, key, kl, &it) == 0)
        (void)node__member_rec_decode(it.value, it.value_len, r); /* r->corrupt says */
}

/* The address of a bootstrap member (node_options), "" if it is not one. */
static void boot_addr(const struct node *n, uint64_t id, char *out, size_t cap)
{
    out[0] = '\0';
    for (uint32_t i = 0; i < n->o.members.n_voters; i++) {
        if (n->o.members.voters[i] != id)
            continue;
        const char *h = n->o.peer_hosts[i];
        if (id == n->o.id && h == NULL)
            h = n->o.listen_host;
        if (h != NULL)
            snprintf(out, cap, strchr(h, ':') ? "[%s]:%u" : "%s:%u", h,
                     id == n->o.id && n->o.peer_hosts[i] == NULL ? n->o.listen_port
                                                                 : n->o.peer_ports[i]);
        return;
    }
}

/* The HTTP address of a bootstrap member (--members-http), "" if not given. */
static void boot_http(const struct node *n, uint64_t id, char *out, size_t cap)
{
    out[0] = '\0';
    for (uint32_t i = 0; i < n->o.members.n_voters; i++)
        if (n->o.members.voters[i] == id && n->o.peer_http[i] != NULL &&
            strchr(n->o.peer_http[i], ' ') == NULL)
            snprintf(out, cap, "%s", n->o.peer_http[i]);
}

/* A member's address, "host:port" or "[v6]:port": 0, or TK_EINVAL (port 0
 * too: a member is dialled there). */
static int member_addr_parse(const char *a, char *host, size_t cap, uint16_t *port)
{
    if (tk_hostport_split(a, host, cap, port) != 0 || *port == 0)
        return TK_EINVAL;
    return 0;
}

/* The raft address of `id` from a record in the log that the state machine
 * has not applied yet (newest first): a node restarting behind its leader,
 * whose KV is at its durable index, must dial a member added at run time
 * before it can apply that member's record, for its answers to reach the
 * leader at all. Bounded by the log held; "" if none. */
static void log_addr(struct node *n, uint64_t id, char *out, size_t cap)
{
    char key[64];
    size_t kl = member_key(id, key, sizeof(key));
    uint64_t lo = kv_sm_applied_index(n->sm) + 1, hi = raft_last_index(n->raft);
    if (lo < raft_first_index(n->raft))
        lo = raft_first_index(n->raft);
    out[0] = '\0';
    for (uint64_t i = hi; i >= lo && i > 0; i--) {
        const struct raft_entry *e = raft_entry_at(n->raft, i);
        if (e == NULL || e->type != RAFT_ENTRY_NORMAL || e->data == NULL ||
            memmem(e->data->data, e->data->len, key, kl) == NULL)
            continue;
        Kvpb__Command *c = kvpb__command__unpack(NULL, e->data->len, e->data->data);
        if (c == NULL)
            continue;
        bool hit = c->cmd_case == KVPB__COMMAND__CMD_PUT && c->put != NULL &&
                   c->put->key.len == kl && memcmp(c->put->key.data, key, kl) == 0;
        struct node_member_rec r;
        if (hit &&
            node__member_rec_decode(c->put->value.data, c->put->value.len, &r) == 0)
            snprintf(out, cap, "%s", r.raft);
        kvpb__command__free_unpacked(c, NULL);
        if (hit)
            return;
    }
}

static bool dialed(const struct node *n, uint64_t id)
{
    for (uint32_t i = 0; i < n->mem.n_peers; i++)
        if (n->mem.peers[i] == id)
            return true;
    return false;
}

/* Adds member `id` to the TCP transport if its address is known. */
static void dial(struct node *n, uint64_t id)
{
    if (n->o.hub != NULL || id == n->o.id || dialed(n, id) ||
        n->mem.n_peers == NODE_PEERS_MAX)
        return;
    struct node_member_rec r;
    rec_read(n, id, &r);
    char addr[NODE_ADDR_MAX], host[NODE_ADDR_MAX];
    if (r.found && r.raft[0] != '\0')
        snprintf(addr, sizeof(addr), "%s", r.raft);
    else
        boot_addr(n, id, addr, sizeof(addr));
    if (addr[0] == '\0')
        log_addr(n, id, addr, sizeof(addr));
    uint16_t port = 0;
    if (addr[0] == '\0' || member_addr_parse(addr, host, sizeof(host), &port) != 0)
        return; /* not known (yet): the record comes with the log */
    int rc = transport_tcp_add_peer(n->transport, id, host, port);
    if (rc != 0 && rc != TK_EINVAL)
        return;
    /* TK_EINVAL: a peer already (open_transport) or a bad name: never again. */
    n->mem.peers[n->mem.n_peers++] = id;
    if (rc == 0)
        TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
               "dialing member %" PRIu64 " at %s", id, addr);
}

static size_t ids_text(const uint64_t *ids, uint32_t k, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < k && len + 24 < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%" PRIu64, i ? "," : "", ids[i]);
    return len;
}

/* Says plainly when the voters given at start are not the configuration in
 * force (recovered from the log or the snapshot). */
static void check_members_flag(struct node *n)
{
    const struct raft_config *c = raft_config(n->raft);
    struct raft_config given = n->o.members;
    struct raft_config now = *c;
    now.n_learners = 0;
    if (n->o.join || raft_config_equal(&given, &now))
        return;
    char a[400], b[400], l[200];
    ids_text(given.voters, given.n_voters, a, sizeof(a));
    ids_text(c->voters, c->n_voters, b, sizeof(b));
    ids_text(c->learners, c->n_learners, l, sizeof(l));
    TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
           "--members lists voters [%s], but the cluster's configuration (from its log, "
           "index %" PRIu64 ") has voters [%s] and learners [%s]: the cluster's is used; "
           "--members only bootstraps a new cluster and gives addresses",
           a, raft_config_index(n->raft), b, l);
}

void node__member_init(struct node *n)
{
    check_members_flag(n);
    for (uint32_t i = 0; i < n->o.members.n_voters; i++)
        if (n->o.members.voters[i] != n->o.id && n->mem.n_peers < NODE_PEERS_MAX)
            n->mem.peers[n->mem.n_peers++] = n->o.members.voters[i];
    n->mem.seen_config = UINT64_MAX;
}

/* Drops `id` from a table of `*k` ids, if there (order is not kept). */
static void ids_drop(uint64_t *ids, uint32_t *k, uint64_t id)
{
    for (uint32_t i = 0; i < *k; i++)
        if (ids[i] == id) {
            ids[i] = ids[--*k];
            return;
        }
}

/* Lets go of member `id`, removed from the configuration: the transport
 * closes its connections and dials it no more, and its slots here are freed
 * for the next member. Refusing it again is not these tables' job: the
 * fence (node__member_fenced) reads the configuration and the records. */
static void forget(struct node *n, uint64_t id)
{
    ids_drop(n->mem.peers, &n->mem.n_peers, id);
    ids_drop(n->mem.binding, &n->mem.n_binding, id);
    for (uint32_t i = 0; i < n->mem.n_seen; i++)
        if (n->mem.seen[i].id == id) {
            n->mem.seen[i] = n->mem.seen[--n->mem.n_seen];
            break;
        }
    if (n->o.hub != NULL)
        return; /* in-process: nothing is dialed */
    int rc = transport_tcp_remove_peer(n->transport, id);
    TK_ASSERT(rc == 0 || rc == TK_ENOTFOUND || rc == TK_ECLOSED);
    if (rc == 0)
        TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
               "member %" PRIu64 " removed: no longer dialed", id);
}

/* Forgets the peers that the committed configuration no longer has. Only a
 * committed one: an uncommitted removal may give way to a configuration that
 * has the id again (node__member_fenced waits for the same). A node that is
 * not a member itself (joining, or removed) keeps its peers. */
static void forget_removed(struct node *n)
{
    const struct raft_config *c = raft_config(n->raft);
    if (raft_config_index(n->raft) > raft_commit(n->raft) ||
        !raft_config_is_member(c, n->o.id))
        return;
    for (uint32_t i = 0; i < n->mem.n_peers;) {
        uint64_t id = n->mem.peers[i];
        if (raft_config_is_member(c, id))
            i++;
        else
            forget(n, id); /* peers[i] is now another id, or past the end */
    }
}

static void reconcile(struct node *n)
{
    const struct raft_config *c = raft_config(n->raft);
    forget_removed(n);
    for (uint32_t i = 0; i < c->n_voters; i++)
        dial(n, c->voters[i]);
    for (uint32_t i = 0; i < c->n_learners; i++)
        dial(n, c->learners[i]);
}

/* ---- listing ------------------------------------------------------------ */

static void member_fill(struct node *n, uint64_t id, bool voter, struct node_member *m)
{
    memset(m, 0, sizeof(*m));
    m->id = id;
    m->voter = voter;
    struct node_member_rec r;
    rec_read(n, id, &r);
    if (r.found && !r.corrupt) {
        snprintf(m->raft, sizeof(m->raft), "%s", r.raft);
        snprintf(m->http, sizeof(m->http), "%s", r.http);
    } else {
        boot_addr(n, id, m->raft, sizeof(m->raft));
    }
    struct raft_catch_up cu;
    if (raft_catch_up(n->raft, id, &cu) == 0) {
        m->has_progress = true;
        m->match = cu.match;
        m->behind = cu.behind;
        m->caught_up = cu.caught_up;
    }
}

size_t node_members(struct node *n, struct node_member *out, size_t cap,
                    uint64_t *config_index, bool *committed)
{
    const struct raft_config *c = raft_config(n->raft);
    size_t k = 0;
    for (uint32_t i = 0; i < c->n_voters; i++, k++)
        if (k < cap)
            member_fill(n, c->voters[i], true, &out[k]);
    for (uint32_t i = 0; i < c->n_learners; i++, k++)
        if (k < cap)
            member_fill(n, c->learners[i], false, &out[k]);
    *config_index = raft_config_index(n->raft);
    *committed = *config_index <= raft_commit(n->raft);
    return k;
}

bool node_member_http(struct node *n, uint64_t id, char *out, size_t cap)
{
    struct node_member_rec r;
    rec_read(n, id, &r);
    if (r.http[0] == '\0' || cap == 0)
        return false;
    snprintf(out, cap, "%s", r.http);
    return true;
}

/* ---- one change --------------------------------------------------------- */

static void fill(struct node_member_result *res, int status, const char *fmt, va_list ap)
{
    res->status = status;
    vsnprintf(res->msg, sizeof(res->msg), fmt, ap);
}

static int refuse(struct node_member_result *res, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct node_member_result *res, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fill(res, status, fmt, ap);
    va_end(ap);
    return status;
}

static void finish(struct node *n, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish(struct node *n, int status, const char *fmt, ...)
{
    struct node_member_result res;
    memset(&res, 0, sizeof(res));
    res.index = n->mem.index;
    va_list ap;
    va_start(ap, fmt);
    fill(&res, status, fmt, ap);
    va_end(ap);
    struct raft_catch_up cu;
    if (raft_catch_up(n->raft, n->mem.c.id, &cu) == 0) {
        res.behind = cu.behind;
        res.match = cu.match;
    }
    TK_LOG(status == 0 ? TK_LOG_INFO : TK_LOG_WARN, n->o.id, raft_term(n->raft),
           "membership change of node %" PRIu64 ": %s", n->mem.c.id, res.msg);
    n->mem.busy = false;
    n->mem.phase = PH_IDLE;
    n->mem.cb(&res, n->mem.data);
}

/* Appends the change; on success waits for its commit. */
static int append_change(struct node *n, uint8_t type, struct node_member_result *res)
{
    struct raft_change ch = {.type = type, .id = n->mem.c.id};
    uint64_t index = 0;
    int rc = raft_change_membership(n->raft, &ch, &index);
    if (rc == 0) {
        n->mem.index = index;
        /* A retried promotion of a voter appends nothing: *index is then the
         * configuration's entry, of whatever term it was. */
        if (index == 0 || raft_term_at(n->raft, index, &n->mem.term) != 0)
            n->mem.term = raft_term(n->raft);
        n->mem.phase = PH_COMMIT;
        n->mem.deadline_ms = tk_wall_ms() + n->o.timeout_ms;
        node__kick(n);
        return 0;
    }
    struct raft_catch_up cu = {0};
    switch (rc) {
    case TK_ENOTLEADER:
        return refuse(res, rc, "this node is not the leader");
    case RAFT_ECHANGE_PENDING:
        return refuse(res, rc,
                      "a configuration change is still uncommitted, or the leader has "
                      "not committed an entry of its term yet; retry");
    case RAFT_ENOT_CAUGHT_UP:
        (void)raft_catch_up(n->raft, ch.id, &cu);
        res->behind = cu.behind;
        res->match = cu.match;
        return refuse(res, rc,
                      "node %" PRIu64 " is not caught up: %" PRIu64
                      " entries behind (match %" PRIu64 "); retry the promotion",
                      ch.id, cu.behind, cu.match);
    case TK_ENOSPC:
        return refuse(res, rc, "no room: at most %d voters and %d learners",
                      RAFT_VOTERS_MAX, RAFT_LEARNERS_MAX);
    default:
        return refuse(res, TK_EINVAL, "the change was refused: %s (%s)", tk_errname(rc),
                      tk_strerror(rc));
    }
}

/* PH_RECORD: the record's entry applied (go on with the change), was lost,
 * or time ran out. */
static void record_turn(struct node *n, uint64_t now)
{
    uint64_t t = 0;
    bool known = raft_term_at(n->raft, n->mem.rec_index, &t) == 0;
    if ((known && t != n->mem.rec_term) || raft_role(n->raft) != RAFT_LEADER) {
        finish(n, TK_ELOST,
               "leadership changed while the member record was written; retry");
        return;
    }
    if (kv_sm_applied_index(n->sm) < n->mem.rec_index) {
        if (now >= n->mem.deadline_ms)
            finish(n, TK_ETIMEDOUT, "the member record did not commit in time");
        return;
    }
    struct node_member_result res;
    memset(&res, 0, sizeof(res));
    uint8_t type =
        n->mem.c.op == NODE_MEMBER_ADD ? RAFT_CHANGE_ADD_LEARNER : RAFT_CHANGE_REMOVE;
    if (append_change(n, type, &res) != 0) {
        finish(n, res.status, "%s", res.msg);
        return;
    }
    if (type == RAFT_CHANGE_ADD_LEARNER)
        dial(n, n->mem.c.id);
}

/* A put of `key` = `val` as a state machine command (a new blob). */
static struct tk_blob *put_cmd(const char *key, size_t kl, const char *val, size_t vl)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key.data = (uint8_t *)key;
    put.key.len = kl;
    put.value.data = (uint8_t *)val;
    put.value.len = vl;
    cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
    cmd.put = &put;
    size_t len = kvpb__command__get_packed_size(&cmd);
    struct tk_blob *b = tk_blob_new(len);
    kvpb__command__pack(&cmd, b->data);
    return b;
}

/* inc's 32 hex digits as 16 bytes; false when it is not that ("": unknown). */
static bool unhex16(const char *inc, uint8_t *out)
{
    if (strlen(inc) != 32 || strspn(inc, "0123456789abcdef") != 32)
        return false;
    for (int i = 0; i < 16; i++) {
        unsigned v;
        if (sscanf(inc + 2 * i, "%2x", &v) != 1)
            return false;
        out[i] = (uint8_t)v;
    }
    return true;
}

/* The command writing the record of `id` (removed: the never-reuse
 * tombstone; inc: its incarnation in hex, "" when not known yet): a put of
 * NODE_MEMBER_REC_V1 then the packed kvpb.MemberRecord, as rec_decode reads it. */
static struct tk_blob *record_cmd(uint64_t id, const char *raft, const char *http,
                                  bool removed, const char *inc)
{
    Kvpb__MemberRecord m = KVPB__MEMBER_RECORD__INIT;
    uint8_t incarnation[16];
    m.raft = (char *)raft;
    m.http = (char *)http;
    m.removed = removed;
    if (unhex16(inc, incarnation)) {
        m.incarnation.data = incarnation;
        m.incarnation.len = sizeof(incarnation);
    }
    char key[64];
    uint8_t val[NODE_MEMBER_REC_MAX];
    size_t kl = member_key(id, key, sizeof(key));
    size_t vl = 1 + kvpb__member_record__get_packed_size(&m);
    TK_ASSERT(vl <= sizeof(val)); /* two addresses under NODE_ADDR_MAX, 16 bytes */
    val[0] = NODE_MEMBER_REC_V1;
    kvpb__member_record__pack(&m, val + 1);
    return put_cmd(key, kl, (const char *)val, vl);
}

/* Proposes the record of `id` (record_cmd). */
static int propose_record(struct node *n, uint64_t id, const char *raft, const char *http,
                          bool removed, const char *inc, uint64_t *index, uint64_t *term)
{
    struct tk_blob *b = record_cmd(id, raft, http, removed, inc);
    /* Proposed here, not through node_submit's queue: a change waits for
     * this index to apply (record_turn). */
    struct raft_entry e = {.type = RAFT_ENTRY_NORMAL, .time_ms = tk_wall_ms(), .data = b};
    int rc = raft_propose(n->raft, &e, 1, index, term);
    tk_blob_unref(b); /* the log holds its own reference */
    if (rc == 0)
        node__kick(n);
    return rc;
}

/* The change's record (keeping the incarnation already known). */
static int write_record(struct node *n, const char *raft, const char *http, bool removed)
{
    struct node_member_rec r;
    rec_read(n, n->mem.c.id, &r);
    int rc = propose_record(n, n->mem.c.id, raft, http, removed, r.inc, &n->mem.rec_index,
                            &n->mem.rec_term);
    if (rc == 0)
        n->mem.phase = PH_RECORD;
    return rc;
}

/* ---- incarnations --------------------------------------------------------- */

static bool binding(const struct node *n, uint64_t id)
{
    for (uint32_t i = 0; i < n->mem.n_binding; i++)
        if (n->mem.binding[i] == id)
            return true;
    return false;
}

/* Leader: records `inc` as member id's incarnation (first contact). */
static void bind_incarnation(struct node *n, uint64_t id, const struct node_member_rec *r,
                             const char *inc)
{
    if (raft_role(n->raft) != RAFT_LEADER || binding(n, id) || r->removed || r->corrupt ||
        (n->mem.busy && n->mem.c.id == id) || n->mem.n_binding == NODE_PEERS_MAX ||
        !raft_config_is_member(raft_config(n->raft), id))
        return;
    char raft[NODE_ADDR_MAX], http[NODE_ADDR_MAX];
    snprintf(raft, sizeof(raft), "%s", r->raft);
    if (!r->found)
        boot_addr(n, id, raft, sizeof(raft));
    /* A bootstrap member's HTTP address comes from --members-http: with it
     * in the record, a member added later (which has no such flag) can name
     * this one as the leader (X-Tierkv-Leader-Addr). */
    snprintf(http, sizeof(http), "%s", r->http);
    if (http[0] == '\0')
        boot_http(n, id, http, sizeof(http));
    uint64_t index, term;
    if (propose_record(n, id, raft, http, false, inc, &index, &term) == 0)
        n->mem.binding[n->mem.n_binding++] = id;
}

/* A record the leader should (re)write: no incarnation yet, or no HTTP
 * address while --members-http gives one. */
static bool rec_wanting(const struct node *n, uint64_t id,
                        const struct node_member_rec *r)
{
    if (r->inc[0] == '\0')
        return true;
    char http[NODE_ADDR_MAX];
    boot_http(n, id, http, sizeof(http));
    return r->http[0] == '\0' && http[0] != '\0';
}

/* Remembers what peer `id` presented, to bind it once this node leads. */
static void remember(struct node *n, uint64_t id, const char *hex)
{
    uint32_t i = 0;
    while (i < n->mem.n_seen && n->mem.seen[i].id != id)
        i++;
    if (i == NODE_PEERS_MAX)
        return;
    if (i == n->mem.n_seen)
        n->mem.n_seen++;
    n->mem.seen[i].id = id;
    memcpy(n->mem.seen[i].hex, hex, 33);
}

/* Leader: binds what peers presented before it led. */
static void bind_seen(struct node *n)
{
    if (raft_role(n->raft) != RAFT_LEADER)
        return;
    char self[40];
    node__hex16(n->mem.incarnation, self);
    remember(n, n->o.id, self);
    for (uint32_t i = 0; i < n->mem.n_seen; i++) {
        struct node_member_rec r;
        rec_read(n, n->mem.seen[i].id, &r);
        if (rec_wanting(n, n->mem.seen[i].id, &r))
            bind_incarnation(n, n->mem.seen[i].id, &r,
                             r.inc[0] ? r.inc : n->mem.seen[i].hex);
    }
}

/* ---- the fence ------------------------------------------------------------ */

static bool fenced_at_boot(const struct node *n, uint64_t id);

struct tk_blob *node__member_epoch_cmd(uint64_t epoch)
{
    char val[32];
    int vl = snprintf(val, sizeof(val), "%" PRIu64, epoch);
    return put_cmd(NODE_EPOCH_KEY, strlen(NODE_EPOCH_KEY), val, (size_t)vl);
}

struct tk_blob *node__member_removed_cmd(struct node *n, uint64_t id)
{
    struct node_member_rec r;
    rec_read(n, id, &r);
    if (!r.found || r.corrupt) {
        boot_addr(n, id, r.raft, sizeof(r.raft));
        boot_http(n, id, r.http, sizeof(r.http));
    }
    return record_cmd(id, r.raft, r.http, true, r.inc);
}

/* The epoch an entry writes (a put of NODE_EPOCH_KEY), or false. */
static bool entry_epoch(const struct raft_entry *e, uint64_t *epoch)
{
    size_t kl = strlen(NODE_EPOCH_KEY);
    if (e->type != RAFT_ENTRY_NORMAL || e->data == NULL ||
        memmem(e->data->data, e->data->len, NODE_EPOCH_KEY, kl) == NULL)
        return false;
    Kvpb__Command *c = kvpb__command__unpack(NULL, e->data->len, e->data->data);
    if (c == NULL)
        return false;
    bool hit = c->cmd_case == KVPB__COMMAND__CMD_PUT && c->put != NULL &&
               c->put->key.len == kl &&
               memcmp(c->put->key.data, NODE_EPOCH_KEY, kl) == 0 &&
               c->put->value.len > 0 && c->put->value.len < 24;
    if (hit) {
        char v[24];
        memcpy(v, c->put->value.data, c->put->value.len);
        v[c->put->value.len] = '\0';
        *epoch = strtoull(v, NULL, 10);
    }
    kvpb__command__free_unpacked(c, NULL);
    return hit;
}

static void fence_add(struct node *n, uint64_t id)
{
    if (id != n->o.id && !fenced_at_boot(n, id) && n->mem.n_fenced < NODE_PEERS_MAX)
        n->mem.fenced[n->mem.n_fenced++] = id;
}

void node__member_boot_fence(struct node *n, const struct raft_boot *b)
{
    struct kv_item it;
    if (kv_sm_get(n->sm, NODE_EPOCH_KEY, strlen(NODE_EPOCH_KEY), &it) == 0 &&
        it.value_len > 0 && it.value_len < 24) {
        char v[24];
        memcpy(v, it.value, it.value_len);
        v[it.value_len] = '\0';
        n->mem.epoch = strtoull(v, NULL, 10);
    }
    struct raft_config prev = b->snapshot.config, cur;
    /* Only the entry after each configuration is looked into: an epoch
     * record is written nowhere else. */
    for (size_t i = 0; i < b->n_entries; i++) {
        const struct raft_entry *e = &b->entries[i];
        uint64_t epoch = 0;
        if (e->type != RAFT_ENTRY_CONFIG ||
            raft_config_decode(e->data ? e->data->data : NULL, e->data ? e->data->len : 0,
                               &cur) != 0)
            continue;
        if (i + 1 < b->n_entries && entry_epoch(&b->entries[i + 1], &epoch)) {
            if (epoch > n->mem.epoch)
                n->mem.epoch = epoch;
            for (uint32_t k = 0; k < prev.n_voters; k++)
                if (!raft_config_is_member(&cur, prev.voters[k]))
                    fence_add(n, prev.voters[k]);
            for (uint32_t k = 0; k < prev.n_learners; k++)
                if (!raft_config_is_member(&cur, prev.learners[k]))
                    fence_add(n, prev.learners[k]);
        }
        prev = cur;
    }
    if (n->mem.n_fenced > 0) {
        char ids[400];
        ids_text(n->mem.fenced, n->mem.n_fenced, ids, sizeof(ids));
        TK_LOG(TK_LOG_INFO, n->o.id, b->hard_state.term,
               "epoch %" PRIu64 ": ids [%s], dropped by --force-new-cluster, are refused "
               "as strangers",
               n->mem.epoch, ids);
    }
}

static bool fenced_at_boot(const struct node *n, uint64_t id)
{
    for (uint32_t i = 0; i < n->mem.n_fenced; i++)
        if (n->mem.fenced[i] == id)
            return true;
    return false;
}

bool node__member_fenced(struct node *n, uint64_t id)
{
    const struct raft_config *c = raft_config(n->raft);
    if (id == n->o.id || raft_config_is_member(c, id) ||
        !raft_config_is_member(c, n->o.id))
        return false; /* a member, or this node is joining (it knows none) */
    if (fenced_at_boot(n, id))
        return true;
    /* An uncommitted configuration may still give way to one that has `id`
     * again (a lost removal): only a committed one fences by removal. */
    if (raft_config_index(n->raft) > raft_commit(n->raft))
        return false;
    struct node_member_rec r;
    rec_read(n, id, &r);
    /* Ids are never reused: a removed one, or a bootstrap member that is no
     * longer in the configuration, never comes back; nor one whose record
     * cannot be read (refuse_fenced says why). */
    return r.removed || r.corrupt || raft_config_has(&n->o.members, id);
}

/* How many times id was refused, this one counted: its entry in
 * mem.fence_seen, or the least refused entry's place, begun anew. */
static uint64_t fence_count(struct node *n, uint64_t id)
{
    uint32_t least = 0;
    for (uint32_t i = 0; i < NODE_FENCE_SEEN; i++) {
        if (n->mem.fence_seen[i].id == id && n->mem.fence_seen[i].refused > 0)
            return ++n->mem.fence_seen[i].refused;
        if (n->mem.fence_seen[i].refused < n->mem.fence_seen[least].refused)
            least = i;
    }
    n->mem.fence_seen[least].id = id;
    n->mem.fence_seen[least].refused = 1;
    return 1;
}

/* Refuses a fenced id at the handshake, with a line now and then. */
static bool refuse_fenced(struct node *n, uint64_t id)
{
    if (!node__member_fenced(n, id))
        return false;
    n->m.metrics.members_refused++;
    uint64_t k = fence_count(n, id);
    /* Each stranger's 1st, 2nd, 4th, 8th... refusal: it redials every few
     * seconds, so its lines thin out (about ten in an hour), and two
     * strangers dialling in turn do not name each other every time. */
    if ((k & (k - 1)) == 0) {
        struct node_member_rec r;
        rec_read(n, id, &r);
        char why[160];
        snprintf(why, sizeof(why), "%s%s",
                 fenced_at_boot(n, id) ? "dropped by --force-new-cluster"
                 : r.corrupt           ? "its member record is corrupt: "
                                       : "removed from the configuration",
                 r.corrupt && !fenced_at_boot(n, id) ? r.why : "");
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "refused node %" PRIu64 ": it is not a member of this cluster (%s; "
               "epoch %" PRIu64 "): a stranger is never followed, voted for or "
               "forwarded to. Wipe its data directory and add it as a new member under "
               "a new id (refusal %" PRIu64 " of it; the next line at refusal %" PRIu64
               ")",
               id, why, n->mem.epoch, k, 2 * k);
    }
    return true;
}

bool node__member_incarnation(struct transport *t, uint64_t id, const uint8_t *inc,
                              void *data)
{
    struct node *n = data;
    (void)t;
    static const uint8_t zero[16];
    if (refuse_fenced(n, id))
        return false;
    if (memcmp(inc, zero, 16) == 0 || n->persist.failed)
        return true; /* a peer that does not say: nothing to check */
    char hex[40];
    node__hex16(inc, hex);
    struct node_member_rec r;
    rec_read(n, id, &r);
    if (r.found && r.inc[0] != '\0') {
        if (strcmp(r.inc, hex) == 0)
            return true;
        n->m.metrics.members_refused++;
        /* It redials: the line is rate-limited (node_oplog.h). */
        NODE_OPLOG(n, NODE_REFUSED, TK_LOG_WARN, raft_term(n->raft),
                   "id=%" PRIu64
                   " incarnation=%s known=%s why=\"lost its state: remove it "
                   "and add it as a new member\"",
                   id, hex, r.inc);
        return false;
    }
    remember(n, id, hex);
    bind_incarnation(n, id, &r, hex);
    return true;
}

bool node__member_known(struct transport *t, uint64_t id, void *data)
{
    struct node *n = data;
    (void)t;
    if (raft_config_is_member(raft_config(n->raft), id))
        return true;
    /* A fenced id (removed, or dropped by --force-new-cluster) is let past
     * the HELLO, as while it was a peer, so that its proof is checked and
     * node__member_incarnation refuses it with a REFUSE it can trust: it
     * learns that it is out and stops campaigning. The transport forgot it
     * (forget_removed); the refusal comes from the records. */
    if (node__member_fenced(n, id))
        return true;
    /* Joining and not in any configuration yet: the leader that adds this
     * node may itself be a member added after the --members it was given. */
    return n->o.join && !raft_config_is_member(raft_config(n->raft), n->o.id);
}

void node__member_refused(struct transport *t, uint64_t by, void *data)
{
    struct node *n = data;
    (void)t;
    if (n->mem.rejected)
        return;
    n->mem.rejected = true;
    TK_LOG(
        TK_LOG_ERROR, n->o.id, raft_term(n->raft),
        "node %" PRIu64 " refused this node: either the cluster knows node id %" PRIu64
        " with another data directory (this one is new or was wiped, so it may have "
        "forgotten votes and entries), or id %" PRIu64 " is no longer a member (removed, "
        "or dropped by --force-new-cluster on another node). This node serves nothing. "
        "If it is still a member, remove id %" PRIu64 " (tierkv member remove %" PRIu64
        "); then add this node again under a new id with an empty data directory and "
        "tierkvd --join (docs/operations.md, \"Replace a failed node\")",
        by, n->o.id, n->o.id, n->o.id, n->o.id);
    node__publish_status(n);
}

static int start_add(struct node *n, const struct raft_config *c,
                     struct node_member_result *res)
{
    const struct node_member_change *x = &n->mem.c;
    if (raft_config_is_member(c, x->id))
        return refuse(res, TK_ECOMPARE, "node %" PRIu64 " is already a member", x->id);
    struct node_member_rec r;
    rec_read(n, x->id, &r);
    if (r.corrupt)
        return refuse(res, TK_ECORRUPT,
                      "the member record of node id %" PRIu64 " is corrupt (%s); "
                      "add the node under a new id",
                      x->id, r.why);
    bool was_boot = raft_config_has(&n->o.members, x->id);
    if (r.removed || was_boot)
        return refuse(res, TK_ECOMPARE,
                      "node id %" PRIu64 " was a member of this cluster and was removed; "
                      "ids are never reused: add the node under a new id",
                      x->id);
    char host[NODE_ADDR_MAX];
    uint16_t port;
    if (member_addr_parse(x->raft, host, sizeof(host), &port) != 0)
        return refuse(res, TK_EINVAL, "the raft address \"%s\" is not host:port",
                      x->raft);
    if (strchr(x->raft, ' ') || strchr(x->http, ' '))
        return refuse(res, TK_EINVAL, "an address has a space");
    return write_record(n, x->raft, x->http, false);
}

static int start_remove(struct node *n, const struct raft_config *c,
                        struct node_member_result *res)
{
    uint64_t id = n->mem.c.id;
    if (!raft_config_is_member(c, id))
        return refuse(res, TK_ENOTFOUND, "node %" PRIu64 " is not a member", id);
    if (c->n_voters == 1 && raft_config_has(c, id))
        return refuse(res, TK_EINVAL, "node %" PRIu64 " is the last voter", id);
    struct node_member_rec r;
    rec_read(n, id, &r);
    if (!r.found || r.corrupt)
        boot_addr(n, id, r.raft, sizeof(r.raft));
    return write_record(n, r.raft, r.http, true);
}

int node_member_change(struct node *n, const struct node_member_change *c,
                       node_member_cb *cb, void *data, struct node_member_result *res)
{
    memset(res, 0, sizeof(*res));
    if (n->mem.busy)
        return refuse(res, TK_EBUSY,
                      "another membership change (node %" PRIu64 ") is in progress; "
                      "one at a time",
                      n->mem.c.id);
    if (raft_role(n->raft) != RAFT_LEADER)
        return refuse(res, TK_ENOTLEADER,
                      "this node is not the leader (the leader is %" PRIu64 ")",
                      raft_leader(n->raft));
    if (c->id == RAFT_NONE || cb == NULL)
        return refuse(res, TK_EINVAL, "a member id is a positive integer");
    const struct raft_config *cfg = raft_config(n->raft);
    n->mem.c = *c;
    n->mem.cb = cb;
    n->mem.data = data;
    n->mem.index = 0;
    n->mem.deadline_ms = tk_wall_ms() + n->o.timeout_ms;
    int rc;
    switch (c->op) {
    case NODE_MEMBER_ADD:
        rc = start_add(n, cfg, res);
        break;
    case NODE_MEMBER_REMOVE:
        rc = start_remove(n, cfg, res);
        break;
    case NODE_MEMBER_PROMOTE:
        if (!raft_config_is_member(cfg, c->id))
            rc = refuse(res, TK_ENOTFOUND, "node %" PRIu64 " is not a member", c->id);
        else
            rc = append_change(n, RAFT_CHANGE_PROMOTE, res);
        break;
    default:
        rc = refuse(res, TK_EINVAL, "unknown membership operation");
    }
    if (rc != 0 && res->status == 0)
        refuse(res, rc, "%s", tk_strerror(rc));
    n->mem.busy = rc == 0;
    if (rc != 0)
        n->mem.phase = PH_IDLE;
    return rc;
}

/* PH_COMMIT: the entry committed, was lost, or time ran out. */
static void commit_turn(struct node *n, uint64_t now)
{
    uint64_t index = n->mem.index, t = 0;
    bool known = index == 0 || raft_term_at(n->raft, index, &t) == 0;
    if (index != 0 && known && t != n->mem.term) {
        finish(n, TK_ELOST,
               "the change was lost: leadership changed before it committed; retry");
        return;
    }
    if (index <= raft_commit(n->raft) && known) {
        bool then_promote = n->mem.c.op == NODE_MEMBER_ADD && !n->mem.c.learner &&
                            raft_config_has_learner(raft_config(n->raft), n->mem.c.id);
        if (!then_promote) {
            finish(n, 0, "committed at index %" PRIu64, index);
            return;
        }
        n->mem.phase = PH_PROMOTE;
        n->mem.deadline_ms = now + MEMBER_PROMOTE_WAIT_MS;
        return;
    }
    if (now >= n->mem.deadline_ms)
        finish(n, TK_ETIMEDOUT, "the change at index %" PRIu64 " did not commit in time",
               index);
}

/* PH_PROMOTE: an add as a voter waits for the learner to catch up. */
static void promote_turn(struct node *n, uint64_t now)
{
    struct node_member_result res;
    memset(&res, 0, sizeof(res));
    int rc = append_change(n, RAFT_CHANGE_PROMOTE, &res);
    if (rc == 0)
        return; /* PH_COMMIT, then done: it is a voter */
    bool wait = rc == RAFT_ENOT_CAUGHT_UP || rc == RAFT_ECHANGE_PENDING;
    if (wait && now < n->mem.deadline_ms)
        return;
    finish(n, rc,
           "added as a learner but not promoted: %s; promote it with POST "
           "/v1/members/%" PRIu64 "/promote",
           res.msg, n->mem.c.id);
}

void node__member_tick(struct node *n)
{
    if (n->persist.failed)
        return;
    uint64_t ci = raft_config_index(n->raft);
    if (ci != n->mem.seen_config || ++n->mem.ticks >= 20) {
        n->mem.seen_config = ci;
        n->mem.ticks = 0;
        reconcile(n);
        bind_seen(n);
    }
    for (uint32_t i = 0; i < n->mem.n_binding; i++) {
        struct node_member_rec r;
        rec_read(n, n->mem.binding[i], &r);
        if (!rec_wanting(n, n->mem.binding[i], &r) || raft_role(n->raft) != RAFT_LEADER)
            n->mem.binding[i--] = n->mem.binding[--n->mem.n_binding];
    }
    if (!n->mem.busy)
        return;
    uint64_t now = tk_wall_ms();
    if (n->mem.phase == PH_RECORD)
        record_turn(n, now);
    else if (n->mem.phase == PH_COMMIT)
        commit_turn(n, now);
    else if (n->mem.phase == PH_PROMOTE)
        promote_turn(n, now);
}

void node__member_shutdown(struct node *n)
{
    if (n->mem.busy)
        finish(n, TK_ESHUTDOWN, "the node shut down during the change");
}
