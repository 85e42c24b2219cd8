#!/usr/bin/env python3
"""Write throughput and latency with and without watchers, in one run.

Three tierkvd (fs store) on loopback; `tierkv bench` writes to all three
nodes in phases, back to back on the same cluster:
  none     no watcher
  idle     1,000 watchers spread over the nodes on a prefix nobody writes
           (each still reads every event of the change log to filter it)
  stalled  100 watchers on the bench's own prefix whose clients never read
           (4 KiB receive buffers; each fills its watch buffer, waits
           --watch-stall-ms, then is cancelled as lagging)
  (idle and none alternate twice, and none ends the run: the machine's
  load drifts, so compare each row with its neighbours)
Prints a markdown table and one JSON line per phase.

usage: scripts/bench_watch.py [build-dir] [duration, default 5s] [connections, 32]
"""
import json
import os
import socket
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "integration"))
from tkcluster import Cluster  # noqa: E402


def open_watchers(C, n, query, read_headers, rcvbuf=0):
    socks = []
    for i in range(n):
        nd = C.nodes[i % len(C.nodes)]
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # a small window: the stall reaches the server soon
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(10)
        s.connect(("127.0.0.1", nd.http_port))
        s.sendall(b"GET /v1/watch?%s HTTP/1.1\r\n\r\n" % query.encode())
        socks.append(s)
    if read_headers:
        for s in socks:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += s.recv(4096)
            if not buf.startswith(b"HTTP/1.1 200"):
                raise SystemExit("watch refused: %r" % buf[:200])
    return socks


def metric(C, name):
    total = 0
    for nd in C.nodes:
        c = socket.create_connection(("127.0.0.1", nd.http_port), timeout=5)
        c.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        buf = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            buf += d
        c.close()
        for ln in buf.decode().splitlines():
            if ln.startswith(name + " "):
                total += float(ln.split()[1])
    return total


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    dur = sys.argv[2] if len(sys.argv) > 2 else "5s"
    conns = sys.argv[3] if len(sys.argv) > 3 else "32"
    C = Cluster(os.path.join(build, "cmd", "tierkvd", "tierkvd"), n=3)
    C.start()
    C.wait_leader()
    cli = os.path.join(build, "cmd", "tierkv", "tierkv")
    eps = ",".join("127.0.0.1:%d" % nd.http_port for nd in C.nodes)

    def bench():
        out = subprocess.run([cli, "-e", eps, "bench", "-c", conns, "-d", dur, "--json",
                              "--no-progress"], capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])

    rows = []
    rows.append(("none", 0, bench()))
    for rep in range(2):  # alternated: the machine's load drifts
        idle = open_watchers(C, 1000, "prefix=idle/&progress_ms=1000", True)
        rows.append(("idle", 1000, bench()))
        for s in idle:
            s.close()
        time.sleep(1)
        rows.append(("none", 0, bench()))
    stalled = open_watchers(C, 100, "prefix=bench/", False, rcvbuf=4096)
    rows.append(("stalled", 100, bench()))
    lagging = metric(C, "tierkv_watch_cancelled_lagging_total")
    for s in stalled:
        s.close()
    time.sleep(1)
    rows.append(("none", 0, bench()))
    C.stop()
    print("| watchers | n | ops/s | p50 ms | p99 ms | max ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for name, n, r in rows:
        print("| %s | %d | %.0f | %.3f | %.3f | %.3f | %d |" % (
            name, n, r["ops_per_s"], r["p50_ms"], r["p99_ms"], r["max_ms"], r["errors"]))
    print("stalled watchers cancelled as lagging: %d" % lagging)
    for name, n, r in rows:
        r["watchers"] = name
        r["n_watchers"] = n
        print(json.dumps(r))


if __name__ == "__main__":
    main()
