/* The state machine's face: config, open/close, the counters, and apply,
 * which decodes each entry's command and dispatches it.
 *
 * apply() decodes a kvpb.Command (the fast decoder for a plain put or delete,
 * else protobuf-c into a reusable arena, so steady state allocates nothing),
 * hands it to cmd.c, which evaluates it against the current state and appends
 * the resulting records to the ring in one go, then advances the applied index
 * and, over budget, triggers a tier-down (tier.c). Every record written by
 * entry i has revision i. Owner thread only.
 *
 * Calls run one way: sm.c -> cmd.c -> state.c, sessions.c, iter.c; sm.c ->
 * tier.c -> snapshot.c -> sessions.c; all of them -> the ring, index, view and
 * cold tier (cold.c, the only file that sees LMDB). */
#include <fcntl.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "kv/sm_internal.h"

#define ARENA_CHUNK (64 * 1024)
#define ARENA_KEEP_MAX (16u << 20)

void kv_config_default(struct kv_config *c)
{
    memset(c, 0, sizeof(*c));
    c->page_bytes = 256 * 1024;
    c->ring_bytes = 64u << 20;
    c->key_max = 4096;
    c->value_max = 1u << 20;
    c->sessions_max = 65536;
    c->map_bytes = (size_t)64 << 30;
    c->events_max = 65536;
    c->events_bytes = 16u << 20;
    c->ttl_max = 1u << 20;
    c->writeback_pace = 3;
    c->read_pace = 3;
}

/* ---- decode arena ---- */

static void *arena_alloc(void *data, size_t size)
{
    struct kv_arena *a = data;
    size = (size + 15) & ~(size_t)15;
    struct kv_arena_chunk *ch = a->head;
    if (ch == NULL || ch->cap - ch->used < size) {
        size_t cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
        ch = tk_malloc(sizeof(*ch) + cap);
        ch->cap = cap;
        ch->used = 0;
        ch->next = a->head;
        a->head = ch;
        a->n_chunks++;
    }
    void *p = ch->data + ch->used;
    ch->used += size;
    a->total += size;
    return p;
}

static void arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr;
}

static void arena_reset(struct kv_arena *a)
{
    if (a->n_chunks > 1) {
        /* Keep one chunk large enough for what this command needed. */
        size_t want = a->total < ARENA_KEEP_MAX ? a->total : ARENA_CHUNK;
        while (a->head != NULL) {
            struct kv_arena_chunk *next = a->head->next;
            tk_free(a->head);
            a->head = next;
        }
        a->n_chunks = 0;
        if (want < ARENA_CHUNK)
            want = ARENA_CHUNK;
        struct kv_arena_chunk *ch = tk_malloc(sizeof(*ch) + want);
        ch->cap = want;
        ch->next = NULL;
        a->head = ch;
        a->n_chunks = 1;
    }
    if (a->head != NULL)
        a->head->used = 0;
    a->total = 0;
}

static void arena_destroy(struct kv_arena *a)
{
    while (a->head != NULL) {
        struct kv_arena_chunk *next = a->head->next;
        tk_free(a->head);
        a->head = next;
    }
}

/* ---- open / close ---- */

int kv_sm_open(const struct kv_config *c, struct kv_sm **out)
{
    if (c->dir == NULL || c->page_bytes < 4096 || c->page_bytes > (64u << 20) ||
        c->ring_bytes < c->page_bytes || c->key_max == 0 || c->key_max > 65535 ||
        c->value_max > (64u << 20) || c->map_bytes < (1u << 20))
        return TK_EINVAL;
    struct kv_sm *sm = tk_calloc(1, sizeof(*sm));
    sm->cfg = *c;
    sm->cfg.dir = NULL;
    sm->dir = tk_strdup(c->dir);
    int rc = kv__cold_open(sm->dir, c->map_bytes, c->no_sync, &sm->cold);
    if (rc != 0)
        goto err_free;
    struct kv_cold_meta m;
    rc = kv__cold_meta(sm->cold, &m);
    if (rc != 0)
        goto err_cold;
    kv__ring_init(&sm->ring, c->page_bytes);
    sm->ring.keep_free_bytes = c->ring_bytes;
    kv__index_init(&sm->index, &sm->ring);
    kv__view_init(&sm->view);
    kv__sess_init(&sm->sessions, c->sessions_max);
    sm->max_inplace = c->ring_bytes / 256 > 1024 ? c->ring_bytes / 256 : 1024;
    sm->applied = sm->durable = m.index;
    sm->applied_term = m.term;
    sm->now_ms = m.now_ms;
    sm->pa.alloc = arena_alloc;
    sm->pa.free = arena_free;
    sm->pa.allocator_data = &sm->arena;
    kv__events_init(&sm->events, c->events_max, c->events_bytes, m.index + 1);
    kv__ttl_init(&sm->ttl, c->ttl_max);
    kv__lease_init(&sm->leases);
    rc = kv__tables_load(sm);
    if (rc != 0) {
        kv_sm_close(sm);
        return rc;
    }
    *out = sm;
    return 0;
err_cold:
    kv__cold_close(sm->cold);
err_free:
    tk_free(sm->dir);
    tk_free(sm);
    return rc;
}

void kv_sm_close(struct kv_sm *sm)
{
    if (sm == NULL)
        return;
    kv__cold_close(sm->cold);
    kv_trash_free(sm->trash);
    kv__view_free(&sm->view);
    kv__index_free(&sm->index);
    kv__ring_free(&sm->ring);
    kv__sess_destroy(&sm->sessions);
    arena_destroy(&sm->arena);
    kv__events_free(&sm->events);
    kv__ttl_free(&sm->ttl);
    kv__lease_free(&sm->leases);
    tk_free(sm->scratch);
    TK_ASSERT(sm->job == NULL);
    kv__scratch_free(sm->tier_ents, sm->cap_tier_ents * sizeof(*sm->tier_ents));
    kv__scratch_free(sm->tier_keys, 2 * sm->cap_tier_keys * sizeof(*sm->tier_keys));
    kv__scratch_free(sm->tier_rel, sm->cap_tier_rel * sizeof(*sm->tier_rel));
    tk_free(sm->inplace);
    tk_free(sm->inplace_spare);
    tk_free(sm->dir);
    tk_free(sm);
}

uint64_t kv_sm_applied_index(const struct kv_sm *sm)
{
    return sm->applied;
}
uint64_t kv_sm_applied_term(const struct kv_sm *sm)
{
    return sm->applied_term;
}
uint64_t kv_sm_durable_index(const struct kv_sm *sm)
{
    return sm->durable;
}

void kv_sm_stats(const struct kv_sm *sm, struct kv_sm_stats *out)
{
    out->ring_bytes = sm->ring.bytes;
    out->ring_pages = sm->ring.n_pages;
    out->hot_keys = kv__index_count(&sm->index);
    out->cold_keys = kv__cold_count(sm->cold);
    out->cold_bytes = kv__cold_bytes(sm->cold);
    out->tier_downs = sm->tier_downs;
    out->paced_syncs = sm->paced_syncs;
    out->paced_slices = sm->paced_slices;
    out->paced_slept_ns = sm->paced_slept_ns;
    out->rewrites = sm->rewrites;
    out->bad_records = sm->bad_records;
    out->ttl_dropped = sm->ttl.dropped;
    out->index_bytes = kv__index_bytes(&sm->index);
    out->view_bytes = kv__view_bytes(&sm->view);
    const struct kv_sessions *t = &sm->sessions;
    out->sessions_bytes = (t->mask + 1) * sizeof(*t->tab) +
                          (t->max > 0 ? t->max : 1) * sizeof(*t->fifo) + t->res_bytes;
    out->cold_map_bytes = kv__cold_map_bytes(sm->cold);
}

uint64_t kv_sm_cold_bytes(const struct kv_sm *sm)
{
    return kv__cold_bytes(sm->cold);
}

uint64_t kv_sm_cold_resident(struct kv_sm *sm)
{
    return kv__cold_resident(sm->cold);
}

int kv_sm_cold_file(struct kv_sm *sm, int *fd, uint64_t *len)
{
    int own;
    if (kv__cold_file(sm->cold, &own, len) != 0)
        return TK_EIO;
    *fd = fcntl(own, F_DUPFD_CLOEXEC, 0);
    return *fd >= 0 ? 0 : TK_EIO;
}

/* ---- apply ---- */

static int advance(struct kv_sm *sm, uint64_t index, uint64_t time_ms)
{
    if (sm->failed)
        return TK_EIO;
    if (index != sm->applied + 1)
        return TK_EINVAL;
    if (time_ms > sm->now_ms)
        sm->now_ms = time_ms;
    return 0;
}

int kv_sm_skip(struct kv_sm *sm, uint64_t index, uint64_t term, uint64_t time_ms)
{
    int rc = advance(sm, index, time_ms);
    if (rc != 0)
        return rc;
    sm->applied = index;
    sm->applied_term = term;
    return 0;
}

bool kv_sm_prefetch(const struct kv_sm *sm, const void *cmd, size_t cmd_len,
                    uint64_t *hash)
{
    Kvpb__Command fc;
    Kvpb__Put fput;
    Kvpb__Delete fdel;
    if (cmd == NULL || !kv__fast_decode(cmd, cmd_len, &fc, &fput, &fdel))
        return false;
    const ProtobufCBinaryData *k = fc.cmd_case == KVPB__COMMAND__CMD_PUT   ? &fc.put->key
                                   : fc.cmd_case == KVPB__COMMAND__CMD_DEL ? &fc.del->key
                                                                           : NULL;
    if (k == NULL || k->len == 0)
        return false;
    *hash = kv__hash(k->data, k->len);
    kv__index_prefetch(&sm->index, *hash);
    return true;
}

void kv_sm_prefetch_record(const struct kv_sm *sm, uint64_t hash)
{
    (void)kv__index_peek(&sm->index, hash); /* starts loading the record */
}

int kv_sm_apply(struct kv_sm *sm, uint64_t index, uint64_t term, uint64_t time_ms,
                const void *cmd, size_t cmd_len, struct kv_result *res)
{
    int rc = advance(sm, index, time_ms);
    if (rc != 0)
        return rc;
    res->code = 0;
    res->revision = 0;
    res->succeeded = false;
    res->duplicate = false;
    res->value = 0;
    res->deleted = 0;
    res->n_ops = 0;
    Kvpb__Command fc;
    Kvpb__Put fput;
    Kvpb__Delete fdel;
    Kvpb__Command *c = &fc;
    if (!kv__fast_decode(cmd, cmd_len, &fc, &fput, &fdel)) {
        arena_reset(&sm->arena);
        c = kvpb__command__unpack(&sm->pa, cmd_len, cmd);
    }
    if (c == NULL) {
        res->code = TK_EINVAL;
    } else {
        rc = kv__cmd_apply(sm, index, c, res);
    }
    sm->applied = index;
    sm->applied_term = term;
    if (rc != 0) { /* the cold tier failed under a read */
        sm->failed = true;
        return TK_EIO;
    }
    /* Over budget (or no room to track one more record rewritten in place):
     * tier down now, unless the owner does it in the background (then only
     * past twice the budget, and never while a job is in flight). */
    size_t limit = sm->cfg.background_tier ? 2 * sm->cfg.ring_bytes : sm->cfg.ring_bytes;
    if ((sm->ring.bytes > limit ||
         (!sm->cfg.background_tier && sm->n_inplace == sm->max_inplace)) &&
        sm->job == NULL)
        return kv_sm_tier_down(sm);
    return 0;
}
