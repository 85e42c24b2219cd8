/* A bounded lock-free queue of pointers.
 *
 * Capacity is fixed at init (rounded up to a power of two, at most 2^30); a
 * full queue refuses a push with TK_EBUSY, it never grows. It never blocks,
 * sleeps or polls: pair it with a wakeup (uv_async_send) when the consumer
 * may be asleep.
 *
 * tk_mpsc: any number of producer threads and one consumer thread (a bounded
 *          array queue with a sequence number per cell, after Vyukov). Its
 *          capacity is at least 2: a cell's sequence number cannot tell
 *          "full" from "free" in a one-cell ring.
 *
 * The structs are aligned to 64 bytes to keep producer and consumer counters
 * on separate cache lines; embed them in an object, or allocate them with
 * aligned_alloc, not plain malloc. */
#ifndef TK_BASE_QUEUE_H
#define TK_BASE_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TK_QUEUE_CAPACITY_MAX (1u << 30)

struct tk_mpsc_cell {
    atomic_size_t seq;
    void *item;
};

struct tk_mpsc {
    _Alignas(64) atomic_size_t tail; /* producers claim slots here */
    _Alignas(64) size_t head;        /* consumer only */
    _Alignas(64) size_t mask;
    struct tk_mpsc_cell *cells;
};

/* Returns 0 or TK_EINVAL (capacity 0 or above TK_QUEUE_CAPACITY_MAX). */
int tk_mpsc_init(struct tk_mpsc *q, size_t capacity);
void tk_mpsc_destroy(struct tk_mpsc *q);
/* Any thread. Returns 0 or TK_EBUSY when full. `item` must not be NULL. */
int tk_mpsc_push(struct tk_mpsc *q, void *item);
/* Consumer only. Returns the oldest item, or NULL when empty. */
void *tk_mpsc_pop(struct tk_mpsc *q);

#endif
