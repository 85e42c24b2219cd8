/* Standard base64 (RFC 4648 section 4: the + / alphabet, with padding).
 *
 * The only copy: the gateway decodes request bodies and encodes replies with
 * it, the CLI and its fake server the other way round. Pure functions, any
 * thread. The structure test fails on a second definition outside base/. */
#ifndef TK_BASE_BASE64_H
#define TK_BASE_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Characters tk_base64_encode writes for `len` bytes, without the NUL:
 * exactly 4 * ceil(len / 3). */
size_t tk_base64_encoded_len(size_t len);

/* Writes tk_base64_encoded_len(len) characters and a NUL to `dst`, which must
 * hold that many plus one. Returns the characters written, NUL excluded. */
size_t tk_base64_encode(const void *src, size_t len, char *dst);

/* The most bytes tk_base64_decode writes for `len` characters. */
size_t tk_base64_decoded_max(size_t len);

/* Decodes `len` characters of `src` into `dst` (room for `cap` bytes).
 * Returns the bytes written, TK_EINVAL on a bad character, bad padding or a
 * length that is not a multiple of 4, or TK_ETOOBIG when the output would
 * pass `cap`. */
long tk_base64_decode(const char *src, size_t len, uint8_t *dst, size_t cap);

#endif
