#!/bin/sh
# Builds etcdctl v3.6.16 from the Go module proxy (the wrapper module
# tests/etcd/etcdctl36: go build go.etcd.io/etcd/etcdctl/v3) and snapcheck
# (tests/etcd/etcdctl36/snapcheck, grpc-go against Maintenance.Snapshot's
# bounds) into the build dir, then runs etcdctl_test.py with them against
# tierkvd. Modules and the
# build cache are go's defaults (GOMODCACHE, GOCACHE), as tests/etcd/run.sh;
# nothing is vendored, and once cached the build needs no network (the first
# build takes about 35 s). Exit 77 (skip) only when `go` is not installed.
#
#   etcdctl36.sh SOURCE_DIR BUILD_DIR TIERKVD [--against-http]
set -u
src=$1 tierkvd=$3
command -v go >/dev/null 2>&1 || { echo "go is not installed: skipped"; exit 77; }
mkdir -p "$2/tests/etcd" && out=$(cd "$2/tests/etcd" && pwd) || exit 1
tmp=$(mktemp "$out/etcdctl36.XXXXXX") || exit 1
tmp2=$(mktemp "$out/snapcheck.XXXXXX") || { rm -f "$tmp"; exit 1; }
(cd "$src/tests/etcd/etcdctl36" && GOFLAGS=-mod=mod flock "$out/.build-lock" sh -c \
    'go build -o "$1" go.etcd.io/etcd/etcdctl/v3 && go build -o "$2" ./snapcheck' \
    sh "$tmp" "$tmp2") || { rm -f "$tmp" "$tmp2"; exit 1; }
mv -f "$tmp" "$out/etcdctl36" && mv -f "$tmp2" "$out/snapcheck" || exit 1
shift 3
exec python3 "$src/tests/etcd/etcdctl_test.py" "$tierkvd" --etcdctl "$out/etcdctl36" \
    --snapcheck "$out/snapcheck" "$@"
