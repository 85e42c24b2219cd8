/* Bearer tokens for the HTTP API (--auth-file) and the namespace of the
 * Idempotency-Key.
 *
 * The file, one user a line ('#' starts a comment):
 *
 *     NAME  sha256:HEX64  RIGHT...
 *
 * HEX64 is the SHA-256 of the user's token (`printf %s "$TOKEN" | sha256sum`;
 * the token itself is never stored). A RIGHT is `read:PREFIX` (read keys that
 * start with PREFIX), `write:PREFIX` (read and write them; an empty PREFIX is
 * every key) or `admin` (everything, and what only an admin may do: delete
 * the whole key space, the debug digest, membership and snapshots). PREFIX is
 * literal bytes without blanks, or %XX escapes for any byte.
 *
 * A request names its user with "Authorization: Bearer TOKEN": none, or an
 * unknown token, is 401 (with WWW-Authenticate); a right it lacks is 403.
 * /healthz and /readyz stay open for probes. Every user may read /v1/cluster,
 * /metrics and /ui. Any other route that is not a key route (the digest, and
 * routes added later, such as membership or snapshots) needs admin until
 * api__auth_route gives it a rule.
 *
 * Where the checks run: api.c authenticates a routed request before its
 * handler (api__auth_route); api_reply.c checks a read's key or range when
 * it is submitted (api__auth_read); api_kv.c checks every key of a write
 * command before packing it (api__auth_command) and takes its exactly-once
 * id from api__auth_client_id. This file calls only http.c. */
#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

#define AUTH_USERS_MAX 1024
#define AUTH_RIGHTS_MAX 32
#define AUTH_NAME_MAX 64
#define AUTH_LINE_MAX 4096

struct auth_right {
    uint8_t *prefix;
    size_t len;
    bool write;
};

struct api_user {
    char name[AUTH_NAME_MAX];
    uint8_t hash[32];
    bool admin;
    uint32_t n_rights;
    struct auth_right rights[AUTH_RIGHTS_MAX];
};

struct gateway_auth {
    uint32_t n_users;
    struct api_user *users;
};

/* ---- the file --------------------------------------------------------- */

static int hexval(int ch)
{
    return isdigit(ch) ? ch - '0' : isxdigit(ch) ? tolower(ch) - 'a' + 10 : -1;
}

/* A PREFIX with %XX escapes into a new buffer. */
static int parse_prefix(const char *s, struct auth_right *r)
{
    size_t n = strlen(s), out = 0;
    r->prefix = tk_malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            r->prefix[out++] = (uint8_t)s[i];
            continue;
        }
        if (i + 2 >= n || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0)
            return TK_EINVAL;
        r->prefix[out++] = (uint8_t)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
        i += 2;
    }
    r->len = out;
    return 0;
}

static int parse_right(struct api_user *u, const char *w)
{
    if (strcmp(w, "admin") == 0) {
        u->admin = true;
        return 0;
    }
    bool write = strncmp(w, "write:", 6) == 0;
    if (!write && strncmp(w, "read:", 5) != 0)
        return TK_EINVAL;
    if (u->n_rights == AUTH_RIGHTS_MAX)
        return TK_ETOOBIG;
    struct auth_right *r = &u->rights[u->n_rights++];
    r->write = write;
    return parse_prefix(w + (write ? 6 : 5), r);
}

static int parse_hash(const char *w, uint8_t *out)
{
    if (strncmp(w, "sha256:", 7) != 0 || strlen(w + 7) != 64)
        return TK_EINVAL;
    for (int i = 0; i < 32; i++) {
        int hi = hexval(w[7 + 2 * i]), lo = hexval(w[8 + 2 * i]);
        if (hi < 0 || lo < 0)
            return TK_EINVAL;
        out[i] = (uint8_t)(hi * 16 + lo);
    }
    return 0;
}

/* One non-blank, non-comment line into a new user. */
static int parse_line(struct gateway_auth *a, char *line, char *err, size_t cap)
{
    char *save = NULL;
    char *name = strtok_r(line, " \t", &save);
    char *hash = strtok_r(NULL, " \t", &save);
    if (hash == NULL) {
        snprintf(err, cap, "want NAME sha256:HEX64 RIGHT...");
        return TK_EINVAL;
    }
    if (strlen(name) >= AUTH_NAME_MAX) {
        snprintf(err, cap, "user name over %d bytes", AUTH_NAME_MAX - 1);
        return TK_EINVAL;
    }
    for (uint32_t i = 0; i < a->n_users; i++)
        if (strcmp(a->users[i].name, name) == 0) {
            snprintf(err, cap, "user \"%s\" appears twice", name);
            return TK_EINVAL;
        }
    if (a->n_users == AUTH_USERS_MAX) {
        snprintf(err, cap, "more than %d users", AUTH_USERS_MAX);
        return TK_EINVAL;
    }
    struct api_user *u = &a->users[a->n_users++];
    snprintf(u->name, sizeof(u->name), "%s", name);
    if (parse_hash(hash, u->hash) != 0) {
        snprintf(err, cap, "the token hash must be sha256: and 64 hex digits");
        return TK_EINVAL;
    }
    for (char *w; (w = strtok_r(NULL, " \t", &save)) != NULL;)
        if (parse_right(u, w) != 0) {
            snprintf(err, cap,
                     "bad right \"%.64s\" (want read:PREFIX, write:PREFIX or admin; at "
                     "most %d)",
                     w, AUTH_RIGHTS_MAX);
            return TK_EINVAL;
        }
    if (!u->admin && u->n_rights == 0) {
        snprintf(err, cap, "user \"%s\" has no right", name);
        return TK_EINVAL;
    }
    return 0;
}

int gateway_auth_load(const char *path, struct gateway_auth **out, char *err,
                      size_t err_cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, err_cap, "cannot open \"%s\": %s", path, strerror(errno));
        return TK_EINVAL;
    }
    struct gateway_auth *a = tk_calloc(1, sizeof(*a));
    a->users = tk_calloc(AUTH_USERS_MAX, sizeof(*a->users));
    char line[AUTH_LINE_MAX], why[200];
    int rc = 0, lineno = 0;
    while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
            snprintf(why, sizeof(why), "line over %d bytes", AUTH_LINE_MAX - 2);
            rc = TK_EINVAL;
            break;
        }
        line[strcspn(line, "#\r\n")] = 0;
        if (strspn(line, " \t") == strlen(line))
            continue;
        rc = parse_line(a, line, why, sizeof(why));
    }
    fclose(f);
    if (rc == 0 && a->n_users == 0) {
        snprintf(why, sizeof(why), "no user");
        rc = TK_EINVAL;
    }
    if (rc != 0) {
        snprintf(err, err_cap, "%s:%d: %s", path, lineno, why);
        gateway_auth_free(a);
        return TK_EINVAL;
    }
    *out = a;
    return 0;
}

void gateway_auth_free(struct gateway_auth *a)
{
    if (a == NULL)
        return;
    for (uint32_t i = 0; i < a->n_users; i++)
        for (uint32_t k = 0; k < a->users[i].n_rights; k++)
            tk_free(a->users[i].rights[k].prefix);
    tk_free(a->users);
    tk_free(a);
}

/* ---- checks ------------------------------------------------------------- */

/* SHA-256 of a, or of a | 0 | b when b is not NULL. */
static void sha256(const void *a, size_t alen, const void *b, size_t blen, uint8_t *out)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
        EVP_DigestUpdate(ctx, a, alen) != 1 ||
        (b != NULL &&
         (EVP_DigestUpdate(ctx, "", 1) != 1 || EVP_DigestUpdate(ctx, b, blen) != 1)) ||
        EVP_DigestFinal_ex(ctx, out, NULL) != 1)
        TK_UNREACHABLE(); /* SHA-256 in memory cannot fail */
    EVP_MD_CTX_free(ctx);
}

const struct api_user *gateway_auth_user(const struct gateway_auth *a, const void *token,
                                         size_t len)
{
    if (len == 0)
        return NULL;
    uint8_t hash[32];
    sha256(token, len, NULL, 0, hash);
    const struct api_user *found = NULL;
    for (uint32_t i = 0; i < a->n_users; i++)
        if (CRYPTO_memcmp(a->users[i].hash, hash, sizeof(hash)) == 0)
            found = &a->users[i];
    return found;
}

const char *gateway_auth_name(const struct api_user *u)
{
    return u->name;
}

bool gateway_auth_admin(const struct api_user *u)
{
    return u->admin;
}

/* The user the request's bearer token names, or NULL. Every user's hash is
 * compared in constant time, so the answer's timing says nothing of which
 * bytes matched. */
static const struct api_user *authenticate(const struct gateway_auth *a,
                                           const struct http_request *h)
{
    if (h->kept == NULL || h->kept_len < 7 || strncasecmp(h->kept, "Bearer ", 7) != 0)
        return NULL;
    const char *tok = h->kept + 7;
    while (*tok == ' ')
        tok++;
    size_t len = strlen(tok);
    while (len > 0 && tok[len - 1] == ' ')
        len--;
    return gateway_auth_user(a, tok, len);
}

static bool has_prefix(const uint8_t *s, size_t len, const struct auth_right *r)
{
    return len >= r->len && memcmp(s, r->prefix, r->len) == 0;
}

/* Is end <= the first key after every key with r's prefix (r not empty)? */
static bool end_within(const uint8_t *end, size_t elen, const struct auth_right *r)
{
    size_t n = r->len;
    while (n > 0 && r->prefix[n - 1] == 0xff)
        n--;
    if (n == 0)
        return false; /* a prefix of 0xff bytes only: no key bounds it */
    /* The bound: prefix[0..n-1) and then prefix[n-1] + 1. */
    for (size_t i = 0; i < n; i++) {
        if (i == elen)
            return true; /* end is a proper prefix of the bound */
        uint8_t b = i < n - 1 ? r->prefix[i] : (uint8_t)(r->prefix[i] + 1);
        if (end[i] != b)
            return end[i] < b;
    }
    return elen == n;
}

/* May u touch [start, end) (end_len 0: no end), or every key with a prefix
 * (by_prefix: start is the prefix), reading or writing? */
static bool may(const struct api_user *u, bool write, const uint8_t *start, size_t slen,
                const uint8_t *end, size_t elen, bool by_prefix, bool single)
{
    if (u->admin)
        return true;
    for (uint32_t i = 0; i < u->n_rights; i++) {
        const struct auth_right *r = &u->rights[i];
        if ((write && !r->write) || !has_prefix(start, slen, r))
            continue;
        if (single || by_prefix || r->len == 0)
            return true;
        if (elen > 0 && end_within(end, elen, r))
            return true;
    }
    return false;
}

bool gateway_auth_may(const struct api_user *u, bool write, const uint8_t *start,
                      size_t slen, const uint8_t *end, size_t elen)
{
    if (elen == 1 && end[0] == 0) /* from start on: no end bounds it */
        return may(u, write, start, slen, NULL, 0, false, false);
    return may(u, write, start, slen, end, elen, false, elen == 0);
}

static void respond_401(struct api_req *req)
{
    req->gw->auth_denied++;
    http_respond_error(req->http, 401, "unauthorized",
                       "WWW-Authenticate: Bearer realm=\"tierkv\"\r\n", "%s",
                       req->http->kept_too_long ? "the Authorization header is too long"
                                                : "a valid bearer token is required "
                                                  "(Authorization: Bearer TOKEN)");
}

static void respond_403(struct api_req *req, const char *what)
{
    req->gw->auth_denied++;
    http_respond_error(req->http, 403, "forbidden", NULL, "user \"%s\" may not %s",
                       req->user->name, what);
}

int api__auth_route(struct api_req *req)
{
    const struct gateway_auth *a = req->gw->cfg.auth;
    if (a == NULL || req->route == ROUTE_HEALTHZ || req->route == ROUTE_READYZ)
        return 0;
    req->user = authenticate(a, req->http);
    if (req->user == NULL) {
        respond_401(req);
        return TK_EINVAL;
    }
    switch (req->route) {
    case ROUTE_KV_GET:
    case ROUTE_KV_PUT:
    case ROUTE_KV_DELETE:
    case ROUTE_KV_SCAN:
    case ROUTE_KV_DELETE_RANGE:
    case ROUTE_KV_INCR:
    case ROUTE_BATCH:
    case ROUTE_TXN:
        return 0; /* their keys are checked at submission */
    case ROUTE_WATCH:
        return 0; /* its range is checked once parsed (api__auth_watch) */
    case ROUTE_CLUSTER:
    case ROUTE_METRICS:
    case ROUTE_UI:
        return 0; /* any user */
    default:
        /* The digest of every key, and any route not named above (members,
         * snapshots...): admin only, so a new route is closed until it is
         * given a rule here. */
        if (req->user->admin)
            return 0;
        respond_403(req, "use this route (admin only)");
        return TK_EINVAL;
    }
}

int api__auth_watch(struct api_req *req, const uint8_t *start, size_t start_len,
                    const uint8_t *end, size_t end_len, bool by_prefix, bool single)
{
    if (req->user == NULL ||
        may(req->user, false, start, start_len, end, end_len, by_prefix, single))
        return 0;
    respond_403(req, single ? "watch this key" : "watch this range");
    return TK_EINVAL;
}

bool api__auth_admin(struct api_req *req)
{
    if (req->user == NULL || req->user->admin)
        return true;
    respond_403(req, "read the node's own records (admin only)");
    return false;
}

int api__auth_read(struct api_req *req)
{
    if (req->user == NULL || (req->route != ROUTE_KV_GET && req->route != ROUTE_KV_SCAN))
        return 0;
    bool single = req->route == ROUTE_KV_GET;
    if (may(req->user, false, req->key, req->key_len, req->key2, req->key2_len,
            req->by_prefix, single))
        return 0;
    respond_403(req, single ? "read this key" : "read this range");
    return TK_EINVAL;
}

/* The key an op of a batch or transaction writes (NULL: none). */
static const ProtobufCBinaryData *op_key(const Kvpb__Op *op)
{
    return op->op_case == KVPB__OP__OP_PUT    ? &op->put->key
           : op->op_case == KVPB__OP__OP_DEL  ? &op->del->key
           : op->op_case == KVPB__OP__OP_INCR ? &op->incr->key
                                              : NULL;
}

static bool may_op(const struct api_user *u, const Kvpb__Op *op)
{
    const ProtobufCBinaryData *k = op_key(op);
    return k != NULL && may(u, true, k->data, k->len, NULL, 0, false, true);
}

/* A key of the node's own (membership, leases): its first byte is
 * KV_RESERVED_BYTE. */
static bool reserved(const ProtobufCBinaryData *k)
{
    return k != NULL && k->len > 0 && k->data[0] == KV_RESERVED_BYTE;
}

static bool ops_reserved(Kvpb__Op *const *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (reserved(op_key(ops[i])))
            return true;
    return false;
}

/* Whether a client's command writes a key of the node's own: never allowed,
 * whoever asks (the node writes them with its own commands). */
static bool writes_reserved(const Kvpb__Command *c)
{
    switch (c->cmd_case) {
    case KVPB__COMMAND__CMD_PUT:
        return reserved(&c->put->key);
    case KVPB__COMMAND__CMD_DEL:
        return reserved(&c->del->key);
    case KVPB__COMMAND__CMD_INCR:
        return reserved(&c->incr->key);
    case KVPB__COMMAND__CMD_BATCH:
        return ops_reserved(c->batch->ops, c->batch->n_ops);
    case KVPB__COMMAND__CMD_TXN:
        return ops_reserved(c->txn->then_ops, c->txn->n_then_ops) ||
               ops_reserved(c->txn->else_ops, c->txn->n_else_ops);
    default:
        return false; /* a delete range spares them (kv/cmd.c) */
    }
}

static bool may_txn(const struct api_user *u, const Kvpb__Txn *t)
{
    for (size_t i = 0; i < t->n_compares; i++)
        if (!may(u, false, t->compares[i]->key.data, t->compares[i]->key.len, NULL, 0,
                 false, true))
            return false;
    for (size_t i = 0; i < t->n_then_ops; i++)
        if (!may_op(u, t->then_ops[i]))
            return false;
    for (size_t i = 0; i < t->n_else_ops; i++)
        if (!may_op(u, t->else_ops[i]))
            return false;
    return true;
}

/* Every key a command touches, each against the user's rights. */
static bool may_command(const struct api_user *u, const Kvpb__Command *c,
                        bool *everything)
{
    const Kvpb__DeleteRange *dr = c->delete_range;
    switch (c->cmd_case) {
    case KVPB__COMMAND__CMD_PUT:
        return may(u, true, c->put->key.data, c->put->key.len, NULL, 0, false, true);
    case KVPB__COMMAND__CMD_DEL:
        return may(u, true, c->del->key.data, c->del->key.len, NULL, 0, false, true);
    case KVPB__COMMAND__CMD_INCR:
        return may(u, true, c->incr->key.data, c->incr->key.len, NULL, 0, false, true);
    case KVPB__COMMAND__CMD_DELETE_RANGE:
        *everything =
            dr->by_prefix ? dr->prefix.len == 0 : dr->start.len == 0 && dr->end.len == 0;
        if (*everything)
            return u->admin;
        if (dr->by_prefix)
            return may(u, true, dr->prefix.data, dr->prefix.len, NULL, 0, true, false);
        return may(u, true, dr->start.data, dr->start.len, dr->end.data, dr->end.len,
                   false, false);
    case KVPB__COMMAND__CMD_BATCH:
        for (size_t i = 0; i < c->batch->n_ops; i++)
            if (!may_op(u, c->batch->ops[i]))
                return false;
        return true;
    case KVPB__COMMAND__CMD_TXN:
        return may_txn(u, c->txn);
    default:
        return u->admin;
    }
}

int api__auth_verdict(const struct api_req *req, const struct Kvpb__Command *cmd)
{
    bool everything = false;
    if (writes_reserved(cmd))
        return API_AUTH_RESERVED;
    if (req->user == NULL || may_command(req->user, cmd, &everything))
        return API_AUTH_OK;
    return everything ? API_AUTH_NOT_ALL : API_AUTH_NOT_KEYS;
}

int api__auth_answer(struct api_req *req, int verdict)
{
    switch (verdict) {
    case API_AUTH_OK:
        return 0;
    case API_AUTH_RESERVED:
        http_respond_error(
            req->http, 400, "reserved_key", NULL,
            "keys whose first byte is 0x01 are the node's own (membership, "
            "leases): a client may not write them");
        return TK_EINVAL;
    case API_AUTH_NOT_ALL:
        respond_403(req, "delete every key (admin only)");
        return TK_EINVAL;
    default:
        respond_403(req, "write every key of this request");
        return TK_EINVAL;
    }
}

int api__auth_command(struct api_req *req, const struct Kvpb__Command *cmd)
{
    return api__auth_answer(req, api__auth_verdict(req, cmd));
}

void api__auth_client_id(const struct api_req *req, uint64_t *client, uint64_t *seq)
{
    /* SHA-256(user name | 0 | SHA-256(Idempotency-Key)): each user has a
     * namespace of its own, and the 128 bits kept (the exactly-once table's
     * (client, seq)) take about 2^64 work to collide, not 2^32. */
    const char *name = req->user != NULL ? req->user->name : "";
    uint8_t h[32];
    sha256(name, strlen(name), req->http->digest, sizeof(req->http->digest), h);
    uint64_t c = 0, s = 0;
    for (int i = 0; i < 8; i++) {
        c = c << 8 | h[i];
        s = s << 8 | h[8 + i];
    }
    *client = c != 0 ? c : 1; /* 0 means "no id" */
    *seq = s;
}
