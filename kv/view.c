/* The ordered view: every key that is in the hash index, in byte order, as a
 * skip list of key copies. Scans walk it and merge it with the cold tier's
 * cursor. A key enters when the index gains it and leaves when tier-down drops
 * its index entry, so overwrites (the common write) never touch the view.
 * Levels come from a private xorshift generator: the view's shape is not
 * replicated state. Owner thread only. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "kv/kv_internal.h"

int kv__keycmp(const void *a, size_t alen, const void *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n > 0 ? memcmp(a, b, n) : 0;
    if (c != 0)
        return c;
    return alen < blen ? -1 : (alen > blen ? 1 : 0);
}

static struct kv_vnode *node_new(uint32_t level, const void *key, size_t len)
{
    struct kv_vnode *n = tk_malloc(sizeof(*n) + level * sizeof(n->next[0]) + len);
    n->key_len = (uint32_t)len;
    n->level = level;
    n->key = (uint8_t *)&n->next[level];
    if (len > 0)
        memcpy(n->key, key, len);
    for (uint32_t i = 0; i < level; i++)
        n->next[i] = NULL;
    return n;
}

void kv__view_init(struct kv_view *v)
{
    memset(v, 0, sizeof(*v));
    v->head = node_new(KV_VIEW_LEVELS, NULL, 0);
    v->level = 1;
    v->rng = 0x9e3779b97f4a7c15ull;
}

void kv__view_free(struct kv_view *v)
{
    struct kv_vnode *n = v->head;
    while (n != NULL) {
        struct kv_vnode *next = n->next[0];
        tk_free(n);
        n = next;
    }
    memset(v, 0, sizeof(*v));
}

static uint32_t random_level(struct kv_view *v)
{
    v->rng ^= v->rng << 13;
    v->rng ^= v->rng >> 7;
    v->rng ^= v->rng << 17;
    uint64_t x = v->rng;
    uint32_t level = 1;
    while ((x & 3) == 0 && level < KV_VIEW_LEVELS) { /* p = 1/4 */
        level++;
        x >>= 2;
    }
    return level;
}

/* Fills update[] with the last node before key at each level. */
static struct kv_vnode *find_prev(const struct kv_view *v, const void *key, size_t len,
                                  struct kv_vnode **update)
{
    struct kv_vnode *x = v->head;
    for (int i = (int)v->level - 1; i >= 0; i--) {
        while (x->next[i] != NULL &&
               kv__keycmp(x->next[i]->key, x->next[i]->key_len, key, len) < 0)
            x = x->next[i];
        if (update != NULL)
            update[i] = x;
    }
    return x->next[0];
}

void kv__view_insert(struct kv_view *v, const void *key, size_t len)
{
    struct kv_vnode *update[KV_VIEW_LEVELS];
    struct kv_vnode *at = find_prev(v, key, len, update);
    if (at != NULL && kv__keycmp(at->key, at->key_len, key, len) == 0)
        return;
    uint32_t level = random_level(v);
    for (uint32_t i = v->level; i < level; i++)
        update[i] = v->head;
    if (level > v->level)
        v->level = level;
    struct kv_vnode *n = node_new(level, key, len);
    for (uint32_t i = 0; i < level; i++) {
        n->next[i] = update[i]->next[i];
        update[i]->next[i] = n;
    }
    v->count++;
}

void kv__view_remove(struct kv_view *v, const void *key, size_t len)
{
    struct kv_vnode *update[KV_VIEW_LEVELS];
    struct kv_vnode *at = find_prev(v, key, len, update);
    if (at == NULL || kv__keycmp(at->key, at->key_len, key, len) != 0)
        return;
    for (uint32_t i = 0; i < at->level; i++) {
        TK_ASSERT(update[i]->next[i] == at);
        update[i]->next[i] = at->next[i];
    }
    while (v->level > 1 && v->head->next[v->level - 1] == NULL)
        v->level--;
    tk_free(at);
    v->count--;
}

const struct kv_vnode *kv__view_seek(const struct kv_view *v, const void *key, size_t len)
{
    return find_prev(v, key, len, NULL);
}
