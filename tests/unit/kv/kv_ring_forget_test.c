/* The ring gives back the memory of free slab pages past its keep (issue 19):
 * a ring filled to 16 pages and drained keeps at most keep_free_bytes of free
 * pages in memory (mincore says the others are not resident), and a
 * forgotten page, reused, holds new records intact. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv/kv_internal.h"
#include "tests/check_run.h"

#define PAGE (64u << 10)
#define VAL 4000

static uint64_t append(struct kv_ring *r, uint32_t i)
{
    static uint8_t val[VAL];
    memset(val, (int)(i & 0xff), sizeof(val));
    struct kv_rec h = {.key_len = 4, .value_len = VAL, .mod_rev = i};
    return kv__ring_append(r, &h, &i, val);
}

/* Resident 4 KiB pages among a page's data. */
static size_t resident(const struct kv_page *p)
{
    uintptr_t a = ((uintptr_t)p->data + 4095) & ~(uintptr_t)4095;
    uintptr_t b = ((uintptr_t)p->data + p->cap) & ~(uintptr_t)4095;
    unsigned char vec[64];
    ck_assert_uint_le((b - a) / 4096, sizeof(vec));
    ck_assert_int_eq(mincore((void *)a, b - a, vec), 0);
    size_t n = 0;
    for (size_t i = 0; i < (b - a) / 4096; i++)
        n += vec[i] & 1;
    return n;
}

START_TEST(test_free_slab_pages_past_the_keep_go_back)
{
    struct kv_ring r;
    kv__ring_init(&r, PAGE);
    r.keep_free_bytes = 4 * PAGE;
    uint32_t i = 0;
    while (r.n_pages < 16)
        append(&r, i++);
    kv__ring_seal(&r);
    while (r.head != NULL)
        kv__ring_release_head(&r);
    /* Released pages stay in memory until forget steps, a few at a time. */
    ck_assert_uint_eq(r.free_resident, 16 * PAGE);
    ck_assert_uint_eq(kv__ring_forget_step(&r, 5), 5);
    ck_assert_uint_eq(r.free_resident, 11 * PAGE);
    while (kv__ring_forget_step(&r, 5) > 0)
        ;
    size_t kept = 0, forgotten = 0;
    for (struct kv_page *p = r.free_pages; p != NULL; p = p->next) {
        ck_assert(p->from_slab);
        size_t res = resident(p);
        if (p->forgotten) {
            forgotten++;
            ck_assert_uint_eq(res, 0);
        } else {
            kept++;
            ck_assert_uint_gt(res, 0); /* written, still there */
        }
    }
    ck_assert_uint_eq(kept, 4); /* keep_free_bytes of them */
    ck_assert_uint_eq(forgotten, 12);
    ck_assert_uint_eq(r.free_resident, 4 * PAGE);
    ck_assert_uint_eq(r.free_bytes, 16 * PAGE);

    /* Reused (the free list is LIFO: the kept pages come first, then the
     * forgotten ones), they hold what is written anew. */
    uint64_t addrs[200];
    uint32_t first = i;
    for (size_t k = 0; k < 200; k++)
        addrs[k] = append(&r, i++);
    for (size_t k = 0; k < 200; k++) {
        ck_assert(kv__ring_check(&r, addrs[k]));
        const struct kv_page *p = kv__ring_page(&r, addrs[k]);
        const struct kv_rec *h =
            (const struct kv_rec *)(const void *)(p->data +
                                                  (addrs[k] &
                                                   ((1u << KV_ADDR_OFF_BITS) - 1)));
        ck_assert_uint_eq(h->mod_rev, first + k);
        ck_assert_uint_eq(((const uint8_t *)(h + 1))[4 + VAL - 1], (first + k) & 0xff);
    }
    ck_assert_uint_le(r.free_resident, 4 * PAGE);
    kv__ring_free(&r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kv_ring_forget");
    TCase *tc = tcase_create("ring");
    tcase_add_test(tc, test_free_slab_pages_past_the_keep_go_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(suite()));
}
