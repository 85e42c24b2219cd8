/* tierkv: the command-line client of a tierkv cluster.
 *
 * Parses the global flags (which may appear anywhere before a "--"), picks
 * the command and hands it the remaining arguments. The commands live in
 * commands.c and bench.c; docs/cli.md is the manual. Single-threaded except
 * for `bench`, which runs its own loop threads. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/secret_file.h"
#include "cmd/tierkv/cli.h"
#include "tls/tls.h"

#define CLI_DEFAULT_ENDPOINTS "127.0.0.1:8080"
/* The endpoints file `make run` writes (scripts/run-cluster.sh), relative to
 * the working directory: the repository's root after make run. */
#define CLI_ENDPOINTS_FILE "data/endpoints"
/* Longer than any list of CLI_ENDPOINTS_MAX endpoints a person writes. */
#define CLI_ENDPOINTS_FILE_MAX 4096

static const char main_help[] =
    "usage: tierkv [global flags] COMMAND [args]\n"
    "\n"
    "Commands:\n"
    "  put KEY [VALUE]      write a key (value from stdin or --file without VALUE)\n"
    "  get KEY              read a key\n"
    "  del KEY              delete a key\n"
    "  scan [PREFIX]        list keys by prefix or --start/--end range, --limit N\n"
    "  incr KEY [DELTA]     add DELTA (default 1) to an int64 counter\n"
    "  txn FILE             run a transaction from a JSON file (- for stdin)\n"
    "  batch FILE           apply an atomic batch from a JSON file\n"
    "  status               health, role, term and indexes of every endpoint\n"
    "  members              the cluster's members\n"
    "  member list|add|promote|remove   membership changes (tierkv member --help)\n"
    "  watch KEY|--prefix P follow changes as they come (tierkv watch --help)\n"
    "  snapshot save FILE   a consistent backup (GET /v1/snapshot) into FILE\n"
    "  snapshot status FILE check a backup file and show its revision and keys\n"
    "  lease grant|keepalive|revoke|get  leases (tierkv lease --help)\n"
    "  lock NAME -- CMD     run CMD holding a lease-backed lock (tierkv lock --help)\n"
    "  elect NAME VALUE     campaign for leadership, print changes of leader\n"
    "  bench                load generator for tierkvd or etcd (tierkv bench --help)\n"
    "  help [COMMAND]       this text, or a command's\n"
    "\n"
    "Global flags (anywhere on the line):\n"
    "  -e, --endpoints LIST   comma-separated host:port list, tried in order; a\n"
    "                         leader hint in a 503 or redirect is followed\n"
    "                         (else env TIERKV_ENDPOINTS, else the file\n"
    "                         ./" CLI_ENDPOINTS_FILE " that make run writes, else\n"
    "                         " CLI_DEFAULT_ENDPOINTS ")\n"
    "  --json                 print the server's JSON, one line, for scripts\n"
    "  --timeout DURATION     per request attempt (default 5s; member changes 40s)\n"
    "  --retries N            extra passes over the endpoints when none answers or\n"
    "                         all answer 503 (default 2)\n"
    "  --mode applied|committed        when a write is acknowledged\n"
    "  --consistency linearizable|stale  how reads are served\n"
    "  --base64               ask for base64 keys/values and decode them\n"
    "  -v, --verbose          log every attempt to stderr\n"
    "  --cacert FILE          HTTPS: trust the server certificates these CAs sign\n"
    "                         (PEM; env TIERKV_CACERT). HTTPS is on with any of\n"
    "                         --cacert, --cert or an https:// endpoint (then the\n"
    "                         system's CAs are trusted)\n"
    "  --cert FILE, --key FILE  HTTPS: a client certificate and its key (PEM; env\n"
    "                         TIERKV_CERT, TIERKV_KEY)\n"
    "  --token-file FILE      a bearer token for --auth-file servers, read from\n"
    "                         FILE (mode 0600 or stricter), or from the env\n"
    "                         TIERKV_TOKEN. --token TOKEN works too, but puts\n"
    "                         the token where ps shows it (warned)\n"
    "  --allow-loose-permissions[=BOOL]  accept a --token-file that group or\n"
    "                         others may read or write, with a warning (env\n"
    "                         TIERKV_ALLOW_LOOSE_PERMISSIONS; BOOL:\n"
    "                         " TK_BOOL_ACCEPTED ")\n"
    "\n"
    "Exit codes:\n"
    "  0 success\n"
    "  1 unexpected server answer or internal error\n"
    "  2 usage error: bad flags, arguments or input file\n"
    "  3 not found (404)\n"
    "  4 compare failed (409), or a txn that took its else branch\n"
    "  5 unavailable: no endpoint reachable, or no leader (503)\n"
    "  6 timed out (client timeout, 408 or 504)\n"
    "  7 rejected by the server (400, 413 and other 4xx)\n";

struct security_flags {
    const char *cacert, *cert, *key, *token, *token_file;
    bool token_on_argv, allow_loose, https_endpoint;
};

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != 0 ? v : NULL;
}

/* --token-file: the token, read from a file that only its owner may read or
 * write (base/secret_file.h), into buf. Returns 0 or CLI_EXIT_USAGE with a
 * message printed. */
static int read_token_file(const char *path, bool allow_loose, char *buf, size_t cap)
{
    char msg[TK_SECRET_MSG_MAX];
    size_t n = 0;
    int rc = tk_secret_file_read(path, allow_loose, buf, cap - 1, &n, msg, sizeof(msg));
    if (rc == TK_ETOOBIG || (rc == 0 && n == 0)) {
        fprintf(stderr,
                "tierkv: --token-file: \"%s\" must hold a token of 1 to %zu bytes\n",
                path, cap - 1);
        return CLI_EXIT_USAGE;
    }
    if (rc != 0) {
        fprintf(stderr, "tierkv: --token-file: %s\n", msg);
        return CLI_EXIT_USAGE;
    }
    if (msg[0] != 0)
        fprintf(stderr, "tierkv: warning: --token-file: %s\n", msg);
    buf[n] = 0;
    return 0;
}

/* Builds the TLS context and token the flags ask for (cli_security_set).
 * Returns 0 or CLI_EXIT_USAGE with a message printed. */
static int security_setup(const struct security_flags *f, struct tk_tls_ctx **ctx)
{
    static char token_buf[CLI_TOKEN_MAX + 1];
    struct cli_security sec = {.token = f->token};
    if (f->token_file != NULL) {
        int rc =
            read_token_file(f->token_file, f->allow_loose, token_buf, sizeof(token_buf));
        if (rc != 0)
            return rc;
        sec.token = token_buf;
    } else if (f->token_on_argv) {
        fprintf(stderr, "tierkv: warning: --token puts the token on the command line, "
                        "where ps shows it to every local user; use --token-file FILE or "
                        "TIERKV_TOKEN\n");
    }
    if (sec.token != NULL &&
        (strlen(sec.token) > CLI_TOKEN_MAX || strpbrk(sec.token, "\r\n"))) {
        fprintf(stderr, "tierkv: the token (%s): at most %d bytes, one line\n",
                f->token_file != NULL ? "--token-file"
                : f->token_on_argv    ? "--token"
                                      : "TIERKV_TOKEN",
                CLI_TOKEN_MAX);
        return CLI_EXIT_USAGE;
    }
    if (f->cacert != NULL || f->cert != NULL || f->key != NULL || f->https_endpoint) {
        struct tk_tls_ctx_config tc = {
            .cert_file = f->cert, .key_file = f->key, .ca_file = f->cacert};
        char err[TK_TLS_ERR_MAX];
        if (tk_tls_ctx_new(&tc, ctx, err, sizeof(err)) != 0) {
            fprintf(stderr, "tierkv: TLS (--cacert, --cert, --key): %s\n", err);
            return CLI_EXIT_USAGE;
        }
        sec.tls = *ctx;
    }
    cli_security_set(&sec);
    return 0;
}

/* The endpoints in ./data/endpoints (what make run writes) into buf, as one
 * comma-separated list: its lines joined, blank lines and lines starting
 * with '#' left out. The file is read only if it is a regular file of this
 * user that group and others cannot write: the endpoints get the request
 * (and any token), so a directory someone else controls must not choose
 * them. Returns true with buf filled; false if there is no such file (quiet)
 * or it is refused or unreadable (a warning says why). */
static bool endpoints_from_file(char *buf, size_t cap)
{
    int fd = open(CLI_ENDPOINTS_FILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            fprintf(stderr, "tierkv: warning: ./%s: %s (not used)\n", CLI_ENDPOINTS_FILE,
                    strerror(errno));
        return false;
    }
    bool ok = false;
    struct stat st;
    char raw[CLI_ENDPOINTS_FILE_MAX + 1];
    ssize_t n = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "tierkv: warning: ./%s is not a regular file (not used)\n",
                CLI_ENDPOINTS_FILE);
        goto out;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        fprintf(stderr,
                "tierkv: warning: ./%s is not yours alone to write (owner uid %u, mode "
                "%04o): not used\n",
                CLI_ENDPOINTS_FILE, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, raw + n, sizeof(raw) - 1 - (size_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "tierkv: warning: ./%s: %s (not used)\n", CLI_ENDPOINTS_FILE,
                    strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += r;
        if ((size_t)n == sizeof(raw) - 1) {
            fprintf(stderr, "tierkv: warning: ./%s is over %d bytes (not used)\n",
                    CLI_ENDPOINTS_FILE, CLI_ENDPOINTS_FILE_MAX);
            goto out;
        }
    }
    raw[n] = 0;
    size_t len = 0;
    for (char *line = raw, *next; line != NULL; line = next) {
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = 0;
        line += strspn(line, " \t\r");
        if (line[0] == 0 || line[0] == '#')
            continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len > 0 ? "," : "", line);
        if (w < 0 || (size_t)w >= cap - len) {
            fprintf(stderr, "tierkv: warning: ./%s is too long (not used)\n",
                    CLI_ENDPOINTS_FILE);
            goto out;
        }
        len += (size_t)w;
    }
    if (len == 0) {
        fprintf(stderr, "tierkv: warning: ./%s lists no endpoint (not used)\n",
                CLI_ENDPOINTS_FILE);
        goto out;
    }
    ok = true;
out:
    close(fd);
    return ok;
}

struct command {
    const char *name;
    int (*fn)(struct cli_global *g, int argc, char **argv);
};

static const struct command commands[] = {
    {"put", cli_cmd_put},       {"get", cli_cmd_get},
    {"del", cli_cmd_del},       {"delete", cli_cmd_del},
    {"scan", cli_cmd_scan},     {"incr", cli_cmd_incr},
    {"txn", cli_cmd_txn},       {"batch", cli_cmd_batch},
    {"status", cli_cmd_status}, {"members", cli_cmd_members},
    {"bench", cli_cmd_bench},   {"member", cli_cmd_member},
    {"watch", cli_cmd_watch},   {"snapshot", cli_cmd_snapshot},
    {"lease", cli_cmd_lease},   {"lock", cli_cmd_lock},
    {"elect", cli_cmd_elect},
};

static int usage(const char *msg)
{
    fprintf(stderr, "tierkv: %s (see tierkv --help)\n", msg);
    return CLI_EXIT_USAGE;
}

/* The value of a global flag at argv[*i]: "--flag=value" or "--flag value". */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static bool is_flag(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int main(int argc, char **argv)
{
    struct cli_global g;
    memset(&g, 0, sizeof(g));
    g.client.timeout_ms = 5000;
    g.client.retries = 2;
    /* Where the endpoints come from, first found wins: -e/--endpoints, the
     * env TIERKV_ENDPOINTS, ./data/endpoints, the built-in default (the file
     * is read only when neither of the first two is given, below). */
    const char *endpoints = env_or_null("TIERKV_ENDPOINTS");
    const char *endpoints_from = endpoints != NULL ? "TIERKV_ENDPOINTS" : NULL;
    static char file_endpoints[CLI_ENDPOINTS_FILE_MAX + 1];

    /* Pull out the global flags; keep everything else in order. */
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    if (!rest)
        return CLI_EXIT_ERROR;
    int n_rest = 0;
    bool dashdash = false;
    struct tk_tls_ctx *tls = NULL;
    struct security_flags sf = {.cacert = env_or_null("TIERKV_CACERT"),
                                .cert = env_or_null("TIERKV_CERT"),
                                .key = env_or_null("TIERKV_KEY"),
                                .token = env_or_null("TIERKV_TOKEN")};
    const char *loose = env_or_null("TIERKV_ALLOW_LOOSE_PERMISSIONS");
    if (loose != NULL && tk_parse_bool(loose, &sf.allow_loose) != 0) {
        fprintf(stderr,
                "tierkv: TIERKV_ALLOW_LOOSE_PERMISSIONS=\"%s\" is not a boolean: "
                "use " TK_BOOL_ACCEPTED "\n",
                loose);
        free(rest);
        return CLI_EXIT_USAGE;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        if (dashdash || a[0] != '-') {
            rest[n_rest++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            dashdash = true;
            rest[n_rest++] = argv[i];
            continue;
        }
        if (is_flag(a, "--endpoints") || strcmp(a, "-e") == 0) {
            v = flag_value(argc, argv, &i, a[1] == 'e' ? "-e" : "--endpoints");
            if (!v) {
                free(rest);
                return usage("--endpoints wants a value");
            }
            endpoints = v;
            endpoints_from = "--endpoints";
        } else if (is_flag(a, "--cacert") || is_flag(a, "--cert") ||
                   is_flag(a, "--key") || is_flag(a, "--token")) {
            const char *name = is_flag(a, "--cacert") ? "--cacert"
                               : is_flag(a, "--cert") ? "--cert"
                               : is_flag(a, "--key")  ? "--key"
                                                      : "--token";
            v = flag_value(argc, argv, &i, name);
            if (!v || !v[0]) {
                free(rest);
                return usage("--cacert, --cert, --key and --token want a value");
            }
            const char **slot = name[2] == 'c' && name[3] == 'a' ? &sf.cacert
                                : name[2] == 'c'                 ? &sf.cert
                                : name[2] == 'k'                 ? &sf.key
                                                                 : &sf.token;
            *slot = v;
            if (slot == &sf.token)
                sf.token_on_argv = true;
        } else if (is_flag(a, "--token-file")) {
            v = flag_value(argc, argv, &i, "--token-file");
            if (!v || !v[0]) {
                free(rest);
                return usage("--token-file wants a file");
            }
            sf.token_file = v;
        } else if (is_flag(a, "--allow-loose-permissions")) {
            const char *eq = strchr(a, '=');
            if (eq != NULL && tk_parse_bool(eq + 1, &sf.allow_loose) != 0) {
                free(rest);
                return usage("--allow-loose-permissions=BOOL: BOOL is " TK_BOOL_ACCEPTED);
            }
            if (eq == NULL)
                sf.allow_loose = true;
        } else if (strcmp(a, "--json") == 0) {
            g.json = true;
        } else if (strcmp(a, "--base64") == 0) {
            g.base64 = true;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            g.client.verbose = true;
        } else if (is_flag(a, "--timeout")) {
            uint64_t ms;
            v = flag_value(argc, argv, &i, "--timeout");
            if (!v || cli_parse_duration_ms(v, &ms) != 0 || ms > 3600000) {
                free(rest);
                return usage("--timeout wants a duration like 5s or 500ms");
            }
            g.client.timeout_ms = (int)ms;
            g.timeout_set = true;
        } else if (is_flag(a, "--retries")) {
            uint64_t n;
            v = flag_value(argc, argv, &i, "--retries");
            if (!v || cli_parse_u64(v, 0, 20, &n) != 0) {
                free(rest);
                return usage("--retries wants 0..20");
            }
            g.client.retries = (int)n;
        } else if (is_flag(a, "--mode")) {
            v = flag_value(argc, argv, &i, "--mode");
            if (!v || (strcmp(v, "applied") != 0 && strcmp(v, "committed") != 0)) {
                free(rest);
                return usage("--mode is applied or committed");
            }
            snprintf(g.mode, sizeof(g.mode), "%s", v);
        } else if (is_flag(a, "--consistency")) {
            v = flag_value(argc, argv, &i, "--consistency");
            if (!v || (strcmp(v, "linearizable") != 0 && strcmp(v, "stale") != 0)) {
                free(rest);
                return usage("--consistency is linearizable or stale");
            }
            snprintf(g.consistency, sizeof(g.consistency), "%s", v);
        } else if (n_rest == 0 && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            fputs(main_help, stdout);
            free(rest);
            return 0;
        } else if (n_rest == 0 && strcmp(a, "--version") == 0) {
            printf("tierkv 0.1.0\n");
            free(rest);
            return 0;
        } else {
            rest[n_rest++] = argv[i]; /* a command's own flag */
        }
    }
    int code;
    if (n_rest == 0) {
        fputs(main_help, stderr);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    if (strcmp(rest[0], "help") == 0) {
        if (n_rest == 1) {
            fputs(main_help, stdout);
            code = 0;
            goto out;
        }
        rest[0] = rest[1];
        rest[1] = "--help";
        n_rest = 2;
    }
    if (endpoints == NULL) {
        if (endpoints_from_file(file_endpoints, sizeof(file_endpoints))) {
            endpoints = file_endpoints;
            endpoints_from = "./" CLI_ENDPOINTS_FILE;
        } else {
            endpoints = CLI_DEFAULT_ENDPOINTS;
            endpoints_from = "the default";
        }
    }
    if (g.client.verbose)
        fprintf(stderr, "tierkv: endpoints %s (from %s)\n", endpoints, endpoints_from);
    if (cli_parse_endpoints(endpoints, g.client.eps, CLI_ENDPOINTS_MAX,
                            &g.client.n_eps) != 0) {
        fprintf(stderr,
                "tierkv: bad endpoints \"%s\" (from %s): want a comma-separated list of "
                "host:port (at most %d)\n",
                endpoints, endpoints_from, CLI_ENDPOINTS_MAX);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    if (sf.token_file != NULL && sf.token_on_argv) {
        code = usage("--token and --token-file do not go together");
        goto out;
    }
    sf.https_endpoint = strcasestr(endpoints, "https://") != NULL;
    code = security_setup(&sf, &tls);
    if (code != 0)
        goto out;
    code = -1;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(rest[0], commands[i].name) == 0) {
            code = commands[i].fn(&g, n_rest, rest);
            break;
        }
    if (code == -1) {
        fprintf(stderr, "tierkv: unknown command \"%s\" (see tierkv --help)\n", rest[0]);
        code = CLI_EXIT_USAGE;
    }
    if (code == CLI_EXIT_UNAVAILABLE && strcmp(endpoints_from, "the default") == 0)
        fprintf(stderr,
                "tierkv: no -e/--endpoints, TIERKV_ENDPOINTS or ./" CLI_ENDPOINTS_FILE
                " (make run writes it) was given, so the default " CLI_DEFAULT_ENDPOINTS
                " was tried\n");
out:
    tk_tls_ctx_free(tls);
    free(rest);
    return code;
}
