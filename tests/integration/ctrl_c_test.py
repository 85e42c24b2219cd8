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

It does so twice: the script alone, then `make run` as a newcomer types it
(bash -c 'make run; echo ...': the recipe of the Makefile's run target, with
BUILD set to BUILD_DIR). Under make, Ctrl-C must leave make's status 0 too,
not 130 (make dies of a SIGINT it receives, whatever its child did).

Before the script's Ctrl-C, the newcomer's next step: with the data
directory at TOP/data, `tierkv put greeting hello` and `tierkv get greeting`
run in TOP with no -e and no TIERKV_ENDPOINTS must reach the cluster (the
script writes DATA/endpoints, which the CLI reads from ./data/endpoints).
The CLI is BUILD_DIR/cmd/tierkv/tierkv (meson test builds it).

usage: ctrl_c_test.py SCRIPT BUILD_DIR
"""
import os
import pty
import random
import select
import shutil
import signal
import socket
import subprocess
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
        # Below 32768: the kernel's ephemeral ports start there.
        raft = random.randrange(10000, 21000, 10)
        http = raft + 11000
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


def newcomer_cli(build, top):
    """tierkv put/get in top, endpoints from ./data/endpoints only: None if
    both work, else what went wrong."""
    cli = os.path.join(build, "cmd", "tierkv", "tierkv")
    if not os.access(cli, os.X_OK):
        return "%s is not built" % cli
    env = {k: v for k, v in os.environ.items() if k != "TIERKV_ENDPOINTS"}
    for args, want in ((["put", "greeting", "hello"], None),
                       (["-v", "get", "greeting", "--value-only"], "hello")):
        p = subprocess.run([cli] + args, cwd=top, env=env, capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 0 or (want is not None and p.stdout.strip() != want):
            return "tierkv %s: exit %d, out %r, err %r" % (
                " ".join(args), p.returncode, p.stdout, p.stderr)
        if want is not None and "from ./data/endpoints" not in p.stderr:
            return "tierkv -v does not say it took ./data/endpoints: %r" % p.stderr
    print("ctrl-c: ok: tierkv put/get in the run's directory, endpoints from ./data/endpoints")
    return None


def run_recipe(script, build, workdir):
    """The Makefile's run recipe (the lines after `run:`), in a makefile of
    its own under workdir, with $(BUILD) as build. The `build` prerequisite
    is left out: the test runs what meson built."""
    makefile = os.path.join(os.path.dirname(os.path.abspath(script)), "..", "Makefile")
    with open(makefile) as f:
        lines = f.read().split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("run:"))
    recipe = []
    for l in lines[start + 1:]:
        if not l.startswith("\t"):
            break
        recipe.append(l.replace("$(BUILD)", build))
    if not any("run-cluster.sh" in l for l in recipe):
        raise SystemExit("ctrl-c: the Makefile's run recipe does not run run-cluster.sh: %r" % recipe)
    mk = os.path.join(workdir, "Makefile.run")
    with open(mk, "w") as f:
        f.write("run:\n" + "\n".join(recipe) + "\n")
    return mk


def main():
    script, build = sys.argv[1], sys.argv[2]
    root = os.path.join(os.path.dirname(os.path.abspath(script)), "..")
    rc = one_run(script, build, None)
    if rc != 0:
        return rc
    mkdir = tempfile.mkdtemp(prefix="tierkv-ctrlc-make-")
    try:
        mk = run_recipe(script, build, mkdir)
        return one_run(script, build, ["bash", "-c",
                                       'cd "$1" && make -f "$2" run; echo "make-status=$?"',
                                       "bash", root, mk])
    finally:
        shutil.rmtree(mkdir, ignore_errors=True)


def one_run(script, build, argv):
    """argv None: the script alone; else argv (make run) under the pty."""
    what = "the script" if argv is None else "make run"
    bases = pick_bases()
    if bases is None:
        print("ctrl-c: no free ports; skipping")
        return 77
    top = tempfile.mkdtemp(prefix="tierkv-ctrlc-")
    data = os.path.join(top, "data")
    # A newcomer's shell, not a make's child: under `make test` MAKELEVEL and
    # MAKEFLAGS would make the inner make print "make[1]: Leaving directory".
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    env.update(TIERKV_RUN_RAFT_BASE=str(bases[0]),
               TIERKV_RUN_HTTP_BASE=str(bases[1]), TIERKV_RUN_DATA=data)
    pid, fd = pty.fork()
    if pid == 0:
        if argv is None:
            os.execvpe("bash", ["bash", script, build], env)
        os.execvpe(argv[0], argv, env)
    out = bytearray()
    try:
        up = read_until(fd, pid, b"Ctrl-C stops the cluster.", time.time() + 60, out)
        if not up:
            print(out.decode(errors="replace"))
            print("ctrl-c: FAIL: the cluster did not come up within 60 s")
            return 1
        if argv is None:
            bad = newcomer_cli(build, top)
            if bad:
                print(out.decode(errors="replace"))
                print("ctrl-c: FAIL: tierkv after make run: " + bad)
                os.write(fd, b"\x03")
                read_until(fd, pid, None, time.time() + 30, out)
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
        if argv is not None:
            if "make-status=0" not in lines:
                bad.append("make's status after Ctrl-C is not 0 (a shell shows $? = %s)"
                           % next((l.split("=", 1)[1] for l in lines if l.startswith("make-status=")),
                                  "none: the shell died with it"))
            lines = [l for l in lines if not l.startswith("make-status=")]
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
            print("ctrl-c: FAIL (%s): " % what + "; ".join(bad))
            return 1
        print("ctrl-c: ok (%s): exit 0, one line, all three nodes stopped in %.1f s" % (what, took))
        return 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
