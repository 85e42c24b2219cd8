/* The client loop (node_options.on_client_start, node/node_client.c; issue
 * 48): completions on the client's thread in batches, reads holding the state
 * lock, a lock that really keeps the consensus loop out, calls posted to it
 * (node_client_call) from the node's loop and another thread, and a stop that
 * delivers every request's end and every call before node_stop returns. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "base/clock.h"
#include "base/err.h"
#include "kv/kv.h"
#include "node/node.h"
#include "tests/unit/node/node_fixture.h"

#define WRITES 400

struct creq {
    struct node_req nreq;
    struct kv_result res;
    char key[32];
};

/* Everything below but the atomics is the client loop's alone. */
struct client {
    struct node *n;
    uv_loop_t *loop;
    uv_timer_t timer;
    pthread_t thread, node_thread;
    atomic_int started, stopped, applied_calls, failures, done_writes, done_reads,
        shut_down;
    int phase;
    int submitted;
    struct creq reqs[WRITES];
    struct creq reads[WRITES / 2];
    char failure[256];
    /* test_state_lock_keeps_the_loop_out: applied before and after a hold */
    uint64_t held_before, held_after, final_applied;
    atomic_int held, all_submitted, final_read;
    /* node_client_call: calls run (on the client's thread, before
     * on_client_stop), and whether the node's loop posted one */
    atomic_int calls, loop_called;
    /* test_stop_delivers_everything: submit, then stop at once */
    bool stop_test;
};

static void note_failure(struct client *c, const char *what)
{
    if (atomic_fetch_add(&c->failures, 1) == 0)
        snprintf(c->failure, sizeof(c->failure), "%s", what);
}

static void on_write(struct node_req *req, int status, const struct kv_result *res,
                     void *data)
{
    struct client *c = data;
    (void)req;
    if (!pthread_equal(pthread_self(), c->thread))
        note_failure(c, "a write completed off the client loop's thread");
    if (status == TK_ESHUTDOWN) {
        atomic_fetch_add(&c->shut_down, 1);
    } else if (status != 0 || res == NULL || res->code != 0 || res->revision == 0) {
        note_failure(c, "a write failed or came without its result");
    } else if (node_applied_index(c->n) < res->revision) {
        note_failure(c, "node_applied_index is below a completed write's revision");
    }
    atomic_fetch_add(&c->done_writes, 1);
}

static void on_read(struct node_req *req, int status, struct kv_sm *sm, void *data)
{
    struct client *c = data;
    struct creq *r = (struct creq *)req;
    if (!pthread_equal(pthread_self(), c->thread))
        note_failure(c, "a read completed off the client loop's thread");
    if (status == 0) {
        struct kv_item it;
        if (sm == NULL || kv_sm_get(sm, r->key, strlen(r->key), &it) != 0 ||
            it.value_len != 5 || memcmp(it.value, "value", 5) != 0)
            note_failure(c, "a read did not find its key's value");
    } else if (status != TK_ESHUTDOWN) {
        note_failure(c, "a read failed");
    }
    atomic_fetch_add(&c->done_reads, 1);
}

static void submit_writes(struct client *c, int count)
{
    for (int i = 0; i < count && c->submitted < WRITES; i++) {
        struct creq *r = &c->reqs[c->submitted];
        memset(r, 0, sizeof(*r));
        snprintf(r->key, sizeof(r->key), "k%d", c->submitted);
        r->nreq.cmd = nf_put_cmd(r->key, strlen(r->key), "value", 5);
        r->nreq.write_cb = on_write;
        r->nreq.data = c;
        r->nreq.on_client = 1;
        r->nreq.res_out = &r->res;
        if (node_submit(c->n, &r->nreq) != 0) {
            tk_blob_unref(r->nreq.cmd);
            note_failure(c, "node_submit refused a write");
            return;
        }
        c->submitted++;
    }
}

static void submit_reads(struct client *c)
{
    for (int i = 0; i < WRITES / 2; i++) { /* the keys written so far */
        struct creq *r = &c->reads[i];
        memset(r, 0, sizeof(*r));
        snprintf(r->key, sizeof(r->key), "k%d", i);
        r->nreq.is_read = 1;
        r->nreq.consistency = i % 2 ? NODE_READ_STALE : NODE_READ_LINEARIZABLE;
        r->nreq.read_cb = on_read;
        r->nreq.data = c;
        r->nreq.on_client = 1;
        if (node_submit(c->n, &r->nreq) != 0)
            note_failure(c, "node_submit refused a read");
    }
}

/* Every 5 ms on the client loop: phase 0 waits for a leader and writes, 1
 * waits for the writes and reads, 2 holds the state lock with writes in
 * flight, 3 waits for all of it. */
static void on_timer(uv_timer_t *t)
{
    struct client *c = t->data;
    struct node_status st;
    node_status(c->n, &st);
    if (c->stop_test) {
        if (c->phase == 0 && st.leader == 1) {
            submit_writes(c, WRITES);
            c->phase = 1;
            atomic_store(&c->all_submitted, 1);
        }
        return;
    }
    switch (c->phase) {
    case 0:
        if (st.leader == 1) {
            submit_writes(c, WRITES / 2);
            c->phase = 1;
        }
        break;
    case 1:
        if (atomic_load(&c->done_writes) == WRITES / 2) {
            submit_reads(c);
            c->phase = 2;
        }
        break;
    case 2:
        if (atomic_load(&c->done_reads) < WRITES / 2)
            break;
        /* The state held for 100 ms with writes submitted meanwhile: the
         * node may apply none of them before it is let go. */
        if (!node_client_lock(c->n)) {
            note_failure(c, "node_client_lock refused while the node runs");
            break;
        }
        c->held_before = kv_sm_applied_index(node_kv(c->n));
        submit_writes(c, WRITES / 2);
        usleep(100000);
        c->held_after = kv_sm_applied_index(node_kv(c->n));
        node_client_unlock(c->n, false);
        atomic_store(&c->held, 1);
        c->phase = 3;
        break;
    case 3: /* every write done: the state's applied index, under the lock */
        if (atomic_load(&c->done_writes) < WRITES || !node_client_lock(c->n))
            break;
        c->final_applied = kv_sm_applied_index(node_kv(c->n));
        node_client_unlock(c->n, false);
        atomic_store(&c->final_read, 1);
        c->phase = 4;
        break;
    default:
        break;
    }
}

static void on_client_start(struct node *n, uv_loop_t *loop, void *data)
{
    struct client *c = data;
    c->n = n;
    c->loop = loop;
    c->thread = pthread_self();
    /* Counted: two users on, one off, still on. */
    node_client_want_applied(n, true);
    node_client_want_applied(n, true);
    node_client_want_applied(n, false);
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    uv_timer_start(&c->timer, on_timer, 5, 5);
    atomic_store(&c->started, 1);
}

static void on_client_stop(struct node *n, uv_loop_t *loop, void *data)
{
    struct client *c = data;
    (void)n;
    (void)loop;
    if (!pthread_equal(pthread_self(), c->thread))
        note_failure(c, "on_client_stop ran off the client loop's thread");
    uv_close((uv_handle_t *)&c->timer, NULL);
    atomic_store(&c->stopped, 1);
}

static void on_client_applied(struct node *n, uv_loop_t *loop, void *data)
{
    struct client *c = data;
    (void)n;
    (void)loop;
    if (!pthread_equal(pthread_self(), c->thread))
        note_failure(c, "on_client_applied ran off the client loop's thread");
    atomic_fetch_add(&c->applied_calls, 1);
}

static void on_call(void *arg)
{
    struct client *c = arg;
    if (!pthread_equal(pthread_self(), c->thread))
        note_failure(c, "a node_client_call ran off the client loop's thread");
    if (atomic_load(&c->stopped))
        note_failure(c, "a node_client_call ran after on_client_stop");
    atomic_fetch_add(&c->calls, 1);
}

/* On the node's loop, after an apply: one call posted from there. */
static void on_node_applied(struct node *n, uv_loop_t *loop, void *data)
{
    struct client *c = data;
    (void)loop;
    if (atomic_exchange(&c->loop_called, 1) == 0)
        node_client_call(n, on_call, c);
}

static void on_loop_start(struct node *n, uv_loop_t *loop, void *data)
{
    struct client *c = data;
    (void)n;
    (void)loop;
    c->node_thread = pthread_self();
}

static struct node *client_node_start(struct client *c, struct transport_inproc_hub *hub)
{
    struct node_options o;
    nf_node_options(&o, hub);
    o.on_loop_start = on_loop_start;
    o.on_applied = on_node_applied;
    o.hook_data = c;
    o.on_client_start = on_client_start;
    o.on_client_stop = on_client_stop;
    o.on_client_applied = on_client_applied;
    o.client_hook_data = c;
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    ck_assert_msg(atomic_load(&c->started), "node_start returned before on_client_start");
    ck_assert_msg(!pthread_equal(c->thread, c->node_thread),
                  "the client loop runs on the node's thread");
    return n;
}

START_TEST(test_completions_come_to_the_client_loop)
{
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct client *c = calloc(1, sizeof(*c));
    struct node *n = client_node_start(c, hub);
    uint64_t t0 = tk_mono_ms();
    while (atomic_load(&c->done_writes) < WRITES && atomic_load(&c->failures) == 0 &&
           tk_mono_ms() - t0 < NF_WAIT_MS)
        usleep(2000);
    while (!atomic_load(&c->final_read) && atomic_load(&c->failures) == 0 &&
           tk_mono_ms() - t0 < NF_WAIT_MS)
        usleep(2000);
    node_client_call(n, on_call, c); /* from this thread */
    while (atomic_load(&c->calls) < 2 && tk_mono_ms() - t0 < NF_WAIT_MS)
        usleep(2000);
    node_stop(n);
    transport_inproc_hub_free(hub);
    printf("client loop: %d writes, %d reads, %d applied calls; state held 100 ms: "
           "applied %llu before, %llu after, %llu at the end\n",
           atomic_load(&c->done_writes), atomic_load(&c->done_reads),
           atomic_load(&c->applied_calls), (unsigned long long)c->held_before,
           (unsigned long long)c->held_after, (unsigned long long)c->final_applied);
    ck_assert_msg(atomic_load(&c->failures) == 0, "%s", c->failure);
    ck_assert_int_eq(atomic_load(&c->done_writes), WRITES);
    ck_assert_int_eq(atomic_load(&c->done_reads), WRITES / 2);
    ck_assert_int_eq(atomic_load(&c->shut_down), 0);
    ck_assert(atomic_load(&c->applied_calls) > 0);
    ck_assert(atomic_load(&c->stopped));
    ck_assert_int_eq(atomic_load(&c->loop_called), 1);
    ck_assert_int_eq(atomic_load(&c->calls), 2);
    /* The lock kept the node out: nothing applied while it was held, though
     * writes were in flight, and they all applied after. */
    ck_assert(atomic_load(&c->held));
    ck_assert(atomic_load(&c->final_read));
    ck_assert_uint_eq(c->held_before, c->held_after);
    ck_assert_uint_gt(c->final_applied, c->held_after);
    free(c);
}
END_TEST

START_TEST(test_stop_delivers_every_end_before_returning)
{
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    struct client *c = calloc(1, sizeof(*c));
    c->stop_test = true;
    struct node *n = client_node_start(c, hub);
    uint64_t t0 = tk_mono_ms();
    while (!atomic_load(&c->all_submitted) && tk_mono_ms() - t0 < NF_WAIT_MS)
        usleep(1000);
    node_client_call(n, on_call, c); /* runs before on_client_stop */
    node_stop(n); /* writes in flight: each ends, applied or TK_ESHUTDOWN */
    transport_inproc_hub_free(hub);
    printf("stop: %d writes submitted, %d ended (%d TK_ESHUTDOWN)\n", c->submitted,
           atomic_load(&c->done_writes), atomic_load(&c->shut_down));
    ck_assert_msg(atomic_load(&c->failures) == 0, "%s", c->failure);
    ck_assert_int_eq(c->submitted, WRITES);
    ck_assert_int_eq(atomic_load(&c->done_writes), WRITES);
    ck_assert(atomic_load(&c->stopped));
    ck_assert_int_eq(atomic_load(&c->calls), 1 + atomic_load(&c->loop_called));
    free(c);
}
END_TEST

static void never_write(struct node_req *req, int status, const struct kv_result *res,
                        void *data)
{
    (void)req;
    (void)status;
    (void)res;
    (void)data;
    ck_abort_msg("a refused request's callback ran");
}

START_TEST(test_on_client_needs_a_client_loop_and_a_result_room)
{
    struct transport_inproc_hub *hub = transport_inproc_hub_new(3);
    /* A node without a client loop refuses on_client requests. */
    struct node_options o;
    nf_node_options(&o, hub);
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    struct node_req r = {.write_cb = never_write, .on_client = 1};
    struct kv_result res;
    r.res_out = &res;
    r.cmd = nf_put_cmd("k", 1, "v", 1);
    ck_assert_int_eq(node_submit(n, &r), TK_EINVAL);
    ck_assert(!node_client_lock(n));
    node_stop(n);
    /* With one, a write without res_out is refused. */
    struct client *c = calloc(1, sizeof(*c));
    c->stop_test = true;
    c->phase = 99; /* submits nothing */
    n = client_node_start(c, hub);
    r.res_out = NULL;
    ck_assert_int_eq(node_submit(n, &r), TK_EINVAL);
    tk_blob_unref(r.cmd);
    node_stop(n);
    /* A shared loop cannot have one. */
    uv_loop_t loop;
    uv_loop_init(&loop);
    nf_node_options(&o, hub);
    o.loop = &loop;
    o.on_client_start = on_client_start;
    ck_assert_int_eq(node_start(&o, &n), TK_EINVAL);
    uv_loop_close(&loop);
    transport_inproc_hub_free(hub);
    free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node_client");
    TCase *tc = tcase_create("client_loop");
    tcase_add_test(tc, test_completions_come_to_the_client_loop);
    tcase_add_test(tc, test_stop_delivers_every_end_before_returning);
    tcase_add_test(tc, test_on_client_needs_a_client_loop_and_a_result_room);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
