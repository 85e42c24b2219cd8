/* Allocation wrapper: aborts on out-of-memory (the redis choice) and counts
 * calls and bytes so benchmarks can report bytes allocated per operation.
 *
 * Counters are process-wide, updated with relaxed atomics; all functions are
 * thread-safe. Every queue, window and buffer in tierkv has a hard limit, so
 * running out of memory is a bug or a misconfiguration, not an input error. */
#ifndef TK_BASE_ALLOC_H
#define TK_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *tk_malloc(size_t size);
/* tk_malloc for a size a peer chose (a snapshot's announced total): NULL on
 * failure instead of aborting. Counted like the others. */
void *tk_try_malloc(size_t size);
void *tk_calloc(size_t n, size_t size);
void *tk_realloc(void *ptr, size_t size);
void tk_free(void *ptr);
/* tk_free for a big allocation whose first `len` bytes were written: their
 * pages are given back a slice (16 MiB) at a time first. A plain free of a
 * mapped allocation is one munmap, which frees every page in one hold of the
 * process's mmap lock; another thread's mmap, munmap or mremap then waits
 * for all of it, and so do the page faults queued behind that one (a 1.2 GB
 * snapshot stream freed on a pool thread, while the loop mapped a slab).
 * Meant for threads that may wait (not a loop). */
void tk_free_big(void *ptr, size_t len);
/* Gives the whole pages of [ptr, ptr + len) back, 16 MiB at a time (they
 * read as zeros after); nothing for 16 MiB or less. */
void tk_release_pages(void *ptr, size_t len);
char *tk_strdup(const char *s);

/* An array that may grow big (the Raft log's entries): below
 * TK_ARRAY_MAPPED_MIN bytes it is a malloc'd block; from there, a mapping of
 * its own, which grows by mremap (the pages move, nothing is copied, and the
 * new ones are faulted in as they are first written). A realloc does not
 * promise that: where the arena's top has room (tierkvd pads it by 64 MiB)
 * a big block comes from the heap and grows by a copy, and doubling a 16 MiB
 * log array on the loop copied it into 4,000 fresh pages in one turn (up to
 * 144 ms on every node at once, at 2.3M entries). `old_bytes` is the array's
 * current size (0 with p NULL), `new_bytes` the size wanted (larger); the
 * bytes up to old_bytes are kept. Aborts on failure, like tk_realloc. */
#define TK_ARRAY_MAPPED_MIN ((size_t)1 << 20)
void *tk_array_grow(void *p, size_t old_bytes, size_t new_bytes);
/* Frees an array of `bytes` (its size as last grown to). */
void tk_array_free(void *p, size_t bytes);
/* Moves the `n` elements of `elem` bytes at index `head` of an array of
 * `cap_bytes` (as last grown to) toward its start, keeping its capacity;
 * returns the array (it may have moved) and their new index in *new_head.
 * A mapped array drops the pages in front of them instead of copying them
 * (mremap: a memmove of 1M log entries, 40 MB, held a loop 48 ms), so
 * *new_head is then below one page-and-element unit (512 entries of 40 B);
 * a malloc'd one is memmoved to index 0. */
void *tk_array_shift(void *p, size_t cap_bytes, size_t elem, size_t head, size_t n,
                     size_t *new_head);

struct tk_alloc_stats {
    uint64_t calls; /* tk_malloc + tk_calloc + tk_realloc calls */
    uint64_t bytes; /* bytes requested by those calls, cumulative */
};

/* A snapshot of the counters. Subtract two snapshots to measure a section. */
void tk_alloc_stats(struct tk_alloc_stats *out);

#endif
