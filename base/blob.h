/* A reference-counted immutable byte buffer (entry payloads, snapshot data).
 *
 * One allocation holds the header and the bytes. A blob is shared between the
 * raft log, outgoing messages and the transports without copying: each holder
 * takes a reference and drops it when done. Reference counting is atomic, so
 * blobs may cross threads. The bytes must not change once a blob is shared. */
#ifndef TK_BASE_BLOB_H
#define TK_BASE_BLOB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tk_blob {
    atomic_uint_fast32_t refs;
    size_t len;
    uint8_t data[];
};

/* A new blob of `len` bytes (uninitialised) with one reference. Never NULL.
 * A small one (header and bytes at most 4 KiB) is rounded up to a size class
 * and comes from a per-thread cache of freed ones (blob.c), so a steady
 * write load allocates none; the cache holds at most 32 MiB in the process
 * (tk_blob_cached_bytes). */
struct tk_blob *tk_blob_new(size_t len);

/* Bytes held by the small- and big-blob caches (memory accounting). */
size_t tk_blob_cached_bytes(void);
/* Bytes of small blobs in use now, rounded up to their size class (the
 * Raft log's payloads of small writes, messages in flight; memory
 * accounting). 0 under AddressSanitizer. */
size_t tk_blob_live_small_bytes(void);
/* Sets how many bytes the small-blob caches may hold in all (default 32
 * MiB; tierkvd's --memory-budget lowers it); returns the previous limit. Past
 * it, a freed magazine is freed, not kept. Any thread. */
size_t tk_blob_cache_limit(size_t bytes);
/* Big blobs (128 KiB to 64 MiB with the header) are mappings of their
 * own, kept once freed as extents shared by the process, at most `bytes` of
 * them (default 32 MiB; tierkvd's --memory-budget sets it): on a virtual
 * machine a fresh page's first write costs about a hundred times a rewrite.
 * Returns the previous limit; lowering it drops what is kept. Any thread. */
size_t tk_blob_big_cache_limit(size_t bytes);
/* Frees every kept big blob now (on the calling thread: not a loop). */
void tk_blob_big_cache_drop(void);
/* Whether a big blob found no kept pages since the last prefill, and none
 * is under way; true once per such miss (the caller then runs
 * tk_blob_big_prefill, off its loop). */
bool tk_blob_big_prefill_wanted(void);
/* Maps and writes up to `max` bytes of extents of the size that last
 * missed, kept for the next big blobs, within the limit: their page faults
 * are taken here, on the calling thread (a pool thread, not a loop).
 * Returns the bytes added. Either way the prefill asked for is over, so the
 * next miss asks again: `max` 0 only ends it (its job was cancelled). */
size_t tk_blob_big_prefill(size_t max);
/* Big blobs made so far (kept or new: a caller that sees no change over a
 * while knows the kept ones idle) and the bytes kept now. */
uint64_t tk_blob_big_allocs(void);
size_t tk_blob_big_cached_bytes(void);
/* Whether freed small blobs are kept (not under AddressSanitizer). */
bool tk_blob_cache_enabled(void);

/* tk_blob_new for a length a peer chose: NULL when it cannot be had, or is
 * past TK_BLOB_TRY_MAX (no allocator is asked for more; AddressSanitizer's
 * own limit is 1 TiB). */
#define TK_BLOB_TRY_MAX ((size_t)1 << 40)
struct tk_blob *tk_blob_try_new(size_t len);

/* A blob on a mapping of its own, with room for `cap` bytes and len 0, for
 * one that grows to a size known roughly in advance (a snapshot stream):
 * the room is address space, its pages come as they are first written, and
 * the allocator never fills it (MALLOC_PERTURB_). NULL if it cannot be
 * mapped. Its owner may grow it (tk_blob_map_grow) while it holds the only
 * reference.
 *
 * The last unref keeps the mapping, pages and all, as a spare (at most
 * TK_BLOB_SPARES of them in the process, the largest kept, and no more than
 * TK_BLOB_SPARE_BYTES of written pages in all), and the next tk_blob_map
 * takes one: the bytes it holds are the old blob's, not zeros.
 * On a virtual machine the first write to memory the guest has not used
 * lately costs about a hundred times a rewrite (the host backs each page
 * then: 1.7-3.5 s per 512 MiB on this project's VM, against 25-50 ms), and
 * every snapshot used to fill a fresh mapping. But a spare is memory the
 * host must go on backing: at 10M keys (1.5 GB streams, one kept per node)
 * the VM was frozen for seconds where it never had been, so a stream past
 * TK_BLOB_SPARE_BYTES is not kept. A spare much larger than asked for is cut
 * to size when taken; otherwise a dropped mapping gives its pages back a
 * slice at a time, then is unmapped. */
struct tk_blob *tk_blob_map(size_t cap);
#define TK_BLOB_SPARES 2
#define TK_BLOB_SPARE_BYTES ((size_t)512 << 20)
/* Bytes of the mappings of tk_blob_map blobs in use (snapshot streams; their
 * size, of which only the pages written are resident; memory accounting). */
size_t tk_blob_map_live_bytes(void);
/* Bytes held by spare mappings (memory accounting). */
size_t tk_blob_spare_bytes(void);
/* How many spares to keep from now on (0: none; at most TK_BLOB_SPARES);
 * spares past it are dropped. Returns the previous setting. */
unsigned tk_blob_spares_keep(unsigned n);
/* Drops every spare now (their pages go back, on the calling thread: a
 * slice at a time, so not on a loop); later ones are kept as before. For a
 * process whose streams have become rare (a node whose snapshots are
 * descriptors only), where a spare would be memory held for nothing. */
void tk_blob_spares_drop(void);
/* The room of a tk_blob_map blob, in bytes. */
size_t tk_blob_map_cap(const struct tk_blob *b);
/* Room for at least `cap` bytes (an mremap: the blob may move; len and the
 * bytes stay). NULL on failure (b is then unchanged). */
struct tk_blob *tk_blob_map_grow(struct tk_blob *b, size_t cap);

/* A new blob holding a copy of `len` bytes at `src`, with one reference. */
struct tk_blob *tk_blob_copy(const void *src, size_t len);

/* Takes another reference; returns `b`. NULL is allowed and returned. */
struct tk_blob *tk_blob_ref(struct tk_blob *b);

/* The number of references held (for tests and assertions). */
uint32_t tk_blob_refs(const struct tk_blob *b);

/* Drops a reference, freeing the blob on the last one (a big one with
 * tk_free_big: the thread that drops a big blob's last reference should be
 * one that may wait). NULL is allowed. */
void tk_blob_unref(struct tk_blob *b);

#endif
