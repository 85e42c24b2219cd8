#!/usr/bin/env bash
# hiccup-probe.sh: what makes this machine stop running anything (issue 22).
#
# Runs scripts/hiccup.py (real-time threads, one per CPU, that log every
# wake-up more than 10 ms late) through four phases of HICCUP_PHASE_S seconds
# each and prints, per phase, the gaps over 10 and 50 ms, the longest, how many
# came on several CPUs at once, and the steal time /proc/stat counted:
#   idle    nothing else running;
#   cpu     one busy loop per CPU (pure computation, no system calls);
#   disk    a writer of 4 KiB random pages into a 256 MiB file with an
#           fdatasync every 64 MiB written (the shape of an LMDB commit);
#   fsync   a writer of 4 KiB appends, each followed by fdatasync (the log's
#           shape).
# A guest whose gaps come with `disk` but not with `cpu` loses its CPUs while
# the host works for its I/O.
#
# usage: scripts/hiccup-probe.sh    env: HICCUP_PHASE_S (10), HICCUP_DIR ($TMPDIR or /tmp)
set -euo pipefail
here=$(dirname "$0")
secs=${HICCUP_PHASE_S:-10}
dir=$(mktemp -d "${HICCUP_DIR:-${TMPDIR:-/tmp}}/hiccup-probe.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
ncpu=$(nproc)

steal() { awk '/^cpu /{print $9}' /proc/stat; }

phase() {
    local name=$1
    shift
    local s0 log="$dir/$name.log"
    s0=$(steal)
    python3 "$here/hiccup.py" --min-ms 10 --seconds "$secs" >"$log" &
    local meter=$!
    sleep 0.5
    "$@" &
    local load=$!
    wait "$meter"
    pkill -TERM -P "$load" 2>/dev/null || true
    kill "$load" 2>/dev/null || true
    wait "$load" 2>/dev/null || true
    python3 - "$log" "$name" "$s0" "$(steal)" "$(getconf CLK_TCK)" <<'EOF'
import re, sys
log, name, s0, s1, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
g = [(int(c), float(e), float(ms)) for c, e, ms in
     re.findall(r"gap cpu=(\d+) end=([\d.]+) ms=([\d.]+)", open(log).read())]
ends = {}
for c, e, ms in g:
    ends.setdefault(round(e, 2), set()).add(c)
cpus = len(set(c for c, _, _ in g)) or 1
together = sum(1 for v in ends.values() if len(v) > 1)
print("| %s | %d | %d | %.0f | %d | %d |" % (
    name, len(g), sum(1 for x in g if x[2] > 50), max([x[2] for x in g] + [0]),
    together, (s1 - s0) * 1000 // hz))
EOF
}

burn() {
    for _ in $(seq "$ncpu"); do
        (while :; do :; done) &
    done
    wait
}

disk() {
    python3 - "$dir/pages" <<'EOF'
import os, random, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 256 << 20)
page = os.urandom(4096)
n = 0
while True:
    os.pwrite(fd, page, random.randrange(65536) * 4096)
    n += 1
    if n % 16384 == 0:
        os.fdatasync(fd)
EOF
}

fsyncs() {
    python3 - "$dir/log" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
page = os.urandom(4096)
n = 0
while True:
    os.write(fd, page)
    os.fdatasync(fd)
    n += 1
    if n % 16384 == 0:
        os.ftruncate(fd, 0)
EOF
}

echo "hiccup-probe: $(date -u '+%F %T') UTC, $ncpu CPUs, ${secs} s per phase, $(uname -r)"
echo "| phase | gaps over 10 ms | over 50 ms | longest ms | on several CPUs at once | steal ms (all CPUs) |"
echo "|---|---:|---:|---:|---:|---:|"
phase idle sleep "$secs"
phase cpu burn
phase disk disk
phase fsync fsyncs
