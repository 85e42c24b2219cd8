#!/usr/bin/env bash
# The consumer test: what an embedder gets from `meson install`.
#
# Installs the build into a temporary DESTDIR, then, with nothing but
# `pkg-config --cflags --libs tierkv` (PKG_CONFIG_PATH and PKG_CONFIG_SYSROOT_DIR
# pointing into that copy): checks the soname, checks that the shared
# library exports exactly the TK_API functions of the installed tierkv.h
# (every one starting with tk_; no node_start, base64_encode, fnv1a64, ...),
# builds docs/examples/embed.c against the shared and against the static
# library, the public error list check (errors.c), a Check test of the
# consumer's own (fixture_test.c) and the logging options' test (log.c), and
# runs them.
#
# usage: run.sh BUILD_DIR SOURCE_DIR     (tests/meson.build runs it)
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
here="$src/tests/consumer"
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "consumer: $*" >&2; exit 1; }

root="$tmp/root"
if ! meson install -C "$build" --no-rebuild --destdir "$root" >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log" >&2
    fail "meson install failed"
fi
pc=$(find "$root" -name tierkv.pc | head -n 1)
[ -n "$pc" ] || fail "no tierkv.pc installed"
libdir=$(dirname "$(dirname "$pc")")
hdr=$(find "$root" -name tierkv.h | head -n 1)
[ -n "$hdr" ] || fail "no tierkv.h installed"
so="$libdir/libtierkv.so"
[ -e "$so" ] && [ -e "$libdir/libtierkv.so.0" ] && [ -e "$libdir/libtierkv.a" ] ||
    fail "expected libtierkv.so, libtierkv.so.0 and libtierkv.a in $libdir"
readelf -d "$so" | grep -q 'SONAME.*\[libtierkv\.so\.0\]' || fail "soname is not libtierkv.so.0"
# A quoted include must be another installed public header (tierkv_errors.h),
# never a tree header such as base/err.h.
for inc in $(sed -n 's/^#include "\(.*\)"$/\1/p' "$hdr"); do
    [ -e "$(dirname "$hdr")/$inc" ] ||
        fail "the installed tierkv.h includes a header that is not installed: $inc"
done
echo "consumer: installed $(cd "$root" && find . -name 'libtierkv*' -o -name tierkv.h -o -name tierkv.pc | sort | tr '\n' ' ')"

# Exports: exactly the header's TK_API functions, from the shared library (the
# version script and -fvisibility=hidden) and from the static archive (the
# visibility alone: what its objects leave global and default).
echo "consumer: libtierkv.so: $("$here/check-exports.sh" "$hdr" "$so")"
echo "consumer: libtierkv.a: $("$here/check-exports.sh" "$hdr" "$libdir/libtierkv.a")"

export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$root"
flags=$(pkg-config --cflags --libs tierkv)
echo "consumer: pkg-config --cflags --libs tierkv: $flags"
warn="-std=c11 -Wall -Wextra -Werror"
# shellcheck disable=SC2086
$cc $warn "$src/docs/examples/embed.c" $flags -o "$tmp/embed"
# shellcheck disable=SC2086
$cc $warn "$here/errors.c" $flags -o "$tmp/errors"
# shellcheck disable=SC2086
$cc $warn "$here/fixture_test.c" $(pkg-config --cflags --libs tierkv check) -o "$tmp/fixture_test"
# shellcheck disable=SC2086
$cc $warn -D_POSIX_C_SOURCE=200809L "$here/log.c" $flags -o "$tmp/log"
# The static library, with the private dependencies pkg-config lists.
static=$(pkg-config --static --libs tierkv | sed 's/-ltierkv\b/-Wl,-Bstatic -ltierkv -Wl,-Bdynamic/')
# shellcheck disable=SC2086
$cc $warn "$src/docs/examples/embed.c" $(pkg-config --cflags tierkv) $static -o "$tmp/embed_static"
if readelf -d "$tmp/embed_static" | grep -q libtierkv; then
    fail "embed_static links libtierkv.so, not libtierkv.a"
fi
readelf -d "$tmp/embed" | grep -q 'NEEDED.*libtierkv\.so\.0' || fail "embed does not need libtierkv.so.0"

export LD_LIBRARY_PATH="$libdir"
"$tmp/errors"
"$tmp/embed" >"$tmp/embed.out" || { cat "$tmp/embed.out"; fail "embed (shared) failed"; }
"$tmp/embed_static" >/dev/null || fail "embed (static) failed"
CK_DEFAULT_TIMEOUT=60 "$tmp/fixture_test"
"$tmp/log" || fail "log (tk_options.log_level, log_cb) failed"
echo "consumer: embed (shared and static), errors, fixture_test and log passed"
