/* Model-based randomized test of the KV state machine (suite 'slow').
 *
 * A seeded generator issues at least 1M random entries - puts (TTL, compares),
 * deletes, range and prefix deletes, increments, batches, transactions, no-op
 * entries, retries of earlier (client, seq) commands - with an advancing entry
 * clock, against a plain reference model (a sorted array). Every result must
 * equal the model's, and every few hundred entries random gets and scans
 * (prefix or range, with a limit) must match too. A small ring budget makes
 * tier-downs happen constantly; every RESTART_EVERY entries the sm is closed and
 * reopened and the kept log replayed after its durable index, and its digest
 * must be what it was before.
 *
 * Usage: kv_model_test [ops] [seed] [--inject-bug] [--append-only].
 * --inject-bug makes the model wrong on purpose (a version bump forgotten) so
 * the run must fail: the checker is tested too. --append-only runs the sm with
 * kv_config.append_only (no in-place rewrites). */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "base/prng.h"
#include "kv_util.h"

#define NKEYS 400
#define VMAX 700
#define SESS_MAX 64
#define RESTART_EVERY 100000

static bool inject_bug;
static bool append_only;
static struct tk_prng rng;

/* ---- the reference model ---- */

struct mval {
    char key[16];
    size_t key_len;
    uint8_t value[VMAX];
    size_t value_len;
    uint64_t create, mod, version, expire;
};

struct model {
    struct mval *e; /* sorted by key */
    size_t n;
    uint64_t now;
};

static int mcmp(const char *a, size_t al, const char *b, size_t bl)
{
    size_t n = al < bl ? al : bl;
    int c = n > 0 ? memcmp(a, b, n) : 0;
    return c != 0 ? c : (al < bl ? -1 : al > bl);
}

static size_t mfind(const struct model *m, const char *k, size_t kl, bool *found)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = mcmp(m->e[mid].key, m->e[mid].key_len, k, kl);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < m->n && mcmp(m->e[lo].key, m->e[lo].key_len, k, kl) == 0;
    return lo;
}

static bool mlive(const struct model *m, const struct mval *v)
{
    return v->expire == 0 || v->expire > m->now;
}

/* The live entry for k, or NULL. */
static struct mval *mget(struct model *m, const char *k, size_t kl)
{
    bool f;
    size_t i = mfind(m, k, kl, &f);
    return f && mlive(m, &m->e[i]) ? &m->e[i] : NULL;
}

static void mremove(struct model *m, const char *k, size_t kl)
{
    bool f;
    size_t i = mfind(m, k, kl, &f);
    if (!f)
        return;
    memmove(&m->e[i], &m->e[i + 1], (m->n - i - 1) * sizeof(m->e[0]));
    m->n--;
}

static struct mval *mslot(struct model *m, const char *k, size_t kl)
{
    bool f;
    size_t i = mfind(m, k, kl, &f);
    if (!f) {
        memmove(&m->e[i + 1], &m->e[i], (m->n - i) * sizeof(m->e[0]));
        m->n++;
        memset(&m->e[i], 0, sizeof(m->e[i]));
        memcpy(m->e[i].key, k, kl);
        m->e[i].key_len = kl;
    }
    return &m->e[i];
}

static void mput(struct model *m, uint64_t idx, const ProtobufCBinaryData *k,
                 const ProtobufCBinaryData *v, uint64_t ttl)
{
    struct mval *old = mget(m, (const char *)k->data, k->len);
    uint64_t create = old ? old->create : idx;
    uint64_t version = old ? old->version + (inject_bug && v->len == 7 ? 0 : 1) : 1;
    struct mval *e = mslot(m, (const char *)k->data, k->len);
    e->create = create;
    e->version = version;
    e->mod = idx;
    if (v->len > 0)
        memcpy(e->value, v->data, v->len);
    e->value_len = v->len;
    e->expire = ttl ? m->now + ttl : 0;
}

static bool mdel(struct model *m, const ProtobufCBinaryData *k)
{
    if (mget(m, (const char *)k->data, k->len) == NULL)
        return false;
    mremove(m, (const char *)k->data, k->len);
    return true;
}

static bool parse_i64(const uint8_t *p, size_t len, int64_t *out)
{
    char buf[32];
    if (len == 0 || len > 20)
        return false;
    memcpy(buf, p, len);
    buf[len] = '\0';
    size_t i = buf[0] == '-' ? 1 : 0;
    if (i == len || len - i > 19)
        return false;
    for (size_t j = i; j < len; j++)
        if (buf[j] < '0' || buf[j] > '9')
            return false;
    errno = 0;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (errno != 0)
        return false;
    *out = v;
    return true;
}

static int mincr(struct model *m, uint64_t idx, const ProtobufCBinaryData *k, int64_t d,
                 int64_t *out)
{
    struct mval *old = mget(m, (const char *)k->data, k->len);
    int64_t cur = 0;
    if (old && !parse_i64(old->value, old->value_len, &cur))
        return TK_ERANGE;
    int64_t next;
    if (__builtin_add_overflow(cur, d, &next))
        return TK_ERANGE;
    uint64_t create = old ? old->create : idx, version = old ? old->version + 1 : 1;
    uint64_t expire = old ? old->expire : 0;
    struct mval *e = mslot(m, (const char *)k->data, k->len);
    e->create = create;
    e->version = version;
    e->expire = expire;
    e->mod = idx;
    e->value_len = (size_t)snprintf((char *)e->value, VMAX, "%lld", (long long)next);
    *out = next;
    return 0;
}

static bool mcompare(struct model *m, const Kvpb__Compare *c)
{
    struct mval *v = mget(m, (const char *)c->key.data, c->key.len);
    if (c->target == KVPB__COMPARE__TARGET__ABSENT)
        return v == NULL;
    if (c->target == KVPB__COMPARE__TARGET__EXISTS)
        return v != NULL;
    int r;
    if (c->target == KVPB__COMPARE__TARGET__VALUE) {
        if (v == NULL)
            return false;
        r = mcmp((const char *)v->value, v->value_len, (const char *)c->value.data,
                 c->value.len);
    } else {
        uint64_t have = v == NULL                                          ? 0
                        : c->target == KVPB__COMPARE__TARGET__VERSION      ? v->version
                        : c->target == KVPB__COMPARE__TARGET__MOD_REVISION ? v->mod
                                                                           : v->create;
        uint64_t want = (uint64_t)c->number; /* the generator keeps it >= 0 */
        r = have < want ? -1 : have > want;
    }
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

static bool in_range(const struct mval *e, const Kvpb__DeleteRange *d)
{
    if (d->by_prefix)
        return e->key_len >= d->prefix.len &&
               memcmp(e->key, d->prefix.data, d->prefix.len) == 0;
    if (mcmp(e->key, e->key_len, (const char *)d->start.data, d->start.len) < 0)
        return false;
    return d->end.len == 0 ||
           mcmp(e->key, e->key_len, (const char *)d->end.data, d->end.len) < 0;
}

/* Runs op i of a batch/txn on the model. Returns 0 or an error code. */
static int mop(struct model *m, uint64_t idx, const Kvpb__Op *op, struct kv_op_result *r,
               bool *changed)
{
    r->value = 0;
    r->deleted = 0;
    switch (op->op_case) {
    case KVPB__OP__OP_PUT:
        mput(m, idx, &op->put->key, &op->put->value, op->put->ttl_ms);
        *changed = true;
        return 0;
    case KVPB__OP__OP_DEL:
        r->deleted = mdel(m, &op->del->key);
        /* The sm writes a tombstone for a key live in this command's stage. */
        *changed = *changed || r->deleted;
        return 0;
    default: {
        int rc = mincr(m, idx, &op->incr->key, op->incr->delta, &r->value);
        if (rc == 0)
            *changed = true;
        return rc;
    }
    }
}

static void mexec(struct model *m, uint64_t idx, const Kvpb__Command *c,
                  struct kv_result *r)
{
    memset(r, 0, sizeof(*r));
    bool changed = false;
    switch (c->cmd_case) {
    case KVPB__COMMAND__CMD_PUT:
        if (c->put->cond != NULL && !mcompare(m, c->put->cond)) {
            r->code = TK_ECOMPARE;
            return;
        }
        mput(m, idx, &c->put->key, &c->put->value, c->put->ttl_ms);
        changed = true;
        break;
    case KVPB__COMMAND__CMD_DEL:
        r->deleted = mdel(m, &c->del->key);
        changed = r->deleted;
        break;
    case KVPB__COMMAND__CMD_DELETE_RANGE:
        for (size_t i = 0; i < m->n;) {
            if (mlive(m, &m->e[i]) && in_range(&m->e[i], c->delete_range)) {
                mremove(m, m->e[i].key, m->e[i].key_len);
                r->deleted++;
            } else {
                i++;
            }
        }
        changed = r->deleted > 0;
        break;
    case KVPB__COMMAND__CMD_INCR: {
        int rc = mincr(m, idx, &c->incr->key, c->incr->delta, &r->value);
        if (rc != 0) {
            r->code = rc;
            return;
        }
        changed = true;
        break;
    }
    case KVPB__COMMAND__CMD_BATCH:
        for (size_t i = 0; i < c->batch->n_ops; i++)
            mop(m, idx, c->batch->ops[i], &r->ops[i], &changed);
        r->n_ops = (uint32_t)c->batch->n_ops;
        break;
    case KVPB__COMMAND__CMD_TXN: {
        const Kvpb__Txn *t = c->txn;
        bool ok = true;
        for (size_t i = 0; ok && i < t->n_compares; i++)
            ok = mcompare(m, t->compares[i]);
        Kvpb__Op **ops = ok ? t->then_ops : t->else_ops;
        size_t n = ok ? t->n_then_ops : t->n_else_ops;
        struct mval *saved = tk_malloc((m->n + 1) * sizeof(*saved));
        size_t saved_n = m->n;
        memcpy(saved, m->e, m->n * sizeof(*saved));
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < n; i++)
            rc = mop(m, idx, ops[i], &r->ops[i], &changed);
        if (rc != 0) {
            memcpy(m->e, saved, saved_n * sizeof(*saved));
            m->n = saved_n;
            tk_free(saved);
            memset(r, 0, sizeof(*r));
            r->code = rc;
            return;
        }
        tk_free(saved);
        r->n_ops = (uint32_t)n;
        r->succeeded = ok;
        r->revision = changed ? idx : 0;
        return;
    }
    default:
        r->code = TK_EINVAL;
        return;
    }
    r->succeeded = true;
    r->revision = changed ? idx : 0;
}

/* ---- the exactly-once table of the model ---- */

struct msess {
    uint64_t client, seq;
    struct kv_result res;
};
static struct msess sess[SESS_MAX];
static size_t sess_head, sess_len;

static struct msess *msess_find(uint64_t client, uint64_t seq)
{
    for (size_t i = 0; i < sess_len; i++) {
        struct msess *s = &sess[(sess_head + i) % SESS_MAX];
        if (s->client == client && s->seq == seq)
            return s;
    }
    return NULL;
}

static void msess_add(uint64_t client, uint64_t seq, const struct kv_result *r)
{
    if (sess_len == SESS_MAX) {
        sess_head = (sess_head + 1) % SESS_MAX;
        sess_len--;
    }
    struct msess *s = &sess[(sess_head + sess_len) % SESS_MAX];
    s->client = client;
    s->seq = seq;
    s->res = *r;
    sess_len++;
}

/* ---- the generator ---- */

struct gen {
    char keys[6][16];
    uint8_t vals[6][VMAX];
    Kvpb__Put puts[8];
    Kvpb__Delete dels[8];
    Kvpb__Increment incs[8];
    Kvpb__Compare cmps[4];
    Kvpb__Compare *pcmps[4];
    Kvpb__Op ops[8];
    Kvpb__Op *pops[8];
    Kvpb__Op *pops2[8];
    Kvpb__DeleteRange dr;
    Kvpb__Batch batch;
    Kvpb__Txn txn;
    char rk[2][16];
};

static ProtobufCBinaryData gkey(struct gen *g, int slot)
{
    static const char *pre[] = {"a", "b", "ctr", "k", "k1", "zz"};
    int n = snprintf(g->keys[slot], 16, "%s%u", pre[tk_prng_below(&rng, 6)],
                     (unsigned)tk_prng_below(&rng, NKEYS / 6));
    return kvu_bin(g->keys[slot], (size_t)n);
}

static ProtobufCBinaryData gval(struct gen *g, int slot)
{
    size_t len;
    uint8_t *v = g->vals[slot];
    uint64_t r = tk_prng_below(&rng, 10);
    if (r < 3) {
        len = (size_t)snprintf((char *)v, VMAX, "%lld",
                               (long long)tk_prng_range(&rng, 0, 2000) - 1000);
    } else if (r < 4) {
        len = 200 + tk_prng_below(&rng, VMAX - 200);
        for (size_t i = 0; i < len; i++)
            v[i] = (uint8_t)tk_prng_next(&rng);
    } else {
        len = tk_prng_below(&rng, 24);
        for (size_t i = 0; i < len; i++)
            v[i] = (uint8_t)('a' + tk_prng_below(&rng, 26));
    }
    return kvu_bin(v, len);
}

static void gcompare(struct gen *g, Kvpb__Compare *c, int kslot)
{
    kvpb__compare__init(c);
    c->key = gkey(g, kslot);
    c->target = (Kvpb__Compare__Target)tk_prng_below(&rng, 6);
    c->op = (Kvpb__Compare__Op)tk_prng_below(&rng, 4);
    c->number = (int64_t)tk_prng_below(&rng, 4);
    if (c->target == KVPB__COMPARE__TARGET__MOD_REVISION ||
        c->target == KVPB__COMPARE__TARGET__CREATE_REVISION)
        c->number = (int64_t)tk_prng_below(&rng, 1u << 20);
    c->value = gval(g, 5);
}

static Kvpb__Op *gop(struct gen *g, int i, bool allow_incr)
{
    Kvpb__Op *op = &g->ops[i];
    kvpb__op__init(op);
    uint64_t r = tk_prng_below(&rng, allow_incr ? 3 : 2);
    int ks = i % 5;
    if (r == 0) {
        kvpb__put__init(&g->puts[i]);
        g->puts[i].key = gkey(g, ks);
        g->puts[i].value = gval(g, ks);
        op->op_case = KVPB__OP__OP_PUT;
        op->put = &g->puts[i];
    } else if (r == 1) {
        kvpb__delete__init(&g->dels[i]);
        g->dels[i].key = gkey(g, ks);
        op->op_case = KVPB__OP__OP_DEL;
        op->del = &g->dels[i];
    } else {
        kvpb__increment__init(&g->incs[i]);
        g->incs[i].key = gkey(g, ks);
        g->incs[i].delta = (int64_t)tk_prng_below(&rng, 200) - 100;
        op->op_case = KVPB__OP__OP_INCR;
        op->incr = &g->incs[i];
    }
    return op;
}

static void gen_command(struct gen *g, Kvpb__Command *c)
{
    kvpb__command__init(c);
    uint64_t r = tk_prng_below(&rng, 100);
    if (r < 40) {
        kvpb__put__init(&g->puts[0]);
        g->puts[0].key = gkey(g, 0);
        g->puts[0].value = gval(g, 0);
        if (tk_prng_chance(&rng, 0.2))
            g->puts[0].ttl_ms = 1 + tk_prng_below(&rng, 3000);
        if (tk_prng_chance(&rng, 0.15)) {
            gcompare(g, &g->cmps[0], 1);
            g->cmps[0].key = g->puts[0].key;
            g->puts[0].cond = &g->cmps[0];
        }
        c->cmd_case = KVPB__COMMAND__CMD_PUT;
        c->put = &g->puts[0];
    } else if (r < 55) {
        kvpb__delete__init(&g->dels[0]);
        g->dels[0].key = gkey(g, 0);
        c->cmd_case = KVPB__COMMAND__CMD_DEL;
        c->del = &g->dels[0];
    } else if (r < 57) {
        kvpb__delete_range__init(&g->dr);
        if (tk_prng_chance(&rng, 0.5)) {
            g->dr.by_prefix = true;
            int n = snprintf(g->rk[0], 16, "%s%u", tk_prng_chance(&rng, 0.5) ? "k1" : "b",
                             (unsigned)tk_prng_below(&rng, 10));
            g->dr.prefix = kvu_bin(g->rk[0], (size_t)n);
        } else {
            g->dr.start = gkey(g, 0);
            g->dr.end = gkey(g, 1);
            if (tk_prng_chance(&rng, 0.1))
                g->dr.end.len = 0;
        }
        c->cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
        c->delete_range = &g->dr;
    } else if (r < 72) {
        kvpb__increment__init(&g->incs[0]);
        g->incs[0].key = gkey(g, 0);
        g->incs[0].delta = (int64_t)tk_prng_below(&rng, 2000) - 1000;
        if (tk_prng_chance(&rng, 0.01))
            g->incs[0].delta = INT64_MAX;
        c->cmd_case = KVPB__COMMAND__CMD_INCR;
        c->incr = &g->incs[0];
    } else if (r < 82) {
        kvpb__batch__init(&g->batch);
        size_t n = 1 + tk_prng_below(&rng, 5);
        for (size_t i = 0; i < n; i++)
            g->pops[i] = gop(g, (int)i, false);
        g->batch.n_ops = n;
        g->batch.ops = g->pops;
        c->cmd_case = KVPB__COMMAND__CMD_BATCH;
        c->batch = &g->batch;
    } else {
        kvpb__txn__init(&g->txn);
        size_t nc = tk_prng_below(&rng, 3);
        for (size_t i = 0; i < nc; i++) {
            gcompare(g, &g->cmps[i], 5);
            g->pcmps[i] = &g->cmps[i];
        }
        size_t nt = tk_prng_below(&rng, 4), ne = tk_prng_below(&rng, 3);
        for (size_t i = 0; i < nt; i++)
            g->pops[i] = gop(g, (int)i, true);
        for (size_t i = 0; i < ne; i++)
            g->pops2[i] = gop(g, (int)(4 + i), true);
        g->txn.n_compares = nc;
        g->txn.compares = g->pcmps;
        g->txn.n_then_ops = nt;
        g->txn.then_ops = g->pops;
        g->txn.n_else_ops = ne;
        g->txn.else_ops = g->pops2;
        c->cmd_case = KVPB__COMMAND__CMD_TXN;
        c->txn = &g->txn;
    }
}

/* ---- the log and the run ---- */

struct entry {
    uint64_t time_ms;
    uint8_t *cmd; /* NULL: a no-op entry */
    size_t len;
};

static int fails;

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "MISMATCH at entry %" PRIu64 ": ", idx);                     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            if (++fails > 5)                                                             \
                exit(1);                                                                 \
        }                                                                                \
    } while (0)

static void check_result(uint64_t idx, const struct kv_result *a,
                         const struct kv_result *b)
{
    CHECK(a->code == b->code, "code %d want %d", a->code, b->code);
    CHECK(a->revision == b->revision, "revision %" PRIu64 " want %" PRIu64, a->revision,
          b->revision);
    CHECK(a->succeeded == b->succeeded, "succeeded %d want %d", a->succeeded,
          b->succeeded);
    CHECK(a->value == b->value, "value %" PRId64 " want %" PRId64, a->value, b->value);
    CHECK(a->deleted == b->deleted, "deleted %" PRIu64 " want %" PRIu64, a->deleted,
          b->deleted);
    CHECK(a->n_ops == b->n_ops, "n_ops %u want %u", a->n_ops, b->n_ops);
    for (uint32_t i = 0; i < a->n_ops && i < b->n_ops; i++) {
        CHECK(a->ops[i].value == b->ops[i].value, "op %u value", i);
        CHECK(a->ops[i].deleted == b->ops[i].deleted, "op %u deleted", i);
    }
}

static void check_item(uint64_t idx, const struct kv_item *it, const struct mval *v)
{
    CHECK(mcmp((const char *)it->key, it->key_len, v->key, v->key_len) == 0,
          "key %.*s want %.*s", (int)it->key_len, it->key, (int)v->key_len, v->key);
    CHECK(it->value_len == v->value_len && memcmp(it->value, v->value, v->value_len) == 0,
          "value of %.*s", (int)v->key_len, v->key);
    CHECK(it->create_revision == v->create, "create of %.*s: %" PRIu64 " want %" PRIu64,
          (int)v->key_len, v->key, it->create_revision, v->create);
    CHECK(it->mod_revision == v->mod, "mod of %.*s", (int)v->key_len, v->key);
    CHECK(it->version == v->version, "version of %.*s: %" PRIu64 " want %" PRIu64,
          (int)v->key_len, v->key, it->version, v->version);
    CHECK(it->expire_ms == v->expire, "expire of %.*s", (int)v->key_len, v->key);
}

struct scan_ctx {
    struct model *m;
    uint64_t idx;
    size_t pos; /* next model index to compare */
    const struct kv_range *r;
    size_t seen;
};

static bool m_in_scan(const struct mval *e, const struct kv_range *r)
{
    if (r->by_prefix)
        return e->key_len >= r->start_len && memcmp(e->key, r->start, r->start_len) == 0;
    if (mcmp(e->key, e->key_len, r->start, r->start_len) < 0)
        return false;
    return r->end_len == 0 || mcmp(e->key, e->key_len, r->end, r->end_len) < 0;
}

static size_t m_next(struct scan_ctx *s)
{
    while (s->pos < s->m->n &&
           (!mlive(s->m, &s->m->e[s->pos]) || !m_in_scan(&s->m->e[s->pos], s->r)))
        s->pos++;
    return s->pos;
}

static int scan_cb(const struct kv_item *it, void *data)
{
    struct scan_ctx *s = data;
    uint64_t idx = s->idx;
    size_t p = m_next(s);
    CHECK(p < s->m->n, "scan returned extra key %.*s", (int)it->key_len, it->key);
    if (p < s->m->n)
        check_item(idx, it, &s->m->e[p]);
    s->pos++;
    s->seen++;
    return 0;
}

static void check_reads(struct kv_sm *sm, struct model *m, uint64_t idx, struct gen *g)
{
    for (int i = 0; i < 8; i++) {
        ProtobufCBinaryData k = gkey(g, 0);
        struct kv_item it;
        int rc = kv_sm_get(sm, k.data, k.len, &it);
        struct mval *v = mget(m, (const char *)k.data, k.len);
        CHECK((rc == 0) == (v != NULL), "get %.*s: rc %d, model %s", (int)k.len, k.data,
              rc, v ? "present" : "absent");
        if (rc == 0 && v != NULL)
            check_item(idx, &it, v);
    }
    struct kv_range r = {0};
    if (tk_prng_chance(&rng, 0.5)) {
        r.by_prefix = true;
        int n = snprintf(g->rk[0], 16, "%s", tk_prng_chance(&rng, 0.5) ? "k1" : "a");
        r.start = g->rk[0];
        r.start_len = (size_t)n;
    } else {
        ProtobufCBinaryData a = gkey(g, 1), b = gkey(g, 2);
        r.start = a.data;
        r.start_len = a.len;
        r.end = b.data;
        r.end_len = tk_prng_chance(&rng, 0.2) ? 0 : b.len;
    }
    size_t limit = tk_prng_below(&rng, 30);
    struct scan_ctx s = {.m = m, .idx = idx, .r = &r};
    CHECK(kv_sm_scan(sm, &r, limit, scan_cb, &s) == 0, "scan failed");
    size_t want = 0;
    for (size_t i = 0; i < m->n; i++)
        if (mlive(m, &m->e[i]) && m_in_scan(&m->e[i], &r))
            want++;
    if (limit != 0 && want > limit)
        want = limit;
    CHECK(s.seen == want, "scan saw %zu want %zu", s.seen, want);
}

int main(int argc, char **argv)
{
    uint64_t n_ops = 1000000, seed = 1;
    int pos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--inject-bug") == 0)
            inject_bug = true;
        else if (strcmp(argv[i], "--append-only") == 0)
            append_only = true;
        else if (pos++ == 0)
            n_ops = strtoull(argv[i], NULL, 10);
        else
            seed = strtoull(argv[i], NULL, 10);
    }
    tk_prng_seed(&rng, seed);
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.page_bytes = 16 * 1024;
    u.cfg.ring_bytes = 256 * 1024;
    u.cfg.sessions_max = SESS_MAX;
    u.cfg.append_only = append_only;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    struct model m = {.e = tk_calloc(NKEYS * 2, sizeof(struct mval))};
    struct entry *log = tk_calloc(n_ops + 1, sizeof(*log));
    struct gen *g = tk_calloc(1, sizeof(*g));
    uint64_t time_ms = 1000000;
    uint64_t client_seq[6] = {0};
    uint64_t restarts = 0, dups = 0, dup_hits = 0, tier_downs = 0, rewrites = 0;
    for (uint64_t idx = 1; idx <= n_ops; idx++) {
        time_ms += tk_prng_below(&rng, 40);
        if (tk_prng_chance(&rng, 0.001))
            time_ms -= tk_prng_below(&rng, 30); /* a new leader's clock behind */
        log[idx].time_ms = time_ms;
        if (time_ms > m.now)
            m.now = time_ms;
        if (tk_prng_chance(&rng, 0.01)) { /* a no-op entry */
            if (kv_sm_skip(u.sm, idx, 1, time_ms) != 0) {
                fprintf(stderr, "skip failed\n");
                return 1;
            }
            continue;
        }
        struct kv_result got, want;
        if (tk_prng_chance(&rng, 0.03) && idx > 200) {
            /* Retry an earlier client command, byte for byte. */
            uint64_t j = idx - 1 - tk_prng_below(&rng, 200);
            while (j > 1 && (log[j].cmd == NULL))
                j--;
            if (log[j].cmd != NULL) {
                Kvpb__Command *c = kvpb__command__unpack(NULL, log[j].len, log[j].cmd);
                if (c != NULL && c->client_id != 0) {
                    dups++;
                    log[idx].cmd = tk_malloc(log[j].len);
                    memcpy(log[idx].cmd, log[j].cmd, log[j].len);
                    log[idx].len = log[j].len;
                    struct msess *s = msess_find(c->client_id, c->seq);
                    if (s != NULL) {
                        dup_hits++;
                        want = s->res;
                    } else {
                        mexec(&m, idx, c, &want);
                        msess_add(c->client_id, c->seq, &want);
                    }
                    int rc = kv_sm_apply(u.sm, idx, 1, time_ms, log[idx].cmd,
                                         log[idx].len, &got);
                    CHECK(rc == 0, "apply rc %d", rc);
                    CHECK(got.duplicate == (s != NULL), "duplicate flag");
                    check_result(idx, &got, &want);
                    kvpb__command__free_unpacked(c, NULL);
                    goto after;
                }
                if (c != NULL)
                    kvpb__command__free_unpacked(c, NULL);
            }
        }
        {
            Kvpb__Command c;
            gen_command(g, &c);
            if (tk_prng_chance(&rng, 0.3)) {
                c.client_id = 1 + tk_prng_below(&rng, 5);
                c.seq = ++client_seq[c.client_id];
            }
            log[idx].cmd = kvu_pack(&c, &log[idx].len);
            mexec(&m, idx, &c, &want);
            if (c.client_id != 0)
                msess_add(c.client_id, c.seq, &want);
            int rc = kv_sm_apply(u.sm, idx, 1, time_ms, log[idx].cmd, log[idx].len, &got);
            CHECK(rc == 0, "apply rc %d", rc);
            CHECK(!got.duplicate, "unexpected duplicate");
            check_result(idx, &got, &want);
        }
    after:
        if (idx % 337 == 0)
            check_reads(u.sm, &m, idx, g);
        if (idx % 50021 == 0)
            CHECK(kv_sm_flush(u.sm) == 0, "flush");
        if (idx % RESTART_EVERY == 0 || idx == n_ops) {
            uint64_t before, after;
            CHECK(kv_sm_digest(u.sm, &before) == 0, "digest");
            struct kv_sm_stats st0;
            kv_sm_stats(u.sm, &st0);
            tier_downs += st0.tier_downs;
            rewrites += st0.rewrites;
            kvu_close(&u, false);
            kvu_open(&u, &cfg);
            uint64_t from = kv_sm_durable_index(u.sm);
            CHECK(from <= idx, "durable index %" PRIu64 " beyond applied", from);
            for (uint64_t j = from + 1; j <= idx; j++) {
                struct kv_result r;
                int rc = log[j].cmd == NULL ? kv_sm_skip(u.sm, j, 1, log[j].time_ms)
                                            : kv_sm_apply(u.sm, j, 1, log[j].time_ms,
                                                          log[j].cmd, log[j].len, &r);
                CHECK(rc == 0, "replay of %" PRIu64 ": rc %d", j, rc);
            }
            CHECK(kv_sm_digest(u.sm, &after) == 0, "digest");
            CHECK(before == after,
                  "digest changed across restart (replayed from %" PRIu64 ")", from);
            check_reads(u.sm, &m, idx, g);
            restarts++;
        }
        if (fails > 0)
            break;
    }
    /* Finally, the whole state against the model. */
    uint64_t idx = n_ops;
    struct kv_range all = {0};
    struct scan_ctx s = {.m = &m, .idx = idx, .r = &all};
    if (fails == 0) {
        CHECK(kv_sm_scan(u.sm, &all, 0, scan_cb, &s) == 0, "scan");
        size_t live = 0;
        for (size_t i = 0; i < m.n; i++)
            live += mlive(&m, &m.e[i]);
        CHECK(s.seen == live, "final scan %zu keys, model %zu", s.seen, live);
    }
    struct kv_sm_stats st;
    kv_sm_stats(u.sm, &st);
    rewrites += st.rewrites;
    /* Both write paths are exercised: in-place rewrites are a good share of
     * the overwrites, or none at all with --append-only. */
    CHECK(append_only ? rewrites == 0 : rewrites > n_ops / 100, "%" PRIu64 " rewrites",
          rewrites);
    printf("ops=%" PRIu64 " seed=%" PRIu64 " restarts=%" PRIu64 " tier_downs=%" PRIu64
           " rewrites=%" PRIu64 " retries=%" PRIu64 " (answered from table %" PRIu64
           ") keys=%zu fails=%d\n",
           n_ops, seed, restarts, tier_downs + st.tier_downs, rewrites, dups, dup_hits,
           m.n, fails);
    for (uint64_t i = 0; i <= n_ops; i++)
        tk_free(log[i].cmd);
    tk_free(log);
    tk_free(g);
    tk_free(m.e);
    kvu_close(&u, true);
    return fails == 0 ? 0 : 1;
}
