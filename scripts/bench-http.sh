#!/usr/bin/env bash
# tierkv against etcd through their HTTP/JSON gateways, in one run on this
# machine: three tierkvd (fs store, fsync on) and three etcd 3.4 (Debian's
# etcd-server, installed here if missing; it is not a project dependency) on
# loopback, driven by the same load generator (`tierkv bench`). For each row
# the two systems run back to back, so both see the same machine load.
#
# usage: scripts/bench-http.sh [--plot FILE.svg] [build-dir]   (default: build)
#        --plot draws throughput and p99 against connections, tierkvd beside
#        etcd, one line per op (through build-dir's cmd/benchplot/bench-plot)
# env:   BENCH_DURATION (5s), BENCH_RUNS (3: medians), BENCH_ROWS (the rows,
#        "op:conns ..."; default "put:1 put:16 put:64 put:256 get:64"),
#        BENCH_DIR (a scratch directory; default $TMPDIR or /tmp, named by the pid),
#        BENCH_SYSTEMS ("tierkv etcd"; "tierkv" alone skips etcd)
# Prints one table (markdown) and keeps every JSON line in $BENCH_DIR/results.jsonl.
set -uo pipefail

plot=""
if [ "${1:-}" = --plot ]; then
    [ -n "${2:-}" ] || { echo "bench-http: --plot wants a file name" >&2; exit 2; }
    plot=$2
    shift 2
fi
build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
dur=${BENCH_DURATION:-5s}
runs=${BENCH_RUNS:-3}
rows=${BENCH_ROWS:-"put:1 put:16 put:64 put:256 get:64"}
dir=${BENCH_DIR:-${TMPDIR:-/tmp}/tierkv-bench-http.$$}
mkdir -p "$dir" || exit 1
systems=${BENCH_SYSTEMS:-tierkv etcd}
with_etcd=0
case " $systems " in *" etcd "*) with_etcd=1 ;; esac
plotter="$build/cmd/benchplot/bench-plot"
[ -z "$plot" ] || [ -x "$plotter" ] || { echo "bench-http: $plotter not found" >&2; exit 1; }
for f in "$bin" "$cli"; do
    [ -x "$f" ] || { echo "bench-http: $f not found; build first (make build)" >&2; exit 1; }
done
if [ "$with_etcd" = 1 ] && ! command -v etcd >/dev/null; then
    echo "bench-http: installing etcd-server (for the comparison only)"
    { apt-get update -qq && apt-get install -y -qq etcd-server; } >"$dir/apt.log" 2>&1 ||
        { echo "bench-http: could not install etcd-server; see $dir/apt.log" >&2; exit 1; }
fi

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# tierkvd: raft 17101-17103, HTTP 17201-17203.
members="" mhttp="" tk_eps=""
for i in 1 2 3; do
    members+="${members:+,}$i=127.0.0.1:$((17100 + i))"
    mhttp+="${mhttp:+,}$i=127.0.0.1:$((17200 + i))"
    tk_eps+="${tk_eps:+,}127.0.0.1:$((17200 + i))"
done
for i in 1 2 3; do
    "$bin" --id "$i" --members "$members" --members-http "$mhttp" \
        --listen-http "127.0.0.1:$((17200 + i))" --data-dir "$dir/tk$i" --store fs \
        --log-level warn >"$dir/tk$i.log" 2>&1 &
    pids+=($!)
done
# etcd: clients 17301-17303, peers 17401-17403.
cluster="" et_eps=""
for i in 1 2 3; do
    cluster+="${cluster:+,}e$i=http://127.0.0.1:$((17400 + i))"
    et_eps+="${et_eps:+,}127.0.0.1:$((17300 + i))"
done
for i in 1 2 3; do
    [ "$with_etcd" = 1 ] || break
    ETCD_UNSUPPORTED_ARCH= etcd --name "e$i" --data-dir "$dir/etcd$i" \
        --listen-client-urls "http://127.0.0.1:$((17300 + i))" \
        --advertise-client-urls "http://127.0.0.1:$((17300 + i))" \
        --listen-peer-urls "http://127.0.0.1:$((17400 + i))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((17400 + i))" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --log-level error >"$dir/etcd$i.log" 2>&1 &
    pids+=($!)
done

wait_ready() { # url..., at most 30 s
    local deadline=$((SECONDS + 30)) u
    for u in "$@"; do
        until curl -fs -m 1 "$u" >/dev/null 2>&1; do
            if ((SECONDS > deadline)); then
                echo "bench-http: $u did not become ready; logs in $dir" >&2
                exit 1
            fi
            sleep 0.2
        done
    done
}
wait_ready http://127.0.0.1:17201/readyz http://127.0.0.1:17202/readyz \
    http://127.0.0.1:17203/readyz
[ "$with_etcd" = 1 ] && wait_ready http://127.0.0.1:17301/health \
    http://127.0.0.1:17302/health http://127.0.0.1:17303/health

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "bench-http: $(nproc) CPUs, load $(load), $runs run(s) of $dur per cell (medians);"
echo "  tierkvd $tk_eps"
[ "$with_etcd" = 1 ] && echo "  etcd $(etcd --version | head -1 | sed 's/.*: //') $et_eps"

results="$dir/results.jsonl"
: >"$results"
for row in $rows; do
    op=${row%%:*} c=${row##*:}
    mix=write
    [ "$op" = get ] && mix=read
    for sys in $systems; do
        eps=$tk_eps
        [ "$sys" = etcd ] && eps=$et_eps
        # A short warm-up creates the keys a read row reads.
        "$cli" -e "$eps" bench --protocol "$sys" -c "$c" -d "$dur" --warmup 1s \
            --value-size 64 --keys 10000 --mix "$mix" --runs "$runs" --json \
            2>"$dir/$sys-$op-$c.err" | grep '"bench":"http"' | tail -1 >>"$results" ||
            echo "bench-http: $sys $op c=$c failed; see $dir/$sys-$op-$c.err" >&2
    done
done
echo "  load at the end $(load)"

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by[(r["op"], r["connections"], r["protocol"])] = r
keys = []
for r in rows:
    k = (r["op"], r["connections"])
    if k not in keys:
        keys.append(k)
print()
print("| op | conns | tierkvd ops/s | p50 ms | p99 ms | etcd ops/s | p50 ms | p99 ms | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for op, c in keys:
    t, e = by.get((op, c, "tierkv")), by.get((op, c, "etcd"))
    def cells(r):
        if r is None:
            return ["-", "-", "-"]
        return ["{:,.0f}".format(r["ops_per_s"]), "%.3f" % r["p50_ms"], "%.3f" % r["p99_ms"]]
    ratio = "%.1fx" % (t["ops_per_s"] / e["ops_per_s"]) if t and e and e["ops_per_s"] else "-"
    name = "get (linearizable)" if op == "get" else op
    print("| %s | %d | %s | %s | %s |" % (name, c, " | ".join(cells(t)), " | ".join(cells(e)), ratio))
errs = sum(r.get("errors", 0) for r in rows)
print("\nerrors: %d in all rows" % errs)
PY
echo "JSON lines: $results"
[ -n "$plot" ] || exit 0

# The plot: bench-plot's statements from the JSON lines (cmd/benchplot/main.c).
python3 - "$results" "$runs" "$dur" <<'PY' >"$dir/plot.spec"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("title HTTP/JSON gateways, 3 nodes on loopback, 64 B values (%s runs of %s, medians)"
      % (sys.argv[2], sys.argv[3]))
print("panel 1 1 throughput|connections|ops/s")
print("panel 1 1 latency p99|connections|milliseconds")
names = {"tierkv": "tierkvd", "etcd": "etcd"}
for panel, field in ((0, "ops_per_s"), (1, "p99_ms")):
    seen = []
    for r in rows:
        k = (r["protocol"], r["op"])
        if k not in seen:
            seen.append(k)
    for proto, op in seen:
        print("series %d %s %s" % (panel, names.get(proto, proto),
                                  "get (linearizable)" if op == "get" else op))
        for r in sorted((r for r in rows if (r["protocol"], r["op"]) == (proto, op)),
                        key=lambda r: r["connections"]):
            print("point %d %g" % (r["connections"], r[field]))
PY
if "$plotter" "$plot" <"$dir/plot.spec"; then
    echo "plot: $plot"
else
    echo "bench-http: the plot failed (spec in $dir/plot.spec)" >&2
    exit 1
fi
