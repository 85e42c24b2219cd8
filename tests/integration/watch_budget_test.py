#!/usr/bin/env python3
"""Watches that never read are bounded all together, not only one by one.

One tierkvd (fs store). 150 watchers of every key open streams and never read
(a 4 KiB receive buffer each) while a writer puts 100 values of 60 KB: each watch
may hold --watch-buffer-bytes (1 MiB) that its client has not taken, and all
of them together 64 MiB (watch_total_bytes). Sampled every 50 ms during the
writes, the node's tierkv_watch_pending_bytes never passes 64 MiB plus one
pass's overshoot; past the total the watches holding the most are cut
`lagging` at once (tierkv_watch_cancelled_over_total_total), and their
connections close within the 2 s grace (the node's open watches go to 0
while the clients still read nothing). A normal client's reads and writes
keep working throughout; the loop's longest turn is reported. The known-bad
control: the same hazard on a node started with --watch-total-bytes 1G (the
total budget off) must break the bound and cut nothing over the total.

usage: watch_budget_test.py path/to/tierkvd
"""
import http.client
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, check, finish, jreq, request, run  # noqa: E402

C = None
WATCHERS = 150
TOTAL = 64 << 20
OVERSHOOT = 8 << 20  # a pass may pass the bound by one revision per watch
# Past what the kernel buffers for a watch (several MB), few enough that the
# change log (16 MiB with previous values) keeps them while the watches get them (the
# node gives watches at most a quarter of its loop: too many writes and the
# watches end `compacted` before they fill).
WRITES = 100


PORT = None


def port():
    return PORT


def metrics():
    st, _, body = request(port(), "GET", "/metrics", timeout=10)
    check(st == 200, "metrics: %s" % st)
    out = {}
    for ln in body.decode().splitlines():
        if ln and not ln.startswith("#"):
            name, _, val = ln.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def turn_max(m):
    return max((v for k, v in m.items() if k.startswith("tierkv_loop_turn_max_seconds")),
               default=0.0)


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) // 1024
    return 0


def hazard(pid):
    """The watches and the writes; returns the figures."""
    socks = []
    for _ in range(WATCHERS):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port()))
        s.sendall(b"GET /v1/watch?prefix= HTTP/1.1\r\n\r\n")
        socks.append(s)
    deadline = time.time() + 20
    while time.time() < deadline and metrics().get("tierkv_watchers", 0) < WATCHERS:
        time.sleep(0.05)
    check(metrics().get("tierkv_watchers", 0) == WATCHERS, "watchers did not all open")
    before = metrics()
    stop = threading.Event()
    peak = {"pending": 0.0, "rss": 0}

    def sampler():
        while not stop.is_set():
            try:
                m = metrics()
            except Exception:  # noqa: BLE001 - a slow answer is reported by the writer
                continue
            peak["pending"] = max(peak["pending"], m.get("tierkv_watch_pending_bytes", 0))
            peak["rss"] = max(peak["rss"], rss_mib(pid))
            time.sleep(0.05)

    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    big = "w" * 60000
    c = http.client.HTTPConnection("127.0.0.1", port(), timeout=10)
    worst = 0.0
    t0 = time.time()
    for i in range(WRITES):  # 6 MB of values, 900 MB to fan out to 150 watches
        a = time.time()
        c.request("PUT", "/v1/kv/wb/%d" % (i % 20), big)
        r = c.getresponse()
        r.read()
        worst = max(worst, time.time() - a)
        check(r.status == 200, "write %d: %d" % (i, r.status))
    c.close()
    dt = time.time() - t0
    # The cut watches' connections close within the grace although their
    # clients read nothing.
    deadline = time.time() + 60
    while time.time() < deadline and metrics().get("tierkv_watchers", 0) > 0:
        time.sleep(0.1)
    stop.set()
    t.join(5)
    after = metrics()
    cut = after.get("tierkv_watch_cancelled_over_total_total", 0) - before.get(
        "tierkv_watch_cancelled_over_total_total", 0)
    lag = after.get("tierkv_watch_cancelled_lagging_total", 0) - before.get(
        "tierkv_watch_cancelled_lagging_total", 0)
    print("    %d watches never reading, %d writes of 60 KB in %.2fs (slowest %.0f ms); "
          "pending peak %.1f MiB (bound %d MiB); cut over the total %d, lagging in all %d; "
          "open after %d; RSS peak %d MiB; longest loop turn %.0f ms" %
          (WATCHERS, WRITES, dt, worst * 1e3, peak["pending"] / 2**20, TOTAL >> 20, cut, lag,
           after.get("tierkv_watchers", 0), peak["rss"], turn_max(after) * 1e3), flush=True)
    st, _, js = jreq(port(), "GET", "/v1/kv/wb/1")
    check(st == 200, "read after: %s" % st)
    for s in socks:
        s.close()
    return peak["pending"], cut, after.get("tierkv_watchers", 0)


def test_watches_that_never_read_are_cut_at_the_total():
    global PORT
    PORT = C.node(1).http_port
    pending, cut, still_open = hazard(C.node(1).proc.pid)
    check(pending <= TOTAL + OVERSHOOT,
          "watches held %.1f MiB (bound %d MiB)" % (pending / 2**20, TOTAL >> 20))
    check(cut > 0, "no watch was cut over the total")
    check(still_open == 0, "%d watches still open" % still_open)


def test_control_without_the_total_breaks_the_bound():
    """The same hazard with the total budget off: the checks above must fail."""
    global PORT
    ctl = Cluster(sys.argv[1], 1, extra_args=["--watch-total-bytes", "1G"])
    ctl.start()
    try:
        ctl.wait_leader()
        PORT = ctl.node(1).http_port
        pending, cut, _ = hazard(ctl.node(1).proc.pid)
    finally:
        ctl.stop()
    check(pending > TOTAL + OVERSHOOT and cut == 0,
          "the control kept the bound (%.1f MiB held, %d cut): the test cannot fail"
          % (pending / 2**20, cut))


def main():
    global C
    C = Cluster(sys.argv[1], 1)
    C.start()
    C.wait_leader()
    failed = run([test_watches_that_never_read_are_cut_at_the_total,
                  test_control_without_the_total_breaks_the_bound])
    finish(C, failed)


if __name__ == "__main__":
    main()
