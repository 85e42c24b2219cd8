/* etcd's v3 API over gRPC (docs/etcd-compat.md): a gRPC listener that runs
 * on the node's client loop (node.h, on_client_start; with on_node_loop, on
 * the node's own loop), beside the HTTP gateway, and turns etcd's
 * KV, Maintenance and Cluster calls into node requests (node/node.h), as
 * the gateway does: writes are kvpb.Commands submitted in applied mode
 * (a follower's node forwards them to the leader), reads run in the node's
 * read callback against the state machine.
 *
 * Use: fill an etcdapi_config, etcdapi_new(), etcdapi_hook() into the
 * node_options before node_start() and after any other hook (the gateway's):
 * it chains to the hooks it finds there. After node_start,
 * etcdapi_listen_status() says whether the bind worked; after node_stop,
 * etcdapi_free().
 *
 * Threads: etcdapi_new/hook/listen_status/port/free on the owner's thread
 * (never concurrently with node_start/node_stop); everything else on the
 * client loop's thread (or the node's loop thread with on_node_loop). Limits: grpc.h's
 * (connections, streams, message and output bytes) and the range bounds here. Cleartext
 * only (TLS: not yet). */
#ifndef TK_ETCDAPI_ETCDAPI_H
#define TK_ETCDAPI_ETCDAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct node_options;
struct etcdapi;
struct tk_tls_ctx;

/* Token authentication (etcd's Auth.Authenticate, then a "token" on every
 * call), on principals the caller keeps (tierkvd: --auth-file's users). A
 * user is the caller's handle; every function runs on the loop's thread. */
struct etcdapi_auth {
    /* The user a token names, or NULL. */
    const void *(*user)(void *arg, const uint8_t *token, size_t len);
    const char *(*name)(void *arg, const void *user);
    bool (*admin)(void *arg, const void *user);
    /* May the user read (write false) or write the key alone (elen 0),
     * [key, end), or every key from key on (end "\0", elen 1)? */
    bool (*may)(void *arg, const void *user, bool write, const uint8_t *key, size_t klen,
                const uint8_t *end, size_t elen);
    void *arg;
};

struct etcdapi_config {
    const char *host;            /* "127.0.0.1"; an IPv4 or IPv6 literal */
    uint16_t port;               /* 0: an ephemeral port (etcdapi_port) */
    size_t key_max;              /* 4 KiB */
    size_t value_max;            /* 1 MiB */
    uint32_t conns_max;          /* open connections: 1024 */
    uint32_t range_limit_max;    /* keys one Range answers: 10000 (more beyond) */
    uint32_t count_max;          /* keys a Range counts: 100000 (count is then
                                    a lower bound) */
    uint32_t delete_step;        /* keys one DeleteRange step deletes: 1000 */
    uint64_t request_timeout_ms; /* node deadline per call; 0: the node's
                                    (a shorter grpc-timeout wins) */
    /* TLS (tls/tls.h, a server context with ALPN "h2"; borrowed, outlives
     * the API): NULL serves cleartext (h2c). Its CA, if any, makes client
     * certificates required (grpc.h). */
    struct tk_tls_ctx *tls;
    uint32_t handshakes_max;      /* TLS handshakes in progress: 0, grpc's 64 */
    uint32_t handshakes_per_addr; /* ... from one address: 0, grpc's 16 */
    /* The host clients reach this listener at, for MemberList's client URLs
     * (NULL: `host`). */
    const char *advertise_host;
    /* Token authentication (borrowed, outlives the API): NULL, none (every
     * client may do everything; Authenticate answers FailedPrecondition
     * `authentication is not enabled`, the other Auth calls Unimplemented). */
    const struct etcdapi_auth *auth;
    /* Serve on the node's consensus loop, as before issue 48 (false: on
     * the client loop, which a gateway in the same node shares: both take
     * the same setting). */
    bool on_node_loop;
};

/* Fills `c` with the defaults above (port 2379). */
void etcdapi_config_default(struct etcdapi_config *c);

/* Checks and copies the config. Returns 0 or TK_EINVAL. */
int etcdapi_new(const struct etcdapi_config *c, struct etcdapi **out);

/* Sets o's client loop hooks (with on_node_loop: its loop hooks) to the
 * API's, keeping the ones already there (a gateway's): they run first at
 * start and last at stop. */
void etcdapi_hook(struct etcdapi *e, struct node_options *o);

/* After node_start: 0 if the API listens, else TK_EINVAL (bad address) or
 * TK_EIO (bind or listen failed), with a message in etcdapi_listen_error. */
int etcdapi_listen_status(const struct etcdapi *e);
const char *etcdapi_listen_error(const struct etcdapi *e);

/* The bound port (after node_start). */
uint16_t etcdapi_port(const struct etcdapi *e);

/* After node_stop (or if node_start failed). NULL is allowed. */
void etcdapi_free(struct etcdapi *e);

#endif
