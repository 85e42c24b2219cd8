#!/usr/bin/env python3
"""`make run` and Ctrl-C: scripts/run-cluster.sh under a pseudo-terminal.

Starts the script as a terminal would (its own session, the pty as the
controlling terminal, the script in the foreground process group), waits
until it says the cluster is up, then types Ctrl-C (the byte 0x03: the pty's
line discipline sends SIGINT to the whole foreground process group, exactly
as a terminal does). The script must stop the three nodes itself, print one
line saying so, and exit 0: no "node 1 exited", no non-zero status, no node
left running. Ports: a free random base (the script's own check refuses a
taken port; then the test tries another base). Every wait is a bounded poll.

usage: ctrl_c_test.py SCRIPT BUILD_DIR
"""
import os
import pty
import random
import select
import shutil
import signal
import socket
import sys
import tempfile
import time


def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_bases():
    for _ in range(50):
        raft = random.randrange(20000, 40000, 10)
        http = raft + 20000
        if all(free(b + i) for b in (raft, http) for i in (1, 2, 3)):
            return raft, http
    return None


def read_until(fd, pid, want, deadline, out):
    """Reads the pty into `out` until `want` appears (True), EOF (False) or
    the deadline (False)."""
    while time.time() < deadline:
        if want is not None and want in out:
            return True
        r, _, _ = select.select([fd], [], [], 0.2)
        if not r:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the slave side is closed
            return want is None
        if not data:
            return want is None
        out += data
    return False


def main():
    script, build = sys.argv[1], sys.argv[2]
    bases = pick_bases()
    if bases is None:
        print("ctrl-c: no free ports; skipping")
        return 77
    data = tempfile.mkdtemp(prefix="tierkv-ctrlc-")
    env = dict(os.environ, TIERKV_RUN_RAFT_BASE=str(bases[0]),
               TIERKV_RUN_HTTP_BASE=str(bases[1]), TIERKV_RUN_DATA=data)
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe("bash", ["bash", script, build], env)
    out = bytearray()
    try:
        up = read_until(fd, pid, b"Ctrl-C stops the cluster.", time.time() + 60, out)
        if not up:
            print(out.decode(errors="replace"))
            print("ctrl-c: FAIL: the cluster did not come up within 60 s")
            return 1
        os.write(fd, b"\x03")
        t0 = time.time()
        read_until(fd, pid, None, time.time() + 60, out)
        status = None
        deadline = time.time() + 30
        while time.time() < deadline:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            time.sleep(0.05)
        took = time.time() - t0
        text = out.decode(errors="replace")
        print(text)
        if status is None:
            print("ctrl-c: FAIL: the script did not exit within 60 s of Ctrl-C")
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 1
        tail = text.split("Ctrl-C stops the cluster.", 1)[1]
        lines = [l for l in tail.replace("\r", "").split("\n") if l.strip() and l.strip() != "^C"]
        bad = []
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            bad.append("exit status %r, not 0" % (os.waitstatus_to_exitcode(status),))
        if "exited" in tail:
            bad.append("it blames a node")
        if len(lines) != 1 or "stopped" not in lines[0]:
            bad.append("expected one line saying the cluster stopped, got %r" % lines)
        # Every node is gone: its HTTP port accepts no connection.
        for i in (1, 2, 3):
            s = socket.socket()
            s.settimeout(1)
            try:
                s.connect(("127.0.0.1", bases[1] + i))
                bad.append("node %d still listens" % i)
            except OSError:
                pass
            finally:
                s.close()
        # Each node stopped gracefully (tierkvd logs the signal it stopped on).
        for i in (1, 2, 3):
            with open(os.path.join(data, "n%d.log" % i), errors="replace") as f:
                log = f.read()
            if "signal=SIGTERM" not in log:
                bad.append("node %d did not stop on the script's SIGTERM:\n%s" % (i, log[-800:]))
        if bad:
            print("ctrl-c: FAIL: " + "; ".join(bad))
            return 1
        print("ctrl-c: ok: exit 0, one line, all three nodes stopped in %.1f s" % took)
        return 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
