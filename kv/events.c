/* The change log: the events apply caused, in a bounded ring.
 *
 * cmd.c calls kv__events_write_prev (with the key's state as the command
 * found it) or kv__events_write (which looks it up) just before it writes a
 * key's new state, so the event is what apply did (the staged state it
 * writes) and the key's current state is its previous one. Every event of an
 * entry has the entry's index as its revision, and revisions only grow, so
 * the ring is sorted by revision. It holds at most events.max events and
 * events.max_bytes bytes; making room drops the oldest, and `first` moves past
 * the revision of every event dropped, so a revision is either wholly held or
 * not readable at all. Each event, header and data, is copied into a byte
 * ring and its revision and place into a slot (struct kv_events), so
 * recording one allocates nothing and dropping one reads only its slot.
 * Owner thread only. Calls state.c (the previous state) and ttl.c; reads
 * the key's lease through sm_internal.h's inline kv__lease_of (lease.c
 * calls this file). */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "kv/sm_internal.h"

#define EV_HDR sizeof(struct kv_ev)
_Static_assert(sizeof(struct kv_ev) == 16, "an event header: 16 bytes, then its words");
#define EV_AHEAD 256 /* bytes: how far ahead of wpos to prefetch */

void kv__events_init(struct kv_events *e, size_t max, size_t max_bytes, uint64_t first)
{
    memset(e, 0, sizeof(*e));
    e->max = max;
    e->max_bytes = max_bytes;
    e->first = first;
    if (max > 0)
        e->slot = tk_calloc(max, sizeof(*e->slot));
    if (max > 0 && max_bytes > 0)
        e->buf = kv__map(max_bytes, 64); /* its pages come as it fills */
}

/* The i-th held slot, oldest first (i < max: no division per event). */
static struct kv_ev_slot *at(const struct kv_events *e, size_t i)
{
    size_t j = e->head + i;
    return &e->slot[j < e->max ? j : j - e->max];
}

static const struct kv_ev *hdr_of(const struct kv_events *e, const struct kv_ev_slot *s)
{
    return (const struct kv_ev *)(const void *)(e->buf + s->off);
}

/* Copies n bytes to d: inline for 8 to 16 (two overlapping words: an 8-byte
 * key or value), else memcpy. */
static inline void copy(uint8_t *d, const void *src, size_t n)
{
    const uint8_t *sp = src;
    if (n >= 8 && n <= 16) {
        uint64_t a, b;
        memcpy(&a, sp, 8);
        memcpy(&b, sp + n - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + n - 8, &b, 8);
    } else if (n > 0) {
        memcpy(d, sp, n);
    }
}

/* Bytes from offset a on to offset b, going round the ring's end (a != b). */
static size_t ring_dist(const struct kv_events *e, size_t a, size_t b)
{
    return b > a ? b - a : e->max_bytes - a + b;
}

/* Drops the oldest event: reads its slot only, not its bytes. */
static inline void drop_oldest(struct kv_events *e)
{
    const struct kv_ev_slot *s = &e->slot[e->head];
    size_t next = e->head + 1 < e->max ? e->head + 1 : 0;
    if (s->rev + 1 > e->first)
        e->first = s->rev + 1;
    if (e->n == 1) {
        e->bytes = 0;
        e->wpos = 0;
    } else {
        e->bytes -= ring_dist(e, s->off, e->slot[next].off);
    }
    e->head = next;
    e->n--;
    e->evicted++;
}

void kv__events_reset(struct kv_events *e, uint64_t first)
{
    while (e->n > 0) {
        drop_oldest(e);
        e->evicted--; /* not dropped for room */
    }
    e->first = first;
}

void kv__events_free(struct kv_events *e)
{
    kv__events_reset(e, 0);
    tk_free(e->slot);
    e->slot = NULL;
    kv__unmap(e->buf, e->max_bytes);
    e->buf = NULL;
}

/* The offset where size bytes would go in buf without overwriting a held
 * event's, or SIZE_MAX: at wpos, or at 0 when they do not fit before the
 * end. Held bytes are [oldest, wpos) or, wrapped, [oldest, end) and
 * [0, wpos). */
static size_t place(const struct kv_events *e, size_t size)
{
    if (e->n == 0)
        return 0; /* wpos is 0 */
    size_t oldest = e->slot[e->head].off;
    if (oldest < e->wpos) {
        if (size <= e->max_bytes - e->wpos)
            return e->wpos;
        return size <= oldest ? 0 : SIZE_MAX;
    }
    return size <= oldest - e->wpos ? e->wpos : SIZE_MAX;
}

/* Makes room for an event of size bytes at revision rev, dropping the
 * oldest events, and returns where it goes in buf; NULL if it can never be
 * held (its revision is then lost). */
static uint8_t *make_room(struct kv_events *e, uint64_t rev, size_t size)
{
    if (size > e->max_bytes) {
        while (e->n > 0)
            drop_oldest(e); /* below the new first: not readable any more */
        if (rev + 1 > e->first)
            e->first = rev + 1;
        e->evicted++;
        return NULL;
    }
    if (e->n == e->max) /* never more than max */
        drop_oldest(e);
    size_t off;
    while ((off = place(e, size)) == SIZE_MAX)
        drop_oldest(e); /* place never fails on an empty ring */
    /* What the ring now uses: the event, and the end it skipped if it
     * starts again at 0. */
    e->bytes += (off == e->wpos ? 0 : e->max_bytes - e->wpos) + size;
    struct kv_ev_slot *s = at(e, e->n);
    s->rev = rev;
    s->off = off;
    e->n++;
    e->wpos = off + size;
    /* The next events' lines were written a ring ago and are cold: start
     * taking them now, so the copies of a later apply do not wait. */
    if (e->wpos + EV_AHEAD < e->max_bytes)
        __builtin_prefetch(e->buf + e->wpos + EV_AHEAD, 1, 3);
    return e->buf + off;
}

/* Records one event: st (NULL or not live: none) is the key's new state,
 * prev (NULL: none; else live) its previous one, attached to prev_lease.
 * Its header and data are written straight into their place in buf. */
static void record(struct kv_events *e, uint64_t index, int type, const uint8_t *key,
                   size_t len, const struct kv_state *st, const struct kv_state *prev,
                   uint64_t prev_lease)
{
    bool live = st != NULL && st->live;
    size_t value_len = live ? st->value_len : 0;
    size_t prev_len = prev != NULL ? prev->value_len : 0;
    unsigned flags = live ? KV_EV_LIVE : 0;
    size_t words = live ? 2 : 0;
    if (prev != NULL) {
        flags |= KV_EV_PREV;
        words++;
        if (!live || prev->version + 1 != st->version) {
            flags |= KV_EV_PREV_VERSION;
            words++;
        }
        if (!live || prev->create_rev != st->create_rev) {
            flags |= KV_EV_PREV_CREATE;
            words++;
        }
        if (prev_lease != 0) {
            flags |= KV_EV_PREV_LEASE;
            words++;
        }
    }
    size_t size = (EV_HDR + 8 * words + len + value_len + prev_len + 7) & ~(size_t)7;
    uint8_t *p = make_room(e, index, size);
    if (p == NULL)
        return;
    struct kv_ev *v = (struct kv_ev *)(void *)p;
    v->type = (uint8_t)type;
    v->flags = (uint8_t)flags;
    v->key_len = (uint16_t)len;
    v->value_len = (uint32_t)value_len;
    v->prev_len = (uint32_t)prev_len;
    uint64_t *w = v->w;
    if (live) {
        *w++ = st->version;
        *w++ = st->create_rev;
    }
    if (prev != NULL) {
        *w++ = prev->mod_rev;
        if (flags & KV_EV_PREV_VERSION)
            *w++ = prev->version;
        if (flags & KV_EV_PREV_CREATE)
            *w++ = prev->create_rev;
        if (flags & KV_EV_PREV_LEASE)
            *w++ = prev_lease;
    }
    uint8_t *d = (uint8_t *)w;
    copy(d, key, len);
    if (value_len > 0)
        copy(d + len, st->value, value_len);
    if (prev_len > 0)
        copy(d + len + value_len, prev->value, prev_len);
}

void kv__events_write_prev(struct kv_sm *sm, uint64_t index, const uint8_t *key,
                           size_t len, const struct kv_state *st,
                           const struct kv_state *prev)
{
    if (st->live && st->expire_ms != 0)
        kv__ttl_push(&sm->ttl, key, len, st->expire_ms);
    struct kv_events *e = &sm->events;
    if (e->max == 0)
        return;
    int type = st->live ? KV_EVENT_PUT : sm->expiring ? KV_EVENT_EXPIRE : KV_EVENT_DELETE;
    bool prev_live = prev->live;
    /* The callers write the event before they attach the key to its new
     * lease: the table still has the old one. */
    uint64_t prev_lease = prev_live && sm->leases.count > 0
                              ? kv__lease_of(sm, key, len, kv__hash(key, len))
                              : 0;
    if (prev_live && !sm->expiring && !kv__live(sm, prev->expire_ms)) {
        /* A write over a key whose TTL ran out before its expire command
         * came: the old version's expire comes first, at this revision. */
        record(e, index, KV_EVENT_EXPIRE, key, len, NULL, prev, prev_lease);
        prev_live = false;
    }
    record(e, index, type, key, len, st, prev_live ? prev : NULL, prev_lease);
}

void kv__events_write(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                      uint64_t hash, const struct kv_state *st)
{
    struct kv_state prev = {.live = false};
    /* Only if events are kept: the command looked the key up already, so
     * this lookup fails only if the cold tier just failed: the event then
     * goes without its prev. */
    if (sm->events.max != 0 && kv__state_lookup_raw(sm, key, len, hash, &prev) != 0)
        prev.live = false;
    kv__events_write_prev(sm, index, key, len, st, &prev);
}

uint64_t kv_sm_events_first(const struct kv_sm *sm)
{
    return sm->events.first;
}

/* The position of the first held event with revision >= rev (n if none). */
static size_t seek(const struct kv_events *e, uint64_t rev)
{
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (at(e, mid)->rev < rev)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void emit(const struct kv_events *e, const struct kv_ev_slot *s, kv_event_cb *cb,
                 void *data)
{
    const struct kv_ev *v = hdr_of(e, s);
    struct kv_event ev = {
        .revision = s->rev,
        .type = v->type,
        .key_len = v->key_len,
        .value_len = v->value_len,
        .has_prev = (v->flags & KV_EV_PREV) != 0,
        .prev_value_len = v->prev_len,
    };
    const uint64_t *w = v->w;
    if (v->flags & KV_EV_LIVE) {
        ev.version = *w++;
        ev.create_revision = *w++;
    }
    if (v->flags & KV_EV_PREV) {
        ev.prev_mod_revision = *w++;
        ev.prev_version = v->flags & KV_EV_PREV_VERSION ? *w++ : ev.version - 1;
        ev.prev_create_revision =
            v->flags & KV_EV_PREV_CREATE ? *w++ : ev.create_revision;
        ev.prev_lease = v->flags & KV_EV_PREV_LEASE ? *w++ : 0;
    }
    const uint8_t *d = (const uint8_t *)w;
    ev.key = d;
    ev.value = d + v->key_len;
    ev.prev_value = d + v->key_len + v->value_len;
    cb(&ev, data);
}

int kv_sm_events_read(struct kv_sm *sm, uint64_t from, size_t max, size_t max_bytes,
                      kv_event_cb *cb, void *data, uint64_t *next)
{
    const struct kv_events *e = &sm->events;
    if (from < e->first)
        return TK_ECOMPACTED;
    size_t passed = 0, bytes = 0;
    for (size_t i = seek(e, from); i < e->n; i++) {
        const struct kv_ev_slot *s = at(e, i);
        if ((passed >= max || (max_bytes != 0 && bytes >= max_bytes)) &&
            s->rev != at(e, i - 1)->rev) {
            *next = s->rev;
            return 0;
        }
        emit(e, s, cb, data);
        const struct kv_ev *v = hdr_of(e, s);
        passed++;
        bytes += v->key_len + v->value_len + v->prev_len;
    }
    *next = from > sm->applied + 1 ? from : sm->applied + 1;
    return 0;
}

void kv_sm_events_stats(const struct kv_sm *sm, struct kv_events_stats *out)
{
    out->count = sm->events.n;
    out->bytes = sm->events.bytes;
    out->evicted = sm->events.evicted;
}
