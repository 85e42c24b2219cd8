/* The public embedding API (include/tierkv.h) over the node runtime.
 *
 * Commands are encoded here (kvpb.Command, proto/kv.proto) into one blob per
 * write. Blocking calls keep their request and a waiter on the caller's stack
 * and sleep on a condition variable until the node's thread completes them;
 * async calls allocate the request with the blob. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "include/tierkv.h"
#include "kv.pb-c.h"
#include "kv/kv.h"
#include "node/node.h"
#include "store/store.h"
#include "transport/transport.h"

/* The process's logger as the embedding API sets it (tk_options.log_*): base/
 * log.c hands every line to log_to_user once log_setup has run (set once,
 * pthread_once), which passes it to the receiver in user_log, read and
 * replaced under its mutex, so a start never races a node that is logging.
 * The public levels are base/log.h's plus one (0 is "the default"). */
static_assert(TK_LOGLEVEL_DEBUG == TK_LOG_DEBUG + 1, "public log levels");
static_assert(TK_LOGLEVEL_ERROR == TK_LOG_ERROR + 1, "public log levels");
static_assert(TK_LOGLEVEL_OFF == TK_LOG_OFF + 1, "public log levels");

static struct {
    pthread_mutex_t mu;
    tk_log_cb *cb; /* NULL: stderr */
    void *data;
} user_log = {.mu = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_to_user(enum tk_log_level level, const char *line, size_t len, void *data)
{
    (void)data;
    pthread_mutex_lock(&user_log.mu);
    tk_log_cb *cb = user_log.cb;
    void *cb_data = user_log.data;
    pthread_mutex_unlock(&user_log.mu);
    if (cb != NULL) {
        cb((enum tk_loglevel)(level + 1), line, cb_data);
        return;
    }
    /* One fprintf of the whole line: stderr is unbuffered, so one write. */
    fprintf(stderr, "%.*s\n", (int)len, line);
}

static void log_setup(void)
{
    tk_log_set_line_cb(log_to_user, NULL);
}

/* Applies `o`'s logging to the process's logger. Returns 0 or TK_EINVAL. */
static int log_apply(const struct tk_options *o)
{
    if ((unsigned)o->log_level > TK_LOGLEVEL_OFF)
        return TK_EINVAL;
    pthread_once(&log_once, log_setup);
    pthread_mutex_lock(&user_log.mu);
    user_log.cb = o->log_cb;
    user_log.data = o->log_data;
    pthread_mutex_unlock(&user_log.mu);
    tk_log_set_level(o->log_level == TK_LOGLEVEL_DEFAULT
                         ? TK_LOG_ERROR
                         : (enum tk_log_level)(o->log_level - 1));
    return 0;
}

struct tk_node {
    struct node *node;
    uint64_t id;
    struct node_options opts; /* kept for restarts */
    char *data_dir;
    struct store_mem_volume *volume;
    struct tk_cluster *cluster;
    bool isolated; /* by tk_cluster_isolate */
};

/* An in-process cluster gives each node its own loop thread, or, with
 * tk_options.one_loop, runs every node on one loop on one thread: nodes then
 * hand messages to each other without waking another thread (the inproc hub
 * notices they share the loop), which halves a single write's latency but
 * puts all three nodes' work on one core. Work that must run on the cluster
 * thread (starting a node again) is passed to it through `exec`. */
struct tk_cluster {
    uint32_t n;
    bool one_loop;
    struct transport_inproc_hub *hub;
    uv_loop_t loop;
    uv_thread_t thread;
    uv_async_t exec;
    pthread_mutex_t exec_mu;
    uv_sem_t exec_done;
    void (*exec_fn)(struct tk_cluster *c, uint32_t i);
    uint32_t exec_arg;
    int exec_rc;
    struct tk_node nodes[TK_MEMBERS_MAX];
};

void tk_options_default(struct tk_options *o)
{
    memset(o, 0, sizeof(*o));
    struct node_options no;
    node_options_default(&no);
    o->tick_ms = no.tick_ms;
    o->election_ticks = no.election_ticks;
    o->heartbeat_ticks = no.heartbeat_ticks;
    o->queue_max = no.queue_max;
    o->timeout_ms = no.timeout_ms;
    o->snapshot_entries = no.snapshot_entries;
    o->trailing_entries = no.trailing_entries;
    o->snapshot_bytes = no.snapshot_bytes;
    o->follower_inline_sync_us = no.follower_inline_sync_us;
}

static void to_node_options(const struct tk_options *o, struct node_options *no)
{
    node_options_default(no);
    no->id = o->id;
    no->cluster_id = o->cluster_id;
    no->kv_no_sync = o->kv_no_sync;
    no->kv_map_bytes = o->kv_map_bytes;
    no->kv_ring_bytes = o->kv_ring_bytes;
    if (o->tick_ms)
        no->tick_ms = o->tick_ms;
    if (o->election_ticks)
        no->election_ticks = o->election_ticks;
    if (o->heartbeat_ticks)
        no->heartbeat_ticks = o->heartbeat_ticks;
    if (o->queue_max)
        no->queue_max = o->queue_max;
    if (o->timeout_ms)
        no->timeout_ms = o->timeout_ms;
    if (o->snapshot_entries)
        no->snapshot_entries = o->snapshot_entries;
    if (o->trailing_entries)
        no->trailing_entries = o->trailing_entries;
    if (o->snapshot_bytes)
        no->snapshot_bytes = o->snapshot_bytes;
    no->seed = o->seed;
    no->spin_us = o->spin_us;
    no->follower_inline_sync_us = o->follower_inline_sync_us;
    no->peer_token = o->peer_token;
    no->peer_token_len = o->peer_token ? o->peer_token_len : 0;
}

/* True for an IPv4 127.0.0.0/8 or IPv6 ::1 literal, or "localhost". */
static bool is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* ---- nodes and clusters ------------------------------------------------ */

int tk_node_start(const struct tk_options *o, struct tk_node **out)
{
    if (o->id == 0 || o->n_members > TK_MEMBERS_MAX || log_apply(o) != 0)
        return TK_EINVAL;
    struct tk_node *tn = tk_calloc(1, sizeof(*tn));
    struct node_options no;
    to_node_options(o, &no);
    if (o->n_members == 0) {
        no.members.n_voters = 1;
        no.members.voters[0] = o->id;
    }
    for (uint32_t i = 0; i < o->n_members; i++) {
        no.members.voters[no.members.n_voters++] = o->members[i].id;
        no.peer_hosts[i] = o->members[i].host;
        no.peer_ports[i] = o->members[i].port;
        if (o->members[i].id == o->id) {
            no.listen_host = o->listen_host ? o->listen_host : o->members[i].host;
            no.listen_port = o->members[i].port;
        }
    }
    /* The same rule as tierkvd's: a raft port that strangers can reach
     * authenticates its peers, unless the caller says otherwise. */
    if (no.listen_host != NULL && !is_loopback(no.listen_host) && no.peer_token == NULL &&
        !o->insecure_peers) {
        tk_free(tn);
        return TK_EINVAL;
    }
    if (o->data_dir)
        tn->data_dir = tk_strdup(o->data_dir);
    no.data_dir = tn->data_dir;
    /* A single node needs no peers: give it an inproc hub of its own rather
     * than a listening socket. */
    struct transport_inproc_hub *hub = NULL;
    if (no.members.n_voters == 1 && no.listen_host == NULL) {
        hub = transport_inproc_hub_new(o->seed);
        no.hub = hub;
    }
    int rc = node_start(&no, &tn->node);
    if (rc != 0) {
        if (hub)
            transport_inproc_hub_free(hub);
        tk_free(tn->data_dir);
        tk_free(tn);
        return rc;
    }
    tn->id = o->id;
    tn->opts = no;
    *out = tn;
    return 0;
}

void tk_node_stop(struct tk_node *n)
{
    if (n == NULL)
        return;
    struct transport_inproc_hub *hub = n->opts.hub;
    node_stop(n->node);
    if (hub)
        transport_inproc_hub_free(hub);
    tk_free(n->data_dir);
    tk_free(n);
}

static int cluster_node_start(struct tk_cluster *c, uint32_t i)
{
    struct tk_node *tn = &c->nodes[i];
    struct node_options no = tn->opts;
    no.volume = tn->volume;
    no.loop = c->one_loop ? &c->loop : NULL;
    return node_start(&no, &tn->node);
}

static void exec_start(struct tk_cluster *c, uint32_t i)
{
    c->exec_rc = cluster_node_start(c, i);
}

static void exec_close(struct tk_cluster *c, uint32_t i)
{
    (void)i;
    uv_close((uv_handle_t *)&c->exec, NULL);
    c->exec_rc = 0;
}

static void on_exec(uv_async_t *h)
{
    struct tk_cluster *c = h->data;
    if (c->exec_fn == NULL)
        return;
    c->exec_fn(c, c->exec_arg);
    c->exec_fn = NULL;
    uv_sem_post(&c->exec_done);
}

/* Runs fn(c, i) on the cluster's loop thread and waits for it. */
static int cluster_exec(struct tk_cluster *c, void (*fn)(struct tk_cluster *, uint32_t),
                        uint32_t i)
{
    pthread_mutex_lock(&c->exec_mu);
    c->exec_fn = fn;
    c->exec_arg = i;
    uv_async_send(&c->exec);
    uv_sem_wait(&c->exec_done);
    int rc = c->exec_rc;
    pthread_mutex_unlock(&c->exec_mu);
    return rc;
}

static void cluster_loop(void *arg)
{
    struct tk_cluster *c = arg;
    uv_run(&c->loop, UV_RUN_DEFAULT);
}

int tk_cluster_start(uint32_t n, const struct tk_options *o, struct tk_cluster **out)
{
    if (n == 0 || n > TK_MEMBERS_MAX)
        return TK_EINVAL;
    struct tk_options def;
    if (o == NULL) {
        tk_options_default(&def);
        o = &def;
    }
    if (log_apply(o) != 0)
        return TK_EINVAL;
    struct tk_cluster *c = tk_calloc(1, sizeof(*c));
    c->n = n;
    c->one_loop = o->one_loop;
    c->hub = transport_inproc_hub_new(o->seed);
    uv_loop_init(&c->loop);
    uv_async_init(&c->loop, &c->exec, on_exec);
    c->exec.data = c;
    pthread_mutex_init(&c->exec_mu, NULL);
    uv_sem_init(&c->exec_done, 0);
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct tk_node *tn = &c->nodes[i];
        tn->cluster = c;
        tn->id = i + 1;
        to_node_options(o, &tn->opts);
        tn->opts.id = i + 1;
        tn->opts.seed = o->seed + i;
        tn->opts.hub = c->hub;
        tn->opts.members.n_voters = n;
        for (uint32_t j = 0; j < n; j++)
            tn->opts.members.voters[j] = j + 1;
        if (o->data_dir != NULL) {
            size_t len = strlen(o->data_dir) + 16;
            tn->data_dir = tk_malloc(len);
            snprintf(tn->data_dir, len, "%s/n%u", o->data_dir, i + 1);
            tn->opts.data_dir = tn->data_dir;
        } else {
            /* The cluster keeps each node's memory volume, so a restarted node
             * finds what it had persisted. */
            tn->volume = store_mem_volume_new();
        }
    }
    /* The loop is not running yet: the nodes start on this thread. */
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = cluster_node_start(c, i);
    /* The loop runs even after a failed start: the nodes that did start are
     * stopped through it. */
    /* Like running out of memory, failing to start a thread aborts. */
    TK_ASSERT(uv_thread_create(&c->thread, cluster_loop, c) == 0);
    if (rc != 0) {
        tk_cluster_stop(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tk_cluster_stop(struct tk_cluster *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->n; i++) {
        node_stop(c->nodes[i].node); /* the loop thread closes its handles */
        c->nodes[i].node = NULL;
    }
    cluster_exec(c, exec_close, 0);
    uv_thread_join(&c->thread);
    (void)uv_loop_close(&c->loop);
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->nodes[i].volume)
            store_mem_volume_free(c->nodes[i].volume);
        tk_free(c->nodes[i].data_dir);
    }
    pthread_mutex_destroy(&c->exec_mu);
    uv_sem_destroy(&c->exec_done);
    transport_inproc_hub_free(c->hub);
    tk_free(c);
}

struct tk_node *tk_cluster_node(struct tk_cluster *c, uint32_t i)
{
    return i < c->n ? &c->nodes[i] : NULL;
}

int tk_cluster_wait_leader(struct tk_cluster *c, uint32_t timeout_ms,
                           struct tk_node **out)
{
    uint64_t waited = 0;
    for (;;) {
        /* A leader, and every running node not cut off knows it: a request
         * through any of them then reaches it (a follower that has not heard
         * from the new leader yet would answer TK_ENOLEADER). */
        struct tk_status st[TK_MEMBERS_MAX];
        struct tk_node *leader = NULL;
        for (uint32_t i = 0; i < c->n; i++) {
            if (c->nodes[i].node == NULL || c->nodes[i].isolated)
                continue;
            tk_node_status(&c->nodes[i], &st[i]);
            if (st[i].is_leader)
                leader = &c->nodes[i];
        }
        bool known = leader != NULL;
        for (uint32_t i = 0; known && i < c->n; i++)
            if (c->nodes[i].node != NULL && !c->nodes[i].isolated &&
                st[i].leader != leader->id)
                known = false;
        if (known) {
            *out = leader;
            return 0;
        }
        if (waited >= timeout_ms)
            return TK_ETIMEDOUT;
        /* A test helper waiting on another thread's election: sleeping here
         * is the caller's choice of latency, not a hot path. */
        uv_sleep(5);
        waited += 5;
    }
}

int tk_cluster_restart_node(struct tk_cluster *c, uint32_t i)
{
    if (i >= c->n)
        return TK_EINVAL;
    node_stop(c->nodes[i].node);
    c->nodes[i].node = NULL;
    if (!c->one_loop)
        return cluster_node_start(c, i);
    return cluster_exec(c, exec_start, i);
}

int tk_cluster_isolate(struct tk_cluster *c, uint32_t i, bool isolated)
{
    if (i >= c->n || c->nodes[i].node == NULL)
        return TK_EINVAL;
    int rc = node_isolate(c->nodes[i].node, isolated);
    if (rc == 0)
        c->nodes[i].isolated = isolated;
    return rc;
}

void tk_node_status(struct tk_node *n, struct tk_status *out)
{
    struct node_status st;
    node_status(n->node, &st);
    memset(out, 0, sizeof(*out));
    out->id = st.id;
    out->term = st.term;
    out->leader = st.leader;
    out->is_leader = st.role == RAFT_LEADER;
    out->commit = st.commit;
    out->applied = st.applied;
    out->last_index = st.last_index;
    out->snapshot_index = st.snapshot_index;
}

uint64_t tk_node_leader(struct tk_node *n)
{
    struct node_status st;
    node_status(n->node, &st);
    return st.leader;
}

int tk_node_transfer_leadership(struct tk_node *n, uint64_t to)
{
    return node_transfer_leadership(n->node, to);
}

/* ---- waiting ----------------------------------------------------------- */

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool done;
    uint32_t spin_us; /* poll `done` this long before sleeping */
    int status;
    struct tk_write_result res;
    /* reads */
    const void *key;
    size_t key_len;
    struct tk_value *value;
    tk_item_cb *item_cb;
    void *item_data;
    struct scan_walk *scan;
};

#if defined(__x86_64__) || defined(__i386__)
#define TK_CPU_RELAX() __builtin_ia32_pause()
#else
#define TK_CPU_RELAX() ((void)0)
#endif

static void waiter_init(struct waiter *w, const struct tk_node *n)
{
    memset(w, 0, sizeof(*w));
    w->spin_us = n->opts.spin_us;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static int waiter_wait(struct waiter *w)
{
    if (w->spin_us != 0) {
        uint64_t end = tk_mono_ns() + (uint64_t)w->spin_us * 1000;
        while (!atomic_load_explicit(&w->done, memory_order_acquire) &&
               tk_mono_ns() < end) {
            for (int i = 0; i < 64; i++)
                TK_CPU_RELAX();
            sched_yield(); /* the loop that will set `done` may need this CPU */
        }
    }
    /* Even when the spin saw `done`: the lock waits for waiter_done to let go
     * of the mutex before it is destroyed. */
    pthread_mutex_lock(&w->mu);
    while (!atomic_load_explicit(&w->done, memory_order_acquire))
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->status;
}

static void waiter_done(struct waiter *w, int status)
{
    pthread_mutex_lock(&w->mu);
    w->status = status;
    atomic_store_explicit(&w->done, true, memory_order_release);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void fill_result(struct tk_write_result *out, const struct kv_result *r)
{
    memset(out, 0, sizeof(*out));
    if (r == NULL)
        return;
    out->code = r->code;
    out->revision = r->revision;
    out->succeeded = r->succeeded;
    out->value = r->value;
    out->deleted = r->deleted;
}

/* ---- writes ------------------------------------------------------------ */

static void sync_write_cb(struct node_req *req, int status, const struct kv_result *res,
                          void *data)
{
    (void)req;
    struct waiter *w = data;
    if (status == 0)
        fill_result(&w->res, res);
    waiter_done(w, status);
}

struct async_write {
    struct node_req req;
    tk_write_cb *cb;
    void *data;
};

static void async_write_cb(struct node_req *req, int status, const struct kv_result *res,
                           void *data)
{
    struct async_write *aw = data;
    (void)req;
    struct tk_write_result out;
    if (status == 0)
        fill_result(&out, res);
    aw->cb(status, status == 0 ? &out : NULL, aw->data);
    tk_free(aw);
}

static struct tk_blob *pack(const Kvpb__Command *cmd)
{
    size_t len = kvpb__command__get_packed_size(cmd);
    struct tk_blob *b = tk_blob_new(len);
    kvpb__command__pack(cmd, b->data);
    return b;
}

static int submit_blob(struct tk_node *n, struct tk_blob *cmd, enum tk_mode mode,
                       struct tk_write_result *out)
{
    struct waiter w;
    waiter_init(&w, n);
    struct node_req req;
    memset(&req, 0, sizeof(req));
    req.mode = mode == TK_MODE_COMMITTED ? NODE_MODE_COMMITTED : NODE_MODE_APPLIED;
    req.cmd = cmd;
    req.write_cb = sync_write_cb;
    req.data = &w;
    int rc = node_submit(n->node, &req);
    if (rc != 0) {
        tk_blob_unref(cmd);
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
        return rc;
    }
    rc = waiter_wait(&w);
    if (out != NULL)
        *out = w.res;
    return rc;
}

static int submit_blob_async(struct tk_node *n, struct tk_blob *cmd, enum tk_mode mode,
                             tk_write_cb *cb, void *data)
{
    if (cb == NULL) {
        tk_blob_unref(cmd);
        return TK_EINVAL;
    }
    struct async_write *aw = tk_calloc(1, sizeof(*aw));
    aw->cb = cb;
    aw->data = data;
    aw->req.mode = mode == TK_MODE_COMMITTED ? NODE_MODE_COMMITTED : NODE_MODE_APPLIED;
    aw->req.cmd = cmd;
    aw->req.write_cb = async_write_cb;
    aw->req.data = aw;
    int rc = node_submit(n->node, &aw->req);
    if (rc != 0) {
        tk_blob_unref(cmd);
        tk_free(aw);
    }
    return rc;
}

int tk_submit_async(struct tk_node *n, const void *cmd, size_t len, enum tk_mode mode,
                    tk_write_cb *cb, void *data)
{
    if (cmd == NULL && len > 0)
        return TK_EINVAL;
    return submit_blob_async(n, tk_blob_copy(cmd, len), mode, cb, data);
}

int tk_submit(struct tk_node *n, const void *cmd, size_t len, enum tk_mode mode,
              struct tk_write_result *out)
{
    if (cmd == NULL && len > 0)
        return TK_EINVAL;
    return submit_blob(n, tk_blob_copy(cmd, len), mode, out);
}

static ProtobufCBinaryData bin(const void *p, size_t len)
{
    ProtobufCBinaryData b = {.len = len, .data = (uint8_t *)(uintptr_t)p};
    return b;
}

static struct tk_blob *put_cmd(const void *key, size_t key_len, const void *value,
                               size_t value_len)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key = bin(key, key_len);
    put.value = bin(value, value_len);
    cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
    cmd.put = &put;
    return pack(&cmd);
}

/* A lease command, applied: the status, or else the command's code. */
static int lease_submit(struct tk_node *n, Kvpb__Command *cmd,
                        struct tk_write_result *res)
{
    int rc = submit_blob(n, pack(cmd), TK_MODE_APPLIED, res);
    return rc != 0 ? rc : res->code;
}

int tk_lease_grant(struct tk_node *n, uint64_t ttl_ms, uint64_t *id)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseGrant g = KVPB__LEASE_GRANT__INIT;
    g.ttl_ms = ttl_ms;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_GRANT;
    cmd.lease_grant = &g;
    struct tk_write_result res = {0};
    int rc = lease_submit(n, &cmd, &res);
    if (rc == 0 && id != NULL)
        *id = (uint64_t)res.value;
    return rc;
}

int tk_lease_keepalive(struct tk_node *n, uint64_t id)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseKeepalive k = KVPB__LEASE_KEEPALIVE__INIT;
    k.id = id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_KEEPALIVE;
    cmd.lease_keepalive = &k;
    struct tk_write_result res = {0};
    return lease_submit(n, &cmd, &res);
}

int tk_lease_revoke(struct tk_node *n, uint64_t id, uint64_t *deleted)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__LeaseRevoke r = KVPB__LEASE_REVOKE__INIT;
    r.id = id;
    cmd.cmd_case = KVPB__COMMAND__CMD_LEASE_REVOKE;
    cmd.lease_revoke = &r;
    struct tk_write_result res = {0};
    int rc = lease_submit(n, &cmd, &res);
    if (rc == 0 && deleted != NULL)
        *deleted = res.deleted;
    return rc;
}

int tk_put_lease(struct tk_node *n, const void *key, size_t key_len, const void *value,
                 size_t value_len, uint64_t lease, struct tk_write_result *out)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key = bin(key, key_len);
    put.value = bin(value, value_len);
    put.lease = lease;
    cmd.cmd_case = KVPB__COMMAND__CMD_PUT;
    cmd.put = &put;
    struct tk_write_result res = {0};
    int rc = lease_submit(n, &cmd, &res);
    if (out != NULL)
        *out = res;
    return rc;
}

int tk_put(struct tk_node *n, const void *key, size_t key_len, const void *value,
           size_t value_len, enum tk_mode mode, struct tk_write_result *out)
{
    return submit_blob(n, put_cmd(key, key_len, value, value_len), mode, out);
}

int tk_put_async(struct tk_node *n, const void *key, size_t key_len, const void *value,
                 size_t value_len, enum tk_mode mode, tk_write_cb *cb, void *data)
{
    return submit_blob_async(n, put_cmd(key, key_len, value, value_len), mode, cb, data);
}

int tk_delete(struct tk_node *n, const void *key, size_t key_len, enum tk_mode mode,
              struct tk_write_result *out)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Delete del = KVPB__DELETE__INIT;
    del.key = bin(key, key_len);
    cmd.cmd_case = KVPB__COMMAND__CMD_DEL;
    cmd.del = &del;
    return submit_blob(n, pack(&cmd), mode, out);
}

int tk_incr(struct tk_node *n, const void *key, size_t key_len, int64_t delta,
            enum tk_mode mode, struct tk_write_result *out)
{
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    Kvpb__Increment inc = KVPB__INCREMENT__INIT;
    inc.key = bin(key, key_len);
    inc.delta = delta;
    cmd.cmd_case = KVPB__COMMAND__CMD_INCR;
    cmd.incr = &inc;
    return submit_blob(n, pack(&cmd), mode, out);
}

/* Builds protobuf ops for `ops` into caller-provided arrays. */
static void build_ops(const struct tk_op *ops, size_t n, Kvpb__Op *op, Kvpb__Op **opp,
                      Kvpb__Put *puts, Kvpb__Delete *dels)
{
    for (size_t i = 0; i < n; i++) {
        kvpb__op__init(&op[i]);
        if (ops[i].value != NULL) {
            kvpb__put__init(&puts[i]);
            puts[i].key = bin(ops[i].key, ops[i].key_len);
            puts[i].value = bin(ops[i].value, ops[i].value_len);
            op[i].op_case = KVPB__OP__OP_PUT;
            op[i].put = &puts[i];
        } else {
            kvpb__delete__init(&dels[i]);
            dels[i].key = bin(ops[i].key, ops[i].key_len);
            op[i].op_case = KVPB__OP__OP_DEL;
            op[i].del = &dels[i];
        }
        opp[i] = &op[i];
    }
}

int tk_batch(struct tk_node *n, const struct tk_op *ops, size_t n_ops, enum tk_mode mode,
             struct tk_write_result *out)
{
    if (n_ops > KV_TXN_OPS_MAX)
        return TK_ETOOBIG;
    Kvpb__Op op[KV_TXN_OPS_MAX];
    Kvpb__Op *opp[KV_TXN_OPS_MAX];
    Kvpb__Put puts[KV_TXN_OPS_MAX];
    Kvpb__Delete dels[KV_TXN_OPS_MAX];
    build_ops(ops, n_ops, op, opp, puts, dels);
    Kvpb__Batch b = KVPB__BATCH__INIT;
    b.n_ops = n_ops;
    b.ops = opp;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_BATCH;
    cmd.batch = &b;
    return submit_blob(n, pack(&cmd), mode, out);
}

int tk_txn(struct tk_node *n, const struct tk_version_cmp *cmps, size_t n_cmps,
           const struct tk_op *then_ops, size_t n_then, const struct tk_op *else_ops,
           size_t n_else, enum tk_mode mode, struct tk_write_result *out)
{
    if (n_cmps > KV_TXN_OPS_MAX || n_then + n_else > KV_TXN_OPS_MAX)
        return TK_ETOOBIG;
    Kvpb__Compare cmp[KV_TXN_OPS_MAX];
    Kvpb__Compare *cmpp[KV_TXN_OPS_MAX];
    for (size_t i = 0; i < n_cmps; i++) {
        kvpb__compare__init(&cmp[i]);
        cmp[i].key = bin(cmps[i].key, cmps[i].key_len);
        cmp[i].target = KVPB__COMPARE__TARGET__VERSION;
        cmp[i].op = KVPB__COMPARE__OP__EQUAL;
        cmp[i].number = (int64_t)cmps[i].version;
        cmpp[i] = &cmp[i];
    }
    Kvpb__Op op[KV_TXN_OPS_MAX];
    Kvpb__Op *opp[KV_TXN_OPS_MAX];
    Kvpb__Put puts[KV_TXN_OPS_MAX];
    Kvpb__Delete dels[KV_TXN_OPS_MAX];
    build_ops(then_ops, n_then, op, opp, puts, dels);
    build_ops(else_ops, n_else, op + n_then, opp + n_then, puts + n_then, dels + n_then);
    Kvpb__Txn t = KVPB__TXN__INIT;
    t.n_compares = n_cmps;
    t.compares = cmpp;
    t.n_then_ops = n_then;
    t.then_ops = opp;
    t.n_else_ops = n_else;
    t.else_ops = opp + n_then;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_TXN;
    cmd.txn = &t;
    return submit_blob(n, pack(&cmd), mode, out);
}

/* ---- reads ------------------------------------------------------------- */

void tk_value_free(struct tk_value *v)
{
    if (v == NULL)
        return;
    free(v->value);
    memset(v, 0, sizeof(*v));
}

static void get_cb(struct node_req *req, int status, struct kv_sm *sm, void *data)
{
    (void)req;
    struct waiter *w = data;
    if (status == 0) {
        struct kv_item it;
        status = kv_sm_get(sm, w->key, w->key_len, &it);
        if (status == 0) {
            struct tk_value *v = w->value;
            v->value = malloc(it.value_len + 1);
            if (v->value == NULL) {
                status = TK_ENOMEM;
            } else {
                memcpy(v->value, it.value, it.value_len);
                v->value[it.value_len] = 0;
                v->len = it.value_len;
                v->create_revision = it.create_revision;
                v->mod_revision = it.mod_revision;
                v->version = it.version;
            }
        }
    }
    waiter_done(w, status);
}

static int read_wait(struct tk_node *n, enum tk_consistency c, node_read_cb *cb,
                     struct waiter *w)
{
    struct node_req req;
    memset(&req, 0, sizeof(req));
    req.is_read = 1;
    req.consistency = c == TK_READ_STALE ? NODE_READ_STALE : NODE_READ_LINEARIZABLE;
    req.read_cb = cb;
    req.data = w;
    int rc = node_submit(n->node, &req);
    if (rc != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        return rc;
    }
    return waiter_wait(w);
}

int tk_get(struct tk_node *n, const void *key, size_t key_len, enum tk_consistency c,
           struct tk_value *out)
{
    struct waiter w;
    waiter_init(&w, n);
    memset(out, 0, sizeof(*out));
    w.key = key;
    w.key_len = key_len;
    w.value = out;
    return read_wait(n, c, get_cb, &w);
}

/* tk_scan reads in steps of at most SCAN_STEP keys (and KV_SCAN_SKIP_MAX
 * deleted ones still held), each a read of its own on the node's loop, so that
 * a scan over a large range never holds the loop (and the Raft core) for long.
 * Each step is consistent at its own applied index, as a paged HTTP scan. */
#define SCAN_STEP 1024
#define SCAN_KEY_CAP 65536 /* above the sm's largest key (65535) */

struct scan_walk {
    struct kv_range first; /* the prefix */
    uint8_t *end;          /* the prefix's end (NULL: none) */
    size_t end_len;
    uint8_t *from; /* the next step goes on from here */
    size_t from_len;
    /* The step's range start: a copy of `from`, which its items overwrite
     * while the merge still compares cold keys with the start. */
    uint8_t *start;
    uint8_t *stop_key; /* where a step's skip budget ran out */
    bool started, more, user_stopped;
    size_t left; /* items still wanted (SIZE_MAX: no limit) */
    size_t step_items;
};

static int scan_item(const struct kv_item *it, void *data)
{
    struct waiter *w = data;
    struct scan_walk *s = w->scan;
    struct tk_item ti = {.key = it->key,
                         .key_len = it->key_len,
                         .value = it->value,
                         .value_len = it->value_len,
                         .mod_revision = it->mod_revision,
                         .version = it->version};
    TK_ASSERT(it->key_len < SCAN_KEY_CAP);
    memcpy(s->from, it->key, it->key_len);
    s->from_len = it->key_len;
    s->step_items++;
    s->left--;
    if (w->item_cb(&ti, w->item_data) != 0) {
        s->user_stopped = true;
        return 1;
    }
    return 0;
}

static void scan_cb(struct node_req *req, int status, struct kv_sm *sm, void *data)
{
    (void)req;
    struct waiter *w = data;
    struct scan_walk *s = w->scan;
    s->more = false;
    if (status == 0) {
        struct kv_range r = s->first;
        if (s->started) {
            memcpy(s->start, s->from, s->from_len);
            r = (struct kv_range){.start = s->start,
                                  .start_len = s->from_len,
                                  .end = s->end,
                                  .end_len = s->end_len};
        }
        size_t lim = s->left < SCAN_STEP ? s->left : SCAN_STEP;
        struct kv_scan_stop stop = {.key = s->stop_key, .cap = SCAN_KEY_CAP};
        s->step_items = 0;
        status = kv_sm_scan_bounded(sm, &r, lim, KV_SCAN_SKIP_MAX, scan_item, w, &stop);
        if (status == 0 && !s->user_stopped && s->left > 0) {
            if (stop.stopped) {
                memcpy(s->from, stop.key, stop.key_len);
                s->from_len = stop.key_len;
            }
            s->more = stop.stopped || s->step_items == lim;
            if (s->more)
                s->from[s->from_len++] = 0; /* just after the key read last */
            s->started = true;
        }
    }
    waiter_done(w, status);
}

/* The first key after every key with `prefix`: the prefix without its
 * trailing 0xff bytes, its last byte plus one; none (NULL) if nothing is left. */
static uint8_t *prefix_end(const uint8_t *prefix, size_t len, size_t *out_len)
{
    while (len > 0 && prefix[len - 1] == 0xff)
        len--;
    *out_len = len;
    if (len == 0)
        return NULL;
    uint8_t *e = tk_malloc(len);
    memcpy(e, prefix, len);
    e[len - 1]++;
    return e;
}

int tk_scan(struct tk_node *n, const void *prefix, size_t prefix_len, size_t limit,
            enum tk_consistency c, tk_item_cb *cb, void *data)
{
    if (cb == NULL || prefix_len >= SCAN_KEY_CAP)
        return TK_EINVAL;
    struct scan_walk s = {
        .first = {.start = prefix, .start_len = prefix_len, .by_prefix = true},
        .from = tk_malloc(SCAN_KEY_CAP + 1),
        .start = tk_malloc(SCAN_KEY_CAP + 1),
        .stop_key = tk_malloc(SCAN_KEY_CAP),
        .left = limit == 0 ? SIZE_MAX : limit};
    s.end = prefix_end(prefix, prefix_len, &s.end_len);
    int rc;
    do {
        struct waiter w;
        waiter_init(&w, n);
        w.item_cb = cb;
        w.item_data = data;
        w.scan = &s;
        rc = read_wait(n, c, scan_cb, &w);
    } while (rc == 0 && s.more);
    tk_free(s.from);
    tk_free(s.start);
    tk_free(s.stop_key);
    tk_free(s.end);
    return rc;
}

/* ---- watch ------------------------------------------------------------- */

struct watch_wait {
    struct waiter w; /* first: the read callback gets it */
    const uint8_t *prefix;
    size_t prefix_len;
    uint64_t from, stop_rev, next;
    tk_event_cb *cb;
    void *data;
};

static void watch_event(const struct kv_event *ev, void *data)
{
    struct watch_wait *ww = data;
    if (ww->stop_rev != 0 && ev->revision > ww->stop_rev)
        return; /* past the revision the caller stopped at */
    if (ev->key_len < ww->prefix_len || memcmp(ev->key, ww->prefix, ww->prefix_len) != 0)
        return;
    struct tk_event te = {.revision = ev->revision,
                          .type = ev->type,
                          .key = ev->key,
                          .key_len = ev->key_len,
                          .value = ev->value,
                          .value_len = ev->value_len,
                          .version = ev->version,
                          .create_revision = ev->create_revision};
    if (ww->cb(&te, ww->data) != 0 && ww->stop_rev == 0)
        ww->stop_rev = ev->revision;
}

static void watch_read_cb(struct node_req *req, int status, struct kv_sm *sm, void *data)
{
    (void)req;
    struct watch_wait *ww = data;
    if (status == 0) {
        if (ww->from == 0)
            ww->from = kv_sm_applied_index(sm) + 1;
        status = kv_sm_events_read(sm, ww->from, 1024, 0, watch_event, ww, &ww->next);
        if (status == TK_ECOMPACTED)
            ww->next = kv_sm_events_first(sm);
    }
    waiter_done(&ww->w, status);
}

int tk_watch(struct tk_node *n, const void *prefix, size_t prefix_len, uint64_t *from,
             uint32_t timeout_ms, tk_event_cb *cb, void *data)
{
    if (cb == NULL || from == NULL || (prefix == NULL && prefix_len > 0))
        return TK_EINVAL;
    struct watch_wait ww = {.prefix = prefix,
                            .prefix_len = prefix_len,
                            .from = *from,
                            .cb = cb,
                            .data = data};
    uint64_t end = tk_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        waiter_init(&ww.w, n);
        int rc = read_wait(n, TK_READ_STALE, watch_read_cb, &ww.w);
        if (rc == TK_ECOMPACTED) {
            *from = ww.next;
            return rc;
        }
        if (rc != 0)
            return rc;
        ww.from = ww.stop_rev != 0 ? ww.stop_rev + 1 : ww.next;
        *from = ww.from;
        if (ww.stop_rev != 0 || (timeout_ms != 0 && tk_mono_ns() >= end))
            return 0;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

struct node *tk_node_runtime(struct tk_node *n)
{
    return n->node;
}
