#!/usr/bin/env python3
"""bench-backup.py: what an online backup costs (issue 17).

Starts three tierkvd on 127.0.0.1 (fs store, default flags) in a fresh
directory, loads KEYS keys of VALUE bytes with `tierkv bench --sequential`,
then alternates, RUNS times, a write load of D seconds alone and the same load
with `tierkv snapshot save` taken in its middle. It reports the backup's time,
size and rate, the write load's throughput and p99 with and without the backup
(medians over the runs, same minutes), the longest loop turn the nodes logged
during the backups, and the time to restore the file into a new one-node
cluster (tierkvd --restore until /readyz answers 200). A table, then one JSON
line.

usage: scripts/bench-backup.py [--build build] [--keys 1000000] [--value 100]
                               [--runs 3] [--duration 20] [--conn 16]
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--keys", type=int, default=1000000)
ap.add_argument("--value", type=int, default=100)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--duration", type=int, default=20)
ap.add_argument("--conn", type=int, default=16)
ap.add_argument("--keep", action="store_true")
o = ap.parse_args()
tierkvd = os.path.join(o.build, "cmd/tierkvd/tierkvd")
cli = os.path.join(o.build, "cmd/tierkv/tierkv")
d = tempfile.mkdtemp(prefix="tierkv-bench-backup-")
procs = []


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start(args, log):
    p = subprocess.Popen([tierkvd] + args, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def get(port, path, timeout=5):
    try:
        r = urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout)
        return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_ready(port, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if get(port, "/readyz", 1)[0] == 200:
            return time.time() - t0
        time.sleep(0.02)
    raise SystemExit("bench-backup: node on %d not ready in %d s (logs in %s)" % (port, timeout, d))


def applied(port):
    st, body = get(port, "/v1/cluster")
    return json.loads(body)["applied"] if st == 200 else 0


def bench(eps, args):
    r = subprocess.run([cli, "--endpoints", eps, "bench", "--no-progress", "--warmup", "0"] + args,
                       capture_output=True, text=True)
    js = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if not js:
        raise SystemExit("bench-backup: bench failed: %s %s" % (r.stdout, r.stderr))
    return json.loads(js[-1])


bucket_re = re.compile(r'^tierkv_loop_turn_seconds_bucket\{le="([^"]+)"\} (\d+)')


def turn_buckets(ports):
    """{(port, le): count} of every node's loop-turn histogram."""
    out = {}
    for p in ports:
        st, body = get(p, "/metrics")
        for line in body.decode(errors="replace").splitlines():
            m = bucket_re.match(line)
            if m:
                out[(p, m.group(1))] = int(m.group(2))
    return out


def longest_turn_ms(before, after):
    """Upper bound of the longest loop turn between two turn_buckets: the
    smallest bucket bound that holds every turn counted meanwhile."""
    worst = 0.0
    ports = {p for p, _ in after}
    for p in ports:
        les = sorted((le for q, le in after if q == p), key=lambda x: float(x))
        total = after[(p, "+Inf")] - before.get((p, "+Inf"), 0)
        for le in les:
            if after[(p, le)] - before.get((p, le), 0) >= total:
                worst = max(worst, float(le) * 1000)
                break
    return worst


def main():
    ports = free_ports(6)
    raft, http = ports[:3], ports[3:]
    members = ",".join("%d=127.0.0.1:%d" % (i + 1, raft[i]) for i in range(3))
    mhttp = ",".join("%d=127.0.0.1:%d" % (i + 1, http[i]) for i in range(3))
    eps = ",".join("127.0.0.1:%d" % p for p in http)
    for i in range(3):
        start(["--id", str(i + 1), "--members", members, "--members-http", mhttp,
               "--listen-http", "127.0.0.1:%d" % http[i], "--data-dir", "%s/n%d" % (d, i + 1),
               "--log-level", "warn"], "%s/n%d.log" % (d, i + 1))
    for p in http:
        wait_ready(p)
    t0 = time.time()
    step = 0
    while applied(http[0]) < o.keys:
        step += 1
        bench(eps, ["-c", "64", "-d", "10s", "--mix", "write", "--value-size", str(o.value),
                    "--keys", "100000000", "--sequential", "--key-prefix", "s%d/" % step])
    load_s = time.time() - t0
    print("loaded %d entries in %.0f s" % (applied(http[0]), load_s), flush=True)

    base, during, saves = [], [], []
    backup = os.path.join(d, "b.backup")
    # Overwrites of loaded keys (step 1's), so the key count stays put.
    load = ["-c", str(o.conn), "-d", "%ds" % o.duration, "--mix", "write",
            "--value-size", str(o.value), "--keys", str(min(o.keys, 100000)),
            "--key-prefix", "s1/"]
    for run in range(o.runs):
        b0 = turn_buckets(http)
        base.append(bench(eps, load))
        b1 = turn_buckets(http)
        base[-1]["turn_ms"] = longest_turn_ms(b0, b1)
        res = {}

        def save():
            time.sleep(o.duration / 4)
            t = time.time()
            r = subprocess.run([cli, "--endpoints", eps, "--json", "snapshot", "save", backup],
                               capture_output=True, text=True)
            res["s"] = time.time() - t
            res["t"] = (t, time.time())
            res["info"] = json.loads(r.stdout) if r.returncode == 0 else None
            res["err"] = r.stderr
        th = threading.Thread(target=save)
        th.start()
        during.append(bench(eps, load))
        th.join()
        b2 = turn_buckets(http)
        if res["info"] is None:
            raise SystemExit("bench-backup: save failed: %s" % res["err"])
        during[-1]["turn_ms"] = longest_turn_ms(b1, b2)
        saves.append((res["s"], res["info"]))
        print("run %d: backup %.2f s, %d keys, %.1f MiB; writes p99 %.2f ms alone, %.2f ms "
              "with the backup; longest loop turn <= %g ms alone, <= %g ms with it" % (
                  run + 1, res["s"], res["info"]["keys"], res["info"]["bytes"] / 2**20,
                  base[-1]["p99_ms"], during[-1]["p99_ms"], base[-1]["turn_ms"],
                  during[-1]["turn_ms"]), flush=True)

    # Restore into a new one-node cluster.
    rport, hport = free_ports(2)
    t = time.time()
    start(["--id", "1", "--members", "1=127.0.0.1:%d" % rport, "--listen-http",
           "127.0.0.1:%d" % hport, "--data-dir", os.path.join(d, "restored"),
           "--cluster-id", "2", "--restore", backup, "--log-level", "warn"],
          os.path.join(d, "restored.log"))
    wait_ready(hport, 600)
    restore_s = time.time() - t
    st, dg = get(hport, "/v1/debug/digest")

    med = statistics.median
    size = saves[-1][1]["bytes"]
    row = {
        "keys": saves[-1][1]["keys"], "value_bytes": o.value, "backup_bytes": size,
        "backup_s": med([s[0] for s in saves]),
        "backup_mib_per_s": size / 2**20 / med([s[0] for s in saves]),
        "restore_s": restore_s,
        "writes_alone_ops": med([b["ops_per_s"] for b in base]),
        "writes_alone_p99_ms": med([b["p99_ms"] for b in base]),
        "writes_during_ops": med([b["ops_per_s"] for b in during]),
        "writes_during_p99_ms": med([b["p99_ms"] for b in during]),
        "writes_during_max_ms": med([b["max_ms"] for b in during]),
        "loop_turn_ms_alone": max(b["turn_ms"] for b in base),
        "loop_turn_ms_during_backup": max(b["turn_ms"] for b in during),
        "runs": o.runs, "load_s": round(load_s),
    }
    print()
    print("| keys | backup | time (median) | rate | restore | writes alone ops/s, p99 |"
          " writes with a backup ops/s, p99, max | longest loop turn alone, with a backup |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("| %d | %.1f MiB | %.2f s | %.0f MiB/s | %.2f s | %.0f, %.2f ms | %.0f, %.2f ms, %.0f ms"
          " | <= %g ms, <= %g ms |" % (
              row["keys"], size / 2**20, row["backup_s"], row["backup_mib_per_s"], restore_s,
              row["writes_alone_ops"], row["writes_alone_p99_ms"], row["writes_during_ops"],
              row["writes_during_p99_ms"], row["writes_during_max_ms"],
              row["loop_turn_ms_alone"], row["loop_turn_ms_during_backup"]))
    print(json.dumps(row))


try:
    main()
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    if o.keep:
        print("bench-backup: data in %s" % d, file=sys.stderr)
    else:
        shutil.rmtree(d, ignore_errors=True)
