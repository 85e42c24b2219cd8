/* tierkv snapshot save FILE [--local] [--force] [--timeout D] and tierkv
 * snapshot status FILE: online backups (GET /v1/snapshot) and checking a backup file.
 *
 * save downloads into FILE.part, checks it (header, SHA-256: kv/backup.h),
 * and only then renames it to FILE, so FILE is always a whole, checked
 * backup. An existing FILE is kept unless --force (refused before anything
 * is sent or written). status checks a file and prints its header. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "cmd/tierkv/cli.h"
#include "kv/backup.h"

static const char usage_text[] =
    "usage: tierkv snapshot save FILE [--local] [--force] [--timeout DURATION]\n"
    "       tierkv snapshot status FILE\n"
    "  save    streams a consistent backup of the state machine (GET /v1/snapshot)\n"
    "          into FILE: from the leader, or with --local from the endpoint asked;\n"
    "          every write acknowledged before the save began is in it. The file\n"
    "          is written as FILE.part, checked, then renamed. --timeout: the whole\n"
    "          download (default 10m). An existing FILE is refused (exit 2,\n"
    "          nothing written) unless --force: then it is replaced by the\n"
    "          rename, only once the new backup checks out.\n"
    "  status  checks FILE (SHA-256, structure) and prints its revision, keys,\n"
    "          size and source cluster id; exits 1 if the file is damaged.\n";

static void print_info(const struct cli_global *g, const char *file,
                       const struct kv_backup_info *in, uint64_t size)
{
    if (g->json) {
        printf("{\"file\":\"%s\",\"revision\":%llu,\"term\":%llu,\"keys\":%llu,"
               "\"bytes\":%llu,\"cluster_id\":%llu,\"created_ms\":%llu,"
               "\"format_version\":%u,\"hash_ok\":true}\n",
               file, (unsigned long long)in->revision, (unsigned long long)in->term,
               (unsigned long long)in->keys, (unsigned long long)size,
               (unsigned long long)in->cluster_id, (unsigned long long)in->created_ms,
               in->version);
        return;
    }
    printf("file        %s\nrevision    %llu\nterm        %llu\nkeys        %llu\n"
           "bytes       %llu\ncluster_id  %llu\nformat      %u\nhash        OK "
           "(SHA-256)\n",
           file, (unsigned long long)in->revision, (unsigned long long)in->term,
           (unsigned long long)in->keys, (unsigned long long)size,
           (unsigned long long)in->cluster_id, in->version);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static int status_cmd(struct cli_global *g, const char *file)
{
    struct kv_backup_info in;
    char err[512];
    int rc = kv_backup_check_file(file, &in, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tierkv: snapshot status: %s: %s\n", file, err);
        return rc == TK_EIO ? CLI_EXIT_USAGE : CLI_EXIT_ERROR;
    }
    print_info(g, file, &in, file_size(file));
    return 0;
}

/* The answer of a failed download: its error body (JSON) to stderr. */
static int save_failed(const struct cli_response *r)
{
    fprintf(stderr, "tierkv: snapshot save: HTTP %d: %.*s\n", r->status,
            (int)(r->body_len > 400 ? 400 : r->body_len), r->body ? r->body : "");
    return cli_exit_for_status(r->status);
}

static int save_cmd(struct cli_global *g, const char *file, bool local, bool force,
                    uint64_t ms)
{
    struct stat st;
    if (!force && lstat(file, &st) == 0) {
        fprintf(stderr,
                "tierkv: snapshot save: %s exists; not overwriting it (use --force to "
                "replace it)\n",
                file);
        return CLI_EXIT_USAGE;
    }
    char part[4096];
    snprintf(part, sizeof(part), "%s.part", file);
    FILE *f = fopen(part, "w+");
    if (f == NULL) {
        fprintf(stderr, "tierkv: snapshot save: %s: %s\n", part, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    struct cli_client c = g->client;
    c.timeout_ms = (int)ms;
    struct cli_response r;
    char err[512];
    cli_body_sink(f);
    int rc = cli_request(&c, "GET", local ? "/v1/snapshot?local" : "/v1/snapshot", NULL,
                         NULL, 0, &r, err, sizeof(err));
    cli_body_sink(NULL);
    int code = 0;
    if (fclose(f) != 0 && rc == 0) {
        snprintf(err, sizeof(err), "%.400s: %s", part, strerror(errno));
        rc = TK_EIO;
    }
    if (rc != 0) {
        fprintf(stderr, "tierkv: snapshot save: %s\n", err);
        code = rc == TK_ETIMEDOUT ? CLI_EXIT_TIMEOUT : CLI_EXIT_UNAVAILABLE;
    } else if (r.status != 200) {
        code = save_failed(&r);
    } else {
        struct kv_backup_info in;
        rc = kv_backup_check_file(part, &in, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr,
                    "tierkv: snapshot save: the download does not check out: %s\n", err);
            code = CLI_EXIT_ERROR;
        } else if (rename(part, file) != 0) {
            fprintf(stderr, "tierkv: snapshot save: rename to %s: %s\n", file,
                    strerror(errno));
            code = CLI_EXIT_ERROR;
        } else {
            print_info(g, file, &in, file_size(file));
        }
    }
    cli_response_free(&r);
    if (code != 0)
        unlink(part);
    return code;
}

int cli_cmd_snapshot(struct cli_global *g, int argc, char **argv)
{
    static const struct option opts[] = {{"local", no_argument, 0, 'l'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"force", no_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool local = false, force = false;
    uint64_t ms = 600000;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == 'l') {
            local = true;
        } else if (ch == 'f') {
            force = true;
        } else if (ch == 't') {
            if (cli_parse_duration_ms(optarg, &ms) != 0 || ms > 86400000) {
                fprintf(stderr, "tierkv: snapshot: bad --timeout \"%s\"\n", optarg);
                return CLI_EXIT_USAGE;
            }
        } else {
            fputs(usage_text, ch == 'h' ? stdout : stderr);
            return ch == 'h' ? 0 : CLI_EXIT_USAGE;
        }
    }
    if (argc - optind != 2) {
        fputs(usage_text, stderr);
        return CLI_EXIT_USAGE;
    }
    const char *sub = argv[optind], *file = argv[optind + 1];
    if (strcmp(sub, "save") == 0)
        return save_cmd(g, file, local, force, ms);
    if (strcmp(sub, "status") == 0)
        return status_cmd(g, file);
    fprintf(stderr, "tierkv: snapshot: unknown subcommand \"%s\" (save or status)\n",
            sub);
    return CLI_EXIT_USAGE;
}
