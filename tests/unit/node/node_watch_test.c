/* tk_watch (include/tierkv.h): an in-process cluster's change log followed
 * through the embedding API, on the leader and on a follower, resumed from
 * where it stopped, and waiting for more until its timeout. */
#include <check.h>
#include <stdio.h>

#include "include/tierkv.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"

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

START_TEST(test_watch_follows_the_log_on_leader_and_follower)
{
    struct tk_cluster *c = nf_cluster_start(3, NULL);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_write_result first;
    nf_put(l, "w/a", "v", TK_MODE_APPLIED, &first);
    nf_put(l, "other", "v", TK_MODE_APPLIED, NULL);
    nf_put(l, "w/b", "v", TK_MODE_APPLIED, NULL);
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
    struct tk_node *f = nf_cluster_other(c, l);
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
    return tk_check_run(srunner_create(s));
}
