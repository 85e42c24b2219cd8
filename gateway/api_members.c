/* The membership routes (docs/api.md, "Membership"):
 *   GET    /v1/members               the configuration in force, with addresses
 *                                    and, on the leader, each member's progress;
 *   POST   /v1/members               {"id","raft","http","learner"}: add;
 *   POST   /v1/members/{id}/promote  a caught-up learner becomes a voter;
 *   DELETE /v1/members/{id}          remove a voter or a learner.
 * Changes run on the leader (elsewhere: 503 not_leader with X-Tierkv-Leader)
 * through node_member_change, one at a time, and answer once the
 * configuration entry commits. Called by api.c's route table; on the node's
 * loop thread. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gateway/gateway_internal.h"

#define MEMBERS_LIST_MAX (RAFT_MEMBERS_MAX)

/* The HTTP address of `id` from the gateway's configuration (the bootstrap
 * members of tierkvd's --members-http), "" if none. */
static const char *cfg_http(const struct gateway *gw, uint64_t id)
{
    for (uint32_t i = 0; i < gw->cfg.n_members; i++)
        if (gw->cfg.members[i].id == id)
            return gw->cfg.members[i].http_addr;
    return "";
}

void api__members_list(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    (void)q;
    struct node_member m[MEMBERS_LIST_MAX];
    uint64_t ci = 0;
    bool committed = false;
    size_t k = node_members(gw->node, m, MEMBERS_LIST_MAX, &ci, &committed);
    if (k > MEMBERS_LIST_MAX)
        k = MEMBERS_LIST_MAX;
    struct node_status st;
    node_status(gw->node, &st);
    struct jbuf b;
    jbuf_init(&b, 1024);
    jbuf_printf(&b,
                "{\"id\":%" PRIu64 ",\"leader\":%" PRIu64 ",\"config_index\":%" PRIu64
                ",\"committed\":%s,\"members\":[",
                st.id, st.leader, ci, committed ? "true" : "false");
    for (size_t i = 0; i < k; i++) {
        const char *http = m[i].http[0] ? m[i].http : cfg_http(gw, m[i].id);
        jbuf_printf(&b, "%s{\"id\":%" PRIu64 ",\"role\":\"%s\",\"raft\":", i ? "," : "",
                    m[i].id, m[i].voter ? "voter" : "learner");
        jbuf_jstr(&b, m[i].raft, strlen(m[i].raft));
        jbuf_adds(&b, ",\"http\":");
        jbuf_jstr(&b, http, strlen(http));
        jbuf_printf(&b, ",\"leader\":%s", m[i].id == st.leader ? "true" : "false");
        if (m[i].has_progress)
            jbuf_printf(&b, ",\"match\":%" PRIu64 ",\"lag\":%" PRIu64 ",\"caught_up\":%s",
                        m[i].match, m[i].behind, m[i].caught_up ? "true" : "false");
        jbuf_adds(&b, "}");
    }
    jbuf_adds(&b, "]}");
    api__respond_json(req, &b, 0);
    jbuf_free(&b);
}

/* A change's outcome as an HTTP answer. */
static void respond_result(struct api_req *req, const struct node_member_result *res)
{
    int status;
    const char *code;
    switch (res->status) {
    case 0: {
        struct jbuf b;
        jbuf_init(&b, 128);
        jbuf_printf(&b, "{\"ok\":true,\"index\":%" PRIu64 ",\"message\":", res->index);
        jbuf_jstr(&b, res->msg, strlen(res->msg));
        jbuf_adds(&b, "}");
        api__respond_json(req, &b, 0);
        jbuf_free(&b);
        return;
    }
    case TK_ENOTLEADER:
    case TK_ENOLEADER:
    case TK_ELOST:
    case TK_ETIMEDOUT:
        api__respond_rc(req, res->status);
        return;
    case TK_EBUSY:
        status = 409, code = "change_pending";
        break;
    case TK_ECOMPARE:
        status = 409, code = "conflict";
        break;
    case TK_ERANGE:
        status = 409, code = "not_caught_up";
        break;
    case TK_ENOTFOUND:
        status = 404, code = "not_a_member";
        break;
    case TK_EINVAL:
        status = 400, code = "bad_request";
        break;
    case TK_ESHUTDOWN:
        status = 503, code = "shutting_down";
        break;
    default:
        status = 500, code = "internal";
        break;
    }
    struct jbuf b;
    jbuf_init(&b, 256);
    jbuf_printf(&b, "{\"error\":{\"code\":\"%s\",\"message\":", code);
    jbuf_jstr(&b, res->msg, strlen(res->msg));
    if (res->status == TK_ERANGE)
        jbuf_printf(&b, ",\"behind\":%" PRIu64 ",\"match\":%" PRIu64, res->behind,
                    res->match);
    jbuf_adds(&b, "}}\n");
    http_respond(req->http, status, NULL, NULL, b.p, b.len);
    jbuf_free(&b);
}

static void on_change_done(const struct node_member_result *res, void *data)
{
    respond_result(data, res);
}

static void start_change(struct api_req *req, const struct node_member_change *c)
{
    struct node_member_result res;
    if (node_member_change(req->gw->node, c, on_change_done, req, &res) != 0)
        respond_result(req, &res);
}

/* The {id} of the path: a positive decimal. */
static int path_id(struct api_req *req, uint64_t *id)
{
    char buf[24];
    if (req->key_len == 0 || req->key_len >= sizeof(buf)) {
        api__bad(req, "a member id is a positive integer");
        return TK_EINVAL;
    }
    memcpy(buf, req->key, req->key_len);
    buf[req->key_len] = '\0';
    char *end = NULL;
    unsigned long long v = strtoull(buf, &end, 10);
    if (*end != '\0' || v == 0 || buf[0] < '0' || buf[0] > '9') {
        api__bad(req, "a member id is a positive integer, not \"%s\"", buf);
        return TK_EINVAL;
    }
    *id = v;
    return 0;
}

static int body_str(struct api_req *req, json_t *j, const char *name, char *out,
                    size_t cap, bool required)
{
    json_t *v = json_object_get(j, name);
    out[0] = '\0';
    if (v == NULL && !required)
        return 0;
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        json_string_length(v) >= cap) {
        api__bad(req, "\"%s\" must be a non-empty string of at most %zu bytes", name,
                 cap - 1);
        return TK_EINVAL;
    }
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int parse_add(struct api_req *req, json_t *j, struct node_member_change *c)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        if (strcmp(k, "id") && strcmp(k, "raft") && strcmp(k, "http") &&
            strcmp(k, "learner")) {
            api__bad(req, "unknown member \"%s\" (id, raft, http, learner)", k);
            return TK_EINVAL;
        }
    }
    json_t *id = json_object_get(j, "id");
    if (!json_is_integer(id) || json_integer_value(id) <= 0) {
        api__bad(req, "\"id\" must be a positive integer");
        return TK_EINVAL;
    }
    c->id = (uint64_t)json_integer_value(id);
    if (body_str(req, j, "raft", c->raft, sizeof(c->raft), true) != 0 ||
        body_str(req, j, "http", c->http, sizeof(c->http), false) != 0)
        return TK_EINVAL;
    json_t *l = json_object_get(j, "learner");
    if (l != NULL && !json_is_boolean(l)) {
        api__bad(req, "\"learner\" must be true or false");
        return TK_EINVAL;
    }
    c->learner = l != NULL && json_is_true(l);
    return 0;
}

void api__members_add(struct api_req *req, const struct query *q)
{
    (void)q;
    json_error_t e;
    json_t *j = json_loadb((const char *)req->http->body, req->http->body_len,
                           JSON_REJECT_DUPLICATES, &e);
    if (j == NULL) {
        api__bad(req, "invalid JSON at line %d column %d: %s", e.line, e.column, e.text);
        return;
    }
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_ADD;
    int rc = json_is_object(j) ? parse_add(req, j, &c) : TK_EINVAL;
    if (rc == TK_EINVAL && !json_is_object(j))
        api__bad(req, "the body must be a JSON object");
    json_decref(j);
    if (rc == 0)
        start_change(req, &c);
}

void api__members_promote(struct api_req *req, const struct query *q)
{
    (void)q;
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_PROMOTE;
    if (path_id(req, &c.id) == 0)
        start_change(req, &c);
}

void api__members_remove(struct api_req *req, const struct query *q)
{
    (void)q;
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_REMOVE;
    if (path_id(req, &c.id) == 0)
        start_change(req, &c);
}
