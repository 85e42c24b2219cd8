/* Frames: [u32 length][u32 crc32c][payload], little-endian, the HELLO body and
 * the AUTH frame.
 *
 * The parser trusts nothing: a zero or oversized length and a CRC mismatch are
 * errors returned to the caller (which closes the connection), never asserts.
 * Called by tcp.c on the loop thread and by the fuzz target; no state. */
#include <string.h>

#include "base/crc32c.h"
#include "base/endian.h"
#include "base/err.h"
#include "transport/transport_internal.h"

void frame__seal_crc(uint8_t *hdr, uint32_t len, uint32_t crc)
{
    tk_put_le32(hdr, len);
    tk_put_le32(hdr + 4, crc);
}

void frame__seal(uint8_t *hdr, const uint8_t *payload, uint32_t len)
{
    frame__seal_crc(hdr, len, tk_crc32c(0, payload, len));
}

int frame__parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                 const uint8_t **payload, uint32_t *payload_len, size_t *consumed)
{
    if (len < FRAME_HEADER_BYTES) {
        *consumed = FRAME_HEADER_BYTES;
        return 0;
    }
    uint32_t n = tk_get_le32(buf);
    if (n == 0 || n > frame_max)
        return TK_ETOOBIG;
    size_t total = FRAME_HEADER_BYTES + (size_t)n;
    *consumed = total;
    if (len < total)
        return 0;
    if (tk_crc32c(0, buf + FRAME_HEADER_BYTES, n) != tk_get_le32(buf + 4))
        return TK_ECORRUPT;
    *payload = buf + FRAME_HEADER_BYTES;
    *payload_len = n;
    return 1;
}

size_t frame__hello_write(uint8_t *out, const struct frame_hello *h)
{
    uint8_t *p = out + FRAME_HEADER_BYTES;
    p[0] = FRAME_KIND_HELLO;
    tk_put_le32(p + 1, FRAME_HELLO_MAGIC);
    tk_put_le16(p + 5, FRAME_HELLO_VERSION);
    tk_put_le16(p + 7, h->flags);
    tk_put_le64(p + 9, h->cluster_id);
    tk_put_le64(p + 17, h->node_id);
    memcpy(p + 25, h->nonce, FRAME_NONCE_BYTES);
    memcpy(p + 25 + FRAME_NONCE_BYTES, h->proof, FRAME_PROOF_BYTES);
    memcpy(p + 25 + FRAME_NONCE_BYTES + FRAME_PROOF_BYTES, h->incarnation,
           FRAME_INC_BYTES);
    frame__seal(out, p, 1 + FRAME_HELLO_BYTES);
    return FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES;
}

size_t frame__proof_write(uint8_t *out, uint8_t kind, const uint8_t *proof)
{
    uint8_t *p = out + FRAME_HEADER_BYTES;
    p[0] = kind;
    memcpy(p + 1, proof, FRAME_PROOF_BYTES);
    frame__seal(out, p, 1 + FRAME_PROOF_BYTES);
    return FRAME_HEADER_BYTES + 1 + FRAME_PROOF_BYTES;
}

int frame__hello_decode(const uint8_t *body, size_t len, struct frame_hello *out)
{
    if (len != FRAME_HELLO_BYTES)
        return TK_EPROTO;
    out->magic = tk_get_le32(body);
    out->version = tk_get_le16(body + 4);
    out->flags = tk_get_le16(body + 6);
    out->cluster_id = tk_get_le64(body + 8);
    out->node_id = tk_get_le64(body + 16);
    memcpy(out->nonce, body + 24, FRAME_NONCE_BYTES);
    memcpy(out->proof, body + 24 + FRAME_NONCE_BYTES, FRAME_PROOF_BYTES);
    memcpy(out->incarnation, body + 24 + FRAME_NONCE_BYTES + FRAME_PROOF_BYTES,
           FRAME_INC_BYTES);
    return 0;
}
