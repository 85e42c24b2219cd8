/* A consumer's own Check test against an installed tierkv: the fixture
 * pattern of docs/embedding.md. `setup` starts a three-node in-process
 * cluster and waits for its leader; `teardown` stops it; each test gets a
 * fresh cluster. tests/consumer/run.sh builds it with nothing but
 * `pkg-config --cflags --libs tierkv check` and runs it. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <tierkv.h>

static struct tk_cluster *cluster;
static struct tk_node *leader;

/* A loaded machine may change leaders between two calls: these outcomes mean
 * "try again through the current leader". */
static int transient(int rc)
{
    return rc == TK_ENOLEADER || rc == TK_ENOTLEADER || rc == TK_ELOST ||
           rc == TK_ETIMEDOUT || rc == TK_EBUSY;
}

/* tk_get through the current leader, retried while transient (at most 20
 * leader waits of up to 20 s each: bounded). */
static int get_retry(const char *key, struct tk_value *v)
{
    int rc = TK_ENOLEADER;
    for (int i = 0; i < 20 && transient(rc); i++) {
        ck_assert_int_eq(tk_cluster_wait_leader(cluster, 20000, &leader), 0);
        rc = tk_get(leader, key, strlen(key), TK_READ_LINEARIZABLE, v);
    }
    return rc;
}

static void setup(void)
{
    struct tk_options o;
    tk_options_default(&o);
    o.kv_no_sync = true;        /* throwaway data: no fsync */
    o.kv_map_bytes = 64u << 20; /* a small sparse map per node */
    o.election_ticks = 100;     /* 1 s: fewer spurious elections under load */
    ck_assert_int_eq(tk_cluster_start(3, &o, &cluster), 0);
    ck_assert_int_eq(tk_cluster_wait_leader(cluster, 20000, &leader), 0);
}

static void teardown(void)
{
    tk_cluster_stop(cluster);
    cluster = NULL;
}

START_TEST(test_put_on_follower_get_on_leader)
{
    struct tk_node *follower = tk_cluster_node(cluster, 0);
    if (follower == leader)
        follower = tk_cluster_node(cluster, 1);
    int rc = TK_ENOLEADER;
    for (int i = 0; i < 20 && transient(rc); i++) { /* a put may be retried */
        ck_assert_int_eq(tk_cluster_wait_leader(cluster, 20000, &leader), 0);
        rc = tk_put(follower, "k", 1, "v1", 2, TK_MODE_APPLIED, NULL);
    }
    ck_assert_int_eq(rc, 0);
    struct tk_value v;
    ck_assert_int_eq(get_retry("k", &v), 0);
    ck_assert_uint_eq(v.len, 2);
    ck_assert(memcmp(v.value, "v1", 2) == 0);
    tk_value_free(&v);
}
END_TEST

START_TEST(test_missing_key_is_not_found)
{
    struct tk_value v;
    ck_assert_int_eq(get_retry("nope", &v), TK_ENOTFOUND);
    ck_assert_str_eq(tk_strerror(TK_ENOTFOUND), "not found");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("consumer");
    TCase *tc = tcase_create("cluster");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_put_on_follower_get_on_leader);
    tcase_add_test(tc, test_missing_key_is_not_found);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
