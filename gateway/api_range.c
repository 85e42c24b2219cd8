/* DELETE /v1/kv?prefix= or ?start=&end= (delete range) in bounded steps
 * (issue 19): no step may hold the node's loop however many keys the range
 * holds, live or deleted.
 *
 * A prefix becomes the range [prefix, the prefix's successor). Each step
 * first plans on the local state machine (a stale read: it only cuts the
 * range, any replica's state will do): from the step's start it walks at most
 * API_RANGE_STEP live keys and KV_SCAN_SKIP_MAX records that give none
 * (tombstones), and ends the step just after the key it read last, or at the
 * range's end when it got there. Then it proposes a DeleteRange of [start,
 * step end) with a limit of 2 x API_RANGE_STEP keys (room for keys written
 * between the plan and the apply; past it the result says `more` and the
 * same start is planned again). Each step is its own entry and revision: a
 * delete range over more than API_RANGE_STEP keys is not one atomic change,
 * and a key written into a part already deleted stays. The answer gives the
 * keys deleted in all and the revision of the last step that deleted any.
 *
 * The user's rights (api_auth.c) are checked once, on the whole range.
 * Idempotency-Key goes on the last step only (the earlier ones delete again
 * harmlessly on a retry), which carries the earlier steps' count
 * (deleted_before), so that a replayed answer gives the request's total.
 * ?mode=committed applies to the last step; the earlier ones wait for their
 * results. Called by api.c's route table; calls api_kv.c (bounds), api_reply.c,
 * api_auth.c, http.c, json.c and the node. */
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "http.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

#define API_RANGE_STEP 1024

struct plan {
    uint32_t count;
    uint8_t *last; /* the API_RANGE_STEP-th key, copied */
    size_t last_len, cap;
};

static int plan_item(const struct kv_item *it, void *data)
{
    struct plan *p = data;
    if (++p->count < API_RANGE_STEP)
        return 0;
    if (it->key_len <= p->cap) {
        memcpy(p->last, it->key, it->key_len);
        p->last_len = it->key_len;
    }
    return 1;
}

static void step_done(struct node_req *nreq, int status, const struct kv_result *res,
                      void *data);
static void plan_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data);

static void go(struct http_request *hreq)
{
    api__submit_nreq(hreq->data);
}

/* The step [req->key, end): proposed with the limit. */
static void propose(struct api_req *req, const uint8_t *end, size_t end_len, bool last)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange dr = KVPB__DELETE_RANGE__INIT;
    dr.start.data = req->key;
    dr.start.len = req->key_len;
    dr.end.data = (uint8_t *)end;
    dr.end.len = end_len;
    dr.limit = 2 * API_RANGE_STEP;
    dr.deleted_before = req->range_deleted;
    cmd.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    cmd.delete_range = &dr;
    if (last && req->http->has_digest && !req->range_keyed) {
        req->range_keyed = true; /* once: a repeat would replay this step */
        api__auth_client_id(req, &cmd.client_id, &cmd.seq);
    }
    size_t len = kvpb__command__get_packed_size(&cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(&cmd, blob->data);
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.mode = last ? req->range_mode : NODE_MODE_APPLIED;
    req->nreq.cmd = blob;
    req->nreq.write_cb = step_done;
    req->nreq.data = req;
    req->nreq.timeout_ms = req->gw->cfg.request_timeout_ms;
    req->range_last = last;
    api__submit_nreq(req);
}

static void plan_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct api_req *req = data;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    size_t cap = req->gw->cfg.key_max;
    struct plan p = {.last = tk_malloc(cap + 1), .cap = cap};
    struct kv_scan_stop stop = {.key = tk_malloc(cap + 1), .cap = cap};
    struct kv_range r = {.start = req->key,
                         .start_len = req->key_len,
                         .end = req->key2,
                         .end_len = req->key2_len};
    int rc = kv_sm_scan_bounded(sm, &r, API_RANGE_STEP, KV_SCAN_SKIP_MAX, plan_item, &p,
                                &stop);
    /* The step ends just after the key read last (that key plus a 0 byte). */
    uint8_t *end = NULL;
    size_t end_len = 0;
    if (rc == 0 && stop.stopped && stop.key_len > 0) {
        end = stop.key;
        end_len = stop.key_len;
    } else if (rc == 0 && p.count >= API_RANGE_STEP && p.last_len > 0) {
        end = p.last;
        end_len = p.last_len;
    }
    if (rc != 0) {
        api__respond_rc(req, rc);
    } else if (end == NULL) {
        propose(req, req->key2, req->key2_len, true);
    } else {
        end[end_len++] = 0;
        tk_free(req->range_end);
        req->range_end = tk_malloc(end_len);
        memcpy(req->range_end, end, end_len);
        req->range_end_len = end_len;
        propose(req, end, end_len, false);
    }
    tk_free(p.last);
    tk_free(stop.key);
}

static void answer(struct api_req *req, const struct kv_result *res)
{
    struct jbuf b;
    jbuf_init(&b, 96);
    if (req->nreq.mode == NODE_MODE_COMMITTED) {
        jbuf_printf(&b, "{\"revision\":%llu,\"mode\":\"committed\"}",
                    (unsigned long long)res->revision);
    } else {
        uint64_t rev = res->revision ? res->revision : req->range_revision;
        jbuf_printf(&b, "{\"revision\":%llu,\"deleted\":%llu%s}", (unsigned long long)rev,
                    (unsigned long long)res->deleted,
                    res->duplicate ? ",\"replayed\":true" : "");
    }
    api__respond_json(req, &b, res->revision ? res->revision : req->range_revision);
    jbuf_free(&b);
}

static void step_done(struct node_req *nreq, int status, const struct kv_result *res,
                      void *data)
{
    (void)nreq;
    struct api_req *req = data;
    req->submitted = false;
    if (status == 0 && req->nreq.mode != NODE_MODE_COMMITTED && res->code != 0)
        status = res->code;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    if (req->range_last && !res->more) {
        answer(req, res);
        return;
    }
    req->range_deleted = res->deleted;
    if (res->revision)
        req->range_revision = res->revision;
    if (!res->more) { /* the next step starts where this one ended */
        api__key_free(req);
        req->key = req->range_end;
        req->key_len = req->range_end_len;
        req->range_end = NULL;
        req->range_end_len = 0;
    }
    api__stale_read_fill(req, plan_cb);
    api__submit_nreq(req);
}

void api__kv_delete_range(struct api_req *req, const struct query *q)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0)
        return;
    if (!(q->present & (Q_PREFIX | Q_START))) {
        api__bad(req,
                 "DELETE /v1/kv needs prefix= or start= (prefix= with an empty value "
                 "deletes every key)");
        return;
    }
    if (api__scan_bounds(req, q) != 0)
        return;
    if (req->by_prefix)
        api__prefix_to_range(req);
    if (req->key == NULL)
        req->key = tk_malloc(1);
    /* The user's rights on the whole range (all of it: admin), once. */
    Kvpb__Command whole = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange dr = KVPB__DELETE_RANGE__INIT;
    dr.start.data = req->key;
    dr.start.len = req->key_len;
    dr.end.data = req->key2;
    dr.end.len = req->key2_len;
    whole.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    whole.delete_range = &dr;
    if (api__auth_command(req, &whole) != 0)
        return;
    req->range_mode = (uint8_t)mode;
    api__stale_read_fill(req, plan_cb);
    http_dispatch(req->http, true, go);
}
