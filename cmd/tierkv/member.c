/* tierkv member list|add|promote|remove: the membership routes of the
 * gateway (GET/POST /v1/members, POST /v1/members/{id}/promote, DELETE
 * /v1/members/{id}; docs/api.md "Membership", docs/cli.md). Changes go to
 * the leader: the client follows the leader hint of a 503 not_leader. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "cmd/tierkv/cli.h"

static const char member_help[] =
    "usage: tierkv member list\n"
    "       tierkv member add ID --raft HOST:PORT [--http HOST:PORT] [--learner]\n"
    "       tierkv member promote ID [--wait DURATION]\n"
    "       tierkv member remove ID\n"
    "\n"
    "  list      the configuration in force: id, role (voter or learner), raft and\n"
    "            http addresses, and from the leader (asked at its http address\n"
    "            when the endpoint is a follower) match, lag and caught_up\n"
    "  add       adds a new node (started with tierkvd --join) as a learner, then,\n"
    "            without --learner, promotes it once it has caught up\n"
    "  promote   makes a caught-up learner a voter; a lagging one is refused (409\n"
    "            not_caught_up, with how far behind); --wait retries until then\n"
    "  remove    removes a voter or learner (the leader too: it steps down);\n"
    "            its id is never used again\n"
    "One change at a time: a second one while one is in progress gets 409\n"
    "change_pending. A change waits 40s for its answer (the server may take 30s;\n"
    "--timeout overrides) and is never resent: without an answer, member list\n"
    "tells whether it took effect. Exit codes as for every command (4: a 409\n"
    "refusal).\n";

static int transport_fail(int rc, const char *err)
{
    fprintf(stderr, "tierkv: member: %s\n", err);
    return rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT : CLI_EXIT_UNAVAILABLE;
}

/* The server waits up to MEMBER_PROMOTE_WAIT_MS (30 s, node/node_member.c)
 * for a new member to catch up before it answers an add. A change's attempt
 * waits longer than that (unless --timeout says otherwise), so the answer is
 * the server's own. */
#define CLI_MEMBER_TIMEOUT_MS 40000

/* Sets up g->client for a change: the long timeout, and no resend of a
 * request that may have been applied (a resent add comes back as 409
 * change_pending: its own change). */
static void change_client(struct cli_global *g)
{
    if (!g->timeout_set && g->client.timeout_ms < CLI_MEMBER_TIMEOUT_MS)
        g->client.timeout_ms = CLI_MEMBER_TIMEOUT_MS;
    g->client.no_resend = true;
}

enum change_kind { CH_ADD, CH_PROMOTE, CH_REMOVE };

/* A change whose answer never came (rc from cli_request): when it may have
 * been applied, asks member list whether it took effect and reports that;
 * otherwise the transport error. Returns the exit code. */
static int change_unanswered(struct cli_global *g, int rc, const char *err,
                             enum change_kind kind, uint64_t id, bool learner)
{
    static const char *const names[] = {"add", "promote", "remove"};
    const char *what = names[kind];
    if (!g->client.maybe_applied)
        return transport_fail(rc, err);
    fprintf(stderr, "tierkv: member %s: no answer (%s); not resent, asking member list\n",
            what, err);
    g->client.no_resend = false;
    struct cli_response r = {0};
    char e2[512];
    int lrc =
        cli_request(&g->client, "GET", "/v1/members", NULL, NULL, 0, &r, e2, sizeof(e2));
    if (lrc != 0 || r.status != 200) {
        if (lrc == 0)
            cli_response_free(&r);
        fprintf(stderr,
                "tierkv: member %s: cannot tell whether node %llu's change took effect "
                "(member list failed); check with tierkv member list before retrying\n",
                what, (unsigned long long)id);
        return rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT : CLI_EXIT_UNAVAILABLE;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    cli_response_free(&r);
    json_t *found = NULL, *v;
    size_t i;
    json_array_foreach(json_object_get(j, "members"), i, v)
    {
        if ((uint64_t)json_integer_value(json_object_get(v, "id")) == id)
            found = v;
    }
    const char *role = found ? json_string_value(json_object_get(found, "role")) : NULL;
    bool voter = role && strcmp(role, "voter") == 0;
    bool done = kind == CH_REMOVE ? found == NULL
                : kind == CH_ADD  ? found != NULL && (learner || voter)
                                  : voter;
    int code = done                 ? CLI_EXIT_OK
               : rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT
                                    : CLI_EXIT_UNAVAILABLE;
    if (done && g->json) {
        json_t *o = json_pack("{s:s,s:I,s:b,s:s}", "change", what, "id", (json_int_t)id,
                              "applied", 1, "confirmed_by", "member list");
        char *out = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        puts(out);
        free(out);
    } else if (done) {
        printf("%s: done (member list shows node %llu %s)\n", what,
               (unsigned long long)id,
               kind == CH_REMOVE ? "gone"
               : voter           ? "as a voter"
                                 : "as a learner");
    } else if (kind == CH_ADD && found != NULL) {
        fprintf(stderr,
                "tierkv: member add: node %llu was added as a learner but is not a voter "
                "yet; tierkv member promote %llu --wait 1m\n",
                (unsigned long long)id, (unsigned long long)id);
    } else {
        fprintf(stderr,
                "tierkv: member %s: member list does not show node %llu's change: it "
                "has not taken effect (yet); check tierkv member list before retrying\n",
                what, (unsigned long long)id);
    }
    json_decref(j);
    return code;
}

/* Prints the answer (the JSON with --json, else a line) and returns the exit
 * code. */
static int report(struct cli_global *g, const struct cli_response *r, const char *what)
{
    int code = cli_exit_for_status(r->status);
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    if (g->json && r->body_len > 0) {
        fwrite(r->body, 1, r->body_len, stdout);
        if (r->body[r->body_len - 1] != '\n')
            fputc('\n', stdout);
    } else if (code == 0) {
        const char *msg = json_string_value(json_object_get(j, "message"));
        printf("%s: %s\n", what, msg ? msg : "ok");
    }
    if (code != 0) {
        json_t *e = json_object_get(j, "error");
        const char *ec = json_string_value(json_object_get(e, "code"));
        const char *em = json_string_value(json_object_get(e, "message"));
        fprintf(stderr, "tierkv: member %s: HTTP %d from %s:%s: %s: %s\n", what,
                r->status, g->client.answered.host, g->client.answered.port,
                ec ? ec : "error", em ? em : (r->body ? r->body : ""));
    }
    json_decref(j);
    return code;
}

/* Only the leader knows its followers' lag: when the list came from another
 * node, the leader's own list (from the HTTP address in the members' records)
 * replaces it. If the leader does not answer, the list stays, lag "-", and
 * stderr says why. Takes `j` and returns the list to print. */
static json_t *from_leader(struct cli_global *g, json_t *j)
{
    json_int_t self = json_integer_value(json_object_get(j, "id"));
    json_int_t leader = json_integer_value(json_object_get(j, "leader"));
    if (leader == 0 || leader == self)
        return j;
    const char *http = NULL;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(j, "members"), i, v)
    {
        if (json_integer_value(json_object_get(v, "id")) == leader)
            http = json_string_value(json_object_get(v, "http"));
    }
    struct cli_endpoint ep;
    if (http == NULL || http[0] == '\0' || cli_parse_hostport(http, &ep) != 0) {
        fprintf(stderr,
                "tierkv: member list: lag is known to the leader (node %lld) only, "
                "and its records give no HTTP address\n",
                (long long)leader);
        return j;
    }
    struct cli_response r;
    char err[512];
    int rc = cli_request_one(&ep, g->client.timeout_ms, "GET", "/v1/members", NULL, NULL,
                             0, &r, err, sizeof(err));
    json_t *lj =
        rc == 0 && r.status == 200 ? json_loads(r.body ? r.body : "", 0, NULL) : NULL;
    if (lj != NULL && json_integer_value(json_object_get(lj, "leader")) == leader &&
        json_integer_value(json_object_get(lj, "id")) == leader) {
        cli_response_free(&r);
        json_decref(j);
        return lj;
    }
    fprintf(stderr,
            "tierkv: member list: lag is known to the leader (node %lld) only, "
            "and it did not answer at %s: %s\n",
            (long long)leader, http,
            rc != 0      ? err
            : lj == NULL ? "not a members list"
                         : "it is not the leader now");
    json_decref(lj);
    if (rc == 0)
        cli_response_free(&r);
    return j;
}

static int member_list(struct cli_global *g)
{
    struct cli_response r;
    char err[512];
    int rc = cli_request(&g->client, "GET", "/v1/members", NULL, NULL, 0, &r, err,
                         sizeof(err));
    if (rc != 0)
        return transport_fail(rc, err);
    int code = cli_exit_for_status(r.status);
    if (code != 0) {
        code = report(g, &r, "list");
        cli_response_free(&r);
        return code;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    j = from_leader(g, j);
    if (g->json) {
        json_dumpf(j, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(j);
        cli_response_free(&r);
        return 0;
    }
    json_t *m = json_object_get(j, "members");
    size_t i;
    json_t *v;
    printf("%-6s %-8s %-24s %-24s %-7s %s\n", "ID", "ROLE", "RAFT", "HTTP", "LEADER",
           "LAG");
    json_array_foreach(m, i, v)
    {
        json_t *lag = json_object_get(v, "lag");
        char lagbuf[32] = "-";
        if (json_is_integer(lag))
            snprintf(lagbuf, sizeof(lagbuf), "%lld", (long long)json_integer_value(lag));
        printf("%-6lld %-8s %-24s %-24s %-7s %s\n",
               (long long)json_integer_value(json_object_get(v, "id")),
               json_string_value(json_object_get(v, "role")),
               json_string_value(json_object_get(v, "raft")),
               json_string_value(json_object_get(v, "http")),
               json_is_true(json_object_get(v, "leader")) ? "yes" : "", lagbuf);
    }
    printf("config index %lld%s\n",
           (long long)json_integer_value(json_object_get(j, "config_index")),
           json_is_true(json_object_get(j, "committed")) ? "" : " (not yet committed)");
    json_decref(j);
    cli_response_free(&r);
    return 0;
}

static int parse_id(const char *s, uint64_t *id)
{
    if (s == NULL || cli_parse_u64(s, 1, UINT64_MAX >> 1, id) != 0) {
        fprintf(stderr, "tierkv: member: \"%s\" is not a node id (a positive integer)\n",
                s ? s : "");
        return CLI_EXIT_USAGE;
    }
    return 0;
}

static int member_add(struct cli_global *g, int argc, char **argv)
{
    uint64_t id;
    const char *raft = NULL, *http = NULL, *ids = NULL;
    bool learner = false;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--raft") == 0 && i + 1 < argc)
            raft = argv[++i];
        else if (strcmp(argv[i], "--http") == 0 && i + 1 < argc)
            http = argv[++i];
        else if (strcmp(argv[i], "--learner") == 0)
            learner = true;
        else if (ids == NULL && argv[i][0] != '-')
            ids = argv[i];
        else {
            fprintf(stderr, "tierkv: member add: unexpected \"%s\"\n%s", argv[i],
                    member_help);
            return CLI_EXIT_USAGE;
        }
    }
    if (parse_id(ids, &id) != 0)
        return CLI_EXIT_USAGE;
    if (raft == NULL) {
        fprintf(stderr, "tierkv: member add: --raft HOST:PORT is required\n");
        return CLI_EXIT_USAGE;
    }
    json_t *b = json_pack("{s:I,s:s,s:b}", "id", (json_int_t)id, "raft", raft, "learner",
                          learner);
    if (http != NULL)
        json_object_set_new(b, "http", json_string(http));
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct cli_response r;
    char err[512];
    change_client(g);
    int rc = cli_request(&g->client, "POST", "/v1/members", "application/json", body,
                         strlen(body), &r, err, sizeof(err));
    free(body);
    if (rc != 0)
        return change_unanswered(g, rc, err, CH_ADD, id, learner);
    int code = report(g, &r, "add");
    cli_response_free(&r);
    return code;
}

/* promote (retried while 409 not_caught_up until --wait runs out) or remove. */
static int member_change(struct cli_global *g, int argc, char **argv, bool promote)
{
    uint64_t id, wait_ms = 0;
    const char *ids = NULL;
    for (int i = 2; i < argc; i++) {
        if (promote && strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
            if (cli_parse_duration_ms(argv[++i], &wait_ms) != 0) {
                fprintf(stderr, "tierkv: member promote: --wait wants a duration\n");
                return CLI_EXIT_USAGE;
            }
        } else if (ids == NULL && argv[i][0] != '-') {
            ids = argv[i];
        } else {
            fprintf(stderr, "tierkv: member: unexpected \"%s\"\n%s", argv[i],
                    member_help);
            return CLI_EXIT_USAGE;
        }
    }
    if (parse_id(ids, &id) != 0)
        return CLI_EXIT_USAGE;
    char path[64];
    snprintf(path, sizeof(path),
             promote ? "/v1/members/%llu/promote" : "/v1/members/%llu",
             (unsigned long long)id);
    uint64_t deadline = tk_mono_ms() + wait_ms;
    change_client(g);
    for (;;) {
        struct cli_response r;
        char err[512];
        int rc = cli_request(&g->client, promote ? "POST" : "DELETE", path, NULL, NULL, 0,
                             &r, err, sizeof(err));
        if (rc != 0)
            return change_unanswered(g, rc, err, promote ? CH_PROMOTE : CH_REMOVE, id,
                                     false);
        bool again = r.status == 409 && r.body && strstr(r.body, "not_caught_up") &&
                     tk_mono_ms() < deadline;
        if (!again) {
            int code = report(g, &r, promote ? "promote" : "remove");
            cli_response_free(&r);
            return code;
        }
        cli_response_free(&r);
        usleep(200 * 1000);
    }
}

int cli_cmd_member(struct cli_global *g, int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "";
    if (strcmp(sub, "list") == 0 && argc == 2)
        return member_list(g);
    if (strcmp(sub, "add") == 0)
        return member_add(g, argc, argv);
    if (strcmp(sub, "promote") == 0)
        return member_change(g, argc, argv, true);
    if (strcmp(sub, "remove") == 0)
        return member_change(g, argc, argv, false);
    bool help = strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0;
    fputs(member_help, help ? stdout : stderr);
    return help ? 0 : CLI_EXIT_USAGE;
}
