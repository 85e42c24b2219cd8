/* A gRPC server for unary and bidirectional streaming calls: HTTP/2 from nghttp2
 * (cleartext h2c with prior knowledge, what gRPC clients use for insecure connections)
 * over a libuv TCP listener on a loop the caller runs. It knows nothing of etcd, nodes or
 * protobuf messages: it hands each call's one request message to the service
 * (grpc_callbacks) and sends the message or the status the service answers with.
 * etcdapi.c is its only user.
 *
 * The wire: a request is HEADERS (:method POST, :path /pkg.Service/Method,
 * content-type application/grpc...) then DATA holding messages, each a
 * 5-byte prefix (compressed flag, big-endian length) and the bytes; the
 * answer is HEADERS (:status 200), DATA with one message, and trailers
 * (grpc-status, grpc-message); a failure is one HEADERS frame with the
 * status ("trailers-only").
 *
 * Bounds (grpc_config): connections (past the cap a new one is closed at
 * accept), concurrent streams per connection (HTTP/2 SETTINGS; nghttp2
 * refuses more), header bytes per stream, a message's bytes (a larger
 * declared length is RESOURCE_EXHAUSTED before its bytes arrive), request
 * bytes held per connection and in all, and output held per connection and
 * in all:
 * answers queued but not yet taken by the client count, and past out_max
 * the connection's input is no longer read until the client takes them;
 * grpc_call_would_overload lets the service refuse to build a large answer
 * that would not fit. A connection whose output makes no progress for
 * write_timeout_ms, that sends no preface within preface_timeout_ms, or that
 * holds no call for idle_timeout_ms is closed; a request whose message has
 * not all arrived request_timeout_ms after its stream opened is answered
 * DEADLINE_EXCEEDED.
 *
 * Threads: grpc_server_new/free on the owner's thread, everything else on
 * the loop's thread.
 *
 * Ownership of a call: the server makes it when a request for a method the
 * service accepts is complete and passes it to on_call; the service answers
 * exactly once (grpc_call_reply or grpc_call_fail), later or inside on_call.
 * The call stays valid until then even if its client went away (the answer
 * is then dropped); the answer frees it.
 *
 * Streams (the methods is_stream says yes to): the service holds the call
 * from its headers (on_stream_open) until it calls grpc_stream_finish, once.
 * Each request message goes to on_stream_msg as soon as it is whole;
 * answers queue with grpc_stream_send and go out as the client takes them.
 * on_stream_end says the client ended its half (gone false: the service
 * may go on sending, then finishes) or left (gone true: the client reset
 * the stream, the connection closed, or grpc.c ended the stream for bad
 * input; the service must finish, and the call is freed then). It is
 * called at most once, never from inside grpc_stream_send or _finish.
 * Bounds: output queued per stream (stream_out_max; grpc_stream_send says
 * TK_EBUSY past it, or past the connection's or server's output bound, and
 * queues nothing: the service waits, grpc_stream_room tells how much fits),
 * a held stream counts as a call (calls_max), each message msg_max, the
 * input held per connection and in all as for unary calls. A connection
 * whose client takes nothing for write_timeout_ms is closed (its streams
 * then end, gone). */
#ifndef TK_ETCDAPI_GRPC_H
#define TK_ETCDAPI_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct uv_loop_s;
struct tk_tls_ctx;
struct grpc_server;
struct grpc_call;

/* gRPC status codes (grpc/doc/statuscodes.md). */
enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_OUT_OF_RANGE = 11,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_UNAUTHENTICATED = 16,
};

struct grpc_config {
    uint32_t conns_max;          /* open connections: 1024 */
    uint32_t streams_max;        /* concurrent streams per connection: 128 */
    uint32_t calls_max;          /* calls the service holds, in all: 8192 */
    size_t header_max;           /* header bytes per stream: 16 KiB */
    size_t msg_max;              /* one message: 2 MiB + 64 KiB */
    size_t conn_in_max;          /* request bytes held per connection: 8 MiB */
    size_t in_total_max;         /* ... and in all: 256 MiB */
    size_t out_max;              /* output held per connection: 8 MiB */
    size_t out_total_max;        /* ... and in all: 256 MiB */
    uint64_t preface_timeout_ms; /* accept to the client's preface: 10000 */
    uint64_t idle_timeout_ms;    /* no call open: 300000 */
    uint64_t write_timeout_ms;   /* output held with no progress: 30000 */
    uint64_t request_timeout_ms; /* a request's stream open to its last byte
                                    (then DEADLINE_EXCEEDED): 30000 */
    size_t stream_out_max;       /* answers queued per stream: 4 MiB */
    /* TLS (tls/tls.h; borrowed, must outlive the server; its ALPN "h2"):
     * NULL serves cleartext h2c. A handshake in progress holds one of
     * handshakes_max slots (and of handshakes_per_addr for its client's
     * address); past them a new connection is closed at accept. An
     * unfinished handshake ends at preface_timeout_ms. At most
     * HS_TURN_MAX handshake steps run in one loop turn (grpc.c); the
     * others wait for the next. */
    struct tk_tls_ctx *tls;
    uint32_t handshakes_max;      /* 64 */
    uint32_t handshakes_per_addr; /* 16 */
};

struct grpc_callbacks {
    /* Does the service serve `path` ("/etcdserverpb.KV/Range")? When it does
     * not, the call fails at once with UNIMPLEMENTED and `msg` (room for
     * `cap` bytes; "" gives a default), before any message is read. */
    bool (*accept)(const char *path, size_t len, char *msg, size_t cap, void *data);
    /* A call's request is complete: its path and its one message (borrowed
     * for the call's duration only). */
    void (*on_call)(struct grpc_call *call, const char *path, size_t path_len,
                    const uint8_t *msg, size_t msg_len, void *data);
    /* Streams (NULL is_stream: none). Is `path` a bidirectional stream? */
    bool (*is_stream)(const char *path, size_t len, void *data);
    /* A stream's headers arrived: the service holds `call` from now on. */
    void (*on_stream_open)(struct grpc_call *call, const char *path, size_t len,
                           void *data);
    /* One whole request message (borrowed for the callback only). */
    void (*on_stream_msg)(struct grpc_call *call, const uint8_t *msg, size_t len,
                          void *data);
    /* The client ended its half (gone false) or left (gone true). */
    void (*on_stream_end)(struct grpc_call *call, bool gone, void *data);
};

void grpc_config_default(struct grpc_config *c);

/* Copies the config; borrows `cb` (static) and `data`. */
struct grpc_server *grpc_server_new(const struct grpc_config *c,
                                    const struct grpc_callbacks *cb, void *data);

/* Binds and listens on host:port (an IPv4 or IPv6 literal; port 0: the
 * kernel's choice, see grpc_server_port). Returns 0, TK_EINVAL (not a
 * literal) or TK_EIO (bind or listen failed), with a message in err. */
int grpc_server_listen(struct grpc_server *s, struct uv_loop_s *loop, const char *host,
                       uint16_t port, char *err, size_t err_cap);
uint16_t grpc_server_port(const struct grpc_server *s);

/* Closes the listener and every connection (their handles close on the
 * loop, which the caller runs on). Calls still held by the service stay
 * valid until answered. */
void grpc_server_stop(struct grpc_server *s);

/* After the loop has closed the handles and every call is answered. */
void grpc_server_free(struct grpc_server *s);

/* The call's "token" metadata (etcd's auth token; "authorization" is taken
 * too), borrowed for the call's life: NULL when it sent none, and an empty
 * string (len 0) when the value was longer than GRPC_TOKEN_MAX bytes. */
#define GRPC_TOKEN_MAX 512
const char *grpc_call_token(const struct grpc_call *call, size_t *len);

/* The call's method path ("/etcdserverpb.KV/Range"), borrowed likewise. */
const char *grpc_call_path(const struct grpc_call *call, size_t *len);

/* The call's deadline from grpc-timeout, in ms from its arrival (0: none). */
uint64_t grpc_call_timeout_ms(const struct grpc_call *call);

/* Would an answer of `bytes` take the call's connection, or the server,
 * past its output bound? The service then fails the call with
 * RESOURCE_EXHAUSTED instead of building it. False for a gone client. */
bool grpc_call_would_overload(const struct grpc_call *call, size_t bytes);

/* Has the client gone (the stream was reset or the connection closed)? The
 * service may then skip building its answer (it must still answer). */
bool grpc_call_gone(const struct grpc_call *call);

/* Answers with one message of `len` bytes: `fill` writes it into `out` (the
 * server's buffer, `len` bytes). Frees the call. A message over msg_max is
 * INTERNAL instead. */
typedef void grpc_fill_cb(uint8_t *out, size_t len, const void *arg);
void grpc_call_reply(struct grpc_call *call, size_t len, grpc_fill_cb *fill,
                     const void *arg);

/* Answers with a status other than OK and a message (printf format). Frees
 * the call. */
void grpc_call_fail(struct grpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The service's pointer for a call (a stream's state). */
void grpc_call_set_user(struct grpc_call *call, void *user);
void *grpc_call_user(const struct grpc_call *call);

/* A stream's answer of `len` bytes, `fill` writing it into the queue.
 * Returns 0, TK_EBUSY (over an output bound: nothing queued, try again
 * once the client took some), TK_ETOOBIG (over msg_max) or TK_ESHUTDOWN
 * (the stream ended or its client left). */
int grpc_stream_send(struct grpc_call *call, size_t len, grpc_fill_cb *fill,
                     const void *arg);

/* Bytes grpc_stream_send would take now (0 for an ended stream). */
size_t grpc_stream_room(const struct grpc_call *call);

/* Bytes queued for the stream and not yet taken by nghttp2. */
size_t grpc_stream_queued(const struct grpc_call *call);

/* Ends a stream: trailers with `code` and a message (printf format) after
 * what is queued, and the client's half reset if it is still open. The
 * service no longer holds the call (freed now if its client left). */
void grpc_stream_finish(struct grpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* grpc_stream_finish for a client that does not take its answers: the
 * queued messages not yet begun are dropped first (their memory freed at
 * once), so the trailers follow the message being sent, if any. */
void grpc_stream_abort(struct grpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For tests and /metrics: open connections, calls held by the service. */
uint32_t grpc_server_conns(const struct grpc_server *s);
uint32_t grpc_server_calls(const struct grpc_server *s);

#endif
