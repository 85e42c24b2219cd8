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
# usage: scripts/bench-scale.sh [build-dir]
# env:   SCALE_ENTRIES (1000000), SCALE_VALUE (100), SCALE_CONN (64),
#        SCALE_STEP_S (10), SCALE_SNAPSHOT_ENTRIES (100000),
#        SCALE_RAFT_BASE (7300), SCALE_HTTP_BASE (8300), SCALE_DIR ($TMPDIR or /tmp, named by the pid),
#        SCALE_MAX_TURN_MS (0: no limit; else exit 1 when a loop turn was
#        longer), SCALE_NO_LEADER_CHANGE=1 (exit 1 on a leader change),
#        SCALE_TIME_LIMIT_S (0: none; stop loading after this many seconds),
#        SCALE_OPT_IN=1 (exit 77, a skip, unless TIERKV_SCALE_TEST=1)
set -uo pipefail

build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
entries=${SCALE_ENTRIES:-1000000}
value=${SCALE_VALUE:-100}
conn=${SCALE_CONN:-64}
step=${SCALE_STEP_S:-10}
snap=${SCALE_SNAPSHOT_ENTRIES:-100000}
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

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
    pids=()
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
    "$bin" --id "$i" --members "$members" --members-http "$mhttp" \
        --listen-http "127.0.0.1:$((http_base + i))" --data-dir "$dir/n$i" --store fs \
        --snapshot-entries "$snap" >>"$dir/n$i.log" 2>&1 &
    pids+=($!)
done

python3 "$(dirname "$0")/bench_scale.py" --http-base "$http_base" --dir "$dir" \
    --cli "$cli" --endpoints "$eps" --entries "$entries" --value "$value" \
    --conn "$conn" --step "$step" --max-turn-ms "$max_turn_ms" \
    --no-leader-change "${SCALE_NO_LEADER_CHANGE:-0}" --time-limit "$time_limit"
status=$?
exit $status
