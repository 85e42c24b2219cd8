/* The membership routes (docs/api.md, "Membership"):
 *   GET    /v1/members               the configuration in force, with addresses
 *                                    and, on the leader, each member's progress;
 *   POST   /v1/members               {"id","raft","http","learner"}: add;
 *   POST   /v1/members/{id}/promote  a caught-up learner becomes a voter;
 *   DELETE /v1/members/{id}          remove a voter or a learner.
 * Changes run on the leader (elsewhere: 503 not_leader with X-Tierkv-Leader)
 * through node_member_change, one at a time, and answer once the
 * configuration entry commits. Called by api.c's route table; on the
 * gateway's loop (the node's member calls under its state lock, the change's
 * answer brought back by api__bounce).
 *
 * An add is checked here before the node sees it, against this node's view
 * of the configuration (node_members): addresses must be host:port with a
 * port 1-65535 and a host that is an IPv4 or [IPv6] literal or a DNS name
 * (400); an id, Raft address or HTTP address another member has is 409
 * `conflict`; no room under RAFT_VOTERS_MAX / RAFT_LEARNERS_MAX is 409
 * `member_limit` naming the limit (also when the node finds it later). */
#include <arpa/inet.h>
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    size_t k = api__node_members(gw, m, MEMBERS_LIST_MAX, &ci, &committed);
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
    case TK_ENOSPC: /* the core found no room (raced past the checks below) */
        status = 409, code = "member_limit";
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

struct change_done {
    struct api_req *req;
    struct node_member_result res;
};

static void change_answer(void *arg)
{
    struct change_done *d = arg;
    respond_result(d->req, &d->res);
    tk_free(d);
}

/* On the node's loop: the answer is given on the gateway's. */
static void on_change_done(const struct node_member_result *res, void *data)
{
    struct api_req *req = data;
    if (!req->gw->own_loop) {
        respond_result(req, res);
        return;
    }
    struct change_done *d = tk_malloc(sizeof(*d));
    d->req = req;
    d->res = *res;
    api__bounce(req->gw, change_answer, d);
}

static void start_change(struct api_req *req, const struct node_member_change *c)
{
    struct gateway *gw = req->gw;
    struct node_member_result res;
    if (!api__state_enter(gw)) {
        api__respond_rc(req, TK_ESHUTDOWN);
        return;
    }
    int rc = node_member_change(gw->node, c, on_change_done, req, &res);
    api__state_leave(gw, rc == 0);
    if (rc != 0)
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

/* ---- checking an add ----------------------------------------------------- */

/* A DNS name (RFC 1123): dot-separated labels of 1-63 letters, digits and
 * hyphens, not starting or ending with a hyphen, at most 253 bytes, its last
 * label not all digits (that is a malformed IPv4 address, not a name). */
static bool dns_name(const char *h, size_t len)
{
    if (len == 0 || len > 253)
        return false;
    size_t start = 0;
    bool last_digits = false; /* the label just ended was all digits */
    for (size_t i = 0; i <= len; i++) {
        if (i < len && h[i] != '.') {
            unsigned char ch = (unsigned char)h[i];
            if (!isalnum(ch) && ch != '-')
                return false;
            continue;
        }
        size_t ll = i - start;
        if (ll == 0 || ll > 63 || h[start] == '-' || h[i - 1] == '-')
            return false;
        last_digits = strspn(h + start, "0123456789") >= ll;
        start = i + 1;
    }
    return !last_digits;
}

/* Splits and checks "host:port" or "[v6]:port" into host (lower case, no
 * brackets) and port; on failure answers 400 naming the field and the value
 * and returns TK_EINVAL. */
static int check_addr(struct api_req *req, const char *field, const char *a, char *host,
                      size_t cap, unsigned *port)
{
    const char *colon = strrchr(a, ':');
    const char *h = a;
    size_t hl = colon ? (size_t)(colon - a) : 0;
    if (colon == NULL || hl == 0)
        goto bad_form;
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            goto bad_form;
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl) != NULL) {
        api__bad(req, "\"%s\": \"%s\": an IPv6 address goes in brackets: [addr]:port",
                 field, a);
        return TK_EINVAL;
    }
    if (hl >= cap)
        goto bad_form;
    memcpy(host, h, hl);
    host[hl] = '\0';
    const char *p = colon + 1;
    size_t pl = strlen(p);
    unsigned long v = 0;
    for (size_t i = 0; i < pl && pl <= 5; i++)
        v = isdigit((unsigned char)p[i]) ? v * 10 + (unsigned long)(p[i] - '0') : 0;
    if (pl == 0 || pl > 5 || v == 0 || v > 65535 || strspn(p, "0123456789") != pl) {
        api__bad(req, "\"%s\": \"%s\": the port must be a number from 1 to 65535", field,
                 a);
        return TK_EINVAL;
    }
    *port = (unsigned)v;
    unsigned char bin[16];
    bool v6 = h != a;
    if (v6 ? inet_pton(AF_INET6, host, bin) != 1
           : inet_pton(AF_INET, host, bin) != 1 && !dns_name(host, hl)) {
        api__bad(req, "\"%s\": \"%s\": the host \"%s\" is not %s", field, a, host,
                 v6 ? "an IPv6 address" : "an IPv4 address or a DNS name");
        return TK_EINVAL;
    }
    for (char *x = host; *x; x++)
        *x = (char)tolower((unsigned char)*x);
    return 0;
bad_form:
    api__bad(req,
             "\"%s\": \"%s\" is not host:port (host: an IPv4 address, [IPv6] or a DNS "
             "name; port: 1-65535)",
             field, a);
    return TK_EINVAL;
}

/* Does the address `a` (any form node_members gives) name host:port? */
static bool same_addr(const char *a, const char *host, unsigned port)
{
    if (a == NULL || a[0] == '\0')
        return false;
    const char *colon = strrchr(a, ':');
    if (colon == NULL)
        return false;
    const char *h = a;
    size_t hl = (size_t)(colon - a);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']')
        h++, hl -= 2;
    return strlen(host) == hl && strncasecmp(h, host, hl) == 0 &&
           strtoul(colon + 1, NULL, 10) == port;
}

/* Whose address is host:port among the members m[0..k) (their Raft or
 * HTTP address); sets *what to which. NULL if nobody's. */
static const struct node_member *addr_owner(const struct gateway *gw,
                                            const struct node_member *m, size_t k,
                                            const char *host, unsigned port,
                                            const char **what)
{
    for (size_t i = 0; i < k; i++) {
        const char *raft = m[i].raft,
                   *http = m[i].http[0] ? m[i].http : cfg_http(gw, m[i].id);
        for (uint32_t j = 0; j < gw->cfg.n_members; j++)
            if (gw->cfg.members[j].id == m[i].id && gw->cfg.members[j].raft_addr[0])
                raft = gw->cfg.members[j].raft_addr;
        *what = "Raft address";
        if (same_addr(raft, host, port) || same_addr(m[i].raft, host, port))
            return &m[i];
        *what = "HTTP address";
        if (same_addr(http, host, port))
            return &m[i];
    }
    return NULL;
}

/* The add against the configuration this node holds: an id, Raft address or
 * HTTP address in use (409 conflict), no room (409 member_limit). Answers and
 * returns TK_EINVAL when refused. While the configuration is uncommitted a
 * change is in progress: the node answers change_pending, whatever else. */
static int check_add(struct api_req *req, const struct node_member_change *c)
{
    struct gateway *gw = req->gw;
    char rhost[NODE_ADDR_MAX], hhost[NODE_ADDR_MAX];
    unsigned rport = 0, hport = 0;
    if (check_addr(req, "raft", c->raft, rhost, sizeof(rhost), &rport) != 0 ||
        (c->http[0] &&
         check_addr(req, "http", c->http, hhost, sizeof(hhost), &hport) != 0))
        return TK_EINVAL;
    if (c->http[0] && strcmp(rhost, hhost) == 0 && rport == hport) {
        api__bad(req, "\"raft\" and \"http\" are the same address, %s", c->raft);
        return TK_EINVAL;
    }
    struct node_member m[MEMBERS_LIST_MAX];
    uint64_t ci = 0;
    bool committed = false;
    size_t k = api__node_members(gw, m, MEMBERS_LIST_MAX, &ci, &committed);
    if (k > MEMBERS_LIST_MAX)
        k = MEMBERS_LIST_MAX;
    if (!committed)
        return 0;
    size_t voters = 0, learners = 0;
    for (size_t i = 0; i < k; i++) {
        *(m[i].voter ? &voters : &learners) += 1;
        if (m[i].id == c->id) {
            http_respond_error(req->http, 409, "conflict", NULL,
                               "node %" PRIu64 " is already a member (%s)", c->id,
                               m[i].voter ? "a voter" : "a learner");
            return TK_EINVAL;
        }
    }
    const char *what = NULL, *addr = c->raft;
    const struct node_member *o = addr_owner(gw, m, k, rhost, rport, &what);
    if (o == NULL && c->http[0])
        o = addr_owner(gw, m, k, hhost, hport, &what), addr = c->http;
    if (o != NULL) {
        http_respond_error(req->http, 409, "conflict", NULL,
                           "%s is the %s of member %" PRIu64
                           "; each member needs its own addresses",
                           addr, what, o->id);
        return TK_EINVAL;
    }
    /* Every add joins as a learner first; an add as a voter then needs a
     * voter's seat too. */
    if (learners >= RAFT_LEARNERS_MAX || (!c->learner && voters >= RAFT_VOTERS_MAX)) {
        bool l = learners >= RAFT_LEARNERS_MAX;
        http_respond_error(req->http, 409, "member_limit", NULL,
                           "no room: a cluster has at most %d voters and %d learners "
                           "(RAFT_%s_MAX) and this one has %zu %s; remove one first",
                           RAFT_VOTERS_MAX, RAFT_LEARNERS_MAX, l ? "LEARNERS" : "VOTERS",
                           l ? learners : voters, l ? "learners" : "voters");
        return TK_EINVAL;
    }
    return 0;
}

/* A promotion needs a voter's seat. */
static int check_promote(struct api_req *req, uint64_t id)
{
    struct node_member m[MEMBERS_LIST_MAX];
    uint64_t ci = 0;
    bool committed = false, learner = false;
    size_t k = api__node_members(req->gw, m, MEMBERS_LIST_MAX, &ci, &committed);
    size_t voters = 0;
    for (size_t i = 0; i < k && i < MEMBERS_LIST_MAX; i++) {
        voters += m[i].voter;
        learner |= m[i].id == id && !m[i].voter;
    }
    if (learner && voters >= RAFT_VOTERS_MAX) {
        http_respond_error(req->http, 409, "member_limit", NULL,
                           "no room: a cluster has at most %d voters (RAFT_VOTERS_MAX) "
                           "and this one has %zu; remove one first",
                           RAFT_VOTERS_MAX, voters);
        return TK_EINVAL;
    }
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
    if (rc == 0 && check_add(req, &c) == 0)
        start_change(req, &c);
}

void api__members_promote(struct api_req *req, const struct query *q)
{
    (void)q;
    struct node_member_change c;
    memset(&c, 0, sizeof(c));
    c.op = NODE_MEMBER_PROMOTE;
    if (path_id(req, &c.id) == 0 && check_promote(req, c.id) == 0)
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
