#!/usr/bin/env python3
"""Membership changes on real tierkvd processes, following docs/operations.md
("Grow 3 -> 5 -> 3") command by command with the tierkv CLI:

  - a 3-node cluster under a steady stream of writes;
  - node 4 starts with --join and is added as a learner, then promoted;
  - node 5 is added as a voter in one command (add, catch up, promote);
  - nodes 1 and 2 are removed (the leader among them when it is one), so the
    cluster is {3, 4, 5}, and stopped;
  - the refusals: a second id reused, an unknown member, a lagging learner's
    promotion (409 not_caught_up with how far behind);
  - no acknowledged write is lost (each read back, linearizable, from the
    final cluster) and every remaining node ends with the same digest.

usage: membership_test.py TIERKVD TIERKV
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402


class Writer(threading.Thread):
    """PUTs w/<i> = v<i> to the given HTTP ports in turn until stopped;
    remembers every acknowledged (200) key."""

    def __init__(self, ports):
        super().__init__(daemon=True)
        self.ports = list(ports)
        self.acked = {}
        self.errors = 0
        self.stop_flag = threading.Event()

    def run(self):
        i = 0
        while not self.stop_flag.is_set():
            i += 1
            key, val = "w%06d" % i, "v%d" % i
            port = self.ports[i % len(self.ports)]
            try:
                st, _, _ = tk.request(port, "PUT", "/v1/kv/" + key, val, timeout=5)
            except Exception:
                st = 0
            if st == 200:
                self.acked[key] = val
            else:
                self.errors += 1
                time.sleep(0.02)
            time.sleep(0.002)


def cli(tierkv, endpoints, *args, timeout=90):
    p = subprocess.run([tierkv, "-e", ",".join(endpoints)] + list(args),
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def members(port):
    st, _, js = tk.jreq(port, "GET", "/v1/members")
    tk.check(st == 200, "GET /v1/members: %d" % st)
    return js


def wait_for(cond, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = cond()
        except (OSError, ValueError, KeyError, TypeError):
            v = None  # not up yet
        if v:
            return v
        time.sleep(0.05)
    raise tk.Fail("timed out waiting for " + what)


def joiner(cluster, tierkvd, node_id, members_flag):
    rp, hp = tk.free_ports(2)
    args = ["--id", str(node_id), "--join", "--members", members_flag,
            "--listen-raft", "127.0.0.1:%d" % rp,
            "--listen-http", "127.0.0.1:%d" % hp,
            "--data-dir", os.path.join(cluster.dir, "n%d" % node_id), "--store", "fs",
            "--tick-ms", str(cluster.tick_ms),
            "--election-ticks", str(cluster.election_ticks), "--kv-no-sync"
            ] + cluster.token_args
    nd = tk.Node(tierkvd, node_id, args, cluster.dir)
    nd.http_port = hp
    nd.raft_port = rp
    cluster.nodes.append(nd)
    nd.start()
    wait_for(lambda: cluster.status(nd) is not None, "node %d's HTTP" % node_id)
    return nd


def digests_equal(nodes):
    ds = []
    for nd in nodes:
        st, _, js = tk.jreq(nd.http_port, "GET", "/v1/debug/digest")
        if st != 200:
            return None
        ds.append((js["applied"], js["digest"]))
    if len({d for _, d in ds}) == 1 and len({a for a, _ in ds}) == 1:
        return ds
    return None


def test_grow_and_shrink(tierkvd, tierkv):
    c = tk.Cluster(tierkvd, 3)
    failed = True
    try:
        c.start()
        c.wait_leader()
        members_flag = ",".join("%d=127.0.0.1:%d" % (i + 1, c.raft_ports[i])
                                for i in range(3))
        eps = ["127.0.0.1:%d" % p for p in c.http_ports]
        # Writes go to node 3, which stays a member throughout.
        w = Writer(c.http_ports)
        w.start()
        wait_for(lambda: len(w.acked) >= 50, "the first writes")

        # Grow: node 4 joins as a learner and is promoted.
        n4 = joiner(c, tierkvd, 4, members_flag)
        rc, out, err = cli(tierkv, eps, "member", "add", "4", "--raft",
                           "127.0.0.1:%d" % n4.raft_port, "--http",
                           "127.0.0.1:%d" % n4.http_port, "--learner")
        tk.check(rc == 0, "member add 4: rc %d %s %s" % (rc, out, err))
        m = members(c.http_ports[2])
        roles = {x["id"]: x["role"] for x in m["members"]}
        tk.check(roles.get(4) == "learner", "node 4 is not a learner: %r" % m)
        # A second add while... the id reused: refused with 409.
        rc, out, err = cli(tierkv, eps, "member", "add", "4", "--raft", "127.0.0.1:1")
        tk.check(rc == 4 and "already a member" in err, "re-add 4: %d %s" % (rc, err))
        rc, out, err = cli(tierkv, eps, "member", "promote", "4", "--wait", "60s")
        tk.check(rc == 0, "member promote 4: rc %d %s %s" % (rc, out, err))
        # Idempotent retry.
        rc, out, err = cli(tierkv, eps, "member", "promote", "4")
        tk.check(rc == 0, "promote 4 again: rc %d %s %s" % (rc, out, err))
        wait_for(lambda: tk.jreq(n4.http_port, "GET", "/readyz")[0] == 200,
                 "node 4 ready")

        # Node 5 in one command: added, caught up, promoted.
        n5 = joiner(c, tierkvd, 5, members_flag)
        rc, out, err = cli(tierkv, eps, "member", "add", "5", "--raft",
                           "127.0.0.1:%d" % n5.raft_port, "--http",
                           "127.0.0.1:%d" % n5.http_port)
        tk.check(rc == 0, "member add 5: rc %d %s %s" % (rc, out, err))
        m = members(c.http_ports[2])
        roles = {x["id"]: x["role"] for x in m["members"]}
        tk.check(roles == {1: "voter", 2: "voter", 3: "voter", 4: "voter",
                           5: "voter"}, "five voters: %r" % m)

        # One change at a time: two adds pipelined on one connection to the
        # leader; the second is refused while the first is in progress.
        lead = members(c.http_ports[2])["leader"]
        port = [nd.http_port for nd in c.nodes if nd.id == lead][0]
        reqs = b""
        for i, nid in enumerate((9, 10)):
            body = json.dumps({"id": nid, "raft": "127.0.0.1:1", "learner": True})
            reqs += (b"POST /v1/members HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                     % (len(body), b"Connection: close\r\n" if i else b"",
                        body.encode()))
        resp = tk.parse_responses(tk.raw(port, reqs, timeout=20, until_close=True))
        tk.check([r[0] for r in resp] == [200, 409] and b"change_pending" in resp[1][2],
                 "two changes at once: %r" % resp)
        print("     second change at once: 409 %s" % resp[1][2].decode().strip())
        # A learner that never runs cannot be promoted: 409 with its lag.
        st, _, js = tk.jreq(port, "POST", "/v1/members/9/promote")
        tk.check(st == 409 and js["error"]["code"] == "not_caught_up" and
                 js["error"]["behind"] > 0, "promote 9: %d %r" % (st, js))
        print("     promote of a dead learner: %d %s" % (st, json.dumps(js)))
        rc, out, err = cli(tierkv, eps, "member", "remove", "9")
        tk.check(rc == 0, "remove 9: rc %d %s" % (rc, err))
        rc, out, err = cli(tierkv, eps, "member", "add", "9", "--raft", "127.0.0.1:1")
        tk.check(rc == 4 and "never reused" in err, "re-add removed 9: %d %s" % (rc, err))
        rc, out, err = cli(tierkv, eps, "member", "remove", "77")
        tk.check(rc == 3, "remove unknown 77: %d %s" % (rc, err))

        # Shrink: the leader first (it steps down once its removal commits),
        # then an original node; writes go to the three that stay.
        lead = members(c.http_ports[2])["leader"]
        gones = [lead, 1 if lead != 1 else 2]
        stay = [nd for nd in c.nodes if nd.id not in gones and nd.id in (1, 2, 3, 4, 5)]
        w.ports = [nd.http_port for nd in stay]
        eps5 = ["127.0.0.1:%d" % nd.http_port for nd in stay]
        time.sleep(0.1)
        for gone in gones:
            t0 = time.time()
            rc, out, err = cli(tierkv, eps5, "member", "remove", str(gone))
            tk.check(rc == 0, "member remove %d: rc %d %s %s" % (gone, rc, out, err))
            print("     removed node %d in %.2fs (the leader: %s)" %
                  (gone, time.time() - t0, gone == lead))
            if gone == lead:
                gn = c.node(gone)
                wait_for(lambda: (c.status(gn) or {}).get("role") != "leader",
                         "the removed leader %d to step down" % gone)
            code = c.node(gone).term()
            tk.check(code == 0, "removed node %d exited %s" % (gone, code))
        ids = sorted(nd.id for nd in stay)
        sp = stay[0].http_port
        lead = wait_for(lambda: members(sp)["leader"] in ids and members(sp)["leader"],
                        "a leader among %r" % ids)
        m = members(sp)
        roles = {x["id"]: x["role"] for x in m["members"]}
        tk.check(roles == {i: "voter" for i in ids}, "back to three: %r" % m)
        # A retried promotion of a voter, in a later term than its entry's (the
        # leader changed since), is still a plain success.
        rc, out, err = promote_retrying(tierkv, eps5, max(ids))
        tk.check(rc == 0, "promote voter %d again, later term: rc %d %s %s" %
                 (max(ids), rc, out, err))
        time.sleep(0.5)  # writes go on under the new configuration
        w.stop_flag.set()
        w.join(timeout=30)
        print("     %d writes acknowledged, %d refused or failed; leader %d" %
              (len(w.acked), w.errors, lead))

        final = stay
        lost = []
        for key, val in w.acked.items():
            st, _, data = tk.request(sp, "GET", "/v1/kv/%s?raw" % key)
            if st != 200 or data.decode() != val:
                lost.append((key, st))
        tk.check(not lost, "acknowledged writes lost: %r" % lost[:10])
        ds = wait_for(lambda: digests_equal(final), "equal digests on %r" % ids)
        print("     digests equal: %r" % (ds,))
        # The original node that stays restarts behind a leader added at run
        # time: it must reach that leader (whose address it had only applied
        # in its KV's memory) to catch up.
        old = [nd for nd in stay if nd.id <= 3][0]
        old.kill()
        others = [nd for nd in stay if nd is not old]
        lead = wait_for(lambda: members(others[0].http_port)["leader"] in
                        [nd.id for nd in others] and members(others[0].http_port)["leader"],
                        "a leader added at run time")
        for i in range(200):
            st, _, _ = tk.request(others[i % 2].http_port, "PUT", "/v1/kv/late%03d" % i, "x")
            tk.check(st == 200, "put late%03d: %d" % (i, st))
        # A new leader knows nothing of the old node's log (no progress yet).
        ln = [nd for nd in others if nd.id == lead][0]
        ln.kill()
        ln.start()
        lead = wait_for(lambda: members(others[0].http_port)["leader"] in
                        [nd.id for nd in others] and members(others[0].http_port)["leader"],
                        "a leader again", timeout=30)
        # The node asked may still name the killed leader for a moment: retry
        # (a request that times out is retried too) until one is answered 200.
        wait_for(lambda: tk.request(others[0].http_port, "PUT", "/v1/kv/late-after",
                                    "x")[0] == 200, "a write after the leader's restart")
        old.start()
        t0 = time.time()
        ds = wait_for(lambda: digests_equal(stay), "node %d caught up after its restart"
                      % old.id, timeout=30)
        print("     node %d restarted behind leader %d and caught up in %.2fs" %
              (old.id, lead, time.time() - t0))
        codes = c.stop()
        tk.check(all(v == 0 for v in codes.values()), "exit codes %r" % codes)
        failed = False
    finally:
        if failed:
            for nd in c.nodes:
                sys.stdout.write("--- log of node %d\n" % nd.id)
                sys.stdout.write("\n".join(nd.log().splitlines()[-25:]) + "\n")
        c.stop()


def promote_retrying(tierkv, eps, node_id, timeout=15):
    """tierkv member promote, again while the leader answers change_pending
    (409, exit 4: a change still uncommitted, or no entry of its term
    committed yet after an election; the API says to retry)."""
    deadline = time.time() + timeout
    while True:
        rc, out, err = cli(tierkv, eps, "member", "promote", str(node_id))
        if rc != 4 or "change_pending" not in err or time.time() > deadline:
            return rc, out, err
        time.sleep(0.1)


def record(port, node_id):
    """The member record of node_id as `port` has applied it, as text ("" if
    none; tk.member_record_text)."""
    st, _, data = tk.request(port, "GET", "/v1/kv/%%01tierkv%%2Fmember%%2F%d?raw"
                             "&consistency=stale" % node_id)
    return tk.member_record_text(data) if st == 200 else ""


def metric(port, name):
    st, _, data = tk.request(port, "GET", "/metrics")
    for ln in data.decode().splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            return float(ln.split()[-1])
    return None


def test_amnesiac_refused_then_replaced(tierkvd, tierkv):
    """Node 3 loses its data directory and comes back under its old id: the
    cluster refuses it (its /readyz says not_a_member, its log says what to
    do, the leader counts the refusal); then docs/operations.md's "Replace a
    failed node" puts node 6 in its place. With a cluster token, as `make run`
    starts one: a refusal is acted on only when it is authenticated."""
    c = tk.Cluster(tierkvd, 3, token=True)
    failed = True
    try:
        c.start()
        lead = c.wait_leader()
        lport = c.node(lead).http_port
        eps = ["127.0.0.1:%d" % p for p in c.http_ports]
        for i in range(100):
            st, _, _ = tk.request(c.http_ports[0], "PUT", "/v1/kv/a%03d" % i, "x%d" % i)
            tk.check(st == 200, "put a%03d: %d" % (i, st))
        # The leader records each member's data directory on first contact.
        wait_for(lambda: all("inc=" in record(lport, i) and "inc=-" not in record(lport, i)
                             for i in (1, 2, 3)), "the incarnations recorded")
        victim = 3 if lead != 3 else 2
        vn = c.node(victim)
        vn.kill()
        import shutil
        shutil.rmtree(os.path.join(c.dir, "n%d" % victim))
        vn.start()
        wait_for(lambda: tk.request(vn.http_port, "GET", "/readyz")[0] in (200, 503),
                 "the wiped node's HTTP")
        st_js = wait_for(lambda: (lambda r: r if r[0] == 503 and r[2] and
                                  r[2]["error"]["code"] == "not_a_member" else None)(
            tk.jreq(vn.http_port, "GET", "/readyz")), "/readyz not_a_member", timeout=20)
        print("     wiped node %d: /readyz %d %s" % (victim, st_js[0], st_js[2]["error"]["code"]))
        tk.check("refused this node" in vn.log() and "tierkv member remove" in vn.log(),
                 "no clear refusal line in the wiped node's log")
        line = [ln for ln in vn.log().splitlines() if "refused this node" in ln][0]
        print("     its log: %s" % line[:200])
        lead = c.wait_leader(exclude=(victim,))
        lport = c.node(lead).http_port
        refused = metric(lport, "tierkv_member_refused_total")
        tk.check(refused and refused > 0, "leader's refusal metric: %r" % refused)
        st, _, _ = tk.request(vn.http_port, "GET", "/v1/kv/a001")
        tk.check(st == 503, "a read through the wiped node: %d, not 503" % st)
        for i in range(100, 150):
            st, _, _ = tk.request(lport, "PUT", "/v1/kv/a%03d" % i, "x%d" % i)
            tk.check(st == 200, "put a%03d: %d" % (i, st))

        # Replace a failed node (docs/operations.md): remove the old id, start
        # the new node with --join, add it under a new id.
        rc, out, err = cli(tierkv, eps, "member", "remove", str(victim))
        tk.check(rc == 0, "member remove %d: %d %s" % (victim, rc, err))
        vn.kill()
        members_flag = ",".join("%d=127.0.0.1:%d" % (i + 1, c.raft_ports[i])
                                for i in range(3) if i + 1 != victim)
        n6 = joiner(c, tierkvd, 6, members_flag)
        rc, out, err = cli(tierkv, eps, "member", "add", "6", "--raft",
                           "127.0.0.1:%d" % n6.raft_port, "--http",
                           "127.0.0.1:%d" % n6.http_port)
        tk.check(rc == 0, "member add 6: %d %s %s" % (rc, out, err))
        rc, out, err = cli(tierkv, eps, "member", "add", str(victim), "--raft", "127.0.0.1:1")
        tk.check(rc == 4 and "never reused" in err, "re-add %d: %d %s" % (victim, rc, err))
        m = members(lport)
        ids = sorted(x["id"] for x in m["members"] if x["role"] == "voter")
        want = sorted([i for i in (1, 2, 3) if i != victim] + [6])
        tk.check(ids == want, "voters %r, want %r" % (ids, want))
        for i in range(150):
            st, _, data = tk.request(n6.http_port, "GET", "/v1/kv/a%03d?raw" % i)
            tk.check(st == 200 and data.decode() == "x%d" % i, "a%03d on node 6: %d" % (i, st))
        final = [nd for nd in c.nodes if nd.id in want]
        ds = wait_for(lambda: digests_equal(final), "equal digests on %r" % want)
        print("     replaced by node 6; digests equal: %r" % (ds,))
        # A retried promotion of a voter whose entry is of an earlier term
        # (the leader is killed: a new term) is still a plain success.
        lead = c.wait_leader(exclude=(victim,))
        c.node(lead).kill()
        rest = [nd for nd in final if nd.id != lead]
        lead2 = wait_for(lambda: members(rest[0].http_port)["leader"] not in (0, lead) and
                         members(rest[0].http_port)["leader"], "a new leader")
        other = [nd.id for nd in rest if nd.id != lead2][0]
        reps = ["127.0.0.1:%d" % nd.http_port for nd in rest]
        rc, out, err = promote_retrying(tierkv, reps, other)
        tk.check(rc == 0, "promote voter %d in a later term: rc %d %s %s" % (other, rc, out, err))
        codes = c.stop()
        tk.check(all(v == 0 for v in codes.values()), "exit codes %r" % codes)
        failed = False
    finally:
        if failed:
            for nd in c.nodes:
                sys.stdout.write("--- log of node %d\n" % nd.id)
                sys.stdout.write("\n".join(nd.log().splitlines()[-25:]) + "\n")
        c.stop()


if __name__ == "__main__":
    sys.exit(1 if tk.run([test_grow_and_shrink, test_amnesiac_refused_then_replaced],
                         sys.argv[1], sys.argv[2]) else 0)
