/* Large request bodies decoded off the loop (issue 48).
 *
 * jansson parses a body at about 50-100 MB/s on this VM: a 4 MiB JSON batch
 * held the node's loop (which answers heartbeats) 40-90 ms, and a few clients
 * posting them held it past half the election timeout. A write whose body is
 * at least API_OFFLOAD_BYTES (a PUT with a JSON body, a batch, a txn) is
 * parsed, checked (api__auth_verdict), built and packed on libuv's thread
 * pool by its handler's builder; the loop only answers a failure or submits
 * the packed command. Meanwhile the request is held (http_hold), so the
 * connection's later requests keep their order behind it.
 *
 * At most API_OFFLOAD_JOBS run at a time per gateway: the pool's threads are
 * shared with the node's tier-down, install and free jobs, which must not
 * wait behind a burst of bodies. The others wait in arrival order; their
 * number is bounded by the connections' pipelines and their bodies by the
 * server's memory bound (they are counted there until answered). At the
 * gateway's stop the waiting ones are answered at once and the running ones
 * when they come back (a queued work request keeps the loop running).
 * Builders run on a pool thread: they read the request and the gateway's
 * configuration and write only the request's own fields (its op kinds). */
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "gateway/api_body.h"
#include "gateway/gateway_internal.h"

struct api_offload {
    uv_work_t work;
    struct api_req *req;
    api_build_fn *build;
    struct api_build_args args;
    node_write_cb *done_cb;
    int mode;
    int rc;
    int verdict;
    struct tk_blob *cmd;
    struct bctx c;
    struct api_offload *next;
};

bool api__offload_wanted(const struct api_req *req)
{
    return req->http->body_len >= API_OFFLOAD_BYTES && !req->gw->stopping;
}

void api__write_built(struct api_req *req, int mode, int rc, struct bctx *c,
                      struct tk_blob *cmd, int verdict, node_write_cb *done_cb)
{
    if (c != NULL)
        req->gw->body_values_by_ref += c->spans_taken;
    if (rc != 0) {
        api__body_respond(c);
        return;
    }
    if (api__auth_answer(req, verdict) != 0)
        return;
    TK_ASSERT(cmd != NULL);
    api__submit_write(req, cmd, mode, done_cb);
}

static void work(uv_work_t *w)
{
    struct api_offload *o = w->data;
    o->rc = o->build(o->req, &o->args, &o->c, &o->cmd, &o->verdict);
}

static void start_next(struct gateway *gw);

static void after_work(uv_work_t *w, int status)
{
    struct api_offload *o = w->data;
    struct gateway *gw = o->req->gw;
    gw->offload_running--;
    gw->offload_done++;
    if (status != 0 || gw->stopping) { /* cancelled, or the node stops */
        tk_blob_unref(o->cmd);
        api__not_applied(o->req, "the node is shutting down");
    } else {
        api__write_built(o->req, o->mode, o->rc, &o->c, o->cmd, o->verdict, o->done_cb);
    }
    tk_free(o);
    start_next(gw);
}

static void start_next(struct gateway *gw)
{
    while (gw->offload_head != NULL && gw->offload_running < API_OFFLOAD_JOBS) {
        struct api_offload *o = gw->offload_head;
        gw->offload_head = o->next;
        if (gw->offload_head == NULL)
            gw->offload_tail = NULL;
        gw->offload_waiting--;
        o->work.data = o;
        if (uv_queue_work(gw->loop, &o->work, work, after_work) != 0) {
            api__not_applied(o->req, "the body could not be queued for decoding");
            tk_free(o);
            continue;
        }
        gw->offload_running++;
    }
}

void api__offload(struct api_req *req, int mode, api_build_fn *build,
                  const struct api_build_args *args, node_write_cb *done_cb)
{
    struct gateway *gw = req->gw;
    struct api_offload *o = tk_calloc(1, sizeof(*o));
    o->req = req;
    o->build = build;
    o->args = *args;
    o->done_cb = done_cb;
    o->mode = mode;
    o->c.req = req;
    http_hold(req->http);
    if (gw->offload_tail != NULL)
        gw->offload_tail->next = o;
    else
        gw->offload_head = o;
    gw->offload_tail = o;
    gw->offload_waiting++;
    gw->offloaded++;
    start_next(gw);
}

void api__offload_stop(struct gateway *gw)
{
    struct api_offload *o;
    while ((o = gw->offload_head) != NULL) {
        gw->offload_head = o->next;
        gw->offload_waiting--;
        api__not_applied(o->req, "the node is shutting down");
        tk_free(o);
    }
    gw->offload_tail = NULL;
}
