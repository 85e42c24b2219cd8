/* In-process tests of the gateway: json.c's helpers, and the HTTP server on a
 * single in-process node (inproc hub, memory volume) driven by a blocking
 * socket client: keep-alive, pipelining order, chunked bodies, 100-continue,
 * malformed requests, stopping with connections open, and the overload bounds
 * (entry limit, slow readers, memory budget; issue 19) (the sanitizer
 * build checks that nothing leaks). Fast: suite 'unit'. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "gateway/json.h"
#include "node/node.h"
#include "tests/check_run.h"
#include "transport/transport.h"

/* ---- json.c ------------------------------------------------------------ */

START_TEST(test_utf8_validation_rejects_malformed_sequences)
{
    ck_assert(json_utf8_valid("", 0));
    ck_assert(json_utf8_valid("plain ascii", 11));
    ck_assert(json_utf8_valid("\xc3\xa9", 2));         /* é */
    ck_assert(json_utf8_valid("\xe2\x82\xac", 3));     /* € */
    ck_assert(json_utf8_valid("\xf0\x9f\x98\x80", 4)); /* U+1F600 */
    ck_assert(!json_utf8_valid("\xff", 1));
    ck_assert(!json_utf8_valid("\xc0\x80", 2));         /* overlong NUL */
    ck_assert(!json_utf8_valid("\xe0\x80\xaf", 3));     /* overlong '/' */
    ck_assert(!json_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    ck_assert(!json_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    ck_assert(!json_utf8_valid("\xe2\x82", 2));         /* truncated */
    ck_assert(!json_utf8_valid("\xc3\x28", 2));         /* bad continuation */
}
END_TEST

START_TEST(test_base64_round_trips_and_rejects_garbage)
{
    uint8_t src[32], dec[64];
    char enc[64];
    for (size_t n = 0; n < sizeof(src); n++) {
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)(i * 37 + n);
        size_t el = tk_base64_encoded_len(n);
        ck_assert_uint_eq(tk_base64_encode(src, n, enc), el);
        ck_assert_int_eq(tk_base64_decode(enc, el, dec, sizeof(dec)), (long)n);
        ck_assert(memcmp(src, dec, n) == 0);
    }
    tk_base64_encode("hello", 5, enc);
    ck_assert(memcmp(enc, "aGVsbG8=", 8) == 0);
    ck_assert_int_eq(tk_base64_decode("abc", 3, dec, sizeof(dec)), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("ab=c", 4, dec, sizeof(dec)), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("a@==", 4, dec, sizeof(dec)), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("====", 4, dec, sizeof(dec)), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("aa==aaaa", 8, dec, sizeof(dec)), TK_EINVAL);
}
END_TEST

START_TEST(test_u64_digits_and_a_buffer_that_outgrows_the_stack)
{
    char d[JSON_U64_MAX];
    ck_assert_uint_eq(json_u64(d, 0), 1);
    ck_assert_int_eq(d[0], '0');
    ck_assert_uint_eq(json_u64(d, UINT64_MAX), 20);
    ck_assert_int_eq(memcmp(d, "18446744073709551615", 20), 0);
    char room[8];
    struct jbuf b;
    jbuf_init_on(&b, room, sizeof(room));
    jbuf_adds(&b, "{\"r\":");
    ck_assert_ptr_eq(b.p, room);
    jbuf_u64(&b, 1234567890123ull); /* past 8 bytes: moves to the heap */
    jbuf_adds(&b, "}");
    ck_assert_ptr_ne(b.p, room);
    ck_assert_int_eq((int)b.len, 19);
    ck_assert_int_eq(memcmp(b.p, "{\"r\":1234567890123}", b.len), 0);
    jbuf_free(&b);
}
END_TEST

START_TEST(test_percent_decoding_and_json_escaping)
{
    uint8_t out[32];
    size_t n;
    ck_assert_int_eq(pct_decode("a%2Fb%00c+d", 11, out, &n, false), 0);
    ck_assert_uint_eq(n, 7);
    ck_assert(memcmp(out, "a/b\0c+d", 7) == 0);
    ck_assert_int_eq(pct_decode("a+b", 3, out, &n, true), 0);
    ck_assert(memcmp(out, "a b", 3) == 0);
    ck_assert_int_eq(pct_decode("%zz", 3, out, &n, false), TK_EINVAL);
    ck_assert_int_eq(pct_decode("abc%", 4, out, &n, false), TK_EINVAL);
    ck_assert_int_eq(pct_decode("abc%4", 5, out, &n, false), TK_EINVAL);
    struct jbuf b;
    jbuf_init(&b, 4);
    jbuf_jstr(&b, "q\"\\\n\x01", 5);
    ck_assert_uint_eq(b.len, 15);
    ck_assert(memcmp(b.p, "\"q\\\"\\\\\\n\\u0001\"", 15) == 0);
    jbuf_free(&b);
}
END_TEST

/* ---- a node with its gateway ------------------------------------------- */

struct fixture {
    struct transport_inproc_hub *hub;
    struct node *node;
    struct gateway *gw;
    uint16_t port;
};

static void fx_start(struct fixture *f, const struct gateway_config *gc_in)
{
    struct gateway_config gc;
    if (gc_in)
        gc = *gc_in;
    else
        gateway_config_default(&gc);
    gc.host = "127.0.0.1";
    gc.port = 0;
    ck_assert_int_eq(gateway_new(&gc, &f->gw), 0);
    struct node_options no;
    node_options_default(&no);
    no.id = 1;
    no.members.n_voters = 1;
    no.members.voters[0] = 1;
    no.kv_no_sync = true;
    f->hub = transport_inproc_hub_new(1);
    no.hub = f->hub;
    gateway_hook(f->gw, &no);
    ck_assert_int_eq(node_start(&no, &f->node), 0);
    ck_assert_int_eq(gateway_listen_status(f->gw), 0);
    f->port = gateway_port(f->gw);
    ck_assert_uint_ne(f->port, 0);
    /* A single node elects itself; wait for it (a test helper's sleep). */
    for (int i = 0; i < 500; i++) {
        struct node_status st;
        node_status(f->node, &st);
        if (st.leader == 1 && st.applied >= 1)
            break;
        usleep(10000);
    }
}

static void fx_stop(struct fixture *f)
{
    node_stop(f->node);
    gateway_free(f->gw);
    transport_inproc_hub_free(f->hub);
}

static int connect_to(uint16_t port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return s;
}

static void send_all(int s, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = send(s, p, len, MSG_NOSIGNAL);
        ck_assert_int_gt(n, 0);
        p += n;
        len -= (size_t)n;
    }
}

/* Reads until `n` whole responses (Content-Length framed) are in `buf`, or
 * the peer closes. Returns the bytes read. */
static size_t read_responses(int s, char *buf, size_t cap, int n)
{
    size_t len = 0;
    for (;;) {
        buf[len] = 0;
        int have = 0;
        const char *p = buf;
        for (;;) {
            const char *end = strstr(p, "\r\n\r\n");
            if (end == NULL)
                break;
            const char *cl = strcasestr(p, "Content-Length: ");
            size_t body = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
            if ((size_t)(end + 4 - buf) + body > len)
                break;
            have++;
            p = end + 4 + body;
        }
        if (have >= n)
            return len;
        ssize_t r = recv(s, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return len;
        len += (size_t)r;
    }
}

static int count_status(const char *buf, const char *status)
{
    int n = 0;
    for (const char *p = buf; (p = strstr(p, status)) != NULL; p++)
        n++;
    return n;
}

/* ---- the HTTP server alone, for its allocations ------------------------- */

struct tiny {
    uv_loop_t loop;
    uv_async_t stop;
    uv_thread_t thread;
    struct http_server *srv;
};

static void tiny_on_request(struct http_request *req, void *data)
{
    (void)data;
    http_respond(req, 200, NULL, "X-Tierkv-Revision: 7\r\n", "{\"revision\":7}\n", 15);
}

static size_t tiny_on_response(struct http_request *req, int status, char *hdr,
                               size_t cap, void *data)
{
    (void)req, (void)status, (void)data;
    if (hdr == NULL)
        return 0;
    ck_assert_uint_gt(cap, 20);
    memcpy(hdr, "X-Tierkv-Leader: 1\r\n", 21);
    return 20;
}

static void tiny_on_close(struct http_request *req, void *data)
{
    (void)req, (void)data;
}

static void tiny_on_stop(uv_async_t *a)
{
    struct tiny *t = a->data;
    http_server_stop(t->srv);
    uv_close((uv_handle_t *)a, NULL);
}

static void tiny_run(void *arg)
{
    struct tiny *t = arg;
    uv_run(&t->loop, UV_RUN_DEFAULT);
}

/* The HTTP server alone on a loop of its own thread, on a free port. */
static void tiny_start(struct tiny *t, const struct http_callbacks *cb,
                       size_t read_turn_bytes)
{
    memset(t, 0, sizeof(*t));
    ck_assert_int_eq(uv_loop_init(&t->loop), 0);
    struct http_config hc = {
        .body_max = 1 << 20,
        .header_max = 16384,
        .conns_max = 16,
        .pipeline_max = 64,
        .header_timeout_ms = 10000,
        .body_timeout_ms = 10000,
        .idle_timeout_ms = 10000,
        .retry_after_s = 1,
        .write_timeout_ms = 10000,
        .read_turn_bytes = read_turn_bytes,
    };
    t->srv = http_server_new(&hc, cb, t);
    char err[128];
    ck_assert_int_eq(
        http_server_listen(t->srv, &t->loop, "127.0.0.1", 0, err, sizeof(err)), 0);
    uv_async_init(&t->loop, &t->stop, tiny_on_stop);
    t->stop.data = t;
    ck_assert_int_eq(uv_thread_create(&t->thread, tiny_run, t), 0);
}

/* Stops the server and its thread; the server is left for its stats. */
static void tiny_stop(struct tiny *t)
{
    uv_async_send(&t->stop);
    uv_thread_join(&t->thread);
    ck_assert_int_eq(uv_loop_close(&t->loop), 0);
}

/* Requests on keep-alive connections, one at a time and pipelined, after a
 * warm-up: the server allocates nothing for them (its requests, write
 * requests, URLs, bodies and answers come from its pools and rooms). The
 * known-bad case: a URL longer than the room must allocate, and is counted. */
START_TEST(test_steady_requests_allocate_nothing_in_the_http_server)
{
    static const struct http_callbacks cb = {
        .on_request = tiny_on_request,
        .on_response = tiny_on_response,
        .on_close = tiny_on_close,
    };
    struct tiny t;
    tiny_start(&t, &cb, 0);
    int s = connect_to(http_server_port(t.srv));
    static char buf[65536];
    static const char put[] =
        "PUT /v1/kv/bench%2F00001234 HTTP/1.1\r\nHost: x\r\n"
        "Content-Length: 64\r\n\r\n"
        "0123456789012345678901234567890123456789012345678901234567890123";
    static char pipelined[8 * sizeof(put)];
    size_t plen = 0;
    for (int i = 0; i < 8; i++) {
        memcpy(pipelined + plen, put, sizeof(put) - 1);
        plen += sizeof(put) - 1;
    }
    /* Warm-up: the pools fill. */
    for (int i = 0; i < 20; i++) {
        send_all(s, pipelined, plen);
        size_t n = read_responses(s, buf, sizeof(buf), 8);
        buf[n] = 0;
        ck_assert_int_eq(count_status(buf, "HTTP/1.1 200 OK"), 8);
    }
    struct tk_alloc_stats a0, a1;
    tk_alloc_stats(&a0);
    for (int i = 0; i < 200; i++) {
        send_all(s, put, sizeof(put) - 1);
        size_t n = read_responses(s, buf, sizeof(buf), 1);
        buf[n] = 0;
        ck_assert_int_eq(count_status(buf, "HTTP/1.1 200 OK"), 1);
        send_all(s, pipelined, plen);
        n = read_responses(s, buf, sizeof(buf), 8);
        buf[n] = 0;
        ck_assert_int_eq(count_status(buf, "HTTP/1.1 200 OK"), 8);
    }
    tk_alloc_stats(&a1);
    ck_assert_uint_eq(a1.calls - a0.calls, 0); /* 1800 requests, no allocation */
    /* A URL past the room (HTTP_URL_ROOM) allocates: the counter sees it. */
    char longreq[512];
    int ln = snprintf(longreq, sizeof(longreq), "GET /%0*d HTTP/1.1\r\nHost: x\r\n\r\n",
                      HTTP_URL_ROOM + 10, 1);
    send_all(s, longreq, (size_t)ln);
    size_t n = read_responses(s, buf, sizeof(buf), 1);
    buf[n] = 0;
    ck_assert_int_eq(count_status(buf, "HTTP/1.1 200 OK"), 1);
    tk_alloc_stats(&a0);
    ck_assert_uint_ge(a0.calls - a1.calls, 1);
    close(s);
    tiny_stop(&t);
    http_server_free(t.srv);
}
END_TEST

/* The turn's read budget (read_turn_bytes): big bodies on several
 * connections at once, with a budget of one byte so that every read puts the
 * connection's next one off to the next loop turn. Each body still arrives
 * whole and each request is answered; the stats count the pauses. The same
 * small requests under the default budget (4 MiB a turn) pause nothing. */
static size_t budget_body_len;
static int budget_bad;

static void budget_on_request(struct http_request *req, void *data)
{
    (void)data;
    bool ok = req->body_len == budget_body_len;
    for (size_t i = 0; ok && i < req->body_len; i++)
        ok = req->body[i] == (uint8_t)('a' + i % 26);
    if (!ok)
        budget_bad++;
    http_respond(req, ok ? 200 : 400, NULL, NULL, "{}\n", 3);
}

static uint64_t budget_run(size_t read_turn_bytes, size_t body_len, int conns)
{
    static const struct http_callbacks cb = {
        .on_request = budget_on_request,
        .on_response = tiny_on_response,
        .on_close = tiny_on_close,
    };
    budget_body_len = body_len;
    budget_bad = 0;
    struct tiny t;
    tiny_start(&t, &cb, read_turn_bytes);
    char *req = malloc(body_len + 128);
    int hn = snprintf(req, 128,
                      "PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      body_len);
    for (size_t i = 0; i < body_len; i++)
        req[hn + i] = (char)('a' + i % 26);
    int s[8];
    ck_assert_int_le(conns, 8);
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < conns; i++) {
            if (r == 0)
                s[i] = connect_to(http_server_port(t.srv));
            send_all(s[i], req, (size_t)hn + body_len);
        }
        for (int i = 0; i < conns; i++) {
            static char buf[4096];
            size_t n = read_responses(s[i], buf, sizeof(buf), 1);
            buf[n] = 0;
            ck_assert_msg(count_status(buf, "HTTP/1.1 200 OK") == 1, "%.200s", buf);
        }
    }
    for (int i = 0; i < conns; i++)
        close(s[i]);
    free(req);
    tiny_stop(&t);
    struct http_stats st;
    http_server_stats(t.srv, &st);
    http_server_free(t.srv);
    ck_assert_int_eq(budget_bad, 0);
    return st.reads_paused;
}

START_TEST(test_a_turn_reads_at_most_its_budget_and_every_body_arrives_whole)
{
    uint64_t paused = budget_run(1, 300000, 4);
    ck_assert_uint_ge(paused, 4); /* each connection's first read at least */
    /* The known-good case for the counter: small requests under the default
     * budget never pause. */
    ck_assert_uint_eq(budget_run(0, 64, 4), 0);
}
END_TEST

START_TEST(test_put_then_get_on_one_keepalive_connection)
{
    struct fixture f;
    fx_start(&f, NULL);
    int s = connect_to(f.port);
    static char buf[65536];
    const char *put = "PUT /v1/kv/greeting HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    send_all(s, put, strlen(put));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "put: %s", buf);
    ck_assert(strstr(buf, "X-Tierkv-Revision: ") != NULL);
    ck_assert(strstr(buf, "X-Tierkv-Leader: 1\r\n") != NULL);
    const char *get = "GET /v1/kv/greeting HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "\"value\":\"hello\"") != NULL, "get: %s", buf);
    const char *raw = "GET /v1/kv/greeting?raw HTTP/1.1\r\n\r\n";
    send_all(s, raw, strlen(raw));
    size_t n = read_responses(s, buf, sizeof(buf), 1);
    ck_assert(n > 5 && memcmp(buf + n - 5, "hello", 5) == 0);
    close(s);
    fx_stop(&f);
}
END_TEST

START_TEST(test_pipelined_requests_answer_in_order)
{
    struct fixture f;
    fx_start(&f, NULL);
    int s = connect_to(f.port);
    static char req[8192], buf[65536];
    size_t len = 0;
    for (int i = 0; i < 10; i++) {
        len += (size_t)snprintf(req + len, sizeof(req) - len,
                                "PUT /v1/kv/p%d HTTP/1.1\r\nContent-Length: 2\r\n\r\nv%d"
                                "GET /v1/kv/p%d HTTP/1.1\r\n\r\n"
                                "GET /healthz HTTP/1.1\r\n\r\n",
                                i, i, i);
    }
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 30);
    ck_assert_int_eq(count_status(buf, "HTTP/1.1 200 OK"), 30);
    /* Each GET sees the PUT sent before it, and the answers keep their order. */
    const char *p = buf;
    for (int i = 0; i < 10; i++) {
        char want[32];
        snprintf(want, sizeof(want), "\"value\":\"v%d\"", i);
        const char *q = strstr(p, want);
        ck_assert_msg(q != NULL, "answer %d out of order", i);
        p = q;
    }
    close(s);
    fx_stop(&f);
}
END_TEST

START_TEST(test_chunked_body_and_expect_continue)
{
    struct fixture f;
    fx_start(&f, NULL);
    int s = connect_to(f.port);
    static char buf[65536];
    const char *put = "PUT /v1/kv/chunky HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
    send_all(s, put, strlen(put));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "%s", buf);
    const char *exp = "PUT /v1/kv/cont HTTP/1.1\r\nExpect: 100-continue\r\n"
                      "Content-Length: 3\r\n\r\n";
    send_all(s, exp, strlen(exp));
    size_t n = read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(n > 0 && strstr(buf, "HTTP/1.1 100 Continue\r\n\r\n") == buf, "%s",
                  buf);
    send_all(s, "xyz", 3);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") != NULL, "%s", buf);
    const char *get = "GET /v1/kv/chunky HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "\"value\":\"abcdefg\"") != NULL, "%s", buf);
    close(s);
    fx_stop(&f);
}
END_TEST

START_TEST(test_malformed_request_gets_400_and_server_stays_up)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char buf[65536];
    const char *bad[] = {
        "GARBAGE\r\n\r\n",
        "PUT /v1/kv/x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: "
        "chunked\r\n\r\n",
        "PUT /v1/kv/x HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: "
        "1\r\n\r\n{",
        "GET /v1/kv/%zz HTTP/1.1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int s = connect_to(f.port);
        send_all(s, bad[i], strlen(bad[i]));
        read_responses(s, buf, sizeof(buf), 1);
        ck_assert_msg(strstr(buf, "HTTP/1.1 400 Bad Request") == buf, "case %zu: %s", i,
                      buf);
        ck_assert(strstr(buf, "{\"error\":{\"code\":") != NULL);
        close(s);
    }
    int s = connect_to(f.port);
    send_all(s, "GET /healthz HTTP/1.1\r\n\r\n", 25);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert(strstr(buf, "HTTP/1.1 200 OK") == buf);
    close(s);
    fx_stop(&f);
}
END_TEST

/* The route table's derived answers: each request's status line and, for a
 * 405, the Allow list of the path's routes; then the route each counted
 * under in /metrics. */
START_TEST(test_route_table_answers_404_405_with_allow_and_counts_routes)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char buf[65536];
    static const struct {
        const char *req;
        const char *status;
        const char *allow; /* NULL: no Allow header */
    } cases[] = {
        {"GET /nope HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found", NULL},
        {"GET /healthz/ HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found", NULL},
        {"PATCH /v1/kv/a HTTP/1.1\r\n\r\n", "HTTP/1.1 405 ",
         "Allow: GET, PUT, DELETE\r\n"},
        {"POST /v1/kv/a HTTP/1.1\r\n\r\n", "HTTP/1.1 405 ",
         "Allow: GET, PUT, DELETE (POST only on /v1/kv/{key}/incr)\r\n"},
        {"PUT /v1/kv/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 ",
         "Allow: GET, DELETE\r\n"},
        {"GET /v1/batch HTTP/1.1\r\n\r\n", "HTTP/1.1 405 ", "Allow: POST\r\n"},
        {"POST /healthz HTTP/1.1\r\n\r\n", "HTTP/1.1 405 ", "Allow: GET\r\n"},
        {"GET /healthz?x HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", NULL},
        {"GET /v1/kv?x HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", NULL},
        {"GET /v1/kv/a HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", "HTTP/1.1 400 ", NULL},
        {"POST /v1/kv//incr HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", NULL}, /* empty key */
        {"POST /v1/kv/n/incr HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK", NULL},
        {"GET /v1/kv/n/incr HTTP/1.1\r\n\r\n", "HTTP/1.1 404 ", NULL}, /* key "n/incr" */
        {"GET /v1/kv/ HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int s = connect_to(f.port);
        send_all(s, cases[i].req, strlen(cases[i].req));
        read_responses(s, buf, sizeof(buf), 1);
        ck_assert_msg(strstr(buf, cases[i].status) == buf, "case %zu: %s", i, buf);
        const char *allow = strstr(buf, "Allow: ");
        if (cases[i].allow)
            ck_assert_msg(allow &&
                              strncmp(allow, cases[i].allow, strlen(cases[i].allow)) == 0,
                          "case %zu: %s", i, buf);
        else
            ck_assert_msg(allow == NULL, "case %zu: %s", i, buf);
        close(s);
    }
    int s = connect_to(f.port);
    send_all(s, "GET /metrics HTTP/1.1\r\n\r\n", 25);
    read_responses(s, buf, sizeof(buf), 1);
    static const char *const counted[] = {
        "{route=\"other\",code=\"404\"} 2\n",   "{route=\"other\",code=\"405\"} 4\n",
        "{route=\"healthz\",code=\"405\"} 1\n", "{route=\"healthz\",code=\"400\"} 1\n",
        "{route=\"kv_scan\",code=\"400\"} 1\n", "{route=\"kv_get\",code=\"400\"} 1\n",
        "{route=\"kv_incr\",code=\"400\"} 1\n", "{route=\"kv_incr\",code=\"200\"} 1\n",
        "{route=\"kv_get\",code=\"404\"} 1\n",  "{route=\"kv_scan\",code=\"200\"} 1\n",
    };
    for (size_t i = 0; i < sizeof(counted) / sizeof(counted[0]); i++)
        ck_assert_msg(strstr(buf, counted[i]) != NULL, "missing %s", counted[i]);
    close(s);
    fx_stop(&f);
}
END_TEST

START_TEST(test_oversized_requests_get_413_and_431)
{
    struct fixture f;
    struct gateway_config gc;
    gateway_config_default(&gc);
    gc.body_max = 1024;
    gc.value_max = 512;
    gc.header_max = 2048;
    fx_start(&f, &gc);
    static char buf[65536], req[8192];
    int s = connect_to(f.port);
    const char *big = "PUT /v1/kv/x HTTP/1.1\r\nContent-Length: 2000\r\n\r\n";
    send_all(s, big, strlen(big));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 413 ") == buf, "%s", buf);
    close(s);
    s = connect_to(f.port);
    int n = snprintf(req, sizeof(req),
                     "PUT /v1/kv/x HTTP/1.1\r\nContent-Length: 600\r\n\r\n");
    memset(req + n, 'v', 600);
    send_all(s, req, (size_t)n + 600);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 413 ") == buf, "value: %s", buf);
    close(s);
    s = connect_to(f.port);
    n = snprintf(req, sizeof(req), "GET /healthz HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'h', 3000);
    memcpy(req + n + 3000, "\r\n\r\n", 4);
    send_all(s, req, (size_t)n + 3004);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 431 ") == buf, "header: %s", buf);
    close(s);
    fx_stop(&f);
}
END_TEST

/* Issue 19: a command over the largest raft entry is refused (413), never
 * proposed (where it would be resent forever and stall every later write). */
START_TEST(test_command_over_the_entry_limit_is_refused_and_writes_go_on)
{
    struct fixture f;
    struct gateway_config gc;
    gateway_config_default(&gc);
    gc.body_max = 8u << 20; /* tierkvd refuses this; an embedder may not */
    fx_start(&f, &gc);
    size_t vlen = 1000000, n_ops = 5, cap = n_ops * (vlen + 64) + 64;
    char *body = malloc(cap), *req = malloc(cap + 256);
    static char buf[65536];
    size_t len = (size_t)snprintf(body, cap, "{\"ops\":[");
    for (size_t i = 0; i < n_ops; i++) {
        len += (size_t)snprintf(body + len, cap - len,
                                "%s{\"op\":\"put\",\"key\":\"k%zu\","
                                "\"value\":\"",
                                i ? "," : "", i);
        memset(body + len, 'v', vlen);
        len += vlen;
        len += (size_t)snprintf(body + len, cap - len, "\"}");
    }
    len += (size_t)snprintf(body + len, cap - len, "]}");
    size_t n =
        (size_t)snprintf(req, 256,
                         "POST /v1/batch HTTP/1.1\r\nContent-Type: application/json"
                         "\r\nContent-Length: %zu\r\n\r\n",
                         len);
    memcpy(req + n, body, len);
    int s = connect_to(f.port);
    send_all(s, req, n + len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 413 ") == buf, "5 MB batch: %.300s", buf);
    ck_assert_msg(strstr(buf, "largest raft entry") != NULL, "%.300s", buf);
    const char *put = "PUT /v1/kv/after HTTP/1.1\r\nContent-Length: 1\r\n\r\nx";
    send_all(s, put, strlen(put));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "a PUT after it: %.300s", buf);
    close(s);
    free(body);
    free(req);
    fx_stop(&f);
}
END_TEST

START_TEST(test_stop_with_open_and_half_sent_connections)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char buf[4096];
    int idle = connect_to(f.port);
    int half = connect_to(f.port);
    send_all(half, "PUT /v1/kv/h HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 49);
    int used = connect_to(f.port);
    send_all(used, "GET /healthz HTTP/1.1\r\n\r\n", 25);
    read_responses(used, buf, sizeof(buf), 1);
    fx_stop(&f); /* every connection closed, nothing leaked (sanitizer build) */
    ck_assert_int_eq((int)recv(idle, buf, sizeof(buf), 0), 0);
    close(idle);
    close(half);
    close(used);
}
END_TEST

START_TEST(test_listen_failure_is_reported)
{
    struct fixture f;
    fx_start(&f, NULL);
    struct gateway_config gc;
    gateway_config_default(&gc);
    gc.port = f.port; /* taken */
    struct gateway *gw;
    ck_assert_int_eq(gateway_new(&gc, &gw), 0);
    struct node_options no;
    node_options_default(&no);
    no.id = 1;
    no.members.n_voters = 1;
    no.members.voters[0] = 1;
    struct transport_inproc_hub *hub = transport_inproc_hub_new(2);
    no.hub = hub;
    gateway_hook(gw, &no);
    struct node *n;
    ck_assert_int_eq(node_start(&no, &n), 0);
    ck_assert_int_eq(gateway_listen_status(gw), TK_EIO);
    ck_assert(strstr(gateway_listen_error(gw), "in use") != NULL);
    node_stop(n);
    gateway_free(gw);
    transport_inproc_hub_free(hub);
    fx_stop(&f);
    gc.value_max = gc.body_max + 1;
    ck_assert_int_eq(gateway_new(&gc, &gw), TK_EINVAL);
}
END_TEST

/* The value of the sample `series` (name and labels, as printed) in a
 * /metrics body; -1 when absent. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p != NULL && *p != 0;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return -1;
}

/* Checks that histogram `name` is well formed: TYPE histogram, cumulative
 * _bucket counts that never fall, a +Inf bucket equal to _count, a _sum.
 * Returns _count. */
static double check_histogram(const char *text, const char *name)
{
    char want[160];
    snprintf(want, sizeof(want), "# TYPE %s histogram\n", name);
    ck_assert_msg(strstr(text, want) != NULL, "%s is not a histogram", name);
    snprintf(want, sizeof(want), "%s{quantile=", name);
    ck_assert_msg(strstr(text, want) == NULL, "%s still has quantiles", name);
    snprintf(want, sizeof(want), "%s_bucket{le=\"", name);
    size_t wl = strlen(want);
    double prev = 0, inf = -1;
    int buckets = 0;
    for (const char *p = strstr(text, want); p != NULL; p = strstr(p + 1, want)) {
        const char *sp = strchr(p, ' ');
        ck_assert(sp != NULL);
        double v = strtod(sp + 1, NULL);
        ck_assert_msg(v >= prev, "%s: bucket %.*s falls below the one before", name,
                      (int)(sp - p), p);
        prev = v;
        buckets++;
        if (strncmp(p + wl, "+Inf\"}", 6) == 0)
            inf = v;
    }
    ck_assert_msg(buckets >= 2, "%s: %d buckets", name, buckets);
    snprintf(want, sizeof(want), "%s_count", name);
    double count = sample(text, want);
    ck_assert_msg(inf == count, "%s: +Inf bucket %g, _count %g", name, inf, count);
    snprintf(want, sizeof(want), "%s_sum", name);
    ck_assert_msg(sample(text, want) >= 0, "%s_sum missing", name);
    return count;
}

START_TEST(test_metrics_export_latency_histograms_read_rounds_and_kv_size)
{
    struct fixture f;
    fx_start(&f, NULL);
    int s = connect_to(f.port);
    static char buf[262144];
    for (int i = 0; i < 3; i++) {
        char req[128];
        int len =
            snprintf(req, sizeof(req),
                     "PUT /v1/kv/m%d HTTP/1.1\r\nContent-Length: 5\r\n\r\nvalue", i);
        send_all(s, req, (size_t)len);
        read_responses(s, buf, sizeof(buf), 1);
        ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "put: %s", buf);
    }
    const char *get = "GET /v1/kv/m0?consistency=linearizable HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "get: %s", buf);
    const char *metrics = "GET /metrics HTTP/1.1\r\n\r\n";
    send_all(s, metrics, strlen(metrics));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "metrics: %.200s", buf);
    const char *text = strstr(buf, "\r\n\r\n") + 4;

    /* Append, fsync and apply latencies, and batch sizes, as histograms. */
    double appends = check_histogram(text, "tierkv_store_append_seconds");
    double fsyncs = check_histogram(text, "tierkv_store_fsync_seconds");
    double applies = check_histogram(text, "tierkv_apply_seconds");
    double batches = check_histogram(text, "tierkv_proposal_batch_size");
    ck_assert_msg(appends >= 3 && applies >= 3, "appends %g, applies %g", appends,
                  applies);
    /* Every counted sync is timed: nothing writes after the last answer. */
    ck_assert_msg(fsyncs >= 3 && fsyncs == sample(text, "tierkv_store_syncs_total"),
                  "fsync samples %g, syncs %g", fsyncs,
                  sample(text, "tierkv_store_syncs_total"));
    /* Three writes sent one at a time: three batches of one entry. */
    ck_assert_int_eq((int)batches, 3);
    ck_assert_int_eq((int)sample(text, "tierkv_proposal_batch_size_bucket{le=\"1\"}"), 3);
    ck_assert(sample(text, "tierkv_store_fsync_seconds_bucket{le=\"1\"}") == fsyncs);

    /* ReadIndex: the read and the round that confirmed it. */
    ck_assert(sample(text, "tierkv_read_index_total") >= 1);
    ck_assert(sample(text, "tierkv_read_index_rounds_total") >= 1);
    ck_assert(strstr(text, "# TYPE tierkv_read_index_rounds_total counter\n") != NULL);

    /* Sizes: the log's appended bytes and the state machine's. */
    ck_assert(sample(text, "tierkv_store_appended_bytes_total") > 0);
    ck_assert(sample(text, "tierkv_store_bytes") < 0); /* renamed: it never was a size */
    ck_assert(sample(text, "tierkv_kv_ring_bytes") > 0);
    ck_assert(sample(text, "tierkv_kv_hot_keys") >= 3);
    ck_assert(sample(text, "tierkv_kv_cold_keys") >= 0);
    ck_assert(sample(text, "tierkv_kv_cold_bytes") > 0); /* LMDB's meta pages at least */
    ck_assert(sample(text, "tierkv_store_log_bytes") > 0);
    ck_assert(sample(text, "tierkv_kv_tier_downs_total") >= 0);
    ck_assert(sample(text, "tierkv_kv_bad_records_total") == 0);

    /* The loop's turns (issue 22): a histogram, the longest turn by phase,
     * and memory by owner. */
    ck_assert(check_histogram(text, "tierkv_loop_turn_seconds") >= 1);
    double longest = 0;
    static const char *const phases[] = {"ready",   "store",    "send", "apply",
                                         "advance", "snapshot", "tier", "compact",
                                         "recv",    "other"};
    for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++) {
        char series[96];
        snprintf(series, sizeof(series), "tierkv_loop_turn_max_seconds{phase=\"%s\"}",
                 phases[i]);
        double v = sample(text, series);
        ck_assert_msg(v >= 0, "%s missing", series);
        longest = v > longest ? v : longest;
    }
    ck_assert(longest > 0);
    ck_assert(sample(text, "tierkv_snapshot_loop_seconds_total") >= 0);
    ck_assert(sample(text, "tierkv_kv_tier_drain_seconds_total") >= 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"index\"}") > 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"view\"}") > 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"ring\"}") ==
              sample(text, "tierkv_kv_ring_bytes"));
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"sessions\"}") > 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"lmdb_mapped\"}") > 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"lmdb_resident\"}") >= 0);
    ck_assert(sample(text, "tierkv_memory_bytes{owner=\"snapshot_spare\"}") >= 0);
    close(s);
    fx_stop(&f);
}
END_TEST

/* Issue 19's conformance gaps: the header limit counts the whole block, a
 * chunked trailer is never a header, an out-of-range TTL is a 400 and an
 * HTTP/1.0 keep-alive is answered as one. */
/* Keys whose first byte is 0x01 are the node's own (membership records,
 * leases): a client's put, delete, batch or txn of one is refused (400
 * reserved_key), whoever sends it; other keys still write. */
START_TEST(test_reserved_keys_are_refused_to_clients)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char buf[8192];
    const char *reqs[] = {
        "PUT /v1/kv/%01tierkv%2Fmember%2F4 HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
        "DELETE /v1/kv/%01tierkv%2Fmember%2F1 HTTP/1.1\r\n\r\n",
        "POST /v1/batch HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: "
        "50\r\n\r\n{\"ops\":[{\"op\":\"put\",\"key\":\"\\u0001x\",\"value\":\"v\"}]}"};
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        int s = connect_to(f.port);
        send_all(s, reqs[i], strlen(reqs[i]));
        read_responses(s, buf, sizeof(buf), 1);
        ck_assert_msg(strstr(buf, "HTTP/1.1 400 ") == buf && strstr(buf, "reserved_key"),
                      "request %zu: %.300s", i, buf);
        close(s);
    }
    const char ok[] = "PUT /v1/kv/plain HTTP/1.1\r\nContent-Length: 1\r\n\r\nx";
    int s = connect_to(f.port);
    send_all(s, ok, strlen(ok));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "plain key: %.300s", buf);
    close(s);
    fx_stop(&f);
}
END_TEST

START_TEST(test_header_block_trailers_ttl_range_and_http10_keepalive)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char buf[65536], req[65536];
    /* 5000 one-byte headers: 20 KB of block, 5 KB of names and values. */
    size_t n = (size_t)snprintf(req, sizeof(req), "GET /healthz HTTP/1.1\r\n");
    for (int i = 0; i < 5000; i++) {
        memcpy(req + n, "a:b\r\n", 5);
        n += 5;
    }
    memcpy(req + n, "\r\n", 2);
    int s = connect_to(f.port);
    send_all(s, req, n + 2);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 431 ") == buf, "tiny headers: %.200s", buf);
    close(s);
    /* One header padded with 30 KB of whitespace. */
    n = (size_t)snprintf(req, sizeof(req), "GET /healthz HTTP/1.1\r\nX-Pad:");
    memset(req + n, ' ', 30000);
    n += 30000;
    n += (size_t)snprintf(req + n, sizeof(req) - n, "v\r\n\r\n");
    s = connect_to(f.port);
    send_all(s, req, n);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 431 ") == buf, "padded header: %.200s", buf);
    close(s);
    /* A trailer naming a JSON body changes nothing: the raw value is kept. */
    const char *chunked = "PUT /v1/kv/tr HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "3\r\nraw\r\n0\r\nContent-Type: application/json\r\n\r\n";
    s = connect_to(f.port);
    send_all(s, chunked, strlen(chunked));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "trailer: %.300s", buf);
    const char *get = "GET /v1/kv/tr?raw HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf && strstr(buf, "\r\n\r\nraw"),
                  "raw value after a trailer: %.300s", buf);
    /* A TTL that would overflow the clock: 400, not 409 not_a_number. */
    const char *ttl = "PUT /v1/kv/t?ttl_ms=18446744073709551615 HTTP/1.1\r\n"
                      "Content-Length: 1\r\n\r\nx";
    send_all(s, ttl, strlen(ttl));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 400 ") == buf, "ttl overflow: %.300s", buf);
    close(s);
    /* HTTP/1.0 with keep-alive: said in the answer, and the connection stays. */
    const char *h10 = "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    s = connect_to(f.port);
    send_all(s, h10, strlen(h10));
    size_t got = read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "1.0: %.300s", buf);
    ck_assert_msg(strcasestr(buf, "Connection: keep-alive\r\n") != NULL, "1.0: %.300s",
                  buf);
    send_all(s, h10, strlen(h10));
    memset(buf, 0, got + 1);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "1.0 again: %.300s", buf);
    close(s);
    fx_stop(&f);
}
END_TEST

/* ---- issue 19: slow readers and memory ---------------------------------- */

/* One series of GET /metrics, on a fresh connection. */
static double metric(uint16_t port, const char *series)
{
    static char buf[262144];
    int s = connect_to(port);
    const char *get = "GET /metrics HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 1);
    close(s);
    const char *text = strstr(buf, "\r\n\r\n");
    ck_assert_msg(text != NULL, "metrics: %.200s", buf);
    return sample(text + 4, series);
}

static void put_big(uint16_t port, const char *key, size_t len)
{
    static char buf[4096];
    char *req = malloc(len + 256);
    int n = snprintf(req, 256, "PUT /v1/kv/%s HTTP/1.1\r\nContent-Length: %zu\r\n\r\n",
                     key, len);
    memset(req + n, 'v', len);
    int s = connect_to(port);
    send_all(s, req, (size_t)n + len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "put %s: %.200s", key, buf);
    close(s);
    free(req);
}

/* A client that pipelines 100 GETs of a 256 KiB value and never reads: only
 * max-pipeline requests are parsed at a time (counted per request, not per
 * 16 KiB read), reading pauses, and once nothing drains within the write
 * deadline the connection is cut and its memory returned. */
START_TEST(test_client_that_does_not_read_is_bounded_and_cut)
{
    struct fixture f;
    struct gateway_config gc;
    gateway_config_default(&gc);
    gc.pipeline_max = 4;
    gc.write_timeout_ms = 500;
    fx_start(&f, &gc);
    put_big(f.port, "big", 256 << 10); /* 4 answers stay within a turn's budget */
    static char reqs[100 * 64];
    size_t len = 0;
    for (int i = 0; i < 100; i++)
        len += (size_t)snprintf(reqs + len, sizeof(reqs) - len,
                                "GET /v1/kv/big?raw HTTP/1.1\r\n\r\n");
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(f.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
    send_all(s, reqs, len);
    /* While it stalls: what the server holds stays near max-pipeline answers
     * (every one of the 100 parsed at once would be 25 MiB). */
    double peak = 0;
    for (int i = 0; i < 10; i++) {
        double held = metric(f.port, "tierkv_http_held_bytes");
        peak = held > peak ? held : peak;
        usleep(20000);
    }
    ck_assert_msg(peak >= 0 && peak < 4.0 * (1 << 20), "held %.0f bytes", peak);
    /* Cut within the write deadline (polled, bounded): memory comes back. On
     * a loaded machine several answers may be built in one loop turn, past
     * its budget: the server then answers 503 overloaded and closes, which
     * cuts the client as well. */
    double held = -1, cut = 0, over = 0;
    for (int i = 0; i < 200; i++) {
        held = metric(f.port, "tierkv_http_held_bytes");
        cut = metric(f.port, "tierkv_http_timeouts_total");
        over = metric(f.port, "tierkv_http_overloaded_total");
        if ((cut >= 1 || over >= 1) && held < 65536)
            break;
        usleep(50000);
    }
    ck_assert_msg((cut >= 1 || over >= 1) && held < 65536,
                  "not cut: timeouts %g, overloaded %g, held %g", cut, over, held);
    close(s);
    fx_stop(&f);
}
END_TEST

/* Body buffers grow as bytes arrive: a Content-Length alone reserves nothing;
 * and past the memory budget a request is answered 503 overloaded with
 * Retry-After while the others go on. */
START_TEST(test_body_memory_grows_with_bytes_and_the_budget_answers_503)
{
    struct fixture f;
    struct gateway_config gc;
    gateway_config_default(&gc);
    gc.body_max = 2u << 20;
    gc.value_max = 1u << 20;
    gc.mem_max = 5u << 20;
    fx_start(&f, &gc);
    static char buf[8192];
    int s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = connect_to(f.port);
        const char *h = "PUT /v1/kv/slow HTTP/1.1\r\nContent-Length: 2000000\r\n\r\nabc";
        send_all(s[i], h, strlen(h));
    }
    double held = -1;
    for (int i = 0; i < 100 && held < 3 * 4096; i++) {
        held = metric(f.port, "tierkv_http_held_bytes");
        usleep(10000);
    }
    /* At most 3 x 64 KiB, not 3 x 2 MB. */
    ck_assert_msg(held >= 3 * 4096 && held <= 3 * 65536, "held %g bytes", held);
    /* Two bodies of 1.9 MB (4 MiB of buffers) fit; the third passes 5 MiB. */
    char *more = malloc(1900000);
    memset(more, 'x', 1900000);
    send_all(s[0], more, 1900000);
    send_all(s[1], more, 1900000);
    for (int i = 0; i < 500 && metric(f.port, "tierkv_http_held_bytes") < (4u << 20); i++)
        usleep(10000);
    int s2 = connect_to(f.port);
    const char *h = "PUT /v1/kv/late HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n";
    send_all(s2, h, strlen(h));
    read_responses(s2, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 503 ") == buf, "over budget: %.300s", buf);
    ck_assert_msg(strstr(buf, "overloaded") != NULL, "%.300s", buf);
    ck_assert_msg(strstr(buf, "Retry-After: 1\r\n") != NULL, "%.300s", buf);
    close(s2);
    for (int i = 0; i < 3; i++)
        close(s[i]);
    free(more);
    /* Once they are gone, writes go on. */
    for (int i = 0; i < 100 && metric(f.port, "tierkv_http_held_bytes") > 65536; i++)
        usleep(10000);
    put_big(f.port, "after", 1000);
    fx_stop(&f);
}
END_TEST

/* A body of 32 KiB or more is decoded on the thread pool (api_offload.c):
 * its answers are those of the loop's path, and the connection's later
 * requests wait behind it: a small PUT pipelined after a large batch that
 * writes the same key is applied after it. */
static size_t big_batch(char *out, size_t cap, const char *path, const char *key,
                        const char *value, size_t pad)
{
    char *fill = malloc(pad + 1);
    memset(fill, 'a', pad);
    fill[pad] = 0;
    char body[128 + 70000];
    int bl = snprintf(body, sizeof(body),
                      "{\"ops\":[{\"op\":\"put\",\"key\":\"bigpad\",\"value\":\"%s\"},"
                      "{\"op\":\"put\",\"key\":\"%s\",\"value\":\"%s\"}]}",
                      fill, key, value);
    free(fill);
    return (size_t)snprintf(out, cap,
                            "POST %s HTTP/1.1\r\nContent-Type: application/json\r\n"
                            "Content-Length: %d\r\n\r\n%s",
                            path, bl, body);
}

START_TEST(test_large_bodies_are_decoded_off_the_loop_in_order)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char req[3 * 70000], buf[65536];
    double before = metric(f.port, "tierkv_http_bodies_offloaded_total");
    int s = connect_to(f.port);
    size_t len = big_batch(req, sizeof(req), "/v1/batch", "order", "first", 40000);
    const char *tail = "PUT /v1/kv/order HTTP/1.1\r\nContent-Length: 6\r\n\r\nsecond"
                       "GET /v1/kv/order HTTP/1.1\r\n\r\n";
    memcpy(req + len, tail, strlen(tail));
    len += strlen(tail);
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 3);
    ck_assert_msg(count_status(buf, "HTTP/1.1 200 OK") == 3, "answers: %.600s", buf);
    ck_assert_msg(strstr(buf, "\"value\":\"second\"") != NULL,
                  "the PUT sent after the batch overtook it: %.600s", buf);
    /* The last write applied is the PUT's: it did not overtake the batch. */
    const char *again = "GET /v1/kv/order HTTP/1.1\r\n\r\n";
    send_all(s, again, strlen(again));
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "\"value\":\"second\"") != NULL,
                  "the PUT sent after the batch was applied before it: %.600s", buf);
    double after = metric(f.port, "tierkv_http_bodies_offloaded_total");
    printf("bodies offloaded: %.0f -> %.0f\n", before, after);
    ck_assert(after >= before + 1);

    /* A txn and a JSON PUT of that size; a malformed body; a reserved key. */
    len = big_batch(req, sizeof(req), "/v1/batch", "k2", "v2", 40000);
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "batch: %.300s", buf);
    char *val = malloc(40001);
    memset(val, 'b', 40000);
    val[40000] = 0;
    len = (size_t)snprintf(
        req, sizeof(req),
        "PUT /v1/kv/jsonput HTTP/1.1\r\nContent-Type: application/json\r\n"
        "Content-Length: %zu\r\n\r\n{\"value\":\"%s\"}",
        strlen(val) + 12, val);
    free(val);
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 OK") == buf, "json put: %.300s", buf);
    len = big_batch(req, sizeof(req), "/v1/batch", "k3", "v3", 40000);
    req[len - 2] = '}'; /* ..."}}} : malformed */
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 400 ") == buf, "malformed: %.300s", buf);
    close(s);
    s = connect_to(f.port);
    len = big_batch(req, sizeof(req), "/v1/batch", "\\u0001x", "v", 40000);
    send_all(s, req, len);
    read_responses(s, buf, sizeof(buf), 1);
    ck_assert_msg(strstr(buf, "HTTP/1.1 400 ") == buf && strstr(buf, "reserved_key"),
                  "reserved: %.300s", buf);
    const char *get = "GET /v1/kv/jsonput HTTP/1.1\r\n\r\nGET /v1/kv/k3 HTTP/1.1\r\n\r\n";
    send_all(s, get, strlen(get));
    read_responses(s, buf, sizeof(buf), 2);
    ck_assert_msg(strstr(buf, "\"value\":\"bbbb") != NULL, "json put read: %.300s", buf);
    ck_assert_msg(strstr(buf, "HTTP/1.1 404 ") != NULL, "malformed batch applied: %.300s",
                  buf);
    close(s);
    printf("bodies offloaded at the end: %.0f\n",
           metric(f.port, "tierkv_http_bodies_offloaded_total"));
    fx_stop(&f);
}
END_TEST

/* One request on a fresh connection; its answer (head and body) in buf. */
static const char *ask(uint16_t port, const char *method, const char *path,
                       const char *body, size_t body_len, char *buf, size_t cap)
{
    char *req = malloc(body_len + 512);
    int n = snprintf(req, 512,
                     "%s %s HTTP/1.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, body_len);
    memcpy(req + n, body, body_len);
    int s = connect_to(port);
    send_all(s, req, (size_t)n + body_len);
    size_t len = read_responses(s, buf, cap, 1);
    buf[len] = 0;
    close(s);
    free(req);
    return buf;
}

/* The stored value of `key` (GET ?raw) equals want[0, want_len). */
static void check_raw(uint16_t port, const char *key, const char *want, size_t want_len)
{
    static char buf[1 << 17];
    char path[256];
    snprintf(path, sizeof(path), "/v1/kv/%s?raw", key);
    ask(port, "GET", path, "", 0, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "get %s: %.200s", key, buf);
    const char *v = strstr(buf, "\r\n\r\n") + 4;
    const char *cl = strcasestr(buf, "Content-Length: ");
    ck_assert(cl != NULL);
    size_t got = strtoul(cl + 16, NULL, 10);
    ck_assert_msg(got == want_len && memcmp(v, want, want_len) == 0,
                  "%s: %zu bytes read back, %zu written", key, got, want_len);
}

/* A "value" of 1 KiB or more without escapes is checked and taken from the
 * body (api_body.c's spans), jansson parsing a placeholder: what is stored is
 * what jansson would have stored, and what jansson refuses (bad UTF-8, a
 * control character) is still refused: a checker that let them through
 * would store them and fail here. */
START_TEST(test_long_values_are_taken_from_the_body)
{
    struct fixture f;
    fx_start(&f, NULL);
    static char body[1 << 17], buf[1 << 16];
    static char ascii[5001], utf8[9001], big[2001];
    for (size_t i = 0; i < 5000; i++)
        ascii[i] = (char)(0x20 + (i * 7) % 95 == '"' || 0x20 + (i * 7) % 95 == '\\'
                              ? 'q'
                              : 0x20 + (i * 7) % 95);
    ascii[4999] = 0x7f;
    size_t ul = 0;
    while (ul + 10 <= 9000) { /* 2-, 3- and 4-byte forms and ASCII */
        memcpy(utf8 + ul, "\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9ex", 10);
        ul += 10;
    }
    memset(big, 'c', 2000);
    double m0 = metric(f.port, "tierkv_http_body_values_by_reference_total");

    int n =
        snprintf(body, sizeof(body),
                 "{\"ops\":[{\"op\":\"put\",\"key\":\"lv/ascii\",\"value\":\"%.5000s\"},"
                 "{\"op\":\"put\",\"key\":\"lv/utf8\",\"value\" : \"%.*s\"}]}",
                 ascii, (int)ul, utf8);
    ask(f.port, "POST", "/v1/batch", body, (size_t)n, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "batch: %.300s", buf);
    check_raw(f.port, "lv/ascii", ascii, 5000);
    check_raw(f.port, "lv/utf8", utf8, ul);
    double m1 = metric(f.port, "tierkv_http_body_values_by_reference_total");
    ck_assert_msg(m1 == m0 + 2, "values by reference: %.0f -> %.0f", m0, m1);

    /* A compare's value, and base64. */
    n = snprintf(
        body, sizeof(body),
        "{\"compare\":[{\"key\":\"lv/ascii\",\"target\":\"value\",\"value\":"
        "\"%.5000s\"}],\"then\":[{\"op\":\"put\",\"key\":\"lv/txn\",\"value\":\"ok\"}]}",
        ascii);
    ask(f.port, "POST", "/v1/txn", body, (size_t)n, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "\"succeeded\":true") != NULL, "txn: %.300s", buf);
    n = snprintf(body, sizeof(body), "{\"value\":\"");
    for (int i = 0; i < 500; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "QUFB");
    n += snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    ask(f.port, "PUT", "/v1/kv/lv/b64?encoding=base64", body, (size_t)n, buf,
        sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "base64 put: %.300s", buf);
    static char aaa[1500];
    memset(aaa, 'A', sizeof(aaa));
    check_raw(f.port, "lv/b64", aaa, sizeof(aaa));
    double m2 = metric(f.port, "tierkv_http_body_values_by_reference_total");
    ck_assert_msg(m2 == m1 + 2, "values by reference: %.0f -> %.0f", m1, m2);

    /* Parsed by jansson: an escape in the value; a body holding "\u0000"
     * (a placeholder's look-alike, "\u00000", stored as two bytes). */
    n = snprintf(body, sizeof(body), "{\"value\":\"%.2000s\\n\"}", big);
    ask(f.port, "PUT", "/v1/kv/lv/esc", body, (size_t)n, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "escaped put: %.300s", buf);
    big[2000] = '\n';
    check_raw(f.port, "lv/esc", big, 2001);
    n = snprintf(body, sizeof(body),
                 "{\"ops\":[{\"op\":\"put\",\"key\":\"lv/mark\",\"value\":\"\\u00000\"},"
                 "{\"op\":\"put\",\"key\":\"lv/big\",\"value\":\"%.2000s\"}]}",
                 big);
    ask(f.port, "POST", "/v1/batch", body, (size_t)n, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 200 ") == buf, "look-alike: %.300s", buf);
    check_raw(f.port, "lv/mark",
              "\0"
              "0",
              2);
    check_raw(f.port, "lv/big", big, 2000);
    double m3 = metric(f.port, "tierkv_http_body_values_by_reference_total");
    ck_assert_msg(m3 == m2, "values by reference: %.0f -> %.0f", m2, m3);

    /* Refused as jansson refuses them: bytes that are not UTF-8 (a lone
     * continuation, an overlong form, a surrogate, past U+10FFFF, a form cut
     * by the quote, a bad second byte) and a raw control character. */
    static const char *const bad[] = {
        "\x80",     "\xc0\x80",     "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xe2\x82", "\xe2\x28\xa1", "\x01",         "\xff"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        for (int at = 0; at < 2; at++) { /* in the middle, and at the end */
            n = snprintf(body, sizeof(body), "{\"value\":\"%.1500s%s%s\"}", ascii, bad[k],
                         at ? "" : "tail");
            ask(f.port, "PUT", "/v1/kv/lv/bad", body, (size_t)n, buf, sizeof(buf));
            ck_assert_msg(strstr(buf, "HTTP/1.1 400 ") == buf, "bad %zu at %d: %.300s", k,
                          at, buf);
        }
    }
    ask(f.port, "GET", "/v1/kv/lv/bad", "", 0, buf, sizeof(buf));
    ck_assert_msg(strstr(buf, "HTTP/1.1 404 ") == buf, "a bad value was stored: %.200s",
                  buf);
    printf("values by reference: %.0f\n", m3);
    fx_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gateway");
    TCase *j = tcase_create("json");
    tcase_add_test(j, test_utf8_validation_rejects_malformed_sequences);
    tcase_add_test(j, test_base64_round_trips_and_rejects_garbage);
    tcase_add_test(j, test_percent_decoding_and_json_escaping);
    tcase_add_test(j, test_u64_digits_and_a_buffer_that_outgrows_the_stack);
    suite_add_tcase(s, j);
    TCase *h = tcase_create("http");
    tcase_set_timeout(h, 30);
    tcase_add_test(h, test_put_then_get_on_one_keepalive_connection);
    tcase_add_test(h, test_steady_requests_allocate_nothing_in_the_http_server);
    tcase_add_test(h, test_a_turn_reads_at_most_its_budget_and_every_body_arrives_whole);
    tcase_add_test(h, test_pipelined_requests_answer_in_order);
    tcase_add_test(h, test_chunked_body_and_expect_continue);
    tcase_add_test(h, test_malformed_request_gets_400_and_server_stays_up);
    tcase_add_test(h, test_route_table_answers_404_405_with_allow_and_counts_routes);
    tcase_add_test(h, test_oversized_requests_get_413_and_431);
    tcase_add_test(h, test_command_over_the_entry_limit_is_refused_and_writes_go_on);
    tcase_add_test(h, test_stop_with_open_and_half_sent_connections);
    tcase_add_test(h, test_listen_failure_is_reported);
    tcase_add_test(h, test_metrics_export_latency_histograms_read_rounds_and_kv_size);
    tcase_add_test(h, test_client_that_does_not_read_is_bounded_and_cut);
    tcase_add_test(h, test_reserved_keys_are_refused_to_clients);
    tcase_add_test(h, test_header_block_trailers_ttl_range_and_http10_keepalive);
    tcase_add_test(h, test_body_memory_grows_with_bytes_and_the_budget_answers_503);
    tcase_add_test(h, test_large_bodies_are_decoded_off_the_loop_in_order);
    tcase_add_test(h, test_long_values_are_taken_from_the_body);
    suite_add_tcase(s, h);
    return tk_check_run(srunner_create(s));
}
