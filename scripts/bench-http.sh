#!/usr/bin/env bash
# The HTTP gateway measured in one run on this machine: three tierkvd (fs store,
# fsync on) on loopback, the floor (cmd/http-floor: a trivial libuv responder,
# fixed 200, no Raft, no disk: what the kernel and libuv cost per request) and,
# when the machine has it, three etcd 3.4 -- all driven by the same load
# generator (`tierkv bench`). For each row the systems run back to back, so they
# see the same machine load. Each cell reports ops/s, p50, p99 and the CPU
# microseconds per request of every server process (utime + stime from
# /proc/PID/stat over the measured window, `tierkv bench --cpu-pids`): on a
# noisy VM throughput moves by 30 % from run to run, CPU per request barely.
#
# usage: scripts/bench-http.sh [--plot FILE.svg] [build-dir]   (default: build)
#        --plot draws throughput and p99 against connections, one line per
#        system and op (through build-dir's cmd/benchplot/bench-plot)
# env:   BENCH_DURATION (5s), BENCH_RUNS (3: medians), BENCH_ROWS (the rows,
#        "op:conns ..."; default "put:1 put:16 put:64 put:256 get:64"),
#        BENCH_DIR (a scratch directory; default $TMPDIR or /tmp, named by the pid),
#        BENCH_PORT_BASE (17100: tierkvd raft +1..3, HTTP +101..103, the floor
#        +190, etcd clients +201..203, peers +301..303),
#        BENCH_SYSTEMS ("tierkv floor etcd"; etcd only where `etcd` is on the
#        PATH -- BENCH_INSTALL_ETCD=1 installs Debian's etcd-server first)
# Prints one table (markdown) and keeps every JSON line in $BENCH_DIR/results.jsonl
# (each with "system" added: tierkv, floor or etcd).
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
pb=${BENCH_PORT_BASE:-17100}
dir=${BENCH_DIR:-${TMPDIR:-/tmp}/tierkv-bench-http.$$}
mkdir -p "$dir" || exit 1
floor_bin="$build/cmd/http-floor/http-floor"
systems=${BENCH_SYSTEMS:-tierkv floor etcd}
with_etcd=0 with_floor=0
case " $systems " in *" etcd "*) with_etcd=1 ;; esac
case " $systems " in *" floor "*) with_floor=1 ;; esac
plotter="$build/cmd/benchplot/bench-plot"
[ -z "$plot" ] || [ -x "$plotter" ] || { echo "bench-http: $plotter not found" >&2; exit 1; }
for f in "$bin" "$cli"; do
    [ -x "$f" ] || { echo "bench-http: $f not found; build first (make build)" >&2; exit 1; }
done
if [ "$with_floor" = 1 ] && [ ! -x "$floor_bin" ]; then
    echo "bench-http: $floor_bin not found; build first (make build)" >&2
    exit 1
fi
if [ "$with_etcd" = 1 ] && ! command -v etcd >/dev/null; then
    if [ "${BENCH_INSTALL_ETCD:-0}" = 1 ]; then
        echo "bench-http: installing etcd-server (for the comparison only)"
        { apt-get update -qq && apt-get install -y -qq etcd-server; } >"$dir/apt.log" 2>&1 ||
            { echo "bench-http: could not install etcd-server; see $dir/apt.log" >&2; exit 1; }
    else
        echo "bench-http: no etcd on this machine: its rows are left out" \
            "(BENCH_INSTALL_ETCD=1 installs Debian's etcd-server)"
        with_etcd=0
        systems=$(echo " $systems " | sed 's/ etcd / /; s/^ *//; s/ *$//')
    fi
fi

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 1' INT TERM

tk_pids="" et_pids="" fl_pids=""
members="" mhttp="" tk_eps=""
for i in 1 2 3; do
    members+="${members:+,}$i=127.0.0.1:$((pb + i))"
    mhttp+="${mhttp:+,}$i=127.0.0.1:$((pb + 100 + i))"
    tk_eps+="${tk_eps:+,}127.0.0.1:$((pb + 100 + i))"
done
for i in 1 2 3; do
    "$bin" --id "$i" --members "$members" --members-http "$mhttp" \
        --listen-http "127.0.0.1:$((pb + 100 + i))" --data-dir "$dir/tk$i" --store fs \
        --log-level warn >"$dir/tk$i.log" 2>&1 &
    pids+=($!)
    tk_pids+="${tk_pids:+,}$!"
done
fl_eps=127.0.0.1:$((pb + 190))
if [ "$with_floor" = 1 ]; then
    "$floor_bin" --port $((pb + 190)) >"$dir/floor.log" 2>&1 &
    pids+=($!)
    fl_pids=$!
fi
# etcd: clients pb+201..203, peers pb+301..303.
cluster="" et_eps=""
for i in 1 2 3; do
    cluster+="${cluster:+,}e$i=http://127.0.0.1:$((pb + 300 + i))"
    et_eps+="${et_eps:+,}127.0.0.1:$((pb + 200 + i))"
done
for i in 1 2 3; do
    [ "$with_etcd" = 1 ] || break
    ETCD_UNSUPPORTED_ARCH= etcd --name "e$i" --data-dir "$dir/etcd$i" \
        --listen-client-urls "http://127.0.0.1:$((pb + 200 + i))" \
        --advertise-client-urls "http://127.0.0.1:$((pb + 200 + i))" \
        --listen-peer-urls "http://127.0.0.1:$((pb + 300 + i))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((pb + 300 + i))" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --log-level error >"$dir/etcd$i.log" 2>&1 &
    pids+=($!)
    et_pids+="${et_pids:+,}$!"
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
wait_ready "http://127.0.0.1:$((pb + 101))/readyz" "http://127.0.0.1:$((pb + 102))/readyz" \
    "http://127.0.0.1:$((pb + 103))/readyz"
[ "$with_etcd" = 1 ] && wait_ready "http://127.0.0.1:$((pb + 201))/health" \
    "http://127.0.0.1:$((pb + 202))/health" "http://127.0.0.1:$((pb + 203))/health"
[ "$with_floor" = 1 ] && wait_ready "http://$fl_eps/"

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "bench-http: $(nproc) CPUs, load $(load), $runs run(s) of $dur per cell (medians);"
echo "  tierkvd $tk_eps (pids $tk_pids)"
[ "$with_floor" = 1 ] && echo "  floor (http-floor) $fl_eps (pid $fl_pids)"
[ "$with_etcd" = 1 ] && echo "  etcd $(etcd --version | head -1 | sed 's/.*: //') $et_eps (pids $et_pids)"

results="$dir/results.jsonl"
: >"$results"
for row in $rows; do
    op=${row%%:*} c=${row##*:}
    mix=write
    [ "$op" = get ] && mix=read
    for sys in $systems; do
        case $sys in
        tierkv) eps=$tk_eps cpids=$tk_pids proto=tierkv ;;
        floor) eps=$fl_eps cpids=$fl_pids proto=tierkv ;;
        etcd) eps=$et_eps cpids=$et_pids proto=etcd ;;
        *) echo "bench-http: unknown system $sys" >&2; continue ;;
        esac
        # A short warm-up creates the keys a read row reads.
        "$cli" -e "$eps" bench --protocol "$proto" -c "$c" -d "$dur" --warmup 1s \
            --value-size 64 --keys 10000 --mix "$mix" --runs "$runs" --json \
            --cpu-pids "$cpids" 2>"$dir/$sys-$op-$c.err" | grep '"bench":"http"' |
            tail -1 | sed "s/^{/{\"system\":\"$sys\",/" | grep . >>"$results" ||
            echo "bench-http: $sys $op c=$c failed; see $dir/$sys-$op-$c.err" >&2
    done
done
echo "  load at the end $(load)"

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {"tierkv": "tierkvd", "floor": "floor", "etcd": "etcd"}
print()
print("| op | conns | system | ops/s | p50 ms | p99 ms | CPU us/req, each server | "
      "CPU us/req, servers | bench CPU us/req |")
print("|---|---:|---|---:|---:|---:|---|---:|---:|")
for r in rows:
    name = "get (linearizable)" if r["op"] == "get" else r["op"]
    each = " + ".join("%.1f" % v for v in r.get("cpu_us_per_op", []))
    tot = r.get("cpu_us_per_op_total", -1)
    print("| %s | %d | %s | %s | %.3f | %.3f | %s | %s | %.1f |" % (
        name, r["connections"], names.get(r["system"], r["system"]),
        "{:,.0f}".format(r["ops_per_s"]), r["p50_ms"], r["p99_ms"], each or "-",
        "%.1f" % tot if tot >= 0 else "-", r.get("bench_cpu_us_per_op", -1)))
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
names = {"tierkv": "tierkvd", "floor": "floor", "etcd": "etcd"}
for panel, field in ((0, "ops_per_s"), (1, "p99_ms")):
    seen = []
    for r in rows:
        k = (r["system"], r["op"])
        if k not in seen:
            seen.append(k)
    for system, op in seen:
        pts = sorted((r for r in rows if (r["system"], r["op"]) == (system, op)
                      and r.get(field, -1) > 0), key=lambda r: r["connections"])
        if not pts:
            continue
        print("series %d %s %s" % (panel, names.get(system, system),
                                  "get (linearizable)" if op == "get" else op))
        for r in pts:
            print("point %d %g" % (r["connections"], r[field]))
PY
if "$plotter" "$plot" <"$dir/plot.spec"; then
    echo "plot: $plot"
else
    echo "bench-http: the plot failed (spec in $dir/plot.spec)" >&2
    exit 1
fi
