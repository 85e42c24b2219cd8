/* Internals shared by store.c (the generic layer: queue, storage thread, group
 * commit, failed state), the backends fs.c and mem.c, and meta.c.
 *
 * Locking. s->write_mu serialises everything that changes the log: the storage
 * thread holds it for a whole group (writes and the sync), the synchronous
 * mutators for their call. Backends keep their own short lock for the index
 * that readers (read, term_at, bounds) take; the writer takes it only to
 * publish changes, never across an fdatasync. s->q_mu guards the request
 * queue. s->meta_mu guards s->meta and serialises metadata commits.
 * s->stats_mu guards only the sync latency histogram (O(1) under it). */
#ifndef TK_STORE_INTERNAL_H
#define TK_STORE_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "base/endian.h"
#include "base/hist.h"
#include "store/store.h"

/* What the metadata holds; meta.c stores it in LMDB, mem.c in the volume. */
struct store_meta_state {
    struct raft_hard_state hard_state;
    struct raft_snapshot_meta snapshot;
    struct raft_snapshot_meta pending; /* an install's, saved before it is published */
    bool has_bootstrap;
    struct raft_config bootstrap;
    uint64_t cluster_id;
    uint64_t node_id;
    bool has_incarnation; /* saved with the ids (STORE_META_IDS) */
    uint8_t incarnation[16];
    bool has_log_start;
    uint64_t log_first; /* first index of the log (entries before: gone) */
    uint64_t log_prev_term;
};

enum {
    STORE_META_HARD_STATE = 1u << 0,
    STORE_META_SNAPSHOT = 1u << 1,
    STORE_META_BOOTSTRAP = 1u << 2,
    STORE_META_IDS = 1u << 3,
    STORE_META_LOG_START = 1u << 4,
    STORE_META_PENDING = 1u << 5,
};

/* A run of consecutive entries from one append request. */
struct store__span {
    const struct raft_entry *e;
    size_t n;
};

struct store;

struct store__ops {
    /* Log mutators, called with s->write_mu held. `write` applies Raft's rule
     * (discard >= spans[0].e[0].index; the store layer has checked it is in
     * first..last+1) and appends the spans, which are consecutive; the result
     * need not be durable until `sync`. Any error fails the store. */
    int (*write)(struct store *s, const struct store__span *spans, size_t n);
    int (*sync)(struct store *s);
    /* Discards every entry with index >= `index` (first..last), durably.
     * The library never calls it: `write` applies Raft's rule itself. The
     * store tests do (tests/unit/store/store_truncate.h) to check each
     * backend's cut, which fs's `write` shares. */
    int (*truncate)(struct store *s, uint64_t index);
    int (*compact)(struct store *s, uint64_t index, uint64_t term);
    int (*reset)(struct store *s, uint64_t index, uint64_t term);
    /* Called by the writer between groups, off the latency path (fs prepares
     * the next segment file here). May be NULL. */
    void (*idle)(struct store *s);
    /* Whether `idle` has work (write_mu held; cheap): after an inline append
     * the storage thread is woken for it only then. May be NULL. */
    bool (*idle_due)(struct store *s);
    /* Readers, any thread. */
    void (*bounds)(struct store *s, uint64_t *first, uint64_t *last);
    uint64_t (*log_bytes)(struct store *s); /* see store_log_bytes */
    int (*term_at)(struct store *s, uint64_t index, uint64_t *term);
    int (*read)(struct store *s, uint64_t lo, uint64_t hi, uint64_t max_bytes,
                struct raft_entry **out, size_t *n);
    /* Metadata: commit the fields named in `mask` of `st`, durably. */
    int (*save_meta)(struct store *s, const struct store_meta_state *st, unsigned mask);
    void (*close)(struct store *s);
};

#define STORE_REQ_SPARES 32

struct store__req {
    uint64_t seq;
    void *data;
    store_append_cb *cb;
    size_t n;
    size_t cap; /* room in own[] */
    uint64_t bytes;
    int status;
    const struct raft_entry *e; /* own[] when queued (referenced copies);
                                   the caller's entries when written inline */
    struct raft_entry own[];
};

struct store {
    const struct store__ops *ops;
    void *be;
    struct store_options opts;
    uint64_t entry_bytes_max;

    atomic_int failed;
    pthread_mutex_t err_mu;
    char errmsg[STORE_ERRMSG_MAX];

    pthread_mutex_t meta_mu;
    struct store_meta_state meta;

    pthread_mutex_t write_mu;

    pthread_mutex_t q_mu;
    pthread_cond_t q_cv; /* the storage thread waits here for work */
    struct store__req **q;
    size_t q_cap, q_head, q_len;
    struct store__req *spare_reqs[STORE_REQ_SPARES]; /* written ones, for reuse */
    size_t n_spare_reqs;
    bool stopping;
    bool thread_started;
    /* The memory volume without latency: an async append with nothing queued
     * or being written completes on the caller's thread (no hand-off). */
    bool inline_sync;
    bool thread_busy;    /* the storage thread holds a group (q_mu) */
    bool sleeping;       /* the storage thread waits on q_cv (q_mu): only then
                            does a producer signal it (store_stats.wakeups) */
    size_t linger_want;  /* while lingering: signal only at this q_len (q_mu) */
    size_t last_group_n; /* requests in the last group (storage thread) */
    int linger_score;    /* >= 0: linger (storage thread; see linger()) */
    atomic_uint_fast64_t last_sync_ns; /* the last log sync took (ns) */
    bool inline_busy;                  /* a caller is writing inline (q_mu) */
    bool idle_due; /* an inline append left `idle` work for the thread (q_mu) */
    pthread_t thread;

    struct store__req **group; /* storage thread only */
    struct store__span *spans; /* storage thread only */
    size_t spans_cap;

    atomic_uint_fast64_t st_appends, st_entries, st_bytes, st_syncs, st_groups,
        st_recycled;
    atomic_uint_fast64_t st_wakeups;
    /* How long each counted sync took (ns). The writer records under
     * stats_mu, store_sync_latency copies under it; never held across I/O. */
    pthread_mutex_t stats_mu;
    struct tk_hist sync_ns;
};

/* Records an error message for store_errmsg (printf-style). Returns rc. */
int store__err(struct store *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails the store with rc (the first failure sticks; logged once): every
 * later call returns it. Returns the store's failure. */
int store__fail(struct store *s, int rc);
/* Formats into a caller buffer (open-time errors). Returns rc. */
int store__errbuf(char *buf, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Allocates a store around backend `be` (ops, options and meta already
 * filled by the caller), starts its storage thread. */
int store__start(struct store *s);
struct store *store__alloc(const struct store_options *o);
void store__free(struct store *s);
void store__fill_boot(struct store *s, struct store_boot *boot);

/* meta.c: the LMDB environment. */
struct store_meta;
int store_meta_open(const char *path, struct store_meta **out,
                    struct store_meta_state *st, char *err, size_t err_len);
int store_meta_save(struct store_meta *m, const struct store_meta_state *st,
                    unsigned mask, char *err, size_t err_len);
void store_meta_close(struct store_meta *m);

#endif
