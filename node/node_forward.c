/* Write forwarding, follower -> leader, over the transport: a write
 * submitted on a follower travels to the leader and its result comes back,
 * so a client never chases the leader. The frames are the Forward message of
 * proto/tierkv.proto; the transport carries them as opaque bytes
 * (transport_send_forward).
 *
 * Follower: node__forward_write gives the request an id, a random token
 * (NODE_TOKEN_BYTES from getrandom) and the leader it goes to, and parks it in
 * n->fwd.wait. An answer completes it only if its id, its token and its sender
 * all match; anything else (a late answer, a duplicate, a forgery, garbage) is
 * dropped with a log line, and the request still ends exactly once: with the
 * right answer, at its deadline, or when the node fails or stops.
 * Leader: a request becomes a local write (node.c submits it) whose
 * completion sends the answer, echoing the id and the token; a node that is
 * not the leader answers TK_ENOTLEADER, a failed one TK_EIO.
 *
 * Batches: the writes of one drain travel to the leader in one
 * ForwardRequests frame (NODE_FWD_BATCH_MAX of them and NODE_FWD_BATCH_BYTES
 * at most, else several; a command over NODE_FWD_ALONE_BYTES alone, as a
 * ForwardRequest), and the answers of one loop turn go back in one
 * ForwardResponses frame per follower; node__forward_flush sends what was
 * gathered. A follower batches only to a leader that said batch_ok in an
 * answer to one of its requests, in its current term, and the leader batches
 * answers only to requests that came in a batch or said batch_ok: a node of
 * an older build, which drops batch frames, gets single frames both ways.
 *
 * Loop thread only. Called by node.c (drain_queue, on_forward, on_check);
 * calls node_member.c (node__member_fenced) and no other file of node/.
 * Frames are decoded from an arena made once (struct fwd_scratch), and a
 * command of any size costs the leader the one blob it proposes, as before
 * the protobuf format. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/log.h"
#include "kv/kv.h"
#include "node/node_internal.h"
#include "tierkv.pb-c.h"
#include "transport/transport.h"

_Static_assert(NODE_TOKEN_BYTES == sizeof(((struct node_req *)0)->token),
               "a node_req holds one token");
_Static_assert((int)NODE_MODE_APPLIED == (int)TIERKV__FORWARD_REQUEST__MODE__APPLIED &&
                   (int)NODE_MODE_COMMITTED ==
                       (int)TIERKV__FORWARD_REQUEST__MODE__COMMITTED,
               "ForwardRequest.Mode is enum node_mode");

/* Frames up to this size are packed on the stack: every answer fits. */
#define FWD_STACK_BYTES (KV_RESULT_ENCODED_MAX + 128)
/* What one element adds to a batch frame beyond its command or result: its
 * field tags and lengths, id, token, mode, status and flags. */
#define FWD_ELEM_BYTES 48
/* A batch frame, packed: its elements and the message around them. */
#define FWD_BATCH_FRAME_BYTES (NODE_FWD_BATCH_BYTES + 64)
/* The decoding arena (reused for every frame): every bytes field and
 * message of a batch of at most NODE_FWD_BATCH_MAX elements, each allocation
 * rounded to 16, with room for fields a newer build may add; a frame past it
 * fails to decode (dropped). A command over NODE_FWD_ALONE_BYTES (one a
 * frame) becomes a blob instead. */
#define FWD_BATCH_ARENA_BYTES (2 * NODE_FWD_BATCH_BYTES + NODE_FWD_BATCH_MAX * 256)
_Static_assert(NODE_FWD_ALONE_BYTES + FWD_ELEM_BYTES <= NODE_FWD_BATCH_BYTES,
               "a command that may join a batch fits in one");
_Static_assert(KV_RESULT_ENCODED_MAX + FWD_ELEM_BYTES <= NODE_FWD_BATCH_BYTES,
               "any answer fits in a batch");

/* A forwarded write on the leader, until its completion is answered. */
struct fwd_req {
    struct node_req req;
    struct node *n;
    uint64_t origin;
    uint64_t id;
    uint8_t token[NODE_TOKEN_BYTES];
    bool batched;               /* its origin takes answers in batches */
    struct fwd_req *next_spare; /* in n->fwd.spare */
};

static struct fwd_req *fwd_new(struct node *n)
{
    struct fwd_req *f = n->fwd.spare;
    if (f == NULL)
        return tk_calloc(1, sizeof(*f));
    n->fwd.spare = f->next_spare;
    n->fwd.n_spare--;
    memset(f, 0, sizeof(*f));
    return f;
}

static void fwd_release(struct fwd_req *f)
{
    struct node *n = f->n;
    if (n->fwd.n_spare >= NODE_FWD_SPARES) {
        tk_free(f);
        return;
    }
    f->next_spare = n->fwd.spare;
    n->fwd.spare = f;
    n->fwd.n_spare++;
}

void node__forward_free(struct node *n)
{
    while (n->fwd.spare != NULL) {
        struct fwd_req *f = n->fwd.spare;
        n->fwd.spare = f->next_spare;
        tk_free(f);
    }
    n->fwd.n_spare = 0;
    tk_free(n->fwd.scratch);
    n->fwd.scratch = NULL;
}

/* ---- frames ---- */

struct fwd_arena {
    uint8_t *mem; /* 16-aligned */
    size_t cap;
    size_t used;
    struct tk_blob *blob; /* the one allocation too big for mem */
};

/* An answer gathered for a batch, until node__forward_flush sends it. */
struct fwd_answer {
    uint64_t to, id;
    uint8_t token[NODE_TOKEN_BYTES];
    int32_t status;
    bool replayed;
    uint32_t result_at, result_len; /* in fwd_scratch.results */
};

/* The batches' memory, made at the first batch and kept (a steady forwarded
 * load allocates none). */
struct fwd_scratch {
    /* Follower: the messages of the batch being packed. */
    Tierkv__ForwardRequest req[NODE_FWD_BATCH_MAX];
    Tierkv__ForwardRequest *req_ptr[NODE_FWD_BATCH_MAX];
    /* Leader: the answers of this turn, their encoded results, and the
     * messages of the frame being packed. */
    struct fwd_answer ans[NODE_FWD_BATCH_MAX];
    size_t n_ans;
    size_t ans_bytes; /* as packed, with FWD_ELEM_BYTES each */
    uint8_t results[NODE_FWD_BATCH_BYTES];
    size_t results_used;
    Tierkv__ForwardResponse resp[NODE_FWD_BATCH_MAX];
    Tierkv__ForwardResponse *resp_ptr[NODE_FWD_BATCH_MAX];
    uint8_t frame[FWD_BATCH_FRAME_BYTES]; /* the packed frame */
    _Alignas(16) uint8_t arena[FWD_BATCH_ARENA_BYTES];
};

static struct fwd_scratch *scratch(struct node *n)
{
    if (n->fwd.scratch == NULL)
        n->fwd.scratch = tk_calloc(1, sizeof(*n->fwd.scratch));
    return n->fwd.scratch;
}

static void *arena_alloc(void *data, size_t size)
{
    struct fwd_arena *a = data;
    size_t rounded = (size + 15) & ~(size_t)15;
    /* A command that travels alone becomes the blob the leader proposes,
     * uncopied. */
    bool alone = size > NODE_FWD_ALONE_BYTES && a->blob == NULL;
    if (!alone && size <= rounded && rounded <= a->cap - a->used) {
        void *p = a->mem + a->used;
        a->used += rounded;
        return p;
    }
    if (a->blob != NULL)
        return NULL; /* protobuf-c turns this into a failed unpack */
    a->blob = tk_blob_new(size);
    return a->blob->data;
}

static void arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* everything goes at once with the arena */
}

static int send_frame(struct node *n, uint64_t to, const Tierkv__Forward *f)
{
    uint8_t stack[FWD_STACK_BYTES];
    size_t len = tierkv__forward__get_packed_size(f);
    /* A big frame is packed into a blob: base keeps freed big ones, whose
     * pages are backed already (a fresh 4 MB buffer is 1,000 page faults). */
    struct tk_blob *big = len <= sizeof(stack) ? NULL : tk_blob_new(len);
    uint8_t *buf = big != NULL ? big->data : stack;
    size_t packed = tierkv__forward__pack(f, buf);
    TK_ASSERT(packed == len);
    int rc = n->transport != NULL ? transport_send_forward(n->transport, to, buf, len)
                                  : TK_ECLOSED;
    tk_blob_unref(big);
    return rc;
}

/* Sends the answers gathered for batches, one frame per follower, in the
 * order they were gathered. A lost frame ends in the origins' deadlines. */
static void flush_answers(struct node *n)
{
    struct fwd_scratch *s = n->fwd.scratch;
    if (s == NULL || s->n_ans == 0)
        return;
    TK_ASSERT(s->n_ans <= NODE_FWD_BATCH_MAX);
    bool sent[NODE_FWD_BATCH_MAX] = {false};
    for (size_t i = 0; i < s->n_ans; i++) {
        if (sent[i])
            continue;
        uint64_t to = s->ans[i].to;
        size_t k = 0;
        for (size_t j = i; j < s->n_ans; j++) {
            const struct fwd_answer *a = &s->ans[j];
            if (sent[j] || a->to != to)
                continue;
            sent[j] = true;
            Tierkv__ForwardResponse *p = &s->resp[k];
            tierkv__forward_response__init(p);
            p->id = a->id;
            p->token.data = (uint8_t *)a->token;
            p->token.len = NODE_TOKEN_BYTES;
            p->status = a->status;
            p->result.data = s->results + a->result_at;
            p->result.len = a->result_len;
            p->replayed = a->replayed;
            s->resp_ptr[k++] = p;
        }
        Tierkv__ForwardResponses b = TIERKV__FORWARD_RESPONSES__INIT;
        b.n_responses = k;
        b.responses = s->resp_ptr;
        Tierkv__Forward f = TIERKV__FORWARD__INIT;
        f.body_case = TIERKV__FORWARD__BODY_RESPONSES;
        f.responses = &b;
        size_t len = tierkv__forward__get_packed_size(&f);
        TK_ASSERT(len <= sizeof(s->frame));
        size_t packed = tierkv__forward__pack(&f, s->frame);
        TK_ASSERT(packed == len);
        if (n->transport != NULL)
            (void)transport_send_forward(n->transport, to, s->frame, len);
    }
    s->n_ans = 0;
    s->ans_bytes = 0;
    s->results_used = 0;
}

/* Answers a forwarded request: in this turn's batch to its origin when it
 * takes batches, else alone. A lost answer ends in the origin's deadline. */
static void answer(struct node *n, uint64_t to, uint64_t id, const uint8_t *token,
                   bool batched, int status, const struct kv_result *res)
{
    if (batched) {
        struct fwd_scratch *s = scratch(n);
        if (s->n_ans == NODE_FWD_BATCH_MAX ||
            s->results_used + KV_RESULT_ENCODED_MAX > sizeof(s->results) ||
            s->ans_bytes + KV_RESULT_ENCODED_MAX + FWD_ELEM_BYTES > NODE_FWD_BATCH_BYTES)
            flush_answers(n);
        struct fwd_answer *a = &s->ans[s->n_ans++];
        a->to = to;
        a->id = id;
        memcpy(a->token, token, NODE_TOKEN_BYTES);
        a->status = status;
        a->replayed = false;
        a->result_at = (uint32_t)s->results_used;
        a->result_len = 0;
        if (status == 0 && res != NULL) {
            a->result_len = (uint32_t)kv_result_encode(res, s->results + s->results_used);
            a->replayed = res->duplicate;
            s->results_used += a->result_len;
        }
        s->ans_bytes += a->result_len + FWD_ELEM_BYTES;
        if (n->loop.closing) /* no turn end comes to send it */
            flush_answers(n);
        return;
    }
    uint8_t enc[KV_RESULT_ENCODED_MAX];
    Tierkv__ForwardResponse p = TIERKV__FORWARD_RESPONSE__INIT;
    p.id = id;
    p.token.data = (uint8_t *)token;
    p.token.len = NODE_TOKEN_BYTES;
    p.status = status;
    p.batch_ok = true; /* a node of an older build ignores it */
    if (status == 0 && res != NULL) {
        p.result.data = enc;
        p.result.len = kv_result_encode(res, enc);
        p.replayed = res->duplicate; /* not in kvpb.Result: the table's, not the sm's */
    }
    Tierkv__Forward f = TIERKV__FORWARD__INIT;
    f.body_case = TIERKV__FORWARD__BODY_RESPONSE;
    f.response = &p;
    (void)send_frame(n, to, &f);
}

/* A fresh random token. getrandom draws NODE_TOKEN_POOL at once (256 bytes
 * or fewer never come back short once the kernel's pool is initialised). */
static void new_token(struct node *n, uint8_t *token)
{
    _Static_assert(sizeof(n->fwd.pool) <= 256, "getrandom returns up to 256 bytes whole");
    if (n->fwd.pool_left == 0) {
        ssize_t got;
        do
            got = getrandom(n->fwd.pool, sizeof(n->fwd.pool), 0);
        while (got < 0 && errno == EINTR);
        TK_ASSERT(got == (ssize_t)sizeof(n->fwd.pool));
        n->fwd.pool_left = NODE_TOKEN_POOL;
    }
    n->fwd.pool_left--;
    uint8_t *t = n->fwd.pool + (size_t)n->fwd.pool_left * NODE_TOKEN_BYTES;
    memcpy(token, t, NODE_TOKEN_BYTES);
    memset(t, 0, NODE_TOKEN_BYTES); /* used once */
}

/* ---- follower ---- */

static void request_init(Tierkv__ForwardRequest *q, const struct node_req *r)
{
    tierkv__forward_request__init(q);
    q->id = r->ctx;
    q->token.data = (uint8_t *)r->token;
    q->token.len = NODE_TOKEN_BYTES;
    q->mode = r->mode == NODE_MODE_COMMITTED ? TIERKV__FORWARD_REQUEST__MODE__COMMITTED
                                             : TIERKV__FORWARD_REQUEST__MODE__APPLIED;
    q->command.data = r->cmd->data;
    q->command.len = r->cmd->len;
    q->batch_ok = true; /* a node of an older build ignores it */
}

/* A send to the leader failed: the request ends with the reason. */
static void send_failed(struct node *n, struct node_req *r, int rc)
{
    node__finish_write(n, r, rc == TK_ENOTFOUND ? TK_ENOLEADER : rc, NULL);
}

/* Sends the writes gathered in n->fwd.out in one frame and parks them, or
 * ends them all when the send fails. */
static void flush_out(struct node *n)
{
    struct req_list *out = &n->fwd.out;
    if (out->n == 0)
        return;
    struct fwd_scratch *s = scratch(n);
    size_t k = 0;
    for (struct node_req *r = out->head; r != NULL; r = r->next) {
        TK_ASSERT(k < NODE_FWD_BATCH_MAX);
        request_init(&s->req[k], r);
        s->req_ptr[k] = &s->req[k];
        k++;
    }
    Tierkv__ForwardRequests b = TIERKV__FORWARD_REQUESTS__INIT;
    b.n_requests = k;
    b.requests = s->req_ptr;
    Tierkv__Forward f = TIERKV__FORWARD__INIT;
    f.body_case = TIERKV__FORWARD__BODY_REQUESTS;
    f.requests = &b;
    size_t len = tierkv__forward__get_packed_size(&f);
    TK_ASSERT(len <= sizeof(s->frame));
    size_t packed = tierkv__forward__pack(&f, s->frame);
    TK_ASSERT(packed == len);
    int rc = n->transport != NULL
                 ? transport_send_forward(n->transport, n->fwd.out_to, s->frame, len)
                 : TK_ECLOSED;
    struct node_req *r;
    while ((r = node__list_pop(out)) != NULL) {
        if (rc != 0) {
            send_failed(n, r, rc);
            continue;
        }
        n->m.metrics.forwarded++;
        node__list_push(&n->fwd.wait, r);
    }
    n->fwd.out_bytes = 0;
}

void node__forward_flush(struct node *n)
{
    flush_out(n);
    flush_answers(n);
}

void node__forward_write(struct node *n, struct node_req *r)
{
    uint64_t leader = raft_leader(n->raft);
    /* A stranger is never heard, so never the leader; if it were, a write
     * forwarded to it would be applied outside this cluster. */
    if (leader == RAFT_NONE || leader == n->o.id || node__member_fenced(n, leader)) {
        node__finish_write(n, r, TK_ENOLEADER, NULL);
        return;
    }
    r->ctx = ++n->fwd.next_id;
    r->asked = leader;
    new_token(n, r->token);
    struct node_forward *fw = &n->fwd;
    size_t cost = r->cmd->len + FWD_ELEM_BYTES;
    bool batch = fw->batch_leader == leader && fw->batch_term == raft_term(n->raft) &&
                 r->cmd->len <= NODE_FWD_ALONE_BYTES;
    /* What was gathered goes first: to another leader, or a full batch. */
    if (fw->out.n > 0 &&
        (!batch || fw->out_to != leader || fw->out.n == NODE_FWD_BATCH_MAX ||
         fw->out_bytes + cost > NODE_FWD_BATCH_BYTES))
        flush_out(n);
    if (batch) {
        fw->out_to = leader;
        fw->out_bytes += cost;
        node__list_push(&fw->out, r);
        return;
    }
    Tierkv__ForwardRequest q;
    request_init(&q, r);
    Tierkv__Forward f = TIERKV__FORWARD__INIT;
    f.body_case = TIERKV__FORWARD__BODY_REQUEST;
    f.request = &q;
    int rc = send_frame(n, leader, &f);
    if (rc != 0) {
        send_failed(n, r, rc);
        return;
    }
    n->m.metrics.forwarded++;
    node__list_push(&fw->wait, r);
}

/* In time independent of where the tokens differ, so that a peer cannot
 * learn a token byte by byte from how fast its guesses are refused. */
static bool same_token(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;
    for (size_t i = 0; i < NODE_TOKEN_BYTES; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

static bool answers(const struct node_req *r, uint64_t from,
                    const Tierkv__ForwardResponse *p)
{
    return r->ctx == p->id && r->asked == from && same_token(r->token, p->token.data);
}

/* The parked request an answer is for, taken off the list, or NULL; *id_seen
 * tells whether a request with the answer's id waits (for another token or
 * another leader: a forgery, or a misrouted answer). */
static struct node_req *take_parked(struct node *n, uint64_t from,
                                    const Tierkv__ForwardResponse *p, bool *id_seen)
{
    struct req_list *l = &n->fwd.wait;
    *id_seen = false;
    if (l->head != NULL && answers(l->head, from, p))
        return node__list_pop(l); /* the usual case: answers come in order */
    struct req_list keep = {0};
    struct node_req *r, *found = NULL;
    while ((r = node__list_pop(l)) != NULL) {
        if (found == NULL && answers(r, from, p))
            found = r;
        else
            node__list_push(&keep, r);
        *id_seen = *id_seen || r->ctx == p->id;
    }
    *l = keep;
    return found;
}

/* A write forwarded to a leader that no longer leads may have been
 * committed by it, or not: only its answer can tell, and a leader that died
 * never sends it (a deposed one may, late, and it is then dropped as
 * unmatched). Once this node knows another leader, such a write ends with
 * TK_ETIMEDOUT, its outcome unknown, as it would at its deadline
 * (--request-timeout-ms, 10 s by default), so the client learns now and
 * can retry through the new leader (a keep-alive stream's next refresh, a
 * lock's next attempt); etcd answers its own `leader changed` then. A scan
 * of the parked writes when the leader changed, at most once a tick. */
void node__forward_leader_check(struct node *n)
{
    uint64_t leader = raft_leader(n->raft);
    if (leader == n->fwd.seen_leader)
        return;
    n->fwd.seen_leader = leader;
    if (leader == RAFT_NONE || n->fwd.wait.n == 0)
        return; /* an election: the old leader may still answer */
    struct req_list keep = {0};
    struct node_req *r;
    while ((r = node__list_pop(&n->fwd.wait)) != NULL) {
        if (r->asked == leader) {
            node__list_push(&keep, r);
            continue;
        }
        n->m.metrics.forward_orphaned++;
        node__finish_write(n, r, TK_ETIMEDOUT, NULL);
    }
    n->fwd.wait = keep;
}

static bool known_error(int32_t status)
{
    switch (status) {
#define FWD_CASE(name, value, msg) case value:
        TK_ERRORS(FWD_CASE)
#undef FWD_CASE
        return true;
    default:
        return false;
    }
}

static void take_answer(struct node *n, uint64_t from, const Tierkv__ForwardResponse *p,
                        bool batched)
{
    if (p->token.len != NODE_TOKEN_BYTES) {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "forward answer %llu from %llu dropped: a token of %zu bytes",
               (unsigned long long)p->id, (unsigned long long)from, p->token.len);
        return;
    }
    bool id_seen;
    struct node_req *r = take_parked(n, from, p, &id_seen);
    if (r == NULL && id_seen) {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "forward answer %llu from %llu dropped: its token or its sender is not "
               "the request's",
               (unsigned long long)p->id, (unsigned long long)from);
        return;
    }
    if (r == NULL) {
        /* Timed out already, or a duplicate. */
        TK_LOG(TK_LOG_INFO, n->o.id, raft_term(n->raft),
               "forward answer %llu from %llu dropped: no request waits for it",
               (unsigned long long)p->id, (unsigned long long)from);
        return;
    }
    /* The leader that answers one of our requests in a batch, or says it
     * takes them, gets our next writes in batches, in this term. */
    if (batched || p->batch_ok) {
        n->fwd.batch_leader = from;
        n->fwd.batch_term = raft_term(n->raft);
    }
    if (p->status == 0) {
        int rc = kv_result_decode(p->result.data, p->result.len, &n->res);
        n->res.duplicate = p->replayed;
        node__finish_write(n, r, rc, rc == 0 ? &n->res : NULL);
        return;
    }
    node__finish_write(n, r, known_error(p->status) ? p->status : TK_EPROTO, NULL);
}

/* ---- leader ---- */

static void forwarded_done(struct node_req *req, int status, const struct kv_result *res,
                           void *data)
{
    struct fwd_req *f = data;
    (void)req;
    answer(f->n, f->origin, f->id, f->token, f->batched, status, res);
    fwd_release(f);
}

/* The write to submit for a request, or NULL when it was answered here. */
static struct node_req *take_request(struct node *n, uint64_t from,
                                     const Tierkv__ForwardRequest *q, bool batched,
                                     struct fwd_arena *a)
{
    batched = batched || q->batch_ok;
    if (q->token.len != NODE_TOKEN_BYTES) {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "forward request %llu from %llu dropped: a token of %zu bytes",
               (unsigned long long)q->id, (unsigned long long)from, q->token.len);
        return NULL;
    }
    if (raft_role(n->raft) != RAFT_LEADER || n->persist.failed || n->loop.closing) {
        answer(n, from, q->id, q->token.data, batched,
               n->persist.failed ? TK_EIO : TK_ENOTLEADER, NULL);
        return NULL;
    }
    struct fwd_req *f = fwd_new(n);
    f->n = n;
    f->origin = from;
    f->id = q->id;
    f->batched = batched;
    memcpy(f->token, q->token.data, NODE_TOKEN_BYTES);
    f->req.mode = q->mode == TIERKV__FORWARD_REQUEST__MODE__COMMITTED
                      ? NODE_MODE_COMMITTED
                      : NODE_MODE_APPLIED;
    if (a->blob != NULL && a->blob->data == q->command.data) {
        f->req.cmd = a->blob; /* the arena's reference becomes the request's */
        f->req.cmd->len = q->command.len;
        a->blob = NULL;
    } else {
        f->req.cmd = tk_blob_copy(q->command.data, q->command.len);
    }
    f->req.write_cb = forwarded_done;
    f->req.data = f;
    return &f->req;
}

void node__forward_refuse(struct node_req *r, int status)
{
    struct fwd_req *f = r->data;
    tk_blob_unref(r->cmd);
    answer(f->n, f->origin, f->id, f->token, f->batched, status, NULL);
    fwd_release(f);
}

struct node_req *node__forward_recv(struct node *n, uint64_t from, const uint8_t *buf,
                                    size_t len)
{
    if (!raft_config_is_member(raft_config(n->raft), from)) {
        /* Only members forward writes and answer them (issue 15): a stranger
         * that got past the transport cannot propose, nor answer ours. */
        n->m.metrics.forward_dropped++;
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "a forward frame from %llu, not a member, dropped",
               (unsigned long long)from);
        return NULL;
    }
    struct fwd_arena a;
    a.mem = scratch(n)->arena;
    a.cap = sizeof(n->fwd.scratch->arena);
    a.used = 0;
    a.blob = NULL;
    ProtobufCAllocator alloc = {
        .alloc = arena_alloc, .free = arena_free, .allocator_data = &a};
    Tierkv__Forward *f = tierkv__forward__unpack(&alloc, len, buf);
    struct node_req *first = NULL, **tail = &first;
    if (f != NULL && f->body_case == TIERKV__FORWARD__BODY_REQUEST) {
        first = take_request(n, from, f->request, false, &a);
    } else if (f != NULL && f->body_case == TIERKV__FORWARD__BODY_RESPONSE) {
        take_answer(n, from, f->response, false);
    } else if (f != NULL && f->body_case == TIERKV__FORWARD__BODY_REQUESTS) {
        for (size_t i = 0; i < f->requests->n_requests; i++) {
            struct node_req *r =
                take_request(n, from, f->requests->requests[i], true, &a);
            if (r == NULL)
                continue;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
        }
    } else if (f != NULL && f->body_case == TIERKV__FORWARD__BODY_RESPONSES) {
        for (size_t i = 0; i < f->responses->n_responses; i++)
            take_answer(n, from, f->responses->responses[i], true);
    } else {
        TK_LOG(TK_LOG_WARN, n->o.id, raft_term(n->raft),
               "a malformed forward frame (%zu bytes) from %llu dropped", len,
               (unsigned long long)from);
    }
    tk_blob_unref(a.blob);
    return first;
}
