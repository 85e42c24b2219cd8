/* The leader's gate for large writes (contract in node_internal.h, "node_gate.c").
 *
 * Raft commits in log order, so a small write appended behind 4 MB entries
 * waits for each of them to be written, sent and synced on a majority. With
 * eight clients posting 4 MB batches, a normal client's writes on the leader
 * waited 125 ms at the median and its linearizable reads on the follower that
 * fell behind 500 ms (the adversary's bodies case, Dec 7). The gate keeps the
 * large entries (NODE_GATE_ENTRY_BYTES or more) in the pipeline to
 * NODE_GATE_PIPE_BYTES, or one: a large write is proposed only once those
 * before it have been applied here and persisted by every voter that is
 * keeping up (its match advanced within NODE_GATE_IDLE_MS; a dead one does
 * not stop the gate for longer than that). Small writes are never held: they
 * overtake the large ones waiting, so a small write waits behind at most
 * that pipeline. Order between two writes of one client is the submitter's
 * to keep: the gateway holds a connection's later requests until its large
 * write is answered (api_reply.c).
 *
 * Even one 4 MB entry at a time keeps the disk busy: each node writes and
 * syncs it (25-50 ms apiece with three nodes on this VM's one disk), and a
 * small write behind it waits for those syncs, so back to back they left the
 * normal client's p99 at 150-190 ms. So when smaller writes were proposed
 * while large entries filled the pipeline, once it empties no large entry
 * enters it for NODE_GATE_REST_SHARE (2) times as long as they were in it:
 * large writes get a third of the pipeline's time while others compete, and
 * all of it when nothing else is written. With a rest as long as their time
 * (half of it) the p99 was 66-97 ms; with twice, 61-73 ms, the 4 MB writes
 * acknowledged falling from 135-162 to 103-128 in 15 s (97 before the gate
 * and the body parse that takes values by reference, which freed the CPU).
 *
 * The held writes are a list in arrival order, bounded by
 * NODE_GATE_HELD_BYTES (past it: TK_EBUSY) and by each request's deadline
 * (on_tick expires them). When this node stops leading they go on to be
 * forwarded, in order. Loop thread only. */
#include "node/node_internal.h"

static bool is_large(const struct node_req *r)
{
    return r->cmd != NULL && r->cmd->len >= NODE_GATE_ENTRY_BYTES;
}

/* The highest index every keeping-up voter has persisted and this node
 * applied: large entries at or below it have left the pipeline. */
static uint64_t pipe_done(struct node_gate *g, const struct node_gate_view *v)
{
    uint64_t done = v->applied, now_ms = v->now_ns / 1000000;
    uint64_t newest = g->pipe[(g->pipe_head + g->pipe_n - 1) % NODE_GATE_PIPE_MAX].index;
    for (uint32_t i = 0; i < v->n_voters && i < RAFT_VOTERS_MAX; i++) {
        uint64_t id = v->voter[i], match = v->match[i];
        if (id == v->self)
            continue;
        size_t k = 0;
        while (k < g->n_peers && g->peer[k].id != id)
            k++;
        if (k == g->n_peers) {
            if (k == RAFT_VOTERS_MAX)
                continue;
            g->n_peers++;
            g->peer[k] =
                (struct node_gate_peer){.id = id, .match = match, .moved_ms = now_ms};
        }
        if (match != g->peer[k].match) {
            g->peer[k].match = match;
            g->peer[k].moved_ms = now_ms;
        }
        if (match < newest && now_ms - g->peer[k].moved_ms >= NODE_GATE_IDLE_MS)
            continue; /* behind and not moving: it does not stop the gate */
        if (match < done)
            done = match;
    }
    return done;
}

bool node__gate_room(struct node_gate *g, const struct node_gate_view *v, uint64_t len)
{
    if (g->term != v->term || g->config != v->config) {
        g->term = v->term; /* a new term: this leader's own entries */
        g->config = v->config;
        g->pipe_n = 0;
        g->pipe_bytes = g->pending_bytes;
        g->n_peers = 0;
        g->rest_until_ns = 0;
        g->small_seen = false;
    }
    if (g->pipe_n + g->pending_n == 0)
        return v->now_ns >= g->rest_until_ns;
    if (g->pipe_n > 0) {
        uint64_t done = pipe_done(g, v);
        while (g->pipe_n > 0 && g->pipe[g->pipe_head].index <= done) {
            g->pipe_bytes -= g->pipe[g->pipe_head].bytes;
            g->pipe_head = (g->pipe_head + 1) % NODE_GATE_PIPE_MAX;
            g->pipe_n--;
            if (g->pipe_n == 0 && g->pending_n == 0 && g->small_seen) {
                uint64_t busy = v->now_ns - g->busy_ns;
                uint64_t rest = NODE_GATE_REST_SHARE * busy,
                         max = NODE_GATE_REST_MAX_MS * 1000000ull;
                g->rest_until_ns = v->now_ns + (rest < max ? rest : max);
                g->small_seen = false;
                g->rests++;
                return false;
            }
        }
    }
    return g->pipe_n + g->pending_n == 0 ||
           (g->pipe_n + g->pending_n < NODE_GATE_PIPE_MAX &&
            g->pipe_bytes + len <= NODE_GATE_PIPE_BYTES);
}

void node__gate_admit(struct node_gate *g, uint64_t len)
{
    g->pipe_bytes += len; /* tentatively, until node__gate_note */
    g->pending_bytes += len;
    g->pending_n++;
}

void node__gate_note(struct node_gate *g, uint64_t index, uint64_t len, bool ok,
                     uint64_t now_ns)
{
    g->pending_bytes -= len;
    g->pending_n--;
    g->pipe_bytes -= len;
    if (!ok || g->pipe_n == NODE_GATE_PIPE_MAX)
        return;
    if (g->pipe_n == 0)
        g->busy_ns = now_ns;
    g->pipe[(g->pipe_head + g->pipe_n) % NODE_GATE_PIPE_MAX] =
        (struct node_gate_entry){.index = index, .bytes = len};
    g->pipe_n++;
    g->pipe_bytes += len;
}

/* What the gate looks at, from the core. */
static void view_of(struct node *n, struct node_gate_view *v)
{
    const struct raft_config *c = raft_config(n->raft);
    v->term = raft_term(n->raft);
    v->config = raft_config_index(n->raft);
    v->applied = raft_applied_index(n->raft);
    v->self = raft_id(n->raft);
    v->now_ns = tk_mono_ns();
    v->n_voters = 0;
    for (uint32_t i = 0; i < c->n_voters && i < RAFT_VOTERS_MAX; i++) {
        uint64_t match = 0, next = 0;
        if (c->voters[i] != v->self &&
            raft_progress(n->raft, c->voters[i], &match, &next) != 0)
            continue;
        v->voter[v->n_voters] = c->voters[i];
        v->match[v->n_voters++] = match;
    }
}

static bool room(struct node *n, uint64_t len)
{
    struct node_gate *g = &n->gate;
    if (g->pipe_n + g->pending_n == 0 && g->term == raft_term(n->raft) &&
        g->config == raft_config_index(n->raft))
        return tk_mono_ns() >= g->rest_until_ns; /* no view needed */
    struct node_gate_view v;
    view_of(n, &v);
    return node__gate_room(g, &v, len);
}

bool node__gate_hold(struct node *n, struct node_req *r)
{
    struct node_gate *g = &n->gate;
    if (!is_large(r))
        return false;
    uint64_t len = r->cmd->len;
    if (g->held.n == 0 && room(n, len)) {
        node__gate_admit(g, len);
        return false;
    }
    if (g->held_bytes + len > NODE_GATE_HELD_BYTES) {
        g->refused++;
        node__finish_write(n, r, TK_EBUSY, NULL);
        return true;
    }
    g->held_bytes += len;
    g->held_total++;
    node__list_push(&g->held, r);
    return true;
}

struct node_req *node__gate_take(struct node *n)
{
    struct node_gate *g = &n->gate;
    struct node_req *r = g->held.head;
    if (r == NULL)
        return NULL;
    bool leading = raft_role(n->raft) == RAFT_LEADER;
    if (leading && !room(n, r->cmd->len))
        return NULL;
    node__list_pop(&g->held);
    g->held_bytes -= r->cmd->len;
    if (leading)
        node__gate_admit(g, r->cmd->len);
    return r;
}

bool node__gate_ready(struct node *n)
{
    struct node_gate *g = &n->gate;
    if (g->held.head == NULL)
        return false;
    return raft_role(n->raft) != RAFT_LEADER || room(n, g->held.head->cmd->len);
}

void node__gate_expire(struct node *n, uint64_t now_ms)
{
    struct node_gate *g = &n->gate;
    struct node_req *r;
    while ((r = g->held.head) != NULL && r->deadline_ms <= now_ms) {
        node__list_pop(&g->held);
        g->held_bytes -= r->cmd->len;
        node__finish_write(n, r, TK_ETIMEDOUT, NULL);
    }
}

void node__gate_fail_all(struct node *n, int status)
{
    struct node_gate *g = &n->gate;
    struct node_req *r;
    while ((r = node__list_pop(&g->held)) != NULL) {
        g->held_bytes -= r->cmd->len;
        node__finish_write(n, r, status, NULL);
    }
}
