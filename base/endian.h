/* Little-endian stores and loads of u16, u32 and u64 at any alignment.
 *
 * One set for every module that lays out bytes by hand (the raft config
 * payload, transport frames and the HELLO body). Header-only, static inline:
 * compilers turn each into one load or store (plus a byte swap on big-endian
 * hosts). The callers check lengths before calling; these never do. */
#ifndef TK_BASE_ENDIAN_H
#define TK_BASE_ENDIAN_H

#include <stdint.h>

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

#endif
