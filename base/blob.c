/* Reference-counted immutable byte buffers.
 *
 * The count is atomic so blobs may cross threads. Taking a reference is
 * relaxed (the taker already holds one, so the blob is alive); dropping one is
 * acquire-release, so every holder's use of the bytes happens before the free
 * by whichever thread drops the last reference. (Release plus an acquire fence
 * on the last drop would do, but ThreadSanitizer does not model fences.) */
#include "base/blob.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"

/* The refcount's top bit marks a mapped blob (tk_blob_map), the five below
 * it a small blob's size class (1..SMALL_CLASSES; 0: a plain allocation);
 * neither ever changes, and the count stays far below them. */
#define MAPPED ((uint_fast32_t)1 << 31)
#define CLASS_SHIFT 26
#define CLASS_BITS ((uint_fast32_t)31 << CLASS_SHIFT)
#define COUNT_BITS (((uint_fast32_t)1 << CLASS_SHIFT) - 1)

/* ---- Small blobs: per-thread caches over a bounded shared depot ----
 *
 * Every replicated write makes a blob or two (the command on the node that
 * takes it, each entry a follower decodes) and frees them when the log is
 * compacted, 8,192 at a time on a pool thread; a follower's decoding arena
 * takes its bigger pieces as blobs too (codec.c) and drops them once the
 * message is handled. Small ones (at most SMALL_MAX bytes in all) are
 * rounded up to a size class and, once freed, kept for the next: each
 * thread holds up to 2 * MAG of a class and hands MAG at a time (a
 * magazine, one mutex hold) to a depot shared by the process; past
 * CACHE_MAX bytes held in all, a magazine is freed instead. So a loop that
 * makes blobs and a pool thread that frees them trade whole magazines, and
 * a steady write load allocates nothing: a compaction frees what a
 * snapshot interval wrote (100k entries by default, 13 MiB of 64-byte
 * writes), and the loop takes them back as it writes the next interval. A
 * thread's cache goes to the depot when the thread ends.
 *
 * Under AddressSanitizer the cache is off, so a use after free is still
 * seen. */
#if defined(__SANITIZE_ADDRESS__)
#define SMALL_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SMALL_CACHE 0
#endif
#endif
#ifndef SMALL_CACHE
#define SMALL_CACHE 1
#endif

#define SMALL_CLASSES 17
#define SMALL_MAX 4096u
#define MAG 32
#define CACHE_MAX ((size_t)32 << 20)
static atomic_size_t cache_max = CACHE_MAX; /* tk_blob_cache_limit */

/* Allocation sizes, header included (the header is 16 bytes). */
static const uint32_t class_size[SMALL_CLASSES + 1] = {
    0,   64,  96,  128,  160,  192,  256,  320,  384,
    512, 640, 768, 1024, 1280, 1536, 2048, 3072, 4096};
_Static_assert(SMALL_CLASSES < 32, "a class fits CLASS_BITS");

/* A cached blob's bytes: the next in its magazine, and (first of a
 * magazine in the depot) the next magazine. */
struct small_free {
    struct small_free *next;
    struct small_free *next_mag;
};

struct small_depot {
    pthread_mutex_t mu;
    struct small_free *mags; /* each MAG blobs long */
    size_t n_mags;
};

#define DEPOT_INIT                                                                       \
    {                                                                                    \
        .mu = PTHREAD_MUTEX_INITIALIZER                                                  \
    }
static struct small_depot depot[SMALL_CLASSES + 1] = {
    DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT,
    DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT,
    DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT, DEPOT_INIT};
static atomic_size_t small_cached; /* bytes in the depot and thread caches */
static atomic_size_t small_live;   /* bytes of small blobs in use */
static atomic_size_t map_live;     /* bytes of mapped blobs' mappings in use */

struct small_cache {
    struct small_free *head[SMALL_CLASSES + 1];
    uint32_t n[SMALL_CLASSES + 1];
    bool registered;
};

static _Thread_local struct small_cache tcache;
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;

/* The class for an allocation of `total` bytes; 0 past SMALL_MAX. */
static unsigned small_class(size_t total)
{
    if (total > SMALL_MAX)
        return 0;
    unsigned c = 1;
    while (class_size[c] < total)
        c++;
    return c;
}

/* Takes MAG blobs off the head of the thread's list of class c (it holds
 * at least MAG) and gives them to the depot, or frees them if it is full. */
static void small_give(struct small_cache *t, unsigned c)
{
    struct small_free *first = t->head[c], *last = first;
    for (int i = 1; i < MAG; i++)
        last = last->next;
    t->head[c] = last->next;
    t->n[c] -= MAG;
    last->next = NULL;
    struct small_depot *d = &depot[c];
    pthread_mutex_lock(&d->mu);
    bool kept = atomic_load_explicit(&small_cached, memory_order_relaxed) <=
                atomic_load_explicit(&cache_max, memory_order_relaxed);
    if (kept) {
        first->next_mag = d->mags;
        d->mags = first;
        d->n_mags++;
    }
    pthread_mutex_unlock(&d->mu);
    if (kept)
        return;
    atomic_fetch_sub_explicit(&small_cached, (size_t)MAG * class_size[c],
                              memory_order_relaxed);
    while (first != NULL) {
        struct small_free *next = first->next;
        tk_free(first);
        first = next;
    }
}

/* At a thread's end: its cache to the depot (whole magazines) or freed. */
static void tcache_flush(void *arg)
{
    struct small_cache *t = arg;
    for (unsigned c = 1; c <= SMALL_CLASSES; c++) {
        while (t->n[c] >= MAG)
            small_give(t, c);
        while (t->head[c] != NULL) {
            struct small_free *next = t->head[c]->next;
            tk_free(t->head[c]);
            atomic_fetch_sub_explicit(&small_cached, class_size[c], memory_order_relaxed);
            t->head[c] = next;
        }
        t->n[c] = 0;
    }
    t->registered = false; /* a later free (another destructor) registers again */
}

static void tcache_key_init(void)
{
    (void)pthread_key_create(&tcache_key, tcache_flush);
}

/* The calling thread's cache, flushed when the thread ends. */
static struct small_cache *tcache_get(void)
{
    struct small_cache *t = &tcache;
    if (!t->registered) {
        (void)pthread_once(&tcache_once, tcache_key_init);
        (void)pthread_setspecific(tcache_key, t);
        t->registered = true;
    }
    return t;
}

/* A blob of class c from the thread's cache or the depot; NULL if both are
 * empty. */
static struct tk_blob *small_take(unsigned c)
{
    struct small_cache *t = tcache_get();
    if (t->head[c] == NULL) {
        struct small_depot *d = &depot[c];
        pthread_mutex_lock(&d->mu);
        struct small_free *m = d->mags;
        if (m != NULL) {
            d->mags = m->next_mag;
            d->n_mags--;
        }
        pthread_mutex_unlock(&d->mu);
        if (m == NULL)
            return NULL;
        t->head[c] = m;
        t->n[c] = MAG;
    }
    struct small_free *f = t->head[c];
    t->head[c] = f->next;
    t->n[c]--;
    atomic_fetch_sub_explicit(&small_cached, class_size[c], memory_order_relaxed);
    return (struct tk_blob *)(void *)f;
}

/* Keeps a freed blob of class c in the thread's cache. */
static void small_put(struct tk_blob *b, unsigned c)
{
    struct small_cache *t = tcache_get();
    struct small_free *f = (struct small_free *)(void *)b;
    f->next = t->head[c];
    t->head[c] = f;
    t->n[c]++;
    atomic_fetch_add_explicit(&small_cached, class_size[c], memory_order_relaxed);
    if (t->n[c] >= 2 * MAG)
        small_give(t, c);
}

/* ---- Big blobs: mappings of their own, their pages kept once freed ----
 *
 * On a virtual machine the first write to a fresh page costs about a
 * hundred times a rewrite (the host backs the page then). Under 4 MB writes
 * each node's loop made two or three big blobs per entry (the follower's
 * decoded entry, the leader's decoded forwarded command, the ring's page of
 * a big value), 1,000-4,000 page faults and 15-50 ms of CPU in one turn
 * (issue 48, adversary case bodies). So a blob of BIG_MIN bytes or more (up
 * to BIG_MAX) is a mapping of its own, and once freed its pages are kept as
 * an extent (address and length, page-aligned) in a list shared by the
 * process, at most big_max bytes (tk_blob_big_cache_limit); past it the
 * smallest extents are unmapped. A new big blob takes an extent whole (big_map
 * says which), grows a smaller one with mremap (the kernel moves its backed
 * pages, and only the rest are fresh) or splits a bigger one, leaving its
 * rest listed. Extents are never joined, so each stays within one mapping,
 * as mremap needs. The refcount's class bits hold BIG_CLASS; the BIG_PREFIX
 * bytes before the header hold the mapping's length. tk_blob_big_cache_drop
 * unmaps them all (the node, once no big blob was made for 10 s). Off under
 * AddressSanitizer, as the small cache: such a blob is then plain malloc. */
#define BIG_CLASS 31u
#define BIG_MIN ((size_t)128 << 10)
#define BIG_MAX ((size_t)64 << 20)
#define BIG_EXTENTS 256
#define BIG_MAX_DEFAULT ((size_t)32 << 20)
#define BIG_PREFIX 16
_Static_assert(SMALL_CLASSES < BIG_CLASS, "the big class is past the small ones");
static atomic_size_t big_max = BIG_MAX_DEFAULT; /* tk_blob_big_cache_limit */
static atomic_size_t big_cached;                /* bytes of the extents */
static atomic_uint_fast64_t big_allocs;         /* big blobs made (tk_blob_big_allocs) */
static atomic_size_t big_miss_n;                /* the last size no extent held */
static atomic_int big_prefill_state; /* 0 idle, 1 wanted, 2 queued or running */
static pthread_mutex_t big_mu = PTHREAD_MUTEX_INITIALIZER;
static struct big_extent {
    uint8_t *p;
    size_t n;
} big_ext[BIG_EXTENTS];
static unsigned big_n; /* extents listed, under big_mu */

/* The mapping's length for a blob of `len` bytes; 0 when not a big one. */
static size_t big_len(size_t len)
{
    if (!SMALL_CACHE || len > BIG_MAX)
        return 0;
    size_t total = BIG_PREFIX + sizeof(struct tk_blob) + len;
    if (total < BIG_MIN)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (total + page - 1) & ~(page - 1);
}

static void big_ext_remove(unsigned i)
{
    atomic_fetch_sub_explicit(&big_cached, big_ext[i].n, memory_order_relaxed);
    big_ext[i] = big_ext[--big_n];
}

/* Lists an extent, under big_mu; returns false when the list is full. */
static bool big_ext_add(uint8_t *p, size_t n)
{
    if (big_n == BIG_EXTENTS)
        return false;
    big_ext[big_n++] = (struct big_extent){p, n};
    atomic_fetch_add_explicit(&big_cached, n, memory_order_relaxed);
    return true;
}

/* At least `n` bytes of mapping (*got: how many), as many of them backed
 * already as the extents allow; NULL when no mapping can be had. An extent
 * of n to 2n bytes is taken whole; else the largest smaller one grows (its
 * pages move, the rest are fresh), else a bigger one is split (its rest
 * stays listed). So sizes that come and go together (a 4 MB entry and the
 * four 1 MB ring pages of its values) keep to their own extents, rather
 * than the small ones cutting up the big ones. */
static uint8_t *big_map(size_t n, size_t *got)
{
    uint8_t *p = NULL, *grow = NULL;
    size_t grow_n = 0;
    pthread_mutex_lock(&big_mu);
    unsigned fit = BIG_EXTENTS, below = BIG_EXTENTS, above = BIG_EXTENTS;
    for (unsigned i = 0; i < big_n; i++) {
        size_t e = big_ext[i].n;
        if (e >= n && e / 2 <= n) {
            if (fit == BIG_EXTENTS || e < big_ext[fit].n)
                fit = i;
        } else if (e < n) {
            if (below == BIG_EXTENTS || e > big_ext[below].n)
                below = i;
        } else if (above == BIG_EXTENTS || e < big_ext[above].n) {
            above = i;
        }
    }
    if (fit != BIG_EXTENTS) {
        p = big_ext[fit].p;
        *got = big_ext[fit].n;
        big_ext_remove(fit);
    } else if (below != BIG_EXTENTS) {
        grow = big_ext[below].p;
        grow_n = big_ext[below].n;
        big_ext_remove(below);
    } else if (above != BIG_EXTENTS) {
        p = big_ext[above].p;
        size_t rest = big_ext[above].n - n;
        big_ext_remove(above);
        (void)big_ext_add(p + n, rest); /* a slot was just freed */
        *got = n;
    }
    pthread_mutex_unlock(&big_mu);
    if (p != NULL)
        return p;
    atomic_store_explicit(&big_miss_n, n, memory_order_relaxed);
    int idle = 0;
    (void)atomic_compare_exchange_strong(&big_prefill_state, &idle, 1);
    *got = n;
    if (grow != NULL) {
        void *q = mremap(grow, grow_n, n, MREMAP_MAYMOVE);
        if (q != MAP_FAILED)
            return q;
        (void)munmap(grow, grow_n);
    }
    void *q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return q == MAP_FAILED ? NULL : q;
}

/* Keeps a freed big blob's mapping as an extent, then unmaps the smallest
 * extents while past big_max. */
static void big_unmap(uint8_t *p, size_t n)
{
    struct big_extent drop[BIG_EXTENTS + 1];
    unsigned n_drop = 0;
    pthread_mutex_lock(&big_mu);
    if (!big_ext_add(p, n))
        drop[n_drop++] = (struct big_extent){p, n};
    size_t max = atomic_load_explicit(&big_max, memory_order_relaxed);
    while (big_n != 0 && atomic_load_explicit(&big_cached, memory_order_relaxed) > max) {
        unsigned small = 0;
        for (unsigned i = 1; i < big_n; i++)
            if (big_ext[i].n < big_ext[small].n)
                small = i;
        drop[n_drop++] = big_ext[small];
        big_ext_remove(small);
    }
    pthread_mutex_unlock(&big_mu);
    for (unsigned i = 0; i < n_drop; i++)
        (void)munmap(drop[i].p, drop[i].n);
}

/* A big blob of `len` bytes, one reference; NULL when `len` is not a big
 * blob's size or no mapping can be had. */
static struct tk_blob *big_new(size_t len)
{
    size_t n = big_len(len);
    if (n == 0)
        return NULL;
    atomic_fetch_add_explicit(&big_allocs, 1, memory_order_relaxed);
    uint8_t *p = big_map(n, &n);
    if (p == NULL)
        return NULL;
    memcpy(p, &n, sizeof(n));
    struct tk_blob *b = (struct tk_blob *)(void *)(p + BIG_PREFIX);
    atomic_init(&b->refs, 1 | ((uint_fast32_t)BIG_CLASS << CLASS_SHIFT));
    b->len = len;
    return b;
}

static void big_free(struct tk_blob *b)
{
    uint8_t *p = (uint8_t *)b - BIG_PREFIX;
    size_t n;
    memcpy(&n, p, sizeof(n));
    big_unmap(p, n);
}

size_t tk_blob_big_cache_limit(size_t bytes)
{
    size_t was = atomic_exchange_explicit(&big_max, bytes, memory_order_relaxed);
    if (bytes < was)
        tk_blob_big_cache_drop();
    return was;
}

bool tk_blob_big_prefill_wanted(void)
{
    /* Asked every loop turn: a plain load first, the exchange only on a miss. */
    int wanted = 1;
    return atomic_load_explicit(&big_prefill_state, memory_order_relaxed) == wanted &&
           atomic_compare_exchange_strong(&big_prefill_state, &wanted, 2);
}

size_t tk_blob_big_prefill(size_t max)
{
    size_t n = atomic_load_explicit(&big_miss_n, memory_order_relaxed), added = 0;
    while (n != 0 && added + n <= max &&
           atomic_load_explicit(&big_cached, memory_order_relaxed) + n <=
               atomic_load_explicit(&big_max, memory_order_relaxed)) {
        void *p =
            mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            break;
        memset(p, 0, n); /* the page faults, here */
        big_unmap(p, n);
        added += n;
    }
    atomic_store(&big_prefill_state, 0);
    return added;
}

uint64_t tk_blob_big_allocs(void)
{
    return atomic_load_explicit(&big_allocs, memory_order_relaxed);
}

size_t tk_blob_big_cached_bytes(void)
{
    return atomic_load_explicit(&big_cached, memory_order_relaxed);
}

void tk_blob_big_cache_drop(void)
{
    struct big_extent all[BIG_EXTENTS];
    pthread_mutex_lock(&big_mu);
    unsigned n = big_n;
    memcpy(all, big_ext, n * sizeof(all[0]));
    while (big_n != 0)
        big_ext_remove(big_n - 1);
    pthread_mutex_unlock(&big_mu);
    for (unsigned i = 0; i < n; i++) {
        tk_release_pages(all[i].p, all[i].n); /* a slice at a time */
        (void)munmap(all[i].p, all[i].n);
    }
}

size_t tk_blob_cache_limit(size_t bytes)
{
    return atomic_exchange_explicit(&cache_max, bytes, memory_order_relaxed);
}

bool tk_blob_cache_enabled(void)
{
    return SMALL_CACHE;
}

size_t tk_blob_cached_bytes(void)
{
    return atomic_load_explicit(&small_cached, memory_order_relaxed) +
           atomic_load_explicit(&big_cached, memory_order_relaxed);
}

size_t tk_blob_map_live_bytes(void)
{
    return atomic_load_explicit(&map_live, memory_order_relaxed);
}

size_t tk_blob_live_small_bytes(void)
{
    return atomic_load_explicit(&small_live, memory_order_relaxed);
}

struct tk_blob *tk_blob_new(size_t len)
{
    TK_ASSERT(len <= SIZE_MAX - sizeof(struct tk_blob));
    unsigned c = SMALL_CACHE ? small_class(sizeof(struct tk_blob) + len) : 0;
    struct tk_blob *b = NULL;
    if (c != 0) {
        b = small_take(c);
        if (b == NULL)
            b = tk_malloc(class_size[c]);
        atomic_fetch_add_explicit(&small_live, class_size[c], memory_order_relaxed);
        atomic_init(&b->refs, 1 | ((uint_fast32_t)c << CLASS_SHIFT));
    } else if ((b = big_new(len)) != NULL) {
        return b;
    } else {
        b = tk_malloc(sizeof(*b) + len);
        atomic_init(&b->refs, 1);
    }
    b->len = len;
    return b;
}

struct tk_blob *tk_blob_try_new(size_t len)
{
    if (len > TK_BLOB_TRY_MAX)
        return NULL;
    struct tk_blob *b = big_new(len);
    if (b != NULL)
        return b;
    b = tk_try_malloc(sizeof(*b) + len);
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->len = len;
    return b;
}

/* A mapped blob: the refcount's top bit says so, and the 16 bytes before
 * the header (16: the header's alignment is kept) hold the mapping's length
 * and how many of its bytes an earlier blob on it (a spare's) wrote. */
#define MAP_PREFIX 16

static size_t map_len(size_t cap)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (cap > SIZE_MAX - MAP_PREFIX - sizeof(struct tk_blob) - page)
        return 0;
    return (MAP_PREFIX + sizeof(struct tk_blob) + cap + page - 1) & ~(page - 1);
}

/* Spare mappings (base/blob.h): a mapping's start and length per slot, under
 * a mutex (taken once per snapshot stream, never on a hot path). */
static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *spare_p[TK_BLOB_SPARES];
static size_t spare_n[TK_BLOB_SPARES];
static size_t spare_touched[TK_BLOB_SPARES]; /* of it, bytes written: resident */
static unsigned spare_keep = TK_BLOB_SPARES;
static atomic_size_t spare_total;

/* A spare at least `slack` past what is asked is cut to size when taken. */
#define SPARE_SLACK ((size_t)64 << 20)

static void map_drop(uint8_t *p, size_t n)
{
    tk_release_pages(p, n); /* a slice at a time (tk_free_big) */
    (void)munmap(p, n);
}

/* Is a spare of cand bytes a better pick than one of cur for n? The smallest
 * that holds n, else the largest. */
static bool spare_better(size_t cand, size_t cur, size_t n)
{
    if ((cand >= n) != (cur >= n))
        return cand >= n;
    return cand >= n ? cand < cur : cand > cur;
}

/* Takes the best spare for n bytes: its start, length and resident bytes;
 * NULL if there is none. */
static uint8_t *spare_take(size_t n, size_t *len, size_t *touched)
{
    pthread_mutex_lock(&spare_mu);
    int best = -1;
    for (int i = 0; i < TK_BLOB_SPARES; i++)
        if (spare_p[i] != NULL &&
            (best < 0 || spare_better(spare_n[i], spare_n[best], n)))
            best = i;
    uint8_t *p = NULL;
    if (best >= 0) {
        p = spare_p[best];
        *len = spare_n[best];
        *touched = spare_touched[best];
        spare_p[best] = NULL;
        atomic_fetch_sub(&spare_total, *touched);
    }
    pthread_mutex_unlock(&spare_mu);
    return p;
}

/* Keeps the mapping p of n bytes (touched of them written) as a spare, in a
 * free slot or in place of a smaller spare (dropped); false if not kept. */
static bool spare_park(uint8_t *p, size_t n, size_t touched)
{
    uint8_t *drop = NULL;
    size_t drop_n = 0;
    pthread_mutex_lock(&spare_mu);
    int slot = -1;
    for (unsigned i = 0; i < spare_keep; i++) {
        if (spare_p[i] == NULL) {
            slot = (int)i;
            break;
        }
        if (spare_n[i] < n && (slot < 0 || spare_n[i] < spare_n[slot]))
            slot = (int)i;
    }
    /* Within the budget once the spare it replaces (if any) is dropped. */
    size_t held = atomic_load(&spare_total);
    if (slot >= 0 && spare_p[slot] != NULL)
        held -= spare_touched[slot];
    if (slot >= 0 && held + touched > TK_BLOB_SPARE_BYTES)
        slot = -1;
    if (slot >= 0) {
        drop = spare_p[slot];
        if (drop != NULL) {
            drop_n = spare_n[slot];
            atomic_fetch_sub(&spare_total, spare_touched[slot]);
        }
        spare_p[slot] = p;
        spare_n[slot] = n;
        spare_touched[slot] = touched;
        atomic_fetch_add(&spare_total, touched);
    }
    pthread_mutex_unlock(&spare_mu);
    if (drop != NULL)
        map_drop(drop, drop_n);
    return slot >= 0;
}

size_t tk_blob_spare_bytes(void)
{
    return atomic_load(&spare_total);
}

/* Sets how many spares to keep (`keep`, or unchanged if above
 * TK_BLOB_SPARES) and drops the spares from slot `from` on; returns the
 * previous setting. */
static unsigned spares_drop_from(unsigned from, unsigned keep)
{
    uint8_t *drop[TK_BLOB_SPARES];
    size_t drop_n[TK_BLOB_SPARES];
    unsigned k = 0;
    pthread_mutex_lock(&spare_mu);
    unsigned old = spare_keep;
    if (keep <= TK_BLOB_SPARES)
        spare_keep = keep;
    for (unsigned i = from; i < TK_BLOB_SPARES; i++) {
        if (spare_p[i] == NULL)
            continue;
        drop[k] = spare_p[i];
        drop_n[k++] = spare_n[i];
        atomic_fetch_sub(&spare_total, spare_touched[i]);
        spare_p[i] = NULL;
    }
    pthread_mutex_unlock(&spare_mu);
    for (unsigned i = 0; i < k; i++)
        map_drop(drop[i], drop_n[i]);
    return old;
}

unsigned tk_blob_spares_keep(unsigned n)
{
    if (n > TK_BLOB_SPARES)
        n = TK_BLOB_SPARES;
    return spares_drop_from(n, n);
}

void tk_blob_spares_drop(void)
{
    spares_drop_from(0, TK_BLOB_SPARES + 1);
}

/* A spare for n bytes (grown or cut by mremap, its pages kept): its start,
 * length and resident bytes; NULL if there is none or it could not be
 * resized (then dropped). */
static uint8_t *spare_fit(size_t n, size_t *len, size_t *touched)
{
    size_t have;
    uint8_t *p = spare_take(n, &have, touched);
    if (p == NULL)
        return NULL;
    if (have >= n && have - n <= n + SPARE_SLACK) {
        *len = have; /* close enough: the room is the whole mapping */
        return p;
    }
    uint8_t *q = mremap(p, have, n, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        map_drop(p, have);
        return NULL;
    }
    *len = n;
    if (*touched > n)
        *touched = n;
    return q;
}

struct tk_blob *tk_blob_map(size_t cap)
{
    size_t n = map_len(cap);
    if (n == 0 || cap > TK_BLOB_TRY_MAX)
        return NULL;
    size_t touched = 0;
    uint8_t *p = spare_fit(n, &n, &touched);
    if (p == NULL) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        /* Huge pages where the system gives them on request: a 1.2 GB
         * snapshot stream faulted in 4 KiB pages was 300k page faults on the
         * thread filling it; a hint, so a refusal changes nothing. */
        (void)madvise(p, n, MADV_HUGEPAGE);
    }
    memcpy(p, &n, sizeof(n));
    memcpy(p + sizeof(n), &touched, sizeof(touched));
    atomic_fetch_add_explicit(&map_live, n, memory_order_relaxed);
    struct tk_blob *b = (struct tk_blob *)(void *)(p + MAP_PREFIX);
    atomic_init(&b->refs, 1 | MAPPED);
    b->len = 0;
    return b;
}

static uint8_t *map_base(const struct tk_blob *b, size_t *len)
{
    uint8_t *p = (uint8_t *)(uintptr_t)b - MAP_PREFIX;
    memcpy(len, p, sizeof(*len));
    return p;
}

size_t tk_blob_map_cap(const struct tk_blob *b)
{
    size_t n;
    map_base(b, &n);
    return n - MAP_PREFIX - sizeof(*b);
}

struct tk_blob *tk_blob_map_grow(struct tk_blob *b, size_t cap)
{
    TK_ASSERT((atomic_load(&b->refs) & MAPPED) != 0);
    size_t old, n = map_len(cap);
    uint8_t *p = map_base(b, &old);
    if (n <= old)
        return b;
    if (n == 0 || cap > TK_BLOB_TRY_MAX)
        return NULL;
    uint8_t *q = mremap(p, old, n, MREMAP_MAYMOVE);
    if (q == MAP_FAILED)
        return NULL;
    memcpy(q, &n, sizeof(n));
    atomic_fetch_add_explicit(&map_live, n - old, memory_order_relaxed);
    return (struct tk_blob *)(void *)(q + MAP_PREFIX);
}

struct tk_blob *tk_blob_copy(const void *src, size_t len)
{
    struct tk_blob *b = tk_blob_new(len);
    if (len != 0)
        memcpy(b->data, src, len);
    return b;
}

struct tk_blob *tk_blob_ref(struct tk_blob *b)
{
    if (b == NULL)
        return NULL;
    uint_fast32_t old =
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed) & COUNT_BITS;
    TK_ASSERT(old > 0);
    TK_ASSERT(old < COUNT_BITS);
    return b;
}

uint32_t tk_blob_refs(const struct tk_blob *b)
{
    return (uint32_t)(atomic_load_explicit(&((struct tk_blob *)(uintptr_t)b)->refs,
                                           memory_order_relaxed) &
                      COUNT_BITS);
}

void tk_blob_unref(struct tk_blob *b)
{
    if (b == NULL)
        return;
    uint_fast32_t old = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);
    TK_ASSERT((old & COUNT_BITS) > 0);
    if ((old & COUNT_BITS) != 1)
        return;
    unsigned c = (unsigned)((old & CLASS_BITS) >> CLASS_SHIFT);
    if (c == BIG_CLASS) {
        big_free(b);
        return;
    }
    if (c != 0) {
        atomic_fetch_sub_explicit(&small_live, class_size[c], memory_order_relaxed);
        small_put(b, c);
        return;
    }
    if ((old & MAPPED) == 0) {
        tk_free_big(b, sizeof(*b) + b->len); /* plain tk_free below 16 MiB */
        return;
    }
    size_t n, touched;
    uint8_t *p = map_base(b, &n);
    atomic_fetch_sub_explicit(&map_live, n, memory_order_relaxed);
    memcpy(&touched, p + sizeof(n), sizeof(touched));
    size_t wrote = MAP_PREFIX + sizeof(*b) + b->len;
    if (touched < wrote)
        touched = wrote < n ? wrote : n;
    if (!spare_park(p, n, touched))
        map_drop(p, n);
}
