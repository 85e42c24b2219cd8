#!/usr/bin/env python3
"""The operator's log lines (docs/operations.md, "Log lines") with three real
tierkvd processes on loopback: a healthy idle cluster writes no warning for
5 s; when the leader is killed, the survivors log, at info, an election, the
leader change naming the new leader and its term, and the lost peer; every
such line is short logfmt.

usage: oplog_test.py path/to/tierkvd
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import Cluster, Fail, check, check_graceful_stop, finish, run  # noqa: E402

C = None
LINE_MAX = 200  # characters of one event line (timestamp included)
IDLE_S = 5.0


def new_text(nd, since):
    return nd.log()[since.get(nd.id, 0):]


def offsets():
    return {nd.id: len(nd.log()) for nd in C.nodes}


def test_idle_cluster_logs_no_warning():
    C.wait_leader()
    since = offsets()
    t0 = time.time()
    while time.time() - t0 < IDLE_S:  # the observation window itself
        time.sleep(0.1)
    bad = []
    for nd in C.nodes:
        for ln in new_text(nd, since).splitlines():
            if "level=warn" in ln or "level=error" in ln:
                bad.append("node %d: %s" % (nd.id, ln))
    print("     %.1f s idle: %d warnings or errors" % (time.time() - t0, len(bad)),
          flush=True)
    check(not bad, "an idle cluster logged:\n" + "\n".join(bad[:10]))


def lines_with(text, msg):
    return [ln for ln in text.splitlines() if 'msg="%s"' % msg in ln]


def kv(ln):
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', ln))


def test_leader_killed_is_logged():
    old = C.wait_leader()
    since = offsets()
    C.node(old).kill()
    t0 = time.time()
    new = C.wait_leader(exclude=(old,))
    st = C.status(C.node(new))
    check(st is not None, "no status from the new leader %d" % new)
    term = st["term"]
    survivors = [nd for nd in C.nodes if nd.id != old]
    missing = ["?"]
    while missing and time.time() - t0 < 10:
        missing = []
        texts = {nd.id: new_text(nd, since) for nd in survivors}
        if not any(lines_with(t, "election started") for t in texts.values()):
            missing.append("an election started line on a survivor")
        if not any(kv(ln).get("to") == str(new) and kv(ln).get("term") == str(term)
                   for ln in lines_with(texts[new], "election won") +
                   lines_with(texts[new], "leader changed")):
            missing.append("node %d's election won / leader changed to=%d term=%d"
                           % (new, new, term))
        for nd in survivors:
            if nd.id != new and not any(
                    kv(ln).get("to") == str(new) and kv(ln).get("term") == str(term) and
                    kv(ln).get("from") in (str(old), "none")
                    for ln in lines_with(texts[nd.id], "leader changed")):
                missing.append("node %d's leader changed to=%d term=%d" % (nd.id, new, term))
            if not any(kv(ln).get("peer") == str(old)
                       for ln in lines_with(texts[nd.id], "peer lost")):
                missing.append("node %d's peer lost peer=%d" % (nd.id, old))
        if missing:
            time.sleep(0.05)
    took = time.time() - t0
    texts = {nd.id: new_text(nd, since) for nd in survivors}
    for nid, t in sorted(texts.items()):
        for ln in t.splitlines():
            if "level=info" in ln or "level=warn" in ln:
                print("     node %d: %s" % (nid, ln[ln.find("term="):]), flush=True)
    print("     leader %d killed; leader %d in term %d; lines complete after %.2f s"
          % (old, new, term, took), flush=True)
    check(not missing, "missing after %.1f s: %s" % (took, "; ".join(missing)))
    # The event lines are short, one line each.
    events = ("election started", "election won", "election lost", "leader changed",
              "peer lost", "peer connected")
    for nid, t in texts.items():
        for ev in events:
            for ln in lines_with(t, ev):
                check(len(ln) <= LINE_MAX, "node %d: a %d-character line: %s"
                      % (nid, len(ln), ln))
    # The killed node back: its peers see it connect again.
    C.node(old).start()
    t1 = time.time()
    back = []
    while len(back) < len(survivors) and time.time() - t1 < 15:
        back = [nd.id for nd in survivors
                if any(kv(ln).get("peer") == str(old)
                       for ln in lines_with(new_text(nd, since), "peer connected"))]
        time.sleep(0.05)
    print("     node %d restarted: peer connected on %r after %.2f s"
          % (old, back, time.time() - t1), flush=True)
    check(len(back) == len(survivors), "peer connected to %d only on %r" % (old, back))


def test_graceful_stop():
    check_graceful_stop(C)


def main():
    global C
    C = Cluster(sys.argv[1], 3)
    C.start()
    try:
        print("leader: node %d (data in %s)" % (C.wait_leader(), C.dir), flush=True)
    except Fail as e:
        print("FAIL start: %s" % e)
        finish(C, 1)
    failed = run([test_idle_cluster_logs_no_warning, test_leader_killed_is_logged,
                  test_graceful_stop])
    finish(C, failed)


if __name__ == "__main__":
    main()
