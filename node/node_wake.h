/* A wake-up of a libuv loop from another thread: what uv_async_t does,
 * without the receiver's spin.
 *
 * libuv 1.44's uv_async_send marks its handle pending (1), writes the loop's
 * eventfd, then marks it sent (2); the loop that wakes spins (997 pauses,
 * then sched_yield, and again) for as long as a handle is marked 1. The
 * write's wake-up can put the woken loop's thread on the sender's CPU in
 * the middle of that write: then the two hand the CPU back and forth until
 * the sender finishes its system call. On this 2-core VM with three nodes'
 * threads, that spin and its yields cost 1.5-2.5 us of CPU per put at 64
 * connections (issue 48 item 5, the client loop's hand-offs).
 *
 * Here the wake has an eventfd of its own, watched by a uv_poll_t. A sender
 * writes it only when it is the one to arm the wake (an atomic exchange,
 * 0 -> 1); the loop reads the eventfd, disarms the wake (an exchange too,
 * so it sees what every sender that found it armed had done before), then
 * runs the callback. Nothing is waited for on either side; sends coalesce
 * until the callback runs, as uv_async's do.
 *
 * Threads: node__wake_send from any thread while the wake is open (its
 * closing is the owner's to order after the last send); the others on the
 * loop's thread. */
#ifndef TK_NODE_NODE_WAKE_H
#define TK_NODE_NODE_WAKE_H

#include <stdatomic.h>
#include <uv.h>

struct node_wake;
typedef void node_wake_cb(struct node_wake *w);

struct node_wake {
    uv_poll_t poll;
    int fd;
    atomic_int armed;
    node_wake_cb *cb;
    void *data; /* the owner's */
    uv_close_cb closed;
};

/* Its eventfd: 0, or TK_EIO (none left: EMFILE/ENFILE); then start it (its
 * handle on `loop`, cb(w) on the loop's thread per wake-up). The eventfd is
 * closed by discard alone (a wake whose fd is -1, or never opened: nothing),
 * once no thread can send any more: after node__wake_close, a late send
 * writes an eventfd nobody reads, not a number the process reused. */
int node__wake_open(struct node_wake *w);
void node__wake_start(uv_loop_t *loop, struct node_wake *w, node_wake_cb *cb, void *data);
void node__wake_discard(struct node_wake *w);
void node__wake_send(struct node_wake *w);
/* Closes the handle; `closed` (may be NULL) gets it, its data the wake's
 * `data`, once libuv has. The eventfd stays open (discard). */
void node__wake_close(struct node_wake *w, uv_close_cb closed);

#endif
