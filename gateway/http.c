/* The gateway's HTTP/1.1 server (contract in http.h): libuv TCP +
 * http-parser, on one loop thread. It knows nothing of nodes or routes: each
 * complete request goes to the user's on_request callback (api.c), which
 * answers at once or later through http_respond.
 *
 * A connection parses whatever arrives; complete requests are queued in
 * arrival order. Responses are written strictly in request order
 * (pipelining): an answered request waits until every earlier one has
 * answered, then the run of answered requests at the head goes out in one
 * vectored write: uv_try_write first (a write the socket takes whole costs
 * no write request, callback or epoll_ctl), uv_write for what is left. A
 * connection's only request in flight is written from http_respond; with
 * pipelined ones in flight, the answers of one loop turn go together from
 * the server's prepare handle (flush_prep), before the loop waits again.
 * Requests and write requests come from bounded pools, and a small request's
 * URL, body and answer live in the request itself: no allocation per request
 * in steady state.
 *
 * Bounds: request line + headers <= header_max (431), body <= body_max (413),
 * requests in flight per connection <= pipeline_max (reading pauses above it,
 * so at most one more read buffer of requests is parsed), connections <=
 * conns_max (503 and close beyond it). Timers cut slow clients: from a
 * request's first byte to the end of its headers (header_timeout_ms), then to
 * the end of its body (body_timeout_ms), and between requests (idle_timeout_ms).
 * Per-connection state is struct http_conn. Bytes come in through on_read ->
 * conn_feed and go out through conn_write (and the one uv_try_write of
 * "100 Continue"): a TLS layer goes at those seams. Per-connection limits go
 * at accept (on_connection, conn_reject) and in conn_feed.
 *
 * Lifetime: a connection is freed when its two handles are closed and no
 * request of it is still unanswered (refs == 0). At http_server_stop every
 * connection is closed or drained; requests its user still holds are freed
 * when they are answered. */
#include <http_parser.h>
#include <malloc.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/log.h"
#include "gateway/http.h"
#include "gateway/json.h"
#include "tls/tls_uv.h"

#define RBUF_BYTES 16384
/* Idle connections parked (see "parked connections" below): a connection
 * with nothing in flight that read and wrote nothing for PARK_IDLE_MS leaves
 * the loop's epoll set for the server's own; a sweep every PARK_SWEEP_MS
 * parks at most PARK_SWEEP_MAX, and at most PARK_TURN_MAX are woken a turn. */
#define RBUF_POOL_MAX 256
#define PARK_IDLE_MS 1000
#define PARK_SWEEP_MS 100
#define PARK_SWEEP_MAX 512
#define PARK_TURN_MAX 256
#define WRITE_BUFS 16
/* A blob body (http_respond_blob) goes out in writes of at most this much, so
 * the write deadline runs per slice and a slow reader holds one slice in the
 * kernel's queue, not the whole body. */
#define BLOB_SLICE ((size_t)256 << 10)
#define REJECT_EXTRA 64   /* connections kept open only to send a 503 */
#define REQ_POOL_MAX 1024 /* free requests kept (about 1 KiB each) */
#define WR_POOL_MAX 256   /* free write requests kept */
/* Lingering close (conn_linger): a final error answer is followed by reading
 * and dropping what the client still sends, at most this many bytes and this
 * long, so a client that sends its whole body before it reads (a 64 MiB PUT
 * refused at its headers) reads the 413 instead of a reset. */
#define LINGER_BYTES ((size_t)128 << 20)
#define LINGER_MS 5000
/* Dropped bytes read per loop turn, all connections together: past it a
 * discarding connection waits for the next turn (read_prep). */
#define DISCARD_TURN_BYTES ((size_t)1 << 20)
#define DISCARD_READ_BYTES 65536
/* Connections accepted per loop turn (as transport/tcp.c's ACCEPT_TURN_MAX):
 * the rest wait in the listen queue for the next turn, so a burst of
 * thousands is never handled in one turn. */
#define ACCEPT_TURN_MAX 64
/* HTTPS handshakes in progress, defaults (http_config.tls_handshakes_max,
 * tls_handshakes_per_addr). */
#define HS_MAX_DEFAULT 256
#define HS_PER_ADDR_DEFAULT 16
/* Time spent driving handshakes (a ClientHello costs a key exchange and a
 * signature: about 0.5-2 ms on a busy VM) per loop turn, all connections
 * together: past it a connection's handshake waits for the next turn. */
#define HS_TURN_NS ((uint64_t)8 * 1000 * 1000)
/* After a storm (this many unfinished handshakes freed, and few left in
 * progress) malloc_trim(0) gives their memory back in the next turn: glibc
 * keeps freed memory in the loop thread's arena otherwise (256 handshakes
 * held 17 MiB that stayed). It walks the heaps: once per storm, not per
 * connection. */
#define HS_TRIM_AFTER 128
/* Large bodies handed to on_request per loop turn, all connections together:
 * body_max bytes beyond the first. The user parses a body (a 4 MiB JSON batch
 * costs 50-70 ms, also when it is refused after parsing): eight arriving
 * together made one turn of 370 ms. Past it, a request waits for the next
 * turn with its connection's parsing paused. Bodies under BIG_BODY never
 * wait. */
#define BIG_BODY ((size_t)64 << 10)

enum phase { PH_IDLE, PH_HEADERS, PH_BODY };

enum hdr {
    HDR_OTHER,
    HDR_CONTENT_TYPE,
    HDR_CONTENT_LENGTH,
    HDR_TRANSFER_ENCODING,
    HDR_DIGEST, /* http_config.digest_header */
    HDR_KEPT,   /* http_config.kept_header */
    HDR_EXPECT,
    HDR_ACCEPT,        /* accept_sse: names text/event-stream */
    HDR_LAST_EVENT_ID, /* last_event_id: a decimal (SSE resumption) */
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    struct http_server *srv;
    struct http_conn *prev, *next;
    http_parser parser;
    int refs; /* open handles + requests not yet answered */
    bool closing;
    bool read_paused;
    bool read_done; /* parse nothing more (error, Connection: close) */
    bool rejecting;
    int phase;
    uint32_t phase_changes;      /* re-arm the timer when this moves */
    uint32_t inflight;           /* requests parsed whose response is not yet written */
    uint32_t n_deferred;         /* requests held back by http_dispatch */
    uint32_t pending_writes;     /* dispatched writes not yet answered */
    size_t out_bytes;            /* response bytes handed to uv_write, not yet out */
    size_t resp_held;            /* response bytes built and not yet written out */
    bool write_timing;           /* the timer is the write deadline */
    uint64_t write_limit_ms;     /* the write deadline when set (0: the config's) */
    uint32_t rbuf_off, rbuf_len; /* bytes of rbuf not parsed yet (parser paused) */
    const char *hseg;   /* in the bytes being parsed: header bytes counted up to here */
    size_t body_expect; /* the request's Content-Length (0: none or chunked) */
    bool resuming, resume_again;
    bool flush_queued;             /* in the server's flush list (holds a ref) */
    struct http_conn *flush_next;  /* ... its next */
    bool budget_queued;            /* reads stopped by READ_TURN_BYTES (holds a ref) */
    struct http_conn *close_next;  /* closes put off past CLOSE_TURN_MAX (a ref) */
    struct http_conn *budget_next; /* ... the next such connection */
    struct http_request *head, *tail;
    struct http_request *cur;
    struct http_request *blob_req; /* writing a blob body; later answers wait */
    size_t header_bytes;
    enum hdr hdr;
    bool in_value;
    char hval[256];
    size_t hval_len;
    bool has_te, has_cl, expect_continue;
    int err_status; /* set by a callback that fails the parse */
    const char *err_code;
    char err_msg[160];
    EVP_MD_CTX *digest; /* SHA-256 of digest_header's value (made at first use) */
    bool parked;        /* in the server's park set, not reading (conn_park) */
    uint64_t active_ms; /* uv_now when it last read or wrote */
    struct tk_tls *tls; /* HTTPS: the session; rbuf then holds plaintext */
    bool tls_ready;     /* the handshake is done */
    /* HTTPS: a handshake in progress holds one of the server's slots
     * (tls_handshakes_max, and tls_handshakes_per_addr for its address). */
    bool in_hs;
    struct http_conn *hs_prev, *hs_next;
    uint8_t addr[16]; /* the peer's address (4 or 16 bytes) */
    uint8_t addr_len;
    /* Lingering close: after a final error answer (413...) the write side is
     * shut and what the client still sends is read and dropped, up to
     * LINGER_BYTES or LINGER_MS, so that closing with unread bytes does not
     * reset the connection before the client has read the answer. */
    bool linger;    /* close lingering once the final answer is out */
    bool lingering; /* discarding now (shutdown sent) */
    bool eof;       /* the client half-closed */
    /* A complete request whose on_request waits for the next turn (BIG_BODY);
     * parsing is paused behind it. */
    struct http_request *deliver_wait;
    size_t discarded;
    uv_shutdown_t shut;
    /* The bytes read and not yet parsed: a buffer of RBUF_BYTES from the
     * server's pool while it holds some (the parser paused) or a read or a
     * decryption is under way; NULL between them (rbuf_take, rbuf_drop). */
    char *rbuf;
    uint32_t feeding; /* conn_feed calls in progress (rbuf_drop waits) */
};

struct write_req {
    uv_write_t wr;
    struct http_conn *c;
    uint32_t n;  /* requests freed when the write is out */
    uint32_t nb; /* buffers */
    bool close;
    size_t bytes;
    struct http_request *stream; /* http_respond_blob: its body continues after */
    struct http_request *reqs[WRITE_BUFS];
    uv_buf_t bufs[WRITE_BUFS];
    char *sbuf;                /* a stream's bytes (bufs[0]; n is 0) */
    struct http_request *sreq; /* ... of this request */
    struct write_req *pool_next;
};

struct http_server {
    struct http_config cfg;
    struct http_callbacks cb;
    void *data;
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening;
    bool stopping;
    uv_timer_t stop_timer; /* grace period for answers at stop */
    bool stop_timer_open;
    uint16_t port;
    struct http_conn *conns; /* doubly linked */
    uint32_t n_conns;
    uint32_t n_rejecting;
    size_t mem_bytes; /* every request's body_cap + resp_len */
    /* Answers are written once per loop turn per connection: http_respond
     * queues the connection here and flush_prep writes each connection's
     * answers just before the loop next waits for events. */
    uv_prepare_t flush_prep;
    bool preps_open; /* flush_prep and read_prep: bound to the loop, not stopped */
    struct http_conn *flush_head;
    /* Bytes read in the loop turn of uv_now read_ms (READ_TURN_BYTES), and
     * the connections whose reads wait for the next turn (read_prep). */
    uint64_t read_ms;
    size_t read_turn;
    uv_prepare_t read_prep;
    /* Peers gone in one turn past CLOSE_TURN_MAX: closed from close_idle, that
     * many a turn (an idle handle: the loop polls without waiting meanwhile). */
    uv_idle_t close_idle;
    /* Keeps the loop from blocking while a request put off by BIG_BODY waits
     * for the next turn's read_prep (which then hands it over). */
    uv_idle_t deliver_idle;
    struct http_conn *close_head;
    uint64_t close_turn_ms;
    uint32_t closes_turn;
    struct http_conn *budget_head;
    /* Free requests and write requests, reused (bounded: REQ_POOL_MAX,
     * WR_POOL_MAX), so a request in steady state allocates nothing here. */
    struct http_request *req_pool;
    uint32_t n_req_pool;
    struct write_req *wr_pool;
    uint32_t n_wr_pool;
    uint64_t turn_ms;  /* uv_now of the loop turn turn_built counts */
    size_t turn_built; /* large response bytes built in that turn */
    /* Bytes read only to be dropped (lingering, rejected connections) in the
     * turn of uv_now discard_ms: at most DISCARD_TURN_BYTES. */
    uint64_t discard_ms;
    size_t discard_turn;
    /* Accepts in the turn of uv_now accept_ms (ACCEPT_TURN_MAX); past it the
     * next connection waits in the listen queue until read_prep. */
    uint64_t accept_ms;
    uint32_t accepted_turn;
    bool accept_waiting;
    /* HTTPS handshakes in progress (a list through hs_next). */
    struct http_conn *hs_head;
    uint32_t n_hs;
    uint64_t hs_ms, hs_turn_ns; /* handshake time in the turn of uv_now hs_ms */
    uint32_t hs_freed;          /* unfinished handshakes ended since the last trim */
    uint64_t big_ms;            /* the turn (uv_now) big_turn counts */
    size_t big_turn;            /* large body bytes handed to on_request in it */
    /* Read buffers no connection holds (RBUF_POOL_MAX at most, a list
     * through each one's first bytes): an idle connection holds none. */
    void *rbuf_pool;
    uint32_t n_rbuf_pool;
    /* Parked connections: their epoll set (-1: none, parking off), the
     * handle that sees it readable, the sweep that parks, how many now. */
    int park_fd;
    uv_poll_t park_poll;
    uv_timer_t park_timer;
    bool park_open;
    uint32_t n_parked;
    /* Where every TLS connection's ciphertext and every dropped byte is read
     * (consumed before on_read returns: one buffer for all connections). */
    char scratch[DISCARD_READ_BYTES];
    struct http_stats stats; /* conns_open is n_conns, filled on read */
};

static const char *http_reason(int status)
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
static void conn_unpark(struct http_conn *c);
static void conn_linger(struct http_conn *c);
static void on_timer(uv_timer_t *t);
static void on_read_prep(uv_prepare_t *h);
static void conn_flush(struct http_conn *c);
static void conn_flush_later(struct http_conn *c);
static void conn_resume(struct http_conn *c);
static void conn_timer_update(struct http_conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void conn_feed(struct http_conn *c, const char *data, size_t len);
static void conn_tls_drain(struct http_conn *c);

/* ---- requests ---------------------------------------------------------- */

static struct http_request *req_new(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    struct http_request *r = srv->req_pool;
    if (r != NULL) {
        srv->req_pool = r->pool_next;
        srv->n_req_pool--;
        /* The rooms are written before they are read: clear the rest. */
        memset(r, 0, offsetof(struct http_request, url_room));
    } else {
        r = tk_calloc(1, sizeof(*r));
    }
    r->conn = c;
    r->keep_alive = true;
    r->start_ns = uv_hrtime();
    return r;
}

/* A body's room from this size up is a blob (on_body). */
#define HTTP_BODY_BLOB_MIN ((size_t)128 << 10)

/* The request's body is no longer needed (answered): released at once, so
 * memory per queued answer stays low. */
static void req_body_release(struct http_request *r)
{
    if (r->body_blob != NULL)
        tk_blob_unref(r->body_blob);
    else if (r->body != r->body_room)
        tk_free(r->body);
    r->body_blob = NULL;
    r->body = NULL;
    r->body_len = r->body_cap = 0;
}

static void req_free(struct http_request *r)
{
    struct http_server *srv = r->conn->srv;
    srv->mem_bytes -= r->mem_bytes;
    if (r->resp != NULL)
        r->conn->resp_held -= r->resp_len;
    srv->cb.on_close(r, srv->data);
    tk_blob_unref(r->blob);
    tk_free(r->blob_tail);
    if (r->url != r->url_room)
        tk_free(r->url);
    req_body_release(r);
    if (r->resp != r->resp_room)
        tk_free(r->resp);
    tk_free(r->kept);
    tk_free(r->sbuf);
    if (srv->n_req_pool < REQ_POOL_MAX) {
        r->pool_next = srv->req_pool;
        srv->req_pool = r;
        srv->n_req_pool++;
    } else {
        tk_free(r);
    }
}

static struct write_req *wr_new(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    struct write_req *w = srv->wr_pool;
    if (w != NULL) {
        srv->wr_pool = w->pool_next;
        srv->n_wr_pool--;
        memset(w, 0, sizeof(*w));
    } else {
        w = tk_calloc(1, sizeof(*w));
    }
    w->c = c;
    return w;
}

/* Never after the connection is freed: w->c's server is the pool. */
static void wr_free(struct http_server *srv, struct write_req *w)
{
    if (srv->n_wr_pool < WR_POOL_MAX) {
        w->pool_next = srv->wr_pool;
        srv->wr_pool = w;
        srv->n_wr_pool++;
    } else {
        tk_free(w);
    }
}

/* Brings the server's count of held bytes up to date with r's. */
static void req_count_mem(struct http_request *r)
{
    struct http_server *srv = r->conn->srv;
    size_t now = r->body_cap + r->resp_len;
    srv->mem_bytes = srv->mem_bytes - r->mem_bytes + now;
    r->mem_bytes = now;
}

/* Would `more` bytes pass the server's memory budget? */
static bool over_budget(const struct http_server *srv, size_t more)
{
    return srv->cfg.mem_max != 0 && srv->mem_bytes + more > srv->cfg.mem_max;
}

static size_t conn_out_max(const struct http_server *srv)
{
    return srv->cfg.conn_out_max ? srv->cfg.conn_out_max : 2 * srv->cfg.body_max;
}

static void conn_enqueue(struct http_conn *c, struct http_request *r)
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

/* c's read buffer, from the pool (or the heap) if it holds none. */
static char *rbuf_take(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->rbuf == NULL) {
        if (srv->rbuf_pool != NULL) {
            c->rbuf = srv->rbuf_pool;
            memcpy(&srv->rbuf_pool, c->rbuf, sizeof(void *));
            srv->n_rbuf_pool--;
        } else {
            c->rbuf = tk_malloc(RBUF_BYTES);
        }
    }
    return c->rbuf;
}

/* c's read buffer back to the pool, unless it holds bytes to parse (or
 * `force`: c is being freed). 20,000 idle connections held 16 KiB each. */
static void rbuf_drop(struct http_conn *c, bool force)
{
    struct http_server *srv = c->srv;
    if (c->rbuf == NULL || ((c->rbuf_len > 0 || c->feeding > 0) && !force))
        return;
    if (srv->n_rbuf_pool < RBUF_POOL_MAX) {
        memcpy(c->rbuf, &srv->rbuf_pool, sizeof(void *));
        srv->rbuf_pool = c->rbuf;
        srv->n_rbuf_pool++;
    } else {
        tk_free(c->rbuf);
    }
    c->rbuf = NULL;
    c->rbuf_len = 0;
}

static void conn_maybe_free(struct http_conn *c)
{
    if (c->refs > 0)
        return;
    TK_ASSERT(c->closing);
    struct http_request *r = c->head;
    while (r) {
        struct http_request *next = r->next;
        req_free(r);
        r = next;
    }
    if (c->cur)
        req_free(c->cur);
    EVP_MD_CTX_free(c->digest);
    tk_tls_free(c->tls);
    if (c->blob_req)
        req_free(c->blob_req);
    rbuf_drop(c, true);
    tk_free(c);
}

/* An answer for a request of a closed connection: nobody will read it. */
static void req_drop_answered(struct http_conn *c, struct http_request *req)
{
    struct http_request **pp = &c->head, *prev = NULL;
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
}

/* Status line, fixed headers, the user's common and `extra` headers, the
 * blank line and the body, into req->resp: pieces copied from constants, no
 * printf (it showed in the profile, once per answer). */
static void req_build_response(struct http_request *req, int status,
                               const char *content_type, const char *common,
                               const char *extra, const void *body, size_t body_len,
                               size_t content_len)
{
    static const char json_ct[] = "Content-Type: application/json\r\n";
    static const char cl[] = "Content-Length: ";
    const char *reason = http_reason(status);
    size_t reason_len = strlen(reason);
    size_t ct_len = content_type ? strlen(content_type) : 0;
    size_t common_len = strlen(common);
    const char *conn = req->close_after ? "Connection: close\r\n"
                       : req->http10    ? "Connection: keep-alive\r\n"
                                        : "";
    size_t conn_len = strlen(conn);
    char digits[JSON_U64_MAX];
    size_t digits_len = json_u64(digits, content_len);
    TK_ASSERT(status >= 100 && status <= 999);
    size_t extra_len = extra ? strlen(extra) : 0;
    /* A HEAD answer announces the body's length but carries none. */
    size_t send_len = req->method == HTTP_HEAD ? 0 : body_len;
    size_t head_len = 9 + 3 + 1 + reason_len + 2 +
                      (content_type ? 14 + ct_len + 2 : sizeof(json_ct) - 1) +
                      sizeof(cl) - 1 + digits_len + 2 + common_len + conn_len;
    req->resp_len = head_len + extra_len + 2 + send_len;
    req->resp = req->resp_len <= sizeof(req->resp_room) ? req->resp_room
                                                        : tk_malloc(req->resp_len);
    char *o = req->resp;
#define PUT(p, n)                                                                        \
    do {                                                                                 \
        memcpy(o, (p), (n));                                                             \
        o += (n);                                                                        \
    } while (0)
    PUT("HTTP/1.1 ", 9);
    *o++ = (char)('0' + status / 100);
    *o++ = (char)('0' + status / 10 % 10);
    *o++ = (char)('0' + status % 10);
    *o++ = ' ';
    PUT(reason, reason_len);
    PUT("\r\n", 2);
    if (content_type) {
        PUT("Content-Type: ", 14);
        PUT(content_type, ct_len);
        PUT("\r\n", 2);
    } else {
        PUT(json_ct, sizeof(json_ct) - 1);
    }
    PUT(cl, sizeof(cl) - 1);
    PUT(digits, digits_len);
    PUT("\r\n", 2);
    PUT(common, common_len);
    PUT(conn, conn_len);
    TK_ASSERT((size_t)(o - req->resp) == head_len);
    if (extra_len)
        PUT(extra, extra_len);
    PUT("\r\n", 2);
    if (send_len)
        PUT(body, send_len);
#undef PUT
    TK_ASSERT((size_t)(o - req->resp) == req->resp_len);
}

/* Large answers built in one loop turn: at most body_max / 2 bytes beyond the
 * first (building them touches fresh memory: on a VM, page faults cost about
 * 10-30 ms a MiB, and the loop also runs Raft). */
static bool turn_full(struct http_server *srv, size_t len)
{
    uint64_t now = uv_now(srv->loop);
    if (now != srv->turn_ms) {
        srv->turn_ms = now;
        srv->turn_built = 0;
    }
    if (srv->turn_built > 0 && srv->turn_built + len > srv->cfg.body_max / 2)
        return true;
    srv->turn_built += len;
    return false;
}

bool http_overloaded(const struct http_request *req)
{
    const struct http_conn *c = req->conn;
    return c->resp_held >= conn_out_max(c->srv) || over_budget(c->srv, 0) ||
           turn_full(c->srv, 0);
}

bool http_would_overload(const struct http_request *req, size_t len)
{
    const struct http_conn *c = req->conn;
    const struct http_server *srv = c->srv;
    if (len <= 4096) /* http_respond takes small answers whatever the budgets */
        return http_overloaded(req);
    size_t built = uv_now(srv->loop) == srv->turn_ms ? srv->turn_built : 0;
    return over_budget(srv, len) || c->resp_held + len > conn_out_max(srv) ||
           (built > 0 && built + len > srv->cfg.body_max / 2);
}

void http_respond_overloaded(struct http_request *req)
{
    struct http_server *srv = req->conn->srv;
    char ra[64];
    snprintf(ra, sizeof(ra), "Retry-After: %u\r\n", srv->cfg.retry_after_s);
    req->keep_alive = false;
    srv->stats.overloaded++;
    http_respond_error(req, 503, "overloaded", ra,
                       "the server (or this connection) holds too many request and "
                       "response bytes; retry later");
}

void http_respond(struct http_request *req, int status, const char *content_type,
                  const char *extra, const void *body, size_t body_len)
{
    struct http_conn *c = req->conn;
    struct http_server *srv = c->srv;
    TK_ASSERT(!req->done);
    TK_ASSERT(!req->deferred);
    if (req->held) { /* answered off the loop: what waited behind it may go */
        req->held = false;
        c->n_deferred--;
    }
    if (body_len > 4096 && !c->closing &&
        (over_budget(srv, body_len) || c->resp_held + body_len > conn_out_max(srv) ||
         turn_full(srv, body_len))) {
        http_respond_overloaded(req); /* small instead, and close */
        return;
    }
    req->done = true;
    if (req->counted_write) {
        req->counted_write = false;
        c->pending_writes--;
    }
    if (c->closing) {
        (void)srv->cb.on_response(req, status, NULL, 0, srv->data);
        req_drop_answered(c, req);
        return;
    }
    char common[HTTP_EXTRA_HEADERS_MAX];
    size_t cn = srv->cb.on_response(req, status, common, sizeof(common), srv->data);
    TK_ASSERT(cn < sizeof(common));
    common[cn] = 0;
    c->refs--;
    if (!req->keep_alive || srv->stopping)
        req->close_after = true;
    req_build_response(req, status, content_type, common, extra, body, body_len,
                       body_len + (req->blob ? req->blob->len + req->blob_tail_len : 0));
    c->resp_held += req->resp_len;
    req_body_release(req); /* keep memory per queued response low */
    req_count_mem(req);
    conn_flush_later(c);
    if (c->n_deferred > 0 && !c->closing)
        conn_resume(c);
}

void http_respond_blob(struct http_request *req, int status, const char *content_type,
                       const char *extra, const void *head, size_t head_len,
                       struct tk_blob *blob, const void *tail, size_t tail_len)
{
    TK_ASSERT(head_len <= 4096);
    req->blob = tk_blob_ref(blob);
    if (tail_len > 0) {
        req->blob_tail = tk_malloc(tail_len);
        memcpy(req->blob_tail, tail, tail_len);
        req->blob_tail_len = tail_len;
    }
    http_respond(req, status, content_type, extra, head, head_len);
}

static void http_submit(struct http_request *req)
{
    if (req->is_write) {
        req->counted_write = true;
        req->conn->pending_writes++;
    }
    req->run_cb(req);
}

void http_hold(struct http_request *req)
{
    TK_ASSERT(!req->held && !req->deferred && !req->done);
    req->held = true;
    req->conn->n_deferred++; /* so that what follows waits behind it */
}

void http_dispatch(struct http_request *req, bool is_write, http_run_cb *cb)
{
    struct http_conn *c = req->conn;
    req->is_write = is_write;
    req->run_cb = cb;
    if (req->held) {
        req->held = false;
        if (!c->closing) { /* its place in order: held back, counted already */
            req->deferred = true;
            conn_resume(c);
            return;
        }
        c->n_deferred--; /* the connection is gone: it runs, its answer is dropped */
        http_submit(req);
        return;
    }
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
        for (struct http_request *r = c->head; r != NULL && !c->closing; r = r->next) {
            if (r->held) { /* its handler is not done: nothing overtakes it */
                blocked = true;
                continue;
            }
            if (r->deferred) {
                if (blocked || (!r->is_write && write_pending)) {
                    blocked = true;
                    continue;
                }
                r->deferred = false;
                c->n_deferred--;
                http_submit(r);
                /* An answer written at once may have failed and closed the
                 * connection, freeing r: nothing of it may be read then. */
                if (c->closing || c->resume_again)
                    break;
                if (r->held) /* held by its handler once submitted */
                    blocked = true;
            }
            if (r->is_write && !r->done)
                write_pending = true;
        }
    } while (c->resume_again && !c->closing);
    c->resuming = false;
}

void http_respond_error(struct http_request *req, int status, const char *code,
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
        req->conn->srv->stats.bad_requests++;
    http_respond(req, status, NULL, extra, b.p, b.len);
    jbuf_free(&b);
}

/* ---- streamed responses ------------------------------------------------ */

static void sbuf_add(struct http_request *req, const void *p, size_t len)
{
    if (req->sbuf_len + len > req->sbuf_cap) {
        size_t cap = req->sbuf_cap ? req->sbuf_cap : 1024;
        while (cap < req->sbuf_len + len)
            cap *= 2;
        req->sbuf = tk_realloc(req->sbuf, cap);
        req->sbuf_cap = cap;
    }
    memcpy(req->sbuf + req->sbuf_len, p, len);
    req->sbuf_len += len;
}

void http_stream_begin(struct http_request *req, int status, const char *content_type,
                       const char *extra, http_stream_gone_cb *gone, void *data)
{
    struct http_conn *c = req->conn;
    struct http_server *srv = c->srv;
    TK_ASSERT(!req->done);
    TK_ASSERT(!req->deferred);
    TK_ASSERT(!req->streaming);
    req->streaming = true;
    req->stream_gone = gone;
    req->stream_data = data;
    if (req->counted_write) {
        req->counted_write = false;
        c->pending_writes--;
    }
    char common[HTTP_EXTRA_HEADERS_MAX];
    size_t cn = srv->cb.on_response(req, status, c->closing ? NULL : common,
                                    c->closing ? 0 : sizeof(common), srv->data);
    if (c->closing) {
        req->stream_gone = NULL;
        gone(req, data); /* the owner ends it (http_stream_end) */
        return;
    }
    TK_ASSERT(cn < sizeof(common));
    common[cn] = 0;
    /* The stream is the connection's last answer: parse nothing after it (a
     * client's EOF still closes it, on_read). */
    c->read_done = true;
    char head[512 + HTTP_EXTRA_HEADERS_MAX];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nTransfer-Encoding: "
                      "chunked\r\nCache-Control: no-cache\r\n%s%s\r\n",
                      status, http_reason(status), content_type, common,
                      extra != NULL ? extra : "");
    TK_ASSERT(hn > 0 && (size_t)hn < sizeof(head));
    sbuf_add(req, head, (size_t)hn);
    req_body_release(req);
    req_count_mem(req);
    conn_flush(c);
}

int http_stream_write(struct http_request *req, const void *buf, size_t len)
{
    struct http_conn *c = req->conn;
    TK_ASSERT(req->streaming && !req->done);
    if (c->closing)
        return TK_ECLOSED;
    if (len == 0)
        return 0;
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    sbuf_add(req, size, (size_t)n);
    sbuf_add(req, buf, len);
    sbuf_add(req, "\r\n", 2);
    conn_flush(c);
    return c->closing ? TK_ECLOSED : 0;
}

size_t http_stream_pending(const struct http_request *req)
{
    /* What libuv still holds goes down byte by byte as the client reads
     * (stream_out only when a whole write is done). */
    size_t queued = req->conn->closing
                        ? 0
                        : uv_stream_get_write_queue_size((uv_stream_t *)&req->conn->tcp);
    return req->sbuf_len + (queued < req->stream_out ? queued : req->stream_out);
}

void http_stream_end(struct http_request *req)
{
    struct http_conn *c = req->conn;
    TK_ASSERT(req->streaming && !req->done);
    req->done = true;
    if (c->closing) {
        req_drop_answered(c, req);
        return;
    }
    sbuf_add(req, "0\r\n\r\n", 5);
    c->refs--;
    req->close_after = true;
    req->resp = req->sbuf;
    req->resp_len = req->sbuf_len;
    req->sbuf = NULL;
    req->sbuf_len = req->sbuf_cap = 0;
    c->resp_held += req->resp_len;
    req_count_mem(req);
    conn_flush(c);
}

void http_stream_end_within(struct http_request *req, uint64_t ms)
{
    struct http_conn *c = req->conn;
    if (!c->closing && ms > 0 && (c->write_limit_ms == 0 || ms < c->write_limit_ms)) {
        c->write_limit_ms = ms;
        c->write_timing = false; /* re-armed with the shorter deadline */
        conn_timer_update(c);
    }
    http_stream_end(req);
}

/* ---- writing ----------------------------------------------------------- */

/* Reading starts again after a pause (pipeline_max, conn_out_max): first the
 * bytes the paused parser left in rbuf, then the socket. */
static void conn_read_resume(struct http_conn *c)
{
    if (c->deliver_wait != NULL)
        return; /* read_prep resumes after handing it over */
    c->read_paused = false;
    if (HTTP_PARSER_ERRNO(&c->parser) == HPE_PAUSED) {
        http_parser_pause(&c->parser, 0);
        if (c->rbuf_len > 0) {
            uint32_t off = c->rbuf_off, n = c->rbuf_len;
            c->rbuf_len = 0;
            conn_feed(c, c->rbuf + off, n);
            rbuf_drop(c, false);
            if (c->closing || c->read_paused || c->read_done)
                return;
        }
    }
    if (c->tls != NULL) {
        conn_tls_drain(c); /* records already received come before the socket */
        if (c->closing || c->read_paused || c->read_done)
            return;
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

static void on_written(uv_write_t *wr, int status);
static int conn_write(struct http_conn *c, struct write_req *w);

/* The next slice of r's blob body (or its tail). Returns true if a write went
 * out; false once the body is done (r freed; the connection closed if r said
 * Connection: close) or the write failed (the connection closed). */
static bool blob_next(struct http_conn *c, struct http_request *r)
{
    const uint8_t *p = NULL;
    size_t len = 0;
    if (r->blob_off < r->blob->len) {
        p = r->blob->data + r->blob_off;
        len = r->blob->len - r->blob_off;
        if (len > BLOB_SLICE)
            len = BLOB_SLICE;
        r->blob_off += len;
    } else if (r->blob_tail_len > 0) {
        p = r->blob_tail;
        len = r->blob_tail_len;
        r->blob_tail_len = 0;
    }
    if (len == 0) {
        bool close = r->close_after;
        c->blob_req = NULL;
        c->inflight--;
        req_free(r);
        if (close)
            conn_close(c);
        return false;
    }
    struct write_req *w = wr_new(c);
    w->stream = r;
    w->bufs[0] = uv_buf_init((char *)p, (unsigned)len);
    w->nb = 1;
    w->bytes = len;
    if (conn_write(c, w) != 0) {
        wr_free(c->srv, w);
        conn_close(c); /* r goes with the connection (conn_maybe_free) */
        return false;
    }
    c->out_bytes += len;
    return true;
}

static void on_written(uv_write_t *wr, int status)
{
    struct write_req *w = (struct write_req *)wr;
    struct http_conn *c = w->c;
    for (uint32_t i = 0; i < w->n; i++)
        req_free(w->reqs[i]);
    TK_ASSERT(c->inflight >= w->n);
    c->inflight -= w->n;
    c->out_bytes -= w->bytes;
    if (w->sbuf != NULL) { /* a stream's: its request outlives the write */
        if (!c->closing)
            w->sreq->stream_out -= w->bytes;
        tk_free(w->sbuf);
    }
    bool close = w->close || status < 0;
    struct http_request *blob_req = w->stream;
    wr_free(c->srv, w);
    if (c->closing)
        return;
    c->active_ms = uv_now(c->srv->loop);
    if (close && status >= 0 && c->linger) {
        conn_linger(c);
        return;
    }
    if (close) {
        conn_close(c);
        return;
    }
    if (blob_req != NULL && !blob_next(c, blob_req)) {
        if (c->closing)
            return;
        conn_flush(c); /* the answers that waited behind the body */
        if (c->closing)
            return;
    }
    if (c->read_done && c->inflight == 0 && c->cur == NULL) {
        /* The client half-closed, or said Connection: close. */
        conn_close(c);
        return;
    }
    if (c->read_paused && !c->read_done &&
        c->inflight < c->srv->cfg.pipeline_max / 2 + 1 &&
        c->out_bytes < conn_out_max(c->srv) / 2) {
        conn_read_resume(c);
        if (c->closing)
            return;
    }
    /* Bytes went out: the write deadline starts again (or the idle timer). */
    if (c->phase == PH_IDLE || c->read_done) {
        c->write_timing = false;
        conn_timer_update(c);
    }
}

/* Sends w's buffers; on_written runs when they are out. The plaintext seam
 * on the way out: HTTPS encrypts here. */
static int conn_write(struct http_conn *c, struct write_req *w)
{
    unsigned nb = w->sbuf ? 1 : w->nb;
    if (c->tls != NULL)
        return tk_tls_uv_write(c->tls, (uv_stream_t *)&c->tcp, w->bufs, nb, &w->wr,
                               on_written);
    return uv_write(&w->wr, (uv_stream_t *)&c->tcp, w->bufs, nb, on_written);
}

/* Hands the bytes a stream at the head of the connection has built so far
 * to the socket. False if that failed (the connection is closed). */
static bool stream_flush(struct http_conn *c)
{
    struct http_request *r = c->head;
    struct write_req *w = wr_new(c);
    w->sbuf = r->sbuf;
    w->sreq = r;
    w->bytes = r->sbuf_len;
    w->bufs[0] = uv_buf_init(r->sbuf, (unsigned)r->sbuf_len);
    r->sbuf = NULL;
    r->sbuf_len = r->sbuf_cap = 0;
    if (conn_write(c, w) != 0) {
        tk_free(w->sbuf);
        wr_free(c->srv, w);
        conn_close(c);
        return false;
    }
    r->stream_out += w->bytes;
    c->out_bytes += w->bytes;
    return true;
}

/* Answers the client has taken whole, at once (uv_try_write wrote them): the
 * same as on_written for a write without a blob. False if the connection
 * closed. */
static bool conn_sent_now(struct http_conn *c, struct http_request **reqs, uint32_t n,
                          bool close)
{
    for (uint32_t i = 0; i < n; i++)
        req_free(reqs[i]);
    TK_ASSERT(c->inflight >= n);
    c->inflight -= n;
    if (close && c->linger) {
        conn_linger(c);
        return false;
    }
    if (close || (c->read_done && c->inflight == 0 && c->cur == NULL)) {
        conn_close(c);
        return false;
    }
    if (c->read_paused && !c->read_done &&
        c->inflight < c->srv->cfg.pipeline_max / 2 + 1 &&
        c->out_bytes < conn_out_max(c->srv) / 2) {
        conn_read_resume(c);
        if (c->closing)
            return false;
    }
    return true;
}

/* Hands w's buffers to the socket: first uv_try_write (plaintext, nothing
 * queued before: most answers leave here, with no write request, no
 * callback and no change to the poll set), then a uv_write of what is left.
 * Returns 0 (w taken, or freed when the client took it all; *sent_all then
 * true) or an error (w still the caller's). */
static int conn_write_try(struct http_conn *c, struct write_req *w, bool *sent_all)
{
    *sent_all = false;
    if (c->tls != NULL || w->stream != NULL ||
        uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > 0)
        return conn_write(c, w);
    int n = uv_try_write((uv_stream_t *)&c->tcp, w->bufs, w->nb);
    if (n < 0 && n != UV_EAGAIN)
        return n;
    size_t done = n > 0 ? (size_t)n : 0;
    if (done == w->bytes) {
        *sent_all = true;
        return 0;
    }
    /* The rest by uv_write: skip the buffers the kernel took. */
    uint32_t i = 0;
    while (done >= w->bufs[i].len) {
        done -= w->bufs[i].len;
        i++;
    }
    w->bufs[i].base += done;
    w->bufs[i].len -= (unsigned)done;
    if (i > 0)
        memmove(w->bufs, w->bufs + i, (w->nb - i) * sizeof(w->bufs[0]));
    w->nb -= i;
    w->bytes = 0;
    for (uint32_t k = 0; k < w->nb; k++)
        w->bytes += w->bufs[k].len;
    return conn_write(c, w);
}

static void conn_flush(struct http_conn *c)
{
    while (!c->closing && c->blob_req == NULL && c->head && c->head->done) {
        struct write_req *w = wr_new(c);
        while (c->head && c->head->done && w->nb < WRITE_BUFS) {
            struct http_request *r = c->head;
            c->head = r->next;
            if (c->head == NULL)
                c->tail = NULL;
            w->bufs[w->nb++] = uv_buf_init(r->resp, (unsigned)r->resp_len);
            w->bytes += r->resp_len;
            if (r->blob != NULL && r->method != HTTP_HEAD) {
                /* Its body follows in slices (on_written); nothing after it
                 * goes out before the body's end. */
                w->stream = r;
                c->blob_req = r;
                if (r->close_after)
                    c->read_done = true;
                break;
            }
            w->reqs[w->n++] = r;
            if (r->close_after) {
                w->close = true;
                c->read_done = true;
                break;
            }
        }
        bool sent_all;
        if (conn_write_try(c, w, &sent_all) != 0) {
            for (uint32_t i = 0; i < w->n; i++)
                req_free(w->reqs[i]);
            c->inflight -= w->n;
            wr_free(c->srv, w);
            conn_close(c);
            return;
        }
        if (sent_all) {
            bool close = w->close;
            bool open = conn_sent_now(c, w->reqs, w->n, close);
            wr_free(c->srv, w);
            if (!open)
                return;
            if (c->phase == PH_IDLE || c->read_done) {
                c->write_timing = false;
                conn_timer_update(c);
            }
            continue;
        }
        c->out_bytes += w->bytes;
        if (w->close) {
            /* Requests after a closing response are never answered. */
            uv_read_stop((uv_stream_t *)&c->tcp);
            break;
        }
    }
    if (c->closing)
        return;
    if (c->blob_req == NULL && c->head && !c->head->done && c->head->sbuf_len > 0 &&
        !stream_flush(c))
        return;
    /* A client that does not read: parse nothing more until it does. */
    if (!c->read_done && !c->read_paused && c->out_bytes >= conn_out_max(c->srv)) {
        c->read_paused = true;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
    if (c->out_bytes > 0 && (c->phase == PH_IDLE || c->read_done))
        conn_timer_update(c);
}

/* Just before the loop waits for events: every connection answered during
 * the turn writes its answers, all of them in one write. A flush may resume
 * a reader paused at its pipeline cap, whose buffered requests are parsed
 * and some answered at once, queued again here; a prepare handle started
 * from its own callback would run only after the loop's next wait for
 * events, so this goes round again while any are queued (a bounded number
 * of times: the buffered bytes are bounded too). */
#define FLUSH_ROUNDS 64
static void on_flush_prep(uv_prepare_t *h)
{
    struct http_server *srv = h->data;
    for (int round = 0; round < FLUSH_ROUNDS && srv->flush_head != NULL; round++) {
        struct http_conn *list = srv->flush_head;
        srv->flush_head = NULL;
        uv_prepare_stop(h);
        while (list != NULL) {
            struct http_conn *c = list;
            list = c->flush_next;
            c->flush_next = NULL;
            c->flush_queued = false;
            c->refs--;
            if (!c->closing)
                conn_flush(c);
            conn_maybe_free(c);
        }
    }
}

/* c has answers to write. The connection's only request in flight goes at
 * once (waiting for the turn's end only delays it: measured, 8 % more CPU
 * per put at 64 connections, from fewer writes per fsync); with pipelined
 * requests in flight, whose answers may come in this turn too, the turn's
 * end writes them together. At once as well when the server is stopping or
 * was never bound to a loop. */
static void conn_flush_later(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->closing)
        return;
    if (c->inflight <= 1 || !srv->preps_open || srv->stopping) {
        conn_flush(c);
        return;
    }
    if (c->flush_queued)
        return;
    c->flush_queued = true;
    c->refs++; /* c outlives its place in the list */
    c->flush_next = srv->flush_head;
    if (srv->flush_head == NULL)
        uv_prepare_start(&srv->flush_prep, on_flush_prep);
    srv->flush_head = c;
}

/* ---- closing ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    struct http_conn *c = h->data;
    c->refs--;
    conn_maybe_free(c);
}

/* The handshake is over (done, failed or cut): its slot is free. */
static void hs_leave(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (!c->in_hs)
        return;
    c->in_hs = false;
    if (c->hs_prev)
        c->hs_prev->hs_next = c->hs_next;
    else
        srv->hs_head = c->hs_next;
    if (c->hs_next)
        c->hs_next->hs_prev = c->hs_prev;
    c->hs_prev = c->hs_next = NULL;
    srv->n_hs--;
    if (!c->tls_ready && ++srv->hs_freed >= HS_TRIM_AFTER && srv->preps_open)
        uv_prepare_start(&srv->read_prep,
                         on_read_prep); /* the trim (no-op when started) */
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct http_conn *c = req->data;
    if (status < 0 && !c->closing)
        conn_close(c);
    c->refs--;
    conn_maybe_free(c);
}

/* The final answer is out: shut the write side (after the answer: libuv
 * shuts down once its write queue is empty) and read and drop what the client
 * still sends until it closes, LINGER_BYTES or LINGER_MS. Closing at once
 * with unread bytes makes the kernel reset the connection, and a client
 * still sending its body then gets the reset instead of the answer. */
static void conn_linger(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->closing)
        return;
    if (c->eof || srv->stopping || c->discarded >= LINGER_BYTES) {
        conn_close(c);
        return;
    }
    c->lingering = true;
    c->read_done = true;
    if (c->tls != NULL) {
        tk_tls_shutdown(c->tls); /* close_notify, then the TCP shutdown */
        (void)tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp);
    }
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    c->refs++; /* until on_shutdown */
    uv_timer_start(&c->timer, on_timer, LINGER_MS, 0);
    if (!c->budget_queued) {
        int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        if (rc != 0 && rc != UV_EALREADY)
            conn_close(c);
    }
}

static void conn_close(struct http_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct http_server *srv = c->srv;
    hs_leave(c);
    conn_unpark(c);
    if (c->prev)
        c->prev->next = c->next;
    else if (srv->conns == c)
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    if (c->rejecting)
        srv->n_rejecting--;
    else
        srv->n_conns--;
    if (srv->stopping && srv->conns == NULL && srv->stop_timer_open) {
        srv->stop_timer_open = false;
        uv_close((uv_handle_t *)&srv->stop_timer, on_stop_timer_closed);
    }
    /* Answered but unwritten requests go now; the others are held by the user
     * and are freed from http_respond. */
    struct http_request **pp = &c->head;
    c->tail = NULL;
    while (*pp) {
        struct http_request *r = *pp;
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
    /* Streams still held: their owners learn the connection is gone (the
     * handles' callbacks have not run yet, so c outlives this loop). */
    for (struct http_request *r = c->head; r != NULL;) {
        struct http_request *next = r->next;
        if (r->streaming && r->stream_gone != NULL) {
            http_stream_gone_cb *gone = r->stream_gone;
            r->stream_gone = NULL;
            gone(r, r->stream_data);
        }
        r = next;
    }
}

/* ---- parsing ----------------------------------------------------------- */

/* Fails the request being parsed: it is queued with an error response and
 * the connection closes after it. */
static void conn_fail(struct http_conn *c, int status, const char *code, const char *msg)
{
    c->read_done = true;
    c->linger = true; /* the client may still be sending: conn_linger */
    uv_read_stop((uv_stream_t *)&c->tcp);
    struct http_request *r = c->cur ? c->cur : req_new(c);
    c->cur = NULL;
    r->keep_alive = false;
    r->close_after = true;
    conn_enqueue(c, r);
    char ra[64] = "";
    if (status == 503) {
        snprintf(ra, sizeof(ra), "Retry-After: %u\r\n", c->srv->cfg.retry_after_s);
        c->srv->stats.overloaded++;
    }
    http_respond_error(r, status, code, ra[0] ? ra : NULL, "%s", msg);
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

/* Counts the header block up to at + len: the whole block, separators,
 * whitespace and line ends included (from c->hseg, where the last counted
 * bytes of this read ended; conn_feed counts a read's tail). */
static int count_header(struct http_conn *c, const char *at, size_t len)
{
    c->header_bytes += (size_t)(at + len - c->hseg);
    c->hseg = at + len;
    if (c->header_bytes > c->srv->cfg.header_max)
        return parse_fail(c, 431, "header_too_large",
                          "request line and headers exceed %zu bytes",
                          c->srv->cfg.header_max);
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
    if (c->header_bytes + (size_t)(at + len - c->hseg) > c->srv->cfg.header_max)
        return parse_fail(c, 414, "uri_too_long", "request URI exceeds %zu bytes",
                          c->srv->cfg.header_max);
    count_header(c, at, len);
    struct http_request *r = c->cur;
    size_t need = r->url_len + len + 1;
    if (r->url == NULL && need <= sizeof(r->url_room)) {
        r->url = r->url_room;
    } else if (r->url == r->url_room && need > sizeof(r->url_room)) {
        r->url = tk_malloc(need);
        memcpy(r->url, r->url_room, r->url_len);
    } else if (r->url != r->url_room) {
        r->url = tk_realloc(r->url, need);
    }
    memcpy(r->url + r->url_len, at, len);
    r->url_len += len;
    r->url[r->url_len] = 0;
    return 0;
}

static void header_done(struct http_conn *c)
{
    struct http_request *r = c->cur;
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
    case HDR_DIGEST:
        if (EVP_DigestFinal_ex(c->digest, r->digest, NULL) != 1)
            TK_UNREACHABLE(); /* SHA-256 in memory cannot fail */
        break;
    case HDR_ACCEPT:
        r->accept_sse = strstr(c->hval, "text/event-stream") != NULL;
        break;
    case HDR_LAST_EVENT_ID: {
        uint64_t v = 0;
        size_t i = 0;
        for (; i < c->hval_len && c->hval[i] >= '0' && c->hval[i] <= '9' && i < 19; i++)
            v = v * 10 + (uint64_t)(c->hval[i] - '0');
        r->has_last_event_id = i > 0 && i == c->hval_len;
        r->last_event_id = v;
        break;
    }
    default:
        break;
    }
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    if (c->phase == PH_BODY)
        return 0; /* a chunked body's trailer: ignored, never a header */
    if (count_header(c, at, len) != 0)
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

static enum hdr classify(const struct http_server *srv, const char *name, size_t len)
{
    static const struct {
        const char *name;
        enum hdr h;
    } known[] = {
        {"content-type", HDR_CONTENT_TYPE},
        {"content-length", HDR_CONTENT_LENGTH},
        {"transfer-encoding", HDR_TRANSFER_ENCODING},
        {"expect", HDR_EXPECT},
        {"accept", HDR_ACCEPT},
        {"last-event-id", HDR_LAST_EVENT_ID},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strlen(known[i].name) == len && strncasecmp(known[i].name, name, len) == 0)
            return known[i].h;
    const char *d = srv->cfg.digest_header;
    if (d != NULL && strlen(d) == len && strncasecmp(d, name, len) == 0)
        return HDR_DIGEST;
    const char *k = srv->cfg.kept_header;
    if (k != NULL && strlen(k) == len && strncasecmp(k, name, len) == 0)
        return HDR_KEPT;
    return HDR_OTHER;
}

/* kept_header's value, chunk by chunk; past HTTP_KEPT_MAX it is dropped. */
static void keep_value(struct http_request *r, const char *at, size_t len)
{
    if (r->kept_len + len > HTTP_KEPT_MAX) {
        tk_free(r->kept);
        r->kept = NULL;
        r->kept_len = 0;
        r->kept_too_long = true;
        return;
    }
    memcpy(r->kept + r->kept_len, at, len);
    r->kept_len += len;
    r->kept[r->kept_len] = 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_request *r = c->cur;
    if (c->phase == PH_BODY)
        return 0; /* a trailer's value */
    if (count_header(c, at, len) != 0)
        return -1;
    if (!c->in_value) {
        c->hdr = c->hval_len < sizeof(c->hval) ? classify(c->srv, c->hval, c->hval_len)
                                               : HDR_OTHER;
        c->in_value = true;
        c->hval_len = 0;
        switch (c->hdr) {
        case HDR_CONTENT_LENGTH:
            c->has_cl = true;
            break;
        case HDR_TRANSFER_ENCODING:
            c->has_te = true;
            break;
        case HDR_DIGEST:
            if (r->has_digest)
                return parse_fail(c, 400, "bad_header", "more than one %s",
                                  c->srv->cfg.digest_header);
            r->has_digest = true;
            if (c->digest == NULL && (c->digest = EVP_MD_CTX_new()) == NULL)
                TK_UNREACHABLE(); /* out of memory */
            if (EVP_DigestInit_ex(c->digest, EVP_sha256(), NULL) != 1)
                TK_UNREACHABLE();
            break;
        case HDR_KEPT:
            if (r->kept != NULL || r->kept_too_long)
                return parse_fail(c, 400, "bad_header", "more than one %s",
                                  c->srv->cfg.kept_header);
            r->kept = tk_malloc(HTTP_KEPT_MAX + 1);
            r->kept[0] = 0;
            break;
        default:
            break;
        }
    }
    if (c->hdr == HDR_DIGEST && EVP_DigestUpdate(c->digest, at, len) != 1)
        TK_UNREACHABLE();
    if (c->hdr == HDR_KEPT && r->kept != NULL)
        keep_value(r, at, len);
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
    struct http_request *r = c->cur;
    struct http_server *srv = c->srv;
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
    r->method = p->method;
    r->http10 = p->http_minor == 0;
    c->body_expect = (p->flags & F_CONTENTLENGTH) ? (size_t)p->content_length : 0;
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > srv->cfg.body_max)
        return parse_fail(c, 413, "body_too_large", "body of %llu bytes exceeds %zu",
                          (unsigned long long)p->content_length, srv->cfg.body_max);
    /* The body buffer grows as bytes arrive (on_body), never from a
     * Content-Length alone; the budget is asked for the announced size. */
    if ((p->flags & F_CONTENTLENGTH) && over_budget(srv, (size_t)p->content_length))
        return parse_fail(c, 503, "overloaded",
                          "the server holds too many request and response bytes; "
                          "retry later");
    if (c->expect_continue && c->head == NULL && c->blob_req == NULL) {
        /* Best effort, beside conn_write (a TLS layer must wrap it too). */
        static char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        uv_buf_t b = uv_buf_init(cont, sizeof(cont) - 1);
        if (c->tls != NULL && tk_tls_write(c->tls, cont, sizeof(cont) - 1) == 0)
            (void)tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp);
        else if (c->tls == NULL)
            (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    }
    c->phase = PH_BODY;
    c->phase_changes++;
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct http_conn *c = p->data;
    struct http_request *r = c->cur;
    size_t max = c->srv->cfg.body_max;
    if (r->body_len + len > max)
        return parse_fail(c, 413, "body_too_large", "body exceeds %zu bytes", max);
    if (r->body_len + len > r->body_cap) {
        /* Doubling from what arrived; a small announced body gets its exact
         * size at once (one allocation, as before), a large one grows with
         * its bytes (64 KiB first). */
        size_t expect = c->body_expect, need = r->body_len + len;
        size_t cap = r->body_cap                      ? r->body_cap * 2
                     : expect != 0 && expect <= 65536 ? expect
                                                      : 65536;
        while (cap < need)
            cap *= 2;
        if (expect >= need && cap > expect)
            cap = expect;
        if (cap > max)
            cap = max;
        if (over_budget(c->srv, cap - r->body_cap))
            return parse_fail(c, 503, "overloaded",
                              "the server holds too many request and response bytes; "
                              "retry later");
        if (r->body == NULL && cap <= sizeof(r->body_room)) {
            r->body = r->body_room;
        } else if (cap >= HTTP_BODY_BLOB_MIN) {
            /* From base's cache of big blobs: pages a freed body already
             * backed (a fresh one's first writes cost about a hundred times
             * a rewrite on a VM: 1,000 page faults for a 4 MB body). */
            struct tk_blob *b = tk_blob_new(cap);
            size_t had = r->body_len;
            if (had != 0)
                memcpy(b->data, r->body, had);
            req_body_release(r);
            r->body_blob = b;
            r->body = b->data;
            r->body_len = had;
        } else if (r->body == r->body_room && cap > sizeof(r->body_room)) {
            r->body = tk_malloc(cap);
            memcpy(r->body, r->body_room, r->body_len);
        } else if (r->body != r->body_room) {
            r->body = tk_realloc(r->body, cap);
        }
        r->body_cap = cap;
        req_count_mem(r);
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    c->hseg = at + len; /* a pipelined request's headers start after this */
    return 0;
}

/* A chunk is announced: refuse it before reading it if it cannot fit. */
static int on_chunk_header(http_parser *p)
{
    struct http_conn *c = p->data;
    size_t max = c->srv->cfg.body_max;
    if (p->content_length > max - c->cur->body_len)
        return parse_fail(c, 413, "body_too_large", "chunked body exceeds %zu bytes",
                          max);
    return 0;
}

/* Should a request with a body of len bytes wait for the next turn? */
static bool deliver_later(struct http_server *srv, size_t len)
{
    if (len < BIG_BODY || !srv->preps_open || srv->stopping)
        return false;
    uint64_t now = uv_now(srv->loop);
    if (srv->big_ms != now) {
        srv->big_ms = now;
        srv->big_turn = 0;
    }
    if (srv->big_turn > 0 && srv->big_turn + len > srv->cfg.body_max)
        return true;
    srv->big_turn += len;
    return false;
}

static void budget_enqueue(struct http_conn *c);

static int on_message_complete(http_parser *p)
{
    struct http_conn *c = p->data;
    struct http_request *r = c->cur;
    c->cur = NULL;
    r->keep_alive = http_should_keep_alive(p) != 0;
    c->phase = PH_IDLE;
    conn_enqueue(c, r);
    if (!r->keep_alive)
        c->read_done = true;
    if (deliver_later(c->srv, r->body_len)) {
        c->deliver_wait = r;
        c->srv->stats.requests_put_off++;
        http_parser_pause(p, 1);
        budget_enqueue(c);
        return 0;
    }
    c->srv->cb.on_request(r, c->srv->data);
    /* pipeline_max counts requests as they are parsed: stop parsing here, the
     * rest of the read waits in rbuf (conn_feed, conn_read_resume). */
    if (!c->closing && !c->read_done && c->inflight >= c->srv->cfg.pipeline_max)
        http_parser_pause(p, 1);
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
    if (c->in_hs) {
        /* The handshake's deadline: its slot, session and buffers go. */
        c->srv->stats.tls_handshake_timeouts++;
        conn_close(c);
        return;
    }
    if (c->out_bytes > 0 && (c->phase == PH_IDLE || c->read_done)) {
        /* Responses not drained within write_timeout_ms: a client that does
         * not read is cut off, with what it holds. */
        c->srv->stats.conns_timed_out++;
        conn_close(c);
        return;
    }
    if (c->phase == PH_IDLE || c->rejecting || c->read_done) {
        if (c->inflight == 0 || c->rejecting)
            conn_close(c);
        return;
    }
    c->srv->stats.conns_timed_out++;
    conn_fail(c, 408, "timeout",
              c->phase == PH_HEADERS ? "request headers not received in time"
                                     : "request body not received in time");
}

static void conn_timer_update(struct http_conn *c)
{
    const struct http_config *cfg = &c->srv->cfg;
    if (c->closing || c->lingering)
        return; /* lingering: LINGER_MS runs (conn_linger) */
    int phase = c->read_done ? PH_IDLE : c->phase;
    if (phase == PH_IDLE && c->inflight > 0 && c->out_bytes > 0) {
        /* The write deadline runs from the last progress (on_written). */
        if (!c->write_timing)
            uv_timer_start(&c->timer, on_timer,
                           c->write_limit_ms ? c->write_limit_ms : cfg->write_timeout_ms,
                           0);
        c->write_timing = true;
        return;
    }
    c->write_timing = false;
    switch (phase) {
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
            uv_timer_stop(&c->timer); /* waiting for the node: its deadline */
        break;
    }
}

/* ---- reading ----------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct http_conn *c = h->data;
    char *scratch = c->srv->scratch;
    (void)suggested;
    /* Bytes to drop, and TLS ciphertext (fed to the session before on_read
     * returns), go to the server's one scratch buffer. */
    if (c->read_done || c->rejecting)
        *buf = uv_buf_init(scratch, DISCARD_READ_BYTES);
    else
        *buf = uv_buf_init(c->tls != NULL ? scratch : rbuf_take(c), RBUF_BYTES);
}

/* Parses `len` bytes the client sent: every complete request goes to
 * on_request; a parse error answers and closes. The plaintext seam: a TLS
 * layer would decrypt between on_read and here. */
static void conn_feed(struct http_conn *c, const char *data, size_t len)
{
    uint32_t changes_before = c->phase_changes;
    c->hseg = data;
    c->feeding++; /* rbuf stays c's meanwhile (a callback may resume reads) */
    size_t done = http_parser_execute(&c->parser, &parser_settings, data, len);
    c->feeding--;
    if (c->closing)
        return;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (e == HPE_OK && c->phase == PH_HEADERS && !c->read_done &&
        count_header(c, data + done, 0) != 0)
        e = HPE_CB_header_value; /* the block passed header_max mid-read */
    if (e == HPE_PAUSED && !c->read_done) {
        /* pipeline_max reached mid-read (on_message_complete): keep the rest. */
        c->rbuf_off = (uint32_t)(data + done - c->rbuf);
        c->rbuf_len = (uint32_t)(len - done);
    } else if (!c->read_done && (e != HPE_OK || done != len)) {
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
    if (!c->read_done && (c->inflight >= c->srv->cfg.pipeline_max || e == HPE_PAUSED)) {
        c->read_paused = true;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
}

/* HTTPS: decrypts what was fed into rbuf and parses it, a record at a time,
 * until the session needs more bytes (a partial record waits in the session)
 * or parsing pauses; then sends what the session has to say (handshake). */
static void conn_tls_drain(struct http_conn *c)
{
    while (!c->closing && !c->read_paused && !c->read_done) {
        ssize_t n = tk_tls_read(c->tls, rbuf_take(c), RBUF_BYTES);
        if (n == 0)
            break;
        if (n == TK_ECLOSED && c->inflight > 0) {
            c->read_done = true; /* close_notify after requests: answer them */
            uv_read_stop((uv_stream_t *)&c->tcp);
            break;
        }
        if (n < 0) {
            if (n != TK_ECLOSED)
                c->srv->stats.tls_failed++;
            (void)tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp); /* the alert */
            conn_close(c);
            return;
        }
        conn_feed(c, c->rbuf, (size_t)n);
    }
    rbuf_drop(c, false);
    if (c->closing)
        return;
    if (!c->tls_ready && tk_tls_handshake_done(c->tls)) {
        c->tls_ready = true; /* the handshake deadline gives way to idle's */
        hs_leave(c);
        conn_timer_update(c);
    }
    if (tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp) != 0)
        conn_close(c);
}

static void read_wait_turn(struct http_conn *c);

/* Decrypts what c was fed; a handshake step only while the turn's
 * HS_TURN_NS lasts, else c waits for the next turn (read_prep steps it). */
static void conn_tls_step(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->tls_ready) {
        conn_tls_drain(c);
        return;
    }
    uint64_t now = uv_now(srv->loop);
    if (srv->hs_ms != now) {
        srv->hs_ms = now;
        srv->hs_turn_ns = 0;
    }
    if (srv->hs_turn_ns >= HS_TURN_NS && srv->preps_open && !srv->stopping &&
        !c->read_paused) {
        read_wait_turn(c);
        return;
    }
    uint64_t t0 = uv_hrtime();
    conn_tls_drain(c);
    srv->hs_turn_ns += uv_hrtime() - t0;
}

static void conn_tls_in(struct http_conn *c, const char *data, size_t len)
{
    if (tk_tls_feed(c->tls, data, len) != 0) {
        conn_close(c);
        return;
    }
    conn_tls_step(c);
}

/* Bytes that all connections together hand in per loop turn
 * (http_config.read_turn_bytes' default). libuv goes on
 * reading a socket while it has data (32 reads of RBUF_BYTES), so many
 * clients uploading big values put tens of MiB through one turn: 256
 * connections of 1 MB puts held a leader's loop 171 ms (160 on the CPU,
 * copying and faulting in the bodies) against a 200 ms election timeout.
 * Past the budget, a connection that reads stops until the next turn
 * (read_prep, which runs before the loop polls again) and the kernel's
 * socket buffer holds the rest; a turn is a uv_now millisecond, as for the
 * transport's read_turn_bytes. Small requests never come near it. */
#define READ_TURN_BYTES (4u << 20)

static void accept_one(struct http_server *srv);

/* The next turn: the connections stopped by READ_TURN_BYTES (or
 * DISCARD_TURN_BYTES) read again, and a connection left in the listen queue
 * by ACCEPT_TURN_MAX is accepted (its uv_accept makes libuv watch the
 * listener again). */
static void on_deliver_idle(uv_idle_t *h)
{
    uv_idle_stop(h); /* the loop came round: read_prep runs next */
}

static void on_read_prep(uv_prepare_t *h)
{
    struct http_server *srv = h->data;
    struct http_conn *list = srv->budget_head;
    srv->budget_head = NULL;
    uv_prepare_stop(h);
    /* A turn ends here: the bodies put off in the last one are handed over
     * now, the first of them whatever its size. (Counting turns by uv_now's
     * millisecond alone, a body put off again in the same millisecond waited
     * for the loop's next event: on a quiet server, its timers' seconds.) */
    srv->big_ms = uv_now(srv->loop);
    srv->big_turn = 0;
    uint32_t hs_max =
        srv->cfg.tls_handshakes_max ? srv->cfg.tls_handshakes_max : HS_MAX_DEFAULT;
    if (srv->hs_freed >= HS_TRIM_AFTER && srv->n_hs <= hs_max / 16) {
        /* The storm's sessions were freed when their handles closed, at the
         * end of the last turn. */
        srv->hs_freed = 0;
        (void)malloc_trim(0);
        srv->stats.mem_trims++;
    }
    if (srv->accept_waiting && !srv->stopping) {
        srv->accept_waiting = false;
        srv->accept_ms = uv_now(srv->loop);
        srv->accepted_turn = 0;
        accept_one(srv);
    }
    while (list != NULL) {
        struct http_conn *c = list;
        list = c->budget_next;
        c->budget_next = NULL;
        c->budget_queued = false;
        c->refs--;
        if (c->deliver_wait != NULL) {
            struct http_request *r = c->deliver_wait;
            if (c->closing) {
                /* Never handed over: freed with its connection (may free c). */
                c->deliver_wait = NULL;
                req_drop_answered(c, r);
                continue;
            }
            if (deliver_later(srv, r->body_len)) {
                budget_enqueue(c);
                uv_idle_start(&srv->deliver_idle, on_deliver_idle); /* no blocking */
                conn_maybe_free(c);
                continue;
            }
            c->deliver_wait = NULL;
            srv->cb.on_request(r, srv->data);
            if (!c->closing && c->read_paused && !c->read_done &&
                c->inflight < srv->cfg.pipeline_max)
                conn_read_resume(c);
            conn_maybe_free(c);
            continue;
        }
        if (!c->closing && c->tls != NULL && !c->tls_ready && !c->read_done &&
            !c->read_paused) {
            conn_tls_step(c); /* a handshake put off by HS_TURN_NS */
            if (c->budget_queued) {
                conn_maybe_free(c);
                continue;
            }
        }
        if (!c->closing && !c->read_paused &&
            (!c->read_done || c->lingering || c->rejecting)) {
            /* (Reading already if a pause of its own ended meanwhile.) */
            int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
            if (rc != 0 && rc != UV_EALREADY)
                conn_close(c);
        }
        conn_maybe_free(c);
    }
}

static void read_budget(struct http_conn *c, size_t n)
{
    struct http_server *srv = c->srv;
    uint64_t now = uv_now(srv->loop);
    if (srv->read_ms != now) {
        srv->read_ms = now;
        srv->read_turn = 0;
    }
    srv->read_turn += n;
    size_t budget = srv->cfg.read_turn_bytes ? srv->cfg.read_turn_bytes : READ_TURN_BYTES;
    if (srv->read_turn < budget || c->read_done)
        return;
    read_wait_turn(c);
}

/* Bytes read only to be dropped (a lingering close, a rejected connection,
 * bytes after a final request): they count against LINGER_BYTES and the
 * turn's DISCARD_TURN_BYTES, so a client sending fast cannot make a long
 * turn of them. */
static void conn_discard(struct http_conn *c, size_t n)
{
    struct http_server *srv = c->srv;
    c->discarded += n;
    srv->stats.discarded_bytes += n;
    if (c->discarded >= LINGER_BYTES) {
        if (c->lingering || c->rejecting)
            conn_close(c);
        else
            uv_read_stop((uv_stream_t *)&c->tcp); /* conn_linger then closes */
        return;
    }
    uint64_t now = uv_now(srv->loop);
    if (srv->discard_ms != now) {
        srv->discard_ms = now;
        srv->discard_turn = 0;
    }
    srv->discard_turn += n;
    if (srv->discard_turn >= DISCARD_TURN_BYTES)
        read_wait_turn(c);
}

/* c stops reading until the next turn (read_prep). */
static void read_wait_turn(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (!srv->preps_open || srv->stopping || c->closing || c->read_paused ||
        c->budget_queued)
        return;
    budget_enqueue(c);
}

/* c reads (or is handed its request: deliver_wait) in the next turn. */
static void budget_enqueue(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->budget_queued)
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->budget_queued = true;
    c->refs++; /* c outlives its place in the list */
    c->budget_next = srv->budget_head;
    uv_prepare_start(&srv->read_prep, on_read_prep); /* (no-op when started) */
    srv->budget_head = c;
    srv->stats.reads_paused++;
}

/* Closing a connection costs the loop about 15 us (two system calls and
 * the frees): 20,000 clients leaving at once made one 300-800 ms turn. At
 * most this many peers that left are closed a turn; the rest stop reading
 * and wait in close_head for the next turns. */
#define CLOSE_TURN_MAX 256

static bool close_budget_take(struct http_server *srv)
{
    uint64_t now = uv_now(srv->loop);
    if (now != srv->close_turn_ms) {
        srv->close_turn_ms = now;
        srv->closes_turn = 0;
    }
    if (srv->closes_turn >= CLOSE_TURN_MAX)
        return false;
    srv->closes_turn++;
    return true;
}

static void on_close_idle(uv_idle_t *h)
{
    struct http_server *srv = h->data;
    srv->close_turn_ms = uv_now(srv->loop);
    srv->closes_turn = 0;
    while (srv->close_head != NULL && (srv->stopping || close_budget_take(srv))) {
        struct http_conn *c = srv->close_head;
        srv->close_head = c->close_next;
        c->close_next = NULL;
        c->refs--;
        conn_close(c);
        conn_maybe_free(c);
    }
    if (srv->close_head == NULL)
        uv_idle_stop(h);
}

/* The peer left: close now, or in a later turn past CLOSE_TURN_MAX. */
static void conn_close_gone(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    if (c->closing || srv->stopping || close_budget_take(srv)) {
        conn_close(c);
        return;
    }
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    c->read_done = true;
    c->refs++;
    c->close_next = srv->close_head;
    srv->close_head = c;
    srv->stats.closes_deferred++;
    uv_idle_start(&srv->close_idle, on_close_idle); /* (no-op when started) */
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = s->data;
    if (nread <= 0)
        rbuf_drop(c, false); /* (what on_alloc took, if anything) */
    if (nread < 0) {
        /* The peer is gone, or half-closed after its requests: answer what
         * is in flight, then close (on_written). A request cut short has
         * nobody to answer to. */
        if (c->lingering || c->inflight == 0 || nread != UV_EOF ||
            (c->head && c->head->streaming)) {
            conn_close_gone(c);
        } else {
            c->read_done = true;
            c->eof = true;
            uv_read_stop(s);
        }
        return;
    }
    if (nread == 0)
        return;
    c->active_ms = uv_now(c->srv->loop);
    if (c->read_done || c->rejecting) {
        conn_discard(c, (size_t)nread);
        return;
    }
    if (c->tls != NULL) {
        conn_tls_in(c, buf->base, (size_t)nread);
    } else {
        conn_feed(c, buf->base, (size_t)nread);
        rbuf_drop(c, false);
    }
    read_budget(c, (size_t)nread);
}

/* ---- parked connections ----------------------------------------------- */

/* Every readable connection costs the loop an event, a read and a callback
 * in the turn it shows up: 15,000 idle clients leaving at once made one
 * 180-310 ms turn of nothing but end-of-file reads (libuv takes up to 48 x
 * 1024 events in one poll), though their closes were spread over turns
 * (CLOSE_TURN_MAX). So a connection that has been idle PARK_IDLE_MS, with
 * nothing in flight, buffered or owed, stops reading and goes into the
 * server's own epoll set (park_fd), which the loop watches as one file
 * (park_poll). When it is readable, at most PARK_TURN_MAX of its ready
 * connections are taken a turn and read again (the rest the next turn: the
 * set stays readable): a burst of any size costs the loop PARK_TURN_MAX
 * wake-ups a turn. A parked connection's first request waits one turn more
 * and costs four epoll_ctl calls; an active one is never parked. Its timer
 * (the idle timeout) runs on, and conn_close takes it out of the set. */

static bool park_ok(const struct http_conn *c, uint64_t now)
{
    return !c->parked && !c->closing && !c->rejecting && !c->read_done &&
           !c->read_paused && !c->budget_queued && !c->lingering && !c->linger &&
           !c->in_hs && !c->flush_queued && c->close_next == NULL &&
           c->deliver_wait == NULL && c->head == NULL && c->cur == NULL &&
           c->inflight == 0 && c->out_bytes == 0 && c->phase == PH_IDLE &&
           c->rbuf_len == 0 && (c->tls == NULL || c->tls_ready) &&
           now - c->active_ms >= PARK_IDLE_MS;
}

static void conn_park(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(srv->park_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return; /* it stays on the loop */
    uv_read_stop((uv_stream_t *)&c->tcp);
    /* libuv leaves a stopped descriptor in its epoll set until an event
     * comes for it (then takes it out): the client leaving would still be an
     * event there. Out now; uv_read_start puts it back (libuv adds a
     * descriptor it stopped watching anew, and takes EEXIST as added). */
    (void)epoll_ctl(uv_backend_fd(srv->loop), EPOLL_CTL_DEL, fd, NULL);
    c->parked = true;
    srv->n_parked++;
    srv->stats.conns_parked++;
}

static void conn_unpark(struct http_conn *c)
{
    if (!c->parked)
        return;
    struct http_server *srv = c->srv;
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0)
        (void)epoll_ctl(srv->park_fd, EPOLL_CTL_DEL, fd, NULL);
    c->parked = false;
    srv->n_parked--;
}

static void on_park_sweep(uv_timer_t *t)
{
    struct http_server *srv = t->data;
    uint64_t now = uv_now(srv->loop);
    uint32_t parked = 0;
    for (struct http_conn *c = srv->conns; c != NULL && parked < PARK_SWEEP_MAX;
         c = c->next) {
        if (park_ok(c, now)) {
            conn_park(c);
            parked++;
        }
    }
}

static void on_park_ready(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct http_server *srv = h->data;
    struct epoll_event ev[PARK_TURN_MAX];
    int n = epoll_wait(srv->park_fd, ev, PARK_TURN_MAX, 0);
    for (int i = 0; i < n; i++) {
        struct http_conn *c = ev[i].data.ptr;
        conn_unpark(c);
        srv->stats.conns_unparked++;
        c->active_ms = uv_now(srv->loop);
        int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        if (rc != 0 && rc != UV_EALREADY)
            conn_close(c);
    }
}

/* Parking on, if the kernel gives an epoll set (else connections stay on
 * the loop, as before). */
static void park_open(struct http_server *srv)
{
    srv->park_fd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->park_fd < 0)
        return;
    if (uv_poll_init(srv->loop, &srv->park_poll, srv->park_fd) != 0) {
        close(srv->park_fd);
        srv->park_fd = -1;
        return;
    }
    srv->park_poll.data = srv;
    uv_timer_init(srv->loop, &srv->park_timer);
    srv->park_timer.data = srv;
    srv->park_open = true;
    uv_poll_start(&srv->park_poll, UV_READABLE, on_park_ready);
    uv_timer_start(&srv->park_timer, on_park_sweep, PARK_SWEEP_MS, PARK_SWEEP_MS);
    /* Neither keeps the loop alive on its own. */
    uv_unref((uv_handle_t *)&srv->park_poll);
    uv_unref((uv_handle_t *)&srv->park_timer);
}

static void on_park_closed(uv_handle_t *h)
{
    struct http_server *srv = h->data;
    close(srv->park_fd);
    srv->park_fd = -1;
}

/* At stop, after every connection left the set (conn_close). */
static void park_close(struct http_server *srv)
{
    if (!srv->park_open)
        return;
    srv->park_open = false;
    /* Connections still open (answers in their grace period) read again. */
    for (struct http_conn *c = srv->conns; c != NULL; c = c->next)
        conn_unpark(c);
    uv_close((uv_handle_t *)&srv->park_timer, NULL);
    uv_close((uv_handle_t *)&srv->park_poll, on_park_closed);
}

/* ---- accepting --------------------------------------------------------- */

/* Past conns_max: answer 503 and close (REJECT_EXTRA such connections at
 * most; beyond them, close at once). */
static void conn_reject(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    srv->stats.conns_rejected++;
    if (srv->n_rejecting > REJECT_EXTRA) {
        conn_close(c);
        return;
    }
    char extra[64];
    snprintf(extra, sizeof(extra), "Retry-After: %u\r\n", srv->cfg.retry_after_s);
    struct http_request *r = req_new(c);
    r->keep_alive = false;
    conn_enqueue(c, r);
    /* Read (and discard) what the client sends, so closing does not
     * reset the connection before it reads the answer. */
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    uv_timer_start(&c->timer, on_timer, 1000, 0);
    http_respond_error(r, 503, "too_many_connections", extra,
                       "the server has %u connections open (its limit)",
                       srv->cfg.conns_max);
}

/* At the connection limit, an idle keep-alive connection (no request in
 * flight, none being received) gives way to the new one: the oldest among
 * the IDLE_SCAN_MAX newest connections, so the scan stays bounded. */
#define IDLE_SCAN_MAX 1024
static void evict_idle(struct http_server *srv)
{
    struct http_conn *old = NULL;
    uint32_t seen = 0;
    for (struct http_conn *c = srv->conns; c != NULL && seen < IDLE_SCAN_MAX;
         c = c->next, seen++)
        if ((!c->rejecting && !c->closing && !c->read_done && c->phase == PH_IDLE &&
             c->inflight == 0 && c->cur == NULL) ||
            (c->lingering && !c->closing))
            old = c;
    if (old != NULL) {
        srv->stats.conns_evicted++;
        conn_close(old);
    }
}

/* HTTPS: may c start a handshake? Not past tls_handshakes_max in progress,
 * nor past tls_handshakes_per_addr from its address (the list holds at most
 * tls_handshakes_max: a bounded scan). If so c takes a slot until its
 * handshake ends (hs_leave). */
static bool hs_admit(struct http_conn *c)
{
    struct http_server *srv = c->srv;
    uint32_t max =
        srv->cfg.tls_handshakes_max ? srv->cfg.tls_handshakes_max : HS_MAX_DEFAULT;
    uint32_t per_addr = srv->cfg.tls_handshakes_per_addr
                            ? srv->cfg.tls_handshakes_per_addr
                            : HS_PER_ADDR_DEFAULT;
    if (srv->n_hs >= max)
        return false;
    if (!tk_tls_uv_peer_addr(&c->tcp, c->addr, &c->addr_len))
        return false;
    uint32_t same = 0;
    for (struct http_conn *o = srv->hs_head; o != NULL; o = o->hs_next)
        if (o->addr_len == c->addr_len && memcmp(o->addr, c->addr, c->addr_len) == 0 &&
            ++same >= per_addr)
            return false;
    c->in_hs = true;
    c->hs_next = srv->hs_head;
    if (srv->hs_head)
        srv->hs_head->hs_prev = c;
    srv->hs_head = c;
    srv->n_hs++;
    return true;
}

/* A connection waits in the listen queue. Past ACCEPT_TURN_MAX in this turn
 * it is left there: libuv then stops watching the listener until the next
 * uv_accept, which read_prep makes in the next turn. */
static void on_connection(uv_stream_t *server, int status)
{
    struct http_server *srv = server->data;
    if (status < 0 || srv->stopping)
        return;
    uint64_t now = uv_now(srv->loop);
    if (now != srv->accept_ms) {
        srv->accept_ms = now;
        srv->accepted_turn = 0;
    }
    if (srv->accepted_turn >= ACCEPT_TURN_MAX && srv->preps_open) {
        srv->accept_waiting = true;
        srv->stats.accepts_deferred++;
        uv_prepare_start(&srv->read_prep, on_read_prep); /* (no-op when started) */
        return;
    }
    accept_one(srv);
}

static void accept_one(struct http_server *srv)
{
    srv->accepted_turn++;
    if (srv->n_conns >= srv->cfg.conns_max)
        evict_idle(srv);
    struct http_conn *c = tk_calloc(1, sizeof(*c));
    c->srv = srv;
    c->active_ms = uv_now(srv->loop);
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->refs = 2;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    c->rejecting = srv->n_conns >= srv->cfg.conns_max;
    if (c->rejecting)
        srv->n_rejecting++;
    else
        srv->n_conns++;
    if (uv_accept((uv_stream_t *)&srv->listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    (void)uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    if (c->rejecting && srv->cfg.tls != NULL) {
        srv->stats.conns_rejected++; /* no 503 without a handshake: close */
        conn_close(c);
        return;
    }
    if (c->rejecting) {
        conn_reject(c);
        return;
    }
    if (srv->cfg.tls != NULL && !hs_admit(c)) {
        /* Over the handshake caps: closed before any TLS state exists. */
        srv->stats.tls_refused++;
        conn_close(c);
        return;
    }
    srv->stats.conns_accepted++;
    c->phase = PH_IDLE;
    uint64_t first_ms = srv->cfg.idle_timeout_ms;
    if (srv->cfg.tls != NULL) {
        /* The handshake must finish by its deadline (on_timer frees it). */
        c->tls = tk_tls_new(srv->cfg.tls, NULL);
        first_ms = srv->cfg.tls_handshake_timeout_ms ? srv->cfg.tls_handshake_timeout_ms
                                                     : srv->cfg.header_timeout_ms;
    }
    uv_timer_start(&c->timer, on_timer, first_ms, srv->cfg.idle_timeout_ms);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- lifecycle --------------------------------------------------------- */

struct http_server *http_server_new(const struct http_config *cfg,
                                    const struct http_callbacks *cb, void *data)
{
    TK_ASSERT(cb->on_request != NULL);
    TK_ASSERT(cb->on_response != NULL);
    TK_ASSERT(cb->on_close != NULL);
    struct http_server *srv = tk_calloc(1, sizeof(*srv));
    srv->cfg = *cfg;
    srv->cb = *cb;
    srv->data = data;
    srv->park_fd = -1;
    return srv;
}

int http_server_listen(struct http_server *srv, uv_loop_t *loop, const char *host,
                       uint16_t port, char *err, size_t err_cap)
{
    srv->loop = loop;
    union {
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } addr;
    if (uv_ip4_addr(host, port, &addr.v4) != 0 &&
        uv_ip6_addr(host, port, &addr.v6) != 0) {
        snprintf(err, err_cap,
                 "HTTP listen address \"%s\" is not an IPv4 or IPv6 literal", host);
        return TK_EINVAL;
    }
    uv_tcp_init(loop, &srv->listener);
    srv->listener.data = srv;
    srv->listening = true;
    uv_prepare_init(loop, &srv->flush_prep);
    srv->flush_prep.data = srv;
    uv_prepare_init(loop, &srv->read_prep);
    srv->read_prep.data = srv;
    uv_idle_init(loop, &srv->close_idle);
    srv->close_idle.data = srv;
    uv_idle_init(loop, &srv->deliver_idle);
    srv->deliver_idle.data = srv;
    srv->preps_open = true;
    park_open(srv);
    int rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot listen on %s:%u: %s", host, port, uv_strerror(rc));
        return TK_EIO;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            srv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else
            srv->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    if (err_cap > 0)
        err[0] = 0;
    return 0;
}

uint16_t http_server_port(const struct http_server *srv)
{
    return srv->port;
}

static void on_stop_timer_closed(uv_handle_t *h)
{
    (void)h;
}

/* The grace period is over: cut whatever is left. */
static void on_stop_timer(uv_timer_t *t)
{
    struct http_server *srv = t->data;
    while (srv->conns)
        conn_close(srv->conns);
}

void http_server_stop(struct http_server *srv)
{
    srv->stopping = true;
    if (srv->listening) {
        srv->listening = false;
        uv_close((uv_handle_t *)&srv->listener, NULL);
    }
    if (srv->preps_open) {
        /* What this turn answered goes now; from here on, answers go at once. */
        on_flush_prep(&srv->flush_prep);
        on_read_prep(&srv->read_prep);   /* their references go; reads end below */
        on_close_idle(&srv->close_idle); /* every close put off, now */
        srv->preps_open = false;
        uv_close((uv_handle_t *)&srv->flush_prep, NULL);
        uv_close((uv_handle_t *)&srv->read_prep, NULL);
        uv_close((uv_handle_t *)&srv->close_idle, NULL);
        uv_close((uv_handle_t *)&srv->deliver_idle, NULL);
    }
    park_close(srv);
    struct http_conn *c = srv->conns;
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
    if (srv->conns) {
        uv_timer_init(srv->loop, &srv->stop_timer);
        srv->stop_timer.data = srv;
        srv->stop_timer_open = true;
        uv_timer_start(&srv->stop_timer, on_stop_timer, HTTP_STOP_GRACE_MS, 0);
    }
}

void http_server_stats(const struct http_server *srv, struct http_stats *out)
{
    *out = srv->stats;
    out->conns_open = srv->n_conns;
    out->conns_parked_now = srv->n_parked;
    out->tls_handshakes = srv->n_hs;
    out->mem_bytes = srv->mem_bytes;
}

void http_server_free(struct http_server *srv)
{
    if (srv == NULL)
        return;
    /* The loop is gone; every connection was closed on it. */
    TK_ASSERT(srv->conns == NULL);
    while (srv->req_pool != NULL) {
        struct http_request *r = srv->req_pool;
        srv->req_pool = r->pool_next;
        tk_free(r);
    }
    while (srv->wr_pool != NULL) {
        struct write_req *w = srv->wr_pool;
        srv->wr_pool = w->pool_next;
        tk_free(w);
    }
    while (srv->rbuf_pool != NULL) {
        void *b = srv->rbuf_pool;
        memcpy(&srv->rbuf_pool, b, sizeof(void *));
        tk_free(b);
    }
    tk_free(srv);
}
