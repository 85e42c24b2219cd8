/* The write side of a TLS session on a libuv stream (tls_uv.h). Each write
 * takes all the ciphertext pending in the session into one buffer and hands
 * it to uv_write, so records leave in the order the session made them. */
#include <string.h>

#include "base/alloc.h"
#include "base/err.h"
#include "tls/tls_uv.h"

struct tls_wr {
    uv_write_t wr;
    uv_write_t *user; /* NULL: a flush */
    uv_write_cb cb;
    char data[];
};

static void on_cipher_written(uv_write_t *wr, int status)
{
    struct tls_wr *w = (struct tls_wr *)wr;
    uv_write_t *user = w->user;
    uv_write_cb cb = w->cb;
    uv_stream_t *s = wr->handle;
    tk_free(w);
    if (user != NULL) {
        user->handle = s;
        cb(user, status);
    }
}

static int write_pending(struct tk_tls *t, uv_stream_t *s, uv_write_t *req,
                         uv_write_cb cb)
{
    size_t n = tk_tls_out_pending(t);
    if (n == 0 && req == NULL)
        return 0;
    struct tls_wr *w = tk_malloc(sizeof(*w) + n);
    w->user = req;
    w->cb = cb;
    size_t got = tk_tls_out_take(t, w->data, n);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)got);
    if (uv_write(&w->wr, s, &b, 1, on_cipher_written) != 0) {
        tk_free(w);
        return TK_EIO;
    }
    return 0;
}

int tk_tls_uv_write(struct tk_tls *t, uv_stream_t *s, const uv_buf_t *bufs, unsigned n,
                    uv_write_t *req, uv_write_cb cb)
{
    for (unsigned i = 0; i < n; i++) {
        int rc = tk_tls_write(t, bufs[i].base, bufs[i].len);
        if (rc != 0)
            return rc;
    }
    return write_pending(t, s, req, cb);
}

int tk_tls_uv_flush(struct tk_tls *t, uv_stream_t *s)
{
    return write_pending(t, s, NULL, NULL);
}
