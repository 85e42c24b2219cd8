#!/usr/bin/env bash
# The one list of Debian 12 packages tierkv needs to build, test and run.
# Installs only what is missing; a no-op on a machine that has them all.
set -euo pipefail

PKGS=(
    build-essential pkg-config meson ninja-build clang clang-format
    libuv1-dev libprotobuf-c-dev protobuf-c-compiler liblmdb-dev check
    libhttp-parser-dev libjansson-dev libisal-dev libxxhash-dev
    libclang-rt-14-dev debootstrap iproute2 faketime libssl-dev libnghttp2-dev
    chromium gnuplot-nox etcd-client
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
