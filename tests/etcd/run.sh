#!/bin/sh
# Builds tests/etcd/main.go (etcd's Go client, go.etcd.io/etcd/client/v3
# v3.6.16) into the build dir and runs etcd_test.py with it against tierkvd.
# Modules come from the Go module proxy into the user's usual module cache
# and build cache (GOMODCACHE, GOCACHE: go's defaults), as tests/k8s/run.sh
# does; nothing is vendored, and once cached the build needs no network.
# Exit 77 (skip) only when `go` is not installed.
#
#   run.sh SOURCE_DIR BUILD_DIR TIERKVD [--script NAME.py] [ARGS...]
#
# NAME.py (default etcd_test.py) runs as NAME.py TIERKVD ETCD_CLIENT ARGS...
set -u
src=$1 tierkvd=$3
command -v go >/dev/null 2>&1 || { echo "go is not installed: skipped"; exit 77; }
mkdir -p "$2/tests/etcd" && out=$(cd "$2/tests/etcd" && pwd) || exit 1
tmp=$(mktemp "$out/etcd-client.XXXXXX") || exit 1
(cd "$src/tests/etcd" && GOFLAGS=-mod=mod flock "$out/.build-lock" go build -o "$tmp" .) ||
    { rm -f "$tmp"; exit 1; }
mv -f "$tmp" "$out/etcd-client" || exit 1
shift 3
script=etcd_test.py
if [ "${1:-}" = "--script" ]; then
    script=$2
    shift 2
fi
exec python3 "$src/tests/etcd/$script" "$tierkvd" "$out/etcd-client" "$@"
