/* What etcdapi's methods share: a call's state, the ResponseHeader, packing
 * an answer, etcd's status codes and messages for tierkv's errors, and
 * submitting node requests. Called by etcdapi.c and etcdapi_kv.c; calls
 * grpc.c and the node. The API's loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

struct ecall *etcdapi__call_new(struct etcdapi *e, struct grpc_call *call)
{
    struct ecall *ec = tk_calloc(1, sizeof(*ec));
    ec->e = e;
    ec->call = call;
    return ec;
}

static void call_free(struct ecall *ec)
{
    tk_free(ec->key);
    tk_free(ec->end);
    tk_free(ec->op_kinds);
    tk_free(ec->txn_msg);
    tk_free(ec->txn_res);
    tk_free(ec);
}

void etcdapi__header(struct etcdapi *e, uint64_t revision,
                     Etcdserverpb__ResponseHeader *h)
{
    struct node_status st;
    node_status(e->node, &st);
    uint64_t applied = node_applied_index(e->node);
    h->cluster_id = node_cluster_id(e->node);
    h->member_id = st.id;
    h->revision = (int64_t)(revision > applied ? revision : applied);
    h->raft_term = st.term;
}

void etcdapi__header_write(struct etcdapi *e, uint64_t revision,
                           Etcdserverpb__ResponseHeader *h)
{
    etcdapi__header(e, revision, h);
    if (revision != 0)
        h->revision = (int64_t)revision;
}

static void fill_packed(uint8_t *out, size_t len, const void *arg)
{
    size_t n = protobuf_c_message_pack(arg, out);
    TK_ASSERT(n == len);
}

void etcdapi__reply(struct ecall *ec, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (grpc_call_would_overload(ec->call, len))
        grpc_call_fail(ec->call, GRPC_RESOURCE_EXHAUSTED,
                       "etcdserver: too many requests (output not taken by the client)");
    else
        grpc_call_reply(ec->call, len, fill_packed, msg);
    call_free(ec);
}

/* protobuf-c allocates a struct for each message, element and unknown field
 * it meets: 2 MiB of 2-byte fields would be a million allocations. Each
 * unpack gets UNPACK_ROOM(len) bytes at most and fails past them (the caller
 * answers INVALID_ARGUMENT), so a request costs at most a few times its own
 * size. Blocks come from malloc, so free_unpacked(msg, NULL) frees them. */
#define UNPACK_ROOM(len) (4 * (len) + 16384)

struct unpack_room {
    size_t left;
};

static void *unpack_alloc(void *data, size_t size)
{
    struct unpack_room *r = data;
    if (size > r->left)
        return NULL;
    r->left -= size;
    return malloc(size);
}

static void unpack_free(void *data, void *p)
{
    (void)data;
    free(p);
}

void *etcdapi__unpack(const ProtobufCMessageDescriptor *d, size_t len, const uint8_t *msg)
{
    struct unpack_room room = {UNPACK_ROOM(len)};
    ProtobufCAllocator a = {
        .alloc = unpack_alloc, .free = unpack_free, .allocator_data = &room};
    return protobuf_c_message_unpack(d, &a, len, msg);
}

void etcdapi__fail(struct ecall *ec, int code, const char *msg)
{
    grpc_call_fail(ec->call, code, "%s", msg);
    call_free(ec);
}

/* etcd's own codes and messages (api/v3rpc/rpctypes), which clients match. */
void etcdapi__fail_rc(struct ecall *ec, int rc)
{
    switch (rc) {
    case TK_ENOLEADER:
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: no leader");
        break;
    case TK_ENOTLEADER:
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: not leader");
        break;
    case TK_ELOST:
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: leader changed");
        break;
    case TK_ETIMEDOUT:
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: request timed out");
        break;
    case TK_ESHUTDOWN:
        etcdapi__fail(ec, GRPC_UNAVAILABLE, "etcdserver: server stopped");
        break;
    case TK_EBUSY:
        etcdapi__fail(ec, GRPC_RESOURCE_EXHAUSTED, "etcdserver: too many requests");
        break;
    case TK_ETOOBIG:
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "etcdserver: request is too large");
        break;
    case TK_ENOTFOUND:
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: requested lease not found");
        break;
    case TK_EINVAL:
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "etcdserver: invalid request");
        break;
    default:
        grpc_call_fail(ec->call, GRPC_INTERNAL, "tierkv: %s", tk_strerror(rc));
        call_free(ec);
        break;
    }
}

/* The call's deadline: the node's default, the configured one, or a shorter
 * grpc-timeout. */
static uint64_t call_timeout(const struct ecall *ec)
{
    uint64_t t = ec->e->cfg.request_timeout_ms;
    uint64_t g = grpc_call_timeout_ms(ec->call);
    if (g != 0 && (t == 0 || g < t))
        t = g;
    return t;
}

int etcdapi__node_submit(struct etcdapi *e, struct node_req *r, struct kv_result *res_out)
{
    r->on_client = e->own_loop;
    r->res_out = res_out;
    return node_submit(e->node, r);
}

void etcdapi__submit_write(struct ecall *ec, const Kvpb__Command *cmd, node_write_cb *cb)
{
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(cmd, blob->data);
    memset(&ec->nreq, 0, sizeof(ec->nreq));
    ec->nreq.mode = NODE_MODE_APPLIED;
    ec->nreq.cmd = blob;
    ec->nreq.write_cb = cb;
    ec->nreq.data = ec;
    ec->nreq.timeout_ms = call_timeout(ec);
    int rc = etcdapi__node_submit(ec->e, &ec->nreq, &ec->res);
    if (rc != 0) { /* refused: the command is still ours */
        tk_blob_unref(ec->nreq.cmd);
        ec->nreq.cmd = NULL;
        etcdapi__fail_rc(ec, rc);
    }
}

void etcdapi__submit_read(struct ecall *ec, bool serializable, node_read_cb *cb)
{
    memset(&ec->nreq, 0, sizeof(ec->nreq));
    ec->nreq.is_read = 1;
    ec->nreq.consistency = serializable ? NODE_READ_STALE : NODE_READ_LINEARIZABLE;
    ec->nreq.read_cb = cb;
    ec->nreq.data = ec;
    ec->nreq.timeout_ms = call_timeout(ec);
    int rc = etcdapi__node_submit(ec->e, &ec->nreq, NULL);
    if (rc != 0)
        etcdapi__fail_rc(ec, rc);
}
