/* The lease routes: POST /v1/leases {"ttl_ms"} grants, POST
 * /v1/leases/{id}/keepalive, DELETE /v1/leases/{id} revokes (deleting every
 * attached key at one revision), GET /v1/leases/{id} (the TTL, the remaining
 * TTL and the attached keys). Keys attach with PUT /v1/kv/{key}?lease=ID
 * (api_kv.c). Leases are replicated commands (kv/lease.c); the leader expires
 * them (node/node_lease.c). Loop thread only. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/clock.h"
#include "base/err.h"
#include "gateway/api_body.h"
#include "gateway/gateway_internal.h"
#include "kv.pb-c.h"

#define LEASE_KEYS_LISTED 1024 /* GET lists at most this many keys */

/* The lease id in the path: a decimal > 0; else 400. */
static int path_id(struct api_req *req, uint64_t *id)
{
    int64_t v;
    if (api__parse_i64((const char *)req->key, req->key_len, &v) != 0 || v <= 0) {
        api__bad(req, "a lease id is a positive decimal");
        return TK_EINVAL;
    }
    *id = (uint64_t)v;
    return 0;
}

static void on_lease_done(struct node_req *nreq, int status, const struct kv_result *res,
                          void *data)
{
    struct api_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0 || res->code != 0) {
        int rc = status != 0 ? status : res->code;
        if (rc == TK_ENOTFOUND)
            http_respond_error(req->http, 404, "lease_not_found", NULL,
                               "no such lease (expired, revoked or never granted)");
        else if (rc == TK_ECOMPARE)
            http_respond_error(req->http, 409, "lease_exists", NULL,
                               "a lease with this id exists");
        else
            api__respond_rc(req, rc);
        return;
    }
    struct jbuf b;
    jbuf_init(&b, 96);
    if (req->route == ROUTE_LEASE_REVOKE)
        jbuf_printf(&b, "{\"revision\":%" PRIu64 ",\"deleted\":%" PRIu64, res->revision,
                    res->deleted);
    else
        jbuf_printf(
            &b, "{\"id\":%" PRId64 ",\"ttl_ms\":%" PRIu64 ",\"revision\":%" PRIu64,
            req->route == ROUTE_LEASE_GRANT ? res->value : (int64_t)req->lease_id,
            req->route == ROUTE_LEASE_GRANT ? req->lease_ttl : (uint64_t)res->value,
            res->revision);
    if (res->duplicate)
        jbuf_adds(&b, ",\"replayed\":true");
    jbuf_adds(&b, "}");
    api__respond_json(req, &b, res->revision);
    jbuf_free(&b);
}

static void submit(struct api_req *req, Kvpb__Command *cmd)
{
    if (req->http->has_digest)
        api__auth_client_id(req, &cmd->client_id, &cmd->seq);
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(cmd, blob->data);
    api__submit_write(req, blob, NODE_MODE_APPLIED, on_lease_done);
}

void api__lease_grant(struct api_req *req, const struct query *q)
{
    bool has = false;
    uint64_t ttl = 0;
    if (api__query_u64(req, q, QI_TTL, &has, &ttl) != 0)
        return;
    if (req->http->body_len > 0) {
        struct bctx c = {.req = req};
        static const char *const names[] = {"ttl_ms", "id", NULL};
        json_t *j = api__body_parse(req, &c);
        bool hb, hi;
        int64_t v = 0, id = 0;
        if (j == NULL || api__body_check_members(&c, j, "the body", names) != 0 ||
            api__body_get_i64(&c, j, "ttl_ms", &hb, &v) != 0 ||
            api__body_get_i64(&c, j, "id", &hi, &id) != 0) {
            api__body_free(&c, j);
            api__body_respond(&c);
            return;
        }
        api__body_free(&c, j);
        if (hb) {
            has = true;
            ttl = v > 0 ? (uint64_t)v : 0;
        }
        req->lease_id = hi && id > 0 ? (uint64_t)id : 0;
    }
    if (!has || ttl == 0 || ttl > KV_LEASE_TTL_MAX) {
        api__bad(req, "ttl_ms (1 to %llu) is required",
                 (unsigned long long)KV_LEASE_TTL_MAX);
        return;
    }
    req->lease_ttl = ttl;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    g.ttl_ms = ttl;
    g.id = req->lease_id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    cmd.lease_grant = &g;
    submit(req, &cmd);
}

void api__lease_keepalive(struct api_req *req, const struct query *q)
{
    (void)q;
    uint64_t id;
    if (path_id(req, &id) != 0)
        return;
    req->lease_id = id;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseKeepalive k = KVPB__LEASE_KEEPALIVE__INIT;
    k.id = id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_KEEPALIVE;
    cmd.lease_keepalive = &k;
    submit(req, &cmd);
}

void api__lease_revoke(struct api_req *req, const struct query *q)
{
    (void)q;
    uint64_t id;
    if (path_id(req, &id) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseRevoke r = KVPB__LEASE_REVOKE__INIT;
    r.id = id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    cmd.lease_revoke = &r;
    submit(req, &cmd);
}

struct keys_out {
    struct jbuf *b;
    size_t n;
};

static void key_cb(const uint8_t *key, size_t len, void *data)
{
    struct keys_out *k = data;
    if (k->n == LEASE_KEYS_LISTED)
        return;
    jbuf_adds(k->b, k->n++ ? "," : "");
    jbuf_jstr(k->b, (const char *)key, len);
}

static void get_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct api_req *req = data;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    struct kv_lease_info li;
    struct jbuf b;
    jbuf_init(&b, 256);
    jbuf_adds(&b, "{\"keys\":[");
    struct keys_out k = {.b = &b};
    if (kv_sm_lease_get(sm, req->lease_id, tk_wall_ms(), &li, key_cb, &k) != 0) {
        jbuf_free(&b);
        http_respond_error(req->http, 404, "lease_not_found", NULL,
                           "no such lease (expired, revoked or never granted)");
        return;
    }
    jbuf_printf(&b,
                "],\"id\":%" PRIu64 ",\"ttl_ms\":%" PRIu64 ",\"remaining_ms\":%" PRIu64
                ",\"key_count\":%zu}",
                li.id, li.ttl_ms, li.remaining_ms, li.n_keys);
    api__respond_json(req, &b, 0);
    jbuf_free(&b);
}

void api__lease_get(struct api_req *req, const struct query *q)
{
    int cons;
    uint64_t id;
    if (path_id(req, &id) != 0 || api__parse_consistency(req, q, &cons) != 0)
        return;
    req->lease_id = id;
    api__submit_read(req, cons, NULL, get_cb);
}
