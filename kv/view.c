/* The ordered view: every key that is in the hash index, in byte order, as a
 * B+tree of key copies. Scans seek it and walk its leaves (a linked list, in
 * order) while merging with the cold tier's cursor. A key enters when the index
 * gains it and leaves when tier-down drops its index entry, so overwrites (the
 * common write) never touch the view.
 *
 * Leaves hold up to KV_VLEAF_MAX keys, each with its first 16 bytes inline, so
 * a scan reads consecutive keys from a few cache lines instead of chasing one
 * node per key. Inner nodes hold separator keys (their own copies). Removal
 * does not merge half-empty nodes; a node goes when its last key or child
 * does, and a root with one child is collapsed. Nodes are fixed-size and come
 * from a free list refilled in chunks, so inserts in a view of steady size
 * allocate nothing (keys longer than 16 bytes keep a heap copy). Owner thread
 * only. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/endian.h"
#include "kv/kv_internal.h"

#define INL_BYTES 16
#define CHUNK_NODES 64

union vnode {
    struct kv_vleaf leaf;
    struct kv_vinner inner;
    union vnode *free_next;
};

int kv__keycmp(const void *a, size_t alen, const void *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen, i = 0;
    const uint8_t *x = a, *y = b;
    for (; i + 8 <= n; i += 8) { /* short keys compare without a call */
        uint64_t wx = tk_get_be64(x + i), wy = tk_get_be64(y + i);
        if (wx != wy)
            return wx < wy ? -1 : 1;
    }
    int c = n > i ? memcmp(x + i, y + i, n - i) : 0;
    if (c != 0)
        return c;
    return alen < blen ? -1 : (alen > blen ? 1 : 0);
}

/* A key being looked for, with its first 16 bytes as big-endian words. */
struct probe {
    uint64_t w0, w1;
    const uint8_t *key;
    size_t len;
};

static void probe_init(struct probe *p, const void *key, size_t len)
{
    uint8_t inl[INL_BYTES] = {0};
    if (len > 0) /* a scan from the start passes (NULL, 0) */
        memcpy(inl, key, len < INL_BYTES ? len : INL_BYTES);
    p->w0 = tk_get_be64(inl);
    p->w1 = tk_get_be64(inl + 8);
    p->key = key;
    p->len = len;
}

/* Compares a stored key with the probe. The zero-padded 16-byte prefixes
 * order keys as their bytes do whenever they differ; when they are equal and
 * both keys fit inline, the shorter key is the smaller. */
static int vcmp(const struct kv_vent *e, const struct probe *p)
{
    uint64_t a0 = tk_get_be64(e->inl);
    if (a0 != p->w0)
        return a0 < p->w0 ? -1 : 1;
    uint64_t a1 = tk_get_be64(e->inl + 8);
    if (a1 != p->w1)
        return a1 < p->w1 ? -1 : 1;
    if (e->len <= INL_BYTES && p->len <= INL_BYTES)
        return e->len < p->len ? -1 : (e->len > p->len ? 1 : 0);
    return kv__keycmp(e->len > INL_BYTES ? e->ext : e->inl, e->len, p->key, p->len);
}

static void vent_set(struct kv_vent *e, const void *key, size_t len)
{
    memset(e->inl, 0, sizeof(e->inl));
    if (len > 0)
        memcpy(e->inl, key, len < INL_BYTES ? len : INL_BYTES);
    e->len = (uint32_t)len;
    e->ext = NULL;
    if (len > INL_BYTES) {
        e->ext = tk_malloc(len);
        memcpy(e->ext, key, len);
    }
}

static void vent_copy(struct kv_vent *dst, const struct kv_vent *src)
{
    vent_set(dst, src->len > INL_BYTES ? src->ext : src->inl, src->len);
}

static void vent_clear(struct kv_vent *e)
{
    tk_free(e->ext);
    e->ext = NULL;
}

/* ---- nodes ---- */

static union vnode *node_get(struct kv_view *v)
{
    if (v->free_nodes == NULL) {
        union vnode *c = tk_malloc(CHUNK_NODES * sizeof(*c));
        v->chunks = tk_realloc(v->chunks, (v->n_chunks + 1) * sizeof(*v->chunks));
        v->chunks[v->n_chunks++] = c;
        for (size_t i = CHUNK_NODES; i-- > 0;) {
            c[i].free_next = v->free_nodes;
            v->free_nodes = &c[i];
        }
    }
    union vnode *n = v->free_nodes;
    v->free_nodes = n->free_next;
    return n;
}

static void node_put(struct kv_view *v, void *node)
{
    union vnode *n = node;
    n->free_next = v->free_nodes;
    v->free_nodes = n;
}

static struct kv_vleaf *leaf_new(struct kv_view *v)
{
    struct kv_vleaf *l = &node_get(v)->leaf;
    l->n = 0;
    l->prev = l->next = NULL;
    return l;
}

void kv__view_init(struct kv_view *v)
{
    memset(v, 0, sizeof(*v));
    v->root = leaf_new(v);
}

static void free_tree(void *node, uint32_t height)
{
    if (height == 0) {
        struct kv_vleaf *l = node;
        for (uint32_t i = 0; i < l->n; i++)
            vent_clear(&l->e[i]);
        return;
    }
    struct kv_vinner *in = node;
    for (uint32_t i = 0; i < in->n; i++) {
        if (i > 0)
            vent_clear(&in->sep[i]);
        free_tree(in->child[i], height - 1);
    }
}

void kv__view_free(struct kv_view *v)
{
    if (v->root != NULL)
        free_tree(v->root, v->height);
    for (size_t i = 0; i < v->n_chunks; i++)
        tk_free(v->chunks[i]);
    tk_free(v->chunks);
    memset(v, 0, sizeof(*v));
}

/* ---- search ---- */

/* The child of `in` whose range holds the probe: the last i with i == 0 or
 * sep[i] <= probe. */
static uint32_t inner_pick(const struct kv_vinner *in, const struct probe *p)
{
    uint32_t lo = 1, hi = in->n; /* answer in [lo - 1, hi - 1] */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (vcmp(&in->sep[mid], p) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

/* The first i with e[i] >= probe; *eq when e[i] == probe. */
static uint32_t leaf_lower(const struct kv_vleaf *l, const struct probe *p, bool *eq)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (vcmp(&l->e[mid], p) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *eq = lo < l->n && vcmp(&l->e[lo], p) == 0;
    return lo;
}

struct path {
    struct kv_vinner *node[KV_VIEW_DEPTH_MAX];
    uint32_t at[KV_VIEW_DEPTH_MAX];
};

/* Descends to the leaf whose range holds the probe, noting the way. */
static struct kv_vleaf *descend(const struct kv_view *v, const struct probe *p,
                                struct path *path)
{
    void *n = v->root;
    for (uint32_t h = v->height; h > 0; h--) {
        struct kv_vinner *in = n;
        uint32_t c = inner_pick(in, p);
        if (path != NULL) {
            path->node[h - 1] = in;
            path->at[h - 1] = c;
        }
        n = in->child[c];
    }
    return n;
}

/* The leaf whose range holds key (the way noted in path, which may be NULL)
 * and in *at key's slot there, or the slot it would take (*eq says which). */
static inline struct kv_vleaf *locate(const struct kv_view *v, const void *key,
                                      size_t len, struct path *path, uint32_t *at,
                                      bool *eq)
{
    struct probe p;
    probe_init(&p, key, len);
    struct kv_vleaf *l = descend(v, &p, path);
    *at = leaf_lower(l, &p, eq);
    return l;
}

void kv__view_seek(const struct kv_view *v, const void *key, size_t len,
                   struct kv_view_it *it)
{
    bool eq;
    uint32_t i;
    const struct kv_vleaf *l = locate(v, key, len, NULL, &i, &eq);
    if (i == l->n) {
        l = l->next;
        i = 0;
    }
    it->leaf = l;
    it->i = i;
}

/* ---- insert ---- */

/* Puts (sep, right) into the parent at level h of the path, just after the
 * child that was split; splits upwards as needed. Takes sep's key copy. Not
 * inlined (a split is the rare path): inlined into kv__view_insert under
 * -fvisibility=hidden, gcc -O2 cannot see that descend filled
 * path[0..height) and warns (maybe-uninitialized, array-bounds). */
__attribute__((noinline)) static void insert_up(struct kv_view *v, struct path *path,
                                                uint32_t h, struct kv_vent sep,
                                                void *right)
{
    for (;; h++) {
        if (h == v->height) { /* the root split: a new root above it */
            TK_ASSERT(v->height + 1 < KV_VIEW_DEPTH_MAX);
            struct kv_vinner *r = &node_get(v)->inner;
            r->n = 2;
            r->child[0] = v->root;
            r->child[1] = right;
            r->sep[1] = sep;
            v->root = r;
            v->height++;
            return;
        }
        struct kv_vinner *in = path->node[h];
        uint32_t at = path->at[h] + 1; /* where (sep, right) goes */
        if (in->n < KV_VINNER_MAX) {
            memmove(&in->sep[at + 1], &in->sep[at], (in->n - at) * sizeof(in->sep[0]));
            memmove(&in->child[at + 1], &in->child[at],
                    (in->n - at) * sizeof(in->child[0]));
            in->sep[at] = sep;
            in->child[at] = right;
            in->n++;
            return;
        }
        /* Split: the KV_VINNER_MAX + 1 children, in order, go half to the
         * left node and half to a new right one; the right one's first
         * separator moves up. */
        struct kv_vent seps[KV_VINNER_MAX + 1];
        void *kids[KV_VINNER_MAX + 1];
        memcpy(seps, in->sep, at * sizeof(seps[0]));
        memcpy(kids, in->child, at * sizeof(kids[0]));
        seps[at] = sep;
        kids[at] = right;
        memcpy(&seps[at + 1], &in->sep[at], (in->n - at) * sizeof(seps[0]));
        memcpy(&kids[at + 1], &in->child[at], (in->n - at) * sizeof(kids[0]));
        uint32_t total = KV_VINNER_MAX + 1, nl = total / 2;
        struct kv_vinner *r = &node_get(v)->inner;
        in->n = nl;
        memcpy(in->sep, seps, nl * sizeof(seps[0]));
        memcpy(in->child, kids, nl * sizeof(kids[0]));
        r->n = total - nl;
        memcpy(r->sep, &seps[nl], r->n * sizeof(seps[0]));
        memcpy(r->child, &kids[nl], r->n * sizeof(kids[0]));
        sep = r->sep[0]; /* moves up; r->sep[0] is unused from now on */
        memset(&r->sep[0], 0, sizeof(r->sep[0]));
        right = r;
    }
}

void kv__view_insert(struct kv_view *v, const void *key, size_t len)
{
    struct path path;
    bool eq;
    uint32_t at;
    struct kv_vleaf *l = locate(v, key, len, &path, &at, &eq);
    if (eq)
        return;
    v->count++;
    if (l->n < KV_VLEAF_MAX) {
        memmove(&l->e[at + 1], &l->e[at], (l->n - at) * sizeof(l->e[0]));
        vent_set(&l->e[at], key, len);
        l->n++;
        return;
    }
    /* Split the full leaf: the upper half moves to a new leaf after it. A key
     * past the end of the last leaf (keys written in ascending order) starts
     * a leaf of its own instead, so such loads leave full leaves behind. */
    struct kv_vleaf *r = leaf_new(v);
    uint32_t nl =
        at == KV_VLEAF_MAX && l->next == NULL ? KV_VLEAF_MAX : (KV_VLEAF_MAX + 1) / 2;
    r->n = KV_VLEAF_MAX - nl;
    memcpy(r->e, &l->e[nl], r->n * sizeof(l->e[0]));
    l->n = nl;
    r->next = l->next;
    r->prev = l;
    if (l->next != NULL)
        l->next->prev = r;
    l->next = r;
    struct kv_vleaf *t = l;
    if (at > nl || at == KV_VLEAF_MAX) {
        t = r;
        at -= nl;
    }
    memmove(&t->e[at + 1], &t->e[at], (t->n - at) * sizeof(t->e[0]));
    vent_set(&t->e[at], key, len);
    t->n++;
    struct kv_vent sep;
    vent_copy(&sep, &r->e[0]);
    insert_up(v, &path, 0, sep, r);
}

/* ---- remove ---- */

/* Drops child `at` of the inner node at level h of the path (its subtree is
 * already empty and freed); an inner node left without children goes too. */
__attribute__((noinline)) static void remove_up(struct kv_view *v, struct path *path,
                                                uint32_t h) /* as insert_up */
{
    for (; h < v->height; h++) {
        struct kv_vinner *in = path->node[h];
        uint32_t at = path->at[h];
        if (in->n > 1) {
            /* The separator that goes is the child's own, or for child 0 that
             * of child 1, which becomes child 0 (whose separator is unused). */
            uint32_t s = at > 0 ? at : 1;
            vent_clear(&in->sep[s]);
            memmove(&in->sep[s], &in->sep[s + 1], (in->n - s - 1) * sizeof(in->sep[0]));
        }
        memmove(&in->child[at], &in->child[at + 1],
                (in->n - at - 1) * sizeof(in->child[0]));
        in->n--;
        if (in->n > 0)
            break;
        node_put(v, in); /* empty: remove it from its own parent */
    }
    TK_ASSERT(h < v->height); /* the root keeps at least one child */
    /* A root with one child is replaced by that child. */
    while (v->height > 0 && ((struct kv_vinner *)v->root)->n == 1) {
        struct kv_vinner *r = v->root;
        v->root = r->child[0];
        v->height--;
        node_put(v, r);
    }
}

void kv__view_remove(struct kv_view *v, const void *key, size_t len)
{
    struct path path;
    bool eq;
    uint32_t at;
    struct kv_vleaf *l = locate(v, key, len, &path, &at, &eq);
    if (!eq)
        return;
    vent_clear(&l->e[at]);
    memmove(&l->e[at], &l->e[at + 1], (l->n - at - 1) * sizeof(l->e[0]));
    l->n--;
    v->count--;
    if (l->n > 0 || v->height == 0)
        return;
    /* An empty leaf (not the root) leaves the list and the tree. */
    if (l->prev != NULL)
        l->prev->next = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    node_put(v, l);
    remove_up(v, &path, 0);
}

size_t kv__view_bytes(const struct kv_view *v)
{
    return v->n_chunks * CHUNK_NODES * sizeof(union vnode) + v->n_chunks * sizeof(void *);
}
