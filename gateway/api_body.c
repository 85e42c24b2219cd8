/* JSON request bodies into kvpb messages (contract in api_body.h): the PUT
 * body, a batch's ops, a txn's compares and ops. Strict: unknown fields,
 * wrong types and values past the limits are errors, recorded in the
 * struct bctx for the caller to answer (400, or 413 over a limit). Called by
 * api_kv.c, api_offload.c and api_lease.c; calls jansson, http.c (its error
 * answer) and nothing else of the gateway. On the gateway's loop thread. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/api_body.h"
#include "kv/kv.h"
#include "node/node.h"

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

int api__body_fail(struct bctx *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    c->status = status;
    return TK_EINVAL;
}

/* How deep a request body may nest (ours are 3 deep: object, array, op) and
 * how many values it may hold in all (a full txn holds about 1500). */
#define PRESCAN_DEPTH_MAX 16
#define PRESCAN_VALUES_MAX 8192

/* String values this long or longer count towards the prescan's bound on
 * the command's size: keys and values (the shorter strings a body holds are
 * op and compare names, which a command does not carry as such). */
#define PRESCAN_LONG_STRING 16

/* The bytes a JSON string (raw, between its quotes) decodes to. */
static size_t decoded_len(const uint8_t *p, size_t n)
{
    size_t out = 0;
    for (size_t i = 0; i < n; i++, out++) {
        if (p[i] != '\\' || i + 1 >= n)
            continue;
        i++;
        if (p[i] == 'u' && i + 4 < n) { /* \uXXXX: 1 to 3 bytes; a pair: 4 */
            unsigned cp = 0;
            for (size_t k = 1; k <= 4; k++) {
                uint8_t h = p[i + k];
                cp = cp * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            i += 4;
            out += cp < 0x80 ? 0 : cp < 0x800 ? 1 : 2;
        }
    }
    return out;
}

/* Word-at-a-time tests: a byte of w equal to b, below 0x20, at or above 0x80. */
#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
static inline uint64_t has_byte(uint64_t w, uint8_t b)
{
    uint64_t x = w ^ (ONES * b);
    return (x - ONES) & ~x & HIGHS;
}

/* The first i' >= i whose byte is a quote, a backslash, a control character
 * or not ASCII, or where fewer than 8 bytes are left: a string's plain
 * stretches, 8 bytes a step. */
static size_t skip_plain(const uint8_t *p, size_t i, size_t len)
{
    while (i + 8 <= len) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if ((has_byte(w, '"') | has_byte(w, '\\') | ((w - ONES * 0x20) & ~w) | w) & HIGHS)
            break;
        i += 8;
    }
    return i;
}

/* Whether p[0, n) is a string's content as jansson takes it without escapes:
 * UTF-8 (no overlong form, no surrogate, nothing past U+10FFFF) and no
 * control character. */
static bool utf8_plain(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        i = skip_plain(p, i, n);
        if (i >= n)
            break;
        uint8_t b = p[i];
        if (b < 0x80) {
            if (b < 0x20)
                return false;
            i++;
            continue;
        }
        size_t k = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc2 ? 1 : 0;
        if (k == 0 || b > 0xf4 || k >= n - i)
            return false;
        uint32_t cp = b & (0x3fu >> k);
        for (size_t t = 1; t <= k; t++) {
            if ((p[i + t] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + t] & 0x3fu);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += k + 1;
    }
    return true;
}

/* Records the value string at body[off, off + len) as a span. */
static void add_span(struct bctx *c, size_t off, size_t len)
{
    if (c->n_spans == c->cap_spans) {
        c->cap_spans = c->cap_spans ? c->cap_spans * 2 : 8;
        c->spans = tk_realloc(c->spans, c->cap_spans * sizeof(*c->spans));
    }
    c->spans[c->n_spans++] = (struct body_span){(uint32_t)off, (uint32_t)len};
}

/* One pass over the raw bytes, before jansson builds anything: the nesting
 * depth, the elements of each array that is a member of the top-level object
 * (a batch's "ops", a txn's "compare", "then" and "else") and the values in
 * all. It stops at the first limit passed, so a body of a million empty ops
 * costs as much as one of 129. It does not validate: jansson does, after.
 * It also adds up what the long string values decode to (base64's three
 * quarters with ?encoding=base64): the command carries at least those bytes,
 * so a body whose command could never be a raft entry (NODE_ENTRY_MAX) is
 * answered 413 before it is parsed (parsing a 4 MiB batch costs the loop
 * 50-75 ms of CPU). And it notes the spans: the values of members named
 * "value" of API_BODY_SPAN_MIN bytes or more, without escapes, that are
 * valid string content. */
static int prescan(struct bctx *c, const uint8_t *p, size_t len)
{
    uint32_t elems[PRESCAN_DEPTH_MAX + 1] = {0}; /* commas + 1, per open array */
    bool is_array[PRESCAN_DEPTH_MAX + 1] = {false};
    size_t depth = 0, values = 0, content = 0;
    bool after_value_name = false; /* the last member name was "value" */
    for (size_t i = 0; i < len; i++) {
        uint8_t ch = p[i];
        if (ch == '"') {
            size_t from = i + 1;
            bool escaped = false, plain = true;
            for (i = from;;) {
                i = skip_plain(p, i, len);
                if (i >= len || p[i] == '"')
                    break;
                if (p[i] == '\\') {
                    escaped = true;
                    i += 2;
                } else {
                    plain = false; /* not ASCII, or a control character */
                    i++;
                }
            }
            size_t n = (i < len ? i : len) - from;
            size_t j = i + 1;
            while (j < len &&
                   (p[j] == ' ' || p[j] == '\t' || p[j] == '\n' || p[j] == '\r'))
                j++;
            if (j < len && p[j] == ':') { /* a member's name */
                after_value_name =
                    !escaped && n == 5 && memcmp(p + from, "value", 5) == 0;
                continue;
            }
            if (n >= PRESCAN_LONG_STRING) {
                size_t d = escaped ? decoded_len(p + from, n) : n;
                if (d >= PRESCAN_LONG_STRING)
                    content += c->req->b64 ? d / 4 * 3 : d;
                if (content > NODE_ENTRY_MAX)
                    return api__body_fail(
                        c, 413,
                        "the keys and values alone are over %u bytes, the largest "
                        "command a write may carry (the largest raft entry)",
                        NODE_ENTRY_MAX);
            }
            if (after_value_name && !escaped && i < len && n >= API_BODY_SPAN_MIN &&
                i <= UINT32_MAX && (plain || utf8_plain(p + from, n)))
                add_span(c, from, n);
            continue;
        }
        if (ch == '{' || ch == '[') {
            if (depth == PRESCAN_DEPTH_MAX)
                return api__body_fail(c, 400, "the JSON nests deeper than %d levels",
                                      PRESCAN_DEPTH_MAX);
            depth++;
            is_array[depth] = ch == '[';
            elems[depth] = 1;
            values++;
        } else if ((ch == '}' || ch == ']') && depth > 0) {
            depth--;
        } else if (ch == ',' && depth > 0) {
            elems[depth]++;
            values++;
            if (depth == 2 && is_array[2] && elems[2] > KV_TXN_OPS_MAX)
                return api__body_fail(c, 413, "more than %d ops (the limit)",
                                      KV_TXN_OPS_MAX);
        }
        if (values > PRESCAN_VALUES_MAX)
            return api__body_fail(c, 413, "the JSON holds more than %d values",
                                  PRESCAN_VALUES_MAX);
    }
    return 0;
}

/* A span's placeholder: an escaped NUL and its index, "\u0000<i>". No other
 * string of the body can decode to one: a NUL is only written "\u0000" (a
 * raw one is an error), and a body with that escape keeps no spans. */
#define SPAN_MARK "\\u0000"

/* The body with each span's bytes replaced by its placeholder, for jansson;
 * NULL (no spans kept) when there are none or the body has SPAN_MARK. */
static char *skeleton(struct bctx *c, const uint8_t *body, size_t len, size_t *out_len)
{
    if (c->n_spans == 0 || memmem(body, len, SPAN_MARK, 6) != NULL) {
        c->n_spans = 0;
        return NULL;
    }
    size_t cap = len + 1, at = 0, from = 0;
    for (size_t k = 0; k < c->n_spans; k++)
        cap -= c->spans[k].len; /* each span >= 1024 bytes; a placeholder <= 26 */
    cap += c->n_spans * 32;
    char *s = tk_malloc(cap);
    for (size_t k = 0; k < c->n_spans; k++) {
        const struct body_span *sp = &c->spans[k];
        memcpy(s + at, body + from, sp->off - from);
        at += sp->off - from;
        at += (size_t)snprintf(s + at, cap - at, SPAN_MARK "%zu", k);
        from = (size_t)sp->off + sp->len;
    }
    memcpy(s + at, body + from, len - from);
    *out_len = at + len - from;
    return s;
}

json_t *api__body_parse(struct api_req *req, struct bctx *c)
{
    const uint8_t *body = req->http->body;
    size_t len = req->http->body_len;
    c->n_spans = 0;
    if (prescan(c, body, len) != 0)
        return NULL;
    json_error_t e;
    size_t skel_len = 0;
    char *skel = skeleton(c, body, len, &skel_len);
    json_t *j = NULL;
    if (skel != NULL) {
        j = json_loadb(skel, skel_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
        tk_free(skel);
        if (j == NULL)
            c->n_spans = 0; /* the body's own parse below says where it fails */
    }
    if (j == NULL)
        j = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                       &e);
    if (j == NULL) {
        api__body_fail(c, 400, "invalid JSON at line %d column %d: %s", e.line, e.column,
                       e.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        api__body_fail(c, 400, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Only the listed members may appear in `o`. */
int api__body_check_members(struct bctx *c, json_t *o, const char *what,
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
            return api__body_fail(c, 400, "unknown field \"%.64s\" in %s", k, what);
    }
    return 0;
}

static int get_string_bytes(struct bctx *c, json_t *s, const char *what, size_t max,
                            ProtobufCBinaryData *out)
{
    if (!json_is_string(s))
        return api__body_fail(c, 400, "%s must be a string", what);
    const char *p = json_string_value(s);
    size_t len = json_string_length(s);
    if (c->n_spans > 0 && len > 1 && p[0] == '\0') { /* a span's placeholder */
        size_t k = strtoul(p + 1, NULL, 10);
        if (k >= c->n_spans)
            return api__body_fail(c, 400, "%s: no such string", what); /* cannot be */
        p = (const char *)c->req->http->body + c->spans[k].off;
        len = c->spans[k].len;
        c->spans_taken++;
    }
    if (c->req->b64) {
        size_t cap = tk_base64_decoded_max(len);
        uint8_t *d = scratch_alloc(&c->sc, cap);
        long dlen = tk_base64_decode(p, len, d, cap);
        if (dlen < 0)
            return api__body_fail(c, 400, "%s is not valid base64 (encoding=base64)",
                                  what);
        out->data = d;
        out->len = (size_t)dlen;
    } else {
        out->data = (uint8_t *)(uintptr_t)p;
        out->len = len;
    }
    if (out->len > max)
        return api__body_fail(c, 413, "%s of %zu bytes exceeds the limit of %zu", what,
                              out->len, max);
    return 0;
}

static int get_key(struct bctx *c, json_t *o, ProtobufCBinaryData *out)
{
    json_t *k = json_object_get(o, "key");
    if (k == NULL)
        return api__body_fail(c, 400, "missing \"key\"");
    int rc = get_string_bytes(c, k, "key", c->req->gw->cfg.key_max, out);
    if (rc == 0 && out->len == 0)
        return api__body_fail(c, 400, "empty key");
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
        return api__body_fail(c, 400, "\"%s\" must be a non-negative integer", name);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

int api__body_get_i64(struct bctx *c, json_t *o, const char *name, bool *present,
                      int64_t *out)
{
    json_t *v = json_object_get(o, name);
    *present = v != NULL;
    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return api__body_fail(c, 400, "\"%s\" must be an integer", name);
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
        return api__body_fail(c, 400, "op %zu must be an object", idx);
    if (api__body_check_members(c, o, "an op", names) != 0)
        return TK_EINVAL;
    const char *type = json_string_value(json_object_get(o, "op"));
    if (type == NULL)
        return api__body_fail(
            c, 400, "op %zu needs \"op\": \"put\", \"delete\" or \"incr\"", idx);
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
            return api__body_fail(c, 400, "op %zu (put) needs \"value\"", idx);
        if (get_string_bytes(c, v, what, c->req->gw->cfg.value_max, &p->value) != 0 ||
            get_u64(c, o, "ttl_ms", &has, &p->ttl_ms) != 0)
            return TK_EINVAL;
        if (p->ttl_ms > API_TTL_MS_MAX)
            return api__body_fail(c, 400, "op %zu: ttl_ms is out of range (at most %llu)",
                                  idx, API_TTL_MS_MAX);
        if (json_object_get(o, "delta"))
            return api__body_fail(c, 400, "op %zu: \"delta\" is for incr", idx);
        op->op_case = KVPB__OP__OP_PUT;
        op->put = p;
        *kind = OPK_PUT;
    } else if (strcmp(type, "delete") == 0) {
        if (json_object_size(o) != 2)
            return api__body_fail(c, 400, "op %zu (delete) takes only \"key\"", idx);
        Kvpb__Delete *d = scratch_alloc(&c->sc, sizeof(*d));
        kvpb__delete__init(d);
        d->key = key;
        op->op_case = KVPB__OP__OP_DEL;
        op->del = d;
        *kind = OPK_DEL;
    } else if (strcmp(type, "incr") == 0) {
        if (!allow_incr)
            return api__body_fail(
                c, 400,
                "op %zu: a batch holds puts and deletes only (use /v1/txn "
                "for incr)",
                idx);
        Kvpb__Increment *in = scratch_alloc(&c->sc, sizeof(*in));
        kvpb__increment__init(in);
        in->key = key;
        in->delta = 1;
        if (api__body_get_i64(c, o, "delta", &has, &in->delta) != 0)
            return TK_EINVAL;
        if (json_object_get(o, "value") || json_object_get(o, "ttl_ms"))
            return api__body_fail(c, 400,
                                  "op %zu (incr) takes only \"key\" and \"delta\"", idx);
        op->op_case = KVPB__OP__OP_INCR;
        op->incr = in;
        *kind = OPK_INCR;
    } else {
        return api__body_fail(c, 400, "op %zu: unknown op \"%.32s\" (put, delete, incr)",
                              idx, type);
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
        return api__body_fail(c, 400, "\"%s\" must be an array of ops", what);
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
        return api__body_fail(c, 400, "compare %zu must be an object", idx);
    if (api__body_check_members(c, o, "a compare", names) != 0)
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
        return api__body_fail(c, 400,
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
            return api__body_fail(c, 400, "compare %zu: \"op\" must be ==, !=, < or >",
                                  idx);
        cmp->op = ops[oi].op;
    }
    json_t *v = json_object_get(o, "value");
    switch (cmp->target) {
    case KVPB__COMPARE__TARGET__VALUE:
        if (v == NULL)
            return api__body_fail(c, 400, "compare %zu: target value needs \"value\"",
                                  idx);
        return get_string_bytes(c, v, "compare value", c->req->gw->cfg.value_max,
                                &cmp->value);
    case KVPB__COMPARE__TARGET__ABSENT:
    case KVPB__COMPARE__TARGET__EXISTS:
        if (v != NULL)
            return api__body_fail(c, 400, "compare %zu: target %s takes no \"value\"",
                                  idx, t);
        return 0;
    default:
        if (v == NULL || !json_is_integer(v))
            return api__body_fail(c, 400, "compare %zu: \"value\" must be an integer",
                                  idx);
        cmp->number = (int64_t)json_integer_value(v);
        return 0;
    }
}

void api__body_free(struct bctx *c, json_t *j)
{
    json_decref(j);
    scratch_free(&c->sc);
    tk_free(c->spans);
    c->spans = NULL;
    c->n_spans = c->cap_spans = 0;
}

/* Answers the failure recorded in `c`. */
void api__body_respond(struct bctx *c)
{
    http_respond_error(c->req->http, c->status,
                       c->status == 413 ? "too_large" : "bad_request", NULL, "%s",
                       c->err);
}

/* {"value", "ttl_ms", "if_version", "if_mod_revision", "if_absent"}. */
int api__body_put(struct bctx *c, json_t *j, struct put_args *a,
                  ProtobufCBinaryData *value)
{
    static const char *const names[] = {"value",           "ttl_ms",    "if_version",
                                        "if_mod_revision", "if_absent", NULL};
    if (api__body_check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *v = json_object_get(j, "value");
    if (v == NULL)
        return api__body_fail(c, 400, "missing \"value\"");
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
        return api__body_fail(c, 400, "\"if_absent\" must be a boolean");
    if (ia != NULL)
        a->if_absent |= json_is_true(ia);
    return 0;
}

/* {"ops": [...]}: puts and deletes. */
int api__body_batch(struct bctx *c, json_t *j, Kvpb__Batch *batch)
{
    struct api_req *req = c->req;
    static const char *const names[] = {"ops", NULL};
    if (api__body_check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *ops = json_object_get(j, "ops");
    if (ops == NULL)
        return api__body_fail(c, 400, "missing \"ops\"");
    size_t n = json_is_array(ops) ? json_array_size(ops) : 0;
    if (n > KV_TXN_OPS_MAX)
        return api__body_fail(c, 413, "%zu ops exceed the limit of %d", n,
                              KV_TXN_OPS_MAX);
    req->op_kinds = tk_calloc(n + 1, 1);
    if (build_ops(c, ops, "ops", false, &batch->n_ops, &batch->ops, req->op_kinds) != 0)
        return TK_EINVAL;
    if (batch->n_ops == 0)
        return api__body_fail(c, 400, "\"ops\" is empty");
    req->n_ops = (uint32_t)batch->n_ops;
    return 0;
}

/* {"compare": [...], "then": [...], "else": [...]}. */
int api__body_txn(struct bctx *c, json_t *j, Kvpb__Txn *t)
{
    struct api_req *req = c->req;
    static const char *const names[] = {"compare", "then", "else", NULL};
    if (api__body_check_members(c, j, "the body", names) != 0)
        return TK_EINVAL;
    json_t *cmps = json_object_get(j, "compare");
    json_t *th = json_object_get(j, "then");
    json_t *el = json_object_get(j, "else");
    if (cmps != NULL && !json_is_array(cmps))
        return api__body_fail(c, 400, "\"compare\" must be an array");
    size_t nc = json_array_size(cmps);
    size_t nt = json_is_array(th) ? json_array_size(th) : 0;
    size_t ne = json_is_array(el) ? json_array_size(el) : 0;
    if (nc > KV_TXN_OPS_MAX || nt + ne > KV_TXN_OPS_MAX)
        return api__body_fail(c, 413, "a txn takes at most %d compares and %d ops",
                              KV_TXN_OPS_MAX, KV_TXN_OPS_MAX);
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
