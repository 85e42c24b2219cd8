#!/bin/sh
# Builds one of the Go programs beside this script (etcd36: etcd 3.6.16's
# server; clientbench: the clientv3 load generator) into CACHE_DIR/NAME, once:
# an existing binary newer than its go.mod, go.sum and main.go is kept.
# Modules come from the Go module proxy into the user's usual module and build
# caches (as tests/etcd/run.sh); once cached, no network is needed.
# Exit 0 with the binary in place, 1 when it cannot be built (no go, no
# network), 2 on bad arguments.
#
#   build.sh etcd36|clientbench CACHE_DIR
set -u
case ${1:-} in etcd36 | clientbench) ;; *) echo "usage: build.sh etcd36|clientbench CACHE_DIR" >&2; exit 2 ;; esac
[ -n "${2:-}" ] || { echo "usage: build.sh etcd36|clientbench CACHE_DIR" >&2; exit 2; }
src=$(cd "$(dirname "$0")/$1" && pwd) || exit 1
command -v go >/dev/null 2>&1 || { echo "build.sh: go is not installed" >&2; exit 1; }
mkdir -p "$2" && out=$(cd "$2" && pwd) || exit 1
bin="$out/$1"
if [ -x "$bin" ] && [ -z "$(find "$src/go.mod" "$src/go.sum" "$src/main.go" -newer "$bin")" ]; then
    exit 0
fi
tmp=$(mktemp "$bin.XXXXXX") || exit 1
if ! (cd "$src" && GOFLAGS=-mod=mod flock "$out/.build-lock" go build -o "$tmp" .); then
    rm -f "$tmp"
    echo "build.sh: go build of $src failed" >&2
    exit 1
fi
mv -f "$tmp" "$bin"
