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
 * The revoke and the checkpoint are leader duties (node_duty.c runs them,
 * one of each in flight at a time). Loop thread only; calls no other node
 * file. */
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "node/node_internal.h"

#define CKPT_MAX 512 /* leases per checkpoint command */

static struct tk_blob *pack(const Kvpb__Command *cmd)
{
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *b = tk_blob_new(len);
    kvpb__command__pack(cmd, b->data);
    return b;
}

struct tk_blob *node__lease_revoke_build(struct node *n, uint64_t now_ms)
{
    uint64_t id, renewed;
    if (kv_sm_lease_count(n->sm) == 0 ||
        kv_sm_lease_due(n->sm, now_ms, &id, &renewed, 1) == 0)
        return NULL;
    Kvpb__LeaseRevoke rv = KVPB__LEASE_REVOKE__INIT;
    rv.id = id;
    rv.expired = true;
    rv.renewed = renewed;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    cmd.lease_revoke = &rv;
    return pack(&cmd);
}

struct tk_blob *node__lease_checkpoint_build(struct node *n, uint64_t now_ms)
{
    if (kv_sm_lease_count(n->sm) == 0 || now_ms < n->lease.next_ckpt_ms)
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
    return pack(&cmd);
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

void node__lease_role(struct node *n, bool leader, uint64_t now_ms)
{
    if (leader != n->lease.leader) {
        kv_sm_lease_reset(n->sm); /* deadlines are the leader's alone */
        n->lease.leader = leader;
        n->lease.next_ckpt_ms = now_ms + n->o.lease_checkpoint_ms;
    }
}
