/* The cluster routes: GET /v1/cluster (this node's Raft status and the
 * members), /healthz and /readyz (/v1/debug/digest: api_digest.c). Called by
 * api.c's route table; on the gateway's loop. */
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
    const char *membership = "member";
    if (st.rejected)
        membership = "not_a_member";
    else if (st.removed)
        membership = "removed";
    struct jbuf b;
    jbuf_init(&b, 512);
    jbuf_printf(
        &b,
        "{\"id\":%llu,\"leader\":%llu,\"role\":\"%s\",\"term\":%llu,\"commit\":%llu,"
        "\"applied\":%llu,\"last_index\":%llu,\"last_term\":%llu,\"snapshot_index\":%llu,"
        "\"membership\":\"%s\",\"members\":[",
        (unsigned long long)st.id, (unsigned long long)st.leader, raft_role_name(st.role),
        (unsigned long long)st.term, (unsigned long long)st.commit,
        (unsigned long long)st.applied, (unsigned long long)st.last_index,
        (unsigned long long)st.last_term, (unsigned long long)st.snapshot_index,
        membership);
    /* The configuration in force (members added or removed at run time
     * included); the addresses given at start win for the members they name. */
    struct node_member m[RAFT_MEMBERS_MAX];
    uint64_t ci;
    bool committed;
    size_t k = api__node_members(gw, m, RAFT_MEMBERS_MAX, &ci, &committed);
    for (size_t i = 0; i < k && i < RAFT_MEMBERS_MAX; i++) {
        const char *raft = m[i].raft, *http = m[i].http;
        for (uint32_t j = 0; j < gw->cfg.n_members; j++) {
            if (gw->cfg.members[j].id != m[i].id)
                continue;
            raft = gw->cfg.members[j].raft_addr;
            if (http[0] == '\0')
                http = gw->cfg.members[j].http_addr;
        }
        jbuf_printf(&b, "%s{\"id\":%llu,\"raft\":", i ? "," : "",
                    (unsigned long long)m[i].id);
        jbuf_jstr(&b, raft, strlen(raft));
        jbuf_adds(&b, ",\"http\":");
        jbuf_jstr(&b, http, strlen(http));
        jbuf_printf(&b, ",\"leader\":%s,\"role\":\"%s\"}",
                    m[i].id == st.leader ? "true" : "false",
                    m[i].voter ? "voter" : "learner");
    }
    jbuf_adds(&b, "]}");
    api__respond_json(req, &b, st.applied);
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
    } else if (st.rejected || st.removed || st.leader == 0) {
        api__respond_rc(req, TK_ENOLEADER); /* not_a_member, removed or no_leader */
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
