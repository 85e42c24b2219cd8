#!/usr/bin/env bash
# bench-scale.sh: how tierkv's costs grow with the data (issue 22).
#
# Starts three tierkvd on 127.0.0.1 (fs store, snapshots every
# SCALE_SNAPSHOT_ENTRIES entries) in a fresh directory, then writes values of
# SCALE_VALUE bytes with `tierkv bench -c SCALE_CONN --mix write` in steps of
# SCALE_STEP_S seconds until the leader has applied SCALE_ENTRIES writes
# (each write a new key with --sequential, so entries = keys). After each
# step it prints one row: entries applied, throughput, p99/p99.9/max latency,
# the longest loop turn of any node and its phase (from the nodes' logs and
# /metrics), leader changes so far, snapshot time in all and on the loop (the
# nodes' "snapshot at N" lines), and the leader's memory by owner
# (tierkv_memory_bytes). Stops the cluster and removes the data at the end
# (kept, with the slow-turn lines printed, on a failure or with SCALE_KEEP=1).
#
# Then, unless SCALE_CATCHUP=0, the follower catch-up: it stops a follower,
# writes SCALE_CATCHUP more keys (1M by default) in steps like the load's,
# restarts it and times how long it takes to apply up to the leader's applied
# index (a snapshot install, then the log), and reports the leader's longest
# loop turn meanwhile and leader changes. With --plot FILE.svg it draws
# throughput and the longest loop turn of each step against keys
# (cmd/benchplot's bench-plot).
#
# usage: scripts/bench-scale.sh [--plot FILE.svg] [build-dir]
# env:   SCALE_ENTRIES (1000000), SCALE_VALUE (100), SCALE_CONN (64),
#        SCALE_STEP_S (10), SCALE_SNAPSHOT_ENTRIES (100000),
#        SCALE_RAFT_BASE (7300), SCALE_HTTP_BASE (8300), SCALE_DIR ($TMPDIR or /tmp, named by the pid),
#        SCALE_MAX_TURN_MS (0: no limit; else exit 1 when a loop turn was
#        longer), SCALE_NO_LEADER_CHANGE=1 (exit 1 on a leader change),
#        SCALE_TIME_LIMIT_S (0: none; stop loading after this many seconds),
#        SCALE_OPT_IN=1 (exit 77, a skip, unless TIERKV_SCALE_TEST=1),
#        SCALE_CATCHUP (1000000; 0: no catch-up measurement),
#        SCALE_STEADY_S (0; else, once SCALE_ENTRIES are loaded, that many
#        seconds more of steps that overwrite random keys of the first step,
#        so the data stays its size: the steady state at 1M or 10M keys),
#        SCALE_RATE (0: as fast as the connections go; else the steady
#        state's writes per second, `tierkv bench --rate`),
#        SCALE_RING_BYTES (64M: the nodes' --kv-ring-bytes),
#        SCALE_STALL_PROBE_MS (40: the nodes' --stall-probe-ms; each turn that
#        long is logged with what the loop waited on, and the run ends with
#        a count of them by what; 0: off),
#        SCALE_LOOP_NICE (0; else the nodes' loop threads are set to that nice
#        value once they lead or follow: an experiment, not the catch-up's
#        restarted node),
#        SCALE_HICCUP (1: run scripts/hiccup.py beside it, real-time threads
#        that log when the machine ran nothing for over 5 ms, and report how
#        many slow turns and writes that time explains; 0: off)
set -uo pipefail

plot=""
if [ "${1:-}" = "--plot" ]; then
    plot=$2
    shift 2
fi
build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
entries=${SCALE_ENTRIES:-1000000}
value=${SCALE_VALUE:-100}
conn=${SCALE_CONN:-64}
step=${SCALE_STEP_S:-10}
snap=${SCALE_SNAPSHOT_ENTRIES:-100000}
stall=${SCALE_STALL_PROBE_MS:-40}
ring=${SCALE_RING_BYTES:-64M}
raft_base=${SCALE_RAFT_BASE:-7300}
http_base=${SCALE_HTTP_BASE:-8300}
max_turn_ms=${SCALE_MAX_TURN_MS:-0}
time_limit=${SCALE_TIME_LIMIT_S:-0}
dir=${SCALE_DIR:-${TMPDIR:-/tmp}/tierkv-bench-scale.$$}

if [ "${SCALE_OPT_IN:-0}" = 1 ] && [ "${TIERKV_SCALE_TEST:-0}" != 1 ]; then
    echo "bench-scale: skipped (set TIERKV_SCALE_TEST=1 to run it: about 3 minutes)"
    exit 77
fi
for f in "$bin" "$cli"; do
    if [ ! -x "$f" ]; then
        echo "bench-scale: $f not found; build first" >&2
        exit 2
    fi
done

members="" ; mhttp="" ; eps=""
for i in 1 2 3; do
    members+="${members:+,}$i=127.0.0.1:$((raft_base + i))"
    mhttp+="${mhttp:+,}$i=127.0.0.1:$((http_base + i))"
    eps+="${eps:+,}127.0.0.1:$((http_base + i))"
done

# Each node's pid is in $dir/n$i.pid, written by $dir/n$i.sh, which starts
# it (the catch-up restarts one with it, from bench_scale.py).
cleanup() {
    [ -n "${hiccup_pid:-}" ] && kill -TERM "$hiccup_pid" 2>/dev/null
    for i in 1 2 3; do
        [ -f "$dir/n$i.pid" ] && kill -TERM "$(cat "$dir/n$i.pid")" 2>/dev/null
    done
    for i in 1 2 3; do
        [ -f "$dir/n$i.pid" ] || continue
        pid=$(cat "$dir/n$i.pid")
        for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    if [ "${SCALE_KEEP:-0}" = 1 ] || [ "$status" != 0 ]; then
        echo "bench-scale: data and logs kept in $dir" >&2
        grep -h "loop turn took\|leader\|elect" "$dir"/n*.log 2>/dev/null | tail -n 20 >&2
    else
        rm -rf "$dir"
    fi
}
status=0
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$dir"
for i in 1 2 3; do
    printf '%s\n' "echo \$\$ >'$dir/n$i.pid'" \
        "exec '$bin' --id $i --members '$members' --members-http '$mhttp' \\" \
        "    --listen-http 127.0.0.1:$((http_base + i)) --data-dir '$dir/n$i' --store fs \\" \
        "    --snapshot-entries $snap --stall-probe-ms $stall --kv-ring-bytes $ring \\" \
        "    >>'$dir/n$i.log' 2>&1" >"$dir/n$i.sh"
    bash "$dir/n$i.sh" &
done

if [ "${SCALE_HICCUP:-1}" = 1 ]; then
    python3 "$(dirname "$0")/hiccup.py" --min-ms 5 >"$dir/hiccup.log" 2>&1 &
    hiccup_pid=$!
fi
python3 "$(dirname "$0")/bench_scale.py" --http-base "$http_base" --dir "$dir" \
    --cli "$cli" --endpoints "$eps" --entries "$entries" --value "$value" \
    --conn "$conn" --step "$step" --max-turn-ms "$max_turn_ms" --stall-ms "$stall" \
    --no-leader-change "${SCALE_NO_LEADER_CHANGE:-0}" --time-limit "$time_limit" \
    --catchup "${SCALE_CATCHUP:-1000000}" --steady "${SCALE_STEADY_S:-0}" \
    --rate "${SCALE_RATE:-0}" --loop-nice "${SCALE_LOOP_NICE:-0}" \
    ${plot:+--plot "$plot"} \
    --plotter "$build/cmd/benchplot/bench-plot"
status=$?
exit $status
