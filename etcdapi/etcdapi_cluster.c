/* etcd's Cluster service (docs/etcd-compat.md, "Members"): MemberList,
 * MemberAdd, MemberRemove, MemberPromote, MemberUpdate, on the node's
 * membership API (node.h's node_member_change), as the HTTP gateway's
 * /v1/members routes do.
 *
 * The mapping: an etcd member ID is tierkv's node id; its one peer URL is
 * "http://" + its Raft address (host:port). MemberAdd carries no id, so the
 * leader picks one: one above both its last log index and every member's
 * id. Every earlier add's record and configuration entry are in the log
 * below a later leader's last index, so a picked id is never one picked
 * before (ids, once removed, are never reused). A voter add is the node's:
 * a learner, promoted once caught up (within 30 s, else it stays a learner);
 * it is answered as soon as the learner is in the committed configuration
 * (reported isLearner), so etcd's order works: add, then start the node with
 * the answer's id. Changes run on the leader only: elsewhere Unavailable
 * `etcdserver: not leader` (etcd forwards). Called by etcdapi.c's method table; calls the
 * node. Loop thread only. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/err.h"
#include "etcd_cluster.pb-c.h"
#include "etcdapi/etcdapi_internal.h"

#define MEMBERS_CAP (RAFT_MEMBERS_MAX)
#define URL_MAX (NODE_ADDR_MAX + 16)

/* ---- the member list every answer carries --------------------------------- */

struct mlist {
    size_t n;
    Etcdserverpb__Member *ms;
    Etcdserverpb__Member **mp;
    char (*names)[24];
    char (*peers)[URL_MAX];
    char **peer_p;
    char (*clients)[URL_MAX];
    char **client_p;
};

/* Member id's client URL as its node announced it (etcdapi__announce), or
 * this node's own; false when unknown (a member whose node has not served
 * etcd's API yet). Under the state lock (etcdapi__state_enter). */
static bool client_url(struct etcdapi *e, uint64_t id, uint64_t self, char *out,
                       size_t cap)
{
    if (id == self) {
        snprintf(out, cap, "%s", e->client_url);
        return true;
    }
    char key[64];
    int kl = snprintf(key, sizeof(key), ETCD_CLIENT_KEY_PREFIX "%" PRIu64, id);
    struct kv_item it;
    if (kv_sm_get(node_kv(e->node), key, (size_t)kl, &it) != 0 || it.value_len == 0 ||
        it.value_len >= cap)
        return false;
    memcpy(out, it.value, it.value_len);
    out[it.value_len] = 0;
    return true;
}

/* Every member of the configuration in force, with the client URL each
 * node announced (none once the node stops). */
static void mlist_fill(struct etcdapi *e, struct mlist *l)
{
    struct node_member *mem = tk_calloc(MEMBERS_CAP, sizeof(*mem));
    uint64_t ci;
    bool committed;
    bool locked = etcdapi__state_enter(e);
    size_t n = locked ? node_members(e->node, mem, MEMBERS_CAP, &ci, &committed) : 0;
    if (n > MEMBERS_CAP)
        n = MEMBERS_CAP;
    size_t k = n ? n : 1;
    l->n = n;
    l->ms = tk_calloc(k, sizeof(*l->ms));
    l->mp = tk_calloc(k, sizeof(*l->mp));
    l->names = tk_calloc(k, sizeof(*l->names));
    l->peers = tk_calloc(k, sizeof(*l->peers));
    l->peer_p = tk_calloc(k, sizeof(*l->peer_p));
    l->clients = tk_calloc(k, sizeof(*l->clients));
    l->client_p = tk_calloc(k, sizeof(*l->client_p));
    struct node_status st;
    node_status(e->node, &st);
    for (size_t i = 0; i < n; i++) {
        Etcdserverpb__Member *m = &l->ms[i];
        etcdserverpb__member__init(m);
        m->id = mem[i].id;
        snprintf(l->names[i], sizeof(l->names[i]), "%" PRIu64, mem[i].id);
        m->name = l->names[i];
        if (mem[i].raft[0]) {
            snprintf(l->peers[i], sizeof(l->peers[i]), "http://%s", mem[i].raft);
            l->peer_p[i] = l->peers[i];
            m->peerurls = &l->peer_p[i];
            m->n_peerurls = 1;
        }
        if (client_url(e, mem[i].id, st.id, l->clients[i], sizeof(l->clients[i]))) {
            l->client_p[i] = l->clients[i];
            m->clienturls = &l->client_p[i];
            m->n_clienturls = 1;
        }
        m->islearner = !mem[i].voter;
        l->mp[i] = m;
    }
    if (locked)
        etcdapi__state_leave(e, false);
    tk_free(mem);
}

static void mlist_free(struct mlist *l)
{
    tk_free(l->client_p);
    tk_free(l->clients);
    tk_free(l->peer_p);
    tk_free(l->peers);
    tk_free(l->names);
    tk_free(l->mp);
    tk_free(l->ms);
}

void etcdapi__member_list(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberListRequest *rq =
        etcdapi__unpack(&etcdserverpb__member_list_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed MemberListRequest");
        return;
    }
    etcdserverpb__member_list_request__free_unpacked(rq, NULL);
    struct mlist l;
    mlist_fill(ec->e, &l);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__MemberListResponse r = ETCDSERVERPB__MEMBER_LIST_RESPONSE__INIT;
    r.header = &h;
    r.members = l.mp;
    r.n_members = l.n;
    etcdapi__reply(ec, &r.base);
    mlist_free(&l);
}

/* ---- looking members up -------------------------------------------------- */

/* Member `id` in this node's view: 1 a voter, 2 a learner, 0 not a member;
 * *voters counts the voters; *raft gets its Raft address when asked. */
static int member_kind(struct etcdapi *e, uint64_t id, size_t *voters, char *raft,
                       size_t cap)
{
    struct node_member *mem = tk_calloc(MEMBERS_CAP, sizeof(*mem));
    uint64_t ci;
    bool committed;
    size_t n = 0;
    if (etcdapi__state_enter(e)) {
        n = node_members(e->node, mem, MEMBERS_CAP, &ci, &committed);
        etcdapi__state_leave(e, false);
    }
    int kind = 0;
    *voters = 0;
    for (size_t i = 0; i < n && i < MEMBERS_CAP; i++) {
        *voters += mem[i].voter;
        if (mem[i].id == id) {
            kind = mem[i].voter ? 1 : 2;
            if (raft != NULL)
                snprintf(raft, cap, "%s", mem[i].raft);
        }
    }
    tk_free(mem);
    return kind;
}

/* Do host:port addresses a and b name the same listener (host case-blind)? */
static bool same_addr(const char *a, const char *b)
{
    const char *ca = strrchr(a, ':'), *cb = strrchr(b, ':');
    if (a[0] == '\0' || b[0] == '\0' || ca == NULL || cb == NULL)
        return false;
    size_t la = (size_t)(ca - a), lb = (size_t)(cb - b);
    return la == lb && strncasecmp(a, b, la) == 0 &&
           strtoul(ca + 1, NULL, 10) == strtoul(cb + 1, NULL, 10);
}

/* A peer URL "http://host:port" (or https://, a trailing "/" allowed) into
 * "host:port" (an IPv6 host in brackets). Returns false if it is not one. */
static bool peer_url_addr(const char *url, char *out, size_t cap)
{
    const char *p;
    if (strncasecmp(url, "http://", 7) == 0)
        p = url + 7;
    else if (strncasecmp(url, "https://", 8) == 0)
        p = url + 8;
    else
        return false;
    size_t len = strlen(p);
    if (len > 0 && p[len - 1] == '/')
        len--;
    if (len == 0 || len >= cap)
        return false;
    memcpy(out, p, len);
    out[len] = '\0';
    char *colon = strrchr(out, ':');
    if (colon == NULL || colon == out)
        return false;
    size_t hl = (size_t)(colon - out);
    bool v6 = out[0] == '[';
    if (v6 ? hl < 3 || out[hl - 1] != ']' : memchr(out, ':', hl) != NULL)
        return false;
    for (size_t i = v6; i < hl - v6; i++) {
        unsigned char ch = (unsigned char)out[i];
        if (!isalnum(ch) && ch != '.' && ch != '-' && !(v6 && ch == ':'))
            return false;
    }
    const char *port = colon + 1;
    size_t pl = strlen(port);
    unsigned long v = strtoul(port, NULL, 10);
    return pl >= 1 && pl <= 5 && strspn(port, "0123456789") == pl && v >= 1 && v <= 65535;
}

/* ---- a change and its answer ---------------------------------------------- */

/* One change. A voter add is answered once its learner is in the committed
 * configuration (a timer looks every MCHANGE_POLL_MS) while the node goes on
 * to promote it; the struct then lives until both the node's callback has
 * run and the timer has closed. */
struct mchange {
    struct etcdapi *e;
    struct ecall *ec; /* NULL once answered */
    int op;           /* enum node_member_op */
    bool learner;
    uint64_t id;
    char url[URL_MAX]; /* add: the peer URL as given */
    uv_timer_t timer;
    bool timing, closing, node_done;
};

#define MCHANGE_POLL_MS 10

static void change_fail(struct mchange *mc, const struct node_member_result *res)
{
    struct ecall *ec = mc->ec;
    char m[512];
    switch (res->status) {
    case TK_ENOTFOUND:
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: member not found");
        return;
    case TK_ERANGE:
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "etcdserver: can only promote a learner member which is in sync "
                      "with leader");
        return;
    case TK_ECOMPARE: /* a member now, or removed once (ids are never reused) */
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "etcdserver: member ID already exist");
        return;
    case TK_ENOSPC:
        if (mc->learner) {
            etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                          "etcdserver: too many learner members in cluster");
            return;
        }
        snprintf(m, sizeof(m), "tierkv: no room: %s", res->msg);
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, m);
        return;
    case TK_EBUSY:
        snprintf(m, sizeof(m),
                 "tierkv: another membership change is in progress (%s); retry once it "
                 "commits",
                 res->msg);
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, m);
        return;
    case TK_EINVAL:
        snprintf(m, sizeof(m), "tierkv: %s", res->msg);
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, m);
        return;
    default:
        etcdapi__fail_rc(ec, res->status);
        return;
    }
}

static void change_answer(struct mchange *mc)
{
    struct ecall *ec = mc->ec;
    struct mlist l;
    mlist_fill(ec->e, &l);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    switch (mc->op) {
    case NODE_MEMBER_ADD: {
        Etcdserverpb__Member m = ETCDSERVERPB__MEMBER__INIT;
        char *url = mc->url;
        m.id = mc->id;
        m.peerurls = &url;
        m.n_peerurls = 1;
        m.islearner = mc->learner;
        Etcdserverpb__MemberAddResponse r = ETCDSERVERPB__MEMBER_ADD_RESPONSE__INIT;
        r.header = &h;
        r.member = &m;
        r.members = l.mp;
        r.n_members = l.n;
        etcdapi__reply(ec, &r.base);
        break;
    }
    case NODE_MEMBER_REMOVE: {
        Etcdserverpb__MemberRemoveResponse r = ETCDSERVERPB__MEMBER_REMOVE_RESPONSE__INIT;
        r.header = &h;
        r.members = l.mp;
        r.n_members = l.n;
        etcdapi__reply(ec, &r.base);
        break;
    }
    case NODE_MEMBER_PROMOTE: {
        Etcdserverpb__MemberPromoteResponse r =
            ETCDSERVERPB__MEMBER_PROMOTE_RESPONSE__INIT;
        r.header = &h;
        r.members = l.mp;
        r.n_members = l.n;
        etcdapi__reply(ec, &r.base);
        break;
    }
    default: { /* MemberUpdate to the same address */
        Etcdserverpb__MemberUpdateResponse r = ETCDSERVERPB__MEMBER_UPDATE_RESPONSE__INIT;
        r.header = &h;
        r.members = l.mp;
        r.n_members = l.n;
        etcdapi__reply(ec, &r.base);
        break;
    }
    }
    mlist_free(&l);
}

static void mchange_closed(uv_handle_t *h)
{
    struct mchange *mc = h->data;
    mc->timing = false;
    if (mc->node_done)
        tk_free(mc);
}

static void mchange_stop_timer(struct mchange *mc)
{
    if (!mc->timing || mc->closing)
        return;
    mc->closing = true;
    uv_timer_stop(&mc->timer);
    uv_close((uv_handle_t *)&mc->timer, mchange_closed);
}

static void change_done(struct mchange *mc, const struct node_member_result *res)
{
    if (mc->ec != NULL && res->status == 0)
        change_answer(mc);
    else if (mc->ec != NULL)
        change_fail(mc, res);
    mc->ec = NULL;
    mc->node_done = true;
    if (mc->timing)
        mchange_stop_timer(mc); /* frees mc once closed */
    else
        tk_free(mc);
}

/* A voter add: answered as soon as the learner is in the committed
 * configuration (reported as a learner, which it then is). */
static void mchange_poll(uv_timer_t *t)
{
    struct mchange *mc = t->data;
    if (mc->ec == NULL || mc->ec->e->stopping)
        return; /* the node's callback answers (TK_ESHUTDOWN at stop) */
    struct node_member *mem = tk_calloc(MEMBERS_CAP, sizeof(*mem));
    uint64_t ci;
    bool committed = false, in = false;
    size_t n = 0;
    if (etcdapi__state_enter(mc->ec->e)) {
        n = node_members(mc->ec->e->node, mem, MEMBERS_CAP, &ci, &committed);
        etcdapi__state_leave(mc->ec->e, false);
    }
    for (size_t i = 0; i < n && i < MEMBERS_CAP; i++)
        in |= mem[i].id == mc->id;
    tk_free(mem);
    if (!in || !committed)
        return;
    mc->learner = true;
    change_answer(mc);
    mc->ec = NULL;
    mchange_stop_timer(mc);
}

struct change_bounce {
    struct mchange *mc;
    struct node_member_result res;
};

static void change_bounced(void *arg)
{
    struct change_bounce *b = arg;
    change_done(b->mc, &b->res);
    tk_free(b);
}

/* On the node's loop: the rest on the API's (etcdapi__bounce). */
static void on_change_done(const struct node_member_result *res, void *data)
{
    struct mchange *mc = data;
    struct etcdapi *e = mc->e;
    if (!e->own_loop) {
        change_done(mc, res);
        return;
    }
    struct change_bounce *b = tk_malloc(sizeof(*b));
    b->mc = mc;
    b->res = *res;
    etcdapi__bounce(e, change_bounced, b);
}

static void start_change(struct mchange *mc, const struct node_member_change *c)
{
    struct node_member_result res;
    memset(&res, 0, sizeof(res));
    struct etcdapi *e = mc->ec->e;
    int rc = TK_ESHUTDOWN;
    if (etcdapi__state_enter(e)) {
        rc = node_member_change(e->node, c, on_change_done, mc, &res);
        etcdapi__state_leave(e, rc == 0);
    } else {
        res.status = TK_ESHUTDOWN;
    }
    if (rc != 0) {
        change_done(mc, &res);
        return;
    }
    if (c->op == NODE_MEMBER_ADD && !c->learner) {
        uv_timer_init(e->loop, &mc->timer);
        mc->timer.data = mc;
        mc->timing = true;
        uv_timer_start(&mc->timer, mchange_poll, MCHANGE_POLL_MS, MCHANGE_POLL_MS);
    }
}

/* Changes run on the leader; a follower answers as etcd's do without one. */
static bool on_leader(struct ecall *ec)
{
    struct node_status st;
    node_status(ec->e->node, &st);
    if (st.leader != 0 && st.leader == st.id)
        return true;
    etcdapi__fail_rc(ec, st.leader == 0 ? TK_ENOLEADER : TK_ENOTLEADER);
    return false;
}

static struct mchange *mchange_new(struct ecall *ec, int op, uint64_t id)
{
    struct mchange *mc = tk_calloc(1, sizeof(*mc));
    mc->e = ec->e;
    mc->ec = ec;
    mc->op = op;
    mc->id = id;
    return mc;
}

/* ---- MemberAdd ------------------------------------------------------------ */

/* Refuses an add whose address a member has, or with no room; answers and
 * returns false. Sets *id to the id the add takes. */
static bool check_add(struct ecall *ec, const char *raft, bool learner, uint64_t *id)
{
    struct etcdapi *e = ec->e;
    struct node_member *mem = tk_calloc(MEMBERS_CAP, sizeof(*mem));
    uint64_t ci;
    bool committed, ok = true;
    size_t n = 0;
    if (etcdapi__state_enter(e)) {
        n = node_members(e->node, mem, MEMBERS_CAP, &ci, &committed);
        etcdapi__state_leave(e, false);
    }
    if (n > MEMBERS_CAP)
        n = MEMBERS_CAP;
    struct node_status st;
    node_status(e->node, &st);
    uint64_t top = st.last_index;
    size_t voters = 0, learners = 0;
    for (size_t i = 0; i < n; i++) {
        *(mem[i].voter ? &voters : &learners) += 1;
        if (mem[i].id > top)
            top = mem[i].id;
        if (ok && (same_addr(mem[i].raft, raft) || same_addr(mem[i].http, raft))) {
            etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                          "etcdserver: Peer URLs already exists");
            ok = false;
        }
    }
    tk_free(mem);
    if (!ok)
        return false;
    if (learners >= RAFT_LEARNERS_MAX) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "etcdserver: too many learner members in cluster");
        return false;
    }
    if (!learner && voters >= RAFT_VOTERS_MAX) {
        char m[160];
        snprintf(m, sizeof(m),
                 "tierkv: no room: a cluster has at most %d voters (RAFT_VOTERS_MAX)",
                 RAFT_VOTERS_MAX);
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, m);
        return false;
    }
    *id = top == UINT64_MAX ? 0 : top + 1;
    if (*id == 0) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, "tierkv: no member id is left");
        return false;
    }
    return true;
}

void etcdapi__member_add(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberAddRequest *rq =
        etcdapi__unpack(&etcdserverpb__member_add_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed MemberAddRequest");
        return;
    }
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_ADD;
    c.learner = rq->islearner;
    /* tierkv's members have one Raft address: exactly one peer URL */
    bool url_ok = rq->n_peerurls == 1 && strlen(rq->peerurls[0]) < URL_MAX &&
                  peer_url_addr(rq->peerurls[0], c.raft, sizeof(c.raft));
    if (!url_ok) {
        etcdserverpb__member_add_request__free_unpacked(rq, NULL);
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "etcdserver: given member URLs are invalid (tierkv: exactly one "
                      "peer URL, http://host:port, the new node's --listen-raft)");
        return;
    }
    struct mchange *mc = mchange_new(ec, NODE_MEMBER_ADD, 0);
    mc->learner = c.learner;
    snprintf(mc->url, sizeof(mc->url), "%s", rq->peerurls[0]);
    etcdserverpb__member_add_request__free_unpacked(rq, NULL);
    if (!on_leader(ec) || !check_add(ec, c.raft, c.learner, &c.id)) {
        tk_free(mc);
        return;
    }
    mc->id = c.id;
    start_change(mc, &c);
}

/* ---- MemberRemove, MemberPromote, MemberUpdate ---------------------------- */

void etcdapi__member_remove(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberRemoveRequest *rq =
        etcdapi__unpack(&etcdserverpb__member_remove_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed MemberRemoveRequest");
        return;
    }
    uint64_t id = rq->id;
    etcdserverpb__member_remove_request__free_unpacked(rq, NULL);
    size_t voters;
    if (member_kind(ec->e, id, &voters, NULL, 0) == 0) {
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: member not found");
        return;
    }
    if (!on_leader(ec))
        return;
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_REMOVE;
    c.id = id;
    start_change(mchange_new(ec, c.op, id), &c);
}

void etcdapi__member_promote(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberPromoteRequest *rq =
        etcdapi__unpack(&etcdserverpb__member_promote_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed MemberPromoteRequest");
        return;
    }
    uint64_t id = rq->id;
    etcdserverpb__member_promote_request__free_unpacked(rq, NULL);
    size_t voters;
    int kind = member_kind(ec->e, id, &voters, NULL, 0);
    if (kind == 0) {
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: member not found");
        return;
    }
    if (kind == 1) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "etcdserver: can only promote a learner member");
        return;
    }
    if (!on_leader(ec))
        return;
    if (voters >= RAFT_VOTERS_MAX) {
        char m[160];
        snprintf(m, sizeof(m),
                 "tierkv: no room: a cluster has at most %d voters (RAFT_VOTERS_MAX)",
                 RAFT_VOTERS_MAX);
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, m);
        return;
    }
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_PROMOTE;
    c.id = id;
    start_change(mchange_new(ec, c.op, id), &c);
}

/* A member's Raft address is fixed for its id (its record says where the
 * others dial it): an update to the address it has answers the members, any
 * other is refused. */
void etcdapi__member_update(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberUpdateRequest *rq =
        etcdapi__unpack(&etcdserverpb__member_update_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed MemberUpdateRequest");
        return;
    }
    char now[NODE_ADDR_MAX] = "", want[NODE_ADDR_MAX] = "";
    size_t voters;
    int kind = member_kind(ec->e, rq->id, &voters, now, sizeof(now));
    bool url_ok = rq->n_peerurls == 1 && strlen(rq->peerurls[0]) < URL_MAX &&
                  peer_url_addr(rq->peerurls[0], want, sizeof(want));
    uint64_t id = rq->id;
    etcdserverpb__member_update_request__free_unpacked(rq, NULL);
    if (kind == 0) {
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: member not found");
        return;
    }
    if (!url_ok) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "etcdserver: given member URLs are invalid (tierkv: exactly one "
                      "peer URL, http://host:port)");
        return;
    }
    if (!same_addr(now, want)) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "tierkv: a member's Raft address cannot change; remove the member "
                      "and add the node again (it gets a new id)");
        return;
    }
    struct mchange *mc = mchange_new(ec, 0, id);
    change_answer(mc);
    tk_free(mc);
}

/* ---- announcing this node's client URL -------------------------------------- */

static void announce_done(struct node_req *req, int rc, const struct kv_result *res,
                          void *data)
{
    (void)req;
    (void)res;
    struct etcdapi *e = data;
    e->announcing = false;
    if (rc == 0)
        e->announced = true;
}

/* Each node writes its own client URL under ETCD_CLIENT_KEY_PREFIX + id
 * (forwarded to the leader like any write) when the record differs from
 * it, so every member's MemberList names it (clientv3's endpoint sync
 * reads them). Once a second at most, one write at a time; a node whose
 * record already matches writes nothing. */
void etcdapi__announce(struct etcdapi *e)
{
    uint64_t now = uv_now(e->loop);
    if (e->announcing || e->announced || e->stopping || now < e->announce_next_ms)
        return;
    e->announce_next_ms = now + 1000;
    struct node_status st;
    node_status(e->node, &st);
    if (st.leader == 0 || st.failed)
        return;
    char have[URL_MAX];
    if (!etcdapi__state_enter(e))
        return;
    bool known = client_url(e, st.id, 0, have, sizeof(have));
    etcdapi__state_leave(e, false);
    if (known && strcmp(have, e->client_url) == 0) {
        e->announced = true;
        return;
    }
    char key[64];
    int kl = snprintf(key, sizeof(key), ETCD_CLIENT_KEY_PREFIX "%" PRIu64, st.id);
    Kvpb__Put p = KVPB__PUT__INIT;
    p.key.data = (uint8_t *)key;
    p.key.len = (size_t)kl;
    p.value.data = (uint8_t *)e->client_url;
    p.value.len = strlen(e->client_url);
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
    cmd.put = &p;
    struct tk_blob *blob = tk_blob_new(kvpb__command__get_packed_size(&cmd));
    kvpb__command__pack(&cmd, blob->data);
    memset(&e->announce_req, 0, sizeof(e->announce_req));
    e->announce_req.mode = NODE_MODE_APPLIED;
    e->announce_req.cmd = blob;
    e->announce_req.write_cb = announce_done;
    e->announce_req.data = e;
    e->announce_req.timeout_ms = 5000;
    if (etcdapi__node_submit(e, &e->announce_req, &e->announce_res) != 0)
        tk_blob_unref(blob); /* refused: the command is still ours; next second */
    else
        e->announcing = true;
}
