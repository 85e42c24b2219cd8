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

struct tk_blob *tk_blob_new(size_t len)
{
    TK_ASSERT(len <= SIZE_MAX - sizeof(struct tk_blob));
    struct tk_blob *b = tk_malloc(sizeof(*b) + len);
    atomic_init(&b->refs, 1);
    b->len = len;
    return b;
}

struct tk_blob *tk_blob_try_new(size_t len)
{
    if (len > TK_BLOB_TRY_MAX)
        return NULL;
    struct tk_blob *b = tk_try_malloc(sizeof(*b) + len);
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->len = len;
    return b;
}

/* A mapped blob: the refcount's top bit says so (it never changes, and the
 * count stays far below it), and the 16 bytes before the header (16: the
 * header's alignment is kept) hold the mapping's length and how many of its
 * bytes an earlier blob on it (a spare's) wrote. */
#define MAPPED ((uint_fast32_t)1 << 31)
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
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed) & ~MAPPED;
    TK_ASSERT(old > 0);
    TK_ASSERT(old < MAPPED - 1);
    return b;
}

void tk_blob_unref(struct tk_blob *b)
{
    if (b == NULL)
        return;
    uint_fast32_t old = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);
    TK_ASSERT((old & ~MAPPED) > 0);
    if ((old & ~MAPPED) != 1)
        return;
    if ((old & MAPPED) == 0) {
        tk_free_big(b, sizeof(*b) + b->len); /* plain tk_free below 16 MiB */
        return;
    }
    size_t n, touched;
    uint8_t *p = map_base(b, &n);
    memcpy(&touched, p + sizeof(n), sizeof(touched));
    size_t wrote = MAP_PREFIX + sizeof(*b) + b->len;
    if (touched < wrote)
        touched = wrote < n ? wrote : n;
    if (!spare_park(p, n, touched))
        map_drop(p, n);
}
