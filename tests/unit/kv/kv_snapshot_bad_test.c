/* Bad snapshot streams are bad input (issue 49): garbage, a flipped byte, a
 * truncation, a trailer whose record count lies, a record whose lengths lie
 * or claim gigabytes, records out of order or of an unknown table, a session
 * that does not decode, bytes after the trailer. Each is refused by
 * kv_snap_check and by the install's own walk with TK_ECORRUPT, the state
 * machine keeps its keys and applied index, and then the good stream
 * installs. The lying streams are resealed (their CRC recomputed), so only
 * the structure checks can catch them. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/endian.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "kv/kv.h"
#include "tests/check_run.h"
#include "tests/unit/kv/kv_util.h"

#define HDR 32
#define REC_HDR 9
#define TRAILER 13

/* Recomputes the trailer's CRC over every byte before it. */
static void reseal(uint8_t *s, size_t len)
{
    tk_put_be32(s + len - 4, tk_crc32c(0, s, len - 4));
}

/* The offset of record i (0-based) of table `table` (0: any). */
static size_t record_at(const uint8_t *s, size_t len, uint8_t table, int i)
{
    size_t off = HDR;
    while (off < len && s[off] != 0xFF) {
        if (table == 0 || s[off] == table) {
            if (i-- == 0)
                return off;
        }
        off += REC_HDR + tk_get_be32(s + off + 1) + tk_get_be32(s + off + 5);
    }
    ck_abort_msg("no record %d of table %u", i, (unsigned)table);
    return 0;
}

/* The source state: keys, a key with a TTL, and a remembered result. */
struct env {
    struct kvu a, b;
    uint8_t *good;
    size_t len;
    uint64_t index;
    uint64_t b_applied;
};

static void env_open(struct env *e)
{
    memset(e, 0, sizeof(*e));
    kvu_open(&e->a, NULL);
    kvu_open(&e->b, NULL);
    ck_assert_int_eq(kvu_fill_snapshot_source(&e->a, 50), 0);
    struct kv_snap *s;
    ck_assert_int_eq(kv_sm_snapshot(e->a.sm, &s), 0);
    e->index = kv_snap_index(s);
    size_t cap = 1 << 20, got;
    e->good = tk_malloc(cap);
    do {
        ck_assert_int_eq(kv_snap_read(s, e->good + e->len, cap - e->len, &got), 0);
        e->len += got;
    } while (got != 0);
    kv_snap_close(s);
    ck_assert_int_eq(kvu_put(&e->b, "mine", "before"), 0);
    ck_assert_int_eq(kvu_put(&e->b, "also", "mine"), 0);
    e->b_applied = kv_sm_applied_index(e->b.sm);
}

static void env_close(struct env *e)
{
    tk_free(e->good);
    kvu_close(&e->a, true);
    kvu_close(&e->b, true);
}

/* b's state is as it was. */
static void b_unchanged(struct env *e)
{
    char buf[32];
    ck_assert_uint_eq(kv_sm_applied_index(e->b.sm), e->b_applied);
    ck_assert_ptr_nonnull(kvu_get(&e->b, "mine", buf, sizeof(buf)));
    ck_assert_str_eq(buf, "before");
    ck_assert_ptr_null(kvu_get(&e->b, "key0001", buf, sizeof(buf)));
}

/* The install's own walk (begin, write, prepare; on the writer's thread as
 * the node runs it): TK_ECORRUPT, and abort leaves b as it was. */
static void install_refuses(struct env *e, const uint8_t *s, size_t len)
{
    struct kv_install *in;
    ck_assert_int_eq(kv_sm_install_begin(e->b.sm, &in), 0);
    int rc = kv_install_write(in, s, len);
    if (rc == 0)
        rc = kv_install_prepare(in);
    ck_assert_int_eq(rc, TK_ECORRUPT);
    kv_install_abort(in);
    b_unchanged(e);
}

/* Refused by the check (with a reason) and by the install. */
static void refused(struct env *e, const uint8_t *s, size_t len, bool install)
{
    uint64_t index = 0, term = 0;
    char why[128] = "";
    ck_assert_int_eq(kv_snap_check(e->b.sm, s, len, &index, &term, why, sizeof(why)),
                     TK_ECORRUPT);
    ck_assert_msg(why[0] != '\0', "a refusal says why");
    if (install)
        install_refuses(e, s, len);
}

/* After every refusal, the good stream installs. */
static void good_installs(struct env *e)
{
    uint64_t index = 0, term = 0;
    ck_assert_int_eq(kv_snap_check(e->b.sm, e->good, e->len, &index, &term, NULL, 0), 0);
    ck_assert_uint_eq(index, e->index);
    ck_assert_uint_eq(term, 1);
    struct kv_install *in;
    ck_assert_int_eq(kv_sm_install_begin(e->b.sm, &in), 0);
    ck_assert_int_eq(kv_install_write(in, e->good, e->len), 0);
    ck_assert_int_eq(kv_install_prepare(in), 0);
    ck_assert_int_eq(kv_install_commit(in), 0);
    kv_trash_free(kv_sm_install_trash(e->b.sm));
    ck_assert_uint_eq(kv_sm_applied_index(e->b.sm), e->index);
    char buf[32];
    ck_assert_str_eq(kvu_get(&e->b, "key0001", buf, sizeof(buf)), "key0001");
    ck_assert_ptr_null(kvu_get(&e->b, "mine", buf, sizeof(buf)));
    uint64_t da, db;
    ck_assert_int_eq(kv_sm_digest(e->a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(e->b.sm, &db), 0);
    ck_assert_uint_eq(da, db);
}

START_TEST(test_garbage_is_refused)
{
    struct env e;
    env_open(&e);
    uint8_t junk[4096];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof(junk); i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        junk[i] = (uint8_t)x;
    }
    refused(&e, junk, sizeof(junk), true);
    /* The magic, then garbage. */
    memcpy(junk, "TKVSNAP1", 8);
    refused(&e, junk, sizeof(junk), true);
    refused(&e, junk, 0, false);
    ck_assert_int_eq(kv_snap_check(e.b.sm, NULL, 0, &x, &x, NULL, 0), TK_ECORRUPT);
    good_installs(&e);
    env_close(&e);
}
END_TEST

START_TEST(test_every_flipped_byte_is_refused)
{
    struct env e;
    env_open(&e);
    uint8_t *s = tk_malloc(e.len);
    memcpy(s, e.good, e.len);
    for (size_t i = 0; i < e.len; i++) {
        s[i] ^= 0x10;
        /* The install only at a few places: each makes an environment. */
        refused(&e, s, e.len, i % (e.len / 8) == 0 || i == e.len - 1);
        s[i] ^= 0x10;
    }
    tk_free(s);
    good_installs(&e);
    env_close(&e);
}
END_TEST

START_TEST(test_every_truncation_is_refused)
{
    struct env e;
    env_open(&e);
    for (size_t n = 0; n < e.len; n++)
        refused(&e, e.good, n, n % (e.len / 8) == 0 || n == e.len - 1);
    /* And bytes after the trailer. */
    uint8_t *s = tk_malloc(e.len + 1);
    memcpy(s, e.good, e.len);
    s[e.len] = 0;
    refused(&e, s, e.len + 1, true);
    tk_free(s);
    good_installs(&e);
    env_close(&e);
}
END_TEST

START_TEST(test_lying_counts_and_lengths_are_refused_despite_a_good_crc)
{
    struct env e;
    env_open(&e);
    uint8_t *s = tk_malloc(e.len);
    /* The trailer counts one record more. */
    memcpy(s, e.good, e.len);
    uint8_t *count = s + e.len - TRAILER + 1;
    tk_put_be64(count, ((uint64_t)count[7] | (uint64_t)count[6] << 8) + 1);
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* A record's value claims a byte more (the records after it shift). */
    memcpy(s, e.good, e.len);
    size_t r = record_at(s, e.len, 1, 3);
    tk_put_be32(s + r + 5, tk_get_be32(s + r + 5) + 1);
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* A key claims a byte less. */
    memcpy(s, e.good, e.len);
    tk_put_be32(s + r + 1, tk_get_be32(s + r + 1) - 1);
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* A record of an unknown table. */
    memcpy(s, e.good, e.len);
    s[r] = 7;
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* Keys out of order: the first key sorts after the second. */
    memcpy(s, e.good, e.len);
    s[record_at(s, e.len, 1, 0) + REC_HDR] = 0xFE;
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* A data value shorter than its header. */
    memcpy(s, e.good, e.len);
    size_t r0 = record_at(s, e.len, 1, 0);
    uint32_t klen = tk_get_be32(s + r0 + 1), vlen = tk_get_be32(s + r0 + 5);
    tk_put_be32(s + r0 + 5, 4);
    memmove(s + r0 + REC_HDR + klen + 4, s + r0 + REC_HDR + klen + vlen,
            e.len - (r0 + REC_HDR + klen + vlen));
    size_t short_len = e.len - vlen + 4;
    reseal(s, short_len);
    refused(&e, s, short_len, true);
    /* A remembered result that does not decode (answering a retry from it
     * would assert). */
    memcpy(s, e.good, e.len);
    size_t sr = record_at(s, e.len, 3, 0);
    uint32_t sk = tk_get_be32(s + sr + 1), sv = tk_get_be32(s + sr + 5);
    ck_assert_uint_gt(sv, 0);
    memset(s + sr + REC_HDR + sk, 0xFF, sv);
    reseal(s, e.len);
    refused(&e, s, e.len, true);
    /* The same record, unchanged and resealed: the control, accepted. */
    memcpy(s, e.good, e.len);
    reseal(s, e.len);
    uint64_t index, term;
    ck_assert_int_eq(kv_snap_check(e.b.sm, s, e.len, &index, &term, NULL, 0), 0);
    tk_free(s);
    good_installs(&e);
    env_close(&e);
}
END_TEST

/* A record claiming 4 GiB + 4 GiB: refused at its header, with nothing
 * allocated or waited for (the install does not ask for the rest). */
START_TEST(test_a_huge_claimed_length_is_refused_at_once)
{
    struct env e;
    env_open(&e);
    size_t len = HDR + REC_HDR + 16 + TRAILER;
    uint8_t *s = tk_calloc(1, len);
    memcpy(s, e.good, HDR + REC_HDR);
    tk_put_be32(s + HDR + 1, 0xFFFFFFFFu);
    tk_put_be32(s + HDR + 5, 0xFFFFFFFFu);
    s[len - TRAILER] = 0xFF;
    reseal(s, len);
    refused(&e, s, len, false);
    struct kv_install *in;
    ck_assert_int_eq(kv_sm_install_begin(e.b.sm, &in), 0);
    ck_assert_int_eq(kv_install_write(in, s, HDR + REC_HDR), TK_ECORRUPT);
    kv_install_abort(in);
    b_unchanged(&e);
    /* Just past the install's record bound (a value of value_max and a
     * little), as seen by the check alone. */
    tk_put_be32(s + HDR + 1, 8);
    tk_put_be32(s + HDR + 5, (uint32_t)e.b.cfg.value_max + 200000);
    reseal(s, len);
    refused(&e, s, len, true);
    tk_free(s);
    good_installs(&e);
    env_close(&e);
}
END_TEST

static Suite *bad_suite(void)
{
    Suite *s = suite_create("kv-snapshot-bad");
    TCase *tc = tcase_create("refused");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_garbage_is_refused);
    tcase_add_test(tc, test_every_flipped_byte_is_refused);
    tcase_add_test(tc, test_every_truncation_is_refused);
    tcase_add_test(tc, test_lying_counts_and_lengths_are_refused_despite_a_good_crc);
    tcase_add_test(tc, test_a_huge_claimed_length_is_refused_at_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(bad_suite()));
}
