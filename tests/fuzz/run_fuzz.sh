#!/usr/bin/env bash
# Builds the transport decoder fuzz target with clang + libFuzzer and runs it
# for a bounded time. Usage: run_fuzz.sh SOURCE_ROOT WORK_DIR SECONDS
# The seed corpus is tests/fuzz/corpus/ (read only here); inputs the fuzzer
# finds go to WORK_DIR/corpus, and a crash leaves WORK_DIR/crash-* behind.
# Exits 77 (meson: skipped) when clang, libFuzzer or protoc-c is missing.
set -euo pipefail
src=$1
work=$2
seconds=${3:-60}
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
"$cc" -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined \
    -I"$src" -I"$work/gen" \
    "$src/tests/fuzz/transport_fuzz.c" \
    "$src/transport/frame.c" "$src/transport/codec.c" \
    "$src"/base/{alloc,assert,blob,crc32c,err,log}.c \
    "$work/gen/tierkv.pb-c.c" \
    $(pkg-config --cflags --libs libprotobuf-c) -lisal -lpthread \
    -o "$work/transport_fuzz"

cd "$work"
exec ./transport_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 corpus "$src/tests/fuzz/corpus"
