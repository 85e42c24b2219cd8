/* The durable Raft log and hard state: the interface the node uses.
 *
 * A store holds one node's Raft log (entries first_index..last_index), the
 * term of the entry just before first_index (so term_at works right after a
 * compaction or a snapshot install), and the metadata the node must never act
 * on before it is durable: current term and vote, cluster and node id, the
 * bootstrap configuration, the snapshot descriptor and an install's pending
 * one.
 *
 * Two backends share this interface and its semantics:
 *   fs  (store_open_fs):  segment files named by first index, records
 *                         [crc32c][len][index][term][time][synced][type]
 *                         [payload] (`synced`: the highest index durable when
 *                         the record was written, which lets recovery tell a
 *                         torn tail from damaged acknowledged data),
 *                         metadata in an LMDB environment (dir/meta).
 *   mem (store_open_mem): the "memory volume": entries and metadata live in a
 *                         struct store_mem_volume that outlives the store, so a
 *                         test can close and reopen (or crash, losing unsynced
 *                         writes) and see what a disk would have kept.
 *
 * Threads. A store is driven by one owner thread (the node's loop) plus the
 * store's own storage thread, which runs the asynchronous appends.
 *   - store_append_async() never blocks on disk: it queues the batch (bounded,
 *     STORE_QUEUE_MAX requests by default; a full queue is TK_EBUSY) and the
 *     storage thread writes every queued batch with one positional write per
 *     segment and one fdatasync (group commit), then calls each request's
 *     callback, in submission order, on the storage thread. When fewer
 *     requests are queued than the last group had (its producers are
 *     refilling), the thread waits for as many up to min(100 us, a quarter of
 *     the last sync) before it takes the group.
 *   - Every other call blocks: the metadata saves on an LMDB synchronous
 *     commit, store_append/compact/reset on the disk (and they wait
 *     for the storage thread to finish the group it is writing). Reads and
 *     term_at take a short lock and may run while the storage thread writes.
 *   - Calls are safe from any thread, but the log-changing calls are ordered
 *     only by the order in which they are made: the owner must not call
 *     store_append/reset while async appends it submitted earlier
 *     are still queued if it needs them to apply first. store_compact below
 *     the durable index is always safe.
 *
 * Entries. A batch is an array of struct raft_entry with consecutive indexes.
 * Appending follows Raft's rule: first every stored entry with index >=
 * entries[0].index is discarded, then the batch is appended; entries[0].index
 * must be in first_index..last_index+1 (else TK_EINVAL). The store takes its
 * own reference on each entry.data (payload blobs are immutable); the caller's
 * array and references stay the caller's. Entries returned by store_read carry
 * fresh references the caller must drop (store_entries_free).
 *
 * Errors. 0 or a negative TK_E* code; store_errmsg() says which file, offset
 * and index were involved. TK_EIO or TK_ENOSPC from a write or a sync puts the
 * store in a failed state: nothing is acknowledged after a failed sync (the
 * kernel may have dropped the dirty pages), the sync is never retried, and
 * every later log or metadata call returns the same error. Recovery that finds
 * a torn tail in the last segment truncates it; any other damage (a CRC error
 * in a sealed segment, a gap, a missing segment) refuses to open with
 * TK_ECORRUPT. */
#ifndef TK_STORE_STORE_H
#define TK_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/hist.h"
#include "raft/raft.h"

#define STORE_SEGMENT_BYTES_DEFAULT (64u << 20)
#define STORE_SEGMENT_BYTES_MIN (4u << 10)
#define STORE_SEGMENT_BYTES_FIRST (4u << 20) /* a log's first segment: fs.c */
#define STORE_QUEUE_MAX 4096                 /* queued async appends, default */
#define STORE_GROUP_BYTES_MAX (8u << 20)     /* bytes written per sync, at most */
#define STORE_ENTRY_BYTES_MAX (16u << 20)    /* payload bytes per entry */
#define STORE_BATCH_MAX 65536                /* entries per append call */
#define STORE_ERRMSG_MAX 512

struct store;
struct store_mem_volume;

/* The file operations the fs backend uses, replaceable by tests to inject
 * faults at the syscall boundary. Each returns what the libc call returns and
 * sets errno likewise. A table passed in store_options must outlive the store;
 * store_fileops_default() is the real one. */
struct store_fileops {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*close)(int fd);
    ssize_t (*pwritev)(int fd, const struct iovec *iov, int iovcnt, off_t off);
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    int (*fdatasync)(int fd);
    int (*fsync)(int fd); /* used on directories */
    int (*fallocate)(int fd, int mode, off_t off, off_t len);
    int (*ftruncate)(int fd, off_t len);
    int (*rename)(const char *from, const char *to);
    int (*unlink)(const char *path);
};
const struct store_fileops *store_fileops_default(void);

struct store_options {
    /* fs: bytes per segment file (preallocated), at most: a log's first
     * segment is STORE_SEGMENT_BYTES_FIRST and each next one twice the last.
     * 0 = the default (64 MiB). */
    uint64_t segment_bytes;
    /* Bound on queued async appends. 0 = STORE_QUEUE_MAX. */
    uint32_t queue_max;
    /* fs: file operations; NULL = store_fileops_default(). */
    const struct store_fileops *fileops;
    /* mem: injected latency of each sync, in microseconds (0 = none). */
    uint32_t mem_sync_latency_us;
};
void store_options_default(struct store_options *o);

/* What recovery found: everything raft_boot needs except the entries, which
 * are read with store_read(s, first_index, last_index + 1, ...). */
struct store_boot {
    struct raft_hard_state hard_state;
    struct raft_snapshot_meta snapshot; /* index 0 when none was saved */
    struct raft_snapshot_meta pending;  /* store_save_pending_snapshot's; index 0: none */
    bool has_bootstrap;
    struct raft_config bootstrap; /* valid when has_bootstrap */
    uint64_t cluster_id;          /* 0 when never set */
    uint64_t node_id;             /* 0 when never set */
    bool has_incarnation;         /* the data directory's random id is set */
    uint8_t incarnation[16];
    uint64_t first_index; /* first entry held (or to be held) */
    uint64_t last_index;  /* first_index - 1 when empty */
    uint64_t prev_term;   /* term of first_index - 1 (0 if none) */
};

/* Opens (creating if needed) the store in directory `dir` and recovers it.
 * `o` may be NULL for defaults. On success *out is the store and *boot (if
 * not NULL) the recovered state; on failure `errmsg` (if not NULL) gets a
 * sentence naming the file, the offset and the index at fault. Blocks.
 * Returns 0, TK_ECORRUPT, TK_EIO, TK_ENOSPC or TK_EINVAL. */
int store_open_fs(const char *dir, const struct store_options *o, struct store **out,
                  struct store_boot *boot, char *errmsg, size_t errmsg_len);

/* A memory volume: what a mem store persists. Survives store_close, so tests
 * can reopen. Any thread; at most one store open on a volume at a time. */
struct store_mem_volume *store_mem_volume_new(void);
void store_mem_volume_free(struct store_mem_volume *v);
/* Makes room for `cap` entries at once, so that a long log is not copied into
 * a larger array in the middle of an append. Any thread. */
void store_mem_volume_reserve(struct store_mem_volume *v, size_t cap);
/* Simulates power loss: drops log writes that were not synced yet. Only
 * while no store is open on `v`. */
void store_mem_volume_crash(struct store_mem_volume *v);

/* Opens a store on a memory volume. Same contract as store_open_fs. */
int store_open_mem(struct store_mem_volume *v, const struct store_options *o,
                   struct store **out, struct store_boot *boot, char *errmsg,
                   size_t errmsg_len);

/* Stops the storage thread after it has finished every queued append (their
 * callbacks run first), then frees the store. Blocks. Owner thread; never
 * from inside an append callback. */
void store_close(struct store *s);

/* Completion of an async append. Called on the storage thread (or, for a
 * memory volume without injected latency when nothing is queued ahead, and
 * for store_append_now_if_idle, on the caller's thread before the call
 * returns), once per
 * request, in submission order, after the batch is durable (status 0) or
 * failed (status < 0: nothing of it may be assumed durable). `last_index` and
 * `last_term` are the batch's last entry. The callback must not call back into
 * the store except store_read/term_at/first/last; it typically records the
 * seq and wakes the owner's loop (uv_async_send). */
typedef void store_append_cb(void *data, uint64_t seq, uint64_t last_index,
                             uint64_t last_term, int status);

/* Queues a batch for the storage thread. Borrows `entries` (references on
 * payloads are taken). `seq` is the caller's tag (the raft ready seq) handed
 * back to `cb`. Returns 0 (cb will run exactly once), TK_EBUSY (queue full;
 * cb will not run), TK_EINVAL (n == 0, n > STORE_BATCH_MAX, indexes not
 * consecutive, a payload above STORE_ENTRY_BYTES_MAX), or the failed state's
 * error. Checks of entries[0].index against the log happen on the storage
 * thread and arrive through cb as TK_EINVAL. Never blocks on disk. */
int store_append_async(struct store *s, const struct raft_entry *entries, size_t n,
                       uint64_t seq, void *data, store_append_cb *cb);

/* As store_append_async, but when nothing is queued or being written and the
 * last sync took at most `max_sync_ns` (0: never), the batch is written and
 * synced on the caller's thread, and cb runs there, before the call returns:
 * no hand-off to the storage thread and back (two thread wake-ups on the
 * write's path), for holding the caller through one sync of a disk that was
 * fast a moment ago. Otherwise it is queued behind the others (and never
 * blocks on disk). For a caller with nothing else to do until the batch is
 * durable (a follower's loop). The backend's work between groups (fs: the
 * next segment file) stays on the storage thread. */
int store_append_now_if_idle(struct store *s, const struct raft_entry *entries, size_t n,
                             uint64_t seq, void *data, store_append_cb *cb,
                             uint64_t max_sync_ns);

/* The synchronous form: returns once the batch is durable. Blocks. */
int store_append(struct store *s, const struct raft_entry *entries, size_t n);

/* Forgets entries up to and including `index` (which must be <= last_index),
 * durably recording the new first index; the fs backend deletes whole
 * segments that are entirely covered. A compaction below first_index is a
 * no-op. Blocks. */
int store_compact(struct store *s, uint64_t index);

/* Discards the whole log and makes it start after (index, term): used when a
 * snapshot replaces the log. The next append must start at index + 1. */
int store_reset(struct store *s, uint64_t index, uint64_t term);

/* Log bounds; last < first means empty. Any thread. */
uint64_t store_first_index(struct store *s);
uint64_t store_last_index(struct store *s);

/* The term of entry `index` into *term: for first_index - 1 it is the
 * recorded prev_term. Returns 0, TK_ECOMPACTED (below first_index - 1) or
 * TK_EUNAVAIL (above last_index). O(log terms), no I/O. Any thread. */
int store_term_at(struct store *s, uint64_t index, uint64_t *term);

/* Fills *rb for raft_new() from *boot: hard state, snapshot descriptor,
 * bootstrap configuration (zero when none was saved), and the log entries
 * after the snapshot (from max(first_index, snapshot.index + 1) to
 * last_index), read into a new array *entries that rb->entries points to;
 * free it with store_entries_free(*entries, rb->n_entries) after raft_new.
 * rb->applied and rb->snapshot_data are left 0/NULL for the caller (the state
 * machine knows them). Returns 0, TK_ECORRUPT when the log starts after the
 * snapshot with a gap between them, or a store_read error. Blocks. */
int store_raft_boot(struct store *s, const struct store_boot *boot, struct raft_boot *rb,
                    struct raft_entry **entries);

/* Reads entries lo..hi-1 (lo >= first_index, hi <= last_index + 1) into a new
 * array *out of *n entries, each with a fresh payload reference. Stops early,
 * after at least one entry, once the payload bytes reach `max_bytes`
 * (0 = no limit). Free with store_entries_free. Returns 0, TK_ECOMPACTED,
 * TK_EUNAVAIL, TK_EINVAL (lo > hi) or TK_ECORRUPT (a record failed its CRC on
 * read: store_errmsg names it). Blocks on reads. Any thread. */
int store_read(struct store *s, uint64_t lo, uint64_t hi, uint64_t max_bytes,
               struct raft_entry **out, size_t *n);
void store_entries_free(struct raft_entry *entries, size_t n);

/* Metadata, each saved with a synchronous commit before returning. Blocks. */
int store_save_hard_state(struct store *s, const struct raft_hard_state *hs);
int store_save_snapshot(struct store *s, const struct raft_snapshot_meta *m);
/* The descriptor of a snapshot about to be installed, saved before the state
 * machine publishes it: recovery finishes an install interrupted between
 * that publication and store_reset + store_save_snapshot (boot.pending). */
int store_save_pending_snapshot(struct store *s, const struct raft_snapshot_meta *m);
int store_save_bootstrap(struct store *s, const struct raft_config *c);
int store_save_ids(struct store *s, uint64_t cluster_id, uint64_t node_id);
/* The data directory's incarnation: 16 random bytes drawn once, when it is
 * first initialized (node/), which tells a member's log from a new, empty one
 * under the same node id. Saved with the ids. */
int store_save_incarnation(struct store *s, const uint8_t *inc);

/* Counters, for benchmarks and metrics. Any thread. */
struct store_stats {
    uint64_t appends; /* append requests completed */
    uint64_t entries; /* entries written */
    uint64_t bytes;   /* record bytes written */
    uint64_t syncs;   /* fdatasync calls (or simulated syncs) on the log */
    uint64_t groups;  /* group commits */
    /* Times a producer woke the storage thread (a futex wake through q_cv).
     * Only the idle transition wakes it: an append queued while the thread
     * is busy writing or syncing is taken with the next group at no cost.
     * Wake-ups per append = wakeups / appends (for /metrics). */
    uint64_t wakeups;
    /* fs: compacted segments kept as the next one (renamed, their range
     * zeroed) instead of deleted: a deletion's discards held every sync on
     * the device for tens of ms. */
    uint64_t recycled;
};
void store_stats(struct store *s, struct store_stats *out);

/* The bytes the log holds: fs, the records in its segment files (headers and
 * padding included; each file is preallocated to its size, so the
 * disk holds up to one segment more); mem, the entries and their payloads.
 * Any thread; O(segments) under the backend's index lock. */
uint64_t store_log_bytes(struct store *s);

/* Copies into *out the latency histogram (nanoseconds, base/hist.h) of the
 * log syncs counted in store_stats.syncs: one sample per sync step, that is
 * the fdatasync of every segment the group wrote (usually one) plus the
 * directory's fsync when a segment was created, renamed or deleted; on a
 * memory volume, the injected sync latency. Any thread; copies about 30 KiB
 * under a lock the storage thread holds only to record a sample. */
void store_sync_latency(struct store *s, struct tk_hist *out);

/* The last error's description (a static-lifetime buffer in the store, valid
 * until the next failing call). Any thread. */
const char *store_errmsg(struct store *s);

/* Nonzero once the store is failed (the error it returns). */
int store_failed(struct store *s);

#endif
