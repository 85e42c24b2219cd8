/* GET /v1/debug/digest in bounded steps (issue 19): a digest of this node's
 * applied state (kv_sm_digest's value) read locally, for comparing replicas.
 *
 * Each step is a stale read of its own (its callback holding the node's state
 * lock, on the gateway's loop) hashing at most
 * API_DIGEST_STEP live keys and KV_SCAN_SKIP_MAX records that give none
 * (kv_sm_digest_step), so a digest of millions of keys never holds the loop;
 * the node runs a step submitted from a step's callback on its next loop turn.
 * The steps must see one state: a step that finds the applied index moved
 * since the first starts the digest again, and after API_DIGEST_RESTARTS
 * such restarts (a node under steady writes) the answer is 503
 * `state_changing`. Called by api.c's route table; on the gateway's loop. */
#include <string.h>

#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "http.h"
#include "kv/kv.h"

#define API_DIGEST_STEP 16384
#define API_DIGEST_RESTARTS 8

static void digest_step_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data);

static void digest_submit(struct api_req *req)
{
    api__stale_read_fill(req, digest_step_cb);
    api__submit_nreq(req);
}

static void digest_answer(struct api_req *req)
{
    uint64_t d = kv_digest_value(req->digest);
    struct jbuf b;
    jbuf_init(&b, 96);
    jbuf_printf(&b, "{\"digest\":\"%016llx\",\"applied\":%llu}", (unsigned long long)d,
                (unsigned long long)req->digest_applied);
    api__respond_json(req, &b, req->digest_applied);
    jbuf_free(&b);
}

static void digest_step_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data)
{
    (void)nreq;
    struct api_req *req = data;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    uint64_t applied = kv_sm_applied_index(sm);
    if (req->digest != NULL && applied != req->digest_applied) {
        kv_digest_free(req->digest); /* the state moved: from the start */
        req->digest = NULL;
        if (++req->digest_restarts > API_DIGEST_RESTARTS) {
            char retry[64];
            api__retry_after(req->gw, retry, sizeof(retry));
            http_respond_error(req->http, 503, "state_changing", retry,
                               "the applied state changed under the digest %d times; "
                               "retry when writes pause",
                               API_DIGEST_RESTARTS + 1);
            return;
        }
    }
    if (req->digest == NULL) {
        req->digest = kv_digest_new(sm);
        req->digest_applied = applied;
    }
    int rc = kv_sm_digest_step(sm, req->digest, API_DIGEST_STEP, KV_SCAN_SKIP_MAX);
    if (rc < 0)
        api__respond_rc(req, rc);
    else if (rc == 0)
        digest_submit(req); /* runs on the node's next loop turn */
    else
        digest_answer(req);
}

static void digest_go(struct http_request *hreq)
{
    digest_submit(hreq->data);
}

void api__digest(struct api_req *req, const struct query *q)
{
    (void)q;
    http_dispatch(req->http, false, digest_go);
}
