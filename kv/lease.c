/* Leases: replicated TTL sessions that keys attach to.
 *
 * Every replica holds the same lease table, changed only by applied commands
 * (grant, keepalive, revoke, checkpoint, and puts that attach or detach a
 * key). A lease is (id, ttl_ms, remaining_ms, keys): remaining_ms is the TTL
 * left as of the last grant, keepalive or checkpoint. Time is the leader's
 * business: `deadline` is a node-local clock reading, set by kv_sm_lease_due
 * to now + remaining_ms the first time a leader looks (after a grant, a
 * keepalive, an open, an install or kv_sm_lease_reset), so a new leader
 * resumes from the last checkpoint and never from the full TTL.
 *
 * Persistence: each lease is one record in the data table under the reserved
 * key LEASE_PREFIX + 16 hex digits of the id, whose value is "L1", ttl_ms,
 * remaining_ms (u64 LE), the key count (u32 LE) and each key (u16 LE length,
 * bytes). Tier-down, snapshots (stream and install) and restarts carry it like
 * any key; kv__lease_load rebuilds the table from those records (open,
 * install) and the log's replay does the rest. Users cannot write or delete
 * keys under the prefix (cmd.c), and its writes make no events.
 *
 * key -> lease is a chained hash table of the attached keys. A lease holds at
 * most LEASE_KEYS_MAX keys. Owner thread only. Called by cmd.c, sm.c and
 * snapshot.c; calls state.c, events.c, iter.c, the ring, index and view. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/endian.h"
#include "base/err.h"
#include "kv/sm_internal.h"

#define REC_HEAD 30 /* "L1", ttl, remaining, renewed, count */

bool kv__lease_reserved(const uint8_t *key, size_t len)
{
    return len >= KV_LEASE_PREFIX_LEN &&
           memcmp(key, KV_LEASE_PREFIX, KV_LEASE_PREFIX_LEN) == 0;
}

void kv__lease_init(struct kv_leases *t)
{
    memset(t, 0, sizeof(*t));
    t->mask = 255;
    t->tab = tk_calloc(t->mask + 1, sizeof(*t->tab));
}

static void lease_free(struct kv_lease *l)
{
    tk_free(l->keys);
    tk_free(l);
}

void kv__lease_free(struct kv_leases *t)
{
    for (size_t i = 0; i <= t->mask && t->tab != NULL; i++) {
        for (struct kv_lkey *k = t->tab[i], *nx; k != NULL; k = nx) {
            nx = k->next;
            tk_free(k);
        }
    }
    for (size_t i = 0; i < t->n; i++)
        lease_free(t->v[i]);
    tk_free(t->v);
    tk_free(t->tab);
    memset(t, 0, sizeof(*t));
}

/* The position of id in the sorted array, or where it would go. */
static size_t lease_pos(const struct kv_leases *t, uint64_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

struct kv_lease *kv__lease_find(const struct kv_leases *t, uint64_t id)
{
    size_t i = lease_pos(t, id);
    return i < t->n && t->v[i]->id == id ? t->v[i] : NULL;
}

static struct kv_lease *lease_add(struct kv_leases *t, uint64_t id, uint64_t ttl)
{
    size_t i = lease_pos(t, id);
    t->v = kv__grow(t->v, t->n, &t->cap, 16, sizeof(*t->v));
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
    struct kv_lease *l = tk_calloc(1, sizeof(*l));
    l->id = id;
    l->ttl_ms = l->remaining_ms = ttl;
    t->v[i] = l;
    t->n++;
    return l;
}

static struct kv_lkey **lkey_slot(struct kv_leases *t, const uint8_t *key, size_t len,
                                  uint64_t hash)
{
    struct kv_lkey **pp = &t->tab[hash & t->mask];
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->hash == hash && (*pp)->len == len && memcmp((*pp)->key, key, len) == 0)
            return pp;
    return pp;
}

static void rehash(struct kv_leases *t)
{
    size_t mask = t->mask * 2 + 1;
    struct kv_lkey **tab = tk_calloc(mask + 1, sizeof(*tab));
    for (size_t i = 0; i <= t->mask; i++) {
        for (struct kv_lkey *k = t->tab[i], *nx; k != NULL; k = nx) {
            nx = k->next;
            k->next = tab[k->hash & mask];
            tab[k->hash & mask] = k;
        }
    }
    tk_free(t->tab);
    t->tab = tab;
    t->mask = mask;
}

/* Attaches key to l in memory (it is attached to nothing). */
static void link_key(struct kv_leases *t, struct kv_lease *l, const uint8_t *key,
                     size_t len, uint64_t hash)
{
    if (t->count > t->mask)
        rehash(t);
    struct kv_lkey *k = tk_malloc(sizeof(*k) + (len > 0 ? len : 1));
    k->hash = hash;
    k->lease = l->id;
    k->len = (uint16_t)len;
    memcpy(k->key, key, len);
    struct kv_lkey **pp = &t->tab[hash & t->mask];
    k->next = *pp;
    *pp = k;
    t->count++;
    l->keys = kv__grow(l->keys, l->n_keys, &l->cap_keys, 8, sizeof(*l->keys));
    l->keys[l->n_keys++] = k;
}

/* Detaches the key at *pp from its lease in memory and frees it. */
static void unlink_key(struct kv_leases *t, struct kv_lkey **pp)
{
    struct kv_lkey *k = *pp;
    struct kv_lease *l = kv__lease_find(t, k->lease);
    for (size_t i = 0; l != NULL && i < l->n_keys; i++) {
        if (l->keys[i] == k) {
            l->keys[i] = l->keys[--l->n_keys];
            break;
        }
    }
    *pp = k->next;
    t->count--;
    tk_free(k);
}

static void rec_key(uint64_t id, uint8_t *buf)
{
    memcpy(buf, KV_LEASE_PREFIX, KV_LEASE_PREFIX_LEN);
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
    memcpy(buf + KV_LEASE_PREFIX_LEN, hex, 16);
}

/* Writes key's new state at index: the event (unless reserved), then the
 * record (as cmd.c's write_key does). */
static void write_rec(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                      uint64_t hash, const struct kv_state *st)
{
    if (!kv__lease_reserved(key, len))
        kv__events_write(sm, index, key, len, hash, st);
    kv__state_write(sm, index, key, len, hash, st);
}

/* Writes l's record (or its tombstone when gone). 0 or TK_EIO. */
static int store(struct kv_sm *sm, uint64_t index, const struct kv_lease *l, uint64_t id,
                 bool gone)
{
    uint8_t key[KV_LEASE_KEY_LEN];
    rec_key(id, key);
    uint64_t hash = kv__hash(key, sizeof(key));
    struct kv_state st;
    if (kv__state_lookup(sm, key, sizeof(key), hash, &st) != 0)
        return TK_EIO;
    if (gone) {
        if (!st.live)
            return 0;
        st.live = false;
        write_rec(sm, index, key, sizeof(key), hash, &st);
        return 0;
    }
    size_t bytes = REC_HEAD;
    for (size_t i = 0; i < l->n_keys; i++)
        bytes += 2 + l->keys[i]->len;
    uint8_t *v = tk_malloc(bytes);
    memcpy(v, "L1", 2);
    tk_put_le64(v + 2, l->ttl_ms);
    tk_put_le64(v + 10, l->remaining_ms);
    tk_put_le64(v + 18, l->renewed);
    uint32_t n = (uint32_t)l->n_keys;
    memcpy(v + 26, &n, 4);
    size_t off = REC_HEAD;
    for (size_t i = 0; i < l->n_keys; i++) {
        v[off] = (uint8_t)l->keys[i]->len;
        v[off + 1] = (uint8_t)(l->keys[i]->len >> 8);
        memcpy(v + off + 2, l->keys[i]->key, l->keys[i]->len);
        off += 2 + l->keys[i]->len;
    }
    st.version = st.live ? st.version + 1 : 1;
    if (!st.live)
        st.create_rev = index;
    st.live = true;
    st.mod_rev = index;
    st.expire_ms = 0;
    st.value = v;
    st.value_len = bytes;
    write_rec(sm, index, key, sizeof(key), hash, &st);
    tk_free(v);
    return 0;
}

int kv__lease_check_put(const struct kv_sm *sm, uint64_t lease)
{
    if (lease == 0)
        return 0;
    const struct kv_lease *l = kv__lease_find(&sm->leases, lease);
    if (l == NULL)
        return TK_ENOTFOUND;
    return l->n_keys + KV_TXN_OPS_MAX > KV_LEASE_KEYS_MAX ? TK_ETOOBIG : 0;
}

int kv__lease_attach(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                     uint64_t hash, uint64_t lease)
{
    struct kv_leases *t = &sm->leases;
    if (t->count == 0 && lease == 0)
        return 0;
    struct kv_lkey **pp = lkey_slot(t, key, len, hash);
    uint64_t old = *pp != NULL ? (*pp)->lease : 0;
    if (old == lease)
        return 0;
    if (*pp != NULL)
        unlink_key(t, pp);
    int rc = 0;
    struct kv_lease *o = old != 0 ? kv__lease_find(t, old) : NULL;
    if (o != NULL)
        rc = store(sm, index, o, old, false);
    struct kv_lease *l = lease != 0 ? kv__lease_find(t, lease) : NULL;
    if (l != NULL && rc == 0) {
        link_key(t, l, key, len, hash);
        rc = store(sm, index, l, lease, false);
    }
    return rc;
}

int kv__lease_grant(struct kv_sm *sm, uint64_t index, uint64_t id, uint64_t ttl_ms,
                    struct kv_result *res)
{
    if (id == 0)
        id = index;
    if (ttl_ms == 0 || ttl_ms > KV_LEASE_TTL_MAX || id > INT64_MAX) {
        res->code = TK_EINVAL;
        return 0;
    }
    if (kv__lease_find(&sm->leases, id) != NULL) {
        res->code = TK_ECOMPARE; /* the id is taken */
        return 0;
    }
    if (sm->leases.n >= KV_LEASES_MAX) {
        res->code = TK_ETOOBIG;
        return 0;
    }
    struct kv_lease *l = lease_add(&sm->leases, id, ttl_ms);
    l->renewed = index;
    res->value = (int64_t)id;
    res->succeeded = true;
    res->revision = index;
    return store(sm, index, l, id, false);
}

int kv__lease_keepalive(struct kv_sm *sm, uint64_t index, uint64_t id,
                        struct kv_result *res)
{
    struct kv_lease *l = kv__lease_find(&sm->leases, id);
    if (l == NULL) {
        res->code = TK_ENOTFOUND;
        return 0;
    }
    l->remaining_ms = l->ttl_ms;
    l->renewed = index;
    l->deadline = 0;
    res->value = (int64_t)l->ttl_ms;
    res->succeeded = true;
    res->revision = index;
    return store(sm, index, l, id, false);
}

int kv__lease_checkpoint(struct kv_sm *sm, uint64_t index, const uint64_t *ids,
                         const uint64_t *remaining, size_t n, struct kv_result *res)
{
    res->succeeded = true;
    for (size_t i = 0; i < n; i++) {
        struct kv_lease *l = kv__lease_find(&sm->leases, ids[i]);
        if (l == NULL || remaining[i] > l->ttl_ms)
            continue;
        l->remaining_ms = remaining[i]; /* the leader's deadline stays */
        if (store(sm, index, l, ids[i], false) != 0)
            return TK_EIO;
        res->revision = index;
    }
    return 0;
}

int kv__lease_revoke(struct kv_sm *sm, uint64_t index, uint64_t id, bool expired,
                     uint64_t renewed, struct kv_result *res)
{
    struct kv_leases *t = &sm->leases;
    size_t at = lease_pos(t, id);
    if (at >= t->n || t->v[at]->id != id) {
        res->code = TK_ENOTFOUND;
        return 0;
    }
    struct kv_lease *l = t->v[at];
    if (expired && renewed != l->renewed) {
        res->code = TK_ECOMPARE; /* kept alive since the leader saw it due */
        return 0;
    }
    sm->expiring = expired;
    while (l->n_keys > 0) {
        struct kv_lkey *k = l->keys[l->n_keys - 1];
        struct kv_state st;
        if (kv__state_lookup(sm, k->key, k->len, k->hash, &st) != 0) {
            sm->expiring = false;
            return TK_EIO;
        }
        if (st.live) {
            st.live = false;
            write_rec(sm, index, k->key, k->len, k->hash, &st);
            res->deleted++;
        }
        unlink_key(t, lkey_slot(t, k->key, k->len, k->hash));
    }
    sm->expiring = false;
    memmove(&t->v[at], &t->v[at + 1], (t->n - at - 1) * sizeof(*t->v));
    t->n--;
    lease_free(l);
    res->succeeded = true;
    res->revision = index;
    return store(sm, index, NULL, id, true);
}

int kv__lease_load_rec(struct kv_leases *t, const uint8_t *key, size_t key_len,
                       const uint8_t *v, size_t value_len)
{
    if (key_len != KV_LEASE_KEY_LEN || value_len < REC_HEAD || memcmp(v, "L1", 2))
        return TK_ECORRUPT;
    char hex[17];
    memcpy(hex, key + KV_LEASE_PREFIX_LEN, 16);
    hex[16] = '\0';
    uint64_t id = 0;
    if (sscanf(hex, "%16llx", (unsigned long long *)&id) != 1)
        return TK_ECORRUPT;
    struct kv_lease *l = lease_add(t, id, tk_get_le64(v + 2));
    l->remaining_ms = tk_get_le64(v + 10);
    l->renewed = tk_get_le64(v + 18);
    uint32_t n;
    memcpy(&n, v + 26, 4);
    size_t off = REC_HEAD;
    for (uint32_t i = 0; i < n; i++) {
        if (off + 2 > value_len)
            return TK_ECORRUPT;
        size_t len = (size_t)v[off] | ((size_t)v[off + 1] << 8);
        if (off + 2 + len > value_len)
            return TK_ECORRUPT;
        const uint8_t *k = v + off + 2;
        uint64_t hash = kv__hash(k, len);
        if (*lkey_slot(t, k, len, hash) == NULL)
            link_key(t, l, k, len, hash);
        off += 2 + len;
    }
    return 0;
}

/* One lease record from a scan (kv__lease_load). */
static int load_one(const struct kv_item *it, void *data)
{
    struct kv_sm *sm = data;
    return kv__lease_load_rec(&sm->leases, it->key, it->key_len, it->value,
                              it->value_len);
}

int kv__lease_load(struct kv_sm *sm)
{
    kv__lease_free(&sm->leases);
    kv__lease_init(&sm->leases);
    struct kv_range r = {
        .start = KV_LEASE_PREFIX, .start_len = KV_LEASE_PREFIX_LEN, .by_prefix = true};
    int rc = kv_sm_scan(sm, &r, 0, load_one, sm);
    return rc == 0 ? 0 : rc == TK_ECORRUPT ? TK_ECORRUPT : TK_EIO;
}

/* ---- the node's side ---- */

size_t kv_sm_lease_count(const struct kv_sm *sm)
{
    return sm->leases.n;
}

void kv_sm_lease_reset(struct kv_sm *sm)
{
    for (size_t i = 0; i < sm->leases.n; i++)
        sm->leases.v[i]->deadline = 0;
}

size_t kv_sm_lease_due(struct kv_sm *sm, uint64_t now_ms, uint64_t *ids,
                       uint64_t *renewed, size_t max)
{
    size_t got = 0;
    for (size_t i = 0; i < sm->leases.n; i++) {
        struct kv_lease *l = sm->leases.v[i];
        if (l->deadline == 0)
            l->deadline = now_ms + l->remaining_ms;
        if (l->deadline <= now_ms && got < max) {
            renewed[got] = l->renewed;
            ids[got++] = l->id;
        }
    }
    return got;
}

size_t kv_sm_lease_list(const struct kv_sm *sm, uint64_t after, uint64_t now_ms,
                        uint64_t *ids, uint64_t *remaining, size_t max)
{
    size_t got = 0;
    const struct kv_leases *t = &sm->leases;
    for (size_t i = lease_pos(t, after + 1); i < t->n && got < max; i++) {
        const struct kv_lease *l = t->v[i];
        ids[got] = l->id;
        remaining[got++] = l->deadline == 0       ? l->remaining_ms
                           : l->deadline > now_ms ? l->deadline - now_ms
                                                  : 0;
    }
    return got;
}

int kv_sm_lease_get(struct kv_sm *sm, uint64_t id, uint64_t now_ms,
                    struct kv_lease_info *out, kv_key_cb *cb, void *data)
{
    const struct kv_lease *l = kv__lease_find(&sm->leases, id);
    if (l == NULL)
        return TK_ENOTFOUND;
    out->id = id;
    out->ttl_ms = l->ttl_ms;
    out->remaining_ms = l->deadline == 0       ? l->remaining_ms
                        : l->deadline > now_ms ? l->deadline - now_ms
                                               : 0;
    out->n_keys = l->n_keys;
    for (size_t i = 0; cb != NULL && i < l->n_keys; i++)
        cb(l->keys[i]->key, l->keys[i]->len, data);
    return 0;
}
