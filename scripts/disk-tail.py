#!/usr/bin/env python3
"""disk-tail.py: the disk's own fsync tail, without tierkv (issue 22's floor).

Starts N writer processes (default 3, one per node of a local cluster), each
overwriting 4 KiB blocks of its own 16 MiB file, written and synced first (as
the fs store writes its zeroed-ahead segments), with fdatasync after each
write, paced to RATE syncs a second per writer (default 1000: a node's rate at
10,000 replicated writes/s). Nothing else runs, so every slow sync is the
disk's (or the host's behind it). Prints each writer's syncs and how many
took over 25, 50, 100 and 150 ms, the longest, the instants of the syncs over
100 ms (several writers at the same instant: the whole disk stalled), and one
JSON line.

usage: scripts/disk-tail.py [--writers N] [--rate R] [--seconds S] [--dir D]
"""
import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time

BLOCK = 4096
BLOCKS = 4096


def writer(path, rate, seconds, out):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    buf = b"\x01" * BLOCK
    for i in range(BLOCKS):
        os.pwrite(fd, buf, i * BLOCK)
    os.fsync(fd)
    lat = []
    slow = []
    period = 1.0 / rate if rate > 0 else 0.0
    t_end = time.monotonic() + seconds
    nxt = time.monotonic()
    n = 0
    while True:
        t0 = time.monotonic()
        if t0 >= t_end:
            break
        os.pwrite(fd, buf, (n % BLOCKS) * BLOCK)
        os.fdatasync(fd)
        d = time.monotonic() - t0
        lat.append(d)
        if d > 0.1:
            slow.append((time.time() - d, d))
        n += 1
        if period:
            nxt += period
            w = nxt - time.monotonic()
            if w > 0:
                time.sleep(w)
            else:
                nxt = time.monotonic()
    os.close(fd)
    os.unlink(path)
    lat.sort()
    out.put({
        "syncs": n,
        "p50_ms": lat[n // 2] * 1e3 if n else 0,
        "p999_ms": lat[n * 999 // 1000] * 1e3 if n else 0,
        "over25": sum(1 for x in lat if x > 0.025),
        "over50": sum(1 for x in lat if x > 0.05),
        "over100": sum(1 for x in lat if x > 0.1),
        "over150": sum(1 for x in lat if x > 0.15),
        "max_ms": lat[-1] * 1e3 if n else 0,
        "slow": slow,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="disk-tail.", dir=a.dir)
    q = mp.Queue()
    ps = [mp.Process(target=writer, args=(os.path.join(d, "w%d" % i), a.rate, a.seconds, q))
          for i in range(a.writers)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    os.rmdir(d)
    print("disk-tail: %d writers, %.0f fdatasyncs/s each, %.0f s, in %s" %
          (a.writers, a.rate, a.seconds, a.dir))
    print("| writer | syncs | p50 ms | p99.9 ms | over 25 ms | over 50 ms | over 100 ms | over 150 ms | max ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(res):
        print("| %d | %d | %.3f | %.2f | %d | %d | %d | %d | %.1f |" %
              (i + 1, r["syncs"], r["p50_ms"], r["p999_ms"], r["over25"], r["over50"],
               r["over100"], r["over150"], r["max_ms"]))
    instants = sorted({round(t, 1) for r in res for t, _ in r["slow"]})
    print("syncs over 100 ms began at (UTC): " + (", ".join(
        time.strftime("%H:%M:%S", time.gmtime(t)) + ("%.1f" % (t % 1))[1:] for t in instants)
        or "none"))
    syncs = sum(r["syncs"] for r in res)
    print(json.dumps({
        "bench": "disk-tail", "writers": a.writers, "rate": a.rate, "seconds": a.seconds,
        "syncs": syncs,
        "over25": sum(r["over25"] for r in res), "over50": sum(r["over50"] for r in res),
        "over100": sum(r["over100"] for r in res), "over150": sum(r["over150"] for r in res),
        "max_ms": round(max(r["max_ms"] for r in res), 1),
        "stall_instants_over100": len(instants),
    }))


if __name__ == "__main__":
    main()
