#!/usr/bin/env bash
# Syscalls per request on the leader: three tierkvd (fs store, fsync on) on
# loopback, `tierkv bench` against the leader's HTTP port only (so no request
# is forwarded), and `strace -c -f` attached to the leader's every thread for
# the run. Prints the leader's syscalls per request, by name, most first, and
# the total; requests are the bench's operations (--warmup 0: the window is
# the whole run, so the in-flight requests at its ends, at most one per
# connection, are the error). strace slows the leader a lot: read the counts,
# not the throughput.
#
# usage: scripts/syscalls-http.sh [build-dir]      (default: build)
# env:   SYS_CONNS (64), SYS_DURATION (4s), SYS_MIX (write), BENCH_PORT_BASE (18100),
#        SYS_DIR (scratch; default $TMPDIR or /tmp, named by the pid)
set -uo pipefail
build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
conns=${SYS_CONNS:-64}
dur=${SYS_DURATION:-4s}
mix=${SYS_MIX:-write}
pb=${BENCH_PORT_BASE:-18100}
dir=${SYS_DIR:-${TMPDIR:-/tmp}/tierkv-syscalls-http.$$}
command -v strace >/dev/null || { echo "syscalls-http: strace not found" >&2; exit 1; }
mkdir -p "$dir" || exit 1
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 1' INT TERM
members="" mhttp=""
for i in 1 2 3; do
    members+="${members:+,}$i=127.0.0.1:$((pb + i))"
    mhttp+="${mhttp:+,}$i=127.0.0.1:$((pb + 100 + i))"
done
for i in 1 2 3; do
    "$bin" --id "$i" --members "$members" --members-http "$mhttp" \
        --listen-http "127.0.0.1:$((pb + 100 + i))" --data-dir "$dir/tk$i" --store fs \
        --log-level warn >"$dir/tk$i.log" 2>&1 &
    pids+=($!)
done
leader=""
for _ in $(seq 150); do
    leader=$(curl -s -m 1 -D - -o /dev/null "http://127.0.0.1:$((pb + 101))/readyz" |
        tr -d '\r' | sed -n 's/^X-Tierkv-Leader: //Ip')
    [ -n "$leader" ] && curl -fs -m 1 "http://127.0.0.1:$((pb + 100 + leader))/readyz" \
        >/dev/null && break
    leader=""
    sleep 0.2
done
[ -n "$leader" ] || { echo "syscalls-http: no leader; logs in $dir" >&2; exit 1; }
lpid=${pids[$((leader - 1))]}
ep=127.0.0.1:$((pb + 100 + leader))
if [ "$mix" = read ]; then # the keys a read row reads
    "$cli" -e "$ep" bench -c 16 -d 1s --warmup 0 --mix write --no-progress >/dev/null 2>&1
fi
strace -c -f -q -o "$dir/strace.txt" -p "$lpid" &
spid=$!
sleep 1 # attached to every thread
"$cli" -e "$ep" bench -c "$conns" -d "$dur" --warmup 0 --value-size 64 --keys 10000 \
    --mix "$mix" --no-prefill --json --no-progress 2>"$dir/bench.err" |
    grep '"bench":"http"' >"$dir/bench.json"
kill -INT "$spid"
wait "$spid" 2>/dev/null
python3 - "$dir/strace.txt" "$dir/bench.json" "$mix" "$conns" <<'PY'
import json, sys
b = json.loads(open(sys.argv[2]).read())
ops = b["ops"]
rows = []
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] not in ("total",):
        calls = int(f[3])
        rows.append((f[-1], calls))
rows.sort(key=lambda r: -r[1])
total = sum(c for _, c in rows)
print("leader syscalls per request (%s, %s connections, %d requests, %.0f/s under strace)"
      % (sys.argv[3], sys.argv[4], ops, b["ops_per_s"]))
print("| syscall | per request |")
print("|---|---:|")
for name, c in rows:
    if c / ops >= 0.01:
        print("| %s | %.2f |" % (name, c / ops))
print("| **total** | **%.2f** |" % (total / ops))
PY
