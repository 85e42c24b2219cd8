/* tierkvd's option table and what derives from it: reading argv and the
 * environment into struct tierkvd_config, --help, and --help-markdown (the
 * OPTIONS section of docs/tierkvd.md, which the tierkvd-config test keeps
 * equal to it). redis's config.c (its standardConfig table) is the model:
 * one row per option, parsed by the row's parser into the row's field. */
#include "cmd/tierkvd/options.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/secret_file.h"
#include "node/node_mem.h"

#define VERSION "0.1.0"

/* The sections of --help and of the manual's OPTIONS, in this order, with
 * what the manual adds to a title. "Other" (--help, --version) comes last. */
#define OPT_GROUPS(X)                                                                    \
    X(OTHER, "Other", NULL)                                                              \
    X(CLUSTER, "Cluster", NULL)                                                          \
    X(STORAGE, "Storage", NULL)                                                          \
    X(HTTP, "HTTP", NULL)                                                                \
    X(SECURITY, "Security",                                                              \
      "peers and clients; docs/operations.md \"Securing a cluster\"")                    \
    X(LIMITS, "Limits", NULL)                                                            \
    X(WATCH, "Watches", NULL)                                                            \
    X(TUNING, "Tuning", NULL)                                                            \
    X(OPERATIONS, "Operations", "docs/operations.md")
#define OPT_GROUP_ENUM(name, title, note) G_##name,
enum opt_group { OPT_GROUPS(OPT_GROUP_ENUM) G_COUNT };
#define OPT_GROUP_TITLE(name, title, note) title,
static const char *const group_titles[] = {OPT_GROUPS(OPT_GROUP_TITLE)};
#define OPT_GROUP_NOTE(name, title, note) note,
static const char *const group_notes[] = {OPT_GROUPS(OPT_GROUP_NOTE)};

struct opt;

/* A row's parser: checks `val` (never NULL) and stores it at `dest`, or
 * exits 2 naming the flag (or the variable, when `from_env`). */
typedef void opt_parse_fn(const struct opt *o, const char *val, bool from_env,
                          void *dest);

/* One option. Its variable is TIERKV_ and `flag` upper-cased ('-' as '_'). */
struct opt {
    const char *flag;        /* without "--" */
    const char *placeholder; /* --flag PLACEHOLDER; NULL for a boolean */
    const char *def;         /* the default; NULL: unset */
    enum opt_group group;    /* the section it is listed in */
    opt_parse_fn *parse;     /* opt_str, opt_bool, opt_u64, opt_size... */
    size_t dest;             /* offset of its field in struct tierkvd_config */
    uint64_t min, max;       /* opt_u64, opt_size: the accepted range */
    const char *choices;     /* opt_choice: "a|b|c" */
    const char *help;        /* --help's text: plain, one sentence or two */
    const char *doc;         /* the manual's text (Markdown); NULL: `help` */
    const char *unset;       /* the manual's default column when def is NULL */
};

static opt_parse_fn opt_str, opt_bool, opt_u64, opt_size, opt_choice, opt_log_level;

/* A row's destination: the field's offset, which compiles only when the
 * field has the type its parser writes (_Generic without a match fails). */
#define DEST(field, type)                                                                \
    .dest = offsetof(struct tierkvd_config, field) +                                     \
            _Generic(((struct tierkvd_config *)0)->field, type : 0)
#define OPT(flag_, placeholder_, def_, group_)                                           \
    .flag = (flag_), .placeholder = (placeholder_), .def = (def_), .group = (group_)
#define STR(field) .parse = opt_str, DEST(field, const char *)
#define BOOL(field) .parse = opt_bool, DEST(field, bool)
#define U64(field, lo, hi)                                                               \
    .parse = opt_u64, DEST(field, uint64_t), .min = (lo), .max = (hi)
#define SIZE(field, lo, hi)                                                              \
    .parse = opt_size, DEST(field, uint64_t), .min = (lo), .max = (hi)
#define CHOICE(field, list)                                                              \
    .parse = opt_choice, DEST(field, const char *), .choices = (list)
#define LOG_LEVEL(field) .parse = opt_log_level, DEST(field, enum tk_log_level)

/* Every option, by section. A string's field is a const char *, a boolean's
 * a bool, a number's or a size's a uint64_t (sizes take K, M, G: binary). */
static const struct opt opts[] = {
    /* ---- Cluster */
    {OPT("id", "ID", "1", G_CLUSTER), U64(id, 1, UINT64_MAX),
     .help = "this node's id (a positive integer, one of --members)",
     .doc = "this node's id, a positive integer listed in `--members`"},
    {OPT("members", "LIST", NULL, G_CLUSTER), STR(members),
     .help = "every voter as id=host:raft-port, comma-separated, e.g. "
             "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 (unset: a single-node "
             "cluster)",
     .doc = "every voter as `id=host:raft-port`, comma-separated; identical on every "
            "node. A host is an IPv4 or `[IPv6]` literal or a DNS name (`node1`, "
            "`db-2.example`): a name is resolved again before every connection attempt, "
            "IPv4 first, so a peer that comes back on a new address is found",
     .unset = "(none: single node)"},
    {OPT("members-http", "LIST", NULL, G_CLUSTER), STR(members_http),
     .help = "optional id=host:http-port list; shown in /v1/cluster and sent as "
             "X-Tierkv-Leader-Addr",
     .doc = "`id=host:http-port` of the members; shown in `/v1/cluster` and sent as "
            "`X-Tierkv-Leader-Addr` so clients find the leader; the leader writes them "
            "into the replicated member records, so a node added later without this flag "
            "names the leader's address too"},
    {OPT("join", NULL, NULL, G_CLUSTER), BOOL(join),
     .help = "join a running cluster: --members lists its voters (not this node), "
             "--listen-raft is this node's address; the node waits to be added (tierkv "
             "member add) and has no bootstrap configuration of its own",
     .doc = "start a new node for a running cluster: `--id` is not in `--members`, which "
            "lists the running cluster's voters (so the node can reach them), and "
            "`--listen-raft` is required. The node has no configuration of its own, "
            "never campaigns, and waits to be added (`tierkv member add`, "
            "docs/operations.md \"Membership changes\")"},
    {OPT("cluster-id", "ID", "1", G_CLUSTER), U64(cluster_id, 0, UINT64_MAX),
     .help = "cluster id checked in the raft handshake",
     .doc = "checked in the Raft handshake: nodes of different clusters refuse each "
            "other"},
    {OPT("listen-raft", "HOST:PORT", NULL, G_CLUSTER), STR(listen_raft),
     .help = "raft listen address host:port (default: this node's address in --members)",
     .doc = "where the Raft transport listens (an IP literal, e.g. `0.0.0.0:7001` behind "
            "NAT)",
     .unset = "this node's `--members` address (`0.0.0.0` and its port when that address "
              "is a name)"},
    /* ---- Storage */
    {OPT("data-dir", "DIR", "data", G_STORAGE), STR(data_dir),
     .help = "data directory (fs store), created if missing",
     .doc = "created if missing; `DIR/log` holds the Raft log and metadata, `DIR/kv` the "
            "state machine's cold tier"},
    {OPT("store", "fs|mem", "fs", G_STORAGE), CHOICE(store, "fs|mem"),
     .help = "fs (durable files under --data-dir) or mem (memory volume, lost on exit)",
     .doc = "`fs`: durable segment files + LMDB under `--data-dir`; `mem`: a memory "
            "volume, everything is lost on exit (tests, demos)"},
    {OPT("snapshot-entries", "N", "100000", G_STORAGE),
     U64(snapshot_entries, 1, UINT64_MAX),
     .help = "take a snapshot (and compact the log) once this many entries are applied "
             "since the last one",
     .doc = "take a snapshot once this many entries are applied since the last one (and "
            "their commands hold at least an eighth of the last snapshot's size, so that "
            "snapshots, which read the whole state, stay a flat cost per write as the "
            "data grows): the state machine's tier-down runs in the background and the "
            "log is compacted behind it"},
    {OPT("snapshot-bytes", "SIZE", "64M", G_STORAGE), SIZE(snapshot_bytes, 0, UINT64_MAX),
     .help = "... or once this many bytes of commands are (0: no byte threshold)",
     .doc = "... or once this many bytes of commands are (`0`: entries only)"},
    {OPT("trailing-entries", "N", "10000", G_STORAGE),
     U64(trailing_entries, 0, UINT64_MAX),
     .help = "entries kept behind a snapshot for followers a little behind",
     .doc = "entries kept behind a snapshot, so a follower a little behind catches up "
            "from the log instead of a snapshot; at most `--snapshot-bytes` of payload "
            "(when set), so that big values cannot make the node hold this many of them "
            "in memory"},
    {OPT("kv-ring-bytes", "SIZE", "64M", G_STORAGE),
     SIZE(kv_ring_bytes, 1u << 20, 1ull << 40),
     .help = "memory for the newest versions (the hot tier); past it they are written to "
             "the cold tier in the background (larger: fewer tier-downs, more memory)",
     .doc =
         "memory for the newest versions of keys (the hot tier, 1M to 1T): past it a "
         "tier-down writes what changed to the cold tier (LMDB) in the background. A "
         "larger ring means fewer tier-downs (at 3M keys, 29-30 per node at 128M "
         "against 41-54 at 64M) but did not measurably change the slow writes "
         "(docs/history/benchmarks-scale.md, \"A larger ring\"); RSS grows by up to the "
         "difference"},
    {OPT("kv-writeback-pace", "N", "3", G_STORAGE), U64(kv_writeback_pace, 0, 100),
     .help = "a background tier-down's cold-tier commit writes its pages out 4 MiB of "
             "the file at a time, sleeping N times each slice's write time, before its "
             "fsync: a burst of hundreds of MB otherwise holds every raft log fsync on "
             "the same disk (0: not paced)",
     .doc = "a background tier-down's LMDB commit (the tier-down thread, never the loop) "
            "writes its dirty pages out 4 MiB of the file at a time inside LMDB's own "
            "`fdatasync`, sleeping N times each slice's write time (at most 4 s per "
            "commit), so that its tens to hundreds of MB reach the disk over seconds "
            "rather than in one burst that every Raft log fsync on the disk queues "
            "behind; LMDB's order (data durable, then the meta page) is unchanged. 0 "
            "turns it off (a disk with its own queue for the cold tier does not need "
            "it). Stops pacing as soon as the node must wait for the commit. "
            "docs/history/benchmarks-scale.md, \"Pacing the tier-down's writeback\""},
    {OPT("snapshot-read-pace", "N", "3", G_STORAGE), U64(snapshot_read_pace, 0, 100),
     .help = "a snapshot's read of the whole state (on the thread pool) sleeps N times "
             "the CPU time it uses, so that it takes at most 1/(N+1) of a core: at full "
             "speed the nodes' reads held writes on a 2-core VM even at the lowest "
             "priority (0: not paced)",
     .doc = "a snapshot's read of the whole state on the thread pool (for a large state, "
            "only when a backup needs the stream, beside the tier-downs: a read a "
            "follower waits for is not paced; for a small one, in each snapshot job "
            "after its tier-down) sleeps N times the CPU time it uses, 2 ms of CPU at a "
            "time, so that it takes at most 1/(N+1) of a core. A read beside the "
            "tier-downs goes on at nice 5 (still paced) after 30 s and unpaced after 120 "
            "s, so the log behind the last snapshot cannot grow for long; a snapshot job "
            "stops pacing as soon as the node must wait for it (apply held for the ring, "
            "an install, shutdown). At full speed the three nodes' reads at the same "
            "index held writes on a 2-core VM even at nice 19. 0 turns it off. "
            "docs/history/benchmarks-scale.md, \"What held the writes: the snapshot "
            "reads\""},
    {OPT("kv-no-sync", NULL, NULL, G_STORAGE), BOOL(kv_no_sync),
     .help = "cold tier without fsync (benchmarks only; the raft log is still synced)",
     .doc = "the cold tier skips fsync (benchmarks only; the Raft log is still synced, "
            "so nothing acknowledged is lost, but recovery replays more)"},
    /* ---- Http */
    {OPT("listen-http", "HOST:PORT", "127.0.0.1:8080", G_HTTP), STR(listen_http),
     .help = "HTTP listen address host:port",
     .doc = "where the HTTP API listens (IPv4 or `[IPv6]` literal)"},
    {OPT("gateway-on-node-loop", NULL, NULL, G_HTTP), BOOL(gateway_on_node_loop),
     .help = "run the HTTP gateway and the etcd API on the node's consensus loop thread, "
             "not a thread of their own (fewer thread hops; client work then shares the "
             "thread that runs Raft)",
     .doc = "runs the HTTP gateway (accepting, TLS, parsing, JSON, watches, answers) and "
            "the etcd API (`--listen-client`) on "
            "the node's consensus loop thread, as before issue 48, instead of the "
            "node's client loop, a thread of its own: each request then costs no "
            "thread hop, but every client's work shares the thread that answers "
            "heartbeats, bounded only by the per-turn budgets (docs/architecture.md, "
            "\"Threads\")"},
    {OPT("listen-client", "HOST:PORT", NULL, G_HTTP), STR(listen_client),
     .help = "etcd v3 API (gRPC) listen address host:port; off by default",
     .doc = "where etcd's v3 API listens, over gRPC: etcd clients (`clientv3`, "
            "`etcdctl`) work against this address; off when not given. Cleartext "
            "(h2c), or with `--cert-file` TLS with the same certificate (ALPN h2), "
            "requiring client certificates with `--client-ca-file`, as etcd's "
            "`--cert-file`, `--trusted-ca-file` and `--client-cert-auth` do. With "
            "`--auth-file`, etcd's token authentication on its users (Authenticate "
            "with the user's token as password). The RPCs served and how they differ "
            "from etcd's: docs/etcd-compat.md"},
    {OPT("request-timeout-ms", "MS", "10000", G_HTTP),
     U64(request_timeout_ms, 1, 3600000),
     .help = "deadline of a request inside the node (then 504)"},
    {OPT("header-timeout-ms", "MS", "10000", G_HTTP), U64(header_timeout_ms, 1, 3600000),
     .help = "first byte to end of headers (then 408 and close)",
     .doc = "from a request's first byte to the end of its headers (then 408, closed); "
            "with HTTPS also the TLS handshake's deadline (then closed and its memory "
            "freed)"},
    {OPT("body-timeout-ms", "MS", "30000", G_HTTP), U64(body_timeout_ms, 1, 3600000),
     .help = "end of headers to end of body (then 408 and close)",
     .doc = "from the end of the headers to the end of the body (then 408, closed)"},
    {OPT("idle-timeout-ms", "MS", "60000", G_HTTP), U64(idle_timeout_ms, 1, 86400000),
     .help = "keep-alive connection without a request is closed after this",
     .doc = "a keep-alive connection without a request is closed"},
    {OPT("write-timeout-ms", "MS", "30000", G_HTTP), U64(write_timeout_ms, 1, 3600000),
     .help = "responses queued for a client that does not read them within this: closed",
     .doc = "responses queued for a client that does not read them (no progress for this "
            "long) close the connection"},
    /* ---- Security */
    {OPT("peer-token-file", "FILE", NULL, G_SECURITY), STR(peer_token_file),
     .help = "file holding the cluster token (16 to 4096 bytes, the same on every node; "
             "trailing whitespace ignored) that authenticates raft peers",
     .doc = "a file holding the cluster token (16 to 4096 bytes, trailing whitespace "
            "ignored; the same on every node; make one with `openssl rand -hex 32`). "
            "Raft peers prove it in the handshake (HMAC-SHA256 challenge-response, "
            "docs/architecture.md \"Wire format\"); a node without it, or with another, "
            "is refused. The file must be mode 0600 or stricter (see \"Secret files\" "
            "above)"},
    {OPT("peer-cert-file", "FILE", NULL, G_SECURITY), STR(peer_cert_file),
     .help = "peer mutual TLS: this node's certificate chain (PEM), naming node-<id> (a "
             "DNS SAN, or the CN); with --peer-key-file and --peer-trusted-ca-file",
     .doc = "peer mutual TLS: this node's certificate chain (PEM). It must name the "
            "member as `node-<id>`: a DNS subject alternative name, or the subject CN "
            "when it has no DNS SAN. With `--peer-key-file` and `--peer-trusted-ca-file` "
            "(all three or none) every Raft connection is TLS 1.2+, both sides show a "
            "certificate chaining to the CA, and a peer whose certificate does not name "
            "the id it claims is refused. Beside `--peer-token-file` or instead of it"},
    {OPT("peer-key-file", "FILE", NULL, G_SECURITY), STR(peer_key_file),
     .help = "peer mutual TLS: the private key of --peer-cert-file (PEM)",
     .doc = "peer mutual TLS: the private key of `--peer-cert-file` (PEM, unencrypted; "
            "mode 0600 or stricter, a secret file)"},
    {OPT("peer-trusted-ca-file", "FILE", NULL, G_SECURITY), STR(peer_trusted_ca_file),
     .help = "peer mutual TLS: the CAs every peer's certificate must chain to (PEM)",
     .doc = "peer mutual TLS: the CA certificates (PEM) every peer's certificate must "
            "chain to"},
    {OPT("insecure-peers", NULL, NULL, G_SECURITY), BOOL(insecure_peers),
     .help = "allow a raft address off loopback without --peer-token-file or peer TLS "
             "(anyone who reaches it can act as a member; warned every minute)",
     .doc = "allow a Raft address that is not loopback without `--peer-token-file` or "
            "peer TLS: anyone who reaches the port can then act as a member. Without it "
            "such a node refuses to start (exit 2); with it, it logs a warning every "
            "minute. A Raft address on loopback without a token or peer TLS starts "
            "without this flag, but logs once, at warning level, that its Raft port is "
            "open to every local process (any of them can act as a member): give it "
            "`--peer-token-file`"},
    {OPT("allow-loose-permissions", NULL, NULL, G_SECURITY),
     BOOL(allow_loose_permissions),
     .help = "accept secret files (--peer-token-file, --peer-key-file, --key-file, "
             "--auth-file) that group or others may read or write, with a warning; "
             "without it they are refused (for containers that mount secrets with other "
             "modes)",
     .doc = "accept secret files that group or others may read or write, with one "
            "warning line each, for containers that mount secrets with other modes "
            "(Kubernetes' default `defaultMode` is 0644; better: set it to 0400)"},
    {OPT("cert-file", "FILE", NULL, G_SECURITY), STR(cert_file),
     .help = "HTTPS: the gateway's certificate chain (PEM); with --key-file the gateway "
             "speaks only HTTPS",
     .doc = "HTTPS: the gateway's certificate chain (PEM). With `--key-file` the gateway "
            "speaks only HTTPS (TLS 1.2+) on `--listen-http`"},
    {OPT("key-file", "FILE", NULL, G_SECURITY), STR(key_file),
     .help = "HTTPS: the private key of --cert-file (PEM)",
     .doc = "HTTPS: the private key of `--cert-file` (PEM, unencrypted; mode 0600 or "
            "stricter, a secret file)"},
    {OPT("client-ca-file", "FILE", NULL, G_SECURITY), STR(client_ca_file),
     .help = "HTTPS: require client certificates that chain to these CAs (PEM)",
     .doc = "HTTPS: require a client certificate chaining to these CAs (PEM); a client "
            "without one, with one of another CA, or with an expired one, fails the "
            "handshake"},
    {OPT("auth-file", "FILE", NULL, G_SECURITY), STR(auth_file),
     .help = "bearer tokens: users, their token's SHA-256 and rights per key prefix "
             "(docs/tierkvd.md); every request but /healthz and /readyz then needs one",
     .doc = "bearer tokens: one user a line, `NAME sha256:HEX64 RIGHT...` (`#` starts a "
            "comment). HEX64 is the SHA-256 of the user's token (`printf %s \"$TOKEN\" | "
            "sha256sum`); the token itself is not stored. A right is `read:PREFIX` (read "
            "the keys that start with PREFIX), `write:PREFIX` (read and write them; an "
            "empty PREFIX is every key; `%XX` escapes any byte) or `admin` (everything, "
            "and what only an admin may do: deleting every key, `/v1/debug/digest`). "
            "Every request but `/healthz` and `/readyz` then needs `Authorization: "
            "Bearer TOKEN`: none or an unknown one is 401 `unauthorized` (with "
            "`WWW-Authenticate`), a missing right 403 `forbidden`. A file that does not "
            "parse stops the start (exit 2, with its line), and so does one that group "
            "or others may read or write (a secret file: `chmod 600`)"},
    /* ---- Limits */
    {OPT("max-key-bytes", "SIZE", "4K", G_LIMITS), SIZE(max_key_bytes, 1, 4096),
     .help = "largest key (at most 4K)",
     .doc = "largest key (at most 4K, the state machine's limit)"},
    {OPT("max-value-bytes", "SIZE", "1M", G_LIMITS), SIZE(max_value_bytes, 1, 1 << 20),
     .help = "largest value (at most 1M)"},
    {OPT("max-body-bytes", "SIZE", "4M", G_LIMITS), SIZE(max_body_bytes, 1, 1ull << 30),
     .help = "largest request body",
     .doc = "largest request body (at least `--max-value-bytes`, at most 4M: the raft "
            "frame limit; a larger value refuses to start, since such a write could "
            "never be replicated)"},
    {OPT("max-header-bytes", "SIZE", "16K", G_LIMITS),
     SIZE(max_header_bytes, 1024, 1 << 20),
     .help = "largest request line + headers (then 431)",
     .doc = "request line + headers (then 431)"},
    {OPT("max-connections", "N", NULL, G_LIMITS), U64(max_connections, 1, 1000000),
     .help = "open HTTP connections (beyond: 503 and close); default: the descriptor "
             "limit (RLIMIT_NOFILE, raised to its hard limit at start) less a reserve "
             "for storage and peers, at most 65536",
     .doc = "open HTTP connections; one more is answered 503 and closed. Default: the "
            "descriptor limit (raised to its hard limit at start) less a reserve for "
            "storage and peers (an eighth, at least 256), at most 65536; a value eating "
            "into the reserve refuses to start",
     .unset = "from `RLIMIT_NOFILE`"},
    {OPT("max-pipeline", "N", "64", G_LIMITS), U64(max_pipeline, 1, 65536),
     .help = "requests in flight per connection before reading pauses"},
    {OPT("max-tls-handshakes", "N", "256", G_LIMITS), U64(tls_handshakes_max, 1, 65536),
     .help = "HTTPS handshakes in progress (beyond: closed at accept)",
     .doc = "HTTPS handshakes in progress at once; a connection past it is closed at "
            "accept, before any TLS state exists (about 44 KiB each), and a handshake "
            "not done by `--header-timeout-ms` frees its slot. `--listen-client` with "
            "TLS has its own slots, as many (its deadline: 10 s)"},
    {OPT("max-tls-handshakes-per-addr", "N", "16", G_LIMITS),
     U64(tls_handshakes_per_addr, 1, 65536),
     .help = "HTTPS handshakes in progress from one client address",
     .doc = "HTTPS handshakes in progress from one client address (at most "
            "`--max-tls-handshakes`); past it that address's new connections are closed "
            "at accept"},
    {OPT("memory-budget", "SIZE", NULL, G_LIMITS),
     SIZE(memory_budget, NODE_MEM_BUDGET_MIN, 1ull << 44),
     .help = "the node's memory, split into the defaults of --kv-ring-bytes, "
             "--watch-events-bytes, --max-memory-bytes, --watch-total-bytes, "
             "--snapshot-bytes and the blob cache (each at most its own default; an "
             "explicit flag wins); default: a quarter of RAM, within 256M..4G",
     .doc = "the node's memory (at least 64M), split into the defaults of "
            "`--kv-ring-bytes` (1/8), `--watch-events-bytes` (1/32), "
            "`--max-memory-bytes` (1/4), `--watch-total-bytes` (1/16), "
            "`--snapshot-bytes` (1/16) and the small-blob cache (1/32), each at most its "
            "own default (the budget lowers limits, never raises them: with 8 GiB "
            "of RAM or more the default budget, 2G or more, changes nothing). A flag "
            "given for an owner wins. Covers anonymous memory (`RssAnon`), not LMDB's "
            "mapped file pages; peaks during a burst may pass it (docs/operations.md "
            "\"Sizing memory\")",
     .unset = "a quarter of RAM, within 256M..4G"},
    {OPT("max-memory-bytes", "SIZE", "512M", G_LIMITS),
     SIZE(max_memory_bytes, 1 << 20, 1ull << 40),
     .help = "request bodies + queued responses of all connections (beyond: 503 "
             "overloaded)",
     .doc = "request bodies + queued responses of all connections; beyond it a request "
            "is answered 503 `overloaded` with `Retry-After` and its connection closed "
            "(at least `--max-body-bytes`)"},
    {OPT("scan-limit-max", "N", "10000", G_LIMITS), U64(scan_limit_max, 1, 1000000),
     .help = "largest ?limit of a scan", .doc = "largest `?limit` of a scan"},
    {OPT("max-watchers", "N", "10000", G_LIMITS), U64(max_watchers, 0, 1000000),
     .help = "open watches on this node (beyond: 503)"},
    /* ---- Watch */
    {OPT("watch-events", "N", "65536", G_WATCH), U64(watch_events, 0, 1u << 30),
     .help = "events the change log holds for watches (older ones: compacted); 0: none",
     .doc = "events the change log keeps for watches (`GET /v1/watch`); a watch from "
            "before them gets 410 `compacted`; 0 keeps none"},
    {OPT("watch-events-bytes", "SIZE", "16M", G_WATCH),
     SIZE(watch_events_bytes, 4096, 1ull << 40),
     .help = "bytes the change log holds (keys, values, previous values)",
     .doc = "bytes the change log keeps (keys, values, previous values)"},
    {OPT("watch-buffer-bytes", "SIZE", "1M", G_WATCH),
     SIZE(watch_buffer_bytes, 1024, 1ull << 32),
     .help = "a watch's bytes its client has not taken yet before it is cancelled "
             "(lagging)",
     .doc = "a watch's bytes its client has not taken yet; past it the watch waits for "
            "its client"},
    {OPT("watch-stall-ms", "MS", "3000", G_WATCH), U64(watch_stall_ms, 1, 3600000),
     .help = "a watch whose buffer is full and whose client takes nothing for this long "
             "is cancelled (lagging)",
     .doc = "a watch whose buffer is full and whose client takes nothing for this long "
            "ends `lagging`"},
    {OPT("watch-total-bytes", "SIZE", "64M", G_WATCH),
     SIZE(watch_total_bytes, 1024, 1ull << 40),
     .help = "all watches' bytes their clients have not taken; past it the watches "
             "holding the most are cancelled (lagging) at once",
     .doc = "all watches' bytes their clients have not taken; past it the watches "
            "holding the most end `lagging` at once (their connections close 2 s later)"},
    /* ---- Tuning */
    {OPT("tick-ms", "MS", "10", G_TUNING), U64(tick_ms, 1, 60000),
     .help = "raft tick in milliseconds", .doc = "Raft tick"},
    {OPT("election-ticks", "N", "20", G_TUNING), U64(election_ticks, 2, 100000),
     .help = "election timeout in ticks (randomized between 1x and 2x)",
     .doc = "election timeout in ticks, randomized in [1x, 2x): 200-400 ms"},
    {OPT("heartbeat-ticks", "N", "2", G_TUNING), U64(heartbeat_ticks, 1, 100000),
     .help = "heartbeat interval in ticks",
     .doc = "leader heartbeat interval; must be below `--election-ticks`"},
    {OPT("spin-us", "US", "0", G_TUNING), U64(spin_us, 0, 1000000),
     .help = "after a loop turn that did work, keep polling this many microseconds "
             "before sleeping: what arrives meanwhile costs no thread wake-up, but the "
             "loop burns up to this much CPU after each burst (0: sleep at once)",
     .doc = "after a loop turn that did work, the node's loop keeps polling (without "
            "sleeping) this many microseconds: a message, a storage completion or a "
            "request arriving meanwhile costs no thread wake-up (tens of microseconds on "
            "a VM), but the loop burns up to this much CPU after each burst; each pass "
            "with nothing due yields the CPU to other runnable threads first. On the "
            "2-core VM with three tierkvd and the fs store it did not lower the serial "
            "latency and cost throughput: 50 us took 4-6 % of the puts/s at 64 "
            "connections, 300 us a third (docs/history/benchmarks.md, \"Spinning\"); "
            "yielding "
            "did not change that (Dec 4: 64-connection CPU per put 42-58 us at 0, 51-87 "
            "at 50). It pays in-process (docs/history/benchmarks.md, \"Spinning that "
            "yields\") "
            "and only on cores not shared with CPU-bound work"},
    {OPT("follower-inline-sync-us", "US", "0", G_TUNING),
     U64(follower_inline_sync_us, 0, 1000000),
     .help = "a follower writes and syncs an append on its loop, without the hand-off to "
             "the storage thread and back, when that thread is idle and the last sync "
             "took at most this long; a disk's stall then holds the loop (0: always hand "
             "over)",
     .doc = "a follower writes and syncs an append on its own loop, without handing it "
            "to its storage thread and being woken back (two thread wake-ups on each "
            "write's path), when that thread is idle and the last sync took at most US "
            "microseconds; after a slower sync its appends go to the storage thread "
            "until one is fast again. The leader always hands its appends over. At 64 "
            "connections on the 2-core VM, 1000: 11 % less CPU per put, 24 % lower p99; "
            "but a sync that stalls holds the follower's loop (59-122 ms turns in "
            "`fdatasync` at millions of keys with three nodes on one disk), so it is off "
            "by default: for a node with a disk of its own whose syncs do not stall "
            "(docs/history/benchmarks.md, \"Followers sync on their loop\"). 0: always "
            "hand over"},
    {OPT("lease-checkpoint-ms", "MS", "200", G_TUNING),
     U64(lease_checkpoint_ms, 10, 3600000),
     .help = "the leader checkpoints the leases' remaining TTLs this often (a lease "
             "outlives its TTL by at most this plus an election per leader change)",
     .doc = "the leader writes the leases' remaining TTLs to the log this often; a lease "
            "outlives its TTL by at most this plus an election per leader change"},
    /* ---- Operations */
    {OPT("stall-probe-ms", "MS", "0", G_OPERATIONS), U64(stall_probe_ms, 0, 60000),
     .help = "while one loop turn has run this long, log what the loop thread waits on "
             "as the kernel sees it: state, system call, wait channel, kernel stack (0: "
             "off)",
     .doc =
         "the stall probe: a thread that looks at the loop thread every MS/4 ms and, "
         "while one loop turn has run MS ms (and at each further MS ms, up to 4 times), "
         "logs what the thread is doing as the kernel sees it: its state (R running, "
         "S sleeping, D in uninterruptible wait), the system call and its arguments "
         "(or `running`, or -1 for a page fault), the wait channel and the first "
         "frames of the kernel stack (readable as root only). With the first report "
         "of a turn it also logs the loop thread's own stack (`the loop's stack at N "
         "ms: tierkvd(+0x4a3b1) < ...`, innermost first; `addr2line -f -e tierkvd "
         "0x4a3b1` names the executable's frames), taken by a signal (`SIGRTMIN+4`, "
         "handled process-wide while a probe runs; it may cut a system call of the "
         "loop short, which libuv retries): for a turn that is on the CPU, where the "
         "kernel's view says only `running`. The slow-turn warning at the turn's end "
         "says how much of it was CPU; this says what the loop waited on or ran. Each "
         "look is one read of /proc; off by default. `scripts/bench-scale.sh` runs "
         "its nodes with 40"},
    {OPT("restore", "FILE", NULL, G_OPERATIONS), STR(restore),
     .help = "initialize the empty --data-dir from this backup file (tierkv snapshot "
             "save), as this node of a new cluster with its own --cluster-id, then "
             "start; refused on a non-empty directory (docs/operations.md, Backup and "
             "restore)",
     .doc = "initialize the empty `--data-dir` from a backup file (`tierkv snapshot "
            "save`) as this node of a new cluster, then start. Refused: a non-empty "
            "directory, a damaged file (the byte offset and reason), a `--cluster-id` "
            "equal to the backup's"},
    {OPT("force-new-cluster", NULL, NULL, G_OPERATIONS), BOOL(force_new_cluster),
     .help = "disaster recovery: start as the only voter, keeping every entry of the "
             "log; then add the others back as new members (docs/operations.md, Disaster "
             "recovery)",
     .doc = "disaster recovery: start as the only voter, keeping every entry of the log; "
            "the dropped ids are marked removed and refused as strangers if they come "
            "back (a new epoch); then add new nodes as new members (new ids, empty data "
            "directories, `--join`). Refused (exit 2) on a cluster already recovered "
            "this way whose configuration has other members; a no-op while this node is "
            "the only voter (docs/operations.md, \"Disaster recovery\")"},
    {OPT("log-level", "LEVEL", "info", G_OPERATIONS), LOG_LEVEL(log_level),
     .help = "debug, info, warn, error or off",
     .doc = "`debug`, `info`, `warn`, `error`, `off`"},
    {OPT("log-format", "FORMAT", "logfmt", G_OPERATIONS),
     CHOICE(log_format, "logfmt|json"), .help = "logfmt or json",
     .doc = "`logfmt` (`ts=... level=info node=1 term=3 msg=\"...\" k=v`) or `json` (one "
            "object per line, same fields); logs go to standard error"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))
static_assert(N_OPTS <= TIERKVD_OPTIONS_MAX, "raise TIERKVD_OPTIONS_MAX");

void tierkvd_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tierkvd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(run tierkvd --help for every flag)\n", stderr);
    va_end(ap);
    exit(2);
}

static bool is_bool(const struct opt *o)
{
    return o->parse == opt_bool;
}

/* The option's variable: TIERKV_ID for "id", TIERKV_DATA_DIR for "data-dir". */
static const char *env_name(const struct opt *o, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "TIERKV_%s", o->flag);
    TK_ASSERT(n > 0 && (size_t)n < cap);
    for (char *p = buf; *p != 0; p++)
        *p = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
    return buf;
}

static const struct opt *find_opt(const char *flag, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].flag) == len && strncmp(opts[i].flag, flag, len) == 0)
            return &opts[i];
    return NULL;
}

/* ---- the parsers ------------------------------------------------------- */

static void opt_str(const struct opt *o, const char *val, bool from_env, void *dest)
{
    (void)o, (void)from_env;
    *(const char **)dest = val;
}

/* Exactly TK_BOOL_ACCEPTED, so that a value meaning "off" can never leave
 * an option on. */
static void opt_bool(const struct opt *o, const char *val, bool from_env, void *dest)
{
    if (tk_parse_bool(val, dest) == 0)
        return;
    char env[64];
    if (from_env)
        tierkvd_die("%s=\"%s\" (--%s) is not a boolean: use " TK_BOOL_ACCEPTED,
                    env_name(o, env, sizeof(env)), val, o->flag);
    tierkvd_die("--%s=\"%s\" is not a boolean: use " TK_BOOL_ACCEPTED
                " (or --%s alone for true)",
                o->flag, val, o->flag);
}

static void opt_u64(const struct opt *o, const char *val, bool from_env, void *dest)
{
    (void)from_env;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || end == val || *end || val[0] == '-' || v < o->min || v > o->max)
        tierkvd_die("--%s: \"%s\" is not an integer between %" PRIu64 " and %" PRIu64,
                    o->flag, val, o->min, o->max);
    *(uint64_t *)dest = v;
}

/* 4096, 4K, 1M, 2G (binary units; a B after the unit is allowed). */
static void opt_size(const struct opt *o, const char *val, bool from_env, void *dest)
{
    (void)from_env;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || end == val || val[0] == '-')
        tierkvd_die("--%s: \"%s\" is not a size (examples: 4096, 64K, 1M)", o->flag, val);
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
        tierkvd_die("--%s: \"%s\" is not a size (examples: 4096, 64K, 1M)", o->flag, val);
    if (v > o->max / mul || v * mul < o->min || v * mul > o->max)
        tierkvd_die("--%s: %s is out of range (%" PRIu64 " to %" PRIu64 " bytes)",
                    o->flag, val, o->min, o->max);
    *(uint64_t *)dest = v * mul;
}

/* One of the words of o->choices ("a|b|c"), exactly; the message lists
 * them as "a, b or c". */
static void opt_choice(const struct opt *o, const char *val, bool from_env, void *dest)
{
    (void)from_env;
    size_t len = strlen(val);
    for (const char *c = o->choices; *c != 0;) {
        size_t n = strcspn(c, "|");
        if (n == len && strncmp(c, val, len) == 0) {
            *(const char **)dest = val;
            return;
        }
        c += n + (c[n] == '|');
    }
    char list[256] = "";
    for (const char *c = o->choices; *c != 0;) {
        size_t n = strcspn(c, "|"), at = strlen(list);
        const char *next = c + n + (c[n] == '|');
        const char *sep = *next == 0 ? "" : strchr(next, '|') != NULL ? ", " : " or ";
        snprintf(list + at, sizeof(list) - at, "%.*s%s", (int)n, c, sep);
        c = next;
    }
    tierkvd_die("--%s: \"%s\" is not %s", o->flag, val, list);
}

static void opt_log_level(const struct opt *o, const char *val, bool from_env, void *dest)
{
    (void)from_env;
    if (tk_log_parse_level(val, dest) != 0)
        tierkvd_die("--%s: \"%s\" is not debug, info, warn, error or off", o->flag, val);
}

/* ---- --help ------------------------------------------------------------ */

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

/* One option's entry: "--flag PLACEHOLDER", its help, its variable. */
static void help_opt(FILE *f, const struct opt *o)
{
    char lhs[64], env[64], line[128];
    int n =
        snprintf(lhs, sizeof(lhs), "  --%s%s%s", o->flag, is_bool(o) ? "[=BOOL]" : " ",
                 is_bool(o)       ? ""
                 : o->placeholder ? o->placeholder
                                  : "VALUE");
    fputs(lhs, f);
    if (n + 1 >= HELP_INDENT)
        fprintf(f, "\n%*s", HELP_INDENT, "");
    else
        fprintf(f, "%*s", HELP_INDENT - n, "");
    help_wrap(f, o->help, HELP_INDENT);
    snprintf(line, sizeof(line), "(env %s%s%s)", env_name(o, env, sizeof(env)),
             o->def ? ", default " : "", o->def ? o->def : "");
    fprintf(f, "%*s", HELP_INDENT, "");
    help_wrap(f, line, HELP_INDENT);
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
        for (size_t i = 0; i < N_OPTS; i++)
            if ((int)opts[i].group == shown)
                help_opt(f, &opts[i]);
    }
    fprintf(f, "  %-*s%s\n  %-*s%s\n\nSee docs/tierkvd.md (man tierkvd).\n",
            HELP_INDENT - 2, "--help", "this text", HELP_INDENT - 2, "--version",
            "print the version");
}

/* ---- --help-markdown: the manual's OPTIONS section --------------------- */

/* `text` in a table cell: '|' escaped. */
static void md_cell(FILE *f, const char *text)
{
    for (const char *p = text; *p != 0; p++) {
        if (*p == '|')
            fputc('\\', f);
        fputc(*p, f);
    }
}

static void md_opt(FILE *f, const struct opt *o)
{
    char env[64];
    fprintf(f, "| `--%s%s", o->flag, is_bool(o) ? "" : " ");
    md_cell(f, is_bool(o) ? "" : o->placeholder);
    fprintf(f, "` | `%s` | ", env_name(o, env, sizeof(env)));
    if (o->def != NULL)
        fprintf(f, "`%s`", o->def);
    else
        md_cell(f, o->unset ? o->unset : is_bool(o) ? "off" : "(none)");
    fputs(" | ", f);
    md_cell(f, o->doc ? o->doc : o->help);
    fputs(" |\n", f);
}

/* What docs/tierkvd.md has between "## OPTIONS" and the next section. */
static void markdown(FILE *f)
{
    fputs("The options below, and `--help`, are made from one table\n"
          "(cmd/tierkvd/options.c); `tierkvd --help-markdown` prints this section.\n",
          f);
    for (int g = G_OTHER + 1; g < G_COUNT; g++) {
        if (group_notes[g] != NULL)
            fprintf(f, "\n%s (%s):\n\n", group_titles[g], group_notes[g]);
        else
            fprintf(f, "\n%s:\n\n", group_titles[g]);
        fputs("| flag | env | default | meaning |\n|---|---|---|---|\n", f);
        for (size_t i = 0; i < N_OPTS; i++)
            if ((int)opts[i].group == g)
                md_opt(f, &opts[i]);
    }
}

/* ---- reading ----------------------------------------------------------- */

/* The command line over the variables: sets vals[i] (and clears from_env[i])
 * for each flag given. Returns 1 after --help, --help-markdown or --version. */
static int read_args(int argc, char **argv, const char **vals, bool *from_env)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (strcmp(a, "--help-markdown") == 0) {
            markdown(stdout);
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            printf("tierkvd %s\n", VERSION);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0)
            tierkvd_die("unexpected argument \"%s\" (flags start with --)", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        const struct opt *o = find_opt(name, eq ? (size_t)(eq - name) : strlen(name));
        if (o == NULL)
            tierkvd_die("unknown flag \"%s\"", a);
        size_t k = (size_t)(o - opts);
        from_env[k] = false;
        if (eq)
            vals[k] = eq + 1;
        else if (is_bool(o))
            vals[k] = "true";
        else if (i + 1 < argc)
            vals[k] = argv[++i];
        else
            tierkvd_die("--%s needs a value", o->flag);
    }
    return 0;
}

int tierkvd_options_read(int argc, char **argv, struct tierkvd_config *cfg)
{
    const char *vals[N_OPTS];
    bool from_env[N_OPTS];
    for (size_t i = 0; i < N_OPTS; i++) {
        char env[64];
        const char *e = getenv(env_name(&opts[i], env, sizeof(env)));
        from_env[i] = e != NULL && *e != 0;
        vals[i] = from_env[i] ? e : opts[i].def;
    }
    if (read_args(argc, argv, vals, from_env) != 0)
        return 1;
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < N_OPTS; i++) {
        cfg->given[i] = vals[i] != opts[i].def;
        if (vals[i] != NULL)
            opts[i].parse(&opts[i], vals[i], from_env[i], (char *)cfg + opts[i].dest);
    }
    return 0;
}

bool tierkvd_option_given(const struct tierkvd_config *cfg, const char *flag)
{
    const struct opt *o = find_opt(flag, strlen(flag));
    TK_ASSERT(o != NULL);
    return cfg->given[o - opts];
}
