/* etcd's Lease service, its unary calls: LeaseGrant, LeaseRevoke,
 * LeaseTimeToLive and LeaseLeases, on tierkv's replicated leases (kv/lease.c:
 * kvpb.LeaseGrant and LeaseRevoke commands; the leader expires them,
 * node/node_lease.c). TTLs are seconds on the wire, milliseconds inside.
 * LeaseKeepAlive is a stream and not served yet. Called through etcdapi.c's
 * method table; answers through etcdapi_reply.c. Loop thread only. */
#include <string.h>

#include "base/alloc.h"
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
        etcdserverpb__lease_grant_request__unpack(NULL, len, msg);
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
        etcdserverpb__lease_revoke_request__unpack(NULL, len, msg);
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
        etcdserverpb__lease_time_to_live_request__unpack(NULL, len, msg);
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
        etcdserverpb__lease_leases_request__unpack(NULL, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed LeaseLeasesRequest");
        return;
    }
    etcdserverpb__lease_leases_request__free_unpacked(rq, NULL);
    etcdapi__submit_read(ec, false, leases_read_cb);
}
