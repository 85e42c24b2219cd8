/* Test helpers for kv/: temporary directories, building and applying
 * commands (kvpb.Command through protobuf-c), and reading values back.
 * Header-only (static functions) so each test binary takes what it uses. */
#ifndef TK_TESTS_KV_UTIL_H
#define TK_TESTS_KV_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

static int kvu_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void kvu_rmrf(const char *dir)
{
    nftw(dir, kvu_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static inline char *kvu_tmpdir(void)
{
    char tmpl[] = "/tmp/kvtest-XXXXXX";
    char *d = mkdtemp(tmpl);
    if (d == NULL) {
        perror("mkdtemp");
        abort();
    }
    return tk_strdup(d);
}

/* Packs c into a new tk_malloc'd buffer. */
static inline uint8_t *kvu_pack(const Kvpb__Command *c, size_t *len)
{
    *len = kvpb__command__get_packed_size(c);
    uint8_t *buf = tk_malloc(*len > 0 ? *len : 1);
    kvpb__command__pack(c, buf);
    return buf;
}

static inline ProtobufCBinaryData kvu_bin(const void *p, size_t len)
{
    ProtobufCBinaryData b = {len, (uint8_t *)(uintptr_t)p};
    return b;
}

static inline ProtobufCBinaryData kvu_str(const char *s)
{
    return kvu_bin(s, strlen(s));
}

/* A state machine plus the next index and the entry clock. */
struct kvu {
    struct kv_sm *sm;
    char *dir;
    struct kv_config cfg;
    uint64_t time_ms;
    struct kv_result res;
};

/* The tests' configuration in u->cfg (the defaults, no sync, a map of 1 GiB)
 * and a fresh directory in u->dir: kvu_open(u, NULL) opens with it as it is,
 * a test that changes it passes a copy. */
static inline void kvu_defaults(struct kvu *u)
{
    kv_config_default(&u->cfg);
    u->cfg.no_sync = true;
    u->cfg.map_bytes = (size_t)1 << 30;
    u->dir = kvu_tmpdir();
}

static inline void kvu_open(struct kvu *u, struct kv_config *cfg)
{
    if (cfg == NULL)
        kvu_defaults(u);
    u->cfg.dir = u->dir;
    if (cfg != NULL) {
        u->cfg = *cfg;
        u->cfg.dir = u->dir;
    }
    int rc = kv_sm_open(&u->cfg, &u->sm);
    if (rc != 0) {
        fprintf(stderr, "kv_sm_open: %s\n", tk_strerror(rc));
        abort();
    }
    if (u->time_ms == 0)
        u->time_ms = 1000;
}

/* Opens u with 4 KiB ring pages and a ring of ring_bytes (tests that push data
 * past the ring's budget into the cold tier). */
static inline void kvu_open_small(struct kvu *u, size_t ring_bytes, bool background_tier)
{
    kvu_defaults(u);
    u->cfg.page_bytes = 4096;
    u->cfg.ring_bytes = ring_bytes;
    u->cfg.background_tier = background_tier;
    struct kv_config cfg = u->cfg;
    kvu_open(u, &cfg);
}

static inline void kvu_close(struct kvu *u, bool remove_dir)
{
    kv_sm_close(u->sm);
    u->sm = NULL;
    if (remove_dir) {
        kvu_rmrf(u->dir);
        tk_free(u->dir);
        u->dir = NULL;
    }
}

/* Applies c at the next index; returns kv_sm_apply's code, result in u->res. */
static inline int kvu_apply(struct kvu *u, const Kvpb__Command *c)
{
    size_t len;
    uint8_t *buf = kvu_pack(c, &len);
    uint64_t idx = kv_sm_applied_index(u->sm) + 1;
    int rc = kv_sm_apply(u->sm, idx, 1, u->time_ms, buf, len, &u->res);
    tk_free(buf);
    return rc;
}

/* kvu_apply's error, else the command's result code (u->res.code). */
static inline int kvu_apply_code(struct kvu *u, const Kvpb__Command *c)
{
    int rc = kvu_apply(u, c);
    return rc != 0 ? rc : u->res.code;
}

/* Puts k = v with a TTL (ttl_ms, 0: none) and a lease (0: none). */
static inline int kvu_put_full(struct kvu *u, const char *k, const char *v,
                               uint64_t ttl_ms, uint64_t lease)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    p.key = kvu_str(k);
    p.value = kvu_str(v);
    p.ttl_ms = ttl_ms;
    p.lease = lease;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &p;
    return kvu_apply_code(u, &c);
}

static inline int kvu_put_ttl(struct kvu *u, const char *k, const char *v, uint64_t ttl)
{
    return kvu_put_full(u, k, v, ttl, 0);
}

static inline int kvu_put(struct kvu *u, const char *k, const char *v)
{
    return kvu_put_ttl(u, k, v, 0);
}

static inline int kvu_del(struct kvu *u, const char *k)
{
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Delete d = KVPB__DELETE__INIT;
    d.key = kvu_str(k);
    c.cmd_case = KVPB__COMMAND__CMD_DEL;
    c.del = &d;
    return kvu_apply_code(u, &c);
}

/* Makes c the increment of k by delta (in holds it), from client_id's seq
 * (0, 0: no exactly-once). */
static inline void kvu_incr_cmd(Kvpb__Command *c, Kvpb__Increment *in, const char *k,
                                int64_t delta, uint64_t client_id, uint64_t seq)
{
    *c = (Kvpb__Command)KVPB__COMMAND__INIT;
    *in = (Kvpb__Increment)KVPB__INCREMENT__INIT;
    in->key = kvu_str(k);
    in->delta = delta;
    c->cmd_case = KVPB__COMMAND__CMD_INCR;
    c->incr = in;
    c->client_id = client_id;
    c->seq = seq;
}

static inline int kvu_incr(struct kvu *u, const char *k, int64_t delta)
{
    Kvpb__Command c;
    Kvpb__Increment in;
    kvu_incr_cmd(&c, &in, k, delta, 0, 0);
    return kvu_apply_code(u, &c);
}

/* A snapshot's source state: keys key0000 to key<n-1> (their own values,
 * every fifth with a TTL of 100 s) and a remembered result (client 7's
 * increment of "ctr" by 9, seq 1): n + 1 entries applied. Returns 0, or
 * the first write's error. */
static inline int kvu_fill_snapshot_source(struct kvu *u, int n)
{
    char k[32];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "key%04d", i);
        int rc = kvu_put_ttl(u, k, k, i % 5 == 0 ? 100000 : 0);
        if (rc != 0)
            return rc;
    }
    Kvpb__Command c;
    Kvpb__Increment in;
    kvu_incr_cmd(&c, &in, "ctr", 9, 7, 1);
    return kvu_apply(u, &c);
}

/* The value of k as a NUL-terminated string in out (cap bytes), or NULL. */
static inline const char *kvu_get(struct kvu *u, const char *k, char *out, size_t cap)
{
    struct kv_item it;
    int rc = kv_sm_get(u->sm, k, strlen(k), &it);
    if (rc != 0)
        return NULL;
    size_t n = it.value_len < cap - 1 ? it.value_len : cap - 1;
    memcpy(out, it.value, n);
    out[n] = '\0';
    return out;
}

#endif
