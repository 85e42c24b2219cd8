/* Little- and big-endian stores and loads of u16, u32 and u64 at any
 * alignment: tk_put_<order><bits>(buf, v) writes, tk_get_<order><bits>(buf)
 * reads.
 *
 * The only copy for every module that lays out bytes by hand (the raft config
 * payload, transport frames, the HELLO body, store records, kv snapshots,
 * backups, cold keys and lease records); the structure test fails on a second
 * definition outside base/. Header-only, static inline:
 * compilers turn each into one load or store (plus a byte swap on big-endian
 * hosts). The callers check lengths before calling; these never do. */
#ifndef TK_BASE_ENDIAN_H
#define TK_BASE_ENDIAN_H

#include <stdint.h>
#include <string.h>

static inline void tk_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void tk_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void tk_put_le64(uint8_t *p, uint64_t v)
{
    tk_put_le32(p, (uint32_t)v);
    tk_put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t tk_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t tk_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint64_t tk_get_le64(const uint8_t *p)
{
    return (uint64_t)tk_get_le32(p) | (uint64_t)tk_get_le32(p + 4) << 32;
}

static inline void tk_put_be16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void tk_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void tk_put_be64(uint8_t *p, uint64_t v)
{
    tk_put_be32(p, (uint32_t)(v >> 32));
    tk_put_be32(p + 4, (uint32_t)v);
}

static inline uint16_t tk_get_be16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t tk_get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           (uint32_t)p[3];
}

/* One load and, on little-endian hosts, one byte swap: kv/view.c and the cold
 * tier's scans decode several of these per key. */
static inline uint64_t tk_get_be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#elif !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
#error "base/endian.h: unknown host byte order"
#endif
    return v;
}

#endif
