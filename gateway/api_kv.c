/* The key-value routes: /v1/kv/{key} (get, put, delete, incr), /v1/kv (scan,
 * delete range), /v1/batch and /v1/txn. Called by api.c's route table.
 *
 * Writes encode a kvpb.Command (proto/kv.proto) and submit it; the write
 * callback turns the state machine's result into JSON. Reads submit a read
 * request; its callback runs when the node's state is fresh enough and reads
 * the state machine directly (kv_sm_get / kv_sm_scan) to build the answer.
 * Everything runs on the node's loop thread, so a callback finds its request
 * alive: http.c keeps it until http_respond.
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
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

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
    struct api_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    if (req->nreq.mode == NODE_MODE_COMMITTED) {
        struct jbuf b;
        jbuf_init(&b, 64);
        jbuf_printf(&b, "{\"revision\":%llu,\"mode\":\"committed\"}",
                    (unsigned long long)res->revision);
        api__respond_json(req, &b, res->revision);
        jbuf_free(&b);
        return;
    }
    if (res->code != 0 && !(req->route == ROUTE_TXN && res->code == TK_ECOMPARE)) {
        api__respond_rc(req, res->code);
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
    api__respond_json(req, &b, res->revision);
    jbuf_free(&b);
}

/* Packs `cmd` (with the Idempotency-Key's client id) and submits it. */
static void submit_write(struct api_req *req, Kvpb__Command *cmd, int mode)
{
    if (req->http->has_digest) {
        cmd->client_id = req->http->digest;
        cmd->seq = 1;
    }
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *blob = tk_blob_new(len);
    kvpb__command__pack(cmd, blob->data);
    api__submit_write(req, blob, mode, on_write_done);
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
    struct api_req *req;
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

static json_t *parse_body(struct api_req *req, struct bctx *c)
{
    json_error_t e;
    json_t *j = json_loadb((const char *)req->http->body, req->http->body_len,
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

static void get_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    struct api_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return;
    }
    struct kv_item it;
    int rc = kv_sm_get(sm, req->key, req->key_len, &it);
    if (rc != 0) {
        api__respond_rc(req, rc);
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
        http_respond(req->http, 200, "application/octet-stream", extra, it.value,
                     it.value_len);
        return;
    }
    struct jbuf b;
    jbuf_init(&b, 128 + it.key_len + it.value_len * 2);
    put_item(&b, &it, req->b64);
    api__respond_json(req, &b, rev);
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
    struct api_req *req = data;
    (void)nreq;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
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
        api__respond_rc(req, rc);
        return;
    }
    jbuf_printf(&s.b, "],\"count\":%u,\"more\":%s}", s.count, s.more ? "true" : "false");
    api__respond_json(req, &s.b, kv_sm_applied_index(sm));
    jbuf_free(&s.b);
}

void api__kv_get(struct api_req *req, const struct query *q)
{
    int cons;
    if (api__parse_consistency(req, q, &cons) != 0 || api__parse_encoding(req, q) != 0 ||
        api__parse_flag(req, q, QI_RAW, &req->raw) != 0)
        return;
    api__submit_read(req, cons, get_read_cb);
}

/* Answers the failure recorded in `c`. */
static void bctx_respond(struct bctx *c)
{
    http_respond_error(c->req->http, c->status,
                       c->status == 413 ? "too_large" : "bad_request", NULL, "%s",
                       c->err);
}

/* A PUT's options: the query's, then the JSON body's added to them. */
struct put_args {
    uint64_t ttl, ifv, ifm;
    bool has_ttl, has_ifv, has_ifm, if_absent;
};

static int put_args_from_query(struct api_req *req, const struct query *q,
                               struct put_args *a)
{
    return api__query_u64(req, q, QI_TTL, &a->has_ttl, &a->ttl) != 0 ||
                   api__query_u64(req, q, QI_IF_VERSION, &a->has_ifv, &a->ifv) != 0 ||
                   api__query_u64(req, q, QI_IF_MOD, &a->has_ifm, &a->ifm) != 0 ||
                   api__parse_flag(req, q, QI_IF_ABSENT, &a->if_absent) != 0
               ? TK_EINVAL
               : 0;
}

/* {"value", "ttl_ms", "if_version", "if_mod_revision", "if_absent"}. */
static int put_args_from_json(struct bctx *c, json_t *j, struct put_args *a,
                              ProtobufCBinaryData *value)
{
    static const char *const names[] = {"value",           "ttl_ms",    "if_version",
                                        "if_mod_revision", "if_absent", NULL};
    if (check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *v = json_object_get(j, "value");
    if (v == NULL)
        return bfail(c, 400, "missing \"value\"");
    bool h;
    if (get_string_bytes(c, v, "value", c->req->gw->cfg.value_max, value) != 0 ||
        get_u64(c, j, "ttl_ms", &h, &a->ttl) != 0)
        return TK_EINVAL;
    a->has_ttl |= h;
    if (get_u64(c, j, "if_version", &h, &a->ifv) != 0)
        return TK_EINVAL;
    a->has_ifv |= h;
    if (get_u64(c, j, "if_mod_revision", &h, &a->ifm) != 0)
        return TK_EINVAL;
    a->has_ifm |= h;
    json_t *ia = json_object_get(j, "if_absent");
    if (ia != NULL && !json_is_boolean(ia))
        return bfail(c, 400, "\"if_absent\" must be a boolean");
    if (ia != NULL)
        a->if_absent |= json_is_true(ia);
    return 0;
}

/* The put's TTL and its condition: at most one of the three. */
static int put_finish(struct bctx *c, const struct put_args *a, Kvpb__Put *put,
                      Kvpb__Compare *cond)
{
    if ((int)a->has_ifv + (int)a->has_ifm + (int)a->if_absent > 1)
        return bfail(c, 400,
                     "give at most one of if_version, if_mod_revision, if_absent");
    put->ttl_ms = a->ttl;
    if (a->has_ifv || a->has_ifm || a->if_absent) {
        cond->target = a->has_ifv   ? KVPB__COMPARE__TARGET__VERSION
                       : a->has_ifm ? KVPB__COMPARE__TARGET__MOD_REVISION
                                    : KVPB__COMPARE__TARGET__ABSENT;
        cond->op = KVPB__COMPARE__OP__EQUAL;
        cond->number = (int64_t)(a->has_ifv ? a->ifv : a->ifm);
        put->cond = cond;
    }
    return 0;
}

void api__kv_put(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    int mode;
    if (api__parse_mode(req, q, &mode) != 0 || api__parse_encoding(req, q) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    Kvpb__Compare cond = KVPB__COMPARE__INIT;
    put.key.data = req->key;
    put.key.len = req->key_len;
    struct put_args a = {0};
    if (put_args_from_query(req, q, &a) != 0)
        return;
    struct bctx c = {.req = req};
    json_t *j = NULL;
    int rc = 0;
    if (req->http->json_body) {
        j = parse_body(req, &c);
        rc = j == NULL ? TK_EINVAL : put_args_from_json(&c, j, &a, &put.value);
    } else if (req->http->body_len > gw->cfg.value_max) {
        rc = bfail(&c, 413, "value of %zu bytes exceeds the limit of %zu",
                   req->http->body_len, gw->cfg.value_max);
    } else {
        put.value.data = req->http->body;
        put.value.len = req->http->body_len;
    }
    if (rc == 0)
        rc = put_finish(&c, &a, &put, &cond);
    if (rc == 0) {
        cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
        cmd.put = &put;
        submit_write(req, &cmd, mode);
    }
    json_decref(j);
    scratch_free(&c.sc);
    if (rc != 0)
        bctx_respond(&c);
}

void api__kv_delete(struct api_req *req, const struct query *q)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Delete del = KVPB__DELETE__INIT;
    del.key.data = req->key;
    del.key.len = req->key_len;
    cmd.cmd_case = KVPB__COMMAND__CMD_DEL;
    cmd.del = &del;
    submit_write(req, &cmd, mode);
}

void api__kv_incr(struct api_req *req, const struct query *q)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0)
        return;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Increment inc = KVPB__INCREMENT__INIT;
    inc.key.data = req->key;
    inc.key.len = req->key_len;
    inc.delta = 1;
    if (q->present & Q_DELTA) {
        int i = QI_DELTA;
        if (api__parse_i64((const char *)q->val[i], q->len[i], &inc.delta) != 0) {
            api__bad(req, "delta must be a decimal int64");
            return;
        }
    }
    if (req->http->body_len > 0) {
        struct bctx c = {.req = req};
        static const char *const names[] = {"delta", NULL};
        json_t *j = parse_body(req, &c);
        bool has;
        if (j == NULL || check_members(&c, j, "the body", names) != 0 ||
            get_i64(&c, j, "delta", &has, &inc.delta) != 0) {
            json_decref(j);
            http_respond_error(req->http, 400, "bad_request", NULL, "%s", c.err);
            return;
        }
        json_decref(j);
    }
    cmd.cmd_case = KVPB__COMMAND__CMD_INCR;
    cmd.incr = &inc;
    submit_write(req, &cmd, mode);
}

/* Scan bounds from the query: prefix, or start/end. */
static int scan_bounds(struct api_req *req, const struct query *q)
{
    if ((q->present & Q_PREFIX) && (q->present & (Q_START | Q_END))) {
        api__bad(req, "give either prefix or start/end, not both");
        return TK_EINVAL;
    }
    int pi = QI_PREFIX, si = QI_START, ei = QI_END;
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
        http_respond_error(req->http, 413, "too_large", NULL,
                           "a bound exceeds the key limit");
        return TK_EINVAL;
    }
    return 0;
}

void api__kv_scan(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    int cons;
    if (api__parse_consistency(req, q, &cons) != 0 || api__parse_encoding(req, q) != 0)
        return;
    uint64_t limit = gw->cfg.scan_limit_default;
    bool has;
    if (api__query_u64(req, q, QI_LIMIT, &has, &limit) != 0)
        return;
    if (limit == 0 || limit > gw->cfg.scan_limit_max) {
        api__bad(req, "limit must be between 1 and %u", gw->cfg.scan_limit_max);
        return;
    }
    req->limit = (uint32_t)limit;
    if (scan_bounds(req, q) != 0)
        return;
    api__submit_read(req, cons, scan_read_cb);
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

/* {"ops": [...]}: puts and deletes. */
static int build_batch(struct bctx *c, json_t *j, Kvpb__Batch *batch)
{
    struct api_req *req = c->req;
    static const char *const names[] = {"ops", NULL};
    if (check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *ops = json_object_get(j, "ops");
    if (ops == NULL)
        return bfail(c, 400, "missing \"ops\"");
    size_t n = json_is_array(ops) ? json_array_size(ops) : 0;
    if (n > KV_TXN_OPS_MAX)
        return bfail(c, 413, "%zu ops exceed the limit of %d", n, KV_TXN_OPS_MAX);
    req->op_kinds = tk_calloc(n + 1, 1);
    if (build_ops(c, ops, "ops", false, &batch->n_ops, &batch->ops, req->op_kinds) != 0)
        return TK_EINVAL;
    if (batch->n_ops == 0)
        return bfail(c, 400, "\"ops\" is empty");
    req->n_ops = (uint32_t)batch->n_ops;
    return 0;
}

/* {"compare": [...], "then": [...], "else": [...]}. */
static int build_txn(struct bctx *c, json_t *j, Kvpb__Txn *t)
{
    struct api_req *req = c->req;
    static const char *const names[] = {"compare", "then", "else", NULL};
    if (check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *cmps = json_object_get(j, "compare");
    json_t *th = json_object_get(j, "then");
    json_t *el = json_object_get(j, "else");
    if (cmps != NULL && !json_is_array(cmps))
        return bfail(c, 400, "\"compare\" must be an array");
    size_t nc = json_array_size(cmps);
    size_t nt = json_is_array(th) ? json_array_size(th) : 0;
    size_t ne = json_is_array(el) ? json_array_size(el) : 0;
    if (nc > KV_TXN_OPS_MAX || nt + ne > KV_TXN_OPS_MAX)
        return bfail(c, 413, "a txn takes at most %d compares and %d ops", KV_TXN_OPS_MAX,
                     KV_TXN_OPS_MAX);
    Kvpb__Compare *cs = scratch_alloc(&c->sc, nc * sizeof(*cs));
    Kvpb__Compare **cp = scratch_alloc(&c->sc, nc * sizeof(*cp));
    for (size_t i = 0; i < nc; i++) {
        if (build_compare(c, json_array_get(cmps, i), i, &cs[i]) != 0)
            return TK_EINVAL;
        cp[i] = &cs[i];
    }
    t->n_compares = nc;
    t->compares = cp;
    req->op_kinds = tk_calloc(nt + ne + 1, 1);
    if (build_ops(c, th, "then", true, &t->n_then_ops, &t->then_ops, req->op_kinds) !=
            0 ||
        build_ops(c, el, "else", true, &t->n_else_ops, &t->else_ops,
                  req->op_kinds + nt) != 0)
        return TK_EINVAL;
    req->n_then = (uint32_t)nt;
    req->n_ops = (uint32_t)(nt + ne);
    return 0;
}

static void handle_batch_or_txn(struct api_req *req, const struct query *q, bool txn)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0 || api__parse_encoding(req, q) != 0)
        return;
    struct bctx c = {.req = req};
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Batch batch = KVPB__BATCH__INIT;
    Kvpb__Txn t = KVPB__TXN__INIT;
    json_t *j = parse_body(req, &c);
    int rc = j == NULL ? TK_EINVAL
             : txn     ? build_txn(&c, j, &t)
                       : build_batch(&c, j, &batch);
    if (rc == 0) {
        if (txn) {
            cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
            cmd.txn = &t;
        } else {
            cmd.cmd_case = KVPB__COMMAND__CMD_BATCH;
            cmd.batch = &batch;
        }
        submit_write(req, &cmd, mode);
    }
    json_decref(j);
    scratch_free(&c.sc);
    if (rc != 0)
        bctx_respond(&c);
}

void api__batch(struct api_req *req, const struct query *q)
{
    handle_batch_or_txn(req, q, false);
}

void api__txn(struct api_req *req, const struct query *q)
{
    handle_batch_or_txn(req, q, true);
}
