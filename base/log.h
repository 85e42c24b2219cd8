/* Leveled logfmt logging.
 *
 * One line per event on stderr (or a sink set by tk_log_set_sink or
 * tk_log_set_line_cb):
 *   ts=2026-11-30T04:28:00.123Z level=info node=2 term=5 msg="became leader" k=v
 * `node` and `term` are given by the caller (0 prints as "-"). Thread-safe: a
 * line is formatted into a stack buffer (at most TK_LOG_LINE_MAX bytes, longer
 * lines are cut) and written with one write. */
#ifndef TK_BASE_LOG_H
#define TK_BASE_LOG_H

#include <stddef.h>
#include <stdint.h>

#define TK_LOG_LINE_MAX 1024

enum tk_log_level {
    TK_LOG_DEBUG = 0,
    TK_LOG_INFO = 1,
    TK_LOG_WARN = 2,
    TK_LOG_ERROR = 3,
    TK_LOG_OFF = 4,
};

/* Lines below `level` are dropped. Default TK_LOG_INFO. */
void tk_log_set_level(enum tk_log_level level);
enum tk_log_level tk_log_get_level(void);

/* Parses "debug", "info", "warn", "error", "off". Returns 0 or TK_EINVAL. */
int tk_log_parse_level(const char *name, enum tk_log_level *out);

/* Replaces the output: `sink` receives each complete line (with its newline).
 * NULL restores stderr. Not thread-safe with concurrent logging; call at start. */
typedef void tk_log_sink_cb(const char *line, size_t len, void *data);
void tk_log_set_sink(tk_log_sink_cb *sink, void *data);

/* Replaces the output as tk_log_set_sink does, for a receiver that wants the
 * line's level: `cb` gets each line without its newline, NUL-terminated
 * (line[len] == 0), on the thread that logs it (any thread; at the same time
 * from several). Clears a sink set by tk_log_set_sink, and that one clears
 * this. NULL restores stderr. Not thread-safe with concurrent logging; call
 * at start (the embedding API sets it once and switches its own receivers). */
typedef void tk_log_line_cb(enum tk_log_level level, const char *line, size_t len,
                            void *data);
void tk_log_set_line_cb(tk_log_line_cb *cb, void *data);

/* `fmt` is the msg text (quoted and escaped for logfmt); `kv`, if not NULL, is
 * appended raw after it and should already be in `k=v k2=v2` form. */
void tk_logf(enum tk_log_level level, uint64_t node_id, uint64_t term, const char *kv,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define TK_LOG(level, node, term, ...)                                                   \
    do {                                                                                 \
        if ((level) >= tk_log_get_level())                                               \
            tk_logf((level), (node), (term), NULL, __VA_ARGS__);                         \
    } while (0)

#endif
