#!/usr/bin/env python3
"""Integration tests of failure handling with three real tierkvd processes on
loopback (fs store): the leader is killed (SIGKILL) and writes succeed again
within two election timeouts; the killed node restarts from its data
directory, rejoins and catches up; a follower restarted with SIGTERM does too.

"Election timeout" here is the largest randomized one: 2 x election_ticks x
tick_ms (raft draws each timeout from [1x, 2x)), so the bound is
4 x election_ticks x tick_ms = 800 ms with the defaults used here.

usage: failover_test.py path/to/tierkvd
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import (Cluster, Fail, check, check_graceful_stop, finish, jreq,  # noqa: E402
                       request, run)

C = None


def put_anywhere(key, value, exclude=(), timeout=0.3):
    """Tries each live node once; True if one accepted the write."""
    for nd in C.nodes:
        if nd.id in exclude or not nd.alive():
            continue
        try:
            st, _, _ = request(nd.http_port, "PUT", "/v1/kv/" + key, value, timeout=timeout)
        except OSError:
            continue
        if st == 200:
            return True
    return False


def test_writes_resume_after_leader_killed():
    leader = C.wait_leader()
    for i in range(50):
        st, _, _ = request(C.node(leader).http_port, "PUT", "/v1/kv/before/%d" % i, b"v")
        check(st == 200, "write before the kill: %d" % st)
    bound = 4 * C.election_ticks * C.tick_ms / 1000.0
    C.node(leader).kill()
    t0 = time.time()
    n = 0
    while not put_anywhere("after/first", b"x", exclude=(leader,)):
        n += 1
        check(time.time() - t0 < 10, "no write succeeded within 10 s of the kill")
        time.sleep(0.01)
    took = time.time() - t0
    print("     writes resumed %.0f ms after the leader was killed (bound %.0f ms, %d tries)"
          % (took * 1000, bound * 1000, n), flush=True)
    check(took <= bound, "writes resumed after %.0f ms > two election timeouts (%.0f ms)"
          % (took * 1000, bound * 1000))
    new = C.wait_leader(exclude=(leader,))
    check(new != leader, "same leader")
    for i in range(200):
        check(put_anywhere("during/%d" % i, b"d", exclude=(leader,), timeout=5),
              "write %d with one node down" % i)
    C.killed = leader


def wait_caught_up(nd, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        leader = C.wait_leader()
        _, _, ls = jreq(C.node(leader).http_port, "GET", "/v1/cluster")
        try:
            st, _, me = jreq(nd.http_port, "GET", "/v1/cluster", timeout=1)
        except OSError:
            me = None
        if me and me["applied"] >= ls["commit"] and me["leader"] == leader:
            return
        time.sleep(0.05)
    raise Fail("node %d did not catch up within %ds" % (nd.id, timeout))


def test_killed_node_rejoins_and_catches_up():
    nd = C.node(C.killed)
    nd.start()
    wait_caught_up(nd)
    # its own state machine has what was written while it was down
    st, _, js = jreq(nd.http_port, "GET", "/v1/kv?prefix=during/&consistency=stale&limit=1000")
    check(st == 200 and js["count"] == 200, "stale scan on the rejoined node: %r"
          % (js and js.get("count")))
    st, _, js = jreq(nd.http_port, "GET", "/v1/kv/before/7")
    check(st == 200 and js["value"] == "v", "data from before the crash: %d %r" % (st, js))
    st, _, _ = request(nd.http_port, "GET", "/readyz")
    check(st == 200, "readyz on the rejoined node: %d" % st)


def test_follower_restarted_with_sigterm_catches_up():
    leader = C.wait_leader()
    f = next(nd for nd in C.nodes if nd.id != leader)
    code = f.term()
    check(code == 0, "SIGTERM exit code %r" % code)
    for i in range(100):
        check(put_anywhere("gone/%d" % i, b"g", exclude=(f.id,), timeout=5), "write %d" % i)
    f.start()
    wait_caught_up(f)
    st, _, js = jreq(f.http_port, "GET", "/v1/kv?prefix=gone/&consistency=stale&limit=1000")
    check(st == 200 and js["count"] == 100, "restarted follower has %r" % js.get("count"))


def test_graceful_stop():
    check_graceful_stop(C)


def main():
    global C
    C = Cluster(sys.argv[1], 3)
    C.killed = None
    C.start()
    print("leader: node %d (data in %s)" % (C.wait_leader(), C.dir), flush=True)
    failed = run([test_writes_resume_after_leader_killed,
                  test_killed_node_rejoins_and_catches_up,
                  test_follower_restarted_with_sigterm_catches_up,
                  test_graceful_stop])
    finish(C, failed)


if __name__ == "__main__":
    main()
