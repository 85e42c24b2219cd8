#!/usr/bin/env bash
# Checks a library's exports against a header's TK_API declarations.
#
#   check-exports.sh HEADER LIBRARY
#
# LIBRARY is a shared library (its dynamic symbols, nm -D) or a static archive
# (its defined global symbols of default visibility, readelf -s: what
# -fvisibility=hidden leaves visible, independently of node/tierkv.map).
# Fails when a symbol does not start with tk_, when a generic name
# (node_start, tk_base64_encode, raft_step, tk_malloc) is visible, or when the set
# differs from the header's TK_API functions. Prints the exported names.
# tests/consumer/run.sh runs it on the installed copy; tests/meson.build runs
# it on a planted library that exports a non-tk_ name and expects a failure.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: check-exports.sh HEADER LIBRARY" >&2; exit 2; }
hdr=$1 lib=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-exports: $lib: $*" >&2; exit 1; }
[ -r "$hdr" ] || fail "cannot read header $hdr"
[ -r "$lib" ] || fail "cannot read library"
case "$lib" in
*.a)
    # Num Value Size Type Bind Vis Ndx Name
    readelf -sW "$lib" |
        awk '($5 == "GLOBAL" || $5 == "WEAK") && $6 == "DEFAULT" && $7 != "UND" {print $8}' |
        sort -u >"$tmp/exported"
    ;;
*)
    nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' |
        sort -u >"$tmp/exported"
    ;;
esac
[ -s "$tmp/exported" ] || fail "exports nothing"
grep -o '^TK_API [^(]*(' "$hdr" | sed 's/($//; s/.*[ *]//' | sort -u >"$tmp/api"
[ -s "$tmp/api" ] || fail "no TK_API declaration in $hdr"
if grep -v '^tk_' "$tmp/exported" >"$tmp/foreign"; then
    fail "exported symbols outside tk_*: $(tr '\n' ' ' <"$tmp/foreign")"
fi
for generic in node_start tk_base64_encode raft_step tk_malloc; do
    if grep -qx "$generic" "$tmp/exported"; then fail "$generic is exported"; fi
done
if ! diff "$tmp/api" "$tmp/exported" >"$tmp/diff"; then
    cat "$tmp/diff" >&2
    fail "exports differ from the TK_API declarations (< header only, > library only)"
fi
echo "$(wc -l <"$tmp/exported") exported symbols, all TK_API: $(tr '\n' ' ' <"$tmp/exported")"
