/* The state machine's private state, shared by sm.c (apply, reads, tier-down),
 * cmd.c (the commands) and snapshot.c. Owner thread only. */
#ifndef TK_KV_SM_INTERNAL_H
#define TK_KV_SM_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>

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

struct kv_sess {
    uint64_t client; /* 0: empty slot */
    uint64_t seq;
    uint64_t index;
    uint32_t len;
    uint8_t *res; /* encoded kv_result */
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
    struct kv_sessions sessions;
    struct kv_arena arena;
    ProtobufCAllocator pa;
    uint64_t applied, applied_term, now_ms;
    uint64_t durable, durable_term, durable_now;
    bool failed;
    atomic_int open_snaps; /* kv_snap views open on the cold tier */
    uint64_t tier_downs, bad_records, rewrites;
    /* What the next tier-down writes: the records in pages at or past
     * dirty_pos (appended since the last one began) and the records
     * rewritten in place before that (inplace, their addresses). Every record
     * in either has mod_rev > durable (or > the job's index while a job is in
     * flight); every other record is in the cold tier already. */
    uint64_t dirty_pos;
    uint64_t *inplace;
    size_t n_inplace, cap_inplace, max_inplace;
    struct kv_tier_ent *tier_ents; /* tier-down: the records it writes */
    size_t n_tier_ents, cap_tier_ents;
    struct kv_tier_key *tier_keys; /* tier-down: its records by key; 2 *
                                      cap_tier_keys (the sort's spare half) */
    size_t cap_tier_keys;
    struct kv_tier_rel *tier_rel; /* tier-down: the records it releases */
    size_t n_tier_rel, cap_tier_rel;
    struct kv_tier_job *job; /* the tier-down in flight, if any */
    uint8_t *scratch;        /* delete-range key list */
    size_t scratch_cap;
};

/* A key's current state, as kv__sm_lookup finds it. The value pointer stays
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

int kv__sm_lookup(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                  struct kv_state *st);
/* May the key's newest record, hot at addr, be rewritten in place by a new
 * version with a value of value_len bytes? If true, the caller does so now
 * (kv__ring_rewrite); the next tier-down writes it. */
bool kv__sm_rewrite_ok(struct kv_sm *sm, uint64_t addr, size_t value_len);
/* Runs a decoded command at `index`, filling res. Returns 0 (res->code holds
 * the command's outcome) or TK_EIO. */
int kv__sm_exec(struct kv_sm *sm, uint64_t index, const struct Kvpb__Command *c,
                struct kv_result *res);

/* Decodes the common commands (a plain put or delete) without protobuf-c,
 * pointing into buf; false means "let protobuf-c decode it". Whatever it
 * accepts, protobuf-c decodes to the same fields (a unit test checks). */
bool kv__fast_decode(const uint8_t *buf, size_t len, struct Kvpb__Command *c,
                     struct Kvpb__Put *put, struct Kvpb__Delete *del);

/* Any thread, while the sm's tier job is in flight (so no other writer): reads
 * the snapshot stream of the cold tier as committed into one buffer. Returns 0
 * or TK_EIO. */
int kv__snap_read_all(struct kv_sm *sm, uint8_t **buf, size_t *len,
                      struct kv_cold_meta *meta);

/* Adds one remembered result (recovery, snapshot install); data is the sm. */
int kv__sm_load_session(uint64_t index, uint64_t client, uint64_t seq, const uint8_t *res,
                        size_t len, void *data);

#endif
