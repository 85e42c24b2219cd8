#!/usr/bin/env python3
"""etcd's v3 API on tierkvd (--listen-client) with etcd's own command-line
client: Debian's etcdctl 3.4 (package etcd-client, scripts/deps.sh) against a
3-node cluster, ETCDCTL_API=3. Every command's output is checked, not only its
exit code: put, get (plain, --prefix, --print-value-only, -w json with its
revisions), del, txn from stdin (both branches), member list, endpoint
status/health/hashkv, alarm list, defrag, compaction, lease
grant/timetolive/revoke, move-leader, etcd's membership errors, and a 4th
node added as a learner, started with --join, promoted and removed.

Both etcdctl 3.4 and 3.6 save a snapshot (Maintenance.Snapshot): the file is
the node's backup file, compared with GET /v1/snapshot?local, then zero
padding, and the saved file restores a new node that serves the keys.

    etcdctl_test.py TIERKVD [--etcdctl PATH] [--snapcheck PATH] [--against-http]

--etcdctl: another etcdctl than the one on PATH (etcdctl36.sh passes v3.6.16,
built from the module proxy): with 3.6 the checks branch on its output forms,
and watch --rev through a follower across a leader kill, lease keep-alive,
get's sorts and --rev run too. --snapcheck: the Snapshot stream's bounds
through grpc-go (tests/etcd/etcdctl36/snapcheck). --against-http is the
known-bad control (registered should_fail): etcdctl is pointed at the nodes'
HTTP/1.1 ports, which are no etcd server, and the same checks must fail.
Exit 77 (skip) when etcdctl is not installed.
"""
import base64
import hashlib
import json
import os
import queue
import re
import shutil
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import tkcluster as tk  # noqa: E402

ETCDCTL = shutil.which("etcdctl")
V36 = False  # etcdctl 3.6 (--etcdctl): its own output forms, and more checks


def ctl(endpoints, *args, stdin=None, ok=True):
    """etcdctl's stdout; with ok=False, (exit code, stdout + stderr)."""
    env = dict(os.environ, ETCDCTL_API="3")
    r = subprocess.run([ETCDCTL, "--endpoints=" + ",".join(endpoints),
                        "--dial-timeout=3s", "--command-timeout=10s"] + list(args),
                       input=stdin, capture_output=True, text=True, timeout=60, env=env)
    if not ok:
        return r.returncode, r.stdout + r.stderr
    tk.check(r.returncode == 0, "etcdctl %s: exit %d: %s%s" % (
        " ".join(args), r.returncode, r.stdout, r.stderr))
    return r.stdout


def until(fn, what, timeout=30):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise tk.Fail("timed out waiting for " + what)
        time.sleep(0.1)


def kv_checks(eps, lep):
    tk.check(ctl(eps, "put", "/a/1", "one") == "OK\n", "put: not OK")
    ctl(eps, "put", "/a/2", "two")
    ctl(eps, "put", "/b", "bee")
    out = ctl(eps, "get", "/a/1")
    tk.check(out == "/a/1\none\n", "get: %r" % out)
    out = ctl(eps, "get", "--prefix", "/a/")
    tk.check(out == "/a/1\none\n/a/2\ntwo\n", "get --prefix: %r" % out)
    out = ctl(eps, "get", "/b", "--print-value-only")
    tk.check(out == "bee\n", "get --print-value-only: %r" % out)
    ctl(eps, "put", "/a/1", "uno")
    js = json.loads(ctl(eps, "get", "/a/1", "-w", "json"))
    h, kv = js["header"], js["kvs"][0]
    tk.check(base64.b64decode(kv["key"]) == b"/a/1" and
             base64.b64decode(kv["value"]) == b"uno", "get -w json: %r" % js)
    tk.check(kv["version"] == 2 and 0 < kv["create_revision"] < kv["mod_revision"] <=
             h["revision"], "get -w json: revisions %r" % js)
    tk.check(h["member_id"] in (1, 2, 3) and h["raft_term"] >= 1 and h["cluster_id"] != 0,
             "get -w json: header %r" % h)
    out = ctl(eps, "del", "/a/2")
    tk.check(out == "1\n", "del: %r" % out)
    tk.check(ctl(eps, "get", "/a/2") == "", "a deleted key is still there")
    tk.check(ctl(eps, "del", "--prefix", "/a/") == "1\n", "del --prefix")
    # txn from stdin: compares, blank line, success ops, blank, failure ops
    ctl(eps, "put", "t", "x")
    txn = 'value("t") = "x"\n\nput t-ok yes\n\nput t-ok no\n\n'
    out = ctl(eps, "txn", stdin=txn)
    tk.check(out.startswith("SUCCESS\n") and "OK" in out, "txn success: %r" % out)
    tk.check(ctl(eps, "get", "t-ok", "--print-value-only") == "yes\n", "txn: success op")
    txn = 'version("t") = "5"\n\nput t-ok yes2\n\nput t-ok no\n\n'
    out = ctl(eps, "txn", stdin=txn)
    tk.check(out.startswith("FAILURE\n") and "OK" in out, "txn failure: %r" % out)
    tk.check(ctl(eps, "get", "t-ok", "--print-value-only") == "no\n", "txn: failure op")
    # compaction: a no-op up to the newest revision, a future one refused
    rev = json.loads(ctl(eps, "get", "t", "-w", "json"))["header"]["revision"]
    out = ctl(eps, "compaction", str(rev))
    tk.check(out == "compacted revision %d\n" % rev, "compaction: %r" % out)
    rc, out = ctl(eps, "compaction", str(rev + 1000000), ok=False)
    tk.check(rc != 0 and "required revision is a future revision" in out,
             "compaction of a future revision: %d %r" % (rc, out))
    rc, out = ctl(eps, "get", "t", "--rev", str(rev - 1), ok=False)
    tk.check(rc != 0 and "required revision has been compacted" in out,
             "an old revision: %d %r" % (rc, out))


def lease_checks(eps):
    out = ctl(eps, "lease", "grant", "100")
    m = re.match(r"^lease ([0-9a-f]+) granted with TTL\(100s\)\n$", out)
    tk.check(m, "lease grant: %r" % out)
    lid = m.group(1)
    ctl(eps, "put", "--lease=" + lid, "leased", "v")
    out = ctl(eps, "lease", "timetolive", lid, "--keys")
    m = re.match(r"^lease %s granted with TTL\(100s\), remaining\((\d+)s\), "
                 r"attached keys\(\[leased\]\)\n$" % lid, out)
    tk.check(m and 90 <= int(m.group(1)) <= 100, "lease timetolive: %r" % out)
    out = ctl(eps, "lease", "revoke", lid)
    tk.check(out == "lease %s revoked\n" % lid, "lease revoke: %r" % out)
    tk.check(ctl(eps, "get", "leased") == "", "a revoked lease's key is still there")
    out = ctl(eps, "lease", "timetolive", lid)
    tk.check(out == "lease %s already expired\n" % lid, "timetolive after revoke: %r" % out)


def endpoint_checks(cluster, eps, leader):
    st = json.loads(ctl(eps, "endpoint", "status", "-w", "json"))
    tk.check(len(st) == 3, "endpoint status: %r" % st)
    for s in st:
        tk.check(s["Status"]["leader"] == leader and s["Status"]["version"] == "3.6.0" and
                 s["Status"]["raftIndex"] >= 1 and s["Status"]["dbSize"] >= 0,
                 "endpoint status: %r" % s)
    hs = json.loads(ctl(eps, "endpoint", "health", "-w", "json"))
    tk.check(sorted(h["endpoint"] for h in hs) == sorted(eps) and
             all(h["health"] is True and not h.get("error") for h in hs),
             "endpoint health: %r" % hs)
    tk.check(ctl(eps, "alarm", "list") == "", "alarm list: not empty")
    out = ctl(eps[:1], "defrag")
    tk.check(out.startswith("Finished defragmenting etcd member[%s]" % eps[0]),
             "defrag: %r" % out)
    # the replicas' hashes agree once they applied the same entries
    def same_hash():
        hs = json.loads(ctl(eps, "endpoint", "hashkv", "-w", "json"))
        vals = {(h["HashKV"]["hash"], h["HashKV"]["header"]["revision"]) for h in hs}
        return len(hs) == 3 and len(vals) == 1 and hs
    hs = until(same_hash, "equal hashes on the 3 members")
    rc, out = ctl(eps[:1], "endpoint", "hashkv", "--rev", "1", ok=False)
    tk.check(rc != 0 and "required revision has been compacted" in out,
             "hashkv at an old revision: %r" % out)
    tk.check(hs[0]["HashKV"]["hash"] != 0, "hashkv: %r" % hs)


def member_list(ep):
    return json.loads(ctl([ep], "member", "list", "-w", "json"))["members"]


def joiner(cluster, tierkvd, nid, rp, hp, cp):
    """A new node, --join, with the three bootstrap voters as --members."""
    members = ",".join("%d=127.0.0.1:%d" % (i + 1, p) for i, p in
                       enumerate(cluster.raft_ports))
    args = ["--id", str(nid), "--join", "--members", members,
            "--listen-raft", "127.0.0.1:%d" % rp, "--listen-http", "127.0.0.1:%d" % hp,
            "--listen-client", "127.0.0.1:%d" % cp,
            "--data-dir", os.path.join(cluster.dir, "n%d" % nid), "--store", "fs",
            "--tick-ms", str(cluster.tick_ms), "--election-ticks",
            str(cluster.election_ticks), "--kv-no-sync"]
    nd = tk.Node(tierkvd, nid, args, cluster.dir)
    nd.http_port = hp
    nd.start()
    cluster.nodes.append(nd)
    return nd


def member_checks(cluster, eps, leader, tierkvd):
    lep = eps[leader - 1]
    ms = member_list(eps[0])
    tk.check(sorted(m["ID"] for m in ms) == [1, 2, 3], "member list: %r" % ms)
    for m in ms:
        want = "http://127.0.0.1:%d" % cluster.raft_ports[m["ID"] - 1]
        tk.check(m["peerURLs"] == [want] and not m.get("isLearner"),
                 "member list: %r" % m)
    # Each node announces its own client URL once it has a leader
    # (etcdapi__announce, every second until its record matches).
    until(lambda: all(m.get("clientURLs") == ["http://" + eps[m["ID"] - 1]]
                      for m in member_list(eps[0])), "every member's clientURLs", 15)
    out = ctl([eps[0]], "member", "list")
    tk.check(re.search(r"^1, started, 1, http://127\.0\.0\.1:%d, http://%s, false$" %
                       (cluster.raft_ports[0], re.escape(eps[0])), out, re.M),
             "member list (table): %r" % out)
    # etcd's errors
    rc, out = ctl([lep], "member", "remove", "dead", ok=False)
    tk.check(rc != 0 and "etcdserver: member not found" in out, "remove: %r" % out)
    rc, out = ctl([lep], "member", "promote", "%x" % leader, ok=False)
    tk.check(rc != 0 and "etcdserver: can only promote a learner member" in out,
             "promote a voter: %r" % out)
    rc, out = ctl([lep], "member", "add", "dup", "--peer-urls=http://127.0.0.1:%d"
                  % cluster.raft_ports[0], ok=False)
    tk.check(rc != 0 and "etcdserver: Peer URLs already exists" in out, "dup add: %r" % out)
    rc, out = ctl([lep], "member", "add", "two", "--peer-urls=http://127.0.0.1:1,"
                  "http://127.0.0.1:2", ok=False)
    tk.check(rc != 0 and "etcdserver: given member URLs are invalid" in out,
             "two peer URLs: %r" % out)
    fep = eps[[i for i in (1, 2, 3) if i != leader][0] - 1]
    rc, out = ctl([fep], "member", "add", "f", "--peer-urls=http://127.0.0.1:1", ok=False)
    tk.check(rc != 0 and "etcdserver: not leader" in out, "add on a follower: %r" % out)
    own = "http://127.0.0.1:%d" % cluster.raft_ports[leader - 1]
    out = ctl([lep], "member", "update", "%x" % leader, "--peer-urls=" + own)
    tk.check(re.match(r"^Member\s+%x updated in cluster" % leader, out), "update: %r" % out)
    rc, out = ctl([lep], "member", "update", "%x" % leader,
                  "--peer-urls=http://127.0.0.1:1", ok=False)
    tk.check(rc != 0 and "Raft address cannot change" in out, "update elsewhere: %r" % out)
    rc, out = ctl([lep], "member", "update", "dead", "--peer-urls=" + own, ok=False)
    tk.check(rc != 0 and "etcdserver: member not found" in out, "update unknown: %r" % out)
    # a 4th node: added as a learner, started with --join, promoted, removed
    rp, hp, cp = tk.low_ports(3)
    out = ctl([lep], "member", "add", "n4", "--learner",
              "--peer-urls=http://127.0.0.1:%d" % rp)
    # etcdctl 3.6 says "added as learner to cluster", 3.4 "added to cluster"
    m = re.match(r"^Member\s+([0-9a-f]+) added %sto cluster\s+[0-9a-f]+\n" %
                 ("as learner " if V36 else ""), out)
    tk.check(m, "member add: %r" % out)
    nid = int(m.group(1), 16)
    tk.check(nid > 3, "member add: id %d" % nid)
    nd = joiner(cluster, tierkvd, nid, rp, hp, cp)
    ms = member_list(lep)
    tk.check(any(x["ID"] == nid and x.get("isLearner") for x in ms), "learner: %r" % ms)

    def promoted():
        rc, out = ctl([lep], "member", "promote", "%x" % nid, ok=False)
        if rc == 0:
            return out
        tk.check("which is in sync with leader" in out, "promote: %r" % out)
        return None
    out = until(promoted, "the learner's promotion", timeout=60)
    tk.check(re.match(r"^Member\s+%x promoted in cluster" % nid, out), "promote: %r" % out)
    ms = member_list(lep)
    tk.check(len(ms) == 4 and not any(x.get("isLearner") for x in ms), "4 voters: %r" % ms)
    until(lambda: ctl(["127.0.0.1:%d" % cp], "get", "/b", "--print-value-only") == "bee\n",
          "the new member serving reads")
    out = ctl([lep], "member", "remove", "%x" % nid)
    tk.check(re.match(r"^Member\s+%x removed from cluster" % nid, out), "remove: %r" % out)
    ms = member_list(lep)
    tk.check(sorted(x["ID"] for x in ms) == [1, 2, 3], "after remove: %r" % ms)
    nd.kill()
    cluster.nodes.remove(nd)
    # etcd's order for a voter: add (answered once the learner is in the
    # committed configuration), then start the node; the node promotes it
    rp, hp, cp = tk.low_ports(3)
    out = ctl([lep], "member", "add", "n5", "--peer-urls=http://127.0.0.1:%d" % rp)
    # tierkv answers a voter's add with isLearner true (what the member is
    # until the node promotes it), which etcdctl 3.6 prints
    m = re.match(r"^Member\s+([0-9a-f]+) added %sto cluster\s+[0-9a-f]+\n" %
                 ("as learner " if V36 else ""), out)
    tk.check(m, "member add (voter): %r" % out)
    vid = int(m.group(1), 16)
    tk.check(vid > nid, "member add: id %d after %d" % (vid, nid))
    nd = joiner(cluster, tierkvd, vid, rp, hp, cp)
    until(lambda: any(x["ID"] == vid and not x.get("isLearner") for x in member_list(lep)),
          "the added voter's promotion", timeout=60)
    out = until(lambda: ctl([lep], "member", "remove", "%x" % vid, ok=False)[0] == 0,
                "the voter's removal (after the promotion's change)")
    ms = member_list(lep)
    tk.check(sorted(x["ID"] for x in ms) == [1, 2, 3], "after remove: %r" % ms)
    nd.kill()
    cluster.nodes.remove(nd)


class Lines:
    """A long-running etcdctl (watch, lease keep-alive): its stdout lines,
    read by a thread; its stderr in a file of the cluster's directory."""

    def __init__(self, cluster, name, endpoints, *args):
        self.err = os.path.join(cluster.dir, "etcdctl-%s.err" % name)
        with open(self.err, "wb") as ef:
            self.p = subprocess.Popen(
                [ETCDCTL, "--endpoints=" + ",".join(endpoints), "--dial-timeout=3s"] +
                list(args), stdout=subprocess.PIPE, stderr=ef, text=True,
                env=dict(os.environ, ETCDCTL_API="3"))
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def take(self, n, timeout):
        out, deadline = [], time.time() + timeout
        while len(out) < n:
            try:
                line = self.q.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                raise tk.Fail("%d of %d lines within %ds: %r" % (len(out), n, timeout, out))
            if line is None:
                raise tk.Fail("etcdctl ended after %r: %s" % (out, open(self.err).read()))
            out.append(line)
        return out

    def stop(self):
        self.p.kill()
        self.p.wait(timeout=10)


def watch_checks(cluster, eps, leader):
    """A watch from a revision through a follower's endpoint: the history,
    then puts made after it started, then more after the leader is killed
    (the follower's connection stays): every put once, in order."""
    fol = [i for i in (1, 2, 3) if i != leader][0]
    js = json.loads(ctl([eps[leader - 1]], "put", "/w/0", "v0", "-w", "json"))
    rev0 = js["header"]["revision"]
    ctl([eps[leader - 1]], "put", "/w/1", "v1")
    w = Lines(cluster, "watch", [eps[fol - 1]], "watch", "--prefix", "/w/", "--rev",
              str(rev0))
    try:
        def want(lo, hi):
            return [x for i in range(lo, hi) for x in ("PUT", "/w/%d" % i, "v%d" % i)]
        got = w.take(6, 20)
        tk.check(got == want(0, 2), "watch --rev %d: the history %r" % (rev0, got))
        for i in range(2, 6):
            ctl([eps[leader - 1]], "put", "/w/%d" % i, "v%d" % i)
        got = w.take(12, 20)
        tk.check(got == want(2, 6), "watch: puts after its start %r" % got)
        cluster.node(leader).kill()
        new = cluster.wait_leader(timeout=30, exclude=(leader,))
        for i in range(6, 12):
            ctl([eps[new - 1]], "put", "/w/%d" % i, "v%d" % i)
        got = w.take(18, 30)
        tk.check(got == want(6, 12), "watch across the leader's kill: %r" % got)
        # a last put: the next event seen is its own (no duplicate before it)
        ctl([eps[new - 1]], "put", "/w/end", "end")
        got = w.take(3, 20)
        tk.check(got == ["PUT", "/w/end", "end"], "watch: a duplicate or stray event %r" % got)
    finally:
        w.stop()
    cluster.node(leader).start()
    return cluster.wait_leader(timeout=30)


def keepalive_checks(cluster, eps):
    """lease keep-alive keeps a lease of TTL 2 s alive past its TTL; without
    it the lease expires."""
    out = ctl(eps, "lease", "grant", "2")
    m = re.match(r"^lease ([0-9a-f]+) granted with TTL\(2s\)\n$", out)
    tk.check(m, "lease grant: %r" % out)
    lid = m.group(1)
    out = ctl(eps, "lease", "keep-alive", "--once", lid)
    tk.check(out == "lease %s keepalived with TTL(2)\n" % lid, "keep-alive --once: %r" % out)
    t0 = time.time()
    ka = Lines(cluster, "keepalive", eps, "lease", "keep-alive", lid)
    try:
        got = ka.take(5, 20)
        tk.check(all(x == "lease %s keepalived with TTL(2)" % lid for x in got),
                 "lease keep-alive: %r" % got)
        while time.time() < t0 + 4:  # twice the TTL
            ka.take(1, 5)
        out = ctl(eps, "lease", "timetolive", lid)
        m = re.match(r"^lease %s granted with TTL\(2s\), remaining\((\d+)s\)\n$" % lid, out)
        tk.check(m and int(m.group(1)) >= 1, "kept alive past its TTL: %r" % out)
    finally:
        ka.stop()
    until(lambda: ctl(eps, "lease", "timetolive", lid) == "lease %s already expired\n" % lid,
          "the lease's expiry without keep-alives", timeout=20)


def get_sort_checks(eps):
    """get's --sort-by/--order forms that tierkv serves, --rev at the newest
    revision, and a sort it does not serve refused."""
    for k in ("/s/b", "/s/a", "/s/c"):
        ctl(eps, "put", k, k[-1])
    ctl(eps, "put", "/s/a", "A2")  # a: created second, modified last
    def keys(*args):
        return ctl(eps, "get", "--prefix", "/s/", "--keys-only", *args).split()
    tk.check(keys("--sort-by=KEY", "--order=ASCEND") == ["/s/a", "/s/b", "/s/c"],
             "get --sort-by=KEY --order=ASCEND")
    for target, order, want in (("CREATE", "DESCEND", "/s/c"), ("CREATE", "ASCEND", "/s/b"),
                                ("MODIFY", "DESCEND", "/s/a"), ("MODIFY", "ASCEND", "/s/b")):
        got = keys("--sort-by=" + target, "--order=" + order, "--limit=1")
        tk.check(got == [want], "get --sort-by=%s --order=%s --limit=1: %r" % (
            target, order, got))
    got = keys("--sort-by=VALUE", "--order=ASCEND")  # "A2" < "b" < "c"
    tk.check(got == ["/s/a", "/s/b", "/s/c"], "get --sort-by=VALUE --order=ASCEND: %r" % got)
    got = keys("--sort-by=VALUE", "--order=DESCEND", "--limit=2")
    tk.check(got == ["/s/c", "/s/b"], "get --sort-by=VALUE --order=DESCEND --limit=2: %r" % got)
    rev = json.loads(ctl(eps, "get", "/s/a", "-w", "json"))["header"]["revision"]
    out = ctl(eps, "get", "/s/a", "--rev", str(rev))
    tk.check(out == "/s/a\nA2\n", "get --rev %d (the newest): %r" % (rev, out))


def snapshot_checks(cluster, eps, binary):
    """snapshot save from node 1: the node's backup file (what GET
    /v1/snapshot?local gives, the creation time aside), zero bytes after it
    to a size of 32 mod 512 (etcdctl 3.6's check); the saved file then
    restores a node that serves the keys."""
    ctl(eps, "put", "snapkey", "snapvalue")
    until(lambda: ctl(eps[:1], "get", "snapkey", "--consistency=s",
                      "--print-value-only") == "snapvalue\n", "node 1 applying snapkey")
    path = os.path.join(cluster.dir, "etcdctl.db")
    out = ctl(eps[:1], "snapshot", "save", path)
    tk.check(out.startswith("Snapshot saved at %s\n" % path) and
             (not V36 or "Server version 3.6.0\n" in out), "snapshot save: %r" % out)
    data = open(path, "rb").read()
    st, _, http = tk.request(cluster.nodes[0].http_port, "GET", "/v1/snapshot?local",
                             timeout=60)
    tk.check(st == 200, "GET /v1/snapshot?local: %d" % st)
    tk.check(len(data) % 512 == 32 and data[:8] == b"TKVBACK1",
             "the saved file: %d bytes, %r" % (len(data), data[:8]))
    n = 64 + struct.unpack_from("<Q", data, 48)[0] + 32
    tk.check(n <= len(data) < n + 512 and data[n:] == bytes(len(data) - n),
             "after the backup (%d bytes): %d bytes, not all zero" % (n, len(data) - n))
    tk.check(hashlib.sha256(data[:n - 32]).digest() == data[n - 32:n],
             "the saved backup's SHA-256 trailer")
    bad = bytearray(data[:n])  # the check's own control: one flipped byte fails it
    bad[n // 2] ^= 1
    tk.check(hashlib.sha256(bad[:n - 32]).digest() != bad[n - 32:n], "SHA-256 control")
    # the same revision, keys and stream as the HTTP API's; only the
    # creation time (bytes 56-63, whole seconds) and so the SHA-256 may differ
    tk.check(len(http) == n and data[:56] == http[:56] and data[64:n - 32] == http[64:-32],
             "the saved backup differs from GET /v1/snapshot?local (%d, %d bytes)" % (
                 n, len(http)))
    if data[56:64] == http[56:64]:
        tk.check(data[:n] == http, "same creation time, different bytes")
    # the saved file itself, padding and all (kv/backup.c takes up to 511
    # zero bytes after the trailer when they make the size 32 mod 512)
    r = tk.Cluster(binary, 1, extra_args=["--cluster-id", "77", "--restore", path])
    r.start()
    try:
        r.wait_leader(timeout=30)
        st, _, body = tk.request(r.nodes[0].http_port, "GET", "/v1/kv/snapkey")
        tk.check(st == 200 and json.loads(body)["value"] == "snapvalue",
                 "the restored node: %d %r" % (st, body))
    finally:
        codes = r.stop()
    tk.check(codes == {1: 0}, "the restored node's exit: %r" % codes)
    print("     saved %d bytes (backup %d, %d of padding), restored" % (
        len(data), n, len(data) - n), flush=True)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))


def snapshot_bounds_checks(cluster, eps, snapcheck):
    """snapcheck (tests/etcd/etcdctl36/snapcheck, grpc-go) against node 1:
    two unread Snapshot streams, a third refused, one whose client leaves
    gives its slot back, one never read is cut; node 1 stays healthy and its
    RSS grows by less than --rss-growth-max-mib (256 MiB by default)."""
    nd = cluster.nodes[0]
    rss0 = rss_kib(nd.proc.pid)
    r = subprocess.run([snapcheck, eps[0]], capture_output=True, text=True, timeout=120)
    sys.stdout.write("".join("     " + x + "\n" for x in r.stdout.splitlines()))
    tk.check(r.returncode == 0, "snapcheck: exit %d: %s" % (r.returncode, r.stderr[-2000:]))
    st, _, _ = tk.request(nd.http_port, "GET", "/healthz")
    grew = rss_kib(nd.proc.pid) - rss0
    bound = 256
    if "--rss-growth-max-mib" in sys.argv:
        bound = int(sys.argv[sys.argv.index("--rss-growth-max-mib") + 1])
    tk.check(st == 200 and grew < bound * 1024, "node 1: healthz %d, RSS grew %d KiB "
             "(bound %d MiB)" % (st, grew, bound))
    print("     node 1 healthy, its RSS grew %d MiB" % (grew // 1024), flush=True)


def move_leader_checks(cluster, eps, leader):
    to = 1 if leader != 1 else 2
    rc, out = ctl(eps, "move-leader", "dead", ok=False)
    tk.check(rc != 0 and "etcdserver: bad leader transferee" in out,
             "move-leader to a non-member: %r" % out)
    out = ctl(eps, "move-leader", "%x" % to)
    tk.check(re.match(r"^Leadership transferred from\s+%x to\s+%x" % (leader, to), out),
             "move-leader: %r" % out)
    # answered once the target leads, as etcd's: the old leader already knows
    st = json.loads(ctl([eps[leader - 1]], "endpoint", "status", "-w", "json"))
    tk.check(st[0]["Status"]["leader"] == to, "after move-leader: %r" % st)
    tk.check(cluster.wait_leader(timeout=20) == to, "the leader did not move")
    return to


def main():
    global ETCDCTL, V36
    if "--etcdctl" in sys.argv:
        ETCDCTL = sys.argv[sys.argv.index("--etcdctl") + 1]
    if ETCDCTL is None:
        print("etcdctl is not installed (apt-get install etcd-client): skipped")
        sys.exit(77)
    ver = subprocess.run([ETCDCTL, "version"], capture_output=True, text=True,
                         timeout=30, env=dict(os.environ, ETCDCTL_API="3")).stdout
    m = re.search(r"etcdctl version: (\d+)\.(\d+)\.", ver)
    tk.check(m, "etcdctl version: %r" % ver)
    V36 = (int(m.group(1)), int(m.group(2))) >= (3, 6)
    print("etcdctl %s" % ver.splitlines()[0].split()[-1], flush=True)
    binary = sys.argv[1]
    cluster = tk.Cluster(binary, n=3, election_ticks=100)
    cports = tk.low_ports(3)
    for nd, p in zip(cluster.nodes, cports):
        nd.args += ["--listen-client", "127.0.0.1:%d" % p]
    cluster.start()
    failed = 0
    try:
        leader = cluster.wait_leader(timeout=20)
        eps = ["127.0.0.1:%d" % p for p in cports]
        if "--against-http" in sys.argv:
            eps = ["127.0.0.1:%d" % nd.http_port for nd in cluster.nodes]
        tests = [("kv", lambda: kv_checks(eps, eps[leader - 1])),
                 ("lease", lambda: lease_checks(eps)),
                 ("endpoint", lambda: endpoint_checks(cluster, eps, leader)),
                 ("member", lambda: member_checks(cluster, eps, leader, binary)),
                 ("snapshot", lambda: snapshot_checks(cluster, eps, binary))]
        if "--snapcheck" in sys.argv:
            snapcheck = sys.argv[sys.argv.index("--snapcheck") + 1]
            tests += [("snap-bound", lambda: snapshot_bounds_checks(cluster, eps, snapcheck))]
        if V36:
            tests += [("get-sort", lambda: get_sort_checks(eps)),
                      ("keep-alive", lambda: keepalive_checks(cluster, eps))]
        for name, fn in tests:
            t0 = time.time()
            fn()
            print("ok   %-10s %.2fs" % (name, time.time() - t0), flush=True)
        if V36:
            t0 = time.time()
            leader = watch_checks(cluster, eps, leader)
            print("ok   %-10s %.2fs" % ("watch", time.time() - t0), flush=True)
        leader = move_leader_checks(cluster, eps, leader)
        print("ok   move-leader (now %d)" % leader, flush=True)
        # a voter added whose node never starts: its promotion still pending
        # in the leader when the cluster stops
        out = ctl([eps[leader - 1]], "member", "add", "n6",
                  "--peer-urls=http://127.0.0.1:%d" % tk.low_ports(1)[0])
        tk.check(re.match(r"^Member\s+[0-9a-f]+ added %sto cluster" %
                         ("as learner " if V36 else ""), out), "add: %r" % out)
        tk.check_graceful_stop(cluster)
        print("ok   every node stopped cleanly", flush=True)
    except Exception as e:  # report, then the logs
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    tk.finish(cluster, failed)


if __name__ == "__main__":
    main()
