/* The client loop (node.h, node_options.on_client_start; issue 48): a second
 * thread with a libuv loop of its own, "tk-client-<id>", for client work (an
 * HTTP gateway's and the etcd API's accepting, TLS, parsing, encoding and
 * answers), so that what a client costs is spent off the consensus loop,
 * which runs Raft, the transport, storage completions and apply.
 *
 * The two meet in two places:
 * - Requests go to the node as before (node_submit: a bounded MPSC queue).
 *   Submitted on the client loop's thread, they only queue: the client
 *   loop's last prepare callback of a turn (on_flush) wakes the consensus
 *   loop once for all of them. Their completions come back in the client
 *   loop's inbox, a list in arrival order under a mutex: node__client_post
 *   appends one (a write's result copied to its res_out), and the consensus
 *   loop's last prepare callback of the turn (on_wait) wakes the client
 *   loop once if the turn posted to an empty inbox. So each side wakes the
 *   other at most once a turn, and never in the middle of its own turn,
 *   when the woken thread would take the waker's CPU on this 2-core VM
 *   (issue 48 item 5: a context switch costs 5-10 us of CPU here). Calls
 *   (node_client_call) go in a second list beside the inbox, woken at once.
 * - The state lock (state_mu): the consensus loop holds it while a turn
 *   runs and through its waits for events, but hands it to a client that
 *   asks (waking the loop) at the end of a turn (on_wait, the turn's last
 *   prepare callback), so a client holding it reads the state machine as a
 *   callback on the loop would: a read completion runs its callback holding
 *   it, and node_client_lock gives it to other client code (a watch reading
 *   the change log, a member list). Whoever lets it go while the other waits
 *   for it waits, at most STATE_HANDOFF_NS, until the other has it: a mutex
 *   alone lets the one that just released it take it back first.
 *
 * Stopping: begin_close (node.c, on the consensus loop) fails every pending
 * request: their completions go to the inbox. Meanwhile node_submit refuses
 * new ones (TK_ESHUTDOWN) and node_client_lock says no. After the consensus
 * loop's thread has ended, node__client_join fails what is still queued,
 * says final_due and joins the client thread, which delivers the rest, runs
 * on_client_stop (no completion can come after it), closes its wake-up
 * handle and ends once the hook has closed its own. The node is freed after
 * that, so the client may call node_status or node_submit until then.
 *
 * Calls: node.c (start, run, stop), node_internal.h (node__finish_*). */
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "node/node_internal.h"

/* The longest a side that let go of the state lock waits for the other to
 * take it (then it goes on regardless). */
#define STATE_HANDOFF_NS 2000000ull
/* A run of read completions holds the state lock at most this long before
 * the consensus loop, if it waits, gets a turn. */
#define READ_RUN_NS 1000000ull

/* Waits (yielding) while *flag is nonzero, at most STATE_HANDOFF_NS. */
static void handoff_wait(atomic_int *flag)
{
    if (atomic_load_explicit(flag, memory_order_acquire) == 0)
        return;
    uint64_t t0 = tk_mono_ns();
    while (atomic_load_explicit(flag, memory_order_acquire) != 0 &&
           tk_mono_ns() - t0 < STATE_HANDOFF_NS)
        sched_yield();
}

static void state_lock_loop(struct node_client *c)
{
    atomic_store_explicit(&c->loop_waiting, 1, memory_order_release);
    pthread_mutex_lock(&c->state_mu);
    atomic_store_explicit(&c->loop_waiting, 0, memory_order_release);
}

static void state_lock_client(struct node *n)
{
    struct node_client *c = &n->client;
    atomic_fetch_add_explicit(&c->waiting, 1, memory_order_acq_rel);
    /* The loop holds the lock while it waits for events: wake it, unless its
     * wake-up handle is closed (it then lets go of the lock when its loop
     * ends). */
    pthread_mutex_lock(&c->wake_mu);
    if (!c->loop_wake_closed)
        node__wake_send(&n->loop.wake);
    pthread_mutex_unlock(&c->wake_mu);
    pthread_mutex_lock(&c->state_mu);
    atomic_fetch_sub_explicit(&c->waiting, 1, memory_order_acq_rel);
    c->depth = 1;
}

/* The client lets go; the consensus loop, if it waits, goes first. */
static void state_unlock_client(struct node_client *c)
{
    c->depth = 0;
    pthread_mutex_unlock(&c->state_mu);
    handoff_wait(&c->loop_waiting);
}

/* ---- the consensus loop's side ------------------------------------------ */

void node__client_post(struct node *n, struct node_req *r, int status,
                       const struct kv_result *res)
{
    struct node_client *c = &n->client;
    r->client_status = status;
    r->client_res = res != NULL && r->res_out != NULL;
    if (r->client_res) {
        size_t ops = res->n_ops <= KV_TXN_OPS_MAX ? res->n_ops : KV_TXN_OPS_MAX;
        memcpy(r->res_out, res,
               offsetof(struct kv_result, ops) + ops * sizeof(res->ops[0]));
    }
    r->next = NULL;
    pthread_mutex_lock(&c->inbox_mu);
    bool was_empty = c->inbox_head == NULL && c->calls_head == NULL;
    if (c->inbox_head == NULL)
        c->inbox_head = r;
    else
        c->inbox_tail->next = r;
    c->inbox_tail = r;
    pthread_mutex_unlock(&c->inbox_mu);
    /* The wake-up waits for the end of the turn (on_wait): one for all of
     * a turn's completions, and the client's thread does not take this
     * thread's CPU in the middle of it. */
    if (was_empty)
        c->post_due = true;
}

void node__client_applied(struct node *n)
{
    struct node_client *c = &n->client;
    if (atomic_load_explicit(&c->applied_wanted, memory_order_relaxed) > 0 &&
        !atomic_exchange_explicit(&c->applied_due, true, memory_order_acq_rel))
        node__wake_send(&c->wake);
}

/* The wait handle's callback: the last prepare callback of each turn (it was
 * the loop's first prepare handle started, and libuv runs the newest first),
 * just before libuv waits for events. The consensus loop keeps the state lock
 * through that wait unless a client waits for it: then it lets go, waits
 * (yielding, at most STATE_HANDOFF_NS) until the client has it, and takes it
 * back, waiting for the client's hold to end. A client that wants the lock
 * wakes the loop first (state_lock_client), so the loop comes here at once
 * if it was waiting for events; so a turn costs no system call for the lock,
 * and a client's hold, a wake-up of the loop. */
static void on_wait(uv_prepare_t *h)
{
    struct node *n = h->data;
    struct node_client *c = &n->client;
    /* About to wait: clients that queue from now on wake this loop; what
     * they queued before, it takes now. The fence (Dekker's, with the one
     * in on_flush): either a client sees loop_idle, or this loop sees its
     * request queued. */
    atomic_store(&c->loop_idle, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&n->loop.queued, memory_order_relaxed) > 0)
        node__wake_send(&n->loop.wake);
    /* The turn's posts: a wake-up only for a client loop about to wait (one
     * that runs takes them before it waits: on_flush). */
    if (c->post_due) {
        c->post_due = false;
        if (atomic_load(&c->client_idle))
            node__wake_send(&c->wake);
    }
    if (atomic_load_explicit(&c->waiting, memory_order_acquire) == 0)
        return;
    uint64_t t0 = tk_mono_ns();
    pthread_mutex_unlock(&c->state_mu);
    handoff_wait(&c->waiting);
    state_lock_loop(c);
    c->ext_idle_ns += tk_mono_ns() - t0; /* the client's, not the turn's */
    uv_update_time(n->loop.uv);
}

void node__client_run(struct node *n)
{
    struct node_client *c = &n->client;
    state_lock_loop(c);
    uv_run(n->loop.uv, UV_RUN_DEFAULT);
    pthread_mutex_unlock(&c->state_mu);
}

void node__client_close(struct node *n)
{
    struct node_client *c = &n->client;
    if (!c->on)
        return;
    uv_close((uv_handle_t *)&c->wait, NULL);
    pthread_mutex_lock(&c->wake_mu); /* the loop's wake-up handle closes next */
    c->loop_wake_closed = true;
    pthread_mutex_unlock(&c->wake_mu);
}

/* ---- the client loop's side --------------------------------------------- */

struct node_client_call {
    node_call_fn *fn;
    void *arg;
    struct node_client_call *next;
};

/* The calls posted (node_client_call), in order. */
static void run_calls(struct node_client_call *k)
{
    while (k != NULL) {
        struct node_client_call *next = k->next;
        k->fn(k->arg);
        tk_free(k);
        k = next;
    }
}

/* Hands the inbox's completions to their callbacks, in order; a run of
 * successful reads that read in place (no collect_cb) holds the state lock
 * (handed to the consensus loop between two of them once it waits and
 * READ_RUN_NS have passed). */
static void deliver(struct node *n, struct node_req *r)
{
    struct node_client *c = &n->client;
    bool locked = false;
    uint64_t since = 0;
    while (r != NULL) {
        struct node_req *next = r->next;
        r->next = NULL;
        c->delivered++;
        int status = r->client_status;
        if (r->is_read && status == 0 && r->collect_cb == NULL) {
            if (locked && atomic_load_explicit(&c->loop_waiting, memory_order_acquire) &&
                tk_mono_ns() - since >= READ_RUN_NS) {
                state_unlock_client(c);
                locked = false;
            }
            if (!locked) {
                state_lock_client(n);
                locked = true;
                since = tk_mono_ns();
            }
            r->read_cb(r, 0, n->sm, r->data);
        } else {
            if (locked) {
                state_unlock_client(c);
                locked = false;
            }
            if (r->is_read) /* failed, or copied out (collect_cb) */
                r->read_cb(r, status, NULL, r->data);
            else
                r->write_cb(r, status, r->client_res ? r->res_out : NULL, r->data);
        }
        r = next;
    }
    if (locked)
        state_unlock_client(c);
}

static void on_client_wake(struct node_wake *w)
{
    struct node *n = w->data;
    struct node_client *c = &n->client;
    atomic_store_explicit(&c->client_idle, 0, memory_order_relaxed);
    c->wakeups++;
    /* Read before the inbox is taken: once the consensus loop has ended (and
     * the last completions were posted), this drain holds them all. */
    bool final = !c->stopped && atomic_load(&c->final_due);
    if (atomic_exchange_explicit(&c->applied_due, false, memory_order_acq_rel) &&
        !c->stopped && n->o.on_client_applied != NULL)
        n->o.on_client_applied(n, &c->loop, n->o.client_hook_data);
    pthread_mutex_lock(&c->inbox_mu);
    struct node_req *r = c->inbox_head;
    struct node_client_call *k = c->calls_head;
    c->inbox_head = c->inbox_tail = NULL;
    c->calls_head = c->calls_tail = NULL;
    pthread_mutex_unlock(&c->inbox_mu);
    deliver(n, r);
    run_calls(k);
    if (final) {
        /* The consensus loop is gone and every completion delivered: what
         * the client submits from now on is refused at once (TK_ESHUTDOWN). */
        c->stopped = true;
        if (n->o.on_client_stop != NULL)
            n->o.on_client_stop(n, &c->loop, n->o.client_hook_data);
        node__wake_close(&c->wake, NULL);
        uv_close((uv_handle_t *)&c->flush, NULL);
        uv_close((uv_handle_t *)&c->awake, NULL);
    }
}

static void on_client_check(uv_check_t *h)
{
    struct node *n = h->data;
    atomic_store_explicit(&n->client.client_idle, 0, memory_order_relaxed);
}

/* The client loop's last prepare callback of a turn: one wake-up of the
 * consensus loop for the requests the turn submitted (node_submit on this
 * thread only queues), unless the consensus loop has closed its handle
 * (node__client_join then fails what is queued). */
static void on_flush(uv_prepare_t *h)
{
    struct node *n = h->data;
    struct node_client *c = &n->client;
    if (c->submit_due) {
        c->submit_due = false;
        atomic_thread_fence(memory_order_seq_cst); /* with on_wait's */
        if (atomic_load(&c->loop_idle)) {
            pthread_mutex_lock(&c->wake_mu);
            if (!c->loop_wake_closed)
                node__wake_send(&n->loop.wake);
            pthread_mutex_unlock(&c->wake_mu);
        }
    }
    /* About to wait: the consensus loop wakes this one for its posts from
     * now on; those it made before without a wake-up are taken now (a wake
     * of our own: no other thread involved). */
    atomic_store(&c->client_idle, 1);
    atomic_thread_fence(memory_order_seq_cst);
    pthread_mutex_lock(&c->inbox_mu);
    bool pending = c->inbox_head != NULL;
    pthread_mutex_unlock(&c->inbox_mu);
    if (pending)
        node__wake_send(&c->wake);
}

bool node__client_defer_wake(struct node *n)
{
    struct node_client *c = &n->client;
    if (!c->on || !pthread_equal(pthread_self(), c->thread))
        return false;
    c->submit_due = true;
    return true;
}

static void client_thread(void *arg)
{
    struct node *n = arg;
    struct node_client *c = &n->client;
    char name[16];
    snprintf(name, sizeof(name), "tk-client-%llu", (unsigned long long)(n->o.id % 10000));
    pthread_setname_np(pthread_self(), name);
    uv_sem_wait(&c->go);
    if (c->abort) {
        node__wake_close(&c->wake, NULL);
        uv_close((uv_handle_t *)&c->flush, NULL);
        uv_close((uv_handle_t *)&c->awake, NULL);
    } else {
        n->o.on_client_start(n, &c->loop, n->o.client_hook_data);
        uv_sem_post(&c->started);
    }
    uv_run(&c->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&c->loop);
    if (rc != 0)
        TK_LOG(TK_LOG_WARN, n->o.id, 0, "client loop closed with live handles: %s",
               uv_strerror(rc));
}

/* ---- start and stop (node.c) --------------------------------------------- */

int node__client_prepare(struct node *n)
{
    struct node_client *c = &n->client;
    if (n->o.on_client_start == NULL)
        return 0;
    if (uv_loop_init(&c->loop) != 0)
        return TK_EIO;
    if (node__wake_open(&c->wake) != 0) {
        (void)uv_loop_close(&c->loop);
        return TK_EIO;
    }
    /* The consensus loop's first prepare handle: its callback runs last. */
    uv_prepare_init(n->loop.uv, &c->wait);
    c->wait.data = n;
    uv_prepare_start(&c->wait, on_wait);
    node__wake_start(&c->loop, &c->wake, on_client_wake, n);
    /* The client loop's first prepare handle: its callback runs last. */
    uv_prepare_init(&c->loop, &c->flush);
    c->flush.data = n;
    uv_prepare_start(&c->flush, on_flush);
    uv_check_init(&c->loop, &c->awake);
    c->awake.data = n;
    uv_check_start(&c->awake, on_client_check);
    pthread_mutex_init(&c->state_mu, NULL);
    pthread_mutex_init(&c->inbox_mu, NULL);
    pthread_mutex_init(&c->wake_mu, NULL);
    uv_sem_init(&c->go, 0);
    uv_sem_init(&c->started, 0);
    if (uv_thread_create(&c->thread, client_thread, n) != 0) {
        uv_close((uv_handle_t *)&c->wait, NULL);
        uv_run(n->loop.uv, UV_RUN_NOWAIT);
        node__wake_close(&c->wake, NULL);
        uv_close((uv_handle_t *)&c->flush, NULL);
        uv_close((uv_handle_t *)&c->awake, NULL);
        uv_run(&c->loop, UV_RUN_DEFAULT);
        (void)uv_loop_close(&c->loop);
        node__wake_discard(&c->wake);
        pthread_mutex_destroy(&c->state_mu);
        pthread_mutex_destroy(&c->inbox_mu);
        pthread_mutex_destroy(&c->wake_mu);
        uv_sem_destroy(&c->go);
        uv_sem_destroy(&c->started);
        return TK_EIO;
    }
    c->on = true;
    return 0;
}

void node__client_begin(struct node *n, bool ok)
{
    struct node_client *c = &n->client;
    if (!c->on)
        return;
    c->abort = !ok;
    if (!ok) { /* the consensus loop closes: the wait handle too */
        uv_close((uv_handle_t *)&c->wait, NULL);
        uv_run(n->loop.uv, UV_RUN_NOWAIT);
    }
    uv_sem_post(&c->go);
    if (ok)
        uv_sem_wait(&c->started);
}

void node__client_join(struct node *n)
{
    struct node_client *c = &n->client;
    if (!c->on)
        return;
    /* What a client queued while the loop closed: it never ran. */
    void *item;
    while ((item = tk_mpsc_pop(&n->loop.queue)) != NULL)
        node__finish(n, item, TK_ESHUTDOWN);
    atomic_store(&c->final_due, true);
    if (!c->abort)
        node__wake_send(&c->wake);
    uv_thread_join(&c->thread);
    node__wake_discard(&c->wake); /* no thread sends any more */
    pthread_mutex_destroy(&c->state_mu);
    pthread_mutex_destroy(&c->inbox_mu);
    pthread_mutex_destroy(&c->wake_mu);
    uv_sem_destroy(&c->go);
    uv_sem_destroy(&c->started);
    c->on = false;
}

uint64_t node__client_idle_ns(const struct node *n)
{
    return n->client.ext_idle_ns;
}

/* ---- node.h -------------------------------------------------------------- */

void node_client_want_applied(struct node *n, bool on)
{
    atomic_fetch_add_explicit(&n->client.applied_wanted, on ? 1 : -1,
                              memory_order_relaxed);
}

void node_client_call(struct node *n, node_call_fn *fn, void *arg)
{
    struct node_client *c = &n->client;
    if (!c->on) {
        fn(arg);
        return;
    }
    struct node_client_call *k = tk_malloc(sizeof(*k));
    *k = (struct node_client_call){fn, arg, NULL};
    pthread_mutex_lock(&c->inbox_mu);
    bool was_empty = c->inbox_head == NULL && c->calls_head == NULL;
    if (c->calls_head == NULL)
        c->calls_head = k;
    else
        c->calls_tail->next = k;
    c->calls_tail = k;
    pthread_mutex_unlock(&c->inbox_mu);
    if (was_empty)
        node__wake_send(&c->wake);
}

uint64_t node_applied_index(struct node *n)
{
    return atomic_load_explicit(&n->client.applied, memory_order_acquire);
}

bool node_client_lock(struct node *n)
{
    struct node_client *c = &n->client;
    if (!c->on)
        return false;
    if (pthread_equal(pthread_self(), c->thread) && c->depth > 0) {
        /* held already: inside a read's callback */
        c->depth++;
        return true;
    }
    state_lock_client(n);
    if (n->loop.closing) {
        state_unlock_client(c);
        return false;
    }
    return true;
}

void node_client_unlock(struct node *n, bool changed)
{
    /* Woken while the lock is held: the loop cannot have closed its wake-up
     * handle meanwhile (it closes it in a turn, holding the lock). */
    if (changed)
        node__wake_send(&n->loop.wake);
    if (pthread_equal(pthread_self(), n->client.thread) && n->client.depth > 1)
        n->client.depth--; /* the read's callback still holds it */
    else
        state_unlock_client(&n->client);
}
