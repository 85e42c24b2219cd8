#!/usr/bin/env python3
"""clientv3's concurrency Mutex and Election on tierkvd (--listen-client,
etcdapi/) across processes, under leader kills (issue 50 item 4).

A 3-node cluster; 4 worker processes of etcd-client (mutex.go, `-mode mx`)
each loop: Lock a concurrency.Mutex, read /mx/counter, write it + 1 in a
Txn guarded by If(mutex.IsOwner()), Unlock. Beside them 3 campaigners
(Election.Campaign, two linearizable reads of the candidates a hold apart,
Resign), an observer (Election.Observe) and a process creating keys in
Txns (-role revisions). Meanwhile the leader is killed
(SIGKILL) 3 times and restarted from its data dir. Then, from every
worker's JSON lines and the counter's final value:

- the writes that applied (answered ok, or answered with an error and seen
  later by a reader or as the final value) wrote 1, 2, ..., final: each
  value once, each one after reading the write before it (no increment
  lost, none doubled: no two critical sections overlapped);
- their fencing revisions (the lock key's create revision, which IsOwner
  compares) strictly increase in the order of the values written;
- every worker wrote at least MIN_WRITES, and the leader changed;
- each Campaign that returned found its key the oldest candidate at its
  first read and still the oldest at its second (its term), when its key
  was there; the terms, ordered by their first read's revision, do not
  overlap (one's second read is below the next one's first) and their
  keys' create revisions increase; every campaigner led at least twice;
  the observer saw at least 3 leaders, their keys' create revisions never
  going back;
- a quiet part once the cluster is whole (QUIET_AFTER_KILL after the last
  kill): every worker and campaigner goes on, none of the Locks or
  Campaigns begun there fails, no fenced write is refused;
- a Txn that creates a key (Mutex.Lock's, with Range ops, and
  Election.Campaign's, without) answers with the key's create revision as
  its header's revision, which both take it for (etcdapi_kv.c answered the
  applied index by then, and Lock then waited on its own key).

    mutex_test.py TIERKVD ETCD_CLIENT [--unfenced | --unelected]
    (MX_KEEP=DIR: the workers' lines and the nodes' logs are copied there)

run.sh builds ETCD_CLIENT (`--script mutex_test.py`). The known-bad controls
(registered should_fail), with no kills: --unfenced, 4 workers that read
and write with no lock and no fence, in which the same checker must find
lost increments; --unelected, 3 campaigners that lead at once (put their
key, wait for none older to go), in which it must find a leader while an
older candidate's key was there or overlapping terms. A control exits 1
when the checker finds that, and 0 when it does not or the control failed
otherwise (a cluster that did not start, no progress), so that
should_fail reports it.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import tkcluster as tk  # noqa: E402

WORKERS = 4
CAMPAIGNERS = 3
KILLS = 3
MIN_WRITES = 5        # per worker, over the run
PROGRESS_AFTER = 10   # applied writes after each restart before the next kill
WAIT = 40             # seconds: any one wait for progress or a leader
# The quiet part begins this long after the last kill. A LeaseKeepAlive
# refresh in flight to the killed leader (forwarded by a follower) holds its
# stream's other refreshes until it ends: at its deadline,
# --request-timeout-ms (10 s), before node_forward.c ended a follower's
# writes parked for a leader once another leads (an election: 1-2 s here).
# 10 s plus the TTL (3 s), the bound before that change, stays as a margin.
QUIET_AFTER_KILL = 13
QUIET_EACH = 5        # applied writes per worker, terms per campaigner, in it


def cluster_on_low_ports(binary):
    """tk.Cluster with its Raft, HTTP and etcd ports below 32768."""
    c = tk.Cluster(binary, n=3, election_ticks=100)
    new = tk.low_ports(9)
    remap = {"127.0.0.1:%d" % p: "127.0.0.1:%d" % q
             for p, q in zip(c.raft_ports + c.http_ports, new)}

    def port_of(part):  # "127.0.0.1:P" or "ID=127.0.0.1:P"
        head, eq, addr = part.rpartition("=")
        return head + eq + remap.get(addr, addr)

    for nd in c.nodes:
        nd.args = [",".join(port_of(part) for part in a.split(",")) for a in nd.args]
    c.raft_ports, c.http_ports = new[:3], new[3:6]
    for nd, hp, cp in zip(c.nodes, new[3:6], new[6:9]):
        nd.http_port = hp
        nd.client_port = cp
        nd.args += ["--listen-client", "127.0.0.1:%d" % cp]
    return c


def read_lines(path):
    out = []
    try:
        with open(path) as f:
            for ln in f:
                if ln.endswith("\n"):
                    out.append(json.loads(ln))
    except FileNotFoundError:
        pass
    return out


class Run:
    def __init__(self, client, cluster, tmp):
        self.client, self.cluster, self.tmp = client, cluster, tmp
        self.stop = os.path.join(tmp, "stop")
        self.procs = {}  # name -> (Popen, out path)
        self.eps = ",".join("127.0.0.1:%d" % nd.client_port for nd in cluster.nodes)

    def spawn(self, name, role):
        out = os.path.join(self.tmp, name + ".jsonl")
        log = open(os.path.join(self.tmp, name + ".log"), "wb")
        p = subprocess.Popen([self.client, "-mode", "mx", "--", "-role", role,
                              "-endpoints", self.eps, "-id", name, "-out", out,
                              "-stop", self.stop, "-ttl", "3", "-max-seconds", "150"],
                             stdout=log, stderr=subprocess.STDOUT)
        log.close()
        tk._procs.append(p)
        self.procs[name] = (p, out)

    def records(self):
        return {name: read_lines(out) for name, (_, out) in self.procs.items()}

    def quiet_progress(self, t_ns):
        """Applied writes per mutex worker and terms per campaigner since t_ns."""
        out = {}
        for name, recs in self.records().items():
            if name.startswith("w"):
                out[name] = sum(1 for r in recs if r.get("ev") == "cs" and r["t"] >= t_ns
                                and r["outcome"] == "ok")
            elif name.startswith("c"):
                out[name] = sum(1 for r in recs if r.get("ev") == "term" and r["t"] >= t_ns)
        return out

    def writes_ok(self):
        """Writes answered ok, per mutex worker."""
        return {name: sum(1 for r in recs if r.get("ev") == "cs" and r["outcome"] == "ok")
                for name, recs in self.records().items() if name.startswith("w")}

    def wait_writes(self, least_each=0, least_total=0, timeout=WAIT):
        deadline = time.time() + timeout
        while True:
            ws = self.writes_ok()
            if min(ws.values()) >= least_each and sum(ws.values()) >= least_total:
                return sum(ws.values())
            for name, (p, _) in self.procs.items():
                tk.check(p.poll() is None, "worker %s exited (%s): %s" % (
                    name, p.returncode, self.log(name)))
            tk.check(time.time() < deadline, "no progress within %ds: applied writes %r" %
                     (timeout, ws))
            time.sleep(0.1)

    def log(self, name):
        with open(os.path.join(self.tmp, name + ".log"), "rb") as f:
            return f.read().decode(errors="replace")[-2000:]

    def finish(self):
        open(self.stop, "w").close()
        for name, (p, _) in self.procs.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                raise tk.Fail("worker %s did not stop within 30 s of the stop file" % name)
            tk.check(p.returncode == 0, "worker %s exited %d: %s" % (
                name, p.returncode, self.log(name)))


def final_counter(cluster):
    lead = cluster.wait_leader(timeout=WAIT)
    st, _, data = tk.request(cluster.node(lead).http_port, "GET", "/v1/kv/%2Fmx%2Fcounter?raw")
    tk.check(st in (200, 404), "reading the counter: %d %r" % (st, data[:200]))
    return data.decode() if st == 200 else ""


def check_mutex(recs, final):
    """The checker's findings: {"lost": [...], "fence": [...], "progress": [...]}
    (empty lists when all holds), and a summary line."""
    bad = {"lost": [], "fence": [], "progress": []}
    cs = [r for name in sorted(recs) if name.startswith("w") for r in recs[name]
          if r.get("ev") == "cs"]
    read_vals = {r["read"] for r in cs if r.get("read")}
    applied, ambiguous_in = [], 0
    for r in cs:
        if r["outcome"] == "ok":
            applied.append(r)
        elif r["outcome"] == "error" and (r["wrote"] in read_vals or r["wrote"] == final):
            applied.append(r)  # its answer was lost, but a reader saw it
            ambiguous_in += 1
    num = lambda v: int(v.split()[0]) if v else 0  # noqa: E731
    applied.sort(key=lambda r: num(r["wrote"]))
    by_val = {}
    for r in applied:
        by_val.setdefault(num(r["wrote"]), []).append(r)
    for v, rs in sorted(by_val.items()):
        if len(rs) > 1:
            bad["lost"].append("value %d written %d times: %s" % (
                v, len(rs), ", ".join("%s seq %d (read %r)" % (r["w"], r["seq"], r["read"])
                                      for r in rs)))
    fn = num(final)
    if fn != len(applied):
        bad["lost"].append("the final counter is %r but %d writes applied" % (final, len(applied)))
    want = set(range(1, fn + 1))
    if set(by_val) != want:
        bad["lost"].append("values written %s, not 1..%d" % (
            sorted(set(by_val) ^ want)[:10], fn))
    prev = ""
    for v in sorted(by_val):
        r = by_val[v][0]
        if len(by_val[v]) == 1 and r["read"] != prev:
            bad["lost"].append("value %d (%s seq %d) read %r, not the write before it %r" % (
                v, r["w"], r["seq"], r["read"], prev))
        prev = r["wrote"]
    if applied and final != applied[-1]["wrote"]:
        bad["lost"].append("final value %r is not the last applied write %r" % (
            final, applied[-1]["wrote"]))
    last = None
    for r in applied:
        if last is not None and r["fence"] <= last["fence"]:
            bad["fence"].append("fencing revision %d (%s seq %d, wrote %r) not above %d "
                                "(%s seq %d, wrote %r)" % (
                                    r["fence"], r["w"], r["seq"], r["wrote"], last["fence"],
                                    last["w"], last["seq"], last["wrote"]))
        last = r
    per = {name: sum(1 for r in applied if r["w"] == name) for name in recs
           if name.startswith("w")}
    for name, n in sorted(per.items()):
        if n < MIN_WRITES:
            bad["progress"].append("worker %s applied %d writes (< %d)" % (name, n, MIN_WRITES))
    outcomes = {}
    for r in cs:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    evs = {}
    for name in recs:
        if name.startswith("w"):
            for r in recs[name]:
                if r.get("ev") not in ("cs", "start", "end"):
                    evs[r["ev"]] = evs.get(r["ev"], 0) + 1
    summary = ("%d critical sections %s, %d applied (%d answered with an error), per worker %s; "
               "final %r; other events %s" % (len(cs), outcomes, len(applied), ambiguous_in,
                                              per, final, evs))
    return bad, summary


def check_election(recs):
    bad = []
    terms = [r for name in sorted(recs) if name.startswith("c") for r in recs[name]
             if r.get("ev") == "term"]
    started = [t for t in terms if not t["start_err"] and t["start_present"]]
    for t in started:
        if t["start_oldest"] != t["key"]:
            bad.append("%s seq %d: Campaign returned but %s is older than its key %s (rev %d)"
                       % (t["w"], t["seq"], t["start_oldest"], t["key"], t["start"]))
        if not t["end_err"] and t["end_present"] and t["end_oldest"] != t["key"]:
            bad.append("%s seq %d: at rev %d %s is older than its key %s" % (
                t["w"], t["seq"], t["end"], t["end_oldest"], t["key"]))
    full = sorted((t for t in started if not t["end_err"] and t["end_present"]),
                  key=lambda t: t["start"])
    for a, b in zip(full, full[1:]):
        if a["end"] >= b["start"]:
            bad.append("terms overlap: %s seq %d led over revs %d-%d, %s seq %d from %d" % (
                a["w"], a["seq"], a["start"], a["end"], b["w"], b["seq"], b["start"]))
    order = sorted(started, key=lambda t: t["start"])
    for a, b in zip(order, order[1:]):
        if b["crev"] <= a["crev"]:
            bad.append("leader keys' create revisions went back: %s seq %d (%d) then "
                       "%s seq %d (%d)" % (a["w"], a["seq"], a["crev"], b["w"], b["seq"],
                                           b["crev"]))
    per = {name: sum(1 for t in full if t["w"] == name) for name in recs
           if name.startswith("c")}
    for name, n in sorted(per.items()):
        if n < 2:
            bad.append("campaigner %s led %d times (< 2)" % (name, n))
    seen = [r for r in recs.get("obs", []) if r.get("ev") == "seen"]
    keys = []
    for s in seen:
        if keys and s["crev"] < keys[-1][1]:
            bad.append("the observer saw leader %s (create rev %d) after %s (%d)" % (
                s["key"], s["crev"], keys[-1][0], keys[-1][1]))
        if not keys or keys[-1][0] != s["key"] or keys[-1][1] != s["crev"]:
            keys.append((s["key"], s["crev"]))
    if len(keys) < 3:
        bad.append("the observer saw %d leaders (< 3)" % len(keys))
    summary = ("%d terms (%d confirmed at both reads, %d lost their key before the first), "
               "per campaigner %s; the observer saw %d leaders" % (
                   len(terms), len(full), len(terms) - len(started), per, len(keys)))
    return bad, summary


def check_revisions(recs):
    """The "rev" lines: a Txn that created a key answered with its create
    revision as the header's revision."""
    revs = [r for r in recs.get("rev", []) if r.get("ev") == "rev"]
    bad = ["%s (%s Range ops, member %x): header revision %d, create revision %d" % (
        r["key"], r["ranges"], r["member"], r["hdr"], r["crev"]) for r in revs
        if r["hdr"] != r["crev"]]
    if len(revs) < 50:
        bad.append("only %d Txns answered (< 50)" % len(revs))
    return bad, "%d key-creating Txns, %d answered another header revision" % (
        len(revs), sum(1 for r in revs if r["hdr"] != r["crev"]))


def check_quiet(recs, t_ns):
    """Once the cluster is whole again (from t_ns): no Lock or Campaign begun
    then failed, no fenced write was refused."""
    bad = []
    for name in sorted(recs):
        for r in recs[name]:
            ev = r.get("ev")
            if ev in ("lock-error", "campaign-error") and r["t"] - r["ms"] * 1000000 >= t_ns:
                bad.append("%s: %s after %d ms: %s" % (name, ev, r["ms"], r["err"]))
            elif ev == "cs" and r["outcome"] == "refused" and r["t"] >= t_ns:
                bad.append("%s seq %d: the fence refused the write (lock key %s, fence %d)" % (
                    name, r["seq"], r["key"], r["fence"]))
    return bad


def kill_leaders(run, cluster):
    """KILLS times: SIGKILL the leader, wait for another, let the workers go on
    with one node down, restart it, wait for progress. Returns the leaders
    seen in order and the time of the last kill."""
    leaders = [cluster.wait_leader(timeout=WAIT)]
    for k in range(KILLS):
        lead = leaders[-1]
        before = run.wait_writes()
        t0 = time.time()
        cluster.node(lead).kill()
        new = cluster.wait_leader(timeout=WAIT, exclude=(lead,))
        took = time.time() - t0
        down = run.wait_writes(least_total=before + 3)
        cluster.node(lead).start()
        after = run.wait_writes(least_total=down + PROGRESS_AFTER)
        leaders.append(cluster.wait_leader(timeout=WAIT))
        last_kill = t0
        print("     kill %d at %d: node %d killed, node %d led %.2f s later; applied writes "
              "%d before, %d with it down, %d after its restart" % (
                  k + 1, int(t0 * 1e9), lead, new, took, before, down, after), flush=True)
    return leaders, last_kill


def wait_each(run, least, what):
    """Until every mutex worker's applied writes and every campaigner's terms
    number `least`."""
    deadline = time.time() + WAIT
    while min(run.quiet_progress(0).values()) < least:
        tk.check(time.time() < deadline, "%s: progress %r within %ds" % (
            what, run.quiet_progress(0), WAIT))
        time.sleep(0.1)


def control(run, cluster, kind):
    """A known-bad control's run, no kills: True when the checker fails it
    for its reason (lost increments; a leader while an older candidate's key
    was there, or overlapping terms) and not for a lack of progress."""
    if kind == "unfenced":
        for i in range(WORKERS):
            run.spawn("w%d" % i, "unfenced")
        run.wait_writes(least_each=3, least_total=400)
    else:
        for i in range(CAMPAIGNERS):
            run.spawn("c%d" % i, "pretend")
        run.spawn("obs", "observe")
        wait_each(run, 10, "the pretending campaigners")
    run.finish()
    recs = run.records()
    if kind == "unfenced":
        bad, summary = check_mutex(recs, final_counter(cluster))
        found, progress = bad["lost"], not bad["progress"]
    else:
        bad, summary = check_election(recs)
        found = [m for m in bad if "older than its key" in m or "terms overlap" in m]
        progress = not [m for m in bad if m.startswith("campaigner")]
    print("     %s: %s" % (kind, summary), flush=True)
    for m in found[:5]:
        print("     found: " + m, flush=True)
    return bool(found) and progress


def leader_term(cluster):
    lead = cluster.wait_leader(timeout=WAIT)
    st = cluster.status(cluster.node(lead)) or {}
    return lead, st.get("term")


def quiet_part(run, cluster, last_kill):
    """The quiet part: the cluster whole, every session renewed since or gone;
    each worker and campaigner must go on there (none of its attempts failing:
    check_quiet). A leader change the test did not make (a loaded machine's
    late heartbeats) starts it again, twice at most. Returns its start."""
    for attempt in range(3):
        time.sleep(max(0, last_kill + QUIET_AFTER_KILL - time.time()))
        t_quiet = time.time_ns()
        before = leader_term(cluster)
        deadline = time.time() + WAIT
        while min(run.quiet_progress(t_quiet).values()) < QUIET_EACH:
            tk.check(time.time() < deadline, "quiet part: progress %r within %ds" % (
                run.quiet_progress(t_quiet), WAIT))
            time.sleep(0.1)
        after = leader_term(cluster)
        if after == before:
            print("ok   quiet part from %d: %r in %.1f s (leader %d, term %s)" % (
                t_quiet, run.quiet_progress(t_quiet), (time.time_ns() - t_quiet) / 1e9,
                after[0], after[1]), flush=True)
            return t_quiet
        print("     the leader changed during the quiet part (leader, term %r then %r): "
              "again" % (before, after), flush=True)
        last_kill = time.time()
    raise tk.Fail("the leader changed during each of 3 quiet parts")


def full(run, cluster, tmp):
    """The test: workers, campaigners, observer and the revisions process
    under KILLS leader kills, a quiet part, then every check."""
    for i in range(WORKERS):
        run.spawn("w%d" % i, "mutex")
    for i in range(CAMPAIGNERS):
        run.spawn("c%d" % i, "campaign")
    run.spawn("obs", "observe")
    run.spawn("rev", "revisions")
    t0 = time.time()
    run.wait_writes(least_each=3)
    print("ok   %d workers writing (%.1f s)" % (WORKERS, time.time() - t0), flush=True)
    leaders, last_kill = kill_leaders(run, cluster)
    t_quiet = quiet_part(run, cluster, last_kill)
    run.finish()
    final = final_counter(cluster)
    recs = run.records()
    if os.environ.get("MX_KEEP"):  # debugging: keep the workers' lines
        shutil.copytree(tmp, os.environ["MX_KEEP"], dirs_exist_ok=True)
        for nd in cluster.nodes:
            shutil.copy(os.path.join(cluster.dir, "n%d.log" % nd.id), os.environ["MX_KEEP"])
    bad, summary = check_mutex(recs, final)
    print("     mutex: " + summary, flush=True)
    changes = sum(1 for a, b in zip(leaders, leaders[1:]) if a != b)
    tk.check(changes >= 1, "the leader never changed: %r" % leaders)
    for kind, msgs in bad.items():
        tk.check(not msgs, "%s: %s" % (kind, "; ".join(msgs[:5])))
    print("ok   Mutex: one holder at a time over %d leader changes (leaders %s)" % (
        changes, leaders), flush=True)
    ebad, esummary = check_election(recs)
    print("     election: " + esummary, flush=True)
    tk.check(not ebad, "election: " + "; ".join(ebad[:5]))
    print("ok   Election: one leader at a time", flush=True)
    qbad = check_quiet(recs, t_quiet)
    tk.check(not qbad, "quiet part: " + "; ".join(qbad[:5]))
    print("ok   quiet part: no Lock or Campaign failed, no write refused", flush=True)
    rbad, rsummary = check_revisions(recs)
    print("     revisions: " + rsummary, flush=True)
    tk.check(not rbad, "a Txn's header revision: " + "; ".join(rbad[:5]))
    print("ok   a key-creating Txn answers its create revision", flush=True)


def main():
    binary, client = sys.argv[1], sys.argv[2]
    kind = ([a[2:] for a in sys.argv[3:] if a in ("--unfenced", "--unelected")] or [None])[0]
    os.environ.pop("MALLOC_PERTURB_", None)  # as etcd_test.py: the nodes without it
    t_start = time.time()
    cluster = None
    failed = 0
    expected = False  # a control failed for the checker's reason
    try:
        cluster = cluster_on_low_ports(binary)
        cluster.start()
        cluster.wait_leader(timeout=WAIT)
        tmp = tempfile.mkdtemp(prefix="mx-", dir=cluster.dir)
        run = Run(client, cluster, tmp)
        if kind is None:
            full(run, cluster, tmp)
        else:
            expected = control(run, cluster, kind)
            print("FAIL the %s control: %s" % (kind, "the checker found it out (the expected "
                  "failure)" if expected else "the checker found nothing, or the run "
                  "failed otherwise: exit 0"), flush=True)
        cluster.stop()
    except Exception as e:  # report, then the logs
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    print("     %.1f s in all" % (time.time() - t_start), flush=True)
    if kind is not None:
        sys.exit(1 if expected else 0)
    if cluster is None:
        sys.exit(failed)
    tk.finish(cluster, failed)


if __name__ == "__main__":
    main()
