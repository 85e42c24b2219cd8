/* etcd's KV service: Range, Put, DeleteRange and Txn (docs/etcd-compat.md
 * says what each field does here). Called through etcdapi.c's method table;
 * answers through etcdapi_reply.c. Loop thread only.
 *
 * Revisions: a key's mod_revision and create_revision are Raft indexes (the
 * entry that wrote it), its version the writes since it was created; a
 * header's revision is the applied index. Range serves the newest state
 * only: a revision below it is answered as compacted, one above it as a
 * future revision, with etcd's codes and messages. Keys whose first byte
 * is 0x01 are the node's own records: reads skip them, writes refuse them.
 *
 * Bounds: a Range answers at most range_limit_max keys and about a
 * message's bytes (more=true beyond), counts at most count_max keys, and
 * reads at most KV_SCAN_SKIP_MAX deleted records per piece; a sorted Range
 * collects at most count_max keys and SORT_BYTES_MAX bytes before it sorts;
 * a DeleteRange runs in steps of delete_step keys (each its own Raft entry)
 * and answers about a message's bytes of prev_kvs. prev_kv comes from the
 * change log at the write's revision (see "prev_kv" below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "etcd_kv.pb-c.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

/* A Range answer's keys and values: at most this many bytes (under the
 * 2 MiB message limit of grpc.c, with room for the framing). */
#define RANGE_BYTES_MAX (2u << 20)

static const uint8_t reserved_lo[1] = {KV_RESERVED_BYTE};
static const uint8_t reserved_hi[1] = {KV_RESERVED_BYTE + 1};

static int key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n > 0 ? memcmp(a, b, n) : 0;
    if (c != 0)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static bool reserved_key(const uint8_t *k, size_t len)
{
    return len > 0 && k[0] == KV_RESERVED_BYTE;
}

static uint8_t *dup_bytes(const ProtobufCBinaryData *b, size_t *len)
{
    uint8_t *p = tk_malloc(b->len + 1);
    if (b->len)
        memcpy(p, b->data, b->len);
    *len = b->len;
    return p;
}

/* key/range_end into ec (checked already: range_refusal). */
static void set_range(struct ecall *ec, const ProtobufCBinaryData *key,
                      const ProtobufCBinaryData *end)
{
    ec->key = dup_bytes(key, &ec->key_len);
    if (end->len == 1 && end->data[0] == 0) {
        ec->end_open = true;
        if (ec->key_len == 1 && ec->key[0] == 0)
            ec->key_len = 0; /* "\0" to "\0": every key */
    } else if (end->len > 0) {
        ec->end = dup_bytes(end, &ec->end_len);
    }
}

static const char *range_refusal(const struct ecall *ec, const ProtobufCBinaryData *key,
                                 const ProtobufCBinaryData *end)
{
    size_t max = ec->e->cfg.key_max;
    if (key->len == 0)
        return "etcdserver: key is not provided";
    if (key->len > max || end->len > max)
        return "etcdserver: request is too large";
    return NULL;
}

/* key/range_end into ec: a single key (no range_end), [key, range_end), or
 * from key on (range_end "\0"). Returns 0, or fails the call. */
static int take_range(struct ecall *ec, const ProtobufCBinaryData *key,
                      const ProtobufCBinaryData *end)
{
    const char *why = range_refusal(ec, key, end);
    if (why != NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, why);
        return TK_EINVAL;
    }
    set_range(ec, key, end);
    return 0;
}

/* The sorts, as etcd's: a target other than the key with no order sorts
 * ascending; ascending by key is the scan's own order (no sort). The first
 * or last key by create or mod revision (limit 1: what clientv3's
 * WithFirstCreate/WithLastCreate/...Rev ask, concurrency's Mutex and
 * Election among them) keeps the best key as the scan goes; any other sort
 * collects the range, sorts it, then applies the limit (sort_by; bounded:
 * range_sorted). False for an unknown order or target. */
static bool take_sort(struct ecall *ec, const Etcdserverpb__RangeRequest *rq)
{
    int order = (int)rq->sort_order, target = (int)rq->sort_target;
    if (order < ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE ||
        order > ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND)
        return false;
    bool by_key = target == ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__KEY;
    if (!by_key && order == ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE)
        order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
    if (by_key && order == ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND)
        order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE;
    if (order == ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE)
        return true;
    bool desc = order == ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND;
    if (rq->limit == 1 && (target == ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE ||
                           target == ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__MOD)) {
        ec->sort_top =
            target == ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE ? 'c' : 'm';
        ec->sort_desc = desc;
        return true;
    }
    switch (target) {
    case ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__KEY:
        ec->sort_by = 'k';
        break;
    case ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__VERSION:
        ec->sort_by = 'v';
        break;
    case ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE:
        ec->sort_by = 'c';
        break;
    case ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__MOD:
        ec->sort_by = 'm';
        break;
    case ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__VALUE:
        ec->sort_by = 'V';
        break;
    default:
        return false;
    }
    ec->sort_desc = desc;
    return true;
}

/* A Range's fields into ec (its range already taken). */
static void take_range_fields(struct ecall *ec, const Etcdserverpb__RangeRequest *rq)
{
    ec->revision = rq->revision;
    ec->limit = rq->limit;
    ec->keys_only = rq->keys_only;
    ec->count_only = rq->count_only;
    ec->min_mod = rq->min_mod_revision;
    ec->max_mod = rq->max_mod_revision;
    ec->min_create = rq->min_create_revision;
    ec->max_create = rq->max_create_revision;
}

static bool is_single(const struct ecall *ec)
{
    return ec->end == NULL && !ec->end_open;
}

/* The range without the reserved keys: at most two pieces. */
static size_t range_pieces(const struct ecall *ec, struct kv_range out[2])
{
    struct kv_range r = {.start = ec->key,
                         .start_len = ec->key_len,
                         .end = ec->end,
                         .end_len = ec->end_open ? 0 : ec->end_len};
    if (!ec->end_open && key_cmp(r.start, r.start_len, r.end, r.end_len) >= 0)
        return 0;
    size_t k = 0;
    bool unbounded = ec->end_open;
    if (key_cmp(r.start, r.start_len, reserved_lo, 1) < 0) {
        out[k] = r;
        if (unbounded || key_cmp(r.end, r.end_len, reserved_lo, 1) > 0) {
            out[k].end = reserved_lo;
            out[k].end_len = 1;
        }
        k++;
    }
    if (unbounded || key_cmp(r.end, r.end_len, reserved_hi, 1) > 0) {
        out[k] = r;
        if (key_cmp(r.start, r.start_len, reserved_hi, 1) < 0) {
            out[k].start = reserved_hi;
            out[k].start_len = 1;
        }
        k++;
    }
    return k;
}

/* ---- Range ------------------------------------------------------------------ */

struct range_state {
    struct ecall *ec;
    Mvccpb__KeyValue *kvs;
    Mvccpb__KeyValue **kvp;
    uint32_t n, cap;
    uint32_t take;  /* keys to return at most */
    uint64_t count; /* keys in range (filtered) */
    uint64_t bytes; /* keys and values copied */
    bool more;
    bool full;          /* stopped building: only counting */
    uint64_t visited;   /* keys looked at, filtered out or not */
    uint64_t visit_max; /* ... at most (0: the config's count_max) */
    bool cut;           /* a sort's collection passed SORT_BYTES_MAX */
    struct kv_sm *sm;   /* read from (leases) */
};

/* A sorted Range collects its keys (and their values when it sorts by
 * them; else the values of the keys it answers are read after the sort)
 * before it sorts: at most this many bytes of them, besides the count bound
 * on the keys it looks at. Past either: ResourceExhausted. */
#define SORT_BYTES_MAX (8u << 20)

static bool range_filter(const struct ecall *ec, const struct kv_item *it)
{
    int64_t mod = (int64_t)it->mod_revision, cr = (int64_t)it->create_revision;
    return (ec->min_mod == 0 || mod >= ec->min_mod) &&
           (ec->max_mod == 0 || mod <= ec->max_mod) &&
           (ec->min_create == 0 || cr >= ec->min_create) &&
           (ec->max_create == 0 || cr <= ec->max_create);
}

/* An item as a KeyValue, with its lease (looked up in sm). */
static void kv_from_item(struct kv_sm *sm, const struct kv_item *it, Mvccpb__KeyValue *kv,
                         bool value)
{
    mvccpb__key_value__init(kv);
    kv->lease = (int64_t)kv_sm_key_lease(sm, it->key, it->key_len);
    kv->key.data = tk_malloc(it->key_len + 1);
    memcpy(kv->key.data, it->key, it->key_len);
    kv->key.len = it->key_len;
    if (value && it->value_len > 0) {
        kv->value.data = tk_malloc(it->value_len);
        memcpy(kv->value.data, it->value, it->value_len);
        kv->value.len = it->value_len;
    }
    kv->create_revision = (int64_t)it->create_revision;
    kv->mod_revision = (int64_t)it->mod_revision;
    kv->version = (int64_t)it->version;
}

static int range_item(const struct kv_item *it, void *data)
{
    struct range_state *s = data;
    struct ecall *ec = s->ec;
    /* Every key looked at counts against the budget, filtered out or not:
     * a revision filter that keeps nothing must not walk the whole keyspace
     * in one read callback. */
    if (++s->visited > s->visit_max) {
        s->more = true;
        return 1;
    }
    if (!range_filter(ec, it))
        return 0;
    s->count++;
    if (s->count >= ec->e->cfg.count_max)
        return 1;
    if (ec->count_only || s->full)
        return 0;
    if (ec->sort_by != 0) { /* collect all (values to sort by only), sorted after */
        bool values = ec->sort_by == 'V';
        size_t b = it->key_len + (values ? it->value_len : 0) + 32;
        if (s->bytes + b > SORT_BYTES_MAX) {
            s->cut = true;
            return 1;
        }
        if (s->n == s->cap) {
            uint32_t cap = s->cap ? s->cap * 2 : 16;
            s->kvs = tk_realloc(s->kvs, cap * sizeof(*s->kvs));
            s->cap = cap;
        }
        kv_from_item(s->sm, it, &s->kvs[s->n++], values);
        s->bytes += b;
        return 0;
    }
    if (ec->sort_top != 0) { /* keep the best one */
        uint64_t rev = ec->sort_top == 'c' ? it->create_revision : it->mod_revision;
        if (s->n == 1) {
            uint64_t cur = (uint64_t)(ec->sort_top == 'c' ? s->kvs[0].create_revision
                                                          : s->kvs[0].mod_revision);
            s->more = true;
            if (ec->sort_desc ? rev <= cur : rev >= cur)
                return 0;
            tk_free(s->kvs[0].key.data);
            tk_free(s->kvs[0].value.data);
            s->n = 0;
        }
        if (s->cap == 0) {
            s->kvs = tk_malloc(sizeof(*s->kvs));
            s->cap = 1;
        }
        kv_from_item(s->sm, it, &s->kvs[s->n++], !ec->keys_only);
        return 0;
    }
    size_t b = it->key_len + (ec->keys_only ? 0 : it->value_len) + 32;
    if (s->n == s->take || (s->n > 0 && s->bytes + b > RANGE_BYTES_MAX)) {
        s->more = true;
        s->full = true;
        return 0;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 16;
        s->kvs = tk_realloc(s->kvs, cap * sizeof(*s->kvs));
        s->cap = cap;
    }
    kv_from_item(s->sm, it, &s->kvs[s->n++], !ec->keys_only);
    s->bytes += b;
    return 0;
}

static void range_answer(struct ecall *ec, struct range_state *s, uint64_t rev)
{
    s->kvp = tk_calloc(s->n ? s->n : 1, sizeof(*s->kvp));
    for (uint32_t i = 0; i < s->n; i++)
        s->kvp[i] = &s->kvs[i];
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, rev, &h);
    Etcdserverpb__RangeResponse r = ETCDSERVERPB__RANGE_RESPONSE__INIT;
    r.header = &h;
    r.kvs = s->kvp;
    r.n_kvs = s->n;
    r.more = s->more;
    r.count = (int64_t)s->count;
    etcdapi__reply(ec, &r.base);
}

static void range_state_free(struct range_state *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        tk_free(s->kvs[i].key.data);
        tk_free(s->kvs[i].value.data);
    }
    tk_free(s->kvs);
    tk_free(s->kvp);
}

static int kv_sort_cmp(const void *pa, const void *pb, void *arg)
{
    const struct ecall *ec = arg;
    const Mvccpb__KeyValue *a = pa, *b = pb;
    int c = 0;
    switch (ec->sort_by) {
    case 'v':
        c = (a->version > b->version) - (a->version < b->version);
        break;
    case 'c':
        c = (a->create_revision > b->create_revision) -
            (a->create_revision < b->create_revision);
        break;
    case 'm':
        c = (a->mod_revision > b->mod_revision) - (a->mod_revision < b->mod_revision);
        break;
    case 'V':
        c = key_cmp(a->value.data, a->value.len, b->value.data, b->value.len);
        break;
    default:
        break;
    }
    if (ec->sort_desc)
        c = -c;
    if (c == 0) /* ties (and the key target): by key */
        c = key_cmp(a->key.data, a->key.len, b->key.data, b->key.len) *
            (ec->sort_by == 'k' && ec->sort_desc ? -1 : 1);
    return c;
}

/* A key's value, read again for a sorted answer (the same read callback:
 * the state has not moved since the scan). 0 or TK_EIO. */
static int sorted_value(struct kv_sm *sm, Mvccpb__KeyValue *kv)
{
    struct kv_item it;
    int rc = kv_sm_get(sm, kv->key.data, kv->key.len, &it);
    if (rc == TK_ENOTFOUND)
        return 0; /* (cannot be) */
    if (rc != 0)
        return rc;
    if (it.value_len > 0) {
        kv->value.data = tk_malloc(it.value_len);
        memcpy(kv->value.data, it.value, it.value_len);
        kv->value.len = it.value_len;
    }
    return 0;
}

/* A collected range sorted, then cut to the limit and an answer's bytes
 * (more when keys are left), the values of the keys kept read then (unless
 * collected to sort by). TK_ETOOBIG when the range had more keys than the
 * collection holds (the sort would be wrong); TK_EIO. */
static int range_sorted(struct ecall *ec, struct kv_sm *sm, struct range_state *s)
{
    if (s->cut || s->visited > s->visit_max || s->count >= ec->e->cfg.count_max)
        return TK_ETOOBIG;
    if (s->n > 1)
        qsort_r(s->kvs, s->n, sizeof(*s->kvs), kv_sort_cmp, ec);
    uint32_t keep = 0;
    uint64_t bytes = 0;
    int rc = 0;
    for (; keep < s->n && keep < s->take; keep++) {
        Mvccpb__KeyValue *kv = &s->kvs[keep];
        if (ec->keys_only) { /* collected to sort by */
            tk_free(kv->value.data);
            kv->value.data = NULL;
            kv->value.len = 0;
        } else if (ec->sort_by != 'V' && (rc = sorted_value(sm, kv)) != 0) {
            break;
        }
        uint64_t b = kv->key.len + kv->value.len + 32;
        if (keep > 0 && bytes + b > RANGE_BYTES_MAX)
            break;
        bytes += b;
    }
    for (uint32_t i = keep; i < s->n; i++) {
        tk_free(s->kvs[i].key.data);
        tk_free(s->kvs[i].value.data);
    }
    s->more = keep < s->n;
    s->n = keep;
    s->bytes = bytes;
    return rc;
}

/* The range's keys into s (range_state_free after, whatever it returns),
 * looking at visit_max keys at most (0: the config's count_max). */
static int range_collect(struct ecall *ec, struct kv_sm *sm, struct range_state *s,
                         uint64_t visit_max)
{
    memset(s, 0, sizeof(*s));
    s->ec = ec;
    s->sm = sm;
    s->visit_max = visit_max != 0 ? visit_max : ec->e->cfg.count_max;
    s->take = ec->e->cfg.range_limit_max;
    if (ec->limit > 0 && (uint64_t)ec->limit < s->take)
        s->take = (uint32_t)ec->limit; /* limit 0: no limit but ours */
    int rc = 0;
    if (is_single(ec)) {
        struct kv_item it;
        rc = reserved_key(ec->key, ec->key_len)
                 ? TK_ENOTFOUND
                 : kv_sm_get(sm, ec->key, ec->key_len, &it);
        if (rc == 0)
            range_item(&it, s);
        else if (rc == TK_ENOTFOUND)
            rc = 0;
    } else {
        struct kv_range pieces[2];
        size_t n = range_pieces(ec, pieces);
        for (size_t i = 0; i < n && rc == 0 && s->count < ec->e->cfg.count_max &&
                           s->visited <= s->visit_max;
             i++)
            rc = kv_sm_scan_bounded(sm, &pieces[i], 0, KV_SCAN_SKIP_MAX, range_item, s,
                                    NULL);
    }
    if (ec->count_only)
        s->more = s->visited > s->visit_max; /* a count cut short says so */
    else if (rc == 0 && ec->sort_by != 0)
        rc = range_sorted(ec, sm, s);
    return rc;
}

static void range_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    uint64_t applied = kv_sm_applied_index(sm);
    if (ec->revision > 0 && (uint64_t)ec->revision > applied) {
        etcdapi__fail(ec, GRPC_OUT_OF_RANGE,
                      "etcdserver: mvcc: required revision is a future revision");
        return;
    }
    if (ec->revision > 0 && (uint64_t)ec->revision < applied) {
        etcdapi__fail(ec, GRPC_OUT_OF_RANGE,
                      "etcdserver: mvcc: required revision has been compacted");
        return;
    }
    if (grpc_call_gone(ec->call)) {
        etcdapi__fail(ec, GRPC_CANCELLED, "gone");
        return;
    }
    if (!ec->count_only && grpc_call_would_overload(ec->call, RANGE_BYTES_MAX)) {
        etcdapi__fail(ec, GRPC_RESOURCE_EXHAUSTED,
                      "etcdserver: too many requests (output not taken by the client)");
        return;
    }
    struct range_state s;
    int rc = range_collect(ec, sm, &s, 0);
    if (rc == TK_ETOOBIG) {
        range_state_free(&s);
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "tierkv: a sorted Range collects %llu keys and %u MiB of them at "
                 "most (this range holds more)",
                 (unsigned long long)ec->e->cfg.count_max, SORT_BYTES_MAX >> 20);
        etcdapi__fail(ec, GRPC_RESOURCE_EXHAUSTED, msg);
        return;
    }
    if (rc != 0) {
        range_state_free(&s);
        etcdapi__fail_rc(ec, rc);
        return;
    }
    range_answer(ec, &s, applied);
    range_state_free(&s);
}

void etcdapi__kv_range(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__RangeRequest *rq =
        etcdapi__unpack(&etcdserverpb__range_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed RangeRequest");
        return;
    }
    bool sort_ok = take_sort(ec, rq);
    bool serializable = rq->serializable;
    int rc = 0;
    if (!sort_ok) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: an unknown sort order or sort target");
        rc = TK_EINVAL;
    } else if (rq->revision < 0 || rq->limit < 0) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a negative revision or limit");
        rc = TK_EINVAL;
    } else {
        rc = take_range(ec, &rq->key, &rq->range_end);
    }
    if (rc == 0)
        take_range_fields(ec, rq);
    etcdserverpb__range_request__free_unpacked(rq, NULL);
    if (rc == 0)
        etcdapi__submit_read(ec, serializable, range_read_cb);
}

/* ---- prev_kv: a write's previous key-values ---------------------------------
 *
 * Applying a write records in the change log, at the write's revision, each
 * key it changed with the key's previous version (kv/events.c), in the same
 * step as the write itself: that is where prev_kv comes from, atomic with
 * the write, never from a read before it. On the leader the write's
 * callback runs right after its entry applied, so the change log holds it;
 * on a follower (the leader answered a forwarded write) a linearizable read
 * first waits until this node applied it. The change log is bounded
 * (--watch-events, --watch-events-bytes): a revision it no longer holds by
 * then fails the call (Internal), after the write. */

/* A DeleteRange's previous key-values: at most about one answer's bytes. */
#define PREV_BYTES_MAX RANGE_BYTES_MAX

struct etcdapi_prevs {
    Mvccpb__KeyValue *kvs;
    uint32_t n, cap;
    uint64_t bytes;
    bool over; /* past PREV_BYTES_MAX: no more kept */
};

static void prevs_free(struct etcdapi_prevs *p)
{
    if (p == NULL)
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        tk_free(p->kvs[i].key.data);
        tk_free(p->kvs[i].value.data);
    }
    tk_free(p->kvs);
    tk_free(p);
}

/* Every end of a call that may hold prevs goes through these three. */
static void kv_fail(struct ecall *ec, int code, const char *msg)
{
    prevs_free(ec->prevs);
    etcdapi__fail(ec, code, msg);
}

static void kv_fail_rc(struct ecall *ec, int rc)
{
    prevs_free(ec->prevs);
    etcdapi__fail_rc(ec, rc);
}

/* Replies msg, which may point into ec->prevs: freed after it is packed
 * (and ec with the reply). */
static void kv_reply(struct ecall *ec, const ProtobufCMessage *msg)
{
    struct etcdapi_prevs *p = ec->prevs;
    etcdapi__reply(ec, msg);
    prevs_free(p);
}

/* etcdapi__submit_write/_read (etcdapi_reply.c), but a refusal is returned,
 * not answered: the caller frees its prevs first (kv_fail_rc). */
static int kv_submit(struct ecall *ec, const Kvpb__Command *cmd, node_write_cb *wcb,
                     node_read_cb *rcb)
{
    uint64_t t = ec->e->cfg.request_timeout_ms;
    uint64_t g = grpc_call_timeout_ms(ec->call);
    memset(&ec->nreq, 0, sizeof(ec->nreq));
    ec->nreq.data = ec;
    ec->nreq.timeout_ms = g != 0 && (t == 0 || g < t) ? g : t;
    if (cmd != NULL) {
        size_t len = kvpb__command__get_packed_size(cmd);
        ec->nreq.cmd = tk_blob_new(len);
        kvpb__command__pack(cmd, ec->nreq.cmd->data);
        ec->nreq.mode = NODE_MODE_APPLIED;
        ec->nreq.write_cb = wcb;
    } else {
        ec->nreq.is_read = 1;
        ec->nreq.consistency = NODE_READ_LINEARIZABLE;
        ec->nreq.read_cb = rcb;
    }
    int rc = etcdapi__node_submit(ec->e, &ec->nreq, &ec->res);
    if (rc != 0 && ec->nreq.cmd != NULL) { /* refused: the command is still ours */
        tk_blob_unref(ec->nreq.cmd);
        ec->nreq.cmd = NULL;
    }
    return rc;
}

struct prev_read {
    struct etcdapi_prevs *p;
    uint64_t rev;
    uint32_t seen; /* events of rev */
};

static void prev_event(const struct kv_event *ev, void *data)
{
    struct prev_read *r = data;
    if (ev->revision != r->rev)
        return; /* (a later revision, read whole) */
    r->seen++;
    if (!ev->has_prev || ev->type == KV_EVENT_EXPIRE)
        return; /* created, or the key's TTL had run out */
    struct etcdapi_prevs *p = r->p;
    uint64_t b = ev->key_len + ev->prev_value_len + 32;
    if (p->over || (p->n > 0 && p->bytes + b > PREV_BYTES_MAX)) {
        p->over = true;
        return;
    }
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 4;
        p->kvs = tk_realloc(p->kvs, cap * sizeof(*p->kvs));
        p->cap = cap;
    }
    Mvccpb__KeyValue *kv = &p->kvs[p->n++];
    mvccpb__key_value__init(kv);
    kv->key.data = tk_malloc(ev->key_len + 1);
    memcpy(kv->key.data, ev->key, ev->key_len);
    kv->key.len = ev->key_len;
    if (ev->prev_value_len > 0) {
        kv->value.data = tk_malloc(ev->prev_value_len);
        memcpy(kv->value.data, ev->prev_value, ev->prev_value_len);
        kv->value.len = ev->prev_value_len;
    }
    kv->create_revision = (int64_t)ev->prev_create_revision;
    kv->mod_revision = (int64_t)ev->prev_mod_revision;
    kv->version = (int64_t)ev->prev_version;
    kv->lease = (int64_t)ev->prev_lease;
    p->bytes += b;
}

/* The previous key-values of the write at ec->prev_rev, from sm's change
 * log, into ec->prevs: 0, or TK_ECOMPACTED when it no longer holds that
 * revision (or holds no events). sm has applied it. */
static int prevs_read(struct ecall *ec, struct kv_sm *sm)
{
    if (ec->prevs == NULL)
        ec->prevs = tk_calloc(1, sizeof(*ec->prevs));
    struct prev_read r = {.p = ec->prevs, .rev = ec->prev_rev};
    uint64_t next;
    int rc = kv_sm_events_read(sm, ec->prev_rev, 1, 0, prev_event, &r, &next);
    if (rc == 0 && r.seen == 0)
        rc = TK_ECOMPACTED; /* a write leaves at least one event */
    return rc;
}

static void prev_lost(struct ecall *ec)
{
    char msg[200];
    snprintf(msg, sizeof(msg),
             "tierkv: the write applied at revision %llu, but its previous key-value "
             "left the change log before it was read (--watch-events)",
             (unsigned long long)ec->prev_rev);
    kv_fail(ec, GRPC_INTERNAL, msg);
}

/* After the read that waits for the write's entry on a follower: its
 * previous key-values, then `then`. */
static void prev_read_then(struct ecall *ec, int status, struct kv_sm *sm,
                           void (*then)(struct ecall *ec))
{
    if (status != 0) {
        kv_fail_rc(ec, status);
        return;
    }
    if (kv_sm_applied_index(sm) < ec->prev_rev) { /* cannot be: the read waits */
        kv_fail(ec, GRPC_UNAVAILABLE, "etcdserver: request timed out");
        return;
    }
    if (prevs_read(ec, sm) != 0) {
        prev_lost(ec);
        return;
    }
    then(ec);
}

/* Reads the write's previous key-values (ec->prev_rev), now if this node
 * applied it, else after a read that waits for it (read_cb, which calls
 * prev_read_then); then `then`. */
static void prev_fetch(struct ecall *ec, node_read_cb *read_cb,
                       void (*then)(struct ecall *))
{
    struct etcdapi *e = ec->e;
    if (node_applied_index(e->node) >= ec->prev_rev) {
        if (!etcdapi__state_enter(e)) {
            kv_fail_rc(ec, TK_ESHUTDOWN);
            return;
        }
        int rc = prevs_read(ec, node_kv(e->node));
        etcdapi__state_leave(e, false);
        if (rc != 0) {
            prev_lost(ec);
            return;
        }
        then(ec);
        return;
    }
    int rc = kv_submit(ec, NULL, NULL, read_cb);
    if (rc != 0)
        kv_fail_rc(ec, rc);
}

/* ---- Put -------------------------------------------------------------------- */

static void put_answer(struct ecall *ec)
{
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header_write(ec->e, ec->prev_rev, &h);
    Etcdserverpb__PutResponse r = ETCDSERVERPB__PUT_RESPONSE__INIT;
    r.header = &h;
    if (ec->prevs != NULL && ec->prevs->n > 0)
        r.prev_kv = &ec->prevs->kvs[0];
    kv_reply(ec, &r.base);
}

static void put_prev_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    prev_read_then(data, status, sm, put_answer);
}

static void put_done(struct node_req *nreq, int status, const struct kv_result *res,
                     void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status == 0 && res->code == TK_ECOMPARE && ec->put_keep) {
        /* ignore_value or ignore_lease, and the key is not there */
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "etcdserver: key not found");
        return;
    }
    if (status == 0 && res->code != 0)
        status = res->code;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    ec->prev_rev = res->revision;
    if (!ec->prev_kv || res->revision == 0) {
        put_answer(ec);
        return;
    }
    prev_fetch(ec, put_prev_cb, put_answer);
}

/* The checks a put shares with a txn's: 0, or a message for the client. */
static const char *put_refusal(const struct etcdapi *e, const Etcdserverpb__PutRequest *p)
{
    if (p->key.len == 0)
        return "etcdserver: key is not provided";
    if (p->ignore_value && p->value.len != 0)
        return "etcdserver: value is provided";
    if (p->ignore_lease && p->lease != 0)
        return "etcdserver: lease is provided";
    if (p->key.len > e->cfg.key_max || p->value.len > e->cfg.value_max)
        return "etcdserver: request is too large";
    if (reserved_key(p->key.data, p->key.len))
        return "tierkv: keys starting with byte 0x01 are reserved";
    if (p->lease < 0)
        return "etcdserver: requested lease not found";
    return NULL;
}

/* What a Put in a Txn does not do yet. */
static const char *put_unsupported(const Etcdserverpb__PutRequest *p)
{
    if (p->prev_kv)
        return "tierkv: prev_kv on a Put in a Txn is not supported yet";
    if (p->ignore_value || p->ignore_lease)
        return "tierkv: ignore_value and ignore_lease on a Put in a Txn are not "
               "supported yet";
    return NULL;
}

void etcdapi__kv_put(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__PutRequest *rq =
        etcdapi__unpack(&etcdserverpb__put_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed PutRequest");
        return;
    }
    const char *bad = put_refusal(ec->e, rq);
    if (bad != NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, bad);
    } else {
        Kvpb__Command cmd = KVPB__COMMAND__INIT;
        Kvpb__Put put = KVPB__PUT__INIT;
        put.key = rq->key;
        put.value = rq->value;
        put.lease = (uint64_t)rq->lease;
        put.keep_value = rq->ignore_value;
        put.keep_lease = rq->ignore_lease;
        ec->prev_kv = rq->prev_kv;
        ec->put_keep = rq->ignore_value || rq->ignore_lease;
        cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
        cmd.put = &put;
        etcdapi__submit_write(ec, &cmd, put_done);
    }
    etcdserverpb__put_request__free_unpacked(rq, NULL);
}

/* ---- DeleteRange -------------------------------------------------------------- */

static void delete_step(struct ecall *ec);

/* After a step (and its previous key-values): the next step, or the answer. */
static void delete_next(struct ecall *ec)
{
    if (ec->prev_more && !grpc_call_gone(ec->call)) {
        delete_step(ec);
        return;
    }
    if (ec->prevs != NULL && ec->prevs->over) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "tierkv: deleted %llu keys, but their previous key-values are more "
                 "than one answer holds (2 MiB)",
                 (unsigned long long)ec->deleted);
        kv_fail(ec, GRPC_RESOURCE_EXHAUSTED, msg);
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header_write(ec->e, ec->prev_rev, &h);
    Etcdserverpb__DeleteRangeResponse r = ETCDSERVERPB__DELETE_RANGE_RESPONSE__INIT;
    r.header = &h;
    r.deleted = (int64_t)ec->deleted;
    Mvccpb__KeyValue **kvp = NULL;
    if (ec->prevs != NULL && ec->prevs->n > 0) {
        kvp = tk_calloc(ec->prevs->n, sizeof(*kvp));
        for (uint32_t i = 0; i < ec->prevs->n; i++)
            kvp[i] = &ec->prevs->kvs[i];
        r.prev_kvs = kvp;
        r.n_prev_kvs = ec->prevs->n;
    }
    kv_reply(ec, &r.base);
    tk_free(kvp);
}

static void delete_prev_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data)
{
    (void)nreq;
    prev_read_then(data, status, sm, delete_next);
}

static void delete_done(struct node_req *nreq, int status, const struct kv_result *res,
                        void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status == 0 && res->code != 0)
        status = res->code;
    if (status != 0) {
        kv_fail_rc(ec, status);
        return;
    }
    ec->deleted = res->deleted; /* with deleted_before: the running total */
    ec->prev_more = res->more;
    if (res->revision != 0)
        ec->prev_rev = res->revision;
    if (ec->prev_kv && res->revision != 0) /* this step deleted keys */
        prev_fetch(ec, delete_prev_cb, delete_next);
    else
        delete_next(ec);
}

static void delete_step(struct ecall *ec)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange dr = KVPB__DELETE_RANGE__INIT;
    dr.start.data = ec->key;
    dr.start.len = ec->key_len;
    dr.end.data = ec->end;
    dr.end.len = ec->end_open ? 0 : ec->end_len;
    dr.limit = ec->e->cfg.delete_step;
    dr.deleted_before = ec->deleted;
    cmd.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    cmd.delete_range = &dr;
    int rc = kv_submit(ec, &cmd, delete_done, NULL);
    if (rc != 0)
        kv_fail_rc(ec, rc);
}

void etcdapi__kv_delete_range(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__DeleteRangeRequest *rq =
        etcdapi__unpack(&etcdserverpb__delete_range_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: a malformed DeleteRangeRequest");
        return;
    }
    ec->prev_kv = rq->prev_kv;
    int rc = take_range(ec, &rq->key, &rq->range_end);
    etcdserverpb__delete_range_request__free_unpacked(rq, NULL);
    if (rc != 0)
        return;
    if (!is_single(ec)) {
        if (!ec->end_open && key_cmp(ec->key, ec->key_len, ec->end, ec->end_len) >= 0) {
            /* An empty range deletes nothing (an empty end would mean "no
             * bound" to kv's DeleteRange). */
            Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
            etcdapi__header(ec->e, 0, &h);
            Etcdserverpb__DeleteRangeResponse r =
                ETCDSERVERPB__DELETE_RANGE_RESPONSE__INIT;
            r.header = &h;
            etcdapi__reply(ec, &r.base);
            return;
        }
        delete_step(ec);
        return;
    }
    if (reserved_key(ec->key, ec->key_len)) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT,
                      "tierkv: keys starting with byte 0x01 are reserved");
        return;
    }
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Delete del = KVPB__DELETE__INIT;
    del.key.data = ec->key;
    del.key.len = ec->key_len;
    cmd.cmd_case = KVPB__COMMAND__CMD_DEL;
    cmd.del = &del;
    etcdapi__submit_write(ec, &cmd, delete_done);
}

/* ---- Txn -------------------------------------------------------------------- */

/* A txn's command, built from the request in arrays sized once. */
struct txn_build {
    Kvpb__Txn txn;
    Kvpb__Compare *cmps, **cmpp;
    Kvpb__Op *ops, **opp;
    Kvpb__Put *puts;
    Kvpb__Delete *dels;
};

static void txn_build_free(struct txn_build *b)
{
    tk_free(b->cmps);
    tk_free(b->cmpp);
    tk_free(b->ops);
    tk_free(b->opp);
    tk_free(b->puts);
    tk_free(b->dels);
}

/* One compare; NULL, or why it is refused (*code: the gRPC code). */
static const char *txn_compare(const struct etcdapi *e, const Etcdserverpb__Compare *c,
                               Kvpb__Compare *out, int *code)
{
    kvpb__compare__init(out);
    *code = GRPC_INVALID_ARGUMENT;
    if (c->key.len == 0)
        return "etcdserver: key is not provided";
    if (c->key.len > e->cfg.key_max || c->range_end.len > e->cfg.key_max)
        return "etcdserver: request is too large";
    *code = GRPC_UNIMPLEMENTED;
    out->key = c->key;
    out->range_end = c->range_end; /* kv/ reads "\0" as from key on, as etcd */
    switch (c->result) {
    case ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL:
        out->op = KVPB__COMPARE__OP__EQUAL;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER:
        out->op = KVPB__COMPARE__OP__GREATER;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS:
        out->op = KVPB__COMPARE__OP__LESS;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL:
        out->op = KVPB__COMPARE__OP__NOT_EQUAL;
        break;
    default:
        *code = GRPC_INVALID_ARGUMENT;
        return "tierkv: an unknown compare result";
    }
    switch (c->target) {
    case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION:
        out->target = KVPB__COMPARE__TARGET__VERSION;
        out->number = c->version;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE:
        out->target = KVPB__COMPARE__TARGET__CREATE_REVISION;
        out->number = c->create_revision;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD:
        out->target = KVPB__COMPARE__TARGET__MOD_REVISION;
        out->number = c->mod_revision;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE:
        out->target = KVPB__COMPARE__TARGET__VALUE;
        out->value = c->value;
        break;
    case ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE:
        out->target = KVPB__COMPARE__TARGET__LEASE;
        out->number = c->lease;
        break;
    default:
        *code = GRPC_INVALID_ARGUMENT;
        return "tierkv: an unknown compare target";
    }
    return NULL;
}

/* One op of a branch: a put, or a delete of one key. */
static const char *txn_op(const struct etcdapi *e, const Etcdserverpb__RequestOp *r,
                          struct txn_build *b, size_t i, uint8_t *kind, int *code)
{
    kvpb__op__init(&b->ops[i]);
    b->opp[i] = &b->ops[i];
    *code = GRPC_UNIMPLEMENTED;
    if (r->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT) {
        const Etcdserverpb__PutRequest *p = r->request_put;
        const char *why = put_unsupported(p);
        if (why != NULL)
            return why;
        *code = GRPC_INVALID_ARGUMENT;
        if ((why = put_refusal(e, p)) != NULL)
            return why;
        kvpb__put__init(&b->puts[i]);
        b->puts[i].key = p->key;
        b->puts[i].value = p->value;
        b->puts[i].lease = (uint64_t)p->lease;
        b->ops[i].op_case = KVPB__OP__OP_PUT;
        b->ops[i].put = &b->puts[i];
        *kind = 'p';
        return NULL;
    }
    if (r->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE) {
        const Etcdserverpb__DeleteRangeRequest *d = r->request_delete_range;
        if (d->range_end.len > 0 || d->prev_kv)
            return "tierkv: a Txn deletes single keys only, without prev_kv (not yet "
                   "more)";
        *code = GRPC_INVALID_ARGUMENT;
        if (d->key.len == 0)
            return "etcdserver: key is not provided";
        if (d->key.len > e->cfg.key_max)
            return "etcdserver: request is too large";
        if (reserved_key(d->key.data, d->key.len))
            return "tierkv: keys starting with byte 0x01 are reserved";
        kvpb__delete__init(&b->dels[i]);
        b->dels[i].key = d->key;
        b->ops[i].op_case = KVPB__OP__OP_DEL;
        b->ops[i].del = &b->dels[i];
        *kind = 'd';
        return NULL;
    }
    return "tierkv: a nested Txn inside a Txn is not supported yet";
}

/* A Range op of a Txn: read once the Txn applied (txn_read_cb). */
static const char *txn_range(struct ecall *ec, const Etcdserverpb__RangeRequest *rr,
                             int *code)
{
    struct ecall probe = {.e = ec->e};
    *code = GRPC_INVALID_ARGUMENT;
    const char *why = range_refusal(ec, &rr->key, &rr->range_end);
    if (why != NULL)
        return why;
    *code = GRPC_UNIMPLEMENTED;
    if (rr->revision != 0)
        return "tierkv: a Range in a Txn reads the newest state only (no revision)";
    if (rr->limit < 0 || !take_sort(&probe, rr) || probe.sort_by != 0)
        return "tierkv: a Range in a Txn sorts only by key ascending, or the first/last "
               "by create or mod revision with limit 1 (not yet otherwise)";
    return NULL;
}

/* The whole request into b and ec->op_kinds; NULL or why it is refused. */
static const char *txn_take(struct ecall *ec, const Etcdserverpb__TxnRequest *rq,
                            struct txn_build *b, int *code)
{
    const struct etcdapi *e = ec->e;
    size_t nc = rq->n_compare, no = rq->n_success + rq->n_failure;
    *code = GRPC_INVALID_ARGUMENT;
    if (nc > KV_TXN_OPS_MAX || no > KV_TXN_OPS_MAX)
        return "etcdserver: too many operations in txn request";
    b->cmps = tk_calloc(nc ? nc : 1, sizeof(*b->cmps));
    b->cmpp = tk_calloc(nc ? nc : 1, sizeof(*b->cmpp));
    b->ops = tk_calloc(no ? no : 1, sizeof(*b->ops));
    b->opp = tk_calloc(no ? no : 1, sizeof(*b->opp));
    b->puts = tk_calloc(no ? no : 1, sizeof(*b->puts));
    b->dels = tk_calloc(no ? no : 1, sizeof(*b->dels));
    ec->op_kinds = tk_calloc(no ? no : 1, 1);
    for (size_t i = 0; i < nc; i++) {
        const char *why = txn_compare(e, rq->compare[i], &b->cmps[i], code);
        if (why != NULL)
            return why;
        b->cmpp[i] = &b->cmps[i];
    }
    size_t k = 0, k_then = 0; /* the command's ops (a Range is not one) */
    for (size_t i = 0; i < no; i++) {
        const Etcdserverpb__RequestOp *r =
            i < rq->n_success ? rq->success[i] : rq->failure[i - rq->n_success];
        if (i == rq->n_success)
            k_then = k;
        const char *why;
        if (r->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE) {
            why = txn_range(ec, r->request_range, code);
            ec->op_kinds[i] = 'r';
        } else {
            why = txn_op(e, r, b, k++, &ec->op_kinds[i], code);
        }
        if (why != NULL)
            return why;
    }
    if (rq->n_success == no)
        k_then = k;
    kvpb__txn__init(&b->txn);
    b->txn.compares = b->cmpp;
    b->txn.n_compares = nc;
    b->txn.then_ops = b->opp;
    b->txn.n_then_ops = k_then;
    b->txn.else_ops = b->opp + k_then;
    b->txn.n_else_ops = k - k_then;
    ec->n_ops = (uint32_t)no;
    ec->n_success = (uint32_t)rq->n_success;
    return NULL;
}

/* The Txn's answer: its taken branch's results; its Range ops read from sm
 * (after the Txn applied; NULL when there are none). */
/* A Txn's Range op q, read from sm into rr (qe and rs hold what it read
 * until the answer is sent), looking at *budget keys at most (the Txn's
 * Range ops share one count_max). Returns the bytes read. */
static uint64_t txn_range_op(struct ecall *ec, struct kv_sm *sm,
                             const Etcdserverpb__RangeRequest *q, struct ecall *qe,
                             struct range_state *rs, Etcdserverpb__RangeResponse *rr,
                             uint64_t *budget)
{
    qe->e = ec->e;
    set_range(qe, &q->key, &q->range_end);
    (void)take_sort(qe, q);
    take_range_fields(qe, q);
    (void)range_collect(qe, sm, rs,
                        *budget > 0 ? *budget : 1); /* an error: what was read */
    *budget -= rs->visited < *budget ? rs->visited : *budget;
    rs->kvp = tk_calloc(rs->n ? rs->n : 1, sizeof(*rs->kvp));
    for (uint32_t j = 0; j < rs->n; j++)
        rs->kvp[j] = &rs->kvs[j];
    rr->kvs = rs->kvp;
    rr->n_kvs = rs->n;
    rr->more = rs->more;
    rr->count = (int64_t)rs->count;
    return rs->bytes;
}

static void txn_answer(struct ecall *ec, const struct kv_result *res, struct kv_sm *sm)
{
    uint32_t first = res->succeeded ? 0 : ec->n_success;
    uint32_t n = res->succeeded ? ec->n_success : ec->n_ops - ec->n_success;
    Etcdserverpb__TxnRequest *rq = NULL;
    if (sm != NULL)
        rq = etcdapi__unpack(&etcdserverpb__txn_request__descriptor, ec->txn_msg_len,
                             ec->txn_msg);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header_write(ec->e, res->revision, &h);
    Etcdserverpb__ResponseOp *ro = tk_calloc(n ? n : 1, sizeof(*ro));
    Etcdserverpb__ResponseOp **rop = tk_calloc(n ? n : 1, sizeof(*rop));
    Etcdserverpb__PutResponse *pr = tk_calloc(n ? n : 1, sizeof(*pr));
    Etcdserverpb__DeleteRangeResponse *dr = tk_calloc(n ? n : 1, sizeof(*dr));
    Etcdserverpb__RangeResponse *rr = tk_calloc(n ? n : 1, sizeof(*rr));
    struct range_state *rs = tk_calloc(n ? n : 1, sizeof(*rs));
    struct ecall *rq_ec = tk_calloc(n ? n : 1, sizeof(*rq_ec));
    uint32_t k = 0;     /* the command's op results (a Range is not one) */
    uint64_t bytes = 0; /* read by the Range ops: about one answer's worth */
    uint64_t budget = ec->e->cfg.count_max; /* keys they look at, together */
    bool over = false;
    for (uint32_t i = 0; i < n && !over; i++) {
        etcdserverpb__response_op__init(&ro[i]);
        rop[i] = &ro[i];
        if (ec->op_kinds[first + i] == 'p') {
            etcdserverpb__put_response__init(&pr[i]);
            pr[i].header = &h;
            ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
            ro[i].response_put = &pr[i];
            k++;
        } else if (ec->op_kinds[first + i] == 'd') {
            etcdserverpb__delete_range_response__init(&dr[i]);
            dr[i].header = &h;
            dr[i].deleted = k < res->n_ops ? (int64_t)res->ops[k].deleted : 0;
            ro[i].response_case =
                ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE;
            ro[i].response_delete_range = &dr[i];
            k++;
        } else {
            etcdserverpb__range_response__init(&rr[i]);
            rr[i].header = &h;
            ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
            ro[i].response_range = &rr[i];
            if (rq == NULL)
                continue; /* (unpacked once already: cannot fail) */
            const Etcdserverpb__RequestOp *op =
                res->succeeded ? rq->success[i] : rq->failure[i];
            bytes += txn_range_op(ec, sm, op->request_range, &rq_ec[i], &rs[i], &rr[i],
                                  &budget);
            over = bytes > RANGE_BYTES_MAX;
        }
    }
    Etcdserverpb__TxnResponse r = ETCDSERVERPB__TXN_RESPONSE__INIT;
    r.header = &h;
    r.succeeded = res->succeeded;
    r.responses = rop;
    r.n_responses = n;
    if (over)
        etcdapi__fail(
            ec, GRPC_RESOURCE_EXHAUSTED,
            "tierkv: a Txn's Range ops read more than one answer holds (2 MiB)");
    else
        etcdapi__reply(ec, &r.base);
    for (uint32_t i = 0; i < n; i++) {
        range_state_free(&rs[i]);
        tk_free(rq_ec[i].key);
        tk_free(rq_ec[i].end);
    }
    tk_free(rq_ec);
    tk_free(rs);
    tk_free(rr);
    tk_free(dr);
    tk_free(pr);
    tk_free(rop);
    tk_free(ro);
    if (rq != NULL)
        etcdserverpb__txn_request__free_unpacked(rq, NULL);
}

static void txn_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    txn_answer(ec, ec->txn_res, sm);
}

static void txn_done(struct node_req *nreq, int status, const struct kv_result *res,
                     void *data)
{
    (void)nreq;
    struct ecall *ec = data;
    if (status == 0 && res->code != 0 && res->code != TK_ECOMPARE)
        status = res->code;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    uint32_t first = res->succeeded ? 0 : ec->n_success;
    uint32_t n = res->succeeded ? ec->n_success : ec->n_ops - ec->n_success;
    bool reads = false;
    for (uint32_t i = 0; i < n; i++)
        reads |= ec->op_kinds[first + i] == 'r';
    if (!reads) {
        txn_answer(ec, res, NULL);
        return;
    }
    /* The branch's Range ops read after the Txn applied, through a
     * linearizable read (the state they see includes the Txn; later writes
     * may be in it too: docs/etcd-compat.md). */
    ec->txn_res = tk_malloc(sizeof(*ec->txn_res));
    *ec->txn_res = *res;
    etcdapi__submit_read(ec, false, txn_read_cb);
}

/* ---- a TxnRequest's wire bytes, checked before protobuf-c unpacks them ---- */

/* A varint at *p (before end): 0 and *p past it, or -1. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Walks one message's fields; for each length-delimited field numbered
 * `want` (0: none) calls back with its bytes. -1 on a malformed field, or
 * what the callback returned when not 0. */
static int wire_fields(const uint8_t *p, size_t len, uint32_t want,
                       int (*cb)(const uint8_t *, size_t, void *), void *arg)
{
    const uint8_t *end = p + len;
    while (p < end) {
        uint64_t tag, v;
        if (wire_varint(&p, end, &tag) != 0)
            return -1;
        switch (tag & 7) {
        case 0:
            if (wire_varint(&p, end, &v) != 0)
                return -1;
            break;
        case 1:
            if (end - p < 8)
                return -1;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return -1;
            p += 4;
            break;
        case 2:
            if (wire_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p))
                return -1;
            if (want != 0 && (tag >> 3) == want) {
                int rc = cb(p, (size_t)v, arg);
                if (rc != 0)
                    return rc;
            }
            p += v;
            break;
        default: /* groups (3, 4) and 6, 7: etcd's messages have none */
            return -1;
        }
    }
    return 0;
}

static int op_has_txn(const uint8_t *p, size_t len, void *arg)
{
    (void)p;
    (void)len;
    (void)arg;
    return 1; /* RequestOp.request_txn (field 4): a nested Txn */
}

static int count_cmp(const uint8_t *p, size_t len, void *arg)
{
    (void)p;
    (void)len;
    size_t *n = arg;
    return ++*n > KV_TXN_OPS_MAX ? 2 : 0;
}

static int count_op(const uint8_t *p, size_t len, void *arg)
{
    size_t *n = arg;
    if (++*n > KV_TXN_OPS_MAX)
        return 2;
    return wire_fields(p, len, 4, op_has_txn, NULL);
}

/* protobuf-c unpacks a nested TxnRequest by recursion, with no bound on the
 * depth: a Txn nested some thousand deep (tens of KB) would overflow the
 * loop thread's stack. Refused here, from the bytes: a nested Txn (not
 * served), and more compares or ops than a Txn takes (before protobuf-c
 * allocates for each). */
const char *etcdapi__txn_wire_check(const uint8_t *msg, size_t len, int *code)
{
    size_t n_cmp = 0, n_success = 0, n_failure = 0;
    int rc = wire_fields(msg, len, 1, count_cmp, &n_cmp);
    if (rc == 0)
        rc = wire_fields(msg, len, 2, count_op, &n_success);
    if (rc == 0)
        rc = wire_fields(msg, len, 3, count_op, &n_failure);
    *code = rc == 1 ? GRPC_UNIMPLEMENTED : GRPC_INVALID_ARGUMENT;
    if (rc == 1)
        return "tierkv: a nested Txn inside a Txn is not supported yet";
    if (rc == 2)
        return "etcdserver: too many operations in txn request";
    if (rc != 0)
        return "tierkv: a malformed TxnRequest";
    return NULL;
}

void etcdapi__kv_txn(struct ecall *ec, const uint8_t *msg, size_t len)
{
    int code;
    const char *bad = etcdapi__txn_wire_check(msg, len, &code);
    if (bad != NULL) {
        etcdapi__fail(ec, code, bad);
        return;
    }
    Etcdserverpb__TxnRequest *rq =
        etcdapi__unpack(&etcdserverpb__txn_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed TxnRequest");
        return;
    }
    struct txn_build b = {0};
    const char *why = txn_take(ec, rq, &b, &code);
    if (why != NULL) {
        etcdapi__fail(ec, code, why);
    } else {
        ec->txn_msg = tk_malloc(len ? len : 1); /* its Range ops, read later */
        if (len > 0)
            memcpy(ec->txn_msg, msg, len);
        ec->txn_msg_len = len;
        Kvpb__Command cmd = KVPB__COMMAND__INIT;
        cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
        cmd.txn = &b.txn;
        etcdapi__submit_write(ec, &cmd, txn_done);
    }
    txn_build_free(&b);
    etcdserverpb__txn_request__free_unpacked(rq, NULL);
}
