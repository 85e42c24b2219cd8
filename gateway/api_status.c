/* The status page: GET /ui serves gateway/ui.html, embedded in the binary at
 * build time (ui_html.h, from gateway/embed_asset.py), with this node's status
 * as JSON spliced in at its @TK_NODE@ marker. The page polls /v1/cluster and
 * /metrics of this node and every member's /ui (for that member's own
 * status), so the answer carries Access-Control-Allow-Origin: * (it holds
 * nothing the other read-only routes do not). Called by api.c's route table;
 * on the gateway's loop thread. */
#include <string.h>

#include "base/assert.h"
#include "gateway/gateway_internal.h"
#include "ui_html.h"

static const char marker[] = "@TK_NODE@";

void api__ui(struct api_req *req, const struct query *q)
{
    (void)q;
    struct node_status st;
    node_status(req->gw->node, &st);
    const char *at = strstr(ui_html, marker);
    TK_ASSERT(at != NULL);
    bool ready =
        !req->gw->stopping && !st.failed && st.leader != 0 && st.applied >= st.commit;
    struct jbuf b;
    jbuf_init(&b, sizeof(ui_html) + 256);
    jbuf_add(&b, ui_html, (size_t)(at - ui_html));
    jbuf_printf(
        &b,
        "{\"id\":%llu,\"role\":\"%s\",\"term\":%llu,\"leader\":%llu,\"commit\":%llu,"
        "\"applied\":%llu,\"last_index\":%llu,\"snapshot_index\":%llu,"
        "\"ready\":%s}",
        (unsigned long long)st.id, raft_role_name(st.role), (unsigned long long)st.term,
        (unsigned long long)st.leader, (unsigned long long)st.commit,
        (unsigned long long)st.applied, (unsigned long long)st.last_index,
        (unsigned long long)st.snapshot_index, ready ? "true" : "false");
    jbuf_adds(&b, at + sizeof(marker) - 1);
    http_respond(req->http, 200, "text/html; charset=utf-8",
                 "Access-Control-Allow-Origin: *\r\nCache-Control: no-store\r\n", b.p,
                 b.len);
    jbuf_free(&b);
}
