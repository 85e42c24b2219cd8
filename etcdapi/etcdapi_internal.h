/* What etcdapi's files share: the API object, one call's state, and the
 * helpers of etcdapi_reply.c. etcdapi.c holds the object, the hooks and the
 * method table; etcdapi_kv.c the KV methods; etcdapi_reply.c headers,
 * answers and error codes. The API's loop thread only (the client loop, or
 * the node's with on_node_loop). */
#ifndef TK_ETCDAPI_ETCDAPI_INTERNAL_H
#define TK_ETCDAPI_ETCDAPI_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <uv.h>

#include "etcd_rpc.pb-c.h"
#include "etcdapi/etcdapi.h"
#include "etcdapi/grpc.h"
#include "kv.pb-c.h"
#include "node/node.h"

struct node_options;

struct etcdapi {
    struct etcdapi_config cfg;
    struct node *node;
    struct uv_loop_s *loop;
    struct grpc_server *grpc;
    struct etcdapi_watch *watch; /* etcdapi_watch.c's (NULL before start) */
    bool stopping;
    bool own_loop; /* on the client loop (not cfg.on_node_loop) */
    int listen_rc;
    char listen_err[256];
    /* The hooks found in the node_options (the gateway's), chained. */
    node_hook_cb *prev_start, *prev_stop, *prev_applied;
    void *prev_data;
    uint32_t hashes; /* Hash/HashKV digests in progress (etcdapi_maint.c) */
    /* This node's client URL (scheme://advertise host:port) and its
     * announcement (etcdapi_cluster.c, etcdapi__announce, every second by
     * announce_timer until the record matches). */
    char client_url[NODE_ADDR_MAX + 16];
    uv_timer_t announce_timer;
    struct node_req announce_req;
    struct kv_result announce_res;
    bool announcing, announced;
    uint64_t announce_next_ms;
    /* Snapshot streams held (etcdapi_snapshot.c) */
    uint32_t snapshots;
};

/* Where each node announces its etcd client URL (etcdapi__announce). */
#define ETCD_CLIENT_KEY_PREFIX "\x01tierkv/client/"
void etcdapi__announce(struct etcdapi *e);

/* The version Status and Snapshot report: the etcd API level served
 * (clients compare it before using newer features; etcdctl 3.6 prints
 * Snapshot's). */
#define ETCD_API_VERSION "3.6.0"

/* One call: the node request it waits on and what its answer needs. */
struct ecall {
    struct etcdapi *e;
    struct grpc_call *call;
    struct node_req nreq;
    struct kv_result res; /* a write's result on the client loop (nreq.res_out) */
    int64_t revision;     /* Range: the revision asked for (0: newest) */
    uint8_t *key, *end;   /* Range/DeleteRange bounds (owned) */
    size_t key_len, end_len;
    bool end_open; /* range_end "\0": no upper bound */
    int64_t limit;
    bool keys_only, count_only;
    int64_t min_mod, max_mod, min_create, max_create;
    uint64_t deleted; /* DeleteRange: keys deleted by earlier steps */
    uint32_t n_ops;   /* Txn: ops of each branch, and their kinds */
    uint32_t n_success;
    uint8_t *op_kinds; /* 'p' put, 'd' delete, 'r' range */
    /* Range: the best key by create or mod revision (a sort with limit 1) */
    int sort_top; /* 0 none, 'c' create, 'm' mod */
    bool sort_desc;
    /* Txn with Range ops: the request (its bytes, owned) and the write's
     * result, for the reads made once it applied */
    uint8_t *txn_msg;
    size_t txn_msg_len;
    struct kv_result *txn_res;
    /* Put and DeleteRange with prev_kv: the previous key-values, read from
     * the change log at each write's revision (prev_rev, the last write's;
     * prev_more: a DeleteRange step left keys). etcdapi_kv.c owns `prevs`
     * and frees it before the call ends. Put with ignore_value or
     * ignore_lease: put_keep. */
    bool prev_kv, prev_more, put_keep;
    uint64_t prev_rev;
    struct etcdapi_prevs *prevs;
    /* Range: a sort done by collecting the range (etcdapi_kv.c): 0 none,
     * else the target, 'k' key, 'v' version, 'c' create, 'm' mod, 'V' value
     * (sort_desc: descending) */
    int sort_by;
};

typedef void etcdapi_method_fn(struct ecall *ec, const uint8_t *msg, size_t len);

/* etcdapi_kv.c */
etcdapi_method_fn etcdapi__kv_range, etcdapi__kv_put, etcdapi__kv_delete_range,
    etcdapi__kv_txn;

/* etcdapi_lease.c */
etcdapi_method_fn etcdapi__lease_grant, etcdapi__lease_revoke,
    etcdapi__lease_time_to_live, etcdapi__lease_leases;

/* etcdapi_cluster.c */
etcdapi_method_fn etcdapi__member_list, etcdapi__member_add, etcdapi__member_remove,
    etcdapi__member_update, etcdapi__member_promote;

/* etcdapi_maint.c */
etcdapi_method_fn etcdapi__status, etcdapi__hash, etcdapi__hash_kv, etcdapi__move_leader,
    etcdapi__alarm, etcdapi__defragment, etcdapi__kv_compact;

/* A stream's state starts with its ops (etcdapi.c's stream hooks call
 * them): a request message, and the client's end (grpc.h). */
struct estream_ops {
    void (*msg)(struct grpc_call *call, const uint8_t *msg, size_t len);
    void (*end)(struct grpc_call *call, bool gone);
};
typedef void etcdapi_stream_open_fn(struct etcdapi *e, struct grpc_call *call);

/* etcdapi_watch.c: Watch.Watch, fed by the node's applied hook. */
etcdapi_stream_open_fn etcdapi__watch_open;
void etcdapi__watch_start(struct etcdapi *e);
void etcdapi__watch_applied(struct etcdapi *e);
void etcdapi__watch_stop(struct etcdapi *e);

/* etcdapi_kv.c: a TxnRequest's bytes checked before it is unpacked: NULL,
 * or why it is refused (a nested Txn, too many compares or ops, malformed)
 * with its gRPC code in *code. */
const char *etcdapi__txn_wire_check(const uint8_t *msg, size_t len, int *code);

/* etcdapi_auth.c: token authentication (etcdapi.h, etcdapi_auth). Each
 * returns whether the call or message may go on; when not, the call was
 * answered (a unary one failed, a stream finished, a refused watch created
 * and canceled). Always true without cfg.auth. */
bool etcdapi__auth_call(struct etcdapi *e, struct grpc_call *call, const char *path,
                        size_t plen, const uint8_t *msg, size_t len);
bool etcdapi__auth_stream_open(struct etcdapi *e, struct grpc_call *call);
bool etcdapi__auth_stream_msg(struct etcdapi *e, struct grpc_call *call,
                              const uint8_t *msg, size_t len);
etcdapi_method_fn etcdapi__auth_authenticate;

/* etcdapi_lease.c: Lease.LeaseKeepAlive. */
etcdapi_stream_open_fn etcdapi__lease_keep_alive;

/* etcdapi_snapshot.c: Maintenance.Snapshot (a server stream of the node's
 * backup file). */
etcdapi_stream_open_fn etcdapi__snapshot_open;

/* etcdapi_reply.c */
struct ecall *etcdapi__call_new(struct etcdapi *e, struct grpc_call *call);
/* The header every answer carries; `revision` 0: the applied index. */
void etcdapi__header(struct etcdapi *e, uint64_t revision,
                     Etcdserverpb__ResponseHeader *h);
/* A write's header: the revision is its entry's index (`revision`; 0: as
 * etcdapi__header), as etcd answers with its write's revision, not the
 * applied index by then (a forwarded write's node, or a read a Txn's Range
 * ops waited for, may have applied later entries): clientv3's Mutex.Lock and
 * Election.Campaign take a Txn's for their key's create revision and wait on
 * their own key when it is higher (tests/etcd/mutex_test.py). */
void etcdapi__header_write(struct etcdapi *e, uint64_t revision,
                           Etcdserverpb__ResponseHeader *h);
/* Packs `msg` as the call's answer, then frees the call. */
void etcdapi__reply(struct ecall *ec, const ProtobufCMessage *msg);
/* Fails the call with etcd's code and message for a TK_E* code. */
void etcdapi__fail_rc(struct ecall *ec, int rc);
/* A request's message unpacked with a bounded room (a few times its size):
 * the message, or NULL (malformed, or past the room). Free it with its
 * type's free_unpacked(m, NULL). */
void *etcdapi__unpack(const ProtobufCMessageDescriptor *d, size_t len,
                      const uint8_t *msg);
void etcdapi__fail(struct ecall *ec, int code, const char *msg);
/* node_submit, its callback on the API's loop (on the client loop: a
 * write's result in *res_out). */
int etcdapi__node_submit(struct etcdapi *e, struct node_req *r,
                         struct kv_result *res_out);
/* fn(arg) on the API's loop, from a callback the node runs on its own (a
 * member change's, a backup's). */
static inline void etcdapi__bounce(struct etcdapi *e, node_call_fn *fn, void *arg)
{
    if (e->own_loop)
        node_client_call(e->node, fn, arg);
    else
        fn(arg);
}
/* The node's state (node_kv, node_members, node_member_change,
 * node_backup_start) outside a read's callback: on the client loop under
 * the node's state lock (false, not held, once the node stops), at once on
 * the node's loop. Hold it for bounded work: the consensus loop waits.
 * `changed`: a member change or backup was started. */
static inline bool etcdapi__state_enter(struct etcdapi *e)
{
    return !e->own_loop || node_client_lock(e->node);
}
static inline void etcdapi__state_leave(struct etcdapi *e, bool changed)
{
    if (e->own_loop)
        node_client_unlock(e->node, changed);
}
/* Submits a write (the node takes `cmd`); its callback gets ec. */
void etcdapi__submit_write(struct ecall *ec, const Kvpb__Command *cmd, node_write_cb *cb);
void etcdapi__submit_read(struct ecall *ec, bool serializable, node_read_cb *cb);

#endif
