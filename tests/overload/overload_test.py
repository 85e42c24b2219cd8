#!/usr/bin/env python3
"""Overload suite (issue 19): hostile HTTP clients against a real three-node
tierkvd cluster on loopback, beside a normal client.

Usage: overload_test.py /path/to/tierkvd

Every case requires, while a normal client keeps writing and reading through
the leader:
  - no leader change (the term and the leader stay the same);
  - every request of the normal client answered (no timeouts, no 5xx);
  - no loop turn of 100 ms or more (half the lowest election timeout): the
    node logs "slow loop turn" turn_ms=N for each such turn, so none may appear;
  - every acknowledged write readable afterwards.
It prints (never asserts) the normal client's p99 without and with the
hostile client. Everything is bounded in time (a few minutes: loading 1M keys
takes most of it).
"""
import os
import re
import resource
import socket
import sys
import threading
import urllib.parse
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import tkcluster as tk  # noqa: E402
from tkcluster import check  # noqa: E402


class Normal:
    """A normal client: PUT then GET of its own keys, one at a time, on fresh
    connections to the leader, until stopped. Records every latency and every
    failure."""

    def __init__(self, port, tag):
        self.port = port
        self.tag = tag
        self.lat = []
        self.errors = []
        self.unavailable = []  # 503s: an election (timing, not correctness)
        self.acked = {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        i = 0
        while not self.stop.is_set():
            key, val = "%s-%d" % (self.tag, i), "v%d" % i
            for method, body in (("PUT", val), ("GET", None)):
                t0 = time.time()
                try:
                    st, _, data = tk.request(self.port, method, "/v1/kv/" + key, body,
                                             timeout=10)
                except (OSError, tk.http.client.HTTPException) as e:
                    self.errors.append("%s %s: %s" % (method, key, e))
                    continue
                self.lat.append(time.time() - t0)
                if st == 503:
                    self.unavailable.append("%s %s: %r" % (method, key, data[:120]))
                elif st != 200:
                    self.errors.append("%s %s: %d %r" % (method, key, st, data[:200]))
                elif method == "PUT":
                    self.acked[key] = val
            i += 1
            time.sleep(0.005)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(timeout=30)

    def p99_ms(self):
        if not self.lat:
            return float("nan")
        s = sorted(self.lat)
        return 1000 * s[min(len(s) - 1, int(len(s) * 0.99))]


def turn_cpu_ms(line):
    """The cpu_ms=N of a slow-turn log line (huge when absent)."""
    m = re.search(r"\bcpu_ms=(\d+)", line)
    return int(m.group(1)) if m else 1 << 30


def slow_turns(nd):
    """The node's slow-turn lines (msg="slow loop turn" turn_ms=N: it logs
    turns past half the election timeout) of turns over 100 ms."""
    out = []
    for ln in nd.log().splitlines():
        m = re.search(r'msg="slow loop turn" turn_ms=(\d+)', ln)
        if m and int(m.group(1)) > 100:
            out.append(ln)
    return out


class Timing(tk.Fail):
    pass


def guarded(cluster, name, hostile, tries=3, rss_slack=64):
    """Runs `hostile(leader_node)` beside a normal client and checks the
    invariants of the suite. The timing ones (no leader change, no loop turn
    over 100 ms) are about the machine too: on a loaded 2-core machine any
    turn can be late, so the case runs again (up to `tries` times) and fails
    only if every run breaks them. What hostile clients cause breaks them
    every time (a 1M-op batch: every run, about 0.9 s); correctness (every
    normal request answered, acknowledged writes readable) must hold in
    every run."""
    for i in range(tries):
        try:
            return guarded_once(cluster, name, hostile, rss_slack)
        except Timing as e:
            if i == tries - 1:
                raise
            print("     (%s: %s; running it again)" % (name, e), flush=True)


class Peak:
    """Samples a node's memory every 100 ms while in use: the peak VmRSS."""

    def __init__(self, nd):
        self.nd, self.peak, self.stop = nd, mem_mib(nd), threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(0.1):
            m = mem_mib(self.nd)
            if m["rss"] > self.peak["rss"]:
                self.peak = m

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(timeout=5)


def rss_problem(rss_slack, nd, m0, m1):
    """None when the memory after (m1) is within the bound of the memory
    before (m0), else why not. rss_slack: MiB of VmRSS, or a function of
    (nd, m0, m1) giving None or the reason."""
    if rss_slack is None:
        return None
    if callable(rss_slack):
        return rss_slack(nd, m0, m1)
    if m1["rss"] > m0["rss"] + rss_slack:
        return "RSS %.0f MiB, %.0f before (more than %s MiB above)" % (
            m1["rss"], m0["rss"], rss_slack)
    return None


def guarded_once(cluster, name, hostile, rss_slack):
    lead = cluster.wait_leader()
    nd = cluster.node(lead)
    term0 = cluster.status(nd)["term"]
    m0 = mem_mib(nd)
    slow0 = {n.id: len(slow_turns(n)) for n in cluster.nodes}
    with Normal(nd.http_port, name + "-base") as base:
        time.sleep(1.0)
    with Normal(nd.http_port, name) as normal, Peak(nd) as peak:
        time.sleep(0.3)
        t0 = time.time()
        hostile(nd)
        dt = time.time() - t0
        time.sleep(0.5)
    # Memory back within the bound once the hostile client left (freed
    # memory may take a moment to go back: a bounded poll).
    deadline = time.time() + 10
    m1 = mem_mib(nd)
    while rss_problem(rss_slack, nd, m0, m1) and time.time() < deadline:
        time.sleep(0.2)
        m1 = mem_mib(nd)
    why = rss_problem(rss_slack, nd, m0, m1)
    check(why is None, "leader memory after %s: %s" % (name, why))
    rss0, rss1 = m0["rss"], m1["rss"]
    st = cluster.status(nd)
    moved = not (st is not None and st["role"] == "leader" and st["term"] == term0)
    slow_all = [ln for n in cluster.nodes for ln in slow_turns(n)[slow0[n.id]:]]
    # A turn the node spent mostly off the CPU was the machine's doing (this
    # 2-core VM is shared: turns of 300 ms with 0 ms on the CPU happen with
    # no hostile client at all), not work a request made the loop do: only
    # turns with at least 20 ms on the CPU count; the others are printed.
    slow = [ln for ln in slow_all if turn_cpu_ms(ln) >= 20]
    descheduled = [ln for ln in slow_all if turn_cpu_ms(ln) < 20]
    if descheduled:
        print("     (%s: %d loop turns over 100 ms off the CPU, not counted: %s)" %
              (name, len(descheduled), descheduled[0][descheduled[0].find("msg="):]),
              flush=True)
    for c in (base, normal):
        check(not c.errors, "the normal client failed during %s: %s" %
              (name, c.errors[:3]))
        check(len(c.lat) > 0, "the normal client made no request during %s" % name)
    for key, val in list(normal.acked.items()) + list(base.acked.items()):
        s, _, data = tk.request(nd.http_port, "GET", "/v1/kv/" + key + "?raw")
        check(s == 200 and data == val.encode(),
              "acknowledged %s=%s reads %d %r" % (key, val, s, data[:80]))
    for c in (base, normal):
        if c.unavailable:
            raise Timing("the normal client got 503 during %s: %s" %
                         (name, c.unavailable[:2]))
    if moved:
        raise Timing("leadership moved during %s: leader %s term %s (term was %d); %s" %
                     (name, st and st["leader"], st and st["term"], term0, slow[:2]))
    if slow:
        raise Timing("a loop turn over 100 ms during %s: %s" % (name, slow[:2]))
    # The node's "slow loop turn" covers its own phases, not the gateway's
    # callbacks on the same loop: the normal client's slowest request bounds
    # what a hostile one held the loop for.
    print("     %-28s hostile %.3fs; normal p99 %.1f ms without, %.1f ms with, max "
          "%.1f ms with (%d and %d requests); leader RSS %.0f -> peak %.0f -> %.0f MiB "
          "(anon %.0f -> %.0f, file %.0f -> %.0f); term %d kept" %
          (name, dt, base.p99_ms(), normal.p99_ms(), 1000 * max(normal.lat),
           len(base.lat), len(normal.lat), rss0, peak.peak["rss"], rss1, m0["anon"],
           m1["anon"], m0["file"], m1["file"], term0), flush=True)


def send_all(port, data, timeout=10):
    """Sends data on a fresh connection; returns the first whole response."""
    return tk.raw(port, data, timeout=timeout)


def post(path, body, extra=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra +
            b"\r\n" + body)


def test_big_batch_is_refused_without_holding_the_loop(cluster):
    # 1M empty ops in about 3 MB: refused with 413 while scanning, not after
    # jansson built a million objects.
    body = b'{"ops":[' + b",".join([b"{}"] * 1000000) + b"]}"
    txn = b'{"then":[' + b",".join([b"{}"] * 1000000) + b"]}"
    junk = b'{"ops":[{"op":"delete","key":"a"}],"x":[' + b",".join([b"0"] * 1000000) + b"]}"
    times = []

    def hostile(nd):
        for path, b in ((b"/v1/batch", body), (b"/v1/txn", txn), (b"/v1/batch", junk)):
            t0 = time.time()
            resp = send_all(nd.http_port, post(path, b))
            times.append(time.time() - t0)
            check(tk.status_of(resp)[:1] in ([400], [413]),
                  "a %d-byte hostile %s answers %r" % (len(b), path, resp[:200]))
    guarded(cluster, "batch-1M-ops", hostile)
    print("     (3 MB bodies answered 413 in %s ms)" %
          ", ".join("%.1f" % (1000 * t) for t in times), flush=True)


def mem_mib(nd):
    """VmRSS and its parts: anonymous memory and file pages mapped (LMDB
    maps the cold tier's data file), in MiB."""
    out = {"rss": float("nan"), "anon": float("nan"), "file": float("nan")}
    names = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    try:
        with open("/proc/%d/status" % nd.proc.pid) as f:
            for ln in f:
                k = ln.split()[0] if ln.strip() else ""
                if k in names:
                    out[names[k]] = int(ln.split()[1]) / 1024.0
    except OSError:
        pass
    return out


def rss_mib(nd):
    return mem_mib(nd)["rss"]


def metric(nd, name):
    """The value of an unlabelled metric from /metrics."""
    st, _, data = tk.request(nd.http_port, "GET", "/metrics")
    check(st == 200, "metrics: %d" % st)
    for ln in data.decode().splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    raise tk.Fail("no %s in /metrics" % name)


def test_slow_readers_are_bounded_and_cut(cluster):
    # 8 clients pipeline 100 GETs of a 1 MiB value each and never read. The
    # write deadline here is the default (30 s): they are closed by us after
    # 3 s; what matters is the memory held meanwhile (max-pipeline answers a
    # connection, not 100) and the normal client.
    lead = cluster.wait_leader()
    nd = cluster.node(lead)
    st, _, _ = tk.request(nd.http_port, "PUT", "/v1/kv/ov-big", b"v" * (1 << 20))
    check(st == 200, "put of the 1 MiB value: %d" % st)
    rss = {}

    def hostile(nd):
        rss["before"] = rss_mib(nd)
        socks = []
        reqs = b"GET /v1/kv/ov-big?raw HTTP/1.1\r\n\r\n" * 100
        for _ in range(8):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", nd.http_port))
            s.sendall(reqs)
            socks.append(s)
        peak = 0.0
        t_end = time.time() + 3
        while time.time() < t_end:
            peak = max(peak, rss_mib(nd))
            time.sleep(0.1)
        rss["during"] = peak
        for s in socks:
            s.close()
    guarded(cluster, "slow-readers", hostile)
    time.sleep(1)
    rss["after"] = rss_mib(nd)
    print("     (leader RSS %.0f MiB before, %.0f peak during, %.0f after)" %
          (rss["before"], rss["during"], rss["after"]), flush=True)


def test_idle_and_stalled_connections(cluster):
    # 400 idle connections, 20 bodies announced at 4 MB and stalled after
    # 1 MB, 20 header blocks of 40 KB: the leader keeps leading and serving.
    def hostile(nd):
        socks = []
        for _ in range(400):
            socks.append(socket.create_connection(("127.0.0.1", nd.http_port)))
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", nd.http_port))
            s.sendall(b"PUT /v1/kv/stall HTTP/1.1\r\nContent-Length: 4000000\r\n\r\n" +
                      b"x" * 1000000)
            socks.append(s)
        for _ in range(20):
            resp = tk.raw(nd.http_port, b"GET /healthz HTTP/1.1\r\n" + b"a:b\r\n" * 8000 +
                          b"\r\n")
            check(tk.status_of(resp)[:1] == [431], "40 KB header block: %r" % resp[:100])
        time.sleep(1)
        for s in socks:
            s.close()
    guarded(cluster, "idle-and-stalled", hostile)


def turn_max_ms(nd):
    """The longest loop turn so far and its phase, from /metrics."""
    st, _, data = tk.request(nd.http_port, "GET", "/metrics")
    check(st == 200, "metrics: %d" % st)
    vals = [(1000 * float(ln.split()[-1]), ln.split('"')[1])
            for ln in data.decode().splitlines()
            if ln.startswith("tierkv_loop_turn_max_seconds{")]
    check(vals, "no tierkv_loop_turn_max_seconds in /metrics")
    return "%.1f ms (%s)" % max(vals)


def load_keys(port, prefix, n, threads=4):
    """Writes n small keys prefix%07d in batches of 128 from a few threads."""
    errs, retries = [], []

    def worker(t):
        for start in range(t * 128, n, threads * 128):
            ops = ",".join('{"op":"put","key":"%s%07d","value":"v"}' % (prefix, i)
                           for i in range(start, min(n, start + 128)))
            for attempt in range(100):
                st, _, data = tk.request(port, "POST", "/v1/batch", '{"ops":[%s]}' % ops,
                                         headers={"Content-Type": "application/json"},
                                         timeout=30)
                if st != 503:
                    break
                # Not applied (503): an election on the loaded machine while
                # loading (setup, not a measured case). Again, after a pause.
                retries.append(data[:80])
                time.sleep(0.2)
            if st != 200:
                errs.append("%d %r" % (st, data[:100]))
                return
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not errs, "loading %d keys: %s" % (n, errs[:2]))
    if retries:
        print("     (loading: %d batches answered 503 and were sent again: %s)" %
              (len(retries), retries[0]), flush=True)


def test_delete_and_scan_over_1m_keys(cluster):
    # DELETE /v1/kv?prefix= over 1M keys runs in steps of 1024 keys (each its
    # own entry); a scan over the 1M tombstones it leaves reads at most 16384
    # of them per call and says where to go on. Neither holds the loop.
    n = int(os.environ.get("TIERKV_OVERLOAD_KEYS", "1000000"))
    lead = cluster.wait_leader()
    nd = cluster.node(lead)
    t0 = time.time()
    load_keys(nd.http_port, "bulk/", n)
    print("     (loaded %d keys in %.1f s; longest loop turn so far %s)" %
          (n, time.time() - t0, turn_max_ms(nd)), flush=True)
    same_digests(cluster, n)
    out = {}

    def hostile(nd):
        # The digest of 1M keys goes in steps of 16384 (one read each), so it
        # is under the checks too (normal client, loop turns). The normal
        # client writes meanwhile, so the digest may start over up to 8 times
        # and answer 503 state_changing: either is right.
        t = time.time()
        st, _, data = tk.request(nd.http_port, "GET", "/v1/debug/digest", timeout=60)
        out["digest_s"] = time.time() - t
        out["digest"] = st if st == 200 else json_code(data)
        check(st == 200 or out["digest"] == "state_changing",
              "digest of %d keys: %d %r" % (n, st, data[:200]))
        t = time.time()
        st, _, data = tk.request(nd.http_port, "DELETE", "/v1/kv?prefix=bulk/", timeout=170)
        out["delete_s"] = time.time() - t
        js = tk.json.loads(data) if st == 200 else None
        check(js is not None and js["deleted"] == n, "delete of %d keys: %d %r" %
              (n, st, data[:200]))
        # Scan the tombstones: every call bounded, the chain ends, nothing live.
        calls, items, path, slowest = 0, 0, "/v1/kv?prefix=bulk/&limit=10000", 0.0
        while True:
            t = time.time()
            st, _, data = tk.request(nd.http_port, "GET", path, timeout=30)
            slowest = max(slowest, time.time() - t)
            check(st == 200, "scan over tombstones: %d %r" % (st, data[:200]))
            js = tk.json.loads(data)
            calls += 1
            items += js["count"]
            if not js["more"]:
                break
            check("next" in js, "more without next: %r" % js)
            path = "/v1/kv?prefix=bulk/&limit=10000&start=" + urllib.parse.quote(js["next"], safe="")
        out["scan"] = (calls, items, slowest)
        check(items == 0, "the scan found %d live keys after the delete" % items)
        # (The unit test kv-bounded checks the budget exactly; here a tier-down
        # may have dropped part of the tombstones, so the calls vary.)
    guarded(cluster, "delete-range-%d" % n, hostile, tries=1, rss_slack=cold_bound(out))
    m0, m1, cold = out["mem"]
    print("     (digest of %d keys under writes: %s in %.2f s; delete %.1f s; scan over the tombstones: "
          "%d calls, slowest %.1f ms; longest loop turn now %s; memory per deleted key: "
          "anon %+.0f B, file %+.0f B, the cold file %.0f MiB)" %
          (n, out["digest"], out["digest_s"], out["delete_s"], out["scan"][0], 1000 * out["scan"][2],
           turn_max_ms(nd), (m1["anon"] - m0["anon"]) * 1048576 / n,
           (m1["file"] - m0["file"]) * 1048576 / n, cold), flush=True)


def test_forward_burst_through_the_followers(cluster):
    # Large writes sent to the followers are forwarded to the leader on each
    # follower's Raft link, which also carries its Raft answers (append
    # responses: the leader's check-quorum counts them). Forwarded frames may
    # take only a quarter of that link's queue (transport/tcp.c), so Raft
    # messages are never refused for room nor behind more than 2 MiB of them
    # (the exact counts and heartbeat delays: the transport_tcp_forward unit
    # test). Here: no leader change, the normal client served, every write
    # answered 200 or 503 busy (a forward refused for room), nothing else.
    seconds = float(os.environ.get("TIERKV_OVERLOAD_FWD_SECONDS", "5"))
    val = "x" * (200 << 10)
    counts, errors = {}, []

    def burst(nd, seconds, writes):
        """8 clients PUT 200 KiB values through the followers for `seconds`,
        or until `writes` were answered 200."""
        counts.clear()
        followers = [f for f in cluster.nodes if f.id != nd.id]
        rx0 = metric(nd, "tierkv_transport_received_bytes_total")
        stop = time.time() + seconds

        def worker(f, t):
            i = 0
            while time.time() < stop and counts.get(200, 0) < writes:
                try:
                    st, _, data = tk.request(f.http_port, "PUT", "/v1/kv/fwd-%d-%d-%d" %
                                             (f.id, t, i % 50), val, timeout=30)
                except (OSError, tk.http.client.HTTPException) as e:
                    errors.append("%s" % e)
                    return
                key = st if st != 503 else json_code(data)
                counts[key] = counts.get(key, 0) + 1
                if st not in (200, 503) or (st == 503 and key != "busy"):
                    errors.append("%d %r" % (st, data[:120]))
                i += 1
        ts = [threading.Thread(target=worker, args=(f, t)) for f in followers
              for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        counts["mib"] = (metric(nd, "tierkv_transport_received_bytes_total") - rx0) / 1048576
        check(not errors, "forwarded writes failed: %s" % errors[:3])
        check(counts.get(200, 0) > 0, "no forwarded write went through: %r" % counts)
    # The warm-up brings the node's data structures to their working size
    # (1000 writes, 200 MiB: three snapshot intervals of 64 MiB): the ring at
    # its budget, the Raft log up to a snapshot interval and its trailing
    # window (at most --snapshot-bytes), LMDB's dirty-page free list. That is
    # data and configuration, not forwarding; the burst that counts comes
    # after, under the checks, and must leave nothing else behind.
    lead = cluster.node(cluster.wait_leader())
    w0 = mem_mib(lead)
    burst(lead, 120, 1000)
    w1 = mem_mib(lead)
    print("     (warm-up: %d writes answered 200, %d busy; leader RSS %.0f -> %.0f MiB, "
          "anon %.0f -> %.0f)" % (counts.get(200, 0), counts.get("busy", 0), w0["rss"],
                                  w1["rss"], w0["anon"], w1["anon"]), flush=True)
    out = {}
    guarded(cluster, "forward-burst", lambda nd: burst(nd, seconds, 1 << 30),
            rss_slack=cold_bound(out))
    print("     (%.0f s of 200 KiB PUTs through both followers, 4 clients each: %d "
          "answered 200, %d 503 busy; the leader received %.0f MiB from its peers; "
          "the cold file %.0f MiB)" % (seconds, counts.get(200, 0), counts.get("busy", 0),
                                       counts["mib"], out["mem"][2]), flush=True)


def json_code(data):
    try:
        return tk.json.loads(data)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "?"


def cold_bound(out):
    """A memory bound for cases that write data: back within 64 MiB, beyond
    the cold tier's data, bounded by its LMDB file (tierkv_kv_cold_bytes):
    LMDB maps the file (file pages: at most its size) and keeps a malloc'd
    copy of every page its largest write transaction (a tier-down) dirtied on
    a free list for the next one (anonymous: at most the file's size, a page
    being dirtied once per transaction; freed only when the environment
    closes). The tier-down scratch, the ring's pages past its budget and the
    Raft log past its trailing window go back, and so must everything else.
    Puts (m0, m1, cold MiB) into out["mem"]."""
    def bound(nd, m0, m1):
        cold = metric(nd, "tierkv_kv_cold_bytes") / 1048576.0
        out["mem"] = (m0, m1, cold)
        if m1["anon"] > m0["anon"] + 64 + cold:
            return "anonymous %.0f MiB, %.0f before: more than 64 MiB + the cold " \
                   "file's %.0f MiB above" % (m1["anon"], m0["anon"], cold)
        if m1["file"] > m0["file"] + cold + 8:
            return "file pages %.0f MiB, %.0f before: more than the cold file's %.0f " \
                   "MiB (+8) above" % (m1["file"], m0["file"], cold)
        return None
    return bound


def same_digests(cluster, n, timeout=60):
    """Every node's /v1/debug/digest, once they report the same applied
    index: equal. Prints how long each took (steps of 16384 keys)."""
    deadline = time.time() + timeout
    while True:
        got, times = [], []
        for nd in cluster.nodes:
            t = time.time()
            st, _, data = tk.request(nd.http_port, "GET", "/v1/debug/digest", timeout=60)
            times.append(time.time() - t)
            check(st in (200, 503), "digest: %d %r" % (st, data[:200]))
            got.append(tk.json.loads(data) if st == 200 else None)
        if all(got) and len({g["applied"] for g in got}) == 1:
            break
        check(time.time() < deadline, "no common applied index for digests: %r" % got)
        time.sleep(0.2)
    check(len({g["digest"] for g in got}) == 1, "replicas differ: %r" % got)
    print("     (digests of %d keys equal on every node at applied %d; %s s)" %
          (n, got[0]["applied"], ", ".join("%.2f" % t for t in times)), flush=True)


def test_descriptors_are_raised_and_reserved(binary):
    # A soft limit of 128 under a hard one of 1024: raised at start, and
    # --max-connections sized from it with a reserve (1024 - 256 = 768).
    port = tk.free_ports(1)[0]
    d = tk.tempfile.mkdtemp(prefix="tierkv-ov-")
    tk.atexit.register(tk.shutil.rmtree, d, True)
    log = open(os.path.join(d, "n.log"), "wb")
    p = tk.subprocess.Popen(
        [binary, "--store", "fs", "--data-dir", os.path.join(d, "data"),
         "--listen-http", "127.0.0.1:%d" % port, "--kv-no-sync"],
        stdout=log, stderr=tk.subprocess.STDOUT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, 1024)))
    tk._procs.append(p)
    log.close()
    try:
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                if tk.request(port, "GET", "/readyz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        text = open(os.path.join(d, "n.log")).read()
        check("nofile=1024 max_connections=768 reserve=256" in text,
              "descriptors not raised and sized: %s" % text[-600:])
        # More idle connections than the limit: the extra are refused (503),
        # storage keeps its descriptors; once they close, writes go on.
        socks = []
        for _ in range(900):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)
        for i in range(0, 200, 10):
            try:  # 503 too_many_connections, maybe closed before the body is sent
                st, _, data = tk.request(port, "PUT", "/v1/kv/fd-%d" % i, "x" * 1000)
            except (OSError, tk.http.client.HTTPException):
                continue
            # An idle connection gives way to the new one (issue 19): 200.
            check(st == 200, "a write with every slot taken by idle ones: %d %r" % (st, data))
        st, _, data = tk.request(port, "GET", "/metrics")
        ev = [ln for ln in data.decode().splitlines()
              if ln.startswith("tierkv_http_connections_evicted_total")]
        check(ev and float(ev[0].split()[-1]) >= 900 - 768,
              "idle connections not evicted at the limit: %r" % ev)
        print("     (%d idle connections over a limit of 768: %s)" % (len(socks), ev[0]),
              flush=True)
        for s in socks:
            s.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if tk.request(port, "PUT", "/v1/kv/after", "v", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        check(tk.request(port, "PUT", "/v1/kv/after", "v")[0] == 200,
              "a write after the connections closed failed")
        check(tk.request(port, "GET", "/readyz")[0] == 200, "/readyz not 200")
        check(p.poll() is None, "tierkvd exited")
    finally:
        p.kill()
        p.wait(timeout=10)


def settle(cluster, timeout=30):
    """Waits until the cluster serves: 20 writes and reads in a row answered
    200 by one leader (a fresh cluster may still hold an election or two)."""
    deadline = time.time() + timeout
    ok = 0
    while time.time() < deadline and ok < 20:
        lead = cluster.wait_leader()
        port = cluster.node(lead).http_port
        try:
            good = (tk.request(port, "PUT", "/v1/kv/settle", "x", timeout=5)[0] == 200 and
                    tk.request(port, "GET", "/v1/kv/settle", timeout=5)[0] == 200)
        except (OSError, tk.http.client.HTTPException):
            good = False
        ok = ok + 1 if good else 0
        if not good:
            time.sleep(0.1)
    check(ok >= 20, "the cluster did not settle within %ds" % timeout)


def main():
    binary = sys.argv[1]
    cluster = tk.Cluster(binary, 3)
    cluster.start()
    failed = 1
    try:
        settle(cluster)
        tests = [test_big_batch_is_refused_without_holding_the_loop,
                 test_slow_readers_are_bounded_and_cut,
                 test_idle_and_stalled_connections,
                 test_forward_burst_through_the_followers,
                 test_delete_and_scan_over_1m_keys]
        only = os.environ.get("TIERKV_OVERLOAD_ONLY")  # a name part, for a focused run
        failed = tk.run([t for t in tests if not only or only in t.__name__], cluster)
        if not only or only in "test_descriptors_are_raised_and_reserved":
            failed += tk.run([test_descriptors_are_raised_and_reserved], binary)
    finally:
        tk.finish(cluster, failed)


if __name__ == "__main__":
    main()
