/* The v1 routes: each HTTP request becomes one node request.
 *
 * Writes encode a kvpb.Command (proto/kv.proto) and submit it; the write
 * callback turns the state machine's result into JSON. Reads submit a read
 * request; its callback runs when the node's state is fresh enough and reads
 * the state machine directly (kv_sm_get / kv_sm_scan) to build the answer.
 * Everything runs on the node's loop thread, so a callback finds its request
 * (and connection) alive: http.c keeps both until http_respond.
 *
 * Bytes: keys are URL-decoded path bytes; query values are URL-decoded too.
 * JSON strings are UTF-8; a stored key or value that is not valid UTF-8 is
 * returned base64-encoded with "key_encoding"/"encoding": "base64" beside it
 * (never as broken JSON). ?encoding=base64 makes every key and value in JSON
 * bodies (requests and responses) base64.
 *
 * Idempotency-Key: its 64-bit FNV-1a hash (never 0) becomes the command's
 * client_id with seq 1; the state machine answers a repeat with the first
 * result (marked "replayed": true) without applying it again. */
#include <http_parser.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

/* ---- query strings ----------------------------------------------------- */

enum qparam {
    Q_MODE = 1 << 0,
    Q_CONSISTENCY = 1 << 1,
    Q_ENCODING = 1 << 2,
    Q_RAW = 1 << 3,
    Q_PREFIX = 1 << 4,
    Q_START = 1 << 5,
    Q_END = 1 << 6,
    Q_LIMIT = 1 << 7,
    Q_TTL = 1 << 8,
    Q_IF_VERSION = 1 << 9,
    Q_IF_MOD = 1 << 10,
    Q_DELTA = 1 << 11,
    Q_IF_ABSENT = 1 << 12,
};

static const struct {
    const char *name;
    unsigned bit;
} qnames[] = {
    {"mode", Q_MODE},
    {"consistency", Q_CONSISTENCY},
    {"encoding", Q_ENCODING},
    {"raw", Q_RAW},
    {"prefix", Q_PREFIX},
    {"start", Q_START},
    {"end", Q_END},
    {"limit", Q_LIMIT},
    {"ttl_ms", Q_TTL},
    {"if_version", Q_IF_VERSION},
    {"if_mod_revision", Q_IF_MOD},
    {"delta", Q_DELTA},
    {"if_absent", Q_IF_ABSENT},
};
#define NQ (sizeof(qnames) / sizeof(qnames[0]))

struct query {
    unsigned present;
    uint8_t *val[NQ];
    size_t len[NQ];
};

static void query_free(struct query *q)
{
    for (size_t i = 0; i < NQ; i++)
        tk_free(q->val[i]);
}

static int qindex(unsigned bit)
{
    for (size_t i = 0; i < NQ; i++)
        if (qnames[i].bit == bit)
            return (int)i;
    return 0;
}

/* Parses `s` (without '?'); only params in `allowed`. On error fills msg. */
static int query_parse(const char *s, size_t len, unsigned allowed, struct query *q,
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
            for (size_t k = 0; k < NQ; k++)
                if (strlen(qnames[k].name) == nlen &&
                    memcmp(qnames[k].name, s + i, nlen) == 0)
                    found = (int)k;
            if (found < 0 || !(allowed & qnames[found].bit)) {
                snprintf(msg, msg_cap, "unknown query parameter \"%.*s\" for this route",
                         (int)(nlen > 64 ? 64 : nlen), s + i);
                return TK_EINVAL;
            }
            if (q->present & qnames[found].bit) {
                snprintf(msg, msg_cap, "query parameter \"%s\" given twice",
                         qnames[found].name);
                return TK_EINVAL;
            }
            const char *v = eq ? eq + 1 : s + j;
            size_t vlen = (size_t)(s + j - v);
            q->val[found] = tk_malloc(vlen + 1);
            if (pct_decode(v, vlen, q->val[found], &q->len[found], true) != 0) {
                snprintf(msg, msg_cap, "bad percent-escape in query parameter \"%s\"",
                         qnames[found].name);
                return TK_EINVAL;
            }
            q->val[found][q->len[found]] = 0;
            q->present |= qnames[found].bit;
        }
        i = j + 1;
    }
    return 0;
}

static const char *qstr(const struct query *q, unsigned bit)
{
    return (const char *)q->val[qindex(bit)];
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

static int parse_i64(const char *s, size_t len, int64_t *out)
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

/* ---- errors and statuses ----------------------------------------------- */

static bool is_write(const struct http_req *req)
{
    switch (req->route) {
    case ROUTE_KV_PUT:
    case ROUTE_KV_DELETE:
    case ROUTE_KV_DELETE_RANGE:
    case ROUTE_KV_INCR:
    case ROUTE_BATCH:
    case ROUTE_TXN:
        return true;
    default:
        return false;
    }
}

static void respond_rc(struct http_req *req, int rc)
{
    struct gateway *gw = req->gw;
    char retry[64];
    snprintf(retry, sizeof(retry), "Retry-After: %u\r\n", gw->cfg.retry_after_s);
    switch (rc) {
    case TK_ENOTLEADER:
        http_respond_error(req, 503, "not_leader", retry,
                           "this node is not the leader; send writes to the node in "
                           "X-Tierkv-Leader");
        break;
    case TK_ENOLEADER:
        http_respond_error(req, 503, "no_leader", retry,
                           "no leader is known (an election is in progress)");
        break;
    case TK_EBUSY:
        http_respond_error(req, 503, "busy", retry, "the node's request queue is full");
        break;
    case TK_ELOST:
        http_respond_error(req, 503, "lost", retry,
                           "leadership changed before the write committed; it was not "
                           "applied, retry it");
        break;
    case TK_ESHUTDOWN:
        /* A write the node had taken may have been applied: its outcome is
         * unknown, which 503 must never mean (503 = not applied). */
        if (is_write(req))
            http_respond_error(req, 500, "shutting_down", NULL,
                               "the node shut down with this write in flight; it may or "
                               "may not have been applied (retry it with the same "
                               "Idempotency-Key)");
        else
            http_respond_error(req, 503, "shutting_down", retry,
                               "the node is shutting down");
        break;
    case TK_EIO:
        /* 500, not 503: a write in flight may have been committed by the other
         * nodes even though this one's storage failed. */
        http_respond_error(req, 500, "storage_failed", NULL,
                           "this node's storage failed and it stopped serving; use "
                           "another node (a write in flight may have been applied)");
        break;
    case TK_ETIMEDOUT:
        http_respond_error(req, 504, "timeout", "",
                           "the request timed out; a write may or may not have been "
                           "applied (retry it with the same Idempotency-Key)");
        break;
    case TK_ECOMPARE:
        http_respond_error(req, 409, "compare_failed", NULL,
                           "the condition did not hold");
        break;
    case TK_ETOOBIG:
        http_respond_error(req, 413, "too_large", NULL,
                           "a key, value or batch is too large");
        break;
    case TK_EINVAL:
        http_respond_error(req, 400, "invalid", NULL,
                           "the command was rejected as invalid");
        break;
    case TK_ENOTFOUND:
        http_respond_error(req, 404, "not_found", NULL, "key not found");
        break;
    case TK_ERANGE:
        http_respond_error(req, 409, "not_a_number", NULL,
                           "the stored value is not a decimal int64, or the increment "
                           "overflows");
        break;
    default:
        http_respond_error(req, 500, "internal", NULL, "%s", tk_strerror(rc));
        break;
    }
}

#define BAD(req, ...) http_respond_error((req), 400, "bad_request", NULL, __VA_ARGS__)

static void allow_405(struct http_req *req, const char *allow)
{
    char extra[96];
    snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
    http_respond_error(req, 405, "method_not_allowed", extra,
                       "method not allowed here; allowed: %s", allow);
}

/* ---- JSON output helpers ------------------------------------------------ */

/* "name":"bytes" (UTF-8) or base64 with "<enc_name>":"base64". */
static void put_bytes(struct jbuf *b, const char *name, const char *enc_name,
                      const uint8_t *p, size_t len, bool b64)
{
    jbuf_printf(b, "\"%s\":", name);
    if (!b64 && json_utf8_valid(p, len)) {
        jbuf_jstr(b, p, len);
    } else {
        jbuf_jb64(b, p, len);
        jbuf_printf(b, ",\"%s\":\"base64\"", enc_name);
    }
}

static void put_item(struct jbuf *b, const struct kv_item *it, bool b64)
{
    jbuf_adds(b, "{");
    put_bytes(b, "key", "key_encoding", it->key, it->key_len, b64);
    jbuf_adds(b, ",");
    put_bytes(b, "value", "encoding", it->value, it->value_len, b64);
    jbuf_printf(b, ",\"version\":%llu,\"create_revision\":%llu,\"mod_revision\":%llu",
                (unsigned long long)it->version, (unsigned long long)it->create_revision,
                (unsigned long long)it->mod_revision);
    if (it->expire_ms)
        jbuf_printf(b, ",\"expire_ms\":%llu", (unsigned long long)it->expire_ms);
    jbuf_adds(b, "}");
}

static void respond_json(struct http_req *req, struct jbuf *b, uint64_t revision)
{
    char extra[64] = "";
    if (revision)
        snprintf(extra, sizeof(extra), "X-Tierkv-Revision: %llu\r\n",
                 (unsigned long long)revision);
    jbuf_adds(b, "\n");
    http_respond(req, 200, NULL, extra, b->p, b->len);
}

/* ---- writes ------------------------------------------------------------ */

enum op_kind { OPK_PUT, OPK_DEL, OPK_INCR };

static void put_op_results(struct jbuf *b, const struct kv_result *res,
                           const uint8_t *kinds, uint32_t n)
{
    jbuf_adds(b, ",\"results\":[");
    for (uint32_t i = 0; i < n; i++) {
        const struct kv_op_result *o = i < res->n_ops ? &res->ops[i] : NULL;
        if (i)
            jbuf_adds(b, ",");
        switch (kinds[i]) {
        case OPK_DEL:
            jbuf_printf(b, "{\"op\":\"delete\",\"deleted\":%llu}",
                        (unsigned long long)(o ? o->deleted : 0));
            break;
        case OPK_INCR:
            jbuf_printf(b, "{\"op\":\"incr\",\"value\":%lld}",
                        (long long)(o ? o->value : 0));
            break;
        default:
            jbuf_adds(b, "{\"op\":\"put\"}");
            break;
        }
    }
    jbuf_adds(b, "]");
}

static void on_write_done(struct node_req *nreq, int status, const struct kv_result *res,
                          void *data)
{
    struct http_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        respond_rc(req, status);
        return;
    }
    if (req->nreq.mode == NODE_MODE_COMMITTED) {
        struct jbuf b;
        jbuf_init(&b, 64);
        jbuf_printf(&b, "{\"revision\":%llu,\"mode\":\"committed\"}",
                    (unsigned long long)res->revision);
        respond_json(req, &b, res->revision);
        jbuf_free(&b);
        return;
    }
    if (res->code != 0 && !(req->route == ROUTE_TXN && res->code == TK_ECOMPARE)) {
        respond_rc(req, res->code);
        return;
    }
    struct jbuf b;
    jbuf_init(&b, 128);
    jbuf_printf(&b, "{\"revision\":%llu", (unsigned long long)res->revision);
    switch (req->route) {
    case ROUTE_KV_DELETE:
    case ROUTE_KV_DELETE_RANGE:
        jbuf_printf(&b, ",\"deleted\":%llu", (unsigned long long)res->deleted);
        break;
    case ROUTE_KV_INCR:
        jbuf_printf(&b, ",\"value\":%lld", (long long)res->value);
        break;
    case ROUTE_BATCH:
        put_op_results(&b, res, req->op_kinds, req->n_ops);
        break;
    case ROUTE_TXN:
        jbuf_printf(&b, ",\"succeeded\":%s", res->succeeded ? "true" : "false");
        if (res->succeeded)
            put_op_results(&b, res, req->op_kinds, req->n_then);
        else
            put_op_results(&b, res, req->op_kinds + req->n_then,
                           req->n_ops - req->n_then);
        break;
    default:
        break;
    }
    if (res->duplicate)
        jbuf_adds(&b, ",\"replayed\":true");
    jbuf_adds(&b, "}");
    respond_json(req, &b, res->revision);
    jbuf_free(&b);
}

static void submit_write(struct http_req *req, Kvpb__Command *cmd, int mode)
{
    struct gateway *gw = req->gw;
    if (req->has_idem) {
        cmd->client_id = req->idem_hash;
        cmd->seq = 1;
    }
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(cmd, blob->data);
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.mode = (uint8_t)mode;
    req->nreq.cmd = blob;
    req->nreq.write_cb = on_write_done;
    req->nreq.data = req;
    req->nreq.timeout_ms = gw->cfg.request_timeout_ms;
    req->is_write = true;
    http_dispatch(req);
}

void api_submit(struct http_req *req)
{
    int rc = node_submit(req->gw->node, &req->nreq);
    if (rc != 0) {
        tk_blob_unref(req->nreq.cmd);
        req->nreq.cmd = NULL;
        respond_rc(req, rc);
        return;
    }
    req->submitted = true;
}

static void submit_read(struct http_req *req, int consistency, node_read_cb *cb)
{
    struct gateway *gw = req->gw;
    memset(&req->nreq, 0, sizeof(req->nreq));
    req->nreq.is_read = 1;
    req->nreq.consistency = (uint8_t)consistency;
    req->nreq.read_cb = cb;
    req->nreq.data = req;
    req->nreq.timeout_ms = gw->cfg.request_timeout_ms;
    http_dispatch(req);
}

/* ---- JSON request bodies ----------------------------------------------- */

/* Temporary allocations of one request's command, freed after packing. */
struct scratch {
    void *p[8];
    size_t n;
    void **more;
    size_t n_more, cap_more;
};

static void *scratch_alloc(struct scratch *s, size_t size)
{
    void *p = tk_calloc(1, size ? size : 1);
    if (s->n < 8) {
        s->p[s->n++] = p;
        return p;
    }
    if (s->n_more == s->cap_more) {
        s->cap_more = s->cap_more ? s->cap_more * 2 : 32;
        s->more = tk_realloc(s->more, s->cap_more * sizeof(void *));
    }
    s->more[s->n_more++] = p;
    return p;
}

static void scratch_free(struct scratch *s)
{
    for (size_t i = 0; i < s->n; i++)
        tk_free(s->p[i]);
    for (size_t i = 0; i < s->n_more; i++)
        tk_free(s->more[i]);
    tk_free(s->more);
}

struct bctx {
    struct http_req *req;
    struct scratch sc;
    char err[256];
    int status; /* 400 or 413 on error */
};

static int bfail(struct bctx *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bfail(struct bctx *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    c->status = status;
    return TK_EINVAL;
}

static json_t *parse_body(struct http_req *req, struct bctx *c)
{
    json_error_t e;
    json_t *j = json_loadb((const char *)req->body, req->body_len,
                           JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    if (j == NULL) {
        bfail(c, 400, "invalid JSON at line %d column %d: %s", e.line, e.column, e.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        bfail(c, 400, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Only the listed members may appear in `o`. */
static int check_members(struct bctx *c, json_t *o, const char *what,
                         const char *const *names)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool ok = false;
        for (size_t i = 0; names[i]; i++)
            if (strcmp(names[i], k) == 0)
                ok = true;
        if (!ok)
            return bfail(c, 400, "unknown field \"%.64s\" in %s", k, what);
    }
    return 0;
}

static int get_string_bytes(struct bctx *c, json_t *s, const char *what, size_t max,
                            ProtobufCBinaryData *out)
{
    if (!json_is_string(s))
        return bfail(c, 400, "%s must be a string", what);
    const char *p = json_string_value(s);
    size_t len = json_string_length(s);
    if (c->req->b64) {
        uint8_t *d = scratch_alloc(&c->sc, base64_decoded_max(len));
        size_t dlen;
        if (base64_decode(p, len, d, &dlen) != 0)
            return bfail(c, 400, "%s is not valid base64 (encoding=base64)", what);
        out->data = d;
        out->len = dlen;
    } else {
        out->data = (uint8_t *)(uintptr_t)p;
        out->len = len;
    }
    if (out->len > max)
        return bfail(c, 413, "%s of %zu bytes exceeds the limit of %zu", what, out->len,
                     max);
    return 0;
}

static int get_key(struct bctx *c, json_t *o, ProtobufCBinaryData *out)
{
    json_t *k = json_object_get(o, "key");
    if (k == NULL)
        return bfail(c, 400, "missing \"key\"");
    int rc = get_string_bytes(c, k, "key", c->req->gw->cfg.key_max, out);
    if (rc == 0 && out->len == 0)
        return bfail(c, 400, "empty key");
    return rc;
}

static int get_u64(struct bctx *c, json_t *o, const char *name, bool *present,
                   uint64_t *out)
{
    json_t *v = json_object_get(o, name);
    *present = v != NULL;
    if (v == NULL)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return bfail(c, 400, "\"%s\" must be a non-negative integer", name);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int get_i64(struct bctx *c, json_t *o, const char *name, bool *present,
                   int64_t *out)
{
    json_t *v = json_object_get(o, name);
    *present = v != NULL;
    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return bfail(c, 400, "\"%s\" must be an integer", name);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

/* One op of a batch or txn. */
static int build_op(struct bctx *c, json_t *o, size_t idx, bool allow_incr, Kvpb__Op *op,
                    uint8_t *kind)
{
    static const char *const names[] = {"op", "key", "value", "ttl_ms", "delta", NULL};
    char what[64];
    if (!json_is_object(o))
        return bfail(c, 400, "op %zu must be an object", idx);
    if (check_members(c, o, "an op", names) != 0)
        return TK_EINVAL;
    const char *type = json_string_value(json_object_get(o, "op"));
    if (type == NULL)
        return bfail(c, 400, "op %zu needs \"op\": \"put\", \"delete\" or \"incr\"", idx);
    kvpb__op__init(op);
    ProtobufCBinaryData key;
    if (get_key(c, o, &key) != 0)
        return TK_EINVAL;
    bool has;
    if (strcmp(type, "put") == 0) {
        Kvpb__Put *p = scratch_alloc(&c->sc, sizeof(*p));
        kvpb__put__init(p);
        p->key = key;
        snprintf(what, sizeof(what), "op %zu value", idx);
        json_t *v = json_object_get(o, "value");
        if (v == NULL)
            return bfail(c, 400, "op %zu (put) needs \"value\"", idx);
        if (get_string_bytes(c, v, what, c->req->gw->cfg.value_max, &p->value) != 0 ||
            get_u64(c, o, "ttl_ms", &has, &p->ttl_ms) != 0)
            return TK_EINVAL;
        if (json_object_get(o, "delta"))
            return bfail(c, 400, "op %zu: \"delta\" is for incr", idx);
        op->op_case = KVPB__OP__OP_PUT;
        op->put = p;
        *kind = OPK_PUT;
    } else if (strcmp(type, "delete") == 0) {
        if (json_object_size(o) != 2)
            return bfail(c, 400, "op %zu (delete) takes only \"key\"", idx);
        Kvpb__Delete *d = scratch_alloc(&c->sc, sizeof(*d));
        kvpb__delete__init(d);
        d->key = key;
        op->op_case = KVPB__OP__OP_DEL;
        op->del = d;
        *kind = OPK_DEL;
    } else if (strcmp(type, "incr") == 0) {
        if (!allow_incr)
            return bfail(c, 400,
                         "op %zu: a batch holds puts and deletes only (use /v1/txn "
                         "for incr)",
                         idx);
        Kvpb__Increment *in = scratch_alloc(&c->sc, sizeof(*in));
        kvpb__increment__init(in);
        in->key = key;
        in->delta = 1;
        if (get_i64(c, o, "delta", &has, &in->delta) != 0)
            return TK_EINVAL;
        if (json_object_get(o, "value") || json_object_get(o, "ttl_ms"))
            return bfail(c, 400, "op %zu (incr) takes only \"key\" and \"delta\"", idx);
        op->op_case = KVPB__OP__OP_INCR;
        op->incr = in;
        *kind = OPK_INCR;
    } else {
        return bfail(c, 400, "op %zu: unknown op \"%.32s\" (put, delete, incr)", idx,
                     type);
    }
    return 0;
}

static int build_ops(struct bctx *c, json_t *arr, const char *what, bool allow_incr,
                     size_t *n_out, Kvpb__Op ***out, uint8_t *kinds)
{
    if (arr == NULL) {
        *n_out = 0;
        *out = NULL;
        return 0;
    }
    if (!json_is_array(arr))
        return bfail(c, 400, "\"%s\" must be an array of ops", what);
    size_t n = json_array_size(arr);
    Kvpb__Op *ops = scratch_alloc(&c->sc, n * sizeof(*ops));
    Kvpb__Op **pp = scratch_alloc(&c->sc, n * sizeof(*pp));
    for (size_t i = 0; i < n; i++) {
        if (build_op(c, json_array_get(arr, i), i, allow_incr, &ops[i], &kinds[i]) != 0)
            return TK_EINVAL;
        pp[i] = &ops[i];
    }
    *n_out = n;
    *out = pp;
    return 0;
}

static int build_compare(struct bctx *c, json_t *o, size_t idx, Kvpb__Compare *cmp)
{
    static const char *const names[] = {"key", "target", "op", "value", NULL};
    static const struct {
        const char *name;
        Kvpb__Compare__Target t;
    } targets[] = {
        {"version", KVPB__COMPARE__TARGET__VERSION},
        {"mod_revision", KVPB__COMPARE__TARGET__MOD_REVISION},
        {"create_revision", KVPB__COMPARE__TARGET__CREATE_REVISION},
        {"value", KVPB__COMPARE__TARGET__VALUE},
        {"absent", KVPB__COMPARE__TARGET__ABSENT},
        {"exists", KVPB__COMPARE__TARGET__EXISTS},
    };
    static const struct {
        const char *name;
        Kvpb__Compare__Op op;
    } ops[] = {
        {"==", KVPB__COMPARE__OP__EQUAL},
        {"!=", KVPB__COMPARE__OP__NOT_EQUAL},
        {"<", KVPB__COMPARE__OP__LESS},
        {">", KVPB__COMPARE__OP__GREATER},
    };
    if (!json_is_object(o))
        return bfail(c, 400, "compare %zu must be an object", idx);
    if (check_members(c, o, "a compare", names) != 0)
        return TK_EINVAL;
    kvpb__compare__init(cmp);
    if (get_key(c, o, &cmp->key) != 0)
        return TK_EINVAL;
    const char *t = json_string_value(json_object_get(o, "target"));
    int ti = -1;
    for (size_t i = 0; t && i < sizeof(targets) / sizeof(targets[0]); i++)
        if (strcmp(targets[i].name, t) == 0)
            ti = (int)i;
    if (ti < 0)
        return bfail(c, 400,
                     "compare %zu: \"target\" must be version, mod_revision, "
                     "create_revision, value, absent or exists",
                     idx);
    cmp->target = targets[ti].t;
    const char *op = json_string_value(json_object_get(o, "op"));
    if (json_object_get(o, "op") != NULL) {
        int oi = -1;
        for (size_t i = 0; op && i < sizeof(ops) / sizeof(ops[0]); i++)
            if (strcmp(ops[i].name, op) == 0)
                oi = (int)i;
        if (oi < 0)
            return bfail(c, 400, "compare %zu: \"op\" must be ==, !=, < or >", idx);
        cmp->op = ops[oi].op;
    }
    json_t *v = json_object_get(o, "value");
    switch (cmp->target) {
    case KVPB__COMPARE__TARGET__VALUE:
        if (v == NULL)
            return bfail(c, 400, "compare %zu: target value needs \"value\"", idx);
        return get_string_bytes(c, v, "compare value", c->req->gw->cfg.value_max,
                                &cmp->value);
    case KVPB__COMPARE__TARGET__ABSENT:
    case KVPB__COMPARE__TARGET__EXISTS:
        if (v != NULL)
            return bfail(c, 400, "compare %zu: target %s takes no \"value\"", idx, t);
        return 0;
    default:
        if (v == NULL || !json_is_integer(v))
            return bfail(c, 400, "compare %zu: \"value\" must be an integer", idx);
        cmp->number = (int64_t)json_integer_value(v);
        return 0;
    }
}

/* ---- handlers ---------------------------------------------------------- */

static int parse_mode(struct http_req *req, const struct query *q, int *mode)
{
    *mode = NODE_MODE_APPLIED;
    if (!(q->present & Q_MODE))
        return 0;
    const char *m = qstr(q, Q_MODE);
    if (strcmp(m, "applied") == 0)
        return 0;
    if (strcmp(m, "committed") == 0) {
        *mode = NODE_MODE_COMMITTED;
        return 0;
    }
    BAD(req, "mode must be \"applied\" or \"committed\"");
    return TK_EINVAL;
}

static int parse_consistency(struct http_req *req, const struct query *q, int *c)
{
    *c = NODE_READ_LINEARIZABLE;
    if (!(q->present & Q_CONSISTENCY))
        return 0;
    const char *m = qstr(q, Q_CONSISTENCY);
    if (strcmp(m, "linearizable") == 0)
        return 0;
    if (strcmp(m, "stale") == 0) {
        *c = NODE_READ_STALE;
        return 0;
    }
    BAD(req, "consistency must be \"linearizable\" or \"stale\"");
    return TK_EINVAL;
}

static int parse_encoding(struct http_req *req, const struct query *q)
{
    req->b64 = false;
    if (!(q->present & Q_ENCODING))
        return 0;
    const char *e = qstr(q, Q_ENCODING);
    if (strcmp(e, "base64") == 0) {
        req->b64 = true;
        return 0;
    }
    if (strcmp(e, "utf8") == 0 || strcmp(e, "utf-8") == 0)
        return 0;
    BAD(req, "encoding must be \"utf8\" or \"base64\"");
    return TK_EINVAL;
}

static int parse_flag(struct http_req *req, const struct query *q, unsigned bit,
                      const char *name, bool *out)
{
    *out = false;
    if (!(q->present & bit))
        return 0;
    const char *v = qstr(q, bit);
    if (v[0] == 0 || strcmp(v, "1") == 0 || strcmp(v, "true") == 0) {
        *out = true;
        return 0;
    }
    if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
        return 0;
    BAD(req, "%s must be empty, true/1 or false/0", name);
    return TK_EINVAL;
}

static int q_u64(struct http_req *req, const struct query *q, unsigned bit, bool *has,
                 uint64_t *out)
{
    *has = (q->present & bit) != 0;
    if (!*has)
        return 0;
    int i = qindex(bit);
    if (parse_u64((const char *)q->val[i], q->len[i], out) != 0) {
        BAD(req, "%s must be a non-negative decimal integer", qnames[i].name);
        return TK_EINVAL;
    }
    return 0;
}

static void get_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    struct http_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        respond_rc(req, status);
        return;
    }
    struct kv_item it;
    int rc = kv_sm_get(sm, req->key, req->key_len, &it);
    if (rc != 0) {
        respond_rc(req, rc);
        return;
    }
    uint64_t rev = kv_sm_applied_index(sm);
    if (req->raw) {
        char extra[256];
        snprintf(extra, sizeof(extra),
                 "X-Tierkv-Revision: %llu\r\nX-Tierkv-Version: %llu\r\n"
                 "X-Tierkv-Create-Revision: %llu\r\nX-Tierkv-Mod-Revision: %llu\r\n",
                 (unsigned long long)rev, (unsigned long long)it.version,
                 (unsigned long long)it.create_revision,
                 (unsigned long long)it.mod_revision);
        http_respond(req, 200, "application/octet-stream", extra, it.value, it.value_len);
        return;
    }
    struct jbuf b;
    jbuf_init(&b, 128 + it.key_len + it.value_len * 2);
    put_item(&b, &it, req->b64);
    respond_json(req, &b, rev);
    jbuf_free(&b);
}

struct scan_state {
    struct jbuf b;
    uint32_t count;
    uint32_t limit;
    bool more;
    bool b64;
    size_t bytes_max;
};

static int scan_item(const struct kv_item *it, void *data)
{
    struct scan_state *s = data;
    if (s->count == s->limit || s->b.len > s->bytes_max) {
        s->more = true;
        return 1;
    }
    if (s->count)
        jbuf_adds(&s->b, ",");
    put_item(&s->b, it, s->b64);
    s->count++;
    return 0;
}

static void scan_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    struct http_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        respond_rc(req, status);
        return;
    }
    struct scan_state s = {
        .limit = req->limit, .b64 = req->b64, .bytes_max = req->gw->cfg.body_max * 4};
    jbuf_init(&s.b, 256);
    jbuf_adds(&s.b, "{\"items\":[");
    struct kv_range r = {.start = req->key,
                         .start_len = req->key_len,
                         .end = req->key2,
                         .end_len = req->key2_len,
                         .by_prefix = req->by_prefix};
    int rc = kv_sm_scan(sm, &r, (size_t)req->limit + 1, scan_item, &s);
    if (rc != 0) {
        jbuf_free(&s.b);
        respond_rc(req, rc);
        return;
    }
    jbuf_printf(&s.b, "],\"count\":%u,\"more\":%s}", s.count, s.more ? "true" : "false");
    respond_json(req, &s.b, kv_sm_applied_index(sm));
    jbuf_free(&s.b);
}

static void handle_get(struct http_req *req, const struct query *q)
{
    int cons;
    if (parse_consistency(req, q, &cons) != 0 || parse_encoding(req, q) != 0 ||
        parse_flag(req, q, Q_RAW, "raw", &req->raw) != 0)
        return;
    submit_read(req, cons, get_read_cb);
}

static void handle_put(struct http_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    int mode;
    if (parse_mode(req, q, &mode) != 0 || parse_encoding(req, q) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    Kvpb__Compare cond = KVPB__COMPARE__INIT;
    put.key.data = req->key;
    put.key.len = req->key_len;
    uint64_t ttl = 0, ifv = 0, ifm = 0;
    bool has_ttl, has_ifv, has_ifm, if_absent = false;
    if (q_u64(req, q, Q_TTL, &has_ttl, &ttl) != 0 ||
        q_u64(req, q, Q_IF_VERSION, &has_ifv, &ifv) != 0 ||
        q_u64(req, q, Q_IF_MOD, &has_ifm, &ifm) != 0 ||
        parse_flag(req, q, Q_IF_ABSENT, "if_absent", &if_absent) != 0)
        return;
    struct bctx c = {.req = req};
    json_t *j = NULL;
    if (req->json_body) {
        static const char *const names[] = {"value",           "ttl_ms",    "if_version",
                                            "if_mod_revision", "if_absent", NULL};
        j = parse_body(req, &c);
        if (j == NULL)
            goto fail;
        if (check_members(&c, j, "the body", names) != 0)
            goto fail;
        json_t *v = json_object_get(j, "value");
        if (v == NULL) {
            bfail(&c, 400, "missing \"value\"");
            goto fail;
        }
        bool h;
        if (get_string_bytes(&c, v, "value", gw->cfg.value_max, &put.value) != 0 ||
            get_u64(&c, j, "ttl_ms", &h, &ttl) != 0)
            goto fail;
        has_ttl |= h;
        if (get_u64(&c, j, "if_version", &h, &ifv) != 0)
            goto fail;
        has_ifv |= h;
        if (get_u64(&c, j, "if_mod_revision", &h, &ifm) != 0)
            goto fail;
        has_ifm |= h;
        json_t *ia = json_object_get(j, "if_absent");
        if (ia != NULL && !json_is_boolean(ia)) {
            bfail(&c, 400, "\"if_absent\" must be a boolean");
            goto fail;
        }
        if (ia != NULL)
            if_absent |= json_is_true(ia);
    } else {
        if (req->body_len > gw->cfg.value_max) {
            bfail(&c, 413, "value of %zu bytes exceeds the limit of %zu", req->body_len,
                  gw->cfg.value_max);
            goto fail;
        }
        put.value.data = req->body;
        put.value.len = req->body_len;
    }
    if ((int)has_ifv + (int)has_ifm + (int)if_absent > 1) {
        bfail(&c, 400, "give at most one of if_version, if_mod_revision, if_absent");
        goto fail;
    }
    put.ttl_ms = ttl;
    if (has_ifv || has_ifm || if_absent) {
        cond.target = has_ifv   ? KVPB__COMPARE__TARGET__VERSION
                      : has_ifm ? KVPB__COMPARE__TARGET__MOD_REVISION
                                : KVPB__COMPARE__TARGET__ABSENT;
        cond.op = KVPB__COMPARE__OP__EQUAL;
        cond.number = (int64_t)(has_ifv ? ifv : ifm);
        put.cond = &cond;
    }
    cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
    cmd.put = &put;
    submit_write(req, &cmd, mode);
    json_decref(j);
    scratch_free(&c.sc);
    return;
fail:
    json_decref(j);
    scratch_free(&c.sc);
    http_respond_error(req, c.status, c.status == 413 ? "too_large" : "bad_request", NULL,
                       "%s", c.err);
}

static void handle_delete(struct http_req *req, const struct query *q)
{
    int mode;
    if (parse_mode(req, q, &mode) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Delete del = KVPB__DELETE__INIT;
    del.key.data = req->key;
    del.key.len = req->key_len;
    cmd.cmd_case = KVPB__COMMAND__CMD_DEL;
    cmd.del = &del;
    submit_write(req, &cmd, mode);
}

static void handle_incr(struct http_req *req, const struct query *q)
{
    int mode;
    if (parse_mode(req, q, &mode) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Increment inc = KVPB__INCREMENT__INIT;
    inc.key.data = req->key;
    inc.key.len = req->key_len;
    inc.delta = 1;
    if (q->present & Q_DELTA) {
        int i = qindex(Q_DELTA);
        if (parse_i64((const char *)q->val[i], q->len[i], &inc.delta) != 0) {
            BAD(req, "delta must be a decimal int64");
            return;
        }
    }
    if (req->body_len > 0) {
        struct bctx c = {.req = req};
        static const char *const names[] = {"delta", NULL};
        json_t *j = parse_body(req, &c);
        bool has;
        if (j == NULL || check_members(&c, j, "the body", names) != 0 ||
            get_i64(&c, j, "delta", &has, &inc.delta) != 0) {
            json_decref(j);
            http_respond_error(req, 400, "bad_request", NULL, "%s", c.err);
            return;
        }
        json_decref(j);
    }
    cmd.cmd_case = KVPB__COMMAND__CMD_INCR;
    cmd.incr = &inc;
    submit_write(req, &cmd, mode);
}

/* Scan bounds from the query: prefix, or start/end. */
static int scan_bounds(struct http_req *req, const struct query *q)
{
    if ((q->present & Q_PREFIX) && (q->present & (Q_START | Q_END))) {
        BAD(req, "give either prefix or start/end, not both");
        return TK_EINVAL;
    }
    int pi = qindex(Q_PREFIX), si = qindex(Q_START), ei = qindex(Q_END);
    if (q->present & Q_PREFIX) {
        req->by_prefix = true;
        req->key = tk_malloc(q->len[pi] + 1);
        memcpy(req->key, q->val[pi], q->len[pi]);
        req->key_len = q->len[pi];
    } else {
        if (q->present & Q_START) {
            req->key = tk_malloc(q->len[si] + 1);
            memcpy(req->key, q->val[si], q->len[si]);
            req->key_len = q->len[si];
        }
        if (q->present & Q_END) {
            req->key2 = tk_malloc(q->len[ei] + 1);
            memcpy(req->key2, q->val[ei], q->len[ei]);
            req->key2_len = q->len[ei];
        }
    }
    if (req->key_len > req->gw->cfg.key_max || req->key2_len > req->gw->cfg.key_max) {
        http_respond_error(req, 413, "too_large", NULL, "a bound exceeds the key limit");
        return TK_EINVAL;
    }
    return 0;
}

static void handle_scan(struct http_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    int cons;
    if (parse_consistency(req, q, &cons) != 0 || parse_encoding(req, q) != 0)
        return;
    uint64_t limit = gw->cfg.scan_limit_default;
    bool has;
    if (q_u64(req, q, Q_LIMIT, &has, &limit) != 0)
        return;
    if (limit == 0 || limit > gw->cfg.scan_limit_max) {
        BAD(req, "limit must be between 1 and %u", gw->cfg.scan_limit_max);
        return;
    }
    req->limit = (uint32_t)limit;
    if (scan_bounds(req, q) != 0)
        return;
    submit_read(req, cons, scan_read_cb);
}

static void handle_delete_range(struct http_req *req, const struct query *q)
{
    int mode;
    if (parse_mode(req, q, &mode) != 0)
        return;
    if (!(q->present & (Q_PREFIX | Q_START))) {
        BAD(req, "DELETE /v1/kv needs prefix= or start= (prefix= with an empty value "
                 "deletes every key)");
        return;
    }
    if (scan_bounds(req, q) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__DeleteRange dr = KVPB__DELETE_RANGE__INIT;
    if (req->by_prefix) {
        dr.by_prefix = true;
        dr.prefix.data = req->key;
        dr.prefix.len = req->key_len;
    } else {
        dr.start.data = req->key;
        dr.start.len = req->key_len;
        dr.end.data = req->key2;
        dr.end.len = req->key2_len;
    }
    cmd.cmd_case = KVPB__COMMAND__CMD_DELETE_RANGE;
    cmd.delete_range = &dr;
    submit_write(req, &cmd, mode);
}

static void handle_batch_or_txn(struct http_req *req, const struct query *q, bool txn)
{
    int mode;
    if (parse_mode(req, q, &mode) != 0 || parse_encoding(req, q) != 0)
        return;
    struct bctx c = {.req = req};
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Batch batch = KVPB__BATCH__INIT;
    Kvpb__Txn t = KVPB__TXN__INIT;
    json_t *j = parse_body(req, &c);
    if (j == NULL)
        goto fail;
    if (!txn) {
        static const char *const names[] = {"ops", NULL};
        if (check_members(&c, j, "the body", names) != 0)
            goto fail;
        json_t *ops = json_object_get(j, "ops");
        if (ops == NULL) {
            bfail(&c, 400, "missing \"ops\"");
            goto fail;
        }
        size_t n = json_is_array(ops) ? json_array_size(ops) : 0;
        if (n > KV_TXN_OPS_MAX) {
            bfail(&c, 413, "%zu ops exceed the limit of %d", n, KV_TXN_OPS_MAX);
            goto fail;
        }
        req->op_kinds = tk_calloc(n + 1, 1);
        if (build_ops(&c, ops, "ops", false, &batch.n_ops, &batch.ops, req->op_kinds) !=
            0)
            goto fail;
        if (batch.n_ops == 0) {
            bfail(&c, 400, "\"ops\" is empty");
            goto fail;
        }
        req->n_ops = (uint32_t)batch.n_ops;
        cmd.cmd_case = KVPB__COMMAND__CMD_BATCH;
        cmd.batch = &batch;
    } else {
        static const char *const names[] = {"compare", "then", "else", NULL};
        if (check_members(&c, j, "the body", names) != 0)
            goto fail;
        json_t *cmps = json_object_get(j, "compare");
        json_t *th = json_object_get(j, "then");
        json_t *el = json_object_get(j, "else");
        if (cmps != NULL && !json_is_array(cmps)) {
            bfail(&c, 400, "\"compare\" must be an array");
            goto fail;
        }
        size_t nc = json_array_size(cmps);
        size_t nt = json_is_array(th) ? json_array_size(th) : 0;
        size_t ne = json_is_array(el) ? json_array_size(el) : 0;
        if (nc > KV_TXN_OPS_MAX || nt + ne > KV_TXN_OPS_MAX) {
            bfail(&c, 413, "a txn takes at most %d compares and %d ops", KV_TXN_OPS_MAX,
                  KV_TXN_OPS_MAX);
            goto fail;
        }
        Kvpb__Compare *cs = scratch_alloc(&c.sc, nc * sizeof(*cs));
        Kvpb__Compare **cp = scratch_alloc(&c.sc, nc * sizeof(*cp));
        for (size_t i = 0; i < nc; i++) {
            if (build_compare(&c, json_array_get(cmps, i), i, &cs[i]) != 0)
                goto fail;
            cp[i] = &cs[i];
        }
        t.n_compares = nc;
        t.compares = cp;
        req->op_kinds = tk_calloc(nt + ne + 1, 1);
        if (build_ops(&c, th, "then", true, &t.n_then_ops, &t.then_ops, req->op_kinds) !=
                0 ||
            build_ops(&c, el, "else", true, &t.n_else_ops, &t.else_ops,
                      req->op_kinds + nt) != 0)
            goto fail;
        req->n_then = (uint32_t)nt;
        req->n_ops = (uint32_t)(nt + ne);
        cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
        cmd.txn = &t;
    }
    submit_write(req, &cmd, mode);
    json_decref(j);
    scratch_free(&c.sc);
    return;
fail:
    json_decref(j);
    scratch_free(&c.sc);
    http_respond_error(req, c.status, c.status == 413 ? "too_large" : "bad_request", NULL,
                       "%s", c.err);
}

/* ---- cluster, health, metrics ------------------------------------------- */

static const char *role_name(int role)
{
    switch (role) {
    case RAFT_LEADER:
        return "leader";
    case RAFT_CANDIDATE:
        return "candidate";
    case RAFT_PRE_CANDIDATE:
        return "pre_candidate";
    default:
        return "follower";
    }
}

static void handle_cluster(struct http_req *req)
{
    struct gateway *gw = req->gw;
    struct node_status st;
    node_status(gw->node, &st);
    struct jbuf b;
    jbuf_init(&b, 512);
    jbuf_printf(
        &b,
        "{\"id\":%llu,\"leader\":%llu,\"role\":\"%s\",\"term\":%llu,\"commit\":%llu,"
        "\"applied\":%llu,\"last_index\":%llu,\"snapshot_index\":%llu,\"members\":[",
        (unsigned long long)st.id, (unsigned long long)st.leader, role_name(st.role),
        (unsigned long long)st.term, (unsigned long long)st.commit,
        (unsigned long long)st.applied, (unsigned long long)st.last_index,
        (unsigned long long)st.snapshot_index);
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
    respond_json(req, &b, st.applied);
    jbuf_free(&b);
}

/* GET /v1/debug/digest: a digest of this node's applied state (kv_sm_digest)
 * and the index it is at, read locally, for comparing replicas. */
static void digest_read_cb(struct node_req *nreq, int status, struct kv_sm *sm,
                           void *data)
{
    struct http_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        respond_rc(req, status);
        return;
    }
    uint64_t d = 0;
    int rc = kv_sm_digest(sm, &d);
    if (rc != 0) {
        respond_rc(req, rc);
        return;
    }
    uint64_t applied = kv_sm_applied_index(sm);
    struct jbuf b;
    jbuf_init(&b, 96);
    jbuf_printf(&b, "{\"digest\":\"%016llx\",\"applied\":%llu}", (unsigned long long)d,
                (unsigned long long)applied);
    respond_json(req, &b, applied);
    jbuf_free(&b);
}

static void handle_readyz(struct http_req *req)
{
    struct gateway *gw = req->gw;
    struct node_status st;
    node_status(gw->node, &st);
    char retry[64];
    snprintf(retry, sizeof(retry), "Retry-After: %u\r\n", gw->cfg.retry_after_s);
    if (gw->stopping) {
        http_respond_error(req, 503, "shutting_down", retry, "the node is shutting down");
    } else if (st.failed) {
        http_respond_error(
            req, 503, "storage_failed", retry,
            "the node's storage failed; it serves nothing until restarted");
    } else if (st.leader == 0) {
        http_respond_error(req, 503, "no_leader", retry, "no leader is known yet");
    } else if (st.applied < st.commit) {
        http_respond_error(req, 503, "catching_up", retry,
                           "applied index %llu is behind commit index %llu",
                           (unsigned long long)st.applied, (unsigned long long)st.commit);
    } else {
        static const char ok[] = "{\"ready\":true}\n";
        http_respond(req, 200, NULL, NULL, ok, sizeof(ok) - 1);
    }
}

static void metric(struct jbuf *b, const char *name, const char *type, const char *help,
                   uint64_t v)
{
    jbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
                (unsigned long long)v);
}

/* Prometheus histograms from the node's base/hist.h histograms.
 *
 * A base histogram has 64 log-linear buckets per power of two; /metrics shows
 * it with the fixed `le` bounds below. The count at `le` = x is the number of
 * samples in the base buckets up to and including the one that holds x: a
 * sample is taken at its base bucket's lower bound, at most 1/64 (1.6 %) below
 * its value, so one just above x may be counted at x. Bounds under 128 are
 * exact (the base buckets there hold one value each). */
static const double lat_le_s[] = {10e-6, 25e-6,  50e-6, 100e-6, 250e-6, 500e-6,
                                  1e-3,  2.5e-3, 5e-3,  10e-3,  25e-3,  50e-3,
                                  0.1,   0.25,   0.5,   1.0};
static const double batch_le[] = {1,   2,   4,   8,    16,   32,  64,
                                  128, 256, 512, 1024, 2048, 4096};
#define LAT_LE_N (sizeof(lat_le_s) / sizeof(lat_le_s[0]))
#define BATCH_LE_N (sizeof(batch_le) / sizeof(batch_le[0]))

/* The base bucket holding each bound, found once by recording the bound into
 * a scratch histogram: hist.c keeps its layout to itself. */
static unsigned lat_le_bucket[LAT_LE_N];
static unsigned batch_le_bucket[BATCH_LE_N];
static uv_once_t le_once = UV_ONCE_INIT;

static unsigned base_bucket_of(struct tk_hist *scratch, uint64_t v)
{
    tk_hist_init(scratch);
    tk_hist_record(scratch, v);
    for (unsigned i = 0; i < TK_HIST_BUCKETS; i++)
        if (scratch->buckets[i] != 0)
            return i;
    TK_UNREACHABLE();
}

static void le_buckets_init(void)
{
    struct tk_hist *scratch = tk_malloc(sizeof(*scratch));
    for (size_t i = 0; i < LAT_LE_N; i++) {
        lat_le_bucket[i] = base_bucket_of(scratch, (uint64_t)(lat_le_s[i] * 1e9 + 0.5));
        TK_ASSERT(i == 0 || lat_le_bucket[i] > lat_le_bucket[i - 1]);
    }
    for (size_t i = 0; i < BATCH_LE_N; i++) {
        batch_le_bucket[i] = base_bucket_of(scratch, (uint64_t)batch_le[i]);
        TK_ASSERT(i == 0 || batch_le_bucket[i] > batch_le_bucket[i - 1]);
    }
    tk_free(scratch);
}

/* `h` as a Prometheus histogram: cumulative _bucket{le} counts, +Inf, _sum and
 * _count; `scale` converts the base unit (1e-9: nanoseconds to seconds). */
static void histogram(struct jbuf *b, const char *name, const char *help,
                      const struct tk_hist *h, const double *le,
                      const unsigned *le_bucket, size_t n_le, double scale)
{
    jbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    unsigned next = 0;
    for (size_t i = 0; i < n_le; i++) {
        for (; next <= le_bucket[i]; next++)
            cum += h->buckets[next];
        jbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, le[i],
                    (unsigned long long)cum);
    }
    jbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                (unsigned long long)h->count, name, (double)h->sum * scale, name,
                (unsigned long long)h->count);
}

static void latency_histogram(struct jbuf *b, const char *name, const char *help,
                              const struct tk_hist *h)
{
    histogram(b, name, help, h, lat_le_s, lat_le_bucket, LAT_LE_N, 1e-9);
}

static void handle_metrics(struct http_req *req)
{
    struct gateway *gw = req->gw;
    struct node_status st;
    struct node_metrics m;
    node_status(gw->node, &st);
    node_metrics(gw->node, &m);
    struct jbuf b;
    jbuf_init(&b, 8192);
    metric(&b, "tierkv_raft_term", "gauge", "Current Raft term.", st.term);
    metric(&b, "tierkv_raft_leader_id", "gauge", "Id of the known leader (0: none).",
           st.leader);
    jbuf_adds(&b, "# HELP tierkv_raft_role 1 for this node's current role.\n"
                  "# TYPE tierkv_raft_role gauge\n");
    for (int r = RAFT_FOLLOWER; r <= RAFT_LEADER; r++)
        jbuf_printf(&b, "tierkv_raft_role{role=\"%s\"} %d\n", role_name(r), st.role == r);
    metric(&b, "tierkv_raft_commit_index", "gauge", "Highest committed log index.",
           st.commit);
    metric(&b, "tierkv_raft_applied_index", "gauge", "Highest applied log index.",
           st.applied);
    metric(&b, "tierkv_raft_last_index", "gauge", "Last log index.", st.last_index);
    metric(&b, "tierkv_raft_snapshot_index", "gauge", "Index of the latest snapshot.",
           st.snapshot_index);
    metric(&b, "tierkv_proposals_total", "counter", "Writes proposed by this node.",
           m.proposals);
    metric(&b, "tierkv_proposal_batches_total", "counter",
           "Proposal batches (proposals/batches = mean batch size).", m.batches);
    metric(&b, "tierkv_forwarded_total", "counter", "Writes forwarded to the leader.",
           m.forwarded);
    metric(&b, "tierkv_reads_total", "counter", "Reads served.", m.reads);
    metric(&b, "tierkv_read_index_total", "counter",
           "Linearizable reads that asked for a read index.", m.read_index);
    metric(&b, "tierkv_read_index_rounds_total", "counter",
           "ReadIndex heartbeat rounds this node started as leader; one round "
           "confirms every read waiting for it.",
           m.read_index_rounds);
    metric(&b, "tierkv_applied_entries_total", "counter", "Entries applied.",
           m.applied_entries);
    metric(&b, "tierkv_snapshots_total", "counter", "Snapshots taken.", m.snapshots);
    metric(&b, "tierkv_snapshot_installs_total", "counter", "Snapshots installed.",
           m.installs);
    metric(&b, "tierkv_store_syncs_total", "counter", "Log store fsyncs.", m.store_syncs);
    metric(&b, "tierkv_store_appended_bytes_total", "counter",
           "Payload bytes appended to the Raft log since the node started.",
           m.store_bytes);
    metric(&b, "tierkv_kv_ring_bytes", "gauge",
           "Bytes of ring pages the state machine's hot tier holds in memory.",
           m.kv_ring_bytes);
    metric(&b, "tierkv_kv_hot_keys", "gauge", "Keys in the state machine's hot index.",
           m.kv_hot_keys);
    metric(&b, "tierkv_kv_cold_keys", "gauge",
           "Keys in the state machine's cold tier (LMDB).", m.kv_cold_keys);
    metric(&b, "tierkv_kv_cold_bytes", "gauge",
           "Bytes of the cold tier's LMDB data file in use.", m.kv_cold_bytes);
    metric(&b, "tierkv_store_log_bytes", "gauge",
           "Bytes of records in the Raft log (segment files are preallocated, so "
           "the disk holds up to one segment more).",
           m.store_log_bytes);
    metric(&b, "tierkv_kv_tier_downs_total", "counter",
           "Tier-down transactions (ring pages moved to the cold tier).",
           m.kv_tier_downs);
    metric(&b, "tierkv_kv_bad_records_total", "counter",
           "Ring records that failed their check on read (served from the cold tier).",
           m.kv_bad_records);
    metric(&b, "tierkv_transport_sent_bytes_total", "counter",
           "Raft transport bytes sent.", m.net_bytes_sent);
    metric(&b, "tierkv_transport_received_bytes_total", "counter",
           "Raft transport bytes received.", m.net_bytes_received);
    metric(&b, "tierkv_transport_reconnects_total", "counter",
           "Raft transport reconnects.", m.net_reconnects);
    metric(&b, "tierkv_http_connections", "gauge", "Open HTTP connections.", gw->n_conns);
    metric(&b, "tierkv_http_connections_accepted_total", "counter",
           "HTTP connections accepted.", gw->conns_accepted);
    metric(&b, "tierkv_http_connections_rejected_total", "counter",
           "HTTP connections refused over the connection limit.", gw->conns_rejected);
    metric(&b, "tierkv_http_timeouts_total", "counter",
           "HTTP connections cut for slow headers or body.", gw->conns_timed_out);
    metric(&b, "tierkv_http_bad_requests_total", "counter",
           "Requests answered 400, 408, 413, 414 or 431.", gw->bad_requests);
    const struct node_latency *lat = node_latency(gw->node);
    uv_once(&le_once, le_buckets_init);
    latency_histogram(
        &b, "tierkv_store_append_seconds",
        "Log append latency, handed to storage to durable (fsync included).",
        &lat->append);
    latency_histogram(&b, "tierkv_store_fsync_seconds",
                      "Duration of one log sync (fdatasync of the segments written).",
                      &lat->fsync);
    latency_histogram(&b, "tierkv_apply_seconds",
                      "Time to apply one batch of committed entries.", &lat->apply);
    histogram(&b, "tierkv_proposal_batch_size", "Entries per proposal batch.",
              &lat->batch_size, batch_le, batch_le_bucket, BATCH_LE_N, 1.0);
    jbuf_adds(&b, "# HELP tierkv_http_requests_total HTTP requests by route and status.\n"
                  "# TYPE tierkv_http_requests_total counter\n");
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int s = 0; s < GW_STATUS_SLOTS; s++)
            if (gw->requests[r][s]) {
                char code[16];
                if (gw_status_codes[s])
                    snprintf(code, sizeof(code), "%d", gw_status_codes[s]);
                else
                    snprintf(code, sizeof(code), "other");
                jbuf_printf(
                    &b, "tierkv_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
                    gw_route_names[r], code, (unsigned long long)gw->requests[r][s]);
            }
    jbuf_adds(&b, "# HELP tierkv_http_request_duration_seconds HTTP request latency, "
                  "receipt of the full request to response queued.\n"
                  "# TYPE tierkv_http_request_duration_seconds summary\n");
    static const double qs[] = {0.5, 0.9, 0.99, 0.999};
    for (int r = 0; r < ROUTE_COUNT; r++) {
        const struct tk_hist *h = &gw->latency[r];
        if (h->count == 0)
            continue;
        for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
            jbuf_printf(
                &b,
                "tierkv_http_request_duration_seconds{route=\"%s\",quantile=\"%g\"} "
                "%.6f\n",
                gw_route_names[r], qs[i], (double)tk_hist_quantile(h, qs[i]) / 1e9);
        jbuf_printf(&b, "tierkv_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n",
                    gw_route_names[r], (double)h->sum / 1e9);
        jbuf_printf(&b, "tierkv_http_request_duration_seconds_count{route=\"%s\"} %llu\n",
                    gw_route_names[r], (unsigned long long)h->count);
    }
    http_respond(req, 200, "text/plain; version=0.0.4", NULL, b.p, b.len);
    jbuf_free(&b);
}

/* ---- routing ----------------------------------------------------------- */

static bool path_is(const char *p, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(p, lit, len) == 0;
}

static int decode_key(struct http_req *req, const char *raw, size_t len)
{
    struct gateway *gw = req->gw;
    req->key = tk_malloc(len + 1);
    if (pct_decode(raw, len, req->key, &req->key_len, false) != 0) {
        BAD(req, "bad percent-escape in the key");
        return TK_EINVAL;
    }
    if (req->key_len == 0) {
        BAD(req, "empty key");
        return TK_EINVAL;
    }
    if (req->key_len > gw->cfg.key_max) {
        http_respond_error(req, 413, "too_large", NULL, "key of %zu bytes exceeds %zu",
                           req->key_len, gw->cfg.key_max);
        return TK_EINVAL;
    }
    return 0;
}

void api_handle(struct gateway *gw, struct http_req *req)
{
    (void)gw;
    const char *url = req->url ? req->url : "";
    size_t ulen = req->url_len;
    const char *qm = memchr(url, '?', ulen);
    size_t plen = qm ? (size_t)(qm - url) : ulen;
    const char *qs = qm ? qm + 1 : url + ulen;
    size_t qlen = (size_t)(url + ulen - qs);
    if (memchr(qs, '#', qlen))
        qlen = (size_t)((const char *)memchr(qs, '#', qlen) - qs);
    int m = req->method;
    unsigned allowed = 0;
    void (*handler)(struct http_req *, const struct query *) = NULL;
    bool body_ok = false;

    if (plen >= 6 && memcmp(url, "/v1/kv", 6) == 0 && (plen == 6 || url[6] == '/')) {
        const char *rest = url + 6;
        size_t rlen = plen - 6;
        if (rlen <= 1) {
            if (m == HTTP_GET) {
                req->route = ROUTE_KV_SCAN;
                handler = handle_scan;
                allowed =
                    Q_PREFIX | Q_START | Q_END | Q_LIMIT | Q_CONSISTENCY | Q_ENCODING;
            } else if (m == HTTP_DELETE) {
                req->route = ROUTE_KV_DELETE_RANGE;
                handler = handle_delete_range;
                allowed = Q_PREFIX | Q_START | Q_END | Q_MODE;
            } else {
                allow_405(req, "GET, DELETE");
                return;
            }
        } else {
            const char *kraw = rest + 1;
            size_t klen = rlen - 1;
            if (m == HTTP_POST) {
                if (klen >= 5 && memcmp(kraw + klen - 5, "/incr", 5) == 0) {
                    req->route = ROUTE_KV_INCR;
                    handler = handle_incr;
                    allowed = Q_MODE | Q_DELTA;
                    body_ok = true;
                    klen -= 5;
                } else {
                    allow_405(req, "GET, PUT, DELETE (POST only on /v1/kv/{key}/incr)");
                    return;
                }
            } else if (m == HTTP_GET) {
                req->route = ROUTE_KV_GET;
                handler = handle_get;
                allowed = Q_CONSISTENCY | Q_ENCODING | Q_RAW;
            } else if (m == HTTP_PUT) {
                req->route = ROUTE_KV_PUT;
                handler = handle_put;
                allowed =
                    Q_MODE | Q_ENCODING | Q_TTL | Q_IF_VERSION | Q_IF_MOD | Q_IF_ABSENT;
                body_ok = true;
            } else if (m == HTTP_DELETE) {
                req->route = ROUTE_KV_DELETE;
                handler = handle_delete;
                allowed = Q_MODE;
            } else {
                allow_405(req, "GET, PUT, DELETE");
                return;
            }
            if (decode_key(req, kraw, klen) != 0)
                return;
        }
    } else if (path_is(url, plen, "/v1/batch") || path_is(url, plen, "/v1/txn")) {
        if (m != HTTP_POST) {
            allow_405(req, "POST");
            return;
        }
        bool txn = path_is(url, plen, "/v1/txn");
        req->route = txn ? ROUTE_TXN : ROUTE_BATCH;
        struct query q;
        char msg[160];
        if (query_parse(qs, qlen, Q_MODE | Q_ENCODING, &q, msg, sizeof(msg)) != 0)
            BAD(req, "%s", msg);
        else
            handle_batch_or_txn(req, &q, txn);
        query_free(&q);
        return;
    } else if (path_is(url, plen, "/v1/debug/digest")) {
        req->route = ROUTE_DIGEST;
        if (m != HTTP_GET) {
            allow_405(req, "GET");
            return;
        }
        if (qlen > 0) {
            BAD(req, "this route takes no query parameters");
            return;
        }
        submit_read(req, NODE_READ_STALE, digest_read_cb);
        return;
    } else if (path_is(url, plen, "/v1/cluster") || path_is(url, plen, "/healthz") ||
               path_is(url, plen, "/readyz") || path_is(url, plen, "/metrics")) {
        req->route = path_is(url, plen, "/v1/cluster") ? ROUTE_CLUSTER
                     : path_is(url, plen, "/healthz")  ? ROUTE_HEALTHZ
                     : path_is(url, plen, "/readyz")   ? ROUTE_READYZ
                                                       : ROUTE_METRICS;
        if (m != HTTP_GET) {
            allow_405(req, "GET");
            return;
        }
        if (qlen > 0) {
            BAD(req, "this route takes no query parameters");
            return;
        }
        if (req->route == ROUTE_CLUSTER) {
            handle_cluster(req);
        } else if (req->route == ROUTE_HEALTHZ) {
            static const char ok[] = "{\"status\":\"ok\"}\n";
            http_respond(req, 200, NULL, NULL, ok, sizeof(ok) - 1);
        } else if (req->route == ROUTE_READYZ) {
            handle_readyz(req);
        } else {
            handle_metrics(req);
        }
        return;
    } else {
        http_respond_error(req, 404, "no_route", NULL, "no route for %.*s",
                           (int)(plen > 200 ? 200 : plen), url);
        return;
    }
    if (!body_ok && req->body_len > 0) {
        BAD(req, "this request takes no body");
        return;
    }
    struct query q;
    char msg[160];
    if (query_parse(qs, qlen, allowed, &q, msg, sizeof(msg)) != 0)
        BAD(req, "%s", msg);
    else
        handler(req, &q);
    query_free(&q);
}

void api_req_free(struct http_req *req)
{
    TK_ASSERT(!req->submitted);
    if (req->nreq.cmd != NULL) { /* a write held back, never submitted */
        tk_blob_unref(req->nreq.cmd);
        req->nreq.cmd = NULL;
    }
    tk_free(req->key);
    tk_free(req->key2);
    tk_free(req->op_kinds);
    req->key = req->key2 = NULL;
    req->op_kinds = NULL;
}
