#!/usr/bin/env python3
"""Integration test of a cluster that has lost its quorum, with three real
tierkvd processes on loopback (fs store): two of the three are killed and the
survivor, which can elect no leader, must say so (docs/api.md, Errors):
writes and linearizable reads get 503 `no_leader` with a JSON error and a
Retry-After header, at once, while stale reads and /healthz still answer.

Both survivors are tried: the old leader (it steps down once it has not heard
from a majority for an election timeout: check-quorum) and a follower (it stops
believing in the dead leader after its election timeout, then campaigns in
vain with pre-votes). Requests that reach the survivor before it knows there
is no leader are bounded too:
  - a linearizable read is answered 503 within about two election timeouts
    (the leader fails it when it steps down; a follower fails the reads it
    asked the lost leader for once it gives up on that leader);
  - a write answers 503 or, when it may already sit in the old leader's log,
    504 `timeout` after --request-timeout-ms (its outcome is unknown: it can
    still commit once the other nodes come back).

usage: noleader_test.py path/to/tierkvd
"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tkcluster import (Cluster, Fail, check, check_graceful_stop, finish, jreq,  # noqa: E402
                       request, run)

C = None
REQUEST_TIMEOUT_MS = 3000


def election_bound_s():
    """Two of the largest randomized election timeouts (raft draws each
    from [1x, 2x) of election_ticks x tick_ms)."""
    return 4 * C.election_ticks * C.tick_ms / 1000.0


def timed(fn, *args, **kw):
    t = time.time()
    r = fn(*args, **kw)
    return r, time.time() - t


def check_no_leader(what, st, hd, js):
    """The documented answer of a node that knows no leader."""
    check(st == 503, "%s: status %d %r, want 503" % (what, st, js))
    ra = hd.get("retry-after", "")
    check(ra.isdigit() and int(ra) >= 1, "%s: Retry-After %r" % (what, ra))
    check(hd.get("content-type", "").startswith("application/json"),
          "%s: content type %r" % (what, hd.get("content-type")))
    check(isinstance(js, dict) and isinstance(js.get("error"), dict) and
          js["error"].get("code") == "no_leader" and js["error"].get("message"),
          "%s: JSON error %r" % (what, js))
    check("x-tierkv-leader" not in hd, "%s: names a leader: %r" % (what, hd))


def wait_leaderless(nd, timeout=5):
    """Waits until nd reports no leader (bounded)."""
    deadline = time.time() + timeout
    js = None
    while time.time() < deadline:
        js = C.status(nd)
        if js is not None and js["leader"] == 0:
            return js
        time.sleep(0.02)
    raise Fail("node %d still reports leader %r %s after the others died"
               % (nd.id, js and js["leader"], timeout))


def lose_quorum(survivor):
    """Kills every node but `survivor` and checks what it answers."""
    t_limit = REQUEST_TIMEOUT_MS / 1000.0 + 2
    k = "nl/%d" % survivor.id
    st, _, _ = request(survivor.http_port, "PUT", "/v1/kv/" + k, b"before")
    check(st == 200, "write before the kill: %d" % st)
    # A follower's 200 means the leader applied it; the follower itself learns
    # the commit with the next heartbeat. Wait (bounded) until it holds it, so
    # the stale read at the end has something to find.
    deadline = time.time() + 5
    while True:
        st, _, js = jreq(survivor.http_port, "GET", "/v1/kv/%s?consistency=stale" % k)
        if st == 200:
            break
        check(time.time() < deadline, "node %d never applied the write: %d %r"
              % (survivor.id, st, js))
        time.sleep(0.02)
    for nd in C.nodes:
        if nd is not survivor:
            nd.kill()

    # In flight while the survivor still believes in a leader: a write (in
    # the background) and a linearizable read.
    wr = {}

    def write_in_flight():
        try:
            wr["r"], wr["took"] = timed(jreq, survivor.http_port, "PUT",
                                        "/v1/kv/" + k + "/w", {"value": "maybe"},
                                        timeout=t_limit + 5)
        except Exception as e:  # reported below
            wr["e"] = e
    th = threading.Thread(target=write_in_flight, daemon=True)
    th.start()
    (st, hd, js), took = timed(jreq, survivor.http_port, "GET",
                               "/v1/kv/%s?consistency=linearizable" % k, timeout=t_limit + 5)
    print("     linearizable read right after the kill: %d %s in %.0f ms"
          % (st, js and js.get("error", {}).get("code"), took * 1000), flush=True)
    check_no_leader("linearizable read in flight", st, hd, js)
    check(took <= election_bound_s() + 0.5,
          "the read took %.0f ms (> two election timeouts, %.0f ms)"
          % (took * 1000, election_bound_s() * 1000))
    th.join(t_limit + 10)
    check("r" in wr, "write in flight: %r" % wr.get("e", "no answer"))
    (st, hd, js), took = wr["r"], wr["took"]
    code = js and js.get("error", {}).get("code")
    print("     write right after the kill: %d %s in %.0f ms" % (st, code, took * 1000),
          flush=True)
    if st == 503:
        check_no_leader("write in flight", st, hd, js)
    else:
        check(st == 504 and code == "timeout", "write in flight: %d %r" % (st, js))
    check(took <= t_limit, "write in flight answered after %.1f s (> request timeout %.1f s)"
          % (took, REQUEST_TIMEOUT_MS / 1000.0))

    # Once it knows there is no leader: 503 no_leader at once, every time.
    wait_leaderless(survivor)
    for i in range(3):
        r, took = timed(jreq, survivor.http_port, "PUT", "/v1/kv/" + k, {"value": "x"},
                        timeout=5)
        check_no_leader("PUT (try %d)" % i, *r)
        check(took < 1.0, "PUT answered after %.0f ms" % (took * 1000))
        r, took = timed(jreq, survivor.http_port, "GET",
                        "/v1/kv/%s?consistency=linearizable" % k, timeout=5)
        check_no_leader("linearizable GET (try %d)" % i, *r)
        check(took < 1.0, "GET answered after %.0f ms" % (took * 1000))
    for method, path, body in (("GET", "/v1/kv?prefix=nl/&consistency=linearizable", None),
                               ("POST", "/v1/kv/nl/n/incr", None),
                               ("PUT", "/v1/kv/nl/c?mode=committed", b"c"),
                               ("DELETE", "/v1/kv/" + k, None),
                               ("GET", "/readyz", None)):
        st, hd, data = request(survivor.http_port, method, path, body, timeout=5)
        try:
            js = json.loads(data)
        except ValueError:
            js = None
        check_no_leader("%s %s" % (method, path), st, hd, js)
    # Still up: liveness and the local state answer.
    st, _, _ = request(survivor.http_port, "GET", "/healthz")
    check(st == 200, "healthz: %d" % st)
    st, _, js = jreq(survivor.http_port, "GET", "/v1/kv/%s?consistency=stale" % k)
    check(st == 200 and js["value"] == "before", "stale read: %d %r" % (st, js))


def restore():
    for nd in C.nodes:
        if not nd.alive():
            nd.start()
    C.wait_leader(timeout=20)


def test_leader_left_alone_answers_503_no_leader():
    leader = C.wait_leader()
    try:
        lose_quorum(C.node(leader))
    finally:
        restore()


def test_follower_left_alone_answers_503_no_leader():
    leader = C.wait_leader()
    follower = next(nd for nd in C.nodes if nd.id != leader)
    try:
        lose_quorum(follower)
    finally:
        restore()


def test_graceful_stop():
    check_graceful_stop(C)


def main():
    global C
    C = Cluster(sys.argv[1], 3, extra_args=["--request-timeout-ms", str(REQUEST_TIMEOUT_MS)])
    C.start()
    print("leader: node %d (data in %s)" % (C.wait_leader(), C.dir), flush=True)
    failed = run([test_leader_left_alone_answers_503_no_leader,
                  test_follower_left_alone_answers_503_no_leader,
                  test_graceful_stop])
    finish(C, failed)


if __name__ == "__main__":
    main()
