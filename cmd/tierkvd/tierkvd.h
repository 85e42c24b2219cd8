/* tierkvd's files share this: the state of one run, from the checked options
 * (options.h) to a running node with its gateway.
 *
 *   options.c  the option table: argv and TIERKV_* into struct tierkvd_config,
 *              --help, --help-markdown
 *   setup.c    the config into node_options and gateway_config, with the rules
 *              between options; members, memory, descriptors, data directory
 *   secure.c   secret files, HTTPS, peer TLS, the peer token, the auth file
 *   log_json.c --log-format json
 *   main.c     main: setup, start, wait for SIGINT/SIGTERM, stop
 *
 * Everything runs on the main thread before the node starts, and every
 * configuration that cannot start exits 2 through tierkvd_die. */
#ifndef TIERKVD_TIERKVD_H
#define TIERKVD_TIERKVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cmd/tierkvd/options.h"
#include "etcdapi/etcdapi.h"
#include "gateway/gateway.h"
#include "node/node.h"

/* A --members or --members-http entry: id=host:port. */
struct tierkvd_member {
    uint64_t id;
    char host[GATEWAY_ADDR_MAX];
    uint16_t port;
    char text[GATEWAY_ADDR_MAX]; /* host:port as given */
};

#define TIERKVD_TOKEN_MAX 4096 /* --peer-token-file's largest token */

/* One run. node_options and gateway_config borrow strings from here (and
 * from the config), so it lives as long as the node: main keeps it static. */
struct tierkvd {
    const struct tierkvd_config *cfg;
    struct node_options no;
    struct gateway_config gc;
    struct tierkvd_member members[RAFT_VOTERS_MAX], mhttp[RAFT_VOTERS_MAX];
    size_t n_members, n_http;
    char http_host[GATEWAY_ADDR_MAX], raft_host[GATEWAY_ADDR_MAX];
    uint8_t token[TIERKVD_TOKEN_MAX];
    uint64_t nofile, fd_reserve;      /* RLIMIT_NOFILE and what HTTP leaves */
    bool open_peers;                  /* --insecure-peers in force: warned */
    struct transport_inproc_hub *hub; /* a single node's (no raft socket) */
    struct tk_tls_ctx *https;         /* the gateway's, or NULL */
    struct gateway_auth *auth;        /* --auth-file's, or NULL */
    struct gateway *gw;
    struct etcdapi *etcd;          /* --listen-client's, or NULL */
    struct tk_tls_ctx *etcd_tls;   /* its TLS (--cert-file), or NULL */
    struct etcdapi_auth etcd_auth; /* its users (--auth-file's) */
    char client_host[GATEWAY_ADDR_MAX];
};

/* setup.c: fills `t` from `cfg` (borrowed for the run): the node's options,
 * the gateway (made, not listening), the secrets loaded, the data directory
 * made or restored. Exits 2 on a configuration that cannot start. */
void tierkvd_setup(struct tierkvd *t, const struct tierkvd_config *cfg);

/* secure.c. tierkvd_peer_tls: --peer-cert-file, --peer-key-file and
 * --peer-trusted-ca-file into the node's two peer TLS contexts (all three
 * flags or none). tierkvd_peer_security: --peer-token-file into t->token, or
 * the rules for a raft port without one (sets t->open_peers).
 * tierkvd_gateway_tls: the gateway's HTTPS context into t->https (NULL:
 * plain HTTP), and --listen-client's (ALPN h2) into t->etcd_tls. tierkvd_auth:
 * --auth-file into t->auth. Each exits 2 on a file that is missing, invalid or open to
 * group or others. */
void tierkvd_peer_tls(struct tierkvd *t);
void tierkvd_peer_security(struct tierkvd *t);
void tierkvd_gateway_tls(struct tierkvd *t);
void tierkvd_auth(struct tierkvd *t);

/* log_json.c: a base/log sink that writes each logfmt line as one JSON
 * object on stderr (--log-format json). */
void tierkvd_json_sink(const char *line, size_t len, void *data);

#endif
