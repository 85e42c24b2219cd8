/* A blocking HTTP/1.1 client for the CLI's one-shot commands.
 *
 * One request per connection (Connection: close), plain sockets with a
 * deadline enforced by poll(), responses parsed by http-parser (Content-Length,
 * chunked, or read-until-close bodies). cli_request() walks the endpoint list:
 * an unreachable endpoint or a 503 moves on; a leader hint (X-Tierkv-Leader,
 * the "leader" field of a 503 error body, or a 307/308 Location) is tried
 * next. Only the bench (bench.c) needs many connections; here simplicity wins.
 * Called from the main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/err.h"
#include "cmd/tierkv/cli.h"
#include "tls/tls.h"

static struct cli_security security;

void cli_security_set(const struct cli_security *s)
{
    security = *s;
}

const struct cli_security *cli_security_get(void)
{
    return &security;
}

void cli_response_free(struct cli_response *r)
{
    tk_free(r->body);
    r->body = NULL;
    r->body_len = 0;
}

/* ---- response parsing ---- */

enum hdr_which {
    HDR_NONE,
    HDR_LEADER,
    HDR_LEADER_ADDR,
    HDR_REVISION,
    HDR_LOCATION,
    HDR_CTYPE,
    HDR_RETRY
};

struct cli_resp_parser {
    http_parser hp;
    struct cli_response *r;
    size_t body_cap;
    char field[64];
    size_t field_len;
    bool in_value;
    enum hdr_which which;
    bool complete;
    bool too_big;
    bool sink_failed;
};

static void copy_hdr(char *dst, size_t cap, const char *at, size_t len)
{
    size_t cur = strlen(dst);
    size_t n = len < cap - 1 - cur ? len : cap - 1 - cur;
    memcpy(dst + cur, at, n);
    dst[cur + n] = '\0';
}

static int on_header_field(http_parser *hp, const char *at, size_t len)
{
    struct cli_resp_parser *p = hp->data;
    if (p->in_value) {
        p->in_value = false;
        p->field_len = 0;
    }
    size_t n = len < sizeof(p->field) - 1 - p->field_len
                   ? len
                   : sizeof(p->field) - 1 - p->field_len;
    memcpy(p->field + p->field_len, at, n);
    p->field_len += n;
    p->field[p->field_len] = '\0';
    return 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t len)
{
    struct cli_resp_parser *p = hp->data;
    struct cli_response *r = p->r;
    if (!p->in_value) {
        p->in_value = true;
        if (strcasecmp(p->field, "X-Tierkv-Leader") == 0)
            p->which = HDR_LEADER;
        else if (strcasecmp(p->field, "X-Tierkv-Leader-Addr") == 0)
            p->which = HDR_LEADER_ADDR;
        else if (strcasecmp(p->field, "X-Tierkv-Revision") == 0)
            p->which = HDR_REVISION;
        else if (strcasecmp(p->field, "Location") == 0)
            p->which = HDR_LOCATION;
        else if (strcasecmp(p->field, "Content-Type") == 0)
            p->which = HDR_CTYPE;
        else if (strcasecmp(p->field, "Retry-After") == 0)
            p->which = HDR_RETRY;
        else
            p->which = HDR_NONE;
    }
    switch (p->which) {
    case HDR_LEADER:
        copy_hdr(r->leader, sizeof(r->leader), at, len);
        break;
    case HDR_LEADER_ADDR:
        copy_hdr(r->leader_addr, sizeof(r->leader_addr), at, len);
        break;
    case HDR_REVISION:
        copy_hdr(r->revision, sizeof(r->revision), at, len);
        break;
    case HDR_LOCATION:
        copy_hdr(r->location, sizeof(r->location), at, len);
        break;
    case HDR_CTYPE:
        copy_hdr(r->content_type, sizeof(r->content_type), at, len);
        break;
    case HDR_RETRY:
        copy_hdr(r->retry_after, sizeof(r->retry_after), at, len);
        break;
    case HDR_NONE:
        break;
    }
    return 0;
}

static int on_headers_complete(http_parser *hp)
{
    struct cli_resp_parser *p = hp->data;
    p->r->status = (int)hp->status_code;
    return 0;
}

/* cli_body_sink: where 2xx bodies go instead of memory (NULL: memory). */
static FILE *body_sink;

void cli_body_sink(FILE *f)
{
    body_sink = f;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct cli_resp_parser *p = hp->data;
    struct cli_response *r = p->r;
    if (body_sink != NULL && hp->status_code / 100 == 2) {
        if (fwrite(at, 1, len, body_sink) != len) {
            p->sink_failed = true;
            return 1;
        }
        r->body_sunk += len;
        return 0;
    }
    if (r->body_len + len > CLI_BODY_MAX) {
        p->too_big = true;
        return 1;
    }
    if (r->body_len + len + 1 > p->body_cap) {
        size_t cap = p->body_cap ? p->body_cap : 4096;
        while (cap < r->body_len + len + 1)
            cap *= 2;
        r->body = tk_realloc(r->body, cap);
        p->body_cap = cap;
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return 0;
}

static int on_message_complete(http_parser *hp)
{
    struct cli_resp_parser *p = hp->data;
    p->complete = true;
    p->r->keep_alive = http_should_keep_alive(hp) != 0;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

struct cli_resp_parser *cli_resp_parser_new(struct cli_response *into)
{
    struct cli_resp_parser *p = tk_calloc(1, sizeof(*p));
    memset(into, 0, sizeof(*into));
    p->r = into;
    http_parser_init(&p->hp, HTTP_RESPONSE);
    p->hp.data = p;
    return p;
}

int cli_resp_parser_feed(struct cli_resp_parser *p, const char *buf, size_t len)
{
    if (p->complete)
        return 1;
    size_t n = http_parser_execute(&p->hp, &resp_settings, buf, len);
    if (p->complete)
        return 1;
    if (p->too_big)
        return TK_ETOOBIG;
    if (p->sink_failed)
        return TK_EIO;
    if (HTTP_PARSER_ERRNO(&p->hp) != HPE_OK || n != len)
        return TK_EPROTO;
    if (len == 0)
        return TK_EPROTO; /* EOF before the message ended */
    return 0;
}

void cli_resp_parser_free(struct cli_resp_parser *p)
{
    tk_free(p);
}

/* ---- one attempt ---- */

static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - (int64_t)tk_mono_ms();
        if (left <= 0)
            return TK_ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, (int)left);
        if (rc > 0)
            return 0;
        if (rc == 0)
            return TK_ETIMEDOUT;
        if (errno != EINTR)
            return TK_EIO;
    }
}

static int connect_ep(const struct cli_endpoint *ep, int64_t deadline, int *out,
                      char *err, size_t err_cap)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int grc = getaddrinfo(ep->host, ep->port, &hints, &res);
    if (grc != 0) {
        snprintf(err, err_cap, "%s:%s: cannot resolve: %s", ep->host, ep->port,
                 gai_strerror(grc));
        return TK_EUNAVAIL;
    }
    int rc = TK_EUNAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(err, err_cap, "%s:%s: %s", ep->host, ep->port, strerror(errno));
            close(fd);
            continue;
        }
        int w = wait_fd(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (w == 0)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (w != 0 || soerr != 0) {
            snprintf(err, err_cap, "%s:%s: %s", ep->host, ep->port,
                     w == TK_ETIMEDOUT ? "connect timed out"
                                       : strerror(soerr ? soerr : EIO));
            rc = w == TK_ETIMEDOUT ? TK_ETIMEDOUT : TK_EUNAVAIL;
            close(fd);
            continue;
        }
        *out = fd;
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

static int send_all(int fd, const char *p, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc != 0)
                return rc;
            continue;
        }
        return TK_EIO;
    }
    return 0;
}

/* ---- the connection: plain, or TLS pumped over the same socket ---- */

struct cli_conn {
    int fd;
    struct tk_tls *tls; /* NULL: plain */
};

static int conn_pump_out(struct cli_conn *c, int64_t deadline)
{
    char buf[16384];
    size_t n;
    while ((n = tk_tls_out_take(c->tls, buf, sizeof(buf))) > 0) {
        int rc = send_all(c->fd, buf, n, deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Reads what the socket has (waiting until the deadline) into the session.
 * TK_ECLOSED at end of stream. */
static int conn_pump_in(struct cli_conn *c, int64_t deadline)
{
    char buf[16384];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n > 0)
            return tk_tls_feed(c->tls, buf, (size_t)n) == 0 ? 0 : TK_EPROTO;
        if (n == 0)
            return TK_ECLOSED;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return TK_EUNAVAIL;
        int rc = wait_fd(c->fd, POLLIN, deadline);
        if (rc != 0)
            return rc;
    }
}

static int conn_handshake(struct cli_conn *c, int64_t deadline, char *err, size_t cap)
{
    for (;;) {
        int h = tk_tls_handshake(c->tls);
        int rc = conn_pump_out(c, deadline);
        if (h < 0) {
            snprintf(err, cap, "%s", tk_tls_error(c->tls));
            return TK_EPROTO;
        }
        if (rc != 0 || h == 1)
            return rc;
        rc = conn_pump_in(c, deadline);
        if (rc == TK_ECLOSED) {
            snprintf(err, cap, "TLS handshake: the server closed the connection");
            return TK_EPROTO;
        }
        if (rc != 0)
            return rc;
    }
}

static int conn_send(struct cli_conn *c, const void *p, size_t len, int64_t deadline)
{
    if (c->tls == NULL)
        return send_all(c->fd, p, len, deadline);
    if (tk_tls_write(c->tls, p, len) != 0)
        return TK_EIO;
    return conn_pump_out(c, deadline);
}

/* > 0 bytes, 0 at the end of the stream, or a TK_E* code. */
static ssize_t conn_recv(struct cli_conn *c, char *buf, size_t cap, int64_t deadline)
{
    for (;;) {
        if (c->tls != NULL) {
            ssize_t n = tk_tls_read(c->tls, buf, cap);
            if (n != 0)
                return n == TK_ECLOSED ? 0 : n < 0 ? TK_EPROTO : n;
            int rc = conn_pump_in(c, deadline);
            if (rc != 0)
                return rc == TK_ECLOSED ? 0 : rc;
            continue;
        }
        ssize_t n = recv(c->fd, buf, cap, 0);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return TK_EUNAVAIL;
        int rc = wait_fd(c->fd, POLLIN, deadline);
        if (rc != 0)
            return rc;
    }
}

static void conn_close_fd(struct cli_conn *c)
{
    tk_tls_free(c->tls);
    close(c->fd);
}

/* Connects and, with TLS, finishes the handshake (the server's certificate
 * checked against ep->host). */
static int conn_open(const struct cli_endpoint *ep, int64_t deadline, struct cli_conn *c,
                     char *err, size_t err_cap)
{
    c->tls = NULL;
    int rc = connect_ep(ep, deadline, &c->fd, err, err_cap);
    if (rc != 0 || security.tls == NULL)
        return rc;
    c->tls = tk_tls_new(security.tls, ep->host);
    char why[TK_TLS_ERR_MAX] = "timed out";
    rc = conn_handshake(c, deadline, why, sizeof(why));
    if (rc != 0) {
        snprintf(err, err_cap, "%s:%s: %s", ep->host, ep->port,
                 rc == TK_EPROTO      ? why
                 : rc == TK_ETIMEDOUT ? "TLS handshake timed out"
                                      : "TLS handshake failed");
        conn_close_fd(c);
    }
    return rc;
}

/* The request head into buf (cap), or NULL if it does not fit. */
static const char *request_head(char *buf, size_t cap, const struct cli_endpoint *ep,
                                const char *method, const char *path,
                                const char *content_type, bool body, size_t body_len,
                                int *len)
{
    char hostport[CLI_HOST_MAX + 16];
    snprintf(hostport, sizeof(hostport), strchr(ep->host, ':') ? "[%s]:%s" : "%s:%s",
             ep->host, ep->port);
    char auth[CLI_TOKEN_MAX + 32] = "";
    if (security.token != NULL)
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", security.token);
    char ctype[192] = "";
    if (body)
        snprintf(ctype, sizeof(ctype), "Content-Type: %s\r\nContent-Length: %zu\r\n",
                 content_type ? content_type : "application/octet-stream", body_len);
    *len = snprintf(buf, cap,
                    "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tierkv-cli\r\n"
                    "Connection: close\r\n%s%s\r\n",
                    method, path, hostport, auth, ctype);
    return *len >= 0 && (size_t)*len < cap ? buf : NULL;
}

/* cli_request_one; *sent: the request went out whole (so a failure after it
 * may come after the server acted on it). */
static int request_one(const struct cli_endpoint *ep, int timeout_ms, const char *method,
                       const char *path, const char *content_type, const void *body,
                       size_t body_len, struct cli_response *out, char *err,
                       size_t err_cap, bool *sent)
{
    *sent = false;
    int64_t deadline = (int64_t)tk_mono_ms() + timeout_ms;
    struct cli_conn conn;
    memset(out, 0, sizeof(*out));
    if (body_sink != NULL) { /* an earlier attempt's bytes go */
        fflush(body_sink);
        if (ftruncate(fileno(body_sink), 0) != 0 || fseek(body_sink, 0, SEEK_SET) != 0) {
            snprintf(err, err_cap, "cannot truncate the output file: %s",
                     strerror(errno));
            return TK_EIO;
        }
    }
    int rc = conn_open(ep, deadline, &conn, err, err_cap);
    if (rc != 0)
        return rc == TK_EPROTO ? TK_EUNAVAIL : rc;
    char head[1024 + CLI_HOST_MAX + CLI_TOKEN_MAX];
    int hn;
    /* The path is the only long part; a key over ~700 bytes after encoding
     * goes through a heap buffer. */
    char *dyn = NULL;
    const char *hp = request_head(head, sizeof(head), ep, method, path, content_type,
                                  body != NULL, body_len, &hn);
    if (hp == NULL) {
        size_t need = strlen(path) + sizeof(head);
        dyn = tk_malloc(need);
        hp = request_head(dyn, need, ep, method, path, content_type, body != NULL,
                          body_len, &hn);
    }
    rc = conn_send(&conn, hp, (size_t)hn, deadline);
    tk_free(dyn);
    if (rc == 0 && body && body_len > 0)
        rc = conn_send(&conn, body, body_len, deadline);
    if (rc != 0) {
        snprintf(err, err_cap, "%s:%s: sending the request: %s", ep->host, ep->port,
                 rc == TK_ETIMEDOUT ? "timed out" : "connection failed");
        conn_close_fd(&conn);
        return rc == TK_ETIMEDOUT ? TK_ETIMEDOUT : TK_EUNAVAIL;
    }
    *sent = true;
    struct cli_resp_parser *p = cli_resp_parser_new(out);
    char buf[16384];
    for (;;) {
        ssize_t n = conn_recv(&conn, buf, sizeof(buf), deadline);
        if (n < 0) {
            rc = n == TK_ETIMEDOUT ? TK_ETIMEDOUT : TK_EUNAVAIL;
            break;
        }
        rc = cli_resp_parser_feed(p, buf, (size_t)n);
        if (rc != 0)
            break;
    }
    cli_resp_parser_free(p);
    conn_close_fd(&conn);
    if (rc == 1)
        return 0;
    const char *why = rc == TK_ETIMEDOUT ? "timed out waiting for the response"
                      : rc == TK_ETOOBIG ? "response body too large"
                      : rc == TK_EPROTO  ? "malformed HTTP response"
                                         : "connection failed";
    snprintf(err, err_cap, "%s:%s: %s", ep->host, ep->port, why);
    cli_response_free(out);
    return rc == TK_ETIMEDOUT ? TK_ETIMEDOUT : rc == TK_EPROTO ? TK_EPROTO : TK_EUNAVAIL;
}

int cli_request_one(const struct cli_endpoint *ep, int timeout_ms, const char *method,
                    const char *path, const char *content_type, const void *body,
                    size_t body_len, struct cli_response *out, char *err, size_t err_cap)
{
    bool sent;
    return request_one(ep, timeout_ms, method, path, content_type, body, body_len, out,
                       err, err_cap, &sent);
}

/* ---- failover ---- */

/* The leader address a response points at, if any. */
static bool response_hint(const struct cli_response *r, struct cli_endpoint *ep)
{
    if ((r->status == 307 || r->status == 308) && r->location[0] &&
        cli_parse_hostport(r->location, ep) == 0)
        return true;
    if (r->leader_addr[0] && cli_parse_leader_hint(r->leader_addr, ep) == 0)
        return true;
    if (r->leader[0] && cli_parse_leader_hint(r->leader, ep) == 0)
        return true;
    if (r->status == 503 && r->body) {
        json_t *j = json_loads(r->body, 0, NULL);
        json_t *e = j ? json_object_get(j, "error") : NULL;
        json_t *l = e ? json_object_get(e, "leader") : NULL;
        bool ok =
            json_is_string(l) && cli_parse_leader_hint(json_string_value(l), ep) == 0;
        json_decref(j);
        return ok;
    }
    return false;
}

static bool same_ep(const struct cli_endpoint *a, const struct cli_endpoint *b)
{
    return strcmp(a->host, b->host) == 0 && strcmp(a->port, b->port) == 0;
}

/* What cli_request keeps across the attempts of its passes. */
struct failover {
    struct cli_endpoint cand[CLI_ENDPOINTS_MAX * 2]; /* this pass's candidates */
    size_t n_cand;
    struct cli_response last503; /* the last 503 answer, returned if nothing better */
    bool have503;
    int last_rc;        /* the last connection error */
    int retry_after_ms; /* this pass: a 503's Retry-After (0: none) */
};

/* A 503 or a 307/308 from cand[i]: a leader it names is tried right after
 * it; a 503 is kept as the answer to return if no endpoint does better.
 * Takes r. */
static void note_redirect(struct cli_client *c, struct failover *f, size_t i,
                          struct cli_response *r, char *err, size_t err_cap)
{
    struct cli_endpoint hint;
    const struct cli_endpoint *ep = &f->cand[i];
    if (response_hint(r, &hint) && f->n_cand < CLI_ENDPOINTS_MAX * 2) {
        memmove(&f->cand[i + 2], &f->cand[i + 1], (f->n_cand - i - 1) * sizeof(hint));
        f->cand[i + 1] = hint;
        f->n_cand++;
    }
    if (r->status == 503) {
        int ra = atoi(r->retry_after);
        if (ra > 0 && ra <= 5)
            f->retry_after_ms = ra * 1000;
        cli_response_free(&f->last503);
        f->last503 = *r;
        f->have503 = true;
        c->answered = *ep;
        snprintf(err, err_cap, "%s:%s: 503 unavailable", ep->host, ep->port);
    } else {
        snprintf(err, err_cap, "%s:%s: redirect without a usable Location", ep->host,
                 ep->port);
        cli_response_free(r);
    }
}

/* A final answer from ep: it becomes the preferred endpoint. */
static void note_answer(struct cli_client *c, const struct cli_endpoint *ep)
{
    c->answered = *ep;
    for (size_t k = 0; k < c->n_eps; k++)
        if (same_ep(&c->eps[k], ep))
            c->preferred = k;
}

/* Waiting for the cluster (an election), not for another thread. */
static void pass_backoff(const struct failover *f, int pass)
{
    int backoff_ms = f->retry_after_ms ? f->retry_after_ms : 200 << pass;
    struct timespec ts = {backoff_ms / 1000, (long)(backoff_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

int cli_request(struct cli_client *c, const char *method, const char *path,
                const char *content_type, const void *body, size_t body_len,
                struct cli_response *out, char *err, size_t err_cap)
{
    struct failover f = {.last_rc = TK_EUNAVAIL};
    snprintf(err, err_cap, "no endpoint given");
    c->maybe_applied = false;
    for (int pass = 0; pass <= c->retries; pass++) {
        /* Candidates: the configured endpoints from the preferred one on; a
         * hint is inserted right after the current position. */
        f.n_cand = 0;
        f.retry_after_ms = 0;
        for (size_t i = 0; i < c->n_eps; i++)
            f.cand[f.n_cand++] = c->eps[(c->preferred + i) % c->n_eps];
        struct cli_endpoint tried[CLI_ENDPOINTS_MAX * 2];
        size_t n_tried = 0;
        for (size_t i = 0; i < f.n_cand; i++) {
            bool dup = false;
            for (size_t t = 0; t < n_tried; t++)
                dup |= same_ep(&tried[t], &f.cand[i]);
            if (dup || n_tried == CLI_ENDPOINTS_MAX * 2)
                continue;
            tried[n_tried++] = f.cand[i];
            struct cli_response r;
            char e[512];
            bool sent;
            int rc = request_one(&f.cand[i], c->timeout_ms, method, path, content_type,
                                 body, body_len, &r, e, sizeof(e), &sent);
            if (c->verbose)
                fprintf(stderr, "tierkv: %s %s -> %s:%s: %s%d\n", method, path,
                        f.cand[i].host, f.cand[i].port, rc == 0 ? "HTTP " : "error ",
                        rc == 0 ? r.status : rc);
            if (rc != 0) {
                snprintf(err, err_cap, "%s", e);
                f.last_rc = rc;
                if (sent && c->no_resend) {
                    /* It may have been applied: the caller finds out. */
                    cli_response_free(&f.last503);
                    c->maybe_applied = true;
                    c->answered = f.cand[i];
                    return rc == TK_ETIMEDOUT ? TK_ETIMEDOUT : TK_EUNAVAIL;
                }
                continue;
            }
            if (r.status != 503 && r.status != 307 && r.status != 308) {
                cli_response_free(&f.last503);
                *out = r;
                note_answer(c, &f.cand[i]);
                return 0;
            }
            note_redirect(c, &f, i, &r, err, err_cap);
        }
        if (pass < c->retries)
            pass_backoff(&f, pass);
    }
    if (f.have503) {
        *out = f.last503;
        return 0;
    }
    return f.last_rc == TK_ETIMEDOUT ? TK_ETIMEDOUT : TK_EUNAVAIL;
}

/* ---- streamed answers (tierkv watch) ---- */

struct stream_ctx {
    int status;
    char line[CLI_BODY_MAX > (1u << 22) ? (1u << 22) : CLI_BODY_MAX];
    size_t line_len;
    bool overflow;
    cli_line_cb *cb;
    void *data;
    int stop; /* cb's nonzero answer */
};

static int st_headers_complete(http_parser *hp)
{
    struct stream_ctx *s = hp->data;
    s->status = hp->status_code;
    return 0;
}

static int st_body(http_parser *hp, const char *at, size_t len)
{
    struct stream_ctx *s = hp->data;
    for (size_t i = 0; i < len && s->stop == 0; i++) {
        if (at[i] != '\n') {
            if (s->line_len < sizeof(s->line) - 1)
                s->line[s->line_len++] = at[i];
            else
                s->overflow = true;
            continue;
        }
        s->line[s->line_len] = 0;
        if (!s->overflow && s->line_len > 0)
            s->stop = s->cb(s->status, s->line, s->line_len, s->data);
        s->line_len = 0;
        s->overflow = false;
    }
    return s->stop != 0 ? -1 : 0;
}

int cli_stream(const struct cli_endpoint *ep, int connect_timeout_ms, const char *path,
               const char *accept, cli_line_cb *cb, void *data, char *err, size_t err_cap)
{
    int fd;
    int rc =
        connect_ep(ep, (int64_t)tk_mono_ms() + connect_timeout_ms, &fd, err, err_cap);
    if (rc != 0)
        return rc;
    char req[8192];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%s\r\n%s%s%s\r\n",
                     path, ep->host, ep->port, accept ? "Accept: " : "",
                     accept ? accept : "", accept ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof(req) ||
        send_all(fd, req, (size_t)n, (int64_t)tk_mono_ms() + connect_timeout_ms) != 0) {
        snprintf(err, err_cap, "%s:%s: cannot send the request", ep->host, ep->port);
        close(fd);
        return TK_EUNAVAIL;
    }
    struct stream_ctx *s = calloc(1, sizeof(*s));
    if (s == NULL)
        abort();
    s->cb = cb;
    s->data = data;
    http_parser hp;
    http_parser_init(&hp, HTTP_RESPONSE);
    hp.data = s;
    http_parser_settings set = {.on_headers_complete = st_headers_complete,
                                .on_body = st_body};
    char buf[16384];
    rc = TK_ECLOSED;
    for (;;) {
        ssize_t got = recv(fd, buf, sizeof(buf), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLIN, (int64_t)tk_mono_ms() + 10000);
            if (w == TK_ETIMEDOUT) { /* a live watch sends progress every second */
                snprintf(err, err_cap, "%s:%s: nothing for 10 s", ep->host, ep->port);
                rc = TK_ETIMEDOUT;
                break;
            }
            if (w != 0)
                break;
            continue;
        }
        if (got <= 0)
            break;
        size_t used = http_parser_execute(&hp, &set, buf, (size_t)got);
        if (s->stop != 0) {
            rc = s->stop;
            break;
        }
        if (used != (size_t)got) {
            snprintf(err, err_cap, "%s:%s: malformed answer", ep->host, ep->port);
            rc = TK_EPROTO;
            break;
        }
    }
    if (rc == TK_ECLOSED)
        snprintf(err, err_cap, "%s:%s: the stream ended", ep->host, ep->port);
    close(fd);
    free(s);
    return rc;
}
