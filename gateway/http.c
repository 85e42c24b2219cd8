/* The HTTP/1.1 server of the gateway: libuv TCP + http-parser, on the node's
 * loop thread.
 *
 * A connection parses whatever arrives; each complete request is queued in
 * arrival order and handed to api.c, which answers at once or when the node
 * calls back. Responses are written strictly in request order (pipelining):
 * an answered request waits until every earlier one has answered, then the
 * run of answered requests at the head goes out in one vectored write.
 *
 * Bounds: request line + headers <= header_max (431), body <= body_max (413),
 * requests in flight per connection <= pipeline_max (reading pauses above it,
 * so at most one more read buffer of requests is parsed), connections <=
 * conns_max (503 and close beyond it). Timers cut slow clients: from a
 * request's first byte to the end of its headers (header_timeout_ms), then to
 * the end of its body (body_timeout_ms), and between requests (idle_timeout_ms).
 *
 * Lifetime: a connection is freed when its two handles are closed and no
 * request of it is still held by the node (refs == 0). On loop stop every
 * connection is closed; requests the node still holds complete afterwards
 * with TK_ESHUTDOWN and are then dropped. */
#include <http_parser.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/log.h"
#include "gateway/gateway_internal.h"

#define RBUF_BYTES 16384
#define WRITE_BUFS 16
#define REJECT_EXTRA 64 /* connections kept open only to send a 503 */

enum phase { PH_IDLE, PH_HEADERS, PH_BODY };

enum hdr {
    HDR_OTHER,
    HDR_CONTENT_TYPE,
    HDR_CONTENT_LENGTH,
    HDR_TRANSFER_ENCODING,
    HDR_IDEMPOTENCY_KEY,
    HDR_EXPECT,
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    struct gateway *gw;
    struct http_conn *prev, *next;
    http_parser parser;
    int refs; /* open handles + requests not yet answered */
    bool closing;
    bool read_paused;
    bool read_done; /* parse nothing more (error, Connection: close) */
    bool rejecting;
    int phase;
    uint32_t phase_changes;  /* re-arm the timer when this moves */
    uint32_t inflight;       /* requests parsed whose response is not yet written */
    uint32_t n_deferred;     /* requests held back by http_dispatch */
    uint32_t pending_writes; /* writes at the node, not yet answered */
    bool resuming, resume_again;
    struct http_req *head, *tail;
    struct http_req *cur;
    size_t header_bytes;
    enum hdr hdr;
    bool in_value;
    char hval[256];
    size_t hval_len;
    bool has_te, has_cl, expect_continue;
    int err_status; /* set by a callback that fails the parse */
    const char *err_code;
    char err_msg[160];
    char rbuf[RBUF_BYTES];
};

struct write_req {
    uv_write_t wr;
    struct http_conn *c;
    uint32_t n;
    bool close;
    struct http_req *reqs[WRITE_BUFS];
    uv_buf_t bufs[WRITE_BUFS];
};

const int gw_status_codes[GW_STATUS_SLOTS] = {100, 200, 400, 404, 405, 408, 409,
                                              411, 413, 414, 415, 431, 500, 501,
                                              503, 504, 505, 0,   0,   0};
const char *const gw_route_names[ROUTE_COUNT] = {
    "kv_get", "kv_put",  "kv_delete", "kv_scan", "kv_delete_range", "kv_incr", "batch",
    "txn",    "cluster", "healthz",   "readyz",  "metrics",         "digest",  "other",
};

int http_status_slot(int status)
{
    for (int i = 0; i < GW_STATUS_SLOTS; i++)
        if (gw_status_codes[i] == status)
            return i;
    return GW_STATUS_SLOTS - 1; /* "other" */
}

const char *http_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

static const http_parser_settings parser_settings;
static void on_stop_timer_closed(uv_handle_t *h);
static void conn_close(struct http_conn *c);
static void conn_flush(struct http_conn *c);
static void conn_resume(struct http_conn *c);
static void conn_timer_update(struct http_conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* ---- requests ---------------------------------------------------------- */

static struct http_req *req_new(struct http_conn *c)
{
    struct http_req *r = tk_calloc(1, sizeof(*r));
    r->conn = c;
    r->gw = c->gw;
    r->route = ROUTE_OTHER;
    r->keep_alive = true;
    r->start_ns = uv_hrtime();
    return r;
}

static void req_free(struct http_req *r)
{
    api_req_free(r);
    tk_free(r->url);
    tk_free(r->body);
    tk_free(r->resp);
    tk_free(r);
}

static void conn_enqueue(struct http_conn *c, struct http_req *r)
{
    r->next = NULL;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    c->inflight++;
    c->refs++; /* until http_respond */
}

static void conn_maybe_free(struct http_conn *c)
{
    if (c->refs > 0)
        return;
    TK_ASSERT(c->closing);
    struct http_req *r = c->head;
    while (r) {
        struct http_req *next = r->next;
        req_free(r);
        r = next;
    }
    if (c->cur)
        req_free(c->cur);
    tk_free(c);
}

void http_respond(struct http_req *req, int status, const char *content_type,
                  const char *extra, const void *body, size_t body_len)
{
    struct http_conn *c = req->conn;
    struct gateway *gw = req->gw;
    TK_ASSERT(!req->done);
    TK_ASSERT(!req->deferred);
    req->done = true;
    if (req->counted_write) {
        req->counted_write = false;
        c->pending_writes--;
    }
    gw->requests[req->route][http_status_slot(status)]++;
    tk_hist_record(&gw->latency[req->route], uv_hrtime() - req->start_ns);
    if (c->closing) {
        /* The connection is gone: nobody will read this. */
        struct http_req **pp = &c->head, *prev = NULL;
        while (*pp != NULL && *pp != req) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        TK_ASSERT(*pp == req);
        *pp = req->next;
        if (c->tail == req)
            c->tail = prev;
        req_free(req);
        c->refs--;
        conn_maybe_free(c);
        return;
    }
    c->refs--;
    if (!req->keep_alive || gw->stopping)
        req->close_after = true;
    struct node_status st;
    node_status(gw->node, &st);
    char lead[GATEWAY_ADDR_MAX + 64] = "";
    if (st.leader != 0) {
        int n = snprintf(lead, sizeof(lead), "X-Tierkv-Leader: %llu\r\n",
                         (unsigned long long)st.leader);
        for (uint32_t i = 0; i < gw->cfg.n_members; i++) {
            if (gw->cfg.members[i].id == st.leader && gw->cfg.members[i].http_addr[0])
                snprintf(lead + n, sizeof(lead) - (size_t)n,
                         "X-Tierkv-Leader-Addr: %s\r\n", gw->cfg.members[i].http_addr);
        }
    }
    char head[512 + GATEWAY_ADDR_MAX];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s",
                      status, http_reason(status),
                      content_type ? content_type : "application/json", body_len, lead,
                      req->close_after ? "Connection: close\r\n" : "");
    TK_ASSERT(hn > 0 && (size_t)hn < sizeof(head));
    size_t extra_len = extra ? strlen(extra) : 0;
    /* A HEAD answer announces the body's length but carries none. */
    size_t send_len = req->method == HTTP_HEAD ? 0 : body_len;
    req->resp_len = (size_t)hn + extra_len + 2 + send_len;
    req->resp = tk_malloc(req->resp_len);
    char *o = req->resp;
    memcpy(o, head, (size_t)hn);
    o += hn;
    if (extra_len) {
        memcpy(o, extra, extra_len);
        o += extra_len;
    }
    memcpy(o, "\r\n", 2);
    o += 2;
    if (send_len)
        memcpy(o, body, send_len);
    tk_free(req->body); /* no longer needed; keep memory per queued response low */
    req->body = NULL;
    req->body_len = req->body_cap = 0;
    conn_flush(c);
    if (c->n_deferred > 0 && !c->closing)
        conn_resume(c);
}

static void http_submit(struct http_req *req)
{
    if (req->is_write) {
        req->counted_write = true;
        req->conn->pending_writes++;
    }
    api_submit(req);
}

void http_dispatch(struct http_req *req)
{
    struct http_conn *c = req->conn;
    if (c->n_deferred > 0 || (!req->is_write && c->pending_writes > 0)) {
        req->deferred = true;
        c->n_deferred++;
        return;
    }
    http_submit(req);
}

/* Submits the held-back requests that may go now, in queue order. A
 * submission may answer at once (and come back here): then walk again. */
static void conn_resume(struct http_conn *c)
{
    if (c->resuming) {
        c->resume_again = true;
        return;
    }
    c->resuming = true;
    do {
        c->resume_again = false;
        bool blocked = false, write_pending = false;
        for (struct http_req *r = c->head; r != NULL && !c->closing; r = r->next) {
            if (r->deferred) {
                if (blocked || (!r->is_write && write_pending)) {
                    blocked = true;
                    continue;
                }
                r->deferred = false;
                c->n_deferred--;
                http_submit(r);
                if (c->resume_again)
                    break;
            }
            if (r->is_write && !r->done)
                write_pending = true;
        }
    } while (c->resume_again && !c->closing);
    c->resuming = false;
}

void http_respond_error(struct http_req *req, int status, const char *code,
                        const char *extra, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct jbuf b;
    jbuf_init(&b, 128 + strlen(msg));
    jbuf_adds(&b, "{\"error\":{\"code\":");
    jbuf_jstr(&b, code, strlen(code));
    jbuf_adds(&b, ",\"message\":");
    /* Messages may quote client bytes: keep them valid JSON. */
    if (json_utf8_valid(msg, strlen(msg)))
        jbuf_jstr(&b, msg, strlen(msg));
    else
        jbuf_jstr(&b, "(message not valid UTF-8)", 25);
    jbuf_adds(&b, "}}\n");
    if (status == 400 || status == 413 || status == 431 || status == 414 || status == 408)
        req->gw->bad_requests++;
    http_respond(req, status, NULL, extra, b.p, b.len);
    jbuf_free(&b);
}

/* ---- writing ----------------------------------------------------------- */

static void on_written(uv_write_t *wr, int status)
{
    struct write_req *w = (struct write_req *)wr;
    struct http_conn *c = w->c;
    for (uint32_t i = 0; i < w->n; i++)
        req_free(w->reqs[i]);
    TK_ASSERT(c->inflight >= w->n);
    c->inflight -= w->n;
    bool close = w->close || status < 0;
    tk_free(w);
    if (c->closing)
        return;
    if (close) {
        conn_close(c);
        return;
    }
    if (c->read_done && c->inflight == 0 && c->cur == NULL) {
        /* The client half-closed, or said Connection: close. */
        conn_close(c);
        return;
    }
    if (c->read_paused && !c->read_done &&
        c->inflight < c->gw->cfg.pipeline_max / 2 + 1) {
        c->read_paused = false;
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
            conn_close(c);
            return;
        }
    }
    if (c->inflight == 0 && c->phase == PH_IDLE)
        conn_timer_update(c);
}

static void conn_flush(struct http_conn *c)
{
    while (!c->closing && c->head && c->head->done) {
        struct write_req *w = tk_calloc(1, sizeof(*w));
        w->c = c;
        while (c->head && c->head->done && w->n < WRITE_BUFS) {
            struct http_req *r = c->head;
            c->head = r->next;
            if (c->head == NULL)
                c->tail = NULL;
            w->reqs[w->n] = r;
            w->bufs[w->n] = uv_buf_init(r->resp, (unsigned)r->resp_len);
            w->n++;
            if (r->close_after) {
                w->close = true;
                c->read_done = true;
                break;
            }
        }
        int rc = uv_write(&w->wr, (uv_stream_t *)&c->tcp, w->bufs, w->n, on_written);
        if (rc != 0) {
            for (uint32_t i = 0; i < w->n; i++)
                req_free(w->reqs[i]);
            c->inflight -= w->n;
            tk_free(w);
            conn_close(c);
            return;
        }
        if (w->close) {
            /* Requests after a closing response are never answered. */
            uv_read_stop((uv_stream_t *)&c->tcp);
            break;
        }
    }
}

/* ---- closing ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    struct http_conn *c = h->data;
    c->refs--;
    conn_maybe_free(c);
}

static void conn_close(struct http_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct gateway *gw = c->gw;
    if (c->prev)
        c->prev->next = c->next;
    else if (gw->conns == c)
        gw->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    if (c->rejecting)
        gw->n_rejecting--;
    else
        gw->n_conns--;
    if (gw->stopping && gw->conns == NULL && gw->stop_timer_open) {
        gw->stop_timer_open = false;
        uv_close((uv_handle_t *)&gw->stop_timer, on_stop_timer_closed);
    }
    /* Answered but unwritten requests go now; the others are held by the node
     * and are freed from http_respond. */
    struct http_req **pp = &c->head;
    c->tail = NULL;
    while (*pp) {
        struct http_req *r = *pp;
        if (r->done || r->deferred) {
            *pp = r->next;
            c->inflight--;
            if (r->deferred) {
                r->deferred = false;
                c->n_deferred--;
                c->refs--; /* it will never be answered */
            }
            req_free(r);
        } else {
            c->tail = r;
            pp = &r->next;
        }
    }
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* ---- parsing ----------------------------------------------------------- */

/* Fails the request being parsed: it is queued with an error response and
 * the connection closes after it. */
static void conn_fail(struct http_conn *c, int status, const char *code, const char *msg)
{
    c->read_done = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    struct http_req *r = c->cur ? c->cur : req_new(c);
    c->cur = NULL;
    r->keep_alive = false;
    r->close_after = true;
    conn_enqueue(c, r);
    http_respond_error(r, status, code, NULL, "%s", msg);
}

static int parse_fail(struct http_conn *c, int status, const char *code, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));
static int parse_fail(struct http_conn *c, int status, const char *code, const char *fmt,
                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof(c->err_msg), fmt, ap);
    va_end(ap);
    c->err_status = status;
    c->err_code = code;
    return -1;
}

static int count_header(struct http_conn *c, size_t len)
{
    c->header_bytes += len;
    if (c->header_bytes > c->gw->cfg.header_max)
        return parse_fail(c, 431, "header_too_large",
                          "request line and headers exceed %zu bytes",
                          c->gw->cfg.header_max);
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct http_conn *c = p->data;
    if (c->read_done || c->closing)
        return -1;
    c->cur = req_new(c);
    c->header_bytes = 0;
    c->hdr = HDR_OTHER;
    c->in_value = false;
    c->has_te = c->has_cl = c->expect_continue = false;
    c->hval_len = 0;
    c->phase = PH_HEADERS;
    c->phase_changes++;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    if (c->header_bytes + len > c->gw->cfg.header_max)
        return parse_fail(c, 414, "uri_too_long", "request URI exceeds %zu bytes",
                          c->gw->cfg.header_max);
    count_header(c, len);
    struct http_req *r = c->cur;
    r->url = tk_realloc(r->url, r->url_len + len + 1);
    memcpy(r->url + r->url_len, at, len);
    r->url_len += len;
    r->url[r->url_len] = 0;
    return 0;
}

static void header_done(struct http_conn *c)
{
    struct http_req *r = c->cur;
    if (!c->in_value)
        return;
    c->in_value = false;
    switch (c->hdr) {
    case HDR_CONTENT_TYPE: {
        /* application/json, optionally with parameters */
        size_t n = strlen("application/json");
        r->json_body = c->hval_len >= n &&
                       strncasecmp(c->hval, "application/json", n) == 0 &&
                       (c->hval_len == n || c->hval[n] == ';' || c->hval[n] == ' ');
        break;
    }
    case HDR_EXPECT:
        c->expect_continue =
            c->hval_len == 12 && strncasecmp(c->hval, "100-continue", 12) == 0;
        break;
    default:
        break;
    }
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    if (count_header(c, len) != 0)
        return -1;
    if (c->in_value) {
        header_done(c);
        c->hval_len = 0;
        c->hdr = HDR_OTHER;
        c->hval[0] = 0;
        /* The name arrives fresh: reuse hval to collect it. */
    }
    /* Collect the name into hval (names we care about are short). */
    if (c->hval_len + len < sizeof(c->hval)) {
        memcpy(c->hval + c->hval_len, at, len);
        c->hval_len += len;
    } else {
        c->hval_len = sizeof(c->hval); /* too long to be one of ours */
    }
    return 0;
}

static enum hdr classify(const char *name, size_t len)
{
    static const struct {
        const char *name;
        enum hdr h;
    } known[] = {
        {"content-type", HDR_CONTENT_TYPE},
        {"content-length", HDR_CONTENT_LENGTH},
        {"transfer-encoding", HDR_TRANSFER_ENCODING},
        {"idempotency-key", HDR_IDEMPOTENCY_KEY},
        {"expect", HDR_EXPECT},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strlen(known[i].name) == len && strncasecmp(known[i].name, name, len) == 0)
            return known[i].h;
    return HDR_OTHER;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    if (count_header(c, len) != 0)
        return -1;
    if (!c->in_value) {
        c->hdr =
            c->hval_len < sizeof(c->hval) ? classify(c->hval, c->hval_len) : HDR_OTHER;
        c->in_value = true;
        c->hval_len = 0;
        switch (c->hdr) {
        case HDR_CONTENT_LENGTH:
            c->has_cl = true;
            break;
        case HDR_TRANSFER_ENCODING:
            c->has_te = true;
            break;
        case HDR_IDEMPOTENCY_KEY:
            if (r->has_idem)
                return parse_fail(c, 400, "bad_header", "more than one Idempotency-Key");
            r->has_idem = true;
            r->idem_hash = 0xcbf29ce484222325ull;
            break;
        default:
            break;
        }
    }
    if (c->hdr == HDR_IDEMPOTENCY_KEY) {
        const uint8_t *s = (const uint8_t *)at;
        for (size_t i = 0; i < len; i++) {
            r->idem_hash ^= s[i];
            r->idem_hash *= 0x100000001b3ull;
        }
    }
    size_t room = sizeof(c->hval) - 1 - c->hval_len;
    size_t n = len < room ? len : room;
    memcpy(c->hval + c->hval_len, at, n);
    c->hval_len += n;
    c->hval[c->hval_len] = 0;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    struct gateway *gw = c->gw;
    header_done(c);
    c->hval_len = 0;
    if (p->http_major != 1)
        return parse_fail(c, 505, "http_version",
                          "only HTTP/1.0 and HTTP/1.1 are served");
    if (c->has_te && c->has_cl)
        return parse_fail(c, 400, "bad_framing",
                          "both Content-Length and Transfer-Encoding are present");
    if (c->has_te && !(p->flags & F_CHUNKED))
        return parse_fail(c, 400, "bad_framing",
                          "only Transfer-Encoding: chunked is supported");
    if (r->has_idem && r->idem_hash == 0)
        r->idem_hash = 1;
    r->method = p->method;
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > gw->cfg.body_max)
        return parse_fail(c, 413, "body_too_large", "body of %llu bytes exceeds %zu",
                          (unsigned long long)p->content_length, gw->cfg.body_max);
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > 0) {
        r->body_cap = (size_t)p->content_length;
        r->body = tk_malloc(r->body_cap);
    }
    if (c->expect_continue && c->head == NULL) {
        static char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        uv_buf_t b = uv_buf_init(cont, sizeof(cont) - 1);
        (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    }
    c->phase = PH_BODY;
    c->phase_changes++;
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    size_t max = c->gw->cfg.body_max;
    if (r->body_len + len > max)
        return parse_fail(c, 413, "body_too_large", "body exceeds %zu bytes", max);
    if (r->body_len + len > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap * 2 : 4096;
        while (cap < r->body_len + len)
            cap *= 2;
        if (cap > max)
            cap = max;
        r->body = tk_realloc(r->body, cap);
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    return 0;
}

/* A chunk is announced: refuse it before reading it if it cannot fit. */
static int on_chunk_header(http_parser *p)
{
    struct http_conn *c = p->data;
    size_t max = c->gw->cfg.body_max;
    if (p->content_length > max - c->cur->body_len)
        return parse_fail(c, 413, "body_too_large", "chunked body exceeds %zu bytes",
                          max);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct http_conn *c = p->data;
    struct http_req *r = c->cur;
    c->cur = NULL;
    r->keep_alive = http_should_keep_alive(p) != 0;
    c->phase = PH_IDLE;
    conn_enqueue(c, r);
    if (!r->keep_alive)
        c->read_done = true;
    api_handle(c->gw, r);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
};

/* ---- timers ------------------------------------------------------------ */

static void on_timer(uv_timer_t *t)
{
    struct http_conn *c = t->data;
    if (c->closing)
        return;
    if (c->phase == PH_IDLE || c->rejecting || c->read_done) {
        if (c->inflight == 0 || c->rejecting)
            conn_close(c);
        return;
    }
    c->gw->conns_timed_out++;
    conn_fail(c, 408, "timeout",
              c->phase == PH_HEADERS ? "request headers not received in time"
                                     : "request body not received in time");
}

static void conn_timer_update(struct http_conn *c)
{
    const struct gateway_config *cfg = &c->gw->cfg;
    if (c->closing)
        return;
    switch (c->phase) {
    case PH_HEADERS:
        uv_timer_start(&c->timer, on_timer, cfg->header_timeout_ms, 0);
        break;
    case PH_BODY:
        uv_timer_start(&c->timer, on_timer, cfg->body_timeout_ms, 0);
        break;
    default:
        if (c->inflight == 0)
            uv_timer_start(&c->timer, on_timer, cfg->idle_timeout_ms,
                           cfg->idle_timeout_ms);
        else
            uv_timer_stop(&c->timer);
        break;
    }
}

/* ---- reading ----------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct http_conn *c = h->data;
    (void)suggested;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = s->data;
    if (nread < 0) {
        /* The peer is gone, or half-closed after its requests: answer what
         * is in flight, then close (on_written). A request cut short has
         * nobody to answer to. */
        if (c->inflight == 0 || nread != UV_EOF) {
            conn_close(c);
        } else {
            c->read_done = true;
            uv_read_stop(s);
        }
        return;
    }
    if (nread == 0 || c->read_done || c->rejecting)
        return;
    uint32_t changes_before = c->phase_changes;
    size_t done =
        http_parser_execute(&c->parser, &parser_settings, buf->base, (size_t)nread);
    if (c->closing)
        return;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (!c->read_done && (e != HPE_OK || done != (size_t)nread)) {
        if (c->err_status != 0) {
            conn_fail(c, c->err_status, c->err_code, c->err_msg);
        } else if (e == HPE_HEADER_OVERFLOW) {
            conn_fail(c, 431, "header_too_large", "headers too large");
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg), "malformed HTTP: %s", http_errno_description(e));
            conn_fail(c, 400, "bad_http", msg);
        }
    } else if (c->read_done && c->cur != NULL) {
        /* Bytes after a final request: ignored. */
        req_free(c->cur);
        c->cur = NULL;
    }
    if (c->closing)
        return;
    if (c->phase_changes != changes_before || c->phase == PH_IDLE)
        conn_timer_update(c);
    if (!c->read_done && c->inflight >= c->gw->cfg.pipeline_max) {
        c->read_paused = true;
        uv_read_stop(s);
    }
}

/* ---- accepting --------------------------------------------------------- */

static void on_connection(uv_stream_t *server, int status)
{
    struct gateway *gw = server->data;
    if (status < 0 || gw->stopping)
        return;
    struct http_conn *c = tk_calloc(1, sizeof(*c));
    c->gw = gw;
    uv_tcp_init(gw->loop, &c->tcp);
    uv_timer_init(gw->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->refs = 2;
    c->next = gw->conns;
    if (gw->conns)
        gw->conns->prev = c;
    gw->conns = c;
    c->rejecting = gw->n_conns >= gw->cfg.conns_max;
    if (c->rejecting)
        gw->n_rejecting++;
    else
        gw->n_conns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    (void)uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    if (c->rejecting) {
        gw->conns_rejected++;
        if (gw->n_rejecting > REJECT_EXTRA) {
            conn_close(c);
            return;
        }
        char extra[64];
        snprintf(extra, sizeof(extra), "Retry-After: %u\r\n", gw->cfg.retry_after_s);
        struct http_req *r = req_new(c);
        r->keep_alive = false;
        conn_enqueue(c, r);
        /* Read (and discard) what the client sends, so closing does not
         * reset the connection before it reads the answer. */
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        uv_timer_start(&c->timer, on_timer, 1000, 0);
        http_respond_error(r, 503, "too_many_connections", extra,
                           "the server has %u connections open (its limit)",
                           gw->cfg.conns_max);
        return;
    }
    gw->conns_accepted++;
    c->phase = PH_IDLE;
    uv_timer_start(&c->timer, on_timer, gw->cfg.idle_timeout_ms, gw->cfg.idle_timeout_ms);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- lifecycle --------------------------------------------------------- */

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
}

int gateway_new(const struct gateway_config *c, struct gateway **out)
{
    if (c->host == NULL || c->key_max == 0 || c->key_max > 65535 || c->value_max == 0 ||
        c->body_max == 0 || c->value_max > c->body_max || c->header_max < 1024 ||
        c->conns_max == 0 || c->pipeline_max == 0 || c->header_timeout_ms == 0 ||
        c->body_timeout_ms == 0 || c->idle_timeout_ms == 0 || c->scan_limit_max == 0 ||
        c->scan_limit_default == 0 || c->scan_limit_default > c->scan_limit_max ||
        c->n_members > GATEWAY_MEMBERS_MAX)
        return TK_EINVAL;
    struct gateway *gw = tk_calloc(1, sizeof(*gw));
    gw->cfg = *c;
    gw->cfg.host = tk_strdup(c->host);
    gw->latency = tk_calloc(ROUTE_COUNT, sizeof(*gw->latency));
    for (int i = 0; i < ROUTE_COUNT; i++)
        tk_hist_init(&gw->latency[i]);
    gw->listen_rc = TK_EINVAL;
    snprintf(gw->listen_err, sizeof(gw->listen_err),
             "the node never started the gateway");
    *out = gw;
    return 0;
}

static void on_loop_start(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct gateway *gw = data;
    gw->node = n;
    gw->loop = loop;
    union {
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } addr;
    const char *host = gw->cfg.host;
    if (uv_ip4_addr(host, gw->cfg.port, &addr.v4) != 0 &&
        uv_ip6_addr(host, gw->cfg.port, &addr.v6) != 0) {
        gw->listen_rc = TK_EINVAL;
        snprintf(gw->listen_err, sizeof(gw->listen_err),
                 "HTTP listen address \"%s\" is not an IPv4 or IPv6 literal", host);
        return;
    }
    uv_tcp_init(loop, &gw->listener);
    gw->listener.data = gw;
    gw->listening = true;
    int rc = uv_tcp_bind(&gw->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&gw->listener, 511, on_connection);
    if (rc != 0) {
        gw->listen_rc = TK_EIO;
        snprintf(gw->listen_err, sizeof(gw->listen_err), "cannot listen on %s:%u: %s",
                 host, gw->cfg.port, uv_strerror(rc));
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&gw->listener, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            gw->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else
            gw->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    gw->listen_rc = 0;
    gw->listen_err[0] = 0;
}

static void on_stop_timer_closed(uv_handle_t *h)
{
    (void)h;
}

/* The grace period is over: cut whatever is left. */
static void on_stop_timer(uv_timer_t *t)
{
    struct gateway *gw = t->data;
    while (gw->conns)
        conn_close(gw->conns);
}

/* Stops accepting and closes idle connections at once. A connection with
 * requests in flight stops reading and stays open so that their answers
 * (the node fails them with TK_ESHUTDOWN right after this hook: 503) reach the
 * client; it closes after its last response, or when the grace timer fires. */
static void on_loop_stop(struct node *n, struct uv_loop_s *loop, void *data)
{
    struct gateway *gw = data;
    (void)n;
    gw->stopping = true;
    if (gw->listening) {
        gw->listening = false;
        uv_close((uv_handle_t *)&gw->listener, NULL);
    }
    struct http_conn *c = gw->conns;
    while (c) {
        struct http_conn *next = c->next;
        if (c->inflight == 0 || c->rejecting) {
            conn_close(c);
        } else {
            c->read_done = true;
            uv_read_stop((uv_stream_t *)&c->tcp);
            uv_timer_stop(&c->timer);
        }
        c = next;
    }
    if (gw->conns) {
        uv_timer_init(loop, &gw->stop_timer);
        gw->stop_timer.data = gw;
        gw->stop_timer_open = true;
        uv_timer_start(&gw->stop_timer, on_stop_timer, GATEWAY_STOP_GRACE_MS, 0);
    }
}

void gateway_hook(struct gateway *gw, struct node_options *o)
{
    o->on_loop_start = on_loop_start;
    o->on_loop_stop = on_loop_stop;
    o->hook_data = gw;
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
    return gw->port;
}

void gateway_free(struct gateway *gw)
{
    if (gw == NULL)
        return;
    /* The loop is gone; every connection was closed on it. */
    TK_ASSERT(gw->conns == NULL);
    tk_free((char *)(uintptr_t)gw->cfg.host);
    tk_free(gw->latency);
    tk_free(gw);
}
