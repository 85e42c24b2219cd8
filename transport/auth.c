/* Peer authentication for the TCP handshake: the HMAC-SHA256 proofs of a
 * shared cluster token, the nonces (OpenSSL's CSPRNG) and a constant-time
 * compare. The only file of transport/ that knows OpenSSL.
 *
 * A proof is HMAC-SHA256(token, "tierkv-peer-auth-v2" | label | cluster id |
 * dialer id | acceptor id | dialer nonce | acceptor nonce), integers as u64
 * little-endian, the label one byte: 'A' for the acceptor's proof, 'D' for the
 * dialer's. Each side's proof covers the other side's fresh nonce, so a proof
 * recorded from one handshake is worth nothing in another, and the labels keep
 * an acceptor's proof from being reflected back as a dialer's. Called by tcp.c
 * on the loop thread (and by the tests); no state. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "base/endian.h"
#include "base/err.h"
#include "transport/transport_internal.h"

#define AUTH_CONTEXT "tierkv-peer-auth-v2"

int auth__nonce(uint8_t *out)
{
    return RAND_bytes(out, FRAME_NONCE_BYTES) == 1 ? 0 : TK_EIO;
}

int auth__proof(const uint8_t *token, size_t token_len, uint8_t label, uint64_t cluster,
                uint64_t dialer, uint64_t acceptor, const uint8_t *nonce_dialer,
                const uint8_t *nonce_acceptor, uint8_t *out)
{
    uint8_t msg[sizeof(AUTH_CONTEXT) + 24 + 2 * FRAME_NONCE_BYTES];
    size_t n = sizeof(AUTH_CONTEXT) - 1;
    memcpy(msg, AUTH_CONTEXT, n);
    msg[n++] = label;
    tk_put_le64(msg + n, cluster);
    tk_put_le64(msg + n + 8, dialer);
    tk_put_le64(msg + n + 16, acceptor);
    n += 24;
    memcpy(msg + n, nonce_dialer, FRAME_NONCE_BYTES);
    memcpy(msg + n + FRAME_NONCE_BYTES, nonce_acceptor, FRAME_NONCE_BYTES);
    n += 2 * FRAME_NONCE_BYTES;
    unsigned int len = FRAME_PROOF_BYTES;
    if (HMAC(EVP_sha256(), token, (int)token_len, msg, n, out, &len) == NULL ||
        len != FRAME_PROOF_BYTES)
        return TK_EIO;
    return 0;
}

bool auth__equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}
