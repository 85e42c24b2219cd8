/* tierkvd's checked options (options.h) turned into what the node and the
 * gateway take: node_options and gateway_config, with the rules between
 * options, the memory budget's split, the descriptor limit, the member
 * lists, the data directory and --restore. Main thread, before any start. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/blob.h"
#include "base/hostport.h"
#include "base/log.h"
#include "cmd/tierkvd/tierkvd.h"
#include "kv/backup.h"
#include "node/node_mem.h"
#include "transport/transport.h"

/* Descriptors kept for storage (segments, LMDB, snapshots), raft peers and
 * the 503s sent past --max-connections: at least FD_RESERVE_MIN, or an
 * eighth of the limit. */
#define FD_RESERVE_MIN 256u
#define CONNS_DEFAULT_MAX 65536u

static bool given(const struct tierkvd *t, const char *flag)
{
    return tierkvd_option_given(t->cfg, flag);
}

/* Raft timing, snapshots, the loop's tuning: straight from the options. */
static void setup_node(struct tierkvd *t)
{
    const struct tierkvd_config *c = t->cfg;
    struct node_options *no = &t->no;
    node_options_default(no);
    no->id = c->id;
    no->cluster_id = c->cluster_id;
    no->tick_ms = (uint32_t)c->tick_ms;
    no->election_ticks = (uint32_t)c->election_ticks;
    no->heartbeat_ticks = (uint32_t)c->heartbeat_ticks;
    if (no->heartbeat_ticks >= no->election_ticks)
        tierkvd_die("--heartbeat-ticks (%u) must be smaller than --election-ticks (%u)",
                    no->heartbeat_ticks, no->election_ticks);
    no->timeout_ms = c->request_timeout_ms;
    no->snapshot_entries = c->snapshot_entries;
    no->snapshot_bytes = c->snapshot_bytes;
    no->trailing_entries = c->trailing_entries;
    no->spin_us = (uint32_t)c->spin_us;
    no->follower_inline_sync_us = (uint32_t)c->follower_inline_sync_us;
    no->stall_probe_ms = (uint32_t)c->stall_probe_ms;
    no->lease_checkpoint_ms = (uint32_t)c->lease_checkpoint_ms;
    no->events_max = c->watch_events;
    no->events_bytes = c->watch_events_bytes;
    no->kv_ring_bytes = c->kv_ring_bytes;
    no->kv_writeback_pace = c->kv_writeback_pace > 0 ? (int)c->kv_writeback_pace : -1;
    no->snapshot_read_pace = c->snapshot_read_pace > 0 ? (int)c->snapshot_read_pace : -1;
    no->kv_no_sync = c->kv_no_sync;
    no->force_new_cluster = c->force_new_cluster;
    no->seed = no->id * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
}

/* --memory-budget: each owner's default from the split (node/node_mem.h);
 * a flag given for an owner wins. TIERKV_MEM_TRIM=1 (hidden, off by
 * default: one malloc_trim(0) after a 72 MiB burst took 174 ms, holding
 * each arena's lock in turn, for 19 MiB back; docs/history/benchmarks.md "Memory: who
 * holds a node's RSS") caps glibc's arenas at 4 and starts the trimmer. Fills `split` for
 * the gateway's shares. */
static void setup_memory(struct tierkvd *t, struct node_mem_split *split)
{
    uint64_t budget =
        given(t, "memory-budget") ? t->cfg->memory_budget : node_mem_default_budget();
    node_mem_split(budget, split);
    if (!given(t, "kv-ring-bytes"))
        t->no.kv_ring_bytes = split->ring;
    if (!given(t, "watch-events-bytes"))
        t->no.events_bytes = split->change_log;
    if (!given(t, "snapshot-bytes"))
        t->no.snapshot_bytes = split->raft_log;
    (void)tk_blob_cache_limit(split->blob_cache);
    (void)tk_blob_big_cache_limit(split->big_blob_cache);
    const char *mem_trim = getenv("TIERKV_MEM_TRIM");
    bool trim_on = mem_trim && strcmp(mem_trim, "1") == 0;
    if (node_mem_start(budget, trim_on ? 4 : 0, trim_on) != 0)
        tierkvd_die("cannot start the memory trimmer thread");
}

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
static uint32_t size_connections(struct tierkvd *t)
{
    uint64_t nofile = t->nofile = raise_nofile();
    uint64_t reserve = t->fd_reserve =
        nofile / 8 > FD_RESERVE_MIN ? nofile / 8 : FD_RESERVE_MIN;
    uint64_t room = nofile > reserve ? nofile - reserve : 0;
    if (!given(t, "max-connections")) {
        if (room == 0)
            tierkvd_die("the descriptor limit (RLIMIT_NOFILE %llu) leaves no room for "
                        "HTTP connections beside the %llu kept for storage and peers; "
                        "raise it (ulimit -n)",
                        (unsigned long long)nofile, (unsigned long long)reserve);
        return (uint32_t)(room < CONNS_DEFAULT_MAX ? room : CONNS_DEFAULT_MAX);
    }
    uint64_t v = t->cfg->max_connections;
    if (v > room)
        tierkvd_die("--max-connections (%llu) leaves fewer than %llu of the %llu "
                    "descriptors (RLIMIT_NOFILE) for storage and peers; lower it or "
                    "raise the limit (ulimit -n)",
                    (unsigned long long)v, (unsigned long long)reserve,
                    (unsigned long long)nofile);
    return (uint32_t)v;
}

/* The request limits: key, value, body and header sizes against each other
 * and the raft frame limit. */
static void setup_sizes(struct tierkvd *t)
{
    const struct tierkvd_config *c = t->cfg;
    struct gateway_config *gc = &t->gc;
    gc->key_max = c->max_key_bytes;
    gc->value_max = c->max_value_bytes;
    gc->body_max = c->max_body_bytes;
    if (gc->body_max < gc->value_max)
        tierkvd_die("--max-body-bytes (%zu) must be at least --max-value-bytes (%zu)",
                    gc->body_max, gc->value_max);
    /* A write's command is about its body (or its key and value): one over the
     * raft frame limit could never be replicated (node_submit refuses it). */
    if (gc->body_max > NODE_FRAME_MAX)
        tierkvd_die("--max-body-bytes (%zu) exceeds the raft frame limit (%u bytes; the "
                    "largest entry is %u bytes): such a write could never be replicated",
                    gc->body_max, NODE_FRAME_MAX, NODE_ENTRY_MAX);
    if (gc->key_max + gc->value_max + 1024 > NODE_ENTRY_MAX)
        tierkvd_die("--max-key-bytes + --max-value-bytes (%zu) exceed the largest raft "
                    "entry (%u bytes)",
                    gc->key_max + gc->value_max, NODE_ENTRY_MAX);
    gc->header_max = c->max_header_bytes;
}

/* Watches: per-watch and total buffers (the total's default from the
 * memory budget's split). */
static void setup_watches(struct tierkvd *t, const struct node_mem_split *split)
{
    const struct tierkvd_config *c = t->cfg;
    struct gateway_config *gc = &t->gc;
    gc->watch_buffer_bytes = c->watch_buffer_bytes;
    gc->watchers_max = (uint32_t)c->max_watchers;
    gc->watch_stall_ms = c->watch_stall_ms;
    gc->watch_total_bytes = c->watch_total_bytes;
    if (!given(t, "watch-total-bytes"))
        gc->watch_total_bytes =
            split->watch > gc->watch_buffer_bytes ? split->watch : gc->watch_buffer_bytes;
    if (gc->watch_total_bytes < gc->watch_buffer_bytes)
        tierkvd_die("--watch-total-bytes (%zu) must be at least --watch-buffer-bytes "
                    "(%zu)",
                    gc->watch_total_bytes, gc->watch_buffer_bytes);
}

/* The gateway: address, limits, timeouts, memory and watches. */
static void setup_gateway(struct tierkvd *t, const struct node_mem_split *split)
{
    const struct tierkvd_config *c = t->cfg;
    struct gateway_config *gc = &t->gc;
    gateway_config_default(gc);
    if (tk_hostport_split(c->listen_http, t->http_host, sizeof(t->http_host),
                          &gc->port) != 0)
        tierkvd_die("--listen-http: \"%s\" is not host:port (example: 127.0.0.1:8080)",
                    c->listen_http);
    gc->host = t->http_host;
    gc->on_node_loop = c->gateway_on_node_loop;
    setup_sizes(t);
    gc->conns_max = size_connections(t);
    gc->pipeline_max = (uint32_t)c->max_pipeline;
    gc->tls_handshakes_max = (uint32_t)c->tls_handshakes_max;
    gc->tls_handshakes_per_addr = (uint32_t)c->tls_handshakes_per_addr;
    if (gc->tls_handshakes_per_addr > gc->tls_handshakes_max)
        tierkvd_die("--max-tls-handshakes-per-addr (%u) must be at most "
                    "--max-tls-handshakes (%u)",
                    gc->tls_handshakes_per_addr, gc->tls_handshakes_max);
    gc->header_timeout_ms = c->header_timeout_ms;
    gc->body_timeout_ms = c->body_timeout_ms;
    gc->idle_timeout_ms = c->idle_timeout_ms;
    gc->write_timeout_ms = c->write_timeout_ms;
    gc->mem_max = c->max_memory_bytes;
    if (!given(t, "max-memory-bytes"))
        gc->mem_max = split->http > gc->body_max ? split->http : gc->body_max;
    if (gc->mem_max < gc->body_max)
        tierkvd_die("--max-memory-bytes (%zu) must be at least --max-body-bytes (%zu)",
                    gc->mem_max, gc->body_max);
    gc->scan_limit_max = (uint32_t)c->scan_limit_max;
    setup_watches(t, split);
    if (gc->scan_limit_default > gc->scan_limit_max)
        gc->scan_limit_default = gc->scan_limit_max;
}

/* etcd's token authentication on --auth-file's users (etcdapi.h). */
static const void *etcd_user(void *arg, const uint8_t *token, size_t len)
{
    return gateway_auth_user(arg, token, len);
}

static const char *etcd_user_name(void *arg, const void *u)
{
    (void)arg;
    return gateway_auth_name(u);
}

static bool etcd_user_admin(void *arg, const void *u)
{
    (void)arg;
    return gateway_auth_admin(u);
}

static bool etcd_user_may(void *arg, const void *u, bool write, const uint8_t *key,
                          size_t klen, const uint8_t *end, size_t elen)
{
    (void)arg;
    return gateway_auth_may(u, write, key, klen, end, elen);
}

/* --listen-client: etcd's v3 API beside the gateway, on the node's loop
 * (its hooks chain to the gateway's). With --cert-file it serves TLS with
 * the gateway's certificate (and, with --client-ca-file, requires client
 * certificates), as etcd's --cert-file/--trusted-ca-file do; with
 * --auth-file, etcd's token authentication on the same users. */
static void setup_etcd(struct tierkvd *t)
{
    const struct tierkvd_config *c = t->cfg;
    if (c->listen_client == NULL)
        return;
    struct etcdapi_config ec;
    etcdapi_config_default(&ec);
    if (tk_hostport_split(c->listen_client, t->client_host, sizeof(t->client_host),
                          &ec.port) != 0)
        tierkvd_die("--listen-client: \"%s\" is not host:port (example: 127.0.0.1:2379)",
                    c->listen_client);
    ec.host = t->client_host;
    /* MemberList's client URL: a wildcard listener is reached at the host
     * the peers dial (--listen-raft's), if that one is not a wildcard too. */
    if ((strcmp(ec.host, "0.0.0.0") == 0 || strcmp(ec.host, "::") == 0) &&
        t->raft_host[0] != '\0' && strcmp(t->raft_host, "0.0.0.0") != 0 &&
        strcmp(t->raft_host, "::") != 0)
        ec.advertise_host = t->raft_host;
    ec.key_max = t->gc.key_max;
    ec.value_max = t->gc.value_max < (1u << 20) ? t->gc.value_max : (1u << 20);
    ec.request_timeout_ms = c->request_timeout_ms;
    ec.on_node_loop = c->gateway_on_node_loop; /* the loop the gateway is on */
    ec.tls = t->etcd_tls;
    ec.handshakes_max = t->gc.tls_handshakes_max; /* the gateway's flags */
    ec.handshakes_per_addr = t->gc.tls_handshakes_per_addr;
    if (t->auth != NULL) {
        t->etcd_auth = (struct etcdapi_auth){.user = etcd_user,
                                             .name = etcd_user_name,
                                             .admin = etcd_user_admin,
                                             .may = etcd_user_may,
                                             .arg = t->auth};
        ec.auth = &t->etcd_auth;
    }
    if (etcdapi_new(&ec, &t->etcd) != 0)
        tierkvd_die("--listen-client: the etcd API's limits are inconsistent");
    etcdapi_hook(t->etcd, &t->no);
}

static bool is_ip_literal(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static size_t parse_members(const char *flag, const char *s, struct tierkvd_member *out,
                            size_t max)
{
    size_t n = 0;
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[GATEWAY_ADDR_MAX + 32];
        if (len == 0 || len >= sizeof(item))
            tierkvd_die(
                "--%s: empty or overlong entry in \"%s\" (expected id=host:port,...)",
                flag, s);
        memcpy(item, p, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        if (eq == NULL)
            tierkvd_die(
                "--%s: entry \"%s\" is not id=host:port (example: 1=127.0.0.1:7001)",
                flag, item);
        *eq = 0;
        char *end;
        errno = 0;
        unsigned long long id = strtoull(item, &end, 10);
        if (errno || end == item || *end || id == 0 || item[0] == '-')
            tierkvd_die("--%s: \"%s\" is not a positive node id", flag, item);
        if (n == max)
            tierkvd_die("--%s: more than %zu members", flag, max);
        for (size_t i = 0; i < n; i++)
            if (out[i].id == id)
                tierkvd_die("--%s: node id %llu appears twice", flag, id);
        out[n].id = id;
        if (tk_hostport_split(eq + 1, out[n].host, sizeof(out[n].host), &out[n].port) !=
                0 ||
            out[n].port == 0)
            tierkvd_die("--%s: \"%s\" is not host:port with a port in 1..65535", flag,
                        eq + 1);
        snprintf(out[n].text, sizeof(out[n].text), "%s", eq + 1);
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    if (n == 0)
        tierkvd_die("--%s: no members in \"%s\"", flag, s);
    return n;
}

/* --members: the voters, this node's raft address among them (or, with
 * --join, not among them), --listen-raft over it. */
static void setup_voters(struct tierkvd *t)
{
    const struct tierkvd_config *c = t->cfg;
    struct node_options *no = &t->no;
    size_t cap =
        RAFT_VOTERS_MAX < GATEWAY_MEMBERS_MAX ? RAFT_VOTERS_MAX : GATEWAY_MEMBERS_MAX;
    t->n_members = parse_members("members", c->members, t->members, cap);
    bool found = false;
    for (size_t i = 0; i < t->n_members; i++) {
        const struct tierkvd_member *m = &t->members[i];
        no->members.voters[no->members.n_voters++] = m->id;
        no->peer_hosts[i] = m->host;
        no->peer_ports[i] = m->port;
        if (m->id == no->id) {
            found = true;
            /* A host name cannot be bound: listen on every interface
             * (what a container named in --members needs). */
            no->listen_host = is_ip_literal(m->host) ? m->host : "0.0.0.0";
            no->listen_port = m->port;
        }
    }
    no->join = c->join;
    if (no->join && found)
        tierkvd_die("--join: --id %llu is already in --members \"%s\"; a joining node "
                    "is not in the running cluster's list",
                    (unsigned long long)no->id, c->members);
    if (no->join && c->listen_raft == NULL)
        tierkvd_die("--join needs --listen-raft (this node's raft address)");
    if (!found && !no->join)
        tierkvd_die("--id %llu is not one of --members \"%s\" (a new node joining a "
                    "running cluster takes --join)",
                    (unsigned long long)no->id, c->members);
    if (c->listen_raft != NULL) {
        if (tk_hostport_split(c->listen_raft, t->raft_host, sizeof(t->raft_host),
                              &no->listen_port) != 0)
            tierkvd_die("--listen-raft: \"%s\" is not host:port", c->listen_raft);
        no->listen_host = t->raft_host;
    }
}

/* No --members: a cluster of one, with no peers, so no raft socket. */
static void setup_single(struct tierkvd *t)
{
    struct node_options *no = &t->no;
    if (t->cfg->listen_raft != NULL)
        tierkvd_die("--listen-raft needs --members (a single node has no raft peers)");
    if (t->cfg->join)
        tierkvd_die("--join needs --members (the running cluster's voters)");
    no->members.n_voters = 1;
    no->members.voters[0] = no->id;
    t->n_members = 1;
    t->members[0].id = no->id;
    snprintf(t->members[0].text, sizeof(t->members[0].text), "(single node)");
    t->hub = transport_inproc_hub_new(no->seed);
    no->hub = t->hub;
}

/* The members as /v1/cluster shows them, with --members-http's addresses
 * (also written into the member records). */
static void setup_members_http(struct tierkvd *t)
{
    struct gateway_config *gc = &t->gc;
    if (t->cfg->members_http != NULL)
        t->n_http = parse_members("members-http", t->cfg->members_http, t->mhttp,
                                  RAFT_VOTERS_MAX);
    gc->n_members = (uint32_t)t->n_members;
    for (size_t i = 0; i < t->n_members; i++) {
        gc->members[i].id = t->members[i].id;
        snprintf(gc->members[i].raft_addr, GATEWAY_ADDR_MAX, "%s", t->members[i].text);
        for (size_t j = 0; j < t->n_http; j++)
            if (t->mhttp[j].id == t->members[i].id) {
                snprintf(gc->members[i].http_addr, GATEWAY_ADDR_MAX, "%s",
                         t->mhttp[j].text);
                t->no.peer_http[i] = t->mhttp[j].text; /* into the member records */
            }
    }
    for (size_t j = 0; j < t->n_http; j++) {
        bool known = false;
        for (size_t i = 0; i < t->n_members; i++)
            known |= t->mhttp[j].id == t->members[i].id;
        if (!known)
            tierkvd_die("--members-http: node %llu is not in --members",
                        (unsigned long long)t->mhttp[j].id);
    }
}

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

/* --store fs: --data-dir made if missing, and writable. */
static void setup_store(struct tierkvd *t)
{
    if (strcmp(t->cfg->store, "fs") != 0)
        return;
    const char *dir = t->cfg->data_dir;
    if (dir == NULL || dir[0] == 0)
        tierkvd_die("--data-dir is empty; the fs store needs a directory");
    if (mkdirs(dir) != 0)
        tierkvd_die("--data-dir: cannot create \"%s\": %s", dir, strerror(errno));
    if (access(dir, W_OK) != 0)
        tierkvd_die("--data-dir: \"%s\" is not writable: %s", dir, strerror(errno));
    t->no.data_dir = dir;
}

/* --restore FILE and --force-new-cluster: the data directory starts from a
 * backup, or from this node's own log alone (node_restore.c). */
static void restore_data(struct tierkvd *t)
{
    struct node_options *no = &t->no;
    const char *file = t->cfg->restore;
    if (file == NULL)
        return;
    if (no->data_dir == NULL)
        tierkvd_die("--restore needs the fs store (--store fs and a --data-dir)");
    if (no->force_new_cluster)
        tierkvd_die("--restore and --force-new-cluster do not go together: a restored "
                    "node already starts a new cluster");
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
        tierkvd_die("--restore %s: %s", file, err);
    char kvs[256];
    snprintf(kvs, sizeof(kvs), "file=%s revision=%llu keys=%llu from_cluster=%llu", file,
             (unsigned long long)info.revision, (unsigned long long)info.keys,
             (unsigned long long)info.cluster_id);
    tk_logf(TK_LOG_INFO, no->id, 0, kvs, "restored the data directory from a backup");
}

void tierkvd_setup(struct tierkvd *t, const struct tierkvd_config *cfg)
{
    t->cfg = cfg;
    tk_log_set_level(cfg->log_level);
    if (strcmp(cfg->log_format, "json") == 0)
        tk_log_set_sink(tierkvd_json_sink, NULL);
    setup_node(t);
    struct node_mem_split split;
    setup_memory(t, &split);
    setup_gateway(t, &split);
    if (cfg->members != NULL)
        setup_voters(t);
    else
        setup_single(t);
    setup_members_http(t);
    tierkvd_peer_tls(t);
    tierkvd_peer_security(t);
    setup_store(t);
    restore_data(t);
    tierkvd_gateway_tls(t);
    tierkvd_auth(t);
    if (gateway_new(&t->gc, &t->gw) != 0)
        tierkvd_die(
            "the HTTP limits are inconsistent (check --max-* and --*-timeout-ms)");
    gateway_hook(t->gw, &t->no);
    setup_etcd(t);
}
