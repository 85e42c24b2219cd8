/* The commands: put (TTL, compare), delete, delete range/prefix, increment,
 * batch, transaction.
 *
 * Each command first validates everything it carries (sizes, enum values, op
 * kinds, op counts): a violation gives an error result and no change. Then it
 * runs its ops against a stage, one entry per key holding that key's state as
 * the command has made it so far, and only if every op succeeded are the
 * staged keys appended to the ring (a tombstone for a deleted key). Versions
 * count ops: each put or increment adds one, a delete resets the key. A
 * command with a client id is first looked up in the exactly-once table and,
 * once run, remembered there. Owner thread only. Called by sm.c (apply);
 * calls state.c (lookups, the rewrite check), sessions.c, iter.c (delete
 * range), the ring, index and view. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "kv/iter.h"

struct stage {
    const uint8_t *key;
    size_t key_len;
    uint64_t hash;
    struct kv_state st;   /* as the command has made it */
    struct kv_state prev; /* the key's state before the command, expired or
                             not: its change-log event's previous state */
    bool dirty;
    uint64_t lease; /* a put's lease (0: none, which detaches) */
    char num[24];   /* an increment's decimal value */
};

struct ctx {
    struct kv_sm *sm;
    uint64_t index;
    size_t n;
    size_t range_keys;                   /* live keys range compares looked at */
    struct stage st[2 * KV_TXN_OPS_MAX]; /* compares + ops */
};

static int check_key(const struct kv_sm *sm, const ProtobufCBinaryData *k)
{
    if (k->len == 0 || kv__lease_reserved(k->data, k->len))
        return TK_EINVAL;
    return k->len > sm->cfg.key_max ? TK_ETOOBIG : 0;
}

static int check_compare(const struct kv_sm *sm, const Kvpb__Compare *c)
{
    if (c == NULL)
        return TK_EINVAL;
    int rc = check_key(sm, &c->key);
    if (rc != 0)
        return rc;
    if ((int)c->target < 0 || (int)c->target > KVPB__COMPARE__TARGET__LEASE)
        return TK_EINVAL;
    if ((int)c->op < 0 || (int)c->op > KVPB__COMPARE__OP__GREATER)
        return TK_EINVAL;
    if (c->range_end.len > sm->cfg.key_max + 1)
        return TK_ETOOBIG;
    return c->value.len > sm->cfg.value_max ? TK_ETOOBIG : 0;
}

static int check_put(const struct kv_sm *sm, const Kvpb__Put *p, bool allow_cond)
{
    int rc = check_key(sm, &p->key);
    if (rc != 0)
        return rc;
    if (p->value.len > sm->cfg.value_max)
        return TK_ETOOBIG;
    if ((p->keep_value && p->value.len > 0) || (p->keep_lease && p->lease != 0))
        return TK_EINVAL;
    if (p->cond != NULL) {
        if (!allow_cond)
            return TK_EINVAL;
        rc = check_compare(sm, p->cond);
        if (rc == TK_EINVAL && p->cond->key.len == 0)
            rc = 0; /* an empty cond key means the put's key */
        if (rc != 0)
            return rc;
        if (p->cond->range_end.len > 0)
            return TK_EINVAL; /* a put's compare is on its key */
        if (p->cond->key.len != 0 &&
            (p->cond->key.len != p->key.len ||
             memcmp(p->cond->key.data, p->key.data, p->key.len) != 0))
            return TK_EINVAL;
    }
    return 0;
}

static int check_op(const struct kv_sm *sm, const Kvpb__Op *op, bool allow_incr)
{
    if (op == NULL)
        return TK_EINVAL;
    switch (op->op_case) {
    case KVPB__OP__OP_PUT:
        return op->put != NULL ? check_put(sm, op->put, false) : TK_EINVAL;
    case KVPB__OP__OP_DEL:
        return op->del != NULL ? check_key(sm, &op->del->key) : TK_EINVAL;
    case KVPB__OP__OP_INCR:
        if (!allow_incr || op->incr == NULL)
            return TK_EINVAL;
        return check_key(sm, &op->incr->key);
    default:
        return TK_EINVAL;
    }
}

/* The staged state of key, loading it on first use. NULL on TK_EIO. */
static struct stage *stage_get(struct ctx *x, const uint8_t *key, size_t len)
{
    for (size_t i = 0; i < x->n; i++) {
        struct stage *s = &x->st[i];
        if (s->key_len == len && memcmp(s->key, key, len) == 0)
            return s;
    }
    struct stage *s = &x->st[x->n];
    s->key = key;
    s->key_len = len;
    s->hash = kv__hash(key, len);
    s->dirty = false;
    s->lease = 0;
    if (kv__state_lookup_raw(x->sm, key, len, s->hash, &s->prev) != 0)
        return NULL;
    s->st = s->prev;
    if (s->st.live && !kv__live(x->sm, s->st.expire_ms))
        s->st.live = false; /* as kv__state_lookup finds it */
    x->n++;
    return s;
}

static bool cmp_num(uint64_t have, Kvpb__Compare__Op op, int64_t want)
{
    /* Revisions and versions are below 2^63; a negative `want` is below all. */
    if (want < 0)
        return op == KVPB__COMPARE__OP__NOT_EQUAL || op == KVPB__COMPARE__OP__GREATER;
    uint64_t w = (uint64_t)want;
    switch (op) {
    case KVPB__COMPARE__OP__EQUAL:
        return have == w;
    case KVPB__COMPARE__OP__NOT_EQUAL:
        return have != w;
    case KVPB__COMPARE__OP__LESS:
        return have < w;
    default:
        return have > w;
    }
}

/* A compare's target against one key's state (st; lease: its lease). */
static bool cmp_state(const Kvpb__Compare *c, const struct kv_state *st, uint64_t lease)
{
    switch (c->target) {
    case KVPB__COMPARE__TARGET__VERSION:
        return cmp_num(st->live ? st->version : 0, c->op, c->number);
    case KVPB__COMPARE__TARGET__MOD_REVISION:
        return cmp_num(st->live ? st->mod_rev : 0, c->op, c->number);
    case KVPB__COMPARE__TARGET__CREATE_REVISION:
        return cmp_num(st->live ? st->create_rev : 0, c->op, c->number);
    case KVPB__COMPARE__TARGET__LEASE:
        return cmp_num(st->live ? lease : 0, c->op, c->number);
    case KVPB__COMPARE__TARGET__VALUE: {
        if (!st->live)
            return false;
        int r = kv__keycmp(st->value, st->value_len, c->value.data, c->value.len);
        switch (c->op) {
        case KVPB__COMPARE__OP__EQUAL:
            return r == 0;
        case KVPB__COMPARE__OP__NOT_EQUAL:
            return r != 0;
        case KVPB__COMPARE__OP__LESS:
            return r < 0;
        default:
            return r > 0;
        }
    }
    case KVPB__COMPARE__TARGET__ABSENT:
        return !st->live;
    default:
        return st->live;
    }
}

/* A compare over [key, range_end) (range_end "\0": from key on): true when
 * it holds for every live key there, as for an absent key when there is
 * none. The command has staged no write yet (compares come first), so the
 * sm's state is the staged one. 1, 0, TK_ETOOBIG (past
 * KV_COMPARE_RANGE_KEYS) or TK_EIO. */
static int eval_range(struct ctx *x, const Kvpb__Compare *c)
{
    bool from_key = c->range_end.len == 1 && c->range_end.data[0] == 0;
    struct kv_range r = {.start = c->key.data,
                         .start_len = c->key.len,
                         .end = c->range_end.data,
                         .end_len = from_key ? 0 : c->range_end.len};
    if (!from_key && kv__keycmp(r.start, r.start_len, r.end, r.end_len) >= 0) {
        struct kv_state none = {.live = false};
        return cmp_state(c, &none, 0);
    }
    struct kv_iter it;
    struct kv_item item;
    size_t live = 0;
    int rc, held = 1;
    for (rc = kv__iter_first(&it, x->sm, &r, 0, &item); rc == 0 && held == 1;
         rc = kv__iter_next(&it, &item)) {
        if ((item.key_len > 0 && item.key[0] == KV_RESERVED_BYTE) ||
            kv__lease_reserved(item.key, item.key_len))
            continue; /* the node's own records: in no user's range */
        if (++x->range_keys > KV_COMPARE_RANGE_KEYS) {
            held = TK_ETOOBIG;
            break;
        }
        live++;
        struct kv_state st = {.live = true,
                              .value = item.value,
                              .value_len = item.value_len,
                              .create_rev = item.create_revision,
                              .mod_rev = item.mod_revision,
                              .version = item.version};
        uint64_t lease = c->target == KVPB__COMPARE__TARGET__LEASE
                             ? kv__lease_of(x->sm, item.key, item.key_len,
                                            kv__hash(item.key, item.key_len))
                             : 0;
        held = cmp_state(c, &st, lease) ? 1 : 0;
    }
    kv__iter_close(&it);
    if (rc != 0 && rc != TK_ENOTFOUND)
        return TK_EIO;
    if (held != 1)
        return held;
    if (live == 0) {
        struct kv_state none = {.live = false};
        return cmp_state(c, &none, 0);
    }
    return 1;
}

/* Evaluates a (checked) compare against the staged state: 1, 0, or a
 * negative code (TK_EIO; TK_ETOOBIG for a range past its bound). */
static int eval(struct ctx *x, const Kvpb__Compare *c, const ProtobufCBinaryData *key)
{
    if (c->range_end.len > 0)
        return eval_range(x, c);
    struct stage *s = stage_get(x, key->data, key->len);
    if (s == NULL)
        return TK_EIO;
    uint64_t lease = 0;
    if (c->target == KVPB__COMPARE__TARGET__LEASE && s->st.live)
        lease = s->dirty ? s->lease : kv__lease_of(x->sm, s->key, s->key_len, s->hash);
    return cmp_state(c, &s->st, lease) ? 1 : 0;
}

static int op_put(struct ctx *x, const Kvpb__Put *p)
{
    struct stage *s = stage_get(x, p->key.data, p->key.len);
    if (s == NULL)
        return TK_EIO;
    uint64_t now = x->sm->now_ms;
    if (p->ttl_ms > UINT64_MAX - now)
        return TK_ERANGE;
    if ((p->keep_value || p->keep_lease) && !s->st.live)
        return TK_ECOMPARE; /* nothing to keep */
    if (p->keep_lease) {
        /* The lease the command left it (checked when attached), or the
         * stored one. */
        if (!s->dirty)
            s->lease = kv__lease_of(x->sm, s->key, s->key_len, s->hash);
    } else {
        int rc = kv__lease_check_put(x->sm, p->lease);
        if (rc != 0)
            return rc;
        s->lease = p->lease;
    }
    if (!p->keep_value) {
        s->st.value = p->value.data;
        s->st.value_len = p->value.len;
    } /* else the staged value stays: the record's own bytes, or an earlier op's */
    if (s->st.live) {
        s->st.version++;
    } else {
        s->st.version = 1;
        s->st.create_rev = x->index;
    }
    s->st.live = true;
    s->st.mod_rev = x->index;
    s->st.expire_ms = p->ttl_ms > 0 ? now + p->ttl_ms : 0;
    s->dirty = true;
    return 0;
}

static int op_del(struct ctx *x, const ProtobufCBinaryData *key, uint64_t *deleted)
{
    struct stage *s = stage_get(x, key->data, key->len);
    if (s == NULL)
        return TK_EIO;
    *deleted = s->st.live ? 1 : 0;
    if (s->st.live) {
        s->st.live = false;
        s->dirty = true;
        s->lease = 0;
    }
    return 0;
}

/* A strict decimal int64: optional '-', 1 to 19 digits, nothing else. */
static bool parse_i64(const uint8_t *p, size_t len, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (len > 0 && p[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len || len - i > 19)
        return false;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return false;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v;
    }
    return true;
}

static int op_incr(struct ctx *x, const Kvpb__Increment *in, int64_t *value)
{
    struct stage *s = stage_get(x, in->key.data, in->key.len);
    if (s == NULL)
        return TK_EIO;
    int64_t cur = 0;
    if (s->st.live && !parse_i64(s->st.value, s->st.value_len, &cur))
        return TK_ERANGE;
    int64_t next;
    if (__builtin_add_overflow(cur, in->delta, &next))
        return TK_ERANGE;
    int n = snprintf(s->num, sizeof(s->num), "%lld", (long long)next);
    if (s->st.live) {
        s->st.version++;
    } else {
        s->st.version = 1;
        s->st.create_rev = x->index;
        s->st.expire_ms = 0;
    }
    s->st.live = true;
    s->st.mod_rev = x->index;
    s->st.value = (const uint8_t *)s->num;
    s->st.value_len = (size_t)n;
    s->dirty = true;
    s->lease = 0;
    *value = next;
    return 0;
}

/* Writes a staged key's new version: in place over its newest record when
 * that is hot and the value keeps its length (kv__state_rewrite_ok), else as a
 * record appended to the ring (st->hot and st->addr: where the key's newest
 * record was before the command). */
static void write_key(struct kv_sm *sm, uint64_t index, const uint8_t *key, size_t len,
                      uint64_t hash, const struct kv_state *st)
{
    kv__events_write(sm, index, key, len, hash, st); /* before: it reads the old */
    kv__state_write(sm, index, key, len, hash, st);
}

/* write_key for a staged key: its previous state is already known. */
static void write_staged(struct kv_sm *sm, uint64_t index, const struct stage *s)
{
    kv__events_write_prev(sm, index, s->key, s->key_len, &s->st, &s->prev);
    kv__state_write(sm, index, s->key, s->key_len, s->hash, &s->st);
}

/* Appends every staged change, attaching or detaching each key's lease.
 * Sets *wrote if anything was written. 0 or TK_EIO. */
static int commit(struct ctx *x, bool *wrote)
{
    *wrote = false;
    for (size_t i = 0; i < x->n; i++) {
        struct stage *s = &x->st[i];
        if (!s->dirty)
            continue;
        write_staged(x->sm, x->index, s);
        if (kv__lease_attach(x->sm, x->index, s->key, s->key_len, s->hash, s->lease) != 0)
            return TK_EIO;
        *wrote = true;
    }
    return 0;
}

/* Runs one checked op of a batch or transaction. */
static int run_op(struct ctx *x, const Kvpb__Op *op, struct kv_op_result *r)
{
    r->value = 0;
    r->deleted = 0;
    switch (op->op_case) {
    case KVPB__OP__OP_PUT:
        return op_put(x, op->put);
    case KVPB__OP__OP_DEL:
        return op_del(x, &op->del->key, &r->deleted);
    default:
        return op_incr(x, op->incr, &r->value);
    }
}

/* Appends a key, length-prefixed, to the scratch list. */
static void scratch_push(struct kv_sm *sm, size_t *used, const uint8_t *key, size_t len)
{
    size_t need = *used + 2 + len;
    if (need > sm->scratch_cap) {
        size_t cap = sm->scratch_cap ? sm->scratch_cap : 4096;
        while (cap < need)
            cap *= 2;
        sm->scratch = tk_realloc(sm->scratch, cap);
        sm->scratch_cap = cap;
    }
    sm->scratch[*used] = (uint8_t)(len >> 8);
    sm->scratch[*used + 1] = (uint8_t)len;
    memcpy(sm->scratch + *used + 2, key, len);
    *used = need;
}

/* Lists the live keys of r in scratch, at most `limit` (0: all); they are
 * written only once the iterator is closed: writes change the view it walks.
 * The limit counts live keys, the same on every replica, never the records
 * read (a replica's tier-down decides which tombstones it still holds). */
static int collect_keys(struct kv_sm *sm, const struct kv_range *r, size_t limit,
                        bool spare_reserved, size_t *used, size_t *n)
{
    struct kv_iter it;
    struct kv_item item;
    int rc;
    *used = *n = 0;
    for (rc = kv__iter_first(&it, sm, r, 0, &item); rc == 0;
         rc = kv__iter_next(&it, &item)) {
        if (spare_reserved && item.key_len > 0 && item.key[0] == KV_RESERVED_BYTE)
            continue; /* the node's own records: never a user's range */
        if (kv__lease_reserved(item.key, item.key_len))
            continue; /* lease records go with their leases only */
        scratch_push(sm, used, item.key, item.key_len);
        if (++*n == limit)
            break;
    }
    kv__iter_close(&it);
    return rc == TK_ENOTFOUND ? 0 : rc;
}

static int delete_range(struct kv_sm *sm, uint64_t index, const Kvpb__DeleteRange *d,
                        struct kv_result *res)
{
    struct kv_range r = {0};
    if (d->by_prefix) {
        if (d->prefix.len > sm->cfg.key_max) {
            res->code = TK_ETOOBIG;
            return 0;
        }
        r.start = d->prefix.data;
        r.start_len = d->prefix.len;
        r.by_prefix = true;
    } else {
        /* A bound may be a key plus one byte (the gateway's steps end just
         * after the last key they read, which may be key_max long). */
        if (d->start.len > sm->cfg.key_max + 1 || d->end.len > sm->cfg.key_max + 1) {
            res->code = TK_ETOOBIG;
            return 0;
        }
        r.start = d->start.data;
        r.start_len = d->start.len;
        r.end = d->end.data;
        r.end_len = d->end.len;
    }
    size_t used, n;
    int rc = collect_keys(sm, &r, d->limit, true, &used, &n);
    if (rc != 0)
        return rc;
    struct kv_state tomb = {.live = false};
    for (size_t off = 0; off < used;) {
        size_t len = ((size_t)sm->scratch[off] << 8) | sm->scratch[off + 1];
        const uint8_t *k = sm->scratch + off + 2;
        uint64_t hash = kv__hash(k, len);
        write_key(sm, index, k, len, hash, &tomb);
        if (kv__lease_attach(sm, index, k, len, hash, 0) != 0)
            return TK_EIO;
        off += 2 + len;
    }
    res->deleted = n + d->deleted_before;
    res->more = d->limit != 0 && n == d->limit;
    res->succeeded = true;
    res->revision = n > 0 ? index : 0;
    return 0;
}

/* The expire command (kv/ttl.c): deletes each named key whose TTL has run
 * out at the sm's clock (the entry's time); the deletions are expire events. */
static int exec_expire(struct ctx *x, const Kvpb__Expire *e, struct kv_result *res)
{
    if (e->n_keys > KV_TXN_OPS_MAX * 16)
        return TK_ETOOBIG;
    for (size_t i = 0; i < e->n_keys; i++)
        if (e->keys[i].len == 0 || e->keys[i].len > x->sm->cfg.key_max)
            return TK_EINVAL;
    struct kv_state st;
    for (size_t i = 0; i < e->n_keys; i++) {
        const uint8_t *k = e->keys[i].data;
        size_t len = e->keys[i].len;
        uint64_t hash = kv__hash(k, len);
        if (kv__state_lookup_raw(x->sm, k, len, hash, &st) != 0)
            return TK_EIO;
        if (!st.live || st.expire_ms == 0 || kv__live(x->sm, st.expire_ms))
            continue; /* gone, rewritten without a TTL, or not due */
        struct kv_state tomb = {.live = false};
        x->sm->expiring = true;
        write_key(x->sm, x->index, k, len, hash, &tomb);
        x->sm->expiring = false;
        if (kv__lease_attach(x->sm, x->index, k, len, hash, 0) != 0)
            return TK_EIO;
        res->deleted++;
    }
    res->succeeded = true;
    res->revision = res->deleted > 0 ? x->index : 0;
    return 0;
}

int kv_sm_forget_prefix(struct kv_sm *sm, const uint8_t *prefix, size_t len,
                        uint64_t *forgot)
{
    struct kv_range r = {.start = prefix, .start_len = len, .by_prefix = true};
    size_t used, n;
    int rc = collect_keys(sm, &r, 0, false, &used, &n);
    if (rc != 0)
        return rc;
    uint64_t index = sm->applied;
    struct kv_state tomb = {.live = false};
    for (size_t off = 0; off < used;) {
        size_t klen = ((size_t)sm->scratch[off] << 8) | sm->scratch[off + 1];
        const uint8_t *k = sm->scratch + off + 2;
        kv__state_write(sm, index, k, klen, kv__hash(k, klen), &tomb);
        off += 2 + klen;
    }
    *forgot = n;
    return n > 0 ? kv_sm_flush(sm) : 0;
}

/* A put, with its compare if it has one. */
static int exec_put(struct ctx *x, const Kvpb__Put *p)
{
    int rc = check_put(x->sm, p, true);
    if (rc != 0)
        return rc;
    if (p->cond != NULL) {
        int ok = eval(x, p->cond, &p->key);
        if (ok < 0)
            return ok;
        if (!ok)
            return TK_ECOMPARE;
    }
    return op_put(x, p);
}

static int exec_batch(struct ctx *x, const Kvpb__Batch *b, struct kv_result *res)
{
    if (b->n_ops > KV_TXN_OPS_MAX)
        return TK_ETOOBIG;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < b->n_ops; i++)
        rc = check_op(x->sm, b->ops[i], false);
    for (size_t i = 0; rc == 0 && i < b->n_ops; i++)
        rc = run_op(x, b->ops[i], &res->ops[i]);
    if (rc == 0)
        res->n_ops = (uint32_t)b->n_ops;
    return rc;
}

/* A transaction: its compares choose the then or the else ops. On success,
 * res->succeeded says which ran. */
static int exec_txn(struct ctx *x, const Kvpb__Txn *t, struct kv_result *res)
{
    if (t->n_then_ops + t->n_else_ops > KV_TXN_OPS_MAX || t->n_compares > KV_TXN_OPS_MAX)
        return TK_ETOOBIG;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < t->n_compares; i++)
        rc = check_compare(x->sm, t->compares[i]);
    for (size_t i = 0; rc == 0 && i < t->n_then_ops; i++)
        rc = check_op(x->sm, t->then_ops[i], true);
    for (size_t i = 0; rc == 0 && i < t->n_else_ops; i++)
        rc = check_op(x->sm, t->else_ops[i], true);
    if (rc != 0)
        return rc;
    bool ok = true;
    for (size_t i = 0; ok && i < t->n_compares; i++) {
        int e = eval(x, t->compares[i], &t->compares[i]->key);
        if (e < 0)
            return e;
        ok = e != 0;
    }
    /* The compares' lookups are not writes: start the ops from them. */
    Kvpb__Op **ops = ok ? t->then_ops : t->else_ops;
    size_t n = ok ? t->n_then_ops : t->n_else_ops;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = run_op(x, ops[i], &res->ops[i]);
    if (rc == 0) {
        res->n_ops = (uint32_t)n;
        res->succeeded = ok;
    }
    return rc;
}

/* Runs a decoded command, filling res: an error result changes nothing, a
 * success appends the staged keys. Returns 0 or TK_EIO. */
static int exec(struct ctx *x, const Kvpb__Command *c, struct kv_result *res)
{
    int rc;
    switch (c->cmd_case) {
    case KVPB__COMMAND__CMD_PUT:
        rc = exec_put(x, c->put);
        break;
    case KVPB__COMMAND__CMD_DEL:
        rc = check_key(x->sm, &c->del->key);
        if (rc == 0)
            rc = op_del(x, &c->del->key, &res->deleted);
        break;
    case KVPB__COMMAND__CMD_DELETE_RANGE:
        return delete_range(x->sm, x->index, c->delete_range, res);
    case KVPB__COMMAND__CMD_EXPIRE:
        rc = exec_expire(x, c->expire, res);
        if (rc == TK_EIO || rc == 0)
            return rc;
        break;
    case KVPB__COMMAND__CMD_INCR:
        rc = check_key(x->sm, &c->incr->key);
        if (rc == 0)
            rc = op_incr(x, c->incr, &res->value);
        break;
    case KVPB__COMMAND__CMD_BATCH:
        rc = exec_batch(x, c->batch, res);
        break;
    case KVPB__COMMAND__CMD_TXN:
        rc = exec_txn(x, c->txn, res);
        break;
    default:
        rc = TK_EINVAL;
        break;
    }
    if (rc == TK_EIO)
        return TK_EIO;
    if (rc != 0) {
        res->code = rc;
        res->n_ops = 0;
        res->value = 0;
        res->deleted = 0;
        return 0;
    }
    if (c->cmd_case != KVPB__COMMAND__CMD_TXN)
        res->succeeded = true;
    bool wrote;
    if (commit(x, &wrote) != 0)
        return TK_EIO;
    if (wrote)
        res->revision = x->index;
    return 0;
}

/* The lease commands (lease.c). Returns 1 when c is not one. */
static int exec_lease(struct ctx *x, const Kvpb__Command *c, struct kv_result *res)
{
    switch (c->cmd_case) {
    case KVPB__COMMAND__CMD_LEASE_GRANT:
        return kv__lease_grant(x->sm, x->index, c->lease_grant->id,
                               c->lease_grant->ttl_ms, res);
    case KVPB__COMMAND__CMD_LEASE_KEEPALIVE:
        return kv__lease_keepalive(x->sm, x->index, c->lease_keepalive->id, res);
    case KVPB__COMMAND__CMD_LEASE_REVOKE:
        return kv__lease_revoke(x->sm, x->index, c->lease_revoke->id,
                                c->lease_revoke->expired, c->lease_revoke->renewed, res);
    case KVPB__COMMAND__CMD_LEASE_CHECKPOINT: {
        const Kvpb__LeaseCheckpoint *k = c->lease_checkpoint;
        if (k->n_ids != k->n_remaining_ms || k->n_ids > KV_TXN_OPS_MAX * 16) {
            res->code = TK_EINVAL;
            return 0;
        }
        return kv__lease_checkpoint(x->sm, x->index, k->ids, k->remaining_ms, k->n_ids,
                                    res);
    }
    default:
        return 1;
    }
}

int kv__cmd_apply(struct kv_sm *sm, uint64_t index, const Kvpb__Command *c,
                  struct kv_result *res)
{
    if (c->client_id != 0 && kv__sess_answer(sm, c->client_id, c->seq, res))
        return 0;
    struct ctx x;
    x.sm = sm;
    x.index = index;
    x.n = 0;
    x.range_keys = 0;
    int rc = exec_lease(&x, c, res);
    if (rc == 1)
        rc = exec(&x, c, res);
    if (rc == 0 && c->client_id != 0)
        kv__sess_record(sm, index, c->client_id, c->seq, res);
    return rc;
}
