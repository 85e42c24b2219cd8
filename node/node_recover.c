/* Recovery: locks the node's data directory (base/dirlock.h: one process per
 * directory), opens its log (a directory, or a memory volume) and its
 * state machine, checks that they belong to this node and continue each
 * other, and creates the Raft core from what they hold.
 *
 * Invariants on success: the state machine is at or past the last snapshot,
 * and the stored log covers every index after the state machine's (the core
 * gets the whole log, so it can serve lagging followers from it, and starts
 * applying after the state machine's index).
 *
 * Called once by node.c (node_init), on the loop's thread before the loop
 * runs; calls node_restore.c (node__force_config), node_member.c (the boot
 * fence) and node_tier.c (node__tier_mark). Errors are logged with what
 * failed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "base/dirlock.h"
#include "base/err.h"
#include "base/log.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "store/store.h"

/* Room, in entries, for the in-memory logs (the core's and a memory volume's)
 * from the start: twice what they hold at most between snapshots (the
 * interval, the trailing window, what a snapshot job lets pass meanwhile), so
 * they never grow (copying millions of entries) in the middle of a write, and
 * moving the live entries to the front of the array happens rarely. Pages are
 * only touched as they fill. At most 8M entries (about 320 MiB of address
 * space): past that, or without an entry threshold, the logs grow as needed. */
#define RESERVE_HOLD_MAX ((uint64_t)4 << 20) /* beyond: grow as needed */

static size_t log_reserve(const struct node *n)
{
    uint64_t se = n->o.snapshot_entries, te = n->o.trailing_entries;
    if (se == 0 || se > RESERVE_HOLD_MAX || te > RESERVE_HOLD_MAX)
        return (size_t)(2 * RESERVE_HOLD_MAX);
    uint64_t hold = se + se / 4 + te + 65536; /* no overflow: each <= 4M */
    if (hold > RESERVE_HOLD_MAX)
        hold = RESERVE_HOLD_MAX;
    return (size_t)(2 * hold);
}

/* Locks the data directory (base/dirlock.h) and opens the log under
 * data_dir/log, or opens it on the memory volume. */
static int open_log(struct node *n, struct store_boot *sb)
{
    char path[4096];
    char err[STORE_ERRMSG_MAX] = "";
    struct store_options so;
    store_options_default(&so);
    so.queue_max = NODE_PERSIST_MAX;
    so.fileops = n->o.store_fileops;
    int rc;
    if (n->o.data_dir != NULL) {
        if (mkdir(n->data_dir, 0700) != 0 && errno != EEXIST) {
            TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot create the data directory %s: %s",
                   n->data_dir, strerror(errno));
            return TK_EIO;
        }
        /* Before anything in it is read: one process per data directory.
         * node.c's node_free releases it, after the log and the KV close. */
        char lerr[TK_DIRLOCK_MSG_MAX];
        rc = tk_dirlock_take(n->data_dir, &n->dir_lock_fd, lerr, sizeof(lerr));
        if (rc != 0) {
            TK_LOG(TK_LOG_ERROR, n->o.id, 0, "%s", lerr);
            return rc;
        }
        n->dir_locked = true;
        snprintf(path, sizeof(path), "%s/log", n->data_dir);
        rc = store_open_fs(path, &so, &n->store, sb, err, sizeof(err));
    } else {
        n->volume = n->o.volume;
        if (n->volume == NULL) {
            n->volume = store_mem_volume_new();
            n->own_volume = true;
        }
        store_mem_volume_reserve(n->volume, log_reserve(n));
        rc = store_open_mem(n->volume, &so, &n->store, sb, err, sizeof(err));
    }
    if (rc != 0)
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot open the log: %s", err);
    return rc;
}

/* A new log records the bootstrap membership and this node's ids; an old one
 * must be this node's. */
static int claim_log(struct node *n, struct store_boot *sb)
{
    if (!sb->has_bootstrap) {
        int rc = store_save_bootstrap(n->store, &n->o.members);
        if (rc == 0)
            rc = store_save_ids(n->store, n->o.cluster_id, n->o.id);
        if (rc != 0)
            return rc;
        sb->bootstrap = n->o.members;
    } else if (sb->node_id != 0 && sb->node_id != n->o.id) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "the data directory belongs to node %llu, not %llu",
               (unsigned long long)sb->node_id, (unsigned long long)n->o.id);
        return TK_EINVAL;
    }
    return 0;
}

/* The data directory's incarnation: drawn and saved when it has none (a new
 * directory, or one from before incarnations existed). */
static int claim_incarnation(struct node *n, const struct store_boot *sb)
{
    if (sb->has_incarnation) {
        memcpy(n->mem.incarnation, sb->incarnation, sizeof(n->mem.incarnation));
        return 0;
    }
    if (getrandom(n->mem.incarnation, sizeof(n->mem.incarnation), 0) !=
        (ssize_t)sizeof(n->mem.incarnation)) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "getrandom: %s", strerror(errno));
        return TK_EIO;
    }
    return store_save_incarnation(n->store, n->mem.incarnation);
}

/* Does the log need the reset an interrupted install at `p` would have
 * done? When it ends before the snapshot, or holds a different entry at its
 * index (a diverging follower's: the install replaced it). */
static bool install_log_stale(struct node *n, const struct store_boot *sb,
                              const struct raft_snapshot_meta *p)
{
    if (p->index > sb->last_index)
        return true;
    if (p->index + 1 == sb->first_index)
        return sb->prev_term != p->term;
    uint64_t term = 0;
    return p->index >= sb->first_index &&
           (store_term_at(n->store, p->index, &term) != 0 || term != p->term);
}

/* An install published its state (the KV holds the snapshot) but the log
 * store was not reset to it, or its descriptor not saved, before a crash or
 * a failure (node_install.c): the pending descriptor the install saved first
 * finishes it, as the install would have. A pending descriptor left by an
 * install that never published names an index the KV is behind, or reached
 * by applying the log (whose entry there is then the snapshot's): nothing to
 * do. */
static int finish_install(struct node *n, struct store_boot *sb, uint64_t applied)
{
    const struct raft_snapshot_meta *p = &sb->pending;
    if (p->index == 0 || p->index != applied || p->index <= sb->snapshot.index ||
        kv_sm_applied_term(n->sm) != p->term)
        return 0;
    int rc = 0;
    bool reset = install_log_stale(n, sb, p);
    if (!reset && sb->first_index != p->index + 1)
        return 0; /* the log reached it by applying: nothing was interrupted */
    TK_LOG(TK_LOG_WARN, n->o.id, 0,
           "finishing a snapshot install at %llu interrupted before %s (log %llu..%llu)",
           (unsigned long long)applied,
           reset ? "the log was reset" : "its descriptor was saved",
           (unsigned long long)sb->first_index, (unsigned long long)sb->last_index);
    if (reset) {
        rc = store_reset(n->store, p->index, p->term);
        sb->first_index = p->index + 1;
        sb->last_index = p->index;
        sb->prev_term = p->term;
    }
    if (rc == 0 && sb->first_index == p->index + 1)
        rc = store_save_snapshot(n->store, p);
    if (rc == 0 && sb->first_index == p->index + 1)
        sb->snapshot = *p;
    if (rc != 0)
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot finish the snapshot install at %llu: %s",
               (unsigned long long)applied, tk_strerror(rc));
    return rc;
}

/* Opens the state machine under data_dir/kv, finishes an interrupted
 * install (finish_install) and checks that the log continues it. */
static int open_sm(struct node *n, struct store_boot *sb)
{
    char path[4096];
    struct kv_config kc;
    kv_config_default(&kc);
    snprintf(path, sizeof(path), "%s/kv", n->data_dir);
    kc.dir = path;
    kc.no_sync = n->o.kv_no_sync;
    kc.background_tier = true;
    if (n->o.kv_map_bytes != 0)
        kc.map_bytes = n->o.kv_map_bytes;
    if (n->o.kv_ring_bytes != 0)
        kc.ring_bytes = n->o.kv_ring_bytes;
    if (n->o.kv_writeback_pace != 0)
        kc.writeback_pace =
            n->o.kv_writeback_pace > 0 ? (unsigned)n->o.kv_writeback_pace : 0;
    if (n->o.snapshot_read_pace != 0)
        kc.read_pace =
            n->o.snapshot_read_pace > 0 ? (unsigned)n->o.snapshot_read_pace : 0;
    if (n->o.events_max != 0 || n->o.events_bytes != 0) {
        kc.events_max = n->o.events_max;
        kc.events_bytes = n->o.events_bytes ? n->o.events_bytes : kc.events_bytes;
    }
    int rc = kv_sm_open(&kc, &n->sm);
    if (rc != 0) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0, "cannot open the state machine in %s: %s", path,
               tk_strerror(rc));
        return rc;
    }
    uint64_t applied = kv_sm_applied_index(n->sm);
    if ((rc = finish_install(n, sb, applied)) != 0)
        return rc;
    if (applied < sb->snapshot.index) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "state machine at %llu is behind the snapshot at %llu",
               (unsigned long long)applied, (unsigned long long)sb->snapshot.index);
        return TK_ECORRUPT;
    }
    if (applied + 1 < sb->first_index || applied > sb->last_index) {
        TK_LOG(TK_LOG_ERROR, n->o.id, 0,
               "log %llu..%llu does not continue the state machine at %llu",
               (unsigned long long)sb->first_index, (unsigned long long)sb->last_index,
               (unsigned long long)applied);
        return TK_ECORRUPT;
    }
    return 0;
}

/* Reads the whole stored log into `boot`; *ents is the caller's to free with
 * store_entries_free, even on error. */
static int read_boot(struct node *n, const struct store_boot *sb, struct raft_boot *boot,
                     struct raft_entry **ents, size_t *n_ents)
{
    if (sb->first_index <= sb->last_index) {
        int rc =
            store_read(n->store, sb->first_index, sb->last_index + 1, 0, ents, n_ents);
        if (rc != 0)
            return rc;
    }
    memset(boot, 0, sizeof(*boot));
    boot->hard_state = sb->hard_state;
    boot->snapshot.index = sb->first_index - 1;
    boot->snapshot.term = sb->prev_term;
    boot->snapshot.config = sb->snapshot.index > 0 ? sb->snapshot.config : sb->bootstrap;
    boot->entries = *ents;
    boot->n_entries = *n_ents;
    boot->bootstrap = sb->bootstrap;
    boot->applied = kv_sm_applied_index(n->sm);
    node__tier_snap_at(n, sb->snapshot.index);
    /* The entries the state machine holds already are not applied again:
     * count them here, while they are hot, so that the marks of the bytes
     * applied reach back to the log's start (a mark of 0 bytes before its
     * first entry) and the first snapshot after a restart finds its trailing
     * window without reading 10,000 cold entries on the loop (5.5 ms at 10M
     * keys). */
    node__tier_mark(n, sb->first_index - 1);
    for (size_t i = 0; i < *n_ents && (*ents)[i].index <= boot->applied; i++)
        node__tier_count(n, (*ents)[i].index,
                         (*ents)[i].data != NULL ? (*ents)[i].data->len : 0);
    return 0;
}

int node__recover(struct node *n)
{
    struct store_boot sb;
    int rc = open_log(n, &sb);
    if (rc == 0)
        rc = claim_log(n, &sb);
    if (rc == 0)
        rc = claim_incarnation(n, &sb);
    if (rc == 0)
        rc = open_sm(n, &sb);
    struct raft_boot boot;
    struct raft_entry *ents = NULL;
    size_t n_ents = 0;
    if (rc == 0)
        rc = read_boot(n, &sb, &boot, &ents, &n_ents);
    if (rc == 0)
        node__member_boot_fence(n, &boot);
    if (rc == 0 && n->o.force_new_cluster)
        rc = node__force_config(n, &boot, &ents, &n_ents);
    if (rc == 0) {
        struct raft_options ro;
        raft_options_default(&ro);
        ro.id = n->o.id;
        ro.seed = n->o.seed;
        ro.election_ticks = n->o.election_ticks;
        ro.heartbeat_ticks = n->o.heartbeat_ticks;
        /* Finer readies than the core's 4,096, so that the loop can stop
         * applying after NODE_APPLY_TURN_NS (node.c) between two of them. */
        ro.max_apply_entries = 1024;
        ro.log_reserve = log_reserve(n);
        rc = raft_new(&ro, &boot, &n->raft);
        if (rc == TK_ECORRUPT)
            TK_LOG(
                TK_LOG_ERROR, n->o.id, 0,
                "the log in %s holds a term above the ceiling (2^62): no cluster gets "
                "there by elections, so a forged message stored it before the term "
                "guard existed. This node's data cannot be used: remove the member, wipe "
                "its data directory and add it again (docs/operations.md, \"Replace a "
                "failed node\")",
                n->o.data_dir != NULL ? n->o.data_dir : "memory");
    }
    store_entries_free(ents, n_ents);
    return rc;
}
