/* Crash during tier-down (suite 'slow').
 *
 * A child process applies a deterministic log (entry i is generated from the
 * seed and i alone) to a state machine with a small ring, forcing a tier-down
 * every TIER_EVERY entries and telling the parent through a pipe just before
 * each one. The parent waits for a random number of those signals and kills
 * the child with SIGKILL, so the kill lands inside or right after a tier-down
 * (an LMDB write transaction with fsync). Then, in the parent: the cold tier
 * must open, its durable index must not exceed what was applied, and replaying
 * the log after it must give the digest of a reference state machine that
 * applied the same entries without crashing. Rounds continue from the
 * recovered directory, so recovery after recovery is covered too. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/err.h"
#include "base/prng.h"
#include "kv_util.h"

#define ROUNDS 8
#define PER_ROUND 20000
#define TIER_EVERY 1500

static uint64_t seed = 11;

/* Entry i's command, packed into buf (cap >= 4096); returns its length. */
static size_t entry(uint64_t i, uint8_t *buf)
{
    struct tk_prng r;
    tk_prng_seed(&r, seed * 1000003u + i);
    char key[32], val[2048];
    int kl = snprintf(key, sizeof(key), "key%05u", (unsigned)tk_prng_below(&r, 3000));
    size_t vl = tk_prng_below(&r, 10) == 0 ? 1000 + tk_prng_below(&r, 1000)
                                           : tk_prng_below(&r, 40);
    for (size_t j = 0; j < vl; j++)
        val[j] = (char)('a' + tk_prng_below(&r, 26));
    Kvpb__Command c = KVPB__COMMAND__INIT;
    Kvpb__Put p = KVPB__PUT__INIT;
    Kvpb__Delete d = KVPB__DELETE__INIT;
    Kvpb__Increment in = KVPB__INCREMENT__INIT;
    uint64_t k = tk_prng_below(&r, 100);
    if (k < 70) {
        p.key = kvu_bin(key, (size_t)kl);
        p.value = kvu_bin(val, vl);
        if (k < 10)
            p.ttl_ms = 1 + tk_prng_below(&r, 20000);
        c.cmd_case = KVPB__COMMAND__CMD_PUT;
        c.put = &p;
    } else if (k < 85) {
        d.key = kvu_bin(key, (size_t)kl);
        c.cmd_case = KVPB__COMMAND__CMD_DEL;
        c.del = &d;
    } else {
        in.key = kvu_bin("counter", 7);
        in.delta = (int64_t)tk_prng_below(&r, 100);
        c.cmd_case = KVPB__COMMAND__CMD_INCR;
        c.incr = &in;
        c.client_id = 1;
        c.seq = i;
    }
    return kvpb__command__pack(&c, buf);
}

static uint64_t entry_time(uint64_t i)
{
    return 1000000 + i * 7;
}

static int apply_range(struct kv_sm *sm, uint64_t from, uint64_t to, int signal_fd)
{
    uint8_t buf[4096];
    for (uint64_t i = from; i <= to; i++) {
        size_t len = entry(i, buf);
        struct kv_result res;
        int rc = kv_sm_apply(sm, i, 1, entry_time(i), buf, len, &res);
        if (rc != 0)
            return rc;
        if (signal_fd >= 0 && i % TIER_EVERY == 0) {
            char b = 't';
            if (write(signal_fd, &b, 1) != 1)
                return TK_EIO;
            rc = kv_sm_tier_down(sm);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

static void config(struct kv_config *c, const char *dir)
{
    kv_config_default(c);
    c->dir = dir;
    c->map_bytes = (size_t)1 << 30;
    c->page_bytes = 8192;
    c->ring_bytes = 128 * 1024;
    c->sessions_max = 1000;
    c->no_sync = false; /* real commits, as in production */
}

int main(int argc, char **argv)
{
    if (argc > 1)
        seed = strtoull(argv[1], NULL, 10);
    char *ref_dir = kvu_tmpdir(), *dir = kvu_tmpdir();
    struct kv_config rc_cfg, cfg;
    config(&rc_cfg, ref_dir);
    rc_cfg.no_sync = true;
    config(&cfg, dir);
    struct kv_sm *ref;
    if (kv_sm_open(&rc_cfg, &ref) != 0)
        return 1;
    int fails = 0;
    uint64_t kills_in_tier = 0;
    for (int round = 1; round <= ROUNDS; round++) {
        uint64_t target = (uint64_t)round * PER_ROUND;
        if (apply_range(ref, kv_sm_applied_index(ref) + 1, target, -1) != 0)
            return 1;
        uint64_t want;
        if (kv_sm_digest(ref, &want) != 0)
            return 1;
        int fds[2];
        if (pipe(fds) != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            struct kv_sm *sm;
            if (kv_sm_open(&cfg, &sm) != 0)
                _exit(2);
            int rc = apply_range(sm, kv_sm_applied_index(sm) + 1, target, fds[1]);
            kv_sm_close(sm);
            _exit(rc == 0 ? 0 : 3);
        }
        close(fds[1]);
        struct tk_prng r;
        tk_prng_seed(&r, seed + (uint64_t)round);
        uint64_t wait_for = 1 + tk_prng_below(&r, PER_ROUND / TIER_EVERY);
        uint64_t seen = 0;
        char b;
        while (seen < wait_for && read(fds[0], &b, 1) == 1)
            seen++;
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        close(fds[0]);
        if (WIFSIGNALED(status))
            kills_in_tier += seen == wait_for;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "round %d: child failed (status %d)\n", round, status);
            fails++;
            break;
        }
        /* Recover: open, check the durable index, replay, compare. */
        struct kv_sm *sm;
        int rc = kv_sm_open(&cfg, &sm);
        if (rc != 0) {
            fprintf(stderr, "round %d: reopen after kill: %s\n", round, tk_strerror(rc));
            fails++;
            break;
        }
        uint64_t durable = kv_sm_durable_index(sm);
        if (durable > target) {
            fprintf(stderr, "round %d: durable %" PRIu64 " > applied\n", round, durable);
            fails++;
        }
        rc = apply_range(sm, durable + 1, target, -1);
        uint64_t got = 0;
        if (rc == 0)
            rc = kv_sm_digest(sm, &got);
        printf("round %d: killed after %" PRIu64 " tier-down signals, durable %" PRIu64
               ", replayed %" PRIu64 " entries, digest %s\n",
               round, seen, durable, target - durable,
               got == want ? "equal" : "DIFFERENT");
        if (rc != 0 || got != want)
            fails++;
        kv_sm_close(sm);
    }
    kv_sm_close(ref);
    kvu_rmrf(ref_dir);
    kvu_rmrf(dir);
    tk_free(ref_dir);
    tk_free(dir);
    printf("%d rounds, %" PRIu64 " kills at a tier-down, %d failures\n", ROUNDS,
           kills_in_tier, fails);
    return fails == 0 ? 0 : 1;
}
