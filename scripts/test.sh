#!/usr/bin/env bash
# Runs every suite in the normal build, then the unit and simulator suites in
# the sanitizer build, and ends with one summary line "N passed, N failed".
set -uo pipefail
build=$1
san=$2
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1

meson test -C "$build" --print-errorlogs --num-processes 2
rc1=$?
meson test -C "$san" --print-errorlogs --num-processes 2 --suite unit --suite sim-san
rc2=$?

count() { # testlog.json: one JSON object per test
    python3 - "$@" <<'PY'
import json, sys
ok = bad = skip = 0
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"): ok += 1
        elif r == "SKIP": skip += 1
        else: bad += 1
print(f"{ok} passed, {bad} failed, {skip} skipped")
PY
}
echo
echo "== summary (normal build + sanitizer build) =="
count "$build/meson-logs/testlog.json" "$san/meson-logs/testlog.json"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
