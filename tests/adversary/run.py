#!/usr/bin/env python3
"""The adversarial suite (issue 48 item 4): each case starts a three-node
tierkvd cluster (tests/integration/tkcluster.py), measures a normal client
(load.normal_client: a PUT and a linearizable GET alternately, 50 a second, on
keep-alive connections) unloaded, then runs one hazard while the normal client
goes on, and asserts (checks.py):
  1. no leader change (each node's term and leader, before and after);
  2. no consensus-loop turn over 100 ms holding >= 20 ms of CPU (the
     tierkv_loop_turns_held_total metric when the node has it; until then
     the nodes' slow-turn warnings, which carry the turn's CPU time);
  3. the normal client's p99 under the hazard within max(10x unloaded, 20 ms);
  4. each tierkvd's VmRSS within the budget (512 MiB) all along;
  5. every write the normal client was answered 200 for is read back, with
     its value, from every node.

usage: run.py --binary build/cmd/tierkvd/tierkvd --case NAME [--case NAME ...]
              [--hazard-s 15] [--unloaded-s 6] [--rss-settle] [--list]
Exit 0 when every case passes every check, 1 otherwise. Prints a line of
figures per case (and the table of all cases at the end)."""
import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import checks  # noqa: E402
import load  # noqa: E402
import tkcluster  # noqa: E402

NORMAL_HZ = 50


# ---------------------------------------------------------------- the cluster

class Harness:
    def __init__(self, binary, tls=False, memory_budget=None):
        self.tmp = tempfile.mkdtemp(prefix="tierkv-adv-")
        self.ca = None
        # The nodes are told the budget the RSS check holds them to, so each
        # owner's limit (ring, change log, HTTP and watch buffers, the log's
        # payload, the blob cache) is sized from it (node/node_mem.h), as an
        # operator would run them; without it a node sizes them from a
        # quarter of the machine's memory (4 GiB here).
        extra = [] if memory_budget is None else ["--memory-budget", str(memory_budget)]
        if tls:
            self._make_certs()
            extra += ["--cert-file", self._f("srv.pem"), "--key-file", self._f("srv.key")]
        self.ctx = load.tls_client_ctx(self.ca)
        self.c = tkcluster.Cluster(binary, 3, extra_args=extra)
        self.c.start()

    def _f(self, n):
        return os.path.join(self.tmp, n)

    def _make_certs(self):
        def sh(*a):
            subprocess.run(list(a), check=True, capture_output=True, cwd=self.tmp, timeout=60)
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
           "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=advca")
        sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
           "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=statshost")
        with open(self._f("srv.ext"), "w") as f:
            f.write("subjectAltName=DNS:statshost,IP:127.0.0.1\n")
        sh("openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
           "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "srv.ext")
        self.ca = self._f("ca.pem")

    @property
    def ports(self):
        return [nd.http_port for nd in self.c.nodes]

    def port(self, nid):
        return self.c.node(nid).http_port

    def req(self, nid, method, path, body=None, headers=None, timeout=10):
        return load.request(self.port(nid), self.ctx, method, path, body, headers, timeout)

    def jreq(self, nid, method, path, obj=None, timeout=10):
        body = json.dumps(obj).encode() if obj is not None else None
        h = {"Content-Type": "application/json"} if obj is not None else {}
        st, data = self.req(nid, method, path, body, h, timeout)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            return st, None

    def status(self, nid, timeout=3):
        try:
            st, js = self.jreq(nid, "GET", "/v1/cluster", timeout=timeout)
            return js if st == 200 else None
        except (OSError, ssl.SSLError, Exception):
            return None

    def wait_leader(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            sts = [self.status(nd.id) for nd in self.c.nodes]
            if all(sts):
                leaders = {s["leader"] for s in sts}
                lead = [s["id"] for s in sts if s["role"] == "leader"]
                if len(leaders) == 1 and len(lead) == 1 and lead[0] in leaders:
                    return lead[0]
            time.sleep(0.05)
        raise tkcluster.Fail("no leader within %ss; logs in %s" % (timeout, self.c.dir))

    def views(self, timeout=20):
        """{node: (term, leader)}, each node polled until it answers (bounded)."""
        out = {}
        deadline = time.time() + timeout
        while time.time() < deadline and len(out) < 3:
            for nd in self.c.nodes:
                if nd.id not in out:
                    s = self.status(nd.id)
                    if s:
                        out[nd.id] = (s["term"], s["leader"])
            if len(out) < 3:
                time.sleep(0.1)
        return out

    def metrics(self, nid):
        try:
            st, data = self.req(nid, "GET", "/metrics", timeout=5)
        except Exception:
            return {}
        if st != 200:
            return {}
        out = {}
        for ln in data.decode("utf-8", "replace").splitlines():
            if not ln or ln.startswith("#"):
                continue
            k, _, v = ln.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
        return out

    def log_size(self, nid):
        try:
            return os.path.getsize(os.path.join(self.c.dir, "n%d.log" % nid))
        except OSError:
            return 0

    def log_since(self, nid, off):
        with open(os.path.join(self.c.dir, "n%d.log" % nid), "rb") as f:
            f.seek(off)
            return f.read().decode("utf-8", "replace")

    def batch_put(self, nid, items):
        """items: [(key, value str)], in batches of 128 ops."""
        for i in range(0, len(items), 128):
            ops = [{"op": "put", "key": k, "value": v} for k, v in items[i:i + 128]]
            st, js = self.jreq(nid, "POST", "/v1/batch", {"ops": ops}, timeout=30)
            tkcluster.check(st == 200, "preload batch: %s %r" % (st, js))

    def read_prefix(self, nid, prefix):
        """{key: value} under prefix from node nid (linearizable scans), or None."""
        out, start = {}, None
        for _ in range(1000):
            q = "/v1/kv?prefix=%s&limit=10000" % prefix
            if start is not None:
                q += "&start=" + urlquote(start)
            try:
                st, js = self.jreq(nid, "GET", q, timeout=15)
            except Exception:
                return None
            if st != 200:
                return None
            for it in js["items"]:
                out[it["key"]] = it["value"]
            if not js.get("more"):
                return out
            start = js["next"]
        return None

    def stop(self):
        try:
            self.c.stop()
        except Exception:
            pass
        shutil.rmtree(self.tmp, True)


def urlquote(s):
    from urllib.parse import quote
    return quote(s, safe="")


class RssSampler(threading.Thread):
    """VmRSS of each node every 0.2 s; peak() over the samples so far."""

    def __init__(self, h):
        super().__init__(daemon=True)
        self.pids = {nd.id: nd.proc.pid for nd in h.c.nodes}
        self.peaks = {n: 0 for n in self.pids}
        self.stop_ev = threading.Event()

    def sample(self):
        out = {}
        for n, pid in self.pids.items():
            try:
                with open("/proc/%d/status" % pid) as f:
                    for ln in f:
                        if ln.startswith("VmRSS:"):
                            out[n] = int(ln.split()[1]) * 1024
            except OSError:
                out[n] = None
        return out

    def run(self):
        while not self.stop_ev.is_set():
            for n, b in self.sample().items():
                if b is not None and b > self.peaks[n]:
                    self.peaks[n] = b
            self.stop_ev.wait(0.2)


# ---------------------------------------------------------------- the hazards
# Each hazard is a function run in processes of its own (niced +10, so that
# the load generator does not starve the nodes and the normal client of the
# two cores), until stop_ev; it fills `stats` (a Manager dict) with counts.

def hz_watchers(cfg, stop_ev, stats):
    """cfg: port (the watched node), n, start_revision, leader_port: n watches
    of prefix w/ from start_revision (the preloaded history) that never read,
    reopened when the server ends them; and a feeder writing 16 KiB values
    under w/ every 20 ms on the leader."""
    feed_stop = threading.Event()

    def feeder():
        ka = load.KeepAlive(cfg["leader_port"], None)
        v = os.urandom(8192).hex().encode()
        i = 0
        while not feed_stop.is_set():
            st, _ = ka.do("PUT", "/v1/kv/w/feed/%03d" % (i % 64), v)
            stats["feed_s%d" % st] = stats.get("feed_s%d" % st, 0) + 1
            i += 1
            feed_stop.wait(0.02)
        ka.close()

    t = threading.Thread(target=feeder, daemon=True)
    t.start()
    req = ("GET /v1/watch?prefix=w/&start_revision=%d HTTP/1.1\r\nHost: a\r\n\r\n"
           % cfg["start_revision"]).encode()
    load.hold_sockets(cfg["port"], cfg["n"], lambda i: req, stop_ev, stats)
    feed_stop.set()
    t.join(10)


def hz_scans(cfg, stop_ev, stats):
    """cfg: port, n: n connections each reading the whole s/ prefix (~12 MiB)
    over and over: one request for it all where the node answers a scan
    whole, or its pages in turn where the node pages scans (the next page's
    start stepped by cfg["step"] keys, about a page)."""
    step = cfg["step"]

    def req(i):
        if step >= 10000:
            return b"GET /v1/kv?prefix=s/&limit=10000 HTTP/1.1\r\nHost: a\r\n\r\n"
        return ("GET /v1/kv?prefix=s/&start=s/%05d&limit=10000 HTTP/1.1\r\nHost: a\r\n\r\n"
                % ((i * step) % 10000)).encode()

    load.request_loop(cfg["port"], cfg["n"], req, 1, stop_ev, stats)


def hz_bodies(cfg, stop_ev, stats):
    """cfg: ports, n: n clients posting ~4 MiB bodies: half a batch of four
    1,040,000-byte values (under the 4 MiB body limit), half a raw PUT of
    4 MiB + 64 KiB (over it: 413, connection closed)."""
    lock = threading.Lock()
    under = json.dumps({"ops": [{"op": "put", "key": "big/%d" % j, "value": "a" * 1040000}
                                for j in range(4)]}).encode()
    over = b"b" * ((4 << 20) + (64 << 10))

    def count(k):
        with lock:
            stats[k] = stats.get(k, 0) + 1

    def client(i):
        port = cfg["ports"][i % len(cfg["ports"])]
        ka = load.KeepAlive(port, None, timeout=30)
        while not stop_ev.is_set():
            if i % 2 == 0:
                st, _ = ka.do("POST", "/v1/batch", under, {"Content-Type": "application/json"})
                count("under_s%d" % st)
            else:
                st, _ = ka.do("PUT", "/v1/kv/bigover/%d" % i, over)
                count("over_s%d" % st)
        ka.close()

    ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(cfg["n"])]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    stats["body_under_bytes"] = len(under)
    stats["body_over_bytes"] = len(over)


def hz_tls(cfg, stop_ev, stats):
    """cfg: port (HTTPS), n: n connections that send a real ClientHello
    (two in three) or the first 60 bytes of one, and never go on; the ones
    the server closes are reopened every second."""
    hellos = []
    for _ in range(32):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        o = ctx.wrap_bio(inc, out, server_hostname="statshost")
        try:
            o.do_handshake()
        except ssl.SSLWantReadError:
            pass
        hellos.append(out.read())

    def first(i):
        h = hellos[i % len(hellos)]
        return h if i % 3 else h[:60]

    load.hold_sockets(cfg["port"], cfg["n"], first, stop_ev, stats)
    stats["hello_bytes"] = len(hellos[0])


def hz_idle(cfg, stop_ev, stats):
    """cfg: port, n: n connections that send nothing (this process's
    RLIMIT_NOFILE raised to its hard limit); closed ones reopened every 2 s."""
    stats["nofile"] = load.raise_nofile()
    load.hold_sockets(cfg["port"], cfg["n"], None, stop_ev, stats, recheck_s=2.0)


def hz_batches(cfg, stop_ev, stats):
    """cfg: ports: clients posting batches with as many ops as the 4 MiB body
    limit allows (~160k deletes: 413, over the 128-op limit), bodies of ops
    just over the body limit (413), and legal 128-op batches of small puts."""
    lock = threading.Lock()
    ops, size = [], 8
    while True:
        o = '{"op":"delete","key":"k%d"}' % len(ops)
        if size + len(o) + 1 > (4 << 20) - 1024:
            break
        ops.append(o)
        size += len(o) + 1
    big = ('{"ops":[' + ",".join(ops) + "]}").encode()
    more = ('{"ops":[' + ",".join(ops + ops[:2000]) + "]}").encode()
    stats["max_ops"] = len(ops)
    stats["max_ops_body_bytes"] = len(big)

    def count(k):
        with lock:
            stats[k] = stats.get(k, 0) + 1

    def client(i):
        port = cfg["ports"][i % len(cfg["ports"])]
        ka = load.KeepAlive(port, None, timeout=30)
        j = 0
        while not stop_ev.is_set():
            if i < 4:
                st, _ = ka.do("POST", "/v1/batch", big, {"Content-Type": "application/json"})
                count("maxops_s%d" % st)
            elif i < 6:
                st, _ = ka.do("POST", "/v1/batch", more, {"Content-Type": "application/json"})
                count("overbody_s%d" % st)
            else:
                b = json.dumps({"ops": [{"op": "put", "key": "b/%d/%d" % (i, k),
                                         "value": "x" * 100} for k in range(128)]}).encode()
                st, _ = ka.do("POST", "/v1/batch", b, {"Content-Type": "application/json"})
                count("ops128_s%d" % st)
            j += 1
        ka.close()

    ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)


def hz_linreads(cfg, stop_ev, stats):
    """cfg: port, n, depth: n connections each keeping `depth` linearizable
    GETs pipelined."""

    def req(i):
        return ("GET /v1/kv/lr/%03d?consistency=linearizable HTTP/1.1\r\nHost: a\r\n\r\n"
                % (i % 100)).encode()

    t0 = time.monotonic()
    load.request_loop(cfg["port"], cfg["n"], req, cfg["depth"], stop_ev, stats)
    stats["seconds"] = round(time.monotonic() - t0, 1)


# ---------------------------------------------------------------- the cases

def setup_watchers(h, lead):
    st = h.status(lead)
    rev = st["applied"] + 1
    h.batch_put(lead, [("w/%05d" % i, "h" * 4096) for i in range(1536)])
    return rev


def case_watchers(on_leader):
    def plan(h, lead):
        rev = setup_watchers(h, lead)
        nid = lead if on_leader else [n for n in (1, 2, 3) if n != lead][0]
        return [(hz_watchers, {"port": h.port(nid), "n": 300, "start_revision": rev,
                               "leader_port": h.port(lead)})], \
            "300 never-reading watches of w/ (6 MiB history + 16 KiB every 20 ms) on node %d" % nid
    return plan


def plan_scans(h, lead):
    val = "s" * 1150
    h.batch_put(lead, [("s/%05d" % i, val) for i in range(10000)])
    st, body = h.req(lead, "GET", "/v1/kv?prefix=s/&limit=10000", timeout=30)
    # A node that answers the scan in pages (more, next) is read page by page.
    what, step = "%d" % st, 10000
    if st == 200:
        js = json.loads(body)
        what = "%d keys, %.1f MiB" % (js["count"], len(body) / 1048576.0)
        if js.get("more"):
            step = max(1, js["count"])
            what += ", in pages"
    else:
        what += " " + body[:100].decode("utf-8", "replace")
    return [(hz_scans, {"port": h.port(lead), "n": 100, "step": step})], \
        "100 readers of a scan of 10000 keys x 1150 bytes (~12 MiB; the first answer: %s) " \
        "on the leader" % what


def plan_bodies(h, lead):
    return [(hz_bodies, {"ports": h.ports, "n": 16})], \
        "16 clients posting ~4 MiB bodies (8 under the limit, 8 over) to every node"


def plan_tls(h, lead):
    return [(hz_tls, {"port": h.port(lead), "n": 3000})], \
        "3000 half-open TLS handshakes on the leader"


def plan_idle(h, lead):
    # Two processes: this VM's hard RLIMIT_NOFILE (20000) is per process.
    n = 20000
    return [(hz_idle, {"port": h.port(lead), "n": n // 2}),
            (hz_idle, {"port": h.port(lead), "n": n - n // 2})], \
        "%d idle connections to the leader" % n


def plan_batches(h, lead):
    return [(hz_batches, {"ports": h.ports})], \
        "batches of as many ops as 4 MiB holds (413), over-limit bodies, 128-op batches"


def plan_linreads(h, lead):
    h.batch_put(lead, [("lr/%03d" % i, "r%d" % i) for i in range(100)])
    return [(hz_linreads, {"port": p, "n": 32, "depth": 8}) for p in h.ports], \
        "a flood of linearizable reads: 32 connections x 8 pipelined on each node"


CASES = {
    "watchers-leader": (case_watchers(True), False),
    "watchers-follower": (case_watchers(False), False),
    "scans": (plan_scans, False),
    "bodies": (plan_bodies, False),
    "tls-handshakes": (plan_tls, True),
    "idle-conns": (plan_idle, False),
    "batches": (plan_batches, False),
    "linearizable-reads": (plan_linreads, False),
}


# ---------------------------------------------------------------- one case

def run_case(name, args):
    plan, tls = CASES[name]
    t_case = time.time()
    h = Harness(args.binary, tls=tls,
                memory_budget=None if args.no_node_budget else args.memory_budget)
    res = {"case": name}
    procs = []
    try:
        lead = h.wait_leader()
        hazards, desc = plan(h, lead)
        res["hazard"] = desc
        print("== %s: %s (leader %d, logs in %s)" % (name, desc, lead, h.c.dir), flush=True)
        # Let the preload's turns end before the window the checks look at.
        h.wait_leader()
        rss = RssSampler(h)
        rss.start()
        before = h.views()
        m0 = {n: h.metrics(n) for n in (1, 2, 3)}
        logoff = {n: h.log_size(n) for n in (1, 2, 3)}

        stop_client = mp.Event()
        rx, tx = mp.Pipe(duplex=False)
        client = mp.Process(target=_client_main,
                            args=(h.ports, h.port(lead), h.ca, NORMAL_HZ, stop_client, tx))
        client.start()
        procs.append(client)
        time.sleep(args.unloaded_s)  # measuring: the unloaded phase's length
        t_h0 = time.monotonic()
        stop_hz = mp.Event()
        queues = []
        for fn, cfg in hazards:
            q = mp.Queue()
            p = mp.Process(target=_hazard_main, args=(fn, cfg, stop_hz, q))
            p.start()
            procs.append(p)
            queues.append(q)
        time.sleep(args.hazard_s)  # measuring: the loaded phase's length
        t_h1 = time.monotonic()
        stop_client.set()
        got = rx.recv() if rx.poll(30) else None
        client.join(10)
        stop_hz.set()
        res["stats"] = []
        for q in queues:
            try:
                res["stats"].append(q.get(timeout=90))
            except Exception:
                res["stats"].append({"error": "no figures from the hazard"})
        for p in procs[1:]:
            p.join(30)
            if p.is_alive():
                p.kill()
        after = h.views()
        m1 = {n: h.metrics(n) for n in (1, 2, 3)}
        res["gate"] = {k: sum(m1[n].get(k, 0) - m0[n].get(k, 0) for n in (1, 2, 3))
                       for k in ("tierkv_gate_held_total", "tierkv_gate_rests_total",
                                 "tierkv_gate_refused_total")}
        rss.stop_ev.set()
        rss.join(5)
        peaks = dict(rss.peaks)
        now_rss = rss.sample()

        results = []
        results.append(("leader",) + checks.check_leader(before, after))
        turns = {}
        for n in (1, 2, 3):
            t = checks.turns_from_metrics(m0[n], m1[n])
            if t is None:
                t = checks.turns_from_log(h.log_since(n, logoff[n]))
            t["gauge_max_wall_s"] = max(
                (v for k, v in m1[n].items() if k.startswith("tierkv_loop_turn_max_seconds")),
                default=None)
            t["hist_bound_s"] = hist_bound(m0[n], m1[n], "tierkv_loop_turn_seconds")
            turns[n] = t
        results.append(("turns",) + checks.check_turns(turns))
        if got is None:
            results.append(("p99", False, "the normal client sent no results"))
            results.append(("writes", False, "the normal client sent no results"))
        else:
            recs = got["records"]
            if args.dump_records:  # for reading: which requests make the tail
                wall = time.time() - time.monotonic()
                with open(args.dump_records, "a") as f:
                    for r in recs:
                        f.write(json.dumps({"case": name, "t": r[0] - t_h0, "lat": r[1],
                                            "wall": r[0] + wall,
                                            "kind": r[2], "status": r[3]}) + "\n")
            unloaded = [r[1] for r in recs if r[0] < t_h0]
            loaded = [r[1] for r in recs if t_h0 <= r[0] <= t_h1]
            errs = sum(1 for r in recs if r[3] != 200)
            ok, msg = checks.check_p99(unloaded, loaded,
                                       floor_s=args.p99_floor_ms / 1000.0)
            results.append(("p99", ok, msg + "; %d non-200 (of %d), %d connects"
                            % (errs, len(recs), got["reconnects"])))
            res["p99_unloaded"] = checks.percentile(unloaded, 99)
            res["p99_loaded"] = checks.percentile(loaded, 99)
            h.wait_leader(30)
            back = {n: h.read_prefix(n, "norm/") for n in (1, 2, 3)}
            results.append(("writes",) + checks.check_writes(got["acked"], back))
            res["acked"] = len(got["acked"])
        results.append(("rss",) + checks.check_rss(peaks, args.memory_budget))
        res["rss_peak"] = peaks
        res["rss_end"] = now_rss
        if args.rss_settle:
            time.sleep(60)  # measuring: the RSS a minute after the hazard
            res["rss_settled"] = rss.sample()
        res["turns"] = turns
        res["results"] = results
        res["leader_views"] = (before, after)
    except Exception as e:  # report and go on to the next case
        res["results"] = [("run", False, "%s: %s" % (type(e).__name__, e))]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        failed = not all(r[1] for r in res.get("results", [("run", False, "")]))
        if failed:
            for nd in h.c.nodes:
                lines = nd.log().splitlines()
                slow = [ln for ln in lines[:-12] if 'msg="slow loop turn"' in ln]
                tail = lines[-12:]
                print("--- node %d log (its slow-turn warnings before the last 12 lines: "
                      "%d; then the last %d lines)" % (nd.id, len(slow), len(tail)))
                print("\n".join(slow[-20:] + tail))
        h.stop()
    res["seconds"] = time.time() - t_case
    report(res)
    return res


def _client_main(*a):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    load.normal_client(*a)


def _hazard_main(fn, cfg, stop_ev, q):
    # (tkcluster's SIGTERM handler, inherited by fork, would kill the nodes.)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    load.nice(10)
    stats = {}
    fn(cfg, stop_ev, stats)
    q.put(stats)


def hist_bound(m0, m1, name):
    """The smallest bucket bound of histogram `name` holding every
    observation made between m0 and m1 (seconds; inf past the last finite
    bound; None when nothing was observed)."""
    total = m1.get(name + "_count", 0) - m0.get(name + "_count", 0)
    if total <= 0:
        return None
    bounds = []
    for k, v in m1.items():
        if k.startswith(name + "_bucket{"):
            le = k.split('le="', 1)[1].split('"', 1)[0]
            b = float("inf") if le == "+Inf" else float(le)
            bounds.append((b, v - m0.get(k, 0)))
    for b, grew in sorted(bounds):
        if grew >= total:
            return b
    return float("inf")


def fmt_ms(s):
    if s is None:
        return "-"
    if s == float("inf"):
        return "inf"
    return "%.0f" % (s * 1e3)


def report(res):
    for r in res.get("results", []):
        print("%s %-7s %s" % ("ok  " if r[1] else "FAIL", r[0], r[2]), flush=True)
    if "stats" in res:
        print("     hazard  %s" % "; ".join(
            ", ".join("%s=%s" % kv for kv in sorted(s.items())) for s in res["stats"]))
    if any(res.get("gate", {}).values()):
        print("     gate    %s (the leaders' large-write gate over the case)" % ", ".join(
            "%s %d" % (k[len("tierkv_gate_"):], v) for k, v in sorted(res["gate"].items())))
    if "rss_settled" in res:
        print("     rss a minute after: %s" % ", ".join(
            "n%d %s" % (n, checks._mib(b)) for n, b in sorted(res["rss_settled"].items())))
    print("     %.0f s" % res["seconds"], flush=True)


def row(res):
    ok = all(r[1] for r in res.get("results", [("run", False, "")]))
    turns = res.get("turns", {})
    bv = res.get("leader_views")
    changes = "-"
    if bv and bv[0]:
        # elections: how far the term moved (on the nodes that answered)
        changes = str(max((bv[1][n][0] - bv[0][n][0] for n in bv[0] if n in bv[1]),
                          default=0))
    wall = max((t["max_wall_s"] or 0 for t in turns.values()), default=None)
    hb = max((t["hist_bound_s"] or 0 for t in turns.values()), default=None)
    cpu = max((t["max_cpu_s"] or 0 for t in turns.values()), default=None)
    held = sum(t["held"] for t in turns.values())
    peaks = res.get("rss_peak", {})
    end = res.get("rss_settled", res.get("rss_end", {}))
    return ("%-19s %-4s %7s %11s %9s %8s %5s %9s %9s %8s %8s %6s %4.0f" % (
        res["case"] + (" (try %d)" % res["attempt"] if "attempt" in res else ""),
        "PASS" if ok else "FAIL", changes,
        "<=%s" % fmt_ms(hb) if hb is not None else "-",
        fmt_ms(wall) if wall else "none", fmt_ms(cpu) if cpu else "-", held,
        fmt_ms(res.get("p99_unloaded")), fmt_ms(res.get("p99_loaded")),
        max((b or 0) for b in peaks.values()) >> 20 if peaks else "-",
        max((b or 0) for b in end.values()) >> 20 if end else "-",
        res.get("acked", "-"), res["seconds"]))


HEADER = ("%-19s %-4s %7s %11s %9s %8s %5s %9s %9s %8s %8s %6s %4s" % (
    "case", "", "terms+", "turn-hist", "slow-wall", "slow-cpu", "held", "p99-unld",
    "p99-load", "rss-peak", "rss-end", "acked", "s"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=False)
    ap.add_argument("--case", action="append", default=[], choices=sorted(CASES) + ["all"])
    ap.add_argument("--unloaded-s", type=float, default=6.0)
    ap.add_argument("--hazard-s", type=float, default=15.0)
    # The bound is 10x the unloaded p99 (with a 20 ms floor); make test
    # passes a wider floor (tests/adversary/meson.build, README.md).
    ap.add_argument("--p99-floor-ms", type=float, default=checks.P99_FLOOR_S * 1000.0)
    ap.add_argument("--rss-settle", action="store_true",
                    help="also sample each node's RSS a minute after the hazard")
    ap.add_argument("--memory-budget", type=int, default=checks.RSS_BUDGET_BYTES,
                    help="RSS budget per node in bytes (default 512 MiB)")
    ap.add_argument("--no-node-budget", action="store_true",
                    help="start the nodes without --memory-budget (the known-bad control "
                    "for the RSS check: each node then sizes its owners from the machine)")
    ap.add_argument("--retry-timing", type=int, default=0, metavar="N",
                    help="run a case again, up to N times, when only its timing checks "
                    "(%s) failed; every attempt is printed" % ", ".join(checks.TIMING_CHECKS))
    ap.add_argument("--dump-records", metavar="PATH",
                    help="append the normal client's requests, one JSON line each")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    # meson sets MALLOC_PERTURB_ for every test: glibc then fills each block
    # malloc hands out and each it takes back, which makes resident pages the
    # node never touches (its watch buffers, freed and reused): with it the
    # same tierkvd measured 492-600 MiB on watchers-leader against 304-358
    # without. The RSS check is of the node's memory, not the debugging aid's,
    # so the nodes (they inherit this environment) run without it.
    os.environ.pop("MALLOC_PERTURB_", None)
    if args.list:
        print("\n".join(sorted(CASES)))
        return 0
    if not args.binary or not args.case:
        ap.error("--binary and --case are required")
    load.raise_nofile()
    names = sorted(CASES) if "all" in args.case else args.case
    results = []
    for n in names:
        res = run_case(n, args)
        for attempt in range(args.retry_timing):
            got = res.get("results", [("run", False, "")])
            if not checks.retry_wanted(got):
                break
            bad = [r[0] for r in got if not r[1]]
            print("%s: %s failed on attempt %d (above); the timing checks alone failed, "
                  "so the case runs again (--retry-timing %d)"
                  % (n, "/".join(bad), attempt + 1, args.retry_timing), flush=True)
            res = run_case(n, args)
            res["attempt"] = attempt + 2
        results.append(res)
    print()
    print("terms+: elections during the case (term after - before); turn-hist: the "
          "loop-turn histogram's bound over every turn of the case (ms); slow-wall/cpu: "
          "the longest slow-turn warning's wall and CPU (ms), or the gauges with the held-turn metrics; held: turns over "
          "100 ms with >= 20 ms CPU; p99 in ms; rss in MiB (end: after the hazard, or a "
          "minute after with --rss-settle)")
    print(HEADER)
    for r in results:
        print(row(r))
    return 0 if all(all(x[1] for x in r.get("results", [("run", False, "")]))
                    for r in results) else 1


if __name__ == "__main__":
    mp.set_start_method("fork")
    sys.exit(main())
