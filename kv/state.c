/* The state of one key: the lookup every command and read starts from, the
 * single-key reads (get, multi-get), and the check that lets a new version
 * overwrite the key's record in place.
 *
 * A key's current state is its index entry's ring record if that record passes
 * its check (a tombstone means absent), else the cold tier; a key whose
 * expire_ms <= the sm's clock is absent. A record may be rewritten in place
 * only while no tier-down in flight reads it (the job's fields it checks are
 * the owner's: pick set them). Owner thread only. Called by cmd.c (lookup,
 * rewrite check) and the node (get, multi-get); calls only the ring, index
 * and cold tier. */
#include <string.h>

#include "base/err.h"
#include "kv/sm_internal.h"

/* ---- key state ---- */

/* The current state of a key (ignoring staged writes); with raw, a key whose
 * TTL has run out is still live. Returns 0 or TK_EIO. */
static int lookup(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                  struct kv_state *st, bool raw)
{
    st->live = false;
    st->hot = false;
    bool found;
    uint64_t addr = kv__index_find(&sm->index, hash, key, len, &found);
    if (found) {
        if (kv__ring_check(&sm->ring, addr)) {
            const struct kv_rec *h = kv__ring_at(&sm->ring, addr);
            st->hot = true;
            st->addr = addr;
            if ((h->flags & KV_REC_TOMB) || (!raw && !kv__live(sm, h->expire_ms)))
                return 0;
            st->live = true;
            st->value = kv__rec_value(h);
            st->value_len = h->value_len;
            st->expire_ms = h->expire_ms;
            st->create_rev = h->create_rev;
            st->mod_rev = h->mod_rev;
            st->version = h->version;
            return 0;
        }
        sm->bad_records++;
    }
    struct kv_cold_val cv;
    int rc = kv__cold_get(sm->cold, key, len, &cv);
    if (rc == TK_ENOTFOUND)
        return 0;
    if (rc != 0)
        return TK_EIO;
    if (!raw && !kv__live(sm, cv.expire_ms))
        return 0;
    st->live = true;
    st->value = cv.value;
    st->value_len = cv.value_len;
    st->expire_ms = cv.expire_ms;
    st->create_rev = cv.create_rev;
    st->mod_rev = cv.mod_rev;
    st->version = cv.version;
    return 0;
}

int kv__state_lookup(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                     struct kv_state *st)
{
    return lookup(sm, key, len, hash, st, false);
}

int kv__state_lookup_raw(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                         struct kv_state *st)
{
    return lookup(sm, key, len, hash, st, true);
}

/* ---- reads ---- */

static int get_hashed(struct kv_sm *sm, const void *key, size_t len, uint64_t hash,
                      struct kv_item *out)
{
    struct kv_state st;
    int rc = kv__state_lookup(sm, key, len, hash, &st);
    if (rc != 0)
        return rc;
    if (!st.live)
        return TK_ENOTFOUND;
    out->key = key;
    out->key_len = len;
    out->value = st.value;
    out->value_len = st.value_len;
    out->create_revision = st.create_rev;
    out->mod_revision = st.mod_rev;
    out->version = st.version;
    out->expire_ms = st.expire_ms;
    out->hot = st.hot;
    return 0;
}

int kv_sm_get(struct kv_sm *sm, const void *key, size_t len, struct kv_item *out)
{
    if (len == 0 || len > sm->cfg.key_max)
        return TK_EINVAL;
    return get_hashed(sm, key, len, kv__hash(key, len), out);
}

/* A multi-get reads ahead as a scan does: the index bucket of the key
 * MULTI_AHEAD on and the ring record of the key MULTI_PEEK on start loading
 * before this key is looked up, so a batch's cache misses overlap. */
#define MULTI_AHEAD 8
#define MULTI_PEEK 2
#define MULTI_RING 16 /* > MULTI_AHEAD */

int kv_sm_multi_get(struct kv_sm *sm, const struct kv_item *keys, size_t n,
                    kv_multi_cb *cb, void *data)
{
    uint64_t hash[MULTI_RING];
    for (size_t j = 0; j < n && j < MULTI_AHEAD; j++) {
        hash[j % MULTI_RING] = kv__hash(keys[j].key, keys[j].key_len);
        kv__index_prefetch(&sm->index, hash[j % MULTI_RING]);
    }
    for (size_t j = 0; j < n && j < MULTI_PEEK; j++)
        kv__index_peek(&sm->index, hash[j % MULTI_RING]);
    for (size_t i = 0; i < n; i++) {
        size_t j = i + MULTI_AHEAD;
        if (j < n) {
            hash[j % MULTI_RING] = kv__hash(keys[j].key, keys[j].key_len);
            kv__index_prefetch(&sm->index, hash[j % MULTI_RING]);
        }
        if (i + MULTI_PEEK < n)
            kv__index_peek(&sm->index, hash[(i + MULTI_PEEK) % MULTI_RING]);
        struct kv_item it = {.key = keys[i].key, .key_len = keys[i].key_len};
        int rc = TK_ENOTFOUND; /* an invalid key is simply not found */
        if (keys[i].key_len > 0 && keys[i].key_len <= sm->cfg.key_max)
            rc = get_hashed(sm, keys[i].key, keys[i].key_len, hash[i % MULTI_RING], &it);
        if (rc != 0 && rc != TK_ENOTFOUND)
            return rc;
        if (cb(rc, &it, data) != 0)
            break;
    }
    return 0;
}

/* May apply rewrite the record at addr (hot, its key's newest) in place for
 * a new version with value_len bytes of value, instead of appending one?
 * Only a record in the newest half of the ring budget (so a key that stays
 * hot moves to the tail before its page is released) and with room to track
 * it, and never one a tier-down in flight reads: its changed records and its
 * released pages, nor one in pages a published tier-down is still draining. Tracks it
 * when it becomes changed. */
bool kv__state_rewrite_ok(struct kv_sm *sm, uint64_t addr, size_t value_len)
{
    if (sm->cfg.append_only)
        return false;
    const struct kv_rec *h = kv__ring_at(&sm->ring, addr);
    if (h->value_len != value_len || (h->flags & (KV_REC_TOMB | KV_REC_SESSION)))
        return false;
    const struct kv_page *p = kv__ring_page(&sm->ring, addr);
    if (sm->ring.next_pos - p->pos > sm->cfg.ring_bytes / 2)
        return false;
    if (sm->draining && p->pos < sm->drain_end)
        return false; /* its index entry may go: LMDB must hold its value */
    uint64_t base = sm->durable;
    if (sm->job != NULL) {
        if (p->pos < sm->job->rel_end)
            return false;
        if (h->mod_rev > sm->durable && h->mod_rev <= sm->job->meta.index)
            return false;
        base = sm->job->meta.index;
    }
    if (h->mod_rev > base) { /* changed already: past dirty_pos or in inplace */
        sm->rewrites++;
        return true;
    }
    if (sm->n_inplace == sm->max_inplace)
        return false; /* full: kv_sm_tier_wanted says so */
    sm->inplace = kv__grow(sm->inplace, sm->n_inplace, &sm->cap_inplace, 1024,
                           sizeof(*sm->inplace));
    sm->inplace[sm->n_inplace++] = addr;
    sm->rewrites++;
    return true;
}

void kv__state_write(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                     uint64_t hash, const struct kv_state *st)
{
    struct kv_rec h = {.key_len = (uint16_t)len, .mod_rev = index};
    if (st->live) {
        h.value_len = (uint32_t)st->value_len;
        h.expire_ms = st->expire_ms;
        h.create_rev = st->create_rev;
        h.version = st->version;
        if (st->hot && kv__state_rewrite_ok(sm, st->addr, st->value_len)) {
            kv__ring_rewrite(&sm->ring, st->addr, &h, st->value);
            return;
        }
    } else {
        h.flags = KV_REC_TOMB;
    }
    uint64_t addr = kv__ring_append(&sm->ring, &h, key, st->live ? st->value : NULL);
    if (kv__index_put(&sm->index, hash, key, len, addr))
        kv__view_insert(&sm->view, key, len);
}
