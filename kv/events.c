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
 * not readable at all. The events' data go into a byte ring (struct
 * kv_events), so recording an event allocates nothing. Owner thread only.
 * Calls state.c (the previous state) and ttl.c. */
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "kv/sm_internal.h"

#define EV_OVERHEAD sizeof(struct kv_ev)

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

static struct kv_ev *at(const struct kv_events *e, size_t i)
{
    return &e->slot[(e->head + i) % e->max];
}

static size_t ev_bytes(const struct kv_ev *v)
{
    return EV_OVERHEAD + v->key_len + v->value_len + v->prev_len;
}

static void drop_oldest(struct kv_events *e)
{
    struct kv_ev *v = at(e, 0);
    if (v->rev + 1 > e->first)
        e->first = v->rev + 1;
    e->bytes -= ev_bytes(v);
    v->data = NULL;
    e->head = (e->head + 1) % e->max;
    e->n--;
    e->evicted++;
    if (e->n == 0)
        e->wpos = 0;
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

/* Where len bytes of data would go in buf without overwriting a held
 * event's, or NULL: they go at wpos, or at 0 when they do not fit before
 * the end. Held data is [oldest, wpos) or, wrapped, [oldest, end) and
 * [0, wpos). */
static uint8_t *place(const struct kv_events *e, size_t len)
{
    if (e->n == 0)
        return e->buf; /* wpos is 0 */
    size_t oldest = (size_t)(at(e, 0)->data - e->buf);
    if (oldest < e->wpos) {
        if (len <= e->max_bytes - e->wpos)
            return e->buf + e->wpos;
        return len <= oldest ? e->buf : NULL;
    }
    return len <= oldest - e->wpos ? e->buf + e->wpos : NULL;
}

/* Makes room for v, dropping the oldest events, and sets v->data to its
 * place in buf; false if v can never be held (its revision is then lost). */
static bool make_room(struct kv_events *e, struct kv_ev *v)
{
    size_t b = ev_bytes(v), len = b - EV_OVERHEAD;
    while (e->n > 0 && (e->n == e->max || e->bytes + b > e->max_bytes))
        drop_oldest(e);
    if (b > e->max_bytes) {
        if (v->rev + 1 > e->first)
            e->first = v->rev + 1;
        e->evicted++;
        return false;
    }
    while ((v->data = place(e, len)) == NULL)
        drop_oldest(e); /* place never fails on an empty ring */
    return true;
}

/* Appends v, whose data are already in place. */
static void push(struct kv_events *e, const struct kv_ev *v)
{
    *at(e, e->n) = *v;
    e->n++;
    e->bytes += ev_bytes(v);
    e->wpos = (size_t)(v->data - e->buf) + (ev_bytes(v) - EV_OVERHEAD);
}

/* Records one event: st (NULL or not live: none) is the key's new state,
 * prev (if live) its previous one. */
static void record(struct kv_events *e, uint64_t index, int type, const uint8_t *key,
                   size_t len, const struct kv_state *st, const struct kv_state *prev)
{
    struct kv_ev v = {.rev = index, .type = (uint8_t)type, .key_len = (uint16_t)len};
    bool live = st != NULL && st->live;
    if (live) {
        v.value_len = (uint32_t)st->value_len;
        v.version = st->version;
        v.create_rev = st->create_rev;
    }
    if (prev->live) {
        v.has_prev = true;
        v.prev_len = (uint32_t)prev->value_len;
        v.prev_version = prev->version;
        v.prev_create_rev = prev->create_rev;
        v.prev_mod_rev = prev->mod_rev;
    }
    if (!make_room(e, &v))
        return;
    memcpy(v.data, key, len);
    if (v.value_len > 0)
        memcpy(v.data + len, st->value, v.value_len);
    if (v.prev_len > 0)
        memcpy(v.data + len + v.value_len, prev->value, v.prev_len);
    push(e, &v);
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
    if (prev_live && !sm->expiring && !kv__live(sm, prev->expire_ms)) {
        /* A write over a key whose TTL ran out before its expire command
         * came: the old version's expire comes first, at this revision. */
        record(e, index, KV_EVENT_EXPIRE, key, len, NULL, prev);
        prev_live = false;
    }
    struct kv_state none = {.live = false};
    record(e, index, type, key, len, st, prev_live ? prev : &none);
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

static void emit(const struct kv_ev *v, kv_event_cb *cb, void *data)
{
    struct kv_event ev = {
        .revision = v->rev,
        .type = v->type,
        .key = v->data,
        .key_len = v->key_len,
        .value = v->data + v->key_len,
        .value_len = v->value_len,
        .version = v->version,
        .create_revision = v->create_rev,
        .has_prev = v->has_prev,
        .prev_value = v->data + v->key_len + v->value_len,
        .prev_value_len = v->prev_len,
        .prev_version = v->prev_version,
        .prev_create_revision = v->prev_create_rev,
        .prev_mod_revision = v->prev_mod_rev,
    };
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
        const struct kv_ev *v = at(e, i);
        if ((passed >= max || (max_bytes != 0 && bytes >= max_bytes)) &&
            v->rev != at(e, i - 1)->rev) {
            *next = v->rev;
            return 0;
        }
        emit(v, cb, data);
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
