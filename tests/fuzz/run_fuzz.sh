#!/usr/bin/env bash
# Builds a fuzz target with clang + libFuzzer (ASan, UBSan) and runs it for a
# bounded time. Usage: run_fuzz.sh SOURCE_ROOT WORK_DIR SECONDS [TARGET]
# TARGET is one of:
#   transport_fuzz (the default): the decoders alone (frame.c, codec.c); seed
#       corpus tests/fuzz/corpus/ (read only here);
#   peer_fuzz: the real TCP transport with a cluster token over loopback (its
#       handshake and peer input; tests/fuzz/peer_fuzz.c); seeds written by the
#       target itself (PEER_FUZZ_SEEDS) to WORK_DIR/seeds before each run.
# Inputs the fuzzer finds go to WORK_DIR/corpus, and a crash leaves
# WORK_DIR/crash-* behind. Exits 77 (meson: skipped) when clang, libFuzzer or
# protoc-c is missing.
set -euo pipefail
src=$1
work=$2
seconds=${3:-60}
target=${4:-transport_fuzz}
cc=${FUZZ_CC:-clang}

command -v "$cc" >/dev/null 2>&1 || { echo "skip: $cc not found"; exit 77; }
command -v protoc-c >/dev/null 2>&1 || { echo "skip: protoc-c not found"; exit 77; }
mkdir -p "$work/gen" "$work/corpus"
probe="$work/probe.c"
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){(void)d;(void)n;return 0;}' >"$probe"
if ! "$cc" -fsanitize=fuzzer "$probe" -o "$work/probe" 2>/dev/null; then
    echo "skip: $cc cannot link libFuzzer"
    exit 77
fi

protoc-c --proto_path="$src/proto" --c_out="$work/gen" "$src/proto/tierkv.proto"
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined
    -fno-sanitize-recover=undefined -I"$src" -I"$work/gen")
case $target in
transport_fuzz)
    "$cc" "${flags[@]}" \
        "$src/tests/fuzz/transport_fuzz.c" \
        "$src/transport/frame.c" "$src/transport/codec.c" \
        "$src"/base/{alloc,assert,blob,crc32c,err,log}.c \
        "$work/gen/tierkv.pb-c.c" \
        $(pkg-config --cflags --libs libprotobuf-c) -lisal -lpthread \
        -o "$work/transport_fuzz"
    seeds="$src/tests/fuzz/corpus"
    max_len=65536
    timeout=10
    ;;
peer_fuzz)
    pkg-config --exists libuv libssl libcrypto libprotobuf-c ||
        { echo "skip: libuv, OpenSSL or protobuf-c not found by pkg-config"; exit 77; }
    "$cc" "${flags[@]}" \
        "$src/tests/fuzz/peer_fuzz.c" \
        "$src"/transport/{tcp,frame,codec,auth,transport}.c \
        "$src"/tls/{tls,tls_uv}.c \
        "$src"/base/{alloc,assert,blob,crc32c,err,log,prng}.c \
        "$work/gen/tierkv.pb-c.c" \
        $(pkg-config --cflags --libs libuv libssl libcrypto libprotobuf-c) \
        -lisal -lpthread -o "$work/peer_fuzz"
    seeds="$work/seeds"
    rm -rf "$seeds"
    mkdir -p "$seeds"
    PEER_FUZZ_SEEDS="$seeds" "$work/peer_fuzz"
    max_len=32768
    timeout=30 # the harness's own bound is 5 s per step
    ;;
*)
    echo "unknown target: $target" >&2
    exit 2
    ;;
esac

cd "$work"
exec "./$target" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
    -max_len="$max_len" -print_final_stats=1 corpus "$seeds"
