/* kv-bench: the ring-log KV state machine against LMDB used directly, in one
 * process and one run (the TierKv-vs-FASTER table of the source report).
 *
 * For 1k, 100k and 10M prefilled 8-byte keys with 8-byte values (10M goes past
 * the 64 MiB ring into the cold tier; --quick skips it), random access:
 * get hit, get miss, put overwrite, put new key, delete, scans of 10/100/1000
 * keys, multi-gets of 16 random keys (reported per key; LMDB does as many
 * plain gets), and overwrites applied as the node applies a batch of committed
 * entries, with kv_sm_prefetch hints a few entries ahead ("put batched"; LMDB
 * does plain puts). tierkv's writes go through kv_sm_apply with pre-encoded commands (the
 * protobuf decode is part of the cost; encoding is the client's). The LMDB
 * column does the same operations on its own environment: gets in one read
 * transaction per timed batch, writes in one write transaction per 1,000 ops
 * (LMDB's best case; neither side fsyncs per op - raft's log is the WAL).
 * Batches are timed in thread CPU time (the VM is shared), the cold-get
 * latency per op in wall time (its p50 ignores preempted outliers).
 * Each figure is the median of several runs; bytes allocated per op come from
 * base/alloc.h (tierkv's own allocations; LMDB's are not counted). Overwrites
 * are measured in steady state: first the ring fills its budget and is tiered
 * down once, or stops growing because the overwrites land in place.
 * Prints a table, then one JSON line. --only '<op name>' (as the table names
 * it) times that op alone, after the same setup, for a profiler.
 * --append-only opens the sm with kv_config.append_only (every write appends
 * a record; by default an overwrite of a hot key with a value of the same
 * length rewrites its record in place). --plot FILE.svg draws ns/op against
 * the key count, tierkv beside LMDB, reads and writes in two panels
 * (bench_plot.h). */
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/hist.h"
#include "base/prng.h"
#include "cmd/benchplot/bench_args.h"
#include "cmd/benchplot/bench_plot.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

enum {
    OP_GET_HIT,
    OP_GET_MISS,
    OP_PUT_OVER,
    OP_PUT_NEW,
    OP_DEL,
    OP_SCAN10,
    OP_SCAN100,
    OP_SCAN1000,
    OP_MGET16,
    OP_PUT_BATCH,
    N_OPS
};
static const char *op_names[N_OPS] = {
    "get hit", "get miss", "put overwrite", "put new key",  "delete",
    "scan 10", "scan 100", "scan 1000",     "multi-get 16", "put batched"};
#define MGET_KEYS 16 /* multi-get: keys per call; reported per key */

struct row {
    double kv_ns, lmdb_ns, kv_alloc;
};

static bool quick;
static bool append_only; /* kv_config.append_only: every write appends */
static int only = -1;    /* --only: time this op alone (for profiling) */
static int runs = 5;
static struct tk_prng rng;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Key i as 8 big-endian bytes, written as one word: built a byte at a time,
 * the key would be read back by the hash before its stores retire (a failed
 * store-to-load forward, 10-25 ns per op on this VM), which a key parsed
 * from a request long before never pays. */
static void key_of(uint64_t i, uint8_t k[8])
{
    uint64_t be = __builtin_bswap64(i);
    memcpy(k, &be, 8);
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "kv-bench: %s: %d (%s)\n", what, rc, rc < 0 ? tk_strerror(rc) : "");
    exit(1);
}

/* ---- tierkv side ---- */

struct kvside {
    struct kv_sm *sm;
    uint64_t index;
    struct kv_result res;
};

/* Pre-encoded commands: n of them, fixed-size slots. */
struct cmdpool {
    uint8_t *buf;
    size_t *len;
    size_t n;
};

#define SLOT 48

static void pool_fill(struct cmdpool *p, size_t n, int kind, const uint64_t *ids)
{
    p->buf = tk_malloc(n * SLOT);
    p->len = tk_malloc(n * sizeof(*p->len));
    p->n = n;
    for (size_t i = 0; i < n; i++) {
        uint8_t k[8], v[8];
        uint64_t id = ids[i];
        key_of(id, k);
        memcpy(v, &id, 8);
        Kvpb__Command c = KVPB__COMMAND__INIT;
        Kvpb__Put put = KVPB__PUT__INIT;
        Kvpb__Delete del = KVPB__DELETE__INIT;
        if (kind == 0) {
            put.key.data = k;
            put.key.len = 8;
            put.value.data = v;
            put.value.len = 8;
            c.cmd_case = KVPB__COMMAND__CMD_PUT;
            c.put = &put;
        } else {
            del.key.data = k;
            del.key.len = 8;
            c.cmd_case = KVPB__COMMAND__CMD_DEL;
            c.del = &del;
        }
        p->len[i] = kvpb__command__pack(&c, p->buf + i * SLOT);
    }
}

static void pool_free(struct cmdpool *p)
{
    tk_free(p->buf);
    tk_free(p->len);
}

static void kv_apply(struct kvside *s, const struct cmdpool *p, size_t i)
{
    int rc =
        kv_sm_apply(s->sm, ++s->index, 1, 1000, p->buf + i * SLOT, p->len[i], &s->res);
    if (rc != 0 || s->res.code != 0)
        die("apply", rc != 0 ? rc : s->res.code);
}

static volatile uint64_t sink;

static int scan_cb(const struct kv_item *it, void *data)
{
    (void)data;
    sink += it->value_len;
    return 0;
}

static int mget_cb(int found, const struct kv_item *it, void *data)
{
    (void)data;
    sink += found == 0 ? it->value_len : 1;
    return 0;
}

/* The keys of `n` ops of kind op: random present keys, random absent ones
 * (get miss), or new ones from next_new on (put new key). */
static void draw_ids(int op, uint64_t n_keys, uint64_t next_new, uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = op == OP_GET_MISS  ? n_keys * 4 + tk_prng_below(&rng, n_keys)
                 : op == OP_PUT_NEW ? next_new + i
                                    : tk_prng_below(&rng, n_keys);
}

/* One timed batch's inputs, made before the clock starts: the keys, a
 * write's pre-encoded commands, a multi-get's key list. */
struct kv_batch {
    size_t ops, n_ids; /* n_ids: ops, or ops x MGET_KEYS for a multi-get */
    uint64_t *ids;
    struct cmdpool pool;
    uint8_t (*mkeys)[8];
    struct kv_item *mitems;
};

static void kv_batch_make(struct kv_batch *b, int op, uint64_t n_keys, uint64_t next_new,
                          size_t ops)
{
    memset(b, 0, sizeof(*b));
    b->ops = ops;
    b->n_ids = op == OP_MGET16 ? ops * MGET_KEYS : ops;
    b->ids = tk_malloc(b->n_ids * sizeof(*b->ids));
    draw_ids(op, n_keys, next_new, b->ids, b->n_ids);
    if (op == OP_PUT_OVER || op == OP_PUT_NEW || op == OP_PUT_BATCH)
        pool_fill(&b->pool, ops, 0, b->ids);
    else if (op == OP_DEL)
        pool_fill(&b->pool, ops, 1, b->ids);
    if (op == OP_MGET16) { /* the keys are the client's: encoded beforehand */
        b->mkeys = tk_malloc(b->n_ids * sizeof(*b->mkeys));
        b->mitems = tk_calloc(b->n_ids, sizeof(*b->mitems));
        for (size_t i = 0; i < b->n_ids; i++) {
            key_of(b->ids[i], b->mkeys[i]);
            b->mitems[i].key = b->mkeys[i];
            b->mitems[i].key_len = 8;
        }
    }
}

static void kv_batch_free(struct kv_batch *b)
{
    pool_free(&b->pool);
    tk_free(b->ids);
    tk_free(b->mkeys);
    tk_free(b->mitems);
}

/* Overwrites applied as the node applies a batch of committed entries:
 * hinting the bucket 8 ahead and the record 4 ahead. */
static void kv_put_batched(struct kvside *s, const struct cmdpool *pool, size_t ops)
{
    uint64_t h[8];
    bool have[8] = {false};
    for (size_t i = 0; i < ops && i < 8; i++)
        have[i] = kv_sm_prefetch(s->sm, pool->buf + i * SLOT, pool->len[i], &h[i]);
    for (size_t i = 0; i < ops && i < 4; i++)
        if (have[i])
            kv_sm_prefetch_record(s->sm, h[i]);
    for (size_t i = 0; i < ops; i++) {
        if (i + 4 < ops && have[(i + 4) % 8])
            kv_sm_prefetch_record(s->sm, h[(i + 4) % 8]);
        if (i + 8 < ops)
            have[i % 8] = kv_sm_prefetch(s->sm, pool->buf + (i + 8) * SLOT,
                                         pool->len[i + 8], &h[i % 8]);
        kv_apply(s, pool, i);
    }
}

static void kv_scan(struct kvside *s, int op, const uint64_t *ids, size_t ops)
{
    size_t limit = op == OP_SCAN10 ? 10 : op == OP_SCAN100 ? 100 : 1000;
    for (size_t i = 0; i < ops; i++) {
        uint8_t k[8];
        key_of(ids[i], k);
        struct kv_range r = {.start = k, .start_len = 8};
        kv_sm_scan(s->sm, &r, limit, scan_cb, NULL);
    }
}

/* The timed part of kv_run(): b's ops of kind op. */
static void kv_ops(struct kvside *s, int op, const struct kv_batch *b)
{
    switch (op) {
    case OP_GET_HIT:
    case OP_GET_MISS:
        for (size_t i = 0; i < b->ops; i++) {
            uint8_t k[8];
            key_of(b->ids[i], k);
            struct kv_item it;
            int rc = kv_sm_get(s->sm, k, 8, &it);
            sink += rc == 0 ? it.value_len : 1;
        }
        break;
    case OP_PUT_OVER:
    case OP_PUT_NEW:
    case OP_DEL:
        for (size_t i = 0; i < b->ops; i++)
            kv_apply(s, &b->pool, i);
        break;
    case OP_MGET16:
        for (size_t i = 0; i < b->ops; i++)
            kv_sm_multi_get(s->sm, b->mitems + i * MGET_KEYS, MGET_KEYS, mget_cb, NULL);
        break;
    case OP_PUT_BATCH:
        kv_put_batched(s, &b->pool, b->ops);
        break;
    default:
        kv_scan(s, op, b->ids, b->ops);
    }
}

/* Runs `ops` operations of kind op on the sm; returns ns/op, sets *alloc. */
static double kv_run(struct kvside *s, int op, uint64_t n_keys, uint64_t *next_new,
                     size_t ops, double *alloc)
{
    struct kv_batch b;
    kv_batch_make(&b, op, n_keys, *next_new, ops);
    struct tk_alloc_stats a0, a1;
    tk_alloc_stats(&a0);
    /* This thread's CPU time: other processes share this VM, and wall time
     * would charge their time slices to us. */
    uint64_t t0 = tk_thread_cpu_ns();
    kv_ops(s, op, &b);
    uint64_t t1 = tk_thread_cpu_ns();
    tk_alloc_stats(&a1);
    *alloc = (double)(a1.bytes - a0.bytes) / (double)ops;
    if (op == OP_PUT_NEW)
        *next_new += ops;
    if (op == OP_DEL) { /* put the deleted keys back, untimed */
        pool_free(&b.pool);
        pool_fill(&b.pool, ops, 0, b.ids);
        for (size_t i = 0; i < b.pool.n; i++)
            kv_apply(s, &b.pool, i);
    }
    kv_batch_free(&b);
    if (op == OP_MGET16)
        *alloc /= MGET_KEYS;
    return (double)(t1 - t0) / (double)b.n_ids;
}

/* ---- LMDB side ---- */

struct lside {
    MDB_env *env;
    MDB_dbi dbi;
};

static void l_check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "kv-bench: lmdb %s: %s\n", what, mdb_strerror(rc));
        exit(1);
    }
}

static void l_open(struct lside *l, const char *dir, uint64_t n_keys)
{
    mkdir(dir, 0755);
    l_check(mdb_env_create(&l->env), "create");
    l_check(mdb_env_set_mapsize(l->env, (size_t)16 << 30), "mapsize");
    l_check(mdb_env_open(l->env, dir, MDB_NOSYNC | MDB_NOTLS, 0644), "open");
    MDB_txn *txn;
    l_check(mdb_txn_begin(l->env, NULL, 0, &txn), "txn");
    l_check(mdb_dbi_open(txn, NULL, 0, &l->dbi), "dbi");
    for (uint64_t i = 0; i < n_keys; i++) {
        uint8_t k[8];
        key_of(i, k);
        MDB_val kv = {8, k}, vv = {8, &i};
        l_check(mdb_put(txn, l->dbi, &kv, &vv, MDB_APPEND), "put");
        if (i % 1000000 == 999999) {
            l_check(mdb_txn_commit(txn), "commit");
            l_check(mdb_txn_begin(l->env, NULL, 0, &txn), "txn");
        }
    }
    l_check(mdb_txn_commit(txn), "commit");
}

static double l_run(struct lside *l, int op, uint64_t n_keys, uint64_t *next_new,
                    size_t ops)
{
    if (op == OP_MGET16) /* LMDB has no batch get: as many plain gets */
        ops *= MGET_KEYS;
    uint64_t *ids = tk_malloc(ops * sizeof(*ids));
    draw_ids(op, n_keys, *next_new, ids, ops);
    MDB_txn *txn;
    uint64_t t0 = tk_thread_cpu_ns();
    if (op == OP_PUT_OVER || op == OP_PUT_NEW || op == OP_DEL || op == OP_PUT_BATCH) {
        l_check(mdb_txn_begin(l->env, NULL, 0, &txn), "txn");
        for (size_t i = 0; i < ops; i++) {
            uint8_t k[8];
            key_of(ids[i], k);
            MDB_val kv = {8, k}, vv = {8, &ids[i]};
            int rc = op == OP_DEL ? mdb_del(txn, l->dbi, &kv, NULL)
                                  : mdb_put(txn, l->dbi, &kv, &vv, 0);
            if (rc != MDB_NOTFOUND)
                l_check(rc, "write");
            if (i % 1000 == 999) {
                l_check(mdb_txn_commit(txn), "commit");
                l_check(mdb_txn_begin(l->env, NULL, 0, &txn), "txn");
            }
        }
        l_check(mdb_txn_commit(txn), "commit");
    } else {
        l_check(mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn), "rtxn");
        MDB_cursor *cur;
        l_check(mdb_cursor_open(txn, l->dbi, &cur), "cursor");
        size_t limit = op == OP_SCAN10 ? 10 : op == OP_SCAN100 ? 100 : 1000;
        for (size_t i = 0; i < ops; i++) {
            uint8_t k[8];
            key_of(ids[i], k);
            MDB_val kv = {8, k}, vv;
            if (op == OP_GET_HIT || op == OP_GET_MISS || op == OP_MGET16) {
                int rc = mdb_get(txn, l->dbi, &kv, &vv);
                sink += rc == 0 ? vv.mv_size : 1;
            } else {
                int rc = mdb_cursor_get(cur, &kv, &vv, MDB_SET_RANGE);
                for (size_t j = 0; rc == 0 && j < limit; j++) {
                    sink += vv.mv_size;
                    rc = mdb_cursor_get(cur, &kv, &vv, MDB_NEXT);
                }
            }
        }
        mdb_cursor_close(cur);
        mdb_txn_abort(txn);
    }
    uint64_t t1 = tk_thread_cpu_ns();
    if (op == OP_PUT_NEW)
        *next_new += ops;
    if (op == OP_DEL) { /* restore */
        l_check(mdb_txn_begin(l->env, NULL, 0, &txn), "txn");
        for (size_t i = 0; i < ops; i++) {
            uint8_t k[8];
            key_of(ids[i], k);
            MDB_val kv = {8, k}, vv = {8, &ids[i]};
            l_check(mdb_put(txn, l->dbi, &kv, &vv, 0), "restore");
        }
        l_check(mdb_txn_commit(txn), "commit");
    }
    tk_free(ids);
    return (double)(t1 - t0) / (double)ops;
}

/* ---- one scale ---- */

static size_t ops_for(int op, uint64_t n_keys)
{
    size_t base = quick ? 40000 : 300000;
    bool write =
        op == OP_PUT_OVER || op == OP_PUT_NEW || op == OP_DEL || op == OP_PUT_BATCH;
    if (op == OP_PUT_NEW || op == OP_DEL)
        base /= 3;
    /* At 10M keys a tier-down writes about 270k random keys and costs about a
     * second: each run of a write op spans at least one, so every run pays
     * its share (shorter runs have one or none, and the median picks). */
    if (n_keys >= 10000000)
        base = write ? 300000 : base / 2;
    if (op == OP_SCAN100)
        base /= 10;
    if (op == OP_SCAN1000)
        base /= 100;
    if (op == OP_MGET16)
        base /= MGET_KEYS;
    if ((op == OP_DEL) && base > n_keys)
        base = n_keys;
    return base;
}

static void rm_dir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "kv-bench: could not remove %s\n", dir);
}

/* ---- the machine's memory floor, measured in the same run ---- */

struct mem_floor {
    size_t bytes;   /* the working set: ring + an estimate of the index */
    double chase;   /* ns per random read that waits for the one before */
    double two_dep; /* ns per op of independent ops that each make two
                       dependent random reads: a get's memory shape (bucket,
                       then record) without its work */
    double ghz;     /* the core's clock (x86-64 only, else 0) */
};

/* Over `bytes` of huge pages (as the ring and index use), median of runs.
 * The VM's caches are shared with other tenants: the same working set costs
 * 20 ns a read at one moment and 150 ns at another, so a get figure means
 * little without this one beside it. */
static void mem_floor(struct mem_floor *f)
{
    const size_t huge = (size_t)2 << 20;
    size_t bytes = (f->bytes + huge - 1) & ~(huge - 1);
    size_t lines = bytes / 64;
    uint8_t *a = aligned_alloc(huge, bytes);
    uint32_t *perm = malloc(lines * sizeof(*perm));
    size_t iters = quick ? 300000 : 1000000;
    uint32_t *pick = malloc(iters * sizeof(*pick));
    if (a == NULL || perm == NULL || pick == NULL)
        die("mem_floor alloc", 0);
    madvise(a, bytes, MADV_HUGEPAGE);
    memset(a, 0, bytes);
    for (size_t i = 0; i < lines; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = lines - 1; i > 0; i--) { /* Sattolo: one cycle through all */
        size_t j = tk_prng_below(&rng, i);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < lines; i++) {
        uint64_t next = (uint64_t)perm[i] * 64;
        memcpy(a + (size_t)i * 64, &next, 8);
    }
    for (size_t i = 0; i < iters; i++)
        pick[i] = (uint32_t)tk_prng_below(&rng, lines);
    double ch[9], td[9];
    for (int r = 0; r < runs; r++) {
        uint64_t at = 0, sum = 0;
        for (size_t i = 0; i < lines && i < iters; i++) /* warm */
            memcpy(&at, a + at, 8);
        uint64_t t0 = tk_thread_cpu_ns();
        for (size_t i = 0; i < iters; i++)
            memcpy(&at, a + at, 8);
        uint64_t t1 = tk_thread_cpu_ns();
        for (size_t i = 0; i < iters; i++) {
            uint64_t to;
            memcpy(&to, a + (size_t)pick[i] * 64, 8);
            sum += a[to + 8];
        }
        uint64_t t2 = tk_thread_cpu_ns();
        sink += at + sum;
        ch[r] = (double)(t1 - t0) / (double)iters;
        td[r] = (double)(t2 - t1) / (double)iters;
    }
    f->chase = median(ch, runs);
    f->two_dep = median(td, runs);
#if defined(__x86_64__)
    /* The core's clock at this moment (the host varies it): one dependent
     * add per cycle. */
    double gh[9];
    for (int r = 0; r < runs; r++) {
        uint64_t x = 0, t0 = tk_thread_cpu_ns();
        for (int i = 0; i < 50000000; i++)
            __asm__ volatile("add $1, %0" : "+r"(x));
        gh[r] = 5e7 / (double)(tk_thread_cpu_ns() - t0);
        sink += x;
    }
    f->ghz = median(gh, runs);
#endif
    free(a);
    free(perm);
    free(pick);
}

/* What one scale found. */
struct scale_figs {
    struct row rows[N_OPS];
    double cold_p50, cold_frac; /* cold gets: p50 ns, share of random gets */
    struct mem_floor floor;
};

/* One scale's two sides, each prefilled with n_keys keys. */
struct scale_run {
    uint64_t n_keys;
    struct kvside kv;
    struct lside lmdb;
    uint64_t kv_new, l_new; /* each side's next new key */
};

/* Opens the sm in kdir and prefills it through apply, in chunks of
 * pre-encoded puts. */
static void kv_open_filled(struct scale_run *sr, char *kdir)
{
    struct kv_config cfg;
    kv_config_default(&cfg);
    cfg.dir = kdir;
    cfg.no_sync = true;
    cfg.map_bytes = (size_t)16 << 30;
    cfg.append_only = append_only;
    int rc = kv_sm_open(&cfg, &sr->kv.sm);
    if (rc != 0)
        die("kv_sm_open", rc);
    for (uint64_t at = 0; at < sr->n_keys;) {
        size_t n = sr->n_keys - at < 1000000 ? (size_t)(sr->n_keys - at) : 1000000;
        uint64_t *ids = tk_malloc(n * sizeof(*ids));
        for (size_t i = 0; i < n; i++)
            ids[i] = at + i;
        struct cmdpool p;
        pool_fill(&p, n, 0, ids);
        for (size_t i = 0; i < n; i++)
            kv_apply(&sr->kv, &p, i);
        pool_free(&p);
        tk_free(ids);
        at += n;
    }
}

/* Steady state for overwrites: overwrite until the ring has been tiered down
 * once (its pages are being recycled) or stops growing (the overwrites land
 * in place). */
static void kv_settle_overwrites(struct scale_run *sr)
{
    struct kv_sm_stats st0, st1;
    kv_sm_stats(sr->kv.sm, &st0);
    st1 = st0;
    size_t grown_from;
    double alloc;
    do {
        grown_from = st1.ring_bytes;
        kv_run(&sr->kv, OP_PUT_OVER, sr->n_keys, &sr->kv_new, 100000, &alloc);
        kv_sm_stats(sr->kv.sm, &st1);
    } while (st1.tier_downs == st0.tier_downs && st1.ring_bytes > grown_from);
}

/* Each side runs its batches back to back, after an untimed warm-up that
 * touches about as many keys as the set holds (up to 200k): interleaved with
 * the other side, every batch would start with caches the other had just
 * filled, and time DRAM refills rather than the op. Medians of the runs
 * absorb the VM's noise. */
static void time_op(struct scale_run *sr, int op, struct row *row)
{
    double kv_ns[9], l_ns[9], al[9], warm;
    size_t ops = ops_for(op, sr->n_keys);
    size_t warm_ops = ops / 4 + 1;
    if (warm_ops < sr->n_keys && op != OP_PUT_NEW && op != OP_DEL && op != OP_MGET16 &&
        op != OP_SCAN100 && op != OP_SCAN1000)
        warm_ops = sr->n_keys < 200000 ? (size_t)sr->n_keys : 200000;
    kv_run(&sr->kv, op, sr->n_keys, &sr->kv_new, warm_ops, &warm);
    for (int r = 0; r < runs; r++)
        kv_ns[r] = kv_run(&sr->kv, op, sr->n_keys, &sr->kv_new, ops, &al[r]);
    l_run(&sr->lmdb, op, sr->n_keys, &sr->l_new, warm_ops);
    for (int r = 0; r < runs; r++)
        l_ns[r] = l_run(&sr->lmdb, op, sr->n_keys, &sr->l_new, ops);
    row->kv_ns = median(kv_ns, runs);
    row->lmdb_ns = median(l_ns, runs);
    row->kv_alloc = median(al, runs);
}

/* One op's row; with --only, the other ops' rows are zero, but overwrites
 * still settle first (the state the others see). */
static void scale_op(struct scale_run *sr, int op, struct row *row)
{
    if (only >= 0 && op != only && op != OP_PUT_OVER) {
        memset(row, 0, sizeof(*row));
        return;
    }
    if (op == OP_PUT_OVER) {
        kv_settle_overwrites(sr);
        if (only >= 0 && only != OP_PUT_OVER) {
            memset(row, 0, sizeof(*row));
            return;
        }
    }
    time_op(sr, op, row);
}

/* Per-op latency (wall time) of gets that the ring does not hold. */
static void cold_gets(struct scale_run *sr, struct scale_figs *f)
{
    struct tk_hist h;
    tk_hist_init(&h);
    size_t cold = 0, total = quick ? 50000 : 200000;
    for (size_t i = 0; i < total; i++) {
        uint8_t k[8];
        key_of(tk_prng_below(&rng, sr->n_keys), k);
        struct kv_item it;
        uint64_t t0 = tk_mono_ns();
        int rc = kv_sm_get(sr->kv.sm, k, 8, &it);
        uint64_t t1 = tk_mono_ns();
        if (rc == 0 && !it.hot) {
            tk_hist_record(&h, t1 - t0);
            cold++;
        }
    }
    /* A p50 of a handful of samples says nothing: report it only when
     * cold reads are a real share of the gets. */
    if (cold >= total / 10) {
        f->cold_p50 = (double)tk_hist_quantile(&h, 0.5);
        f->cold_frac = (double)cold / (double)total;
    }
}

static void run_scale(uint64_t n_keys, struct scale_figs *f)
{
    char dir[] = "/tmp/kv-bench-XXXXXX";
    if (mkdtemp(dir) == NULL)
        die("mkdtemp", 0);
    char kdir[600], ldir[600];
    snprintf(kdir, sizeof(kdir), "%s/kv", dir);
    snprintf(ldir, sizeof(ldir), "%s/lmdb", dir);
    struct scale_run sr = {.n_keys = n_keys};
    kv_open_filled(&sr, kdir);
    l_open(&sr.lmdb, ldir, n_keys);
    struct kv_sm_stats filled;
    kv_sm_stats(sr.kv.sm, &filled);
    f->floor.bytes = filled.ring_bytes + filled.hot_keys * 16; /* index: ~16 B a key */
    mem_floor(&f->floor);
    sr.kv_new = sr.l_new = n_keys * 16;
    /* Put-new runs last: it grows the key set, which would skew the rest. */
    static const int order[N_OPS] = {OP_GET_HIT, OP_GET_MISS, OP_PUT_OVER, OP_PUT_BATCH,
                                     OP_DEL,     OP_SCAN10,   OP_SCAN100,  OP_SCAN1000,
                                     OP_MGET16,  OP_PUT_NEW};
    for (int oi = 0; oi < N_OPS; oi++)
        scale_op(&sr, order[oi], &f->rows[order[oi]]);
    f->cold_p50 = 0;
    f->cold_frac = 0;
    struct kv_sm_stats st;
    kv_sm_stats(sr.kv.sm, &st);
    if (st.cold_keys > 0)
        cold_gets(&sr, f);
    fprintf(stderr,
            "  [%" PRIu64 " keys: ring %zu MiB, hot %zu, cold %" PRIu64
            ", tier-downs %" PRIu64 "]\n",
            n_keys, st.ring_bytes >> 20, st.hot_keys, st.cold_keys, st.tier_downs);
    kv_sm_close(sr.kv.sm);
    mdb_env_close(sr.lmdb.env);
    rm_dir(dir);
}

/* --plot: ns/op against keys, tierkv (solid) beside LMDB, per op. */
static int plot_rows(const char *path, int n_scales, const uint64_t scales[],
                     const struct scale_figs figs[])
{
    static const int panel_of[N_OPS] = {0, 0, 1, 1, 1, -1, 0, -1, 0, 1};
    static struct bench_plot p;
    bench_plot_init(&p, quick ? "kv-bench --quick: 8 B keys and values, random access"
                              : "kv-bench: 8 B keys and values, random access");
    bench_plot_panel(&p, "reads", "keys", "thread-CPU ns per op", true, true);
    bench_plot_panel(&p, "writes", "keys", "thread-CPU ns per op", true, true);
    int colors[2] = {0, 0}; /* per panel: an op's pair shares a colour */
    for (int op = 0; op < N_OPS; op++) {
        if (panel_of[op] < 0)
            continue;
        int color = ++colors[panel_of[op]];
        char name[64];
        snprintf(name, sizeof(name), "tierkv %s", op_names[op]);
        int kv = bench_plot_series(&p, panel_of[op], name);
        snprintf(name, sizeof(name), "LMDB %s", op_names[op]);
        int lm = bench_plot_series(&p, panel_of[op], name);
        bench_plot_series_look(&p, kv, color, false); /* LMDB: same colour, dashed */
        bench_plot_series_look(&p, lm, color, true);
        for (int sc = 0; sc < n_scales; sc++) {
            bench_plot_point(&p, kv, (double)scales[sc], figs[sc].rows[op].kv_ns);
            bench_plot_point(&p, lm, (double)scales[sc], figs[sc].rows[op].lmdb_ns);
        }
    }
    int rc = bench_plot_write(&p, path);
    bench_plot_free(&p);
    if (rc == 0)
        fprintf(stderr, "kv-bench: plot written to %s\n", path);
    return rc;
}

static const char *scale_names[3] = {"1k", "100k", "10m"};

static void print_table(int n_scales, const struct scale_figs figs[])
{
    printf("kv-bench: 8 B keys, 8 B values, random access, thread-CPU ns/op, median of "
           "%d runs%s%s\n",
           runs, quick ? " (quick)" : "",
           append_only ? ", append-only (no in-place rewrites)" : "");
    printf("%-6s %-14s %12s %12s %9s %14s\n", "keys", "op", "tierkv ns", "lmdb ns",
           "lmdb/kv", "kv alloc B/op");
    for (int sc = 0; sc < n_scales; sc++) {
        const char *name = scale_names[sc];
        const struct scale_figs *f = &figs[sc];
        for (int op = 0; op < N_OPS; op++) {
            const struct row *r = &f->rows[op];
            printf("%-6s %-14s %12.1f %12.1f %8.2fx %14.1f\n", name, op_names[op],
                   r->kv_ns, r->lmdb_ns, r->lmdb_ns / r->kv_ns, r->kv_alloc);
        }
        if (f->cold_p50 > 0)
            printf("%-6s %-14s %12.1f %12s %9s   (%.0f%% of random gets were cold)\n",
                   name, "cold get p50", f->cold_p50, "-", "-", f->cold_frac * 100);
        printf("%-6s %-14s %12.1f %12s %9s   (memory floor over %.1f MiB: a random read "
               "waiting for the one before)\n",
               name, "floor: chase", f->floor.chase, "-", "-",
               (double)f->floor.bytes / (1 << 20));
        printf("%-6s %-14s %12.1f %12s %9s   (independent ops of two dependent random "
               "reads, a get's shape; get hit / this: %.1fx)\n",
               name, "floor: 2 reads", f->floor.two_dep, "-", "-",
               f->rows[OP_GET_HIT].kv_ns / f->floor.two_dep);
        printf("%-6s %-14s %12.2f %12s %9s   (the core's clock then, one dependent add a "
               "cycle)\n",
               name, "cpu GHz", f->floor.ghz, "-", "-");
    }
}

static void print_json(int n_scales, const struct scale_figs figs[])
{
    printf("{\"bench\":\"kv\",\"quick\":%s,\"append_only\":%s", quick ? "true" : "false",
           append_only ? "true" : "false");
    static const char *keys[N_OPS] = {"get",    "get_miss", "put",     "put_new",
                                      "delete", "scan10",   "scan100", "scan1000",
                                      "mget16", "put_batch"};
    for (int sc = 0; sc < n_scales; sc++)
        for (int op = 0; op < N_OPS; op++)
            printf(",\"%s_ns_%s\":%.1f,\"lmdb_%s_ns_%s\":%.1f", keys[op], scale_names[sc],
                   figs[sc].rows[op].kv_ns, keys[op], scale_names[sc],
                   figs[sc].rows[op].lmdb_ns);
    for (int sc = 0; sc < n_scales; sc++) {
        const char *name = scale_names[sc];
        const struct mem_floor *fl = &figs[sc].floor;
        printf(",\"mem_chase_ns_%s\":%.1f,\"mem_2reads_ns_%s\":%.1f,\"mem_floor_mib_%s\":"
               "%.1f,\"cpu_ghz_%s\":%.2f",
               name, fl->chase, name, fl->two_dep, name, (double)fl->bytes / (1 << 20),
               name, fl->ghz);
    }
    printf(",\"alloc_bytes_per_get\":%.1f,\"alloc_bytes_per_put\":%.1f",
           figs[1].rows[OP_GET_HIT].kv_alloc, figs[1].rows[OP_PUT_OVER].kv_alloc);
    if (n_scales == 3)
        printf(",\"cold_get_p50_ns_10m\":%.1f}\n", figs[2].cold_p50);
    else
        printf(",\"cold_get_p50_ns_10m\":null}\n");
}

/* ---- the command line ---- */

static const char *plot_path; /* --plot */

/* An op as the table names it; an unknown name is an error unless an earlier
 * --only named a known one. */
static int parse_op(const char *v, void *dest)
{
    int *op_out = dest;
    for (int op = 0; op < N_OPS; op++)
        if (strcmp(v, op_names[op]) == 0)
            *op_out = op;
    return *op_out >= 0 ? 0 : -1;
}

/* One row per option, in the order the usage message names them. */
static const struct bench_option options[] = {
    {"--quick", NULL, bench_parse_flag, &quick, false},
    {"--append-only", NULL, bench_parse_flag, &append_only, false},
    {"--only", "'<op name>'", parse_op, &only, false},
    {"--plot", "FILE.svg", bench_parse_str, &plot_path, false},
};

int main(int argc, char **argv)
{
    int rc = bench_args_parse("kv-bench", options, sizeof(options) / sizeof(options[0]),
                              argc, argv);
    if (rc != 0)
        return rc;
    if (quick)
        runs = 3;
    tk_prng_seed(&rng, 42);
    const uint64_t scales[3] = {1000, 100000, 10000000};
    int n_scales = quick ? 2 : 3;
    struct scale_figs figs[3];
    memset(figs, 0, sizeof(figs));
    for (int sc = 0; sc < n_scales; sc++) {
        fprintf(stderr, "kv-bench: %s keys...\n", scale_names[sc]);
        run_scale(scales[sc], &figs[sc]);
    }
    print_table(n_scales, figs);
    print_json(n_scales, figs);
    if (plot_path != NULL)
        return plot_rows(plot_path, n_scales, scales, figs) == 0 ? 0 : 1;
    return 0;
}
