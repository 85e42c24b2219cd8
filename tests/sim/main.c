/* raft-sim: the command line of the deterministic cluster simulator.
 *
 *   raft-sim --seed N [--nodes 3|5] [--time MS] [--trace] [--hash]
 *       one run; --trace prints every event, --hash prints the trace hash
 *   raft-sim --seeds A-B [--nodes 3|5] [--expect-violation]
 *       a sweep, ending with the line "N passed, N failed"; with
 *       --expect-violation it stops at the first violation and exits 0 only if
 *       one was reported (for the planted-bug builds)
 *   raft-sim --demo
 *       a scripted three-node cluster: election, commits, leader crash,
 *       recovery and catch-up, as a short readable trace (`make run`)
 *   --expect NAME: like --expect-violation, but the violation must name NAME
 *       (an invariant such as "liveness"); --expect-safety: any violation but
 *       liveness (a planted safety bug must break a safety invariant).
 *   --no-rule-checks turns off the protocol-rule checks (commit-rule,
 *       durable-before-send), to see whether the end-to-end invariants alone
 *       catch a bug.
 *   --no-heal (sabotage, for the liveness checker's own test): the heal cuts
 *       every link instead of repairing the network.
 *   --membership: two spare node slots and membership changes among the
 *       faults (add learner, promote, remove a voter or the leader; replace).
 *   --lazy-snapshots: snapshots are descriptors only, their data given when a
 *       leader asks (raft_snapshot_wanted); --lazy-snapshots-unserved (sabotage)
 *       never gives it, which the liveness check must catch.
 *   --forged-terms: the faults also step forged messages into nodes, from
 *       member ids, with the boundary terms of raft.h (RAFT_TERM_CEIL - 1,
 *       RAFT_TERM_CEIL, + 1, 2^63, 2^64 - 2^32 - 1, 2^64 - 1); the cluster must
 *       still elect a leader after the heal (raft-sim-bug5, without the leap
 *       bound, must fail it).
 *
 * Exit status: 0 on success, 1 on a violation (or none found under
 * --expect-violation), 2 on a usage error. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/sim/sim.h"

struct opts {
    uint64_t seed;
    uint64_t seed_lo;
    uint64_t seed_hi;
    bool sweep;
    bool demo;
    bool trace;
    bool hash;
    bool expect_violation;
    bool rule_checks;
    bool no_heal;
    bool expect_safety;
    bool membership;
    int lazy_snapshots;
    bool forged_terms;
    const char *expect;
    uint32_t nodes;
    uint64_t time_ms;
};

static void usage(void)
{
    fprintf(stderr, "usage: raft-sim --seed N [--nodes 3|5] [--time MS] [--trace] "
                    "[--hash]\n"
                    "       raft-sim --seeds A-B [--nodes 3|5] [--expect-violation]\n"
                    "       raft-sim --seeds A-B [--nodes 3|5] --expect INVARIANT\n"
                    "       raft-sim --seeds A-B [--nodes 3|5] --expect-safety\n"
                    "       raft-sim --demo\n"
                    "       (any mode: --no-rule-checks, --no-heal, --membership,\n"
                    "        --lazy-snapshots, --lazy-snapshots-unserved,\n"
                    "        --forged-terms)\n");
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof(*o));
    o->seed = 1;
    o->nodes = 3;
    o->rule_checks = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (strcmp(a, "--seed") == 0 && parse_u64(v, &o->seed)) {
            i++;
        } else if (strcmp(a, "--seeds") == 0 && v != NULL) {
            char buf[64];
            snprintf(buf, sizeof(buf), "%s", v);
            char *dash = strchr(buf, '-');
            if (dash == NULL)
                return -1;
            *dash = '\0';
            if (!parse_u64(buf, &o->seed_lo) || !parse_u64(dash + 1, &o->seed_hi) ||
                o->seed_lo > o->seed_hi)
                return -1;
            o->sweep = true;
            i++;
        } else if (strcmp(a, "--nodes") == 0 && parse_u64(v, &n) && n >= 1 &&
                   n <= SIM_NODES_MAX) {
            o->nodes = (uint32_t)n;
            i++;
        } else if ((strcmp(a, "--time") == 0 || strcmp(a, "--steps") == 0) &&
                   parse_u64(v, &o->time_ms)) {
            i++;
        } else if (strcmp(a, "--trace") == 0) {
            o->trace = true;
        } else if (strcmp(a, "--hash") == 0) {
            o->hash = true;
        } else if (strcmp(a, "--demo") == 0) {
            o->demo = true;
        } else if (strcmp(a, "--expect-violation") == 0) {
            o->expect_violation = true;
        } else if (strcmp(a, "--expect") == 0 && v != NULL) {
            o->expect_violation = true;
            o->expect = v;
            i++;
        } else if (strcmp(a, "--expect-safety") == 0) {
            o->expect_violation = true;
            o->expect_safety = true;
        } else if (strcmp(a, "--no-heal") == 0) {
            o->no_heal = true;
        } else if (strcmp(a, "--membership") == 0) {
            o->membership = true;
        } else if (strcmp(a, "--lazy-snapshots") == 0) {
            o->lazy_snapshots = 1;
        } else if (strcmp(a, "--lazy-snapshots-unserved") == 0) {
            o->lazy_snapshots = 2;
        } else if (strcmp(a, "--forged-terms") == 0) {
            o->forged_terms = true;
        } else if (strcmp(a, "--no-rule-checks") == 0) {
            o->rule_checks = false;
        } else {
            return -1;
        }
    }
    return 0;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct sim_config config_for(const struct opts *o, uint64_t seed)
{
    struct sim_config c;
    memset(&c, 0, sizeof(c));
    c.seed = seed;
    c.n_nodes = o->nodes;
    c.faults = true;
    c.fault_ms = o->time_ms;
    c.rule_checks = o->rule_checks;
    c.no_heal = o->no_heal;
    c.membership = o->membership;
    c.lazy_snapshots = o->lazy_snapshots;
    c.forged_terms = o->forged_terms;
    return c;
}

static int run_one(const struct opts *o)
{
    struct sim_config c = config_for(o, o->seed);
    c.trace = o->trace ? stdout : NULL;
    struct sim *s = sim_new(&c);
    int rc = sim_run(s);
    const struct sim_stats *st = sim_stats(s);
    if (o->hash) {
        printf("%016" PRIx64 "\n", sim_trace_hash(s));
    } else {
        printf("seed %" PRIu64 " nodes %u: %s\n", o->seed, o->nodes,
               rc == 0 ? "pass" : sim_violation(s));
        printf("  %" PRIu64 " steps, %" PRIu64 " ms virtual, %" PRIu64
               " messages (%" PRIu64 " dropped, %" PRIu64 " duplicated), %" PRIu64
               " crashes, %" PRIu64 " partitions, %" PRIu64 " one-way cuts\n",
               st->steps, st->end_ms, st->msgs_sent, st->msgs_dropped,
               st->msgs_duplicated, st->crashes, st->partitions, st->cuts);
        printf("  %" PRIu64 " leaderships, %" PRIu64 " proposals: %" PRIu64
               " committed, %" PRIu64 " failed; %" PRIu64 " reads (%" PRIu64
               " refused), %" PRIu64 " transfers, %" PRIu64 " snapshots taken, %" PRIu64
               " installed; %" PRIu64 " checks\n",
               st->leaders, st->proposals, st->committed, st->failed, st->reads,
               st->reads_failed, st->transfers, st->snapshots_taken,
               st->snapshots_installed, st->checks);
        if (o->membership)
            printf("  %" PRIu64 " membership changes appended\n", st->changes);
        if (o->lazy_snapshots)
            printf("  %" PRIu64 " snapshots' data given when a leader wanted it\n",
                   st->snapshots_served);
        if (o->forged_terms)
            printf("  %" PRIu64 " forged messages, %" PRIu64 " refused for their term\n",
                   st->forged, st->forged_refused);
    }
    sim_free(s);
    return rc == 0 ? 0 : 1;
}

static int run_sweep(const struct opts *o)
{
    uint64_t passed = 0, failed = 0, steps = 0, virt_ms = 0;
    double t0 = wall_s();
    for (uint64_t seed = o->seed_lo; seed <= o->seed_hi; seed++) {
        struct sim_config c = config_for(o, seed);
        struct sim *s = sim_new(&c);
        int rc = sim_run(s);
        steps += sim_stats(s)->steps;
        virt_ms += sim_stats(s)->end_ms;
        if (rc == 0) {
            passed++;
        } else {
            failed++;
            printf("seed %" PRIu64 " nodes %u FAILED: %s\n", seed, o->nodes,
                   sim_violation(s));
            printf("  replay: raft-sim --seed %" PRIu64 " --nodes %u%s", seed, o->nodes,
                   o->rule_checks ? "" : " --no-rule-checks");
            if (o->membership)
                printf(" --membership");
            if (o->lazy_snapshots)
                printf(o->lazy_snapshots == 1 ? " --lazy-snapshots"
                                              : " --lazy-snapshots-unserved");
            if (o->forged_terms)
                printf(" --forged-terms");
            if (o->time_ms != 0)
                printf(" --time %" PRIu64, o->time_ms);
            printf(" --trace\n");
        }
        if (rc != 0 &&
            ((o->expect != NULL && strstr(sim_violation(s), o->expect) == NULL) ||
             (o->expect_safety && strstr(sim_violation(s), "VIOLATION liveness")))) {
            printf("expected a violation of %s, got another one\n",
                   o->expect ? o->expect : "a safety invariant");
            sim_free(s);
            return 1;
        }
        sim_free(s);
        if (rc != 0 && o->expect_violation) {
            printf("violation caught after %" PRIu64 " seed(s), at seed %" PRIu64 "\n",
                   seed - o->seed_lo + 1, seed);
            break;
        }
        if (seed == UINT64_MAX)
            break;
    }
    double dt = wall_s() - t0;
    printf("swept %" PRIu64 " seeds, %u nodes, in %.2f s wall: %" PRIu64
           " steps, %.0f steps/s, %.1f s virtual\n",
           passed + failed, o->nodes, dt, steps, dt > 0 ? (double)steps / dt : 0.0,
           (double)virt_ms / 1000.0);
    printf("%" PRIu64 " passed, %" PRIu64 " failed\n", passed, failed);
    if (o->expect_violation) {
        if (failed == 0)
            printf("expected a violation, none was reported\n");
        return failed > 0 ? 0 : 1;
    }
    return failed == 0 ? 0 : 1;
}

/* ---- the demo ---------------------------------------------------------- */

struct demo {
    uint32_t n;
    uint64_t leader;
    uint64_t not_leader; /* a leader other than this one */
    uint64_t node;       /* for caught_up */
};

static bool has_leader(struct sim *s, void *data)
{
    struct demo *d = data;
    uint64_t l = sim_leader(s);
    return l != 0 && l != d->not_leader;
}

/* Every proposal decided, and every up node applied what the leader committed. */
static bool all_applied(struct sim *s, void *data)
{
    struct demo *d = data;
    uint64_t l = sim_leader(s);
    if (l == 0 || sim_pending(s) > 0)
        return false;
    for (uint64_t i = 1; i <= d->n; i++)
        if (sim_up(s, i) && sim_applied(s, i) != sim_commit(s, l))
            return false;
    return true;
}

static bool caught_up(struct sim *s, void *data)
{
    struct demo *d = data;
    uint64_t l = sim_leader(s);
    return l != 0 && sim_applied(s, d->node) == sim_commit(s, l);
}

static int demo_propose(struct sim *s, struct demo *d, uint32_t count)
{
    uint64_t l = sim_leader(s);
    uint64_t before = sim_commit(s, l);
    sim_note(s, "client: propose %u commands to the leader n%" PRIu64, count, l);
    for (uint32_t i = 0; i < count; i++) {
        sim_propose(s, l, 1);
        if (sim_run_for(s, 3) != 0)
            return -1;
    }
    if (sim_run_until(s, all_applied, d, 3000) != 1)
        return -1;
    l = sim_leader(s);
    sim_note(s,
             "commit index %" PRIu64 " on leader n%" PRIu64 " (%" PRIu64
             " new entries); every live node applied them",
             sim_commit(s, l), l, sim_commit(s, l) - before);
    return 0;
}

static int run_demo(const struct opts *o)
{
    struct sim_config c;
    memset(&c, 0, sizeof(c));
    c.seed = o->seed;
    c.n_nodes = 3;
    c.rule_checks = true;
    c.notes = stdout;
    struct demo d = {3, 0, 0, 0};
    printf("tierkv raft simulator: 3 raft cores in one process, simulated "
           "network and disks,\nvirtual time (1 tick = 10 ms), seed %" PRIu64
           ". Safety invariants are checked after every step.\n\n",
           o->seed);
    struct sim *s = sim_new(&c);
    int rc = -1;
    if (sim_run_until(s, has_leader, &d, 5000) != 1)
        goto out;
    d.leader = sim_leader(s);
    if (demo_propose(s, &d, 10) != 0)
        goto out;
    if (sim_run_for(s, 100) != 0)
        goto out;
    sim_crash(s, d.leader);
    d.not_leader = d.leader;
    if (sim_run_until(s, has_leader, &d, 5000) != 1)
        goto out;
    if (demo_propose(s, &d, 10) != 0)
        goto out;
    if (sim_run_for(s, 200) != 0)
        goto out;
    sim_restart(s, d.leader);
    d.node = d.leader;
    if (sim_run_until(s, caught_up, &d, 5000) != 1)
        goto out;
    uint64_t l = sim_leader(s);
    sim_note(s,
             "n%" PRIu64 " caught up: applied index %" PRIu64
             ", the same as the leader n%" PRIu64,
             d.node, sim_applied(s, d.node), l);
    if (sim_run_for(s, 100) != 0)
        goto out;
    rc = 0;
out:;
    const struct sim_stats *st = sim_stats(s);
    printf("\nsummary after %" PRIu64 " ms virtual:\n", sim_now_ms(s));
    for (uint64_t i = 1; i <= 3; i++)
        printf("  n%" PRIu64 ": %-8s term %" PRIu64 ", commit %" PRIu64
               ", applied %" PRIu64 "\n",
               i,
               !sim_up(s, i)        ? "down"
               : sim_leader(s) == i ? "leader"
                                    : "follower",
               sim_term(s, i), sim_commit(s, i), sim_applied(s, i));
    printf("  %" PRIu64 " proposals: %" PRIu64 " committed, %" PRIu64 " failed; %" PRIu64
           " messages; %" PRIu64 " steps\n",
           st->proposals, st->committed, st->failed, st->msgs_sent, st->steps);
    if (rc == 0)
        printf("  all safety invariants held (%" PRIu64 " checks)\n", st->checks);
    else
        printf("  FAILED: %s\n",
               sim_violation(s)[0] ? sim_violation(s) : "a step timed out");
    sim_free(s);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) != 0 || argc < 2) {
        usage();
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.demo)
        return run_demo(&o);
    if (o.sweep)
        return run_sweep(&o);
    return run_one(&o);
}
