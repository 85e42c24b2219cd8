/* etcd's Maintenance service and KV.Compact (docs/etcd-compat.md): Status,
 * Hash and HashKV (the KV's digest, as GET /v1/debug/digest: bounded steps,
 * restarted when the applied state moves), MoveLeader (the node's leadership
 * transfer), Alarm (none are kept), Defragment and Compact (no-ops: tierkv
 * keeps no history to compact, and LMDB reuses freed pages without one).
 * Called by etcdapi.c's method table; calls the node and the KV. Loop thread
 * only. */
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/err.h"
#include "etcd_cluster.pb-c.h"
#include "etcdapi/etcdapi_internal.h"
#include "kv/kv.h"

/* A digest step's bound (live keys hashed per loop turn) and how often a
 * digest starts again when writes move the state under it. */
#define HASH_STEP 16384
#define HASH_RESTARTS 8

/* ---- Status --------------------------------------------------------------- */

void etcdapi__status(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__StatusRequest *rq =
        etcdapi__unpack(&etcdserverpb__status_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed StatusRequest");
        return;
    }
    etcdserverpb__status_request__free_unpacked(rq, NULL);
    struct etcdapi *e = ec->e;
    struct node_status st;
    node_status(e->node, &st);
    if (!etcdapi__state_enter(e)) {
        etcdapi__fail_rc(ec, TK_ESHUTDOWN);
        return;
    }
    struct kv_sm *sm = node_kv(e->node);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(e, 0, &h);
    Etcdserverpb__StatusResponse r = ETCDSERVERPB__STATUS_RESPONSE__INIT;
    r.header = &h;
    r.version = (char *)ETCD_API_VERSION;
    r.dbsize = (int64_t)kv_sm_cold_bytes(sm);
    r.dbsizeinuse = r.dbsize;
    r.leader = st.leader;
    r.raftindex = st.commit;
    r.raftterm = st.term;
    r.raftappliedindex = kv_sm_applied_index(sm);
    struct node_member mem[RAFT_MEMBERS_MAX];
    uint64_t ci;
    bool committed;
    size_t n = node_members(e->node, mem, sizeof(mem) / sizeof(mem[0]), &ci, &committed);
    etcdapi__state_leave(e, false);
    for (size_t i = 0; i < n && i < sizeof(mem) / sizeof(mem[0]); i++)
        if (mem[i].id == st.id)
            r.islearner = !mem[i].voter;
    char *errs[1];
    if (st.failed || st.rejected || st.removed) {
        errs[0] = (char *)(st.failed     ? "tierkv: the node failed (storage or apply)"
                           : st.rejected ? "tierkv: the cluster refused this node"
                                         : "tierkv: this node was removed");
        r.errors = errs;
        r.n_errors = 1;
    }
    etcdapi__reply(ec, &r.base);
}

/* ---- Hash and HashKV -------------------------------------------------------- */

struct hash_op {
    struct etcdapi *e; /* its count of digests (the call may be freed first) */
    struct ecall *ec;
    struct node_req nreq;
    bool kv; /* HashKV (else Hash) */
    struct kv_digest *d;
    uint64_t applied; /* the state the digest is of */
    int restarts;
};

static void hash_step_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data);

/* Digests in progress at once per node: each walks the whole state in
 * steps, a step a loop turn; more wait for none and are refused. */
#define HASHES_MAX 2

/* After the answer: h->ec may be gone with it. */
static void hash_end(struct hash_op *h)
{
    h->e->hashes--;
    kv_digest_free(h->d);
    tk_free(h);
}

static void hash_submit(struct hash_op *h)
{
    struct ecall *ec = h->ec;
    memset(&h->nreq, 0, sizeof(h->nreq));
    h->nreq.is_read = 1;
    h->nreq.consistency = NODE_READ_STALE; /* a member's own state, as etcd's */
    h->nreq.read_cb = hash_step_cb;
    h->nreq.data = h;
    uint64_t t = ec->e->cfg.request_timeout_ms, g = grpc_call_timeout_ms(ec->call);
    h->nreq.timeout_ms = g != 0 && (t == 0 || g < t) ? g : t;
    int rc = etcdapi__node_submit(ec->e, &h->nreq, NULL);
    if (rc != 0) {
        etcdapi__fail_rc(ec, rc);
        hash_end(h);
    }
}

static void hash_answer(struct hash_op *h)
{
    uint64_t d = kv_digest_value(h->d);
    Etcdserverpb__ResponseHeader hd = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(h->ec->e, h->applied, &hd);
    hd.revision = (int64_t)h->applied;
    uint32_t folded = (uint32_t)(d ^ (d >> 32));
    if (h->kv) {
        Etcdserverpb__HashKVResponse r = ETCDSERVERPB__HASH_KVRESPONSE__INIT;
        r.header = &hd;
        r.hash = folded;
        r.hash_revision = (int64_t)h->applied;
        r.compact_revision = (int64_t)h->applied; /* no older state is kept */
        etcdapi__reply(h->ec, &r.base);
    } else {
        Etcdserverpb__HashResponse r = ETCDSERVERPB__HASH_RESPONSE__INIT;
        r.header = &hd;
        r.hash = folded;
        etcdapi__reply(h->ec, &r.base);
    }
    hash_end(h);
}

static void hash_step_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct hash_op *h = data;
    if (status != 0) {
        etcdapi__fail_rc(h->ec, status);
        hash_end(h);
        return;
    }
    if (grpc_call_gone(h->ec->call)) { /* nobody waits for it: no more steps */
        etcdapi__fail(h->ec, GRPC_CANCELLED, "tierkv: the client left");
        hash_end(h);
        return;
    }
    uint64_t applied = kv_sm_applied_index(sm);
    if (h->d != NULL && applied != h->applied) {
        kv_digest_free(h->d); /* the state moved: from the start */
        h->d = NULL;
        if (++h->restarts > HASH_RESTARTS) {
            etcdapi__fail(h->ec, GRPC_UNAVAILABLE,
                          "tierkv: the state changed under the hash 9 times; retry when "
                          "writes pause");
            hash_end(h);
            return;
        }
    }
    if (h->d == NULL) {
        h->d = kv_digest_new(sm);
        h->applied = applied;
    }
    int rc = kv_sm_digest_step(sm, h->d, HASH_STEP, KV_SCAN_SKIP_MAX);
    if (rc < 0) {
        etcdapi__fail_rc(h->ec, rc);
        hash_end(h);
    } else if (rc == 0) {
        hash_submit(h); /* the node runs it on its next loop turn */
    } else {
        hash_answer(h);
    }
}

static void hash_start(struct ecall *ec, bool kv)
{
    if (ec->e->hashes >= HASHES_MAX) {
        etcdapi__fail(ec, GRPC_RESOURCE_EXHAUSTED,
                      "tierkv: 2 hashes are being computed on this node; retry later");
        return;
    }
    ec->e->hashes++;
    struct hash_op *h = tk_calloc(1, sizeof(*h));
    h->e = ec->e;
    h->ec = ec;
    h->kv = kv;
    hash_submit(h);
}

void etcdapi__hash(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__HashRequest *rq =
        etcdapi__unpack(&etcdserverpb__hash_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed HashRequest");
        return;
    }
    etcdserverpb__hash_request__free_unpacked(rq, NULL);
    hash_start(ec, false);
}

/* Only the newest state is kept: a revision below the applied index is
 * compacted, above it in the future (etcd's errors); 0 is the newest. */
static bool revision_ok(struct ecall *ec, int64_t rev)
{
    uint64_t applied = node_applied_index(ec->e->node);
    if (rev > 0 && (uint64_t)rev > applied) {
        etcdapi__fail(ec, GRPC_OUT_OF_RANGE,
                      "etcdserver: mvcc: required revision is a future revision");
        return false;
    }
    return true;
}

void etcdapi__hash_kv(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__HashKVRequest *rq =
        etcdapi__unpack(&etcdserverpb__hash_kvrequest__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed HashKVRequest");
        return;
    }
    int64_t rev = rq->revision;
    etcdserverpb__hash_kvrequest__free_unpacked(rq, NULL);
    if (!revision_ok(ec, rev))
        return;
    uint64_t applied = node_applied_index(ec->e->node);
    if (rev > 0 && (uint64_t)rev < applied) {
        etcdapi__fail(ec, GRPC_OUT_OF_RANGE,
                      "etcdserver: mvcc: required revision has been compacted");
        return;
    }
    hash_start(ec, true);
}

/* ---- MoveLeader, Alarm, Defragment ------------------------------------------ */

/* How often a MoveLeader looks for the new leader, and how long it waits when
 * neither the call nor the configuration gives a deadline. */
#define MOVE_POLL_MS 10
#define MOVE_WAIT_MS 5000

struct move_op {
    uv_timer_t timer;
    struct ecall *ec;
    uint64_t to;
    uint64_t deadline_ms; /* the loop's clock */
};

static void move_closed(uv_handle_t *h)
{
    tk_free(h->data);
}

/* Every MOVE_POLL_MS until the target leads, the deadline, the client leaving
 * or the server stopping (the pending timer keeps the loop running until this
 * answers, at most MOVE_POLL_MS after the stop). */
static void move_poll(uv_timer_t *t)
{
    struct move_op *m = t->data;
    struct etcdapi *e = m->ec->e;
    struct node_status st;
    node_status(e->node, &st);
    if (e->stopping) {
        etcdapi__fail_rc(m->ec, TK_ESHUTDOWN);
    } else if (st.leader == m->to) {
        Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
        etcdapi__header(e, 0, &h);
        Etcdserverpb__MoveLeaderResponse r = ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
        r.header = &h;
        etcdapi__reply(m->ec, &r.base);
    } else if (uv_now(t->loop) >= m->deadline_ms || grpc_call_gone(m->ec->call)) {
        etcdapi__fail(m->ec, GRPC_UNAVAILABLE,
                      "etcdserver: request timed out, leader transfer took too long");
    } else {
        return;
    }
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, move_closed);
}

/* Asks the leader to hand over to a voter and answers once this node sees
 * the target lead, as etcd's does. */
void etcdapi__move_leader(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__MoveLeaderRequest *rq =
        etcdapi__unpack(&etcdserverpb__move_leader_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed MoveLeaderRequest");
        return;
    }
    uint64_t to = rq->targetid;
    etcdserverpb__move_leader_request__free_unpacked(rq, NULL);
    struct etcdapi *e = ec->e;
    struct node_status st;
    node_status(e->node, &st);
    if (st.leader == 0 || st.leader != st.id) {
        etcdapi__fail_rc(ec, st.leader == 0 ? TK_ENOLEADER : TK_ENOTLEADER);
        return;
    }
    struct node_member mem[RAFT_MEMBERS_MAX];
    uint64_t ci;
    bool committed, voter = false;
    size_t n = 0;
    if (etcdapi__state_enter(e)) {
        n = node_members(e->node, mem, sizeof(mem) / sizeof(mem[0]), &ci, &committed);
        etcdapi__state_leave(e, false);
    }
    for (size_t i = 0; i < n && i < sizeof(mem) / sizeof(mem[0]); i++)
        voter |= mem[i].id == to && mem[i].voter;
    if (!voter) {
        etcdapi__fail(ec, GRPC_FAILED_PRECONDITION, "etcdserver: bad leader transferee");
        return;
    }
    if (to != st.id) {
        int rc = node_transfer_leadership(e->node, to);
        if (rc != 0) {
            etcdapi__fail_rc(ec, rc);
            return;
        }
        uint64_t t = e->cfg.request_timeout_ms, g = grpc_call_timeout_ms(ec->call);
        t = g != 0 && (t == 0 || g < t) ? g : t;
        struct move_op *m = tk_calloc(1, sizeof(*m));
        m->ec = ec;
        m->to = to;
        m->deadline_ms = uv_now(e->loop) + (t != 0 ? t : MOVE_WAIT_MS);
        uv_timer_init(e->loop, &m->timer);
        m->timer.data = m;
        uv_timer_start(&m->timer, move_poll, MOVE_POLL_MS, MOVE_POLL_MS);
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(e, 0, &h);
    Etcdserverpb__MoveLeaderResponse r = ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
    r.header = &h;
    etcdapi__reply(ec, &r.base);
}

/* No alarms are kept (a full disk fails the node instead: Status's errors):
 * GET and DEACTIVATE answer none; ACTIVATE is refused. */
void etcdapi__alarm(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__AlarmRequest *rq =
        etcdapi__unpack(&etcdserverpb__alarm_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed AlarmRequest");
        return;
    }
    bool activate = rq->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
    etcdserverpb__alarm_request__free_unpacked(rq, NULL);
    if (activate) {
        etcdapi__fail(ec, GRPC_UNIMPLEMENTED, "tierkv: alarms are not kept");
        return;
    }
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__AlarmResponse r = ETCDSERVERPB__ALARM_RESPONSE__INIT;
    r.header = &h;
    etcdapi__reply(ec, &r.base);
}

void etcdapi__defragment(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__DefragmentRequest *rq =
        etcdapi__unpack(&etcdserverpb__defragment_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed DefragmentRequest");
        return;
    }
    etcdserverpb__defragment_request__free_unpacked(rq, NULL);
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__DefragmentResponse r = ETCDSERVERPB__DEFRAGMENT_RESPONSE__INIT;
    r.header = &h;
    etcdapi__reply(ec, &r.base);
}

/* ---- KV.Compact ------------------------------------------------------------- */

/* After a linearizable read (so a revision a client saw anywhere is not yet
 * "future" here): a no-op success up to the applied index. */
static void compact_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    (void)sm;
    struct ecall *ec = data;
    if (status != 0) {
        etcdapi__fail_rc(ec, status);
        return;
    }
    if (!revision_ok(ec, ec->revision))
        return;
    Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
    etcdapi__header(ec->e, 0, &h);
    Etcdserverpb__CompactionResponse r = ETCDSERVERPB__COMPACTION_RESPONSE__INIT;
    r.header = &h;
    etcdapi__reply(ec, &r.base);
}

void etcdapi__kv_compact(struct ecall *ec, const uint8_t *msg, size_t len)
{
    Etcdserverpb__CompactionRequest *rq =
        etcdapi__unpack(&etcdserverpb__compaction_request__descriptor, len, msg);
    if (rq == NULL) {
        etcdapi__fail(ec, GRPC_INVALID_ARGUMENT, "tierkv: a malformed CompactionRequest");
        return;
    }
    ec->revision = rq->revision;
    etcdserverpb__compaction_request__free_unpacked(rq, NULL);
    etcdapi__submit_read(ec, false, compact_cb);
}
