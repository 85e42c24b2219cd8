/* Frames: [u32 length][u32 crc32c][payload], little-endian, and the HELLO body.
 *
 * The parser trusts nothing: a zero or oversized length and a CRC mismatch are
 * errors returned to the caller (which closes the connection), never asserts.
 * Called by tcp.c on the loop thread and by the fuzz target; no state. */
#include <string.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "transport/transport_internal.h"

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

void frame__seal(uint8_t *hdr, const uint8_t *payload, uint32_t len)
{
    put_u32(hdr, len);
    put_u32(hdr + 4, tk_crc32c(0, payload, len));
}

int frame__parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                 const uint8_t **payload, uint32_t *payload_len, size_t *consumed)
{
    if (len < FRAME_HEADER_BYTES) {
        *consumed = FRAME_HEADER_BYTES;
        return 0;
    }
    uint32_t n = get_u32(buf);
    if (n == 0 || n > frame_max)
        return TK_ETOOBIG;
    size_t total = FRAME_HEADER_BYTES + (size_t)n;
    *consumed = total;
    if (len < total)
        return 0;
    if (tk_crc32c(0, buf + FRAME_HEADER_BYTES, n) != get_u32(buf + 4))
        return TK_ECORRUPT;
    *payload = buf + FRAME_HEADER_BYTES;
    *payload_len = n;
    return 1;
}

size_t frame__hello_write(uint8_t *out, uint64_t cluster_id, uint64_t node_id)
{
    uint8_t *p = out + FRAME_HEADER_BYTES;
    p[0] = FRAME_KIND_HELLO;
    put_u32(p + 1, FRAME_HELLO_MAGIC);
    put_u16(p + 5, FRAME_HELLO_VERSION);
    put_u16(p + 7, 0);
    put_u64(p + 9, cluster_id);
    put_u64(p + 17, node_id);
    frame__seal(out, p, 1 + FRAME_HELLO_BYTES);
    return FRAME_HEADER_BYTES + 1 + FRAME_HELLO_BYTES;
}

int frame__hello_decode(const uint8_t *body, size_t len, struct frame_hello *out)
{
    if (len != FRAME_HELLO_BYTES)
        return TK_EPROTO;
    out->magic = get_u32(body);
    out->version = get_u16(body + 4);
    out->flags = get_u16(body + 6);
    out->cluster_id = get_u64(body + 8);
    out->node_id = get_u64(body + 16);
    return 0;
}
