/* tierkv lease, lock and elect: the recipes over leases and watch.
 *
 * lease grant TTL | keepalive ID [--every D] | revoke ID | get ID: one request
 * each (keepalive --every repeats until the lease is gone).
 *
 * lock NAME -- COMMAND and elect NAME VALUE campaign alike: grant a lease
 * (--ttl, default 10 s) kept alive by a thread every TTL/3, put the key
 * NAME/<lease id, 16 hex digits> attached to it, then scan NAME/: the key
 * with the lowest create revision holds the lock (or the leadership). A
 * waiter watches the key just before its own (lock) or the whole prefix
 * (elect, which prints every change of leader) from that key's mod revision
 * + 1, and scans again when it goes. The lock key's create revision is the
 * fencing token: COMMAND gets it in TIERKV_LOCK_REVISION, and a later holder
 * always has a larger one. lock revokes the lease once COMMAND exits and
 * exits with COMMAND's code; elect holds its leadership until SIGINT or
 * SIGTERM, then resigns (revokes). Either, signalled while it waits, revokes
 * at once too; lock passes a signal on to COMMAND and revokes once it exits.
 * A process killed (SIGKILL) loses the lock when its lease runs out. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "cmd/tierkv/cli.h"

static const char lease_help[] =
    "usage: tierkv lease grant TTL\n"
    "       tierkv lease keepalive ID [--every DURATION]\n"
    "       tierkv lease revoke ID\n"
    "       tierkv lease get ID\n"
    "\n"
    "grant prints the new lease's id. keepalive renews it once, or every\n"
    "DURATION until it is gone (exit 3 once it is). revoke deletes the lease\n"
    "and every key attached to it. Attach keys with tierkv put --lease ID.\n";

static const char lock_help[] =
    "usage: tierkv lock [--ttl DURATION] NAME -- COMMAND [ARGS...]\n"
    "\n"
    "Waits for the lock NAME, runs COMMAND while holding it, then releases it\n"
    "and exits with COMMAND's exit code. COMMAND gets the lock's fencing token\n"
    "(a revision that grows with every holder) in TIERKV_LOCK_REVISION. The\n"
    "lock is a key NAME/<lease> on a lease of --ttl (default 10s) kept alive\n"
    "meanwhile: if this process dies the lock is free once the TTL runs out.\n"
    "On SIGINT or SIGTERM it gives the lock up at once: while waiting, it\n"
    "withdraws; while COMMAND runs, it passes the signal on, waits for COMMAND\n"
    "to exit, then releases the lock. It then exits 128 + the signal's number\n"
    "(or with COMMAND's code).\n";

static const char elect_help[] =
    "usage: tierkv elect [--ttl DURATION] NAME VALUE\n"
    "\n"
    "Campaigns for the leadership of NAME with VALUE and prints a line each\n"
    "time the leader changes (\"leader VALUE\", \"elected VALUE REVISION\" for\n"
    "this process). Holds the leadership until SIGINT or SIGTERM, then resigns\n"
    "(exit 0); a candidate signalled before it is elected withdraws (exit 128 +\n"
    "the signal's number).\n";

/* ---- requests ---------------------------------------------------------- */

/* A request whose answer is JSON: *status and *out (NULL if not JSON).
 * Returns 0 or a CLI exit code for a transport failure. */
static int jrequest(struct cli_client *c, const char *method, const char *path,
                    const char *body, int *status, json_t **out)
{
    struct cli_response r;
    char err[512];
    *out = NULL;
    int rc = cli_request(c, method, path, body ? "application/json" : NULL, body,
                         body ? strlen(body) : 0, &r, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tierkv: %s\n", err);
        return rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT : CLI_EXIT_UNAVAILABLE;
    }
    *status = r.status;
    *out = json_loadb(r.body, r.body_len, 0, NULL);
    if (r.status != 200)
        fprintf(stderr, "tierkv: %s %s: %d %.*s", method, path, r.status,
                (int)(r.body_len > 300 ? 300 : r.body_len), r.body);
    cli_response_free(&r);
    return 0;
}

static unsigned long long jnum(json_t *o, const char *name)
{
    return (unsigned long long)json_integer_value(json_object_get(o, name));
}

static int grant(struct cli_client *c, uint64_t ttl_ms, unsigned long long *id)
{
    char body[64], path[] = "/v1/leases";
    snprintf(body, sizeof(body), "{\"ttl_ms\":%llu}", (unsigned long long)ttl_ms);
    int st = 0;
    json_t *j;
    int rc = jrequest(c, "POST", path, body, &st, &j);
    if (rc == 0 && st != 200)
        rc = cli_exit_for_status(st);
    if (rc == 0)
        *id = jnum(j, "id");
    json_decref(j);
    return rc;
}

/* POST keepalive: 0, CLI_EXIT_NOTFOUND (gone) or another exit code. */
static int keepalive(struct cli_client *c, unsigned long long id)
{
    char path[64];
    snprintf(path, sizeof(path), "/v1/leases/%llu/keepalive", id);
    int st = 0;
    json_t *j;
    int rc = jrequest(c, "POST", path, NULL, &st, &j);
    json_decref(j);
    return rc != 0 ? rc : cli_exit_for_status(st);
}

static int revoke_lease(struct cli_client *c, unsigned long long id)
{
    char path[64];
    snprintf(path, sizeof(path), "/v1/leases/%llu", id);
    int st = 0;
    json_t *j;
    int rc = jrequest(c, "DELETE", path, NULL, &st, &j);
    json_decref(j);
    return rc != 0 ? rc : cli_exit_for_status(st);
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- signals ------------------------------------------------------------ */

/* SIGINT or SIGTERM while campaigning, holding or running COMMAND: the
 * signal's number. lock and elect then give the lock up at once (revoke
 * the lease, so that the next waiter need not wait out its TTL) and exit
 * 128 + the signal's number. Installed without SA_RESTART, so a blocking
 * wait is cut short. */
static volatile sig_atomic_t resign;

static void on_signal(int sig)
{
    resign = sig;
}

static void catch_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- the keepalive thread ---------------------------------------------- */

struct keeper {
    struct cli_client c; /* its own copy */
    unsigned long long id;
    uint64_t every_ms;
    atomic_bool stop, lost;
    pthread_t th;
};

static void *keeper_run(void *arg)
{
    struct keeper *k = arg;
    while (!atomic_load(&k->stop)) {
        for (uint64_t t = 0; t < k->every_ms && !atomic_load(&k->stop); t += 50)
            sleep_ms(50);
        if (atomic_load(&k->stop))
            break;
        if (keepalive(&k->c, k->id) == CLI_EXIT_NOTFOUND) {
            atomic_store(&k->lost, true);
            fprintf(stderr, "tierkv: lease %llu is gone: the lock is lost\n", k->id);
            break;
        }
    }
    return NULL;
}

static void keeper_start(struct keeper *k, const struct cli_client *c,
                         unsigned long long id, uint64_t ttl_ms)
{
    k->c = *c;
    k->id = id;
    k->every_ms = ttl_ms / 3 > 50 ? ttl_ms / 3 : 50;
    atomic_init(&k->stop, false);
    atomic_init(&k->lost, false);
    if (pthread_create(&k->th, NULL, keeper_run, k) != 0)
        abort();
}

static void keeper_stop(struct keeper *k)
{
    atomic_store(&k->stop, true);
    pthread_join(k->th, NULL);
}

/* ---- campaigning --------------------------------------------------------- */

struct campaign {
    struct cli_global *g;
    const char *name;
    char key[600];    /* NAME/<lease hex> */
    char prefix[600]; /* NAME/ */
    unsigned long long lease, my_rev;
    bool elect; /* print leader changes, watch the whole prefix */
    char leader_value[256];
};

/* The scan of NAME/: the leader's key and value, and the key just before
 * mine with its mod revision (watch from there). Returns 0, 1 when mine is
 * the lowest, or an exit code. */
static int look(struct campaign *cp, char *pred, size_t cap, unsigned long long *from)
{
    char path[2048], enc[1800];
    cli_url_encode(cp->prefix, strlen(cp->prefix), enc, sizeof(enc));
    snprintf(path, sizeof(path), "/v1/kv?prefix=%s&limit=10000", enc);
    int st = 0;
    json_t *j;
    int rc = jrequest(&cp->g->client, "GET", path, NULL, &st, &j);
    if (rc == 0 && st != 200)
        rc = cli_exit_for_status(st);
    if (rc != 0) {
        json_decref(j);
        return rc;
    }
    json_t *items = json_object_get(j, "items"), *it;
    size_t i;
    unsigned long long best = 0, before = 0, max_mod = 0;
    const char *lead = "", *bkey = NULL;
    bool mine = false;
    json_array_foreach(items, i, it)
    {
        const char *k = json_string_value(json_object_get(it, "key"));
        unsigned long long cr = jnum(it, "create_revision"),
                           mr = jnum(it, "mod_revision");
        max_mod = mr > max_mod ? mr : max_mod;
        if (k != NULL && strcmp(k, cp->key) == 0) {
            mine = true;
            cp->my_rev = cr;
        }
        if (best == 0 || cr < best) {
            best = cr;
            const char *v = json_string_value(json_object_get(it, "value"));
            lead = v ? v : "";
        }
    }
    json_array_foreach(items, i, it)
    {
        unsigned long long cr = jnum(it, "create_revision");
        if (cr < cp->my_rev && cr > before) {
            before = cr;
            bkey = json_string_value(json_object_get(it, "key"));
            *from = jnum(it, "mod_revision") + 1;
        }
    }
    if (cp->elect && strcmp(lead, cp->leader_value) != 0 && best != cp->my_rev) {
        snprintf(cp->leader_value, sizeof(cp->leader_value), "%s", lead);
        printf("leader %s\n", lead);
        fflush(stdout);
    }
    if (cp->elect)
        *from = max_mod + 1;
    rc = !mine ? CLI_EXIT_NOTFOUND : best == cp->my_rev ? 1 : 0;
    if (rc == 0 && !cp->elect)
        snprintf(pred, cap, "%s", bkey ? bkey : "");
    json_decref(j);
    return rc;
}

/* A watch line: stops the stream at a deletion (lock) or any event (elect). */
static int on_watch_line(int status, const char *line, size_t len, void *data)
{
    struct campaign *cp = data;
    if (status != 200 || resign)
        return 1;
    json_t *j = json_loadb(line, len, 0, NULL);
    int rc = 0;
    if (j == NULL || json_object_get(j, "error") != NULL)
        rc = 1;
    else if (json_object_get(j, "progress") == NULL) {
        const char *type = json_string_value(json_object_get(j, "type"));
        rc = cp->elect || type == NULL || strcmp(type, "put") != 0;
    }
    json_decref(j);
    return rc;
}

static void wait_change(struct campaign *cp, const char *pred, unsigned long long from)
{
    char path[2048], enc[1800], err[256];
    const char *what = cp->elect ? cp->prefix : pred;
    cli_url_encode(what, strlen(what), enc, sizeof(enc));
    snprintf(path, sizeof(path), "/v1/watch?%s=%s&start_revision=%llu&progress_ms=1000",
             cp->elect ? "prefix" : "key", enc, from);
    struct cli_client *c = &cp->g->client;
    int rc = cli_stream(&c->eps[c->preferred % c->n_eps], c->timeout_ms, path, NULL,
                        on_watch_line, cp, err, sizeof(err));
    if (rc != 1 && !resign) {
        c->preferred++; /* that endpoint failed: the next one */
        sleep_ms(100);
    }
}

/* Grants the lease, starts the keeper, puts the key and waits until it is
 * the lowest. Returns 0 (held) or an exit code. */
static int campaign(struct campaign *cp, uint64_t ttl_ms, const char *value,
                    struct keeper *k)
{
    int rc = grant(&cp->g->client, ttl_ms, &cp->lease);
    if (rc != 0)
        return rc;
    keeper_start(k, &cp->g->client, cp->lease, ttl_ms);
    snprintf(cp->prefix, sizeof(cp->prefix), "%s/", cp->name);
    snprintf(cp->key, sizeof(cp->key), "%s/%016llx", cp->name, cp->lease);
    char path[2048], enc[1800];
    cli_url_encode(cp->key, strlen(cp->key), enc, sizeof(enc));
    snprintf(path, sizeof(path), "/v1/kv/%s?lease=%llu", enc, cp->lease);
    json_t *body = json_pack("{s:s}", "value", value);
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    int st = 0;
    json_t *j;
    rc = jrequest(&cp->g->client, "PUT", path, b, &st, &j);
    free(b);
    json_decref(j);
    if (rc == 0 && st != 200)
        rc = cli_exit_for_status(st);
    while (rc == 0) {
        if (resign)
            return 128 + resign;
        if (atomic_load(&k->lost))
            return CLI_EXIT_ERROR;
        char pred[600] = "";
        unsigned long long from = 0;
        int l = look(cp, pred, sizeof(pred), &from);
        if (l == 1)
            return 0;
        if (l != 0)
            return l;
        wait_change(cp, pred, from);
    }
    return rc;
}

static int parse_ttl(int *argc, char ***argv, uint64_t *ttl_ms, const char *help)
{
    static const struct option opts[] = {
        {"ttl", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int o;
    *ttl_ms = 10000;
    while ((o = getopt_long(*argc, *argv, "+h", opts, NULL)) != -1) {
        if (o == 't' && cli_parse_duration_ms(optarg, ttl_ms) == 0)
            continue;
        if (o == 'h') {
            fputs(help, stdout);
            return 1;
        }
        return CLI_EXIT_USAGE;
    }
    *argc -= optind;
    *argv += optind;
    return 0;
}

/* Waits for COMMAND to exit. A signal to us alone (kill PID) is passed on
 * to it once, so that the lock is given up only when it has stopped; from a
 * terminal both got it already. Polled (50 ms), so no signal is missed
 * between a check and a blocking wait. */
static void wait_command(pid_t pid, int *status)
{
    bool passed = false;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return;
        if (resign && !passed) {
            kill(pid, resign);
            passed = true;
        }
        sleep_ms(50);
    }
}

int cli_cmd_lock(struct cli_global *g, int argc, char **argv)
{
    uint64_t ttl;
    int p = parse_ttl(&argc, &argv, &ttl, lock_help);
    if (p != 0)
        return p == 1 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (argc >= 1 && cli_check_key("lock", argv[0]) != 0)
        return CLI_EXIT_USAGE;
    if (argc < 3 || strcmp(argv[1], "--") != 0) {
        fprintf(stderr, "tierkv: lock: wants NAME -- COMMAND (see tierkv lock --help)\n");
        return CLI_EXIT_USAGE;
    }
    struct campaign cp = {.g = g, .name = argv[0]};
    struct keeper k;
    catch_signals();
    int rc = campaign(&cp, ttl, "locked", &k);
    if (cp.lease == 0)
        return rc != 0 || !resign ? rc : 128 + resign;
    if (rc != 0) {
        keeper_stop(&k);
        revoke_lease(&g->client, cp.lease);
        return rc;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char rev[32];
        snprintf(rev, sizeof(rev), "%llu", cp.my_rev);
        setenv("TIERKV_LOCK_REVISION", rev, 1);
        execvp(argv[2], argv + 2);
        fprintf(stderr, "tierkv: lock: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (pid < 0)
        status = 127 << 8;
    else
        wait_command(pid, &status);
    keeper_stop(&k);
    revoke_lease(&g->client, cp.lease);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

int cli_cmd_elect(struct cli_global *g, int argc, char **argv)
{
    uint64_t ttl;
    int p = parse_ttl(&argc, &argv, &ttl, elect_help);
    if (p != 0)
        return p == 1 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (argc >= 1 && cli_check_key("elect", argv[0]) != 0)
        return CLI_EXIT_USAGE;
    if (argc != 2) {
        fprintf(stderr, "tierkv: elect: wants NAME VALUE (see tierkv elect --help)\n");
        return CLI_EXIT_USAGE;
    }
    struct campaign cp = {.g = g, .name = argv[0], .elect = true};
    struct keeper k;
    catch_signals();
    int rc = campaign(&cp, ttl, argv[1], &k);
    if (cp.lease == 0)
        return rc != 0 || !resign ? rc : 128 + resign;
    if (rc == 0) {
        printf("elected %s %llu\n", argv[1], cp.my_rev);
        fflush(stdout);
        while (!resign && !atomic_load(&k.lost))
            sleep_ms(50);
        rc = atomic_load(&k.lost) ? CLI_EXIT_ERROR : CLI_EXIT_OK;
    }
    keeper_stop(&k);
    revoke_lease(&g->client, cp.lease);
    return rc;
}

int cli_cmd_lease(struct cli_global *g, int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(lease_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    const char *sub = argv[1];
    uint64_t v = 0, every = 0;
    if (argc < 3 ||
        (strcmp(sub, "grant") == 0 ? cli_parse_duration_ms(argv[2], &v)
                                   : cli_parse_u64(argv[2], 1, INT64_MAX, &v)) != 0) {
        fputs(lease_help, stderr);
        return CLI_EXIT_USAGE;
    }
    if (argc == 5 && strcmp(sub, "keepalive") == 0 && strcmp(argv[3], "--every") == 0) {
        if (cli_parse_duration_ms(argv[4], &every) != 0)
            return CLI_EXIT_USAGE;
    } else if (argc != 3) {
        fputs(lease_help, stderr);
        return CLI_EXIT_USAGE;
    }
    unsigned long long id = v;
    if (strcmp(sub, "grant") == 0) {
        int rc = grant(&g->client, v, &id);
        if (rc == 0)
            printf(g->json ? "{\"id\":%llu,\"ttl_ms\":%llu}\n" : "%llu\n", id,
                   (unsigned long long)v);
        return rc;
    }
    if (strcmp(sub, "keepalive") == 0) {
        for (;;) {
            int rc = keepalive(&g->client, id);
            if (rc != 0 || every == 0)
                return rc;
            sleep_ms(every);
        }
    }
    if (strcmp(sub, "revoke") == 0)
        return revoke_lease(&g->client, id);
    if (strcmp(sub, "get") == 0) {
        char path[64];
        snprintf(path, sizeof(path), "/v1/leases/%llu", id);
        int st = 0;
        json_t *j;
        int rc = jrequest(&g->client, "GET", path, NULL, &st, &j);
        if (rc == 0 && st == 200) {
            char *s = json_dumps(j, JSON_COMPACT);
            puts(s);
            free(s);
        }
        json_decref(j);
        return rc != 0 ? rc : cli_exit_for_status(st);
    }
    fputs(lease_help, stderr);
    return CLI_EXIT_USAGE;
}
