#!/usr/bin/env bash
# `make sim` shows the simulated cluster (issue 2): `raft-sim --demo` must
# exit 0, and its trace must tell the whole story, in order: a leader is
# elected; entries commit and every live node applies them; the leader is
# lost; another node becomes leader in a later term and commits more; the lost
# node restarts from its disk and catches up with the leader; every proposal
# committed and every safety invariant held.
#
# usage: demo.sh RAFT_SIM [--drop REGEX]
#   --drop deletes the trace lines matching REGEX (grep -E) before the check,
#   for the tests that prove the check can fail.
set -u
sim=$1
drop=
if [ $# -ge 3 ] && [ "$2" = "--drop" ]; then
    drop=$3
fi

out=$("$sim" --demo)
rc=$?
printf '%s\n' "$out"
if [ $rc -ne 0 ]; then
    echo "demo: raft-sim --demo exited with status $rc"
    exit 1
fi
if [ -n "$drop" ]; then
    out=$(printf '%s\n' "$out" | grep -Ev -- "$drop")
fi

printf '%s\n' "$out" | awk '
# The number right after the first occurrence of `pre` in `s`, or "".
function num_after(s, pre,    i, r) {
    i = index(s, pre)
    if (i == 0)
        return ""
    r = substr(s, i + length(pre))
    if (!match(r, /^[0-9]+/))
        return ""
    return substr(r, 1, RLENGTH) + 0
}
# The part of the line matching `re`, or "".
function part(re) {
    return match($0, re) ? substr($0, RSTART, RLENGTH) : ""
}
BEGIN {
    stage = 0
    want[0] = "a leader elected"
    want[1] = "entries committed and applied by the first leader"
    want[2] = "the leader crashed"
    want[3] = "another node elected leader in a later term"
    want[4] = "more entries committed by the new leader"
    want[5] = "the lost node restarted from its disk"
    want[6] = "the lost node caught up with the leader"
    want[7] = "every proposal committed, none failed"
    want[8] = "all safety invariants held"
    last = 9
}
{
    if ((p = part("n[0-9]+ became leader in term [0-9]+")) != "") {
        node = num_after(p, "n"); term = num_after(p, "term ")
        if (stage == 0) {
            leader1 = node; term1 = term; stage = 1
        } else if (stage == 3 && node != leader1 && term > term1) {
            leader2 = node; stage = 4
        }
    } else if ((p = part("commit index [0-9]+ on leader n[0-9]+ \\([0-9]+ new entries\\); every live node applied them")) != "") {
        commit = num_after(p, "index "); node = num_after(p, "leader n")
        fresh = num_after(p, "(")
        if (stage == 1 && node == leader1 && fresh > 0) {
            commit1 = commit; stage = 2
        } else if (stage == 4 && node == leader2 && commit > commit1 && fresh > 0) {
            commit2 = commit; stage = 5
        }
    } else if ((p = part("crash n[0-9]+ \\(the leader\\)")) != "") {
        if (stage == 2 && num_after(p, "n") == leader1)
            stage = 3
    } else if ((p = part("restart n[0-9]+ from its disk")) != "") {
        if (stage == 5 && num_after(p, "n") == leader1)
            stage = 6
    } else if ((p = part("n[0-9]+ caught up: applied index [0-9]+, the same as the leader n[0-9]+")) != "") {
        if (stage == 6 && num_after(p, "n") == leader1 &&
            num_after(p, "index ") >= commit2 && num_after(p, "leader n") == leader2)
            stage = 7
    } else if ((p = part("[0-9]+ proposals: [0-9]+ committed, [0-9]+ failed")) != "") {
        n = p + 0
        if (stage == 7 && n > 0 && num_after(p, "proposals: ") == n &&
            num_after(p, "committed, ") == 0)
            stage = 8
    } else if ($0 ~ /all safety invariants held/) {
        if (stage == 8)
            stage = 9
    }
}
END {
    if (stage != last) {
        printf "demo: the trace does not show %s (in order after the steps before it)\n", want[stage]
        exit 1
    }
    printf "demo: leader n%d (term %d) committed to %d, was lost; n%d took over and committed to %d; n%d recovered\n", leader1, term1, commit1, leader2, commit2, leader1
}
'
