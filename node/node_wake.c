/* node_wake.h: a loop's wake-up from other threads over an eventfd of its
 * own, without uv_async_t's spin. Calls no other node file. */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/err.h"
#include "node/node_wake.h"

static void on_readable(uv_poll_t *h, int status, int events)
{
    struct node_wake *w = h->data;
    (void)status;
    (void)events;
    uint64_t v;
    ssize_t r;
    do
        r = read(w->fd, &v, sizeof(v));
    while (r < 0 && errno == EINTR);
    /* (EAGAIN: woken by a send whose count an earlier read took.) After the
     * read, so a send that arms it again writes again and wakes the loop. */
    atomic_exchange(&w->armed, 0);
    w->cb(w);
}

int node__wake_open(struct node_wake *w)
{
    w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return w->fd < 0 ? TK_EIO : 0;
}

void node__wake_start(uv_loop_t *loop, struct node_wake *w, node_wake_cb *cb, void *data)
{
    atomic_init(&w->armed, 0);
    w->cb = cb;
    w->data = data;
    w->closed = NULL;
    /* An eventfd of our own that libuv has not seen: neither fails. */
    int rc = uv_poll_init(loop, &w->poll, w->fd);
    TK_ASSERT(rc == 0);
    w->poll.data = w;
    rc = uv_poll_start(&w->poll, UV_READABLE, on_readable);
    TK_ASSERT(rc == 0);
}

void node__wake_discard(struct node_wake *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
}

void node__wake_send(struct node_wake *w)
{
    /* An exchange, not a load first: a full barrier between what the
     * sender queued and its look at `armed`, so a loop that disarms it
     * after that look sees the queue as the sender left it. */
    if (atomic_exchange(&w->armed, 1) != 0)
        return; /* armed already: its write is made or coming */
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(w->fd, &one, sizeof(one));
    while (r < 0 && errno == EINTR);
    /* (EAGAIN only at a count of 2^64 - 2: the loop is woken anyway.) */
}

static void on_closed(uv_handle_t *h)
{
    struct node_wake *w = h->data;
    if (w->closed != NULL) {
        h->data = w->data;
        w->closed(h);
    }
}

void node__wake_close(struct node_wake *w, uv_close_cb closed)
{
    w->closed = closed;
    uv_close((uv_handle_t *)&w->poll, on_closed);
}
