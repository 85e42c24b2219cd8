/* The store's metadata in an LMDB environment (a directory of its own).
 *
 * One key per field group, fixed little-endian encodings, each write one
 * synchronous LMDB commit (no MDB_NOSYNC), so when store_meta_save returns the
 * new term, vote, ids, configuration, snapshot descriptor (or an install's
 * pending one) or log start is on
 * disk. Values of the wrong size or with an invalid configuration are
 * TK_ECORRUPT at open, never an assert. LMDB errors are translated here and do
 * not leak upward. The only file of tierkv's store that includes lmdb.h. */
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/err.h"
#include "store/store_internal.h"

struct store_meta {
    MDB_env *env;
    MDB_dbi dbi;
    char *path;
};

#define CONFIG_BYTES (4 + 8 * RAFT_VOTERS_MAX)

static int lmdb_rc(int rc)
{
    switch (rc) {
    case 0:
        return 0;
    case ENOSPC:
    case MDB_MAP_FULL:
        return TK_ENOSPC;
    case ENOMEM:
        return TK_ENOMEM;
    case MDB_CORRUPTED:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
        return TK_ECORRUPT;
    default:
        return TK_EIO;
    }
}

static void put_config(uint8_t *p, const struct raft_config *c)
{
    memset(p, 0, CONFIG_BYTES);
    tk_put_le32(p, c->n_voters);
    for (uint32_t i = 0; i < c->n_voters && i < RAFT_VOTERS_MAX; i++)
        tk_put_le64(p + 4 + 8 * i, c->voters[i]);
}

static int get_config(const uint8_t *p, struct raft_config *c, bool allow_empty)
{
    memset(c, 0, sizeof(*c));
    c->n_voters = tk_get_le32(p);
    if (c->n_voters > RAFT_VOTERS_MAX || (!allow_empty && c->n_voters == 0))
        return TK_ECORRUPT;
    for (uint32_t i = 0; i < c->n_voters; i++)
        c->voters[i] = tk_get_le64(p + 4 + 8 * i);
    return 0;
}

/* A snapshot configuration's learners, under a key of their own (so that a
 * metadata file from before learners existed still reads): u32 count, then
 * RAFT_LEARNERS_MAX u64 ids (zero past the count). */
#define LEARNERS_BYTES (4 + 8 * RAFT_LEARNERS_MAX)

static void put_learners(uint8_t *p, const struct raft_config *c)
{
    memset(p, 0, LEARNERS_BYTES);
    tk_put_le32(p, c->n_learners);
    for (uint32_t i = 0; i < c->n_learners && i < RAFT_LEARNERS_MAX; i++)
        tk_put_le64(p + 4 + 8 * i, c->learners[i]);
}

static int get_learners(const uint8_t *p, struct raft_config *c)
{
    c->n_learners = tk_get_le32(p);
    if (c->n_learners > RAFT_LEARNERS_MAX)
        return TK_ECORRUPT;
    for (uint32_t i = 0; i < c->n_learners; i++) {
        c->learners[i] = tk_get_le64(p + 4 + 8 * i);
        if (c->learners[i] == RAFT_NONE)
            return TK_ECORRUPT;
    }
    return 0;
}

static int put(MDB_txn *txn, MDB_dbi dbi, const char *key, const void *val, size_t len)
{
    MDB_val k = {.mv_size = strlen(key), .mv_data = (void *)key};
    MDB_val v = {.mv_size = len, .mv_data = (void *)val};
    return mdb_put(txn, dbi, &k, &v, 0);
}

/* Looks up `key`; 0 with *found false when absent; TK_ECORRUPT when present
 * with a size other than `len`. */
static int get(MDB_txn *txn, MDB_dbi dbi, const char *key, void *val, size_t len,
               bool *found, char *err, size_t err_len)
{
    MDB_val k = {.mv_size = strlen(key), .mv_data = (void *)key};
    MDB_val v;
    *found = false;
    int rc = mdb_get(txn, dbi, &k, &v);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc != 0)
        return store__errbuf(err, err_len, lmdb_rc(rc), "meta: reading %s: %s", key,
                             mdb_strerror(rc));
    if (v.mv_size != len)
        return store__errbuf(err, err_len, TK_ECORRUPT,
                             "meta: key %s has %zu bytes, expected %zu", key, v.mv_size,
                             len);
    memcpy(val, v.mv_data, len);
    *found = true;
    return 0;
}

#define SNAP_BYTES                                                                       \
    (16 + CONFIG_BYTES > LEARNERS_BYTES ? 16 + CONFIG_BYTES : LEARNERS_BYTES)

/* A snapshot descriptor: index, term and voters under `key`, learners under
 * key_learners (absent: none). Left as it is when `key` is absent. */
static int get_snapshot(MDB_txn *txn, MDB_dbi dbi, const char *key,
                        struct raft_snapshot_meta *out, char *err, size_t err_len)
{
    uint8_t b[SNAP_BYTES];
    char lk[32];
    bool found;
    int rc = get(txn, dbi, key, b, 16 + CONFIG_BYTES, &found, err, err_len);
    if (rc != 0)
        return rc;
    if (found) {
        out->index = tk_get_le64(b);
        out->term = tk_get_le64(b + 8);
        if ((rc = get_config(b + 16, &out->config, true)) != 0)
            return store__errbuf(err, err_len, rc, "meta: bad %s config", key);
    }
    snprintf(lk, sizeof(lk), "%s_learners", key);
    if ((rc = get(txn, dbi, lk, b, LEARNERS_BYTES, &found, err, err_len)) != 0)
        return rc;
    if (found && (rc = get_learners(b, &out->config)) != 0)
        return store__errbuf(err, err_len, rc, "meta: bad %s learners", key);
    return 0;
}

/* Returns an LMDB code, as put does. */
static int put_snapshot(MDB_txn *txn, MDB_dbi dbi, const char *key,
                        const struct raft_snapshot_meta *m)
{
    uint8_t b[SNAP_BYTES];
    char lk[32];
    tk_put_le64(b, m->index);
    tk_put_le64(b + 8, m->term);
    put_config(b + 16, &m->config);
    int rc = put(txn, dbi, key, b, 16 + CONFIG_BYTES);
    if (rc != 0)
        return rc;
    put_learners(b, &m->config);
    snprintf(lk, sizeof(lk), "%s_learners", key);
    return put(txn, dbi, lk, b, LEARNERS_BYTES);
}

static int load(struct store_meta *m, struct store_meta_state *st, char *err,
                size_t err_len)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return store__errbuf(err, err_len, lmdb_rc(rc), "meta %s: %s", m->path,
                             mdb_strerror(rc));
    memset(st, 0, sizeof(*st));
    uint8_t b[16 + CONFIG_BYTES];
    bool found;
    if ((rc = get(txn, m->dbi, "hard_state", b, 16, &found, err, err_len)))
        goto out;
    if (found) {
        st->hard_state.term = tk_get_le64(b);
        st->hard_state.vote = tk_get_le64(b + 8);
    }
    if ((rc = get(txn, m->dbi, "ids", b, 16, &found, err, err_len)))
        goto out;
    if (found) {
        st->cluster_id = tk_get_le64(b);
        st->node_id = tk_get_le64(b + 8);
    }
    if ((rc = get(txn, m->dbi, "incarnation", b, 16, &found, err, err_len)))
        goto out;
    if (found) {
        st->has_incarnation = true;
        memcpy(st->incarnation, b, 16);
    }
    if ((rc = get(txn, m->dbi, "log_start", b, 16, &found, err, err_len)))
        goto out;
    if (found) {
        st->has_log_start = true;
        st->log_first = tk_get_le64(b);
        st->log_prev_term = tk_get_le64(b + 8);
        if (st->log_first == 0) {
            rc = store__errbuf(err, err_len, TK_ECORRUPT,
                               "meta: log_start has first index 0");
            goto out;
        }
    }
    if ((rc = get(txn, m->dbi, "bootstrap", b, CONFIG_BYTES, &found, err, err_len)))
        goto out;
    if (found) {
        st->has_bootstrap = true;
        if ((rc = get_config(b, &st->bootstrap, false)) != 0) {
            store__errbuf(err, err_len, rc, "meta: bad bootstrap config");
            goto out;
        }
    }
    if ((rc = get_snapshot(txn, m->dbi, "snapshot", &st->snapshot, err, err_len)) != 0)
        goto out;
    rc = get_snapshot(txn, m->dbi, "pending", &st->pending, err, err_len);
out:
    mdb_txn_abort(txn);
    return rc;
}

int store_meta_open(const char *path, struct store_meta **out,
                    struct store_meta_state *st, char *err, size_t err_len)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return store__errbuf(err, err_len, TK_EIO, "meta: mkdir %s: %s", path,
                             strerror(errno));
    struct store_meta *m = tk_calloc(1, sizeof(*m));
    m->path = tk_strdup(path);
    int rc = mdb_env_create(&m->env);
    if (rc != 0) {
        rc = store__errbuf(err, err_len, lmdb_rc(rc), "meta: %s", mdb_strerror(rc));
        goto err_free;
    }
    mdb_env_set_mapsize(m->env, 1u << 20);
    rc = mdb_env_open(m->env, path, MDB_NOTLS, 0644);
    if (rc != 0) {
        rc = store__errbuf(err, err_len, lmdb_rc(rc), "meta: open %s: %s", path,
                           mdb_strerror(rc));
        goto err_env;
    }
    MDB_txn *txn;
    rc = mdb_txn_begin(m->env, NULL, 0, &txn);
    if (rc == 0) {
        rc = mdb_dbi_open(txn, NULL, 0, &m->dbi);
        if (rc == 0)
            rc = mdb_txn_commit(txn);
        else
            mdb_txn_abort(txn);
    }
    if (rc != 0) {
        rc = store__errbuf(err, err_len, lmdb_rc(rc), "meta: %s: %s", path,
                           mdb_strerror(rc));
        goto err_env;
    }
    rc = load(m, st, err, err_len);
    if (rc != 0)
        goto err_env;
    *out = m;
    return 0;
err_env:
    mdb_env_close(m->env);
err_free:
    tk_free(m->path);
    tk_free(m);
    return rc;
}

int store_meta_save(struct store_meta *m, const struct store_meta_state *st,
                    unsigned mask, char *err, size_t err_len)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(m->env, NULL, 0, &txn);
    if (rc != 0)
        goto fail;
    uint8_t b[16 + CONFIG_BYTES];
    if (rc == 0 && (mask & STORE_META_HARD_STATE)) {
        tk_put_le64(b, st->hard_state.term);
        tk_put_le64(b + 8, st->hard_state.vote);
        rc = put(txn, m->dbi, "hard_state", b, 16);
    }
    if (rc == 0 && (mask & STORE_META_IDS)) {
        tk_put_le64(b, st->cluster_id);
        tk_put_le64(b + 8, st->node_id);
        rc = put(txn, m->dbi, "ids", b, 16);
        if (rc == 0 && st->has_incarnation)
            rc = put(txn, m->dbi, "incarnation", st->incarnation, 16);
    }
    if (rc == 0 && (mask & STORE_META_LOG_START)) {
        tk_put_le64(b, st->log_first);
        tk_put_le64(b + 8, st->log_prev_term);
        rc = put(txn, m->dbi, "log_start", b, 16);
    }
    if (rc == 0 && (mask & STORE_META_BOOTSTRAP)) {
        put_config(b, &st->bootstrap);
        rc = put(txn, m->dbi, "bootstrap", b, CONFIG_BYTES);
    }
    if (rc == 0 && (mask & STORE_META_SNAPSHOT))
        rc = put_snapshot(txn, m->dbi, "snapshot", &st->snapshot);
    if (rc == 0 && (mask & STORE_META_PENDING))
        rc = put_snapshot(txn, m->dbi, "pending", &st->pending);
    if (rc != 0) {
        mdb_txn_abort(txn);
        goto fail;
    }
    rc = mdb_txn_commit(txn); /* synchronous: fsyncs before returning */
    if (rc != 0)
        goto fail;
    return 0;
fail:
    return store__errbuf(err, err_len, lmdb_rc(rc), "meta %s: commit: %s", m->path,
                         mdb_strerror(rc));
}

void store_meta_close(struct store_meta *m)
{
    if (m == NULL)
        return;
    mdb_env_close(m->env);
    tk_free(m->path);
    tk_free(m);
}
