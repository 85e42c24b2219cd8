/* Per-follower replication progress (thesis 3.5 and 10.2; the probe /
 * replicate / snapshot states of etcd's raft).
 *
 * The inflight window is a ring sized once, at raft_new, to max_inflight_msgs:
 * it never allocates afterwards. A follower is paused when probing with a
 * message out, when in snapshot state, or when its window is full by count or
 * by bytes. */
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "raft/raft_internal.h"

void raft__pr_init(struct raft__progress *p, uint32_t inflight_max)
{
    memset(p, 0, sizeof(*p));
    p->infl_cap = inflight_max;
    p->infl_index = tk_calloc(inflight_max, sizeof(uint64_t));
    p->infl_bytes = tk_calloc(inflight_max, sizeof(uint64_t));
}

void raft__pr_free(struct raft__progress *p)
{
    tk_free(p->infl_index);
    tk_free(p->infl_bytes);
    p->infl_index = NULL;
    p->infl_bytes = NULL;
}

void raft__pr_infl_reset(struct raft__progress *p)
{
    p->infl_start = 0;
    p->infl_count = 0;
    p->infl_total_bytes = 0;
}

void raft__pr_reset(struct raft__progress *p, uint64_t id, uint64_t next)
{
    p->id = id;
    p->match = 0;
    p->next = next;
    p->state = RAFT__PR_PROBE;
    p->probe_sent = false;
    p->recent_active = true;
    p->pending_snapshot = 0;
    p->snapshot_ticks = 0;
    p->stall_ticks = 0;
    p->read_round = 0;
    p->round_target = 0;
    p->round_start = 0;
    p->round_ticks = 0;
    p->rounds = 0;
    raft__pr_infl_reset(p);
}

void raft__pr_become_probe(struct raft__progress *p)
{
    /* After a snapshot, resume just past it; otherwise past what matches. */
    uint64_t next = p->match + 1;
    if (p->state == RAFT__PR_SNAPSHOT && p->pending_snapshot + 1 > next)
        next = p->pending_snapshot + 1;
    p->state = RAFT__PR_PROBE;
    p->next = next;
    p->probe_sent = false;
    p->pending_snapshot = 0;
    p->stall_ticks = 0;
    raft__pr_infl_reset(p);
}

void raft__pr_become_replicate(struct raft__progress *p)
{
    p->state = RAFT__PR_REPLICATE;
    p->next = p->match + 1;
    p->probe_sent = false;
    p->pending_snapshot = 0;
    p->stall_ticks = 0;
    raft__pr_infl_reset(p);
}

void raft__pr_become_snapshot(struct raft__progress *p, uint64_t index)
{
    p->state = RAFT__PR_SNAPSHOT;
    p->pending_snapshot = index;
    p->snapshot_ticks = 0;
    p->probe_sent = false;
    raft__pr_infl_reset(p);
}

bool raft__pr_paused(const struct raft__progress *p, uint64_t bytes_max)
{
    switch (p->state) {
    case RAFT__PR_PROBE:
        return p->probe_sent;
    case RAFT__PR_REPLICATE:
        return p->infl_count >= p->infl_cap || p->infl_total_bytes >= bytes_max;
    default:
        return true;
    }
}

void raft__pr_infl_add(struct raft__progress *p, uint64_t last, uint64_t bytes)
{
    TK_ASSERT(p->infl_count < p->infl_cap);
    uint32_t at = (p->infl_start + p->infl_count) % p->infl_cap;
    p->infl_index[at] = last;
    p->infl_bytes[at] = bytes;
    p->infl_count++;
    p->infl_total_bytes += bytes;
}

void raft__pr_infl_free_to(struct raft__progress *p, uint64_t index)
{
    while (p->infl_count > 0 && p->infl_index[p->infl_start] <= index)
        raft__pr_infl_free_first(p);
}

void raft__pr_infl_free_first(struct raft__progress *p)
{
    if (p->infl_count == 0)
        return;
    p->infl_total_bytes -= p->infl_bytes[p->infl_start];
    p->infl_start = (p->infl_start + 1) % p->infl_cap;
    p->infl_count--;
}
