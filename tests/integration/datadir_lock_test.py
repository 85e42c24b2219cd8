#!/usr/bin/env python3
"""One owner per data directory (issue 54 item 1), against real tierkvd
processes on loopback.

- a second tierkvd on a running node's --data-dir (other ports) exits 2
  within a few seconds, its stderr naming the directory and the first one's
  pid; the first keeps serving (a PUT and a GET through it);
- `tierkvd --restore FILE --data-dir X` exits 2 the same way while X is
  locked: X being the running node's directory, or an empty directory whose
  LOCK another process (this script) holds, which is left as it was; once
  the lock goes, the same restore starts and serves the backup's keys;
- after the first node stops cleanly, a new start on its directory serves
  its data; after that one is killed (SIGKILL: LOCK is left with a dead
  pid), the next start is not blocked and the data is intact.

usage: datadir_lock_test.py path/to/tierkvd
"""
import fcntl
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkcluster as tk  # noqa: E402
from tkcluster import check  # noqa: E402


def wait_serving(nd, timeout=15):
    """Until the node answers /v1/cluster as leader (a one-node cluster)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        check(nd.alive(), "node %d exited: %s" % (nd.id, nd.log()[-600:]))
        try:
            st, _, js = tk.jreq(nd.http_port, "GET", "/v1/cluster", timeout=2)
            if st == 200 and js and js.get("role") == "leader":
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise tk.Fail("node %d not serving within %ss" % (nd.id, timeout))


def put(nd, key, value):
    st, _, body = tk.request(nd.http_port, "PUT", "/v1/kv/" + key, value)
    check(st == 200, "PUT %s: %d %r" % (key, st, body))


def value_of(nd, key):
    st, _, js = tk.jreq(nd.http_port, "GET", "/v1/kv/" + key)
    check(st == 200, "GET %s: %d %r" % (key, st, js))
    return js["value"]


def refused(args, ddir, holder_pid, what, timeout=20):
    """Runs tierkvd with args; it must exit 2 within a few seconds, naming
    the directory and the holder's pid on stderr."""
    t0 = time.time()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise tk.Fail("%s: still running after %ss: it was not refused" % (what, timeout))
    took = time.time() - t0
    check(p.returncode == 2, "%s: exit %d (want 2): %s" % (what, p.returncode,
                                                          p.stderr[-600:]))
    check(took < 10, "%s: took %.1fs to refuse" % (what, took))
    check(ddir in p.stderr, "%s: stderr does not name %s: %s" % (what, ddir, p.stderr))
    want = "in use by process %d" % holder_pid
    check(want in p.stderr, "%s: stderr lacks %r: %s" % (what, want, p.stderr))
    return p.stderr


def node_args(ddir, raft_port, http_port, extra=()):
    return ["--id", "1", "--members", "1=127.0.0.1:%d" % raft_port,
            "--listen-http", "127.0.0.1:%d" % http_port, "--data-dir", ddir,
            "--store", "fs", "--tick-ms", "10", "--election-ticks", "20",
            "--kv-no-sync"] + list(extra)


def main():
    tierkvd = sys.argv[1]
    c = tk.Cluster(tierkvd, 1)
    first = c.node(1)
    ddir = os.path.join(c.dir, "n1")
    first.start()
    failed = 0
    try:
        wait_serving(first)
        put(first, "k", "a")
        print("ok   first node serving on %s (pid %d)" % (ddir, first.proc.pid))

        # A second tierkvd on the same directory, other ports.
        rp, hp = tk.free_ports(2)
        err = refused([tierkvd] + node_args(ddir, rp, hp), ddir, first.proc.pid,
                      "second tierkvd")
        print("ok   second tierkvd refused: %s" % [ln for ln in err.splitlines()
                                                    if "in use" in ln][0][:160])
        check(first.alive(), "the first node died")
        put(first, "k2", "b")
        check(value_of(first, "k") == "a", "k changed on the first node")
        check(value_of(first, "k2") == "b", "k2 not written through the first node")
        print("ok   the first node still serves writes and reads")

        # A backup of it, then --restore onto its (locked) directory.
        st, _, backup = tk.request(first.http_port, "GET", "/v1/snapshot", timeout=30)
        check(st == 200 and len(backup) > 0, "GET /v1/snapshot: %d" % st)
        bfile = os.path.join(c.dir, "k.backup")
        with open(bfile, "wb") as f:
            f.write(backup)
        before = sorted(os.listdir(ddir))
        refused([tierkvd] + node_args(ddir, rp, hp, ["--cluster-id", "9",
                                                     "--restore", bfile]),
                ddir, first.proc.pid, "--restore onto the running node's directory")
        check(sorted(os.listdir(ddir)) == before, "the refused restore changed %s" % ddir)

        # --restore onto an empty directory whose LOCK another process holds.
        edir = os.path.join(c.dir, "empty")
        os.makedirs(edir)
        lock = os.open(os.path.join(edir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(lock, b"%d\n" % os.getpid())
        rargs = [tierkvd] + node_args(edir, rp, hp, ["--cluster-id", "9",
                                                     "--restore", bfile])
        refused(rargs, edir, os.getpid(), "--restore onto a locked empty directory")
        check(os.listdir(edir) == ["LOCK"], "the refused restore left %r" %
              os.listdir(edir))
        os.close(lock)  # released: the same restore now goes through
        restored = tk.Node(tierkvd, 2, rargs[1:], c.dir)  # node 1, logged in n2.log
        restored.http_port = hp
        restored.start()
        wait_serving(restored)
        check(value_of(restored, "k") == "a" and value_of(restored, "k2") == "b",
              "the restored node lacks the backup's keys")
        check(restored.term() == 0, "the restored node did not stop cleanly")
        print("ok   --restore refused on both locked directories, then restored once "
              "the lock went")

        # The first stops cleanly: a new start on its directory works.
        check(first.term() == 0, "the first node did not stop cleanly")
        first.start()
        wait_serving(first)
        check(value_of(first, "k") == "a" and value_of(first, "k2") == "b",
              "data lost across the restart")
        print("ok   restarted on the directory after a clean stop; data intact")

        # Killed: LOCK keeps a dead pid, which blocks nothing.
        dead = first.proc.pid
        first.kill()
        with open(os.path.join(ddir, "LOCK")) as f:
            check(f.read() == "%d\n" % dead, "LOCK does not hold the killed pid")
        first.start()
        wait_serving(first)
        check(value_of(first, "k") == "a" and value_of(first, "k2") == "b",
              "data lost across the kill")
        check(first.term() == 0, "the node did not stop cleanly")
        print("ok   a LOCK left by a killed node (pid %d) did not block the next start"
              % dead)
    except Exception as e:  # report with the node's log
        failed = 1
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
    tk.finish(c, failed)


if __name__ == "__main__":
    main()
