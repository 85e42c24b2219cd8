#!/usr/bin/env bash
# What HTTPS costs the gateway, in one run on this machine: two single-node
# tierkvd (memory store), one plain HTTP and one HTTPS (a certificate made
# here with the openssl CLI), driven by `tierkv bench`; for each row the two
# run back to back, alternating, BENCH_RUNS times, and the medians are shown.
# Each bench connection handshakes once and then keeps its connection alive.
#
# usage: scripts/bench-tls.sh [build-dir]   (default: build)
# env:   BENCH_DURATION (5s), BENCH_RUNS (3), BENCH_ROWS ("put:16 get:16 put:64")
# Prints a markdown table; every JSON line is kept in $dir/results.jsonl.
set -uo pipefail

build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
dur=${BENCH_DURATION:-5s}
runs=${BENCH_RUNS:-3}
rows=${BENCH_ROWS:-"put:16 get:16 put:64"}
dir=${TMPDIR:-/tmp}/tierkv-bench-tls.$$
mkdir -p "$dir" || exit 1
for f in "$bin" "$cli"; do
    [ -x "$f" ] || { echo "bench-tls: $f not found; build first" >&2; exit 1; }
done
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" -subj /CN=localhost \
    -addext "subjectAltName=IP:127.0.0.1" >/dev/null 2>&1 ||
    { echo "bench-tls: openssl could not make a certificate" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p_http=$(port); p_https=$(port)
"$bin" --store mem --listen-http "127.0.0.1:$p_http" >"$dir/http.log" 2>&1 & pids+=($!)
"$bin" --store mem --listen-http "127.0.0.1:$p_https" --cert-file "$dir/cert.pem" \
    --key-file "$dir/key.pem" >"$dir/https.log" 2>&1 & pids+=($!)
for i in $(seq 100); do
    "$cli" -e "127.0.0.1:$p_http" --retries 0 status >/dev/null 2>&1 &&
        "$cli" -e "127.0.0.1:$p_https" --cacert "$dir/cert.pem" --retries 0 status \
            >/dev/null 2>&1 && break
    sleep 0.1
done

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"; }

echo "| row | HTTP ops/s | HTTPS ops/s | HTTPS/HTTP | HTTP p50 ms | HTTPS p50 ms | HTTP p99 ms | HTTPS p99 ms |"
echo "|---|---|---|---|---|---|---|---|"
for row in $rows; do
    op=${row%%:*}; conns=${row##*:}
    mix=write; [ "$op" = get ] && mix=read
    for mode in http https; do : >"$dir/$mode.rows"; done
    for r in $(seq "$runs"); do
        for mode in http https; do
            if [ "$mode" = http ]; then ep="127.0.0.1:$p_http"; extra=(); else
                ep="127.0.0.1:$p_https"; extra=(--cacert "$dir/cert.pem"); fi
            "$cli" -e "$ep" "${extra[@]}" bench --duration "$dur" --connections "$conns" \
                --mix "$mix" --keys 10000 2>/dev/null | grep '^{' | tail -1 |
                tee -a "$dir/results.jsonl" >>"$dir/$mode.rows"
        done
    done
    declare -A m
    for mode in http https; do
        for f in ops_per_s p50_ms p99_ms; do
            m[$mode.$f]=$(while read -r l; do echo "$l" | field "$f"; done <"$dir/$mode.rows" | median)
        done
    done
    ratio=$(python3 -c "print('%.2f' % (${m[https.ops_per_s]} / max(${m[http.ops_per_s]}, 1)))")
    echo "| $op x$conns | ${m[http.ops_per_s]} | ${m[https.ops_per_s]} | $ratio | ${m[http.p50_ms]} | ${m[https.p50_ms]} | ${m[http.p99_ms]} | ${m[https.p99_ms]} |"
done
