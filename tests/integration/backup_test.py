#!/usr/bin/env python3
"""Backup, restore and disaster recovery (issue 17) against real tierkvd
processes on loopback, following docs/operations.md's commands.

  backup_test.py TIERKVD TIERKV

- save during writes: `tierkv snapshot save` while a writer goes on; every
  write acknowledged before the save began is in the file, and restoring it
  into a fresh three-node cluster (another cluster id) gives exactly the
  writes at or below the file's revision, the same digest on every node, and
  revisions above the file's for new writes;
- a flipped byte and a truncated file are refused (restore and `snapshot
  status`), with the offset and the reason; a non-empty directory is refused;
- a node of the old cluster is refused by the restored one (cluster id);
- two of three nodes lost for good: the survivor restarted with
  --force-new-cluster serves every acknowledged write, and takes new ones;
  two new members added back (tierkv member add) end with its digest.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402
from tkcluster import check  # noqa: E402


class Writer(threading.Thread):
    """One put after another, unique keys; records (key, revision, t_ack)."""

    def __init__(self, cluster, prefix):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.prefix = prefix
        self.acked = []
        self.stop = False
        self.errors = 0

    def run(self):
        i = 0
        while not self.stop:
            key = "%s%07d" % (self.prefix, i)
            for nd in self.cluster.nodes:
                if not nd.alive():
                    continue
                try:
                    st, hd, _ = tk.request(nd.http_port, "PUT", "/v1/kv/" + key, "v%d" % i,
                                           timeout=5)
                except OSError:
                    continue
                if st == 200:
                    self.acked.append((key, int(hd["x-tierkv-revision"]), time.time()))
                    break
            else:
                self.errors += 1
                time.sleep(0.01)
            i += 1


def cli(tierkv, cluster, *args, check_rc=True):
    eps = ",".join("127.0.0.1:%d" % nd.http_port for nd in cluster.nodes)
    p = subprocess.run([tierkv, "--endpoints", eps] + list(args), capture_output=True,
                       text=True, timeout=300)
    if check_rc:
        check(p.returncode == 0, "tierkv %s: exit %d: %s %s" % (
            " ".join(args), p.returncode, p.stdout, p.stderr))
    return p


def scan_keys(port, prefix):
    keys = []
    start = prefix
    while True:
        st, _, js = tk.jreq(port, "GET", "/v1/kv/?start=%s&end=%s~&limit=10000" % (start, prefix))
        check(st == 200, "scan: %d %r" % (st, js))
        items = js.get("kvs") or js.get("items") or []
        keys += [it["key"] for it in items]
        if len(items) < 10000:
            return keys
        start = items[-1]["key"] + "\x00"


def digest(port, timeout=20):
    """(digest, applied); a digest taken while writes go on may answer 503
    state_changing: asked again until it answers."""
    deadline = time.time() + timeout
    while True:
        st, _, js = tk.jreq(port, "GET", "/v1/debug/digest")
        if st == 200:
            return js["digest"], js["applied"]
        check(st == 503 and time.time() < deadline, "digest: %d %r" % (st, js))
        time.sleep(0.05)


def wait_same_digest(cluster, timeout=20):
    deadline = time.time() + timeout
    while True:
        ds = [digest(nd.http_port) for nd in cluster.nodes if nd.alive()]
        if len({d for d, _ in ds}) == 1 and len({a for _, a in ds}) == 1:
            return ds[0][0]
        if time.time() > deadline:
            raise tk.Fail("digests differ: %r" % ds)
        time.sleep(0.05)


def restored_cluster(tierkvd, backup, cluster_id):
    c = tk.Cluster(tierkvd, 3, extra_args=["--cluster-id", str(cluster_id),
                                           "--restore", backup])
    c.start()
    c.wait_leader()
    return c


def test_save_during_writes_and_restore(ctx):
    src = tk.Cluster(ctx["tierkvd"], 3)
    ctx["clusters"].append(src)
    src.start()
    src.wait_leader()
    w = Writer(src, "k")
    w.start()
    while len(w.acked) < 300:
        time.sleep(0.02)
    before = len(w.acked)
    backup = os.path.join(src.dir, "b1.backup")
    t0 = time.time()
    out = cli(ctx["tierkv"], src, "--json", "snapshot", "save", backup).stdout
    save_s = time.time() - t0
    while len(w.acked) < before + 100:  # writes go on after the save
        time.sleep(0.02)
    w.stop = True
    w.join()
    info = json.loads(out)
    rev = info["revision"]
    acked_before = [k for k, _, _ in w.acked[:before]]
    check(all(r <= rev for _, r, _ in w.acked[:before]),
          "a write acknowledged before the save is past its revision %d" % rev)
    st = cli(ctx["tierkv"], src, "--json", "snapshot", "status", backup)
    check(json.loads(st.stdout)["revision"] == rev, "status: %s" % st.stdout)
    print("     saved revision %d, %d keys, %d bytes in %.2fs during writes" % (
        rev, info["keys"], info["bytes"], save_s))
    # --local from a follower: its own applied state, at or past the source's revision.
    lead = src.wait_leader()
    fol = [nd for nd in src.nodes if nd.id != lead][0]
    local = os.path.join(src.dir, "local.backup")
    p = subprocess.run([ctx["tierkv"], "--endpoints", "127.0.0.1:%d" % fol.http_port, "--json",
                        "snapshot", "save", "--local", local], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0, "save --local: %s %s" % (p.stdout, p.stderr))
    check(json.loads(p.stdout)["revision"] >= rev, "a follower's backup went back: %s" % p.stdout)
    # Without --local a follower sends the client to the leader.
    st, hd, _ = tk.request(fol.http_port, "GET", "/v1/snapshot")
    check(st == 503 and hd.get("x-tierkv-leader") == str(lead),
          "a follower answered %d %r without ?local" % (st, hd))
    ctx["backup"] = backup
    ctx["source"] = src

    dst = restored_cluster(ctx["tierkvd"], backup, 2)
    ctx["clusters"].append(dst)
    d = wait_same_digest(dst)
    keys = set(scan_keys(dst.nodes[0].http_port, "k"))
    want = {k for k, r, _ in w.acked if r <= rev}
    check(set(acked_before) <= keys, "acknowledged writes missing after restore: %r" %
          sorted(set(acked_before) - keys)[:5])
    check(keys == want, "restored keys differ from the writes at or below %d: extra %r, "
          "missing %r" % (rev, sorted(keys - want)[:5], sorted(want - keys)[:5]))
    check(info["keys"] == len(keys), "header keys %d, restored %d" % (info["keys"], len(keys)))
    st, hd, _ = tk.request(dst.nodes[0].http_port, "PUT", "/v1/kv/after", "x")
    if st != 200:  # a follower: ask the leader
        lead = dst.node(dst.wait_leader())
        st, hd, _ = tk.request(lead.http_port, "PUT", "/v1/kv/after", "x")
    check(st == 200 and int(hd["x-tierkv-revision"]) > rev,
          "first write after restore: %d revision %s (snapshot %d)" % (
              st, hd.get("x-tierkv-revision"), rev))
    print("     restored 3 nodes: %d keys, digest %s on every node" % (len(keys), d))
    ctx["restored"] = dst


def test_damaged_files_refused(ctx):
    backup = ctx["backup"]
    data = open(backup, "rb").read()
    tmp = os.path.dirname(backup)
    flipped = os.path.join(tmp, "flipped.backup")
    b = bytearray(data)
    b[len(b) // 2] ^= 0x01
    open(flipped, "wb").write(bytes(b))
    cut = os.path.join(tmp, "cut.backup")
    open(cut, "wb").write(data[: len(data) - 1000])
    src = ctx["source"]
    for path, why in ((flipped, "SHA-256 mismatch"), (cut, "ends early")):
        st = cli(ctx["tierkv"], src, "snapshot", "status", path, check_rc=False)
        check(st.returncode == 1 and why in st.stderr and "offset" in st.stderr,
              "status of %s: %d %s" % (path, st.returncode, st.stderr))
        ddir = os.path.join(tmp, "r-" + os.path.basename(path))
        p = subprocess.run([ctx["tierkvd"], "--restore", path, "--data-dir", ddir,
                            "--cluster-id", "9", "--listen-http", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode != 0 and why in p.stderr and "offset" in p.stderr,
              "restore of %s: %d %s" % (path, p.returncode, p.stderr))
        check(os.listdir(ddir) == [], "a refused restore left %r" % os.listdir(ddir))
        print("     %s: %s" % (os.path.basename(path), p.stderr.strip().splitlines()[0]))
    # Onto a non-empty directory.
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    open(os.path.join(full, "keep"), "w").write("x")
    p = subprocess.run([ctx["tierkvd"], "--restore", backup, "--data-dir", full,
                        "--cluster-id", "9", "--listen-http", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "not empty" in p.stderr, "non-empty dir: %s" % p.stderr)
    check(os.listdir(full) == ["keep"], "the non-empty directory changed")
    # The same cluster id as the backup's.
    p = subprocess.run([ctx["tierkvd"], "--restore", backup, "--data-dir",
                        os.path.join(tmp, "same-id"), "--cluster-id", "1",
                        "--listen-http", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "cluster-id" in p.stderr, "same cluster id: %s" % p.stderr)


def test_old_cluster_node_refused(ctx):
    dst = ctx["restored"]
    src = ctx["source"]
    # The restored node 3 goes away, so the old node 3 could take its place.
    dst.node(3).term()
    lead = dst.wait_leader(exclude=(3,))
    term0 = dst.status(dst.node(lead))["term"]
    keys0 = scan_keys(dst.node(lead).http_port, "k")
    # Node 3 of the old cluster, dialing the restored cluster's raft ports.
    old = src.node(3)
    old.term()
    members = ",".join("%d=127.0.0.1:%d" % (i + 1, p) for i, p in enumerate(dst.raft_ports))
    old_port = tk.free_ports(1)[0]
    args = [a for a in old.args]
    args[args.index("--members") + 1] = members
    args[args.index("--listen-http") + 1] = "127.0.0.1:%d" % old_port
    args += ["--listen-raft", "127.0.0.1:%d" % tk.free_ports(1)[0]]
    stranger = tk.Node(ctx["tierkvd"], 3, args, src.dir)
    stranger.http_port = old_port
    stranger.start()
    deadline = time.time() + 10
    refused = False
    while time.time() < deadline and not refused:
        logs = dst.node(1).log() + dst.node(2).log()
        refused = "cluster id mismatch" in logs
        time.sleep(0.1)
    check(refused, "the restored cluster did not refuse the old node (no 'cluster id "
          "mismatch' in its logs)")
    lead = dst.wait_leader(exclude=(3,))
    check(dst.status(dst.node(lead))["term"] == term0, "the old node moved the term")
    for i in (1, 2):
        check(scan_keys(dst.node(i).http_port, "k") == keys0,
              "node %d's keys moved while the old node knocked" % i)
    stranger.kill()


def test_force_new_cluster(ctx):
    c = tk.Cluster(ctx["tierkvd"], 3)
    ctx["clusters"].append(c)
    c.start()
    c.wait_leader()
    w = Writer(c, "f")
    w.start()
    while len(w.acked) < 200:
        time.sleep(0.02)
    w.stop = True
    w.join()
    # Two of three lost for good; pick the survivor by the documented rule.
    lead = c.wait_leader()
    sts = {nd.id: c.status(nd) for nd in c.nodes}
    best = max(sts, key=lambda i: (sts[i]["last_term"], sts[i]["last_index"]))
    for nd in c.nodes:
        nd.kill()
    surv = c.node(best)
    surv.args += ["--force-new-cluster"]
    surv.start()
    deadline = time.time() + 15
    while True:
        s = c.status(surv)
        if s and s["role"] == "leader":
            break
        check(time.time() < deadline, "the survivor did not lead alone: %r" % s)
        time.sleep(0.05)
    keys = set(scan_keys(surv.http_port, "f"))
    missing = [k for k, _, _ in w.acked if k not in keys]
    check(not missing, "acknowledged writes lost: %r" % missing[:5])
    st, _, _ = tk.request(surv.http_port, "PUT", "/v1/kv/after-recovery", "y")
    check(st == 200, "write after recovery: %d" % st)
    # The flag again: nothing to do (already the only voter), still leads.
    surv.term()
    surv.start()
    deadline = time.time() + 15
    while "already the only voter" not in surv.log():
        check(time.time() < deadline, "a second forced start did not see its entry")
        time.sleep(0.05)
    # Without the flag: still a one-node cluster (the entry is in its log).
    surv.term()
    surv.args.remove("--force-new-cluster")
    surv.start()
    deadline = time.time() + 15
    while True:
        s = c.status(surv)
        if s and s["role"] == "leader":
            break
        check(time.time() < deadline, "after restart the survivor does not lead: %r" % s)
        time.sleep(0.05)
    st, _, body = tk.request(surv.http_port, "GET", "/v1/kv/after-recovery?raw")
    check(st == 200 and body == b"y", "after restart: %d %r" % (st, body))
    # docs/operations.md step 3: the others come back as new members (new ids,
    # empty data directories, --join), added through the membership API.
    members_flag = "%d=127.0.0.1:%d" % (best, c.raft_ports[best - 1])
    for new_id in (4, 5):
        rp, hp = tk.free_ports(2)
        nd = tk.Node(ctx["tierkvd"], new_id, [
            "--id", str(new_id), "--join", "--members", members_flag,
            "--listen-raft", "127.0.0.1:%d" % rp, "--listen-http", "127.0.0.1:%d" % hp,
            "--data-dir", os.path.join(c.dir, "n%d" % new_id), "--store", "fs",
            "--kv-no-sync"], c.dir)
        nd.http_port = hp
        c.nodes.append(nd)
        nd.start()
        p = subprocess.run([ctx["tierkv"], "--endpoints", "127.0.0.1:%d" % surv.http_port,
                            "member", "add", str(new_id), "--raft", "127.0.0.1:%d" % rp,
                            "--http", "127.0.0.1:%d" % hp], capture_output=True, text=True,
                           timeout=120)
        check(p.returncode == 0, "member add %d: %s %s" % (new_id, p.stdout, p.stderr))
    back = [surv] + c.nodes[3:]
    deadline = time.time() + 30
    while True:
        ds = {digest(nd.http_port) for nd in back}
        if len(ds) == 1:
            break
        check(time.time() < deadline, "digests after adding members back: %r" % ds)
        time.sleep(0.1)
    keys = set(scan_keys(c.nodes[-1].http_port, "f"))
    check(all(k in keys for k, _, _ in w.acked), "a new member lacks acknowledged writes")
    print("     survivor %d (leader was %d) kept %d acknowledged writes; nodes 4 and 5 "
          "added back, digests equal" % (best, lead, len(w.acked)))


def main():
    ctx = {"tierkvd": sys.argv[1], "tierkv": sys.argv[2], "clusters": []}
    failed = tk.run([test_save_during_writes_and_restore, test_damaged_files_refused,
                     test_old_cluster_node_refused, test_force_new_cluster], ctx)
    for c in ctx["clusters"]:
        for nd in c.nodes:
            if failed and nd.log():
                sys.stdout.write("--- %s node %d (last 20 lines)\n" % (c.dir, nd.id))
                sys.stdout.write("\n".join(nd.log().splitlines()[-20:]) + "\n")
            if nd.alive():
                nd.kill()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
