/* Shared between the gateway's files: http.c (connections, parsing, ordered
 * responses), api.c (routes -> node requests) and json.c (a JSON writer,
 * UTF-8, base64 and percent-decoding helpers). Everything here runs on the
 * node's loop thread. */
#ifndef TK_GATEWAY_INTERNAL_H
#define TK_GATEWAY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/hist.h"
#include "gateway/gateway.h"
#include "node/node.h"

#include "gateway/json.h"

/* ---- http.c ------------------------------------------------------------ */

enum gw_route {
    ROUTE_KV_GET,
    ROUTE_KV_PUT,
    ROUTE_KV_DELETE,
    ROUTE_KV_SCAN,
    ROUTE_KV_DELETE_RANGE,
    ROUTE_KV_INCR,
    ROUTE_BATCH,
    ROUTE_TXN,
    ROUTE_CLUSTER,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_METRICS,
    ROUTE_DIGEST,
    ROUTE_OTHER, /* unknown route or method, malformed HTTP */
    ROUTE_COUNT,
};

#define GW_STATUS_SLOTS 20
#define GATEWAY_STOP_GRACE_MS 2000

struct http_conn;

/* One parsed request, owned by its connection's queue until its response
 * has been written (or the connection is gone). */
struct http_req {
    struct http_conn *conn;
    struct http_req *next;
    struct gateway *gw;
    int method; /* enum http_method */
    char *url;
    size_t url_len;
    bool keep_alive;
    bool json_body; /* Content-Type: application/json */
    bool has_idem;  /* Idempotency-Key */
    uint64_t idem_hash;
    uint8_t *body;
    size_t body_len;
    size_t body_cap;
    uint64_t start_ns;
    int route;      /* enum gw_route */
    bool submitted; /* the node holds nreq: wait for its callback */
    bool is_write;
    bool deferred;      /* held back to keep the connection's order (http_dispatch) */
    bool counted_write; /* counted in the connection's pending writes */
    bool done;
    bool close_after; /* Connection: close after this response */
    char *resp;
    size_t resp_len;
    struct node_req nreq;
    /* api.c's per-request state */
    uint8_t *key;
    size_t key_len;
    uint8_t *key2; /* scan: end bound */
    size_t key2_len;
    bool b64; /* ?encoding=base64 */
    bool raw; /* ?raw */
    bool by_prefix;
    uint32_t limit;
    uint8_t *op_kinds; /* batch/txn: kind of each op (then ops, then else ops) */
    uint32_t n_ops;
    uint32_t n_then;
};

struct gateway {
    struct gateway_config cfg;
    struct node *node;
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening;
    bool stopping;
    uv_timer_t stop_timer; /* grace period for answers at loop stop */
    bool stop_timer_open;
    int listen_rc;
    char listen_err[256];
    uint16_t port;
    struct http_conn *conns; /* doubly linked */
    uint32_t n_conns;
    uint32_t n_rejecting;
    /* Metrics, on the loop thread. */
    uint64_t requests[ROUTE_COUNT][GW_STATUS_SLOTS];
    struct tk_hist *latency; /* [ROUTE_COUNT], nanoseconds */
    uint64_t conns_accepted;
    uint64_t conns_rejected;
    uint64_t conns_timed_out;
    uint64_t bad_requests;
};

/* Queues the response of `req`: status, optional content type (NULL: JSON),
 * `extra` header lines (each ending in \r\n, may be NULL) and a body. Writes
 * it once every earlier request of the connection has answered. Exactly once
 * per request. */
void http_respond(struct http_req *req, int status, const char *content_type,
                  const char *extra, const void *body, size_t body_len);
/* Submits req->nreq (prepared by api.c) to the node, or holds it back while
 * ordering requires: a read waits for the connection's earlier writes to
 * complete, and nothing overtakes a request held back. So pipelined requests
 * on one connection take effect in the order they were sent. */
void http_dispatch(struct http_req *req);
/* A JSON error {"error":{"code","message"}}. */
void http_respond_error(struct http_req *req, int status, const char *code,
                        const char *extra, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
const char *http_reason(int status);
int http_status_slot(int status);
extern const int gw_status_codes[GW_STATUS_SLOTS];
extern const char *const gw_route_names[ROUTE_COUNT];

/* ---- api.c ------------------------------------------------------------- */

/* Routes a complete request; answers it now or later with http_respond. */
void api_handle(struct gateway *gw, struct http_req *req);
/* Hands req->nreq to the node now; answers the request on failure. */
void api_submit(struct http_req *req);
/* Frees api.c's state of a request. */
void api_req_free(struct http_req *req);

#endif
