#!/usr/bin/env python3
"""The driver of scripts/bench-scale.sh (which starts the cluster): loads it
step by step with `tierkv bench --sequential` and prints a row per step from
the bench's JSON line, the nodes' /metrics and their log lines; then (with
--catchup N) stops a follower, writes N more keys, restarts it and times its
catch-up; with --plot draws throughput and the longest loop turn per step
against keys. Exit 1 when a limit given (--max-turn-ms, --no-leader-change)
was passed, or on errors."""
import argparse, calendar, glob, json, os, re, signal, subprocess, sys, time
import urllib.request

ap = argparse.ArgumentParser()
for a in ("http-base", "entries", "value", "conn", "step", "max-turn-ms",
          "no-leader-change", "time-limit", "catchup", "steady", "rate", "stall-ms",
          "loop-nice"):
    ap.add_argument("--" + a, type=int, default=0)
ap.add_argument("--dir")
ap.add_argument("--cli")
ap.add_argument("--endpoints")
ap.add_argument("--plot")
ap.add_argument("--plotter")
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


def loop_nice(nid):
    """--loop-nice N (an experiment): node nid's loop thread at nice N."""
    if not o.loop_nice:
        return
    pid = open("%s/n%d.pid" % (o.dir, nid)).read().strip()
    for t in glob.glob("/proc/%s/task/*" % pid):
        try:
            if open(t + "/comm").read().startswith("tk-node"):
                os.setpriority(os.PRIO_PROCESS, int(os.path.basename(t)), o.loop_nice)
        except OSError as e:
            print("bench-scale: --loop-nice: %s" % e, file=sys.stderr)


for i in (1, 2, 3):
    loop_nice(i)

# The nodes' slow-turn warning: msg="slow loop turn" turn_ms=N ... phase=P (the
# phase most of the turn went to; its own share is not logged: the turn's).
turn_re = re.compile(r'msg="slow loop turn" turn_ms=(\d+)()\S* .*?\bphase=(\w+)')
ts_re = re.compile(r"ts=(\d+-\d+-\d+T\d+:\d+:\d+)\.(\d+)Z")


def log_turns(since, until, only=None):
    """Logged slow turns (ms, phase) between two wall-clock times, of every
    node or of the node ids in `only`."""
    out = []
    for f in glob.glob(o.dir + "/n*.log"):
        nid = int(re.search(r"n(\d+)\.log$", f).group(1))
        if only is not None and nid not in only:
            continue
        for line in open(f, errors="replace"):
            m, t = turn_re.search(line), ts_re.search(line)
            if not m or not t:
                continue
            at = calendar.timegm(time.strptime(t.group(1), "%Y-%m-%dT%H:%M:%S")) + \
                int(t.group(2)) / 1000.0
            if since <= at <= until:
                out.append((int(m.group(1)), m.group(3)))
    return out


def turn_hist(m):
    """{le: cumulative count} of tierkv_loop_turn_seconds."""
    h = {}
    for k, v in m.items():
        if k.startswith("tierkv_loop_turn_seconds_bucket{"):
            le = re.search(r'le="([^"]+)"', k).group(1)
            h[float("inf") if le == "+Inf" else float(le)] = v
    return h


def hist_bound_ms(before, after):
    """The smallest histogram bound (ms) that holds every loop turn between
    two readings of one node (0 if none)."""
    if not after:
        return 0.0
    total = after.get(float("inf"), 0) - before.get(float("inf"), 0)
    if total <= 0:
        return 0.0
    for le in sorted(after):
        if after[le] - before.get(le, 0) >= total:
            return le * 1000.0
    return float("inf")
snap_re = re.compile(r"snapshot at (\d+) .*: (\d+) ms in all, (\d+) us of it on the loop"
                     r"(?:.*; (\d+) us on the CPU)?(?:, (\d+) us waiting for a core)?")


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
                cpu = int(m.group(4)) if m.group(4) else -1
                wait = int(m.group(5)) if m.group(5) else 0
                t = ts_re.search(line)  # when its loop work ended (hiccups())
                snaps.append((int(m.group(2)), int(m.group(3)), cpu, wait,
                              t.groups() if t else None))
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


print("%9s %8s %7s %8s %7s %9s %-8s %9s %6s %9s %9s %s" % (
    "entries", "ops/s", "p99_ms", "p999_ms", "max_ms", "turn_ms", "phase", "step_turn",
    "lchg", "snap_ms", "snap_loop", "leader memory by owner"))
def bench_step(prefix, endpoints=None, keys=0):
    """One step of load: the bench's JSON result, or None on failure. With
    `keys`, writes overwrite random keys among the first `keys` of `prefix`
    (the steady state: the data stays the size it is); else each is a new
    key."""
    args = ["--keys", str(keys), "--key-prefix", prefix] if keys else [
        "--keys", str(max(o.entries, 1)), "--sequential", "--key-prefix", prefix]
    if keys and o.rate:
        args += ["--rate", str(o.rate)]  # the steady state at a set rate
    r = subprocess.run([o.cli, "--endpoints", endpoints or o.endpoints, "bench", "-c", str(o.conn),
                        "-d", "%ds" % o.step, "--warmup", "0", "--mix", "write",
                        "--value-size", str(o.value), "--no-progress",
                        "--slow-ms", str(SLOW_MS)] + args,
                       capture_output=True, text=True)
    js = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not js:
        print(r.stdout + r.stderr, file=sys.stderr)
        return None
    slow.extend(l for l in r.stderr.splitlines() if "slow:" in l)
    slow_all.extend(l for l in r.stderr.splitlines() if "slow:" in l)
    return json.loads(js[-1])


SLOW_MS = 100  # writes slower than this are listed with the time they were sent
slow = []  # the bench's lines for them, in order
slow_all = []  # every step's, for the machine's share (hiccups())
steady_tail = {"ops": 0}  # the steady steps' writes, and how many were over each bound


t_start = time.time()
failed = False
timed_out = False
applied = 0
step_no = 0
plot_rows = []  # (keys, ops/s, longest turn of the step in ms)
hists = [turn_hist(metrics(p)) for p in nodes]
first_keys = 0  # keys the first step wrote: the steady state overwrites them
steady_end = 0
while True:
    if applied >= o.entries and not steady_end:
        if not o.steady:
            break
        steady_end = time.time() + o.steady
        print("steady state: %d s of overwrites of random existing keys (s1/0..%d)%s" % (
            o.steady, first_keys - 1, ", %d writes/s" % o.rate if o.rate else ""),
            flush=True)
    if steady_end and time.time() >= steady_end:
        break
    step_no += 1
    if not steady_end and o.time_limit and time.time() - t_start > o.time_limit:
        print("bench-scale: time limit (%d s) reached at %d entries" % (o.time_limit, applied))
        timed_out = True
        break
    t0 = time.time()
    b = bench_step("s1/", keys=max(first_keys, 1)) if steady_end else bench_step("s%d/" % step_no)
    if b is None:
        failed = True
        break
    if step_no == 1:
        first_keys = int(b.get("ops_per_s", 0) * o.step * 0.9)
    ms = [metrics(p) for p in nodes]
    new_hists = [turn_hist(m) for m in ms]
    step_turn = max([hist_bound_ms(a, z) for a, z in zip(hists, new_hists)] +
                    [t for t, _ in log_turns(t0, time.time())])
    hists = new_hists
    lp, lm = leader()
    applied = int(lm.get("tierkv_raft_applied_index", applied))
    terms = max(m.get("tierkv_raft_term", 0) for m in ms)
    (lt, lph), snaps = logs()
    mt, mph = max_turn(ms)
    if lt > mt:
        mt, mph = lt, lph
    print("%9d %8.0f %7.2f %8.2f %7.1f %9.1f %-8s %9.1f %6d %9d %9.1f %s" % (
        applied, b.get("ops_per_s", 0), b.get("p99_ms", 0), b.get("p999_ms", 0),
        b.get("max_ms", 0), mt, mph, step_turn, terms - term0, sum(s[0] for s in snaps),
        sum(s[1] for s in snaps) / 1000.0, mem(lm)), flush=True)
    plot_rows.append((applied, b.get("ops_per_s", 0), step_turn))
    for l in slow:
        print("  " + l[l.find("slow:"):])
    del slow[:]
    if steady_end:
        steady_tail["ops"] += b.get("ops", 0)
        steady_tail["max"] = max(steady_tail.get("max", 0), b.get("max_ms", 0))
        for k, v in b.get("over_ms", {}).items():
            steady_tail[k] = steady_tail.get(k, 0) + v
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
if steady_tail["ops"]:
    # The tail of every steady write together: p99.9 <= X ms holds when at
    # most 0.1 % of them took longer than X.
    n = steady_tail["ops"]
    # The counts are the bench's histogram's: a write within 1.6 % over a
    # bound may not count (tk_hist_count_over); the max is exact.
    print("steady, all steps: %d writes; over 25 ms: %d (%.3f %%, p99.9 %s 25 ms); "
          "over 50 ms: %d; over 150 ms: %d; max %.1f ms" % (
              n, steady_tail.get("25", 0), 100.0 * steady_tail.get("25", 0) / n,
              "<=" if steady_tail.get("25", 0) <= n / 1000 else ">",
              steady_tail.get("50", 0), steady_tail.get("150", 0), steady_tail.get("max", 0)))
(lt, lph), snaps = logs()
if snaps:
    print("snapshots: %d; on the loop: max %.1f ms, mean %.1f ms (the loop thread's CPU "
          "in it: max %.1f ms; less its waits for a core: max %.1f ms); in all: max %d ms" % (
              len(snaps), max(s[1] for s in snaps) / 1000.0,
              sum(s[1] for s in snaps) / 1000.0 / len(snaps),
              max(s[2] for s in snaps) / 1000.0,
              max(max(s[1] - s[3], 0) for s in snaps) / 1000.0, max(s[0] for s in snaps)))

stall_re = re.compile(r"stall probe: the loop has been in one turn for (\d+) ms; "
                      r"thread state (\S), syscall: (\S+)[^;]*; wait channel: ([^;]*); "
                      r"kernel stack: (.*?)\"?$")


def stalls():
    """The stall probe's reports (--stall-probe-ms) of every node, counted by
    what the loop waited on: thread state, system call, wait channel and the
    kernel stack's first three frames; each with its longest report."""
    seen = {}
    for f in sorted(glob.glob(o.dir + "/n*.log")):
        for line in open(f, errors="replace"):
            m = stall_re.search(line)
            if not m:
                continue
            frames = " < ".join(m.group(5).split(" < ")[:3])
            k = (m.group(2), m.group(3), m.group(4), frames)
            n, longest = seen.get(k, (0, 0))
            seen[k] = (n + 1, max(longest, int(m.group(1))))
    return seen



def catchup():
    """Stops a follower, writes o.catchup keys, restarts it and times its
    catch-up. Returns False on a failure."""
    lp, lm = leader()
    if lp is None:
        print("bench-scale: catch-up: no leader")
        return False
    fid = next(i for i in (1, 2, 3) if o.http_base + i != lp)
    lid = lp - o.http_base
    pid = int(open("%s/n%d.pid" % (o.dir, fid)).read())
    term_a = max(metrics(p).get("tierkv_raft_term", 0) for p in nodes)
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    start = int(lm.get("tierkv_raft_applied_index", 0))
    print("catch-up: node %d stopped at about %d entries; writing %d keys" %
          (fid, start, o.catchup), flush=True)
    n = 0
    while True:
        lp, lm = leader()
        done = int(lm.get("tierkv_raft_applied_index", 0)) - start if lp else 0
        if done >= o.catchup:
            break
        n += 1
        up = ",".join("127.0.0.1:%d" % p for p in nodes if p != o.http_base + fid)
        if bench_step("c%d/" % n, up) is None:
            return False
    lp, lm = leader()
    target = int(lm.get("tierkv_raft_applied_index", 0))
    h0 = turn_hist(lm)
    t0 = time.time()
    subprocess.Popen(["bash", "%s/n%d.sh" % (o.dir, fid)])
    fport = o.http_base + fid
    caught = None
    while time.time() - t0 < 1800:
        if metrics(fport).get("tierkv_raft_applied_index", 0) >= target:
            caught = time.time() - t0
            break
        time.sleep(0.05)
    t1 = time.time()
    lm2 = metrics(lp)
    lead_turn = max([hist_bound_ms(h0, turn_hist(lm2))] +
                    [t for t, _ in log_turns(t0, t1, only={lid})])
    fol_turn = max([t for t, _ in log_turns(t0, t1, only={fid})] + [0])
    term_b = max(metrics(p).get("tierkv_raft_term", 0) for p in nodes)
    inst = [l.strip() for l in open("%s/n%d.log" % (o.dir, fid), errors="replace")
            if "installed the snapshot" in l]
    print("| follower behind (entries) | catch-up s | leader's longest turn meanwhile ms | "
          "follower's longest logged turn ms | leader changes |")
    print("|---|---|---|---|---|")
    print("| %d | %s | %.1f | %s | %d |" % (
        target - start, "%.1f" % caught if caught is not None else "not in 1800 s",
        lead_turn, fol_turn if fol_turn else "none over 100", term_b - term_a))
    for l in inst[-2:]:
        print("follower: " + l[l.find("msg="):])
    return caught is not None


if o.catchup and not failed and not timed_out:
    failed = not catchup()

st = stalls()
if st:
    print("stall probe: %d reports of a loop turn still running after %s ms or more, "
          "by what the loop waited on:" % (sum(v[0] for v in st.values()), o.stall_ms))
    print("| reports | longest ms | state | syscall | wait channel | kernel stack |")
    print("|---:|---:|---|---|---|---|")
    for k, v in sorted(st.items(), key=lambda kv: -kv[1][0]):
        print("| %d | %d | %s | %s | %s | %s |" % (v[0], v[1], k[0], k[1], k[2], k[3]))


def wall(date, frac):
    return calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac)


def overlap(a0, a1, gaps):
    """The ms of hiccups (per CPU) inside [a0, a1]: the larger CPU's sum."""
    per = {}
    for cpu, end, ms in gaps:
        lo, hi = max(a0, end - ms / 1000.0), min(a1, end)
        if hi > lo:
            per[cpu] = per.get(cpu, 0.0) + (hi - lo) * 1000.0
    return max(per.values()) if per else 0.0


gap_re = re.compile(r"gap cpu=(\d+) end=([\d.]+) ms=([\d.]+) steal_ms=(\d+)")
slow_re = re.compile(r"slow: ([\d.]+) ms, a write sent at (\S+)T(\S+)\.(\d+)Z")
vm_re = re.compile(r"vm end=([\d.]+) allocstall=(\d+) compact_stall=(\d+) pgscan_direct=(\d+)")
turn_at_re = re.compile(r'msg="slow loop turn" turn_ms=(\d+) .*?\bphase=(\w+) cpu_ms=(\d+)'
                        r"(?:.*?\bwait_ms=(\d+))?")


def hiccups():
    """The machine's share (scripts/hiccup.py beside the run, $dir/hiccup.log):
    how many loop turns over 50 ms and writes over 150 ms would have been
    under those bounds without the time the machine ran nothing."""
    try:
        lines = open(o.dir + "/hiccup.log").read().splitlines()
    except OSError:
        return
    head = [l for l in lines if l.startswith("hiccup:")]
    gaps, steal = [], 0
    for m in gap_re.finditer("\n".join(lines)):
        gaps.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
        steal += int(m.group(4))
    print("machine hiccups (scripts/hiccup.py: %s): %d logged, %d over 50 ms, "
          "longest %.0f ms; steal in them %d ms" % (
              head[0].split(" ", 2)[2] if head else "?", len(gaps),
              sum(1 for g in gaps if g[2] > 50), max([g[2] for g in gaps] + [0]), steal))
    # Direct reclaim and compaction: intervals of up to 100 ms (end, counts).
    vms = [(float(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)))
           for m in vm_re.finditer("\n".join(lines))]
    print("memory stalls (threads reclaiming or compacting before an allocation): "
          "%d direct reclaims, %d compactions, %d pages scanned, in %d of the 100 ms "
          "intervals" % (sum(v[1] for v in vms), sum(v[2] for v in vms),
                         sum(v[3] for v in vms), len(vms)))

    def stalls(a0, a1):
        return sum(v[1] + v[2] for v in vms if v[0] > a0 and v[0] - 0.1 < a1)
    # Each slow turn: its length, phase, CPU and run-queue wait (from the
    # log line: over a window at least the turn's), and the hiccups in it.
    turns = []
    for f in sorted(glob.glob(o.dir + "/n*.log")):
        for line in open(f, errors="replace"):
            m, t = turn_at_re.search(line), ts_re.search(line)
            if m and t and int(m.group(1)) > 50:
                end = wall(t.group(1), t.group(2))
                ms = int(m.group(1))
                turns.append((ms, m.group(2), int(m.group(3)), int(m.group(4) or 0),
                              overlap(end - ms / 1000.0, end, gaps),
                              stalls(end - ms / 1000.0, end)))
    machine = [t for t in turns if t[0] - t[4] <= 50]
    # The run-queue wait includes the machine's gaps that came while the
    # loop waited, so the two are not added: the larger counts.
    queued = [t for t in turns if t[0] - t[4] > 50 and t[0] - max(t[3], t[4]) <= 50]
    own = [t for t in turns if t[0] - max(t[3], t[4]) > 50]
    print("loop turns over 50 ms: %d; under 50 ms without the machine's hiccups in "
          "them: %d; under 50 ms without the time runnable waiting for a core (in the "
          "guest, or in those gaps): %d more; neither: %d" % (len(turns), len(machine), len(queued), len(own)))
    for ms, ph, cpu, wait, hic, st in sorted(own + queued, reverse=True)[:10]:
        print("  %d ms in %s: %d ms on the CPU, %d ms waiting for a core, %.0f ms of "
              "hiccups, %d memory stalls on the machine meanwhile" % (ms, ph, cpu, wait, hic, st))
    # Each snapshot's loop time, less the machine's hiccups inside it (the
    # guest counts a held virtual CPU as the running thread's CPU time).
    loop = []
    for _, us, cpu, wait, at in logs()[1]:  # the catch-up's too
        if at is not None:
            end = wall(*at)
            loop.append((us / 1000.0, overlap(end - us / 1e6, end, gaps),
                         max(cpu, 0) / 1000.0, wait / 1000.0))
    if loop:
        print("snapshots on the loop: max %.1f ms; less the machine's hiccups in them: "
              "max %.1f ms; over 5 ms: %d, of them still over 5 ms without the hiccups "
              "or the waits for a core: %d" % (
                  max(x[0] for x in loop), max(x[0] - x[1] for x in loop),
                  sum(1 for x in loop if x[0] > 5),
                  sum(1 for x in loop if x[0] - max(x[1], x[3]) > 5)))
        for ms, hic, cpu, wait in sorted(loop, reverse=True)[:3]:
            if ms > 5:
                print("  %.1f ms on the loop: %.1f ms on the CPU, %.1f ms waiting for a core, "
                      "%.1f ms of hiccups" % (ms, cpu, wait, hic))
    writes = []
    for l in slow_all:
        m = slow_re.search(l)
        if m and float(m.group(1)) > 150:
            at = wall(m.group(2) + "T" + m.group(3), m.group(4))
            ms = float(m.group(1))
            writes.append((ms, overlap(at, at + ms / 1000.0, gaps)))
    print("writes over 150 ms listed by the bench (up to 64 per thread and step): %d; "
          "with the hiccups inside them taken out, still over 150 ms: %d" % (
              len(writes), sum(1 for ms, h in writes if ms - h > 150)))


hiccups()


def plot():
    """Throughput and the longest loop turn of each step against keys."""
    spec = ["title tierkv scale: 3 nodes (fs store), %d B values, %d connections, "
            "one new key per write" % (o.value, o.conn),
            "panel 0 0 throughput|keys (millions)|writes/s",
            "panel 0 1 longest loop turn of the step (any node)|keys (millions)|ms",
            "series 0 writes/s"]
    spec += ["point %g %g" % (k / 1e6, v) for k, v, _ in plot_rows]
    spec += ["series 1 longest turn"]
    spec += ["point %g %g" % (k / 1e6, max(t, 0.01)) for k, _, t in plot_rows]
    spec += ["hline 1 200 election timeout", "hline 1 50 target"]
    r = subprocess.run([o.plotter, o.plot], input="\n".join(spec) + "\n", text=True)
    if r.returncode == 0:
        print("plot: " + o.plot)
    return r.returncode == 0


if o.plot and plot_rows and not plot():
    failed = True
sys.exit(1 if failed else 0)
