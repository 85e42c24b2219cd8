/* The state machine's private state and the functions its files share: sm.c
 * (open, apply dispatch), cmd.c (the commands), state.c (a key's state),
 * sessions.c (the exactly-once table), iter.c (the read iterator, declared in
 * iter.h), tier.c (tier-down), snapshot.c and codec.c. Owner thread only,
 * except where a function says otherwise. */
#ifndef TK_KV_SM_INTERNAL_H
#define TK_KV_SM_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "kv/kv_internal.h"

struct Kvpb__Command;
struct Kvpb__Put;
struct Kvpb__Delete;

struct kv_arena_chunk {
    struct kv_arena_chunk *next;
    size_t cap, used;
    _Alignas(16) uint8_t data[];
};

/* protobuf-c decodes into this; reset before each command. */
struct kv_arena {
    struct kv_arena_chunk *head;
    size_t n_chunks;
    size_t total;
};

#define KV_SESS_INLINE 8 /* bytes: results this short live in their entry */
struct kv_sess {
    uint64_t client; /* 0: empty slot */
    uint64_t seq;
    uint64_t index;
    uint32_t len;
    union {                         /* the encoded kv_result: sess_res() */
        uint8_t *res;               /* len > KV_SESS_INLINE: allocated */
        uint8_t in[KV_SESS_INLINE]; /* else here (a put's, below index 2^35) */
    } r;
};

struct kv_sess_id {
    uint64_t client, seq;
};

/* (client, seq) -> result; at most `max`, the oldest forgotten first. */
struct kv_sessions {
    struct kv_sess *tab;
    size_t mask;
    size_t count, max;
    struct kv_sess_id *fifo; /* circular, insertion (= index) order */
    size_t fifo_head, fifo_len;
    size_t res_bytes; /* the results held, for kv_sm_stats */
};

/* One held event's header (events.c), at the start of its bytes in the
 * events' buf: the lengths, then the revisions its flags name (w), then key
 * || value || prev value; the whole padded to 8 bytes, so every header is
 * aligned. A put over a live key stores 3 revisions, not 5: its previous
 * version is its version - 1 and its previous create revision its own,
 * unless a flag says the word is there. */
#define KV_EV_LIVE 1u         /* w: version, create_rev */
#define KV_EV_PREV 2u         /* w: prev_mod_rev */
#define KV_EV_PREV_VERSION 4u /* w: prev_version (else version - 1) */
#define KV_EV_PREV_CREATE 8u  /* w: prev_create_rev (else create_rev) */
#define KV_EV_PREV_LEASE 16u  /* w: prev_lease (else 0) */
struct kv_ev {
    uint32_t value_len, prev_len;
    uint16_t key_len;
    uint8_t type;
    uint8_t flags; /* KV_EV_*: which words follow, in that order */
    uint64_t w[];  /* 8-aligned: the header's fixed part is 16 bytes */
};

/* Where a held event lies: its revision (the readers' seek) and the offset
 * of its header in buf. */
struct kv_ev_slot {
    uint64_t rev;
    size_t off;
};

/* The change log: a circular array of at most max slots, and the events
 * themselves (header and data) in buf, a byte ring of max_bytes in the
 * events' order, each event in one piece (an event that does not fit before
 * the end starts again at 0): recording one is a copy into buf and a slot,
 * no allocation. bytes counts the ring's bytes in use: the held events and
 * the ends they skipped when they wrapped. */
struct kv_events {
    struct kv_ev_slot *slot;
    size_t max, head, n; /* slot[head .. head + n) mod max, oldest first */
    size_t bytes, max_bytes;
    uint8_t *buf;     /* max_bytes, or NULL when max or max_bytes is 0 */
    size_t wpos;      /* where the next event would go */
    uint64_t first;   /* every event of each revision >= first is held */
    uint64_t evicted; /* events dropped to make room */
};

/* A key with a TTL (ttl.c): a min-heap on expire_ms, entries checked
 * against the key's state when they come up (stale ones are dropped). */
struct kv_ttl_ent {
    uint64_t expire_ms;
    uint8_t *key;
    size_t key_len;
};
struct kv_ttl {
    struct kv_ttl_ent *h;
    size_t n, cap, max;
    uint64_t dropped;
};

/* Leases (lease.c): an attached key, in the key -> lease table and in its
 * lease's list. */
struct kv_lkey {
    struct kv_lkey *next;
    uint64_t hash, lease;
    uint16_t len;
    uint8_t key[];
};
struct kv_lease {
    uint64_t id, ttl_ms, remaining_ms;
    uint64_t renewed;  /* the index of the last grant or keepalive */
    uint64_t deadline; /* the leader's clock; 0: not set since the last change */
    struct kv_lkey **keys;
    size_t n_keys, cap_keys;
};
struct kv_leases {
    struct kv_lease **v; /* sorted by id */
    size_t n, cap;
    struct kv_lkey **tab; /* chained, mask + 1 heads */
    size_t mask, count;
};

struct kv_tier_ent {
    const struct kv_rec *h;
    uint64_t addr; /* | TIER_WRITTEN once chosen for LMDB */
};

/* A record tier-down writes, to sort by key: the key's first 8 bytes
 * big-endian (zero-padded), its length and the record's place in tier_ents
 * (which is the order its versions were written in). */
struct kv_tier_key {
    uint64_t prefix;
    uint32_t ent;
    uint32_t key_len;
};

/* A record of a page tier-down releases: its index entry goes if it still
 * points here. */
struct kv_tier_rel {
    const struct kv_rec *h;
    uint64_t addr;
    uint64_t hash;
};

struct kv_sm {
    struct kv_config cfg;
    char *dir;
    struct kv_ring ring;
    struct kv_index index;
    struct kv_view view;
    struct kv_cold *cold;
    struct kv_trash *trash; /* an install's replaced hot state, not yet taken */
    struct kv_sessions sessions;
    struct kv_arena arena;
    ProtobufCAllocator pa;
    uint64_t applied, applied_term, now_ms;
    uint64_t durable, durable_term, durable_now;
    bool failed;
    atomic_int open_snaps; /* kv_snap views open on the cold tier */
    uint64_t tier_downs, bad_records, rewrites;
    uint64_t paced_syncs, paced_slices, paced_slept_ns; /* struct tk_pace's, summed */
    /* What the next tier-down writes: the records in pages at or past
     * dirty_pos (appended since the last one began) and the records
     * rewritten in place before that (inplace, their addresses). Every record
     * in either has mod_rev > durable (or > the job's index while a job is in
     * flight); every other record is in the cold tier already. */
    uint64_t dirty_pos;
    uint64_t *inplace;
    size_t n_inplace, cap_inplace, max_inplace;
    uint64_t *inplace_spare; /* the last job's array, for the next pick */
    size_t cap_inplace_spare;
    struct kv_tier_ent *tier_ents; /* tier-down: the records it writes */
    size_t n_tier_ents, cap_tier_ents;
    struct kv_tier_key *tier_keys; /* tier-down: its records by key; 2 *
                                      cap_tier_keys (the sort's spare half) */
    size_t cap_tier_keys;
    struct kv_tier_rel *tier_rel; /* tier-down: the records it releases */
    size_t n_tier_rel, cap_tier_rel;
    /* A published tier-down whose released pages are still in the ring
     * (kv_sm_tier_drain): tier_rel[drain_at, n_tier_rel) still to drop, then
     * drain_pages pages (every page before drain_end) to release. */
    bool draining;
    size_t drain_at, drain_pages;
    uint64_t drain_end;
    struct kv_tier_job *job; /* the tier-down in flight, if any */
    struct kv_events events; /* the change log (events.c) */
    struct kv_ttl ttl;       /* keys with a TTL (ttl.c) */
    struct kv_leases leases; /* leases (lease.c) */
    bool expiring;           /* applying an expire command: deletions are
                                expire events */
    uint8_t *scratch;        /* delete-range key list */
    size_t scratch_cap;
};

/* A tier-down is a checkpoint of the ring into the cold tier at the applied
 * index, then the release of the oldest pages (tier.c). It runs in three
 * steps, whatever triggered it. pick (owner thread) seals the tail, takes the
 * records rewritten in place since the last tier-down and chooses the pages
 * to release; write (any thread) copies the newest version of each key
 * changed since the last tier-down (the in-place records and the pages past
 * dirty_pos) to LMDB in one transaction with the applied index, and notes the
 * records of the pages to release; finish (owner thread) publishes the
 * commit, drops the index entries into those pages and releases them.
 * Between pick and finish the job's pages are sealed and stay in memory, and
 * apply rewrites none of the records the job reads (kv__state_rewrite_ok), so
 * reads keep finding them in the ring while LMDB changes underneath the
 * owner's old read view. At most one tier-down is in flight: it owns
 * tier_ents, tier_keys and tier_rel. */
struct kv_tier_job {
    struct kv_sm *sm;
    struct kv_page **pages; /* the ring at pick, oldest first */
    size_t n_pages;
    size_t n_rel;     /* pages[0, n_rel) are released */
    uint64_t rel_end; /* the pos after them */
    uint64_t w_from;  /* pages at or past this pos hold changed records */
    size_t n_keys;    /* tier_keys[0, n_keys): the records written */
    /* The records rewritten in place since the last job (sm->inplace at the
     * pick: addresses in pages[], which apply does not rewrite again while
     * the job is in flight: kv__state_rewrite_ok), checked and collected on
     * the job's thread, not the loop (up to ring_bytes / 256 of them). */
    uint64_t *inplace;
    size_t n_inplace, cap_inplace;
    bool snapshot;
    bool no_read; /* kv_sm_tier_start_durable's: a snapshot without its stream */
    bool write;   /* pick found something to write or release */
    struct kv_cold_meta meta;
    uint64_t bad; /* records that failed their check */
    int rc;
    struct tk_blob *stream; /* snapshot: the stream of the committed state */
    struct kv_cold_meta stream_meta;
    bool paced;        /* kv_tier_run_paced: the commit's writeback paced */
    atomic_bool hurry; /* kv_sm_tier_hurry: stop pacing */
    struct tk_pace pace;
    uint64_t read_cpu_ns, read_slept_ns; /* the snapshot read's (read_pace) */
};

/* Makes room for one more element in *arr (n held, *cap allocated, elem
 * bytes each): doubles the capacity, starting at `first`. */
static inline void *kv__grow(void *arr, size_t n, size_t *cap, size_t first, size_t elem)
{
    if (n < *cap)
        return arr;
    *cap = *cap ? *cap * 2 : first;
    return tk_realloc(arr, *cap * elem);
}

/* The tier-down's scratch arrays live in mappings of their own, never in
 * malloc's heaps: freeing one gives its memory back at once (munmap). Before,
 * they were freed into the heaps and malloc_trim(0) gave them back; it walks
 * every heap holding its lock, and took up to 118 ms of the loop at 400k keys
 * (issue 22). kv__scratch_grow is kv__grow for them (doubling; mremap moves
 * the pages, it does not copy them); bytes for kv__scratch_free is the
 * array's capacity in bytes. */
static inline void *kv__scratch_grow(void *arr, size_t n, size_t *cap, size_t first,
                                     size_t elem)
{
    if (n < *cap)
        return arr;
    size_t old = kv__map_round(*cap * elem);
    size_t ncap = *cap ? *cap * 2 : first;
    size_t bytes = kv__map_round(ncap * elem);
    void *p = arr != NULL ? mremap(arr, old, bytes, MREMAP_MAYMOVE)
                          : mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "tierkv: out of memory mapping %zu bytes\n", bytes);
        abort();
    }
    *cap = ncap;
    return p;
}

static inline void kv__scratch_free(void *arr, size_t bytes)
{
    if (arr != NULL)
        (void)munmap(arr, kv__map_round(bytes));
}

/* A record expiring at expire_ms (0: never) is live at the sm's clock. */
static inline bool kv__live(const struct kv_sm *sm, uint64_t expire_ms)
{
    return expire_ms == 0 || expire_ms > sm->now_ms;
}

/* ---- state.c: a key's state ---- */

/* A key's current state, as kv__state_lookup finds it. The value pointer stays
 * valid until the next tier-down (ring pages and the cold read view live until
 * then). */
struct kv_state {
    bool live;     /* present and not expired */
    bool hot;      /* the ring has its newest record */
    uint64_t addr; /* hot: that record's address */
    const uint8_t *value;
    size_t value_len;
    uint64_t expire_ms, create_rev, mod_rev, version;
};

/* Writes a key's new state at `index`: its ring record (rewritten in place
 * when it may be), index and view; no change-log event (the callers write
 * that first: cmd.c's write_key, lease.c). */
void kv__state_write(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                     uint64_t hash, const struct kv_state *st);
/* The current state of a key (ignoring a command's staged writes). Returns 0
 * or TK_EIO. */
int kv__state_lookup(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                     struct kv_state *st);
/* May the key's newest record, hot at addr, be rewritten in place by a new
 * version with a value of value_len bytes? If true, the caller does so now
 * (kv__ring_rewrite); the next tier-down writes it. */
bool kv__state_rewrite_ok(struct kv_sm *sm, uint64_t addr, size_t value_len);

/* The state of a key as its newest record says, expired or not (live is
 * then true for a present key whose TTL has run out). 0 or TK_EIO. */
int kv__state_lookup_raw(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                         struct kv_state *st);

/* ---- events.c: the change log ---- */

void kv__events_init(struct kv_events *e, size_t max, size_t max_bytes, uint64_t first);
void kv__events_free(struct kv_events *e);
/* Forgets every event: the next one held is at `first` or later (install). */
void kv__events_reset(struct kv_events *e, uint64_t first);
/* Apply is about to write key's new state st at revision index (cmd.c,
 * before the write, so the key's current state is its previous one): records
 * the event and tracks a TTL. */
void kv__events_write(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                      uint64_t hash, const struct kv_state *st);
/* kv__events_write with the key's current state, expired or not, already
 * looked up (kv__state_lookup_raw): prev. */
void kv__events_write_prev(struct kv_sm *sm, uint64_t index, const uint8_t *key,
                           size_t len, const struct kv_state *st,
                           const struct kv_state *prev);

/* ---- ttl.c: keys with a TTL ---- */

void kv__ttl_init(struct kv_ttl *t, size_t max);
void kv__ttl_free(struct kv_ttl *t);
/* Tracks key as expiring at expire_ms (> 0). */
void kv__ttl_push(struct kv_ttl *t, const uint8_t *key, size_t len, uint64_t expire_ms);
/* Forgets every key, then tracks the cold tier's (open, install). 0 or TK_EIO. */
int kv__ttl_load(struct kv_sm *sm);
/* Tracks one key of the cold tier's; data is the struct kv_ttl. A
 * kv_cold_exp_cb: returns 0. */
int kv__ttl_load_one(uint64_t expire_ms, const uint8_t *key, size_t len, void *data);

/* ---- lease.c: leases ---- */

void kv__lease_init(struct kv_leases *t);
void kv__lease_free(struct kv_leases *t);
/* The key is under the reserved lease prefix (no user may write it). */
bool kv__lease_reserved(const uint8_t *key, size_t len);
struct kv_lease *kv__lease_find(const struct kv_leases *t, uint64_t id);
/* May a put attach a key to lease (0: none)? 0, TK_ENOTFOUND, TK_ETOOBIG. */
int kv__lease_check_put(const struct kv_sm *sm, uint64_t lease);
/* The key's slot in the key -> lease table: the link that points at its
 * entry, or the chain's end (*slot NULL) when it is attached to none. Inline
 * here, with kv__lease_of, so that events.c (which lease.c calls) reads a
 * key's lease without calling lease.c back. */
static inline struct kv_lkey **kv__lkey_slot(struct kv_leases *t, const uint8_t *key,
                                             size_t len, uint64_t hash)
{
    struct kv_lkey **pp = &t->tab[hash & t->mask];
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->hash == hash && (*pp)->len == len && memcmp((*pp)->key, key, len) == 0)
            return pp;
    return pp;
}

/* The lease the key is attached to (0: none). */
static inline uint64_t kv__lease_of(struct kv_sm *sm, const uint8_t *key, size_t len,
                                    uint64_t hash)
{
    struct kv_leases *t = &sm->leases;
    if (t->count == 0)
        return 0;
    struct kv_lkey *k = *kv__lkey_slot(t, key, len, hash);
    return k != NULL ? k->lease : 0;
}
/* The key was just written at index: attaches it to lease (0: detaches it),
 * rewriting the records of the leases that change. 0 or TK_EIO. */
int kv__lease_attach(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                     uint64_t hash, uint64_t lease);
/* The lease commands: fill res (code for a refused one). 0 or TK_EIO. */
int kv__lease_grant(struct kv_sm *sm, uint64_t index, uint64_t id, uint64_t ttl_ms,
                    struct kv_result *res);
int kv__lease_keepalive(struct kv_sm *sm, uint64_t index, uint64_t id,
                        struct kv_result *res);
/* An expired revoke is refused (TK_ECOMPARE) unless renewed is the lease's. */
int kv__lease_revoke(struct kv_sm *sm, uint64_t index, uint64_t id, bool expired,
                     uint64_t renewed, struct kv_result *res);
int kv__lease_checkpoint(struct kv_sm *sm, uint64_t index, const uint64_t *ids,
                         const uint64_t *remaining, size_t n, struct kv_result *res);
/* Rebuilds the table from the lease records (open, install). 0, TK_EIO,
 * TK_ECORRUPT. */
int kv__lease_load(struct kv_sm *sm);
/* Adds the lease of one record (key under KV_LEASE_PREFIX, its value) to t.
 * 0 or TK_ECORRUPT (the reason logged): the record fails
 * kv__lease_check_rec, or its id is in t already, or t is full. */
int kv__lease_load_rec(struct kv_leases *t, const uint8_t *key, size_t key_len,
                       const uint8_t *v, size_t value_len);
/* Checks one lease record (lease.c's top: 0x01 and a kvpb.LeaseRecord, or
 * the "L1" layout): the key's hex id, the value's layout and
 * the limits (TTL, keys per lease). 0, or TK_ECORRUPT with what is wrong in
 * why (why_cap bytes; why may be NULL). Any thread: it touches no table. */
int kv__lease_check_rec(const uint8_t *key, size_t key_len, const uint8_t *v,
                        size_t value_len, char *why, size_t why_cap);

/* ---- cmd.c: the commands ---- */

/* Applies a decoded command at `index`, filling res: a retried (client, seq)
 * is answered from the exactly-once table, anything else runs and, with a
 * client id, has its result remembered. Returns 0 (res->code holds the
 * command's outcome) or TK_EIO. */
int kv__cmd_apply(struct kv_sm *sm, uint64_t index, const struct Kvpb__Command *c,
                  struct kv_result *res);

/* ---- codec.c ---- */

/* Decodes the common commands (a plain put or delete) without protobuf-c,
 * pointing into buf; false means "let protobuf-c decode it". Whatever it
 * accepts, protobuf-c decodes to the same fields (a unit test checks). */
bool kv__fast_decode(const uint8_t *buf, size_t len, struct Kvpb__Command *c,
                     struct Kvpb__Put *put, struct Kvpb__Delete *del);

/* ---- snapshot.c ---- */

/* Opens a snapshot view of the cold tier as committed (kv_sm_snapshot flushes
 * first). Returns 0 or TK_EIO. */
int kv__snap_open(struct kv_sm *sm, struct kv_snap **out);
/* Any thread, while the sm's tier job is in flight (so no other writer): reads
 * the snapshot stream of the cold tier as committed into one blob, its CPU
 * paced with `pace` (may be NULL). Returns 0 or TK_EIO. */
int kv__snap_read_all(struct kv_sm *sm, struct tk_blob **out, struct kv_cold_meta *meta,
                      struct tk_cpu_pace *pace);

/* ---- sessions.c: the exactly-once table ---- */

void kv__sess_init(struct kv_sessions *t, size_t max);
void kv__sess_destroy(struct kv_sessions *t);
/* Forgets every remembered result (before a snapshot's are loaded). */
void kv__sess_clear(struct kv_sessions *t);
/* Adds one remembered result (recovery, snapshot install); data is the
 * struct kv_sessions.
 * A kv_cold_session_cb: returns 0, or TK_ECORRUPT for a bad record. */
int kv__sess_load(uint64_t index, uint64_t client, uint64_t seq, const uint8_t *res,
                  size_t len, void *data);
/* If (client, seq) has a remembered result, fills res with it (duplicate =
 * true) and returns true. client != 0. */
bool kv__sess_answer(struct kv_sm *sm, uint64_t client, uint64_t seq,
                     struct kv_result *res);
/* Remembers res for (client, seq) applied at index: in the table, and as a
 * session record appended to the ring (so tier-down makes it durable). */
void kv__sess_record(struct kv_sm *sm, uint64_t index, uint64_t client, uint64_t seq,
                     const struct kv_result *res);

/* Loads what the cold tier keeps beside the keys: the remembered results
 * (into sm->sessions), the TTLs and the leases. For an open, and for an
 * install whose prepare did not load them. 0, or the first error. */
static inline int kv__tables_load(struct kv_sm *sm)
{
    int rc = kv__cold_sessions(sm->cold, kv__sess_load, &sm->sessions);
    if (rc == 0)
        rc = kv__ttl_load(sm);
    if (rc == 0)
        rc = kv__lease_load(sm);
    return rc;
}

#endif
