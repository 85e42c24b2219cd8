/* tk_watch (include/tierkv.h): an in-process cluster's change log followed
 * through the embedding API, on the leader and on a follower, resumed from
 * where it stopped, and waiting for more until its timeout. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "include/tierkv.h"

struct seen {
    int n, stop_at;
    uint64_t rev[64];
    int type[64];
    char key[64][16];
};

static int on_event(const struct tk_event *ev, void *data)
{
    struct seen *s = data;
    ck_assert_int_lt(s->n, 64);
    s->rev[s->n] = ev->revision;
    s->type[s->n] = ev->type;
    snprintf(s->key[s->n], 16, "%.*s", (int)ev->key_len, (const char *)ev->key);
    s->n++;
    return s->n == s->stop_at;
}

static void put(struct tk_node *n, const char *k, struct tk_write_result *res)
{
    ck_assert_int_eq(tk_put(n, k, strlen(k), "v", 1, TK_MODE_APPLIED, res), 0);
}

START_TEST(test_watch_follows_the_log_on_leader_and_follower)
{
    struct tk_options o;
    tk_options_default(&o);
    o.kv_no_sync = true;
    struct tk_cluster *c = NULL;
    ck_assert_int_eq(tk_cluster_start(3, &o, &c), 0);
    struct tk_node *l = NULL;
    ck_assert_int_eq(tk_cluster_wait_leader(c, 10000, &l), 0);
    struct tk_write_result first;
    put(l, "w/a", &first);
    put(l, "other", NULL);
    put(l, "w/b", NULL);
    ck_assert_int_eq(tk_delete(l, "w/a", 3, TK_MODE_APPLIED, NULL), 0);
    /* From the first write: stop after 2 events, resume, get the rest. */
    struct seen s = {.stop_at = 2};
    uint64_t from = first.revision;
    ck_assert_int_eq(tk_watch(l, "w/", 2, &from, 5000, on_event, &s), 0);
    ck_assert_int_eq(s.n, 2);
    ck_assert_uint_eq(s.rev[0], first.revision);
    ck_assert_str_eq(s.key[1], "w/b");
    ck_assert_uint_eq(from, s.rev[1] + 1);
    s.stop_at = 3;
    ck_assert_int_eq(tk_watch(l, "w/", 2, &from, 5000, on_event, &s), 0);
    ck_assert_int_eq(s.n, 3);
    ck_assert_int_eq(s.type[2], TK_EVENT_DELETE);
    ck_assert_str_eq(s.key[2], "w/a");
    /* A follower passes the same history once it has applied it. */
    struct tk_node *f =
        tk_cluster_node(c, 0) != l ? tk_cluster_node(c, 0) : tk_cluster_node(c, 1);
    struct seen fs = {.stop_at = 3};
    uint64_t ffrom = first.revision;
    ck_assert_int_eq(tk_watch(f, "w/", 2, &ffrom, 5000, on_event, &fs), 0);
    ck_assert_int_eq(fs.n, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(fs.rev[i], s.rev[i]);
        ck_assert_str_eq(fs.key[i], s.key[i]);
    }
    /* Nothing new: it waits, then returns at its timeout, from unchanged. */
    struct seen none = {.stop_at = 1};
    uint64_t at = from;
    ck_assert_int_eq(tk_watch(l, "w/", 2, &at, 100, on_event, &none), 0);
    ck_assert_int_eq(none.n, 0);
    ck_assert_uint_ge(at, from);
    tk_cluster_stop(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node-watch");
    TCase *tc = tcase_create("watch");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_watch_follows_the_log_on_leader_and_follower);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
