/* The read iterator (see iter.h) and the reads built on it: scans and the
 * digest.
 *
 * The merge: at each step the smaller of the hot key (the view's, at the
 * iterator's position) and the cold key (the cursor's) is read; on a tie the
 * hot record decides and both sides move. The cold tier stores keys longer
 * than KV_COLD_SHORT_MAX under a prefix and a hash, so such keys can come out
 * of the cursor out of byte order: the cold side skips (rather than stops at)
 * a long key outside the range, and asks the index whether a long key it
 * reads has a hot copy, which is the newer. Owner thread only. Called by the
 * node (scan, digest) and cmd.c (delete range); calls the view, index, ring
 * and cold tier. */
#include <string.h>
#include <xxhash.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "kv/iter.h"

static inline bool in_range(const struct kv_range *r, const uint8_t *key, size_t len)
{
    if (r->by_prefix)
        return len >= r->start_len &&
               (r->start_len == 0 || memcmp(key, r->start, r->start_len) == 0);
    if (r->end_len == 0)
        return true;
    return kv__keycmp(key, len, r->end, r->end_len) < 0;
}

static void item_from_cold(struct kv_item *it, const uint8_t *k, size_t klen,
                           const struct kv_cold_val *cv)
{
    it->key = k;
    it->key_len = klen;
    it->value = cv->value;
    it->value_len = cv->value_len;
    it->create_revision = cv->create_rev;
    it->mod_revision = cv->mod_rev;
    it->version = cv->version;
    it->expire_ms = cv->expire_ms;
    it->hot = false;
}

static void item_from_rec(struct kv_item *it, const struct kv_rec *h)
{
    it->key = kv__rec_key(h);
    it->key_len = h->key_len;
    it->value = kv__rec_value(h);
    it->value_len = h->value_len;
    it->create_revision = h->create_rev;
    it->mod_revision = h->mod_rev;
    it->version = h->version;
    it->expire_ms = h->expire_ms;
    it->hot = true;
}

/* ---- the hot side: the view's keys in order, read ahead ---- */

/* Moves the look-ahead up to position `want` (or the end). */
static void hot_fill(struct kv_iter *it, size_t want)
{
    while (it->ahead_pos < want && kv__view_it_valid(&it->ahead)) {
        size_t len;
        const uint8_t *k = kv__view_it_key(&it->ahead, &len);
        uint64_t hash = kv__hash(k, len);
        it->hash[it->ahead_pos % KV_ITER_RING] = hash;
        it->cand[it->ahead_pos % KV_ITER_RING] = KV_ADDR_NONE;
        kv__index_prefetch(&it->sm->index, hash);
        kv__view_it_next(&it->ahead);
        it->ahead_pos++;
    }
}

static size_t hot_want(const struct kv_iter *it)
{
    size_t ahead = KV_ITER_AHEAD;
    if (it->limit != 0 && it->limit - it->emitted < ahead)
        ahead = it->limit - it->emitted;
    return it->pos + (ahead > 0 ? ahead : 1);
}

/* The first few keys have had no time to load: their buckets' misses are
 * taken together (after the cold seek, which overlaps them) rather than one
 * after another. */
static void hot_peek_first(struct kv_iter *it)
{
    for (size_t p = 0; p <= KV_ITER_AHEAD_REC && p < it->ahead_pos; p++)
        it->cand[p % KV_ITER_RING] =
            kv__index_peek(&it->sm->index, it->hash[p % KV_ITER_RING]);
}

static void hot_next(struct kv_iter *it)
{
    kv__view_it_next(&it->hot);
    it->pos++;
    hot_fill(it, hot_want(it));
    size_t p = it->pos + KV_ITER_AHEAD_REC;
    if (p < it->ahead_pos)
        it->cand[p % KV_ITER_RING] =
            kv__index_peek(&it->sm->index, it->hash[p % KV_ITER_RING]);
}

/* The index entry of the key at the current position (see kv__index_peek:
 * the index does not change while the iterator is open). */
static uint64_t hot_find(const struct kv_iter *it, const uint8_t *key, size_t len,
                         bool *found)
{
    TK_ASSERT(it->pos < it->ahead_pos);
    uint64_t cand = it->cand[it->pos % KV_ITER_RING];
    if (cand != KV_ADDR_NONE && kv__index_key_is(&it->sm->index, cand, key, len)) {
        *found = true;
        return cand;
    }
    return kv__index_find(&it->sm->index, it->hash[it->pos % KV_ITER_RING], key, len,
                          found);
}

/* ---- the merge ---- */

/* The hot key (hk) is the smaller, or equal to the cold key (cv != NULL). */
static inline int step_hot(struct kv_iter *it, const uint8_t *hk, size_t hklen,
                           const uint8_t *ck, size_t cklen, const struct kv_cold_val *cv,
                           struct kv_item *out)
{
    struct kv_sm *sm = it->sm;
    if (!in_range(it->r, hk, hklen))
        return TK_ENOTFOUND;
    it->seen = hk;
    it->seen_len = hklen;
    it->hot_owed = true;
    it->cold_owed = cv != NULL;
    bool found;
    uint64_t addr = hot_find(it, hk, hklen, &found);
    if (found && kv__ring_check(&sm->ring, addr)) {
        const struct kv_rec *h = kv__ring_at(&sm->ring, addr);
        if ((h->flags & KV_REC_TOMB) || !kv__live(sm, h->expire_ms))
            return 1;
        item_from_rec(out, h);
        return 0;
    }
    /* A damaged hot record: the cold copy, if any, stands. */
    if (found)
        sm->bad_records++;
    if (cv == NULL || !kv__live(sm, cv->expire_ms))
        return 1;
    item_from_cold(out, ck, cklen, cv);
    return 0;
}

/* The cold key is the smaller (or the hot side is done). */
static int step_cold(struct kv_iter *it, const uint8_t *ck, size_t cklen,
                     const struct kv_cold_val *cv, struct kv_item *out)
{
    struct kv_sm *sm = it->sm;
    const struct kv_range *r = it->r;
    bool is_long = cklen > KV_COLD_SHORT_MAX;
    if (!in_range(r, ck, cklen) && !is_long)
        return TK_ENOTFOUND;
    it->cold_owed = true;
    if (!in_range(r, ck, cklen))
        return 1; /* long keys sharing a prefix are in hash order: skip, not stop */
    if (!is_long) {
        it->seen = ck;
        it->seen_len = cklen;
    }
    bool below = kv__keycmp(ck, cklen, r->start, r->start_len) < 0;
    if (!below && is_long) {
        /* Out of byte order, the merge cannot see a hot copy of a long key:
         * ask the index, whose version is the newer. */
        bool found;
        kv__index_find(&sm->index, kv__hash(ck, cklen), ck, cklen, &found);
        below = found;
    }
    if (below || !kv__live(sm, cv->expire_ms))
        return 1;
    item_from_cold(out, ck, cklen, cv);
    return 0;
}

/* One merge step: 0 with *out filled, 1 when the keys read gave no item (go
 * on), or TK_ENOTFOUND at the end. It owes the moves past what it read. */
static inline int iter_step(struct kv_iter *it, struct kv_item *out)
{
    const uint8_t *ck = NULL;
    size_t cklen = 0;
    struct kv_cold_val cv;
    if (it->cvalid)
        kv__cold_cur_get(it->cur, &ck, &cklen, &cv);
    bool hvalid = kv__view_it_valid(&it->hot);
    size_t hklen = 0;
    const uint8_t *hk = hvalid ? kv__view_it_key(&it->hot, &hklen) : NULL;
    int cmp;
    if (hvalid && it->cvalid)
        cmp = kv__keycmp(hk, hklen, ck, cklen);
    else if (hvalid)
        cmp = -1;
    else if (it->cvalid)
        cmp = 1;
    else
        return TK_ENOTFOUND;
    if (cmp <= 0)
        return step_hot(it, hk, hklen, ck, cklen, cmp == 0 ? &cv : NULL, out);
    return step_cold(it, ck, cklen, &cv, out);
}

/* kv__iter_next, inlined into the scan's loop: per item, the scan pays no
 * call but its callback. */
static inline int iter_next(struct kv_iter *it, struct kv_item *out)
{
    for (;;) {
        /* Move past the keys last read only now, so the item returned last
         * stayed valid until this call. */
        if (it->hot_owed) {
            it->hot_owed = false;
            hot_next(it);
        }
        if (it->cold_owed) {
            it->cold_owed = false;
            int rc = kv__cold_cur_next(it->cur, &it->cvalid);
            if (rc != 0)
                return rc;
        }
        if (it->limit != 0 && it->emitted >= it->limit)
            return TK_ENOTFOUND;
        int rc = iter_step(it, out);
        if (rc == 0)
            it->emitted++;
        if (rc != 1)
            return rc;
        if (it->skip_max != 0 && ++it->skipped >= it->skip_max && it->seen != NULL)
            return TK_EBUSY;
    }
}

int kv__iter_next(struct kv_iter *it, struct kv_item *out)
{
    return iter_next(it, out);
}

int kv__iter_first(struct kv_iter *it, struct kv_sm *sm, const struct kv_range *r,
                   size_t limit, struct kv_item *out)
{
    return kv__iter_first_skip(it, sm, r, limit, 0, out);
}

int kv__iter_first_skip(struct kv_iter *it, struct kv_sm *sm, const struct kv_range *r,
                        size_t limit, size_t skip_max, struct kv_item *out)
{
    it->sm = sm;
    it->r = r;
    it->limit = limit;
    it->emitted = 0;
    it->cur = NULL;
    it->cvalid = false;
    it->hot_owed = it->cold_owed = false;
    it->skip_max = skip_max;
    it->skipped = 0;
    it->seen = NULL;
    it->seen_len = 0;
    kv__view_seek(&sm->view, r->start, r->start_len, &it->hot);
    it->ahead = it->hot;
    it->pos = it->ahead_pos = 0;
    hot_fill(it, hot_want(it));
    if (kv__cold_count(sm->cold) > 0) {
        int rc = kv__cold_cur_open(sm->cold, &it->cur);
        if (rc == 0)
            rc = kv__cold_cur_seek(it->cur, r->start, r->start_len, &it->cvalid);
        if (rc != 0)
            return rc;
    }
    hot_peek_first(it);
    return kv__iter_next(it, out);
}

void kv__iter_close(struct kv_iter *it)
{
    kv__cold_cur_close(it->cur);
    it->cur = NULL;
}

/* ---- reads on the iterator ---- */

int kv_sm_scan(struct kv_sm *sm, const struct kv_range *r, size_t limit, kv_item_cb *cb,
               void *data)
{
    return kv_sm_scan_bounded(sm, r, limit, 0, cb, data, NULL);
}

int kv_sm_scan_bounded(struct kv_sm *sm, const struct kv_range *r, size_t limit,
                       size_t skip_max, kv_item_cb *cb, void *data,
                       struct kv_scan_stop *stop)
{
    struct kv_iter it;
    struct kv_item item;
    int rc;
    for (rc = kv__iter_first_skip(&it, sm, r, limit, skip_max, &item); rc == 0;
         rc = iter_next(&it, &item))
        if (cb(&item, data) != 0)
            break;
    if (stop != NULL) {
        stop->stopped = rc == TK_EBUSY;
        stop->key_len = 0;
        if (stop->stopped && it.seen_len <= stop->cap) {
            memcpy(stop->key, it.seen, it.seen_len);
            stop->key_len = it.seen_len;
        }
    }
    kv__iter_close(&it);
    return rc == TK_ENOTFOUND || rc == TK_EBUSY ? 0 : rc;
}

static void digest_item(XXH3_state_t *st, const struct kv_item *item)
{
    uint64_t hdr[6] = {item->key_len,      item->value_len, item->create_revision,
                       item->mod_revision, item->version,   item->expire_ms};
    XXH3_64bits_update(st, hdr, sizeof(hdr));
    XXH3_64bits_update(st, item->key, item->key_len);
    XXH3_64bits_update(st, item->value, item->value_len);
}

int kv_sm_digest(struct kv_sm *sm, uint64_t *out)
{
    XXH3_state_t *st = XXH3_createState();
    TK_ASSERT(st != NULL);
    XXH3_64bits_reset(st);
    struct kv_range all = {0};
    struct kv_iter it;
    struct kv_item item;
    int rc;
    for (rc = kv__iter_first(&it, sm, &all, 0, &item); rc == 0;
         rc = kv__iter_next(&it, &item))
        digest_item(st, &item);
    kv__iter_close(&it);
    *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc == TK_ENOTFOUND ? 0 : rc;
}

/* ---- the digest in steps ---- */

struct kv_digest {
    XXH3_state_t *st;
    uint8_t *from; /* the next step's start: the key read last and a 0 byte */
    size_t from_len;
    /* The last item's key, kept apart from `from`, which is the range the
     * step's scan is reading (the merge compares cold keys with its start). */
    uint8_t *last;
    size_t last_len;
    uint8_t *stop_key;
    size_t cap; /* the sm's key_max */
    size_t items;
    bool done;
};

struct kv_digest *kv_digest_new(const struct kv_sm *sm)
{
    struct kv_digest *d = tk_calloc(1, sizeof(*d));
    d->st = XXH3_createState();
    TK_ASSERT(d->st != NULL);
    XXH3_64bits_reset(d->st);
    d->cap = sm->cfg.key_max;
    d->from = tk_malloc(d->cap + 1);
    d->last = tk_malloc(d->cap);
    d->stop_key = tk_malloc(d->cap);
    return d;
}

void kv_digest_free(struct kv_digest *d)
{
    if (d == NULL)
        return;
    XXH3_freeState(d->st);
    tk_free(d->from);
    tk_free(d->last);
    tk_free(d->stop_key);
    tk_free(d);
}

uint64_t kv_digest_value(const struct kv_digest *d)
{
    return XXH3_64bits_digest(d->st);
}

static int digest_step_cb(const struct kv_item *item, void *data)
{
    struct kv_digest *d = data;
    digest_item(d->st, item);
    TK_ASSERT(item->key_len <= d->cap);
    memcpy(d->last, item->key, item->key_len);
    d->last_len = item->key_len;
    d->items++;
    return 0;
}

int kv_sm_digest_step(struct kv_sm *sm, struct kv_digest *d, size_t max_items,
                      size_t skip_max)
{
    if (d->done)
        return 1;
    struct kv_range r = {.start = d->from, .start_len = d->from_len};
    struct kv_scan_stop stop = {.key = d->stop_key, .cap = d->cap};
    d->items = 0;
    int rc = kv_sm_scan_bounded(sm, &r, max_items, skip_max, digest_step_cb, d, &stop);
    if (rc != 0)
        return rc;
    if (stop.stopped) {
        memcpy(d->from, stop.key, stop.key_len);
        d->from_len = stop.key_len;
    } else if (max_items == 0 || d->items < max_items) {
        d->done = true;
        return 1;
    } else {
        memcpy(d->from, d->last, d->last_len);
        d->from_len = d->last_len;
    }
    d->from[d->from_len++] = 0; /* just after the key read last */
    return 0;
}
