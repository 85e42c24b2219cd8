/* tk_scan in bounded steps (node/tierkv.c, issue 19): a scan of more keys
 * than one step (1024) and over more deleted keys than one step may skip
 * (KV_SCAN_SKIP_MAX) gives every live key of the prefix once, in order; a
 * limit and a callback that stops end it exactly there; an empty prefix and
 * a prefix of 0xff bytes (no end key) are walked to the end. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "include/tierkv.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"

#define N_KEYS 20000
#define DEL_FROM 1000
#define DEL_TO 18000 /* 17000 deleted: more than one step's skip budget */

struct seen {
    int n, stop_at;
    int reserved; /* the node's own records (first byte 0x01: membership) */
    char last[64];
    size_t last_len;
};

static int walk(const struct tk_item *it, void *data)
{
    struct seen *s = data;
    ck_assert_uint_lt(it->key_len, sizeof(s->last));
    if (s->n > 0) { /* strictly ascending */
        size_t m = it->key_len < s->last_len ? it->key_len : s->last_len;
        int c = memcmp(s->last, it->key, m);
        ck_assert(c < 0 || (c == 0 && s->last_len < it->key_len));
    }
    memcpy(s->last, it->key, it->key_len);
    s->last_len = it->key_len;
    s->n++;
    s->reserved += it->key_len > 0 && it->key[0] == 0x01;
    return s->stop_at != 0 && s->n == s->stop_at;
}

static void batch(struct tk_node *n, int from, int to, bool del)
{
    struct tk_op ops[128];
    char keys[128][16];
    for (int i = from; i < to;) {
        size_t k = 0;
        for (; k < 128 && i < to; k++, i++) {
            snprintf(keys[k], sizeof(keys[k]), "s/%05d", i);
            ops[k] = (struct tk_op){.key = keys[k],
                                    .key_len = strlen(keys[k]),
                                    .value = del ? NULL : "v",
                                    .value_len = del ? 0 : 1};
        }
        struct tk_write_result r;
        ck_assert_int_eq(tk_batch(n, ops, k, TK_MODE_APPLIED, &r), 0);
    }
}

START_TEST(test_scan_in_steps)
{
    struct tk_node *n = nf_single_start();
    batch(n, 0, N_KEYS, false);
    batch(n, DEL_FROM, DEL_TO, true);
    nf_put(n, "r", "v", TK_MODE_APPLIED, NULL);
    nf_put(n, "s0", "v", TK_MODE_APPLIED, NULL); /* the prefix's end key: not in "s/" */
    nf_put(n, "\xff\xff", "v", TK_MODE_APPLIED, NULL);
    int live = N_KEYS - (DEL_TO - DEL_FROM);

    struct seen s = {0};
    ck_assert_int_eq(tk_scan(n, "s/", 2, 0, TK_READ_LINEARIZABLE, walk, &s), 0);
    ck_assert_int_eq(s.n, live);
    ck_assert_mem_eq(s.last, "s/19999", 7);
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(tk_scan(n, "s/", 2, 0, TK_READ_STALE, walk, &s), 0);
    ck_assert_int_eq(s.n, live);
    memset(&s, 0, sizeof(s)); /* a limit across the deleted run */
    ck_assert_int_eq(tk_scan(n, "s/", 2, 1500, TK_READ_LINEARIZABLE, walk, &s), 0);
    ck_assert_int_eq(s.n, 1500);
    ck_assert_mem_eq(s.last, "s/18499", 7);
    memset(&s, 0, sizeof(s)); /* the callback stops it, mid-step */
    s.stop_at = 1100;
    ck_assert_int_eq(tk_scan(n, "s/", 2, 0, TK_READ_LINEARIZABLE, walk, &s), 0);
    ck_assert_int_eq(s.n, 1100);
    memset(&s, 0, sizeof(s)); /* everything: r, the prefix's keys, s0, 0xff 0xff */
    ck_assert_int_eq(tk_scan(n, "", 0, 0, TK_READ_LINEARIZABLE, walk, &s), 0);
    ck_assert_int_eq(s.n - s.reserved, live + 3);
    ck_assert_mem_eq(s.last, "\xff\xff", 2);
    memset(&s, 0, sizeof(s)); /* a prefix with no end key */
    ck_assert_int_eq(tk_scan(n, "\xff", 1, 0, TK_READ_LINEARIZABLE, walk, &s), 0);
    ck_assert_int_eq(s.n, 1);
    ck_assert_int_eq(tk_scan(n, "s/", 2, 0, TK_READ_LINEARIZABLE, NULL, NULL), TK_EINVAL);
    tk_node_stop(n);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("node_scan");
    TCase *tc = tcase_create("scan");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_scan_in_steps);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
