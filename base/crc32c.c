/* CRC32C through ISA-L's crc32_iscsi.
 *
 * crc32_iscsi neither inverts its initial value nor its result, and it takes
 * an int length. tk_crc32c uses the conventional interface instead (as zlib's
 * crc32 does for CRC-32): start from 0, and pass the previous result to
 * continue, so the inversions are done here, and long buffers are fed in
 * chunks that fit in an int. */
#include "base/crc32c.h"

#include <isa-l/crc.h>

/* Well below INT_MAX and a multiple of 64 so ISA-L's folding stays aligned. */
#define CRC_CHUNK_BYTES ((size_t)1 << 30)

uint32_t tk_crc32c(uint32_t crc, const void *buf, size_t len)
{
    /* ISA-L takes a non-const pointer but only reads through it. */
    unsigned char *p = (unsigned char *)(uintptr_t)buf;
    unsigned int c = ~crc;
    while (len > 0) {
        size_t n = len < CRC_CHUNK_BYTES ? len : CRC_CHUNK_BYTES;
        c = crc32_iscsi(p, (int)n, c);
        p += n;
        len -= n;
    }
    return ~c;
}
