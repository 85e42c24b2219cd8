/* The tierkv CLI's command table and the usage text it derives.
 *
 * One row per command (struct cli_command in cli.h): its name, a hidden
 * alias, the usage lines shown by `tierkv --help`, the handler and its
 * flags. main.c dispatches through cli_command_find(); cli_usage() prints the
 * commands section of `tierkv --help` from the same rows, so a command cannot
 * be reachable without being listed, or listed without being reachable. The
 * rest of the usage (global flags, exit codes) is fixed text kept here beside
 * it. Read-only data; any thread. */
#include <stdio.h>
#include <string.h>

#include "base/secret_file.h"
#include "cmd/tierkv/cli.h"

/* The column where a usage line's help starts, after "  NAME ARGS". */
#define USAGE_SYNOPSIS_WIDTH 20

static int cmd_help(struct cli_global *g, int argc, char **argv);

#define EP CLI_CMD_ENDPOINTS

static const struct cli_command commands[] = {
    {"put",
     NULL,
     {{"KEY [VALUE]", "write a key (value from stdin or --file without VALUE)"}},
     cli_cmd_put,
     EP},
    {"get", NULL, {{"KEY", "read a key"}}, cli_cmd_get, EP},
    {"del", "delete", {{"KEY", "delete a key"}}, cli_cmd_del, EP},
    {"scan",
     NULL,
     {{"[PREFIX]", "list keys by prefix or --start/--end range, --limit N"}},
     cli_cmd_scan,
     EP},
    {"incr",
     NULL,
     {{"KEY [DELTA]", "add DELTA (default 1) to an int64 counter"}},
     cli_cmd_incr,
     EP},
    {"txn",
     NULL,
     {{"FILE", "run a transaction from a JSON file (- for stdin)"}},
     cli_cmd_txn,
     EP},
    {"batch",
     NULL,
     {{"FILE", "apply an atomic batch from a JSON file"}},
     cli_cmd_batch,
     EP},
    {"status",
     NULL,
     {{"", "health, role, term and indexes of every endpoint"}},
     cli_cmd_status,
     EP},
    {"members", NULL, {{"", "the cluster's members"}}, cli_cmd_members, EP},
    {"member",
     NULL,
     {{"list|add|promote|remove", "membership changes (tierkv member --help)"}},
     cli_cmd_member,
     EP},
    {"watch",
     NULL,
     {{"KEY|--prefix P", "follow changes as they come (tierkv watch --help)"}},
     cli_cmd_watch,
     EP},
    {"snapshot",
     NULL,
     {{"save FILE", "a consistent backup (GET /v1/snapshot) into FILE"},
      {"status FILE", "check a backup file and show its revision and keys"}},
     cli_cmd_snapshot,
     EP},
    {"lease",
     NULL,
     {{"grant|keepalive|revoke|get", "leases (tierkv lease --help)"}},
     cli_cmd_lease,
     EP},
    {"lock",
     NULL,
     {{"NAME -- CMD", "run CMD holding a lease-backed lock (tierkv lock --help)"}},
     cli_cmd_lock,
     EP},
    {"elect",
     NULL,
     {{"NAME VALUE", "campaign for leadership, print changes of leader"}},
     cli_cmd_elect,
     EP},
    {"bench",
     NULL,
     {{"", "load generator for tierkvd or etcd (tierkv bench --help)"}},
     cli_cmd_bench,
     EP},
    /* Without endpoints: `tierkv help` works whatever -e says. (main.c turns
     * `help COMMAND` into `COMMAND --help` before it looks the command up.) */
    {"help", NULL, {{"[COMMAND]", "this text, or a command's"}}, cmd_help, 0},
};

#undef EP

static const char usage_head[] = "usage: tierkv [global flags] COMMAND [args]\n"
                                 "\n"
                                 "Commands:\n";

static const char usage_tail[] =
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

size_t cli_commands(const struct cli_command **rows)
{
    *rows = commands;
    return sizeof(commands) / sizeof(commands[0]);
}

const struct cli_command *cli_command_find(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const struct cli_command *c = &commands[i];
        if (strcmp(name, c->name) == 0 ||
            (c->alias != NULL && strcmp(name, c->alias) == 0))
            return c;
    }
    return NULL;
}

/* "  NAME ARGS" padded to the help column; a synopsis too long for it is
 * followed by two spaces instead. */
static void usage_line(FILE *f, const char *name, const struct cli_usage_line *u)
{
    char synopsis[96];
    snprintf(synopsis, sizeof(synopsis), "%s%s%s", name, u->args[0] ? " " : "", u->args);
    if (strlen(synopsis) <= USAGE_SYNOPSIS_WIDTH)
        fprintf(f, "  %-*s %s\n", USAGE_SYNOPSIS_WIDTH, synopsis, u->help);
    else
        fprintf(f, "  %s  %s\n", synopsis, u->help);
}

void cli_usage(FILE *f)
{
    fputs(usage_head, f);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        for (size_t k = 0; k < CLI_USAGE_LINES_MAX; k++)
            if (commands[i].usage[k].help != NULL)
                usage_line(f, commands[i].name, &commands[i].usage[k]);
    fputs(usage_tail, f);
}

/* `tierkv help`: the usage on stdout. */
static int cmd_help(struct cli_global *g, int argc, char **argv)
{
    (void)g;
    (void)argc;
    (void)argv;
    cli_usage(stdout);
    return CLI_EXIT_OK;
}
