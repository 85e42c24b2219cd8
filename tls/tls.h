/* TLS over memory BIOs (OpenSSL 3), the way Node's tls_wrap and H2O do it:
 * the engine (tls.c) never touches a socket. Its user feeds it the ciphertext
 * it read (tk_tls_feed), takes plaintext out (tk_tls_read), hands it plaintext
 * to send (tk_tls_write) and takes the ciphertext to put on the wire
 * (tk_tls_out_take, or tk_tls_uv_write / tk_tls_uv_flush of tls_uv.c, which
 * do it on a libuv stream). A partial record is only bytes waiting in the
 * input BIO: tk_tls_read returns 0 ("need more") and the loop goes on.
 *
 * Bounds: the input BIO holds at most TK_TLS_IN_MAX bytes not yet decrypted
 * (tk_tls_feed refuses more with TK_EBUSY: a user reads before it feeds
 * again); the output BIO holds what the user wrote and has not taken, which
 * the user bounds (the gateway by its per-connection response limit).
 *
 * Used by the gateway (HTTPS), the CLI and its bench (HTTPS client) and the
 * Raft transport (peer mutual TLS). Threads: a context may be shared by
 * threads once built (OpenSSL's SSL_CTX is); one session belongs to one
 * thread. */
#ifndef TK_TLS_TLS_H
#define TK_TLS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TK_TLS_IN_MAX (64u * 1024)
#define TK_TLS_ERR_MAX 256

struct tk_tls_ctx;
struct tk_tls;

struct tk_tls_ctx_config {
    bool server;
    const char *cert_file; /* PEM chain; required for a server, optional client */
    const char *key_file;  /* PEM private key of cert_file */
    /* PEM CA bundle the peer's certificate must chain to. A server with one
     * requires a client certificate (mutual TLS); a client without one
     * uses the system's default store. */
    const char *ca_file;
    /* Client only: skip verifying the server (tests and `--insecure`). */
    bool no_verify;
    /* Server only: the one ALPN protocol it speaks ("h2" for gRPC; NULL:
     * no ALPN). A client that offers ALPN without it is refused in the
     * handshake (no_application_protocol); one that offers none is served. */
    const char *alpn;
};

/* Builds a context (TLS 1.2 or newer). Returns 0, or TK_EINVAL with a
 * message in err (a file that does not load, a key that does not match its
 * certificate). *out is the caller's: tk_tls_ctx_free. */
int tk_tls_ctx_new(const struct tk_tls_ctx_config *cfg, struct tk_tls_ctx **out,
                   char *err, size_t err_cap);
void tk_tls_ctx_free(struct tk_tls_ctx *ctx);

/* A session on `ctx` (which must outlive it). A client session names the
 * server it expects (`host`, checked against the certificate's SAN/CN and
 * sent as SNI; NULL: not checked) and starts its handshake with its first
 * tk_tls_handshake or tk_tls_write. */
struct tk_tls *tk_tls_new(struct tk_tls_ctx *ctx, const char *host);
void tk_tls_free(struct tk_tls *t);

/* Ciphertext the peer sent. Returns 0, or TK_EBUSY when that would put more
 * than TK_TLS_IN_MAX undecrypted bytes in the input BIO. */
int tk_tls_feed(struct tk_tls *t, const void *cipher, size_t len);

/* Drives the handshake with what was fed. Returns 1 once it is done, 0 while
 * it needs more bytes from the peer (take the output first: it may have
 * something to say), or TK_EPROTO (see tk_tls_error). */
int tk_tls_handshake(struct tk_tls *t);

/* Decrypts into plain[0..cap): returns the number of bytes (> 0), 0 when it
 * needs more ciphertext (a partial record), TK_ECLOSED when the peer sent
 * close_notify, TK_EPROTO on a failed handshake or a bad record. Drives the
 * handshake too: a server calls only this. */
ssize_t tk_tls_read(struct tk_tls *t, void *plain, size_t cap);

/* Encrypts all of plain[0..len) into the output BIO. Returns 0, or
 * TK_EPROTO (the session failed, or the handshake is not done yet and
 * cannot finish without the peer: write after tk_tls_handshake returns 1). */
int tk_tls_write(struct tk_tls *t, const void *plain, size_t len);

/* Ciphertext waiting to go out, and taking it (up to cap; returns the count). */
size_t tk_tls_out_pending(const struct tk_tls *t);
size_t tk_tls_out_take(struct tk_tls *t, void *buf, size_t cap);

/* Queues a close_notify (take the output after it). */
void tk_tls_shutdown(struct tk_tls *t);

bool tk_tls_handshake_done(const struct tk_tls *t);

/* The reason of the last failure ("certificate verify failed: certificate has
 * expired"...); valid until the next call on t. */
const char *tk_tls_error(const struct tk_tls *t);

/* After the handshake: whether the peer showed a verified certificate, and
 * whether it names `name` (a DNS SAN equal to it, or, with no DNS SAN, the
 * subject CN). Used for peers ("node-<id>"). */
bool tk_tls_peer_verified(const struct tk_tls *t);
bool tk_tls_peer_has_name(const struct tk_tls *t, const char *name);

#endif
