/* The gateway's byte helpers (json.c): a growable buffer that writes JSON,
 * the UTF-8 check, base64, percent-decoding and FNV-1a. Pure functions over
 * caller memory; callable from any thread. Used by http.c (error bodies) and
 * the api*.c files; json.c itself calls nothing in the gateway. */
#ifndef TK_GATEWAY_JSON_H
#define TK_GATEWAY_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base64.h" /* tk_base64_*: values and keys with encoding=base64 */

/* A growable byte buffer; aborts on out of memory (tk_realloc). */
struct jbuf {
    char *p;
    size_t len;
    size_t cap;
    char *fixed; /* jbuf_init_on's buffer (the caller's), or NULL */
};

void jbuf_init(struct jbuf *b, size_t cap);
/* Starts on the caller's `buf` (borrowed: it must outlive b), moving to the
 * heap only if the bytes outgrow it; jbuf_free frees only the heap's. */
void jbuf_init_on(struct jbuf *b, char *buf, size_t cap);
/* The decimal digits of v (at most JSON_U64_MAX bytes, no NUL) into out;
 * returns their count. */
#define JSON_U64_MAX 20
size_t json_u64(char *out, uint64_t v);
void jbuf_u64(struct jbuf *b, uint64_t v);
void jbuf_free(struct jbuf *b);
void jbuf_reserve(struct jbuf *b, size_t extra);
void jbuf_add(struct jbuf *b, const void *p, size_t len);
void jbuf_adds(struct jbuf *b, const char *s);
void jbuf_printf(struct jbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A JSON string literal (quotes included) of valid UTF-8 bytes `s`. */
void jbuf_jstr(struct jbuf *b, const void *s, size_t len);
/* A JSON string literal holding the base64 of `s`. */
void jbuf_jb64(struct jbuf *b, const void *s, size_t len);

/* True if `s` is well-formed UTF-8 (no overlongs, surrogates, > U+10FFFF). */
bool json_utf8_valid(const void *s, size_t len);

/* Percent-decodes `len` bytes into dst (at least len bytes); '+' stays '+'
 * unless plus_space. Returns TK_EINVAL on a bad escape. */
int pct_decode(const char *src, size_t len, uint8_t *dst, size_t *out_len,
               bool plus_space);

#endif
