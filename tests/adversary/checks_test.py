#!/usr/bin/env python3
"""The adversarial suite's checkers must be able to fail (issue 48 item 4):
each is fed a known-bad fixture (a term change, a held turn, a p99 40x the
unloaded one, an RSS over budget, a lost write), which it must reject, and
good data, which it must accept. Fast, no processes: suite 'unit'."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402

failed = 0


def expect(name, result, want_ok):
    global failed
    ok, msg = result
    good = ok == want_ok
    failed += not good
    print("%s %-34s %s: %s" % ("ok  " if good else "FAIL", name,
                               "passes" if ok else "fails", msg))


# (1) leader
before = {1: (2, 1), 2: (2, 1), 3: (2, 1)}
expect("leader-same", checks.check_leader(before, dict(before)), True)
expect("leader-term-change", checks.check_leader(before, {1: (3, 1), 2: (3, 1), 3: (3, 1)}),
       False)
expect("leader-moved", checks.check_leader(before, {1: (2, 2), 2: (2, 2), 3: (2, 2)}), False)
expect("leader-one-node-moved", checks.check_leader(before, {1: (2, 1), 2: (3, 0), 3: (2, 1)}),
       False)
expect("leader-node-missing", checks.check_leader(before, {1: (2, 1), 2: (2, 1)}), False)

# (2) held turns, from the fallback (the node's slow-turn warnings) ...
LOG_OK = (
    "WARN a loop turn took 140 ms (election timeout 200 ms): heartbeats were late; most of "
    "it (139 ms) in other; 0 entries applied; over the last 148 ms: 6 ms on the CPU, 120 ms "
    "waiting for a core; 0 major and 3 minor faults, 1 voluntary and 40 involuntary switches\n"
    "WARN a loop turn took 60 ms (election timeout 200 ms): heartbeats were late; most of "
    "it (50 ms) in apply; 12 entries applied; over the last 61 ms: 55 ms on the CPU, 0 ms "
    "waiting for a core; 0 major and 3 minor faults, 1 voluntary and 0 involuntary switches\n")
LOG_HELD = LOG_OK + (
    "WARN a loop turn took 180 ms (election timeout 200 ms): heartbeats were late; most of "
    "it (170 ms) in recv; 3 entries applied; over the last 185 ms: 150 ms on the CPU, 20 ms "
    "waiting for a core; 0 major and 9 minor faults, 1 voluntary and 2 involuntary switches\n")
good = {n: checks.turns_from_log(LOG_OK) for n in (1, 2, 3)}
expect("turns-log-preempted-ok", checks.check_turns(good), True)
bad = dict(good)
bad[2] = checks.turns_from_log(LOG_HELD)
expect("turns-log-held", checks.check_turns(bad), False)
# (the structured warning of today's node/node.c)
KV_OK = ('ts=2026-12-06T12:19:08.786Z level=warn node=2 term=1 msg="slow loop turn" '
         'turn_ms=126 timeout_ms=200 phase=other cpu_ms=10 applied=0 window_ms=126 '
         'wait_ms=116 majflt=0 minflt=641 vcsw=0 ivcsw=6\n')
KV_HELD = KV_OK + ('ts=2026-12-06T12:19:09.786Z level=warn node=2 term=1 msg="slow loop '
                   'turn" turn_ms=310 timeout_ms=200 phase=apply cpu_ms=250 applied=9 '
                   'window_ms=312 wait_ms=40 majflt=0 minflt=641 vcsw=0 ivcsw=6\n')
expect("turns-kvlog-preempted-ok",
       checks.check_turns({n: checks.turns_from_log(KV_OK) for n in (1, 2, 3)}), True)
expect("turns-kvlog-held", checks.check_turns({1: checks.turns_from_log(KV_OK),
                                               2: checks.turns_from_log(KV_HELD)}), False)
# ... and from the held-turn metrics, once the node exports them.
m0 = {"tierkv_loop_turns_held_total": 4.0}
m_ok = {"tierkv_loop_turns_held_total": 4.0, "tierkv_loop_turn_max_cpu_seconds": 0.03,
        "tierkv_loop_turn_held_max_seconds": 0.12,
        'tierkv_loop_turn_max_seconds{phase="apply"}': 0.12}
m_bad = dict(m_ok, tierkv_loop_turns_held_total=5.0)
expect("turns-metrics-ok",
       checks.check_turns({n: checks.turns_from_metrics(m0, m_ok) for n in (1, 2, 3)}), True)
expect("turns-metrics-held",
       checks.check_turns({1: checks.turns_from_metrics(m0, m_ok),
                           2: checks.turns_from_metrics(m0, m_bad),
                           3: checks.turns_from_metrics(m0, m_ok)}), False)
expect("turns-metrics-absent-is-none",
       (checks.turns_from_metrics({}, {"tierkv_loop_turn_max_seconds": 1.0}) is None, ""),
       True)
expect("turns-nothing", checks.check_turns({}), False)

# (3) p99: unloaded ~2 ms; loaded 40x of it fails, 3x passes; the floor.
unloaded = [0.001] * 300 + [0.002] * 5
expect("p99-3x", checks.check_p99(unloaded, [0.003] * 300 + [0.006] * 5), True)
expect("p99-40x", checks.check_p99(unloaded, [0.003] * 290 + [0.080] * 15), False)
tiny = [0.0002] * 300
expect("p99-floor-20ms", checks.check_p99(tiny, [0.0002] * 290 + [0.015] * 10), True)
expect("p99-over-floor", checks.check_p99(tiny, [0.0002] * 290 + [0.025] * 10), False)
# The wider floor make test passes: 25 ms is within 100 ms, 150 ms is not.
expect("p99-floor-100ms", checks.check_p99(tiny, [0.0002] * 290 + [0.025] * 10,
                                           floor_s=0.1), True)
expect("p99-over-floor-100ms", checks.check_p99(tiny, [0.0002] * 290 + [0.150] * 10,
                                                floor_s=0.1), False)
expect("p99-too-few-samples", checks.check_p99(unloaded, [0.001] * 10), False)

# (4) RSS
MiB = 1 << 20
expect("rss-ok", checks.check_rss({1: 200 * MiB, 2: 90 * MiB, 3: 90 * MiB}), True)
expect("rss-over", checks.check_rss({1: 600 * MiB, 2: 90 * MiB, 3: 90 * MiB}), False)
expect("rss-flag-budget", checks.check_rss({1: 600 * MiB}, budget=1024 * MiB), True)
expect("rss-none", checks.check_rss({}), False)

# (5) acknowledged writes
acked = {"norm/%06d" % i: "v%d" % i for i in range(100)}
expect("writes-ok", checks.check_writes(acked, {1: dict(acked), 2: dict(acked),
                                                3: dict(acked, extra="x")}), True)
lost = dict(acked)
del lost["norm/000042"]
expect("writes-lost", checks.check_writes(acked, {1: dict(acked), 2: lost, 3: dict(acked)}),
       False)
changed = dict(acked, **{"norm/000007": "other"})
expect("writes-changed", checks.check_writes(acked, {1: changed, 2: dict(acked)}), False)
expect("writes-unreadable", checks.check_writes(acked, {1: dict(acked), 2: None}), False)
expect("writes-none-acked", checks.check_writes({}, {1: {}}), False)

# (6) a retry only when timing checks alone failed
def retry(*bad):
    rs = [(n, n not in bad, "") for n in ("leader", "turns", "p99", "writes", "rss")]
    return checks.retry_wanted(rs), "failed: %s" % (", ".join(bad) or "none")


expect("retry-turns-p99", retry("turns", "p99"), True)
expect("retry-none-failed", retry(), False)
expect("retry-writes-lost", retry("turns", "writes"), False)
expect("retry-rss", retry("rss"), False)
expect("retry-harness-error", (checks.retry_wanted([("run", False, "boom")]), "run"), False)

# percentile: nearest rank
expect("percentile", (checks.percentile(list(range(1, 101)), 99) == 99
                      and checks.percentile([5], 99) == 5, "nearest rank"), True)

print("%d failed" % failed)
sys.exit(1 if failed else 0)
