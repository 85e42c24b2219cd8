/* transport-bench: the Core.Net loopback baseline for tierkv's transports.
 *
 * Runs, in one process and one run, the same segments over
 *   tcp      two TCP transports, each on its own loop thread, over 127.0.0.1;
 *   tcp-mtls the same with peer mutual TLS (a self-signed certificate naming
 *            both nodes, made at start), to measure what TLS costs;
 *   inproc1  two in-process endpoints sharing one loop thread;
 *   inproc2  two in-process endpoints, each on its own loop thread;
 *   floor    plain blocking sockets, no framing, no libuv (the ceiling).
 * Segments: one-way 64 B x 100k, 64 KiB x 2k and 1 KiB x 20k (a message is an
 * AppendEntries with one entry of that size); request round trip 64 B x 2k
 * (mean, p50, p99); pipelined 64 B requests with a window of 256 x 50k. Each
 * segment is warmed up (a tenth of its size) before it is timed, and the clock
 * stops only when the receiver (or, for requests, the requester) has seen
 * everything. Each figure is the median of `runs` repetitions (3; --quick: 1
 * run of a tenth of the size). Prints a table and one JSON line.
 *
 * --plot FILE.svg draws the request round trip (p50, p99, mean) of each
 * transport against the two floors (plain sockets; raw libuv echo), and the
 * one-way 64 B and pipelined rates of each (bench_plot.h).
 *
 * Usage: transport-bench [--quick] [--runs N] [--only tcp|inproc-1loop|...]
 *                        [--segment 0-4]   (for profiling one cell)
 *                        [--plot FILE.svg] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/log.h"
#include "cmd/benchplot/bench_args.h"
#include "cmd/benchplot/bench_plot.h"
#include "tls/tls.h"
#include "tls/tls_testcert.h"
#include "transport/transport.h"

enum seg_kind { SEG_ONEWAY, SEG_RTT, SEG_PIPELINED };

struct seg {
    enum seg_kind kind;
    size_t n;
    size_t size;
    size_t window;
};

struct result {
    double secs;
    struct tk_hist rtt; /* SEG_RTT only, ns */
};

/* ---- A pair of transports on one or two loop threads ---- */

struct lp {
    uv_loop_t loop;
    uv_async_t cmd;
    uv_thread_t th;
    struct pair *pair;
    bool is_a; /* hosts endpoint a */
    bool hosts_b;
};

struct pair {
    struct lp la, lb_own;
    struct lp *lb; /* &la when shared */
    struct transport *a, *b;
    int op; /* OP_START or OP_CLOSE, set by main before uv_async_send */
    struct seg seg;
    struct tk_blob *payload;
    /* a's thread */
    uv_idle_t pump;
    size_t sent, replies;
    uint64_t t0, t_last_send;
    struct tk_hist *hist;
    /* b's thread */
    size_t received;
    /* done */
    uint64_t t_end;
    uv_sem_t done;
    uv_sem_t up;
    int ups_needed;
    _Atomic int ups;
};

enum { OP_START = 1, OP_CLOSE = 2 };

static int send_req(struct pair *p)
{
    struct raft_entry e = {.term = 1, .index = p->sent + 1, .data = p->payload};
    struct raft_message m = {.type = RAFT_MSG_APPEND, .from = 1, .to = 2, .term = 1};
    m.u.append.prev_index = p->sent;
    m.u.append.read_ctx = p->sent;
    m.u.append.n_entries = 1;
    m.u.append.entries = &e;
    int rc = transport_send(p->a, &m);
    if (rc == 0) {
        if (p->seg.kind == SEG_RTT)
            p->t_last_send = uv_hrtime();
        p->sent++;
    } else {
        TK_ASSERT(rc == TK_EBUSY);
    }
    return rc;
}

static void pump_stop(struct pair *p)
{
    if (uv_is_active((uv_handle_t *)&p->pump))
        uv_idle_stop(&p->pump);
}

/* Sends while allowed; returns true when it must be called again later. */
static bool pump_once(struct pair *p)
{
    for (int i = 0; i < 1024; i++) {
        if (p->sent == p->seg.n)
            return false;
        if (p->seg.kind == SEG_PIPELINED && p->sent - p->replies >= p->seg.window)
            return false;
        if (p->seg.kind == SEG_RTT && p->sent != p->replies)
            return false;
        if (send_req(p) != 0)
            return true;
    }
    return true;
}

static void on_pump(uv_idle_t *h)
{
    struct pair *p = h->data;
    if (!pump_once(p))
        pump_stop(p);
}

static void pump(struct pair *p)
{
    if (pump_once(p) && !uv_is_active((uv_handle_t *)&p->pump))
        uv_idle_start(&p->pump, on_pump);
}

static void on_recv_a(struct transport *t, const struct raft_message *m, void *data)
{
    (void)t;
    struct pair *p = data;
    if (m->type != RAFT_MSG_APPEND_RESP)
        return;
    p->replies++;
    if (p->seg.kind == SEG_RTT)
        tk_hist_record(p->hist, uv_hrtime() - p->t_last_send);
    if (p->replies == p->seg.n) {
        p->t_end = uv_hrtime();
        uv_sem_post(&p->done);
        return;
    }
    pump(p);
}

static void on_recv_b(struct transport *t, const struct raft_message *m, void *data)
{
    struct pair *p = data;
    if (m->type != RAFT_MSG_APPEND)
        return;
    if (p->seg.kind == SEG_ONEWAY) {
        if (++p->received == p->seg.n) {
            p->t_end = uv_hrtime();
            uv_sem_post(&p->done);
        }
        return;
    }
    struct raft_message r = {.type = RAFT_MSG_APPEND_RESP, .from = 2, .to = 1, .term = 1};
    r.u.append_resp.index = m->u.append.prev_index + 1;
    r.u.append_resp.read_ctx = m->u.append.read_ctx;
    /* Replies are few and small: a full queue here would be a bench bug. */
    TK_ASSERT(transport_send(t, &r) == 0);
}

static void on_peer(struct transport *t, uint64_t id, bool up, void *data)
{
    (void)t;
    (void)id;
    struct pair *p = data;
    if (up && ++p->ups == p->ups_needed)
        uv_sem_post(&p->up);
}

static void on_cmd(uv_async_t *h)
{
    struct lp *l = h->data;
    struct pair *p = l->pair;
    if (p->op == OP_START) {
        if (l->is_a) {
            p->sent = p->replies = 0;
            p->t0 = uv_hrtime();
            pump(p);
        }
        return;
    }
    /* OP_CLOSE */
    if (l->is_a) {
        transport_close(p->a, NULL, NULL);
        uv_close((uv_handle_t *)&p->pump, NULL);
    }
    if (l->hosts_b)
        transport_close(p->b, NULL, NULL);
    uv_close((uv_handle_t *)&l->cmd, NULL);
}

static void loop_main(void *arg)
{
    struct lp *l = arg;
    uv_run(&l->loop, UV_RUN_DEFAULT);
}

static void lp_init(struct lp *l, struct pair *p, bool is_a, bool hosts_b)
{
    uv_loop_init(&l->loop);
    uv_async_init(&l->loop, &l->cmd, on_cmd);
    l->cmd.data = l;
    l->pair = p;
    l->is_a = is_a;
    l->hosts_b = hosts_b;
}

enum pair_kind { PAIR_TCP, PAIR_INPROC_SHARED, PAIR_INPROC_THREADS, PAIR_TCP_TLS = 4 };

/* tcp-mtls: the two contexts every TLS pair uses (made in main). */
static struct tk_tls_ctx *tls_server, *tls_client;

static struct transport_inproc_hub *hub;

static struct pair *pair_new(enum pair_kind kind)
{
    struct pair *p = calloc(1, sizeof(*p));
    uv_sem_init(&p->done, 0);
    uv_sem_init(&p->up, 0);
    bool shared = kind == PAIR_INPROC_SHARED;
    lp_init(&p->la, p, true, shared);
    p->lb = &p->la;
    if (!shared) {
        p->lb = &p->lb_own;
        lp_init(p->lb, p, false, true);
    }
    uv_idle_init(&p->la.loop, &p->pump);
    p->pump.data = p;
    struct transport_callbacks ca = {.recv = on_recv_a, .peer = on_peer, .data = p};
    struct transport_callbacks cb = {.recv = on_recv_b, .peer = on_peer, .data = p};
    if (kind == PAIR_TCP || kind == PAIR_TCP_TLS) {
        struct transport_tcp_options o;
        transport_tcp_options_default(&o);
        if (kind == PAIR_TCP_TLS) {
            o.tls_server = tls_server;
            o.tls_client = tls_client;
        }
        o.cluster_id = 7;
        o.id = 1;
        TK_ASSERT(transport_tcp_new(&p->la.loop, &o, &ca, &p->a) == 0);
        o.id = 2;
        TK_ASSERT(transport_tcp_new(&p->lb->loop, &o, &cb, &p->b) == 0);
        TK_ASSERT(
            transport_tcp_add_peer(p->a, 2, "127.0.0.1", transport_tcp_port(p->b)) == 0);
        TK_ASSERT(
            transport_tcp_add_peer(p->b, 1, "127.0.0.1", transport_tcp_port(p->a)) == 0);
    } else {
        TK_ASSERT(transport_inproc_new(hub, &p->la.loop, 1, 1u << 16, &ca, &p->a) == 0);
        TK_ASSERT(transport_inproc_new(hub, &p->lb->loop, 2, 1u << 16, &cb, &p->b) == 0);
    }
    p->ups_needed = 2;
    uv_thread_create(&p->la.th, loop_main, &p->la);
    if (!shared)
        uv_thread_create(&p->lb->th, loop_main, p->lb);
    uv_sem_wait(&p->up); /* both directions connected */
    return p;
}

static void pair_free(struct pair *p)
{
    p->op = OP_CLOSE;
    uv_async_send(&p->la.cmd);
    if (p->lb != &p->la)
        uv_async_send(&p->lb->cmd);
    uv_thread_join(&p->la.th);
    if (p->lb != &p->la)
        uv_thread_join(&p->lb->th);
    TK_ASSERT(uv_loop_close(&p->la.loop) == 0);
    if (p->lb != &p->la)
        TK_ASSERT(uv_loop_close(&p->lb->loop) == 0);
    uv_sem_destroy(&p->done);
    uv_sem_destroy(&p->up);
    free(p);
}

static void pair_run(struct pair *p, const struct seg *s, struct result *r)
{
    p->seg = *s;
    p->received = 0;
    p->payload = tk_blob_new(s->size);
    memset(p->payload->data, 0x42, s->size);
    tk_hist_init(&r->rtt);
    p->hist = &r->rtt;
    p->op = OP_START;
    uv_async_send(&p->la.cmd);
    uv_sem_wait(&p->done);
    r->secs = (double)(p->t_end - p->t0) / 1e9;
    /* The pump may still be armed on a's thread only if it is mid-send, which
     * cannot be once everything arrived; the payload is released after. */
    tk_blob_unref(p->payload);
    p->payload = NULL;
}

/* ---- The floor: plain blocking sockets ---- */

struct floor_srv {
    int lfd;
    enum seg_kind kind;
    size_t total; /* bytes to read for one-way */
    uint64_t t_end;
    uv_sem_t done;
};

static void full_write(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        TK_ASSERT(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

static void full_read(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        TK_ASSERT(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

static void floor_server(void *arg)
{
    struct floor_srv *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    TK_ASSERT(fd >= 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    static char buf[1 << 16];
    if (s->kind == SEG_ONEWAY) {
        size_t got = 0;
        while (got < s->total) {
            ssize_t r = read(fd, buf, sizeof(buf));
            TK_ASSERT(r > 0);
            got += (size_t)r;
        }
        s->t_end = uv_hrtime();
        uv_sem_post(&s->done);
    } else {
        /* Echo every byte: 64-byte requests become 64-byte responses. */
        for (;;) {
            ssize_t r = read(fd, buf, sizeof(buf));
            if (r <= 0)
                break;
            full_write(fd, buf, (size_t)r);
        }
    }
    close(fd);
}

static void floor_run(const struct seg *sg, struct result *r)
{
    struct floor_srv s = {.kind = sg->kind, .total = sg->n * sg->size};
    uv_sem_init(&s.done, 0);
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TK_ASSERT(bind(s.lfd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    socklen_t alen = sizeof(addr);
    getsockname(s.lfd, (struct sockaddr *)&addr, &alen);
    TK_ASSERT(listen(s.lfd, 1) == 0);
    uv_thread_t th;
    uv_thread_create(&th, floor_server, &s);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    TK_ASSERT(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char *buf = calloc(1, sg->size * (sg->window ? sg->window : 1) + 1);
    tk_hist_init(&r->rtt);
    uint64_t t0 = uv_hrtime();
    if (sg->kind == SEG_ONEWAY) {
        for (size_t i = 0; i < sg->n; i++)
            full_write(fd, buf, sg->size);
        uv_sem_wait(&s.done);
        r->secs = (double)(s.t_end - t0) / 1e9;
    } else if (sg->kind == SEG_RTT) {
        for (size_t i = 0; i < sg->n; i++) {
            uint64_t a = uv_hrtime();
            full_write(fd, buf, sg->size);
            full_read(fd, buf, sg->size);
            tk_hist_record(&r->rtt, uv_hrtime() - a);
        }
        r->secs = (double)(uv_hrtime() - t0) / 1e9;
    } else {
        /* A window of requests in one write, then their responses. */
        for (size_t done = 0; done < sg->n;) {
            size_t k = sg->n - done < sg->window ? sg->n - done : sg->window;
            full_write(fd, buf, k * sg->size);
            full_read(fd, buf, k * sg->size);
            done += k;
        }
        r->secs = (double)(uv_hrtime() - t0) / 1e9;
    }
    shutdown(fd, SHUT_WR);
    uv_thread_join(&th);
    close(fd);
    close(s.lfd);
    free(buf);
    uv_sem_destroy(&s.done);
}

/* ---- The libuv floor: a 64 B ping-pong between two libuv loops ----
 *
 * No framing, no codec, one uv_write per message: what any libuv transport
 * pays for its event loop (epoll_wait + epoll_ctl + read + write per hop) on
 * top of the blocking-socket floor. With `two`, requests go on one connection
 * and replies come back on a second, as in the TCP transport (a connection per
 * direction): the difference is the price of that design. */

struct uvpp {
    uv_loop_t la, lb;
    uv_tcp_t srv, sconn[2], cconn[2];
    uv_connect_t creq[2];
    struct sockaddr_in addr;
    bool two;
    int accepted, connected;
    size_t n, done, got_s, got_c;
    uint64_t t_send;
    struct tk_hist *hist;
    char msg[64];
    char rbuf[2][4096];
};

static void uvpp_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
    (void)sz;
    struct uvpp *u = h->data;
    bool client = h == (uv_handle_t *)&u->cconn[0] || h == (uv_handle_t *)&u->cconn[1];
    *b = uv_buf_init(u->rbuf[client], sizeof(u->rbuf[0]));
}

static void uvpp_written(uv_write_t *req, int status)
{
    (void)status;
    free(req);
}

static void uvpp_write(uv_stream_t *s, char *msg)
{
    uv_write_t *req = malloc(sizeof(*req));
    uv_buf_t b = uv_buf_init(msg, 64);
    TK_ASSERT(uv_write(req, s, &b, 1, uvpp_written) == 0);
}

static void uvpp_srv_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)b;
    struct uvpp *u = s->data;
    if (n < 0) {
        for (int i = 0; i <= (int)u->two; i++)
            uv_close((uv_handle_t *)&u->sconn[i], NULL);
        uv_close((uv_handle_t *)&u->srv, NULL);
        return;
    }
    for (u->got_s += (size_t)n; u->got_s >= 64; u->got_s -= 64)
        uvpp_write((uv_stream_t *)&u->sconn[u->two], u->msg);
}

static void uvpp_on_conn(uv_stream_t *srv, int status)
{
    TK_ASSERT(status == 0);
    struct uvpp *u = srv->data;
    int k = u->accepted++; /* the client connects one after the other */
    uv_tcp_init(&u->lb, &u->sconn[k]);
    u->sconn[k].data = u;
    TK_ASSERT(uv_accept(srv, (uv_stream_t *)&u->sconn[k]) == 0);
    uv_tcp_nodelay(&u->sconn[k], 1);
    if (k == 0)
        uv_read_start((uv_stream_t *)&u->sconn[0], uvpp_alloc, uvpp_srv_read);
}

static void uvpp_cli_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)b;
    (void)s;
    struct uvpp *u = s->data;
    TK_ASSERT(n >= 0);
    for (u->got_c += (size_t)n; u->got_c >= 64; u->got_c -= 64) {
        tk_hist_record(u->hist, uv_hrtime() - u->t_send);
        if (++u->done == u->n) {
            for (int i = 0; i <= (int)u->two; i++)
                uv_close((uv_handle_t *)&u->cconn[i], NULL);
            return;
        }
        u->t_send = uv_hrtime();
        uvpp_write((uv_stream_t *)&u->cconn[0], u->msg);
    }
}

static void uvpp_on_connect(uv_connect_t *req, int status)
{
    TK_ASSERT(status == 0);
    struct uvpp *u = req->data;
    int k = u->connected++;
    uv_tcp_nodelay(&u->cconn[k], 1);
    if (k == 0 && u->two) {
        uv_tcp_connect(&u->creq[1], &u->cconn[1], (struct sockaddr *)&u->addr,
                       uvpp_on_connect);
        return;
    }
    uv_read_start((uv_stream_t *)&u->cconn[u->two], uvpp_alloc, uvpp_cli_read);
    u->t_send = uv_hrtime();
    uvpp_write((uv_stream_t *)&u->cconn[0], u->msg);
}

static void uvpp_server(void *arg)
{
    struct uvpp *u = arg;
    uv_run(&u->lb, UV_RUN_DEFAULT);
}

static void floor_uv_rtt(const struct seg *sg, bool two, struct result *r)
{
    struct uvpp *u = calloc(1, sizeof(*u));
    u->n = sg->n;
    u->two = two;
    tk_hist_init(&r->rtt);
    u->hist = &r->rtt;
    uv_loop_init(&u->la);
    uv_loop_init(&u->lb);
    uv_tcp_init(&u->lb, &u->srv);
    u->srv.data = u;
    uv_ip4_addr("127.0.0.1", 0, &u->addr);
    TK_ASSERT(uv_tcp_bind(&u->srv, (struct sockaddr *)&u->addr, 0) == 0);
    TK_ASSERT(uv_listen((uv_stream_t *)&u->srv, 8, uvpp_on_conn) == 0);
    int len = sizeof(u->addr);
    uv_tcp_getsockname(&u->srv, (struct sockaddr *)&u->addr, &len);
    uv_thread_t th;
    uv_thread_create(&th, uvpp_server, u);
    for (int i = 0; i < 2; i++) {
        uv_tcp_init(&u->la, &u->cconn[i]);
        u->cconn[i].data = u;
        u->creq[i].data = u;
    }
    if (!two)
        uv_close((uv_handle_t *)&u->cconn[1], NULL);
    uint64_t t0 = uv_hrtime();
    uv_tcp_connect(&u->creq[0], &u->cconn[0], (struct sockaddr *)&u->addr,
                   uvpp_on_connect);
    uv_run(&u->la, UV_RUN_DEFAULT);
    r->secs = (double)(uv_hrtime() - t0) / 1e9;
    uv_thread_join(&th);
    TK_ASSERT(uv_loop_close(&u->la) == 0);
    TK_ASSERT(uv_loop_close(&u->lb) == 0);
    free(u);
}

/* ---- Driver ---- */

#define N_SEGS 5
#define N_IMPLS 5
#define RUNS_MAX 9

static const char *const seg_names[N_SEGS] = {"one-way 64 B", "one-way 64 KiB",
                                              "one-way 1 KiB", "round trip 64 B",
                                              "pipelined 64 B w256"};
static const char *const impl_names[N_IMPLS] = {"tcp", "inproc-1loop", "inproc-2threads",
                                                "floor", "tcp-mtls"};

static struct seg segs[N_SEGS] = {
    {SEG_ONEWAY, 100000, 64, 0},     {SEG_ONEWAY, 2000, 65536, 0},
    {SEG_ONEWAY, 20000, 1024, 0},    {SEG_RTT, 2000, 64, 0},
    {SEG_PIPELINED, 50000, 64, 256},
};

struct cell {
    double rate; /* msgs or ops per second */
    double mb_s; /* one-way: MB/s */
    double p50_us, p99_us, mean_us;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void run_one(int impl, struct pair *p, const struct seg *s, struct result *r)
{
    if (impl == 3)
        floor_run(s, r);
    else
        pair_run(p, s, r);
}

/* A self-signed certificate naming node-1 and node-2, in a directory removed
 * as soon as the contexts have read it. */
static int make_tls(void)
{
    char dir[] = "/tmp/tk-transport-bench-XXXXXX", cert[64], key[64], err[TK_TLS_ERR_MAX];
    if (mkdtemp(dir) == NULL)
        return TK_EIO;
    snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    const char *names[] = {"node-1", "node-2"};
    int rc = tk_tls_testcert_write(cert, key, names, 2, 1);
    struct tk_tls_ctx_config c = {
        .server = true, .cert_file = cert, .key_file = key, .ca_file = cert};
    if (rc == 0)
        rc = tk_tls_ctx_new(&c, &tls_server, err, sizeof(err));
    c.server = false;
    if (rc == 0)
        rc = tk_tls_ctx_new(&c, &tls_client, err, sizeof(err));
    unlink(cert);
    unlink(key);
    rmdir(dir);
    return rc;
}

/* --plot: the round trips against the floors, and the rates. */
static int plot_cells(const char *path, bool quick, struct cell cells[N_IMPLS][N_SEGS],
                      const double uvfloor_p50[2])
{
    static struct bench_plot p;
    bench_plot_init(&p, quick ? "transport-bench --quick: loopback, 127.0.0.1"
                              : "transport-bench: loopback, 127.0.0.1");
    int rt = bench_plot_panel(&p, "request round trip, 64 B", "transport", "microseconds",
                              false, true);
    int th = bench_plot_panel(&p, "throughput", "transport", "messages/s", false, true);
    int s50 = bench_plot_series(&p, rt, "p50"), s99 = bench_plot_series(&p, rt, "p99");
    int smean = bench_plot_series(&p, rt, "mean");
    int sdg = bench_plot_series(&p, th, "one-way 64 B, msgs/s");
    int spl = bench_plot_series(&p, th, "pipelined 64 B requests, ops/s");
    for (int i = 0; i < N_IMPLS; i++) {
        if (i < 3) { /* the floor is drawn as a line */
            bench_plot_xtic(&p, rt, i, impl_names[i]);
            bench_plot_point(&p, s50, i, cells[i][3].p50_us);
            bench_plot_point(&p, s99, i, cells[i][3].p99_us);
            bench_plot_point(&p, smean, i, cells[i][3].mean_us);
        }
        bench_plot_xtic(&p, th, i, impl_names[i]);
        bench_plot_point(&p, sdg, i, cells[i][0].rate);
        bench_plot_point(&p, spl, i, cells[i][4].rate);
    }
    bench_plot_hline(&p, rt, "floor: blocking sockets, p50", cells[3][3].p50_us);
    bench_plot_hline(&p, rt, "floor: raw libuv echo, p50", uvfloor_p50[0]);
    int rc = bench_plot_write(&p, path);
    bench_plot_free(&p);
    if (rc == 0)
        fprintf(stderr, "transport-bench: plot written to %s\n", path);
    return rc;
}

/* A copy of `s` a tenth of its size (at least 1), to warm up with. */
static struct seg seg_warm(const struct seg *s)
{
    struct seg warm = *s;
    warm.n = warm.n / 10 ? warm.n / 10 : 1;
    return warm;
}

/* One cell: segment s over implementation impl (p: its pair; NULL for the
 * floor), warmed up, then the median of `runs` runs. */
static struct cell measure_cell(int impl, struct pair *p, int s, int runs)
{
    struct seg warm = seg_warm(&segs[s]);
    struct result r;
    run_one(impl, p, &warm, &r);
    double rate[RUNS_MAX], mb[RUNS_MAX], p50[RUNS_MAX], p99[RUNS_MAX], mean[RUNS_MAX];
    for (int k = 0; k < runs; k++) {
        run_one(impl, p, &segs[s], &r);
        rate[k] = (double)segs[s].n / r.secs;
        mb[k] = (double)segs[s].n * (double)segs[s].size / r.secs / 1e6;
        p50[k] = (double)tk_hist_quantile(&r.rtt, 0.5) / 1e3;
        p99[k] = (double)tk_hist_quantile(&r.rtt, 0.99) / 1e3;
        mean[k] = tk_hist_mean(&r.rtt) / 1e3;
    }
    return (struct cell){median(rate, runs), median(mb, runs), median(p50, runs),
                         median(p99, runs), median(mean, runs)};
}

/* The command line (see the usage message). */
struct run_args {
    bool quick;
    int runs;
    int only;     /* --only: an index into impl_names, or -1 */
    int only_seg; /* --segment: an index into segs, or -1 */
    const char *plot_path;
};

static struct run_args args = {.runs = 3, .only = -1, .only_seg = -1};

/* The libuv floors for the round trip (see floor_uv_rtt): one connection,
 * then a connection per direction. */
static void measure_uv_floors(double p50_out[2], double p99_out[2])
{
    for (int two = 0; two < 2; two++) {
        double p50[RUNS_MAX], p99[RUNS_MAX];
        struct result ur;
        struct seg rtt_seg = segs[3];
        struct seg warm_rtt = seg_warm(&rtt_seg);
        floor_uv_rtt(&warm_rtt, two, &ur);
        for (int k = 0; k < args.runs; k++) {
            floor_uv_rtt(&rtt_seg, two, &ur);
            p50[k] = (double)tk_hist_quantile(&ur.rtt, 0.5) / 1e3;
            p99[k] = (double)tk_hist_quantile(&ur.rtt, 0.99) / 1e3;
        }
        p50_out[two] = median(p50, args.runs);
        p99_out[two] = median(p99, args.runs);
    }
}

static void measure_cells(struct cell cells[N_IMPLS][N_SEGS])
{
    for (int impl = 0; impl < N_IMPLS; impl++) {
        if (args.only >= 0 && impl != args.only)
            continue;
        struct pair *p = NULL;
        if (impl != 3)
            p = pair_new((enum pair_kind)impl);
        for (int s = 0; s < N_SEGS; s++)
            if (args.only_seg < 0 || s == args.only_seg)
                cells[impl][s] = measure_cell(impl, p, s, args.runs);
        if (p != NULL)
            pair_free(p);
    }
}

static void print_table(struct cell cells[N_IMPLS][N_SEGS])
{
    printf("transport-bench%s: median of %d run(s), loopback, 127.0.0.1\n",
           args.quick ? " --quick" : "", args.runs);
    printf("%-24s", "segment");
    for (int i = 0; i < N_IMPLS; i++)
        printf(" | %-22s", impl_names[i]);
    printf("\n");
    for (int s = 0; s < N_SEGS; s++) {
        char label[64];
        snprintf(label, sizeof(label), "%s x %zu", seg_names[s], segs[s].n);
        printf("%-24s", label);
        for (int i = 0; i < N_IMPLS; i++) {
            struct cell *c = &cells[i][s];
            char v[64];
            if (segs[s].kind == SEG_ONEWAY)
                snprintf(v, sizeof(v), "%.0f msg/s %.0f MB/s", c->rate, c->mb_s);
            else if (segs[s].kind == SEG_RTT)
                snprintf(v, sizeof(v), "p50 %.1f p99 %.1f mean %.1f us", c->p50_us,
                         c->p99_us, c->mean_us);
            else
                snprintf(v, sizeof(v), "%.0f op/s", c->rate);
            printf(" | %-22s", v);
        }
        printf("\n");
    }
}

static void print_json(struct cell cells[N_IMPLS][N_SEGS], const double uvfloor_p50[2])
{
    const char *quick = args.quick ? "true" : "false";
    printf("{\"bench\":\"transport\",\"uvfloor_rtt_p50_us\":%.1f,"
           "\"uvfloor2_rtt_p50_us\":%.1f,",
           uvfloor_p50[0], uvfloor_p50[1]);
    printf("\"quick\":%s,\"runs\":%d,"
           "\"tcp_rtt_p50_us\":%.1f,\"tcp_rtt_p99_us\":%.1f,\"floor_rtt_p50_us\":%.1f,"
           "\"inproc1_rtt_p50_us\":%.2f,\"inproc2_rtt_p50_us\":%.2f,"
           "\"tcp_pipelined_ops_per_s\":%.0f,\"floor_pipelined_ops_per_s\":%.0f,"
           "\"inproc1_pipelined_ops_per_s\":%.0f,\"inproc2_pipelined_ops_per_s\":%.0f,"
           "\"tcp_stream_64k_mb_per_s\":%.0f,\"floor_stream_64k_mb_per_s\":%.0f,"
           "\"tcp_stream_1k_mb_per_s\":%.0f,\"floor_stream_1k_mb_per_s\":%.0f,"
           "\"tcp_dgram_64_msgs_per_s\":%.0f,\"floor_dgram_64_msgs_per_s\":%.0f,"
           "\"inproc_dgram_64_msgs_per_s\":%.0f,\"inproc2_dgram_64_msgs_per_s\":%.0f}\n",
           quick, args.runs, cells[0][3].p50_us, cells[0][3].p99_us, cells[3][3].p50_us,
           cells[1][3].p50_us, cells[2][3].p50_us, cells[0][4].rate, cells[3][4].rate,
           cells[1][4].rate, cells[2][4].rate, cells[0][1].mb_s, cells[3][1].mb_s,
           cells[0][2].mb_s, cells[3][2].mb_s, cells[0][0].rate, cells[3][0].rate,
           cells[1][0].rate, cells[2][0].rate);
    printf("{\"bench\":\"transport-tls\",\"quick\":%s,\"runs\":%d,"
           "\"tcp_rtt_p50_us\":%.1f,\"tls_rtt_p50_us\":%.1f,"
           "\"tcp_pipelined_ops_per_s\":%.0f,\"tls_pipelined_ops_per_s\":%.0f,"
           "\"tcp_stream_64k_mb_per_s\":%.0f,\"tls_stream_64k_mb_per_s\":%.0f,"
           "\"tcp_stream_1k_mb_per_s\":%.0f,\"tls_stream_1k_mb_per_s\":%.0f,"
           "\"tcp_dgram_64_msgs_per_s\":%.0f,\"tls_dgram_64_msgs_per_s\":%.0f}\n",
           quick, args.runs, cells[0][3].p50_us, cells[4][3].p50_us, cells[0][4].rate,
           cells[4][4].rate, cells[0][1].mb_s, cells[4][1].mb_s, cells[0][2].mb_s,
           cells[4][2].mb_s, cells[0][0].rate, cells[4][0].rate);
}

/* ---- The command line ---- */

/* Each parser stores its value into args and returns 0, or says what is
 * wrong and returns the exit code (bench_args.h). */
static int parse_quick(const char *v, void *dest)
{
    struct run_args *a = dest;
    (void)v;
    a->quick = true;
    a->runs = 1;
    return 0;
}

static int parse_runs(const char *v, void *dest)
{
    struct run_args *a = dest;
    a->runs = atoi(v);
    if (a->runs < 1 || a->runs > RUNS_MAX)
        a->runs = 3;
    return 0;
}

static int parse_only(const char *v, void *dest)
{
    struct run_args *a = dest;
    for (int k = 0; k < N_IMPLS; k++)
        if (strcmp(v, impl_names[k]) == 0)
            a->only = k;
    if (a->only < 0) {
        fprintf(stderr, "unknown implementation %s\n", v);
        return 2;
    }
    return 0;
}

/* One row per option, in the order the usage message names them. */
static const struct bench_option options[] = {
    {"--quick", NULL, parse_quick, &args, false},
    {"--runs", "N", parse_runs, &args, false},
    {"--only", "IMPL", parse_only, &args, false},
    {"--segment", "0-4", bench_parse_int, &args.only_seg, false},
    {"--plot", "FILE.svg", bench_parse_str, &args.plot_path, false},
};

int main(int argc, char **argv)
{
    int rc = bench_args_parse(argv[0], options, sizeof(options) / sizeof(options[0]),
                              argc, argv);
    if (rc != 0)
        return rc;
    tk_log_set_level(TK_LOG_ERROR);
    if (args.quick)
        for (int s = 0; s < N_SEGS; s++)
            segs[s].n = segs[s].n / 10 ? segs[s].n / 10 : 1;
    hub = transport_inproc_hub_new(1);
    if (make_tls() != 0) {
        fprintf(stderr, "cannot make the tcp-mtls certificate\n");
        return 1;
    }
    static struct cell cells[N_IMPLS][N_SEGS];
    measure_cells(cells);
    transport_inproc_hub_free(hub);
    double uvfloor_p50[2] = {0, 0}, uvfloor_p99[2] = {0, 0};
    if (args.only < 0 || args.only == 3)
        measure_uv_floors(uvfloor_p50, uvfloor_p99);
    print_table(cells);
    printf("libuv floor, raw 64 B echo between two loops, round trip: one connection "
           "p50 %.1f p99 %.1f us; a connection per direction p50 %.1f p99 %.1f us\n",
           uvfloor_p50[0], uvfloor_p99[0], uvfloor_p50[1], uvfloor_p99[1]);
    print_json(cells, uvfloor_p50);
    int rc_plot = 0;
    tk_tls_ctx_free(tls_server);
    tk_tls_ctx_free(tls_client);
    if (args.plot_path != NULL)
        rc_plot = plot_cells(args.plot_path, args.quick, cells, uvfloor_p50);
    return rc_plot == 0 ? 0 : 1;
}
