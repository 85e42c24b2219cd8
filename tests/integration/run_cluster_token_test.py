#!/usr/bin/env python3
"""`make run` is authenticated: scripts/run-cluster.sh's cluster token.

Starts the script (TIERKV_RUN_DATA in a temporary directory, ports below
32768) and, once it says the cluster is up, checks:
  1. DATA/peer-token exists: a regular file of 64 hex digits, mode 0600;
  2. each of the three nodes (found in /proc by its --data-dir) runs with
     --peer-token-file naming that file;
  3. the script printed one line saying where the token is;
  4. strangers on a node's raft port do not become peers: raw garbage is
     closed by the node (tierkv_transport_bad_connections_total rises), and a
     tierkvd without the token claiming a member's id is refused
     (tierkv_transport_auth_failures_total rises); the leader and its term
     stay;
then stops it (SIGINT, as Ctrl-C), loosens the token to 0644 and starts
again: the same token is reused and made 0600 again. The checkers first
reject known-bad cases (a 0644 file, a short token, a command line without
the flag or naming another file, no line about the token). Every wait is a
bounded poll.

usage: run_cluster_token_test.py SCRIPT BUILD_DIR
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request


class Fail(Exception):
    pass


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
    """Raft base in [20000, 26000), HTTP base 6000 above: all below 32768.
    Port +4 is for the impostor's raft port."""
    for _ in range(50):
        raft = random.randrange(20000, 26000, 10)
        http = raft + 6000
        if all(free(b + i) for b in (raft, http) for i in (1, 2, 3, 4)):
            return raft, http
    return None


def check_token_file(path):
    """The token file: regular, mode 0600, 64 hex digits. Returns the token."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise Fail("no token file: %s" % e)
    if not stat.S_ISREG(st.st_mode):
        raise Fail("%s is not a regular file" % path)
    if stat.S_IMODE(st.st_mode) != 0o600:
        raise Fail("%s is mode %o, not 0600" % (path, stat.S_IMODE(st.st_mode)))
    with open(path) as f:
        tok = f.read()
    if not re.fullmatch(r"[0-9a-f]{64}", tok):
        raise Fail("%s does not hold 64 hex digits: %r" % (path, tok[:80]))
    return tok


def check_cmdline(argv, token_path):
    """tierkvd's argv carries --peer-token-file naming token_path."""
    for i, a in enumerate(argv):
        val = None
        if a == "--peer-token-file" and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith("--peer-token-file="):
            val = a.split("=", 1)[1]
        if val is not None:
            if os.path.realpath(val) != os.path.realpath(token_path):
                raise Fail("--peer-token-file %s, not %s" % (val, token_path))
            return
    raise Fail("no --peer-token-file in %s" % argv)


def check_token_line(out, token_path):
    lines = [l for l in out.splitlines() if token_path in l and "token" in l]
    if len(lines) != 1:
        raise Fail("expected one line naming the token %s, got %r" % (token_path, lines))
    return lines[0]


def self_test(tmp):
    """The checkers reject known-bad cases."""
    bad = [("no token file", lambda: check_token_file(os.path.join(tmp, "absent")))]
    p = os.path.join(tmp, "bad-token")
    with open(p, "w") as f:
        f.write("ab" * 32)
    os.chmod(p, 0o644)
    bad.append(("a 0644 token file", lambda: check_token_file(p)))
    q = os.path.join(tmp, "short-token")
    with open(q, "w") as f:
        f.write("ab" * 8)
    os.chmod(q, 0o600)
    bad.append(("a short token", lambda: check_token_file(q)))
    bad.append(("a command line without the flag",
                lambda: check_cmdline(["tierkvd", "--id", "1"], p)))
    bad.append(("a command line naming another file",
                lambda: check_cmdline(["tierkvd", "--peer-token-file", q], p)))
    bad.append(("no line about the token", lambda: check_token_line("cluster is up\n", p)))
    for name, fn in bad:
        try:
            fn()
        except Fail as e:
            print("ok: rejected (%s): %s" % (name, e))
            continue
        raise Fail("self-test: accepted %s" % name)
    os.chmod(p, 0o600)
    check_token_file(p)
    check_cmdline(["tierkvd", "--peer-token-file", p], p)


def node_pids(data):
    """{node index: (pid, argv)} of the tierkvd processes with --data-dir DATA/nI."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
        except OSError:
            continue
        for i in (1, 2, 3):
            if "--data-dir" in argv and argv[argv.index("--data-dir") + 1:][:1] == [
                    os.path.join(data, "n%d" % i)]:
                found[i] = (int(d), argv)
    return found


def get_json(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=2) as r:
        return json.load(r)


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(name + " "):
                return float(ln.split()[-1])
    return 0.0


def wait_until(what, timeout_s, fn):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.05)
    raise Fail("%s: not within %d s%s" % (what, timeout_s, " (%s)" % last if last else ""))


class Run:
    """One run of the script, its output read into self.out."""

    def __init__(self, script, build, env):
        self.p = subprocess.Popen(["bash", script, build], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.out = b""
        os.set_blocking(self.p.stdout.fileno(), False)

    def read(self):
        try:
            data = self.p.stdout.read()
        except (BlockingIOError, ValueError):
            data = None
        if data:
            self.out += data
        return self.out.decode(errors="replace")

    def wait_up(self, timeout_s=60):
        def up():
            if self.p.poll() is not None:
                raise Fail("the script exited %d:\n%s" % (self.p.returncode, self.read()))
            return "Ctrl-C stops the cluster." in self.read()
        wait_until("the cluster up", timeout_s, up)

    def stop(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGINT)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            raise Fail("the script did not stop within 60 s of SIGINT")
        self.read()
        return self.p.returncode


def strangers(bin_tierkvd, bases):
    """Raw garbage and a tierkvd without the token on the raft ports: neither
    becomes a peer; the leader and its term stay."""
    raft, http = bases
    ports = {i: http + i for i in (1, 2, 3)}
    st = wait_until("an agreed leader", 20,
                    lambda: (lambda s: s[0] if len({x["leader"] for x in s}) == 1 and
                             s[0]["leader"] else None)([get_json(ports[i], "/v1/cluster")
                                                         for i in (1, 2, 3)]))
    leader, term = st["leader"], st["term"]
    victim = 1 if leader != 1 else 2
    # 1. Garbage: the node closes the connection and counts it.
    bad0 = metric(ports[victim], "tierkv_transport_bad_connections_total")
    s = socket.create_connection(("127.0.0.1", raft + victim), timeout=5)
    try:
        s.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
        s.settimeout(10)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass  # a reset is a close too
    finally:
        s.close()
    wait_until("the node counting the garbage connection", 10,
               lambda: metric(ports[victim], "tierkv_transport_bad_connections_total") > bad0)
    print("ok: garbage on node %d's raft port: connection closed, counted" % victim)
    # 2. A tierkvd without the token, claiming a member's id.
    claimed = [i for i in (1, 2, 3) if i != leader][-1]
    auth0 = sum(metric(ports[i], "tierkv_transport_auth_failures_total") for i in (1, 2, 3))
    members = ",".join("%d=127.0.0.1:%d" % (i, raft + i) for i in (1, 2, 3))
    imp = subprocess.Popen([bin_tierkvd, "--id", str(claimed), "--members", members,
                            "--listen-raft", "127.0.0.1:%d" % (raft + 4),
                            "--listen-http", "127.0.0.1:%d" % (http + 4),
                            "--store", "mem"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until("the members refusing the impostor without a token", 20,
                   lambda: sum(metric(ports[i], "tierkv_transport_auth_failures_total")
                               for i in (1, 2, 3)) > auth0)
    finally:
        imp.terminate()
        try:
            imp.wait(timeout=20)
        except subprocess.TimeoutExpired:
            imp.kill()
            imp.wait()
    after = [get_json(ports[i], "/v1/cluster") for i in (1, 2, 3)]
    if {x["leader"] for x in after} != {leader} or {x["term"] for x in after} != {term}:
        raise Fail("the leader or term moved under the strangers: leader %d term %d before, "
                   "%s after" % (leader, term, [(x["leader"], x["term"]) for x in after]))
    print("ok: a tierkvd without the token claiming id %d was refused; node %d still leads "
          "in term %d" % (claimed, leader, term))


def main():
    script, build = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="tierkv-runtoken-")
    runs = []
    try:
        self_test(tmp)
        bases = pick_bases()
        if bases is None:
            print("run-cluster-token: no free ports; skipping")
            return 77
        data = os.path.join(tmp, "data")
        env = dict(os.environ, TIERKV_RUN_RAFT_BASE=str(bases[0]),
                   TIERKV_RUN_HTTP_BASE=str(bases[1]), TIERKV_RUN_DATA=data)
        token_path = os.path.join(data, "peer-token")
        tokens = []
        for n in (1, 2):
            r = Run(script, build, env)
            runs.append(r)
            r.wait_up()
            tok = check_token_file(token_path)
            tokens.append(tok)
            line = check_token_line(r.read(), token_path)
            print("ok: run %d: %s is mode 0600, 64 hex digits; the script says: %s" %
                  (n, token_path, line.strip()))
            procs = wait_until("three tierkvd processes in /proc", 10,
                               lambda: (lambda f: f if len(f) == 3 else None)(node_pids(data)))
            for i, (pid, argv) in sorted(procs.items()):
                check_cmdline(argv, token_path)
            print("ok: run %d: nodes %s (pids %s) each run with --peer-token-file %s" %
                  (n, sorted(procs), [procs[i][0] for i in sorted(procs)], token_path))
            if n == 1:
                strangers(os.path.join(build, "cmd", "tierkvd", "tierkvd"), bases)
            rc = r.stop()
            if rc != 0:
                raise Fail("run %d: the script exited %d on SIGINT:\n%s" % (n, rc, r.read()))
            if n == 1:
                # Loosened behind the script's back: the next start fixes it.
                os.chmod(token_path, 0o644)
        if tokens[0] != tokens[1]:
            raise Fail("the second start made a new token instead of reusing the first")
        if "reused" not in check_token_line(runs[1].read(), token_path):
            raise Fail("the second start does not say it reused the token")
        print("ok: the second start reused the token and made it 0600 again")
        print("run-cluster-token: ok")
        return 0
    except Fail as e:
        for r in runs:
            print(r.read()[-3000:])
        print("run-cluster-token: FAIL: %s" % e)
        return 1
    finally:
        for r in runs:
            if r.p.poll() is None:
                try:
                    r.stop()
                except Fail:
                    pass
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
