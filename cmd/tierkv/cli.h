/* The tierkv command-line client: shared internal declarations.
 *
 * The CLI is a client of tierkvd's HTTP/JSON gateway (DESIGN.md "HTTP/JSON
 * gateway (v1)") and, for `bench --protocol etcd`, of etcd's v3 JSON gateway.
 * It links base/ only (errors, histogram, PRNG) plus libuv (bench), http-parser
 * and jansson; it never links node/ or gateway/. Everything here runs on the
 * caller's thread unless a function says otherwise.
 *
 * Files: args.c (pure parsing helpers: endpoints, durations, sizes, the
 * read/write mix, key distributions, URL and base64 coding, exit codes);
 * client.c (a blocking HTTP/1.1 client that tries each endpoint and follows
 * the leader hint); commands.c (put, get, del, scan, incr, txn, batch, status,
 * members); snapshot.c (backups: save, status; it links kv/backup.c's small
 * library, base and libcrypto, to check files); bench.c (the libuv load
 * generator); table.c (the command table and the usage text derived from
 * it); main.c (global flags, endpoints, dispatch through the table). */
#ifndef TK_CMD_TIERKV_CLI_H
#define TK_CMD_TIERKV_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base64.h" /* tk_base64_*: the CLI sends keys and values as base64 */
#include "base/prng.h"

/* Process exit codes; docs/cli.md and `tierkv --help` list the same table. */
enum cli_exit {
    CLI_EXIT_OK = 0,          /* success */
    CLI_EXIT_ERROR = 1,       /* unexpected server answer or internal error */
    CLI_EXIT_USAGE = 2,       /* bad flags, arguments or input file */
    CLI_EXIT_NOTFOUND = 3,    /* the key does not exist (404) */
    CLI_EXIT_COMPARE = 4,     /* compare failed: 409, or a txn took its else branch */
    CLI_EXIT_UNAVAILABLE = 5, /* no endpoint reachable, or no leader (503) */
    CLI_EXIT_TIMEOUT = 6,     /* the client or the server (504) timed out */
    CLI_EXIT_REJECTED = 7,    /* the server refused the request (400, 413, 4xx) */
};

/* The exit code for a final HTTP status (2xx gives CLI_EXIT_OK). */
int cli_exit_for_status(int http_status);

/* ---- args.c: pure parsing helpers (unit-tested in tests/cli_test.c) ---- */

#define CLI_HOST_MAX 256
#define CLI_ENDPOINTS_MAX 32

struct cli_endpoint {
    char host[CLI_HOST_MAX]; /* name or address, without IPv6 brackets */
    char port[8];            /* decimal, 1..65535 */
};

/* Parses "host:port", "[v6addr]:port" or "http[s]://host:port[/...]" into `ep`.
 * Returns 0 or TK_EINVAL (no port, bad port, empty or too long host). */
int cli_parse_hostport(const char *s, struct cli_endpoint *ep);

/* Parses a comma-separated endpoint list into `eps` (capacity `cap`); empty
 * items, bad items or more than `cap` items give TK_EINVAL. */
int cli_parse_endpoints(const char *s, struct cli_endpoint *eps, size_t cap, size_t *n);

/* Extracts an address from an X-Tierkv-Leader header (or the "leader" field of
 * a 503 error): "host:port", "http://host:port", "2@host:port", "2=host:port",
 * or a list of "key=value" pairs holding "http=host:port". Returns 0,
 * TK_ENOTFOUND when the hint names no address (a bare node id or ""), or
 * TK_EINVAL when it is malformed. */
int cli_parse_leader_hint(const char *hint, struct cli_endpoint *ep);

/* "250ms", "10s", "1.5s", "2m", or a bare number of seconds. Result > 0. */
int cli_parse_duration_ms(const char *s, uint64_t *ms);
/* "64", "4k", "4KiB", "1m", "1MiB" (binary units). */
int cli_parse_size(const char *s, uint64_t *bytes);
/* A decimal integer in [lo, hi]. */
int cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
int cli_parse_i64(const char *s, int64_t *out);

/* The read/write mix: "R:W" (e.g. "90:10", "1:1"), or "read"/"get" (all
 * reads) or "write"/"put" (all writes). Gives the fraction of reads, [0, 1]. */
int cli_parse_mix(const char *s, double *read_fraction);

enum cli_dist { CLI_DIST_UNIFORM, CLI_DIST_ZIPF };
/* "uniform", "zipf" (theta 0.99) or "zipf:THETA" with 0 < THETA < 1. */
int cli_parse_dist(const char *s, enum cli_dist *dist, double *theta);

/* A Zipfian generator over ranks [0, n) (Gray et al., "Quickly generating
 * billion-record synthetic databases", as in YCSB): rank 0 is the hottest.
 * Init costs O(n) once; next() is O(1). */
struct cli_zipf {
    uint64_t n;
    double theta, alpha, zetan, eta, half_pow_theta;
};
int cli_zipf_init(struct cli_zipf *z, uint64_t n, double theta);
uint64_t cli_zipf_next(const struct cli_zipf *z, struct tk_prng *p);

/* Percent-encodes everything but RFC 3986 unreserved bytes. Writes at most
 * `cap` bytes including the NUL; returns the length needed (without NUL), so a
 * result >= cap means truncated (3 * len + 1 always suffices). */
size_t cli_url_encode(const void *src, size_t len, char *out, size_t cap);

/* ---- client.c: blocking HTTP/1.1 against a list of endpoints ---- */

/* The limits of one response: larger bodies are an error (TK_ETOOBIG). */
#define CLI_BODY_MAX (64u << 20)
#define CLI_HEADER_VALUE_MAX 512

struct cli_response {
    int status;
    char *body; /* NUL-terminated, owned (cli_response_free) */
    size_t body_len;
    char leader[CLI_HEADER_VALUE_MAX];      /* X-Tierkv-Leader, "" if absent */
    char leader_addr[CLI_HEADER_VALUE_MAX]; /* X-Tierkv-Leader-Addr, "" if absent */
    char revision[32];                      /* X-Tierkv-Revision, "" if absent */
    char location[CLI_HEADER_VALUE_MAX];    /* Location, "" if absent */
    char content_type[128];
    char retry_after[16];
    bool keep_alive;
    uint64_t body_sunk; /* 2xx body bytes written to the cli_body_sink file */
};
void cli_response_free(struct cli_response *r);

/* An incremental response parser (http-parser underneath), exposed for tests. */
struct cli_resp_parser;
struct cli_resp_parser *cli_resp_parser_new(struct cli_response *into);
/* Feeds bytes; len 0 means EOF. Returns 0 (more needed), 1 (complete), or
 * TK_EPROTO / TK_ETOOBIG. */
int cli_resp_parser_feed(struct cli_resp_parser *p, const char *buf, size_t len);
void cli_resp_parser_free(struct cli_resp_parser *p);

struct cli_client {
    struct cli_endpoint eps[CLI_ENDPOINTS_MAX];
    size_t n_eps;
    size_t preferred; /* index of the endpoint that answered last */
    int timeout_ms;   /* per attempt: connect + request + response */
    int retries;      /* extra passes over all endpoints after 503/unreachable */
    bool verbose;     /* log each attempt to stderr */
    /* Never resend a request that may have reached the server (an attempt
     * that timed out or lost its connection after sending): for changes that
     * are not idempotent (membership). cli_request then returns at once. */
    bool no_resend;
    /* Set by cli_request: its last attempt sent the request and got no
     * answer, so the server may have applied it. */
    bool maybe_applied;
    /* The endpoint that gave the last answer (valid after cli_request). */
    struct cli_endpoint answered;
};

/* Sends one request, trying endpoints in order starting at the preferred one.
 * A connection failure or a 503 moves on; a 503 or 307/308 naming a leader
 * (X-Tierkv-Leader-Addr or X-Tierkv-Leader, or Location) is followed first. Returns 0
 * with `out` filled (any final status, including a 503 when every endpoint answered 503),
 * or TK_EUNAVAIL (nothing reachable) / TK_ETIMEDOUT, with a message in `err`.
 * `path` includes the query string; `body` may be NULL. */
int cli_request(struct cli_client *c, const char *method, const char *path,
                const char *content_type, const void *body, size_t body_len,
                struct cli_response *out, char *err, size_t err_cap);

/* How every connection of this process is secured: TLS (a client context
 * from tls/tls.h, NULL: plain HTTP) and a bearer token (NULL: none; at most
 * CLI_TOKEN_MAX bytes), sent as "Authorization: Bearer". Set once by main
 * before any request or bench thread; read-only afterwards. */
#define CLI_TOKEN_MAX 512
struct tk_tls_ctx;
struct cli_security {
    struct tk_tls_ctx *tls;
    const char *token;
};
void cli_security_set(const struct cli_security *s);
const struct cli_security *cli_security_get(void);
/* From now on, the bodies of 2xx answers go to `f` (emptied at the start of
 * each attempt) instead of memory, without a size limit; NULL: memory again.
 * For downloads (tierkv snapshot save). A failed write to f fails the
 * attempt with TK_EIO. */
void cli_body_sink(FILE *f);

/* One request to one endpoint, no failover (status uses it per endpoint). */
int cli_request_one(const struct cli_endpoint *ep, int timeout_ms, const char *method,
                    const char *path, const char *content_type, const void *body,
                    size_t body_len, struct cli_response *out, char *err, size_t err_cap);

/* A streamed answer (GET, chunked): cb(status, line, len, data) runs for
 * each line of the body (the newline removed, NUL-terminated) as it arrives;
 * a nonzero return stops and becomes cli_stream's result. Returns that, or
 * TK_ECLOSED when the stream ended, TK_EUNAVAIL / TK_ETIMEDOUT (connect),
 * TK_EPROTO (malformed), with a message in err. Lines over 4 MiB are
 * skipped. */
typedef int cli_line_cb(int status, const char *line, size_t len, void *data);
int cli_stream(const struct cli_endpoint *ep, int connect_timeout_ms, const char *path,
               const char *accept, cli_line_cb *cb, void *data, char *err,
               size_t err_cap);

/* ---- commands.c ---- */

struct cli_global {
    struct cli_client client;
    bool json;            /* machine output */
    bool base64;          /* ask the server for base64 values and decode them */
    char mode[16];        /* writes: "", "applied" or "committed" */
    char consistency[16]; /* reads: "", "linearizable" or "stale" */
    bool timeout_set;     /* --timeout was given (member changes keep their own) */
};

/* An empty KEY is a usage error for every command that takes one (a GET of
 * /v1/kv/ would list every key): prints why, names the way to list keys
 * (tierkv scan) and returns CLI_EXIT_USAGE; 0 for a non-empty key. */
int cli_check_key(const char *cmd, const char *key);

int cli_cmd_put(struct cli_global *g, int argc, char **argv);
int cli_cmd_get(struct cli_global *g, int argc, char **argv);
int cli_cmd_del(struct cli_global *g, int argc, char **argv);
int cli_cmd_scan(struct cli_global *g, int argc, char **argv);
int cli_cmd_incr(struct cli_global *g, int argc, char **argv);
int cli_cmd_txn(struct cli_global *g, int argc, char **argv);
int cli_cmd_batch(struct cli_global *g, int argc, char **argv);
int cli_cmd_status(struct cli_global *g, int argc, char **argv);
int cli_cmd_members(struct cli_global *g, int argc, char **argv);
/* member.c: tierkv member list|add|promote|remove. */
int cli_cmd_member(struct cli_global *g, int argc, char **argv);
/* watch.c */
int cli_cmd_watch(struct cli_global *g, int argc, char **argv);
/* snapshot.c: tierkv snapshot save|status. */
int cli_cmd_snapshot(struct cli_global *g, int argc, char **argv);
/* lease.c: lease grant|keepalive|revoke|get, lock, elect */
int cli_cmd_lease(struct cli_global *g, int argc, char **argv);
int cli_cmd_lock(struct cli_global *g, int argc, char **argv);
int cli_cmd_elect(struct cli_global *g, int argc, char **argv);

/* ---- table.c: the command table, dispatch's and the usage's one source ---- */

/* Where the endpoints come from when -e and TIERKV_ENDPOINTS are not given
 * (main.c reads the file; the usage names both). The file is the one `make
 * run` writes (scripts/run-cluster.sh), relative to the working directory. */
#define CLI_DEFAULT_ENDPOINTS "127.0.0.1:8080"
#define CLI_ENDPOINTS_FILE "data/endpoints"

/* The command needs the endpoints, TLS and token set up before it runs (every
 * command that talks to a server); without it main runs the handler at once. */
#define CLI_CMD_ENDPOINTS (1u << 0)
#define CLI_USAGE_LINES_MAX 2

/* One line of `tierkv --help`'s command list: "  NAME ARGS   HELP". */
struct cli_usage_line {
    const char *args; /* the synopsis after the name ("" for none) */
    const char *help; /* NULL: no such line */
};

struct cli_command {
    const char *name;
    const char *alias; /* a second name, not listed (NULL: none) */
    struct cli_usage_line usage[CLI_USAGE_LINES_MAX];
    /* Gets argv[0] = the command's name as typed, then its own arguments;
     * returns the exit code (enum cli_exit). */
    int (*run)(struct cli_global *g, int argc, char **argv);
    unsigned flags; /* CLI_CMD_* */
};

/* The row named `name` (or whose alias it is), or NULL. */
const struct cli_command *cli_command_find(const char *name);
/* All rows, in the order the usage lists them; returns their count. */
size_t cli_commands(const struct cli_command **rows);
/* `tierkv --help`: the commands section derived from the table, between the
 * fixed head and the global flags and exit codes. */
void cli_usage(FILE *f);

/* ---- bench.c ---- */

enum cli_protocol { CLI_PROTO_TIERKV, CLI_PROTO_ETCD };

struct bench_opts {
    enum cli_protocol protocol;
    uint64_t connections;
    uint64_t threads; /* loop threads, 1 or 2 (connections are split) */
    uint64_t duration_ms;
    uint64_t warmup_ms;
    uint64_t value_size;
    double read_fraction;
    uint64_t keys;
    enum cli_dist dist;
    double zipf_theta;
    uint64_t runs;
    uint64_t seed;
    uint64_t timeout_ms; /* a request older than this is an error */
    uint64_t rate;       /* --rate: requests per second in all; 0: unpaced */
    uint64_t slow_ms;    /* --slow-ms: print each request slower (0: none) */
    bool prefill;        /* write every key once before a run with reads */
    int progress;        /* -1 auto (a terminal), 0 off, 1 on */
    bool strict;         /* any error makes the exit code nonzero */
    char key_prefix[64];
    const char *plot; /* --plot FILE.svg (bench_timeline.h), or NULL */
    int cpu_pids[8];  /* --cpu-pids: servers whose CPU per op is reported */
    int n_cpu_pids;
};

void cli_bench_defaults(struct bench_opts *o);

/* Builds the request for one operation into `hdr` (the head, and for etcd
 * the start of the JSON body); the caller sends hdr, then `tail[0..n_tail)`.
 * Exposed for the unit tests, which parse it back. Returns the head length or
 * TK_ETOOBIG if `cap` is too small. */
struct bench_payload {
    const char *value; /* raw value, value_size bytes */
    const char *value_b64;
    size_t value_size, value_b64_len;
};
struct bench_iov {
    const char *base;
    size_t len;
};
long cli_bench_build(enum cli_protocol proto, bool is_read, const char *host,
                     const char *key, size_t key_len, const char *query,
                     const struct bench_payload *pl, char *hdr, size_t cap,
                     struct bench_iov tail[2], size_t *n_tail);

int cli_cmd_bench(struct cli_global *g, int argc, char **argv);

#endif
