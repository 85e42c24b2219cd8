/* Counting allocation wrappers.
 *
 * Every tierkv allocation goes through here so benchmarks can report calls and
 * bytes per operation. Counters are relaxed atomics: they are statistics, not
 * synchronisation. Out of memory aborts with a message (every structure has a
 * hard limit, so it is a bug or a misconfiguration). A zero-byte request is
 * served as one byte so that NULL always means failure. */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_uint_fast64_t alloc_calls;
static atomic_uint_fast64_t alloc_bytes;

static void count(size_t bytes)
{
    atomic_fetch_add_explicit(&alloc_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&alloc_bytes, bytes, memory_order_relaxed);
}

static _Noreturn void out_of_memory(size_t bytes)
{
    fprintf(stderr, "tierkv: out of memory allocating %zu bytes\n", bytes);
    fflush(stderr);
    abort();
}

void *tk_malloc(size_t size)
{
    count(size);
    void *p = malloc(size != 0 ? size : 1);
    if (p == NULL)
        out_of_memory(size);
    return p;
}

void *tk_try_malloc(size_t size)
{
    count(size);
    return malloc(size != 0 ? size : 1);
}

void *tk_calloc(size_t n, size_t size)
{
    /* An overflowing product is a caller bug; treat it like exhaustion
     * rather than letting calloc's own check return NULL later. */
    if (size != 0 && n > SIZE_MAX / size)
        out_of_memory(SIZE_MAX);
    size_t total = n * size;
    count(total);
    void *p = calloc(total != 0 ? n : 1, total != 0 ? size : 1);
    if (p == NULL)
        out_of_memory(total);
    return p;
}

void *tk_realloc(void *ptr, size_t size)
{
    count(size);
    /* realloc(p, 0) may free p and return NULL; never ask for zero. */
    void *p = realloc(ptr, size != 0 ? size : 1);
    if (p == NULL)
        out_of_memory(size);
    return p;
}

void tk_free(void *ptr)
{
    free(ptr);
}

#define FREE_SLICE ((size_t)16 << 20)

void tk_release_pages(void *ptr, size_t len)
{
    if (ptr == NULL || len <= FREE_SLICE)
        return;
    /* Only whole pages inside [ptr, ptr + len). */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)ptr + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)ptr + len) & ~(page - 1);
    for (; a < end; a += FREE_SLICE) {
        size_t n = end - a < FREE_SLICE ? end - a : FREE_SLICE;
        (void)madvise((void *)a, n, MADV_DONTNEED);
    }
}

void tk_free_big(void *ptr, size_t len)
{
    /* The allocator's own header, before ptr, is left alone; the pages read
     * back as zeros, which nothing reads: the allocation is freed next. */
    tk_release_pages(ptr, len);
    free(ptr);
}

static size_t page_round(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (n > SIZE_MAX - page)
        out_of_memory(n);
    return (n + page - 1) & ~(page - 1);
}

void *tk_array_grow(void *p, size_t old_bytes, size_t new_bytes)
{
    if (new_bytes < TK_ARRAY_MAPPED_MIN)
        return tk_realloc(p, new_bytes);
    count(new_bytes);
    size_t want = page_round(new_bytes);
    void *q;
    if (p != NULL && old_bytes >= TK_ARRAY_MAPPED_MIN) {
        q = mremap(p, page_round(old_bytes), want, MREMAP_MAYMOVE);
    } else {
        q = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q != MAP_FAILED && p != NULL) {
            memcpy(q, p, old_bytes); /* under TK_ARRAY_MAPPED_MIN */
            free(p);
        }
    }
    if (q == MAP_FAILED)
        out_of_memory(new_bytes);
    return q;
}

void tk_array_free(void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (bytes >= TK_ARRAY_MAPPED_MIN)
        (void)munmap(p, page_round(bytes));
    else
        free(p);
}

/* The smallest number of elements of `elem` bytes that fills whole pages. */
static size_t page_unit(size_t elem)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), a = page, b = elem;
    while (b != 0) { /* gcd */
        size_t t = a % b;
        a = b;
        b = t;
    }
    return page / a; /* lcm(page, elem) / elem */
}

void *tk_array_shift(void *p, size_t cap_bytes, size_t elem, size_t head, size_t n,
                     size_t *new_head)
{
    size_t unit = page_unit(elem);
    size_t drop = head / unit * unit; /* elements: whole pages */
    if (cap_bytes < TK_ARRAY_MAPPED_MIN || drop == 0) {
        memmove(p, (char *)p + head * elem, n * elem);
        *new_head = 0;
        return p;
    }
    size_t cap = page_round(cap_bytes), front = drop * elem;
    /* The pages from `front` on move to an array of the whole capacity (the
     * kernel moves page table entries; grown in place where it can), and the
     * pages in front are unmapped. */
    void *q = mremap((char *)p + front, cap - front, cap, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        memmove(p, (char *)p + head * elem, n * elem); /* no address space: copy */
        *new_head = 0;
        return p;
    }
    (void)munmap(p, front);
    *new_head = head - drop;
    return q;
}

char *tk_strdup(const char *s)
{
    size_t len = strlen(s) + 1;
    char *p = tk_malloc(len);
    memcpy(p, s, len);
    return p;
}

void tk_alloc_stats(struct tk_alloc_stats *out)
{
    out->calls = atomic_load_explicit(&alloc_calls, memory_order_relaxed);
    out->bytes = atomic_load_explicit(&alloc_bytes, memory_order_relaxed);
}
