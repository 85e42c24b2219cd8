/* tierkvd's secrets and TLS: the secret files (--peer-token-file,
 * --peer-key-file, --key-file, --auth-file) opened and checked by
 * base/secret_file.h, HTTPS for the gateway, mutual TLS and the token for
 * raft peers, and the rule for a raft port that has neither. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "base/secret_file.h"
#include "cmd/tierkvd/tierkvd.h"
#include "tls/tls.h"
#include "transport/transport.h"

static bool is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* A secret file opened and checked (base/secret_file.h): a file group or
 * others may read or write stops the start, unless --allow-loose-permissions
 * is given; then it is logged once as a warning. Returns the descriptor. */
static int open_secret(const struct tierkvd_config *cfg, const char *flag,
                       const char *path)
{
    char msg[TK_SECRET_MSG_MAX];
    int fd;
    if (tk_secret_file_open(path, cfg->allow_loose_permissions, &fd, msg, sizeof(msg)) !=
        0)
        tierkvd_die("--%s: %s", flag, msg);
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

void tierkvd_gateway_tls(struct tierkvd *t)
{
    const char *cert = t->cfg->cert_file, *key = t->cfg->key_file,
               *ca = t->cfg->client_ca_file;
    if (cert == NULL && key == NULL && ca == NULL)
        return;
    if (cert == NULL || key == NULL)
        tierkvd_die("HTTPS needs both --cert-file and --key-file%s",
                    ca != NULL ? " (--client-ca-file alone is not enough)" : "");
    char proc[TK_SECRET_FD_PATH_MAX];
    int fd = open_secret(t->cfg, "key-file", key);
    struct tk_tls_ctx_config tc = {.server = true,
                                   .cert_file = cert,
                                   .key_file = secret_path(fd, key, proc, sizeof(proc)),
                                   .ca_file = ca};
    char err[TK_TLS_ERR_MAX];
    int rc = tk_tls_ctx_new(&tc, &t->gc.tls, err, sizeof(err));
    /* --listen-client: the same certificate and CA, speaking gRPC's "h2"
     * by ALPN (the gateway's context must not: it speaks HTTP/1.1). */
    if (rc == 0 && t->cfg->listen_client != NULL) {
        tc.alpn = "h2";
        rc = tk_tls_ctx_new(&tc, &t->etcd_tls, err, sizeof(err));
    }
    close(fd);
    if (rc != 0) {
        name_secret(err, sizeof(err), proc, key);
        tierkvd_die("HTTPS (--cert-file, --key-file, --client-ca-file): %s", err);
    }
    t->https = t->gc.tls;
}

void tierkvd_peer_tls(struct tierkvd *t)
{
    struct node_options *no = &t->no;
    const char *cert = t->cfg->peer_cert_file, *key = t->cfg->peer_key_file,
               *ca = t->cfg->peer_trusted_ca_file;
    if (cert == NULL && key == NULL && ca == NULL)
        return;
    if (cert == NULL || key == NULL || ca == NULL)
        tierkvd_die("peer TLS needs all of --peer-cert-file, --peer-key-file and "
                    "--peer-trusted-ca-file");
    if (no->hub != NULL || no->listen_host == NULL)
        tierkvd_die("peer TLS needs --members (a single node has no raft peers)");
    char err[TK_TLS_ERR_MAX], proc[TK_SECRET_FD_PATH_MAX];
    int fd = open_secret(t->cfg, "peer-key-file", key);
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
        tierkvd_die("peer TLS (--peer-cert-file, --peer-key-file, "
                    "--peer-trusted-ca-file): %s",
                    err);
    }
}

/* --peer-token-file: the token into t->token, 16 to TIERKVD_TOKEN_MAX bytes. */
static void peer_token(struct tierkvd *t, const char *path)
{
    char msg[TK_SECRET_MSG_MAX];
    size_t n = 0;
    int rc = tk_secret_file_read(path, t->cfg->allow_loose_permissions, t->token,
                                 sizeof(t->token), &n, msg, sizeof(msg));
    if (rc != 0 && rc != TK_ETOOBIG)
        tierkvd_die("--peer-token-file: %s", msg);
    if (rc == TK_ETOOBIG || n < TRANSPORT_TCP_TOKEN_MIN)
        tierkvd_die("--peer-token-file: \"%s\" must hold %d to %zu bytes (make one with: "
                    "(umask 077; openssl rand -hex 32 > FILE))",
                    path, TRANSPORT_TCP_TOKEN_MIN, sizeof(t->token));
    if (msg[0] != 0)
        tk_logf(TK_LOG_WARN, t->no.id, 0, NULL, "--peer-token-file: %s", msg);
    t->no.peer_token = t->token;
    t->no.peer_token_len = n;
}

/* A raft address off loopback with neither a token nor peer TLS is refused
 * unless --insecure-peers (then t->open_peers: the caller warns every
 * minute). One on loopback starts, but says once that every local process
 * can reach it. */
void tierkvd_peer_security(struct tierkvd *t)
{
    struct node_options *no = &t->no;
    t->open_peers = false;
    if (t->cfg->peer_token_file != NULL) {
        peer_token(t, t->cfg->peer_token_file);
        return;
    }
    if (no->peer_tls_server != NULL || no->hub != NULL || no->listen_host == NULL)
        return;
    if (is_loopback(no->listen_host)) {
        char kvs[GATEWAY_ADDR_MAX + 32];
        snprintf(kvs, sizeof(kvs), "raft=%s:%u", no->listen_host, no->listen_port);
        tk_logf(TK_LOG_WARN, no->id, 0, kvs,
                "the raft port is open to every local process (no --peer-token-file nor "
                "peer TLS): any of them can act as a member. Give every node the same "
                "--peer-token-file (docs/operations.md)");
        return;
    }
    if (!t->cfg->insecure_peers)
        tierkvd_die("the raft address %s is not loopback and there is no "
                    "--peer-token-file nor peer TLS: anyone who reaches it could act as "
                    "a member. Give every node the same --peer-token-file, or "
                    "--peer-cert-file, --peer-key-file and --peer-trusted-ca-file "
                    "(docs/operations.md), or --insecure-peers to run open",
                    no->listen_host);
    t->open_peers = true;
}

/* Writable by another user, the auth file could gain an admin before the
 * next start: the same rule as the keys (no group or other bits). */
void tierkvd_auth(struct tierkvd *t)
{
    const char *path = t->cfg->auth_file;
    if (path == NULL)
        return;
    char err[512], proc[TK_SECRET_FD_PATH_MAX];
    int fd = open_secret(t->cfg, "auth-file", path);
    int rc = gateway_auth_load(secret_path(fd, path, proc, sizeof(proc)), &t->auth, err,
                               sizeof(err));
    close(fd);
    if (rc != 0) {
        name_secret(err, sizeof(err), proc, path);
        tierkvd_die("--auth-file: %s", err);
    }
    t->gc.auth = t->auth;
}
