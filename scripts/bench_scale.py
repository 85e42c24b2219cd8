#!/usr/bin/env python3
"""The driver of scripts/bench-scale.sh (which starts the cluster): loads it
step by step with `tierkv bench --sequential` and prints a row per step from
the bench's JSON line, the nodes' /metrics and their log lines. Exit 1 when
a limit given (--max-turn-ms, --no-leader-change) was passed, or on errors."""
import argparse, glob, json, re, subprocess, sys, time, urllib.request

ap = argparse.ArgumentParser()
for a in ("http-base", "entries", "value", "conn", "step", "max-turn-ms",
          "no-leader-change", "time-limit"):
    ap.add_argument("--" + a, type=int, default=0)
ap.add_argument("--dir")
ap.add_argument("--cli")
ap.add_argument("--endpoints")
o = ap.parse_args()
nodes = [o.http_base + i for i in (1, 2, 3)]


def metrics(port):
    """{name or name{labels}: value} of one node, or {} if it is down."""
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                      timeout=2).read().decode()
    except Exception:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def leader():
    for p in nodes:
        m = metrics(p)
        if m.get('tierkv_raft_role{role="leader"}') == 1:
            return p, m
    return None, {}


deadline = time.time() + 20
lp = None
while time.time() < deadline and lp is None:
    lp, lm = leader()
    time.sleep(0.1)
if lp is None:
    print("bench-scale: no leader after 20 s; logs in %s" % o.dir, file=sys.stderr)
    sys.exit(1)
term0 = lm.get("tierkv_raft_term", 0)

turn_re = re.compile(r"a loop turn took (\d+) ms .* most of it \((\d+) ms\) in (\w+)")
snap_re = re.compile(r"snapshot at (\d+) .*: (\d+) ms in all, (\d+) us of it on the loop")


def logs():
    """Longest logged turn (ms, phase) and snapshot figures over all nodes."""
    worst, snaps = (0, "-"), []
    for f in glob.glob(o.dir + "/n*.log"):
        for line in open(f, errors="replace"):
            m = turn_re.search(line)
            if m and int(m.group(1)) > worst[0]:
                worst = (int(m.group(1)), m.group(3))
            m = snap_re.search(line)
            if m:
                snaps.append((int(m.group(2)), int(m.group(3))))
    return worst, snaps


def max_turn(ms):
    """Longest loop turn any node recorded (/metrics), in ms, with its phase."""
    best = (0.0, "-")
    for m in ms:
        for k, v in m.items():
            if k.startswith("tierkv_loop_turn_max_seconds{"):
                ph = re.search(r'phase="(\w+)"', k).group(1)
                if v * 1000 > best[0]:
                    best = (v * 1000, ph)
    return best


def mem(m):
    return " ".join("%s=%.0fM" % (re.search(r'owner="(\w+)"', k).group(1), v / 2**20)
                    for k, v in sorted(m.items()) if k.startswith("tierkv_memory_bytes{"))


print("%9s %8s %7s %8s %7s %9s %-8s %6s %9s %9s %s" % (
    "entries", "ops/s", "p99_ms", "p999_ms", "max_ms", "turn_ms", "phase", "lchg",
    "snap_ms", "snap_loop", "leader memory by owner"))
t_start = time.time()
failed = False
applied = 0
step_no = 0
while applied < o.entries:
    step_no += 1
    if o.time_limit and time.time() - t_start > o.time_limit:
        print("bench-scale: time limit (%d s) reached at %d entries" % (o.time_limit, applied))
        break
    r = subprocess.run([o.cli, "--endpoints", o.endpoints, "bench", "-c", str(o.conn),
                        "-d", "%ds" % o.step, "--warmup", "0", "--mix", "write",
                        "--value-size", str(o.value), "--keys", str(max(o.entries, 1)),
                        "--sequential", "--key-prefix", "s%d/" % step_no, "--no-progress"],
                       capture_output=True, text=True)
    js = [l for l in r.stdout.splitlines() if l.startswith("{")]
    b = json.loads(js[-1]) if js else {}
    if not js:
        print(r.stdout + r.stderr, file=sys.stderr)
        failed = True
        break
    ms = [metrics(p) for p in nodes]
    lp, lm = leader()
    applied = int(lm.get("tierkv_raft_applied_index", applied))
    terms = max(m.get("tierkv_raft_term", 0) for m in ms)
    (lt, lph), snaps = logs()
    mt, mph = max_turn(ms)
    if lt > mt:
        mt, mph = lt, lph
    print("%9d %8.0f %7.2f %8.2f %7.1f %9.1f %-8s %6d %9d %9.1f %s" % (
        applied, b.get("ops_per_s", 0), b.get("p99_ms", 0), b.get("p999_ms", 0),
        b.get("max_ms", 0), mt, mph, terms - term0, sum(s[0] for s in snaps),
        sum(s[1] for s in snaps) / 1000.0, mem(lm)), flush=True)
    if b.get("errors", 0):
        print("bench-scale: %d errors in the step" % b["errors"])
    if o.max_turn_ms and mt > o.max_turn_ms:
        print("bench-scale: FAIL: a loop turn took %.1f ms (> %d) in %s" % (mt, o.max_turn_ms, mph))
        failed = True
    if o.no_leader_change and terms != term0:
        print("bench-scale: FAIL: the term moved from %d to %d" % (term0, terms))
        failed = True
    if failed:
        break
(lt, lph), snaps = logs()
if snaps:
    print("snapshots: %d; on the loop: max %.1f ms, mean %.1f ms; in all: max %d ms" % (
        len(snaps), max(s[1] for s in snaps) / 1000.0,
        sum(s[1] for s in snaps) / 1000.0 / len(snaps), max(s[0] for s in snaps)))
sys.exit(1 if failed else 0)
