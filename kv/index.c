/* The hash index: key -> ring address of the key's newest record.
 *
 * Open addressing over 64-byte buckets (one cache line): 7 entries of
 * (16-bit tag << 48 | 48-bit ring address) and one overflow word counting the
 * entries whose home is this bucket but which were placed further on (linear
 * probing over buckets). A lookup hashes the key with XXH3, compares tags in
 * the home bucket, checks the key bytes in the ring only on a tag match, and
 * moves to the next bucket only while the overflow count says an entry may
 * be there. Growth doubles the table and migrates two buckets per operation
 * (no stop-the-world rehash): while migrating, a key lives in exactly one of
 * the two tables. Owner thread only. */
#include <string.h>
#include <sys/mman.h>
/* XXH3 inlined: a short key hashes in a few ns, with no call into the
 * shared library. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "kv/kv_internal.h"

#define SLOTS 7
#define OVF 7
#define ADDR_MASK ((UINT64_C(1) << KV_ADDR_BITS) - 1)
#define INIT_BUCKETS 1024
#define MIGRATE_PER_OP 2

uint64_t kv__hash(const void *key, size_t len)
{
    return XXH3_64bits(key, len);
}

static inline uint64_t tag_of(uint64_t hash)
{
    uint64_t t = hash >> 48;
    return t == 0 ? 1 : t;
}

#define HUGE_BYTES ((size_t)2 << 20)

static void itab_alloc(struct kv_itab *t, size_t n_buckets)
{
    size_t bytes = n_buckets * 64;
    if (bytes >= HUGE_BYTES) {
        /* Big tables live on transparent huge pages: a lookup is a random
         * access, and 4 KiB pages would add a TLB miss to most of them.
         * A mapping of its own (kv__map) is zeroed by the kernel page by
         * page as it is first touched (by the incremental migration and the
         * inserts), instead of a memset of the whole table in the one apply
         * that grows it: that took tens of ms at 1M keys, linear in the keys. */
        t->b = kv__map(bytes, HUGE_BYTES);
        t->raw = NULL;
        madvise(t->b, bytes, MADV_HUGEPAGE);
    } else {
        t->raw = tk_malloc(bytes + 64);
        t->b = (uint64_t *)(((uintptr_t)t->raw + 63) & ~(uintptr_t)63);
        memset(t->b, 0, bytes);
    }
    t->mask = n_buckets - 1;
    t->count = 0;
}

static void itab_free(struct kv_itab *t)
{
    if (t->raw != NULL)
        tk_free(t->raw);
    else
        kv__unmap(t->b, (t->mask + 1) * 64);
    memset(t, 0, sizeof(*t));
}

void kv__index_init(struct kv_index *x, const struct kv_ring *ring)
{
    memset(x, 0, sizeof(*x));
    x->ring = ring;
    itab_alloc(&x->cur, INIT_BUCKETS);
}

void kv__index_free(struct kv_index *x)
{
    itab_free(&x->cur);
    if (x->old.b != NULL)
        itab_free(&x->old);
}

/* Does the record at addr hold this key? Reads stay inside the page even if
 * the record is damaged. */
static inline bool key_eq(const struct kv_ring *r, uint64_t addr, const void *key,
                          size_t len)
{
    const struct kv_page *p = r->slots[addr >> KV_ADDR_OFF_BITS];
    size_t off = addr & ((1u << KV_ADDR_OFF_BITS) - 1);
    const struct kv_rec *h = (const struct kv_rec *)(const void *)(p->data + off);
    if (h->key_len != len || off + sizeof(*h) + len > p->used)
        return false;
    const uint8_t *a = (const uint8_t *)(h + 1), *b = key;
    if (len >= 8 && len <= 16) { /* two overlapping words, no call */
        uint64_t a0, a1, b0, b1;
        memcpy(&a0, a, 8);
        memcpy(&b0, b, 8);
        memcpy(&a1, a + len - 8, 8);
        memcpy(&b1, b + len - 8, 8);
        return ((a0 ^ b0) | (a1 ^ b1)) == 0;
    }
    return memcmp(a, b, len) == 0;
}

static uint64_t rec_hash(const struct kv_ring *r, uint64_t addr)
{
    const struct kv_page *p = r->slots[addr >> KV_ADDR_OFF_BITS];
    size_t off = addr & ((1u << KV_ADDR_OFF_BITS) - 1);
    const struct kv_rec *h = (const struct kv_rec *)(const void *)(p->data + off);
    size_t len = h->key_len;
    if (off + sizeof(*h) + len > p->used)
        len = 0;
    return kv__hash(h + 1, len);
}

/* Bit i set when slot i of the bucket has this tag (no branches). */
static inline unsigned tag_mask(const uint64_t *bk, uint64_t tag)
{
    return (unsigned)((bk[0] >> KV_ADDR_BITS) == tag) |
           (unsigned)((bk[1] >> KV_ADDR_BITS) == tag) << 1 |
           (unsigned)((bk[2] >> KV_ADDR_BITS) == tag) << 2 |
           (unsigned)((bk[3] >> KV_ADDR_BITS) == tag) << 3 |
           (unsigned)((bk[4] >> KV_ADDR_BITS) == tag) << 4 |
           (unsigned)((bk[5] >> KV_ADDR_BITS) == tag) << 5 |
           (unsigned)((bk[6] >> KV_ADDR_BITS) == tag) << 6;
}
_Static_assert(SLOTS == 7, "tag_mask reads 7 slots");

/* Finds key in t: returns a pointer to its entry word, or NULL. */
static uint64_t *itab_find(struct kv_itab *t, const struct kv_ring *r, uint64_t hash,
                           const void *key, size_t len)
{
    uint64_t tag = tag_of(hash);
    size_t bi = hash & t->mask;
    for (size_t probe = 0; probe <= t->mask; probe++) {
        uint64_t *bk = t->b + bi * 8;
        /* The slots whose tag matches, as a mask computed without branches:
         * which slot holds a key is random, and a mispredicted branch on it
         * would also stall the loads of whatever the caller does next. */
        unsigned m = tag_mask(bk, tag);
        while (m != 0) {
            int i = __builtin_ctz(m);
            m &= m - 1;
            if (key_eq(r, bk[i] & ADDR_MASK, key, len))
                return &bk[i];
        }
        if (bk[OVF] == 0)
            return NULL;
        bi = (bi + 1) & t->mask;
    }
    return NULL;
}

static void itab_insert(struct kv_itab *t, uint64_t hash, uint64_t addr)
{
    size_t home = hash & t->mask;
    size_t bi = home;
    for (size_t probe = 0; probe <= t->mask; probe++) {
        uint64_t *bk = t->b + bi * 8;
        for (int i = 0; i < SLOTS; i++) {
            if (bk[i] == 0) {
                bk[i] = (tag_of(hash) << KV_ADDR_BITS) | addr;
                for (size_t j = home; j != bi; j = (j + 1) & t->mask)
                    t->b[j * 8 + OVF]++;
                t->count++;
                return;
            }
        }
        bi = (bi + 1) & t->mask;
    }
    TK_UNREACHABLE(); /* the load factor keeps free slots */
}

static void itab_remove(struct kv_itab *t, uint64_t hash, uint64_t *entry)
{
    size_t bi = (size_t)(entry - t->b) / 8;
    *entry = 0;
    for (size_t j = hash & t->mask; j != bi; j = (j + 1) & t->mask) {
        if (t->b[j * 8 + OVF] > 0) /* an old table may hold over-counts */
            t->b[j * 8 + OVF]--;
    }
    t->count--;
}

static void migrate_step(struct kv_index *x)
{
    if (x->old.b == NULL)
        return;
    for (int n = 0; n < MIGRATE_PER_OP && x->migrate_pos <= x->old.mask; n++) {
        uint64_t *bk = x->old.b + x->migrate_pos * 8;
        for (int i = 0; i < SLOTS; i++) {
            if (bk[i] == 0)
                continue;
            uint64_t addr = bk[i] & ADDR_MASK;
            itab_insert(&x->cur, rec_hash(x->ring, addr), addr);
            bk[i] = 0;
            x->old.count--;
        }
        x->migrate_pos++;
    }
    if (x->migrate_pos > x->old.mask) {
        TK_ASSERT(x->old.count == 0);
        itab_free(&x->old);
    }
}

static void maybe_grow(struct kv_index *x)
{
    if (x->old.b != NULL)
        return;
    size_t slots = (x->cur.mask + 1) * SLOTS;
    if ((x->cur.count + 1) * 5 <= slots * 4)
        return;
    x->old = x->cur;
    itab_alloc(&x->cur, (x->old.mask + 1) * 2);
    x->migrate_pos = 0;
}

uint64_t kv__index_find(struct kv_index *x, uint64_t hash, const void *key, size_t len,
                        bool *found)
{
    if (x->old.b == NULL) {
        /* The common case, without itab_find's loops: the key's entry is the
         * first tag match in its home bucket, or no slot matches and nothing
         * overflowed from the bucket. */
        const uint64_t *bk = x->cur.b + (hash & x->cur.mask) * 8;
        unsigned m = tag_mask(bk, tag_of(hash));
        if (m != 0) {
            uint64_t addr = bk[__builtin_ctz(m)] & ADDR_MASK;
            if (key_eq(x->ring, addr, key, len)) {
                *found = true;
                return addr;
            }
        } else if (bk[OVF] == 0) {
            *found = false;
            return 0;
        }
    }
    uint64_t *e = itab_find(&x->cur, x->ring, hash, key, len);
    if (e == NULL && x->old.b != NULL)
        e = itab_find(&x->old, x->ring, hash, key, len);
    *found = e != NULL;
    return e != NULL ? (*e & ADDR_MASK) : 0;
}

uint64_t kv__index_peek(const struct kv_index *x, uint64_t hash)
{
    const uint64_t *bk = x->cur.b + (hash & x->cur.mask) * 8;
    unsigned m = tag_mask(bk, tag_of(hash));
    if (m == 0)
        return KV_ADDR_NONE;
    /* The first match: a second one is a 1-in-65536 tag collision. */
    uint64_t addr = bk[__builtin_ctz(m)] & ADDR_MASK;
    const struct kv_page *p = x->ring->slots[addr >> KV_ADDR_OFF_BITS];
    __builtin_prefetch(p->data + (addr & ((1u << KV_ADDR_OFF_BITS) - 1)));
    return addr;
}

bool kv__index_key_is(const struct kv_index *x, uint64_t addr, const void *key,
                      size_t len)
{
    return key_eq(x->ring, addr, key, len);
}

bool kv__index_put(struct kv_index *x, uint64_t hash, const void *key, size_t len,
                   uint64_t addr)
{
    TK_ASSERT(addr <= ADDR_MASK);
    uint64_t *e = itab_find(&x->cur, x->ring, hash, key, len);
    if (e == NULL && x->old.b != NULL)
        e = itab_find(&x->old, x->ring, hash, key, len);
    bool is_new = e == NULL;
    if (e != NULL) {
        *e = (*e & ~ADDR_MASK) | addr;
    } else {
        maybe_grow(x);
        itab_insert(&x->cur, hash, addr);
    }
    migrate_step(x);
    return is_new;
}

/* The entry word `want` in t, probing as itab_find does. */
static uint64_t *itab_find_word(struct kv_itab *t, uint64_t hash, uint64_t want)
{
    size_t bi = hash & t->mask;
    for (size_t probe = 0; probe <= t->mask; probe++) {
        uint64_t *bk = t->b + bi * 8;
        for (int i = 0; i < SLOTS; i++)
            if (bk[i] == want)
                return &bk[i];
        if (bk[OVF] == 0)
            return NULL;
        bi = (bi + 1) & t->mask;
    }
    return NULL;
}

bool kv__index_remove_if(struct kv_index *x, uint64_t hash, uint64_t addr)
{
    uint64_t want = (tag_of(hash) << KV_ADDR_BITS) | addr;
    struct kv_itab *t = &x->cur;
    uint64_t *e = itab_find_word(t, hash, want);
    if (e == NULL && x->old.b != NULL) {
        t = &x->old;
        e = itab_find_word(t, hash, want);
    }
    if (e == NULL)
        return false;
    itab_remove(t, hash, e);
    migrate_step(x);
    return true;
}

static void purge(struct kv_itab *t, uint32_t slot)
{
    if (t->raw == NULL)
        return;
    for (size_t bi = 0; bi <= t->mask; bi++) {
        uint64_t *bk = t->b + bi * 8;
        for (int i = 0; i < SLOTS; i++) {
            if (bk[i] != 0 && ((bk[i] & ADDR_MASK) >> KV_ADDR_OFF_BITS) == slot) {
                /* The overflow counts on its probe path stay over-counted:
                 * lookups probe a little further, never miss. */
                bk[i] = 0;
                t->count--;
            }
        }
    }
}

void kv__index_purge_slot(struct kv_index *x, uint32_t slot)
{
    purge(&x->cur, slot);
    purge(&x->old, slot);
}
