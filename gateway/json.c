/* JSON output and the byte-level helpers of the gateway.
 *
 * Request bodies are parsed with jansson (api.c); responses are written
 * directly into a growable buffer here, which is cheaper than building a
 * jansson tree and lets a value's bytes be escaped (or base64-encoded) in one
 * pass. The UTF-8 check decides whether a stored value can be a JSON string:
 * stored bytes are arbitrary, JSON strings are not. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/err.h"
#include "gateway/json.h"

void jbuf_init(struct jbuf *b, size_t cap)
{
    b->len = 0;
    b->cap = cap ? cap : 64;
    b->p = tk_malloc(b->cap);
    b->fixed = NULL;
}

void jbuf_init_on(struct jbuf *b, char *buf, size_t cap)
{
    TK_ASSERT(cap > 0);
    b->len = 0;
    b->cap = cap;
    b->p = buf;
    b->fixed = buf;
}

void jbuf_free(struct jbuf *b)
{
    if (b->p != b->fixed)
        tk_free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void jbuf_reserve(struct jbuf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra)
        cap *= 2;
    if (b->p != NULL && b->p == b->fixed) {
        char *p = tk_malloc(cap);
        memcpy(p, b->p, b->len);
        b->p = p;
    } else {
        b->p = tk_realloc(b->p, cap);
    }
    b->cap = cap;
}

size_t json_u64(char *out, uint64_t v)
{
    char t[JSON_U64_MAX];
    size_t n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++)
        out[i] = t[n - 1 - i];
    return n;
}

void jbuf_u64(struct jbuf *b, uint64_t v)
{
    jbuf_reserve(b, JSON_U64_MAX);
    b->len += json_u64(b->p + b->len, v);
}

void jbuf_add(struct jbuf *b, const void *p, size_t len)
{
    jbuf_reserve(b, len);
    if (len > 0)
        memcpy(b->p + b->len, p, len);
    b->len += len;
}

void jbuf_adds(struct jbuf *b, const char *s)
{
    jbuf_add(b, s, strlen(s));
}

void jbuf_printf(struct jbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= b->cap - b->len) {
        jbuf_reserve(b, (size_t)n + 1);
        va_start(ap, fmt);
        (void)vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void jbuf_jstr(struct jbuf *b, const void *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = s;
    /* Worst case every byte becomes \u00XX. */
    jbuf_reserve(b, len * 6 + 2);
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        uint8_t c = p[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c >= 0x20) {
            *o++ = (char)c;
        } else if (c == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (c == '\r') {
            *o++ = '\\';
            *o++ = 'r';
        } else if (c == '\t') {
            *o++ = '\\';
            *o++ = 't';
        } else {
            memcpy(o, "\\u00", 4);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            o += 6;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
}

void jbuf_jb64(struct jbuf *b, const void *s, size_t len)
{
    size_t n = tk_base64_encoded_len(len);
    jbuf_reserve(b, n + 3); /* the quotes and tk_base64_encode's NUL */
    b->p[b->len++] = '"';
    tk_base64_encode(s, len, b->p + b->len);
    b->len += n;
    b->p[b->len++] = '"';
}

/* ---- UTF-8 ------------------------------------------------------------- */

bool json_utf8_valid(const void *s, size_t len)
{
    const uint8_t *p = s, *end = p + len;
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            n = 2;
            cp = c & 0x1f;
            min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 3;
            cp = c & 0x0f;
            min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            n = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return false;
        }
        if ((size_t)(end - p) < n)
            return false;
        for (size_t i = 1; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += n;
    }
    return true;
}

/* ---- URLs and hashing -------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int pct_decode(const char *src, size_t len, uint8_t *dst, size_t *out_len,
               bool plus_space)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '%') {
            if (i + 2 >= len)
                return TK_EINVAL;
            int h = hexval(src[i + 1]), l = hexval(src[i + 2]);
            if (h < 0 || l < 0)
                return TK_EINVAL;
            dst[o++] = (uint8_t)(h << 4 | l);
            i += 2;
        } else if (c == '+' && plus_space) {
            dst[o++] = ' ';
        } else {
            dst[o++] = (uint8_t)c;
        }
    }
    *out_len = o;
    return 0;
}
