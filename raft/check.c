/* The invariants of a struct raft, checked after every input that changes it.
 *
 * raft.c calls raft__check_invariants() at the end of each public mutator
 * (raft_step, raft_tick, raft_propose, raft_persisted, raft_applied,
 * raft_read_index, raft_transfer_leadership, raft_snapshot_set, raft_compact,
 * raft_advance; not raft_ready, which raft_advance always follows); a unit
 * test (raft_features_test.c) corrupts a state to prove it can fail. It is always on,
 * like TK_ASSERT: the simulator finds a broken invariant in a trace, this finds it in
 * production. Each check is O(1) or O(voters), never O(log), and one condition per
 * TK_ASSERT so a failure names the broken part. Its cost, measured with callgrind on
 * raft-perf-probe (in-process, pipelined, with membership): about 120 instructions a
 * call, 1.4% of the process's instructions, below the 2% that would justify a build
 * option to turn it off. The configuration's shape is checked when it is set
 * (raft__check_config), not here: its pairwise id check had made this 3.4%.
 *
 * Only what the core's own code guarantees is checked, whatever peers send or
 * storage recovered: the boot state (from files) is validated by raft_new only
 * as far as indexes go, so entry terms against the current term are not
 * checked here. The invariants (raft.c's header states the first three):
 *  - stable <= last, and unstable (the first index not handed to storage)
 *    <= last + 1;
 *  - applied <= applying <= commit <= last, and the snapshot base <= applied;
 *  - applying <= stable, except that an installed snapshot is handed out whole
 *    before it is durable (applying is then the snapshot's index);
 *  - the log's array holds exactly the indexes base + 1 .. base + n;
 *  - persisted seq <= handed seq < next seq;
 *  - the term is at most RAFT_TERM_CEIL (raft.h);
 *  - a leader leads itself and voted for itself in a term that is durable; a
 *    candidate voted for itself; neither knows another leader;
 *  - only a leader transfers leadership, waits on reads, or has committed in
 *    its term;
 *  - the configuration has 1 .. RAFT_VOTERS_MAX voters, at most
 *    RAFT_LEARNERS_MAX learners, no id twice and no id 0 (raft__check_config,
 *    when it is set); the index of the entry that set it is in the log (or 0);
 *  - a leader's progress entries follow the members (voters, then learners),
 *    and for each: match < next <= last + 1, and its read round <= the
 *    leader's;
 *  - a leader that is not a voter (it removed or demoted itself) still has
 *    that change uncommitted: it steps down when it commits. */
#include "base/assert.h"
#include "raft/raft_internal.h"

static void check_log(const struct raft *r)
{
    const struct raft__log *l = &r->log;
    TK_ASSERT(l->head + l->n <= l->cap);
    if (l->n == 0)
        return;
    TK_ASSERT(l->ents[l->head].index == l->base_index + 1);
    TK_ASSERT(l->ents[l->head + l->n - 1].index == l->base_index + l->n);
}

static void check_indexes(const struct raft *r)
{
    uint64_t last = raft__log_last_index(&r->log);
    TK_ASSERT(r->stable <= last);
    TK_ASSERT(r->unstable <= last + 1);
    TK_ASSERT(r->commit <= last);
    TK_ASSERT(r->applying <= r->commit);
    TK_ASSERT(r->applied <= r->applying);
    TK_ASSERT(r->log.base_index <= r->applied);
    TK_ASSERT(r->applying <= r->stable || r->applying == r->log.base_index);
    TK_ASSERT(r->persisted_seq <= r->handed_seq);
    TK_ASSERT(r->handed_seq < r->next_seq);
    TK_ASSERT(r->n_reads <= RAFT__READS_MAX);
}

/* The configuration's own shape: checked when it is set (config_set in raft.c), not
 * after every call, since the pairwise id check is O(members^2) and a configuration
 * changes only with a config entry. */
void raft__check_config(const struct raft_config *c)
{
    TK_ASSERT(c->n_voters >= 1);
    TK_ASSERT(c->n_voters <= RAFT_VOTERS_MAX);
    TK_ASSERT(c->n_learners <= RAFT_LEARNERS_MAX);
    for (uint32_t i = 0; i < c->n_voters + c->n_learners; i++) {
        uint64_t id = i < c->n_voters ? c->voters[i] : c->learners[i - c->n_voters];
        TK_ASSERT(id != RAFT_NONE);
        for (uint32_t j = 0; j < i; j++) {
            uint64_t o = j < c->n_voters ? c->voters[j] : c->learners[j - c->n_voters];
            TK_ASSERT(o != id);
        }
    }
}

static void check_config_index(const struct raft *r)
{
    TK_ASSERT(r->config.n_voters >= 1);
    TK_ASSERT(r->config_index <= raft__log_last_index(&r->log));
    TK_ASSERT(r->config_index == 0 || r->config_index > r->log.base_index);
}

static void check_role(const struct raft *r)
{
    TK_ASSERT(r->term <= RAFT_TERM_CEIL);
    TK_ASSERT(r->role <= RAFT_LEADER);
    if (r->role == RAFT_LEADER) {
        TK_ASSERT(r->leader == r->o.id);
        TK_ASSERT(r->vote == r->o.id);
        TK_ASSERT(r->self_vote_durable);
        TK_ASSERT(r->self_vote_seq <= r->persisted_seq);
        return;
    }
    if (r->role == RAFT_CANDIDATE) {
        TK_ASSERT(r->vote == r->o.id);
        TK_ASSERT(r->self_vote_durable || r->self_vote_seq > r->persisted_seq);
    }
    if (r->role != RAFT_FOLLOWER)
        TK_ASSERT(r->leader == RAFT_NONE);
    TK_ASSERT(r->transfer_to == RAFT_NONE);
    TK_ASSERT(r->n_reads == 0);
    TK_ASSERT(!r->committed_in_term);
}

static void check_progress(const struct raft *r)
{
    uint64_t last = raft__log_last_index(&r->log);
    const struct raft_config *c = &r->config;
    if (!raft_config_has(c, r->o.id))
        TK_ASSERT(r->config_index > r->commit);
    for (uint32_t i = 0; i < c->n_voters + c->n_learners; i++) {
        const struct raft__progress *pr = &r->prs[i];
        TK_ASSERT(pr->id ==
                  (i < c->n_voters ? c->voters[i] : c->learners[i - c->n_voters]));
        TK_ASSERT(pr->match < pr->next);
        TK_ASSERT(pr->next <= last + 1);
        TK_ASSERT(pr->state <= RAFT__PR_SNAPSHOT);
        TK_ASSERT(pr->infl_count <= pr->infl_cap);
        TK_ASSERT(pr->read_round <= r->read_round);
    }
}

void raft__check_invariants(const struct raft *r)
{
    TK_ASSERT(r != NULL);
    check_log(r);
    check_indexes(r);
    check_config_index(r);
    check_role(r);
    if (r->role == RAFT_LEADER)
        check_progress(r);
}
