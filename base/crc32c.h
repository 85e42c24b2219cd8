/* CRC32C (Castagnoli), through ISA-L's PCLMUL-folded crc32_iscsi.
 *
 * tk_crc32c(0, "123456789", 9) == 0xE3069283 (the standard check value).
 * Incremental: tk_crc32c(tk_crc32c(0, a, n), b, m) == CRC of a||b. */
#ifndef TK_BASE_CRC32C_H
#define TK_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t tk_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
