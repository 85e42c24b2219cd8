#!/bin/sh
# Proves `tierkv bench` measures: short runs against tierkv-fake-server with
# both protocols (writes, a zipf read/write mix on two threads, etcd's v3
# JSON gateway), then against a real local etcd if one is installed. Each run
# must report nonzero throughput, ordered nonzero percentiles and no errors;
# a run against a dead endpoint must fail with exit 5. Under 20 s in total.
# Usage: bench_smoke.sh TIERKV FAKE_SERVER
set -u
TIERKV=$1
FAKE=$2
DIR=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

# fixture PORTFILE NAME [args...]: starts tierkv-fake-server, waits for its port.
fixture() {
    pf=$1; name=$2; shift 2
    "$FAKE" --port-file "$DIR/$pf" "$@" &
    PIDS="$PIDS $!"
    i=0
    while [ ! -s "$DIR/$pf" ]; do
        i=$((i + 1)); [ $i -gt 200 ] && { echo "$name did not start"; exit 1; }
        sleep 0.05
    done
}

fixture port "fake server"
EP=127.0.0.1:$(cat "$DIR/port")

FAIL=0
PASS=0
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$DIR/out" | tail -n 1; }
# bench NAME ENDPOINTS args...: runs it and checks the JSON line.
bench() {
    name=$1; eps=$2; shift 2
    "$TIERKV" --endpoints "$eps" bench --no-progress --warmup 200ms "$@" >"$DIR/out" 2>"$DIR/err"
    rc=$?
    cat "$DIR/out"
    ops=$(field ops_per_s); p50=$(field p50_ms); p99=$(field p99_ms); errs=$(field errors)
    if [ $rc -ne 0 ] || [ -z "$ops" ] || ! grep -q '"bench":"http"' "$DIR/out" ||
       ! awk -v o="$ops" -v a="$p50" -v b="$p99" -v e="$errs" \
           'BEGIN { exit !(o > 0 && a > 0 && b >= a && e == 0) }'; then
        echo "FAIL $name: exit $rc, ops_per_s=$ops p50=$p50 p99=$p99 errors=$errs"
        sed 's/^/  err: /' "$DIR/err"
        FAIL=$((FAIL + 1))
    else
        echo "ok   $name: $ops ops/s, p50 $p50 ms, p99 $p99 ms"
        PASS=$((PASS + 1))
    fi
}

bench put-fixture "$EP" --duration 1500ms --connections 8
grep -q "p99.9_ms" "$DIR/out" || { echo "FAIL: no table"; FAIL=$((FAIL + 1)); }
# --cpu-pids: the fixture's CPU per op is reported (positive: it answered
# thousands of requests in the window), the bench's own as well.
FAKE_PID=$(echo $PIDS | cut -d' ' -f1)
bench cpu-pids "$EP" --duration 1500ms --connections 8 --cpu-pids "$FAKE_PID"
cpu=$(field cpu_us_per_op_total); bcpu=$(field bench_cpu_us_per_op)
if awk -v a="$cpu" -v b="$bcpu" 'BEGIN { exit !(a > 0 && b > 0) }'; then
    echo "ok   cpu-pids: server $cpu us/op, bench $bcpu us/op"; PASS=$((PASS + 1))
else
    echo "FAIL cpu-pids: cpu_us_per_op_total=$cpu bench_cpu_us_per_op=$bcpu"
    FAIL=$((FAIL + 1))
fi
# --rate paces the requests: the fixture answers thousands a second unpaced,
# here about 500 (0.7x-1.15x of it, a margin for a loaded machine).
bench rate-paced "$EP" --duration 2s --connections 8 --rate 500
if awk -v o="$(field ops_per_s)" -v r="$(field rate)" \
        'BEGIN { exit !(r == 500 && o >= 350 && o <= 575) }'; then
    echo "ok   rate-paced: $(field ops_per_s) ops/s at --rate 500"; PASS=$((PASS + 1))
else
    echo "FAIL rate-paced: $(field ops_per_s) ops/s at --rate $(field rate)"; FAIL=$((FAIL + 1))
fi
bench mix-zipf-2threads "$EP" --duration 1500ms --connections 16 --threads 2 --mix 80:20 \
    --dist zipf --keys 500 --value-size 1k
grep -q '"op":"mix"' "$DIR/out" || { echo "FAIL: op is not mix"; FAIL=$((FAIL + 1)); }
bench etcd-protocol-fixture "$EP" --protocol etcd --duration 1s --connections 4 --mix 1:1 \
    --keys 100
grep -q '"protocol":"etcd"' "$DIR/out" || { echo "FAIL: protocol"; FAIL=$((FAIL + 1)); }

# A follower that answers 503 + X-Tierkv-Leader-Addr: its connections move to
# the leader (counted as redirects, not errors).
fixture fport follower --follower-of "$EP"
bench chase-leader "127.0.0.1:$(cat "$DIR/fport"),$EP" --duration 1s --connections 4
if [ "$(field redirects)" -ge 2 ] 2>/dev/null; then
    echo "ok   chase-leader redirects=$(field redirects)"; PASS=$((PASS + 1))
else
    echo "FAIL chase-leader: redirects=$(field redirects)"; FAIL=$((FAIL + 1))
fi

# A server answering each request after 30 ms: every write is over 25 ms in
# "over_ms", and --slow-ms 20 lists each on stderr (64 at most).
fixture sport "slow fixture" --delay-ms 30
bench slow-tail "127.0.0.1:$(cat "$DIR/sport")" --duration 1s --connections 2 --slow-ms 20
over25=$(sed -n 's/.*"over_ms":{"10":[0-9]*,"25":\([0-9]*\),.*/\1/p' "$DIR/out")
slow=$(grep -c "tierkv bench: slow: .* ms, a write sent at 20" "$DIR/err")
if [ -n "$over25" ] && [ "$over25" -ge 10 ] && [ "$over25" -eq "$(field ops)" ] &&
   [ "$slow" -eq "$over25" ]; then
    echo "ok   slow-tail: $(field ops) writes, over 25 ms: $over25, slow lines: $slow"
    PASS=$((PASS + 1))
else
    echo "FAIL slow-tail: ops=$(field ops) over 25 ms: $over25, slow lines: $slow"
    FAIL=$((FAIL + 1))
fi

# The checker must be able to fail: nothing listens on port 1.
"$TIERKV" --endpoints 127.0.0.1:1 bench --no-progress --warmup 0 --duration 500ms \
    --connections 2 >"$DIR/out" 2>"$DIR/err"
rc=$?
if [ $rc -eq 5 ] && [ "$(field errors)" != "0" ]; then
    echo "ok   dead-endpoint-fails (exit 5, errors=$(field errors))"; PASS=$((PASS + 1))
else
    echo "FAIL dead-endpoint-fails: exit $rc"; cat "$DIR/out"; FAIL=$((FAIL + 1))
fi

# A real etcd, when the machine has one (Debian's etcd-server); never required.
ETCD=$(command -v etcd || true)
if [ -n "$ETCD" ]; then
    base=$((20000 + ($$ % 20000)))
    "$ETCD" --name smoke --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$base" \
        --advertise-client-urls "http://127.0.0.1:$base" \
        --listen-peer-urls "http://127.0.0.1:$((base + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
        --initial-cluster "smoke=http://127.0.0.1:$((base + 1))" \
        --log-level error >"$DIR/etcd.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    # Any HTTP answer (etcd 404s /v1/kv/x: exit 3) means it listens.
    until "$TIERKV" --endpoints "127.0.0.1:$base" --retries 0 --timeout 1s get x \
            >/dev/null 2>&1 || [ $? -ne 5 ]; do
        i=$((i + 1)); [ $i -gt 100 ] && break
        sleep 0.1
    done
    if [ $i -le 100 ]; then
        bench etcd-real "127.0.0.1:$base" --protocol etcd --duration 2s --connections 8
    else
        echo "skip etcd-real: etcd did not become healthy"; tail -5 "$DIR/etcd.log"
    fi
else
    echo "skip etcd-real: no etcd installed"
fi
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
