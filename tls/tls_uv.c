/* The write side of a TLS session on a libuv stream (tls_uv.h). Plaintext is
 * encrypted in pieces of at most TLS_UV_CHUNK bytes and the ciphertext taken
 * out of the session's output BIO as it grows past that size, into buffers
 * of at most TLS_UV_CHUNK bytes handed to one uv_write (small buffers are
 * gathered first, so that they make one record): the BIO never holds
 * more than about one piece, no buffer is large enough to be an mmap of its
 * own, and records leave in the order the session made them. */
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "tls/tls_uv.h"

#define TLS_UV_CHUNK (64u << 10)
/* What fits in one TLS record (2^14 bytes of plaintext). */
#define TLS_UV_GATHER (16u << 10)

struct tls_wr {
    uv_write_t wr;
    uv_write_t *user; /* NULL: a flush */
    uv_write_cb cb;
    unsigned n, cap;
    uv_buf_t *bufs;
};

static void tls_wr_free(struct tls_wr *w)
{
    for (unsigned i = 0; i < w->n; i++)
        tk_free(w->bufs[i].base);
    tk_free(w->bufs);
    tk_free(w);
}

static void on_cipher_written(uv_write_t *wr, int status)
{
    struct tls_wr *w = (struct tls_wr *)wr;
    uv_write_t *user = w->user;
    uv_write_cb cb = w->cb;
    uv_stream_t *s = wr->handle;
    tls_wr_free(w);
    if (user != NULL) {
        user->handle = s;
        cb(user, status);
    }
}

/* Moves the session's pending ciphertext into w's buffers: all of it, or
 * (not `all`) only whole chunks. */
static void take(struct tk_tls *t, struct tls_wr *w, bool all)
{
    size_t pend;
    while ((pend = tk_tls_out_pending(t)) >= (all ? 1 : TLS_UV_CHUNK)) {
        if (w->n == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 4;
            w->bufs = tk_realloc(w->bufs, w->cap * sizeof(*w->bufs));
        }
        size_t sz = pend < TLS_UV_CHUNK ? pend : TLS_UV_CHUNK;
        char *b = tk_malloc(sz);
        w->bufs[w->n++] = uv_buf_init(b, (unsigned)tk_tls_out_take(t, b, sz));
    }
}

static int write_out(struct tls_wr *w, uv_stream_t *s)
{
    if (w->n == 0) {
        /* Nothing to send (a flush with nothing pending is not written). */
        w->bufs = tk_malloc(sizeof(*w->bufs));
        w->bufs[0] = uv_buf_init(NULL, 0);
        w->n = 1;
    }
    if (uv_write(&w->wr, s, w->bufs, w->n, on_cipher_written) != 0) {
        tls_wr_free(w);
        return TK_EIO;
    }
    return 0;
}

/* Encrypts plain[0..len) in pieces of at most TLS_UV_CHUNK, moving whole
 * chunks of ciphertext into w as they appear. */
static int seal(struct tk_tls *t, struct tls_wr *w, const char *plain, size_t len)
{
    for (size_t off = 0; off < len; off += TLS_UV_CHUNK) {
        size_t n = len - off;
        int rc = tk_tls_write(t, plain + off, n < TLS_UV_CHUNK ? n : TLS_UV_CHUNK);
        if (rc != 0)
            return rc;
        take(t, w, false);
    }
    return 0;
}

int tk_tls_uv_write(struct tk_tls *t, uv_stream_t *s, const uv_buf_t *bufs, unsigned n,
                    uv_write_t *req, uv_write_cb cb)
{
    struct tls_wr *w = tk_calloc(1, sizeof(*w));
    w->user = req;
    w->cb = cb;
    /* Small buffers (an HTTP head and its body, a batch of small answers)
     * are gathered into one record: each record costs a seal, 22 bytes and,
     * on the other side, an open, whatever its size. */
    char gather[TLS_UV_GATHER];
    size_t g = 0;
    int rc = 0;
    for (unsigned i = 0; i < n && rc == 0; i++) {
        size_t len = bufs[i].len;
        if (g + len <= sizeof(gather)) {
            memcpy(gather + g, bufs[i].base, len);
            g += len;
            continue;
        }
        rc = seal(t, w, gather, g);
        g = 0;
        if (rc == 0 && len <= sizeof(gather)) {
            memcpy(gather, bufs[i].base, len);
            g = len;
        } else if (rc == 0) {
            rc = seal(t, w, bufs[i].base, len);
        }
    }
    if (rc == 0)
        rc = seal(t, w, gather, g);
    if (rc != 0) {
        tls_wr_free(w);
        return rc;
    }
    take(t, w, true);
    return write_out(w, s);
}

int tk_tls_uv_flush(struct tk_tls *t, uv_stream_t *s)
{
    if (tk_tls_out_pending(t) == 0)
        return 0;
    struct tls_wr *w = tk_calloc(1, sizeof(*w));
    take(t, w, true);
    return write_out(w, s);
}

bool tk_tls_uv_peer_addr(const uv_tcp_t *tcp, uint8_t out[16], uint8_t *len)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &n) != 0)
        return false;
    if (ss.ss_family == AF_INET) {
        *len = 4;
        memcpy(out, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else {
        *len = 16;
        memcpy(out, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    }
    return true;
}
