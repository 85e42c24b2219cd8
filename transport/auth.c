/* Peer authentication for the TCP handshake: the HMAC-SHA256 proofs of a
 * shared cluster token, the nonces (OpenSSL's CSPRNG) and a constant-time
 * compare. The only file of transport/ that knows OpenSSL.
 *
 * A proof is HMAC-SHA256(token, "tierkv-peer-auth-v4" | label | the dialer's
 * HELLO body | the acceptor's HELLO body), each body exactly as it went over
 * the wire (FRAME_HELLO_BYTES) with its proof field taken as zeros. The two
 * bodies hold every field either side said: the magic, the version, the
 * flags, the cluster id, both node ids, both incarnations and both fresh
 * nonces. So a proof is worth nothing in another handshake (each side's nonce
 * is new), and no field can be changed on the way without the proof failing.
 * The label says whose proof it is and what it answers: 'A' the acceptor's
 * HELLO, 'D' the dialer's AUTH, 'W' the acceptor's WELCOME, 'R' its REFUSE,
 * so that no proof can be reflected back as another. Called by tcp.c on the
 * loop thread (and by the tests); no state. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "base/err.h"
#include "transport/transport_internal.h"

#define AUTH_CONTEXT "tierkv-peer-auth-v4"

int auth__nonce(uint8_t *out)
{
    return RAND_bytes(out, FRAME_NONCE_BYTES) == 1 ? 0 : TK_EIO;
}

int auth__proof(const uint8_t *token, size_t token_len, uint8_t label,
                const uint8_t *hello_d, const uint8_t *hello_a, uint8_t *out)
{
    uint8_t msg[sizeof(AUTH_CONTEXT) + 2 * FRAME_HELLO_BYTES];
    size_t n = sizeof(AUTH_CONTEXT) - 1;
    memcpy(msg, AUTH_CONTEXT, n);
    msg[n++] = label;
    memcpy(msg + n, hello_d, FRAME_HELLO_BYTES);
    memset(msg + n + FRAME_HELLO_PROOF_OFF, 0, FRAME_PROOF_BYTES);
    n += FRAME_HELLO_BYTES;
    memcpy(msg + n, hello_a, FRAME_HELLO_BYTES);
    memset(msg + n + FRAME_HELLO_PROOF_OFF, 0, FRAME_PROOF_BYTES);
    n += FRAME_HELLO_BYTES;
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
