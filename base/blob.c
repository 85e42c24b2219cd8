/* Reference-counted immutable byte buffers.
 *
 * The count is atomic so blobs may cross threads. Taking a reference is
 * relaxed (the taker already holds one, so the blob is alive); dropping one is
 * acquire-release, so every holder's use of the bytes happens before the free
 * by whichever thread drops the last reference. (Release plus an acquire fence
 * on the last drop would do, but ThreadSanitizer does not model fences.) */
#include "base/blob.h"

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
 * count stays far below it), and the mapping's length sits in the 16 bytes
 * before the header (16: the header's alignment is kept). */
#define MAPPED ((uint_fast32_t)1 << 31)
#define MAP_PREFIX 16

static size_t map_len(size_t cap)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (cap > SIZE_MAX - MAP_PREFIX - sizeof(struct tk_blob) - page)
        return 0;
    return (MAP_PREFIX + sizeof(struct tk_blob) + cap + page - 1) & ~(page - 1);
}

struct tk_blob *tk_blob_map(size_t cap)
{
    size_t n = map_len(cap);
    if (n == 0 || cap > TK_BLOB_TRY_MAX)
        return NULL;
    uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* Huge pages where the system gives them on request: a 1.2 GB
     * snapshot stream faulted in 4 KiB pages was 300k page faults on the
     * thread filling it; a hint, so a refusal changes nothing. */
    (void)madvise(p, n, MADV_HUGEPAGE);
    memcpy(p, &n, sizeof(n));
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
    size_t n;
    uint8_t *p = map_base(b, &n);
    tk_release_pages(p, n); /* a slice at a time (tk_free_big) */
    (void)munmap(p, n);
}
