#!/usr/bin/env bash
# A seed replays exactly: runs `raft-sim --seed N --hash` twice in separate
# processes and requires the same trace hash; a different seed must give a
# different hash (so the hash is not a constant and this test can fail).
# A run that reports a violation (exit 1) still has a trace to compare; a
# crash or a usage error fails the test.
# usage: replay.sh RAFT_SIM SEED NODES [RAFT_SIM OPTIONS...]
set -u
sim=$1 seed=$2 nodes=$3
shift 3
extra=("$@")
run() {
    local out rc
    out=$("$sim" --seed "$1" --nodes "$nodes" "${extra[@]}" --hash)
    rc=$?
    if [ $rc -gt 1 ]; then
        echo "replay: raft-sim --seed $1 exited with status $rc" >&2
        return 1
    fi
    echo "$out"
}
a=$(run "$seed") || exit 1
b=$(run "$seed") || exit 1
c=$(run "$((seed + 1))") || exit 1
echo "seed $seed: $a / $b; seed $((seed + 1)): $c"
if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "replay: seed $seed gave two different traces"; exit 1
fi
if [ "$a" = "$c" ]; then
    echo "replay: seeds $seed and $((seed + 1)) gave the same hash"; exit 1
fi
echo "replay: seed $seed replays exactly"
