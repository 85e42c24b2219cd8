/* The transport interface: dispatch to the implementation (inproc.c, tcp.c)
 * through the ops table at the start of every struct transport. */
#include "base/err.h"
#include "transport/transport_internal.h"

int transport_send(struct transport *t, const struct raft_message *m)
{
    return t->ops->send(t, m);
}

int transport_send_forward(struct transport *t, uint64_t to, const uint8_t *buf,
                           size_t len)
{
    return t->ops->send_forward(t, to, buf, len);
}

void transport_close(struct transport *t, transport_close_cb *close_cb, void *data)
{
    t->ops->close(t, close_cb, data);
}

void transport_stats(const struct transport *t, struct transport_stats *out)
{
    *out = t->stats;
}

uint64_t transport_id(const struct transport *t)
{
    return t->id;
}
