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
#include <xxhash.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "kv/sm_internal.h"

static size_t sess_slot(const struct kv_sessions *t, uint64_t client, uint64_t seq)
{
    return (size_t)(XXH3_64bits_withSeed(&seq, sizeof(seq), client) & t->mask);
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
    tk_free(s->res);
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
        t->fifo_head = (t->fifo_head + 1) % t->max;
        t->fifo_len--;
    }
    size_t i = sess_slot(t, client, seq);
    while (t->tab[i].client != 0)
        i = (i + 1) & t->mask;
    struct kv_sess *s = &t->tab[i];
    s->client = client;
    s->seq = seq;
    s->index = index;
    s->len = (uint32_t)len;
    s->res = tk_malloc(len > 0 ? len : 1);
    memcpy(s->res, res, len);
    t->res_bytes += len;
    t->count++;
    t->fifo[(t->fifo_head + t->fifo_len) % t->max] = (struct kv_sess_id){client, seq};
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
                tk_free(t->tab[i].res);
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
            tk_free(t->tab[i].res);
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
    int rc = kv_result_decode(dup->res, dup->len, res);
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
