/* Backups: a consistent snapshot stream for a client (the gateway's GET
 * /v1/snapshot), taken by the Raft snapshot path (node_tier.c), so that no
 * second copy of the state is made and the loop never reads LMDB for it.
 *
 * A backup asks for a snapshot at or past the index applied when it was
 * asked. node__backup_turn, once per loop turn, hands the newest snapshot
 * blob (n->tier.blob, with its index) to every waiting backup it satisfies,
 * and raises n->backups.wanted while one still waits: node_tier.c then
 * starts a snapshot job at once instead of at the next interval.
 *
 * Called by node.c (close) and node_tier.c (each turn); calls no other file
 * of node/. Loop thread only. */
#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "kv/kv.h"
#include "node/node_internal.h"

struct node_backup {
    node_backup_cb *cb;
    void *data;
    uint64_t target; /* the applied index when asked */
    struct node_backup *next;
};

uint64_t node_cluster_id(const struct node *n)
{
    return n->o.cluster_id;
}

int node_backup_start(struct node *n, node_backup_cb *cb, void *data,
                      struct node_backup **out)
{
    if (n->loop.closing)
        return TK_ESHUTDOWN;
    if (n->persist.failed)
        return TK_EIO;
    if (n->backups.n >= NODE_BACKUPS_MAX)
        return TK_EBUSY;
    struct node_backup *b = tk_calloc(1, sizeof(*b));
    b->cb = cb;
    b->data = data;
    b->target = kv_sm_applied_index(n->sm);
    b->next = n->backups.head;
    n->backups.head = b;
    n->backups.n++;
    node__kick(n); /* the next turn delivers it, or asks for a snapshot */
    *out = b;
    return 0;
}

static void unlink_backup(struct node *n, struct node_backup *b)
{
    for (struct node_backup **p = &n->backups.head; *p != NULL; p = &(*p)->next) {
        if (*p == b) {
            *p = b->next;
            n->backups.n--;
            return;
        }
    }
}

/* Runs b's callback and frees it (already unlinked). */
static void finish(struct node_backup *b, int status, struct tk_blob *blob,
                   uint64_t index, uint64_t term)
{
    node_backup_cb *cb = b->cb;
    void *data = b->data;
    tk_free(b);
    cb(status, blob, index, term, data);
}

void node__backup_fail_all(struct node *n, int status)
{
    while (n->backups.head != NULL) {
        struct node_backup *b = n->backups.head;
        unlink_backup(n, b);
        finish(b, status, NULL, 0, 0);
    }
}

uint64_t node__backup_target(const struct node *n)
{
    uint64_t target = 0;
    for (const struct node_backup *b = n->backups.head; b != NULL; b = b->next)
        if (b->target > target)
            target = b->target;
    return target;
}

void node__backup_turn(struct node *n)
{
    if (n->backups.head == NULL) {
        n->backups.wanted = false;
        return;
    }
    if (n->persist.failed) {
        node__backup_fail_all(n, TK_EIO);
        return;
    }
    bool waiting = false;
    struct node_backup **p = &n->backups.head;
    while (*p != NULL) {
        struct node_backup *b = *p;
        if (n->tier.blob == NULL || n->tier.blob_index < b->target) {
            waiting = true;
            p = &b->next;
            continue;
        }
        *p = b->next;
        n->backups.n--;
        /* A callback may start or cancel other backups: it runs unlinked,
         * and the walk restarts from the head after it. */
        finish(b, 0, tk_blob_ref(n->tier.blob), n->tier.blob_index, n->tier.blob_term);
        p = &n->backups.head;
        waiting = false;
    }
    n->backups.wanted = waiting;
}
