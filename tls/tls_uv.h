/* A TLS session (tls.h) on a libuv stream: the write side, shared by the
 * gateway, the bench and the Raft transport. The read side stays with each
 * user (on_read: tk_tls_feed, then tk_tls_read until it returns 0), because
 * where the plaintext goes is theirs. Loop thread only. */
#ifndef TK_TLS_TLS_UV_H
#define TK_TLS_TLS_UV_H

#include <uv.h>

#include "tls/tls.h"

/* Encrypts bufs[0..n) and writes the ciphertext (after anything the session
 * had pending) to `s`; `cb(req, status)` runs when it is out or failed, with
 * req->handle set to `s`, as after uv_write. Returns 0, TK_EPROTO (the
 * session failed: see tk_tls_error) or TK_EIO (the stream refused the write);
 * cb never runs then. */
int tk_tls_uv_write(struct tk_tls *t, uv_stream_t *s, const uv_buf_t *bufs, unsigned n,
                    uv_write_t *req, uv_write_cb cb);

/* The peer address of a TCP handle as the handshake caps count it (the
 * HTTPS gateway's and the etcd API's, per client address): 4 bytes (IPv4)
 * or 16 (IPv6) into out, their count into *len. False when the peer has no
 * address (the connection is gone). */
bool tk_tls_uv_peer_addr(const uv_tcp_t *tcp, uint8_t out[16], uint8_t *len);

/* Writes whatever ciphertext the session has pending (handshake records,
 * alerts, close_notify); nothing is reported back. Returns 0 or TK_EIO. */
int tk_tls_uv_flush(struct tk_tls *t, uv_stream_t *s);

#endif
