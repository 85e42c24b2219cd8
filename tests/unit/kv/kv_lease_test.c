/* Leases (kv/lease.c): grant, attach and detach by puts, keepalive,
 * checkpoint, revoke (delete or expire events at one revision), the reserved
 * prefix, the table rebuilt after a restart and a snapshot install, and the
 * lease record: kvpb.LeaseRecord, the "L1" layout of older builds still read,
 * and bad records refused as TK_ECORRUPT. */
#include <check.h>

#include "base/endian.h"
#include "base/log.h"
#include "kv/sm_internal.h"
#include "tests/check_run.h"
#include "tests/unit/kv/kv_util.h"

static uint64_t grant(struct kvu *u, uint64_t ttl)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    g.ttl_ms = ttl;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    c.lease_grant = &g;
    ck_assert_int_eq(kvu_apply_code(u, &c), 0);
    ck_assert_int_gt(u->res.value, 0);
    return (uint64_t)u->res.value;
}

static int keepalive(struct kvu *u, uint64_t id)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__LeaseKeepalive k = KVPB__LEASE_KEEPALIVE__INIT;
    k.id = id;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_KEEPALIVE;
    c.lease_keepalive = &k;
    return kvu_apply_code(u, &c);
}

static int lease_revoke_at(struct kvu *u, uint64_t id, bool expired, uint64_t renewed)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__LeaseRevoke r = KVPB__LEASE_REVOKE__INIT;
    r.id = id;
    r.expired = expired;
    r.renewed = renewed;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    c.lease_revoke = &r;
    return kvu_apply_code(u, &c);
}

static int lease_revoke(struct kvu *u, uint64_t id, bool expired)
{
    uint64_t ids[64], ren[64];
    kv_sm_lease_due(u->sm, 1, ids, ren, 64); /* sets the deadlines */
    size_t n = kv_sm_lease_due(u->sm, UINT64_MAX / 2, ids, ren, 64);
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return lease_revoke_at(u, id, expired, ren[i]);
    return lease_revoke_at(u, id, expired, 0);
}

static int checkpoint(struct kvu *u, uint64_t id, uint64_t remaining)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__LeaseCheckpoint k = KVPB__LEASE_CHECKPOINT__INIT;
    k.n_ids = k.n_remaining_ms = 1;
    k.ids = &id;
    k.remaining_ms = &remaining;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_CHECKPOINT;
    c.lease_checkpoint = &k;
    return kvu_apply_code(u, &c);
}

static int put_lease(struct kvu *u, const char *k, const char *v, uint64_t lease)
{
    return kvu_put_full(u, k, v, 0, lease);
}

static void keys_cb(const uint8_t *key, size_t len, void *data)
{
    char *out = data;
    size_t at = strlen(out);
    snprintf(out + at, 256 - at, "%.*s,", (int)len, (const char *)key);
}

static size_t n_keys(struct kvu *u, uint64_t id)
{
    struct kv_lease_info li;
    ck_assert_int_eq(kv_sm_lease_get(u->sm, id, 0, &li, NULL, NULL), 0);
    return li.n_keys;
}

struct evs {
    size_t n;
    uint64_t rev[16];
    int type[16];
    uint64_t prev_lease[16];
};

static void ev_cb(const struct kv_event *ev, void *data)
{
    struct evs *e = data;
    ck_assert_uint_lt(e->n, 16);
    e->rev[e->n] = ev->revision;
    e->prev_lease[e->n] = ev->prev_lease;
    e->type[e->n++] = ev->type;
}

START_TEST(test_grant_attach_detach_and_revoke_in_one_revision)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 3000);
    ck_assert_uint_eq(id, kv_sm_applied_index(u.sm)); /* id 0: the entry's index */
    ck_assert_int_eq(put_lease(&u, "a", "1", id), 0);
    ck_assert_int_eq(put_lease(&u, "b", "2", id), 0);
    ck_assert_int_eq(put_lease(&u, "c", "3", id), 0);
    ck_assert_int_eq(put_lease(&u, "x", "1", id + 100), TK_ENOTFOUND);
    ck_assert_uint_eq(n_keys(&u, id), 3);
    ck_assert_int_eq(kvu_put(&u, "c", "detached"), 0); /* a put without lease */
    ck_assert_int_eq(kvu_del(&u, "b"), 0);             /* a delete detaches */
    char keys[256] = "";
    struct kv_lease_info li;
    ck_assert_int_eq(kv_sm_lease_get(u.sm, id, 0, &li, keys_cb, keys), 0);
    ck_assert_str_eq(keys, "a,");
    ck_assert_uint_eq(li.ttl_ms, 3000);
    ck_assert_int_eq(put_lease(&u, "d", "4", id), 0);
    uint64_t from = kv_sm_applied_index(u.sm) + 1;
    ck_assert_int_eq(lease_revoke(&u, id, false), 0);
    ck_assert_uint_eq(u.res.deleted, 2);
    uint64_t rev = kv_sm_applied_index(u.sm);
    ck_assert_uint_eq(u.res.revision, rev);
    char buf[16];
    ck_assert_ptr_null(kvu_get(&u, "a", buf, sizeof(buf)));
    ck_assert_ptr_null(kvu_get(&u, "d", buf, sizeof(buf)));
    ck_assert_str_eq(kvu_get(&u, "c", buf, sizeof(buf)), "detached");
    struct evs e = {0};
    uint64_t next;
    ck_assert_int_eq(kv_sm_events_read(u.sm, from, 100, 0, ev_cb, &e, &next), 0);
    ck_assert_uint_eq(e.n, 2); /* the lease record makes no event */
    ck_assert_uint_eq(e.rev[0], rev);
    ck_assert_uint_eq(e.rev[1], rev);
    ck_assert_int_eq(e.type[0], KV_EVENT_DELETE);
    ck_assert_uint_eq(e.prev_lease[0], id); /* a revoke's deletes: the lease they had */
    ck_assert_uint_eq(e.prev_lease[1], id);
    ck_assert_int_eq(kv_sm_lease_get(u.sm, id, 0, &li, NULL, NULL), TK_ENOTFOUND);
    ck_assert_int_eq(keepalive(&u, id), TK_ENOTFOUND);
    ck_assert_int_eq(lease_revoke(&u, id, false), TK_ENOTFOUND);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 0);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_expired_revoke_gives_expire_events)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 1000);
    ck_assert_int_eq(put_lease(&u, "k", "v", id), 0);
    uint64_t from = kv_sm_applied_index(u.sm) + 1;
    ck_assert_int_eq(lease_revoke(&u, id, true), 0);
    struct evs e = {0};
    uint64_t next;
    ck_assert_int_eq(kv_sm_events_read(u.sm, from, 100, 0, ev_cb, &e, &next), 0);
    ck_assert_uint_eq(e.n, 1);
    ck_assert_int_eq(e.type[0], KV_EVENT_EXPIRE);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_deadline_from_checkpoint_and_keepalive)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 3000), ids[4], rem[4], ren[4];
    /* A leader at clock 10000 sets the deadline to 13000. */
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 10000, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 12999, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 13000, ids, ren, 4), 1);
    ck_assert_uint_eq(ids[0], id);
    ck_assert_uint_eq(kv_sm_lease_list(u.sm, 0, 12000, ids, rem, 4), 1);
    ck_assert_uint_eq(rem[0], 1000);
    /* The checkpoint replicates 1000 left; the leader's deadline stays. */
    ck_assert_int_eq(checkpoint(&u, id, 1000), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 12500, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 13000, ids, ren, 4), 1);
    /* A new leader (clock 50000) resumes from the checkpoint, not the TTL. */
    kv_sm_lease_reset(u.sm);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 50000, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 51000, ids, ren, 4), 1);
    /* A checkpoint above the TTL is ignored; a keepalive restarts the TTL. */
    ck_assert_int_eq(checkpoint(&u, id, 9999), 0);
    ck_assert_int_eq(keepalive(&u, id), 0);
    ck_assert_uint_eq((uint64_t)u.res.value, 3000);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 60000, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 62999, ids, ren, 4), 0);
    ck_assert_uint_eq(kv_sm_lease_due(u.sm, 63000, ids, ren, 4), 1);
    /* An expired revoke from before the keepalive is refused. */
    ck_assert_int_eq(lease_revoke_at(&u, id, true, ren[0] - 1), TK_ECOMPARE);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 1);
    ck_assert_int_eq(lease_revoke_at(&u, id, true, ren[0]), 0);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 0);
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_reserved_prefix_refused_and_bad_grants)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 1000);
    char key[64];
    snprintf(key, sizeof(key), "%s%016llx", KV_LEASE_PREFIX, (unsigned long long)id);
    ck_assert_int_eq(kvu_put(&u, key, "forged"), TK_EINVAL);
    ck_assert_int_eq(kvu_del(&u, key), TK_EINVAL);
    /* A delete of everything leaves the lease records alone. */
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange d = KVPB__DELETE_RANGE__INIT;
    d.by_prefix = true;
    c.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    c.delete_range = &d;
    ck_assert_int_eq(kvu_apply_code(&u, &c), 0);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 1);
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    c.lease_grant = &g;
    ck_assert_int_eq(kvu_apply_code(&u, &c), TK_EINVAL); /* ttl 0 */
    g.ttl_ms = 1000;
    g.id = id;
    ck_assert_int_eq(kvu_apply_code(&u, &c), TK_ECOMPARE); /* id taken */
    kvu_close(&u, true);
}
END_TEST

START_TEST(test_leases_survive_restart_and_install)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t a = grant(&u, 5000), b = grant(&u, 7000);
    ck_assert_int_eq(put_lease(&u, "k1", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "k2", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "k3", "v", b), 0);
    ck_assert_int_eq(checkpoint(&u, a, 1234), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    struct kv_config cfg = u.cfg;
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 2);
    struct kv_lease_info li;
    ck_assert_int_eq(kv_sm_lease_get(u.sm, a, 0, &li, NULL, NULL), 0);
    ck_assert_uint_eq(li.remaining_ms, 1234);
    ck_assert_uint_eq(li.ttl_ms, 5000);
    ck_assert_uint_eq(li.n_keys, 2);
    /* The key -> lease table is back: a put without lease detaches. */
    ck_assert_int_eq(kvu_put(&u, "k2", "free"), 0);
    ck_assert_uint_eq(n_keys(&u, a), 1);

    /* A snapshot stream carries them to another state machine. */
    struct kv_snap *s;
    ck_assert_int_eq(kv_sm_snapshot(u.sm, &s), 0);
    struct kvu v = {0};
    kvu_open(&v, NULL);
    ck_assert_uint_eq(grant(&v, 100), 1); /* replaced by the install */
    struct kv_install *in;
    ck_assert_int_eq(kv_sm_install_begin(v.sm, &in), 0);
    uint8_t buf[4096];
    size_t len;
    do {
        ck_assert_int_eq(kv_snap_read(s, buf, sizeof(buf), &len), 0);
        if (len > 0)
            ck_assert_int_eq(kv_install_write(in, buf, len), 0);
    } while (len > 0);
    kv_snap_close(s);
    ck_assert_int_eq(kv_install_commit(in), 0);
    ck_assert_uint_eq(kv_sm_lease_count(v.sm), 2);
    ck_assert_uint_eq(n_keys(&v, a), 1);
    ck_assert_uint_eq(n_keys(&v, b), 1);
    uint64_t dv, du;
    ck_assert_int_eq(kv_sm_digest(v.sm, &dv), 0);
    ck_assert_int_eq(kv_sm_digest(u.sm, &du), 0);
    ck_assert_uint_eq(dv, du);
    ck_assert_int_eq(lease_revoke(&v, b, true), 0);
    ck_assert_uint_eq(v.res.deleted, 1);
    kvu_close(&v, true);
    kvu_close(&u, true);
}
END_TEST

/* A node installs a snapshot off its loop: prepare, on the install's
 * thread, reads the new state's sessions, TTL keys and leases back into new
 * tables, so that commit, on the loop, only swaps them in. Counted in
 * allocations: commit after a prepare allocates a handful whatever the
 * tables hold; commit without one (which loads them itself) allocates per
 * session, TTL key and lease. */
static void count_key(const uint8_t *key, size_t len, void *data)
{
    (void)key;
    (void)len;
    (*(size_t *)data)++;
}

START_TEST(test_install_prepare_builds_the_tables)
{
    enum { TTL_KEYS = 400, SESSIONS = 50, TTL_MAX = 100 };
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t a = grant(&u, 5000), b = grant(&u, 7000);
    ck_assert_int_eq(put_lease(&u, "k1", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "k2", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "k3", "v", b), 0);
    char k[32];
    for (int i = 0; i < TTL_KEYS; i++) {
        snprintf(k, sizeof(k), "ttl%04d", i);
        ck_assert_int_eq(kvu_put_ttl(&u, k, "v", 100000 + (uint64_t)i), 0);
    }
    Kvpb__Command c;
    Kvpb__Increment inc;
    kvu_incr_cmd(&c, &inc, "ctr", 1, 0, 1);
    for (int i = 0; i < SESSIONS; i++) {
        c.client_id = 100 + (uint64_t)i;
        ck_assert_int_eq(kvu_apply(&u, &c), 0);
    }
    struct kv_snap *s;
    ck_assert_int_eq(kv_sm_snapshot(u.sm, &s), 0);
    size_t len = 0, cap = 1 << 20;
    uint8_t *stream = tk_malloc(cap);
    size_t got;
    do {
        if (cap - len < 4096)
            stream = tk_realloc(stream, cap *= 2);
        ck_assert_int_eq(kv_snap_read(s, stream + len, 4096, &got), 0);
        len += got;
    } while (got > 0);
    kv_snap_close(s);

    uint64_t allocs[2];
    for (int prepared = 1; prepared >= 0; prepared--) {
        struct kvu v = {0};
        kv_config_default(&v.cfg);
        v.cfg.no_sync = true;
        v.cfg.map_bytes = (size_t)1 << 30;
        v.cfg.ttl_max = TTL_MAX;
        v.dir = kvu_tmpdir();
        struct kv_config cfg = v.cfg;
        kvu_open(&v, &cfg);
        ck_assert_uint_eq(grant(&v, 100), 1); /* replaced by the install */
        struct kv_install *in;
        ck_assert_int_eq(kv_sm_install_begin(v.sm, &in), 0);
        ck_assert_int_eq(kv_install_write(in, stream, len), 0);
        if (prepared)
            ck_assert_int_eq(kv_install_prepare(in), 0);
        struct tk_alloc_stats a0, a1;
        tk_alloc_stats(&a0);
        ck_assert_int_eq(kv_install_commit(in), 0);
        tk_alloc_stats(&a1);
        allocs[prepared] = a1.calls - a0.calls;
        /* Either way the tables are the snapshot's. */
        ck_assert_uint_eq(kv_sm_lease_count(v.sm), 2);
        ck_assert_uint_eq(n_keys(&v, a), 2);
        ck_assert_uint_eq(n_keys(&v, b), 1);
        struct kv_sm_stats st;
        kv_sm_stats(v.sm, &st);
        ck_assert_uint_eq(st.ttl_dropped, TTL_KEYS - TTL_MAX); /* v's own config */
        size_t due = 0;
        ck_assert_int_eq(kv_sm_expired(v.sm, u.time_ms, 1000, count_key, &due), 0);
        ck_assert_int_eq(kv_sm_expired(v.sm, u.time_ms + 200000, 1000, count_key, &due),
                         64);
        c.client_id = 100 + SESSIONS - 1;
        ck_assert_int_eq(kvu_apply(&v, &c), 0);
        ck_assert(v.res.duplicate);
        ck_assert_int_eq(v.res.value, SESSIONS);
        kv_trash_free(kv_sm_install_trash(v.sm));
        kvu_close(&v, true);
    }
    printf("install commit: %llu allocations after a prepare, %llu without\n",
           (unsigned long long)allocs[1], (unsigned long long)allocs[0]);
    ck_assert_uint_lt(allocs[1], 32);
    /* Without a prepare, one per TTL key at least (a session's short result
     * lives in its table entry: no allocation). */
    ck_assert_uint_gt(allocs[0], TTL_MAX);
    tk_free(stream);
    kvu_close(&u, true);
}
END_TEST

/* ---- the record ---- */

/* The record key of lease id. */
static void rec_key(uint64_t id, uint8_t key[KV_LEASE_KEY_LEN])
{
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
    memcpy(key, KV_LEASE_PREFIX, KV_LEASE_PREFIX_LEN);
    memcpy(key + KV_LEASE_PREFIX_LEN, hex, 16);
}

/* A record as builds before kvpb.LeaseRecord wrote it: "L1", ttl, remaining,
 * renewed (u64 LE), the key count (u32, host order), each key (u16 LE length,
 * bytes). Returns its length. */
static size_t old_rec(uint8_t *v, uint64_t ttl, uint64_t rem, uint64_t renewed,
                      const char *const *keys, uint32_t n)
{
    memcpy(v, "L1", 2);
    tk_put_le64(v + 2, ttl);
    tk_put_le64(v + 10, rem);
    tk_put_le64(v + 18, renewed);
    memcpy(v + 26, &n, 4);
    size_t off = 30;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(keys[i]);
        v[off] = (uint8_t)len;
        v[off + 1] = (uint8_t)(len >> 8);
        memcpy(v + off + 2, keys[i], len);
        off += 2 + len;
    }
    return off;
}

/* A record as written today: 0x01, then the packed kvpb.LeaseRecord. */
static size_t new_rec(uint8_t *v, uint64_t ttl, uint64_t rem, uint64_t renewed,
                      const char *const *keys, size_t n)
{
    Kvpb__LeaseRecord m = KVPB__LEASE_RECORD__INIT;
    ProtobufCBinaryData b[4];
    ck_assert_uint_le(n, 4);
    for (size_t i = 0; i < n; i++)
        b[i] = kvu_str(keys[i]);
    m.ttl_ms = ttl;
    m.remaining_ms = rem;
    m.renewed = renewed;
    m.n_keys = n;
    m.keys = b;
    v[0] = 0x01;
    return 1 + kvpb__lease_record__pack(&m, v + 1);
}

static int check_rec(uint64_t id, const uint8_t *v, size_t len, char *why, size_t cap)
{
    uint8_t key[KV_LEASE_KEY_LEN];
    rec_key(id, key);
    return kv__lease_check_rec(key, sizeof(key), v, len, why, cap);
}

static const char *const two_keys[] = {"k1", "key-two"};

START_TEST(test_lease_records_of_both_formats_load)
{
    struct kv_leases t;
    kv__lease_init(&t);
    uint8_t key[KV_LEASE_KEY_LEN], v[256];
    size_t len = new_rec(v, 5000, 1234, 17, two_keys, 2);
    rec_key(7, key);
    ck_assert_int_eq(kv__lease_check_rec(key, sizeof(key), v, len, NULL, 0), 0);
    ck_assert_int_eq(kv__lease_load_rec(&t, key, sizeof(key), v, len), 0);
    /* The same id twice is a corrupt table, whatever the format. */
    ck_assert_int_eq(kv__lease_load_rec(&t, key, sizeof(key), v, len), TK_ECORRUPT);
    len = old_rec(v, 9000, 9000, 21, two_keys + 1, 1);
    rec_key(0x1f, key);
    ck_assert_int_eq(kv__lease_check_rec(key, sizeof(key), v, len, NULL, 0), 0);
    ck_assert_int_eq(kv__lease_load_rec(&t, key, sizeof(key), v, len), 0);
    ck_assert_uint_eq(t.n, 2);
    const struct kv_lease *a = kv__lease_find(&t, 7), *b = kv__lease_find(&t, 0x1f);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(a->ttl_ms, 5000);
    ck_assert_uint_eq(a->remaining_ms, 1234);
    ck_assert_uint_eq(a->renewed, 17);
    ck_assert_uint_eq(a->n_keys, 2);
    ck_assert_uint_eq(b->ttl_ms, 9000);
    ck_assert_uint_eq(b->remaining_ms, 9000);
    ck_assert_uint_eq(b->renewed, 21);
    /* key-two was attached to 7 first: a key has one lease. */
    ck_assert_uint_eq(b->n_keys, 0);
    ck_assert_uint_eq(t.count, 2);
    kv__lease_free(&t);
}
END_TEST

/* One value that must be refused, with a reason. */
static void refused(uint64_t id, const uint8_t *v, size_t len, const char *what)
{
    char why[96] = "";
    ck_assert_msg(check_rec(id, v, len, why, sizeof(why)) == TK_ECORRUPT,
                  "%s: not refused", what);
    ck_assert_msg(why[0] != '\0', "%s: refused without a reason", what);
}

START_TEST(test_corrupt_lease_records_refused)
{
    uint8_t v[8192];
    char why[96];
    /* Every truncation of the old layout is refused. */
    size_t full = old_rec(v, 5000, 100, 3, two_keys, 2);
    for (size_t n = 0; n < full; n++)
        ck_assert_msg(check_rec(1, v, n, why, sizeof(why)) == TK_ECORRUPT,
                      "old record cut at %zu of %zu", n, full);
    refused(1, v, full + 1, "old record with a byte after its keys");
    uint32_t many = KV_LEASE_KEYS_MAX + 1;
    memcpy(v + 26, &many, 4);
    refused(1, v, full, "old record counting too many keys");

    /* A protobuf value cut inside a field is refused; cut between fields it
     * is a shorter record (the stores' CRCs catch those), still in bounds. */
    full = new_rec(v, 5000, 100, 3, two_keys, 2);
    size_t cut = 0;
    for (size_t n = 0; n < full; n++) {
        int rc = check_rec(1, v, n, why, sizeof(why));
        ck_assert_msg(rc == 0 || rc == TK_ECORRUPT, "cut at %zu: %d", n, rc);
        cut += rc == TK_ECORRUPT;
    }
    ck_assert_uint_ge(cut, full / 2);
    refused(1, v, 1, "a record without its TTL");

    /* Fields of the wrong wire type, a varint cut short, unknown formats. */
    static const uint8_t ttl_as_bytes[] = {0x01, 0x0a, 0x01, 0x00};
    static const uint8_t keys_as_varint[] = {0x01, 0x08, 0x05, 0x20, 0x05};
    static const uint8_t cut_varint[] = {0x01, 0x08, 0x80};
    static const uint8_t key_overrun[] = {0x01, 0x08, 0x05, 0x22, 0x09, 'k'};
    static const uint8_t other_version[] = {0x02, 0x08, 0x05};
    refused(1, ttl_as_bytes, sizeof(ttl_as_bytes), "ttl as bytes");
    refused(1, keys_as_varint, sizeof(keys_as_varint), "keys as a varint");
    refused(1, cut_varint, sizeof(cut_varint), "a cut varint");
    refused(1, key_overrun, sizeof(key_overrun), "a key overrunning the value");
    refused(1, other_version, sizeof(other_version), "version 2");
    refused(1, (const uint8_t *)"raft=x", 6, "text");
    refused(1, v, 0, "an empty value");

    /* Out of the limits a grant, keepalive or put keeps. */
    static const char *const empty[] = {""};
    static const char *const reserved[] = {KV_LEASE_PREFIX "0000000000000001"};
    refused(1, v, new_rec(v, 0, 0, 3, NULL, 0), "ttl 0");
    refused(1, v, new_rec(v, KV_LEASE_TTL_MAX + 1, 1, 3, NULL, 0), "ttl over the max");
    refused(1, v, new_rec(v, 5000, 5001, 3, NULL, 0), "remaining over the ttl");
    refused(1, v, new_rec(v, 5000, 10, 3, empty, 1), "an empty key");
    refused(1, v, new_rec(v, 5000, 10, 3, reserved, 1), "a lease record's key");
    refused(1, v, old_rec(v, 5000, 10, 3, empty, 1), "old: an empty key");
    size_t len = new_rec(v, 5000, 10, 3, NULL, 0);
    for (size_t i = 0; i <= KV_LEASE_KEYS_MAX; i++) { /* repeated keys, 1 byte each */
        v[len++] = 0x22;
        v[len++] = 1;
        v[len++] = 'a' + (uint8_t)(i % 26);
    }
    refused(1, v, len, "too many keys");

    /* Keys that do not name a lease. */
    len = new_rec(v, 5000, 10, 3, two_keys, 2);
    uint8_t key[KV_LEASE_KEY_LEN];
    rec_key(0xab, key);
    key[KV_LEASE_KEY_LEN - 1] = 'B';
    ck_assert_int_eq(kv__lease_check_rec(key, sizeof(key), v, len, why, sizeof(why)),
                     TK_ECORRUPT);
    ck_assert_int_eq(kv__lease_check_rec(key, sizeof(key) - 1, v, len, why, sizeof(why)),
                     TK_ECORRUPT);
    refused(0, v, len, "id 0");
    refused((uint64_t)INT64_MAX + 1, v, len, "an id over INT64_MAX");

    /* Random bytes after each first byte: refused or in bounds, never a
     * crash (the sanitizer build runs this too). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    enum tk_log_level level = tk_log_get_level();
    tk_log_set_level(TK_LOG_OFF); /* each refusal says why: 20,000 lines */
    struct kv_leases t;
    kv__lease_init(&t);
    for (int i = 0; i < 30000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = 1 + x % 64;
        for (size_t j = 0; j < n; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v[j] = (uint8_t)x;
        }
        v[0] = i % 3 == 0 ? 0x01 : i % 3 == 1 ? 'L' : v[0];
        if (i % 3 == 1 && n > 1)
            v[1] = '1';
        rec_key((uint64_t)i + 1, key);
        int rc = kv__lease_load_rec(&t, key, sizeof(key), v, n);
        ck_assert_msg(rc == 0 || rc == TK_ECORRUPT, "random record %d: %d", i, rc);
    }
    tk_log_set_level(level);
    for (size_t i = 0; i < t.n; i++) {
        ck_assert_uint_ge(t.v[i]->ttl_ms, 1);
        ck_assert_uint_le(t.v[i]->ttl_ms, KV_LEASE_TTL_MAX);
        ck_assert_uint_le(t.v[i]->remaining_ms, t.v[i]->ttl_ms);
        ck_assert_uint_le(t.v[i]->n_keys, KV_LEASE_KEYS_MAX);
    }
    kv__lease_free(&t);
}
END_TEST

/* What a grant, puts and a checkpoint write is 0x01 then a kvpb.LeaseRecord. */
START_TEST(test_lease_records_are_written_as_protobuf)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t a = grant(&u, 5000);
    ck_assert_int_eq(put_lease(&u, "k1", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "key-two", "v", a), 0);
    ck_assert_int_eq(checkpoint(&u, a, 1234), 0);
    uint8_t key[KV_LEASE_KEY_LEN];
    rec_key(a, key);
    struct kv_item it;
    ck_assert_int_eq(kv_sm_get(u.sm, key, sizeof(key), &it), 0);
    ck_assert_uint_ge(it.value_len, 1);
    ck_assert_uint_eq(it.value[0], 0x01);
    Kvpb__LeaseRecord *m =
        kvpb__lease_record__unpack(NULL, it.value_len - 1, it.value + 1);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->ttl_ms, 5000);
    ck_assert_uint_eq(m->remaining_ms, 1234);
    ck_assert_uint_eq(m->renewed, a);
    ck_assert_uint_eq(m->n_keys, 2);
    ck_assert_mem_eq(m->keys[0].data, "k1", 2);
    ck_assert_mem_eq(m->keys[1].data, "key-two", 7);
    kvpb__lease_record__free_unpacked(m, NULL);
    kvu_close(&u, true);
}
END_TEST

static int corrupt_lines;

static void count_corrupt(const char *line, size_t len, void *data)
{
    (void)data;
    static const char want[] = "a corrupt lease record: 3 bytes that are no LeaseRecord";
    if (memmem(line, len, want, sizeof(want) - 1) != NULL)
        corrupt_lines++;
}

/* Replaces lease id's record in u's data table by v (what an older build, or
 * a damaged disk, left), at the applied index. */
static void overwrite_rec(struct kvu *u, uint64_t id, const uint8_t *v, size_t len)
{
    uint8_t key[KV_LEASE_KEY_LEN];
    rec_key(id, key);
    uint64_t hash = kv__hash(key, sizeof(key));
    struct kv_state st;
    ck_assert_int_eq(kv__state_lookup(u->sm, key, sizeof(key), hash, &st), 0);
    ck_assert(st.live);
    st.value = v;
    st.value_len = len;
    kv__state_write(u->sm, kv_sm_applied_index(u->sm), key, sizeof(key), hash, &st);
    ck_assert_int_eq(kv_sm_flush(u->sm), 0);
}

/* A data directory of an older build: its "L1" records load at open, and the
 * next change of the lease rewrites it. A record that is neither refuses the
 * open as TK_ECORRUPT. */
START_TEST(test_old_lease_records_load_at_open)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t a = grant(&u, 5000);
    ck_assert_int_eq(put_lease(&u, "k1", "v", a), 0);
    ck_assert_int_eq(put_lease(&u, "key-two", "v", a), 0);
    uint8_t v[256];
    overwrite_rec(&u, a, v, old_rec(v, 5000, 1234, a, two_keys, 2));
    struct kv_config cfg = u.cfg;
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    struct kv_lease_info li;
    ck_assert_int_eq(kv_sm_lease_get(u.sm, a, 0, &li, NULL, NULL), 0);
    ck_assert_uint_eq(li.ttl_ms, 5000);
    ck_assert_uint_eq(li.remaining_ms, 1234);
    ck_assert_uint_eq(li.n_keys, 2);
    ck_assert_int_eq(kvu_put(&u, "k1", "free"), 0); /* detaches, rewrites */
    ck_assert_uint_eq(n_keys(&u, a), 1);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    kvu_close(&u, false);
    kvu_open(&u, &cfg);
    ck_assert_uint_eq(n_keys(&u, a), 1);
    ck_assert_int_eq(lease_revoke(&u, a, false), 0);
    ck_assert_uint_eq(u.res.deleted, 1);

    uint64_t b = grant(&u, 5000);
    static const uint8_t bad[] = {0x01, 0x0a, 0x01, 0x00};
    overwrite_rec(&u, b, bad, sizeof(bad));
    kvu_close(&u, false);
    struct kv_sm *sm = NULL;
    corrupt_lines = 0;
    tk_log_set_sink(count_corrupt, NULL);
    ck_assert_int_eq(kv_sm_open(&cfg, &sm), TK_ECORRUPT);
    tk_log_set_sink(NULL, NULL);
    ck_assert_int_eq(corrupt_lines, 1); /* says why */
    ck_assert_ptr_null(sm);
    kvu_rmrf(u.dir);
    tk_free(u.dir);
}
END_TEST

/* A put that keeps the key's value or lease (kvpb.Put keep_value and
 * keep_lease: etcd's ignore_value and ignore_lease). */
static int put_keep(struct kvu *u, const char *k, const char *v, uint64_t lease,
                    bool keep_value, bool keep_lease)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    p.key = kvu_str(k);
    p.value = kvu_str(v);
    p.lease = lease;
    p.keep_value = keep_value;
    p.keep_lease = keep_lease;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    return kvu_apply_code(u, &c);
}

START_TEST(test_put_keeps_value_and_lease)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 3000);
    char buf[16];
    struct kv_item it;
    ck_assert_int_eq(put_lease(&u, "a", "v1", id), 0);
    /* keep_value, no lease: the value stays (rewritten in place over its own
     * bytes), the lease goes */
    struct kv_sm_stats st0, st1;
    kv_sm_stats(u.sm, &st0);
    ck_assert_uint_eq(kv_sm_key_lease(u.sm, "a", 1), id);
    ck_assert_int_eq(put_keep(&u, "a", "", 0, true, false), 0);
    kv_sm_stats(u.sm, &st1);
    ck_assert_uint_eq(st1.rewrites, st0.rewrites + 1);
    ck_assert_uint_eq(kv_sm_key_lease(u.sm, "a", 1), 0);
    {
        /* the change log has the lease the key had */
        struct evs pe = {0};
        uint64_t pnext;
        ck_assert_int_eq(
            kv_sm_events_read(u.sm, kv_sm_applied_index(u.sm), 1, 0, ev_cb, &pe, &pnext),
            0);
        ck_assert_uint_eq(pe.n, 1);
        ck_assert_uint_eq(pe.prev_lease[0], id);
    }
    ck_assert_str_eq(kvu_get(&u, "a", buf, sizeof(buf)), "v1");
    ck_assert_int_eq(kv_sm_get(u.sm, "a", 1, &it), 0);
    ck_assert_uint_eq(it.version, 2);
    ck_assert_uint_eq(it.mod_revision, kv_sm_applied_index(u.sm));
    ck_assert_uint_eq(n_keys(&u, id), 0);
    /* keep_lease: a new value, the lease stays */
    ck_assert_int_eq(put_lease(&u, "a", "v1", id), 0);
    ck_assert_int_eq(put_keep(&u, "a", "v22", 0, false, true), 0);
    ck_assert_str_eq(kvu_get(&u, "a", buf, sizeof(buf)), "v22");
    ck_assert_uint_eq(n_keys(&u, id), 1);
    /* both: nothing changes but the revision and version */
    ck_assert_int_eq(put_keep(&u, "a", "", 0, true, true), 0);
    ck_assert_str_eq(kvu_get(&u, "a", buf, sizeof(buf)), "v22");
    ck_assert_uint_eq(n_keys(&u, id), 1);
    ck_assert_int_eq(kv_sm_get(u.sm, "a", 1, &it), 0);
    ck_assert_uint_eq(it.version, 5);
    /* the change log has the kept value and the previous one */
    struct evs e = {0};
    uint64_t next, rev = kv_sm_applied_index(u.sm);
    ck_assert_int_eq(kv_sm_events_read(u.sm, rev, 1, 0, ev_cb, &e, &next), 0);
    ck_assert_uint_eq(e.n, 1);
    ck_assert_int_eq(e.type[0], KV_EVENT_PUT);
    /* an absent key has nothing to keep: TK_ECOMPARE, nothing written */
    uint64_t applied = kv_sm_applied_index(u.sm);
    ck_assert_int_eq(put_keep(&u, "zz", "", 0, true, false), TK_ECOMPARE);
    ck_assert_int_eq(put_keep(&u, "zz", "x", 0, false, true), TK_ECOMPARE);
    ck_assert_uint_eq(u.res.revision, 0);
    ck_assert_ptr_null(kvu_get(&u, "zz", buf, sizeof(buf)));
    ck_assert_int_eq(kvu_del(&u, "a"), 0);
    ck_assert_int_eq(put_keep(&u, "a", "", 0, true, false), TK_ECOMPARE);
    ck_assert_ptr_null(kvu_get(&u, "a", buf, sizeof(buf)));
    ck_assert_uint_gt(kv_sm_applied_index(u.sm), applied);
    /* a value or a lease given with keep: refused */
    ck_assert_int_eq(kvu_put(&u, "b", "1"), 0);
    ck_assert_int_eq(put_keep(&u, "b", "2", 0, true, false), TK_EINVAL);
    ck_assert_int_eq(put_keep(&u, "b", "", id, false, true), TK_EINVAL);
    ck_assert_str_eq(kvu_get(&u, "b", buf, sizeof(buf)), "1");
    /* in one batch: the value the command left, then kept */
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Batch b = KVPB__BATCH__INIT;
    Kvpb__Op o[2] = {KVPB__OP__INIT, KVPB__OP__INIT}, *op[2] = {&o[0], &o[1]};
    Kvpb__Put p[2] = {KVPB__PUT__INIT, KVPB__PUT__INIT};
    p[0].key = kvu_str("b");
    p[0].value = kvu_str("first");
    p[0].lease = id;
    p[1].key = kvu_str("b");
    p[1].keep_value = true;
    p[1].keep_lease = true;
    for (int i = 0; i < 2; i++) {
        o[i].op_case = KVPB__OP__OP_PUT;
        o[i].put = &p[i];
    }
    b.ops = op;
    b.n_ops = 2;
    c.cmd_case = KVPB__COMMAND__CMD_BATCH;
    c.batch = &b;
    ck_assert_int_eq(kvu_apply_code(&u, &c), 0);
    ck_assert_str_eq(kvu_get(&u, "b", buf, sizeof(buf)), "first");
    ck_assert_uint_eq(n_keys(&u, id), 1);
    /* from the cold tier: the kept value is appended, not lost */
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_int_eq(put_keep(&u, "b", "", 0, true, true), 0);
    ck_assert_int_eq(kv_sm_flush(u.sm), 0);
    ck_assert_str_eq(kvu_get(&u, "b", buf, sizeof(buf)), "first");
    ck_assert_uint_eq(n_keys(&u, id), 1);
    kvu_close(&u, true);
}
END_TEST

/* A txn of one compare (range_end NULL: on the key alone) and a put of
 * "/t" = "then" (else "else"): its code, and *held which branch ran. */
static int txn_cmp(struct kvu *u, const char *key, const char *range_end,
                   Kvpb__Compare__Target target, Kvpb__Compare__Op op, int64_t number,
                   const char *value, bool *held)
{
    Kvpb__Compare c = KVPB__COMPARE__INIT, *cp = &c;
    c.key = kvu_str(key);
    if (range_end != NULL)
        c.range_end = kvu_bin(range_end, range_end[0] ? strlen(range_end) : 1);
    c.target = target;
    c.op = op;
    c.number = number;
    if (value != NULL)
        c.value = kvu_str(value);
    Kvpb__Put pt = KVPB__PUT__INIT, pe = KVPB__PUT__INIT;
    pt.key = pe.key = kvu_str("/t");
    pt.value = kvu_str("then");
    pe.value = kvu_str("else");
    Kvpb__Op ot = KVPB__OP__INIT, oe = KVPB__OP__INIT, *otp = &ot, *oep = &oe;
    ot.op_case = oe.op_case = KVPB__OP__OP_PUT;
    ot.put = &pt;
    oe.put = &pe;
    Kvpb__Txn t = KVPB__TXN__INIT;
    t.compares = &cp;
    t.n_compares = 1;
    t.then_ops = &otp;
    t.n_then_ops = 1;
    t.else_ops = &oep;
    t.n_else_ops = 1;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
    cmd.txn = &t;
    int rc = kvu_apply_code(u, &cmd);
    *held = u->res.succeeded;
    return rc;
}

START_TEST(test_compares_on_lease_and_over_ranges)
{
    struct kvu u = {0};
    kvu_open(&u, NULL);
    uint64_t id = grant(&u, 3000);
    bool held;
    const Kvpb__Compare__Op EQ = KVPB__COMPARE__OP__EQUAL,
                            NE = KVPB__COMPARE__OP__NOT_EQUAL,
                            GT = KVPB__COMPARE__OP__GREATER, LT = KVPB__COMPARE__OP__LESS;
    const Kvpb__Compare__Target LEASE = KVPB__COMPARE__TARGET__LEASE,
                                VALUE = KVPB__COMPARE__TARGET__VALUE,
                                VERSION = KVPB__COMPARE__TARGET__VERSION;
    ck_assert_int_eq(put_lease(&u, "r/a", "1", id), 0);
    ck_assert_int_eq(kvu_put(&u, "r/b", "1"), 0);
    ck_assert_int_eq(kvu_put(&u, "r/c", "2"), 0);
    /* lease: the key's, 0 for none or absent */
    ck_assert_int_eq(txn_cmp(&u, "r/a", NULL, LEASE, EQ, (int64_t)id, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/b", NULL, LEASE, EQ, 0, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/zz", NULL, LEASE, EQ, 0, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/a", NULL, LEASE, NE, (int64_t)id, NULL, &held), 0);
    ck_assert(!held);
    char buf[16];
    ck_assert_str_eq(kvu_get(&u, "/t", buf, sizeof(buf)), "else");
    /* over a range: every live key */
    ck_assert_int_eq(txn_cmp(&u, "r/a", "r/c", VALUE, EQ, 0, "1", &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/a", "r/d", VALUE, EQ, 0, "1", &held), 0);
    ck_assert(!held);
    ck_assert_int_eq(txn_cmp(&u, "r/", "r0", VERSION, GT, 0, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/", "r0", LEASE, EQ, (int64_t)id, NULL, &held), 0);
    ck_assert(!held); /* r/b and r/c have none */
    ck_assert_int_eq(txn_cmp(&u, "r/a", "r/b", LEASE, EQ, (int64_t)id, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/b", "", VALUE, LT, 0, "3", &held), 0); /* from key */
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "r/a", "", VALUE, LT, 0, "2", &held), 0);
    ck_assert(!held); /* r/c is 2 */
    /* an empty range: as an absent key (version 0; no value matches) */
    ck_assert_int_eq(txn_cmp(&u, "s/", "s0", VERSION, EQ, 0, NULL, &held), 0);
    ck_assert(held);
    ck_assert_int_eq(txn_cmp(&u, "s/", "s0", VALUE, NE, 0, "x", &held), 0);
    ck_assert(!held);
    ck_assert_int_eq(txn_cmp(&u, "r/c", "r/a", VERSION, EQ, 0, NULL, &held), 0);
    ck_assert(held); /* an end before the key: empty */
    /* deleted keys are not in the range */
    ck_assert_int_eq(kvu_del(&u, "r/c"), 0);
    ck_assert_int_eq(txn_cmp(&u, "r/", "r0", VALUE, EQ, 0, "1", &held), 0);
    ck_assert(held);
    /* the node's own records (the lease's) are in no range */
    ck_assert_int_eq(txn_cmp(&u, "\x01", "\x02", VERSION, EQ, 0, NULL, &held), 0);
    ck_assert(held);
    /* the bound: KV_COMPARE_RANGE_KEYS live keys */
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Batch b = KVPB__BATCH__INIT;
    Kvpb__Op o[100], *op[100];
    Kvpb__Put p[100];
    char keys[100][16];
    for (int k = 0; k < KV_COMPARE_RANGE_KEYS / 100; k++) {
        for (int i = 0; i < 100; i++) {
            snprintf(keys[i], sizeof(keys[i]), "m/%06d", k * 100 + i);
            kvpb__put__init(&p[i]);
            p[i].key = kvu_str(keys[i]);
            p[i].value = kvu_str("v");
            kvpb__op__init(&o[i]);
            o[i].op_case = KVPB__OP__OP_PUT;
            o[i].put = &p[i];
            op[i] = &o[i];
        }
        b.ops = op;
        b.n_ops = 100;
        c.cmd_case = KVPB__COMMAND__CMD_BATCH;
        c.batch = &b;
        ck_assert_int_eq(kvu_apply_code(&u, &c), 0);
    }
    ck_assert_int_eq(txn_cmp(&u, "m/", "m0", VALUE, EQ, 0, "v", &held), 0);
    ck_assert(held); /* exactly the bound */
    ck_assert_int_eq(kvu_put(&u, "m/x", "v"), 0);
    ck_assert_int_eq(txn_cmp(&u, "m/", "m0", VALUE, EQ, 0, "v", &held), TK_ETOOBIG);
    /* a put's compare is on its key only */
    Kvpb__Compare cond = KVPB__COMPARE__INIT;
    cond.range_end = kvu_str("z");
    cond.target = KVPB__COMPARE__TARGET__EXISTS;
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key = kvu_str("r/a");
    put.value = kvu_str("x");
    put.cond = &cond;
    Kvpb__Command pc = KVPB__COMMAND__INIT;
    pc.cmd_case = KVPB__COMMAND__CMD_PUT;
    pc.put = &put;
    ck_assert_int_eq(kvu_apply_code(&u, &pc), TK_EINVAL);
    kvu_close(&u, true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv-lease");
    TCase *tc = tcase_create("lease");
    tcase_add_test(tc, test_grant_attach_detach_and_revoke_in_one_revision);
    tcase_add_test(tc, test_expired_revoke_gives_expire_events);
    tcase_add_test(tc, test_deadline_from_checkpoint_and_keepalive);
    tcase_add_test(tc, test_reserved_prefix_refused_and_bad_grants);
    tcase_add_test(tc, test_leases_survive_restart_and_install);
    tcase_add_test(tc, test_install_prepare_builds_the_tables);
    tcase_add_test(tc, test_lease_records_of_both_formats_load);
    tcase_add_test(tc, test_corrupt_lease_records_refused);
    tcase_add_test(tc, test_old_lease_records_load_at_open);
    tcase_add_test(tc, test_lease_records_are_written_as_protobuf);
    tcase_add_test(tc, test_put_keeps_value_and_lease);
    tcase_add_test(tc, test_compares_on_lease_and_over_ranges);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}
