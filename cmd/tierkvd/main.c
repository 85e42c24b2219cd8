/* tierkvd: one tierkv node with its HTTP/JSON gateway.
 *
 * Reads its configuration from flags and TIERKV_* environment variables (a
 * flag wins over the environment), checks it and says precisely what is wrong
 * when it is not usable, then starts the node with the gateway on the node's
 * loop. The main thread only waits for SIGINT/SIGTERM (sigwait; the signals
 * are blocked in every thread) and then stops the node: the gateway stops
 * accepting, in-flight requests are answered (503 shutting_down, or 500 for a
 * write whose outcome is unknown) and the store and the state machine are
 * closed. docs/tierkvd.md is the manual. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/blob.h"
#include "base/err.h"
#include "base/hostport.h"
#include "base/log.h"
#include "base/secret_file.h"
#include "gateway/gateway.h"
#include "kv/backup.h"
#include "kv/kv.h"
#include "node/node.h"
#include "node/node_mem.h"
#include "tls/tls.h"
#include "transport/transport.h"

#define VERSION "0.1.0"

static void restore_data(struct node_options *no);

/* The sections of --help, in this order (docs/tierkvd.md follows them). An
 * option with no group (0) is listed under "Other". */
#define OPT_GROUPS(X)                                                                    \
    X(OTHER, "Other")                                                                    \
    X(CLUSTER, "Cluster")                                                                \
    X(STORAGE, "Storage")                                                                \
    X(HTTP, "HTTP")                                                                      \
    X(SECURITY, "Security")                                                              \
    X(LIMITS, "Limits")                                                                  \
    X(WATCH, "Watches")                                                                  \
    X(TUNING, "Tuning")                                                                  \
    X(OPERATIONS, "Operations")
#define OPT_GROUP_ENUM(name, title) G_##name,
enum opt_group { OPT_GROUPS(OPT_GROUP_ENUM) G_COUNT };
#define OPT_GROUP_TITLE(name, title) title,
static const char *const group_titles[] = {OPT_GROUPS(OPT_GROUP_TITLE)};

/* An option. A boolean (is_bool) takes no value on the command line
 * (--flag is on) or exactly one of TK_BOOL_ACCEPTED after '=' or in its
 * variable; parse_bools() checks every one before anything reads it, and
 * only get_bool() reads a boolean. */
struct opt {
    const char *flag; /* without "--" */
    const char *env;
    const char *def; /* NULL: unset */
    const char *help;
    bool is_bool;
    const char *val;
    const char *placeholder; /* --help and the man page: --flag PLACEHOLDER */
    enum opt_group group;    /* the --help section it is listed in */
};

static struct opt opts[] = {
    {"id", "TIERKV_ID", "1", "this node's id (a positive integer, one of --members)", 0,
     0, "ID", G_CLUSTER},
    {"members", "TIERKV_MEMBERS", NULL,
     "every voter as id=host:raft-port, comma-separated, e.g. "
     "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 (unset: a single-node cluster)",
     0, 0, "LIST", G_CLUSTER},
    {"members-http", "TIERKV_MEMBERS_HTTP", NULL,
     "optional id=host:http-port list; shown in /v1/cluster and sent as "
     "X-Tierkv-Leader-Addr",
     0, 0, "LIST", G_CLUSTER},
    {"join", "TIERKV_JOIN", NULL,
     "join a running cluster: --members lists its voters (not this node), "
     "--listen-raft is this node's address; the node waits to be added "
     "(tierkv member add) and has no bootstrap configuration of its own",
     1, 0, NULL, G_CLUSTER},
    {"cluster-id", "TIERKV_CLUSTER_ID", "1", "cluster id checked in the raft handshake",
     0, 0, "ID", G_CLUSTER},
    {"listen-raft", "TIERKV_LISTEN_RAFT", NULL,
     "raft listen address host:port (default: this node's address in --members)", 0, 0,
     "HOST:PORT", G_CLUSTER},
    {"listen-http", "TIERKV_LISTEN_HTTP", "127.0.0.1:8080",
     "HTTP listen address host:port", 0, 0, "HOST:PORT", G_HTTP},
    {"data-dir", "TIERKV_DATA_DIR", "data",
     "data directory (fs store), created if missing", 0, 0, "DIR", G_STORAGE},
    {"store", "TIERKV_STORE", "fs",
     "fs (durable files under --data-dir) or mem (memory "
     "volume, lost on exit)",
     0, 0, "fs|mem", G_STORAGE},
    {"tick-ms", "TIERKV_TICK_MS", "10", "raft tick in milliseconds", 0, 0, "MS",
     G_TUNING},
    {"election-ticks", "TIERKV_ELECTION_TICKS", "20",
     "election timeout in ticks (randomized between 1x and 2x)", 0, 0, "N", G_TUNING},
    {"heartbeat-ticks", "TIERKV_HEARTBEAT_TICKS", "2", "heartbeat interval in ticks", 0,
     0, "N", G_TUNING},
    {"request-timeout-ms", "TIERKV_REQUEST_TIMEOUT_MS", "10000",
     "deadline of a request inside the node (then 504)", 0, 0, "MS", G_HTTP},
    {"header-timeout-ms", "TIERKV_HEADER_TIMEOUT_MS", "10000",
     "first byte to end of headers (then 408 and close)", 0, 0, "MS", G_HTTP},
    {"body-timeout-ms", "TIERKV_BODY_TIMEOUT_MS", "30000",
     "end of headers to end of body (then 408 and close)", 0, 0, "MS", G_HTTP},
    {"idle-timeout-ms", "TIERKV_IDLE_TIMEOUT_MS", "60000",
     "keep-alive connection without a request is closed after this", 0, 0, "MS", G_HTTP},
    {"write-timeout-ms", "TIERKV_WRITE_TIMEOUT_MS", "30000",
     "responses queued for a client that does not read them within this: closed", 0, 0,
     "MS", G_HTTP},
    {"max-key-bytes", "TIERKV_MAX_KEY_BYTES", "4K", "largest key (at most 4K)", 0, 0,
     "SIZE", G_LIMITS},
    {"max-value-bytes", "TIERKV_MAX_VALUE_BYTES", "1M", "largest value (at most 1M)", 0,
     0, "SIZE", G_LIMITS},
    {"max-body-bytes", "TIERKV_MAX_BODY_BYTES", "4M", "largest request body", 0, 0,
     "SIZE", G_LIMITS},
    {"max-header-bytes", "TIERKV_MAX_HEADER_BYTES", "16K",
     "largest request line + headers (then 431)", 0, 0, "SIZE", G_LIMITS},
    {"max-connections", "TIERKV_MAX_CONNECTIONS", NULL,
     "open HTTP connections (beyond: 503 and close); default: the descriptor limit "
     "(RLIMIT_NOFILE, raised to its hard limit at start) less a reserve for storage and "
     "peers, at most 65536",
     0, 0, "N", G_LIMITS},
    {"max-pipeline", "TIERKV_MAX_PIPELINE", "64",
     "requests in flight per connection before reading pauses", 0, 0, "N", G_LIMITS},
    {"memory-budget", "TIERKV_MEMORY_BUDGET", NULL,
     "the node's memory, split into the defaults of --kv-ring-bytes, "
     "--watch-events-bytes, --max-memory-bytes, --watch-total-bytes, --snapshot-bytes "
     "and the blob cache (each at most its own default; an explicit flag wins); "
     "default: a quarter of RAM, within 256M..4G",
     0, 0, "SIZE", G_LIMITS},
    {"max-memory-bytes", "TIERKV_MAX_MEMORY_BYTES", "512M",
     "request bodies + queued responses of all connections (beyond: 503 overloaded)", 0,
     0, "SIZE", G_LIMITS},
    {"scan-limit-max", "TIERKV_SCAN_LIMIT_MAX", "10000", "largest ?limit of a scan", 0, 0,
     "N", G_LIMITS},
    {"snapshot-entries", "TIERKV_SNAPSHOT_ENTRIES", "100000",
     "take a snapshot (and compact the log) once this many entries are applied since the "
     "last one",
     0, 0, "N", G_STORAGE},
    {"snapshot-bytes", "TIERKV_SNAPSHOT_BYTES", "64M",
     "... or once this many bytes of commands are (0: no byte threshold)", 0, 0, "SIZE",
     G_STORAGE},
    {"trailing-entries", "TIERKV_TRAILING_ENTRIES", "10000",
     "entries kept behind a snapshot for followers a little behind", 0, 0, "N",
     G_STORAGE},
    {"spin-us", "TIERKV_SPIN_US", "0",
     "after a loop turn that did work, keep polling this many microseconds before "
     "sleeping: what arrives meanwhile costs no thread wake-up, but the loop burns up to "
     "this much CPU after each burst (0: sleep at once)",
     0, 0, "US", G_TUNING},
    {"follower-inline-sync-us", "TIERKV_FOLLOWER_INLINE_SYNC_US", "0",
     "a follower writes and syncs an append on its loop, without the hand-off to the "
     "storage thread and back, when that thread is idle and the last sync took at most "
     "this long; a disk's stall then holds the loop (0: always hand over)",
     0, 0, "US", G_TUNING},
    {"stall-probe-ms", "TIERKV_STALL_PROBE_MS", "0",
     "while one loop turn has run this long, log what the loop thread waits on as the "
     "kernel sees it: state, system call, wait channel, kernel stack (0: off)",
     0, 0, "MS", G_OPERATIONS},
    {"lease-checkpoint-ms", "TIERKV_LEASE_CHECKPOINT_MS", "200",
     "the leader checkpoints the leases' remaining TTLs this often (a lease outlives "
     "its TTL by at most this plus an election per leader change)",
     0, 0, "MS", G_TUNING},
    {"watch-events", "TIERKV_WATCH_EVENTS", "65536",
     "events the change log holds for watches (older ones: compacted); 0: none", 0, 0,
     "N", G_WATCH},
    {"watch-events-bytes", "TIERKV_WATCH_EVENTS_BYTES", "16M",
     "bytes the change log holds (keys, values, previous values)", 0, 0, "SIZE", G_WATCH},
    {"watch-buffer-bytes", "TIERKV_WATCH_BUFFER_BYTES", "1M",
     "a watch's bytes its client has not taken yet before it is cancelled (lagging)", 0,
     0, "SIZE", G_WATCH},
    {"watch-stall-ms", "TIERKV_WATCH_STALL_MS", "3000",
     "a watch whose buffer is full and whose client takes nothing for this long is "
     "cancelled (lagging)",
     0, 0, "MS", G_WATCH},
    {"watch-total-bytes", "TIERKV_WATCH_TOTAL_BYTES", "64M",
     "all watches' bytes their clients have not taken; past it the watches holding "
     "the most are cancelled (lagging) at once",
     0, 0, "SIZE", G_WATCH},
    {"max-watchers", "TIERKV_MAX_WATCHERS", "10000",
     "open watches on this node (beyond: 503)", 0, 0, "N", G_LIMITS},
    {"kv-ring-bytes", "TIERKV_KV_RING_BYTES", "64M",
     "memory for the newest versions (the hot tier); past it they are written to the "
     "cold tier in the background (larger: fewer tier-downs, more memory)",
     0, 0, "SIZE", G_STORAGE},
    {"kv-writeback-pace", "TIERKV_KV_WRITEBACK_PACE", "3",
     "a background tier-down's cold-tier commit writes its pages out 4 MiB of the "
     "file at a time, sleeping N times each slice's write time, before its fsync: "
     "a burst of hundreds of MB otherwise holds every raft log fsync on the same "
     "disk (0: not paced)",
     0, 0, "N", G_STORAGE},
    {"snapshot-read-pace", "TIERKV_SNAPSHOT_READ_PACE", "3",
     "a snapshot's read of the whole state (on the thread pool) sleeps N times the "
     "CPU time it uses, so that it takes at most 1/(N+1) of a core: at full speed "
     "the nodes' reads held writes on a 2-core VM even at the lowest priority "
     "(0: not paced)",
     0, 0, "N", G_STORAGE},
    {"kv-no-sync", "TIERKV_KV_NO_SYNC", NULL,
     "cold tier without fsync (benchmarks only; the raft log is still synced)", 1, 0,
     NULL, G_STORAGE},
    {"peer-token-file", "TIERKV_PEER_TOKEN_FILE", NULL,
     "file holding the cluster token (16 to 4096 bytes, the same on every node; "
     "trailing whitespace ignored) that authenticates raft peers",
     0, 0, "FILE", G_SECURITY},
    {"peer-cert-file", "TIERKV_PEER_CERT_FILE", NULL,
     "peer mutual TLS: this node's certificate chain (PEM), naming node-<id> (a DNS SAN, "
     "or the CN); with --peer-key-file and --peer-trusted-ca-file",
     0, 0, "FILE", G_SECURITY},
    {"peer-key-file", "TIERKV_PEER_KEY_FILE", NULL,
     "peer mutual TLS: the private key of --peer-cert-file (PEM)", 0, 0, "FILE",
     G_SECURITY},
    {"peer-trusted-ca-file", "TIERKV_PEER_TRUSTED_CA_FILE", NULL,
     "peer mutual TLS: the CAs every peer's certificate must chain to (PEM)", 0, 0,
     "FILE", G_SECURITY},
    {"insecure-peers", "TIERKV_INSECURE_PEERS", NULL,
     "allow a raft address off loopback without --peer-token-file or peer TLS (anyone "
     "who reaches it can act as a member; warned every minute)",
     1, 0, NULL, G_SECURITY},
    {"allow-loose-permissions", "TIERKV_ALLOW_LOOSE_PERMISSIONS", NULL,
     "accept secret files (--peer-token-file, --peer-key-file, --key-file, --auth-file) "
     "that group or others may read or write, with a warning; without it they are "
     "refused (for containers that mount secrets with other modes)",
     1, 0, NULL, G_SECURITY},
    {"cert-file", "TIERKV_CERT_FILE", NULL,
     "HTTPS: the gateway's certificate chain (PEM); with --key-file the gateway speaks "
     "only HTTPS",
     0, 0, "FILE", G_SECURITY},
    {"key-file", "TIERKV_KEY_FILE", NULL, "HTTPS: the private key of --cert-file (PEM)",
     0, 0, "FILE", G_SECURITY},
    {"client-ca-file", "TIERKV_CLIENT_CA_FILE", NULL,
     "HTTPS: require client certificates that chain to these CAs (PEM)", 0, 0, "FILE",
     G_SECURITY},
    {"auth-file", "TIERKV_AUTH_FILE", NULL,
     "bearer tokens: users, their token's SHA-256 and rights per key prefix "
     "(docs/tierkvd.md); every request but /healthz and /readyz then needs one",
     0, 0, "FILE", G_SECURITY},
    {"restore", "TIERKV_RESTORE", NULL,
     "initialize the empty --data-dir from this backup file (tierkv snapshot save), as "
     "this node of a new cluster with its own --cluster-id, then start; refused on a "
     "non-empty directory (docs/operations.md, Backup and restore)",
     0, 0, "FILE", G_OPERATIONS},
    {"force-new-cluster", "TIERKV_FORCE_NEW_CLUSTER", NULL,
     "disaster recovery: start as the only voter, keeping every entry of the log; then "
     "add the others back as new members (docs/operations.md, Disaster recovery)",
     1, 0, NULL, G_OPERATIONS},
    {"log-level", "TIERKV_LOG_LEVEL", "info", "debug, info, warn, error or off", 0, 0,
     "LEVEL", G_OPERATIONS},
    {"log-format", "TIERKV_LOG_FORMAT", "logfmt", "logfmt or json", 0, 0, "FORMAT",
     G_OPERATIONS},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* --help's width: every line fits in 79 columns. */
#define HELP_COLS 79
#define HELP_INDENT 26 /* where the descriptions start */

/* Prints `text` as words wrapped to HELP_COLS, the first line continuing at
 * column `col` (already printed), the next ones indented HELP_INDENT. */
static void help_wrap(FILE *f, const char *text, int col)
{
    const char *p = text;
    while (*p != 0) {
        size_t word = strcspn(p, " ");
        bool first = col == HELP_INDENT;
        if (!first && col + 1 + (int)word > HELP_COLS) {
            fprintf(f, "\n%*s", HELP_INDENT, "");
            col = HELP_INDENT;
            first = true;
        }
        col += fprintf(f, "%s%.*s", first ? "" : " ", (int)word, p);
        p += word;
        p += strspn(p, " ");
    }
    fputc('\n', f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tierkvd [--flag VALUE | --flag=VALUE]...\n\n"
               "Runs one tierkv node and its HTTP/JSON gateway. Every flag has an\n"
               "environment variable (shown with its default); a flag wins over its\n"
               "variable. SIZE takes K, M, G (binary): 4096, 64K, 1M. A flag shown\n"
               "with [=BOOL] is true alone, or takes one of " TK_BOOL_ACCEPTED ".\n");
    for (int g = G_OTHER + 1; g <= G_COUNT; g++) {
        int shown = g == G_COUNT ? G_OTHER : g; /* "Other" last */
        fprintf(f, "\n%s:\n", group_titles[shown]);
        for (size_t i = 0; i < N_OPTS; i++) {
            const struct opt *o = &opts[i];
            if ((int)o->group != shown)
                continue;
            char lhs[64];
            int n = snprintf(lhs, sizeof(lhs), "  --%s%s%s", o->flag,
                             o->is_bool ? "[=BOOL]" : " ",
                             o->is_bool       ? ""
                             : o->placeholder ? o->placeholder
                                              : "VALUE");
            fputs(lhs, f);
            if (n + 1 >= HELP_INDENT)
                fprintf(f, "\n%*s", HELP_INDENT, "");
            else
                fprintf(f, "%*s", HELP_INDENT - n, "");
            help_wrap(f, o->help, HELP_INDENT);
            char env[128];
            snprintf(env, sizeof(env), "(env %s%s%s)", o->env, o->def ? ", default " : "",
                     o->def ? o->def : "");
            fprintf(f, "%*s", HELP_INDENT, "");
            help_wrap(f, env, HELP_INDENT);
        }
    }
    fprintf(f, "  %-*s%s\n  %-*s%s\n\nSee docs/tierkvd.md (man tierkvd).\n",
            HELP_INDENT - 2, "--help", "this text", HELP_INDENT - 2, "--version",
            "print the version");
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tierkvd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(run tierkvd --help for every flag)\n", stderr);
    va_end(ap);
    exit(2);
}

static struct opt *find_opt(const char *flag, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].flag) == len && strncmp(opts[i].flag, flag, len) == 0)
            return &opts[i];
    return NULL;
}

/* A valued option's value (NULL: unset). Never a boolean's: see get_bool. */
/* Whether a valued option was given (flag or variable), not its default. */
static bool given(const char *flag)
{
    struct opt *o = find_opt(flag, strlen(flag));
    TK_ASSERT(o != NULL);
    return o->val != o->def;
}

static const char *get(const char *flag)
{
    struct opt *o = find_opt(flag, strlen(flag));
    TK_ASSERT(o != NULL);
    TK_ASSERT(!o->is_bool);
    return o->val;
}

/* A boolean option: off unless set to a true value (parse_bools() has
 * refused every other value). */
static bool get_bool(const char *flag)
{
    struct opt *o = find_opt(flag, strlen(flag));
    TK_ASSERT(o != NULL);
    TK_ASSERT(o->is_bool);
    bool on = false;
    int rc = o->val != NULL ? tk_parse_bool(o->val, &on) : 0;
    TK_ASSERT(rc == 0);
    return on;
}

/* Every boolean, from the command line or its variable, through the one
 * parser: anything but TK_BOOL_ACCEPTED stops the start (exit 2), so that a
 * value meaning "off" can never leave an option on. */
static void parse_bools(void)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        bool on;
        if (!o->is_bool || o->val == NULL || tk_parse_bool(o->val, &on) == 0)
            continue;
        if (o->val == getenv(o->env)) /* not given on the command line */
            die("%s=\"%s\" (--%s) is not a boolean: use " TK_BOOL_ACCEPTED, o->env,
                o->val, o->flag);
        die("--%s=\"%s\" is not a boolean: use " TK_BOOL_ACCEPTED
            " (or --%s alone for true)",
            o->flag, o->val, o->flag);
    }
}

static uint64_t get_u64(const char *flag, uint64_t min, uint64_t max)
{
    const char *s = get(flag);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
        die("--%s: \"%s\" is not an integer between %" PRIu64 " and %" PRIu64, flag, s,
            min, max);
    return v;
}

/* 4096, 4K, 1M, 2G (binary units). */
static uint64_t get_size(const char *flag, uint64_t min, uint64_t max)
{
    const char *s = get(flag);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        die("--%s: \"%s\" is not a size (examples: 4096, 64K, 1M)", flag, s);
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1024;
    else if (*end == 'm' || *end == 'M')
        mul = 1024 * 1024;
    else if (*end == 'g' || *end == 'G')
        mul = 1024ull * 1024 * 1024;
    if (mul != 1)
        end++;
    if ((*end == 'b' || *end == 'B') && mul != 1)
        end++;
    if (*end)
        die("--%s: \"%s\" is not a size (examples: 4096, 64K, 1M)", flag, s);
    if (v > max / mul || v * mul < min || v * mul > max)
        die("--%s: %s is out of range (%" PRIu64 " to %" PRIu64 " bytes)", flag, s, min,
            max);
    return v * mul;
}

/* Descriptors kept for storage (segments, LMDB, snapshots), raft peers and
 * the 503s sent past --max-connections: at least FD_RESERVE_MIN, or an
 * eighth of the limit. */
#define FD_RESERVE_MIN 256u
#define CONNS_DEFAULT_MAX 65536u

/* Raises RLIMIT_NOFILE's soft limit to the hard one (a shortage of
 * descriptors must never reach storage); returns the limit now in force. */
static uint64_t raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (1u << 20) : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl = want;
    }
    return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : (uint64_t)rl.rlim_cur;
}

/* --max-connections: the flag, or what the descriptor limit allows. A value
 * that leaves storage and peers less than the reserve refuses to start. */
static uint32_t size_connections(uint64_t nofile, uint64_t *reserve)
{
    *reserve = nofile / 8 > FD_RESERVE_MIN ? nofile / 8 : FD_RESERVE_MIN;
    uint64_t room = nofile > *reserve ? nofile - *reserve : 0;
    if (get("max-connections") == NULL) {
        if (room == 0)
            die("the descriptor limit (RLIMIT_NOFILE %llu) leaves no room for HTTP "
                "connections beside the %llu kept for storage and peers; raise it "
                "(ulimit -n)",
                (unsigned long long)nofile, (unsigned long long)*reserve);
        return (uint32_t)(room < CONNS_DEFAULT_MAX ? room : CONNS_DEFAULT_MAX);
    }
    uint64_t v = get_u64("max-connections", 1, 1000000);
    if (v > room)
        die("--max-connections (%llu) leaves fewer than %llu of the %llu descriptors "
            "(RLIMIT_NOFILE) for storage and peers; lower it or raise the limit "
            "(ulimit -n)",
            (unsigned long long)v, (unsigned long long)*reserve,
            (unsigned long long)nofile);
    return (uint32_t)v;
}

static bool is_ip_literal(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static bool is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* A secret file (--peer-token-file, --peer-key-file, --key-file,
 * --auth-file) opened and checked (base/secret_file.h): a file group or
 * others may read or write stops the start, unless --allow-loose-permissions
 * is given; then it is logged once as a warning. Returns the descriptor. */
static int open_secret(const char *flag, const char *path)
{
    char msg[TK_SECRET_MSG_MAX];
    int fd;
    if (tk_secret_file_open(path, get_bool("allow-loose-permissions"), &fd, msg,
                            sizeof(msg)) != 0)
        die("--%s: %s", flag, msg);
    if (msg[0] != 0)
        tk_logf(TK_LOG_WARN, 0, 0, NULL, "--%s: %s", flag, msg);
    return fd;
}

/* A path a loader that takes only paths (OpenSSL, the auth file) opens to
 * read the very file open_secret checked: /proc/self/fd/N, or the path
 * itself where /proc is not mounted. */
static const char *secret_path(int fd, const char *path, char *buf, size_t cap)
{
    tk_secret_file_fd_path(fd, buf, cap);
    return access(buf, R_OK) == 0 ? buf : path;
}

/* A loader's message names the /proc path it was given: name the file. */
static void name_secret(char *msg, size_t cap, const char *proc, const char *path)
{
    char out[1024];
    size_t o = 0, plen = strlen(proc);
    for (const char *m = msg; *m != 0 && o + 1 < sizeof(out);) {
        if (plen > 0 && strncmp(m, proc, plen) == 0) {
            o += (size_t)snprintf(out + o, sizeof(out) - o, "%s", path);
            if (o >= sizeof(out))
                o = sizeof(out) - 1;
            m += plen;
        } else {
            out[o++] = *m++;
        }
    }
    size_t n = o < cap - 1 ? o : cap - 1;
    memcpy(msg, out, n);
    msg[n] = 0;
}

/* --cert-file, --key-file, --client-ca-file: the gateway's HTTPS context,
 * or NULL for plain HTTP. A file that does not load stops the start. */
static struct tk_tls_ctx *gateway_tls(struct gateway_config *gc)
{
    const char *cert = get("cert-file"), *key = get("key-file"),
               *ca = get("client-ca-file");
    if (cert == NULL && key == NULL && ca == NULL)
        return NULL;
    if (cert == NULL || key == NULL)
        die("HTTPS needs both --cert-file and --key-file%s",
            ca != NULL ? " (--client-ca-file alone is not enough)" : "");
    char proc[TK_SECRET_FD_PATH_MAX];
    int fd = open_secret("key-file", key);
    struct tk_tls_ctx_config tc = {.server = true,
                                   .cert_file = cert,
                                   .key_file = secret_path(fd, key, proc, sizeof(proc)),
                                   .ca_file = ca};
    char err[TK_TLS_ERR_MAX];
    int rc = tk_tls_ctx_new(&tc, &gc->tls, err, sizeof(err));
    close(fd);
    if (rc != 0) {
        name_secret(err, sizeof(err), proc, key);
        die("HTTPS (--cert-file, --key-file, --client-ca-file): %s", err);
    }
    return gc->tls;
}

/* --peer-cert-file, --peer-key-file, --peer-trusted-ca-file: the two peer
 * TLS contexts (inbound and dialing), all three flags or none. */
static void peer_tls(struct node_options *no)
{
    const char *cert = get("peer-cert-file"), *key = get("peer-key-file"),
               *ca = get("peer-trusted-ca-file");
    if (cert == NULL && key == NULL && ca == NULL)
        return;
    if (cert == NULL || key == NULL || ca == NULL)
        die("peer TLS needs all of --peer-cert-file, --peer-key-file and "
            "--peer-trusted-ca-file");
    if (no->hub != NULL || no->listen_host == NULL)
        die("peer TLS needs --members (a single node has no raft peers)");
    char err[TK_TLS_ERR_MAX], proc[TK_SECRET_FD_PATH_MAX];
    int fd = open_secret("peer-key-file", key);
    struct tk_tls_ctx_config tc = {.server = true,
                                   .cert_file = cert,
                                   .key_file = secret_path(fd, key, proc, sizeof(proc)),
                                   .ca_file = ca};
    int rc = tk_tls_ctx_new(&tc, &no->peer_tls_server, err, sizeof(err));
    if (rc == 0) {
        tc.server = false;
        rc = tk_tls_ctx_new(&tc, &no->peer_tls_client, err, sizeof(err));
    }
    close(fd);
    if (rc != 0) {
        name_secret(err, sizeof(err), proc, key);
        die("peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file): %s",
            err);
    }
}

/* --peer-token-file and --insecure-peers: reads the token into `tok` and
 * refuses a raft address off loopback with neither. Returns whether the
 * peers are open (the caller warns every minute). A raft port on loopback
 * with neither a token nor peer TLS starts, but says once that every local
 * process can reach it. */
static bool peer_security(struct node_options *no, uint8_t *tok, size_t cap)
{
    const char *path = get("peer-token-file");
    if (path != NULL) {
        char msg[TK_SECRET_MSG_MAX];
        size_t n = 0;
        int rc = tk_secret_file_read(path, get_bool("allow-loose-permissions"), tok, cap,
                                     &n, msg, sizeof(msg));
        if (rc != 0 && rc != TK_ETOOBIG)
            die("--peer-token-file: %s", msg);
        if (rc == TK_ETOOBIG || n < TRANSPORT_TCP_TOKEN_MIN)
            die("--peer-token-file: \"%s\" must hold %d to %zu bytes (make one with: "
                "(umask 077; openssl rand -hex 32 > FILE))",
                path, TRANSPORT_TCP_TOKEN_MIN, cap);
        if (msg[0] != 0)
            tk_logf(TK_LOG_WARN, no->id, 0, NULL, "--peer-token-file: %s", msg);
        no->peer_token = tok;
        no->peer_token_len = n;
        return false;
    }
    if (no->peer_tls_server != NULL || no->hub != NULL || no->listen_host == NULL)
        return false;
    if (is_loopback(no->listen_host)) {
        char kvs[GATEWAY_ADDR_MAX + 32];
        snprintf(kvs, sizeof(kvs), "raft=%s:%u", no->listen_host, no->listen_port);
        tk_logf(TK_LOG_WARN, no->id, 0, kvs,
                "the raft port is open to every local process (no --peer-token-file nor "
                "peer TLS): any of them can act as a member. Give every node the same "
                "--peer-token-file (docs/operations.md)");
        return false;
    }
    if (!get_bool("insecure-peers"))
        die("the raft address %s is not loopback and there is no --peer-token-file nor "
            "peer TLS: anyone who reaches it could act as a member. Give every node the "
            "same --peer-token-file, or --peer-cert-file, --peer-key-file and "
            "--peer-trusted-ca-file (docs/operations.md), or --insecure-peers to run "
            "open",
            no->listen_host);
    return true;
}

struct member {
    uint64_t id;
    char host[GATEWAY_ADDR_MAX];
    uint16_t port;
    char text[GATEWAY_ADDR_MAX];
};

static size_t parse_members(const char *flag, const char *s, struct member *out,
                            size_t max)
{
    size_t n = 0;
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[GATEWAY_ADDR_MAX + 32];
        if (len == 0 || len >= sizeof(item))
            die("--%s: empty or overlong entry in \"%s\" (expected id=host:port,...)",
                flag, s);
        memcpy(item, p, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        if (eq == NULL)
            die("--%s: entry \"%s\" is not id=host:port (example: 1=127.0.0.1:7001)",
                flag, item);
        *eq = 0;
        char *end;
        errno = 0;
        unsigned long long id = strtoull(item, &end, 10);
        if (errno || end == item || *end || id == 0 || item[0] == '-')
            die("--%s: \"%s\" is not a positive node id", flag, item);
        if (n == max)
            die("--%s: more than %zu members", flag, max);
        for (size_t i = 0; i < n; i++)
            if (out[i].id == id)
                die("--%s: node id %llu appears twice", flag, id);
        out[n].id = id;
        if (tk_hostport_split(eq + 1, out[n].host, sizeof(out[n].host), &out[n].port) !=
                0 ||
            out[n].port == 0)
            die("--%s: \"%s\" is not host:port with a port in 1..65535", flag, eq + 1);
        snprintf(out[n].text, sizeof(out[n].text), "%s", eq + 1);
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    if (n == 0)
        die("--%s: no members in \"%s\"", flag, s);
    return n;
}

/* ---- JSON logs: logfmt lines from base/log.c rewritten as JSON ---------- */

static void json_str(char **o, char *end, const char *s, size_t len)
{
    char *p = *o;
    if (p < end)
        *p++ = '"';
    for (size_t i = 0; i < len && p + 7 < end; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *p++ = '\\';
            *p++ = (char)c;
        } else if (c < 0x20) {
            p += snprintf(p, (size_t)(end - p), "\\u%04x", c);
        } else {
            *p++ = (char)c;
        }
    }
    if (p < end)
        *p++ = '"';
    *o = p;
}

static void json_sink(const char *line, size_t len, void *data)
{
    (void)data;
    char out[TK_LOG_LINE_MAX * 2 + 16];
    char *o = out, *end = out + sizeof(out) - 4;
    *o++ = '{';
    size_t i = 0;
    bool first = true;
    while (i < len && line[i] != '\n') {
        while (i < len && line[i] == ' ')
            i++;
        size_t ks = i;
        while (i < len && line[i] != '=' && line[i] != ' ' && line[i] != '\n')
            i++;
        size_t klen = i - ks;
        if (klen == 0 || i >= len || line[i] != '=') {
            while (i < len && line[i] != ' ' && line[i] != '\n')
                i++;
            continue;
        }
        i++; /* '=' */
        char val[TK_LOG_LINE_MAX];
        size_t vlen = 0;
        if (i < len && line[i] == '"') {
            i++;
            while (i < len && line[i] != '"' && vlen < sizeof(val)) {
                if (line[i] == '\\' && i + 1 < len) {
                    i++;
                    val[vlen++] = line[i] == 'n' ? '\n' : line[i];
                } else {
                    val[vlen++] = line[i];
                }
                i++;
            }
            i++;
        } else {
            while (i < len && line[i] != ' ' && line[i] != '\n' && vlen < sizeof(val))
                val[vlen++] = line[i++];
        }
        if (!first && o < end)
            *o++ = ',';
        first = false;
        json_str(&o, end, line + ks, klen);
        if (o < end)
            *o++ = ':';
        json_str(&o, end, val, vlen);
    }
    *o++ = '}';
    *o++ = '\n';
    ssize_t w = write(STDERR_FILENO, out, (size_t)(o - out));
    (void)w;
}

/* ---- main -------------------------------------------------------------- */

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* glibc grows a thread's malloc arena (a 64 MiB heap reserved PROT_NONE)
 * one mprotect at a time, as far as each allocation needs: the node loop's
 * arena grows with the data, so the loop called mprotect page by page, and
 * mprotect waits for the process's mmap lock. Other threads hold that lock
 * (mapping and unmapping LMDB environments, snapshot buffers, mincore): the
 * stall probe caught the loop in mprotect, in D state, for up to 330 ms at
 * 10M keys (docs/benchmarks-scale.md). With a top pad of a whole heap, each
 * new heap is made read-write at once: one mprotect per 64 MiB. Setting it
 * also fixes the mmap threshold (no dynamic raising), here at glibc's
 * default 128 KiB: a bigger block stays a mapping of its own, so growing a
 * big array is an mremap, not a copy (with a 32 MiB threshold each node had
 * a turn of 3,900 page faults at about 2.4M entries, most likely such a
 * copy). Untouched pages cost no memory;
 * an arena keeps up to 64 MiB of freed top. Called before any thread starts. */
static void malloc_policy(void)
{
    (void)mallopt(M_TOP_PAD, 64 << 20);
    (void)mallopt(M_MMAP_THRESHOLD, 128 << 10);
}

int main(int argc, char **argv)
{
    malloc_policy();
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *e = getenv(opts[i].env);
        opts[i].val = e && *e ? e : opts[i].def;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            printf("tierkvd %s\n", VERSION);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            die("unexpected argument \"%s\" (flags start with --)", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        struct opt *o = find_opt(name, eq ? (size_t)(eq - name) : strlen(name));
        if (o == NULL)
            die("unknown flag \"%s\"", a);
        if (o->is_bool) {
            o->val = eq ? eq + 1 : "true";
        } else if (eq) {
            o->val = eq + 1;
        } else {
            if (i + 1 >= argc)
                die("--%s needs a value", o->flag);
            o->val = argv[++i];
        }
    }
    parse_bools();

    enum tk_log_level lvl;
    if (tk_log_parse_level(get("log-level"), &lvl) != 0)
        die("--log-level: \"%s\" is not debug, info, warn, error or off",
            get("log-level"));
    tk_log_set_level(lvl);
    if (strcmp(get("log-format"), "json") == 0)
        tk_log_set_sink(json_sink, NULL);
    else if (strcmp(get("log-format"), "logfmt") != 0)
        die("--log-format: \"%s\" is not logfmt or json", get("log-format"));

    struct node_options no;
    node_options_default(&no);
    no.id = get_u64("id", 1, UINT64_MAX);
    no.cluster_id = get_u64("cluster-id", 0, UINT64_MAX);
    no.tick_ms = (uint32_t)get_u64("tick-ms", 1, 60000);
    no.election_ticks = (uint32_t)get_u64("election-ticks", 2, 100000);
    no.heartbeat_ticks = (uint32_t)get_u64("heartbeat-ticks", 1, 100000);
    if (no.heartbeat_ticks >= no.election_ticks)
        die("--heartbeat-ticks (%u) must be smaller than --election-ticks (%u)",
            no.heartbeat_ticks, no.election_ticks);
    no.timeout_ms = get_u64("request-timeout-ms", 1, 3600000);
    no.snapshot_entries = get_u64("snapshot-entries", 1, UINT64_MAX);
    no.snapshot_bytes = get_size("snapshot-bytes", 0, UINT64_MAX);
    no.trailing_entries = get_u64("trailing-entries", 0, UINT64_MAX);
    no.spin_us = (uint32_t)get_u64("spin-us", 0, 1000000);
    no.follower_inline_sync_us = (uint32_t)get_u64("follower-inline-sync-us", 0, 1000000);
    no.stall_probe_ms = (uint32_t)get_u64("stall-probe-ms", 0, 60000);
    no.lease_checkpoint_ms = (uint32_t)get_u64("lease-checkpoint-ms", 10, 3600000);
    no.events_max = get_u64("watch-events", 0, 1u << 30);
    no.events_bytes = get_size("watch-events-bytes", 4096, 1ull << 40);
    no.kv_ring_bytes = get_size("kv-ring-bytes", 1u << 20, 1ull << 40);
    /* --memory-budget: each owner's default from the split (node/node_mem.h);
     * a flag given for an owner wins. TIERKV_MEM_TRIM=1 (hidden, off by
     * default: one malloc_trim(0) after a 72 MiB burst took 174 ms, holding
     * each arena's lock in turn, for 19 MiB back; docs/benchmarks.md "Memory")
     * caps glibc's arenas at 4 and starts the trimmer. */
    uint64_t mem_budget = given("memory-budget")
                              ? get_size("memory-budget", NODE_MEM_BUDGET_MIN, 1ull << 44)
                              : node_mem_default_budget();
    struct node_mem_split mem_split;
    node_mem_split(mem_budget, &mem_split);
    if (!given("kv-ring-bytes"))
        no.kv_ring_bytes = mem_split.ring;
    if (!given("watch-events-bytes"))
        no.events_bytes = mem_split.change_log;
    if (!given("snapshot-bytes"))
        no.snapshot_bytes = mem_split.raft_log;
    (void)tk_blob_cache_limit(mem_split.blob_cache);
    const char *mem_trim = getenv("TIERKV_MEM_TRIM");
    bool trim_on = mem_trim && strcmp(mem_trim, "1") == 0;
    if (node_mem_start(mem_budget, trim_on ? 4 : 0, trim_on) != 0)
        die("cannot start the memory trimmer thread");
    uint64_t pace = get_u64("kv-writeback-pace", 0, 100);
    no.kv_writeback_pace = pace > 0 ? (int)pace : -1;
    uint64_t read_pace = get_u64("snapshot-read-pace", 0, 100);
    no.snapshot_read_pace = read_pace > 0 ? (int)read_pace : -1;
    no.kv_no_sync = get_bool("kv-no-sync");
    no.seed = no.id * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();

    struct gateway_config gc;
    gateway_config_default(&gc);
    char http_host[GATEWAY_ADDR_MAX];
    if (tk_hostport_split(get("listen-http"), http_host, sizeof(http_host), &gc.port) !=
        0)
        die("--listen-http: \"%s\" is not host:port (example: 127.0.0.1:8080)",
            get("listen-http"));
    gc.host = http_host;
    gc.key_max = get_size("max-key-bytes", 1, 4096);
    gc.value_max = get_size("max-value-bytes", 1, 1 << 20);
    gc.body_max = get_size("max-body-bytes", 1, 1ull << 30);
    if (gc.body_max < gc.value_max)
        die("--max-body-bytes (%zu) must be at least --max-value-bytes (%zu)",
            gc.body_max, gc.value_max);
    /* A write's command is about its body (or its key and value): one over the
     * raft frame limit could never be replicated (node_submit refuses it). */
    if (gc.body_max > NODE_FRAME_MAX)
        die("--max-body-bytes (%zu) exceeds the raft frame limit (%u bytes; the "
            "largest entry is %u bytes): such a write could never be replicated",
            gc.body_max, NODE_FRAME_MAX, NODE_ENTRY_MAX);
    if (gc.key_max + gc.value_max + 1024 > NODE_ENTRY_MAX)
        die("--max-key-bytes + --max-value-bytes (%zu) exceed the largest raft entry "
            "(%u bytes)",
            gc.key_max + gc.value_max, NODE_ENTRY_MAX);
    gc.header_max = get_size("max-header-bytes", 1024, 1 << 20);
    uint64_t nofile = raise_nofile(), fd_reserve;
    gc.conns_max = size_connections(nofile, &fd_reserve);
    gc.pipeline_max = (uint32_t)get_u64("max-pipeline", 1, 65536);
    gc.header_timeout_ms = get_u64("header-timeout-ms", 1, 3600000);
    gc.body_timeout_ms = get_u64("body-timeout-ms", 1, 3600000);
    gc.idle_timeout_ms = get_u64("idle-timeout-ms", 1, 86400000);
    gc.write_timeout_ms = get_u64("write-timeout-ms", 1, 3600000);
    gc.mem_max = get_size("max-memory-bytes", 1 << 20, 1ull << 40);
    if (!given("max-memory-bytes"))
        gc.mem_max = mem_split.http > gc.body_max ? mem_split.http : gc.body_max;
    if (gc.mem_max < gc.body_max)
        die("--max-memory-bytes (%zu) must be at least --max-body-bytes (%zu)",
            gc.mem_max, gc.body_max);
    gc.scan_limit_max = (uint32_t)get_u64("scan-limit-max", 1, 1000000);
    gc.watch_buffer_bytes = get_size("watch-buffer-bytes", 1024, 1ull << 32);
    gc.watchers_max = (uint32_t)get_u64("max-watchers", 0, 1000000);
    gc.watch_stall_ms = get_u64("watch-stall-ms", 1, 3600000);
    gc.watch_total_bytes = get_size("watch-total-bytes", 1024, 1ull << 40);
    if (!given("watch-total-bytes"))
        gc.watch_total_bytes = mem_split.watch > gc.watch_buffer_bytes
                                   ? mem_split.watch
                                   : gc.watch_buffer_bytes;
    if (gc.watch_total_bytes < gc.watch_buffer_bytes)
        die("--watch-total-bytes (%zu) must be at least --watch-buffer-bytes (%zu)",
            gc.watch_total_bytes, gc.watch_buffer_bytes);
    if (gc.scan_limit_default > gc.scan_limit_max)
        gc.scan_limit_default = gc.scan_limit_max;

    static struct member members[RAFT_VOTERS_MAX], mhttp[RAFT_VOTERS_MAX];
    size_t n_members = 0, n_http = 0;
    struct transport_inproc_hub *hub = NULL;
    char raft_host[GATEWAY_ADDR_MAX];
    if (get("members") != NULL) {
        size_t cap =
            RAFT_VOTERS_MAX < GATEWAY_MEMBERS_MAX ? RAFT_VOTERS_MAX : GATEWAY_MEMBERS_MAX;
        n_members = parse_members("members", get("members"), members, cap);
        bool found = false;
        for (size_t i = 0; i < n_members; i++) {
            no.members.voters[no.members.n_voters++] = members[i].id;
            no.peer_hosts[i] = members[i].host;
            no.peer_ports[i] = members[i].port;
            if (members[i].id == no.id) {
                found = true;
                /* A host name cannot be bound: listen on every interface
                 * (what a container named in --members needs). */
                no.listen_host =
                    is_ip_literal(members[i].host) ? members[i].host : "0.0.0.0";
                no.listen_port = members[i].port;
            }
        }
        no.join = get_bool("join");
        if (no.join && found)
            die("--join: --id %llu is already in --members \"%s\"; a joining node "
                "is not in the running cluster's list",
                (unsigned long long)no.id, get("members"));
        if (no.join && get("listen-raft") == NULL)
            die("--join needs --listen-raft (this node's raft address)");
        if (!found && !no.join)
            die("--id %llu is not one of --members \"%s\" (a new node joining a "
                "running cluster takes --join)",
                (unsigned long long)no.id, get("members"));
        if (get("listen-raft") != NULL) {
            if (tk_hostport_split(get("listen-raft"), raft_host, sizeof(raft_host),
                                  &no.listen_port) != 0)
                die("--listen-raft: \"%s\" is not host:port", get("listen-raft"));
            no.listen_host = raft_host;
        }
    } else {
        if (get("listen-raft") != NULL)
            die("--listen-raft needs --members (a single node has no raft peers)");
        if (get_bool("join"))
            die("--join needs --members (the running cluster's voters)");
        /* A cluster of one: no peers, so no raft socket. */
        no.members.n_voters = 1;
        no.members.voters[0] = no.id;
        n_members = 1;
        members[0].id = no.id;
        snprintf(members[0].text, sizeof(members[0].text), "(single node)");
        hub = transport_inproc_hub_new(no.seed);
        no.hub = hub;
    }
    if (get("members-http") != NULL)
        n_http =
            parse_members("members-http", get("members-http"), mhttp, RAFT_VOTERS_MAX);
    gc.n_members = (uint32_t)n_members;
    for (size_t i = 0; i < n_members; i++) {
        gc.members[i].id = members[i].id;
        snprintf(gc.members[i].raft_addr, GATEWAY_ADDR_MAX, "%s", members[i].text);
        for (size_t j = 0; j < n_http; j++)
            if (mhttp[j].id == members[i].id) {
                snprintf(gc.members[i].http_addr, GATEWAY_ADDR_MAX, "%s", mhttp[j].text);
                no.peer_http[i] = mhttp[j].text; /* into the member records */
            }
    }
    for (size_t j = 0; j < n_http; j++) {
        bool known = false;
        for (size_t i = 0; i < n_members; i++)
            known |= mhttp[j].id == members[i].id;
        if (!known)
            die("--members-http: node %llu is not in --members",
                (unsigned long long)mhttp[j].id);
    }

    static uint8_t token[4096];
    peer_tls(&no);
    bool open_peers = peer_security(&no, token, sizeof(token));
    const char *store = get("store");
    if (strcmp(store, "fs") == 0) {
        const char *dir = get("data-dir");
        if (dir == NULL || dir[0] == 0)
            die("--data-dir is empty; the fs store needs a directory");
        if (mkdirs(dir) != 0)
            die("--data-dir: cannot create \"%s\": %s", dir, strerror(errno));
        if (access(dir, W_OK) != 0)
            die("--data-dir: \"%s\" is not writable: %s", dir, strerror(errno));
        no.data_dir = dir;
    } else if (strcmp(store, "mem") != 0) {
        die("--store: \"%s\" is not fs or mem", store);
    }
    restore_data(&no);

    struct tk_tls_ctx *https = gateway_tls(&gc);
    struct gateway_auth *auth = NULL;
    if (get("auth-file") != NULL) {
        /* Writable by another user, the file could gain an admin before the
         * next start: the same rule as the keys (no group or other bits). */
        const char *path = get("auth-file");
        char err[512], proc[TK_SECRET_FD_PATH_MAX];
        int fd = open_secret("auth-file", path);
        int rc = gateway_auth_load(secret_path(fd, path, proc, sizeof(proc)), &auth, err,
                                   sizeof(err));
        close(fd);
        if (rc != 0) {
            name_secret(err, sizeof(err), proc, path);
            die("--auth-file: %s", err);
        }
        gc.auth = auth;
    }
    struct gateway *gw;
    if (gateway_new(&gc, &gw) != 0)
        die("the HTTP limits are inconsistent (check --max-* and --*-timeout-ms)");
    gateway_hook(gw, &no);

    /* Signals go to the main thread's sigwait only: block them before any
     * thread starts, so every thread inherits the mask. */
    signal(SIGPIPE, SIG_IGN);
    /* A shell without job control starts background commands with SIGINT
     * ignored; sigwait would then never see it. This daemon wants both. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    struct node *node;
    int rc = node_start(&no, &node);
    if (rc == TK_ECOMPARE && no.force_new_cluster) /* a second forced recovery */
        die("--force-new-cluster was refused: see the line above for why");
    if (rc == TK_EBUSY && no.data_dir != NULL) /* its LOCK is held: base/dirlock.h */
        die("--data-dir: \"%s\" is in use by another process (see the line above)",
            no.data_dir);
    if (rc != 0) {
        fprintf(stderr, "tierkvd: the node did not start: %s (%s)%s\n", tk_strerror(rc),
                tk_errname(rc),
                rc == TK_EINVAL ? "; check --id, --members and the tick settings"
                                : "; see the log above (raft address in use? data "
                                  "directory damaged?)");
        gateway_free(gw);
        tk_tls_ctx_free(https);
        gateway_auth_free(auth);
        if (hub)
            transport_inproc_hub_free(hub);
        return 1;
    }
    if (gateway_listen_status(gw) != 0) {
        fprintf(stderr, "tierkvd: %s (--listen-http)\n", gateway_listen_error(gw));
        node_stop(node);
        gateway_free(gw);
        tk_tls_ctx_free(https);
        gateway_auth_free(auth);
        if (hub)
            transport_inproc_hub_free(hub);
        return 1;
    }
    char kvs[512], raft_addr[GATEWAY_ADDR_MAX + 8] = "inproc";
    if (no.listen_host != NULL)
        snprintf(raft_addr, sizeof(raft_addr), "%s:%u", no.listen_host, no.listen_port);
    snprintf(kvs, sizeof(kvs), "%s=%s:%u raft=%s store=%s data_dir=%s",
             https != NULL ? "https" : "http", http_host, gateway_port(gw), raft_addr,
             store, no.data_dir ? no.data_dir : "-");
    tk_logf(TK_LOG_INFO, no.id, 0, kvs, "tierkvd listening");
    snprintf(kvs, sizeof(kvs), "nofile=%llu max_connections=%u reserve=%llu",
             (unsigned long long)nofile, gc.conns_max, (unsigned long long)fd_reserve);
    tk_logf(TK_LOG_INFO, no.id, 0, kvs, "descriptors");

    int sig = 0;
    if (open_peers) {
        /* Open peers: say so every minute until a signal comes. */
        struct timespec minute = {.tv_sec = 60};
        do
            tk_logf(TK_LOG_WARN, no.id, 0, NULL,
                    "--insecure-peers: the raft port takes any peer; use "
                    "--peer-token-file or peer TLS");
        while ((sig = sigtimedwait(&set, NULL, &minute)) < 0);
    } else {
        while (sigwait(&set, &sig) != 0) {
        }
    }
    char why[64];
    snprintf(why, sizeof(why), "signal=%s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    tk_logf(TK_LOG_INFO, no.id, 0, why, "shutting down");
    node_stop(node);
    gateway_free(gw);
    tk_tls_ctx_free(https);
    gateway_auth_free(auth);
    tk_tls_ctx_free(no.peer_tls_server);
    tk_tls_ctx_free(no.peer_tls_client);
    if (hub)
        transport_inproc_hub_free(hub);
    tk_logf(TK_LOG_INFO, no.id, 0, NULL, "stopped");
    return 0;
}

/* --restore FILE and --force-new-cluster: the data directory starts from a
 * backup, or from this node's own log alone (node_restore.c). */
static void restore_data(struct node_options *no)
{
    const char *file = get("restore");
    no->force_new_cluster = get_bool("force-new-cluster");
    if (file == NULL)
        return;
    if (no->data_dir == NULL)
        die("--restore needs the fs store (--store fs and a --data-dir)");
    if (no->force_new_cluster)
        die("--restore and --force-new-cluster do not go together: a restored node "
            "already starts a new cluster");
    struct node_restore_options ro = {.file = file,
                                      .data_dir = no->data_dir,
                                      .id = no->id,
                                      .cluster_id = no->cluster_id,
                                      .members = no->members,
                                      .kv_no_sync = no->kv_no_sync};
    struct kv_backup_info info;
    char err[512];
    int rc = node_restore(&ro, &info, err, sizeof(err));
    if (rc != 0)
        die("--restore %s: %s", file, err);
    char kvs[256];
    snprintf(kvs, sizeof(kvs), "file=%s revision=%llu keys=%llu from_cluster=%llu", file,
             (unsigned long long)info.revision, (unsigned long long)info.keys,
             (unsigned long long)info.cluster_id);
    tk_logf(TK_LOG_INFO, no->id, 0, kvs, "restored the data directory from a backup");
}
