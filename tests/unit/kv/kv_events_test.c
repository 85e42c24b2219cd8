/* The change log (kv/events.c): the events apply produces, the bounded
 * ring and its resume rules (compacted, future revision), and explicit
 * expiry (kv/ttl.c, the expire command). */
#include <check.h>

#include "tests/check_run.h"
#include "tests/unit/kv/kv_util.h"

#define EV_MAX 64

struct got {
    size_t n;
    uint64_t rev[EV_MAX];
    int type[EV_MAX];
    char key[EV_MAX][16];
    char value[EV_MAX][16];
    char prev[EV_MAX][16];
    bool has_prev[EV_MAX];
    uint64_t version[EV_MAX], create[EV_MAX];
    uint64_t prev_version[EV_MAX], prev_create[EV_MAX], prev_mod[EV_MAX];
};

static void got_cb(const struct kv_event *ev, void *data)
{
    struct got *g = data;
    ck_assert_uint_lt(g->n, EV_MAX);
    size_t i = g->n++;
    g->rev[i] = ev->revision;
    g->type[i] = ev->type;
    snprintf(g->key[i], 16, "%.*s", (int)ev->key_len, (const char *)ev->key);
    snprintf(g->value[i], 16, "%.*s", (int)ev->value_len, (const char *)ev->value);
    snprintf(g->prev[i], 16, "%.*s", (int)ev->prev_value_len,
             (const char *)ev->prev_value);
    g->has_prev[i] = ev->has_prev;
    g->version[i] = ev->version;
    g->create[i] = ev->create_revision;
    g->prev_version[i] = ev->prev_version;
    g->prev_create[i] = ev->prev_create_revision;
    g->prev_mod[i] = ev->prev_mod_revision;
}

static int read_all(struct kvu *u, uint64_t from, size_t max, struct got *g,
                    uint64_t *next)
{
    memset(g, 0, sizeof(*g));
    return kv_sm_events_read(u->sm, from, max, 0, got_cb, g, next);
}

static int apply_expire(struct kvu *u, const char **keys, size_t n)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Expire e = KVPB__EXPIRE__INIT;
    ProtobufCBinaryData k[8];
    for (size_t i = 0; i < n; i++)
        k[i] = kvu_str(keys[i]);
    e.n_keys = n;
    e.keys = k;
    c.cmd_case = KVPB__COMMAND__CMD_EXPIRE;
    c.expire = &e;
    return kvu_apply_code(u, &c);
}

static void list_cb(const uint8_t *key, size_t len, void *data)
{
    char *out = data;
    size_t at = strlen(out);
    snprintf(out + at, 256 - at, "%.*s,", (int)len, (const char *)key);
}

START_TEST(test_apply_produces_put_and_delete_events_with_prev)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t first = kv_sm_events_first(u.sm);
    ck_assert_int_eq(kvu_put(&u, "a", "1"), 0); /* rev first */
    ck_assert_int_eq(kvu_put(&u, "a", "2"), 0); /* first + 1 */
    ck_assert_int_eq(kvu_del(&u, "a"), 0);      /* first + 2 */
    ck_assert_int_eq(kvu_del(&u, "none"), 0);   /* first + 3: no event */
    ck_assert_int_eq(kvu_incr(&u, "n", 5), 0);  /* first + 4 */
    struct got g;
    uint64_t next;
    ck_assert_int_eq(read_all(&u, first, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 4);
    ck_assert_uint_eq(g.rev[0], first);
    ck_assert_int_eq(g.type[0], KV_EVENT_PUT);
    ck_assert_str_eq(g.value[0], "1");
    ck_assert(!g.has_prev[0]);
    ck_assert_uint_eq(g.rev[1], first + 1);
    ck_assert_str_eq(g.prev[1], "1");
    ck_assert_uint_eq(g.version[1], 2);
    ck_assert_int_eq(g.type[2], KV_EVENT_DELETE);
    ck_assert_str_eq(g.prev[2], "2");
    ck_assert_uint_eq(g.rev[3], first + 4);
    ck_assert_str_eq(g.value[3], "5");
    ck_assert_uint_eq(next, first + 5);
    /* From the middle: only what follows. */
    ck_assert_int_eq(read_all(&u, first + 2, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 2);
    ck_assert_uint_eq(g.rev[0], first + 2);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_delete_range_and_batch_share_the_entry_revision)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    ck_assert_int_eq(kvu_put(&u, "p/1", "x"), 0);
    ck_assert_int_eq(kvu_put(&u, "p/2", "y"), 0);
    ck_assert_int_eq(kvu_put(&u, "q", "z"), 0);
    uint64_t from = kv_sm_applied_index(u.sm) + 1;
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange d = KVPB__DELETE_RANGE__INIT;
    d.prefix = kvu_str("p/");
    d.by_prefix = true;
    c.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    c.delete_range = &d;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    Kvpb__Command b = KVPB__COMMAND__INIT;
    Kvpb__Batch bb = KVPB__BATCH__INIT;
    Kvpb__Op o1 = KVPB__OP__INIT, o2 = KVPB__OP__INIT;
    Kvpb__Put p1 = KVPB__PUT__INIT;
    Kvpb__Delete d2 = KVPB__DELETE__INIT;
    p1.key = kvu_str("r");
    p1.value = kvu_str("v");
    o1.op_case = KVPB__OP__OP_PUT;
    o1.put = &p1;
    d2.key = kvu_str("q");
    o2.op_case = KVPB__OP__OP_DEL;
    o2.del = &d2;
    Kvpb__Op *ops[2] = {&o1, &o2};
    bb.n_ops = 2;
    bb.ops = ops;
    b.cmd_case = KVPB__COMMAND__CMD_BATCH;
    b.batch = &bb;
    ck_assert_int_eq(kvu_apply(&u, &b), 0);
    struct got g;
    uint64_t next;
    ck_assert_int_eq(read_all(&u, from, 1, &g, &next), 0);
    /* max 1 still passes the whole first revision (both deletions). */
    ck_assert_uint_eq(g.n, 2);
    ck_assert_uint_eq(g.rev[0], from);
    ck_assert_uint_eq(g.rev[1], from);
    ck_assert_str_eq(g.key[0], "p/1");
    ck_assert_str_eq(g.key[1], "p/2");
    ck_assert_int_eq(g.type[1], KV_EVENT_DELETE);
    ck_assert_uint_eq(next, from + 1);
    ck_assert_int_eq(read_all(&u, next, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 2);
    ck_assert_uint_eq(g.rev[0], from + 1);
    ck_assert_uint_eq(g.rev[1], from + 1);
    ck_assert_str_eq(g.key[0], "r");
    ck_assert_str_eq(g.key[1], "q");
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_ring_bound_compacts_whole_revisions)
{
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.events_max = 8;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    uint64_t first = kv_sm_events_first(u.sm);
    char k[16];
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_int_eq(kvu_put(&u, k, "v"), 0);
    }
    uint64_t applied = kv_sm_applied_index(u.sm);
    ck_assert_uint_eq(kv_sm_events_first(u.sm), applied - 7);
    struct got g;
    uint64_t next = 0;
    /* Compacted: an error and nothing passed. */
    ck_assert_int_eq(read_all(&u, first, 100, &g, &next), TK_ECOMPACTED);
    ck_assert_uint_eq(g.n, 0);
    ck_assert_int_eq(read_all(&u, applied - 8, 100, &g, &next), TK_ECOMPACTED);
    ck_assert_int_eq(read_all(&u, applied - 7, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 8);
    ck_assert_uint_eq(next, applied + 1);
    /* A future revision waits: nothing now, next stays, then only its own. */
    ck_assert_int_eq(read_all(&u, applied + 3, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 0);
    ck_assert_uint_eq(next, applied + 3);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(kvu_put(&u, "f", "v"), 0);
    ck_assert_int_eq(read_all(&u, applied + 3, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 2);
    ck_assert_uint_eq(g.rev[0], applied + 3);
    ck_assert_uint_eq(g.rev[1], applied + 4);
    struct kv_events_stats es;
    kv_sm_events_stats(u.sm, &es);
    ck_assert_uint_eq(es.count, 8);
    ck_assert_uint_eq(es.evicted, 16);
    /* A revision whose events cannot all be held is never half readable:
     * a delete range of 10 keys in a ring of 8. */
    uint64_t dr = kv_sm_applied_index(u.sm) + 1;
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange d = KVPB__DELETE_RANGE__INIT;
    d.prefix = kvu_str("k");
    d.by_prefix = true;
    c.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    c.delete_range = &d;
    ck_assert_int_eq(kvu_apply(&u, &c), 0);
    ck_assert_uint_eq(kv_sm_events_first(u.sm), dr + 1);
    ck_assert_int_eq(read_all(&u, dr, 100, &g, &next), TK_ECOMPACTED);
    kvu_close(&u, true);
}
END_TEST

/* The events' data live in a byte ring of events_bytes: writes of every size
 * wrap it many times; after each, every held event keeps its own bytes
 * (value and previous value, checked against what was written) and the held
 * revisions run without a gap to the applied index; and recording allocates
 * nothing. */
#define WRAP_PUTS 600
#define WRAP_LEN 800 /* values up to 700 B, in a ring of 3000 B: a few are held */
#define WRAP_KEYS 7

struct wrap_check {
    const uint8_t (*vals)[WRAP_LEN]; /* by revision - base */
    const size_t *lens;
    const size_t *prev_rev; /* the revision of the key's previous value, 0 */
    uint64_t base, want_rev;
    size_t n;
};

static void wrap_cb(const struct kv_event *ev, void *data)
{
    struct wrap_check *w = data;
    ck_assert_uint_eq(ev->revision, w->want_rev);
    w->want_rev++;
    w->n++;
    size_t i = ev->revision - w->base;
    ck_assert_uint_eq(ev->value_len, w->lens[i]);
    ck_assert(memcmp(ev->value, w->vals[i], ev->value_len) == 0);
    ck_assert_int_eq(ev->has_prev, w->prev_rev[i] != 0);
    if (ev->has_prev) {
        size_t j = w->prev_rev[i] - w->base;
        ck_assert_uint_eq(ev->prev_value_len, w->lens[j]);
        ck_assert(memcmp(ev->prev_value, w->vals[j], ev->prev_value_len) == 0);
    }
}

/* Every event held after the put at revision last: its bytes as written,
 * the revisions without a gap to last, within the bounds. */
static void check_held(struct kvu *u, const uint8_t (*vals)[WRAP_LEN], const size_t *lens,
                       const size_t *prev_rev, uint64_t base, uint64_t last, size_t *held)
{
    struct kv_events_stats es;
    kv_sm_events_stats(u->sm, &es);
    ck_assert_uint_le(es.bytes, 3000);
    ck_assert_uint_ge(es.count, 1);
    ck_assert_uint_eq(es.count + es.evicted, last - base + 1);
    uint64_t first = kv_sm_events_first(u->sm), next = 0;
    ck_assert_uint_eq(first + es.count, last + 1);
    struct wrap_check w = {.vals = vals,
                           .lens = lens,
                           .prev_rev = prev_rev,
                           .base = base,
                           .want_rev = first};
    ck_assert_int_eq(kv_sm_events_read(u->sm, first, 1000, 0, wrap_cb, &w, &next), 0);
    ck_assert_uint_eq(w.n, es.count);
    ck_assert_uint_eq(next, last + 1);
    if (es.count > *held)
        *held = es.count;
}

START_TEST(test_event_data_wrap_their_byte_ring)
{
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.events_max = 1000;
    u.cfg.events_bytes = 3000;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    static uint8_t vals[WRAP_PUTS][WRAP_LEN];
    static size_t lens[WRAP_PUTS], prev_rev[WRAP_PUTS];
    uint64_t last_rev[WRAP_KEYS] = {0};
    uint64_t base = kv_sm_applied_index(u.sm) + 1;
    uint64_t allocs = 0; /* in apply, over the second half of the puts */
    size_t held = 0;     /* the most events held at once */
    for (size_t i = 0; i < WRAP_PUTS; i++) {
        lens[i] = 1 + (i * 379) % (WRAP_LEN - 100); /* every size, out of order */
        for (size_t b = 0; b < lens[i]; b++)
            vals[i][b] = (uint8_t)('a' + (i + b) % 26);
        char k[8], v[WRAP_LEN];
        snprintf(k, sizeof(k), "k%zu", i % WRAP_KEYS);
        memcpy(v, vals[i], lens[i]);
        v[lens[i]] = 0;
        Kvpb__Command c = KVPB__COMMAND__INIT;
        Kvpb__Put p = KVPB__PUT__INIT;
        p.key = kvu_str(k);
        p.value = kvu_str(v);
        c.cmd_case = KVPB__COMMAND__CMD_PUT;
        c.put = &p;
        size_t len;
        uint8_t *buf = kvu_pack(&c, &len);
        uint64_t rev = base + i;
        struct tk_alloc_stats a0, a1;
        tk_alloc_stats(&a0);
        ck_assert_int_eq(kv_sm_apply(u.sm, rev, 1, u.time_ms, buf, len, &u.res), 0);
        tk_alloc_stats(&a1);
        tk_free(buf);
        ck_assert_int_eq(u.res.code, 0);
        if (i >= WRAP_PUTS / 2)
            allocs += a1.calls - a0.calls;
        prev_rev[i] = last_rev[i % WRAP_KEYS];
        last_rev[i % WRAP_KEYS] = rev;
        check_held(&u, (const uint8_t(*)[WRAP_LEN])vals, lens, prev_rev, base, rev,
                   &held);
    }
    printf("event ring: up to %zu events held in 3000 bytes; %llu allocations "
           "in the last %d puts' apply\n",
           held, (unsigned long long)allocs, WRAP_PUTS / 2);
    ck_assert_uint_ge(held, 3);
    ck_assert_uint_eq(allocs, 0);
    kvu_close(&u, true);
}
END_TEST

/* The slots wrap round a ring of 5 many times, beside the byte ring: after
 * each put, the held events are the newest, whole, with their own values
 * and previous values, and the bytes in use stay within events_bytes. An
 * event bigger than the whole byte ring is lost: first moves past it, and
 * nothing held before it is readable or counted. */
START_TEST(test_slots_wrap_and_an_event_too_big_for_the_ring)
{
    struct kvu u = {0};
    kvu_defaults(&u);
    u.cfg.events_max = 5;
    u.cfg.events_bytes = 1024;
    struct kv_config cfg = u.cfg;
    kvu_open(&u, &cfg);
    char k[16], v[16];
    struct got g;
    uint64_t next = 0;
    struct kv_events_stats es;
    for (int i = 0; i < 43; i++) {
        snprintf(k, sizeof(k), "k%d", i % 3);
        snprintf(v, sizeof(v), "v%0*d", 1 + i % 9, i); /* 2 to 10 bytes */
        ck_assert_int_eq(kvu_put(&u, k, v), 0);
        uint64_t last = kv_sm_applied_index(u.sm);
        kv_sm_events_stats(u.sm, &es);
        ck_assert_uint_eq(es.count, i < 5 ? (uint64_t)i + 1 : 5);
        ck_assert_uint_gt(es.bytes, 0);
        ck_assert_uint_le(es.bytes, 1024);
        uint64_t first = kv_sm_events_first(u.sm);
        ck_assert_uint_eq(first + es.count, last + 1);
        ck_assert_int_eq(read_all(&u, first, 100, &g, &next), 0);
        ck_assert_uint_eq(g.n, es.count);
        for (size_t j = 0; j < g.n; j++) {
            int at = i - (int)(g.n - 1 - j); /* the put that wrote it */
            char want[16];
            snprintf(want, sizeof(want), "v%0*d", 1 + at % 9, at);
            ck_assert_uint_eq(g.rev[j], last - (g.n - 1 - j));
            ck_assert_str_eq(g.value[j], want);
            ck_assert_int_eq(g.has_prev[j], at >= 3);
            if (at >= 3) {
                snprintf(want, sizeof(want), "v%0*d", 1 + (at - 3) % 9, at - 3);
                ck_assert_str_eq(g.prev[j], want);
            }
        }
    }
    static char big[2001];
    memset(big, 'b', sizeof(big) - 1);
    ck_assert_int_eq(kvu_put(&u, "big", big), 0);
    uint64_t rev = kv_sm_applied_index(u.sm);
    kv_sm_events_stats(u.sm, &es);
    ck_assert_uint_eq(es.count, 0);
    ck_assert_uint_eq(es.bytes, 0);
    ck_assert_uint_eq(kv_sm_events_first(u.sm), rev + 1);
    ck_assert_int_eq(read_all(&u, rev, 100, &g, &next), TK_ECOMPACTED);
    ck_assert_int_eq(read_all(&u, rev + 1, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 0);
    ck_assert_uint_eq(next, rev + 1);
    ck_assert_int_eq(kvu_put(&u, "k0", "after"), 0);
    ck_assert_int_eq(read_all(&u, rev + 1, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 1);
    ck_assert_str_eq(g.value[0], "after");
    ck_assert(g.has_prev[0]);
    kv_sm_events_stats(u.sm, &es);
    ck_assert_uint_eq(es.count, 1);
    ck_assert_uint_gt(es.bytes, 0);
    kvu_close(&u, true);
}
END_TEST

/* Every shape of an event's header (events.c stores a put over a live key
 * with 3 revisions, deriving the previous version and create revision):
 * each event reads back its own version and create revision and its
 * previous state's version, create and mod revisions. */
static void want_ev(const struct got *g, size_t i, int type, uint64_t version,
                    uint64_t create, bool has_prev, uint64_t pv, uint64_t pc, uint64_t pm)
{
    ck_assert_int_eq(g->type[i], type);
    ck_assert_uint_eq(g->version[i], version);
    ck_assert_uint_eq(g->create[i], create);
    ck_assert_int_eq(g->has_prev[i], has_prev);
    ck_assert_uint_eq(g->prev_version[i], pv);
    ck_assert_uint_eq(g->prev_create[i], pc);
    ck_assert_uint_eq(g->prev_mod[i], pm);
}

static int apply_txn2(struct kvu *u, Kvpb__Op *a, Kvpb__Op *b)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Txn t = KVPB__TXN__INIT;
    Kvpb__Op *ops[2] = {a, b};
    t.n_then_ops = 2;
    t.then_ops = ops;
    c.cmd_case = KVPB__COMMAND__CMD_TXN;
    c.txn = &t;
    return kvu_apply_code(u, &c);
}

START_TEST(test_event_revisions_of_every_kind)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t r = kv_sm_applied_index(u.sm) + 1;
    ck_assert_int_eq(kvu_put(&u, "a", "1"), 0); /* r: new */
    ck_assert_int_eq(kvu_put(&u, "a", "2"), 0); /* r + 1: over a live key */
    Kvpb__Put p3 = KVPB__PUT__INIT, p4 = KVPB__PUT__INIT, p7 = KVPB__PUT__INIT;
    Kvpb__Delete d6 = KVPB__DELETE__INIT;
    Kvpb__Op o3 = KVPB__OP__INIT, o4 = KVPB__OP__INIT, o6 = KVPB__OP__INIT,
             o7 = KVPB__OP__INIT;
    p3.key = p4.key = p7.key = d6.key = kvu_str("a");
    p3.value = kvu_str("3");
    p4.value = kvu_str("4");
    p7.value = kvu_str("7");
    o3.op_case = o4.op_case = o7.op_case = KVPB__OP__OP_PUT;
    o3.put = &p3;
    o4.put = &p4;
    o7.put = &p7;
    o6.op_case = KVPB__OP__OP_DEL;
    o6.del = &d6;
    ck_assert_int_eq(apply_txn2(&u, &o3, &o4), 0); /* r + 2: version + 2 */
    ck_assert_int_eq(kvu_del(&u, "a"), 0);         /* r + 3: a delete */
    ck_assert_int_eq(kvu_put(&u, "a", "5"), 0);    /* r + 4: new again */
    ck_assert_int_eq(apply_txn2(&u, &o6, &o7), 0); /* r + 5: deleted, then new */
    u.time_ms = 50000;
    ck_assert_int_eq(kvu_put_ttl(&u, "t", "x", 10), 0); /* r + 6 */
    u.time_ms = 60000;
    ck_assert_int_eq(kvu_put(&u, "t", "y"), 0); /* r + 7: lapsed: expire, put */
    struct got g;
    uint64_t next;
    ck_assert_int_eq(read_all(&u, r, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 9);
    want_ev(&g, 0, KV_EVENT_PUT, 1, r, false, 0, 0, 0);
    want_ev(&g, 1, KV_EVENT_PUT, 2, r, true, 1, r, r);
    want_ev(&g, 2, KV_EVENT_PUT, 4, r, true, 2, r, r + 1);
    ck_assert_str_eq(g.value[2], "4");
    ck_assert_str_eq(g.prev[2], "2");
    want_ev(&g, 3, KV_EVENT_DELETE, 0, 0, true, 4, r, r + 2);
    ck_assert_str_eq(g.prev[3], "4");
    want_ev(&g, 4, KV_EVENT_PUT, 1, r + 4, false, 0, 0, 0);
    want_ev(&g, 5, KV_EVENT_PUT, 1, r + 5, true, 1, r + 4, r + 4);
    ck_assert_str_eq(g.value[5], "7");
    ck_assert_str_eq(g.prev[5], "5");
    want_ev(&g, 6, KV_EVENT_PUT, 1, r + 6, false, 0, 0, 0);
    want_ev(&g, 7, KV_EVENT_EXPIRE, 0, 0, true, 1, r + 6, r + 6);
    ck_assert_str_eq(g.prev[7], "x");
    want_ev(&g, 8, KV_EVENT_PUT, 1, r + 7, false, 0, 0, 0);
    ck_assert_str_eq(g.value[8], "y");
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_restart_resumes_after_the_durable_index)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    ck_assert_int_eq(kvu_put(&u, "a", "1"), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    uint64_t durable = kv_sm_durable_index(u.sm);
    struct kv_config cfg = u.cfg;
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    ck_assert_uint_eq(kv_sm_events_first(u.sm), durable + 1);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_expire_command_deletes_due_keys_as_expire_events)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    u.time_ms = 10000;
    ck_assert_int_eq(kvu_put_ttl(&u, "t1", "a", 500), 0);
    ck_assert_int_eq(kvu_put_ttl(&u, "t2", "b", 2000), 0);
    ck_assert_int_eq(kvu_put_ttl(&u, "t3", "c", 500), 0);
    ck_assert_int_eq(kvu_put(&u, "t3", "no ttl now"), 0); /* stale entry */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);               /* t1 in the cold tier */
    char list[256] = "";
    ck_assert_int_eq(kv_sm_expired(u.sm, 10499, 100, list_cb, list), 0);
    ck_assert_int_eq(kv_sm_expired(u.sm, 10500, 100, list_cb, list), 1);
    ck_assert_str_eq(list, "t1,");
    /* Listed again until a command deletes it. */
    list[0] = '\0';
    ck_assert_int_eq(kv_sm_expired(u.sm, 10500, 100, list_cb, list), 1);
    /* An expire applied before the key is due (by the entry's time) does
     * nothing; then it deletes, once. */
    uint64_t from = kv_sm_applied_index(u.sm) + 1;
    const char *keys[3] = {"t1", "t2", "t3"};
    ck_assert_int_eq(apply_expire(&u, keys, 3), 0);
    ck_assert_uint_eq(u.res.deleted, 0);
    u.time_ms = 10600;
    ck_assert_int_eq(apply_expire(&u, keys, 3), 0);
    ck_assert_uint_eq(u.res.deleted, 1);
    ck_assert_int_eq(apply_expire(&u, keys, 3), 0);
    ck_assert_uint_eq(u.res.deleted, 0);
    struct got g;
    uint64_t next;
    ck_assert_int_eq(read_all(&u, from, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 1);
    ck_assert_int_eq(g.type[0], KV_EVENT_EXPIRE);
    ck_assert_str_eq(g.key[0], "t1");
    ck_assert(g.has_prev[0]);
    ck_assert_str_eq(g.prev[0], "a");
    list[0] = '\0';
    ck_assert_int_eq(kv_sm_expired(u.sm, 20000, 100, list_cb, list), 1);
    ck_assert_str_eq(list, "t2,");
    /* After a restart the cold tier's TTL keys are tracked again. */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    struct kv_config cfg = u.cfg;
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    list[0] = '\0';
    ck_assert_int_eq(kv_sm_expired(u.sm, 20000, 100, list_cb, list), 1);
    ck_assert_str_eq(list, "t2,");
    /* Bad input is an error result, and changes nothing. */
    const char *bad[1] = {""};
    ck_assert_int_eq(apply_expire(&u, bad, 1), TK_EINVAL);
    kvu_close(&u, true);
}
END_TEST

/* Field numbers are forever: Command.expire is 9, Expire.keys is 1. */
START_TEST(test_expire_command_bytes_are_pinned)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Expire e = KVPB__EXPIRE__INIT;
    ProtobufCBinaryData k = kvu_str("k");
    e.n_keys = 1;
    e.keys = &k;
    c.cmd_case = KVPB__COMMAND__CMD_EXPIRE;
    c.expire = &e;
    size_t len;
    uint8_t *buf = kvu_pack(&c, &len);
    static const uint8_t want[] = {0x4a, 0x03, 0x0a, 0x01, 'k'};
    ck_assert_uint_eq(len, sizeof(want));
    ck_assert_int_eq(memcmp(buf, want, len), 0);
    tk_free(buf);
}
END_TEST

START_TEST(test_write_over_a_lapsed_key_expires_it_first)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    u.time_ms = 10000;
    ck_assert_int_eq(kvu_put_ttl(&u, "k", "old", 100), 0);
    u.time_ms = 10200; /* lapsed, no expire command yet */
    uint64_t rev = kv_sm_applied_index(u.sm) + 1;
    ck_assert_int_eq(kvu_put(&u, "k", "new"), 0);
    struct got g;
    uint64_t next;
    ck_assert_int_eq(read_all(&u, rev, 100, &g, &next), 0);
    ck_assert_uint_eq(g.n, 2);
    ck_assert_int_eq(g.type[0], KV_EVENT_EXPIRE);
    ck_assert_str_eq(g.prev[0], "old");
    ck_assert_uint_eq(g.rev[0], rev);
    ck_assert_int_eq(g.type[1], KV_EVENT_PUT);
    ck_assert(!g.has_prev[1]);
    ck_assert_uint_eq(g.version[1], 1);
    ck_assert_uint_eq(g.rev[1], rev);
    kvu_close(&u, true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv-events");
    TCase *tc = tcase_create("events");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_apply_produces_put_and_delete_events_with_prev);
    tcase_add_test(tc, test_delete_range_and_batch_share_the_entry_revision);
    tcase_add_test(tc, test_ring_bound_compacts_whole_revisions);
    tcase_add_test(tc, test_event_data_wrap_their_byte_ring);
    tcase_add_test(tc, test_slots_wrap_and_an_event_too_big_for_the_ring);
    tcase_add_test(tc, test_event_revisions_of_every_kind);
    tcase_add_test(tc, test_restart_resumes_after_the_durable_index);
    tcase_add_test(tc, test_expire_command_deletes_due_keys_as_expire_events);
    tcase_add_test(tc, test_write_over_a_lapsed_key_expires_it_first);
    tcase_add_test(tc, test_expire_command_bytes_are_pinned);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
