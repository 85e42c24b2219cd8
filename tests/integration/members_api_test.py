#!/usr/bin/env python3
"""The membership API checks its input, and a node that is no member says so
(issue 54 items 3 and 5), against a real three-node tierkvd cluster with a
cluster token (a refusal in the handshake is only believed when proven).

1. POST /v1/members with a malformed address ("nonsense", no port, port 0 or
   65536, a bad host, an unbracketed IPv6 address) is 400 bad_request naming
   the field; nothing is added.
2. An id, Raft address or HTTP address another member has is 409 conflict
   naming that member; nothing is added.
3. Well-formed addresses of every kind (IPv4, [IPv6], a DNS name) are taken,
   as learners, until RAFT_LEARNERS_MAX (8): the next add is 409 member_limit
   naming the limit; docs/api.md states it. With 16 voters (RAFT_VOTERS_MAX;
   a bootstrap configuration of 16, 9 of them running), an add as a voter
   and a promotion are 409 member_limit.
4. No answer to any of it is a 500.
5. A removed voter answers 503 `removed` on /readyz, reads and writes.
6. A node whose data directory was wiped and that comes back under its old id
   is refused by the cluster: /readyz, reads and writes answer 503
   `not_a_member`, saying to remove the id and add the node under a new one.
7. `tierkv member list` through a follower alone shows the lag of every
   member (only the leader knows it: the CLI asks the leader at the HTTP
   address of its record); the follower's own list has none.
8. `tierkv scan` lists no internal record (keys starting with 0x01: the
   member records); `tierkv scan --internal` lists every member's record.

Every wait is a bounded poll; the times are printed.

usage: members_api_test.py TIERKVD
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster  # noqa: E402
from tkcluster import Fail, check  # noqa: E402

LEARNERS_MAX = 8


def post(port, obj):
    body = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
    st, _, data = tkcluster.request(port, "POST", "/v1/members", body,
                                    {"Content-Type": "application/json"}, timeout=40)
    try:
        js = json.loads(data) if data else None
    except ValueError:
        js = None
    check(st < 500, "POST /v1/members %r: %d %r (a 500 for input)" % (obj, st, data))
    return st, js


def err(js):
    return (js or {}).get("error", {})


def members(port):
    st, _, js = tkcluster.jreq(port, "GET", "/v1/members")
    check(st == 200, "GET /v1/members: %d" % st)
    return js["members"]


def wait_code(port, method, path, want, limit_s):
    """Polls until `method path` answers 503 with error code `want`; returns the
    last answer and the time it took."""
    t0 = time.time()
    last = None
    while time.time() < t0 + limit_s:
        try:
            st, hd, data = tkcluster.request(port, method, path, b"v" if method == "PUT"
                                             else None, timeout=5)
            last = (st, data)
            if st == 503 and json.loads(data)["error"]["code"] == want:
                return json.loads(data)["error"], hd, time.time() - t0
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise Fail("%s %s on :%d never answered 503 %s in %ds; last %r" %
               (method, path, port, want, limit_s, last))


def test_bad_addresses(cl, lead):
    before = len(members(lead.http_port))
    bad = [
        ({"id": 10, "raft": "127.0.0.1:7990", "http": "nonsense"}, "http"),
        ({"id": 10, "raft": "nonsense"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1"}, "raft"),
        ({"id": 10, "raft": ":7001"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1:0"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1:65536"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1:7a"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1:-1"}, "raft"),
        ({"id": 10, "raft": "bad_host:7001"}, "raft"),
        ({"id": 10, "raft": "-bad.example:7001"}, "raft"),
        ({"id": 10, "raft": "999.1.1.1:7001"}, "raft"),
        ({"id": 10, "raft": "fe80::1:7001"}, "raft"),
        ({"id": 10, "raft": "[fe80::zz]:7001"}, "raft"),
        ({"id": 10, "raft": "[::1:7001"}, "raft"),
        ({"id": 10, "raft": "127.0.0.1:7990", "http": "127.0.0.1:99999"}, "http"),
        ({"id": 10, "raft": "127.0.0.1:7990", "http": "127.0.0.1:7990"}, "same"),
    ]
    for body, field in bad:
        st, js = post(lead.http_port, body)
        e = err(js)
        check(st == 400 and e.get("code") == "bad_request",
              "%r: want 400 bad_request, got %d %r" % (body, st, js))
        named = '"%s"' % field if field != "same" else "the same address"
        check(named in e.get("message", ""), "%r: the message %r does not name %s" %
              (body, e.get("message"), named))
    for body in (b"not json", b"[1]", {"id": 0, "raft": "127.0.0.1:7990"},
                 {"id": -3, "raft": "127.0.0.1:7990"}, {"id": 10},
                 {"id": 10, "raft": "127.0.0.1:7990", "x": 1},
                 {"id": 10, "raft": "127.0.0.1:7990", "learner": "yes"},
                 {"id": 10, "raft": "a" * 300 + ":7990"}):
        st, js = post(lead.http_port, body)
        check(st == 400, "%r: want 400, got %d %r" % (body, st, js))
    check(len(members(lead.http_port)) == before, "a refused add changed the members")
    print("  %d malformed addresses and %d malformed bodies: 400" % (len(bad), 8))


def test_conflicts(cl, lead):
    other = next(nd for nd in cl.nodes if nd.id != lead.id)
    before = len(members(lead.http_port))
    cases = [
        ({"id": 1, "raft": "127.0.0.1:7990"}, "node 1 is already a member"),
        ({"id": 10, "raft": "127.0.0.1:%d" % cl.raft_ports[other.id - 1]},
         "of member %d" % other.id),
        ({"id": 10, "raft": "127.0.0.1:7990",
          "http": "127.0.0.1:%d" % other.http_port}, "of member %d" % other.id),
        # The HTTP address of one as the Raft address of another.
        ({"id": 10, "raft": "127.0.0.1:%d" % lead.http_port}, "of member %d" % lead.id),
    ]
    for body, says in cases:
        st, js = post(lead.http_port, body)
        e = err(js)
        check(st == 409 and e.get("code") == "conflict",
              "%r: want 409 conflict, got %d %r" % (body, st, js))
        check(says in e.get("message", ""), "%r: message %r lacks %r" %
              (body, e.get("message"), says))
    check(len(members(lead.http_port)) == before, "a conflicting add changed the members")
    print("  %d conflicts: 409 conflict naming the member" % len(cases))


def test_learner_limit(cl, lead):
    good = ["127.0.0.1:7981", "[::1]:7982", "node-3.example.com:7983", "Host4:7984",
            "10.0.0.5:7985", "[2001:db8::7]:7986", "n7:7987", "tierkv-8.local:7988"]
    t0 = time.time()
    for i, raft in enumerate(good):
        body = {"id": 20 + i, "raft": raft, "http": raft.rsplit(":", 1)[0] + ":%d" %
                (8981 + i), "learner": True}
        for _ in range(100):  # a change still committing answers change_pending
            st, js = post(lead.http_port, body)
            if not (st == 409 and err(js).get("code") == "change_pending"):
                break
            time.sleep(0.05)
        check(st == 200 and js.get("ok"), "add %r: %d %r" % (body, st, js))
    learners = [m for m in members(lead.http_port) if m["role"] == "learner"]
    check(len(learners) == LEARNERS_MAX, "learners: %r" % learners)
    # The same address as a learner's, another case for the conflict check.
    st, js = post(lead.http_port, {"id": 40, "raft": "host4:7984", "learner": True})
    check(st == 409 and err(js).get("code") == "conflict", "host4: %d %r" % (st, js))
    for learner in (True, False):
        st, js = post(lead.http_port, {"id": 30, "raft": "127.0.0.1:7989",
                                       "learner": learner})
        e = err(js)
        check(st == 409 and e.get("code") == "member_limit",
              "the 9th learner: want 409 member_limit, got %d %r" % (st, js))
        check("RAFT_LEARNERS_MAX" in e["message"] and "8 learners" in e["message"],
              "the limit is not named: %r" % e["message"])
    print("  %d learners added in %.1f s (IPv4, [IPv6], DNS names); the 9th: 409 "
          "member_limit: %s" % (LEARNERS_MAX, time.time() - t0, e["message"]))
    doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                            "docs", "api.md")).read()
    check("member_limit" in doc and "RAFT_LEARNERS_MAX" in doc,
          "docs/api.md does not state the member limits")


def test_list_through_a_follower(cl, lead, follower):
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(sys.argv[1])))), "cmd", "tierkv", "tierkv")
    own = members(follower.http_port)
    check(all("lag" not in m for m in own),
          "the follower's own list has lag, which only the leader knows: %r" % own)
    env = {k: v for k, v in os.environ.items() if k != "TIERKV_ENDPOINTS"}
    for args, want in ((["member", "list"], None), (["--json", "member", "list"], "json")):
        p = subprocess.run([cli, "-e", "127.0.0.1:%d" % follower.http_port] + args,
                           env=env, capture_output=True, text=True, timeout=30)
        check(p.returncode == 0, "tierkv %s: exit %d: %s" % (" ".join(args), p.returncode,
                                                            p.stderr))
        if want == "json":
            js = json.loads(p.stdout)
            check(js["id"] == lead.id and all(isinstance(m.get("lag"), int)
                                              for m in js["members"]),
                  "--json member list through a follower: not the leader's list: %r" % js)
            continue
        rows = [l.split() for l in p.stdout.splitlines()[1:] if l and l[0].isdigit()]
        check(len(rows) == 3 and all(r[-1].isdigit() for r in rows),
              "member list through a follower: a row without lag:\n%s%s" % (p.stdout,
                                                                            p.stderr))


def test_scan_internal(cl, lead):
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(sys.argv[1])))), "cmd", "tierkv", "tierkv")
    env = {k: v for k, v in os.environ.items() if k != "TIERKV_ENDPOINTS"}
    st, _, _ = tkcluster.request(lead.http_port, "PUT", "/v1/kv/user-key", "v")
    check(st == 200, "PUT user-key: %d" % st)
    keys = {}
    for extra in ([], ["--internal"]):
        p = subprocess.run([cli, "-e", "127.0.0.1:%d" % lead.http_port, "--json", "scan", ""]
                           + extra, env=env, capture_output=True, text=True, timeout=30)
        check(p.returncode == 0, "tierkv scan %s: exit %d: %s" % (extra, p.returncode,
                                                                 p.stderr))
        keys[bool(extra)] = [it["key"] for it in json.loads(p.stdout)["items"]]
    check(keys[False] == ["user-key"],
          "tierkv scan lists internal records (or misses user-key): %r" % keys[False])
    want = {"\x01tierkv/member/%d" % nd.id for nd in cl.nodes}
    check(want <= set(keys[True]) and "user-key" in keys[True],
          "tierkv scan --internal misses member records: %r" % keys[True])


def test_removed(cl, lead, gone):
    st, _, js = tkcluster.jreq(lead.http_port, "DELETE", "/v1/members/%d" % gone.id,
                               timeout=40)
    check(st == 200, "remove %d: %d %r" % (gone.id, st, js))
    e, hd, took = wait_code(gone.http_port, "GET", "/readyz", "removed", 15)
    check("Retry-After" not in hd and "retry-after" not in hd,
          "removed: a Retry-After says to retry: %r" % hd)
    check("new id" in e["message"], "removed: %r" % e)
    print("  node %d removed: /readyz 503 removed after %.2f s: %s" %
          (gone.id, took, e["message"]))
    for method, path in (("GET", "/v1/kv/k"), ("PUT", "/v1/kv/k"), ("GET", "/v1/kv?prefix=")):
        e, _, took = wait_code(gone.http_port, method, path, "removed", 15)
        print("  node %d: %s %s: 503 removed (%.2f s)" % (gone.id, method, path, took))
    cl_js = cl.status(gone)
    check(cl_js and cl_js.get("membership") == "removed", "/v1/cluster: %r" % cl_js)
    lead_js = cl.status(lead)
    check(lead_js and lead_js.get("membership") == "member", "/v1/cluster: %r" % lead_js)


def test_not_a_member(cl, lead, wiped):
    # The leader binds each member's data directory at first contact; wait for
    # the wiped node's binding before wiping it.
    t0 = time.time()
    path = "/v1/kv/%01tierkv%2Fmember%2F" + str(wiped.id) + "?raw"
    while True:
        st, _, data = tkcluster.request(lead.http_port, "GET", path)
        rec = tkcluster.member_record_text(data) if st == 200 else ""
        if "inc=-" not in rec and "inc=" in rec:
            break
        check(time.time() < t0 + 15, "node %d's incarnation never recorded: %d %r" %
              (wiped.id, st, data))
        time.sleep(0.05)
    wiped.kill()
    shutil.rmtree(os.path.join(cl.dir, "n%d" % wiped.id))
    wiped.start()
    e, _, took = wait_code(wiped.http_port, "GET", "/readyz", "not_a_member", 20)
    check("remove" in e["message"] and "new" in e["message"], "not_a_member: %r" % e)
    print("  node %d wiped and restarted: /readyz 503 not_a_member after %.2f s" %
          (wiped.id, took))
    for method, path in (("GET", "/v1/kv/k"), ("PUT", "/v1/kv/k"), ("GET", "/v1/kv?prefix=")):
        e, _, took = wait_code(wiped.http_port, method, path, "not_a_member", 15)
        check("remove" in e["message"] and "new id" in e["message"],
              "%s %s: %r" % (method, path, e))
        print("  node %d: %s %s: 503 not_a_member: %s" % (wiped.id, method, path,
                                                          e["message"]))
    cl_js = cl.status(wiped)
    check(cl_js and cl_js.get("membership") == "not_a_member", "/v1/cluster: %r" % cl_js)


def test_voter_limit(binary):
    """16 voters in the bootstrap configuration, 9 of them running (a
    quorum): a learner may join, but an add as a voter and a promotion are
    409 member_limit naming RAFT_VOTERS_MAX."""
    cl = tkcluster.Cluster(binary, 16, token=True)
    try:
        for nd in cl.nodes[:9]:
            nd.start()
        lead = cl.node(cl.wait_leader(timeout=60))
        st, js = post(lead.http_port, {"id": 30, "raft": "127.0.0.1:7979", "learner": True})
        check(st == 200, "a learner beside 16 voters: %d %r" % (st, js))
        st, js = post(lead.http_port, {"id": 31, "raft": "127.0.0.1:7978"})
        e = err(js)
        check(st == 409 and e.get("code") == "member_limit" and
              "RAFT_VOTERS_MAX" in e.get("message", "") and "16 voters" in e["message"],
              "a 17th voter: want 409 member_limit, got %d %r" % (st, js))
        for _ in range(100):
            st, _, js = tkcluster.jreq(lead.http_port, "POST", "/v1/members/30/promote",
                                       timeout=40)
            if not (st == 409 and err(js).get("code") == "change_pending"):
                break
            time.sleep(0.05)
        e = err(js)
        check(st == 409 and e.get("code") == "member_limit" and
              "RAFT_VOTERS_MAX" in e.get("message", ""),
              "promoting a 17th voter: want 409 member_limit, got %d %r" % (st, js))
        print("  16 voters: an add as a voter and a promotion: 409 member_limit: %s" %
              e["message"])
    finally:
        cl.stop()


def main():
    cl = tkcluster.Cluster(sys.argv[1], 3, token=True)
    cl.start()
    failed = False
    try:
        lid = cl.wait_leader(timeout=30)
        lead = cl.node(lid)
        followers = [nd for nd in cl.nodes if nd.id != lid]
        t0 = time.time()
        test_list_through_a_follower(cl, lead, followers[0])
        print("ok   %-28s %.2fs" % ("test_list_through_a_follower", time.time() - t0),
              flush=True)
        for t in (test_scan_internal, test_bad_addresses, test_conflicts,
                  test_learner_limit):
            t0 = time.time()
            t(cl, lead)
            print("ok   %-28s %.2fs" % (t.__name__, time.time() - t0), flush=True)
        t0 = time.time()
        test_removed(cl, lead, followers[0])
        print("ok   %-28s %.2fs" % ("test_removed", time.time() - t0), flush=True)
        t0 = time.time()
        test_not_a_member(cl, lead, followers[1])
        print("ok   %-28s %.2fs" % ("test_not_a_member", time.time() - t0), flush=True)
    except (Fail, OSError) as e:
        failed = True
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    finally:
        cl.stop()
    if not failed:
        t0 = time.time()
        try:
            test_voter_limit(sys.argv[1])
            print("ok   %-28s %.2fs" % ("test_voter_limit", time.time() - t0), flush=True)
        except (Fail, OSError) as e:
            failed = True
            print("FAIL test_voter_limit %s: %s" % (type(e).__name__, e), flush=True)
    tkcluster.finish(cl, failed)


if __name__ == "__main__":
    main()
