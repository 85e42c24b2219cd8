/* The gRPC server over nghttp2 and libuv (contract and bounds: grpc.h).
 *
 * One connection (gconn) owns one nghttp2 server session, fed with
 * nghttp2_session_mem_recv from the socket and drained with
 * nghttp2_session_mem_send into uv_write requests. One stream (gstream) is
 * one call; it is also the struct grpc_call the service holds. A stream is
 * freed when nghttp2 has closed it and the service no longer holds it, in
 * whichever order those happen.
 *
 * Invariants: conn->reply_bytes is the bytes of answers queued in its
 * streams and not yet taken by nghttp2; conn->write_bytes the bytes in
 * uv_write requests; srv->out_total their sum over the connections. The
 * session is never deleted, and the connection never freed, inside an
 * nghttp2 callback (in_recv): a close asked for there waits for mem_recv to
 * return. On the loop's thread only. */
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/err.h"
#include "etcdapi/grpc.h"
#include "tls/tls.h"
#include "tls/tls_uv.h"

#define PATH_MAX_BYTES 256
#define WRITE_CHUNK (64u * 1024u)
#define SWEEP_MS 1000
#define GRPC_PREFIX 5
/* Bytes read from all connections in one loop turn: past this, a connection
 * that reads again waits for the next turn, so a flood of requests (or of
 * streams nghttp2 refuses) cannot hold the loop the node's Raft work runs
 * on (an ASan build lost its leadership to one before this bound). */
#define TURN_BYTES_MAX (256u * 1024u)
/* TLS: what one read hands the session (under TK_TLS_IN_MAX with a partial
 * record left from the read before), and the handshake steps (a key
 * exchange and a signature each, about 0.2-1 ms here) one loop turn runs:
 * past them a handshaking connection's bytes wait in its session and it
 * reads again next turn. */
#define TLS_READ_BYTES (16u * 1024u)
#define HS_TURN_MAX 16

struct gconn;

struct grpc_call {
    struct grpc_server *srv;
    struct gconn *conn; /* NULL once the connection closed */
    int32_t id;
    bool open;        /* nghttp2 still has the stream */
    bool held;        /* the service holds it (owes an answer) */
    bool answered;    /* an answer was submitted */
    bool remote_done; /* the client's END_STREAM arrived */
    bool rst_after;   /* reset the client's half once the answer is sent */
    bool is_post, is_grpc;
    size_t hdr_bytes;
    char path[PATH_MAX_BYTES];
    size_t path_len;
    bool path_long;
    uint64_t timeout_ms;
    uint64_t born_ms;
    char token[GRPC_TOKEN_MAX + 1]; /* "token" metadata (has_token) */
    size_t token_len;
    bool has_token;
    uint8_t *in; /* the request's DATA bytes */
    size_t in_len, in_cap;
    uint8_t *out; /* the answer: prefix and message (a stream: its queue) */
    size_t out_len, out_off, out_cap;
    size_t msg_end; /* a stream: where the message at out_off ends (out_off
                       when none is started); >= out_off */
    /* A bidirectional stream (grpc.h, streams): held from its headers until
     * the service finishes it; its answers queue in out. */
    bool is_stream;
    bool hdrs_sent; /* the response HEADERS (with the data source) went */
    bool finishing; /* trailers follow the queue (fin_code, fin_msg) */
    bool end_told;  /* on_stream_end was called */
    int fin_code;
    char fin_msg[256];
    void *user;
    struct grpc_call *next, *prev; /* the connection's streams */
};

struct gconn {
    uv_tcp_t tcp;
    struct grpc_server *srv;
    nghttp2_session *h2;
    struct gconn *next, *prev;
    struct grpc_call *streams;
    uint32_t n_streams;
    size_t in_bytes, reply_bytes, write_bytes;
    bool reading, closing, in_recv, close_pending, got_preface;
    bool paused;  /* waits for the next loop turn (TURN_BYTES_MAX) */
    bool in_send; /* inside nghttp2_session_mem_send (conn_flush) */
    uint64_t born_ms, progress_ms, active_ms;
    /* TLS (srv->cfg.tls): the session; a handshake in progress holds a slot
     * (handshaking) from accept to its end; tls_pending: bytes fed and not
     * yet decrypted, waiting for the next turn's handshake budget. */
    struct tk_tls *tls;
    bool handshaking, tls_pending;
    uint8_t addr[16], addr_len;
};

struct grpc_server {
    struct grpc_config cfg;
    const struct grpc_callbacks *cb;
    void *data;
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t sweep;
    uv_check_t resume; /* after each turn's I/O: the paused read again */
    size_t turn_bytes; /* read this turn */
    uint32_t n_paused;
    uint32_t n_hs, turn_hs; /* handshakes in progress; steps this turn */
    bool listening, stopping;
    nghttp2_session_callbacks *h2_callbacks;
    uint8_t read_buf[64 * 1024];
    uint8_t plain_buf[TLS_READ_BYTES]; /* TLS: decrypted bytes for mem_recv */
    uint16_t port;
    struct gconn *conns;
    uint32_t n_conns, calls;
    size_t out_total;
    size_t in_total; /* request bytes held by every connection */
};

struct wreq {
    uv_write_t req;
    struct gconn *conn;
    size_t len, cap;
    uint8_t *data;
};

static void conn_close(struct gconn *c);
static void conn_flush(struct gconn *c);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

void grpc_config_default(struct grpc_config *c)
{
    memset(c, 0, sizeof(*c));
    c->conns_max = 1024;
    c->streams_max = 128;
    c->calls_max = 8192;
    c->header_max = 16 * 1024;
    c->msg_max = (2u << 20) + (64u << 10);
    c->conn_in_max = 8u << 20;
    c->in_total_max = 256u << 20;
    c->out_max = 8u << 20;
    c->out_total_max = 256u << 20;
    c->preface_timeout_ms = 10000;
    c->idle_timeout_ms = 300000;
    c->write_timeout_ms = 30000;
    c->request_timeout_ms = 30000;
    c->stream_out_max = 4u << 20;
    c->tls = NULL;
    c->handshakes_max = 64;
    c->handshakes_per_addr = 16;
}

/* ---- streams ------------------------------------------------------------ */

static void stream_unlink(struct grpc_call *st)
{
    struct gconn *c = st->conn;
    if (c == NULL)
        return;
    if (st->prev)
        st->prev->next = st->next;
    else
        c->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    c->n_streams--;
    c->in_bytes -= st->in_cap;
    c->srv->in_total -= st->in_cap;
    size_t unsent = st->out_len - st->out_off;
    c->reply_bytes -= unsent;
    c->srv->out_total -= unsent;
    st->conn = NULL;
}

static void stream_free(struct grpc_call *st)
{
    tk_free(st->in);
    tk_free(st->out);
    tk_free(st);
}

/* nghttp2 no longer has the stream (closed, or the connection went). */
static void stream_detach(struct grpc_call *st)
{
    stream_unlink(st);
    st->open = false;
    if (!st->held) {
        stream_free(st);
        return;
    }
    if (st->is_stream && !st->end_told) {
        struct grpc_server *srv = st->srv;
        st->end_told = true;
        srv->cb->on_stream_end(st, true, srv->data); /* may free st */
    }
}

static void release_input(struct grpc_call *st)
{
    if (st->conn) {
        st->conn->in_bytes -= st->in_cap;
        st->conn->srv->in_total -= st->in_cap;
    }
    tk_free(st->in);
    st->in = NULL;
    st->in_len = st->in_cap = 0;
}

/* grpc-message: percent-encoded outside printable ASCII (and '%'). */
static size_t pct_encode(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch <= 0x7e && ch != '%') {
            out[n++] = (char)ch;
        } else {
            out[n++] = '%';
            out[n++] = hex[ch >> 4];
            out[n++] = hex[ch & 15];
        }
    }
    out[n] = 0;
    return n;
}

#define NV(name, value, vlen)                                                            \
    {                                                                                    \
        (uint8_t *)(name), (uint8_t *)(value), sizeof(name) - 1, (vlen),                 \
            NGHTTP2_NV_FLAG_NONE                                                         \
    }

/* A trailers-only answer (one HEADERS frame that ends the stream). When the
 * client is still sending, its half is reset (NO_ERROR) after it, as gRPC
 * servers do, so it stops. */
static void stream_status(struct grpc_call *st, int code, const char *msg)
{
    if (!st->open || st->answered || st->conn == NULL)
        return;
    st->answered = true;
    char codes[12], enc[512];
    int cl = snprintf(codes, sizeof(codes), "%d", code);
    size_t el = pct_encode(msg, enc, sizeof(enc));
    nghttp2_nv nva[] = {
        NV(":status", "200", 3), NV("content-type", "application/grpc", 16),
        NV("grpc-status", codes, (size_t)cl), NV("grpc-message", enc, el)};
    nghttp2_session *h2 = st->conn->h2;
    if (nghttp2_submit_response(h2, st->id, nva, el ? 4 : 3, NULL) != 0) {
        nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    st->rst_after = true; /* on_frame_send: only after the answer went out */
    release_input(st);
}

/* Ends a call with a status: trailers-only before a stream's answer began,
 * else trailers after what its queue holds. A held stream's service hears
 * of it when the stream closes (on_stream_end, gone). */
static void stream_end_status(struct grpc_call *st, int code, const char *msg)
{
    if (!st->is_stream || !st->hdrs_sent) {
        stream_status(st, code, msg);
        return;
    }
    if (st->finishing || !st->open || st->conn == NULL)
        return;
    st->finishing = true;
    st->fin_code = code;
    snprintf(st->fin_msg, sizeof(st->fin_msg), "%s", msg);
    st->rst_after = true;
    release_input(st);
    nghttp2_session_resume_data(st->conn->h2, st->id);
}

/* A request that is not gRPC at all: a bare HTTP status. */
static void stream_http_status(struct grpc_call *st, const char *status)
{
    st->answered = true;
    nghttp2_nv nva[] = {NV(":status", status, strlen(status))};
    nghttp2_submit_response(st->conn->h2, st->id, nva, 1, NULL);
    st->rst_after = true;
}

/* The trailers that end a stream's answer: its code and message. */
static void stream_trailers(nghttp2_session *h2, struct grpc_call *st, uint32_t *flags)
{
    char codes[12], enc[512];
    int cl = snprintf(codes, sizeof(codes), "%d", st->fin_code);
    size_t el = pct_encode(st->fin_msg, enc, sizeof(enc));
    nghttp2_nv tr[] = {NV("grpc-status", codes, (size_t)cl), NV("grpc-message", enc, el)};
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (nghttp2_submit_trailer(h2, st->id, tr, el ? 2 : 1) != 0)
        *flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
}

/* A stream's data source: what its queue holds; nothing queued defers
 * (grpc_stream_send resumes it) until the stream finishes. */
static ssize_t stream_data_read(nghttp2_session *h2, struct grpc_call *st, uint8_t *buf,
                                size_t length, uint32_t *flags)
{
    struct gconn *c = st->conn;
    size_t left = st->out_len - st->out_off;
    if (left == 0) {
        if (!st->finishing)
            return NGHTTP2_ERR_DEFERRED;
        stream_trailers(h2, st, flags);
        return 0;
    }
    size_t n = left < length ? left : length;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    c->reply_bytes -= n;
    c->srv->out_total -= n;
    c->progress_ms = tk_mono_ms();
    while (st->msg_end < st->out_off) { /* the messages begun: their prefixes */
        const uint8_t *p = st->out + st->msg_end;
        st->msg_end += GRPC_PREFIX + ((size_t)p[1] << 24 | (size_t)p[2] << 16 |
                                      (size_t)p[3] << 8 | p[4]);
    }
    if (st->out_off == st->out_len) {
        st->out_off = st->out_len = st->msg_end = 0;
        if (st->out_cap > WRITE_CHUNK) { /* a large message's room goes back */
            tk_free(st->out);
            st->out = NULL;
            st->out_cap = 0;
        }
        if (st->finishing)
            stream_trailers(h2, st, flags);
    }
    return (ssize_t)n;
}

static ssize_t data_read(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *user)
{
    (void)user;
    struct grpc_call *st = src->ptr;
    struct gconn *c = st->conn;
    if (st->is_stream)
        return stream_data_read(h2, st, buf, length, flags);
    size_t left = st->out_len - st->out_off;
    size_t n = left < length ? left : length;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    c->reply_bytes -= n;
    c->srv->out_total -= n;
    c->progress_ms = tk_mono_ms();
    if (st->out_off == st->out_len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        nghttp2_nv tr[] = {NV("grpc-status", "0", 1)};
        if (nghttp2_submit_trailer(h2, id, tr, 1) != 0)
            *flags &= ~(uint32_t)NGHTTP2_DATA_FLAG_NO_END_STREAM;
        tk_free(st->out);
        st->out = NULL;
        st->out_len = st->out_off = 0;
    }
    return (ssize_t)n;
}

/* The request is complete: exactly one uncompressed message goes to the
 * service. */
static void stream_dispatch(struct grpc_call *st)
{
    struct gconn *c = st->conn;
    struct grpc_server *srv = c->srv;
    if (st->in_len < GRPC_PREFIX) {
        stream_status(st, GRPC_INTERNAL,
                      "tierkv: a unary call needs one request message");
        return;
    }
    uint32_t mlen = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 |
                    (uint32_t)st->in[3] << 8 | st->in[4];
    if (st->in_len != GRPC_PREFIX + (size_t)mlen) {
        stream_status(st, GRPC_INTERNAL,
                      "tierkv: a unary call takes exactly one whole message");
        return;
    }
    if (srv->calls >= srv->cfg.calls_max) {
        stream_status(st, GRPC_RESOURCE_EXHAUSTED, "tierkv: too many calls in progress");
        return;
    }
    st->held = true;
    srv->calls++;
    srv->cb->on_call(st, st->path, st->path_len, st->in + GRPC_PREFIX, mlen, srv->data);
    if (st->open)
        release_input(st);
}

/* Takes DATA bytes; checks the declared length as soon as the prefix is in. */
static void stream_take(struct grpc_call *st, const uint8_t *p, size_t len)
{
    struct gconn *c = st->conn;
    const struct grpc_config *cfg = &c->srv->cfg;
    size_t want = st->in_len + len;
    if (want > GRPC_PREFIX + cfg->msg_max) {
        stream_end_status(st, GRPC_RESOURCE_EXHAUSTED,
                          "tierkv: the request is over the message limit");
        return;
    }
    if (want > st->in_cap) {
        size_t cap = st->in_cap ? st->in_cap : 256;
        while (cap < want)
            cap *= 2;
        if (cap > GRPC_PREFIX + cfg->msg_max)
            cap = GRPC_PREFIX + cfg->msg_max;
        if (c->in_bytes - st->in_cap + cap > cfg->conn_in_max ||
            c->srv->in_total - st->in_cap + cap > cfg->in_total_max) {
            stream_end_status(
                st, GRPC_RESOURCE_EXHAUSTED,
                "tierkv: too many request bytes held (this connection or all)");
            return;
        }
        c->in_bytes = c->in_bytes - st->in_cap + cap;
        c->srv->in_total = c->srv->in_total - st->in_cap + cap;
        st->in = tk_realloc(st->in, cap);
        st->in_cap = cap;
    }
    memcpy(st->in + st->in_len, p, len);
    st->in_len = want;
    if (st->in_len >= GRPC_PREFIX) {
        uint32_t mlen = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 |
                        (uint32_t)st->in[3] << 8 | st->in[4];
        if (st->in[0] != 0)
            stream_end_status(st, GRPC_UNIMPLEMENTED,
                              "tierkv: compressed messages are not supported");
        else if (mlen > cfg->msg_max) {
            char msg[128];
            snprintf(msg, sizeof(msg),
                     "tierkv: a message of %u bytes is over the limit of %zu", mlen,
                     cfg->msg_max);
            stream_end_status(st, GRPC_RESOURCE_EXHAUSTED, msg);
        }
    }
}

/* A stream's complete messages go to the service as they arrive; the
 * partial one stays (at the buffer's start). An empty buffer is freed. */
static void stream_msgs(struct grpc_call *st)
{
    struct grpc_server *srv = st->srv;
    while (st->held && !st->answered && !st->finishing && st->in_len >= GRPC_PREFIX) {
        uint32_t mlen = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 |
                        (uint32_t)st->in[3] << 8 | st->in[4];
        size_t whole = GRPC_PREFIX + (size_t)mlen;
        if (st->in[0] != 0 || mlen > srv->cfg.msg_max || st->in_len < whole)
            break;
        srv->cb->on_stream_msg(st, st->in + GRPC_PREFIX, mlen, srv->data);
        if (st->in == NULL) /* the service finished it (input released) */
            return;
        memmove(st->in, st->in + whole, st->in_len - whole);
        st->in_len -= whole;
    }
    if (st->in_len == 0 && st->in != NULL)
        release_input(st);
}

/* grpc-timeout: at most 8 digits and a unit (H M S m u n). */
static uint64_t parse_timeout(const uint8_t *v, size_t len)
{
    if (len < 2 || len > 9)
        return 0;
    uint64_t n = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return 0;
        n = n * 10 + (uint64_t)(v[i] - '0');
    }
    switch (v[len - 1]) {
    case 'H':
        return n * 3600000;
    case 'M':
        return n * 60000;
    case 'S':
        return n * 1000;
    case 'm':
        return n ? n : 1;
    case 'u':
        return n / 1000 ? n / 1000 : 1;
    case 'n':
        return n / 1000000 ? n / 1000000 : 1;
    default:
        return 0;
    }
}

/* ---- nghttp2's callbacks -------------------------------------------------- */

static int on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *user)
{
    struct gconn *c = user;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct grpc_call *st = tk_calloc(1, sizeof(*st));
    st->srv = c->srv;
    st->conn = c;
    st->id = f->hd.stream_id;
    st->open = true;
    st->born_ms = tk_mono_ms();
    st->next = c->streams;
    if (c->streams)
        c->streams->prev = st;
    c->streams = st;
    c->n_streams++;
    c->active_ms = tk_mono_ms();
    nghttp2_session_set_stream_user_data(h2, st->id, st);
    return 0;
}

static int on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name,
                     size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
                     void *user)
{
    (void)flags;
    (void)user;
    struct grpc_call *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (st == NULL || f->hd.type != NGHTTP2_HEADERS)
        return 0;
    st->hdr_bytes += nlen + vlen + 32;
    if (st->hdr_bytes > st->conn->srv->cfg.header_max)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets the stream */
#define IS(lit) (nlen == sizeof(lit) - 1 && memcmp(name, lit, nlen) == 0)
    if (IS(":path")) {
        st->path_long = vlen >= sizeof(st->path);
        st->path_len = st->path_long ? 0 : vlen;
        memcpy(st->path, value, st->path_len);
        st->path[st->path_len] = 0;
    } else if (IS(":method")) {
        st->is_post = vlen == 4 && memcmp(value, "POST", 4) == 0;
    } else if (IS("content-type")) {
        st->is_grpc = vlen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                      (vlen == 16 || value[16] == '+' || value[16] == ';');
    } else if (IS("grpc-timeout")) {
        st->timeout_ms = parse_timeout(value, vlen);
    } else if (IS("token") || IS("authorization")) {
        st->has_token = true; /* a longer one: empty, which names no one */
        st->token_len = vlen <= GRPC_TOKEN_MAX ? vlen : 0;
        memcpy(st->token, value, st->token_len);
        st->token[st->token_len] = 0;
    }
#undef IS
    return 0;
}

static void headers_done(struct grpc_call *st)
{
    struct grpc_server *srv = st->conn->srv;
    if (!st->is_post) {
        stream_http_status(st, "405");
        return;
    }
    if (!st->is_grpc) {
        stream_http_status(st, "415");
        return;
    }
    char msg[256] = "";
    if (st->path_long) {
        stream_status(st, GRPC_UNIMPLEMENTED, "tierkv: the method's path is too long");
        return;
    }
    if (!srv->cb->accept(st->path, st->path_len, msg, sizeof(msg), srv->data)) {
        char dflt[PATH_MAX_BYTES + 64];
        if (msg[0] == 0)
            snprintf(dflt, sizeof(dflt), "unknown method %s", st->path);
        stream_status(st, GRPC_UNIMPLEMENTED, msg[0] ? msg : dflt);
        return;
    }
    if (srv->cb->is_stream == NULL ||
        !srv->cb->is_stream(st->path, st->path_len, srv->data))
        return;
    if (srv->calls >= srv->cfg.calls_max) {
        stream_status(st, GRPC_RESOURCE_EXHAUSTED, "tierkv: too many calls in progress");
        return;
    }
    st->is_stream = true;
    st->held = true;
    srv->calls++;
    srv->cb->on_stream_open(st, st->path, st->path_len, srv->data);
}

static int on_frame_recv(nghttp2_session *h2, const nghttp2_frame *f, void *user)
{
    struct gconn *c = user;
    c->got_preface = true; /* nghttp2 checked the magic before any frame */
    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
        return 0;
    struct grpc_call *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (st == NULL)
        return 0;
    bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (end)
        st->remote_done = true;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST &&
        !st->answered)
        headers_done(st);
    if (st->is_stream) {
        if (end && st->held && !st->end_told) { /* the client's half ended */
            st->end_told = true;
            c->srv->cb->on_stream_end(st, false, c->srv->data);
        }
        return 0;
    }
    if (end && !st->answered)
        stream_dispatch(st);
    return 0;
}

static int on_data_chunk(nghttp2_session *h2, uint8_t flags, int32_t id,
                         const uint8_t *data, size_t len, void *user)
{
    (void)flags;
    (void)user;
    struct grpc_call *st = nghttp2_session_get_stream_user_data(h2, id);
    if (st == NULL || st->answered || st->finishing)
        return 0;
    if (st->is_stream) {
        stream_take(st, data, len);
        stream_msgs(st);
    } else if (!st->held) {
        stream_take(st, data, len);
    }
    return 0;
}

/* An answer that ended our half while the client is still sending: reset
 * its half now (NO_ERROR), as gRPC servers do, so it stops. Submitted here,
 * after the HEADERS went out, so the reset never overtakes the answer. */
static int on_frame_send(nghttp2_session *h2, const nghttp2_frame *f, void *user)
{
    (void)user;
    if (f->hd.type != NGHTTP2_HEADERS || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    struct grpc_call *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (st != NULL && st->rst_after && !st->remote_done)
        nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *h2, int32_t id, uint32_t code, void *user)
{
    (void)code;
    struct gconn *c = user;
    struct grpc_call *st = nghttp2_session_get_stream_user_data(h2, id);
    if (st != NULL) {
        nghttp2_session_set_stream_user_data(h2, id, NULL);
        stream_detach(st);
    }
    c->active_ms = tk_mono_ms();
    return 0;
}

/* ---- the connection ------------------------------------------------------ */

/* Every connection reads into the server's one buffer: a loop runs one read
 * callback at a time and mem_recv consumes the bytes before it returns. */
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    struct gconn *c = h->data;
    buf->base = (char *)c->srv->read_buf;
    buf->len = c->tls != NULL ? TLS_READ_BYTES : sizeof(c->srv->read_buf);
}

/* Reads while the connection's output and the server's are under their
 * bounds; a client that does not take its answers is not read from. */
static void conn_update_reading(struct gconn *c)
{
    const struct grpc_config *cfg = &c->srv->cfg;
    bool want = !c->closing && !c->paused &&
                c->reply_bytes + c->write_bytes < cfg->out_max &&
                c->srv->out_total < cfg->out_total_max;
    if (want == c->reading)
        return;
    c->reading = want;
    if (want)
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    else
        uv_read_stop((uv_stream_t *)&c->tcp);
}

/* Plaintext into the session. False when the connection closed. */
static bool conn_recv(struct gconn *c, const uint8_t *p, size_t len)
{
    c->in_recv = true;
    ssize_t rv = nghttp2_session_mem_recv(c->h2, p, len);
    c->in_recv = false;
    if (rv < 0 || c->close_pending) {
        conn_close(c); /* a bad preface, a protocol error or a flood */
        return false;
    }
    return true;
}

/* The handshake is over (done, failed or the connection closed): its slot
 * is free. */
static void hs_leave(struct gconn *c)
{
    if (!c->handshaking)
        return;
    c->handshaking = false;
    c->srv->n_hs--;
}

static bool conn_write_cipher(struct gconn *c);

/* TLS: decrypts what the session was fed, a record at a time, into the
 * session (nghttp2). False when the connection closed. */
static bool conn_tls_drain(struct gconn *c)
{
    c->tls_pending = false;
    for (;;) {
        ssize_t n = tk_tls_read(c->tls, c->srv->plain_buf, sizeof(c->srv->plain_buf));
        if (n == 0)
            break;
        if (n < 0) { /* close_notify, a failed handshake or a bad record */
            (void)conn_write_cipher(c); /* the alert, if any */
            conn_close(c);
            return false;
        }
        if (!conn_recv(c, c->srv->plain_buf, (size_t)n))
            return false;
    }
    if (c->handshaking && tk_tls_handshake_done(c->tls))
        hs_leave(c);
    return true;
}

static void conn_pause(struct gconn *c)
{
    if (c->paused)
        return;
    c->paused = true;
    c->srv->n_paused++;
    conn_update_reading(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct gconn *c = s->data;
    struct grpc_server *srv = c->srv;
    if (nread == 0)
        return;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (c->tls == NULL) {
        if (!conn_recv(c, (const uint8_t *)buf->base, (size_t)nread))
            return;
    } else {
        /* Reads of TLS_READ_BYTES, each drained before the next: the
         * session never holds more than a partial record and one read. */
        if (tk_tls_feed(c->tls, buf->base, (size_t)nread) != 0) {
            conn_close(c);
            return;
        }
        if (c->handshaking && srv->turn_hs >= HS_TURN_MAX) {
            c->tls_pending = true; /* the next turn (on_resume) */
            conn_pause(c);
            return;
        }
        if (c->handshaking)
            srv->turn_hs++;
        if (!conn_tls_drain(c))
            return;
    }
    /* The turn's budget: past it, this connection reads again in the next
     * turn (on_resume), so one turn parses and dispatches at most about
     * TURN_BYTES_MAX of requests over all connections (libuv would read each
     * readable one up to 32 times a turn). */
    srv->turn_bytes += (size_t)nread;
    if (srv->turn_bytes >= TURN_BYTES_MAX)
        conn_pause(c);
    conn_flush(c);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct gconn *c = h->data;
    c->srv->n_conns--;
    tk_tls_free(c->tls);
    tk_free(c);
}

static void conn_close(struct gconn *c)
{
    if (c->closing)
        return;
    if (c->in_recv) {
        c->close_pending = true;
        return;
    }
    c->closing = true;
    struct grpc_server *srv = c->srv;
    hs_leave(c);
    if (c->paused) {
        c->paused = false;
        srv->n_paused--;
    }
    while (c->streams)
        stream_detach(c->streams);
    nghttp2_session_del(c->h2);
    c->h2 = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_written(uv_write_t *req, int status)
{
    struct wreq *w = req->data;
    struct gconn *c = w->conn;
    c->write_bytes -= w->len;
    c->srv->out_total -= w->len;
    tk_free(w->data);
    tk_free(w);
    if (c->closing)
        return;
    if (status != 0) {
        conn_close(c);
        return;
    }
    c->progress_ms = tk_mono_ms();
    conn_flush(c);
}

/* Puts w on the wire (counted in write_bytes and out_total until written).
 * False when the connection closed. */
static bool conn_write(struct gconn *c, struct wreq *w)
{
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    w->req.data = w;
    c->write_bytes += w->len;
    c->srv->out_total += w->len;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        c->write_bytes -= w->len;
        c->srv->out_total -= w->len;
        tk_free(w->data);
        tk_free(w);
        conn_close(c);
        return false;
    }
    return true;
}

/* TLS: the ciphertext the session has for the wire (handshake records,
 * alerts, encrypted answers) in one write. False when the connection
 * closed. */
static bool conn_write_cipher(struct gconn *c)
{
    size_t n = tk_tls_out_pending(c->tls);
    if (n == 0 || c->closing)
        return !c->closing;
    struct wreq *w = tk_calloc(1, sizeof(*w));
    w->conn = c;
    w->cap = n;
    w->data = tk_malloc(n);
    w->len = tk_tls_out_take(c->tls, w->data, n);
    return conn_write(c, w);
}

/* Moves what nghttp2 has to send into uv_write requests of about 64 KiB
 * (with TLS, encrypted first), while the connection's writes in flight are
 * under out_max. */
static void conn_flush(struct gconn *c)
{
    if (c->closing || c->in_recv || c->in_send)
        return;
    const struct grpc_config *cfg = &c->srv->cfg;
    if (c->tls != NULL) {
        if (!conn_write_cipher(c))
            return;
        if (!tk_tls_handshake_done(c->tls)) { /* nghttp2 speaks after it */
            conn_update_reading(c);
            return;
        }
    }
    while (c->write_bytes < cfg->out_max) {
        struct wreq *w = NULL;
        for (;;) {
            const uint8_t *p;
            c->in_send = true;
            ssize_t n = nghttp2_session_mem_send(c->h2, &p);
            c->in_send = false;
            if (n < 0) {
                if (w) {
                    tk_free(w->data);
                    tk_free(w);
                }
                conn_close(c);
                return;
            }
            if (n == 0)
                break;
            if (w == NULL) {
                w = tk_calloc(1, sizeof(*w));
                w->conn = c;
                w->cap = WRITE_CHUNK + (size_t)n;
                w->data = tk_malloc(w->cap);
            } else if (w->len + (size_t)n > w->cap) {
                w->cap = w->len + (size_t)n;
                w->data = tk_realloc(w->data, w->cap);
            }
            memcpy(w->data + w->len, p, (size_t)n);
            w->len += (size_t)n;
            if (w->len >= WRITE_CHUNK)
                break;
        }
        if (w == NULL)
            break;
        if (c->tls != NULL) {
            int rc = tk_tls_write(c->tls, w->data, w->len);
            tk_free(w->data);
            tk_free(w);
            if (rc != 0) {
                conn_close(c);
                return;
            }
            if (!conn_write_cipher(c))
                return;
        } else if (!conn_write(c, w)) {
            return;
        }
    }
    if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2) &&
        c->write_bytes == 0) {
        conn_close(c); /* GOAWAY exchanged and everything sent */
        return;
    }
    conn_update_reading(c);
}

/* The session callbacks, one set per server (made on the owner's thread, so
 * servers on different loops share nothing). */
/* nghttp2's constructors fail only for want of memory: abort, as tk_malloc
 * does (STYLE.md, errors). */
static void h2_must(int rv, const char *what)
{
    if (rv != 0) {
        fprintf(stderr, "tierkv: %s: %s\n", what, nghttp2_strerror(rv));
        abort();
    }
}

static nghttp2_session_callbacks *session_callbacks_new(void)
{
    nghttp2_session_callbacks *cbs;
    h2_must(nghttp2_session_callbacks_new(&cbs), "nghttp2_session_callbacks_new");
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    return cbs;
}

/* TLS: may c start a handshake? Not past handshakes_max in progress, nor
 * past handshakes_per_addr from its address (a scan of at most conns_max
 * connections). If so it holds a slot until the handshake ends. */
static bool hs_admit(struct gconn *c)
{
    struct grpc_server *srv = c->srv;
    if (srv->n_hs >= srv->cfg.handshakes_max)
        return false;
    if (!tk_tls_uv_peer_addr(&c->tcp, c->addr, &c->addr_len))
        return false;
    uint32_t same = 0;
    for (struct gconn *o = srv->conns; o != NULL; o = o->next)
        if (o->handshaking && o->addr_len == c->addr_len &&
            memcmp(o->addr, c->addr, c->addr_len) == 0 &&
            ++same >= srv->cfg.handshakes_per_addr)
            return false;
    c->handshaking = true;
    srv->n_hs++;
    return true;
}

static void on_connection(uv_stream_t *l, int status)
{
    struct grpc_server *srv = l->data;
    if (status != 0)
        return;
    struct gconn *c = tk_calloc(1, sizeof(*c));
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    srv->n_conns++;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || srv->stopping ||
        srv->n_conns > srv->cfg.conns_max) {
        c->closing = true; /* never linked: only its handle to close */
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (srv->cfg.tls != NULL) {
        if (!hs_admit(c)) { /* over the handshake caps: no TLS state made */
            c->closing = true;
            uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
            return;
        }
        c->tls = tk_tls_new(srv->cfg.tls, NULL);
    }
    nghttp2_option *opt;
    h2_must(nghttp2_option_new(&opt), "nghttp2_option_new");
    nghttp2_option_set_max_reserved_remote_streams(opt, 0);
    h2_must(nghttp2_session_server_new2(&c->h2, srv->h2_callbacks, c, opt),
            "nghttp2_session_server_new2");
    nghttp2_option_del(opt);
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, srv->cfg.streams_max},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)srv->cfg.header_max},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    h2_must(
        nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])),
        "nghttp2_submit_settings");
    c->born_ms = c->progress_ms = c->active_ms = tk_mono_ms();
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    conn_flush(c); /* the SETTINGS, and starts reading */
}

/* After the turn's I/O: the byte budget starts over and the connections
 * paused for it read again (in the next turn's poll). At most conns_max. */
static void on_resume(uv_check_t *h)
{
    struct grpc_server *srv = h->data;
    srv->turn_bytes = 0;
    srv->turn_hs = 0;
    if (srv->n_paused == 0)
        return;
    struct gconn *next;
    for (struct gconn *c = srv->conns; c != NULL && srv->n_paused > 0; c = next) {
        next = c->next;
        if (!c->paused)
            continue;
        if (c->tls_pending) { /* a handshake step put off by HS_TURN_MAX */
            if (c->handshaking && srv->turn_hs >= HS_TURN_MAX)
                continue;
            if (c->handshaking)
                srv->turn_hs++;
            if (!conn_tls_drain(c))
                continue; /* closed: conn_close took it off the paused */
            conn_flush(c);
            if (c->closing)
                continue;
        }
        c->paused = false;
        srv->n_paused--;
        conn_update_reading(c);
    }
}

/* A connection's requests still arriving past request_timeout_ms are
 * answered DEADLINE_EXCEEDED (a client sending its messages slowly holds
 * nothing for longer). At most streams_max per connection. */
static void expire_requests(struct gconn *c, uint64_t now)
{
    bool any = false;
    for (struct grpc_call *st = c->streams; st != NULL; st = st->next) {
        if (!st->remote_done && !st->answered && !st->held &&
            now - st->born_ms > c->srv->cfg.request_timeout_ms) {
            stream_status(st, GRPC_DEADLINE_EXCEEDED,
                          "tierkv: the request did not arrive in time");
            any = true;
        }
    }
    if (any)
        conn_flush(c);
}

/* Once a second: connections with no preface in time, with output that
 * makes no progress, or idle, and requests that do not arrive. At most
 * conns_max connections and streams_max streams each. */
static void on_sweep(uv_timer_t *t)
{
    struct grpc_server *srv = t->data;
    uint64_t now = tk_mono_ms();
    const struct grpc_config *cfg = &srv->cfg;
    struct gconn *next;
    for (struct gconn *c = srv->conns; c != NULL; c = next) {
        next = c->next;
        bool stalled = c->reply_bytes + c->write_bytes > 0 &&
                       now - c->progress_ms > cfg->write_timeout_ms;
        bool no_preface = !c->got_preface && now - c->born_ms > cfg->preface_timeout_ms;
        bool idle = c->n_streams == 0 && now - c->active_ms > cfg->idle_timeout_ms;
        if (stalled || no_preface || idle)
            conn_close(c);
        else if (c->n_streams > 0)
            expire_requests(c, now);
    }
}

/* ---- the server ------------------------------------------------------------ */

struct grpc_server *grpc_server_new(const struct grpc_config *c,
                                    const struct grpc_callbacks *cb, void *data)
{
    struct grpc_server *s = tk_calloc(1, sizeof(*s));
    s->cfg = *c;
    s->cb = cb;
    s->data = data;
    s->h2_callbacks = session_callbacks_new();
    return s;
}

int grpc_server_listen(struct grpc_server *s, uv_loop_t *loop, const char *host,
                       uint16_t port, char *err, size_t err_cap)
{
    s->loop = loop;
    union {
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } addr;
    if (uv_ip4_addr(host, port, &addr.v4) != 0 &&
        uv_ip6_addr(host, port, &addr.v6) != 0) {
        snprintf(err, err_cap, "client listen address \"%s\" is not an IP literal", host);
        return TK_EINVAL;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    uv_check_init(loop, &s->resume);
    s->resume.data = s;
    uv_check_start(&s->resume, on_resume);
    s->listening = true;
    int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot listen on %s:%u: %s", host, port, uv_strerror(rc));
        return TK_EIO;
    }
    uv_timer_start(&s->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) == 0)
        s->port =
            ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                          : ((struct sockaddr_in6 *)&ss)->sin6_port);
    if (err_cap > 0)
        err[0] = 0;
    return 0;
}

uint16_t grpc_server_port(const struct grpc_server *s)
{
    return s->port;
}

void grpc_server_stop(struct grpc_server *s)
{
    s->stopping = true;
    if (s->listening) {
        s->listening = false;
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_close((uv_handle_t *)&s->sweep, NULL);
        uv_close((uv_handle_t *)&s->resume, NULL);
    }
    while (s->conns)
        conn_close(s->conns);
}

void grpc_server_free(struct grpc_server *s)
{
    if (s == NULL)
        return;
    TK_ASSERT(s->n_conns == 0);
    TK_ASSERT(s->calls == 0);
    nghttp2_session_callbacks_del(s->h2_callbacks);
    tk_free(s);
}

uint32_t grpc_server_conns(const struct grpc_server *s)
{
    return s->n_conns;
}

uint32_t grpc_server_calls(const struct grpc_server *s)
{
    return s->calls;
}

/* ---- answers ------------------------------------------------------------- */

const char *grpc_call_token(const struct grpc_call *call, size_t *len)
{
    *len = call->token_len;
    return call->has_token ? call->token : NULL;
}

const char *grpc_call_path(const struct grpc_call *call, size_t *len)
{
    *len = call->path_len;
    return call->path;
}

uint64_t grpc_call_timeout_ms(const struct grpc_call *call)
{
    return call->timeout_ms;
}

bool grpc_call_gone(const struct grpc_call *call)
{
    return !call->open || call->conn == NULL;
}

bool grpc_call_would_overload(const struct grpc_call *call, size_t bytes)
{
    const struct gconn *c = call->conn;
    if (c == NULL)
        return false;
    const struct grpc_config *cfg = &c->srv->cfg;
    return c->reply_bytes + c->write_bytes + bytes > cfg->out_max ||
           c->srv->out_total + bytes > cfg->out_total_max;
}

/* The service is done with the call: true when its client is still there
 * to answer; else the call is freed. */
static bool call_release(struct grpc_call *call)
{
    TK_ASSERT(call->held);
    call->held = false;
    call->srv->calls--;
    if (!call->open || call->conn == NULL) {
        stream_free(call);
        return false;
    }
    return true;
}

void grpc_call_reply(struct grpc_call *call, size_t len, grpc_fill_cb *fill,
                     const void *arg)
{
    struct grpc_server *srv = call->srv;
    if (!call_release(call))
        return;
    if (len > srv->cfg.msg_max) {
        stream_status(call, GRPC_INTERNAL,
                      "tierkv: the answer is over the message limit");
        conn_flush(call->conn);
        return;
    }
    struct gconn *c = call->conn;
    call->out = tk_malloc(GRPC_PREFIX + len);
    call->out[0] = 0;
    call->out[1] = (uint8_t)(len >> 24);
    call->out[2] = (uint8_t)(len >> 16);
    call->out[3] = (uint8_t)(len >> 8);
    call->out[4] = (uint8_t)len;
    fill(call->out + GRPC_PREFIX, len, arg);
    call->out_len = GRPC_PREFIX + len;
    call->out_off = 0;
    c->reply_bytes += call->out_len;
    srv->out_total += call->out_len;
    call->answered = true;
    nghttp2_nv nva[] = {NV(":status", "200", 3),
                        NV("content-type", "application/grpc", 16)};
    nghttp2_data_provider dp = {.source.ptr = call, .read_callback = data_read};
    if (nghttp2_submit_response(c->h2, call->id, nva, 2, &dp) != 0)
        nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, call->id,
                                  NGHTTP2_INTERNAL_ERROR);
    conn_flush(c);
}

void grpc_call_fail(struct grpc_call *call, int code, const char *fmt, ...)
{
    if (!call_release(call))
        return;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    stream_status(call, code, msg);
    conn_flush(call->conn);
}

/* ---- streams --------------------------------------------------------------- */

void grpc_call_set_user(struct grpc_call *call, void *user)
{
    call->user = user;
}

void *grpc_call_user(const struct grpc_call *call)
{
    return call->user;
}

size_t grpc_stream_room(const struct grpc_call *call)
{
    const struct gconn *c = call->conn;
    if (c == NULL || !call->open || call->answered || call->finishing)
        return 0;
    const struct grpc_config *cfg = &c->srv->cfg;
    size_t queued = call->out_len - call->out_off;
    size_t conn = c->reply_bytes + c->write_bytes;
    size_t room = queued < cfg->stream_out_max ? cfg->stream_out_max - queued : 0;
    size_t r2 = conn < cfg->out_max ? cfg->out_max - conn : 0;
    size_t r3 = c->srv->out_total < cfg->out_total_max
                    ? cfg->out_total_max - c->srv->out_total
                    : 0;
    if (r2 < room)
        room = r2;
    return r3 < room ? r3 : room;
}

size_t grpc_stream_queued(const struct grpc_call *call)
{
    return call->conn == NULL ? 0 : call->out_len - call->out_off;
}

int grpc_stream_send(struct grpc_call *call, size_t len, grpc_fill_cb *fill,
                     const void *arg)
{
    struct gconn *c = call->conn;
    TK_ASSERT(call->is_stream);
    if (c == NULL || !call->open || call->answered || call->finishing || !call->held)
        return TK_ESHUTDOWN;
    struct grpc_server *srv = c->srv;
    if (len > srv->cfg.msg_max)
        return TK_ETOOBIG;
    size_t need = GRPC_PREFIX + len, queued = call->out_len - call->out_off;
    /* One message always fits an empty queue (under the connection's and the
     * server's bounds); past that, the stream's own bound. */
    if ((queued > 0 && queued + need > srv->cfg.stream_out_max) ||
        c->reply_bytes + c->write_bytes + need > srv->cfg.out_max ||
        srv->out_total + need > srv->cfg.out_total_max)
        return TK_EBUSY;
    if (call->out_off > 0) {
        memmove(call->out, call->out + call->out_off, queued);
        call->out_len = queued;
        call->msg_end -= call->out_off;
        call->out_off = 0;
    }
    if (call->out_len + need > call->out_cap) {
        size_t cap = call->out_cap ? call->out_cap : 1024;
        while (cap < call->out_len + need)
            cap *= 2;
        call->out = tk_realloc(call->out, cap);
        call->out_cap = cap;
    }
    uint8_t *o = call->out + call->out_len;
    o[0] = 0;
    o[1] = (uint8_t)(len >> 24);
    o[2] = (uint8_t)(len >> 16);
    o[3] = (uint8_t)(len >> 8);
    o[4] = (uint8_t)len;
    fill(o + GRPC_PREFIX, len, arg);
    call->out_len += need;
    c->reply_bytes += need;
    srv->out_total += need;
    if (!call->hdrs_sent) {
        call->hdrs_sent = true;
        nghttp2_nv nva[] = {NV(":status", "200", 3),
                            NV("content-type", "application/grpc", 16)};
        nghttp2_data_provider dp = {.source.ptr = call, .read_callback = data_read};
        if (nghttp2_submit_response(c->h2, call->id, nva, 2, &dp) != 0)
            nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, call->id,
                                      NGHTTP2_INTERNAL_ERROR);
    } else {
        nghttp2_session_resume_data(c->h2, call->id);
    }
    conn_flush(c);
    return 0;
}

static void stream_finish(struct grpc_call *call, int code, const char *msg);

void grpc_stream_finish(struct grpc_call *call, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    stream_finish(call, code, msg);
}

void grpc_stream_abort(struct grpc_call *call, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct gconn *c = call->conn;
    if (c != NULL && call->out_len > call->msg_end) { /* the unbegun messages go */
        size_t drop = call->out_len - call->msg_end;
        c->reply_bytes -= drop;
        c->srv->out_total -= drop;
        call->out_len = call->msg_end;
        if (call->out_len == call->out_off)
            call->out_len = call->out_off = call->msg_end = 0;
    }
    stream_finish(call, code, msg);
}

static void stream_finish(struct grpc_call *call, int code, const char *msg)
{
    TK_ASSERT(call->is_stream);
    if (!call_release(call))
        return;
    if (!call->answered && !call->finishing) {
        if (!call->hdrs_sent) {
            stream_status(call, code, msg);
        } else {
            call->finishing = true;
            call->fin_code = code;
            snprintf(call->fin_msg, sizeof(call->fin_msg), "%s", msg);
            call->rst_after = true;
            release_input(call);
            nghttp2_session_resume_data(call->conn->h2, call->id);
        }
    }
    conn_flush(call->conn);
}
