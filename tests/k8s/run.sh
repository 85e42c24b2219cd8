#!/bin/sh
# Builds tests/k8s/main.go (k8s-manifests) into the build dir and runs it on a
# kustomization: deploy/k8s, or a known-bad fixture with the problem it must
# report. Modules come from the Go module proxy into the user's usual module
# cache and build cache (GOMODCACHE, GOCACHE: go's defaults); nothing is
# vendored. Exit 77 (skip) only when `go` is not installed.
#
#   run.sh SOURCE_DIR BUILD_DIR KUSTOMIZATION_DIR [EXPECTED_PROBLEM]
#
# With EXPECTED_PROBLEM (a known-bad fixture, registered should_fail) the
# check must fail and print it: it exits 1 then, and 0 (a should_fail
# failure) if the check passed or failed for another reason.
set -u
src=$1 dir=$3 expect=${4:-}
command -v go >/dev/null 2>&1 || { echo "go is not installed: skipped"; exit 77; }
mkdir -p "$2/tests/k8s" && out=$(cd "$2/tests/k8s" && pwd) || exit 1
tmp=$(mktemp "$out/k8s-manifests.XXXXXX") || exit 1
# One build at a time (the three tests may start together): the others then
# find every package in the build cache.
(cd "$src/tests/k8s" && GOFLAGS=-mod=mod flock "$out/.build-lock" go build -o "$tmp" .) ||
    { rm -f "$tmp"; exit 1; }
mv -f "$tmp" "$out/k8s-manifests" || exit 1
log=$("$out/k8s-manifests" "$src" "$dir" 2>&1)
rc=$?
printf '%s\n' "$log"
[ -z "$expect" ] && exit "$rc"
if [ "$rc" = 0 ]; then
    echo "the known-bad $dir passed the check"
    exit 0
fi
case $log in
*"$expect"*) exit 1 ;;
esac
echo "the known-bad $dir failed, but not with \"$expect\""
exit 0
