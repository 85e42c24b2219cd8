/* Snapshots: a stream of the cold tier at one index, and its installation.
 *
 * Stream = header ("TKVSNAP1", index, term, clock: u64 big-endian each), then
 * records [u8 table][u32 key len][u32 value len][key][value] in LMDB order per
 * table (data, expiry, sessions), then a trailer [0xFF][u64 record count]
 * [u32 CRC32C of every byte before it]. kv_sm_snapshot (tier.c) first flushes the ring,
 * so the cold tier holds exactly the applied state, then opens an LMDB read
 * transaction: the stream is that MVCC view, unaffected by later applies.
 * Installation writes a fresh environment record by record (bounded memory:
 * one record at a time), checks the trailer, then swaps it in atomically.
 * A stream from the network is bad input until proven otherwise: one walk
 * (struct snap_walk) decodes every record as the install and its loaders will
 * read it (known table, bounded lengths, keys in LMDB order, the data, session
 * and lease values' layouts), and checks the trailer's count and CRC;
 * kv_snap_check runs it over a whole stream before anything is written (the
 * node, before the core hears of the snapshot), and the install's parse runs
 * the same walk as the bytes come.
 * Called by tier.c (kv_sm_snapshot, a background job's stream) and the node;
 * calls sessions.c, ttl.c and lease.c (an install's prepare builds their
 * tables from the new environment, its commit swaps them in), the ring,
 * index, view and cold tier. */
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/crc32c.h"
#include "base/endian.h"
#include "base/err.h"
#include "base/sync.h"
#include "kv/sm_internal.h"

#define SNAP_MAGIC "TKVSNAP1"
#define HDR_BYTES 32
#define REC_HDR 9
#define TRAILER 13
/* The cold tier's data value header (cold.c's VHDR: expire_ms, create_rev,
 * mod_rev, version), then for a long key (stored as its first
 * KV_COLD_SHORT_MAX bytes and a hash) a u16 length and the full key. */
#define VAL_HDR 32
#define KEY_MAX 511 /* LMDB's default key size limit */
#define LONG_STORED (KV_COLD_SHORT_MAX + 8)

/* What a walk over a stream has seen: the CRC so far, the records, and the
 * last record's table and key (the next must sort after it). walk_record
 * checks a record without folding it into crc: its caller folds the records
 * in spans (walk_crc), as one tk_crc32c call per 154-byte record cost ten
 * times a call over the same bytes at once (docs/benchmarks-kv.md). */
struct snap_walk {
    uint32_t crc;
    uint64_t count;
    uint64_t now_ms; /* the header's clock: leases expired then are not loaded */
    uint8_t table;
    size_t prev_len;
    uint8_t prev[KEY_MAX];
    char why[96]; /* what is wrong, once a step returned TK_ECORRUPT */
};

struct kv_snap {
    struct kv_sm *sm;
    struct kv_cold_snap *cs;
    struct kv_cold_meta meta;
    uint8_t *stage;
    size_t stage_cap, stage_len, stage_off;
    uint32_t crc;
    uint64_t count;
    int state;        /* 0 header, 1 records, 2 trailer sent, 3 failed */
    size_t size_hint; /* the cold tier's bytes in use at the open */
};

struct kv_install {
    struct kv_sm *sm;
    struct kv_cold_new *n;
    struct kv_cold_meta meta;
    uint8_t *pend;
    size_t pend_len, pend_cap, pend_max;
    struct snap_walk walk;
    int state; /* 0 header, 1 records, 2 done, 3 failed, 4 prepared (published) */
    /* The new state's sessions, TTL keys and leases, read back by prepare
     * off the owner's thread, for commit to swap in. */
    bool loaded;
    struct kv_sessions sessions;
    struct kv_ttl ttl;
    struct kv_leases leases;
};

/* What an install replaced, for the owner to drop off its loop: the old hot
 * structures (tens of MB of pages, index and view), the old cold
 * environment's mapping and files. */
struct kv_trash {
    struct kv_view view;
    struct kv_index index;
    struct kv_ring ring;
    bool tables; /* the sessions, TTL keys and leases a swap replaced */
    struct kv_sessions sessions;
    struct kv_ttl ttl;
    struct kv_leases leases;
    void *env;
    char path[PATH_MAX];
};

/* ---- the walk: one stream's structure, checked ---- */

__attribute__((format(printf, 2, 3))) static int walk_fail(struct snap_walk *w,
                                                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->why, sizeof(w->why), fmt, ap);
    va_end(ap);
    return TK_ECORRUPT;
}

/* LMDB's default order: bytes, then the shorter key first. */
static int key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c != 0)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static void walk_init(struct snap_walk *w)
{
    memset(w, 0, offsetof(struct snap_walk, prev));
    w->why[0] = '\0';
}

/* The header (HDR_BYTES at p): 0 or TK_ECORRUPT. */
static int walk_header(struct snap_walk *w, const uint8_t *p, struct kv_cold_meta *meta)
{
    if (memcmp(p, SNAP_MAGIC, 8) != 0)
        return walk_fail(w, "not a snapshot stream (bad magic)");
    meta->index = tk_get_be64(p + 8);
    meta->term = tk_get_be64(p + 16);
    meta->now_ms = tk_get_be64(p + 24);
    w->now_ms = meta->now_ms;
    w->crc = tk_crc32c(w->crc, p, HDR_BYTES);
    return 0;
}

/* A lease record (lease.c's kv__lease_load_rec reads it at the install). */
static int check_lease(struct snap_walk *w, const uint8_t *key, size_t klen,
                       const uint8_t *v, size_t vlen)
{
    char why[64];
    if (kv__lease_check_rec(key, klen, v, vlen, why, sizeof(why)) != 0)
        return walk_fail(w, "record %llu: a malformed lease: %s",
                         (unsigned long long)w->count, why);
    return 0;
}

/* A data record: its value header, a long key's full key, and a live lease
 * record's layout (as cold.c's decode_val and each_prefixed read them). */
static int check_data(struct snap_walk *w, const uint8_t *k, size_t klen,
                      const uint8_t *v, size_t vlen)
{
    if (vlen < VAL_HDR)
        return walk_fail(w, "record %llu: a value of %zu bytes, without its header",
                         (unsigned long long)w->count, vlen);
    const uint8_t *key = k;
    size_t key_len = klen, hdr = VAL_HDR;
    if (klen == LONG_STORED) {
        if (vlen < VAL_HDR + 2 ||
            vlen - VAL_HDR - 2 < (((size_t)v[VAL_HDR] << 8) | v[VAL_HDR + 1]))
            return walk_fail(w, "record %llu: a long key overruns its value",
                             (unsigned long long)w->count);
        key_len = ((size_t)v[VAL_HDR] << 8) | v[VAL_HDR + 1];
        key = v + VAL_HDR + 2;
        hdr = VAL_HDR + 2 + key_len;
    }
    uint64_t expire_ms = tk_get_be64(v);
    if (klen >= KV_LEASE_PREFIX_LEN &&
        memcmp(k, KV_LEASE_PREFIX, KV_LEASE_PREFIX_LEN) == 0 &&
        (expire_ms == 0 || expire_ms > w->now_ms))
        return check_lease(w, key, key_len, v + hdr, vlen - hdr);
    return 0;
}

/* A session record (cold.c's each_session, sessions.c's kv__sess_load, and
 * kv_result_decode when a retry is answered from it). */
static int check_session(struct snap_walk *w, const uint8_t *k, size_t klen,
                         const uint8_t *v, size_t vlen)
{
    struct kv_result r;
    if (klen != 24 || tk_get_be64(k + 8) == 0 || vlen > KV_RESULT_ENCODED_MAX ||
        kv_result_decode(v, vlen, &r) != 0)
        return walk_fail(w, "record %llu: a malformed session",
                         (unsigned long long)w->count);
    return 0;
}

/* Folds n bytes at p, the records just walked, into the walk's CRC. */
static void walk_crc(struct snap_walk *w, const uint8_t *p, size_t n)
{
    w->crc = tk_crc32c(w->crc, p, n);
}

/* One record at p (REC_HDR + klen + vlen bytes, all there): 0 or
 * TK_ECORRUPT. Its bytes are the caller's to fold (walk_crc) before the
 * trailer is checked. */
static int walk_record(struct snap_walk *w, const uint8_t *p, size_t klen, size_t vlen)
{
    uint8_t table = p[0];
    const uint8_t *k = p + REC_HDR, *v = k + klen;
    if (table < 1 || table > 3)
        return walk_fail(w, "record %llu: unknown table %u", (unsigned long long)w->count,
                         (unsigned)table);
    if (klen == 0 || klen > KEY_MAX)
        return walk_fail(w, "record %llu: a key of %zu bytes",
                         (unsigned long long)w->count, klen);
    if (table < w->table ||
        (table == w->table && key_cmp(w->prev, w->prev_len, k, klen) >= 0))
        return walk_fail(w, "record %llu: out of order", (unsigned long long)w->count);
    int rc = 0;
    if (table == 1)
        rc = check_data(w, k, klen, v, vlen);
    else if (table == 2 && klen <= 8)
        rc = walk_fail(w, "record %llu: an expiry key of %zu bytes",
                       (unsigned long long)w->count, klen);
    else if (table == 3)
        rc = check_session(w, k, klen, v, vlen);
    if (rc != 0)
        return rc;
    w->table = table;
    memcpy(w->prev, k, klen);
    w->prev_len = klen;
    w->count++;
    return 0;
}

/* The trailer (TRAILER bytes at p, p[0] == 0xFF; every record before it
 * folded into w->crc): 0 or TK_ECORRUPT. */
static int walk_trailer(struct snap_walk *w, const uint8_t *p)
{
    if (tk_get_be64(p + 1) != w->count)
        return walk_fail(w, "the trailer counts %llu records, the stream holds %llu",
                         (unsigned long long)tk_get_be64(p + 1),
                         (unsigned long long)w->count);
    if (tk_get_be32(p + 9) != tk_crc32c(w->crc, p, 9))
        return walk_fail(w, "checksum mismatch");
    return 0;
}

/* The longest record an install takes (its pending buffer's bound). */
static size_t record_max(const struct kv_sm *sm)
{
    return REC_HDR + 8 + 65535 + 32 + sm->cfg.value_max + 64 * 1024;
}

/* kv_snap_check folds the records into the CRC this many bytes at a time:
 * few calls, and the bytes are still in the cache from the walk. */
#define CRC_SPAN ((size_t)64 << 10)

int kv_snap_check(const struct kv_sm *sm, const void *buf, size_t len, uint64_t *index,
                  uint64_t *term, char *why, size_t why_cap)
{
    struct snap_walk w;
    walk_init(&w);
    struct kv_cold_meta meta = {0};
    const uint8_t *p = buf;
    size_t off = HDR_BYTES, max = record_max(sm);
    size_t crc_off = HDR_BYTES; /* the bytes before it are in w.crc */
    int rc = 0;
    if (buf == NULL || len < HDR_BYTES + TRAILER)
        rc = walk_fail(&w, "%zu bytes: shorter than a header and a trailer", len);
    if (rc == 0)
        rc = walk_header(&w, p, &meta);
    while (rc == 0 && len - off >= 1 && p[off] != 0xFF) {
        if (len - off < REC_HDR) {
            rc = walk_fail(&w, "truncated in record %llu", (unsigned long long)w.count);
            break;
        }
        size_t klen = tk_get_be32(p + off + 1), vlen = tk_get_be32(p + off + 5);
        if (REC_HDR + klen + vlen > max) /* no 64-bit overflow: each is a u32 */
            rc = walk_fail(&w, "record %llu claims %zu bytes",
                           (unsigned long long)w.count, REC_HDR + klen + vlen);
        else if (REC_HDR + klen + vlen > len - off)
            rc = walk_fail(&w, "record %llu runs past the stream's end",
                           (unsigned long long)w.count);
        else
            rc = walk_record(&w, p + off, klen, vlen);
        off += REC_HDR + klen + vlen;
        if (rc == 0 && off - crc_off >= CRC_SPAN) {
            walk_crc(&w, p + crc_off, off - crc_off);
            crc_off = off;
        }
    }
    if (rc == 0)
        walk_crc(&w, p + crc_off, off - crc_off);
    if (rc == 0 && len - off < TRAILER)
        rc = walk_fail(&w, "truncated: no trailer");
    if (rc == 0)
        rc = walk_trailer(&w, p + off);
    if (rc == 0 && len - off != TRAILER)
        rc = walk_fail(&w, "%zu bytes after the trailer", len - off - TRAILER);
    if (why != NULL && why_cap > 0)
        snprintf(why, why_cap, "%s", rc == 0 ? "" : w.why);
    if (rc == 0) {
        *index = meta.index;
        *term = meta.term;
    }
    return rc;
}

static void stage_reserve(struct kv_snap *s, size_t n)
{
    if (n > s->stage_cap) {
        s->stage = tk_realloc(s->stage, n);
        s->stage_cap = n;
    }
}

int kv__snap_open(struct kv_sm *sm, struct kv_snap **out)
{
    struct kv_snap *s = tk_calloc(1, sizeof(*s));
    int rc = kv__cold_snap_open(sm->cold, &s->cs, &s->meta);
    if (rc != 0) {
        tk_free(s);
        return TK_EIO;
    }
    s->sm = sm;
    s->size_hint = (size_t)kv__cold_bytes(sm->cold);
    atomic_fetch_add(&sm->open_snaps, 1);
    *out = s;
    return 0;
}

int kv_sm_snapshot_cold(struct kv_sm *sm, struct kv_snap **out)
{
    return kv__snap_open(sm, out);
}

/* Room for `need` bytes in the stream's blob *b of *cap: a mapped one grows
 * in place or by mremap, a malloc'd one (a mapping was refused) by realloc. */
static int stream_room(struct tk_blob **b, size_t *cap, size_t need, bool mapped)
{
    if (need <= *cap)
        return 0;
    size_t want = *cap * 2 > need ? *cap * 2 : need;
    if (mapped) {
        struct tk_blob *g = tk_blob_map_grow(*b, want);
        if (g == NULL)
            return TK_ENOMEM;
        *b = g;
        *cap = tk_blob_map_cap(g);
    } else {
        *b = tk_realloc(*b, sizeof(**b) + want);
        *cap = want;
    }
    return 0;
}

/* kv_snap_read_all reads this much at a time between its checks of `stop`
 * and calls to tk_pace_cpu (a whole mapping's room in one read ran a 1.2 GB
 * read to its end however early `stop` was set). */
#define READ_STEP ((size_t)64 << 10)

int kv_snap_read_all(struct kv_snap *s, struct tk_blob **out, const atomic_bool *stop,
                     struct tk_cpu_pace *pace)
{
    /* Read straight into a blob (header, then bytes; see base/blob.h), so
     * the owner takes it without copying. A mapping of its own, as big as
     * the LMDB file's bytes in use (B-tree pages: more than the stream,
     * which holds only the records): address space, its pages come as the
     * stream fills them. Grown by doubling instead, each step past the
     * allocator's mmap threshold was an mremap under the process's mmap lock,
     * moving up to hundreds of MB of page tables while the loop's page
     * faults and mappings waited; and its last unref keeps the mapping for
     * the next stream (tk_blob_unref: a spare). */
    size_t hint = s->size_hint + ((size_t)1 << 20), n = 0, cap;
    struct tk_blob *b = tk_blob_map(hint);
    bool mapped = b != NULL;
    if (mapped) {
        cap = tk_blob_map_cap(b);
    } else {
        cap = (size_t)1 << 16;
        b = tk_blob_new(cap);
    }
    int rc;
    for (;;) {
        if (cap - n < ((size_t)1 << 15) &&
            (rc = stream_room(&b, &cap, n + ((size_t)1 << 15), mapped)) != 0)
            break;
        if (stop != NULL && atomic_load_explicit(stop, memory_order_relaxed)) {
            rc = TK_ECLOSED;
            break;
        }
        size_t got = 0, step = cap - n < READ_STEP ? cap - n : READ_STEP;
        rc = kv_snap_read(s, b->data + n, step, &got);
        if (rc != 0 || got == 0)
            break;
        n += got;
        tk_pace_cpu(pace);
    }
    if (rc != 0) {
        tk_blob_unref(b);
        return rc;
    }
    b->len = n;
    *out = b;
    return 0;
}

int kv__snap_read_all(struct kv_sm *sm, struct tk_blob **out, struct kv_cold_meta *meta,
                      struct tk_cpu_pace *pace)
{
    struct kv_snap *s;
    int rc = kv__snap_open(sm, &s);
    if (rc != 0)
        return rc;
    rc = kv_snap_read_all(s, out, NULL, pace);
    *meta = s->meta;
    kv_snap_close(s);
    return rc;
}

uint64_t kv_snap_index(const struct kv_snap *s)
{
    return s->meta.index;
}

uint64_t kv_snap_term(const struct kv_snap *s)
{
    return s->meta.term;
}

/* Stages the next piece of the stream. */
static int fill(struct kv_snap *s)
{
    s->stage_off = 0;
    if (s->state == 0) {
        stage_reserve(s, HDR_BYTES);
        memcpy(s->stage, SNAP_MAGIC, 8);
        tk_put_be64(s->stage + 8, s->meta.index);
        tk_put_be64(s->stage + 16, s->meta.term);
        tk_put_be64(s->stage + 24, s->meta.now_ms);
        s->stage_len = HDR_BYTES;
        s->state = 1;
    } else {
        uint8_t table;
        const uint8_t *k, *v;
        size_t klen, vlen;
        bool end;
        int rc = kv__cold_snap_next(s->cs, &table, &k, &klen, &v, &vlen, &end);
        if (rc != 0) {
            s->state = 3;
            return TK_EIO;
        }
        if (end) {
            stage_reserve(s, TRAILER);
            s->stage[0] = 0xFF;
            tk_put_be64(s->stage + 1, s->count);
            s->crc = tk_crc32c(s->crc, s->stage, 9);
            tk_put_be32(s->stage + 9, s->crc);
            s->stage_len = TRAILER;
            s->state = 2;
            return 0;
        }
        stage_reserve(s, REC_HDR + klen + vlen);
        s->stage[0] = table;
        tk_put_be32(s->stage + 1, (uint32_t)klen);
        tk_put_be32(s->stage + 5, (uint32_t)vlen);
        memcpy(s->stage + REC_HDR, k, klen);
        if (vlen > 0)
            memcpy(s->stage + REC_HDR + klen, v, vlen);
        s->stage_len = REC_HDR + klen + vlen;
        s->count++;
    }
    s->crc = tk_crc32c(s->crc, s->stage, s->stage_len);
    return 0;
}

int kv_snap_read(struct kv_snap *s, void *buf, size_t cap, size_t *len)
{
    size_t got = 0;
    uint8_t *out = buf;
    while (got < cap) {
        if (s->stage_off == s->stage_len) {
            if (s->state == 2)
                break;
            if (s->state == 3)
                return TK_EIO;
            int rc = fill(s);
            if (rc != 0)
                return rc;
        }
        size_t n = s->stage_len - s->stage_off;
        if (n > cap - got)
            n = cap - got;
        memcpy(out + got, s->stage + s->stage_off, n);
        s->stage_off += n;
        got += n;
    }
    *len = got;
    return 0;
}

void kv_snap_close(struct kv_snap *s)
{
    if (s == NULL)
        return;
    kv__cold_snap_close(s->cs);
    atomic_fetch_sub(&s->sm->open_snaps, 1);
    tk_free(s->stage);
    tk_free(s);
}

/* ---- install ---- */

int kv_sm_install_begin(struct kv_sm *sm, struct kv_install **out)
{
    if (sm->failed)
        return TK_EIO;
    if (atomic_load(&sm->open_snaps) > 0 || sm->job != NULL)
        return TK_EBUSY; /* the swap would close the environment under them */
    struct kv_install *in = tk_calloc(1, sizeof(*in));
    in->sm = sm;
    in->pend_max = record_max(sm);
    walk_init(&in->walk);
    *out = in; /* the new environment comes with the first write */
    return 0;
}

/* Parses what is complete in pend, each record walked (struct snap_walk)
 * before it is written. Returns bytes consumed or a negative code. */
static long parse(struct kv_install *in)
{
    size_t off = 0, crc_off = 0; /* the records before crc_off are in the CRC */
    while (in->state < 2) {
        const uint8_t *p = in->pend + off;
        size_t avail = in->pend_len - off;
        if (in->state == 0) {
            if (avail < HDR_BYTES)
                break;
            if (walk_header(&in->walk, p, &in->meta) != 0)
                return TK_ECORRUPT;
            off += HDR_BYTES;
            crc_off = off; /* walk_header folded it */
            in->state = 1;
            continue;
        }
        if (avail < 1)
            break;
        if (p[0] == 0xFF) {
            if (avail < TRAILER)
                break;
            walk_crc(&in->walk, in->pend + crc_off, off - crc_off);
            crc_off = off;
            if (walk_trailer(&in->walk, p) != 0)
                return TK_ECORRUPT;
            off += TRAILER;
            crc_off = off;
            in->state = 2;
            break;
        }
        if (avail < REC_HDR)
            break;
        size_t klen = tk_get_be32(p + 1), vlen = tk_get_be32(p + 5);
        if (REC_HDR + klen + vlen > in->pend_max)
            return TK_ECORRUPT;
        if (avail < REC_HDR + klen + vlen)
            break;
        if (walk_record(&in->walk, p, klen, vlen) != 0)
            return TK_ECORRUPT;
        int rc =
            kv__cold_new_put(in->n, p[0], p + REC_HDR, klen, p + REC_HDR + klen, vlen);
        if (rc != 0)
            return rc == TK_ECORRUPT ? TK_ECORRUPT : TK_EIO;
        off += REC_HDR + klen + vlen;
    }
    walk_crc(&in->walk, in->pend + crc_off, off - crc_off); /* before they move */
    return (long)off;
}

int kv_install_write(struct kv_install *in, const void *buf, size_t len)
{
    if (in->state == 3 || in->state == 4)
        return TK_EINVAL;
    /* The new environment is made here, on the writer's thread, not in
     * install_begin on the owner's: removing a leftover one, the mkdir and
     * LMDB's open took 12 ms of a follower's loop on a busy disk. */
    if (in->n == NULL && kv__cold_new_begin(in->sm->cold, &in->n) != 0) {
        in->state = 3;
        return TK_EIO;
    }
    const uint8_t *src = buf;
    while (len > 0) {
        if (in->state == 2) { /* bytes after the trailer */
            in->state = 3;
            return TK_ECORRUPT;
        }
        size_t room = in->pend_max - in->pend_len;
        size_t n = len < room ? len : room;
        if (in->pend_len + n > in->pend_cap) {
            size_t cap = in->pend_cap ? in->pend_cap : 64 * 1024;
            while (cap < in->pend_len + n)
                cap *= 2;
            in->pend = tk_realloc(in->pend, cap);
            in->pend_cap = cap;
        }
        memcpy(in->pend + in->pend_len, src, n);
        in->pend_len += n;
        src += n;
        len -= n;
        long used = parse(in);
        if (used < 0) {
            in->state = 3;
            return (int)used;
        }
        memmove(in->pend, in->pend + used, in->pend_len - (size_t)used);
        in->pend_len -= (size_t)used;
        if (n == room && used == 0) { /* a record larger than any valid one */
            in->state = 3;
            return TK_ECORRUPT;
        }
    }
    if (in->state == 2 && in->pend_len > 0) {
        in->state = 3;
        return TK_ECORRUPT;
    }
    return 0;
}

static int load_session(uint64_t index, uint64_t client, uint64_t seq, const uint8_t *res,
                        size_t len, void *data)
{
    struct kv_install *in = data;
    return kv__sess_load(index, client, seq, res, len, &in->sessions);
}

static int load_expiring(uint64_t expire_ms, const uint8_t *key, size_t len, void *data)
{
    struct kv_install *in = data;
    return kv__ttl_load_one(expire_ms, key, len, &in->ttl);
}

static int load_lease(const uint8_t *key, size_t len, const struct kv_cold_val *v,
                      void *data)
{
    struct kv_install *in = data;
    return kv__lease_load_rec(&in->leases, key, len, v->value, v->value_len);
}

static void tables_free(struct kv_sessions *s, struct kv_ttl *t, struct kv_leases *l)
{
    kv__sess_destroy(s);
    kv__ttl_free(t);
    kv__lease_free(l);
}

int kv_install_prepare(struct kv_install *in)
{
    if (in->state == 4)
        return 0;
    if (in->state != 2) {
        in->state = 3;
        return TK_ECORRUPT;
    }
    /* The tables the swap takes: built here, from the committed
     * environment, so that the owner's commit only swaps pointers. The
     * config is read only (fixed at open). */
    const struct kv_config *cfg = &in->sm->cfg;
    kv__sess_init(&in->sessions, cfg->sessions_max);
    kv__ttl_init(&in->ttl, cfg->ttl_max);
    kv__lease_init(&in->leases);
    in->loaded = true;
    struct kv_cold_load load = {.session = load_session,
                                .expiring = load_expiring,
                                .prefix = (const uint8_t *)KV_LEASE_PREFIX,
                                .prefix_len = KV_LEASE_PREFIX_LEN,
                                .item = load_lease,
                                .data = in};
    int rc = kv__cold_new_prepare(in->n, &in->meta, &load);
    if (rc != 0) {
        in->state = 3;
        return rc == TK_ECORRUPT ? TK_ECORRUPT : TK_EIO;
    }
    struct kv_cold_new *n = in->n;
    in->n = NULL; /* the publish frees it, and on a failure keeps or removes the files */
    if (kv__cold_new_publish(n) != 0) {
        in->state = 3;
        return TK_EIO;
    }
    in->state = 4;
    return 0;
}

/* The hot structures go to sm->trash whole (moved, not freed: freeing them
 * is the owner's, off its loop) and fresh empty ones take their place. */
static void hot_to_trash(struct kv_sm *sm)
{
    kv_trash_free(sm->trash); /* one never taken */
    struct kv_trash *t = tk_calloc(1, sizeof(*t));
    t->view = sm->view;
    t->index = sm->index;
    t->ring = sm->ring;
    sm->trash = t;
    kv__ring_init(&sm->ring, sm->cfg.page_bytes);
    sm->ring.keep_free_bytes = sm->cfg.ring_bytes;
    kv__index_init(&sm->index, &sm->ring);
    kv__view_init(&sm->view);
}

int kv_install_commit(struct kv_install *in)
{
    if (in->state != 2 && in->state != 4) {
        in->state = 3;
        return TK_ECORRUPT;
    }
    struct kv_sm *sm = in->sm;
    int rc;
    if (in->state == 4) {
        rc = kv__cold_switch(sm->cold);
    } else {
        struct kv_cold_new *n = in->n;
        in->n = NULL;
        rc = kv__cold_new_commit(n, &in->meta);
    }
    if (rc != 0) {
        in->state = 3;
        sm->failed = true; /* the old tier may be closed: stop */
        return TK_EIO;
    }
    /* Drop every hot structure and take the snapshot's state. */
    hot_to_trash(sm);
    sm->dirty_pos = 0;
    sm->n_inplace = 0;
    /* A drain pending (kv_sm_tier_drain) was of the pages just freed. */
    sm->draining = false;
    sm->n_tier_rel = sm->drain_at = sm->drain_pages = 0;
    sm->drain_end = 0;
    sm->applied = sm->durable = in->meta.index;
    sm->applied_term = sm->durable_term = in->meta.term;
    sm->now_ms = sm->durable_now = in->meta.now_ms;
    /* The events before the snapshot are not this state's history. */
    kv__events_reset(&sm->events, in->meta.index + 1);
    if (in->loaded) {
        /* Prepared: the tables are built, the old ones go with the hot
         * structures (a swap, nothing loaded or freed here). */
        struct kv_trash *t = sm->trash;
        t->tables = true;
        t->sessions = sm->sessions;
        t->ttl = sm->ttl;
        t->leases = sm->leases;
        sm->sessions = in->sessions;
        in->ttl.dropped += sm->ttl.dropped;
        sm->ttl = in->ttl;
        sm->leases = in->leases;
        in->loaded = false;
    } else {
        kv__sess_clear(&sm->sessions);
        rc = kv__tables_load(sm);
        if (rc != 0) {
            in->state = 3; /* the caller's abort frees it (kv.h) */
            sm->failed = true;
            return TK_EIO;
        }
    }
    tk_free(in->pend);
    tk_free(in);
    return 0;
}

struct kv_trash *kv_sm_install_trash(struct kv_sm *sm)
{
    struct kv_trash *t = sm->trash;
    void *env = NULL;
    char path[PATH_MAX];
    if (!kv__cold_trash(sm->cold, path, sizeof(path), &env)) {
        sm->trash = NULL;
        return t;
    }
    if (t == NULL)
        t = tk_calloc(1, sizeof(*t));
    sm->trash = NULL;
    t->env = env;
    snprintf(t->path, sizeof(t->path), "%s", path);
    return t;
}

const char *kv_trash_path(const struct kv_trash *t)
{
    return t->path;
}

void kv_trash_free(struct kv_trash *t)
{
    if (t == NULL)
        return;
    kv__trash_env_close(t->env);
    if (t->path[0] != '\0')
        kv_remove_env(t->path);
    kv__view_free(&t->view);
    kv__index_free(&t->index);
    kv__ring_free(&t->ring);
    if (t->tables)
        tables_free(&t->sessions, &t->ttl, &t->leases);
    tk_free(t);
}

void kv_install_abort(struct kv_install *in)
{
    if (in == NULL)
        return;
    /* Published but not switched to: the directory names the new state, so
     * the old one must not be written further (owner thread then). */
    if (in->state == 4)
        in->sm->failed = true;
    kv__cold_new_abort(in->n);
    if (in->loaded)
        tables_free(&in->sessions, &in->ttl, &in->leases);
    tk_free(in->pend);
    tk_free(in);
}
