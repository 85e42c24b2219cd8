/* tierkv-fake-server: a tiny in-memory HTTP responder for the CLI's tests.
 *
 * It speaks just enough of tierkvd's v1 gateway (DESIGN.md) and of etcd's v3
 * JSON gateway (/v3/kv/put, /v3/kv/range) for the CLI and its bench to be
 * tested before, and independently of, the real gateway: keep-alive,
 * pipelined requests answered in order, a sorted in-memory key space with
 * versions and revisions, compare-on-version (409), 404s, 400 on bad JSON,
 * 413 above 1 MiB. With --follower-of HOST:PORT it plays a follower that knows
 * no data path: every /v1/kv, /v1/txn and /v1/batch request gets 503 with
 * X-Tierkv-Leader: 1 and X-Tierkv-Leader-Addr: HOST:PORT (as tierkvd does), which
 * exercises the CLI's leader chase. It is a test fixture, not a server: one thread, no
 * limits beyond the body.
 *
 * With --trivial it answers every request with a fixed 200 "{}" and keeps no
 * data: a floor server for measuring the load generator itself.
 *
 * With --delay-ms N every answer waits N ms first (the one thread sleeps, so
 * the requests of all connections queue behind each other): slow answers for
 * the bench's tail counts.
 *
 * Membership (GET/POST /v1/members): node 1 is a voter; an add of a new id
 * joins at once, an add of an id already there gets 409 change_pending (what
 * tierkvd answers a resent add). With --member-delay-ms N an add is answered
 * only after N ms (a slow catch-up). GET /v1/snapshot answers 200 with a real
 * backup file (kv/backup.h) of the fixture's keys, sealed as tierkvd seals
 * one; with ?local (tierkv snapshot save --local), bytes that are no
 * backup (the CLI must refuse them). With
 * --request-log F each request's "METHOD URL" line is appended to F as it arrives.
 *
 * Usage: tierkv-fake-server --port-file F [--follower-of HOST:PORT] [--id N]
 *        [--trivial] [--delay-ms N] [--member-delay-ms N] [--request-log F]
 * Binds 127.0.0.1 on an ephemeral port, writes it to F, runs until killed. */
#include <http_parser.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "cmd/tierkv/cli.h"
#include "kv/backup.h"

#define BODY_MAX (1u << 20)

struct entry {
    char *key;
    char *value;
    size_t value_len;
    long long version, create_rev, mod_rev;
};

static struct entry *kv;
static size_t n_kv, cap_kv;
static long long revision = 1;
static const char *follower_of;
static bool trivial; /* --trivial: a fixed 200 for everything (the client's ceiling) */
static int node_id = 1;
static long delay_ms; /* --delay-ms: each answer waits this long (the thread sleeps) */
static char self_addr[64];
static long member_delay_ms; /* --member-delay-ms: each POST /v1/members waits */
static FILE *request_log;    /* --request-log */

struct member {
    long long id;
    bool learner;
    char raft[64];
};
static struct member members[16] = {{1, false, "127.0.0.1:1"}};
static size_t n_members = 1;
static long long config_index = 1;

struct sconn {
    uv_tcp_t tcp;
    http_parser hp;
    char url[8192];
    size_t url_len;
    char field[64];
    size_t field_len;
    bool in_value;
    bool is_json;
    bool ctype_hdr;
    char *body;
    size_t body_len, body_cap;
    bool too_big;
};

struct wreq {
    uv_write_t req;
    char *buf;
};

/* ---- the key space ---- */

static size_t find(const char *key, bool *found)
{
    size_t lo = 0, hi = n_kv;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(kv[mid].key, key);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static struct entry *put(const char *key, const char *val, size_t len)
{
    bool found;
    size_t i = find(key, &found);
    if (!found) {
        if (n_kv == cap_kv) {
            cap_kv = cap_kv ? cap_kv * 2 : 64;
            kv = tk_realloc(kv, cap_kv * sizeof(*kv));
        }
        memmove(&kv[i + 1], &kv[i], (n_kv - i) * sizeof(*kv));
        n_kv++;
        kv[i] = (struct entry){.key = tk_strdup(key), .create_rev = revision + 1};
    }
    struct entry *e = &kv[i];
    tk_free(e->value);
    e->value = tk_malloc(len + 1);
    memcpy(e->value, val, len);
    e->value[len] = '\0';
    e->value_len = len;
    e->version++;
    e->mod_rev = ++revision;
    return e;
}

static json_t *entry_json(const struct entry *e, bool b64)
{
    json_t *v = b64 ? NULL : json_stringn(e->value, e->value_len);
    bool marked = !b64 && !v; /* not UTF-8: base64 with a marker, as the gateway does */
    if (b64 || marked) {
        char *enc = tk_malloc(tk_base64_encoded_len(e->value_len) + 1);
        tk_base64_encode(e->value, e->value_len, enc);
        v = json_string(enc);
        tk_free(enc);
    }
    json_t *k = json_string(e->key);
    if (b64) {
        char *enc = tk_malloc(tk_base64_encoded_len(strlen(e->key)) + 1);
        tk_base64_encode(e->key, strlen(e->key), enc);
        json_decref(k);
        k = json_string(enc);
        tk_free(enc);
    }
    json_t *out =
        json_pack("{s:o,s:o,s:I,s:I,s:I}", "key", k, "value", v, "version",
                  (json_int_t)e->version, "create_revision", (json_int_t)e->create_rev,
                  "mod_revision", (json_int_t)e->mod_rev);
    if (marked)
        json_object_set_new(out, "encoding", json_string("base64"));
    return out;
}

/* ---- responses ---- */

static void on_written(uv_write_t *req, int status)
{
    (void)status;
    struct wreq *w = (struct wreq *)req;
    tk_free(w->buf);
    tk_free(w);
}

static void respond(struct sconn *c, int status, json_t *body, const char *extra_hdr)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    size_t blen = text ? strlen(text) : 0;
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : "Error";
    size_t cap = blen + 512 + (extra_hdr ? strlen(extra_hdr) : 0);
    struct wreq *w = tk_malloc(sizeof(*w));
    w->buf = tk_malloc(cap);
    int n = snprintf(w->buf, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "X-Tierkv-Revision: %lld\r\n%sContent-Length: %zu\r\n\r\n%s",
                     status, reason, revision, extra_hdr ? extra_hdr : "", blen,
                     text ? text : "");
    free(text);
    uv_buf_t b = uv_buf_init(w->buf, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        tk_free(w->buf);
        tk_free(w);
    }
}

static void respond_error(struct sconn *c, int status, const char *code, const char *msg,
                          const char *extra)
{
    respond(c, status, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg),
            extra);
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Decodes %XX (and '+' in queries) in place; false on a bad escape or NUL. */
static bool url_decode(char *s, bool plus)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%') {
            int a = hexval(p[1]), b = a >= 0 ? hexval(p[2]) : -1;
            if (a < 0 || b < 0 || (a == 0 && b == 0))
                return false;
            *o++ = (char)(a * 16 + b);
            p += 2;
        } else {
            *o++ = plus && *p == '+' ? ' ' : *p;
        }
    }
    *o = '\0';
    return true;
}

/* The decoded value of query parameter `name`, or NULL. */
static bool query_param(const char *query, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = query; p && *p;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > n && strncmp(p, name, n) == 0 && p[n] == '=') {
            size_t vl = len - n - 1 < cap - 1 ? len - n - 1 : cap - 1;
            memcpy(out, p + n + 1, vl);
            out[vl] = '\0';
            return url_decode(out, true);
        }
        if (len == n && strncmp(p, name, n) == 0) {
            out[0] = '\0';
            return true;
        }
        p = amp ? amp + 1 : NULL;
    }
    return false;
}

static void handle_etcd(struct sconn *c, const char *path)
{
    json_t *j = json_loadb(c->body ? c->body : "", c->body_len, 0, NULL);
    const char *k64 = json_string_value(json_object_get(j, "key"));
    unsigned char key[1024];
    long kl = k64 ? tk_base64_decode(k64, strlen(k64), key, sizeof(key) - 1) : -1;
    if (kl <= 0) {
        json_decref(j);
        respond_error(c, 400, "bad_request", "key must be base64", NULL);
        return;
    }
    key[kl] = '\0';
    json_t *hdr = json_pack("{s:s}", "revision", "1");
    if (strcmp(path, "/v3/kv/put") == 0) {
        const char *v64 = json_string_value(json_object_get(j, "value"));
        size_t vl64 = v64 ? strlen(v64) : 0;
        unsigned char *val = tk_malloc(vl64 + 1);
        long vl = tk_base64_decode(v64 ? v64 : "", vl64, val, vl64);
        if (vl < 0) {
            tk_free(val);
            json_decref(j);
            json_decref(hdr);
            respond_error(c, 400, "bad_request", "value must be base64", NULL);
            return;
        }
        put((char *)key, (char *)val, (size_t)vl);
        tk_free(val);
        respond(c, 200, json_pack("{s:o}", "header", hdr), NULL);
    } else {
        bool found;
        size_t i = find((char *)key, &found);
        json_t *out = json_pack("{s:o}", "header", hdr);
        if (found) {
            char *v64 = tk_malloc(tk_base64_encoded_len(kv[i].value_len) + 1);
            tk_base64_encode(kv[i].value, kv[i].value_len, v64);
            json_object_set_new(out, "kvs",
                                json_pack("[{s:s,s:s}]", "key", k64, "value", v64));
            json_object_set_new(out, "count", json_string("1"));
            tk_free(v64);
        }
        respond(c, 200, out, NULL);
    }
    json_decref(j);
}

static void put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* GET /v1/snapshot: the keys as a snapshot stream (kv/backup.c's comment has
 * the layout) in a sealed backup file; bad: bytes that are no backup. */
static void handle_snapshot(struct sconn *c, bool bad)
{
    size_t len = 32 + 13;
    for (size_t i = 0; i < n_kv; i++)
        len += 9 + strlen(kv[i].key) + kv[i].value_len;
    size_t total = KV_BACKUP_HEADER_BYTES + len + KV_BACKUP_TRAILER_BYTES;
    uint8_t *file = tk_malloc(total), *s = file + KV_BACKUP_HEADER_BYTES;
    memset(s, 0, 32);
    memcpy(s, "TKVSNAP1", 8);
    put_be(s + 8, (uint64_t)revision, 8);
    put_be(s + 16, 2, 8);
    size_t off = 32;
    for (size_t i = 0; i < n_kv; i++) {
        size_t kl = strlen(kv[i].key);
        s[off] = 1;
        put_be(s + off + 1, kl, 4);
        put_be(s + off + 5, kv[i].value_len, 4);
        memcpy(s + off + 9, kv[i].key, kl);
        memcpy(s + off + 9 + kl, kv[i].value, kv[i].value_len);
        off += 9 + kl + kv[i].value_len;
    }
    s[off] = 0xFF;
    put_be(s + off + 1, n_kv, 8);
    put_be(s + off + 9, tk_crc32c(0, s, off + 9), 4);
    char err[160];
    if (bad)
        memset(file, 'x', total);
    else if (kv_backup_seal(s, len, 42, 0, file, s + len, NULL, err, sizeof(err)) != 0) {
        tk_free(file);
        respond_error(c, 500, "internal", err, NULL);
        return;
    }
    struct wreq *w = tk_malloc(sizeof(*w));
    w->buf = tk_malloc(total + 256);
    int n = snprintf(w->buf, 256,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     total);
    memcpy(w->buf + n, file, total);
    tk_free(file);
    uv_buf_t b = uv_buf_init(w->buf, (unsigned)(n + total));
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        tk_free(w->buf);
        tk_free(w);
    }
}

/* GET and POST /v1/members (see the top of the file). */
static void handle_members(struct sconn *c, unsigned method)
{
    if (method == HTTP_GET) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n_members; i++)
            json_array_append_new(
                arr, json_pack("{s:I,s:s,s:s,s:s,s:b}", "id", (json_int_t)members[i].id,
                               "role", members[i].learner ? "learner" : "voter", "raft",
                               members[i].raft, "http", "-", "leader", i == 0));
        respond(c, 200,
                json_pack("{s:o,s:I,s:b}", "members", arr, "config_index",
                          (json_int_t)config_index, "committed", 1),
                NULL);
        return;
    }
    json_t *j = json_loadb(c->body ? c->body : "", c->body_len, 0, NULL);
    json_t *id = json_object_get(j, "id");
    const char *raft = json_string_value(json_object_get(j, "raft"));
    if (!json_is_integer(id) || raft == NULL || n_members == 16) {
        json_decref(j);
        respond_error(c, 400, "bad_request", "id and raft are required", NULL);
        return;
    }
    for (size_t i = 0; i < n_members; i++) {
        if (members[i].id == json_integer_value(id)) {
            json_decref(j);
            respond_error(c, 409, "change_pending", "a membership change is in progress",
                          NULL);
            return;
        }
    }
    struct member *m = &members[n_members++];
    m->id = json_integer_value(id);
    m->learner = json_is_true(json_object_get(j, "learner"));
    snprintf(m->raft, sizeof(m->raft), "%s", raft);
    json_decref(j);
    config_index++;
    if (member_delay_ms > 0) { /* the change is in force; the answer is late */
        struct timespec ts = {member_delay_ms / 1000, (member_delay_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    respond(c, 200, json_pack("{s:s}", "message", "added"), NULL);
}

static void handle(struct sconn *c)
{
    if (delay_ms > 0) {
        struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    if (trivial) {
        static const char canned[] =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\n\r\n{}";
        struct wreq *w = tk_malloc(sizeof(*w));
        w->buf = NULL;
        uv_buf_t b = uv_buf_init((char *)canned, sizeof(canned) - 1);
        if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0)
            tk_free(w);
        return;
    }
    unsigned method = c->hp.method;
    char *url = c->url;
    if (request_log != NULL) {
        fprintf(request_log, "%s %s\n", http_method_str((enum http_method)method), url);
        fflush(request_log);
    }
    char *query = strchr(url, '?');
    if (query)
        *query++ = '\0';
    char param[1024];
    bool b64 = query_param(query, "encoding", param, sizeof(param)) &&
               strcmp(param, "base64") == 0;
    if (c->too_big) {
        respond_error(c, 413, "too_large", "body too large", NULL);
        return;
    }
    if (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0) {
        respond(c, 200, json_pack("{s:b}", "ok", 1), NULL);
        return;
    }
    if (strcmp(url, "/v1/cluster") == 0) {
        char leader_addr[64];
        snprintf(leader_addr, sizeof(leader_addr), "%s",
                 follower_of ? follower_of : self_addr);
        respond(c, 200,
                json_pack("{s:i,s:s,s:i,s:i,s:I,s:I,s:[{s:i,s:s},{s:i,s:s}]}", "id",
                          node_id, "role", follower_of ? "follower" : "leader", "leader",
                          follower_of ? 1 : node_id, "term", 2, "commit_index",
                          (json_int_t)revision, "applied_index", (json_int_t)revision,
                          "members", "id", 1, "http", leader_addr, "id", 2, "http",
                          "127.0.0.1:1"),
                NULL);
        return;
    }
    if (strcmp(url, "/v1/members") == 0) {
        handle_members(c, method);
        return;
    }
    if (strcmp(url, "/v1/snapshot") == 0) {
        handle_snapshot(c, query != NULL && strstr(query, "local") != NULL);
        return;
    }
    if (strncmp(url, "/v3/kv/", 7) == 0 && method == HTTP_POST) {
        handle_etcd(c, url);
        return;
    }
    bool data_path = strncmp(url, "/v1/kv", 6) == 0 || strcmp(url, "/v1/txn") == 0 ||
                     strcmp(url, "/v1/batch") == 0;
    if (data_path && follower_of) {
        /* Like tierkvd: the leader's id, and its HTTP address beside it. */
        char hdr[256];
        snprintf(hdr, sizeof(hdr),
                 "X-Tierkv-Leader: 1\r\nX-Tierkv-Leader-Addr: %s\r\nRetry-After: 1\r\n",
                 follower_of);
        respond_error(c, 503, "not_leader", "this node is a follower", hdr);
        return;
    }
    if (strcmp(url, "/v1/kv") == 0 && method == HTTP_GET) {
        char prefix[1024] = "", limit_s[32] = "";
        query_param(query, "prefix", prefix, sizeof(prefix));
        query_param(query, "limit", limit_s, sizeof(limit_s));
        long limit = limit_s[0] ? atol(limit_s) : 1000;
        json_t *arr = json_array();
        bool more = false;
        size_t plen = strlen(prefix);
        for (size_t i = 0; i < n_kv; i++) {
            if (strncmp(kv[i].key, prefix, plen) != 0)
                continue;
            if ((long)json_array_size(arr) == limit) {
                more = true;
                break;
            }
            json_array_append_new(arr, entry_json(&kv[i], b64));
        }
        respond(c, 200,
                json_pack("{s:o,s:I,s:b}", "items", arr, "count",
                          (json_int_t)json_array_size(arr), "more", more),
                NULL);
        return;
    }
    if (strcmp(url, "/v1/txn") == 0 || strcmp(url, "/v1/batch") == 0) {
        json_t *j = json_loadb(c->body ? c->body : "", c->body_len, 0, NULL);
        if (!json_is_object(j)) {
            json_decref(j);
            respond_error(c, 400, "bad_json", "body is not a JSON object", NULL);
            return;
        }
        /* The fixture's txn "compares" succeed unless the body says otherwise. */
        bool ok = !json_is_true(json_object_get(j, "fake_fail"));
        json_decref(j);
        revision++;
        if (url[4] == 't')
            respond(c, 200,
                    json_pack("{s:b,s:I,s:[{s:s}]}", "succeeded", ok, "revision",
                              (json_int_t)revision, "responses", "op", "put"),
                    NULL);
        else
            respond(c, 200, json_pack("{s:I}", "revision", (json_int_t)revision), NULL);
        return;
    }
    if (strncmp(url, "/v1/kv/", 7) != 0 || !url[7]) {
        respond_error(c, 404, "no_route", "no such route", NULL);
        return;
    }
    char *key = url + 7;
    size_t klen = strlen(key);
    bool incr = klen > 5 && strcmp(key + klen - 5, "/incr") == 0 && method == HTTP_POST;
    if (incr)
        key[klen - 5] = '\0';
    if (!url_decode(key, false)) {
        respond_error(c, 400, "bad_key", "bad URL encoding", NULL);
        return;
    }
    bool found;
    size_t i = find(key, &found);
    if (incr) {
        json_t *j = json_loadb(c->body ? c->body : "", c->body_len, 0, NULL);
        json_t *d = json_object_get(j, "delta");
        long long delta = json_is_integer(d) ? json_integer_value(d) : 1;
        json_decref(j);
        long long cur = found ? atoll(kv[i].value) : 0;
        char num[32];
        int n = snprintf(num, sizeof(num), "%lld", cur + delta);
        struct entry *e = put(key, num, (size_t)n);
        respond(c, 200, entry_json(e, false), NULL);
        return;
    }
    switch (method) {
    case HTTP_GET:
        if (!found)
            respond_error(c, 404, "not_found", "key not found", NULL);
        else
            respond(c, 200, entry_json(&kv[i], b64), NULL);
        return;
    case HTTP_DELETE:
        if (!found) {
            respond(
                c, 200,
                json_pack("{s:i,s:I}", "deleted", 0, "revision", (json_int_t)revision),
                NULL);
            return;
        }
        tk_free(kv[i].key);
        tk_free(kv[i].value);
        memmove(&kv[i], &kv[i + 1], (n_kv - i - 1) * sizeof(*kv));
        n_kv--;
        revision++;
        respond(c, 200,
                json_pack("{s:i,s:I}", "deleted", 1, "revision", (json_int_t)revision),
                NULL);
        return;
    case HTTP_PUT: {
        const char *val = c->body ? c->body : "";
        size_t vlen = c->body_len;
        json_t *j = NULL;
        if (c->is_json) {
            json_error_t jerr;
            j = json_loadb(val, vlen, 0, &jerr);
            json_t *v = json_object_get(j, "value");
            if (!json_is_string(v)) {
                json_decref(j);
                respond_error(c, 400, "bad_json", "want {\"value\": string}", NULL);
                return;
            }
            json_t *ifv = json_object_get(j, "if_version");
            long long have = found ? kv[i].version : 0;
            if (json_is_integer(ifv) && json_integer_value(ifv) != have) {
                json_decref(j);
                respond_error(c, 409, "compare_failed", "version mismatch", NULL);
                return;
            }
            val = json_string_value(v);
            vlen = json_string_length(v);
        }
        struct entry *e = put(key, val, vlen);
        json_decref(j);
        respond(c, 200, entry_json(e, false), NULL);
        return;
    }
    default:
        respond_error(c, 405, "method_not_allowed", "method not allowed", NULL);
    }
}

/* ---- HTTP plumbing ---- */

static int on_url(http_parser *hp, const char *at, size_t len)
{
    struct sconn *c = hp->data;
    if (c->url_len + len >= sizeof(c->url))
        return 1;
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    c->url[c->url_len] = '\0';
    return 0;
}

static int on_hfield(http_parser *hp, const char *at, size_t len)
{
    struct sconn *c = hp->data;
    if (c->in_value) {
        c->in_value = false;
        c->field_len = 0;
    }
    size_t n = len < sizeof(c->field) - 1 - c->field_len
                   ? len
                   : sizeof(c->field) - 1 - c->field_len;
    memcpy(c->field + c->field_len, at, n);
    c->field_len += n;
    c->field[c->field_len] = '\0';
    return 0;
}

static int on_hvalue(http_parser *hp, const char *at, size_t len)
{
    struct sconn *c = hp->data;
    if (!c->in_value) {
        c->in_value = true;
        c->ctype_hdr = strcasecmp(c->field, "Content-Type") == 0;
        if (c->ctype_hdr)
            c->is_json = len >= 16 && strncasecmp(at, "application/json", 16) == 0;
    }
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct sconn *c = hp->data;
    if (c->body_len + len > BODY_MAX) {
        c->too_big = true;
        return 0;
    }
    if (c->body_len + len + 1 > c->body_cap) {
        c->body_cap = (c->body_len + len + 1) * 2;
        c->body = tk_realloc(c->body, c->body_cap);
    }
    memcpy(c->body + c->body_len, at, len);
    c->body_len += len;
    c->body[c->body_len] = '\0';
    return 0;
}

static int on_begin(http_parser *hp)
{
    struct sconn *c = hp->data;
    c->url_len = 0;
    c->url[0] = '\0';
    c->body_len = 0;
    c->is_json = false;
    c->too_big = false;
    c->in_value = false;
    c->field_len = 0;
    return 0;
}

static int on_complete(http_parser *hp)
{
    handle(hp->data);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_begin,
    .on_url = on_url,
    .on_header_field = on_hfield,
    .on_header_value = on_hvalue,
    .on_body = on_body,
    .on_message_complete = on_complete,
};

static void on_closed(uv_handle_t *h)
{
    struct sconn *c = h->data;
    tk_free(c->body);
    tk_free(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    buf->base = tk_malloc(hint);
    buf->len = hint;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct sconn *c = s->data;
    if (nread > 0) {
        size_t n = http_parser_execute(&c->hp, &settings, buf->base, (size_t)nread);
        if (n != (size_t)nread || HTTP_PARSER_ERRNO(&c->hp) != HPE_OK) {
            respond_error(c, 400, "bad_http", "malformed request",
                          "Connection: close\r\n");
            uv_read_stop(s);
            uv_close((uv_handle_t *)s, on_closed);
        }
    } else if (nread < 0) {
        uv_close((uv_handle_t *)s, on_closed);
    }
    tk_free(buf->base);
}

static void on_conn(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    struct sconn *c = tk_calloc(1, sizeof(*c));
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->hp, HTTP_REQUEST);
    c->hp.data = c;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

int main(int argc, char **argv)
{
    const char *port_file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port-file") == 0 && i + 1 < argc)
            port_file = argv[++i];
        else if (strcmp(argv[i], "--follower-of") == 0 && i + 1 < argc)
            follower_of = argv[++i];
        else if (strcmp(argv[i], "--trivial") == 0)
            trivial = true;
        else if (strcmp(argv[i], "--id") == 0 && i + 1 < argc)
            node_id = atoi(argv[++i]);
        else if (strcmp(argv[i], "--delay-ms") == 0 && i + 1 < argc)
            delay_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--member-delay-ms") == 0 && i + 1 < argc)
            member_delay_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--request-log") == 0 && i + 1 < argc) {
            request_log = fopen(argv[++i], "a");
            if (request_log == NULL) {
                fprintf(stderr, "tierkv-fake-server: cannot open %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: tierkv-fake-server --port-file F [--follower-of H:P] "
                            "[--id N] [--trivial] [--delay-ms N] [--member-delay-ms N] "
                            "[--request-log F]\n");
            return 2;
        }
    }
    if (!port_file) {
        fprintf(stderr, "tierkv-fake-server: --port-file is required\n");
        return 2;
    }
    uv_loop_t *loop = uv_default_loop();
    uv_tcp_t server;
    uv_tcp_init(loop, &server);
    struct sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", 0, &addr);
    if (uv_tcp_bind(&server, (const struct sockaddr *)&addr, 0) != 0 ||
        uv_listen((uv_stream_t *)&server, 1024, on_conn) != 0) {
        fprintf(stderr, "tierkv-fake-server: cannot listen\n");
        return 1;
    }
    struct sockaddr_in bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&server, (struct sockaddr *)&bound, &blen);
    snprintf(self_addr, sizeof(self_addr), "127.0.0.1:%d", ntohs(bound.sin_port));
    /* Write then rename, so a reader never sees a partial file. */
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", ntohs(bound.sin_port)) < 0 || fclose(f) != 0 ||
        rename(tmp, port_file) != 0) {
        fprintf(stderr, "tierkv-fake-server: cannot write %s\n", port_file);
        return 1;
    }
    return uv_run(loop, UV_RUN_DEFAULT);
}
