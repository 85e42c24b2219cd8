/* The gRPC server of etcdapi/ (grpc.h) on its own: its loop on a thread,
 * a fake service ("/t.S/Echo" answers its request, "/t.S/Hold" holds the
 * call until the test says), and clients that speak HTTP/2 through
 * nghttp2's client session over blocking sockets, or send raw bytes.
 * Checks the bounds and the lifetimes grpc.h promises: a bad preface
 * closes, a declared message over the limit and an unknown method answer
 * 8 and 12, a request that never ends 4, the connection cap closes the extra one at
 * accept, and a call whose client left before its answer is freed by that answer (ASan
 * and the call count tell). Streams: "/t.S/Stream" echoes each message and
 * ends OK when the client's half ends; "/t.S/Flood" queues 64 KiB answers
 * at open until grpc_stream_send says TK_EBUSY (its bound). Every test ends
 * with uv_loop_close == 0. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "base/err.h"
#include "etcdapi/grpc.h"

/* ---- the server on its thread ------------------------------------------- */

#define HELD_MAX 8

struct fixture {
    uv_loop_t loop;
    uv_thread_t thread;
    uv_async_t cmd;
    struct grpc_server *srv;
    uint16_t port;
    atomic_int want_stop, want_answer;
    atomic_int held_n;
    struct grpc_call *held[HELD_MAX];
    atomic_uint calls, conns;
    atomic_size_t flood_bytes; /* what /t.S/Flood queued before TK_EBUSY */
    atomic_int flood_busy;
};

static bool is_stream_cb(const char *path, size_t len, void *data);

static bool accept_cb(const char *path, size_t len, char *msg, size_t cap, void *data)
{
    (void)msg;
    (void)cap;
    (void)data;
    return (len == 9 &&
            (memcmp(path, "/t.S/Echo", 9) == 0 || memcmp(path, "/t.S/Hold", 9) == 0)) ||
           is_stream_cb(path, len, data);
}

static void fill_copy(uint8_t *out, size_t len, const void *arg)
{
    memcpy(out, arg, len);
}

static bool is_stream_cb(const char *path, size_t len, void *data)
{
    (void)data;
    return (len == 11 && memcmp(path, "/t.S/Stream", 11) == 0) ||
           (len == 10 && memcmp(path, "/t.S/Flood", 10) == 0);
}

static void fill_zero(uint8_t *out, size_t len, const void *arg)
{
    (void)arg;
    memset(out, 0, len);
}

static void on_stream_open(struct grpc_call *call, const char *path, size_t len,
                           void *data)
{
    struct fixture *f = data;
    if (len == 10 && memcmp(path, "/t.S/Flood", 10) == 0) {
        size_t total = 0;
        int rc;
        while ((rc = grpc_stream_send(call, 64 * 1024, fill_zero, NULL)) == 0 &&
               total < (64u << 20))
            total += 64 * 1024 + 5;
        f->flood_bytes = total;
        f->flood_busy = rc == TK_EBUSY;
    }
}

static void on_stream_msg(struct grpc_call *call, const uint8_t *msg, size_t len,
                          void *data)
{
    (void)data;
    grpc_stream_send(call, len, fill_copy, msg);
}

static void on_stream_end(struct grpc_call *call, bool gone, void *data)
{
    (void)data;
    (void)gone;
    grpc_stream_finish(call, GRPC_OK, "%s", "");
}

static void on_call(struct grpc_call *call, const char *path, size_t path_len,
                    const uint8_t *msg, size_t msg_len, void *data)
{
    struct fixture *f = data;
    if (path_len == 9 && memcmp(path, "/t.S/Hold", 9) == 0 && f->held_n < HELD_MAX) {
        f->held[f->held_n] = call;
        atomic_fetch_add(&f->held_n, 1);
        return;
    }
    grpc_call_reply(call, msg_len, fill_copy, msg);
}

static void on_cmd(uv_async_t *a)
{
    struct fixture *f = a->data;
    if (atomic_exchange(&f->want_answer, 0)) {
        int n = atomic_exchange(&f->held_n, 0);
        for (int i = 0; i < n; i++)
            grpc_call_fail(f->held[i], GRPC_UNAVAILABLE, "answered late");
    }
    f->calls = grpc_server_calls(f->srv);
    f->conns = grpc_server_conns(f->srv);
    if (f->want_stop) {
        grpc_server_stop(f->srv);
        uv_close((uv_handle_t *)&f->cmd, NULL);
    }
}

static void loop_thread(void *arg)
{
    struct fixture *f = arg;
    uv_run(&f->loop, UV_RUN_DEFAULT);
}

static void fixture_start(struct fixture *f, uint32_t conns_max)
{
    memset(f, 0, sizeof(*f));
    ck_assert_int_eq(uv_loop_init(&f->loop), 0);
    struct grpc_config c;
    grpc_config_default(&c);
    c.conns_max = conns_max;
    c.request_timeout_ms = 300; /* the sweep runs every second */
    static const struct grpc_callbacks cb = {.accept = accept_cb,
                                             .on_call = on_call,
                                             .is_stream = is_stream_cb,
                                             .on_stream_open = on_stream_open,
                                             .on_stream_msg = on_stream_msg,
                                             .on_stream_end = on_stream_end};
    f->srv = grpc_server_new(&c, &cb, f);
    char err[128];
    ck_assert_int_eq(
        grpc_server_listen(f->srv, &f->loop, "127.0.0.1", 0, err, sizeof(err)), 0);
    f->port = grpc_server_port(f->srv);
    ck_assert_uint_ne(f->port, 0);
    uv_async_init(&f->loop, &f->cmd, on_cmd);
    f->cmd.data = f;
    ck_assert_int_eq(uv_thread_create(&f->thread, loop_thread, f), 0);
}

/* Runs on_cmd on the loop and waits until it has (the counters refreshed). */
static void fixture_poke(struct fixture *f)
{
    f->calls = UINT32_MAX;
    uv_async_send(&f->cmd);
    for (int i = 0; i < 5000 && f->calls == UINT32_MAX; i++)
        usleep(1000);
    ck_assert_uint_ne(f->calls, UINT32_MAX);
}

static void fixture_stop(struct fixture *f)
{
    f->want_stop = 1;
    uv_async_send(&f->cmd);
    uv_thread_join(&f->thread);
    grpc_server_free(f->srv);
    ck_assert_int_eq(uv_loop_close(&f->loop), 0);
}

/* ---- clients ------------------------------------------------------------ */

static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Does the server close `fd` within the receive timeout (10 s)? */
static bool closed_by_server(int fd)
{
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            return false; /* the timeout */
    }
}

struct cli {
    int fd;
    nghttp2_session *s;
    int32_t id;
    int status; /* grpc-status, -1 until seen */
    bool done;
    uint8_t body[64];
    size_t body_len, body_off;
    bool hang; /* never ends the request (no END_STREAM) */
    uint8_t got[64];
    size_t got_len;
};

static int cli_header(nghttp2_session *s, const nghttp2_frame *fr, const uint8_t *name,
                      size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags,
                      void *user)
{
    (void)s;
    (void)fr;
    (void)flags;
    struct cli *c = user;
    if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0 && vlen < 4) {
        char v[4] = {0};
        memcpy(v, value, vlen);
        c->status = atoi(v);
    }
    return 0;
}

static int cli_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
                    size_t len, void *user)
{
    (void)s;
    (void)flags;
    (void)id;
    struct cli *c = user;
    if (c->got_len + len <= sizeof(c->got)) {
        memcpy(c->got + c->got_len, data, len);
        c->got_len += len;
    }
    return 0;
}

static int cli_close(nghttp2_session *s, int32_t id, uint32_t code, void *user)
{
    (void)s;
    (void)code;
    struct cli *c = user;
    if (id == c->id)
        c->done = true;
    return 0;
}

static ssize_t cli_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
                        uint32_t *flags, nghttp2_data_source *src, void *user)
{
    (void)s;
    (void)id;
    (void)src;
    struct cli *c = user;
    size_t n = c->body_len - c->body_off;
    if (n == 0 && c->hang)
        return NGHTTP2_ERR_DEFERRED;
    if (n > len)
        n = len;
    memcpy(buf, c->body + c->body_off, n);
    c->body_off += n;
    if (c->body_off == c->body_len && !c->hang)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* One call: `path` with `body` (already framed). Returns its grpc-status
 * (-1: none came), with the answer's bytes in c->got. With `leave`, it
 * returns as soon as the request is sent, the socket open in c->fd for the
 * caller to close (the client leaving before its answer). */
static int cli_call(struct cli *c, uint16_t port, const char *path, const uint8_t *body,
                    size_t len, bool leave)
{
    bool hang = c->hang;
    memset(c, 0, sizeof(*c));
    c->hang = hang;
    c->status = -1;
    c->fd = dial(port);
    memcpy(c->body, body, len);
    c->body_len = len;
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, cli_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, cli_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, cli_close);
    nghttp2_session_client_new(&c->s, cb, c);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL, 0);
#define CNV(n, v)                                                                        \
    {(uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv nva[] = {CNV(":method", "POST"),
                        CNV(":scheme", "http"),
                        CNV(":path", path),
                        CNV(":authority", "t"),
                        CNV("content-type", "application/grpc"),
                        CNV("te", "trailers")};
    nghttp2_data_provider dp = {.read_callback = cli_body};
    c->id = nghttp2_submit_request(c->s, NULL, nva, 6, &dp, NULL);
    ck_assert_int_gt(c->id, 0);
    for (int turn = 0; turn < 1000 && !c->done; turn++) {
        const uint8_t *p;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(c->s, &p)) > 0)
            ck_assert_int_eq(write(c->fd, p, (size_t)n), n);
        if (leave)
            break;
        uint8_t buf[16384];
        ssize_t r = read(c->fd, buf, sizeof(buf));
        if (r <= 0)
            break;
        ck_assert_int_ge(nghttp2_session_mem_recv(c->s, buf, (size_t)r), 0);
    }
    nghttp2_session_del(c->s);
    if (!leave)
        close(c->fd);
    return c->status;
}

static size_t frame(uint8_t *out, const char *msg, uint32_t declared)
{
    size_t len = strlen(msg);
    out[0] = 0;
    out[1] = (uint8_t)(declared >> 24);
    out[2] = (uint8_t)(declared >> 16);
    out[3] = (uint8_t)(declared >> 8);
    out[4] = (uint8_t)declared;
    memcpy(out + 5, msg, len);
    return 5 + len;
}

/* ---- tests -------------------------------------------------------------- */

START_TEST(test_echo_answers_with_status_ok_and_the_message)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "hello", 5);
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Echo", body, n, false), 0);
    ck_assert_uint_eq(c.got_len, n);
    ck_assert_mem_eq(c.got, body, n);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_unknown_method_is_unimplemented)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "x", 1);
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Nope", body, n, false),
                     GRPC_UNIMPLEMENTED);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_declared_length_over_limit_is_resource_exhausted)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "", 100u << 20);
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Echo", body, n, false),
                     GRPC_RESOURCE_EXHAUSTED);
    /* A length that disagrees with the bytes sent: not one whole message. */
    n = frame(body, "abc", 7);
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Echo", body, n, false), GRPC_INTERNAL);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_request_that_never_ends_is_deadline_exceeded)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {.hang = true};
    uint8_t body[32];
    size_t n = frame(body, "abc", 100); /* 3 of 100 bytes, then nothing */
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Echo", body, n, false),
                     GRPC_DEADLINE_EXCEEDED);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_garbage_preface_is_closed)
{
    struct fixture f;
    fixture_start(&f, 16);
    int fd = dial(f.port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02\x03";
    ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    ck_assert(closed_by_server(fd));
    close(fd);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_connection_past_the_cap_is_closed_at_accept)
{
    struct fixture f;
    fixture_start(&f, 2);
    int a = dial(f.port), b = dial(f.port);
    for (int i = 0; i < 5000; i++) { /* both accepted before the third */
        fixture_poke(&f);
        if (f.conns == 2)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(f.conns, 2);
    int c = dial(f.port);
    ck_assert(closed_by_server(c));
    close(c);
    close(a);
    close(b);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_held_call_whose_client_left_is_freed_by_its_answer)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "hold", 4);
    cli_call(&c, f.port, "/t.S/Hold", body, n, true);
    for (int i = 0; i < 5000 && f.held_n == 0; i++)
        usleep(1000);
    ck_assert_int_eq(f.held_n, 1);
    close(c.fd);                     /* the client leaves before its answer */
    for (int i = 0; i < 5000; i++) { /* the connection is gone, the call held */
        fixture_poke(&f);
        if (f.conns == 0)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(f.conns, 0);
    ck_assert_uint_eq(f.calls, 1);
    f.want_answer = 1;
    fixture_poke(&f);
    ck_assert_uint_eq(f.calls, 0);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_stop_with_an_idle_connection_and_a_call_answered_frees_all)
{
    struct fixture f;
    fixture_start(&f, 16);
    int fd = dial(f.port);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "hold", 4);
    cli_call(&c, f.port, "/t.S/Hold", body, n, true);
    for (int i = 0; i < 5000 && f.held_n == 0; i++)
        usleep(1000);
    ck_assert_int_eq(f.held_n, 1);
    f.want_answer = 1; /* answered in the same turn as the stop */
    fixture_stop(&f);
    close(c.fd);
    close(fd);
}
END_TEST

START_TEST(test_stream_echoes_each_message_then_ends_ok)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "one", 3);
    n += frame(body + n, "two!", 4);
    ck_assert_int_eq(cli_call(&c, f.port, "/t.S/Stream", body, n, false), 0);
    ck_assert_uint_eq(c.got_len, n); /* both messages, as sent */
    ck_assert_int_eq(memcmp(c.got, body, n), 0);
    fixture_poke(&f);
    ck_assert_uint_eq(f.calls, 0);
    fixture_stop(&f);
}
END_TEST

/* Known-bad for the one above: a message cut short is not echoed. */
START_TEST(test_stream_partial_message_is_not_delivered)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {0};
    uint8_t body[32];
    size_t n = frame(body, "one", 9); /* declares 9, sends 3 */
    cli_call(&c, f.port, "/t.S/Stream", body, n, false);
    ck_assert_uint_eq(c.got_len, 0);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_stream_whose_client_left_is_ended_and_freed)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {.hang = true};
    uint8_t body[32];
    size_t n = frame(body, "one", 3);
    cli_call(&c, f.port, "/t.S/Stream", body, n, true);
    for (int i = 0; i < 5000; i++) { /* the stream is held while it is open */
        fixture_poke(&f);
        if (f.calls == 1)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(f.calls, 1);
    close(c.fd);
    for (int i = 0; i < 5000; i++) {
        fixture_poke(&f);
        if (f.conns == 0 && f.calls == 0)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(f.conns, 0);
    ck_assert_uint_eq(f.calls, 0);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_stream_output_is_bounded_per_stream)
{
    struct fixture f;
    fixture_start(&f, 16);
    struct cli c = {.hang = true};
    uint8_t body[32];
    size_t n = frame(body, "x", 1);
    cli_call(&c, f.port, "/t.S/Flood", body, n, true); /* never reads */
    for (int i = 0; i < 5000 && f.flood_bytes == 0; i++)
        usleep(1000);
    ck_assert_int_eq(f.flood_busy, 1);
    /* 4 MiB queued (stream_out_max) plus what nghttp2 took within the
     * client's 64 KiB window */
    ck_assert_uint_ge(f.flood_bytes, 3u << 20);
    ck_assert_uint_le(f.flood_bytes, (4u << 20) + (256u << 10));
    close(c.fd);
    for (int i = 0; i < 5000; i++) {
        fixture_poke(&f);
        if (f.conns == 0 && f.calls == 0)
            break;
        usleep(1000);
    }
    ck_assert_uint_eq(f.calls, 0);
    fixture_stop(&f);
}
END_TEST

static Suite *grpc_suite(void)
{
    Suite *s = suite_create("etcdapi_grpc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_echo_answers_with_status_ok_and_the_message);
    tcase_add_test(tc, test_unknown_method_is_unimplemented);
    tcase_add_test(tc, test_declared_length_over_limit_is_resource_exhausted);
    tcase_add_test(tc, test_request_that_never_ends_is_deadline_exceeded);
    tcase_add_test(tc, test_garbage_preface_is_closed);
    tcase_add_test(tc, test_connection_past_the_cap_is_closed_at_accept);
    tcase_add_test(tc, test_held_call_whose_client_left_is_freed_by_its_answer);
    tcase_add_test(tc, test_stop_with_an_idle_connection_and_a_call_answered_frees_all);
    tcase_add_test(tc, test_stream_echoes_each_message_then_ends_ok);
    tcase_add_test(tc, test_stream_partial_message_is_not_delivered);
    tcase_add_test(tc, test_stream_whose_client_left_is_ended_and_freed);
    tcase_add_test(tc, test_stream_output_is_bounded_per_stream);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as tierkvd: a peer gone is an error, not a signal */
    SRunner *sr = srunner_create(grpc_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
