/* Internals of kv/ shared between its files: the ring (ring.c), the hash
 * index (index.c), the ordered view of hot keys (view.c), the LMDB cold tier
 * (cold.c); the sm's private state is in sm_internal.h. Nothing here is
 * thread-safe: the sm's owner thread calls all of it. Only cold.c includes
 * lmdb.h; the others see the cold tier through the kv__cold_* functions. */
#ifndef TK_KV_INTERNAL_H
#define TK_KV_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/blob.h"
#include "base/sync.h"
#include "kv/kv.h"

/* ---- big buffers ---------------------------------------------------------- */

/* The owner's big buffers (the ring's slabs, the index's big tables, the
 * change log's bytes) are anonymous mappings of their own, never malloc's:
 * the kernel hands their pages out zeroed as they are first touched, so
 * taking one costs the loop nothing whatever the allocator is told (with
 * MALLOC_PERTURB_, which meson's test runner sets, malloc fills every
 * allocation: a new 18 MiB slab was 4,600 page faults in one apply, 50-90 ms
 * of the loop on a VM with costly faults), and freeing one gives its memory
 * back at once. No swap is reserved (MAP_NORESERVE): a bound as large as
 * --watch-events-bytes allows is address space until it is written. kv__map
 * returns `bytes` (rounded up to pages) aligned to
 * `align` (a power of two; at least the page's), zeroed; it aborts when
 * the address space is exhausted, as tk_malloc does. kv__unmap(p, bytes)
 * removes it. */
static inline size_t kv__map_round(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

static inline void *kv__map(size_t bytes, size_t align)
{
    size_t len = kv__map_round(bytes), page = (size_t)sysconf(_SC_PAGESIZE);
    if (align < page)
        align = page;
    /* The kernel aligns a big anonymous mapping to 2 MiB itself (Linux 6.7
     * and later): then there is nothing to trim. Trimming is two munmaps,
     * which take the process's mmap lock for writing; on the loop (a new
     * ring slab) each waited for other threads' mapping work, up to 82 ms. */
    uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw != MAP_FAILED && ((uintptr_t)raw & (align - 1)) == 0)
        return raw;
    if (raw != MAP_FAILED)
        (void)munmap(raw, len);
    raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        fprintf(stderr, "tierkv: out of memory mapping %zu bytes\n", len);
        abort();
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (p > raw)
        (void)munmap(raw, (size_t)(p - raw));
    if (raw + len + align > p + len)
        (void)munmap(p + len, (size_t)(raw + len + align - (p + len)));
    return p;
}

static inline void kv__unmap(void *p, size_t bytes)
{
    if (p != NULL)
        (void)munmap(p, kv__map_round(bytes));
}

/* ---- ring ---------------------------------------------------------------- */

#define KV_REC_MAGIC 0x4b565231u /* "KVR1" */
#define KV_REC_TOMB (1u << 0)    /* a delete */
#define KV_REC_SESSION (1u << 1) /* an exactly-once result, key = client||seq */

/* A ring record header; key then value follow, the whole record padded to 8.
 * crc is CRC32C of everything after it (the rest of the header, key, value),
 * so a read checks it with one contiguous CRC call. */
#define KV_REC_CRC_FROM 8
struct kv_rec {
    uint32_t magic;
    uint32_t crc;
    uint8_t flags;
    uint8_t pad;
    uint16_t key_len;
    uint32_t value_len;
    uint64_t expire_ms;
    uint64_t mod_rev; /* the revision: the raft index that wrote it */
    uint64_t create_rev;
    uint64_t version;
};
_Static_assert(sizeof(struct kv_rec) == 48, "ring record header is 48 bytes");

#define KV_ADDR_OFF_BITS 28
#define KV_ADDR_SLOT_BITS 20
#define KV_ADDR_BITS (KV_ADDR_OFF_BITS + KV_ADDR_SLOT_BITS)

/* The header is one cache line and data[] starts on the next, so a record
 * whose size is a multiple of 64 (8 B keys with 8 B values are 64 bytes) never
 * straddles two lines: a read of it is one cache miss, not two. */
struct kv_page {
    uint32_t slot;
    uint32_t used; /* bytes of records */
    uint32_t cap;  /* bytes of data[] */
    bool sealed;   /* no more appends */
    bool from_slab;
    bool damaged;         /* tier-down found a record failing its check */
    bool forgotten;       /* free slab page whose memory went back (madvise) */
    uint64_t pos;         /* the ring's position of data[0]: the caps of all the
                             pages opened before this one */
    struct kv_page *next; /* newer page */
    struct tk_blob *raw;  /* the allocation of a page not from a slab (a blob) */
    _Alignas(64) uint8_t data[];
};
_Static_assert(sizeof(struct kv_page) == 64, "a ring page header is one cache line");

struct kv_ring {
    size_t page_bytes;
    size_t keep_free_bytes; /* released pages kept for reuse, at most this */
    struct kv_page *free_pages;
    size_t free_bytes;
    size_t free_resident; /* of free_bytes, slab pages still in memory */
    /* Pages of page_bytes are carved from slabs on huge pages; slab pages are
     * recycled, never freed, until kv__ring_free; past keep_free_bytes (pages
     * in use and free ones in memory) free slab pages give their memory back
     * with madvise, a few per kv__ring_forget_step, and stay on the free
     * list. */
    void **slabs;
    size_t n_slabs;
    uint8_t *slab_next, *slab_end;
    size_t bytes;      /* sum of page caps */
    uint64_t next_pos; /* the pos the next page opened gets */
    size_t n_pages;
    struct kv_page *head; /* oldest */
    struct kv_page *tail; /* newest: appends go here */
    struct kv_page **slots;
    uint32_t n_slots;
    uint32_t *free_slots;
    uint32_t n_free;
};

void kv__ring_init(struct kv_ring *r, size_t page_bytes);
void kv__ring_free(struct kv_ring *r);
/* Appends a record; its crc is computed here. Returns its address. */
uint64_t kv__ring_append(struct kv_ring *r, const struct kv_rec *h, const void *key,
                         const void *value);
/* The record at addr, unchecked (addr comes from the index). */
static inline const struct kv_rec *kv__ring_at(const struct kv_ring *r, uint64_t addr)
{
    const struct kv_page *p = r->slots[addr >> KV_ADDR_OFF_BITS];
    return (const struct kv_rec *)(const void *)(p->data +
                                                 (addr & ((1u << KV_ADDR_OFF_BITS) - 1)));
}
static inline const uint8_t *kv__rec_key(const struct kv_rec *h)
{
    return (const uint8_t *)(h + 1);
}
static inline const uint8_t *kv__rec_value(const struct kv_rec *h)
{
    return (const uint8_t *)(h + 1) + h->key_len;
}
static inline size_t kv__rec_size(size_t key_len, size_t value_len)
{
    return (sizeof(struct kv_rec) + key_len + value_len + 7) & ~(size_t)7;
}
/* Rewrites the live record at addr in place for a new version of its key
 * with a value of the same length: takes h's expire_ms, mod_rev, create_rev
 * and version, copies value (unless value is the record's own bytes: a put
 * that keeps its value) and recomputes the CRC. The caller makes sure no
 * other thread reads the record meanwhile. */
void kv__ring_rewrite(struct kv_ring *r, uint64_t addr, const struct kv_rec *h,
                      const void *value);
/* The page holding addr (which must be in the ring). */
static inline struct kv_page *kv__ring_page(const struct kv_ring *r, uint64_t addr)
{
    return r->slots[addr >> KV_ADDR_OFF_BITS];
}
/* True if the record at addr lies inside its page, has the magic and its CRC
 * matches. A record that fails is never to be returned. */
bool kv__ring_check(const struct kv_ring *r, uint64_t addr);
/* The same check of the record at `off` of page p (a sealed page may be checked
 * from any thread while its owner appends elsewhere). */
bool kv__page_check(const struct kv_page *p, size_t off);
/* The record CRC, tk_crc32c(0, p, n) (short buffers inline; exposed so a test
 * can compare the two). Any thread. */
uint32_t kv__rec_crc(const void *p, size_t n);
/* Seals the tail so the next append opens a new page. */
void kv__ring_seal(struct kv_ring *r);
/* Releases the oldest page (which must be sealed); pages of page_bytes are
 * kept for reuse while ring bytes + kept bytes stay under keep_free_bytes, so
 * a ring in steady state allocates nothing. */
void kv__ring_release_head(struct kv_ring *r);
/* Gives the memory of at most `max_pages` free slab pages back (madvise)
 * while ring bytes + free resident bytes exceed keep_free_bytes: the pages
 * deepest in the free list (the last to be reused) first. Each madvise is a
 * TLB shootdown across the process's CPUs (on this VM 0.5-1 ms), so the owner
 * calls this a few pages per loop turn rather than in the release of tens of
 * pages at once. Returns the pages given back. */
size_t kv__ring_forget_step(struct kv_ring *r, size_t max_pages);
static inline uint64_t kv__ring_addr(const struct kv_page *p, size_t off)
{
    return ((uint64_t)p->slot << KV_ADDR_OFF_BITS) | off;
}

/* ---- index --------------------------------------------------------------- */

/* key -> ring address. Set-associative: 64-byte buckets of 7 entries (16-bit
 * hash tag | 48-bit address) and an overflow count (entries whose home is
 * this bucket but which live further on, linear probing over buckets). Grows
 * by doubling, migrating a few buckets per operation. */
struct kv_itab {
    uint64_t *b; /* n_buckets * 8 words; word 7 of a bucket is the overflow count */
    void *raw;   /* the allocation b is aligned in; NULL: b is a mapping (kv__map) */
    size_t mask; /* n_buckets - 1 */
    size_t count;
};

struct kv_index {
    struct kv_itab cur;
    struct kv_itab old; /* being migrated into cur when old.b != NULL */
    size_t migrate_pos;
    const struct kv_ring *ring;
};

void kv__index_init(struct kv_index *x, const struct kv_ring *ring);
void kv__index_free(struct kv_index *x);
uint64_t kv__hash(const void *key, size_t len);
/* The address of key's record, or 0 with *found false. */
uint64_t kv__index_find(struct kv_index *x, uint64_t hash, const void *key, size_t len,
                        bool *found);
/* Sets key -> addr. Returns true if the key was new. */
bool kv__index_put(struct kv_index *x, uint64_t hash, const void *key, size_t len,
                   uint64_t addr);
/* Removes the entry of the record at addr (whose key hashes to `hash`) if the
 * index holds it, i.e. if it is its key's newest record. Returns true if
 * removed. An address names one record, so the entry is found by tag and
 * address, without reading any record. */
bool kv__index_remove_if(struct kv_index *x, uint64_t hash, uint64_t addr);
/* Starts loading the bucket a lookup of `hash` will read first (scans call
 * it one key ahead, so the next key's cache miss overlaps this key's work). */
static inline void kv__index_prefetch(const struct kv_index *x, uint64_t hash)
{
    __builtin_prefetch(x->cur.b + (hash & x->cur.mask) * 8);
}
#define KV_ADDR_NONE UINT64_MAX
/* A guess at key's entry for a scan reading ahead: the address in the first
 * entry of hash's home bucket whose tag matches (its record starts loading),
 * or KV_ADDR_NONE. Call it once the bucket is likely cached. The guess is
 * key's entry exactly when kv__index_key_is(addr, key) holds (each key has one
 * entry) and the index has not changed since; otherwise use kv__index_find. */
uint64_t kv__index_peek(const struct kv_index *x, uint64_t hash);
/* The record at addr (an address from the index) holds this key. */
bool kv__index_key_is(const struct kv_index *x, uint64_t addr, const void *key,
                      size_t len);
/* Drops every entry into ring slot `slot` (a page with a damaged record is
 * released: its keys cannot be rehashed). O(index size); rare. */
void kv__index_purge_slot(struct kv_index *x, uint32_t slot);
/* Bytes of the index's tables (the one being migrated from too). */
static inline size_t kv__index_bytes(const struct kv_index *x)
{
    return (x->cur.b != NULL ? (x->cur.mask + 1) * 64 : 0) +
           (x->old.b != NULL ? (x->old.mask + 1) * 64 : 0);
}

static inline size_t kv__index_count(const struct kv_index *x)
{
    return x->cur.count + x->old.count;
}

/* ---- view: the hot keys in byte order (a B+tree of key copies) ---------- */

/* A key in the view: its first 16 bytes inline (zero-padded), so most
 * comparisons and all of a scan's reads of an 8-16 byte key stay inside the
 * node, and a private copy of the whole key when it is longer. */
struct kv_vent {
    uint8_t inl[16];
    uint8_t *ext; /* len > 16: the whole key (owned), else NULL */
    uint32_t len;
};

#define KV_VLEAF_MAX 30  /* keys per leaf */
#define KV_VINNER_MAX 24 /* children per inner node */
#define KV_VIEW_DEPTH_MAX 16

struct kv_vleaf {
    uint32_t n;
    struct kv_vleaf *prev, *next; /* the leaves in key order */
    struct kv_vent e[KV_VLEAF_MAX];
};
struct kv_vinner {
    uint32_t n;                        /* children */
    struct kv_vent sep[KV_VINNER_MAX]; /* sep[i] <= every key under child[i]
                                          < sep[i + 1]; sep[0] unused */
    void *child[KV_VINNER_MAX];
};

struct kv_view {
    void *root;
    uint32_t height; /* inner levels above the leaves; 0: root is a leaf */
    size_t count;
    /* Nodes come from chunks and go back to a free list, so a view whose size
     * is steady allocates nothing. Owner thread only. */
    void *free_nodes;
    void **chunks;
    size_t n_chunks;
};

/* A position in the view; valid while the view is not changed. */
struct kv_view_it {
    const struct kv_vleaf *leaf; /* NULL: past the end */
    uint32_t i;
};

void kv__view_init(struct kv_view *v);
void kv__view_free(struct kv_view *v);
/* Adds a copy of the key (nothing if present). */
void kv__view_insert(struct kv_view *v, const void *key, size_t len);
/* Bytes the view holds (its node chunks). */
size_t kv__view_bytes(const struct kv_view *v);
/* Removes the key if present. */
void kv__view_remove(struct kv_view *v, const void *key, size_t len);
/* Positions `it` at the first key >= (key, len), or past the end. */
void kv__view_seek(const struct kv_view *v, const void *key, size_t len,
                   struct kv_view_it *it);
static inline bool kv__view_it_valid(const struct kv_view_it *it)
{
    return it->leaf != NULL;
}
/* The key at it (valid): borrowed from the view until it changes. */
static inline const uint8_t *kv__view_it_key(const struct kv_view_it *it, size_t *len)
{
    const struct kv_vent *e = &it->leaf->e[it->i];
    *len = e->len;
    return e->len > sizeof(e->inl) ? e->ext : e->inl;
}
static inline void kv__view_it_next(struct kv_view_it *it)
{
    if (++it->i == it->leaf->n) { /* only the root leaf is ever empty */
        it->leaf = it->leaf->next;
        it->i = 0;
    }
}
int kv__keycmp(const void *a, size_t alen, const void *b, size_t blen);

/* ---- cold tier (cold.c, the only user of LMDB) --------------------------- */

/* LMDB keys stop at 511 bytes: a longer key is stored under its first
 * KV_COLD_SHORT_MAX bytes + its hash, so such long keys that share that prefix
 * come out of a cursor in hash order. Scans allow for it. */
#define KV_COLD_SHORT_MAX 488

struct kv_cold;
struct kv_cold_meta {
    uint64_t index; /* the raft index the cold tier reflects */
    uint64_t term;
    uint64_t now_ms;
};
/* A cold value: the borrowed bytes are valid until the next cold call. */
struct kv_cold_val {
    const uint8_t *value;
    size_t value_len;
    uint64_t expire_ms, create_rev, mod_rev, version;
};
int kv__cold_open(const char *dir, size_t map_bytes, bool no_sync, struct kv_cold **out);
void kv__cold_close(struct kv_cold *c);
int kv__cold_meta(struct kv_cold *c, struct kv_cold_meta *m);
uint64_t kv__cold_count(struct kv_cold *c);
/* Bytes of the LMDB data file in use (its pages up to the last one written). */
uint64_t kv__cold_bytes(struct kv_cold *c);
/* The map's size, and how much of its used part is in memory (mincore over
 * the used pages: O(pages), for a scrape, not for every loop turn). */
uint64_t kv__cold_map_bytes(struct kv_cold *c);
uint64_t kv__cold_resident(struct kv_cold *c);
/* The data file's descriptor (LMDB's own: not to be closed) and the bytes in
 * use. Returns 0 or TK_EIO. */
int kv__cold_file(struct kv_cold *c, int *fd, uint64_t *len);
/* Drops the read view so the next read sees the latest commit. */
void kv__cold_read_reset(struct kv_cold *c);
int kv__cold_get(struct kv_cold *c, const void *key, size_t len, struct kv_cold_val *out);

/* A write transaction for one tier-down step; it may run on another thread
 * (the owner's reads keep their view), and the owner then publishes it. */
int kv__cold_wbegin(struct kv_cold *c);
int kv__cold_wput(struct kv_cold *c, const struct kv_rec *h);
int kv__cold_wsession(struct kv_cold *c, const struct kv_rec *h);
/* Drops sessions beyond sessions_max (oldest first) and expired keys at
 * meta->now_ms, stores meta, commits durably; paced when pace is not NULL. */
int kv__cold_wcommit(struct kv_cold *c, const struct kv_cold_meta *m, size_t sessions_max,
                     struct tk_pace *pace);
void kv__cold_wabort(struct kv_cold *c);
/* Owner thread, after a commit: count and read view move to the new state. */
void kv__cold_wpublish(struct kv_cold *c);

/* Sessions in order, oldest first: cb(index, client, seq, bytes, len). */
typedef int kv_cold_session_cb(uint64_t index, uint64_t client, uint64_t seq,
                               const uint8_t *res, size_t len, void *data);
int kv__cold_sessions(struct kv_cold *c, kv_cold_session_cb *cb, void *data);
/* The keys with a TTL ("exp", by expire time; some may be stale: the key
 * deleted or rewritten since): cb(expire_ms, key, len). */
typedef int kv_cold_exp_cb(uint64_t expire_ms, const uint8_t *key, size_t len,
                           void *data);
int kv__cold_expiring(struct kv_cold *c, kv_cold_exp_cb *cb, void *data);

/* A cursor over the cold keys in order, in the current read view. */
struct kv_cold_cur;
int kv__cold_cur_open(struct kv_cold *c, struct kv_cold_cur **out);
/* Positions at the first key >= (key, len); *valid false when past the end. */
int kv__cold_cur_seek(struct kv_cold_cur *cur, const void *key, size_t len, bool *valid);
int kv__cold_cur_next(struct kv_cold_cur *cur, bool *valid);
void kv__cold_cur_get(struct kv_cold_cur *cur, const uint8_t **key, size_t *key_len,
                      struct kv_cold_val *v);
void kv__cold_cur_close(struct kv_cold_cur *cur);

/* Snapshot stream support: a read-only MVCC view over every table. */
struct kv_cold_snap;
int kv__cold_snap_open(struct kv_cold *c, struct kv_cold_snap **out,
                       struct kv_cold_meta *meta);
/* The next raw record: table (1 data, 2 expiry, 3 sessions), key, value.
 * *end true when done. */
int kv__cold_snap_next(struct kv_cold_snap *s, uint8_t *table, const uint8_t **key,
                       size_t *key_len, const uint8_t **val, size_t *val_len, bool *end);
void kv__cold_snap_close(struct kv_cold_snap *s);

/* Installing: a fresh environment next to the current one. begin runs on the
 * owner thread; put and prepare on any one thread (the write transaction is
 * that thread's), abort on that thread too once a put was made; commit (the
 * swap) on the owner thread. */
struct kv_cold_new;
int kv__cold_new_begin(struct kv_cold *c, struct kv_cold_new **out);
int kv__cold_new_put(struct kv_cold_new *n, uint8_t table, const uint8_t *key,
                     size_t key_len, const uint8_t *val, size_t val_len);
/* A data record for a kv_cold_load: key, its length and value, borrowed for
 * the call. Returns 0 or an error that stops the load. */
typedef int kv_cold_item_cb(const uint8_t *key, size_t len, const struct kv_cold_val *v,
                            void *data);
/* What a prepare reads back from the new environment, after its commit and
 * on its thread, so that the owner's swap has nothing left to load: every
 * session (oldest first), every key with a TTL, and the data records whose
 * keys start with prefix (1..KV_COLD_SHORT_MAX bytes; those expired at the
 * meta's now_ms left out, as a scan would). */
struct kv_cold_load {
    kv_cold_session_cb *session;
    kv_cold_exp_cb *expiring;
    const uint8_t *prefix;
    size_t prefix_len;
    kv_cold_item_cb *item;
    void *data;
};
/* Commits the new environment with `meta`, syncs it and, unless load is
 * NULL, reads it back through load's callbacks; it touches neither `c` nor
 * the current environment. */
int kv__cold_new_prepare(struct kv_cold_new *n, const struct kv_cold_meta *meta,
                         const struct kv_cold_load *load);
/* Makes the prepared environment the durable current one (a symlink
 * rename, then the directory's sync) and frees `n`, on any one thread; it
 * reads `c`'s generation but changes nothing of `c`, which goes on serving
 * the old environment until kv__cold_switch. On an error the new
 * environment is removed, unless the rename was done (its sync failed): then
 * the link may name it, both stay, and the next open uses whichever it names. */
int kv__cold_new_publish(struct kv_cold_new *n);
/* Owner thread, after a publish: reopens `c` on the new environment. The old
 * one stays open and on disk for kv__cold_trash. */
int kv__cold_switch(struct kv_cold *c);
/* Commits the new environment with `meta` (unless prepared), publishes it
 * and switches `c` to it. */
int kv__cold_new_commit(struct kv_cold_new *n, const struct kv_cold_meta *meta);
/* The environment the last switch replaced, if not yet taken: its path into
 * `path` and its handle, still open, into `*env` (for kv__trash_env_close),
 * true once. */
bool kv__cold_trash(struct kv_cold *c, char *path, size_t cap, void **env);
void kv__trash_env_close(void *env);
void kv__cold_new_abort(struct kv_cold_new *n);

#endif
