#!/bin/sh
# deploy/compose picks the Compose this machine has. Runs it with fake
# `docker` and `docker-compose` commands (and nothing else on PATH but
# dirname), which record their arguments:
#   1. docker with the compose plugin (and docker-compose too): docker compose
#   2. docker without the plugin, docker-compose present: docker-compose
#   3. neither: exit 127 and a message naming both
#   4. TIERKV_COMPOSE=v1 with both present: docker-compose
#   5. TIERKV_COMPOSE=v2 without the plugin: exit 127
# In every case the arguments follow `-f deploy/docker-compose.yml` unchanged.
# No Docker needed.    usage: compose_wrapper_test.sh SOURCE_DIR
set -u
src=$(cd "$1" && pwd)
wrapper="$src/deploy/compose"
file="$src/deploy/docker-compose.yml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# fakes DIR PLUGIN(yes/no) V1(yes/no)
fakes() {
    rm -rf "$1"; mkdir -p "$1"
    ln -s "$(command -v dirname)" "$1/dirname"
    cat >"$1/docker" <<FAKE
#!/bin/sh
if [ "\$1" = compose ] && [ "$2" = no ]; then
    echo "docker: 'compose' is not a docker command." >&2; exit 1
fi
if [ "\$1 \${2:-}" = "compose version" ]; then echo "Docker Compose version v2.99"; exit 0; fi
echo "docker \$*" >>"$tmp/calls"
FAKE
    chmod +x "$1/docker"
    if [ "$3" = yes ]; then
        cat >"$1/docker-compose" <<FAKE
#!/bin/sh
if [ "\$1" = version ]; then echo "docker-compose version 1.29.2"; exit 0; fi
echo "docker-compose \$*" >>"$tmp/calls"
FAKE
        chmod +x "$1/docker-compose"
    fi
}

# case NAME PLUGIN V1 WANT_RC WANT_CALL [ENV...]
case_() {
    name=$1 plugin=$2 v1=$3 want_rc=$4 want=$5
    shift 5
    fakes "$tmp/bin" "$plugin" "$v1"
    rm -f "$tmp/calls"
    env PATH="$tmp/bin" "$@" "$wrapper" -p demo up -d >"$tmp/out" 2>"$tmp/err"
    rc=$?
    got=$(cat "$tmp/calls" 2>/dev/null)
    if [ "$rc" -ne "$want_rc" ] || [ "$got" != "$want" ]; then
        echo "FAIL $name: exit $rc (want $want_rc), ran '$got' (want '$want')"
        sed 's/^/  stderr: /' "$tmp/err"
        failed=$((failed + 1))
    else
        echo "ok   $name: exit $rc${got:+, ran $got}$( [ -s "$tmp/err" ] && printf ', said: %s' "$(cat "$tmp/err")")"
    fi
}

case_ "plugin present" yes yes 0 "docker compose -f $file -p demo up -d"
case_ "only docker-compose" no yes 0 "docker-compose -f $file -p demo up -d"
case_ "neither" no no 127 ""
grep -q "docker-compose" "$tmp/err" && grep -q "docker compose" "$tmp/err" ||
    { echo "FAIL neither: the message names not both"; failed=$((failed + 1)); }
case_ "TIERKV_COMPOSE=v1 with both" yes yes 0 "docker-compose -f $file -p demo up -d" TIERKV_COMPOSE=v1
case_ "TIERKV_COMPOSE=v2 without the plugin" no yes 127 "" TIERKV_COMPOSE=v2
[ "$failed" -eq 0 ] || exit 1
