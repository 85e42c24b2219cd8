/* Unit tests for kv/: the ring (append, self-checking reads), the hash index
 * (through incremental growth), the ordered view, the cold tier (tier-down,
 * reads, scans merging hot and cold) and every command of the state machine,
 * with exactly-once retries, TTL by entry time, bad input, recovery after a
 * restart and snapshot stream/install. */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/err.h"
#include "base/prng.h"
#include "kv/kv_internal.h"
#include "kv/sm_internal.h"
#include "kv_util.h"
#include "tests/check_run.h"

/* ---- ring ---- */

static uint64_t ring_put(struct kv_ring *r, const char *k, const char *v, uint64_t rev)
{
    struct kv_rec h = {.key_len = (uint16_t)strlen(k),
                       .value_len = (uint32_t)strlen(v),
                       .mod_rev = rev,
                       .create_rev = rev,
                       .version = 1};
    return kv__ring_append(r, &h, k, v);
}

START_TEST(test_ring_record_reads_back_and_checks)
{
    struct kv_ring r;
    kv__ring_init(&r, 4096);
    uint64_t a = ring_put(&r, "alpha", "one", 1);
    uint64_t b = ring_put(&r, "beta", "two", 2);
    ck_assert(kv__ring_check(&r, a));
    ck_assert(kv__ring_check(&r, b));
    const struct kv_rec *h = kv__ring_at(&r, b);
    ck_assert_uint_eq(h->key_len, 4);
    ck_assert_mem_eq(kv__rec_key(h), "beta", 4);
    ck_assert_mem_eq(kv__rec_value(h), "two", 3);
    ck_assert_uint_eq(h->mod_rev, 2);
    kv__ring_free(&r);
}
END_TEST

/* The record CRC's inline path agrees with tk_crc32c at every short length
 * and past it; 8 B keys with 8 B values fill exactly one cache line. */
START_TEST(test_ring_crc_matches_crc32c)
{
    uint8_t buf[600];
    struct tk_prng g;
    tk_prng_seed(&g, 3);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)tk_prng_below(&g, 256);
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n + off <= sizeof(buf); n++)
            ck_assert_uint_eq(kv__rec_crc(buf + off, n), tk_crc32c(0, buf + off, n));
    struct kv_ring r;
    kv__ring_init(&r, 4096);
    for (int i = 0; i < 200; i++) {
        uint64_t a = ring_put(&r, "8bytekey", "8bytval", (uint64_t)i + 1);
        ck_assert_uint_eq((uintptr_t)kv__ring_at(&r, a) % 64, 0);
        ck_assert(kv__ring_check(&r, a));
    }
    kv__ring_free(&r);
}
END_TEST

START_TEST(test_ring_flipped_byte_fails_check)
{
    /* Each byte of the record, flipped in turn, must fail the check. */
    struct kv_ring r;
    kv__ring_init(&r, 4096);
    uint64_t a = ring_put(&r, "key", "value", 7);
    struct kv_rec *h = (struct kv_rec *)(uintptr_t)kv__ring_at(&r, a);
    size_t n = sizeof(*h) + 3 + 5;
    for (size_t i = 0; i < n; i++) {
        ((uint8_t *)h)[i] ^= 0x10;
        ck_assert_msg(!kv__ring_check(&r, a), "flip at byte %zu passed", i);
        ((uint8_t *)h)[i] ^= 0x10;
        ck_assert(kv__ring_check(&r, a));
    }
    kv__ring_free(&r);
}
END_TEST

START_TEST(test_ring_pages_roll_and_release)
{
    struct kv_ring r;
    kv__ring_init(&r, 4096);
    char v[3000];
    memset(v, 'x', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    uint64_t a1 = ring_put(&r, "a", v, 1);
    uint64_t a2 = ring_put(&r, "b", v, 2); /* does not fit: a new page */
    ck_assert_uint_eq(r.n_pages, 2);
    ck_assert_uint_ne(a1 >> KV_ADDR_OFF_BITS, a2 >> KV_ADDR_OFF_BITS);
    /* A record larger than a page gets a page of its own size. */
    char *big = tk_malloc(10000);
    memset(big, 'y', 9999);
    big[9999] = '\0';
    uint64_t a3 = ring_put(&r, "c", big, 3);
    ck_assert(kv__ring_check(&r, a3));
    ck_assert_uint_eq(r.n_pages, 3);
    kv__ring_release_head(&r);
    ck_assert_uint_eq(r.n_pages, 2);
    ck_assert(!kv__ring_check(&r, a1)); /* released: never readable */
    ck_assert(kv__ring_check(&r, a2));
    tk_free(big);
    kv__ring_free(&r);
}
END_TEST

/* ---- index ---- */

START_TEST(test_index_grows_incrementally_and_finds_every_key)
{
    struct kv_ring r;
    kv__ring_init(&r, 1 << 20);
    struct kv_index x;
    kv__index_init(&x, &r);
    enum { N = 40000 };
    uint64_t *addr = tk_malloc(N * sizeof(*addr));
    char k[32];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "key-%d", i);
        addr[i] = ring_put(&r, k, "v", (uint64_t)i + 1);
        ck_assert(kv__index_put(&x, kv__hash(k, strlen(k)), k, strlen(k), addr[i]));
        if (i % 997 == 0) { /* lookups work during migration too */
            for (int j = 0; j <= i; j += 101) {
                snprintf(k, sizeof(k), "key-%d", j);
                bool found;
                uint64_t got =
                    kv__index_find(&x, kv__hash(k, strlen(k)), k, strlen(k), &found);
                ck_assert(found);
                ck_assert_uint_eq(got, addr[j]);
            }
        }
    }
    ck_assert_uint_eq(kv__index_count(&x), N);
    bool found;
    kv__index_find(&x, kv__hash("nope", 4), "nope", 4, &found);
    ck_assert(!found);
    /* Overwrite: not new, points at the new address. */
    snprintf(k, sizeof(k), "key-%d", 5);
    uint64_t a = ring_put(&r, k, "w", N + 1);
    ck_assert(!kv__index_put(&x, kv__hash(k, strlen(k)), k, strlen(k), a));
    ck_assert_uint_eq(kv__index_find(&x, kv__hash(k, strlen(k)), k, strlen(k), &found),
                      a);
    /* remove_if only removes an entry pointing at the given address. */
    ck_assert(!kv__index_remove_if(&x, kv__hash(k, strlen(k)), addr[5]));
    ck_assert(kv__index_remove_if(&x, kv__hash(k, strlen(k)), a));
    kv__index_find(&x, kv__hash(k, strlen(k)), k, strlen(k), &found);
    ck_assert(!found);
    for (int i = 0; i < N; i += 2) {
        snprintf(k, sizeof(k), "key-%d", i);
        if (i != 5)
            ck_assert(kv__index_remove_if(&x, kv__hash(k, strlen(k)), addr[i]));
    }
    for (int i = 1; i < N; i += 2) {
        snprintf(k, sizeof(k), "key-%d", i);
        uint64_t got = kv__index_find(&x, kv__hash(k, strlen(k)), k, strlen(k), &found);
        ck_assert(i == 5 ? !found : (found && got == addr[i]));
    }
    tk_free(addr);
    kv__index_free(&x);
    kv__ring_free(&r);
}
END_TEST

/* ---- view ---- */

START_TEST(test_view_keeps_byte_order)
{
    struct kv_view v;
    kv__view_init(&v);
    const char *keys[] = {"b", "a", "ab", "\xff", "", "abc", "b"};
    for (size_t i = 0; i < 7; i++)
        kv__view_insert(&v, keys[i], strlen(keys[i]));
    ck_assert_uint_eq(v.count, 6);
    const char *want[] = {"", "a", "ab", "abc", "b", "\xff"};
    struct kv_view_it it;
    kv__view_seek(&v, "", 0, &it);
    for (int i = 0; i < 6; i++, kv__view_it_next(&it)) {
        ck_assert(kv__view_it_valid(&it));
        size_t len = 0;
        const uint8_t *k = kv__view_it_key(&it, &len);
        ck_assert_int_eq(kv__keycmp(k, len, want[i], strlen(want[i])), 0);
    }
    ck_assert(!kv__view_it_valid(&it));
    size_t len = 0;
    kv__view_seek(&v, "aa", 2, &it);
    const uint8_t *k = kv__view_it_key(&it, &len);
    ck_assert_int_eq(kv__keycmp(k, len, "ab", 2), 0);
    kv__view_remove(&v, "ab", 2);
    kv__view_seek(&v, "aa", 2, &it);
    k = kv__view_it_key(&it, &len);
    ck_assert_int_eq(kv__keycmp(k, len, "abc", 3), 0);
    kv__view_free(&v);
}
END_TEST

/* Keys of 0-40 bytes over a small alphabet, so many share long prefixes and
 * many differ only past the 16 bytes the view keeps inline. */
static size_t view_key(struct tk_prng *g, uint8_t *k)
{
    size_t len = (size_t)tk_prng_below(g, 41);
    for (size_t i = 0; i < len; i++)
        k[i] = (uint8_t)("\0a\xff"[tk_prng_below(g, 3)]);
    return len;
}

struct vkey {
    uint8_t k[40];
    size_t len;
};

static int vkey_cmp(const void *a, const void *b)
{
    const struct vkey *x = a, *y = b;
    return kv__keycmp(x->k, x->len, y->k, y->len);
}

/* The first i with ref[i] >= k. */
static size_t ref_lower(const struct vkey *ref, size_t n, const struct vkey *k)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (vkey_cmp(&ref[mid], k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The view against a sorted array: random inserts and removes (enough for a
 * tree of several levels, then down to empty and up again), full walks and
 * seeks to keys present and absent. */
START_TEST(test_view_matches_a_sorted_reference)
{
    struct tk_prng g;
    tk_prng_seed(&g, 7);
    struct kv_view v;
    kv__view_init(&v);
    enum { MAXK = 30000 };
    struct vkey *ref = tk_calloc(MAXK, sizeof(*ref));
    size_t n = 0;
    for (int round = 0; round < 3; round++) {
        /* Grow, shrink to a few keys (or none), check after each phase. */
        for (int phase = 0; phase < 2; phase++) {
            size_t steps = phase == 0 ? 40000 : 60000;
            for (size_t s = 0; s < steps; s++) {
                struct vkey k;
                k.len = view_key(&g, k.k);
                bool add =
                    phase == 0 ? tk_prng_below(&g, 4) != 0 : tk_prng_below(&g, 8) == 0;
                if (add && n == MAXK)
                    add = false;
                if (!add && n > 0 && tk_prng_below(&g, 2) == 0)
                    k = ref[tk_prng_below(&g, n)]; /* remove a present key */
                size_t at = ref_lower(ref, n, &k);
                bool hit = at < n && vkey_cmp(&ref[at], &k) == 0;
                if (add) {
                    kv__view_insert(&v, k.k, k.len);
                    if (!hit) {
                        memmove(&ref[at + 1], &ref[at], (n - at) * sizeof(k));
                        ref[at] = k;
                        n++;
                    }
                } else {
                    kv__view_remove(&v, k.k, k.len);
                    if (hit) {
                        memmove(&ref[at], &ref[at + 1], (n - at - 1) * sizeof(k));
                        n--;
                    }
                }
            }
            if (round == 2 && phase == 1) { /* empty it completely */
                while (n > 0) {
                    n--;
                    kv__view_remove(&v, ref[n].k, ref[n].len);
                }
            }
            ck_assert_uint_eq(v.count, n);
            struct kv_view_it it;
            kv__view_seek(&v, "", 0, &it);
            for (size_t i = 0; i < n; i++, kv__view_it_next(&it)) {
                ck_assert(kv__view_it_valid(&it));
                size_t len = 0;
                const uint8_t *k = kv__view_it_key(&it, &len);
                ck_assert_int_eq(kv__keycmp(k, len, ref[i].k, ref[i].len), 0);
            }
            ck_assert(!kv__view_it_valid(&it));
            for (int q = 0; q < 2000; q++) {
                struct vkey k;
                k.len = view_key(&g, k.k);
                size_t lo = ref_lower(ref, n, &k);
                kv__view_seek(&v, k.k, k.len, &it);
                if (lo == n) {
                    ck_assert(!kv__view_it_valid(&it));
                } else {
                    ck_assert(kv__view_it_valid(&it));
                    size_t len = 0;
                    const uint8_t *got = kv__view_it_key(&it, &len);
                    ck_assert_int_eq(kv__keycmp(got, len, ref[lo].k, ref[lo].len), 0);
                }
            }
        }
    }
    ck_assert_uint_eq(v.height, 0);
    kv__view_free(&v);
    tk_free(ref);
}
END_TEST

/* A view that loses as many keys as it gains reuses its nodes. */
START_TEST(test_view_of_steady_size_allocates_nothing)
{
    struct kv_view v;
    kv__view_init(&v);
    uint8_t k[8];
    for (uint64_t i = 0; i < 20000; i++) {
        memcpy(k, &i, 8);
        kv__view_insert(&v, k, 8);
    }
    for (uint64_t i = 20000; i < 60000; i++) { /* warm: churn once */
        uint64_t old = i - 20000;
        memcpy(k, &old, 8);
        kv__view_remove(&v, k, 8);
        memcpy(k, &i, 8);
        kv__view_insert(&v, k, 8);
    }
    struct tk_alloc_stats a0, a1;
    tk_alloc_stats(&a0);
    for (uint64_t i = 60000; i < 100000; i++) {
        uint64_t old = i - 20000;
        memcpy(k, &old, 8);
        kv__view_remove(&v, k, 8);
        memcpy(k, &i, 8);
        kv__view_insert(&v, k, 8);
    }
    tk_alloc_stats(&a1);
    ck_assert_uint_eq(v.count, 20000);
    ck_assert_uint_eq(a1.bytes - a0.bytes, 0);
    kv__view_free(&v);
}
END_TEST

/* ---- commands ---- */

START_TEST(test_put_get_revisions_and_versions)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[64];
    ck_assert_int_eq(kvu_put(&u, "k", "v1"), 0);
    ck_assert_uint_eq(u.res.revision, 1);
    ck_assert(u.res.succeeded);
    ck_assert_int_eq(kvu_put(&u, "other", "x"), 0);
    ck_assert_int_eq(kvu_put(&u, "k", "v2"), 0);
    ck_assert_str_eq(kvu_get(&u, "k", buf, sizeof(buf)), "v2");
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(u.sm, "k", 1, &it), 0);
    ck_assert_uint_eq(it.create_revision, 1);
    ck_assert_uint_eq(it.mod_revision, 3);
    ck_assert_uint_eq(it.version, 2);
    ck_assert_int_eq(kv_sm_get(u.sm, "missing", 7, &it), TK_ENOTFOUND);
    ck_assert_uint_eq(kv_sm_applied_index(u.sm), 3);
    kvu_close(&u, true);
}
END_TEST

static int put_cond(struct kvu *u, const char *k, const char *v, Kvpb__Compare__Target t,
                    Kvpb__Compare__Op op, int64_t num, const char *val)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    Kvpb__Compare cmp = KVPB__COMPARE__INIT;
    p.key = kvu_str(k);
    p.value = kvu_str(v);
    cmp.target = t;
    cmp.op = op;
    cmp.number = num;
    if (val != NULL)
        cmp.value = kvu_str(val);
    p.cond = &cmp;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    return kvu_apply_code(u, &c);
}

START_TEST(test_put_compare_version_revision_value_absence)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[64];
    /* Absence: succeeds once, then fails. */
    ck_assert_int_eq(put_cond(&u, "k", "a", KVPB__COMPARE__TARGET__ABSENT, 0, 0, NULL),
                     0);
    ck_assert_int_eq(put_cond(&u, "k", "b", KVPB__COMPARE__TARGET__ABSENT, 0, 0, NULL),
                     TK_ECOMPARE);
    ck_assert(!u.res.succeeded);
    ck_assert_uint_eq(u.res.revision, 0);
    ck_assert_str_eq(kvu_get(&u, "k", buf, sizeof(buf)), "a");
    /* Version. */
    ck_assert_int_eq(put_cond(&u, "k", "c", KVPB__COMPARE__TARGET__VERSION,
                              KVPB__COMPARE__OP__EQUAL, 2, NULL),
                     TK_ECOMPARE);
    ck_assert_int_eq(put_cond(&u, "k", "c", KVPB__COMPARE__TARGET__VERSION,
                              KVPB__COMPARE__OP__EQUAL, 1, NULL),
                     0);
    /* Mod revision (the put above was entry 4). */
    ck_assert_int_eq(put_cond(&u, "k", "d", KVPB__COMPARE__TARGET__MOD_REVISION,
                              KVPB__COMPARE__OP__LESS, 4, NULL),
                     TK_ECOMPARE);
    ck_assert_int_eq(put_cond(&u, "k", "d", KVPB__COMPARE__TARGET__MOD_REVISION,
                              KVPB__COMPARE__OP__EQUAL, 4, NULL),
                     0);
    /* Value. */
    ck_assert_int_eq(put_cond(&u, "k", "e", KVPB__COMPARE__TARGET__VALUE,
                              KVPB__COMPARE__OP__EQUAL, 0, "zzz"),
                     TK_ECOMPARE);
    ck_assert_int_eq(put_cond(&u, "k", "e", KVPB__COMPARE__TARGET__VALUE,
                              KVPB__COMPARE__OP__EQUAL, 0, "d"),
                     0);
    ck_assert_str_eq(kvu_get(&u, "k", buf, sizeof(buf)), "e");
    /* A compare on another key is malformed. */
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    Kvpb__Compare cmp = KVPB__COMPARE__INIT;
    p.key = kvu_str("k");
    cmp.key = kvu_str("j");
    p.cond = &cmp;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, TK_EINVAL);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_delete_existing_and_absent)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[8];
    ck_assert_int_eq(kvu_put(&u, "k", "v"), 0);
    ck_assert_int_eq(kvu_del(&u, "k"), 0);
    ck_assert_uint_eq(u.res.deleted, 1);
    ck_assert_uint_eq(u.res.revision, 2);
    ck_assert_ptr_null(kvu_get(&u, "k", buf, sizeof(buf)));
    ck_assert_int_eq(kvu_del(&u, "k"), 0);
    ck_assert_uint_eq(u.res.deleted, 0);
    ck_assert_uint_eq(u.res.revision, 0);
    /* A new put after a delete starts a new life: version 1. */
    ck_assert_int_eq(kvu_put(&u, "k", "w"), 0);
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(u.sm, "k", 1, &it), 0);
    ck_assert_uint_eq(it.version, 1);
    ck_assert_uint_eq(it.create_revision, 4);
    kvu_close(&u, true);
}
END_TEST

static int del_range(struct kvu *u, const char *start, const char *end,
                     const char *prefix)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange d = KVPB__DELETE_RANGE__INIT;
    if (prefix != NULL) {
        d.by_prefix = true;
        d.prefix = kvu_str(prefix);
    } else {
        d.start = kvu_str(start);
        d.end = kvu_str(end);
    }
    c.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    c.delete_range = &d;
    return kvu_apply_code(u, &c);
}

struct collect {
    char keys[64][16];
    int n;
};

static int collect_cb(const struct kv_item *it, void *data)
{
    struct collect *c = data;
    snprintf(c->keys[c->n++], 16, "%.*s", (int)it->key_len, (const char *)it->key);
    return 0;
}

START_TEST(test_delete_range_and_prefix_across_tiers)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    const char *keys[] = {"a1", "a2", "a3", "b1", "b2", "c1"};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(kvu_put(&u, keys[i], "cold"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0); /* a1..a3 now in LMDB */
    for (int i = 3; i < 6; i++)
        ck_assert_int_eq(kvu_put(&u, keys[i], "hot"), 0);
    ck_assert_int_eq(del_range(&u, "a2", "b2", NULL), 0);
    ck_assert_uint_eq(u.res.deleted, 3); /* a2 a3 b1 */
    struct collect c = {0};
    struct kv_range all = {0};
    ck_assert_int_eq(kv_sm_scan(u.sm, &all, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 3);
    ck_assert_str_eq(c.keys[0], "a1");
    ck_assert_str_eq(c.keys[1], "b2");
    ck_assert_str_eq(c.keys[2], "c1");
    ck_assert_int_eq(del_range(&u, NULL, NULL, "b"), 0);
    ck_assert_uint_eq(u.res.deleted, 1);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(kv_sm_scan(u.sm, &all, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 2);
    ck_assert_str_eq(c.keys[0], "a1");
    ck_assert_str_eq(c.keys[1], "c1");
    kvu_close(&u, true);
}
END_TEST

/* A delete range never takes the node's reserved keys (KV_RESERVED_BYTE),
 * cold or hot, however wide; the limit counts only what it deletes. */
START_TEST(test_delete_range_spares_reserved_keys)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    ck_assert_int_eq(kvu_put(&u, "\x01tierkv/member/4", "raft=x"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_int_eq(kvu_put(&u, "\x01tierkv/member/5", "raft=y"), 0);
    ck_assert_int_eq(kvu_put(&u, "a", "v"), 0);
    ck_assert_int_eq(kvu_put(&u, "b", "v"), 0);
    ck_assert_int_eq(del_range(&u, NULL, NULL, ""), 0); /* every key */
    ck_assert_uint_eq(u.res.deleted, 2);
    char buf[32];
    ck_assert_str_eq(kvu_get(&u, "\x01tierkv/member/4", buf, sizeof(buf)), "raft=x");
    ck_assert_str_eq(kvu_get(&u, "\x01tierkv/member/5", buf, sizeof(buf)), "raft=y");
    ck_assert_int_eq(del_range(&u, "", "", NULL), 0);
    ck_assert_uint_eq(u.res.deleted, 0);
    ck_assert_str_eq(kvu_get(&u, "\x01tierkv/member/4", buf, sizeof(buf)), "raft=x");
    kvu_close(&u, true);
}
END_TEST

/* A delete range bound may be one byte longer than the longest key (the
 * gateway's steps end just after a key that may be key_max long). */
START_TEST(test_delete_range_bound_one_past_key_max)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    static char key[4097], end[4098];
    memset(key, 'a', 4096);
    memset(end, 'b', 4097);
    ck_assert_int_eq(kvu_put(&u, key, "v"), 0);
    ck_assert_int_eq(del_range(&u, "a", end, NULL), 0);
    ck_assert_uint_eq(u.res.deleted, 1);
    static char longer[4099];
    memset(longer, 'b', 4098);
    ck_assert_int_eq(del_range(&u, "a", longer, NULL), TK_ETOOBIG);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_increment_counts_and_rejects_non_integers)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[32];
    ck_assert_int_eq(kvu_incr(&u, "n", 5), 0);
    ck_assert_int_eq(u.res.value, 5);
    ck_assert_int_eq(kvu_incr(&u, "n", -7), 0);
    ck_assert_int_eq(u.res.value, -2);
    ck_assert_str_eq(kvu_get(&u, "n", buf, sizeof(buf)), "-2");
    ck_assert_int_eq(kvu_put(&u, "s", "12x"), 0);
    ck_assert_int_eq(kvu_incr(&u, "s", 1), TK_ERANGE);
    ck_assert_str_eq(kvu_get(&u, "s", buf, sizeof(buf)), "12x");
    ck_assert_int_eq(kvu_put(&u, "m", "9223372036854775807"), 0);
    ck_assert_int_eq(kvu_incr(&u, "m", 1), TK_ERANGE);
    ck_assert_int_eq(kvu_incr(&u, "m", -1), 0);
    ck_assert_int_eq(u.res.value, INT64_MAX - 1);
    kvu_close(&u, true);
}
END_TEST

static Kvpb__Op *mk_op(Kvpb__Op *op, Kvpb__Put *p, Kvpb__Delete *d, Kvpb__Increment *in)
{
    kvpb__op__init(op);
    if (p != NULL) {
        op->op_case = KVPB__OP__OP_PUT;
        op->put = p;
    } else if (d != NULL) {
        op->op_case = KVPB__OP__OP_DEL;
        op->del = d;
    } else {
        op->op_case = KVPB__OP__OP_INCR;
        op->incr = in;
    }
    return op;
}

START_TEST(test_batch_is_atomic)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[32];
    ck_assert_int_eq(kvu_put(&u, "gone", "x"), 0);
    Kvpb__Put p1 = KVPB__PUT__INIT, p2 = KVPB__PUT__INIT;
    Kvpb__Delete d1 = KVPB__DELETE__INIT;
    p1.key = kvu_str("a");
    p1.value = kvu_str("1");
    p2.key = kvu_str("b");
    p2.value = kvu_str("2");
    d1.key = kvu_str("gone");
    Kvpb__Op ops[3];
    Kvpb__Op *pops[3] = {mk_op(&ops[0], &p1, NULL, NULL), mk_op(&ops[1], &p2, NULL, NULL),
                         mk_op(&ops[2], NULL, &d1, NULL)};
    Kvpb__Batch b = KVPB__BATCH__INIT;
    b.n_ops = 3;
    b.ops = pops;
    Kvpb__Command c = KVPB__COMMAND__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_BATCH;
    c.batch = &b;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, 0);
    ck_assert_uint_eq(u.res.n_ops, 3);
    ck_assert_uint_eq(u.res.ops[2].deleted, 1);
    ck_assert_str_eq(kvu_get(&u, "b", buf, sizeof(buf)), "2");
    ck_assert_ptr_null(kvu_get(&u, "gone", buf, sizeof(buf)));
    /* One bad op (an empty key): nothing of the batch happens. */
    p1.value = kvu_str("changed");
    p2.key = kvu_str("");
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, TK_EINVAL);
    ck_assert_str_eq(kvu_get(&u, "a", buf, sizeof(buf)), "1");
    /* Increments are not batch ops. */
    Kvpb__Increment in = KVPB__INCREMENT__INIT;
    in.key = kvu_str("a");
    p2.key = kvu_str("b");
    mk_op(&ops[1], NULL, NULL, &in);
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, TK_EINVAL);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_txn_then_else_and_atomic_failure)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[32];
    ck_assert_int_eq(kvu_put(&u, "flag", "on"), 0);
    Kvpb__Compare cmp = KVPB__COMPARE__INIT;
    cmp.key = kvu_str("flag");
    cmp.target = KVPB__COMPARE__TARGET__VALUE;
    cmp.value = kvu_str("on");
    Kvpb__Compare *pc[1] = {&cmp};
    Kvpb__Put pt = KVPB__PUT__INIT, pe = KVPB__PUT__INIT;
    pt.key = kvu_str("then");
    pt.value = kvu_str("yes");
    pe.key = kvu_str("else");
    pe.value = kvu_str("yes");
    Kvpb__Increment in = KVPB__INCREMENT__INIT;
    in.key = kvu_str("ctr");
    in.delta = 3;
    Kvpb__Op top[2], eop[1];
    Kvpb__Op *ptop[2] = {mk_op(&top[0], &pt, NULL, NULL),
                         mk_op(&top[1], NULL, NULL, &in)};
    Kvpb__Op *peop[1] = {mk_op(&eop[0], &pe, NULL, NULL)};
    Kvpb__Txn t = KVPB__TXN__INIT;
    t.n_compares = 1;
    t.compares = pc;
    t.n_then_ops = 2;
    t.then_ops = ptop;
    t.n_else_ops = 1;
    t.else_ops = peop;
    Kvpb__Command c = KVPB__COMMAND__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_TXN;
    c.txn = &t;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, 0);
    ck_assert(u.res.succeeded);
    ck_assert_uint_eq(u.res.n_ops, 2);
    ck_assert_int_eq(u.res.ops[1].value, 3);
    ck_assert_str_eq(kvu_get(&u, "then", buf, sizeof(buf)), "yes");
    ck_assert_ptr_null(kvu_get(&u, "else", buf, sizeof(buf)));
    ck_assert_int_eq(kvu_put(&u, "flag", "off"), 0);
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert(!u.res.succeeded);
    ck_assert_str_eq(kvu_get(&u, "else", buf, sizeof(buf)), "yes");
    /* A failing increment in the branch undoes the whole txn. */
    ck_assert_int_eq(kvu_put(&u, "flag", "on"), 0);
    ck_assert_int_eq(kvu_put(&u, "ctr", "abc"), 0);
    pt.value = kvu_str("second");
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, TK_ERANGE);
    ck_assert_str_eq(kvu_get(&u, "then", buf, sizeof(buf)), "yes");
    /* More than 128 ops is refused. */
    Kvpb__Op **many = tk_malloc(129 * sizeof(*many));
    for (int i = 0; i < 129; i++)
        many[i] = ptop[0];
    t.n_then_ops = 129;
    t.then_ops = many;
    t.n_else_ops = 0;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.code, TK_ETOOBIG);
    tk_free(many);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_ttl_expires_by_entry_time_in_both_tiers)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[32];
    u.time_ms = 10000;
    ck_assert_int_eq(kvu_put_ttl(&u, "hot", "h", 500), 0);
    ck_assert_int_eq(kvu_put_ttl(&u, "cold", "c", 500), 0);
    ck_assert_int_eq(kvu_put(&u, "keep", "k"), 0);
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(u.sm, "hot", 3, &it), 0);
    ck_assert_uint_eq(it.expire_ms, 10500);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_int_eq(kvu_put_ttl(&u, "hot", "h", 500), 0); /* hot again */
    u.time_ms = 10499;
    ck_assert_int_eq(kvu_put(&u, "tick", "1"), 0);
    ck_assert_str_eq(kvu_get(&u, "cold", buf, sizeof(buf)), "c");
    u.time_ms = 10500; /* the local clock never matters; the entry's does */
    ck_assert_int_eq(kvu_put(&u, "tick", "2"), 0);
    ck_assert_ptr_null(kvu_get(&u, "cold", buf, sizeof(buf)));
    ck_assert_ptr_null(kvu_get(&u, "hot", buf, sizeof(buf)));
    struct collect c = {0};
    struct kv_range all = {0};
    ck_assert_int_eq(kv_sm_scan(u.sm, &all, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 2);
    ck_assert_str_eq(c.keys[0], "keep");
    /* Compare-absent sees an expired key as absent; a new put starts fresh. */
    ck_assert_int_eq(put_cond(&u, "cold", "n", KVPB__COMPARE__TARGET__ABSENT, 0, 0, NULL),
                     0);
    ck_assert_int_eq(kv_sm_get(u.sm, "cold", 4, &it), 0);
    ck_assert_uint_eq(it.version, 1);
    /* Only the expire command deletes an expired key (kv/ttl.c); then
     * tier-down reclaims its space in LMDB. */
    struct kv_sm_stats st;
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    kv_sm_stats(u.sm, &st);
    ck_assert_uint_eq(st.cold_keys, 4); /* keep, tick, cold, and hot, expired */
    Kvpb__Command ec = KVPB__COMMAND__INIT;
    Kvpb__Expire ex = KVPB__EXPIRE__INIT;
    ProtobufCBinaryData ek = kvu_str("hot");
    ex.n_keys = 1;
    ex.keys = &ek;
    ec.cmd_case = KVPB__COMMAND__CMD_EXPIRE;
    ec.expire = &ex;
    ck_assert_int_eq(kvu_apply(&u, &ec), 0);
    ck_assert_uint_eq(u.res.deleted, 1);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    kv_sm_stats(u.sm, &st);
    ck_assert_uint_eq(st.cold_keys, 3); /* keep, tick, cold; hot is gone */
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_duplicate_returns_first_result)
{
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.sessions_max = 4;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    Kvpb__Command c;
    Kvpb__Increment in;
    kvu_incr_cmd(&c, &in, "ctr", 1, 42, 1);
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_int_eq(u.res.value, 1);
    ck_assert_int_eq(kvu_apply(&u, &c), 0); /* retry */
    ck_assert(u.res.duplicate);
    ck_assert_int_eq(u.res.value, 1);
    ck_assert_uint_eq(u.res.revision, 1);
    char buf[16];
    ck_assert_str_eq(kvu_get(&u, "ctr", buf, sizeof(buf)), "1");
    /* The table survives a tier-down and a restart. */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert(u.res.duplicate);
    ck_assert_int_eq(u.res.value, 1);
    /* Bounded: after 4 newer ones, the oldest is forgotten and applies again. */
    for (uint64_t s = 2; s <= 5; s++) {
        c.seq = s;
        ck_assert_int_eq(kvu_apply(&u, &c), 0);
        ck_assert(!u.res.duplicate);
    }
    c.seq = 1;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert(!u.res.duplicate);
    ck_assert_int_eq(u.res.value, 6);
    c.seq = 5;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert(u.res.duplicate);
    ck_assert_int_eq(u.res.value, 5);
    kvu_close(&u, true);
}
END_TEST

/* The exactly-once table holds a put's short result in its entry (no
 * allocation) and a transaction's longer one allocated: through many
 * forgets (a table of 6), every remembered command, short or long, answers
 * its first result, and an idempotent put allocates nothing in apply. */
START_TEST(test_sessions_hold_short_and_long_results)
{
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.sessions_max = 6;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    enum { N = 40 };
    uint8_t *cmd[N];
    size_t len[N];
    uint64_t rev[N];
    uint64_t allocs = 0;
    for (int i = 0; i < N; i++) {
        Kvpb__Command c = KVPB__COMMAND__INIT;
        Kvpb__Put p = KVPB__PUT__INIT;
        Kvpb__Txn t = KVPB__TXN__INIT;
        Kvpb__Increment in[3];
        Kvpb__Op ops[3], *pops[3];
        c.client_id = 7 + (uint64_t)(i % 3);
        c.seq = 100 + (uint64_t)i;
        if (i % 2 == 0) {
            p.key = kvu_str("k");
            p.value = kvu_str("v");
            c.cmd_case = KVPB__COMMAND__CMD_PUT;
            c.put = &p;
        } else {
            for (int j = 0; j < 3; j++) {
                kvpb__increment__init(&in[j]);
                in[j].key = kvu_str(j == 0 ? "a" : j == 1 ? "b" : "c");
                in[j].delta = 1000 + j;
                pops[j] = mk_op(&ops[j], NULL, NULL, &in[j]);
            }
            t.n_then_ops = 3;
            t.then_ops = pops;
            c.cmd_case = KVPB__COMMAND__CMD_TXN;
            c.txn = &t;
        }
        cmd[i] = kvu_pack(&c, &len[i]);
        rev[i] = kv_sm_applied_index(u.sm) + 1;
        struct tk_alloc_stats a0, a1;
        tk_alloc_stats(&a0);
        ck_assert_int_eq(kv_sm_apply(u.sm, rev[i], 1, u.time_ms, cmd[i], len[i], &u.res),
                         0);
        tk_alloc_stats(&a1);
        if (i % 2 == 0 && i >= 10)
            allocs += a1.calls - a0.calls;
        ck_assert(!u.res.duplicate);
        ck_assert_uint_eq(u.res.revision, rev[i]);
        /* Every command the table still holds answers as it first did. */
        for (int j = i; j >= 0 && j > i - 6; j--) {
            uint64_t idx = kv_sm_applied_index(u.sm) + 1;
            ck_assert_int_eq(kv_sm_apply(u.sm, idx, 1, u.time_ms, cmd[j], len[j], &u.res),
                             0);
            ck_assert(u.res.duplicate);
            ck_assert_uint_eq(u.res.revision, rev[j]);
            ck_assert(u.res.succeeded);
            ck_assert_uint_eq(u.res.n_ops, j % 2 == 0 ? 0 : 3);
            if (j % 2 == 1)
                ck_assert_int_eq(u.res.ops[2].value, (int64_t)(j / 2 + 1) * 1002);
        }
    }
    ck_assert_uint_eq(allocs, 0);
    for (int i = 0; i < N; i++)
        tk_free(cmd[i]);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_bad_input_is_an_error_result_and_consumed)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    struct kv_result res;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0x0f, 0x12};
    ck_assert_int_eq(kv_sm_apply(u.sm, 1, 1, 5, junk, sizeof(junk), &res), 0);
    ck_assert_int_eq(res.code, TK_EINVAL);
    ck_assert_uint_eq(kv_sm_applied_index(u.sm), 1);
    /* An empty command has no operation. */
    ck_assert_int_eq(kv_sm_apply(u.sm, 2, 1, 5, "", 0, &res), 0);
    ck_assert_int_eq(res.code, TK_EINVAL);
    /* Sizes. */
    char *big = tk_malloc((1u << 20) + 2);
    memset(big, 'v', (1u << 20) + 1);
    big[(1u << 20) + 1] = '\0';
    ck_assert_int_eq(kvu_put(&u, "k", big), TK_ETOOBIG);
    big[4097] = '\0';
    ck_assert_int_eq(kvu_put(&u, big, "v"), TK_ETOOBIG);
    ck_assert_int_eq(kvu_put(&u, "", "v"), TK_EINVAL);
    tk_free(big);
    /* Out-of-order index: refused, nothing consumed. */
    ck_assert_int_eq(kv_sm_apply(u.sm, 99, 1, 5, junk, sizeof(junk), &res), TK_EINVAL);
    ck_assert_uint_eq(kv_sm_applied_index(u.sm), 5);
    /* NOOP/CONFIG entries advance the index. */
    ck_assert_int_eq(kv_sm_skip(u.sm, 6, 2, 7), 0);
    ck_assert_uint_eq(kv_sm_applied_index(u.sm), 6);
    ck_assert_uint_eq(kv_sm_applied_term(u.sm), 2);
    ck_assert_int_eq(kv_sm_skip(u.sm, 6, 2, 7), TK_EINVAL);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_scan_merges_hot_and_cold_with_limit)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char k[16];
    for (int i = 0; i < 20; i += 2) { /* even keys cold */
        snprintf(k, sizeof(k), "k%02d", i);
        ck_assert_int_eq(kvu_put(&u, k, "cold"), 0);
    }
    ck_assert_int_eq(kvu_put(&u, "z", "z"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    for (int i = 1; i < 20; i += 2) { /* odd keys hot */
        snprintf(k, sizeof(k), "k%02d", i);
        ck_assert_int_eq(kvu_put(&u, k, "hot"), 0);
    }
    ck_assert_int_eq(kvu_put(&u, "k04", "newer"), 0); /* hot shadows cold */
    ck_assert_int_eq(kvu_del(&u, "k06"), 0);          /* tombstone shadows cold */
    struct collect c = {0};
    struct kv_range pre = {.start = "k", .start_len = 1, .by_prefix = true};
    ck_assert_int_eq(kv_sm_scan(u.sm, &pre, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 19);
    for (int i = 0, j = 0; i < 20; i++) {
        if (i == 6)
            continue;
        snprintf(k, sizeof(k), "k%02d", i);
        ck_assert_str_eq(c.keys[j++], k);
    }
    memset(&c, 0, sizeof(c));
    struct kv_range r = {.start = "k03", .start_len = 3, .end = "k09", .end_len = 3};
    ck_assert_int_eq(kv_sm_scan(u.sm, &r, 4, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 4);
    ck_assert_str_eq(c.keys[0], "k03");
    ck_assert_str_eq(c.keys[1], "k04");
    ck_assert_str_eq(c.keys[2], "k05");
    ck_assert_str_eq(c.keys[3], "k07");
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(u.sm, "k04", 3, &it), 0);
    ck_assert_mem_eq(it.value, "newer", 5);
    kvu_close(&u, true);
}
END_TEST

static int multi_cb(int found, const struct kv_item *it, void *data)
{
    int *n = data;
    if (found == 0)
        *n += (int)it->value_len;
    else
        *n += 100;
    return 0;
}

struct scan_keys {
    int ids[1000];
    int n;
    int damaged; /* this key's value must be its cold copy, "old" */
    bool bad_value;
};

static int scan_keys_cb(const struct kv_item *it, void *data)
{
    struct scan_keys *c = data;
    char want[16];
    int id = atoi((const char *)it->key + 1);
    snprintf(want, sizeof(want), id == c->damaged ? "old" : "v%d", id);
    if (it->value_len != strlen(want) || memcmp(it->value, want, it->value_len) != 0)
        c->bad_value = true; /* a cold value where the hot one is newer, or damage */
    c->ids[c->n++] = id;
    return 0;
}

/* Scans read ahead in the view and the index (16 keys on) and guess each
 * key's index entry: over many hot keys spread across B+tree leaves, with
 * cold copies shadowed by newer values and by tombstones, expired keys, a
 * damaged hot record (its cold copy stands) and every start and limit, a scan
 * returns exactly the live keys in order with their newest values. */
START_TEST(test_scan_reads_ahead_over_many_hot_keys)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    enum { N = 600 };
    char k[16], v[16];
    for (int i = 0; i < N; i += 2) { /* even keys: an old value, cold */
        snprintf(k, sizeof(k), "k%03d", i);
        ck_assert_int_eq(kvu_put(&u, k, "old"), 0);
    }
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    bool live[N];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "k%03d", i);
        snprintf(v, sizeof(v), "v%d", i);
        live[i] = true;
        if (i % 7 == 0) { /* a tombstone over the cold copy (or nothing) */
            ck_assert_int_eq(kvu_del(&u, k), 0);
            live[i] = false;
        } else if (i % 11 == 0) { /* expires below */
            ck_assert_int_eq(kvu_put_ttl(&u, k, v, 500), 0);
            live[i] = false;
        } else {
            ck_assert_int_eq(kvu_put(&u, k, v), 0);
        }
    }
    /* Damage the hot record of k100, whose cold copy says "old". */
    int damaged = 100;
    for (struct kv_page *p = u.sm->ring.head; p != NULL; p = p->next) {
        for (size_t off = 0; off < p->used;) {
            struct kv_rec *h = (struct kv_rec *)(void *)(p->data + off);
            if (h->key_len == 4 && memcmp(h + 1, "k100", 4) == 0 && h->mod_rev > 300)
                ((uint8_t *)(h + 1))[h->key_len] ^= 0x01;
            off += kv__rec_size(h->key_len, h->value_len);
        }
    }
    u.time_ms += 1000; /* the TTL keys expire */
    ck_assert_int_eq(kv_sm_skip(u.sm, kv_sm_applied_index(u.sm) + 1, 1, u.time_ms), 0);
    int want[N], n_want = 0;
    for (int i = 0; i < N; i++)
        if (live[i])
            want[n_want++] = i;
    static const size_t limits[] = {0, 1, 3, 9, 16, 17, 40, 1000};
    for (int start = 0; start < N; start += 37) {
        snprintf(k, sizeof(k), "k%03d", start);
        for (size_t li = 0; li < sizeof(limits) / sizeof(limits[0]); li++) {
            struct scan_keys c = {.damaged = damaged};
            struct kv_range r = {.start = k, .start_len = 4};
            ck_assert_int_eq(kv_sm_scan(u.sm, &r, limits[li], scan_keys_cb, &c), 0);
            int from = 0;
            while (from < n_want && want[from] < start)
                from++;
            int expect = n_want - from;
            if (limits[li] != 0 && (size_t)expect > limits[li])
                expect = (int)limits[li];
            ck_assert_int_eq(c.n, expect);
            for (int i = 0; i < c.n; i++)
                ck_assert_int_eq(c.ids[i], want[from + i]);
            ck_assert(!c.bad_value);
        }
    }
    /* The damaged key: its cold copy, never the damaged record. */
    char buf[16];
    ck_assert_str_eq(kvu_get(&u, "k100", buf, sizeof(buf)), "old");
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_multi_get)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    ck_assert_int_eq(kvu_put(&u, "a", "1"), 0);
    ck_assert_int_eq(kvu_put(&u, "b", "22"), 0);
    struct kv_item keys[3] = {{.key = (const uint8_t *)"a", .key_len = 1},
                              {.key = (const uint8_t *)"x", .key_len = 1},
                              {.key = (const uint8_t *)"b", .key_len = 1}};
    int n = 0;
    ck_assert_int_eq(kv_sm_multi_get(u.sm, keys, 3, multi_cb, &n), 0);
    ck_assert_int_eq(n, 103);
    kvu_close(&u, true);
}
END_TEST

struct multi_check {
    struct kv_sm *sm;
    const struct kv_item *keys;
    size_t next;
    size_t stop_after; /* return nonzero after this many calls (0: never) */
};

/* Each answer must be kv_sm_get's, in order. */
static int multi_check_cb(int found, const struct kv_item *it, void *data)
{
    struct multi_check *m = data;
    const struct kv_item *k = &m->keys[m->next++];
    ck_assert_ptr_eq(it->key, k->key);
    struct kv_item want;
    int rc = kv_sm_get(m->sm, k->key, k->key_len, &want);
    ck_assert_int_eq(found, rc == TK_EINVAL ? TK_ENOTFOUND : rc);
    if (found == 0) {
        ck_assert_uint_eq(it->value_len, want.value_len);
        ck_assert_mem_eq(it->value, want.value, want.value_len);
        ck_assert_uint_eq(it->mod_revision, want.mod_revision);
        ck_assert_uint_eq(it->version, want.version);
    }
    return m->stop_after != 0 && m->next == m->stop_after;
}

/* A multi-get reads ahead over the batch; whatever the batch holds (hits in
 * either tier, misses, empty and over-long keys, duplicates, a damaged hot
 * record) each answer is what kv_sm_get says, in order, and a callback's stop
 * is obeyed. */
START_TEST(test_multi_get_agrees_with_get_over_long_batches)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    enum { N = 200, B = 150 };
    static char names[N][8];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "m%03d", i);
        if (i % 3 != 0)
            ck_assert_int_eq(kvu_put(&u, names[i], names[i] + 1), 0);
        if (i == N / 2)
            ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    }
    ck_assert_int_eq(kvu_put(&u, "m005", "hot over cold"), 0);
    /* Damage one hot record: its cold copy, or nothing, must come back. */
    struct kv_page *p = u.sm->ring.tail;
    struct kv_rec *h = (struct kv_rec *)(void *)(p->data);
    ((uint8_t *)(h + 1))[0] ^= 0x01;
    static char longkey[5000];
    memset(longkey, 'x', sizeof(longkey));
    struct kv_item keys[B];
    struct tk_prng g;
    tk_prng_seed(&g, 11);
    for (int i = 0; i < B; i++) {
        int id = (int)tk_prng_below(&g, N + 20); /* some never written */
        char *k = names[id % N];
        keys[i] = (struct kv_item){.key = (const uint8_t *)k, .key_len = 4};
        if (id >= N)
            keys[i].key_len = 3; /* "mNN": absent */
    }
    keys[7] = (struct kv_item){.key = (const uint8_t *)"", .key_len = 0};
    keys[8] =
        (struct kv_item){.key = (const uint8_t *)longkey, .key_len = sizeof(longkey)};
    keys[9] = keys[10];
    for (size_t n = 0; n <= B; n += n < 20 ? 1 : 13) {
        struct multi_check m = {.sm = u.sm, .keys = keys};
        ck_assert_int_eq(kv_sm_multi_get(u.sm, keys, n, multi_check_cb, &m), 0);
        ck_assert_uint_eq(m.next, n);
    }
    struct multi_check m = {.sm = u.sm, .keys = keys, .stop_after = 17};
    ck_assert_int_eq(kv_sm_multi_get(u.sm, keys, B, multi_check_cb, &m), 0);
    ck_assert_uint_eq(m.next, 17);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_flipped_byte_in_ring_is_never_returned)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char buf[32];
    ck_assert_int_eq(kvu_put(&u, "k", "old-value"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_int_eq(kvu_put(&u, "k", "new-value"), 0);
    ck_assert_int_eq(kvu_put(&u, "h", "hot-only"), 0);
    /* Flip a byte in each hot record's value: the cold copy or nothing. */
    struct kv_page *p = u.sm->ring.head;
    for (size_t off = 0; off < p->used;) {
        struct kv_rec *h = (struct kv_rec *)(void *)(p->data + off);
        ((uint8_t *)(h + 1))[h->key_len + 1] ^= 0x01;
        off += kv__rec_size(h->key_len, h->value_len);
    }
    ck_assert_str_eq(kvu_get(&u, "k", buf, sizeof(buf)), "old-value");
    ck_assert_ptr_null(kvu_get(&u, "h", buf, sizeof(buf)));
    struct collect c = {0};
    struct kv_range all = {0};
    ck_assert_int_eq(kv_sm_scan(u.sm, &all, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 1);
    struct kv_sm_stats st;
    kv_sm_stats(u.sm, &st);
    ck_assert_uint_ge(st.bad_records, 3);
    /* Tier-down skips the damaged records and releases the page. */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_str_eq(kvu_get(&u, "k", buf, sizeof(buf)), "old-value");
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_more_data_than_ring_budget)
{
    struct kvu u = {0};
    kvu_open_small(&u, 64 * 1024, false);
    struct kv_config cfg = u.cfg;
    char k[32], v[128], buf[128];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof(k), "key%05d", i);
        snprintf(v, sizeof(v), "value-%d-%0100d", i, i);
        ck_assert_int_eq(kvu_put(&u, k, v), 0);
    }
    struct kv_sm_stats st;
    kv_sm_stats(u.sm, &st);
    ck_assert_uint_le(st.ring_bytes, cfg.ring_bytes);
    ck_assert_uint_gt(st.tier_downs, 0);
    ck_assert_uint_gt(st.cold_keys, 4000);
    ck_assert_uint_gt(kv_sm_durable_index(u.sm), 4000);
    for (int i = 0; i < 5000; i += 7) {
        snprintf(k, sizeof(k), "key%05d", i);
        snprintf(v, sizeof(v), "value-%d-%0100d", i, i);
        ck_assert_str_eq(kvu_get(&u, k, buf, sizeof(buf)), v);
    }
    kvu_close(&u, true);
}
END_TEST

static void *tier_thread(void *arg)
{
    kv_tier_run(arg);
    return NULL;
}

/* A background tier-down job with a snapshot runs on another thread while the
 * owner keeps applying and reading; the result equals a reference that never
 * tiered, and the stream installs the state as of the job's start. */
START_TEST(test_background_tier_job_runs_beside_applies)
{
    struct kvu a = {0}, r = {0}, b = {0};
    kvu_open_small(&a, 64 * 1024, true);
    struct kv_config cfg = a.cfg;
    kvu_open(&r, NULL);
    kvu_open(&b, NULL);
    char k[32], v[64], buf[64], bufr[64];
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof(k), "key%04d", i % 700);
        snprintf(v, sizeof(v), "v%d", i);
        ck_assert_int_eq(kvu_put_ttl(&a, k, v, i % 9 == 0 ? 50000 : 0), 0);
        ck_assert_int_eq(kvu_put_ttl(&r, k, v, i % 9 == 0 ? 50000 : 0), 0);
    }
    uint64_t d3000;
    ck_assert_int_eq(kv_sm_digest(r.sm, &d3000), 0);

    struct kv_tier_job *j;
    ck_assert_int_eq(kv_sm_tier_start(a.sm, true, &j), 0);
    ck_assert_ptr_nonnull(j);
    struct kv_tier_job *j2;
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j2), TK_EBUSY);
    ck_assert_int_eq(kv_sm_flush(a.sm), TK_EBUSY);
    ck_assert_int_eq(kv_sm_tier_down(a.sm), TK_EBUSY);
    struct kv_install *in;
    ck_assert_int_eq(kv_sm_install_begin(a.sm, &in), TK_EBUSY);
    ck_assert(!kv_sm_tier_wanted(a.sm));

    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, tier_thread, j), 0);
    for (int i = 3000; i < 6000; i++) {
        snprintf(k, sizeof(k), "key%04d", (i * 7) % 900);
        snprintf(v, sizeof(v), "w%d", i);
        if (i % 11 == 0) {
            ck_assert_int_eq(kvu_del(&a, k), 0);
            ck_assert_int_eq(kvu_del(&r, k), 0);
        } else {
            ck_assert_int_eq(kvu_put(&a, k, v), 0);
            ck_assert_int_eq(kvu_put(&r, k, v), 0);
        }
        snprintf(k, sizeof(k), "key%04d", (i * 13) % 900);
        const char *ga = kvu_get(&a, k, buf, sizeof(buf));
        const char *gr = kvu_get(&r, k, bufr, sizeof(bufr));
        ck_assert(ga == NULL ? gr == NULL : gr != NULL && strcmp(ga, gr) == 0);
    }
    /* Past twice the budget with the job in flight: the owner must wait. */
    ck_assert(kv_sm_tier_urgent(a.sm));
    pthread_join(th, NULL);

    struct kv_tier_result res;
    ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &res), 0);
    ck_assert_uint_eq(res.index, 3000);
    ck_assert_ptr_nonnull(res.stream);
    ck_assert_uint_eq(kv_sm_durable_index(a.sm), 3000);
    ck_assert(kv_sm_tier_wanted(a.sm));
    uint64_t da, dr;
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(r.sm, &dr), 0);
    ck_assert_uint_eq(da, dr);

    /* A plain job (no snapshot) moves the oldest pages under budget. */
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j), 0);
    ck_assert_ptr_nonnull(j);
    kv_tier_run(j);
    struct kv_tier_result plain;
    ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &plain), 0);
    ck_assert_ptr_null(plain.stream);
    struct kv_sm_stats st;
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_le(st.ring_bytes, cfg.ring_bytes);
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_uint_eq(da, dr);

    /* The stream of the first job: the state at 3000. */
    ck_assert_int_eq(kv_sm_tier_start(a.sm, true, &j), 0);
    kv_tier_run(j);
    struct kv_tier_result res2;
    ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &res2), 0);
    ck_assert_uint_eq(res2.index, 6000);
    tk_blob_unref(res2.stream);
    ck_assert_int_eq(kv_sm_install_begin(b.sm, &in), 0);
    ck_assert_int_eq(kv_install_write(in, res.stream->data, res.stream->len), 0);
    ck_assert_int_eq(kv_install_commit(in), 0);
    ck_assert_uint_eq(kv_sm_applied_index(b.sm), 3000);
    uint64_t dbb;
    ck_assert_int_eq(kv_sm_digest(b.sm, &dbb), 0);
    ck_assert_uint_eq(dbb, d3000);
    tk_blob_unref(res.stream);
    kvu_close(&a, true);
    kvu_close(&r, true);
    kvu_close(&b, true);
}
END_TEST

/* A snapshot job under the ring budget puts the cold tier at the applied
 * index but releases no page: the keys stay hot, and the next overwrite of one
 * still lands in place. */
START_TEST(test_snapshot_job_keeps_hot_keys_hot)
{
    struct kvu a = {0};
    kvu_open_small(&a, 256 * 1024, true);
    char k[16], v[16];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "key%03d", i);
        snprintf(v, sizeof(v), "v%05d", i);
        ck_assert_int_eq(kvu_put(&a, k, v), 0);
    }
    struct kv_tier_job *j;
    ck_assert_int_eq(kv_sm_tier_start(a.sm, true, &j), 0);
    ck_assert_ptr_nonnull(j);
    kv_tier_run(j);
    struct kv_tier_result res;
    ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &res), 0);
    ck_assert_uint_eq(res.index, 100);
    ck_assert_ptr_nonnull(res.stream);
    tk_blob_unref(res.stream);
    ck_assert_uint_eq(kv_sm_durable_index(a.sm), 100);
    struct kv_sm_stats st;
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.hot_keys, 100);
    ck_assert_uint_eq(st.cold_keys, 100);
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(a.sm, "key042", 6, &it), 0);
    ck_assert(it.hot);
    ck_assert_int_eq(kvu_put(&a, "key042", "w00042"), 0);
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.rewrites, 1);
    kvu_close(&a, true);
}
END_TEST

/* A background job's commit (kv_tier_run_paced) reaches LMDB's fdatasync of
 * its data file through kv's pacing, which liblmdb's call only does if the
 * executable's fdatasync takes it (cold.c); an owner's inline run, a job
 * hurried by the owner and writeback_pace = 0 do not sleep. The state is
 * durable either way: a reopened sm reads every key from the cold tier. */
/* Puts n keys of 599 bytes from key number `from` on, then starts a job
 * (a snapshot job when `snapshot`), hurries it before it runs when `hurry`,
 * runs it paced (as the node's job thread) or as the owner would, and
 * finishes it into *res. */
static void run_job(struct kvu *a, int from, int n, bool snapshot, bool paced, bool hurry,
                    struct kv_tier_result *res)
{
    char k[16], v[600];
    memset(v, 'v', sizeof(v) - 1);
    v[sizeof(v) - 1] = 0;
    for (int i = from; i < from + n; i++) {
        snprintf(k, sizeof(k), "key%06d", i);
        ck_assert_int_eq(kvu_put(a, k, v), 0);
    }
    struct kv_tier_job *j;
    ck_assert_int_eq(kv_sm_tier_start(a->sm, snapshot, &j), 0);
    ck_assert_ptr_nonnull(j);
    if (hurry)
        kv_sm_tier_hurry(a->sm);
    if (paced)
        kv_tier_run_paced(j);
    else
        kv_tier_run(j);
    ck_assert_int_eq(kv_sm_tier_finish(a->sm, j, res), 0);
}

static void tier_job(struct kvu *a, int from, bool paced, bool hurry)
{
    struct kv_tier_result res;
    run_job(a, from, 2000, false, paced, hurry, &res);
}

START_TEST(test_background_commit_is_paced_through_fdatasync)
{
    struct kvu a = {0};
    kv_config_default(&a.cfg);
    a.cfg.map_bytes = (size_t)1 << 30;
    a.cfg.background_tier = true;
    a.dir = kvu_tmpdir();
    struct kv_config cfg = a.cfg; /* no_sync false: LMDB syncs */
    ck_assert_uint_eq(cfg.writeback_pace, 3);
    kvu_open(&a, &cfg);
    struct kv_sm_stats st;
    tier_job(&a, 0, false, false); /* the owner's run: not paced */
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.paced_syncs, 0);
    tier_job(&a, 2000, true, false);
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.paced_syncs, 1); /* LMDB's one fdatasync per commit */
    uint64_t slept = st.paced_slept_ns;
    ck_assert_uint_le(slept, 4000000000u);
    tier_job(&a, 4000, true, true); /* hurried before it ran: no nap */
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.paced_syncs, 2);
    ck_assert_uint_eq(st.paced_slept_ns, slept);
    fprintf(stderr, "paced commit: %llu slices written, %llu us slept\n",
            (unsigned long long)st.paced_slices, (unsigned long long)(slept / 1000));
    kvu_close(&a, false);
    cfg.writeback_pace = 0;
    kvu_open(&a, &cfg);
    tier_job(&a, 6000, true, false);
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_eq(st.paced_syncs, 0);
    ck_assert_uint_eq(st.cold_keys, 8000);
    kvu_close(&a, false);
    cfg.no_sync = true;
    kvu_open(&a, &cfg);
    struct kv_item it;
    for (int i = 0; i < 8000; i += 999) {
        char k[16];
        snprintf(k, sizeof(k), "key%06d", i);
        ck_assert_int_eq(kv_sm_get(a.sm, k, strlen(k), &it), 0);
        ck_assert_uint_eq(it.value_len, 599);
    }
    kvu_close(&a, true);
}
END_TEST

/* A snapshot job's read of the stream (kv_tier_run_paced) sleeps read_pace
 * times the CPU it uses (tk_pace_cpu); the owner's inline run, a hurried job
 * and read_pace = 0 do not sleep, and the stream is whole either way. */
static void snapshot_job(struct kvu *a, int from, bool paced, bool hurry,
                         struct kv_tier_result *res)
{
    run_job(a, from, 1000, true, paced, hurry, res);
    ck_assert_ptr_nonnull(res->stream);
    ck_assert_uint_gt(res->stream->len, (size_t)(from + 1000) * 600);
    tk_blob_unref(res->stream);
}

START_TEST(test_snapshot_job_read_is_paced)
{
    struct kvu a = {0};
    kv_config_default(&a.cfg);
    a.cfg.map_bytes = (size_t)1 << 30;
    a.cfg.background_tier = true;
    a.cfg.no_sync = true;
    a.dir = kvu_tmpdir();
    struct kv_config cfg = a.cfg;
    ck_assert_uint_eq(cfg.read_pace, 3);
    kvu_open(&a, &cfg);
    struct kv_tier_result res;
    snapshot_job(&a, 0, false, false, &res); /* 0.6 MB: under a pace slice, maybe */
    ck_assert_uint_eq(res.read_slept_ns, 0);
    for (int i = 1000; i < 40000; i += 1000) /* 24 MB in the cold tier */
        snapshot_job(&a, i, false, false, &res);
    ck_assert_uint_eq(res.read_slept_ns, 0); /* the owner's run: not paced */
    snapshot_job(&a, 40000, true, false, &res);
    fprintf(stderr, "paced snapshot read: %llu us of CPU, %llu us asleep\n",
            (unsigned long long)(res.read_cpu_ns / 1000),
            (unsigned long long)(res.read_slept_ns / 1000));
    ck_assert_uint_ge(res.read_cpu_ns, TK_PACE_CPU_SLICE_NS);
    ck_assert_uint_eq(res.read_slept_ns, 3 * res.read_cpu_ns);
    snapshot_job(&a, 41000, true, true, &res); /* hurried: no nap */
    ck_assert_uint_eq(res.read_slept_ns, 0);
    kvu_close(&a, false);
    cfg.read_pace = 0;
    kvu_open(&a, &cfg);
    snapshot_job(&a, 42000, true, false, &res);
    ck_assert_uint_eq(res.read_slept_ns, 0);
    kvu_close(&a, true);
}
END_TEST

/* A durable-only job (kv_sm_tier_start_durable) tiers down to the applied
 * index and reads nothing: its result is that index and term with no
 * stream, and the cold tier read out later (kv_sm_snapshot_cold) holds that
 * state; with nothing changed since, it still goes ahead. */
START_TEST(test_durable_job_reads_no_stream)
{
    struct kvu a = {0};
    kvu_open_small(&a, 1u << 20, true);
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof(k), "d%03d", i);
        ck_assert_int_eq(kvu_put(&a, k, "value"), 0);
    }
    uint64_t applied = kv_sm_applied_index(a.sm);
    ck_assert_uint_lt(kv_sm_durable_index(a.sm), applied);
    for (int round = 0; round < 2; round++) { /* the second: nothing changed */
        struct kv_tier_job *j;
        ck_assert_int_eq(kv_sm_tier_start_durable(a.sm, &j), 0);
        ck_assert_ptr_nonnull(j);
        kv_tier_run_paced(j);
        uint64_t idx = 0, term = 0;
        ck_assert(kv_tier_snapshot_at(j, &idx, &term));
        ck_assert_uint_eq(idx, applied);
        struct kv_tier_result res;
        ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &res), 0);
        ck_assert_ptr_null(res.stream);
        ck_assert_uint_eq(res.index, applied);
        ck_assert_uint_eq(res.term, kv_sm_applied_term(a.sm));
        ck_assert_uint_eq(res.read_cpu_ns, 0);
        ck_assert_uint_eq(kv_sm_durable_index(a.sm), applied);
    }
    ck_assert_uint_gt(kv_sm_cold_bytes(a.sm), 0);
    struct kv_snap *snap;
    ck_assert_int_eq(kv_sm_snapshot_cold(a.sm, &snap), 0);
    ck_assert_uint_eq(kv_snap_index(snap), applied);
    struct tk_blob *stream = NULL;
    ck_assert_int_eq(kv_snap_read_all(snap, &stream, NULL, NULL), 0);
    kv_snap_close(snap);
    ck_assert_ptr_nonnull(stream);
    ck_assert_uint_gt(stream->len, 100 * 5);
    tk_blob_unref(stream);
    kvu_close(&a, true);
}
END_TEST

/* Every tier-down trigger runs the same path: with an empty ring and the
 * applied index past the durable one (a NOOP entry after a flush), a
 * background job records the applied index in the cold tier as a flush does. */
START_TEST(test_tier_triggers_record_the_applied_index_alike)
{
    struct kvu a = {0};
    kvu_open_small(&a, 256 * 1024, true);
    ck_assert_int_eq(kvu_put(&a, "k", "v"), 0);
    ck_assert_int_eq(kv_sm_flush(a.sm), 0);
    ck_assert_uint_eq(kv_sm_durable_index(a.sm), 1);
    ck_assert_int_eq(kv_sm_skip(a.sm, 2, 1, a.time_ms), 0);
    struct kv_tier_job *j;
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j), 0);
    ck_assert_ptr_nonnull(j);
    kv_tier_run(j);
    struct kv_tier_result res;
    ck_assert_int_eq(kv_sm_tier_finish(a.sm, j, &res), 0);
    ck_assert_ptr_null(res.stream);
    ck_assert_uint_eq(kv_sm_durable_index(a.sm), 2);
    ck_assert_int_eq(kv_sm_skip(a.sm, 3, 1, a.time_ms), 0);
    ck_assert_int_eq(kv_sm_tier_down(a.sm), 0);
    ck_assert_uint_eq(kv_sm_durable_index(a.sm), 3);
    /* Nothing changed since: no job. */
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j), 0);
    ck_assert_ptr_null(j);
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(a.sm, "k", 1, &it), 0);
    kvu_close(&a, true);
}
END_TEST

/* The op the rewrite test applies at index i: mostly puts of same-length
 * values (rewritten in place), some of another length (appended), some
 * deletes. */
static int rewrite_op(struct kvu *u, uint64_t i)
{
    char k[16], v[32];
    snprintf(k, sizeof(k), "k%03u", (unsigned)((i * 7919) % 400));
    if (i % 13 == 0)
        return kvu_del(u, k);
    if (i % 17 == 0)
        snprintf(v, sizeof(v), "x%u", (unsigned)i);
    else
        snprintf(v, sizeof(v), "v%08u", (unsigned)i);
    return kvu_put(u, k, v);
}

/* Closes u (no flush), reopens it and replays the rewrite ops from its
 * durable index to `upto`; returns the digest. */
static uint64_t rewrite_restart(struct kvu *u, uint64_t upto)
{
    struct kv_config cfg = u->cfg;
    kvu_close(u, false);
    kvu_open(u, &cfg);
    uint64_t durable = kv_sm_durable_index(u->sm);
    ck_assert_uint_eq(kv_sm_applied_index(u->sm), durable);
    for (uint64_t i = durable + 1; i <= upto; i++)
        ck_assert_int_eq(rewrite_op(u, i), 0);
    uint64_t d;
    ck_assert_int_eq(kv_sm_digest(u->sm, &d), 0);
    return d;
}

/* A scan's keys and values folded into one number (FNV-1a over both). */
static int fold_cb(const struct kv_item *it, void *data)
{
    uint64_t *h = data;
    const uint8_t *parts[2] = {it->key, it->value};
    size_t lens[2] = {it->key_len, it->value_len};
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < lens[p]; i++)
            *h = (*h ^ parts[p][i]) * 1099511628211ull;
    *h = (*h ^ 0xff) * 1099511628211ull;
    return 0;
}

static uint64_t scan_fold(struct kvu *u)
{
    uint64_t h = 14695981039346656037ull;
    struct kv_range all = {0};
    ck_assert_int_eq(kv_sm_scan(u->sm, &all, 0, fold_cb, &h), 0);
    return h;
}

/* The finish of a tier-down in slices (kv_sm_tier_publish, then
 * kv_sm_tier_drain a few records at a time) interleaves with apply: between
 * any two slices the owner puts (same-length values, the in-place rewrite
 * case, and other lengths), deletes, reads and scans, and every answer equals
 * a reference that never tiered; a new tier-down first finishes the drain;
 * and a restart from the cold tier gives the same state. */
START_TEST(test_tier_drain_interleaves_with_apply)
{
    struct kvu a = {0}, r = {0};
    kvu_open_small(&a, 64 * 1024, true);
    kvu_open(&r, NULL);
    char buf[64], bufr[64];
    uint64_t i = 1;
    for (; i <= 3000; i++) {
        ck_assert_int_eq(rewrite_op(&a, i), 0);
        ck_assert_int_eq(rewrite_op(&r, i), 0);
    }
    int rounds = 0, slices = 0;
    for (int round = 0; round < 6; round++) {
        struct kv_tier_job *j;
        ck_assert_int_eq(kv_sm_tier_start(a.sm, round % 2 == 0, &j), 0);
        ck_assert_ptr_nonnull(j);
        kv_tier_run(j);
        struct kv_tier_result res;
        ck_assert_int_eq(kv_sm_tier_publish(a.sm, j, &res), 0);
        tk_blob_unref(res.stream);
        if (!a.sm->draining || a.sm->n_tier_rel == 0)
            continue; /* nothing released this round */
        rounds++;
        ck_assert(!kv_sm_tier_wanted(a.sm));
        bool done = false;
        while (!done) {
            done = kv_sm_tier_drain(a.sm, 1 + i % 3);
            slices++;
            for (int k = 0; k < 3; k++, i++) {
                ck_assert_int_eq(rewrite_op(&a, i), 0);
                ck_assert_int_eq(rewrite_op(&r, i), 0);
            }
            char key[16];
            snprintf(key, sizeof(key), "k%03u", (unsigned)((i * 31) % 400));
            const char *ga = kvu_get(&a, key, buf, sizeof(buf));
            const char *gr = kvu_get(&r, key, bufr, sizeof(bufr));
            ck_assert(ga == NULL ? gr == NULL : gr != NULL && strcmp(ga, gr) == 0);
            if (i % 50 < 3)
                ck_assert_uint_eq(scan_fold(&a), scan_fold(&r));
        }
        ck_assert(!a.sm->draining);
        ck_assert_uint_eq(scan_fold(&a), scan_fold(&r));
        /* Leave the next round's drain half done where that is the point:
         * a flush must finish it first. */
        for (int k = 0; k < 2000; k++, i++) {
            ck_assert_int_eq(rewrite_op(&a, i), 0);
            ck_assert_int_eq(rewrite_op(&r, i), 0);
        }
    }
    ck_assert_int_ge(rounds, 3);
    ck_assert_int_gt(slices, 3 * rounds);
    /* A drain left half done: a tier-down (here kv_sm_flush) finishes it. */
    struct kv_tier_job *j;
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j), 0);
    ck_assert_ptr_nonnull(j);
    kv_tier_run(j);
    struct kv_tier_result res;
    ck_assert_int_eq(kv_sm_tier_publish(a.sm, j, &res), 0);
    if (a.sm->draining)
        (void)kv_sm_tier_drain(a.sm, 1);
    ck_assert_int_eq(kv_sm_flush(a.sm), 0);
    ck_assert(!a.sm->draining);
    uint64_t da, dr;
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(r.sm, &dr), 0);
    ck_assert_uint_eq(da, dr);
    /* The cold tier alone holds the state: a restart replays nothing. */
    for (int k = 0; k < 500; k++, i++) {
        ck_assert_int_eq(rewrite_op(&a, i), 0);
        ck_assert_int_eq(rewrite_op(&r, i), 0);
    }
    ck_assert_int_eq(kv_sm_tier_start(a.sm, false, &j), 0);
    if (j != NULL) {
        kv_tier_run(j);
        ck_assert_int_eq(kv_sm_tier_publish(a.sm, j, &res), 0);
        (void)kv_sm_tier_drain(a.sm, 2); /* half done at the restart */
    }
    ck_assert_int_eq(kv_sm_digest(r.sm, &dr), 0);
    ck_assert_uint_eq(rewrite_restart(&a, i - 1), dr);
    kvu_close(&a, true);
    kvu_close(&r, true);
}
END_TEST

/* Ends a job of the rewrite test: joins its thread, or runs it only now (after
 * 150 more applies: the latest a thread could read what they may have
 * changed), then finishes it. */
static void rewrite_job_end(struct kv_sm *sm, struct kv_tier_job *j, bool threaded,
                            pthread_t th, struct kv_tier_result *res)
{
    if (threaded)
        pthread_join(th, NULL);
    else
        kv_tier_run(j);
    ck_assert_int_eq(kv_sm_tier_finish(sm, j, res), 0);
}

/* Records rewritten in place while background tier-downs run, half of them
 * on another thread and half only after 150 more applies: reads match a
 * reference that never tiers, every third job's snapshot holds the
 * reference's state at its start, and after the late-run plain jobs and at
 * the end, a restart without a flush and a replay from the durable index give
 * the reference's state (so the tier-downs wrote the exact state at their
 * index). */
START_TEST(test_rewrites_beside_background_tier_downs_recover)
{
    struct kvu a = {0}, r = {0};
    kvu_open_small(&a, 64 * 1024, true);
    kvu_open(&r, NULL);
    struct kv_tier_job *j = NULL;
    pthread_t th = {0};
    bool threaded = false;
    uint64_t jobs = 0, snaps = 0, restarts = 0, rewrites = 0, d_start = 0;
    char k[16], buf[64], bufr[64];
    const uint64_t n = 30111;
    for (uint64_t i = 1; i <= n; i++) {
        ck_assert_int_eq(rewrite_op(&a, i), 0);
        ck_assert_int_eq(rewrite_op(&r, i), 0);
        if (j == NULL && i % 400 == 0) {
            ck_assert_int_eq(kv_sm_tier_start(a.sm, i % 1200 == 0, &j), 0);
            ck_assert_int_eq(kv_sm_digest(r.sm, &d_start), 0);
            threaded = jobs % 2 == 0;
            if (j != NULL && threaded)
                ck_assert_int_eq(pthread_create(&th, NULL, tier_thread, j), 0);
        } else if (j != NULL && (i % 400 == 150 || kv_sm_tier_urgent(a.sm))) {
            struct kv_tier_result res;
            rewrite_job_end(a.sm, j, threaded, th, &res);
            bool snap = res.stream != NULL;
            if (snap) { /* the state as of the job's start */
                struct kvu b = {0};
                kvu_open(&b, NULL);
                struct kv_install *in;
                ck_assert_int_eq(kv_sm_install_begin(b.sm, &in), 0);
                ck_assert_int_eq(kv_install_write(in, res.stream->data, res.stream->len),
                                 0);
                ck_assert_int_eq(kv_install_commit(in), 0);
                uint64_t db;
                ck_assert_int_eq(kv_sm_digest(b.sm, &db), 0);
                ck_assert_uint_eq(db, d_start);
                kvu_close(&b, true);
                snaps++;
            }
            tk_blob_unref(res.stream);
            j = NULL;
            jobs++;
            if (!threaded && !snap) { /* the cold tier alone, replayed */
                struct kv_sm_stats st;
                kv_sm_stats(a.sm, &st);
                rewrites += st.rewrites;
                uint64_t dr;
                ck_assert_int_eq(kv_sm_digest(r.sm, &dr), 0);
                ck_assert_uint_eq(rewrite_restart(&a, i), dr);
                restarts++;
            }
        }
        snprintf(k, sizeof(k), "k%03u", (unsigned)((i * 31) % 400));
        const char *ga = kvu_get(&a, k, buf, sizeof(buf));
        const char *gr = kvu_get(&r, k, bufr, sizeof(bufr));
        ck_assert(ga == NULL ? gr == NULL : gr != NULL && strcmp(ga, gr) == 0);
    }
    if (j != NULL) {
        struct kv_tier_result res;
        rewrite_job_end(a.sm, j, threaded, th, &res);
        tk_blob_unref(res.stream);
        jobs++;
    }
    struct kv_sm_stats st;
    kv_sm_stats(a.sm, &st);
    ck_assert_uint_gt(rewrites + st.rewrites, n / 10);
    ck_assert_uint_gt(jobs, 50);
    ck_assert_uint_gt(snaps, 20);
    ck_assert_uint_gt(restarts, 20);
    uint64_t da, dr;
    ck_assert_int_eq(kv_sm_digest(r.sm, &dr), 0);
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_uint_eq(da, dr);
    uint64_t durable = kv_sm_durable_index(a.sm);
    ck_assert_uint_gt(durable, 0);
    ck_assert_uint_lt(durable, n);
    ck_assert_uint_eq(rewrite_restart(&a, n), dr);
    kvu_close(&a, true);
    kvu_close(&r, true);
}
END_TEST

/* kv_sm_prefetch is only a hint: any input, no change of state. */
START_TEST(test_prefetch_is_a_harmless_hint)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    ck_assert_int_eq(kvu_put(&u, "a", "1"), 0);
    uint64_t d0, d1;
    ck_assert_int_eq(kv_sm_digest(u.sm, &d0), 0);
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    p.key = kvu_str("a");
    p.value = kvu_str("2");
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    size_t len;
    uint8_t *buf = kvu_pack(&c, &len);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    uint64_t h = 0;
    ck_assert(kv_sm_prefetch(u.sm, buf, len, &h));
    kv_sm_prefetch_record(u.sm, h);
    kv_sm_prefetch_record(u.sm, h ^ 0x5555);
    ck_assert(!kv_sm_prefetch(u.sm, buf, len / 2, &h));
    (void)kv_sm_prefetch(u.sm, junk, sizeof(junk), &h);
    ck_assert(!kv_sm_prefetch(u.sm, NULL, 0, &h));
    tk_free(buf);
    ck_assert_int_eq(kv_sm_digest(u.sm, &d1), 0);
    ck_assert_uint_eq(d0, d1);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_restart_recovers_from_cold_and_replay)
{
    struct kvu u = {0};
    kvu_open_small(&u, 32 * 1024, false);
    struct kv_config cfg = u.cfg;
    /* Keep the commands: they are the raft log. */
    enum { N = 3000 };
    uint8_t **log = tk_malloc(N * sizeof(*log));
    size_t *lens = tk_malloc(N * sizeof(*lens));
    char k[32], v[64];
    for (int i = 0; i < N; i++) {
        Kvpb__Command c = KVPB__COMMAND__INIT;
        Kvpb__Put p = KVPB__PUT__INIT;
        Kvpb__Increment in = KVPB__INCREMENT__INIT;
        snprintf(k, sizeof(k), "key%03d", i % 500);
        snprintf(v, sizeof(v), "v%d", i);
        if (i % 3 == 0) {
            in.key = kvu_str("counter");
            in.delta = i;
            c.cmd_case = KVPB__COMMAND__CMD_INCR;
            c.incr = &in;
        } else {
            p.key = kvu_str(k);
            p.value = kvu_str(v);
            c.cmd_case = KVPB__COMMAND__CMD_PUT;
            c.put = &p;
        }
        log[i] = kvu_pack(&c, &lens[i]);
        struct kv_result res;
        ck_assert_int_eq(kv_sm_apply(u.sm, (uint64_t)i + 1, 1, 1000 + (uint64_t)i, log[i],
                                     lens[i], &res),
                         0);
    }
    uint64_t want;
    ck_assert_int_eq(kv_sm_digest(u.sm, &want), 0);
    uint64_t durable = kv_sm_durable_index(u.sm);
    ck_assert_uint_gt(durable, 0);
    ck_assert_uint_lt(durable, N);
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    ck_assert_uint_eq(kv_sm_applied_index(u.sm), durable);
    for (uint64_t i = durable; i < N; i++) {
        struct kv_result res;
        ck_assert_int_eq(kv_sm_apply(u.sm, i + 1, 1, 1000 + i, log[i], lens[i], &res), 0);
    }
    uint64_t got;
    ck_assert_int_eq(kv_sm_digest(u.sm, &got), 0);
    ck_assert_uint_eq(got, want);
    for (int i = 0; i < N; i++)
        tk_free(log[i]);
    tk_free(log);
    tk_free(lens);
    kvu_close(&u, true);
}
END_TEST

/* Reads a snapshot view's whole stream in chunks of `chunk` bytes (at most
 * 4096) into a new tk_malloc'd buffer. */
static uint8_t *snap_read_all(struct kv_snap *s, size_t chunk, size_t *len)
{
    uint8_t *stream = NULL;
    uint8_t buf[4096];
    *len = 0;
    for (;;) {
        size_t n;
        ck_assert_int_eq(kv_snap_read(s, buf, chunk, &n), 0);
        if (n == 0)
            return stream;
        stream = tk_realloc(stream, *len + n);
        memcpy(stream + *len, buf, n);
        *len += n;
    }
}

START_TEST(test_snapshot_stream_installs_identical_state)
{
    struct kvu a = {0}, b = {0};
    kvu_open(&a, NULL);
    kvu_open(&b, NULL);
    ck_assert_int_eq(kvu_fill_snapshot_source(&a, 2000), 0);
    ck_assert_int_eq(kvu_put(&b, "junk", "to be replaced"), 0);
    struct kv_snap *s;
    ck_assert_int_eq(kv_sm_snapshot(a.sm, &s), 0);
    ck_assert_uint_eq(kv_snap_index(s), 2001);
    /* a keeps applying: the stream is the view at 2001. */
    ck_assert_int_eq(kvu_put(&a, "later", "x"), 0);
    size_t len = 0;
    uint8_t *stream = snap_read_all(s, 777, &len);
    /* While a's view is open, a cannot install over itself. */
    struct kv_install *busy;
    ck_assert_int_eq(kv_sm_install_begin(a.sm, &busy), TK_EBUSY);
    kv_snap_close(s);
    /* A damaged stream is refused and b keeps its state. */
    struct kv_install *in1;
    ck_assert_int_eq(kv_sm_install_begin(b.sm, &in1), 0);
    stream[len / 2] ^= 0x40;
    int rc = kv_install_write(in1, stream, len);
    if (rc == 0)
        rc = kv_install_commit(in1);
    ck_assert_int_eq(rc, TK_ECORRUPT);
    kv_install_abort(in1);
    stream[len / 2] ^= 0x40;
    char buf[32];
    ck_assert_str_eq(kvu_get(&b, "junk", buf, sizeof(buf)), "to be replaced");
    /* A truncated stream is refused too. */
    ck_assert_int_eq(kv_sm_install_begin(b.sm, &in1), 0);
    ck_assert_int_eq(kv_install_write(in1, stream, len - 1), 0);
    ck_assert_int_eq(kv_install_commit(in1), TK_ECORRUPT);
    kv_install_abort(in1);
    /* The whole stream, in odd pieces. */
    struct kv_install *in2;
    ck_assert_int_eq(kv_sm_install_begin(b.sm, &in2), 0);
    for (size_t off = 0; off < len; off += 1000) {
        size_t n = len - off < 1000 ? len - off : 1000;
        ck_assert_int_eq(kv_install_write(in2, stream + off, n), 0);
    }
    ck_assert_int_eq(kv_install_commit(in2), 0);
    ck_assert_uint_eq(kv_sm_applied_index(b.sm), 2001);
    ck_assert_ptr_null(kvu_get(&b, "junk", buf, sizeof(buf)));
    ck_assert_ptr_null(kvu_get(&b, "later", buf, sizeof(buf)));
    ck_assert_int_eq(kvu_put(&b, "later", "x"), 0);
    uint64_t da, db;
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(b.sm, &db), 0);
    ck_assert_uint_eq(da, db);
    /* The exactly-once table came along: the source's increment, again. */
    Kvpb__Command c;
    Kvpb__Increment in;
    kvu_incr_cmd(&c, &in, "ctr", 9, 7, 1);
    ck_assert_int_eq(kvu_apply(&b, &c), 0);
    ck_assert(b.res.duplicate);
    ck_assert_int_eq(b.res.value, 9);
    /* And it survives b's restart. */
    kvu_close(&b, false);
    kvu_open(&b, &b.cfg);
    ck_assert_uint_eq(kv_sm_applied_index(b.sm), 2001);
    tk_free(stream);
    kvu_close(&a, true);
    kvu_close(&b, true);
}
END_TEST

/* The node installs a leader's snapshot off its loop: begin and commit on
 * the owner thread, the stream's writes and the new environment's commit and
 * sync (prepare) on another thread, while the owner goes on reading the old
 * state. A damaged stream fails on that thread, which aborts it there, and
 * the old state stays. */
struct install_job {
    struct kv_install *in;
    const uint8_t *p;
    size_t len;
    int rc;
};

static void *install_thread(void *arg)
{
    struct install_job *j = arg;
    for (size_t off = 0; off < j->len && j->rc == 0; off += 4096) {
        size_t n = j->len - off < 4096 ? j->len - off : 4096;
        j->rc = kv_install_write(j->in, j->p + off, n);
    }
    if (j->rc == 0)
        j->rc = kv_install_prepare(j->in);
    if (j->rc != 0) {
        kv_install_abort(j->in);
        j->in = NULL;
    }
    return NULL;
}

START_TEST(test_install_writes_on_another_thread)
{
    struct kvu a = {0}, b = {0};
    kvu_open(&a, NULL);
    kvu_open(&b, NULL);
    char k[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof(k), "key%04d", i);
        ck_assert_int_eq(kvu_put(&a, k, k), 0);
    }
    ck_assert_int_eq(kvu_put(&b, "junk", "to be replaced"), 0);
    struct kv_snap *s;
    ck_assert_int_eq(kv_sm_snapshot(a.sm, &s), 0);
    size_t len = 0;
    uint8_t *stream = snap_read_all(s, 4096, &len);
    kv_snap_close(s);
    char buf[32];
    for (int bad = 1; bad >= 0; bad--) {
        if (bad)
            stream[len / 3] ^= 0x10;
        struct install_job j = {.p = stream, .len = len};
        char link[PATH_MAX], before[64] = "", after[64] = "";
        snprintf(link, sizeof(link), "%s/cold", b.dir);
        ck_assert_int_gt(readlink(link, before, sizeof(before) - 1), 0);
        ck_assert_int_eq(kv_sm_install_begin(b.sm, &j.in), 0);
        /* The new environment is the writer's to make, not the owner's
         * (its loop): none yet. */
        unsigned long long gen = 0;
        ck_assert_int_eq(sscanf(before, "cold.%llu", &gen), 1);
        char next[PATH_MAX + 32];
        struct stat st;
        snprintf(next, sizeof(next), "%s/cold.%llu", b.dir, gen + 1);
        ck_assert_int_ne(stat(next, &st), 0);
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, install_thread, &j), 0);
        for (int i = 0; i < 100; i++) /* the owner reads the old state meanwhile */
            ck_assert_str_eq(kvu_get(&b, "junk", buf, sizeof(buf)), "to be replaced");
        ck_assert_int_eq(pthread_join(t, NULL), 0);
        ck_assert_uint_eq(kv_sm_applied_index(b.sm), 1);
        if (bad) {
            ck_assert_int_eq(j.rc, TK_ECORRUPT);
            ck_assert_ptr_null(j.in);
            ck_assert_str_eq(kvu_get(&b, "junk", buf, sizeof(buf)), "to be replaced");
            stream[len / 3] ^= 0x10;
            continue;
        }
        ck_assert_int_eq(j.rc, 0);
        /* Prepared is published: the directory names the new environment
         * (a reopen finds the snapshot), while the old state is served. */
        ck_assert_int_gt(readlink(link, after, sizeof(after) - 1), 0);
        ck_assert_str_ne(before, after);
        ck_assert_str_eq(kvu_get(&b, "junk", buf, sizeof(buf)), "to be replaced");
        ck_assert_int_eq(kv_install_commit(j.in), 0);
    }
    ck_assert_uint_eq(kv_sm_applied_index(b.sm), 3000);
    /* What the install replaced is left for the owner to free off its loop:
     * handed out once, the old environment's data still there until
     * kv_trash_free. */
    char trash[PATH_MAX], f[PATH_MAX + 64];
    struct kv_trash *t = kv_sm_install_trash(b.sm);
    ck_assert_ptr_nonnull(t);
    ck_assert(kv_sm_install_trash(b.sm) == NULL || !"the trash is handed out once");
    snprintf(trash, sizeof(trash), "%s", kv_trash_path(t));
    snprintf(f, sizeof(f), "%s/data.mdb", trash);
    ck_assert_int_eq(access(f, F_OK), 0);
    kv_trash_free(t);
    ck_assert_int_ne(access(f, F_OK), 0);
    ck_assert_int_ne(access(trash, F_OK), 0);
    ck_assert_ptr_null(kvu_get(&b, "junk", buf, sizeof(buf)));
    /* The installed file was just written: its pages are in the page cache
     * (kv_sm_cold_resident: mincore over its used part), and no more. */
    struct kv_sm_stats st;
    kv_sm_stats(b.sm, &st);
    uint64_t res = kv_sm_cold_resident(b.sm);
    ck_assert_uint_gt(res, 0);
    ck_assert_uint_le(res, st.cold_bytes + 4096);
    uint64_t da, db;
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(b.sm, &db), 0);
    ck_assert_uint_eq(da, db);
    /* A replaced environment a crash left behind goes at the next open. */
    char stale[PATH_MAX];
    snprintf(stale, sizeof(stale), "%s/cold.99", b.cfg.dir);
    ck_assert_int_eq(mkdir(stale, 0755), 0);
    snprintf(f, sizeof(f), "%s/data.mdb", stale);
    FILE *fp = fopen(f, "w");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    kvu_close(&b, false); /* the swapped-in state is the durable one */
    kvu_open(&b, &b.cfg);
    ck_assert_uint_eq(kv_sm_applied_index(b.sm), 3000);
    ck_assert_int_ne(access(stale, F_OK), 0);
    tk_free(stream);
    kvu_close(&a, true);
    kvu_close(&b, true);
}
END_TEST

START_TEST(test_digest_differs_on_different_state)
{
    /* The digest is a checker: it must tell different states apart. */
    struct kvu a = {0}, b = {0};
    kvu_open(&a, NULL);
    kvu_open(&b, NULL);
    ck_assert_int_eq(kvu_put(&a, "k", "v"), 0);
    ck_assert_int_eq(kvu_put(&b, "k", "w"), 0);
    uint64_t da, db;
    ck_assert_int_eq(kv_sm_digest(a.sm, &da), 0);
    ck_assert_int_eq(kv_sm_digest(b.sm, &db), 0);
    ck_assert_uint_ne(da, db);
    kvu_close(&a, true);
    kvu_close(&b, true);
}
END_TEST

START_TEST(test_result_encoding_roundtrips)
{
    struct kv_result r = {.code = TK_ECOMPARE,
                          .revision = 77,
                          .succeeded = true,
                          .value = -5,
                          .deleted = 3,
                          .n_ops = 2};
    r.ops[0].value = INT64_MIN;
    r.ops[1].deleted = 1;
    uint8_t buf[KV_RESULT_ENCODED_MAX];
    size_t n = kv_result_encode(&r, buf);
    struct kv_result d;
    ck_assert_int_eq(kv_result_decode(buf, n, &d), 0);
    ck_assert_int_eq(d.code, TK_ECOMPARE);
    ck_assert_uint_eq(d.revision, 77);
    ck_assert(d.succeeded);
    ck_assert_int_eq(d.value, -5);
    ck_assert_uint_eq(d.deleted, 3);
    ck_assert_uint_eq(d.n_ops, 2);
    ck_assert_int_eq(d.ops[0].value, INT64_MIN);
    ck_assert_uint_eq(d.ops[1].deleted, 1);
    ck_assert_int_eq(kv_result_decode("\xff\xff", 2, &d), TK_EPROTO);

    /* The most ops a result holds decode (kv_result_decode unpacks into an
     * arena on its stack sized for them) ... */
    static struct kv_result full;
    full.n_ops = KV_TXN_OPS_MAX;
    for (uint32_t i = 0; i < KV_TXN_OPS_MAX; i++)
        full.ops[i].value = (int64_t)i - 64;
    static uint8_t two[2 * KV_RESULT_ENCODED_MAX];
    n = kv_result_encode(&full, two);
    static struct kv_result fd;
    ck_assert_int_eq(kv_result_decode(two, n, &fd), 0);
    ck_assert_uint_eq(fd.n_ops, KV_TXN_OPS_MAX);
    ck_assert_int_eq(fd.ops[KV_TXN_OPS_MAX - 1].value, KV_TXN_OPS_MAX - 1 - 64);
    /* ... and twice as many (two encodings back to back: protobuf merges
     * their repeated fields) are refused, not written past the arena. */
    memcpy(two + n, two, n);
    ck_assert_int_eq(kv_result_decode(two, 2 * n, &fd), TK_EPROTO);
}
END_TEST

/* A result without ops is encoded by hand (codec.c's encode_plain): its bytes
 * are protobuf-c's, the same on every replica's session records, for random
 * fields of every width: zero, small, 2^k - 1 and 2^k edges, negative. */
static uint64_t edge_u64(struct tk_prng *r)
{
    switch (tk_prng_below(r, 5)) {
    case 0:
        return 0;
    case 1:
        return tk_prng_below(r, 300);
    case 2: {
        unsigned k = (unsigned)tk_prng_below(r, 64);
        return ((uint64_t)1 << k) - tk_prng_below(r, 2);
    }
    case 3:
        return UINT64_MAX - tk_prng_below(r, 3);
    default:
        return tk_prng_next(r);
    }
}

START_TEST(test_result_encoding_without_ops_is_protobuf_c_s)
{
    struct tk_prng r;
    tk_prng_seed(&r, 53);
    for (int i = 0; i < 20000; i++) {
        struct kv_result k = {0};
        k.code = (int)(int32_t)edge_u64(&r);
        k.revision = edge_u64(&r);
        k.succeeded = tk_prng_below(&r, 2);
        k.value = (int64_t)edge_u64(&r);
        k.deleted = edge_u64(&r);
        k.more = tk_prng_below(&r, 2);
        if (i % 7 == 0)
            k.code = 0;
        Kvpb__Result m = KVPB__RESULT__INIT;
        m.code = k.code;
        m.revision = k.revision;
        m.succeeded = k.succeeded;
        m.value = k.value;
        m.deleted = k.deleted;
        m.more = k.more;
        uint8_t want[KV_RESULT_ENCODED_MAX], got[KV_RESULT_ENCODED_MAX];
        size_t wn = kvpb__result__pack(&m, want);
        size_t gn = kv_result_encode(&k, got);
        ck_assert_uint_eq(gn, wn);
        ck_assert(memcmp(got, want, wn) == 0);
        struct kv_result d;
        ck_assert_int_eq(kv_result_decode(got, gn, &d), 0);
        ck_assert_int_eq(d.code, k.code);
        ck_assert_uint_eq(d.revision, k.revision);
        ck_assert_int_eq(d.value, k.value);
        ck_assert_uint_eq(d.deleted, k.deleted);
        ck_assert_int_eq(d.succeeded, k.succeeded);
        ck_assert_int_eq(d.more, k.more);
        ck_assert_uint_eq(d.n_ops, 0);
    }
}
END_TEST

START_TEST(test_long_keys_in_the_cold_tier)
{
    /* LMDB keys stop at 511 bytes; longer keys (up to key_max) still work. */
    struct kvu u = {0};
    kvu_open(&u, NULL);
    char *k[4];
    for (int i = 0; i < 4; i++) {
        k[i] = tk_malloc(4097);
        memset(k[i], 'p', 4096);
        k[i][4096] = '\0';
    }
    k[0][600] = '\0'; /* 600 bytes */
    k[1][4000] = 'b'; /* 4096 bytes, same 488-byte prefix */
    k[2][4095] = 'a';
    k[3][100] = '\0'; /* short */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(kvu_put(&u, k[i], i % 2 ? "odd" : "even"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    char buf[16];
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(kvu_get(&u, k[i], buf, sizeof(buf)), i % 2 ? "odd" : "even");
    k[2][4095] = 'z';
    ck_assert_ptr_null(kvu_get(&u, k[2], buf, sizeof(buf)));
    k[2][4095] = 'a';
    struct kv_range pre = {.start = k[3], .start_len = 100, .by_prefix = true};
    struct collect c = {0};
    ck_assert_int_eq(kv_sm_scan(u.sm, &pre, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 4);
    /* Scans starting inside the long keys skip those below the start. */
    memset(&c, 0, sizeof(c));
    struct kv_range from = {.start = k[1], .start_len = 4096};
    ck_assert_int_eq(kv_sm_scan(u.sm, &from, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 2); /* k[1], k[2] */
    /* A hot version of a long key shadows its cold one exactly once. */
    ck_assert_int_eq(kvu_put(&u, k[2], "hot"), 0);
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(kv_sm_scan(u.sm, &pre, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 4);
    struct kv_range below = {
        .start = k[3], .start_len = 100, .end = k[1], .end_len = 4096};
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(kv_sm_scan(u.sm, &below, 0, collect_cb, &c), 0);
    ck_assert_int_eq(c.n, 2); /* k[3], k[0] */
    ck_assert_int_eq(kvu_del(&u, k[1]), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_ptr_null(kvu_get(&u, k[1], buf, sizeof(buf)));
    for (int i = 0; i < 4; i++)
        tk_free(k[i]);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_fast_decoder_agrees_with_protobuf_c)
{
    /* Mutated encodings: whatever the fast path accepts, protobuf-c decodes
     * to the same command. */
    struct tk_prng r;
    tk_prng_seed(&r, 99);
    uint8_t base[3][64];
    size_t blen[3];
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    Kvpb__Delete d = KVPB__DELETE__INIT;
    p.key = kvu_str("key");
    p.value = kvu_str("value");
    p.ttl_ms = 300;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    c.client_id = 5;
    c.seq = 1234567;
    blen[0] = kvpb__command__pack(&c, base[0]);
    c.client_id = 0;
    p.ttl_ms = 0;
    blen[1] = kvpb__command__pack(&c, base[1]);
    d.key = kvu_str("gone");
    c.cmd_case = KVPB__COMMAND__CMD_DEL;
    c.del = &d;
    blen[2] = kvpb__command__pack(&c, base[2]);
    int accepted = 0;
    for (int i = 0; i < 30000; i++) {
        uint8_t buf[80];
        int b = (int)tk_prng_below(&r, 3);
        size_t len = blen[b];
        memcpy(buf, base[b], len);
        int muts = (int)tk_prng_below(&r, 3);
        for (int m = 0; m < muts; m++) {
            uint64_t what = tk_prng_below(&r, 3);
            if (what == 0 && len > 0)
                buf[tk_prng_below(&r, len)] = (uint8_t)tk_prng_next(&r);
            else if (what == 1 && len > 0)
                len = tk_prng_below(&r, len);
            else if (len < sizeof(buf))
                buf[len++] = (uint8_t)tk_prng_next(&r);
        }
        Kvpb__Command fc;
        Kvpb__Put fp;
        Kvpb__Delete fd;
        if (!kv__fast_decode(buf, len, &fc, &fp, &fd))
            continue;
        accepted++;
        Kvpb__Command *pc = kvpb__command__unpack(NULL, len, buf);
        ck_assert_ptr_nonnull(pc);
        ck_assert_int_eq(pc->cmd_case, fc.cmd_case);
        ck_assert_uint_eq(pc->client_id, fc.client_id);
        ck_assert_uint_eq(pc->seq, fc.seq);
        if (fc.cmd_case == KVPB__COMMAND__CMD_PUT) {
            ck_assert_ptr_null(pc->put->cond);
            ck_assert_uint_eq(pc->put->key.len, fp.key.len);
            ck_assert(fp.key.len == 0 ||
                      memcmp(pc->put->key.data, fp.key.data, fp.key.len) == 0);
            ck_assert_uint_eq(pc->put->value.len, fp.value.len);
            ck_assert(fp.value.len == 0 ||
                      memcmp(pc->put->value.data, fp.value.data, fp.value.len) == 0);
            ck_assert_uint_eq(pc->put->ttl_ms, fp.ttl_ms);
        } else {
            ck_assert_uint_eq(pc->del->key.len, fd.key.len);
            ck_assert(fd.key.len == 0 ||
                      memcmp(pc->del->key.data, fd.key.data, fd.key.len) == 0);
        }
        kvpb__command__free_unpacked(pc, NULL);
    }
    ck_assert_int_gt(accepted, 1000); /* the test exercises the fast path */
}
END_TEST

START_TEST(test_tier_down_writes_each_keys_newest_version)
{
    /* Tier-down sorts its pages' records by key and writes the last of each
     * key's run. Keys here share their first 8 bytes (or are a prefix of
     * each other), and several versions of each lie in the tiered pages, in
     * an order that differs from key order every round. After each
     * tier-down and after a restart (the cold tier alone), every key holds
     * its newest value and version. */
    static const char *keys[] = {"prefix0",    "prefix00", "prefix00a", "prefix00b",
                                 "prefix00ab", "prefix01", "p",         "prefix00\x01"};
    enum { NK = sizeof(keys) / sizeof(keys[0]), ROUNDS = 300 };
    struct kvu u = {0};
    kvu_open_small(&u, 64 * 1024, false);
    char v[64], buf[64];
    for (int round = 0; round < ROUNDS; round++) {
        for (int j = 0; j < NK; j++) {
            int i = (j * 3 + round) % NK;
            snprintf(v, sizeof(v), "%s@%d", keys[i], round);
            ck_assert_int_eq(kvu_put(&u, keys[i], v), 0);
        }
        if (round % 50 == 49)
            ck_assert_int_eq(kv_sm_tier_down(u.sm), 0);
    }
    struct kv_sm_stats st;
    kv_sm_stats(u.sm, &st);
    ck_assert_uint_gt(st.tier_downs, 5);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NK; i++) {
            struct kv_item it;
            ck_assert_int_eq(kv_sm_get(u.sm, keys[i], strlen(keys[i]), &it), 0);
            snprintf(v, sizeof(v), "%s@%d", keys[i], ROUNDS - 1);
            ck_assert_uint_eq(it.value_len, strlen(v));
            ck_assert_mem_eq(it.value, v, it.value_len);
            ck_assert_uint_eq(it.version, ROUNDS);
        }
        ck_assert_ptr_null(kvu_get(&u, "prefix00a\x01", buf, sizeof(buf)));
        /* Restart from the cold tier alone (what the ring held is lost, as
         * after a crash; the flush put it all in LMDB first). */
        ck_assert_int_eq(kv_sm_flush(u.sm), 0);
        kvu_close(&u, false);
        struct kv_config cfg = u.cfg;
        kvu_open(&u, &cfg);
    }
    kvu_close(&u, true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ring_record_reads_back_and_checks);
    tcase_add_test(tc, test_ring_flipped_byte_fails_check);
    tcase_add_test(tc, test_ring_pages_roll_and_release);
    tcase_add_test(tc, test_index_grows_incrementally_and_finds_every_key);
    tcase_add_test(tc, test_view_keeps_byte_order);
    tcase_add_test(tc, test_view_matches_a_sorted_reference);
    tcase_add_test(tc, test_view_of_steady_size_allocates_nothing);
    tcase_add_test(tc, test_ring_crc_matches_crc32c);
    tcase_add_test(tc, test_put_get_revisions_and_versions);
    tcase_add_test(tc, test_put_compare_version_revision_value_absence);
    tcase_add_test(tc, test_delete_existing_and_absent);
    tcase_add_test(tc, test_delete_range_and_prefix_across_tiers);
    tcase_add_test(tc, test_delete_range_spares_reserved_keys);
    tcase_add_test(tc, test_delete_range_bound_one_past_key_max);
    tcase_add_test(tc, test_increment_counts_and_rejects_non_integers);
    tcase_add_test(tc, test_batch_is_atomic);
    tcase_add_test(tc, test_txn_then_else_and_atomic_failure);
    tcase_add_test(tc, test_ttl_expires_by_entry_time_in_both_tiers);
    tcase_add_test(tc, test_duplicate_returns_first_result);
    tcase_add_test(tc, test_sessions_hold_short_and_long_results);
    tcase_add_test(tc, test_bad_input_is_an_error_result_and_consumed);
    tcase_add_test(tc, test_scan_merges_hot_and_cold_with_limit);
    tcase_add_test(tc, test_scan_reads_ahead_over_many_hot_keys);
    tcase_add_test(tc, test_multi_get);
    tcase_add_test(tc, test_multi_get_agrees_with_get_over_long_batches);
    tcase_add_test(tc, test_flipped_byte_in_ring_is_never_returned);
    tcase_add_test(tc, test_more_data_than_ring_budget);
    tcase_add_test(tc, test_background_tier_job_runs_beside_applies);
    tcase_add_test(tc, test_tier_drain_interleaves_with_apply);
    tcase_add_test(tc, test_tier_triggers_record_the_applied_index_alike);
    tcase_add_test(tc, test_rewrites_beside_background_tier_downs_recover);
    tcase_add_test(tc, test_snapshot_job_keeps_hot_keys_hot);
    tcase_add_test(tc, test_prefetch_is_a_harmless_hint);
    tcase_add_test(tc, test_restart_recovers_from_cold_and_replay);
    tcase_add_test(tc, test_snapshot_stream_installs_identical_state);
    tcase_add_test(tc, test_install_writes_on_another_thread);
    tcase_add_test(tc, test_digest_differs_on_different_state);
    tcase_add_test(tc, test_result_encoding_roundtrips);
    tcase_add_test(tc, test_fast_decoder_agrees_with_protobuf_c);
    tcase_add_test(tc, test_result_encoding_without_ops_is_protobuf_c_s);
    tcase_add_test(tc, test_long_keys_in_the_cold_tier);
    tcase_add_test(tc, test_tier_down_writes_each_keys_newest_version);
    tcase_add_test(tc, test_background_commit_is_paced_through_fdatasync);
    tcase_add_test(tc, test_snapshot_job_read_is_paced);
    tcase_add_test(tc, test_durable_job_reads_no_stream);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
