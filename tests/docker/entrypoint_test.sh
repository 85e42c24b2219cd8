#!/bin/bash
# deploy/tierkv-entrypoint (the image's entrypoint) outside Docker, with fake
# tierkvd and tierkv (TIERKV_ENTRYPOINT_BIN) that print their arguments and
# the token they would read:
#   - no token, no peer TLS, no TIERKV_INSECURE_PEERS: exit 2, tierkvd not run,
#     the message says how to give one (openssl rand -hex 32, a docker secret
#     or mounted file, TIERKV_PEER_TOKEN_FILE); so do a missing or empty token
#     file, TIERKV_INSECURE_PEERS=false/0/no, --insecure-peers=false, and a
#     non-boolean (exit 2, "not a boolean");
#   - a token file (env, --peer-token-file F, --peer-token-file=F), peer TLS,
#     TIERKV_INSECURE_PEERS=true/1/yes or --insecure-peers: tierkvd runs with
#     the arguments unchanged;
#   - --help, --version, `tierkv ARGS`, `tierkvd --help`: pass through;
#   - TIERKV_PEER_TOKEN_GENERATE=true: a 64-hex token made at
#     TIERKV_PEER_TOKEN_FILE, mode 0600, reused on the next start, a loose
#     (0644) one made 0600; eight nodes starting at once on one empty
#     directory all read the same token and leave no temporary file.
# No Docker needed.    usage: entrypoint_test.sh SOURCE_DIR
set -u
src=$(cd "$1" && pwd)
ep="$src/deploy/tierkv-entrypoint"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
mkdir "$tmp/bin"
cat >"$tmp/bin/tierkvd" <<'FAKE'
#!/bin/sh
tok=""
[ -n "${TIERKV_PEER_TOKEN_FILE:-}" ] && [ -f "$TIERKV_PEER_TOKEN_FILE" ] &&
    tok=$(cat "$TIERKV_PEER_TOKEN_FILE")
echo "RAN tierkvd [$*] file=${TIERKV_PEER_TOKEN_FILE:-} token=$tok"
FAKE
cat >"$tmp/bin/tierkv" <<'FAKE'
#!/bin/sh
echo "RAN tierkv [$*]"
FAKE
chmod +x "$tmp/bin/tierkvd" "$tmp/bin/tierkv"
printf '%s\n' 0123456789abcdef0123456789abcdef >"$tmp/token"
chmod 600 "$tmp/token"
: >"$tmp/empty"

# run ENV... -- ARGS...: the entrypoint with only ENV (and PATH); sets rc, out.
run() {
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    out=$(env -i PATH=/usr/bin:/bin TIERKV_ENTRYPOINT_BIN="$tmp/bin" "${envs[@]}" \
        "$ep" "$@" 2>&1)
    rc=$?
}

fail() {
    echo "FAIL: $*"
    echo "  output: $out"
    failed=1
}

# expect NAME RC PATTERN ENV... -- ARGS...: exit RC and output matching PATTERN
# (a grep -E regex on some line); a refusal (RC 2) must not have run tierkvd,
# a start (RC 0) must have.
expect() {
    local name=$1 want_rc=$2 pat=$3
    shift 3
    run "$@"
    if [ "$rc" != "$want_rc" ]; then
        fail "$name: exit $rc, want $want_rc"
    elif ! grep -Eq -- "$pat" <<<"$out"; then
        fail "$name: output does not match /$pat/"
    elif [ "$want_rc" = 2 ] && grep -q RAN <<<"$out"; then
        fail "$name: refused but ran tierkvd"
    elif [ "$want_rc" = 0 ] && ! grep -q '^RAN ' <<<"$out"; then
        fail "$name: ran neither tierkvd nor tierkv"
    else
        echo "ok: $name"
    fi
}

howto='openssl rand -hex 32'
expect "no token: refused with how to give one" 2 "$howto" -- --id 1
expect "the how-to names a docker secret" 2 "docker secret" --
expect "the how-to names TIERKV_PEER_TOKEN_FILE" 2 "TIERKV_PEER_TOKEN_FILE=" --
expect "no arguments at all: refused" 2 "refusing to start tierkvd" --
expect "TIERKV_PEER_TOKEN_FILE missing: refused" 2 "missing, unreadable" \
    TIERKV_PEER_TOKEN_FILE="$tmp/nope" -- --id 1
expect "TIERKV_PEER_TOKEN_FILE empty: refused" 2 "missing, unreadable" \
    TIERKV_PEER_TOKEN_FILE="$tmp/empty" -- --id 1
expect "--peer-token-file missing: refused" 2 "missing, unreadable" \
    -- --id 1 --peer-token-file "$tmp/nope"
expect "TIERKV_PEER_TOKEN_FILE empty string counts as unset" 2 "refusing" \
    TIERKV_PEER_TOKEN_FILE= -- --id 1
for v in false 0 no; do
    expect "TIERKV_INSECURE_PEERS=$v: refused" 2 "refusing" TIERKV_INSECURE_PEERS=$v -- --id 1
done
expect "--insecure-peers=false: refused" 2 "refusing" -- --id 1 --insecure-peers=false
expect "TIERKV_INSECURE_PEERS=maybe: not a boolean" 2 "not a boolean" \
    TIERKV_INSECURE_PEERS=maybe -- --id 1
expect "--insecure-peers=on: not a boolean" 2 "not a boolean" -- --insecure-peers=on
expect "TIERKV_PEER_TOKEN_GENERATE=sure: not a boolean" 2 "not a boolean" \
    TIERKV_PEER_TOKEN_GENERATE=sure TIERKV_PEER_TOKEN_FILE="$tmp/token" --

expect "TIERKV_PEER_TOKEN_FILE: runs tierkvd" 0 "^RAN tierkvd \[--id 1\] .*token=0123" \
    TIERKV_PEER_TOKEN_FILE="$tmp/token" -- --id 1
expect "--peer-token-file FILE: runs tierkvd" 0 \
    "^RAN tierkvd \[--id 1 --peer-token-file $tmp/token\] " -- --id 1 --peer-token-file "$tmp/token"
expect "--peer-token-file=FILE: runs tierkvd" 0 "^RAN tierkvd \[--peer-token-file=$tmp/token\]" \
    -- --peer-token-file="$tmp/token"
expect "the last --peer-token-file wins (a missing one)" 2 "missing" \
    -- --peer-token-file "$tmp/token" --peer-token-file "$tmp/nope"
expect "tierkvd FLAGS: checked like FLAGS" 2 "refusing" -- tierkvd --id 1
expect "tierkvd FLAGS with a token: runs tierkvd" 0 "^RAN tierkvd \[--id 1\]" \
    TIERKV_PEER_TOKEN_FILE="$tmp/token" -- tierkvd --id 1
expect "TIERKV_PEER_CERT_FILE: runs tierkvd (peer TLS)" 0 "^RAN tierkvd" \
    TIERKV_PEER_CERT_FILE=/etc/cert.pem -- --id 1
expect "--peer-cert-file: runs tierkvd (peer TLS)" 0 "^RAN tierkvd" \
    -- --peer-cert-file /etc/cert.pem --id 1
for v in true 1 yes; do
    expect "TIERKV_INSECURE_PEERS=$v: runs tierkvd, warned" 0 "warning: TIERKV_INSECURE_PEERS" \
        TIERKV_INSECURE_PEERS=$v -- --id 1
done
expect "--insecure-peers: runs tierkvd" 0 "RAN tierkvd \[--id 1 --insecure-peers\]" \
    -- --id 1 --insecure-peers
expect "--help passes through" 0 "^RAN tierkvd \[--help\]" -- --help
expect "-h passes through" 0 "^RAN tierkvd \[-h\]" -- -h
expect "--version passes through" 0 "^RAN tierkvd \[--version\]" -- --version
expect "tierkvd --help passes through" 0 "^RAN tierkvd \[--help\]" -- tierkvd --help
expect "tierkv ARGS: the CLI" 0 "^RAN tierkv \[status --endpoints x\]$" -- tierkv status \
    --endpoints x

# TIERKV_PEER_TOKEN_GENERATE: made once, 0600, reused, loose mode fixed.
sec="$tmp/secrets"
mkdir "$sec"
expect "generate: made" 0 "made a new cluster token" \
    TIERKV_PEER_TOKEN_GENERATE=true TIERKV_PEER_TOKEN_FILE="$sec/peer-token" -- --id 1
tok=$(cat "$sec/peer-token" 2>/dev/null)
mode=$(stat -c %a "$sec/peer-token" 2>/dev/null)
if ! grep -Eq '^[0-9a-f]{64}$' <<<"$tok"; then
    fail "generate: the token is not 64 hex digits: '$tok'"
elif [ "$mode" != 600 ]; then
    fail "generate: mode $mode, want 600"
elif ! grep -q "token=$tok" <<<"$out"; then
    fail "generate: tierkvd did not get the token file"
else
    echo "ok: generate: 64 hex digits, mode 0600, given to tierkvd"
fi
expect "generate: reused" 0 "token=$tok" \
    TIERKV_PEER_TOKEN_GENERATE=1 TIERKV_PEER_TOKEN_FILE="$sec/peer-token" -- --id 2
chmod 644 "$sec/peer-token"
expect "generate: a loose token file made 0600" 0 "made .* mode 0600" \
    TIERKV_PEER_TOKEN_GENERATE=yes TIERKV_PEER_TOKEN_FILE="$sec/peer-token" -- --id 3
mode=$(stat -c %a "$sec/peer-token")
[ "$mode" = 600 ] || fail "generate: the loose token file is still mode $mode"
grep -q "token=$tok" <<<"$out" || fail "generate: the fixed token file was not reused"
expect "generate=false: no token made, refused" 2 "refusing" \
    TIERKV_PEER_TOKEN_GENERATE=false -- --id 1

# Eight nodes at once on an empty shared directory: one token for all.
race="$tmp/race"
mkdir "$race"
for i in 1 2 3 4 5 6 7 8; do
    env -i PATH=/usr/bin:/bin TIERKV_ENTRYPOINT_BIN="$tmp/bin" TIERKV_PEER_TOKEN_GENERATE=true \
        TIERKV_PEER_TOKEN_FILE="$race/peer-token" "$ep" --id "$i" >"$tmp/race.$i" 2>&1 &
done
wait
out=$(cat "$tmp"/race.*)
seen=$(grep -o 'token=[0-9a-f]*' <<<"$out" | sort -u)
left=$(ls -A "$race")
if [ "$(grep -c '^RAN tierkvd' <<<"$out")" != 8 ]; then
    fail "race: not all eight ran tierkvd"
elif [ "$(wc -l <<<"$seen")" != 1 ] || ! grep -Eq '^token=[0-9a-f]{64}$' <<<"$seen"; then
    fail "race: the eight read different or bad tokens: $seen"
elif [ "$left" != peer-token ]; then
    fail "race: left in the directory: $left"
else
    echo "ok: race: eight nodes, one token, no temporary file left"
fi

if [ "$failed" != 0 ]; then
    echo "entrypoint test FAILED"
    exit 1
fi
echo "entrypoint test passed"
