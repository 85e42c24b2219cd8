/* The etcd API object (etcdapi.h), its node hooks and its method table.
 *
 * Methods are one table, ETCD_METHODS: the gRPC path and the handler.
 * grpc.c asks accept() before reading a call's message (a path not in the
 * table is UNIMPLEMENTED at once, with etcd's own services named "not
 * served yet") and on_call() once it is complete; the handler decodes the
 * message and answers through etcdapi_reply.c. Maintenance.Status and
 * Cluster.MemberList are here; the KV methods are etcdapi_kv.c's, the
 * Lease ones etcdapi_lease.c's.
 * Loop thread, except etcdapi_new/hook/listen getters/free (the owner's). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

static etcdapi_method_fn handle_status, handle_member_list;

#define ETCD_METHODS(X)                                                                  \
    X("/etcdserverpb.KV/Range", etcdapi__kv_range)                                       \
    X("/etcdserverpb.KV/Put", etcdapi__kv_put)                                           \
    X("/etcdserverpb.KV/DeleteRange", etcdapi__kv_delete_range)                          \
    X("/etcdserverpb.KV/Txn", etcdapi__kv_txn)                                           \
    X("/etcdserverpb.Lease/LeaseGrant", etcdapi__lease_grant)                            \
    X("/etcdserverpb.Lease/LeaseRevoke", etcdapi__lease_revoke)                          \
    X("/etcdserverpb.Lease/LeaseTimeToLive", etcdapi__lease_time_to_live)                \
    X("/etcdserverpb.Lease/LeaseLeases", etcdapi__lease_leases)                          \
    X("/etcdserverpb.Maintenance/Status", handle_status)                                 \
    X("/etcdserverpb.Cluster/MemberList", handle_member_list)

struct method {
    const char *path;
    etcdapi_method_fn *fn;
};

static const struct method methods[] = {
#define X(path, fn) {path, fn},
    ETCD_METHODS(X)
#undef X
};
#define N_METHODS (sizeof(methods) / sizeof(methods[0]))

/* The version Status reports: the etcd API level served (clients compare
 * it before using newer features). */
#define ETCD_API_VERSION "3.6.0"

static const struct method *find_method(const char *path, size_t len)
{
    for (size_t i = 0; i < N_METHODS; i++)
        if (strlen(methods[i].path) == len && memcmp(methods[i].path, path, len) == 0)
            return &methods[i];
    return NULL;
}

static bool on_accept(const char *path, size_t len, char *msg, size_t cap, void *data)
{
    (void)data;
    if (find_method(path, len) != NULL)
        return true;
    static const char pkg[] = "/etcdserverpb.";
    if (len > sizeof(pkg) - 1 && memcmp(path, pkg, sizeof(pkg) - 1) == 0)
        snprintf(msg, cap, "tierkv: %.*s is not served yet (docs/etcd-compat.md)",
                 (int)len, path);
    return false;
}

static void on_call(struct grpc_call *call, const char *path, size_t path_len,
                    const uint8_t *msg, size_t msg_len, void *data)
{
    struct etcdapi *e = data;
    const struct method *m = find_method(path, path_len);
    struct ecall *ec = etcdapi__call_new(e, call);
    if (m == NULL || e->stopping) { /* accept() said yes; only a stop differs */
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: server stopped");
        return;
    }
    m->fn(ec, msg, msg_len);
}

/* ---- Maintenance.Status and Cluster.MemberList ------------------------------ */

static void handle_status(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__StatusRequest *rq =
        etcdserverpb__status_request__unpack(NULL, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed StatusRequest");
        return;
    }
    etcdserverpb__status_request__free_unpacked(rq, NULL);
    struct etcdapi *e = ec->e;
    struct node_status st;
    node_status(e->node, &st);
    struct kv_sm *sm = node_kv(e->node);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(e, 0, &h);
    Etcdserverpb__StatusResponse r = ETCDSERVERPB__STATUS_RESPONSE__INIT;
    r.header = &h;
    r.version = (char *)ETCD_API_VERSION;
    r.dbsize = (int64_t)kv_sm_cold_bytes(sm);
    r.dbsizeinuse = r.dbsize;
    r.leader = st.leader;
    r.raftindex = st.commit;
    r.raftterm = st.term;
    r.raftappliedindex = kv_sm_applied_index(sm);
    struct node_member mem[RAFT_VOTERS_MAX * 2];
    uint64_t ci;
    bool committed;
    size_t n = node_members(e->node, mem, sizeof(mem) / sizeof(mem[0]), &ci, &committed);
    for (size_t i = 0; i < n && i < sizeof(mem) / sizeof(mem[0]); i++)
        if (mem[i].id == st.id)
            r.islearner = !mem[i].voter;
    char *errs[1];
    if (st.failed || st.rejected || st.removed) {
        errs[0] = (char *)(st.failed     ? "tierkv: the node failed (storage or apply)"
                           : st.rejected ? "tierkv: the cluster refused this node"
                                         : "tierkv: this node was removed");
        r.errors = errs;
        r.n_errors = 1;
    }
    etcdapi__reply(ec, &r.base);
}

#define MEMBERS_CAP (RAFT_VOTERS_MAX * 2)

static void handle_member_list(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MemberListRequest *rq =
        etcdserverpb__member_list_request__unpack(NULL, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed MemberListRequest");
        return;
    }
    etcdserverpb__member_list_request__free_unpacked(rq, NULL);
    struct etcdapi *e = ec->e;
    struct node_member *mem = tk_calloc(MEMBERS_CAP, sizeof(*mem));
    uint64_t ci;
    bool committed;
    size_t n = node_members(e->node, mem, MEMBERS_CAP, &ci, &committed);
    if (n > MEMBERS_CAP)
        n = MEMBERS_CAP;
    Etcdserverpb__Member *ms = tk_calloc(n ? n : 1, sizeof(*ms));
    Etcdserverpb__Member **mp = tk_calloc(n ? n : 1, sizeof(*mp));
    char(*names)[24] = tk_calloc(n ? n : 1, sizeof(*names));
    char(*peers)[NODE_ADDR_MAX + 8] = tk_calloc(n ? n : 1, sizeof(*peers));
    char **peer_p = tk_calloc(n ? n : 1, sizeof(*peer_p));
    char self_url[160];
    char *self_p = self_url;
    snprintf(self_url, sizeof(self_url), "http://%s:%u", e->cfg.host,
             (unsigned)grpc_server_port(e->grpc));
    struct node_status st;
    node_status(e->node, &st);
    for (size_t i = 0; i < n; i++) {
        Etcdserverpb__Member *m = &ms[i];
        etcdserverpb__member__init(m);
        m->id = mem[i].id;
        snprintf(names[i], sizeof(names[i]), "%" PRIu64, mem[i].id);
        m->name = names[i];
        if (mem[i].raft[0]) {
            snprintf(peers[i], sizeof(peers[i]), "http://%s", mem[i].raft);
            peer_p[i] = peers[i];
            m->peerurls = &peer_p[i];
            m->n_peerurls = 1;
        }
        if (mem[i].id == st.id) { /* other members' client addresses: not known yet */
            m->clienturls = &self_p;
            m->n_clienturls = 1;
        }
        m->islearner = !mem[i].voter;
        mp[i] = m;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(e, 0, &h);
    Etcdserverpb__MemberListResponse r = ETCDSERVERPB__MEMBER_LIST_RESPONSE__INIT;
    r.header = &h;
    r.members = mp;
    r.n_members = n;
    etcdapi__reply(ec, &r.base);
    tk_free(peer_p);
    tk_free(peers);
    tk_free(names);
    tk_free(mp);
    tk_free(ms);
    tk_free(mem);
}

/* ---- lifecycle -------------------------------------------------------------- */

void etcdapi_config_default(struct etcdapi_config *c)
{
    memset(c, 0, sizeof(*c));
    c->host = "127.0.0.1";
    c->port = 2379;
    c->key_max = 4096;
    c->value_max = 1u << 20;
    c->conns_max = 1024;
    c->range_limit_max = 10000;
    c->count_max = 100000;
    c->delete_step = 1000;
}

int etcdapi_new(const struct etcdapi_config *c, struct etcdapi **out)
{
    if (c->host == NULL || c->key_max == 0 || c->key_max > 65535 || c->value_max == 0 ||
        c->value_max > (2u << 20) || c->conns_max == 0 || c->range_limit_max == 0 ||
        c->count_max < c->range_limit_max || c->delete_step == 0)
        return TK_EINVAL;
    struct etcdapi *e = tk_calloc(1, sizeof(*e));
    e->cfg = *c;
    e->cfg.host = tk_strdup(c->host);
    e->listen_rc = TK_EINVAL;
    snprintf(e->listen_err, sizeof(e->listen_err), "the node never started the etcd API");
    struct grpc_config gc;
    grpc_config_default(&gc);
    gc.conns_max = c->conns_max;
    static const struct grpc_callbacks cb = {.accept = on_accept, .on_call = on_call};
    e->grpc = grpc_server_new(&gc, &cb, e);
    *out = e;
    return 0;
}

static void on_loop_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct etcdapi *e = data;
    if (e->prev_start)
        e->prev_start(n, loop, e->prev_data);
    e->node = n;
    e->loop = loop;
    e->listen_rc = grpc_server_listen(e->grpc, loop, e->cfg.host, e->cfg.port,
                                      e->listen_err, sizeof(e->listen_err));
}

/* Calls still at the node complete with TK_ESHUTDOWN after this hook; their
 * answers are dropped (the connections are closed), and grpc.c frees them. */
static void on_loop_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct etcdapi *e = data;
    e->stopping = true;
    grpc_server_stop(e->grpc);
    if (e->prev_stop)
        e->prev_stop(n, loop, e->prev_data);
}

static void on_applied(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct etcdapi *e = data;
    if (e->prev_applied)
        e->prev_applied(n, loop, e->prev_data);
}

void etcdapi_hook(struct etcdapi *e, struct node_options *o)
{
    e->prev_start = o->on_loop_start;
    e->prev_stop = o->on_loop_stop;
    e->prev_applied = o->on_applied;
    e->prev_data = o->hook_data;
    o->on_loop_start = on_loop_start;
    o->on_loop_stop = on_loop_stop;
    o->on_applied = on_applied;
    o->hook_data = e;
}

int etcdapi_listen_status(const struct etcdapi *e)
{
    return e->listen_rc;
}

const char *etcdapi_listen_error(const struct etcdapi *e)
{
    return e->listen_err;
}

uint16_t etcdapi_port(const struct etcdapi *e)
{
    return grpc_server_port(e->grpc);
}

void etcdapi_free(struct etcdapi *e)
{
    if (e == NULL)
        return;
    grpc_server_free(e->grpc);
    tk_free((char *)(uintptr_t)e->cfg.host);
    tk_free(e);
}
