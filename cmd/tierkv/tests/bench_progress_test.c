/* bench_progress.c: the live histogram's buckets and p99, the line's format. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/tierkv/bench_progress.h"

START_TEST(test_buckets_cover_and_order)
{
    /* Every value lies in its bucket, buckets are ordered, and a bucket's
     * width is at most 1/8 of its values. */
    uint64_t vals[] = {0,   1,   7,    8,      9,       15,        16,           17,
                       100, 999, 1000, 123456, 1000000, 987654321, 5000000000ull};
    size_t prev = 0;
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        size_t b = bench_live_bucket(vals[i]);
        ck_assert_uint_ge(b, prev);
        prev = b;
        ck_assert_uint_le(vals[i], bench_live_bucket_max(b));
        if (b > 0)
            ck_assert_uint_gt(vals[i], bench_live_bucket_max(b - 1));
        ck_assert_uint_le(bench_live_bucket_max(b) - vals[i], vals[i] / 8);
    }
    ck_assert_uint_eq(bench_live_bucket(UINT64_MAX), BENCH_LIVE_BUCKETS - 1);
}
END_TEST

START_TEST(test_p99_of_the_last_interval)
{
    struct bench_live *l = calloc(2, sizeof(*l));
    struct bench_live_view v;
    memset(&v, 0, sizeof(v));
    ck_assert_uint_eq(bench_live_p99(l, 2, sizeof(*l), &v), 0);
    /* 990 fast (100 us) and 10 slow (50 ms), split over two workers. */
    for (int i = 0; i < 990; i++)
        bench_live_note(&l[i % 2], 100000);
    for (int i = 0; i < 10; i++)
        bench_live_note(&l[1], 50000000);
    uint64_t p99 = bench_live_p99(l, 2, sizeof(*l), &v);
    ck_assert_uint_ge(p99, 100000);
    ck_assert_uint_le(p99, 112500);
    /* The next interval sees only what came after: 100 slow ones. */
    for (int i = 0; i < 100; i++)
        bench_live_note(&l[0], 50000000);
    p99 = bench_live_p99(l, 2, sizeof(*l), &v);
    ck_assert_uint_ge(p99, 50000000);
    ck_assert_uint_le(p99, 56250000);
    ck_assert_uint_eq(bench_live_p99(l, 2, sizeof(*l), &v), 0);
    free(l);
}
END_TEST

START_TEST(test_format)
{
    char buf[256];
    bench_progress_format(buf, sizeof(buf), "measure", 1.5, 10, 12345.6, 2500000, 20000,
                          3);
    ck_assert_ptr_nonnull(strstr(buf, "[measure   1.5s/10s]"));
    ck_assert_ptr_nonnull(strstr(buf, "12346 ops/s"));
    ck_assert_ptr_nonnull(strstr(buf, "p99    2.500 ms"));
    ck_assert_ptr_nonnull(strstr(buf, "3 errors"));
    ck_assert(strncmp(buf, "\r\033[K", 4) == 0);
    bench_progress_format(buf, sizeof(buf), "warm-up", 0, 10, 0, 0, 0, 0);
    ck_assert_ptr_nonnull(strstr(buf, "p99        - ms"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bench_progress");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_buckets_cover_and_order);
    tcase_add_test(tc, test_p99_of_the_last_interval);
    tcase_add_test(tc, test_format);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
