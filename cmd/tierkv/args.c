/* Pure parsing helpers of the tierkv CLI: no I/O, no globals.
 *
 * Every parser rejects bad input with TK_EINVAL instead of guessing, so a typo
 * in a flag becomes a usage error (exit 2) rather than a silently different
 * benchmark. See cli.h for each contract; tests/cli_test.c covers them. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/err.h"
#include "cmd/tierkv/cli.h"

int cli_exit_for_status(int st)
{
    if (st >= 200 && st < 300)
        return CLI_EXIT_OK;
    switch (st) {
    case 404:
        return CLI_EXIT_NOTFOUND;
    case 409:
    case 412:
        return CLI_EXIT_COMPARE;
    case 503:
        return CLI_EXIT_UNAVAILABLE;
    case 408:
    case 504:
        return CLI_EXIT_TIMEOUT;
    default:
        break;
    }
    if (st >= 400 && st < 500)
        return CLI_EXIT_REJECTED;
    return CLI_EXIT_ERROR;
}

static int parse_port(const char *s, size_t len, char out[8])
{
    if (len == 0 || len > 5)
        return TK_EINVAL;
    unsigned long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return TK_EINVAL;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v == 0 || v > 65535)
        return TK_EINVAL;
    memcpy(out, s, len);
    out[len] = '\0';
    return 0;
}

/* Parses exactly s[0..len). */
static int parse_hostport_n(const char *s, size_t len, struct cli_endpoint *ep)
{
    if (len >= 7 && strncasecmp(s, "http://", 7) == 0) {
        s += 7;
        len -= 7;
    } else if (len >= 8 && strncasecmp(s, "https://", 8) == 0) {
        s += 8; /* TLS is the process's choice (main.c), not the endpoint's */
        len -= 8;
    }
    const char *slash = memchr(s, '/', len);
    if (slash)
        len = (size_t)(slash - s);
    const char *host = s;
    size_t host_len;
    const char *port;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close || close + 1 >= s + len || close[1] != ':')
            return TK_EINVAL;
        host = s + 1;
        host_len = (size_t)(close - host);
        port = close + 2;
    } else {
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (s[i] == ':') {
                if (colon)
                    return TK_EINVAL; /* a bare IPv6 address needs brackets */
                colon = s + i;
            }
        if (!colon)
            return TK_EINVAL;
        host_len = (size_t)(colon - s);
        port = colon + 1;
    }
    if (host_len == 0 || host_len >= CLI_HOST_MAX)
        return TK_EINVAL;
    for (size_t i = 0; i < host_len; i++)
        if (!isgraph((unsigned char)host[i]) || host[i] == ',' || host[i] == '@')
            return TK_EINVAL;
    int rc = parse_port(port, (size_t)(s + len - port), ep->port);
    if (rc != 0)
        return rc;
    memcpy(ep->host, host, host_len);
    ep->host[host_len] = '\0';
    return 0;
}

int cli_parse_hostport(const char *s, struct cli_endpoint *ep)
{
    return parse_hostport_n(s, strlen(s), ep);
}

int cli_parse_endpoints(const char *s, struct cli_endpoint *eps, size_t cap, size_t *n)
{
    size_t count = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len > 0 && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)p[len - 1]))
            len--;
        if (len == 0 || count == cap)
            return TK_EINVAL;
        int rc = parse_hostport_n(p, len, &eps[count]);
        if (rc != 0)
            return rc;
        count++;
        if (!comma)
            break;
        p = comma + 1;
    }
    *n = count;
    return 0;
}

int cli_parse_leader_hint(const char *hint, struct cli_endpoint *ep)
{
    while (isspace((unsigned char)*hint))
        hint++;
    size_t len = strlen(hint);
    while (len > 0 && isspace((unsigned char)hint[len - 1]))
        len--;
    if (len == 0)
        return TK_ENOTFOUND;
    /* "id=1,http=host:port,raft=host:port" (or ';' / ' ' separated). */
    const char *h = strstr(hint, "http=");
    if (h && (h == hint || h[-1] == ',' || h[-1] == ';' || h[-1] == ' ')) {
        h += 5;
        size_t n = strcspn(h, ",; ");
        return parse_hostport_n(h, n, ep);
    }
    /* A bare node id names no address. */
    size_t digits = 0;
    while (digits < len && isdigit((unsigned char)hint[digits]))
        digits++;
    if (digits == len)
        return TK_ENOTFOUND;
    /* "2@host:port" or "2=host:port". */
    if (digits > 0 && (hint[digits] == '@' || hint[digits] == '=')) {
        hint += digits + 1;
        len -= digits + 1;
    }
    return parse_hostport_n(hint, len, ep);
}

int cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return TK_EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return TK_EINVAL;
    *out = v;
    return 0;
}

int cli_parse_i64(const char *s, int64_t *out)
{
    if (!s || *s == '\0' || isspace((unsigned char)s[0]))
        return TK_EINVAL;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return TK_EINVAL;
    *out = v;
    return 0;
}

/* A non-negative decimal with an optional fraction; `*rest` is the unit. */
static int parse_number(const char *s, double *v, const char **rest)
{
    if (!isdigit((unsigned char)s[0]) && s[0] != '.')
        return TK_EINVAL;
    errno = 0;
    char *end;
    double d = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(d) || d < 0)
        return TK_EINVAL;
    *v = d;
    *rest = end;
    return 0;
}

int cli_parse_duration_ms(const char *s, uint64_t *ms)
{
    double v;
    const char *unit;
    if (parse_number(s, &v, &unit) != 0)
        return TK_EINVAL;
    double mult;
    if (*unit == '\0' || strcmp(unit, "s") == 0)
        mult = 1000;
    else if (strcmp(unit, "ms") == 0)
        mult = 1;
    else if (strcmp(unit, "m") == 0 || strcmp(unit, "min") == 0)
        mult = 60000;
    else
        return TK_EINVAL;
    double r = v * mult;
    if (r < 1 || r > 86400.0 * 1000)
        return TK_EINVAL;
    *ms = (uint64_t)llround(r);
    return 0;
}

int cli_parse_size(const char *s, uint64_t *bytes)
{
    double v;
    const char *unit;
    if (parse_number(s, &v, &unit) != 0)
        return TK_EINVAL;
    double mult;
    if (*unit == '\0' || strcasecmp(unit, "b") == 0)
        mult = 1;
    else if (strcasecmp(unit, "k") == 0 || strcasecmp(unit, "kib") == 0 ||
             strcasecmp(unit, "kb") == 0)
        mult = 1024;
    else if (strcasecmp(unit, "m") == 0 || strcasecmp(unit, "mib") == 0 ||
             strcasecmp(unit, "mb") == 0)
        mult = 1024.0 * 1024;
    else
        return TK_EINVAL;
    double r = v * mult;
    if (r > (double)(1ull << 40) || r != floor(r))
        return TK_EINVAL;
    *bytes = (uint64_t)r;
    return 0;
}

int cli_parse_mix(const char *s, double *read_fraction)
{
    if (strcasecmp(s, "read") == 0 || strcasecmp(s, "get") == 0) {
        *read_fraction = 1;
        return 0;
    }
    if (strcasecmp(s, "write") == 0 || strcasecmp(s, "put") == 0) {
        *read_fraction = 0;
        return 0;
    }
    const char *colon = strchr(s, ':');
    if (!colon)
        return TK_EINVAL;
    double r, w;
    const char *rest;
    if (parse_number(s, &r, &rest) != 0 || rest != colon)
        return TK_EINVAL;
    if (parse_number(colon + 1, &w, &rest) != 0 || *rest != '\0')
        return TK_EINVAL;
    if (r + w <= 0)
        return TK_EINVAL;
    *read_fraction = r / (r + w);
    return 0;
}

int cli_parse_dist(const char *s, enum cli_dist *dist, double *theta)
{
    if (strcasecmp(s, "uniform") == 0) {
        *dist = CLI_DIST_UNIFORM;
        return 0;
    }
    if (strncasecmp(s, "zipf", 4) != 0)
        return TK_EINVAL;
    if (s[4] == '\0') {
        *dist = CLI_DIST_ZIPF;
        *theta = 0.99;
        return 0;
    }
    if (s[4] != ':')
        return TK_EINVAL;
    double t;
    const char *rest;
    if (parse_number(s + 5, &t, &rest) != 0 || *rest != '\0' || t <= 0 || t >= 1)
        return TK_EINVAL;
    *dist = CLI_DIST_ZIPF;
    *theta = t;
    return 0;
}

static double zeta(uint64_t n, double theta)
{
    double sum = 0;
    for (uint64_t i = 1; i <= n; i++)
        sum += 1.0 / pow((double)i, theta);
    return sum;
}

int cli_zipf_init(struct cli_zipf *z, uint64_t n, double theta)
{
    if (n == 0 || n > 100000000 || !(theta > 0 && theta < 1))
        return TK_EINVAL;
    z->n = n;
    z->theta = theta;
    z->zetan = zeta(n, theta);
    double zeta2 = zeta(2, theta);
    z->alpha = 1.0 / (1.0 - theta);
    z->eta = (1 - pow(2.0 / (double)n, 1 - theta)) / (1 - zeta2 / z->zetan);
    z->half_pow_theta = 1 + pow(0.5, theta);
    return 0;
}

uint64_t cli_zipf_next(const struct cli_zipf *z, struct tk_prng *p)
{
    double u = tk_prng_double(p);
    double uz = u * z->zetan;
    if (uz < 1.0 || z->n == 1)
        return 0;
    if (uz < z->half_pow_theta)
        return 1;
    uint64_t r = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1, z->alpha));
    return r < z->n ? r : z->n - 1;
}

size_t cli_url_encode(const void *src, size_t len, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *s = src;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
            if (o + 1 < cap)
                out[o] = (char)c;
            o++;
        } else {
            if (o + 3 < cap) {
                out[o] = '%';
                out[o + 1] = hex[c >> 4];
                out[o + 2] = hex[c & 15];
            }
            o += 3;
        }
    }
    if (cap > 0)
        out[o < cap ? o : cap - 1] = '\0';
    return o;
}
