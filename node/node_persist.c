/* Durability of the log: readies handed to storage and reported durable.
 *
 * The loop hands each ready's entries to the store (node__store_append:
 * queued for the storage thread, or written on the loop when the store is idle
 * and fast) and records its seq (node__persist_push); synchronous metadata
 * saves are recorded as durable at once. The storage thread reports a batch
 * durable through on_appended (durable_seq, or store_status on a failure) and
 * wakes the loop; node__persist_poll then tells the core every seq that is
 * durable, oldest first, so raft_persisted(seq) is called only once every
 * ready up to seq is.
 *
 * A completion that runs inside node__store_append (a memory volume, an idle
 * store syncing on the caller) is on the loop thread and must not pay for an
 * eventfd write and read of its own; one on the storage thread must wake the
 * loop. Which it is follows from `inline_seq`, the seq whose append call is
 * in progress: a completion of that seq leaves the wake-up to the caller,
 * which after the call looks at durable_seq (see node__store_append for why
 * no completion is missed). Loop thread only, except on_appended. Calls no
 * other node file. */
#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "node/node_internal.h"
#include "store/store.h"

/* Storage thread, or the loop thread inside node__store_append: a batch is
 * durable (or failed). Runs in submission order. */
static void on_appended(void *data, uint64_t seq, uint64_t last_index, uint64_t last_term,
                        int status)
{
    struct node *n = data;
    (void)last_index;
    (void)last_term;
    if (status != 0)
        atomic_store(&n->persist.store_status, status);
    else
        atomic_store(&n->persist.durable_seq, seq);
    /* The wake-up goes before the count: once node__persist_drain (the close)
     * sees every append done, the loop closes its wake handle, and a send
     * after that would write an eventfd closed (or, worse, reused). */
    pthread_mutex_lock(&n->persist.drain_mu);
    if (atomic_load(&n->persist.inline_seq) != seq)
        node__wake_send(&n->loop.wake);
    n->persist.async_done++;
    pthread_cond_signal(&n->persist.drain_cv);
    pthread_mutex_unlock(&n->persist.drain_mu);
}

bool node__append_inline(struct node *n)
{
    return n->o.follower_inline_sync_us != 0 && raft_role(n->raft) == RAFT_FOLLOWER;
}

/* The completion of this call's own seq skips its wake-up while inline_seq
 * names it. Both sides use sequentially consistent order: the completion
 * stores durable_seq (or store_status) and then loads inline_seq; this call
 * stores inline_seq = 0 and then loads them. If the completion saw its seq
 * (so sent nothing), its store comes before this call's load, which sees it
 * and keeps the loop awake. A completion on the storage thread after the
 * clear sends its own wake-up. */
int node__store_append(struct node *n, const struct raft_entry *entries, size_t cnt,
                       uint64_t seq, bool now)
{
    TK_ASSERT(seq != 0);
    atomic_store(&n->persist.inline_seq, seq);
    int rc = now ? store_append_now_if_idle(n->store, entries, cnt, seq, n, on_appended,
                                            n->o.follower_inline_sync_us * 1000ull)
                 : store_append_async(n->store, entries, cnt, seq, n, on_appended);
    atomic_store(&n->persist.inline_seq, 0);
    if (rc != 0)
        return rc;
    n->persist.async_submitted++;
    if (atomic_load(&n->persist.durable_seq) >= seq ||
        atomic_load(&n->persist.store_status) != 0)
        node__kick(n);
    return 0;
}

void node__persist_push(struct node *n, uint64_t seq, bool async)
{
    struct node_persist *p = &n->persist;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        TK_ASSERT(cap <= NODE_PERSIST_MAX);
        uint64_t *s = tk_malloc(cap * sizeof(*s));
        bool *a = tk_malloc(cap * sizeof(*a));
        uint64_t *t = tk_malloc(cap * sizeof(*t));
        for (size_t i = 0; i < p->n; i++) {
            size_t at = (p->head + i) % p->cap;
            s[i] = p->seq[at];
            a[i] = p->async[at];
            t[i] = p->ns[at];
        }
        tk_free(p->seq);
        tk_free(p->async);
        tk_free(p->ns);
        p->seq = s;
        p->async = a;
        p->ns = t;
        p->head = 0;
        p->cap = cap;
    }
    size_t at = (p->head + p->n) % p->cap;
    p->seq[at] = seq;
    p->async[at] = async;
    p->ns[at] = async ? tk_mono_ns() : 0;
    p->n++;
}

void node__persist_poll(struct node *n)
{
    struct node_persist *p = &n->persist;
    uint64_t durable = atomic_load_explicit(&p->durable_seq, memory_order_acquire);
    uint64_t upto = 0, now = 0;
    while (p->n > 0) {
        size_t at = p->head;
        if (p->async[at] && p->seq[at] > durable)
            break;
        if (p->async[at]) {
            if (now == 0)
                now = tk_mono_ns();
            tk_hist_record(&n->m.lat.append, now - p->ns[at]);
        }
        upto = p->seq[at];
        p->head = (p->head + 1) % p->cap;
        p->n--;
    }
    if (upto != 0)
        raft_persisted(n->raft, upto);
}

void node__persist_drain(struct node *n)
{
    pthread_mutex_lock(&n->persist.drain_mu);
    while (n->persist.async_done < n->persist.async_submitted)
        pthread_cond_wait(&n->persist.drain_cv, &n->persist.drain_mu);
    pthread_mutex_unlock(&n->persist.drain_mu);
}

void node__persist_init(struct node *n)
{
    pthread_mutex_init(&n->persist.drain_mu, NULL);
    pthread_cond_init(&n->persist.drain_cv, NULL);
}

void node__persist_free(struct node *n)
{
    tk_free(n->persist.seq);
    tk_free(n->persist.async);
    tk_free(n->persist.ns);
    pthread_mutex_destroy(&n->persist.drain_mu);
    pthread_cond_destroy(&n->persist.drain_cv);
}
