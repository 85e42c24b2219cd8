#!/usr/bin/env python3
"""Plots of the benchmark figures already in docs/ (never new numbers): reads
the tierkv bench table of docs/benchmarks.md and the store-bench output kept in
docs/benchmarks-store.md, and draws them with gnuplot (Debian gnuplot-nox)
as PNGs:

  http-put.png     HTTP puts on a 3-node cluster: throughput and p99 against
                   connections, tierkvd beside etcd, one run (benchmarks.md)
  store-batch.png  the fs store, 64 B entries: entries/s and p50 against batch
                   size, one appender (sync) and 64 in flight, with the
                   4 KiB append + fdatasync floor drawn (benchmarks-store.md)

usage: scripts/plot-benchmarks.py [--docs DIR] [--out DIR]
       (defaults: docs/ and docs/img/ of this tree). Fails when a table it
       reads is missing or changed shape, so the plots cannot go stale quietly.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def num(s):
    return float(s.replace(",", "").strip())


def http_rows(text):
    """From the first table of docs/benchmarks.md's "tierkv bench vs etcd"
    section (one run, both systems back to back): [(conns, tierkvd ops/s,
    tierkvd p99 ms, etcd ops/s, etcd p99 ms)] of the put rows."""
    section = text.split("## tierkv bench vs etcd", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0] == "put":
            rows.append((int(cells[1]), num(cells[2]), num(cells[4]), num(cells[5]),
                         num(cells[7])))
        elif rows and not line.startswith("|"):
            break
    return rows


def store_rows(text):
    """From the quiet-machine store-bench output: {mode: [(batch, entries/s,
    p50 us)]} for fs 64 B entries, and the floor's p50 in us."""
    block = text.split("## Quiet machine", 1)[1].split("```", 2)[1]
    floor = float(re.search(r"floor: 4 KiB append \+ fdatasync\s+p50 ([\d.]+) us", block).group(1))
    modes = {"1 (sync)": [], "64 inflight": []}
    for line in block.splitlines():
        m = re.match(r"fs\s+64\s+(\d+)\s+(1 \(sync\)|64 inflight)\s+(\d+)\s+[\d.]+\s+[\d.]+"
                     r"\s+([\d.]+)\s+([\d.]+)$", line.strip())
        if m:
            modes[m.group(2)].append((int(m.group(1)), int(m.group(3)), float(m.group(4))))
    return modes, floor


def write_dat(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(" ".join(str(x) for x in r) + "\n")


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script.encode(), check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    a = ap.parse_args()
    if not shutil.which("gnuplot"):
        print("plot-benchmarks: gnuplot not found (Debian: apt-get install gnuplot-nox)",
              file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="tierkv-plot-")
    try:
        http = http_rows(open(os.path.join(a.docs, "benchmarks.md")).read())
        if len(http) < 3:
            print("plot-benchmarks: benchmarks.md: no put rows in the tierkv bench table",
                  file=sys.stderr)
            return 1
        write_dat(os.path.join(tmp, "http.dat"), http)
        out = os.path.join(a.out, "http-put.png")
        gnuplot(f"""
set terminal pngcairo size 900,360 font ",10"
set output "{out}"
set multiplot layout 1,2 title "HTTP put, 3-node clusters, 64 B values, one run (docs/benchmarks.md, third session)"
set logscale x 2
set xlabel "connections"
set key top left
set grid
set ylabel "puts/s"
plot "{tmp}/http.dat" using 1:2 with linespoints lw 2 pt 7 title "tierkvd (fs store)", \\
     "{tmp}/http.dat" using 1:4 with linespoints lw 2 pt 5 title "etcd 3.4"
set ylabel "p99 latency (ms)"
plot "{tmp}/http.dat" using 1:3 with linespoints lw 2 pt 7 title "tierkvd (fs store)", \\
     "{tmp}/http.dat" using 1:5 with linespoints lw 2 pt 5 title "etcd 3.4"
unset multiplot
""")
        print("plot-benchmarks: %s (%d connection counts)" % (out, len(http)))

        store = open(os.path.join(a.docs, "benchmarks-store.md")).read()
        modes, floor = store_rows(store)
        if any(len(v) != 3 for v in modes.values()):
            print("plot-benchmarks: benchmarks-store.md: expected batches 1, 16, 256 for "
                  "both modes, got %r" % modes, file=sys.stderr)
            return 1
        write_dat(os.path.join(tmp, "sync.dat"), modes["1 (sync)"])
        write_dat(os.path.join(tmp, "inflight.dat"), modes["64 inflight"])
        out = os.path.join(a.out, "store-batch.png")
        gnuplot(f"""
set terminal pngcairo size 900,360 font ",10"
set output "{out}"
set multiplot layout 1,2 title "fs store, 64 B entries, fsync on (docs/benchmarks-store.md, quiet machine)"
set logscale xy
set xlabel "entries per batch"
set xrange [0.7:370]
set grid
set key top left
set ylabel "entries/s"
plot "{tmp}/sync.dat" using 1:2 with linespoints lw 2 pt 7 title "1 appender (sync)", \\
     "{tmp}/inflight.dat" using 1:2 with linespoints lw 2 pt 5 title "64 in flight"
set ylabel "append p50 (us)"
plot "{tmp}/sync.dat" using 1:3 with linespoints lw 2 pt 7 title "1 appender (sync)", \\
     "{tmp}/inflight.dat" using 1:3 with linespoints lw 2 pt 5 title "64 in flight", \\
     {floor} with lines dt 2 lw 2 lc rgb "#888888" title "floor: 4 KiB append + fdatasync p50"
unset multiplot
""")
        print("plot-benchmarks: %s (floor p50 %.1f us)" % (out, floor))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
