/* The cluster routes: GET /v1/cluster (this node's Raft status and the
 * members), /healthz, /readyz and /v1/debug/digest. Called by api.c's route
 * table; on the node's loop thread. */
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "kv/kv.h"

void api__cluster(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    (void)q;
    struct node_status st;
    node_status(gw->node, &st);
    struct jbuf b;
    jbuf_init(&b, 512);
    jbuf_printf(
        &b,
        "{\"id\":%llu,\"leader\":%llu,\"role\":\"%s\",\"term\":%llu,\"commit\":%llu,"
        "\"applied\":%llu,\"last_index\":%llu,\"last_term\":%llu,\"snapshot_index\":%llu,"
        "\"members\":[",
        (unsigned long long)st.id, (unsigned long long)st.leader, api__role_name(st.role),
        (unsigned long long)st.term, (unsigned long long)st.commit,
        (unsigned long long)st.applied, (unsigned long long)st.last_index,
        (unsigned long long)st.last_term, (unsigned long long)st.snapshot_index);
    for (uint32_t i = 0; i < gw->cfg.n_members; i++) {
        const struct gateway_member *m = &gw->cfg.members[i];
        jbuf_printf(&b, "%s{\"id\":%llu,\"raft\":", i ? "," : "",
                    (unsigned long long)m->id);
        jbuf_jstr(&b, m->raft_addr, strlen(m->raft_addr));
        jbuf_adds(&b, ",\"http\":");
        jbuf_jstr(&b, m->http_addr, strlen(m->http_addr));
        jbuf_printf(&b, ",\"leader\":%s}", m->id == st.leader ? "true" : "false");
    }
    jbuf_adds(&b, "]}");
    api__respond_json(req, &b, st.applied);
    jbuf_free(&b);
}

/* GET /v1/debug/digest: a digest of this node's applied state (kv_sm_digest)
 * and the index it is at, read locally, for comparing replicas. */
static void digest_read_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data)
{
    struct api_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    uint64_t d = 0;
    int rc = kv_sm_digest(sm, &d);
    if (rc != 0) {
        api__respond_rc(req, rc);
        return;
    }
    uint64_t applied = kv_sm_applied_index(sm);
    struct jbuf b;
    jbuf_init(&b, 96);
    jbuf_printf(&b, "{\"digest\":\"%016llx\",\"applied\":%llu}", (unsigned long long)d,
                (unsigned long long)applied);
    api__respond_json(req, &b, applied);
    jbuf_free(&b);
}

void api__readyz(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    (void)q;
    struct node_status st;
    node_status(gw->node, &st);
    char retry[64];
    api__retry_after(gw, retry, sizeof(retry));
    if (gw->stopping) {
        http_respond_error(req->http, 503, "shutting_down", retry,
                           "the node is shutting down");
    } else if (st.failed) {
        http_respond_error(
            req->http, 503, "storage_failed", retry,
            "the node's storage failed; it serves nothing until restarted");
    } else if (st.leader == 0) {
        http_respond_error(req->http, 503, "no_leader", retry, "no leader is known yet");
    } else if (st.applied < st.commit) {
        http_respond_error(req->http, 503, "catching_up", retry,
                           "applied index %llu is behind commit index %llu",
                           (unsigned long long)st.applied, (unsigned long long)st.commit);
    } else {
        static const char ok[] = "{\"ready\":true}\n";
        http_respond(req->http, 200, NULL, NULL, ok, sizeof(ok) - 1);
    }
}

void api__healthz(struct api_req *req, const struct query *q)
{
    (void)q;
    static const char ok[] = "{\"status\":\"ok\"}\n";
    http_respond(req->http, 200, NULL, NULL, ok, sizeof(ok) - 1);
}

/* GET /v1/debug/digest: read locally (stale), for comparing replicas. */
void api__digest(struct api_req *req, const struct query *q)
{
    (void)q;
    api__submit_read(req, NODE_READ_STALE, digest_read_cb);
}
