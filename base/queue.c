/* A bounded lock-free queue of pointers.
 *
 * Positions are free-running size_t counters; a slot is pos & mask. The
 * queue is wait-free for the consumer and never blocks, sleeps or polls.
 *
 * mpsc: Vyukov's bounded queue. Cell i starts with seq = i. A producer at
 * position pos may fill the cell when seq == pos: it claims pos with a CAS on
 * `tail`, stores the item and publishes seq = pos + 1 (release). The consumer
 * at head may take the cell when seq == head + 1 (acquire), then frees it for
 * the next lap with seq = head + capacity (release). seq < pos means the cell
 * still holds the previous lap's item: the queue is full. Items from one
 * producer keep their order because that producer claims increasing
 * positions. A producer preempted between claim and publish makes pop report
 * empty until it publishes; later items wait behind it (FIFO is kept). */
#include "base/queue.h"

#include "base/alloc.h"
#include "base/err.h"

static int round_capacity(size_t capacity, size_t *out)
{
    if (capacity == 0 || capacity > TK_QUEUE_CAPACITY_MAX)
        return TK_EINVAL;
    size_t c = 1;
    while (c < capacity)
        c <<= 1;
    *out = c;
    return 0;
}

int tk_mpsc_init(struct tk_mpsc *q, size_t capacity)
{
    size_t cap;
    int rc = round_capacity(capacity, &cap);
    if (rc != 0)
        return rc;
    /* With one cell, "published at pos" (seq = pos + 1) and "free for
     * pos + 1" (seq = pos + capacity) would be the same value. */
    if (cap < 2)
        cap = 2;
    q->cells = tk_malloc(cap * sizeof(*q->cells));
    for (size_t i = 0; i < cap; i++) {
        atomic_init(&q->cells[i].seq, i);
        q->cells[i].item = NULL;
    }
    atomic_init(&q->tail, 0);
    q->head = 0;
    q->mask = cap - 1;
    return 0;
}

void tk_mpsc_destroy(struct tk_mpsc *q)
{
    tk_free(q->cells);
    q->cells = NULL;
}

int tk_mpsc_push(struct tk_mpsc *q, void *item)
{
    size_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    struct tk_mpsc_cell *cell;
    for (;;) {
        cell = &q->cells[pos & q->mask];
        size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        /* Wrapping difference, read as signed: the counters are free-running. */
        ptrdiff_t diff = (ptrdiff_t)(seq - pos);
        if (diff == 0) {
            /* On failure the CAS reloads pos; retry with the new position. */
            if (atomic_compare_exchange_weak_explicit(
                    &q->tail, &pos, pos + 1, memory_order_relaxed, memory_order_relaxed))
                break;
        } else if (diff < 0) {
            return TK_EBUSY;
        } else {
            /* Another producer claimed pos and already published it. */
            pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
        }
    }
    cell->item = item;
    atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
    return 0;
}

void *tk_mpsc_pop(struct tk_mpsc *q)
{
    size_t pos = q->head;
    struct tk_mpsc_cell *cell = &q->cells[pos & q->mask];
    size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
    if (seq != pos + 1)
        return NULL;
    void *item = cell->item;
    atomic_store_explicit(&cell->seq, pos + q->mask + 1, memory_order_release);
    q->head = pos + 1;
    return item;
}
