/* Restore and forced recovery: the two ways a data directory starts from
 * something other than its own history.
 *
 * node_restore (offline, before node_start) makes a new node's data
 * directory from a backup file (kv/backup.h), holding the directory's lock
 * (base/dirlock.h) throughout: the state machine installs the file's
 * snapshot stream, and the log is set to start right after the snapshot's
 * index with the new cluster's membership, ids and a hard state at the
 * snapshot's term; the source cluster's membership records are dropped (the
 * new members are the ones given). Every node of the new cluster restored
 * from the same file therefore starts with identical state, and the first
 * entry it writes has an index (a revision) above the snapshot's.
 *
 * node__force_config (at recovery, for --force-new-cluster) appends a
 * configuration entry naming this node as the only voter after the last
 * entry of its log, keeping every entry: the node then elects itself and
 * commits what it holds. The fence comes with it: the epoch record and a
 * removed record for each member dropped (node_member.c refuses them as
 * strangers), and a second forced recovery of the same cluster is refused.
 *
 * Called by tierkvd (node_restore) and node_recover.c (node__force_config);
 * calls node_member.c for the records' format. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/clock.h"
#include "base/dir.h"
#include "base/dirlock.h"
#include "base/err.h"
#include "base/log.h"
#include "kv/backup.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "store/store.h"

#define RESTORE_PIECE ((size_t)1 << 16)

/* 0 if `dir` is missing or empty (but for the LOCK this restore holds);
 * TK_EINVAL (with err) if it holds anything else. */
static int dir_empty(const char *dir, char *err, size_t cap)
{
    DIR *d = tk_opendir(dir);
    if (d == NULL && errno == ENOENT)
        return 0;
    if (d == NULL) {
        snprintf(err, cap, "%s: %s", dir, strerror(errno));
        return TK_EIO;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            strcmp(e->d_name, TK_DIRLOCK_FILE) != 0) {
            snprintf(
                err, cap,
                "%s is not empty (it holds \"%s\"): a restore never writes over data; "
                "give an empty or new directory",
                dir, e->d_name);
            rc = TK_EINVAL;
            break;
        }
    }
    closedir(d);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Installs the file's stream into a new state machine under dir/kv, checking
 * the file again as it passes (it may have changed since the first check). */
static int install_file(const char *file, const char *dir, bool no_sync, char *err,
                        size_t cap)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/kv", dir);
    struct kv_config kc;
    kv_config_default(&kc);
    kc.dir = path;
    kc.no_sync = no_sync;
    struct kv_sm *sm;
    int rc = kv_sm_open(&kc, &sm);
    if (rc != 0) {
        snprintf(err, cap, "cannot open a state machine in %s: %s", path,
                 tk_strerror(rc));
        return rc;
    }
    struct kv_install *in = NULL;
    rc = kv_sm_install_begin(sm, &in);
    int fd = rc == 0 ? open(file, O_RDONLY | O_CLOEXEC) : -1;
    if (rc == 0 && fd < 0) {
        snprintf(err, cap, "%s: %s", file, strerror(errno));
        rc = TK_EIO;
    }
    struct kv_backup_check *c = kv_backup_check_new();
    uint8_t *buf = tk_malloc(RESTORE_PIECE);
    while (rc == 0) {
        ssize_t got = read(fd, buf, RESTORE_PIECE);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = got < 0 ? TK_EIO : kv_backup_check_end(c, NULL, err, cap);
            if (got < 0)
                snprintf(err, cap, "%s: read: %s", file, strerror(errno));
            break;
        }
        rc = kv_backup_check_feed(c, buf, (size_t)got, err, cap);
        size_t off, len;
        kv_backup_check_stream(c, &off, &len);
        if (rc == 0 && len > 0 && (rc = kv_install_write(in, buf + off, len)) != 0)
            snprintf(err, cap, "the snapshot stream was refused: %s", tk_strerror(rc));
    }
    if (rc == 0 && (rc = kv_install_commit(in)) != 0) {
        snprintf(err, cap, "the snapshot stream was refused: %s", tk_strerror(rc));
        kv_install_abort(in); /* after a failed commit, only abort (kv.h) */
    } else if (rc != 0 && in != NULL) {
        kv_install_abort(in);
    }
    /* The source cluster's membership records (addresses, incarnations) are
     * not the new cluster's: its members come from --members. */
    uint64_t forgot = 0;
    if (rc == 0 &&
        (rc = kv_sm_forget_prefix(sm, (const uint8_t *)NODE_MEMBER_KEY_PREFIX,
                                  strlen(NODE_MEMBER_KEY_PREFIX), &forgot)) != 0)
        snprintf(err, cap, "cannot drop the old membership records: %s", tk_strerror(rc));
    /* A restored cluster is a new one: no forced recovery in its past. */
    if (rc == 0 && (rc = kv_sm_forget_prefix(sm, (const uint8_t *)NODE_EPOCH_KEY,
                                             strlen(NODE_EPOCH_KEY), &forgot)) != 0)
        snprintf(err, cap, "cannot drop the old epoch record: %s", tk_strerror(rc));
    tk_free(buf);
    kv_backup_check_free(c);
    if (fd >= 0)
        close(fd);
    kv_sm_close(sm);
    return rc;
}

/* A log that starts after the snapshot, with the new cluster's membership. */
static int init_log(const struct node_restore_options *o,
                    const struct kv_backup_info *info, char *err, size_t cap)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/log", o->data_dir);
    struct store *s;
    struct store_boot sb;
    int rc = store_open_fs(path, NULL, &s, &sb, err, cap);
    if (rc != 0)
        return rc;
    struct raft_snapshot_meta meta = {
        .index = info->revision, .term = info->term, .config = o->members};
    struct raft_hard_state hs = {.term = info->term, .vote = RAFT_NONE};
    rc = store_save_bootstrap(s, &o->members);
    if (rc == 0)
        rc = store_save_ids(s, o->cluster_id, o->id);
    if (rc == 0)
        rc = store_reset(s, info->revision, info->term);
    if (rc == 0)
        rc = store_save_snapshot(s, &meta);
    if (rc == 0)
        rc = store_save_hard_state(s, &hs);
    if (rc != 0)
        snprintf(err, cap, "cannot write the log in %s: %s", path, store_errmsg(s));
    store_close(s);
    return rc;
}

/* node_restore with the directory locked. */
static int restore_locked(const struct node_restore_options *o,
                          struct kv_backup_info *info, char *err, size_t cap)
{
    int rc = dir_empty(o->data_dir, err, cap);
    if (rc != 0)
        return rc;
    struct kv_backup_info in;
    rc = kv_backup_check_file(o->file, &in, err, cap);
    if (rc != 0)
        return rc;
    if (in.cluster_id == o->cluster_id) {
        snprintf(err, cap,
                 "the backup comes from cluster %llu: the restored cluster needs another "
                 "--cluster-id, so that nodes of the old one are refused by it",
                 (unsigned long long)in.cluster_id);
        return TK_EINVAL;
    }
    rc = install_file(o->file, o->data_dir, o->kv_no_sync, err, cap);
    if (rc == 0)
        rc = init_log(o, &in, err, cap);
    if (rc != 0) {
        /* Leave the directory empty, as it was, so the restore can be
         * retried; the LOCK goes too, still held by node_restore's
         * descriptor until it releases it. */
        nftw(o->data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        mkdir(o->data_dir, 0700);
        return rc;
    }
    if (info != NULL)
        *info = in;
    return 0;
}

int node_restore(const struct node_restore_options *o, struct kv_backup_info *info,
                 char *err, size_t cap)
{
    if (!raft_config_has(&o->members, o->id) || o->id == 0) {
        snprintf(err, cap, "node %llu is not a voter of the new membership",
                 (unsigned long long)o->id);
        return TK_EINVAL;
    }
    if (mkdir(o->data_dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, cap, "cannot create %s: %s", o->data_dir, strerror(errno));
        return TK_EIO;
    }
    /* Before the directory is read: a node running on it is not written
     * over, and no node starts on it while the restore writes. */
    char path[4096];
    snprintf(path, sizeof(path), "%s/" TK_DIRLOCK_FILE, o->data_dir);
    struct stat st;
    bool had_lock = lstat(path, &st) == 0;
    int lock_fd;
    int rc = tk_dirlock_take(o->data_dir, &lock_fd, err, cap);
    if (rc != 0)
        return rc;
    rc = restore_locked(o, info, err, cap);
    if (rc != 0 && !had_lock) {
        /* A refused restore leaves the directory as it found it. Removing
         * the LOCK while holding it is safe: a taker that locked the removed
         * file sees it is no longer named and takes the new one
         * (tk_dirlock_take). */
        unlink(path);
    }
    tk_dirlock_release(lock_fd);
    return rc;
}

/* The configuration in force at the end of the boot log. */
static int boot_config(const struct raft_boot *b, struct raft_config *out)
{
    for (size_t i = b->n_entries; i-- > 0;) {
        const struct raft_entry *e = &b->entries[i];
        if (e->type == RAFT_ENTRY_CONFIG)
            return raft_config_decode(e->data ? e->data->data : NULL,
                                      e->data ? e->data->len : 0, out);
    }
    *out = b->snapshot.config;
    return 0;
}

int node__force_config(struct node *n, struct raft_boot *boot, struct raft_entry **ents,
                       size_t *n_ents)
{
    struct raft_config now, only = {.n_voters = 1, .voters = {n->o.id}};
    int rc = boot_config(boot, &now);
    if (rc != 0)
        return rc;
    if (raft_config_equal(&now, &only)) {
        TK_LOG(TK_LOG_INFO, n->o.id, boot->hard_state.term,
               "--force-new-cluster: this node is already the only voter; nothing to do");
        return 0;
    }
    if (n->mem.epoch > 0) {
        /* After one forced recovery the others are members added to this
         * epoch's cluster: forcing again would fence off live nodes and run
         * two clusters under one id. */
        TK_LOG(
            TK_LOG_ERROR, n->o.id, boot->hard_state.term,
            "--force-new-cluster refused: this cluster was already recovered with "
            "--force-new-cluster (epoch %llu) and its configuration has other members "
            "(%u voters, %u learners) since; a second forced recovery is never allowed. "
            "Start without the flag; if the majority is gone for good, restore a backup "
            "into a new cluster (docs/operations.md, \"Backup and restore\")",
            (unsigned long long)n->mem.epoch, now.n_voters, now.n_learners);
        return TK_ECOMPARE;
    }
    uint64_t last = boot->snapshot.index, term = boot->snapshot.term;
    if (*n_ents > 0) {
        last = (*ents)[*n_ents - 1].index;
        term = (*ents)[*n_ents - 1].term;
    }
    if (term < boot->hard_state.term)
        term = boot->hard_state.term; /* an entry of the newest term this node saw */
    /* The configuration, then at once the epoch record (what marks the
     * configuration as forced, node__member_boot_fence), then a removed
     * record for each id dropped: every member of the new cluster, whenever
     * it joins, refuses them as strangers. */
    struct raft_entry e[2 + RAFT_MEMBERS_MAX];
    size_t k = 0;
    uint64_t epoch = n->mem.epoch + 1, ms = tk_wall_ms();
    e[k++] =
        (struct raft_entry){.type = RAFT_ENTRY_CONFIG, .data = raft_config_encode(&only)};
    e[k++] = (struct raft_entry){
        .type = RAFT_ENTRY_NORMAL, .time_ms = ms, .data = node__member_epoch_cmd(epoch)};
    for (uint32_t i = 0; i < now.n_voters + now.n_learners; i++) {
        uint64_t id = i < now.n_voters ? now.voters[i] : now.learners[i - now.n_voters];
        if (id != n->o.id)
            e[k++] = (struct raft_entry){.type = RAFT_ENTRY_NORMAL,
                                         .time_ms = ms,
                                         .data = node__member_removed_cmd(n, id)};
    }
    for (size_t i = 0; i < k; i++) {
        e[i].term = term;
        e[i].index = last + 1 + i;
    }
    rc = store_append(n->store, e, k);
    if (rc != 0) {
        for (size_t i = 0; i < k; i++)
            tk_blob_unref(e[i].data);
        return rc;
    }
    *ents = tk_realloc(*ents, (*n_ents + k) * sizeof(**ents));
    for (size_t i = 0; i < k; i++)
        (*ents)[(*n_ents)++] = e[i]; /* the array's references now */
    boot->entries = *ents;
    boot->n_entries = *n_ents;
    node__member_boot_fence(n, boot);
    TK_LOG(
        TK_LOG_WARN, n->o.id, term,
        "--force-new-cluster: entry %llu makes this node the only voter (epoch %llu); "
        "every entry it holds (through %llu) will be committed, and the %u other "
        "members are removed: they are refused if they come back. Add new nodes as new "
        "members under new ids, with empty data directories and tierkvd --join.",
        (unsigned long long)e[0].index, (unsigned long long)epoch,
        (unsigned long long)last, (unsigned)(k - 2));
    return 0;
}
