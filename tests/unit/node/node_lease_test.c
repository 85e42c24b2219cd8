/* tk_lease_* (include/tierkv.h): leases through the embedding API on an
 * in-process cluster: grant, attach, keepalive, revoke, and expiry by the
 * leader once the TTL runs out, whichever node is asked. */
#include <check.h>
#include <time.h>

#include "base/clock.h"
#include "include/tierkv.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"

START_TEST(test_lease_grant_attach_revoke_and_expire)
{
    struct tk_cluster *c = nf_cluster_start(3, NULL);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_node *f = nf_cluster_other(c, l);
    uint64_t id = 0, deleted = 0;
    ck_assert_int_eq(tk_lease_grant(l, 60000, &id), 0);
    ck_assert_uint_gt(id, 0);
    ck_assert_int_eq(tk_lease_grant(l, 0, &id), TK_EINVAL);
    struct tk_write_result res;
    ck_assert_int_eq(tk_put_lease(f, "l/a", 3, "v", 1, id, &res), 0);
    ck_assert_int_eq(tk_put_lease(l, "l/b", 3, "v", 1, id, &res), 0);
    ck_assert_int_eq(tk_put_lease(l, "l/c", 3, "v", 1, id + 999, &res), TK_ENOTFOUND);
    ck_assert_int_eq(tk_lease_keepalive(f, id), 0);
    ck_assert_int_eq(tk_lease_revoke(l, id, &deleted), 0);
    ck_assert_uint_eq(deleted, 2);
    struct tk_value v;
    ck_assert_int_eq(tk_get(l, "l/a", 3, TK_READ_LINEARIZABLE, &v), TK_ENOTFOUND);
    ck_assert_int_eq(tk_lease_keepalive(l, id), TK_ENOTFOUND);
    ck_assert_int_eq(tk_lease_revoke(l, id, NULL), TK_ENOTFOUND);

    /* A lease of 300 ms: the leader revokes it, its key goes. */
    uint64_t t0 = tk_mono_ms();
    ck_assert_int_eq(tk_lease_grant(l, 300, &id), 0);
    ck_assert_int_eq(tk_put_lease(l, "l/x", 3, "v", 1, id, &res), 0);
    int rc = 0;
    while ((rc = tk_get(l, "l/x", 3, TK_READ_LINEARIZABLE, &v)) == 0) {
        tk_value_free(&v);
        ck_assert_uint_lt(tk_mono_ms() - t0, 10000);
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    uint64_t took = tk_mono_ms() - t0;
    ck_assert_int_eq(rc, TK_ENOTFOUND);
    ck_assert_uint_ge(took, 300);
    ck_assert_int_eq(tk_lease_keepalive(f, id), TK_ENOTFOUND);
    tk_cluster_stop(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node-lease");
    TCase *tc = tcase_create("lease");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_lease_grant_attach_revoke_and_expire);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
