/* The cold tier: LMDB, the only file of kv/ that includes lmdb.h.
 *
 * Tables: "data" (key -> 32-byte header [expire, create rev, mod rev, version]
 * + value; LMDB keys are at most 511 bytes, so a key longer than SHORT_MAX is
 * stored as its first SHORT_MAX bytes + its 64-bit XXH3, and the value then
 * also carries the full key: such long keys that share their first SHORT_MAX
 * bytes scan in hash order among themselves, every other order is exact), "exp" (be64
 * expire || key -> empty: the keys with a TTL, which kv/ttl.c reloads; a
 * commit drops the stale entries, never the keys, which only an expire
 * command deletes), "sess" (be64 index || be64 client ||
 * be64 seq -> encoded result, the exactly-once table, oldest first) and "meta" (the raft
 * index, term and clock the tier reflects). A tier-down step is one write transaction
 * that carries its meta, so the index always matches the data (crash-safe: LMDB commits
 * are atomic). Reads use one long-lived read transaction, reset when a commit
 * is published. The environment lives in dir/cold.<gen>, reached through the symlink
 * dir/cold; installing a snapshot builds cold.<gen+1> and swaps the symlink
 * with rename(2). LMDB codes become TK_EIO / TK_ECORRUPT here. Owner thread,
 * except two things any one other thread may do: read a snapshot view
 * (MDB_NOTLS), and run a whole write transaction (wbegin .. wcommit) while the
 * owner keeps reading its old view; the owner then calls wpublish. An
 * install's new environment (kv__cold_new_*) is written, prepared and
 * published on any one thread too: that reads only the directory and the
 * generation, which change only in kv__cold_switch (owner thread). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/dir.h"
#include "base/endian.h"
#include "base/err.h"
#include "base/log.h"
#include "base/sync.h"
#include "kv/kv_internal.h"

#define SHORT_MAX KV_COLD_SHORT_MAX
#define LONG_STORED (SHORT_MAX + 8)

#define VHDR 32
#define SWEEP_MAX 100000

struct kv_cold_cur {
    struct kv_cold *c;
    MDB_cursor *cur;
    MDB_val k, v;
    uint64_t epoch; /* the read view the cursor belongs to */
    bool busy;
};

struct kv_cold {
    char *dir;
    uint64_t gen;
    size_t map_bytes;
    bool no_sync;
    MDB_env *env;
    MDB_dbi data, exp, sess, meta;
    MDB_txn *rtxn;
    bool rtxn_active;
    MDB_txn *wtxn;
    MDB_cursor *wcur;        /* on "data" in wtxn, opened by the first wput */
    uint64_t count;          /* entries of "data" in the published state */
    uint64_t wcount;         /* ... as of the last commit (any thread) */
    uint64_t epoch;          /* bumped each time the read view is renewed */
    struct kv_cold_cur scur; /* the scan cursor, reused (scans do not nest) */
    uint64_t trash_gen;      /* an environment an install replaced, not yet removed */
    MDB_env *trash_env;      /* ... still open: closing it unmaps it (kv__cold_trash) */
};

static void wcur_close(struct kv_cold *c)
{
    if (c->wcur != NULL)
        mdb_cursor_close(c->wcur);
    c->wcur = NULL;
}

static int xlate(int rc)
{
    if (rc == 0)
        return 0;
    if (rc == MDB_NOTFOUND)
        return TK_ENOTFOUND;
    if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID ||
        rc == MDB_VERSION_MISMATCH)
        return TK_ECORRUPT;
    if (rc == MDB_MAP_FULL || rc == ENOSPC)
        return TK_ENOSPC;
    if (rc == ENOMEM)
        return TK_ENOMEM;
    return TK_EIO;
}

static int lmdb_fail(const char *what, int rc)
{
    tk_logf(TK_LOG_ERROR, 0, 0, NULL, "kv cold tier: %s: %s", what, mdb_strerror(rc));
    return xlate(rc);
}

/* The LMDB key of `key`: itself, or for a long key prefix || hash. */
static size_t stored_key(const uint8_t *key, size_t len, uint8_t out[LONG_STORED])
{
    if (len <= SHORT_MAX) {
        memcpy(out, key, len);
        return len;
    }
    memcpy(out, key, SHORT_MAX);
    tk_put_be64(out + SHORT_MAX, kv__hash(key, len));
    return LONG_STORED;
}

static void env_path(const struct kv_cold *c, uint64_t gen, char *out, size_t cap)
{
    snprintf(out, cap, "%s/cold.%llu", c->dir, (unsigned long long)gen);
}

/* Opens the environment in `path` and its tables. */
static int env_open(struct kv_cold *c, const char *path, MDB_env **envp, MDB_dbi dbi[4])
{
    MDB_env *env = NULL;
    int rc = mdb_env_create(&env);
    if (rc != 0)
        return lmdb_fail("env_create", rc);
    mdb_env_set_maxdbs(env, 4);
    rc = mdb_env_set_mapsize(env, c->map_bytes);
    if (rc == 0) {
        unsigned flags = MDB_NOTLS | MDB_NORDAHEAD | (c->no_sync ? MDB_NOSYNC : 0);
        rc = mdb_env_open(env, path, flags, 0644);
    }
    if (rc != 0) {
        mdb_env_close(env);
        return lmdb_fail("env_open", rc);
    }
    MDB_txn *txn = NULL;
    rc = mdb_txn_begin(env, NULL, 0, &txn);
    const char *names[4] = {"data", "exp", "sess", "meta"};
    for (int i = 0; rc == 0 && i < 4; i++)
        rc = mdb_dbi_open(txn, names[i], MDB_CREATE, &dbi[i]);
    if (rc == 0)
        rc = mdb_txn_commit(txn);
    else if (txn != NULL)
        mdb_txn_abort(txn);
    if (rc != 0) {
        mdb_env_close(env);
        return lmdb_fail("open tables", rc);
    }
    *envp = env;
    return 0;
}

static int attach(struct kv_cold *c)
{
    char path[PATH_MAX];
    env_path(c, c->gen, path, sizeof(path));
    MDB_dbi dbi[4];
    int rc = env_open(c, path, &c->env, dbi);
    if (rc != 0)
        return rc;
    c->data = dbi[0];
    c->exp = dbi[1];
    c->sess = dbi[2];
    c->meta = dbi[3];
    MDB_txn *txn = NULL;
    rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return lmdb_fail("txn_begin", rc);
    MDB_stat st;
    rc = mdb_stat(txn, c->data, &st);
    mdb_txn_abort(txn);
    if (rc != 0)
        return lmdb_fail("stat", rc);
    c->count = st.ms_entries;
    return 0;
}

/* Closes the transactions and the environment; with `keep`, the environment
 * is handed there open instead (closing a big mapping takes long). */
static void detach(struct kv_cold *c, MDB_env **keep)
{
    if (c->scur.cur != NULL)
        mdb_cursor_close(c->scur.cur);
    c->scur.cur = NULL;
    if (c->rtxn != NULL)
        mdb_txn_abort(c->rtxn);
    c->rtxn = NULL;
    c->rtxn_active = false;
    wcur_close(c);
    if (c->wtxn != NULL)
        mdb_txn_abort(c->wtxn);
    c->wtxn = NULL;
    if (keep != NULL)
        *keep = c->env;
    else if (c->env != NULL)
        mdb_env_close(c->env);
    c->env = NULL;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return TK_EIO;
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : TK_EIO;
}

static void remove_env_dir(const char *path)
{
    char f[PATH_MAX + 16];
    snprintf(f, sizeof(f), "%s/data.mdb", path);
    unlink(f);
    snprintf(f, sizeof(f), "%s/lock.mdb", path);
    unlink(f);
    rmdir(path);
}

void kv_remove_env(const char *path)
{
    remove_env_dir(path);
}

bool kv__cold_trash(struct kv_cold *c, char *path, size_t cap, void **env)
{
    if (c->trash_gen == 0)
        return false;
    env_path(c, c->trash_gen, path, cap);
    *env = c->trash_env;
    c->trash_gen = 0;
    c->trash_env = NULL;
    return true;
}

void kv__trash_env_close(void *env)
{
    if (env != NULL)
        mdb_env_close(env);
}

/* Every cold.<n> but the current one and the one an install may be
 * writing: leftovers of a crash before an install's old environment was
 * removed (kv_sm_install_trash). */
static void remove_stale_envs(struct kv_cold *c)
{
    DIR *d = tk_opendir(c->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        unsigned long long g;
        char rest;
        if (sscanf(e->d_name, "cold.%llu%c", &g, &rest) != 1 || g == c->gen)
            continue;
        env_path(c, g, path, sizeof(path));
        remove_env_dir(path);
    }
    closedir(d);
}

int kv__cold_open(const char *dir, size_t map_bytes, bool no_sync, struct kv_cold **out)
{
    if (dir == NULL || strlen(dir) > PATH_MAX - 64)
        return TK_EINVAL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return TK_EIO;
    struct kv_cold *c = tk_calloc(1, sizeof(*c));
    c->dir = tk_strdup(dir);
    c->map_bytes = map_bytes;
    c->no_sync = no_sync;
    char link[PATH_MAX], target[PATH_MAX];
    snprintf(link, sizeof(link), "%s/cold", dir);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    int rc;
    if (n < 0) {
        if (errno != ENOENT) {
            rc = TK_EIO;
            goto err;
        }
        c->gen = 1;
        char path[PATH_MAX];
        env_path(c, 1, path, sizeof(path));
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            rc = TK_EIO;
            goto err;
        }
        if (symlink("cold.1", link) != 0 || fsync_dir(dir) != 0) {
            rc = TK_EIO;
            goto err;
        }
    } else {
        target[n] = '\0';
        unsigned long long g = 0;
        if (sscanf(target, "cold.%llu", &g) != 1 || g == 0) {
            rc = TK_ECORRUPT;
            goto err;
        }
        c->gen = g;
    }
    /* Leftovers of an interrupted install. */
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/cold.tmp", dir);
    unlink(path);
    rc = attach(c);
    if (rc != 0)
        goto err;
    remove_stale_envs(c); /* only once the current one is known good */
    *out = c;
    return 0;
err:
    tk_free(c->dir);
    tk_free(c);
    return rc;
}

void kv__cold_close(struct kv_cold *c)
{
    if (c == NULL)
        return;
    detach(c, NULL);
    kv__trash_env_close(c->trash_env);
    tk_free(c->dir);
    tk_free(c);
}

uint64_t kv__cold_count(struct kv_cold *c)
{
    return c->count;
}

uint64_t kv__cold_bytes(struct kv_cold *c)
{
    MDB_envinfo info;
    MDB_stat st;
    if (mdb_env_info(c->env, &info) != 0 || mdb_env_stat(c->env, &st) != 0)
        return 0;
    return ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
}

uint64_t kv__cold_map_bytes(struct kv_cold *c)
{
    MDB_envinfo info;
    if (mdb_env_info(c->env, &info) != 0)
        return 0;
    return info.me_mapsize;
}

/* The pages of this environment's data.mdb in the page cache (which is what
 * LMDB's read-only map reads): mincore over a mapping of the used part of the
 * file, made for the call. It used to read /proc/self/smaps, which makes the
 * kernel walk every mapping of the process: tens of ms of the loop at a
 * million keys, every time /metrics was refreshed. This walks only the
 * file's pages (about 1 ms per GB). */
int kv__cold_file(struct kv_cold *c, int *fd, uint64_t *len)
{
    struct stat sb;
    if (mdb_env_get_fd(c->env, fd) != 0 || fstat(*fd, &sb) != 0)
        return TK_EIO;
    *len = kv__cold_bytes(c);
    if (*len > (uint64_t)sb.st_size)
        *len = (uint64_t)sb.st_size;
    return 0;
}

uint64_t kv__cold_resident(struct kv_cold *c)
{
    int fd;
    uint64_t len;
    if (kv__cold_file(c, &fd, &len) != 0)
        return 0;
    return kv_file_resident(fd, len);
}

/* mincore over a fresh mapping looks each page up in the page cache: about
 * 60-80 ms of CPU per GB here, so callers run it off their loop. */
uint64_t kv_file_resident(int fd, uint64_t len)
{
    if (len == 0)
        return 0;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char vec[4096];
    uint64_t pages = 0;
    for (uint64_t off = 0; off < len; off += sizeof(vec) * pg) {
        size_t span =
            len - off < sizeof(vec) * pg ? (size_t)(len - off) : sizeof(vec) * pg;
        if (mincore((uint8_t *)map + off, span, vec) != 0)
            break;
        for (size_t i = 0; i < (span + pg - 1) / pg; i++)
            pages += vec[i] & 1;
    }
    munmap(map, len);
    return pages * pg;
}

void kv__cold_read_reset(struct kv_cold *c)
{
    if (c->rtxn_active) {
        mdb_txn_reset(c->rtxn);
        c->rtxn_active = false;
    }
}

static int read_view(struct kv_cold *c)
{
    if (c->rtxn_active)
        return 0;
    int rc;
    if (c->rtxn == NULL)
        rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, &c->rtxn);
    else
        rc = mdb_txn_renew(c->rtxn);
    if (rc != 0)
        return lmdb_fail("read txn", rc);
    c->rtxn_active = true;
    c->epoch++;
    return 0;
}

int kv__cold_meta(struct kv_cold *c, struct kv_cold_meta *m)
{
    memset(m, 0, sizeof(*m));
    int rc = read_view(c);
    if (rc != 0)
        return rc;
    MDB_val k = {1, "m"}, v;
    rc = mdb_get(c->rtxn, c->meta, &k, &v);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc != 0)
        return lmdb_fail("get meta", rc);
    if (v.mv_size != 24)
        return TK_ECORRUPT;
    const uint8_t *p = v.mv_data;
    m->index = tk_get_be64(p);
    m->term = tk_get_be64(p + 8);
    m->now_ms = tk_get_be64(p + 16);
    return 0;
}

/* Decodes a data value; for a long stored key, key and key_len become the full
 * key kept in the value. */
static int decode_val(const MDB_val *k, const MDB_val *v, struct kv_cold_val *out,
                      const uint8_t **key, size_t *key_len)
{
    if (v->mv_size < VHDR)
        return TK_ECORRUPT;
    const uint8_t *p = v->mv_data;
    out->expire_ms = tk_get_be64(p);
    out->create_rev = tk_get_be64(p + 8);
    out->mod_rev = tk_get_be64(p + 16);
    out->version = tk_get_be64(p + 24);
    size_t hdr = VHDR;
    *key = k->mv_data;
    *key_len = k->mv_size;
    if (k->mv_size == LONG_STORED) {
        if (v->mv_size < VHDR + 2)
            return TK_ECORRUPT;
        size_t klen = ((size_t)p[VHDR] << 8) | p[VHDR + 1];
        if (v->mv_size < VHDR + 2 + klen)
            return TK_ECORRUPT;
        *key = p + VHDR + 2;
        *key_len = klen;
        hdr = VHDR + 2 + klen;
    }
    out->value = p + hdr;
    out->value_len = v->mv_size - hdr;
    return 0;
}

int kv__cold_get(struct kv_cold *c, const void *key, size_t len, struct kv_cold_val *out)
{
    if (c->count == 0 || len == 0)
        return TK_ENOTFOUND;
    int rc = read_view(c);
    if (rc != 0)
        return rc;
    uint8_t sk[LONG_STORED];
    MDB_val k = {stored_key(key, len, sk), sk}, v;
    rc = mdb_get(c->rtxn, c->data, &k, &v);
    if (rc == MDB_NOTFOUND)
        return TK_ENOTFOUND;
    if (rc != 0)
        return lmdb_fail("get", rc);
    const uint8_t *fk;
    size_t fklen;
    rc = decode_val(&k, &v, out, &fk, &fklen);
    if (rc != 0)
        return rc;
    if (fklen != len || memcmp(fk, key, len) != 0)
        return TK_ENOTFOUND; /* another long key with the same prefix and hash */
    return 0;
}

int kv__cold_wbegin(struct kv_cold *c)
{
    TK_ASSERT(c->wtxn == NULL);
    int rc = mdb_txn_begin(c->env, NULL, 0, &c->wtxn);
    if (rc != 0) {
        c->wtxn = NULL;
        return lmdb_fail("write txn", rc);
    }
    return 0;
}

int kv__cold_wput(struct kv_cold *c, const struct kv_rec *h)
{
    uint8_t sk[LONG_STORED];
    MDB_val k = {stored_key(kv__rec_key(h), h->key_len, sk), sk};
    size_t extra = k.mv_size == LONG_STORED ? 2 + (size_t)h->key_len : 0;
    int rc;
    /* Through one cursor: when keys come in order, LMDB finds most of them
     * on the leaf the cursor is already on instead of descending again. */
    if (c->wcur == NULL) {
        rc = mdb_cursor_open(c->wtxn, c->data, &c->wcur);
        if (rc != 0) {
            c->wcur = NULL;
            return lmdb_fail("cursor", rc);
        }
    }
    if (h->flags & KV_REC_TOMB) {
        MDB_val cv;
        rc = mdb_cursor_get(c->wcur, &k, &cv, MDB_SET);
        if (rc == 0)
            rc = mdb_cursor_del(c->wcur, 0);
        if (rc == MDB_NOTFOUND)
            rc = 0;
        return rc == 0 ? 0 : lmdb_fail("del", rc);
    }
    MDB_val v = {VHDR + extra + h->value_len, NULL};
    rc = mdb_cursor_put(c->wcur, &k, &v, MDB_RESERVE);
    if (rc != 0)
        return lmdb_fail("put", rc);
    uint8_t *p = v.mv_data;
    tk_put_be64(p, h->expire_ms);
    tk_put_be64(p + 8, h->create_rev);
    tk_put_be64(p + 16, h->mod_rev);
    tk_put_be64(p + 24, h->version);
    if (extra > 0) {
        p[VHDR] = (uint8_t)(h->key_len >> 8);
        p[VHDR + 1] = (uint8_t)h->key_len;
        memcpy(p + VHDR + 2, kv__rec_key(h), h->key_len);
    }
    if (h->value_len > 0)
        memcpy(p + VHDR + extra, kv__rec_value(h), h->value_len);
    if (h->expire_ms != 0) {
        uint8_t ek[8 + LONG_STORED];
        tk_put_be64(ek, h->expire_ms);
        memcpy(ek + 8, sk, k.mv_size);
        MDB_val xk = {8 + k.mv_size, ek}, xv = {0, NULL};
        rc = mdb_put(c->wtxn, c->exp, &xk, &xv, 0);
        if (rc != 0)
            return lmdb_fail("put exp", rc);
    }
    return 0;
}

int kv__cold_wsession(struct kv_cold *c, const struct kv_rec *h)
{
    if (h->key_len != 16)
        return TK_ECORRUPT;
    uint8_t key[24];
    tk_put_be64(key, h->mod_rev);
    memcpy(key + 8, kv__rec_key(h), 16);
    MDB_val k = {24, key}, v = {h->value_len, (void *)(uintptr_t)kv__rec_value(h)};
    int rc = mdb_put(c->wtxn, c->sess, &k, &v, 0);
    return rc == 0 ? 0 : lmdb_fail("put session", rc);
}

static int sweep(struct kv_cold *c, uint64_t now_ms)
{
    MDB_cursor *cur = NULL;
    int rc = mdb_cursor_open(c->wtxn, c->exp, &cur);
    if (rc != 0)
        return lmdb_fail("cursor", rc);
    MDB_val k, v;
    int n = 0;
    rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    while (rc == 0 && n++ < SWEEP_MAX) {
        if (k.mv_size < 8) {
            rc = MDB_CORRUPTED;
            break;
        }
        uint64_t exp = tk_get_be64(k.mv_data);
        if (exp > now_ms)
            break;
        MDB_val dk = {k.mv_size - 8, (uint8_t *)k.mv_data + 8}, dv;
        rc = mdb_get(c->wtxn, c->data, &dk, &dv);
        if (rc == 0 && dv.mv_size >= VHDR && tk_get_be64(dv.mv_data) == exp) {
            /* Still the key's version: only an expire command deletes it
             * (kv/ttl.c), at one revision on every replica. */
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
            continue;
        }
        if (rc != 0 && rc != MDB_NOTFOUND)
            break;
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0)
            break;
        rc = mdb_cursor_get(cur, &k, &v, MDB_GET_CURRENT);
        if (rc == MDB_NOTFOUND || rc == EINVAL)
            rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    }
    mdb_cursor_close(cur);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return lmdb_fail("sweep", rc);
    return 0;
}

static int trim_sessions(struct kv_cold *c, size_t max)
{
    MDB_stat st;
    int rc = mdb_stat(c->wtxn, c->sess, &st);
    if (rc != 0)
        return lmdb_fail("stat", rc);
    if (st.ms_entries <= max)
        return 0;
    size_t drop = st.ms_entries - max;
    MDB_cursor *cur = NULL;
    rc = mdb_cursor_open(c->wtxn, c->sess, &cur);
    if (rc != 0)
        return lmdb_fail("cursor", rc);
    MDB_val k, v;
    while (drop-- > 0) {
        rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        if (rc == 0)
            rc = mdb_cursor_del(cur, 0);
        if (rc != 0)
            break;
    }
    mdb_cursor_close(cur);
    return rc == 0 ? 0 : lmdb_fail("trim sessions", rc);
}

static int put_meta(MDB_txn *txn, MDB_dbi dbi, const struct kv_cold_meta *m)
{
    uint8_t buf[24];
    tk_put_be64(buf, m->index);
    tk_put_be64(buf + 8, m->term);
    tk_put_be64(buf + 16, m->now_ms);
    MDB_val k = {1, "m"}, v = {24, buf};
    return mdb_put(txn, dbi, &k, &v, 0);
}

int kv__cold_wcommit(struct kv_cold *c, const struct kv_cold_meta *m, size_t sessions_max,
                     struct tk_pace *pace)
{
    wcur_close(c);
    int rc = sweep(c, m->now_ms);
    if (rc == 0)
        rc = trim_sessions(c, sessions_max);
    if (rc == 0) {
        int lrc = put_meta(c->wtxn, c->meta, m);
        MDB_stat st;
        if (lrc == 0)
            lrc = mdb_stat(c->wtxn, c->data, &st);
        if (lrc == 0) {
            c->wcount = st.ms_entries;
            tk_pace_begin(pace);
            lrc = mdb_txn_commit(c->wtxn);
            tk_pace_end();
            c->wtxn = NULL;
        }
        if (lrc != 0)
            rc = lmdb_fail("commit", lrc);
    }
    if (c->wtxn != NULL) {
        mdb_txn_abort(c->wtxn);
        c->wtxn = NULL;
    }
    return rc;
}

void kv__cold_wpublish(struct kv_cold *c)
{
    c->count = c->wcount;
    kv__cold_read_reset(c);
}

void kv__cold_wabort(struct kv_cold *c)
{
    wcur_close(c);
    if (c->wtxn != NULL)
        mdb_txn_abort(c->wtxn);
    c->wtxn = NULL;
}

static int each_session(MDB_txn *txn, MDB_dbi dbi, kv_cold_session_cb *cb, void *data)
{
    MDB_cursor *cur = NULL;
    int rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return lmdb_fail("cursor", rc);
    MDB_val k, v;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 24) {
            ret = TK_ECORRUPT;
            break;
        }
        const uint8_t *p = k.mv_data;
        ret = cb(tk_get_be64(p), tk_get_be64(p + 8), tk_get_be64(p + 16), v.mv_data,
                 v.mv_size, data);
        if (ret != 0)
            break;
    }
    mdb_cursor_close(cur);
    if (ret == 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail("sessions", rc);
    return ret;
}

static int each_expiring(MDB_txn *txn, MDB_dbi dbi, kv_cold_exp_cb *cb, void *data)
{
    MDB_cursor *cur = NULL;
    int rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return lmdb_fail("cursor", rc);
    MDB_val k, v;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && ret == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size <= 8) {
            ret = TK_ECORRUPT;
            break;
        }
        ret = cb(tk_get_be64(k.mv_data), (const uint8_t *)k.mv_data + 8, k.mv_size - 8,
                 data);
    }
    mdb_cursor_close(cur);
    if (ret == 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail("expiring", rc);
    return ret;
}

/* The data records whose keys start with `prefix` (at most SHORT_MAX bytes),
 * in order, those expired at now_ms left out, as a scan shows them. */
static int each_prefixed(MDB_txn *txn, MDB_dbi dbi, const uint8_t *prefix, size_t len,
                         uint64_t now_ms, kv_cold_item_cb *cb, void *data)
{
    TK_ASSERT(len > 0 && len <= SHORT_MAX);
    MDB_cursor *cur = NULL;
    int rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc != 0)
        return lmdb_fail("cursor", rc);
    MDB_val k = {len, (void *)(uintptr_t)prefix}, v;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0 && ret == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size < len || memcmp(k.mv_data, prefix, len) != 0)
            break;
        struct kv_cold_val cv;
        const uint8_t *key;
        size_t key_len;
        ret = decode_val(&k, &v, &cv, &key, &key_len);
        if (ret == 0 && (cv.expire_ms == 0 || cv.expire_ms > now_ms))
            ret = cb(key, key_len, &cv, data);
    }
    mdb_cursor_close(cur);
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail("prefix", rc);
    return ret;
}

int kv__cold_sessions(struct kv_cold *c, kv_cold_session_cb *cb, void *data)
{
    int rc = read_view(c);
    return rc != 0 ? rc : each_session(c->rtxn, c->sess, cb, data);
}

int kv__cold_expiring(struct kv_cold *c, kv_cold_exp_cb *cb, void *data)
{
    int rc = read_view(c);
    return rc != 0 ? rc : each_expiring(c->rtxn, c->exp, cb, data);
}

int kv__cold_cur_open(struct kv_cold *c, struct kv_cold_cur **out)
{
    int rc = read_view(c);
    if (rc != 0)
        return rc;
    struct kv_cold_cur *cur = &c->scur;
    TK_ASSERT(!cur->busy);
    cur->c = c;
    if (cur->cur == NULL)
        rc = mdb_cursor_open(c->rtxn, c->data, &cur->cur);
    else if (cur->epoch != c->epoch)
        rc = mdb_cursor_renew(c->rtxn, cur->cur);
    if (rc != 0) {
        if (cur->cur != NULL)
            mdb_cursor_close(cur->cur);
        cur->cur = NULL;
        return lmdb_fail("cursor", rc);
    }
    cur->epoch = c->epoch;
    cur->busy = true;
    *out = cur;
    return 0;
}

static int cur_result(int rc, bool *valid)
{
    *valid = rc == 0;
    if (rc == 0 || rc == MDB_NOTFOUND)
        return 0;
    return lmdb_fail("cursor get", rc);
}

int kv__cold_cur_seek(struct kv_cold_cur *cur, const void *key, size_t len, bool *valid)
{
    int rc;
    if (len == 0) {
        rc = mdb_cursor_get(cur->cur, &cur->k, &cur->v, MDB_FIRST);
    } else {
        /* A long start key seeks by its prefix; the caller skips keys below. */
        cur->k.mv_size = len <= SHORT_MAX ? len : SHORT_MAX;
        cur->k.mv_data = (void *)(uintptr_t)key;
        rc = mdb_cursor_get(cur->cur, &cur->k, &cur->v, MDB_SET_RANGE);
    }
    return cur_result(rc, valid);
}

int kv__cold_cur_next(struct kv_cold_cur *cur, bool *valid)
{
    return cur_result(mdb_cursor_get(cur->cur, &cur->k, &cur->v, MDB_NEXT), valid);
}

void kv__cold_cur_get(struct kv_cold_cur *cur, const uint8_t **key, size_t *key_len,
                      struct kv_cold_val *v)
{
    if (decode_val(&cur->k, &cur->v, v, key, key_len) != 0) {
        /* A short value is damage; show it as an empty, expired-never item. */
        memset(v, 0, sizeof(*v));
        v->value = (const uint8_t *)"";
        *key = cur->k.mv_data;
        *key_len = cur->k.mv_size;
    }
}

void kv__cold_cur_close(struct kv_cold_cur *cur)
{
    if (cur != NULL)
        cur->busy = false;
}

/* ---- snapshot view ---- */

struct kv_cold_snap {
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_dbi dbi[3];
    int table; /* 0..2 */
    bool started;
};

int kv__cold_snap_open(struct kv_cold *c, struct kv_cold_snap **out,
                       struct kv_cold_meta *meta)
{
    struct kv_cold_snap *s = tk_calloc(1, sizeof(*s));
    int rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, &s->txn);
    if (rc != 0) {
        tk_free(s);
        return lmdb_fail("snapshot txn", rc);
    }
    s->dbi[0] = c->data;
    s->dbi[1] = c->exp;
    s->dbi[2] = c->sess;
    memset(meta, 0, sizeof(*meta));
    MDB_val k = {1, "m"}, v;
    rc = mdb_get(s->txn, c->meta, &k, &v);
    if (rc == 0 && v.mv_size == 24) {
        const uint8_t *p = v.mv_data;
        meta->index = tk_get_be64(p);
        meta->term = tk_get_be64(p + 8);
        meta->now_ms = tk_get_be64(p + 16);
    } else if (rc != MDB_NOTFOUND) {
        mdb_txn_abort(s->txn);
        tk_free(s);
        return rc == 0 ? TK_ECORRUPT : lmdb_fail("snapshot meta", rc);
    }
    *out = s;
    return 0;
}

int kv__cold_snap_next(struct kv_cold_snap *s, uint8_t *table, const uint8_t **key,
                       size_t *key_len, const uint8_t **val, size_t *val_len, bool *end)
{
    MDB_val k, v;
    for (;;) {
        if (s->table >= 3) {
            *end = true;
            return 0;
        }
        int rc;
        if (!s->started) {
            rc = mdb_cursor_open(s->txn, s->dbi[s->table], &s->cur);
            if (rc != 0)
                return lmdb_fail("snapshot cursor", rc);
            s->started = true;
            rc = mdb_cursor_get(s->cur, &k, &v, MDB_FIRST);
        } else {
            rc = mdb_cursor_get(s->cur, &k, &v, MDB_NEXT);
        }
        if (rc == 0) {
            *table = (uint8_t)(s->table + 1);
            *key = k.mv_data;
            *key_len = k.mv_size;
            *val = v.mv_data;
            *val_len = v.mv_size;
            *end = false;
            return 0;
        }
        if (rc != MDB_NOTFOUND)
            return lmdb_fail("snapshot read", rc);
        mdb_cursor_close(s->cur);
        s->cur = NULL;
        s->started = false;
        s->table++;
    }
}

void kv__cold_snap_close(struct kv_cold_snap *s)
{
    if (s == NULL)
        return;
    if (s->cur != NULL)
        mdb_cursor_close(s->cur);
    mdb_txn_abort(s->txn);
    tk_free(s);
}

/* ---- install ---- */

struct kv_cold_new {
    struct kv_cold *c;
    MDB_env *env;
    MDB_dbi dbi[4];
    MDB_txn *txn;  /* from the first put to the prepare */
    bool prepared; /* committed and synced, env closed: only the swap is left */
    char path[PATH_MAX];
};

int kv__cold_new_begin(struct kv_cold *c, struct kv_cold_new **out)
{
    struct kv_cold_new *n = tk_calloc(1, sizeof(*n));
    n->c = c;
    env_path(c, c->gen + 1, n->path, sizeof(n->path));
    remove_env_dir(n->path);
    int rc;
    if (mkdir(n->path, 0755) != 0) {
        rc = TK_EIO;
        goto err;
    }
    rc = env_open(c, n->path, &n->env, n->dbi);
    if (rc != 0)
        goto err_dir;
    *out = n;
    return 0;
err_dir:
    remove_env_dir(n->path);
err:
    tk_free(n);
    return rc;
}

/* The write transaction begins with the first put (or the prepare), on the
 * thread that will commit it: an LMDB write transaction holds the
 * environment's writer mutex, which only the thread that took it may
 * release. */
static int new_txn(struct kv_cold_new *n)
{
    if (n->txn != NULL)
        return 0;
    int lrc = mdb_txn_begin(n->env, NULL, 0, &n->txn);
    if (lrc != 0) {
        n->txn = NULL;
        return lmdb_fail("install txn", lrc);
    }
    return 0;
}

int kv__cold_new_put(struct kv_cold_new *n, uint8_t table, const uint8_t *key,
                     size_t key_len, const uint8_t *val, size_t val_len)
{
    if (table < 1 || table > 3 || key_len == 0 || key_len > 511)
        return TK_ECORRUPT;
    if (table == 1 && val_len < VHDR)
        return TK_ECORRUPT;
    int rc = new_txn(n);
    if (rc != 0)
        return rc;
    MDB_val k = {key_len, (void *)(uintptr_t)key}, v = {val_len, (void *)(uintptr_t)val};
    rc = mdb_put(n->txn, n->dbi[table - 1], &k, &v, MDB_APPEND);
    if (rc == MDB_KEYEXIST || rc == MDB_BAD_VALSIZE)
        return TK_ECORRUPT; /* not in order, or sizes LMDB refuses: a bad stream */
    return rc == 0 ? 0 : lmdb_fail("install put", rc);
}

void kv__cold_new_abort(struct kv_cold_new *n)
{
    if (n == NULL)
        return;
    if (n->txn != NULL)
        mdb_txn_abort(n->txn);
    if (n->env != NULL)
        mdb_env_close(n->env);
    remove_env_dir(n->path);
    tk_free(n);
}

/* What the new environment holds for the owner's tables, read in one read
 * transaction after its commit. */
static int new_load(struct kv_cold_new *n, const struct kv_cold_meta *meta,
                    const struct kv_cold_load *load)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(n->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return lmdb_fail("install read txn", rc);
    rc = each_session(txn, n->dbi[2], load->session, load->data);
    if (rc == 0)
        rc = each_expiring(txn, n->dbi[1], load->expiring, load->data);
    if (rc == 0)
        rc = each_prefixed(txn, n->dbi[0], load->prefix, load->prefix_len, meta->now_ms,
                           load->item, load->data);
    mdb_txn_abort(txn);
    return rc;
}

int kv__cold_new_prepare(struct kv_cold_new *n, const struct kv_cold_meta *meta,
                         const struct kv_cold_load *load)
{
    TK_ASSERT(!n->prepared);
    int rc = new_txn(n);
    if (rc != 0)
        return rc;
    rc = put_meta(n->txn, n->dbi[3], meta);
    if (rc == 0)
        rc = mdb_txn_commit(n->txn);
    else
        mdb_txn_abort(n->txn);
    n->txn = NULL;
    if (rc == 0)
        rc = mdb_env_sync(n->env, 1);
    if (rc != 0)
        return lmdb_fail("install commit", rc);
    if (load != NULL && (rc = new_load(n, meta, load)) != 0)
        return rc;
    mdb_env_close(n->env);
    n->env = NULL;
    /* Its files' names too, before the link may name it (publish). */
    if (fsync_dir(n->path) != 0)
        return TK_EIO;
    n->prepared = true;
    return 0;
}

int kv__cold_new_publish(struct kv_cold_new *n)
{
    struct kv_cold *c = n->c;
    TK_ASSERT(n->prepared);
    char tmp[PATH_MAX], link[PATH_MAX], target[64];
    snprintf(tmp, sizeof(tmp), "%s/cold.tmp", c->dir);
    snprintf(link, sizeof(link), "%s/cold", c->dir);
    snprintf(target, sizeof(target), "cold.%llu", (unsigned long long)(c->gen + 1));
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, link) != 0) {
        remove_env_dir(n->path);
        tk_free(n);
        return TK_EIO;
    }
    tk_free(n);
    /* On a failed sync the link may already name the new environment
     * (renamed, not known durable): both stay; the next open uses whichever
     * it names. */
    return fsync_dir(c->dir);
}

int kv__cold_switch(struct kv_cold *c)
{
    /* The old environment's files, and its mapping, are left for the owner
     * to drop off its loop (kv_sm_install_trash): unlinking a synced file of
     * hundreds of MB takes ~140 ms per 300 MB here, and unmapping a big
     * resident one takes long too. An older one not yet taken goes now. */
    if (c->trash_gen != 0) {
        char old[PATH_MAX];
        env_path(c, c->trash_gen, old, sizeof(old));
        kv__trash_env_close(c->trash_env);
        c->trash_env = NULL;
        remove_env_dir(old);
    }
    detach(c, &c->trash_env);
    c->trash_gen = c->gen;
    c->gen++;
    return attach(c);
}

int kv__cold_new_commit(struct kv_cold_new *n, const struct kv_cold_meta *meta)
{
    struct kv_cold *c = n->c;
    if (!n->prepared) {
        int rc = kv__cold_new_prepare(n, meta, NULL);
        if (rc != 0) {
            kv__cold_new_abort(n);
            return rc;
        }
    }
    int rc = kv__cold_new_publish(n);
    return rc != 0 ? rc : kv__cold_switch(c);
}
