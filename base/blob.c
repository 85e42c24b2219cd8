/* Reference-counted immutable byte buffers.
 *
 * The count is atomic so blobs may cross threads. Taking a reference is
 * relaxed (the taker already holds one, so the blob is alive); dropping one is
 * acquire-release, so every holder's use of the bytes happens before the free
 * by whichever thread drops the last reference. (Release plus an acquire fence
 * on the last drop would do, but ThreadSanitizer does not model fences.) */
#include "base/blob.h"

#include <string.h>

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
    uint_fast32_t old = atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    TK_ASSERT(old > 0);
    TK_ASSERT(old < UINT32_MAX);
    return b;
}

void tk_blob_unref(struct tk_blob *b)
{
    if (b == NULL)
        return;
    uint_fast32_t old = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);
    TK_ASSERT(old > 0);
    if (old == 1)
        tk_free(b);
}
