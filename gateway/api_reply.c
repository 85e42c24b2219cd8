/* What the gateway's handlers share (contract in gateway_internal.h): the
 * query string's parser and value checks, the answers for project error
 * codes and JSON bodies, and submitting a request to the node in its
 * connection's order. Called by api.c and the handlers (the api_*.c files);
 * calls api_auth.c (read rights), http.c, json.c and the node. On the node's
 * loop thread. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "gateway/api_body.h"
#include "gateway/gateway_internal.h"
#include "raft/raft.h"

/* ---- query strings ------------------------------------------------------ */

static const char *const qnames[QI_COUNT] = {
#define X(id, name) [QI_##id] = name,
    GW_QPARAMS(X)
#undef X
};

void api__query_free(struct query *q)
{
    for (size_t i = 0; i < QI_COUNT; i++)
        tk_free(q->val[i]);
}

/* Parses `s` (without '?'); only params in `allowed`. On error fills msg. */
int api__query_parse(const char *s, size_t len, unsigned allowed, struct query *q,
                     char *msg, size_t msg_cap)
{
    memset(q, 0, sizeof(*q));
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && s[j] != '&')
            j++;
        if (j > i) {
            const char *eq = memchr(s + i, '=', j - i);
            size_t nlen = eq ? (size_t)(eq - (s + i)) : j - i;
            int found = -1;
            for (size_t k = 0; k < QI_COUNT; k++)
                if (strlen(qnames[k]) == nlen && memcmp(qnames[k], s + i, nlen) == 0)
                    found = (int)k;
            if (found < 0 || !(allowed & (1u << found))) {
                snprintf(msg, msg_cap, "unknown query parameter \"%.*s\" for this route",
                         (int)(nlen > 64 ? 64 : nlen), s + i);
                return TK_EINVAL;
            }
            if (q->present & (1u << found)) {
                snprintf(msg, msg_cap, "query parameter \"%s\" given twice",
                         qnames[found]);
                return TK_EINVAL;
            }
            const char *v = eq ? eq + 1 : s + j;
            size_t vlen = (size_t)(s + j - v);
            q->val[found] = tk_malloc(vlen + 1);
            if (pct_decode(v, vlen, q->val[found], &q->len[found], true) != 0) {
                snprintf(msg, msg_cap, "bad percent-escape in query parameter \"%s\"",
                         qnames[found]);
                return TK_EINVAL;
            }
            q->val[found][q->len[found]] = 0;
            q->present |= 1u << found;
        }
        i = j + 1;
    }
    return 0;
}

static int parse_u64(const char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 20)
        return TK_EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return TK_EINVAL;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return TK_EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int api__parse_i64(const char *s, size_t len, int64_t *out)
{
    bool neg = len > 0 && s[0] == '-';
    uint64_t v;
    if (parse_u64(s + neg, len - neg, &v) != 0)
        return TK_EINVAL;
    if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
        return TK_EINVAL;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* ---- query values -------------------------------------------------------- */

/* One value of a query parameter that picks among words. */
struct choice {
    const char *word;
    int value;
    bool alias; /* accepted, not named in the error message */
};

/* ?<qi>=<word>: out = the word's value, or choices[0].value when absent. On
 * an unknown word answers 400 naming the (non-alias) words. */
static int parse_choice(struct api_req *req, const struct query *q, int qi,
                        const struct choice *choices, size_t n, int *out)
{
    *out = choices[0].value;
    if (!(q->present & (1u << qi)))
        return 0;
    const char *v = (const char *)q->val[qi];
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v, choices[i].word) == 0) {
            *out = choices[i].value;
            return 0;
        }
    }
    char words[128] = "";
    size_t len = 0;
    for (size_t i = 0, named = 0; i < n; i++) {
        if (choices[i].alias)
            continue;
        len += (size_t)snprintf(words + len, sizeof(words) - len, "%s\"%s\"",
                                named++ ? " or " : "", choices[i].word);
        TK_ASSERT(len < sizeof(words));
    }
    api__bad(req, "%s must be %s", qnames[qi], words);
    return TK_EINVAL;
}

int api__parse_mode(struct api_req *req, const struct query *q, int *mode)
{
    static const struct choice modes[] = {
        {"applied", NODE_MODE_APPLIED, false},
        {"committed", NODE_MODE_COMMITTED, false},
    };
    return parse_choice(req, q, QI_MODE, modes, 2, mode);
}

int api__parse_consistency(struct api_req *req, const struct query *q, int *cons)
{
    static const struct choice levels[] = {
        {"linearizable", NODE_READ_LINEARIZABLE, false},
        {"stale", NODE_READ_STALE, false},
    };
    return parse_choice(req, q, QI_CONSISTENCY, levels, 2, cons);
}

int api__parse_encoding(struct api_req *req, const struct query *q)
{
    static const struct choice encodings[] = {
        {"utf8", 0, false},
        {"base64", 1, false},
        {"utf-8", 0, true},
    };
    int b64;
    int rc = parse_choice(req, q, QI_ENCODING, encodings, 3, &b64);
    req->b64 = b64 != 0;
    return rc;
}

int api__parse_flag(struct api_req *req, const struct query *q, int qi, bool *out)
{
    *out = false;
    if (!(q->present & (1u << qi)))
        return 0;
    const char *v = (const char *)q->val[qi];
    if (v[0] == 0 || strcmp(v, "1") == 0 || strcmp(v, "true") == 0) {
        *out = true;
        return 0;
    }
    if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
        return 0;
    api__bad(req, "%s must be empty, true/1 or false/0", qnames[qi]);
    return TK_EINVAL;
}

int api__query_u64(struct api_req *req, const struct query *q, int qi, bool *has,
                   uint64_t *out)
{
    *has = (q->present & (1u << qi)) != 0;
    if (!*has)
        return 0;
    if (parse_u64((const char *)q->val[qi], q->len[qi], out) != 0) {
        api__bad(req, "%s must be a non-negative decimal integer", qnames[qi]);
        return TK_EINVAL;
    }
    return 0;
}

/* ---- answers ------------------------------------------------------------ */

void api__bad(struct api_req *req, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    http_respond_error(req->http, 400, "bad_request", NULL, "%s", msg);
}

void api__retry_after(const struct gateway *gw, char *out, size_t cap)
{
    snprintf(out, cap, "Retry-After: %u\r\n", gw->cfg.retry_after_s);
}

/* No leader, and why: this node is no member (refused or removed: no
 * election will change that, so no Retry-After), or an election. */
static void respond_no_leader(struct api_req *req, const char *retry)
{
    struct node_status st;
    node_status(req->gw->node, &st);
    if (st.rejected)
        http_respond_error(
            req->http, 503, "not_a_member", NULL,
            "the cluster refused node %llu and it serves nothing. Either "
            "its id belongs to another data directory (this one is new or "
            "was wiped): remove id %llu (tierkv member remove %llu) and add "
            "this node again under a new id with an empty data directory "
            "(docs/operations.md, \"Replace a failed node\"); or the "
            "cluster was recovered with --force-new-cluster without it: "
            "its data is stale, so empty its data directory and add it "
            "under a new id (the members' logs name the reason)",
            (unsigned long long)st.id, (unsigned long long)st.id,
            (unsigned long long)st.id);
    else if (st.removed)
        http_respond_error(req->http, 503, "removed", NULL,
                           "node %llu was removed from the cluster and serves nothing; "
                           "ids are never reused: to serve again, start it with an empty "
                           "data directory and add it under a new id",
                           (unsigned long long)st.id);
    else
        http_respond_error(req->http, 503, "no_leader", retry,
                           "no leader is known (an election is in progress)");
}

void api__respond_rc(struct api_req *req, int rc)
{
    struct gateway *gw = req->gw;
    char retry[64];
    api__retry_after(gw, retry, sizeof(retry));
    switch (rc) {
    case TK_ENOTLEADER:
        http_respond_error(req->http, 503, "not_leader", retry,
                           "this node is not the leader; send writes to the node in "
                           "X-Tierkv-Leader");
        break;
    case TK_ENOLEADER:
        respond_no_leader(req, retry);
        break;
    case TK_EBUSY:
        http_respond_error(req->http, 503, "busy", retry,
                           "the node's request queue is full");
        break;
    case TK_ELOST:
        http_respond_error(req->http, 503, "lost", retry,
                           "leadership changed before the write committed; it was not "
                           "applied, retry it");
        break;
    case TK_ESHUTDOWN:
        /* A write the node had taken may have been applied: its outcome is
         * unknown, which 503 must never mean (503 = not applied). */
        if (req->is_write)
            http_respond_error(req->http, 500, "shutting_down", NULL,
                               "the node shut down with this write in flight; it may or "
                               "may not have been applied (retry it with the same "
                               "Idempotency-Key)");
        else
            http_respond_error(req->http, 503, "shutting_down", retry,
                               "the node is shutting down");
        break;
    case TK_EIO:
        /* 500, not 503: a write in flight may have been committed by the other
         * nodes even though this one's storage failed. */
        http_respond_error(req->http, 500, "storage_failed", NULL,
                           "this node's storage failed and it stopped serving; use "
                           "another node (a write in flight may have been applied)");
        break;
    case TK_ETIMEDOUT:
        http_respond_error(req->http, 504, "timeout", "",
                           "the request timed out; a write may or may not have been "
                           "applied (retry it with the same Idempotency-Key)");
        break;
    case TK_ECOMPARE:
        http_respond_error(req->http, 409, "compare_failed", NULL,
                           "the condition did not hold");
        break;
    case TK_ETOOBIG:
        http_respond_error(req->http, 413, "too_large", NULL,
                           "a key, value or batch is too large (a write's command "
                           "is at most %u bytes, the largest raft entry)",
                           NODE_ENTRY_MAX);
        break;
    case TK_EINVAL:
        http_respond_error(req->http, 400, "invalid", NULL,
                           "the command was rejected as invalid");
        break;
    case TK_ENOTFOUND:
        http_respond_error(req->http, 404, "not_found", NULL, "key not found");
        break;
    case TK_ERANGE:
        http_respond_error(req->http, 409, "not_a_number", NULL,
                           "the stored value is not a decimal int64, or the increment "
                           "overflows");
        break;
    default:
        http_respond_error(req->http, 500, "internal", NULL, "%s", tk_strerror(rc));
        break;
    }
}

void api__respond_json(struct api_req *req, struct jbuf *b, uint64_t revision)
{
    static const char name[] = "X-Tierkv-Revision: ";
    char extra[sizeof(name) + JSON_U64_MAX + 2] = "";
    if (revision) {
        size_t n = sizeof(name) - 1;
        memcpy(extra, name, n);
        n += json_u64(extra + n, revision);
        memcpy(extra + n, "\r\n", 3); /* with the NUL */
    }
    jbuf_adds(b, "\n");
    http_respond(req->http, 200, NULL, extra, b->p, b->len);
}

/* ---- submitting -------------------------------------------------------- */

void api__submit_nreq(struct api_req *req)
{
    /* On the client loop: its callback comes back here, a write's result
     * copied into req->res. */
    req->nreq.on_client = req->gw->own_loop;
    req->nreq.res_out = &req->res;
    int rc = node_submit(req->gw->node, &req->nreq);
    if (rc != 0) {
        tk_blob_unref(req->nreq.cmd);
        req->nreq.cmd = NULL;
        api__respond_rc(req, rc);
        return;
    }
    req->submitted = true;
}

void api__stale_read_fill(struct api_req *req, node_read_cb *cb)
{
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.is_read = 1;
    req->nreq.consistency = NODE_READ_STALE;
    req->nreq.read_cb = cb;
    req->nreq.data = req;
    req->nreq.timeout_ms = req->gw->cfg.request_timeout_ms;
}

/* http_dispatch's go-ahead: hand req->nreq to the node; answer on failure.
 * A large write holds the connection's later requests until its answer: the
 * leader may propose smaller writes submitted after it first (node_gate.c),
 * and a client's pipelined writes keep their order. */
static void submit_now(struct http_request *hreq)
{
    struct api_req *req = hreq->data;
    if (!req->nreq.is_read && req->nreq.cmd != NULL &&
        req->nreq.cmd->len >= NODE_GATE_ENTRY_BYTES)
        http_hold(hreq);
    api__submit_nreq(req);
}

static bool admit_fits(const struct gateway *gw, uint64_t len)
{
    return gw->admit_inflight == 0 || gw->admit_inflight + len <= API_ADMIT_BYTES;
}

/* A write's bytes in flight, never 0 (0 marks a request not counted). */
static uint64_t admit_len(const struct api_req *req)
{
    return req->nreq.cmd->len + 1;
}

static bool admit_wait(struct api_req *req)
{
    struct gateway *gw = req->gw;
    if (gw->admit_head == NULL && admit_fits(gw, admit_len(req))) {
        req->admit_bytes = admit_len(req);
        gw->admit_inflight += req->admit_bytes;
        return false;
    }
    if (!req->http->held)
        http_hold(req->http);
    req->admit_next = NULL;
    if (gw->admit_tail != NULL)
        gw->admit_tail->admit_next = req;
    else
        gw->admit_head = req;
    gw->admit_tail = req;
    gw->admit_waiting++;
    gw->admit_waited++;
    return true;
}

/* Submits the waiting writes that now fit, in order. Not reentrant: a write
 * that ends at once (the node refuses it) is released inside http_dispatch
 * and finds this loop already running. */
static void admit_next(struct gateway *gw)
{
    if (gw->admitting)
        return;
    gw->admitting = true;
    struct api_req *req;
    while ((req = gw->admit_head) != NULL && admit_fits(gw, admit_len(req))) {
        gw->admit_head = req->admit_next;
        if (gw->admit_head == NULL)
            gw->admit_tail = NULL;
        gw->admit_waiting--;
        req->admit_bytes = admit_len(req);
        gw->admit_inflight += req->admit_bytes;
        http_dispatch(req->http, true, submit_now);
    }
    gw->admitting = false;
}

void api__admit_release(struct api_req *req)
{
    struct gateway *gw = req->gw;
    if (req->admit_bytes == 0)
        return;
    TK_ASSERT(gw->admit_inflight >= req->admit_bytes);
    gw->admit_inflight -= req->admit_bytes;
    req->admit_bytes = 0;
    if (!gw->stopping)
        admit_next(gw);
}

void api__not_applied(struct api_req *req, const char *why)
{
    char retry[64];
    snprintf(retry, sizeof(retry), "Retry-After: %u\r\n", req->gw->cfg.retry_after_s);
    http_respond_error(req->http, 503, "shutting_down", retry,
                       "%s; the write was not applied, retry it", why);
}

void api__admit_stop(struct gateway *gw)
{
    struct api_req *req;
    while ((req = gw->admit_head) != NULL) {
        gw->admit_head = req->admit_next;
        gw->admit_waiting--;
        tk_blob_unref(req->nreq.cmd);
        req->nreq.cmd = NULL;
        api__not_applied(req, "the node is shutting down");
    }
    gw->admit_tail = NULL;
}

void api__submit_write(struct api_req *req, struct tk_blob *cmd, int mode,
                       node_write_cb *cb)
{
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.mode = (uint8_t)mode;
    req->nreq.cmd = cmd;
    req->nreq.write_cb = cb;
    req->nreq.data = req;
    req->nreq.timeout_ms = req->gw->cfg.request_timeout_ms;
    if (cmd->len >= API_OFFLOAD_BYTES && admit_wait(req))
        return; /* held until the large writes in flight allow it */
    http_dispatch(req->http, true, submit_now);
}

void api__submit_read(struct api_req *req, int consistency, node_read_cb *collect,
                      node_read_cb *cb)
{
    if (api__auth_read(req) != 0)
        return;
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.is_read = 1;
    req->nreq.consistency = (uint8_t)consistency;
    req->nreq.collect_cb = req->gw->own_loop ? collect : NULL;
    req->nreq.read_cb = cb;
    req->nreq.data = req;
    req->nreq.timeout_ms = req->gw->cfg.request_timeout_ms;
    http_dispatch(req->http, false, submit_now);
}

size_t api__node_members(struct gateway *gw, struct node_member *out, size_t cap,
                         uint64_t *config_index, bool *committed)
{
    *config_index = 0;
    *committed = false;
    if (!api__state_enter(gw))
        return 0;
    size_t k = node_members(gw->node, out, cap, config_index, committed);
    api__state_leave(gw, false);
    return k;
}
