/* tierkv watch: follows GET /v1/watch and prints each event as it comes.
 *
 * It resumes by itself: a revision counts as seen once the next revision (or
 * a progress frame, asked for every second) shows that all of its events
 * came, and after a broken connection, a lagging cancellation or a node
 * that went away, it watches again from the revision after the last one seen
 * whole, on the next endpoint, dropping the events of a revision it had only
 * partly. A compacted revision ends it (exit 1): the state must be read
 * again. Runs until interrupted. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "cmd/tierkv/cli.h"

static const char watch_help[] =
    "usage: tierkv watch KEY | --prefix P | --start S [--end E]\n"
    "                    [--rev R] [--prev-kv]\n"
    "\n"
    "Prints every change of the key or range from revision R (default: from\n"
    "now on), one line each: REVISION TYPE KEY [VALUE] (with --json the\n"
    "server's JSON object). Resumes after a disconnect from the last revision\n"
    "it saw whole, on any endpoint. Exit 1 if the revision was compacted.\n";

/* The events of the revision being received, held until it is whole. */
struct pending {
    char **lines;
    size_t n, cap;
    unsigned long long rev;
};

struct watch_state {
    struct cli_global *g;
    unsigned long long next; /* resume from here */
    struct pending p;
    int exit_code;
    char msg[256];
};

static void flush_pending(struct watch_state *w)
{
    for (size_t i = 0; i < w->p.n; i++) {
        char *ln = w->p.lines[i];
        if (w->g->json) {
            puts(ln);
        } else {
            json_t *j = json_loads(ln, 0, NULL);
            const char *type = json_string_value(json_object_get(j, "type"));
            const char *key = json_string_value(json_object_get(j, "key"));
            const char *val = json_string_value(json_object_get(j, "value"));
            printf("%llu %s %s%s%s\n", w->p.rev, type ? type : "?", key ? key : "?",
                   val ? " " : "", val ? val : "");
            json_decref(j);
        }
        free(ln);
    }
    if (w->p.n > 0)
        w->next = w->p.rev + 1;
    w->p.n = 0;
    fflush(stdout);
}

static void drop_pending(struct watch_state *w)
{
    for (size_t i = 0; i < w->p.n; i++)
        free(w->p.lines[i]);
    w->p.n = 0;
}

static int on_line(int status, const char *line, size_t len, void *data)
{
    struct watch_state *w = data;
    json_t *j = json_loadb(line, len, 0, NULL);
    if (j == NULL)
        return TK_EPROTO;
    int rc = 0;
    json_t *err = json_object_get(j, "error");
    json_t *prog = json_object_get(j, "progress");
    if (status != 200 || err != NULL) {
        const char *code = json_string_value(json_object_get(err, "code"));
        if (code != NULL && strcmp(code, "lagging") == 0) {
            rc = TK_EBUSY; /* resume where it says: no event before it lost */
        } else {
            snprintf(w->msg, sizeof(w->msg), "%s", line);
            rc = code != NULL && strcmp(code, "compacted") == 0 ? TK_ECOMPACTED
                                                                : TK_EPROTO;
        }
    } else if (prog != NULL) {
        flush_pending(w);
        json_int_t r = json_integer_value(json_object_get(prog, "revision"));
        if ((unsigned long long)r + 1 > w->next)
            w->next = (unsigned long long)r + 1;
    } else {
        unsigned long long rev =
            (unsigned long long)json_integer_value(json_object_get(j, "revision"));
        if (w->p.n > 0 && rev != w->p.rev)
            flush_pending(w);
        if (w->p.n == w->p.cap) {
            w->p.cap = w->p.cap ? 2 * w->p.cap : 16;
            w->p.lines = realloc(w->p.lines, w->p.cap * sizeof(*w->p.lines));
            if (w->p.lines == NULL)
                abort();
        }
        w->p.lines[w->p.n++] = strndup(line, len);
        w->p.rev = rev;
    }
    json_decref(j);
    return rc;
}

static void path_for(struct watch_state *w, const char *range, bool prev_kv, char *out,
                     size_t cap)
{
    snprintf(out, cap, "/v1/watch?%s&progress_ms=1000%s%s", range,
             prev_kv ? "&prev_kv" : "", w->g->base64 ? "&encoding=base64" : "");
    if (w->next > 0) {
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "&start_revision=%llu", w->next);
    }
}

static int add_param(char *range, size_t cap, const char *name, const char *val)
{
    size_t n = strlen(range);
    int k = snprintf(range + n, cap - n, "%s%s=", n ? "&" : "", name);
    if (k < 0 || (size_t)k >= cap - n)
        return TK_EINVAL;
    n += (size_t)k;
    if (cli_url_encode(val, strlen(val), range + n, cap - n) >= cap - n)
        return TK_EINVAL;
    return 0;
}

static int parse_args(int argc, char **argv, char *range, size_t cap,
                      unsigned long long *rev, bool *prev_kv)
{
    static const struct option opts[] = {{"prefix", required_argument, 0, 'p'},
                                         {"start", required_argument, 0, 's'},
                                         {"end", required_argument, 0, 'E'},
                                         {"rev", required_argument, 0, 'r'},
                                         {"prev-kv", no_argument, 0, 'P'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int o, rc = 0;
    range[0] = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1 && rc == 0) {
        uint64_t v;
        if (o == 'p')
            rc = add_param(range, cap, "prefix", optarg);
        else if (o == 's')
            rc = add_param(range, cap, "start", optarg);
        else if (o == 'E')
            rc = add_param(range, cap, "end", optarg);
        else if (o == 'r') {
            rc = cli_parse_u64(optarg, 1, UINT64_MAX, &v);
            *rev = v;
        } else if (o == 'P')
            *prev_kv = true;
        else if (o == 'h')
            return 1;
        else
            return TK_EINVAL;
    }
    if (rc == 0 && optind < argc && range[0] == 0 && argc - optind == 1) {
        if (argv[optind][0] == '\0')
            return 2; /* an empty KEY: a usage error of its own */
        rc = add_param(range, cap, "key", argv[optind++]);
    }
    if (rc != 0 || optind != argc || range[0] == 0)
        return TK_EINVAL;
    return 0;
}

int cli_cmd_watch(struct cli_global *g, int argc, char **argv)
{
    char range[4096];
    unsigned long long rev = 0;
    bool prev_kv = false;
    int prc = parse_args(argc, argv, range, sizeof(range), &rev, &prev_kv);
    if (prc == 1) {
        fputs(watch_help, stdout);
        return 0;
    }
    if (prc == 2)
        return cli_check_key("watch", "");
    if (prc != 0) {
        fprintf(stderr, "tierkv: watch: wants KEY, or --prefix P, or --start S [--end E] "
                        "(see tierkv watch --help)\n");
        return CLI_EXIT_USAGE;
    }
    struct watch_state w = {.g = g, .next = rev};
    struct cli_client *c = &g->client;
    char path[8192], err[256];
    for (size_t i = c->preferred, fails = 0;; i++) {
        const struct cli_endpoint *ep = &c->eps[i % c->n_eps];
        path_for(&w, range, prev_kv, path, sizeof(path));
        int rc = cli_stream(ep, c->timeout_ms, path, NULL, on_line, &w, err, sizeof(err));
        drop_pending(&w); /* a revision not seen whole comes again */
        if (rc == TK_ECOMPACTED) {
            fprintf(stderr, "tierkv: watch: %s\n", w.msg);
            free(w.p.lines);
            return CLI_EXIT_ERROR;
        }
        if (g->client.verbose)
            fprintf(stderr, "tierkv: watch: %s; resuming at %llu\n",
                    rc == TK_EPROTO && w.msg[0] ? w.msg : err, w.next);
        fails = rc == TK_EBUSY ? 0 : fails + 1;
        struct timespec ts = {0,
                              (long)(fails > 10 ? 1000 : 100 * (long)fails) * 1000000L};
        nanosleep(&ts, NULL);
    }
}
