/* The exactly-once table: (client, seq) -> the encoded result of the command
 * that carried them, so a retried command is answered, not applied again.
 *
 * An open-addressing hash table (linear probing, backward-shift deletion) of at
 * most sessions_max entries, with a FIFO of their ids in insertion (= index)
 * order: when full, the oldest is forgotten first, as the cold tier forgets
 * them on commit. A session is also a ring record (KV_REC_SESSION, key =
 * client||seq big-endian), so tier-down writes it to the cold tier, which
 * rebuilds the table on open and after installing a snapshot. Owner thread
 * only. Called by cmd.c (answer and record), sm.c (init, destroy, recovery)
 * and snapshot.c (clear, reload); calls codec.c and the ring. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "kv/sm_internal.h"

#define SESS_AHEAD 4 /* adds: how far ahead to prefetch the entry to forget */

/* The home slot of (client, seq): murmur3's 64-bit finalizer over the two
 * (a few multiplies, inline; XXH3 was a call of about 40 instructions, and
 * an idempotent command hashes about 4 entries: its lookup, its add, the
 * forgotten one and the entries shifted back after it). Slots are never
 * stored: the table is rebuilt from the records at open. */
static size_t sess_slot(const struct kv_sessions *t, uint64_t client, uint64_t seq)
{
    uint64_t h = client ^ (seq * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (size_t)(h & t->mask);
}

/* Where s's encoded result is: in the entry when it is short (no allocation
 * for a put's), else allocated. */
static const uint8_t *sess_res(const struct kv_sess *s)
{
    return s->len <= KV_SESS_INLINE ? s->r.in : s->r.res;
}

static void sess_res_free(struct kv_sess *s)
{
    if (s->len > KV_SESS_INLINE)
        tk_free(s->r.res);
}

static struct kv_sess *sess_find(struct kv_sessions *t, uint64_t client, uint64_t seq)
{
    if (t->count == 0)
        return NULL;
    for (size_t i = sess_slot(t, client, seq);; i = (i + 1) & t->mask) {
        struct kv_sess *s = &t->tab[i];
        if (s->client == 0)
            return NULL;
        if (s->client == client && s->seq == seq)
            return s;
    }
}

static void sess_remove(struct kv_sessions *t, uint64_t client, uint64_t seq)
{
    struct kv_sess *s = sess_find(t, client, seq);
    if (s == NULL)
        return;
    sess_res_free(s);
    t->res_bytes -= s->len;
    size_t i = (size_t)(s - t->tab);
    s->client = 0;
    t->count--;
    /* Backward-shift deletion keeps linear probing chains intact. */
    for (size_t j = (i + 1) & t->mask; t->tab[j].client != 0; j = (j + 1) & t->mask) {
        size_t home = sess_slot(t, t->tab[j].client, t->tab[j].seq);
        bool move = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (move) {
            t->tab[i] = t->tab[j];
            t->tab[j].client = 0;
            i = j;
        }
    }
}

static void sess_add(struct kv_sessions *t, uint64_t index, uint64_t client, uint64_t seq,
                     const uint8_t *res, size_t len)
{
    if (t->max == 0)
        return;
    if (t->count == t->max) {
        struct kv_sess_id *old = &t->fifo[t->fifo_head];
        sess_remove(t, old->client, old->seq);
        t->fifo_head = t->fifo_head + 1 < t->max ? t->fifo_head + 1 : 0;
        t->fifo_len--;
        /* The entry a later add forgets: its slot is a random one, start
         * loading it now (it may shift before then: only a hint). */
        if (t->fifo_len > SESS_AHEAD) {
            size_t a = t->fifo_head + SESS_AHEAD;
            const struct kv_sess_id *next = &t->fifo[a < t->max ? a : a - t->max];
            __builtin_prefetch(&t->tab[sess_slot(t, next->client, next->seq)], 0, 3);
        }
    }
    size_t i = sess_slot(t, client, seq);
    while (t->tab[i].client != 0)
        i = (i + 1) & t->mask;
    struct kv_sess *s = &t->tab[i];
    s->client = client;
    s->seq = seq;
    s->index = index;
    s->len = (uint32_t)len;
    if (len > KV_SESS_INLINE)
        s->r.res = tk_malloc(len);
    memcpy(len > KV_SESS_INLINE ? s->r.res : s->r.in, res, len);
    t->res_bytes += len;
    t->count++;
    size_t tail = t->fifo_head + t->fifo_len;
    t->fifo[tail < t->max ? tail : tail - t->max] = (struct kv_sess_id){client, seq};
    t->fifo_len++;
}

void kv__sess_init(struct kv_sessions *t, size_t max)
{
    memset(t, 0, sizeof(*t));
    t->max = max;
    size_t n = 16;
    while (n < max * 2)
        n *= 2;
    t->mask = n - 1;
    t->tab = tk_calloc(n, sizeof(*t->tab));
    t->fifo = tk_calloc(max > 0 ? max : 1, sizeof(*t->fifo));
}

void kv__sess_destroy(struct kv_sessions *t)
{
    if (t->tab != NULL) {
        for (size_t i = 0; i <= t->mask; i++)
            if (t->tab[i].client != 0)
                sess_res_free(&t->tab[i]);
    }
    tk_free(t->tab);
    tk_free(t->fifo);
    memset(t, 0, sizeof(*t));
}

int kv__sess_load(uint64_t index, uint64_t client, uint64_t seq, const uint8_t *res,
                  size_t len, void *data)
{
    if (client == 0 || len > KV_RESULT_ENCODED_MAX)
        return TK_ECORRUPT;
    sess_add(data, index, client, seq, res, len);
    return 0;
}

void kv__sess_clear(struct kv_sessions *t)
{
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->tab[i].client != 0) {
            sess_res_free(&t->tab[i]);
            t->tab[i].client = 0;
        }
    }
    t->count = 0;
    t->res_bytes = 0;
    t->fifo_head = t->fifo_len = 0;
}

bool kv__sess_answer(struct kv_sm *sm, uint64_t client, uint64_t seq,
                     struct kv_result *res)
{
    struct kv_sess *dup = sess_find(&sm->sessions, client, seq);
    if (dup == NULL)
        return false;
    int rc = kv_result_decode(sess_res(dup), dup->len, res);
    TK_ASSERT(rc == 0); /* we encoded it */
    res->duplicate = true;
    return true;
}

void kv__sess_record(struct kv_sm *sm, uint64_t index, uint64_t client, uint64_t seq,
                     const struct kv_result *res)
{
    uint8_t enc[KV_RESULT_ENCODED_MAX];
    size_t len = kv_result_encode(res, enc);
    uint8_t key[16];
    for (int i = 0; i < 8; i++) {
        key[i] = (uint8_t)(client >> (56 - 8 * i));
        key[8 + i] = (uint8_t)(seq >> (56 - 8 * i));
    }
    struct kv_rec h = {.flags = KV_REC_SESSION,
                       .key_len = 16,
                       .value_len = (uint32_t)len,
                       .mod_rev = index};
    kv__ring_append(&sm->ring, &h, key, enc);
    sess_add(&sm->sessions, index, client, seq, enc, len);
}
