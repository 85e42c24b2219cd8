/* The one-shot commands of the tierkv CLI: put, get, del, scan, incr, txn,
 * batch, status, members.
 *
 * Each command builds a request of the v1 gateway API (DESIGN.md), sends it
 * through cli_request() (endpoint failover, leader hints), and prints either
 * a table (default) or the server's JSON verbatim, one line (--json). The
 * gateway's exact response fields may grow: tables print the fields they find
 * (known ones first), so a new field shows up instead of breaking the CLI.
 * Exit codes come from cli_exit_for_status(). Main thread only. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "cmd/tierkv/cli.h"

/* ---- small helpers ---- */

struct strbuf {
    char *p;
    size_t len, cap;
};

static void sb_add(struct strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = tk_realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(struct strbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void sb_urlenc(struct strbuf *b, const char *s, size_t n)
{
    char *tmp = tk_malloc(3 * n + 1);
    size_t len = cli_url_encode(s, n, tmp, 3 * n + 1);
    sb_add(b, tmp, len);
    tk_free(tmp);
}

/* Appends "?name=value" or "&name=value" (value URL-encoded). */
static void sb_param(struct strbuf *b, const char *name, const char *value)
{
    if (!value || !value[0])
        return;
    sb_str(b, strchr(b->p ? b->p : "", '?') ? "&" : "?");
    sb_str(b, name);
    sb_str(b, "=");
    sb_urlenc(b, value, strlen(value));
}

static void sb_free(struct strbuf *b)
{
    tk_free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static void key_path(struct strbuf *b, const char *key, const char *suffix)
{
    sb_str(b, "/v1/kv/");
    sb_urlenc(b, key, strlen(key));
    if (suffix)
        sb_str(b, suffix);
}

/* The length of the valid UTF-8 sequence at s[0..n) (2..4), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t len = s[0] >= 0xf0 && s[0] <= 0xf4  ? 4
                 : s[0] >= 0xe0                ? 3
                 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2
                                               : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* Prints a byte string for a human: printable ASCII and valid UTF-8 as is,
 * control bytes and invalid UTF-8 escaped as \xNN. */
static void print_human(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t l = utf8_seq((const unsigned char *)s + i, n - i);
            if (l == 0) {
                fprintf(f, "\\x%02x", c);
            } else {
                fwrite(s + i, 1, l, f);
                i += l - 1;
            }
        } else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

/* A JSON scalar as display text (owned). */
static char *json_text(json_t *v, bool base64)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_STRING:
        if (base64) {
            size_t n = json_string_length(v);
            unsigned char *out = tk_malloc(n + 1);
            long m = tk_base64_decode(json_string_value(v), n, out, n);
            if (m >= 0) {
                out[m] = '\0';
                return (char *)out;
            }
            tk_free(out);
        }
        return tk_strdup(json_string_value(v));
    case JSON_INTEGER:
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return tk_strdup(buf);
    case JSON_REAL:
        snprintf(buf, sizeof(buf), "%g", json_real_value(v));
        return tk_strdup(buf);
    case JSON_TRUE:
        return tk_strdup("true");
    case JSON_FALSE:
        return tk_strdup("false");
    case JSON_NULL:
        return tk_strdup("-");
    default: {
        char *d = json_dumps(v, JSON_COMPACT);
        char *r = tk_strdup(d ? d : "?");
        free(d);
        return r;
    }
    }
}

/* ---- tables ---- */

#define TABLE_COLS_MAX 24

struct table {
    const char *cols[TABLE_COLS_MAX];
    size_t n_cols;
    char **cells; /* row-major, n_rows * n_cols, NULL = "-" */
    size_t n_rows;
};

static void table_print(const struct table *t, FILE *f)
{
    size_t w[TABLE_COLS_MAX];
    for (size_t c = 0; c < t->n_cols; c++) {
        w[c] = strlen(t->cols[c]);
        for (size_t r = 0; r < t->n_rows; r++) {
            const char *s = t->cells[r * t->n_cols + c];
            size_t l = s ? strlen(s) : 1;
            if (l > w[c])
                w[c] = l;
        }
        if (w[c] > 80)
            w[c] = 80;
    }
    for (size_t c = 0; c < t->n_cols; c++) {
        for (const char *p = t->cols[c]; *p; p++)
            fputc(*p >= 'a' && *p <= 'z' ? *p - 32 : *p, f);
        if (c + 1 < t->n_cols)
            fprintf(f, "%*s", (int)(w[c] - strlen(t->cols[c]) + 2), "");
    }
    fputc('\n', f);
    for (size_t r = 0; r < t->n_rows; r++) {
        for (size_t c = 0; c < t->n_cols; c++) {
            const char *s = t->cells[r * t->n_cols + c];
            if (!s)
                s = "-";
            size_t l = strlen(s);
            print_human(f, s, l);
            if (c + 1 < t->n_cols)
                fprintf(f, "%*s", (int)(w[c] > l ? w[c] - l + 2 : 2), "");
        }
        fputc('\n', f);
    }
}

static void table_free(struct table *t)
{
    for (size_t i = 0; i < t->n_rows * t->n_cols; i++)
        tk_free(t->cells[i]);
    tk_free(t->cells);
    t->cells = NULL;
}

static size_t table_col(struct table *t, const char *name)
{
    for (size_t c = 0; c < t->n_cols; c++)
        if (strcmp(t->cols[c], name) == 0)
            return c;
    if (t->n_cols == TABLE_COLS_MAX)
        return SIZE_MAX;
    t->cols[t->n_cols] = name;
    return t->n_cols++;
}

static const char *const kv_order[] = {"endpoint",
                                       "id",
                                       "node_id",
                                       "name",
                                       "key",
                                       "value",
                                       "version",
                                       "create_revision",
                                       "mod_revision",
                                       "revision",
                                       "role",
                                       "leader",
                                       "leader_id",
                                       "term",
                                       "commit_index",
                                       "commit",
                                       "applied_index",
                                       "applied",
                                       NULL};

/* Whether `field` of `obj` holds base64: with --base64 every key and value
 * does; otherwise the gateway marks bytes that are not UTF-8 with
 * "encoding": "base64" (value) or "key_encoding": "base64" (key). */
static bool is_base64_field(json_t *obj, const char *field, bool base64)
{
    const char *marker;
    if (strcmp(field, "value") == 0)
        marker = "encoding";
    else if (strcmp(field, "key") == 0)
        marker = "key_encoding";
    else
        return false;
    const char *enc = json_string_value(json_object_get(obj, marker));
    return base64 || (enc && strcmp(enc, "base64") == 0);
}

/* Builds a table from an array of objects: known columns in kv_order first,
 * then the others in order of appearance. Column names borrow from `arr`. */
static void table_from_objects(struct table *t, json_t *arr, bool base64)
{
    memset(t, 0, sizeof(*t));
    size_t n = json_array_size(arr);
    for (const char *const *k = kv_order; *k; k++)
        for (size_t i = 0; i < n; i++)
            if (json_object_get(json_array_get(arr, i), *k)) {
                table_col(t, *k);
                break;
            }
    for (size_t i = 0; i < n; i++) {
        const char *k;
        json_t *v;
        json_object_foreach(json_array_get(arr, i), k, v) table_col(t, k);
    }
    t->cells = tk_calloc(n * t->n_cols + 1, sizeof(char *));
    t->n_rows = n;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < t->n_cols; c++) {
            json_t *row = json_array_get(arr, i);
            json_t *v = json_object_get(row, t->cols[c]);
            t->cells[i * t->n_cols + c] =
                v ? json_text(v, is_base64_field(row, t->cols[c], base64)) : NULL;
        }
}

static void print_object_row(json_t *obj, bool base64)
{
    json_t *arr = json_array();
    json_array_append(arr, obj);
    struct table t;
    table_from_objects(&t, arr, base64);
    table_print(&t, stdout);
    table_free(&t);
    json_decref(arr);
}

/* ---- results and errors ---- */

/* Prints a non-2xx answer (stderr for humans; the body to stdout with
 * --json) and returns the exit code. */
static int report_status(struct cli_global *g, const struct cli_response *r,
                         const char *what)
{
    int code = cli_exit_for_status(r->status);
    if (g->json && r->body_len > 0) {
        fwrite(r->body, 1, r->body_len, stdout);
        if (r->body[r->body_len - 1] != '\n')
            fputc('\n', stdout);
    }
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    json_t *e = j ? json_object_get(j, "error") : NULL;
    const char *ecode = json_string_value(json_object_get(e, "code"));
    const char *emsg = json_string_value(json_object_get(e, "message"));
    fprintf(stderr, "tierkv: %s: HTTP %d from %s:%s", what, r->status,
            g->client.answered.host, g->client.answered.port);
    if (ecode || emsg)
        fprintf(stderr, ": %s%s%s", ecode ? ecode : "", ecode && emsg ? ": " : "",
                emsg ? emsg : "");
    else if (r->body_len > 0 && r->body_len < 200)
        fprintf(stderr, ": %.*s", (int)r->body_len, r->body);
    if (r->status == 503 && r->leader[0])
        fprintf(stderr, " (leader hint: %s)", r->leader);
    fputc('\n', stderr);
    json_decref(j);
    return code;
}

static int transport_error(int rc, const char *err)
{
    fprintf(stderr, "tierkv: %s\n", err);
    return rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT : CLI_EXIT_UNAVAILABLE;
}

static int do_request(struct cli_global *g, const char *method, const char *path,
                      const char *ctype, const void *body, size_t len,
                      struct cli_response *r)
{
    char err[512];
    int rc = cli_request(&g->client, method, path, ctype, body, len, r, err, sizeof(err));
    if (rc != 0)
        return -transport_error(rc, err);
    return 0;
}

/* Prints a successful answer: its JSON (--json) or a one-row table. */
static void print_ok(struct cli_global *g, const struct cli_response *r)
{
    if (g->json) {
        if (r->body_len > 0) {
            fwrite(r->body, 1, r->body_len, stdout);
            if (r->body[r->body_len - 1] != '\n')
                fputc('\n', stdout);
        } else {
            printf("{\"ok\":true,\"revision\":%s}\n",
                   r->revision[0] ? r->revision : "null");
        }
        return;
    }
    json_t *j = r->body_len ? json_loads(r->body, 0, NULL) : NULL;
    if (json_is_object(j) && json_object_size(j) > 0) {
        print_object_row(j, g->base64);
    } else if (r->body_len > 0 && !j) {
        print_human(stdout, r->body, r->body_len);
        fputc('\n', stdout);
    } else {
        printf("OK");
        if (r->revision[0])
            printf(" revision=%s", r->revision);
        printf("\n");
    }
    json_decref(j);
}

/* Reads a whole file ("-" is stdin) into an owned NUL-terminated buffer. */
static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tierkv: cannot open %s: %s\n", path, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    struct strbuf b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        if (b.len + n > CLI_BODY_MAX) {
            fprintf(stderr, "tierkv: %s is larger than %u bytes\n", path, CLI_BODY_MAX);
            sb_free(&b);
            if (f != stdin)
                fclose(f);
            return CLI_EXIT_USAGE;
        }
        sb_add(&b, buf, n);
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (bad) {
        fprintf(stderr, "tierkv: reading %s failed\n", path);
        sb_free(&b);
        return CLI_EXIT_USAGE;
    }
    if (!b.p)
        sb_add(&b, "", 0);
    *out = b.p;
    *len = b.len;
    return 0;
}

static int usage_error(const char *cmd, const char *msg)
{
    fprintf(stderr, "tierkv %s: %s (see tierkv %s --help)\n", cmd, msg, cmd);
    return CLI_EXIT_USAGE;
}

int cli_check_key(const char *cmd, const char *key)
{
    if (key[0] != '\0')
        return 0;
    fprintf(stderr,
            "tierkv %s: the key is empty; to list keys use tierkv scan PREFIX "
            "(tierkv scan \"\" lists every key)\n",
            cmd);
    return CLI_EXIT_USAGE;
}

/* getopt_long over a subcommand's own arguments. */
#define SUB_GETOPT_RESET() (optind = 1, opterr = 0)

/* ---- put ---- */

static const char put_help[] =
    "usage: tierkv put KEY [VALUE] [--file F] [--ttl DURATION] [--if-version N]\n"
    "                  [--lease ID]\n"
    "  VALUE is taken literally; without it the value is read from --file F or stdin.\n"
    "  --ttl 30s        expire the key after this long (JSON body ttl_ms)\n"
    "  --if-version N   write only if the key's version is N (0: only if absent);\n"
    "                   a mismatch exits 4\n"
    "  --lease ID       attach the key to lease ID (tierkv lease grant)\n";

/* tierkv put's arguments. */
struct put_args {
    const char *key;
    const char *value; /* VALUE as given, or NULL: read --file (or stdin) */
    const char *file, *lease;
    uint64_t ttl_ms, if_version;
    bool has_ttl, has_ifv;
};

/* Parses put's arguments into a. Returns 0, -1 when --help was printed, or
 * CLI_EXIT_USAGE with the reason printed. */
static int put_parse(int argc, char **argv, struct put_args *a)
{
    static const struct option opts[] = {{"file", required_argument, 0, 'f'},
                                         {"ttl", required_argument, 0, 't'},
                                         {"if-version", required_argument, 0, 'v'},
                                         {"lease", required_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct put_args){.lease = ""};
    SUB_GETOPT_RESET();
    int o;
    while ((o = getopt_long(argc, argv, "f:h", opts, NULL)) != -1) {
        switch (o) {
        case 'f':
            a->file = optarg;
            break;
        case 't':
            if (cli_parse_duration_ms(optarg, &a->ttl_ms) != 0)
                return usage_error("put", "--ttl wants a duration like 30s or 500ms");
            a->has_ttl = true;
            break;
        case 'v':
            if (cli_parse_u64(optarg, 0, INT64_MAX, &a->if_version) != 0)
                return usage_error("put", "--if-version wants a non-negative integer");
            a->has_ifv = true;
            break;
        case 'l':
            a->lease = optarg;
            break;
        case 'h':
            fputs(put_help, stdout);
            return -1;
        default:
            return usage_error("put", "unknown option");
        }
    }
    int nargs = argc - optind;
    if (nargs < 1 || nargs > 2 || (nargs == 2 && a->file))
        return usage_error("put", "wants KEY and VALUE (or KEY with --file)");
    a->key = argv[optind];
    a->value = nargs == 2 ? argv[optind + 1] : NULL;
    return cli_check_key("put", a->key) != 0 ? CLI_EXIT_USAGE : 0;
}

/* With --ttl or --if-version the body is the JSON object {"value", "ttl_ms",
 * "if_version"}: returns it (free() it), or NULL with the usage error printed
 * when the value is not UTF-8. */
static char *put_json_body(const struct put_args *a, const char *value, size_t vlen)
{
    json_t *v = json_stringn(value, vlen);
    if (!v) {
        usage_error("put", "--ttl/--if-version need a UTF-8 value");
        return NULL;
    }
    json_t *j = json_object();
    json_object_set_new(j, "value", v);
    if (a->has_ttl)
        json_object_set_new(j, "ttl_ms", json_integer((json_int_t)a->ttl_ms));
    if (a->has_ifv)
        json_object_set_new(j, "if_version", json_integer((json_int_t)a->if_version));
    char *dumped = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return dumped;
}

int cli_cmd_put(struct cli_global *g, int argc, char **argv)
{
    struct put_args a;
    int rc = put_parse(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char *value = NULL;
    size_t vlen;
    if (a.value != NULL) {
        value = tk_strdup(a.value);
        vlen = strlen(value);
    } else if ((rc = read_file(a.file ? a.file : "-", &value, &vlen)) != 0) {
        return rc;
    }
    char *dumped = NULL;
    if (a.has_ttl || a.has_ifv) {
        dumped = put_json_body(&a, value, vlen);
        if (dumped == NULL) {
            tk_free(value);
            return CLI_EXIT_USAGE;
        }
    }
    struct strbuf path = {0};
    key_path(&path, a.key, NULL);
    sb_param(&path, "mode", g->mode);
    sb_param(&path, "lease", a.lease);
    struct cli_response r;
    rc =
        dumped
            ? do_request(g, "PUT", path.p, "application/json", dumped, strlen(dumped), &r)
            : do_request(g, "PUT", path.p, "application/octet-stream", value, vlen, &r);
    sb_free(&path);
    free(dumped);
    tk_free(value);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code == 0)
        print_ok(g, &r);
    else
        code = report_status(g, &r, "put");
    cli_response_free(&r);
    return code;
}

/* ---- get ---- */

static const char get_help[] =
    "usage: tierkv get KEY [--value-only]\n"
    "  Prints KEY, VALUE, VERSION and revisions; a missing key exits 3.\n"
    "  --value-only   print only the value's bytes (no table, no escaping)\n";

int cli_cmd_get(struct cli_global *g, int argc, char **argv)
{
    static const struct option opts[] = {
        {"value-only", no_argument, 0, 'V'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    bool value_only = false;
    SUB_GETOPT_RESET();
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (o == 'V')
            value_only = true;
        else if (o == 'h') {
            fputs(get_help, stdout);
            return 0;
        } else
            return usage_error("get", "unknown option");
    }
    if (argc - optind != 1)
        return usage_error("get", "wants exactly one KEY");
    if (cli_check_key("get", argv[optind]) != 0)
        return CLI_EXIT_USAGE;
    struct strbuf path = {0};
    key_path(&path, argv[optind], NULL);
    sb_param(&path, "consistency", g->consistency);
    if (g->base64)
        sb_param(&path, "encoding", "base64");
    struct cli_response r;
    int rc = do_request(g, "GET", path.p, NULL, NULL, 0, &r);
    sb_free(&path);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code != 0) {
        if (r.status == 404 && !g->json)
            fprintf(stderr, "tierkv: get: key not found: %s\n", argv[optind]);
        else
            code = report_status(g, &r, "get");
        cli_response_free(&r);
        return code;
    }
    if (value_only) {
        json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
        json_t *v = json_object_get(j, "value");
        if (!json_is_string(v)) {
            fprintf(stderr, "tierkv: get: the answer has no string \"value\"\n");
            code = CLI_EXIT_ERROR;
        } else if (is_base64_field(j, "value", g->base64)) {
            size_t n = json_string_length(v);
            unsigned char *out = tk_malloc(n + 1);
            long m = tk_base64_decode(json_string_value(v), n, out, n);
            if (m < 0) {
                fprintf(stderr, "tierkv: get: the value is not valid base64\n");
                code = CLI_EXIT_ERROR;
            } else {
                fwrite(out, 1, (size_t)m, stdout);
            }
            tk_free(out);
        } else {
            fwrite(json_string_value(v), 1, json_string_length(v), stdout);
        }
        if (code == 0 && isatty(STDOUT_FILENO))
            fputc('\n', stdout);
        json_decref(j);
    } else {
        print_ok(g, &r);
    }
    cli_response_free(&r);
    return code;
}

/* ---- del ---- */

int cli_cmd_del(struct cli_global *g, int argc, char **argv)
{
    SUB_GETOPT_RESET();
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        printf("usage: tierkv del KEY\n  A missing key exits 3.\n");
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-')
        return usage_error("del", "wants exactly one KEY");
    if (cli_check_key("del", argv[1]) != 0)
        return CLI_EXIT_USAGE;
    struct strbuf path = {0};
    key_path(&path, argv[1], NULL);
    sb_param(&path, "mode", g->mode);
    struct cli_response r;
    int rc = do_request(g, "DELETE", path.p, NULL, NULL, 0, &r);
    sb_free(&path);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code == 0) {
        /* The gateway answers 200 with "deleted": 0 for a missing key. */
        json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
        json_t *d = json_object_get(j, "deleted");
        if (json_is_integer(d) && json_integer_value(d) == 0)
            code = CLI_EXIT_NOTFOUND;
        json_decref(j);
        if (code == 0 || g->json)
            print_ok(g, &r);
        if (code != 0)
            fprintf(stderr, "tierkv: del: key not found: %s\n", argv[1]);
    } else if (r.status == 404 && !g->json)
        fprintf(stderr, "tierkv: del: key not found: %s\n", argv[1]);
    else
        code = report_status(g, &r, "del");
    cli_response_free(&r);
    return code;
}

/* ---- scan ---- */

static const char scan_help[] =
    "usage: tierkv scan [PREFIX] [--prefix P | --start S [--end E]] [--limit N]\n"
    "                   [--internal]\n"
    "  Lists keys in byte order (GET /v1/kv?prefix=&start=&end=&limit=).\n"
    "  --internal  also the node's own records, hidden otherwise (keys that\n"
    "              start with byte 0x01: members, leases, the epoch;\n"
    "              ?internal=true, admin only with --auth-file)\n";

/* The array of key/value objects in a scan answer, wherever the server put it. */
static json_t *scan_items(json_t *j)
{
    if (json_is_array(j))
        return j;
    static const char *const names[] = {"kvs",     "items", "entries",
                                        "results", "keys",  NULL};
    for (const char *const *n = names; *n; n++) {
        json_t *a = json_object_get(j, *n);
        if (json_is_array(a))
            return a;
    }
    return NULL;
}

/* tierkv scan's arguments (NULL: not given). */
struct scan_args {
    const char *prefix, *start, *end, *limit;
    bool internal; /* --internal: ?internal=true */
};

/* Parses scan's arguments into a. Returns 0, -1 when --help was printed, or
 * CLI_EXIT_USAGE with the reason printed. */
static int scan_parse(int argc, char **argv, struct scan_args *a)
{
    static const struct option opts[] = {{"prefix", required_argument, 0, 'p'},
                                         {"start", required_argument, 0, 's'},
                                         {"end", required_argument, 0, 'e'},
                                         {"limit", required_argument, 0, 'l'},
                                         {"internal", no_argument, 0, 'i'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct scan_args){0};
    uint64_t lim;
    SUB_GETOPT_RESET();
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'p':
            a->prefix = optarg;
            break;
        case 's':
            a->start = optarg;
            break;
        case 'e':
            a->end = optarg;
            break;
        case 'l':
            if (cli_parse_u64(optarg, 1, UINT32_MAX, &lim) != 0)
                return usage_error("scan", "--limit wants a positive integer");
            a->limit = optarg;
            break;
        case 'i':
            a->internal = true;
            break;
        case 'h':
            fputs(scan_help, stdout);
            return -1;
        default:
            return usage_error("scan", "unknown option");
        }
    }
    if (argc - optind > 1)
        return usage_error("scan", "takes at most one PREFIX");
    if (argc - optind == 1) {
        if (a->prefix)
            return usage_error("scan", "PREFIX given twice");
        a->prefix = argv[optind];
    }
    if (a->prefix && (a->start || a->end))
        return usage_error("scan", "use a prefix or a range, not both");
    return 0;
}

/* A scan answer as a table, then "N keys" and a note when more are left.
 * Returns 0, or CLI_EXIT_ERROR when the answer holds no list of keys. */
static int scan_print(const struct cli_response *r, bool base64)
{
    int code = 0;
    json_error_t jerr;
    json_t *j = json_loads(r->body ? r->body : "", 0, &jerr);
    json_t *items = scan_items(j);
    if (!items) {
        fprintf(stderr, "tierkv: scan: the answer holds no list of keys\n");
        code = CLI_EXIT_ERROR;
    } else {
        struct table t;
        table_from_objects(&t, items, base64);
        if (t.n_rows > 0)
            table_print(&t, stdout);
        table_free(&t);
        json_t *more = json_object_get(j, "more");
        printf("%zu key%s%s\n", json_array_size(items),
               json_array_size(items) == 1 ? "" : "s",
               json_is_true(more) ? " (more available: raise --limit or scan from "
                                    "the last key)"
                                  : "");
    }
    json_decref(j);
    return code;
}

int cli_cmd_scan(struct cli_global *g, int argc, char **argv)
{
    struct scan_args a;
    int rc = scan_parse(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct strbuf path = {0};
    sb_str(&path, "/v1/kv");
    if (a.prefix) {
        /* An empty prefix means every key; send it explicitly. */
        sb_str(&path, "?prefix=");
        sb_urlenc(&path, a.prefix, strlen(a.prefix));
    }
    sb_param(&path, "start", a.start);
    sb_param(&path, "end", a.end);
    sb_param(&path, "limit", a.limit);
    sb_param(&path, "internal", a.internal ? "true" : NULL);
    sb_param(&path, "consistency", g->consistency);
    if (g->base64)
        sb_param(&path, "encoding", "base64");
    struct cli_response r;
    rc = do_request(g, "GET", path.p, NULL, NULL, 0, &r);
    sb_free(&path);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code != 0)
        code = report_status(g, &r, "scan");
    else if (g->json)
        print_ok(g, &r);
    else
        code = scan_print(&r, g->base64);
    cli_response_free(&r);
    return code;
}

/* ---- incr ---- */

int cli_cmd_incr(struct cli_global *g, int argc, char **argv)
{
    SUB_GETOPT_RESET();
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        printf("usage: tierkv incr KEY [DELTA]\n"
               "  Adds DELTA (default 1, may be negative) to the int64 at KEY.\n");
        return 0;
    }
    if (argc < 2 || argc > 3 || (argv[1][0] == '-' && argv[1][1] == '-'))
        return usage_error("incr", "wants KEY [DELTA]");
    if (cli_check_key("incr", argv[1]) != 0)
        return CLI_EXIT_USAGE;
    int64_t delta = 1;
    if (argc == 3 && cli_parse_i64(argv[2], &delta) != 0)
        return usage_error("incr", "DELTA must be a 64-bit integer");
    struct strbuf path = {0};
    key_path(&path, argv[1], "/incr");
    sb_param(&path, "mode", g->mode);
    char body[64];
    int blen = snprintf(body, sizeof(body), "{\"delta\":%lld}", (long long)delta);
    struct cli_response r;
    int rc = do_request(g, "POST", path.p, "application/json", body, (size_t)blen, &r);
    sb_free(&path);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code == 0)
        print_ok(g, &r);
    else
        code = report_status(g, &r, "incr");
    cli_response_free(&r);
    return code;
}

/* ---- txn and batch ---- */

static int post_json_file(struct cli_global *g, const char *cmd, const char *route,
                          int argc, char **argv, bool is_txn)
{
    SUB_GETOPT_RESET();
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        printf("usage: tierkv %s FILE\n"
               "  Posts the JSON in FILE (\"-\" for stdin) to %s; docs/api.md gives its "
               "form.%s\n",
               cmd, route,
               is_txn
                   ? "\n  A transaction whose compares failed (succeeded=false) exits 4."
                   : "");
        return 0;
    }
    if (argc != 2)
        return usage_error(cmd, "wants exactly one FILE (or - for stdin)");
    char *text;
    size_t len;
    int rc = read_file(argv[1], &text, &len);
    if (rc != 0)
        return rc;
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, 0, &jerr);
    if (!json_is_object(doc)) {
        if (doc)
            fprintf(stderr, "tierkv %s: %s: the file must hold a JSON object\n", cmd,
                    argv[1]);
        else
            fprintf(stderr, "tierkv %s: %s:%d:%d: invalid JSON: %s\n", cmd, argv[1],
                    jerr.line, jerr.column, jerr.text);
        json_decref(doc);
        tk_free(text);
        return CLI_EXIT_USAGE;
    }
    json_decref(doc);
    struct strbuf path = {0};
    sb_str(&path, route);
    sb_param(&path, "mode", g->mode);
    struct cli_response r;
    rc = do_request(g, "POST", path.p, "application/json", text, len, &r);
    sb_free(&path);
    tk_free(text);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code != 0) {
        code = report_status(g, &r, cmd);
        cli_response_free(&r);
        return code;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    json_t *succ = json_object_get(j, "succeeded");
    if (g->json) {
        print_ok(g, &r);
    } else if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
        {
            if (json_is_array(v)) {
                printf("%s:\n", k);
                size_t i;
                json_t *item;
                json_array_foreach(v, i, item)
                {
                    char *s = json_dumps(item, JSON_COMPACT | JSON_ENCODE_ANY);
                    printf("  %zu  %s\n", i, s ? s : "?");
                    free(s);
                }
            } else {
                char *s = json_text(v, false);
                printf("%s: %s\n", k, s);
                tk_free(s);
            }
        }
    } else {
        print_ok(g, &r);
    }
    if (is_txn && json_is_false(succ))
        code = CLI_EXIT_COMPARE;
    json_decref(j);
    cli_response_free(&r);
    return code;
}

int cli_cmd_txn(struct cli_global *g, int argc, char **argv)
{
    return post_json_file(g, "txn", "/v1/txn", argc, argv, true);
}

int cli_cmd_batch(struct cli_global *g, int argc, char **argv)
{
    return post_json_file(g, "batch", "/v1/batch", argc, argv, false);
}

/* ---- status and members ---- */

/* One row of `status`: GET /v1/cluster and /readyz on `ep`. Returns the row;
 * *cl gets the /v1/cluster answer (an object, or NULL), *up whether the node
 * answered. */
static json_t *status_row(struct cli_global *g, const struct cli_endpoint *ep,
                          json_t **cl, bool *up)
{
    char name[CLI_HOST_MAX + 16], err[512];
    snprintf(name, sizeof(name), strchr(ep->host, ':') ? "[%s]:%s" : "%s:%s", ep->host,
             ep->port);
    json_t *row = json_object();
    json_object_set_new(row, "endpoint", json_string(name));
    *cl = NULL;
    struct cli_response r;
    int rc = cli_request_one(ep, g->client.timeout_ms, "GET", "/v1/cluster", NULL, NULL,
                             0, &r, err, sizeof(err));
    *up = rc == 0;
    if (rc != 0) {
        json_object_set_new(row, "reachable", json_false());
        json_object_set_new(row, "error", json_string(err));
        return row;
    }
    json_object_set_new(row, "reachable", json_true());
    json_t *j = r.status == 200 ? json_loads(r.body ? r.body : "", 0, NULL) : NULL;
    cli_response_free(&r);
    struct cli_response rr;
    rc = cli_request_one(ep, g->client.timeout_ms, "GET", "/readyz", NULL, NULL, 0, &rr,
                         err, sizeof(err));
    json_object_set_new(row, "ready", json_boolean(rc == 0 && rr.status == 200));
    if (rc == 0)
        cli_response_free(&rr);
    if (!json_is_object(j)) {
        json_decref(j);
        return row;
    }
    if (g->json) {
        json_object_set(row, "cluster", j);
    } else {
        /* Scalars only in the table; members are `tierkv members`. */
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) if (!json_is_object(v) && !json_is_array(v))
            json_object_set(row, k, v);
    }
    *cl = j;
    return row;
}

/* Whether `rows` already has a row for member `id` (a node that answered
 * with that id) or for the endpoint `name`. */
static bool status_seen(json_t *rows, json_int_t id, const char *name)
{
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        json_t *cl = json_object_get(row, "cluster");
        json_t *rid = json_object_get(cl ? cl : row, "id");
        if (json_is_integer(rid) && json_integer_value(rid) == id)
            return true;
        if (strcmp(json_string_value(json_object_get(row, "endpoint")), name) == 0)
            return true;
    }
    return false;
}

/* Adds a row for every member that the answers in `clusters` list (by its
 * "http" address) and that has none yet. A member that does not answer shows
 * as unreachable; it does not change the exit status. */
static void status_members(struct cli_global *g, json_t *rows, json_t *clusters)
{
    size_t i, k;
    json_t *cl, *m;
    json_array_foreach(clusters, i, cl)
    {
        json_array_foreach(json_object_get(cl, "members"), k, m)
        {
            const char *http = json_string_value(json_object_get(m, "http"));
            json_int_t id = json_integer_value(json_object_get(m, "id"));
            struct cli_endpoint ep;
            if (!http || !http[0] || cli_parse_hostport(http, &ep) != 0)
                continue;
            char name[CLI_HOST_MAX + 16];
            snprintf(name, sizeof(name), strchr(ep.host, ':') ? "[%s]:%s" : "%s:%s",
                     ep.host, ep.port);
            if (status_seen(rows, id, name))
                continue;
            json_t *mcl;
            bool up;
            json_t *row = status_row(g, &ep, &mcl, &up);
            json_object_set_new(row, "member", json_integer(id));
            json_decref(mcl);
            json_array_append_new(rows, row);
        }
    }
}

int cli_cmd_status(struct cli_global *g, int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        printf("usage: tierkv status\n"
               "  Asks every endpoint for /v1/cluster and /readyz, then every member\n"
               "  those answers list (by its http address) that is not an endpoint;\n"
               "  one row per node. Exits 5 if an endpoint is unreachable.\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : CLI_EXIT_USAGE;
    }
    json_t *rows = json_array();
    json_t *clusters = json_array();
    int code = 0;
    for (size_t i = 0; i < g->client.n_eps; i++) {
        json_t *cl;
        bool up;
        json_array_append_new(rows, status_row(g, &g->client.eps[i], &cl, &up));
        if (!up)
            code = CLI_EXIT_UNAVAILABLE;
        if (cl)
            json_array_append_new(clusters, cl);
    }
    status_members(g, rows, clusters);
    json_decref(clusters);
    if (g->json) {
        char *s = json_dumps(rows, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
    } else {
        struct table t;
        table_from_objects(&t, rows, false);
        table_print(&t, stdout);
        table_free(&t);
    }
    json_decref(rows);
    return code;
}

int cli_cmd_members(struct cli_global *g, int argc, char **argv)
{
    if (argc > 1) {
        printf(
            "usage: tierkv members\n  Lists the cluster's members (GET /v1/cluster).\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : CLI_EXIT_USAGE;
    }
    struct cli_response r;
    int rc = do_request(g, "GET", "/v1/cluster", NULL, NULL, 0, &r);
    if (rc != 0)
        return -rc;
    int code = cli_exit_for_status(r.status);
    if (code != 0) {
        code = report_status(g, &r, "members");
    } else if (g->json) {
        print_ok(g, &r);
    } else {
        json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
        json_t *m = json_object_get(j, "members");
        if (!json_is_array(m)) {
            fprintf(stderr, "tierkv: members: the answer holds no \"members\" list\n");
            code = CLI_EXIT_ERROR;
        } else {
            struct table t;
            table_from_objects(&t, m, false);
            table_print(&t, stdout);
            table_free(&t);
            static const char *const extra[] = {"leader", "leader_id", "term", NULL};
            for (const char *const *k = extra; *k; k++) {
                json_t *v = json_object_get(j, *k);
                if (v && !json_is_object(v) && !json_is_array(v)) {
                    char *s = json_text(v, false);
                    printf("%s: %s\n", *k, s);
                    tk_free(s);
                }
            }
        }
        json_decref(j);
    }
    cli_response_free(&r);
    return code;
}
