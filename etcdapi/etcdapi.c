/* The etcd API object (etcdapi.h), its node hooks and its method table.
 *
 * Methods are one table, ETCD_METHODS: the gRPC path and the handler.
 * grpc.c asks accept() before reading a call's message (a path not in the
 * table is UNIMPLEMENTED at once, with etcd's own services named "not
 * served yet") and on_call() once it is complete; the handler decodes the
 * message and answers through etcdapi_reply.c. The KV methods are
 * etcdapi_kv.c's (KV.Compact etcdapi_maint.c's), the Lease ones
 * etcdapi_lease.c's, Cluster's etcdapi_cluster.c's, Maintenance's
 * etcdapi_maint.c's.
 * The API's loop thread (the client loop's, or the node's with
 * on_node_loop), except etcdapi_new/hook/listen getters/free (the owner's). */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

#define ETCD_METHODS(X)                                                                  \
    X("/etcdserverpb.KV/Range", etcdapi__kv_range)                                       \
    X("/etcdserverpb.KV/Put", etcdapi__kv_put)                                           \
    X("/etcdserverpb.KV/DeleteRange", etcdapi__kv_delete_range)                          \
    X("/etcdserverpb.KV/Txn", etcdapi__kv_txn)                                           \
    X("/etcdserverpb.Lease/LeaseGrant", etcdapi__lease_grant)                            \
    X("/etcdserverpb.Lease/LeaseRevoke", etcdapi__lease_revoke)                          \
    X("/etcdserverpb.Lease/LeaseTimeToLive", etcdapi__lease_time_to_live)                \
    X("/etcdserverpb.Lease/LeaseLeases", etcdapi__lease_leases)                          \
    X("/etcdserverpb.KV/Compact", etcdapi__kv_compact)                                   \
    X("/etcdserverpb.Cluster/MemberList", etcdapi__member_list)                          \
    X("/etcdserverpb.Cluster/MemberAdd", etcdapi__member_add)                            \
    X("/etcdserverpb.Cluster/MemberRemove", etcdapi__member_remove)                      \
    X("/etcdserverpb.Cluster/MemberUpdate", etcdapi__member_update)                      \
    X("/etcdserverpb.Cluster/MemberPromote", etcdapi__member_promote)                    \
    X("/etcdserverpb.Maintenance/Status", etcdapi__status)                               \
    X("/etcdserverpb.Maintenance/Hash", etcdapi__hash)                                   \
    X("/etcdserverpb.Maintenance/HashKV", etcdapi__hash_kv)                              \
    X("/etcdserverpb.Maintenance/MoveLeader", etcdapi__move_leader)                      \
    X("/etcdserverpb.Maintenance/Alarm", etcdapi__alarm)                                 \
    X("/etcdserverpb.Maintenance/Defragment", etcdapi__defragment)                       \
    X("/etcdserverpb.Auth/Authenticate", etcdapi__auth_authenticate)

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

static const struct method *find_method(const char *path, size_t len)
{
    for (size_t i = 0; i < N_METHODS; i++)
        if (strlen(methods[i].path) == len && memcmp(methods[i].path, path, len) == 0)
            return &methods[i];
    return NULL;
}

/* The streams (grpc.h, streams): the path and what opens one; the
 * stream's state then carries its ops (struct estream_ops). A server
 * stream (Snapshot) is one whose client sends one message, then ends. */
#define ETCD_STREAMS(X)                                                                  \
    X("/etcdserverpb.Watch/Watch", etcdapi__watch_open)                                  \
    X("/etcdserverpb.Lease/LeaseKeepAlive", etcdapi__lease_keep_alive)                   \
    X("/etcdserverpb.Maintenance/Snapshot", etcdapi__snapshot_open)

struct stream_method {
    const char *path;
    etcdapi_stream_open_fn *open;
};

static const struct stream_method stream_methods[] = {
#define X(path, fn) {path, fn},
    ETCD_STREAMS(X)
#undef X
};
#define N_STREAM_METHODS (sizeof(stream_methods) / sizeof(stream_methods[0]))

static const struct stream_method *find_stream(const char *path, size_t len)
{
    for (size_t i = 0; i < N_STREAM_METHODS; i++)
        if (strlen(stream_methods[i].path) == len &&
            memcmp(stream_methods[i].path, path, len) == 0)
            return &stream_methods[i];
    return NULL;
}

static bool on_is_stream(const char *path, size_t len, void *data)
{
    (void)data;
    return find_stream(path, len) != NULL;
}

static void on_stream_open(struct grpc_call *call, const char *path, size_t len,
                           void *data)
{
    struct etcdapi *e = data;
    const struct stream_method *m = find_stream(path, len);
    if (m == NULL || e->stopping) {
        grpc_stream_finish(call, GRPC_UNAVAILABLE, "etcdserver: server stopped");
        return;
    }
    if (!etcdapi__auth_stream_open(e, call))
        return;
    m->open(e, call); /* sets the call's user to its state (ops first) */
}

static void on_stream_msg(struct grpc_call *call, const uint8_t *msg, size_t len,
                          void *data)
{
    if (!etcdapi__auth_stream_msg(data, call, msg, len))
        return;
    const struct estream_ops *const *ops = grpc_call_user(call);
    (*ops)->msg(call, msg, len);
}

static void on_stream_end(struct grpc_call *call, bool gone, void *data)
{
    (void)data;
    const struct estream_ops *const *ops = grpc_call_user(call);
    (*ops)->end(call, gone);
}

static bool on_accept(const char *path, size_t len, char *msg, size_t cap, void *data)
{
    (void)data;
    if (find_method(path, len) != NULL || find_stream(path, len) != NULL)
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
    if (m != NULL && !e->stopping &&
        !etcdapi__auth_call(e, call, path, path_len, msg, msg_len))
        return;
    struct ecall *ec = etcdapi__call_new(e, call);
    if (m == NULL || e->stopping) { /* accept() said yes; only a stop differs */
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: server stopped");
        return;
    }
    m->fn(ec, msg, msg_len);
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
    e->cfg.advertise_host = tk_strdup(c->advertise_host ? c->advertise_host : c->host);
    e->listen_rc = TK_EINVAL;
    snprintf(e->listen_err, sizeof(e->listen_err), "the node never started the etcd API");
    struct grpc_config gc;
    grpc_config_default(&gc);
    gc.conns_max = c->conns_max;
    gc.tls = c->tls;
    if (c->handshakes_max > 0)
        gc.handshakes_max = c->handshakes_max;
    if (c->handshakes_per_addr > 0)
        gc.handshakes_per_addr = c->handshakes_per_addr;
    static const struct grpc_callbacks cb = {.accept = on_accept,
                                             .on_call = on_call,
                                             .is_stream = on_is_stream,
                                             .on_stream_open = on_stream_open,
                                             .on_stream_msg = on_stream_msg,
                                             .on_stream_end = on_stream_end};
    e->grpc = grpc_server_new(&gc, &cb, e);
    *out = e;
    return 0;
}

static void on_announce(uv_timer_t *t)
{
    etcdapi__announce(t->data);
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
    etcdapi__watch_start(e);
    const char *h = e->cfg.advertise_host;
    bool v6 = strchr(h, ':') != NULL;
    snprintf(e->client_url, sizeof(e->client_url), "%s://%s%s%s:%u",
             e->cfg.tls != NULL ? "https" : "http", v6 ? "[" : "", h, v6 ? "]" : "",
             (unsigned)grpc_server_port(e->grpc));
    uv_timer_init(loop, &e->announce_timer);
    e->announce_timer.data = e;
    uv_timer_start(&e->announce_timer, on_announce, 1000, 1000);
}

/* On the node's loop, calls still at the node complete with TK_ESHUTDOWN
 * after this hook; their answers are dropped (the connections are closed),
 * and grpc.c frees them. On the client loop every call's node request has
 * ended by now. */
static void on_loop_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct etcdapi *e = data;
    e->stopping = true;
    uv_close((uv_handle_t *)&e->announce_timer, NULL);
    grpc_server_stop(e->grpc);
    etcdapi__watch_stop(e);
    if (e->prev_stop)
        e->prev_stop(n, loop, e->prev_data);
}

static void on_applied(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct etcdapi *e = data;
    if (e->prev_applied)
        e->prev_applied(n, loop, e->prev_data);
    etcdapi__watch_applied(e);
}

void etcdapi_hook(struct etcdapi *e, struct node_options *o)
{
    e->own_loop = !e->cfg.on_node_loop;
    /* The client loop's hooks, or the consensus loop's. */
    node_hook_cb **start = e->own_loop ? &o->on_client_start : &o->on_loop_start;
    node_hook_cb **stop = e->own_loop ? &o->on_client_stop : &o->on_loop_stop;
    node_hook_cb **applied = e->own_loop ? &o->on_client_applied : &o->on_applied;
    void **data = e->own_loop ? &o->client_hook_data : &o->hook_data;
    e->prev_start = *start;
    e->prev_stop = *stop;
    e->prev_applied = *applied;
    e->prev_data = *data;
    *start = on_loop_start;
    *stop = on_loop_stop;
    *applied = on_applied;
    *data = e;
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
    tk_free((char *)(uintptr_t)e->cfg.advertise_host);
    tk_free(e);
}
