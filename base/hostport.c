/* host:port splitting: see hostport.h. */
#include "base/hostport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int tk_hostport_split(const char *s, char *host, size_t cap, uint16_t *port)
{
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL || rb[1] != ':')
            return TK_EINVAL;
        h = s + 1;
        hlen = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL)
            return TK_EINVAL;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= cap)
        return TK_EINVAL;
    const char *digits = colon + 1;
    if (*digits < '0' || *digits > '9') /* strtoul would take a sign or space */
        return TK_EINVAL;
    char *end;
    errno = 0;
    unsigned long p = strtoul(digits, &end, 10);
    if (errno != 0 || *end != '\0' || p > 65535)
        return TK_EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    return 0;
}
