/* http-floor: the floor under the gateway's benchmarks (scripts/bench-http.sh).
 * A trivial HTTP/1.1 responder on one libuv loop, driven by the same load
 * generator as tierkvd: every request (PUT, GET, anything) is answered with a
 * fixed 200 and a two-byte JSON body, keep-alive. No Raft, no disk, no
 * routing: what it costs per request is about what the kernel (loopback TCP,
 * epoll) and libuv cost, so tierkvd's CPU per request minus this one is what
 * tierkv itself adds.
 *
 * It does what a lean server does, so the floor is honest: requests are parsed
 * with http-parser (pipelining and split reads work), the answers of one read
 * go out in one write, tried at once with uv_try_write (a uv_write of the rest
 * only if the socket is full), and nothing is allocated per request.
 *
 * usage: http-floor [--host H] [--port N] [--port-file FILE]
 *        port 0 (the default) binds an ephemeral port; --port-file gets it
 *        written once listening. Runs until SIGINT or SIGTERM. */
#include <http_parser.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define RBUF_BYTES 16384
#define OUT_BYTES 65536

static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             "Content-Length: 3\r\n\r\n{}\n";
#define ANSWER_LEN (sizeof(answer) - 1)

struct conn {
    uv_tcp_t tcp;
    http_parser parser;
    bool close_after;
    bool writing; /* a uv_write of out[] is in flight */
    uv_write_t wr;
    size_t out_len; /* answers built, not yet handed to the socket */
    size_t wr_len;  /* bytes of wbuf the write in flight holds */
    char rbuf[RBUF_BYTES];
    char out[OUT_BYTES];
    char wbuf[OUT_BYTES];
};

static uv_loop_t *loop;
static uv_tcp_t listener;
static uv_signal_t sigint, sigterm;

static int on_message_complete(http_parser *p)
{
    struct conn *c = p->data;
    if (c->out_len + ANSWER_LEN > sizeof(c->out))
        return -1; /* more than OUT_BYTES of answers pipelined in one read */
    memcpy(c->out + c->out_len, answer, ANSWER_LEN);
    c->out_len += ANSWER_LEN;
    if (!http_should_keep_alive(p))
        c->close_after = true;
    return 0;
}

static const http_parser_settings settings = {.on_message_complete = on_message_complete};

static void on_closed(uv_handle_t *h)
{
    free(h->data);
}

static void conn_close(struct conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void conn_flush(struct conn *c);

static void on_written(uv_write_t *wr, int status)
{
    struct conn *c = wr->data;
    c->writing = false;
    if (status < 0) {
        conn_close(c);
        return;
    }
    conn_flush(c);
}

/* The answers built so far: uv_try_write first, the rest by uv_write. */
static void conn_flush(struct conn *c)
{
    if (c->writing || c->out_len == 0 || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    uv_buf_t b = uv_buf_init(c->out, (unsigned)c->out_len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n < 0 && n != UV_EAGAIN) {
        conn_close(c);
        return;
    }
    size_t sent = n > 0 ? (size_t)n : 0;
    if (sent < c->out_len) {
        c->wr_len = c->out_len - sent;
        memcpy(c->wbuf, c->out + sent, c->wr_len);
        c->out_len = 0;
        c->writing = true;
        c->wr.data = c;
        b = uv_buf_init(c->wbuf, (unsigned)c->wr_len);
        if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
            c->writing = false;
            conn_close(c);
        }
        return;
    }
    c->out_len = 0;
    if (c->close_after)
        conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    (void)suggested;
    *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    size_t done = http_parser_execute(&c->parser, &settings, buf->base, (size_t)nread);
    if (done != (size_t)nread || HTTP_PARSER_ERRNO(&c->parser) != HPE_OK) {
        conn_close(c);
        return;
    }
    conn_flush(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        abort();
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    (void)uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h,
                 h->type == UV_TCP && h != (uv_handle_t *)&listener ? on_closed : NULL);
}

static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    (void)signum;
    uv_walk(loop, close_any, NULL);
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *port_file = NULL;
    int port = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0 && i + 1 < argc) {
            host = argv[++i];
        } else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
            port = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--port-file") == 0 && i + 1 < argc) {
            port_file = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: http-floor [--host H] [--port N] [--port-file FILE]\n");
            return 2;
        }
    }
    loop = uv_default_loop();
    struct sockaddr_in addr;
    if (uv_ip4_addr(host, port, &addr) != 0) {
        fprintf(stderr, "http-floor: %s is not an IPv4 literal\n", host);
        return 2;
    }
    uv_tcp_init(loop, &listener);
    int rc = uv_tcp_bind(&listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&listener, 511, on_connection);
    if (rc != 0) {
        fprintf(stderr, "http-floor: cannot listen on %s:%d: %s\n", host, port,
                uv_strerror(rc));
        return 1;
    }
    struct sockaddr_in bound;
    int len = sizeof(bound);
    uv_tcp_getsockname(&listener, (struct sockaddr *)&bound, &len);
    if (port_file != NULL) {
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%u\n", ntohs(bound.sin_port)) < 0 ||
            fclose(f) != 0 || rename(tmp, port_file) != 0) {
            fprintf(stderr, "http-floor: cannot write %s\n", port_file);
            return 1;
        }
    }
    uv_signal_init(loop, &sigint);
    uv_signal_init(loop, &sigterm);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    return uv_loop_close(loop) == 0 ? 0 : 1;
}
