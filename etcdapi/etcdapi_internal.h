/* What etcdapi's files share: the API object, one call's state, and the
 * helpers of etcdapi_reply.c. etcdapi.c holds the object, the hooks and the
 * method table; etcdapi_kv.c the KV methods; etcdapi_reply.c headers,
 * answers and error codes. Loop thread only. */
#ifndef TK_ETCDAPI_ETCDAPI_INTERNAL_H
#define TK_ETCDAPI_ETCDAPI_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>

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
    int listen_rc;
    char listen_err[256];
    /* The hooks found in the node_options (the gateway's), chained. */
    node_hook_cb *prev_start, *prev_stop, *prev_applied;
    void *prev_data;
    uint32_t hashes; /* Hash/HashKV digests in progress (etcdapi_maint.c) */
    /* Snapshot streams held (etcdapi_snapshot.c) */
    uint32_t snapshots;
};

/* The version Status and Snapshot report: the etcd API level served
 * (clients compare it before using newer features; etcdctl 3.6 prints
 * Snapshot's). */
#define ETCD_API_VERSION "3.6.0"

/* One call: the node request it waits on and what its answer needs. */
struct ecall {
    struct etcdapi *e;
    struct grpc_call *call;
    struct node_req nreq;
    int64_t revision;   /* Range: the revision asked for (0: newest) */
    uint8_t *key, *end; /* Range/DeleteRange bounds (owned) */
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
/* Submits a write (the node takes `cmd`); its callback gets ec. */
void etcdapi__submit_write(struct ecall *ec, const Kvpb__Command *cmd, node_write_cb *cb);
void etcdapi__submit_read(struct ecall *ec, bool serializable, node_read_cb *cb);

#endif
