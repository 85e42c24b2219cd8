/* The TLS engine (contract in tls.h): one SSL per session between two memory
 * BIOs, in (what the peer sent) and out (what to send). No socket, no loop:
 * nothing here can block. The only file of tierkv that knows libssl.
 *
 * OpenSSL keeps its errors in a per-thread queue; every call that can fail
 * clears it first and turns what it finds into the session's message, so a
 * failure on one session never shows up as another's. */
#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "tls/tls.h"

struct tk_tls_ctx {
    SSL_CTX *ssl_ctx;
    bool server;
    unsigned char alpn[33]; /* the ALPN protocol, wire form (alpn_len 0: none) */
    unsigned alpn_len;
};

struct tk_tls {
    SSL *ssl;
    BIO *in, *out; /* owned by ssl */
    bool failed;
    bool done;
    char err[TK_TLS_ERR_MAX];
};

/* Out of memory aborts, as base/alloc.c does. */
_Noreturn static void tls_oom(const char *what)
{
    fprintf(stderr, "tierkv: out of memory (%s)\n", what);
    abort();
}

/* The reason OpenSSL gives for its last failure, with the certificate
 * verification result when that is what failed. */
static void ssl_reason(char *err, size_t cap, const char *what, SSL *ssl)
{
    unsigned long e = ERR_peek_last_error();
    char lib[160] = "";
    if (e != 0)
        ERR_error_string_n(e, lib, sizeof(lib));
    long v = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (v != X509_V_OK)
        snprintf(err, cap, "%s: certificate verify failed: %s", what,
                 X509_verify_cert_error_string(v));
    else
        snprintf(err, cap, "%s: %s", what, lib[0] ? lib : "failed");
    ERR_clear_error();
}

static int ctx_load(SSL_CTX *sc, const struct tk_tls_ctx_config *cfg, char *err,
                    size_t cap)
{
    if (cfg->cert_file != NULL &&
        SSL_CTX_use_certificate_chain_file(sc, cfg->cert_file) != 1) {
        ssl_reason(err, cap, cfg->cert_file, NULL);
        return TK_EINVAL;
    }
    if (cfg->key_file != NULL &&
        SSL_CTX_use_PrivateKey_file(sc, cfg->key_file, SSL_FILETYPE_PEM) != 1) {
        ssl_reason(err, cap, cfg->key_file, NULL);
        return TK_EINVAL;
    }
    if (cfg->cert_file != NULL && SSL_CTX_check_private_key(sc) != 1) {
        ssl_reason(err, cap, "the key does not match the certificate", NULL);
        return TK_EINVAL;
    }
    if (cfg->ca_file != NULL &&
        SSL_CTX_load_verify_locations(sc, cfg->ca_file, NULL) != 1) {
        ssl_reason(err, cap, cfg->ca_file, NULL);
        return TK_EINVAL;
    }
    if (cfg->ca_file == NULL && !cfg->server && !cfg->no_verify)
        (void)SSL_CTX_set_default_verify_paths(sc);
    return 0;
}

/* ALPN (server): picks the context's protocol if the client offers it. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    const struct tk_tls_ctx *ctx = arg;
    unsigned char *sel;
    if (SSL_select_next_proto(&sel, outlen, ctx->alpn, ctx->alpn_len, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

int tk_tls_ctx_new(const struct tk_tls_ctx_config *cfg, struct tk_tls_ctx **out,
                   char *err, size_t err_cap)
{
    ERR_clear_error();
    if (cfg->server && (cfg->cert_file == NULL || cfg->key_file == NULL)) {
        snprintf(err, err_cap, "a TLS server needs a certificate and its key");
        return TK_EINVAL;
    }
    size_t alpn_len = cfg->alpn != NULL ? strlen(cfg->alpn) : 0;
    if (cfg->alpn != NULL && (!cfg->server || alpn_len == 0 || alpn_len > 32)) {
        snprintf(err, err_cap, "ALPN: a server's one protocol name of 1 to 32 bytes");
        return TK_EINVAL;
    }
    if ((cfg->cert_file == NULL) != (cfg->key_file == NULL)) {
        snprintf(err, err_cap, "a certificate needs its key, and a key its certificate");
        return TK_EINVAL;
    }
    SSL_CTX *sc = SSL_CTX_new(cfg->server ? TLS_server_method() : TLS_client_method());
    if (sc == NULL) {
        ssl_reason(err, err_cap, "SSL_CTX_new", NULL);
        return TK_EIO;
    }
    SSL_CTX_set_min_proto_version(sc, TLS1_2_VERSION);
    /* Idle connections give their 2 x 16 KiB record buffers back. */
    SSL_CTX_set_mode(sc, SSL_MODE_RELEASE_BUFFERS);
    int rc = ctx_load(sc, cfg, err, err_cap);
    if (rc != 0) {
        SSL_CTX_free(sc);
        return rc;
    }
    if (cfg->server) {
        /* No resumption: our clients do not use it, and no ticket key to
         * manage. A CA means client certificates are required. */
        SSL_CTX_set_num_tickets(sc, 0);
        SSL_CTX_set_session_cache_mode(sc, SSL_SESS_CACHE_OFF);
        if (cfg->ca_file != NULL)
            SSL_CTX_set_verify(sc, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                               NULL);
    } else {
        SSL_CTX_set_verify(sc, cfg->no_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    }
    struct tk_tls_ctx *ctx = tk_calloc(1, sizeof(*ctx));
    ctx->ssl_ctx = sc;
    ctx->server = cfg->server;
    if (alpn_len > 0) { /* wire form: a length byte, then the name */
        ctx->alpn[0] = (unsigned char)alpn_len;
        memcpy(ctx->alpn + 1, cfg->alpn, alpn_len);
        ctx->alpn_len = (unsigned)alpn_len + 1;
        SSL_CTX_set_alpn_select_cb(sc, alpn_select, ctx);
    }
    *out = ctx;
    if (err_cap > 0)
        err[0] = 0;
    return 0;
}

void tk_tls_ctx_free(struct tk_tls_ctx *ctx)
{
    if (ctx == NULL)
        return;
    SSL_CTX_free(ctx->ssl_ctx);
    tk_free(ctx);
}

/* The name a client expects: a DNS name (also sent as SNI) or an IP literal. */
static void expect_host(struct tk_tls *t, const char *host)
{
    unsigned char ip[16];
    if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
        (void)X509_VERIFY_PARAM_set1_ip_asc(vp, host);
    } else {
        (void)SSL_set_tlsext_host_name(t->ssl, host);
        (void)SSL_set1_host(t->ssl, host);
    }
}

struct tk_tls *tk_tls_new(struct tk_tls_ctx *ctx, const char *host)
{
    struct tk_tls *t = tk_calloc(1, sizeof(*t));
    t->ssl = SSL_new(ctx->ssl_ctx);
    t->in = BIO_new(BIO_s_mem());
    t->out = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->in == NULL || t->out == NULL)
        tls_oom("an OpenSSL session");
    /* An empty input BIO means "retry", not end of file. */
    BIO_set_mem_eof_return(t->in, -1);
    SSL_set_bio(t->ssl, t->in, t->out);
    if (ctx->server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        if (host != NULL && host[0] != 0)
            expect_host(t, host);
    }
    return t;
}

void tk_tls_free(struct tk_tls *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl); /* and its BIOs */
    tk_free(t);
}

int tk_tls_feed(struct tk_tls *t, const void *cipher, size_t len)
{
    if (len == 0)
        return 0;
    if (BIO_ctrl_pending(t->in) + len > TK_TLS_IN_MAX)
        return TK_EBUSY;
    if (BIO_write(t->in, cipher, (int)len) != (int)len)
        tls_oom("the TLS input");
    return 0;
}

/* What an SSL call's failure means: 0 (wants more input), or the session
 * failed (TK_EPROTO, message kept) or was closed by the peer. */
static int ssl_result(struct tk_tls *t, int n, const char *what)
{
    int e = SSL_get_error(t->ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(t->err, sizeof(t->err), "the peer closed the TLS session");
        return TK_ECLOSED;
    }
    t->failed = true;
    ssl_reason(t->err, sizeof(t->err), what, t->ssl);
    return TK_EPROTO;
}

int tk_tls_handshake(struct tk_tls *t)
{
    if (t->failed)
        return TK_EPROTO;
    if (t->done)
        return 1;
    ERR_clear_error();
    int n = SSL_do_handshake(t->ssl);
    if (n == 1) {
        t->done = true;
        return 1;
    }
    int rc = ssl_result(t, n, "TLS handshake");
    return rc == TK_ECLOSED ? TK_EPROTO : rc;
}

ssize_t tk_tls_read(struct tk_tls *t, void *plain, size_t cap)
{
    if (t->failed)
        return TK_EPROTO;
    /* Nothing fed and nothing decrypted waiting: "need more" without a
     * failed SSL_read (its error path costs as much as a read). */
    if (t->done && BIO_ctrl_pending(t->in) == 0 && !SSL_has_pending(t->ssl))
        return 0;
    ERR_clear_error();
    size_t got = 0;
    if (SSL_read_ex(t->ssl, plain, cap, &got) == 1) {
        t->done = true;
        return (ssize_t)got;
    }
    if (SSL_is_init_finished(t->ssl))
        t->done = true;
    return ssl_result(t, 0, t->done ? "TLS read" : "TLS handshake");
}

int tk_tls_write(struct tk_tls *t, const void *plain, size_t len)
{
    if (t->failed)
        return TK_EPROTO;
    if (len == 0)
        return 0;
    ERR_clear_error();
    size_t put = 0;
    /* The output BIO grows as needed, so a write is whole or fails. */
    if (SSL_write_ex(t->ssl, plain, len, &put) == 1 && put == len)
        return 0;
    int rc = ssl_result(t, 0, "TLS write");
    if (rc == 0) {
        snprintf(t->err, sizeof(t->err), "TLS write before the handshake finished");
        t->failed = true;
    }
    return TK_EPROTO;
}

size_t tk_tls_out_pending(const struct tk_tls *t)
{
    return BIO_ctrl_pending(t->out);
}

size_t tk_tls_out_take(struct tk_tls *t, void *buf, size_t cap)
{
    size_t n = BIO_ctrl_pending(t->out);
    if (n > cap)
        n = cap;
    if (n == 0)
        return 0;
    return (size_t)BIO_read(t->out, buf, (int)n);
}

void tk_tls_shutdown(struct tk_tls *t)
{
    if (!t->done || t->failed)
        return;
    ERR_clear_error();
    (void)SSL_shutdown(t->ssl);
    ERR_clear_error();
}

bool tk_tls_handshake_done(const struct tk_tls *t)
{
    return t->done;
}

const char *tk_tls_error(const struct tk_tls *t)
{
    return t->err[0] ? t->err : "no TLS error";
}

bool tk_tls_peer_verified(const struct tk_tls *t)
{
    return t->done && SSL_get0_peer_certificate(t->ssl) != NULL &&
           SSL_get_verify_result(t->ssl) == X509_V_OK;
}

bool tk_tls_peer_has_name(const struct tk_tls *t, const char *name)
{
    if (!tk_tls_peer_verified(t))
        return false;
    X509 *cert = SSL_get0_peer_certificate(t->ssl);
    return X509_check_host(cert, name, strlen(name), X509_CHECK_FLAG_NO_WILDCARDS,
                           NULL) == 1;
}
