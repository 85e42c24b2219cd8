/* The TLS engine (tls/tls.h) with no socket: a server and a client session
 * pumped through memory, with certificates made at test time
 * (tk_tls_testcert_write, tls_testcert.h). A partial record yields "need more" (0) and
 * never waits; the input bound holds; wrong CA, expired certificates and a missing client
 * certificate fail the handshake with a reason; peer names are checked. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "base/err.h"
#include "tests/check_run.h"
#include "tls/tls.h"
#include "tls/tls_testcert.h"
#include "tls/tls_uv.h"

static char dir[64];
static char path[8][128];

enum { CA1, CA1_KEY, CA2, CA2_KEY, OLD, OLD_KEY };

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/tk-tls-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const char *files[] = {"a.pem", "a.key", "b.pem", "b.key", "old.pem", "old.key"};
    for (int i = 0; i < 6; i++)
        snprintf(path[i], sizeof(path[i]), "%s/%s", dir, files[i]);
    const char *a[] = {"node-1", "localhost"}, *b[] = {"node-2"};
    ck_assert_int_eq(tk_tls_testcert_write(path[CA1], path[CA1_KEY], a, 2, 1), 0);
    ck_assert_int_eq(tk_tls_testcert_write(path[CA2], path[CA2_KEY], b, 1, 1), 0);
    ck_assert_int_eq(tk_tls_testcert_write(path[OLD], path[OLD_KEY], a, 2, -1), 0);
}

static void teardown(void)
{
    for (int i = 0; i < 6; i++)
        unlink(path[i]);
    rmdir(dir);
}

static struct tk_tls_ctx *ctx(bool server, int cert, int ca)
{
    struct tk_tls_ctx_config c = {.server = server,
                                  .cert_file = cert >= 0 ? path[cert] : NULL,
                                  .key_file = cert >= 0 ? path[cert + 1] : NULL,
                                  .ca_file = ca >= 0 ? path[ca] : NULL};
    struct tk_tls_ctx *x = NULL;
    char err[TK_TLS_ERR_MAX];
    ck_assert_msg(tk_tls_ctx_new(&c, &x, err, sizeof(err)) == 0, "%s", err);
    return x;
}

/* Moves everything `from` has to say into `to`. */
static void pump(struct tk_tls *from, struct tk_tls *to)
{
    char buf[4096];
    size_t n;
    while ((n = tk_tls_out_take(from, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(tk_tls_feed(to, buf, n), 0);
}

/* Runs the handshake; returns the client's result (1 done, < 0 failed) and
 * the server's in *srv. */
static int handshake(struct tk_tls *s, struct tk_tls *c, int *srv)
{
    int hc = 0, hs = 0;
    for (int i = 0; i < 10 && (hc == 0 || hs == 0); i++) {
        if (hc == 0)
            hc = tk_tls_handshake(c);
        pump(c, s);
        if (hs == 0)
            hs = tk_tls_handshake(s);
        pump(s, c);
    }
    if (hc == 1) {
        /* TLS 1.3: the server judges the client's certificate on its last
         * flight; a read makes the client see the alert. */
        char b[16];
        hc = tk_tls_read(c, b, sizeof(b)) < 0 ? TK_EPROTO : 1;
    }
    *srv = hs;
    return hc;
}

START_TEST(test_handshake_echo_and_names)
{
    struct tk_tls_ctx *sc = ctx(true, CA1, -1), *cc = ctx(false, -1, CA1);
    struct tk_tls *s = tk_tls_new(sc, NULL), *c = tk_tls_new(cc, "localhost");
    int hs;
    ck_assert_int_eq(handshake(s, c, &hs), 1);
    ck_assert_int_eq(hs, 1);
    ck_assert(tk_tls_peer_verified(c));
    ck_assert(tk_tls_peer_has_name(c, "node-1"));
    ck_assert(!tk_tls_peer_has_name(c, "node-2"));
    ck_assert(!tk_tls_peer_has_name(c, "node-"));
    ck_assert(!tk_tls_peer_verified(s)); /* no client certificate asked */
    ck_assert_int_eq(tk_tls_write(c, "ping", 4), 0);
    pump(c, s);
    char buf[64];
    ck_assert_int_eq(tk_tls_read(s, buf, sizeof(buf)), 4);
    ck_assert(memcmp(buf, "ping", 4) == 0);
    ck_assert_int_eq(tk_tls_read(s, buf, sizeof(buf)), 0); /* nothing more */
    tk_tls_shutdown(c);
    pump(c, s);
    ck_assert_int_eq(tk_tls_read(s, buf, sizeof(buf)), TK_ECLOSED);
    tk_tls_free(s);
    tk_tls_free(c);
    tk_tls_ctx_free(sc);
    tk_tls_ctx_free(cc);
}
END_TEST

START_TEST(test_partial_record_needs_more_and_input_is_bounded)
{
    struct tk_tls_ctx *sc = ctx(true, CA1, -1), *cc = ctx(false, -1, CA1);
    struct tk_tls *s = tk_tls_new(sc, NULL), *c = tk_tls_new(cc, "node-1");
    int hs;
    ck_assert_int_eq(handshake(s, c, &hs), 1);
    static char big[10000], got[10000];
    memset(big, 'x', sizeof(big));
    ck_assert_int_eq(tk_tls_write(c, big, sizeof(big)), 0);
    static char wire[20000];
    size_t n = tk_tls_out_take(c, wire, sizeof(wire));
    ck_assert_uint_gt(n, sizeof(big));
    /* Byte by byte: every call returns at once with 0 until the record is
     * whole. */
    size_t zeros = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        ck_assert_int_eq(tk_tls_feed(s, wire + i, 1), 0);
        ck_assert_int_eq(tk_tls_read(s, got, sizeof(got)), 0);
        zeros++;
    }
    ck_assert_int_eq(tk_tls_feed(s, wire + n - 1, 1), 0);
    ck_assert_int_eq(tk_tls_read(s, got, sizeof(got)), (int)sizeof(big));
    ck_assert(memcmp(got, big, sizeof(big)) == 0);
    printf("partial record: %zu calls returned 'need more' before it was whole\n", zeros);
    /* More undecrypted input than TK_TLS_IN_MAX is refused. */
    static char junk[TK_TLS_IN_MAX];
    ck_assert_int_eq(tk_tls_feed(s, junk, sizeof(junk)), 0);
    ck_assert_int_eq(tk_tls_feed(s, junk, 1), TK_EBUSY);
    ck_assert_int_lt(tk_tls_read(s, got, sizeof(got)), 0); /* garbage: a bad record */
    tk_tls_free(s);
    tk_tls_free(c);
    tk_tls_ctx_free(sc);
    tk_tls_ctx_free(cc);
}
END_TEST

/* A client of `client_ca` (and certificate `client_cert`) against a server
 * with `server_cert` (and `server_ca` for client certificates): the
 * handshake must fail, with `want` in the reason of `side`. */
static void refused(int server_cert, int server_ca, int client_cert, int client_ca,
                    bool client_side, const char *want)
{
    struct tk_tls_ctx *sc = ctx(true, server_cert, server_ca);
    struct tk_tls_ctx *cc = ctx(false, client_cert, client_ca);
    struct tk_tls *s = tk_tls_new(sc, NULL), *c = tk_tls_new(cc, NULL);
    int hs, hc = handshake(s, c, &hs);
    const char *why = tk_tls_error(client_side ? c : s);
    ck_assert_msg(hc < 0, "the client finished a handshake it must fail (%s)", want);
    ck_assert_msg(strstr(why, want) != NULL, "reason \"%s\" lacks \"%s\"", why, want);
    printf("refused: %s\n", why);
    char b[8];
    ck_assert_int_lt(tk_tls_write(c, "x", 1) == 0 ? tk_tls_read(s, b, 8) : -1, 1);
    tk_tls_free(s);
    tk_tls_free(c);
    tk_tls_ctx_free(sc);
    tk_tls_ctx_free(cc);
}

START_TEST(test_wrong_ca_expired_and_missing_client_cert)
{
    refused(CA1, -1, -1, CA2, true, "certificate verify failed");
    refused(OLD, -1, -1, OLD, true, "expired");
    refused(CA1, CA2, -1, CA1, false, "certificate");    /* none sent */
    refused(CA1, CA2, CA1, CA1, false, "verify failed"); /* another CA */
    refused(CA1, OLD, OLD, CA1, false, "expired");       /* expired one */
}
END_TEST

START_TEST(test_bad_files_are_refused_with_a_reason)
{
    struct tk_tls_ctx *x = NULL;
    char err[TK_TLS_ERR_MAX];
    struct tk_tls_ctx_config c = {.server = true, .cert_file = path[CA1]};
    ck_assert_int_eq(tk_tls_ctx_new(&c, &x, err, sizeof(err)), TK_EINVAL);
    c.key_file = path[CA2_KEY];
    ck_assert_int_eq(tk_tls_ctx_new(&c, &x, err, sizeof(err)), TK_EINVAL);
    ck_assert_msg(strstr(err, "mismatch") != NULL || strstr(err, "match") != NULL, "%s",
                  err);
    c.cert_file = "/nonexistent/cert.pem";
    ck_assert_int_eq(tk_tls_ctx_new(&c, &x, err, sizeof(err)), TK_EINVAL);
    ck_assert(strstr(err, "/nonexistent/cert.pem") != NULL);
    ck_assert_ptr_null(x);
}
END_TEST

/* Plaintext left in the session by a short read comes out of the next read
 * although nothing more was fed ("need more" only when nothing waits). */
START_TEST(test_short_reads_drain_what_the_session_holds)
{
    struct tk_tls_ctx *sc = ctx(true, CA1, -1), *cc = ctx(false, -1, CA1);
    struct tk_tls *s = tk_tls_new(sc, NULL), *c = tk_tls_new(cc, "node-1");
    int hs;
    ck_assert_int_eq(handshake(s, c, &hs), 1);
    ck_assert_int_eq(tk_tls_write(c, "abcdefghij", 10), 0);
    pump(c, s);
    char buf[16];
    size_t got = 0;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(tk_tls_read(s, buf + got, 2), 2);
        got += 2;
    }
    ck_assert(memcmp(buf, "abcdefghij", 10) == 0);
    ck_assert_int_eq(tk_tls_read(s, buf, sizeof(buf)), 0);
    tk_tls_free(s);
    tk_tls_free(c);
    tk_tls_ctx_free(sc);
    tk_tls_ctx_free(cc);
}
END_TEST

static int uv_wrote = 1;
static void on_uv_written(uv_write_t *req, int status)
{
    (void)req;
    uv_wrote = status;
}

/* tk_tls_uv_write on a real stream: small buffers go out as one record, a
 * large one in records of its own, and the peer reads the bytes in order. */
START_TEST(test_uv_write_gathers_small_buffers_into_one_record)
{
    struct tk_tls_ctx *sc = ctx(true, CA1, -1), *cc = ctx(false, -1, CA1);
    struct tk_tls *s = tk_tls_new(sc, NULL), *c = tk_tls_new(cc, "node-1");
    int hs;
    ck_assert_int_eq(handshake(s, c, &hs), 1);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    uv_loop_t loop;
    uv_pipe_t pipe;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(uv_pipe_init(&loop, &pipe, 0), 0);
    ck_assert_int_eq(uv_pipe_open(&pipe, sv[0]), 0);
    static char big[40000], want[40100];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    uv_buf_t bufs[4] = {uv_buf_init("head ", 5), uv_buf_init("body", 4),
                        uv_buf_init(big, sizeof(big)), uv_buf_init(" tail", 5)};
    size_t total = 0;
    for (int i = 0; i < 4; i++) {
        memcpy(want + total, bufs[i].base, bufs[i].len);
        total += bufs[i].len;
    }
    uv_write_t req;
    uv_wrote = 1;
    ck_assert_int_eq(
        tk_tls_uv_write(c, (uv_stream_t *)&pipe, bufs, 4, &req, on_uv_written), 0);
    while (uv_wrote == 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(uv_wrote, 0);
    /* The records on the wire: 5-byte headers, then their bodies. */
    static char wire[48000], plain[40100];
    size_t n = 0, records = 0, first_len = 0;
    ssize_t r;
    while (n < sizeof(wire) &&
           (r = recv(sv[1], wire + n, sizeof(wire) - n, MSG_DONTWAIT)) > 0)
        n += (size_t)r;
    for (size_t off = 0; off + 5 <= n; records++) {
        size_t len =
            (size_t)((unsigned char)wire[off + 3] << 8 | (unsigned char)wire[off + 4]);
        if (records == 0)
            first_len = len;
        off += 5 + len;
    }
    /* head+body in one record (9 bytes + 17 of overhead), the 40000 bytes
     * in three (16 KiB of plaintext at most each), the tail in one. */
    ck_assert_uint_eq(first_len, 9 + 17);
    ck_assert_uint_eq(records, 5);
    size_t got = 0;
    for (size_t off = 0; off < n; off += 4096) {
        ck_assert_int_eq(tk_tls_feed(s, wire + off, n - off < 4096 ? n - off : 4096), 0);
        while ((r = tk_tls_read(s, plain + got, sizeof(plain) - got)) > 0)
            got += (size_t)r;
        ck_assert_int_eq(r, 0);
    }
    ck_assert_uint_eq(got, total);
    ck_assert(memcmp(plain, want, total) == 0);
    printf("uv write: %zu bytes in 4 buffers went out as %zu records\n", total, records);
    uv_close((uv_handle_t *)&pipe, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    close(sv[1]);
    tk_tls_free(s);
    tk_tls_free(c);
    tk_tls_ctx_free(sc);
    tk_tls_ctx_free(cc);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("engine");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_handshake_echo_and_names);
    tcase_add_test(tc, test_partial_record_needs_more_and_input_is_bounded);
    tcase_add_test(tc, test_wrong_ca_expired_and_missing_client_cert);
    tcase_add_test(tc, test_bad_files_are_refused_with_a_reason);
    tcase_add_test(tc, test_short_reads_drain_what_the_session_holds);
    tcase_add_test(tc, test_uv_write_gathers_small_buffers_into_one_record);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
