/* Unit tests for base/: errors, assertions, allocation counting, blobs,
 * logfmt logging, little-endian helpers, CRC32C, the histogram, the PRNG,
 * both queues, per-thread nice values and the data directory's lock.
 *
 * One Check suite per module, all run by one SRunner; the process exits
 * non-zero if any test fails. The queue suites include real multi-threaded
 * runs (pthreads) that check every item arrives exactly once and in each
 * producer's order. Tests that expect an abort run the code in a forked child
 * and inspect its exit status and stderr, so they work with CK_FORK=no too. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <regex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/base64.h"
#include "base/blob.h"
#include "base/clock.h"
#include "base/crc32c.h"
#include "base/dirlock.h"
#include "base/endian.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/hostport.h"
#include "base/log.h"
#include "base/nice.h"
#include "base/prng.h"
#include "base/queue.h"
#include "base/sync.h"
#include "tests/check_run.h"

/* Under a sanitizer, the sanitizer's allocator owns the heap and mallinfo2()
 * reports nothing; ask the allocator instead. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEST_SANITIZER_HEAP 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_SANITIZER_HEAP 1
#endif
#ifdef TEST_SANITIZER_HEAP
/* From <sanitizer/allocator_interface.h>, which gcc does not always ship. */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

/* ---- helpers ------------------------------------------------------------ */

/* Check's ck_assert records a mark point (a write to its pipe) on every
 * success; hot loops use this instead, which only calls into Check on
 * failure. */
#define FAST_ASSERT(cond)                                                                \
    do {                                                                                 \
        if (!(cond))                                                                     \
            ck_abort_msg("Assertion '%s' failed", #cond);                                \
    } while (0)

/* Runs fn() in a child with stderr captured into `out`; returns the raw wait
 * status. */
static int run_in_child(void (*fn)(void), char *out, size_t cap)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fds[0], out + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap - 1)
            break;
    }
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

static int died_of_abort(int status)
{
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

/* Bytes currently allocated from the heap (ASan's allocator or glibc's). */
static size_t heap_in_use(void)
{
#ifdef TEST_SANITIZER_HEAP
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

static void *item_of(uintptr_t v)
{
    return (void *)v;
}

static uintptr_t value_of(void *p)
{
    return (uintptr_t)p;
}

/* ---- err ---------------------------------------------------------------- */

struct err_row {
    const char *name;
    int value;
    const char *msg;
};

static const struct err_row err_rows[] = {
#define ROW(name, value, msg) {#name, (value), (msg)},
    TK_ERRORS(ROW)
#undef ROW
};
#define ERR_ROWS (sizeof(err_rows) / sizeof(err_rows[0]))

START_TEST(test_strerror_names_every_code)
{
    ck_assert_uint_ge(ERR_ROWS, 20);
    for (size_t i = 0; i < ERR_ROWS; i++) {
        ck_assert_str_eq(tk_strerror(err_rows[i].value), err_rows[i].msg);
        ck_assert_str_eq(tk_errname(err_rows[i].value), err_rows[i].name);
        ck_assert_str_ne(tk_strerror(err_rows[i].value), "unknown error");
    }
    ck_assert_str_eq(tk_errname(TK_EBUSY), "TK_EBUSY");
    ck_assert_str_eq(tk_strerror(0), "success");
}
END_TEST

START_TEST(test_strerror_reports_unknown_codes)
{
    ck_assert_str_eq(tk_strerror(-1000), "unknown error");
    ck_assert_str_eq(tk_strerror(7), "unknown error");
    ck_assert_str_eq(tk_errname(-1000), "TK_E?");
}
END_TEST

START_TEST(test_error_codes_are_distinct_and_not_positive)
{
    for (size_t i = 0; i < ERR_ROWS; i++) {
        ck_assert_int_le(err_rows[i].value, 0);
        for (size_t j = i + 1; j < ERR_ROWS; j++)
            ck_assert_int_ne(err_rows[i].value, err_rows[j].value);
    }
    ck_assert_int_eq(TK_OK, 0);
}
END_TEST

/* ---- assert ------------------------------------------------------------- */

static void child_assert_false(void)
{
    int x = 1;
    TK_ASSERT(x == 2);
}

static void child_unreachable(void)
{
    TK_UNREACHABLE();
}

START_TEST(test_assert_failure_aborts_naming_expression_and_line)
{
    char err[1024];
    int status = run_in_child(child_assert_false, err, sizeof(err));
    ck_assert_msg(died_of_abort(status), "status %d", status);
    ck_assert_ptr_nonnull(strstr(err, "x == 2"));
    ck_assert_ptr_nonnull(strstr(err, "base_test.c"));
    ck_assert_ptr_nonnull(strstr(err, "child_assert_false"));
}
END_TEST

START_TEST(test_unreachable_aborts)
{
    char err[1024];
    int status = run_in_child(child_unreachable, err, sizeof(err));
    ck_assert(died_of_abort(status));
    ck_assert_ptr_nonnull(strstr(err, "unreachable"));
}
END_TEST

START_TEST(test_assert_passes_and_evaluates_once)
{
    int n = 0;
    TK_ASSERT(++n == 1);
    ck_assert_int_eq(n, 1);
}
END_TEST

/* ---- alloc -------------------------------------------------------------- */

START_TEST(test_alloc_counts_calls_and_bytes)
{
    struct tk_alloc_stats a, b;
    tk_alloc_stats(&a);
    char *p = tk_malloc(100);
    int *q = tk_calloc(3, 10);
    p = tk_realloc(p, 200);
    char *s = tk_strdup("abc");
    tk_alloc_stats(&b);
    ck_assert_uint_eq(b.calls - a.calls, 4);
    ck_assert_uint_eq(b.bytes - a.bytes, 100 + 30 + 200 + 4);
    ck_assert_str_eq(s, "abc");
    tk_free(p);
    tk_free(q);
    tk_free(s);
    tk_free(NULL);
    struct tk_alloc_stats c;
    tk_alloc_stats(&c);
    ck_assert_uint_eq(c.calls, b.calls); /* frees are not counted */
}
END_TEST

START_TEST(test_calloc_zeroes_and_zero_size_is_not_null)
{
    unsigned char *z = tk_calloc(64, 16);
    for (size_t i = 0; i < 64 * 16; i++)
        FAST_ASSERT(z[i] == 0);
    tk_free(z);
    void *a = tk_malloc(0);
    void *b = tk_calloc(0, 8);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    a = tk_realloc(a, 0);
    ck_assert_ptr_nonnull(a);
    tk_free(a);
    tk_free(b);
}
END_TEST

START_TEST(test_realloc_keeps_contents)
{
    char *p = tk_malloc(8);
    memcpy(p, "tierkv!", 8);
    p = tk_realloc(p, 1 << 20);
    ck_assert_str_eq(p, "tierkv!");
    tk_free(p);
}
END_TEST

static void child_calloc_overflow(void)
{
    void *p = tk_calloc(SIZE_MAX / 2, 4);
    tk_free(p);
}

START_TEST(test_calloc_overflow_aborts_with_message)
{
    char err[1024];
    int status = run_in_child(child_calloc_overflow, err, sizeof(err));
    ck_assert(died_of_abort(status));
    ck_assert_ptr_nonnull(strstr(err, "out of memory"));
}
END_TEST

/* ---- blob --------------------------------------------------------------- */

START_TEST(test_blob_copy_holds_bytes_and_one_ref)
{
    struct tk_blob *b = tk_blob_copy("hello", 5);
    ck_assert_uint_eq(b->len, 5);
    ck_assert_int_eq(memcmp(b->data, "hello", 5), 0);
    ck_assert_uint_eq(tk_blob_refs(b), 1);
    tk_blob_unref(b);
    struct tk_blob *e = tk_blob_copy(NULL, 0);
    ck_assert_uint_eq(e->len, 0);
    tk_blob_unref(e);
}
END_TEST

START_TEST(test_blob_refcount_frees_on_last_unref)
{
    const size_t len = 64 * 1024;
    size_t before = heap_in_use();
    struct tk_blob *b = tk_blob_new(len);
    memset(b->data, 0xab, len);
    size_t live = heap_in_use();
    ck_assert_uint_ge(live, before + len);
    ck_assert_ptr_eq(tk_blob_ref(b), b);
    ck_assert_ptr_eq(tk_blob_ref(b), b);
    ck_assert_uint_eq(tk_blob_refs(b), 3);
    tk_blob_unref(b);
    tk_blob_unref(b);
    ck_assert_uint_eq(tk_blob_refs(b), 1);
    ck_assert_uint_ge(heap_in_use(), live); /* still held: not freed */
    ck_assert_uint_eq(b->data[len - 1], 0xab);
    tk_blob_unref(b);
    ck_assert_uint_le(heap_in_use(), live - len);
}
END_TEST

/* A mapped blob (a snapshot stream's): room reserved, grown by remapping
 * with its bytes kept, counted like any blob, unmapped on the last unref. */
START_TEST(test_mapped_blob_grows_keeps_bytes_and_unmaps)
{
    tk_blob_spares_keep(0); /* no spares: the last unref unmaps */
    struct tk_blob *b = tk_blob_map(100000);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(b->len, 0);
    ck_assert_uint_ge(tk_blob_map_cap(b), 100000);
    for (size_t i = 0; i < 100000; i++)
        b->data[i] = (uint8_t)(i * 7);
    b->len = 100000;
    struct tk_blob *g = tk_blob_map_grow(b, (size_t)40 << 20);
    ck_assert_ptr_nonnull(g);
    ck_assert_uint_ge(tk_blob_map_cap(g), (size_t)40 << 20);
    ck_assert_ptr_eq(tk_blob_map_grow(g, 1000), g); /* room enough: unchanged */
    ck_assert_uint_eq(g->len, 100000);
    for (size_t i = 0; i < 100000; i++)
        ck_assert_uint_eq(g->data[i], (uint8_t)(i * 7));
    memset(g->data + 100000, 0xcd, ((size_t)40 << 20) - 100000);
    g->len = (size_t)40 << 20;
    ck_assert_ptr_eq(tk_blob_ref(g), g);
    ck_assert_ptr_eq(tk_blob_ref(g), g);
    tk_blob_unref(g);
    tk_blob_unref(g);
    ck_assert_uint_eq(g->data[g->len - 1], 0xcd); /* one reference left */
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *last =
        (uint8_t *)((uintptr_t)(g->data + g->len - 1) & ~(uintptr_t)(page - 1));
    unsigned char vec;
    ck_assert_int_eq(mincore(last, (size_t)page, &vec), 0);
    tk_blob_unref(g);
    ck_assert_int_eq(mincore(last, (size_t)page, &vec), -1); /* unmapped */
    ck_assert_int_eq(errno, ENOMEM);

    /* tk_release_pages: the whole pages of a big region read as zeros after
     * (given back), the region stays usable. */
    size_t big = (size_t)40 << 20;
    uint8_t *p = tk_malloc(big);
    memset(p, 0xab, big);
    tk_release_pages(p, big);
    ck_assert_uint_eq(p[big / 2], 0);
    p[big / 2] = 1;
    tk_free_big(p, big);
    tk_blob_spares_keep(TK_BLOB_SPARES);
}
END_TEST

/* A mapped blob's last unref keeps its mapping as a spare, and the next
 * tk_blob_map takes it with its pages (the old bytes, not fresh zeros):
 * grown, or cut to size when far too large; the largest two are kept. */
static struct tk_blob *filled_map(size_t len, uint8_t fill)
{
    struct tk_blob *b = tk_blob_map(len);
    ck_assert_ptr_nonnull(b);
    memset(b->data, fill, len);
    b->len = len;
    return b;
}

START_TEST(test_mapped_blob_spare_is_reused)
{
    const size_t mib = (size_t)1 << 20;
    tk_blob_spares_keep(TK_BLOB_SPARES);
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
    tk_blob_unref(filled_map(mib, 0x5a));
    ck_assert_uint_ge(tk_blob_spare_bytes(), mib);

    struct tk_blob *b = tk_blob_map(mib);
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
    ck_assert_uint_eq(b->len, 0);
    ck_assert_uint_eq(b->data[0], 0x5a); /* the spare's pages, not new ones */
    ck_assert_uint_eq(b->data[mib - 1], 0x5a);
    tk_blob_unref(b);

    b = tk_blob_map(200 * mib); /* grown: the pages kept */
    ck_assert_uint_ge(tk_blob_map_cap(b), 200 * mib);
    ck_assert_uint_eq(b->data[mib - 1], 0x5a);
    tk_blob_unref(b);
    ck_assert_uint_ge(tk_blob_spare_bytes(), mib); /* written: 1 MiB of it */
    ck_assert_uint_lt(tk_blob_spare_bytes(), 2 * mib);

    b = tk_blob_map(4096); /* far too large: cut to size, its start kept */
    ck_assert_uint_lt(tk_blob_map_cap(b), mib);
    ck_assert_uint_eq(b->data[0], 0x5a);
    tk_blob_unref(b);
    ck_assert_uint_lt(tk_blob_spare_bytes(), mib);

    /* Three dropped at once: the two largest stay. */
    struct tk_blob *x = filled_map(2 * mib, 1), *y = filled_map(3 * mib, 2),
                   *z = filled_map(4 * mib, 3);
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0); /* the small spare was taken */
    tk_blob_unref(x);
    tk_blob_unref(y);
    tk_blob_unref(z);
    ck_assert_uint_ge(tk_blob_spare_bytes(), 7 * mib);
    ck_assert_uint_lt(tk_blob_spare_bytes(), 8 * mib);
    b = tk_blob_map(4 * mib);
    ck_assert_uint_eq(b->data[4 * mib - 1], 3);
    tk_blob_unref(b);

    /* Past TK_BLOB_SPARE_BYTES written: not kept (its length counts as
     * written; the pages are never touched). */
    tk_blob_spares_keep(0);
    tk_blob_spares_keep(TK_BLOB_SPARES);
    b = tk_blob_map(TK_BLOB_SPARE_BYTES + mib);
    ck_assert_ptr_nonnull(b);
    b->len = TK_BLOB_SPARE_BYTES + mib;
    tk_blob_unref(b);
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
    tk_blob_unref(filled_map(mib, 9)); /* under it: kept */
    ck_assert_uint_ge(tk_blob_spare_bytes(), mib);

    /* Dropped now; the next ones are kept as before. */
    tk_blob_unref(filled_map(2 * mib, 8)); /* on the 1 MiB spare, grown */
    ck_assert_uint_ge(tk_blob_spare_bytes(), 2 * mib);
    tk_blob_spares_drop();
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
    tk_blob_unref(filled_map(mib, 6));
    ck_assert_uint_ge(tk_blob_spare_bytes(), mib);

    ck_assert_uint_eq(tk_blob_spares_keep(0), TK_BLOB_SPARES);
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
    tk_blob_unref(filled_map(mib, 7)); /* none kept now */
    ck_assert_uint_eq(tk_blob_spare_bytes(), 0);
}
END_TEST

START_TEST(test_blob_ref_and_unref_accept_null)
{
    ck_assert_ptr_null(tk_blob_ref(NULL));
    tk_blob_unref(NULL);
}
END_TEST

#define BLOB_THREADS 4
#define BLOB_ROUNDS 100000

static void *blob_hammer(void *arg)
{
    struct tk_blob *b = arg;
    for (int i = 0; i < BLOB_ROUNDS; i++) {
        tk_blob_ref(b);
        tk_blob_unref(b);
    }
    /* Each thread was handed a reference; it drops it when done. */
    tk_blob_unref(b);
    return NULL;
}

START_TEST(test_blob_refcount_is_exact_across_threads)
{
    struct tk_blob *b = tk_blob_copy("shared", 6);
    pthread_t t[BLOB_THREADS];
    for (int i = 0; i < BLOB_THREADS; i++) {
        tk_blob_ref(b);
        ck_assert_int_eq(pthread_create(&t[i], NULL, blob_hammer, b), 0);
    }
    for (int i = 0; i < BLOB_THREADS; i++)
        ck_assert_int_eq(pthread_join(t[i], NULL), 0);
    ck_assert_uint_eq(tk_blob_refs(b), 1);
    ck_assert_int_eq(memcmp(b->data, "shared", 6), 0);
    tk_blob_unref(b);
}
END_TEST

/* The small-blob cache (base/blob.c): a freed small blob is the next one of
 * its class; blobs made on one thread and freed on another come back
 * through the depot without allocating; a thread's cache outlives the
 * thread; the cache holds at most 32 MiB. Under AddressSanitizer the cache
 * is off and holds nothing. */
#define CACHE_BLOBS 4096

static void *blob_free_all(void *arg)
{
    struct tk_blob **v = arg;
    for (int i = 0; i < CACHE_BLOBS; i++)
        tk_blob_unref(v[i]);
    return NULL;
}

START_TEST(test_blob_cache_reuses_across_threads)
{
    static struct tk_blob *v[CACHE_BLOBS];
    struct tk_blob *a = tk_blob_new(100);
    tk_blob_unref(a);
    struct tk_blob *b = tk_blob_new(90); /* the same class (128 bytes) */
    ck_assert_uint_eq(tk_blob_refs(b), 1);
    ck_assert_uint_eq(b->len, 90);
    if (tk_blob_cache_enabled())
        ck_assert_ptr_eq(a, b);
    tk_blob_unref(b);

    for (int i = 0; i < CACHE_BLOBS; i++)
        v[i] = tk_blob_copy("0123456789", 10);
    size_t before = tk_blob_cached_bytes();
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, blob_free_all, v), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    size_t freed = tk_blob_cached_bytes() - before;
    if (!tk_blob_cache_enabled()) {
        ck_assert_uint_eq(tk_blob_cached_bytes(), 0);
        return;
    }
    /* Every one is kept (the ended thread's cache went to the depot) ... */
    ck_assert_uint_eq(freed, (size_t)CACHE_BLOBS * 64);
    /* ... and this thread takes them back with no allocation. */
    struct tk_alloc_stats s0, s1;
    tk_alloc_stats(&s0);
    for (int i = 0; i < CACHE_BLOBS; i++)
        v[i] = tk_blob_copy("abcdefghij", 10);
    tk_alloc_stats(&s1);
    ck_assert_uint_eq(s1.calls - s0.calls, 0);
    for (int i = 0; i < CACHE_BLOBS; i++) {
        ck_assert_int_eq(memcmp(v[i]->data, "abcdefghij", 10), 0);
        tk_blob_unref(v[i]);
    }
}
END_TEST

START_TEST(test_blob_cache_is_bounded)
{
    /* 48 MiB of 4 KiB blobs freed at once: the cache keeps at most 32 MiB
     * (and a thread's own 64), frees the rest. */
    size_t n = (48u << 20) / 4096;
    struct tk_blob **v = malloc(n * sizeof(*v));
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = tk_blob_new(4000);
    for (size_t i = 0; i < n; i++)
        tk_blob_unref(v[i]);
    free(v);
    size_t held = tk_blob_cached_bytes();
    if (tk_blob_cache_enabled())
        ck_assert_uint_ge(held, 16u << 20);
    ck_assert_uint_le(held, (32u << 20) + 64 * 4096 + 32 * 4096);
}
END_TEST

static long minor_faults(void)
{
    struct rusage ru;
    ck_assert_int_eq(getrusage(RUSAGE_THREAD, &ru), 0);
    return ru.ru_minflt;
}

START_TEST(test_blob_big_cache)
{
    /* A freed big blob's pages are kept: the next big blob of n bytes takes
     * an extent of n to 2n whole, or splits a bigger one (its rest stays
     * listed), and writes it without page faults; the cache is bounded,
     * counted in tk_blob_cached_bytes, and emptied by tk_blob_big_cache_drop. */
    size_t base = tk_blob_cached_bytes();
    struct tk_blob *a = tk_blob_new(4u << 20);
    memset(a->data, 7, a->len);
    tk_blob_unref(a);
    if (!tk_blob_cache_enabled()) {
        ck_assert_uint_eq(tk_blob_cached_bytes(), base);
        return;
    }
    ck_assert_uint_ge(tk_blob_cached_bytes() - base, 4u << 20);
    ck_assert_uint_le(tk_blob_cached_bytes() - base, (4u << 20) + 8192);
    long f0 = minor_faults();
    struct tk_blob *b = tk_blob_new(3u << 20); /* a's extent, taken whole */
    memset(b->data, 8, b->len);
    long faults = minor_faults() - f0;
    ck_assert_msg(faults < 64, "%ld page faults writing 3 MiB of kept pages", faults);
    ck_assert_ptr_eq(a, b);
    ck_assert_uint_eq(b->len, 3u << 20);
    ck_assert_uint_eq(tk_blob_refs(b), 1);
    ck_assert_uint_eq(tk_blob_cached_bytes(), base);
    /* A quarter of a kept extent: split, the rest listed. */
    tk_blob_unref(b);
    f0 = minor_faults();
    struct tk_blob *q = tk_blob_new(1u << 20);
    memset(q->data, 6, q->len);
    faults = minor_faults() - f0;
    ck_assert_msg(faults < 64, "%ld page faults writing 1 MiB of kept pages", faults);
    ck_assert_ptr_eq(q, b);
    ck_assert_uint_ge(tk_blob_cached_bytes() - base, 3u << 20); /* the rest */
    ck_assert_uint_le(tk_blob_cached_bytes() - base, (3u << 20) + 8192);
    tk_blob_unref(q);
    tk_blob_big_cache_drop();
    (void)tk_blob_big_prefill_wanted(); /* what earlier misses asked */
    (void)tk_blob_big_prefill(0);
    b = tk_blob_new(3u << 20);
    memset(b->data, 8, b->len);
    /* That miss asks for a prefill, once; a cancelled one (max 0) only ends
     * it, so the next miss asks again; a prefill keeps extents of its size. */
    ck_assert(tk_blob_big_prefill_wanted());
    ck_assert(!tk_blob_big_prefill_wanted());
    ck_assert_uint_eq(tk_blob_big_prefill(0), 0);
    struct tk_blob *m = tk_blob_new(3u << 20);
    ck_assert(tk_blob_big_prefill_wanted());
    size_t added = tk_blob_big_prefill(4u << 20);
    ck_assert_uint_ge(added, 3u << 20);
    ck_assert_uint_eq(tk_blob_cached_bytes() - base, added);
    tk_blob_unref(m);
    tk_blob_big_cache_drop();
    /* None kept: a fresh mapping. */
    struct tk_blob *c = tk_blob_try_new(3u << 20);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_ne(b, c);
    ck_assert_uint_eq(tk_blob_cached_bytes(), base);
    memset(c->data, 9, c->len);
    ck_assert_uint_eq(b->data[(3u << 20) - 1], 8);
    tk_blob_unref(b);
    tk_blob_unref(c);
    /* Bounded: 64 blobs of 1 MiB freed at once, at most the limit kept. */
    size_t was = tk_blob_big_cache_limit(8u << 20);
    ck_assert_uint_le(tk_blob_cached_bytes() - base, 8u << 20);
    struct tk_blob *v[64];
    for (int i = 0; i < 64; i++)
        v[i] = tk_blob_new(1u << 20);
    for (int i = 0; i < 64; i++)
        tk_blob_unref(v[i]);
    ck_assert_uint_le(tk_blob_cached_bytes() - base, 8u << 20);
    ck_assert_uint_ge(tk_blob_cached_bytes() - base, 6u << 20);
    tk_blob_big_cache_drop();
    ck_assert_uint_eq(tk_blob_cached_bytes(), base);
    /* Past BIG_MAX (64 MiB) a blob is plain memory, never kept. */
    struct tk_blob *e = tk_blob_new(65u << 20);
    tk_blob_unref(e);
    ck_assert_uint_eq(tk_blob_cached_bytes(), base);
    (void)tk_blob_big_cache_limit(was);
}
END_TEST

struct blob_reader {
    pthread_t thread;
    struct tk_blob *blob;
    unsigned long sum;
};

static void *blob_read_and_drop(void *arg)
{
    struct blob_reader *r = arg;
    for (size_t i = 0; i < r->blob->len; i++)
        r->sum += r->blob->data[i];
    tk_blob_unref(r->blob);
    return NULL;
}

START_TEST(test_blob_last_unref_on_any_thread_frees_once)
{
    /* The creator drops its reference at once; whichever reader finishes
     * last frees. ASan/TSan builds turn a premature or double free into a
     * failure; the heap check catches a leak in any build. */
    size_t before = heap_in_use();
    for (int round = 0; round < 50; round++) {
        struct tk_blob *b = tk_blob_new(4096);
        memset(b->data, 1, b->len);
        struct blob_reader r[BLOB_THREADS];
        for (int i = 0; i < BLOB_THREADS; i++) {
            r[i] = (struct blob_reader){.blob = tk_blob_ref(b)};
            ck_assert_int_eq(
                pthread_create(&r[i].thread, NULL, blob_read_and_drop, &r[i]), 0);
        }
        tk_blob_unref(b);
        for (int i = 0; i < BLOB_THREADS; i++) {
            ck_assert_int_eq(pthread_join(r[i].thread, NULL), 0);
            ck_assert_uint_eq(r[i].sum, 4096);
        }
    }
    ck_assert_uint_lt(heap_in_use(), before + 4096);
}
END_TEST

/* ---- log ---------------------------------------------------------------- */

struct capture {
    char buf[8192];
    size_t len;
    int lines;
    size_t longest;
};

static void capture_sink(const char *line, size_t len, void *data)
{
    struct capture *c = data;
    ck_assert_uint_gt(len, 0);
    ck_assert_int_eq(line[len - 1], '\n');
    if (len > c->longest)
        c->longest = len;
    size_t n = len < sizeof(c->buf) - 1 - c->len ? len : sizeof(c->buf) - 1 - c->len;
    memcpy(c->buf + c->len, line, n);
    c->len += n;
    c->buf[c->len] = '\0';
    c->lines++;
}

static struct capture *capture_start(void)
{
    static struct capture c;
    memset(&c, 0, sizeof(c));
    tk_log_set_sink(capture_sink, &c);
    tk_log_set_level(TK_LOG_INFO);
    return &c;
}

static void capture_stop(void)
{
    tk_log_set_sink(NULL, NULL);
    tk_log_set_level(TK_LOG_INFO);
}

/* The text after the timestamp: from " level=" on. */
static const char *after_ts(const struct capture *c)
{
    const char *p = strstr(c->buf, " level=");
    ck_assert_ptr_nonnull(p);
    return p + 1;
}

START_TEST(test_log_line_is_logfmt_with_node_term_and_kv)
{
    struct capture *c = capture_start();
    tk_logf(TK_LOG_INFO, 2, 5, "k=v n=3", "became %s", "leader");
    capture_stop();
    ck_assert_int_eq(c->lines, 1);

    regex_t re;
    ck_assert_int_eq(
        regcomp(&re,
                "^ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                "\\.[0-9]{3}Z level=info node=2 term=5 msg=\"became leader\" "
                "k=v n=3\n$",
                REG_EXTENDED | REG_NOSUB),
        0);
    int m = regexec(&re, c->buf, 0, NULL, 0);
    regfree(&re);
    ck_assert_msg(m == 0, "line not logfmt: %s", c->buf);

    /* The timestamp is now, in UTC. */
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    ck_assert_ptr_nonnull(strptime(c->buf, "ts=%Y-%m-%dT%H:%M:%S", &tm));
    time_t logged = timegm(&tm);
    /* The clock the log reads (CLOCK_REALTIME), not time(), which reads the
     * coarse clock and may be a tick behind it. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t now = ts.tv_sec;
    ck_assert_int_le(logged, now);
    ck_assert_int_ge(logged, now - 5);
}
END_TEST

START_TEST(test_log_escapes_quotes_newlines_and_controls_in_msg)
{
    struct capture *c = capture_start();
    tk_logf(TK_LOG_WARN, 1, 1, NULL, "say \"hi\"\nback\\slash\ttab%cbell", '\a');
    capture_stop();
    ck_assert_int_eq(c->lines, 1);
    ck_assert_str_eq(after_ts(c),
                     "level=warn node=1 term=1 "
                     "msg=\"say \\\"hi\\\"\\nback\\\\slash\\ttab\\u0007bell\"\n");
    /* The only raw newline is the terminator. */
    ck_assert_ptr_eq(strchr(c->buf, '\n'), c->buf + c->len - 1);
}
END_TEST

START_TEST(test_log_zero_node_and_term_print_dash)
{
    struct capture *c = capture_start();
    tk_logf(TK_LOG_ERROR, 0, 0, "", "disk full");
    capture_stop();
    ck_assert_str_eq(after_ts(c), "level=error node=- term=- msg=\"disk full\"\n");
}
END_TEST

START_TEST(test_log_drops_lines_below_level)
{
    struct capture *c = capture_start();
    tk_log_set_level(TK_LOG_WARN);
    ck_assert_int_eq(tk_log_get_level(), TK_LOG_WARN);
    TK_LOG(TK_LOG_DEBUG, 1, 1, "debug %d", 1);
    TK_LOG(TK_LOG_INFO, 1, 1, "info");
    tk_logf(TK_LOG_INFO, 1, 1, NULL, "info direct");
    ck_assert_int_eq(c->lines, 0);
    TK_LOG(TK_LOG_WARN, 1, 1, "warn");
    TK_LOG(TK_LOG_ERROR, 1, 1, "error");
    ck_assert_int_eq(c->lines, 2);
    ck_assert_ptr_nonnull(strstr(c->buf, "level=warn"));
    ck_assert_ptr_nonnull(strstr(c->buf, "level=error"));

    tk_log_set_level(TK_LOG_OFF);
    TK_LOG(TK_LOG_ERROR, 1, 1, "error");
    ck_assert_int_eq(c->lines, 2);

    tk_log_set_level(TK_LOG_DEBUG);
    TK_LOG(TK_LOG_DEBUG, 7, 9, "now visible");
    ck_assert_int_eq(c->lines, 3);
    ck_assert_ptr_nonnull(
        strstr(c->buf, "level=debug node=7 term=9 msg=\"now visible\"\n"));
    capture_stop();
}
END_TEST

START_TEST(test_log_parse_level_accepts_names_and_rejects_others)
{
    static const struct {
        const char *name;
        enum tk_log_level level;
    } ok[] = {{"debug", TK_LOG_DEBUG},
              {"info", TK_LOG_INFO},
              {"warn", TK_LOG_WARN},
              {"error", TK_LOG_ERROR},
              {"off", TK_LOG_OFF}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        enum tk_log_level l = TK_LOG_OFF;
        ck_assert_int_eq(tk_log_parse_level(ok[i].name, &l), 0);
        ck_assert_int_eq(l, ok[i].level);
    }
    enum tk_log_level l = TK_LOG_ERROR;
    ck_assert_int_eq(tk_log_parse_level("verbose", &l), TK_EINVAL);
    ck_assert_int_eq(tk_log_parse_level("", &l), TK_EINVAL);
    ck_assert_int_eq(tk_log_parse_level("INFO ", &l), TK_EINVAL);
    ck_assert_int_eq(tk_log_parse_level(NULL, &l), TK_EINVAL);
    ck_assert_int_eq(l, TK_LOG_ERROR);
}
END_TEST

START_TEST(test_log_cuts_long_lines_but_keeps_them_well_formed)
{
    static char big[4 * TK_LOG_LINE_MAX];
    memset(big, '"', sizeof(big) - 1); /* every byte needs an escape */
    big[sizeof(big) - 1] = '\0';
    struct capture *c = capture_start();
    tk_logf(TK_LOG_INFO, 3, 4, "tail=1", "%s", big);
    capture_stop();
    ck_assert_int_eq(c->lines, 1);
    ck_assert_uint_le(c->len, TK_LOG_LINE_MAX);
    ck_assert_uint_ge(c->len, TK_LOG_LINE_MAX - 8);
    ck_assert_int_eq(c->buf[c->len - 1], '\n');
    /* The msg is closed after a whole escape, never after a lone '\'. */
    const char *msg = strstr(c->buf, "msg=\"");
    ck_assert_ptr_nonnull(msg);
    size_t n = 0;
    const char *p = msg + 5;
    for (; *p == '\\' && p[1] == '"'; p += 2)
        n++;
    ck_assert_uint_gt(n, 100);
    ck_assert_int_eq(p[0], '"');
}
END_TEST

START_TEST(test_log_without_sink_writes_to_stderr)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    dup2(fds[1], STDERR_FILENO);
    tk_log_set_sink(NULL, NULL);
    tk_logf(TK_LOG_ERROR, 4, 2, "x=1", "to stderr");
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    char buf[512];
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    ck_assert_int_gt(n, 0);
    buf[n] = '\0';
    ck_assert_ptr_nonnull(
        strstr(buf, " level=error node=4 term=2 msg=\"to stderr\" x=1\n"));
}
END_TEST

/* ---- endian ------------------------------------------------------------- */

START_TEST(test_endian_stores_least_significant_byte_first)
{
    uint8_t b[8];
    tk_put_le16(b, 0x0102);
    ck_assert_uint_eq(b[0], 0x02);
    ck_assert_uint_eq(b[1], 0x01);
    tk_put_le32(b, 0x01020304u);
    ck_assert_mem_eq(b, "\x04\x03\x02\x01", 4);
    tk_put_le64(b, 0x0102030405060708ull);
    ck_assert_mem_eq(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
}
END_TEST

START_TEST(test_endian_loads_what_it_stores_at_any_offset)
{
    static const uint64_t vals[] = {
        0, 1, 0x80, 0xFF, 0x8000, 0xFFFFFFFFull, 0x0123456789ABCDEFull, UINT64_MAX};
    uint8_t buf[16];
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        for (size_t off = 0; off < 8; off++) {
            memset(buf, 0xAA, sizeof(buf));
            tk_put_le16(buf + off, (uint16_t)vals[i]);
            ck_assert_uint_eq(tk_get_le16(buf + off), (uint16_t)vals[i]);
            tk_put_le32(buf + off, (uint32_t)vals[i]);
            ck_assert_uint_eq(tk_get_le32(buf + off), (uint32_t)vals[i]);
            tk_put_le64(buf + off, vals[i]);
            ck_assert_uint_eq(tk_get_le64(buf + off), vals[i]);
            ck_assert_uint_eq(buf[off + 8], 0xAA); /* nothing written past it */
        }
    }
}
END_TEST

START_TEST(test_endian_big_stores_most_significant_byte_first_and_loads_it_back)
{
    uint8_t b[9];
    tk_put_be16(b, 0x0102);
    ck_assert_mem_eq(b, "\x01\x02", 2);
    ck_assert_uint_eq(tk_get_be16(b), 0x0102);
    tk_put_be32(b, 0x01020304u);
    ck_assert_mem_eq(b, "\x01\x02\x03\x04", 4);
    ck_assert_uint_eq(tk_get_be32(b), 0x01020304u);
    for (size_t off = 0; off < 2; off++) {
        tk_put_be64(b + off, 0x0102030405060708ull);
        ck_assert_mem_eq(b + off, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
        ck_assert_uint_eq(tk_get_be64(b + off), 0x0102030405060708ull);
    }
}
END_TEST

/* ---- base64, host:port, clocks ------------------------------------------ */

START_TEST(test_base64_round_trips_and_refuses_bad_input_or_no_room)
{
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char enc[16];
        uint8_t dec[16];
        size_t n = tk_base64_encode(in[i], strlen(in[i]), enc);
        ck_assert_uint_eq(n, tk_base64_encoded_len(strlen(in[i])));
        ck_assert_str_eq(enc, want[i]);
        ck_assert_int_eq(tk_base64_decode(enc, n, dec, sizeof(dec)), (long)strlen(in[i]));
        ck_assert_mem_eq(dec, in[i], strlen(in[i]));
        ck_assert_uint_le(strlen(in[i]), tk_base64_decoded_max(n));
    }
    uint8_t d[8];
    ck_assert_int_eq(tk_base64_decode("Zm9", 3, d, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm=v", 4, d, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Z===", 4, d, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zg==Zg==", 8, d, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm9!", 4, d, 8), TK_EINVAL);
    ck_assert_int_eq(tk_base64_decode("Zm9vYmFy", 8, d, 4), TK_ETOOBIG);
}
END_TEST

START_TEST(test_hostport_splits_names_and_bracketed_v6_and_refuses_the_rest)
{
    char host[16];
    uint16_t port = 1;
    ck_assert_int_eq(tk_hostport_split("127.0.0.1:7001", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 7001);
    ck_assert_int_eq(tk_hostport_split("[::1]:0", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_uint_eq(port, 0); /* kernel-chosen: the caller decides */
    ck_assert_int_eq(tk_hostport_split("a:65535", host, sizeof(host), &port), 0);
    const char *bad[] = {
        "nocolon", ":80",   "a:",      "a:65536", "a:8x",
        "a: 80",   "a:+80", "[::1]80", "[::1:80", "averyveryverylonghost:80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(tk_hostport_split(bad[i], host, sizeof(host), &port) == TK_EINVAL,
                      "accepted %s", bad[i]);
}
END_TEST

START_TEST(test_clock_readers_agree_in_units_and_never_go_back)
{
    uint64_t ns = tk_mono_ns(), ms = tk_mono_ms();
    ck_assert_uint_ge(ms, ns / 1000000u);
    ck_assert_uint_le(ms - ns / 1000000u, 1000u);
    ck_assert_uint_ge(tk_mono_ns(), ns);
    ck_assert_uint_gt(tk_wall_ms(), 1577836800000ull); /* after 2020 */
    ck_assert_uint_gt(tk_thread_cpu_ns(), 0);
}
END_TEST

/* ---- crc32c ------------------------------------------------------------- */

/* Bit-at-a-time reference: reflected Castagnoli polynomial. */
static uint32_t crc32c_ref(uint32_t crc, const uint8_t *p, size_t len)
{
    crc = ~crc;
    while (len--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

START_TEST(test_crc32c_matches_check_value)
{
    ck_assert_uint_eq(tk_crc32c(0, "123456789", 9), 0xE3069283u);
}
END_TEST

START_TEST(test_crc32c_matches_rfc3720_vectors)
{
    uint8_t buf[32];
    memset(buf, 0, sizeof(buf));
    ck_assert_uint_eq(tk_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof(buf));
    ck_assert_uint_eq(tk_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    ck_assert_uint_eq(tk_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    ck_assert_uint_eq(tk_crc32c(0, buf, 32), 0x113FDB5Cu);
}
END_TEST

START_TEST(test_crc32c_of_nothing_is_its_input)
{
    ck_assert_uint_eq(tk_crc32c(0, NULL, 0), 0);
    ck_assert_uint_eq(tk_crc32c(0xdeadbeef, "", 0), 0xdeadbeef);
}
END_TEST

START_TEST(test_crc32c_matches_bitwise_reference_at_any_length_and_offset)
{
    static uint8_t buf[4096 + 16];
    struct tk_prng r;
    tk_prng_seed(&r, 7);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)tk_prng_next(&r);
    for (size_t off = 0; off < 8; off++) {
        for (size_t len = 0; len <= 300; len++)
            FAST_ASSERT(tk_crc32c(0, buf + off, len) == crc32c_ref(0, buf + off, len));
    }
    ck_assert_uint_eq(tk_crc32c(0, buf + 3, 4096), crc32c_ref(0, buf + 3, 4096));
}
END_TEST

START_TEST(test_crc32c_chains_incrementally)
{
    static uint8_t buf[10000];
    struct tk_prng r;
    tk_prng_seed(&r, 11);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)tk_prng_next(&r);
    uint32_t whole = tk_crc32c(0, buf, sizeof(buf));
    ck_assert_uint_eq(whole, crc32c_ref(0, buf, sizeof(buf)));
    for (size_t cut = 0; cut <= sizeof(buf); cut += 997) {
        uint32_t a = tk_crc32c(0, buf, cut);
        ck_assert_uint_eq(tk_crc32c(a, buf + cut, sizeof(buf) - cut), whole);
    }
    /* Three pieces, one of them empty. */
    uint32_t c = tk_crc32c(0, buf, 1);
    c = tk_crc32c(c, buf + 1, 0);
    c = tk_crc32c(c, buf + 1, sizeof(buf) - 1);
    ck_assert_uint_eq(c, whole);
    /* The check value, byte by byte. */
    uint32_t s = 0;
    for (int i = 0; i < 9; i++)
        s = tk_crc32c(s, &"123456789"[i], 1);
    ck_assert_uint_eq(s, 0xE3069283u);
}
END_TEST

START_TEST(test_crc32c_detects_a_flipped_bit)
{
    uint8_t buf[256];
    memset(buf, 0x5a, sizeof(buf));
    uint32_t good = tk_crc32c(0, buf, sizeof(buf));
    for (size_t bit = 0; bit < sizeof(buf) * 8; bit += 13) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        ck_assert_uint_ne(tk_crc32c(0, buf, sizeof(buf)), good);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
}
END_TEST

/* ---- hist --------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The rank-ceil(q * n) sample of sorted v[0..n), as tk_hist_quantile defines. */
static uint64_t exact_quantile(const uint64_t *v, size_t n, double q)
{
    double r = q * (double)n;
    size_t rank = (size_t)r;
    if ((double)rank < r)
        rank++;
    if (rank == 0)
        rank = 1;
    return v[rank - 1];
}

/* tk_array_grow keeps the bytes from malloc'd sizes into a mapping and
 * across mremaps, and grows a big array without copying it: growing 32 MiB of
 * written entries to 64 MiB faults in next to no pages (a copy into fresh
 * memory faults in all 8,192). */
START_TEST(test_array_grow_keeps_bytes_and_moves_pages)
{
    size_t sizes[] = {4096, 512 << 10, 2 << 20, 32 << 20};
    uint8_t *a = NULL;
    size_t have = 0;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        a = tk_array_grow(a, have, sizes[k]);
        for (size_t i = have; i < sizes[k]; i++)
            a[i] = (uint8_t)(i * 31 + 7);
        have = sizes[k];
    }
    for (size_t i = 0; i < have; i += 4093)
        FAST_ASSERT(a[i] == (uint8_t)(i * 31 + 7));
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    a = tk_array_grow(a, have, (size_t)64 << 20);
    getrusage(RUSAGE_SELF, &r1);
    long faults = r1.ru_minflt - r0.ru_minflt;
    ck_assert_msg(faults < 1000, "%ld page faults growing 32 MiB to 64 MiB (a copy?)",
                  faults);
    for (size_t i = 0; i < have; i += 4093)
        FAST_ASSERT(a[i] == (uint8_t)(i * 31 + 7));
    a[((size_t)64 << 20) - 1] = 1; /* the new room is there */
    tk_array_free(a, (size_t)64 << 20);
    uint8_t *small = tk_array_grow(NULL, 0, 100);
    small[99] = 1;
    tk_array_free(small, 100);
}
END_TEST

/* tk_array_shift: a mapped array drops the pages in front of the live
 * elements (no copy: writing the elements' new place faults in no page), a
 * small one is memmoved to 0; the elements and the capacity stay. */
struct shift_elem {
    uint64_t v[5]; /* 40 bytes, like a raft_entry */
};

START_TEST(test_array_shift_moves_pages_not_bytes)
{
    size_t cap = (size_t)8 << 20, per = cap / sizeof(struct shift_elem);
    struct shift_elem *a = tk_array_grow(NULL, 0, cap);
    size_t head = per / 2 + 77, n = per / 4;
    for (size_t i = head; i < head + n; i++) /* only these pages are touched */
        a[i].v[0] = a[i].v[4] = i;
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    size_t nh = 0;
    a = tk_array_shift(a, cap, sizeof(*a), head, n, &nh);
    getrusage(RUSAGE_SELF, &r1);
    long faults = r1.ru_minflt - r0.ru_minflt;
    ck_assert_msg(faults < 100, "%ld page faults shifting %zu elements (a copy?)", faults,
                  n);
    ck_assert_uint_lt(nh, 512); /* 512 entries of 40 bytes: 5 pages */
    for (size_t i = 0; i < n; i++)
        FAST_ASSERT(a[nh + i].v[0] == head + i && a[nh + i].v[4] == head + i);
    a[per - 1].v[4] = 1; /* the capacity is still there */
    tk_array_free(a, cap);

    struct shift_elem *small = tk_array_grow(NULL, 0, 100 * sizeof(*small));
    for (size_t i = 0; i < 100; i++)
        small[i].v[0] = i;
    small = tk_array_shift(small, 100 * sizeof(*small), sizeof(*small), 60, 30, &nh);
    ck_assert_uint_eq(nh, 0);
    for (size_t i = 0; i < 30; i++)
        ck_assert_uint_eq(small[i].v[0], 60 + i);
    tk_array_free(small, 100 * sizeof(*small));
}
END_TEST

START_TEST(test_hist_empty_reports_zero)
{
    struct tk_hist h;
    tk_hist_init(&h);
    ck_assert_uint_eq(h.count, 0);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.5), 0);
    ck_assert_uint_eq(tk_hist_quantile(&h, 1.0), 0);
    ck_assert(tk_hist_mean(&h) == 0.0);
}
END_TEST

START_TEST(test_hist_small_values_are_exact)
{
    struct tk_hist h;
    tk_hist_init(&h);
    for (uint64_t v = 0; v < 128; v++)
        tk_hist_record(&h, v);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.0), 0);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.5), 63);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.25), 31);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.99), 126);
    ck_assert_uint_eq(tk_hist_quantile(&h, 1.0), 127);
    ck_assert(tk_hist_mean(&h) == 63.5);
    ck_assert_uint_eq(h.count, 128);
    ck_assert_uint_eq(h.min, 0);
    ck_assert_uint_eq(h.max, 127);
}
END_TEST

START_TEST(test_hist_quantiles_within_error)
{
    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof(*v));
    ck_assert_ptr_nonnull(v);
    struct tk_prng r;
    tk_prng_seed(&r, 42);
    struct tk_hist h;
    tk_hist_init(&h);
    /* Log-uniform over 2^0 .. 2^48, the shape of a latency distribution. */
    for (size_t i = 0; i < N; i++) {
        unsigned bits = (unsigned)tk_prng_below(&r, 49);
        v[i] = bits == 0 ? 0 : tk_prng_next(&r) >> (64 - bits);
        tk_hist_record(&h, v[i]);
    }
    qsort(v, N, sizeof(*v), cmp_u64);
    static const double qs[] = {0.001, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999};
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
        uint64_t want = exact_quantile(v, N, qs[i]);
        uint64_t got = tk_hist_quantile(&h, qs[i]);
        uint64_t diff = got > want ? got - want : want - got;
        ck_assert_msg(diff <= want / TK_HIST_SUB, "q=%g want %llu got %llu", qs[i],
                      (unsigned long long)want, (unsigned long long)got);
    }
    ck_assert_uint_eq(tk_hist_quantile(&h, 1.0), v[N - 1]);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.0), v[0]);
    ck_assert_uint_eq(h.count, N);
    free(v);
}
END_TEST

/* tk_hist_count_over brackets the exact count: never above it, and never
 * below the count over value + value / TK_HIST_SUB (its own bucket's width). */
START_TEST(test_hist_count_over_brackets_the_exact_count)
{
    enum { N = 100000 };
    uint64_t *v = malloc(N * sizeof(*v));
    ck_assert_ptr_nonnull(v);
    struct tk_prng r;
    tk_prng_seed(&r, 7);
    struct tk_hist h;
    tk_hist_init(&h);
    for (size_t i = 0; i < N; i++) {
        v[i] = tk_prng_below(&r, 200000000); /* up to 200 ms in ns */
        tk_hist_record(&h, v[i]);
    }
    static const uint64_t over[] = {0, 100, 1000000, 25000000, 150000000, 199999999};
    for (size_t k = 0; k < sizeof(over) / sizeof(over[0]); k++) {
        uint64_t exact = 0, wider = 0, t = over[k];
        for (size_t i = 0; i < N; i++) {
            exact += v[i] > t;
            wider += v[i] > t + t / TK_HIST_SUB;
        }
        uint64_t got = tk_hist_count_over(&h, t);
        ck_assert_msg(got <= exact && got >= wider, "over %llu: got %llu, exact %llu",
                      (unsigned long long)t, (unsigned long long)got,
                      (unsigned long long)exact);
    }
    ck_assert_uint_eq(tk_hist_count_over(&h, UINT64_MAX), 0);
    struct tk_hist small;
    tk_hist_init(&small);
    for (uint64_t i = 0; i < 100; i++)
        tk_hist_record(&small, i);
    ck_assert_uint_eq(tk_hist_count_over(&small, 89), 10); /* exact down there */
    free(v);
}
END_TEST

START_TEST(test_hist_handles_extreme_values)
{
    struct tk_hist h;
    tk_hist_init(&h);
    tk_hist_record(&h, 0);
    tk_hist_record(&h, UINT64_MAX);
    tk_hist_record(&h, (uint64_t)1 << 63);
    ck_assert_uint_eq(tk_hist_quantile(&h, 1.0), UINT64_MAX);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.0), 0);
    ck_assert_uint_eq(tk_hist_quantile(&h, 0.3), 0);
    uint64_t mid = tk_hist_quantile(&h, 0.6);
    ck_assert_uint_ge(mid, (uint64_t)1 << 63);
    ck_assert_uint_le(mid, ((uint64_t)1 << 63) + (((uint64_t)1 << 63) >> 6));
    ck_assert_uint_ge(tk_hist_quantile(&h, 0.9), UINT64_MAX - UINT64_MAX / 64);
    ck_assert_uint_eq(h.buckets[TK_HIST_BUCKETS - 1], 1);
}
END_TEST

START_TEST(test_hist_merge_equals_recording_everything)
{
    struct tk_hist a, b, all, empty;
    tk_hist_init(&a);
    tk_hist_init(&b);
    tk_hist_init(&all);
    tk_hist_init(&empty);
    struct tk_prng r;
    tk_prng_seed(&r, 3);
    for (int i = 0; i < 10000; i++) {
        uint64_t v = tk_prng_below(&r, 1000000);
        tk_hist_record(i % 3 == 0 ? &a : &b, v);
        tk_hist_record(&all, v);
    }
    tk_hist_merge(&a, &b);
    tk_hist_merge(&a, &empty);
    ck_assert_int_eq(memcmp(&a, &all, sizeof(a)), 0);
    tk_hist_merge(&empty, &all);
    ck_assert_int_eq(memcmp(&empty, &all, sizeof(all)), 0);
    ck_assert_uint_eq(tk_hist_quantile(&a, 0.99), tk_hist_quantile(&all, 0.99));
}
END_TEST

START_TEST(test_hist_mean_is_exact)
{
    struct tk_hist h;
    tk_hist_init(&h);
    tk_hist_record(&h, 1000);
    tk_hist_record(&h, 3000);
    tk_hist_record(&h, 1000000);
    ck_assert(tk_hist_mean(&h) == 1004000.0 / 3.0);
    ck_assert_uint_eq(h.sum, 1004000);
    ck_assert_uint_eq(h.min, 1000);
    ck_assert_uint_eq(h.max, 1000000);
}
END_TEST

/* ---- prng --------------------------------------------------------------- */

START_TEST(test_prng_matches_xoshiro256starstar_reference)
{
    /* Published outputs of the reference xoshiro256** for state {1,2,3,4}. */
    static const uint64_t want[] = {
        11520u,
        0u,
        1509978240u,
        UINT64_C(1215971899390074240),
        UINT64_C(1216172134540287360),
        UINT64_C(607988272756665600),
        UINT64_C(16172922978634559625),
        UINT64_C(8476171486693032832),
        UINT64_C(10595114339597558777),
        UINT64_C(2904607092377533576),
    };
    struct tk_prng p = {{1, 2, 3, 4}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ck_assert_uint_eq(tk_prng_next(&p), want[i]);
}
END_TEST

START_TEST(test_prng_seeds_state_with_splitmix64)
{
    /* splitmix64 from 1234567 (Rosetta Code's reference sequence). */
    struct tk_prng p;
    tk_prng_seed(&p, 1234567);
    ck_assert_uint_eq(p.s[0], UINT64_C(6457827717110365317));
    ck_assert_uint_eq(p.s[1], UINT64_C(3203168211198807973));
    ck_assert_uint_eq(p.s[2], UINT64_C(9817491932198370423));
    ck_assert_uint_eq(p.s[3], UINT64_C(4593380528125082431));
    /* Seed 0 must not give the all-zero state xoshiro cannot leave. */
    tk_prng_seed(&p, 0);
    ck_assert(p.s[0] != 0 || p.s[1] != 0 || p.s[2] != 0 || p.s[3] != 0);
    ck_assert_uint_eq(p.s[0], UINT64_C(0xE220A8397B1DCDAF));
}
END_TEST

START_TEST(test_prng_same_seed_same_sequence)
{
    struct tk_prng a, b, c;
    tk_prng_seed(&a, 42);
    tk_prng_seed(&b, 42);
    tk_prng_seed(&c, 43);
    int differs = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = tk_prng_next(&a);
        FAST_ASSERT(x == tk_prng_next(&b));
        differs += x != tk_prng_next(&c);
    }
    ck_assert_int_ge(differs, 999);
    /* Golden values: the sequence for a seed is part of the replay contract. */
    tk_prng_seed(&a, 42);
    ck_assert_uint_eq(tk_prng_next(&a), UINT64_C(1546998764402558742));
    ck_assert_uint_eq(tk_prng_next(&a), UINT64_C(6990951692964543102));
    ck_assert_uint_eq(tk_prng_next(&a), UINT64_C(12544586762248559009));
}
END_TEST

START_TEST(test_prng_below_is_in_range_and_uniform)
{
    struct tk_prng p;
    tk_prng_seed(&p, 5);
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) {
        uint64_t v = tk_prng_below(&p, 10);
        FAST_ASSERT(v < 10);
        counts[v]++;
    }
    for (int i = 0; i < 10; i++) {
        ck_assert_int_gt(counts[i], 9500);
        ck_assert_int_lt(counts[i], 10500);
    }
    ck_assert_uint_eq(tk_prng_below(&p, 0), 0);
    ck_assert_uint_eq(tk_prng_below(&p, 1), 0);
    /* Just above 2^63: nearly half of raw draws must be rejected. */
    uint64_t n = (UINT64_C(1) << 63) + 1;
    for (int i = 0; i < 1000; i++)
        FAST_ASSERT(tk_prng_below(&p, n) < n);
}
END_TEST

START_TEST(test_prng_below_has_no_modulo_bias)
{
    /* With n = 3 * 2^62, a plain `next() % n` would land below 2^62 half the
     * time (2^64 mod n folds the top quarter onto it); uniform is a third. */
    struct tk_prng p;
    tk_prng_seed(&p, 17);
    const uint64_t n = UINT64_C(3) << 62;
    int low = 0;
    for (int i = 0; i < 30000; i++) {
        uint64_t v = tk_prng_below(&p, n);
        FAST_ASSERT(v < n);
        low += v < (UINT64_C(1) << 62);
    }
    ck_assert_int_gt(low, 9500);
    ck_assert_int_lt(low, 10500);
}
END_TEST

START_TEST(test_prng_range_is_inclusive)
{
    struct tk_prng p;
    tk_prng_seed(&p, 9);
    int seen[3] = {0};
    for (int i = 0; i < 3000; i++) {
        uint64_t v = tk_prng_range(&p, 5, 7);
        FAST_ASSERT(v >= 5 && v <= 7);
        seen[v - 5]++;
    }
    ck_assert_int_gt(seen[0], 0);
    ck_assert_int_gt(seen[1], 0);
    ck_assert_int_gt(seen[2], 0);
    ck_assert_uint_eq(tk_prng_range(&p, 3, 3), 3);
    (void)tk_prng_range(&p, 0, UINT64_MAX); /* full span must not overflow */
    ck_assert_uint_ge(tk_prng_range(&p, UINT64_MAX - 1, UINT64_MAX), UINT64_MAX - 1);
}
END_TEST

START_TEST(test_prng_double_and_chance)
{
    struct tk_prng p;
    tk_prng_seed(&p, 13);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double d = tk_prng_double(&p);
        FAST_ASSERT(d >= 0.0 && d < 1.0);
        sum += d;
    }
    ck_assert(sum / 100000 > 0.49 && sum / 100000 < 0.51);
    int hits = 0;
    for (int i = 0; i < 100000; i++) {
        FAST_ASSERT(tk_prng_chance(&p, 0.0) == 0);
        FAST_ASSERT(tk_prng_chance(&p, 1.0) == 1);
        hits += tk_prng_chance(&p, 0.25);
    }
    ck_assert_int_gt(hits, 24000);
    ck_assert_int_lt(hits, 26000);
}
END_TEST

/* ---- queues: single-threaded -------------------------------------------- */

START_TEST(test_mpsc_rejects_bad_capacity)
{
    struct tk_mpsc q;
    ck_assert_int_eq(tk_mpsc_init(&q, 0), TK_EINVAL);
    ck_assert_int_eq(tk_mpsc_init(&q, (size_t)TK_QUEUE_CAPACITY_MAX + 1), TK_EINVAL);
    /* One is served as two (see queue.h), and still refuses when full. */
    ck_assert_int_eq(tk_mpsc_init(&q, 1), 0);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(1)), 0);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(2)), 0);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(3)), TK_EBUSY);
    ck_assert_uint_eq(value_of(tk_mpsc_pop(&q)), 1);
    ck_assert_uint_eq(value_of(tk_mpsc_pop(&q)), 2);
    ck_assert_ptr_null(tk_mpsc_pop(&q));
    tk_mpsc_destroy(&q);
}
END_TEST

START_TEST(test_mpsc_refuses_push_when_full)
{
    struct tk_mpsc q;
    ck_assert_int_eq(tk_mpsc_init(&q, 6), 0); /* rounded up to 8 */
    ck_assert_ptr_null(tk_mpsc_pop(&q));
    for (uintptr_t i = 1; i <= 8; i++)
        ck_assert_int_eq(tk_mpsc_push(&q, item_of(i)), 0);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(9)), TK_EBUSY);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(9)), TK_EBUSY);
    ck_assert_uint_eq(value_of(tk_mpsc_pop(&q)), 1);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(9)), 0);
    ck_assert_int_eq(tk_mpsc_push(&q, item_of(10)), TK_EBUSY);
    for (uintptr_t i = 2; i <= 9; i++)
        ck_assert_uint_eq(value_of(tk_mpsc_pop(&q)), i);
    ck_assert_ptr_null(tk_mpsc_pop(&q));
    tk_mpsc_destroy(&q);
}
END_TEST

START_TEST(test_mpsc_wraps_around_many_times)
{
    struct tk_mpsc q;
    ck_assert_int_eq(tk_mpsc_init(&q, 4), 0);
    uintptr_t next_in = 1, next_out = 1;
    for (int round = 0; round < 1000; round++) {
        int n = 1 + round % 4;
        for (int i = 0; i < n; i++)
            ck_assert_int_eq(tk_mpsc_push(&q, item_of(next_in++)), 0);
        for (int i = 0; i < n; i++)
            ck_assert_uint_eq(value_of(tk_mpsc_pop(&q)), next_out++);
        ck_assert_ptr_null(tk_mpsc_pop(&q));
    }
    tk_mpsc_destroy(&q);
}
END_TEST

/* ---- queues: multi-threaded --------------------------------------------- */

/* Item = producer * ITEM_STRIDE + sequence (sequence from 1), so an item is
 * never NULL and names its producer and position. */
#define ITEM_STRIDE ((uintptr_t)1 << 24)
#define ITEMS_PER_PRODUCER 200000
#define PRODUCERS_MAX 8

struct producer {
    pthread_t thread;
    void *queue;
    uintptr_t id;
    unsigned long busy; /* pushes refused as full, then retried */
};

static void *mpsc_producer(void *arg)
{
    struct producer *p = arg;
    for (uintptr_t s = 1; s <= ITEMS_PER_PRODUCER; s++) {
        while (tk_mpsc_push(p->queue, item_of(p->id * ITEM_STRIDE + s)) == TK_EBUSY) {
            p->busy++;
            sched_yield();
        }
    }
    return NULL;
}

/* Consumes n_producers * ITEMS_PER_PRODUCER items on the calling thread and
 * checks each producer's items arrive exactly once, in order. */
static void consume_and_check(void *(*pop)(void *), void *queue, size_t n_producers)
{
    uintptr_t last[PRODUCERS_MAX] = {0};
    size_t total = n_producers * ITEMS_PER_PRODUCER, got = 0;
    while (got < total) {
        void *it = pop(queue);
        if (it == NULL) {
            sched_yield();
            continue;
        }
        uintptr_t v = value_of(it);
        uintptr_t id = v / ITEM_STRIDE, seq = v % ITEM_STRIDE;
        FAST_ASSERT(id < n_producers);
        if (seq != last[id] + 1)
            ck_abort_msg("producer %lu: got %lu after %lu", (unsigned long)id,
                         (unsigned long)seq, (unsigned long)last[id]);
        last[id] = seq;
        got++;
    }
    for (size_t i = 0; i < n_producers; i++)
        ck_assert_uint_eq(last[i], ITEMS_PER_PRODUCER);
    ck_assert_ptr_null(pop(queue));
}

static void *mpsc_pop_fn(void *q)
{
    return tk_mpsc_pop(q);
}

static void run_mpsc_threads(size_t n_producers, size_t capacity)
{
    struct tk_mpsc q;
    ck_assert_int_eq(tk_mpsc_init(&q, capacity), 0);
    struct producer p[PRODUCERS_MAX];
    for (size_t i = 0; i < n_producers; i++) {
        p[i] = (struct producer){.queue = &q, .id = i};
        ck_assert_int_eq(pthread_create(&p[i].thread, NULL, mpsc_producer, &p[i]), 0);
    }
    consume_and_check(mpsc_pop_fn, &q, n_producers);
    for (size_t i = 0; i < n_producers; i++)
        ck_assert_int_eq(pthread_join(p[i].thread, NULL), 0);
    tk_mpsc_destroy(&q);
}

START_TEST(test_mpsc_two_producers_each_item_once_in_producer_order)
{
    run_mpsc_threads(2, 1024);
}
END_TEST

START_TEST(test_mpsc_four_producers_through_a_tiny_queue)
{
    run_mpsc_threads(4, 4); /* constant contention on full cells */
}
END_TEST

/* ---- runner ------------------------------------------------------------- */

/* ---- nice ---- */

struct nice_run {
    int start; /* > 0: the thread first sets its own nice value to this */
    int want, floor;
    int was, during, after, ret;
    bool restorable;
};

/* Runs tk_nice_enter / tk_nice_leave on a thread of its own, so that the
 * test's thread keeps its nice value. */
static void *nice_thread(void *arg)
{
    struct nice_run *r = arg;
    int tid = tk_nice_tid();
    if (r->start > 0)
        ck_assert_int_eq(tk_nice_set(tid, r->start), 0); /* lowering is always allowed */
    ck_assert_int_eq(tk_nice_get(tid, &r->was), 0);
    r->restorable = tk_nice_restorable(r->was);
    r->ret = tk_nice_enter(r->want, r->floor);
    ck_assert_int_eq(tk_nice_get(tid, &r->during), 0);
    tk_nice_leave(r->ret);
    ck_assert_int_eq(tk_nice_get(tid, &r->after), 0);
    return NULL;
}

static void nice_run(struct nice_run *r)
{
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, nice_thread, r), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
}

START_TEST(test_nice_enter_goes_low_and_leave_comes_back)
{
    struct nice_run r = {.want = 19, .floor = 5};
    nice_run(&r);
    fprintf(stderr, "nice: was %d, during %d, after %d (restorable: %d)\n", r.was,
            r.during, r.after, r.restorable);
    if (r.restorable) {
        ck_assert_int_eq(r.during, 19);
        ck_assert_int_eq(r.after, r.was); /* the pool thread comes back */
    } else {
        /* 19 would be for good: the floor instead */
        ck_assert_int_eq(r.during, r.was > 5 ? r.was : 5);
    }
    ck_assert_int_eq(r.ret, r.during > r.was ? r.was : TK_NICE_UNCHANGED);
}
END_TEST

START_TEST(test_nice_enter_never_raises_the_priority)
{
    struct nice_run r = {.start = 10, .want = 5, .floor = 5};
    nice_run(&r);
    ck_assert_int_eq(r.was, 10);
    ck_assert_int_eq(r.ret, TK_NICE_UNCHANGED);
    ck_assert_int_eq(r.during, 10);
    ck_assert_int_eq(r.after, 10);
}
END_TEST

/* Without the right to come back (not root, RLIMIT_NICE 0), a thread asked
 * for 19 goes only to the floor: a pool thread stuck at 19 would run every
 * later job there. In a child, which drops root for it where it has it. */
START_TEST(test_nice_stays_at_the_floor_when_it_could_not_come_back)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        if (setrlimit(RLIMIT_NICE, &rl) != 0)
            _exit(2);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        if (tk_nice_restorable(0))
            _exit(4);
        int was = 0, now = 0;
        if (tk_nice_get(tk_nice_tid(), &was) != 0)
            _exit(5);
        int ret = tk_nice_enter(19, 5);
        if (tk_nice_get(tk_nice_tid(), &now) != 0 || now != (was > 5 ? was : 5) ||
            ret != (was < 5 ? was : TK_NICE_UNCHANGED))
            _exit(6);
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d", st);
}
END_TEST

/* What reader_raise does: another thread moves a thread at 19 back to 5,
 * where the process may. */
static void *nice_wait(void *arg)
{
    atomic_int *tid = arg;
    ck_assert_int_eq(tk_nice_set(tk_nice_tid(), 19), 0);
    atomic_store(tid, tk_nice_tid());
    while (atomic_load(tid) != 0)
        sched_yield();
    return NULL;
}

START_TEST(test_nice_set_moves_another_thread)
{
    atomic_int tid = 0;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, nice_wait, &tid), 0);
    while (atomic_load(&tid) == 0)
        sched_yield();
    int v = 0;
    ck_assert_int_eq(tk_nice_get(atomic_load(&tid), &v), 0);
    ck_assert_int_eq(v, 19);
    if (tk_nice_restorable(5)) {
        ck_assert_int_eq(tk_nice_set(atomic_load(&tid), 5), 0);
        ck_assert_int_eq(tk_nice_get(atomic_load(&tid), &v), 0);
        ck_assert_int_eq(v, 5);
    }
    atomic_store(&tid, 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
}
END_TEST

/* tk_pace_cpu sleeps factor times the thread's CPU time in slices of at least
 * TK_PACE_CPU_SLICE_NS; not at all at factor 0 or once hurried. */
static uint64_t spin_paced(struct tk_cpu_pace *p, uint64_t cpu_ns)
{
    struct timespec a, b, w0, w1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    clock_gettime(CLOCK_MONOTONIC, &w0);
    volatile uint64_t x = 0;
    do {
        for (int i = 0; i < 10000; i++)
            x += (uint64_t)i;
        tk_pace_cpu(p);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec -
                 (uint64_t)a.tv_nsec <
             cpu_ns);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    return (uint64_t)(w1.tv_sec - w0.tv_sec) * 1000000000u + (uint64_t)w1.tv_nsec -
           (uint64_t)w0.tv_nsec;
}

START_TEST(test_pace_cpu_sleeps_factor_times_the_cpu_used)
{
    atomic_bool hurry = false;
    struct tk_cpu_pace p = {.factor = 2, .hurry = &hurry};
    uint64_t wall = spin_paced(&p, 30000000);
    ck_assert_uint_ge(p.cpu_ns, 30000000 - 2 * TK_PACE_CPU_SLICE_NS);
    ck_assert_uint_eq(p.slept_ns, 2 * p.cpu_ns);
    ck_assert_uint_ge(wall, p.slept_ns);

    atomic_store(&hurry, true); /* hurried: counted, not slept */
    uint64_t slept = p.slept_ns, cpu = p.cpu_ns;
    spin_paced(&p, 10000000);
    ck_assert_uint_gt(p.cpu_ns, cpu);
    ck_assert_uint_eq(p.slept_ns, slept);

    struct tk_cpu_pace off = {.factor = 0};
    spin_paced(&off, 10000000);
    ck_assert_uint_eq(off.cpu_ns + off.slept_ns, 0);
    tk_pace_cpu(NULL);
}
END_TEST

/* The data directory's lock (base/dirlock.h). Each test works in a fresh
 * directory under /tmp, removed at its end. */
static char lock_dir[64];

static void lock_dir_make(void)
{
    snprintf(lock_dir, sizeof(lock_dir), "/tmp/tk-dirlock-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(lock_dir));
}

static void lock_dir_path(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", lock_dir, name);
}

static void lock_dir_remove(void)
{
    char path[128];
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    unlink(path);
    lock_dir_path("target", path, sizeof(path));
    unlink(path);
    ck_assert_int_eq(rmdir(lock_dir), 0);
}

/* LOCK's text, NUL-terminated. */
static void lock_file_text(char *buf, size_t cap)
{
    char path[128];
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ssize_t got = read(fd, buf, cap - 1);
    ck_assert_int_ge(got, 0);
    buf[got] = 0;
    close(fd);
}

START_TEST(test_dirlock_second_take_is_refused_naming_dir_and_pid)
{
    lock_dir_make();
    int fd = -1, fd2 = 7;
    char err[TK_DIRLOCK_MSG_MAX], want[64];
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_str_eq(err, "");
    char text[64];
    snprintf(want, sizeof(want), "%ld\n", (long)getpid());
    lock_file_text(text, sizeof(text));
    ck_assert_str_eq(text, want);
    char path[128];
    struct stat st;
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777u, 0600u);

    /* A second open file description in the same process conflicts. */
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd2, err, sizeof(err)), TK_EBUSY);
    ck_assert_int_eq(fd2, -1);
    ck_assert_ptr_nonnull(strstr(err, lock_dir));
    snprintf(want, sizeof(want), "in use by process %ld, this one", (long)getpid());
    ck_assert_msg(strstr(err, want) != NULL, "%s", err);

    /* Released, it is free again, and LOCK holds no stale pid. */
    tk_dirlock_release(fd);
    lock_file_text(text, sizeof(text));
    ck_assert_str_eq(text, "");
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd2, err, sizeof(err)), 0);
    ck_assert_int_ge(fd2, 0);
    tk_dirlock_release(fd2);
    tk_dirlock_release(-1); /* ignored */
    lock_dir_remove();
}
END_TEST

START_TEST(test_dirlock_held_by_another_process_until_it_dies)
{
    lock_dir_make();
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        int fd;
        char e[TK_DIRLOCK_MSG_MAX];
        char ok = tk_dirlock_take(lock_dir, &fd, e, sizeof(e)) == 0 ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1)
            _exit(1);
        pause(); /* until killed: the kernel releases the lock */
        _exit(0);
    }
    close(ready[1]);
    char ok = 0;
    ck_assert_int_eq(read(ready[0], &ok, 1), 1);
    close(ready[0]);
    ck_assert_int_eq(ok, 'y');

    int fd = -1;
    char err[TK_DIRLOCK_MSG_MAX], want[64];
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), TK_EBUSY);
    ck_assert_int_eq(fd, -1);
    snprintf(want, sizeof(want), "in use by process %ld (", (long)child);
    ck_assert_msg(strstr(err, want) != NULL, "%s", err);
    ck_assert_ptr_nonnull(strstr(err, lock_dir));

    /* A crash leaves LOCK with a dead pid in it; it blocks nothing. */
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    char text[64];
    snprintf(want, sizeof(want), "%ld\n", (long)child);
    lock_file_text(text, sizeof(text));
    ck_assert_str_eq(text, want);
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), 0);
    snprintf(want, sizeof(want), "%ld\n", (long)getpid());
    lock_file_text(text, sizeof(text));
    ck_assert_str_eq(text, want);
    tk_dirlock_release(fd);
    lock_dir_remove();
}
END_TEST

START_TEST(test_dirlock_holder_without_pid_yet_is_still_refused)
{
    lock_dir_make();
    char path[128];
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    int held = open(path, O_RDWR | O_CREAT, 0600); /* locked, nothing written */
    ck_assert_int_ge(held, 0);
    ck_assert_int_eq(flock(held, LOCK_EX | LOCK_NB), 0);
    int fd = -1;
    char err[TK_DIRLOCK_MSG_MAX];
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), TK_EBUSY);
    ck_assert_msg(strstr(err, "has not written its pid") != NULL, "%s", err);
    close(held);
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), 0);
    tk_dirlock_release(fd);
    lock_dir_remove();
}
END_TEST

START_TEST(test_dirlock_lock_removed_by_its_holder_is_taken_anew)
{
    lock_dir_make();
    int a = -1, b = -1, c = -1;
    char err[TK_DIRLOCK_MSG_MAX], path[128];
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &a, err, sizeof(err)), 0);
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &b, err, sizeof(err)), 0);
    /* b holds the file the directory names: the next taker is refused. */
    struct stat held, named;
    ck_assert_int_eq(fstat(b, &held), 0);
    ck_assert_int_eq(stat(path, &named), 0);
    ck_assert_uint_eq(held.st_ino, named.st_ino);
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &c, err, sizeof(err)), TK_EBUSY);
    tk_dirlock_release(a);
    tk_dirlock_release(b);
    lock_dir_remove();
}
END_TEST

/* Holders that remove LOCK before releasing it (a refused restore does),
 * racing takers: never two holders at once, which needs tk_dirlock_take's
 * check that the file it locked is still the one the directory names. */
static atomic_int lock_holders;
static atomic_int lock_overlaps;

static void *lock_churn(void *arg)
{
    (void)arg;
    char err[TK_DIRLOCK_MSG_MAX], path[128];
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    for (int i = 0; i < 3000; i++) {
        int fd;
        if (tk_dirlock_take(lock_dir, &fd, err, sizeof(err)) != 0)
            continue;
        if (atomic_fetch_add(&lock_holders, 1) != 0)
            atomic_fetch_add(&lock_overlaps, 1);
        sched_yield();
        atomic_fetch_sub(&lock_holders, 1);
        unlink(path);
        tk_dirlock_release(fd);
    }
    return NULL;
}

START_TEST(test_dirlock_removed_while_others_take_never_has_two_holders)
{
    lock_dir_make();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, lock_churn, NULL), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_join(t[i], NULL), 0);
    int overlaps = atomic_load(&lock_overlaps);
    ck_assert_int_eq(overlaps, 0);
    lock_dir_remove();
}
END_TEST

START_TEST(test_dirlock_refuses_a_symlink_a_missing_dir_and_a_long_path)
{
    lock_dir_make();
    int fd = 7;
    char err[TK_DIRLOCK_MSG_MAX], path[128], target[128];
    lock_dir_path("target", target, sizeof(target));
    lock_dir_path(TK_DIRLOCK_FILE, path, sizeof(path));
    ck_assert_int_eq(symlink(target, path), 0);
    ck_assert_int_eq(tk_dirlock_take(lock_dir, &fd, err, sizeof(err)), TK_EIO);
    ck_assert_int_eq(fd, -1);
    ck_assert_msg(strstr(err, path) != NULL, "%s", err);
    ck_assert_int_eq(access(target, F_OK), -1); /* nothing written through it */

    char missing[128];
    lock_dir_path("missing", missing, sizeof(missing));
    ck_assert_int_eq(tk_dirlock_take(missing, &fd, err, sizeof(err)), TK_EIO);
    ck_assert_ptr_nonnull(strstr(err, missing));

    static char long_dir[5000];
    memset(long_dir, 'a', sizeof(long_dir) - 1);
    ck_assert_int_eq(tk_dirlock_take(long_dir, &fd, err, sizeof(err)), TK_EINVAL);
    lock_dir_remove();
}
END_TEST

static Suite *base_suite(void)
{
    Suite *s = suite_create("base");
    TCase *tc;

    tc = tcase_create("err");
    tcase_add_test(tc, test_strerror_names_every_code);
    tcase_add_test(tc, test_strerror_reports_unknown_codes);
    tcase_add_test(tc, test_error_codes_are_distinct_and_not_positive);
    suite_add_tcase(s, tc);

    tc = tcase_create("assert");
    tcase_add_test(tc, test_assert_failure_aborts_naming_expression_and_line);
    tcase_add_test(tc, test_unreachable_aborts);
    tcase_add_test(tc, test_assert_passes_and_evaluates_once);
    suite_add_tcase(s, tc);

    tc = tcase_create("alloc");
    tcase_add_test(tc, test_alloc_counts_calls_and_bytes);
    tcase_add_test(tc, test_calloc_zeroes_and_zero_size_is_not_null);
    tcase_add_test(tc, test_realloc_keeps_contents);
    tcase_add_test(tc, test_calloc_overflow_aborts_with_message);
    suite_add_tcase(s, tc);

    tc = tcase_create("blob");
    tcase_add_test(tc, test_blob_copy_holds_bytes_and_one_ref);
    tcase_add_test(tc, test_blob_refcount_frees_on_last_unref);
    tcase_add_test(tc, test_blob_ref_and_unref_accept_null);
    tcase_add_test(tc, test_mapped_blob_grows_keeps_bytes_and_unmaps);
    tcase_add_test(tc, test_mapped_blob_spare_is_reused);
    tcase_add_test(tc, test_blob_refcount_is_exact_across_threads);
    tcase_add_test(tc, test_blob_cache_reuses_across_threads);
    tcase_add_test(tc, test_blob_cache_is_bounded);
    tcase_add_test(tc, test_blob_big_cache);
    tcase_add_test(tc, test_blob_last_unref_on_any_thread_frees_once);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

    tc = tcase_create("log");
    tcase_add_test(tc, test_log_line_is_logfmt_with_node_term_and_kv);
    tcase_add_test(tc, test_log_escapes_quotes_newlines_and_controls_in_msg);
    tcase_add_test(tc, test_log_zero_node_and_term_print_dash);
    tcase_add_test(tc, test_log_drops_lines_below_level);
    tcase_add_test(tc, test_log_parse_level_accepts_names_and_rejects_others);
    tcase_add_test(tc, test_log_cuts_long_lines_but_keeps_them_well_formed);
    tcase_add_test(tc, test_log_without_sink_writes_to_stderr);
    suite_add_tcase(s, tc);

    tc = tcase_create("endian");
    tcase_add_test(tc, test_endian_stores_least_significant_byte_first);
    tcase_add_test(tc, test_endian_loads_what_it_stores_at_any_offset);
    tcase_add_test(tc,
                   test_endian_big_stores_most_significant_byte_first_and_loads_it_back);
    tcase_add_test(tc, test_base64_round_trips_and_refuses_bad_input_or_no_room);
    tcase_add_test(tc, test_hostport_splits_names_and_bracketed_v6_and_refuses_the_rest);
    tcase_add_test(tc, test_clock_readers_agree_in_units_and_never_go_back);
    suite_add_tcase(s, tc);

    tc = tcase_create("crc32c");
    tcase_add_test(tc, test_crc32c_matches_check_value);
    tcase_add_test(tc, test_crc32c_matches_rfc3720_vectors);
    tcase_add_test(tc, test_crc32c_of_nothing_is_its_input);
    tcase_add_test(tc, test_crc32c_matches_bitwise_reference_at_any_length_and_offset);
    tcase_add_test(tc, test_crc32c_chains_incrementally);
    tcase_add_test(tc, test_crc32c_detects_a_flipped_bit);
    suite_add_tcase(s, tc);

    tc = tcase_create("hist");
    tcase_add_test(tc, test_hist_empty_reports_zero);
    tcase_add_test(tc, test_hist_small_values_are_exact);
    tcase_add_test(tc, test_hist_quantiles_within_error);
    tcase_add_test(tc, test_hist_handles_extreme_values);
    tcase_add_test(tc, test_hist_count_over_brackets_the_exact_count);
    tcase_add_test(tc, test_array_grow_keeps_bytes_and_moves_pages);
    tcase_add_test(tc, test_array_shift_moves_pages_not_bytes);
    tcase_add_test(tc, test_hist_merge_equals_recording_everything);
    tcase_add_test(tc, test_hist_mean_is_exact);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("prng");
    tcase_add_test(tc, test_prng_matches_xoshiro256starstar_reference);
    tcase_add_test(tc, test_prng_seeds_state_with_splitmix64);
    tcase_add_test(tc, test_prng_same_seed_same_sequence);
    tcase_add_test(tc, test_prng_below_is_in_range_and_uniform);
    tcase_add_test(tc, test_prng_below_has_no_modulo_bias);
    tcase_add_test(tc, test_prng_range_is_inclusive);
    tcase_add_test(tc, test_prng_double_and_chance);
    suite_add_tcase(s, tc);

    tc = tcase_create("queue");
    tcase_add_test(tc, test_mpsc_rejects_bad_capacity);
    tcase_add_test(tc, test_mpsc_refuses_push_when_full);
    tcase_add_test(tc, test_mpsc_wraps_around_many_times);
    suite_add_tcase(s, tc);

    tc = tcase_create("queue_threads");
    tcase_add_test(tc, test_mpsc_two_producers_each_item_once_in_producer_order);
    tcase_add_test(tc, test_mpsc_four_producers_through_a_tiny_queue);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);

    tc = tcase_create("pace");
    tcase_add_test(tc, test_pace_cpu_sleeps_factor_times_the_cpu_used);
    suite_add_tcase(s, tc);

    tc = tcase_create("nice");
    tcase_add_test(tc, test_nice_enter_goes_low_and_leave_comes_back);
    tcase_add_test(tc, test_nice_enter_never_raises_the_priority);
    tcase_add_test(tc, test_nice_stays_at_the_floor_when_it_could_not_come_back);
    tcase_add_test(tc, test_nice_set_moves_another_thread);
    suite_add_tcase(s, tc);

    tc = tcase_create("dirlock");
    tcase_add_test(tc, test_dirlock_second_take_is_refused_naming_dir_and_pid);
    tcase_add_test(tc, test_dirlock_held_by_another_process_until_it_dies);
    tcase_add_test(tc, test_dirlock_holder_without_pid_yet_is_still_refused);
    tcase_add_test(tc, test_dirlock_lock_removed_by_its_holder_is_taken_anew);
    tcase_add_test(tc, test_dirlock_removed_while_others_take_never_has_two_holders);
    tcase_add_test(tc, test_dirlock_refuses_a_symlink_a_missing_dir_and_a_long_path);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(base_suite()));
}
