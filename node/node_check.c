/* The node's invariants, checked after each loop turn in debug builds.
 *
 * node.c calls node__check at the end of each turn when NDEBUG is not defined
 * (the project's builds: b_ndebug=false) and aborts naming the broken
 * invariant; a unit test (tests/unit/node/node_check_test.c) breaks each one
 * on a state of its own to prove the check fails. Each check is bounded: a
 * list or the persist ring is walked for at most CHECK_WALK entries, so a
 * turn pays well under a microsecond whatever is queued. The invariants:
 *  - a request list's head, tail and count agree: all empty or none; its
 *    walk reaches the tail in exactly `n` steps (when n <= CHECK_WALK) and
 *    never finds more than `n`;
 *  - the write lists (applied, committed) hold writes that have an index and
 *    gave their command's reference to the log; the read lists hold reads;
 *    forwarded writes hold writes;
 *  - the persist ring: head < cap and n <= cap; the seqs it holds rise
 *    strictly from its head;
 *  - every leader duty has its builder, and one in flight has its request
 *    answering to it.
 * Loop thread only; calls no other node file. */
#include <stddef.h>

#include "node/node_internal.h"

#define CHECK_WALK 64

static const char *check_list(const struct req_list *l, int is_read, bool proposed)
{
    if ((l->head == NULL) != (l->tail == NULL) || (l->head == NULL) != (l->n == 0))
        return "a request list's head, tail and count disagree";
    size_t k = 0;
    const struct node_req *r = l->head, *last = NULL;
    for (; r != NULL && k < CHECK_WALK; r = r->next, k++) {
        if (k == l->n)
            return "a request list holds more than its count";
        if (r->is_read != is_read)
            return "a request is on a list of the other kind";
        if (proposed && (r->index == 0 || r->cmd != NULL))
            return "a proposed write has no index or still holds its command";
        last = r;
    }
    if (l->n <= CHECK_WALK && (k != l->n || last != l->tail))
        return "a request list's walk does not end at its tail after its count";
    return NULL;
}

const char *node__check_lists(const struct node_requests *q, const struct req_list *fwd,
                              const struct req_list *gate)
{
    const char *e = check_list(&q->applied_wait, 0, true);
    if (e == NULL)
        e = check_list(&q->committed_wait, 0, true);
    if (e == NULL)
        e = check_list(&q->read_wait, 1, false);
    if (e == NULL)
        e = check_list(&q->read_ready, 1, false);
    if (e == NULL)
        e = check_list(fwd, 0, false);
    if (e == NULL)
        e = check_list(gate, 0, false);
    return e;
}

const char *node__check_persist(const struct node_persist *p)
{
    if (p->n > p->cap || (p->cap > 0 && p->head >= p->cap) || (p->cap == 0 && p->n > 0))
        return "the persist ring's head or count is past its capacity";
    for (size_t i = 1; i < p->n && i < CHECK_WALK; i++)
        if (p->seq[(p->head + i) % p->cap] <= p->seq[(p->head + i - 1) % p->cap])
            return "the persist ring's seqs do not rise from its head";
    if (p->n > 1 && p->seq[(p->head + p->n - 1) % p->cap] <= p->seq[p->head])
        return "the persist ring's last seq is not above its first";
    return NULL;
}

const char *node__check(const struct node *n)
{
    const char *e = node__check_lists(&n->req, &n->fwd.wait, &n->gate.held);
    if (e == NULL)
        e = node__check_persist(&n->persist);
    for (int i = 0; e == NULL && i < NODE_DUTY_N; i++) {
        const struct node_duty *d = &n->duty[i];
        if (d->build == NULL)
            e = "a leader duty has no builder";
        else if (d->busy && (d->req.write_cb == NULL || d->req.data != d))
            e = "a leader duty in flight has no request answering to it";
    }
    return e;
}
