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
check bad-endpoints 2 'bad endpoints "nohostport" (from --endpoints)' -- --endpoints "nohostport" get k
check bad-mode 2 "--mode" -- $E --mode sometimes put k v
check put-no-value-args 2 "" -- $E put
check help 0 "Exit codes" -- --help
check help-bench 0 "connections" -- help bench
check help-needs-no-endpoint 0 "Exit codes" -- --endpoints nohostport help
# Every command the usage lists answers `help COMMAND` (one table drives both).
for c in $("$TIERKV" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z]*\) .*/\1/p' | sort -u); do
    check "help-$c" 0 "usage" -- help "$c"
done
export TIERKV_ENDPOINTS="$LEADER"
check env-endpoints 0 "hello\|third" -- get greeting
unset TIERKV_ENDPOINTS
# logged NAME WANT_LINES PATTERN: the fixture's request log holds WANT_LINES
# lines matching PATTERN ("." counts every line).
logged() {
    got=$(grep -c -- "$3" "$DIR/requests.log" 2>/dev/null)
    if [ "${got:-0}" -eq "$2" ]; then echo "ok   $1"; PASS=$((PASS + 1))
    else echo "FAIL $1: $got requests matching \"$3\" reached the server, want $2"
        sed 's/^/  log: /' "$DIR/requests.log"; FAIL=$((FAIL + 1)); fi
}
# An empty key is a usage error (GET /v1/kv/ would list every key): exit 2, a
# message naming scan, and nothing sent.
start_fake logged --id 1 --request-log "$DIR/requests.log"
L="--endpoints 127.0.0.1:$PORT"
check get-empty-key 2 "the key is empty" -- $L get ''
check get-empty-key-names-scan 2 "tierkv scan" -- $L get ''
check get-empty-key-json 2 "the key is empty" -- $L --json get '' --value-only
check put-empty-key 2 "the key is empty" -- $L put '' v
check del-empty-key 2 "the key is empty" -- $L del ''
check incr-empty-key 2 "the key is empty" -- $L incr '' 3
check watch-empty-key 2 "the key is empty" -- $L watch ''
check lock-empty-name 2 "the key is empty" -- $L lock '' -- true
check elect-empty-name 2 "the key is empty" -- $L elect '' v
logged empty-keys-sent-nothing 0 "."
check get-real-key-is-sent 3 "not found" -- $L get nokey
logged request-log-records 1 "GET /v1/kv/nokey"
# snapshot save keeps an existing file unless --force.
check snapshot-put 0 "" -- $L put snapkey snapvalue
printf 'precious' >"$DIR/backup.tkv"
check snapshot-save-refuses 2 "--force" -- $L snapshot save "$DIR/backup.tkv"
check snapshot-save-refusal-names-file 2 "backup.tkv exists" -- $L snapshot save "$DIR/backup.tkv"
if [ "$(cat "$DIR/backup.tkv")" = precious ] && [ ! -e "$DIR/backup.tkv.part" ]; then
    echo "ok   snapshot-refused-file-unchanged"; PASS=$((PASS + 1))
else echo "FAIL snapshot-refused-file-unchanged"; FAIL=$((FAIL + 1)); fi
logged snapshot-refused-sent-nothing 0 "/v1/snapshot"
check snapshot-save-new 0 "hash *OK" -- $L snapshot save "$DIR/new.tkv"
# (the fixture's ?local download is not a backup: never renamed over FILE)
check snapshot-force-bad-download 1 "does not check out" -- $L snapshot save "$DIR/backup.tkv" --force --local
if [ "$(cat "$DIR/backup.tkv")" = precious ] && [ ! -e "$DIR/backup.tkv.part" ]; then
    echo "ok   snapshot-bad-download-file-unchanged"; PASS=$((PASS + 1))
else echo "FAIL snapshot-bad-download-file-unchanged"; FAIL=$((FAIL + 1)); fi
check snapshot-force-replaces 0 "keys *1" -- $L snapshot save "$DIR/backup.tkv" --force
if cmp -s "$DIR/backup.tkv" "$DIR/new.tkv" && [ ! -e "$DIR/backup.tkv.part" ]; then
    echo "ok   snapshot-force-file-replaced"; PASS=$((PASS + 1))
else echo "FAIL snapshot-force-file-replaced"; FAIL=$((FAIL + 1)); fi
check snapshot-status-replaced 0 "cluster_id  42" -- snapshot status "$DIR/backup.tkv"
# member add waits for the server's own answer: past the old 5 s per try, a
# success is a success (it used to time out, resend, and get its own change
# back as 409 change_pending: exit 4). About 6 s.
: >"$DIR/requests.log"
start_fake slowmember --id 1 --member-delay-ms 6000 --request-log "$DIR/requests.log"
SLOW="--endpoints 127.0.0.1:$PORT"
check member-add-slow-catch-up 0 "added" -- $SLOW member add 4 --raft 127.0.0.1:9
logged member-add-sent-once 1 "POST /v1/members"
# An answer that never comes (here --timeout 2s against a 3 s answer): not
# resent; member list tells whether the change took effect. About 3 s.
: >"$DIR/requests.log"
start_fake latemember --id 1 --member-delay-ms 3000 --request-log "$DIR/requests.log"
LATE="--endpoints 127.0.0.1:$PORT"
check member-add-timeout-confirmed 0 "member list shows node 5 as a voter" -- $LATE --timeout 2s member add 5 --raft 127.0.0.1:9
logged member-add-timeout-not-resent 1 "POST /v1/members"
logged member-add-timeout-asked-list 1 "GET /v1/members"
check member-add-existing-refused 4 "change_pending" -- $LATE member add 5 --raft 127.0.0.1:9
# Where the endpoints come from (docs/cli.md): -e, else TIERKV_ENDPOINTS,
# else ./data/endpoints (what make run writes), else 127.0.0.1:8080. The
# checks run in $DIR/proj, whose data/endpoints lists a dead endpoint, then
# the leader.
unset TIERKV_ENDPOINTS
mkdir -p "$DIR/proj/data"
printf '# make run writes this\n%s\n\n%s\n' "$DEAD" "$LEADER" >"$DIR/proj/data/endpoints"
chmod 644 "$DIR/proj/data/endpoints"
cd "$DIR/proj" || exit 1
check file-put 0 "" -- put fromfile yes
check file-get 0 "^yes$" -- get fromfile --value-only
check file-verbose-source 0 "endpoints $DEAD,$LEADER (from ./data/endpoints)" -- -v get fromfile
export TIERKV_ENDPOINTS="$DEAD"
check env-before-file 5 "from TIERKV_ENDPOINTS" -- -v --retries 0 get fromfile
check flag-before-env 0 "from --endpoints" -- -v -e "$LEADER" get fromfile
unset TIERKV_ENDPOINTS
printf '%s\n' "nohostport" >"$DIR/proj/data/endpoints"
check file-bad 2 'bad endpoints "nohostport" (from ./data/endpoints)' -- get fromfile
# A file others may write is not used (the default is, whatever answers it).
printf '%s\n' "$LEADER" >"$DIR/proj/data/endpoints"
chmod 666 "$DIR/proj/data/endpoints"
"$TIERKV" -v --retries 0 --timeout 1s get fromfile >"$DIR/out" 2>"$DIR/err" </dev/null
if grep -q "not yours alone to write" "$DIR/err" && grep -q "(from the default)" "$DIR/err"; then
    echo "ok   file-writable-by-others-ignored"; PASS=$((PASS + 1))
else
    echo "FAIL file-writable-by-others-ignored"; sed 's/^/  err: /' "$DIR/err"; FAIL=$((FAIL + 1))
fi
rm -f "$DIR/proj/data/endpoints"
"$TIERKV" -v --retries 0 --timeout 1s get fromfile >"$DIR/out" 2>"$DIR/err" </dev/null
if grep -q "endpoints 127.0.0.1:8080 (from the default)" "$DIR/err"; then
    echo "ok   no-file-default"; PASS=$((PASS + 1))
else
    echo "FAIL no-file-default"; sed 's/^/  err: /' "$DIR/err"; FAIL=$((FAIL + 1))
fi
cd - >/dev/null || exit 1
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
