/* The ring-log KV state machine: the public face of kv/.
 *
 * A tiered store. Applied writes append records to the ring (hot tier, a paged
 * log in memory), or rewrite the key's record in place when it lies in the
 * newer half of the ring and the value keeps its length; a hash index maps
 * each hot key to its newest record; an ordered view of the hot keys serves
 * scans; LMDB is the cold tier. When the ring grows past its budget, a
 * tier-down step writes every key changed since the last one to LMDB in one
 * transaction together with the applied index (so LMDB holds exactly the state
 * at that index), then releases the oldest pages. The raft log is the
 * write-ahead log: after a restart LMDB says which index it holds
 * (kv_sm_durable_index) and the node replays the log after it.
 *
 * Threads: a struct kv_sm is owned by one thread (the node's loop thread,
 * which applies); every kv_sm_* call comes from that thread. A struct kv_snap may be read
 * from another thread while the owner keeps applying (it holds an LMDB MVCC view), but
 * kv_snap_close must happen before kv_sm_close.
 *
 * Determinism: apply depends only on the sm's state and its arguments. TTL
 * expiry uses the entries' time_ms (the sm's clock is the largest time_ms it
 * has applied), never the local clock, so every replica decides alike.
 * Malformed or oversized commands give an error result and are still consumed.
 */
#ifndef TK_KV_KV_H
#define TK_KV_KV_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_TXN_OPS_MAX 128 /* ops in a batch or in then+else of a txn */
/* Live keys a transaction's range compares look at, together (kvpb.Compare
 * range_end). */
#define KV_COMPARE_RANGE_KEYS 10000

struct kv_config {
    const char *dir;         /* directory for the cold tier (created if needed) */
    size_t page_bytes;       /* ring page size, default 256 KiB */
    size_t ring_bytes;       /* ring budget, default 64 MiB */
    size_t key_max;          /* default 4 KiB, at most 65535 */
    size_t value_max;        /* default 1 MiB, at most 64 MiB */
    size_t sessions_max;     /* remembered (client, seq) results, default 65536 */
    size_t map_bytes;        /* LMDB map size, default 64 GiB (sparse) */
    bool no_sync;            /* LMDB without fsync (tests, benchmarks only) */
    bool background_tier;    /* the owner runs tier-down jobs (kv_sm_tier_start)
                                when kv_sm_tier_wanted; apply itself tiers down
                                only past twice the ring budget */
    bool append_only;        /* every write appends a record, none is rewritten
                                in place: the ring is a log of every version */
    size_t events_max;       /* change log (events.c): events held, default
                                65536; 0 keeps no events */
    size_t events_bytes;     /* ... and bytes held, default 16 MiB */
    size_t ttl_max;          /* keys with a TTL tracked for expiry (ttl.c),
                                default 1 Mi; past it a key expires only lazily
                                at read (kv_sm_stats.ttl_dropped counts them) */
    unsigned writeback_pace; /* kv_tier_run_paced: the LMDB commit's dirty pages
                                are written out 4 MiB of the file at a time,
                                sleeping this many times as long as each slice
                                took, at most 4 s per commit, before its
                                fdatasync (base/sync.h); default 3, 0 = not
                                paced */
    unsigned read_pace;      /* kv_tier_run_paced: a snapshot job's read of
                                the stream sleeps this many times the CPU time
                                it uses (tk_pace_cpu), until hurried; default
                                3, 0 = not paced */
};

/* Keys whose first byte is KV_RESERVED_BYTE belong to the node (its
 * membership records, node/node.h NODE_MEMBER_KEY_PREFIX): a delete range
 * never deletes them, whatever its bounds (the same on every replica). */
#define KV_RESERVED_BYTE 0x01

/* Fills `c` with the defaults above and dir = NULL. */
void kv_config_default(struct kv_config *c);

/* The outcome of one op of a batch or transaction. */
struct kv_op_result {
    int64_t value;    /* increment: the new value */
    uint64_t deleted; /* delete: 1 if the key existed */
};

/* The outcome of a command, returned to the client. */
struct kv_result {
    int code;          /* 0, or TK_EINVAL (malformed), TK_ETOOBIG (key/value too
                          large), TK_ECOMPARE (put compare failed), TK_ERANGE
                          (increment overflow or non-integer value) */
    uint64_t revision; /* the entry index if the command changed state, else 0 */
    bool succeeded;    /* txn: compares held; other writes: code == 0 */
    bool duplicate;    /* answered from the exactly-once table (not encoded) */
    int64_t value;     /* increment: the new value */
    uint64_t deleted;  /* delete / delete range: number of keys deleted */
    bool more;         /* delete range: stopped at its limit */
    uint32_t n_ops;    /* batch / txn: per-op results */
    struct kv_op_result ops[KV_TXN_OPS_MAX];
};

/* A key/value as a read returns it. The pointers are borrowed from the sm and
 * stay valid until the next kv_sm_* call (or the callback's return). */
struct kv_item {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
    uint64_t create_revision;
    uint64_t mod_revision;
    uint64_t version;
    uint64_t expire_ms; /* 0: no TTL */
    bool hot;           /* read from the ring (false: from the cold tier) */
};

/* A scan: keys with `prefix` when by_prefix, else keys in [start, end) (end_len
 * 0 = unbounded). In key byte order. */
struct kv_range {
    const void *start;
    size_t start_len;
    const void *end;
    size_t end_len;
    bool by_prefix; /* start/start_len is the prefix */
};

/* Called once per item, in order; return 0 to go on, nonzero to stop. */
typedef int kv_item_cb(const struct kv_item *item, void *data);

struct kv_sm;

/* Opens (creating if needed) the state machine in c->dir and recovers: the
 * cold tier's index, term and clock, and the exactly-once table. The ring is
 * empty; the node replays log entries > kv_sm_applied_index().
 * Returns 0, TK_EINVAL (bad config), TK_EIO, TK_ECORRUPT. */
int kv_sm_open(const struct kv_config *c, struct kv_sm **out);

/* Closes without tiering down: what is only in the ring is lost (it is in the
 * raft log). NULL is allowed. */
void kv_sm_close(struct kv_sm *sm);

/* Applies the NORMAL entry `index` (must be applied index + 1, else TK_EINVAL
 * and nothing happens). Fills `res` (an error result for a bad command, which
 * is still consumed). Returns 0, or TK_EIO if a tier-down step failed: the sm
 * is then failed and every later write returns TK_EIO. */
int kv_sm_apply(struct kv_sm *sm, uint64_t index, uint64_t term, uint64_t time_ms,
                const void *cmd, size_t cmd_len, struct kv_result *res);

/* Advances the applied index over a NOOP or CONFIG entry (index must be
 * applied + 1). The entry's time still advances the sm's clock. */
int kv_sm_skip(struct kv_sm *sm, uint64_t index, uint64_t term, uint64_t time_ms);

uint64_t kv_sm_applied_index(const struct kv_sm *sm);
uint64_t kv_sm_applied_term(const struct kv_sm *sm);
/* The index the cold tier holds durably: the raft log may be compacted up to
 * it, and a restart resumes after it. */
uint64_t kv_sm_durable_index(const struct kv_sm *sm);
/* Bytes of the cold tier's LMDB file in use (kv_sm_stats' cold_bytes, alone):
 * about the size of a snapshot stream of the state. */
uint64_t kv_sm_cold_bytes(const struct kv_sm *sm);

/* Reads at the applied index. Returns 0 and fills `out`, TK_ENOTFOUND, or
 * TK_EIO. A ring record that fails its magic/CRC check is never returned: the
 * cold tier's copy is used instead (or not found). */
int kv_sm_get(struct kv_sm *sm, const void *key, size_t key_len, struct kv_item *out);

/* Calls `cb` for each of the n keys, in order, with found = 0 or TK_ENOTFOUND
 * (item then has only the key). Stops early when cb returns nonzero. */
typedef int kv_multi_cb(int found, const struct kv_item *item, void *data);
int kv_sm_multi_get(struct kv_sm *sm, const struct kv_item *keys, size_t n,
                    kv_multi_cb *cb, void *data);

/* Hints before applying a batch. kv_sm_prefetch starts loading the index
 * bucket of the key of `cmd` (a plain put or delete; anything else: false) and
 * gives the key's hash; kv_sm_prefetch_record, a few commands later (once the
 * bucket is likely cached), starts loading the key's current record. Applying
 * command i while hinting i + 4 and i + 8 overlaps their cache misses. Neither
 * changes any state. */
bool kv_sm_prefetch(const struct kv_sm *sm, const void *cmd, size_t cmd_len,
                    uint64_t *hash);
void kv_sm_prefetch_record(const struct kv_sm *sm, uint64_t hash);

/* Scans live keys of `r` in byte order, at most `limit` (0 = no limit), merging
 * the hot keys with the cold tier. `cb` must not change the sm (no apply, no
 * tier-down) while the scan runs. Returns 0 or TK_EIO. */
int kv_sm_scan(struct kv_sm *sm, const struct kv_range *r, size_t limit, kv_item_cb *cb,
               void *data);

/* Where a bounded scan stopped: `key` (the caller's buffer of `cap` bytes;
 * give the sm's key_max) gets the key read last, so that the next scan goes
 * on from just after it (the key plus a 0 byte). */
struct kv_scan_stop {
    bool stopped; /* the skip budget ran out before the range or the limit did */
    uint8_t *key;
    size_t cap, key_len;
};

/* Scans over keys deleted or expired but still held (tombstones) read
 * records that give no item. kv_sm_scan_bounded stops after skip_max such
 * records (0: no budget) and says where in *stop (may be NULL), so
 * that one call does bounded work however many deleted keys the range holds.
 * Returns 0 or TK_EIO, as kv_sm_scan. */
#define KV_SCAN_SKIP_MAX 16384
int kv_sm_scan_bounded(struct kv_sm *sm, const struct kv_range *r, size_t limit,
                       size_t skip_max, kv_item_cb *cb, void *data,
                       struct kv_scan_stop *stop);

/* Tier-down. Both write every key changed since the last tier-down to LMDB
 * with the applied index, so kv_sm_durable_index() == kv_sm_applied_index().
 * kv_sm_flush then releases every page; kv_sm_tier_down releases the oldest
 * until the ring is under 3/4 of its budget (apply calls it itself when the
 * ring is over budget, or when it tracks as many in-place rewrites as it
 * may: ring budget / 256). Returns 0 or TK_EIO. */
int kv_sm_flush(struct kv_sm *sm);

/* Maintenance, not a command: removes every key that starts with `prefix`
 * at the applied index (no new revision, no change-log event), then flushes
 * to the cold tier; *forgot is how many. For a restore, which must not keep
 * the source cluster's membership records (node_restore.c). Owner thread,
 * no job in flight. Returns 0 or TK_EIO. */
int kv_sm_forget_prefix(struct kv_sm *sm, const uint8_t *prefix, size_t len,
                        uint64_t *forgot);
int kv_sm_tier_down(struct kv_sm *sm);

/* Tier-down in the background, so the LMDB work leaves the owner's thread:
 *   kv_sm_tier_start (owner) seals the ring at the applied index and picks
 *     the pages to release: the oldest until the ring would be under 3/4 of
 *     its budget (with snapshot = true too: the snapshot needs the cold tier
 *     at the applied index, not an empty ring). *out is NULL when there is
 *     nothing to do. TK_EBUSY while a job is in flight, TK_EIO once the sm
 *     has failed.
 *   kv_tier_run (any one thread) writes the keys changed since the last
 *     tier-down to LMDB in one transaction with that index; with snapshot =
 *     true it then reads the snapshot stream of that state into memory.
 *     Meanwhile the owner keeps applying, reading and scanning (the pages stay
 *     in the ring until finish; apply appends rather than rewrite a record
 *     the job reads).
 *   kv_sm_tier_finish (owner) publishes the result, releases the pages, frees
 *     the job and, for a snapshot, hands over the stream (a blob with one
 *     reference: the caller owns it). Returns 0 or TK_EIO (the sm has failed).
 *   kv_sm_tier_publish (owner) is finish without the release: O(1) but for
 *     freeing the job. The released pages' index entries then go a slice at
 *     a time, in kv_sm_tier_drain calls (at most max_records records each;
 *     true once the pages are released and nothing is left), so that
 *     dropping a million entries never holds the owner's thread. Meanwhile
 *     the owner applies, reads and scans as usual: the pages stay in the ring
 *     until the drain is done, an entry goes only if it still points into
 *     them, and apply never rewrites their records in place. A new tier-down,
 *     kv_sm_flush, kv_sm_tier_down and kv_sm_snapshot first finish a pending
 *     drain at once; an install's commit drops it with the state it
 *     replaces; kv_sm_tier_wanted is false during one.
 * While a job is in flight, kv_sm_flush, kv_sm_tier_down, kv_sm_snapshot and
 * kv_sm_install_begin return TK_EBUSY, and kv_sm_close must not be called. */
struct tk_blob;
struct kv_tier_job;
struct kv_tier_result {
    uint64_t index, term;   /* snapshot: the state the stream holds */
    struct tk_blob *stream; /* snapshot: built on kv_tier_run's thread (NULL
                               for kv_sm_tier_start_durable's job) */
    /* kv_tier_run_paced: 4 MiB slices written out with pages in them, the
     * time that took and the time slept between them. */
    uint64_t paced_slices, paced_write_ns, paced_slept_ns;
    /* ... and a snapshot job's read: its CPU time and time slept (read_pace). */
    uint64_t read_cpu_ns, read_slept_ns;
};
int kv_sm_tier_start(struct kv_sm *sm, bool snapshot, struct kv_tier_job **out);
/* kv_sm_tier_start with snapshot = true whose job reads no stream: it only
 * leaves the cold tier at the applied index, durably, and its result (and
 * kv_tier_snapshot_at) gives that index and term, with stream NULL: the
 * descriptor of a snapshot that kv_sm_snapshot_cold can read out later. */
int kv_sm_tier_start_durable(struct kv_sm *sm, struct kv_tier_job **out);
void kv_tier_run(struct kv_tier_job *j);
/* kv_tier_run for a thread that may take its time (a pool thread, never the
 * owner's): the commit's writeback is paced (kv_config.writeback_pace) until
 * the owner calls kv_sm_tier_hurry, which it does before it waits for the job
 * or when it must stop applying for it. */
void kv_tier_run_paced(struct kv_tier_job *j);
void kv_sm_tier_hurry(struct kv_sm *sm);
/* After kv_tier_run, on its thread: true if the job read a snapshot stream
 * (or is kv_sm_tier_start_durable's), with the index and term of the state
 * it holds. */
bool kv_tier_snapshot_at(const struct kv_tier_job *j, uint64_t *index, uint64_t *term);
int kv_sm_tier_finish(struct kv_sm *sm, struct kv_tier_job *j,
                      struct kv_tier_result *out);
int kv_sm_tier_publish(struct kv_sm *sm, struct kv_tier_job *j,
                       struct kv_tier_result *out);
bool kv_sm_tier_drain(struct kv_sm *sm, size_t max_records);
/* The ring is over its budget (or tracks as many in-place rewrites as it
 * may) and no job is in flight. */
bool kv_sm_tier_wanted(const struct kv_sm *sm);
/* The ring has grown past 1.5 times its budget (writes come faster than
 * tier-downs take them): the owner should stop applying until a tier-down
 * (the one in flight, or the next, started once a drain is done) brings it
 * back, before apply reaches twice the budget and tiers down itself, inline,
 * with no job in flight. */
bool kv_sm_tier_urgent(const struct kv_sm *sm);

/* A digest of the live state (keys, values, revisions, versions, expiry, at the
 * sm's clock): equal on replicas that applied the same entries. */
int kv_sm_digest(struct kv_sm *sm, uint64_t *out);

/* The same digest in bounded steps, so that no step holds the owner's loop:
 * kv_digest_new, then kv_sm_digest_step until it returns 1 (done; 0: more,
 * or TK_EIO), then kv_digest_value and kv_digest_free. A step hashes at most
 * max_items live keys (0: no limit) and reads at most skip_max records that give
 * none (0: no budget), going on from just after the key the last step read. The
 * value equals kv_sm_digest's when the sm applied nothing between the steps:
 * the caller checks that (kv_sm_applied_index) and starts again otherwise. */
struct kv_digest;
struct kv_digest *kv_digest_new(const struct kv_sm *sm);
int kv_sm_digest_step(struct kv_sm *sm, struct kv_digest *d, size_t max_items,
                      size_t skip_max);
uint64_t kv_digest_value(const struct kv_digest *d);
void kv_digest_free(struct kv_digest *d);

struct kv_sm_stats {
    size_t ring_bytes; /* bytes of ring pages held */
    size_t ring_pages;
    size_t hot_keys;         /* keys in the index */
    uint64_t cold_keys;      /* entries in the cold tier */
    uint64_t cold_bytes;     /* bytes of the cold tier's LMDB file in use */
    uint64_t tier_downs;     /* tier-down transactions committed */
    uint64_t rewrites;       /* versions written over their key's record in place */
    uint64_t bad_records;    /* ring records that failed their check on read */
    uint64_t ttl_dropped;    /* TTL keys not tracked (kv_config.ttl_max) */
    uint64_t paced_syncs;    /* tier-down commits' fdatasyncs paced */
    uint64_t paced_slices;   /* 4 MiB slices they wrote out that had pages */
    uint64_t paced_slept_ns; /* time they slept between slices */
    /* Memory by owner, bytes (ring_bytes is the ring's). */
    size_t index_bytes;      /* the hot index's tables */
    size_t view_bytes;       /* the ordered view's nodes */
    size_t sessions_bytes;   /* the session table and its results */
    uint64_t cold_map_bytes; /* the LMDB map's size (address space) */
};
void kv_sm_stats(const struct kv_sm *sm, struct kv_sm_stats *out);
/* Bytes of the LMDB map in memory now (mincore over its used pages: O(pages),
 * call it per scrape, not per loop turn). Owner thread. */
uint64_t kv_sm_cold_resident(struct kv_sm *sm);
/* The same, in two steps, for a caller that measures on another thread: a
 * duplicate of the cold tier's data file descriptor (the caller closes it) and
 * the bytes in use (owner thread; 0 or TK_EIO); then the bytes of the file's
 * first `len` in memory (any thread: it touches no sm state; 60-80 ms of CPU
 * per GB on this VM). */
int kv_sm_cold_file(struct kv_sm *sm, int *fd, uint64_t *len);
uint64_t kv_file_resident(int fd, uint64_t len);

/* Snapshots (snapshot.c; kv_sm_snapshot in tier.c). kv_sm_snapshot flushes the ring, then
 * opens a consistent view of the cold tier at the applied index; the stream is read in
 * chunks with kv_snap_read (which may run on another thread; the sm keeps
 * applying meanwhile). Returns 0, TK_EIO. */
struct kv_snap;
int kv_sm_snapshot(struct kv_sm *sm, struct kv_snap **out);
uint64_t kv_snap_index(const struct kv_snap *s);
uint64_t kv_snap_term(const struct kv_snap *s);
/* Copies up to `cap` (> 0) bytes of the stream into buf; *len == 0 at the end.
 * Returns 0 or TK_EIO. */
int kv_snap_read(struct kv_snap *s, void *buf, size_t cap, size_t *len);
void kv_snap_close(struct kv_snap *s);
/* A snapshot of the cold tier as its last tier-down committed it (the
 * stream's header gives that index and term): a read view opened without
 * touching the ring, so tier-down jobs go on while it is read (LMDB readers
 * do not block its writer). Owner thread; then kv_snap_read_all and
 * kv_snap_close on any one thread. Returns 0, TK_EIO. */
int kv_sm_snapshot_cold(struct kv_sm *sm, struct kv_snap **out);
/* The whole stream into one blob (with one reference). `stop` (may be NULL)
 * is checked between reads of 64 KiB: once set, the read ends with
 * TK_ECLOSED; `pace` (may be NULL) is given to tk_pace_cpu between them
 * (base/sync.h: the read then takes at most 1 / (factor + 1) of a core).
 * The blob is a mapping of its own (tk_blob_map), reserved at the cold
 * tier's bytes in use when the snap was opened. Returns 0, TK_EIO,
 * TK_ECLOSED, TK_ENOMEM (the mapping could not grow past that). */
struct tk_cpu_pace;
int kv_snap_read_all(struct kv_snap *s, struct tk_blob **out, const atomic_bool *stop,
                     struct tk_cpu_pace *pace);

/* Checks a whole snapshot stream as bad input, before any install step:
 * the header, every record decoded as the install and its loaders read it
 * (a known table, bounded key and value lengths, keys in order, the layouts
 * of data, session and lease values), the trailer's record count and its
 * CRC32C over every byte before it, and nothing after it. A claimed length
 * past the stream's end is refused, never allocated. Reads only buf and the
 * sm's fixed config: any thread, no allocation. Returns 0, with the header's
 * index and term in *index and *term, or TK_ECORRUPT with what is wrong in
 * why (why_cap bytes; why may be NULL). The install runs the same checks as
 * its bytes come. */
int kv_snap_check(const struct kv_sm *sm, const void *buf, size_t len, uint64_t *index,
                  uint64_t *term, char *why, size_t why_cap);

/* Installing a snapshot stream: begin, write the stream's bytes in any pieces,
 * optionally prepare, then commit (which checks the trailer, swaps the new
 * cold tier in atomically, empties the ring and takes the snapshot's index,
 * term and clock) or abort. Until commit the sm keeps its old state, and the
 * owner may go on reading it. begin (O(1): no file is touched) and commit
 * run on the owner thread; write (the first one makes the new LMDB
 * environment), prepare (the new environment's LMDB commit and sync, the slow part of
 * a commit, then reading its sessions, TTL keys and leases back into new
 * tables, then its publication: from there the directory names the new
 * environment, and a reopen, after a crash or a stop, finds the snapshot's
 * state) and an abort after them on any one other thread if the owner
 * likes (they touch only the install, the sm's fixed config and the new
 * environment's directory); commit (the
 * in-memory swap, O(1) after a prepare: the old hot structures, tables and
 * environment go to kv_sm_install_trash)
 * needs no tier-down job in flight and no kv_snap open (it switches the cold
 * tier).
 * Returns 0, TK_ECORRUPT (bad stream),
 * TK_EIO; install_begin returns TK_EBUSY while a kv_snap of this sm is open.
 * After a failed write, prepare or commit, only abort is allowed. An abort
 * after a successful prepare (the directory already names the new state)
 * runs on the owner thread and marks the sm failed: only kv_sm_close is
 * left; the next open finds the snapshot's state. */
struct kv_install;
int kv_sm_install_begin(struct kv_sm *sm, struct kv_install **out);
int kv_install_write(struct kv_install *in, const void *buf, size_t len);
int kv_install_prepare(struct kv_install *in);
int kv_install_commit(struct kv_install *in);
void kv_install_abort(struct kv_install *in);
/* After a committed install: what it replaced, once, for the owner to free
 * off its loop with kv_trash_free (any thread): the old hot structures and
 * the old cold environment, still mapped, and its files (unmapping and
 * unlinking a big synced file take long). NULL when there is none. If never
 * taken, the next install frees it, or kv_sm_close (and then the next open
 * removes the files). Owner thread. */
struct kv_trash;
struct kv_trash *kv_sm_install_trash(struct kv_sm *sm);
/* The replaced environment's directory ("" if none); for tests. */
const char *kv_trash_path(const struct kv_trash *t);
void kv_trash_free(struct kv_trash *t);
/* Removes a cold environment directory (its data and lock files). Any
 * thread. */
void kv_remove_env(const char *path);

/* ---- events.c: the change log ----
 *
 * Applying an entry records the events it caused, derived from the records it
 * wrote: one per key written, all at the entry's index (its revision), in the
 * order written; a put, a delete (delete, delete range, a txn's or batch's
 * delete) or an expire (the expire command). They go into a ring bounded by
 * kv_config.events_max and events_bytes; the oldest go first. Every event of
 * each revision >= kv_sm_events_first() is held (revisions without events
 * included): a reader resuming there misses nothing. After open that is the
 * durable index + 1 (replay re-creates the events after it); after a snapshot
 * install, the snapshot's index + 1. Owner thread only. */
enum kv_event_type {
    KV_EVENT_PUT = 1,
    KV_EVENT_DELETE = 2,
    KV_EVENT_EXPIRE = 3,
};

/* One event. The pointers are borrowed for the callback's duration. */
struct kv_event {
    uint64_t revision;
    int type; /* enum kv_event_type */
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value; /* put: the new value; else empty */
    size_t value_len;
    uint64_t version, create_revision; /* put: the key's; else 0 */
    bool has_prev;                     /* the key was live before */
    const uint8_t *prev_value;
    size_t prev_value_len;
    uint64_t prev_version, prev_create_revision, prev_mod_revision;
    uint64_t prev_lease; /* the lease it was attached to (0: none) */
};
typedef void kv_event_cb(const struct kv_event *ev, void *data);

/* The oldest revision a reader may start from (see above). */
uint64_t kv_sm_events_first(const struct kv_sm *sm);

/* Passes every held event with revision >= from to cb, in order, a whole
 * revision at a time, stopping after the revision at which `max` (> 0) events,
 * or max_bytes (0: no bound) of keys and values, have been passed. *next is where to read
 * from next: past the last revision passed, or, when every event held was passed,
 * max(from, applied + 1) (a future `from` stays). Returns 0, or TK_ECOMPACTED when from <
 * kv_sm_events_first() (nothing is passed). */
int kv_sm_events_read(struct kv_sm *sm, uint64_t from, size_t max, size_t max_bytes,
                      kv_event_cb *cb, void *data, uint64_t *next);

/* Held now: events, their bytes, and events dropped to make room so far. */
struct kv_events_stats {
    size_t count, bytes;
    uint64_t evicted;
};
void kv_sm_events_stats(const struct kv_sm *sm, struct kv_events_stats *out);

/* ---- ttl.c: explicit expiry ----
 *
 * A key with a TTL is not deleted by time alone: reads hide it once its
 * expire time has passed (at the sm's clock), and the leader proposes an
 * expire command (kvpb.Expire) naming it, which deletes it at one revision on
 * every replica (an expire event). kv_sm_expired lists, up to `max`, keys
 * whose TTL has run out at now_ms (the leader's clock; the command then
 * applies at an entry time >= now_ms) and that are not deleted or rewritten
 * since; a key stays listed until a command removes it, so the caller keeps
 * one command in flight at a time. Returns how many were passed to cb (key
 * borrowed for the call). Owner thread only. Returns TK_EIO as a negative
 * count if the cold tier fails. */
typedef void kv_key_cb(const uint8_t *key, size_t key_len, void *data);
long kv_sm_expired(struct kv_sm *sm, uint64_t now_ms, size_t max, kv_key_cb *cb,
                   void *data);

/* ---- lease.c: leases ----
 *
 * A lease is replicated state: granted, kept alive, checkpointed and revoked
 * by commands (kvpb.LeaseGrant etc.), with keys attached by puts
 * (kvpb.Put.lease). Its record lives in the data table under the reserved
 * prefix KV_LEASE_PREFIX (so it is in tier-down, snapshots and restarts);
 * users may not write there. Time is the leader's: kv_sm_lease_due sets each
 * lease's deadline to now + the replicated remaining TTL the first time it is
 * asked after a change (or after kv_sm_lease_reset, which a new leader calls),
 * and lists those past it; the leader then proposes their revoke and,
 * periodically, a checkpoint of kv_sm_lease_list's remaining TTLs. */
#define KV_LEASE_PREFIX "\x01tierkv/lease/"
#define KV_LEASE_PREFIX_LEN 14
#define KV_LEASE_KEY_LEN (KV_LEASE_PREFIX_LEN + 16)
#define KV_LEASE_KEYS_MAX 1024             /* keys attached to one lease */
#define KV_LEASES_MAX 65536                /* leases held */
#define KV_LEASE_TTL_MAX (7ull * 86400000) /* a week */

struct kv_lease_info {
    uint64_t id, ttl_ms, remaining_ms;
    size_t n_keys;
};
size_t kv_sm_lease_count(const struct kv_sm *sm);
/* The lease the key is attached to now (0: none). Owner thread. */
uint64_t kv_sm_key_lease(struct kv_sm *sm, const void *key, size_t len);
/* Forgets every deadline (a new leader starts from the checkpoints). */
void kv_sm_lease_reset(struct kv_sm *sm);
/* Up to max ids of leases whose deadline is <= now_ms (setting unset ones),
 * with the index of their last grant or keepalive (the revoke carries it, so
 * a lease kept alive meanwhile is not revoked). */
size_t kv_sm_lease_due(struct kv_sm *sm, uint64_t now_ms, uint64_t *ids,
                       uint64_t *renewed, size_t max);
/* Up to max leases with id > after, in id order, with their remaining TTL at
 * now_ms (the deadline's, else the replicated one). */
size_t kv_sm_lease_list(const struct kv_sm *sm, uint64_t after, uint64_t now_ms,
                        uint64_t *ids, uint64_t *remaining, size_t max);
/* A lease's TTL, remaining TTL and attached keys (cb per key, may be NULL).
 * 0 or TK_ENOTFOUND. */
int kv_sm_lease_get(struct kv_sm *sm, uint64_t id, uint64_t now_ms,
                    struct kv_lease_info *out, kv_key_cb *cb, void *data);

/* Result encoding (proto kvpb.Result), for the node's forwarding path and the
 * exactly-once table. encode writes at most KV_RESULT_ENCODED_MAX bytes. */
#define KV_RESULT_ENCODED_MAX (64 + KV_TXN_OPS_MAX * 24)
size_t kv_result_encode(const struct kv_result *r, uint8_t *buf);
int kv_result_decode(const void *buf, size_t len, struct kv_result *r);

#endif
