#!/usr/bin/env bash
# The architecture is a rule, not a hope: raft/ is pure. It may include only
# base/ and raft/ headers and the C library's pure headers; it never includes
# uv.h, lmdb.h or time.h (or any clock, I/O or thread header), never calls
# rand(), and its meson library depends on base only.
set -u
root=${1:-.}
fail=0
bad_inc='#[[:space:]]*include[[:space:]]*[<"](uv\.h|lmdb\.h|time\.h|sys/time\.h|pthread\.h|threads\.h|unistd\.h|stdio\.h|fcntl\.h|sys/.*|protobuf-c/.*)[>"]'
out=$(grep -HnE "$bad_inc" "$root"/raft/*.[ch] 2>/dev/null)
if [ -n "$out" ]; then
    echo "$out"
    echo "arch: raft/ includes a forbidden header (above)"; fail=1
fi
calls='(^|[^.>[:alnum:]_])(rand|srand|random|srandom|rand_r|drand48|time|clock_gettime|gettimeofday|clock|fopen|open|read|write|malloc|calloc|realloc|free|pthread_[a-z_]+)[[:space:]]*\('
out=$(grep -HnE "$calls" "$root"/raft/*.[ch] 2>/dev/null | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)')
if [ -n "$out" ]; then
    echo "$out"
    echo "arch: raft/ calls rand(), a clock, raw I/O or raw malloc (above)"; fail=1
fi
deps=$(sed -n '/static_library/,/)/p' "$root"/raft/meson.build | grep -o 'dependencies *: *\[[^]]*\]')
if [ "$deps" != "dependencies : [base_dep]" ]; then
    echo "arch: raft/meson.build must depend on [base_dep] only, found: $deps"; fail=1
fi
[ $fail -eq 0 ] && echo "arch: raft/ is pure"
exit $fail
