/* --log-format json: base/log.c's logfmt lines rewritten as JSON objects,
 * one per line, on stderr. */
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "base/log.h"
#include "cmd/tierkvd/tierkvd.h"

static void json_str(char **o, char *end, const char *s, size_t len)
{
    char *p = *o;
    if (p < end)
        *p++ = '"';
    for (size_t i = 0; i < len && p + 7 < end; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *p++ = '\\';
            *p++ = (char)c;
        } else if (c < 0x20) {
            p += snprintf(p, (size_t)(end - p), "\\u%04x", c);
        } else {
            *p++ = (char)c;
        }
    }
    if (p < end)
        *p++ = '"';
    *o = p;
}

void tierkvd_json_sink(const char *line, size_t len, void *data)
{
    (void)data;
    char out[TK_LOG_LINE_MAX * 2 + 16];
    char *o = out, *end = out + sizeof(out) - 4;
    *o++ = '{';
    size_t i = 0;
    bool first = true;
    while (i < len && line[i] != '\n') {
        while (i < len && line[i] == ' ')
            i++;
        size_t ks = i;
        while (i < len && line[i] != '=' && line[i] != ' ' && line[i] != '\n')
            i++;
        size_t klen = i - ks;
        if (klen == 0 || i >= len || line[i] != '=') {
            while (i < len && line[i] != ' ' && line[i] != '\n')
                i++;
            continue;
        }
        i++; /* '=' */
        char val[TK_LOG_LINE_MAX];
        size_t vlen = 0;
        if (i < len && line[i] == '"') {
            i++;
            while (i < len && line[i] != '"' && vlen < sizeof(val)) {
                if (line[i] == '\\' && i + 1 < len) {
                    i++;
                    val[vlen++] = line[i] == 'n' ? '\n' : line[i];
                } else {
                    val[vlen++] = line[i];
                }
                i++;
            }
            i++;
        } else {
            while (i < len && line[i] != ' ' && line[i] != '\n' && vlen < sizeof(val))
                val[vlen++] = line[i++];
        }
        if (!first && o < end)
            *o++ = ',';
        first = false;
        json_str(&o, end, line + ks, klen);
        if (o < end)
            *o++ = ':';
        json_str(&o, end, val, vlen);
    }
    *o++ = '}';
    *o++ = '\n';
    ssize_t w = write(STDERR_FILENO, out, (size_t)(o - out));
    (void)w;
}
