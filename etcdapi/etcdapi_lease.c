/* etcd's Lease service, its unary calls: LeaseGrant, LeaseRevoke,
 * LeaseTimeToLive and LeaseLeases, on tierkv's replicated leases (kv/lease.c:
 * kvpb.LeaseGrant and LeaseRevoke commands; the leader expires them,
 * node/node_lease.c). TTLs are seconds on the wire, milliseconds inside.
 * LeaseKeepAlive is a stream (grpc.h, streams), at the end of this file.
 * Called through etcdapi.c's method and stream tables; answers through
 * etcdapi_reply.c. Loop thread only. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/clock.h"
#include "base/err.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

/* LeaseTimeToLive lists an attached key while the keys listed stay under
 * this many bytes (a lease holds up to KV_LEASE_KEYS_MAX keys of up to
 * key_max bytes: more than one message). */
#define TTL_KEYS_BYTES_MAX (1u << 20)

static void lease_failed(struct ecall *ec, int rc)
{
    if (rc == TK_ENOTFOUND)
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: requested lease not found");
    else if (rc == TK_ECOMPARE)
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, "etcdserver: lease already exists");
    else
        etcdapi__fail_rc(ec, rc);
}

static void grant_done(struct node_req *nreq, int status, const struct kv_result *res,
                       void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status == 0 && res->code != 0)
        status = res->code;
    if (status != 0) {
        lease_failed(ec, status);
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, res->revision, &h);
    Etcdserverpb__LeaseGrantResponse r = ETCDSERVERPB__LEASE_GRANT_RESPONSE__INIT;
    r.header = &h;
    r.id = res->value;
    r.ttl = ec->limit; /* the TTL asked for, in seconds */
    etcdapi__reply(ec, &r.base);
}

void etcdapi__lease_grant(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__LeaseGrantRequest *rq =
        etcdapi__unpack(&etcdserverpb__lease_grant_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed LeaseGrantRequest");
        return;
    }
    int64_t ttl = rq->ttl, id = rq->id;
    etcdserverpb__lease_grant_request__free_unpacked(rq, NULL);
    if (ttl <= 0)
        ttl = 1; /* etcd raises a TTL under its minimum to the minimum */
    if (id < 0) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a negative lease ID");
        return;
    }
    if ((uint64_t)ttl > KV_LEASE_TTL_MAX / 1000) {
        etcdapi__fail(ec, GRPC_OUT_OF_RANGE, "etcdserver: too large lease TTL");
        return;
    }
    ec->limit = ttl;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    g.ttl_ms = (uint64_t)ttl * 1000;
    g.id = (uint64_t)id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    cmd.lease_grant = &g;
    etcdapi__submit_write(ec, &cmd, grant_done);
}

static void revoke_done(struct node_req *nreq, int status, const struct kv_result *res,
                        void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status == 0 && res->code != 0)
        status = res->code;
    if (status != 0) {
        lease_failed(ec, status);
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, res->revision, &h);
    Etcdserverpb__LeaseRevokeResponse r = ETCDSERVERPB__LEASE_REVOKE_RESPONSE__INIT;
    r.header = &h;
    etcdapi__reply(ec, &r.base);
}

void etcdapi__lease_revoke(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__LeaseRevokeRequest *rq =
        etcdapi__unpack(&etcdserverpb__lease_revoke_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed LeaseRevokeRequest");
        return;
    }
    int64_t id = rq->id;
    etcdserverpb__lease_revoke_request__free_unpacked(rq, NULL);
    if (id <= 0) {
        etcdapi__fail(ec, GRPC_NOT_FOUND, "etcdserver: requested lease not found");
        return;
    }
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseRevoke r = KVPB__LEASE_REVOKE__INIT;
    r.id = (uint64_t)id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    cmd.lease_revoke = &r;
    etcdapi__submit_write(ec, &cmd, revoke_done);
}

struct ttl_keys {
    ProtobufCBinaryData *keys;
    size_t n, cap, bytes;
};

static void ttl_key(const uint8_t *key, size_t len, void *data)
{
    struct ttl_keys *k = data;
    if (k->n == k->cap || k->bytes + len > TTL_KEYS_BYTES_MAX)
        return;
    k->keys[k->n].data = tk_malloc(len + 1);
    memcpy(k->keys[k->n].data, key, len);
    k->keys[k->n].len = len;
    k->n++;
    k->bytes += len + 8;
}

static void ttl_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    struct ttl_keys k = {0};
    if (ec->keys_only) { /* the request's `keys` */
        k.cap = KV_LEASE_KEYS_MAX;
        k.keys = tk_calloc(k.cap, sizeof(*k.keys));
    }
    struct kv_lease_info li;
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__LeaseTimeToLiveResponse r =
        ETCDSERVERPB__LEASE_TIME_TO_LIVE_RESPONSE__INIT;
    r.header = &h;
    r.id = ec->revision; /* the lease id asked about */
    if (kv_sm_lease_get(sm, (uint64_t)ec->revision, tk_wall_ms(), &li,
                        ec->keys_only ? ttl_key : NULL, &k) != 0) {
        r.ttl = -1; /* etcd's answer for a lease that is gone, not an error */
    } else {
        r.ttl = (int64_t)((li.remaining_ms + 999) / 1000);
        r.grantedttl = (int64_t)(li.ttl_ms / 1000);
        r.keys = k.keys;
        r.n_keys = k.n;
    }
    etcdapi__reply(ec, &r.base);
    for (size_t i = 0; i < k.n; i++)
        tk_free(k.keys[i].data);
    tk_free(k.keys);
}

void etcdapi__lease_time_to_live(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__LeaseTimeToLiveRequest *rq =
        etcdapi__unpack(&etcdserverpb__lease_time_to_live_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed LeaseTimeToLiveRequest");
        return;
    }
    ec->revision = rq->id;
    ec->keys_only = rq->keys;
    etcdserverpb__lease_time_to_live_request__free_unpacked(rq, NULL);
    etcdapi__submit_read(ec, false, ttl_read_cb);
}

static void leases_read_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    uint64_t *ids = tk_malloc(KV_LEASES_MAX * sizeof(*ids));
    uint64_t *rem = tk_malloc(KV_LEASES_MAX * sizeof(*rem));
    size_t n = kv_sm_lease_list(sm, 0, tk_wall_ms(), ids, rem, KV_LEASES_MAX);
    Etcdserverpb__LeaseStatus *ls = tk_calloc(n ? n : 1, sizeof(*ls));
    Etcdserverpb__LeaseStatus **lp = tk_calloc(n ? n : 1, sizeof(*lp));
    for (size_t i = 0; i < n; i++) {
        etcdserverpb__lease_status__init(&ls[i]);
        ls[i].id = (int64_t)ids[i];
        lp[i] = &ls[i];
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__LeaseLeasesResponse r = ETCDSERVERPB__LEASE_LEASES_RESPONSE__INIT;
    r.header = &h;
    r.leases = lp;
    r.n_leases = n;
    etcdapi__reply(ec, &r.base);
    tk_free(lp);
    tk_free(ls);
    tk_free(rem);
    tk_free(ids);
}

void etcdapi__lease_leases(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__LeaseLeasesRequest *rq =
        etcdapi__unpack(&etcdserverpb__lease_leases_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed LeaseLeasesRequest");
        return;
    }
    etcdserverpb__lease_leases_request__free_unpacked(rq, NULL);
    etcdapi__submit_read(ec, false, leases_read_cb);
}

/* ---- LeaseKeepAlive: a stream ------------------------------------------------- */

/* Each request refreshes its lease through the log (a kvpb.LeaseKeepalive
 * command, as POST /v1/leases/{id}/keepalive does) and is answered with the
 * lease's TTL in seconds, or TTL 0 for a lease that is gone (etcd's answer:
 * clients then report it expired). One refresh is at the node at a time;
 * the ids asked for meanwhile wait, each once, up to KA_PENDING_MAX (a
 * client holds a few leases per stream; more waiting is RESOURCE_EXHAUSTED).
 * The stream's state outlives its call while a refresh is at the node. */
#define KA_PENDING_MAX 64

struct kastream {
    const struct estream_ops *ops; /* first: etcdapi.c dispatches on it */
    struct etcdapi *e;
    struct grpc_call *call; /* NULL once finished */
    struct node_req nreq;
    struct kv_result res; /* on the client loop: nreq's result */
    bool inflight;
    int64_t cur;
    int64_t pending[KA_PENDING_MAX];
    uint32_t n_pending;
};

static void ka_fill(uint8_t *out, size_t len, const void *arg)
{
    size_t n = protobuf_c_message_pack(arg, out);
    TK_ASSERT(n == len);
}

static void ka_finish(struct kastream *ks, int code, const char *msg)
{
    if (ks->call == NULL)
        return;
    struct grpc_call *call = ks->call;
    ks->call = NULL;
    grpc_stream_finish(call, code, "%s", msg);
    if (!ks->inflight)
        tk_free(ks);
}

static void ka_next(struct kastream *ks);

static void ka_done(struct node_req *nreq, int status, const struct kv_result *res,
                    void *data)
{
    (void)nreq;
    struct kastream *ks = data;
    if (ks->call == NULL) { /* the stream ended meanwhile */
        tk_free(ks);
        return;
    }
    if (status == 0 && res->code != 0)
        status = res->code;
    if (status != 0 && status != TK_ENOTFOUND) {
        ks->inflight = false;
        /* no leader, a timeout, a stop: the client retries on a new stream */
        ka_finish(ks, GRPC_UNAVAILABLE,
                  status == TK_ENOLEADER   ? "etcdserver: no leader"
                  : status == TK_ESHUTDOWN ? "etcdserver: server stopped"
                                           : "etcdserver: request timed out");
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ks->e, status == 0 ? res->revision : 0, &h);
    Etcdserverpb__LeaseKeepAliveResponse r =
        ETCDSERVERPB__LEASE_KEEP_ALIVE_RESPONSE__INIT;
    r.header = &h;
    r.id = ks->cur;
    r.ttl = status == 0 ? (int64_t)(((uint64_t)res->value + 999) / 1000) : 0;
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    /* Still in flight while it sends: grpc.c's flush may end this stream
     * (a connection that fails), and ka_end then leaves ks to us. */
    int rc = grpc_stream_send(ks->call, len, ka_fill, &r.base);
    ks->inflight = false;
    if (ks->call == NULL) {
        tk_free(ks);
        return;
    }
    if (rc == TK_EBUSY) {
        ka_finish(ks, GRPC_RESOURCE_EXHAUSTED,
                  "tierkv: the client does not take its keep-alive answers");
        return;
    }
    ka_next(ks);
}

/* Submits the next waiting refresh, if any. */
static void ka_next(struct kastream *ks)
{
    if (ks->inflight || ks->n_pending == 0 || ks->call == NULL)
        return;
    ks->cur = ks->pending[0];
    memmove(ks->pending, ks->pending + 1, (ks->n_pending - 1) * sizeof(ks->pending[0]));
    ks->n_pending--;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseKeepalive k = KVPB__LEASE_KEEPALIVE__INIT;
    k.id = (uint64_t)ks->cur;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_KEEPALIVE;
    cmd.lease_keepalive = &k;
    size_t len = kvpb__command__get_packed_size(&cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(&cmd, blob->data);
    memset(&ks->nreq, 0, sizeof(ks->nreq));
    ks->nreq.mode = NODE_MODE_APPLIED;
    ks->nreq.cmd = blob;
    ks->nreq.write_cb = ka_done;
    ks->nreq.data = ks;
    ks->nreq.timeout_ms = ks->e->cfg.request_timeout_ms;
    ks->inflight = true;
    int rc = etcdapi__node_submit(ks->e, &ks->nreq, &ks->res);
    if (rc != 0) { /* refused: the command is still ours */
        ks->inflight = false;
        tk_blob_unref(ks->nreq.cmd);
        ks->nreq.cmd = NULL;
        ka_finish(ks, rc == TK_EBUSY ? GRPC_RESOURCE_EXHAUSTED : GRPC_UNAVAILABLE,
                  rc == TK_EBUSY ? "etcdserver: too many requests"
                                 : "etcdserver: no leader");
    }
}

static void ka_msg(struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct kastream *ks = grpc_call_user(call);
    Etcdserverpb__LeaseKeepAliveRequest *rq =
        etcdapi__unpack(&etcdserverpb__lease_keep_alive_request__descriptor, len, msg);
    if (rq == NULL) {
        ka_finish(ks, GRPC_INVALID_ARGUMENT, "tierkv: a malformed LeaseKeepAliveRequest");
        return;
    }
    int64_t id = rq->id;
    etcdserverpb__lease_keep_alive_request__free_unpacked(rq, NULL);
    if (id <= 0) {
        ka_finish(ks, GRPC_NOT_FOUND, "etcdserver: requested lease not found");
        return;
    }
    bool dup = ks->inflight && ks->cur == id;
    for (uint32_t i = 0; i < ks->n_pending && !dup; i++)
        dup = ks->pending[i] == id;
    if (!dup) {
        if (ks->n_pending == KA_PENDING_MAX) {
            ka_finish(ks, GRPC_RESOURCE_EXHAUSTED,
                      "tierkv: too many leases waiting for a keep-alive on this stream");
            return;
        }
        ks->pending[ks->n_pending++] = id;
    }
    ka_next(ks);
}

static void ka_end(struct grpc_call *call, bool gone)
{
    (void)gone;
    ka_finish(grpc_call_user(call), GRPC_OK, "");
}

static const struct estream_ops keepalive_ops = {.msg = ka_msg, .end = ka_end};

void etcdapi__lease_keep_alive(struct etcdapi *e, struct grpc_call *call)
{
    struct kastream *ks = tk_calloc(1, sizeof(*ks));
    ks->ops = &keepalive_ops;
    ks->e = e;
    ks->call = call;
    grpc_call_set_user(call, ks);
}
