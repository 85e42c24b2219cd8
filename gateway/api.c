/* The gateway (gateway.h) and its routing: the HTTP server's callbacks turn
 * each request into an api_req and send it to its route's handler.
 *
 * Routes are one table, GW_ROUTES in gateway_internal.h: method, path
 * pattern, handler, query parameters, flags. Everything else derives from
 * it: the 404 for a path no route has, the 405 (with Allow) for a path whose
 * routes take other methods, the query and body checks, and the route names
 * in /metrics (metrics.c).
 *
 * Calls run one way: http.c calls back here through http_callbacks only;
 * this file calls the handlers of its route table (the api_*.c files and
 * metrics.c), api_auth.c, api_reply.c, api_offload.c (its stop), http.c and
 * json.c. On the gateway's loop thread, except gateway_new,
 * gateway_hook, the listen getters and gateway_free (the owner's thread). */
#include <http_parser.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "gateway/api_body.h"
#include "gateway/gateway_internal.h"
#include "kv/kv.h"

/* ---- the route table ---------------------------------------------------- */

struct route {
    int id; /* enum gw_route */
    int method;
    const char *pattern;
    api_handler_fn *handler;
    unsigned query; /* Q_* bits; 0: no query string at all */
    unsigned flags; /* RF_* */
};

static const struct route routes[] = {
#define X(id, name, method, pattern, handler, query, flags)                              \
    {ROUTE_##id, method, pattern, handler, query, flags},
    GW_ROUTES(X)
#undef X
};
#define N_ROUTES (sizeof(routes) / sizeof(routes[0]))

/* Does `path` match `pat` (see GW_ROUTES)? Sets key/key_len to the part
 * "{key}" matched (NULL when the pattern has none). */
static bool pattern_match(const char *pat, const char *path, size_t len, const char **key,
                          size_t *key_len)
{
    size_t plen = strlen(pat);
    const char *brace = strstr(pat, "{key}");
    *key = NULL;
    *key_len = 0;
    if (brace == NULL) {
        if (len == plen && memcmp(path, pat, len) == 0)
            return true;
        return plen > 1 && pat[plen - 1] == '/' && len == plen - 1 &&
               memcmp(path, pat, len) == 0;
    }
    size_t pre = (size_t)(brace - pat);
    const char *suffix = brace + strlen("{key}");
    size_t slen = strlen(suffix);
    if (len < pre || memcmp(path, pat, pre) != 0)
        return false;
    const char *rest = path + pre;
    size_t rlen = len - pre;
    if (slen == 0 ? rlen == 0
                  : rlen < slen || memcmp(rest + rlen - slen, suffix, slen) != 0)
        return false;
    *key = rest;
    *key_len = rlen - slen;
    return true;
}

/* 405 for a path whose routes (those with hit's pattern) take other methods.
 * A route whose pattern is hit's plus a literal suffix and that takes this
 * method is named too: "POST only on /v1/kv/{key}/incr". */
static void respond_405(struct api_req *req, const struct route *hit)
{
    int method = req->http->method;
    size_t plen = strlen(hit->pattern);
    char allow[160] = "";
    size_t n = 0;
    for (size_t i = 0; i < N_ROUTES; i++)
        if (strcmp(routes[i].pattern, hit->pattern) == 0)
            n += (size_t)snprintf(allow + n, sizeof(allow) - n, "%s%s", n ? ", " : "",
                                  http_method_str(routes[i].method));
    for (size_t i = 0; i < N_ROUTES; i++) {
        const char *p = routes[i].pattern;
        if (routes[i].method == method && strncmp(p, hit->pattern, plen) == 0 &&
            p[plen] != 0 && strchr(p + plen, '{') == NULL)
            n += (size_t)snprintf(allow + n, sizeof(allow) - n, " (%s only on %s)",
                                  http_method_str(method), p);
    }
    TK_ASSERT(n < sizeof(allow));
    req->route = (hit->flags & RF_OWN_405) ? hit->id : ROUTE_OTHER;
    char extra[sizeof(allow) + 16];
    snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
    http_respond_error(req->http, 405, "method_not_allowed", extra,
                       "method not allowed here; allowed: %s", allow);
}

static int decode_key(struct api_req *req, const char *raw, size_t len)
{
    struct gateway *gw = req->gw;
    req->key = len + 1 <= sizeof(req->key_room) ? req->key_room : tk_malloc(len + 1);
    if (pct_decode(raw, len, req->key, &req->key_len, false) != 0) {
        api__bad(req, "bad percent-escape in the key");
        return TK_EINVAL;
    }
    if (req->key_len == 0) {
        api__bad(req, "empty key");
        return TK_EINVAL;
    }
    if (req->key_len > gw->cfg.key_max) {
        http_respond_error(req->http, 413, "too_large", NULL,
                           "key of %zu bytes exceeds %zu", req->key_len, gw->cfg.key_max);
        return TK_EINVAL;
    }
    return 0;
}

/* The checks every route shares, in order: the token (api_auth.c), the key,
 * the body, the query; then the handler. */
static void run_route(struct api_req *req, const struct route *r, const char *key,
                      size_t key_len, const char *qs, size_t qlen)
{
    req->route = r->id;
    req->is_write = (r->flags & RF_WRITE) != 0;
    if (api__auth_route(req) != 0)
        return; /* 401 before anything else is looked at */
    if (key != NULL && decode_key(req, key, key_len) != 0)
        return;
    if (!(r->flags & RF_BODY) && req->http->body_len > 0) {
        api__bad(req, "this request takes no body");
        return;
    }
    struct query q;
    if (r->query == 0) {
        if (qlen > 0) {
            api__bad(req, "this route takes no query parameters");
            return;
        }
        memset(&q, 0, sizeof(q));
        r->handler(req, &q);
        return;
    }
    char msg[160];
    if (api__query_parse(qs, qlen, r->query, &q, msg, sizeof(msg)) != 0)
        api__bad(req, "%s", msg);
    else
        r->handler(req, &q);
    api__query_free(&q);
}

/* The first route whose pattern and method match runs; else the first whose
 * pattern matches answers 405; else 404. */
static void route_request(struct api_req *req)
{
    const char *url = req->http->url ? req->http->url : "";
    size_t ulen = req->http->url_len;
    const char *qm = memchr(url, '?', ulen);
    size_t plen = qm ? (size_t)(qm - url) : ulen;
    const char *qs = qm ? qm + 1 : url + ulen;
    size_t qlen = (size_t)(url + ulen - qs);
    if (memchr(qs, '#', qlen))
        qlen = (size_t)((const char *)memchr(qs, '#', qlen) - qs);
    const struct route *hit = NULL;
    for (size_t i = 0; i < N_ROUTES; i++) {
        const char *key;
        size_t key_len;
        if (!pattern_match(routes[i].pattern, url, plen, &key, &key_len))
            continue;
        if (routes[i].method == req->http->method) {
            run_route(req, &routes[i], key, key_len, qs, qlen);
            return;
        }
        if (hit == NULL)
            hit = &routes[i];
    }
    if (hit != NULL)
        respond_405(req, hit);
    else
        http_respond_error(req->http, 404, "no_route", NULL, "no route for %.*s",
                           (int)(plen > 200 ? 200 : plen), url);
}

/* ---- the HTTP server's callbacks ----------------------------------------- */

static void on_request(struct http_request *hreq, void *data)
{
    struct gateway *gw = data;
    struct api_req *req = gw->req_pool;
    if (req != NULL) {
        gw->req_pool = req->pool_next;
        gw->n_req_pool--;
        memset(req, 0,
               offsetof(struct api_req, key_room)); /* the room is written first */
    } else {
        req = tk_calloc(1, sizeof(*req));
    }
    req->http = hreq;
    req->gw = data;
    req->route = ROUTE_OTHER;
    hreq->data = req;
    route_request(req);
}

/* How long the leader's address, when looked up under the state lock (a
 * member added at run time), is kept for the answers' headers: not a
 * hand-over of the lock, and a wake-up of the consensus loop, per answer. */
#define LEADER_HDR_TTL_MS 1000

/* The leader's header lines into hdr[0..cap); returns their length. Sets
 * *lasting when they come from the configuration alone (a member added at
 * run time is looked up under the state lock). */
static size_t leader_header(struct gateway *gw, uint64_t leader, char *hdr, size_t cap,
                            bool *lasting)
{
    *lasting = true;
    int n = snprintf(hdr, cap, "X-Tierkv-Leader: %llu\r\n", (unsigned long long)leader);
    bool known = false;
    for (uint32_t i = 0; i < gw->cfg.n_members; i++) {
        if (gw->cfg.members[i].id == leader && gw->cfg.members[i].http_addr[0]) {
            snprintf(hdr + n, cap - (size_t)n, "X-Tierkv-Leader-Addr: %s\r\n",
                     gw->cfg.members[i].http_addr);
            known = true;
        }
    }
    char addr[NODE_ADDR_MAX];
    if (!known) {
        *lasting = false;
        if (!gw->stopping && api__state_enter(gw)) { /* a member added at run time */
            bool found = node_member_http(gw->node, leader, addr, sizeof(addr));
            api__state_leave(gw, false);
            if (found)
                snprintf(hdr + n, cap - (size_t)n, "X-Tierkv-Leader-Addr: %s\r\n", addr);
        }
    }
    return strlen(hdr);
}

/* Counts the response, and names the leader (and its HTTP address, if
 * configured) on every response that will be sent. */
static size_t on_response(struct http_request *hreq, int status, char *hdr, size_t cap,
                          void *data)
{
    struct gateway *gw = data;
    const struct api_req *req = hreq->data;
    api__metrics_count(gw, req ? req->route : ROUTE_OTHER, status,
                       uv_hrtime() - hreq->start_ns);
    if (hdr == NULL)
        return 0;
    struct node_status st;
    node_status(gw->node, &st);
    hdr[0] = 0;
    if (st.leader == 0)
        return 0;
    uint64_t now = uv_now(gw->loop);
    if (st.leader == gw->leader_hdr_id && now < gw->leader_hdr_until &&
        gw->leader_hdr_len < cap) {
        memcpy(hdr, gw->leader_hdr, gw->leader_hdr_len + 1);
        return gw->leader_hdr_len;
    }
    bool lasting;
    size_t n = leader_header(gw, st.leader, hdr, cap, &lasting);
    gw->leader_hdr_id = 0;
    if (n < sizeof(gw->leader_hdr)) {
        memcpy(gw->leader_hdr, hdr, n + 1);
        gw->leader_hdr_len = n;
        gw->leader_hdr_id = st.leader;
        gw->leader_hdr_until = lasting ? UINT64_MAX : now + LEADER_HDR_TTL_MS;
    }
    return n;
}

static void on_close(struct http_request *hreq, void *data)
{
    struct api_req *req = hreq->data;
    struct gateway *gw = data;
    if (req == NULL)
        return;
    TK_ASSERT(!req->submitted);
    api__admit_release(req);
    if (req->nreq.cmd != NULL) /* a write held back, never submitted */
        tk_blob_unref(req->nreq.cmd);
    api__key_free(req);
    if (req->got_value != req->val_room)
        tk_free(req->got_value);
    tk_free(req->key2);
    tk_free(req->range_end);
    kv_digest_free(req->digest);
    tk_free(req->op_kinds);
    if (gw->n_req_pool < API_REQ_POOL_MAX) {
        req->pool_next = gw->req_pool;
        gw->req_pool = req;
        gw->n_req_pool++;
    } else {
        tk_free(req);
    }
    hreq->data = NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

void gateway_config_default(struct gateway_config *c)
{
    memset(c, 0, sizeof(*c));
    c->host = "127.0.0.1";
    c->port = 8080;
    c->key_max = 4096;
    c->value_max = 1 << 20;
    c->body_max = 4 << 20;
    c->header_max = 16384;
    c->conns_max = 1024;
    c->pipeline_max = 64;
    c->header_timeout_ms = 10000;
    c->body_timeout_ms = 30000;
    c->idle_timeout_ms = 60000;
    c->request_timeout_ms = 0;
    c->scan_limit_default = 1000;
    c->scan_limit_max = 10000;
    c->retry_after_s = 1;
    c->write_timeout_ms = 30000;
    c->mem_max = (size_t)512 << 20;
    c->watchers_max = 10000;
    c->tls_handshakes_max = 256;
    c->tls_handshakes_per_addr = 16;
    c->watch_buffer_bytes = 1u << 20;
    c->watch_stall_ms = 3000;
    c->watch_total_bytes = 64u << 20;
}

int gateway_new(const struct gateway_config *c, struct gateway **out)
{
    if (c->host == NULL || c->key_max == 0 || c->key_max > 65535 || c->value_max == 0 ||
        c->body_max == 0 || c->value_max > c->body_max || c->header_max < 1024 ||
        c->conns_max == 0 || c->pipeline_max == 0 || c->header_timeout_ms == 0 ||
        c->body_timeout_ms == 0 || c->idle_timeout_ms == 0 || c->write_timeout_ms == 0 ||
        c->mem_max < c->body_max || c->scan_limit_max == 0 ||
        c->scan_limit_default == 0 || c->scan_limit_default > c->scan_limit_max ||
        c->n_members > GATEWAY_MEMBERS_MAX || c->watch_buffer_bytes == 0)
        return TK_EINVAL;
    struct gateway *gw = tk_calloc(1, sizeof(*gw));
    gw->cfg = *c;
    if (gw->cfg.watch_total_bytes < c->watch_buffer_bytes)
        gw->cfg.watch_total_bytes = c->watch_buffer_bytes; /* at least one watch's */
    gw->cfg.host = tk_strdup(c->host);
    gw->latency = tk_calloc(ROUTE_COUNT, sizeof(*gw->latency));
    for (int i = 0; i < ROUTE_COUNT; i++)
        tk_hist_init(&gw->latency[i]);
    gw->listen_rc = TK_EINVAL;
    snprintf(gw->listen_err, sizeof(gw->listen_err),
             "the node never started the gateway");
    struct http_config hc = {
        .body_max = c->body_max,
        .header_max = c->header_max,
        .conns_max = c->conns_max,
        .pipeline_max = c->pipeline_max,
        .header_timeout_ms = c->header_timeout_ms,
        .body_timeout_ms = c->body_timeout_ms,
        .idle_timeout_ms = c->idle_timeout_ms,
        .retry_after_s = c->retry_after_s,
        .write_timeout_ms = c->write_timeout_ms,
        .mem_max = c->mem_max,
        .digest_header = "Idempotency-Key", /* client id of a write: api_kv.c */
        .tls = c->tls,
        .tls_handshakes_max = c->tls_handshakes_max,
        .tls_handshakes_per_addr = c->tls_handshakes_per_addr,
        .kept_header = "Authorization", /* bearer tokens: api_auth.c */
    };
    static const struct http_callbacks cb = {
        .on_request = on_request,
        .on_response = on_response,
        .on_close = on_close,
    };
    gw->http = http_server_new(&hc, &cb, gw);
    *out = gw;
    return 0;
}

/* ---- the node's hooks ---------------------------------------------------- */

static void on_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct gateway *gw = data;
    gw->node = n;
    gw->loop = loop;
    uv_timer_init(loop, &gw->watch_timer);
    gw->watch_timer.data = gw;
    gw->listen_rc = http_server_listen(gw->http, loop, gw->cfg.host, gw->cfg.port,
                                       gw->listen_err, sizeof(gw->listen_err));
}

/* On the node's loop, requests the node still holds are failed with
 * TK_ESHUTDOWN right after this hook (503, or 500 for a write):
 * http_server_stop keeps their connections open long enough for those
 * answers. On the client loop they have all been answered by now. */
static void on_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct gateway *gw = data;
    (void)n;
    (void)loop;
    gw->stopping = true;
    api__offload_stop(gw);
    api__admit_stop(gw);
    api__watch_stop(gw);
    uv_close((uv_handle_t *)&gw->watch_timer, NULL);
    http_server_stop(gw->http);
}

static void on_applied(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)loop;
    api__watch_applied(data);
}

void gateway_hook(struct gateway *gw, struct node_options *o)
{
    gw->own_loop = !gw->cfg.on_node_loop;
    if (gw->own_loop) {
        o->on_client_start = on_start;
        o->on_client_stop = on_stop;
        o->on_client_applied = on_applied;
        o->client_hook_data = gw;
    } else {
        o->on_loop_start = on_start;
        o->on_loop_stop = on_stop;
        o->on_applied = on_applied;
        o->hook_data = gw;
    }
}

int gateway_listen_status(const struct gateway *gw)
{
    return gw->listen_rc;
}

const char *gateway_listen_error(const struct gateway *gw)
{
    return gw->listen_err;
}

uint16_t gateway_port(const struct gateway *gw)
{
    return http_server_port(gw->http);
}

void gateway_free(struct gateway *gw)
{
    if (gw == NULL)
        return;
    http_server_free(gw->http); /* every request's on_close has run */
    while (gw->req_pool != NULL) {
        struct api_req *req = gw->req_pool;
        gw->req_pool = req->pool_next;
        tk_free(req);
    }
    tk_free((char *)(uintptr_t)gw->cfg.host);
    tk_free(gw->latency);
    tk_free(gw);
}
