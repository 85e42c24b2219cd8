#!/usr/bin/env bash
# A/B of two build directories in the same minutes (issue 48 item 5, issue 52):
# each round runs, for A then B (B then A in even rounds), scripts/bench-http.sh's
# tierkv rows (three tierkvd, fs store, fsync on; one run of each row) and
# raft-perf-probe on each transport (memory store, its default shape); the
# figures of every run, then the medians per build and their spread (min-max),
# then one JSON line. CPU per put (three servers, from /proc) is the figure to
# compare on a busy machine; throughput moves by tens of percent from run to run.
#
# usage: scripts/bench-ab.sh build-a build-b
# env:   AB_RUNS (3), AB_ROWS ("put:1 put:64 get:64"), AB_DURATION (5s),
#        AB_PROBE_NETS ("inproc tcp"), AB_PROBE_SECONDS (5)
set -euo pipefail
a=${1:?usage: scripts/bench-ab.sh build-a build-b}
b=${2:?usage: scripts/bench-ab.sh build-a build-b}
runs=${AB_RUNS:-3}
rows=${AB_ROWS:-"put:1 put:64 get:64"}
dur=${AB_DURATION:-5s}
nets=${AB_PROBE_NETS:-"inproc tcp"}
secs=${AB_PROBE_SECONDS:-5}
here=$(cd "$(dirname "$0")" && pwd)
for d in "$a" "$b"; do
    for bin in cmd/tierkvd/tierkvd cmd/tierkv/tierkv cmd/raft-perf-probe/raft-perf-probe; do
        [ -x "$d/$bin" ] || { echo "bench-ab: $d/$bin is missing (build it first)" >&2; exit 2; }
    done
done
out=$(mktemp -d /tmp/tierkv-bench-ab.XXXXXX)
one() { # one() LABEL DIR ROUND: bench-http's rows, then the probes
    local label=$1 dir=$2 round=$3 tmp
    tmp=$(mktemp -d "$out/http.XXXXXX")
    BENCH_SYSTEMS=tierkv BENCH_RUNS=1 BENCH_ROWS="$rows" BENCH_DURATION="$dur" \
        BENCH_DIR="$tmp/run" bash "$here/bench-http.sh" "$dir" >"$tmp/log" 2>&1 ||
        { echo "bench-ab: bench-http.sh on $dir failed: $tmp/log" >&2; exit 1; }
    find "$tmp" -name results.jsonl -exec cat {} + |
        sed "s/^{/{\"ab\": \"$label\", \"round\": $round, /" >>"$out/http.jsonl"
    for net in $nets; do
        RAFT_PROBE_NET=$net RAFT_PROBE_SECONDS=$secs "$dir/cmd/raft-perf-probe/raft-perf-probe" \
            >"$tmp/probe-$net" 2>&1 ||
            { echo "bench-ab: raft-perf-probe ($net) on $dir failed" >&2; exit 1; }
        grep '^{"bench":"raft-probe"' "$tmp/probe-$net" | tail -1 |
            sed "s/^{/{\"ab\":\"$label\",\"round\":$round,/" >>"$out/probe.jsonl"
    done
}
for r in $(seq 1 "$runs"); do
    if [ $((r % 2)) -eq 1 ]; then one A "$a" "$r"; one B "$b" "$r"; else one B "$b" "$r"; one A "$a" "$r"; fi
    echo "bench-ab: round $r of $runs done" >&2
done
python3 - "$out" "$a" "$b" <<'PY'
import json, statistics, sys
out, a, b = sys.argv[1:4]
http = [json.loads(l) for l in open(out + "/http.jsonl")]
probe = [json.loads(l) for l in open(out + "/probe.jsonl")]
def med(xs):
    return statistics.median(xs) if xs else float("nan")
def cell(xs, fmt):
    if not xs:
        return "-"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (med(xs), min(xs), max(xs))
print("A = %s, B = %s; medians of %d rounds (min-max)" % (a, b, len({h["round"] for h in http})))
print()
print("| row | A ops/s | B ops/s | A CPU us/op (3 servers) | B CPU us/op | A p50 ms | B p50 ms | A p99 ms | B p99 ms |")
print("|---|---|---|---|---|---|---|---|---|")
summary = {"bench": "ab", "a": a, "b": b, "rows": {}, "probe": {}}
keys = sorted({(h["op"], h["connections"]) for h in http})
for op, conns in keys:
    g = {s: [h for h in http if h["ab"] == s and h["op"] == op and h["connections"] == conns]
         for s in "AB"}
    f = lambda s, k: [h[k] for h in g[s]]
    print("| %s %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        op, conns, cell(f("A", "ops_per_s"), "%.0f"), cell(f("B", "ops_per_s"), "%.0f"),
        cell(f("A", "cpu_us_per_op_total"), "%.1f"), cell(f("B", "cpu_us_per_op_total"), "%.1f"),
        cell(f("A", "p50_ms"), "%.3f"), cell(f("B", "p50_ms"), "%.3f"),
        cell(f("A", "p99_ms"), "%.2f"), cell(f("B", "p99_ms"), "%.2f")))
    summary["rows"]["%s:%d" % (op, conns)] = {
        s: {"ops_per_s": med(f(s, "ops_per_s")), "cpu_us_per_op": med(f(s, "cpu_us_per_op_total")),
            "p99_ms": med(f(s, "p99_ms"))} for s in "AB"}
print()
print("| raft-perf-probe | A sustained op/s | B sustained op/s | A serial p50 us | B serial p50 us | A alloc B/entry | B alloc B/entry |")
print("|---|---|---|---|---|---|---|")
for net in sorted({p["net"] for p in probe}):
    g = {s: [p for p in probe if p["ab"] == s and p["net"] == net] for s in "AB"}
    f = lambda s, k: [p[k] for p in g[s]]
    print("| %s | %s | %s | %s | %s | %s | %s |" % (
        net, cell(f("A", "sustained_ops_per_s"), "%.0f"), cell(f("B", "sustained_ops_per_s"), "%.0f"),
        cell(f("A", "serial_p50_us"), "%.1f"), cell(f("B", "serial_p50_us"), "%.1f"),
        cell(f("A", "alloc_bytes_per_entry"), "%.0f"), cell(f("B", "alloc_bytes_per_entry"), "%.0f")))
    summary["probe"][net] = {s: {"sustained_ops_per_s": med(f(s, "sustained_ops_per_s")),
                                 "serial_p50_us": med(f(s, "serial_p50_us"))} for s in "AB"}
print()
print(json.dumps(summary))
PY
echo "bench-ab: every run's JSON in $out" >&2
