/* Shared between the gateway's API files, which sit on http.h's server:
 *   api.c         the gateway object (gateway.h), the server's callbacks and
 *                 routing: the route table below, 404/405, query checks;
 *   api_kv.c      the /v1/kv, /v1/batch and /v1/txn handlers, with
 *   api_body.c    their JSON request bodies into kvpb (api_body.h);
 *   api_cluster.c /v1/cluster, /healthz, /readyz, /v1/debug/digest;
 *   api_status.c  /ui, the status page (gateway/ui.html, embedded);
 *   api_members.c /v1/members: list, add, promote, remove (node_member_change);
 *   metrics.c     /metrics (a descriptor table) and the per-route counters;
 *   api_reply.c   what the handlers share: answers, query values, submitting
 *                 to the node.
 * Calls run one way: api.c -> the handler files -> api_reply.c -> http.c,
 * json.c and the node (api_kv.c -> api_body.c -> json.c). Everything here
 * runs on the gateway's loop thread: the node's client loop (node.h,
 * on_client_start), or with gateway_config.on_node_loop the node's own loop.
 * On the client loop, what reads or changes the node's state (node_kv,
 * node_members, node_member_http, node_member_change, node_backup_start,
 * node_latency) runs between api__state_enter and api__state_leave (the
 * node's state lock); read callbacks already hold it; callbacks the node
 * runs on its own loop (a member change's, a backup's) come back through
 * api__bounce. */
#ifndef TK_GATEWAY_INTERNAL_H
#define TK_GATEWAY_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/hist.h"
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "gateway/json.h"
#include "node/node.h"

/* ---- query parameters --------------------------------------------------- */

/* X(ID, name): every query parameter any route takes. */
#define GW_QPARAMS(X)                                                                    \
    X(MODE, "mode")                                                                      \
    X(CONSISTENCY, "consistency")                                                        \
    X(ENCODING, "encoding")                                                              \
    X(RAW, "raw")                                                                        \
    X(PREFIX, "prefix")                                                                  \
    X(START, "start")                                                                    \
    X(END, "end")                                                                        \
    X(LIMIT, "limit")                                                                    \
    X(TTL, "ttl_ms")                                                                     \
    X(IF_VERSION, "if_version")                                                          \
    X(IF_MOD, "if_mod_revision")                                                         \
    X(DELTA, "delta")                                                                    \
    X(IF_ABSENT, "if_absent")                                                            \
    X(KEY, "key")                                                                        \
    X(START_REV, "start_revision")                                                       \
    X(PREV_KV, "prev_kv")                                                                \
    X(PROGRESS, "progress_ms")                                                           \
    X(LOCAL, "local")                                                                    \
    X(LEASE, "lease")                                                                    \
    X(INTERNAL, "internal")

enum gw_qindex {
#define X(id, name) QI_##id,
    GW_QPARAMS(X)
#undef X
        QI_COUNT,
};

enum gw_qbit {
#define X(id, name) Q_##id = 1u << QI_##id,
    GW_QPARAMS(X)
#undef X
};

/* A request's parsed query: val[i] (NUL-terminated, percent-decoded) when
 * bit i of `present` is set. */
struct query {
    unsigned present;
    uint8_t *val[QI_COUNT];
    size_t len[QI_COUNT];
};

/* ---- routes ------------------------------------------------------------- */

struct api_req;
typedef void api_handler_fn(struct api_req *req, const struct query *q);

/* Route flags. */
#define RF_WRITE (1u << 0) /* submits a write (ordering; a 500 on shutdown) */
/* A body is allowed (else 400 "this request takes no body"). The GET routes
 * without query parameters have it: they always ignored a body. */
#define RF_BODY (1u << 1)
/* A 405 on this path counts under this route in /metrics (else "other"), as
 * the GET-only routes without query parameters always did. */
#define RF_OWN_405 (1u << 2)

/* X(ID, metric name, method, path pattern, handler, query params, flags).
 * Patterns: a literal path; "{key}" matches a non-empty rest of the path,
 * or, when the pattern goes on after it, whatever lies before that literal
 * suffix; a trailing "/" is optional. Order is the /metrics order. The
 * 404/405 answers (with Allow) derive from the table (api.c). */
#define GW_ROUTES(X)                                                                     \
    X(KV_GET, "kv_get", HTTP_GET, "/v1/kv/{key}", api__kv_get,                           \
      Q_CONSISTENCY | Q_ENCODING | Q_RAW, 0)                                             \
    X(KV_PUT, "kv_put", HTTP_PUT, "/v1/kv/{key}", api__kv_put,                           \
      Q_MODE | Q_ENCODING | Q_TTL | Q_IF_VERSION | Q_IF_MOD | Q_IF_ABSENT | Q_LEASE,     \
      RF_WRITE | RF_BODY)                                                                \
    X(KV_DELETE, "kv_delete", HTTP_DELETE, "/v1/kv/{key}", api__kv_delete, Q_MODE,       \
      RF_WRITE)                                                                          \
    X(KV_SCAN, "kv_scan", HTTP_GET, "/v1/kv/", api__kv_scan,                             \
      Q_PREFIX | Q_START | Q_END | Q_LIMIT | Q_CONSISTENCY | Q_ENCODING | Q_INTERNAL, 0) \
    X(KV_DELETE_RANGE, "kv_delete_range", HTTP_DELETE, "/v1/kv/", api__kv_delete_range,  \
      Q_PREFIX | Q_START | Q_END | Q_MODE, RF_WRITE)                                     \
    X(KV_INCR, "kv_incr", HTTP_POST, "/v1/kv/{key}/incr", api__kv_incr,                  \
      Q_MODE | Q_DELTA, RF_WRITE | RF_BODY)                                              \
    X(BATCH, "batch", HTTP_POST, "/v1/batch", api__batch, Q_MODE | Q_ENCODING,           \
      RF_WRITE | RF_BODY)                                                                \
    X(TXN, "txn", HTTP_POST, "/v1/txn", api__txn, Q_MODE | Q_ENCODING,                   \
      RF_WRITE | RF_BODY)                                                                \
    X(CLUSTER, "cluster", HTTP_GET, "/v1/cluster", api__cluster, 0,                      \
      RF_BODY | RF_OWN_405)                                                              \
    X(HEALTHZ, "healthz", HTTP_GET, "/healthz", api__healthz, 0, RF_BODY | RF_OWN_405)   \
    X(READYZ, "readyz", HTTP_GET, "/readyz", api__readyz, 0, RF_BODY | RF_OWN_405)       \
    X(METRICS, "metrics", HTTP_GET, "/metrics", api__metrics, 0, RF_BODY | RF_OWN_405)   \
    X(UI, "ui", HTTP_GET, "/ui", api__ui, 0, RF_BODY | RF_OWN_405)                       \
    X(DIGEST, "digest", HTTP_GET, "/v1/debug/digest", api__digest, 0,                    \
      RF_BODY | RF_OWN_405)                                                              \
    X(MEMBERS_LIST, "members_list", HTTP_GET, "/v1/members", api__members_list, 0,       \
      RF_OWN_405)                                                                        \
    X(MEMBERS_ADD, "members_add", HTTP_POST, "/v1/members", api__members_add, 0,         \
      RF_WRITE | RF_BODY)                                                                \
    X(MEMBERS_PROMOTE, "members_promote", HTTP_POST, "/v1/members/{key}/promote",        \
      api__members_promote, 0, RF_WRITE)                                                 \
    X(MEMBERS_REMOVE, "members_remove", HTTP_DELETE, "/v1/members/{key}",                \
      api__members_remove, 0, RF_WRITE)                                                  \
    X(WATCH, "watch", HTTP_GET, "/v1/watch", api__watch,                                 \
      Q_KEY | Q_PREFIX | Q_START | Q_END | Q_START_REV | Q_PREV_KV | Q_PROGRESS |        \
          Q_ENCODING,                                                                    \
      RF_OWN_405)                                                                        \
    X(SNAPSHOT, "snapshot", HTTP_GET, "/v1/snapshot", api__snapshot, Q_LOCAL, 0)         \
    X(LEASE_GRANT, "lease_grant", HTTP_POST, "/v1/leases", api__lease_grant, Q_TTL,      \
      RF_WRITE | RF_BODY)                                                                \
    X(LEASE_KEEPALIVE, "lease_keepalive", HTTP_POST, "/v1/leases/{key}/keepalive",       \
      api__lease_keepalive, 0, RF_WRITE | RF_BODY)                                       \
    X(LEASE_REVOKE, "lease_revoke", HTTP_DELETE, "/v1/leases/{key}", api__lease_revoke,  \
      0, RF_WRITE)                                                                       \
    X(LEASE_GET, "lease_get", HTTP_GET, "/v1/leases/{key}", api__lease_get,              \
      Q_CONSISTENCY, 0)

enum gw_route {
#define X(id, name, method, pattern, handler, query, flags) ROUTE_##id,
    GW_ROUTES(X)
#undef X
        ROUTE_OTHER, /* unknown route or method, malformed HTTP */
    ROUTE_COUNT,
};

#define X(id, name, method, pattern, handler, query, flags) api_handler_fn handler;
GW_ROUTES(X)
#undef X

/* ---- the gateway and its requests --------------------------------------- */

/* Statuses /metrics counts one by one (metrics.c); the last slot is "other". */
#define GW_STATUS_SLOTS 20

struct gateway {
    struct gateway_config cfg;
    struct node *node;
    struct http_server *http;
    bool stopping;
    int listen_rc;
    char listen_err[256];
    uv_loop_t *loop; /* the client loop's (or the node's), from the start hook */
    bool own_loop;   /* on the node's client loop (not cfg.on_node_loop) */
    /* Bodies decoded on the thread pool (api_offload.c): waiting, in order;
     * running; and counters. */
    struct api_offload *offload_head, *offload_tail;
    uint32_t offload_waiting, offload_running;
    uint64_t offloaded, offload_done;
    uint64_t body_values_by_ref; /* api_body.c's spans, from api__write_built */
    /* Large writes waiting to be submitted (API_ADMIT_BYTES), in order; the
     * bytes of those submitted and not yet ended; counters. */
    struct api_req *admit_head, *admit_tail;
    uint32_t admit_waiting;
    bool admitting;
    uint64_t admit_inflight, admit_waited;
    /* Watches (api_watch.c): the open ones, a pass over them scheduled for
     * the next loop turn, and counters. */
    struct watcher *watchers;
    uint32_t n_watchers;
    uv_timer_t watch_timer;
    bool watch_pass_due;
    struct watch_shared *watch_shared; /* the events a pass shares (api_watch.c) */
    uint64_t watch_shared_next;        /* the revision the next pass shares from */
    uint64_t watch_pass_ms;            /* uv_now of the last pass */
    uint64_t watch_lagging, watch_compacted;
    uint64_t watch_turn_ms;        /* uv_now of the turn watch_turn_bytes counts */
    size_t watch_turn_bytes;       /* bytes written to watchers in that turn */
    uint64_t watch_quiet_until_ms; /* no watch writes before (the duty cycle) */
    uint64_t watch_over_total;     /* watchers cut lagging: all of them held too much */
    uint64_t watch_turn_full;      /* passes put off: the turn's watch budget spent */
    /* Metrics (metrics.c), on the loop thread. */
    uint64_t requests[ROUTE_COUNT][GW_STATUS_SLOTS];
    struct tk_hist *latency;  /* [ROUTE_COUNT], nanoseconds */
    uint64_t auth_denied;     /* answered 401 or 403 (api_auth.c) */
    struct api_req *req_pool; /* free api_reqs, reused (api.c) */
    uint32_t n_req_pool;
    /* The leader header lines of every answer (api.c's on_response), kept
     * while the leader is leader_hdr_id (0: none kept) until
     * leader_hdr_until (uv_now; for ever when the configuration names its
     * address; LEADER_HDR_TTL_MS when it was looked up under the state
     * lock): built once per leader, not per answer. */
    uint64_t leader_hdr_id, leader_hdr_until;
    size_t leader_hdr_len;
    char leader_hdr[HTTP_EXTRA_HEADERS_MAX];
};

#define API_KEY_ROOM 128
#define API_VAL_ROOM 256
#define API_REQ_POOL_MAX 1024 /* free api_reqs kept (struct gateway) */

/* The API's state of one request (http_request.data), from on_request to
 * on_close. */
struct api_req {
    struct http_request *http;
    struct gateway *gw;
    int route;      /* enum gw_route */
    bool is_write;  /* the route has RF_WRITE */
    bool submitted; /* the node holds nreq: wait for its callback */
    struct node_req nreq;
    struct kv_result res; /* a write's result, copied by the node (res_out) */
    uint8_t *key;
    size_t key_len;
    uint8_t *key2; /* scan: end bound */
    size_t key2_len;
    bool b64; /* ?encoding=base64 */
    bool raw; /* ?raw */
    bool by_prefix;
    bool internal; /* scan: ?internal (admin): the node's own records too */
    uint32_t limit;
    uint8_t *op_kinds; /* batch/txn: kind of each op (then ops, then else ops) */
    uint32_t n_ops;
    uint32_t n_then;
    const struct api_user *user; /* with --auth-file: who sent it (api_auth.c) */
    /* delete range in steps (api_range.c): key is the step's start */
    uint8_t *range_end; /* the step's end, when not the range's */
    size_t range_end_len;
    uint64_t range_deleted, range_revision;
    uint8_t range_mode;
    bool range_last, range_keyed;
    /* the digest in steps (api_digest.c) */
    struct kv_digest *digest;
    uint64_t digest_applied;
    uint32_t digest_restarts;
    uint64_t lease_id, lease_ttl; /* lease routes (api_lease.c) */
    uint64_t admit_bytes;         /* a large write's bytes in flight (api_offload.c) */
    struct api_req *admit_next;   /* in the gateway's admission queue */
    struct api_req *pool_next;    /* in the gateway's pool of free ones */
    /* A get copied out on the node's loop (api_kv.c, get_collect): the
     * item (its value in got_value: val_room, or allocated), the lookup's
     * code and the applied index. */
    struct kv_item got;
    int got_rc;
    uint64_t got_rev;
    uint8_t *got_value;
    /* key's room: a key up to API_KEY_ROOM - 1 bytes needs no allocation.
     * Free key with api__key_free. The value's room: a got value up to
     * API_VAL_ROOM bytes. (Not cleared when the request is reused.) */
    uint8_t key_room[API_KEY_ROOM];
    uint8_t val_room[API_VAL_ROOM];
};

/* Frees req->key, unless it lives in the request's own room. */
static inline void api__key_free(struct api_req *req)
{
    if (req->key != req->key_room)
        tk_free(req->key);
    req->key = NULL;
}

/* ---- the node's state (api_reply.c) ------------------------------------- */

/* On the client loop: takes the node's state lock; false (not held) once the
 * node stops, when its state is not to be touched. On the node's loop:
 * true. Hold it for bounded work only: the consensus loop waits meanwhile.
 * `changed` on leaving: a member change or backup was started. */
static inline bool api__state_enter(struct gateway *gw)
{
    return !gw->own_loop || node_client_lock(gw->node);
}

static inline void api__state_leave(struct gateway *gw, bool changed)
{
    if (gw->own_loop)
        node_client_unlock(gw->node, changed);
}

/* node_members under the state lock (none once the node stops). */
size_t api__node_members(struct gateway *gw, struct node_member *out, size_t cap,
                         uint64_t *config_index, bool *committed);

/* fn(arg) on the gateway's loop, called from a callback the node runs on its
 * own loop (a member change's, a backup's); at once on the node's loop. */
static inline void api__bounce(struct gateway *gw, node_call_fn *fn, void *arg)
{
    if (gw->own_loop)
        node_client_call(gw->node, fn, arg);
    else
        fn(arg);
}

/* ---- api_auth.c --------------------------------------------------------- */

struct api_user;
struct Kvpb__Command;
/* Before a routed request's handler: with an auth file, the bearer token
 * names the user (else 401) and admin-only routes need admin (else 403).
 * Returns 0 to go on, or TK_EINVAL when the request is answered. */
int api__auth_route(struct api_req *req);
/* A watch's key (single), prefix or range [start, end): the user may read
 * it (else 403). */
int api__auth_watch(struct api_req *req, const uint8_t *start, size_t start_len,
                    const uint8_t *end, size_t end_len, bool by_prefix, bool single);
/* Without an auth file, or for an admin: true; else answers 403 and returns
 * false (a scan's ?internal). */
bool api__auth_admin(struct api_req *req);
/* At a read's submission: the user may read its key or range (else 403). */
int api__auth_read(struct api_req *req);
/* Before a write is packed: the user may write every key of `cmd` (and
 * read its compares); deleting every key needs admin (else 403). */
int api__auth_command(struct api_req *req, const struct Kvpb__Command *cmd);
/* api__auth_command in two halves, for a command built off the loop
 * (api_offload.c): the verdict (any thread; reads only the request's user and
 * the command) and its answer (the loop: 0, or the request answered 400 or
 * 403 and TK_EINVAL). */
enum { API_AUTH_OK, API_AUTH_RESERVED, API_AUTH_NOT_ALL, API_AUTH_NOT_KEYS };
int api__auth_verdict(const struct api_req *req, const struct Kvpb__Command *cmd);
int api__auth_answer(struct api_req *req, int verdict);
/* The exactly-once id of a write with an Idempotency-Key: 128 bits of
 * SHA-256 over the user's name and the key's SHA-256. */
void api__auth_client_id(const struct api_req *req, uint64_t *client, uint64_t *seq);

/* ---- api_kv.c ----------------------------------------------------------- */

/* Scan bounds from the query into req (prefix, or start/end); on a bad one
 * answers (400, 413) and returns TK_EINVAL. */
int api__scan_bounds(struct api_req *req, const struct query *q);
/* A prefix bound (req->by_prefix) as the range [prefix, its successor): the
 * successor is the smallest key above every key the prefix starts; none
 * (unbounded) for an empty or all-0xff prefix. */
void api__prefix_to_range(struct api_req *req);

/* ---- api_reply.c -------------------------------------------------------- */

/* Parses `s` (the query string without '?'); only params in `allowed`.
 * Returns TK_EINVAL with a message in msg on error; query_free either way. */
int api__query_parse(const char *s, size_t len, unsigned allowed, struct query *q,
                     char *msg, size_t msg_cap);
void api__query_free(struct query *q);
/* The value of ?mode (enum node_mode), ?consistency (enum
 * node_consistency) or ?encoding (req->b64): the default when absent; on a
 * bad value answers 400 and returns TK_EINVAL. */
int api__parse_mode(struct api_req *req, const struct query *q, int *mode);
int api__parse_consistency(struct api_req *req, const struct query *q, int *cons);
int api__parse_encoding(struct api_req *req, const struct query *q);
/* ?name, ?name=1|true (true) or ?name=0|false; else 400 and TK_EINVAL. */
int api__parse_flag(struct api_req *req, const struct query *q, int qi, bool *out);
/* A non-negative decimal; else 400 and TK_EINVAL. */
int api__query_u64(struct api_req *req, const struct query *q, int qi, bool *has,
                   uint64_t *out);
int api__parse_i64(const char *s, size_t len, int64_t *out);

/* 400 bad_request with a message. */
void api__bad(struct api_req *req, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The answer for a project error code (503 not_leader, 504 timeout...). */
void api__respond_rc(struct api_req *req, int rc);
/* 200 with the JSON in b (a newline added), X-Tierkv-Revision if nonzero. */
void api__respond_json(struct api_req *req, struct jbuf *b, uint64_t revision);
/* Retry-After: retry_after_s, as a header line. */
void api__retry_after(const struct gateway *gw, char *out, size_t cap);
/* Submits a write (`cmd`, a packed kvpb.Command, taken; its answer comes to
 * cb) or a read, in the connection's order (http_dispatch). A submission the
 * node refuses is answered with api__respond_rc.
 *
 * Large writes are admitted in turn: a write whose command has
 * API_OFFLOAD_BYTES or more (a raw PUT too) is submitted when no other is in
 * flight from this gateway (submitted and not yet ended) or when the bytes in
 * flight stay within API_ADMIT_BYTES; otherwise it waits, held (http_hold),
 * in arrival order, and goes when a write in flight ends (api.c's on_close
 * calls api__admit_release). Each one in the one Raft log delays every write
 * behind it by its replication: clients posting 4 MB batches made a small
 * PUT wait behind all of theirs (tests/adversary bodies), now behind at most
 * one per node. A held request keeps the connection's later requests behind
 * it, so a client's own writes keep their order. */
#define API_ADMIT_BYTES ((uint64_t)4 << 20)
void api__submit_write(struct api_req *req, struct tk_blob *cmd, int mode,
                       node_write_cb *cb);
/* A read; on the client loop, `collect` (NULL: none) copies what the answer
 * needs on the node's loop (node_req.collect_cb) and cb runs with sm NULL;
 * without it cb reads in place under the state lock. */
void api__submit_read(struct api_req *req, int consistency, node_read_cb *collect,
                      node_read_cb *cb);
/* req has ended: the bytes it held in flight go back, and the waiting
 * writes that now fit go. */
void api__admit_release(struct api_req *req);
/* At the gateway's stop: the waiting writes answered with api__not_applied. */
void api__admit_stop(struct gateway *gw);
/* A write that never reached the node: 503 shutting_down with Retry-After,
 * "<why>; the write was not applied, retry it". */
void api__not_applied(struct api_req *req, const char *why);
/* Hands req->nreq, as it is filled, to the node now (no http_dispatch);
 * answers a refusal (api__respond_rc, the command's blob dropped). */
void api__submit_nreq(struct api_req *req);
/* Fills req->nreq as a stale (local) read answered to cb, for reads made in
 * steps (api_range.c's plans, api_digest.c's steps). */
void api__stale_read_fill(struct api_req *req, node_read_cb *cb);

/* ---- api_watch.c -------------------------------------------------------- */

struct watcher;
/* The node applied entries: a pass over every watcher on the next turn. */
void api__watch_applied(struct gateway *gw);
/* gw->watch_timer's callback: that pass. */
void api__watch_run(uv_timer_t *t);
/* The bytes all watches hold that their clients have not taken. */
size_t api__watch_pending(struct gateway *gw);
/* Ends every watch (the loop stops). */
void api__watch_stop(struct gateway *gw);

/* ---- metrics.c ---------------------------------------------------------- */

/* Counts one response of `route` with `status`, `ns` after its start. */
void api__metrics_count(struct gateway *gw, int route, int status, uint64_t ns);

#endif
