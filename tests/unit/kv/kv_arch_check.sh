#!/usr/bin/env bash
# kv/'s architecture rule: only kv/cold.c includes lmdb.h (every other file
# sees the cold tier through kv__cold_*), nothing in kv/ includes uv.h or a
# node/gateway header, and kv/ never reads the local clock (TTL uses entry
# time). Usage: kv_arch_check.sh <root with a kv/ directory>.
set -u
root=${1:-.}
fail=0
out=$(grep -lE '#[[:space:]]*include[[:space:]]*[<"]lmdb\.h[>"]' "$root"/kv/*.[ch] 2>/dev/null |
      grep -v '/cold\.c$')
if [ -n "$out" ]; then
    echo "$out"
    echo "arch: lmdb.h is included outside kv/cold.c (above)"; fail=1
fi
out=$(grep -HnE '#[[:space:]]*include[[:space:]]*[<"](uv\.h|node/|gateway/|time\.h)' "$root"/kv/*.[ch] 2>/dev/null)
if [ -n "$out" ]; then
    echo "$out"
    echo "arch: kv/ includes a forbidden header (above)"; fail=1
fi
out=$(grep -HnE '(^|[^.>[:alnum:]_])(time|clock_gettime|gettimeofday)[[:space:]]*\(' "$root"/kv/*.[ch] 2>/dev/null |
      grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)')
if [ -n "$out" ]; then
    echo "$out"
    echo "arch: kv/ reads a clock (above); TTL must use entry time"; fail=1
fi
[ $fail -eq 0 ] && echo "arch: kv/ keeps LMDB in cold.c and reads no clock"
exit $fail
