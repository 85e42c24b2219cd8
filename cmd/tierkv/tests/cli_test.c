/* Unit tests of the tierkv CLI's own parsing: endpoints and leader hints,
 * durations, sizes, the read/write mix, key distributions, URL and base64
 * coding, exit codes, the HTTP response parser, and the bench's request
 * builder (whose output is parsed back with http-parser), and the command
 * table against the usage text derived from it. */
#include <check.h>
#include <http_parser.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/prng.h"
#include "cmd/tierkv/bench_cpu.h"
#include "cmd/tierkv/cli.h"
#include "tests/check_run.h"

START_TEST(test_endpoints_parse_list_with_spaces_scheme_and_ipv6)
{
    struct cli_endpoint eps[4];
    size_t n;
    ck_assert_int_eq(
        cli_parse_endpoints("127.0.0.1:8001, http://node2:8002/ ,[::1]:8003", eps, 4, &n),
        0);
    ck_assert_uint_eq(n, 3);
    ck_assert_str_eq(eps[0].host, "127.0.0.1");
    ck_assert_str_eq(eps[0].port, "8001");
    ck_assert_str_eq(eps[1].host, "node2");
    ck_assert_str_eq(eps[1].port, "8002");
    ck_assert_str_eq(eps[2].host, "::1");
    ck_assert_str_eq(eps[2].port, "8003");
}
END_TEST

START_TEST(test_endpoints_reject_bad_items)
{
    struct cli_endpoint eps[2];
    size_t n;
    const char *bad[] = {"",        "host",        "host:",    ":80",   "h:0",
                         "h:65536", "h:8a",        "a:1,,b:2", "a:1,",  "::1:80",
                         "[::1]80", "a:1,b:2,c:3", "h:123456", "a b:1", NULL};
    for (const char **b = bad; *b; b++)
        ck_assert_msg(cli_parse_endpoints(*b, eps, 2, &n) == TK_EINVAL, "accepted \"%s\"",
                      *b);
}
END_TEST

START_TEST(test_leader_hint_forms)
{
    struct cli_endpoint ep;
    ck_assert_int_eq(cli_parse_leader_hint("127.0.0.1:8002", &ep), 0);
    ck_assert_str_eq(ep.port, "8002");
    ck_assert_int_eq(cli_parse_leader_hint("http://10.0.0.2:80", &ep), 0);
    ck_assert_str_eq(ep.host, "10.0.0.2");
    ck_assert_int_eq(cli_parse_leader_hint("2@127.0.0.1:9002", &ep), 0);
    ck_assert_str_eq(ep.port, "9002");
    ck_assert_int_eq(cli_parse_leader_hint("3=h3:7003", &ep), 0);
    ck_assert_str_eq(ep.host, "h3");
    ck_assert_int_eq(cli_parse_leader_hint("id=2,http=127.0.0.1:8102,raft=x:1", &ep), 0);
    ck_assert_str_eq(ep.port, "8102");
    ck_assert_int_eq(cli_parse_leader_hint(" 2 ", &ep), TK_ENOTFOUND);
    ck_assert_int_eq(cli_parse_leader_hint("", &ep), TK_ENOTFOUND);
    ck_assert_int_eq(cli_parse_leader_hint("nonsense", &ep), TK_EINVAL);
}
END_TEST

START_TEST(test_durations)
{
    uint64_t ms;
    ck_assert_int_eq(cli_parse_duration_ms("10", &ms), 0);
    ck_assert_uint_eq(ms, 10000);
    ck_assert_int_eq(cli_parse_duration_ms("250ms", &ms), 0);
    ck_assert_uint_eq(ms, 250);
    ck_assert_int_eq(cli_parse_duration_ms("1.5s", &ms), 0);
    ck_assert_uint_eq(ms, 1500);
    ck_assert_int_eq(cli_parse_duration_ms("2m", &ms), 0);
    ck_assert_uint_eq(ms, 120000);
    const char *bad[] = {"", "s", "-1s", "10x", "0", "0.1ms", "1e400", "10 s", NULL};
    for (const char **b = bad; *b; b++)
        ck_assert_msg(cli_parse_duration_ms(*b, &ms) == TK_EINVAL, "accepted \"%s\"", *b);
}
END_TEST

START_TEST(test_sizes_and_integers)
{
    uint64_t v;
    ck_assert_int_eq(cli_parse_size("64", &v), 0);
    ck_assert_uint_eq(v, 64);
    ck_assert_int_eq(cli_parse_size("4k", &v), 0);
    ck_assert_uint_eq(v, 4096);
    ck_assert_int_eq(cli_parse_size("1MiB", &v), 0);
    ck_assert_uint_eq(v, 1048576);
    ck_assert_int_eq(cli_parse_size("1.5k", &v), 0);
    ck_assert_uint_eq(v, 1536);
    ck_assert_int_eq(cli_parse_size("1.3", &v), TK_EINVAL);
    ck_assert_int_eq(cli_parse_size("12q", &v), TK_EINVAL);
    ck_assert_int_eq(cli_parse_u64("17", 1, 20, &v), 0);
    ck_assert_uint_eq(v, 17);
    ck_assert_int_eq(cli_parse_u64("21", 1, 20, &v), TK_EINVAL);
    ck_assert_int_eq(cli_parse_u64("-1", 0, 20, &v), TK_EINVAL);
    ck_assert_int_eq(cli_parse_u64("1x", 0, 20, &v), TK_EINVAL);
    ck_assert_int_eq(cli_parse_u64("99999999999999999999999", 0, UINT64_MAX, &v),
                     TK_EINVAL);
    int64_t i;
    ck_assert_int_eq(cli_parse_i64("-42", &i), 0);
    ck_assert_int_eq(i, -42);
    ck_assert_int_eq(cli_parse_i64("4 2", &i), TK_EINVAL);
    ck_assert_int_eq(cli_parse_i64("", &i), TK_EINVAL);
}
END_TEST

START_TEST(test_mix)
{
    double r;
    ck_assert_int_eq(cli_parse_mix("90:10", &r), 0);
    ck_assert_double_eq_tol(r, 0.9, 1e-9);
    ck_assert_int_eq(cli_parse_mix("1:1", &r), 0);
    ck_assert_double_eq_tol(r, 0.5, 1e-9);
    ck_assert_int_eq(cli_parse_mix("read", &r), 0);
    ck_assert_double_eq_tol(r, 1, 1e-9);
    ck_assert_int_eq(cli_parse_mix("put", &r), 0);
    ck_assert_double_eq_tol(r, 0, 1e-9);
    ck_assert_int_eq(cli_parse_mix("0:0", &r), TK_EINVAL);
    ck_assert_int_eq(cli_parse_mix("90", &r), TK_EINVAL);
    ck_assert_int_eq(cli_parse_mix("a:b", &r), TK_EINVAL);
    ck_assert_int_eq(cli_parse_mix("1:-1", &r), TK_EINVAL);
}
END_TEST

START_TEST(test_dist)
{
    enum cli_dist d;
    double t = 0;
    ck_assert_int_eq(cli_parse_dist("uniform", &d, &t), 0);
    ck_assert_int_eq(d, CLI_DIST_UNIFORM);
    ck_assert_int_eq(cli_parse_dist("zipf", &d, &t), 0);
    ck_assert_int_eq(d, CLI_DIST_ZIPF);
    ck_assert_double_eq_tol(t, 0.99, 1e-9);
    ck_assert_int_eq(cli_parse_dist("zipf:0.5", &d, &t), 0);
    ck_assert_double_eq_tol(t, 0.5, 1e-9);
    ck_assert_int_eq(cli_parse_dist("zipf:1.0", &d, &t), TK_EINVAL);
    ck_assert_int_eq(cli_parse_dist("zipf:", &d, &t), TK_EINVAL);
    ck_assert_int_eq(cli_parse_dist("normal", &d, &t), TK_EINVAL);
}
END_TEST

/* Zipf(0.99) over 1000 keys: rank 0 takes roughly 1/zeta(1000) ~ 13 % of the
 * draws (uniform would give 0.1 %), every draw is in range, and the top 10
 * ranks together take far more than the bottom 500. */
START_TEST(test_zipf_is_skewed_and_in_range)
{
    struct cli_zipf z;
    ck_assert_int_eq(cli_zipf_init(&z, 1000, 0.99), 0);
    struct tk_prng p;
    tk_prng_seed(&p, 7);
    static unsigned counts[1000];
    memset(counts, 0, sizeof(counts));
    const unsigned n = 50000;
    for (unsigned i = 0; i < n; i++) {
        uint64_t r = cli_zipf_next(&z, &p);
        ck_assert_uint_lt(r, 1000);
        counts[r]++;
    }
    double f0 = (double)counts[0] / n;
    ck_assert_msg(f0 > 0.10 && f0 < 0.17, "rank 0 fraction %f", f0);
    unsigned top = 0, bottom = 0;
    for (int i = 0; i < 10; i++)
        top += counts[i];
    for (int i = 500; i < 1000; i++)
        bottom += counts[i];
    ck_assert_uint_gt(top, 2 * bottom);
    ck_assert_int_eq(cli_zipf_init(&z, 0, 0.99), TK_EINVAL);
    ck_assert_int_eq(cli_zipf_init(&z, 10, 1.0), TK_EINVAL);
}
END_TEST

START_TEST(test_url_encode)
{
    char out[64];
    ck_assert_uint_eq(cli_url_encode("a/b c~%", 7, out, sizeof(out)), 13);
    ck_assert_str_eq(out, "a%2Fb%20c~%25");
    ck_assert_uint_eq(cli_url_encode("\xff\x00", 2, out, sizeof(out)), 6);
    ck_assert_str_eq(out, "%FF%00");
    /* Truncation reports the needed length and still terminates. */
    ck_assert_uint_eq(cli_url_encode("abcdef", 6, out, 4), 6);
    ck_assert_uint_eq(strlen(out), 3);
}
END_TEST

START_TEST(test_base64_round_trip_and_rejects)
{
    const char *cases[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar", NULL};
    const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; cases[i]; i++) {
        char enc[32];
        unsigned char dec[32];
        size_t n = tk_base64_encode(cases[i], strlen(cases[i]), enc);
        ck_assert_uint_eq(n, tk_base64_encoded_len(strlen(cases[i])));
        ck_assert_str_eq(enc, want[i]);
        long m = tk_base64_decode(enc, n, dec, sizeof(dec));
        ck_assert_int_eq(m, (long)strlen(cases[i]));
        ck_assert_int_eq(memcmp(dec, cases[i], (size_t)m), 0);
    }
    unsigned char dec[8];
    ck_assert_int_eq(tk_base64_decode("Zm9", 3, dec, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm=v", 4, dec, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Z===", 4, dec, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zg==Zg==", 8, dec, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm9!", 4, dec, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm9vYmFy", 8, dec, 4), TK_ETOOBIG);
}
END_TEST

START_TEST(test_exit_codes)
{
    ck_assert_int_eq(cli_exit_for_status(200), CLI_EXIT_OK);
    ck_assert_int_eq(cli_exit_for_status(204), CLI_EXIT_OK);
    ck_assert_int_eq(cli_exit_for_status(404), CLI_EXIT_NOTFOUND);
    ck_assert_int_eq(cli_exit_for_status(409), CLI_EXIT_COMPARE);
    ck_assert_int_eq(cli_exit_for_status(503), CLI_EXIT_UNAVAILABLE);
    ck_assert_int_eq(cli_exit_for_status(504), CLI_EXIT_TIMEOUT);
    ck_assert_int_eq(cli_exit_for_status(400), CLI_EXIT_REJECTED);
    ck_assert_int_eq(cli_exit_for_status(413), CLI_EXIT_REJECTED);
    ck_assert_int_eq(cli_exit_for_status(500), CLI_EXIT_ERROR);
    ck_assert_int_eq(cli_exit_for_status(302), CLI_EXIT_ERROR);
}
END_TEST

/* Feeds `text` in pieces of `step` bytes. */
static int feed_pieces(const char *text, size_t step, struct cli_response *r)
{
    struct cli_resp_parser *p = cli_resp_parser_new(r);
    size_t len = strlen(text);
    int rc = 0;
    for (size_t off = 0; off < len && rc == 0; off += step)
        rc = cli_resp_parser_feed(p, text + off, len - off < step ? len - off : step);
    if (rc == 0)
        rc = cli_resp_parser_feed(p, "", 0);
    cli_resp_parser_free(p);
    return rc;
}

START_TEST(test_response_parser_headers_and_chunked_body)
{
    const char *text = "HTTP/1.1 503 Service Unavailable\r\n"
                       "x-tierkv-leader: 2@127.0.0.1:8002\r\n"
                       "X-Tierkv-Leader-Addr: 127.0.0.1:8012\r\n"
                       "X-Tierkv-Revision: 42\r\nRetry-After: 1\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"
                       "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    for (size_t step = 1; step <= 7; step += 3) {
        struct cli_response r;
        ck_assert_int_eq(feed_pieces(text, step, &r), 1);
        ck_assert_int_eq(r.status, 503);
        ck_assert_str_eq(r.leader, "2@127.0.0.1:8002");
        ck_assert_str_eq(r.leader_addr, "127.0.0.1:8012");
        ck_assert_str_eq(r.revision, "42");
        ck_assert_str_eq(r.retry_after, "1");
        ck_assert_str_eq(r.body, "hello world");
        cli_response_free(&r);
    }
}
END_TEST

START_TEST(test_response_parser_rejects_garbage_and_truncation)
{
    struct cli_response r;
    ck_assert_int_eq(feed_pieces("SMTP ready\r\n\r\n", 100, &r), TK_EPROTO);
    cli_response_free(&r);
    ck_assert_int_eq(
        feed_pieces("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 100, &r),
        TK_EPROTO);
    cli_response_free(&r);
    /* A body delimited by the close is complete at EOF. */
    ck_assert_int_eq(
        feed_pieces("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", 100, &r), 1);
    ck_assert_str_eq(r.body, "abc");
    cli_response_free(&r);
}
END_TEST

/* The bench's requests, parsed back as a server would. */
struct parsed_req {
    unsigned method;
    char url[512];
    char body[512];
    size_t body_len;
    bool complete;
};

static int pr_url(http_parser *hp, const char *at, size_t len)
{
    struct parsed_req *p = hp->data;
    strncat(p->url, at, len);
    return 0;
}

static int pr_body(http_parser *hp, const char *at, size_t len)
{
    struct parsed_req *p = hp->data;
    memcpy(p->body + p->body_len, at, len);
    p->body_len += len;
    return 0;
}

static int pr_done(http_parser *hp)
{
    struct parsed_req *p = hp->data;
    p->complete = true;
    p->method = hp->method;
    return 0;
}

static void build_and_parse(enum cli_protocol proto, bool is_read, const char *query,
                            struct parsed_req *out)
{
    static const char value[] = "0123456789abcdef";
    char b64[64];
    struct bench_payload pl = {value, b64, 16, tk_base64_encode(value, 16, b64)};
    char hdr[1024];
    struct bench_iov tail[2];
    size_t n_tail;
    long n = cli_bench_build(proto, is_read, "127.0.0.1:80", "k/1 x", 5, query, &pl, hdr,
                             sizeof(hdr), tail, &n_tail);
    ck_assert_int_gt(n, 0);
    char all[2048];
    size_t len = (size_t)n;
    memcpy(all, hdr, len);
    for (size_t i = 0; i < n_tail; i++) {
        memcpy(all + len, tail[i].base, tail[i].len);
        len += tail[i].len;
    }
    http_parser hp;
    http_parser_init(&hp, HTTP_REQUEST);
    memset(out, 0, sizeof(*out));
    hp.data = out;
    http_parser_settings s;
    http_parser_settings_init(&s);
    s.on_url = pr_url;
    s.on_body = pr_body;
    s.on_message_complete = pr_done;
    size_t used = http_parser_execute(&hp, &s, all, len);
    ck_assert_uint_eq(used, len);
    ck_assert(out->complete);
    /* The small head buffer is refused, not overrun. */
    char tiny[16];
    ck_assert_int_eq(cli_bench_build(proto, is_read, "127.0.0.1:80", "k", 1, query, &pl,
                                     tiny, sizeof(tiny), tail, &n_tail),
                     TK_ETOOBIG);
}

START_TEST(test_bench_requests_are_valid_http)
{
    struct parsed_req p;
    build_and_parse(CLI_PROTO_TIERKV, false, "?mode=committed", &p);
    ck_assert_uint_eq(p.method, HTTP_PUT);
    ck_assert_str_eq(p.url, "/v1/kv/k%2F1%20x?mode=committed");
    ck_assert_uint_eq(p.body_len, 16);
    ck_assert_int_eq(memcmp(p.body, "0123456789abcdef", 16), 0);

    build_and_parse(CLI_PROTO_TIERKV, true, "", &p);
    ck_assert_uint_eq(p.method, HTTP_GET);
    ck_assert_str_eq(p.url, "/v1/kv/k%2F1%20x");
    ck_assert_uint_eq(p.body_len, 0);

    build_and_parse(CLI_PROTO_ETCD, false, "", &p);
    ck_assert_uint_eq(p.method, HTTP_POST);
    ck_assert_str_eq(p.url, "/v3/kv/put");
    p.body[p.body_len] = '\0';
    ck_assert_str_eq(p.body,
                     "{\"key\":\"ay8xIHg=\",\"value\":\"MDEyMzQ1Njc4OWFiY2RlZg==\"}");

    build_and_parse(CLI_PROTO_ETCD, true, "serializable", &p);
    ck_assert_str_eq(p.url, "/v3/kv/range");
    p.body[p.body_len] = '\0';
    ck_assert_str_eq(p.body, "{\"key\":\"ay8xIHg=\",\"serializable\":true}");
}
END_TEST

START_TEST(test_bench_cpu_reads_utime_plus_stime)
{
    uint64_t t = 0;
    /* A comm with a space and a ')' of its own: fields count from the last. */
    ck_assert_int_eq(bench_cpu_parse_stat("42 (tk) x) S 1 42 42 0 -1 4194560 100 0 0 0 "
                                          "250 37 0 0 20 0 5 0 100 0 0\n",
                                          &t),
                     0);
    ck_assert_uint_eq(t, 287);
    /* Truncated before stime, and no comm at all: malformed. */
    ck_assert_int_eq(
        bench_cpu_parse_stat("42 (tk) S 1 42 42 0 -1 4194560 100 0 0 0 250", &t), -1);
    ck_assert_int_eq(bench_cpu_parse_stat("42 tk S 1 2 3", &t), -1);
    /* This process has spent some CPU; a pid that cannot exist reads -1. */
    ck_assert_int_ge(bench_cpu_us(0), 0);
    ck_assert_int_eq(bench_cpu_us(0x7ffffffe), -1);
    int pids[BENCH_CPU_PIDS_MAX];
    ck_assert_int_eq(bench_cpu_parse_pids("12,34,5", pids), 3);
    ck_assert_int_eq(pids[2], 5);
    ck_assert_int_eq(bench_cpu_parse_pids("12,,3", pids), -1);
    ck_assert_int_eq(bench_cpu_parse_pids("0", pids), -1);
    ck_assert_int_eq(bench_cpu_parse_pids("1,2,3,4,5,6,7,8,9", pids), -1);
}
END_TEST

/* Every row of the command table is listed by the usage, one line per usage
 * line, and found by its name and alias; only `help` runs without endpoints. */
START_TEST(test_usage_lists_every_command_of_the_table)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    cli_usage(f);
    ck_assert_int_eq(fclose(f), 0);
    const struct cli_command *rows;
    size_t n = cli_commands(&rows);
    ck_assert_uint_ge(n, 17);
    for (size_t i = 0; i < n; i++) {
        const struct cli_command *c = &rows[i];
        ck_assert_ptr_eq(cli_command_find(c->name), c);
        if (c->alias != NULL)
            ck_assert_ptr_eq(cli_command_find(c->alias), c);
        ck_assert(c->run != NULL);
        ck_assert_ptr_nonnull(c->usage[0].help);
        ck_assert_int_eq((c->flags & CLI_CMD_ENDPOINTS) == 0,
                         strcmp(c->name, "help") == 0);
        for (size_t k = 0; k < CLI_USAGE_LINES_MAX && c->usage[k].help != NULL; k++) {
            char want[256];
            snprintf(want, sizeof(want), "\n  %s%s%s ", c->name,
                     c->usage[k].args[0] ? " " : "", c->usage[k].args);
            const char *at = strstr(text, want);
            ck_assert_msg(at != NULL, "usage lacks \"%s\"", want + 1);
            const char *eol = strchr(at + 1, '\n');
            const char *help = strstr(at, c->usage[k].help);
            ck_assert_msg(help != NULL && help < eol, "%s: help not on its line",
                          c->name);
        }
    }
    ck_assert_ptr_eq(cli_command_find("delete"), cli_command_find("del"));
    ck_assert_ptr_null(cli_command_find("frobnicate"));
    ck_assert_ptr_null(cli_command_find(""));
    ck_assert_ptr_nonnull(strstr(text, "\nExit codes:\n"));
    free(text);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("tierkv_cli");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_endpoints_parse_list_with_spaces_scheme_and_ipv6);
    tcase_add_test(tc, test_endpoints_reject_bad_items);
    tcase_add_test(tc, test_leader_hint_forms);
    tcase_add_test(tc, test_durations);
    tcase_add_test(tc, test_sizes_and_integers);
    tcase_add_test(tc, test_mix);
    tcase_add_test(tc, test_dist);
    tcase_add_test(tc, test_zipf_is_skewed_and_in_range);
    tcase_add_test(tc, test_url_encode);
    tcase_add_test(tc, test_base64_round_trip_and_rejects);
    tcase_add_test(tc, test_exit_codes);
    tcase_add_test(tc, test_response_parser_headers_and_chunked_body);
    tcase_add_test(tc, test_response_parser_rejects_garbage_and_truncation);
    tcase_add_test(tc, test_bench_requests_are_valid_http);
    tcase_add_test(tc, test_bench_cpu_reads_utime_plus_stime);
    tcase_add_test(tc, test_usage_lists_every_command_of_the_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(cli_suite()));
}
