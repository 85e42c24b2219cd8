#!/bin/bash
# deploy/k8s/tierkv-k8s-entrypoint (the pod's entrypoint) outside Kubernetes:
#   - its pure logic, sourced (TIERKV_K8S_LIB=1): the ordinal of a pod name,
#     the peers' DNS names and member lists, the candidate ids, the memory
#     budget, the plan for each state of the volume, /readyz's verdicts, the
#     parsing of `tierkv member list`; bad input refused;
#   - whole runs with a fake tierkvd (records its flags, makes a data
#     directory, runs until TERM) and a fake tierkv (answers `member` from
#     files; records every call): bootstrap of ordinal 0; a scale-up pod that
#     joins as a learner and is promoted; an id removed before (409) skipped
#     for the next generation; a restart with its volume as itself (no member
#     change); an amnesiac (refused three times) that removes its old id and
#     joins under a new one, keeping it in the volume; the preStop hook of an
#     elastic pod and of an initial one; no token: exit 2.
# No Kubernetes, no Docker.    usage: entrypoint_test.sh SOURCE_DIR
set -u
src=$(cd "$1" && pwd)
ep="$src/deploy/k8s/tierkv-k8s-entrypoint"
tmp=$(mktemp -d)
epid=""
cleanup() {
    [ -n "$epid" ] && kill -TERM "$epid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
failed=0
fail() {
    echo "FAIL: $*"
    failed=1
}
eq() { # eq WHAT GOT WANT
    if [ "$2" = "$3" ]; then echo "ok: $1"; else fail "$1: got [$2], want [$3]"; fi
}

# ---- pure logic ----
(
    TIERKV_K8S_LIB=1
    # shellcheck source=/dev/null
    . "$ep"
    f=0
    chk() {
        if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: got [$2], want [$3]"; f=1; fi
    }
    chk "ordinal tierkv-0" "$(k8s_ordinal tierkv-0 tierkv)" 0
    chk "ordinal tierkv-12" "$(k8s_ordinal tierkv-12 tierkv)" 12
    for bad in tierkv tierkv- tierkv-01 tierkv-x other-1 tierkv-1000 tierkv--1 ""; do
        k8s_ordinal "$bad" tierkv >/dev/null && { echo "FAIL: ordinal of \"$bad\" accepted"; f=1; }
    done
    echo "ok: bad pod names refused"
    chk host "$(k8s_host 2)" tierkv-2.tierkv-peer
    chk members "$(k8s_members 3 7000)" \
        "1=tierkv-0.tierkv-peer:7000,2=tierkv-1.tierkv-peer:7000,3=tierkv-2.tierkv-peer:7000"
    chk "members but 1" "$(k8s_members 3 8080 1)" \
        "1=tierkv-0.tierkv-peer:8080,3=tierkv-2.tierkv-peer:8080"
    chk "dns suffix" "$(dns_suffix=ns.svc.cluster.local k8s_host 0)" \
        tierkv-0.tierkv-peer.ns.svc.cluster.local
    chk "candidate 3 gen 0" "$(k8s_candidate 3 0)" 4
    chk "candidate 1 gen 2" "$(k8s_candidate 1 2)" 2002
    chk "budget 1024" "$(k8s_budget 1024)" 512M
    for bad in 100 "" 1G -5; do
        k8s_budget "$bad" >/dev/null && { echo "FAIL: budget of \"$bad\" accepted"; f=1; }
    done
    echo "ok: bad memory limits refused"
    # plan: ordinal, initial size, state, data present
    chk "plan fresh cluster" "$(k8s_plan 0 3 "" 0)" "bootstrap 1"
    chk "plan initial restart" "$(k8s_plan 2 3 id=3 1)" "bootstrap 3"
    chk "plan initial empty volume" "$(k8s_plan 1 3 "" 0)" "bootstrap 2"
    chk "plan scale-up" "$(k8s_plan 3 3 "" 0)" "join 4"
    chk "plan joined restart" "$(k8s_plan 3 3 id=4 1)" "rejoin 4"
    chk "plan replaced restart" "$(k8s_plan 1 3 id=1002 1)" "rejoin 1002"
    chk "plan removed" "$(k8s_plan 4 3 "id=5 removed" 1)" "fresh 5"
    chk "plan joined, data lost" "$(k8s_plan 3 3 id=4 0)" "join 4"
    for bad in "id=x" "junk" "id=4 gone"; do
        k8s_plan 3 3 "$bad" 1 >/dev/null && { echo "FAIL: state \"$bad\" accepted"; f=1; }
    done
    echo "ok: bad states refused"
    chk "readyz ok" "$(k8s_classify '{"ready":true}')" ready
    chk "readyz amnesiac" "$(k8s_classify '{"error":{"code":"not_a_member","message":"x"}}')" refused
    chk "readyz removed" "$(k8s_classify '{"error":{"code":"removed","message":"x"}}')" removed
    chk "readyz no leader" "$(k8s_classify '{"error":{"code":"no_leader"}}')" waiting
    chk "readyz nothing" "$(k8s_classify '')" waiting
    list='ID     ROLE     RAFT                     HTTP                     LEADER  LAG
1      voter    tierkv-0.tierkv-peer:7000 tierkv-0.tierkv-peer:8080 yes     0
2      voter    tierkv-1.tierkv-peer:7000 tierkv-1.tierkv-peer:8080         0
config index 0'
    chk holders "$(printf '%s\n' "$list" | k8s_holders tierkv-1.tierkv-peer:7000)" 2
    chk "no holder" "$(printf '%s\n' "$list" | k8s_holders tierkv-5.tierkv-peer:7000)" ""
    printf '%s\n' "$list" | k8s_listed 2 && echo "ok: listed 2" || { echo "FAIL: 2 not listed"; f=1; }
    printf '%s\n' "$list" | k8s_listed 7 && { echo "FAIL: 7 listed"; f=1; }
    exit $f
) || failed=1

# ---- whole runs with fakes ----
mkdir "$tmp/bin" "$tmp/secret"
printf '%s\n' 0123456789abcdef0123456789abcdef >"$tmp/secret/peer-token"
cat >"$tmp/bin/tierkvd" <<'FAKE'
#!/bin/bash
echo "tierkvd $*" >>"$FAKE_DIR/calls"
d=""
prev=""
for a in "$@"; do [ "$prev" = --data-dir ] && d=$a; prev=$a; done
mkdir -p "$d/log" && : >"$d/log/meta"
trap 'echo "tierkvd TERM" >>"$FAKE_DIR/calls"; exit 0' TERM
for ((i = 0; i < 600; i++)); do sleep 0.1; done
FAKE
cat >"$tmp/bin/tierkv" <<'FAKE'
#!/bin/bash
echo "tierkv $*" >>"$FAKE_DIR/calls"
shift 2 # -e CLIENT
[ "$1" = member ] || exit 0
case $2 in
list) cat "$FAKE_DIR/members" 2>/dev/null || exit 5 ;;
add)
    if [ -e "$FAKE_DIR/removed-$3" ]; then
        echo "tierkv: member add: HTTP 409 from h:8080: conflict: node $3 was removed" >&2
        exit 4
    fi ;;
esac
exit 0
FAKE
cat >"$tmp/bin/probe" <<'FAKE'
#!/bin/bash
cat "$FAKE_DIR/readyz" 2>/dev/null
FAKE
chmod +x "$tmp/bin/"*

# run NAME POD [ARGS]: the entrypoint for pod POD with the volume
# $tmp/NAME/vol, in the background ($epid).
run() {
    local d=$tmp/$1
    mkdir -p "$d/vol" "$d/run"
    FAKE_DIR=$d TIERKV_ENTRYPOINT_BIN=$tmp/bin TIERKV_K8S_PROBE=$tmp/bin/probe \
        TIERKV_K8S_POLL=0.05 TIERKV_K8S_POD_NAME=$2 TIERKV_K8S_VOLUME=$d/vol \
        TIERKV_K8S_SECRET_DIR=$tmp/secret TIERKV_K8S_RUN_DIR=$d/run \
        TIERKV_K8S_TLS_DIR=$tmp/none TIERKV_K8S_MEMORY_LIMIT_MI=1024 \
        "$ep" "${@:3}" >"$d/out" 2>&1 &
    epid=$!
}
# until NAME PATTERN: wait (up to 20 s) for a line of NAME's calls to match.
until_call() {
    local i
    for ((i = 0; i < 200; i++)); do
        grep -q -e "$2" "$tmp/$1/calls" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "$1: no call matching \"$2\"; calls: $(cat "$tmp/$1/calls" 2>/dev/null); out: $(cat "$tmp/$1/out")"
    return 1
}
# finish NAME: TERM the entrypoint; it must pass it on and exit 0.
finish() {
    kill -TERM "$epid"
    local i
    for ((i = 0; i < 200; i++)); do
        kill -0 "$epid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$epid"
    eq "$1: exit on TERM" $? 0
    epid=""
    grep -q "tierkvd TERM" "$tmp/$1/calls" || fail "$1: tierkvd did not get TERM"
}
calls() { cat "$tmp/$1/calls"; }

# Bootstrap: ordinal 0 of a new cluster.
run boot tierkv-0
until_call boot "^tierkvd " && finish boot
eq "boot: flags" "$(grep '^tierkvd --' "$tmp/boot/calls")" \
    "tierkvd --id 1 --listen-http 0.0.0.0:8080 --listen-raft 0.0.0.0:7000 --data-dir $tmp/boot/vol/data --peer-token-file $tmp/boot/run/peer-token --members 1=tierkv-0.tierkv-peer:7000,2=tierkv-1.tierkv-peer:7000,3=tierkv-2.tierkv-peer:7000 --members-http 1=tierkv-0.tierkv-peer:8080,2=tierkv-1.tierkv-peer:8080,3=tierkv-2.tierkv-peer:8080"
eq "boot: state" "$(cat "$tmp/boot/vol/k8s-member")" id=1
eq "boot: token mode" "$(stat -c %a "$tmp/boot/run/peer-token")" 600
grep -q "^tierkv " "$tmp/boot/calls" && fail "boot: a member change was made"

# Scale-up: ordinal 3 joins as id 4, learner, then promoted.
run grow tierkv-3
until_call grow "member promote 4" && finish grow
eq "grow: tierkvd" "$(grep '^tierkvd --' "$tmp/grow/calls")" \
    "tierkvd --id 4 --listen-http 0.0.0.0:8080 --listen-raft 0.0.0.0:7000 --data-dir $tmp/grow/vol/data --peer-token-file $tmp/grow/run/peer-token --join --members 1=tierkv-0.tierkv-peer:7000,2=tierkv-1.tierkv-peer:7000,3=tierkv-2.tierkv-peer:7000"
grep -q "^tierkv -e tierkv:8080 member add 4 --raft tierkv-3.tierkv-peer:7000 --http tierkv-3.tierkv-peer:8080 --learner$" \
    "$tmp/grow/calls" && echo "ok: grow: added as a learner" || fail "grow: no learner add: $(calls grow)"
eq "grow: state" "$(cat "$tmp/grow/vol/k8s-member")" id=4

# Scale-up again after 4 was removed: 4 is refused (409), 1004 is used.
mkdir -p "$tmp/again"
: >"$tmp/again/removed-4"
run again tierkv-3
until_call again "member promote 1004" && finish again
eq "again: adds" "$(grep -c 'member add' "$tmp/again/calls")" 2
eq "again: state" "$(cat "$tmp/again/vol/k8s-member")" id=1004

# Restart with its volume: the grown pod comes back as 4, no member change.
rm -f "$tmp/grow/calls"
run grow tierkv-3
until_call grow "^tierkvd " && finish grow
grep -q -- "--id 4 .*--join" "$tmp/grow/calls" && echo "ok: rejoin as 4" || fail "rejoin: $(calls grow)"
grep -q "^tierkv " "$tmp/grow/calls" && fail "rejoin: a member change was made: $(calls grow)"

# Amnesiac: ordinal 1, empty volume, the cluster still has node 2 at its
# address and refuses it: it removes 2 and joins as 1002 (2 was removed).
mkdir -p "$tmp/amn"
printf '%s\n' '{"error":{"code":"not_a_member","message":"refused"}}' >"$tmp/amn/readyz"
cat >"$tmp/amn/members" <<'EOF'
ID     ROLE     RAFT                     HTTP                     LEADER  LAG
1      voter    tierkv-0.tierkv-peer:7000 tierkv-0.tierkv-peer:8080 yes     0
2      voter    tierkv-1.tierkv-peer:7000 tierkv-1.tierkv-peer:8080         0
3      voter    tierkv-2.tierkv-peer:7000 tierkv-2.tierkv-peer:8080         0
config index 0
EOF
run amn tierkv-1
until_call amn "member remove 2" && {
    printf '%s\n' '{"ready":true}' >"$tmp/amn/readyz"
    grep -v '^2 ' "$tmp/amn/members" >"$tmp/amn/m" && mv "$tmp/amn/m" "$tmp/amn/members"
}
until_call amn "member promote 1002" && finish amn
eq "amnesiac: tierkvd starts" "$(grep -o -e '--id [0-9]*' "$tmp/amn/calls" | tr '\n' ' ')" \
    "--id 2 --id 1002 "
grep -q -- "--id 1002 .*--join --members 1=tierkv-0.tierkv-peer:7000,3=tierkv-2.tierkv-peer:7000$" \
    "$tmp/amn/calls" && echo "ok: amnesiac: joins without its own address" || fail "amnesiac: $(calls amn)"
eq "amnesiac: state" "$(cat "$tmp/amn/vol/k8s-member")" id=1002
grep -q "removing node 2" "$tmp/amn/out" || fail "amnesiac: no message: $(cat "$tmp/amn/out")"

# preStop: the elastic pod (ordinal 3, id 4) leaves; ordinal 0 stays.
FAKE_DIR=$tmp/grow TIERKV_ENTRYPOINT_BIN=$tmp/bin TIERKV_K8S_POD_NAME=tierkv-3 \
    TIERKV_K8S_VOLUME=$tmp/grow/vol "$ep" prestop >/dev/null 2>&1
eq "prestop elastic: exit" $? 0
grep -q "member remove 4" "$tmp/grow/calls" && echo "ok: prestop removes 4" || fail "prestop: $(calls grow)"
eq "prestop elastic: state" "$(cat "$tmp/grow/vol/k8s-member")" "id=4 removed"
rm -f "$tmp/boot/calls"
FAKE_DIR=$tmp/boot TIERKV_ENTRYPOINT_BIN=$tmp/bin TIERKV_K8S_POD_NAME=tierkv-0 \
    TIERKV_K8S_VOLUME=$tmp/boot/vol "$ep" prestop >/dev/null 2>&1
eq "prestop initial: exit" $? 0
[ -e "$tmp/boot/calls" ] && fail "prestop initial: $(calls boot)"
eq "prestop initial: state" "$(cat "$tmp/boot/vol/k8s-member")" id=1

# Scale-down: the preStop hook removes the member while tierkvd still runs;
# the node then answers 503 removed, and the entrypoint must not rejoin.
run leave tierkv-4
until_call leave "member promote 5"
printf '%s\n' '{"error":{"code":"removed","message":"x"}}' >"$tmp/leave/readyz"
FAKE_DIR=$tmp/leave TIERKV_ENTRYPOINT_BIN=$tmp/bin TIERKV_K8S_POD_NAME=tierkv-4 \
    TIERKV_K8S_VOLUME=$tmp/leave/vol "$ep" prestop >/dev/null 2>&1
sleep 1 # 20 probes
finish leave
eq "leave: tierkvd starts" "$(grep -c '^tierkvd --' "$tmp/leave/calls")" 1
eq "leave: adds" "$(grep -c 'member add' "$tmp/leave/calls")" 1

# Removed, then back with that volume: empties it and joins under a new id.
: >"$tmp/grow/removed-4"
: >"$tmp/grow/vol/data/old-entry"
rm -f "$tmp/grow/calls"
run grow tierkv-3
until_call grow "member promote 1004" && finish grow
[ -e "$tmp/grow/vol/data/old-entry" ] && fail "removed: the old data was kept"
[ -e "$tmp/grow/vol/data/log/meta" ] && echo "ok: removed: data remade" || fail "removed: no data"
eq "removed: state" "$(cat "$tmp/grow/vol/k8s-member")" id=1004

# Bad settings: exit 2 with a reason, tierkvd not run.
mkdir -p "$tmp/bad"
for c in "TIERKV_K8S_POD_NAME=web-0" "TIERKV_K8S_SECRET_DIR=$tmp/none" \
    "TIERKV_K8S_INITIAL_SIZE=x" "TIERKV_K8S_MEMORY_LIMIT_MI=64"; do
    env FAKE_DIR="$tmp/bad" TIERKV_ENTRYPOINT_BIN="$tmp/bin" TIERKV_K8S_POD_NAME=tierkv-0 \
        TIERKV_K8S_VOLUME="$tmp/bad/vol" TIERKV_K8S_SECRET_DIR="$tmp/secret" \
        TIERKV_K8S_RUN_DIR="$tmp/bad/run" "$c" "$ep" >"$tmp/bad/out" 2>&1
    rc=$?
    eq "bad $c: exit" "$rc" 2
    [ -s "$tmp/bad/out" ] || fail "bad $c: no message"
done
[ -e "$tmp/bad/calls" ] && fail "bad settings: tierkvd ran: $(calls bad)"

if [ "$failed" = 0 ]; then echo "all passed"; fi
exit "$failed"
