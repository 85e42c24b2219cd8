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
 * key LEASE_PREFIX + 16 hex digits of the id, whose value is REC_V1 then a
 * kvpb.LeaseRecord (kv.proto): ttl_ms, remaining_ms, renewed and the keys.
 * Builds before it wrote "L1", ttl_ms, remaining_ms, renewed (u64 LE), the key
 * count (u32, host order) and each key (u16 LE length, bytes): such a record
 * (first byte 'L') is still read, never written. Both go through rec_decode's
 * checks; anything else is TK_ECORRUPT with a reason. Tier-down, snapshots
 * (stream and install) and restarts carry it like any key; kv__lease_load
 * rebuilds the table from those records (open, install) and the log's replay
 * does the rest. Users cannot write or delete keys under the prefix (cmd.c),
 * and its writes make no events.
 *
 * key -> lease is a chained hash table of the attached keys. A lease holds at
 * most LEASE_KEYS_MAX keys. Owner thread only. Called by cmd.c, sm.c and
 * snapshot.c; calls state.c, events.c, iter.c, the ring, index and view. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/endian.h"
#include "base/err.h"
#include "base/log.h"
#include "kv.pb-c.h"
#include "kv/sm_internal.h"

#define REC_V1 KVPB__RECORD_FORMAT__RECORD_FORMAT_V1 /* a kvpb.LeaseRecord follows */
#define OLD_HEAD 30 /* the old value: "L1", ttl, remaining, renewed, count */

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

/* l's record value (REC_V1, then its kvpb.LeaseRecord): a new buffer of
 * *bytes bytes, the caller's to free. */
static uint8_t *rec_encode(const struct kv_lease *l, size_t *bytes)
{
    Kvpb__LeaseRecord m = KVPB__LEASE_RECORD__INIT;
    m.ttl_ms = l->ttl_ms;
    m.remaining_ms = l->remaining_ms;
    m.renewed = l->renewed;
    m.n_keys = l->n_keys;
    m.keys = tk_malloc((l->n_keys > 0 ? l->n_keys : 1) * sizeof(*m.keys));
    for (size_t i = 0; i < l->n_keys; i++) {
        m.keys[i].data = l->keys[i]->key;
        m.keys[i].len = l->keys[i]->len;
    }
    *bytes = 1 + kvpb__lease_record__get_packed_size(&m);
    uint8_t *v = tk_malloc(*bytes);
    v[0] = REC_V1;
    size_t packed = kvpb__lease_record__pack(&m, v + 1);
    TK_ASSERT(packed + 1 == *bytes);
    tk_free(m.keys);
    return v;
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
    size_t bytes = 0;
    uint8_t *v = rec_encode(l, &bytes);
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
    struct kv_lkey **pp = kv__lkey_slot(t, key, len, hash);
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
        unlink_key(t, kv__lkey_slot(t, k->key, k->len, k->hash));
    }
    sm->expiring = false;
    memmove(&t->v[at], &t->v[at + 1], (t->n - at - 1) * sizeof(*t->v));
    t->n--;
    lease_free(l);
    res->succeeded = true;
    res->revision = index;
    return store(sm, index, NULL, id, true);
}

/* ---- records ---- */

/* A record decoded and checked: its id (from the key), its fields and its
 * keys, which point into the value (old format) or into pb. */
struct lease_rec {
    uint64_t id, ttl_ms, remaining_ms, renewed;
    size_t n_keys;
    ProtobufCBinaryData *keys; /* pb's, or tk_malloc'd for the old format */
    Kvpb__LeaseRecord *pb;
};

static void *pb_alloc(void *data, size_t size)
{
    (void)data;
    return tk_malloc(size > 0 ? size : 1);
}

static void pb_free(void *data, void *ptr)
{
    (void)data;
    tk_free(ptr);
}

static ProtobufCAllocator pb_allocator = {.alloc = pb_alloc, .free = pb_free};

static void rec_release(struct lease_rec *r)
{
    if (r->pb != NULL)
        kvpb__lease_record__free_unpacked(r->pb, &pb_allocator);
    else
        tk_free(r->keys);
    memset(r, 0, sizeof(*r));
}

static int rec_fail(struct lease_rec *r, char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rec_fail(struct lease_rec *r, char *why, size_t cap, const char *fmt, ...)
{
    rec_release(r);
    if (why != NULL && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return TK_ECORRUPT;
}

/* The id in a record's key: 16 lowercase hex digits after the prefix. */
static bool rec_id(const uint8_t *key, size_t len, uint64_t *id)
{
    if (len != KV_LEASE_KEY_LEN || !kv__lease_reserved(key, len))
        return false;
    *id = 0;
    for (size_t i = KV_LEASE_PREFIX_LEN; i < len; i++) {
        uint8_t c = key[i];
        if (c >= '0' && c <= '9')
            *id = *id << 4 | (uint64_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            *id = *id << 4 | (uint64_t)(c - 'a' + 10);
        else
            return false;
    }
    return true;
}

/* The value of a build before REC_V1 (see the top): its keys into r->keys. */
static int rec_decode_old(const uint8_t *v, size_t len, struct lease_rec *r, char *why,
                          size_t cap)
{
    if (len < OLD_HEAD)
        return rec_fail(r, why, cap, "an old-format value of %zu bytes, under %d", len,
                        OLD_HEAD);
    r->ttl_ms = tk_get_le64(v + 2);
    r->remaining_ms = tk_get_le64(v + 10);
    r->renewed = tk_get_le64(v + 18);
    uint32_t n;
    memcpy(&n, v + 26, 4); /* host order, as it was written */
    if (n > KV_LEASE_KEYS_MAX)
        return rec_fail(r, why, cap, "%" PRIu32 " keys, over %d", n, KV_LEASE_KEYS_MAX);
    r->keys = tk_malloc((n > 0 ? n : 1) * sizeof(*r->keys));
    size_t off = OLD_HEAD;
    for (uint32_t i = 0; i < n; i++) {
        if (len - off < 2)
            return rec_fail(r, why, cap, "key %" PRIu32 " of %" PRIu32 " is cut off", i,
                            n);
        size_t kl = (size_t)v[off] | ((size_t)v[off + 1] << 8);
        if (len - off - 2 < kl)
            return rec_fail(r, why, cap, "key %" PRIu32 " overruns the value", i);
        r->keys[i].data = (uint8_t *)v + off + 2;
        r->keys[i].len = kl;
        off += 2 + kl;
    }
    if (off != len)
        return rec_fail(r, why, cap, "%zu bytes after the keys", len - off);
    r->n_keys = n;
    return 0;
}

/* Decodes and checks the record (key, value) into r, to rec_release after.
 * 0, or TK_ECORRUPT with what is wrong in why (cap bytes, may be NULL). */
static int rec_decode(const uint8_t *key, size_t key_len, const uint8_t *v, size_t len,
                      struct lease_rec *r, char *why, size_t cap)
{
    memset(r, 0, sizeof(*r));
    if (!rec_id(key, key_len, &r->id))
        return rec_fail(r, why, cap, "a lease key without its 16 hex digits");
    if (r->id == 0 || r->id > INT64_MAX)
        return rec_fail(r, why, cap, "lease id %" PRIu64 " is out of range", r->id);
    if (len > 0 && v[0] == REC_V1) {
        r->pb = kvpb__lease_record__unpack(&pb_allocator, len - 1, v + 1);
        if (r->pb == NULL)
            return rec_fail(r, why, cap, "%zu bytes that are no LeaseRecord", len - 1);
        r->ttl_ms = r->pb->ttl_ms;
        r->remaining_ms = r->pb->remaining_ms;
        r->renewed = r->pb->renewed;
        r->n_keys = r->pb->n_keys;
        r->keys = r->pb->keys;
    } else if (len >= 2 && memcmp(v, "L1", 2) == 0) {
        int rc = rec_decode_old(v, len, r, why, cap);
        if (rc != 0)
            return rc;
    } else {
        return rec_fail(r, why, cap, "an unknown format (%zu bytes, first 0x%02x)", len,
                        len > 0 ? v[0] : 0);
    }
    if (r->ttl_ms == 0 || r->ttl_ms > KV_LEASE_TTL_MAX || r->remaining_ms > r->ttl_ms)
        return rec_fail(r, why, cap, "ttl %" PRIu64 " ms, remaining %" PRIu64 " ms",
                        r->ttl_ms, r->remaining_ms);
    if (r->n_keys > KV_LEASE_KEYS_MAX)
        return rec_fail(r, why, cap, "%zu keys, over %d", r->n_keys, KV_LEASE_KEYS_MAX);
    for (size_t i = 0; i < r->n_keys; i++)
        if (r->keys[i].len == 0 || r->keys[i].len > UINT16_MAX ||
            kv__lease_reserved(r->keys[i].data, r->keys[i].len))
            return rec_fail(r, why, cap, "key %zu (%zu bytes) cannot hold a lease", i,
                            r->keys[i].len);
    return 0;
}

int kv__lease_check_rec(const uint8_t *key, size_t key_len, const uint8_t *v,
                        size_t value_len, char *why, size_t why_cap)
{
    struct lease_rec r;
    int rc = rec_decode(key, key_len, v, value_len, &r, why, why_cap);
    if (rc == 0)
        rec_release(&r);
    return rc;
}

int kv__lease_load_rec(struct kv_leases *t, const uint8_t *key, size_t key_len,
                       const uint8_t *v, size_t value_len)
{
    char why[96];
    struct lease_rec r;
    int rc = rec_decode(key, key_len, v, value_len, &r, why, sizeof(why));
    if (rc == 0 && kv__lease_find(t, r.id) != NULL)
        rc = rec_fail(&r, why, sizeof(why), "lease %" PRIu64 " is there twice", r.id);
    if (rc == 0 && t->n >= KV_LEASES_MAX)
        rc = rec_fail(&r, why, sizeof(why), "over %d leases", KV_LEASES_MAX);
    if (rc != 0) {
        TK_LOG(TK_LOG_ERROR, 0, 0, "kv: a corrupt lease record: %s", why);
        return rc;
    }
    struct kv_lease *l = lease_add(t, r.id, r.ttl_ms);
    l->remaining_ms = r.remaining_ms;
    l->renewed = r.renewed;
    for (size_t i = 0; i < r.n_keys; i++) {
        const uint8_t *k = r.keys[i].data;
        size_t len = r.keys[i].len;
        uint64_t hash = kv__hash(k, len);
        if (*kv__lkey_slot(t, k, len, hash) == NULL)
            link_key(t, l, k, len, hash);
    }
    rec_release(&r);
    return 0;
}

/* One lease record from a scan (kv__lease_load): a refused one stops the
 * scan, its code kept in the struct lease_load. */
struct lease_load {
    struct kv_sm *sm;
    int rc;
};

static int load_one(const struct kv_item *it, void *data)
{
    struct lease_load *ld = data;
    ld->rc = kv__lease_load_rec(&ld->sm->leases, it->key, it->key_len, it->value,
                                it->value_len);
    return ld->rc;
}

int kv__lease_load(struct kv_sm *sm)
{
    kv__lease_free(&sm->leases);
    kv__lease_init(&sm->leases);
    struct kv_range r = {
        .start = KV_LEASE_PREFIX, .start_len = KV_LEASE_PREFIX_LEN, .by_prefix = true};
    struct lease_load ld = {.sm = sm, .rc = 0};
    int rc = kv_sm_scan(sm, &r, 0, load_one, &ld);
    if (rc == 0)
        rc = ld.rc; /* the scan stops at a refused record and says 0 */
    return rc == 0 ? 0 : rc == TK_ECORRUPT ? TK_ECORRUPT : TK_EIO;
}

/* ---- the node's side ---- */

uint64_t kv_sm_key_lease(struct kv_sm *sm, const void *key, size_t len)
{
    if (sm->leases.count == 0)
        return 0;
    return kv__lease_of(sm, key, len, kv__hash(key, len));
}

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
