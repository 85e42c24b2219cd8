/* Leader duties: the commands a leader proposes on its own.
 *
 * Each duty (struct node_duty) builds its next command from the leader's
 * state and clock: the expire command of keys whose TTL ran out
 * (node_expire.c), the revoke of a lease past its deadline and the checkpoint
 * of the leases' remaining TTLs (node_lease.c). node__duty_due runs them once
 * per tick (node__duty_due), on the leader only: a duty with a command in
 * flight is skipped; a command built goes out in the duty's own request, and
 * the duty is busy until that request is answered, however it ends; one the
 * queue refuses is dropped (node__duty_refused; the next tick builds it
 * again). A new leader finds the same work
 * due in its own copy of the state. Loop thread only. Calls node_expire.c and
 * node_lease.c for the commands; node.c submits them. */
#include <string.h>

#include "base/blob.h"
#include "node/node_internal.h"

static void on_answered(struct node_req *req, int status, const struct kv_result *res,
                        void *data)
{
    (void)req;
    struct node_duty *d = data;
    d->busy = false;
    if (status == 0 && res != NULL && res->code == 0)
        d->done++;
}

void node__duty_init(struct node *n)
{
    static const struct {
        node_duty_build *build;
        uint8_t mode;
    } duties[NODE_DUTY_N] = {
        [NODE_DUTY_EXPIRE] = {node__expire_build, NODE_MODE_APPLIED},
        [NODE_DUTY_REVOKE] = {node__lease_revoke_build, NODE_MODE_APPLIED},
        [NODE_DUTY_CHECKPOINT] = {node__lease_checkpoint_build, NODE_MODE_COMMITTED},
    };
    for (int i = 0; i < NODE_DUTY_N; i++) {
        n->duty[i].build = duties[i].build;
        n->duty[i].mode = duties[i].mode;
    }
}

size_t node__duty_due(struct node *n, uint64_t now_ms, struct node_req **out)
{
    bool leader = raft_role(n->raft) == RAFT_LEADER;
    node__lease_role(n, leader, now_ms);
    if (!leader)
        return 0;
    size_t k = 0;
    for (int i = 0; i < NODE_DUTY_N; i++) {
        struct node_duty *d = &n->duty[i];
        if (d->busy)
            continue;
        struct tk_blob *cmd = d->build(n, now_ms);
        if (cmd == NULL)
            continue;
        struct node_req *r = &d->req;
        memset(r, 0, sizeof(*r));
        r->mode = d->mode;
        r->cmd = cmd;
        r->write_cb = on_answered;
        r->data = d;
        d->busy = true;
        d->proposed++;
        out[k++] = r;
    }
    return k;
}

void node__duty_refused(struct node_req *r)
{
    struct node_duty *d = r->data;
    tk_blob_unref(r->cmd);
    r->cmd = NULL;
    d->busy = false;
    d->proposed--;
}
