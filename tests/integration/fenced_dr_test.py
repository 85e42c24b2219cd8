#!/usr/bin/env python3
"""Fenced disaster recovery (issue 54 items 2 and 3b), on real tierkvd
processes with a cluster token, as `make run` starts them:

  test_fenced_recovery
    A 3-node cluster takes writes and stops. Node 3 starts with
    --force-new-cluster (docs/operations.md "Disaster recovery"); then nodes 1
    and 2 come back with their old data. They must be refused as strangers:
    node 3 stays the one leader at the same term, every write acknowledged
    (before and after) reads back from it, a write sent to node 3 is never
    applied on 1 or 2 (their logs stay where the old cluster left
    them), 1 and 2 answer /readyz 503 not_a_member and node 3's
    log names them. Then two new nodes join the recovered cluster the
    documented way (--join, `tierkv member add ... --http`); a write to one of
    them names the leader's HTTP address, `member list` shows an HTTP address
    for every member, and `tierkv -e <that node> snapshot save` works. Last, a
    second --force-new-cluster (on a joined node, then on node 3) is refused:
    tierkvd exits 2 with the reason, and the cluster goes on.

usage: fenced_dr_test.py TIERKVD TIERKV
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402
import membership_test as mt  # noqa: E402


def put(port, key, val, timeout=5):
    try:
        st, _, _ = tk.request(port, "PUT", "/v1/kv/" + key, val, timeout=timeout)
    except OSError:
        st = 0
    return st


def readyz_code(port):
    st, _, js = tk.jreq(port, "GET", "/readyz")
    return st, (js or {}).get("error", {}).get("code")


def start_expecting_exit(nd, timeout=30):
    """Starts nd and waits for it to exit; returns (code, the log's new text)."""
    before = len(nd.log())
    nd.start()
    t0 = time.time()
    while nd.alive() and time.time() - t0 < timeout:
        time.sleep(0.05)
    tk.check(not nd.alive(), "node %d still runs after %ss" % (nd.id, timeout))
    return nd.proc.returncode, nd.log()[before:]


def test_fenced_recovery(tierkvd, tierkv):
    c = tk.Cluster(tierkvd, 3, token=True)
    election_s = 2 * c.election_ticks * c.tick_ms / 1000.0
    failed = True
    try:
        c.start()
        c.wait_leader()
        acked = {}
        for i in range(100):
            k, v = "old%03d" % i, "o%d" % i
            tk.check(put(c.http_ports[i % 3], k, v) == 200, "put %s" % k)
            acked[k] = v
        mt.wait_for(lambda: mt.digests_equal(c.nodes), "equal digests before the stop")
        old = {nd.id: c.status(nd)["last_index"] for nd in c.nodes}
        codes = c.stop()
        tk.check(all(v == 0 for v in codes.values()), "exit codes %r" % codes)

        # Node 3 alone, forced: it becomes the only voter and leads.
        n3 = c.node(3)
        plain3 = list(n3.args)
        n3.args = plain3 + ["--force-new-cluster"]
        n3.start()
        t0 = time.time()
        st3 = mt.wait_for(lambda: (lambda s: s if s and s["role"] == "leader" else None)(
            c.status(n3)), "node 3 leading after --force-new-cluster")
        print("     node 3 leads after --force-new-cluster in %.2fs, term %d"
              % (time.time() - t0, st3["term"]))
        term3 = st3["term"]
        for i in range(50):
            k, v = "new%03d" % i, "n%d" % i
            tk.check(put(n3.http_port, k, v) == 200, "put %s to node 3" % k)
            acked[k] = v
        if "a" in SKIP:  # negative controls only (see the end of the file)
            part_b(c, tierkvd, tierkv, n3)
            failed = False
            return

        # The old nodes come back with their data.
        c.node(1).start()
        c.node(2).start()
        t0 = time.time()
        refused_s = None
        i = 50
        # Writes to node 3 go on while 1 and 2 start, dial and are refused;
        # bounded by 30 s (about 40 election timeouts) and by 200 writes
        # after both are refused.
        after = 0
        while time.time() - t0 < 30 and after < 200:
            k, v = "new%03d" % i, "n%d" % i
            i += 1
            st = put(n3.http_port, k, v)
            tk.check(st == 200, "put %s to node 3 with 1 and 2 back: %d" % (k, st))
            acked[k] = v
            s3 = c.status(n3)
            tk.check(s3 and s3["role"] == "leader" and s3["leader"] == 3,
                     "node 3 is no longer the leader: %r" % s3)
            tk.check(s3["term"] == term3,
                     "node 3's term moved from %d to %d: 1 or 2 were heard" % (term3, s3["term"]))
            for j in (1, 2):
                sj = c.status(c.node(j))
                tk.check(sj is None or sj["role"] != "leader",
                         "node %d leads (a second leader): %r" % (j, sj))
            if refused_s is None:
                try:
                    done = all(readyz_code(c.node(j).http_port) == (503, "not_a_member")
                               for j in (1, 2))
                except OSError:
                    done = False
                if done:
                    refused_s = time.time() - t0
            else:
                after += 1
        tk.check(refused_s is not None, "nodes 1 and 2 not refused within 30 s")
        print("     nodes 1 and 2 refused (readyz not_a_member) %.2fs after their start "
              "(%.1f election timeouts); %d writes to node 3 meanwhile, term %d unchanged"
              % (refused_s, refused_s / election_s, i - 50, term3))
        for j in (1, 2):
            # Nothing appended (so nothing applied) since the old cluster stopped.
            sj = c.status(c.node(j))
            tk.check(sj["last_index"] == old[j],
                     "node %d's log grew after the recovery: last_index %d, was %d"
                     % (j, sj["last_index"], old[j]))
            st, _, data = tk.request(c.node(j).http_port, "GET",
                                     "/v1/kv/new000?raw&consistency=stale")
            tk.check(st != 200, "node %d has new000 (%d %r)" % (j, st, data))
            st = put(c.node(j).http_port, "stray%d" % j, "x")
            tk.check(st != 200, "a write through refused node %d answered %d" % (j, st))
        log3 = n3.log()
        for j in (1, 2):
            tk.check("refused node %d: it is not a member of this cluster (dropped by "
                     "--force-new-cluster" % j in log3, "no refusal line for node %d" % j)
            tk.check("refused this node" in c.node(j).log(),
                     "node %d's log does not say it was refused" % j)
        line = [ln for ln in log3.splitlines() if "refused node 1:" in ln][0]
        print("     node 3's log: %s" % line[:160])
        # The line's rate: each stranger's 1st, 2nd, 4th... refusal, so a
        # refused id refused c times has bit_length(c) lines, at most
        # bit_length(all refusals) (two old nodes redialling in turn were
        # named at every redial before: 5 lines each at 12 refusals).
        # Counted once 12 refusals are in (the two alternating, each named at
        # every redial, would have written 12 lines: over the bound of 5).
        deadline = time.time() + 30
        while True:
            log3 = n3.log()  # before the count: the count holds every line read
            st, _, body = tk.request(n3.http_port, "GET", "/metrics")
            refused = [float(ln.split()[-1]) for ln in body.decode().splitlines()
                       if ln.startswith("tierkv_member_refused_total")]
            tk.check(st == 200 and refused, "no tierkv_member_refused_total on node 3")
            if refused[0] >= 12 or time.time() > deadline:
                break
            time.sleep(0.2)
        for j in (1, 2):
            lines = sum(1 for ln in log3.splitlines() if "refused node %d:" % j in ln)
            bound = int(refused[0]).bit_length()
            print("     node 3 refused %d handshakes; %d lines name node %d (at most %d)"
                  % (refused[0], lines, j, bound))
            tk.check(lines <= bound, "%d refusal lines for node %d after %d refusals"
                     % (lines, j, refused[0]))
        st, _, data = tk.request(n3.http_port, "GET",
                                 "/v1/kv/%01tierkv%2Fepoch?raw&consistency=stale")
        tk.check(st == 200 and data == b"1", "epoch record on node 3: %d %r" % (st, data))
        for j in (1, 2):
            rec = mt.record(n3.http_port, j)
            tk.check("removed=1" in rec, "node %d's record on node 3: %r" % (j, rec))
        for k, v in acked.items():
            st, _, data = tk.request(n3.http_port, "GET", "/v1/kv/%s?raw" % k)
            tk.check(st == 200 and data.decode() == v, "%s on node 3: %d %r" % (k, st, data))
        print("     %d acknowledged writes all read back from node 3" % len(acked))
        for j in (1, 2):
            c.node(j).kill()
        part_b(c, tierkvd, tierkv, n3)
        failed = False
    finally:
        if failed:
            for nd in c.nodes:
                sys.stdout.write("--- log of node %d\n" % nd.id)
                sys.stdout.write("\n".join(nd.log().splitlines()[-25:]) + "\n")
        c.stop()


def part_b(c, tierkvd, tierkv, n3):
    # New members join the recovered cluster, the documented way.
    eps3 = ["127.0.0.1:%d" % n3.http_port]
    flag3 = "3=127.0.0.1:%d" % c.raft_ports[2]
    joined = []
    for nid in (4, 5):
        nd = mt.joiner(c, tierkvd, nid, flag3)
        rc, out, err = mt.cli(tierkv, eps3, "member", "add", str(nid), "--raft",
                              "127.0.0.1:%d" % nd.raft_port, "--http",
                              "127.0.0.1:%d" % nd.http_port)
        tk.check(rc == 0, "member add %d: %d %s %s" % (nid, rc, out, err))
        joined.append(nd)
    n4 = joined[0]
    # Item 3b: a joined node names the leader's HTTP address.
    lead_http = "127.0.0.1:%d" % n3.http_port
    if "http" in SKIP:
        return second_force(c, n3, joined)

    def named():
        st, hd, _ = tk.request(n4.http_port, "PUT", "/v1/kv/via4", "x")
        return (st, hd) if hd.get("x-tierkv-leader-addr") == lead_http else None
    st, hd = mt.wait_for(named, "node 4 naming the leader's address", timeout=10)
    print("     a write on node 4: %d, X-Tierkv-Leader %s, X-Tierkv-Leader-Addr %s"
          % (st, hd.get("x-tierkv-leader"), hd.get("x-tierkv-leader-addr")))
    m = mt.members(n4.http_port)
    tk.check(len(m["members"]) == 3 and all(x["http"] for x in m["members"]),
             "member list on node 4: %r" % m["members"])
    print("     member list on node 4: %s" % ", ".join(
        "%d=%s" % (x["id"], x["http"]) for x in m["members"]))
    snap = os.path.join(c.dir, "snap.backup")
    rc, out, err = mt.cli(tierkv, ["127.0.0.1:%d" % n4.http_port], "snapshot", "save",
                          snap)
    tk.check(rc == 0, "snapshot save through node 4: %d %s %s" % (rc, out, err))

    second_force(c, n3, joined)


def second_force(c, n3, joined):
    n4 = joined[0]
    # A second --force-new-cluster: refused, on a joined node and on node 3.
    for nd in (n4, n3):
        tk.check(nd.term() == 0, "node %d's stop" % nd.id)
        plain = list(nd.args)
        nd.args = [a for a in plain if a != "--force-new-cluster"] + \
            ["--force-new-cluster"]
        code, text = start_expecting_exit(nd)
        tk.check(code == 2, "second --force-new-cluster on node %d exited %r"
                 % (nd.id, code))
        tk.check("--force-new-cluster refused" in text and "epoch 1" in text,
                 "no reason in node %d's output: %r" % (nd.id, text[-600:]))
        why = [ln for ln in text.splitlines() if "--force-new-cluster refused" in ln][0]
        print("     node %d, exit %d: %s" % (nd.id, code, why[:150]))
        nd.args = [a for a in plain if a != "--force-new-cluster"]
        nd.start()
        mt.wait_for(lambda: c.status(nd), "node %d back" % nd.id)
    live = [n3] + joined
    lead = mt.wait_for(lambda: (lambda ss: ss[0]["leader"] if all(ss) and
                                len({s["leader"] for s in ss}) == 1 and
                                ss[0]["leader"] in (3, 4, 5) else None)(
        [c.status(nd) for nd in live]), "one leader of {3,4,5}")
    tk.check(put(c.node(lead).http_port, "last", "x") == 200,
             "a write after the refused recoveries")
    mt.wait_for(lambda: mt.digests_equal(live), "equal digests on 3, 4, 5")


# Negative controls, run by hand against a build without the fence:
# FENCED_DR_SKIP=a skips the old nodes' return (to reach the later checks),
# FENCED_DR_SKIP=a,http skips the leader's address check too.
SKIP = os.environ.get("FENCED_DR_SKIP", "").split(",")

if __name__ == "__main__":
    sys.exit(1 if tk.run([test_fenced_recovery], sys.argv[1], sys.argv[2]) else 0)
