/* tierkv bench: an HTTP load generator for tierkvd's v1 gateway and for
 * etcd's v3 JSON gateway (--protocol etcd), so one tool measures both.
 *
 * Model: closed loop. Each of --connections keep-alive connections has exactly
 * one request in flight; when its response is parsed, the next request goes
 * out. Connections are spread over 1 or 2 libuv loop threads (--threads) and
 * round-robin over the endpoints. Each loop thread owns its connections, its
 * PRNG and its latency histogram (base/hist.h, nanoseconds); the main thread
 * merges them after joining. The only cross-thread data are relaxed atomic
 * counters read by the progress line and the prefill cursor.
 *
 * A run: optional prefill (every key written once, when the mix has reads, so
 * reads hit), a warm-up, then the measured window. An operation counts when
 * its response completes inside the window; its latency is send-to-parse.
 * Errors: connect or I/O failures, malformed responses, and statuses other
 * than 2xx (a 404 on a read is counted as not_found, not as an error). When
 * the window closes every connection is closed at once; requests in flight
 * then are discarded. Every buffer is bounded: one request head (4 KiB) and one
 * 16 KiB read buffer per connection, plus the shared value. */
#include <getopt.h>
#include <http_parser.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/prng.h"
#include "cmd/tierkv/bench_cpu.h"
#include "cmd/tierkv/bench_progress.h"
#include "cmd/tierkv/bench_timeline.h"
#include "cmd/tierkv/cli.h"
#include "tls/tls_uv.h"

#define HDR_CAP 4096
#define RBUF_BYTES 16384
#define RECONNECT_MS 100
#define CONNECTIONS_MAX 20000
#define VALUE_MAX (1u << 20)
#define PREFILL_ERRORS_MAX 1000

_Static_assert(sizeof(((struct bench_opts *)0)->cpu_pids) / sizeof(int) ==
                   BENCH_CPU_PIDS_MAX,
               "--cpu-pids: the options hold BENCH_CPU_PIDS_MAX pids");

void cli_bench_defaults(struct bench_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->protocol = CLI_PROTO_TIERKV;
    o->connections = 16;
    o->threads = 1;
    o->duration_ms = 10000;
    o->warmup_ms = 1000;
    o->value_size = 64;
    o->read_fraction = 0;
    o->keys = 10000;
    o->dist = CLI_DIST_UNIFORM;
    o->zipf_theta = 0.99;
    o->runs = 1;
    o->seed = 1;
    o->prefill = true;
    o->progress = -1;
    snprintf(o->key_prefix, sizeof(o->key_prefix), "bench/");
}

/* ---- request building ---- */

long cli_bench_build(enum cli_protocol proto, bool is_read, const char *host,
                     const char *key, size_t key_len, const char *query,
                     const struct bench_payload *pl, char *hdr, size_t cap,
                     struct bench_iov tail[2], size_t *n_tail)
{
    int n;
    *n_tail = 0;
    if (proto == CLI_PROTO_TIERKV) {
        char enc[3 * 256 + 1];
        if (key_len > 256)
            return TK_ETOOBIG;
        cli_url_encode(key, key_len, enc, sizeof(enc));
        const char *q = query ? query : "";
        if (is_read) {
            n = snprintf(hdr, cap, "GET /v1/kv/%s%s HTTP/1.1\r\nHost: %s\r\n\r\n", enc, q,
                         host);
        } else {
            n = snprintf(hdr, cap,
                         "PUT /v1/kv/%s%s HTTP/1.1\r\nHost: %s\r\n"
                         "Content-Length: %zu\r\n\r\n",
                         enc, q, host, pl->value_size);
            tail[0] = (struct bench_iov){pl->value, pl->value_size};
            *n_tail = 1;
        }
    } else {
        /* etcd v3 JSON gateway: keys and values are base64 in JSON bodies. A
         * non-empty `query` asks for a serializable (stale) range. */
        char k64[4 * 256 / 3 + 8];
        if (key_len > 256)
            return TK_ETOOBIG;
        size_t k64_len = tk_base64_encode(key, key_len, k64);
        if (is_read) {
            bool ser = query && query[0];
            size_t body = 8 + k64_len + 2 + (ser ? 20 : 0);
            n = snprintf(hdr, cap,
                         "POST /v3/kv/range HTTP/1.1\r\nHost: %s\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n"
                         "{\"key\":\"%s\"%s}",
                         host, body, k64, ser ? ",\"serializable\":true" : "");
        } else {
            size_t body = 8 + k64_len + 11 + pl->value_b64_len + 2;
            n = snprintf(hdr, cap,
                         "POST /v3/kv/put HTTP/1.1\r\nHost: %s\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n"
                         "{\"key\":\"%s\",\"value\":\"",
                         host, body, k64);
            tail[0] = (struct bench_iov){pl->value_b64, pl->value_b64_len};
            tail[1] = (struct bench_iov){"\"}", 2};
            *n_tail = 2;
        }
    }
    if (n < 0 || (size_t)n >= cap)
        return TK_ETOOBIG;
    return n;
}

/* ---- the run ---- */

struct worker;

struct conn {
    struct worker *w;
    uv_tcp_t tcp;
    uv_timer_t retry;
    uv_connect_t creq;
    uv_write_t wreq;
    http_parser hp;
    size_t ep;
    uint64_t t_sent;
    bool tcp_open; /* tcp is initialised and not yet closed */
    bool busy;     /* a request is in flight */
    bool is_read;
    bool got_response;
    bool done;     /* prefill: no keys left */
    bool redirect; /* reconnect at once (to the leader), not after a pause */
    bool parked;   /* --rate: waiting for a token to send its next request */
    /* X-Tierkv-Leader-Addr of the response being parsed, for the chase. */
    bool in_value, value_is_leader;
    char field[32];
    size_t field_len;
    char leader[CLI_HOST_MAX + 16];
    size_t leader_len;
    char hdr[HDR_CAP];
    struct tk_tls *tls; /* HTTPS: the session of this connection */
    char *plain;        /* HTTPS: decrypted bytes (RBUF_BYTES) */
    char rbuf[RBUF_BYTES];
};

struct shared {
    const struct bench_opts *o;
    size_t n_eps;
    struct sockaddr_storage addrs[CLI_ENDPOINTS_MAX];
    char hosts[CLI_ENDPOINTS_MAX][CLI_HOST_MAX + 16];
    const char *tls_names[CLI_ENDPOINTS_MAX]; /* HTTPS: the name each is checked for */
    /* What follows "Host: " in a request: hosts[i], and with --token the
     * Authorization line after it. */
    char host_lines[CLI_ENDPOINTS_MAX][CLI_HOST_MAX + 16 + CLI_TOKEN_MAX + 32];
    struct bench_payload pl;
    struct cli_zipf zipf;
    const char *query_read, *query_write;
    bool prefill;                  /* this phase writes keys 0..keys-1 once */
    _Atomic uint64_t prefill_next; /* next key to prefill */
    _Atomic uint64_t seq_next;     /* --sequential: the next key to write */
    uint64_t t0, t_end;            /* measured window, uv_hrtime() */
    struct worker *workers;
    size_t n_workers;
    bool progress;
    struct bench_live_view live_view; /* the progress line's previous sums */
    struct bench_timeline *timeline;  /* --plot: the same samples, kept */
    uint32_t run;                     /* the run being measured (1..) */
    /* CPU microseconds of the --cpu-pids processes and, last, of this one,
     * at the measured window's start and end (worker 0 samples them). */
    int64_t cpu_start[BENCH_CPU_PIDS_MAX + 1], cpu_end[BENCH_CPU_PIDS_MAX + 1];
};

struct worker {
    struct shared *sh;
    size_t idx;
    uv_loop_t loop;
    uv_timer_t stop_timer, progress_timer, cpu_timer, rate_timer;
    uv_thread_t thread;
    struct conn *conns;
    size_t n_conns;
    struct tk_prng prng;
    struct tk_hist hist;
    uint64_t ops, errors, not_found, redirects;
    size_t n_done; /* prefill: connections out of keys */
    uint64_t last_progress_ops, last_progress_ns;
    _Atomic uint64_t live_ops, live_errors; /* the progress line's view */
    struct bench_live live;                 /* its latencies (bench_progress.h) */
    bool stopping;
    char first_error[160];
    uint32_t slow_printed; /* --slow-ms: lines printed, up to SLOW_LINES_MAX */
    /* --rate: this worker's share, a token bucket refilled by rate_timer
     * (every millisecond), and the connections waiting for a token. */
    double rate, tokens, tokens_max;
    uint64_t tokens_ns;
    struct conn **parked;
    size_t n_parked;
};

static void conn_start(struct conn *c);
static void conn_send(struct conn *c);
static void worker_stop(struct worker *w);

/* --rate: the bucket's tokens as of now (at most 10 ms of requests, so a
 * stalled server does not get a burst of the requests it missed). */
static void rate_refill(struct worker *w)
{
    uint64_t now = uv_hrtime();
    w->tokens += (double)(now - w->tokens_ns) * w->rate / 1e9;
    if (w->tokens > w->tokens_max)
        w->tokens = w->tokens_max;
    w->tokens_ns = now;
}

/* The connection's next request: at once, or (--rate) once a token is free. */
static void conn_next(struct conn *c)
{
    struct worker *w = c->w;
    if (w->rate > 0) {
        rate_refill(w);
        if (c->parked)
            return; /* already waiting (it reconnected meanwhile) */
        if (w->tokens < 1) {
            c->parked = true;
            w->parked[w->n_parked++] = c;
            return;
        }
        w->tokens -= 1;
    }
    conn_send(c);
}

static void on_rate_timer(uv_timer_t *t)
{
    struct worker *w = t->data;
    rate_refill(w);
    size_t i = 0;
    for (; i < w->n_parked && w->tokens >= 1 && !w->stopping; i++) {
        struct conn *c = w->parked[i];
        c->parked = false;
        w->tokens -= 1;
        if (c->tcp_open && !c->busy)
            conn_send(c);
    }
    memmove(w->parked, w->parked + i, (w->n_parked - i) * sizeof(*w->parked));
    w->n_parked -= i;
}

static void rate_start(struct worker *w, uint64_t rate_total, size_t n_workers)
{
    uv_timer_init(&w->loop, &w->rate_timer);
    w->rate_timer.data = w;
    w->parked = tk_calloc(w->n_conns ? w->n_conns : 1, sizeof(*w->parked));
    if (rate_total == 0)
        return;
    w->rate = (double)rate_total / (double)n_workers;
    w->tokens_max = w->rate / 100 > 1 ? w->rate / 100 : 1;
    w->tokens = 1;
    w->tokens_ns = uv_hrtime();
    uv_timer_start(&w->rate_timer, on_rate_timer, 1, 1);
}

static bool in_window(const struct shared *sh, uint64_t t)
{
    return t >= sh->t0 && t <= sh->t_end;
}

static void note_error(struct conn *c, const char *what)
{
    struct worker *w = c->w;
    atomic_fetch_add_explicit(&w->live_errors, 1, memory_order_relaxed);
    if (w->sh->prefill || in_window(w->sh, uv_hrtime()))
        w->errors++;
    if (!w->first_error[0])
        snprintf(w->first_error, sizeof(w->first_error), "%s", what);
    /* A prefill against a dead server would otherwise retry until its cap. */
    if (w->sh->prefill && w->errors > PREFILL_ERRORS_MAX)
        worker_stop(w);
}

static void on_retry(uv_timer_t *t)
{
    conn_start(t->data);
}

static void on_tcp_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (!c->w->stopping && !c->done)
        uv_timer_start(&c->retry, on_retry, c->redirect ? 0 : RECONNECT_MS, 0);
    c->redirect = false;
}

static void conn_close(struct conn *c)
{
    if (c->tcp_open) {
        c->tcp_open = false;
        c->busy = false;
        uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
        tk_tls_free(c->tls);
        c->tls = NULL;
        tk_free(c->plain);
        c->plain = NULL;
    }
}

static void conn_fail(struct conn *c, const char *what)
{
    note_error(c, what);
    conn_close(c);
}

static int on_msg_complete(http_parser *hp)
{
    struct conn *c = hp->data;
    c->got_response = true;
    http_parser_pause(hp, 1);
    return 0;
}

static int on_msg_begin(http_parser *hp)
{
    struct conn *c = hp->data;
    c->in_value = false;
    c->field_len = 0;
    c->leader_len = 0;
    c->leader[0] = '\0';
    return 0;
}

static int on_hfield(http_parser *hp, const char *at, size_t len)
{
    struct conn *c = hp->data;
    if (c->in_value) {
        c->in_value = false;
        c->field_len = 0;
    }
    size_t room = sizeof(c->field) - 1 - c->field_len;
    size_t n = len < room ? len : room;
    memcpy(c->field + c->field_len, at, n);
    c->field_len += n;
    c->field[c->field_len] = '\0';
    return 0;
}

static int on_hvalue(http_parser *hp, const char *at, size_t len)
{
    struct conn *c = hp->data;
    if (!c->in_value) {
        c->in_value = true;
        c->value_is_leader = strcasecmp(c->field, "X-Tierkv-Leader-Addr") == 0;
    }
    if (c->value_is_leader) {
        size_t room = sizeof(c->leader) - 1 - c->leader_len;
        size_t n = len < room ? len : room;
        memcpy(c->leader + c->leader_len, at, n);
        c->leader_len += n;
        c->leader[c->leader_len] = '\0';
    }
    return 0;
}

static const http_parser_settings bench_settings = {
    .on_message_begin = on_msg_begin,
    .on_header_field = on_hfield,
    .on_header_value = on_hvalue,
    .on_message_complete = on_msg_complete,
};

/* A 503 naming a leader among the endpoints moves the connection there: a
 * follower that does not forward would otherwise turn its share of the
 * connections into errors. Returns true if the connection was redirected. */
static bool chase_leader(struct conn *c)
{
    struct shared *sh = c->w->sh;
    struct cli_endpoint ep;
    if (!c->leader[0] || cli_parse_leader_hint(c->leader, &ep) != 0)
        return false;
    char name[CLI_HOST_MAX + 16];
    snprintf(name, sizeof(name), strchr(ep.host, ':') ? "[%s]:%s" : "%s:%s", ep.host,
             ep.port);
    for (size_t i = 0; i < sh->n_eps; i++)
        if (i != c->ep && strcmp(sh->hosts[i], name) == 0) {
            c->ep = i;
            c->redirect = true;
            c->w->redirects++;
            conn_close(c);
            return true;
        }
    return false;
}

/* --slow-ms: a line on stderr for a request slower than that, with the
 * wall-clock time it was sent at (to find it in the servers' logs). */
#define SLOW_LINES_MAX 64

static void note_slow(struct conn *c, uint64_t now, uint64_t took)
{
    struct worker *w = c->w;
    if (w->sh->o->slow_ms == 0 || took <= w->sh->o->slow_ms * 1000000 ||
        w->slow_printed >= SLOW_LINES_MAX)
        return;
    w->slow_printed++;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wall =
        (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec - (now - c->t_sent);
    time_t sec = (time_t)(wall / 1000000000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    char at[32];
    strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "tierkv bench: slow: %.1f ms, a %s sent at %s.%06uZ to %s\n",
            (double)took / 1e6, c->is_read ? "read" : "write", at,
            (unsigned)(wall % 1000000000 / 1000), w->sh->hosts[c->ep]);
}

static void handle_response(struct conn *c)
{
    struct worker *w = c->w;
    struct shared *sh = w->sh;
    uint64_t now = uv_hrtime();
    unsigned st = c->hp.status_code;
    bool keep = http_should_keep_alive(&c->hp) != 0;
    c->busy = false;
    c->got_response = false;
    if ((st >= 200 && st < 300) || (st == 404 && c->is_read))
        bench_live_note(&w->live, now - c->t_sent);
    if (st >= 200 && st < 300) {
        atomic_fetch_add_explicit(&w->live_ops, 1, memory_order_relaxed);
        if (!sh->prefill && in_window(sh, now)) {
            w->ops++;
            tk_hist_record(&w->hist, now - c->t_sent);
            note_slow(c, now, now - c->t_sent);
        }
    } else if (st == 404 && c->is_read) {
        atomic_fetch_add_explicit(&w->live_ops, 1, memory_order_relaxed);
        if (!sh->prefill && in_window(sh, now)) {
            w->ops++;
            w->not_found++;
            tk_hist_record(&w->hist, now - c->t_sent);
        }
    } else if (st == 503 && chase_leader(c)) {
        return;
    } else {
        char what[64];
        snprintf(what, sizeof(what), "HTTP %u", st);
        note_error(c, what);
    }
    if (w->stopping)
        return;
    if (!keep) {
        conn_close(c);
        return;
    }
    conn_next(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)hint;
    struct conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void conn_parse(struct conn *c, const char *data, size_t len)
{
    if (!c->busy) {
        conn_fail(c, "unexpected bytes from the server");
        return;
    }
    size_t n = http_parser_execute(&c->hp, &bench_settings, data, len);
    if (c->got_response) {
        http_parser_pause(&c->hp, 0);
        if (n != len) {
            conn_fail(c, "extra bytes after a response");
            return;
        }
        handle_response(c);
        return;
    }
    if (HTTP_PARSER_ERRNO(&c->hp) != HPE_OK)
        conn_fail(c, http_errno_description(HTTP_PARSER_ERRNO(&c->hp)));
}

/* HTTPS: ciphertext in; the handshake, then the first request once it is
 * done; then every whole record decrypted and parsed. A partial record waits
 * in the session for the next read. */
static void conn_tls_in(struct conn *c, const char *data, size_t len)
{
    if (tk_tls_feed(c->tls, data, len) != 0) {
        conn_fail(c, "TLS: too many undecrypted bytes");
        return;
    }
    bool was_ready = tk_tls_handshake_done(c->tls);
    int h = was_ready ? 1 : tk_tls_handshake(c->tls);
    if (h < 0 || tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp) != 0) {
        char why[TK_TLS_ERR_MAX];
        snprintf(why, sizeof(why), "%s", tk_tls_error(c->tls));
        conn_fail(c, why);
        return;
    }
    if (h == 1 && !was_ready)
        conn_send(c);
    while (c->tls != NULL) {
        ssize_t n = tk_tls_read(c->tls, c->plain, RBUF_BYTES);
        if (n == 0)
            break;
        if (n < 0) {
            conn_fail(c,
                      n == TK_ECLOSED ? "TLS: closed by the server" : "TLS: bad record");
            return;
        }
        conn_parse(c, c->plain, (size_t)n);
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && c->busy) {
            /* A body delimited by the close ends here. */
            http_parser_execute(&c->hp, &bench_settings, NULL, 0);
            if (c->got_response) {
                http_parser_pause(&c->hp, 0);
                handle_response(c);
                conn_close(c);
                return;
            }
        }
        if (c->busy)
            conn_fail(c, nread == UV_EOF ? "connection closed mid-request"
                                         : uv_strerror((int)nread));
        else
            conn_close(c); /* an idle keep-alive connection closed: reconnect */
        return;
    }
    if (c->tls != NULL)
        conn_tls_in(c, buf->base, (size_t)nread);
    else
        conn_parse(c, buf->base, (size_t)nread);
}

static void on_written(uv_write_t *req, int status)
{
    struct conn *c = req->data;
    if (status < 0 && status != UV_ECANCELED && c->tcp_open)
        conn_fail(c, uv_strerror(status));
}

/* A request on a plain socket: uv_try_write first, so one that the kernel
 * takes whole (nearly all) costs one writev and nothing else; a uv_write that
 * completes at once still queues its callback and re-arms the socket's poll
 * entry (an epoll_ctl per request, the client's CPU the servers' figures sit
 * beside). What the kernel does not take goes by uv_write. */
static int conn_write_plain(struct conn *c, uv_buf_t *bufs, size_t nb)
{
    uv_stream_t *s = (uv_stream_t *)&c->tcp;
    if (uv_stream_get_write_queue_size(s) == 0) {
        int n = uv_try_write(s, bufs, (unsigned)nb);
        if (n < 0 && n != UV_EAGAIN)
            return n;
        size_t done = n > 0 ? (size_t)n : 0;
        while (nb > 0 && done >= bufs[0].len) {
            done -= bufs[0].len;
            bufs++;
            nb--;
        }
        if (nb == 0)
            return 0;
        bufs[0].base += done;
        bufs[0].len -= (unsigned)done;
    }
    return uv_write(&c->wreq, s, bufs, (unsigned)nb, on_written);
}

/* --sequential: every write goes to the next key (so N writes make N keys,
 * wrapping at --keys), for loading a cluster to a size. Bench-local: set by
 * parse_bench_args. */
static bool bench_sequential;

static uint64_t pick_key(struct worker *w)
{
    struct shared *sh = w->sh;
    if (bench_sequential)
        return atomic_fetch_add_explicit(&sh->seq_next, 1, memory_order_relaxed) %
               sh->o->keys;
    if (sh->o->dist == CLI_DIST_ZIPF)
        return cli_zipf_next(&sh->zipf, &w->prng);
    return tk_prng_below(&w->prng, sh->o->keys);
}

static void conn_send(struct conn *c)
{
    struct worker *w = c->w;
    struct shared *sh = w->sh;
    uint64_t k;
    if (sh->prefill) {
        k = atomic_fetch_add_explicit(&sh->prefill_next, 1, memory_order_relaxed);
        if (k >= sh->o->keys) {
            c->done = true;
            conn_close(c);
            if (++w->n_done == w->n_conns)
                worker_stop(w);
            return;
        }
        c->is_read = false;
    } else {
        k = pick_key(w);
        c->is_read =
            sh->o->read_fraction > 0 && tk_prng_double(&w->prng) < sh->o->read_fraction;
    }
    char key[128];
    int klen = snprintf(key, sizeof(key), "%s%08" PRIu64, sh->o->key_prefix, k);
    struct bench_iov tail[2];
    size_t n_tail;
    long hn = cli_bench_build(sh->o->protocol, c->is_read, sh->host_lines[c->ep], key,
                              (size_t)klen, c->is_read ? sh->query_read : sh->query_write,
                              &sh->pl, c->hdr, sizeof(c->hdr), tail, &n_tail);
    TK_ASSERT(hn > 0); /* HDR_CAP holds any head a 63-byte prefix allows */
    uv_buf_t bufs[3];
    bufs[0] = uv_buf_init(c->hdr, (unsigned)hn);
    for (size_t i = 0; i < n_tail; i++)
        bufs[1 + i] = uv_buf_init((char *)tail[i].base, (unsigned)tail[i].len);
    c->busy = true;
    c->t_sent = uv_hrtime();
    c->wreq.data = c;
    int rc;
    if (c->tls != NULL)
        rc = tk_tls_uv_write(c->tls, (uv_stream_t *)&c->tcp, bufs, (unsigned)(1 + n_tail),
                             &c->wreq, on_written);
    else
        rc = conn_write_plain(c, bufs, 1 + n_tail);
    if (rc < 0)
        conn_fail(c, c->tls != NULL ? "TLS write failed" : uv_strerror(rc));
}

static void on_connect(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    if (status == UV_ECANCELED)
        return;
    if (status < 0) {
        conn_fail(c, uv_strerror(status));
        return;
    }
    if (c->w->stopping)
        return;
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->hp, HTTP_RESPONSE);
    c->hp.data = c;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0) {
        conn_fail(c, uv_strerror(rc));
        return;
    }
    const struct cli_security *sec = cli_security_get();
    if (sec->tls == NULL) {
        conn_send(c);
        return;
    }
    /* HTTPS: the ClientHello now, the first request when the handshake ends. */
    c->tls = tk_tls_new(sec->tls, c->w->sh->tls_names[c->ep]);
    c->plain = tk_malloc(RBUF_BYTES);
    if (tk_tls_handshake(c->tls) < 0 ||
        tk_tls_uv_flush(c->tls, (uv_stream_t *)&c->tcp) != 0)
        conn_fail(c, "TLS handshake failed to start");
}

static void conn_start(struct conn *c)
{
    struct worker *w = c->w;
    if (w->stopping || c->done)
        return;
    uv_tcp_init(&w->loop, &c->tcp);
    c->tcp.data = c;
    c->tcp_open = true;
    c->creq.data = c;
    int rc = uv_tcp_connect(&c->creq, &c->tcp,
                            (const struct sockaddr *)&w->sh->addrs[c->ep], on_connect);
    if (rc < 0)
        conn_fail(c, uv_strerror(rc));
}

static void worker_stop(struct worker *w)
{
    if (w->stopping)
        return;
    w->stopping = true;
    for (size_t i = 0; i < w->n_conns; i++) {
        struct conn *c = &w->conns[i];
        conn_close(c);
        if (!uv_is_closing((uv_handle_t *)&c->retry))
            uv_close((uv_handle_t *)&c->retry, NULL);
    }
    uv_close((uv_handle_t *)&w->stop_timer, NULL);
    uv_close((uv_handle_t *)&w->cpu_timer, NULL);
    uv_close((uv_handle_t *)&w->rate_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&w->progress_timer))
        uv_close((uv_handle_t *)&w->progress_timer, NULL);
}

/* The CPU time of the --cpu-pids processes and of this one, into v. */
static void cpu_sample(const struct shared *sh, int64_t *v)
{
    int n = sh->o->n_cpu_pids;
    for (int i = 0; i < n; i++)
        v[i] = bench_cpu_us(sh->o->cpu_pids[i]);
    v[n] = bench_cpu_us(0);
}

static void on_cpu_timer(uv_timer_t *t)
{
    struct worker *w = t->data;
    cpu_sample(w->sh, w->sh->cpu_start);
}

static void on_stop_timer(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (w->idx == 0 && !w->sh->prefill)
        cpu_sample(w->sh, w->sh->cpu_end);
    worker_stop(w);
}

static void on_progress(uv_timer_t *t)
{
    struct worker *w = t->data;
    struct shared *sh = w->sh;
    uint64_t ops = 0, errs = 0;
    for (size_t i = 0; i < sh->n_workers; i++) {
        ops += atomic_load_explicit(&sh->workers[i].live_ops, memory_order_relaxed);
        errs += atomic_load_explicit(&sh->workers[i].live_errors, memory_order_relaxed);
    }
    uint64_t now = uv_hrtime();
    double dt = (double)(now - w->last_progress_ns) / 1e9;
    double rate = dt > 0 ? (double)(ops - w->last_progress_ops) / dt : 0;
    w->last_progress_ops = ops;
    w->last_progress_ns = now;
    const char *phase = sh->prefill ? "prefill" : now < sh->t0 ? "warm-up" : "measure";
    double el = now > sh->t0 ? (double)(now - sh->t0) / 1e9 : 0;
    uint64_t p99 = bench_live_p99(&sh->workers[0].live, sh->n_workers,
                                  sizeof(sh->workers[0]), &sh->live_view);
    if (sh->timeline != NULL && !sh->prefill && now >= sh->t0)
        bench_timeline_add(sh->timeline, sh->run, el, rate, (double)p99 / 1e6);
    if (!sh->progress)
        return;
    char line[256];
    bench_progress_format(line, sizeof(line), phase, el,
                          (double)sh->o->duration_ms / 1000, rate, p99, ops, errs);
    fputs(line, stderr);
    fflush(stderr);
}

static void worker_run(void *arg)
{
    struct worker *w = arg;
    uv_run(&w->loop, UV_RUN_DEFAULT);
}

/* One phase (prefill or measured) over all workers; returns after joining. */
static int run_phase(struct shared *sh, struct worker *ws, size_t n_workers,
                     uint64_t conns_total, uint64_t run_idx)
{
    uint64_t now = uv_hrtime();
    if (sh->prefill) {
        sh->t0 = now;
        sh->t_end = now + 600ull * 1000000000ull; /* the prefill cap: 10 minutes */
    } else {
        sh->t0 = now + sh->o->warmup_ms * 1000000ull;
        sh->t_end = sh->t0 + sh->o->duration_ms * 1000000ull;
    }
    atomic_store(&sh->prefill_next, 0);
    sh->run = (uint32_t)run_idx;
    for (size_t i = 0; i < n_workers; i++) {
        struct worker *w = &ws[i];
        memset(w, 0, sizeof(*w));
        w->sh = sh;
        w->idx = i;
        tk_prng_seed(&w->prng, sh->o->seed * 1000003u + run_idx * 7919u + i);
        tk_hist_init(&w->hist);
        w->n_conns = conns_total / n_workers + (i < conns_total % n_workers ? 1 : 0);
        w->conns = tk_calloc(w->n_conns ? w->n_conns : 1, sizeof(struct conn));
        TK_ASSERT(uv_loop_init(&w->loop) == 0);
        uv_timer_init(&w->loop, &w->stop_timer);
        w->stop_timer.data = w;
        uv_timer_start(&w->stop_timer, on_stop_timer, (sh->t_end - now) / 1000000 + 1, 0);
        uv_timer_init(&w->loop, &w->cpu_timer);
        w->cpu_timer.data = w;
        if (i == 0 && !sh->prefill)
            uv_timer_start(&w->cpu_timer, on_cpu_timer, (sh->t0 - now) / 1000000, 0);
        uv_timer_init(&w->loop, &w->progress_timer);
        w->progress_timer.data = w;
        if (i == 0 && (sh->progress || sh->timeline != NULL)) {
            w->last_progress_ns = now;
            memset(&sh->live_view, 0, sizeof(sh->live_view));
            uv_timer_start(&w->progress_timer, on_progress, 1000, 1000);
        }
        rate_start(w, sh->prefill ? 0 : sh->o->rate, n_workers);
        for (size_t k = 0; k < w->n_conns; k++) {
            struct conn *c = &w->conns[k];
            c->w = w;
            c->ep = (k * n_workers + i) % sh->n_eps;
            uv_timer_init(&w->loop, &c->retry);
            c->retry.data = c;
            conn_start(c);
        }
    }
    sh->workers = ws;
    sh->n_workers = n_workers;
    for (size_t i = 0; i < n_workers; i++)
        if (uv_thread_create(&ws[i].thread, worker_run, &ws[i]) != 0)
            return TK_EIO;
    for (size_t i = 0; i < n_workers; i++)
        uv_thread_join(&ws[i].thread);
    if (sh->progress)
        fprintf(stderr, "\r\033[K");
    int rc = 0;
    for (size_t i = 0; i < n_workers; i++) {
        if (uv_loop_close(&ws[i].loop) != 0)
            rc = TK_EIO; /* a leaked handle is a bug in this file */
        tk_free(ws[i].conns);
        tk_free(ws[i].parked);
    }
    return rc;
}

/* The JSON line's "over_ms": requests slower than each of these, summed
 * over the runs (a bench in steps adds them up to a tail over all of its
 * steps, which percentiles do not). */
static const uint64_t over_ms[] = {10, 25, 50, 150};
#define N_OVER (sizeof(over_ms) / sizeof(over_ms[0]))

struct run_result {
    double ops_per_s;
    uint64_t ops, errors, not_found, redirects;
    uint64_t over[N_OVER];           /* requests slower than over_ms[i] */
    double p50, p90, p99, p999, max; /* ms */
    /* CPU microseconds per op of each --cpu-pids process and, last, of the
     * bench itself (-1: unreadable, or no op). */
    double cpu_us[BENCH_CPU_PIDS_MAX + 1];
    char first_error[160];
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char bench_help[] =
    "usage: tierkv bench [options]\n"
    "  --protocol tierkv|etcd  the v1 gateway (default) or etcd's v3 JSON gateway\n"
    "  -c, --connections N     keep-alive connections, one request in flight each (16)\n"
    "  -d, --duration D        measured time per run, e.g. 10s (10s)\n"
    "  --warmup D              unmeasured time before each run (1s)\n"
    "  --value-size SIZE       bytes per value, e.g. 64 or 1k (64)\n"
    "  --mix R:W               read:write ratio, or read / write (write)\n"
    "  --keys N                key space size (10000)\n"
    "  --dist uniform|zipf[:THETA]  key distribution (uniform; zipf theta 0.99)\n"
    "  --sequential            each write to the next key (loading N keys)\n"
    "  --threads 1|2           loop threads driving the connections (1)\n"
    "  --rate N                at most N requests a second in all (a steady load;\n"
    "                          latency counts from each request's send) (unpaced)\n"
    "  --slow-ms N             print each request slower than N ms, with the time\n"
    "                          it was sent (64 per thread at most) (none)\n"
    "  --runs N                repeat the run N times and report medians (1)\n"
    "  --seed N                PRNG seed (1)\n"
    "  --no-prefill            do not write every key once before runs with reads\n"
    "  --key-prefix P          key prefix (bench/)\n"
    "  --progress|--no-progress  the live line on stderr (default: if a terminal)\n"
    "  --strict                exit 1 if any request failed\n"
    "  --plot FILE.svg         draw each run's ops/s and p99 second by second (gnuplot)\n"
    "  --cpu-pids PID[,PID..]  report the CPU microseconds per op of these processes\n"
    "                          (the servers; /proc utime+stime over the window) (none)\n"
    "Global --mode and --consistency apply to writes and reads (etcd: --consistency\n"
    "stale sends serializable ranges). Prints a table and one JSON line (--json: the\n"
    "JSON line only). Exits 5 if no request succeeded.\n";

/* The longest loop turn any endpoint's node has had (since it started), from
 * /metrics' tierkv_loop_turn_max_seconds{phase=...}: ms (-1 if no endpoint
 * answered) and its phase in `phase`. */
static double max_loop_turn(const struct cli_global *g, char *phase, size_t cap)
{
    static const char name[] = "tierkv_loop_turn_max_seconds{phase=\"";
    double best = -1;
    snprintf(phase, cap, "-");
    for (size_t i = 0; i < g->client.n_eps; i++) {
        struct cli_response r = {0};
        char err[128];
        if (cli_request_one(&g->client.eps[i], 2000, "GET", "/metrics", NULL, NULL, 0, &r,
                            err, sizeof(err)) != 0)
            continue;
        for (const char *p = r.body; r.status == 200 && (p = strstr(p, name)) != NULL;) {
            p += sizeof(name) - 1;
            const char *q = strchr(p, '"');
            if (q == NULL)
                break;
            double v = strtod(q + 2, NULL) * 1000;
            if (v > best) {
                best = v;
                snprintf(phase, cap, "%.*s", (int)(q - p), p);
            }
            p = q;
        }
        cli_response_free(&r);
    }
    return best;
}

static int bench_usage(const char *msg)
{
    fprintf(stderr, "tierkv bench: %s (see tierkv bench --help)\n", msg);
    return CLI_EXIT_USAGE;
}

/* ---- the options ---- */

/* Setters of the options that are not a plain number or duration: each stores
 * its value (NULL for a switch) and returns 0, or -1 for a bad value. */
static int set_protocol(struct bench_opts *o, const char *v)
{
    if (strcmp(v, "tierkv") == 0 || strcmp(v, "http") == 0)
        o->protocol = CLI_PROTO_TIERKV;
    else if (strcmp(v, "etcd") == 0)
        o->protocol = CLI_PROTO_ETCD;
    else
        return -1;
    return 0;
}

static int set_warmup(struct bench_opts *o, const char *v)
{
    if (strcmp(v, "0") == 0) {
        o->warmup_ms = 0;
        return 0;
    }
    return cli_parse_duration_ms(v, &o->warmup_ms) == 0 ? 0 : -1;
}

static int set_value_size(struct bench_opts *o, const char *v)
{
    return cli_parse_size(v, &o->value_size) == 0 && o->value_size <= VALUE_MAX ? 0 : -1;
}

static int set_mix(struct bench_opts *o, const char *v)
{
    return cli_parse_mix(v, &o->read_fraction) == 0 ? 0 : -1;
}

static int set_dist(struct bench_opts *o, const char *v)
{
    return cli_parse_dist(v, &o->dist, &o->zipf_theta) == 0 ? 0 : -1;
}

static int set_key_prefix(struct bench_opts *o, const char *v)
{
    if (strlen(v) >= sizeof(o->key_prefix))
        return -1;
    snprintf(o->key_prefix, sizeof(o->key_prefix), "%s", v);
    return 0;
}

static int set_plot(struct bench_opts *o, const char *v)
{
    o->plot = v;
    return 0;
}

static int set_cpu_pids(struct bench_opts *o, const char *v)
{
    o->n_cpu_pids = bench_cpu_parse_pids(v, o->cpu_pids);
    return o->n_cpu_pids < 0 ? -1 : 0;
}

static int set_no_prefill(struct bench_opts *o, const char *v)
{
    (void)v;
    o->prefill = false;
    return 0;
}

static int set_progress(struct bench_opts *o, const char *v)
{
    (void)v;
    o->progress = 1;
    return 0;
}

static int set_no_progress(struct bench_opts *o, const char *v)
{
    (void)v;
    o->progress = 0;
    return 0;
}

static int set_strict(struct bench_opts *o, const char *v)
{
    (void)v;
    o->strict = true;
    return 0;
}

static int set_sequential(struct bench_opts *o, const char *v)
{
    (void)o;
    (void)v;
    bench_sequential = true;
    return 0;
}

enum bench_flag_kind {
    BF_U64,      /* an integer in [lo, hi] into the uint64_t at `offset` */
    BF_DURATION, /* a duration in ms into the uint64_t at `offset` */
    BF_VALUE,    /* set(o, value) */
    BF_SWITCH,   /* set(o, NULL); takes no value */
};

/* getopt_long's value for bench_flags[i] is BENCH_FLAG_BASE + i. */
#define BENCH_FLAG_BASE 256
#define U64_AT(field) BF_U64, offsetof(struct bench_opts, field)

/* bench's options, one row each; bench_help describes them. */
static const struct bench_flag {
    const char *name;
    char short_name; /* 0: none */
    enum bench_flag_kind kind;
    size_t offset;                                   /* BF_U64, BF_DURATION */
    uint64_t lo, hi;                                 /* BF_U64 */
    int (*set)(struct bench_opts *o, const char *v); /* BF_VALUE, BF_SWITCH */
    const char *bad;                                 /* the usage error for a bad value */
} bench_flags[] = {
    {"protocol", 0, BF_VALUE, 0, 0, 0, set_protocol, "--protocol is tierkv or etcd"},
    {"connections", 'c', U64_AT(connections), 1, CONNECTIONS_MAX, NULL,
     "--connections wants 1..20000"},
    {"duration", 'd', BF_DURATION, offsetof(struct bench_opts, duration_ms), 0, 0, NULL,
     "--duration wants a duration like 10s"},
    {"warmup", 0, BF_VALUE, 0, 0, 0, set_warmup,
     "--warmup wants a duration like 1s, or 0"},
    {"value-size", 0, BF_VALUE, 0, 0, 0, set_value_size, "--value-size wants 0..1MiB"},
    {"mix", 0, BF_VALUE, 0, 0, 0, set_mix, "--mix wants R:W (like 90:10), read or write"},
    {"keys", 0, U64_AT(keys), 1, 100000000, NULL, "--keys wants 1..100000000"},
    {"dist", 0, BF_VALUE, 0, 0, 0, set_dist,
     "--dist wants uniform, zipf or zipf:THETA (0<THETA<1)"},
    {"threads", 0, U64_AT(threads), 1, 2, NULL, "--threads wants 1 or 2"},
    {"runs", 0, U64_AT(runs), 1, 100, NULL, "--runs wants 1..100"},
    {"seed", 0, U64_AT(seed), 0, UINT64_MAX, NULL, "--seed wants an unsigned integer"},
    {"no-prefill", 0, BF_SWITCH, 0, 0, 0, set_no_prefill, NULL},
    {"key-prefix", 0, BF_VALUE, 0, 0, 0, set_key_prefix,
     "--key-prefix is too long (63 bytes at most)"},
    {"progress", 0, BF_SWITCH, 0, 0, 0, set_progress, NULL},
    {"no-progress", 0, BF_SWITCH, 0, 0, 0, set_no_progress, NULL},
    {"strict", 0, BF_SWITCH, 0, 0, 0, set_strict, NULL},
    {"sequential", 0, BF_SWITCH, 0, 0, 0, set_sequential, NULL},
    {"plot", 0, BF_VALUE, 0, 0, 0, set_plot, NULL},
    {"cpu-pids", 0, BF_VALUE, 0, 0, 0, set_cpu_pids,
     "--cpu-pids wants PID[,PID...] (8 at most)"},
    {"rate", 0, U64_AT(rate), 1, 100000000, NULL,
     "--rate wants 1..100000000 requests a second"},
    {"slow-ms", 0, U64_AT(slow_ms), 1, 3600000, NULL, "--slow-ms wants 1..3600000"},
};

#undef U64_AT
#define BENCH_FLAGS_N (sizeof(bench_flags) / sizeof(bench_flags[0]))

/* The row getopt_long's answer `ch` stands for, or NULL (unknown, or a
 * missing value). */
static const struct bench_flag *bench_flag_for(int ch)
{
    if (ch >= BENCH_FLAG_BASE && ch < BENCH_FLAG_BASE + (int)BENCH_FLAGS_N)
        return &bench_flags[ch - BENCH_FLAG_BASE];
    for (size_t i = 0; ch != 0 && i < BENCH_FLAGS_N; i++)
        if (bench_flags[i].short_name == ch)
            return &bench_flags[i];
    return NULL;
}

/* Stores f's value v into o. Returns 0 or -1 (bad value). */
static int bench_flag_apply(struct bench_opts *o, const struct bench_flag *f,
                            const char *v)
{
    uint64_t *field = (uint64_t *)(void *)((char *)o + f->offset);
    switch (f->kind) {
    case BF_U64:
        return cli_parse_u64(v, f->lo, f->hi, field) == 0 ? 0 : -1;
    case BF_DURATION:
        return cli_parse_duration_ms(v, field) == 0 ? 0 : -1;
    case BF_VALUE:
        return f->set(o, v);
    case BF_SWITCH:
        return f->set(o, NULL);
    }
    return -1;
}

/* Parses bench's arguments into o. Returns 0, -1 when --help was printed, or
 * CLI_EXIT_USAGE with the reason printed. */
static int parse_bench_args(struct bench_opts *o, int argc, char **argv)
{
    struct option opts[BENCH_FLAGS_N + 2];
    for (size_t i = 0; i < BENCH_FLAGS_N; i++)
        opts[i] = (struct option){bench_flags[i].name,
                                  bench_flags[i].kind == BF_SWITCH ? no_argument
                                                                   : required_argument,
                                  NULL, BENCH_FLAG_BASE + (int)i};
    opts[BENCH_FLAGS_N] = (struct option){"help", no_argument, NULL, 'h'};
    opts[BENCH_FLAGS_N + 1] = (struct option){NULL, 0, NULL, 0};
    optind = 1;
    bench_sequential = false;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "+c:d:h", opts, NULL)) != -1) {
        if (ch == 'h') {
            fputs(bench_help, stdout);
            return -1;
        }
        const struct bench_flag *f = bench_flag_for(ch);
        if (f == NULL)
            return bench_usage("unknown option or missing value");
        if (bench_flag_apply(o, f, optarg) != 0)
            return bench_usage(f->bad);
    }
    if (optind != argc)
        return bench_usage("takes no positional arguments");
    return 0;
}

static const char *op_name(const struct bench_opts *o)
{
    if (o->read_fraction <= 0)
        return "put";
    if (o->read_fraction >= 1)
        return "get";
    return "mix";
}

static void raise_fd_limit(uint64_t need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need + 64) {
        rl.rlim_cur = rl.rlim_max < need + 64 ? rl.rlim_max : need + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* --plot: the timeline's SVG; a failed plot makes the exit code 1. */
static int bench_plot_out(const struct bench_opts *o, const struct bench_timeline *tl,
                          const char *proto, int code)
{
    if (o->plot == NULL)
        return code;
    char title[160];
    snprintf(title, sizeof(title),
             "tierkv bench: protocol %s, %s, %" PRIu64 " connections, %" PRIu64
             " B values",
             proto, op_name(o), o->connections, o->value_size);
    if (bench_timeline_plot(tl, o->plot, title) != 0)
        return code ? code : CLI_EXIT_ERROR;
    fprintf(stderr, "tierkv bench: plot written to %s\n", o->plot);
    return code;
}

/* One `tierkv bench`: its options, the state its loops share, and what its
 * runs measured, passed between cli_cmd_bench's steps. */
struct bench {
    struct cli_global *g;
    struct bench_opts o;
    struct shared *sh;
    const char *proto;   /* "tierkv" or "etcd" */
    char eps_text[1024]; /* the endpoints, comma-separated */
    char dist_text[32];
    char query_write[48], query_read[48];
    char *value, *value_b64; /* the one value every write sends */
    struct bench_timeline timeline;
    struct worker *ws;
    struct run_result *res; /* one per run */
    uint64_t total_ops, total_err, total_nf, total_redirects;
};

/* The medians over the runs and the JSON line's parts built from them. */
struct bench_summary {
    double ops, p50, p90, p99, p999, max;
    /* Each --cpu-pids process's median CPU per op and, last, the bench's; the
     * median of the runs' sums over the processes (-1: none). */
    double cpu_med[BENCH_CPU_PIDS_MAX + 1], cpu_total;
    char cpu_json[64 + 24 * BENCH_CPU_PIDS_MAX];
    char over_json[32 * N_OVER];
    char turn_phase[32];
    double turn_ms; /* the nodes' longest loop turn (-1: unknown) */
};

/* Resolves the endpoints into the addresses and Host lines the loops use.
 * Returns 0 or CLI_EXIT_UNAVAILABLE with the reason printed. */
static int bench_endpoints(struct shared *sh, const struct cli_client *c)
{
    const char *tok = cli_security_get()->token;
    sh->n_eps = c->n_eps;
    for (size_t i = 0; i < sh->n_eps; i++) {
        const struct cli_endpoint *ep = &c->eps[i];
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res;
        int grc = getaddrinfo(ep->host, ep->port, &hints, &res);
        if (grc != 0) {
            fprintf(stderr, "tierkv bench: cannot resolve %s: %s\n", ep->host,
                    gai_strerror(grc));
            return CLI_EXIT_UNAVAILABLE;
        }
        memcpy(&sh->addrs[i], res->ai_addr, res->ai_addrlen);
        freeaddrinfo(res);
        snprintf(sh->hosts[i], sizeof(sh->hosts[i]),
                 strchr(ep->host, ':') ? "[%s]:%s" : "%s:%s", ep->host, ep->port);
        sh->tls_names[i] = ep->host;
        snprintf(sh->host_lines[i], sizeof(sh->host_lines[i]), "%s%s%s", sh->hosts[i],
                 tok != NULL ? "\r\nAuthorization: Bearer " : "", tok != NULL ? tok : "");
    }
    return 0;
}

/* One value for every write: printable bytes so both protocols carry it. */
static void bench_payload_make(struct bench *b)
{
    uint64_t size = b->o.value_size;
    b->value = tk_malloc(size + 1);
    struct tk_prng vp;
    tk_prng_seed(&vp, b->o.seed);
    for (uint64_t i = 0; i < size; i++)
        b->value[i] = (char)('a' + tk_prng_below(&vp, 26));
    b->value[size] = '\0';
    b->value_b64 = tk_malloc(tk_base64_encoded_len(size) + 1);
    b->sh->pl = (struct bench_payload){b->value, b->value_b64, size,
                                       tk_base64_encode(b->value, size, b->value_b64)};
}

/* The global --mode and --consistency as each protocol asks for them. */
static void bench_queries(struct bench *b)
{
    const struct cli_global *g = b->g;
    if (b->o.protocol == CLI_PROTO_TIERKV) {
        if (g->mode[0])
            snprintf(b->query_write, sizeof(b->query_write), "?mode=%s", g->mode);
        if (g->consistency[0])
            snprintf(b->query_read, sizeof(b->query_read), "?consistency=%s",
                     g->consistency);
    } else if (strcmp(g->consistency, "stale") == 0) {
        snprintf(b->query_read, sizeof(b->query_read), "serializable");
    }
    b->sh->query_write = b->query_write;
    b->sh->query_read = b->query_read;
}

/* Everything the runs need once the endpoints resolve, and the header line. */
static void bench_prepare(struct bench *b)
{
    struct bench_opts *o = &b->o;
    struct shared *sh = b->sh;
    bench_payload_make(b);
    bench_queries(b);
    sh->progress = o->progress < 0 ? isatty(STDERR_FILENO) != 0 : o->progress != 0;
    if (o->plot != NULL)
        sh->timeline = &b->timeline;
    if (o->connections < o->threads)
        o->threads = o->connections;
    raise_fd_limit(o->connections);
    b->proto = o->protocol == CLI_PROTO_TIERKV ? "tierkv" : "etcd";
    for (size_t i = 0; i < sh->n_eps; i++) {
        size_t l = strlen(b->eps_text);
        snprintf(b->eps_text + l, sizeof(b->eps_text) - l, "%s%s", i ? "," : "",
                 sh->hosts[i]);
    }
    if (o->dist == CLI_DIST_ZIPF)
        snprintf(b->dist_text, sizeof(b->dist_text), "zipf:%.2f", o->zipf_theta);
    else
        snprintf(b->dist_text, sizeof(b->dist_text), "uniform");
    if (!b->g->json)
        printf("tierkv bench: protocol=%s op=%s read_fraction=%.2f connections=%" PRIu64
               " threads=%" PRIu64 " duration=%.1fs value_size=%" PRIu64 " keys=%" PRIu64
               " dist=%s endpoints=%s\n",
               b->proto, op_name(o), o->read_fraction, o->connections, o->threads,
               (double)o->duration_ms / 1000, o->value_size, o->keys, b->dist_text,
               b->eps_text);
    b->ws = tk_calloc(o->threads, sizeof(struct worker));
    b->res = tk_calloc(o->runs, sizeof(*b->res));
}

/* Writes every key once, so that reads hit. */
static void bench_prefill(struct bench *b)
{
    struct shared *sh = b->sh;
    sh->prefill = true;
    if (!b->g->json)
        printf("prefill: writing %" PRIu64 " keys\n", b->o.keys);
    fflush(stdout);
    int rc = run_phase(sh, b->ws, b->o.threads, b->o.connections, 0);
    uint64_t perr = 0;
    for (size_t i = 0; i < b->o.threads; i++)
        perr += b->ws[i].errors;
    if (rc != 0 || perr > 0)
        fprintf(stderr, "tierkv bench: prefill had %" PRIu64 " errors (first: %s)\n",
                perr, b->ws[0].first_error[0] ? b->ws[0].first_error : "?");
    sh->prefill = false;
}

/* The workers' counts and latencies of the run just measured, into rr. */
static void run_result_collect(const struct bench *b, struct run_result *rr)
{
    const struct bench_opts *o = &b->o;
    struct tk_hist h;
    tk_hist_init(&h);
    for (size_t i = 0; i < o->threads; i++) {
        const struct worker *w = &b->ws[i];
        tk_hist_merge(&h, &w->hist);
        rr->ops += w->ops;
        rr->errors += w->errors;
        rr->not_found += w->not_found;
        rr->redirects += w->redirects;
        if (!rr->first_error[0] && w->first_error[0])
            snprintf(rr->first_error, sizeof(rr->first_error), "%s", w->first_error);
    }
    rr->ops_per_s = (double)rr->ops / ((double)o->duration_ms / 1000);
    rr->p50 = (double)tk_hist_quantile(&h, 0.5) / 1e6;
    rr->p90 = (double)tk_hist_quantile(&h, 0.9) / 1e6;
    rr->p99 = (double)tk_hist_quantile(&h, 0.99) / 1e6;
    rr->p999 = (double)tk_hist_quantile(&h, 0.999) / 1e6;
    rr->max = (double)tk_hist_quantile(&h, 1.0) / 1e6;
    for (size_t i = 0; i < N_OVER; i++)
        rr->over[i] = tk_hist_count_over(&h, over_ms[i] * 1000000);
    for (int i = 0; i <= o->n_cpu_pids; i++) {
        int64_t a = b->sh->cpu_start[i], e = b->sh->cpu_end[i];
        rr->cpu_us[i] =
            a >= 0 && e >= a && rr->ops > 0 ? (double)(e - a) / (double)rr->ops : -1;
    }
}

/* Run r's row of the table (and its CPU line), and its errors on stderr. */
static void run_result_print(const struct bench *b, uint64_t r,
                             const struct run_result *rr)
{
    const struct bench_opts *o = &b->o;
    if (!b->g->json) {
        printf("%-6" PRIu64 " %12.1f %10" PRIu64
               " %9.3f %9.3f %9.3f %9.3f %9.3f %8" PRIu64 " %9" PRIu64 "\n",
               r + 1, rr->ops_per_s, rr->ops, rr->p50, rr->p90, rr->p99, rr->p999,
               rr->max, rr->errors, rr->not_found);
        fflush(stdout);
    }
    if (!b->g->json && o->n_cpu_pids > 0) {
        printf("       CPU us/op:");
        for (int i = 0; i < o->n_cpu_pids; i++)
            printf(" pid %d %.1f,", o->cpu_pids[i], rr->cpu_us[i]);
        printf(" bench %.1f\n", rr->cpu_us[o->n_cpu_pids]);
        fflush(stdout);
    }
    if (rr->errors > 0)
        fprintf(stderr, "tierkv bench: run %" PRIu64 ": %" PRIu64 " errors (first: %s)\n",
                r + 1, rr->errors, rr->first_error);
}

/* The prefill (when the mix has reads), then each run, a row each. Returns 0
 * or CLI_EXIT_ERROR (a loop that did not close cleanly). */
static int bench_measure(struct bench *b)
{
    const struct bench_opts *o = &b->o;
    int code = 0;
    if (o->prefill && o->read_fraction > 0)
        bench_prefill(b);
    if (!b->g->json) {
        printf("%-6s %12s %10s %9s %9s %9s %9s %9s %8s %9s\n", "run", "ops/s", "ops",
               "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms", "errors", "not_found");
        fflush(stdout);
    }
    for (uint64_t r = 0; r < o->runs; r++) {
        if (run_phase(b->sh, b->ws, o->threads, o->connections, r + 1) != 0) {
            fprintf(stderr,
                    "tierkv bench: internal error: a loop did not close cleanly\n");
            code = CLI_EXIT_ERROR;
        }
        struct run_result *rr = &b->res[r];
        run_result_collect(b, rr);
        b->total_ops += rr->ops;
        b->total_err += rr->errors;
        b->total_nf += rr->not_found;
        b->total_redirects += rr->redirects;
        run_result_print(b, r, rr);
    }
    return code;
}

/* The medians of the runs' throughput and percentiles, the largest max, and
 * the table's median row when there is more than one run. */
static void bench_medians(const struct bench *b, struct bench_summary *s)
{
    uint64_t runs = b->o.runs;
    double v[5][100];
    for (uint64_t r = 0; r < runs; r++) {
        v[0][r] = b->res[r].ops_per_s;
        v[1][r] = b->res[r].p50;
        v[2][r] = b->res[r].p90;
        v[3][r] = b->res[r].p99;
        v[4][r] = b->res[r].p999;
    }
    s->ops = median(v[0], runs);
    s->p50 = median(v[1], runs);
    s->p90 = median(v[2], runs);
    s->p99 = median(v[3], runs);
    s->p999 = median(v[4], runs);
    s->max = 0;
    for (uint64_t r = 0; r < runs; r++)
        s->max = b->res[r].max > s->max ? b->res[r].max : s->max;
    if (!b->g->json && runs > 1)
        printf("%-6s %12.1f %10" PRIu64 " %9.3f %9.3f %9.3f %9.3f %9.3f %8" PRIu64
               " %9" PRIu64 "\n",
               "median", s->ops, b->total_ops, s->p50, s->p90, s->p99, s->p999, s->max,
               b->total_err, b->total_nf);
}

/* CPU per op: each process's median over the runs, and the median of the
 * runs' sums over the --cpu-pids processes (printed when there are any). */
static void bench_cpu_medians(const struct bench *b, struct bench_summary *s)
{
    const struct bench_opts *o = &b->o;
    double v[100];
    s->cpu_total = -1;
    for (int i = 0; i <= o->n_cpu_pids; i++) {
        for (uint64_t r = 0; r < o->runs; r++)
            v[r] = b->res[r].cpu_us[i];
        s->cpu_med[i] = median(v, o->runs);
    }
    if (o->n_cpu_pids == 0)
        return;
    for (uint64_t r = 0; r < o->runs; r++) {
        v[r] = 0;
        for (int i = 0; i < o->n_cpu_pids; i++)
            v[r] = v[r] < 0 || b->res[r].cpu_us[i] < 0 ? -1 : v[r] + b->res[r].cpu_us[i];
    }
    s->cpu_total = median(v, o->runs);
    if (!b->g->json)
        printf("median CPU us/op: servers %.1f in all, bench %.1f\n", s->cpu_total,
               s->cpu_med[o->n_cpu_pids]);
}

/* The JSON line's "cpu_us_per_op" list and "over_ms" object. */
static void bench_json_parts(const struct bench *b, struct bench_summary *s)
{
    size_t cj = 0;
    s->cpu_json[0] = '\0';
    for (int i = 0; i < b->o.n_cpu_pids; i++)
        cj += (size_t)snprintf(s->cpu_json + cj, sizeof(s->cpu_json) - cj, "%s%.2f",
                               i ? "," : "", s->cpu_med[i]);
    size_t oj = 0;
    s->over_json[0] = '\0';
    for (size_t i = 0; i < N_OVER; i++) {
        uint64_t n = 0;
        for (uint64_t r = 0; r < b->o.runs; r++)
            n += b->res[r].over[i];
        oj += (size_t)snprintf(s->over_json + oj, sizeof(s->over_json) - oj,
                               "%s\"%" PRIu64 "\":%" PRIu64, i ? "," : "", over_ms[i], n);
    }
}

/* The one JSON line (also with --json). */
static void bench_print_json(const struct bench *b, const struct bench_summary *s)
{
    const struct bench_opts *o = &b->o;
    printf("{\"bench\":\"http\",\"protocol\":\"%s\",\"op\":\"%s\",\"read_fraction\":%.3f,"
           "\"connections\":%" PRIu64 ",\"threads\":%" PRIu64 ",\"rate\":%" PRIu64
           ",\"duration_s\":%.3f,"
           "\"value_size\":%" PRIu64 ",\"keys\":%" PRIu64
           ",\"dist\":\"%s\",\"runs\":%" PRIu64 ",\"ops\":%" PRIu64
           ",\"ops_per_s\":%.1f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,"
           "\"p99_ms\":%.3f,\"p999_ms\":%.3f,\"max_ms\":%.3f,\"errors\":%" PRIu64
           ",\"not_found\":%" PRIu64 ",\"redirects\":%" PRIu64 ",\"over_ms\":{%s},"
           "\"max_loop_turn_ms\":%.1f,"
           "\"cpu_us_per_op\":[%s],\"cpu_us_per_op_total\":%.2f,"
           "\"bench_cpu_us_per_op\":%.2f,"
           "\"mode\":\"%s\",\"consistency\":\"%s\","
           "\"endpoints\":\"%s\"}\n",
           b->proto, op_name(o), o->read_fraction, o->connections, o->threads, o->rate,
           (double)o->duration_ms / 1000, o->value_size, o->keys, b->dist_text, o->runs,
           b->total_ops, s->ops, s->p50, s->p90, s->p99, s->p999, s->max, b->total_err,
           b->total_nf, b->total_redirects, s->over_json, s->turn_ms, s->cpu_json,
           s->cpu_total, s->cpu_med[o->n_cpu_pids], b->g->mode, b->g->consistency,
           b->eps_text);
    fflush(stdout);
}

/* The summary lines, the JSON line and the plot; returns the exit code, from
 * `code` (the runs') and what the runs counted. */
static int bench_report(struct bench *b, int code)
{
    struct bench_summary s;
    bench_medians(b, &s);
    bench_cpu_medians(b, &s);
    bench_json_parts(b, &s);
    s.turn_ms = b->o.protocol == CLI_PROTO_TIERKV
                    ? max_loop_turn(b->g, s.turn_phase, sizeof(s.turn_phase))
                    : -1;
    if (!b->g->json && s.turn_ms >= 0)
        printf("longest loop turn of the nodes (since they started): %.1f ms, in %s\n",
               s.turn_ms, s.turn_phase);
    bench_print_json(b, &s);
    code = bench_plot_out(&b->o, &b->timeline, b->proto, code);
    if (code == 0 && b->total_ops == 0) {
        fprintf(stderr, "tierkv bench: no request succeeded\n");
        code = CLI_EXIT_UNAVAILABLE;
    } else if (code == 0 && b->o.strict && b->total_err > 0) {
        code = CLI_EXIT_ERROR;
    }
    return code;
}

int cli_cmd_bench(struct cli_global *g, int argc, char **argv)
{
    struct bench *b = tk_calloc(1, sizeof(*b));
    b->g = g;
    cli_bench_defaults(&b->o);
    int code = parse_bench_args(&b->o, argc, argv);
    if (code != 0) {
        tk_free(b);
        return code < 0 ? 0 : code;
    }
    b->sh = tk_calloc(1, sizeof(*b->sh));
    b->sh->o = &b->o;
    code = bench_endpoints(b->sh, &g->client);
    if (code == 0 && b->o.dist == CLI_DIST_ZIPF &&
        cli_zipf_init(&b->sh->zipf, b->o.keys, b->o.zipf_theta) != 0)
        code = bench_usage("bad zipf parameters");
    if (code == 0) {
        bench_prepare(b);
        code = bench_report(b, bench_measure(b));
        bench_timeline_free(&b->timeline);
        tk_free(b->res);
        tk_free(b->ws);
        tk_free(b->value);
        tk_free(b->value_b64);
    }
    tk_free(b->sh);
    tk_free(b);
    return code;
}
