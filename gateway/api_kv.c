/* The key-value routes: /v1/kv/{key} (get, put, delete, incr), /v1/kv (scan,
 * delete range), /v1/batch and /v1/txn. Called by api.c's route table; JSON
 * request bodies are read by api_body.c.
 *
 * Writes encode a kvpb.Command (proto/kv.proto) and submit it; the write
 * callback turns the state machine's result into JSON. Reads submit a read
 * request; its callback runs when the node's state is fresh enough and reads
 * the state machine directly (kv_sm_get / kv_sm_scan) to build the answer.
 * The delete range route is api_range.c's.
 * Everything runs on the gateway's loop thread (read callbacks there too,
 * holding the node's state lock), so a callback finds its request
 * alive: http.c keeps it until http_respond.
 *
 * Bytes: keys are URL-decoded path bytes; query values are URL-decoded too.
 * JSON strings are UTF-8; a stored key or value that is not valid UTF-8 is
 * returned base64-encoded with "key_encoding"/"encoding": "base64" beside it
 * (never as broken JSON). ?encoding=base64 makes every key and value in JSON
 * bodies (requests and responses) base64.
 *
 * Idempotency-Key: 128 bits of SHA-256 over the user's name and the key's
 * SHA-256 become the command's (client_id, seq) (api__auth_client_id); the
 * state machine answers a repeat with the first result (marked "replayed":
 * true) without applying it again. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "gateway/api_body.h"
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
    /* The common answers fit on the stack: no allocation, no printf. */
    char room[256];
    if (req->nreq.mode == NODE_MODE_COMMITTED) {
        struct jbuf b;
        jbuf_init_on(&b, room, sizeof(room));
        jbuf_adds(&b, "{\"revision\":");
        jbuf_u64(&b, res->revision);
        jbuf_adds(&b, ",\"mode\":\"committed\"}");
        api__respond_json(req, &b, res->revision);
        jbuf_free(&b);
        return;
    }
    if (res->code != 0 && !(req->route == ROUTE_TXN && res->code == TK_ECOMPARE)) {
        api__respond_rc(req, res->code);
        return;
    }
    struct jbuf b;
    jbuf_init_on(&b, room, sizeof(room));
    jbuf_adds(&b, "{\"revision\":");
    jbuf_u64(&b, res->revision);
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

/* The user's rights on `cmd` (*verdict), then, when it may, the command
 * packed with the Idempotency-Key's exactly-once id into *out. Any thread. */
static void pack_checked(const struct api_req *req, Kvpb__Command *cmd,
                         struct tk_blob **out, int *verdict)
{
    *out = NULL;
    *verdict = api__auth_verdict(req, cmd);
    if (*verdict != API_AUTH_OK)
        return;
    if (req->http->has_digest)
        api__auth_client_id(req, &cmd->client_id, &cmd->seq);
    size_t len = kvpb__command__get_packed_size(cmd);
    *out = tk_blob_new(len);
    kvpb__command__pack(cmd, (*out)->data);
}

/* Checks the user's rights on `cmd`, packs it (with the Idempotency-Key's
 * exactly-once id) and submits it. */
static void submit_write(struct api_req *req, Kvpb__Command *cmd, int mode)
{
    struct tk_blob *blob;
    int verdict;
    pack_checked(req, cmd, &blob, &verdict);
    api__write_built(req, mode, 0, NULL, blob, verdict, on_write_done);
}

/* ---- handlers ---------------------------------------------------------- */

/* The start every read callback shares: the request is back from the node;
 * answers a failed read, or one the server has no memory left to build.
 * Returns the request to answer, or NULL when it is answered already. */
static struct api_req *read_start(int status, void *data)
{
    struct api_req *req = data;
    req->submitted = false;
    if (status != 0) {
        api__respond_rc(req, status);
        return NULL;
    }
    if (http_overloaded(req->http)) {
        http_respond_overloaded(req->http); /* without building the answer */
        return NULL;
    }
    return req;
}

/* A get copies its value out on the node's loop up to this size; a larger
 * one is read in place under the state lock (so that 800 pipelined GETs of
 * a 1 MiB value do not hold the consensus loop for their copies and their
 * fresh pages: 280 ms turns, tests/overload slow-readers). */
#define GET_COPY_MAX (16u << 10)

/* On the node's loop (node_req.collect_cb): the item and its value copied
 * into the request, for get_read_cb on the client loop; or, for a value
 * over GET_COPY_MAX, declined. */
static void get_collect(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)status;
    struct api_req *req = data;
    req->got_rev = kv_sm_applied_index(sm);
    req->got_rc = kv_sm_get(sm, req->key, req->key_len, &req->got);
    if (req->got_rc != 0)
        return;
    size_t len = req->got.value_len;
    if (len > GET_COPY_MAX) {
        nreq->collect_cb = NULL; /* read in place, holding the lock */
        return;
    }
    req->got_value = len <= sizeof(req->val_room) ? req->val_room : tk_malloc(len);
    if (len > 0)
        memcpy(req->got_value, req->got.value, len);
    req->got.value = req->got_value;
    req->got.key = req->key;
}

/* A get's answer: read in place (sm, on the node's loop or holding the state
 * lock), or from what get_collect copied (sm NULL). */
static void get_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct api_req *req = read_start(status, data);
    if (req == NULL)
        return;
    struct kv_item it;
    int rc;
    uint64_t rev;
    if (sm != NULL) {
        rc = kv_sm_get(sm, req->key, req->key_len, &it);
        rev = kv_sm_applied_index(sm);
    } else {
        rc = req->got_rc;
        it = req->got;
        rev = req->got_rev;
    }
    if (rc != 0) {
        api__respond_rc(req, rc);
        return;
    }
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
    uint8_t *next; /* the first key not returned, when more */
    size_t next_len;
};

static int scan_stop_at(struct scan_state *s, const uint8_t *key, size_t len)
{
    s->more = true;
    s->next = tk_malloc(len + 1);
    memcpy(s->next, key, len);
    s->next_len = len;
    return 1;
}

/* An item joins the page unless the page has `limit` items or the item would
 * take it past `bytes_max` (a page holds at least one item): then it is the
 * page's `next`, and what it wrote is taken back. Nothing is built past the
 * page, so nothing built is thrown away. */
static int scan_item(const struct kv_item *it, void *data)
{
    struct scan_state *s = data;
    if (s->count == s->limit)
        return scan_stop_at(s, it->key, it->key_len);
    size_t mark = s->b.len;
    if (s->count)
        jbuf_adds(&s->b, ",");
    put_item(&s->b, it, s->b64);
    if (s->count > 0 && s->b.len > s->bytes_max) {
        s->b.len = mark;
        return scan_stop_at(s, it->key, it->key_len);
    }
    s->count++;
    return 0;
}

/* A scan's page: at most this much JSON (a quarter of the body limit, 1 MiB
 * at the defaults: building it costs the loop a few milliseconds). */
static size_t scan_page_bytes(const struct gateway *gw)
{
    return gw->cfg.body_max / 4;
}

/* The node's own records (membership, leases: keys whose first byte is
 * KV_RESERVED_BYTE) are left out of a scan unless it asks for them
 * (?internal=true, admin only with an auth file): the range is read in at
 * most two pieces, before and after them, so skipping them costs nothing. */
static const uint8_t reserved_lo[1] = {KV_RESERVED_BYTE};
static const uint8_t reserved_hi[1] = {KV_RESERVED_BYTE + 1};

static int key_cmp(const void *a, size_t alen, const void *b, size_t blen);

/* The scan's pieces into out[0..return). `succ` is room for a prefix's
 * successor (key_max + 1 bytes). */
static size_t scan_pieces(const struct api_req *req, uint8_t *succ,
                          struct kv_range out[2])
{
    struct kv_range r = {.start = req->key,
                         .start_len = req->key_len,
                         .end = req->key2,
                         .end_len = req->key2_len,
                         .by_prefix = req->by_prefix};
    if (req->internal) {
        out[0] = r;
        return 1;
    }
    if (r.by_prefix) { /* [prefix, its successor) */
        const uint8_t *p = r.start;
        size_t n = r.start_len;
        while (n > 0 && p[n - 1] == 0xff)
            n--;
        memcpy(succ, r.start, n);
        if (n > 0)
            succ[n - 1]++;
        r.by_prefix = false;
        r.end = succ;
        r.end_len = n;
    }
    size_t k = 0;
    bool unbounded = r.end_len == 0;
    if (key_cmp(r.start, r.start_len, reserved_lo, 1) < 0) {
        out[k] = r;
        if (unbounded || key_cmp(r.end, r.end_len, reserved_lo, 1) > 0) {
            out[k].end = reserved_lo;
            out[k].end_len = 1;
        }
        k++;
    }
    if (unbounded || key_cmp(r.end, r.end_len, reserved_hi, 1) > 0) {
        out[k] = r;
        if (key_cmp(r.start, r.start_len, reserved_hi, 1) < 0) {
            out[k].start = reserved_hi;
            out[k].start_len = 1;
        }
        k++;
    }
    return k;
}

/* A scan reads at most limit + 1 items and KV_SCAN_SKIP_MAX records that
 * give none (deleted or expired keys still held) per piece: past those it
 * stops with more and `next`, the key to go on from (start=next). A page
 * also ends at about scan_page_bytes of JSON: how much one answer may be is
 * known before it is built (http_would_overload is asked for that much, so
 * an answer is never built and then refused). */
static void scan_read_cb(struct node_req *nreq, int status, struct kv_sm *sm, void *data)
{
    (void)nreq;
    struct api_req *req = read_start(status, data);
    if (req == NULL)
        return;
    size_t page = scan_page_bytes(req->gw);
    if (http_would_overload(req->http, page)) {
        http_respond_overloaded(req->http);
        return;
    }
    struct scan_state s = {.limit = req->limit, .b64 = req->b64, .bytes_max = page};
    jbuf_init(&s.b, 256);
    jbuf_adds(&s.b, "{\"items\":[");
    size_t cap = req->gw->cfg.key_max;
    uint8_t *succ = tk_malloc(cap + 1);
    struct kv_range pieces[2];
    size_t n = scan_pieces(req, succ, pieces);
    struct kv_scan_stop stop = {.key = tk_malloc(cap + 1), .cap = cap};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0 && !s.more && !stop.stopped; i++)
        rc = kv_sm_scan_bounded(sm, &pieces[i], (size_t)(req->limit - s.count) + 1,
                                KV_SCAN_SKIP_MAX, scan_item, &s, &stop);
    tk_free(succ);
    if (rc == 0 && stop.stopped && s.next == NULL) {
        stop.key[stop.key_len++] = 0; /* just after the key read last */
        s.more = true;
        s.next = stop.key;
        s.next_len = stop.key_len;
        stop.key = NULL;
    }
    tk_free(stop.key);
    if (rc != 0) {
        jbuf_free(&s.b);
        tk_free(s.next);
        api__respond_rc(req, rc);
        return;
    }
    jbuf_printf(&s.b, "],\"count\":%u,\"more\":%s", s.count, s.more ? "true" : "false");
    if (s.next != NULL) {
        jbuf_adds(&s.b, ",");
        put_bytes(&s.b, "next", "next_encoding", s.next, s.next_len, req->b64);
    }
    jbuf_adds(&s.b, "}");
    tk_free(s.next);
    api__respond_json(req, &s.b, kv_sm_applied_index(sm));
    jbuf_free(&s.b);
}

void api__kv_get(struct api_req *req, const struct query *q)
{
    int cons;
    if (api__parse_consistency(req, q, &cons) != 0 || api__parse_encoding(req, q) != 0 ||
        api__parse_flag(req, q, QI_RAW, &req->raw) != 0)
        return;
    api__submit_read(req, cons, get_collect, get_read_cb);
}

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

/* The put's TTL and its condition: at most one of the three. */
static int put_finish(struct bctx *c, const struct put_args *a, Kvpb__Put *put,
                      Kvpb__Compare *cond)
{
    if ((int)a->has_ifv + (int)a->has_ifm + (int)a->if_absent > 1)
        return api__body_fail(
            c, 400, "give at most one of if_version, if_mod_revision, if_absent");
    if (a->ttl > API_TTL_MS_MAX)
        return api__body_fail(c, 400, "ttl_ms %llu is out of range (at most %llu)",
                              (unsigned long long)a->ttl, API_TTL_MS_MAX);
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

/* A PUT's command (api_build_fn): the value from the body (raw, or a JSON
 * object), the query's options and the body's. */
static int build_put(struct api_req *req, const struct api_build_args *args,
                     struct bctx *c, struct tk_blob **out, int *verdict)
{
    struct gateway *gw = req->gw;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    Kvpb__Compare cond = KVPB__COMPARE__INIT;
    put.key.data = req->key;
    put.key.len = req->key_len;
    put.lease = args->lease;
    struct put_args a = args->put;
    json_t *j = NULL;
    int rc = 0;
    if (req->http->json_body) {
        j = api__body_parse(req, c);
        rc = j == NULL ? TK_EINVAL : api__body_put(c, j, &a, &put.value);
    } else if (req->http->body_len > gw->cfg.value_max) {
        rc = api__body_fail(c, 413, "value of %zu bytes exceeds the limit of %zu",
                            req->http->body_len, gw->cfg.value_max);
    } else {
        put.value.data = req->http->body;
        put.value.len = req->http->body_len;
    }
    if (rc == 0)
        rc = put_finish(c, &a, &put, &cond);
    if (rc == 0) {
        cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
        cmd.put = &put;
        pack_checked(req, &cmd, out, verdict);
    }
    api__body_free(c, j);
    return rc;
}

/* A write built here, or on the thread pool when its body is large. */
static void write_from_body(struct api_req *req, int mode, api_build_fn *build,
                            const struct api_build_args *args)
{
    if (api__offload_wanted(req)) {
        api__offload(req, mode, build, args, on_write_done);
        return;
    }
    struct bctx c = {.req = req};
    struct tk_blob *cmd = NULL;
    int verdict = API_AUTH_OK;
    int rc = build(req, args, &c, &cmd, &verdict);
    api__write_built(req, mode, rc, &c, cmd, verdict, on_write_done);
}

void api__kv_put(struct api_req *req, const struct query *q)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0 || api__parse_encoding(req, q) != 0)
        return;
    struct api_build_args a = {0};
    if (put_args_from_query(req, q, &a.put) != 0 ||
        api__query_u64(req, q, QI_LEASE, &a.put.has_lease, &a.lease) != 0)
        return;
    write_from_body(req, mode, build_put, &a);
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
        if (api__parse_i64((const char *)q->val[QI_DELTA], q->len[QI_DELTA],
                           &inc.delta) != 0) {
            api__bad(req, "delta must be a decimal int64");
            return;
        }
    }
    if (req->http->body_len > 0) {
        struct bctx c = {.req = req};
        static const char *const names[] = {"delta", NULL};
        json_t *j = api__body_parse(req, &c);
        bool has;
        if (j == NULL || api__body_check_members(&c, j, "the body", names) != 0 ||
            api__body_get_i64(&c, j, "delta", &has, &inc.delta) != 0) {
            api__body_free(&c, j);
            api__body_respond(&c);
            return;
        }
        api__body_free(&c, j);
    }
    cmd.cmd_case = KVPB__COMMAND__CMD_INCR;
    cmd.incr = &inc;
    submit_write(req, &cmd, mode);
}

/* Scan bounds from the query: prefix, or start/end. */
void api__prefix_to_range(struct api_req *req)
{
    size_t n = req->key_len;
    while (n > 0 && req->key[n - 1] == 0xff)
        n--;
    req->by_prefix = false;
    tk_free(req->key2);
    req->key2 = NULL;
    req->key2_len = 0;
    if (n == 0)
        return;
    req->key2 = tk_malloc(n);
    memcpy(req->key2, req->key, n);
    req->key2[n - 1]++;
    req->key2_len = n;
}

/* Byte order, a prefix first: the order of keys. */
static int key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n > 0 ? memcmp(a, b, n) : 0; /* an empty key may be NULL */
    if (c != 0)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static uint8_t *query_dup(const struct query *q, int qi, size_t *len)
{
    uint8_t *p = tk_malloc(q->len[qi] + 1);
    memcpy(p, q->val[qi], q->len[qi]);
    *len = q->len[qi];
    return p;
}

int api__scan_bounds(struct api_req *req, const struct query *q)
{
    if ((q->present & Q_PREFIX) && (q->present & Q_END)) {
        api__bad(req, "give either prefix (and maybe start) or start/end, not both");
        return TK_EINVAL;
    }
    if (q->present & Q_PREFIX) {
        req->by_prefix = true;
        req->key = query_dup(q, QI_PREFIX, &req->key_len);
    } else {
        if (q->present & Q_START)
            req->key = query_dup(q, QI_START, &req->key_len);
        if (q->present & Q_END)
            req->key2 = query_dup(q, QI_END, &req->key2_len);
    }
    size_t slen = (q->present & Q_START) ? q->len[QI_START] : 0;
    if (req->key_len > req->gw->cfg.key_max || req->key2_len > req->gw->cfg.key_max ||
        slen > req->gw->cfg.key_max) {
        http_respond_error(req->http, 413, "too_large", NULL,
                           "a bound exceeds the key limit");
        return TK_EINVAL;
    }
    if (req->by_prefix && (q->present & Q_START)) {
        /* prefix and start: the prefix's keys from start on */
        api__prefix_to_range(req);
        if (key_cmp(q->val[QI_START], slen, req->key, req->key_len) > 0) {
            api__key_free(req);
            req->key = query_dup(q, QI_START, &req->key_len);
        }
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
    if (api__parse_flag(req, q, QI_INTERNAL, &req->internal) != 0)
        return;
    if (req->internal && !api__auth_admin(req))
        return;
    if (api__scan_bounds(req, q) != 0)
        return;
    api__submit_read(req, cons, NULL, scan_read_cb);
}

/* A batch's or a txn's command (api_build_fn), from its JSON body. */
static int build_batch_or_txn(struct api_req *req, const struct api_build_args *args,
                              struct bctx *c, struct tk_blob **out, int *verdict)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Batch batch = KVPB__BATCH__INIT;
    Kvpb__Txn t = KVPB__TXN__INIT;
    json_t *j = api__body_parse(req, c);
    int rc = j == NULL   ? TK_EINVAL
             : args->txn ? api__body_txn(c, j, &t)
                         : api__body_batch(c, j, &batch);
    if (rc == 0) {
        if (args->txn) {
            cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
            cmd.txn = &t;
        } else {
            cmd.cmd_case = KVPB__COMMAND__CMD_BATCH;
            cmd.batch = &batch;
        }
        pack_checked(req, &cmd, out, verdict);
    }
    api__body_free(c, j);
    return rc;
}

static void handle_batch_or_txn(struct api_req *req, const struct query *q, bool txn)
{
    int mode;
    if (api__parse_mode(req, q, &mode) != 0 || api__parse_encoding(req, q) != 0)
        return;
    struct api_build_args a = {.txn = txn};
    write_from_body(req, mode, build_batch_or_txn, &a);
}

void api__batch(struct api_req *req, const struct query *q)
{
    handle_batch_or_txn(req, q, false);
}

void api__txn(struct api_req *req, const struct query *q)
{
    handle_batch_or_txn(req, q, true);
}
