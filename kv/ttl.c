/* Keys with a TTL, for the leader's expire commands.
 *
 * A min-heap on expire time of (expire_ms, key): events.c pushes every
 * version written with a TTL, kv__ttl_load the cold tier's ("exp") at open
 * and after an install (the log's replay pushes the rest). An entry is
 * stale once its key has been deleted or rewritten with another expire
 * time; stale entries are dropped when they reach the top. At most ttl.max
 * entries: past that a key is not tracked (counted in `dropped`) and expires
 * only lazily, at read. kv_sm_expired pops the due entries, checks each
 * against the key's state and pushes the valid ones back, so a key stays
 * listed until an expire command deletes it. Owner thread only. Calls
 * state.c and the cold tier. */
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "kv/sm_internal.h"

void kv__ttl_init(struct kv_ttl *t, size_t max)
{
    memset(t, 0, sizeof(*t));
    t->max = max;
}

void kv__ttl_free(struct kv_ttl *t)
{
    for (size_t i = 0; i < t->n; i++)
        tk_free(t->h[i].key);
    tk_free(t->h);
    t->h = NULL;
    t->n = t->cap = 0;
}

static void swap(struct kv_ttl_ent *a, struct kv_ttl_ent *b)
{
    struct kv_ttl_ent x = *a;
    *a = *b;
    *b = x;
}

static void sift_up(struct kv_ttl *t, size_t i)
{
    while (i > 0 && t->h[(i - 1) / 2].expire_ms > t->h[i].expire_ms) {
        swap(&t->h[(i - 1) / 2], &t->h[i]);
        i = (i - 1) / 2;
    }
}

static void sift_down(struct kv_ttl *t, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < t->n && t->h[l].expire_ms < t->h[m].expire_ms)
            m = l;
        if (l + 1 < t->n && t->h[l + 1].expire_ms < t->h[m].expire_ms)
            m = l + 1;
        if (m == i)
            return;
        swap(&t->h[m], &t->h[i]);
        i = m;
    }
}

static void push_ent(struct kv_ttl *t, struct kv_ttl_ent ent)
{
    t->h = kv__grow(t->h, t->n, &t->cap, 64, sizeof(*t->h));
    t->h[t->n] = ent;
    sift_up(t, t->n++);
}

static struct kv_ttl_ent pop_ent(struct kv_ttl *t)
{
    struct kv_ttl_ent top = t->h[0];
    t->h[0] = t->h[--t->n];
    sift_down(t, 0);
    return top;
}

void kv__ttl_push(struct kv_ttl *t, const uint8_t *key, size_t len, uint64_t expire_ms)
{
    if (t->n >= t->max) {
        t->dropped++;
        return;
    }
    uint8_t *k = tk_malloc(len > 0 ? len : 1);
    memcpy(k, key, len);
    push_ent(t, (struct kv_ttl_ent){.expire_ms = expire_ms, .key = k, .key_len = len});
}

int kv__ttl_load_one(uint64_t expire_ms, const uint8_t *key, size_t len, void *data)
{
    kv__ttl_push(data, key, len, expire_ms);
    return 0;
}

int kv__ttl_load(struct kv_sm *sm)
{
    kv__ttl_free(&sm->ttl);
    int rc = kv__cold_expiring(sm->cold, kv__ttl_load_one, &sm->ttl);
    return rc == 0 ? 0 : TK_EIO;
}

long kv_sm_expired(struct kv_sm *sm, uint64_t now_ms, size_t max, kv_key_cb *cb,
                   void *data)
{
    struct kv_ttl *t = &sm->ttl;
    struct kv_ttl_ent due[64];
    size_t n_due = 0;
    long passed = 0;
    int rc = 0;
    while (t->n > 0 && t->h[0].expire_ms <= now_ms && (size_t)passed < max) {
        struct kv_ttl_ent e = pop_ent(t);
        struct kv_state st;
        rc = kv__state_lookup_raw(sm, e.key, e.key_len, kv__hash(e.key, e.key_len), &st);
        if (rc != 0 || !st.live || st.expire_ms != e.expire_ms) {
            tk_free(e.key); /* stale: deleted or rewritten since */
            if (rc != 0)
                break;
            continue;
        }
        cb(e.key, e.key_len, data);
        passed++;
        due[n_due++] = e;
        if (n_due == sizeof(due) / sizeof(due[0])) {
            for (size_t i = 0; i < n_due; i++)
                push_ent(t, due[i]);
            n_due = 0;
            break; /* at most 64 a call: the rest are the next call's */
        }
    }
    for (size_t i = 0; i < n_due; i++)
        push_ent(t, due[i]);
    return rc != 0 ? TK_EIO : passed;
}
