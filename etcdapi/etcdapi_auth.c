/* Token authentication for etcd's API (etcdapi.h, struct etcdapi_auth):
 * Auth.Authenticate, and the check every other call passes before its
 * handler runs.
 *
 * The principals are the caller's (tierkvd: --auth-file's users, whose
 * tokens the file holds as SHA-256 hashes). Authenticate takes a user's
 * name and, as its password, the user's token; it answers with that token,
 * which etcd's clients then send as "token" metadata on every call. So a
 * client may also skip Authenticate and send its token directly.
 *
 * What each call needs: KV Range a read right on its range, Put and
 * DeleteRange a write right on the key or range, Txn a read right on every
 * compare's key and the right of every op (a nested Txn: admin); a Watch's
 * create request a read right on its range (refused watches are answered
 * created and canceled, as etcd's); the Lease calls and streams, Status and
 * MemberList any user; every other call (membership changes, Compact, Hash,
 * MoveLeader, Alarm, Defragment, Snapshot) admin. etcd's errors: no token
 * is InvalidArgument `etcdserver: user name is empty`, an unknown one
 * Unauthenticated `etcdserver: invalid auth token`, a missing right
 * PermissionDenied `etcdserver: permission denied`. Loop thread. */
#include <stdio.h>
#include <string.h>

#include "etcdapi/etcdapi_internal.h"

#define AUTH_PATH "/etcdserverpb.Auth/Authenticate"

static bool path_is(const char *path, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(path, lit, len) == 0;
}

/* The user the call's token names (a "Bearer " before it is skipped), or
 * NULL; *sent: whether the call sent one. */
static const void *token_user(const struct etcdapi_auth *a, struct grpc_call *call,
                              bool *sent)
{
    size_t len;
    const char *tok = grpc_call_token(call, &len);
    *sent = tok != NULL;
    if (tok == NULL)
        return NULL;
    if (len > 7 && strncmp(tok, "Bearer ", 7) == 0) {
        tok += 7;
        len -= 7;
    }
    return a->user(a->arg, (const uint8_t *)tok, len);
}

/* The user the call's token names, or NULL after failing the call (a
 * stream's with grpc_stream_finish: `stream`). */
static const void *call_user(struct etcdapi *e, struct grpc_call *call, bool stream)
{
    bool sent;
    const void *u = token_user(e->cfg.auth, call, &sent);
    if (u != NULL)
        return u;
    int code = sent ? GRPC_UNAUTHENTICATED : GRPC_INVALID_ARGUMENT;
    const char *why =
        sent ? "etcdserver: invalid auth token" : "etcdserver: user name is empty";
    if (stream)
        grpc_stream_finish(call, code, "%s", why);
    else
        grpc_call_fail(call, code, "%s", why);
    return NULL;
}

static bool may(const struct etcdapi_auth *a, const void *u, bool write,
                const ProtobufCBinaryData *key, const ProtobufCBinaryData *end)
{
    return a->may(a->arg, u, write, key->data, key->len, end ? end->data : NULL,
                  end ? end->len : 0);
}

static bool may_op(const struct etcdapi_auth *a, const void *u,
                   const Etcdserverpb__RequestOp *op)
{
    switch (op->request_case) {
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
        return may(a, u, false, &op->request_range->key, &op->request_range->range_end);
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
        return may(a, u, true, &op->request_put->key, NULL);
    case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
        return may(a, u, true, &op->request_delete_range->key,
                   &op->request_delete_range->range_end);
    default:
        return a->admin(a->arg, u);
    }
}

/* Txn: every compare's key read, every op's right. A Txn the wire check
 * refuses (nested, too many ops, malformed) goes to its handler, which
 * refuses it again with its own answer, only for an admin. */
static bool may_txn(const struct etcdapi_auth *a, const void *u, const uint8_t *msg,
                    size_t len)
{
    int code;
    if (etcdapi__txn_wire_check(msg, len, &code) != NULL)
        return a->admin(a->arg, u);
    Etcdserverpb__TxnRequest *rq =
        etcdapi__unpack(&etcdserverpb__txn_request__descriptor, len, msg);
    if (rq == NULL)
        return a->admin(a->arg, u);
    bool ok = true;
    for (size_t i = 0; ok && i < rq->n_compare; i++)
        ok = may(a, u, false, &rq->compare[i]->key, &rq->compare[i]->range_end);
    for (size_t i = 0; ok && i < rq->n_success; i++)
        ok = may_op(a, u, rq->success[i]);
    for (size_t i = 0; ok && i < rq->n_failure; i++)
        ok = may_op(a, u, rq->failure[i]);
    etcdserverpb__txn_request__free_unpacked(rq, NULL);
    return ok;
}

/* A KV call's right, from its message (a malformed one goes to its
 * handler, which answers it, only for an admin). */
static bool may_kv(const struct etcdapi_auth *a, const void *u, const char *path,
                   size_t plen, const uint8_t *msg, size_t len)
{
    bool ok = a->admin(a->arg, u);
    if (path_is(path, plen, "/etcdserverpb.KV/Range")) {
        Etcdserverpb__RangeRequest *rq =
            etcdapi__unpack(&etcdserverpb__range_request__descriptor, len, msg);
        if (rq != NULL) {
            ok = may(a, u, false, &rq->key, &rq->range_end);
            etcdserverpb__range_request__free_unpacked(rq, NULL);
        }
    } else if (path_is(path, plen, "/etcdserverpb.KV/Put")) {
        Etcdserverpb__PutRequest *rq =
            etcdapi__unpack(&etcdserverpb__put_request__descriptor, len, msg);
        if (rq != NULL) {
            ok = may(a, u, true, &rq->key, NULL);
            etcdserverpb__put_request__free_unpacked(rq, NULL);
        }
    } else if (path_is(path, plen, "/etcdserverpb.KV/DeleteRange")) {
        Etcdserverpb__DeleteRangeRequest *rq =
            etcdapi__unpack(&etcdserverpb__delete_range_request__descriptor, len, msg);
        if (rq != NULL) {
            ok = may(a, u, true, &rq->key, &rq->range_end);
            etcdserverpb__delete_range_request__free_unpacked(rq, NULL);
        }
    } else if (path_is(path, plen, "/etcdserverpb.KV/Txn")) {
        ok = may_txn(a, u, msg, len);
    }
    return ok; /* KV.Compact: admin */
}

bool etcdapi__auth_call(struct etcdapi *e, struct grpc_call *call, const char *path,
                        size_t plen, const uint8_t *msg, size_t len)
{
    const struct etcdapi_auth *a = e->cfg.auth;
    if (a == NULL || path_is(path, plen, AUTH_PATH))
        return true;
    const void *u = call_user(e, call, false);
    if (u == NULL)
        return false;
    static const char kv[] = "/etcdserverpb.KV/", lease[] = "/etcdserverpb.Lease/";
    bool ok;
    if (plen > sizeof(kv) - 1 && memcmp(path, kv, sizeof(kv) - 1) == 0)
        ok = may_kv(a, u, path, plen, msg, len);
    else
        ok = (plen > sizeof(lease) - 1 && memcmp(path, lease, sizeof(lease) - 1) == 0) ||
             path_is(path, plen, "/etcdserverpb.Maintenance/Status") ||
             path_is(path, plen, "/etcdserverpb.Cluster/MemberList") ||
             a->admin(a->arg, u);
    if (!ok)
        grpc_call_fail(call, GRPC_PERMISSION_DENIED, "etcdserver: permission denied");
    return ok;
}

bool etcdapi__auth_stream_open(struct etcdapi *e, struct grpc_call *call)
{
    const struct etcdapi_auth *a = e->cfg.auth;
    if (a == NULL)
        return true;
    const void *u = call_user(e, call, true);
    if (u == NULL)
        return false;
    size_t plen;
    const char *path = grpc_call_path(call, &plen);
    if (path_is(path, plen, "/etcdserverpb.Maintenance/Snapshot") &&
        !a->admin(a->arg, u)) {
        grpc_stream_finish(call, GRPC_PERMISSION_DENIED, "etcdserver: permission denied");
        return false;
    }
    return true; /* Watch: each create checked; LeaseKeepAlive: any user */
}

static void fill_msg(uint8_t *out, size_t len, const void *arg)
{
    (void)len;
    protobuf_c_message_pack(arg, out);
}

bool etcdapi__auth_stream_msg(struct etcdapi *e, struct grpc_call *call,
                              const uint8_t *msg, size_t len)
{
    const struct etcdapi_auth *a = e->cfg.auth;
    size_t plen;
    const char *path = grpc_call_path(call, &plen);
    if (a == NULL || !path_is(path, plen, "/etcdserverpb.Watch/Watch"))
        return true; /* LeaseKeepAlive: any user, checked at its open */
    bool sent;
    const void *u = token_user(a, call, &sent);
    Etcdserverpb__WatchRequest *rq =
        etcdapi__unpack(&etcdserverpb__watch_request__descriptor, len, msg);
    if (rq == NULL || rq->request_union_case !=
                          ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST) {
        if (rq != NULL)
            etcdserverpb__watch_request__free_unpacked(rq, NULL);
        return true; /* the watch stream answers those itself */
    }
    const Etcdserverpb__WatchCreateRequest *cr = rq->create_request;
    bool ok = u != NULL && may(a, u, false, &cr->key, &cr->range_end);
    if (!ok) { /* etcd's answer: created, canceled, the reason */
        Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
        etcdapi__header(e, 0, &h);
        Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
        r.header = &h;
        r.watch_id = -1;
        r.created = true;
        r.canceled = true;
        r.cancel_reason = (char *)"etcdserver: permission denied";
        (void)grpc_stream_send(call, protobuf_c_message_get_packed_size(&r.base),
                               fill_msg,
                               &r.base); /* no room: the client sees no answer */
    }
    etcdserverpb__watch_request__free_unpacked(rq, NULL);
    return ok;
}

void etcdapi__auth_authenticate(struct ecall *ec, const uint8_t *msg, size_t len)
{
    const struct etcdapi_auth *a = ec->e->cfg.auth;
    if (a == NULL) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION,
                      "etcdserver: authentication is not enabled");
        return;
    }
    Etcdserverpb__AuthenticateRequest *rq =
        etcdapi__unpack(&etcdserverpb__authenticate_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed AuthenticateRequest");
        return;
    }
    const void *u = a->user(a->arg, (const uint8_t *)rq->password, strlen(rq->password));
    if (u == NULL || strcmp(a->name(a->arg, u), rq->name) != 0) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "etcdserver: authentication failed, invalid user ID or password");
    } else {
        Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
        etcdapi__header(ec->e, 0, &h);
        Etcdserverpb__AuthenticateResponse r = ETCDSERVERPB__AUTHENTICATE_RESPONSE__INIT;
        r.header = &h;
        r.token = rq->password;
        etcdapi__reply(ec, &r.base);
    }
    etcdserverpb__authenticate_request__free_unpacked(rq, NULL);
}
