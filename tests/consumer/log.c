/* The library's logging as an embedder sees it (tk_options.log_level,
 * log_cb, log_data), built against the installed tierkv.h by run.sh.
 *
 * 1. Defaults: a 3-node cluster that elects a leader and takes a write
 *    writes no line to stderr (quiet: errors only).
 * 2. TK_LOGLEVEL_INFO with a callback: the same run hands the callback info
 *    lines (so step 1 is not quiet for want of anything to say): each a
 *    logfmt line with no newline whose level= matches the level argument,
 *    and still nothing on stderr.
 * 3. TK_LOGLEVEL_OFF with the callback: never called.
 * 4. A level past TK_LOGLEVEL_OFF: TK_EINVAL.
 * stderr is caught by pointing fd 2 at a temporary file. Prints the counts. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tierkv.h"

static atomic_int lines, bad_lines, info_lines;
static int user_word = 42;

static void on_log(enum tk_loglevel level, const char *line, void *data)
{
    static const char *const names[] = {"?", "debug", "info", "warn", "error", "off"};
    char want[32];
    atomic_fetch_add(&lines, 1);
    if (level == TK_LOGLEVEL_INFO)
        atomic_fetch_add(&info_lines, 1);
    snprintf(want, sizeof(want), " level=%s ", (unsigned)level < 6 ? names[level] : "?");
    if (data != &user_word || strchr(line, '\n') != NULL || strstr(line, want) == NULL ||
        strncmp(line, "ts=", 3) != 0 || strstr(line, " msg=\"") == NULL) {
        if (atomic_fetch_add(&bad_lines, 1) == 0)
            fprintf(stdout, "log: bad line (level %d): %s\n", (int)level, line);
    }
}

/* Runs a cluster through an election and a write. Returns 0 or the error. */
static int run_cluster(const struct tk_options *o)
{
    struct tk_cluster *c;
    int rc = tk_cluster_start(3, o, &c);
    if (rc != 0)
        return rc;
    struct tk_node *leader;
    rc = tk_cluster_wait_leader(c, 20000, &leader);
    if (rc == 0)
        rc = tk_put(leader, "k", 1, "v", 1, TK_MODE_APPLIED, NULL);
    tk_cluster_stop(c);
    return rc;
}

static long file_size(FILE *f)
{
    struct stat st;
    return fstat(fileno(f), &st) != 0 ? -1 : (long)st.st_size;
}

int main(void)
{
    FILE *err = tmpfile();
    int saved = dup(2);
    if (err == NULL || saved < 0 || dup2(fileno(err), 2) < 0) {
        perror("log: catching stderr");
        return 1;
    }
    int fails = 0;
    struct tk_options o;

    tk_options_default(&o);
    if (o.log_level != TK_LOGLEVEL_DEFAULT || o.log_cb != NULL)
        fails++, printf("log: FAIL: tk_options_default sets a level or a callback\n");
    int rc = run_cluster(&o);
    long quiet_bytes = file_size(err);
    if (rc != 0 || quiet_bytes != 0)
        fails++,
            printf("log: FAIL: defaults: rc %d, %ld bytes on stderr\n", rc, quiet_bytes);

    o.log_level = TK_LOGLEVEL_INFO;
    o.log_cb = on_log;
    o.log_data = &user_word;
    rc = run_cluster(&o);
    long cb_bytes = file_size(err) - quiet_bytes;
    int info_n = atomic_load(&info_lines), all_n = atomic_load(&lines);
    if (rc != 0 || info_n == 0 || atomic_load(&bad_lines) != 0 || cb_bytes != 0)
        fails++, printf("log: FAIL: info + callback: rc %d, %d info lines of %d, %d bad, "
                        "%ld bytes on stderr\n",
                        rc, info_n, all_n, atomic_load(&bad_lines), cb_bytes);

    o.log_level = TK_LOGLEVEL_OFF;
    atomic_store(&lines, 0);
    rc = run_cluster(&o);
    if (rc != 0 || atomic_load(&lines) != 0)
        fails++, printf("log: FAIL: off: rc %d, %d lines\n", rc, atomic_load(&lines));

    o.log_level = (enum tk_loglevel)(TK_LOGLEVEL_OFF + 1);
    struct tk_cluster *c;
    rc = tk_cluster_start(3, &o, &c);
    if (rc != TK_EINVAL)
        fails++, printf("log: FAIL: a level past OFF: rc %d, not TK_EINVAL\n", rc);

    dup2(saved, 2);
    if (fails == 0)
        printf("log: ok: defaults wrote %ld bytes to stderr; at info the callback got %d "
               "lines (%d info), none on stderr; off: none; a bad level: TK_EINVAL\n",
               quiet_bytes, all_n, info_n);
    else {
        fseek(err, 0, SEEK_SET);
        char buf[512];
        size_t n = fread(buf, 1, sizeof(buf) - 1, err);
        buf[n] = 0;
        printf("log: stderr began: %s\n", buf);
    }
    return fails == 0 ? 0 : 1;
}
