/* Forwarded writes in batches (issue 53 item 2): node 1, a follower on the
 * test's loop, forwards to node 2, a bare inproc transport the test drives as
 * its leader (it claims leadership with a heartbeat, decodes every forward
 * frame node 1 sends and answers, forges or refuses by hand); node 3 is a
 * bystander transport, not a member. Then a three-node cluster whose
 * follower takes writes from several threads at once. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "base/blob.h"
#include "base/err.h"
#include "include/tierkv.h"
#include "kv/kv.h"
#include "node/node.h"
#include "node/node_internal.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"
#include "tierkv.pb-c.h"
#include "transport/transport.h"

#define GOT_MAX 512
#define FRAMES_MAX 64

/* A request node 1 forwarded, as the fake decoded it. */
struct got {
    uint64_t id;
    uint8_t token[16];
    size_t command_len;
    bool batch_ok;
};

/* An answer the fake received (node 1 answering as a non-leader). */
struct got_answer {
    uint64_t id;
    uint8_t token[16];
    int32_t status;
    bool batch_ok;
};

struct fake {
    struct transport *t;
    bool closed;
    int frames;               /* forward frames received */
    int size[FRAMES_MAX];     /* elements in each; -1 a single request */
    size_t bytes[FRAMES_MAX]; /* each frame's length */
    struct got got[GOT_MAX];  /* every request, in the order received */
    int n_got;
    struct got_answer ans[GOT_MAX]; /* every answer, in the order received */
    int n_ans;
    int answer_frames; /* frames of answers (single or batch) */
    int answer_batches;
};

/* A write of the test's, submitted to node 1. */
struct slot {
    struct node_req req;
    int done;
    int status;
    uint64_t revision;
};

struct env {
    uv_loop_t loop;
    struct transport_inproc_hub *hub;
    struct node *n;
    struct fake leader, other;
    atomic_bool stopped;
    uint64_t term;
    struct slot slots[GOT_MAX];
    int n_slots;
};

static void fake_recv(struct transport *t, const struct raft_message *m, void *data)
{
    (void)t;
    (void)m;
    (void)data;
}

static void got_request(struct fake *f, const Tierkv__ForwardRequest *q)
{
    ck_assert_int_lt(f->n_got, GOT_MAX);
    struct got *g = &f->got[f->n_got++];
    ck_assert_uint_eq(q->token.len, 16);
    g->id = q->id;
    memcpy(g->token, q->token.data, 16);
    g->command_len = q->command.len;
    g->batch_ok = q->batch_ok;
}

static void got_answer(struct fake *f, const Tierkv__ForwardResponse *p)
{
    ck_assert_int_lt(f->n_ans, GOT_MAX);
    struct got_answer *a = &f->ans[f->n_ans++];
    ck_assert_uint_eq(p->token.len, 16);
    a->id = p->id;
    memcpy(a->token, p->token.data, 16);
    a->status = p->status;
    a->batch_ok = p->batch_ok;
}

static void fake_forward(struct transport *t, uint64_t from, const uint8_t *buf,
                         size_t len, void *data)
{
    struct fake *f = data;
    (void)t;
    ck_assert_uint_eq(from, 1);
    Tierkv__Forward *fw = tierkv__forward__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(fw);
    ck_assert_int_lt(f->frames, FRAMES_MAX);
    f->bytes[f->frames] = len;
    switch (fw->body_case) {
    case TIERKV__FORWARD__BODY_REQUEST:
        f->size[f->frames++] = -1;
        got_request(f, fw->request);
        break;
    case TIERKV__FORWARD__BODY_REQUESTS:
        f->size[f->frames++] = (int)fw->requests->n_requests;
        for (size_t i = 0; i < fw->requests->n_requests; i++)
            got_request(f, fw->requests->requests[i]);
        break;
    case TIERKV__FORWARD__BODY_RESPONSE:
        f->answer_frames++;
        got_answer(f, fw->response);
        break;
    case TIERKV__FORWARD__BODY_RESPONSES:
        f->answer_frames++;
        f->answer_batches++;
        for (size_t i = 0; i < fw->responses->n_responses; i++)
            got_answer(f, fw->responses->responses[i]);
        break;
    default:
        ck_abort_msg("node 1 sent a forward frame without a body");
    }
    tierkv__forward__free_unpacked(fw, NULL);
}

static void fake_closed(struct transport *t, void *data)
{
    struct fake *f = data;
    (void)t;
    f->closed = true;
}

static void fake_open(struct env *e, struct fake *f, uint64_t id)
{
    struct transport_callbacks cbs = {
        .recv = fake_recv, .forward = fake_forward, .data = f};
    ck_assert_int_eq(transport_inproc_new(e->hub, &e->loop, id, 0, &cbs, &f->t), 0);
}

static void turn(struct env *e, int times)
{
    for (int i = 0; i < times; i++) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

/* Fake node `from` (2: e->leader, 3: e->other) heartbeats in term
 * e->term: node 1 follows it. */
static void heartbeat_from(struct env *e, uint64_t from)
{
    struct raft_message hb = {
        .type = RAFT_MSG_APPEND, .from = from, .to = 1, .term = e->term};
    ck_assert_int_eq(transport_send(from == 2 ? e->leader.t : e->other.t, &hb), 0);
    struct node_status st = {0};
    for (int i = 0; i < 2000 && (st.leader != from || st.term != e->term); i++) {
        turn(e, 1);
        node_status(e->n, &st);
    }
    ck_assert_uint_eq(st.leader, from);
    ck_assert_uint_eq(st.term, e->term);
}

static void heartbeat(struct env *e)
{
    heartbeat_from(e, 2);
}

static void env_start(struct env *e)
{
    memset(e, 0, sizeof(*e));
    ck_assert_int_eq(uv_loop_init(&e->loop), 0);
    e->hub = transport_inproc_hub_new(7);
    struct node_options o;
    node_options_default(&o);
    o.id = 1;
    o.members.n_voters = 3; /* 3: e->other, a leader in one test */
    o.members.voters[0] = 1;
    o.members.voters[1] = 2;
    o.members.voters[2] = 3;
    o.hub = e->hub;
    o.loop = &e->loop;
    o.election_ticks = 3000; /* 30 s: node 1 never campaigns during a test */
    o.kv_no_sync = true;
    ck_assert_int_eq(node_start(&o, &e->n), 0);
    fake_open(e, &e->leader, 2);
    fake_open(e, &e->other, 3);
    e->term = 1;
    heartbeat(e);
}

static void *stop_thread(void *arg)
{
    struct env *e = arg;
    node_stop(e->n);
    atomic_store(&e->stopped, true);
    return NULL;
}

/* Stops node 1: every write of the test has ended exactly once by then. */
static void env_stop(struct env *e)
{
    pthread_t th; /* node_stop waits for the loop, which this thread runs */
    ck_assert_int_eq(pthread_create(&th, NULL, stop_thread, e), 0);
    while (!atomic_load(&e->stopped))
        turn(e, 1);
    pthread_join(th, NULL);
    for (int i = 0; i < e->n_slots; i++)
        ck_assert_int_eq(e->slots[i].done, 1);
    transport_close(e->leader.t, fake_closed, &e->leader);
    transport_close(e->other.t, fake_closed, &e->other);
    while (!e->leader.closed || !e->other.closed)
        uv_run(&e->loop, UV_RUN_ONCE);
    ck_assert_int_eq(uv_loop_close(&e->loop), 0);
    transport_inproc_hub_free(e->hub);
}

static void slot_done(struct node_req *req, int status, const struct kv_result *res,
                      void *data)
{
    struct slot *s = data;
    (void)req;
    s->done++;
    s->status = status;
    s->revision = res != NULL ? res->revision : 0;
}

/* Submits `n` writes of `bytes` each (not run yet: the next turn drains them
 * together); the first slot's index. */
static int submit(struct env *e, int n, size_t bytes, uint64_t timeout_ms)
{
    int first = e->n_slots;
    for (int i = 0; i < n; i++) {
        ck_assert_int_lt(e->n_slots, GOT_MAX);
        struct slot *s = &e->slots[e->n_slots++];
        s->req.mode = NODE_MODE_APPLIED;
        s->req.cmd = tk_blob_new(bytes);
        memset(s->req.cmd->data, 'c', bytes);
        s->req.timeout_ms = timeout_ms;
        s->req.write_cb = slot_done;
        s->req.data = s;
        ck_assert_int_eq(node_submit(e->n, &s->req), 0);
    }
    return first;
}

/* Turns the loop until the fake has `n` requests. */
static void wait_got(struct env *e, int n)
{
    for (int i = 0; i < 2000 && e->leader.n_got < n; i++)
        turn(e, 1);
    ck_assert_int_eq(e->leader.n_got, n);
}

static void wait_done(struct env *e, int first, int n)
{
    for (int t = 0; t < 3000; t++) {
        int done = 0;
        for (int i = first; i < first + n; i++)
            done += e->slots[i].done;
        if (done == n)
            return;
        turn(e, 1);
    }
    ck_abort_msg("writes %d..%d never all ended", first, first + n - 1);
}

/* One answer to pack: request `g`, as status and revision say. */
struct reply {
    const struct got *g;
    uint8_t token[16];
    int status;
    uint64_t revision;
    uint8_t enc[KV_RESULT_ENCODED_MAX];
};

static void reply_init(struct reply *r, const struct got *g, int status,
                       uint64_t revision)
{
    r->g = g;
    memcpy(r->token, g->token, 16);
    r->status = status;
    r->revision = revision;
}

static void fill_response(Tierkv__ForwardResponse *p, struct reply *r, bool batch_ok)
{
    tierkv__forward_response__init(p);
    p->id = r->g->id;
    p->token.data = r->token;
    p->token.len = 16;
    p->status = r->status;
    p->batch_ok = batch_ok;
    if (r->status == 0) {
        struct kv_result res = {.revision = r->revision};
        _Static_assert(KV_RESULT_ENCODED_MAX <= 4096, "a result fits in struct reply");
        p->result.data = r->enc;
        p->result.len = kv_result_encode(&res, r->enc);
    }
}

/* Sends one answer alone, from `f`, saying batch_ok or not. */
static void send_single(struct fake *f, struct reply *r, bool batch_ok)
{
    Tierkv__ForwardResponse p;
    fill_response(&p, r, batch_ok);
    Tierkv__Forward fw = TIERKV__FORWARD__INIT;
    fw.body_case = TIERKV__FORWARD__BODY_RESPONSE;
    fw.response = &p;
    uint8_t buf[256];
    ck_assert_uint_le(tierkv__forward__get_packed_size(&fw), sizeof(buf));
    size_t len = tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(f->t, 1, buf, len), 0);
}

/* Sends `n` answers in one ForwardResponses frame from `f`. */
static void send_batch(struct fake *f, struct reply *r, size_t n)
{
    Tierkv__ForwardResponse p[GOT_MAX], *pp[GOT_MAX];
    ck_assert_uint_le(n, GOT_MAX);
    for (size_t i = 0; i < n; i++) {
        fill_response(&p[i], &r[i], false);
        pp[i] = &p[i];
    }
    Tierkv__ForwardResponses b = TIERKV__FORWARD_RESPONSES__INIT;
    b.n_responses = n;
    b.responses = pp;
    Tierkv__Forward fw = TIERKV__FORWARD__INIT;
    fw.body_case = TIERKV__FORWARD__BODY_RESPONSES;
    fw.responses = &b;
    size_t len = tierkv__forward__get_packed_size(&fw);
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(f->t, 1, buf, len), 0);
    free(buf);
}

/* The fake as a new-build leader: it answers node 1's first write alone
 * with batch_ok, so node 1's next writes travel in batches. */
static void learn_batches(struct env *e)
{
    int s = submit(e, 1, 16, 0);
    wait_got(e, e->leader.n_got + 1);
    ck_assert_int_eq(e->leader.size[e->leader.frames - 1], -1);
    struct got *g = &e->leader.got[e->leader.n_got - 1];
    ck_assert(g->batch_ok); /* node 1 says it takes batched answers */
    struct reply r;
    reply_init(&r, g, 0, 1);
    send_single(&e->leader, &r, true);
    wait_done(e, s, 1);
    ck_assert_int_eq(e->slots[s].status, 0);
}

/* Writes submitted together travel in one frame once the leader said it
 * takes batches, and not before (a leader of an older build never says so);
 * each answer of a batched reply completes its own request once, and a
 * forged, misrouted, unknown or duplicate answer inside the batch is
 * dropped. */
START_TEST(test_writes_of_one_turn_travel_in_one_batch)
{
    struct env e;
    env_start(&e);
    /* An old leader: its answers lack batch_ok; writes keep going alone. */
    int s = submit(&e, 1, 16, 0);
    wait_got(&e, 1);
    struct reply r[16];
    reply_init(&r[0], &e.leader.got[0], 0, 1);
    send_single(&e.leader, &r[0], false);
    wait_done(&e, s, 1);
    s = submit(&e, 5, 16, 0);
    wait_got(&e, 6);
    ck_assert_int_eq(e.leader.frames, 6);
    for (int i = 1; i < 6; i++)
        ck_assert_int_eq(e.leader.size[i], -1);
    for (int i = 0; i < 5; i++) {
        reply_init(&r[i], &e.leader.got[1 + i], 0, 10 + (uint64_t)i);
        send_single(&e.leader, &r[i], i == 4); /* the last says batch_ok */
    }
    wait_done(&e, s, 5);
    /* Ten writes of one turn: one frame. */
    s = submit(&e, 10, 16, 0);
    wait_got(&e, 16);
    ck_assert_int_eq(e.leader.frames, 7);
    ck_assert_int_eq(e.leader.size[6], 10);
    const struct got *g = &e.leader.got[6];
    /* Answers out of order, among them a forged token, an unknown id and
     * twice the same answer; a right answer sent by another peer. */
    struct reply b[14];
    for (int i = 0; i < 10; i++)
        reply_init(&b[i], &g[9 - i], 0, 100 + (uint64_t)(9 - i));
    reply_init(&b[10], &g[3], 0, 999);
    b[10].token[0] ^= 1;               /* forged */
    reply_init(&b[11], &g[4], 0, 998); /* the duplicate, after the answer */
    reply_init(&b[12], &g[0], 0, 997);
    struct got unknown = g[0];
    unknown.id += 1000;
    b[12].g = &unknown;
    reply_init(&b[13], &g[5], 0, 996);
    /* The right id and token for g[5], from a peer it was not sent to. */
    send_batch(&e.other, &b[13], 1);
    turn(&e, 30);
    ck_assert_int_eq(e.slots[s + 5].done, 0);
    struct reply all[13];
    memcpy(all, &b[10], sizeof(b[10]));    /* the forgery first */
    memcpy(all + 1, b, 10 * sizeof(b[0])); /* then the ten */
    memcpy(all + 11, &b[11], 2 * sizeof(b[0]));
    send_batch(&e.leader, all, 13);
    wait_done(&e, s, 10);
    turn(&e, 30);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(e.slots[s + i].done, 1);
        ck_assert_int_eq(e.slots[s + i].status, 0);
        ck_assert_uint_eq(e.slots[s + i].revision, 100 + (uint64_t)i);
    }
    env_stop(&e);
}
END_TEST

/* A batch holds at most NODE_FWD_BATCH_MAX writes and NODE_FWD_BATCH_BYTES
 * of them: more in one turn travel in several frames, each in its bounds,
 * and a command over NODE_FWD_ALONE_BYTES travels alone. */
START_TEST(test_a_batch_at_its_bound_splits)
{
    struct env e;
    env_start(&e);
    learn_batches(&e);
    int frames = e.leader.frames, got = e.leader.n_got;
    int s = submit(&e, NODE_FWD_BATCH_MAX + 5, 16, 0);
    wait_got(&e, got + NODE_FWD_BATCH_MAX + 5);
    ck_assert_int_eq(e.leader.frames, frames + 2);
    ck_assert_int_eq(e.leader.size[frames], NODE_FWD_BATCH_MAX);
    ck_assert_int_eq(e.leader.size[frames + 1], 5);
    /* Twelve writes of 3 KiB (36 KiB) and one of 8 KiB. */
    frames = e.leader.frames;
    got = e.leader.n_got;
    submit(&e, 12, 3 * 1024, 0);
    submit(&e, 1, 8 * 1024, 0);
    wait_got(&e, got + 13);
    int batched = 0, alone = 0;
    for (int i = frames; i < e.leader.frames; i++) {
        ck_assert_uint_le(e.leader.bytes[i], NODE_FWD_BATCH_BYTES + 64);
        if (e.leader.size[i] > 0)
            batched += e.leader.size[i];
        else
            alone++;
    }
    ck_assert_int_eq(batched, 12);
    ck_assert_int_eq(alone, 1);                    /* the 8 KiB one */
    ck_assert_int_ge(e.leader.frames - frames, 3); /* 36 KiB: two batches at least */
    /* The leader lost its leadership meanwhile: not_leader for every one,
     * in one batch. */
    static struct reply r[GOT_MAX];
    int n = e.leader.n_got - (got - NODE_FWD_BATCH_MAX - 5);
    for (int i = 0; i < n; i++)
        reply_init(&r[i], &e.leader.got[got - NODE_FWD_BATCH_MAX - 5 + i], TK_ENOTLEADER,
                   0);
    send_batch(&e.leader, r, (size_t)n);
    wait_done(&e, s, n);
    for (int i = s; i < s + n; i++)
        ck_assert_int_eq(e.slots[i].status, TK_ENOTLEADER);
    env_stop(&e);
}
END_TEST

/* The leader changes while a batch waits: what it answered ends with its
 * answer (a result, or not_leader), what it never answered at its deadline;
 * every write once. After the new term the next write goes alone again, with
 * batch_ok, until the leader of that term says it takes batches (a leader
 * restarted on an older build could lead it). */
START_TEST(test_a_leader_change_mid_batch_ends_every_write)
{
    struct env e;
    env_start(&e);
    learn_batches(&e);
    int got = e.leader.n_got, frames = e.leader.frames;
    int s = submit(&e, 10, 16, 300);
    wait_got(&e, got + 10);
    ck_assert_int_eq(e.leader.frames, frames + 1);
    struct reply r[7];
    for (int i = 0; i < 7; i++)
        reply_init(&r[i], &e.leader.got[got + i], i < 4 ? 0 : TK_ENOTLEADER,
                   50 + (uint64_t)i);
    send_batch(&e.leader, r, 7);
    wait_done(&e, s, 7);
    e.term = 2; /* a new election, the same leader */
    heartbeat(&e);
    wait_done(&e, s, 10); /* the last three at their deadline */
    for (int i = 0; i < 10; i++) {
        int want = i < 4 ? 0 : i < 7 ? TK_ENOTLEADER : TK_ETIMEDOUT;
        ck_assert_int_eq(e.slots[s + i].status, want);
    }
    /* Late answers for the three: dropped. */
    for (int i = 0; i < 3; i++)
        reply_init(&r[i], &e.leader.got[got + 7 + i], 0, 1);
    send_batch(&e.leader, r, 3);
    turn(&e, 20);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(e.slots[s + i].done, 1);
    /* Term 2: alone until the leader says batch_ok again. */
    frames = e.leader.frames;
    int s2 = submit(&e, 3, 16, 0);
    wait_got(&e, got + 13);
    ck_assert_int_eq(e.leader.frames, frames + 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(e.leader.size[frames + i], -1);
        reply_init(&r[i], &e.leader.got[got + 10 + i], 0, 60);
        send_single(&e.leader, &r[i], true);
    }
    wait_done(&e, s2, 3);
    submit(&e, 3, 16, 0);
    wait_got(&e, got + 16);
    ck_assert_int_eq(e.leader.size[e.leader.frames - 1], 3);
    for (int i = 0; i < 3; i++)
        reply_init(&r[i], &e.leader.got[got + 13 + i], 0, 61);
    send_batch(&e.leader, r, 3);
    env_stop(&e);
}
END_TEST

/* Writes parked for leader 2 when node 3 becomes leader (2 died: it never
 * answers) end at once with TK_ETIMEDOUT, their outcome unknown, not at
 * their 30 s deadline; a write parked with the new leader stays, and its
 * answer completes it. */
START_TEST(test_writes_parked_for_an_old_leader_end_when_another_leads)
{
    struct env e;
    env_start(&e);
    int got = e.leader.n_got;
    int s = submit(&e, 4, 16, 30000);
    wait_got(&e, got + 4);
    struct node_metrics m0;
    node_metrics(e.n, &m0);
    uint64_t t0 = uv_now(&e.loop);
    e.term = 2;
    heartbeat_from(&e, 3);
    wait_done(&e, s, 4);
    uint64_t took = uv_now(&e.loop) - t0;
    printf("writes parked for the old leader ended %llu ms after node 3 led\n",
           (unsigned long long)took);
    ck_assert_uint_lt(took, 10000); /* their deadline: 30 s */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(e.slots[s + i].status, TK_ETIMEDOUT);
    struct node_metrics m1;
    node_metrics(e.n, &m1);
    ck_assert_uint_eq(m1.forward_orphaned - m0.forward_orphaned, 4);
    /* Late answers from 2: dropped; every write ended once. */
    struct reply r[4];
    for (int i = 0; i < 4; i++)
        reply_init(&r[i], &e.leader.got[got + i], 0, 70);
    send_batch(&e.leader, r, 4);
    turn(&e, 20);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(e.slots[s + i].done, 1);
    env_stop(&e);
}
END_TEST

/* A batch of requests to node 1, a follower, is refused in one batch of
 * answers (not_leader, each id and token echoed); a request alone from an
 * older build (no batch_ok) is answered alone, saying batch_ok. */
START_TEST(test_a_batch_to_a_follower_is_refused_in_one_batch)
{
    struct env e;
    env_start(&e);
    Tierkv__ForwardRequest q[3], *qp[3];
    uint8_t tokens[3][16];
    for (int i = 0; i < 3; i++) {
        tierkv__forward_request__init(&q[i]);
        memset(tokens[i], 'a' + i, 16);
        q[i].id = 40 + (uint64_t)i;
        q[i].token.data = tokens[i];
        q[i].token.len = 16;
        q[i].command.data = (uint8_t *)"cmd";
        q[i].command.len = 3;
        qp[i] = &q[i];
    }
    Tierkv__ForwardRequests b = TIERKV__FORWARD_REQUESTS__INIT;
    b.n_requests = 3;
    b.requests = qp;
    Tierkv__Forward fw = TIERKV__FORWARD__INIT;
    fw.body_case = TIERKV__FORWARD__BODY_REQUESTS;
    fw.requests = &b;
    uint8_t buf[512];
    size_t len = tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(e.leader.t, 1, buf, len), 0);
    for (int i = 0; i < 2000 && e.leader.n_ans < 3; i++)
        turn(&e, 1);
    ck_assert_int_eq(e.leader.n_ans, 3);
    ck_assert_int_eq(e.leader.answer_frames, 1);
    ck_assert_int_eq(e.leader.answer_batches, 1);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(e.leader.ans[i].id, 40 + (uint64_t)i);
        ck_assert(memcmp(e.leader.ans[i].token, tokens[i], 16) == 0);
        ck_assert_int_eq(e.leader.ans[i].status, TK_ENOTLEADER);
    }
    /* As an older build forwards: alone, no batch_ok. */
    fw.body_case = TIERKV__FORWARD__BODY_REQUEST;
    fw.request = &q[0];
    len = tierkv__forward__pack(&fw, buf);
    ck_assert_int_eq(transport_send_forward(e.leader.t, 1, buf, len), 0);
    for (int i = 0; i < 2000 && e.leader.n_ans < 4; i++)
        turn(&e, 1);
    ck_assert_int_eq(e.leader.answer_frames, 2);
    ck_assert_int_eq(e.leader.answer_batches, 1);
    ck_assert(e.leader.ans[3].batch_ok);
    env_stop(&e);
}
END_TEST

/* ---- a cluster ---- */

#define WRITERS 4
#define WRITES_EACH 150

struct writer {
    struct tk_node *n;
    int w;
    uint64_t revisions[WRITES_EACH];
    int failed;
};

static void *write_many(void *arg)
{
    struct writer *w = arg;
    for (int i = 0; i < WRITES_EACH; i++) {
        char k[32], v[32];
        snprintf(k, sizeof(k), "w%d/%d", w->w, i);
        snprintf(v, sizeof(v), "v%d", i);
        struct tk_write_result res;
        int rc = tk_put(w->n, k, strlen(k), v, strlen(v), TK_MODE_APPLIED, &res);
        if (rc != 0) {
            fprintf(stderr, "put %s: %s\n", k, tk_strerror(rc));
            w->failed++;
            continue;
        }
        w->revisions[i] = res.revision;
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Writes from several threads at once on a follower: each answered once,
 * with its own result (all revisions distinct), and every value there. */
START_TEST(test_concurrent_writes_on_a_follower_each_end_once)
{
    struct tk_options o;
    nf_options(&o);
    o.seed = 42;
    struct tk_cluster *c = nf_cluster_start(3, &o);
    struct tk_node *l = nf_cluster_leader(c);
    struct tk_node *f = nf_cluster_other(c, l);
    for (int t = 0; t < 2000 && tk_node_leader(f) == 0; t++)
        usleep(5000);
    static struct writer w[WRITERS];
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].n = f;
        w[i].w = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, write_many, &w[i]), 0);
    }
    static uint64_t all[WRITERS * WRITES_EACH];
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(w[i].failed, 0);
        memcpy(all + i * WRITES_EACH, w[i].revisions, sizeof(w[i].revisions));
    }
    qsort(all, WRITERS * WRITES_EACH, sizeof(all[0]), cmp_u64);
    for (int i = 1; i < WRITERS * WRITES_EACH; i++)
        ck_assert_uint_gt(all[i], all[i - 1]);
    for (int i = 0; i < WRITERS; i++) {
        char k[32];
        snprintf(k, sizeof(k), "w%d/%d", i, WRITES_EACH - 1);
        struct tk_value v;
        ck_assert_int_eq(tk_get(l, k, strlen(k), TK_READ_LINEARIZABLE, &v), 0);
        char want[32];
        snprintf(want, sizeof(want), "v%d", WRITES_EACH - 1);
        ck_assert_uint_eq(v.len, strlen(want));
        ck_assert(memcmp(v.value, want, v.len) == 0);
        tk_value_free(&v);
    }
    tk_cluster_stop(c);
}
END_TEST

static Suite *forward_batch_suite(void)
{
    Suite *s = suite_create("node-forward-batch");
    TCase *tc = tcase_create("batch");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_writes_of_one_turn_travel_in_one_batch);
    tcase_add_test(tc, test_a_batch_at_its_bound_splits);
    tcase_add_test(tc, test_a_leader_change_mid_batch_ends_every_write);
    tcase_add_test(tc, test_a_batch_to_a_follower_is_refused_in_one_batch);
    tcase_add_test(tc, test_writes_parked_for_an_old_leader_end_when_another_leads);
    tcase_add_test(tc, test_concurrent_writes_on_a_follower_each_end_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tk_check_run(srunner_create(forward_batch_suite()));
}
