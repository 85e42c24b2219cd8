#!/usr/bin/env python3
"""clientbench's smoke test: scripts/bench-etcd/clientbench (etcd's own Go
client, built by build.sh) for 1 s each of put, linearizable get and
serializable get against a 3-node tierkvd with --listen-client; each run must
exit 0 with ops, no errors and a CPU per op for the three servers in its JSON
line. With --against-http the same client is pointed at the HTTP ports: it
must fail (the known-bad case; meson's should_fail).

    smoke.py SOURCE_DIR BUILD_DIR TIERKVD [--against-http]

Exit 77 (skip) only when `go` is not installed."""
import json
import os
import shutil
import subprocess
import sys

src, build, tierkvd = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(src, "tests", "integration"))
import tkcluster as tk  # noqa: E402


def main():
    if shutil.which("go") is None:
        print("go is not installed: skipped")
        sys.exit(77)
    cache = os.path.join(build, "bench-etcd")
    r = subprocess.run([os.path.join(src, "scripts", "bench-etcd", "build.sh"), "clientbench",
                        cache], timeout=600)
    if r.returncode != 0:
        print("FAIL build.sh clientbench exited %d" % r.returncode)
        sys.exit(1)
    bench = os.path.join(cache, "clientbench")
    os.environ.pop("MALLOC_PERTURB_", None)
    # A 1-2 s election timeout: the Go client runs flat out on the same 2 cores.
    cluster = tk.Cluster(tierkvd, n=3, election_ticks=100)
    cports = tk.free_ports(3)
    for nd, p in zip(cluster.nodes, cports):
        nd.args += ["--listen-client", "127.0.0.1:%d" % p]
    cluster.start()
    failed = 0
    try:
        cluster.wait_leader(timeout=20)
        pids = ",".join(str(nd.proc.pid) for nd in cluster.nodes)
        against_http = "--against-http" in sys.argv
        ports = [nd.http_port for nd in cluster.nodes] if against_http else cports
        eps = ",".join("127.0.0.1:%d" % p for p in ports)
        for mix in ("put", "get", "sget"):
            r = subprocess.run([bench, "-endpoints", eps, "-clients", "4", "-d", "1s",
                                "-warmup", "200ms", "-keys", "100", "-mix", mix,
                                "-timeout", "3s", "-cpu-pids", pids, "-json"],
                               capture_output=True, text=True, timeout=120)
            if against_http:
                print("clientbench %s against the HTTP ports exited %d: %s" % (
                    mix, r.returncode, r.stderr.strip()[-200:]), flush=True)
                cluster.stop()
                sys.exit(1 if r.returncode != 0 else 0)
            tk.check(r.returncode == 0, "clientbench %s exited %d: %s" % (
                mix, r.returncode, r.stderr.strip()[-300:]))
            line = json.loads(r.stdout.strip().splitlines()[-1])
            tk.check(line["bench"] == "clientv3" and line["ops"] > 0 and line["errors"] == 0,
                     "clientbench %s: %s" % (mix, line))
            tk.check(len(line["cpu_us_per_op"]) == 3 and line["cpu_us_per_op_total"] > 0,
                     "clientbench %s: no CPU per op: %s" % (mix, line))
            tk.check(0 < line["p50_ms"] <= line["p99_ms"], "clientbench %s: %s" % (mix, line))
            print("ok   %s: %.0f ops/s, p50 %.3f ms, p99 %.3f ms, %.1f us CPU per op" % (
                mix, line["ops_per_s"], line["p50_ms"], line["p99_ms"],
                line["cpu_us_per_op_total"]), flush=True)
        tk.check_graceful_stop(cluster)
    except Exception as e:  # report, then the logs
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    tk.finish(cluster, failed)


if __name__ == "__main__":
    main()
