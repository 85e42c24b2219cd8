/* A plain HTTP/1.1 server (http.c): libuv TCP + http-parser on one loop. It
 * knows nothing of nodes, routes or the API: its user (api.c) hands it a
 * callbacks struct and gets each complete request, with a `void *data` the
 * user owns, as libuv's requests carry theirs.
 *
 * The contract:
 * - on_request runs once per complete request; the user answers it exactly
 *   once with http_respond (or http_respond_error), at once or later.
 * - on_response runs for every response, also for those the server makes
 *   itself (malformed HTTP, limits, timeouts, too many connections), where
 *   on_request never ran and req->data is NULL. It may add header lines.
 * - on_close runs once for every request the server frees (its response
 *   written, or its connection gone), req->data NULL if on_request never ran:
 *   the user frees req->data there. Never while the user still holds the
 *   request: one not yet answered is kept until http_respond.
 * - http_dispatch keeps a connection's pipelined requests in order: a read
 *   waits for the connection's earlier writes to be answered, and nothing
 *   overtakes a request held back.
 *
 * Responses go out strictly in request order, in vectored writes: at once
 * (uv_try_write) when the connection has one request in flight, else the
 * answers of one loop turn together, just before the loop waits again.
 *
 * Threads: every function, and every callback, runs on the loop thread
 * (except http_server_new and http_server_free, which run on the owner's
 * thread while the loop is not running the server).
 * Limits: request line + headers <= header_max (431; 414 for the URI alone),
 * body <= body_max (413), requests in flight per connection <= pipeline_max
 * (counted as each is parsed: parsing pauses), queued response bytes per
 * connection <= conn_out_max (reading pauses) and drained within
 * write_timeout_ms (else the connection closes), bodies + responses of all
 * connections <= mem_max (503 overloaded), connections <= conns_max (503 and
 * close; an idle keep-alive connection is closed first to make room). Each limit and
 * each timeout is per connection, in http.c: the place for later
 * per-connection limits and a TLS layer under the parser.
 * A final error answer (400, 408, 413, 431, 503 while parsing) closes lingering:
 * the write side is shut after it and what the client still sends is dropped
 * (128 MiB or 5 s at most, 1 MiB a loop turn over all connections), so a
 * client still sending its body reads the answer instead of a reset. At most
 * 64 connections are accepted per loop turn; HTTPS handshakes are capped
 * (tls_handshakes_max, tls_handshakes_per_addr: over them a connection is
 * closed as accepted), driven at most 8 ms a turn, and cut at
 * tls_handshake_timeout_ms. */
#ifndef TK_GATEWAY_HTTP_H
#define TK_GATEWAY_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define HTTP_STOP_GRACE_MS 2000
/* Room on_response has for its header lines. */
#define HTTP_EXTRA_HEADERS_MAX 256
#define HTTP_DIGEST_BYTES 32
#define HTTP_KEPT_MAX 1024
/* A request's own room (http_request): URL, body and answer up to these
 * sizes need no allocation. */
#define HTTP_URL_ROOM 128
#define HTTP_BODY_ROOM 256
#define HTTP_RESP_ROOM 512

struct http_server;
struct http_conn;
struct http_request;
struct tk_tls_ctx;

struct http_config {
    size_t body_max;
    size_t header_max;          /* request line + headers */
    uint32_t conns_max;         /* open connections */
    uint32_t pipeline_max;      /* requests in flight per connection */
    uint64_t header_timeout_ms; /* first byte to end of headers */
    uint64_t body_timeout_ms;   /* end of headers to end of body */
    uint64_t idle_timeout_ms;   /* keep-alive without a request */
    uint32_t retry_after_s;     /* Retry-After on the 503 past conns_max */
    uint64_t write_timeout_ms;  /* queued response bytes not drained: close */
    size_t conn_out_max;        /* queued response bytes per connection before
                                 * reading pauses (0: 2 x body_max) */
    size_t mem_max;         /* request bodies + responses of every connection; over it:
                             * 503 overloaded with Retry-After, closed (0: no limit) */
    size_t read_turn_bytes; /* bytes all connections together hand in per loop
                             * turn before reads wait for the next (0: 4 MiB) */
    /* A request header whose value the server digests as it arrives (any
     * length) into http_request.digest (SHA-256). A request with two is
     * refused (400 bad_header, and the connection closes). NULL: none. A
     * static string. */
    const char *digest_header;
    /* A request header whose value (up to HTTP_KEPT_MAX bytes) the server
     * keeps in http_request.kept; a longer one sets kept_too_long. A request
     * with two is refused as above. NULL: none. A static string. */
    const char *kept_header;
    /* HTTPS: every connection speaks TLS on this server context (tls/tls.h;
     * borrowed, it outlives the server). NULL: plain HTTP. */
    struct tk_tls_ctx *tls;
    /* HTTPS handshakes in progress: at most tls_handshakes_max in all (0:
     * 256) and tls_handshakes_per_addr from one client address (0: 16); a
     * connection over either is closed as it is accepted, before any TLS
     * state is made. A handshake not done within tls_handshake_timeout_ms
     * (0: header_timeout_ms) is closed and its slot and memory freed. */
    uint32_t tls_handshakes_max;
    uint32_t tls_handshakes_per_addr;
    uint64_t tls_handshake_timeout_ms;
};

/* A complete request has arrived: answer it exactly once (http_respond). */
typedef void http_request_cb(struct http_request *req, void *data);
/* A response with `status` is being queued for `req` (req->data NULL when
 * the server answers by itself). Writes header lines, each ending in "\r\n",
 * into hdr[0..cap) and returns their length (0: none). hdr is NULL (cap 0)
 * when the connection is gone and the response will not be sent. */
typedef size_t http_response_cb(struct http_request *req, int status, char *hdr,
                                size_t cap, void *data);
/* `req` is being freed: release req->data. */
typedef void http_close_cb(struct http_request *req, void *data);
/* http_dispatch: the request may run now. */
typedef void http_run_cb(struct http_request *req);

struct http_callbacks {
    http_request_cb *on_request;
    http_response_cb *on_response;
    http_close_cb *on_close;
};

/* One parsed request. Public fields are read-only for the user, except
 * `data`; they stay valid until on_close (body: until http_respond). */
struct http_request {
    void *data; /* the user's; NULL until on_request sets it */
    int method; /* enum http_method (http_parser.h) */
    char *url;  /* NUL-terminated; NULL if the request had none */
    size_t url_len;
    uint8_t *body; /* NULL when empty */
    size_t body_len;
    bool json_body;                    /* Content-Type: application/json */
    bool has_digest;                   /* the request has http_config.digest_header */
    uint8_t digest[HTTP_DIGEST_BYTES]; /* its value's SHA-256 */
    char *kept; /* http_config.kept_header's value, NUL-ended; NULL: none */
    size_t kept_len;
    bool kept_too_long; /* it had more than HTTP_KEPT_MAX bytes (kept: none) */
    uint64_t start_ns;  /* uv_hrtime() when the request began */
    bool accept_sse;    /* Accept names text/event-stream */
    bool has_last_event_id;
    uint64_t last_event_id; /* Last-Event-ID, a decimal */

    /* Private: http.c's. */
    struct http_conn *conn;
    struct http_request *next;
    size_t body_cap;
    http_run_cb *run_cb;
    bool keep_alive;
    bool is_write;      /* http_dispatch: a write the connection's reads wait for */
    bool deferred;      /* held back to keep the connection's order */
    bool held;          /* http_hold: its handler works off the loop */
    bool counted_write; /* counted in the connection's pending writes */
    bool done;
    bool close_after; /* Connection: close after this response */
    bool http10;      /* an HTTP/1.0 request (keep-alive must be said) */
    char *resp;
    size_t resp_len;
    struct tk_blob *body_blob; /* a body of HTTP_BODY_BLOB_MIN or more lives in one */
    struct tk_blob *blob;      /* http_respond_blob: the body's middle, by reference */
    size_t blob_off;           /* bytes of it handed to the socket */
    uint8_t *blob_tail;
    size_t blob_tail_len;
    size_t mem_bytes; /* body_cap + resp_len, counted in the server's */
    /* A streamed response (http_stream_*): bytes built, not yet handed to
     * the socket, and handed but not yet out. */
    bool streaming;
    char *sbuf;
    size_t sbuf_len, sbuf_cap, stream_out;
    void (*stream_gone)(struct http_request *req, void *data);
    void *stream_data;
    struct http_request *pool_next; /* in the server's pool of free requests */
    /* Room for the common case, so a request costs no allocation: its URL,
     * a small body and a small answer live here (larger ones on the heap). */
    char url_room[HTTP_URL_ROOM];
    uint8_t body_room[HTTP_BODY_ROOM];
    char resp_room[HTTP_RESP_ROOM];
};

/* Copies the config; keeps `cb` and `data`. Never fails (aborts on OOM). */
struct http_server *http_server_new(const struct http_config *cfg,
                                    const struct http_callbacks *cb, void *data);

/* Binds host:port (an IPv4 or IPv6 literal; port 0: ephemeral) and listens
 * on `loop`. Returns 0, TK_EINVAL (not an address literal) or TK_EIO (bind or
 * listen failed), with a message in err[0..err_cap). */
int http_server_listen(struct http_server *s, uv_loop_t *loop, const char *host,
                       uint16_t port, char *err, size_t err_cap);

/* The bound port (after http_server_listen). */
uint16_t http_server_port(const struct http_server *s);

/* Stops accepting and closes idle connections at once. A connection with
 * requests in flight stops reading and stays open so their answers reach the
 * client; it closes after its last response or after HTTP_STOP_GRACE_MS.
 * Responses queued from now on carry Connection: close. */
void http_server_stop(struct http_server *s);

/* After the loop has closed every connection (or if it never listened).
 * NULL is allowed. */
void http_server_free(struct http_server *s);

struct http_stats {
    uint64_t conns_open;
    uint64_t conns_accepted;
    uint64_t conns_rejected;         /* over conns_max */
    uint64_t conns_timed_out;        /* slow headers or body, or a client not reading */
    uint64_t overloaded;             /* answered 503 overloaded (mem_max) */
    uint64_t conns_evicted;          /* idle ones closed for a new one at conns_max */
    uint64_t mem_bytes;              /* bodies + responses held now */
    uint64_t bad_requests;           /* errors answered 400, 408, 413, 414 or 431 */
    uint64_t tls_failed;             /* TLS handshakes or records that failed (closed) */
    uint64_t reads_paused;           /* a connection's reads put off to the next loop
                                      * turn: the turn's read budget was spent */
    uint64_t tls_handshakes;         /* HTTPS handshakes in progress now */
    uint64_t tls_refused;            /* closed at accept: over tls_handshakes_max or
                                      * tls_handshakes_per_addr */
    uint64_t tls_handshake_timeouts; /* handshakes cut at their deadline */
    uint64_t accepts_deferred;       /* connections left in the listen queue for
                                      * the next loop turn (64 accepted per turn) */
    uint64_t discarded_bytes;        /* bytes read and dropped: after a final error
                                      * answer (lingering close), or refused */
    uint64_t mem_trims;              /* malloc_trim(0) after a handshake storm */
    uint64_t requests_put_off;       /* large-body requests handed over in a later
                                      * loop turn (body_max of them per turn) */
    uint64_t closes_deferred;        /* connections whose peer left, closed in a
                                      * later turn (256 closed per turn) */
    uint64_t conns_parked;           /* idle connections moved off the loop's epoll
                                      * set (after 1 s with nothing in flight) */
    uint64_t conns_unparked;         /* ... taken back, readable (256 a turn) */
    uint64_t conns_parked_now;       /* parked now */
};

void http_server_stats(const struct http_server *s, struct http_stats *out);

/* Queues the response of `req`: status, content type (NULL: JSON), `extra`
 * header lines (each ending in \r\n, may be NULL) and a body (copied). Sent
 * once every earlier request of the connection has answered. Exactly once
 * per request; `req` may be freed before this returns (its connection is
 * gone): do not touch it afterwards. */
void http_respond(struct http_request *req, int status, const char *content_type,
                  const char *extra, const void *body, size_t body_len);

/* http_respond with a body of `head` (copied, at most 4 KiB), then the bytes
 * of `blob` (a reference is taken: never copied, and not counted in mem_max,
 * as the blob is shared with its owner), then `tail` (copied). The blob goes
 * out in slices of 256 KiB, the write deadline running per slice; later
 * answers of the connection wait for its end. For large bodies that already
 * exist in memory (a backup's snapshot stream). */
struct tk_blob;
void http_respond_blob(struct http_request *req, int status, const char *content_type,
                       const char *extra, const void *head, size_t head_len,
                       struct tk_blob *blob, const void *tail, size_t tail_len);

/* Whether the connection of `req` already holds conn_out_max bytes of
 * responses, or the server its mem_max: a read should not be served (its
 * answer built) but answered with http_respond_overloaded. */
bool http_overloaded(const struct http_request *req);
/* Whether an answer of `len` bytes would be refused by http_respond (the
 * connection's conn_out_max, the server's mem_max, the turn's budget for
 * large answers): asked before building one of known bound, so nothing is
 * built and then thrown away. */
bool http_would_overload(const struct http_request *req, size_t len);
/* 503 overloaded with Retry-After; the connection closes after it. A large
 * response that would pass either bound is turned into this by http_respond. */
void http_respond_overloaded(struct http_request *req);

/* A JSON error {"error":{"code","message"}} through http_respond. */
void http_respond_error(struct http_request *req, int status, const char *code,
                        const char *extra, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Streamed responses (a watch): a long-lived answer in HTTP/1.1 chunked
 * transfer encoding. http_stream_begin starts it instead of http_respond
 * (status, content type, extra header lines as http_respond's); on_response
 * runs for it as for any answer. http_stream_write queues one chunk (copied;
 * len > 0) and returns 0, or TK_ECLOSED once the connection is gone. Bytes go
 * out once every earlier answer of the connection has; the connection reads
 * no further request (a streamed answer is its last) and closes after
 * http_stream_end, which ends the stream (the request may be freed before it
 * returns). http_stream_pending says how many bytes are queued and not yet
 * taken by the client (built, or still in libuv's write queue): the backpressure a caller
 * bounds (the server's write_timeout_ms still closes a connection whose client stops
 * reading). `gone` runs once if the connection closes first (the client left, or a write
 * failed); the caller must still call http_stream_end, from the callback or later. Loop
 * thread only, like the rest. */
typedef void http_stream_gone_cb(struct http_request *req, void *data);
void http_stream_begin(struct http_request *req, int status, const char *content_type,
                       const char *extra, http_stream_gone_cb *gone, void *data);
int http_stream_write(struct http_request *req, const void *buf, size_t len);
size_t http_stream_pending(const struct http_request *req);
void http_stream_end(struct http_request *req);
/* http_stream_end, and the connection's write deadline becomes `ms` (when
 * shorter): a stream cut for a client that takes nothing (a lagging watch)
 * gives its last bytes that long to go out, then the connection closes and
 * frees what it holds. */
void http_stream_end_within(struct http_request *req, uint64_t ms);

/* Runs cb(req) now, or later when the connection's order allows it (see
 * above); `is_write` says whether later reads must wait for this one's
 * answer. If the connection goes first, cb never runs (on_close does). */
void http_dispatch(struct http_request *req, bool is_write, http_run_cb *cb);

/* The request's handler needs time off the loop before it can dispatch (a
 * large body decoded on the thread pool): the connection's later requests
 * wait behind it, as behind a request held back, until its http_dispatch
 * (then it takes its place in order) or its http_respond. Called from the
 * run callback of a dispatched request, it makes that request a barrier:
 * what follows waits for its answer (a large write, which the node may
 * propose after writes submitted later: node.h's NODE_GATE_ENTRY_BYTES). */
void http_hold(struct http_request *req);

#endif
