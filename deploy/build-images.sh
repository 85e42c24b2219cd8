#!/usr/bin/env bash
# Builds the tierkv runtime image (deploy/Dockerfile) on a machine that may
# have no image registry. The image holds tierkvd and the tierkv CLI built on
# this host (Debian 12), so the base image must be Debian 12 too.
#
#   deploy/build-images.sh [--build-dir DIR] [--tag IMAGE] [--base IMAGE]
#
#   --build-dir DIR  a meson build dir holding cmd/tierkvd/tierkvd and
#                    cmd/tierkv/tierkv (it is brought up to date with ninja);
#                    default: build-docker/ at the top of the tree, set up
#                    with --buildtype=release -Dtests=false on first use
#   --tierkvd PATH --tierkv PATH   take these binaries instead (no build)
#   --tag IMAGE      the image to build (env TIERKV_IMAGE; tierkv:latest)
#   --base IMAGE     the base image (env TIERKV_BASE_IMAGE; debian:12-slim)
#   --base-only      only make sure the base image exists (pull or debootstrap)
#
# The base image: used as is when present; else pulled; else, when no
# registry answers, made locally: debootstrap a minimal Debian 12 (bookworm,
# --variant=minbase, plus the runtime libraries) from the Debian mirror apt
# already uses, and `docker import` it under the base name. The next run finds
# it and skips all that. With a registry this script does nothing special.
# Installs debootstrap with apt when it is needed and missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_dir=""
tierkvd=""
tierkv=""
tag=${TIERKV_IMAGE:-tierkv:latest}
base=${TIERKV_BASE_IMAGE:-debian:12-slim}
base_only=0
# The shared libraries tierkvd and tierkv link, by Debian 12 package: one list,
# in the Dockerfile. The built image is checked for unresolved libraries.
runtime_pkgs=$(sed -n 's/.*runtime_packages="\([^"]*\)".*/\1/p' "$here/Dockerfile")
[ -n "$runtime_pkgs" ] || { echo "build-images: no runtime_packages list in $here/Dockerfile" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --tierkvd) tierkvd=$2; shift 2 ;;
    --tierkv) tierkv=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --base-only) base_only=1; shift ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

log() { echo "build-images: $*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

docker info >/dev/null 2>&1 ||
    die "no Docker engine answers ('docker info' failed); start dockerd or set DOCKER_HOST"

# --- 1. the binaries ------------------------------------------------------
t0=$(now)
if [ -n "$tierkvd" ] || [ -n "$tierkv" ]; then
    [ -x "$tierkvd" ] && [ -x "$tierkv" ] || die "--tierkvd and --tierkv need two executables"
elif [ "$base_only" = 0 ]; then
if [ -z "$build_dir" ]; then
    build_dir=$root/build-docker
    if [ ! -f "$build_dir/build.ninja" ]; then
        log "setting up $build_dir (release, no tests)"
        meson setup "$build_dir" "$root" --buildtype=release -Dtests=false >/dev/null
    fi
fi
ninja -C "$build_dir" cmd/tierkvd/tierkvd cmd/tierkv/tierkv >/dev/null ||
    die "building tierkvd and tierkv in $build_dir failed (run: ninja -C $build_dir)"
tierkvd=$build_dir/cmd/tierkvd/tierkvd
tierkv=$build_dir/cmd/tierkv/tierkv
[ -x "$tierkvd" ] && [ -x "$tierkv" ] || die "no tierkvd/tierkv binaries under $build_dir/cmd"
log "binaries ready in $(since "$t0") s"
fi

# --- 2. the base image ----------------------------------------------------
# The first "bookworm" mirror apt uses (deb822 .sources or one-line lists).
apt_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # Stanzas are separated by blank lines; print URIs of stanzas whose
        # Suites name plain "bookworm".
        uri=$(awk 'BEGIN { RS = ""; FS = "\n" }
            { u = ""; s = 0
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
                  if ($i ~ /^Suites:/ && $i ~ /[ \t]bookworm([ \t]|$)/) s = 1
                  if ($i ~ /^Types:/ && $i !~ /[ \t]deb([ \t]|$)/) s = -1
              }
              if (s == 1 && u != "") { print u; exit } }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        uri=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                                  if ($(i + 1) == "bookworm") { print $i; exit } }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    echo "http://deb.debian.org/debian"
}

make_base() {
    local mirror dir pkgs
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends debootstrap >/dev/null ||
            { $SUDO apt-get update -qq &&
              $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                  --no-install-recommends debootstrap >/dev/null; } ||
            die "cannot install debootstrap (apt-get install debootstrap)"
    fi
    mirror=$(apt_mirror)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tierkv-rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "$SUDO rm -rf '$dir'" EXIT
    pkgs=$(echo "$runtime_pkgs" | tr ' ' ',')
    log "debootstrap bookworm (minbase + $pkgs) from $mirror"
    $SUDO debootstrap --variant=minbase --include="$pkgs" bookworm "$dir" "$mirror" \
        >"$dir.log" 2>&1 ||
        { tail -20 "$dir.log" >&2; rm -f "$dir.log"; die "debootstrap failed (log above)"; }
    rm -f "$dir.log"
    # Slim it the way the official -slim images are: no docs, man pages,
    # locales, apt lists or package caches.
    $SUDO sh -c "cd '$dir' && rm -rf usr/share/doc/* usr/share/man/* usr/share/info/* \
        usr/share/locale/* usr/share/lintian var/cache/apt/archives/*.deb \
        var/cache/apt/*.bin var/lib/apt/lists/* var/log/* tmp/* && \
        echo 'deb $mirror bookworm main' > etc/apt/sources.list"
    $SUDO tar -C "$dir" -c . | docker import \
        --change 'CMD ["bash"]' \
        --change "LABEL org.tierkv.base=debootstrap org.tierkv.base.packages=\"$runtime_pkgs\"" \
        - "$base" >/dev/null || die "docker import of the debootstrapped tree failed"
    $SUDO rm -rf "$dir"
    trap - EXIT
}

t1=$(now)
made_here=$(docker image inspect -f '{{index .Config.Labels "org.tierkv.base"}}' "$base" 2>/dev/null || true)
if [ "$made_here" = debootstrap ] &&
   [ "$(docker image inspect -f '{{index .Config.Labels "org.tierkv.base.packages"}}' "$base")" != "$runtime_pkgs" ]; then
    # Our own base, made for another package list: make it again (offline, the
    # Dockerfile could not apt-get what it lacks).
    log "base image $base was made for other runtime packages: remaking it"
    docker rmi "$base" >/dev/null
    make_base
    log "base image $base made in $(since "$t1") s"
elif [ -n "$made_here" ] || docker image inspect "$base" >/dev/null 2>&1; then
    log "base image $base present (cached)"
elif timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
    log "base image $base pulled in $(since "$t1") s"
else
    log "base image $base absent and no registry answers: making it with debootstrap"
    make_base
    log "base image $base made in $(since "$t1") s"
fi

[ "$base_only" = 1 ] && exit 0

# --- 3. the image ---------------------------------------------------------
t2=$(now)
ctx=$(mktemp -d "${TMPDIR:-/tmp}/tierkv-image.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$ctx'" EXIT
cp "$here/Dockerfile" "$here/tierkv-healthcheck" "$here/tierkv-entrypoint" \
    "$here/k8s/tierkv-k8s-entrypoint" "$ctx/"
for b in "$tierkvd" "$tierkv"; do
    strip -o "$ctx/$(basename "$b")" "$b" 2>/dev/null || cp "$b" "$ctx/"
done
chmod 0755 "$ctx/tierkvd" "$ctx/tierkv" "$ctx/tierkv-healthcheck" "$ctx/tierkv-entrypoint" \
    "$ctx/tierkv-k8s-entrypoint"
# The legacy builder needs nothing beyond the engine; BuildKit only if the
# buildx plugin is there.
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi
old_id=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
docker build -q --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" >/dev/null ||
    die "docker build failed (rerun: docker build --build-arg BASE_IMAGE=$base $ctx)"
# The image this tag named before is garbage now, unless something uses it.
new_id=$(docker image inspect -f '{{.Id}}' "$tag")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi
# Every shared library must resolve inside the image.
unresolved=$(docker run --rm --entrypoint sh "$tag" -c \
    'ldd /usr/local/bin/tierkvd /usr/local/bin/tierkv | grep "not found" || true')
[ -z "$unresolved" ] || die "libraries missing in $tag: $unresolved (add their packages to runtime_pkgs)"
size=$(docker image inspect -f '{{.Size}}' "$tag")
log "image $tag built in $(since "$t2") s ($((size / 1024 / 1024)) MiB), total $(since "$t0") s"
