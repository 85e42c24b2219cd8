/* Leases on the leader: expiry and checkpoints.
 *
 * The lease table is replicated (kv/lease.c); its clock is the leader's. On
 * becoming leader, and on stepping down, the node forgets every deadline
 * (kv_sm_lease_reset): a leader's deadlines are set from the replicated
 * remaining TTLs, so a new leader resumes each lease where the last
 * checkpoint left it, never from the full TTL. Each tick the leader proposes
 * a revoke (kvpb.LeaseRevoke, expired) for one lease past its deadline, and,
 * every lease_checkpoint_ms, a checkpoint (kvpb.LeaseCheckpoint) of the
 * remaining TTLs of up to CKPT_MAX leases (the next ones after the last
 * batch, wrapping). A lease thus outlives its TTL by at most, per leader
 * change, the checkpoint interval plus the time to elect the next leader.
 * One revoke and one checkpoint in flight at a time. Loop thread only.
 * node.c calls node__lease_next once per tick and submits what it returns;
 * this file calls no other node file. */
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "node/node_internal.h"

#define CKPT_MAX 512 /* leases per checkpoint command */

static void on_revoked(struct node_req *req, int status, const struct kv_result *res,
                       void *data)
{
    (void)req;
    struct node *n = data;
    n->lease.revoke_busy = false;
    if (status == 0 && res != NULL && res->code == 0)
        n->lease.revoked++;
}

static void on_checkpointed(struct node_req *req, int status, const struct kv_result *res,
                            void *data)
{
    (void)req;
    (void)status;
    (void)res;
    struct node *n = data;
    n->lease.ckpt_busy = false;
}

static struct tk_blob *pack(const Kvpb__Command *cmd)
{
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *b = tk_blob_new(len);
    kvpb__command__pack(cmd, b->data);
    return b;
}

/* Fills the node's own request `r` for `cmd` and marks it busy. */
static struct node_req *own_req(struct node *n, struct node_req *r, uint8_t mode,
                                const Kvpb__Command *cmd, node_write_cb *cb, bool *busy)
{
    memset(r, 0, sizeof(*r));
    r->mode = mode;
    r->cmd = pack(cmd);
    r->write_cb = cb;
    r->data = n;
    *busy = true;
    return r;
}

static struct node_req *revoke_next(struct node *n, uint64_t now_ms)
{
    uint64_t id, renewed;
    if (n->lease.revoke_busy || kv_sm_lease_due(n->sm, now_ms, &id, &renewed, 1) == 0)
        return NULL;
    Kvpb__LeaseRevoke rv = KVPB__LEASE_REVOKE__INIT;
    rv.id = id;
    rv.expired = true;
    rv.renewed = renewed;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    cmd.lease_revoke = &rv;
    return own_req(n, &n->lease.revoke_req, NODE_MODE_APPLIED, &cmd, on_revoked,
                   &n->lease.revoke_busy);
}

static struct node_req *checkpoint_next(struct node *n, uint64_t now_ms)
{
    if (n->lease.ckpt_busy || now_ms < n->lease.next_ckpt_ms)
        return NULL;
    n->lease.next_ckpt_ms = now_ms + n->o.lease_checkpoint_ms;
    uint64_t *ids = n->lease.ids, *rem = n->lease.rem;
    size_t got = kv_sm_lease_list(n->sm, n->lease.ckpt_after, now_ms, ids, rem, CKPT_MAX);
    if (got == 0 && n->lease.ckpt_after != 0) {
        n->lease.ckpt_after = 0; /* wrap */
        got = kv_sm_lease_list(n->sm, 0, now_ms, ids, rem, CKPT_MAX);
    }
    if (got == 0)
        return NULL;
    n->lease.ckpt_after = ids[got - 1];
    Kvpb__LeaseCheckpoint ck = KVPB__LEASE_CHECKPOINT__INIT;
    ck.n_ids = ck.n_remaining_ms = got;
    ck.ids = ids;
    ck.remaining_ms = rem;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_CHECKPOINT;
    cmd.lease_checkpoint = &ck;
    return own_req(n, &n->lease.ckpt_req, NODE_MODE_COMMITTED, &cmd, on_checkpointed,
                   &n->lease.ckpt_busy);
}

void node__lease_init(struct node *n)
{
    n->lease.ids = tk_calloc(CKPT_MAX, sizeof(uint64_t));
    n->lease.rem = tk_calloc(CKPT_MAX, sizeof(uint64_t));
}

void node__lease_free(struct node *n)
{
    tk_free(n->lease.ids);
    tk_free(n->lease.rem);
    n->lease.ids = n->lease.rem = NULL;
}

size_t node__lease_next(struct node *n, uint64_t now_ms, struct node_req **out)
{
    bool leader = raft_role(n->raft) == RAFT_LEADER;
    if (leader != n->lease.leader) {
        kv_sm_lease_reset(n->sm); /* deadlines are the leader's alone */
        n->lease.leader = leader;
        n->lease.next_ckpt_ms = now_ms + n->o.lease_checkpoint_ms;
    }
    if (!leader || kv_sm_lease_count(n->sm) == 0)
        return 0;
    size_t k = 0;
    struct node_req *r = revoke_next(n, now_ms);
    if (r != NULL)
        out[k++] = r;
    r = checkpoint_next(n, now_ms);
    if (r != NULL)
        out[k++] = r;
    return k;
}
