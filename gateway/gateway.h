/* The HTTP/JSON gateway (API v1): an HTTP/1.1 server that runs on a node's
 * client loop (node.h, on_client_start: a thread and libuv loop of the
 * node's, beside the consensus loop) and turns requests into node requests
 * (node/node.h), so that no client work runs on the thread that runs Raft.
 *
 * Use: fill a gateway_config, gateway_new(), gateway_hook() into the
 * node_options before node_start(); the node then calls the gateway on its
 * client loop: at start the gateway binds and listens, at stop (every
 * request of the node answered) it closes the listener and every
 * connection. After node_start returns, gateway_listen_status() says
 * whether the bind worked. After node_stop, gateway_free().
 *
 * Threads: gateway_new/hook/listen_status/port/free run on the owner's thread
 * (never concurrently with node_start/node_stop); everything else runs on the
 * client loop's thread (with on_node_loop, on the node's loop thread). Limits: every
 * buffer has a bound from the config (header bytes, body bytes, pipelined requests per
 * connection, connections). The HTTP API itself is documented in docs/api.md. */
#ifndef TK_GATEWAY_GATEWAY_H
#define TK_GATEWAY_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GATEWAY_MEMBERS_MAX 16
#define GATEWAY_ADDR_MAX 128

struct node_options;
struct gateway;
struct tk_tls_ctx;
struct gateway_auth;

/* A cluster member as /v1/cluster shows it; http_addr (may be empty) is also
 * sent as X-Tierkv-Leader-Addr when that member leads. */
struct gateway_member {
    uint64_t id;
    char raft_addr[GATEWAY_ADDR_MAX];
    char http_addr[GATEWAY_ADDR_MAX];
};

struct gateway_config {
    const char *host;            /* "127.0.0.1"; IPv4 or IPv6 literal */
    uint16_t port;               /* 0: an ephemeral port (gateway_port) */
    size_t key_max;              /* 4 KiB */
    size_t value_max;            /* 1 MiB */
    size_t body_max;             /* 4 MiB */
    size_t header_max;           /* request line + headers: 16 KiB */
    uint32_t conns_max;          /* open connections: 1024 */
    uint32_t pipeline_max;       /* requests in flight per connection: 64 */
    uint64_t header_timeout_ms;  /* first byte to end of headers: 10000 */
    uint64_t body_timeout_ms;    /* end of headers to end of body: 30000 */
    uint64_t idle_timeout_ms;    /* keep-alive without a request: 60000 */
    uint64_t request_timeout_ms; /* node deadline per request; 0: the node's */
    uint32_t scan_limit_default; /* 1000 */
    uint32_t scan_limit_max;     /* 10000 */
    uint32_t retry_after_s;      /* Retry-After on 503: 1 */
    uint64_t write_timeout_ms;   /* responses not drained by then: close: 30000 */
    size_t mem_max;              /* bodies + responses held: 512 MiB (503 beyond) */
    uint32_t watchers_max;       /* open watches: 10000 (503 beyond) */
    /* HTTPS handshakes in progress: at most this many in all (256) and from
     * one client address (16); past either a new connection is closed at
     * accept, before any TLS state exists, and a handshake's slot is freed
     * at its deadline (header_timeout_ms). */
    uint32_t tls_handshakes_max;
    uint32_t tls_handshakes_per_addr;
    size_t watch_buffer_bytes; /* a watch's bytes written, not yet taken by
                                  its client: 1 MiB (then it waits) */
    uint64_t watch_stall_ms;   /* a watch whose buffer is full and whose client
                                  takes nothing for this long is cancelled
                                  (lagging): 3000 */
    size_t watch_total_bytes;  /* all watches' bytes not yet taken by their
                                  clients: 64 MiB; past it the watches holding
                                  the most are cancelled (lagging) at once */
    uint32_t n_members;
    struct gateway_member members[GATEWAY_MEMBERS_MAX];
    /* HTTPS: a server context (tls/tls.h, tk_tls_ctx_new with server set;
     * a CA in it requires client certificates). Borrowed: it must outlive
     * the gateway. NULL: plain HTTP. */
    struct tk_tls_ctx *tls;
    /* Bearer tokens (gateway_auth_load): every request but /healthz and
     * /readyz needs one, and rights per key prefix. Borrowed: it must outlive
     * the gateway. NULL: no authentication. */
    const struct gateway_auth *auth;
    /* Run on the node's own loop thread, as before issue 48, instead of the
     * node's client loop (a thread of its own): no thread hop per request,
     * but client work then shares the thread that runs Raft. false. */
    bool on_node_loop;
};

/* Loads an --auth-file (its format: gateway/api_auth.c and docs/tierkvd.md).
 * Returns 0, or TK_EINVAL with a message naming the file and line. *out is
 * the caller's: gateway_auth_free after the gateway. */
int gateway_auth_load(const char *path, struct gateway_auth **out, char *err,
                      size_t err_cap);
void gateway_auth_free(struct gateway_auth *a);

/* The same users for another front end (tierkvd wires etcd's API to them):
 * the user a token names (NULL: none; compared in constant time, as the
 * gateway's bearer tokens), its name, whether it is an admin, and whether
 * it may read (write false) or write the key `start` alone (elen 0),
 * [start, end), or every key from start on (end "\0", elen 1). Any thread;
 * a user lives as long as its gateway_auth. */
struct api_user;
const struct api_user *gateway_auth_user(const struct gateway_auth *a, const void *token,
                                         size_t len);
const char *gateway_auth_name(const struct api_user *u);
bool gateway_auth_admin(const struct api_user *u);
bool gateway_auth_may(const struct api_user *u, bool write, const uint8_t *start,
                      size_t slen, const uint8_t *end, size_t elen);

/* Fills `c` with the defaults above (host "127.0.0.1", port 8080). */
void gateway_config_default(struct gateway_config *c);

/* Checks and copies the config. Returns 0 or TK_EINVAL (a zero limit, header
 * limit under 1 KiB, value_max above body_max...). */
int gateway_new(const struct gateway_config *c, struct gateway **out);

/* Sets o->on_loop_start, o->on_loop_stop and o->hook_data. One node per
 * gateway. */
void gateway_hook(struct gateway *gw, struct node_options *o);

/* After node_start: 0 if the gateway listens, else TK_EINVAL (bad address)
 * or TK_EIO (bind/listen failed, e.g. the port is in use), with a message in
 * gateway_listen_error(). */
int gateway_listen_status(const struct gateway *gw);
const char *gateway_listen_error(const struct gateway *gw);

/* The bound port (after node_start). */
uint16_t gateway_port(const struct gateway *gw);

/* After node_stop (or if node_start failed). NULL is allowed. */
void gateway_free(struct gateway *gw);

#endif
