/* Standard base64 with padding: see base64.h. Decoding rejects anything but
 * the 64 characters, '=' only in the last group's last two places, and data
 * after padding, so one byte string has one accepted encoding. */
#include "base/base64.h"

#include "base/err.h"

static const char b64chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t tk_base64_encoded_len(size_t len)
{
    return (len + 2) / 3 * 4;
}

size_t tk_base64_encode(const void *src, size_t len, char *dst)
{
    const uint8_t *s = src;
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        dst[o++] = b64chars[v >> 18];
        dst[o++] = b64chars[(v >> 12) & 63];
        dst[o++] = b64chars[(v >> 6) & 63];
        dst[o++] = b64chars[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)s[i + 1] << 8;
        dst[o++] = b64chars[v >> 18];
        dst[o++] = b64chars[(v >> 12) & 63];
        dst[o++] = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
        dst[o++] = '=';
    }
    dst[o] = '\0';
    return o;
}

size_t tk_base64_decoded_max(size_t len)
{
    return len / 4 * 3 + 3;
}

static int b64val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long tk_base64_decode(const char *src, size_t len, uint8_t *dst, size_t cap)
{
    if (len % 4 != 0)
        return TK_EINVAL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            char c = src[i + (size_t)j];
            if (c == '=') {
                /* Padding only in the last group's last two places. */
                if (i + 4 != len || j < 2)
                    return TK_EINVAL;
                v[j] = 0;
                pad++;
                continue;
            }
            if (pad > 0) /* data after padding */
                return TK_EINVAL;
            v[j] = b64val(c);
            if (v[j] < 0)
                return TK_EINVAL;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        size_t n = (size_t)(3 - pad);
        if (o + n > cap)
            return TK_ETOOBIG;
        dst[o++] = (uint8_t)(w >> 16);
        if (n > 1)
            dst[o++] = (uint8_t)(w >> 8);
        if (n > 2)
            dst[o++] = (uint8_t)w;
    }
    return (long)o;
}
