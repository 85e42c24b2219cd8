/* Bounded work over long ranges (issue 19): a delete range with a key limit
 * says `more` and leaves the rest; a bounded scan stops after its skip budget
 * of records that give no item (tombstones hiding hot or cold keys) and says
 * where, and scans resumed from there reach every live key. */
#include <check.h>

#include "kv_util.h"
#include "tests/check_run.h"

static int del_range(struct kvu *u, const char *start, const char *end, uint32_t limit,
                     uint64_t before)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange d = KVPB__DELETE_RANGE__INIT;
    d.start = kvu_str(start);
    d.end = kvu_str(end);
    d.limit = limit;
    d.deleted_before = before;
    c.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    c.delete_range = &d;
    int rc = kvu_apply(u, &c);
    return rc != 0 ? rc : u->res.code;
}

static void put_n(struct kvu *u, int from, int to)
{
    char k[16];
    for (int i = from; i < to; i++) {
        snprintf(k, sizeof(k), "k%06d", i);
        ck_assert_int_eq(kvu_put(u, k, "v"), 0);
    }
}

static int count_cb(const struct kv_item *it, void *data)
{
    (void)it;
    (*(size_t *)data)++;
    return 0;
}

static size_t count_live(struct kvu *u)
{
    size_t n = 0;
    struct kv_range all = {0};
    ck_assert_int_eq(kv_sm_scan(u->sm, &all, 0, count_cb, &n), 0);
    return n;
}

START_TEST(test_delete_range_stops_at_its_limit)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    put_n(&u, 0, 2500);
    ck_assert_int_eq(del_range(&u, "k", "l", 1000, 0), 0);
    ck_assert_uint_eq(u.res.deleted, 1000);
    ck_assert(u.res.more);
    ck_assert_uint_ne(u.res.revision, 0);
    ck_assert_uint_eq(count_live(&u), 1500);
    ck_assert_int_eq(del_range(&u, "k", "l", 1000, 1000), 0);
    ck_assert_uint_eq(u.res.deleted, 2000); /* deleted_before counted in */
    ck_assert(u.res.more);
    ck_assert_int_eq(del_range(&u, "k", "l", 1000, 2000), 0);
    ck_assert_uint_eq(u.res.deleted, 2500);
    ck_assert(!u.res.more);
    ck_assert_uint_eq(count_live(&u), 0);
    /* No limit: the whole range in one (an entry written before limits). */
    put_n(&u, 0, 2500);
    ck_assert_int_eq(del_range(&u, "k", "l", 0, 0), 0);
    ck_assert_uint_eq(u.res.deleted, 2500);
    ck_assert(!u.res.more);
    kvu_close(&u, true);
}
END_TEST

/* Resumes a bounded scan of everything until it ends; returns the live keys
 * seen, the calls made and the longest run of records one call read. */
static size_t scan_all_bounded(struct kvu *u, size_t skip_max, size_t *calls,
                               bool *stopped_once)
{
    uint8_t from[64] = {0}, key[64];
    size_t from_len = 0, n = 0;
    *calls = 0;
    *stopped_once = false;
    for (;;) {
        struct kv_range r = {.start = from, .start_len = from_len};
        struct kv_scan_stop stop = {.key = key, .cap = sizeof(key) - 1};
        ck_assert_int_eq(kv_sm_scan_bounded(u->sm, &r, 0, skip_max, count_cb, &n, &stop),
                         0);
        (*calls)++;
        ck_assert_uint_lt(*calls, 100000);
        if (!stop.stopped)
            return n;
        *stopped_once = true;
        ck_assert_uint_gt(stop.key_len, 0);
        /* Progress: the stop lies past where this call started. */
        ck_assert(from_len == 0 || memcmp(key, from, from_len) >= 0);
        memcpy(from, key, stop.key_len);
        from[stop.key_len] = 0;
        from_len = stop.key_len + 1;
    }
}

START_TEST(test_scan_over_tombstones_is_bounded_and_resumes)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    put_n(&u, 0, 20000);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0); /* cold copies under the tombstones */
    put_n(&u, 20000, 40000);
    ck_assert_int_eq(del_range(&u, "k", "l", 0, 0), 0);
    ck_assert_uint_eq(u.res.deleted, 40000);
    ck_assert_int_eq(kvu_put(&u, "k010000x", "live"), 0);
    ck_assert_int_eq(kvu_put(&u, "z", "live"), 0);
    /* Unbounded: one call reads every tombstone (what the budget prevents). */
    size_t calls;
    bool stopped;
    ck_assert_uint_eq(scan_all_bounded(&u, 0, &calls, &stopped), 2);
    ck_assert_uint_eq(calls, 1);
    ck_assert(!stopped);
    /* A budget of 1000: about 40 calls, each reading at most 1000 records,
     * and the two live keys still found. */
    ck_assert_uint_eq(scan_all_bounded(&u, 1000, &calls, &stopped), 2);
    ck_assert(stopped);
    ck_assert_uint_ge(calls, 40);
    ck_assert_uint_le(calls, 42);
    /* The first call stops at the 1000th tombstone. */
    uint8_t key[64];
    size_t n = 0;
    struct kv_range all = {0};
    struct kv_scan_stop stop = {.key = key, .cap = sizeof(key)};
    ck_assert_int_eq(kv_sm_scan_bounded(u.sm, &all, 0, 1000, count_cb, &n, &stop), 0);
    ck_assert(stop.stopped);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(stop.key_len, 7);
    ck_assert_int_eq(memcmp(key, "k000999", 7), 0);
    /* After a tier-down the tombstones are gone: nothing to skip. */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_uint_eq(scan_all_bounded(&u, 1000, &calls, &stopped), 2);
    kvu_close(&u, true);
}
END_TEST

/* Steps until done; returns the digest and counts the steps. */
static uint64_t digest_in_steps(struct kvu *u, size_t items, size_t skip, size_t *steps)
{
    struct kv_digest *d = kv_digest_new(u->sm);
    int rc;
    *steps = 0;
    do {
        rc = kv_sm_digest_step(u->sm, d, items, skip);
        ck_assert_int_ge(rc, 0);
        ++*steps;
    } while (rc == 0);
    ck_assert_int_eq(kv_sm_digest_step(u->sm, d, items, skip), 1); /* stays done */
    uint64_t v = kv_digest_value(d);
    kv_digest_free(d);
    return v;
}

START_TEST(test_digest_in_steps_equals_the_whole)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    put_n(&u, 0, 2500);
    ck_assert_int_eq(del_range(&u, "k001000", "k002200", 0, 0), 0);
    char big[300];
    memset(big, 'z', sizeof(big) - 1); /* a long key: hashed in the cold tier */
    big[sizeof(big) - 1] = 0;
    ck_assert_int_eq(kvu_put(&u, big, "long"), 0);
    uint64_t whole, stepped;
    size_t steps;
    ck_assert_int_eq(kv_sm_digest(u.sm, &whole), 0);
    stepped = digest_in_steps(&u, 100, 300, &steps);
    ck_assert_uint_eq(stepped, whole);
    ck_assert_uint_ge(steps, 1301 / 100 + 1200 / 300); /* items and tombstones bound it */
    ck_assert_uint_eq(digest_in_steps(&u, 0, 0, &steps), whole);
    ck_assert_uint_eq(steps, 1);
    /* In the cold tier, after a tier-down: the same. */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_uint_eq(digest_in_steps(&u, 7, 0, &steps), whole);
    ck_assert_uint_ge(steps, 1301 / 7);
    /* A change between steps gives another value (hence the caller's check of
     * the applied index), and the whole digest sees the change too. */
    struct kv_digest *d = kv_digest_new(u.sm);
    ck_assert_int_eq(kv_sm_digest_step(u.sm, d, 100, 0), 0);
    ck_assert_int_eq(kvu_put(&u, "k000000", "changed"), 0);
    while (kv_sm_digest_step(u.sm, d, 100, 0) == 0)
        ;
    ck_assert_int_eq(kv_sm_digest(u.sm, &stepped), 0);
    ck_assert_uint_ne(stepped, whole);
    ck_assert_uint_ne(kv_digest_value(d), stepped);
    kv_digest_free(d);
    kvu_close(&u, true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv-bounded");
    TCase *tc = tcase_create("kv-bounded");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_delete_range_stops_at_its_limit);
    tcase_add_test(tc, test_scan_over_tombstones_is_bounded_and_resumes);
    tcase_add_test(tc, test_digest_in_steps_equals_the_whole);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
