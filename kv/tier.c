/* Tier-down: every way the ring's changes reach the cold tier, on one path.
 *
 * A tier-down is a checkpoint of the ring into the cold tier at the applied
 * index, then the release of the oldest pages. It runs in three steps (see
 * struct kv_tier_job): begin (owner thread) picks what to write and release,
 * run (any thread) writes it to LMDB in one transaction, finish (owner
 * thread) publishes it and releases the pages. The entry points are triggers
 * over that one path and differ only in when they run and what they release:
 * kv_sm_flush (all pages, run at once), kv_sm_tier_down (the oldest pages until
 * the ring is under 3/4 of its budget, run at once; apply calls it over
 * budget), kv_sm_tier_start/kv_tier_run/kv_sm_tier_finish (the same pages, run
 * on another thread, optionally followed by reading a snapshot stream into a
 * blob there; kv_sm_tier_publish + kv_sm_tier_drain split the finish so that
 * the owner drops the released index entries a bounded slice at a time), and
 * kv_sm_snapshot (a flush, then a snapshot view). It cuts only between
 * commands, so the index stored with the data is exactly the state after that
 * entry, and the clock stored is the clock after it. Called by sm.c (apply)
 * and the node; calls snapshot.c (the stream), the ring, index, view and cold
 * tier. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#endif

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/log.h"
#include "kv/sm_internal.h"

/* Walks a page's records; stops at a record whose sizes leave the page. */
static const struct kv_rec *page_rec(const struct kv_page *p, size_t off)
{
    if (off + sizeof(struct kv_rec) > p->used)
        return NULL;
    const struct kv_rec *h = (const struct kv_rec *)(const void *)(p->data + off);
    if (off + kv__rec_size(h->key_len, h->value_len) > p->used)
        return NULL;
    return h;
}

#define TIER_WRITTEN (UINT64_C(1) << 63)
/* Key order is random ring order: the LMDB writes prefetch the tier_ents slot
 * of the key 2 * TIER_AHEAD on, then the record of the key TIER_AHEAD on. */
#define TIER_AHEAD 8

/* The tier-down's scratch arrays (tier_ents, tier_keys, tier_rel) grow to
 * the records of the largest tier-down; past TIER_SCRATCH_KEEP records they
 * are freed once done with (kv_tier_run, tier_release), so that one big
 * tier-down (a delete of a million keys: 80 MiB of them) does not keep its
 * scratch for the node's lifetime (they are mappings of their own, so the
 * memory goes back at once: kv__scratch_grow). Regrowing costs the next big
 * one a few mremaps, small beside its LMDB writes. */
#define TIER_SCRATCH_KEEP ((size_t)1 << 16)

/* Free ring pages given back per drain call (each an madvise: see
 * kv__ring_forget_step): 4 per loop turn return 1 MiB per turn. */
#define RING_FORGET_STEP 4

static void tier_push(struct kv_sm *sm, const struct kv_rec *h, uint64_t addr)
{
    sm->tier_ents = kv__scratch_grow(sm->tier_ents, sm->n_tier_ents, &sm->cap_tier_ents,
                                     4096, sizeof(*sm->tier_ents));
    sm->tier_ents[sm->n_tier_ents++] = (struct kv_tier_ent){h, addr};
}

static void tier_push_rel(struct kv_sm *sm, const struct kv_rec *h, uint64_t addr)
{
    sm->tier_rel = kv__scratch_grow(sm->tier_rel, sm->n_tier_rel, &sm->cap_tier_rel, 4096,
                                    sizeof(*sm->tier_rel));
    sm->tier_rel[sm->n_tier_rel++] =
        (struct kv_tier_rel){h, addr, kv__hash(kv__rec_key(h), h->key_len)};
}

/* Takes the ring as it is: seals the tail, moves the in-place records into
 * tier_ents (checked here, where the ring's slot table may be read) and
 * chooses the pages to release (all of them, or the oldest until the ring
 * would be under 3/4 of its budget). False when there is nothing to do: no
 * page to release and the cold tier at the applied index already. */
static bool tier_pick(struct kv_sm *sm, bool all, struct kv_tier_job *j)
{
    kv__ring_seal(&sm->ring);
    size_t target = all ? 0 : sm->cfg.ring_bytes / 4 * 3;
    size_t freed = 0, n_rel = 0;
    for (struct kv_page *p = sm->ring.head; p != NULL && sm->ring.bytes - freed > target;
         p = p->next) {
        freed += p->cap;
        n_rel++;
    }
    bool changed = sm->n_inplace > 0 || sm->ring.next_pos > sm->dirty_pos;
    if (n_rel == 0 && !changed && sm->applied == sm->durable)
        return false; /* the cold tier is the state already */
    j->sm = sm;
    j->n_pages = sm->ring.n_pages;
    j->pages = tk_malloc((j->n_pages + 1) * sizeof(*j->pages));
    j->n_rel = n_rel;
    j->rel_end = 0;
    size_t i = 0;
    for (struct kv_page *p = sm->ring.head; p != NULL; p = p->next, i++) {
        j->pages[i] = p;
        if (i < n_rel)
            j->rel_end = p->pos + p->cap;
    }
    j->w_from = sm->dirty_pos;
    sm->dirty_pos = sm->ring.next_pos;
    sm->n_tier_ents = 0;
    sm->n_tier_rel = 0;
    /* The in-place records go to the job as they are (O(1)): it checks and
     * collects them; the spare array takes their place. */
    j->inplace = sm->inplace;
    j->n_inplace = sm->n_inplace;
    j->cap_inplace = sm->cap_inplace;
    sm->inplace = sm->inplace_spare;
    sm->cap_inplace = sm->cap_inplace_spare;
    sm->inplace_spare = NULL;
    sm->cap_inplace_spare = 0;
    sm->n_inplace = 0;
    j->meta = (struct kv_cold_meta){
        .index = sm->applied, .term = sm->applied_term, .now_ms = sm->now_ms};
    return true;
}

static bool tier_key_eq(const struct kv_tier_ent *ents, const struct kv_tier_key *x,
                        const struct kv_tier_key *y)
{
    if (x->prefix != y->prefix || x->key_len != y->key_len)
        return false;
    return x->key_len <= 8 || memcmp(kv__rec_key(ents[x->ent].h),
                                     kv__rec_key(ents[y->ent].h), x->key_len) == 0;
}

/* Key byte order, then the order of tier_ents. */
static int tier_key_cmp(const void *a, const void *b, void *data)
{
    const struct kv_tier_key *x = a, *y = b;
    if (x->prefix != y->prefix)
        return x->prefix < y->prefix ? -1 : 1;
    const struct kv_tier_ent *ents = data;
    const struct kv_rec *hx = ents[x->ent].h, *hy = ents[y->ent].h;
    int c = kv__keycmp(kv__rec_key(hx), hx->key_len, kv__rec_key(hy), hy->key_len);
    if (c != 0)
        return c;
    return x->ent < y->ent ? -1 : x->ent > y->ent;
}

/* Chooses what tier-down writes: the newest record of each key in tier_ents
 * (which holds the in-place records first, then the changed pages' records in
 * log order, so a key's newest record comes last: a record is rewritten in
 * place only while it is its key's newest, and a later version of the key
 * appended after it is later in the log). Sorts the records by key, then
 * tier_ents order, keeps the last of each key's run in tier_keys, marks it
 * TIER_WRITTEN and returns how many. Session records are all marked and left
 * out (they are written in log order). Sorting finds each key's newest record
 * without a hash table over the pages, and LMDB takes keys in order about 6x
 * faster than in the random order random writes leave in the log (its cursor
 * stays on the leaf the next key belongs to). The sort: an LSD radix sort on
 * the first 8 bytes (stable, so equal keys keep their order; bytes all keys
 * share are skipped), then a comparison sort of each run of equal first bytes
 * unless its keys are equal and at most 8 bytes long. */
static size_t tier_sort(struct kv_sm *sm)
{
    const struct kv_tier_ent *ents = sm->tier_ents;
    if (sm->n_tier_ents == 0)
        return 0;
    if (sm->cap_tier_keys < sm->n_tier_ents) {
        kv__scratch_free(sm->tier_keys, 2 * sm->cap_tier_keys * sizeof(*sm->tier_keys));
        sm->tier_keys = NULL;
        size_t none = 0; /* a fresh mapping of 2 * cap_tier_ents keys */
        sm->tier_keys = kv__scratch_grow(NULL, 0, &none, 2 * sm->cap_tier_ents,
                                         sizeof(*sm->tier_keys));
        sm->cap_tier_keys = sm->cap_tier_ents;
    }
    struct kv_tier_key *a = sm->tier_keys, *b = sm->tier_keys + sm->cap_tier_keys;
    size_t n = 0;
    for (size_t k = 0; k < sm->n_tier_ents; k++) {
        struct kv_tier_ent *e = &sm->tier_ents[k];
        if (e->h->flags & KV_REC_SESSION) {
            e->addr |= TIER_WRITTEN;
            continue;
        }
        uint8_t p8[8] = {0};
        memcpy(p8, kv__rec_key(e->h), e->h->key_len < 8 ? e->h->key_len : 8);
        uint64_t be;
        memcpy(&be, p8, 8);
        a[n++] = (struct kv_tier_key){__builtin_bswap64(be), (uint32_t)k, e->h->key_len};
    }
    for (int shift = 0; shift < 64 && n > 0; shift += 8) {
        size_t count[256] = {0};
        for (size_t i = 0; i < n; i++)
            count[(a[i].prefix >> shift) & 0xff]++;
        if (count[(a[0].prefix >> shift) & 0xff] == n)
            continue; /* every key has this byte */
        size_t at = 0;
        for (int d = 0; d < 256; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            b[count[(a[i].prefix >> shift) & 0xff]++] = a[i];
        struct kv_tier_key *t = a;
        a = b;
        b = t;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        bool same = true;
        while (j < n && a[j].prefix == a[i].prefix) {
            same = same && a[j].key_len == a[i].key_len && a[j].key_len <= 8;
            j++;
        }
        if (!same)
            qsort_r(a + i, j - i, sizeof(*a), tier_key_cmp, sm->tier_ents);
        for (size_t k = i; k < j; k++)
            if (k + 1 == j || !tier_key_eq(ents, &a[k], &a[k + 1])) {
                sm->tier_ents[a[k].ent].addr |= TIER_WRITTEN;
                sm->tier_keys[kept++] = a[k]; /* kept <= k: a[k] is read first */
            }
        i = j;
    }
    return kept;
}

/* Any thread: the records rewritten in place since the last job, into
 * tier_ents (before the pages' records: a key appended since is newer). Each
 * address names a page of the job's by its slot; the ring's own slot table
 * is the loop's. */
static void tier_collect_inplace(struct kv_tier_job *j)
{
    struct kv_sm *sm = j->sm;
    if (j->n_inplace == 0)
        return;
    size_t n_slots = 0;
    for (size_t i = 0; i < j->n_pages; i++)
        if (j->pages[i]->slot + 1 > n_slots)
            n_slots = j->pages[i]->slot + 1;
    struct kv_page **by_slot = tk_calloc(n_slots, sizeof(*by_slot));
    for (size_t i = 0; i < j->n_pages; i++)
        by_slot[j->pages[i]->slot] = j->pages[i];
    for (size_t k = 0; k < j->n_inplace; k++) {
        uint64_t addr = j->inplace[k];
        uint64_t slot = addr >> KV_ADDR_OFF_BITS;
        size_t off = addr & ((1u << KV_ADDR_OFF_BITS) - 1);
        struct kv_page *p = slot < n_slots ? by_slot[slot] : NULL;
        if (p != NULL && kv__page_check(p, off))
            tier_push(sm, (const struct kv_rec *)(const void *)(p->data + off), addr);
        else
            j->bad++;
    }
    tk_free(by_slot);
}

/* Any thread: touches only the job's sealed pages, tier_ents, tier_keys,
 * tier_rel and the cold tier's write transaction. */
static int tier_write(struct kv_tier_job *j)
{
    struct kv_sm *sm = j->sm;
    if (sm->cap_tier_rel > TIER_SCRATCH_KEEP) {
        /* The last drain's, freed here rather than on the loop. */
        kv__scratch_free(sm->tier_rel, sm->cap_tier_rel * sizeof(*sm->tier_rel));
        sm->tier_rel = NULL;
        sm->cap_tier_rel = 0;
    }
    tier_collect_inplace(j);
    /* Collect the sound records: the changed pages' for writing, the released
     * pages' for index removal, noting damaged released pages (their keys
     * cannot be trusted for index removal later). */
    for (size_t i = 0; i < j->n_pages; i++) {
        struct kv_page *p = j->pages[i];
        bool rel = i < j->n_rel, w = p->pos >= j->w_from;
        if (!rel && !w)
            continue;
        if (rel)
            p->damaged = false;
        size_t off = 0;
        for (;;) {
            const struct kv_rec *h = page_rec(p, off);
            if (h == NULL)
                break;
            if (kv__page_check(p, off)) {
                uint64_t addr = kv__ring_addr(p, off);
                if (w)
                    tier_push(sm, h, addr);
                if (rel && !(h->flags & KV_REC_SESSION))
                    tier_push_rel(sm, h, addr);
            } else {
                j->bad++;
                p->damaged = p->damaged || rel;
            }
            off += kv__rec_size(h->key_len, h->value_len);
        }
        if (off != p->used)
            p->damaged = p->damaged || rel;
    }
    size_t n_keys = tier_sort(sm);
    j->n_keys = n_keys;
    int rc = kv__cold_wbegin(sm->cold);
    if (rc != 0)
        return rc;
    for (size_t k = 0; k < sm->n_tier_ents && rc == 0; k++) {
        const struct kv_tier_ent *e = &sm->tier_ents[k];
        if ((e->addr & TIER_WRITTEN) && (e->h->flags & KV_REC_SESSION))
            rc = kv__cold_wsession(sm->cold, e->h);
    }
    for (size_t k = 0; k < n_keys && rc == 0; k++) {
        if (k + 2 * TIER_AHEAD < n_keys)
            __builtin_prefetch(&sm->tier_ents[sm->tier_keys[k + 2 * TIER_AHEAD].ent]);
        if (k + TIER_AHEAD < n_keys)
            __builtin_prefetch(sm->tier_ents[sm->tier_keys[k + TIER_AHEAD].ent].h);
        rc = kv__cold_wput(sm->cold, sm->tier_ents[sm->tier_keys[k].ent].h);
    }
    if (rc != 0) {
        kv__cold_wabort(sm->cold);
        return rc;
    }
    j->pace.factor = sm->cfg.writeback_pace;
    j->pace.hurry = &j->hurry;
    return kv__cold_wcommit(sm->cold, &j->meta, sm->cfg.sessions_max,
                            j->paced ? &j->pace : NULL);
}

/* Owner thread: publishes a committed write (the cold tier's new read view
 * and the durable index, O(1)); the released pages' index entries and the
 * pages themselves go later, in kv_sm_tier_drain. */
static void tier_publish(struct kv_sm *sm, struct kv_tier_job *j)
{
    sm->bad_records += j->bad;
    sm->paced_syncs += j->pace.syncs;
    sm->paced_slices += j->pace.slices;
    sm->paced_slept_ns += j->pace.slept_ns;
    if (j->rc == 0) {
        kv__cold_wpublish(sm->cold);
        sm->draining = true;
        sm->drain_at = 0;
        sm->drain_pages = j->n_rel;
        sm->drain_end = j->rel_end;
        sm->durable = j->meta.index;
        sm->durable_term = j->meta.term;
        sm->durable_now = j->meta.now_ms;
        sm->tier_downs++;
    } else {
        sm->failed = true;
        sm->n_tier_rel = 0;
    }
    sm->n_tier_ents = 0;
    tk_free(j->pages);
    j->pages = NULL;
}

/* Releases the drained pages: every page before drain_end, oldest first. */
static void tier_release(struct kv_sm *sm)
{
    for (size_t i = 0; i < sm->drain_pages; i++) {
        struct kv_page *p = sm->ring.head;
        TK_ASSERT(p != NULL);
        TK_ASSERT(p->pos + p->cap <= sm->drain_end);
        if (p->damaged) {
            tk_logf(TK_LOG_ERROR, 0, 0, NULL, "kv: damaged ring page released");
            kv__index_purge_slot(&sm->index, p->slot);
        }
        kv__ring_release_head(&sm->ring);
    }
    sm->drain_pages = 0;
    sm->drain_end = 0;
    sm->n_tier_rel = 0;
    sm->drain_at = 0;
    sm->draining = false;
}

bool kv_sm_tier_drain(struct kv_sm *sm, size_t max_records)
{
    (void)kv__ring_forget_step(&sm->ring, RING_FORGET_STEP);
    if (!sm->draining)
        return true;
    /* A released record's entry goes if the index still points at it:
     * matched by hash and address alone (no record read), with each bucket
     * prefetched a few records ahead. Apply may have moved the key on (a new
     * record elsewhere: the entry stays) but never rewrote the record in
     * place (kv__state_rewrite_ok), so what LMDB holds for it is its value. */
    const struct kv_tier_rel *r = sm->tier_rel;
    size_t end = sm->n_tier_rel;
    if (end - sm->drain_at > max_records)
        end = sm->drain_at + max_records;
    for (size_t k = sm->drain_at; k < end; k++) {
        if (k + TIER_AHEAD < end)
            kv__index_prefetch(&sm->index, r[k + TIER_AHEAD].hash);
        if (kv__index_remove_if(&sm->index, r[k].hash, r[k].addr))
            kv__view_remove(&sm->view, kv__rec_key(r[k].h), r[k].h->key_len);
    }
    sm->drain_at = end;
    if (end < sm->n_tier_rel)
        return false;
    tier_release(sm);
    return true;
}

/* The one path's first step (owner thread): picks the pages and records of
 * a tier-down and marks it in flight. *out is NULL when there is nothing to
 * do. A snapshot job always goes ahead: with nothing to write, its stream is
 * the cold tier as it is. */
static int tier_begin(struct kv_sm *sm, bool all, bool snapshot, struct kv_tier_job **out)
{
    *out = NULL;
    if (sm->failed)
        return TK_EIO;
    if (sm->job != NULL)
        return TK_EBUSY;
    (void)kv_sm_tier_drain(sm, SIZE_MAX); /* tier_pick reuses tier_rel */
    struct kv_tier_job *j = tk_calloc(1, sizeof(*j));
    j->snapshot = snapshot;
    j->write = tier_pick(sm, all, j);
    if (!j->write) {
        if (!snapshot) {
            tk_free(j);
            return 0;
        }
        j->sm = sm;
        j->meta = (struct kv_cold_meta){
            .index = sm->durable, .term = sm->durable_term, .now_ms = sm->durable_now};
    }
    sm->job = j;
    *out = j;
    return 0;
}

/* The job's thread, once the write is done with tier_ents and tier_keys:
 * frees big ones there (unmapping megabytes on the loop, with the TLB
 * shootdowns for the pool thread's CPU, took milliseconds of a turn). */
static void tier_scratch_trim(struct kv_sm *sm)
{
    if (sm->cap_tier_ents <= TIER_SCRATCH_KEEP && sm->cap_tier_keys <= TIER_SCRATCH_KEEP)
        return;
    kv__scratch_free(sm->tier_ents, sm->cap_tier_ents * sizeof(*sm->tier_ents));
    kv__scratch_free(sm->tier_keys, 2 * sm->cap_tier_keys * sizeof(*sm->tier_keys));
    sm->tier_ents = NULL;
    sm->tier_keys = NULL;
    sm->n_tier_ents = 0;
    sm->cap_tier_ents = sm->cap_tier_keys = 0;
}

void kv_tier_run(struct kv_tier_job *j)
{
    if (j->write) {
        j->rc = tier_write(j);
        tier_scratch_trim(j->sm);
    }
    if (j->rc == 0 && j->snapshot && !j->no_read) {
        struct tk_cpu_pace pace = {.factor = j->paced ? j->sm->cfg.read_pace : 0,
                                   .hurry = &j->hurry};
        j->rc = kv__snap_read_all(j->sm, &j->stream, &j->stream_meta, &pace);
        j->read_cpu_ns = pace.cpu_ns;
        j->read_slept_ns = pace.slept_ns;
    }
}

void kv_tier_run_paced(struct kv_tier_job *j)
{
    j->paced = true;
    kv_tier_run(j);
    j->paced = false;
}

void kv_sm_tier_hurry(struct kv_sm *sm)
{
    if (sm->job != NULL)
        atomic_store_explicit(&sm->job->hurry, true, memory_order_relaxed);
}

bool kv_tier_snapshot_at(const struct kv_tier_job *j, uint64_t *index, uint64_t *term)
{
    if (j->rc != 0 || !j->snapshot || (j->stream == NULL && !j->no_read))
        return false;
    const struct kv_cold_meta *m = j->no_read ? &j->meta : &j->stream_meta;
    *index = m->index;
    *term = m->term;
    return true;
}

int kv_sm_tier_publish(struct kv_sm *sm, struct kv_tier_job *j,
                       struct kv_tier_result *out)
{
    TK_ASSERT(sm->job == j);
    int wrc = j->rc;
    if (j->write)
        tier_publish(sm, j);
    else if (wrc != 0)
        sm->failed = true;
    sm->job = NULL;
    tk_free(sm->inplace_spare); /* NULL: the pick took it */
    sm->inplace_spare = j->inplace;
    sm->cap_inplace_spare = j->cap_inplace;
    memset(out, 0, sizeof(*out));
    out->paced_slices = j->pace.slices;
    out->paced_write_ns = j->pace.write_ns;
    out->paced_slept_ns = j->pace.slept_ns;
    out->read_cpu_ns = j->read_cpu_ns;
    out->read_slept_ns = j->read_slept_ns;
    if (wrc == 0 && j->snapshot) {
        const struct kv_cold_meta *m = j->no_read ? &j->meta : &j->stream_meta;
        out->index = m->index;
        out->term = m->term;
        out->stream = j->stream;
        j->stream = NULL;
    }
    tk_blob_unref(j->stream);
    tk_free(j);
    return wrc != 0 ? TK_EIO : 0;
}

int kv_sm_tier_finish(struct kv_sm *sm, struct kv_tier_job *j, struct kv_tier_result *out)
{
    int rc = kv_sm_tier_publish(sm, j, out);
    (void)kv_sm_tier_drain(sm, SIZE_MAX);
    return rc;
}

/* The whole path at once, on the owner thread. */
static int tier_now(struct kv_sm *sm, bool all)
{
    struct kv_tier_job *j;
    int rc = tier_begin(sm, all, false, &j);
    if (rc != 0 || j == NULL)
        return rc;
    kv_tier_run(j);
    struct kv_tier_result res;
    return kv_sm_tier_finish(sm, j, &res);
}

/* ---- the triggers ---- */

int kv_sm_flush(struct kv_sm *sm)
{
    return tier_now(sm, true);
}

int kv_sm_tier_down(struct kv_sm *sm)
{
    return tier_now(sm, false);
}

int kv_sm_tier_start(struct kv_sm *sm, bool snapshot, struct kv_tier_job **out)
{
    /* A snapshot needs the cold tier at the applied index, which every job
     * gives; the ring keeps its pages as for a plain job, so the hot keys stay
     * hot. */
    return tier_begin(sm, false, snapshot, out);
}

int kv_sm_tier_start_durable(struct kv_sm *sm, struct kv_tier_job **out)
{
    int rc = tier_begin(sm, false, true, out);
    if (rc == 0)
        (*out)->no_read = true;
    return rc;
}

int kv_sm_snapshot(struct kv_sm *sm, struct kv_snap **out)
{
    int rc = kv_sm_flush(sm);
    if (rc != 0)
        return rc;
    return kv__snap_open(sm, out);
}

bool kv_sm_tier_wanted(const struct kv_sm *sm)
{
    return sm->job == NULL && !sm->draining && !sm->failed &&
           (sm->ring.bytes > sm->cfg.ring_bytes || sm->n_inplace == sm->max_inplace);
}

bool kv_sm_tier_urgent(const struct kv_sm *sm)
{
    return sm->ring.bytes > sm->cfg.ring_bytes + sm->cfg.ring_bytes / 2;
}
