#!/bin/sh
# End-to-end tests of the tierkv CLI against tierkv-fake-server: every command,
# its human and --json output, its exit code, and the leader chase (a follower
# answering 503 with X-Tierkv-Leader, a dead endpoint first in the list).
# Usage: cli_e2e.sh TIERKV FAKE_SERVER
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

start_fake() { # name [args...]; sets PORT
    name=$1; shift
    "$FAKE" --port-file "$DIR/$name.port" "$@" &
    PIDS="$PIDS $!"
    i=0
    while [ ! -s "$DIR/$name.port" ]; do
        i=$((i + 1)); [ $i -gt 200 ] && { echo "fake server $name did not start"; exit 1; }
        sleep 0.05
    done
    PORT=$(cat "$DIR/$name.port")
}

start_fake leader --id 1
LEADER=127.0.0.1:$PORT
start_fake follower --id 2 --follower-of "$LEADER"
FOLLOWER=127.0.0.1:$PORT
# A port nothing listens on: bind-and-close is racy, port 1 is reserved.
DEAD=127.0.0.1:1

PASS=0
FAIL=0
# check NAME WANT_EXIT WANT_GREP -- tierkv args...   (WANT_GREP "" = no check)
check() {
    name=$1; want=$2; pattern=$3; shift 4
    "$TIERKV" "$@" >"$DIR/out" 2>"$DIR/err" </dev/null
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL $name: exit $got, want $want"; sed 's/^/  out: /' "$DIR/out"
        sed 's/^/  err: /' "$DIR/err"; FAIL=$((FAIL + 1)); return
    fi
    if [ -n "$pattern" ] && ! grep -q -- "$pattern" "$DIR/out" "$DIR/err"; then
        echo "FAIL $name: output lacks \"$pattern\""; sed 's/^/  out: /' "$DIR/out"
        sed 's/^/  err: /' "$DIR/err"; FAIL=$((FAIL + 1)); return
    fi
    echo "ok   $name"; PASS=$((PASS + 1))
}

E="--endpoints $LEADER"
check put-literal 0 "VERSION" -- $E put greeting "hello world"
check get-table 0 "hello world" -- $E get greeting
check get-json 0 '"value":"hello world"' -- $E --json get greeting
check get-value-only 0 "^hello world$" -- $E get greeting --value-only
check put-again-version-2 0 '"version":2' -- $E --json put greeting again
check put-if-version-ok 0 '"version":3' -- $E --json put greeting third --if-version 2
check put-if-version-conflict 4 "compare_failed" -- $E put greeting x --if-version 1
check put-ttl-json-body 0 "" -- $E put temp v --ttl 30s
check put-from-stdin-file 0 "" -- $E put fromfile --file "$0"
check put-odd-key 0 "" -- $E put "a/b c%d" odd
check get-odd-key 0 "odd" -- $E get "a/b c%d"
check get-missing 3 "not found" -- $E get nosuchkey
check get-missing-json 3 '"code":"not_found"' -- $E --json get nosuchkey
check get-base64 0 "greeting *third" -- $E --base64 get greeting
printf '\377\376bin' >"$DIR/bin"
check put-binary 0 "" -- $E put binkey --file "$DIR/bin"
check get-binary-marked 0 '"encoding":"base64"' -- $E --json get binkey
"$TIERKV" $E get binkey --value-only >"$DIR/bin.out" 2>&1
if cmp -s "$DIR/bin" "$DIR/bin.out"; then echo "ok   get-binary-value-only"; PASS=$((PASS + 1))
else echo "FAIL get-binary-value-only: bytes differ"; FAIL=$((FAIL + 1)); fi
check get-binary-table-escaped 0 '\\xff\\xfebin' -- $E get binkey
check incr-new 0 "5" -- $E incr counter 5
check incr-default 0 '"value":"6"' -- $E --json incr counter
check incr-negative 0 '"value":"-4"' -- $E --json incr counter -10
check incr-bad-delta 2 "DELTA" -- $E incr counter ten
check scan-prefix 0 "1 key" -- $E scan te --limit 10
check scan-json 0 '"items":\[' -- $E --json scan --prefix greet
check scan-limit-more 0 "more available" -- $E scan "" --limit 1
check scan-prefix-and-range 2 "not both" -- $E scan p --start a
check del-existing 0 "" -- $E del temp
check del-missing 3 "not found" -- $E del temp
printf '{"compare":[],"success":[]}' >"$DIR/txn.json"
check txn-succeeds 0 "succeeded: true" -- $E txn "$DIR/txn.json"
printf '{"fake_fail":true}' >"$DIR/txn-fail.json"
check txn-else-branch 4 '"succeeded":false' -- $E --json txn "$DIR/txn-fail.json"
printf '{"compare": [' >"$DIR/bad.json"
check txn-bad-json 2 "invalid JSON" -- $E txn "$DIR/bad.json"
check txn-missing-file 2 "cannot open" -- $E txn "$DIR/none.json"
check batch 0 "revision" -- $E batch "$DIR/txn.json"
check members 0 "HTTP" -- $E members
check members-json 0 '"members":\[' -- $E --json members
check status-all-up 0 "leader" -- --endpoints "$LEADER,$FOLLOWER" status
check status-one-down 5 "false" -- --endpoints "$LEADER,$DEAD" --timeout 1s status
check status-json 0 '"ready":true' -- --endpoints "$LEADER" --json status
# Every member, not only the endpoints: asked through the follower alone,
# status also shows the leader (member 1, found in the follower's /v1/cluster);
# member 2 is not shown twice (the follower answered as id 2).
check status-shows-members 0 "$LEADER" -- --endpoints "$FOLLOWER" status
check status-members-json 0 '"member":1' -- --endpoints "$FOLLOWER" --json status
"$TIERKV" --endpoints "$FOLLOWER" --json status >"$DIR/out" 2>&1
if python3 -c 'import json,sys; rows=json.load(open(sys.argv[1])); sys.exit(0 if sorted(r["cluster"]["id"] for r in rows)==[1,2] else 1)' "$DIR/out"; then
    echo "ok   status-one-row-per-member"; PASS=$((PASS + 1))
else echo "FAIL status-one-row-per-member"; sed 's/^/  out: /' "$DIR/out"; FAIL=$((FAIL + 1)); fi
# The leader chase.
check follower-redirects 0 "hello\|third" -- --endpoints "$FOLLOWER" get greeting
check dead-then-follower 0 "" -- --endpoints "$DEAD,$FOLLOWER" put chased yes
check chased-write-landed 0 "yes" -- $E get chased
check all-dead 5 "" -- --endpoints "$DEAD" --retries 0 get greeting
start_fake lost --id 3 --follower-of "$DEAD"
LOST=127.0.0.1:$PORT
check hint-to-dead-leader 5 "not_leader" -- --endpoints "$LOST" --retries 0 get greeting
check retries-then-503 5 "503" -- --endpoints "$LOST" --retries 1 --timeout 1s put k v
# Usage errors.
check no-command 2 "" --
check unknown-command 2 "unknown command" -- $E frobnicate
check bad-endpoints 2 "bad --endpoints" -- --endpoints "nohostport" get k
check bad-mode 2 "--mode" -- $E --mode sometimes put k v
check put-no-value-args 2 "" -- $E put
check help 0 "Exit codes" -- --help
check help-bench 0 "connections" -- help bench
export TIERKV_ENDPOINTS="$LEADER"
check env-endpoints 0 "hello\|third" -- get greeting
unset TIERKV_ENDPOINTS
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
