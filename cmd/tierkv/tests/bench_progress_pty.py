#!/usr/bin/env python3
"""`tierkv bench`'s live progress line: on a terminal, none when piped.

Starts tierkv-fake-server, then runs a short `tierkv bench` twice:
  1. with stderr on a pseudo-terminal (Python's pty): stderr must hold at least
     one progress line ("\\r\\033[K[measure ...] N ops/s  p99 X ms ... E errors")
     with nonzero ops/s and a numeric p99, and the JSON result on stdout;
  2. with stderr a pipe: no progress line (no "\\r", no "ops/s") at all.
A self-test first feeds the line checker a piped run's stderr and a line with
no p99, which it must reject.

usage: bench_progress_pty.py TIERKV FAKE_SERVER
"""
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import time

LINE = re.compile(rb"\r\x1b\[K\[(prefill|warm-up|measure) +[0-9.]+s/[0-9]+s\] +([0-9]+) ops/s"
                  rb"  p99 +([0-9.]+|-) ms +([0-9]+) ops  ([0-9]+) errors")


def progress_lines(err):
    """The progress lines of a stderr capture, as (phase, ops/s, p99 ms or None, errors)."""
    out = []
    for m in LINE.finditer(err):
        p99 = None if m.group(3) == b"-" else float(m.group(3))
        out.append((m.group(1).decode(), int(m.group(2)), p99, int(m.group(5))))
    return out


def good_terminal_run(err):
    """A terminal run's stderr passes when a measure line shows ops/s > 0 and a p99."""
    lines = progress_lines(err)
    return any(ph == "measure" and ops > 0 and p99 is not None and p99 > 0
               for ph, ops, p99, _ in lines), lines


def self_test():
    bad = [b"", b"\r\x1b[K[measure   1.0s/2s]       1234 ops/s  p99        - ms  10 ops  0 errors",
           b"\r\x1b[K[measure   1.0s/2s]       1234 ops/s       10 ops  0 errors"]
    for b in bad:
        ok, _ = good_terminal_run(b)
        if ok:
            sys.exit("self-test: the checker accepted %r" % b)
    good = b"\r\x1b[K[measure   1.0s/2s]       1234 ops/s  p99    0.250 ms  10 ops  0 errors"
    if not good_terminal_run(good)[0]:
        sys.exit("self-test: the checker rejected a good line")


def start_fake(fake, tmp):
    port_file = os.path.join(tmp, "port")
    p = subprocess.Popen([fake, "--port-file", port_file])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            with open(port_file) as f:
                return p, "127.0.0.1:" + f.read().strip()
        time.sleep(0.05)
    p.kill()
    sys.exit("the fake server did not start")


def bench_args(tierkv, ep):
    return [tierkv, "--endpoints", ep, "bench", "--warmup", "200ms", "--duration", "2500ms",
            "--connections", "4"]


def run_on_pty(args, timeout_s=60):
    """Runs args with stderr on a pty (stdout a pipe); returns (rc, stdout, stderr)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            err += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        sys.exit("tierkv bench did not finish within %d s" % timeout_s)
    return p.returncode, out, err


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tierkv, fake = sys.argv[1], sys.argv[2]
    self_test()
    with tempfile.TemporaryDirectory() as tmp:
        server, ep = start_fake(fake, tmp)
        try:
            rc, out, err = run_on_pty(bench_args(tierkv, ep))
            ok, lines = good_terminal_run(err)
            print("terminal: exit %d, %d progress lines, last %s" % (rc, len(lines),
                                                                   lines[-1] if lines else None))
            if rc != 0 or b'"bench":"http"' not in out:
                sys.exit("terminal run failed: exit %d\nstdout %r\nstderr %r" % (rc, out, err))
            if not ok:
                sys.exit("no progress line with ops/s > 0 and a p99 on the terminal:\n%r" % err)
            piped = subprocess.run(bench_args(tierkv, ep), capture_output=True, timeout=60)
            if piped.returncode != 0 or b'"bench":"http"' not in piped.stdout:
                sys.exit("piped run failed: exit %d\n%r" % (piped.returncode, piped.stderr))
            if b"\r" in piped.stderr or b"ops/s" in piped.stderr or progress_lines(piped.stderr):
                sys.exit("a piped run drew a progress line:\n%r" % piped.stderr)
            print("piped: exit 0, no progress line (stderr %d bytes)" % len(piped.stderr))
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
