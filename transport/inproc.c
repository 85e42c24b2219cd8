/* The in-process transport: a hub of endpoints, one per node, each on a loop.
 * Forwarded bytes (transport_send_forward) travel as copied items on the same
 * queues, under the same faults.
 *
 * transport_send copies the message header and its entries array into one
 * allocation and takes a reference on each payload blob: ownership of that
 * copy passes to the receiver, nothing is serialized. The copy goes onto the
 * target's bounded MPSC queue under the target slot's mutex (which also orders
 * it against the target's detach), then uv_async_send wakes the target loop;
 * libuv coalesces wake-ups, so a burst costs one. The receiving loop drains at
 * most `queue_max` items per turn and re-arms itself if more remain.
 *
 * Slots: an id gets a slot the first time the hub sees it (attach or a fault
 * setting) and keeps it for the hub's life, so the id -> slot table only grows
 * and senders read it without a lock (count published with release). Faults
 * are atomics per directed link, readable by senders without a lock.
 *
 * Delayed messages wait on the receiver in a list sorted by due time (bounded
 * by queue_max; beyond it they are dropped) with one uv_timer.
 *
 * Items come from a pool per loop (shared by the endpoints of that loop) in two
 * sizes: up to POOL_SMALL entries (responses, heartbeats) and up to POOL_BIG
 * (appends). An item goes back to the pool it came from: onto its free list
 * when freed on that pool's loop, else onto its return stack (lock-free:
 * any thread pushes, the owner takes the whole stack at once, so there is no
 * ABA). Each list is bounded; beyond that, and for larger items, malloc/free.
 * A message therefore costs no malloc in steady state, across loops too. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "base/prng.h"
#include "base/queue.h"
#include "transport/transport_internal.h"

enum inproc_kind { ITEM_MSG = 0, ITEM_PEER_UP = 1, ITEM_PEER_DOWN = 2, ITEM_FORWARD = 3 };

#define POOL_SMALL 4
#define POOL_BIG 256
static const uint32_t pool_cap[2] = {POOL_SMALL, POOL_BIG};
static const uint32_t pool_max[2] = {1024, 128}; /* items per free list */

struct inproc_item {
    struct inproc_item *next; /* delayed list, or pool free list */
    uint64_t due_ns;          /* uv_hrtime() at which to deliver; 0 = now */
    uint8_t kind;
    uint8_t cls;            /* 0 small, 1 big: room for pool_cap[cls]; 2 sized */
    struct item_pool *home; /* the pool it came from, or NULL */
    uint64_t peer;
    uint8_t *fwd; /* ITEM_FORWARD: a copy of the bytes */
    size_t fwd_len;
    struct raft_message m;
    struct raft_entry ents[]; /* the copied entries array */
};

struct link_faults {
    atomic_uint_fast32_t drop; /* probability x 2^32 - 1 */
    atomic_uint_fast32_t dup;
    atomic_uint_fast32_t delay_min_ms;
    atomic_uint_fast32_t delay_max_ms;
    atomic_bool blocked;
};

struct inproc;

struct item_pool {
    uv_loop_t *loop;
    int refs;                    /* endpoints on `loop`; hub mutex */
    struct inproc_item *free[2]; /* the loop's thread only */
    uint32_t n[2];
    _Atomic(struct inproc_item *) back[2]; /* returned from other threads */
    atomic_uint back_n[2];                 /* about how many (a soft bound) */
};

struct inproc_slot {
    pthread_mutex_t mu;
    uint64_t id;
    struct inproc *ep; /* attached endpoint, or NULL; guarded by mu */
};

struct transport_inproc_hub {
    pthread_mutex_t mu; /* slot creation, attach, detach */
    uint64_t seed;
    atomic_size_t n_slots;
    atomic_bool faults_any;
    struct inproc_slot slots[TRANSPORT_INPROC_NODES_MAX];
    struct item_pool pools[TRANSPORT_INPROC_NODES_MAX];
    struct link_faults links[TRANSPORT_INPROC_NODES_MAX][TRANSPORT_INPROC_NODES_MAX];
};

struct inproc {
    struct transport base;
    struct transport_inproc_hub *hub;
    size_t slot;
    uv_loop_t *loop;
    struct item_pool *pool; /* NULL if the hub had no pool slot left */
    uv_async_t async;       /* wake-up from another loop's thread */
    uv_idle_t idle;         /* wake-up from an endpoint on the same loop: no syscall */
    uv_timer_t timer;
    struct tk_mpsc q;
    uint32_t queue_max;
    struct inproc_item *delayed;
    uint32_t n_delayed;
    struct tk_prng prng;
    bool closing;
    int handles_open;
    /* near[slot]: the endpoint in that slot when it runs on this loop too: a
     * send to it goes to its local list, with no lock (both ends live on one
     * thread, and inproc_close clears the entries that name it). NULL: not
     * known yet, or on another loop. Loop thread only. */
    struct inproc *near[TRANSPORT_INPROC_NODES_MAX];
    /* Items from the endpoints on this loop (their near[] names this one): a
     * plain list, no lock and no atomics, at most queue_max long; q holds
     * those from other loops (at most queue_max too). */
    struct inproc_item *local_head, **local_tail;
    uint32_t n_local;
    transport_close_cb *close_cb;
    void *close_data;
};

/* ---- Hub ---- */

struct transport_inproc_hub *transport_inproc_hub_new(uint64_t seed)
{
    struct transport_inproc_hub *h = tk_calloc(1, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    h->seed = seed;
    atomic_init(&h->n_slots, 0);
    atomic_init(&h->faults_any, false);
    for (size_t i = 0; i < TRANSPORT_INPROC_NODES_MAX; i++)
        pthread_mutex_init(&h->slots[i].mu, NULL);
    return h;
}

static void pool_drain(struct item_pool *pool);

void transport_inproc_hub_free(struct transport_inproc_hub *h)
{
    if (h == NULL)
        return;
    for (size_t i = 0; i < TRANSPORT_INPROC_NODES_MAX; i++) {
        TK_ASSERT(h->slots[i].ep == NULL);
        TK_ASSERT(h->pools[i].refs == 0);
        pool_drain(&h->pools[i]);
        pthread_mutex_destroy(&h->slots[i].mu);
    }
    pthread_mutex_destroy(&h->mu);
    tk_free(h);
}

/* The slot of `id`, or -1. Lock-free: slots are only ever added. */
static long slot_find(struct transport_inproc_hub *h, uint64_t id)
{
    size_t n = atomic_load_explicit(&h->n_slots, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (h->slots[i].id == id)
            return (long)i;
    return -1;
}

/* Finds or creates the slot of `id`; hub mutex held. */
static long slot_get_locked(struct transport_inproc_hub *h, uint64_t id)
{
    long s = slot_find(h, id);
    if (s >= 0)
        return s;
    size_t n = atomic_load_explicit(&h->n_slots, memory_order_relaxed);
    if (n == TRANSPORT_INPROC_NODES_MAX)
        return -1;
    h->slots[n].id = id;
    atomic_store_explicit(&h->n_slots, n + 1, memory_order_release);
    return (long)n;
}

static uint32_t prob_to_u32(double p)
{
    if (!(p > 0))
        return 0;
    if (p >= 1)
        return UINT32_MAX;
    return (uint32_t)(p * 4294967295.0);
}

int transport_inproc_set_faults(struct transport_inproc_hub *h, uint64_t from,
                                uint64_t to, const struct transport_link_faults *f)
{
    if (from == RAFT_NONE || to == RAFT_NONE || f == NULL)
        return TK_EINVAL;
    if (f->delay_min_ms > f->delay_max_ms && f->delay_max_ms != 0)
        return TK_EINVAL;
    pthread_mutex_lock(&h->mu);
    long a = slot_get_locked(h, from);
    long b = slot_get_locked(h, to);
    pthread_mutex_unlock(&h->mu);
    if (a < 0 || b < 0)
        return TK_EBUSY;
    struct link_faults *l = &h->links[a][b];
    atomic_store(&l->drop, prob_to_u32(f->drop));
    atomic_store(&l->dup, prob_to_u32(f->dup));
    atomic_store(&l->delay_min_ms, f->delay_max_ms ? f->delay_min_ms : 0);
    atomic_store(&l->delay_max_ms, f->delay_max_ms);
    atomic_store(&l->blocked, f->blocked);
    atomic_store(&h->faults_any, true);
    return 0;
}

int transport_inproc_partition(struct transport_inproc_hub *h, uint64_t a, uint64_t b,
                               bool one_way)
{
    struct transport_link_faults f = {.blocked = true};
    int rc = transport_inproc_set_faults(h, a, b, &f);
    if (rc == 0 && !one_way)
        rc = transport_inproc_set_faults(h, b, a, &f);
    return rc;
}

void transport_inproc_heal(struct transport_inproc_hub *h)
{
    atomic_store(&h->faults_any, false);
    for (size_t i = 0; i < TRANSPORT_INPROC_NODES_MAX; i++) {
        for (size_t j = 0; j < TRANSPORT_INPROC_NODES_MAX; j++) {
            struct link_faults *l = &h->links[i][j];
            atomic_store(&l->drop, 0);
            atomic_store(&l->dup, 0);
            atomic_store(&l->delay_min_ms, 0);
            atomic_store(&l->delay_max_ms, 0);
            atomic_store(&l->blocked, false);
        }
    }
}

/* ---- Items ---- */

static struct inproc_item *item_new(struct item_pool *pool, uint8_t kind, uint64_t peer,
                                    uint32_t n_entries)
{
    struct inproc_item *it = NULL;
    uint8_t cls = n_entries <= POOL_SMALL ? 0 : n_entries <= POOL_BIG ? 1 : 2;
    if (cls < 2 && pool != NULL) {
        if (pool->free[cls] == NULL &&
            atomic_load_explicit(&pool->back[cls], memory_order_relaxed) != NULL) {
            pool->free[cls] =
                atomic_exchange_explicit(&pool->back[cls], NULL, memory_order_acquire);
            pool->n[cls] = atomic_exchange(&pool->back_n[cls], 0);
        }
        it = pool->free[cls];
        if (it != NULL) {
            pool->free[cls] = it->next;
            if (pool->n[cls] > 0)
                pool->n[cls]--;
        }
    }
    if (it == NULL) {
        it = tk_malloc(sizeof(*it) + (size_t)(cls < 2 ? pool_cap[cls] : n_entries) *
                                         sizeof(struct raft_entry));
        it->cls = cls;
        it->home = cls < 2 ? pool : NULL;
    }
    it->next = NULL;
    it->due_ns = 0;
    it->kind = kind;
    it->peer = peer;
    it->fwd = NULL;
    it->fwd_len = 0;
    return it;
}

static struct inproc_item *item_copy(struct item_pool *pool, const struct raft_message *m)
{
    uint32_t n = m->type == RAFT_MSG_APPEND ? m->u.append.n_entries : 0;
    struct inproc_item *it = item_new(pool, ITEM_MSG, m->from, n);
    it->m = *m;
    if (m->type == RAFT_MSG_APPEND) {
        for (uint32_t i = 0; i < n; i++) {
            it->ents[i] = m->u.append.entries[i];
            tk_blob_ref(it->ents[i].data);
        }
        it->m.u.append.entries = n ? it->ents : NULL;
    } else if (m->type == RAFT_MSG_SNAPSHOT) {
        tk_blob_ref(m->u.snapshot.data);
    }
    return it;
}

/* Frees on the thread of `pool`'s loop (or anywhere when pool is NULL). */
static void item_free(struct item_pool *pool, struct inproc_item *it)
{
    if (it->kind == ITEM_FORWARD) {
        tk_free(it->fwd);
        it->fwd = NULL;
    }
    if (it->kind == ITEM_MSG) {
        if (it->m.type == RAFT_MSG_APPEND) {
            for (uint32_t i = 0; i < it->m.u.append.n_entries; i++)
                tk_blob_unref(it->ents[i].data);
        } else if (it->m.type == RAFT_MSG_SNAPSHOT) {
            tk_blob_unref(it->m.u.snapshot.data);
        }
    }
    struct item_pool *home = it->home;
    if (home != NULL && home == pool) {
        if (pool->n[it->cls] < pool_max[it->cls]) {
            it->next = pool->free[it->cls];
            pool->free[it->cls] = it;
            pool->n[it->cls]++;
            return;
        }
    } else if (home != NULL &&
               atomic_fetch_add(&home->back_n[it->cls], 1) < pool_max[it->cls]) {
        struct inproc_item *head =
            atomic_load_explicit(&home->back[it->cls], memory_order_relaxed);
        do {
            it->next = head;
        } while (!atomic_compare_exchange_weak_explicit(
            &home->back[it->cls], &head, it, memory_order_release, memory_order_relaxed));
        return;
    } else if (home != NULL) {
        atomic_fetch_sub(&home->back_n[it->cls], 1); /* counted, but not kept */
    }
    tk_free(it);
}

static void free_list(struct inproc_item *it)
{
    while (it != NULL) {
        struct inproc_item *next = it->next;
        tk_free(it);
        it = next;
    }
}

/* Frees what the pool holds. Items still in flight come back to its return
 * stacks later; the next owner of the pool, or the hub's end, frees them. */
static void pool_drain(struct item_pool *pool)
{
    for (int c = 0; c < 2; c++) {
        free_list(pool->free[c]);
        pool->free[c] = NULL;
        pool->n[c] = 0;
        free_list(atomic_exchange(&pool->back[c], NULL));
        atomic_store(&pool->back_n[c], 0);
    }
}

/* The pool of `loop`, shared by its endpoints; NULL when all are taken. */
static struct item_pool *pool_acquire_locked(struct transport_inproc_hub *h,
                                             uv_loop_t *loop)
{
    struct item_pool *unused = NULL;
    for (size_t i = 0; i < TRANSPORT_INPROC_NODES_MAX; i++) {
        struct item_pool *p = &h->pools[i];
        if (p->refs > 0 && p->loop == loop) {
            p->refs++;
            return p;
        }
        if (p->refs == 0 && unused == NULL)
            unused = p;
    }
    if (unused != NULL) {
        unused->loop = loop;
        unused->refs = 1;
    }
    return unused;
}

static void on_idle(uv_idle_t *idle);

/* Pushes onto the endpoint attached at `slot`, from a thread running `from`
 * (NULL: unknown). Returns 0, TK_EBUSY (full) or TK_ECLOSED (nobody attached);
 * on error the item is still the caller's. */
/* Queues `it` for the endpoint in `slot`. `from` is the calling thread's loop
 * (NULL: not a loop thread). */
static int slot_push(struct transport_inproc_hub *h, size_t slot, struct inproc_item *it,
                     uv_loop_t *from)
{
    struct inproc_slot *s = &h->slots[slot];
    int rc = TK_ECLOSED;
    pthread_mutex_lock(&s->mu);
    if (s->ep != NULL) {
        rc = tk_mpsc_push(&s->ep->q, it);
        if (rc == 0) {
            if (s->ep->loop == from)
                uv_idle_start(&s->ep->idle, on_idle); /* we are its thread */
            else
                uv_async_send(&s->ep->async);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Queues `it` for r, an endpoint on the calling thread's loop. */
static int local_push(struct inproc *r, struct inproc_item *it)
{
    if (r->n_local >= r->queue_max)
        return TK_EBUSY;
    it->next = NULL;
    *r->local_tail = it;
    r->local_tail = &it->next;
    r->n_local++;
    uv_idle_start(&r->idle, on_idle);
    return 0;
}

/* ---- Endpoint ---- */

static bool chance(struct tk_prng *p, uint32_t threshold)
{
    return threshold != 0 && (uint32_t)(tk_prng_next(p) >> 32) <= threshold;
}

/* Sends one item per copy to slot `to`, after the link's faults: `m` is a
 * Raft message to copy, or NULL for the forwarded bytes `buf`. */
static int inproc_post(struct inproc *ep, long to, const struct raft_message *m,
                       const uint8_t *buf, size_t len)
{
    struct transport_inproc_hub *h = ep->hub;
    uint64_t *sent = m != NULL ? &ep->base.stats.msgs_sent : &ep->base.stats.fwd_sent;
    int copies = 1;
    uint64_t due_ns = 0;
    if (atomic_load_explicit(&h->faults_any, memory_order_relaxed)) {
        struct link_faults *l = &h->links[ep->slot][to];
        if (atomic_load_explicit(&l->blocked, memory_order_relaxed) ||
            chance(&ep->prng,
                   (uint32_t)atomic_load_explicit(&l->drop, memory_order_relaxed))) {
            (*sent)++;
            ep->base.stats.send_dropped++;
            return 0;
        }
        if (chance(&ep->prng,
                   (uint32_t)atomic_load_explicit(&l->dup, memory_order_relaxed)))
            copies = 2;
        uint32_t dmax =
            (uint32_t)atomic_load_explicit(&l->delay_max_ms, memory_order_relaxed);
        if (dmax != 0) {
            uint32_t dmin =
                (uint32_t)atomic_load_explicit(&l->delay_min_ms, memory_order_relaxed);
            if (dmin > dmax)
                dmin = dmax;
            due_ns = uv_hrtime() + tk_prng_range(&ep->prng, dmin, dmax) * 1000000u;
        }
    }
    for (int c = 0; c < copies; c++) {
        struct inproc_item *it;
        if (m != NULL) {
            it = item_copy(ep->pool, m);
        } else {
            it = item_new(ep->pool, ITEM_FORWARD, ep->base.id, 0);
            it->fwd = tk_malloc(len ? len : 1);
            if (len != 0)
                memcpy(it->fwd, buf, len);
            it->fwd_len = len;
        }
        it->due_ns = due_ns;
        struct inproc *near = ep->near[to];
        if (near == NULL) {
            /* Learn whether the peer shares this loop (once per peer). */
            struct inproc_slot *ps = &h->slots[to];
            pthread_mutex_lock(&ps->mu);
            if (ps->ep != NULL && ps->ep->loop == ep->loop)
                near = ep->near[to] = ps->ep;
            pthread_mutex_unlock(&ps->mu);
        }
        int rc =
            near != NULL ? local_push(near, it) : slot_push(h, (size_t)to, it, ep->loop);
        if (rc != 0) {
            item_free(ep->pool, it);
            if (rc == TK_EBUSY) {
                if (c > 0)
                    return 0; /* the original went; only the duplicate did not */
                ep->base.stats.send_busy++;
                return TK_EBUSY;
            }
            /* Not attached: a down peer. The message is lost, as on a network. */
            (*sent)++;
            ep->base.stats.send_dropped++;
            return 0;
        }
    }
    (*sent)++;
    return 0;
}

static int inproc_send(struct transport *t, const struct raft_message *m)
{
    struct inproc *ep = (struct inproc *)t;
    if (ep->closing)
        return TK_ECLOSED;
    if (m->type == RAFT_MSG_NONE || m->type >= RAFT_MSG_TYPE_COUNT ||
        m->to == ep->base.id || m->to == RAFT_NONE || m->from != ep->base.id)
        return TK_EINVAL;
    long to = slot_find(ep->hub, m->to);
    if (to < 0)
        return TK_ENOTFOUND;
    return inproc_post(ep, to, m, NULL, 0);
}

static int inproc_send_forward(struct transport *t, uint64_t to_id, const uint8_t *buf,
                               size_t len)
{
    struct inproc *ep = (struct inproc *)t;
    if (ep->closing)
        return TK_ECLOSED;
    if (to_id == ep->base.id || to_id == RAFT_NONE)
        return TK_EINVAL;
    long to = slot_find(ep->hub, to_id);
    if (to < 0)
        return TK_ENOTFOUND;
    return inproc_post(ep, to, NULL, buf, len);
}

static void deliver(struct inproc *ep, struct inproc_item *it)
{
    struct transport *t = &ep->base;
    if (it->kind == ITEM_MSG) {
        t->stats.msgs_received++;
        t->cbs.recv(t, &it->m, t->cbs.data);
    } else if (it->kind == ITEM_FORWARD) {
        if (t->cbs.forward != NULL) {
            t->stats.fwd_received++;
            t->cbs.forward(t, it->peer, it->fwd, it->fwd_len, t->cbs.data);
        }
    } else if (t->cbs.peer != NULL) {
        t->cbs.peer(t, it->peer, it->kind == ITEM_PEER_UP, t->cbs.data);
    }
    item_free(ep->pool, it);
}

static void on_timer(uv_timer_t *timer);

static void timer_arm(struct inproc *ep)
{
    if (ep->delayed == NULL) {
        uv_timer_stop(&ep->timer);
        return;
    }
    uint64_t now = uv_hrtime();
    uint64_t due = ep->delayed->due_ns;
    uint64_t ms = due > now ? (due - now + 999999) / 1000000 : 0;
    uv_timer_start(&ep->timer, on_timer, ms, 0);
}

static void delay_insert(struct inproc *ep, struct inproc_item *it)
{
    if (ep->n_delayed >= ep->queue_max) {
        item_free(ep->pool, it); /* bounded: a flood of delayed messages loses some */
        return;
    }
    struct inproc_item **pp = &ep->delayed;
    while (*pp != NULL && (*pp)->due_ns <= it->due_ns)
        pp = &(*pp)->next;
    it->next = *pp;
    *pp = it;
    ep->n_delayed++;
}

static void on_timer(uv_timer_t *timer)
{
    struct inproc *ep = timer->data;
    uint64_t now = uv_hrtime();
    while (!ep->closing && ep->delayed != NULL && ep->delayed->due_ns <= now) {
        struct inproc_item *it = ep->delayed;
        ep->delayed = it->next;
        ep->n_delayed--;
        deliver(ep, it);
    }
    if (!ep->closing)
        timer_arm(ep);
}

static void drain(struct inproc *ep);

static void on_async(uv_async_t *async)
{
    drain(async->data);
}

static void on_idle(uv_idle_t *idle)
{
    struct inproc *ep = idle->data;
    uv_idle_stop(idle);
    drain(ep);
}

static void drain(struct inproc *ep)
{
    bool delayed = false;
    uint32_t budget = ep->queue_max;
    while (!ep->closing && budget-- > 0) {
        struct inproc_item *it = tk_mpsc_pop(&ep->q);
        if (it == NULL && (it = ep->local_head) != NULL) {
            ep->local_head = it->next;
            if (ep->local_head == NULL)
                ep->local_tail = &ep->local_head;
            ep->n_local--;
        }
        if (it == NULL)
            break;
        if (it->due_ns != 0 && it->due_ns > uv_hrtime()) {
            delay_insert(ep, it);
            delayed = true;
            continue;
        }
        deliver(ep, it);
    }
    if (ep->closing)
        return;
    if (budget == UINT32_MAX) /* the budget ran out: more may be waiting */
        uv_async_send(&ep->async);
    if (delayed)
        timer_arm(ep);
}

static void on_handle_closed(uv_handle_t *handle)
{
    struct inproc *ep = handle->data;
    if (--ep->handles_open > 0)
        return;
    tk_mpsc_destroy(&ep->q);
    if (ep->pool != NULL) {
        pthread_mutex_lock(&ep->hub->mu);
        if (--ep->pool->refs == 0) {
            pool_drain(ep->pool);
            ep->pool->loop = NULL;
        }
        pthread_mutex_unlock(&ep->hub->mu);
    }
    if (ep->close_cb != NULL)
        ep->close_cb(&ep->base, ep->close_data);
    free(ep);
}

static void inproc_close(struct transport *t, transport_close_cb *cb, void *data)
{
    struct inproc *ep = (struct inproc *)t;
    struct transport_inproc_hub *h = ep->hub;
    TK_ASSERT(!ep->closing);
    ep->closing = true;
    ep->close_cb = cb;
    ep->close_data = data;

    pthread_mutex_lock(&h->mu);
    struct inproc_slot *s = &h->slots[ep->slot];
    pthread_mutex_lock(&s->mu);
    s->ep = NULL;
    pthread_mutex_unlock(&s->mu);
    size_t n = atomic_load(&h->n_slots);
    /* The endpoints of this loop that cached this one forget it (they run on
     * this thread, so none is sending now). */
    for (size_t i = 0; i < n; i++) {
        struct inproc_slot *o = &h->slots[i];
        pthread_mutex_lock(&o->mu);
        if (o->ep != NULL && o->ep->loop == ep->loop)
            o->ep->near[ep->slot] = NULL;
        pthread_mutex_unlock(&o->mu);
    }
    for (size_t i = 0; i < n; i++) {
        if (i == ep->slot)
            continue;
        struct inproc_item *it = item_new(ep->pool, ITEM_PEER_DOWN, ep->base.id, 0);
        /* Behind this endpoint's messages, on whichever queue they took. */
        int rc =
            ep->near[i] != NULL ? local_push(ep->near[i], it) : slot_push(h, i, it, NULL);
        if (rc != 0)
            item_free(ep->pool, it);
    }
    pthread_mutex_unlock(&h->mu);

    /* Nobody can push any more: free what is queued or delayed. */
    struct inproc_item *it;
    while ((it = tk_mpsc_pop(&ep->q)) != NULL)
        item_free(ep->pool, it);
    while ((it = ep->local_head) != NULL) {
        ep->local_head = it->next;
        item_free(ep->pool, it);
    }
    ep->local_tail = &ep->local_head;
    ep->n_local = 0;
    while ((it = ep->delayed) != NULL) {
        ep->delayed = it->next;
        item_free(ep->pool, it);
    }
    ep->n_delayed = 0;
    uv_timer_stop(&ep->timer);
    uv_close((uv_handle_t *)&ep->async, on_handle_closed);
    uv_close((uv_handle_t *)&ep->idle, on_handle_closed);
    uv_close((uv_handle_t *)&ep->timer, on_handle_closed);
}

static const struct transport_ops inproc_ops = {
    .send = inproc_send,
    .send_forward = inproc_send_forward,
    .close = inproc_close,
};

int transport_inproc_new(struct transport_inproc_hub *h, uv_loop_t *loop, uint64_t id,
                         uint32_t queue_max, const struct transport_callbacks *cbs,
                         struct transport **out)
{
    if (id == RAFT_NONE || cbs == NULL || cbs->recv == NULL)
        return TK_EINVAL;
    if (queue_max == 0)
        queue_max = 4096;
    if (queue_max > TK_QUEUE_CAPACITY_MAX)
        return TK_EINVAL;
    struct inproc *ep = aligned_alloc(64, (sizeof(*ep) + 63) & ~(size_t)63);
    TK_ASSERT(ep != NULL);
    memset(ep, 0, sizeof(*ep));
    ep->base.ops = &inproc_ops;
    ep->base.id = id;
    ep->base.cbs = *cbs;
    ep->hub = h;
    ep->loop = loop;
    ep->queue_max = queue_max;
    ep->local_tail = &ep->local_head;
    tk_prng_seed(&ep->prng, h->seed ^ (id * 0x9E3779B97F4A7C15ull));
    int rc = tk_mpsc_init(&ep->q, queue_max < 2 ? 2 : queue_max);
    TK_ASSERT(rc == 0);

    pthread_mutex_lock(&h->mu);
    long slot = slot_get_locked(h, id);
    if (slot < 0 || h->slots[slot].ep != NULL) {
        pthread_mutex_unlock(&h->mu);
        tk_mpsc_destroy(&ep->q);
        free(ep);
        return slot < 0 ? TK_EBUSY : TK_EINVAL;
    }
    ep->slot = (size_t)slot;
    ep->pool = pool_acquire_locked(h, loop);
    TK_ASSERT(uv_async_init(loop, &ep->async, on_async) == 0);
    TK_ASSERT(uv_timer_init(loop, &ep->timer) == 0);
    TK_ASSERT(uv_idle_init(loop, &ep->idle) == 0);
    ep->async.data = ep;
    ep->idle.data = ep;
    ep->timer.data = ep;
    ep->handles_open = 3;
    struct inproc_slot *s = &h->slots[slot];
    pthread_mutex_lock(&s->mu);
    s->ep = ep;
    pthread_mutex_unlock(&s->mu);
    /* Peer-up both ways, through the queues so callbacks run on each loop. */
    size_t n = atomic_load(&h->n_slots);
    for (size_t i = 0; i < n; i++) {
        if (i == (size_t)slot)
            continue;
        struct inproc_slot *o = &h->slots[i];
        pthread_mutex_lock(&o->mu);
        bool attached = o->ep != NULL;
        pthread_mutex_unlock(&o->mu);
        if (!attached)
            continue;
        struct inproc_item *it = item_new(ep->pool, ITEM_PEER_UP, id, 0);
        if (slot_push(h, i, it, NULL) != 0)
            item_free(ep->pool, it);
        it = item_new(ep->pool, ITEM_PEER_UP, o->id, 0);
        if (slot_push(h, (size_t)slot, it, NULL) != 0)
            item_free(ep->pool, it);
    }
    pthread_mutex_unlock(&h->mu);
    *out = &ep->base;
    return 0;
}
