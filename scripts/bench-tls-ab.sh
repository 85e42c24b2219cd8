#!/usr/bin/env bash
# HTTPS before/after in one run: three single-node tierkvd (memory store) side
# by side, plain HTTP and HTTPS from build dir A, HTTPS from build dir B, each
# driven by its own build's `tierkv bench`, alternating, BENCH_RUNS times per
# row; prints per run ops/s, p50, p99 and the CPU per request of the server and
# of the bench process (perf stat task-clock / requests), then the medians.
#
# usage: scripts/bench-tls-ab.sh build-a [build-b]   (b defaults to a)
# env:   BENCH_DURATION (3s), BENCH_RUNS (3), BENCH_ROWS ("get:16 put:16 put:64"),
#        BENCH_NICE (-10: the processes' nice value; empty: unchanged)
set -uo pipefail
a=${1:?usage: bench-tls-ab.sh build-a [build-b]}
b=${2:-$a}
dur=${BENCH_DURATION:-3s}
runs=${BENCH_RUNS:-3}
rows=${BENCH_ROWS:-"get:16 put:16 put:64"}
nice_cmd=(); [ -n "${BENCH_NICE--10}" ] && nice_cmd=(nice -n "${BENCH_NICE--10}")
dir=${TMPDIR:-/tmp}/tierkv-bench-tls-ab.$$
mkdir -p "$dir" || exit 1
command -v perf >/dev/null || { echo "bench-tls-ab: needs perf" >&2; exit 1; }
for d in "$a" "$b"; do for f in cmd/tierkvd/tierkvd cmd/tierkv/tierkv; do
    [ -x "$d/$f" ] || { echo "bench-tls-ab: $d/$f not found" >&2; exit 1; }; done; done
declare -A P PID BIN TLS
names=(http https-a https-b)
BIN[http]=$a; TLS[http]=0; BIN[https-a]=$a; TLS[https-a]=1; BIN[https-b]=$b; TLS[https-b]=1
cleanup() { for n in "${names[@]}"; do [ -n "${PID[$n]:-}" ] && kill "${PID[$n]}" 2>/dev/null; done
    wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" -subj /CN=localhost \
    -addext "subjectAltName=IP:127.0.0.1" >/dev/null 2>&1 ||
    { echo "bench-tls-ab: openssl could not make a certificate" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
for n in "${names[@]}"; do
    P[$n]=$(port); ex=()
    [ "${TLS[$n]}" = 1 ] && ex=(--cert-file "$dir/cert.pem" --key-file "$dir/key.pem")
    "${nice_cmd[@]}" "${BIN[$n]}/cmd/tierkvd/tierkvd" --store mem --listen-http \
        "127.0.0.1:${P[$n]}" "${ex[@]}" >"$dir/$n.log" 2>&1 & PID[$n]=$!
done
cli_ex() { [ "${TLS[$1]}" = 1 ] && echo --cacert "$dir/cert.pem"; }
for n in "${names[@]}"; do
    for i in $(seq 100); do
        # shellcheck disable=SC2046
        "${BIN[$n]}/cmd/tierkv/tierkv" -e "127.0.0.1:${P[$n]}" $(cli_ex "$n") --retries 0 \
            status >/dev/null 2>&1 && break
        sleep 0.1
    done
    # shellcheck disable=SC2046
    "${BIN[$n]}/cmd/tierkv/tierkv" -e "127.0.0.1:${P[$n]}" $(cli_ex "$n") bench --duration 1s \
        --connections 4 --mix write --keys 10000 >/dev/null 2>&1
done
secs=${dur%s}
for row in $rows; do
    op=${row%%:*}; conns=${row##*:}; mix=write; [ "$op" = get ] && mix=read
    for r in $(seq "$runs"); do for n in "${names[@]}"; do
        perf stat -x, -e task-clock -p "${PID[$n]}" -o "$dir/ps.txt" -- \
            sleep "$(python3 -c "print($secs + 0.2)")" & pp=$!
        sleep 0.1
        # shellcheck disable=SC2046
        perf stat -x, -e task-clock -o "$dir/pc.txt" "${nice_cmd[@]}" \
            "${BIN[$n]}/cmd/tierkv/tierkv" -e "127.0.0.1:${P[$n]}" $(cli_ex "$n") bench \
            --duration "$dur" --connections "$conns" --mix "$mix" --keys 10000 --no-prefill \
            2>/dev/null | grep '^{' | tail -1 >"$dir/j.txt"
        wait "$pp"
        python3 - "$dir" "$row" "$n" <<'PY' | tee -a "$dir/runs.txt"
import json, sys
d, row, n = sys.argv[1:]
j = json.load(open(d + "/j.txt"))
def clock(f):
    for line in open(f):
        p = line.strip().split(",")
        if len(p) > 2 and p[2] == "task-clock":
            return float(p[0])
    return float("nan")
ops = max(j["ops"], 1)
print(row, n, j["ops_per_s"], j["p50_ms"], j["p99_ms"],
      round(clock(d + "/ps.txt") * 1e3 / ops, 1), round(clock(d + "/pc.txt") * 1e3 / ops, 1))
PY
    done; done
done
echo
echo "| row | variant | ops/s | p50 ms | p99 ms | server CPU us/op | client CPU us/op |"
echo "|---|---|---|---|---|---|---|"
python3 - "$dir/runs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    rows.setdefault((p[0], p[1]), []).append([float(x) for x in p[2:]])
for (row, n), v in rows.items():
    m = [statistics.median(c) for c in zip(*v)]
    print(f"| {row} | {n} | {m[0]:.0f} | {m[1]:.3f} | {m[2]:.2f} | {m[3]:.1f} | {m[4]:.1f} |")
PY
