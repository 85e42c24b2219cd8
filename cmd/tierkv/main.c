/* tierkv: the command-line client of a tierkv cluster.
 *
 * Parses the global flags (which may appear anywhere before a "--", from the
 * global_flags table below), looks the command up in the command table
 * (table.c), sets up the endpoints, TLS and token if the command's row asks
 * for them, and hands it the remaining arguments. The commands live in
 * commands.c, bench.c and the files cli.h lists; docs/cli.md is the manual.
 * Single-threaded except for `bench`, which runs its own loop threads. */
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

/* Longer than any list of CLI_ENDPOINTS_MAX endpoints a person writes. */
#define CLI_ENDPOINTS_FILE_MAX 4096

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

/* What main builds from its arguments and environment. */
struct cli_main {
    struct cli_global g;
    struct security_flags sf;
    /* Where the endpoints come from, first found wins: -e/--endpoints, the
     * env TIERKV_ENDPOINTS, ./data/endpoints, the built-in default (the file
     * is read only when neither of the first two is given: endpoints_setup). */
    const char *endpoints, *endpoints_from;
    char **rest; /* the arguments that are not global flags, in order */
    int n_rest;
    struct tk_tls_ctx *tls;
};

/* main's steps return this to go on, or the exit code to end with. */
#define MAIN_GO_ON (-1)

static int usage(const char *msg)
{
    fprintf(stderr, "tierkv: %s (see tierkv --help)\n", msg);
    return CLI_EXIT_USAGE;
}

/* ---- the global flags ---- */

enum global_flag_kind {
    GF_SWITCH,   /* exactly the name: --json */
    GF_VALUE,    /* --name=V or --name V */
    GF_NONEMPTY, /* the same, an empty V refused */
    GF_OPT_BOOL, /* --name (true) or --name=BOOL */
};

/* Each setter stores its flag's value (NULL for a switch, or an optional
 * BOOL not given); returns 0, or -1 for a bad value. */
static int set_endpoints(struct cli_main *m, const char *v)
{
    m->endpoints = v;
    m->endpoints_from = "--endpoints";
    return 0;
}

static int set_cacert(struct cli_main *m, const char *v)
{
    m->sf.cacert = v;
    return 0;
}

static int set_cert(struct cli_main *m, const char *v)
{
    m->sf.cert = v;
    return 0;
}

static int set_key(struct cli_main *m, const char *v)
{
    m->sf.key = v;
    return 0;
}

static int set_token(struct cli_main *m, const char *v)
{
    m->sf.token = v;
    m->sf.token_on_argv = true;
    return 0;
}

static int set_token_file(struct cli_main *m, const char *v)
{
    m->sf.token_file = v;
    return 0;
}

static int set_allow_loose(struct cli_main *m, const char *v)
{
    if (v == NULL) {
        m->sf.allow_loose = true;
        return 0;
    }
    return tk_parse_bool(v, &m->sf.allow_loose) == 0 ? 0 : -1;
}

static int set_json(struct cli_main *m, const char *v)
{
    (void)v;
    m->g.json = true;
    return 0;
}

static int set_base64(struct cli_main *m, const char *v)
{
    (void)v;
    m->g.base64 = true;
    return 0;
}

static int set_verbose(struct cli_main *m, const char *v)
{
    (void)v;
    m->g.client.verbose = true;
    return 0;
}

static int set_timeout(struct cli_main *m, const char *v)
{
    uint64_t ms;
    if (cli_parse_duration_ms(v, &ms) != 0 || ms > 3600000)
        return -1;
    m->g.client.timeout_ms = (int)ms;
    m->g.timeout_set = true;
    return 0;
}

static int set_retries(struct cli_main *m, const char *v)
{
    uint64_t n;
    if (cli_parse_u64(v, 0, 20, &n) != 0)
        return -1;
    m->g.client.retries = (int)n;
    return 0;
}

static int set_mode(struct cli_main *m, const char *v)
{
    if (strcmp(v, "applied") != 0 && strcmp(v, "committed") != 0)
        return -1;
    snprintf(m->g.mode, sizeof(m->g.mode), "%s", v);
    return 0;
}

static int set_consistency(struct cli_main *m, const char *v)
{
    if (strcmp(v, "linearizable") != 0 && strcmp(v, "stale") != 0)
        return -1;
    snprintf(m->g.consistency, sizeof(m->g.consistency), "%s", v);
    return 0;
}

#define TOKEN_FLAGS_BAD "--cacert, --cert, --key and --token want a value"

/* The global flags; the usage text (table.c) and docs/cli.md describe them. */
static const struct global_flag {
    const char *name;
    const char *short_name; /* matched exactly; NULL: none */
    enum global_flag_kind kind;
    int (*set)(struct cli_main *m, const char *v);
    const char *bad; /* the usage error for a missing or bad value */
} global_flags[] = {
    {"--endpoints", "-e", GF_VALUE, set_endpoints, "--endpoints wants a value"},
    {"--cacert", NULL, GF_NONEMPTY, set_cacert, TOKEN_FLAGS_BAD},
    {"--cert", NULL, GF_NONEMPTY, set_cert, TOKEN_FLAGS_BAD},
    {"--key", NULL, GF_NONEMPTY, set_key, TOKEN_FLAGS_BAD},
    {"--token", NULL, GF_NONEMPTY, set_token, TOKEN_FLAGS_BAD},
    {"--token-file", NULL, GF_NONEMPTY, set_token_file, "--token-file wants a file"},
    {"--allow-loose-permissions", NULL, GF_OPT_BOOL, set_allow_loose,
     "--allow-loose-permissions=BOOL: BOOL is " TK_BOOL_ACCEPTED},
    {"--json", NULL, GF_SWITCH, set_json, NULL},
    {"--base64", NULL, GF_SWITCH, set_base64, NULL},
    {"--verbose", "-v", GF_SWITCH, set_verbose, NULL},
    {"--timeout", NULL, GF_VALUE, set_timeout,
     "--timeout wants a duration like 5s or 500ms"},
    {"--retries", NULL, GF_VALUE, set_retries, "--retries wants 0..20"},
    {"--mode", NULL, GF_VALUE, set_mode, "--mode is applied or committed"},
    {"--consistency", NULL, GF_VALUE, set_consistency,
     "--consistency is linearizable or stale"},
};

/* arg is `name` itself or "name=...". */
static bool is_flag(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

static const struct global_flag *global_flag_find(const char *arg)
{
    for (size_t i = 0; i < sizeof(global_flags) / sizeof(global_flags[0]); i++) {
        const struct global_flag *f = &global_flags[i];
        if (f->short_name != NULL && strcmp(arg, f->short_name) == 0)
            return f;
        if (f->kind == GF_SWITCH ? strcmp(arg, f->name) == 0 : is_flag(arg, f->name))
            return f;
    }
    return NULL;
}

/* The value of a global flag at argv[*i], spelled `name`: "name=value", or
 * "name value" (then *i moves past it); NULL if there is none. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

/* Applies the global flag f found at argv[*i]. Returns MAIN_GO_ON or
 * CLI_EXIT_USAGE with the flag's message printed. */
static int global_flag_apply(struct cli_main *m, const struct global_flag *f, int argc,
                             char **argv, int *i)
{
    const char *a = argv[*i];
    const char *v = NULL;
    if (f->kind == GF_VALUE || f->kind == GF_NONEMPTY) {
        bool is_short = f->short_name != NULL && strcmp(a, f->short_name) == 0;
        v = flag_value(argc, argv, i, is_short ? f->short_name : f->name);
        if (v == NULL || (f->kind == GF_NONEMPTY && v[0] == '\0'))
            return usage(f->bad);
    } else if (f->kind == GF_OPT_BOOL && strchr(a, '=') != NULL) {
        v = strchr(a, '=') + 1;
    }
    return f->set(m, v) == 0 ? MAIN_GO_ON : usage(f->bad);
}

/* Takes the global flags out of argv (applied to m) and keeps the rest, in
 * order, in m->rest: everything after a "--", words, and flags that are not
 * global (a command's own). --help and --version before the command print and
 * end. Returns MAIN_GO_ON or the exit code. */
static int parse_global_flags(struct cli_main *m, int argc, char **argv)
{
    bool dashdash = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct global_flag *f = NULL;
        if (dashdash || a[0] != '-' || strcmp(a, "--") == 0) {
            dashdash = dashdash || strcmp(a, "--") == 0;
            m->rest[m->n_rest++] = argv[i];
        } else if ((f = global_flag_find(a)) != NULL) {
            int rc = global_flag_apply(m, f, argc, argv, &i);
            if (rc != MAIN_GO_ON)
                return rc;
        } else if (m->n_rest == 0 && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        } else if (m->n_rest == 0 && strcmp(a, "--version") == 0) {
            printf("tierkv 0.1.0\n");
            return CLI_EXIT_OK;
        } else {
            m->rest[m->n_rest++] = argv[i]; /* a command's own flag */
        }
    }
    return MAIN_GO_ON;
}

/* The defaults and the environment's settings, before the flags. Returns
 * MAIN_GO_ON or the exit code. */
static int main_init(struct cli_main *m, int argc)
{
    memset(m, 0, sizeof(*m));
    m->g.client.timeout_ms = 5000;
    m->g.client.retries = 2;
    m->endpoints = env_or_null("TIERKV_ENDPOINTS");
    m->endpoints_from = m->endpoints != NULL ? "TIERKV_ENDPOINTS" : NULL;
    m->rest = calloc((size_t)argc + 1, sizeof(char *));
    if (m->rest == NULL)
        return CLI_EXIT_ERROR;
    m->sf = (struct security_flags){.cacert = env_or_null("TIERKV_CACERT"),
                                    .cert = env_or_null("TIERKV_CERT"),
                                    .key = env_or_null("TIERKV_KEY"),
                                    .token = env_or_null("TIERKV_TOKEN")};
    const char *loose = env_or_null("TIERKV_ALLOW_LOOSE_PERMISSIONS");
    if (loose != NULL && tk_parse_bool(loose, &m->sf.allow_loose) != 0) {
        fprintf(stderr,
                "tierkv: TIERKV_ALLOW_LOOSE_PERMISSIONS=\"%s\" is not a boolean: "
                "use " TK_BOOL_ACCEPTED "\n",
                loose);
        return CLI_EXIT_USAGE;
    }
    return MAIN_GO_ON;
}

/* ---- the command ---- */

/* The endpoints (from the first source that has them), then TLS and the
 * token: what a command that talks to a server needs. Returns 0 or
 * CLI_EXIT_USAGE with the reason printed. */
static int endpoints_setup(struct cli_main *m)
{
    static char file_endpoints[CLI_ENDPOINTS_FILE_MAX + 1];
    if (m->endpoints == NULL) {
        if (endpoints_from_file(file_endpoints, sizeof(file_endpoints))) {
            m->endpoints = file_endpoints;
            m->endpoints_from = "./" CLI_ENDPOINTS_FILE;
        } else {
            m->endpoints = CLI_DEFAULT_ENDPOINTS;
            m->endpoints_from = "the default";
        }
    }
    struct cli_client *c = &m->g.client;
    if (c->verbose)
        fprintf(stderr, "tierkv: endpoints %s (from %s)\n", m->endpoints,
                m->endpoints_from);
    if (cli_parse_endpoints(m->endpoints, c->eps, CLI_ENDPOINTS_MAX, &c->n_eps) != 0) {
        fprintf(stderr,
                "tierkv: bad endpoints \"%s\" (from %s): want a comma-separated list of "
                "host:port (at most %d)\n",
                m->endpoints, m->endpoints_from, CLI_ENDPOINTS_MAX);
        return CLI_EXIT_USAGE;
    }
    if (m->sf.token_file != NULL && m->sf.token_on_argv)
        return usage("--token and --token-file do not go together");
    m->sf.https_endpoint = strcasestr(m->endpoints, "https://") != NULL;
    return security_setup(&m->sf, &m->tls);
}

/* Runs the command m->rest names (`help COMMAND` is `COMMAND --help`).
 * Returns its exit code. */
static int run_command(struct cli_main *m)
{
    if (m->n_rest == 0) {
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(m->rest[0], "help") == 0 && m->n_rest > 1) {
        m->rest[0] = m->rest[1];
        m->rest[1] = "--help";
        m->n_rest = 2;
    }
    const struct cli_command *cmd = cli_command_find(m->rest[0]);
    /* An unknown command goes through the endpoint checks too: a bad -e is
     * reported first, whatever the command. */
    if (cmd == NULL || (cmd->flags & CLI_CMD_ENDPOINTS) != 0) {
        int rc = endpoints_setup(m);
        if (rc != 0)
            return rc;
    }
    if (cmd == NULL) {
        fprintf(stderr, "tierkv: unknown command \"%s\" (see tierkv --help)\n",
                m->rest[0]);
        return CLI_EXIT_USAGE;
    }
    int code = cmd->run(&m->g, m->n_rest, m->rest);
    if (code == CLI_EXIT_UNAVAILABLE && m->endpoints_from != NULL &&
        strcmp(m->endpoints_from, "the default") == 0)
        fprintf(stderr,
                "tierkv: no -e/--endpoints, TIERKV_ENDPOINTS or ./" CLI_ENDPOINTS_FILE
                " (make run writes it) was given, so the default " CLI_DEFAULT_ENDPOINTS
                " was tried\n");
    return code;
}

int main(int argc, char **argv)
{
    struct cli_main m;
    int code = main_init(&m, argc);
    if (code == MAIN_GO_ON)
        code = parse_global_flags(&m, argc, argv);
    if (code == MAIN_GO_ON)
        code = run_command(&m);
    tk_tls_ctx_free(m.tls);
    free(m.rest);
    return code;
}
