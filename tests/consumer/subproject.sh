#!/usr/bin/env bash
# The subproject test: tierkv used as a meson subproject, the second way of
# docs/embedding.md. Makes a tiny meson project in a temporary directory whose
# subprojects/tierkv is a link to this tree, asks for
#   dependency('tierkv', fallback : ['tierkv', 'tierkv_dep'])
# (with --force-fallback-for=tierkv, so an installed copy cannot stand in),
# builds docs/examples/embed.c with it and runs it.
#
# usage: subproject.sh SOURCE_DIR     (tests/consumer/meson.build runs it)
set -euo pipefail
src=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "subproject: $*" >&2; exit 1; }

mkdir -p "$tmp/app/subprojects"
ln -s "$src" "$tmp/app/subprojects/tierkv"
cp "$src/docs/examples/embed.c" "$tmp/app/embed.c"
cat >"$tmp/app/meson.build" <<'MESON'
project('tierkv-subproject-consumer', 'c', default_options : ['c_std=c11', 'werror=true'])
tierkv_dep = dependency('tierkv', fallback : ['tierkv', 'tierkv_dep'],
                        default_options : ['tests=false'])
executable('embed', 'embed.c', dependencies : tierkv_dep)
MESON
if ! meson setup "$tmp/build" "$tmp/app" --force-fallback-for=tierkv >"$tmp/setup.log" 2>&1; then
    cat "$tmp/setup.log" >&2
    fail "meson setup failed"
fi
# meson.override_dependency in tierkv's meson.build answers the lookup.
grep -q "Executing subproject tierkv" "$tmp/setup.log" &&
    grep -q "Dependency tierkv found: YES .*(overridden)" "$tmp/setup.log" ||
    { cat "$tmp/setup.log" >&2; fail "dependency('tierkv') did not come from the subproject"; }
# Only the consumer and what it needs (the module libraries), not tierkvd.
if ! ninja -C "$tmp/build" embed >"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log" >&2
    fail "building embed against the subproject failed"
fi
"$tmp/build/embed" >"$tmp/embed.out" || { cat "$tmp/embed.out" >&2; fail "embed failed"; }
echo "subproject: embed.c built with dependency('tierkv') from subprojects/tierkv and ran:"
sed 's/^/  /' "$tmp/embed.out" | head -n 5
