/* Leases (kv/lease.c): grant, attach and detach by puts, keepalive,
 * checkpoint, revoke (delete or expire events at one revision), the reserved
 * prefix, and the table rebuilt after a restart and a snapshot install. */
#include <check.h>

#include "tests/unit/kv/kv_util.h"

static int lease_cmd(struct kvu *u, Kvpb__Command *c)
{
    int rc = kvu_apply(u, c);
    return rc != 0 ? rc : u->res.code;
}

static uint64_t grant(struct kvu *u, uint64_t ttl)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    g.ttl_ms = ttl;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    c.lease_grant = &g;
    ck_assert_int_eq(lease_cmd(u, &c), 0);
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
    return lease_cmd(u, &c);
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
    return lease_cmd(u, &c);
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
    return lease_cmd(u, &c);
}

static int put_lease(struct kvu *u, const char *k, const char *v, uint64_t lease)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    p.key = kvu_str(k);
    p.value = kvu_str(v);
    p.lease = lease;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    return lease_cmd(u, &c);
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
};

static void ev_cb(const struct kv_event *ev, void *data)
{
    struct evs *e = data;
    ck_assert_uint_lt(e->n, 16);
    e->rev[e->n] = ev->revision;
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
    ck_assert_int_eq(lease_cmd(&u, &c), 0);
    ck_assert_uint_eq(kv_sm_lease_count(u.sm), 1);
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    c.lease_grant = &g;
    ck_assert_int_eq(lease_cmd(&u, &c), TK_EINVAL); /* ttl 0 */
    g.ttl_ms = 1000;
    g.id = id;
    ck_assert_int_eq(lease_cmd(&u, &c), TK_ECOMPARE); /* id taken */
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
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Increment inc = KVPB__INCREMENT__INIT;
    inc.key = kvu_str("ctr");
    inc.delta = 1;
    c.cmd_case = KVPB__COMMAND__CMD_INCR;
    c.incr = &inc;
    c.seq = 1;
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
    ck_assert_uint_gt(allocs[0], SESSIONS + TTL_MAX);
    tk_free(stream);
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
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_ENV);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed == 0 ? 0 : 1;
}
