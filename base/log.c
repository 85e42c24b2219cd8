/* Leveled logfmt logging.
 *
 * A line is built in a stack buffer and handed out whole: to stderr with one
 * write(2), or to the sink set by tk_log_set_sink or tk_log_set_line_cb (at
 * most one of the two is set). Layout:
 *   ts=<UTC, ms> level=<name> node=<id|-> term=<n|-> msg="<escaped>" [kv]\n
 * The msg is quoted with logfmt escapes (\" \\ \n \r \t, other control bytes
 * as \u00XX); a line longer than TK_LOG_LINE_MAX is cut, but the msg quote is
 * always closed and the line always ends with a newline. The level is an
 * atomic so TK_LOG can test it from any thread without a lock. */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"

static atomic_int log_level = TK_LOG_INFO;
static tk_log_sink_cb *log_sink;
static void *log_sink_data;
static tk_log_line_cb *log_line_cb;
static void *log_line_cb_data;

static const char *const level_names[] = {
    [TK_LOG_DEBUG] = "debug", [TK_LOG_INFO] = "info", [TK_LOG_WARN] = "warn",
    [TK_LOG_ERROR] = "error", [TK_LOG_OFF] = "off",
};

void tk_log_set_level(enum tk_log_level level)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum tk_log_level tk_log_get_level(void)
{
    return (enum tk_log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

int tk_log_parse_level(const char *name, enum tk_log_level *out)
{
    if (name == NULL)
        return TK_EINVAL;
    for (int i = TK_LOG_DEBUG; i <= TK_LOG_OFF; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (enum tk_log_level)i;
            return 0;
        }
    }
    return TK_EINVAL;
}

void tk_log_set_sink(tk_log_sink_cb *sink, void *data)
{
    log_line_cb = NULL;
    log_line_cb_data = NULL;
    log_sink = sink;
    log_sink_data = data;
}

void tk_log_set_line_cb(tk_log_line_cb *cb, void *data)
{
    log_sink = NULL;
    log_sink_data = NULL;
    log_line_cb = cb;
    log_line_cb_data = data;
}

/* A bounded line under construction. `cap` excludes room kept back for the
 * closing quote and the newline, so those can always be written. */
struct line {
    char buf[TK_LOG_LINE_MAX];
    size_t len;
    size_t cap;
};

static void line_put(struct line *l, const char *s, size_t n)
{
    if (n > l->cap - l->len)
        n = l->cap - l->len;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void line_puts(struct line *l, const char *s)
{
    line_put(l, s, strlen(s));
}

static void line_put_id(struct line *l, const char *key, uint64_t v)
{
    char tmp[48];
    int n = v == 0 ? snprintf(tmp, sizeof(tmp), " %s=-", key)
                   : snprintf(tmp, sizeof(tmp), " %s=%llu", key, (unsigned long long)v);
    line_put(l, tmp, (size_t)n);
}

/* Appends `s` escaped, never splitting an escape sequence. */
static void line_put_escaped(struct line *l, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 2;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            if (c < 0x20 || c == 0x7f) {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 0xf];
                elen = 6;
            } else {
                esc[0] = (char)c;
                elen = 1;
            }
            break;
        }
        if (elen > l->cap - l->len)
            return;
        memcpy(l->buf + l->len, esc, elen);
        l->len += elen;
    }
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* Nowhere left to report a failing stderr. */
        }
        buf += n;
        len -= (size_t)n;
    }
}

void tk_logf(enum tk_log_level level, uint64_t node_id, uint64_t term, const char *kv,
             const char *fmt, ...)
{
    /* Also catches out-of-range values cast into the enum. */
    if ((unsigned)level >= TK_LOG_OFF || level < tk_log_get_level())
        return;

    struct line l;
    l.len = 0;
    l.cap = sizeof(l.buf) - 2; /* closing quote + newline */

    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char tmp[96];
    int n = snprintf(tmp, sizeof(tmp), "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, level_names[level]);
    line_put(&l, tmp, (size_t)n);
    line_put_id(&l, "node", node_id);
    line_put_id(&l, "term", term);
    line_puts(&l, " msg=\"");

    char msg[TK_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int mlen = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (mlen < 0)
        mlen = 0;
    if ((size_t)mlen >= sizeof(msg))
        mlen = (int)sizeof(msg) - 1;
    line_put_escaped(&l, msg, (size_t)mlen);

    l.cap += 2;
    l.buf[l.len++] = '"';
    if (kv != NULL && kv[0] != '\0') {
        l.cap -= 1; /* keep the newline */
        line_puts(&l, " ");
        line_puts(&l, kv);
        l.cap += 1;
    }
    l.buf[l.len++] = '\n';

    tk_log_line_cb *line_cb = log_line_cb;
    if (line_cb != NULL) {
        l.buf[l.len - 1] = '\0'; /* the newline */
        line_cb(level, l.buf, l.len - 1, log_line_cb_data);
        return;
    }
    tk_log_sink_cb *sink = log_sink;
    if (sink != NULL)
        sink(l.buf, l.len, log_sink_data);
    else
        write_all(STDERR_FILENO, l.buf, l.len);
}
